// arena.h - host memory for the offloaded tiers: exact-size, page-aligned, NUMA-placed, pinnable
// regions (internal).
//
// Holds the full KV cache of offloaded layers, weights that are not resident on the GPU, and the
// staging buffers the weight reader fills. Each allocation is its own anonymous mapping of exactly
// the bytes asked for rounded up to the page (2 MiB when huge pages were obtained), so that
// regions can be pinned, bound and released one by one and nothing is over-allocated by a pool.
//
// Placement. With an hwloc topology, each region's pages are bound (hwloc_set_area_membind,
// BIND policy) to one NUMA node before they are first touched: the node nearest the GPU's PCI bus
// id when one is given, else the node the creating thread runs on. Without hwloc, or when the
// kernel refuses the binding (a container without mbind), the region is left to the kernel's
// first-touch policy and region_info says it is unbound.
//
// Pinning. The arena itself never calls CUDA: the CUDA side sets `pin`/`unpin` (cudaHostRegister
// and cudaHostUnregister); by default regions are not pinned. Each region is registered by itself,
// so 60+ GB of offloaded KV are pinned in pieces of one layer's keys or values (1 GiB at Llama2-7B
// and 128K tokens), never in one call, with the progress in the log every pin_report_bytes. A pin
// failure fails the allocation with a message that says how much was pinned before, the region,
// the OS's locked-memory limit and the memory available (the caller, e.g. the planner, can then
// try with less).
#ifndef TRI_ARENA_H
#define TRI_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topology.h"
#include "triforce.h"

// Pins bytes at ptr (page-aligned) for fast asynchronous device copies. Returns OK or a status of
// its own (DEVICE, DEVICE_OUT_OF_MEMORY) recorded with tri__fail.
typedef tri_status (*tri__arena_pin_fn)(void *ptr, size_t bytes, void *user);
// Undoes pin; called before the region is unmapped.
typedef void (*tri__arena_unpin_fn)(void *ptr, size_t bytes, void *user);

typedef struct tri__arena_params {
    const tri__topology *topo;  // NULL: no NUMA placement; must outlive the arena
    const char *pci_bus_id;     // place near this GPU ("0000:01:00.0"); NULL: the current node
    int32_t node;               // >= 0: this node, overriding pci_bus_id; -1 (default): as above
    bool huge_pages;            // try MAP_HUGETLB (2 MiB) first for regions >= 2 MiB; default true
    bool populate;              // touch every page at allocation (after binding); default true
    uint64_t limit_bytes;       // most bytes mapped at once (the host budget); 0: no limit
    bool noreserve;             // map with MAP_NORESERVE and no huge pages, for regions that are
                                // never touched (a simulated device's host KV, sim-backend.h); use
                                // with populate false; default false
    tri__arena_pin_fn pin;      // NULL (default): regions are not pinned
    tri__arena_unpin_fn unpin;  // required when pin is set
    void *pin_user;
    uint64_t pin_report_bytes;  // log the pinning's progress (INFO) each time this many more bytes
                                // are pinned; 0 (default): every 8 GiB
} tri__arena_params;

typedef struct tri__arena_region_info {
    size_t bytes;         // asked for
    size_t mapped_bytes;  // bytes mapped: bytes rounded up to the page size used
    bool huge;            // backed by MAP_HUGETLB pages
    bool bound;           // pages bound to `node` with hwloc
    bool pinned;          // pin succeeded
    int32_t node;         // the node asked for (logical index), -1 when unbound
} tri__arena_region_info;

typedef struct tri__arena_stats {
    int64_t n_regions;
    uint64_t bytes;         // asked for, live regions
    uint64_t mapped_bytes;  // mapped, live regions
    uint64_t peak_mapped_bytes;
    int64_t n_huge, n_bound, n_pinned;
    int32_t node;           // target node, -1 when the arena does not bind
} tri__arena_stats;

typedef struct tri__arena tri__arena;

tri__arena_params tri__arena_default_params(void);

// Creates an arena. INVALID_ARGUMENT for a node out of range, an unparsable bus id, or pin without
// unpin. A bus id hwloc does not know falls back to the current node (with a warning).
tri_status tri__arena_create(const tri__arena_params *params, tri__arena **out);
// Unpins and unmaps every live region, then frees the arena; NULL is a no-op.
void tri__arena_free(tri__arena *a);

// Maps a region of bytes (> 0), aligned to at least the page size (4096), zero-filled. On failure
// nothing stays mapped: OUT_OF_MEMORY (mmap failed or the limit would be passed, both named in the
// message) or the pin function's status.
tri_status tri__arena_alloc(tri__arena *a, size_t bytes, const char *what, void **out);
// Releases a region returned by tri__arena_alloc; NULL is a no-op. A pointer the arena did not
// return is a broken invariant (abort).
void tri__arena_release(tri__arena *a, void *ptr);

// Describes the region at ptr; NOT_FOUND when ptr is not the start of a live region.
tri_status tri__arena_region_info_get(const tri__arena *a, const void *ptr,
                                      tri__arena_region_info *out);
void tri__arena_stats_get(const tri__arena *a, tri__arena_stats *out);

#endif  // TRI_ARENA_H
