// kernels-quant.cuh - the blocks of Q5_0, Q5_1, the K-quants, IQ4_NL and IQ4_XS on the device: integer codes and
// group scales with core/dtype.c's tri__qblock_unpack semantics (element e of a block is
// dh[e / 16] * q[e] + mh[e / 16], scales computed in f32 in the same order), for get_rows and
// the f16 dequantization (kernels.cu) and the matvec (kernels-matvec.cu). Blocks are read byte
// by byte: their sizes (22, 24, 18, 84, 110, 144, 176, 210, 136) leave fields at any alignment.
#ifndef TRI_CUDA_KERNELS_QUANT_CUH
#define TRI_CUDA_KERNELS_QUANT_CUH

#include "cuda-common.cuh"

extern "C" {
#include "dtype.h"  // TRI__IQ4NL_VALUES
}

__device__ __forceinline__ uint16_t tri_dev_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
__device__ __forceinline__ float tri_dev_f16_at(const uint8_t *p) { return tri_dev_f16_to_f32(tri_dev_u16(p)); }

// Elements per block and bytes per block of the types this header handles.
__host__ __device__ constexpr int tri_dev_qk(int t) {
    return t == TRI_DTYPE_Q5_0 || t == TRI_DTYPE_Q5_1 || t == TRI_DTYPE_IQ4_NL ? 32 : 256;
}
__host__ __device__ constexpr int tri_dev_qbytes(int t) {
    return t == TRI_DTYPE_Q5_0     ? 22
         : t == TRI_DTYPE_Q5_1   ? 24
         : t == TRI_DTYPE_IQ4_NL ? 18
         : t == TRI_DTYPE_Q2_K   ? 84
         : t == TRI_DTYPE_Q3_K   ? 110
         : t == TRI_DTYPE_Q4_K   ? 144
         : t == TRI_DTYPE_Q5_K   ? 176
         : t == TRI_DTYPE_IQ4_XS ? 136
                                 : 210;  // Q6_K
}

// IQ4_NL's levels (also IQ4_XS's) as bytes of two 64-bit words, so that looking one up is a shift of a
// register rather than an indexed load from a local array (which made ptxas spill in the matvec).
__host__ __device__ constexpr uint64_t tri_dev_iq4_levels(int half) {
    const int8_t v[16] = TRI__IQ4NL_VALUES;
    uint64_t w = 0;
    for (int i = 0; i < 8; i++) w |= (uint64_t)(uint8_t)v[8 * half + i] << (8 * i);
    return w;
}
__device__ __forceinline__ int tri_dev_iq4_level(int code) {
    constexpr uint64_t lo = tri_dev_iq4_levels(0), hi = tri_dev_iq4_levels(1);
    return (int8_t)(uint8_t)((code < 8 ? lo : hi) >> (8 * (code & 7)));
}

