// nccl.h - the part of NCCL's API that our CUDA module calls, implemented by the emulator
// (cudaemu.cpp, "NCCL"): communicators made for several devices at once, the in-place f32 sum
// over them queued on each rank's stream, and the error strings. Values as NCCL 2.x defines them.
#ifndef CUDAEMU_NCCL_H
#define CUDAEMU_NCCL_H

#include <stddef.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
} ncclResult_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum { ncclFloat32 = 7 } ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
// One communicator per device of devlist (n of them, distinct), rank i on devlist[i].
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// recv (count) = the sum over the ranks of their send (count), queued on stream (a stream of the
// communicator's device); send may equal recv. Every rank must make the same calls in the same order.
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
const char *ncclGetErrorString(ncclResult_t result);

#ifdef __cplusplus
}
#endif

#endif  // CUDAEMU_NCCL_H
