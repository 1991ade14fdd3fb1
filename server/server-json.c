// server-json.c - OpenAI's request and response bodies: parsing and checking a completion request
// (json-c), rendering a conversation with the model's chat template, tokenizing it; writing the
// responses, the streamed chunks and the errors. docs/server.md lists every field.
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

// ---- errors ----

bool srv_fail(srv_error *err, int status, const char *type, const char *code, const char *param, const char *fmt,
              ...) {
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

// An invalid_request_error (400) naming param.
#define BAD(err, param, ...) srv_fail(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

static char *take_json(json_object *o) {
    const char *s = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
                      : NULL;
    char *r = s ? strdup(s) : NULL;
    json_object_put(o);
    return r;
}

char *srv_error_json(const srv_error *err) {
    json_object *root = json_object_new_object(), *e = json_object_new_object();
    json_object_object_add(e, "message", json_object_new_string(err->message));
    json_object_object_add(e, "type", json_object_new_string(err->type ? err->type : "server_error"));
    json_object_object_add(e, "param", err->param[0] ? json_object_new_string(err->param) : NULL);
    json_object_object_add(e, "code", err->code ? json_object_new_string(err->code) : NULL);
    json_object_object_add(root, "error", e);
    return take_json(root);
}

// ---- sampling ----

bool srv_sampling_apply(const srv_sampling *req, const srv_sampling *dflt, tri_sampler_params *out,
                        bool *explicit_seed, srv_error *err) {
    srv_sampling s = *dflt;  // the server's defaults, then what the request gives
#define TAKE(f)                \
    if (req->has_##f) {        \
        s.has_##f = true;      \
        s.f = req->f;          \
    }
    TAKE(temperature)
    TAKE(top_p) TAKE(top_k) TAKE(min_p) TAKE(seed) TAKE(presence_penalty) TAKE(frequency_penalty) TAKE(repeat_penalty)
        TAKE(repeat_last_n)
#undef TAKE
            // the chat settings under everything (penalty_last_n among them), then each given field
            *out = tri_sampler_chat_params();
    if (s.has_temperature) out->temperature = (float)s.temperature;
    if (s.has_top_p) out->top_p = (float)s.top_p;
    if (s.has_top_k) out->top_k = (int32_t)s.top_k;
    if (s.has_min_p) out->min_p = (float)s.min_p;
    if (s.has_repeat_penalty) out->repeat_penalty = (float)s.repeat_penalty;
    if (s.has_presence_penalty) out->presence_penalty = (float)s.presence_penalty;
    if (s.has_frequency_penalty) out->frequency_penalty = (float)s.frequency_penalty;
    if (s.has_repeat_last_n && s.repeat_last_n == 0) {  // llama.cpp's 0: no penalties
        out->repeat_penalty = 1.0f;
        out->presence_penalty = out->frequency_penalty = 0.0f;
    } else if (s.has_repeat_last_n) {
        out->penalty_last_n = (int32_t)s.repeat_last_n;
    }
    *explicit_seed = s.has_seed;
    if (s.has_seed) out->seed = s.seed;
    if (tri_sampler_params_check(out) != TRI_STATUS_OK)
        return BAD(err, NULL, "the sampling settings are out of range: %s", tri_last_error());
    return true;
}

// ---- reading fields ----

static const char *type_name(json_object *v) {
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double:
    case json_type_int: return "a number";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "?";
}

static bool is_number(json_object *v) {
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

// A number in [lo, hi] (the bounds included when the flags say so).
static bool get_number(json_object *v, const char *name, double lo, bool lo_in, double hi, double *out,
                       srv_error *err) {
    if (!is_number(v)) return BAD(err, name, "'%s' must be a number, not %s", name, type_name(v));
    double x = json_object_get_double(v);
    if (!isfinite(x) || (lo_in ? x < lo : x <= lo) || x > hi)
        return BAD(err, name, "'%s' is %g: want a number in %s%g, %g]", name, x, lo_in ? "[" : "(", lo, hi);
    *out = x;
    return true;
}

// An integer in [lo, hi]; a number with no fraction (3.0, as some clients write every number) is
// that integer.
static bool get_int(json_object *v, const char *name, int64_t lo, int64_t hi, int64_t *out, srv_error *err) {
    int64_t x;
    if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18)
            return BAD(err, name, "'%s' is %g: want an integer", name, d);
        x = (int64_t)d;
    } else if (!json_object_is_type(v, json_type_int)) {
        return BAD(err, name, "'%s' must be an integer, not %s", name, type_name(v));
    } else {
        x = json_object_get_int64(v);
    }
    if (x < lo || x > hi) return BAD(err, name, "'%s' is %lld: want an integer in [%lld, %lld]", name, (long long)x,
                                     (long long)lo, (long long)hi);
    *out = x;
    return true;
}

static bool get_bool(json_object *v, const char *name, bool *out, srv_error *err) {
    if (!json_object_is_type(v, json_type_boolean))
        return BAD(err, name, "'%s' must be a boolean, not %s", name, type_name(v));
    *out = json_object_get_boolean(v);
    return true;
}

