// kernels-avx2.c - AVX2 + FMA + F16C inner loops (8 floats per register).
#include <math.h>
#include <string.h>

#include "cpu-kernels.h"

#if TRI_CPU_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2 static inline __m256 load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

AVX2 static float dot_f32(const float *x, const float *w, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    float acc = hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += x[i] * w[i];
    return acc;
}

AVX2 static float dot_f16(const float *x, const uint16_t *w, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_f16(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load_f16(w + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_f16(w + i), a0);
    float acc = hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += x[i] * _cvtsh_ss(w[i]);
    return acc;
}

// ---- float tiles: each W vector loaded (and converted) once for up to 4 rows of x ----

// kind: 0 f32, 1 f16, 2 bf16; 8 elements of W row w from element j.
AVX2 static inline __attribute__((always_inline)) __m256 load_w(const char *w, int64_t j, const int kind) {
    if (kind == 0) return _mm256_loadu_ps((const float *)w + j);
    return kind == 1 ? load_f16((const uint16_t *)w + j) : load_bf16((const uint16_t *)w + j);
}

AVX2 static inline __attribute__((always_inline)) float w_elem(const char *w, int64_t j, const int kind) {
    if (kind == 0) return ((const float *)w)[j];
    return kind == 1 ? _cvtsh_ss(((const uint16_t *)w)[j]) : tri__bf16_to_f32(((const uint16_t *)w)[j]);
}

// nr <= 2 here (tile_n): 8 accumulators of 16 registers.
AVX2 static inline __attribute__((always_inline)) void f_tile(float *y, int64_t ldy, const float *x, const void *w,
                                                              int64_t ws, int64_t k, const int MR, const int NR,
                                                              const int kind) {
    __m256 acc[TRI_CPU_TILE_M][2];
    const char *wr[2] = {w, (const char *)w + ws};
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 wv[2];
        for (int r = 0; r < NR; r++) wv[r] = load_w(wr[r], j, kind);
        for (int i = 0; i < MR; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * k + j);
            for (int r = 0; r < NR; r++) acc[i][r] = _mm256_fmadd_ps(xv, wv[r], acc[i][r]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) {
            float v = hsum(acc[i][r]);
            for (int64_t t = j; t < k; t++) v += x[i * k + t] * w_elem(wr[r], t, kind);
            y[i * ldy + r] = v;
        }
}

#define F_BODY(kind)                                         \
    if (nr == 1) {                                           \
        switch (mr) {                                        \
        case 1: f_tile(y, ldy, x, w, ws, k, 1, 1, kind); break; \
        case 2: f_tile(y, ldy, x, w, ws, k, 2, 1, kind); break; \
        case 3: f_tile(y, ldy, x, w, ws, k, 3, 1, kind); break; \
        default: f_tile(y, ldy, x, w, ws, k, 4, 1, kind); break; \
        }                                                    \
    } else {                                                 \
        switch (mr) {                                        \
        case 1: f_tile(y, ldy, x, w, ws, k, 1, 2, kind); break; \
        case 2: f_tile(y, ldy, x, w, ws, k, 2, 2, kind); break; \
        case 3: f_tile(y, ldy, x, w, ws, k, 3, 2, kind); break; \
        default: f_tile(y, ldy, x, w, ws, k, 4, 2, kind); break; \
        }                                                    \
    }

AVX2 static void tile_f32(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                          int64_t k) {
    F_BODY(0)
}

AVX2 static void tile_f16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                          int64_t k) {
    F_BODY(1)
}

AVX2 static void tile_bf16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                           int64_t k) {
    F_BODY(2)
}

// ---- quantizing x ----

AVX2 static void quantize(int8_t *qs, float *d8, float *s8, const float *x, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / TRI_QK; b++) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + b * TRI_QK + 8 * j);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.0f;
        float id = d > 0 ? 1.0f / d : 0.0f;
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            // the default rounding mode is nearest even, as the scalar rintf
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(id)));
            q[j] = _mm256_max_epi32(_mm256_min_epi32(q[j], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
            sum = _mm256_add_epi32(sum, q[j]);
        }
        // saturating packs interleave 128-bit lanes; the permute puts the 32 values back in order
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + b * TRI_QK), p);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int isum = _mm_cvtsi128_si32(s4);
        _mm256_storeu_ps(d8 + b * 8, _mm256_set1_ps(d));
        _mm256_storeu_ps(s8 + b * 8, _mm256_set1_ps(d * (float)isum * 0.125f));
    }
}

