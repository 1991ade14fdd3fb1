// llama.c - embedding, transformer blocks, output head; prefill in chunks of n_batch tokens.
#include "llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"
#include "weights.h"

// The activation buffers of a pass, in the pool's order, with their sizes in floats.
#define ACT_BUFS 9
static void act_table(tri__llama *ll, float ***bufs, int64_t *elems) {
    const tri_model_config *c = &ll->model->config;
    int64_t nb = ll->n_batch;
    int64_t q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    float **b[ACT_BUFS] = {&ll->x, &ll->xb, &ll->q, &ll->k, &ll->v, &ll->att, &ll->proj, &ll->gate, &ll->up};
    int64_t e[ACT_BUFS] = {nb * c->n_embd, nb * c->n_embd, nb * q_dim, nb * kv_dim, nb * kv_dim,
                           nb * q_dim, nb * c->n_embd, nb * c->n_ff, nb * c->n_ff};
    for (int i = 0; i < ACT_BUFS; i++) bufs[i] = b[i], elems[i] = e[i];
}

struct tri__act_pool {
    tri__backend *be;
    void *block;              // one backend allocation holding every buffer, once bound
    uint64_t bytes;
    int64_t elems[ACT_BUFS];  // floats per buffer: the most any pass needs
    tri__llama **users;
    int32_t n_users, cap;
};

void tri__llama_free(tri__llama *ll) {
    if (ll->be) {
        float **bufs[ACT_BUFS];
        int64_t elems[ACT_BUFS];
        act_table(ll, bufs, elems);
        if (!ll->pool)
            for (int i = 0; i < ACT_BUFS; i++) ll->be->ops->free(ll->be, *bufs[i]);
        ll->be->ops->free(ll->be, ll->logits);
    }
    if (ll->pool)  // leave the pool
        for (int32_t i = 0; i < ll->pool->n_users; i++)
            if (ll->pool->users[i] == ll) ll->pool->users[i] = ll->pool->users[--ll->pool->n_users];
    free(ll->pos);
    free(ll->q_pos);
    free(ll->win_spans);
    free(ll->win_head_span);
    tri__rope_free(&ll->rope);
    memset(ll, 0, sizeof *ll);
}

tri_status tri__llama_init_pooled(tri__llama *ll, const tri_model *model, tri__backend *be, int32_t n_batch,
                                  tri__act_pool *pool) {
    memset(ll, 0, sizeof *ll);
    const tri_model_config *c = &model->config;
    if (n_batch <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "batch size %d must be positive", n_batch);
    if (pool && pool->be != be) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: a pool of another backend");
    ll->model = model;
    ll->be = be;
    ll->n_batch = n_batch;
    const float *freq_div = model->rope_freqs ? (const float *)model->rope_freqs->data : NULL;
    tri_status st = tri__rope_init(&ll->rope, c, freq_div);
    if (!st && c->rope_scaling == TRI_ROPE_SCALING_LONGROPE)
        st = tri__rope_set_longrope(&ll->rope, model->fdata.rope_short, model->fdata.rope_long);
    if (st) {
        tri__rope_free(&ll->rope);
        memset(ll, 0, sizeof *ll);
        return st;
    }
    float **bufs[ACT_BUFS];
    int64_t elems[ACT_BUFS];
    act_table(ll, bufs, elems);
    if (pool) {
        if (pool->n_users == pool->cap) {
            int32_t cap = pool->cap ? 2 * pool->cap : 4;
            tri__llama **u = realloc(pool->users, sizeof *u * (size_t)cap);
            if (!u) {
                st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "activation pool: %d users", cap);
                goto fail;
            }
            pool->users = u;
            pool->cap = cap;
        }
        pool->users[pool->n_users++] = ll;
        ll->pool = pool;
        for (int i = 0; i < ACT_BUFS; i++)
            if (elems[i] > pool->elems[i]) pool->elems[i] = elems[i];
    } else {
        for (int i = 0; i < ACT_BUFS; i++)
            if ((st = be->ops->alloc(be, (size_t)elems[i] * sizeof(float), (void **)bufs[i]))) goto fail;
    }
    ll->pos = malloc((size_t)n_batch * sizeof *ll->pos);
    ll->q_pos = malloc((size_t)n_batch * sizeof *ll->q_pos);
    if (!ll->pos || !ll->q_pos) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "forward pass: positions");
        goto fail;
    }
    return TRI_STATUS_OK;

fail:
    tri__llama_free(ll);
    return st;
}

void tri__llama_set_prompt(tri__llama *ll, int32_t n_prompt) {
    ll->n_prompt = n_prompt > 0 ? n_prompt : 0;
    // now too, for a pass that never starts from an empty cache (L2 over L3's rows): tables for
    // first lengths a < b differ only at positions below b, here the prompt's
    if (ll->n_prompt > 0) tri__rope_set_prompt(&ll->rope, ll->n_prompt);
}

tri_status tri__llama_init(tri__llama *ll, const tri_model *model, tri__backend *be, int32_t n_batch) {
    return tri__llama_init_pooled(ll, model, be, n_batch, NULL);
}

tri_status tri__act_pool_create(tri__backend *be, tri__act_pool **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "activation pool");
    (*out)->be = be;
    return TRI_STATUS_OK;
}

void tri__act_pool_free(tri__act_pool *pool) {
    if (!pool) return;
    for (int32_t i = 0; i < pool->n_users; i++) {  // the passes own nothing now
        float **bufs[ACT_BUFS];
        int64_t elems[ACT_BUFS];
        act_table(pool->users[i], bufs, elems);
        for (int b = 0; b < ACT_BUFS; b++) *bufs[b] = NULL;
        pool->users[i]->pool = NULL;
    }
    pool->be->ops->free(pool->be, pool->block);
    free(pool->users);
    free(pool);
}

tri_status tri__act_pool_bind(tri__act_pool *pool) {
    size_t off[ACT_BUFS], total = 0;
    for (int i = 0; i < ACT_BUFS; i++) {
        off[i] = total;
        total += ((size_t)pool->elems[i] * sizeof(float) + 255) / 256 * 256;
    }
    if (total != pool->bytes) {  // the new block first: on failure the passes keep the old one
        void *block;
        TRY(pool->be->ops->alloc(pool->be, total, &block));
        pool->be->ops->free(pool->be, pool->block);  // waits for the work still using it
        pool->block = block;
        pool->bytes = total;
    }
    for (int32_t u = 0; u < pool->n_users; u++) {
        float **bufs[ACT_BUFS];
        int64_t elems[ACT_BUFS];
        act_table(pool->users[u], bufs, elems);
        for (int i = 0; i < ACT_BUFS; i++) *bufs[i] = (float *)((char *)pool->block + off[i]);
    }
    return TRI_STATUS_OK;
}

uint64_t tri__act_pool_bytes(const tri__act_pool *pool) { return pool ? pool->bytes : 0; }