// "stop": a string or an array of strings, none empty.
static bool get_stop(json_object *v, srv_request *rq, srv_error *err) {
    if (json_object_is_type(v, json_type_null)) return true;
    bool one = json_object_is_type(v, json_type_string);
    if (!one && !json_object_is_type(v, json_type_array))
        return BAD(err, "stop", "'stop' must be a string or an array of strings, not %s", type_name(v));
    size_t n = one ? 1 : json_object_array_length(v);
    if (n > SRV_MAX_STOP) return BAD(err, "stop", "'stop' has %zu strings: at most %d", n, SRV_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_object *s = one ? v : json_object_array_get_idx(v, i);
        if (!json_object_is_type(s, json_type_string))
            return BAD(err, "stop", "'stop' item %zu must be a string, not %s", i, type_name(s));
        if (json_object_get_string_len(s) == 0) return BAD(err, "stop", "'stop' item %zu is an empty string", i);
        if (!(rq->stop[rq->n_stop] = strdup(json_object_get_string(s))))
            return srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        rq->n_stop++;
    }
    return true;
}

// Fields a value of which we do not support: refused unless absent, null or the neutral value.
static bool refuse_unless(bool neutral, const char *name, const char *why, srv_error *err) {
    return neutral || BAD(err, name, "'%s' is not supported by this server: %s", name, why);
}

static bool is_null(json_object *v) { return json_object_is_type(v, json_type_null); }

static bool oom(srv_error *err) { return srv_fail(err, 500, "server_error", NULL, NULL, "out of memory"); }

// The text of a message's content: a string, null, or an array of {"type": "text", "text": ...}
// parts (concatenated). *out malloc'd.
static bool content_text(json_object *v, size_t i, char **out, srv_error *err) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (is_null(v)) return (*out = strdup("")) != NULL || oom(err);
    if (json_object_is_type(v, json_type_string)) return (*out = strdup(json_object_get_string(v))) != NULL || oom(err);
    if (!json_object_is_type(v, json_type_array))
        return BAD(err, param, "'%s' must be a string or an array of text parts, not %s", param, type_name(v));
    size_t total = 0, n = json_object_array_length(v);
    for (size_t k = 0; k < n; k++) {
        json_object *part = json_object_array_get_idx(v, k), *type, *text;
        if (!json_object_is_type(part, json_type_object) || !json_object_object_get_ex(part, "type", &type) ||
            !json_object_is_type(type, json_type_string))
            return BAD(err, param, "'%s' item %zu must be an object with a 'type'", param, k);
        if (strcmp(json_object_get_string(type), "text") != 0)
            return BAD(err, param, "'%s' item %zu is of type '%s': only text parts are supported", param, k,
                       json_object_get_string(type));
        if (!json_object_object_get_ex(part, "text", &text) || !json_object_is_type(text, json_type_string))
            return BAD(err, param, "'%s' item %zu has no 'text' string", param, k);
        total += (size_t)json_object_get_string_len(text);
    }
    char *s = malloc(total + 1);
    if (!s) return srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
        json_object *text;
        json_object_object_get_ex(json_object_array_get_idx(v, k), "text", &text);
        size_t len = (size_t)json_object_get_string_len(text);
        memcpy(s + at, json_object_get_string(text), len);
        at += len;
    }
    s[at] = 0;
    *out = s;
    return true;
}

// Tokenizes text into rq->ids.
static bool tokenize(const srv_model_ref *m, const char *text, size_t len, bool add_special, bool parse_special,
                     srv_request *rq, const char *param, srv_error *err) {
    int64_t need = 0;
    if (tri_tokenize(m->model, text, len, add_special, parse_special, NULL, 0, &need))
        return BAD(err, param, "cannot tokenize the prompt: %s", tri_last_error());
    if (need > INT32_MAX / 2) return BAD(err, param, "the prompt is too long (%lld tokens)", (long long)need);
    rq->ids = malloc((size_t)(need > 0 ? need : 1) * sizeof *rq->ids);
    if (!rq->ids) return srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    int64_t got = 0;
    if (tri_tokenize(m->model, text, len, add_special, parse_special, rq->ids, need, &got))
        return BAD(err, param, "cannot tokenize the prompt: %s", tri_last_error());
    rq->n_ids = (int32_t)got;
    return true;
}

