// backend-select.c - the backend a session asks for, and the public measurements that open one.
#include "backend-select.h"

#include <stdio.h>
#include <string.h>

#include "cuda-backend.h"
#include "error.h"
#include "kv-store.h"
#include "placement.h"
#include "tensor-parallel.h"

tri_status (*tri__backend_cpu_factory)(int32_t n_threads, tri__backend **out);

// The first kernels of a session on be: an add of 64 floats copied up and back, its result
// checked. A GPU that none of the module's SASS or PTX targets fits fails here ("no kernel image"),
// as a driver that cannot JIT the PTX would.
static tri_status first_kernel(tri__backend *be) {
    enum { N = 64 };
    float host[N], back[N];
    void *dev = NULL;
    for (int i = 0; i < N; i++) host[i] = (float)i - 7.5f;
    tri_status st = be->ops->alloc(be, sizeof host, &dev);
    if (!st) st = be->ops->copy_to_backend(be, dev, host, sizeof host);
    if (!st) st = be->ops->add(be, dev, dev, dev, N);
    if (!st) st = be->ops->copy_to_host(be, back, dev, sizeof back);
    if (!st) st = be->ops->synchronize(be);
    for (int i = 0; !st && i < N; i++)
        if (back[i] != 2 * host[i])
            st = tri__fail(TRI_STATUS_DEVICE, "the first kernel computed %g + %g = %g", (double)host[i],
                           (double)host[i], (double)back[i]);
    if (dev) be->ops->free(be, dev);
    return st;
}

tri_status tri__backend_select(tri_device_kind kind, int32_t device, int32_t n_threads, tri__backend **out,
                               char *name_out) {
    *out = NULL;
    bool automatic = kind == TRI_DEVICE_AUTO;
    switch (kind) {
    case TRI_DEVICE_AUTO:
        if (tri__cuda_device_count() <= 0) break;  // no GPU: the CPU
        kind = TRI_DEVICE_CUDA;
        device = 0;
        break;
    case TRI_DEVICE_CPU: break;
    case TRI_DEVICE_CUDA: {
        int n = tri__cuda_device_count();
        if (device < 0 || device >= n)
            return n == 0 ? tri__fail(TRI_STATUS_DEVICE, "device cuda:%d: %s", device, tri__cuda_unavailable())
                          : tri__fail(TRI_STATUS_DEVICE, "device cuda:%d: no such device (%d CUDA device%s)", device, n,
                                      n == 1 ? "" : "s");
        break;
    }
    default: return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device kind %d unknown", (int)kind);
    }
    tri_status st;
    if (kind == TRI_DEVICE_CUDA) {
        if ((st = tri__backend_cuda_create(device, out))) return st;
        char name[16];
        snprintf(name, sizeof name, "cuda:%d", (int)device);
        // A device chosen for the caller that cannot run our kernels is no reason to fail: the CPU
        // runs the session, and the log says why. A device the caller named fails at its first op;
        // running out of memory is reported as it is, on either.
        if (automatic && (st = first_kernel(*out)) && st != TRI_STATUS_OUT_OF_MEMORY &&
            st != TRI_STATUS_DEVICE_OUT_OF_MEMORY) {
            tri__log(TRI_LOG_LEVEL_WARN,
                     "%s was chosen automatically, but its first kernel failed (%s): running on the CPU instead "
                     "(--device cuda names the GPU and reports the error)",
                     name, tri_last_error());
            tri__backend_free(*out);
            *out = NULL;
            return tri__backend_select(TRI_DEVICE_CPU, 0, n_threads, out, name_out);
        }
        if (st) {
            tri__backend_free(*out);
            *out = NULL;
            return st;
        }
        if (name_out) snprintf(name_out, 16, "%s", name);
        tri__backend_bind_host_threads(*out, name);
    } else {
        if ((st = tri__backend_cpu_factory ? tri__backend_cpu_factory(n_threads, out)
                                           : tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_AUTO, out)))
            return st;
        if (name_out) snprintf(name_out, 16, "cpu");
    }
    return TRI_STATUS_OK;
}

tri_status tri_device_measure_h2d(int32_t device, uint64_t bytes, double *gbps) {
    if (!gbps) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_device_measure_h2d: NULL argument");
    *gbps = 0;
    tri__backend *be;
    TRY(tri__backend_select(TRI_DEVICE_CUDA, device, 0, &be, NULL));
    tri_status st = tri__backend_measure_h2d(be, bytes, gbps);
    tri__backend_free(be);
    return st;
}

tri_status tri_measure_host_attention(const tri_model_config *config, int32_t n_queries, int32_t n_threads,
                                      double *gbps) {
    if (!config || !gbps) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_measure_host_attention: NULL argument");
    return tri__kv_host_attention_gbps(n_threads, n_queries, config->n_head, config->n_head_kv, config->head_dim, 16384,
                                       3, gbps);
}

tri_status tri_device_parse(const char *name, tri_device_kind *kind, int32_t *index) {
    if (!name || !kind || !index) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_device_parse: NULL argument");
    tri__device_ref d[TRI_TP_MAX];
    int32_t n = 0;
    if (strchr(name, ',') || tri__device_list_parse(name, d, &n) != TRI_STATUS_OK || n != 1)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device '%s': want cpu, cuda or cuda:N", name);
    *kind = d[0].kind;
    *index = d[0].index;
    return TRI_STATUS_OK;
}
