// backend.h - the compute backend interface: one function table per backend (internal).
//
// The Llama forward pass, the cache policies and the offload engine are written once against
// this table; backends/cpu/ and backends/cuda/ each provide one `static const tri__backend_ops`. The CPU backend is
// the reference every other backend is tested against.
//
// Memory. "Backend memory" is what ops->alloc returns (host memory for the CPU backend, device
// memory for CUDA). Every tensor argument of an op (x, y, W, K/V rows, ...) is backend memory,
// except where a comment says "host": small index arrays (token ids, positions) and the
// descriptors (tri__rope, tri__kv_view and its spans) live in host memory and are read during the
// call, so backends may upload them. Weights may also be host memory mapped from a file on the CPU
// backend (the CPU backend's memory *is* host memory).
//
// Ordering. Ops are issued in order on one stream per backend instance. They may run
// asynchronously (CUDA); results are visible to the host after ops->synchronize(). The CPU
// backend runs every op to completion before returning. Output buffers never alias inputs unless
// a comment says they may.
//
// Errors. Ops return TRI_STATUS_OK or a status recorded with tri__fail: INVALID_ARGUMENT for bad
// sizes, UNSUPPORTED for a dtype the op does not take. A status that an asynchronous backend only
// learns later is returned by ops->synchronize().
//
// Shapes are written outermost first, row-major: (m, n) is m rows of n contiguous f32.
#ifndef TRI_BACKEND_H
#define TRI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rope.h"
#include "stream-window.h"
#include "triforce.h"

typedef struct tri__backend tri__backend;
typedef struct tri__event tri__event;  // a point in a stream's queue, backend-owned (opaque)
typedef struct tri__graph tri__graph;  // recorded ops to replay, backend-owned (opaque)
typedef struct tri__comm tri__comm;    // a communicator over several instances' devices, backend-owned (opaque)

// The two queues of a backend instance: every op and the plain copies run on COMPUTE; TRANSFER
// carries the offload engine's copies so that they overlap with compute (backends with streams).
typedef enum tri__stream {
    TRI_STREAM_COMPUTE = 0,
    TRI_STREAM_TRANSFER = 1,
} tri__stream;

// ---- KV views: what one layer's attention reads ----

// A run of keys and values of one KV head. Rows hold head_dim values of the view's dtype; row j
// of K starts at (element type *)k + j * stride, likewise for V.
typedef struct tri__kv_span {
    int32_t pos0;        // position of row 0; row j has position pos0 + j (unless pos != NULL)
    int32_t n;           // rows in the span, >= 0
    const void *k;       // (n, stride) backend memory, first head_dim elements of each row used
    const void *v;       // (n, stride) backend memory
    int64_t stride;      // elements (not bytes) between consecutive rows, >= head_dim
    const int32_t *pos;  // (n) host, per-row positions overriding pos0 + j, or NULL
    tri_dtype type;      // with the view's span_types: this span's rows' type (else unused)
} tri__kv_span;

// A token tree among a pass's own rows (speculative verification of several candidates per
// position, docs/speculative.md, "Token trees"): the keys at positions row0 .. row0 + n - 1 (as the
// view gives positions) are the tree's nodes 0 .. n - 1, each after its parent, and so are the
// queries at those q_pos. Between two nodes the causal rule is replaced: query node r sees key node
// c only when c is r or one of r's ancestors. Every other (query, key) pair keeps the causal rule
// (so a query before row0 sees no node, a node sees every key before row0).
typedef struct tri__kv_tree {
    int32_t row0;         // position of node 0
    int32_t n;            // nodes, >= 1
    int32_t words;        // uint32 words per node in anc: (n + 31) / 32
    const uint32_t *anc;  // (n, words) host: bit c of node r's words set iff c is r or an ancestor of r
} tri__kv_tree;

// Whether query position qp sees key position kp under the causal rule and the tree (NULL: none).
static inline bool tri__kv_tree_sees(const tri__kv_tree *t, int32_t qp, int32_t kp) {
    if (kp > qp) return false;
    if (!t || kp < t->row0 || qp >= t->row0 + t->n) return true;  // kp < row0 + n follows from kp <= qp
    int32_t r = qp - t->row0, c = kp - t->row0;
    return (t->anc[(int64_t)r * t->words + c / 32] >> (c % 32)) & 1u;
}

