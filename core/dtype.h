// dtype.h - sizes of the tensor types the runtime understands (internal).
#ifndef TRI_DTYPE_H
#define TRI_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

#define TRI_QK 32   // elements per block of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; x's blocks in the CPU matmul
#define TRI_QK_K 256  // elements per super-block of the K-quants (8 blocks of 32)

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

typedef struct tri__block_q5_0 {
    uint16_t d;                // f16 scale
    uint8_t qh[4];             // bit j (little-endian u32): fifth bit of element j
    uint8_t qs[TRI_QK / 2];    // low nibbles as q4_0; value = d * (q - 16)
} tri__block_q5_0;

typedef struct tri__block_q5_1 {
    uint16_t d;                // f16 scale
    uint16_t m;                // f16 minimum
    uint8_t qh[4];             // as q5_0
    uint8_t qs[TRI_QK / 2];    // as q5_0; value = d * q + m
} tri__block_q5_1;

// K-quants. Within a super-block, "group" g is elements 16 g .. 16 g + 15 (Q2_K, Q3_K, Q6_K
// scale each group) or 32 g .. 32 g + 31 (Q4_K, Q5_K).
typedef struct tri__block_q2_k {
    uint8_t scales[16];        // group g: scale scales[g] & 15, minimum scales[g] >> 4
    uint8_t qs[64];            // element 128 h + 32 j + l: (qs[32 h + l] >> 2 j) & 3
    uint16_t d, dmin;          // f16; value = d * scale * q - dmin * minimum
} tri__block_q2_k;

typedef struct tri__block_q3_k {
    uint8_t hmask[32];         // element 128 h + 32 j + l: bit 4 h + j of hmask[l] clear means q -= 4
    uint8_t qs[64];            // low 2 bits as q2_k
    uint8_t scales[12];        // 16 6-bit scales (offset 32): low 4 bits in bytes 0..7 (group g
                               // in byte g % 8, nibble g / 8), high 2 bits in bytes 8..11
    uint16_t d;                // f16; value = d * (scale - 32) * q, q in -4..3
} tri__block_q3_k;

typedef struct tri__block_q4_k {
    uint16_t d, dmin;          // f16
    uint8_t scales[12];        // 8 6-bit scales and 8 6-bit minima, packed (tri__kq_scale_min)
    uint8_t qs[128];           // element 64 j + l: qs[32 j + l] & 15, element 64 j + 32 + l: >> 4;
                               // value = d * scale * q - dmin * minimum
} tri__block_q4_k;

typedef struct tri__block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];        // as q4_k
    uint8_t qh[32];            // fifth bit of element 32 g + l: bit g of qh[l]
    uint8_t qs[128];           // low nibbles as q4_k
} tri__block_q5_k;

typedef struct tri__block_q6_k {
    uint8_t ql[128];           // element 128 h + 32 j + l: nibble j / 2 of ql[64 h + 32 (j % 2) + l]
    uint8_t qh[64];            // its high 2 bits: bits 2 j, 2 j + 1 of qh[32 h + l]
    int8_t scales[16];         // per group of 16
    uint16_t d;                // f16; value = d * scale * (q - 32)
} tri__block_q6_k;

typedef struct tri__block_iq4_nl {
    uint16_t d;                // f16 scale
    uint8_t qs[TRI_QK / 2];    // nibbles as q4_0; value = d * tri__iq4nl_values[nibble]
} tri__block_iq4_nl;

// IQ4_XS: IQ4_NL's levels in super-blocks of 256, a 6-bit scale per block of 32. Block j
// (elements 32 j .. 32 j + 31) has its codes in qs[16 j .. 16 j + 15] as IQ4_NL's (element i of
// the block in the low nibble of byte i, i + 16 in the high nibble) and its scale
// (tri__iq4xs_scale) as 4 low bits in nibble j % 2 of scales_l[j / 2] and 2 high bits in bits
// 2 j, 2 j + 1 of scales_h; value = d * (scale - 32) * tri__iq4nl_values[nibble].
typedef struct tri__block_iq4_xs {
    uint16_t d;                       // f16
    uint16_t scales_h;                // high 2 bits of the 8 scales
    uint8_t scales_l[TRI_QK_K / 64];  // low 4 bits of the 8 scales
    uint8_t qs[TRI_QK_K / 2];
} tri__block_iq4_xs;

// IQ4_NL's 16 levels (GGML's kvalues_iq4nl).
#define TRI__IQ4NL_VALUES {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

#ifdef __cplusplus  // included from the .cu files of backends/cuda/
#define TRI__STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define TRI__STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
TRI__STATIC_ASSERT(sizeof(tri__block_q8_0) == 34, "q8_0 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q4_0) == 18, "q4_0 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q4_1) == 20, "q4_1 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q5_0) == 22, "q5_0 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q5_1) == 24, "q5_1 block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q2_k) == 84, "q2_K block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q3_k) == 110, "q3_K block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q4_k) == 144, "q4_K block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q5_k) == 176, "q5_K block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_q6_k) == 210, "q6_K block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_iq4_nl) == 18, "iq4_nl block layout");
TRI__STATIC_ASSERT(sizeof(tri__block_iq4_xs) == 136, "iq4_xs block layout");

