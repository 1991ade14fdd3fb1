// topology.c - hwloc topology summary and thread binding, with a one-node fallback.
#include "topology.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "tri-config.h"

#if TRI_HAVE_HWLOC
#include <hwloc.h>
#endif
#if TRI_HAVE_OPENMP
#include <omp.h>
#endif

struct tri__topology {
    int32_t n_nodes;
    tri__numa_node *nodes;  // (n_nodes)
#if TRI_HAVE_HWLOC
    hwloc_topology_t topo;  // NULL in the fallback
    hwloc_obj_t *node_objs; // (n_nodes) the NUMA node objects, logical order
#endif
};

// Parses "dddd:bb:dd.f" or "bb:dd.f" (hex) strictly: the whole string, fields in range.
static bool parse_busid(const char *s, unsigned *domain, unsigned *bus, unsigned *dev,
                        unsigned *func) {
    unsigned v[4];
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        unsigned long x = strtoul(p, &end, 16);
        if (end == p || errno || x > 0xffff || n == 4) return false;
        v[n++] = (unsigned)x;
        if (*end == ':' && n < 3) {
            p = end + 1;
        } else if (*end == '.' && (n == 2 || n == 3)) {
            p = end + 1;
        } else if (*end == 0) {
            break;
        } else {
            return false;
        }
    }
    if (n == 3) {
        v[3] = v[2], v[2] = v[1], v[1] = v[0], v[0] = 0;
    } else if (n != 4) {
        return false;
    }
    if (v[1] > 0xff || v[2] > 0x1f || v[3] > 7) return false;
    *domain = v[0], *bus = v[1], *dev = v[2], *func = v[3];
    return true;
}

static tri_status open_fallback(tri__topology *t) {
    t->n_nodes = 1;
    t->nodes = calloc(1, sizeof *t->nodes);
    if (!t->nodes) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "topology: out of memory");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    t->nodes[0].n_cores = (int32_t)n;
    t->nodes[0].n_pus = (int32_t)n;
    t->nodes[0].local_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    return TRI_STATUS_OK;
}

#if TRI_HAVE_HWLOC
// Loads the hwloc topology with PCI devices; false (after a log line) when hwloc cannot, so the
// caller falls back to one node.
static bool open_hwloc(tri__topology *t) {
    if (hwloc_topology_init(&t->topo) != 0) {
        tri__log(TRI_LOG_LEVEL_WARN, "topology: hwloc_topology_init failed (%s); assuming one node",
                 strerror(errno));
        t->topo = NULL;
        return false;
    }
    // PCI devices are filtered out by default; keep the important ones (GPUs, NICs, NVMe).
    if (hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0)
        tri__log(TRI_LOG_LEVEL_DEBUG, "topology: hwloc_topology_set_io_types_filter: %s",
                 strerror(errno));
    if (hwloc_topology_load(t->topo) != 0) {
        tri__log(TRI_LOG_LEVEL_WARN, "topology: hwloc_topology_load failed (%s); assuming one node",
                 strerror(errno));
        hwloc_topology_destroy(t->topo);
        t->topo = NULL;
        return false;
    }
    int n = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE);
    if (n < 1) {
        tri__log(TRI_LOG_LEVEL_WARN, "topology: hwloc reports no NUMA node; assuming one node");
        hwloc_topology_destroy(t->topo);
        t->topo = NULL;
        return false;
    }
    t->nodes = calloc((size_t)n, sizeof *t->nodes);
    t->node_objs = calloc((size_t)n, sizeof *t->node_objs);
    if (!t->nodes || !t->node_objs) {
        free(t->nodes), free(t->node_objs);
        t->nodes = NULL, t->node_objs = NULL;
        hwloc_topology_destroy(t->topo);
        t->topo = NULL;
        return false;
    }
    t->n_nodes = n;
    int n_core = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        t->node_objs[i] = o;
        t->nodes[i].os_index = (int32_t)o->os_index;
        t->nodes[i].local_bytes = o->attr ? o->attr->numanode.local_memory : 0;
        t->nodes[i].n_pus = o->cpuset ? hwloc_bitmap_weight(o->cpuset) : 0;
        for (int c = 0; c < n_core && o->cpuset; c++) {
            hwloc_obj_t core = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_CORE, (unsigned)c);
            if (core && core->cpuset && hwloc_bitmap_isincluded(core->cpuset, o->cpuset))
                t->nodes[i].n_cores++;
        }
        if (t->nodes[i].n_pus < 0) t->nodes[i].n_pus = 0;
    }
    return true;
}
#endif

tri_status tri__topology_open(tri__topology **out) {
    *out = NULL;
    tri__topology *t = calloc(1, sizeof *t);
    if (!t) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "topology: out of memory");
#if TRI_HAVE_HWLOC
    if (open_hwloc(t)) {
        *out = t;
        return TRI_STATUS_OK;
    }
#endif
    tri_status st = open_fallback(t);
    if (st != TRI_STATUS_OK) {
        free(t);
        return st;
    }
    *out = t;
    return TRI_STATUS_OK;
}

void tri__topology_free(tri__topology *t) {
    if (!t) return;
#if TRI_HAVE_HWLOC
    if (t->topo) hwloc_topology_destroy(t->topo);
    free(t->node_objs);
#endif
    free(t->nodes);
    free(t);
}

bool tri__topology_is_hwloc(const tri__topology *t) {
#if TRI_HAVE_HWLOC
    return t->topo != NULL;
#else
    (void)t;
    return false;
#endif
}

int32_t tri__topology_n_nodes(const tri__topology *t) { return t->n_nodes; }

