// backend-select.h - opening the backend a session asks for, and putting a model's weights in
// its memory (internal).
//
// The forward pass reads weights as backend memory (backend.h). On a backend whose memory is
// host memory (the CPU) the mapped file is that memory already and is used in place; on a device
// the weights the forward pass reads are copied once into one allocation of device memory. Either
// way the caller gets a tri_model view whose tensors point where the backend reads them, so the
// forward pass, the levels and the layer-skipping view are the same code on every backend.
#ifndef TRI_BACKEND_SELECT_H
#define TRI_BACKEND_SELECT_H

#include <stdint.h>

#include "arena.h"
#include "backend.h"
#include "topology.h"
#include "triforce.h"

typedef struct tri__weight_stream tri__weight_stream;

// Opens the backend for (kind, device): AUTO is CUDA device 0 when tri_device_count() > 0 and its
// first kernel runs (a GPU that no SASS or PTX of the module fits: the CPU, with a warning in the
// log saying why), else the CPU with n_threads threads (<= 0: every core). TRI_STATUS_DEVICE for
// a CUDA device that does not exist or a build without CUDA, naming the device. *name_out (may
// be NULL) receives "cpu" or "cuda:N" in a buffer of at least 16 bytes. On a CUDA device it also binds the calling
// thread and OpenMP's workers to the device's NUMA node (tri__backend_bind_host_threads).
tri_status tri__backend_select(tri_device_kind kind, int32_t device, int32_t n_threads,
                               tri__backend **out, char *name_out);
// Tests only: when set, the CPU backends tri__backend_select opens come from here (the test suite
// runs whole sessions on a CPU backend with a transfer stream, tests/async-backend.h). NULL: the
// CPU backend.
extern tri_status (*tri__backend_cpu_factory)(int32_t n_threads, tri__backend **out);

// Makes *out, a view of model for be: the same config, tokenizer and tensor names, with every
// tensor the forward pass reads (embeddings, output norm and head, the blocks' weights) in be's
// memory; on a backend with host memory (be->host_memory) they are the model's own mapped data.
// rope_freqs stays host memory (tri__rope_init reads it on the host); other tensors of the file
// get data NULL in a device view. model and be must outlive the view; free it with
// tri__model_backend_free, never tri_model_free. DEVICE_OUT_OF_MEMORY when the weights do not
// fit the device, naming their size.
//
// Streamed layers (n_streamed > 0, device views only; ignored where be->host_memory): the blocks
// of the last n_streamed layers are packed, one host region each (pinned through the backend's
// host_register when it has one), and pass through two device buffers of one block each, the
// streamed layer j through buffer j % 2, whose addresses the view's tensors hold. The forward
// pass calls tri__model_stream_layer before each block; that makes sure the block is in its
// buffer (compute waits for its upload) and starts the next streamed block's upload behind the
// compute still reading the other buffer, so it overlaps with this block's compute (the same
// double buffering as the offloaded KV cache, kv-store.h). A buffer already holding its block
// (one or two streamed layers) is not uploaded again. Quantized blocks travel as stored.
//
// Disk tier (0 < n_disk <= n_streamed): the last n_disk of the streamed blocks are not held in
// host memory; each pass reads them from the model file (prefetch.h) into three staging slots of
// one block each (pinned, from the stream's arena), disk layer d into slot d % 3. When block il
// starts, the read of the disk block two ahead is submitted, so reads overlap with the compute and
// uploads of the blocks before; the upload of a disk block waits for its slot's read and copies
// each tensor from where the reader put it to its fixed place in the device buffer. A slot is
// refilled only after its last upload is done (the host waits for an event on the transfer
// stream); a slot still holding its block (three or fewer disk layers) is not read again. Only a
// model in one file (GGUF or a single safetensors file): UNSUPPORTED for a sharded checkpoint.
// INVALID_ARGUMENT for n_disk outside [0, n_streamed], whatever the backend.
tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, int32_t n_streamed, int32_t n_disk,
                                 tri_model **out);
// Frees a view from tri__model_on_backend and its device copy; NULL is a no-op.
void tri__model_backend_free(tri_model *view);

// Before block il of a forward pass over m: see above. A no-op for a model without streamed layers.
tri_status tri__model_stream_layer(const tri_model *m, int32_t il);

// Bytes of streamed blocks uploaded so far, and the uploads a buffer made unnecessary; reads of
// the disk tier.
typedef struct tri__weight_stream_stats {
    int32_t n_streamed;
    uint64_t bytes_up;
    int64_t n_uploads, n_reused;
    int32_t n_disk;       // of the streamed layers, those read from the model file
    int64_t n_reads;      // disk blocks read (started)
    uint64_t bytes_disk;  // bytes of their tensors
    uint64_t bytes_read;  // bytes the reader got from the file for them, alignment padding included
                          // (reads finished)
} tri__weight_stream_stats;
void tri__model_stream_stats(const tri_model *m, tri__weight_stream_stats *out);

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

#endif  // TRI_BACKEND_SELECT_H
