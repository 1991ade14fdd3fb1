// test-rope-scaling.c - LongRoPE and dynamic NTK against transformers, however the sequence is cut.
//
// transformers computes these two rules' rotary tables from the length of each forward call; we
// compute them per position (rope.h): the token at position p takes the table for length
// max(p + 1, P), P the context's first evaluation, which is what transformers' generate does
// (the prompt in one call, then one token per call), now independent of n_batch pieces,
// speculative verification passes and API evals. The goldens (tests/fixtures/make-rope-scaling.py,
// transformers 4.44.2 at build time) are a Phi-3 longrope checkpoint (original context 32), the
// same with rope_scaling type "su", and a Llama dynamic-NTK one (max_position_embeddings 32), each
// with a 48-token prompt (past 32), its logits in one call and its greedy continuation, and a
// 20-token prompt whose greedy continuation crosses position 32.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test-util.h"
#include "triforce.h"

// |ours - transformers| on any logit: f32 from the same f16 weights, f32 KV; sums in another
// order and the tables' powers rounded once from double (transformers: float32). Logits are of
// order 1 to 10; the goldens' greedy margins are over 1e-2.
#define LOGIT_TOL 1e-4
#define N_CTX 256

typedef struct golden {
    int32_t lng[64], lng_greedy[64], shrt[64], shrt_greedy[64];
    int n_lng, n_lng_greedy, n_shrt, n_shrt_greedy;
    float *logits;  // (n_lng, n_vocab)
} golden;

static const char *fix(const char *kind, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/%s", kind, name);
    return tt_fixture("rope-scaling", rel);
}

// The generator writes a note instead of goldens where torch or transformers is missing.
static void need_goldens(void) {
    tt_need_fixtures("rope-scaling");
    FILE *f = fopen(tt_fixture("rope-scaling", "SKIPPED"), "r");
    if (f) {
        fclose(f);
        cr_skip_test(
            "the rope-scaling goldens need torch and transformers (scripts/install-deps.sh, "
            "scripts/requirements-test.txt)");
    }
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

// kind: the goldens' directory (phi3-su shares phi3's)
static void load_golden(const char *kind, int n_vocab, golden *g) {
    memset(g, 0, sizeof *g);
    char *text = tt_read_file(fix(kind, "golden.txt"), NULL);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int n;
        if ((n = read_ids(line, "long", g->lng)) >= 0) g->n_lng = n;
        if ((n = read_ids(line, "long_greedy", g->lng_greedy)) >= 0) g->n_lng_greedy = n;
        if ((n = read_ids(line, "short", g->shrt)) >= 0) g->n_shrt = n;
        if ((n = read_ids(line, "short_greedy", g->shrt_greedy)) >= 0) g->n_shrt_greedy = n;
    }
    free(text);
    cr_assert(g->n_lng == 48 && g->n_shrt == 20 && g->n_lng_greedy > 0 && g->n_shrt_greedy > 0,
              "%s: golden.txt incomplete", kind);
    size_t len;
    g->logits = tt_read_file(fix(kind, "logits.bin"), &len);
    cr_assert_eq(len, sizeof(float) * (size_t)g->n_lng * (size_t)n_vocab, "%s: logits.bin of %zu bytes", kind, len);
}

static tri_model *load(const char *kind) {
    tri_model *m = NULL;
    const char *path = fix(kind, "hf");
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s: %s", path, tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert(info.config.rope_scaling ==
                  (strcmp(kind, "dynamic") == 0 ? TRI_ROPE_SCALING_DYNAMIC : TRI_ROPE_SCALING_LONGROPE),
              "%s: scaling %d", kind, (int)info.config.rope_scaling);
    return m;
}

static const char *golden_of(const char *kind) { return strcmp(kind, "phi3-su") == 0 ? "phi3" : kind; }

static tri_session_params session_params(int32_t n_batch) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = N_CTX;
    sp.n_batch = n_batch;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F32;
    sp.device_kind = TRI_DEVICE_CPU;
    return sp;
}

static tri_generate_params greedy_params(int n) {
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0;
    return gp;
}