// ---- quantized tiles: one block per register ----

// 8 int32 sums of 4 products of unsigned bytes u and signed bytes s. No int16 overflow in
// maddubs: |u| <= 128 (Q8_0 weights may hold -128) and |s| <= 127 give pairs <= 32512.
AVX2 static inline __m256i dot_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// kind: 0 Q8_0, 1 Q4_0, 2 Q4_1; nr <= 2 (tile_n).
AVX2 static inline __attribute__((always_inline)) void q_tile(float *y, int64_t ldy, const tri__cpu_xq *x,
                                                              const void *w, int64_t ws, const int MR, const int NR,
                                                              const int kind) {
    const int64_t k = x->k, nb = k / TRI_QK, bsz = kind == 0 ? 34 : kind == 1 ? 18 : 20;
    __m256 acc[TRI_CPU_TILE_M][2];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < NR; r++) {
            const char *blk = (const char *)w + r * ws + b * bsz;
            __m256i wu, wq = _mm256_setzero_si256();
            __m256 dv = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk)), mv = _mm256_setzero_ps();
            if (kind == 0) {
                wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
                wu = _mm256_sign_epi8(wq, wq);
            } else {
                // Q4_0 takes the unsigned nibble with an offset of -8 d per element
                __m128i q = _mm_loadu_si128((const __m128i *)(blk + (kind == 1 ? 2 : 4)));
                __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
                wu = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
                mv = kind == 1 ? _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f))
                               : _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 2)));
            }
            for (int i = 0; i < MR; i++) {
                __m256i xq = _mm256_loadu_si256((const __m256i *)(x->qs + i * k + b * TRI_QK));
                if (kind == 0) xq = _mm256_sign_epi8(xq, wq);
                __m256 p = _mm256_cvtepi32_ps(dot_u8_i8(wu, xq));
                __m256 sc = _mm256_mul_ps(dv, _mm256_loadu_ps(x->d8 + (i * nb + b) * 8));
                acc[i][r] = _mm256_fmadd_ps(p, sc, acc[i][r]);
                if (kind != 0) acc[i][r] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x->s8 + (i * nb + b) * 8), acc[i][r]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) y[i * ldy + r] = hsum(acc[i][r]);
}

#define Q_BODY(kind)                                       \
    if (nr == 1) {                                         \
        switch (mr) {                                      \
        case 1: q_tile(y, ldy, x, w, ws, 1, 1, kind); break; \
        case 2: q_tile(y, ldy, x, w, ws, 2, 1, kind); break; \
        case 3: q_tile(y, ldy, x, w, ws, 3, 1, kind); break; \
        default: q_tile(y, ldy, x, w, ws, 4, 1, kind); break; \
        }                                                  \
    } else {                                               \
        switch (mr) {                                      \
        case 1: q_tile(y, ldy, x, w, ws, 1, 2, kind); break; \
        case 2: q_tile(y, ldy, x, w, ws, 2, 2, kind); break; \
        case 3: q_tile(y, ldy, x, w, ws, 3, 2, kind); break; \
        default: q_tile(y, ldy, x, w, ws, 4, 2, kind); break; \
        }                                                  \
    }

AVX2 static void tile_q8_0(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                           int64_t nr) {
    Q_BODY(0)
}

AVX2 static void tile_q4_0(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                           int64_t nr) {
    Q_BODY(1)
}

AVX2 static void tile_q4_1(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws,
                           int64_t nr) {
    Q_BODY(2)
}

// ---- Q5_0, Q5_1, the K-quants, IQ4_NL and IQ4_XS: one block of 32 per register ----
//
// Per block of the type (32, or a super-block of 256) and row of W, the group scales come from
// tri__qblock_scales (element e is dh[e / 16] * q[e] + mh[e / 16]); per block of 32 the codes are
// unpacked into 32 signed bytes (offsets that are whole codes folded in), the sign moved onto x as
// for Q8_0. Lanes 0-3 of the products are the first group of 16, lanes 4-7 the second. Minima
// (mh) multiply each lane's sum of x, one more dot product.

// 32 bytes: 16 where bit i of the 32 bits of qh is set (element i), else 0.
AVX2 static inline __m256i fifth_bits(uint32_t qh) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(b, _mm256_set1_epi8(16));
}

// 2-bit field j (0..3) of 32 bytes at p.
AVX2 static inline __m256i crumbs(const uint8_t *p, int j) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), _mm256_set1_epi8(3));
}

