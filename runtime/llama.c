// llama.c - embedding, transformer blocks, output head; prefill in chunks of n_batch tokens.
#include "llama.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

#define TRY(call)                              \
    do {                                       \
        tri_status st_ = (call);               \
        if (st_ != TRI_STATUS_OK) return st_;  \
    } while (0)

void tri__llama_free(tri__llama *ll) {
    if (ll->be) {
        float **bufs[] = {&ll->x, &ll->xb, &ll->q, &ll->k, &ll->v, &ll->att, &ll->proj,
                          &ll->gate, &ll->up, &ll->logits};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ll->be->ops->free(ll->be, *bufs[i]);
    }
    free(ll->pos);
    tri__rope_free(&ll->rope);
    memset(ll, 0, sizeof *ll);
}

tri_status tri__llama_init(tri__llama *ll, const tri_model *model, tri__backend *be, int32_t n_batch) {
    memset(ll, 0, sizeof *ll);
    const tri_model_config *c = &model->config;
    if (n_batch <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "batch size %d must be positive", n_batch);
    ll->model = model;
    ll->be = be;
    ll->n_batch = n_batch;
    const float *freq_div = model->rope_freqs ? (const float *)model->rope_freqs->data : NULL;
    tri_status st = tri__rope_init(&ll->rope, c, freq_div);
    if (st) {
        memset(ll, 0, sizeof *ll);
        return st;
    }
    int64_t nb = n_batch;
    int64_t q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    struct {
        float **buf;
        int64_t elems;
    } bufs[] = {
        {&ll->x, nb * c->n_embd},   {&ll->xb, nb * c->n_embd}, {&ll->q, nb * q_dim},
        {&ll->k, nb * kv_dim},      {&ll->v, nb * kv_dim},     {&ll->att, nb * q_dim},
        {&ll->proj, nb * c->n_embd}, {&ll->gate, nb * c->n_ff}, {&ll->up, nb * c->n_ff},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if ((st = be->ops->alloc(be, (size_t)bufs[i].elems * sizeof(float), (void **)bufs[i].buf)))
            goto fail;
    ll->pos = malloc((size_t)nb * sizeof *ll->pos);
    if (!ll->pos) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "forward pass: positions");
        goto fail;
    }
    return TRI_STATUS_OK;

fail:
    tri__llama_free(ll);
    return st;
}

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

// One transformer block over the n tokens in ll->x at positions ll->pos.
static tri_status block(tri__llama *ll, tri__kv_store *kv, int32_t il, int32_t n) {
    const tri_model_config *c = &ll->model->config;
    const tri__layer *L = &ll->model->layers[il];
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    int64_t E = c->n_embd, hd = c->head_dim;
    int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd;
    int32_t pos0 = ll->pos[0];

    // attention
    TRY(op->rmsnorm(be, ll->xb, ll->x, L->attn_norm->data, L->attn_norm->type, n, E, c->rms_eps));
    TRY(op->matmul(be, ll->q, ll->xb, L->wq->data, L->wq->type, n, q_dim, E));
    TRY(op->matmul(be, ll->k, ll->xb, L->wk->data, L->wk->type, n, kv_dim, E));
    TRY(op->matmul(be, ll->v, ll->xb, L->wv->data, L->wv->type, n, kv_dim, E));
    TRY(op->rope(be, ll->q, n, c->n_head, ll->pos, &ll->rope));
    TRY(op->rope(be, ll->k, n, c->n_head_kv, ll->pos, &ll->rope));
    TRY(tri__kv_store_write(kv, il, pos0, n, ll->k, ll->v));
    tri__kv_view view;
    tri__kv_store_view(kv, il, pos0 + n, &view);
    TRY(op->attention(be, ll->att, ll->q, ll->pos, n, c->n_head, hd, &view, NULL));
    TRY(op->matmul(be, ll->proj, ll->att, L->wo->data, L->wo->type, n, E, q_dim));
    TRY(op->add(be, ll->x, ll->x, ll->proj, n * E));

    // feed-forward
    TRY(op->rmsnorm(be, ll->xb, ll->x, L->ffn_norm->data, L->ffn_norm->type, n, E, c->rms_eps));
    TRY(op->matmul(be, ll->gate, ll->xb, L->w_gate->data, L->w_gate->type, n, c->n_ff, E));
    TRY(op->matmul(be, ll->up, ll->xb, L->w_up->data, L->w_up->type, n, c->n_ff, E));
    TRY(op->swiglu(be, ll->gate, ll->gate, ll->up, n * c->n_ff));
    TRY(op->matmul(be, ll->proj, ll->gate, L->w_down->data, L->w_down->type, n, E, c->n_ff));
    TRY(op->add(be, ll->x, ll->x, ll->proj, n * E));
    return TRI_STATUS_OK;
}

