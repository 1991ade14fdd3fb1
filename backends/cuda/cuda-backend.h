// cuda-backend.h - the plain-C face of the CUDA backend (internal).
//
// No CUDA type appears here: C code includes this header, and every function exists in every
// build. In the library they reach the CUDA module, libtriforce-cuda.so, loaded on first use
// (cuda-loader.c, cuda-module.h); inside the module the CUDA code implements them. Without CUDA
// support in the build, or without the module, a driver or a device, they report that no device
// is present, and tri__cuda_unavailable says why.
#ifndef TRI_CUDA_BACKEND_H
#define TRI_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tri__backend tri__backend;

typedef struct tri__cuda_device_info {
    char name[256];
    char pci_bus_id[32];         // "0000:01:00.0" (domain:bus:device.function), "" if unknown
    uint64_t total_bytes;
    uint64_t free_bytes;
    int32_t cc_major, cc_minor;  // compute capability
    int32_t sm_count;            // streaming multiprocessors
    int32_t pcie_gen;            // current PCIe generation, 0 if unknown (filled from sysfs by engine/system.c)
    int32_t pcie_width;          // current PCIe lanes, 0 if unknown
    int32_t pci_bus;
} tri__cuda_device_info;

// Number of usable CUDA devices; 0 without a driver, a GPU or CUDA support in this build.
int tri__cuda_device_count(void);

// Why tri__cuda_device_count() is 0 ("no NVIDIA driver", "the NVIDIA driver supports CUDA 12.2,
// older than this build's CUDA runtime 13.0: update the driver", ...); "" when devices exist.
// The string lives as long as the process.
const char *tri__cuda_unavailable(void);

// What the loaded CUDA module is ("CUDA runtime 13.0, SASS sm_80 ..." or the emulator), or NULL
// when none is loaded. Loads it if that has not been tried yet.
const char *tri__cuda_module_build(void);

// Fills *out for device i; TRI_STATUS_DEVICE if it cannot be queried.
tri_status tri__cuda_device_info_get(int device, tri__cuda_device_info *out);

// Creates a CUDA backend on device (0 .. tri__cuda_device_count() - 1): its own stream, cuBLAS
// handle and scratch. Free with tri__backend_free. TRI_STATUS_DEVICE when the device does not
// exist or this build has no CUDA support.
tri_status tri__backend_cuda_create(int device, tri__backend **out);

// Writes the PCI bus id of be's device ("0000:01:00.0", cudaDeviceGetPCIBusId) into out, n bytes
// (at least 13; 32 suffice). NOT_FOUND when be is not a CUDA backend (every backend in a build
// without CUDA); DEVICE when CUDA cannot say; INVALID_ARGUMENT for a smaller buffer. out is ""
// on failure (n > 0).
tri_status tri__backend_cuda_pci_bus_id(const tri__backend *be, char *out, size_t n);

// Per-launch limits of a CUDA instance. The defaults fit a 24 GB card; tests make them small so
// that the tiled and batched paths run at test sizes. A field of 0 keeps the current value.
typedef struct tri__cuda_limits {
    size_t attn_partial_bytes;  // attention partials per launch: queries are tiled beyond it
    size_t topk_key_bytes;      // top-k sort keys in device memory per launch: rows batched beyond it
    int64_t dequant_elems;      // f16 elements of dequantized weights per GEMM (m > 16): rows chunked
} tri__cuda_limits;

// Sets be's limits (a CUDA backend's; NOT_FOUND for any other).
tri_status tri__backend_cuda_set_limits(tri__backend *be, const tri__cuda_limits *limits);

#ifdef __cplusplus
}
#endif

#endif  // TRI_CUDA_BACKEND_H
