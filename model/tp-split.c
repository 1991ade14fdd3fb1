// tp-split.c - the split of a model by KV head and FFN rows, and the shard models (see
// tp-split.h).
#include "tp-split.h"

#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"

// ---- the split ----

tri_status tri__tp_split_plan(const tri_model_config *c, int32_t n, tri__tp_split *out) {
    memset(out, 0, sizeof *out);
    if (n < 1 || n > TRI_TP_MAX)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: %d devices, want 1 .. %d", n, TRI_TP_MAX);
    if (n > c->n_head_kv)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "tensor parallel: %d devices but the model has %d KV heads (%d query heads): each device "
                         "needs at least one KV head",
                         n, c->n_head_kv, c->n_head);
    if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: %d query heads over %d KV heads", c->n_head,
                         c->n_head_kv);
    const int64_t align = c->n_ff % 256 == 0 ? 256 : c->n_ff % 32 == 0 ? 32 : 1;
    const int64_t units = c->n_ff / align;
    if (units < n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "tensor parallel: %d devices but the FFN's %d rows make only %lld blocks of %lld", n, c->n_ff,
                         (long long)units, (long long)align);
    out->n = n;
    for (int32_t r = 0; r < n; r++) out->kv0[r + 1] = out->kv0[r] + c->n_head_kv / n + (r < c->n_head_kv % n ? 1 : 0);
    // weight elements per layer: a KV head with its query heads (wq, wk, wv, wo), an FFN row (gate,
    // up, down); every rank aims at the mean
    const int64_t g = c->n_head / c->n_head_kv, hd = c->head_dim, E = c->n_embd;
    const double per_head = (double)(2 * g * hd * E + 2 * hd * E), per_row = 3.0 * (double)E;
    const double mean = ((double)c->n_head_kv * per_head + (double)c->n_ff * per_row) / n;
    int64_t left = units;
    for (int32_t r = 0; r < n; r++) {
        int64_t u = left;
        if (r < n - 1) {
            double want = (mean - (out->kv0[r + 1] - out->kv0[r]) * per_head) / (per_row * (double)align);
            u = want < 1 ? 1 : (int64_t)(want + 0.5);
            if (u > left - (n - 1 - r)) u = left - (n - 1 - r);  // one block at least for each rank after
        }
        out->ff0[r + 1] = out->ff0[r] + (int32_t)(u * align);
        left -= u;
    }
    return TRI_STATUS_OK;
}

// ---- shard models ----

typedef struct shard_model {
    tri_model m;  // first: the shard is freed through it
    tri__tensor *tensors;
    tri__layer *layers;
    void *packed;  // the column slices
} shard_model;

// Rows [r0, r1) of t into *dst (a copy of t's entry).
static tri_status slice_rows(tri__tensor *dst, const tri__tensor *t, int64_t r0, int64_t r1) {
    int64_t rb = tri__dtype_row_bytes(t->type, t->shape[1]);
    if (t->n_dims != 2 || rb < 0 || r1 > t->shape[0])
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: tensor '%s' is not a matrix of %lld rows",
                         t->name, (long long)r1);
    dst->shape[0] = r1 - r0;
    dst->data = (const char *)t->data + r0 * rb;
    dst->n_bytes = (uint64_t)((r1 - r0) * rb);
    dst->offset = t->offset + (uint64_t)(r0 * rb);
    return TRI_STATUS_OK;
}

// Elements [r0, r1) of the vector t (a q, k or v bias: f32) into *dst, in place.
static tri_status slice_vec(tri__tensor *dst, const tri__tensor *t, int64_t r0, int64_t r1) {
    if (t->n_dims != 1 || t->type != TRI_DTYPE_F32 || r1 > t->shape[0])
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: tensor '%s' is not an f32 vector of %lld",
                         t->name, (long long)r1);
    dst->shape[0] = r1 - r0;
    dst->data = (const char *)t->data + r0 * 4;
    dst->n_bytes = (uint64_t)((r1 - r0) * 4);
    if (t->offset != UINT64_MAX) dst->offset = t->offset + (uint64_t)(r0 * 4);
    return TRI_STATUS_OK;
}