// Grows the logits buffer to rows rows.
static tri_status ensure_logits(tri__llama *ll, int32_t rows) {
    if (ll->n_logits >= rows) return TRI_STATUS_OK;
    ll->be->ops->free(ll->be, ll->logits);
    ll->logits = NULL;
    ll->n_logits = 0;
    size_t bytes = (size_t)rows * (size_t)ll->model->config.n_vocab * sizeof(float);
    TRY(ll->be->ops->alloc(ll->be, bytes, (void **)&ll->logits));
    ll->n_logits = rows;
    return TRI_STATUS_OK;
}

// ---- what the families do differently (model/family.h) ----

// x (m, n) += bias (n) per row; bias NULL: nothing.
static tri_status add_bias(tri__llama *ll, float *x, const tri__tensor *bias, int64_t m, int64_t n) {
    if (!bias) return TRI_STATUS_OK;
    const tri__backend_ops *op = ll->be->ops;
    if (op->add_rows) return op->add_rows(ll->be, x, bias->data, m, n);
    for (int64_t i = 0; i < m; i++) TRY(op->add(ll->be, x + i * n, x + i * n, bias->data, n));
    return TRI_STATUS_OK;
}

// out = act(gate) * up over n values, the family's activation.
static tri_status gated(tri__llama *ll, float *out, const float *gate, const float *up, int64_t n) {
    const tri__backend_ops *op = ll->be->ops;
    switch (tri__model_family(ll->model)->act) {
    case TRI_ACT_SILU: return op->swiglu(ll->be, out, gate, up, n);
    case TRI_ACT_GELU_TANH:
        if (!op->geglu)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "backend %s has no geglu (the %s family's activation)", op->name,
                             tri__model_family(ll->model)->name);
        return op->geglu(ll->be, out, gate, up, n);
    }
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: unknown activation");
}

// The embedding rows x (n, n_embd) times sqrt(n_embd) where the family scales them, as
// transformers does: the factor rounded to f32, then one f32 product.
static tri_status scale_embeddings(tri__llama *ll, float *x, int64_t n) {
    const tri_model *m = ll->model;
    if (!tri__model_family(m)->embd_scale) return TRI_STATUS_OK;
    const tri__backend_ops *op = ll->be->ops;
    if (!op->scale)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "backend %s has no scale (the %s family's embedding scale)", op->name,
                         tri__model_family(m)->name);
    return op->scale(ll->be, x, n * m->config.n_embd, (float)sqrt((double)m->config.n_embd));
}

// Grows the trimmed-view scratch to n spans.
static tri_status win_reserve(tri__llama *ll, int64_t n) {
    if (n <= ll->win_cap) return TRI_STATUS_OK;
    int64_t cap = n > 2 * ll->win_cap ? n : 2 * ll->win_cap;
    tri__kv_span *s = realloc(ll->win_spans, sizeof *s * (size_t)cap);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sliding window: %lld spans", (long long)cap);
    ll->win_spans = s;
    ll->win_cap = cap;
    return TRI_STATUS_OK;
}

// The sliding window of layer il: the model's, on the layers the family windows (every one, or all
// but each window_period-th: Gemma 2's even layers), else 0 (global attention).
static int64_t layer_window(const tri_model *m, int32_t il) {
    const int32_t period = tri__model_family(m)->window_period;
    if (period > 1 && (il + 1) % period == 0) return 0;
    return m->config.sliding_window;
}

// Attention under a sliding window of W positions: a query at p sees keys at p - W + 1 .. p. When
// every key of the view is inside every query's window (the first W positions, or a view a
// policy already bounded), this is one plain call; otherwise each query attends alone over the
// view trimmed to its window (spans cut at the first visible row, spans with per-row positions
// split into runs of visible rows), which the kernels then mask causally as usual. The per-key
// weight sums of such a split (H2O) are not produced: that case is refused.
static tri_status attend_window(tri__llama *ll, int32_t il, float *out, const float *q, const int32_t *q_pos, int64_t n,
                                const tri__kv_view *view, float *weight_sums) {
    const tri_model_config *c = &ll->model->config;
    const tri__backend_ops *op = ll->be->ops;
    const int64_t W = layer_window(ll->model, il), hd = c->head_dim, q_dim = (int64_t)c->n_head * hd;
    int64_t qmax = 0, kmin = INT64_MAX, n_spans = view->head_span[view->n_head_kv];
    for (int64_t i = 0; i < n; i++) qmax = q_pos[i] > qmax ? q_pos[i] : qmax;
    for (int64_t s = 0; s < n_spans; s++) {
        const tri__kv_span *sp = &view->spans[s];
        for (int32_t j = 0; j < sp->n; j++) {
            int64_t p = sp->pos ? sp->pos[j] : (int64_t)sp->pos0 + j;
            kmin = p < kmin ? p : kmin;
            if (!sp->pos) break;  // contiguous: row 0 is the lowest
        }
    }
    if (W <= 0 || kmin >= qmax - W + 1)
        return op->attention(ll->be, out, q, q_pos, n, c->n_head, hd, view, weight_sums);
    if (weight_sums)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: a sliding window (%d) with a cache policy that accumulates attention (H2O) is unsupported",
                         ll->model->path, (int)W);
    if (!ll->win_head_span) {
        ll->win_head_span = malloc(sizeof *ll->win_head_span * (size_t)(view->n_head_kv + 1));
        if (!ll->win_head_span) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sliding window: head table");
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t lo = (int64_t)q_pos[i] - W + 1;
        int64_t k = 0;
        for (int32_t h = 0; h < view->n_head_kv; h++) {
            ll->win_head_span[h] = (int32_t)k;
            for (int32_t s = view->head_span[h]; s < view->head_span[h + 1]; s++) {
                const tri__kv_span *sp = &view->spans[s];
                for (int32_t j = 0; j < sp->n;) {
                    int64_t p = sp->pos ? sp->pos[j] : (int64_t)sp->pos0 + j;
                    if (p < lo) {  // skip to the first visible row
                        j = sp->pos ? j + 1 : (int32_t)(lo - sp->pos0 < sp->n ? lo - sp->pos0 : sp->n);
                        continue;
                    }
                    int32_t e = j + 1;  // the run of visible rows from j
                    if (sp->pos)
                        while (e < sp->n && sp->pos[e] >= lo) e++;
                    else
                        e = sp->n;
                    TRY(win_reserve(ll, k + 1));
                    tri__kv_span t = *sp;
                    t.pos0 = sp->pos0 + j;
                    t.n = e - j;
                    const int64_t skip = tri__dtype_row_bytes(tri__kv_span_type(view, sp), (int64_t)j * sp->stride);
                    t.k = (const char *)sp->k + skip;
                    t.v = (const char *)sp->v + skip;
                    t.pos = sp->pos ? sp->pos + j : NULL;
                    ll->win_spans[k++] = t;
                    j = e;
                }
            }
        }
        ll->win_head_span[view->n_head_kv] = (int32_t)k;
        tri__kv_view trimmed = {view->type, view->n_head_kv,  ll->win_spans, ll->win_head_span,
                                view->tree, view->span_types, view->softcap};
        TRY(op->attention(ll->be, out + i * q_dim, q + i * q_dim, q_pos + i, 1, c->n_head, hd, &trimmed, NULL));
    }
    return TRI_STATUS_OK;
}

