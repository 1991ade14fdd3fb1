// chat.c - chat templates: run by the Jinja interpreter (jinja.c, docs/chat-templates.md), or the
// built-in format a template writes, recognised by its markers and rendered in C as jinja2
// renders the template (docs/formats.md, "Chat templates").
#include "chat.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "jinja.h"
#include "json-read.h"

// ---- names ----

static const char *const format_names[TRI_CHAT_FORMAT_COUNT] = {
    "auto", "chatml", "llama2", "llama3", "mistral", "phi3", "gemma", "jinja",
};

const char *tri_chat_format_name(tri_chat_format format) {
    return format >= 0 && format < TRI_CHAT_FORMAT_COUNT ? format_names[format] : NULL;
}

tri_status tri_chat_format_from_name(const char *name, tri_chat_format *out) {
    if (!name || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_format_from_name: NULL argument");
    for (int i = 0; i < TRI_CHAT_FORMAT_COUNT; i++)
        if (strcmp(name, format_names[i]) == 0) {
            *out = (tri_chat_format)i;
            return TRI_STATUS_OK;
        }
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                     "chat format '%s': want auto, chatml, llama2, llama3, mistral, phi3, gemma or jinja", name);
}

// ---- recognition ----

static bool has(const char *t, size_t len, const char *needle) {
    return t && memmem(t, len, needle, strlen(needle)) != NULL;
}

void tri__chat_spec_clear(tri__chat_spec *spec) {
    if (!spec) return;
    free((void *)spec->default_system);
    memset(spec, 0, sizeof *spec);
}

// ChatML templates that write a system message of their own when the conversation has none
// (SmolLM2's, Qwen2's) hold it as one string literal: '<|im_start|>system\n<text><|im_end|>\n'.
// Finds the first such literal whose text is part of it (not a message's content, which would
// close the literal first) and unescapes it as Jinja reads a string literal.
static tri_status find_default_system(const char *t, size_t len, tri__chat_spec *spec) {
    static const char marker[] = "<|im_start|>system";
    const char *end = t + len;
    for (const char *p = t; (p = memmem(p, (size_t)(end - p), marker, sizeof marker - 1)); p++) {
        const char *q = p + sizeof marker - 1;
        if (q < end && *q == '\n') q++;
        else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *stop = memmem(q, (size_t)(end - q), "<|im_end|>", 10);
        if (!stop || stop == q) continue;
        if (memchr(q, '\'', (size_t)(stop - q)) || memchr(q, '"', (size_t)(stop - q))) continue;
        char *s = malloc((size_t)(stop - q) + 1);
        if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
        size_t n = 0;
        for (const char *r = q; r < stop; r++) {
            if (*r == '\\' && r + 1 < stop) {
                r++;
                switch (*r) {
                case 'n': s[n++] = '\n'; break;
                case 't': s[n++] = '\t'; break;
                case 'r': s[n++] = '\r'; break;
                default: s[n++] = *r; break;  // \\, \', \" and anything else: the character
                }
            } else {
                s[n++] = *r;
            }
        }
        s[n] = 0;
        spec->default_system = s;
        spec->default_system_len = n;
        return TRI_STATUS_OK;
    }
    return TRI_STATUS_OK;
}

// Whether text is of a known format: fills *out, or says why not in *why (no failure recorded, so
// that a caller with a fallback logs nothing).
static bool detect(const char *t, size_t len, tri__chat_spec *out, const char **why);