// Columns [c0, c1) of t packed at *cursor (advanced) into *dst; with cursor NULL only the bytes
// are added to *bytes.
static tri_status slice_cols(tri__tensor *dst, const tri__tensor *t, int64_t c0, int64_t c1, char **cursor,
                             uint64_t *bytes) {
    int64_t rb = tri__dtype_row_bytes(t->type, t->shape[1]);
    int64_t b0 = tri__dtype_row_bytes(t->type, c0), b1 = tri__dtype_row_bytes(t->type, c1);
    if (t->n_dims != 2 || rb < 0 || c1 > t->shape[1])
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: tensor '%s' is not a matrix of %lld columns",
                         t->name, (long long)c1);
    if (b0 < 0 || b1 < 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "tensor parallel: tensor '%s' (%s) splits at columns %lld and %lld, inside its blocks of %lld",
                         t->name, tri_dtype_name(t->type), (long long)c0, (long long)c1,
                         (long long)tri__dtype_block_elems(t->type));
    uint64_t n = (uint64_t)(t->shape[0] * (b1 - b0));
    if (!cursor) {
        *bytes += (n + 63) / 64 * 64;
        return TRI_STATUS_OK;
    }
    for (int64_t r = 0; r < t->shape[0]; r++)
        memcpy(*cursor + r * (b1 - b0), (const char *)t->data + r * rb + b0, (size_t)(b1 - b0));
    dst->shape[1] = c1 - c0;
    dst->data = *cursor;
    dst->n_bytes = n;
    dst->offset = UINT64_MAX;  // a packed copy: no longer a range of the file
    *cursor += (n + 63) / 64 * 64;
    return TRI_STATUS_OK;
}

void tri__tp_shard_free(tri_model *shard) {
    if (!shard) return;
    shard_model *s = (shard_model *)shard;
    free(s->tensors);
    free(s->layers);
    free(s->packed);
    free(s);
}

// The column slices of every layer: sizes them (cursor NULL) or packs them.
static tri_status shard_cols(shard_model *s, const tri_model *base, const tri__tp_split *sp, int32_t rank,
                             char **cursor, uint64_t *bytes) {
    const tri_model_config *c = &base->config;
    const int64_t qh = (int64_t)(c->n_head / c->n_head_kv) * c->head_dim;  // query columns per KV head
    for (int32_t il = 0; il < c->n_layer; il++) {
        const tri__layer *a = &base->layers[il];
        tri__tensor *wo = &s->tensors[a->wo - base->tensors], *dn = &s->tensors[a->w_down - base->tensors];
        tri_status st = slice_cols(wo, a->wo, sp->kv0[rank] * qh, sp->kv0[rank + 1] * qh, cursor, bytes);
        if (!st) st = slice_cols(dn, a->w_down, sp->ff0[rank], sp->ff0[rank + 1], cursor, bytes);
        if (st) return st;
    }
    return TRI_STATUS_OK;
}

tri_status tri__tp_shard_model(const tri_model *base, const tri__tp_split *sp, int32_t rank, tri_model **out) {
    *out = NULL;
    const tri_model_config *c = &base->config;
    if (rank < 0 || rank >= sp->n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: rank %d of %d", rank, sp->n);
    shard_model *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: shard model");
    tri_status st = TRI_STATUS_OK;
    s->tensors = malloc((size_t)(base->n_tensors > 0 ? base->n_tensors : 1) * sizeof *s->tensors);
    s->layers = malloc((size_t)(c->n_layer > 0 ? c->n_layer : 1) * sizeof *s->layers);
    if (!s->tensors || !s->layers) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: shard model of %lld tensors",
                       (long long)base->n_tensors);
        goto fail;
    }
    memcpy(s->tensors, base->tensors, (size_t)base->n_tensors * sizeof *s->tensors);
    tri_model *m = &s->m;
    *m = *base;  // names, mapping, tokenizer: borrowed
    m->tensors = s->tensors;
    m->layers = s->layers;
    m->stream = NULL;