// A block's queries, keys and values (before RoPE) of the n tokens in ll->x: ll->q, ll->k, ll->v.
static tri_status block_qkv(tri__llama *ll, const tri__layer *L, int32_t n) {
    const tri_model_config *c = &ll->model->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    int64_t E = c->n_embd, q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    TRY(op->rmsnorm(be, ll->xb, ll->x, L->attn_norm->data, L->attn_norm->type, n, E, c->rms_eps));
    TRY(op->matmul(be, ll->q, ll->xb, L->wq->data, L->wq->type, n, q_dim, E));
    TRY(op->matmul(be, ll->k, ll->xb, L->wk->data, L->wk->type, n, kv_dim, E));
    TRY(op->matmul(be, ll->v, ll->xb, L->wv->data, L->wv->type, n, kv_dim, E));
    TRY(add_bias(ll, ll->q, L->bq, n, q_dim));
    TRY(add_bias(ll, ll->k, L->bk, n, kv_dim));
    TRY(add_bias(ll, ll->v, L->bv, n, kv_dim));
    // the family's per-head RMSNorm of q and k (qwen3), before rope: rows of head_dim
    if (L->q_norm)
        TRY(op->rmsnorm(be, ll->q, ll->q, L->q_norm->data, L->q_norm->type, (int64_t)n * c->n_head, c->head_dim,
                        c->rms_eps));
    if (L->k_norm)
        TRY(op->rmsnorm(be, ll->k, ll->k, L->k_norm->data, L->k_norm->type, (int64_t)n * c->n_head_kv, c->head_dim,
                        c->rms_eps));
    // query_pre_attn_scalar (Gemma 2): the scores are scaled by its -1/2 power, not head_dim's
    const float qs = ll->model->fdata.q_scale;
    if (qs > 0 && qs != 1.0f) TRY(op->scale(be, ll->q, n * q_dim, qs));
    return TRI_STATUS_OK;
}

// The family's final-logit soft-cap (Gemma 2) on n host logits: cap * tanh(x / cap), as
// transformers does to the head's output.
static void final_softcap(const tri_model *m, float *logits, int64_t n) {
    const float cap = m->fdata.final_softcap;
    if (cap <= 0 || !logits) return;
    for (int64_t i = 0; i < n; i++) logits[i] = cap * tanhf(logits[i] / cap);
}

// The rest of a block once attention wrote ll->att: the output projection, the residual, the
// feed-forward and its residual.
static tri_status block_out(tri__llama *ll, const tri__layer *L, int32_t n) {
    const tri_model_config *c = &ll->model->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    int64_t E = c->n_embd, q_dim = (int64_t)c->n_head * c->head_dim;
    TRY(op->matmul(be, ll->proj, ll->att, L->wo->data, L->wo->type, n, E, q_dim));
    if (ll->ar.sum) TRY(ll->ar.sum(ll->ar.ctx, ll->ar.rank, ll->proj, n * E));  // the ranks' heads summed
    TRY(add_bias(ll, ll->proj, L->bo, n, E));  // once, after the sum
    if (L->post_attn_norm)                     // (Gemma 2) of the whole sum
        TRY(op->rmsnorm(be, ll->proj, ll->proj, L->post_attn_norm->data, L->post_attn_norm->type, n, E, c->rms_eps));
    TRY(op->add(be, ll->x, ll->x, ll->proj, n * E));

    TRY(op->rmsnorm(be, ll->xb, ll->x, L->ffn_norm->data, L->ffn_norm->type, n, E, c->rms_eps));
    TRY(op->matmul(be, ll->gate, ll->xb, L->w_gate->data, L->w_gate->type, n, c->n_ff, E));
    TRY(op->matmul(be, ll->up, ll->xb, L->w_up->data, L->w_up->type, n, c->n_ff, E));
    TRY(gated(ll, ll->gate, ll->gate, ll->up, n * c->n_ff));
    TRY(op->matmul(be, ll->proj, ll->gate, L->w_down->data, L->w_down->type, n, E, c->n_ff));
    if (ll->ar.sum) TRY(ll->ar.sum(ll->ar.ctx, ll->ar.rank, ll->proj, n * E));  // the ranks' FFN rows summed
    if (L->post_ffn_norm)
        TRY(op->rmsnorm(be, ll->proj, ll->proj, L->post_ffn_norm->data, L->post_ffn_norm->type, n, E, c->rms_eps));
    return op->add(be, ll->x, ll->x, ll->proj, n * E);
}

// The attention of a step's n queries (q at q_pos, rotated at pos) over the policy's view; kv_type
// mixed: each run of queries with the same f16 window over its own view (tri__kv_policy_mixed_view),
// so that a query reads what it would in a step of its own.
static tri_status attend_policy(tri__llama *ll, tri__kv_policy *pol, int32_t il, float *out, const float *q,
                                const int32_t *q_pos, const int32_t *pos, int32_t n, const tri__kv_view *view,
                                float *weight_sums) {
    tri__kv_view capped;
    if (ll->model->fdata.attn_softcap > 0) {  // the family's attention-logit soft-cap (Gemma 2)
        capped = *view;
        capped.softcap = ll->model->fdata.attn_softcap;
        view = &capped;
    }
    if (!pol->mixed) return attend_window(ll, il, out, q, q_pos, n, view, weight_sums);
    const int64_t qd = (int64_t)ll->model->config.n_head * ll->model->config.head_dim;
    if (tri__kv_policy_mixed_heavy(pol)) {  // each query after the last one's scores (policy-mixed.c)
        for (int32_t i = 0; i < n; i++) {
            float *ws;
            const tri__kv_view *vq;
            TRY(tri__kv_policy_mixed_query(pol, il, pos[i], &vq, &ws));
            tri__kv_view v = *vq;
            v.tree = view->tree;
            v.softcap = view->softcap;
            TRY(attend_window(ll, il, out + i * qd, q + i * qd, q_pos + i, 1, &v, ws));
            TRY(tri__kv_policy_mixed_scored(pol, il));
        }
        return TRI_STATUS_OK;
    }
    for (int32_t i0 = 0; i0 < n;) {
        int32_t lo = tri__kv_policy_mixed_lo(pol, pos[i0]), i1 = i0 + 1;
        while (i1 < n && tri__kv_policy_mixed_lo(pol, pos[i1]) == lo) i1++;
        tri__kv_view v = *tri__kv_policy_mixed_view(pol, il, lo);
        v.tree = view->tree;
        v.softcap = view->softcap;
        if (tri__kv_store_splits(pol->kv, il))  // offloaded: the rows past split_dev on the host
            TRY(tri__kv_store_attend_split_view(pol->kv, il, out + i0 * qd, q + i0 * qd, q_pos + i0, i1 - i0,
                                                ll->model->config.n_head, &v));
        else
            TRY(attend_window(ll, il, out + i0 * qd, q + i0 * qd, q_pos + i0, i1 - i0, &v, weight_sums));
        i0 = i1;
    }
    return TRI_STATUS_OK;
}

