// dtype.c - type sizes and scalar half-precision conversions.
#include "dtype.h"

#include <math.h>
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
    [TRI_DTYPE_Q5_0] = {"q5_0", TRI_QK, sizeof(tri__block_q5_0)},
    [TRI_DTYPE_Q5_1] = {"q5_1", TRI_QK, sizeof(tri__block_q5_1)},
    [TRI_DTYPE_Q2_K] = {"q2_K", TRI_QK_K, sizeof(tri__block_q2_k)},
    [TRI_DTYPE_Q3_K] = {"q3_K", TRI_QK_K, sizeof(tri__block_q3_k)},
    [TRI_DTYPE_Q4_K] = {"q4_K", TRI_QK_K, sizeof(tri__block_q4_k)},
    [TRI_DTYPE_Q5_K] = {"q5_K", TRI_QK_K, sizeof(tri__block_q5_k)},
    [TRI_DTYPE_Q6_K] = {"q6_K", TRI_QK_K, sizeof(tri__block_q6_k)},
    [TRI_DTYPE_IQ4_NL] = {"iq4_nl", TRI_QK, sizeof(tri__block_iq4_nl)},
    [TRI_DTYPE_IQ4_XS] = {"iq4_xs", TRI_QK_K, sizeof(tri__block_iq4_xs)},
};

static bool dtype_valid(tri_dtype type) { return (unsigned)type < TRI_DTYPE_COUNT; }

