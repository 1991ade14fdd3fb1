// level.c - the level adapter over tri__llama and a KV cache policy.
#include "level.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "model.h"
#include "tensor-parallel.h"

void tri__level_free(tri__level *lv) {
    for (int32_t r = 1; lv->peers && r < lv->n_ranks; r++) tri__level_free(&lv->peers[r - 1]);
    free(lv->peers);
    if (lv->be) {
        tri__llama_step_free(&lv->step);
        tri__kv_policy_free(&lv->pol);
        tri__kv_store_free(&lv->store);
        tri__llama_free(&lv->ll);
    }
    free(lv->logits);
    free(lv->refresh_at);
    free(lv->refresh_from);
    memset(lv, 0, sizeof *lv);
}

tri_status tri__level_init(tri__level *lv, const tri_model *model, tri__backend *be,
                           const tri__level_params *params) {
    memset(lv, 0, sizeof *lv);
    const tri_model_config *c = &model->config;
    if (params->n_ctx <= 0 || params->n_batch <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: n_ctx %d and n_batch %d must be positive",
                         params->n_ctx, params->n_batch);
    tri__kv_policy_params kp = tri__kv_policy_default_params(params->policy, params->n_ctx);
    switch (params->policy) {
    case TRI_KV_POLICY_FULL:
        if (params->kv_type == TRI_DTYPE_KV_MIXED) {  // the tokens kept in f16 too: sinks and window
            TRY(tri__kv_policy_mixed_rows(&kp, params->sink, params->budget, "level"));
            kp.rollback = params->rollback;
        }
        break;
    case TRI_KV_POLICY_STREAMING:
        kp.budget = params->budget;
        kp.sink = params->sink;
        kp.rollback = params->rollback;
        kp.evict_every = params->evict_every;
        break;
    case TRI_KV_POLICY_RETRIEVAL:
        kp.budget = params->budget;
        kp.chunk = params->chunk;
        kp.index = params->index;
        kp.refresh = 0;  // the engine decides when to select (tri__level_eval_refresh)
        kp.gather_type = params->gather_type;
        break;
    default:
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: policy %s is not one a level serves",
                         tri__kv_policy_name(params->policy));
    }
    // a budget past the context is the full cache (tri__kv_policy_cover); the values as given are
    // checked otherwise (a chunk that does not divide the budget): the caller resolved the defaults
    tri__kv_policy_cover(&kp, params->n_ctx);
    tri_status st;
    if ((st = tri__kv_policy_check(&kp, params->n_ctx))) return st;
    // a budget of the whole context evicts nothing: the full policy computes the same, exactly
    if (kp.kind != TRI_KV_POLICY_FULL && kp.budget == params->n_ctx)
        kp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, params->n_ctx);
    lv->model = model;
    lv->be = be;
    lv->params = *params;
    lv->n_ranks = 1;
    if ((st = tri__llama_init_pooled(&lv->ll, model, be, params->n_batch, params->acts))) goto fail;
    if (params->kv_offloaded > 0) {
        if (kp.kind != TRI_KV_POLICY_FULL || params->kv_offloaded > c->n_layer) {
            st = tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: %d offloaded layers of %d with policy %s (full only)",
                           params->kv_offloaded, c->n_layer, tri__kv_policy_name(kp.kind));
            goto fail;
        }
        const bool mixed = params->kv_type == TRI_DTYPE_KV_MIXED;  // the q4_0 rows stream, the f16 ones stay
        if ((st = tri__kv_store_init_offload(&lv->store, be, mixed ? TRI_DTYPE_Q4_0 : params->kv_type, c->n_layer,
                                             c->n_head_kv, c->head_dim, params->n_ctx,
                                             c->n_layer - params->kv_offloaded)))
            goto fail;
        if ((st = tri__kv_store_set_split(&lv->store, params->kv_host_fraction, params->kv_host_threads))) goto fail;
        if ((st = mixed ? tri__kv_policy_wrap_mixed(&lv->pol, &kp, &lv->store, c->n_head, params->n_batch)
                        : tri__kv_policy_wrap_full(&lv->pol, &lv->store, c->n_head, params->n_batch)))
            goto fail;
    } else if (kp.kind == TRI_KV_POLICY_RETRIEVAL && params->kv_source) {
        const tri__kv_store *src = params->kv_source;
        if (src->n_layer != c->n_layer || src->n_head_kv != c->n_head_kv || src->head_dim != c->head_dim ||
            src->capacity != params->n_ctx || src->be != be) {
            st = tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: the store to borrow has another shape or backend");
            goto fail;
        }
        if ((st = tri__kv_policy_init_borrowed(&lv->pol, &kp, params->kv_source, c->n_head, params->ring,
                                               params->n_batch)))
            goto fail;
    } else if ((st = tri__kv_policy_init(&lv->pol, &kp, be, params->kv_type, c->n_layer, c->n_head, c->n_head_kv,
                                         c->head_dim, params->n_ctx, params->n_batch))) {
        goto fail;
    }
    // a draft's one-token steps as one recorded graph each, where the backend records them
    if (be->ops->graph_begin && tri__llama_step_supported(&lv->ll, &lv->pol) &&
        (st = tri__llama_step_init(&lv->step, &lv->ll, &lv->pol, true)))
        goto fail;
    return TRI_STATUS_OK;