// One transformer block over the n tokens in ll->x at positions ll->pos (queries at ll->q_pos).
static tri_status block(tri__llama *ll, tri__kv_policy *pol, int32_t il, int32_t n) {
    const tri_model_config *c = &ll->model->config;
    const tri__layer *L = &ll->model->layers[il];
    tri__backend *be = ll->be;

    // attention
    TRY(block_qkv(ll, L, n));
    // a tree's nodes rotate at their depth (ll->pos), not at their row (a FULL policy's q_pos)
    TRY(tri__rope_apply(be, ll->q, n, c->n_head, ll->tree ? ll->pos : ll->q_pos, &ll->rope));
    // a policy that rotates keys itself (StreamingLLM, by position inside the cache) takes them raw
    if (!pol->raw_keys) TRY(tri__rope_apply(be, ll->k, n, c->n_head_kv, ll->pos, &ll->rope));
    const tri__kv_view *view;
    float *weight_sums;
    TRY(tri__kv_policy_layer(pol, il, ll->q, ll->k, ll->v, &view, &weight_sums));
    tri__kv_view treed;
    if (ll->tree) {  // the same rows, masked by the tree
        treed = *view;
        treed.tree = ll->tree;
        view = &treed;
    }
    if (tri__kv_store_splits(pol->kv, il) && !pol->mixed)  // an offloaded layer, part attended on the host
        TRY(tri__kv_store_attend_split(pol->kv, il, ll->att, ll->q, ll->q_pos, n, c->n_head, pol->step_n0 + n, ll->tree,
                                       ll->model->fdata.attn_softcap));
    else
        TRY(attend_policy(ll, pol, il, ll->att, ll->q, ll->q_pos, ll->pos, n, view, weight_sums));
    TRY(tri__kv_policy_observe(pol, il));
    return block_out(ll, L, n);  // and the feed-forward
}

// Logits (n_rows, n_vocab) into dst (host) of the hidden states rows (n_rows <= n_batch).
static tri_status output(tri__llama *ll, const float *rows, int32_t n_rows, float *dst) {
    const tri_model *m = ll->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    if (ll->ar.rank != 0) return TRI_STATUS_OK;  // every rank holds the same rows: rank 0's head
    TRY(ensure_logits(ll, n_rows));
    TRY(op->rmsnorm(be, ll->xb, rows, m->output_norm->data, m->output_norm->type, n_rows, c->n_embd, c->rms_eps));
    TRY(op->matmul(be, ll->logits, ll->xb, m->output->data, m->output->type, n_rows, c->n_vocab, c->n_embd));
    return op->copy_to_host(be, dst, ll->logits, (size_t)n_rows * (size_t)c->n_vocab * sizeof(float));
}

// One step of nb tokens (tokens, host) at the policy's end: every layer, then the logits asked for.
static tri_status forward_step(tri__llama *ll, tri__kv_policy *pol, const int32_t *tokens, int32_t nb,
                               bool want_logits, tri__logits_mode mode, float *dst) {
    const tri_model *m = ll->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    const int64_t E = c->n_embd, V = c->n_vocab;
    int32_t pos0 = tri__kv_policy_len(pol);
    for (int32_t i = 0; i < nb; i++) ll->pos[i] = pos0 + i;
    if (ll->tree) {  // a tree's nodes at their depth (rows and masks stay by row)
        if (pol->p.kind != TRI_KV_POLICY_FULL || pol->src || c->sliding_window > 0)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "forward pass: a token tree over a %s cache%s",
                             tri__kv_policy_name(pol->p.kind), c->sliding_window > 0 ? " with a sliding window" : "");
        for (int32_t i = 0; i < nb; i++) {
            int32_t r = pos0 + i - ll->tree->row0;
            if (r >= 0 && r < ll->tree->n) ll->pos[i] = ll->tree_pos[r];
        }
    }
    TRY(tri__kv_policy_begin(pol, nb, &ll->rope, ll->q_pos));

    // the full cache's offloaded layers split between the device and the host (a level over it
    // whose view is its own, a measurement or a selection taken from its rows streams them whole;
    // so does a step past a sliding window, which attends over trimmed views)
    if (pol->p.kind == TRI_KV_POLICY_FULL && !pol->src && !pol->measure && !pol->tap &&
        !(c->sliding_window > 0 && pos0 + nb > c->sliding_window))
        tri__kv_store_split_begin(pol->kv, pos0, nb);
    tri_status st = op->get_rows(be, ll->x, m->tok_embd->data, m->tok_embd->type, V, E, tokens, nb);
    if (!st) st = scale_embeddings(ll, ll->x, nb);
    for (int32_t il = 0; !st && il < c->n_layer; il++) {
        st = tri__model_stream_layer(m, il);  // streamed weights: this block's in, the next's coming
        if (!st) st = block(ll, pol, il, nb);
    }
    tri__kv_store_split_end(pol->kv);
    if (st) {
        tri__kv_policy_abort(pol);
        return st;
    }
    // positions up to pos0 + nb are now in every layer; commit them so the next step's attention
    // sees them
    TRY(tri__kv_policy_commit(pol));
    if (!want_logits) return TRI_STATUS_OK;
    // only the rows we need go through the output norm and head
    return mode == TRI_LOGITS_LAST ? output(ll, ll->x + (int64_t)(nb - 1) * E, 1, dst) : output(ll, ll->x, nb, dst);
}

// ---- layer-major passes ----

// Tokens per layer-major pass of a prefill: their hidden states, (span, n_embd) f32, stay in
// backend memory (128 MiB at n_embd 4096) while they run through one layer after another.
#define PREFILL_SPAN 8192

// Whether tri__llama_forward_policy runs n tokens layer by layer: a full cache (its own or one it
// wraps), something that streams per pass (offloaded KV layers, weight blocks), which the
// token-major order moves once per step. (Each position's rotary table depends on the position and
// the context's first length alone, not on the order of the steps: rope.h.)
static bool layer_major(const tri__llama *ll, const tri__kv_policy *pol, int32_t n, tri__logits_mode mode) {
    return pol->p.kind == TRI_KV_POLICY_FULL && !pol->src && !pol->measure && mode != TRI_LOGITS_ALL &&
           n > ll->n_batch && (pol->kv->off || ll->model->stream);
}

