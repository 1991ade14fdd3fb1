// kernels-scalar.c - plain C inner loops: the fallback and the reference for the SIMD ones.
#include <math.h>

#include "cpu-kernels.h"

void tri__cpu_quantize_row(int8_t *qs, float *d8, float *s8, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / TRI_QK; b++) {
        const float *xb = x + b * TRI_QK;
        float amax = 0;
        for (int i = 0; i < TRI_QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d > 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < TRI_QK; i++) {
            // rintf: nearest even under the default rounding mode, as the SIMD conversions do
            int q = (int)rintf(xb[i] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            qs[b * TRI_QK + i] = (int8_t)q;
            sum += q;
        }
        float s = d * (float)sum * 0.125f;
        for (int l = 0; l < 8; l++) {
            d8[b * 8 + l] = d;
            s8[b * 8 + l] = s;
        }
    }
}

static float dot_f32(const float *x, const float *w, int64_t k) {
    float acc = 0;
    for (int64_t i = 0; i < k; i++) acc += x[i] * w[i];
    return acc;
}

static float dot_f16(const float *x, const uint16_t *w, int64_t k) {
    float acc = 0;
    for (int64_t i = 0; i < k; i++) acc += x[i] * tri__f16_to_f32(w[i]);
    return acc;
}

static float dot_bf16(const float *x, const uint16_t *w, int64_t k) {
    float acc = 0;
    for (int64_t i = 0; i < k; i++) acc += x[i] * tri__bf16_to_f32(w[i]);
    return acc;
}

// Block b of row i of x: its values and its scale and sum terms.
static const int8_t *xq_row(const tri__cpu_xq *x, int64_t i) { return x->qs + i * x->k; }
static float xq_d(const tri__cpu_xq *x, int64_t i, int64_t b) { return x->d8[(i * (x->k / TRI_QK) + b) * 8]; }
static float xq_s(const tri__cpu_xq *x, int64_t i, int64_t b) { return 8 * x->s8[(i * (x->k / TRI_QK) + b) * 8]; }

static float dot_q8_0(const tri__cpu_xq *x, int64_t i, const tri__block_q8_0 *w) {
    const int8_t *xq = xq_row(x, i);
    float acc = 0;
    for (int64_t b = 0; b < x->k / TRI_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < TRI_QK; j++) isum += (int32_t)w[b].qs[j] * xq[b * TRI_QK + j];
        acc += tri__f16_to_f32(w[b].d) * xq_d(x, i, b) * (float)isum;
    }
    return acc;
}

static float dot_q4_0(const tri__cpu_xq *x, int64_t i, const tri__block_q4_0 *w) {
    const int8_t *xq = xq_row(x, i);
    float acc = 0;
    for (int64_t b = 0; b < x->k / TRI_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < TRI_QK / 2; j++) {
            isum += ((w[b].qs[j] & 0x0f) - 8) * xq[b * TRI_QK + j];
            isum += ((w[b].qs[j] >> 4) - 8) * xq[b * TRI_QK + j + TRI_QK / 2];
        }
        acc += tri__f16_to_f32(w[b].d) * xq_d(x, i, b) * (float)isum;
    }
    return acc;
}

static float dot_q4_1(const tri__cpu_xq *x, int64_t i, const tri__block_q4_1 *w) {
    const int8_t *xq = xq_row(x, i);
    float acc = 0;
    for (int64_t b = 0; b < x->k / TRI_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < TRI_QK / 2; j++) {
            isum += (w[b].qs[j] & 0x0f) * xq[b * TRI_QK + j];
            isum += (w[b].qs[j] >> 4) * xq[b * TRI_QK + j + TRI_QK / 2];
        }
        acc += tri__f16_to_f32(w[b].d) * xq_d(x, i, b) * (float)isum + tri__f16_to_f32(w[b].m) * xq_s(x, i, b);
    }
    return acc;
}

// ---- tiles: one dot product per (row of x, row of W) ----

static void tile_f32(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                     int64_t k) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++)
            y[i * ldy + r] = dot_f32(x + i * k, (const float *)((const char *)w + r * ws), k);
}

static void tile_f16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                     int64_t k) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++)
            y[i * ldy + r] = dot_f16(x + i * k, (const uint16_t *)((const char *)w + r * ws), k);
}

static void tile_bf16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                      int64_t k) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++)
            y[i * ldy + r] = dot_bf16(x + i * k, (const uint16_t *)((const char *)w + r * ws), k);
}

static void tile_q8_0(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                      int64_t nr) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++) y[i * ldy + r] = dot_q8_0(x, i, (const void *)((const char *)w + r * ws));
}

static void tile_q4_0(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                      int64_t nr) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++) y[i * ldy + r] = dot_q4_0(x, i, (const void *)((const char *)w + r * ws));
}

static void tile_q4_1(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                      int64_t nr) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++) y[i * ldy + r] = dot_q4_1(x, i, (const void *)((const char *)w + r * ws));
}