// Signed codes of block of 32 number j of the block at blk (type kind).
AVX2 static inline __attribute__((always_inline)) __m256i g_codes(const uint8_t *blk, int j, const int kind) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (kind == TRI_DTYPE_IQ4_NL || kind == TRI_DTYPE_IQ4_XS) {  // IQ4_XS: block j's 16 bytes after the scales
        static const int8_t levels[16] = TRI__IQ4NL_VALUES;
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + (kind == TRI_DTYPE_IQ4_NL ? 2 : 8 + 16 * j)));
        __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels)), v);
    }
    if (kind == TRI_DTYPE_Q5_0 || kind == TRI_DTYPE_Q5_1) {
        const int off = kind == TRI_DTYPE_Q5_0 ? 2 : 4;
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + off + 4));
        __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
        uint32_t qh;
        memcpy(&qh, blk + off, 4);
        v = _mm256_add_epi8(v, fifth_bits(qh));
        return kind == TRI_DTYPE_Q5_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(16)) : v;
    }
    const int h = j / 4, jj = j % 4;  // half of 128 and group of 32 in it
    if (kind == TRI_DTYPE_Q4_K || kind == TRI_DTYPE_Q5_K) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (kind == TRI_DTYPE_Q4_K ? 16 : 48) + 32 * (j / 2)));
        if (j % 2) q = _mm256_srli_epi16(q, 4);
        q = _mm256_and_si256(q, m4);
        if (kind == TRI_DTYPE_Q5_K) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << j));
            __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(blk + 16)), bit), bit);
            q = _mm256_add_epi8(q, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
        }
        return q;
    }
    if (kind == TRI_DTYPE_Q2_K) return crumbs(blk + 16 + 32 * h, jj);
    if (kind == TRI_DTYPE_Q3_K) {
        const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + jj)));
        __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)blk), bit),
                                          _mm256_setzero_si256());
        return _mm256_sub_epi8(crumbs(blk + 32 + 32 * h, jj), _mm256_and_si256(clear, _mm256_set1_epi8(4)));
    }
    // Q6_K
    __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (jj % 2)));
    if (jj / 2) lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, m4);
    __m256i hi = crumbs(blk + 128 + 32 * h, jj);
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}

AVX2 static inline __attribute__((always_inline)) void g_tile(float *y, int64_t ldy, const tri__cpu_xq *x,
                                                              const void *w, int64_t ws, const int MR, const int NR,
                                                              const int kind) {
    const int64_t k = x->k, nb = k / TRI_QK, be = tri__dtype_block_elems((tri_dtype)kind);
    const int64_t bsz = tri__dtype_block_bytes((tri_dtype)kind), per = be / TRI_QK;
    const bool has_min = kind == TRI_DTYPE_Q5_1 || kind == TRI_DTYPE_Q2_K || kind == TRI_DTYPE_Q4_K ||
                         kind == TRI_DTYPE_Q5_K;
    __m256 acc[TRI_CPU_TILE_M][2];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / be; sb++) {
        float dh[2][16], mh[2][16];
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = (const uint8_t *)w + r * ws + sb * bsz;
            if (per == 1) {  // Q5_0, Q5_1, IQ4_NL: the f16 scale and minimum in place, no call
                uint16_t h[2] = {0, 0};
                memcpy(h, blk, kind == TRI_DTYPE_Q5_1 ? 4 : 2);
                dh[r][0] = dh[r][1] = _cvtsh_ss(h[0]);
                mh[r][0] = mh[r][1] = _cvtsh_ss(h[1]);
            } else {
                tri__qblock_scales(dh[r], mh[r], blk, (tri_dtype)kind);
            }
        }
        for (int j = 0; j < per; j++) {
            const int64_t b = sb * per + j;  // x's block
            for (int r = 0; r < NR; r++) {
                __m256i wq = g_codes((const uint8_t *)w + r * ws + sb * bsz, j, kind);
                __m256i wu = _mm256_sign_epi8(wq, wq);
                __m256 dv = _mm256_set_m128(_mm_set1_ps(dh[r][2 * j + 1]), _mm_set1_ps(dh[r][2 * j]));
                __m256 mv = has_min ? _mm256_set_m128(_mm_set1_ps(mh[r][2 * j + 1]), _mm_set1_ps(mh[r][2 * j]))
                                    : _mm256_setzero_ps();
                for (int i = 0; i < MR; i++) {
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)(x->qs + i * k + b * TRI_QK));
                    __m256 p = _mm256_cvtepi32_ps(dot_u8_i8(wu, _mm256_sign_epi8(x0, wq)));
                    __m256 xd = _mm256_loadu_ps(x->d8 + (i * nb + b) * 8);
                    acc[i][r] = _mm256_fmadd_ps(p, _mm256_mul_ps(dv, xd), acc[i][r]);
                    if (has_min) {
                        __m256 sx = _mm256_cvtepi32_ps(dot_u8_i8(_mm256_set1_epi8(1), x0));
                        acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(mv, xd), sx, acc[i][r]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) y[i * ldy + r] = hsum(acc[i][r]);
}

