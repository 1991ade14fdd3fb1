// kernels.cu - elementwise, normalisation and sampling kernels of the CUDA backend, each the
// counterpart of a function in backends/cpu/cpu-backend.c with the same arithmetic where it matters
// (double sums in rmsnorm and softmax, float32 rope angles, dtype.c's rounding).
#include <math.h>

#include "cuda-common.cuh"
#include "kernels-quant.cuh"

#define THREADS 256

static unsigned int grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    return (unsigned int)(b > TRI_CUDA_MAX_BLOCKS ? TRI_CUDA_MAX_BLOCKS : b);
}

// Element j of a row of type t (the row's first byte at row; 2-byte alignment suffices for every
// type but F32, which needs 4; the types of kernels-quant.cuh are read byte by byte).
__device__ __forceinline__ float row_elem(const uint8_t *row, tri_dtype t, int64_t j) {
    switch (t) {
    case TRI_DTYPE_F32: return ((const float *)row)[j];
    case TRI_DTYPE_F16: return tri_dev_f16_to_f32(((const uint16_t *)row)[j]);
    case TRI_DTYPE_BF16: return tri_dev_bf16_to_f32(((const uint16_t *)row)[j]);
    case TRI_DTYPE_Q8_0: {
        const uint8_t *blk = row + (j / 32) * 34;
        float d = tri_dev_f16_to_f32(*(const uint16_t *)blk);
        return d * (float)(int8_t)blk[2 + j % 32];
    }
    case TRI_DTYPE_Q4_0: {
        const uint8_t *blk = row + (j / 32) * 18;
        float d = tri_dev_f16_to_f32(*(const uint16_t *)blk);
        int e = (int)(j % 32), q = e < 16 ? blk[2 + e] & 0x0f : blk[2 + e - 16] >> 4;
        return d * (float)(q - 8);
    }
    case TRI_DTYPE_Q4_1: {
        const uint8_t *blk = row + (j / 32) * 20;
        float d = tri_dev_f16_to_f32(*(const uint16_t *)blk), mn = tri_dev_f16_to_f32(*(const uint16_t *)(blk + 2));
        int e = (int)(j % 32), q = e < 16 ? blk[4 + e] & 0x0f : blk[4 + e - 16] >> 4;
        return __fadd_rn(__fmul_rn(d, (float)q), mn);  // never fused: bit-identical to the CPU
    }
    case TRI_DTYPE_Q5_0: return tri_dev_q_elem<TRI_DTYPE_Q5_0>(row, j);
    case TRI_DTYPE_Q5_1: return tri_dev_q_elem<TRI_DTYPE_Q5_1>(row, j);
    case TRI_DTYPE_Q2_K: return tri_dev_q_elem<TRI_DTYPE_Q2_K>(row, j);
    case TRI_DTYPE_Q3_K: return tri_dev_q_elem<TRI_DTYPE_Q3_K>(row, j);
    case TRI_DTYPE_Q4_K: return tri_dev_q_elem<TRI_DTYPE_Q4_K>(row, j);
    case TRI_DTYPE_Q5_K: return tri_dev_q_elem<TRI_DTYPE_Q5_K>(row, j);
    case TRI_DTYPE_Q6_K: return tri_dev_q_elem<TRI_DTYPE_Q6_K>(row, j);
    case TRI_DTYPE_IQ4_NL: return tri_dev_q_elem<TRI_DTYPE_IQ4_NL>(row, j);
    case TRI_DTYPE_IQ4_XS: return tri_dev_q_elem<TRI_DTYPE_IQ4_XS>(row, j);
    default: return 0.0f;
    }
}

// ---- conversions ----

__global__ void __launch_bounds__(THREADS) k_convert(uint16_t *dst, bool bf16, const float *src, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = bf16 ? tri_dev_f32_to_bf16(src[i]) : tri_dev_f32_to_f16(src[i]);
}

