// placement.c - host memory and threads near a backend's device (see placement.h).
#include "placement.h"

#include <pthread.h>
#include <stdatomic.h>

#include "clock.h"
#include "error.h"

// ---- host memory and threads near the device ----

static pthread_once_t host_topo_once = PTHREAD_ONCE_INIT;
static tri__topology *host_topo;  // NULL when it could not be loaded (out of memory)

static void host_topo_open(void) {
    if (tri__topology_open(&host_topo) != TRI_STATUS_OK) host_topo = NULL;
}

// The process's topology: loaded on first use (with its PCI devices, which takes hwloc some
// milliseconds) and kept until exit, since arenas of any session may point at it.
static const tri__topology *host_topology(void) {
    pthread_once(&host_topo_once, host_topo_open);
    return host_topo;
}

tri_status tri__backend_pci_bus_id(const tri__backend *be, char *out, size_t n) {
    if (n > 0) out[0] = 0;
    if (be->host_memory)
        return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' works in host memory: no PCI device", be->ops->name);
    if (!be->ops->pci_bus_id) return tri__fail(TRI_STATUS_NOT_FOUND, "backend '%s' has no PCI device", be->ops->name);
    return be->ops->pci_bus_id(be, out, n);
}

int32_t tri__host_node_near(const char *pci_bus_id, const tri__topology **topo) {
    const tri__topology *t = host_topology();
    if (topo) *topo = t;
    return t ? tri__topology_node_for_device(t, pci_bus_id) : -1;
}

void tri__arena_params_place_near(tri__arena_params *ap, const char *pci_bus_id) {
    const tri__topology *t;
    int32_t node = tri__host_node_near(pci_bus_id, &t);
    if (node < 0) return;  // one node, or a device hwloc does not know: the kernel's first touch
    // The node, not the bus id: resolved once here, and the caller's string need not live until
    // tri__arena_create.
    ap->topo = t;
    ap->node = node;
}

void tri__backend_bind_host_threads(const tri__backend *be, const char *name) {
    static atomic_bool reported;
    char busid[32];
    if (tri__backend_pci_bus_id(be, busid, sizeof busid) != TRI_STATUS_OK) return;  // the CPU
    const tri__topology *t;
    int32_t node = tri__host_node_near(busid, &t);
    if (node < 0) return;  // one node: nothing to choose; unknown device: nothing to choose by
    // The calling thread issues the device's work and later creates the weight reader's threads,
    // which inherit its binding; OpenMP's workers (the FAISS index) are bound in a region of
    // their own. A container's cgroup may refuse CPUs of the node: the run goes on unbound.
    tri_status st = tri__topology_bind_thread(t, node);
    if (st == TRI_STATUS_OK) st = tri__topology_bind_omp(t, node, 0);
    const tri__numa_node *nd = tri__topology_node(t, node);
    if (st == TRI_STATUS_OK)
        tri__log(TRI_LOG_LEVEL_INFO, "%s (%s): host threads bound to NUMA node %d (%d PUs)", name ? name : "device",
                 busid, (int)nd->os_index, (int)nd->n_pus);
    else if (!atomic_exchange(&reported, true))
        tri__log(TRI_LOG_LEVEL_INFO, "%s (%s): host threads left unbound: %s", name ? name : "device", busid,
                 tri_last_error());
}

static tri_status pin_region(void *ptr, size_t bytes, void *user) {
    tri__backend *be = user;
    return be->ops->host_register(be, ptr, bytes);
}

static void unpin_region(void *ptr, size_t bytes, void *user) {
    (void)bytes;
    tri__backend *be = user;
    be->ops->host_unregister(be, ptr);
}

void tri__arena_params_pin_for(tri__arena_params *ap, tri__backend *be) {
    if (be->simulated) {  // host regions a simulated device never reads: address space only
        ap->populate = false;
        ap->noreserve = true;
    }
    char busid[32];
    if (tri__backend_pci_bus_id(be, busid, sizeof busid) == TRI_STATUS_OK) tri__arena_params_place_near(ap, busid);
    if (!be->ops->host_register || !be->ops->host_unregister) return;
    ap->pin = pin_region;
    ap->unpin = unpin_region;
    ap->pin_user = be;
}

// Opens the model file for the disk layers first_disk .. n_layer - 1 (their tensor ranges are in
// ws->ranges) and gives the reader three slots, each large enough for any of those blocks.

// ---- measured bandwidth ----

tri_status tri__backend_measure_h2d(tri__backend *be, uint64_t bytes, double *gbps) {
    *gbps = 0;
    if (bytes == 0) bytes = (uint64_t)256 << 20;
    const tri__backend_ops *op = be->ops;
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, be);
    tri__arena *a = NULL;
    void *host = NULL, *dev = NULL;
    tri_status st = tri__arena_create(&ap, &a);
    if (!st) st = tri__arena_alloc(a, (size_t)bytes, "bandwidth probe", &host);
    if (!st) st = op->alloc(be, (size_t)bytes, &dev);
    double best = 0;
    for (int rep = 0; !st && rep < 4; rep++) {  // the first copy warms up the path
        double t0 = tri__now_seconds();
        st = op->transfer_to_backend ? op->transfer_to_backend(be, dev, host, (size_t)bytes)
                                     : op->copy_to_backend(be, dev, host, (size_t)bytes);
        if (!st) st = op->synchronize(be);
        double bw = (double)bytes / (tri__now_seconds() - t0) / 1e9;
        if (!st && rep > 0 && bw > best) best = bw;
    }
    op->free(be, dev);
    tri__arena_free(a);
    if (!st) *gbps = best;
    return st;
}
