// kv-policy.c - what every cache policy shares: parameters, life cycle, the step's dispatch into the
// policy's own file (kv-policy-impl.h lists them), rollback, and the measurement of bench-kv-quality.
#include "kv-policy.h"

#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"
#include "kv-policy-impl.h"

// The policies, by kind: the one place that names them all.
static const tri__kv_policy_ops *const policy_ops[] = {
    [TRI_KV_POLICY_FULL] = &tri__kv_policy_full_ops,
    [TRI_KV_POLICY_STREAMING] = &tri__kv_policy_streaming_ops,
    [TRI_KV_POLICY_H2O] = &tri__kv_policy_h2o_ops,
    [TRI_KV_POLICY_RETRIEVAL] = &tri__kv_policy_retrieval_ops,
};

// kind's op table, or NULL for an unknown kind.
static const tri__kv_policy_ops *ops_of(tri_kv_policy kind) {
    if ((int)kind < 0 || (size_t)kind >= sizeof policy_ops / sizeof *policy_ops) return NULL;
    return policy_ops[kind];
}

const char *tri__kv_policy_name(tri_kv_policy kind) {
    const tri__kv_policy_ops *ops = ops_of(kind);
    return ops ? ops->name : "?";
}

tri__kv_policy_params tri__kv_policy_default_params(tri_kv_policy kind, int32_t capacity) {
    // retrieval's selection: bench-table1's winner on SmolLM2 (docs/kv-policies.md, "GQA")
    tri__kv_policy_params p = {.kind = kind, .budget = 4096, .chunk = 8, .refresh = 0, .index = TRI_CHUNK_INDEX_EXACT,
                               .group = TRI__KV_GROUP_MAX, .window = 32, .queries = 16, .mass = true,
                               .follow = 1};
    if (capacity > 0 && p.budget > capacity) p.budget = capacity;
    p.sink = tri__kv_default_sink(p.budget);
    return p;
}

tri_status tri__kv_policy_mixed_rows(tri__kv_policy_params *params, int32_t sink, int32_t f16, const char *who) {
    params->sink = sink > 0 ? sink : TRI_KV_MIXED_SINK;
    if (f16 <= 0) f16 = TRI_KV_MIXED_F16;
    if (params->sink >= f16)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "%s: kv_type mixed: kv_sink %d must be < kv_budget %d (the tokens kept in f16: sinks and the "
                         "recent window)",
                         who, params->sink, f16);
    params->recent = f16 - params->sink;
    return TRI_STATUS_OK;
}

void tri__kv_policy_default_budget(tri__kv_policy_params *p, int32_t capacity) {
    if (p->kind == TRI_KV_POLICY_FULL) return;
    int32_t budget = 4096;
    if (budget >= capacity) {
        *p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, capacity);
        return;
    }
    if (p->kind == TRI_KV_POLICY_RETRIEVAL && p->chunk > 0 && p->chunk <= budget) budget -= budget % p->chunk;
    p->budget = budget;
}

void tri__kv_policy_cover(tri__kv_policy_params *p, int32_t capacity) {
    if (p->kind != TRI_KV_POLICY_FULL && p->budget > capacity)
        *p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, capacity);
}