#define REMAP(t) ((t) ? &s->tensors[(t)-base->tensors] : NULL)
    m->tok_embd = REMAP(base->tok_embd);
    m->output_norm = REMAP(base->output_norm);
    m->output = REMAP(base->output);
    m->rope_freqs = REMAP(base->rope_freqs);
    const int64_t hd = c->head_dim, g = c->n_head / c->n_head_kv;
    const int64_t k0 = sp->kv0[rank], k1 = sp->kv0[rank + 1], f0 = sp->ff0[rank], f1 = sp->ff0[rank + 1];
    for (int32_t il = 0; il < c->n_layer; il++) {
        const tri__layer *a = &base->layers[il];
        tri__layer *b = &s->layers[il];
        *b = (tri__layer){.attn_norm = REMAP(a->attn_norm),
                          .wq = REMAP(a->wq),
                          .wk = REMAP(a->wk),
                          .wv = REMAP(a->wv),
                          .wo = REMAP(a->wo),
                          .ffn_norm = REMAP(a->ffn_norm),
                          .w_gate = REMAP(a->w_gate),
                          .w_up = REMAP(a->w_up),
                          .w_down = REMAP(a->w_down),
                          .bq = REMAP(a->bq),
                          .bk = REMAP(a->bk),
                          .bv = REMAP(a->bv),
                          .bo = REMAP(a->bo),  // whole: added once, after the ranks' sum
                          // per head: every rank's heads take them whole
                          .q_norm = REMAP(a->q_norm),
                          .k_norm = REMAP(a->k_norm),
                          .post_attn_norm = REMAP(a->post_attn_norm),  // of the ranks' sums: whole
                          .post_ffn_norm = REMAP(a->post_ffn_norm)};
        if ((b->bq && (st = slice_vec((tri__tensor *)b->bq, a->bq, k0 * g * hd, k1 * g * hd))) ||
            (b->bk && (st = slice_vec((tri__tensor *)b->bk, a->bk, k0 * hd, k1 * hd))) ||
            (b->bv && (st = slice_vec((tri__tensor *)b->bv, a->bv, k0 * hd, k1 * hd))))
            goto fail;
        if ((st = slice_rows((tri__tensor *)b->wq, a->wq, k0 * g * hd, k1 * g * hd)) ||
            (st = slice_rows((tri__tensor *)b->wk, a->wk, k0 * hd, k1 * hd)) ||
            (st = slice_rows((tri__tensor *)b->wv, a->wv, k0 * hd, k1 * hd)) ||
            (st = slice_rows((tri__tensor *)b->w_gate, a->w_gate, f0, f1)) ||
            (st = slice_rows((tri__tensor *)b->w_up, a->w_up, f0, f1)))
            goto fail;
    }
#undef REMAP
    uint64_t bytes = 0;
    if ((st = shard_cols(s, base, sp, rank, NULL, &bytes))) goto fail;
    if (bytes && posix_memalign(&s->packed, 64, (size_t)bytes)) {
        s->packed = NULL;
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: %.1f MiB of column slices for rank %d",
                       (double)bytes / (1 << 20), rank);
        goto fail;
    }
    char *cursor = s->packed;
    if ((st = shard_cols(s, base, sp, rank, &cursor, &bytes))) goto fail;
    m->config.n_head = (int32_t)((k1 - k0) * g);
    m->config.n_head_kv = (int32_t)(k1 - k0);
    m->config.n_ff = (int32_t)(f1 - f0);
    m->info.config = m->config;
    *out = m;
    return TRI_STATUS_OK;

fail:
    tri__tp_shard_free(&s->m);
    return st;
}