// Scale and minimum of group g (0..7) of a Q4_K / Q5_K super-block's 12 packed bytes: groups 0..3
// in the low 6 bits of bytes g (scale) and g + 4 (minimum); groups 4..7 take their low 4 bits
// from byte g + 4 (scale low nibble, minimum high nibble) and their high 2 bits from the top of
// bytes g - 4 (scale) and g (minimum).
static inline void tri__kq_scale_min(const uint8_t *s, int g, int *sc, int *mn) {
    if (g < 4) {
        *sc = s[g] & 63;
        *mn = s[g + 4] & 63;
    } else {
        *sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
        *mn = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    }
}

// Scale of group g (0..15) of a Q3_K super-block, -32..31.
static inline int tri__q3k_scale(const uint8_t *s, int g) {
    int lo = (s[g % 8] >> (4 * (g / 8))) & 15;
    int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | hi << 4) - 32;
}

// Scale of block j (0..7) of an IQ4_XS super-block, -32..31 (scales_h and scales_l as in the
// struct; the caller reads scales_h as a little-endian u16).
static inline int tri__iq4xs_scale(uint16_t scales_h, const uint8_t *scales_l, int j) {
    int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 15;
    int hi = (scales_h >> (2 * j)) & 3;
    return (lo | hi << 4) - 32;
}

// Elements per block: 1 for float types, 32 for Q8_0 .. Q5_1 and IQ4_NL, 256 for the K-quants
// and IQ4_XS.
int64_t tri__dtype_block_elems(tri_dtype type);
// Bytes per block.
int64_t tri__dtype_block_bytes(tri_dtype type);
bool tri__dtype_is_quantized(tri_dtype type);
// Bytes of a row of n elements; -1 if n is not a multiple of the block size or would overflow.
int64_t tri__dtype_row_bytes(tri_dtype type, int64_t n);

// ---- quantized blocks as integers and scales ----

// One block of any quantized type: element e is dh[e / 16] * q[e] + mh[e / 16], computed in f32
// in that order (GGML's dequantization gives the same values). 32 elements (2 groups) for the
// types with blocks of 32, 256 (16 groups) for the K-quants and IQ4_XS. Offsets that are whole numbers of
// steps are folded into q (Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32), so mh is 0 for them; the
// minima of Q4_1, Q5_1, Q2_K, Q4_K, Q5_K are in mh. |q| <= 127 (IQ4_NL's and IQ4_XS's levels; 63
// for the others).
typedef struct tri__qblock {
    int8_t q[TRI_QK_K];
    float dh[TRI_QK_K / 16];
    float mh[TRI_QK_K / 16];
} tri__qblock;

// Unpacks block blk (tri__dtype_block_bytes(type) bytes) of a quantized type; returns the number
// of elements (0 for a type that is not quantized).
int tri__qblock_unpack(tri__qblock *out, const void *blk, tri_dtype type);

// The dh and mh of every group of the block at blk (as tri__qblock_unpack, without the codes):
// for the SIMD kernels, which unpack the codes themselves. Returns the number of groups (2 or 16).
int tri__qblock_scales(float *dh, float *mh, const void *blk, tri_dtype type);

// out (n) f32 = the row of n elements of a quantized type (n a multiple of its block).
void tri__dequantize_row(float *out, const void *row, tri_dtype type, int64_t n);

// ---- quantizing (the quantized KV cache's rows) ----

// The KV cache types: F16, F32, and the blocks of Q8_0 and Q4_0, which the CPU attention reads in
// place. tri__kv_type_parse maps "f16", "f32", "q8_0", "q4_0" to them (false for another name).
bool tri__kv_type_ok(tri_dtype type);
bool tri__kv_type_parse(const char *name, tri_dtype *out);

// row (n / 32 blocks) = x (n) f32 quantized to Q8_0 or Q4_0 (n a multiple of 32), bit for bit as
// GGML's reference quantizers (and gguf.quants): Q8_0 d = amax / 127, q = roundf(x / d) (x times
// 1 / d in f32, halves away from zero); Q4_0 d = -(the value of largest magnitude, the first of
// ties) / 8, q = min(15, trunc(x / d + 8.5)); d stored as f16 (to nearest even), a zero block gets
// d = 0 and codes 0 (Q8_0) or 8 (Q4_0). Returns false for another type.
bool tri__quantize_row(void *row, const float *x, tri_dtype type, int64_t n);

// ---- half-precision conversion (IEEE binary16 and bfloat16), round to nearest even ----
float tri__f16_to_f32(uint16_t h);
uint16_t tri__f32_to_f16(float f);
float tri__bf16_to_f32(uint16_t h);
uint16_t tri__f32_to_bf16(float f);

// ---- chunk means (the retrieval cache's summaries) ----

// out (n_chunks, width) f32: out[c][j] = the mean of x[(c * chunk + r) * stride + j] over r < chunk,
// summed in double in order of r and divided by chunk in double; x rows of F16, F32, or a quantized
// cache's Q8_0 / Q4_0 blocks (element i of x in block i / 32, the value tri__dequantize_row gives;
// stride a multiple of 32, so that rows start blocks), others leave out untouched; host memory.
// OpenMP threads share the chunks. The CPU backend's chunk_mean op; the CUDA one computes the same
// bits.
void tri__chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk, int64_t width,
                     int64_t stride);

#endif  // TRI_DTYPE_H
