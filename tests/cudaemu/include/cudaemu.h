// cudaemu.h - a small CUDA-on-CPU emulator for checking triforce's backends/cuda/*.cu without a GPU.
//
// Device model: every CUDA thread of a block is a fiber with its own stack; a block runs on the
// host thread, fibers in a chosen order (CUDAEMU_SCHED=fwd|rev|rand), each until its next sync
// point (__syncthreads, a warp shuffle) or its end. Warp shuffles exchange values among the lanes
// of a 32-thread warp once every lane named in the mask is at the same shuffle; a lane that is
// missing (exited, at another call site or at a barrier) is reported as a divergence, as is a
// __syncthreads that not every live thread reaches at the same site, and a deadlock.
// Device memory is host memory (malloc), so AddressSanitizer sees device out-of-bounds accesses.
// Streams are deferred queues (CUDAEMU_ASYNC=1, default): work runs only when a synchronizing
// call, an event wait or a pageable copy needs it, so a missing stream/event dependency shows.
#ifndef CUDAEMU_H
#define CUDAEMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

// ---- language ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
    dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

// ---- runtime types ----
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorPeerAccessUnsupported = 217,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef struct cudaemu_stream *cudaStream_t;
typedef struct cudaemu_event *cudaEvent_t;
typedef struct cudaemu_graph *cudaGraph_t;
typedef struct cudaemu_graph_exec *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                               cudaStreamCaptureStatusInvalidated = 2 };

enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMemoryPoolsSupported = 115
};
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int major, minor;
    int multiProcessorCount;
    int pciBusID, pciDeviceID, pciDomainID;
};

// The runtime this emulates (CUDA 13.0); CUDAEMU_DRIVER=v makes the driver report version v, so
// that v < CUDART_VERSION shows what a driver too old for the runtime does.
#define CUDART_VERSION 13000

extern "C++" {
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int device);
cudaError_t cudaDeviceGetPCIBusId(char *out, int len, int device);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                                cudaStream_t s = 0);
cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t bytes);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
}

// ---- the device side ----
namespace cudaemu {

struct Thread;
struct Block {
    uint3 idx;
    dim3 dim, grid;
    unsigned char *dyn_smem;
};
// Read at every threadIdx / blockIdx: initial-exec TLS, a plain load instead of a __tls_get_addr
// call per access (the emulated module is dlopen'd, whose default TLS model is the slow one).
#define CUDAEMU_TLS __attribute__((tls_model("initial-exec"))) thread_local
extern CUDAEMU_TLS Thread *cur_thread;
extern CUDAEMU_TLS Block *cur_block;
extern CUDAEMU_TLS uint3 cur_tid;

void syncthreads(const void *site);
uint64_t shfl(unsigned mask, uint64_t v, int mode, int arg, int width, const void *site);
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
unsigned char *dyn_smem();

// A kernel launch: the body (the kernel applied to its arguments) is run for every thread of
// every block (now or when its stream is drained).
cudaError_t launch_body(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, std::function<void()> body);

template <typename... P, typename... A>
cudaError_t launch(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   void (*k)(P...), A &&...a) {
    std::tuple<typename std::decay<P>::type...> args((P)std::forward<A>(a)...);
    return launch_body(name, file, line, grid, block, smem, s, [k, args]() { std::apply(k, args); });
}

template <typename T>
inline uint64_t to_bits(T v) {
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T>
inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
}  // namespace cudaemu

#define threadIdx (::cudaemu::cur_tid)
#define blockIdx (::cudaemu::cur_block->idx)
#define blockDim (::cudaemu::cur_block->dim)
#define gridDim (::cudaemu::cur_block->grid)
static const int warpSize = 32;

#define __syncthreads() ::cudaemu::syncthreads(CUDAEMU_SITE)
#define CUDAEMU_STR2(x) #x
#define CUDAEMU_STR(x) CUDAEMU_STR2(x)
#define __syncwarp(...) ((void)0)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

// Shuffles: the call site is part of the check (every lane of the mask at the same shuffle).
#define CUDAEMU_SITE ((const void *)(__FILE__ ":" CUDAEMU_STR(__LINE__)))
#define __shfl_xor_sync(mask, v, lm, ...) ::cudaemu::shfl_t((mask), (v), 0, (lm), CUDAEMU_SITE, ##__VA_ARGS__)
#define __shfl_sync(mask, v, src, ...) ::cudaemu::shfl_t((mask), (v), 1, (src), CUDAEMU_SITE, ##__VA_ARGS__)
#define __shfl_down_sync(mask, v, d, ...) ::cudaemu::shfl_t((mask), (v), 2, (d), CUDAEMU_SITE, ##__VA_ARGS__)
#define __shfl_up_sync(mask, v, d, ...) ::cudaemu::shfl_t((mask), (v), 3, (d), CUDAEMU_SITE, ##__VA_ARGS__)
namespace cudaemu {
template <typename T>
inline T shfl_t(unsigned mask, T v, int mode, int arg, const void *site, int width = 32) {
    return from_bits<T>(shfl(mask, to_bits(v), mode, arg, width, site));
}
}  // namespace cudaemu

// ---- intrinsics ----
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
// volatile keeps the compiler from contracting these into an FMA (they are never fused in CUDA)
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomics: fibers of one host thread never run at once, but __atomic keeps them honest.
template <typename T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <typename T> inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }

#endif  // CUDAEMU_H
