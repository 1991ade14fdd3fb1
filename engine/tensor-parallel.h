// tensor-parallel.h - one model over N devices: the split by KV head, the shard models, the
// rank threads and the all-reduce (internal; docs/offload.md, "Tensor parallelism").
//
// Rank r of N holds KV heads [kv0[r], kv0[r+1]) with their query heads (the GQA group of each),
// the matching rows of wq, wk, wv and columns of wo, and FFN rows [ff0[r], ff0[r+1]) (rows of
// gate and up, columns of down). Each rank's forward pass is the ordinary one over its shard
// model (a tri_model whose config says n_head, n_head_kv and n_ff are its share), with two
// all-reduces per layer: the output of wo and of down are partial sums over the rank's columns,
// summed over the ranks (in rank order, the same bits on every rank) before the residual add.
// Embeddings are replicated (a lookup needs no communication); the output head runs on rank 0
// only, which is the rank whose logits the caller reads.
//
// The ranks run concurrently, one host thread each (rank 0 is the caller's thread), each driving
// its own backend. On CUDA devices the all-reduce is NCCL's, queued on each rank's compute
// stream (loaded at run time; tri__tp_uses_comm). Elsewhere (CPU ranks, no NCCL) it goes through
// host memory (pinned where the backend can pin):
// a rank copies its partial to its host buffer, waits for every rank to arrive, sums the N
// buffers and copies the sum back. No device-to-device path is needed (RTX 4090s have none);
// where every pair of devices has peer access, each rank instead reads the others' partials
// device to device and adds them on its device, in the same order.
#ifndef TRI_TENSOR_PARALLEL_H
#define TRI_TENSOR_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "llama.h"
#include "model.h"
#include "tp-split.h"
#include "triforce.h"

// ---- device lists ----

typedef struct tri__device_ref {
    tri_device_kind kind;  // TRI_DEVICE_CPU or TRI_DEVICE_CUDA
    int32_t index;         // cuda:N's N; cpu:N's N (the NUMA node it prefers, modulo the nodes)
} tri__device_ref;

// Parses "cpu", "cuda", "cuda:1", "cpu:0,cpu:1", "cuda:0,cuda:1" into out (TRI_TP_MAX entries)
// and *n. INVALID_ARGUMENT, naming the entry, for an empty entry, an unknown kind, a missing or
// bad index ("cuda:"), a duplicate, a mix of cpu and cuda, or more than TRI_TP_MAX entries. A
// CUDA index that does not exist is found when the backend opens (TRI_STATUS_DEVICE).
tri_status tri__device_list_parse(const char *list, tri__device_ref *out, int32_t *n);

// ---- ranks, threads and the all-reduce ----

typedef struct tri__tp tri__tp;

// n ranks (2 .. TRI_TP_MAX) over backends bes (the all-reduce copies through them; they must
// outlive tp). nodes (n, may be NULL): the NUMA node each rank's thread binds to, -1 for none.
// Starts n - 1 threads.
tri_status tri__tp_create(int32_t n, tri__backend *const *bes, const int32_t *nodes, tri__tp **out);
// Joins the threads; NULL is a no-op.
void tri__tp_free(tri__tp *tp);
int32_t tri__tp_n(const tri__tp *tp);

// Runs fn(ctx, r) for every rank r at once, rank 0 on the calling thread, and returns when all
// are done: OK, or the status of the rank that failed first with its message (the others leave
// their all-reduce with the same status). One run at a time.
typedef tri_status (*tri__tp_fn)(void *ctx, int32_t rank);
tri_status tri__tp_run(tri__tp *tp, tri__tp_fn fn, void *ctx);

// Inside a run, on rank's thread: x (n) f32 in rank's backend memory becomes the sum over the
// ranks of their x, added in rank order (x_0 + x_1) + x_2 ... (the same bits on every rank).
// Every rank must call it with the same n, in the same order.
tri_status tri__tp_allreduce(tri__tp *tp, int32_t rank, float *x, int64_t n);

// The all-reduce the forward pass of rank's shard calls (llama.h): tri__tp_allreduce over tp, or
// none (sum NULL, rank 0) for tp NULL.
tri__allreduce tri__tp_allreduce_for(tri__tp *tp, int32_t rank);

// Whether the all-reduce is the backend's collective (tri__backend_ops.comm_create: NCCL on CUDA
// devices), one op on each rank's compute stream that the host does not wait for. It is where
// every rank is a device of one backend that has one and its library loads (not with TRI_NO_NCCL
// set); else the two paths below.
bool tri__tp_uses_comm(const tri__tp *tp);

// Whether the all-reduce reads the other devices' partials by peer copies (every pair of devices
// has peer access: tri__backend_ops.peer_enable) instead of through host memory.
bool tri__tp_uses_peers(const tri__tp *tp);

// ---- a model on N devices ----

// The backends of a device list, the model's shard on each and its view in that backend's
// memory (tri__model_on_backend), and the ranks' threads. With one device this is exactly what
// a session opened before tensor parallelism: tri__backend_select and tri__model_on_backend.
typedef struct tri__tp_group {
    int32_t n;
    tri__tp_split split;
    tri__backend *be[TRI_TP_MAX];
    tri_model *shard[TRI_TP_MAX];    // host shards (n > 1), else NULL
    tri_model *weights[TRI_TP_MAX];  // the shard's (or the model's) view on be[r]
    tri__tp *tp;                     // n > 1, else NULL
    char name[96];                   // "cpu", "cuda:0", "cpu:0,cpu:1", ...
} tri__tp_group;

// Opens the devices of sp (sp->devices when set, else device_kind and device) for model, with
// sp->n_threads CPU threads in all (each CPU rank gets its share, at least one), streaming the
// last sp->weight_layers_streamed blocks of each shard. UNSUPPORTED for weight_layers_from_disk
// over several devices (the reader reads whole tensors from the file, not slices).
tri_status tri__tp_group_open(tri__tp_group *g, const tri_model *model, const tri_session_params *sp);
// Frees views, shards, threads and backends; a zeroed group is a no-op.
void tri__tp_group_close(tri__tp_group *g);

#endif  // TRI_TENSOR_PARALLEL_H
