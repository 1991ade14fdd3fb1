// device.cu - device discovery for the CUDA backend.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuda-backend.h"
#include "error.h"
}

// A failed call's error is also cleared from the thread's last error, so that the cudaGetLastError()
// after a later kernel launch does not report it again.
#define CUDA_CHECK_STATUS(call)                                                              \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            (void)cudaGetLastError();                                                        \
            return tri__fail(err_ == cudaErrorMemoryAllocation ? TRI_STATUS_DEVICE_OUT_OF_MEMORY \
                                                               : TRI_STATUS_DEVICE,          \
                             "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
                             cudaGetErrorString(err_));                                      \
        }                                                                                    \
    } while (0)

extern "C" int tri__cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" tri_status tri__cuda_device_info_get(int device, tri__cuda_device_info *out) {
    memset(out, 0, sizeof *out);
    cudaDeviceProp prop;
    CUDA_CHECK_STATUS(cudaGetDeviceProperties(&prop, device));
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_bytes = prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->pci_bus = prop.pciBusID;
    out->sm_count = prop.multiProcessorCount;
    if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device) != cudaSuccess) {
        (void)cudaGetLastError();
        out->pci_bus_id[0] = 0;
    }
    int prev = 0;
    CUDA_CHECK_STATUS(cudaGetDevice(&prev));
    CUDA_CHECK_STATUS(cudaSetDevice(device));
    size_t free_b = 0, total_b = 0;
    cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
    (void)cudaSetDevice(prev);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // not left for the next launch check
        return tri__fail(TRI_STATUS_DEVICE, "cudaMemGetInfo: %s", cudaGetErrorString(err));
    }
    out->free_bytes = free_b;
    return TRI_STATUS_OK;
}