static bool detect(const char *t, size_t len, tri__chat_spec *out, const char **why) {
    memset(out, 0, sizeof *out);
    *why = NULL;
    out->bos = has(t, len, "bos_token");
    if (has(t, len, "<|im_start|>")) {
        out->format = TRI_CHAT_FORMAT_CHATML;
        out->bos = false;
        return find_default_system(t, len, out) == TRI_STATUS_OK || (*why = "out of memory", false);
    }
    if (has(t, len, "<|start_header_id|>")) {
        if (has(t, len, "Cutting Knowledge Date"))
            return *why = "a Llama-3.1 template (tools and dates in its system header) is not rendered; "
                           "llama3 writes the same turns without that header", false;
        out->format = TRI_CHAT_FORMAT_LLAMA3;
        out->gen_prompt_always = !has(t, len, "add_generation_prompt");
        return true;
    }
    if (has(t, len, "<start_of_turn>")) {
        out->format = TRI_CHAT_FORMAT_GEMMA;
        return true;
    }
    if (has(t, len, "<|user|>")) {
        if (!has(t, len, "<|assistant|>") || !has(t, len, "add_generation_prompt"))
            return *why = "a Phi-3 template of a variant not known here (no add_generation_prompt)", false;
        out->format = TRI_CHAT_FORMAT_PHI3;
        out->skip_empty_system = has(t, len, "'system' and message['content']");
        return true;
    }
    if (has(t, len, "[INST]")) {
        if (has(t, len, "<<SYS>>")) {
            out->format = TRI_CHAT_FORMAT_LLAMA2;
            return true;
        }
        if (has(t, len, "[AVAILABLE_TOOLS]") || has(t, len, "system_message"))
            return *why = "a Mistral template of a later variant (system message or tools) is not rendered", false;
        out->format = TRI_CHAT_FORMAT_MISTRAL;
        out->eos_space = has(t, len, "eos_token + ' '");
        return true;
    }
    return *why = "no known format's markers (<|im_start|>, [INST], <|start_header_id|>, <|user|>, "
                   "<start_of_turn>) in its text", false;
}

tri_status tri__chat_detect(const char *t, size_t len, tri__chat_spec *out) {
    if (!out || (!t && len)) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: NULL argument");
    const char *why;
    if (detect(t, len, out, &why)) return TRI_STATUS_OK;
    tri__chat_spec_clear(out);
    return tri__fail(TRI_STATUS_UNSUPPORTED,
                     "chat template: %s; name the format instead (offload-run --chat-format NAME, or "
                     "tri_chat_format: chatml, llama2, llama3, mistral, phi3, gemma)",
                     why);
}

// The variant a named format has when no template says otherwise: its first published one.
static void named_spec(tri_chat_format f, tri__chat_spec *out) {
    memset(out, 0, sizeof *out);
    out->format = f;
    out->bos = f == TRI_CHAT_FORMAT_LLAMA2 || f == TRI_CHAT_FORMAT_LLAMA3 || f == TRI_CHAT_FORMAT_MISTRAL ||
               f == TRI_CHAT_FORMAT_GEMMA;
}

// ---- rendering ----

typedef struct writer {
    char *buf;
    size_t cap;
    size_t n;
} writer;

static void put(writer *w, const char *s, size_t len) {
    if (w->n < w->cap) {
        size_t room = w->cap - w->n;
        memcpy(w->buf + w->n, s, len < room ? len : room);
    }
    w->n += len;
}

static void puts_(writer *w, const char *s) {
    if (s) put(w, s, strlen(s));
}