const char *tri_dtype_name(tri_dtype type) {
    if (type == TRI_DTYPE_KV_MIXED) return "mixed";
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

// ---- quantized blocks ----

// The 32 nibbles of a block of 32 (element i low nibble of qs[i], i + 16 high) plus fifth bits.
static void unpack_nibbles(int8_t *q, const uint8_t *qs, uint32_t qh, int offset) {
    for (int i = 0; i < TRI_QK / 2; i++) {
        q[i] = (int8_t)((qs[i] & 15) + (int)((qh >> i) & 1) * 16 - offset);
        q[i + 16] = (int8_t)((qs[i] >> 4) + (int)((qh >> (i + 16)) & 1) * 16 - offset);
    }
}

static void set_groups(tri__qblock *o, int n_groups, float dh, float mh) {
    for (int g = 0; g < n_groups; g++) o->dh[g] = dh, o->mh[g] = mh;
}

int tri__qblock_unpack(tri__qblock *o, const void *blk, tri_dtype type) {
    switch (type) {
    case TRI_DTYPE_Q8_0: {
        const tri__block_q8_0 *b = blk;
        memcpy(o->q, b->qs, TRI_QK);
        set_groups(o, 2, tri__f16_to_f32(b->d), 0.0f);
        return TRI_QK;
    }
    case TRI_DTYPE_Q4_0: {
        const tri__block_q4_0 *b = blk;
        unpack_nibbles(o->q, b->qs, 0, 8);
        set_groups(o, 2, tri__f16_to_f32(b->d), 0.0f);
        return TRI_QK;
    }
    case TRI_DTYPE_Q4_1: {
        const tri__block_q4_1 *b = blk;
        unpack_nibbles(o->q, b->qs, 0, 0);
        set_groups(o, 2, tri__f16_to_f32(b->d), tri__f16_to_f32(b->m));
        return TRI_QK;
    }
    case TRI_DTYPE_Q5_0: {
        const tri__block_q5_0 *b = blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        unpack_nibbles(o->q, b->qs, qh, 16);
        set_groups(o, 2, tri__f16_to_f32(b->d), 0.0f);
        return TRI_QK;
    }
    case TRI_DTYPE_Q5_1: {
        const tri__block_q5_1 *b = blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        unpack_nibbles(o->q, b->qs, qh, 0);
        set_groups(o, 2, tri__f16_to_f32(b->d), tri__f16_to_f32(b->m));
        return TRI_QK;
    }
    case TRI_DTYPE_Q2_K: {
        const tri__block_q2_k *b = blk;
        float d = tri__f16_to_f32(b->d), dmin = tri__f16_to_f32(b->dmin);
        for (int e = 0; e < TRI_QK_K; e++) {
            int h = e / 128, j = (e / 32) % 4, l = e % 32;
            o->q[e] = (int8_t)((b->qs[32 * h + l] >> (2 * j)) & 3);
        }
        for (int g = 0; g < 16; g++) {
            o->dh[g] = d * (float)(b->scales[g] & 15);
            o->mh[g] = -(dmin * (float)(b->scales[g] >> 4));
        }
        return TRI_QK_K;
    }
    case TRI_DTYPE_Q3_K: {
        const tri__block_q3_k *b = blk;
        float d = tri__f16_to_f32(b->d);
        for (int e = 0; e < TRI_QK_K; e++) {
            int h = e / 128, j = (e / 32) % 4, l = e % 32;
            int q = (b->qs[32 * h + l] >> (2 * j)) & 3;
            o->q[e] = (int8_t)(q - ((b->hmask[l] >> (4 * h + j)) & 1 ? 0 : 4));
        }
        for (int g = 0; g < 16; g++) o->dh[g] = d * (float)tri__q3k_scale(b->scales, g), o->mh[g] = 0.0f;
        return TRI_QK_K;
    }
    case TRI_DTYPE_Q4_K:
    case TRI_DTYPE_Q5_K: {
        // the two share the header and the low nibbles; Q5_K adds a fifth bit
        const bool five = type == TRI_DTYPE_Q5_K;
        const tri__block_q4_k *b4 = blk;
        const tri__block_q5_k *b5 = blk;
        uint16_t dh16 = five ? b5->d : b4->d, dm16 = five ? b5->dmin : b4->dmin;
        const uint8_t *sc = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
        float d = tri__f16_to_f32(dh16), dmin = tri__f16_to_f32(dm16);
        for (int e = 0; e < TRI_QK_K; e++) {
            int g = e / 32, l = e % 32;
            int q = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
            if (five) q += ((b5->qh[l] >> g) & 1) * 16;
            o->q[e] = (int8_t)q;
        }
        for (int g = 0; g < 8; g++) {
            int s, m;
            tri__kq_scale_min(sc, g, &s, &m);
            o->dh[2 * g] = o->dh[2 * g + 1] = d * (float)s;
            o->mh[2 * g] = o->mh[2 * g + 1] = -(dmin * (float)m);
        }
        return TRI_QK_K;
    }
    case TRI_DTYPE_IQ4_NL: {
        static const int8_t levels[16] = TRI__IQ4NL_VALUES;
        const tri__block_iq4_nl *b = blk;
        for (int i = 0; i < TRI_QK / 2; i++) {
            o->q[i] = levels[b->qs[i] & 15];
            o->q[i + 16] = levels[b->qs[i] >> 4];
        }
        set_groups(o, 2, tri__f16_to_f32(b->d), 0.0f);
        return TRI_QK;
    }
    case TRI_DTYPE_IQ4_XS: {
        static const int8_t levels[16] = TRI__IQ4NL_VALUES;
        const tri__block_iq4_xs *b = blk;
        for (int j = 0; j < TRI_QK_K / TRI_QK; j++)
            for (int i = 0; i < TRI_QK / 2; i++) {
                o->q[32 * j + i] = levels[b->qs[16 * j + i] & 15];
                o->q[32 * j + i + 16] = levels[b->qs[16 * j + i] >> 4];
            }
        tri__qblock_scales(o->dh, o->mh, blk, type);
        return TRI_QK_K;
    }
    case TRI_DTYPE_Q6_K: {
        const tri__block_q6_k *b = blk;
        float d = tri__f16_to_f32(b->d);
        for (int e = 0; e < TRI_QK_K; e++) {
            int h = e / 128, j = (e / 32) % 4, l = e % 32;
            int lo = (b->ql[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 15;
            int hi = (b->qh[32 * h + l] >> (2 * j)) & 3;
            o->q[e] = (int8_t)((lo | hi << 4) - 32);
        }
        for (int g = 0; g < 16; g++) o->dh[g] = d * (float)b->scales[g], o->mh[g] = 0.0f;
        return TRI_QK_K;
    }
    default: return 0;
    }
}

int tri__qblock_scales(float *dh, float *mh, const void *blk, tri_dtype type) {
    tri__qblock qb;
    int ne;
    switch (type) {
    case TRI_DTYPE_Q2_K: {
        const tri__block_q2_k *b = blk;
        float d = tri__f16_to_f32(b->d), dmin = tri__f16_to_f32(b->dmin);
        for (int g = 0; g < 16; g++) {
            dh[g] = d * (float)(b->scales[g] & 15);
            mh[g] = -(dmin * (float)(b->scales[g] >> 4));
        }
        return 16;
    }
    case TRI_DTYPE_Q3_K: {
        const tri__block_q3_k *b = blk;
        float d = tri__f16_to_f32(b->d);
        for (int g = 0; g < 16; g++) dh[g] = d * (float)tri__q3k_scale(b->scales, g), mh[g] = 0.0f;
        return 16;
    }
    case TRI_DTYPE_Q4_K: {
        const tri__block_q4_k *b = blk;
        float d = tri__f16_to_f32(b->d), dmin = tri__f16_to_f32(b->dmin);
        for (int g = 0; g < 8; g++) {
            int sc, m;
            tri__kq_scale_min(b->scales, g, &sc, &m);
            dh[2 * g] = dh[2 * g + 1] = d * (float)sc;
            mh[2 * g] = mh[2 * g + 1] = -(dmin * (float)m);
        }
        return 16;
    }
    case TRI_DTYPE_Q6_K: {
        const tri__block_q6_k *b = blk;
        float d = tri__f16_to_f32(b->d);
        for (int g = 0; g < 16; g++) dh[g] = d * (float)b->scales[g], mh[g] = 0.0f;
        return 16;
    }
    case TRI_DTYPE_Q5_K: return tri__qblock_scales(dh, mh, blk, TRI_DTYPE_Q4_K);  // the same header
    case TRI_DTYPE_Q5_0: {
        const tri__block_q5_0 *b = blk;
        dh[0] = dh[1] = tri__f16_to_f32(b->d);
        mh[0] = mh[1] = 0.0f;
        return 2;
    }
    case TRI_DTYPE_Q5_1: {
        const tri__block_q5_1 *b = blk;
        dh[0] = dh[1] = tri__f16_to_f32(b->d);
        mh[0] = mh[1] = tri__f16_to_f32(b->m);
        return 2;
    }
    case TRI_DTYPE_IQ4_NL: {
        const tri__block_iq4_nl *b = blk;
        dh[0] = dh[1] = tri__f16_to_f32(b->d);
        mh[0] = mh[1] = 0.0f;
        return 2;
    }
    case TRI_DTYPE_IQ4_XS: {
        const tri__block_iq4_xs *b = blk;
        float d = tri__f16_to_f32(b->d);
        for (int j = 0; j < 8; j++) {
            dh[2 * j] = dh[2 * j + 1] = d * (float)tri__iq4xs_scale(b->scales_h, b->scales_l, j);
            mh[2 * j] = mh[2 * j + 1] = 0.0f;
        }
        return 16;
    }
    default:  // the rest through the unpacking
        ne = tri__qblock_unpack(&qb, blk, type);
        memcpy(dh, qb.dh, sizeof(float) * (size_t)(ne / 16));
        memcpy(mh, qb.mh, sizeof(float) * (size_t)(ne / 16));
        return ne / 16;
    }
}

void tri__dequantize_row(float *out, const void *row, tri_dtype type, int64_t n) {
    const int64_t be = tri__dtype_block_elems(type), bb = tri__dtype_block_bytes(type);
    if (!tri__dtype_is_quantized(type)) return;
    tri__qblock qb;
    for (int64_t b = 0; b < n / be; b++) {
        int ne = tri__qblock_unpack(&qb, (const uint8_t *)row + b * bb, type);
        for (int e = 0; e < ne; e++) out[b * be + e] = qb.dh[e / 16] * (float)qb.q[e] + qb.mh[e / 16];
    }
}

bool tri__kv_type_ok(tri_dtype type) {
    return type == TRI_DTYPE_F16 || type == TRI_DTYPE_F32 || type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;
}

bool tri__kv_type_parse(const char *name, tri_dtype *out) {
    static const tri_dtype types[] = {TRI_DTYPE_F16, TRI_DTYPE_F32, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (name && strcmp(name, tri_dtype_name(types[i])) == 0) {
            *out = types[i];
            return true;
        }
    return false;
}

bool tri__quantize_row(void *row, const float *x, tri_dtype type, int64_t n) {
    if (type == TRI_DTYPE_Q8_0) {
        tri__block_q8_0 *b = row;
        for (int64_t i = 0; i < n / TRI_QK; i++, x += TRI_QK) {
            float amax = 0;
            for (int e = 0; e < TRI_QK; e++) amax = fmaxf(amax, fabsf(x[e]));
            float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
            b[i].d = tri__f32_to_f16(d);
            // (the clamp changes no finite value: |x id| <= 127; it keeps a NaN or infinite row defined)
            for (int e = 0; e < TRI_QK; e++) b[i].qs[e] = (int8_t)fmaxf(-127.0f, fminf(127.0f, roundf(x[e] * id)));
        }
        return true;
    }
    if (type == TRI_DTYPE_Q4_0) {
        tri__block_q4_0 *b = row;
        for (int64_t i = 0; i < n / TRI_QK; i++, x += TRI_QK) {
            float amax = fabsf(x[0]), max = x[0];  // the value of largest magnitude, the first of ties
            for (int e = 1; e < TRI_QK; e++)
                if (fabsf(x[e]) > amax) amax = fabsf(x[e]), max = x[e];
            float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
            b[i].d = tri__f32_to_f16(d);
            uint8_t q[TRI_QK];
            for (int e = 0; e < TRI_QK; e++) {
                float t = x[e] * id;
                t = t + 8.5f;  // (a separate rounding: no fused multiply-add)
                q[e] = (uint8_t)(int)fmaxf(0.0f, fminf(15.0f, t));  // trunc, at most 15 (NaN: 15)
            }
            for (int e = 0; e < TRI_QK / 2; e++) b[i].qs[e] = (uint8_t)(q[e] | q[e + TRI_QK / 2] << 4);
        }
        return true;
    }
    return false;
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

// Element i of a quantized KV cache's blocks (q8_0 / q4_0) from x: d q or d (q - 8), the value
// tri__dequantize_row gives (the product of an f16 scale and a small integer is exact in f32).
static inline float kv_block_elem(const void *x, tri_dtype type, int64_t i) {
    const int e = (int)(i % TRI_QK);
    if (type == TRI_DTYPE_Q8_0) {
        const tri__block_q8_0 *b = (const tri__block_q8_0 *)x + i / TRI_QK;
        return f16_value(b->d) * (float)b->qs[e];
    }
    const tri__block_q4_0 *b = (const tri__block_q4_0 *)x + i / TRI_QK;
    const int q = e < TRI_QK / 2 ? b->qs[e] & 15 : b->qs[e - TRI_QK / 2] >> 4;
    return f16_value(b->d) * (float)(q - 8);
}

void tri__chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk, int64_t width,
                     int64_t stride) {
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32 && type != TRI_DTYPE_Q8_0 && type != TRI_DTYPE_Q4_0) return;
    const bool f16 = type == TRI_DTYPE_F16, quant = tri__dtype_is_quantized(type);
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
                if (quant) {
                    for (int64_t j = 0; j < nj; j++) acc[j] += (double)kv_block_elem(x, type, e + j);
                } else if (f16) {
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