// ---- quantizing (a Q8_0 / Q4_0 KV cache's new rows) ----
//
// One warp per block of 32 values, lane e holding value e: the block's scale comes from a warp
// reduction, every step as tri__quantize_row (core/dtype.c) takes it, so the blocks are its bits
// (NaN and infinities included). Q8_0: amax = max |x| (NaN ignored, from 0), d = amax / 127,
// q = clamp(roundf(x (1 / d)), -127, 127). Q4_0: m = the value of largest magnitude, the first of
// ties (NaN skipped, unless x[0] is NaN, which then wins: the CPU's loop starts from x[0] and a
// comparison with NaN is false), d = m / -8, q = trunc(clamp(x (1 / d) + 8.5, 0, 15)), with the
// product and the sum rounded separately. Divisions in IEEE f32 (__fdiv_rn), d stored as f16.
template <int T>
__device__ __forceinline__ void quantize_block(uint8_t *blk, const float *x, int lane) {
    const float v = x[lane];
    float d;
    if (T == TRI_DTYPE_Q8_0) {
        float a = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        d = __fdiv_rn(fmaxf(0.0f, a), 127.0f);  // fmaxf ignores NaN: all NaN gives 0, as the CPU's
    } else {
        float a = v != v ? -1.0f : fabsf(v);  // NaN never wins over a number
        int at = lane;
        for (int o = 16; o > 0; o >>= 1) {
            float oa = __shfl_xor_sync(0xffffffffu, a, o);
            int oat = __shfl_xor_sync(0xffffffffu, at, o);
            if (oa > a || (oa == a && oat < at)) a = oa, at = oat;
        }
        float mx = __shfl_sync(0xffffffffu, v, at), x0 = __shfl_sync(0xffffffffu, v, 0);
        if (x0 != x0) mx = x0;
        d = __fdiv_rn(mx, -8.0f);
    }
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    if (lane == 0) *(uint16_t *)blk = tri_dev_f32_to_f16(d);  // blocks are 2-byte aligned
    if (T == TRI_DTYPE_Q8_0) {
        blk[2 + lane] = (uint8_t)(int8_t)fmaxf(-127.0f, fminf(127.0f, roundf(__fmul_rn(v, id))));
    } else {
        int q = (int)fmaxf(0.0f, fminf(15.0f, __fadd_rn(__fmul_rn(v, id), 8.5f)));
        int hi = __shfl_sync(0xffffffffu, q, (lane + 16) & 31);
        if (lane < 16) blk[2 + lane] = (uint8_t)(q | hi << 4);
    }
}

// Blocks b < nb of src (nb * 32 f32, rows of bpr blocks): block j of row i goes to block j of row
// rows[i] of dst (rows device, set_rows) or, rows NULL, to block b of dst (convert).
template <int T>
__global__ void __launch_bounds__(THREADS)
    k_quantize(uint8_t *dst, const float *src, const int32_t *rows, int64_t nb, int64_t bpr) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    const int64_t bb = T == TRI_DTYPE_Q8_0 ? 34 : 18;
    for (int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; b < nb; b += warps) {  // uniform per warp
        int64_t at = rows ? (int64_t)rows[b / bpr] * bpr + b % bpr : b;
        quantize_block<T>(dst + at * bb, src + b * 32, lane);
    }
}

static cudaError_t quantize(void *dst, tri_dtype t, const float *src, const int32_t *rows, int64_t nb, int64_t bpr,
                            cudaStream_t s) {
    if (nb <= 0) return cudaSuccess;
    unsigned int grid = grid_for(nb * 32);
    if (t == TRI_DTYPE_Q8_0)
        TRI_LAUNCH((k_quantize<TRI_DTYPE_Q8_0>), grid, THREADS, 0, s, (uint8_t *)dst, src, rows, nb, bpr);
    else
        TRI_LAUNCH((k_quantize<TRI_DTYPE_Q4_0>), grid, THREADS, 0, s, (uint8_t *)dst, src, rows, nb, bpr);
    return cudaGetLastError();
}