tri_status tri__kv_policy_check(const tri__kv_policy_params *p, int32_t capacity) {
    const char *name = tri__kv_policy_name(p->kind);
    if (!ops_of(p->kind))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: unknown policy %d", (int)p->kind);
    if (p->kind == TRI_KV_POLICY_FULL) return TRI_STATUS_OK;
    if (p->budget <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: budget %d must be positive", name, p->budget);
    if (p->budget > capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: budget %d is larger than the context (%d positions)",
                         name, p->budget, capacity);
    const tri__kv_policy_ops *ops = ops_of(p->kind);
    return ops->check ? ops->check(p) : TRI_STATUS_OK;
}

// ---- life cycle ----

void tri__kv_policy_free(tri__kv_policy *p) {
    if (p->ops && p->ops->free) p->ops->free(p);
    if (p->be) {
        p->be->ops->free(p->be, p->m_ws);
        p->be->ops->free(p->be, p->m_out);
        p->be->ops->free(p->be, p->m_k);
        p->be->ops->free(p->be, p->m_v);
        p->be->ops->free(p->be, p->m_q);
    }
    free(p->m_ws_host);
    free(p->m_pos);
    free(p->q_pos);
    free(p->spans);
    free(p->head_span);
    tri__kv_store_free(&p->own);
    memset(p, 0, sizeof *p);
}

// The descriptors every policy needs.
tri_status tri__kv_policy_common_init(tri__kv_policy *p, int32_t spans_per_head) {
    tri_status st = TRI_STATUS_OK;
    p->spans_cap = spans_per_head * p->n_head_kv;
    ALLOC(p->spans, p->spans_cap);
    ALLOC(p->head_span, p->n_head_kv + 1);
    ALLOC(p->q_pos, p->max_step);
    return TRI_STATUS_OK;
fail:
    return st;
}

tri_status tri__kv_policy_init(tri__kv_policy *p, const tri__kv_policy_params *params, tri__backend *be,
                               tri_dtype kv_type, int32_t n_layer, int32_t n_head, int32_t n_head_kv,
                               int32_t head_dim, int32_t capacity, int32_t max_step) {
    memset(p, 0, sizeof *p);
    tri_status st = tri__kv_policy_check(params, capacity);
    if (st) return st;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || max_step <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: %d heads over %d KV heads, steps of %d", n_head,
                         n_head_kv, max_step);
    const bool mixed = kv_type == TRI_DTYPE_KV_MIXED;
    if (mixed && (params->kind != TRI_KV_POLICY_FULL || head_dim % TRI_QK != 0))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv_type mixed: the full cache with head_dim a multiple of %d only "
                         "(policy %s, head_dim %d)", TRI_QK, tri__kv_policy_name(params->kind), head_dim);
    p->p = *params;
    p->ops = mixed ? &tri__kv_policy_mixed_ops : ops_of(params->kind);
    if (mixed) kv_type = TRI_DTYPE_Q4_0;  // every position; the f16 rows are the policy's
    p->be = be;
    p->n_layer = n_layer;
    p->n_head = n_head;
    p->n_head_kv = n_head_kv;
    p->head_dim = head_dim;
    p->max_step = max_step;
    int32_t store_rows = capacity;
    if (p->ops->setup && (st = p->ops->setup(p, capacity, &store_rows))) goto fail;
    if ((st = tri__kv_store_init(&p->own, be, kv_type, n_layer, n_head_kv, head_dim, store_rows))) goto fail;
    p->kv = &p->own;
    if ((st = p->ops->init(p))) goto fail;
    return TRI_STATUS_OK;
fail:
    tri__kv_policy_free(p);
    return st;
}

int32_t tri__kv_policy_room(const tri__kv_policy *p) {
    if (p->ops->room) return p->ops->room(p);
    return tri__kv_policy_capacity(p) - tri__kv_policy_len(p);
}

// ---- the step ----

tri_status tri__kv_policy_begin(tri__kv_policy *p, int32_t m, const tri__rope *rope, int32_t *q_pos) {
    TRI_ASSERT(!p->in_step);
    int32_t n0 = tri__kv_policy_len(p), cap = tri__kv_policy_capacity(p);
    if (m <= 0 || m > p->max_step || n0 > cap - m)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: step of %d tokens after %d (steps of at most %d, capacity %d)",
                         m, n0, p->max_step, cap);
    p->step_n0 = n0;
    p->step_m = m;
    p->rope = rope;
    int32_t base = n0;
    if (p->ops->begin) TRY(p->ops->begin(p, n0, m, &base));
    for (int32_t i = 0; i < m; i++) q_pos[i] = base + i;
    p->in_step = true;
    return TRI_STATUS_OK;
}

static tri_status measure_layer(tri__kv_policy *p, int32_t il, const float *q, const tri__kv_view *view);

tri_status tri__kv_policy_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                                const tri__kv_view **view, float **weight_sums) {
    TRI_ASSERT(p->in_step && il >= 0 && il < p->n_layer);
    const int32_t end = p->step_n0 + p->step_m;
    *weight_sums = NULL;
    TRY(p->ops->layer(p, il, q, k, v, end, view, weight_sums));
    if (p->measure && p->step_m == 1) TRY(measure_layer(p, il, q, *view));
    return TRI_STATUS_OK;
}

// ---- measurement ----

