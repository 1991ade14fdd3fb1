// test-conformance.c - every supported family in every configuration that changes the arithmetic,
// against transformers' greedy generate, with an f32 and an f16 KV cache.
//
// The cases (tests/fixtures/make-conformance.py, run at build time by transformers 4.44.2 on
// Debian's torch) are tiny random HF checkpoints: tied and untied heads, head_dim != hidden /
// heads, GQA ratios 1, 2, 3, 4 and 8, the rope scalings (linear, dynamic, yarn, llama3, longrope, su)
// below the lengths where they depend on a call's length, sliding windows below the prompt (masked
// by Mistral; unused by Llama, Qwen2 and Phi-3, as in transformers), attention biases. Each case's golden
// holds the greedy ids and each step's top-1 minus top-2 logit margin; the ids must agree over the
// steps whose margin is safe for the KV type (the first step below it ends the comparison: from
// there a rounding may pick the other token). The generator picks seeds whose every margin is safe
// for both, so all steps are compared.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test-util.h"
#include "triforce.h"

#define MAX_STEPS 512  // prompt tokens or greedy steps of a case

// A margin safe for the cache's type: both compute in f32 from the same f16 weights (observed
// differences ~1e-5 logits); an f16 cache rounds keys and values to 11 bits (~1e-3 here).
#define SAFE_MARGIN_F32 1e-3
#define SAFE_MARGIN_F16 2e-2

typedef struct golden {
    int32_t prompt[MAX_STEPS], greedy[MAX_STEPS];
    double margin[MAX_STEPS];
    int n_prompt, n_greedy, n_margin;
} golden;

static const char *case_path(const char *name, const char *file) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/conformance/%s%s%s", getenv("TRI_TEST_FIXTURES"), name, *file ? "/" : "", file);
    return path;
}

// Skips without the reference, or where the generator could not import torch and transformers.
static void need_cases(void) {
    tt_need_fixtures("conformance");
    struct stat sb;
    const char *skipped = case_path("SKIPPED", "");
    if (stat(skipped, &sb) == 0) {
        char *why = tt_read_file(skipped, NULL);
        cr_skip_test("the conformance cases were not made: %s", why);
    }
}

static int read_numbers(const char *line, const char *key, int32_t *ids, double *real) {
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0 || line[k] != ' ') return -1;
    int n = 0;
    const char *p = line + k;
    char *end;
    for (double v = strtod(p, &end); end != p && n < MAX_STEPS; v = strtod(p, &end)) {
        if (ids) ids[n] = (int32_t)v;
        if (real) real[n] = v;
        n++;
        p = end;
    }
    return n;
}

static void load_golden(const char *name, golden *g) {
    memset(g, 0, sizeof *g);
    char *text = tt_read_file(case_path(name, "golden.txt"), NULL);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int n;
        if ((n = read_numbers(line, "prompt", g->prompt, NULL)) >= 0) g->n_prompt = n;
        if ((n = read_numbers(line, "greedy", g->greedy, NULL)) >= 0) g->n_greedy = n;
        if ((n = read_numbers(line, "margin", NULL, g->margin)) >= 0) g->n_margin = n;
    }
    free(text);
    cr_assert(g->n_prompt > 0 && g->n_greedy > 0 && g->n_margin == g->n_greedy, "%s: golden.txt incomplete", name);
}

typedef struct collected {
    int32_t ids[MAX_STEPS];
    int n;
} collected;

static bool collect(int32_t token, void *user) {
    collected *c = user;
    if (c->n < MAX_STEPS) c->ids[c->n++] = token;
    return true;
}