int32_t tri__llama_prefill_step(const tri__llama *ll, const tri__kv_policy *pol) {
    return layer_major(ll, pol, INT32_MAX, TRI_LOGITS_LAST) ? PREFILL_SPAN : ll->n_batch;
}

// n tokens (n <= PREFILL_SPAN) through every layer in turn, each layer in steps of n_batch: a step
// of layer il attends to the rows layer il holds before it, which are the same rows in the same
// order as in the token-major pass, so the results are the same. Each offloaded KV layer's rows
// before the tokens upload once (the next layer's behind this one's steps), each streamed block
// once; the new rows go back to the host step by step as usual.
static tri_status forward_layers(tri__llama *ll, tri__kv_policy *pol, const int32_t *tokens, int32_t n,
                                 tri__logits_mode mode, float *dst) {
    const tri_model *m = ll->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    tri__kv_store *kv = pol->kv;
    const int64_t E = c->n_embd, V = c->n_vocab;
    const int32_t n0 = kv->n;
    float *xs = NULL, *x_step = ll->x;
    TRY(op->alloc(be, sizeof(float) * (size_t)n * (size_t)E, (void **)&xs));
    tri_status st = op->get_rows(be, xs, m->tok_embd->data, m->tok_embd->type, V, E, tokens, n);
    if (!st) st = scale_embeddings(ll, xs, n);
    kv->no_prefetch = true;
    for (int32_t il = 0; !st && il < c->n_layer; il++) {
        st = tri__model_stream_layer(m, il);
        // the next layer's rows before these tokens upload while this layer runs all of them
        if (!st) st = tri__kv_store_prefetch(kv, il + 1, n0);
        for (int32_t done = 0; !st && done < n; done += ll->n_batch) {
            int32_t nb = n - done < ll->n_batch ? n - done : ll->n_batch;
            for (int32_t i = 0; i < nb; i++) ll->pos[i] = ll->q_pos[i] = n0 + done + i;
            // the full policy's step, one layer of it: rows written at n0 + done, attended to up to
            // n0 + done + nb (tri__kv_policy_begin without the length, which the pass sets at the end)
            pol->in_step = true;
            pol->step_n0 = n0 + done;
            pol->step_m = nb;
            ll->x = xs + (int64_t)done * E;
            st = block(ll, pol, il, nb);
            pol->in_step = false;
        }
    }
    ll->x = x_step;
    kv->no_prefetch = false;
    if (!st) st = tri__kv_store_set_len(kv, n0 + n);  // (a failure: the caller aborts the policy)
    if (!st && mode == TRI_LOGITS_LAST) st = output(ll, xs + (int64_t)(n - 1) * E, 1, dst);
    op->free(be, xs);  // after the work that uses it
    return st;
}

tri_status tri__llama_forward_policy(tri__llama *ll, tri__kv_policy *pol, const int32_t *tokens, int32_t n,
                                     tri__logits_mode mode, float *logits) {
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: %d tokens", n);
    int32_t n0 = tri__kv_policy_len(pol), cap = tri__kv_policy_capacity(pol);
    if (n0 > cap - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "context full: %d tokens in the cache + %d new > capacity %d", n0,
                         n, cap);
    if (!ll->x)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: its activation pool is not bound");
    if (pol->max_step < ll->n_batch)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: policy steps of %d tokens < batch %d",
                         pol->max_step, ll->n_batch);
    const int64_t V = ll->model->config.n_vocab;
    tri_status st = TRI_STATUS_OK;
    // the first evaluation of an empty cache fixes the length rules' tables (rope.h): the length
    // announced (tri__llama_set_prompt), or this call's
    if (n0 == 0) tri__rope_set_prompt(&ll->rope, ll->n_prompt > 0 ? ll->n_prompt : n);
    const bool by_layer = layer_major(ll, pol, n, mode);
    for (int32_t done = 0; by_layer && !st && done < n; done += PREFILL_SPAN) {
        int32_t nb = n - done < PREFILL_SPAN ? n - done : PREFILL_SPAN;
        st = forward_layers(ll, pol, tokens + done, nb, done + nb == n ? mode : TRI_LOGITS_NONE, logits);
    }
    for (int32_t done = by_layer ? n : 0; !st && done < n;) {
        // steps of n_batch, or fewer where the policy asks (StreamingLLM past its window), so the
        // cache is the same however the caller batched the tokens
        int32_t nb = n - done < ll->n_batch ? n - done : ll->n_batch;
        int32_t lim = tri__kv_policy_step_limit(pol);
        if (nb > lim) nb = lim;
        bool last = done + nb == n;
        bool want = mode == TRI_LOGITS_ALL || (mode == TRI_LOGITS_LAST && last);
        float *dst = mode == TRI_LOGITS_ALL ? logits + (int64_t)done * V : logits;
        st = forward_step(ll, pol, tokens + done, nb, want, mode, dst);
        done += nb;
    }
    if (!st) st = ll->be->ops->synchronize(ll->be);
    if (!st && mode != TRI_LOGITS_NONE) final_softcap(ll->model, logits, (mode == TRI_LOGITS_ALL ? n : 1) * V);
    if (st) tri__kv_policy_abort(pol);  // a step in progress, a selection armed for another level
    tri__kv_policy_tap_settle(pol, !st);
    if (st && tri__kv_policy_len(pol) != n0) {
        // a failed pass leaves the cache as it was
        tri_status st2 = tri__kv_policy_truncate(pol, n0);
        (void)st2;
    }
    return st;
}

tri_status tri__llama_forward(tri__llama *ll, tri__kv_store *kv, const int32_t *tokens, int32_t n,
                              tri__logits_mode mode, float *logits) {
    tri__kv_policy pol;
    TRY(tri__kv_policy_wrap_full(&pol, kv, ll->model->config.n_head, ll->n_batch));
    tri_status st = tri__llama_forward_policy(ll, &pol, tokens, n, mode, logits);
    tri__kv_policy_free(&pol);
    return st;
}

// ---- the one-token step of a StreamingLLM cache, computed from backend memory ----

bool tri__llama_step_supported(const tri__llama *ll, const tri__kv_policy *pol) {
    const tri__backend_ops *op = ll->be->ops;
    const tri_model_config *c = &ll->model->config;
    int32_t e = pol->p.evict_every > 1 ? pol->p.evict_every : 1;
    return op->get_rows_dev && op->rope_dev && op->attention_dev && op->set_rows && op->window_rows &&
           pol->p.kind == TRI_KV_POLICY_STREAMING && !pol->src && !pol->measure && !pol->kv->off && pol->be == ll->be &&
           // a split model's all-reduce records only where it is the backend's collective (NCCL),
           // and needs not where nothing records (the CPU);
           // the recorded step rotates with one table: the length rules (rope.h) take the pass
           (!ll->ar.sum || ll->ar.recordable || !op->graph_begin) && !ll->model->stream &&
           ll->rope.scaling != TRI_ROPE_SCALING_DYNAMIC && ll->rope.scaling != TRI_ROPE_SCALING_LONGROPE &&
           (c->sliding_window <= 0 || pol->p.budget + e <= c->sliding_window);
}