// "messages" rendered with the chat template and tokenized.
static bool parse_messages(const srv_model_ref *m, json_object *v, srv_request *rq, srv_error *err) {
    if (!json_object_is_type(v, json_type_array))
        return BAD(err, "messages", "'messages' must be an array of messages, not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (n == 0) return BAD(err, "messages", "'messages' is empty");
    if (!m->chat_ok) return BAD(err, "messages", "this model cannot chat: %s", m->chat_why);
    tri_chat_message *msgs = calloc(n, sizeof *msgs);
    char **texts = calloc(n, sizeof *texts);
    char *buf = NULL;
    bool ok = false;
    if (!msgs || !texts) {
        srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *msg = json_object_array_get_idx(v, i), *role, *content = NULL;
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_object_is_type(msg, json_type_object)) {
            BAD(err, param, "'%s' must be an object, not %s", param, type_name(msg));
            goto done;
        }
        if (!json_object_object_get_ex(msg, "role", &role) || !json_object_is_type(role, json_type_string)) {
            BAD(err, param, "'%s' has no 'role' string", param);
            goto done;
        }
        const char *r = json_object_get_string(role);
        if (strcmp(r, "developer") == 0) r = "system";  // OpenAI's newer name of the system role
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            BAD(err, param, "'%s' has role '%s': want system, developer, user or assistant (tools are not supported)",
                param, r);
            goto done;
        }
        json_object_object_foreach(msg, key, val) {
            if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
                !(strcmp(key, "tool_calls") == 0 && (is_null(val) || (json_object_is_type(val, json_type_array) &&
                                                                      json_object_array_length(val) == 0)))) {
                BAD(err, param, "'%s' has the field '%s', which is not supported", param, key);
                goto done;
            }
        }
        if (!json_object_object_get_ex(msg, "content", &content) && strcmp(r, "assistant") != 0) {
            BAD(err, param, "'%s' has no 'content'", param);
            goto done;
        }
        if (!content_text(content, i, &texts[i], err)) goto done;
        msgs[i].role = r;
        msgs[i].content = texts[i];
    }
    // a final assistant message is a prefill the answer continues (llama-server's, and HF's
    // continue_final_message): the conversation before it with the assistant's header, then its text
    bool prefill = strcmp(msgs[n - 1].role, "assistant") == 0;
    size_t n_render = prefill ? n - 1 : n, extra = prefill ? strlen(msgs[n - 1].content) : 0;
    if (n_render == 0) {
        BAD(err, "messages", "'messages' holds only an assistant message: there is nothing before it to continue from");
        goto done;
    }
    size_t need = 0, len = 0;
    tri_status st = tri_chat_apply(m->model, m->chat_format, msgs, n_render, true, NULL, 0, &need);
    if (!st && !(buf = malloc(need + extra + 1))) {
        srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    if (!st) st = tri_chat_apply(m->model, m->chat_format, msgs, n_render, true, buf, need + 1, &len);
    if (st) {
        BAD(err, "messages", "the model's chat template refuses the conversation: %s", tri_last_error());
        goto done;
    }
    if (prefill) {
        memcpy(buf + len, msgs[n - 1].content, extra + 1);
        len += extra;
    }
    // a rendered conversation carries its BOS and other special tokens as text
    ok = tokenize(m, buf, len, false, true, rq, "messages", err);
done:
    if (texts)
        for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    free(msgs);
    free(buf);
    return ok;
}

// "prompt" of /v1/completions: a string, an array of one string, or an array of token ids.
static bool parse_prompt(const srv_model_ref *m, json_object *v, srv_request *rq, srv_error *err) {
    if (json_object_is_type(v, json_type_string))
        return tokenize(m, json_object_get_string(v), (size_t)json_object_get_string_len(v), true, false, rq, "prompt",
                        err);
    if (!json_object_is_type(v, json_type_array))
        return BAD(err, "prompt", "'prompt' must be a string, an array of one string or an array of token ids, "
                   "not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (n == 0) return BAD(err, "prompt", "'prompt' is empty");
    json_object *first = json_object_array_get_idx(v, 0);
    if (json_object_is_type(first, json_type_string)) {
        if (n != 1) return BAD(err, "prompt", "'prompt' has %zu strings: one prompt per request is supported", n);
        return parse_prompt(m, first, rq, err);
    }
    int32_t n_vocab = tri_token_count(m->model);
    if (!(rq->ids = malloc(n * sizeof *rq->ids))) return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(v, i);
        if (json_object_is_type(t, json_type_array))
            return BAD(err, "prompt", "'prompt' holds several token arrays: one prompt per request is supported");
        int64_t id;
        char name[40];
        snprintf(name, sizeof name, "prompt[%zu]", i);
        if (!get_int(t, name, 0, n_vocab - 1, &id, err)) return false;
        rq->ids[i] = (int32_t)id;
    }
    rq->n_ids = (int32_t)n;
    return true;
}

// ---- llama.cpp's own fields ----

// Sampler fields of llama-server that this server does not implement: accepted at their neutral
// value (the sampler off), refused otherwise. True when key is one (*ok: the value is accepted).
static bool neutral_field(const char *key, json_object *v, srv_error *err, bool *ok) {
    static const struct {
        const char *name;
        double neutral;
    } fields[] = {{"typical_p", 1},      {"tfs_z", 1},           {"mirostat", 0}, {"dynatemp_range", 0},
                  {"dry_multiplier", 0}, {"xtc_probability", 0}, {"n_probs", 0}};
    for (size_t k = 0; k < sizeof fields / sizeof *fields; k++) {
        if (strcmp(key, fields[k].name) != 0) continue;
        *ok = is_null(v) || (is_number(v) && json_object_get_double(v) == fields[k].neutral) ||
              BAD(err, key, "'%s' is not supported by this server: only %g (off)", key, fields[k].neutral);
        return true;
    }
    if (strcmp(key, "grammar") == 0 || strcmp(key, "json_schema") == 0) {
        bool none = is_null(v) || (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0) ||
                    (json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0);
        *ok = none || BAD(err, key, "'%s' is not supported by this server yet: no constrained decoding", key);
        return true;
    }
    return false;
}

