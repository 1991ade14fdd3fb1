// policy-streaming.c - StreamingLLM: attention sinks and a window of recent tokens, keys rotated by
// their position inside the cache, over a bounded store (docs/kv-policies.md).
#include "kv-policy-impl.h"

// ---- the bounded store ----

// The store row of position pos (kv-policy.h, ring_rows).
static int32_t stream_row(const tri__kv_policy *p, int32_t pos) {
    tri__stream_window w = tri__kv_policy_window(p);
    return tri__window_row(&w, pos);
}

// Writes the step's rows k and v (m, n_head_kv * head_dim) f32 at positions n0 .. n0 + m - 1 of
// layer il into their rows: the sinks in place, the rest into the ring, in two writes where it
// wraps.
static tri_status stream_write(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const float *k, const float *v) {
    const int64_t kd = kv_dim(p);
    for (int32_t done = 0; done < m;) {
        int32_t pos = n0 + done, row = stream_row(p, pos), n = m - done;
        if (pos < p->p.sink) {
            if (n > p->p.sink - pos) n = p->p.sink - pos;
        } else if (n > p->p.sink + p->ring_rows - row) {
            n = p->p.sink + p->ring_rows - row;
        }
        TRY(tri__kv_store_write(p->kv, il, row, n, k + done * kd, v + done * kd));
        done += n;
    }
    return TRI_STATUS_OK;
}

// Whether the rows a step at length n attends to are all still in the store: the sinks, and the
// window from budget - sink positions before n's eviction interval (everything before n up to
// the budget). Rows of positions below hw - ring_rows may have been overwritten.
static tri_status stream_check_rollback(const tri__kv_policy *p, int32_t n) {
    int32_t start = tri__kv_policy_evict_start(p, n);
    int32_t need = start == 0 ? p->p.sink : start - (p->p.budget - p->p.sink);
    int32_t have = p->hw - p->ring_rows;
    if (need < p->p.sink) need = p->p.sink;
    if (have <= p->p.sink || need >= have) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                     "kv policy streaming: cannot roll back to %d of %d positions: the store keeps %d rows past the "
                     "window (rollback), the window of %d starts at %d, position %d is overwritten",
                     n, p->len, p->p.rollback, n, need, have - 1);
}

// ---- the op table ----

static tri_status streaming_check(const tri__kv_policy_params *p) {
    if (p->sink < 0 || p->sink >= p->budget)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy streaming: sink %d must be in [0, budget %d) to leave room for recent tokens",
                         p->sink, p->budget);
    return TRI_STATUS_OK;
}

// Checks the streaming parameters and sizes a bounded store (ring_rows, cap).
static tri_status streaming_setup(tri__kv_policy *p, int32_t capacity, int32_t *store_rows) {
    const int32_t max_step = p->max_step;
    if (p->p.evict_every < 0 || p->p.evict_every > max_step || p->p.rollback < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy streaming: evict_every %d must be in [0, %d] (a step) and rollback %d >= 0",
                         p->p.evict_every, max_step, p->p.rollback);
    if (p->p.rollback == 0) p->p.rollback = max_step;
    // the sinks, the window before a step, the step and the rows a rollback may need again; a
    // store of every position where that is no less
    int64_t ring = (int64_t)(p->p.budget - p->p.sink) + max_step + p->p.rollback;
    if (!p->p.keep_all && p->p.sink + ring < capacity) {
        p->ring_rows = (int32_t)ring;
        p->cap = capacity;
        *store_rows = p->p.sink + p->ring_rows;
    }
    return TRI_STATUS_OK;
}

// The scratch of a step's gathered, rotated view.
static tri_status streaming_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    TRY(tri__kv_policy_common_init(p, 1));
    tri__backend *be = p->be;
    p->raw_keys = true;
    int64_t rows = (int64_t)p->p.budget + p->max_step;
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)(rows * kv_dim(p)), (void **)&p->sk));
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)(rows * kv_dim(p)), (void **)&p->sv));
    ALLOC(p->gather, rows);
    ALLOC(p->cache_pos, rows);
    for (int32_t i = 0; i < rows; i++) p->cache_pos[i] = i;
    return TRI_STATUS_OK;