// The signed code of element e of the block at blk (tri__qblock's q).
template <int T>
__device__ __forceinline__ int tri_dev_q_code(const uint8_t *blk, int e) {
    if (T == TRI_DTYPE_IQ4_NL) return tri_dev_iq4_level(e < 16 ? blk[2 + e] & 15 : blk[2 + e - 16] >> 4);
    if (T == TRI_DTYPE_IQ4_XS) {  // block e / 32's 16 bytes after the 8 of d and the scales
        const uint8_t *qs = blk + 8 + 16 * (e / 32);
        const int i = e % 32;
        return tri_dev_iq4_level(i < 16 ? qs[i] & 15 : qs[i - 16] >> 4);
    }
    if (T == TRI_DTYPE_Q5_0 || T == TRI_DTYPE_Q5_1) {
        const uint8_t *qh = blk + (T == TRI_DTYPE_Q5_0 ? 2 : 4), *qs = qh + 4;
        int lo = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
        int hi = (qh[e / 8] >> (e % 8)) & 1;
        return lo + hi * 16 - (T == TRI_DTYPE_Q5_0 ? 16 : 0);
    }
    const int h = e / 128, j = (e / 32) % 4, l = e % 32;
    if (T == TRI_DTYPE_Q2_K) return (blk[16 + 32 * h + l] >> (2 * j)) & 3;
    if (T == TRI_DTYPE_Q3_K) {
        int q = (blk[32 + 32 * h + l] >> (2 * j)) & 3;
        return q - (((blk[l] >> (4 * h + j)) & 1) ? 0 : 4);
    }
    if (T == TRI_DTYPE_Q4_K || T == TRI_DTYPE_Q5_K) {
        const int g = e / 32;
        const uint8_t *qs = blk + (T == TRI_DTYPE_Q4_K ? 16 : 48);
        int q = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
        if (T == TRI_DTYPE_Q5_K) q += ((blk[16 + l] >> g) & 1) * 16;
        return q;
    }
    // Q6_K
    int lo = (blk[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 15;
    int hi = (blk[128 + 32 * h + l] >> (2 * j)) & 3;
    return (lo | hi << 4) - 32;
}

// dh and mh of group g (elements 16 g .. 16 g + 15) of the block at blk.
template <int T>
__device__ __forceinline__ void tri_dev_q_group(const uint8_t *blk, int g, float *dh, float *mh) {
    *mh = 0.0f;
    if (T == TRI_DTYPE_Q5_0 || T == TRI_DTYPE_IQ4_NL) {
        *dh = tri_dev_f16_at(blk);
    } else if (T == TRI_DTYPE_Q5_1) {
        *dh = tri_dev_f16_at(blk), *mh = tri_dev_f16_at(blk + 2);
    } else if (T == TRI_DTYPE_Q2_K) {
        *dh = __fmul_rn(tri_dev_f16_at(blk + 80), (float)(blk[g] & 15));
        *mh = -__fmul_rn(tri_dev_f16_at(blk + 82), (float)(blk[g] >> 4));
    } else if (T == TRI_DTYPE_Q3_K) {
        const uint8_t *s = blk + 96;
        int lo = (s[g % 8] >> (4 * (g / 8))) & 15, hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        *dh = __fmul_rn(tri_dev_f16_at(blk + 108), (float)((lo | hi << 4) - 32));
    } else if (T == TRI_DTYPE_IQ4_XS) {
        const int j = g / 2;  // block of 32 (tri__iq4xs_scale)
        int lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 15, hi = (tri_dev_u16(blk + 2) >> (2 * j)) & 3;
        *dh = __fmul_rn(tri_dev_f16_at(blk), (float)((lo | hi << 4) - 32));
    } else if (T == TRI_DTYPE_Q4_K || T == TRI_DTYPE_Q5_K) {
        const uint8_t *s = blk + 4;
        const int q = g / 2;  // group of 32
        int sc, mn;
        if (q < 4) {
            sc = s[q] & 63, mn = s[q + 4] & 63;
        } else {
            sc = (s[q + 4] & 15) | ((s[q - 4] >> 6) << 4);
            mn = (s[q + 4] >> 4) | ((s[q] >> 6) << 4);
        }
        *dh = __fmul_rn(tri_dev_f16_at(blk), (float)sc);
        *mh = -__fmul_rn(tri_dev_f16_at(blk + 2), (float)mn);
    } else {  // Q6_K
        *dh = __fmul_rn(tri_dev_f16_at(blk + 208), (float)(int8_t)blk[192 + g]);
    }
}

// Element j of a row of type T, as core/dtype.c's tri__dequantize_row computes it (never fused).
template <int T>
__device__ __forceinline__ float tri_dev_q_elem(const uint8_t *row, int64_t j) {
    const uint8_t *blk = row + (j / tri_dev_qk(T)) * tri_dev_qbytes(T);
    const int e = (int)(j % tri_dev_qk(T));
    float dh, mh;
    tri_dev_q_group<T>(blk, e / 16, &dh, &mh);
    return __fadd_rn(__fmul_rn(dh, (float)tri_dev_q_code<T>(blk, e)), mh);
}

#endif  // TRI_CUDA_KERNELS_QUANT_CUH