// Any quantized type through tri__qblock_unpack: per group of 16 elements, the integer dot
// product with x and the integer sum of x, scaled by the group's dh and mh and the scale of x's
// block of 32. W's blocks are unpacked once and used for every row of x in the tile.
static void tile_qblocks(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                         int64_t nr, tri_dtype type) {
    const int64_t be = tri__dtype_block_elems(type), bb = tri__dtype_block_bytes(type), k = x->k;
    for (int64_t i = 0; i < mr; i++)
        for (int64_t r = 0; r < nr; r++) y[i * ldy + r] = 0;
    tri__qblock qb;
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t b = 0; b < k / be; b++) {
            tri__qblock_unpack(&qb, (const char *)w + r * ws + b * bb, type);
            for (int64_t i = 0; i < mr; i++) {
                const int8_t *xq = xq_row(x, i) + b * be;
                float acc = 0;
                for (int64_t g = 0; g < be / 16; g++) {
                    int32_t isum = 0, xsum = 0;
                    for (int e = 0; e < 16; e++) {
                        isum += (int32_t)qb.q[16 * g + e] * xq[16 * g + e];
                        xsum += xq[16 * g + e];
                    }
                    acc += xq_d(x, i, (b * be + 16 * g) / TRI_QK) * (qb.dh[g] * (float)isum + qb.mh[g] * (float)xsum);
                }
                y[i * ldy + r] += acc;
            }
        }
    }
}

#define TILE_QBLOCKS(name, type)                                                                              \
    void tri__cpu_tile_##name##_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, \
                                       int64_t ws, int64_t nr) {                                              \
        tile_qblocks(y, ldy, x, mr, w, ws, nr, type);                                                         \
    }
TILE_QBLOCKS(q5_0, TRI_DTYPE_Q5_0)
TILE_QBLOCKS(q5_1, TRI_DTYPE_Q5_1)
TILE_QBLOCKS(q2_k, TRI_DTYPE_Q2_K)
TILE_QBLOCKS(q3_k, TRI_DTYPE_Q3_K)
TILE_QBLOCKS(q4_k, TRI_DTYPE_Q4_K)
TILE_QBLOCKS(q5_k, TRI_DTYPE_Q5_K)
TILE_QBLOCKS(q6_k, TRI_DTYPE_Q6_K)
TILE_QBLOCKS(iq4_nl, TRI_DTYPE_IQ4_NL)
TILE_QBLOCKS(iq4_xs, TRI_DTYPE_IQ4_XS)
#undef TILE_QBLOCKS

static void axpby_f32(float *y, float c, float a, const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] * c + a * v[i];
}

static void axpby_f16(float *y, float c, float a, const uint16_t *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] * c + a * tri__f16_to_f32(v[i]);
}

// ---- attention ----

static void attn_scores_f32(float *s, int64_t lds, const float *q, int64_t r, const float *k, int64_t stride,
                            int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < nk; j++) s[i * lds + j] = dot_f32(q + i * hd, k + j * stride, hd);
}

static void attn_scores_f16(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k, int64_t stride,
                            int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < nk; j++) s[i * lds + j] = dot_f16(q + i * hd, k + j * stride, hd);
}

static float attn_softmax(float *s, int64_t n, float *mx, float *sum) {
    float m = *mx;
    for (int64_t j = 0; j < n; j++) m = fmaxf(m, s[j]);
    if (m == -INFINITY) {
        for (int64_t j = 0; j < n; j++) s[j] = 0;
        return 1.0f;
    }
    float c = expf(*mx - m), t = 0;
    for (int64_t j = 0; j < n; j++) t += s[j] = expf(s[j] - m);
    *sum = *sum * c + t;
    *mx = m;
    return c;
}

static void attn_accum_f32(float *acc, const float *p, int64_t ldp, int64_t r, const float *v, int64_t stride,
                           int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < nk; j++)
            if (p[i * ldp + j] != 0) axpby_f32(acc + i * hd, 1.0f, p[i * ldp + j], v + j * stride, hd);
}

static void attn_accum_f16(float *acc, const float *p, int64_t ldp, int64_t r, const uint16_t *v, int64_t stride,
                           int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < nk; j++)
            if (p[i * ldp + j] != 0) axpby_f16(acc + i * hd, 1.0f, p[i * ldp + j], v + j * stride, hd);
}

const tri__cpu_kernels tri__cpu_kernels_scalar = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0,
    .tile_q4_0 = tile_q4_0,
    .tile_q4_1 = tile_q4_1,
    .tile_q5_0 = tri__cpu_tile_q5_0_scalar,
    .tile_q5_1 = tri__cpu_tile_q5_1_scalar,
    .tile_q2_k = tri__cpu_tile_q2_k_scalar,
    .tile_q3_k = tri__cpu_tile_q3_k_scalar,
    .tile_q4_k = tri__cpu_tile_q4_k_scalar,
    .tile_q5_k = tri__cpu_tile_q5_k_scalar,
    .tile_q6_k = tri__cpu_tile_q6_k_scalar,
    .tile_iq4_nl = tri__cpu_tile_iq4_nl_scalar,
    .tile_iq4_xs = tri__cpu_tile_iq4_xs_scalar,
    .tile_n = 1,
    .quantize = tri__cpu_quantize_row,
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .axpby_f32 = axpby_f32,
    .axpby_f16 = axpby_f16,
    .attn_scores_f32 = attn_scores_f32,
    .attn_scores_f16 = attn_scores_f16,
    .attn_softmax = attn_softmax,
    .attn_accum_f32 = attn_accum_f32,
    .attn_accum_f16 = attn_accum_f16,
};
