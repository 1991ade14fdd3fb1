// arena.c - exact-size mmap regions, bound to a NUMA node with hwloc, optionally pinned.
#include "arena.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "tri-config.h"

#if TRI_HAVE_HWLOC
#include <hwloc.h>
#endif

#define HUGE_PAGE ((size_t)2 << 20)

typedef struct region {
    void *ptr;
    tri__arena_region_info info;
} region;

struct tri__arena {
    tri__arena_params p;
    int32_t node;         // target node (logical), -1 when not binding
    region *regions;      // (n_regions) live regions, unordered
    int64_t n_regions, cap_regions;
    uint64_t mapped, peak_mapped;
    // pinning so far: bytes and regions pinned, seconds spent in pin, the next progress report
    uint64_t pinned, pin_report_at;
    int64_t n_pins;
    double pin_seconds;
};

tri__arena_params tri__arena_default_params(void) {
    return (tri__arena_params){
        .topo = NULL,
        .pci_bus_id = NULL,
        .node = -1,
        .huge_pages = true,
        .populate = true,
        .limit_bytes = 0,
        .noreserve = false,
        .pin = NULL,
        .unpin = NULL,
        .pin_user = NULL,
        .pin_report_bytes = 0,
    };
}

tri_status tri__arena_create(const tri__arena_params *params, tri__arena **out) {
    *out = NULL;
    tri__arena_params p = params ? *params : tri__arena_default_params();
    if (p.pin && !p.unpin)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "arena: a pin function needs an unpin function");
    int32_t node = -1;
    if (p.topo) {
        int32_t n = tri__topology_n_nodes(p.topo);
        if (p.node >= 0) {
            if (p.node >= n)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "arena: node %d out of range (0..%d)",
                                 p.node, n - 1);
            node = p.node;
        } else if (p.pci_bus_id) {
            tri_status st = tri__topology_node_of_pci(p.topo, p.pci_bus_id, &node);
            if (st == TRI_STATUS_INVALID_ARGUMENT) return st;
            if (st != TRI_STATUS_OK) {
                tri__log(TRI_LOG_LEVEL_WARN, "arena: %s; placing host buffers on the current node",
                         tri_last_error());
                node = tri__topology_current_node(p.topo);
            }
        } else {
            node = tri__topology_current_node(p.topo);
        }
        // Binding needs hwloc; the fallback topology has nothing to bind with.
        if (!tri__topology_is_hwloc(p.topo)) node = -1;
    }
    tri__arena *a = calloc(1, sizeof *a);
    if (!a) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "arena: out of memory");
    a->p = p;
    a->p.pci_bus_id = NULL;  // not kept: the caller's string need not outlive the arena
    a->node = node;
    if (!a->p.pin_report_bytes) a->p.pin_report_bytes = (uint64_t)8 << 30;
    a->pin_report_at = a->p.pin_report_bytes;
    *out = a;
    return TRI_STATUS_OK;
}

#define GIB(x) ((double)(x) / (double)((uint64_t)1 << 30))