fail:
    tri__level_free(lv);
    return st;
}

void tri__level_set_ranks(tri__level *lv, tri__level *peers, int32_t n_ranks, struct tri__tp *tp) {
    lv->peers = peers;
    lv->n_ranks = n_ranks;
    lv->tp = tp;
    for (int32_t r = 0; r < n_ranks; r++) {
        tri__level *x = tri__level_rank(lv, r);
        x->ll.ar = tri__tp_allreduce_for(tp, r);
        // a step made before the split was known: kept only where its all-reduce can be recorded
        if (x->step.ll && !tri__llama_step_supported(&x->ll, &x->pol)) tri__llama_step_free(&x->step);
    }
}

// ---- fanning out over the ranks ----

enum { OP_EVAL, OP_EVAL_MORE, OP_EVAL_REFRESH, OP_PREFILL };

typedef struct rank_job {
    tri__level *lv;
    int op;
    const int32_t *tokens;
    int32_t n;
    bool all;
} rank_job;

static tri_status eval_one(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits);
static tri_status eval_more_one(tri__level *lv, const int32_t *tokens, int32_t n);
static tri_status eval_refresh_one(tri__level *lv, const int32_t *tokens, int32_t n);
static tri_status prefill_one(tri__level *lv, const int32_t *tokens, int32_t n);

static tri_status rank_run(void *ctx, int32_t r) {
    rank_job *j = ctx;
    tri__level *lv = tri__level_rank(j->lv, r);
    switch (j->op) {
    case OP_EVAL: return eval_one(lv, j->tokens, j->n, j->all);
    case OP_EVAL_MORE: return eval_more_one(lv, j->tokens, j->n);
    case OP_EVAL_REFRESH: return eval_refresh_one(lv, j->tokens, j->n);
    default: return prefill_one(lv, j->tokens, j->n);
    }
}

// Runs op on every rank at once (one device: here).
static tri_status fan_out(tri__level *lv, int op, const int32_t *tokens, int32_t n, bool all) {
    rank_job j = {lv, op, tokens, n, all};
    return lv->n_ranks > 1 ? tri__tp_run(lv->tp, rank_run, &j) : rank_run(&j, 0);
}

// Makes room for rows rows of logits, keeping those already there.
static tri_status ensure_rows(tri__level *lv, int32_t rows) {
    const int32_t V = lv->model->config.n_vocab;
    if (rows <= lv->logits_cap) return TRI_STATUS_OK;
    float *l = realloc(lv->logits, (size_t)rows * (size_t)V * sizeof *l);
    if (!l) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "level eval: logits for %d tokens", rows);
    lv->logits = l;
    lv->logits_cap = rows;
    return TRI_STATUS_OK;
}

