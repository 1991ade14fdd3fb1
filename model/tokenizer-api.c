// tokenizer-api.c - the public tokenizer functions of triforce.h over model->tokenizer.
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "model.h"
#include "tokenizer.h"

struct tri_detokenizer {
    tri__detok d;
};

static tri_status no_tokenizer(const tri_model *model) {
    if (!model) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tokenizer: model is NULL");
    return tri__fail(TRI_STATUS_NOT_FOUND, "%s: the model has no tokenizer",
                     model->path ? model->path : "model");
}

int32_t tri_token_count(const tri_model *model) {
    return model && model->tokenizer ? tri__tokenizer_n_vocab(model->tokenizer) : 0;
}

int32_t tri_token_bos(const tri_model *model) {
    return model && model->tokenizer ? tri__tokenizer_bos(model->tokenizer) : -1;
}

int32_t tri_token_eos(const tri_model *model) {
    return model && model->tokenizer ? tri__tokenizer_eos(model->tokenizer) : -1;
}

bool tri_token_is_special(const tri_model *model, int32_t id) {
    if (!model || !model->tokenizer) return false;
    size_t len;
    bool special = false;
    return tri__tokenizer_piece(model->tokenizer, id, &len, &special) && special;
}

tri_status tri_token_text(const tri_model *model, int32_t id, const char **text, size_t *len) {
    if (!model || !model->tokenizer) return no_tokenizer(model);
    if (!text || !len) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_token_text: NULL output");
    const char *s = tri__tokenizer_text(model->tokenizer, id, len);
    if (!s)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_token_text: id %d out of range [0, %d)",
                         id, tri__tokenizer_n_vocab(model->tokenizer));
    *text = s;
    return TRI_STATUS_OK;
}

tri_status tri_token_piece(const tri_model *model, int32_t id, const char **text, size_t *len) {
    if (!model || !model->tokenizer) return no_tokenizer(model);
    if (!text || !len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_token_piece: NULL output");
    const char *s = tri__tokenizer_piece(model->tokenizer, id, len, NULL);
    if (!s)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_token_piece: id %d out of range [0, %d)",
                         id, tri__tokenizer_n_vocab(model->tokenizer));
    *text = s;
    return TRI_STATUS_OK;
}

tri_status tri_tokenize(const tri_model *model, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *ids, int64_t cap, int64_t *n_out) {
    if (n_out) *n_out = 0;
    if (!model || !model->tokenizer) return no_tokenizer(model);
    if (!n_out || cap < 0 || (cap > 0 && !ids))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_tokenize: bad output buffer");
    int32_t *out;
    int64_t n;
    tri_status st = tri__tokenizer_encode(model->tokenizer, text, len, add_special, parse_special,
                                          &out, &n);
    if (st) return st;
    *n_out = n;
    if (cap > 0 && n > cap) {
        free(out);
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "tri_tokenize: room for %lld ids, %lld needed", (long long)cap,
                         (long long)n);
    }
    if (cap > 0 && n > 0) memcpy(ids, out, (size_t)n * sizeof *ids);
    free(out);
    return TRI_STATUS_OK;
}

tri_status tri_detokenize(const tri_model *model, const int32_t *ids, int64_t n,
                          bool render_special, char *buf, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!model || !model->tokenizer) return no_tokenizer(model);
    if (!n_out || (cap > 0 && !buf))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_detokenize: bad output buffer");
    char *out;
    size_t len;
    tri_status st = tri__tokenizer_decode(model->tokenizer, ids, n, render_special, &out, &len);
    if (st) return st;
    *n_out = len;
    if (cap > 0 && len >= cap) {
        free(out);
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "tri_detokenize: room for %zu bytes, %zu and a NUL needed", cap, len);
    }
    if (cap > 0) memcpy(buf, out, len + 1);
    free(out);
    return TRI_STATUS_OK;
}

tri_status tri_detokenizer_create(const tri_model *model, bool render_special,
                                  tri_detokenizer **out) {
    if (!out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_detokenizer_create: out is NULL");
    *out = NULL;
    if (!model || !model->tokenizer) return no_tokenizer(model);
    tri_detokenizer *d = malloc(sizeof *d);
    if (!d) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tri_detokenizer_create: out of memory");
    tri__detok_init(&d->d, model->tokenizer, render_special);
    *out = d;
    return TRI_STATUS_OK;
}

tri_status tri_detokenizer_push(tri_detokenizer *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_detokenizer_push: NULL argument");
    return tri__detok_push(&d->d, id, text, len);
}

tri_status tri_detokenizer_flush(tri_detokenizer *d, const char **text, size_t *len) {
    if (!d || !text || !len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_detokenizer_flush: NULL argument");
    tri_status st = tri__detok_flush(&d->d, text, len);
    d->d.started = false;
    return st;
}

void tri_detokenizer_free(tri_detokenizer *d) {
    if (!d) return;
    tri__detok_free(&d->d);
    free(d);
}
