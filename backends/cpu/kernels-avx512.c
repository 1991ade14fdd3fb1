// kernels-avx512.c - AVX-512 inner loops (16 floats per register, masked tails; two quantized
// blocks per register), with a second set of quantized tiles for CPUs with AVX-512 VNNI.
#include <math.h>
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

// ---- attention ----

// The sums of a0 .. a3 in lanes 0 .. 3: two shuffle-and-add rounds fold each vector to 4 lanes,
// one 128-bit lane per vector, then two in-lane rounds (4 sums for about 14 instructions, where 4
// separate reductions take about 32).
AVX512 static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
    __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88), _mm512_shuffle_f32x4(t01, t23, 0xdd));
    u = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0xb1));  // (x0 + x1, x0 + x1, x2 + x3, x2 + x3)
    u = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0x4e));  // every lane: the lane's total
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, u));
}

// Scores of MR rows of q against NR keys (f32 or f16 rows ks bytes apart).
AVX512 static inline __attribute__((always_inline)) void sc_tile(float *s, int64_t lds, const float *q, int64_t hd,
                                                                 const char *k, int64_t ks, const int MR, const int NR,
                                                                 const int kind) {
    __m512 acc[TRI_CPU_TILE_M][4];
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
        __mmask16 m = d + 16 <= hd ? (__mmask16)0xffff : tail_mask(hd - d);
        __m512 kv[4];
        for (int c = 0; c < NR; c++) kv[c] = load_w(k + c * ks, d, m, kind);
        for (int i = 0; i < MR; i++) {
            __m512 qv = _mm512_maskz_loadu_ps(m, q + i * hd + d);
            for (int c = 0; c < NR; c++) acc[i][c] = _mm512_fmadd_ps(qv, kv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < MR; i++)
        _mm_mask_storeu_ps(s + i * lds, (__mmask8)((1u << NR) - 1), hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

#define SC_BODY(MR, NR) sc_tile(s + i * lds + j, lds, q + i * hd, hd, kb + j * ks, ks, MR, NR, kind)

AVX512 static inline __attribute__((always_inline)) void attn_scores(float *s, int64_t lds, const float *q, int64_t r,
                                                                     const void *k, int64_t ks, int64_t nk, int64_t hd,
                                                                     const int kind) {
    const char *kb = k;
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M) {
        int64_t mr = r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M;
        for (int64_t j = 0; j < nk; j += 4) {
            int64_t nr = nk - j < 4 ? nk - j : 4;
            TRI_CPU_TILE_DISPATCH(mr, nr, SC_BODY)
        }
    }
}

AVX512 static void attn_scores_f32(float *s, int64_t lds, const float *q, int64_t r, const float *k, int64_t stride,
                                   int64_t nk, int64_t hd) {
    attn_scores(s, lds, q, r, k, stride * 4, nk, hd, 0);
}

AVX512 static void attn_scores_f16(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k, int64_t stride,
                                   int64_t nk, int64_t hd) {
    attn_scores(s, lds, q, r, k, stride * 2, nk, hd, 1);
}

// exp(x) for x <= 0 (-inf included), 0 below -87: Cephes' expf polynomial on x - n ln 2, scaled
// by 2^n with vscalefps; within 2 ulp of expf.
AVX512 static inline __m512 exp_neg(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

AVX512 static float attn_softmax(float *s, int64_t n, float *mx, float *sum) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
    if (j < n) vm = _mm512_mask_max_ps(vm, tail_mask(n - j), vm, _mm512_maskz_loadu_ps(tail_mask(n - j), s + j));
    float m = fmaxf(*mx, _mm512_reduce_max_ps(vm));
    if (m == -INFINITY) {
        memset(s, 0, sizeof(float) * (size_t)n);
        return 1.0f;
    }
    __m512 vmax = _mm512_set1_ps(m), vs = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + j), vmax));
        _mm512_storeu_ps(s + j, e);
        vs = _mm512_add_ps(vs, e);
    }
    if (j < n) {
        __mmask16 t = tail_mask(n - j);
        __m512 e = _mm512_maskz_mov_ps(t, exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), vmax)));
        _mm512_mask_storeu_ps(s + j, t, e);
        vs = _mm512_add_ps(vs, e);
    }
    float c = expf(*mx - m);
    *sum = *sum * c + _mm512_reduce_add_ps(vs);
    *mx = m;
    return c;
}