// Pins region r (len bytes at ptr) with the caller's pin function, logging the progress; when the
// pin fails, the status names what was pinned before, the region, RLIMIT_MEMLOCK and MemAvailable.
static tri_status pin_region(tri__arena *a, const char *what, void *ptr, size_t len) {
    double t0 = tri__now_seconds();
    tri_status st = a->p.pin(ptr, len, a->p.pin_user);
    a->pin_seconds += tri__now_seconds() - t0;
    if (st == TRI_STATUS_OK) {
        a->pinned += len;
        a->n_pins++;
        if (a->pinned >= a->pin_report_at) {
            double gbps = a->pin_seconds > 0 ? 1e-9 * (double)a->pinned / a->pin_seconds : 0.0;
            tri__log(TRI_LOG_LEVEL_INFO, "arena: pinned %.1f GiB in %lld regions (%.1f s, %.1f GB/s)", GIB(a->pinned),
                     (long long)a->n_pins, a->pin_seconds, gbps);
            while (a->pin_report_at <= a->pinned) a->pin_report_at += a->p.pin_report_bytes;
        }
        return TRI_STATUS_OK;
    }
    char why[512], limit[64] = "unlimited", avail[64] = "unknown";
    snprintf(why, sizeof why, "%s", tri_last_error());
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        snprintf(limit, sizeof limit, "%.1f GiB", GIB(rl.rlim_cur));
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kib;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
                snprintf(avail, sizeof avail, "%.1f GiB", GIB(kib << 10));
        fclose(f);
    }
    return tri__fail(st, "arena: %s: pinning %.2f GiB failed after %.1f GiB pinned in %lld regions: %s (the OS refused "
                     "to lock more host memory: locked-memory limit %s (ulimit -l), memory available %s; raise the "
                     "limit, free memory or offload fewer layers)",
                     what, GIB(len), GIB(a->pinned), (long long)a->n_pins, why, limit, avail);
}

static void unmap_region(tri__arena *a, region *r) {
    if (r->info.pinned) {
        a->p.unpin(r->ptr, r->info.mapped_bytes, a->p.pin_user);
        a->pinned -= r->info.mapped_bytes;
    }
    if (munmap(r->ptr, r->info.mapped_bytes) != 0)
        tri__log(TRI_LOG_LEVEL_WARN, "arena: munmap(%zu bytes): %s", r->info.mapped_bytes,
                 strerror(errno));
    a->mapped -= r->info.mapped_bytes;
}

void tri__arena_free(tri__arena *a) {
    if (!a) return;
    for (int64_t i = 0; i < a->n_regions; i++) unmap_region(a, &a->regions[i]);
    free(a->regions);
    free(a);
}

// Binds [ptr, ptr + len) to the arena's node before any page is touched. false when the OS
// refuses (logged once per process: every later region would be refused the same way).
static bool bind_region(tri__arena *a, void *ptr, size_t len) {
#if TRI_HAVE_HWLOC
    static atomic_bool warned;
    hwloc_topology_t topo = tri__topology_hwloc(a->p.topo);
    hwloc_const_nodeset_t set = tri__topology_nodeset(a->p.topo, a->node);
    if (!topo || !set) return false;
    if (hwloc_set_area_membind(topo, ptr, len, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) ==
        0)
        return true;
    if (!atomic_exchange(&warned, true))
        tri__log(TRI_LOG_LEVEL_WARN,
                 "arena: hwloc_set_area_membind(node %d, %zu bytes): %s; host buffers are left to "
                 "the kernel's first-touch placement",
                 a->node, len, strerror(errno));
    return false;
#else
    (void)a, (void)ptr, (void)len;
    return false;
#endif
}