// Runs tokens and writes their logits from row `row` on: one per token (all) or the last only
// (none when row < 0: a prefill).
static tri_status run(tri__level *lv, const int32_t *tokens, int32_t n, bool all, int32_t row) {
    const int64_t V = lv->model->config.n_vocab;
    double t0 = tri__now_seconds();
    // one call: the forward pass splits the tokens into steps itself (StreamingLLM past its window
    // one token per step, so the cache is what one-token steps build however the engine batched
    // its evals and prefills, docs/speculative.md "Caches and rollback"), and on a device queues
    // them back to back with one synchronize at the end
    tri__logits_mode mode = row < 0 ? TRI_LOGITS_NONE : all ? TRI_LOGITS_ALL : TRI_LOGITS_LAST;
    float *dst = mode == TRI_LOGITS_NONE ? NULL : lv->logits + (int64_t)row * V;
    int32_t len = tri__kv_policy_len(&lv->pol);
    // in a batch of engines (spec-batch.c) the pass joins the others', except a token tree's (a
    // batched pass takes none), a prefill that runs layer-major alone, and a recorded step: those
    // run here, while the engine holds the batch's turn
    const bool step = n == 1 && mode != TRI_LOGITS_NONE && lv->step.ll;
    const bool batched =
        lv->seat && !step && !lv->ll.tree && lv->n_ranks == 1 &&
        !(mode == TRI_LOGITS_NONE && n > lv->ll.n_batch && tri__llama_prefill_step(&lv->ll, &lv->pol) > lv->ll.n_batch);
    tri_status st = step      ? tri__llama_step_run(&lv->step, tokens[0], dst)  // the same cache and logits
                    : batched ? tri__batch_seat_run(lv->seat, lv, tokens, n, mode, dst)
                              : tri__llama_forward_policy(&lv->ll, &lv->pol, tokens, n, mode, dst);
    if (!st)  // n_evals counts those steps as passes
        for (int32_t done = 0; done < n; lv->n_evals++) {
            int32_t lim = tri__kv_policy_step_limit_at(&lv->pol, len + done);
            done += n - done < lim ? n - done : lim;
        }
    lv->seconds += tri__now_seconds() - t0;
    return st;
}

tri_status tri__level_eval(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits) {
    return fan_out(lv, OP_EVAL, tokens, n, all_logits);
}

static tri_status eval_one(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits) {
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level eval: %d tokens", n);
    TRY(ensure_rows(lv, all_logits ? n : 1));
    lv->n_logits = 0;
    TRY(run(lv, tokens, n, all_logits, 0));
    lv->n_logits = all_logits ? n : 1;
    return TRI_STATUS_OK;
}

tri_status tri__level_eval_tree(tri__level *lv, const int32_t *tokens, int32_t n, const tri__kv_tree *tree,
                                const int32_t *tree_pos) {
    if (lv->pol.p.kind != TRI_KV_POLICY_FULL || lv->pol.src)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "level eval: a token tree over a %s cache",
                         tri__kv_policy_name(lv->pol.p.kind));
    int32_t len = tri__level_n_past(lv);
    if (tree->n < 1 || tree->row0 < len || tree->row0 + tree->n != len + n)
        return tri__fail(TRI_STATUS_INTERNAL, "level eval: a tree of %d rows at %d is not the end of %d rows after %d",
                         tree->n, tree->row0, n, len);
    for (int32_t r = 0; r < lv->n_ranks; r++) {
        tri__level_rank(lv, r)->ll.tree = tree;
        tri__level_rank(lv, r)->ll.tree_pos = tree_pos;
    }
    tri_status st = tri__level_eval(lv, tokens, n, true);
    for (int32_t r = 0; r < lv->n_ranks; r++) {
        tri__level_rank(lv, r)->ll.tree = NULL;
        tri__level_rank(lv, r)->ll.tree_pos = NULL;
    }
    return st;
}