// Whether the bytes at s (n left) start a character Python's str.isspace() accepts; its length.
static size_t space_at(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
    if (n >= 2 && c == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n >= 3 && c == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;  // U+1680
    if (n >= 3 && c == 0xe2 && s[1] == 0x80 && (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return s[2] >= 0x80 ? 3 : 0;  // U+2000..200A, U+2028, U+2029, U+202F
    if (n >= 3 && c == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;  // U+205F
    if (n >= 3 && c == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;  // U+3000
    return 0;
}

// Python's str.strip() (Jinja's trim) over UTF-8: *s, *n narrowed.
static void strip(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    while ((k = space_at(p, len))) p += k, len -= k;
    for (;;) {
        // the last character: step back over continuation bytes (at most 3)
        size_t back = 1;
        while (back < len && back < 4 && (p[len - back] & 0xc0) == 0x80) back++;
        if (len == 0 || space_at(p + len - back, back) != back) break;
        len -= back;
    }
    *s = (const char *)p;
    *n = len;
}

static void put_stripped(writer *w, const char *s, size_t n) {
    strip(&s, &n);
    put(w, s, n);
}

static bool role_is(const tri_chat_message *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

static tri_status refuse(tri_chat_format f, const char *why) {
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template (%s): %s", format_names[f], why);
}

static tri_status alternate(tri_chat_format f, const tri_chat_message *m, size_t i) {
    if (role_is(m, "user") != (i % 2 == 0))
        return refuse(f, "conversation roles must alternate user/assistant/user/assistant/...");
    return TRI_STATUS_OK;
}

static tri_status render_llama2(writer *w, const char *bos, const char *eos, const tri_chat_message *msgs,
                                size_t n) {
    const char *sys = NULL;
    size_t start = 0;
    if (role_is(&msgs[0], "system")) sys = msgs[0].content, start = 1;
    for (size_t i = start; i < n; i++) {
        const tri_chat_message *m = &msgs[i];
        tri_status st = alternate(TRI_CHAT_FORMAT_LLAMA2, m, i - start);
        if (st) return st;
        // the system message joins the first turn's content, and the strip applies to both
        char *joined = NULL;
        const char *c = m->content;
        size_t cn = strlen(c);
        if (i == start && sys) {
            size_t sn = strlen(sys);
            joined = malloc(sn + cn + 32);
            if (!joined) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
            int k = snprintf(joined, sn + cn + 32, "<<SYS>>\n%s\n<</SYS>>\n\n%s", sys, c);
            c = joined;
            cn = k > 0 ? (size_t)k : 0;
        }
        if (role_is(m, "user")) {
            puts_(w, bos);
            puts_(w, "[INST] ");
            put_stripped(w, c, cn);
            puts_(w, " [/INST]");
        } else if (role_is(m, "assistant")) {
            puts_(w, " ");
            put_stripped(w, c, cn);
            puts_(w, " ");
            puts_(w, eos);
        }
        free(joined);
    }
    return TRI_STATUS_OK;
}

tri_status tri__chat_render(const tri__chat_spec *spec, const char *bos, const char *eos,
                            const tri_chat_message *msgs, size_t n, bool gen, char *buf, size_t cap,
                            size_t *n_out) {
    if (!spec || !n_out || (!buf && cap) || !msgs)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: NULL argument");
    *n_out = 0;
    if (n == 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: no messages");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: message %zu has a NULL role or content", i);
    writer w = {buf, cap, 0};
    const tri_chat_format f = spec->format;
    tri_status st = TRI_STATUS_OK;
    if (!spec->bos) bos = NULL;
    switch (f) {
    case TRI_CHAT_FORMAT_CHATML:
        for (size_t i = 0; i < n; i++) {
            if (i == 0 && spec->default_system && !role_is(&msgs[0], "system")) {
                puts_(&w, "<|im_start|>system\n");
                put(&w, spec->default_system, spec->default_system_len);
                puts_(&w, "<|im_end|>\n");
            }
            puts_(&w, "<|im_start|>");
            puts_(&w, msgs[i].role);
            puts_(&w, "\n");
            puts_(&w, msgs[i].content);
            puts_(&w, "<|im_end|>\n");
        }
        if (gen) puts_(&w, "<|im_start|>assistant\n");
        break;
    case TRI_CHAT_FORMAT_LLAMA2: st = render_llama2(&w, bos, eos, msgs, n); break;
    case TRI_CHAT_FORMAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            if (i == 0) puts_(&w, bos);
            puts_(&w, "<|start_header_id|>");
            puts_(&w, msgs[i].role);
            puts_(&w, "<|end_header_id|>\n\n");
            put_stripped(&w, msgs[i].content, strlen(msgs[i].content));
            puts_(&w, "<|eot_id|>");
        }
        if (gen || spec->gen_prompt_always) puts_(&w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TRI_CHAT_FORMAT_MISTRAL:
        puts_(&w, bos);
        for (size_t i = 0; i < n && !st; i++) {
            if ((st = alternate(f, &msgs[i], i))) break;
            if (role_is(&msgs[i], "user")) {
                puts_(&w, "[INST] ");
                puts_(&w, msgs[i].content);
                puts_(&w, " [/INST]");
            } else if (role_is(&msgs[i], "assistant")) {
                puts_(&w, msgs[i].content);
                puts_(&w, eos);
                if (spec->eos_space) puts_(&w, " ");
            } else {
                st = refuse(f, "only user and assistant roles are supported");
            }
        }
        break;
    case TRI_CHAT_FORMAT_PHI3:
        puts_(&w, bos);
        for (size_t i = 0; i < n; i++) {
            const char *c = msgs[i].content;
            const char *head = NULL;
            if (role_is(&msgs[i], "system") && (c[0] || !spec->skip_empty_system)) head = "<|system|>\n";
            else if (role_is(&msgs[i], "user")) head = "<|user|>\n";
            else if (role_is(&msgs[i], "assistant")) head = "<|assistant|>\n";
            if (!head) continue;
            puts_(&w, head);
            puts_(&w, c);
            puts_(&w, "<|end|>\n");
        }
        puts_(&w, gen ? "<|assistant|>\n" : eos);
        break;
    case TRI_CHAT_FORMAT_GEMMA:
        puts_(&w, bos);
        if (role_is(&msgs[0], "system")) {
            st = refuse(f, "system role not supported");
            break;
        }
        for (size_t i = 0; i < n; i++) {
            if ((st = alternate(f, &msgs[i], i))) break;
            puts_(&w, "<start_of_turn>");
            puts_(&w, role_is(&msgs[i], "assistant") ? "model" : msgs[i].role);
            puts_(&w, "\n");
            put_stripped(&w, msgs[i].content, strlen(msgs[i].content));
            puts_(&w, "<end_of_turn>\n");
        }
        if (!st && gen) puts_(&w, "<start_of_turn>model\n");
        break;
    default: return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format %d is not a built-in format", (int)f);
    }
    if (st) return st;
    *n_out = w.n;
    if (cap > 0) buf[w.n < cap ? w.n : cap - 1] = 0;
    if (cap > 0 && w.n >= cap)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: %zu bytes do not fit a buffer of %zu",
                         w.n + 1, cap);
    return TRI_STATUS_OK;
}

// ---- the interpreter ----

// Copies text (n bytes) to buf as the renderers write: NUL-terminated when cap > 0, *n_out set,
// INVALID_ARGUMENT when it does not fit.
static tri_status give(const char *text, size_t n, char *buf, size_t cap, size_t *n_out) {
    *n_out = n;
    if (cap > 0) {
        size_t k = n < cap ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = 0;
    }
    if (cap > 0 && n >= cap)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: %zu bytes do not fit a buffer of %zu", n + 1,
                         cap);
    return TRI_STATUS_OK;
}

struct json_object *tri__chat_messages_json(const tri_chat_message *msgs, size_t n) {
    struct json_object *arr = json_object_new_array();
    for (size_t i = 0; arr && i < n; i++) {
        struct json_object *m = json_object_new_object();
        if (!m) break;
        json_object_object_add(m, "role", json_object_new_string(msgs[i].role));
        json_object_object_add(m, "content", json_object_new_string(msgs[i].content));
        json_object_array_add(arr, m);
    }
    return arr;
}

typedef enum { JINJA_RENDERED, JINJA_REFUSED, JINJA_FAILED } jinja_outcome;

// Runs template text with the interpreter over (messages, tools, add_generation_prompt,
// bos_token, eos_token). REFUSED (nothing recorded; why says what) when the interpreter does not
// run the template: a construct it lacks, or text jinja2 would not compile; FAILED (recorded,
// naming where) when the template raises or hits a limit.
static jinja_outcome jinja_run(const char *where, const char *tmpl, size_t len, const char *bos, const char *eos,
                               struct json_object *msgs, struct json_object *tools, bool gen, char **out, size_t *n_out,
                               tri_status *st, char *why, size_t whycap) {
    tri__jinja *j = NULL;
    *st = tri__jinja_parse(tmpl, len, &j, why, whycap);
    if (*st == TRI_STATUS_BAD_FORMAT || *st == TRI_STATUS_UNSUPPORTED) return JINJA_REFUSED;
    if (*st) {
        tri__fail(*st, "%s: chat template: %s", where, why);
        return JINJA_FAILED;
    }
    struct json_object *ctx = json_object_new_object();
    if (!ctx) {
        tri__jinja_free(j);
        *st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
        return JINJA_FAILED;
    }
    json_object_object_add(ctx, "messages", json_object_get(msgs));
    json_object_object_add(ctx, "tools", tools ? json_object_get(tools) : NULL);
    json_object_object_add(ctx, "add_generation_prompt", json_object_new_boolean(gen));
    json_object_object_add(ctx, "bos_token", json_object_new_string(bos ? bos : ""));
    json_object_object_add(ctx, "eos_token", json_object_new_string(eos ? eos : ""));
    *st = tri__jinja_render(j, ctx, (int64_t)time(NULL), NULL, out, n_out, why, whycap);
    json_object_put(ctx);
    tri__jinja_free(j);
    if (*st == TRI_STATUS_UNSUPPORTED) return JINJA_REFUSED;
    if (*st) {
        tri__fail(*st, "%s: chat template: %s", where, why);
        return JINJA_FAILED;
    }
    return JINJA_RENDERED;
}

// Whether the interpreter parses template text (why: what it lacks when it does not).
static bool jinja_parses(const char *tmpl, size_t len, char *why, size_t whycap) {
    tri__jinja *j = NULL;
    tri_status st = tri__jinja_parse(tmpl, len, &j, why, whycap);
    tri__jinja_free(j);
    return st == TRI_STATUS_OK;
}

// The role and content of JSON messages for a built-in format, pointing into msgs.
static tri_status plain_messages(const char *where, struct json_object *msgs, tri_chat_message **out, size_t *n) {
    size_t k = json_object_array_length(msgs);
    *out = calloc(k ? k : 1, sizeof **out);
    if (!*out) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
    for (size_t i = 0; i < k; i++) {
        struct json_object *m = json_object_array_get_idx(msgs, i), *role, *content;
        json_object_object_get_ex(m, "role", &role);
        if (!json_object_object_get_ex(m, "content", &content) || !json_object_is_type(content, json_type_string)) {
            free(*out);
            *out = NULL;
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: message %zu: a built-in chat format takes a string 'content' only (the model's "
                             "template, run by the interpreter, takes the rest)",
                             where, i);
        }
        (*out)[i].role = json_object_get_string(role);
        (*out)[i].content = json_object_get_string(content);
    }
    *n = k;
    return TRI_STATUS_OK;
}

// The whole of rendering: template text tmpl (may be NULL) with format, the conversation as JSON.
tri_status tri__chat_render_json(const char *where, const char *tmpl, size_t len, tri_chat_format format,
                                 const char *bos, const char *eos, struct json_object *msgs, struct json_object *tools,
                                 bool gen, char *buf, size_t cap, size_t *n_out) {
    if (format < 0 || format >= TRI_CHAT_FORMAT_COUNT)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format %d is not a format", (int)format);
    if (json_object_array_length(msgs) == 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: no messages");
    char why[512] = "";
    if (tmpl && (format == TRI_CHAT_FORMAT_AUTO || format == TRI_CHAT_FORMAT_JINJA)) {
        char *out = NULL;
        size_t n = 0;
        tri_status st;
        switch (jinja_run(where, tmpl, len, bos, eos, msgs, tools, gen, &out, &n, &st, why, sizeof why)) {
        case JINJA_RENDERED:
            st = give(out, n, buf, cap, n_out);
            free(out);
            return st;
        case JINJA_FAILED: return st;
        case JINJA_REFUSED:
            if (format == TRI_CHAT_FORMAT_JINJA)
                return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: chat template: the interpreter does not run it: %s",
                                 where, why);
            break;
        }
    } else if (format == TRI_CHAT_FORMAT_JINJA) {
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format jinja needs a template");
    }
    // a built-in format
    tri__chat_spec spec = {0};
    tri_status st;
    if (format == TRI_CHAT_FORMAT_AUTO) {
        if (!tmpl) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format auto needs a template");
        const char *not_builtin;
        if (!detect(tmpl, len, &spec, &not_builtin)) {
            tri__chat_spec_clear(&spec);
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: chat template: the interpreter does not run it (%s), and it is of no built-in "
                             "format (%s); name a format instead (offload-run --chat-format NAME: chatml, llama2, "
                             "llama3, mistral, phi3, gemma)",
                             where, why, not_builtin);
        }
        tri__log(TRI_LOG_LEVEL_INFO,
                 "%s: chat template rendered as the built-in format %s: the interpreter does not run it: %s", where,
                 format_names[spec.format], why);
    } else if ((st = tri__chat_resolve(tmpl, tmpl ? len : 0, format, &spec))) {
        return st;
    }
    if (tools && json_object_array_length(tools) > 0) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED,
                       "%s: tools need the model's template run by the interpreter, not the built-in format %s", where,
                       format_names[spec.format]);
        tri__chat_spec_clear(&spec);
        return st;
    }
    tri_chat_message *m = NULL;
    size_t n = 0;
    if (!(st = plain_messages(where, msgs, &m, &n))) st = tri__chat_render(&spec, bos, eos, m, n, gen, buf, cap, n_out);
    free(m);
    tri__chat_spec_clear(&spec);
    return st;
}

// ---- public calls without a model ----

tri_status tri_chat_template_format(const char *tmpl, size_t len, tri_chat_format *out) {
    if (!tmpl || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_template_format: NULL argument");
    tri__chat_spec spec = {0};
    tri_status st = tri__chat_detect(tmpl, len, &spec);
    if (!st) *out = spec.format;
    tri__chat_spec_clear(&spec);
    return st;
}

tri_status tri__chat_resolve(const char *tmpl, size_t len, tri_chat_format format, tri__chat_spec *spec) {
    if (format < 0 || format >= TRI_CHAT_FORMAT_COUNT)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format %d is not a format", (int)format);
    if (format == TRI_CHAT_FORMAT_AUTO) {
        if (!tmpl) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: format auto needs a template");
        return tri__chat_detect(tmpl, len, spec);
    }
    const char *why;
    if (tmpl && detect(tmpl, len, spec, &why) && spec->format == format) return TRI_STATUS_OK;
    tri__chat_spec_clear(spec);
    named_spec(format, spec);
    return TRI_STATUS_OK;
}

tri_status tri_chat_render(const char *tmpl, tri_chat_format format, const char *bos_token, const char *eos_token,
                           const tri_chat_message *msgs, size_t n, bool add_generation_prompt, char *buf,
                           size_t cap, size_t *n_out) {
    if (!n_out || !msgs || (!buf && cap))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_chat_render: NULL argument");
    *n_out = 0;
    if (n == 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: no messages");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chat template: message %zu has a NULL role or content", i);
    struct json_object *arr = tri__chat_messages_json(msgs, n);
    if (!arr) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chat template: out of memory");
    tri_status st = tri__chat_render_json("template", tmpl, tmpl ? strlen(tmpl) : 0, format, bos_token, eos_token, arr,
                                          NULL, add_generation_prompt, buf, cap, n_out);
    json_object_put(arr);
    return st;
}

// ---- tokenizer_config.json ----

// A special token of tokenizer_config.json: a string, or an object whose "content" is one.
static tri_status config_token(const char *path, struct json_object *root, const char *key, char **out) {
    if (!out) return TRI_STATUS_OK;
    struct json_object *v;
    if (!json_object_object_get_ex(root, key, &v) || json_object_is_type(v, json_type_null)) return TRI_STATUS_OK;
    if (json_object_is_type(v, json_type_object)) {
        struct json_object *c;
        if (!json_object_object_get_ex(v, "content", &c) || !json_object_is_type(c, json_type_string))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s': an object without a string 'content'", path, key);
        v = c;
    } else if (!json_object_is_type(v, json_type_string)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s': want a string or an object with 'content'", path,
                         key);
    }
    if (!(*out = strdup(json_object_get_string(v))))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    return TRI_STATUS_OK;
}

tri_status tri__chat_from_tokenizer_config(const char *path, const char *text, size_t len, char **tmpl, char **bos,
                                           char **eos) {
    if (!path || !text || !tmpl) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tokenizer_config.json: NULL argument");
    *tmpl = NULL;
    if (bos) *bos = NULL;
    if (eos) *eos = NULL;
    struct json_object *root = NULL;
    tri_status st = tri__json_parse(path, text, len, &root);
    if (st) return st;
    if (!json_object_is_type(root, json_type_object)) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: want a JSON object at the top", path);
        goto fail;
    }
    struct json_object *ct;
    if (json_object_object_get_ex(root, "chat_template", &ct) && !json_object_is_type(ct, json_type_null)) {
        const char *chosen = NULL;
        if (json_object_is_type(ct, json_type_string)) {
            chosen = json_object_get_string(ct);
        } else if (json_object_is_type(ct, json_type_array)) {
            size_t n = json_object_array_length(ct);
            for (size_t i = 0; i < n; i++) {
                struct json_object *e = json_object_array_get_idx(ct, i), *name, *t;
                if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "name", &name) ||
                    !json_object_object_get_ex(e, "template", &t) || !json_object_is_type(name, json_type_string) ||
                    !json_object_is_type(t, json_type_string)) {
                    st = tri__fail(TRI_STATUS_BAD_FORMAT,
                                   "%s: field 'chat_template': item %zu is not an object with string 'name' and "
                                   "'template'",
                                   path, i);
                    goto fail;
                }
                bool is_default = strcmp(json_object_get_string(name), "default") == 0;
                if (!chosen || is_default) chosen = json_object_get_string(t);
                if (is_default) break;
            }
        } else {
            st = tri__fail(TRI_STATUS_BAD_FORMAT,
                           "%s: field 'chat_template': want a string or a list of {name, template}", path);
            goto fail;
        }
        if (chosen && !(*tmpl = strdup(chosen))) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
            goto fail;
        }
    }
    if ((st = config_token(path, root, "bos_token", bos)) || (st = config_token(path, root, "eos_token", eos)))
        goto fail;
    json_object_put(root);
    return TRI_STATUS_OK;
