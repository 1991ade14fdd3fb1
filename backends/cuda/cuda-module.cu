// cuda-module.cu - the entry point of libtriforce-cuda.so (cuda-module.h), and the library's
// functions the CUDA code calls, forwarded to the library that loaded the module.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "cuda-module.h"
#include "dtype.h"
#include "error.h"
#include "fault.h"
#include "tri-config.h"
}

// The library's functions, set once by tri__cuda_module_open before any other call.
static const tri__cuda_host *host;

extern "C" int tri__cuda_module_device_count(char *why, size_t n);  // device.cu

// ---- the library's functions, as the CUDA code sees them ----

extern "C" tri_status tri__fail(tri_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tri_status st = host->vfail(status, fmt, ap);
    va_end(ap);
    return st;
}

extern "C" void tri__log(tri_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    host->vlog(level, fmt, ap);
    va_end(ap);
}

extern "C" const char *tri_last_error(void) { return host->last_error(); }

extern "C" void tri__assert_fail(const char *file, int line, const char *expr) {
    host->assert_fail(file, line, expr);
    abort();  // not reached: the library's aborts
}

extern "C" int64_t tri__dtype_row_bytes(tri_dtype type, int64_t n) { return host->dtype_row_bytes(type, n); }

extern "C" bool tri__dtype_is_quantized(tri_dtype type) { return host->dtype_is_quantized(type); }

extern "C" const char *tri_dtype_name(tri_dtype type) { return host->dtype_name(type); }

extern "C" bool tri__fault_hit(unsigned kind) { return host->fault_hit(kind); }

// ---- the entry point ----

// The device code this module carries (meson passes the list it compiled for).
#ifndef TRI_CUDA_TARGETS
#define TRI_CUDA_TARGETS "unknown targets"
#endif

static char build_line[160];

static const tri__cuda_module module = {
    /* .device_count = */ tri__cuda_module_device_count,
    /* .device_info_get = */ tri__cuda_device_info_get,
    /* .backend_create = */ tri__backend_cuda_create,
    /* .pci_bus_id = */ tri__backend_cuda_pci_bus_id,
    /* .set_limits = */ tri__backend_cuda_set_limits,
    /* .build = */ build_line,
};

extern "C" __attribute__((visibility("default"))) const tri__cuda_module *tri__cuda_module_open(
    const tri__cuda_host *h, char *why, size_t n) {
    if (n > 0) why[0] = 0;
    if (!h || !h->version || strcmp(h->version, TRI_VERSION) != 0) {
        snprintf(why, n, "the CUDA module is of version %s, the library of %s", TRI_VERSION,
                 h && h->version ? h->version : "(unknown)");
        return NULL;
    }
    if (h->backend_size != sizeof(tri__backend) || h->ops_size != sizeof(tri__backend_ops)) {
        snprintf(why, n, "the CUDA module was built from other sources than the library (backend table of %zu "
                 "bytes, the library's %zu)", sizeof(tri__backend_ops), h->ops_size);
        return NULL;
    }
    host = h;
    int rt = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaGetLastError();
#if TRI_CUDA_EMULATED
    snprintf(build_line, sizeof build_line, "emulated on the CPU (tests/cudaemu, runtime %d.%d)", rt / 1000,
             rt % 1000 / 10);
#else
    snprintf(build_line, sizeof build_line, "CUDA runtime %d.%d, %s", rt / 1000, rt % 1000 / 10, TRI_CUDA_TARGETS);
#endif
    return &module;
}