#define G_BODY(kind)                                       \
    if (nr == 1) {                                         \
        switch (mr) {                                      \
        case 1: g_tile(y, ldy, x, w, ws, 1, 1, kind); break; \
        case 2: g_tile(y, ldy, x, w, ws, 2, 1, kind); break; \
        case 3: g_tile(y, ldy, x, w, ws, 3, 1, kind); break; \
        default: g_tile(y, ldy, x, w, ws, 4, 1, kind); break; \
        }                                                  \
    } else {                                               \
        switch (mr) {                                      \
        case 1: g_tile(y, ldy, x, w, ws, 1, 2, kind); break; \
        case 2: g_tile(y, ldy, x, w, ws, 2, 2, kind); break; \
        case 3: g_tile(y, ldy, x, w, ws, 3, 2, kind); break; \
        default: g_tile(y, ldy, x, w, ws, 4, 2, kind); break; \
        }                                                  \
    }

#define G_TILE(name, kind)                                                                                     \
    AVX2 static void tile_##name(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w, int64_t ws, \
                                 int64_t nr) {                                                                \
        G_BODY(kind)                                                                                           \
    }
G_TILE(q5_0, TRI_DTYPE_Q5_0)
G_TILE(q5_1, TRI_DTYPE_Q5_1)
G_TILE(q2_k, TRI_DTYPE_Q2_K)
G_TILE(q3_k, TRI_DTYPE_Q3_K)
G_TILE(q4_k, TRI_DTYPE_Q4_K)
G_TILE(q5_k, TRI_DTYPE_Q5_K)
G_TILE(q6_k, TRI_DTYPE_Q6_K)
G_TILE(iq4_nl, TRI_DTYPE_IQ4_NL)
G_TILE(iq4_xs, TRI_DTYPE_IQ4_XS)
#undef G_TILE
#undef G_BODY

AVX2 static void axpby_f32(float *y, float c, float a, const float *v, int64_t n) {
    __m256 vc = _mm256_set1_ps(c), va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(v + i), _mm256_mul_ps(vc, _mm256_loadu_ps(y + i))));
    for (; i < n; i++) y[i] = y[i] * c + a * v[i];
}

AVX2 static void axpby_f16(float *y, float c, float a, const uint16_t *v, int64_t n) {
    __m256 vc = _mm256_set1_ps(c), va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(v + i), _mm256_mul_ps(vc, _mm256_loadu_ps(y + i))));
    for (; i < n; i++) y[i] = y[i] * c + a * _cvtsh_ss(v[i]);
}

// ---- attention ----

// Scores through the matmul tiles: q rows are x (hd apart), key rows are W.
AVX2 static void attn_scores_f32(float *s, int64_t lds, const float *q, int64_t r, const float *k, int64_t stride,
                                 int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M)
        for (int64_t j = 0; j < nk; j += 2)
            tile_f32(s + i * lds + j, lds, q + i * hd, r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M,
                     k + j * stride, stride * 4, nk - j < 2 ? nk - j : 2, hd);
}

AVX2 static void attn_scores_f16(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k, int64_t stride,
                                 int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M)
        for (int64_t j = 0; j < nk; j += 2)
            tile_f16(s + i * lds + j, lds, q + i * hd, r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M,
                     k + j * stride, stride * 2, nk - j < 2 ? nk - j : 2, hd);
}

