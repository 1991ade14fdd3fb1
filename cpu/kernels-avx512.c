// kernels-avx512.c - AVX-512 inner loops (16 floats per register, masked tails; two quantized
// blocks per register), with a second set of quantized tiles for CPUs with AVX-512 VNNI.
#include <string.h>

#include "cpu-kernels.h"

#if TRI_CPU_X86
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

AVX512 static inline __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1); }

AVX512 static inline __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

AVX512 static inline __m512 load_f16_mask(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

AVX512 static inline __m512 bf16_to_ps(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 static float dot_f32(const float *x, const float *w, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), a1);
    }
    for (; i + 16 <= k; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
    if (i < k) {
        __mmask16 m = tail_mask(k - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, w + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

AVX512 static float dot_f16(const float *x, const uint16_t *w, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load_f16(w + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), load_f16(w + i + 16), a1);
    }
    for (; i + 16 <= k; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load_f16(w + i), a0);
    if (i < k) {
        __mmask16 m = tail_mask(k - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), load_f16_mask(w + i, m), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// ---- float tiles: each W vector loaded (and converted) once for up to 4 rows of x ----

// kind: 0 f32, 1 f16, 2 bf16; 16 elements of W row w from element j, masked.
AVX512 static inline __attribute__((always_inline)) __m512 load_w(const char *w, int64_t j, __mmask16 m,
                                                                  const int kind) {
    if (kind == 0) return _mm512_maskz_loadu_ps(m, (const float *)w + j);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + j);
    return kind == 1 ? _mm512_cvtph_ps(h) : bf16_to_ps(h);
}

AVX512 static inline __attribute__((always_inline)) void f_step(__m512 acc[TRI_CPU_TILE_M][TRI_CPU_TILE_N],
                                                                const float *x, int64_t k, const char *w, int64_t ws,
                                                                int64_t j, __mmask16 m, const int MR, const int NR,
                                                                const int kind) {
    __m512 wv[TRI_CPU_TILE_N];
    for (int r = 0; r < NR; r++) wv[r] = load_w(w + r * ws, j, m, kind);
    for (int i = 0; i < MR; i++) {
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i * k + j);
        for (int r = 0; r < NR; r++) acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
    }
}

AVX512 static inline __attribute__((always_inline)) void f_tile(float *y, int64_t ldy, const float *x, const void *w,
                                                                int64_t ws, int64_t k, const int MR, const int NR,
                                                                const int kind) {
    __m512 acc[TRI_CPU_TILE_M][TRI_CPU_TILE_N];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) f_step(acc, x, k, w, ws, j, 0xffff, MR, NR, kind);
    if (j < k) f_step(acc, x, k, w, ws, j, tail_mask(k - j), MR, NR, kind);
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) y[i * ldy + r] = _mm512_reduce_add_ps(acc[i][r]);
}

#define F_BODY_F32(MR, NR) f_tile(y, ldy, x, w, ws, k, MR, NR, 0)
#define F_BODY_F16(MR, NR) f_tile(y, ldy, x, w, ws, k, MR, NR, 1)
#define F_BODY_BF16(MR, NR) f_tile(y, ldy, x, w, ws, k, MR, NR, 2)

AVX512 static void tile_f32(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                            int64_t k) {
    TRI_CPU_TILE_DISPATCH(mr, nr, F_BODY_F32)
}

AVX512 static void tile_f16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                            int64_t k) {
    TRI_CPU_TILE_DISPATCH(mr, nr, F_BODY_F16)
}

AVX512 static void tile_bf16(float *y, int64_t ldy, const float *x, int64_t mr, const void *w, int64_t ws, int64_t nr,
                             int64_t k) {
    TRI_CPU_TILE_DISPATCH(mr, nr, F_BODY_BF16)
}

// ---- quantizing x ----

AVX512 static void quantize(int8_t *qs, float *d8, float *s8, const float *x, int64_t k) {
    for (int64_t b = 0; b < k / TRI_QK; b++) {
        __m512 a = _mm512_loadu_ps(x + b * TRI_QK), c = _mm512_loadu_ps(x + b * TRI_QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
        float d = amax / 127.0f;
        float id = d > 0 ? 1.0f / d : 0.0f;
        // the default rounding mode is nearest even, as the scalar rintf
        __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
        __m512i qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, _mm512_set1_ps(id)));
        const __m512i lim = _mm512_set1_epi32(127);
        qa = _mm512_max_epi32(_mm512_min_epi32(qa, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
        qc = _mm512_max_epi32(_mm512_min_epi32(qc, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
        _mm_storeu_si128((__m128i *)(qs + b * TRI_QK), _mm512_cvtepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(qs + b * TRI_QK + 16), _mm512_cvtepi32_epi8(qc));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
        _mm256_storeu_ps(d8 + b * 8, _mm256_set1_ps(d));
        _mm256_storeu_ps(s8 + b * 8, _mm256_set1_ps(d * (float)sum * 0.125f));
    }
}

// ---- quantized tiles, without and with VNNI ----

#define QT_TARGET AVX512
#define QT_SUFFIX _bw
#define QT_DP(acc, u, s) _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((u), (s)), _mm512_set1_epi16(1)))
#include "kernels-avx512-quant.inc"
#undef QT_TARGET
#undef QT_SUFFIX
#undef QT_DP

#define QT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define QT_SUFFIX _vnni
#define QT_DP(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#include "kernels-avx512-quant.inc"
#undef QT_TARGET
#undef QT_SUFFIX
#undef QT_DP

AVX512 static void axpby_f32(float *y, float c, float a, const float *v, int64_t n) {
    __m512 vc = _mm512_set1_ps(c), va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(v + i), _mm512_mul_ps(vc, _mm512_loadu_ps(y + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, v + i), _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(m, y + i)));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

AVX512 static void axpby_f16(float *y, float c, float a, const uint16_t *v, int64_t n) {
    __m512 vc = _mm512_set1_ps(c), va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(v + i), _mm512_mul_ps(vc, _mm512_loadu_ps(y + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(va, load_f16_mask(v + i, m), _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(m, y + i)));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

const tri__cpu_kernels tri__cpu_kernels_avx512 = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0_bw,
    .tile_q4_0 = tile_q4_0_bw,
    .tile_q4_1 = tile_q4_1_bw,
    .tile_n = 4,
    .quantize = quantize,
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .axpby_f32 = axpby_f32,
    .axpby_f16 = axpby_f16,
};

const tri__cpu_kernels tri__cpu_kernels_avx512_vnni = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0_vnni,
    .tile_q4_0 = tile_q4_0_vnni,
    .tile_q4_1 = tile_q4_1_vnni,
    .tile_n = 4,
    .quantize = quantize,
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .axpby_f32 = axpby_f32,
    .axpby_f16 = axpby_f16,
};
#endif  // TRI_CPU_X86
