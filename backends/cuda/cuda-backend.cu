// cuda-backend.cu - the CUDA backend's op table: argument checks (the same as the CPU backend's),
// per-call uploads of host descriptors, scratch, cuBLAS, and the launchers of kernels*.cu.
//
// One stream per instance; every op is queued on it and returns at once. Host arrays an op reads
// (ids, positions, KV spans) are copied into a mapped pinned staging slot and copied to the device
// by a kernel on the op's stream (not by a copy engine, where they would queue behind a layer's
// prefetch on the transfer stream), so the caller may reuse them as soon as the op returns. Errors
// the device only finds later (a softmax row that is all -inf) set a flag in device memory that
// synchronize() reads back and reports.
#include <cublas_v2.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if !TRI_CUDA_EMULATED
#include <dlfcn.h>
#endif

#include "cuda-common.cuh"

extern "C" {
#include "backend.h"
#include "cuda-backend.h"
#include "dtype.h"
}

// ---- checks ----

static tri_status cublas_status(cublasStatus_t err, const char *file, int line, const char *expr) {
    if (err == CUBLAS_STATUS_SUCCESS) return TRI_STATUS_OK;
    (void)cudaGetLastError();  // a CUDA error inside cuBLAS is not left for the next launch check
    return tri__fail(err == CUBLAS_STATUS_ALLOC_FAILED ? TRI_STATUS_DEVICE_OUT_OF_MEMORY : TRI_STATUS_DEVICE,
                     "%s:%d: %s: %s", file, line, expr, cublasGetStatusString(err));
}

#define CUBLAS_TRY(call)                                                                       \
    do {                                                                                       \
        tri_status st__ = cublas_status((call), __FILE__, __LINE__, #call);                    \
        if (st__ != TRI_STATUS_OK) return st__;                                                \
    } while (0)

// ---- state ----

#define UPLOAD_SLOTS 8  // uploads in flight before the host waits for the oldest one
// Default limits (tri__cuda_limits): attention partials and top-k sort keys of one launch at most
// 256 MiB each, dequantized weights of one GEMM 16M f16 elements.
#define PARTIAL_BUDGET ((size_t)256 << 20)
#define TOPK_BUDGET ((size_t)256 << 20)
#define DEQUANT_CHUNK ((int64_t)16 << 20)

typedef struct upload_slot {
    unsigned char *host;  // pinned, mapped
    unsigned char *dev;   // its device alias (cudaHostGetDevicePointer)
    size_t cap;
    cudaEvent_t done;     // recorded after the copy out of this slot
    bool pending;
} upload_slot;

// A recorded graph and the device buffers its ops read: descriptors uploaded and scratch used
// while recording, which must outlive every replay (the instance's own buffers may be regrown).
struct tri__graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void **bufs;
    int n_bufs, cap;
};

typedef struct cuda_state {
    int device;
    int sm_count;
    cudaStream_t stream;
    cudaStream_t xfer;  // TRI_STREAM_TRANSFER: the offload engine's copies
    cublasHandle_t cublas;
    // A flag kernels set in device memory (softmax's all -inf row), read back by synchronize into
    // err_host (pinned, not mapped): a kernel's store into mapped host memory is not atomic with
    // respect to the host over PCIe, a copy in stream order is.
    int *err_host;
    int *err_dev;
    bool err_armed;  // a kernel that may set the flag (or a graph) ran since the last read-back
    bool mem_pools;  // the device has stream-ordered allocation (cudaMallocAsync)
    upload_slot slots[UPLOAD_SLOTS];
    int next_slot;
    // pinned slots outgrown, freed at the next synchronize (cudaFreeHost waits for the whole
    // device, the transfer stream's prefetch included, where synchronize waits anyway)
    void **retired;
    int n_retired, retired_cap;
    unsigned char *args;  // device copy of the current op's uploaded descriptors
    size_t args_cap;
    unsigned char *scratch;  // device scratch of the current op
    size_t scratch_cap;
    tri__cuda_limits limits;
    tri__graph *rec;  // the graph being recorded (graph_begin .. graph_end), else NULL
    unsigned char *rec_host;  // host staging of the descriptors uploaded while recording
    size_t rec_host_cap;
} cuda_state;

static cuda_state *priv(tri__backend *be) { return (cuda_state *)be->priv; }

static void graph_release(tri__graph *g);

// Every entry point first makes the instance's device current: the caller's thread may have
// another one current.
#define USE_DEVICE(st) CUDA_TRY(cudaSetDevice((st)->device))

// A device buffer freed and allocated in the order of the instance's stream, the only stream that
// uses the descriptor and scratch buffers (stream-ordered allocation): no device-wide
// synchronisation, so growing them does not wait for the transfer stream's prefetch. Devices
// without memory pools take cudaFree / cudaMalloc, which wait for the whole device.
static cudaError_t stream_free(cuda_state *st, void *p) {
    if (!p) return cudaSuccess;
    return st->mem_pools ? cudaFreeAsync(p, st->stream) : cudaFree(p);
}
static cudaError_t stream_malloc(cuda_state *st, void **p, size_t bytes) {
    if (!st->mem_pools) return tri__cuda_malloc(p, bytes);
    if (tri__fault_hit(TRI__FAULT_DEVICE)) return cudaErrorMemoryAllocation;
    return cudaMallocAsync(p, bytes, st->stream);
}

// Grows a device buffer used on the instance's stream to at least bytes (contents not kept): the
// old one is freed after the work queued before that uses it.
static tri_status grow_device(cuda_state *st, unsigned char **buf, size_t *cap, size_t bytes, const char *what) {
    if (bytes <= *cap) return TRI_STATUS_OK;
    size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
    CUDA_TRY(stream_free(st, *buf));
    *buf = NULL;
    *cap = 0;
    cudaError_t err = stream_malloc(st, (void **)buf, want);
    if (err != cudaSuccess) {
        *buf = NULL;
        if (want > bytes && err == cudaErrorMemoryAllocation) {  // retry without the headroom
            (void)cudaGetLastError();
            want = bytes;
            err = stream_malloc(st, (void **)buf, want);
        }
        if (err != cudaSuccess) {
            *buf = NULL;
            tri_status st = tri__cuda_status(err, __FILE__, __LINE__, "cudaMalloc");
            return tri__fail(st, "cuda: %s scratch of %zu bytes: %s", what, bytes, tri_last_error());
        }
    }
    *cap = want;
    return TRI_STATUS_OK;
}

// A device buffer of bytes that the graph being recorded owns.
static tri_status rec_alloc(cuda_state *st, size_t bytes, unsigned char **out) {
    tri__graph *g = st->rec;
    if (g->n_bufs == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        void **b = (void **)realloc(g->bufs, sizeof *b * (size_t)cap);
        if (!b) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda graph: %d buffers", cap);
        g->bufs = b;
        g->cap = cap;
    }
    cudaError_t err = tri__cuda_malloc((void **)out, bytes ? bytes : 16);
    if (err != cudaSuccess) {
        *out = NULL;
        tri_status s = tri__cuda_status(err, __FILE__, __LINE__, "cudaMalloc");
        return tri__fail(s, "cuda graph: a buffer of %zu bytes: %s", bytes, tri_last_error());
    }
    g->bufs[g->n_bufs++] = *out;
    return TRI_STATUS_OK;
}

static tri_status scratch_get(cuda_state *st, size_t bytes, unsigned char **out) {
    if (st->rec) return rec_alloc(st, bytes, out);  // a replay reads it after the instance regrew its own
    TRY(grow_device(st, &st->scratch, &st->scratch_cap, bytes, "op"));
    *out = st->scratch;
    return TRI_STATUS_OK;
}