// exp(x) for x <= 0 (-inf included), 0 below -87: Cephes' expf polynomial on x - n ln 2, times
// 2^n built in the exponent field (n >= -126 after the clamp, so always a normal number).
AVX2 static inline __m256 exp_neg(__m256 x) {
    __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

AVX2 static float attn_softmax(float *s, int64_t n, float *mx, float *sum) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = fmaxf(*mx, _mm_cvtss_f32(h));
    for (int64_t t = j; t < n; t++) m = fmaxf(m, s[t]);
    if (m == -INFINITY) {
        for (int64_t t = 0; t < n; t++) s[t] = 0;
        return 1.0f;
    }
    __m256 vmax = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax));
        _mm256_storeu_ps(s + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    if (j < n) {
        // the tail as one vector padded with -inf (exp 0): a row's sum then does not depend on
        // whether masked keys follow (lanes of zeros), which batch invariance needs
        __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(s + j, live),
                                    _mm256_castsi256_ps(live));
        __m256 e = exp_neg(_mm256_sub_ps(x, vmax));
        _mm256_maskstore_ps(s + j, live, e);
        vs = _mm256_add_ps(vs, e);
    }
    float c = expf(*mx - m);
    *sum = *sum * c + hsum(vs);
    *mx = m;
    return c;
}

// acc rows i < MR, dims d0 .. d0 + 8 NV += p @ V over nk keys; 8 accumulators of 16 registers.
AVX2 static inline __attribute__((always_inline)) void acc_tile(float *acc, int64_t hd, const float *p, int64_t ldp,
                                                                const char *v, int64_t vs, int64_t nk, int64_t d0,
                                                                const int MR, const int NV, const int kind) {
    __m256 a[TRI_CPU_TILE_M][2];
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NV; c++) a[i][c] = _mm256_loadu_ps(acc + i * hd + d0 + 8 * c);
    for (int64_t j = 0; j < nk; j++) {
        __m256 vv[2];
        for (int c = 0; c < NV; c++) vv[c] = load_w(v + j * vs, d0 + 8 * c, kind);
        for (int i = 0; i < MR; i++) {
            __m256 pb = _mm256_broadcast_ss(p + i * ldp + j);
            for (int c = 0; c < NV; c++) a[i][c] = _mm256_fmadd_ps(pb, vv[c], a[i][c]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(acc + i * hd + d0 + 8 * c, a[i][c]);
}

// (nv <= 2: the dispatch instantiates 3 and 4 too, clamped to 2)
#define ACC_BODY(MR, NV) acc_tile(acc + i * hd, hd, p + i * ldp, ldp, vb, vs, nk, d0, MR, NV > 2 ? 2 : NV, kind)

AVX2 static inline __attribute__((always_inline)) void attn_accum(float *acc, const float *p, int64_t ldp, int64_t r,
                                                                  const void *v, int64_t vs, int64_t nk, int64_t hd,
                                                                  const int kind) {
    const char *vb = v;
    int64_t hd8 = hd / 8 * 8;
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M) {
        int64_t mr = r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M;
        for (int64_t d0 = 0; d0 < hd8; d0 += 16) {
            int64_t nv = hd8 - d0 < 16 ? 1 : 2;
            TRI_CPU_TILE_DISPATCH(mr, nv, ACC_BODY)
        }
        for (int64_t ii = i; ii < i + mr; ii++)  // dims past the last multiple of 8
            for (int64_t j = 0; j < nk; j++)
                for (int64_t d = hd8; d < hd; d++) acc[ii * hd + d] += p[ii * ldp + j] * w_elem(vb + j * vs, d, kind);
    }
}

AVX2 static void attn_accum_f32(float *acc, const float *p, int64_t ldp, int64_t r, const float *v, int64_t stride,
                                int64_t nk, int64_t hd) {
    attn_accum(acc, p, ldp, r, v, stride * 4, nk, hd, 0);
}

AVX2 static void attn_accum_f16(float *acc, const float *p, int64_t ldp, int64_t r, const uint16_t *v, int64_t stride,
                                int64_t nk, int64_t hd) {
    attn_accum(acc, p, ldp, r, v, stride * 2, nk, hd, 1);
}

const tri__cpu_kernels tri__cpu_kernels_avx2 = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0,
    .tile_q4_0 = tile_q4_0,
    .tile_q4_1 = tile_q4_1,
    .tile_q5_0 = tile_q5_0,
    .tile_q5_1 = tile_q5_1,
    .tile_q2_k = tile_q2_k,
    .tile_q3_k = tile_q3_k,
    .tile_q4_k = tile_q4_k,
    .tile_q5_k = tile_q5_k,
    .tile_q6_k = tile_q6_k,
    .tile_iq4_nl = tile_iq4_nl,
    .tile_iq4_xs = tile_iq4_xs,
    .tile_n = 2,
    .quantize = quantize,
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
#endif  // TRI_CPU_X86
