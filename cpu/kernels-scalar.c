// kernels-scalar.c - plain C inner loops: the fallback and the reference for the SIMD ones.
#include <math.h>

#include "cpu-kernels.h"

void tri__cpu_quantize_row_q8x(tri__cpu_block_q8x *out, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / TRI_QK; b++) {
        const float *xb = x + b * TRI_QK;
        float amax = 0;
        for (int i = 0; i < TRI_QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d > 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < TRI_QK; i++) {
            int q = (int)roundf(xb[i] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            out[b].qs[i] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
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

static float dot_q8_0(const tri__cpu_block_q8x *x, const tri__block_q8_0 *w, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int i = 0; i < TRI_QK; i++) isum += (int32_t)w[b].qs[i] * x[b].qs[i];
        acc += tri__f16_to_f32(w[b].d) * x[b].d * (float)isum;
    }
    return acc;
}

static float dot_q4_0(const tri__cpu_block_q8x *x, const tri__block_q4_0 *w, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int i = 0; i < TRI_QK / 2; i++) {
            isum += ((w[b].qs[i] & 0x0f) - 8) * x[b].qs[i];
            isum += ((w[b].qs[i] >> 4) - 8) * x[b].qs[i + TRI_QK / 2];
        }
        acc += tri__f16_to_f32(w[b].d) * x[b].d * (float)isum;
    }
    return acc;
}

static float dot_q4_1(const tri__cpu_block_q8x *x, const tri__block_q4_1 *w, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int i = 0; i < TRI_QK / 2; i++) {
            isum += (w[b].qs[i] & 0x0f) * x[b].qs[i];
            isum += (w[b].qs[i] >> 4) * x[b].qs[i + TRI_QK / 2];
        }
        acc += tri__f16_to_f32(w[b].d) * x[b].d * (float)isum + tri__f16_to_f32(w[b].m) * x[b].s;
    }
    return acc;
}

static void axpby_f32(float *y, float c, float a, const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] * c + a * v[i];
}

static void axpby_f16(float *y, float c, float a, const uint16_t *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] * c + a * tri__f16_to_f32(v[i]);
}

const tri__cpu_kernels tri__cpu_kernels_scalar = {
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = dot_bf16,
    .dot_q8_0 = dot_q8_0,
    .dot_q4_0 = dot_q4_0,
    .dot_q4_1 = dot_q4_1,
    .axpby_f32 = axpby_f32,
    .axpby_f16 = axpby_f16,
};
