// cpu-kernels.h - the SIMD-dispatched inner loops of the CPU backend (internal to backends/cpu/).
//
// One table per SIMD level (scalar, AVX2, AVX-512, AVX-512 VNNI); cpu-backend.c picks one at
// creation. The functions are compiled with __attribute__((target(...))) so the build needs no
// -march flag and runs on any x86-64 (or non-x86) machine; a level is only used when the CPU
// reports it.
//
// Batch invariance (see cpu_attention): within a level, a row's result must not depend on the
// other rows of the call. A tile computes each (row of x, row of W) output with the same
// operations for every mr and nr, the quantizer works row by row, and the attention kernels treat
// each row of q alone; attn_softmax must give a row the same sum whether or not masked (-inf)
// scores follow its last live one (they add zeros to the same lanes).
#ifndef TRI_CPU_KERNELS_H
#define TRI_CPU_KERNELS_H

#include <stdint.h>

#include "dtype.h"

// Activations quantized for the integer dot products against quantized weights, laid out for the
// kernels rather than as GGML blocks: block b of row i holds the 32 values
// d * qs[i * k + 32 b + j]. Scales are repeated over the 8 int32 lanes a block's products fill,
// so a SIMD kernel loads them with the lanes they multiply (two blocks per 512-bit load).
typedef struct tri__cpu_xq {
    const int8_t *qs;  // (m, k) quantized values, |q| <= 127
    const float *d8;   // (m, k / 32, 8) the block's scale d, 8 times
    const float *s8;   // (m, k / 32, 8) d * sum(qs of the block) / 8, 8 times: the 8 lanes add up
                       // to the block's sum, for the weights' offset terms (Q4_1's minimum)
    int64_t k;         // elements per row, a multiple of 32
} tri__cpu_xq;

// Matmul tiles: y[i * ldy + r] = (row i of x) . (row r of W) for i < mr, r < nr, with
// 1 <= mr <= TRI_CPU_TILE_M and 1 <= nr <= TRI_CPU_TILE_N. W rows are w_stride bytes apart.
// Float weights take f32 x (rows k elements apart); quantized ones x quantized as above.
#define TRI_CPU_TILE_M 4
#define TRI_CPU_TILE_N 4
typedef void (*tri__cpu_tile_f)(float *y, int64_t ldy, const float *x, int64_t mr, const void *w,
                                int64_t w_stride, int64_t nr, int64_t k);
typedef void (*tri__cpu_tile_q)(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                                int64_t w_stride, int64_t nr);

typedef struct tri__cpu_kernels {
    // Tiles per weight type: the float ones for F32, F16, BF16, the quantized ones for Q8_0, Q4_0,
    // Q4_1. tile_n is the largest nr the level is fast with (<= TRI_CPU_TILE_N: AVX2 has 16
    // registers); mr is always up to TRI_CPU_TILE_M.
    tri__cpu_tile_f tile_f32, tile_f16, tile_bf16;
    tri__cpu_tile_q tile_q8_0, tile_q4_0, tile_q4_1;
    // Q5_0, Q5_1 (blocks of 32, as above) and the K-quants Q2_K .. Q6_K (super-blocks of 256:
    // k a multiple of 256; each block of 32 of x still has its own scale).
    tri__cpu_tile_q tile_q5_0, tile_q5_1, tile_q2_k, tile_q3_k, tile_q4_k, tile_q5_k, tile_q6_k;
    tri__cpu_tile_q tile_iq4_nl;  // blocks of 32, 16 fixed levels
    tri__cpu_tile_q tile_iq4_xs;  // super-blocks of 256 (k a multiple of 256), the same levels
    int tile_n;
    // Quantizes row i of x (m rows of k f32, k a multiple of 32) into row i of out (whose buffers
    // the caller owns): d = max|x| / 127, qs = x / d rounded to nearest even; identical results at
    // every level.
    void (*quantize)(int8_t *qs, float *d8, float *s8, const float *x, int64_t k);
    // sum_i x[i] * w[i] over k elements; x f32, w of the named type (attention's scores).
    float (*dot_f32)(const float *x, const float *w, int64_t k);
    float (*dot_f16)(const float *x, const uint16_t *w, int64_t k);
    // y[i] = y[i] * c + a * v[i] over n elements (the attention value accumulation, with the
    // online-softmax rescale c folded in); v f32 or f16.
    void (*axpby_f32)(float *y, float c, float a, const float *v, int64_t n);
    void (*axpby_f16)(float *y, float c, float a, const uint16_t *v, int64_t n);

    // ---- attention over a block of keys (see cpu_attention) ----
    // Scores: s[i * lds + j] = q_i . k_j for i < r, j < nk; q (r, hd) f32, K rows stride elements
    // apart. Each loaded key vector serves several rows of q.
    void (*attn_scores_f32)(float *s, int64_t lds, const float *q, int64_t r, const float *k, int64_t stride,
                            int64_t nk, int64_t hd);
    void (*attn_scores_f16)(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k, int64_t stride,
                            int64_t nk, int64_t hd);
    // One online-softmax step over a row of n scores (-inf = masked): m' = max(*mx, max s),
    // s[j] = exp(s[j] - m'), *sum = *sum * exp(*mx - m') + sum_j s[j], *mx = m'; returns
    // exp(old *mx - m'), the factor the row's accumulator must be scaled by (0 the first time).
    // When every score so far is -inf: s = 0, *mx and *sum unchanged, returns 1.
    float (*attn_softmax)(float *s, int64_t n, float *mx, float *sum);
    // Values: acc[i * hd + d] += sum_j p[i * ldp + j] * v_j[d] for i < r, d < hd, j < nk; V rows
    // stride elements apart. Each loaded value vector serves several rows.
    void (*attn_accum_f32)(float *acc, const float *p, int64_t ldp, int64_t r, const float *v, int64_t stride,
                           int64_t nk, int64_t hd);
    void (*attn_accum_f16)(float *acc, const float *p, int64_t ldp, int64_t r, const uint16_t *v, int64_t stride,
                           int64_t nk, int64_t hd);
} tri__cpu_kernels;