// llama-server's fields that change nothing here, accepted and ignored: n_keep (no context shift
// here: a prompt that does not fit is refused), penalize_nl (gone from llama.cpp too), id_slot (the
// server chooses), samplers (the order is fixed: penalties, temperature, top-k, top-p, min-p), the
// parameters of samplers that are off (mirostat_tau, mirostat_eta, dry_*, xtc_threshold,
// dynatemp_exponent), min_keep, t_max_predict_ms, timings_per_token, return_tokens,
// post_sampling_probs.
static bool ignored_field(const char *key) {
    static const char *const names[] = {"n_keep",
                                        "penalize_nl",
                                        "id_slot",
                                        "samplers",
                                        "mirostat_tau",
                                        "mirostat_eta",
                                        "dry_base",
                                        "dry_allowed_length",
                                        "dry_penalty_last_n",
                                        "dry_sequence_breakers",
                                        "xtc_threshold",
                                        "dynatemp_exponent",
                                        "min_keep",
                                        "t_max_predict_ms",
                                        "timings_per_token",
                                        "return_tokens",
                                        "post_sampling_probs"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (strcmp(key, names[k]) == 0) return true;
    return false;
}

// ---- a request ----

bool srv_parse_request(const srv_model_ref *m, bool chat, const char *body, size_t len, srv_request *rq,
                       srv_error *err) {
    memset(rq, 0, sizeof *rq);
    rq->chat = chat;
    if (len == 0) return BAD(err, NULL, "the request has no body: want a JSON object");
    json_tokener *tok = json_tokener_new();
    if (!tok) return srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = json_tokener_parse_ex(tok, body, (int)(len > INT32_MAX ? INT32_MAX : len));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        return BAD(err, NULL, "the body is not valid JSON: %s at byte %zu",
                   jerr == json_tokener_continue ? "unexpected end of the text" : json_tokener_error_desc(jerr), end);
    }
    while (end < len && (body[end] == ' ' || body[end] == '\n' || body[end] == '\r' || body[end] == '\t')) end++;
    bool ok = false;
    if (end < len) {
        BAD(err, NULL, "the body is not valid JSON: text after the object at byte %zu", end);
        goto done;
    }
    if (!json_object_is_type(root, json_type_object)) {
        BAD(err, NULL, "the body must be a JSON object, not %s", type_name(root));
        goto done;
    }
    const char *what = chat ? "messages" : "prompt";
    json_object *input = NULL;
    srv_sampling *sm = &rq->sampling;
    bool ok_neutral;
    json_object_object_foreach(root, key, v) {
        bool null = is_null(v);
        double d;
        int64_t i;
        if (strcmp(key, "model") == 0) {
            if (!json_object_is_type(v, json_type_string)) {
                BAD(err, "model", "'model' must be a string, not %s", type_name(v));
                goto done;
            }
            // any name: the one model answers (clients send their own default, "gpt-3.5-turbo")
        } else if (strcmp(key, what) == 0) {
            input = v;
        } else if (strcmp(key, "stream") == 0) {
            if (!null && !get_bool(v, key, &rq->stream, err)) goto done;
        } else if (strcmp(key, "ignore_eos") == 0) {
            if (!null && !get_bool(v, key, &rq->ignore_eos, err)) goto done;
        } else if (strcmp(key, "stream_options") == 0) {
            if (null) continue;
            json_object *u;
            if (!json_object_is_type(v, json_type_object)) {
                BAD(err, key, "'stream_options' must be an object, not %s", type_name(v));
                goto done;
            }
            if (json_object_object_get_ex(v, "include_usage", &u) && !is_null(u) &&
                !get_bool(u, "stream_options.include_usage", &rq->include_usage, err))
                goto done;
        } else if (strcmp(key, "max_tokens") == 0 || strcmp(key, "max_completion_tokens") == 0 ||
                   strcmp(key, "n_predict") == 0) {
            if (null) continue;
            if (!get_int(v, key, 1, INT32_MAX, &i, err)) goto done;
            rq->max_tokens = i;
        } else if (strcmp(key, "temperature") == 0) {
            if (null) continue;
            if (!get_number(v, key, 0, true, 2, &d, err)) goto done;
            sm->has_temperature = true, sm->temperature = d;
        } else if (strcmp(key, "top_p") == 0) {
            if (null) continue;
            if (!get_number(v, key, 0, false, 1, &d, err)) goto done;
            sm->has_top_p = true, sm->top_p = d;
        } else if (strcmp(key, "top_k") == 0) {
            if (null) continue;
            if (!get_int(v, key, 0, INT32_MAX, &i, err)) goto done;
            sm->has_top_k = true, sm->top_k = i;
        } else if (strcmp(key, "min_p") == 0) {
            if (null) continue;
            if (!get_number(v, key, 0, true, 1, &d, err)) goto done;
            sm->has_min_p = true, sm->min_p = d;
        } else if (strcmp(key, "presence_penalty") == 0 || strcmp(key, "frequency_penalty") == 0) {
            if (null) continue;
            if (!get_number(v, key, -2, true, 2, &d, err)) goto done;
            if (key[0] == 'p') sm->has_presence_penalty = true, sm->presence_penalty = d;
            else sm->has_frequency_penalty = true, sm->frequency_penalty = d;
        } else if (strcmp(key, "repeat_penalty") == 0) {
            if (null) continue;
            if (!get_number(v, key, 0, false, 10, &d, err)) goto done;
            sm->has_repeat_penalty = true, sm->repeat_penalty = d;
        } else if (strcmp(key, "seed") == 0) {
            if (null) continue;
            if (!get_int(v, key, INT64_MIN, INT64_MAX, &i, err)) goto done;
            sm->has_seed = true, sm->seed = (uint64_t)i;
        } else if (strcmp(key, "stop") == 0) {
            if (!get_stop(v, rq, err)) goto done;
        } else if (strcmp(key, "n") == 0 || strcmp(key, "best_of") == 0) {
            if (null) continue;
            if (!get_int(v, key, 1, INT32_MAX, &i, err)) goto done;
            if (!refuse_unless(i == 1, key, "one choice per request (1)", err)) goto done;
        } else if (strcmp(key, "logprobs") == 0 || strcmp(key, "echo") == 0) {
            bool b = false;
            if (!null && json_object_is_type(v, json_type_int)) b = json_object_get_int64(v) != 0;
            else if (!null && !get_bool(v, key, &b, err)) goto done;
            if (!refuse_unless(!b, key, "no log-probabilities or echo", err)) goto done;
        } else if (strcmp(key, "top_logprobs") == 0 || strcmp(key, "suffix") == 0 ||
                   strcmp(key, "functions") == 0 || strcmp(key, "function_call") == 0 ||
                   strcmp(key, "prediction") == 0 || strcmp(key, "audio") == 0 ||
                   strcmp(key, "modalities") == 0 || strcmp(key, "reasoning_effort") == 0) {
            if (!refuse_unless(null, key, "not implemented", err)) goto done;
        } else if (strcmp(key, "tools") == 0) {
            bool none = null || (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0);
            if (!refuse_unless(none, key, "no tool calls", err)) goto done;
        } else if (strcmp(key, "tool_choice") == 0) {
            bool none = null || (json_object_is_type(v, json_type_string) &&
                                 strcmp(json_object_get_string(v), "none") == 0);
            if (!refuse_unless(none, key, "no tool calls", err)) goto done;
        } else if (strcmp(key, "logit_bias") == 0) {
            bool none = null || (json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0);
            if (!refuse_unless(none, key, "no logit bias", err)) goto done;
        } else if (strcmp(key, "response_format") == 0) {
            json_object *t;
            bool text = null || (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "type", &t) &&
                                 json_object_is_type(t, json_type_string) &&
                                 strcmp(json_object_get_string(t), "text") == 0);
            if (!refuse_unless(text, key, "plain text only ({\"type\": \"text\"})", err)) goto done;
        } else if (strcmp(key, "repeat_last_n") == 0) {  // llama.cpp's
            if (null) continue;
            if (!get_int(v, key, -1, INT32_MAX, &i, err)) goto done;
            sm->has_repeat_last_n = true, sm->repeat_last_n = i;
        } else if (neutral_field(key, v, err, &ok_neutral)) {
            if (!ok_neutral) goto done;
        } else if (strcmp(key, "user") == 0 || strcmp(key, "metadata") == 0 || strcmp(key, "store") == 0 ||
                   strcmp(key, "service_tier") == 0 || strcmp(key, "parallel_tool_calls") == 0 ||
                   strcmp(key, "cache_prompt") == 0 || ignored_field(key)) {
            // accepted and ignored (every slot caches its conversation anyway; docs/server.md says
            // why each llama.cpp field may be)
        } else {
            BAD(err, key, "unrecognized request field '%s'", key);
            goto done;
        }
    }
    if (!input) {
        BAD(err, what, "missing required field '%s'", what);
        goto done;
    }
    if (!(chat ? parse_messages(m, input, rq, err) : parse_prompt(m, input, rq, err))) goto done;
    if (rq->n_ids == 0) {
        BAD(err, what, "the prompt is empty");
        goto done;
    }
    // at least one token must be generated after the prompt
    if (rq->n_ids >= m->n_ctx) {
        srv_fail(err, 400, "invalid_request_error", "context_length_exceeded", what,
                 "the prompt is %d tokens, and this server's context is %d tokens (--ctx): it must leave room for "
                 "at least one generated token",
                 rq->n_ids, m->n_ctx);
        goto done;
    }
    ok = true;
