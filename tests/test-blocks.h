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

// Random blocks of the types without a quantizer here (Q5_0, Q5_1, the K-quants): every code and
// scale byte drawn, the f16 scale fields (at their offsets in dtype.h's layouts) set from the
// magnitude of the row of w they stand for, so values are about as large as w's. Decoded by
// tri__dequantize_row, which test-dtype checks against the gguf package.
static void random_blocks(uint8_t *out, const float *w, int64_t k, tri_dtype t) {
    int64_t bb = tri__dtype_block_bytes(t), nb = k / tri__dtype_block_elems(t);
    float amax = 0;
    for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(w[i]));
    int d_at = 0, m_at = -1;
    float d = amax / 16;  // Q5_0: codes -16..15
    switch (t) {
    case TRI_DTYPE_Q5_1: m_at = 2, d = amax / 32; break;
    case TRI_DTYPE_Q2_K: d_at = 80, m_at = 82, d = amax / 45; break;   // scale <= 15, q <= 3
    case TRI_DTYPE_Q3_K: d_at = 108, d = amax / 128; break;           // |scale| <= 32, |q| <= 4
    case TRI_DTYPE_Q4_K: m_at = 2, d = amax / 945; break;             // scale <= 63, q <= 15
    case TRI_DTYPE_Q5_K: m_at = 2, d = amax / 1953; break;            // q <= 31
    case TRI_DTYPE_Q6_K: d_at = 208, d = amax / 4064; break;          // |scale| <= 128, |q| <= 32
    case TRI_DTYPE_IQ4_NL: d = amax / 127; break;                     // |level| <= 127
    case TRI_DTYPE_IQ4_XS: d = amax / 4064; break;                    // |scale| <= 32, |level| <= 127
    default: break;
    }
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = out + b * bb;
        for (int64_t i = 0; i < bb; i++) blk[i] = (uint8_t)(frand() * 128 + 128);
        uint16_t h = tri__f32_to_f16(d * (0.5f + 0.5f * fabsf(frand())));
        memcpy(blk + d_at, &h, 2);
        if (m_at >= 0) {
            // Q5_1's minimum is added, the K-quants' subtracted (times a 4- or 6-bit minimum code)
            uint16_t m = tri__f32_to_f16(t == TRI_DTYPE_Q5_1 ? -amax / 2 : d * 8);
            memcpy(blk + m_at, &m, 2);
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
        default: random_blocks(o, wr, k, t); break;
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
    default: {
        // the other quantized types: through tri__dequantize_row (checked against the gguf package)
        // (the last block decoded is kept, by its bytes: the references read blocks element by
        // element)
        static uint8_t last[256];
        static tri_dtype last_t = TRI_DTYPE_F32;
        static float v[256];
        int64_t be = tri__dtype_block_elems(t), bb = tri__dtype_block_bytes(t);
        cr_assert(be > 1 && be <= 256 && bb <= 256);
        const uint8_t *blk = row + (i / be) * bb;
        if (t != last_t || memcmp(blk, last, (size_t)bb) != 0) {
            tri__dequantize_row(v, blk, t, be);
            memcpy(last, blk, (size_t)bb);
            last_t = t;
        }
        return v[i % be];
    }
    }
}

#endif  // TRI_TEST_BLOCKS_H