// ---- uploads of host descriptors ----

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// A pinned host area of bytes to fill; then upload_finish copies it to the device.
static tri_status upload_begin(cuda_state *st, size_t bytes, unsigned char **host) {
    if (st->rec) {  // recording: plain host memory (no pinned allocation or event wait in a capture)
        if (bytes > st->rec_host_cap) {
            unsigned char *h = (unsigned char *)realloc(st->rec_host, bytes);
            if (!h) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda graph: %zu bytes of descriptors", bytes);
            st->rec_host = h;
            st->rec_host_cap = bytes;
        }
        *host = st->rec_host;
        return TRI_STATUS_OK;
    }
    upload_slot *sl = &st->slots[st->next_slot];
    if (sl->pending) {  // the copy out of this slot, UPLOAD_SLOTS uploads ago, must be done
        CUDA_TRY(cudaEventSynchronize(sl->done));
        sl->pending = false;
    }
    if (bytes > sl->cap) {
        size_t want = bytes < 65536 ? 65536 : bytes + bytes / 4;
        if (sl->host) {  // idle (its copy is done): retired until the next synchronize
            if (st->n_retired == st->retired_cap) {
                int cap = st->retired_cap ? 2 * st->retired_cap : 8;
                void **r = (void **)realloc(st->retired, sizeof *r * (size_t)cap);
                if (!r) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda: %d retired staging slots", cap);
                st->retired = r;
                st->retired_cap = cap;
            }
            st->retired[st->n_retired++] = sl->host;
        }
        sl->host = NULL;
        sl->cap = 0;
        cudaError_t err = tri__cuda_host_alloc((void **)&sl->host, want, cudaHostAllocMapped);
        if (err == cudaSuccess) {
            err = cudaHostGetDevicePointer((void **)&sl->dev, sl->host, 0);
            if (err != cudaSuccess) {
                (void)cudaFreeHost(sl->host);
                sl->host = NULL;
            }
        }
        if (err != cudaSuccess) {
            sl->host = NULL;
            (void)cudaGetLastError();
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda: %zu bytes of pinned staging: %s", want,
                             cudaGetErrorString(err));
        }
        sl->cap = want;
    }
    *host = sl->host;
    return TRI_STATUS_OK;
}

static tri_status upload_finish(cuda_state *st, size_t bytes, unsigned char **dev) {
    if (st->rec) {  // recording: a copy of the descriptors of the graph's own, made now
        TRY(rec_alloc(st, bytes, dev));
        CUDA_TRY(cudaMemcpyAsync(*dev, st->rec_host, bytes, cudaMemcpyHostToDevice, st->xfer));
        CUDA_TRY(cudaStreamSynchronize(st->xfer));
        return TRI_STATUS_OK;
    }
    upload_slot *sl = &st->slots[st->next_slot];
    TRY(grow_device(st, &st->args, &st->args_cap, bytes, "argument"));
    // a kernel reads the slot over the bus: a copy engine would queue this copy behind whatever the
    // transfer stream has queued (a layer's prefetch of KV or weights, megabytes) on a GPU with one
    // engine per direction
    CUDA_TRY(tri__cuda_copy_bytes(st->args, sl->dev, bytes, st->stream));
    CUDA_TRY(cudaEventRecord(sl->done, st->stream));
    sl->pending = true;
    st->next_slot = (st->next_slot + 1) % UPLOAD_SLOTS;
    *dev = st->args;
    return TRI_STATUS_OK;
}

// One host array uploaded as it is: *dev is its device copy for the next launch.
static tri_status upload_array(cuda_state *st, const void *src, size_t bytes, unsigned char **dev) {
    unsigned char *h;
    TRY(upload_begin(st, bytes, &h));
    memcpy(h, src, bytes);
    return upload_finish(st, bytes, dev);
}

#define LAUNCH(call) CUDA_TRY(call)

// What a replay could not repeat is refused while recording (backend.h, graph_begin).
#define NOT_RECORDING(st, what)                                                                     \
    do {                                                                                           \
        if ((st)->rec) return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda: %s while recording a graph", what); \
    } while (0)

// ---- memory ----

static tri_status cuda_alloc(tri__backend *be, size_t bytes, void **out) {
    cuda_state *st = priv(be);
    *out = NULL;
    if (bytes == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    cudaError_t err = tri__cuda_malloc(out, bytes);  // 256-byte aligned
    if (err != cudaSuccess) {
        *out = NULL;
        tri_status s = tri__cuda_status(err, __FILE__, __LINE__, "cudaMalloc");
        return tri__fail(s, "cuda: alloc of %zu bytes on device %d: %s", bytes, st->device,
                         err == cudaErrorMemoryAllocation ? "out of memory" : cudaGetErrorString(err));
    }
    return TRI_STATUS_OK;
}

static void cuda_free(tri__backend *be, void *ptr) {
    if (!ptr) return;
    cuda_state *st = priv(be);
    if (cudaSetDevice(st->device) != cudaSuccess || cudaFree(ptr) != cudaSuccess)  // cudaFree synchronizes
        tri__log(TRI_LOG_LEVEL_ERROR, "cuda: free of %p: %s", ptr, cudaGetErrorString(cudaGetLastError()));
}

static tri_status cuda_copy_to_backend(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0) return TRI_STATUS_OK;
    NOT_RECORDING(st, "a copy from host memory");
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_copy_to_host(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0) return TRI_STATUS_OK;
    NOT_RECORDING(st, "a copy to host memory");
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_copy(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0 || dst == src) return TRI_STATUS_OK;
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_synchronize(tri__backend *be) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "synchronize");
    USE_DEVICE(st);
    // the device's error flag comes back behind the stream's work (4 bytes), when a kernel that may
    // set it ran since the last time
    const bool armed = st->err_armed;
    if (armed) CUDA_TRY(cudaMemcpyAsync(st->err_host, st->err_dev, sizeof(int), cudaMemcpyDeviceToHost, st->stream));
    CUDA_TRY(cudaStreamSynchronize(st->xfer));
    CUDA_TRY(cudaStreamSynchronize(st->stream));
    while (st->n_retired > 0) {
        void *p = st->retired[--st->n_retired];
        CUDA_TRY(cudaFreeHost(p));
    }
    st->err_armed = false;
    if (armed && *st->err_host) {
        *st->err_host = 0;
        CUDA_TRY(cudaMemsetAsync(st->err_dev, 0, sizeof(int), st->stream));  // before any later op
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda softmax: a row is all -inf");
    }
    return TRI_STATUS_OK;
}

static void cuda_destroy(tri__backend *be) {
    if (!be) return;
    cuda_state *st = priv(be);
    if (st) {
        if (cudaSetDevice(st->device) == cudaSuccess) {
            if (st->rec) {  // a recording never ended
                cudaGraph_t g = NULL;
                if (cudaStreamEndCapture(st->stream, &g) == cudaSuccess && g) (void)cudaGraphDestroy(g);
                (void)cudaGetLastError();
                st->rec->graph = NULL;
                graph_release(st->rec);
            }
            if (st->stream) (void)cudaStreamSynchronize(st->stream);
            if (st->xfer) (void)cudaStreamSynchronize(st->xfer);
            for (int i = 0; i < UPLOAD_SLOTS; i++) {
                if (st->slots[i].done) (void)cudaEventDestroy(st->slots[i].done);
                if (st->slots[i].host) (void)cudaFreeHost(st->slots[i].host);
            }
            for (int i = 0; i < st->n_retired; i++) (void)cudaFreeHost(st->retired[i]);
            if (st->err_host) (void)cudaFreeHost(st->err_host);
            if (st->err_dev) (void)cudaFree(st->err_dev);
            if (st->args) (void)cudaFree(st->args);
            if (st->scratch) (void)cudaFree(st->scratch);
            if (st->cublas) (void)cublasDestroy(st->cublas);
            if (st->stream) (void)cudaStreamDestroy(st->stream);
            if (st->xfer) (void)cudaStreamDestroy(st->xfer);
        }
        free(st->rec_host);
        free(st->retired);
        free(st);
    }
    free(be);
}