done:
    json_object_put(root);
    return ok;
}

void srv_request_free(srv_request *rq) {
    free(rq->ids);
    for (int32_t i = 0; i < rq->n_stop; i++) free(rq->stop[i]);
    memset(rq, 0, sizeof *rq);
}

// ---- responses ----

static json_object *usage_json(const srv_result *r) {
    json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(r->prompt_tokens));
    json_object_object_add(u, "completion_tokens", json_object_new_int(r->completion_tokens));
    json_object_object_add(u, "total_tokens", json_object_new_int(r->prompt_tokens + r->completion_tokens));
    json_object_object_add(d, "cached_tokens", json_object_new_int(r->cached_tokens));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

static json_object *ratio(int64_t a, int64_t b) { return b > 0 ? json_object_new_double((double)a / (double)b) : NULL; }

// Our figures: the slot, the cache, the times and, with speculation, acceptance and tokens per
// full-cache pass.
static json_object *triforce_json(const srv_result *r) {
    json_object *t = json_object_new_object();
    json_object_object_add(t, "slot", json_object_new_int(r->slot));
    json_object_object_add(t, "spec_mode", json_object_new_string(r->mode));
    json_object_object_add(t, "prompt_tokens", json_object_new_int(r->prompt_tokens));
    json_object_object_add(t, "cached_tokens", json_object_new_int(r->cached_tokens));
    json_object_object_add(t, "prefilled_tokens", json_object_new_int(r->prompt_tokens - r->cached_tokens));
    json_object_object_add(t, "generated_tokens", json_object_new_int(r->completion_tokens));
    json_object_object_add(t, "queue_seconds", json_object_new_double(r->queue_seconds));
    json_object_object_add(t, "prefill_seconds", json_object_new_double(r->prefill_seconds));
    json_object_object_add(t, "decode_seconds", json_object_new_double(r->decode_seconds));
    json_object_object_add(t, "decode_tokens_per_second",
                           r->completion_tokens > 1 && r->decode_seconds > 0
                               ? json_object_new_double((r->completion_tokens - 1) / r->decode_seconds)
                               : NULL);
    if (r->spec) {
        json_object_object_add(t, "full_cache_passes", json_object_new_int64(r->full_cache_passes));
        json_object_object_add(t, "tokens_per_pass", ratio(r->completion_tokens, r->full_cache_passes));
        json_object_object_add(t, "l1_proposed", json_object_new_int64(r->l1_proposed));
        json_object_object_add(t, "l1_accepted", json_object_new_int64(r->l1_accepted));
        json_object_object_add(t, "l1_acceptance", ratio(r->l1_accepted, r->l1_proposed));
        json_object_object_add(t, "l2_proposed", json_object_new_int64(r->l2_proposed));
        json_object_object_add(t, "l2_accepted", json_object_new_int64(r->l2_accepted));
        json_object_object_add(t, "l2_acceptance", ratio(r->l2_accepted, r->l2_proposed));
        // the slots' engines generate together: the batched passes of any level that ran this
        // request's passes, and the sequences they carried on average, this one included
        json_object_object_add(t, "batch_passes", json_object_new_int64(r->batch_passes));
        json_object_object_add(t, "batch_mean", ratio(r->batch_sequences, r->batch_passes));
    } else {
        // plain decoding: one full-cache pass per token
        json_object_object_add(t, "full_cache_passes", json_object_new_int(r->completion_tokens));
        json_object_object_add(t, "tokens_per_pass", json_object_new_double(r->completion_tokens ? 1.0 : 0.0));
        // continuous batching: the passes that ran this request's tokens, and how many sequences
        // (slots) they carried on average, this one included
        json_object_object_add(t, "batch_passes", json_object_new_int64(r->batch_passes));
        json_object_object_add(t, "batch_mean", ratio(r->batch_sequences, r->batch_passes));
    }
    return t;
}

