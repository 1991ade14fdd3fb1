// test-chat.c - chat templates and stop strings.
//
// Golden renderings come from jinja2 (tests/fixtures/chat/make-golden.py, committed as
// golden.json) over published templates (tests/fixtures/chat/*.template, each naming its source
// model): the C renderer must give them byte for byte, and refuse where jinja2 raises. Stop
// strings are checked against the same generation run without them, on a tri-gen-model model,
// plain and speculative. With TRI_TEST_MODEL set, SmolLM2's own GGUF template is used.
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "test-util.h"
#include "triforce.h"

// ---- fixtures ----

typedef struct fixture {
    char name[64];
    char format[32];
    char bos[64];
    char eos[64];
    char *text;  // the template, malloc'd
} fixture;

static const char *src_path(const char *rel) {
    static char path[4096];
    const char *src = getenv("TRI_TEST_SRC");
    cr_assert(src, "TRI_TEST_SRC is not set: run through meson test");
    snprintf(path, sizeof path, "%s/%s", src, rel);
    return path;
}

static void header_field(const char *head, const char *key, char *out, size_t cap) {
    char k[40];
    snprintf(k, sizeof k, "\n%s: ", key);
    char *h = malloc(strlen(head) + 2);
    h[0] = '\n';
    strcpy(h + 1, head);
    const char *p = strstr(h, k);
    cr_assert(p, "fixture header lacks '%s'", key);
    p += strlen(k);
    size_t n = strcspn(p, "\n");
    cr_assert(n < cap);
    memcpy(out, p, n);
    out[n] = 0;
    free(h);
}

static void load_fixture(const char *name, fixture *f) {
    char rel[256];
    snprintf(rel, sizeof rel, "fixtures/chat/%s.template", name);
    char *all = tt_read_file(src_path(rel), NULL);
    char *sep = strstr(all, "\n----\n");
    cr_assert(sep, "%s: no ---- line", rel);
    *sep = 0;
    snprintf(f->name, sizeof f->name, "%s", name);
    header_field(all, "format", f->format, sizeof f->format);
    header_field(all, "bos", f->bos, sizeof f->bos);
    header_field(all, "eos", f->eos, sizeof f->eos);
    f->text = strdup(sep + 6);
    free(all);
}

static struct json_object *golden(void) {
    size_t len;
    char *text = tt_read_file(src_path("fixtures/chat/golden.json"), &len);
    struct json_object *root = json_tokener_parse(text);
    free(text);
    cr_assert(root && json_object_is_type(root, json_type_array), "golden.json does not parse");
    return root;
}

static const char *jstr(struct json_object *o, const char *key) {
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v)) return NULL;
    return json_object_get_string(v);
}

// The messages of a golden record, pointing into it.
static size_t messages_of(struct json_object *rec, tri_chat_message *msgs, size_t cap) {
    struct json_object *arr;
    cr_assert(json_object_object_get_ex(rec, "messages", &arr));
    size_t n = json_object_array_length(arr);
    cr_assert(n <= cap);
    for (size_t i = 0; i < n; i++) {
        struct json_object *m = json_object_array_get_idx(arr, i);
        msgs[i].role = jstr(m, "role");
        msgs[i].content = jstr(m, "content");
    }
    return n;
}

// ---- rendering against jinja2 ----

