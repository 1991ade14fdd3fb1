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

// CUDA's version numbers, 13000 for 13.0.
static void version_str(int v, char *out, size_t n) { snprintf(out, n, "%d.%d", v / 1000, v % 1000 / 10); }

// Devices usable in this process, and why there are none. cudaGetDeviceCount reports a missing
// driver and a driver older than the runtime alike (cudaErrorInsufficientDriver); the driver's
// version tells them apart.
extern "C" int tri__cuda_module_device_count(char *why, size_t n) {
    if (n > 0) why[0] = 0;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return count;
    (void)cudaGetLastError();  // not left for the next launch check
    int drv = 0, rt = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaGetLastError();
    char d[16], r[16];
    version_str(drv, d, sizeof d);
    version_str(rt, r, sizeof r);
    if (err == cudaSuccess || err == cudaErrorNoDevice)
        snprintf(why, n, "no CUDA device (NVIDIA driver for CUDA %s present)", d);
    else if (err == cudaErrorInsufficientDriver && drv == 0)
        snprintf(why, n, "no NVIDIA driver (libcuda.so.1 not found)");
    else if (err == cudaErrorInsufficientDriver)
        snprintf(why, n, "the NVIDIA driver supports CUDA %s, older than this build's CUDA runtime %s: update the driver",
                 d, r);
    else
        snprintf(why, n, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    return 0;
}

extern "C" int tri__cuda_device_count(void) {
    char why[256];
    return tri__cuda_module_device_count(why, sizeof why);
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