void tri__llama_step_free(tri__llama_step *s) {
    if (s->ll) {
        tri__backend *be = s->ll->be;
        if (s->graph) be->ops->graph_free(be, s->graph);
        be->ops->free(be, s->dev);
    }
    free(s->spans);
    free(s->head_span);
    memset(s, 0, sizeof *s);
}

tri_status tri__llama_step_init(tri__llama_step *s, tri__llama *ll, tri__kv_policy *pol, bool record) {
    memset(s, 0, sizeof *s);
    if (!tri__llama_step_supported(ll, pol))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "forward pass: a one-token step from backend memory over %s on %s",
                         tri__kv_policy_name(pol->p.kind), ll->be->ops->name);
    const int32_t nkv = pol->n_head_kv, kd = nkv * pol->head_dim;
    s->ll = ll;
    s->pol = pol;
    s->view_rows = pol->p.budget + (pol->p.evict_every > 1 ? pol->p.evict_every : 1);
    TRI_ASSERT(s->view_rows <= pol->p.budget + pol->max_step);  // the policy's view buffers hold it
    s->record = record && ll->be->ops->graph_begin;
    s->spans = calloc((size_t)nkv, sizeof *s->spans);
    s->head_span = calloc((size_t)nkv + 1, sizeof *s->head_span);
    tri_status st = s->spans && s->head_span ? TRI_STATUS_OK : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "forward pass: step view");
    if (!st) st = ll->be->ops->alloc(ll->be, sizeof(int32_t) * (size_t)(4 + s->view_rows), (void **)&s->dev);
    if (st) {
        tri__llama_step_free(s);
        return st;
    }
    for (int32_t h = 0; h < nkv; h++) {  // positions 0 .. view_rows - 1 in cache order
        s->spans[h] = (tri__kv_span){.pos0 = 0, .n = s->view_rows, .k = pol->sk + (int64_t)h * pol->head_dim,
                                     .v = pol->sv + (int64_t)h * pol->head_dim, .stride = kd};
        s->head_span[h] = h;
    }
    s->head_span[nkv] = nkv;
    return TRI_STATUS_OK;
}

// The step's ops, the same every time: everything they read that changes lives in s->dev.
static tri_status step_ops(tri__llama_step *s) {
    tri__llama *ll = s->ll;
    tri__kv_policy *pol = s->pol;
    const tri_model *m = ll->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    const int32_t kd = pol->n_head_kv * pol->head_dim, V = s->view_rows;
    int32_t *token = s->dev, *q_pos = s->dev + 2, *own = s->dev + 3, *rows = s->dev + 4;
    const tri__stream_window w = tri__kv_policy_window(pol);
    const tri__kv_view view = {TRI_DTYPE_F32, pol->n_head_kv,       s->spans, s->head_span, NULL,
                               false,         m->fdata.attn_softcap};
    TRY(op->get_rows_dev(be, ll->x, m->tok_embd->data, m->tok_embd->type, c->n_vocab, c->n_embd, token, 1));
    TRY(scale_embeddings(ll, ll->x, 1));
    TRY(op->window_rows(be, s->dev, rows, V, &w));
    for (int32_t il = 0; il < c->n_layer; il++) {
        const tri__layer *L = &m->layers[il];
        tri__kv_store *kv = pol->kv;
        TRY(block_qkv(ll, L, 1));
        TRY(op->rope_dev(be, ll->q, 1, c->n_head, q_pos, &ll->rope));
        // the raw key and value into the store's row, then the view gathered and turned by rank
        TRY(op->set_rows(be, kv->k[il], kv->type, ll->k, own, 1, kd));
        TRY(op->set_rows(be, kv->v[il], kv->type, ll->v, own, 1, kd));
        TRY(op->get_rows_dev(be, pol->sk, kv->k[il], kv->type, kv->capacity, kd, rows, V));
        TRY(op->get_rows_dev(be, pol->sv, kv->v[il], kv->type, kv->capacity, kd, rows, V));
        TRY(op->rope(be, pol->sk, V, pol->n_head_kv, pol->cache_pos, &ll->rope));
        TRY(op->attention_dev(be, ll->att, ll->q, q_pos, 1, c->n_head, c->head_dim, &view));
        TRY(block_out(ll, L, 1));
    }
    TRY(op->rmsnorm(be, ll->xb, ll->x, m->output_norm->data, m->output_norm->type, 1, c->n_embd, c->rms_eps));
    return op->matmul(be, ll->logits, ll->xb, m->output->data, m->output->type, 1, c->n_vocab, c->n_embd);
}

// Records the step once, or again when a buffer it was recorded over moved.
static tri_status step_graph(tri__llama_step *s) {
    tri__llama *ll = s->ll;
    tri__backend *be = ll->be;
    const void *now[TRI_LLAMA_STEP_BAKED] = {ll->x, ll->xb, ll->q, ll->k, ll->v, ll->att, ll->proj, ll->gate, ll->up, ll->logits,
                           s->pol->sk};
    if (s->graph && memcmp(now, s->baked, sizeof now) == 0) return TRI_STATUS_OK;
    be->ops->graph_free(be, s->graph);
    s->graph = NULL;
    TRY(be->ops->graph_begin(be));
    tri_status st = step_ops(s);
    tri__graph *g = NULL;
    tri_status st2 = be->ops->graph_end(be, &g);  // ends the recording whatever happened in it
    if (st) {
        be->ops->graph_free(be, g);
        return st;
    }
    TRY(st2);
    s->graph = g;
    memcpy(s->baked, now, sizeof now);
    s->n_recorded++;
    return TRI_STATUS_OK;
}

tri_status tri__llama_step_run(tri__llama_step *s, int32_t token, float *logits) {
    tri__llama *ll = s->ll;
    tri__kv_policy *pol = s->pol;
    tri__backend *be = ll->be;
    const int32_t V = ll->model->config.n_vocab;
    if (token < 0 || token >= V) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: token %d of %d", token, V);
    if (!ll->x) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: its activation pool is not bound");
    TRY(ensure_logits(ll, 1));
    const int32_t n0 = tri__kv_policy_len(pol);
    TRY(tri__kv_policy_begin(pol, 1, &ll->rope, ll->q_pos));  // the host's bookkeeping of the step
    const int32_t state[2] = {token, n0};
    tri_status st = be->ops->copy_to_backend(be, s->dev, state, sizeof state);
    if (!st && s->record) {
        st = step_graph(s);
        if (!st) st = be->ops->graph_launch(be, s->graph);
        if (!st) s->n_replays++;
    } else if (!st) {
        st = step_ops(s);
    }
    if (!st && logits) st = be->ops->copy_to_host(be, logits, ll->logits, sizeof(float) * (size_t)V);
    if (!st) st = be->ops->synchronize(be);
    if (st) {
        tri__kv_policy_abort(pol);
        return st;
    }
    final_softcap(ll->model, logits, V);
    s->n_steps++;
    return tri__kv_policy_commit(pol);
}