// Every golden record: the recognised format is the fixture's, and the rendering is jinja2's
// byte for byte, with format AUTO and with the format named; refusals where jinja2 raised.
Test(chat, golden_renderings_match_jinja2) {
    struct json_object *g = golden();
    size_t n_rec = json_object_array_length(g), n_ok = 0, n_refused = 0;
    cr_assert_gt(n_rec, 100);
    fixture f;
    memset(&f, 0, sizeof f);
    for (size_t r = 0; r < n_rec; r++) {
        struct json_object *rec = json_object_array_get_idx(g, r);
        const char *name = jstr(rec, "template"), *cas = jstr(rec, "case");
        if (strcmp(f.name, name) != 0) {
            free(f.text);
            load_fixture(name, &f);
            tri_chat_format fmt, want;
            cr_assert_eq(tri_chat_template_format(f.text, strlen(f.text), &fmt), TRI_STATUS_OK, "%s: %s", name,
                         tri_last_error());
            cr_assert_eq(tri_chat_format_from_name(f.format, &want), TRI_STATUS_OK);
            cr_assert_eq(fmt, want, "%s recognised as %s, not %s", name, tri_chat_format_name(fmt), f.format);
        }
        tri_chat_message msgs[16];
        size_t n = messages_of(rec, msgs, 16);
        struct json_object *genv;
        cr_assert(json_object_object_get_ex(rec, "add_generation_prompt", &genv));
        bool gen = json_object_get_boolean(genv);
        const char *want = jstr(rec, "output");
        tri_chat_format named;
        cr_assert_eq(tri_chat_format_from_name(f.format, &named), TRI_STATUS_OK);
        for (int pass = 0; pass < 2; pass++) {
            tri_chat_format fmt = pass == 0 ? TRI_CHAT_FORMAT_AUTO : named;
            char buf[4096];
            size_t len = 0;
            tri_status st = tri_chat_render(f.text, fmt, f.bos, f.eos, msgs, n, gen, buf, sizeof buf, &len);
            if (!want) {
                cr_assert_eq(st, TRI_STATUS_INVALID_ARGUMENT, "%s/%s gen=%d: jinja2 raised '%s', we did not", name,
                             cas, gen, jstr(rec, "error"));
                cr_assert(strstr(tri_last_error(), "chat template"), "%s", tri_last_error());
                n_refused += pass == 0;
                continue;
            }
            cr_assert_eq(st, TRI_STATUS_OK, "%s/%s gen=%d: %s", name, cas, gen, tri_last_error());
            cr_assert_eq(len, strlen(want), "%s/%s gen=%d: length %zu, jinja2 %zu\nours:   [%s]\njinja2: [%s]", name,
                         cas, gen, len, strlen(want), buf, want);
            cr_assert_str_eq(buf, want, "%s/%s gen=%d", name, cas, gen);
            n_ok += pass == 0;
        }
    }
    free(f.text);
    json_object_put(g);
    cr_assert_gt(n_ok, 100);
    cr_assert_gt(n_refused, 10);
}

// A named format without a template renders its first published variant: Llama-2's, Mistral
// v0.2's and ChatML's (without a default system message) are the fixtures'.
Test(chat, named_format_without_template) {
    struct json_object *g = golden();
    static const struct {
        const char *tmpl;
        tri_chat_format fmt;
    } cases[] = {{"llama2", TRI_CHAT_FORMAT_LLAMA2}, {"mistral", TRI_CHAT_FORMAT_MISTRAL},
                 {"openhermes", TRI_CHAT_FORMAT_CHATML}, {"llama3", TRI_CHAT_FORMAT_LLAMA3}};
    int checked = 0;
    for (size_t r = 0; r < json_object_array_length(g); r++) {
        struct json_object *rec = json_object_array_get_idx(g, r);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (strcmp(jstr(rec, "template"), cases[c].tmpl) != 0 || !jstr(rec, "output")) continue;
            fixture f;
            load_fixture(cases[c].tmpl, &f);
            tri_chat_message msgs[16];
            size_t n = messages_of(rec, msgs, 16);
            struct json_object *genv;
            json_object_object_get_ex(rec, "add_generation_prompt", &genv);
            char buf[4096];
            size_t len;
            cr_assert_eq(tri_chat_render(NULL, cases[c].fmt, f.bos, f.eos, msgs, n, json_object_get_boolean(genv), buf,
                                         sizeof buf, &len),
                         TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_str_eq(buf, jstr(rec, "output"), "%s/%s", cases[c].tmpl, jstr(rec, "case"));
            free(f.text);
            checked++;
        }
    }
    json_object_put(g);
    cr_assert_gt(checked, 40);
}

