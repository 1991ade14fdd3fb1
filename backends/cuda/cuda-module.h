// cuda-module.h - the boundary between the library and its CUDA module (internal).
//
// The CUDA backend is built as a module of its own, libtriforce-cuda.so, that the library loads
// with dlopen the first time a CUDA device is asked for (cuda-loader.c). So libtriforce.so and
// offload-run link neither the CUDA runtime nor cuBLAS: they load and run on a machine without
// them, and a CPU run never maps cuBLAS (which alone costs ~118 MB of RSS).
//
// Only one symbol crosses the boundary, TRI_CUDA_MODULE_ENTRY. The library hands the module the
// few of its functions the CUDA code calls (errors, logging, dtype sizes), and the module hands
// back its entry points. Both sides share core/backend.h's structures, so a module is only
// accepted by a library of the same version and the same structure sizes.
#ifndef TRI_CUDA_MODULE_H
#define TRI_CUDA_MODULE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRI_CUDA_MODULE_NAME "libtriforce-cuda.so"
#define TRI_CUDA_MODULE_ENTRY "tri__cuda_module_open"

// What the library lends the module.
typedef struct tri__cuda_host {
    const char *version;  // TRI_VERSION of the library
    size_t backend_size;  // sizeof(tri__backend)
    size_t ops_size;      // sizeof(tri__backend_ops)
    tri_status (*vfail)(tri_status status, const char *fmt, va_list ap);
    void (*vlog)(tri_log_level level, const char *fmt, va_list ap);
    const char *(*last_error)(void);
    void (*assert_fail)(const char *file, int line, const char *expr);
    int64_t (*dtype_row_bytes)(tri_dtype type, int64_t n);
    bool (*dtype_is_quantized)(tri_dtype type);
    const char *(*dtype_name)(tri_dtype type);
    bool (*fault_hit)(unsigned kind);  // the fault-injection countdown (core/fault.h)
} tri__cuda_host;

// What the module gives back: cuda-backend.h's functions, and a line that says what it is.
typedef struct tri__cuda_module {
    // Devices usable; 0 with the reason written into why (n bytes): no driver, a driver older
    // than the runtime, no device.
    int (*device_count)(char *why, size_t n);
    tri_status (*device_info_get)(int device, tri__cuda_device_info *out);
    tri_status (*backend_create)(int device, tri__backend **out);
    tri_status (*pci_bus_id)(const tri__backend *be, char *out, size_t n);
    tri_status (*set_limits)(tri__backend *be, const tri__cuda_limits *limits);
    const char *build;  // "CUDA runtime 13.0, SASS sm_80 sm_86 ..., PTX compute_120"
} tri__cuda_module;

// The module's one exported function. NULL when it cannot serve this library (another version,
// other structure sizes), with the reason in why (n bytes).
typedef const tri__cuda_module *(*tri__cuda_module_open_fn)(const tri__cuda_host *host, char *why, size_t n);

#ifdef __cplusplus
}
#endif

#endif  // TRI_CUDA_MODULE_H