// ---- batches: several sequences in one pass ----

// One sequence's step in a pass: its rows [row0, row0 + nb) of run's activations, after the
// done tokens it ran before.
typedef struct batch_step {
    int32_t seq, row0, nb, done;
} batch_step;

// One block over every step of the pass: the projections and the feed-forward over all rows at
// once (each weight read once), rotary positions, the policy's view and attention per sequence.
static tri_status batch_block(tri__llama *run, tri__llama_seq *seqs, const batch_step *steps, int32_t n_steps,
                              int32_t il, int32_t rows) {
    const tri_model_config *c = &run->model->config;
    const tri__layer *L = &run->model->layers[il];
    const int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_head_kv * c->head_dim;
    TRY(block_qkv(run, L, rows));
    bool others = false;  // a sequence whose cache another backend (a session's own stream) serves
    for (int32_t k = 0; k < n_steps; k++) {
        tri__llama *ll = seqs[steps[k].seq].ll;
        const int32_t nb = steps[k].nb;
        float *q = run->q + steps[k].row0 * qd, *kr = run->k + steps[k].row0 * kd;
        TRY(tri__rope_apply(run->be, q, nb, c->n_head, ll->q_pos, &ll->rope));
        if (!seqs[steps[k].seq].pol->raw_keys) TRY(tri__rope_apply(run->be, kr, nb, c->n_head_kv, ll->pos, &ll->rope));
        others |= ll->be != run->be;
    }
    // the other backends' ops read the rows this one wrote, and this one's read their attention
    if (others) TRY(run->be->ops->synchronize(run->be));
    for (int32_t k = 0; k < n_steps; k++) {
        tri__llama *ll = seqs[steps[k].seq].ll;
        tri__kv_policy *pol = seqs[steps[k].seq].pol;
        const int32_t nb = steps[k].nb;
        float *q = run->q + steps[k].row0 * qd, *kr = run->k + steps[k].row0 * kd, *v = run->v + steps[k].row0 * kd;
        float *att = run->att + steps[k].row0 * qd;
        const tri__kv_view *view;
        float *weight_sums;
        TRY(tri__kv_policy_layer(pol, il, q, kr, v, &view, &weight_sums));
        if (tri__kv_store_splits(pol->kv, il) && !pol->mixed)
            TRY(tri__kv_store_attend_split(pol->kv, il, att, q, ll->q_pos, nb, c->n_head, pol->step_n0 + nb, NULL,
                                           run->model->fdata.attn_softcap));
        else
            TRY(attend_policy(ll, pol, il, att, q, ll->q_pos, ll->pos, nb, view, weight_sums));
        TRY(tri__kv_policy_observe(pol, il));
    }
    for (int32_t k = 0; others && k < n_steps; k++) {
        tri__backend *be = seqs[steps[k].seq].ll->be;
        if (be != run->be) TRY(be->ops->synchronize(be));
    }
    return block_out(run, L, rows);
}

// The logits the pass's steps want: their rows gathered into run->proj, through the output norm
// and head together, then each sequence's rows to its host buffer.
static tri_status batch_output(tri__llama *run, tri__llama_seq *seqs, const batch_step *steps, int32_t n_steps) {
    const tri_model *m = run->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = run->be->ops;
    tri__backend *be = run->be;
    const int64_t E = c->n_embd, V = c->n_vocab;
    if (run->ar.rank != 0) return TRI_STATUS_OK;  // every rank holds the same rows: rank 0's head
    int32_t n_out = 0;
    for (int32_t k = 0; k < n_steps; k++) {
        const tri__llama_seq *sq = &seqs[steps[k].seq];
        bool last = steps[k].done + steps[k].nb == sq->n;
        int32_t r0 = sq->mode == TRI_LOGITS_ALL ? sq->skip - steps[k].done : steps[k].nb - 1;
        if (r0 < 0) r0 = 0;
        if (sq->mode == TRI_LOGITS_NONE || (sq->mode == TRI_LOGITS_LAST && !last)) continue;
        for (int32_t r = r0; r < steps[k].nb; r++, n_out++) {
            const float *src = run->x + (int64_t)(steps[k].row0 + r) * E;
            float *dst = run->proj + (int64_t)n_out * E;
            if (op->copy)
                TRY(op->copy(be, dst, src, sizeof(float) * (size_t)E));
            else
                return tri__fail(TRI_STATUS_UNSUPPORTED, "batch: backend %s has no copy", op->name);
        }
    }
    if (n_out == 0) return TRI_STATUS_OK;
    TRY(ensure_logits(run, n_out));
    TRY(op->rmsnorm(be, run->xb, run->proj, m->output_norm->data, m->output_norm->type, n_out, E, c->rms_eps));
    TRY(op->matmul(be, run->logits, run->xb, m->output->data, m->output->type, n_out, V, E));
    n_out = 0;
    for (int32_t k = 0; k < n_steps; k++) {
        const tri__llama_seq *sq = &seqs[steps[k].seq];
        bool last = steps[k].done + steps[k].nb == sq->n;
        if (sq->mode == TRI_LOGITS_NONE || (sq->mode == TRI_LOGITS_LAST && !last)) continue;
        // ALL: the step's rows at or after skip (token done + r is row done + r - skip)
        int32_t r0 = sq->mode == TRI_LOGITS_ALL && sq->skip > steps[k].done ? sq->skip - steps[k].done : 0;
        if (r0 >= steps[k].nb) continue;
        int32_t rows = sq->mode == TRI_LOGITS_ALL ? steps[k].nb - r0 : 1;
        float *dst =
            sq->mode == TRI_LOGITS_ALL ? sq->logits + (int64_t)(steps[k].done + r0 - sq->skip) * V : sq->logits;
        TRY(op->copy_to_host(be, dst, run->logits + (int64_t)n_out * V, sizeof(float) * (size_t)(rows * V)));
        n_out += rows;
    }
    return TRI_STATUS_OK;
}