tri_status tri__level_move_row(tri__level *lv, int32_t from, int32_t to) {
    if (lv->pol.p.kind != TRI_KV_POLICY_FULL || lv->pol.src)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "level: moving rows of a %s cache",
                         tri__kv_policy_name(lv->pol.p.kind));
    if (from == to) return TRI_STATUS_OK;
    for (int32_t r = 0; r < lv->n_ranks; r++) {
        tri__kv_store *kv = tri__level_rank(lv, r)->pol.kv;
        if (from < 0 || to < 0 || from >= kv->n || to >= kv->n)
            return tri__fail(TRI_STATUS_INTERNAL, "level: move of row %d to %d, %d held", from, to, kv->n);
        int64_t bytes = tri__kv_store_row_bytes(kv);
        char *buf = malloc(2 * (size_t)bytes);
        if (!buf) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "level: a row of %lld bytes", (long long)bytes);
        tri_status st = TRI_STATUS_OK;
        // wherever the layer lives: backend memory, or an offloaded layer's host region (whose
        // stale device buffer load_rows drops)
        for (int32_t il = 0; !st && il < kv->n_layer; il++) {
            st = tri__kv_store_read_rows(kv, il, 0, from, 1, buf);
            if (!st) st = tri__kv_store_read_rows(kv, il, 1, from, 1, buf + bytes);
            if (!st) st = tri__kv_store_load_rows(kv, il, to, 1, buf, buf + bytes);
        }
        free(buf);
        TRY(st);
        TRY(tri__kv_policy_row_moved(&tri__level_rank(lv, r)->pol, from, to));  // kv_type mixed's f16 rows
    }
    return TRI_STATUS_OK;
}

tri_status tri__level_eval_more(tri__level *lv, const int32_t *tokens, int32_t n) {
    return fan_out(lv, OP_EVAL_MORE, tokens, n, true);
}

static tri_status eval_more_one(tri__level *lv, const int32_t *tokens, int32_t n) {
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level eval: %d tokens", n);
    TRY(ensure_rows(lv, lv->n_logits + n));
    int32_t row = lv->n_logits;
    lv->n_logits = 0;
    TRY(run(lv, tokens, n, true, row));
    lv->n_logits = row + n;
    return TRI_STATUS_OK;
}

// Drops the refresh records of selections the policy no longer has: rolled back, or (borrowing,
// where only the current one is kept) replaced, adopted over or failed.
static void refresh_sync(tri__level *lv) {
    int32_t at = tri__kv_policy_selected_at(&lv->pol);
    while (lv->n_refresh > 0 && (at < 0 || lv->refresh_at[lv->n_refresh - 1] > at)) lv->n_refresh--;
}

// Room for one more refresh record.
static tri_status refresh_reserve(tri__level *lv) {
    if (lv->n_refresh < lv->refresh_cap) return TRI_STATUS_OK;
    int32_t cap = lv->refresh_cap ? 2 * lv->refresh_cap : 16;
    int32_t *r = realloc(lv->refresh_at, (size_t)cap * sizeof *r);
    if (!r) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "level: %d refresh records", cap);
    lv->refresh_at = r;
    r = realloc(lv->refresh_from, (size_t)cap * sizeof *r);
    if (!r) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "level: %d refresh records", cap);
    lv->refresh_from = r;
    lv->refresh_cap = cap;
    return TRI_STATUS_OK;
}

tri_status tri__level_eval_refresh(tri__level *lv, const int32_t *tokens, int32_t n) {
    return fan_out(lv, OP_EVAL_REFRESH, tokens, n, false);
}

