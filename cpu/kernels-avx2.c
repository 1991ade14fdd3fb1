// kernels-avx2.c - AVX2 + FMA + F16C inner loops (8 floats per register).
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

AVX2 static float dot_bf16(const float *x, const uint16_t *w, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load_bf16(w + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16(w + i), a0);
    float acc = hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += x[i] * tri__bf16_to_f32(w[i]);
    return acc;
}

// Sums of products of 32 unsigned bytes u and 32 signed bytes s, as 8 f32 partial sums. No
// int16 overflow: |u| <= 128 (Q8_0 weights may hold -128) and |s| <= 127 give pairs <= 32512.
AVX2 static inline __m256 dot_u8_i8(__m256i u, __m256i s) {
    __m256i p = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// The same for two signed operands: move w's sign onto x.
AVX2 static inline __m256 dot_i8_i8(__m256i w, __m256i x) {
    return dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// 32 nibbles of a Q4 block as bytes 0..15, element i at byte i.
AVX2 static inline __m256i unpack_q4(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

AVX2 static float dot_q8_0(const tri__cpu_block_q8x *x, const tri__block_q8_0 *w, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);
        acc = _mm256_fmadd_ps(d, dot_i8_i8(wq, xq), acc);
    }
    return hsum(acc);
}

AVX2 static float dot_q4_0(const tri__cpu_block_q8x *x, const tri__block_q4_0 *w, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq = _mm256_sub_epi8(unpack_q4(w[b].qs), _mm256_set1_epi8(8));
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);
        acc = _mm256_fmadd_ps(d, dot_i8_i8(wq, xq), acc);
    }
    return hsum(acc);
}

AVX2 static float dot_q4_1(const tri__cpu_block_q8x *x, const tri__block_q4_1 *w, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0;
    for (int64_t b = 0; b < nb; b++) {
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);
        acc = _mm256_fmadd_ps(d, dot_u8_i8(unpack_q4(w[b].qs), xq), acc);
        acc_m += _cvtsh_ss(w[b].m) * x[b].s;
    }
    return hsum(acc) + acc_m;
}

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

const tri__cpu_kernels tri__cpu_kernels_avx2 = {
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = dot_bf16,
    .dot_q8_0 = dot_q8_0,
    .dot_q4_0 = dot_q4_0,
    .dot_q4_1 = dot_q4_1,
    .axpby_f32 = axpby_f32,
    .axpby_f16 = axpby_f16,
};
#endif  // TRI_CPU_X86