// anc (n, (n + 31) / 32) = the ancestor-or-self masks of the tree whose node i has parent
// parent[i] (< i; -1: the tree's root level).
static inline void tri__kv_tree_masks(uint32_t *anc, const int32_t *parent, int32_t n) {
    int32_t w = (n + 31) / 32;
    for (int32_t i = 0; i < n; i++) {
        uint32_t *a = anc + (int64_t)i * w;
        if (parent[i] >= 0) {
            for (int32_t e = 0; e < w; e++) a[e] = anc[(int64_t)parent[i] * w + e];
        } else {
            for (int32_t e = 0; e < w; e++) a[e] = 0;
        }
        a[i / 32] |= 1u << (i % 32);
    }
}

// Keys and values for every KV head of one layer. The spans of KV head h are
// spans[head_span[h] .. head_span[h + 1]); a head may have any number of spans (a full cache is
// one span, StreamingLLM two: sinks and window, retrieval one per selected chunk plus the recent
// tokens). Keys are stored after RoPE.
typedef struct tri__kv_view {
    tri_dtype type;               // F16 or F32; on the CPU and CUDA also Q8_0, Q4_0: rows of whole
                                  // blocks, stride and head offsets multiples of 32 elements (row j of
                                  // a span starts tri__dtype_row_bytes(type, j * stride) bytes past k)
    int32_t n_head_kv;
    const tri__kv_span *spans;    // host
    const int32_t *head_span;     // (n_head_kv + 1) host, non-decreasing, head_span[0] == 0
    const tri__kv_tree *tree;     // host, or NULL: the plain causal mask (tri__kv_tree_sees)
    bool span_types;              // each span's rows are of its own type (span.type), not `type`:
                                  // a retrieval cache's gathered chunks quantized beside f16 rows,
                                  // kv_type mixed's q4_0 rows beside its f16 sinks and window
                                  // (docs/kv-policies.md). Read by the CPU and CUDA attention,
                                  // attention_state and attention_dev (any of F32, F16, Q8_0, Q4_0
                                  // per span); the callers (spec.c, session.c) refuse to make such
                                  // views for any other backend, naming draft_kv_type or kv_type
    float softcap;                // attention-logit soft-cap (Gemma 2): each scaled score s becomes
                                  // softcap * tanh(s / softcap) before the mask and the softmax;
                                  // 0: none. Read by the CPU and CUDA attention, attention_state,
                                  // attention_dev, the weight sums and the host chunks of a split
} tri__kv_view;

// The type of span s's rows in view v.
static inline tri_dtype tri__kv_span_type(const tri__kv_view *v, const tri__kv_span *s) {
    return v->span_types ? s->type : v->type;
}

// ---- ops ----