Test(chat, unknown_template_is_an_error_that_says_how_to_name_the_format) {
    static const char t[] = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
    tri_chat_format fmt = TRI_CHAT_FORMAT_COUNT;
    cr_assert_eq(tri_chat_template_format(t, strlen(t), &fmt), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "no known format"), "%s", tri_last_error());
    cr_assert(strstr(tri_last_error(), "--chat-format"), "%s", tri_last_error());
    tri_chat_message m = {"user", "hi"};
    char buf[256];
    size_t len;
    // the interpreter runs it (jinja2 gives this text)
    cr_assert_eq(tri_chat_render(t, TRI_CHAT_FORMAT_AUTO, "", "", &m, 1, true, buf, sizeof buf, &len), TRI_STATUS_OK,
                 "%s", tri_last_error());
    cr_assert_str_eq(buf, "### user: hi\n");
    // one the interpreter refuses, of no built-in format: refused, saying how to name a format
    static const char inc[] = "{% include 'chat.jinja' %}";
    cr_assert_eq(tri_chat_render(inc, TRI_CHAT_FORMAT_AUTO, "", "", &m, 1, true, buf, sizeof buf, &len),
                 TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "{% include %} is not supported"), "%s", tri_last_error());
    cr_assert(strstr(tri_last_error(), "--chat-format"), "%s", tri_last_error());
    cr_assert_eq(tri_chat_render(inc, TRI_CHAT_FORMAT_JINJA, "", "", &m, 1, true, buf, sizeof buf, &len),
                 TRI_STATUS_UNSUPPORTED);
    // naming the format renders it whatever the template
    cr_assert_eq(tri_chat_render(t, TRI_CHAT_FORMAT_CHATML, "", "", &m, 1, true, buf, sizeof buf, &len), TRI_STATUS_OK);
    cr_assert_str_eq(buf, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    // Llama-3.1's template (system header with dates) is refused, not rendered wrongly
    static const char l31[] = "{{- bos_token }}{%- set date_string = \"26 Jul 2024\" %}{{- \"<|start_header_id|>system"
                              "<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}";
    cr_assert_eq(tri_chat_template_format(l31, strlen(l31), &fmt), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "Llama-3.1"), "%s", tri_last_error());
}

Test(chat, names_and_sizes) {
    for (int f = 0; f < TRI_CHAT_FORMAT_COUNT; f++) {
        tri_chat_format back;
        cr_assert_eq(tri_chat_format_from_name(tri_chat_format_name((tri_chat_format)f), &back), TRI_STATUS_OK);
        cr_assert_eq(back, f);
    }
    tri_chat_format x;
    cr_assert_eq(tri_chat_format_from_name("vicuna", &x), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "'vicuna'"));
    cr_assert_null(tri_chat_format_name(TRI_CHAT_FORMAT_COUNT));
    tri_chat_message m[] = {{"system", "S"}, {"user", "U"}};
    size_t need = 0, len = 0;
    cr_assert_eq(tri_chat_render(NULL, TRI_CHAT_FORMAT_PHI3, "<s>", "<e>", m, 2, true, NULL, 0, &need), TRI_STATUS_OK);
    const char *want = "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\n";
    cr_assert_eq(need, strlen(want));
    char small[8];
    cr_assert_eq(tri_chat_render(NULL, TRI_CHAT_FORMAT_PHI3, "<s>", "<e>", m, 2, true, small, sizeof small, &len),
                 TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(len, need);
    cr_assert_eq(small[7], 0);
    cr_assert_eq(tri_chat_render(NULL, TRI_CHAT_FORMAT_PHI3, "", "", m, 0, true, small, sizeof small, &len),
                 TRI_STATUS_INVALID_ARGUMENT);
}

// ---- tokenizer_config.json ----