// The model's greedy ids with a kv_type cache against transformers', over the safe steps.
static void check_kv(const char *name, tri_model *m, const golden *g, tri_dtype kv_type) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = g->n_prompt + g->n_greedy;
    sp.n_threads = 1;
    sp.kv_type = kv_type;
    sp.device_kind = TRI_DEVICE_CPU;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s: %s", name, tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = g->n_greedy;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0;
    collected c = {0};
    cr_assert_eq(tri_generate(s, g->prompt, g->n_prompt, &gp, collect, &c, NULL), TRI_STATUS_OK, "%s: %s", name,
                 tri_last_error());
    tri_session_free(s);
    const double safe = kv_type == TRI_DTYPE_F32 ? SAFE_MARGIN_F32 : SAFE_MARGIN_F16;
    const char *kv = tri_dtype_name(kv_type);
    cr_assert_eq(c.n, g->n_greedy, "%s (%s KV): %d tokens, want %d", name, kv, c.n, g->n_greedy);
    int compared = 0;
    for (int i = 0; i < g->n_greedy; i++) {
        cr_assert_eq(c.ids[i], g->greedy[i], "%s (%s KV): step %d: token %d, transformers' %d (margin %.4f)", name, kv,
                     i, c.ids[i], g->greedy[i], g->margin[i]);
        compared++;
        if (g->margin[i] < safe) break;  // the next steps continue from a token a rounding may flip
    }
    cr_log_info("%s (%s KV): %d of %d steps compared", name, kv, compared, g->n_greedy);
}

static void check_case(const char *name, const char *family) {
    need_cases();
    golden g;
    load_golden(name, &g);
    tri_model *m = NULL;
    const char *dir = case_path(name, "");
    cr_assert_eq(tri_model_load(dir, NULL, &m), TRI_STATUS_OK, "%s: %s", dir, tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert_str_eq(info.architecture, family, "%s", name);
    check_kv(name, m, &g, TRI_DTYPE_F32);
    check_kv(name, m, &g, TRI_DTYPE_F16);
    tri_model_free(m);
}

// The cases, as make-conformance.py names them (test cases_listed keeps the two lists equal).
#define CASES(X)                                                                                                \
    X(llama_untied, "llama-untied", "llama") X(llama_tied, "llama-tied", "llama")                              \
    X(llama_gqa1, "llama-gqa1", "llama") X(llama_gqa4, "llama-gqa4", "llama") X(llama_gqa8, "llama-gqa8", "llama") \
    X(llama_attention_bias, "llama-attention-bias", "llama") X(llama_window_unused, "llama-window-unused", "llama") \
    X(llama_rope_linear, "llama-rope-linear", "llama") X(llama_rope_dynamic, "llama-rope-dynamic", "llama")     \
    X(llama_rope_yarn, "llama-rope-yarn", "llama") X(llama_rope_yarn_attn, "llama-rope-yarn-attn", "llama")     \
    X(llama_rope_llama3, "llama-rope-llama3", "llama")                                                         \
    X(mistral_window, "mistral-window", "mistral") X(mistral_head_dim, "mistral-head-dim", "mistral")           \
    X(mistral_tied_gqa8, "mistral-tied-gqa8", "mistral")                                                       \
    X(qwen2_untied, "qwen2-untied", "qwen2") X(qwen2_tied_gqa4, "qwen2-tied-gqa4", "qwen2")                    \
    X(qwen2_window_unused, "qwen2-window-unused", "qwen2") X(qwen2_gqa3, "qwen2-gqa3", "qwen2")                \
    X(phi3_mha, "phi3-mha", "phi3") X(phi3_gqa2_window_unused, "phi3-gqa2-window-unused", "phi3")               \
    X(phi3_longrope, "phi3-longrope", "phi3") X(phi3_su_tied, "phi3-su-tied", "phi3")                          \
    X(gemma_untied_gqa8, "gemma-untied-gqa8", "gemma") X(gemma_tied, "gemma-tied", "gemma")                    \
    X(gemma_default_tie, "gemma-default-tie", "gemma") X(gemma_attention_bias, "gemma-attention-bias", "gemma") \
    X(gemma_mha, "gemma-mha", "gemma")

#define TEST_CASE(id, name, family) \
    Test(conformance, id) { check_case(name, family); }
CASES(TEST_CASE)

// Every case the generator made has a test above, and every test a case.
Test(conformance, cases_listed) {
    need_cases();
#define NAME(id, name, family) name,
    static const char *const names[] = {CASES(NAME)};
#undef NAME
    const int n_names = (int)(sizeof names / sizeof names[0]);
    char *text = tt_read_file(case_path("cases.txt", ""), NULL);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        bool found = false;
        for (int i = 0; i < n_names; i++) found = found || strcmp(names[i], line) == 0;
        cr_assert(found, "case '%s' of make-conformance.py has no test in test-conformance.c", line);
        n++;
    }
    free(text);
    cr_assert_eq(n, n_names, "make-conformance.py made %d cases, test-conformance.c lists %d", n, n_names);
}
