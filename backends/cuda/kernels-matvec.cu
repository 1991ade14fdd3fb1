// kernels-matvec.cu - y = x @ W^T for a few rows of x (decode and verification of a few
// drafted tokens): memory-bound, so each row of W is read once from DRAM and dotted with all m
// rows of x in registers. Quantized blocks are dequantized on the fly; activations stay f32 (no
// 8-bit quantization of x as on the CPU, so the result is closer to exact than the CPU's).
//
// One warp per row of W, 4 warps per block. Float types: lanes take 8 consecutive elements (16-byte
// loads) when W, x and k allow, else single elements. Block types (every quantized type) where W
// is 16-byte aligned: the warp reads its row in steps of 2048 elements, each step's bytes with
// coalesced 16-byte loads (up to 7 per lane, all issued before any is used) into shared memory;
// then lane l takes elements 4 l + 128 i of the step (four neighbours of one block and group, x
// read as one float4 per row of x: the warp's x loads are coalesced too), decoding its codes and
// its group's scale and minimum from the staged bytes. Rows need not be 16-byte aligned: a step
// starts at the 16-byte boundary at or before the row's bytes (the bytes before it belong to the
// row before), and a 16-byte load that would pass the end of W is read by bytes. Elsewhere (W not
// 16-byte aligned) the former path: a lane per block of 32, read by 16-bit words (Q8_0, Q4_0,
// Q4_1) or bytes.
//
// x is not staged in shared memory: a block's 4 rows read it from L1 (it is as large as a few
// rows of W, so staging it per block would cost as much L2 traffic as W); scripts/roofline.py
// predicts the share of the bandwidth each type reaches (docs/cuda.md, "Roofline").
#include "cuda-common.cuh"
#include "kernels-quant.cuh"

#define WARPS 4
#define STEP_ELEMS 2048  // elements of a row per staged step: whole blocks of every type

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 32 consecutive f32 of x starting at xb into v (16-byte loads when aligned).
__device__ __forceinline__ void load32(float *v, const float *xb, bool xvec) {
    if (xvec) {
#pragma unroll
        for (int q = 0; q < 8; q++) {
            float4 f = ((const float4 *)xb)[q];
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int q = 0; q < 32; q++) v[q] = xb[q];
    }
}

// Unscaled block values: q (32) as floats, and the block's scale d and minimum mn.
template <int T>
__device__ __forceinline__ void load_block(const uint8_t *row, int64_t b, float *q, float *d, float *mn) {
    if (T == TRI_DTYPE_Q8_0) {
        const uint16_t *blk = (const uint16_t *)(row + b * 34);
        *d = tri_dev_f16_to_f32(blk[0]);
        *mn = 0;
#pragma unroll
        for (int t = 0; t < 16; t++) {
            uint16_t u = blk[1 + t];  // bytes 2 + 2t (low) and 3 + 2t (high), little-endian
            q[2 * t] = (float)(int8_t)(u & 0xff);
            q[2 * t + 1] = (float)(int8_t)(u >> 8);
        }
    } else {
        const int off = T == TRI_DTYPE_Q4_0 ? 1 : 2;  // in 16-bit words
        const uint16_t *blk = (const uint16_t *)(row + b * (T == TRI_DTYPE_Q4_0 ? 18 : 20));
        *d = tri_dev_f16_to_f32(blk[0]);
        *mn = T == TRI_DTYPE_Q4_1 ? tri_dev_f16_to_f32(blk[1]) : 0.0f;
        const float bias = T == TRI_DTYPE_Q4_0 ? -8.0f : 0.0f;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            uint16_t u = blk[off + t];  // qs[2t] and qs[2t + 1]
            int b0 = u & 0xff, b1 = u >> 8;
            q[2 * t] = (float)(b0 & 0x0f) + bias;
            q[2 * t + 1] = (float)(b1 & 0x0f) + bias;
            q[16 + 2 * t] = (float)(b0 >> 4) + bias;
            q[16 + 2 * t + 1] = (float)(b1 >> 4) + bias;
        }
    }
}

