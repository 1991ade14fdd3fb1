// sim-backend.h - a simulated device behind the backend table: a timeline instead of numbers
// (internal).
//
// The sim backend runs the engine's real sequence of ops, copies, events and waits and does none
// of the work: no arithmetic, and no memory behind device buffers (alloc hands out addresses in a
// non-canonical range, so a stray host dereference faults instead of reading something). Every
// call is placed on a timeline of three queues, timed from a device profile:
//
//   host      the issuing thread: each call costs it launch_us; synchronize and
//             event_synchronize move it to the point they wait for.
//   COMPUTE   every op and the plain copies (copy_to_backend / copy_to_host / copy), in order.
//   TRANSFER  the offload engine's copies (transfer_to_backend / transfer_to_host), in order.
//
// Host-side work on offloaded rows (a gather of a selection's chunks, summaries of host-resident
// keys) is not done, since the rows do not exist: the caller calls ops->host_work instead, which
// advances the host's clock by the bytes at the profile's host rates (this machine's, measured).
//
// An item starts when its queue is free, the host has issued it, and every event its queue was
// told to wait for has been reached; it lasts kernel_us plus its work at the profile's rates: an op
// costs max(FLOPs / flop rate, bytes / memory rate), a copy bytes / the PCIe rate of its direction
// (or, device to device, twice its bytes at the memory rate). Event records take the queue's
// current end. So a copy queued behind an event that compute records after layer j's attention
// cannot start before that attention ends, and compute that waits for an upload cannot start
// before the upload ends: the overlap the engine achieves is the overlap the timeline shows.
//
// Host memory is real memory the engine reads: copy_to_host fills its destination with zeros (the
// logits a sampler reads), transfer_to_host writes nothing (the offloaded KV's host rows, which a
// simulated 127K-token context never materialises: with tri__backend.simulated set, arenas map
// host regions without reserving or touching them, arena.h). host_register is a no-op.
#ifndef TRI_SIM_BACKEND_H
#define TRI_SIM_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

// A device: rates, link, memory. Figures and their sources are in docs/offload.md ("Simulated
// devices"). Rates are what a kernel reaches, not datasheet peaks: peak x efficiency.
typedef struct tri__sim_profile {
    const char *name;        // "rtx4090", as --device sim:NAME takes it
    const char *desc;        // one line for reports
    double matmul_tflops;    // dense matmul FLOP/s reached (TFLOP/s): f16 tensor cores on GPUs
    double vector_tflops;    // other ops' FLOP/s reached (TFLOP/s): attention, norms, softmax
    double mem_gbps;         // device memory bytes/s reached (GB/s)
    double matmul_gbps[8];   // per weight dtype (tri_dtype index < 8): weight bytes/s a matmul
                             // streams at; 0: mem_gbps (a CPU's quantized kernels are not
                             // memory-bound, so a CPU profile measures each)
    double matvec_gbps[8];   // per weight dtype (index < 8): weight bytes/s of a matmul of m <= 16 rows
                             // (the GPU's matvec kernel); 0: matmul_gbps, else mem_gbps
    double attn_gbps;        // KV bytes/s of attention; 0: mem_gbps
    double h2d_gbps;         // PCIe host -> device, pinned (GB/s)
    double d2h_gbps;         // device -> host
    double launch_us;        // host time to issue one call (µs)
    double kernel_us;        // least time of one item on a queue (µs)
    uint64_t mem_bytes;      // device memory; alloc beyond it is DEVICE_OUT_OF_MEMORY
    // host-side work on offloaded rows (ops->host_work), at this machine's rates, measured by the
    // caller (bench-offload does at start); 0: such work costs no time
    double host_copy_gbps;   // bytes/s of a gather of rows out of host memory (GB/s)
    double host_reduce_gbps; // bytes/s of chunk summaries of host-resident keys (GB/s)
} tri__sim_profile;

// The built-in profiles: "rtx4090" (PCIe 4.0 x16), "rtx4090-x8", "rtx5090", "h100-pcie", "h100-sxm",
// "h200", "a100" (80 GB SXM4). NULL
// for another name.
const tri__sim_profile *tri__sim_profile_find(const char *name);
// The built-in profiles in order, *n receives their count (for usage messages).
const tri__sim_profile *tri__sim_profiles(int *n);

// ---- the host: where offloaded KV lies, and where split attention attends to it ----

