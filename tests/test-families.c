// test-families.c - Qwen2, Mistral, Phi-3, Gemma and Qwen3 against transformers, from GGUF and from HF.
//
// The golden files (tests/fixtures/families/<family>/, written by
// tests/reference/make_family_fixtures.py with transformers 4.44.2, Qwen3's with 4.51.3, and
// committed; CI needs no torch) hold a tiny random model of each family in both formats, transformers' logits of a
// prompt (one call) and its greedy tokens (generate: the prompt in one call, then one token per
// call). Each family and format must give those greedy tokens exactly and those logits within
// LOGIT_TOL. Mistral (window 5) runs to position 29 with and without offloaded KV layers and
// through the speculative engine; Phi-3 (original context 16) crosses its LongRoPE boundary
// while generating and runs its logits prompt (20 tokens) past it.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf-config.h"
#include "test-util.h"
#include "triforce.h"

// |ours - transformers| on any logit: both compute in f32 from the same f16 weights; what
// differs is the order of the sums and our f32 rope angles (observed: at most 1.4e-5 (phi3); the logits are
// of order 1 to 10).
#define LOGIT_TOL 1e-4
// With an f16 cache: keys and values rounded to f16 (relative 2^-11) move logits of order 1 to 10
// by up to ~1e-2; the greedy tokens stay exact where the goldens' top-2 margins (min_margin, at
// least 0.02 for the families run with it) are above that.
#define LOGIT_TOL_F16 1e-2

typedef struct golden {
    int32_t prompt[64], greedy[64], lprompt[64];
    int n_prompt, n_greedy, n_lprompt;
    float *logits;  // (n_lprompt, n_vocab)
} golden;

static const char *fam_path(const char *family, const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/fixtures/families/%s/%s", getenv("TRI_TEST_SRC"), family, name);
    return path;
}

static int read_ids(const char *line, const char *key, int32_t *out) {
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0 || line[k] != ' ') return -1;
    int n = 0;
    const char *p = line + k;
    char *end;
    for (long v = strtol(p, &end, 10); end != p && n < 64; v = strtol(p, &end, 10)) {
        out[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

static void load_golden(const char *family, int n_vocab, golden *g) {
    memset(g, 0, sizeof *g);
    char *text = tt_read_file(fam_path(family, "golden.txt"), NULL);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int n;
        if ((n = read_ids(line, "prompt", g->prompt)) >= 0) g->n_prompt = n;
        if ((n = read_ids(line, "greedy", g->greedy)) >= 0) g->n_greedy = n;
        if ((n = read_ids(line, "logits_prompt", g->lprompt)) >= 0) g->n_lprompt = n;
    }
    free(text);
    cr_assert(g->n_prompt > 0 && g->n_greedy > 0 && g->n_lprompt > 0, "%s: golden.txt incomplete", family);
    size_t len;
    g->logits = tt_read_file(fam_path(family, "logits.bin"), &len);
    cr_assert_eq(len, sizeof(float) * (size_t)g->n_lprompt * (size_t)n_vocab, "%s: logits.bin of %zu bytes", family,
                 len);
}

static tri_model *load(const char *family, bool hf) {
    tri_model *m = NULL;
    const char *path = fam_path(family, hf ? "hf" : "model.gguf");
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s: %s", path, tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    // Mistral's GGUF is "llama" (as llama.cpp writes it) with llama.attention.sliding_window; a
    // fixture named <family>-<case> is of its family
    const char *want = !hf && strcmp(family, "mistral") == 0 ? "llama"
                       : strncmp(family, "qwen3", 5) == 0    ? "qwen3"
                                                             : family;
    cr_assert_str_eq(info.architecture, want);
    return m;
}

static tri_session_params session_params(void) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F32;  // the goldens' margins are ~1e-2; an f16 cache adds ~1e-3
    sp.device_kind = TRI_DEVICE_CPU;
    return sp;
}

typedef struct collected {
    int32_t ids[64];
    int n;
} collected;