tri_status tri__kv_policy_measure(tri__kv_policy *p) {
    if (p->src) return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy: measuring a policy over borrowed rows");
    if (p->cap)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: measuring needs every position (keep_all)",
                         tri__kv_policy_name(p->p.kind));
    tri__backend *be = p->be;
    int64_t cap = p->kv->capacity, kd = kv_dim(p);
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)(p->n_head_kv * cap), (void **)&p->m_ws));
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim, (void **)&p->m_out));
    p->m_ws_host = malloc(sizeof(float) * (size_t)(p->n_head_kv * cap));
    p->m_pos = malloc(sizeof(int32_t) * (size_t)cap);
    if (!p->m_ws_host || !p->m_pos) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy: measurement");
    for (int64_t i = 0; i < cap; i++) p->m_pos[i] = (int32_t)i;
    if (p->raw_keys) {
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)(cap * kd), (void **)&p->m_k));
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)(cap * kd), (void **)&p->m_v));
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim, (void **)&p->m_q));
    }
    p->measure = true;
    return TRI_STATUS_OK;
}

// Full attention of the step's one query over [0, end), and the share of it on the positions the
// policy's view holds.
static tri_status measure_layer(tri__kv_policy *p, int32_t il, const float *q, const tri__kv_view *view) {
    const tri__backend_ops *op = p->be->ops;
    int32_t end = p->step_n0 + 1, kd = kv_dim(p);
    tri__kv_span spans[64];
    int32_t head_span[65];
    if (p->n_head_kv > 64) return TRI_STATUS_OK;
    tri__kv_view full = {.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = spans, .head_span = head_span};
    int32_t qpos = p->step_n0;
    const int64_t es = esize(p);
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        head_span[h] = h;
        if (p->raw_keys) {
            spans[h] = (tri__kv_span){.pos0 = 0, .n = end, .k = p->m_k + (int64_t)h * p->head_dim,
                                      .v = p->m_v + (int64_t)h * p->head_dim, .stride = kd};
        } else {
            int64_t off = (int64_t)h * p->head_dim * es;
            spans[h] = (tri__kv_span){.pos0 = 0, .n = end, .k = (const char *)p->kv->k[il] + off,
                                      .v = (const char *)p->kv->v[il] + off, .stride = kd};
        }
    }
    head_span[p->n_head_kv] = p->n_head_kv;
    if (p->raw_keys) {
        // keys rotated at their absolute positions, and the query (rotated at its cache position
        // step_kept) turned on by the difference, so that it sits at its absolute position too
        full.type = TRI_DTYPE_F32;
        int32_t shift = p->step_n0 - p->step_kept;
        TRY(op->get_rows(p->be, p->m_k, p->kv->k[il], p->kv->type, p->kv->capacity, kd, p->m_pos, end));
        TRY(op->get_rows(p->be, p->m_v, p->kv->v[il], p->kv->type, p->kv->capacity, kd, p->m_pos, end));
        TRY(tri__rope_apply(p->be, p->m_k, end, p->n_head_kv, p->m_pos, p->rope));
        TRY(op->copy(p->be, p->m_q, q, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim));
        TRY(tri__rope_apply(p->be, p->m_q, 1, p->n_head, &shift, p->rope));
        q = p->m_q;
    }
    TRY(op->attention(p->be, p->m_out, q, &qpos, 1, p->n_head, p->head_dim, &full, p->m_ws));
    TRY(op->copy_to_host(p->be, p->m_ws_host, p->m_ws, sizeof(float) * (size_t)(p->n_head_kv * end)));
    TRY(op->synchronize(p->be));
    int32_t g = p->n_head / p->n_head_kv;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        const float *w = p->m_ws_host + (int64_t)h * end;
        double got = 0;
        if (p->raw_keys) {
            for (int32_t r = 0; r < p->step_kept + 1; r++) got += w[p->gather[r]];
        } else {
            for (int32_t si = view->head_span[h]; si < view->head_span[h + 1]; si++)
                for (int32_t j = 0; j < view->spans[si].n; j++) got += w[view->spans[si].pos0 + j];
        }
        p->mass_sum += got / g;
        p->mass_n++;
    }
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_observe(tri__kv_policy *p, int32_t il) {
    return p->ops->observe ? p->ops->observe(p, il) : TRI_STATUS_OK;
}