cudaError_t tri__cuda_convert(void *dst, tri_dtype dst_type, const float *src, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (dst_type == TRI_DTYPE_Q8_0 || dst_type == TRI_DTYPE_Q4_0)
        return quantize(dst, dst_type, src, NULL, n / 32, 1, s);
    TRI_LAUNCH((k_convert), grid_for(n), THREADS, 0, s, (uint16_t *)dst, dst_type == TRI_DTYPE_BF16, src, n);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_get_rows(float *out, const uint8_t *table, tri_dtype t, int64_t row_bytes, int64_t n,
                           const int32_t *ids, int64_t m) {
    int64_t total = m * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / n, j = e % n;
        out[e] = row_elem(table + (int64_t)ids[i] * row_bytes, t, j);
    }
}

cudaError_t tri__cuda_get_rows(float *out, const void *table, tri_dtype t, int64_t row_bytes, int64_t n,
                               const int32_t *ids, int64_t m, cudaStream_t s) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_get_rows), grid_for(m * n), THREADS, 0, s, out, (const uint8_t *)table, t, row_bytes, n, ids, m);
    return cudaGetLastError();
}

// ---- steps driven from device memory (backend.h: set_rows, window_rows) ----

__global__ void __launch_bounds__(THREADS) k_set_rows(uint8_t *dst, tri_dtype t, const float *src, const int32_t *rows,
                                                      int64_t m, int64_t n) {
    const size_t es = t == TRI_DTYPE_F32 ? 4 : 2;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < m * n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / n, j = e % n;
        uint8_t *row = dst + (size_t)rows[i] * (size_t)n * es;
        if (t == TRI_DTYPE_F32) ((float *)row)[j] = src[e];
        else if (t == TRI_DTYPE_BF16) ((uint16_t *)row)[j] = tri_dev_f32_to_bf16(src[e]);
        else ((uint16_t *)row)[j] = tri_dev_f32_to_f16(src[e]);
    }
}

cudaError_t tri__cuda_set_rows(void *dst, tri_dtype t, const float *src, const int32_t *rows, int64_t m, int64_t n,
                               cudaStream_t s) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    if (t == TRI_DTYPE_Q8_0 || t == TRI_DTYPE_Q4_0) return quantize(dst, t, src, rows, m * (n / 32), n / 32, s);
    TRI_LAUNCH((k_set_rows), grid_for(m * n), THREADS, 0, s, (uint8_t *)dst, t, src, rows, m, n);
    return cudaGetLastError();
}

// One thread per view row; every thread derives the step's numbers from state[1] itself, and
// thread 0 writes them back.
__global__ void __launch_bounds__(THREADS) k_window_rows(int32_t *state, int32_t *rows, int32_t view_rows,
                                                         tri__stream_window w) {
    const int32_t n0 = state[1], kept = tri__window_kept(&w, n0), own = tri__window_row(&w, n0);
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < view_rows; i += gridDim.x * blockDim.x)
        rows[i] = i < kept ? tri__window_row(&w, tri__window_pos(&w, n0, i)) : own;
    if (blockIdx.x == 0 && threadIdx.x == 0) state[2] = kept, state[3] = own;
}

cudaError_t tri__cuda_window_rows(int32_t *state, int32_t *rows, int32_t view_rows, const tri__stream_window *w,
                                  cudaStream_t s) {
    if (view_rows <= 0) return cudaSuccess;
    TRI_LAUNCH((k_window_rows), grid_for(view_rows), THREADS, 0, s, state, rows, view_rows, *w);
    return cudaGetLastError();
}

