// dtype.h - sizes of the tensor types the runtime understands (internal).
#ifndef TRI_DTYPE_H
#define TRI_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

#define TRI_QK 32  // elements per block of every quantized type

// On-disk blocks, identical to the GGML layouts so GGUF data is used in place.
typedef struct tri__block_q8_0 {
    uint16_t d;        // f16 scale
    int8_t qs[TRI_QK]; // value = d * qs[i]
} tri__block_q8_0;

typedef struct tri__block_q4_0 {
    uint16_t d;                // f16 scale
    uint8_t qs[TRI_QK / 2];    // element i in the low nibble of qs[i], i + 16 in the high nibble;
                               // value = d * (nibble - 8)
} tri__block_q4_0;

typedef struct tri__block_q4_1 {
    uint16_t d;                // f16 scale
    uint16_t m;                // f16 minimum
    uint8_t qs[TRI_QK / 2];    // as q4_0; value = d * nibble + m
} tri__block_q4_1;

#ifdef __cplusplus  // included from the .cu files of cuda/
#define TRI__STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define TRI__STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
TRI__STATIC_ASSERT(sizeof(tri__block_q8_0) == 34, "q8_0 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q4_0) == 18, "q4_0 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q4_1) == 20, "q4_1 block layout");

// Elements per block: 1 for float types, 32 for quantized ones.
int64_t tri__dtype_block_elems(tri_dtype type);
// Bytes per block.
int64_t tri__dtype_block_bytes(tri_dtype type);
bool tri__dtype_is_quantized(tri_dtype type);
// Bytes of a row of n elements; -1 if n is not a multiple of the block size or would overflow.
int64_t tri__dtype_row_bytes(tri_dtype type, int64_t n);

// ---- half-precision conversion (IEEE binary16 and bfloat16), round to nearest even ----
float tri__f16_to_f32(uint16_t h);
uint16_t tri__f32_to_f16(float f);
float tri__bf16_to_f32(uint16_t h);
uint16_t tri__f32_to_bf16(float f);

// ---- chunk means (the retrieval cache's summaries) ----

// out (n_chunks, width) f32: out[c][j] = the mean of x[(c * chunk + r) * stride + j] over r < chunk,
// summed in double in order of r and divided by chunk in double; x rows of F16 or F32 (others
// leave out untouched), host memory. OpenMP threads share the chunks. The CPU backend's
// chunk_mean op; the CUDA one computes the same bits.
void tri__chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk, int64_t width,
                     int64_t stride);

#endif  // TRI_DTYPE_H