tri_status tri__arena_alloc(tri__arena *a, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (!what) what = "region";
    if (bytes == 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "arena: %s: zero bytes", what);
    long page_l = sysconf(_SC_PAGESIZE);
    size_t page = page_l > 0 ? (size_t)page_l : 4096;
    if (bytes > SIZE_MAX - HUGE_PAGE)
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "arena: %s: %zu bytes is too large", what, bytes);
    size_t len = (bytes + page - 1) / page * page;
    if (a->p.limit_bytes && a->mapped + len > a->p.limit_bytes)
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY,
                         "arena: %s: %zu bytes would pass the host budget (%llu of %llu bytes in "
                         "use)",
                         what, bytes, (unsigned long long)a->mapped,
                         (unsigned long long)a->p.limit_bytes);
    if (a->n_regions == a->cap_regions) {
        int64_t cap = a->cap_regions ? 2 * a->cap_regions : 16;
        region *r = realloc(a->regions, (size_t)cap * sizeof *r);
        if (!r) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "arena: %s: out of memory", what);
        a->regions = r;
        a->cap_regions = cap;
    }

    region r = {0};
    r.info.bytes = bytes;
    r.info.node = -1;
    void *ptr = MAP_FAILED;
    // Explicit huge pages exist only where the administrator reserved them (vm.nr_hugepages);
    // elsewhere mmap fails with ENOMEM and ordinary pages, with a transparent-huge-page hint,
    // serve as well for streaming.
    if (a->p.huge_pages && !a->p.noreserve && bytes >= HUGE_PAGE) {
        size_t hlen = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        if (!a->p.limit_bytes || a->mapped + hlen <= a->p.limit_bytes) {
            ptr = mmap(NULL, hlen, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
            if (ptr != MAP_FAILED) {
                len = hlen;
                r.info.huge = true;
            } else {
                tri__log(TRI_LOG_LEVEL_DEBUG, "arena: %s: mmap(MAP_HUGETLB, %zu): %s; using 4 KiB pages",
                         what, hlen, strerror(errno));
            }
        }
    }
    if (ptr == MAP_FAILED) {
        ptr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (a->p.noreserve ? MAP_NORESERVE : 0),
                   -1, 0);
        if (ptr == MAP_FAILED)
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "arena: %s: mmap(%zu bytes): %s", what, len,
                             strerror(errno));
        if (a->p.huge_pages && len >= HUGE_PAGE && madvise(ptr, len, MADV_HUGEPAGE) != 0)
            tri__log(TRI_LOG_LEVEL_DEBUG, "arena: %s: madvise(MADV_HUGEPAGE): %s", what,
                     strerror(errno));
    }
    r.ptr = ptr;
    r.info.mapped_bytes = len;
    if (a->node >= 0 && bind_region(a, ptr, len)) {
        r.info.bound = true;
        r.info.node = a->node;
    }
    if (a->p.populate) {
        // First touch after binding, so the pages land on the node; anonymous pages are zero, so
        // writing a zero per page changes nothing but the fault.
        volatile char *c = ptr;
        size_t step = r.info.huge ? HUGE_PAGE : page;
        for (size_t off = 0; off < len; off += step) c[off] = 0;
    }
    if (a->p.pin) {
        tri_status st = pin_region(a, what, ptr, len);
        if (st != TRI_STATUS_OK) {
            munmap(ptr, len);
            return st;
        }
        r.info.pinned = true;
    }
    a->regions[a->n_regions++] = r;
    a->mapped += len;
    if (a->mapped > a->peak_mapped) a->peak_mapped = a->mapped;
    *out = ptr;
    return TRI_STATUS_OK;
}

static int64_t find(const tri__arena *a, const void *ptr) {
    for (int64_t i = 0; i < a->n_regions; i++)
        if (a->regions[i].ptr == ptr) return i;
    return -1;
}

void tri__arena_release(tri__arena *a, void *ptr) {
    if (!ptr) return;
    int64_t i = find(a, ptr);
    TRI_ASSERT(i >= 0);
    unmap_region(a, &a->regions[i]);
    a->regions[i] = a->regions[--a->n_regions];
}

tri_status tri__arena_region_info_get(const tri__arena *a, const void *ptr,
                                      tri__arena_region_info *out) {
    int64_t i = find(a, ptr);
    if (i < 0) return tri__fail(TRI_STATUS_NOT_FOUND, "arena: %p is not a live region", ptr);
    *out = a->regions[i].info;
    return TRI_STATUS_OK;
}

void tri__arena_stats_get(const tri__arena *a, tri__arena_stats *out) {
    memset(out, 0, sizeof *out);
    out->node = a->node;
    out->n_regions = a->n_regions;
    out->mapped_bytes = a->mapped;
    out->peak_mapped_bytes = a->peak_mapped;
    for (int64_t i = 0; i < a->n_regions; i++) {
        const tri__arena_region_info *r = &a->regions[i].info;
        out->bytes += r->bytes;
        out->n_huge += r->huge;
        out->n_bound += r->bound;
        out->n_pinned += r->pinned;
    }
}