fail:
    free(*tmpl);
    *tmpl = NULL;
    if (bos) free(*bos), *bos = NULL;
    if (eos) free(*eos), *eos = NULL;
    json_object_put(root);
    return st;
}

// ---- JSON conversations ----

// JSON text that must be an array (of objects with a string "role" when messages).
tri_status tri__chat_parse_array(const char *what, const char *text, bool messages, struct json_object **out) {
    *out = NULL;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", what);
    size_t len = strlen(text);
    struct json_object *v = len <= INT32_MAX ? json_tokener_parse_ex(tok, text, (int)len) : NULL;
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t at = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!v || jerr != json_tokener_success) {
        json_object_put(v);
        if (jerr == json_tokener_success || jerr == json_tokener_continue)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: not JSON: it ends early (%zu bytes)", what, len);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: not JSON: %s at byte %zu", what, json_tokener_error_desc(jerr),
                         at);
    }
    while (at < len && (text[at] == ' ' || text[at] == '\n' || text[at] == '\r' || text[at] == '\t')) at++;
    if (at < len) {
        json_object_put(v);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: not JSON: bytes after the value at byte %zu", what, at);
    }
    if (!json_object_is_type(v, json_type_array)) {
        json_object_put(v);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: want a JSON array", what);
    }
    for (size_t i = 0; messages && i < json_object_array_length(v); i++) {
        struct json_object *m = json_object_array_get_idx(v, i), *role;
        if (!json_object_is_type(m, json_type_object) || !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            json_object_put(v);
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: item %zu is not an object with a string 'role'", what, i);
        }
    }
    *out = v;
    return TRI_STATUS_OK;
}

tri_status tri__chat_format_of(const char *where, const char *tmpl, size_t len, tri_chat_format *out) {
    char why[512];
    if (jinja_parses(tmpl, len, why, sizeof why)) {
        *out = TRI_CHAT_FORMAT_JINJA;
        return TRI_STATUS_OK;
    }
    tri__chat_spec spec = {0};
    const char *not_builtin;
    tri_status st = TRI_STATUS_OK;
    if (detect(tmpl, len, &spec, &not_builtin))
        *out = spec.format;
    else
        st = tri__fail(TRI_STATUS_UNSUPPORTED,
                       "%s: the interpreter does not run its template (%s), and it is of no built-in format (%s); "
                       "name a format instead (offload-run --chat-format NAME)",
                       where, why, not_builtin);
    tri__chat_spec_clear(&spec);
    return st;
}