typedef struct tri__backend_ops {
    const char *name;  // "cpu", "cuda"

    // Releases the instance itself (the struct and its private state). Required.
    void (*destroy)(tri__backend *be);

    // ---- memory ----

    // Allocates bytes of backend memory, aligned to at least 64 bytes; *out = NULL for bytes == 0.
    // TRI_STATUS_OUT_OF_MEMORY or TRI_STATUS_DEVICE_OUT_OF_MEMORY when it cannot.
    tri_status (*alloc)(tri__backend *be, size_t bytes, void **out);
    // Frees what alloc returned; free(NULL) is a no-op. Waits for pending ops that use ptr.
    void (*free)(tri__backend *be, void *ptr);
    // Host -> backend and backend -> host copies, queued in order with the ops; the host buffer
    // must stay valid (and, for to_host, unread) until synchronize. Pinned host memory makes them
    // truly asynchronous on CUDA.
    tri_status (*copy_to_backend)(tri__backend *be, void *dst, const void *src_host, size_t bytes);
    tri_status (*copy_to_host)(tri__backend *be, void *dst_host, const void *src, size_t bytes);
    // Backend -> backend copy (KV appends, rollback). Optional: NULL means use the two above.
    tri_status (*copy)(tri__backend *be, void *dst, const void *src, size_t bytes);
    // Waits for every queued op and copy.
    tri_status (*synchronize)(tri__backend *be);

    // ---- linear algebra ----

    // y (m, n) f32 = x (m, k) f32 @ W^T, W (n, k) row-major of type w_type, any of F32, F16,
    // BF16 and the quantized types (k a multiple of their block: 32, 256 for the K-quants). Quantized rows are
    // dequantized block by block on the fly; for them a backend may first quantize x to 8-bit
    // blocks of 32 (as GGML does), which adds a relative error of about 2^-8 per element of x.
    // Each row of W is read once per call whatever m is.
    tri_status (*matmul)(tri__backend *be, float *y, const float *x, const void *w,
                         tri_dtype w_type, int64_t m, int64_t n, int64_t k);

    // Embedding lookup: out (m, n) f32, row i = row ids[i] of table (n_rows, n) of type
    // table_type (any matmul weight type), converted to f32. ids (m) int32, host, each in
    // [0, n_rows) (INVALID_ARGUMENT otherwise).
    tri_status (*get_rows)(tri__backend *be, float *out, const void *table, tri_dtype table_type,
                           int64_t n_rows, int64_t n, const int32_t *ids, int64_t m);

    // Converts n f32 values to dst_type (F32, F16 or BF16, round to nearest even; the CPU also
    // Q8_0 and Q4_0, n a multiple of 32, by tri__quantize_row): writing new keys and values into
    // the cache.
    tri_status (*convert)(tri__backend *be, void *dst, tri_dtype dst_type, const float *src,
                          int64_t n);

    // ---- elementwise and normalisation ----

    // y (m, n) = x / sqrt(mean(x^2) + eps) * weight, per row; weight (n) F32, F16 or BF16.
    // y may equal x.
    tri_status (*rmsnorm)(tri__backend *be, float *y, const float *x, const void *weight,
                          tri_dtype weight_type, int64_t m, int64_t n, float eps);

    // Rotates x (m, n_heads, rope->head_dim) f32 in place; row i at position pos[i] (host, m
    // int32, >= 0). Layout, frequencies and attention factor come from rope (see rope.h).
    tri_status (*rope)(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                       const tri__rope *rope);

    // out (n) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). out may equal gate or up.
    tri_status (*swiglu)(tri__backend *be, float *out, const float *gate, const float *up,
                         int64_t n);

    // out (n) = a + b (the residual). out may equal a or b.
    tri_status (*add)(tri__backend *be, float *out, const float *a, const float *b, int64_t n);

    // ---- sampling helpers ----

    // In place, per row of x (m, n): x = softmax(x / temperature). temperature > 0; 1 for a plain
    // softmax. -inf entries get probability 0; a row of all -inf is INVALID_ARGUMENT.
    tri_status (*softmax)(tri__backend *be, float *x, int64_t m, int64_t n, float temperature);

    // Per row of x (m, n): the k largest values in descending order with their column indices,
    // ties broken by the lower index. values (m, k) f32, indices (m, k) int32, 1 <= k <= n. NaN
    // counts as smaller than everything.
    tri_status (*top_k)(tri__backend *be, float *values, int32_t *indices, const float *x,
                        int64_t m, int64_t n, int64_t k);

    // ---- attention ----

    // Causal attention with grouped-query heads over a KV view.
    //   q (m, n_head, head_dim) f32: query i sits at position q_pos[i] (host, m int32)
    //   out (m, n_head, head_dim) f32: softmax(q . K^T * scale) @ V, where query head h reads KV
    //     head h / (n_head / kv->n_head_kv) and key j is visible iff its position <= q_pos[i]
    //     (and, with kv->tree, the tree allows it: tri__kv_tree_sees).
    //     scale = 1 / sqrt(head_dim). A query that sees no key gets zeros.
    //   weight_sums: NULL, or (sum over heads of their keys) f32: for KV head h and its j-th key in
    //     span order, at offset (keys of heads 0 .. h-1) + j, the attention probability that key
    //     received summed over the n_head / n_head_kv query heads of the group and the m queries
    //     (H2O's accumulated attention). Overwritten, not accumulated.
    // Scores are f32 with f32 accumulation and an online (running max) softmax; scratch is
    // bounded by a tile of keys, not the length of the view. n_head must be a multiple of
    // kv->n_head_kv.
    tri_status (*attention)(tri__backend *be, float *out, const float *q, const int32_t *q_pos,
                            int64_t m, int64_t n_head, int64_t head_dim, const tri__kv_view *kv,
                            float *weight_sums);

    // ---- the transfer stream (optional: all NULL on a backend that completes every op and
    // copy before returning, the CPU, where the callers copy in order instead) ----

    // Events: created once, recorded many times.
    tri_status (*event_create)(tri__backend *be, tri__event **out);
    void (*event_destroy)(tri__backend *be, tri__event *ev);  // NULL is a no-op
    // Marks the point that everything queued on stream so far reaches.
    tri_status (*event_record)(tri__backend *be, tri__event *ev, tri__stream stream);
    // Work queued on stream from now on starts after ev's point is reached; the host does not wait.
    tri_status (*stream_wait)(tri__backend *be, tri__stream stream, tri__event *ev);
    // Host -> backend and backend -> host copies queued on TRANSFER. The host side should be
    // pinned (host_register) for the copy to be asynchronous; it must stay valid until the copy is
    // known to be done (an event, or synchronize, which waits for both streams).
    tri_status (*transfer_to_backend)(tri__backend *be, void *dst, const void *src_host, size_t bytes);
    tri_status (*transfer_to_host)(tri__backend *be, void *dst_host, const void *src, size_t bytes);
    // Pins (page-locks) host memory for asynchronous copies and undoes it (cudaHostRegister).
    // Optional on their own: NULL leaves host memory pageable.
    tri_status (*host_register)(tri__backend *be, void *ptr, size_t bytes);
    void (*host_unregister)(tri__backend *be, void *ptr);
    // Blocks the host until ev's point is reached (cudaEventSynchronize): a host buffer a transfer
    // read can be refilled without waiting for every stream. For an event recorded on COMPUTE the
    // copy_to_host calls queued before it have landed too. Optional: NULL means synchronize.
    tri_status (*event_synchronize)(tri__backend *be, tri__event *ev);

    // ---- gathering ----

    // Row i of dst (n rows of row_bytes bytes, contiguous) = the row_bytes at src + offsets[i]
    // bytes (host, n int64, each >= 0): the retrieval cache copies a selection's chunks out of a
    // layer of the full cache in one call. dst and src are backend memory and do not overlap.
    // row_bytes > 0; a multiple of 4 with 4-aligned src, dst and offsets takes the fast path on
    // CUDA. Required.
    tri_status (*gather)(tri__backend *be, void *dst, const void *src, const int64_t *offsets, int64_t n,
                         int64_t row_bytes);

    // Chunk summaries: out (n_chunks, width) f32, out[c][j] = the mean of x[(c * chunk + r) * stride
    // + j] over r < chunk, summed in double in order of r and divided by chunk in double (so every
    // backend gives the same bits). x is rows of type F16, F32, or a quantized cache's Q8_0 / Q4_0
    // blocks (each element the value tri__dequantize_row gives; stride a multiple of 32, else
    // INVALID_ARGUMENT), UNSUPPORTED otherwise, with stride elements between rows, width <= stride;
    // the retrieval cache summarises a layer's keys where they are instead of copying them out.
    // Required.
    tri_status (*chunk_mean)(tri__backend *be, float *out, const void *x, tri_dtype type, int64_t n_chunks,
                             int64_t chunk, int64_t width, int64_t stride);

    // ---- split attention (docs/offload.md, "Attending where the KV lives") ----

    // Attention's state before its last division: state (m, n_head, head_dim + 2) f32, per
    // (query, head) row its accumulator (head_dim), running max and sum, so that out = acc / sum
    // (zeros where sum is 0: the row saw no key). The keys of each KV head are taken in chunks of
    // TRI_ATTN_CHUNK keys in span order, and the chunks folded in order with attention's fold
    // (M' = max(M, m_c), S' = S e^(M - M') + s_c e^(m_c - M'), A' likewise), so that folding more
    // chunks into the state (tri__cpu_attention_merge) gives what attention over the longer view
    // gives: the same bits on the CPU, within the kernels' tolerance on a device. Arguments as
    // attention's, no weight sums. Optional: NULL means the backend cannot attend to part of an
    // offloaded layer, whose rows then all stream.
    tri_status (*attention_state)(tri__backend *be, float *state, const float *q, const int32_t *q_pos, int64_t m,
                                  int64_t n_head, int64_t head_dim, const tri__kv_view *kv);

    // ---- simulated devices ----

    // Host-side work on host rows that a simulated device never materialised (be->simulated): the
    // caller calls this instead of doing the work, which the backend puts on its clock. kind
    // TRI_HOST_WORK_COPY: bytes copied row by row (a gather out of offloaded rows);
    // TRI_HOST_WORK_REDUCE: bytes read and summed (chunk summaries of offloaded keys). Optional:
    // NULL on every real backend, where the caller does the work.
    void (*host_work)(tri__backend *be, int kind, double bytes);

    // ---- what some model families need (model/family.h); optional: NULL, the forward pass of
    // such a family fails with UNSUPPORTED naming the op (add_rows falls back on add per row) ----

    // out (n) = gelu_tanh(gate) * up, gelu_tanh(g) = g / 2 (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
    // (Gemma's GeGLU). out may equal gate or up.
    tri_status (*geglu)(tri__backend *be, float *out, const float *gate, const float *up, int64_t n);
    // x (n) *= s in place (Gemma's embedding scale).
    tri_status (*scale)(tri__backend *be, float *x, int64_t n, float s);
    // x (m, n): every row += b (n) (Qwen2's q, k, v biases).
    tri_status (*add_rows)(tri__backend *be, float *x, const float *b, int64_t m, int64_t n);

    // ---- several devices (tensor parallelism, engine/tensor-parallel.c) ----

    // Makes other's memory readable by be's device (peer access, cudaDeviceEnablePeerAccess) and
    // says whether it is: false where the devices cannot (RTX 4090s), other is not the same kind
    // of backend, or be == other. Optional: NULL means no.
    bool (*peer_enable)(tri__backend *be, tri__backend *other);
    // dst (be's memory) = bytes at src, memory of other, to which peer_enable gave be access;
    // queued on be's COMPUTE stream (src must be complete; it is read until be synchronizes).
    // Required where peer_enable is.
    tri_status (*copy_peer)(tri__backend *be, void *dst, tri__backend *other, const void *src, size_t bytes);

    // Collectives (NCCL on CUDA). Optional: NULL, and comm_create NOT_FOUND where the library is
    // absent or turned off, mean the caller sums through host memory or peer copies instead.
    // A communicator over bes (n >= 2 instances of this table on distinct devices; rank r is
    // bes[r]); free it with comm_free (NULL: a no-op) once the ranks' work is synchronized, before
    // the instances. NOT_FOUND, saying why, when the collective library cannot be loaded.
    tri_status (*comm_create)(tri__backend *const *bes, int32_t n, tri__comm **out);
    void (*comm_free)(tri__comm *comm);
    // x (n) f32, be's memory, becomes the sum over the ranks of their x, in place; queued on be's
    // COMPUTE stream (after the work that writes x, before the work queued after it), so the host
    // does not wait, and recorded like any op between graph_begin and graph_end. be is rank
    // rank of comm. Every rank makes the same calls with the same n in the same order, each from
    // its own host thread: the calls meet on the devices, so a rank must not wait on the host
    // for another rank that has yet to make its call.
    tri_status (*allreduce)(tri__backend *be, tri__comm *comm, int32_t rank, float *x, int64_t n);

    // ---- steps driven from backend memory, and graphs (model/llama.h, "the one-token step") ----
    //
    // A step whose every varying index (a token id, a position, the rows it reads and writes)
    // lives in backend memory issues the same ops with the same arguments every time, so it can be
    // recorded once and replayed: the host then writes a few integers and launches one graph per
    // step instead of a few hundred ops (CUDA graphs). Optional: all NULL, or only the graph slots
    // NULL where ops cannot be recorded (the CPU, where the _dev ops are the plain ones: its memory
    // is host memory).

    // get_rows, rope and attention (no weight_sums) with ids, pos and q_pos in backend memory,
    // read when the op runs. get_rows_dev does not check the ids: each must be in [0, n_rows).
    tri_status (*get_rows_dev)(tri__backend *be, float *out, const void *table, tri_dtype table_type, int64_t n_rows,
                               int64_t n, const int32_t *ids, int64_t m);
    tri_status (*rope_dev)(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                           const tri__rope *rope);
    tri_status (*attention_dev)(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                int64_t n_head, int64_t head_dim, const tri__kv_view *kv);
    // Row rows[i] of dst (rows of n elements of dst_type: F32, F16 or BF16) = row i of src (m, n)
    // f32, converted (round to nearest even); rows (m) int32 in backend memory, distinct: a step's
    // keys and values written into the store rows the step computed.
    tri_status (*set_rows)(tri__backend *be, void *dst, tri_dtype dst_type, const float *src, const int32_t *rows,
                           int64_t m, int64_t n);
    // The view of a StreamingLLM step of one token at the length held in backend memory
    // (stream-window.h). state (4) int32 backend: state[1] = n0, the length before the step, is
    // read; written: state[2] = its cache position (tri__window_kept), state[3] = the store row of
    // its position n0, and rows (view_rows) int32 backend: row i < state[2] the store row of view
    // position i (tri__window_row of tri__window_pos), rows from state[2] on the step's own row
    // (the attention mask hides them past state[2]). view_rows >= budget + max(evict_every, 1).
    tri_status (*window_rows)(tri__backend *be, int32_t *state, int32_t *rows, int32_t view_rows,
                              const tri__stream_window *w);

    // Recording: the ops issued between graph_begin and graph_end are not run but recorded, with
    // their arguments as given (pointers, sizes) and the host arrays they read (positions, views,
    // rope tables) copied at recording; the scratch they use is the graph's own. graph_launch runs
    // them again, in order, on COMPUTE. Recording refuses (UNSUPPORTED) what a replay could not
    // repeat: copies to or from pageable host memory, synchronize, events. graph_end ends every
    // recording, a failed one too (then *out is NULL and the status says why); free with
    // graph_free (NULL: a no-op), after the launches that use it are synchronized.
    tri_status (*graph_begin)(tri__backend *be);
    tri_status (*graph_end)(tri__backend *be, tri__graph **out);
    tri_status (*graph_launch)(tri__backend *be, tri__graph *g);
    void (*graph_free)(tri__backend *be, tri__graph *g);

    // What the backend can do beyond the required slots (TRI_BACKEND_CAP_*). The engine asks
    // these, never the backend's name.
    uint32_t caps;

    // Writes the PCI bus id of the backend's device ("0000:01:00.0") into out, n bytes (32
    // suffice), "" on failure. Optional: NULL for a backend without a PCI device (the CPU, a
    // simulated device).
    tri_status (*pci_bus_id)(const tri__backend *be, char *out, size_t n);
} tri__backend_ops;