static json_object *head(bool chat, const srv_result *r, bool chunk) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    const char *object = !chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(r->created));
    json_object_object_add(o, "model", json_object_new_string(r->model));
    json_object_object_add(o, "system_fingerprint", json_object_new_string("triforce-" TRI_VERSION_STRING));
    return o;
}

char *srv_response_json(bool chat, const srv_result *r) {
    json_object *o = head(chat, r, false), *choices = json_object_new_array(), *c = json_object_new_object();
    json_object_object_add(c, "index", json_object_new_int(0));
    json_object *text = json_object_new_string_len(r->text ? r->text : "", (int)r->n_text);
    if (chat) {
        json_object *msg = json_object_new_object();
        json_object_object_add(msg, "role", json_object_new_string("assistant"));
        json_object_object_add(msg, "content", text);
        json_object_object_add(msg, "refusal", NULL);
        json_object_object_add(c, "message", msg);
    } else {
        json_object_object_add(c, "text", text);
    }
    json_object_object_add(c, "logprobs", NULL);
    json_object_object_add(c, "finish_reason", json_object_new_string(r->finish_reason));
    json_object_array_add(choices, c);
    json_object_object_add(o, "choices", choices);
    json_object_object_add(o, "usage", usage_json(r));
    json_object_object_add(o, "triforce", triforce_json(r));
    return take_json(o);
}