// A host CPU and its memory (docs/offload.md, "Simulated hosts", has the figures and sources).
// Rates are what a kernel reaches: peak x efficiency; dram_gbps is a measured-stream figure, not
// the channels' theoretical product.
typedef struct tri__sim_host {
    const char *name;     // "desktop", as --host NAME takes it
    const char *desc;     // one line for reports
    int32_t cores;
    double f32_tflops;    // FMA FLOP/s reached in f32 (TFLOP/s)
    double bf16_tflops;   // reached with bf16 dot products (AVX512-BF16 VDPBF16PS: twice f32's)
    double dram_gbps;     // host memory bytes/s reached, every reader together (GB/s): the host's
                          // own reads and the GPUs' DMA out of pinned memory share it
    int32_t numa_nodes;   // memory domains the rows are spread over (1: uniform)
} tri__sim_host;

// The built-in hosts: "desktop" (16 cores, two DDR5 channels), "workstation" (32 cores, eight).
const tri__sim_host *tri__sim_host_find(const char *name);
const tri__sim_host *tri__sim_hosts(int *n);

// FLOPs of attention of m queries over rows KV rows (one layer): QK^T and PV, 2 x head_dim FLOPs
// each per query head and row.
double tri__sim_host_attention_flops(double rows, int32_t m, int32_t n_head, int32_t head_dim);
// Seconds for the host to attend m queries over `rows` KV rows of one layer (row_bytes: one
// token's K and V of the layer, every KV head) while the GPUs' DMA reads dma_bytes out of the same
// memory at up to pcie_gbps (0: no DMA): the fluid bound of two readers sharing DRAM,
//   max(flops / FLOP rate, host bytes / DRAM rate, (host bytes + dma bytes) / DRAM rate,
//       dma bytes / PCIe rate),
// the time by which both the host's attention and the DMA are done (each reader at most its own
// rate, together at most the DRAM's). bf16: the kernel's dot products in bf16.
double tri__sim_host_split_seconds(const tri__sim_host *h, double rows, int32_t m, int32_t n_head, int32_t head_dim,
                                   double row_bytes, bool bf16, double dma_bytes, double pcie_gbps);
// The KV bytes/s the host's attention reaches alone at m queries: min(DRAM rate, FLOP rate / FLOPs
// per byte) in GB/s (what tri_plan_params.host_attn_gbps states).
double tri__sim_host_attn_gbps(const tri__sim_host *h, int32_t m, int32_t n_head, int32_t head_dim, double row_bytes,
                               bool bf16);

// ---- acceptance measured: curves by depth (docs/formats.md, "Acceptance curves") ----

// rate[0][d]: L2 keeping L1's d-th drafted token of a chain, rate[1][d]: L3 keeping L2's, given
// every one before it was kept (d = 1..depth[w]); beyond depth[w] the level's pooled rate.
// Optional `tree` records (wt-tree's bench-accept --tree-nodes, docs/speculative.md): L3 keeping the
// tree's candidate of rank r at depth d, given its parent kept and every lower rank rejected; the
// file counts ranks from 0 (the chain's own token), held here from 1 (tree[d][file rank + 1];
// tree_ranks[d]: the highest rank held at depth d; a rank the file skips is 0 with
// tree_reached[d][r] 0).
#define TRI_SIM_CURVE_DEPTH 64
#define TRI_SIM_TREE_RANKS 17  // ranks 1..17 here: the file's 0 (the chain's token) .. 16
typedef struct tri__sim_curve {
    double rate[2][TRI_SIM_CURVE_DEPTH + 1];
    int32_t depth[2];       // deepest depth measured, per level
    double pooled[2];       // all accepted / all reached, per level
    double tokens_per_l3;   // as measured (0 when the file does not say)
    int32_t gamma1, gamma2; // the chains it was measured with (0 when not said)
    double tree[TRI_SIM_CURVE_DEPTH + 1][TRI_SIM_TREE_RANKS + 1];
    int32_t tree_ranks[TRI_SIM_CURVE_DEPTH + 1];  // highest rank measured at each depth (0: none)
    double tree_reached[TRI_SIM_CURVE_DEPTH + 1][TRI_SIM_TREE_RANKS + 1];  // REACHED of each record
    int32_t tree_depth;                          // deepest depth of a tree record (0: no tree)
    double tree_pooled[TRI_SIM_TREE_RANKS + 1];  // per rank, over every depth measured
    int32_t tree_nodes;                          // the tree size it was measured with ('tree_nodes N'; 0 when not said)
} tri__sim_curve;

