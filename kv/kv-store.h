// kv-store.h - keys and values of every position, per layer, in backend memory (internal).
//
// Layout per layer: K and V are each (capacity, n_head_kv, head_dim) of type F16 or F32,
// token-major, so that the rows of one batch of new tokens are one contiguous write and a
// layer's used prefix is one contiguous region to stream. Keys are stored after RoPE.
#ifndef TRI_KV_STORE_H
#define TRI_KV_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

typedef struct tri__kv_offload tri__kv_offload;

typedef struct tri__kv_store {
    tri__backend *be;     // owns the memory below
    tri_dtype type;       // F16 or F32
    int32_t n_layer;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t capacity;     // positions
    int32_t n;            // positions 0 .. n-1 hold valid keys and values
    void **k;             // (n_layer) -> (capacity, n_head_kv, head_dim) backend memory; NULL
    void **v;             //   for an offloaded layer, whose rows live in host memory (below)
    tri__kv_offload *off; // NULL: every layer in backend memory
    bool no_prefetch;     // writes do not start the next offloaded layer's upload (a layer-major
                          // pass starts it itself, tri__kv_store_prefetch)
    bool split_step;      // this step splits offloaded layers (tri__kv_store_split_begin): only
    int32_t split_dev;    //   rows [0, split_dev) stream; the rest are attended on the host
    // host descriptors for the full view of one layer, rebuilt by tri__kv_store_view
    tri__kv_span *spans;  // (n_head_kv)
    int32_t *head_span;   // (n_head_kv + 1)
} tri__kv_store;

// Allocates capacity positions for every layer in be's memory. INVALID_ARGUMENT on a type other
// than F16/F32 or non-positive sizes; OUT_OF_MEMORY / DEVICE_OUT_OF_MEMORY when it does not fit.
tri_status tri__kv_store_init(tri__kv_store *kv, tri__backend *be, tri_dtype type, int32_t n_layer,
                              int32_t n_head_kv, int32_t head_dim, int32_t capacity);

// ---- offloaded layers ----
//
// A store made with tri__kv_store_init_offload keeps layers 0 .. on_chip - 1 in backend memory
// and the K and V of layers on_chip .. n_layer - 1 in host memory (one arena region each, pinned
// through the backend's host_register when it has one). Those layers stream through two backend
// buffers of one layer each, used alternately: writing layer il's new rows first makes sure the
// buffer holds its rows before the step (uploading only the used length, not the capacity), then
// starts uploading the next offloaded layer into the other buffer, after the compute that still
// reads that buffer, so the copy overlaps with layer il's attention and feed-forward. New rows are
// written into the buffer by the compute stream and copied back to host memory behind it. On a
// backend with a transfer stream (backend.h) these copies are asynchronous and ordered by events;
// on one without (the CPU) they are plain copies in the same order, so the CPU computes exactly
// what a device does. A buffer that still holds a layer's rows (two offloaded layers, or the same
// layer again) is not uploaded again.
//
// Only a full view is offered for offloaded layers (tri__kv_store_view): the FULL policy's path.

// As tri__kv_store_init, with layers on_chip .. n_layer - 1 offloaded (0 <= on_chip <= n_layer;
// on_chip == n_layer is tri__kv_store_init). OUT_OF_MEMORY names the host regions that did not fit.
tri_status tri__kv_store_init_offload(tri__kv_store *kv, tri__backend *be, tri_dtype type, int32_t n_layer,
                                      int32_t n_head_kv, int32_t head_dim, int32_t capacity, int32_t on_chip);

// Starts making layer il's buffer hold its rows [0, len), as the write of layer il - 1 does unless
// no_prefetch: a no-op for a layer in backend memory or one whose buffer holds them already.
tri_status tri__kv_store_prefetch(tri__kv_store *kv, int32_t il, int32_t len);