Test(chat, tokenizer_config_string_list_and_tokens) {
    char *t, *b, *e;
    static const char s1[] = "{\"chat_template\": \"{{ bos_token }}[INST]\", \"bos_token\": \"<s>\","
                             " \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false}}";
    cr_assert_eq(tri__chat_from_tokenizer_config("c.json", s1, strlen(s1), &t, &b, &e), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_str_eq(t, "{{ bos_token }}[INST]");
    cr_assert_str_eq(b, "<s>");
    cr_assert_str_eq(e, "</s>");
    free(t), free(b), free(e);
    static const char s2[] = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                             " {\"name\": \"default\", \"template\": \"D\"},"
                             " {\"name\": \"rag\", \"template\": \"R\"}]}";
    cr_assert_eq(tri__chat_from_tokenizer_config("c.json", s2, strlen(s2), &t, &b, &e), TRI_STATUS_OK);
    cr_assert_str_eq(t, "D");
    cr_assert_null(b);
    cr_assert_null(e);
    free(t);
    static const char s3[] = "{\"chat_template\": [{\"name\": \"a\", \"template\": \"A\"}, {\"name\": \"b\", "
                             "\"template\": \"B\"}]}";
    cr_assert_eq(tri__chat_from_tokenizer_config("c.json", s3, strlen(s3), &t, NULL, NULL), TRI_STATUS_OK);
    cr_assert_str_eq(t, "A");
    free(t);
    static const char s4[] = "{\"model_max_length\": 2048}";
    cr_assert_eq(tri__chat_from_tokenizer_config("c.json", s4, strlen(s4), &t, &b, &e), TRI_STATUS_OK);
    cr_assert_null(t);
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"{\"chat_template\": 3}", "'chat_template'"},
        {"{\"chat_template\": [{\"name\": \"a\"}]}", "item 0"},
        {"{\"chat_template\": \"x\", \"bos_token\": 1}", "'bos_token'"},
        {"{\"eos_token\": {\"content\": 1}}", "'eos_token'"},
        {"[1, 2]", "JSON object"},
        {"{\"chat_template\": \"x\"", "c.json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tri__chat_from_tokenizer_config("c.json", bad[i].text, strlen(bad[i].text), &t, &b, &e),
                     TRI_STATUS_BAD_FORMAT, "%s", bad[i].text);
        cr_assert(strstr(tri_last_error(), bad[i].says), "%s: %s", bad[i].text, tri_last_error());
        cr_assert(strstr(tri_last_error(), "c.json"), "%s", tri_last_error());
        cr_assert_null(t);
    }
}

// ---- models ----