fail:
    return st;
}

static void streaming_free(tri__kv_policy *p) {
    if (p->be) {
        p->be->ops->free(p->be, p->sk);
        p->be->ops->free(p->be, p->sv);
    }
    free(p->gather);
    free(p->cache_pos);
}

// Which rows the step's view gathers; *base: where its queries sit in the cache.
static tri_status streaming_begin(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base) {
    // sinks and the most recent tokens before the step's eviction interval, then the tokens of
    // the interval before the step: the rows holding them, rotated by their rank in the cache
    // (stream-window.h: the same functions give a device the view of a step it computes itself)
    tri__stream_window w = tri__kv_policy_window(p);
    int32_t kept = tri__window_kept(&w, n0);
    for (int32_t i = 0; i < kept; i++) p->gather[i] = tri__window_row(&w, tri__window_pos(&w, n0, i));
    // a step past its interval attends to the interval's window (tri__kv_policy_step_limit_at
    // keeps the forward pass within one); the view and the ring hold budget + max_step rows
    if (kept + m > p->p.budget + p->max_step)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy streaming: a step of %d tokens at %d, %d into its eviction interval, exceeds "
                         "the %d rows of a step's view", m, n0, n0 - tri__window_start(&w, n0), p->p.budget + p->max_step);
    for (int32_t i = 0; i < m; i++) p->gather[kept + i] = stream_row(p, n0 + i);
    p->step_kept = kept;
    *base = kept;
    if (p->ring_rows && n0 + m > p->hw) p->hw = n0 + m;  // the step's rows overwrite older ones
    return TRI_STATUS_OK;
}

// Stores the step's rows of layer il and returns its view, gathered and rotated by cache position.
static tri_status streaming_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                                  int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)q, (void)end, (void)weight_sums;
    const int32_t n0 = p->step_n0, m = p->step_m;
    if (p->ring_rows) TRY(stream_write(p, il, n0, m, k, v));
    else TRY(tri__kv_store_write(p->kv, il, n0, m, k, v));
    const tri__backend_ops *op = p->be->ops;
    int32_t rows = p->step_kept + m, kd = kv_dim(p);
    TRY(op->get_rows(p->be, p->sk, p->kv->k[il], p->kv->type, p->kv->capacity, kd, p->gather, rows));
    TRY(op->get_rows(p->be, p->sv, p->kv->v[il], p->kv->type, p->kv->capacity, kd, p->gather, rows));
    TRY(tri__rope_apply(p->be, p->sk, rows, p->n_head_kv, p->cache_pos, p->rope));
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->spans[h] = (tri__kv_span){.pos0 = 0, .n = rows, .k = p->sk + (int64_t)h * p->head_dim,
                                     .v = p->sv + (int64_t)h * p->head_dim, .stride = kd};
        p->head_span[h] = h;
    }
    p->head_span[p->n_head_kv] = p->n_head_kv;
    p->view = (tri__kv_view){.type = TRI_DTYPE_F32, .n_head_kv = p->n_head_kv, .spans = p->spans,
                             .head_span = p->head_span};
    *view = &p->view;
    return TRI_STATUS_OK;
}

// Whether a rollback to n finds the rows it needs in a bounded store.
static tri_status streaming_truncate(tri__kv_policy *p, int32_t n) {
    if (p->ring_rows) TRY(stream_check_rollback(p, n));
    return TRI_STATUS_OK;
}

const tri__kv_policy_ops tri__kv_policy_streaming_ops = {
    .name = "streaming",
    .check = streaming_check,
    .setup = streaming_setup,
    .init = streaming_init,
    .free = streaming_free,
    .begin = streaming_begin,
    .layer = streaming_layer,
    .truncate = streaming_truncate,
};
