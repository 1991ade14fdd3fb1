// cpu-kernels.h - the SIMD-dispatched inner loops of the CPU backend (internal to cpu/).
//
// One table per SIMD level (scalar, AVX2, AVX-512); cpu-backend.c picks one at creation. The
// functions are compiled with __attribute__((target(...))) so the build needs no -march flag and
// runs on any x86-64 (or non-x86) machine; a level is only used when the CPU reports it.
#ifndef TRI_CPU_KERNELS_H
#define TRI_CPU_KERNELS_H

#include <stdint.h>

#include "dtype.h"

// Activations quantized for the integer dot products against quantized weights: 32 values of one
// row of x, value = d * qs[i]. s = d * sum(qs), for Q4_1's minimum term.
typedef struct tri__cpu_block_q8x {
    float d;
    float s;
    int8_t qs[TRI_QK];
} tri__cpu_block_q8x;

typedef struct tri__cpu_kernels {
    // sum_i x[i] * w[i] over k elements; x f32, w of the named type.
    float (*dot_f32)(const float *x, const float *w, int64_t k);
    float (*dot_f16)(const float *x, const uint16_t *w, int64_t k);
    float (*dot_bf16)(const float *x, const uint16_t *w, int64_t k);
    // sum over nb blocks of the dequantized weight block . the dequantized activation block.
    float (*dot_q8_0)(const tri__cpu_block_q8x *x, const tri__block_q8_0 *w, int64_t nb);
    float (*dot_q4_0)(const tri__cpu_block_q8x *x, const tri__block_q4_0 *w, int64_t nb);
    float (*dot_q4_1)(const tri__cpu_block_q8x *x, const tri__block_q4_1 *w, int64_t nb);
    // y[i] = y[i] * c + a * v[i] over n elements (the attention value accumulation, with the
    // online-softmax rescale c folded in); v f32 or f16.
    void (*axpby_f32)(float *y, float c, float a, const float *v, int64_t n);
    void (*axpby_f16)(float *y, float c, float a, const uint16_t *v, int64_t n);
} tri__cpu_kernels;

extern const tri__cpu_kernels tri__cpu_kernels_scalar;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRI_CPU_X86 1
extern const tri__cpu_kernels tri__cpu_kernels_avx2;
extern const tri__cpu_kernels tri__cpu_kernels_avx512;
#else
#define TRI_CPU_X86 0
#endif

// Quantizes one row of k f32 values (k a multiple of 32) into k / 32 blocks: d = max|x| / 127,
// qs = round(x / d) (ties away from zero).
void tri__cpu_quantize_row_q8x(tri__cpu_block_q8x *out, const float *x, int64_t k);

#endif  // TRI_CPU_KERNELS_H
