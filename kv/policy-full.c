// policy-full.c - the full cache: every position, one span per KV head. It can also carry a retrieval
// cache's selection made during its step (tri__kv_policy_tap).
#include <string.h>

#include "kv-policy-impl.h"

tri_status tri__kv_policy_wrap_full(tri__kv_policy *p, tri__kv_store *kv, int32_t n_head, int32_t max_step) {
    memset(p, 0, sizeof *p);
    p->p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, kv->capacity);
    p->ops = &tri__kv_policy_full_ops;
    p->kv = kv;
    p->be = kv->be;
    p->n_layer = kv->n_layer;
    p->n_head = n_head;
    p->n_head_kv = kv->n_head_kv;
    p->head_dim = kv->head_dim;
    p->max_step = max_step;
    tri_status st = tri__kv_policy_common_init(p, 1);
    if (st) tri__kv_policy_free(p);
    return st;
}

// ---- the op table ----

static tri_status full_init(tri__kv_policy *p) { return tri__kv_policy_common_init(p, 1); }

// Stores k and v, returns the store's view, and makes an armed tap's selection for that layer
// (tri__kv_policy_tap) when the step ends at its length.
static tri_status full_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                             int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)weight_sums;
    TRY(tri__kv_store_write(p->kv, il, p->step_n0, p->step_m, k, v));
    *view = tri__kv_store_view(p->kv, il, end, &p->view);
    if (p->tap && p->step_n0 < p->tap_at) {
        // every step of the armed pass up to the tap's length (a verification step may run past
        // it: its drafted rows do not count): its last queries are what the selection reads
        int32_t m = p->tap_at - p->step_n0 < p->step_m ? p->tap_at - p->step_n0 : p->step_m;
        TRY(tri__ret_tap_queries(p->tap, il, q, p->step_n0, m, p->n_head));
        if (end >= p->tap_at) TRY(tri__ret_tap_layer(p->tap, il, p->n_head, *view));
    }
    return TRI_STATUS_OK;
}

static void full_abort(tri__kv_policy *p) {
    if (p->tap) tri__ret_tap_finish(p, false);
}

static bool full_attends_fully(const tri__kv_policy *p, int32_t n) {
    (void)p, (void)n;
    return true;
}

static bool full_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    return tri__kv_policy_peek_store(p->kv, il, h, pos, which, out);
}

const tri__kv_policy_ops tri__kv_policy_full_ops = {
    .name = "full",
    .init = full_init,
    .layer = full_layer,
    .abort = full_abort,
    .attends_fully = full_attends_fully,
    .peek = full_peek,
};
