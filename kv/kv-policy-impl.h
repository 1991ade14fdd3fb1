// kv-policy-impl.h - what the policies' files share behind kv-policy.h (internal to kv/).
//
// kv-policy.c holds the parameters, the life cycle and the step that every policy goes through
// (begin, layer, observe, commit, abort, truncate, reset, adopt) and the measurement; it calls
// through the policy's op table (tri__kv_policy_ops, below) into the one file of each policy for
// what differs:
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

// ---- the op table ----

// What differs between policies: each policy's file defines one `const tri__kv_policy_ops`, and
// kv-policy.c reaches a policy only through p->ops (a new policy is one new file and one line in
// kv-policy.c's table of kinds). Slots marked optional may be NULL. Every slot but free and check
// is called on a policy whose init succeeded.
struct tri__kv_policy_ops {
    const char *name;  // "full", "streaming", ... (tri__kv_policy_name)
    // Optional: the policy's own parameters, once the budget is known positive and within the
    // capacity; INVALID_ARGUMENT naming the field.
    tri_status (*check)(const tri__kv_policy_params *params);
    // Optional, before the store exists: defaults the policy fills in, and a bounded store's size
    // (*store_rows, set when smaller than the capacity).
    tri_status (*setup)(tri__kv_policy *p, int32_t capacity, int32_t *store_rows);
    // After the store: the view descriptors (tri__kv_policy_common_init) and the policy's state.
    tri_status (*init)(tri__kv_policy *p);
    // Optional: frees what init made; also after a failed init (what it made so far).
    void (*free)(tri__kv_policy *p);
    // Optional: positions a step may still add (NULL: capacity - len).
    int32_t (*room)(const tri__kv_policy *p);
    // Optional: a step of m tokens at n0 (p->step_n0, step_m, rope already set): what its view
    // will hold; *base (n0 on entry): the cache position of its first query.
    tri_status (*begin)(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base);
    // Layer il of the step ending at end: stores k and v, returns the view (and the weight sums
    // the attention should fill, or leaves *weight_sums NULL).
    tri_status (*layer)(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v, int32_t end,
                        const tri__kv_view **view, float **weight_sums);
    // Optional: after layer il's attention (reads the weight sums).
    tri_status (*observe)(tri__kv_policy *p, int32_t il);
    // Optional: the step succeeded up to end (the policy is aborted if this fails).
    tri_status (*commit)(tri__kv_policy *p, int32_t end);
    // Optional: tri__kv_policy_abort, in a step (p->in_step still set) or out of one.
    void (*abort)(tri__kv_policy *p);
    // Optional: a rollback to n (checked within [0, len]), before the length moves.
    tri_status (*truncate)(tri__kv_policy *p, int32_t n);
    // Optional: forget everything, before the length becomes 0.
    void (*reset)(tri__kv_policy *p);
    // Optional: tri__kv_policy_adopt of a policy over borrowed rows (p->src set).
    tri_status (*adopt_borrowed)(tri__kv_policy *p, tri__kv_store *src, int32_t n);
    // Optional: whether up to n positions the policy attends to every row, so that rows computed
    // elsewhere may be adopted or loaded into its store; NULL: never (its rows depend on its view).
    bool (*attends_fully)(const tri__kv_policy *p, int32_t n);
    // Optional: after rows len .. n - 1 were adopted or loaded into the store.
    tri_status (*adopted)(tri__kv_policy *p, int32_t len, int32_t n);
    // Optional: tri__kv_policy_peek (arguments checked); NULL: its rows cannot be read back.
    bool (*peek)(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out);
    // Optional: tri__kv_policy_row_moved, for a policy that keeps rows besides its store's.
    tri_status (*row_moved)(tri__kv_policy *p, int32_t from, int32_t to);
};

extern const tri__kv_policy_ops tri__kv_policy_full_ops;       // policy-full.c
extern const tri__kv_policy_ops tri__kv_policy_streaming_ops;  // policy-streaming.c
extern const tri__kv_policy_ops tri__kv_policy_h2o_ops;        // policy-h2o.c
extern const tri__kv_policy_ops tri__kv_policy_retrieval_ops;  // policy-retrieval.c
extern const tri__kv_policy_ops tri__kv_policy_mixed_ops;      // policy-mixed.c: FULL with kv_type mixed

// ---- between policy-full.c and policy-retrieval.c (a retrieval cache selecting during the full
// cache's pass, tri__kv_policy_tap) ----

// The FULL policy's side of a tap: layer il's queries q (m, n_head * head_dim) f32 backend memory of
// every step n0 .. n0 + m - 1 of the armed pass (the last `queries` positions are kept), one layer
// of the selection in the step that ends at the tap's length, and its end (ok: the pass succeeded).
tri_status tri__ret_tap_queries(tri__kv_policy *ret, int32_t il, const float *q, int32_t n0, int32_t m,
                                int32_t n_head);
tri_status tri__ret_tap_layer(tri__kv_policy *ret, int32_t il, int32_t n_head, const tri__kv_view *view);
void tri__ret_tap_finish(tri__kv_policy *full, bool ok);

#endif  // TRI_KV_POLICY_IMPL_H