// Element i of rows of kind K (TRI_CUDA_KV_*): f32, f16, or a quantized cache's blocks of 32
// (element i in block i / 32: d q or d (q - 8), the value tri__dequantize_row gives, exact in f32).
template <int K>
__device__ __forceinline__ float chunk_elem(const void *x, int64_t i) {
    if (K == TRI_CUDA_KV_F32) return ((const float *)x)[i];
    if (K == TRI_CUDA_KV_F16) return tri_dev_f16_to_f32(((const uint16_t *)x)[i]);
    const int e = (int)(i & 31);
    const uint8_t *blk = (const uint8_t *)x + (i >> 5) * (K == TRI_CUDA_KV_Q8_0 ? 34 : 18);
    const float d = tri_dev_f16_to_f32(*(const uint16_t *)blk);  // blocks are 2-byte aligned
    if (K == TRI_CUDA_KV_Q8_0) return d * (float)(int8_t)blk[2 + e];
    const int q = e < 16 ? blk[2 + e] & 15 : blk[2 + e - 16] >> 4;
    return d * (float)(q - 8);
}

// One thread per output value: consecutive threads read consecutive elements of a row; the sum runs
// over the chunk's rows in order, in double, as cpu_chunk_mean does.
template <int K>
__global__ void __launch_bounds__(THREADS) k_chunk_mean(float *out, const void *x, int64_t n_chunks, int64_t chunk,
                                                        int64_t width, int64_t stride) {
    int64_t total = n_chunks * width;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = e / width, j = e % width;
        double acc = 0;
        for (int64_t r = 0; r < chunk; r++) acc += (double)chunk_elem<K>(x, (c * chunk + r) * stride + j);
        out[e] = (float)(acc / (double)chunk);
    }
}

cudaError_t tri__cuda_chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk,
                                 int64_t width, int64_t stride, cudaStream_t s) {
    if (n_chunks <= 0 || width <= 0) return cudaSuccess;
    const unsigned int grid = grid_for(n_chunks * width);
    switch (tri__cuda_kv_kind(type)) {
    case TRI_CUDA_KV_F32:
        TRI_LAUNCH((k_chunk_mean<TRI_CUDA_KV_F32>), grid, THREADS, 0, s, out, x, n_chunks, chunk, width, stride);
        break;
    case TRI_CUDA_KV_F16:
        TRI_LAUNCH((k_chunk_mean<TRI_CUDA_KV_F16>), grid, THREADS, 0, s, out, x, n_chunks, chunk, width, stride);
        break;
    case TRI_CUDA_KV_Q8_0:
        TRI_LAUNCH((k_chunk_mean<TRI_CUDA_KV_Q8_0>), grid, THREADS, 0, s, out, x, n_chunks, chunk, width, stride);
        break;
    case TRI_CUDA_KV_Q4_0:
        TRI_LAUNCH((k_chunk_mean<TRI_CUDA_KV_Q4_0>), grid, THREADS, 0, s, out, x, n_chunks, chunk, width, stride);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// One thread per 4-byte word (or byte) of the output: consecutive threads read consecutive words
// of a row, so each row is one coalesced read.
template <typename T>
__global__ void __launch_bounds__(THREADS) k_gather(T *dst, const uint8_t *src, const int64_t *offsets, int64_t n, int64_t row_elems) {
    int64_t total = n * row_elems;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / row_elems, j = e % row_elems;
        dst[e] = ((const T *)(src + offsets[i]))[j];
    }
}

cudaError_t tri__cuda_gather(void *dst, const void *src, const int64_t *offsets, int64_t n, int64_t row_bytes,
                             bool words, cudaStream_t s) {
    if (n <= 0 || row_bytes <= 0) return cudaSuccess;
    if (words) {
        int64_t elems = row_bytes / 4;
        TRI_LAUNCH((k_gather<uint32_t>), grid_for(n * elems), THREADS, 0, s, (uint32_t *)dst, (const uint8_t *)src, offsets, n,
                                                                   elems);
    } else {
        TRI_LAUNCH((k_gather<uint8_t>), grid_for(n * row_bytes), THREADS, 0, s, (uint8_t *)dst, (const uint8_t *)src, offsets,
                                                                      n, row_bytes);
    }
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_dequant_f16(uint16_t *out, const uint8_t *w, tri_dtype t, int64_t row_bytes, int64_t rows,
                              int64_t k) {
    int64_t total = rows * k;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x)
        out[e] = tri_dev_f32_to_f16(row_elem(w + (e / k) * row_bytes, t, e % k));
}

cudaError_t tri__cuda_dequant_f16(uint16_t *out, const void *w, tri_dtype t, int64_t row_bytes, int64_t rows,
                                  int64_t k, cudaStream_t s) {
    if (rows <= 0 || k <= 0) return cudaSuccess;
    TRI_LAUNCH((k_dequant_f16), grid_for(rows * k), THREADS, 0, s, out, (const uint8_t *)w, t, row_bytes, rows, k);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_split_half(uint16_t *hi, uint16_t *lo, bool bf16, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        if (bf16) {
            uint16_t h = tri_dev_f32_to_bf16(v);
            hi[i] = h;
            lo[i] = tri_dev_f32_to_bf16(v - tri_dev_bf16_to_f32(h));  // exact difference in f32
        } else {
            uint16_t h = tri_dev_f32_to_f16(v);
            float hv = tri_dev_f16_to_f32(h);
            hi[i] = h;
            lo[i] = isinf(hv) ? (uint16_t)0 : tri_dev_f32_to_f16(v - hv);
        }
    }
}

cudaError_t tri__cuda_split_half(uint16_t *hi, uint16_t *lo, tri_dtype t, const float *x, int64_t n,
                                 cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_split_half), grid_for(n), THREADS, 0, s, hi, lo, t == TRI_DTYPE_BF16, x, n);
    return cudaGetLastError();
}

