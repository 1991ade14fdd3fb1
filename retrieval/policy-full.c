// policy-full.c - the full cache: every position, one span per KV head. It can also carry a retrieval
// cache's selection made during its step (tri__kv_policy_tap).
#include <string.h>

#include "kv-policy-impl.h"

tri_status tri__kv_policy_wrap_full(tri__kv_policy *p, tri__kv_store *kv, int32_t n_head, int32_t max_step) {
    memset(p, 0, sizeof *p);
    p->p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, kv->capacity);
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

tri_status tri__full_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v, int32_t end,
                           const tri__kv_view **view) {
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
