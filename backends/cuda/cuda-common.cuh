// cuda-common.cuh - shared by the .cu files of backends/cuda/ only: error checks, half-precision
// conversions that match core/dtype.c bit for bit, and the kernel launchers.
//
// The launchers are plain functions (llm.c's "kernel launchers"): device pointers and sizes in,
// the stream last, a cudaError_t out (the launch error; execution errors surface at the next
// synchronizing call). Every size they take has been validated by the caller in cuda-backend.cu.
#ifndef TRI_CUDA_COMMON_CUH
#define TRI_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
#include "stream-window.h"
#include "triforce.h"
}
#include "fault.h"  // extern "C" itself

// ---- allocations, through the fault-injection countdown (core/fault.h) ----
// Device and pinned host allocations ask the countdown first, so that a fault sweep
// (tests/test-faults.c) fails each as the driver does when memory runs out. Unarmed: one load.

static inline cudaError_t tri__cuda_malloc(void **ptr, size_t bytes) {
    if (tri__fault_hit(TRI__FAULT_DEVICE)) return cudaErrorMemoryAllocation;
    return cudaMalloc(ptr, bytes);
}

static inline cudaError_t tri__cuda_host_alloc(void **ptr, size_t bytes, unsigned int flags) {
    if (tri__fault_hit(TRI__FAULT_DEVICE)) return cudaErrorMemoryAllocation;
    return cudaHostAlloc(ptr, bytes, flags);
}

static inline cudaError_t tri__cuda_host_register(void *ptr, size_t bytes, unsigned int flags) {
    if (tri__fault_hit(TRI__FAULT_DEVICE)) return cudaErrorMemoryAllocation;
    return cudaHostRegister(ptr, bytes, flags);
}

// ---- kernel launches ----
//
// Every launch is written TRI_LAUNCH((kernel), grid, block, smem, stream, args...) and every
// dynamic shared array TRI_DYN_SMEM(type, name), so that the same sources build for a GPU with
// nvcc and for the CPU emulator of tests/cudaemu with a C++ compiler (TRI_CUDA_EMULATED, meson's
// -Dcudaemu=true), which runs each thread of a block as a fiber. The kernel is in parentheses
// because a template's arguments may hold commas.
#define TRI_UNPAREN(...) __VA_ARGS__
#ifdef TRI_CUDA_EMULATED
#define TRI_LAUNCH(kernel, grid, block, smem, stream, ...)                                            \
    ::cudaemu::launch(#kernel, __FILE__, __LINE__, dim3(grid), dim3(block), (smem), (stream),          \
                      TRI_UNPAREN kernel, __VA_ARGS__)
#define TRI_DYN_SMEM(type, name) type *name = (type *)::cudaemu::dyn_smem()
#else
#define TRI_LAUNCH(kernel, grid, block, smem, stream, ...) \
    TRI_UNPAREN kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define TRI_DYN_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

// ---- checks: every CUDA and cuBLAS call, with its call site ----

static inline tri_status tri__cuda_status(cudaError_t err, const char *file, int line, const char *expr) {
    if (err == cudaSuccess) return TRI_STATUS_OK;
    tri_status st = err == cudaErrorMemoryAllocation ? TRI_STATUS_DEVICE_OUT_OF_MEMORY : TRI_STATUS_DEVICE;
    // A failed runtime call also leaves its error as the thread's last error. Clear it (a sticky
    // error stays anyway): else the cudaGetLastError() after the next kernel launch would report
    // this error again, as if that launch had failed (an allocation, a host_register of memory
    // already pinned, an invalid argument are all recoverable).
    (void)cudaGetLastError();
    return tri__fail(st, "%s:%d: %s: %s (%s)", file, line, expr, cudaGetErrorString(err), cudaGetErrorName(err));
}

