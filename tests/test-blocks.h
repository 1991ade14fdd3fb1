// test-blocks.h - what the backend suites share: a seeded random fill, and quantizers and
// dequantizers written from the GGML block definitions in dtype.h (independent of the kernels).
#ifndef TRI_TEST_BLOCKS_H
#define TRI_TEST_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "test-util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {  // uniform in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
}


// ---- quantizers and dequantizers ----

static void quantize_q8_0(tri__block_q8_0 *out, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        float d = amax / 127;
        out[b].d = tri__f32_to_f16(d);
        for (int i = 0; i < 32; i++) out[b].qs[i] = (int8_t)(d ? roundf(x[b * 32 + i] / d) : 0);
    }
}

static void quantize_q4_0(tri__block_q4_0 *out, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++) {
        float mx = 0;  // the value of largest magnitude, with its sign: it maps to -8
        for (int i = 0; i < 32; i++)
            if (fabsf(x[b * 32 + i]) > fabsf(mx)) mx = x[b * 32 + i];
        float d = mx / -8, id = d ? 1 / d : 0;
        out[b].d = tri__f32_to_f16(d);
        for (int i = 0; i < 16; i++) {
            int lo = (int)(x[b * 32 + i] * id + 8.5f), hi = (int)(x[b * 32 + i + 16] * id + 8.5f);
            lo = lo > 15 ? 15 : lo < 0 ? 0 : lo;
            hi = hi > 15 ? 15 : hi < 0 ? 0 : hi;
            out[b].qs[i] = (uint8_t)(lo | hi << 4);
        }
    }
}

static void quantize_q4_1(tri__block_q4_1 *out, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++) {
        float mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < 32; i++) {
            mn = fminf(mn, x[b * 32 + i]);
            mx = fmaxf(mx, x[b * 32 + i]);
        }
        float d = (mx - mn) / 15, id = d ? 1 / d : 0;
        out[b].d = tri__f32_to_f16(d);
        out[b].m = tri__f32_to_f16(mn);
        for (int i = 0; i < 16; i++) {
            int lo = (int)((x[b * 32 + i] - mn) * id + 0.5f), hi = (int)((x[b * 32 + i + 16] - mn) * id + 0.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            out[b].qs[i] = (uint8_t)(lo | hi << 4);
        }
    }
}

// A (rows, k) f32 matrix stored as type t; the caller frees.
static void *encode(const float *w, int64_t rows, int64_t k, tri_dtype t) {
    int64_t rb = tri__dtype_row_bytes(t, k);
    uint8_t *out = malloc((size_t)(rb * rows));
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * k;
        void *o = out + r * rb;
        switch (t) {
        case TRI_DTYPE_F32: memcpy(o, wr, sizeof(float) * (size_t)k); break;
        case TRI_DTYPE_F16:
            for (int64_t i = 0; i < k; i++) ((uint16_t *)o)[i] = tri__f32_to_f16(wr[i]);
            break;
        case TRI_DTYPE_BF16:
            for (int64_t i = 0; i < k; i++) ((uint16_t *)o)[i] = tri__f32_to_bf16(wr[i]);
            break;
        case TRI_DTYPE_Q8_0: quantize_q8_0(o, wr, k); break;
        case TRI_DTYPE_Q4_0: quantize_q4_0(o, wr, k); break;
        case TRI_DTYPE_Q4_1: quantize_q4_1(o, wr, k); break;
        default: cr_assert_fail();
        }
    }
    return out;
}

// Element i of row r of an encoded matrix, straight from the block definitions.
static double decode(const void *data, tri_dtype t, int64_t k, int64_t r, int64_t i) {
    const uint8_t *row = (const uint8_t *)data + r * tri__dtype_row_bytes(t, k);
    switch (t) {
    case TRI_DTYPE_F32: return ((const float *)row)[i];
    case TRI_DTYPE_F16: return tri__f16_to_f32(((const uint16_t *)row)[i]);
    case TRI_DTYPE_BF16: return tri__bf16_to_f32(((const uint16_t *)row)[i]);
    case TRI_DTYPE_Q8_0: {
        const tri__block_q8_0 *b = (const tri__block_q8_0 *)row + i / 32;
        return (double)tri__f16_to_f32(b->d) * b->qs[i % 32];
    }
    case TRI_DTYPE_Q4_0: {
        const tri__block_q4_0 *b = (const tri__block_q4_0 *)row + i / 32;
        int j = (int)(i % 32), q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        return (double)tri__f16_to_f32(b->d) * (q - 8);
    }
    case TRI_DTYPE_Q4_1: {
        const tri__block_q4_1 *b = (const tri__block_q4_1 *)row + i / 32;
        int j = (int)(i % 32), q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        return (double)tri__f16_to_f32(b->d) * q + tri__f16_to_f32(b->m);
    }
    default: cr_assert_fail(); return 0;
    }
}

#endif  // TRI_TEST_BLOCKS_H