template <int T>
__device__ __forceinline__ float float_elem(const uint8_t *row, int64_t j) {
    if (T == TRI_DTYPE_F32) return ((const float *)row)[j];
    if (T == TRI_DTYPE_F16) return tri_dev_f16_to_f32(((const uint16_t *)row)[j]);
    return tri_dev_bf16_to_f32(((const uint16_t *)row)[j]);
}

// Elements 8u .. 8u + 7 of a float-type row (16-byte aligned) into w.
template <int T>
__device__ __forceinline__ void load8(const uint8_t *row, int64_t u, float *w) {
    if (T == TRI_DTYPE_F32) {
        float4 a = ((const float4 *)row)[2 * u], b = ((const float4 *)row)[2 * u + 1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
        uint4 r = ((const uint4 *)row)[u];
        uint32_t p[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint16_t lo = (uint16_t)(p[t] & 0xffff), hi = (uint16_t)(p[t] >> 16);
            w[2 * t] = T == TRI_DTYPE_F16 ? tri_dev_f16_to_f32(lo) : tri_dev_bf16_to_f32(lo);
            w[2 * t + 1] = T == TRI_DTYPE_F16 ? tri_dev_f16_to_f32(hi) : tri_dev_bf16_to_f32(hi);
        }
    }
}

// MT: rows of x held in registers (m <= MT); the rows past m are predicated off.
template <int T, int MT>
__global__ void __launch_bounds__(WARPS * 32)
    k_matvec(float *y, const float *x, const uint8_t *w, int64_t row_bytes, int m, int64_t n, int64_t k, bool wvec,
             bool xvec) {
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= n) return;  // the whole warp leaves together
    const uint8_t *row = w + r * row_bytes;
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.0f;

    if (T == TRI_DTYPE_Q8_0 || T == TRI_DTYPE_Q4_0 || T == TRI_DTYPE_Q4_1) {
        int64_t nb = k / 32;
        for (int64_t b = lane; b < nb; b += 32) {
            float q[32], d, mn;
            load_block<T>(row, b, q, &d, &mn);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < m) {
                    float xv[32];
                    load32(xv, x + (int64_t)i * k + b * 32, xvec);
                    float s = 0.0f, sx = 0.0f;
#pragma unroll
                    for (int t = 0; t < 32; t++) {
                        s = fmaf(q[t], xv[t], s);
                        if (T == TRI_DTYPE_Q4_1) sx += xv[t];
                    }
                    acc[i] += d * s + (T == TRI_DTYPE_Q4_1 ? mn * sx : 0.0f);
                }
            }
        }
    } else if (T >= TRI_DTYPE_Q5_0) {
        // Q5_0, Q5_1, K-quants: a lane takes a block of 32 (of a super-block of 256 for the
        // K-quants), two groups of 16 with their own dh and mh (kernels-quant.cuh)
        int64_t nb = k / 32;
        for (int64_t b = lane; b < nb; b += 32) {
            const int per = tri_dev_qk(T) / 32;  // blocks of 32 per block of the type
            const uint8_t *blk = row + (b / per) * tri_dev_qbytes(T);
            const int e0 = (int)(b % per) * 32;
            float q[32], dh[2], mh[2];
#pragma unroll
            for (int t = 0; t < 32; t++) q[t] = (float)tri_dev_q_code<T>(blk, e0 + t);
            tri_dev_q_group<T>(blk, e0 / 16, &dh[0], &mh[0]);
            tri_dev_q_group<T>(blk, e0 / 16 + 1, &dh[1], &mh[1]);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < m) {
                    float xv[32];
                    load32(xv, x + (int64_t)i * k + b * 32, xvec);
                    float a = acc[i];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float s = 0.0f, sx = 0.0f;
#pragma unroll
                        for (int t = 16 * h; t < 16 * h + 16; t++) {
                            s = fmaf(q[t], xv[t], s);
                            sx += xv[t];
                        }
                        a += dh[h] * s + mh[h] * sx;
                    }
                    acc[i] = a;
                }
            }
        }
    } else if (wvec && xvec) {  // k % 8 == 0, W rows and x 16-byte aligned
        int64_t nu = k / 8;
        for (int64_t u = lane; u < nu; u += 32) {
            float wv[8];
            load8<T>(row, u, wv);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < m) {
                    const float4 *xp = (const float4 *)(x + (int64_t)i * k) + 2 * u;
                    float4 a = xp[0], b = xp[1];
                    float s = acc[i];
                    s = fmaf(wv[0], a.x, s), s = fmaf(wv[1], a.y, s), s = fmaf(wv[2], a.z, s);
                    s = fmaf(wv[3], a.w, s), s = fmaf(wv[4], b.x, s), s = fmaf(wv[5], b.y, s);
                    s = fmaf(wv[6], b.z, s), s = fmaf(wv[7], b.w, s);
                    acc[i] = s;
                }
            }
        }
    } else {
        for (int64_t j = lane; j < k; j += 32) {
            float wv = float_elem<T>(row, j);
#pragma unroll
            for (int i = 0; i < MT; i++)
                if (i < m) acc[i] = fmaf(wv, x[(int64_t)i * k + j], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (i < m) {
            float v = warp_sum(acc[i]);
            if (lane == 0) y[(int64_t)i * n + r] = v;
        }
    }
}

// ---- block types, staged ----

// Bytes per element of a block type, as a fraction: block bytes / block elements.
template <int T>
__host__ __device__ constexpr int qk_of() {
    return T == TRI_DTYPE_Q8_0 || T == TRI_DTYPE_Q4_0 || T == TRI_DTYPE_Q4_1 ? 32 : tri_dev_qk(T);
}
template <int T>
__host__ __device__ constexpr int qbytes_of() {
    return T == TRI_DTYPE_Q8_0 ? 34 : T == TRI_DTYPE_Q4_0 ? 18 : T == TRI_DTYPE_Q4_1 ? 20 : tri_dev_qbytes(T);
}
// Bytes of a step (a multiple of 16 for every type: STEP_ELEMS / qk blocks of even size, 8 or more
// of them) and 16-byte loads per lane for it.
template <int T>
__host__ __device__ constexpr int step_bytes() {
    return STEP_ELEMS / qk_of<T>() * qbytes_of<T>();
}
template <int T>
__host__ __device__ constexpr int step_loads() {
    return (step_bytes<T>() / 16 + 1 + 31) / 32;  // + 1: the step may start up to 14 bytes early
}

// The 16 bytes at p (16-byte aligned).
__device__ __forceinline__ uint4 stream_load16(const uint8_t *p) { return *(const uint4 *)p; }

// The 16 bytes at p (16-byte aligned), by bytes where they would pass end (the end of W).
__device__ __forceinline__ uint4 stream_load(const uint8_t *p, const uint8_t *end) {
    if (p + 16 <= end) return *(const uint4 *)p;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int b = 0; b < 16; b++)  // unrolled: w stays in registers
        if (p + b < end) w[b / 4] |= (uint32_t)p[b] << (8 * (b % 4));
    return uint4{w[0], w[1], w[2], w[3]};
}

