// kernels-bf16.c - attention scores over f16 keys with bf16 operands (opt-in, see
// tri__cpu_set_attn_bf16): AVX512-BF16's vdpbf16ps, and a scalar reference of the same arithmetic.
//
// The arithmetic, both versions: q and k rounded to bf16 (to nearest even; f16 -> f32 is exact);
// dims taken 32 at a time (zeros past hd), dims 32 t + 2 l and 32 t + 2 l + 1 feed f32 lane l of 16:
// lane += q[2l + 1] k[2l + 1], then lane += q[2l] k[2l] (products of bf16 values are exact in f32,
// each sum rounded to nearest even), t = 0, 1, ...; then the 16 lanes a[0..15] are summed as
// x_e = (a[e] + a[e + 8]) + (a[e + 4] + a[e + 12]), score = (x0 + x1) + (x2 + x3). One difference
// the reference does not model: vdpbf16ps flushes subnormal operands and sums to zero, so scores
// whose products fall below 2^-126 may differ (attention's scaled q and f16 keys stay far above).
#include "cpu-kernels.h"
#include "dtype.h"

static void lanes_to_score(const float *a, float *s) {
    float x[4];
    for (int e = 0; e < 4; e++) x[e] = (a[e] + a[e + 8]) + (a[e + 4] + a[e + 12]);
    *s = (x[0] + x[1]) + (x[2] + x[3]);
}

void tri__cpu_attn_scores_f16_bf16_ref(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k,
                                       int64_t stride, int64_t nk, int64_t hd) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < nk; j++) {
            float a[16] = {0};
            const uint16_t *kj = k + j * stride;
            for (int64_t d0 = 0; d0 < hd; d0 += 32)
                for (int l = 0; l < 16; l++)
                    for (int o = 1; o >= 0; o--) {
                        int64_t d = d0 + 2 * l + o;
                        if (d >= hd) continue;  // a zero pair adds +0: the lane is unchanged
                        float qb = tri__bf16_to_f32(tri__f32_to_bf16(q[i * hd + d]));
                        float kb = tri__bf16_to_f32(tri__f32_to_bf16(tri__f16_to_f32(kj[d])));
                        a[l] += qb * kb;
                    }
            lanes_to_score(a, s + i * lds + j);
        }
}

#if TRI_CPU_X86
#include <immintrin.h>

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

bool tri__cpu_has_bf16(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}

// 32 values from p (the first n < 32 of them, zeros after) as bf16 pairs in order.
BF16 static inline __m512bh f32x32_to_bf16(const float *p, int64_t n) {
    __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 m1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, p + 16), _mm512_maskz_loadu_ps(m0, p));
}

BF16 static inline __m512bh f16x32_to_bf16(const uint16_t *p, int64_t n) {
    __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 m1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __m512 lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, p));
    __m512 hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, p + 16));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

// The sums of a0 .. a3 in lanes 0 .. 3, each in the order stated above (the same folds as the
// f32 kernels' hsum4).
BF16 static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
    __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88), _mm512_shuffle_f32x4(t01, t23, 0xdd));
    u = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0xb1));
    u = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0x4e));
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, u));
}

#define BF16_MAX_HD 512  // head_dim of the packed queries on the stack; larger ones take the reference

// MR query rows (packed bf16, hp elements apart) against NR keys.
BF16 static inline __attribute__((always_inline)) void sc_tile(float *s, int64_t lds, const uint16_t *qb, int64_t hp,
                                                               const uint16_t *k, int64_t stride, int64_t hd,
                                                               const int MR, const int NR) {
    __m512 acc[TRI_CPU_TILE_M][4];
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 32) {
        __m512bh kv[4];
        for (int c = 0; c < NR; c++) kv[c] = f16x32_to_bf16(k + c * stride + d, hd - d);
        for (int i = 0; i < MR; i++) {
            __m512bh qv = (__m512bh)_mm512_loadu_si512(qb + i * hp + d);
            for (int c = 0; c < NR; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], qv, kv[c]);
        }
    }
    for (int i = 0; i < MR; i++)
        _mm_mask_storeu_ps(s + i * lds, (__mmask8)((1u << NR) - 1), hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

#define SC_BODY(MR, NR) sc_tile(s + i * lds + j, lds, qb, hp, k + j * stride, stride, hd, MR, NR)

BF16 void tri__cpu_attn_scores_f16_bf16(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k,
                                        int64_t stride, int64_t nk, int64_t hd) {
    if (hd > BF16_MAX_HD) {
        tri__cpu_attn_scores_f16_bf16_ref(s, lds, q, r, k, stride, nk, hd);
        return;
    }
    uint16_t qb[TRI_CPU_TILE_M * BF16_MAX_HD];
    int64_t hp = (hd + 31) / 32 * 32;
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M) {
        int64_t mr = r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M;
        // the block's queries as bf16 pairs, once for all its keys (zeros past hd)
        for (int64_t a = 0; a < mr; a++)
            for (int64_t d = 0; d < hp; d += 32)
                _mm512_storeu_si512(qb + a * hp + d, (__m512i)f32x32_to_bf16(q + (i + a) * hd + d, hd - d));
        for (int64_t j = 0; j < nk; j += 4) {
            int64_t nr = nk - j < 4 ? nk - j : 4;
            TRI_CPU_TILE_DISPATCH(mr, nr, SC_BODY)
        }
    }
}
#else
bool tri__cpu_has_bf16(void) { return false; }
#endif  // TRI_CPU_X86