static void check_tokens(const char *what, const int32_t *want, int n, const tt_tokens *c) {
    cr_assert_eq(c->n, n, "%s: %d tokens, want %d", what, c->n, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(c->tok[i], want[i], "%s: token %d is %d, transformers' is %d", what, i, c->tok[i], want[i]);
}

static const int32_t batches[] = {7, 32, 128, 256};
#define N_BATCHES (int)(sizeof batches / sizeof batches[0])

// ---- one call: the logits of the 48-token prompt ----

static void check_logits(const char *kind, int32_t n_batch, int32_t kv_offloaded) {
    tri_model *m = load(kind);
    golden g;
    load_golden(golden_of(kind), 128, &g);
    tri_session_params sp = session_params(n_batch);
    sp.kv_layers_offloaded = kv_offloaded;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, g.lng, g.n_lng, true), TRI_STATUS_OK, "%s", tri_last_error());
    double worst = 0;
    for (int i = 0; i < g.n_lng; i++) {
        const float *row = tri_session_logits(s, i);
        for (int v = 0; v < 128; v++) {
            double d = fabs((double)row[v] - (double)g.logits[i * 128 + v]);
            if (d > worst) worst = d;
            cr_assert(d <= LOGIT_TOL, "%s batch %d: logit (%d, %d) = %g, transformers %g", kind, n_batch, i, v,
                      (double)row[v], (double)g.logits[i * 128 + v]);
        }
    }
    cr_log_info("%s batch %d offloaded %d: largest logit difference %.2e", kind, n_batch, kv_offloaded, worst);
    tri_session_free(s);
    tri_model_free(m);
    free(g.logits);
}

Test(rope_scaling, one_call_logits_every_batch) {
    need_goldens();
    const char *kinds[] = {"phi3", "phi3-su", "dynamic"};
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < N_BATCHES; b++) check_logits(kinds[k], batches[b], 0);
}

// An offloaded KV layer runs a long prefill layer by layer (llama.c): the same logits.
Test(rope_scaling, one_call_logits_layer_major) {
    need_goldens();
    check_logits("phi3", 7, 1);
    check_logits("dynamic", 7, 1);
}

// ---- greedy generation: plain, every n_batch ----