// Codes of elements e .. e + 3 of the block at blk (qk_of<T> elements, in shared memory, 2-byte
// aligned; e a multiple of 4), and the scale and minimum of their group: element j is d q[j] + mn.
template <int T>
__device__ __forceinline__ void decode4(const uint8_t *blk, int e, float *q, float *d, float *mn) {
    if (T == TRI_DTYPE_Q8_0) {
        const uint16_t *h = (const uint16_t *)blk;
        *d = tri_dev_f16_to_f32(h[0]), *mn = 0.0f;
        uint16_t a = h[1 + e / 2], b = h[2 + e / 2];  // bytes 2 + e .. 5 + e
        q[0] = (float)(int8_t)(a & 0xff), q[1] = (float)(int8_t)(a >> 8);
        q[2] = (float)(int8_t)(b & 0xff), q[3] = (float)(int8_t)(b >> 8);
    } else if (T == TRI_DTYPE_Q4_0 || T == TRI_DTYPE_Q4_1) {
        const uint16_t *h = (const uint16_t *)blk;
        const int off = T == TRI_DTYPE_Q4_0 ? 1 : 2, p = e & 15, sh = e < 16 ? 0 : 4;  // qs at word off
        *d = tri_dev_f16_to_f32(h[0]);
        *mn = T == TRI_DTYPE_Q4_1 ? tri_dev_f16_to_f32(h[1]) : 0.0f;
        const float bias = T == TRI_DTYPE_Q4_0 ? -8.0f : 0.0f;
        uint16_t a = h[off + p / 2], b = h[off + p / 2 + 1];  // qs[p .. p + 3]
        q[0] = (float)((a >> sh) & 15) + bias, q[1] = (float)((a >> (8 + sh)) & 15) + bias;
        q[2] = (float)((b >> sh) & 15) + bias, q[3] = (float)((b >> (8 + sh)) & 15) + bias;
    } else {
        tri_dev_q_group<T>(blk, e / 16, d, mn);
#pragma unroll
        for (int t = 0; t < 4; t++) q[t] = (float)tri_dev_q_code<T>(blk, e + t);
    }
}

