// topology.h - NUMA nodes and cores of this machine, and binding threads to them (internal).
//
// With hwloc the summary comes from the loaded topology (I/O devices included, so that a GPU's
// PCI bus id can be mapped to the NUMA node it hangs off). Without hwloc, or when hwloc cannot
// load a topology, the machine is one node holding every online core and binding is a no-op.
//
// Nodes are numbered 0 .. n_nodes-1 in hwloc's logical order; os_index is the kernel's number
// (the one numactl and /sys/devices/system/node use).
#ifndef TRI_TOPOLOGY_H
#define TRI_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

typedef struct tri__numa_node {
    int32_t os_index;      // kernel node number; 0 in the fallback
    int32_t n_cores;       // physical cores whose PUs are all local to the node
    int32_t n_pus;         // hardware threads (logical CPUs) local to the node
    uint64_t local_bytes;  // memory of the node; 0 if unknown
} tri__numa_node;

typedef struct tri__topology tri__topology;

// Loads the topology. Never fails for lack of hwloc: it then describes one node with
// sysconf(_SC_NPROCESSORS_ONLN) cores. OUT_OF_MEMORY only.
tri_status tri__topology_open(tri__topology **out);
// Frees t; NULL is a no-op. Arenas created on t must be freed first.
void tri__topology_free(tri__topology *t);

// True when the summary comes from hwloc (NUMA binding possible).
bool tri__topology_is_hwloc(const tri__topology *t);
int32_t tri__topology_n_nodes(const tri__topology *t);
// Node i, 0 <= i < n_nodes; NULL otherwise. Lives as long as t.
const tri__numa_node *tri__topology_node(const tri__topology *t, int32_t i);

// The node nearest the PCI device with bus id busid ("0000:01:00.0" or "01:00.0"): the node of
// its closest non-I/O ancestor. NOT_FOUND when hwloc does not know the device (always so in the
// fallback, where callers use node 0); INVALID_ARGUMENT for an unparsable id.
tri_status tri__topology_node_of_pci(const tri__topology *t, const char *busid, int32_t *node);

// The node whose memory and CPUs should serve the PCI device busid (a GPU's pinned host buffers
// and the threads that feed it): node_of_pci's answer on a machine of two or more nodes. -1, for
// "leave placement to the kernel", when there is nothing to choose (one node, busid NULL or "")
// or nothing to choose by: a device the topology does not know (the fallback topology, a virtual
// machine that hides the PCI tree) or an unparsable id. Logs nothing and records no error.
int32_t tri__topology_node_for_device(const tri__topology *t, const char *busid);

// The node of the CPU the calling thread last ran on; 0 when unknown or in the fallback.
int32_t tri__topology_current_node(const tri__topology *t);

// Binds the calling thread to the PUs of node (HWLOC_CPUBIND_THREAD). A no-op returning OK in the
// fallback; INVALID_ARGUMENT for a node out of range; UNSUPPORTED when the OS refuses the binding
// (e.g. a container's cgroup excludes those CPUs), with the errno in the message.
tri_status tri__topology_bind_thread(const tri__topology *t, int32_t node);

// Binds every OpenMP worker of the next parallel regions (one parallel region of n_threads
// threads is run, each thread binding itself) to the PUs of node. Without OpenMP it binds the
// calling thread only. n_threads <= 0: omp_get_max_threads(). The first failure is returned.
tri_status tri__topology_bind_omp(const tri__topology *t, int32_t node, int32_t n_threads);

// The hwloc_topology_t, or NULL in the fallback; for offload/arena.c.
void *tri__topology_hwloc(const tri__topology *t);
// The hwloc nodeset (hwloc_const_nodeset_t) of node, or NULL in the fallback / out of range.
const void *tri__topology_nodeset(const tri__topology *t, int32_t node);

#endif  // TRI_TOPOLOGY_H