// Both prompts in one session (reset between): transformers' greedy tokens at every batch size.
// Then a first evaluation by tri_session_eval sets the context's length afresh (not the last
// generate's prompt): the short prompt evaluated, continued by tri_generate.
static void check_greedy(const char *kind) {
    tri_model *m = load(kind);
    golden g;
    load_golden(golden_of(kind), 128, &g);
    for (int b = 0; b < N_BATCHES; b++) {
        tri_session_params sp = session_params(batches[b]);
        tri_session *s = NULL;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        char what[64];
        tt_tokens c = {.cap = 64};
        tri_generate_params gp = greedy_params(g.n_lng_greedy);
        cr_assert_eq(tri_generate(s, g.lng, g.n_lng, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        snprintf(what, sizeof what, "%s long, batch %d", kind, batches[b]);
        check_tokens(what, g.lng_greedy, g.n_lng_greedy, &c);

        tri_session_reset(s);
        memset(&c, 0, sizeof c);
        gp = greedy_params(g.n_shrt_greedy);
        cr_assert_eq(tri_generate(s, g.shrt, g.n_shrt, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        snprintf(what, sizeof what, "%s short, batch %d", kind, batches[b]);
        check_tokens(what, g.shrt_greedy, g.n_shrt_greedy, &c);

        tri_session_reset(s);
        memset(&c, 0, sizeof c);
        cr_assert_eq(tri_session_eval(s, g.shrt, g.n_shrt, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_generate(s, NULL, 0, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        snprintf(what, sizeof what, "%s eval + generate, batch %d", kind, batches[b]);
        check_tokens(what, g.shrt_greedy, g.n_shrt_greedy, &c);
        tri_session_free(s);
    }
    tri_model_free(m);
    free(g.logits);
}

Test(rope_scaling, greedy_every_batch_phi3) {
    need_goldens();
    check_greedy("phi3");
    check_greedy("phi3-su");
}

Test(rope_scaling, greedy_every_batch_dynamic) {
    need_goldens();
    check_greedy("dynamic");
}

// ---- every speculative mode at temperature 0: plain greedy, which is transformers' ----

typedef struct spec_case {
    const char *name;
    tri_spec_mode mode;
    tri_spec_drafter drafter;
} spec_case;

static const spec_case spec_cases[] = {
    {"none", TRI_SPEC_MODE_NONE, TRI_SPEC_DRAFTER_MODEL},
    {"draft/model", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_MODEL},
    {"draft/layers", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS},
    {"draft/ngram", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_NGRAM},
    {"retrieval", TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_MODEL},
    {"triforce/model", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL},
    {"triforce/layers", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS},
    {"triforce/ngram", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_NGRAM},
};

// Drafts that often miss: the target itself over a StreamingLLM window of 12 (or its first layer
// alone), a retrieval cache of 16 in chunks of 4; L3 verifies 6 tokens a pass, so passes start
// below position 32 and end past it.
static void check_speculative(const char *kind, int32_t n_batch) {
    tri_model *m = load(kind);
    golden g;
    load_golden(golden_of(kind), 128, &g);
    tri_session_params sp = session_params(n_batch);
    static const int32_t layers[] = {0};
    for (size_t i = 0; i < sizeof spec_cases / sizeof spec_cases[0]; i++) {
        const spec_case *sc = &spec_cases[i];
        tri_spec_params pp = tri_spec_default_params();
        pp.mode = sc->mode;
        pp.drafter = sc->drafter;
        pp.draft_model = sc->drafter == TRI_SPEC_DRAFTER_MODEL ? m : NULL;
        pp.draft_layers = layers;
        pp.n_draft_layers = 1;
        pp.budget = 16;
        pp.chunk = 4;
        pp.draft_window = 12;
        pp.draft_sink = 4;
        pp.gamma1 = 2;
        pp.gamma2 = 6;
        pp.refresh = 8;
        tri_spec *spec = NULL;
        cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK, "%s: %s", sc->name, tri_last_error());
        for (int pr = 0; pr < 2; pr++) {
            const int32_t *prompt = pr ? g.shrt : g.lng, *want = pr ? g.shrt_greedy : g.lng_greedy;
            int n_prompt = pr ? g.n_shrt : g.n_lng, n_want = pr ? g.n_shrt_greedy : g.n_lng_greedy;
            tri_spec_reset(spec);
            tt_tokens c = {.cap = 64};
            tri_generate_params gp = greedy_params(n_want);
            tri_spec_stats st;
            cr_assert_eq(tri_generate_spec(spec, prompt, n_prompt, &gp, tt_collect_upto, &c, &st), TRI_STATUS_OK,
                         "%s: %s", sc->name, tri_last_error());
            char what[96];
            snprintf(what, sizeof what, "%s %s, %s prompt, batch %d", kind, sc->name, pr ? "short" : "long", n_batch);
            check_tokens(what, want, n_want, &c);
            if (sc->mode != TRI_SPEC_MODE_NONE)
                cr_assert(st.n_l3_verify > 0, "%s: %lld verification passes", what, (long long)st.n_l3_verify);
        }
        tri_spec_free(spec);
    }
    tri_model_free(m);
    free(g.logits);
}

Test(rope_scaling, speculative_every_mode_phi3) {
    need_goldens();
    check_speculative("phi3", 7);
    check_speculative("phi3-su", 128);
}

Test(rope_scaling, speculative_every_mode_dynamic) {
    need_goldens();
    check_speculative("dynamic", 7);
    check_speculative("dynamic", 128);
}

// ---- a prompt cache under the length rules (tri_session_save_prompt / load_prompt) ----

static const char *pcache_path(const char *kind, const char *tag) {
    char name[96];
    snprintf(name, sizeof name, "rope-pcache-%s-%s-%d.kv", kind, tag, (int)getpid());
    return tt_tmp(name);
}

// Writes path from a session that evaluated prompt[0 .. n) (its first length P = n).
static void write_cache(tri_model *m, const char *path, const int32_t *prompt, int n) {
    tri_session_params sp = session_params(7);
    tri_session *w = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &w), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(w, prompt, n, false), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_save_prompt(w, path, prompt, n, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(w);
}

// Loads path for prompt (n tokens) into s, expecting reused tokens, then generates greedily: the
// tokens must be transformers' (a fresh run of the whole prompt in one call).
static void load_and_check(tri_session *s, const char *what, const char *path, const int32_t *prompt, int n, int reused,
                           const int32_t *want, int n_want) {
    tri_prompt_cache_stats cs;
    cr_assert_eq(tri_session_load_prompt(s, path, prompt, n, &cs), TRI_STATUS_OK, "%s: %s", what, tri_last_error());
    cr_assert_eq(cs.n_tokens, reused, "%s: %d tokens reused, want %d", what, cs.n_tokens, reused);
    tt_tokens c = {.cap = 64};
    tri_generate_params gp = greedy_params(n_want);
    cr_assert_eq(tri_generate(s, prompt + reused, n - reused, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s: %s",
                 what, tri_last_error());
    check_tokens(what, want, n_want, &c);
}

// The rows of a file were rotated for its writer's first length P; a load is taken only where
// the reader's prompt gives every position the same tables (tri__rope_same_prompt), and what
// follows the loaded prefix is rotated for the reader's whole prompt, whatever the session ran
// before (a session's last P survives tri_session_reset).
static void check_prompt_cache(const char *kind, bool dynamic) {
    tri_model *m = load(kind);
    golden g;
    load_golden(golden_of(kind), 128, &g);
    const char *p12s = strdup(pcache_path(kind, "short12")), *p12l = strdup(pcache_path(kind, "long12"));
    const char *p40 = strdup(pcache_path(kind, "long40")), *p48 = strdup(pcache_path(kind, "long48"));
    write_cache(m, p12s, g.shrt, 12);  // P = 12, within the original context of 32
    write_cache(m, p12l, g.lng, 12);
    write_cache(m, p40, g.lng, 40);  // P = 40, past it
    write_cache(m, p48, g.lng, 48);

    tri_session_params sp = session_params(7);
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tt_tokens c = {.cap = 64};
    tri_generate_params gp = greedy_params(1);
    cr_assert_eq(tri_generate(s, g.lng, g.n_lng, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    char what[96];
    // after a run of P = 48: the short prompt (P = 20) over 12 cached rows
    snprintf(what, sizeof what, "%s: short prompt over 12 cached rows", kind);
    load_and_check(s, what, p12s, g.shrt, g.n_shrt, 12, g.shrt_greedy, g.n_shrt_greedy);
    // after a run of P = 20: the long prompt over rows written under P = 48 (the whole prompt, its logits)
    snprintf(what, sizeof what, "%s: long prompt over its 48 cached rows", kind);
    load_and_check(s, what, p48, g.lng, g.n_lng, g.n_lng, g.lng_greedy, g.n_lng_greedy);
    // rows written under P = 12 (the short tables) do not fit a prompt of 48 (the long ones)
    cr_assert_eq(tri_session_load_prompt(s, p12l, g.lng, g.n_lng, NULL), TRI_STATUS_INVALID_ARGUMENT,
                 "%s: rows of P = 12 loaded for P = 48", kind);
    cr_assert(strstr(tri_last_error(), "rope scaling") && strstr(tri_last_error(), p12l), "%s: %s", kind,
              tri_last_error());
    cr_assert_eq(tri_session_n_past(s), 0, "%s: a refused load leaves the session empty", kind);
    // P = 40 and P = 48: LongRoPE's long factors for both; dynamic NTK's tables for 40 and 48 differ
    if (dynamic) {
        cr_assert_eq(tri_session_load_prompt(s, p40, g.lng, g.n_lng, NULL), TRI_STATUS_INVALID_ARGUMENT,
                     "%s: rows of P = 40 loaded for P = 48", kind);
        cr_assert(strstr(tri_last_error(), "dynamic NTK"), "%s: %s", kind, tri_last_error());
    } else {
        snprintf(what, sizeof what, "%s: long prompt over 40 cached rows", kind);
        load_and_check(s, what, p40, g.lng, g.n_lng, 40, g.lng_greedy, g.n_lng_greedy);
    }
    // and after any of those, a fresh run of the whole prompt still gives transformers' tokens
    tri_session_reset(s);
    memset(&c, 0, sizeof c);
    gp = greedy_params(g.n_lng_greedy);
    cr_assert_eq(tri_generate(s, g.lng, g.n_lng, &gp, tt_collect_upto, &c, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    check_tokens("fresh after loads", g.lng_greedy, g.n_lng_greedy, &c);
    tri_session_free(s);
    const char *paths[] = {p12s, p12l, p40, p48};
    for (int i = 0; i < 4; i++) {
        remove(paths[i]);
        free((void *)paths[i]);
    }
    tri_model_free(m);
    free(g.logits);
}

Test(rope_scaling, prompt_cache_phi3) {
    need_goldens();
    check_prompt_cache("phi3", false);
}

Test(rope_scaling, prompt_cache_dynamic) {
    need_goldens();
    check_prompt_cache("dynamic", true);
}