// MT: rows of x held in registers (m <= MT). W 16-byte aligned (wend: the end of W); every warp
// of the block runs every step (a warp past n reads the last row and writes nothing), since the
// staging buffer is shared between the steps by __syncthreads. The bound's one block per SM (ptxas's
// default anyway) is written out because it changes ptxas's register allocation: without it
// <3, 1> spills on sm_80 and <11, 16> on sm_120 (scripts/check-cuda.py).
template <int T, int MT>
__global__ void __launch_bounds__(WARPS * 32, 1)
    k_matvec_staged(float *y, const float *x, const uint8_t *w, const uint8_t *wend, int64_t row_bytes, int m,
                    int64_t n, int64_t k, bool xvec) {
    __shared__ __align__(16) uint8_t stage[WARPS][step_loads<T>() * 32 * 16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * WARPS + warp, r = r0 < n ? r0 : n - 1;
    const uint8_t *row = w + r * row_bytes;
    const uint8_t *a0 = (const uint8_t *)((uintptr_t)row & ~(uintptr_t)15);  // >= w: w is aligned
    const int lead = (int)(row - a0);                                          // even: row_bytes is
    uint8_t *buf = stage[warp];
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.0f;

    for (int64_t base = 0; base < row_bytes; base += step_bytes<T>()) {
        const int64_t len = row_bytes - base < step_bytes<T>() ? row_bytes - base : step_bytes<T>();
        const int nc = (int)((lead + len + 15) / 16);  // 16-byte words of this step
        const uint8_t *a = a0 + base;
        uint4 v[step_loads<T>()];
        if (a + 16 * nc <= wend) {  // (uniform) every load of the step issued before any is used
#pragma unroll
            for (int u = 0; u < step_loads<T>(); u++)
                if (lane + 32 * u < nc) v[u] = stream_load16(a + 16 * (lane + 32 * u));
        } else {  // the last row's last step: its last 16 bytes may pass the end of W
#pragma unroll
            for (int u = 0; u < step_loads<T>(); u++)
                if (lane + 32 * u < nc) v[u] = stream_load(a + 16 * (lane + 32 * u), wend);
        }
        __syncthreads();  // the step before has been read
#pragma unroll
        for (int u = 0; u < step_loads<T>(); u++)
            if (lane + 32 * u < nc) ((uint4 *)buf)[lane + 32 * u] = v[u];
        __syncthreads();
        const int ne = (int)(len / qbytes_of<T>()) * qk_of<T>();
        const int64_t e0 = base / qbytes_of<T>() * qk_of<T>();  // the step's first element in the row
        for (int e = 4 * lane; e < ne; e += 128) {
            float q[4], d, mn;
            decode4<T>(buf + lead + (e / qk_of<T>()) * qbytes_of<T>(), e % qk_of<T>(), q, &d, &mn);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < m) {
                    const float *xp = x + (int64_t)i * k + e0 + e;
                    float4 xv = xvec ? *(const float4 *)xp : make_float4(xp[0], xp[1], xp[2], xp[3]);
                    float s = q[0] * xv.x;
                    s = fmaf(q[1], xv.y, s), s = fmaf(q[2], xv.z, s), s = fmaf(q[3], xv.w, s);
                    float sx = (xv.x + xv.y) + (xv.z + xv.w);
                    acc[i] = fmaf(d, s, fmaf(mn, sx, acc[i]));
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (i < m) {
            float v = warp_sum(acc[i]);
            if (lane == 0 && r0 < n) y[(int64_t)i * n + r0] = v;
        }
    }
}

template <int T>
static cudaError_t launch(float *y, const float *x, const void *w, int64_t row_bytes, int64_t m, int64_t n, int64_t k,
                          cudaStream_t s) {
    unsigned int grid = (unsigned int)((n + WARPS - 1) / WARPS);
    const uint8_t *wb = (const uint8_t *)w;
    bool xvec = ((uintptr_t)x % 16) == 0 && k % 8 == 0;
    bool wvec = ((uintptr_t)w % 16) == 0 && row_bytes % 16 == 0 && k % 8 == 0;
    int mi = (int)m;
    if constexpr (T >= TRI_DTYPE_Q8_0) {  // every block type, W 16-byte aligned: staged
      if ((uintptr_t)w % 16 == 0) {
        const uint8_t *wend = wb + n * row_bytes;
        if (m == 1)
            TRI_LAUNCH((k_matvec_staged<T, 1>), grid, WARPS * 32, 0, s, y, x, wb, wend, row_bytes, mi, n, k, xvec);
        else if (m <= 4)
            TRI_LAUNCH((k_matvec_staged<T, 4>), grid, WARPS * 32, 0, s, y, x, wb, wend, row_bytes, mi, n, k, xvec);
        else
            TRI_LAUNCH((k_matvec_staged<T, TRI_CUDA_MATVEC_MAX_M>), grid, WARPS * 32, 0, s, y, x, wb, wend, row_bytes,
                       mi, n, k, xvec);
        return cudaGetLastError();
      }
    }
    if (m == 1)
        TRI_LAUNCH((k_matvec<T, 1>), grid, WARPS * 32, 0, s, y, x, wb, row_bytes, mi, n, k, wvec, xvec);
    else if (m <= 4)
        TRI_LAUNCH((k_matvec<T, 4>), grid, WARPS * 32, 0, s, y, x, wb, row_bytes, mi, n, k, wvec, xvec);
    else
        TRI_LAUNCH((k_matvec<T, TRI_CUDA_MATVEC_MAX_M>), grid, WARPS * 32, 0, s, y, x, wb, row_bytes, mi, n, k, wvec, xvec);
    return cudaGetLastError();
}

cudaError_t tri__cuda_matvec(float *y, const float *x, const void *w, tri_dtype t, int64_t row_bytes, int64_t m,
                             int64_t n, int64_t k, cudaStream_t s) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    if (m > TRI_CUDA_MATVEC_MAX_M || (n + WARPS - 1) / WARPS > 0x7fffffff) return cudaErrorInvalidValue;
    switch (t) {
    case TRI_DTYPE_F32: return launch<TRI_DTYPE_F32>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_F16: return launch<TRI_DTYPE_F16>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_BF16: return launch<TRI_DTYPE_BF16>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q8_0: return launch<TRI_DTYPE_Q8_0>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q4_0: return launch<TRI_DTYPE_Q4_0>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q4_1: return launch<TRI_DTYPE_Q4_1>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q5_0: return launch<TRI_DTYPE_Q5_0>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q5_1: return launch<TRI_DTYPE_Q5_1>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q2_K: return launch<TRI_DTYPE_Q2_K>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q3_K: return launch<TRI_DTYPE_Q3_K>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q4_K: return launch<TRI_DTYPE_Q4_K>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q5_K: return launch<TRI_DTYPE_Q5_K>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_Q6_K: return launch<TRI_DTYPE_Q6_K>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_IQ4_NL: return launch<TRI_DTYPE_IQ4_NL>(y, x, w, row_bytes, m, n, k, s);
    case TRI_DTYPE_IQ4_XS: return launch<TRI_DTYPE_IQ4_XS>(y, x, w, row_bytes, m, n, k, s);
    default: return cudaErrorInvalidValue;
    }
}