static tri_status eval_refresh_one(tri__level *lv, const int32_t *tokens, int32_t n) {
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level eval: %d tokens", n);
    if (lv->pol.p.kind != TRI_KV_POLICY_RETRIEVAL) return eval_one(lv, tokens, n, false);
    TRY(refresh_reserve(lv));
    TRY(ensure_rows(lv, 1));
    lv->n_logits = 0;
    if (n > 1) TRY(prefill_one(lv, tokens, n - 1));
    tri__kv_policy_request_refresh(&lv->pol);
    tri_status st = run(lv, tokens + n - 1, 1, false, 0);
    tri__kv_policy_cancel_refresh(&lv->pol);  // already consumed, unless the step failed
    refresh_sync(lv);  // a selection that failed over borrowed rows dropped the one before it
    TRY(st);
    lv->refresh_from[lv->n_refresh] = -1;
    lv->refresh_at[lv->n_refresh++] = tri__kv_policy_len(&lv->pol);
    lv->n_logits = 1;
    return TRI_STATUS_OK;
}

tri_status tri__level_select_during(tri__level *lv, tri__level *full, int32_t at) {
    if (lv->n_ranks != full->n_ranks)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: selection over %d ranks from a level of %d",
                         lv->n_ranks, full->n_ranks);
    for (int32_t r = 1; r < lv->n_ranks; r++) {  // each rank selects over its own KV heads
        tri__level *x = tri__level_rank(lv, r);
        TRY(refresh_reserve(x));
        TRY(tri__kv_policy_tap(&tri__level_rank(full, r)->pol, &x->pol, at));
        refresh_sync(x);
        x->refresh_from[x->n_refresh] = tri__level_n_past(tri__level_rank(full, r));
        x->n_logits = 0;
    }
    TRY(refresh_reserve(lv));
    TRY(tri__kv_policy_tap(&full->pol, &lv->pol, at));
    refresh_sync(lv);  // the policy dropped its selection
    lv->refresh_from[lv->n_refresh] = tri__level_n_past(full);  // the pass starts there
    lv->n_logits = 0;
    return TRI_STATUS_OK;
}

bool tri__level_took_selection(tri__level *lv) {
    for (int32_t r = 1; r < lv->n_ranks; r++) {
        tri__level *x = tri__level_rank(lv, r);
        tri__kv_policy_untap(&x->pol);
        int32_t at = tri__kv_policy_selected_at(&x->pol);
        if (at >= 0) x->refresh_at[x->n_refresh++] = at;
    }
    tri__kv_policy_untap(&lv->pol);  // a pass that did not reach it: the full level is disarmed
    int32_t at = tri__kv_policy_selected_at(&lv->pol);
    if (at < 0) return false;
    lv->refresh_at[lv->n_refresh++] = at;  // room reserved when armed
    return true;
}

tri_status tri__level_prefill(tri__level *lv, const int32_t *tokens, int32_t n) {
    return fan_out(lv, OP_PREFILL, tokens, n, false);
}

static tri_status prefill_one(tri__level *lv, const int32_t *tokens, int32_t n) {
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level prefill: %d tokens", n);
    if (n == 0) return TRI_STATUS_OK;
    lv->n_logits = 0;
    return run(lv, tokens, n, false, -1);
}

tri_status tri__level_adopt(tri__level *lv, tri__level *from, int32_t n) {
    if (lv->model != from->model || lv->n_ranks != from->n_ranks)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "level adopt: another model's cache");
    for (int32_t r = lv->n_ranks - 1; r >= 0; r--) {  // rank 0 last: its status is the answer
        tri__level *x = tri__level_rank(lv, r);
        double t0 = tri__now_seconds();
        x->n_logits = 0;
        tri_status st = tri__kv_policy_adopt(&x->pol, tri__level_rank(from, r)->pol.kv, n);
        refresh_sync(x);  // borrowing: adopting drops the selection
        if (!st) x->adopted = n;
        x->seconds += tri__now_seconds() - t0;
        if (st || r == 0) return st;
    }
    return TRI_STATUS_OK;
}