// Bytes the offloaded layers moved so far: host -> backend (uploads) and back (new rows).
typedef struct tri__kv_offload_stats {
    int32_t on_chip;
    uint64_t bytes_up, bytes_down;
    int64_t n_uploads;    // layer uploads (K and V together count once)
    int64_t n_reused;     // times a buffer already held the layer's rows
    // split attention (tri__kv_store_attend_split)
    uint64_t bytes_host;  // K and V rows the host half read in place
    uint64_t bytes_partial; // q down, the device half's state down, the output up
    int64_t n_split;      // layer attentions split between the device and the host
} tri__kv_offload_stats;
void tri__kv_store_offload_stats(const tri__kv_store *kv, tri__kv_offload_stats *out);
void tri__kv_store_free(tri__kv_store *kv);

// Writes n positions starting at pos of layer il: k and v (n, n_head_kv, head_dim) f32 in backend
// memory, converted to the store's type. Does not change kv->n: the caller commits with
// tri__kv_store_set_len once every layer has been written.
tri_status tri__kv_store_write(tri__kv_store *kv, int32_t il, int32_t pos, int32_t n, const float *k,
                               const float *v);

// Sets the number of valid positions: growing after writes, shrinking to roll back.
tri_status tri__kv_store_set_len(tri__kv_store *kv, int32_t n);

// The view of layer il over positions [0, n_pos): one span per KV head. The returned view and its
// spans live in kv and are valid until the next call.
const tri__kv_view *tri__kv_store_view(tri__kv_store *kv, int32_t il, int32_t n_pos,
                                       tri__kv_view *view);

// ---- split attention: attending where the KV lives (docs/offload.md) ----
//
// In a step that splits, offloaded layer il streams only its rows [0, split_dev) (a multiple of
// TRI_ATTN_CHUNK, at most the rows before the step) and attends to them on the device
// (attention_state), while a CPU backend of the store's own attends to rows [split_dev, end) where
// they lie in host memory, the step's new rows among them once written back; the host folds the
// device's state and its own chunk partials in chunk order (tri__cpu_attention_merge), which is
// the unsplit attention's order, and uploads the output. Queries go down and the (m, n_head,
// head_dim + 2) state comes back: a few KB per token and head.

// The most tokens a step may have and split (verification passes carry gamma2 + 1; longer steps,
// prefill's, stream every row).
#define TRI_KV_SPLIT_MAX_STEP 32

// Makes offloaded layers attend host_frac of their rows (0 <= host_frac <= 1; 0: all stream, as
// before) on the host in the steps that split, with n_threads host threads (<= 0: the cores of
// the device's NUMA node, or of the machine, less one for the threads that feed the device). A
// backend without attention_state, or a store without offloaded layers, keeps streaming every row
// (logged once). INVALID_ARGUMENT for a fraction outside [0, 1].
tri_status tri__kv_store_set_split(tri__kv_store *kv, double host_frac, int32_t n_threads);
// Starts a step of m tokens after n0 rows: it splits when the store has a host fraction, m <=
// TRI_KV_SPLIT_MAX_STEP and no layer-major pass runs; sets split_step and split_dev. Before the
// step's first write.
void tri__kv_store_split_begin(tri__kv_store *kv, int32_t n0, int32_t m);
// Ends the step (after its last layer): later reads stream as before.
void tri__kv_store_split_end(tri__kv_store *kv);
// Whether layer il's attention is split in this step.
bool tri__kv_store_splits(const tri__kv_store *kv, int32_t il);
// Layer il's attention for the step's m queries q (m, n_head, head_dim) f32 backend memory at
// q_pos (host) over rows [0, end): out (m, n_head, head_dim) backend memory, as attention over the
// layer's full view gives (the same bits on the CPU backend), masked by tree (NULL: causally), its
// scores soft-capped by softcap (tri__kv_view.softcap; 0: none). After the layer's write.
tri_status tri__kv_store_attend_split(tri__kv_store *kv, int32_t il, float *out, const float *q, const int32_t *q_pos,
                                      int32_t m, int32_t n_head, int32_t end, const tri__kv_tree *tree, float softcap);