extern const tri__cpu_kernels tri__cpu_kernels_scalar;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRI_CPU_X86 1
extern const tri__cpu_kernels tri__cpu_kernels_avx2;
extern const tri__cpu_kernels tri__cpu_kernels_avx512;
extern const tri__cpu_kernels tri__cpu_kernels_avx512_vnni;
#else
#define TRI_CPU_X86 0
#endif

// The scalar quantizer (the reference for the SIMD ones).
void tri__cpu_quantize_row(int8_t *qs, float *d8, float *s8, const float *x, int64_t k);

// The scalar tiles of the types a level has no SIMD tiles for (tri__qblock_unpack per block).
void tri__cpu_tile_q5_0_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q5_1_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q2_k_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q3_k_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q4_k_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q5_k_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_q6_k_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                               int64_t ws, int64_t nr);
void tri__cpu_tile_iq4_nl_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                                 int64_t ws, int64_t nr);
void tri__cpu_tile_iq4_xs_scalar(float *y, int64_t ldy, const tri__cpu_xq *x, int64_t mr, const void *w,
                                 int64_t ws, int64_t nr);

// Calls body(MR, NR) with compile-time constants for the run-time mr, nr (1..4 each), so an
// always-inline tile body is specialised and keeps its accumulators in registers.
#define TRI_CPU_TILE_DISPATCH(mr, nr, body)            \
    switch ((int)((mr) - 1) * 4 + (int)((nr) - 1)) {  \
    case 0: body(1, 1); break;                        \
    case 1: body(1, 2); break;                        \
    case 2: body(1, 3); break;                        \
    case 3: body(1, 4); break;                        \
    case 4: body(2, 1); break;                        \
    case 5: body(2, 2); break;                        \
    case 6: body(2, 3); break;                        \
    case 7: body(2, 4); break;                        \
    case 8: body(3, 1); break;                        \
    case 9: body(3, 2); break;                        \
    case 10: body(3, 3); break;                       \
    case 11: body(3, 4); break;                       \
    case 12: body(4, 1); break;                       \
    case 13: body(4, 2); break;                       \
    case 14: body(4, 3); break;                       \
    default: body(4, 4); break;                       \
    }

// ---- bf16 attention scores (opt-in: tri__cpu_set_attn_bf16; kernels-bf16.c) ----
// attn_scores_f16's contract with q and k rounded to bf16 and f32 sums in the order kernels-bf16.c
// states; the AVX512-BF16 version (vdpbf16ps) only where tri__cpu_has_bf16(), the scalar reference
// everywhere.
bool tri__cpu_has_bf16(void);
void tri__cpu_attn_scores_f16_bf16_ref(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k,
                                       int64_t stride, int64_t nk, int64_t hd);
#if TRI_CPU_X86
void tri__cpu_attn_scores_f16_bf16(float *s, int64_t lds, const float *q, int64_t r, const uint16_t *k, int64_t stride,
                                   int64_t nk, int64_t hd);
#endif

#endif  // TRI_CPU_KERNELS_H
