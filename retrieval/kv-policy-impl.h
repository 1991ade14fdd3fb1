// kv-policy-impl.h - what the policies' files share behind kv-policy.h (internal to retrieval/).
//
// kv-policy.c holds the parameters, the life cycle and the step that every policy goes through
// (begin, layer, observe, commit, abort, truncate, reset, adopt) and the measurement; it calls
// into the one file of each policy for what differs:
//   policy-full.c       the full cache (and the tap that lets a retrieval cache select during it)
//   policy-streaming.c  StreamingLLM: sinks and a window, keys rotated by cache position
//   policy-h2o.c        H2O: heavy hitters and a recent window per (layer, KV head)
//   policy-retrieval.c  TriForce's retrieval cache: chunk summaries, selection, borrowed rows
// A policy's state (tri__h2o_state, tri__retrieval_state) is private to its file.
#ifndef TRI_KV_POLICY_IMPL_H
#define TRI_KV_POLICY_IMPL_H

#include <stdlib.h>

#include "error.h"
#include "kv-policy.h"

// calloc count elements into ptr, or fail (st, goto fail) naming the field.
#define ALLOC(ptr, count)                                                                   \
    do {                                                                                    \
        (ptr) = calloc((size_t)(count), sizeof *(ptr));                                     \
        if (!(ptr)) {                                                                       \
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy: %s (%lld)", #ptr, (long long)(count)); \
            goto fail;                                                                      \
        }                                                                                   \
    } while (0)

static inline int32_t kv_dim(const tri__kv_policy *p) { return p->n_head_kv * p->head_dim; }
static inline int64_t esize(const tri__kv_policy *p) { return p->kv->type == TRI_DTYPE_F16 ? 2 : 4; }
// Bytes of one position of one layer (every KV head), keys or values.
static inline int64_t row_bytes(const tri__kv_policy *p) { return kv_dim(p) * esize(p); }

// ---- kv-policy.c ----

// The view descriptors every policy needs: spans_per_head spans per KV head, the step's positions.
tri_status tri__kv_policy_common_init(tri__kv_policy *p, int32_t spans_per_head);
// tri__kv_policy_peek out of a store: head h's row of position pos, wherever kv keeps layer il.
bool tri__kv_policy_peek_store(tri__kv_store *kv, int32_t il, int32_t h, int32_t pos, int which, void *out);
// p->view over p->spans / p->head_span, in the store's type.
static inline const tri__kv_view *tri__kv_policy_own_view(tri__kv_policy *p) {
    p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                             .head_span = p->head_span};
    return &p->view;
}

// ---- policy-full.c ----

// Layer il of a FULL step ending at end: stores k and v, returns the store's view, and makes an
// armed tap's selection for that layer (tri__kv_policy_tap) when the step ends at its length.
tri_status tri__full_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v, int32_t end,
                           const tri__kv_view **view);

// ---- policy-streaming.c ----

// Before the store exists: checks the streaming parameters and sizes a bounded store (ring_rows,
// cap), setting *store_rows when it is smaller than the capacity.
tri_status tri__streaming_setup(tri__kv_policy *p, int32_t capacity, int32_t *store_rows);
// After: the scratch of a step's gathered, rotated view.
tri_status tri__streaming_init(tri__kv_policy *p);
void tri__streaming_free(tri__kv_policy *p);
// A step of m tokens at n0: which rows its view gathers; *base: where its queries sit in the cache.
tri_status tri__streaming_begin(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base);
// Stores the step's rows of layer il and returns its view, gathered and rotated by cache position.
tri_status tri__streaming_layer(tri__kv_policy *p, int32_t il, const float *k, const float *v,
                                const tri__kv_view **view);
// Whether a rollback to n finds the rows it needs in a bounded store.
tri_status tri__streaming_truncate(tri__kv_policy *p, int32_t n);

// ---- policy-h2o.c ----

// Before the store exists: the defaults of recent and history, and a bounded store's size.
void tri__h2o_setup(tri__kv_policy *p, int32_t capacity, int32_t *store_rows);
tri_status tri__h2o_init(tri__kv_policy *p);
void tri__h2o_free(tri__kv_policy *p);
tri_status tri__h2o_begin(tri__kv_policy *p, int32_t n0, int32_t m);
tri_status tri__h2o_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                          const tri__kv_view **view, float **weight_sums);
tri_status tri__h2o_observe(tri__kv_policy *p, int32_t il);
void tri__h2o_commit(tri__kv_policy *p, int32_t end);
void tri__h2o_abort(tri__kv_policy *p);
tri_status tri__h2o_truncate(tri__kv_policy *p, int32_t n);
void tri__h2o_reset(tri__kv_policy *p);

// ---- policy-retrieval.c ----

tri_status tri__ret_init(tri__kv_policy *p);
void tri__ret_free(tri__kv_policy *p);
// Layer il of a step ending at end: stores the rows where borrowing (the ring), keeps the step's
// queries and returns the view (everything before a selection).
tri_status tri__ret_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                          int32_t end, const tri__kv_view **view);
// Summaries of the chunks completed, and the selection when one is due.
tri_status tri__ret_commit(tri__kv_policy *p, int32_t end);
void tri__ret_abort(tri__kv_policy *p);
tri_status tri__ret_truncate(tri__kv_policy *p, int32_t n);
void tri__ret_reset(tri__kv_policy *p);
// Borrowing: tri__kv_policy_adopt. Own store: whether adopting up to n keeps the policy attending
// fully, and the summaries of the adopted rows (len: the length before).
tri_status tri__ret_adopt_borrowed(tri__kv_policy *p, tri__kv_store *src, int32_t n);
bool tri__ret_attends_fully(const tri__kv_policy *p, int32_t n);
tri_status tri__ret_adopted(tri__kv_policy *p, int32_t len, int32_t n);
// Borrowing: the own rows left in the ring, and whether a step of m tokens fits it.
int32_t tri__ret_room(const tri__kv_policy *p);
tri_status tri__ret_begin(tri__kv_policy *p, int32_t m);
// The FULL policy's side of a tap: layer il's queries q (m, n_head * head_dim) f32 backend memory of
// every step n0 .. n0 + m - 1 of the armed pass (the last `queries` positions are kept), one layer
// of the selection in the step that ends at the tap's length, and its end (ok: the pass succeeded).
tri_status tri__ret_tap_queries(tri__kv_policy *ret, int32_t il, const float *q, int32_t n0, int32_t m,
                                int32_t n_head);
tri_status tri__ret_tap_layer(tri__kv_policy *ret, int32_t il, int32_t n_head, const tri__kv_view *view);
void tri__ret_tap_finish(tri__kv_policy *full, bool ok);
// tri__kv_policy_peek of a RETRIEVAL policy (arguments checked).
bool tri__ret_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out);

#endif  // TRI_KV_POLICY_IMPL_H
