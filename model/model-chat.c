// model-chat.c - the chat calls that take a model (tri_chat_model_format, tri_chat_apply,
// tri_chat_apply_json, tri_chat_stop_tokens): the model's own template, read from its GGUF or
// tokenizer_config.json, and run by text/chat.c (the Jinja interpreter, or a built-in format).
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "error.h"
#include "gguf.h"
#include "json-read.h"
#include "model.h"
#include "safetensors.h"

// ---- the model's template ----

typedef struct model_template {
    char *text;  // NUL-terminated; NULL when the model has none
    size_t len;
    char *bos;  // the texts bos_token and eos_token stand for; NULL: the model's BOS / EOS text
    char *eos;
    char where[4200];  // the file it came from, for messages
} model_template;

static void model_template_free(model_template *t) {
    free(t->text);
    free(t->bos);
    free(t->eos);
}

static tri_status model_template_read(const tri_model *model, model_template *out) {
    memset(out, 0, sizeof *out);
    if (model->gguf) {
        snprintf(out->where, sizeof out->where, "%s: key 'tokenizer.chat_template'", model->path);
        tri__gguf_str s;
        tri_status st = tri__gguf_get_str(model->gguf, "tokenizer.chat_template", &s);
        if (st == TRI_STATUS_NOT_FOUND) return TRI_STATUS_OK;
        if (st) return st;
        if (!(out->text = malloc(s.len + 1)))
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", model->path);
        memcpy(out->text, s.ptr, s.len);
        out->text[s.len] = 0;
        out->len = s.len;
        return TRI_STATUS_OK;
    }
    if (!model->st) return TRI_STATUS_OK;
    snprintf(out->where, sizeof out->where, "%s/tokenizer_config.json", tri__st_model_dir(model->st));
    struct stat sb;
    if (stat(out->where, &sb) != 0) return TRI_STATUS_OK;
    char *text = NULL;
    size_t len = 0;
    tri_status st = tri__json_read_file(out->where, TRI_JSON_MAX_BYTES, &text, &len);
    if (st) return st;
    st = tri__chat_from_tokenizer_config(out->where, text, len, &out->text, &out->bos, &out->eos);
    free(text);
    if (!st && out->text) out->len = strlen(out->text);
    return st;
}

static tri_status no_template(const tri_model *model, const model_template *t) {
    if (model->gguf) return tri__fail(TRI_STATUS_NOT_FOUND, "%s: the model carries no chat template", t->where);
    return tri__fail(TRI_STATUS_NOT_FOUND, "%s: no chat template (the file or its 'chat_template' is missing)",
                     t->where[0] ? t->where : "model");
}

tri_status tri_chat_model_format(const tri_model *model, tri_chat_format *out) {
    if (!model || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_model_format: NULL argument");
    model_template t;
    tri_status st = model_template_read(model, &t);
    if (!st && !t.text) st = no_template(model, &t);
    if (!st) st = tri__chat_format_of(t.where, t.text, t.len, out);
    model_template_free(&t);
    return st;
}

// The text of token id as the template's bos_token / eos_token: "" when the model has none.
static const char *token_text(const tri_model *model, int32_t id, char *buf, size_t cap) {
    const char *s;
    size_t n;
    buf[0] = 0;
    if (id >= 0 && tri_token_text(model, id, &s, &n) == TRI_STATUS_OK && n < cap) {
        memcpy(buf, s, n);
        buf[n] = 0;
    }
    return buf;
}

// tri_chat_apply over JSON messages (and tools, may be NULL).
static tri_status apply(const tri_model *model, tri_chat_format format, struct json_object *msgs,
                        struct json_object *tools, bool gen, char *buf, size_t cap, size_t *n_out) {
    model_template t;
    tri_status st = model_template_read(model, &t);
    if (!st && !t.text && (format == TRI_CHAT_FORMAT_AUTO || format == TRI_CHAT_FORMAT_JINJA))
        st = no_template(model, &t);
    if (!st) {
        char bos[256], eos[256];
        st = tri__chat_render_json(t.where[0] ? t.where : "model", t.text, t.len, format,
                                   t.bos ? t.bos : token_text(model, tri_token_bos(model), bos, sizeof bos),
                                   t.eos ? t.eos : token_text(model, tri_token_eos(model), eos, sizeof eos), msgs,
                                   tools, gen, buf, cap, n_out);
    }
    model_template_free(&t);
    return st;
}

tri_status tri_chat_apply(const tri_model *model, tri_chat_format format, const tri_chat_message *msgs, size_t n,
                          bool add_generation_prompt, char *buf, size_t cap, size_t *n_out) {
    if (!model || !n_out || !msgs || (!buf && cap))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_apply: NULL argument");
    *n_out = 0;
    if (n == 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: no messages");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: message %zu has a NULL role or content", i);
    struct json_object *arr = tri__chat_messages_json(msgs, n);
    if (!arr) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
    tri_status st = apply(model, format, arr, NULL, add_generation_prompt, buf, cap, n_out);
    json_object_put(arr);
    return st;
}

tri_status tri_chat_apply_json(const tri_model *model, tri_chat_format format, const char *messages_json,
                               const char *tools_json, bool add_generation_prompt, char *buf, size_t cap,
                               size_t *n_out) {
    if (!model || !n_out || !messages_json || (!buf && cap))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_apply_json: NULL argument");
    *n_out = 0;
    struct json_object *msgs = NULL, *tools = NULL;
    tri_status st = tri__chat_parse_array("messages", messages_json, true, &msgs);
    if (!st && tools_json) st = tri__chat_parse_array("tools", tools_json, false, &tools);
    if (!st) st = apply(model, format, msgs, tools, add_generation_prompt, buf, cap, n_out);
    json_object_put(msgs);
    json_object_put(tools);
    return st;
}

tri_status tri_chat_stop_tokens(const tri_model *model, int32_t *ids, int32_t cap, int32_t *n_out) {
    if (!model || !n_out || (!ids && cap > 0) || cap < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_stop_tokens: NULL argument");
    *n_out = 0;
    if (tri_token_count(model) == 0)
        return tri__fail(TRI_STATUS_NOT_FOUND, "%s: the model has no tokenizer", model->path ? model->path : "model");
    static const char *const ends[] = {"<|im_end|>", "<|eot_id|>",    "<|eom_id|>", "<end_of_turn>",
                                       "<|end|>",    "<|endoftext|>", "</s>",       "<|end_of_text|>"};
    int32_t found[1 + sizeof ends / sizeof ends[0]];
    int32_t n = 0;
    if (tri_token_eos(model) >= 0) found[n++] = tri_token_eos(model);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        int32_t id[64];  // more than any of them takes as plain text: no failure to log
        int64_t got = 0;
        if (tri_tokenize(model, ends[i], strlen(ends[i]), false, true, id, 64, &got) != TRI_STATUS_OK || got != 1 ||
            !tri_token_is_special(model, id[0]))
            continue;
        bool dup = false;
        for (int32_t k = 0; k < n; k++) dup |= found[k] == id[0];
        if (!dup) found[n++] = id[0];
    }
    for (int32_t k = 0; k < n && k < cap; k++) ids[k] = found[k];
    *n_out = n;
    return TRI_STATUS_OK;
}