// Capabilities (tri__backend_ops.caps).
enum {
    // attention and attention_state honour a view's tree (tri__kv_tree); without it the
    // speculative engine refuses token trees on the backend
    TRI_BACKEND_CAP_TREES = 1u << 0,
    // KV rows of the quantized types (q8_0, q4_0) are stored, gathered and attended
    TRI_BACKEND_CAP_QUANT_KV = 1u << 1,
    // attention reads views whose spans mix types (span_types: f16, f32, q8_0, q4_0 in one view),
    // which kv_type mixed and quantized draft caches over another target type produce
    TRI_BACKEND_CAP_TYPED_VIEWS = 1u << 2,
};

enum { TRI_HOST_WORK_COPY = 0, TRI_HOST_WORK_REDUCE = 1 };

// One backend instance. Create it with the backend's own constructor (tri__backend_cpu_create),
// free it with tri__backend_free.
struct tri__backend {
    const tri__backend_ops *ops;
    int32_t n_threads;  // worker threads for the ops (CPU); may be changed between calls
    bool host_memory;   // backend memory is host memory, so host data (a model's mapped weights)
                        // can be passed to ops as it is; false on a device. Tests clear it on a
                        // CPU instance to run the device path (copies into backend memory) on CPU.
    bool simulated;     // a simulated device (backends/sim/sim-backend.h): backend memory is fake handles and
                        // host buffers handed to transfer_to_* are never read or written, so host
                        // regions for them need not exist (arenas map them without touching them)
    void *priv;         // the backend's own state
};