// Returns a tri_status from the enclosing function when call fails.
#define CUDA_TRY(call)                                                                         \
    do {                                                                                       \
        tri_status st__ = tri__cuda_status((call), __FILE__, __LINE__, #call);                 \
        if (st__ != TRI_STATUS_OK) return st__;                                                \
    } while (0)

// ---- half precision, identical to tri__f16_to_f32 & co. in core/dtype.c ----

__device__ __forceinline__ float tri_dev_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

__device__ __forceinline__ uint16_t tri_dev_f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        uint32_t exp = a >> 23;
        uint32_t man = (a & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp;
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = a - 0x38000000u;
    uint32_t rem = q & 0x1fff;
    q >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

__device__ __forceinline__ float tri_dev_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t tri_dev_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// ---- launchers: elementwise, norms, sampling helpers (kernels.cu) ----

// 1-D grids: blocks of 256 threads, at most this many blocks, grid-stride loops beyond.
#define TRI_CUDA_MAX_BLOCKS 65535

// dst (n) of dst_type (F16 or BF16) = src (n) f32, rounded to nearest even; or dst (n / 32 blocks)
// of Q8_0 / Q4_0 = src quantized bit for bit as tri__quantize_row (n a multiple of 32, dst 2-aligned).
cudaError_t tri__cuda_convert(void *dst, tri_dtype dst_type, const float *src, int64_t n, cudaStream_t s);
// Row rows[i] of dst (n elements of t: F32, F16, BF16, or Q8_0 / Q4_0 with n a multiple of 32) =
// row i of src (m, n) f32; rows (m) device.
cudaError_t tri__cuda_set_rows(void *dst, tri_dtype t, const float *src, const int32_t *rows, int64_t m, int64_t n,
                               cudaStream_t s);
// A StreamingLLM one-token step's view from the length in state[1] (backend.h, window_rows).
cudaError_t tri__cuda_window_rows(int32_t *state, int32_t *rows, int32_t view_rows, const tri__stream_window *w,
                                  cudaStream_t s);
// out (n_chunks, width) = means over chunk rows of x (stride elements apart), summed in double; x
// rows of F32, F16, or Q8_0 / Q4_0 blocks (stride a multiple of 32, x 2-aligned).
cudaError_t tri__cuda_chunk_mean(float *out, const void *x, tri_dtype type, int64_t n_chunks, int64_t chunk,
                                 int64_t width, int64_t stride, cudaStream_t s);
// dst row i (row_bytes) = src + offsets[i]; words: row_bytes, offsets and pointers 4-aligned.
cudaError_t tri__cuda_gather(void *dst, const void *src, const int64_t *offsets, int64_t n, int64_t row_bytes,
                             bool words, cudaStream_t s);
// out (m, n) f32: row i = row ids[i] of table, rows of row_bytes bytes of type t. ids (m) device.
cudaError_t tri__cuda_get_rows(float *out, const void *table, tri_dtype t, int64_t row_bytes, int64_t n,
                               const int32_t *ids, int64_t m, cudaStream_t s);
// out (rows, k) of half type out_type (F16) = rows of w (type t, row_bytes each), dequantized.
cudaError_t tri__cuda_dequant_f16(uint16_t *out, const void *w, tri_dtype t, int64_t row_bytes, int64_t rows,
                                  int64_t k, cudaStream_t s);
// hi + lo ~= x (n f32) in half type t (F16 or BF16): hi = round(x), lo = round(x - hi).
cudaError_t tri__cuda_split_half(uint16_t *hi, uint16_t *lo, tri_dtype t, const float *x, int64_t n,
                                 cudaStream_t s);
cudaError_t tri__cuda_rmsnorm(float *y, const float *x, const void *w, tri_dtype wt, int64_t m, int64_t n, float eps,
                              cudaStream_t s);
// x (m, n_heads, head_dim) in place; pos (m) and inv_freq (head_dim / 2) device.
cudaError_t tri__cuda_rope(float *x, int64_t m, int64_t n_heads, int64_t head_dim, bool adjacent, const int32_t *pos,
                           const float *inv_freq, float attn_factor, cudaStream_t s);
cudaError_t tri__cuda_swiglu(float *out, const float *gate, const float *up, int64_t n, cudaStream_t s);
cudaError_t tri__cuda_add(float *out, const float *a, const float *b, int64_t n, cudaStream_t s);
// bytes from src (device memory or mapped pinned host memory) to dst by a kernel, not a copy engine
cudaError_t tri__cuda_copy_bytes(void *dst, const void *src, size_t bytes, cudaStream_t s);
cudaError_t tri__cuda_geglu(float *out, const float *gate, const float *up, int64_t n, cudaStream_t s);
cudaError_t tri__cuda_scale(float *x, int64_t n, float f, cudaStream_t s);
// x (m, n) += b (n) per row.
cudaError_t tri__cuda_add_rows(float *x, const float *b, int64_t m, int64_t n, cudaStream_t s);
// Rows that are all -inf are left as they are and set *err_flag (device memory) to 1.
cudaError_t tri__cuda_softmax(float *x, int64_t m, int64_t n, float temperature, int *err_flag, cudaStream_t s);
// The power of two >= n (n >= 1): top-k's padded row and selection lengths.
static inline int64_t tri__cuda_top_k_pow2(int64_t n) {
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}
// Rows of n <= 4096 (padded) are sorted in shared memory; longer ones select their k largest by a
// radix select and sort those, in shared memory for k <= 4096 (padded), else in keys: scratch of
// (m, tri__cuda_top_k_pow2(k)) uint64 (NULL otherwise). values, indices (m, k).
#define TRI_CUDA_TOPK_SMEM_KEYS 4096
cudaError_t tri__cuda_top_k(float *values, int32_t *indices, const float *x, int64_t m, int64_t n, int64_t k,
                            uint64_t *keys, cudaStream_t s);

// ---- matvec for small m (kernels-matvec.cu) ----

#define TRI_CUDA_MATVEC_MAX_M 16
// y (m, n) = x (m, k) @ W^T for m <= TRI_CUDA_MATVEC_MAX_M, W rows of row_bytes bytes of type t,
// f32 activations and accumulation.
cudaError_t tri__cuda_matvec(float *y, const float *x, const void *w, tri_dtype t, int64_t row_bytes, int64_t m,
                             int64_t n, int64_t k, cudaStream_t s);

// ---- attention (kernels-attention.cu) ----

// One span as the kernels see it (uploaded per call).
typedef struct tri__cuda_span {
    const void *k, *v;  // device rows
    int64_t stride;     // elements between rows
    int64_t key0;       // index of the span's first key among all keys of the view (weight_sums)
    int32_t pos0, n;
    int32_t pos_at;     // offset of its explicit positions in the uploaded position array, or -1
    int32_t pad_;
} tri__cuda_span;

// A chunk of consecutive keys of one KV head (keys in the view's span order), processed by one
// block per query.
typedef struct tri__cuda_chunk {
    int64_t key0;  // first key, an index among all keys of the view
    int32_t head;  // KV head
    int32_t n;     // keys, 1 .. chunk size
} tri__cuda_chunk;

// The row types attention reads, as its kernels number them: a view's spans may mix them
// (backend.h span_types), one launch per type present.
enum { TRI_CUDA_KV_F32 = 0, TRI_CUDA_KV_F16 = 1, TRI_CUDA_KV_Q8_0 = 2, TRI_CUDA_KV_Q4_0 = 3, TRI_CUDA_KV_KINDS = 4 };

// TRI_CUDA_KV_* of t, or -1 for a type attention does not read.
static inline int tri__cuda_kv_kind(tri_dtype t) {
    switch (t) {
    case TRI_DTYPE_F32: return TRI_CUDA_KV_F32;
    case TRI_DTYPE_F16: return TRI_CUDA_KV_F16;
    case TRI_DTYPE_Q8_0: return TRI_CUDA_KV_Q8_0;
    case TRI_DTYPE_Q4_0: return TRI_CUDA_KV_Q4_0;
    default: return -1;
    }
}

typedef struct tri__cuda_attn_args {
    const float *q;               // (m, n_head, hd) device
    const int32_t *q_pos;         // (m) device
    const tri__cuda_span *spans;  // device
    const int32_t *head_span;     // (n_head_kv + 1) device
    const int32_t *pos;           // explicit positions, device
    const tri__cuda_chunk *chunks;  // (n_chunks) device
    const int32_t *head_chunk;    // (n_head_kv + 1) device: chunks of head h are head_chunk[h] ..
    int64_t m, n_head, hd, group, n_chunks;
    int32_t chunk_keys;           // keys per chunk at most
    float scale;
    float softcap;  // the view's attention-logit soft-cap: score -> softcap * tanh(score / softcap); 0: none
    // Chunks by row type (F32, F16, Q8_0 or Q4_0; quantized rows whole blocks of 32): a chunk's keys
    // are all of one type, kind_n[k] chunks of kind k (TRI_CUDA_KV_*), their ids chunk_order[kind_0[k]
    // .. + kind_n[k]) (device), or with chunk_order NULL chunks 0 .. n_chunks - 1 (one kind only)
    const int32_t *chunk_order;
    int32_t kind_n[TRI_CUDA_KV_KINDS], kind_0[TRI_CUDA_KV_KINDS];
    // scratch
    float *part_o;  // (n_chunks, mt, group, hd)
    float *part_ml; // (n_chunks, mt, group, 2): chunk max and sum
    float *stats;   // (m, n_head, 2): final max and sum per query head
    float *state;   // NULL, or (m, n_head, hd + 2) instead of out: accumulator, max, sum before the
                    // division (attention_state)
    // a token tree among the keys (tri__kv_tree, backend.h): nodes at positions tree_row0 ..
    // tree_row0 + tree_n - 1, tree_anc (tree_n, tree_words) device; tree_n 0: none
    const uint32_t *tree_anc;
    int32_t tree_row0, tree_n, tree_words;
} tri__cuda_attn_args;

// Shared memory a partial block needs; 0 if it exceeds what a block can have.
size_t tri__cuda_attn_smem(int64_t group, int64_t hd, int32_t chunk_keys);
// Queries i0 .. i0 + mt: partial results per chunk, then their combination into out and stats.
cudaError_t tri__cuda_attention(float *out, const tri__cuda_attn_args *a, int64_t i0, int64_t mt, cudaStream_t s);
// weight_sums (total keys) from stats, after every query has been through tri__cuda_attention.
cudaError_t tri__cuda_attn_weight_sums(float *weight_sums, const tri__cuda_attn_args *a, cudaStream_t s);

#endif  // TRI_CUDA_COMMON_CUH