// acc rows i < MR, dims d0 .. d0 + 16 NV (the last vector masked by mlast) += p @ V over nk keys.
AVX512 static inline __attribute__((always_inline)) void acc_tile(float *acc, int64_t hd, const float *p, int64_t ldp,
                                                                  const char *v, int64_t vs, int64_t nk, int64_t d0,
                                                                  __mmask16 mlast, const int MR, const int NV,
                                                                  const int kind) {
    __m512 a[TRI_CPU_TILE_M][8];
    __mmask16 mk[8];
    for (int c = 0; c < NV; c++) mk[c] = c == NV - 1 ? mlast : (__mmask16)0xffff;
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NV; c++) a[i][c] = _mm512_maskz_loadu_ps(mk[c], acc + i * hd + d0 + 16 * c);
    for (int64_t j = 0; j < nk; j++) {
        __m512 vv[8];
        for (int c = 0; c < NV; c++) vv[c] = load_w(v + j * vs, d0 + 16 * c, mk[c], kind);
        for (int i = 0; i < MR; i++) {
            __m512 pb = _mm512_set1_ps(p[i * ldp + j]);
            for (int c = 0; c < NV; c++) a[i][c] = _mm512_fmadd_ps(pb, vv[c], a[i][c]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NV; c++) _mm512_mask_storeu_ps(acc + i * hd + d0 + 16 * c, mk[c], a[i][c]);
}

#define ACC_BODY(MR, NV) acc_tile(acc + i * hd, hd, p + i * ldp, ldp, vb, vs, nk, d0, mlast, MR, NV, kind)
#define ACC_WIDE(MR)                   \
    switch (nv) {                      \
    case 5: ACC_BODY(MR, 5); break;    \
    case 6: ACC_BODY(MR, 6); break;    \
    case 7: ACC_BODY(MR, 7); break;    \
    default: ACC_BODY(MR, 8); break;   \
    }

AVX512 static inline __attribute__((always_inline)) void attn_accum(float *acc, const float *p, int64_t ldp, int64_t r,
                                                                    const void *v, int64_t vs, int64_t nk, int64_t hd,
                                                                    const int kind) {
    const char *vb = v;
    for (int64_t i = 0; i < r; i += TRI_CPU_TILE_M) {
        int64_t mr = r - i < TRI_CPU_TILE_M ? r - i : TRI_CPU_TILE_M;
        // one or two rows (decode without grouping): up to 128 dims at once, so each value row is
        // read whole in one pass (the hardware prefetcher streams it) rather than half per pass
        int64_t width = mr <= 2 ? 128 : 64;
        for (int64_t d0 = 0; d0 < hd; d0 += width) {
            int64_t nd = hd - d0 < width ? hd - d0 : width, nv = (nd + 15) / 16;
            __mmask16 mlast = nd % 16 ? tail_mask(nd % 16) : (__mmask16)0xffff;
            if (nv <= 4) {
                TRI_CPU_TILE_DISPATCH(mr, nv, ACC_BODY)
            } else if (mr == 1) {
                ACC_WIDE(1)
            } else {
                ACC_WIDE(2)
            }
        }
    }
}

AVX512 static void attn_accum_f32(float *acc, const float *p, int64_t ldp, int64_t r, const float *v, int64_t stride,
                                  int64_t nk, int64_t hd) {
    attn_accum(acc, p, ldp, r, v, stride * 4, nk, hd, 0);
}

AVX512 static void attn_accum_f16(float *acc, const float *p, int64_t ldp, int64_t r, const uint16_t *v,
                                  int64_t stride, int64_t nk, int64_t hd) {
    attn_accum(acc, p, ldp, r, v, stride * 2, nk, hd, 1);
}

const tri__cpu_kernels tri__cpu_kernels_avx512 = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0_bw,
    .tile_q4_0 = tile_q4_0_bw,
    .tile_q4_1 = tile_q4_1_bw,
    .tile_q5_0 = tile_q5_0_bw,
    .tile_q5_1 = tile_q5_1_bw,
    .tile_q2_k = tile_q2_k_bw,
    .tile_q3_k = tile_q3_k_bw,
    .tile_q4_k = tile_q4_k_bw,
    .tile_q5_k = tile_q5_k_bw,
    .tile_q6_k = tile_q6_k_bw,
    .tile_iq4_nl = tile_iq4_nl_bw,
    .tile_iq4_xs = tile_iq4_xs_bw,
    .tile_n = 4,
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

const tri__cpu_kernels tri__cpu_kernels_avx512_vnni = {
    .tile_f32 = tile_f32,
    .tile_f16 = tile_f16,
    .tile_bf16 = tile_bf16,
    .tile_q8_0 = tile_q8_0_vnni,
    .tile_q4_0 = tile_q4_0_vnni,
    .tile_q4_1 = tile_q4_1_vnni,
    .tile_q5_0 = tile_q5_0_vnni,
    .tile_q5_1 = tile_q5_1_vnni,
    .tile_q2_k = tile_q2_k_vnni,
    .tile_q3_k = tile_q3_k_vnni,
    .tile_q4_k = tile_q4_k_vnni,
    .tile_q5_k = tile_q5_k_vnni,
    .tile_q6_k = tile_q6_k_vnni,
    .tile_iq4_nl = tile_iq4_nl_vnni,
    .tile_iq4_xs = tile_iq4_xs_vnni,
    .tile_n = 4,
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