static tri_status forward_chunks(tri__llama *ll, tri__kv_store *kv, const int32_t *tokens, int32_t n,
                                 tri__logits_mode mode, float *logits);

tri_status tri__llama_forward(tri__llama *ll, tri__kv_store *kv, const int32_t *tokens, int32_t n,
                              tri__logits_mode mode, float *logits) {
    if (n <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "forward pass: %d tokens", n);
    if (kv->n > kv->capacity - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "context full: %d tokens in the cache + %d new > capacity %d", kv->n, n,
                         kv->capacity);
    int32_t n0 = kv->n;
    tri_status st = forward_chunks(ll, kv, tokens, n, mode, logits);
    if (!st) st = ll->be->ops->synchronize(ll->be);
    if (st) kv->n = n0;  // a failed pass leaves the cache as it was
    return st;
}

static tri_status forward_chunks(tri__llama *ll, tri__kv_store *kv, const int32_t *tokens, int32_t n,
                                 tri__logits_mode mode, float *logits) {
    const tri_model *m = ll->model;
    const tri_model_config *c = &m->config;
    const tri__backend_ops *op = ll->be->ops;
    tri__backend *be = ll->be;
    const int32_t n0 = kv->n;
    const int64_t E = c->n_embd, V = c->n_vocab;

    for (int32_t done = 0; done < n; done += ll->n_batch) {
        int32_t nb = n - done < ll->n_batch ? n - done : ll->n_batch;
        int32_t pos0 = n0 + done;
        for (int32_t i = 0; i < nb; i++) ll->pos[i] = pos0 + i;
        tri__rope_update(&ll->rope, (int64_t)pos0 + nb);

        TRY(op->get_rows(be, ll->x, m->tok_embd->data, m->tok_embd->type, V, E, tokens + done, nb));
        for (int32_t il = 0; il < c->n_layer; il++) {
            tri_status st = block(ll, kv, il, nb);
            if (st) return st;
        }
        // positions up to pos0 + nb are now in every layer; commit them so the next chunk's
        // attention sees them
        kv->n = pos0 + nb;

        bool last_chunk = done + nb == n;
        if (mode == TRI_LOGITS_NONE || (mode == TRI_LOGITS_LAST && !last_chunk)) continue;
        // only the rows we need go through the output norm and head
        const float *rows = ll->x;
        int32_t n_rows = nb;
        if (mode == TRI_LOGITS_LAST) {
            rows = ll->x + (int64_t)(nb - 1) * E;
            n_rows = 1;
        }
        TRY(ensure_logits(ll, n_rows));
        TRY(op->rmsnorm(be, ll->xb, rows, m->output_norm->data, m->output_norm->type, n_rows, E,
                        c->rms_eps));
        TRY(op->matmul(be, ll->logits, ll->xb, m->output->data, m->output->type, n_rows, V, E));
        float *dst = mode == TRI_LOGITS_ALL ? logits + (int64_t)done * V : logits;
        TRY(op->copy_to_host(be, dst, ll->logits, (size_t)n_rows * (size_t)V * sizeof(float)));
    }
    return TRI_STATUS_OK;
}
