// dtype.c - type sizes and scalar half-precision conversions.
#include "dtype.h"

#include <string.h>

#include "tri-config.h"

static const struct {
    const char *name;
    int64_t block_elems;
    int64_t block_bytes;
} dtype_traits[TRI_DTYPE_COUNT] = {
    [TRI_DTYPE_F32] = {"f32", 1, 4},
    [TRI_DTYPE_F16] = {"f16", 1, 2},
    [TRI_DTYPE_BF16] = {"bf16", 1, 2},
    [TRI_DTYPE_Q8_0] = {"q8_0", TRI_QK, sizeof(tri__block_q8_0)},
    [TRI_DTYPE_Q4_0] = {"q4_0", TRI_QK, sizeof(tri__block_q4_0)},
    [TRI_DTYPE_Q4_1] = {"q4_1", TRI_QK, sizeof(tri__block_q4_1)},
};

static bool dtype_valid(tri_dtype type) { return (unsigned)type < TRI_DTYPE_COUNT; }

const char *tri_dtype_name(tri_dtype type) {
    return dtype_valid(type) ? dtype_traits[type].name : "?";
}

int64_t tri__dtype_block_elems(tri_dtype type) {
    return dtype_valid(type) ? dtype_traits[type].block_elems : 0;
}

int64_t tri__dtype_block_bytes(tri_dtype type) {
    return dtype_valid(type) ? dtype_traits[type].block_bytes : 0;
}

bool tri__dtype_is_quantized(tri_dtype type) { return tri__dtype_block_elems(type) > 1; }

int64_t tri__dtype_row_bytes(tri_dtype type, int64_t n) {
    int64_t be = tri__dtype_block_elems(type);
    if (be == 0 || n < 0 || n % be != 0) return -1;
    int64_t blocks = n / be;
    if (blocks > INT64_MAX / tri__dtype_block_bytes(type)) return -1;
    return blocks * tri__dtype_block_bytes(type);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float tri__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf, nan
    if (exp == 0) {
        // zero or subnormal: value = man * 2^-24
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t tri__f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u)  // inf or nan (keep nan quiet)
        return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);
    if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
    if (abs < 0x38800000u) {
        // below the smallest normal half (2^-14): subnormal or zero, in units of 2^-24
        if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
        uint32_t exp = abs >> 23;
        uint32_t man = (abs & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp;  // man * 2^(exp-150) / 2^-24 = man >> (126 - exp)
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t q = abs - 0x38000000u;  // rebias exponent 127 -> 15 (in place, man still 23 bits)
    uint32_t rem = q & 0x1fff;
    q >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float tri__bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t tri__f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet nan
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// tri__f16_to_f32 inline, branch-free but for infinities and NaNs: the 15 bits below the sign
// shifted into place and scaled by 2^112 are the value of every finite half (subnormals exactly).
static inline float f16_value(uint16_t h) {
    uint32_t u = (uint32_t)(h & 0x7fff) << 13;
    float f = bits_f32(u) * 0x1p112f;
    u = f32_bits(f);
    if ((h & 0x7c00) == 0x7c00) u |= 0x7f800000u;
    return bits_f32(u | (uint32_t)(h & 0x8000) << 16);
}

void tri__chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk, int64_t width,
                     int64_t stride) {
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32) return;
    const bool f16 = type == TRI_DTYPE_F16;
    // rows outer, 64 columns at a time inner (contiguous, vectorised)
#if TRI_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n_chunks * chunk * width >= 65536)
#endif
    for (int64_t c = 0; c < n_chunks; c++) {
        for (int64_t j0 = 0; j0 < width; j0 += 64) {
            const int64_t nj = width - j0 < 64 ? width - j0 : 64;
            double acc[64] = {0};
            for (int64_t r = 0; r < chunk; r++) {
                int64_t e = (c * chunk + r) * stride + j0;
                if (f16) {
                    const uint16_t *p = (const uint16_t *)x + e;
                    for (int64_t j = 0; j < nj; j++) acc[j] += (double)f16_value(p[j]);
                } else {
                    const float *p = (const float *)x + e;
                    for (int64_t j = 0; j < nj; j++) acc[j] += (double)p[j];
                }
            }
            for (int64_t j = 0; j < nj; j++) out[c * width + j0 + j] = (float)(acc[j] / (double)chunk);
        }
    }
}