const float *tri__level_logits(const tri__level *lv, int32_t i) {
    if (i < 0 || i >= lv->n_logits) return NULL;
    return lv->logits + (int64_t)i * lv->model->config.n_vocab;
}

static tri_status truncate_one(tri__level *lv, int32_t n_past);

tri_status tri__level_truncate(tri__level *lv, int32_t n_past) {
    for (int32_t r = lv->n_ranks - 1; r >= 1; r--) TRY(truncate_one(tri__level_rank(lv, r), n_past));
    return truncate_one(lv, n_past);
}

static tri_status truncate_one(tri__level *lv, int32_t n_past) {
    int32_t len = tri__kv_policy_len(&lv->pol);
    if (n_past < 0 || n_past > len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level truncate: %d outside [0, %d]", n_past, len);
    if (n_past == len) return TRI_STATUS_OK;
    lv->n_logits = 0;
    tri_status st = tri__kv_policy_truncate(&lv->pol, n_past);
    // past what its store keeps: a draft level starts again, and so does a full cache of kv_type
    // mixed rolled back past its f16 ring (deeper than a round: a new prompt's common prefix)
    if (st && (lv->pol.ring_rows || lv->pol.mixed)) {
        tri__kv_policy_reset(&lv->pol);
        st = TRI_STATUS_OK;
    }
    TRY(st);
    // a rollback to the start of a selecting step would re-arm its request: the level selects
    // only when told to
    tri__kv_policy_cancel_refresh(&lv->pol);
    refresh_sync(lv);
    if (lv->adopted > tri__kv_policy_len(&lv->pol)) lv->adopted = tri__kv_policy_len(&lv->pol);
    return TRI_STATUS_OK;
}

int32_t tri__level_n_past(const tri__level *lv) { return tri__kv_policy_len(&lv->pol); }
int32_t tri__level_n_ctx(const tri__level *lv) { return tri__kv_policy_capacity(&lv->pol); }
int32_t tri__level_room(const tri__level *lv) { return tri__kv_policy_room(&lv->pol); }
int32_t tri__level_last_refresh(const tri__level *lv) {
    return lv->n_refresh > 0 ? lv->refresh_at[lv->n_refresh - 1] : -1;
}

// ---- layer-skipping self-draft ----

tri_status tri__model_layer_view(const tri_model *base, const int32_t *layers, int32_t n_layers,
                                 tri_model **out) {
    *out = NULL;
    const int32_t n_base = base->config.n_layer;
    if (!layers || n_layers <= 0 || n_layers > n_base)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "self-draft: %d layers listed, the model has %d",
                         n_layers, n_base);
    for (int32_t i = 0; i < n_layers; i++) {
        if (layers[i] < 0 || layers[i] >= n_base)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "self-draft: layer %d outside [0, %d)", layers[i],
                             n_base);
        if (i > 0 && layers[i] <= layers[i - 1])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "self-draft: layers must be strictly increasing (%d after %d)", layers[i],
                             layers[i - 1]);
    }
    if (base->stream)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "self-draft: the target streams its weights; a layer view of "
                         "streamed layers is not supported (keep them resident)");
    tri_model *v = malloc(sizeof *v);
    tri__layer *sel = malloc((size_t)n_layers * sizeof *sel);
    if (!v || !sel) {
        free(v);
        free(sel);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "self-draft: model view");
    }
    *v = *base;  // shares tensors, mapping, tokenizer: everything but the layer list is borrowed
    for (int32_t i = 0; i < n_layers; i++) sel[i] = base->layers[layers[i]];
    v->layers = sel;
    v->config.n_layer = n_layers;
    v->info.config.n_layer = n_layers;
    *out = v;
    return TRI_STATUS_OK;
}

void tri__model_view_free(tri_model *view) {
    if (!view) return;
    free(view->layers);
    free(view);
}