// Reads a curve file; BAD_FORMAT naming the file, line and field for a bad line or a missing level,
// IO for a file that cannot be opened.
tri_status tri__sim_curve_read(const char *path, tri__sim_curve *out);
// The same from text in memory (len bytes, need not end in NUL); name: for messages.
tri_status tri__sim_curve_parse(const char *name, const char *text, size_t len, tri__sim_curve *out);
// The acceptance table (plan/planner.h) of level w (0: L1 -> L2, 1: L2 -> L3): rank 1 the
// chain's rate by depth (the pooled rate beyond the deepest measured). For w = 1 with tree records,
// each measured (depth, rank) its rate, a rank beyond its deepest depth its pooled rate, a rank
// never measured 0 (not drafted). Without them (and for w = 0) rank r >= 2 is the depth's rank-1
// rate x decay^(r - 1): a stated model, not a measurement. *measured_ranks: whether the tree's ranks
// came from the file.
struct tri__accept_table;
void tri__sim_curve_table(const tri__sim_curve *c, int w, double decay, struct tri__accept_table *t,
                          bool *measured_ranks);
// Expected tokens out of one verification of a chain of g under level w (0: L1 -> L2, 1: L2 ->
// L3): the kept prefix plus the corrected or bonus token, 1 + sum over d = 1..g of the product of
// the rates at depths 1..d.
double tri__sim_curve_expected(const tri__sim_curve *c, int w, int32_t g);

// Creates a simulated device with profile p (copied). Free with tri__backend_free.
tri_status tri__backend_sim_create(const tri__sim_profile *p, tri__backend **out);
// True for a backend made by tri__backend_sim_create.
bool tri__backend_is_sim(const tri__backend *be);

// ---- reading the timeline ----

// Which queue an item ran on, and what it was.
typedef enum tri__sim_queue {
    TRI_SIM_QUEUE_COMPUTE = 0,
    TRI_SIM_QUEUE_TRANSFER = 1,
} tri__sim_queue;

typedef enum tri__sim_kind {
    TRI_SIM_KIND_OP = 0,   // a kernel
    TRI_SIM_KIND_H2D = 1,  // host -> device copy
    TRI_SIM_KIND_D2H = 2,  // device -> host copy
    TRI_SIM_KIND_D2D = 3,  // device -> device copy
} tri__sim_kind;

// One item of the trace (kept only while tracing, tri__sim_trace).
typedef struct tri__sim_item {
    tri__sim_queue queue;
    tri__sim_kind kind;
    const char *what;   // "matmul", "attention", ... (static)
    double start, end;  // seconds on the timeline
    uint64_t bytes;     // copies: bytes moved; ops: bytes read and written
    double flops;
} tri__sim_item;

// Totals since creation or the last tri__sim_reset.
typedef struct tri__sim_stats {
    double host;                // seconds: the host's clock
    double end;                 // seconds: the latest end of any queue (or the host's clock)
    double compute_busy;        // seconds COMPUTE ran items
    double transfer_busy;       // seconds TRANSFER ran items
    double transfer_hidden;     // seconds of transfer_busy during which COMPUTE ran too
    double host_work;           // seconds of host-side work on offloaded rows (ops->host_work)
    double host_work_bytes;     // bytes it handled
    uint64_t h2d_bytes, d2h_bytes, d2d_bytes;  // copies, any queue
    uint64_t transfer_h2d_bytes, transfer_d2h_bytes;  // of them, on TRANSFER
    int64_t n_ops, n_copies, n_waits;
    uint64_t mem_used, mem_peak;  // device bytes allocated now / at most
} tri__sim_stats;

// Totals so far (the overlap is computed from the busy intervals, so it is exact).
void tri__sim_stats_get(tri__backend *be, tri__sim_stats *out);
// Starts a new measurement: every queue and the host move to the latest end so far (as after a
// synchronize), and the totals (not the memory in use) and the trace restart from there.
void tri__sim_reset(tri__backend *be);
// Tracing on or off (off by default; turning it on clears the trace). The trace grows by one
// item per op or copy; *n receives its length. Valid until the next call on be.
void tri__sim_trace(tri__backend *be, bool on);
const tri__sim_item *tri__sim_trace_items(tri__backend *be, int64_t *n);

#endif  // TRI_SIM_BACKEND_H