// One pass: every step begun at its policy's end, the tokens tok (rows, host) through every
// layer, the steps committed, the logits asked for. On failure the steps begun are abandoned
// (the ones committed before a failed commit are the caller's to roll back).
static tri_status batch_pass(tri__llama *run, tri__llama_seq *seqs, const batch_step *steps, int32_t n_steps,
                             const int32_t *tok, int32_t rows) {
    const tri_model *m = run->model;
    const tri_model_config *c = &m->config;
    tri_status st = TRI_STATUS_OK;
    int32_t begun = 0;
    for (; begun < n_steps; begun++) {
        tri__llama *ll = seqs[steps[begun].seq].ll;
        tri__kv_policy *pol = seqs[steps[begun].seq].pol;
        const int32_t nb = steps[begun].nb, pos0 = tri__kv_policy_len(pol);
        for (int32_t i = 0; i < nb; i++) ll->pos[i] = pos0 + i;
        if ((st = tri__kv_policy_begin(pol, nb, &ll->rope, ll->q_pos))) break;
        // as forward_step: an offloaded full cache splits its layers between device and host
        if (pol->p.kind == TRI_KV_POLICY_FULL && !pol->src && !pol->measure && !pol->tap &&
            !(c->sliding_window > 0 && pos0 + nb > c->sliding_window))
            tri__kv_store_split_begin(pol->kv, pos0, nb);
    }
    if (!st) st = run->be->ops->get_rows(run->be, run->x, m->tok_embd->data, m->tok_embd->type, c->n_vocab, c->n_embd,
                                         tok, rows);
    if (!st) st = scale_embeddings(run, run->x, rows);
    for (int32_t il = 0; !st && il < c->n_layer; il++) {
        st = tri__model_stream_layer(m, il);
        if (!st) st = batch_block(run, seqs, steps, n_steps, il, rows);
    }
    for (int32_t k = 0; k < begun; k++) tri__kv_store_split_end(seqs[steps[k].seq].pol->kv);
    int32_t committed = 0;  // (a commit that fails abandons its own step)
    while (!st && committed < n_steps) {
        st = tri__kv_policy_commit(seqs[steps[committed].seq].pol);
        if (!st) committed++;
    }
    if (st) {
        for (int32_t k = committed; k < begun; k++) tri__kv_policy_abort(seqs[steps[k].seq].pol);
        return st;
    }
    return batch_output(run, seqs, steps, n_steps);
}

tri_status tri__llama_forward_batch(tri__llama *run, tri__llama_seq *seqs, int32_t n_seqs) {
    if (n_seqs < 1) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "batch: %d sequences", n_seqs);
    if (!run->x) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "batch: its activation pool is not bound");
    const tri_model_config *c = &run->model->config;
    for (int32_t i = 0; i < n_seqs; i++) {
        const tri__llama_seq *sq = &seqs[i];
        const tri_model_config *ci = &sq->ll->model->config;
        if (sq->n <= 0 || !sq->tokens || sq->skip < 0 || sq->skip >= sq->n)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "batch: sequence %d: %d tokens, the first %d without logits",
                             i, sq->n, sq->skip);
        int32_t n0 = tri__kv_policy_len(sq->pol), cap = tri__kv_policy_capacity(sq->pol);
        if (n0 > cap - sq->n)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "batch: sequence %d: context full: %d tokens in the cache + %d new > capacity %d", i, n0,
                             sq->n, cap);
        if (sq->ll->n_batch > run->n_batch || sq->pol->max_step < sq->ll->n_batch)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "batch: sequence %d: steps of %d tokens, policy steps of %d, a pass of %d rows", i,
                             sq->ll->n_batch, sq->pol->max_step, run->n_batch);
        if (ci->n_layer != c->n_layer || ci->n_embd != c->n_embd || ci->n_head != c->n_head ||
            ci->n_head_kv != c->n_head_kv || ci->n_vocab != c->n_vocab)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "batch: sequence %d runs another model (or another shard of it) than the batch", i);
    }
    int32_t *n0 = malloc(sizeof *n0 * (size_t)n_seqs), *done = calloc((size_t)n_seqs, sizeof *done);
    int32_t *tok = malloc(sizeof *tok * (size_t)run->n_batch);
    batch_step *steps = malloc(sizeof *steps * (size_t)n_seqs);
    tri_status st = n0 && done && tok && steps ? TRI_STATUS_OK
                                               : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "batch: %d sequences", n_seqs);
    for (int32_t i = 0; !st && i < n_seqs; i++) {
        n0[i] = tri__kv_policy_len(seqs[i].pol);
        // the first evaluation of an empty cache fixes the length rules' tables (rope.h)
        tri__llama *ll = seqs[i].ll;
        if (n0[i] == 0) tri__rope_set_prompt(&ll->rope, ll->n_prompt > 0 ? ll->n_prompt : seqs[i].n);
    }
    for (bool left = true; !st && left;) {
        int32_t rows = 0, n_steps = 0;
        left = false;
        for (int32_t i = 0; i < n_seqs; i++) {
            const tri__llama_seq *sq = &seqs[i];
            if (done[i] == sq->n) continue;
            // the step it takes alone: n_batch tokens, or fewer where its policy says
            int32_t nb = sq->n - done[i] < sq->ll->n_batch ? sq->n - done[i] : sq->ll->n_batch;
            int32_t lim = tri__kv_policy_step_limit(sq->pol);
            if (nb > lim) nb = lim;
            if (rows + nb > run->n_batch) {  // the next pass
                left = true;
                continue;
            }
            steps[n_steps++] = (batch_step){i, rows, nb, done[i]};
            memcpy(tok + rows, sq->tokens + done[i], sizeof *tok * (size_t)nb);
            rows += nb;
        }
        st = batch_pass(run, seqs, steps, n_steps, tok, rows);
        for (int32_t k = 0; !st && k < n_steps; k++) {
            done[steps[k].seq] += steps[k].nb;
            if (done[steps[k].seq] < seqs[steps[k].seq].n) left = true;
        }
    }
    if (!st) st = run->be->ops->synchronize(run->be);
    for (int32_t i = 0; !st && i < n_seqs; i++)  // what the policies queued on their own backends
        if (seqs[i].ll->be != run->be) st = seqs[i].ll->be->ops->synchronize(seqs[i].ll->be);
    for (int32_t i = 0; !st && i < n_seqs; i++) {  // every row asked for is on the host now
        const tri__llama_seq *sq = &seqs[i];
        int64_t rows = sq->mode == TRI_LOGITS_ALL ? sq->n - sq->skip : sq->mode == TRI_LOGITS_LAST ? 1 : 0;
        final_softcap(run->model, sq->logits, rows * c->n_vocab);
    }
    for (int32_t i = 0; n0 && done && i < n_seqs; i++) {
        tri__kv_policy *pol = seqs[i].pol;
        tri__kv_policy_tap_settle(pol, !st);
        if (st && tri__kv_policy_len(pol) != n0[i]) {  // a failed call leaves every cache as it was
            tri_status st2 = tri__kv_policy_truncate(pol, n0[i]);
            (void)st2;
        }
    }
    free(n0), free(done), free(tok), free(steps);
    return st;
}
