// cuda-loader.c - cuda-backend.h's functions in the library: they load the CUDA module
// (cuda-module.h) on first use and forward to it.
//
// The module is looked for, in order: $TRI_CUDA_MODULE (a path); beside the library or program
// that holds this code, in a triforce/ folder there (the installed layout, libdir/triforce/),
// and in backends/cuda/ there or one folder up (the build tree: build/libtriforce.so or build/tests/x
// beside build/backends/cuda/). Without a GPU driver on the machine (no /dev/nvidiactl, no /dev/dxg) the
// module is not loaded at all, unless $TRI_CUDA_MODULE names it or it is the CPU emulator's
// build: a CPU run then never maps the CUDA runtime and cuBLAS.
#include "cuda-backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cuda-module.h"
#include "dtype.h"
#include "error.h"
#include "fault.h"
#include "tri-config.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const tri__cuda_module *mod;  // NULL: not loaded (why says why)
static int n_devices;
static char why[512];

#if TRI_HAVE_CUDA
static const tri__cuda_host host = {
    .version = TRI_VERSION,
    .backend_size = sizeof(tri__backend),
    .ops_size = sizeof(tri__backend_ops),
    .vfail = tri__vfail,
    .vlog = tri__vlog,
    .last_error = tri_last_error,
    .assert_fail = tri__assert_fail,
    .dtype_row_bytes = tri__dtype_row_bytes,
    .dtype_is_quantized = tri__dtype_is_quantized,
    .dtype_name = tri_dtype_name,
    .fault_hit = tri__fault_hit,
};

// Tries one path: 1 loaded, 0 no such file, -1 a file that would not load (why says why).
static int try_open(const char *path) {
    if (access(path, F_OK) != 0) return 0;
    // RTLD_LOCAL: the module's CUDA runtime and cuBLAS stay out of the process's symbol scope.
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "the CUDA module %s does not load: %s", path, dlerror());
        return -1;
    }
    tri__cuda_module_open_fn open_fn = (tri__cuda_module_open_fn)dlsym(h, TRI_CUDA_MODULE_ENTRY);
    if (!open_fn) {
        snprintf(why, sizeof why, "%s is not a triforce CUDA module (no %s)", path, TRI_CUDA_MODULE_ENTRY);
        dlclose(h);
        return -1;
    }
    char msg[256];
    const tri__cuda_module *m = open_fn(&host, msg, sizeof msg);
    if (!m) {
        snprintf(why, sizeof why, "%s: %s", path, msg);
        dlclose(h);
        return -1;
    }
    n_devices = m->device_count(msg, sizeof msg);
    if (n_devices <= 0) {
        // Nothing to run on: unload it, so that the CUDA runtime and cuBLAS give their memory back.
        snprintf(why, sizeof why, "%s", msg);
        n_devices = 0;
        dlclose(h);
        return 1;
    }
    mod = m;  // kept until exit: backends made by it may live as long as the process
    return 1;
}

static void load(void) {
    const char *env = getenv("TRI_CUDA_MODULE");
    if (env && *env) {
        if (try_open(env) == 0) snprintf(why, sizeof why, "TRI_CUDA_MODULE=%s: no such file", env);
        return;
    }
#if !TRI_CUDA_EMULATED
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/dev/dxg", F_OK) != 0) {
        snprintf(why, sizeof why, "no NVIDIA driver (no /dev/nvidiactl)");
        return;
    }
#endif
    // The file that holds this code: the library, or a program linked with it statically. A
    // program's name from dladdr is its argv[0], which may not be a path (a test runner renames
    // its workers): /proc/self/exe then.
    Dl_info info;
    char dir[4096] = "";
    if (dladdr((void *)load, &info) && info.dli_fname && strchr(info.dli_fname, '/') &&
        access(info.dli_fname, F_OK) == 0)
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
    else {
        ssize_t len = readlink("/proc/self/exe", dir, sizeof dir - 1);
        dir[len > 0 ? len : 0] = 0;
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    static const char *const where[] = {"", "/triforce", "/backends/cuda", "/../backends/cuda"};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s%s/%s", dir, where[i], TRI_CUDA_MODULE_NAME);
        if (try_open(path) != 0) return;
    }
    snprintf(why, sizeof why, "the CUDA module %s is not installed in %s (nor in its triforce/ or backends/cuda/)",
             TRI_CUDA_MODULE_NAME, dir);
}
#else
static void load(void) { snprintf(why, sizeof why, "this build has no CUDA support"); }
#endif

static const tri__cuda_module *module(void) {
    pthread_once(&load_once, load);
    return mod;
}

int tri__cuda_device_count(void) { return module() ? n_devices : 0; }

const char *tri__cuda_unavailable(void) {
    module();
    return why;
}

const char *tri__cuda_module_build(void) { return module() ? mod->build : NULL; }

tri_status tri__cuda_device_info_get(int device, tri__cuda_device_info *out) {
    if (!module()) {
        memset(out, 0, sizeof *out);
        return tri__fail(TRI_STATUS_DEVICE, "cuda device %d: %s", device, why);
    }
    return mod->device_info_get(device, out);
}

tri_status tri__backend_cuda_create(int device, tri__backend **out) {
    *out = NULL;
    if (!module()) return tri__fail(TRI_STATUS_DEVICE, "cuda device %d: %s", device, why);
    return mod->backend_create(device, out);
}

tri_status tri__backend_cuda_pci_bus_id(const tri__backend *be, char *out, size_t n) {
    if (!module()) {
        if (n > 0) out[0] = 0;
        return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' is not a CUDA device (%s)", be ? be->ops->name : "(null)",
                         why);
    }
    return mod->pci_bus_id(be, out, n);
}

tri_status tri__backend_cuda_set_limits(tri__backend *be, const tri__cuda_limits *limits) {
    if (!module())
        return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' is not a CUDA device (%s)", be ? be->ops->name : "(null)",
                         why);
    return mod->set_limits(be, limits);
}