// ---- block reductions (blockDim.x == THREADS) ----

__device__ double block_sum_d(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();  // sh may be reused right after
    return r;
}

__device__ float block_max_f(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + o]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

// ---- rmsnorm: one block per row ----

__global__ void __launch_bounds__(THREADS) k_rmsnorm(float *y, const float *x, const void *w, tri_dtype wt, int64_t m, int64_t n, float eps) {
    __shared__ double sh[THREADS];
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const float *xr = x + i * n;
        float *yr = y + i * n;
        double ss = 0;
        for (int64_t j = threadIdx.x; j < n; j += THREADS) ss += (double)xr[j] * (double)xr[j];
        ss = block_sum_d(ss, sh);  // every read of xr happens before this returns
        float sc = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t j = threadIdx.x; j < n; j += THREADS) {
            float wj = wt == TRI_DTYPE_F32   ? ((const float *)w)[j]
                       : wt == TRI_DTYPE_F16 ? tri_dev_f16_to_f32(((const uint16_t *)w)[j])
                                             : tri_dev_bf16_to_f32(((const uint16_t *)w)[j]);
            yr[j] = xr[j] * sc * wj;
        }
    }
}

cudaError_t tri__cuda_rmsnorm(float *y, const float *x, const void *w, tri_dtype wt, int64_t m, int64_t n, float eps,
                              cudaStream_t s) {
    if (m <= 0) return cudaSuccess;
    unsigned int g = (unsigned int)(m > TRI_CUDA_MAX_BLOCKS ? TRI_CUDA_MAX_BLOCKS : m);
    TRI_LAUNCH((k_rmsnorm), g, THREADS, 0, s, y, x, w, wt, m, n, eps);
    return cudaGetLastError();
}

// ---- rope: one thread per (row, head, pair) ----

__global__ void __launch_bounds__(THREADS) k_rope(float *x, int64_t m, int64_t nh, int64_t hd, bool adjacent, const int32_t *pos,
                       const float *inv_freq, float attn_factor) {
    int64_t half = hd / 2, total = m * nh * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t p = e % half, ih = e / half;  // ih = i * nh + h
        int64_t i = ih / nh;
        float angle = __fmul_rn((float)pos[i], inv_freq[p]);  // float32 product, as HF and the CPU
        float sn, cs;
        sincosf(angle, &sn, &cs);
        float c = cs * attn_factor, sv = sn * attn_factor;
        float *xh = x + ih * hd;
        int64_t a = adjacent ? 2 * p : p, b = adjacent ? 2 * p + 1 : p + half;
        float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * c - x1 * sv;
        xh[b] = x0 * sv + x1 * c;
    }
}