tri_status tri__kv_policy_commit(tri__kv_policy *p) {
    TRI_ASSERT(p->in_step);
    int32_t end = p->step_n0 + p->step_m;
    tri_status st = TRI_STATUS_OK;
    if (p->ops->commit && (st = p->ops->commit(p, end))) {
        tri__kv_policy_abort(p);
        return st;
    }
    p->in_step = false;
    if (p->src || p->cap) {
        p->len = end;
        return TRI_STATUS_OK;
    }
    return tri__kv_store_set_len(p->kv, end);
}

void tri__kv_policy_abort(tri__kv_policy *p) {
    if (p->ops->abort) p->ops->abort(p);
    p->in_step = false;
}

tri_status tri__kv_policy_adopt(tri__kv_policy *p, tri__kv_store *src, int32_t n) {
    TRI_ASSERT(!p->in_step);
    if (p->src) return p->ops->adopt_borrowed(p, src, n);
    if (p->cap)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: rows computed over its own view cannot be adopted",
                         tri__kv_policy_name(p->p.kind));
    const int32_t len = p->kv->n;
    if (n < len || n > src->n || n > p->kv->capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: adopt to %d from %d (source holds %d)", n, len,
                         src->n);
    if (!p->ops->attends_fully || !p->ops->attends_fully(p, n))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: rows computed over its own view cannot be adopted",
                         tri__kv_policy_name(p->p.kind));
    tri_status st = tri__kv_store_copy_rows(p->kv, src, len, n - len);
    if (!st && p->ops->adopted) st = p->ops->adopted(p, len, n);
    return st ? st : tri__kv_store_set_len(p->kv, n);
}

tri_status tri__kv_policy_loaded(tri__kv_policy *p, int32_t n) {
    TRI_ASSERT(!p->in_step);
    if (p->src || p->cap || !p->ops->attends_fully)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: rows cannot be loaded into it",
                         tri__kv_policy_name(p->p.kind));
    if (p->kv->n != 0 || n < 0 || n > p->kv->capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: load of %d rows into a cache of %d holding %d", n,
                         p->kv->capacity, p->kv->n);
    if (!p->ops->attends_fully(p, n))
        return tri__fail(TRI_STATUS_INTERNAL, "kv policy %s: a selection is due in an empty cache",
                         tri__kv_policy_name(p->p.kind));
    tri_status st = p->ops->adopted ? p->ops->adopted(p, 0, n) : TRI_STATUS_OK;
    return st ? st : tri__kv_store_set_len(p->kv, n);
}

tri_status tri__kv_policy_truncate(tri__kv_policy *p, int32_t n) {
    TRI_ASSERT(!p->in_step);
    int32_t len = tri__kv_policy_len(p);
    if (n < 0 || n > len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: truncate to %d outside [0, %d]", n, len);
    if (p->ops->truncate) TRY(p->ops->truncate(p, n));
    if (p->cap) {  // a bounded store (STREAMING's ring among them)
        p->len = n;
        return TRI_STATUS_OK;
    }
    return p->src ? TRI_STATUS_OK : tri__kv_store_set_len(p->kv, n);
}

tri_status tri__kv_policy_row_moved(tri__kv_policy *p, int32_t from, int32_t to) {
    TRI_ASSERT(!p->in_step);
    if (from == to || !p->ops->row_moved) return TRI_STATUS_OK;
    return p->ops->row_moved(p, from, to);
}

void tri__kv_policy_reset(tri__kv_policy *p) {
    p->in_step = false;
    if (p->ops->reset) p->ops->reset(p);
    p->kv->n = 0;
    p->len = 0;
    p->hw = 0;
}

// ---- inspection ----

bool tri__kv_policy_peek_store(tri__kv_store *kv, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    const int64_t row = tri__kv_store_row_bytes(kv) / kv->n_head_kv;
    void *tmp = malloc((size_t)tri__kv_store_row_bytes(kv));
    bool ok = tmp && tri__kv_store_read_rows(kv, il, which, pos, 1, tmp) == TRI_STATUS_OK;
    if (ok) memcpy(out, (char *)tmp + h * row, (size_t)row);
    free(tmp);
    return ok;
}

bool tri__kv_policy_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    if (il < 0 || il >= p->n_layer || h < 0 || h >= p->n_head_kv || pos < 0 || pos >= tri__kv_policy_len(p) ||
        !p->ops->peek)
        return false;
    return p->ops->peek(p, il, h, pos, which, out);
}
