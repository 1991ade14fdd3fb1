// level.c - the level adapter over tri__llama and the full KV store.
#include "level.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "model.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tri__level_free(tri__level *lv) {
    if (lv->be) {
        tri__kv_store_free(&lv->kv);
        tri__llama_free(&lv->ll);
    }
    free(lv->logits);
    memset(lv, 0, sizeof *lv);
}

tri_status tri__level_init(tri__level *lv, const tri_model *model, tri__backend *be,
                           const tri__level_params *params) {
    memset(lv, 0, sizeof *lv);
    const tri_model_config *c = &model->config;
    if (params->n_ctx <= 0 || params->n_batch <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: n_ctx %d and n_batch %d must be positive",
                         params->n_ctx, params->n_batch);
    if (params->policy == TRI_CACHE_POLICY_RETRIEVAL && (params->budget <= 0 || params->chunk <= 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level: retrieval budget %d and chunk %d must be positive",
                         params->budget, params->chunk);
    lv->model = model;
    lv->be = be;
    lv->params = *params;
    // Until the cache policies land every policy is the full cache (see level.h).
    tri_status st;
    if ((st = tri__llama_init(&lv->ll, model, be, params->n_batch))) goto fail;
    if ((st = tri__kv_store_init(&lv->kv, be, params->kv_type, c->n_layer, c->n_head_kv, c->head_dim,
                                 params->n_ctx)))
        goto fail;
    return TRI_STATUS_OK;

fail:
    tri__level_free(lv);
    return st;
}

tri_status tri__level_eval(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits) {
    const int32_t V = lv->model->config.n_vocab;
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level eval: %d tokens", n);
    int32_t rows = all_logits ? n : 1;
    if (rows > lv->logits_cap) {
        float *l = realloc(lv->logits, (size_t)rows * (size_t)V * sizeof *l);
        if (!l) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "level eval: logits for %d tokens", rows);
        lv->logits = l;
        lv->logits_cap = rows;
    }
    lv->n_logits = 0;
    double t0 = now_seconds();
    tri_status st = tri__llama_forward(&lv->ll, &lv->kv, tokens, n,
                                       all_logits ? TRI_LOGITS_ALL : TRI_LOGITS_LAST, lv->logits);
    lv->seconds += now_seconds() - t0;
    lv->n_evals++;
    if (st) return st;
    lv->n_logits = rows;
    return TRI_STATUS_OK;
}

tri_status tri__level_prefill(tri__level *lv, const int32_t *tokens, int32_t n) {
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level prefill: %d tokens", n);
    if (n == 0) return TRI_STATUS_OK;
    lv->n_logits = 0;
    double t0 = now_seconds();
    tri_status st = tri__llama_forward(&lv->ll, &lv->kv, tokens, n, TRI_LOGITS_NONE, NULL);
    lv->seconds += now_seconds() - t0;
    return st;
}

const float *tri__level_logits(const tri__level *lv, int32_t i) {
    if (i < 0 || i >= lv->n_logits) return NULL;
    return lv->logits + (int64_t)i * lv->model->config.n_vocab;
}

tri_status tri__level_truncate(tri__level *lv, int32_t n_past) {
    if (n_past < 0 || n_past > lv->kv.n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "level truncate: %d outside [0, %d]", n_past, lv->kv.n);
    if (n_past == lv->kv.n) return TRI_STATUS_OK;
    lv->n_logits = 0;
    return tri__kv_store_set_len(&lv->kv, n_past);
}

int32_t tri__level_n_past(const tri__level *lv) { return lv->kv.n; }
int32_t tri__level_n_ctx(const tri__level *lv) { return lv->kv.capacity; }

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