cudaError_t tri__cuda_rope(float *x, int64_t m, int64_t n_heads, int64_t head_dim, bool adjacent, const int32_t *pos,
                           const float *inv_freq, float attn_factor, cudaStream_t s) {
    int64_t total = m * n_heads * (head_dim / 2);
    if (total <= 0) return cudaSuccess;
    TRI_LAUNCH((k_rope), grid_for(total), THREADS, 0, s, x, m, n_heads, head_dim, adjacent, pos, inv_freq, attn_factor);
    return cudaGetLastError();
}

// ---- swiglu, add ----

__global__ void __launch_bounds__(THREADS) k_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

cudaError_t tri__cuda_swiglu(float *out, const float *gate, const float *up, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_swiglu), grid_for(n), THREADS, 0, s, out, gate, up, n);
    return cudaGetLastError();
}

// bytes from src to dst, 16 at a time where both are 16-aligned; src may be mapped pinned host
// memory, which the threads read over the bus, so that the copy needs no copy engine.
__global__ void __launch_bounds__(THREADS) k_copy_bytes(unsigned char *dst, const unsigned char *src, int64_t n16,
                                                       int64_t tail) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16 + tail;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (i < n16) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
        else dst[n16 * 16 + (i - n16)] = src[n16 * 16 + (i - n16)];
    }
}

cudaError_t tri__cuda_copy_bytes(void *dst, const void *src, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    bool wide = ((uintptr_t)dst % 16 == 0) && ((uintptr_t)src % 16 == 0);
    int64_t n16 = wide ? (int64_t)(bytes / 16) : 0, tail = (int64_t)bytes - 16 * n16;
    TRI_LAUNCH((k_copy_bytes), grid_for(n16 + tail), THREADS, 0, s, (unsigned char *)dst, (const unsigned char *)src,
               n16, tail);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_add(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

cudaError_t tri__cuda_add(float *out, const float *a, const float *b, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_add), grid_for(n), THREADS, 0, s, out, a, b, n);
    return cudaGetLastError();
}

// ---- what some families need: GeGLU, scale, row biases ----

__global__ void __launch_bounds__(THREADS) k_geglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

cudaError_t tri__cuda_geglu(float *out, const float *gate, const float *up, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_geglu), grid_for(n), THREADS, 0, s, out, gate, up, n);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_scale(float *x, int64_t n, float f) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= f;
}

cudaError_t tri__cuda_scale(float *x, int64_t n, float f, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_scale), grid_for(n), THREADS, 0, s, x, n, f);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(THREADS) k_add_rows(float *x, const float *b, int64_t m, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m * n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += b[i % n];
}

cudaError_t tri__cuda_add_rows(float *x, const float *b, int64_t m, int64_t n, cudaStream_t s) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    TRI_LAUNCH((k_add_rows), grid_for(m * n), THREADS, 0, s, x, b, m, n);
    return cudaGetLastError();
}

// ---- softmax: one block per row ----

__global__ void __launch_bounds__(THREADS) k_softmax(float *x, int64_t m, int64_t n, float it, int *err_flag) {
    __shared__ double shd[THREADS];
    __shared__ float shf[THREADS];
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        float *r = x + i * n;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += THREADS) mx = fmaxf(mx, r[j] * it);
        mx = block_max_f(mx, shf);
        if (mx == -INFINITY) {  // uniform across the block
            if (threadIdx.x == 0) *err_flag = 1;  // device memory, read back at synchronize: every writer writes 1
            continue;
        }
        double sum = 0;
        for (int64_t j = threadIdx.x; j < n; j += THREADS) {
            float e = expf(__fsub_rn(__fmul_rn(r[j], it), mx));  // rounded as the CPU does, never fused
            r[j] = e;
            sum += (double)e;
        }
        sum = block_sum_d(sum, shd);
        float inv = (float)(1.0 / sum);
        for (int64_t j = threadIdx.x; j < n; j += THREADS) r[j] *= inv;  // the thread that wrote r[j]
    }
}

