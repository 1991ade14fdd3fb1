// kernels-avx512.c - AVX-512 inner loops (16 floats per register, masked tails; two quantized
// blocks per register).
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

AVX512 static float dot_bf16(const float *x, const uint16_t *w, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), bf16_to_ps(_mm256_loadu_si256((const __m256i *)(w + i))), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16),
                             bf16_to_ps(_mm256_loadu_si256((const __m256i *)(w + i + 16))), a1);
    }
    for (; i + 16 <= k; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), bf16_to_ps(_mm256_loadu_si256((const __m256i *)(w + i))), a0);
    if (i < k) {
        __mmask16 m = tail_mask(k - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), bf16_to_ps(_mm256_maskz_loadu_epi16(m, w + i)), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// ---- quantized: two blocks per 512-bit register ----

// Two 256-bit halves into one register: a in lanes 0..255, b above.
AVX512 static inline __m512i join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// Per-lane scale: d0 for the 8 int32 sums of the first block, d1 for the second.
AVX512 static inline __m512 join_scale(float d0, float d1) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(d0))),
                                               _mm256_castps_pd(_mm256_set1_ps(d1)), 1));
}

// 16 int32 partial sums of unsigned u times signed s, as f32 (see the AVX2 file for the bounds).
AVX512 static inline __m512 dot_u8_i8(__m512i u, __m512i s) {
    __m512i p = _mm512_maddubs_epi16(u, s);
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(p, _mm512_set1_epi16(1)));
}

// Signed times signed: AVX-512 has no sign instruction, so negate x where w < 0 and use |w|.
AVX512 static inline __m512 dot_i8_i8(__m512i w, __m512i x) {
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    return dot_u8_i8(_mm512_abs_epi8(w), sx);
}

AVX512 static inline __m256i unpack_q4(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

AVX512 static inline __m256i load_x(const tri__cpu_block_q8x *x) {
    return _mm256_loadu_si256((const __m256i *)x->qs);
}

AVX512 static float dot_q8_0(const tri__cpu_block_q8x *x, const tri__block_q8_0 *w, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wq = join(_mm256_loadu_si256((const __m256i *)w[b].qs),
                          _mm256_loadu_si256((const __m256i *)w[b + 1].qs));
        __m512i xq = join(load_x(&x[b]), load_x(&x[b + 1]));
        __m512 d = join_scale(_cvtsh_ss(w[b].d) * x[b].d, _cvtsh_ss(w[b + 1].d) * x[b + 1].d);
        acc = _mm512_fmadd_ps(d, dot_i8_i8(wq, xq), acc);
    }
    if (b < nb) {
        __m512i wq = join(_mm256_loadu_si256((const __m256i *)w[b].qs), _mm256_setzero_si256());
        __m512i xq = join(load_x(&x[b]), _mm256_setzero_si256());
        acc = _mm512_fmadd_ps(join_scale(_cvtsh_ss(w[b].d) * x[b].d, 0), dot_i8_i8(wq, xq), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

AVX512 static float dot_q4_0(const tri__cpu_block_q8x *x, const tri__block_q4_0 *w, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    const __m512i eight = _mm512_set1_epi8(8);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wq = _mm512_sub_epi8(join(unpack_q4(w[b].qs), unpack_q4(w[b + 1].qs)), eight);
        __m512i xq = join(load_x(&x[b]), load_x(&x[b + 1]));
        __m512 d = join_scale(_cvtsh_ss(w[b].d) * x[b].d, _cvtsh_ss(w[b + 1].d) * x[b + 1].d);
        acc = _mm512_fmadd_ps(d, dot_i8_i8(wq, xq), acc);
    }
    if (b < nb) {
        // the zero upper half of x makes the upper block's products zero whatever w holds
        __m512i wq = _mm512_sub_epi8(join(unpack_q4(w[b].qs), _mm256_setzero_si256()), eight);
        __m512i xq = join(load_x(&x[b]), _mm256_setzero_si256());
        acc = _mm512_fmadd_ps(join_scale(_cvtsh_ss(w[b].d) * x[b].d, 0), dot_i8_i8(wq, xq), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

AVX512 static float dot_q4_1(const tri__cpu_block_q8x *x, const tri__block_q4_1 *w, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    float acc_m = 0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wq = join(unpack_q4(w[b].qs), unpack_q4(w[b + 1].qs));
        __m512i xq = join(load_x(&x[b]), load_x(&x[b + 1]));
        __m512 d = join_scale(_cvtsh_ss(w[b].d) * x[b].d, _cvtsh_ss(w[b + 1].d) * x[b + 1].d);
        acc = _mm512_fmadd_ps(d, dot_u8_i8(wq, xq), acc);
        acc_m += _cvtsh_ss(w[b].m) * x[b].s + _cvtsh_ss(w[b + 1].m) * x[b + 1].s;
    }
    if (b < nb) {
        __m512i wq = join(unpack_q4(w[b].qs), _mm256_setzero_si256());
        __m512i xq = join(load_x(&x[b]), _mm256_setzero_si256());
        acc = _mm512_fmadd_ps(join_scale(_cvtsh_ss(w[b].d) * x[b].d, 0), dot_u8_i8(wq, xq), acc);
        acc_m += _cvtsh_ss(w[b].m) * x[b].s;
    }
    return _mm512_reduce_add_ps(acc) + acc_m;
}

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