// An HF checkpoint reads tokenizer_config.json beside it (template, bos_token, eos_token); a GGUF
// without tokenizer.chat_template has none, and a named format still renders.
Test(chat, model_templates_hf_and_gguf, .timeout = TT_TIMEOUT(120)) {
    const char *gguf = tt_gen_model("chat-model", "--shape tiny");
    char hf[4096];
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    fixture f;
    load_fixture("gemma", &f);
    struct json_object *cfg = json_object_new_object();
    json_object_object_add(cfg, "chat_template", json_object_new_string(f.text));
    json_object_object_add(cfg, "bos_token", json_object_new_string(f.bos));
    struct json_object *eos = json_object_new_object();
    json_object_object_add(eos, "content", json_object_new_string(f.eos));
    json_object_object_add(cfg, "eos_token", eos);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", hf);
    const char *js = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN);
    tt_write_file(path, js, strlen(js));
    json_object_put(cfg);

    tri_model *m;
    cr_assert_eq(tri_model_load(hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_chat_format fmt;
    cr_assert_eq(tri_chat_model_format(m, &fmt), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(fmt, TRI_CHAT_FORMAT_JINJA);
    struct json_object *g = golden();
    int checked = 0;
    for (size_t r = 0; r < json_object_array_length(g); r++) {
        struct json_object *rec = json_object_array_get_idx(g, r);
        if (strcmp(jstr(rec, "template"), "gemma") != 0 || !jstr(rec, "output")) continue;
        tri_chat_message msgs[16];
        size_t n = messages_of(rec, msgs, 16);
        struct json_object *genv;
        json_object_object_get_ex(rec, "add_generation_prompt", &genv);
        char buf[4096];
        size_t len;
        cr_assert_eq(tri_chat_apply(m, TRI_CHAT_FORMAT_AUTO, msgs, n, json_object_get_boolean(genv), buf, sizeof buf,
                                    &len),
                     TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(buf, jstr(rec, "output"));
        checked++;
    }
    cr_assert_gt(checked, 5);
    json_object_put(g);
    free(f.text);
    tri_model_free(m);

    // a broken tokenizer_config.json is an error naming it
    tt_write_file(path, "{\"chat_template\": 7}", 20);
    cr_assert_eq(tri_model_load(hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_chat_model_format(m, &fmt), TRI_STATUS_BAD_FORMAT);
    cr_assert(strstr(tri_last_error(), "tokenizer_config.json"), "%s", tri_last_error());
    tri_model_free(m);

    // a template of no known format: the refusal names the file, then says why, once and legibly
    // (it was formatted into the buffer it read from: issue 41)
    static const char unknown[] =
        "{\"chat_template\": \"{% include 'chat.jinja' %}\"}";  // the interpreter refuses it, no built-in format
    tt_write_file(path, unknown, strlen(unknown));
    cr_assert_eq(tri_model_load(hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    for (int k = 0; k < 2; k++) {
        tri_chat_message hi = {"user", "hi"};
        char out[256];
        size_t n_out;
        tri_status st = k ? tri_chat_apply(m, TRI_CHAT_FORMAT_AUTO, &hi, 1, true, out, sizeof out, &n_out)
                          : tri_chat_model_format(m, &fmt);
        cr_assert_eq(st, TRI_STATUS_UNSUPPORTED, "%s", tri_last_error());
        const char *e = tri_last_error();
        cr_assert(strncmp(e, path, strlen(path)) == 0 && strncmp(e + strlen(path), ": ", 2) == 0, "%s", e);
        const char *why = strstr(e, "no known format");
        cr_assert(why && !strstr(why + 1, "no known format") && strstr(e, "--chat-format"), "%s", e);
        cr_assert(!strstr(e + strlen(path), "tokenizer_config.json"), "the path once: %s", e);
    }
    tri_model_free(m);

    cr_assert_eq(tri_model_load(gguf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_chat_model_format(m, &fmt), TRI_STATUS_NOT_FOUND);
    cr_assert(strstr(tri_last_error(), "no chat template"), "%s", tri_last_error());
    tri_chat_message msg = {"user", "hi"};
    char buf[256];
    size_t len;
    cr_assert_eq(tri_chat_apply(m, TRI_CHAT_FORMAT_AUTO, &msg, 1, true, buf, sizeof buf, &len), TRI_STATUS_NOT_FOUND);
    cr_assert_eq(tri_chat_apply(m, TRI_CHAT_FORMAT_CHATML, &msg, 1, true, buf, sizeof buf, &len), TRI_STATUS_OK);
    cr_assert_str_eq(buf, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    tri_model_free(m);
}

static tri_model *smollm2(void) {
    const char *path = getenv("TRI_TEST_MODEL");
    if (!path || !*path) cr_skip_test("TRI_TEST_MODEL is not set (scripts/get-model.sh fetches SmolLM2-135M-Instruct)");
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

// SmolLM2's GGUF carries a ChatML template with a default system message: rendered with the
// model's own BOS/EOS texts it is the golden smollm2 fixture's jinja2 output.
Test(chat, smollm2_gguf_template, .timeout = TT_TIMEOUT(60)) {
    tri_model *m = smollm2();
    tri_chat_format fmt;
    cr_assert_eq(tri_chat_model_format(m, &fmt), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(fmt, TRI_CHAT_FORMAT_JINJA);
    struct json_object *g = golden();
    int checked = 0;
    for (size_t r = 0; r < json_object_array_length(g); r++) {
        struct json_object *rec = json_object_array_get_idx(g, r);
        if (strcmp(jstr(rec, "template"), "smollm2") != 0 || !jstr(rec, "output")) continue;
        tri_chat_message msgs[16];
        size_t n = messages_of(rec, msgs, 16);
        struct json_object *genv;
        json_object_object_get_ex(rec, "add_generation_prompt", &genv);
        char buf[4096];
        size_t len;
        cr_assert_eq(tri_chat_apply(m, TRI_CHAT_FORMAT_AUTO, msgs, n, json_object_get_boolean(genv), buf, sizeof buf,
                                    &len),
                     TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(buf, jstr(rec, "output"));
        // the prompt is the one the built-in ChatML renderer (the default before the interpreter) gives
        char old[4096];
        cr_assert_eq(
            tri_chat_apply(m, TRI_CHAT_FORMAT_CHATML, msgs, n, json_object_get_boolean(genv), old, sizeof old, &len),
            TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(buf, old);
        checked++;
    }
    cr_assert_gt(checked, 10);
    json_object_put(g);
    // its end-of-turn tokens: <|im_end|> (its EOS, id 2) and <|endoftext|> (id 0)
    int32_t ids[16], n = 0;
    cr_assert_eq(tri_chat_stop_tokens(m, ids, 16, &n), TRI_STATUS_OK);
    bool has_im_end = false, has_eot = false;
    for (int32_t i = 0; i < n; i++) {
        const char *t;
        size_t len;
        cr_assert_eq(tri_token_text(m, ids[i], &t, &len), TRI_STATUS_OK);
        has_im_end |= len == 10 && memcmp(t, "<|im_end|>", 10) == 0;
        has_eot |= len == 13 && memcmp(t, "<|endoftext|>", 13) == 0;
        cr_assert(tri_token_is_special(m, ids[i]));
    }
    cr_assert(has_im_end && has_eot, "%d stop tokens", n);
    cr_assert_eq(ids[0], tri_token_eos(m));
    tri_model_free(m);
}

// ---- stop strings ----

typedef struct run {
    char text[8192];
    size_t n_text;
    size_t before[513];  // text length when each token arrived (the text of the tokens before it)
    int32_t tokens[512];
    int32_t n_tokens;
} run;

static bool run_token(int32_t tok, void *user) {
    run *r = user;
    cr_assert_lt(r->n_tokens, 512);
    r->before[r->n_tokens] = r->n_text;
    r->tokens[r->n_tokens++] = tok;
    return true;
}

static bool run_text(const char *text, size_t len, void *user) {
    run *r = user;
    cr_assert_eq(text[len], 0);
    cr_assert_gt(len, 0);
    cr_assert_lt(r->n_text + len, sizeof r->text);
    memcpy(r->text + r->n_text, text, len);
    r->n_text += len;
    r->text[r->n_text] = 0;
    return true;
}

// Generates greedily after a fixed prompt, in a fresh session or engine.
static void generate(tri_model *m, bool speculative, const char *const *stop, int32_t n_stop,
                     const int32_t *stop_tokens, int32_t n_stop_tokens, run *r) {
    memset(r, 0, sizeof *r);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 256;
    sp.n_threads = 1;
    sp.device_kind = TRI_DEVICE_CPU;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 48;
    gp.stop_at_eos = false;
    gp.stop = stop;
    gp.n_stop = n_stop;
    gp.stop_tokens = stop_tokens;
    gp.n_stop_tokens = n_stop_tokens;
    gp.on_text = run_text;
    gp.text_user = r;
    const int32_t prompt[] = {5, 17, 42, 99, 7, 150, 3};
    if (speculative) {
        tri_spec_params p = tri_spec_default_params();
        p.mode = TRI_SPEC_MODE_DRAFT;
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        const int32_t layers[] = {0};
        p.draft_layers = layers;
        p.n_draft_layers = 1;
        tri_spec *s;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &s), TRI_STATUS_OK, "%s", tri_last_error());
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(s, prompt, 7, &gp, run_token, r, &st), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(st.n_generated, r->n_tokens);
        tri_spec_free(s);
    } else {
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        tri_generate_stats st;
        cr_assert_eq(tri_generate(s, prompt, 7, &gp, run_token, r, &st), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(st.n_generated, r->n_tokens);
        tri_session_free(s);
    }
}

// A stop string spanning a token boundary ends generation at the token that completes it; the
// text is the unstopped run's up to the stop string's first occurrence, and nothing else.
static void check_stop_strings(bool speculative) {
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model("chat-stop", "--shape tiny --vocab 512"), NULL, &m), TRI_STATUS_OK, "%s",
                 tri_last_error());
    static run full, part;
    generate(m, speculative, NULL, 0, NULL, 0, &full);
    cr_assert_eq(full.n_tokens, 48);
    // the text of the unstopped run, token by token: before[t] is its length when token t came
    full.before[full.n_tokens] = full.n_text;
    int checked = 0;
    for (int32_t t = 1; t + 1 < full.n_tokens && checked < 6; t++) {
        size_t b = full.before[t];  // tokens t - 1 and t both wrote text
        if (b < 2 || b + 2 > full.n_text || full.before[t - 1] == b || full.before[t + 1] == b) continue;
        char stop[4] = {full.text[b - 1], full.text[b], full.text[b + 1], 0};  // spans tokens t - 1, t
        if (strlen(stop) != 3) continue;
        const char *first = strstr(full.text, stop);
        size_t at = (size_t)(first - full.text), end = at + 3;
        // the token that completes the first occurrence: the first whose text reaches its end
        int32_t want_tokens = 0;
        while (full.before[want_tokens + 1] < end) want_tokens++;
        want_tokens++;
        const char *stops[] = {"\x01never", stop};
        generate(m, speculative, stops, 2, NULL, 0, &part);
        cr_assert_eq(part.n_text, at, "stop '%s': %zu bytes of text, want %zu", stop, part.n_text, at);
        cr_assert(memcmp(part.text, full.text, at) == 0);
        cr_assert_eq(part.n_tokens, want_tokens, "stop '%s' completes at token %d, ran %d", stop, want_tokens,
                     part.n_tokens);
        cr_assert(memcmp(part.tokens, full.tokens, (size_t)part.n_tokens * sizeof(int32_t)) == 0);
        checked++;
    }
    cr_assert_gt(checked, 2);
    // a stop token ends it at its first occurrence; the token is emitted, its text is not
    int32_t tok = full.tokens[10];
    int32_t at = 0;
    while (full.tokens[at] != tok) at++;
    generate(m, speculative, NULL, 0, &tok, 1, &part);
    cr_assert_eq(part.n_tokens, at + 1);
    cr_assert_eq(part.tokens[at], tok);
    cr_assert_eq(part.n_text, full.before[at]);
    // a stop string that never occurs holds text back only until the end: all of it comes out
    const char *never[] = {"\x02\x03zz"};
    generate(m, speculative, never, 1, NULL, 0, &part);
    cr_assert_eq(part.n_text, full.n_text);
    cr_assert_str_eq(part.text, full.text);
    tri_model_free(m);
}

Test(chat, stop_strings_plain, .timeout = TT_TIMEOUT(120)) {
    check_stop_strings(false);
}

Test(chat, stop_strings_speculative, .timeout = TT_TIMEOUT(120)) {
    check_stop_strings(true);
}

Test(chat, stop_strings_refused_when_bad) {
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model("chat-bad", "--shape tiny"), NULL, &m), TRI_STATUS_OK);
    tri_session *s;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.device_kind = TRI_DEVICE_CPU;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK);
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 4;
    const char *empty[] = {""};
    gp.stop = empty;
    gp.n_stop = 1;
    const int32_t prompt[] = {5, 6};
    cr_assert_eq(tri_generate(s, prompt, 2, &gp, NULL, NULL, NULL), TRI_STATUS_INVALID_ARGUMENT);
    gp.stop = NULL;
    cr_assert_eq(tri_generate(s, prompt, 2, &gp, NULL, NULL, NULL), TRI_STATUS_INVALID_ARGUMENT);
    tri_session_free(s);
    tri_model_free(m);
}