cudaError_t tri__cuda_softmax(float *x, int64_t m, int64_t n, float temperature, int *err_flag, cudaStream_t s) {
    if (m <= 0) return cudaSuccess;
    unsigned int g = (unsigned int)(m > TRI_CUDA_MAX_BLOCKS ? TRI_CUDA_MAX_BLOCKS : m);
    TRI_LAUNCH((k_softmax), g, THREADS, 0, s, x, m, n, 1.0f / temperature, err_flag);
    return cudaGetLastError();
}

// ---- top-k: one block per row ----
//
// key = (order-preserving value bits) << 32 | (0xffffffff - column): distinct per column, larger
// for a larger value and, among equal values, for the lower column; NaN maps to the lowest value
// bits and the padding to 0, below every real key. -0 is made +0 so that it ties with +0, as the
// CPU's comparison does. The k largest keys in descending order are the CPU's top-k exactly.
//
// Rows padded to at most 4096 keys are sorted whole in shared memory (a bitonic network). Longer
// rows (a 128K vocabulary) first select their k largest keys with a radix select (a 256-bin
// histogram of the keys' next byte in shared memory, at most 8 passes over the row, each reading it
// once and stopping as soon as the bin holding the k-th key is taken whole), then sort only those:
// in shared memory when k fits (a sampler's top-k), else in global scratch (top-p's whole rows).

#define TOPK_THREADS 1024
#define TOPK_SMEM_KEYS TRI_CUDA_TOPK_SMEM_KEYS  // keys sorted in shared memory at most

__device__ __forceinline__ uint64_t topk_key(float v, int64_t j) {
    uint32_t u;
    if (isnan(v)) {
        u = 0;
    } else {
        if (v == 0.0f) v = 0.0f;
        uint32_t b = __float_as_uint(v);
        u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    }
    return (uint64_t)u << 32 | (uint64_t)(0xffffffffu - (uint32_t)j);
}

// K (np2 keys, a power of two) sorted in descending order by the block; ends with a barrier.
__device__ void topk_bitonic_desc(uint64_t *K, int64_t np2) {
    for (int64_t size = 2; size <= np2; size <<= 1)
        for (int64_t stride = size / 2; stride > 0; stride >>= 1) {
            for (int64_t t = threadIdx.x; t < np2 / 2; t += blockDim.x) {
                int64_t a = (t / stride) * stride * 2 + t % stride, b = a + stride;
                bool desc = (a & size) == 0;  // the last merge (size == np2) is descending
                uint64_t ka = K[a], kb = K[b];
                if (desc ? ka < kb : ka > kb) {
                    K[a] = kb;
                    K[b] = ka;
                }
            }
            __syncthreads();  // also orders the global-memory keys within the block
        }
}

// Rows of n <= TOPK_SMEM_KEYS (np2 padded): the whole row sorted in shared memory.
__global__ void __launch_bounds__(TOPK_THREADS) k_top_k(float *values, int32_t *indices, const float *x, int64_t m,
                                                        int64_t n, int64_t k, int64_t np2) {
    TRI_DYN_SMEM(uint64_t, K);
    for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
        const float *xr = x + row * n;
        for (int64_t j = threadIdx.x; j < np2; j += blockDim.x) K[j] = j < n ? topk_key(xr[j], j) : 0;
        __syncthreads();
        topk_bitonic_desc(K, np2);
        for (int64_t r = threadIdx.x; r < k; r += blockDim.x) {
            int64_t j = (int64_t)(0xffffffffu - (uint32_t)(K[r] & 0xffffffffu));
            values[row * k + r] = xr[j];
            indices[row * k + r] = (int32_t)j;
        }
        __syncthreads();  // K is overwritten by the next row
    }
}