char *srv_chunk_sse(bool chat, const srv_result *r, const char *text, size_t n_text, bool first, bool usage_only,
                    size_t *len) {
    json_object *o = head(chat, r, true), *choices = json_object_new_array();
    if (usage_only) {
        json_object_object_add(o, "usage", usage_json(r));
    } else {
        json_object *c = json_object_new_object();
        json_object_object_add(c, "index", json_object_new_int(0));
        json_object *t = r->finish_reason ? NULL : json_object_new_string_len(text ? text : "", (int)n_text);
        if (chat) {
            json_object *delta = json_object_new_object();
            if (first) json_object_object_add(delta, "role", json_object_new_string("assistant"));
            if (t) json_object_object_add(delta, "content", t);
            json_object_object_add(c, "delta", delta);
        } else {
            json_object_object_add(c, "text", t ? t : json_object_new_string(""));
        }
        json_object_object_add(c, "logprobs", NULL);
        json_object_object_add(c, "finish_reason", r->finish_reason ? json_object_new_string(r->finish_reason) : NULL);
        json_object_array_add(choices, c);
        if (r->finish_reason) json_object_object_add(o, "triforce", triforce_json(r));
    }
    json_object_object_add(o, "choices", choices);
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t n = s ? strlen(s) : 0;
    char *out = s ? malloc(n + 9) : NULL;
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, s, n);
        memcpy(out + 6 + n, "\n\n", 3);
        *len = n + 8;
    }
    json_object_put(o);
    return out;
}

char *srv_models_json(const srv_model_ref *m, int64_t created, bool one) {
    json_object *e = json_object_new_object();
    json_object_object_add(e, "id", json_object_new_string(m->id));
    json_object_object_add(e, "object", json_object_new_string("model"));
    json_object_object_add(e, "created", json_object_new_int64(created));
    json_object_object_add(e, "owned_by", json_object_new_string("triforce"));
    json_object *meta = json_object_new_object();
    json_object_object_add(meta, "path", json_object_new_string(m->path));
    json_object_object_add(meta, "n_ctx", json_object_new_int(m->n_ctx));
    json_object_object_add(meta, "chat", json_object_new_boolean(m->chat_ok));
    json_object_object_add(e, "triforce", meta);
    if (one) return take_json(e);
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_array_add(data, e);
    json_object_object_add(o, "data", data);
    return take_json(o);
}

// ---- llama-server's other endpoints ----