static bool collect(int32_t token, void *user) {
    collected *c = user;
    if (c->n < 64) c->ids[c->n++] = token;
    return true;
}

static tri_generate_params greedy_params(int n) {
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0;
    return gp;
}

static void check_tokens(const char *what, const golden *g, const collected *c) {
    cr_assert_eq(c->n, g->n_greedy, "%s: %d tokens, want %d", what, c->n, g->n_greedy);
    for (int i = 0; i < g->n_greedy; i++)
        cr_assert_eq(c->ids[i], g->greedy[i], "%s: token %d is %d, transformers' is %d", what, i, c->ids[i],
                     g->greedy[i]);
}

// Logits of the prompt in one call, and greedy tokens, against transformers', with the cache type
// kv_type (f32: within LOGIT_TOL; f16: within LOGIT_TOL_F16).
static void check_family_kv(const char *family, bool hf, tri_dtype kv_type) {
    tri_model *m = load(family, hf);
    tri_model_info info;
    tri_model_get_info(m, &info);
    const int V = info.config.n_vocab;
    golden g;
    load_golden(family, V, &g);
    tri_session_params sp = session_params();
    sp.kv_type = kv_type;
    const double tol = kv_type == TRI_DTYPE_F16 ? LOGIT_TOL_F16 : LOGIT_TOL;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());

    cr_assert_eq(tri_session_eval(s, g.lprompt, g.n_lprompt, true), TRI_STATUS_OK, "%s", tri_last_error());
    double worst = 0;
    for (int i = 0; i < g.n_lprompt; i++) {
        const float *row = tri_session_logits(s, i);
        for (int v = 0; v < V; v++) {
            double d = fabs((double)row[v] - (double)g.logits[(size_t)i * V + v]);
            if (d > worst) worst = d;
            cr_assert(d <= tol, "%s %s %s KV: logit (%d, %d) = %g, transformers %g", family, hf ? "hf" : "gguf",
                      tri_dtype_name(kv_type), i, v, (double)row[v], (double)g.logits[(size_t)i * V + v]);
        }
    }
    cr_log_info("%s %s %s KV: largest logit difference %.2e", family, hf ? "hf" : "gguf", tri_dtype_name(kv_type),
                worst);

    tri_session_reset(s);
    collected c = {0};
    tri_generate_params gp = greedy_params(g.n_greedy);
    cr_assert_eq(tri_generate(s, g.prompt, g.n_prompt, &gp, collect, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    check_tokens(hf ? "hf" : "gguf", &g, &c);
    tri_session_free(s);
    tri_model_free(m);
    free(g.logits);
}

static void check_family(const char *family, bool hf) { check_family_kv(family, hf, TRI_DTYPE_F32); }

Test(families, qwen2_gguf) { check_family("qwen2", false); }
Test(families, qwen2_hf) { check_family("qwen2", true); }
Test(families, mistral_gguf) { check_family("mistral", false); }
Test(families, mistral_hf) { check_family("mistral", true); }
Test(families, phi3_gguf) { check_family("phi3", false); }
Test(families, phi3_hf) { check_family("phi3", true); }
Test(families, gemma_gguf) { check_family("gemma", false); }
Test(families, gemma_hf) { check_family("gemma", true); }

// Qwen3: per-head q and k norms; GQA 2 with head_dim 16 over hidden 32 and 4 heads, untied; and
// GQA 4, tied, YaRN (factor 4 over an original context of 16) to position 29.
Test(families, qwen3_gguf) { check_family("qwen3", false); }
Test(families, qwen3_hf) { check_family("qwen3", true); }
Test(families, qwen3_tied_yarn_gguf) { check_family("qwen3-tied-yarn", false); }
Test(families, qwen3_tied_yarn_hf) { check_family("qwen3-tied-yarn", true); }
Test(families, qwen3_f16_kv) {
    check_family_kv("qwen3", false, TRI_DTYPE_F16);
    check_family_kv("qwen3", true, TRI_DTYPE_F16);
    check_family_kv("qwen3-tied-yarn", false, TRI_DTYPE_F16);
    check_family_kv("qwen3-tied-yarn", true, TRI_DTYPE_F16);
}

// Every speculative mode and drafter over the family's fixture gives transformers' greedy tokens
// (greedy verification emits plain decoding's): TriForce with the target itself as the drafter,
// with a self-draft of its first layer, with n-gram lookup and with token trees; retrieval; draft.
// Also with an offloaded KV layer half attended on the host, and the plain session so offloaded.
static void check_speculative(const char *family, bool hf, bool trees) {
    tri_model *m = load(family, hf);
    golden g;
    load_golden(family, 128, &g);
    tri_session_params sp = session_params();
    static const int32_t first_layer[1] = {0};
    static const struct {
        tri_spec_mode mode;
        tri_spec_drafter drafter;
        int32_t tree_nodes, kv_off;
    } runs[] = {
        {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL, 0, 0},
        {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS, 0, 0},
        {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_NGRAM, 0, 0},
        {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL, 8, 0},
        {TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_MODEL, 0, 0},
        {TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_MODEL, 0, 0},
        {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL, 0, 1},
        {TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS, 8, 1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (runs[i].tree_nodes && !trees) continue;
        tri_spec_params pp = tri_spec_default_params();
        pp.mode = runs[i].mode;
        pp.drafter = runs[i].drafter;
        pp.draft_model = m;  // the target itself, over its StreamingLLM cache
        pp.draft_layers = first_layer;
        pp.n_draft_layers = 1;
        pp.budget = 16;
        pp.chunk = 4;
        pp.draft_window = 8;
        pp.draft_sink = 2;
        pp.gamma1 = 2;
        pp.gamma2 = 4;
        pp.tree_nodes = runs[i].tree_nodes;
        sp.kv_layers_offloaded = runs[i].kv_off;
        sp.kv_host_fraction = runs[i].kv_off ? 0.5 : 0.0;
        tri_spec *spec = NULL;
        cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK, "%s run %zu: %s", family, i, tri_last_error());
        collected c = {0};
        tri_generate_params gp = greedy_params(g.n_greedy);
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(spec, g.prompt, g.n_prompt, &gp, collect, &c, &st), TRI_STATUS_OK,
                     "%s run %zu: %s", family, i, tri_last_error());
        char what[64];
        snprintf(what, sizeof what, "%s speculative run %zu", family, i);
        check_tokens(what, &g, &c);
        cr_assert(st.n_l3_verify > 0);
        tri_spec_free(spec);
    }
    sp.kv_layers_offloaded = 1;
    sp.kv_host_fraction = 0.5;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    collected c = {0};
    tri_generate_params gp = greedy_params(g.n_greedy);
    cr_assert_eq(tri_generate(s, g.prompt, g.n_prompt, &gp, collect, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    check_tokens("offloaded", &g, &c);
    tri_session_free(s);
    tri_model_free(m);
    free(g.logits);
}

Test(families, qwen3_speculative) {
    check_speculative("qwen3", false, true);
    check_speculative("qwen3-tied-yarn", true, true);
}

// Gemma 2: soft-capped scores (cap 2) and logits (cap 5), scores scaled by 24^-1/2 (head_dim 16),
// a window of 4 on layers 0 and 2 below the 6-token prompt and the 12-token logits prompt,
// four norms a block; 24 greedy tokens to position 29. Every speculative mode and drafter past the
// window, offloaded and split too; token trees over a window are refused (as Mistral's).
Test(families, gemma2_gguf) { check_family("gemma2", false); }
Test(families, gemma2_hf) { check_family("gemma2", true); }
Test(families, gemma2_f16_kv) {
    check_family_kv("gemma2", false, TRI_DTYPE_F16);
    check_family_kv("gemma2", true, TRI_DTYPE_F16);
}
Test(families, gemma2_speculative) {
    check_speculative("gemma2", false, false);
    check_speculative("gemma2", true, false);
}
// Token trees with soft-capped scores: the Gemma 2 fixture without its window (sliding_window null
// in a copy of its config.json), where trees are allowed; TriForce's tree and a self-drafting tree
// with an offloaded KV layer half attended on the host give plain greedy decoding's tokens.
Test(families, gemma2_trees_without_window) {
    char dir[2048], st_file[2048], cfg_file[2048], cmd[20000];
    int n = snprintf(dir, sizeof dir, "%s", tt_tmp("gemma2-nowindow"));
    n |= snprintf(st_file, sizeof st_file, "%s", fam_path("gemma2", "hf/model.safetensors"));
    n |= snprintf(cfg_file, sizeof cfg_file, "%s", fam_path("gemma2", "hf/config.json"));
    int nc = snprintf(cmd, sizeof cmd,
                      "rm -rf '%s' && mkdir -p '%s' && cp '%s' '%s/' && "
                      "sed 's/\"sliding_window\": 4/\"sliding_window\": null/' '%s' > '%s/config.json'",
                      dir, dir, st_file, dir, cfg_file, dir);
    cr_assert(n > 0 && n < 2048 && nc > 0 && nc < (int)sizeof cmd, "paths too long");
    cr_assert_eq(system(cmd), 0);
    tri_model *m = NULL;
    cr_assert_eq(tri_model_load(dir, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert_eq(info.config.sliding_window, 0);
    golden g;
    load_golden("gemma2", 128, &g);
    tri_session_params sp = session_params();
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    collected plain = {0};
    tri_generate_params gp = greedy_params(g.n_greedy);
    cr_assert_eq(tri_generate(s, g.prompt, g.n_prompt, &gp, collect, &plain, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri_session_free(s);
    static const int32_t first_layer[1] = {0};
    for (int r = 0; r < 2; r++) {
        tri_spec_params pp = tri_spec_default_params();
        pp.mode = r ? TRI_SPEC_MODE_DRAFT : TRI_SPEC_MODE_TRIFORCE;
        pp.drafter = r ? TRI_SPEC_DRAFTER_LAYERS : TRI_SPEC_DRAFTER_MODEL;
        pp.draft_model = m;
        pp.draft_layers = first_layer;
        pp.n_draft_layers = 1;
        pp.budget = 16;
        pp.chunk = 4;
        pp.draft_window = 8;
        pp.draft_sink = 2;
        pp.gamma1 = 2;
        pp.gamma2 = 4;
        pp.tree_nodes = 8;
        sp.kv_layers_offloaded = r;
        sp.kv_host_fraction = r ? 0.5 : 0.0;
        tri_spec *spec = NULL;
        cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK, "%s", tri_last_error());
        collected c = {0};
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(spec, g.prompt, g.n_prompt, &gp, collect, &c, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(c.n, plain.n);
        for (int i = 0; i < plain.n; i++)
            cr_assert_eq(c.ids[i], plain.ids[i], "tree run %d: token %d is %d, plain decoding's %d", r, i, c.ids[i],
                         plain.ids[i]);
        cr_assert(st.n_l3_tree_nodes > 0, "run %d verified no tree", r);
        tri_spec_free(spec);
    }
    tri_model_free(m);
    free(g.logits);
}

Test(families, gemma2_tree_refused) {
    tri_model *m = load("gemma2", false);
    tri_session_params sp = session_params();
    tri_spec_params pp = tri_spec_default_params();
    pp.draft_model = m;
    pp.tree_nodes = 8;
    tri_spec *spec = NULL;
    cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "tree_nodes") && strstr(tri_last_error(), "sliding-window"), "%s",
              tri_last_error());
    cr_assert_null(spec);
    tri_model_free(m);
}

// ---- Mistral's window with the rest of the runtime ----

// Offloaded KV layers (streamed, and half attended on the host where it lies): past the window
// every row streams and the queries attend over their windows; same tokens.
Test(families, mistral_offloaded_kv) {
    for (int hf = 0; hf < 2; hf++) {
        tri_model *m = load("mistral", hf);
        golden g;
        load_golden("mistral", 128, &g);
        tri_session_params sp = session_params();
        sp.kv_layers_offloaded = 1;
        sp.kv_host_fraction = 0.5;
        tri_session *s = NULL;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        collected c = {0};
        tri_generate_params gp = greedy_params(g.n_greedy);
        cr_assert_eq(tri_generate(s, g.prompt, g.n_prompt, &gp, collect, &c, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        check_tokens("offloaded", &g, &c);
        tri_session_free(s);
        tri_model_free(m);
        free(g.logits);
    }
}

// The speculative engine: L1 a StreamingLLM cache, L2 retrieval, L3 the full cache, each level
// masking the window over the positions it attends at; greedy verification makes the emitted
// tokens plain decoding's, which are transformers'. Also the retrieval and draft-only modes.
Test(families, mistral_speculative) {
    tri_model *m = load("mistral", false);
    golden g;
    load_golden("mistral", 128, &g);
    tri_session_params sp = session_params();
    const tri_spec_mode modes[] = {TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_MODE_DRAFT};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        tri_spec_params pp = tri_spec_default_params();
        pp.mode = modes[i];
        pp.draft_model = m;  // the target itself, over its StreamingLLM cache
        pp.budget = 16;
        pp.chunk = 4;
        pp.draft_window = 8;
        pp.draft_sink = 2;
        pp.gamma1 = 2;
        pp.gamma2 = 4;
        tri_spec *spec = NULL;
        cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK, "%s", tri_last_error());
        collected c = {0};
        tri_generate_params gp = greedy_params(g.n_greedy);
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(spec, g.prompt, g.n_prompt, &gp, collect, &c, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        check_tokens("speculative", &g, &c);
        cr_assert(st.n_l3_verify > 0);
        tri_spec_free(spec);
    }
    tri_model_free(m);
    free(g.logits);
}

// A policy that accumulates attention per key (H2O) cannot be split into the per-query windows:
// refused past the window, not computed over keys the window hides.
Test(families, mistral_h2o_refused) {
    tri_model *m = load("mistral", true);
    tri_session_params sp = session_params();
    sp.kv_policy = TRI_KV_POLICY_H2O;
    sp.kv_budget = 16;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    cr_assert_eq(tri_session_eval(s, toks, 12, false), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "sliding window"), "%s", tri_last_error());
    tri_session_free(s);
    tri_model_free(m);
}

// ---- what is refused, by name ----

static void write_text(const char *path, const char *text) { tt_write_file(path, text, strlen(text)); }

// A config.json of another model type, or with a feature no family computes, is refused naming
// the file, the field and the feature.
static void refused_config(const char *tag, const char *json, const char *field, const char *feature) {
    char dir[4096], cmd[20000];
    snprintf(dir, sizeof dir, "%s", tt_tmp(tag));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s' '%s/'", dir, dir,
             fam_path("qwen2", "hf/model.safetensors"), dir);
    cr_assert_eq(system(cmd), 0);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_text(cfg, json);
    tri_model *m = NULL;
    cr_assert_eq(tri_model_load(dir, NULL, &m), TRI_STATUS_UNSUPPORTED, "%s: %s", tag, tri_last_error());
    cr_assert_null(m);
    const char *e = tri_last_error();
    cr_assert(strstr(e, "config.json") && strstr(e, field) && strstr(e, feature), "%s: message '%s'", tag, e);
}

#define BASE "\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2, " \
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64, "       \
             "\"rms_norm_eps\": 1e-5"

Test(families, refusals) {
    refused_config("gemma3", "{\"model_type\": \"gemma3_text\", " BASE "}", "model_type", "gemma3_text");
    refused_config("mixtral", "{\"architectures\": [\"MixtralForCausalLM\"], " BASE "}", "architectures", "Mixtral");
    // the unsupported relatives by name, with what they compute that no family here does
    refused_config("gemma3-arch",
                   "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", " BASE "}",
                   "'Gemma3ForCausalLM' is unsupported", "Gemma 3: QK-norm");
    refused_config("mixtral-moe",
                   "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", " BASE "}",
                   "'MixtralForCausalLM' is unsupported", "mixture of experts");
    refused_config("qwen2-moe",
                   "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\", " BASE "}",
                   "'Qwen2MoeForCausalLM' is unsupported", "Qwen2-MoE: a mixture of experts");
    refused_config("qwen2-moe-type", "{\"model_type\": \"qwen2_moe\", " BASE "}", "'qwen2_moe' is unsupported",
                   "mixture of experts");
    // attention_bias where the family's transformers class has no such biases; mlp_bias anywhere
    refused_config("qwen2-attn-bias", "{\"model_type\": \"qwen2\", \"attention_bias\": true, " BASE "}",
                   "attention_bias", "qwen2 has no attention biases");
    refused_config("mistral-attn-bias", "{\"model_type\": \"mistral\", \"attention_bias\": true, " BASE "}",
                   "attention_bias", "mistral has no attention biases");
    refused_config("awq", "{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"awq\"}, " BASE "}",
                   "quantization_config", "'awq'");
    refused_config("llama-mlp-bias", "{\"model_type\": \"llama\", \"mlp_bias\": true, " BASE "}", "mlp_bias",
                   "feed-forward biases are unsupported");
    refused_config("softcap", "{\"model_type\": \"gemma\", \"head_dim\": 8, \"final_logit_softcapping\": 30.0, " BASE "}",
                   "final_logit_softcapping", "soft-capping");
    refused_config("moe", "{\"model_type\": \"qwen2\", \"num_experts\": 8, " BASE "}", "num_experts", "mixture of experts");
    refused_config("qwen2-window", "{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 4, " BASE "}",
                   "use_sliding_window", "sliding-window");
    refused_config("qwen3-window",
                   "{\"model_type\": \"qwen3\", \"use_sliding_window\": true, \"sliding_window\": 4, " BASE "}",
                   "use_sliding_window", "sliding-window");
    refused_config("phi3-yarn",
                   "{\"model_type\": \"phi3\", \"original_max_position_embeddings\": 16, \"rope_scaling\": {\"type\": "
                   "\"yarn\", \"short_factor\": [1,1], \"long_factor\": [1,1]}, " BASE "}",
                   "rope_scaling.type", "yarn");
    refused_config("gemma-gelu", "{\"model_type\": \"gemma\", \"hidden_activation\": \"gelu\", " BASE "}",
                   "hidden_activation", "gelu");
    refused_config("gemma2-gelu", "{\"model_type\": \"gemma2\", \"hidden_activation\": \"gelu\", " BASE "}",
                   "hidden_activation", "gelu");
    refused_config("rope-type", "{\"model_type\": \"mistral\", \"rope_scaling\": {\"rope_type\": \"longrope2\", \"factor\": 2}, " BASE "}",
                   "rope_scaling.rope_type", "longrope2");
}

// A GGUF of an architecture no family reads names it and the ones that load.
Test(families, gguf_unknown_arch) {
    const char *path = tt_tmp("arch-gemma2.gguf");
    char cmd[10000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", fam_path("gemma", "model.gguf"), path);
    cr_assert_eq(system(cmd), 0);
    // the architecture string is "gemma" (5 bytes) at its first occurrence: make it "gemmb"
    size_t len;
    char *data = tt_read_file(path, &len);
    char *p = memmem(data, len, "gemma", 5);
    cr_assert(p);
    p[4] = 'b';
    tt_write_file(path, data, len);
    free(data);
    tri_model *m = NULL;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "general.architecture") && strstr(tri_last_error(), "gemmb") &&
                  strstr(tri_last_error(), "qwen2"),
              "%s", tri_last_error());
}