// Long rows: radix select of the k largest keys, then a sort of those kp2 (k padded to a power of
// two) keys, in shared memory when kp2 <= TOPK_SMEM_KEYS, else in keys (rows, kp2) of scratch.
__global__ void __launch_bounds__(TOPK_THREADS) k_top_k_select(float *values, int32_t *indices, const float *x,
                                                               int64_t m, int64_t n, int64_t k, uint64_t *keys,
                                                               int64_t kp2) {
    TRI_DYN_SMEM(uint64_t, sk);
    __shared__ uint32_t hist[256];
    __shared__ uint64_t prefix_s, mask_s;
    __shared__ uint32_t need_s, count_s;
    __shared__ int done_s;
    for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
        const float *xr = x + row * n;
        uint64_t *K = kp2 <= TOPK_SMEM_KEYS ? sk : keys + row * kp2;
        if (threadIdx.x == 0) prefix_s = 0, mask_s = 0, need_s = (uint32_t)k, done_s = 0, count_s = 0;
        __syncthreads();
        // threshold: the keys with prefix under mask, then every key above them, are the k largest
        for (int shift = 56; shift >= 0 && !done_s; shift -= 8) {
            const uint64_t prefix = prefix_s, mask = mask_s;
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                uint64_t key = topk_key(xr[j], j);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {  // the bin that holds the need-th largest key of the prefix
                uint32_t need = need_s, above = 0;
                int d = 255;
                for (; d > 0 && above + hist[d] < need; d--) above += hist[d];
                need -= above;
                prefix_s = prefix | (uint64_t)d << shift;
                mask_s = mask | (uint64_t)255 << shift;
                need_s = need;
                if (hist[d] == need) done_s = 1;  // the bin is taken whole
            }
            __syncthreads();
        }
        // the k keys at or above the threshold (the prefix with its lower bytes 0), in any order
        const uint64_t lo = prefix_s;
        for (int64_t j = threadIdx.x; j < kp2; j += blockDim.x)
            if (j >= k) K[j] = 0;  // padding, below every key
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            uint64_t key = topk_key(xr[j], j);
            if (key >= lo) K[atomicAdd(&count_s, 1u)] = key;
        }
        __syncthreads();
        topk_bitonic_desc(K, kp2);
        for (int64_t r = threadIdx.x; r < k; r += blockDim.x) {
            int64_t j = (int64_t)(0xffffffffu - (uint32_t)(K[r] & 0xffffffffu));
            values[row * k + r] = xr[j];
            indices[row * k + r] = (int32_t)j;
        }
        __syncthreads();  // K and the shared state are reset by the next row
    }
}

cudaError_t tri__cuda_top_k(float *values, int32_t *indices, const float *x, int64_t m, int64_t n, int64_t k,
                            uint64_t *keys, cudaStream_t s) {
    if (m <= 0) return cudaSuccess;
    unsigned int g = (unsigned int)(m > TRI_CUDA_MAX_BLOCKS ? TRI_CUDA_MAX_BLOCKS : m);
    int64_t np2 = tri__cuda_top_k_pow2(n), kp2 = tri__cuda_top_k_pow2(k);
    if (np2 <= TOPK_SMEM_KEYS) {
        TRI_LAUNCH((k_top_k), g, TOPK_THREADS, (size_t)np2 * sizeof(uint64_t), s, values, indices, x, m, n, k, np2);
    } else {
        size_t smem = kp2 <= TOPK_SMEM_KEYS ? (size_t)kp2 * sizeof(uint64_t) : 0;
        TRI_LAUNCH((k_top_k_select), g, TOPK_THREADS, smem, s, values, indices, x, m, n, k, keys, kp2);
    }
    return cudaGetLastError();
}