// The same for a view of spans of their own types (span_types: kv_type mixed's, policy-mixed.c) over
// rows [0, end) of layer il, each head's spans alike and in position order without position lists:
// spans of the store's type are its rows (the layer's buffer, as tri__kv_store_view gives them),
// the others f16 rows in backend memory. The device attends every span's rows below split_dev;
// the host the rest: the store's rows where they lie in host memory, the f16 ones copied down
// first (kv_type mixed's window: a few hundred rows). Folded as tri__kv_store_attend_split folds,
// so the result is the bits of the attention over the view (on the CPU backend).
tri_status tri__kv_store_attend_split_view(tri__kv_store *kv, int32_t il, float *out, const float *q,
                                           const int32_t *q_pos, int32_t m, int32_t n_head, const tri__kv_view *view);

// Measures the host half's speed on this machine: KV bytes (K and V, f16) per second that
// tri__cpu_attention_chunks reads over rows keys of n_head_kv heads of head_dim for m queries of
// n_head heads, on a CPU backend of n_threads (<= 0: as tri__kv_store_set_split), best of reps
// after a warm-up. The figure the planner's host_attn_gbps wants at the pass's query count.
tri_status tri__kv_host_attention_gbps(int32_t n_threads, int32_t m, int32_t n_head, int32_t n_head_kv,
                                       int32_t head_dim, int32_t rows, int32_t reps, double *gbps);

// ---- readers that borrow a store (the retrieval level over the full cache's rows) ----

// As tri__kv_store_view, for a reader that did not write layer il in this step: an offloaded
// layer is first uploaded (rows [0, n_pos)) unless a buffer holds them, and the next offloaded
// layer starts uploading behind it, as a write does. The view is valid until the next call on kv.
tri_status tri__kv_store_view_read(tri__kv_store *kv, int32_t il, int32_t n_pos, const tri__kv_view **view,
                                   tri__kv_view *storage);

// Where layer il's keys (which 0) or values (which 1) live: *host is true for an offloaded layer
// (its host region; rows written by the last steps are current there once the backend is
// synchronized), false for backend memory. Row pos starts tri__kv_store_row_bytes(kv) * pos bytes in.
const void *tri__kv_store_rows(const tri__kv_store *kv, int32_t il, int which, bool *host);

// Copies rows pos .. pos + n - 1 of layer il's keys (which 0) or values (1) into host memory
// (n, n_head_kv, head_dim) of the store's type, wherever the layer lives; waits for the copies.
tri_status tri__kv_store_read_rows(tri__kv_store *kv, int32_t il, int which, int32_t pos, int32_t n, void *host);

// Writes n rows at pos of layer il from host memory (k_host and v_host: (n, n_head_kv, head_dim)
// of the store's type), wherever the layer lives: an offloaded layer's host region directly, a
// layer in backend memory by a copy. For loading a cache (benchmarks fill synthetic ones); the
// caller sets the length. Waits for the copies (synchronize) on a backend with a transfer stream.
tri_status tri__kv_store_load_rows(tri__kv_store *kv, int32_t il, int32_t pos, int32_t n, const void *k_host,
                                   const void *v_host);

// Copies rows pos .. pos + n - 1 of every layer from src into dst, wherever either keeps a layer
// (backend memory or, offloaded, host memory). Same shape and type required (INVALID_ARGUMENT
// otherwise); src must hold the rows (src->n >= pos + n). dst's length is the caller's to set.
tri_status tri__kv_store_copy_rows(tri__kv_store *dst, tri__kv_store *src, int32_t pos, int32_t n);

// Bytes of one position of one layer (K or V alone).
int64_t tri__kv_store_row_bytes(const tri__kv_store *kv);

#endif  // TRI_KV_STORE_H