// Frees be through its table; NULL is a no-op.
static inline void tri__backend_free(tri__backend *be) {
    if (be) be->ops->destroy(be);
}

// ---- the CPU backend (backends/cpu/) ----

// SIMD code paths of the CPU kernels, chosen at run time.
typedef enum tri__cpu_simd {
    TRI_CPU_SIMD_AUTO = -1,   // the best the CPU supports
    TRI_CPU_SIMD_SCALAR = 0,  // plain C, the reference
    TRI_CPU_SIMD_AVX2 = 1,    // AVX2 + FMA + F16C
    TRI_CPU_SIMD_AVX512 = 2,  // AVX-512 F/BW/VL (+ the AVX2 set)
    TRI_CPU_SIMD_AVX512_VNNI = 3,  // the AVX-512 set + VNNI (vpdpbusd in the quantized matmuls)
} tri__cpu_simd;

// The best level this CPU supports.
tri__cpu_simd tri__cpu_simd_detect(void);
// "scalar", "avx2", "avx512", "avx512vnni".
const char *tri__cpu_simd_name(tri__cpu_simd simd);

// Keys per chunk of attention's fold (cpu_attention): a split of a view at a multiple of it,
// folded in chunk order, gives the unsplit result bit for bit.
#define TRI_ATTN_CHUNK 1024