const tri__numa_node *tri__topology_node(const tri__topology *t, int32_t i) {
    return i >= 0 && i < t->n_nodes ? &t->nodes[i] : NULL;
}

void *tri__topology_hwloc(const tri__topology *t) {
#if TRI_HAVE_HWLOC
    return t->topo;
#else
    (void)t;
    return NULL;
#endif
}

const void *tri__topology_nodeset(const tri__topology *t, int32_t node) {
#if TRI_HAVE_HWLOC
    if (!t->topo || node < 0 || node >= t->n_nodes) return NULL;
    return t->node_objs[node]->nodeset;
#else
    (void)t, (void)node;
    return NULL;
#endif
}

#if TRI_HAVE_HWLOC
// Logical index of the first node in nodeset, or -1.
static int32_t node_of_nodeset(const tri__topology *t, hwloc_const_nodeset_t set) {
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (hwloc_bitmap_intersects(t->node_objs[i]->nodeset, set)) return i;
    return -1;
}
#endif

#if TRI_HAVE_HWLOC
// The node of the PCI device's closest non-I/O ancestor: >= 0; -1 when hwloc does not know the
// device, -2 when it knows it but no node is local to it.
static int32_t pci_node(const tri__topology *t, unsigned domain, unsigned bus, unsigned dev,
                        unsigned func) {
    hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->topo, domain, bus, dev, func);
    if (!pci) return -1;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t->topo, pci);
    int32_t i = anc && anc->nodeset ? node_of_nodeset(t, anc->nodeset) : -1;
    return i >= 0 ? i : -2;
}
#endif

tri_status tri__topology_node_of_pci(const tri__topology *t, const char *busid, int32_t *node) {
    *node = 0;
    unsigned domain, bus, dev, func;
    if (!busid || !parse_busid(busid, &domain, &bus, &dev, &func))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "topology: '%s' is not a PCI bus id (dddd:bb:dd.f or bb:dd.f)",
                         busid ? busid : "(null)");
#if TRI_HAVE_HWLOC
    if (t->topo) {
        int32_t i = pci_node(t, domain, bus, dev, func);
        if (i == -1)
            return tri__fail(TRI_STATUS_NOT_FOUND, "topology: no PCI device %04x:%02x:%02x.%x",
                             domain, bus, dev, func);
        if (i < 0)
            return tri__fail(TRI_STATUS_NOT_FOUND,
                             "topology: PCI device %04x:%02x:%02x.%x has no local NUMA node",
                             domain, bus, dev, func);
        *node = i;
        return TRI_STATUS_OK;
    }
#endif
    (void)t;
    return tri__fail(TRI_STATUS_NOT_FOUND,
                     "topology: PCI device %04x:%02x:%02x.%x unknown (no hwloc topology)", domain,
                     bus, dev, func);
}

int32_t tri__topology_node_for_device(const tri__topology *t, const char *busid) {
    if (t->n_nodes < 2 || !busid || !busid[0]) return -1;
    unsigned domain, bus, dev, func;
    if (!parse_busid(busid, &domain, &bus, &dev, &func)) return -1;
#if TRI_HAVE_HWLOC
    // Not through node_of_pci: "unknown" is an ordinary answer here, not an error to record.
    if (t->topo) {
        int32_t i = pci_node(t, domain, bus, dev, func);
        return i >= 0 ? i : -1;
    }
#endif
    return -1;
}

int32_t tri__topology_current_node(const tri__topology *t) {
#if TRI_HAVE_HWLOC
    if (!t->topo || t->n_nodes == 1) return 0;
    hwloc_cpuset_t cpus = hwloc_bitmap_alloc();
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    int32_t found = 0;
    if (cpus && nodes && hwloc_get_last_cpu_location(t->topo, cpus, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_cpuset_to_nodeset(t->topo, cpus, nodes);
        int32_t i = node_of_nodeset(t, nodes);
        if (i >= 0) found = i;
    }
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    return found;
#else
    (void)t;
    return 0;
#endif
}

tri_status tri__topology_bind_thread(const tri__topology *t, int32_t node) {
    if (node < 0 || node >= t->n_nodes)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "topology: node %d out of range (0..%d)",
                         node, t->n_nodes - 1);
#if TRI_HAVE_HWLOC
    if (t->topo) {
        hwloc_const_cpuset_t set = t->node_objs[node]->cpuset;
        if (!set || hwloc_bitmap_iszero(set))
            return tri__fail(TRI_STATUS_UNSUPPORTED, "topology: node %d has no CPUs", node);
        if (hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD) != 0)
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "topology: hwloc_set_cpubind(node %d, thread): %s", node,
                             strerror(errno));
    }
#endif
    return TRI_STATUS_OK;
}

tri_status tri__topology_bind_omp(const tri__topology *t, int32_t node, int32_t n_threads) {
    if (node < 0 || node >= t->n_nodes)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "topology: node %d out of range (0..%d)",
                         node, t->n_nodes - 1);
#if TRI_HAVE_OPENMP
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    tri_status first = TRI_STATUS_OK;
    // OpenMP keeps its worker threads between regions (the usual implementations do), so a
    // binding made here stays with the workers of later regions of the same size.
#pragma omp parallel num_threads(n_threads)
    {
        tri_status st = tri__topology_bind_thread(t, node);
        if (st != TRI_STATUS_OK) {
#pragma omp critical(tri_topology_bind)
            if (first == TRI_STATUS_OK) first = st;
        }
    }
    if (first != TRI_STATUS_OK)
        return tri__fail(first, "topology: binding %d OpenMP threads to node %d failed", n_threads,
                         node);
    return TRI_STATUS_OK;
#else
    (void)n_threads;
    return tri__topology_bind_thread(t, node);
#endif
}