// transformers' defaults where config.json says nothing: Mistral's window 4096 (null: none),
// Gemma's head_dim 256; and the families' names.
Test(families, config_defaults) {
    tri_model_config c;
    char *arch;
    const char *mistral = "{\"model_type\": \"mistral\", " BASE "}";
    cr_assert_eq(tri__hf_config_parse("m.json", mistral, strlen(mistral), &c, &arch), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_str_eq(arch, "mistral");
    free(arch);
    const char *none = "{\"model_type\": \"mistral\", \"sliding_window\": null, " BASE "}";
    cr_assert_eq(tri__hf_config_parse("m.json", none, strlen(none), &c, NULL), TRI_STATUS_OK);
    cr_assert_eq(c.sliding_window, 0);
    const char *gemma = "{\"model_type\": \"gemma\", " BASE "}";
    cr_assert_eq(tri__hf_config_parse("g.json", gemma, strlen(gemma), &c, &arch), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(c.head_dim, 256);
    cr_assert(c.tied_embeddings);
    cr_assert_str_eq(arch, "gemma");
    free(arch);
    const char *gemma_untied = "{\"model_type\": \"gemma\", \"tie_word_embeddings\": false, " BASE "}";
    cr_assert_eq(tri__hf_config_parse("g.json", gemma_untied, strlen(gemma_untied), &c, NULL), TRI_STATUS_OK);
    cr_assert(!c.tied_embeddings, "Gemma's tie_word_embeddings false is honoured");
    const char *llama = "{\"model_type\": \"llama\", " BASE "}";
    cr_assert_eq(tri__hf_config_parse("l.json", llama, strlen(llama), &c, NULL), TRI_STATUS_OK);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert(!c.tied_embeddings);
    // Qwen3Config: head_dim 128, an untied head, no window unless use_sliding_window
    const char *qwen3 = "{\"model_type\": \"qwen3\", \"sliding_window\": 4, " BASE "}";
    cr_assert_eq(tri__hf_config_parse("q.json", qwen3, strlen(qwen3), &c, &arch), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(c.head_dim, 128);
    cr_assert(!c.tied_embeddings);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_str_eq(arch, "qwen3");
    free(arch);
    // Gemma2Config: head_dim 256, window 4096 (null: none), tied
    const char *gemma2 = "{\"model_type\": \"gemma2\", " BASE "}";
    cr_assert_eq(tri__hf_config_parse("g.json", gemma2, strlen(gemma2), &c, &arch), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(c.head_dim, 256);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert(c.tied_embeddings);
    cr_assert_str_eq(arch, "gemma2");
    free(arch);
    const char *gemma2_nowin = "{\"model_type\": \"gemma2\", \"sliding_window\": null, " BASE "}";
    cr_assert_eq(tri__hf_config_parse("g.json", gemma2_nowin, strlen(gemma2_nowin), &c, NULL), TRI_STATUS_OK);
    cr_assert_eq(c.sliding_window, 0);
    // a soft-cap or scalar that is not a positive number is refused naming its field
    const char *bad[] = {"{\"model_type\": \"gemma2\", \"attn_logit_softcapping\": -1, " BASE "}",
                         "{\"model_type\": \"gemma2\", \"final_logit_softcapping\": \"30\", " BASE "}",
                         "{\"model_type\": \"gemma2\", \"query_pre_attn_scalar\": 0, " BASE "}"};
    const char *field[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tri__hf_config_parse("g.json", bad[i], strlen(bad[i]), &c, NULL), TRI_STATUS_BAD_FORMAT);
        cr_assert(strstr(tri_last_error(), "g.json") && strstr(tri_last_error(), field[i]), "%s", tri_last_error());
    }
    // transformers' LlamaModel never masks a window: neither do we
    const char *llama_window = "{\"model_type\": \"llama\", \"sliding_window\": 4, " BASE "}";
    cr_assert_eq(tri__hf_config_parse("l.json", llama_window, strlen(llama_window), &c, NULL), TRI_STATUS_OK);
    cr_assert_eq(c.sliding_window, 0);
}