// ---- argument checks shared by several ops ----

static bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

static size_t elem_align(tri_dtype t) { return t == TRI_DTYPE_F32 ? 4 : 2; }

// ---- linear algebra ----

static cudaDataType half_type(tri_dtype t) { return t == TRI_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

// y (m, n) f32 = (hi + lo) (m, k) @ W^T with W (n, k) half of type wt: two tensor-core GEMMs with
// f32 accumulation. Column-major view: Y^T (n, m) = W (k, n)^T . X^T (k, m).
static tri_status gemm_split(cuda_state *st, float *y, int64_t ldy, const void *w, cudaDataType wt, const void *hi,
                             const void *lo, int64_t m, int64_t n, int64_t k) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_TRY(cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, w, wt, (int)k, hi, wt,
                            (int)k, &zero, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUBLAS_TRY(cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, w, wt, (int)k, lo, wt,
                            (int)k, &one, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return TRI_STATUS_OK;
}

static tri_status cuda_matmul(tri__backend *be, float *y, const float *x, const void *w, tri_dtype type, int64_t m,
                              int64_t n, int64_t k) {
    cuda_state *st = priv(be);
    int64_t row_bytes = tri__dtype_row_bytes(type, k);
    if (row_bytes <= 0 || m < 0 || n < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda matmul: W (%lld, %lld) %s", (long long)n, (long long)k,
                         tri_dtype_name(type));
    if (!aligned(w, elem_align(type)) || !aligned(x, 4) || !aligned(y, 4))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda matmul: misaligned operand");
    if (m == 0 || n == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    if (m <= TRI_CUDA_MATVEC_MAX_M) {
        LAUNCH(tri__cuda_matvec(y, x, w, type, row_bytes, m, n, k, st->stream));
        return TRI_STATUS_OK;
    }
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda matmul: (%lld, %lld) x (%lld, %lld) exceeds cuBLAS's int sizes",
                         (long long)m, (long long)k, (long long)n, (long long)k);
    if (type == TRI_DTYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        CUBLAS_TRY(cublasSgemm(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, (const float *)w,
                               (int)k, x, (int)k, &zero, y, (int)n));
        return TRI_STATUS_OK;
    }
    // Half weights (or quantized ones dequantized to f16): x is split into hi + lo halves so that
    // the product keeps ~f32 precision of x (one half alone would round x to 11 or 8 bits).
    tri_dtype ht = type == TRI_DTYPE_BF16 ? TRI_DTYPE_BF16 : TRI_DTYPE_F16;
    bool quant = tri__dtype_is_quantized(type);
    int64_t rows = quant ? (st->limits.dequant_elems / k < 1 ? 1 : st->limits.dequant_elems / k) : 0;
    if (rows > n) rows = n;
    size_t xs = align16((size_t)(m * k) * 2);
    unsigned char *scr;
    TRY(scratch_get(st, 2 * xs + (size_t)(rows * k) * 2, &scr));
    uint16_t *hi = (uint16_t *)scr, *lo = (uint16_t *)(scr + xs), *wd = (uint16_t *)(scr + 2 * xs);
    LAUNCH(tri__cuda_split_half(hi, lo, ht, x, m * k, st->stream));
    if (!quant) return gemm_split(st, y, n, w, half_type(type), hi, lo, m, n, k);
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        LAUNCH(tri__cuda_dequant_f16(wd, (const unsigned char *)w + r0 * row_bytes, type, row_bytes, nr, k,
                                     st->stream));
        TRY(gemm_split(st, y + r0, n, wd, CUDA_R_16F, hi, lo, m, nr, k));
    }
    return TRI_STATUS_OK;
}

static tri_status cuda_get_rows(tri__backend *be, float *out, const void *table, tri_dtype type, int64_t n_rows,
                                int64_t n, const int32_t *ids, int64_t m) {
    cuda_state *st = priv(be);
    int64_t row_bytes = tri__dtype_row_bytes(type, n);
    if (row_bytes <= 0 || n_rows < 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda get_rows: %s rows of %lld elements", tri_dtype_name(type),
                         (long long)n);
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= n_rows)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda get_rows: id %d at %lld outside [0, %lld)", ids[i],
                             (long long)i, (long long)n_rows);
    if (!aligned(table, elem_align(type)))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda get_rows: misaligned table");
    if (m == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    unsigned char *d;
    TRY(upload_array(st, ids, sizeof(int32_t) * (size_t)m, &d));
    LAUNCH(tri__cuda_get_rows(out, table, type, row_bytes, n, (const int32_t *)d, m, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_convert(tri__backend *be, void *dst, tri_dtype type, const float *src, int64_t n) {
    cuda_state *st = priv(be);
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda convert: n = %lld", (long long)n);
    bool quant = type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;  // a quantized KV cache's rows
    if (type != TRI_DTYPE_F32 && type != TRI_DTYPE_F16 && type != TRI_DTYPE_BF16 && !quant)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda convert: to %s", tri_dtype_name(type));
    if (quant && n % TRI_QK != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda convert: %lld values to %s, not whole blocks of %d",
                         (long long)n, tri_dtype_name(type), TRI_QK);
    if (!aligned(dst, elem_align(type)) || !aligned(src, 4))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda convert: misaligned rows");
    if (n == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    if (type == TRI_DTYPE_F32) {
        if (dst != src)
            CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice, st->stream));
        return TRI_STATUS_OK;
    }
    LAUNCH(tri__cuda_convert(dst, type, src, n, st->stream));
    return TRI_STATUS_OK;
}

// ---- elementwise and normalisation ----

static tri_status cuda_rmsnorm(tri__backend *be, float *y, const float *x, const void *weight, tri_dtype wt, int64_t m,
                               int64_t n, float eps) {
    cuda_state *st = priv(be);
    if (wt != TRI_DTYPE_F32 && wt != TRI_DTYPE_F16 && wt != TRI_DTYPE_BF16)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda rmsnorm: %s weight", tri_dtype_name(wt));
    if (n <= 0 || m < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda rmsnorm: n = %lld", (long long)n);
    if (!aligned(weight, elem_align(wt))) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda rmsnorm: misaligned weight");
    if (m == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    LAUNCH(tri__cuda_rmsnorm(y, x, weight, wt, m, n, eps, st->stream));
    return TRI_STATUS_OK;
}

// The frequency table travels with the positions in the op's one upload (head_dim / 2 floats,
// 256 bytes for head_dim 128). A device copy cached by the table's address would go stale when a
// table is freed and another allocated at the same address, or updated in place (dynamic NTK).
// pos_dev: pos is device memory (rope_dev), read by the kernel; else host, uploaded with the table.
static tri_status rope_run(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos, bool pos_dev,
                           const tri__rope *rope) {
    cuda_state *st = priv(be);
    int64_t hd = rope->head_dim, half = hd / 2;
    if (hd <= 0 || hd % 2 != 0 || m < 0 || n_heads < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda rope: head_dim %lld", (long long)hd);
    for (int64_t i = 0; !pos_dev && i < m; i++)
        if (pos[i] < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda rope: position %d", pos[i]);
    if (m == 0 || n_heads == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    size_t fbytes = align16(sizeof(float) * (size_t)half), pbytes = pos_dev ? 0 : sizeof(int32_t) * (size_t)m;
    unsigned char *h, *d;
    TRY(upload_begin(st, fbytes + pbytes, &h));
    memcpy(h, rope->inv_freq, sizeof(float) * (size_t)half);
    if (!pos_dev) memcpy(h + fbytes, pos, pbytes);
    TRY(upload_finish(st, fbytes + pbytes, &d));
    LAUNCH(tri__cuda_rope(x, m, n_heads, hd, rope->layout == TRI_ROPE_LAYOUT_ADJACENT,
                          pos_dev ? pos : (const int32_t *)(d + fbytes), (const float *)d, rope->attn_factor,
                          st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_rope(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                            const tri__rope *rope) {
    return rope_run(be, x, m, n_heads, pos, false, rope);
}

static tri_status cuda_swiglu(tri__backend *be, float *out, const float *gate, const float *up, int64_t n) {
    cuda_state *st = priv(be);
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda swiglu: n = %lld", (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_swiglu(out, gate, up, n, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_add(tri__backend *be, float *out, const float *a, const float *b, int64_t n) {
    cuda_state *st = priv(be);
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda add: n = %lld", (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_add(out, a, b, n, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_geglu(tri__backend *be, float *out, const float *gate, const float *up, int64_t n) {
    cuda_state *st = priv(be);
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda geglu: n = %lld", (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_geglu(out, gate, up, n, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_scale(tri__backend *be, float *x, int64_t n, float f) {
    cuda_state *st = priv(be);
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda scale: n = %lld", (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_scale(x, n, f, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_add_rows(tri__backend *be, float *x, const float *b, int64_t m, int64_t n) {
    cuda_state *st = priv(be);
    if (m < 0 || n < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda add_rows: %lld x %lld", (long long)m, (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_add_rows(x, b, m, n, st->stream));
    return TRI_STATUS_OK;
}

// ---- sampling helpers ----

static tri_status cuda_softmax(tri__backend *be, float *x, int64_t m, int64_t n, float temperature) {
    cuda_state *st = priv(be);
    if (!(temperature > 0) || n <= 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda softmax: temperature %g, n %lld", (double)temperature,
                         (long long)n);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_softmax(x, m, n, temperature, st->err_dev, st->stream));
    st->err_armed = true;
    return TRI_STATUS_OK;
}

static tri_status cuda_top_k(tri__backend *be, float *values, int32_t *indices, const float *x, int64_t m, int64_t n,
                             int64_t k) {
    cuda_state *st = priv(be);
    if (k < 1 || k > n || n > INT32_MAX || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda top_k: k = %lld of n = %lld", (long long)k, (long long)n);
    if (m == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    int64_t np2 = tri__cuda_top_k_pow2(n), kp2 = tri__cuda_top_k_pow2(k);
    uint64_t *keys = NULL;
    int64_t rows = m;  // rows per launch
    if (np2 > TRI_CUDA_TOPK_SMEM_KEYS && kp2 > TRI_CUDA_TOPK_SMEM_KEYS) {
        // a long row's k selected keys sorted in global memory: bounded scratch, rows in batches
        size_t row_bytes = sizeof(uint64_t) * (size_t)kp2;
        rows = (int64_t)(st->limits.topk_key_bytes / row_bytes);
        if (rows < 1) rows = 1;
        if (rows > m) rows = m;
        unsigned char *scr;
        TRY(scratch_get(st, row_bytes * (size_t)rows, &scr));
        keys = (uint64_t *)scr;
    }
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        int64_t nr = m - r0 < rows ? m - r0 : rows;
        LAUNCH(tri__cuda_top_k(values + r0 * k, indices + r0 * k, x + r0 * n, nr, n, k, keys, st->stream));
    }
    return TRI_STATUS_OK;
}

// ---- attention ----

// Chunks of at most C keys of KV head h (keys key .. of the view's order): cut where the run of
// one row type ends (a view with span_types), so that each chunk is read by one type's kernel.
// Returns their count; with ch set writes them from ch[0], and with kinds set their TRI_CUDA_KV_*
// kinds from kinds[0].
static int64_t head_chunks(const tri__kv_view *kv, int64_t h, int32_t C, int64_t key, tri__cuda_chunk *ch,
                           uint8_t *kinds) {
    int64_t n = 0, run0 = key;
    int kind = -1;
    for (int32_t si = kv->head_span[h]; si <= kv->head_span[h + 1]; si++) {
        const bool end = si == kv->head_span[h + 1];
        const int k = end ? -1 : tri__cuda_kv_kind(tri__kv_span_type(kv, &kv->spans[si]));
        if (!end && (kv->spans[si].n == 0 || k == kind || kind < 0)) {  // the run goes on
            if (kv->spans[si].n > 0) kind = k;
            key += kv->spans[si].n;
            continue;
        }
        for (int64_t k0 = run0; k0 < key; k0 += C, n++) {  // the run ends before span si
            if (!ch) continue;
            ch[n] = tri__cuda_chunk{k0, (int32_t)h, (int32_t)(key - k0 < C ? key - k0 : C)};
            if (kinds) kinds[n] = (uint8_t)kind;
        }
        if (end) break;
        run0 = key, kind = k;
        key += kv->spans[si].n;
    }
    return n;
}

// out (m, n_head, hd), or with state set (m, n_head, hd + 2) the state before the division.
// q_pos_dev: q_pos is device memory (attention_dev), else host, uploaded with the view.
static tri_status attention_run(tri__backend *be, float *out, float *state, const float *q, const int32_t *q_pos,
                                bool q_pos_dev, int64_t m, int64_t n_head, int64_t hd, const tri__kv_view *kv,
                                float *weight_sums) {
    cuda_state *st = priv(be);
    int64_t nkv = kv->n_head_kv;
    // n_head 0 would make a group of 0 heads (a division by zero sizing the partials below)
    if (nkv <= 0 || n_head <= 0 || n_head % nkv != 0 || hd <= 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda attention: %lld heads over %lld KV heads, head_dim %lld",
                         (long long)n_head, (long long)nkv, (long long)hd);
    if (kv->head_span[0] != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda attention: head_span[0] = %d", kv->head_span[0]);
    for (int64_t h = 0; h < nkv; h++)
        if (kv->head_span[h] > kv->head_span[h + 1])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda attention: head_span decreases at %lld", (long long)h);
    int32_t n_spans = kv->head_span[nkv];
    int64_t n_pos = 0, n_keys = 0;
    unsigned kinds = 0;  // bit k: some rows of kind k (TRI_CUDA_KV_*)
    for (int32_t si = 0; si < (kv->span_types ? n_spans : 1); si++) {
        // the view's type, or each span's: a quantized cache's rows are whole blocks of 32, read in
        // place (the CPU's conditions)
        const tri_dtype ty = kv->span_types ? kv->spans[si].type : kv->type;
        const bool quant = ty == TRI_DTYPE_Q8_0 || ty == TRI_DTYPE_Q4_0;
        if (tri__cuda_kv_kind(ty) < 0)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda attention: %s keys", tri_dtype_name(ty));
        if (quant && hd % TRI_QK != 0)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda attention: %s keys with head_dim %lld", tri_dtype_name(ty),
                             (long long)hd);
        if (!kv->span_types || kv->spans[si].n > 0) kinds |= 1u << tri__cuda_kv_kind(ty);
    }
    for (int32_t si = 0; si < n_spans; si++) {
        const tri__kv_span *sp = &kv->spans[si];
        const tri_dtype ty = tri__kv_span_type(kv, sp);
        const bool quant = ty == TRI_DTYPE_Q8_0 || ty == TRI_DTYPE_Q4_0;
        if (sp->n < 0 || (sp->n > 0 && sp->stride < hd) || (quant && sp->n > 0 && sp->stride % TRI_QK != 0))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda attention: span %d has %d rows of stride %lld", si, sp->n,
                             (long long)sp->stride);
        // A row the kernels read at a misaligned address would be a misaligned-address fault:
        // a sticky error that ends the context. Every type's rows are refused here instead (f32
        // 4-byte, f16 and the 2-byte scales of q8_0 / q4_0 blocks 2-byte aligned).
        const size_t al = ty == TRI_DTYPE_F32 ? 4 : 2;
        if (sp->n > 0 && (!aligned(sp->k, al) || !aligned(sp->v, al)))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "cuda attention: span %d of %s rows at k %p, v %p: not %zu-byte aligned", si,
                             tri_dtype_name(ty), sp->k, sp->v, al);
        if (sp->pos) n_pos += sp->n;
        n_keys += sp->n;
    }
    if (n_pos > INT32_MAX) return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda attention: %lld explicit positions", (long long)n_pos);
    if (m == 0) return TRI_STATUS_OK;
    int64_t g = n_head / nkv;
    USE_DEVICE(st);

    // Keys per chunk: 256, halved while the grid would not fill the GPU twice over or the block's
    // shared memory would not fit.
    int32_t C = 256;
    int64_t n_chunks = 0;
    for (;;) {
        n_chunks = 0;
        for (int64_t h = 0; h < nkv; h++) n_chunks += head_chunks(kv, h, C, 0, NULL, NULL);
        bool fits = tri__cuda_attn_smem(g, hd, C) != 0;
        if (C <= 16 || (fits && n_chunks * m >= 2 * (int64_t)st->sm_count)) break;
        C /= 2;
    }
    if (tri__cuda_attn_smem(g, hd, C) == 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda attention: %lld query heads per KV head of dim %lld do not fit a block",
                         (long long)g, (long long)hd);
    if (n_chunks > INT32_MAX) return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda attention: %lld chunks", (long long)n_chunks);

    // One upload: q_pos | head_span | head_chunk | positions | spans | chunks | tree masks | the
    // chunks' order by kind and their kinds (a view of several row types; the kinds travel unread)
    size_t o_qpos = 0, o_hs = align16(sizeof(int32_t) * (size_t)m);
    size_t o_hc = o_hs + align16(sizeof(int32_t) * (size_t)(nkv + 1));
    size_t o_pos = o_hc + align16(sizeof(int32_t) * (size_t)(nkv + 1));
    size_t o_sp = o_pos + align16(sizeof(int32_t) * (size_t)n_pos);
    size_t o_ch = o_sp + align16(sizeof(tri__cuda_span) * (size_t)n_spans);
    size_t o_tree = o_ch + align16(sizeof(tri__cuda_chunk) * (size_t)n_chunks);
    const tri__kv_tree *tree = kv->tree;
    size_t tree_bytes = tree ? sizeof(uint32_t) * (size_t)tree->n * (size_t)tree->words : 0;
    const bool several = (kinds & (kinds - 1)) != 0;
    size_t o_ord = o_tree + align16(tree_bytes);
    size_t o_kind = o_ord + (several ? sizeof(int32_t) * (size_t)n_chunks : 0);
    size_t bytes = o_kind + (several ? (size_t)n_chunks : 0);
    unsigned char *h, *d;
    TRY(upload_begin(st, bytes, &h));
    uint8_t *kind_of = several ? h + o_kind : NULL;  // (n_chunks) each chunk's kind
    if (!q_pos_dev) memcpy(h + o_qpos, q_pos, sizeof(int32_t) * (size_t)m);
    memcpy(h + o_hs, kv->head_span, sizeof(int32_t) * (size_t)(nkv + 1));
    int32_t *hc = (int32_t *)(h + o_hc), *pos = (int32_t *)(h + o_pos);
    tri__cuda_span *sp = (tri__cuda_span *)(h + o_sp);
    tri__cuda_chunk *ch = (tri__cuda_chunk *)(h + o_ch);
    int64_t key = 0, np = 0, nc = 0;
    for (int64_t hh = 0; hh < nkv; hh++) {
        int64_t first = key;
        for (int32_t si = kv->head_span[hh]; si < kv->head_span[hh + 1]; si++) {
            const tri__kv_span *s = &kv->spans[si];
            sp[si] = tri__cuda_span{s->k, s->v, s->stride, key, s->pos0, s->n, s->pos ? (int32_t)np : -1, 0};
            if (s->pos) {
                memcpy(pos + np, s->pos, sizeof(int32_t) * (size_t)s->n);
                np += s->n;
            }
            key += s->n;
        }
        hc[hh] = (int32_t)nc;
        nc += head_chunks(kv, hh, C, first, ch + nc, kind_of ? kind_of + nc : NULL);
    }
    hc[nkv] = (int32_t)nc;
    TRI_ASSERT(nc == n_chunks && key == n_keys && np == n_pos);
    if (tree) memcpy(h + o_tree, tree->anc, tree_bytes);
    int32_t kind_n[TRI_CUDA_KV_KINDS] = {0}, kind_0[TRI_CUDA_KV_KINDS] = {0};
    if (several) {  // chunk ids grouped by kind, each kind's in chunk order
        for (int64_t c = 0; c < n_chunks; c++) kind_n[kind_of[c]]++;
        for (int k = 1; k < TRI_CUDA_KV_KINDS; k++) kind_0[k] = kind_0[k - 1] + kind_n[k - 1];
        int32_t *ord = (int32_t *)(h + o_ord), fill[TRI_CUDA_KV_KINDS];
        memcpy(fill, kind_0, sizeof fill);
        for (int64_t c = 0; c < n_chunks; c++) ord[fill[kind_of[c]]++] = (int32_t)c;
    } else {
        for (int k = 0; k < TRI_CUDA_KV_KINDS; k++)
            if (kinds & (1u << k)) kind_n[k] = (int32_t)n_chunks;
    }
    TRY(upload_finish(st, bytes, &d));

    tri__cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.q_pos = q_pos_dev ? q_pos : (const int32_t *)(d + o_qpos);
    a.head_span = (const int32_t *)(d + o_hs);
    a.head_chunk = (const int32_t *)(d + o_hc);
    a.pos = (const int32_t *)(d + o_pos);
    a.spans = (const tri__cuda_span *)(d + o_sp);
    a.chunks = (const tri__cuda_chunk *)(d + o_ch);
    a.m = m, a.n_head = n_head, a.hd = hd, a.group = g, a.n_chunks = n_chunks;
    a.chunk_keys = C;
    a.scale = 1.0f / sqrtf((float)hd);
    a.softcap = kv->softcap;
    a.chunk_order = several ? (const int32_t *)(d + o_ord) : NULL;
    memcpy(a.kind_n, kind_n, sizeof kind_n);
    memcpy(a.kind_0, kind_0, sizeof kind_0);
    a.state = state;
    if (tree) {
        a.tree_anc = (const uint32_t *)(d + o_tree);
        a.tree_row0 = tree->row0, a.tree_n = tree->n, a.tree_words = tree->words;
    }

    // Scratch: stats (m, n_head, 2) | partials of a tile of mt queries, sized to limits.attn_partial_bytes.
    size_t per_query = sizeof(float) * (size_t)(n_chunks > 0 ? n_chunks : 1) * (size_t)(g * (hd + 2));
    int64_t mt = (int64_t)(st->limits.attn_partial_bytes / per_query);
    if (mt < 1) mt = 1;
    if (mt > m) mt = m;
    size_t s_stats = align16(sizeof(float) * 2 * (size_t)(m * n_head));
    size_t s_o = align16(sizeof(float) * (size_t)(n_chunks * mt * g * hd));
    size_t s_ml = sizeof(float) * (size_t)(n_chunks * mt * g * 2);
    unsigned char *scr;
    TRY(scratch_get(st, s_stats + s_o + s_ml, &scr));
    a.stats = (float *)scr;
    a.part_o = (float *)(scr + s_stats);
    a.part_ml = (float *)(scr + s_stats + s_o);
    for (int64_t i0 = 0; i0 < m; i0 += mt)
        LAUNCH(tri__cuda_attention(out, &a, i0, m - i0 < mt ? m - i0 : mt, st->stream));
    if (weight_sums) LAUNCH(tri__cuda_attn_weight_sums(weight_sums, &a, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_attention(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                 int64_t n_head, int64_t hd, const tri__kv_view *kv, float *weight_sums) {
    return attention_run(be, out, NULL, q, q_pos, false, m, n_head, hd, kv, weight_sums);
}

// The state of the first chunks of a split attention (backend.h): the combine's max, sum and
// unnormalised accumulator. Its fold (one max over the chunks) differs from the CPU's in rounding
// only; the host folds its own chunks after it.
static tri_status cuda_attention_state(tri__backend *be, float *state, const float *q, const int32_t *q_pos, int64_t m,
                                       int64_t n_head, int64_t hd, const tri__kv_view *kv) {
    return attention_run(be, NULL, state, q, q_pos, false, m, n_head, hd, kv, NULL);
}

// ---- gathering ----

static tri_status cuda_gather(tri__backend *be, void *dst, const void *src, const int64_t *offsets, int64_t n,
                              int64_t row_bytes) {
    cuda_state *st = priv(be);
    if (n < 0 || row_bytes <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda gather: %lld rows of %lld bytes", (long long)n,
                         (long long)row_bytes);
    bool words = row_bytes % 4 == 0 && aligned(dst, 4) && aligned(src, 4);
    for (int64_t i = 0; i < n; i++) {
        if (offsets[i] < 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda gather: offset %lld of row %lld",
                             (long long)offsets[i], (long long)i);
        words = words && offsets[i] % 4 == 0;
    }
    if (n == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    unsigned char *d;
    TRY(upload_array(st, offsets, sizeof(int64_t) * (size_t)n, &d));
    LAUNCH(tri__cuda_gather(dst, src, (const int64_t *)d, n, row_bytes, words, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_chunk_mean(tri__backend *be, float *out, const void *x, tri_dtype type, int64_t n_chunks,
                                  int64_t chunk, int64_t width, int64_t stride) {
    cuda_state *st = priv(be);
    const bool quant = type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;  // a quantized cache's blocks
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32 && !quant)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda chunk_mean: %s rows", tri_dtype_name(type));
    if (n_chunks < 0 || chunk <= 0 || width < 0 || stride < width || (quant && stride % TRI_QK != 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "cuda chunk_mean: %lld chunks of %lld rows, width %lld, stride %lld", (long long)n_chunks,
                         (long long)chunk, (long long)width, (long long)stride);
    if (!aligned(x, elem_align(type))) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda chunk_mean: misaligned rows");
    if (n_chunks == 0 || width == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    LAUNCH(tri__cuda_chunk_mean(out, x, type, n_chunks, chunk, width, stride, st->stream));
    return TRI_STATUS_OK;
}

// ---- the transfer stream ----

static cudaStream_t stream_of(cuda_state *st, tri__stream s) { return s == TRI_STREAM_TRANSFER ? st->xfer : st->stream; }

static tri_status cuda_event_create(tri__backend *be, tri__event **out) {
    cuda_state *st = priv(be);
    USE_DEVICE(st);
    cudaEvent_t ev;
    CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = (tri__event *)ev;
    return TRI_STATUS_OK;
}

static void cuda_event_destroy(tri__backend *be, tri__event *ev) {
    if (!ev) return;
    cuda_state *st = priv(be);
    if (cudaSetDevice(st->device) != cudaSuccess || cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
        tri__log(TRI_LOG_LEVEL_ERROR, "cuda: event destroy: %s", cudaGetErrorString(cudaGetLastError()));
}

static tri_status cuda_event_record(tri__backend *be, tri__event *ev, tri__stream s) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "an event");
    USE_DEVICE(st);
    CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, stream_of(st, s)));
    return TRI_STATUS_OK;
}

static tri_status cuda_stream_wait(tri__backend *be, tri__stream s, tri__event *ev) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "an event wait");
    USE_DEVICE(st);
    CUDA_TRY(cudaStreamWaitEvent(stream_of(st, s), (cudaEvent_t)ev, 0));
    return TRI_STATUS_OK;
}

static tri_status cuda_event_synchronize(tri__backend *be, tri__event *ev) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "an event");
    USE_DEVICE(st);
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
    return TRI_STATUS_OK;
}

static tri_status cuda_transfer_to_backend(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0) return TRI_STATUS_OK;
    NOT_RECORDING(st, "a transfer");
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->xfer));
    return TRI_STATUS_OK;
}

static tri_status cuda_transfer_to_host(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0) return TRI_STATUS_OK;
    NOT_RECORDING(st, "a transfer");
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->xfer));
    return TRI_STATUS_OK;
}

static tri_status cuda_host_register(tri__backend *be, void *ptr, size_t bytes) {
    cuda_state *st = priv(be);
    USE_DEVICE(st);
    CUDA_TRY(tri__cuda_host_register(ptr, bytes, cudaHostRegisterPortable));
    return TRI_STATUS_OK;
}

static void cuda_host_unregister(tri__backend *be, void *ptr) {
    cuda_state *st = priv(be);
    if (cudaSetDevice(st->device) != cudaSuccess || cudaHostUnregister(ptr) != cudaSuccess)
        tri__log(TRI_LOG_LEVEL_ERROR, "cuda: host unregister of %p: %s", ptr, cudaGetErrorString(cudaGetLastError()));
}

// ---- several devices ----

static bool cuda_peer_enable(tri__backend *be, tri__backend *other) {
    if (!other || other == be || other->ops != be->ops) return false;
    cuda_state *a = priv(be), *b = priv(other);
    int can = 0;
    if (a->device == b->device || cudaDeviceCanAccessPeer(&can, a->device, b->device) != cudaSuccess || !can ||
        cudaSetDevice(a->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaError_t err = cudaDeviceEnablePeerAccess(b->device, 0);
    (void)cudaGetLastError();  // already enabled (another session) counts as enabled
    return err == cudaSuccess || err == cudaErrorPeerAccessAlreadyEnabled;
}

static tri_status cuda_copy_peer(tri__backend *be, void *dst, tri__backend *other, const void *src, size_t bytes) {
    cuda_state *st = priv(be);
    if (bytes == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    CUDA_TRY(cudaMemcpyPeerAsync(dst, st->device, src, priv(other)->device, bytes, st->stream));
    return TRI_STATUS_OK;
}

// ---- collectives: NCCL, loaded at run time ----
//
// libnccl.so.2 is opened on the first communicator (so a machine without NCCL runs everything
// else, and the tensor-parallel all-reduce goes through host memory there); the emulated build
// calls the emulator's NCCL (tests/cudaemu/include/nccl.h) instead.

#if TRI_CUDA_EMULATED
#include <nccl.h>
#else
// The part of NCCL 2.x's API used, as nccl.h declares it, so that the module builds without NCCL.
typedef struct ncclComm *ncclComm_t;
typedef enum : int { ncclSuccess = 0 } ncclResult_t;
typedef enum : int { ncclSum = 0 } ncclRedOp_t;
typedef enum : int { ncclFloat32 = 7 } ncclDataType_t;
#endif

typedef struct nccl_api {
    ncclResult_t (*get_version)(int *version);
    ncclResult_t (*comm_init_all)(ncclComm_t *comms, int n, const int *devlist);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
    const char *(*get_error_string)(ncclResult_t result);
} nccl_api;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static nccl_api nccl;       // all set, or nccl_why says why not
static char nccl_why[512];

static void nccl_load(void) {
#if TRI_CUDA_EMULATED
    nccl = nccl_api{ncclGetVersion, ncclCommInitAll, ncclCommDestroy, ncclAllReduce, ncclGetErrorString};
#else
    // RTLD_LOCAL: NCCL stays out of the process's symbol scope, as the module does
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_why, sizeof nccl_why, "NCCL is not installed (libnccl.so.2: %s)", dlerror());
        return;
    }
    nccl_api a;
    a.get_version = (ncclResult_t(*)(int *))dlsym(h, "ncclGetVersion");
    a.comm_init_all = (ncclResult_t(*)(ncclComm_t *, int, const int *))dlsym(h, "ncclCommInitAll");
    a.comm_destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
    a.all_reduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                    cudaStream_t))dlsym(h, "ncclAllReduce");
    a.get_error_string = (const char *(*)(ncclResult_t))dlsym(h, "ncclGetErrorString");
    if (!a.get_version || !a.comm_init_all || !a.comm_destroy || !a.all_reduce || !a.get_error_string) {
        snprintf(nccl_why, sizeof nccl_why, "libnccl.so.2 lacks the functions of NCCL 2");
        dlclose(h);
        return;
    }
    nccl = a;  // h stays open: communicators may live as long as the process
#endif
}

struct tri__comm {
    int n;
    ncclComm_t *comms;  // (n) rank r's
};

static tri_status nccl_status(ncclResult_t r, const char *file, int line, const char *expr) {
    if (r == ncclSuccess) return TRI_STATUS_OK;
    (void)cudaGetLastError();
    return tri__fail(TRI_STATUS_DEVICE, "%s:%d: %s: %s", file, line, expr, nccl.get_error_string(r));
}
#define NCCL_TRY(call)                                                                         \
    do {                                                                                       \
        tri_status st__ = nccl_status((call), __FILE__, __LINE__, #call);                      \
        if (st__ != TRI_STATUS_OK) return st__;                                                \
    } while (0)

static void cuda_comm_free(tri__comm *c) {
    if (!c) return;
    for (int r = 0; r < c->n; r++)
        if (c->comms[r] && nccl.comm_destroy(c->comms[r]) != ncclSuccess)
            tri__log(TRI_LOG_LEVEL_ERROR, "cuda: ncclCommDestroy of rank %d failed", r);
    free(c->comms);
    free(c);
}

static tri_status cuda_allreduce(tri__backend *be, tri__comm *c, int32_t rank, float *x, int64_t n) {
    cuda_state *st = priv(be);
    if (!c || rank < 0 || rank >= c->n || n < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda allreduce: rank %d of %d, %lld elements", rank,
                         c ? c->n : 0, (long long)n);
    if (!aligned(x, 4)) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda allreduce: misaligned x");
    if (n == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    NCCL_TRY(nccl.all_reduce(x, x, (size_t)n, ncclFloat32, ncclSum, c->comms[rank], st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_comm_create(tri__backend *const *bes, int32_t n, tri__comm **out) {
    *out = NULL;
    if (n < 2 || n > 64) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda: a communicator of %d ranks", n);
    int devs[64];
    for (int32_t r = 0; r < n; r++) {
        if (!bes[r] || bes[r]->ops->allreduce != cuda_allreduce)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda: rank %d of a communicator is not a CUDA device", r);
        devs[r] = priv(bes[r])->device;
        for (int32_t q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda: ranks %d and %d of a communicator share device %d",
                                 q, r, devs[r]);
    }
    const char *off = getenv("TRI_NO_NCCL");
    if (off && *off && strcmp(off, "0") != 0)
        return tri__fail(TRI_STATUS_NOT_FOUND, "NCCL is turned off (TRI_NO_NCCL)");
    pthread_once(&nccl_once, nccl_load);
    if (!nccl.all_reduce) return tri__fail(TRI_STATUS_NOT_FOUND, "%s", nccl_why);
    tri__comm *c = (tri__comm *)calloc(1, sizeof *c);
    if (c) c->comms = (ncclComm_t *)calloc((size_t)n, sizeof *c->comms);
    if (!c || !c->comms) {
        free(c);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda: a communicator of %d ranks", n);
    }
    ncclResult_t r = nccl.comm_init_all(c->comms, n, devs);
    if (r != ncclSuccess) {
        free(c->comms);
        free(c);
        return nccl_status(r, __FILE__, __LINE__, "ncclCommInitAll");
    }
    c->n = n;
    int v = 0;
    if (nccl.get_version(&v) == ncclSuccess && v >= 10000)  // 2.9 on: major * 10000 + minor * 100 + patch
        tri__log(TRI_LOG_LEVEL_INFO, "cuda: NCCL %d.%d.%d over %d devices", v / 10000, v / 100 % 100, v % 100, n);
    else
        tri__log(TRI_LOG_LEVEL_INFO, "cuda: NCCL over %d devices", n);
    *out = c;
    return TRI_STATUS_OK;
}

// ---- steps driven from device memory, and graphs ----

static tri_status cuda_get_rows_dev(tri__backend *be, float *out, const void *table, tri_dtype type, int64_t n_rows,
                                    int64_t n, const int32_t *ids, int64_t m) {
    cuda_state *st = priv(be);
    int64_t row_bytes = tri__dtype_row_bytes(type, n);
    if (row_bytes <= 0 || n_rows < 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda get_rows_dev: %s rows of %lld elements",
                         tri_dtype_name(type), (long long)n);
    if (!aligned(table, elem_align(type)) || !aligned(ids, 4))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda get_rows_dev: misaligned table or ids");
    if (m == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    LAUNCH(tri__cuda_get_rows(out, table, type, row_bytes, n, ids, m, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_rope_dev(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                                const tri__rope *rope) {
    return rope_run(be, x, m, n_heads, pos, true, rope);
}

static tri_status cuda_attention_dev(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                     int64_t n_head, int64_t hd, const tri__kv_view *kv) {
    return attention_run(be, out, NULL, q, q_pos, true, m, n_head, hd, kv, NULL);
}

static tri_status cuda_set_rows(tri__backend *be, void *dst, tri_dtype type, const float *src, const int32_t *rows,
                                int64_t m, int64_t n) {
    cuda_state *st = priv(be);
    bool quant = type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;  // a quantized cache's rows
    if (type != TRI_DTYPE_F32 && type != TRI_DTYPE_F16 && type != TRI_DTYPE_BF16 && !quant)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cuda set_rows: to %s", tri_dtype_name(type));
    if (m < 0 || n < 0 || (quant && n % TRI_QK != 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda set_rows: %lld rows of %lld%s", (long long)m, (long long)n,
                         quant ? " (whole blocks of 32)" : "");
    if (!aligned(dst, elem_align(type)) || !aligned(rows, 4))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda set_rows: misaligned rows");
    if (m == 0 || n == 0) return TRI_STATUS_OK;
    USE_DEVICE(st);
    LAUNCH(tri__cuda_set_rows(dst, type, src, rows, m, n, st->stream));
    return TRI_STATUS_OK;
}

static tri_status cuda_window_rows(tri__backend *be, int32_t *state, int32_t *rows, int32_t view_rows,
                                   const tri__stream_window *w) {
    cuda_state *st = priv(be);
    int32_t e = w->evict_every > 1 ? w->evict_every : 1;
    if (w->sink < 0 || w->sink >= w->budget || w->ring_rows < 0 || view_rows < w->budget + e)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda window_rows: sink %d, budget %d, evict_every %d, view of %d",
                         w->sink, w->budget, w->evict_every, view_rows);
    USE_DEVICE(st);
    LAUNCH(tri__cuda_window_rows(state, rows, view_rows, w, st->stream));
    return TRI_STATUS_OK;
}

static void graph_release(tri__graph *g) {
    if (!g) return;
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    if (g->graph) (void)cudaGraphDestroy(g->graph);
    for (int i = 0; i < g->n_bufs; i++) (void)cudaFree(g->bufs[i]);
    free(g->bufs);
    free(g);
}

static tri_status cuda_graph_begin(tri__backend *be) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "graph_begin");
    USE_DEVICE(st);
    tri__graph *g = (tri__graph *)calloc(1, sizeof *g);
    if (!g) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda graph");
    // relaxed: recording may allocate its buffers and copy descriptors on the transfer stream
    cudaError_t err = cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeRelaxed);
    if (err != cudaSuccess) {
        free(g);
        return tri__fail(tri__cuda_status(err, __FILE__, __LINE__, "cudaStreamBeginCapture"), "cuda graph: %s",
                         tri_last_error());
    }
    st->rec = g;
    return TRI_STATUS_OK;
}

static tri_status cuda_graph_end(tri__backend *be, tri__graph **out) {
    cuda_state *st = priv(be);
    *out = NULL;
    if (!st->rec) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda graph_end: not recording");
    tri__graph *g = st->rec;
    st->rec = NULL;
    USE_DEVICE(st);
    cudaError_t err = cudaStreamEndCapture(st->stream, &g->graph);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (err != cudaSuccess) {
        tri_status s = tri__cuda_status(err, __FILE__, __LINE__, "cudaStreamEndCapture / cudaGraphInstantiate");
        graph_release(g);
        return s;
    }
    *out = g;
    return TRI_STATUS_OK;
}

static tri_status cuda_graph_launch(tri__backend *be, tri__graph *g) {
    cuda_state *st = priv(be);
    NOT_RECORDING(st, "graph_launch");
    USE_DEVICE(st);
    CUDA_TRY(cudaGraphLaunch(g->exec, st->stream));
    st->err_armed = true;  // a recorded softmax may set the flag
    return TRI_STATUS_OK;
}

static void cuda_graph_free(tri__backend *be, tri__graph *g) {
    if (!g) return;
    cuda_state *st = priv(be);
    if (cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    graph_release(g);
}

// ---- the table ----

static const tri__backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cuda_destroy,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .copy_to_backend = */ cuda_copy_to_backend,
    /* .copy_to_host = */ cuda_copy_to_host,
    /* .copy = */ cuda_copy,
    /* .synchronize = */ cuda_synchronize,
    /* .matmul = */ cuda_matmul,
    /* .get_rows = */ cuda_get_rows,
    /* .convert = */ cuda_convert,
    /* .rmsnorm = */ cuda_rmsnorm,
    /* .rope = */ cuda_rope,
    /* .swiglu = */ cuda_swiglu,
    /* .add = */ cuda_add,
    /* .softmax = */ cuda_softmax,
    /* .top_k = */ cuda_top_k,
    /* .attention = */ cuda_attention,
    /* .event_create = */ cuda_event_create,
    /* .event_destroy = */ cuda_event_destroy,
    /* .event_record = */ cuda_event_record,
    /* .stream_wait = */ cuda_stream_wait,
    /* .transfer_to_backend = */ cuda_transfer_to_backend,
    /* .transfer_to_host = */ cuda_transfer_to_host,
    /* .host_register = */ cuda_host_register,
    /* .host_unregister = */ cuda_host_unregister,
    /* .event_synchronize = */ cuda_event_synchronize,
    /* .gather = */ cuda_gather,
    /* .chunk_mean = */ cuda_chunk_mean,
    /* .attention_state = */ cuda_attention_state,
    /* .host_work = */ NULL,
    /* .geglu = */ cuda_geglu,
    /* .scale = */ cuda_scale,
    /* .add_rows = */ cuda_add_rows,
    /* .peer_enable = */ cuda_peer_enable,
    /* .copy_peer = */ cuda_copy_peer,
    /* .comm_create = */ cuda_comm_create,
    /* .comm_free = */ cuda_comm_free,
    /* .allreduce = */ cuda_allreduce,
    /* .get_rows_dev = */ cuda_get_rows_dev,
    /* .rope_dev = */ cuda_rope_dev,
    /* .attention_dev = */ cuda_attention_dev,
    /* .set_rows = */ cuda_set_rows,
    /* .window_rows = */ cuda_window_rows,
    /* .graph_begin = */ cuda_graph_begin,
    /* .graph_end = */ cuda_graph_end,
    /* .graph_launch = */ cuda_graph_launch,
    /* .graph_free = */ cuda_graph_free,
    /* .caps = */ TRI_BACKEND_CAP_TREES | TRI_BACKEND_CAP_QUANT_KV | TRI_BACKEND_CAP_TYPED_VIEWS,
    /* .pci_bus_id = */ tri__backend_cuda_pci_bus_id,
};

static tri_status create(int device, tri__backend *be, cuda_state *st) {
    st->device = device;
    st->limits.attn_partial_bytes = PARTIAL_BUDGET;
    st->limits.topk_key_bytes = TOPK_BUDGET;
    st->limits.dequant_elems = DEQUANT_CHUNK;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, device));
    CUDA_TRY(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaStreamCreateWithFlags(&st->xfer, cudaStreamNonBlocking));
    CUBLAS_TRY(cublasCreate(&st->cublas));
    CUBLAS_TRY(cublasSetStream(st->cublas, st->stream));
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
        (void)cudaGetLastError();  // an old driver: no pools, cudaMalloc
        pools = 0;
    }
    st->mem_pools = pools != 0;
    CUDA_TRY(tri__cuda_host_alloc((void **)&st->err_host, sizeof(int), cudaHostAllocDefault));
    *st->err_host = 0;
    CUDA_TRY(tri__cuda_malloc((void **)&st->err_dev, sizeof(int)));
    CUDA_TRY(cudaMemsetAsync(st->err_dev, 0, sizeof(int), st->stream));
    for (int i = 0; i < UPLOAD_SLOTS; i++) CUDA_TRY(cudaEventCreateWithFlags(&st->slots[i].done, cudaEventDisableTiming));
    be->ops = &cuda_ops;
    be->n_threads = 1;
    be->priv = st;
    return TRI_STATUS_OK;
}

extern "C" tri_status tri__backend_cuda_create(int device, tri__backend **out) {
    *out = NULL;
    int count = tri__cuda_device_count();
    if (device < 0 || device >= count)
        return tri__fail(TRI_STATUS_DEVICE, "cuda backend: device %d does not exist (%d device%s)", device, count,
                         count == 1 ? "" : "s");
    tri__backend *be = (tri__backend *)calloc(1, sizeof *be);
    cuda_state *st = (cuda_state *)calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cuda backend: instance");
    }
    be->priv = st;
    be->ops = &cuda_ops;
    tri_status s = create(device, be, st);
    if (s != TRI_STATUS_OK) {
        cuda_destroy(be);  // releases whatever create() made; every field starts zeroed
        return s;
    }
    *out = be;
    return TRI_STATUS_OK;
}

extern "C" tri_status tri__backend_cuda_pci_bus_id(const tri__backend *be, char *out, size_t n) {
    if (n > 0) out[0] = 0;
    if (!be || be->ops != &cuda_ops) return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' is not a CUDA device",
                                                      be ? be->ops->name : "(null)");
    if (n < 13 || n > INT_MAX)  // "dddd:bb:dd.f" and its terminator
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda: PCI bus id buffer of %zu bytes", n);
    const cuda_state *st = (const cuda_state *)be->priv;
    CUDA_TRY(cudaDeviceGetPCIBusId(out, (int)n, st->device));
    return TRI_STATUS_OK;
}

extern "C" tri_status tri__backend_cuda_set_limits(tri__backend *be, const tri__cuda_limits *limits) {
    if (!be || be->ops != &cuda_ops)
        return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' is not a CUDA device", be ? be->ops->name : "(null)");
    if (!limits) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cuda: NULL limits");
    cuda_state *st = priv(be);
    if (limits->attn_partial_bytes) st->limits.attn_partial_bytes = limits->attn_partial_bytes;
    if (limits->topk_key_bytes) st->limits.topk_key_bytes = limits->topk_key_bytes;
    if (limits->dequant_elems > 0) st->limits.dequant_elems = limits->dequant_elems;
    return TRI_STATUS_OK;
}