// The host half of a split attention, on a CPU backend: chunks (n_chunk, m, n_head, head_dim + 2)
// f32 host, each chunk's own partial (accumulator, max, sum; (0, -inf, 0) where a row sees none
// of its keys), n_chunk = ceil(the longest head's keys / TRI_ATTN_CHUNK). With chunks NULL only
// *n_chunk is set (to size the buffer). Arguments otherwise as attention's; be must be a CPU
// backend (its memory is host memory: q, q_pos and the view's rows are host memory).
tri_status tri__cpu_attention_chunks(tri__backend *be, float *chunks, int64_t *n_chunk, const float *q,
                                     const int32_t *q_pos, int64_t m, int64_t n_head, int64_t head_dim,
                                     const tri__kv_view *kv);
// Folds chunks (n_chunk, rows, head_dim + 2) in order into state (rows, head_dim + 2), both host,
// and writes out (rows, head_dim) = acc / sum: attention's fold and division, so state from
// attention_state over the first keys and chunks over the rest give attention over all of them.
void tri__cpu_attention_merge(float *out, float *state, const float *chunks, int64_t n_chunk, int64_t rows,
                              int64_t head_dim);
// Opt-in, off by default: with on, the attention of a CPU backend scores f16 keys with q and k
// rounded to bf16 (AVX512-BF16's vdpbf16ps, f32 sums; backends/cpu/kernels-bf16.c), which changes the scores
// by bf16's rounding (about 3 significant digits); values and softmax stay f32. UNSUPPORTED where
// the CPU lacks AVX512-BF16. Used by benchmarks/bench-attention; no default path turns it on.
tri_status tri__cpu_set_attn_bf16(tri__backend *be, bool on);

// Creates a CPU backend with n_threads threads, the caller included (<= 0: all cores)
// using SIMD level simd (TRI_CPU_SIMD_AUTO: detect). A level the CPU lacks is UNSUPPORTED, so
// tests can force each level the machine has. Free with tri__backend_free.
tri_status tri__backend_cpu_create(int32_t n_threads, tri__cpu_simd simd, tri__backend **out);

#endif  // TRI_BACKEND_H