// The body of a small request: a JSON object, or false with err set.
static json_object *parse_object(const char *body, size_t len, srv_error *err) {
    if (len == 0) {
        BAD(err, NULL, "the request has no body: want a JSON object");
        return NULL;
    }
    json_tokener *tok = json_tokener_new();
    if (!tok) {
        oom(err);
        return NULL;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = json_tokener_parse_ex(tok, body, (int)(len > INT32_MAX ? INT32_MAX : len));
    bool good = root && json_tokener_get_error(tok) == json_tokener_success;
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    while (good && end < len && strchr(" \t\r\n", body[end])) end++;
    if (!good || end < len || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        BAD(err, NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return false;
        i += k;
    }
    return true;
}

bool srv_tokenize_json(const srv_model_ref *m, const char *body, size_t len, char **out, srv_error *err) {
    json_object *root = parse_object(body, len, err), *v;
    if (!root) return false;
    bool ok = false, add_special = false, parse_special = true, pieces = false;
    srv_request rq = {0};
    json_object_object_foreach(root, key, val) {
        (void)val;
        if (strcmp(key, "content") && strcmp(key, "add_special") && strcmp(key, "parse_special") &&
            strcmp(key, "with_pieces")) {
            BAD(err, key,
                "unrecognized field '%s': /tokenize takes content, add_special, parse_special and "
                "with_pieces",
                key);
            goto done;
        }
    }
    if (!json_object_object_get_ex(root, "content", &v) || !json_object_is_type(v, json_type_string)) {
        BAD(err, "content", "'content' must be a string");
        goto done;
    }
    json_object *b;
    if (json_object_object_get_ex(root, "add_special", &b) && !get_bool(b, "add_special", &add_special, err)) goto done;
    if (json_object_object_get_ex(root, "parse_special", &b) && !get_bool(b, "parse_special", &parse_special, err))
        goto done;
    if (json_object_object_get_ex(root, "with_pieces", &b) && !get_bool(b, "with_pieces", &pieces, err)) goto done;
    if (!tokenize(m, json_object_get_string(v), (size_t)json_object_get_string_len(v), add_special, parse_special, &rq,
                  "content", err))
        goto done;
    json_object *o = json_object_new_object(), *arr = json_object_new_array();
    for (int32_t i = 0; i < rq.n_ids; i++) {
        if (!pieces) {
            json_object_array_add(arr, json_object_new_int(rq.ids[i]));
            continue;
        }
        const char *p = "";
        size_t n = 0;
        tri_token_piece(m->model, rq.ids[i], &p, &n);
        json_object *e = json_object_new_object();
        json_object_object_add(e, "id", json_object_new_int(rq.ids[i]));
        if (valid_utf8((const unsigned char *)p, n)) {
            json_object_object_add(e, "piece", json_object_new_string_len(p, (int)n));
        } else {  // a byte of a character split over tokens: its values, as llama-server gives them
            json_object *bytes = json_object_new_array();
            for (size_t k = 0; k < n; k++) json_object_array_add(bytes, json_object_new_int((unsigned char)p[k]));
            json_object_object_add(e, "piece", bytes);
        }
        json_object_array_add(arr, e);
    }
    json_object_object_add(o, "tokens", arr);
    ok = (*out = take_json(o)) != NULL || oom(err);
done:
    free(rq.ids);
    json_object_put(root);
    return ok;
}

bool srv_detokenize_json(const srv_model_ref *m, const char *body, size_t len, char **out, srv_error *err) {
    json_object *root = parse_object(body, len, err), *v;
    if (!root) return false;
    bool ok = false;
    int32_t *ids = NULL;
    char *text = NULL;
    if (!json_object_object_get_ex(root, "tokens", &v) || !json_object_is_type(v, json_type_array)) {
        BAD(err, "tokens", "'tokens' must be an array of token ids");
        goto done;
    }
    size_t n = json_object_array_length(v);
    if (!(ids = malloc((n ? n : 1) * sizeof *ids))) {
        oom(err);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        char name[40];
        snprintf(name, sizeof name, "tokens[%zu]", i);
        if (!get_int(json_object_array_get_idx(v, i), name, 0, tri_token_count(m->model) - 1, &id, err)) goto done;
        ids[i] = (int32_t)id;
    }
    size_t need = 0;
    if (tri_detokenize(m->model, ids, (int64_t)n, true, NULL, 0, &need) != TRI_STATUS_OK && need == 0 && n > 0) {
        BAD(err, "tokens", "cannot detokenize: %s", tri_last_error());
        goto done;
    }
    if (!(text = malloc(need + 1))) {
        oom(err);
        goto done;
    }
    if (tri_detokenize(m->model, ids, (int64_t)n, true, text, need + 1, &need) != TRI_STATUS_OK) {
        BAD(err, "tokens", "cannot detokenize: %s", tri_last_error());
        goto done;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "content", json_object_new_string_len(text, (int)need));
    ok = (*out = take_json(o)) != NULL || oom(err);
done:
    free(ids);
    free(text);
    json_object_put(root);
    return ok;
}

char *srv_slots_json(const srv_model_ref *m, const srv_slot_info *slots, int n, bool speculative) {
    json_object *arr = json_object_new_array();
    for (int i = 0; i < n; i++) {
        json_object *e = json_object_new_object();
        json_object_object_add(e, "id", json_object_new_int(slots[i].id));
        json_object_object_add(e, "n_ctx", json_object_new_int(m->n_ctx));
        json_object_object_add(e, "speculative", json_object_new_boolean(speculative));
        json_object_object_add(e, "is_processing", json_object_new_boolean(slots[i].processing));
        json_object_object_add(e, "n_cached", json_object_new_int(slots[i].n_cached));
        json_object_array_add(arr, e);
    }
    return take_json(arr);
}

char *srv_props_json(const srv_model_ref *m, const srv_sampling *dflt, int64_t n_predict, int n_slots,
                     const char *mode) {
    json_object *o = json_object_new_object(), *g = json_object_new_object(), *p = json_object_new_object();
    json_object_object_add(p, "temperature", json_object_new_double(dflt->temperature));
    json_object_object_add(p, "top_k", json_object_new_int64(dflt->top_k));
    json_object_object_add(p, "top_p", json_object_new_double(dflt->top_p));
    json_object_object_add(p, "min_p", json_object_new_double(dflt->min_p));
    json_object_object_add(p, "repeat_penalty", json_object_new_double(dflt->repeat_penalty));
    json_object_object_add(p, "repeat_last_n", json_object_new_int(64));
    json_object_object_add(p, "seed", dflt->has_seed ? json_object_new_int64((int64_t)dflt->seed) : NULL);
    json_object_object_add(p, "n_predict", json_object_new_int64(n_predict > 0 ? n_predict : -1));
    json_object_object_add(g, "n_ctx", json_object_new_int(m->n_ctx));
    json_object_object_add(g, "params", p);
    json_object_object_add(o, "default_generation_settings", g);
    json_object_object_add(o, "total_slots", json_object_new_int(n_slots));
    json_object_object_add(o, "model_alias", json_object_new_string(m->id));
    json_object_object_add(o, "model_path", json_object_new_string(m->path));
    json_object_object_add(o, "chat", json_object_new_boolean(m->chat_ok));
    json_object_object_add(o, "chat_format",
                           m->chat_format == TRI_CHAT_FORMAT_AUTO
                               ? json_object_new_string("auto")
                               : json_object_new_string(tri_chat_format_name(m->chat_format)));
    json_object_object_add(o, "spec_mode", json_object_new_string(mode));
    json_object_object_add(o, "build_info", json_object_new_string("triforce-" TRI_VERSION_STRING));
    return take_json(o);
}
