// placement.h - host memory and threads for a backend's device: pinned arenas, the NUMA node
// nearest the device, and the host-to-device rate (internal; docs/offload.md).
#ifndef TRI_PLACEMENT_H
#define TRI_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "backend.h"
#include "topology.h"
#include "triforce.h"

// Host-to-device GB/s of be: the best of three timed copies of bytes (0: 256 MiB) of pinned (when
// be can pin) host memory on its transfer stream, after one warm-up copy.
tri_status tri__backend_measure_h2d(tri__backend *be, uint64_t bytes, double *gbps);

// Sets ap's pin hooks to be's host_register / host_unregister when it has them, so the arena's
// regions are pinned for asynchronous copies; leaves them unset otherwise. For a backend on a PCI
// device (CUDA) it also places the regions on the NUMA node nearest the device
// (tri__arena_params_place_near with tri__backend_pci_bus_id). For a simulated device
// (be->simulated) it also clears populate and sets noreserve: the regions are address space that
// nothing reads. be must outlive the arena.
void tri__arena_params_pin_for(tri__arena_params *ap, tri__backend *be);

// ---- host memory and threads near the device ----
//
// Pinned host buffers and the threads that feed a GPU belong on the NUMA node its PCIe root hangs
// off: a copy from the other socket crosses the inter-socket link (UPI, Infinity Fabric), which on
// two-socket boards carries less than the PCIe link wants. The node comes from the process's hwloc
// topology, loaded once on first use and kept until exit. On a machine of one node, or where hwloc
// does not know the device, nothing is placed or bound (the kernel's first touch and scheduler
// decide, as without hwloc).

// Writes the PCI bus id of be's device ("0000:01:00.0") into out, n bytes (32 suffice). NOT_FOUND
// for a backend in host memory (the CPU) or one that is not a CUDA device; out is "" on failure.
tri_status tri__backend_pci_bus_id(const tri__backend *be, char *out, size_t n);

// The node for host memory and threads serving the PCI device pci_bus_id:
// tri__topology_node_for_device over the process's topology, so -1 when there is none to choose.
// *topo (may be NULL) receives that topology (NULL if it could not be loaded); it lives until exit.
int32_t tri__host_node_near(const char *pci_bus_id, const tri__topology **topo);

// Makes an arena made with ap place its regions on tri__host_node_near(pci_bus_id): sets ap->topo
// and ap->node. Leaves ap as it is when that is -1. pci_bus_id need not outlive the call.
void tri__arena_params_place_near(tri__arena_params *ap, const char *pci_bus_id);

// Binds the calling thread, and the workers of the OpenMP regions it starts, to the PUs of the
// node nearest be's device; threads it creates later (the weight reader's) inherit the binding.
// Nothing for a backend without a PCI device or when tri__host_node_near gives -1. Never fails: a
// binding the OS refuses (a container's cgroup without those CPUs) is logged once per process at
// info level and the threads stay as they were. name ("cuda:0", may be NULL) is for the log.
void tri__backend_bind_host_threads(const tri__backend *be, const char *name);

#endif  // TRI_PLACEMENT_H
