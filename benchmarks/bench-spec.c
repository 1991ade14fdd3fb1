// bench-spec.c - acceptance rates and tokens per full-cache verification of each speculative mode
// and drafter, after a long prompt, at temperatures 0 and 0.6 (top-p 0.9), as a table in the shape
// of TriForce's Table 2.
//
// usage: bench-spec MODEL IDS [--n-prompt N] [--n-gen N] [--threads N] [--draft-layers LIST]
//                   [--ngram N] [--gamma1 N] [--gamma2 N] [--budget LIST] [--budgets LIST]
//                   [--window N] [--temps 0|0.6|both] [--draft MODEL] [--modes LIST]
// IDS: the prompt's token ids, as text (one per line, scripts/tokenize-gguf.py) or little-endian
// int32 (benchmarks/tokenize-gguf.py). --budgets: the retrieval -> full rows (default
// 256,512,1024); --budget: TRIFORCE's L2, one or a list (default 512); --window: L1's
// StreamingLLM cache (default 256, 16 sinks); --draft: a separate draft model (same vocabulary)
// adds draft -> full and TRIFORCE rows with it as L1. --modes: a comma-separated subset of
// layers, ngram, retrieval, triforce (default all; plain decoding always runs first).
//
// Checks first: at temperature 0 every mode must emit exactly the tokens plain decoding emits.
// Then, per row, the speed against plain decoding at the same temperature (x plain: plain's
// ms/token over the row's) and whether the mode pays on this machine; the modes that do not are
// listed at the end. With --threads 1 the comparison uses the process's CPU time from the first
// generated token to the last (CPU ms / token), which other jobs on a shared machine barely move,
// instead of wall time; the wall figure is printed beside it either way.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "triforce.h"
#include "bench-util.h"

typedef struct run_out {
    int32_t tok[1024];
    int32_t n;
    double cpu_first, cpu_last;  // process CPU seconds at the first and the last token
} run_out;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool on_token(int32_t tok, void *user) {
    run_out *r = user;
    r->cpu_last = cpu_seconds();
    if (r->n == 0) r->cpu_first = r->cpu_last;
    if (r->n < 1024) r->tok[r->n++] = tok;
    return true;
}

// "0-5,7,9,20-29" -> indices; returns the count.
static int32_t parse_layers(const char *s, int32_t *out, int32_t cap) {
    int32_t n = 0;
    while (*s && n < cap) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long i = a; i <= b && n < cap; i++) out[n++] = (int32_t)i;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') break;
    }
    return n;
}

static void machine(void) {
    struct utsname u;
    char model[512] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                snprintf(model, sizeof model, "%s", c ? c + 2 : line);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    uname(&u);
    printf("machine: %s, %s %s\n", model, u.sysname, u.release);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL IDS [--n-prompt N] [--n-gen N] [--threads N] [--draft-layers LIST] "
                        "[--ngram N] [--gamma1 N] [--gamma2 N] [--budget LIST] [--budgets LIST] [--window N] "
                        "[--temps 0|0.6|both] [--draft MODEL] [--modes LIST]\n", argv[0]);
        return 2;
    }
    int32_t n_prompt = 3000, n_gen = 64, threads = 2, ngram = 3, gamma1 = 2, gamma2 = 6, window = 256;
    const char *layers_arg = "0-11,13,15,17,19,21,23,25,27-29", *budgets_arg = "256,512,1024", *temps_arg = "both";
    const char *tf_budgets_arg = "512", *draft_path = NULL, *modes_arg = "layers,ngram,retrieval,triforce";
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--n-prompt")) n_prompt = atoi(v);
        else if (!strcmp(k, "--n-gen")) n_gen = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--draft-layers")) layers_arg = v;
        else if (!strcmp(k, "--ngram")) ngram = atoi(v);
        else if (!strcmp(k, "--gamma1")) gamma1 = atoi(v);
        else if (!strcmp(k, "--gamma2")) gamma2 = atoi(v);
        else if (!strcmp(k, "--budget")) tf_budgets_arg = v;
        else if (!strcmp(k, "--draft")) draft_path = v;
        else if (!strcmp(k, "--budgets")) budgets_arg = v;
        else if (!strcmp(k, "--window")) window = atoi(v);
        else if (!strcmp(k, "--temps")) temps_arg = v;
        else if (!strcmp(k, "--modes")) modes_arg = v;
        else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (n_gen > 1024) n_gen = 1024;
    int32_t n_ids;
    int32_t *ids = bench_read_ids(argv[2], 0, &n_ids);  // the engine checks them against the vocabulary
    if (!ids) return 1;
    if (n_ids < 2) {
        fprintf(stderr, "%s: %d token id, want 2 or more\n", argv[2], n_ids);
        return 1;
    }
    if (n_prompt > n_ids) n_prompt = n_ids;
    tri_model *m;
    if (tri_model_load(argv[1], NULL, &m)) {
        fprintf(stderr, "%s\n", tri_last_error());
        return 1;
    }
    tri_model *draft = NULL;
    if (draft_path && tri_model_load(draft_path, NULL, &draft)) {
        fprintf(stderr, "%s\n", tri_last_error());
        return 1;
    }
    int32_t layers[256], budgets[8], tf_budgets[8];
    int32_t n_layers = parse_layers(layers_arg, layers, 256);
    int32_t n_budgets = parse_layers(budgets_arg, budgets, 8);
    int32_t n_tf_budgets = parse_layers(tf_budgets_arg, tf_budgets, 8);

    machine();
    printf("model: %s, prompt %d tokens, %d generated per run, %d threads, gamma1 %d, gamma2 %d, "
           "self-draft layers %s (%d), n-gram %d\n",
           argv[1], n_prompt, n_gen, threads, gamma1, gamma2, layers_arg, n_layers, ngram);
    printf("L1 cache: StreamingLLM, %d tokens (16 sinks); L2: retrieval, chunks of 8, selected after the "
           "prefill and again when L3 accepts under half of L2's tokens over 4 passes\n\n", window);
    printf("| mode | L1 drafter | L2 budget | T | L1 accept | L2 accept | tokens / L3 pass | L3 passes | "
           "L2 refreshes | ms / token | CPU ms / token | L1 / L2 / L3 s | x plain |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

    typedef struct config {
        tri_spec_mode mode;
        tri_spec_drafter drafter;
        const char *name, *drafter_name;
        int32_t budget;
    } config;
    config configs[32];
    size_t n_configs = 0;
    const bool want_layers = strstr(modes_arg, "layers") != NULL, want_ngram = strstr(modes_arg, "ngram") != NULL;
    configs[n_configs++] = (config){TRI_SPEC_MODE_NONE, TRI_SPEC_DRAFTER_NGRAM, "none", "-", 0};
    if (want_layers)
        configs[n_configs++] =
            (config){TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS, "draft -> full", "self (layers)", 0};
    if (want_ngram)
        configs[n_configs++] = (config){TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_NGRAM, "draft -> full", "n-gram", 0};
    for (int32_t b = 0; strstr(modes_arg, "retrieval") && b < n_budgets; b++)
        configs[n_configs++] = (config){TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_NGRAM, "retrieval -> full", "-", budgets[b]};
    if (draft) configs[n_configs++] = (config){TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_MODEL, "draft -> full", "model", 0};
    for (int32_t b = 0; strstr(modes_arg, "triforce") && b < n_tf_budgets; b++) {
        if (draft)
            configs[n_configs++] = (config){TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL, "triforce", "model",
                                            tf_budgets[b]};
        if (want_layers)
            configs[n_configs++] = (config){TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS, "triforce",
                                            "self (layers)", tf_budgets[b]};
        if (want_ngram)
            configs[n_configs++] = (config){TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_NGRAM, "triforce", "n-gram",
                                            tf_budgets[b]};
    }
    run_out greedy_ref = {.n = 0};
    double plain_ms[2] = {0, 0};  // plain decoding's ms/token at each temperature
    char losing[2048] = "";
    int bad = 0;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_prompt + n_gen + 16;
    sp.n_threads = threads;
    for (size_t c = 0; c < n_configs; c++) {
        tri_spec_params p = tri_spec_default_params();
        p.mode = configs[c].mode;
        p.drafter = configs[c].drafter;
        p.draft_layers = layers;
        p.draft_model = draft;
        p.n_draft_layers = n_layers;
        p.ngram_n = ngram;
        p.gamma1 = gamma1;
        p.gamma2 = gamma2;
        p.budget = configs[c].budget;  // 0: the default
        p.draft_window = window;
        tri_spec *s;
        if (tri_spec_create(m, &sp, &p, &s)) {
            fprintf(stderr, "%s\n", tri_last_error());
            return 1;
        }
        float temps[2] = {0.0f, 0.6f};
        int t0 = !strcmp(temps_arg, "0.6") ? 1 : 0, t1 = !strcmp(temps_arg, "0") ? 1 : 2;
        for (int t = t0; t < t1; t++) {
            tri_generate_params gp = tri_generate_default_params();
            gp.n_predict = n_gen;
            gp.stop_at_eos = false;
            gp.sampler.temperature = temps[t];
            gp.sampler.top_p = 0.9f;
            gp.sampler.seed = 42;
            run_out out = {.n = 0};
            tri_spec_stats st;
            // the prompt is prefilled once per handle; the second run rolls back to it
            bool first = t == t0;
            if (!first && tri_spec_truncate(s, n_prompt)) return 1;
            if (tri_generate_spec(s, first ? ids : NULL, first ? n_prompt : 0, &gp, on_token, &out, &st)) {
                fprintf(stderr, "%s\n", tri_last_error());
                return 1;
            }
            if (t == 0) {
                if (c == 0) {
                    greedy_ref = out;
                } else if (out.n != greedy_ref.n || memcmp(out.tok, greedy_ref.tok, (size_t)out.n * 4)) {
                    fprintf(stderr, "CHECK FAILED: %s/%s greedy output differs from plain decoding\n",
                            configs[c].name, configs[c].drafter_name);
                    bad = 1;
                }
            }
            char l1[32] = "-", l2[32] = "-", bud[32] = "-";
            if (configs[c].budget > 0) snprintf(bud, sizeof bud, "%d", configs[c].budget);
            if (st.l1_proposed) snprintf(l1, sizeof l1, "%.3f", (double)st.l1_accepted / (double)st.l1_proposed);
            if (st.l2_proposed) snprintf(l2, sizeof l2, "%.3f", (double)st.l2_accepted / (double)st.l2_proposed);
            double ms = 1e3 * st.decode_seconds / st.n_generated;
            // the tokens after the first: the first one's CPU time includes the prefill
            double cpu_ms = out.n > 1 ? 1e3 * (out.cpu_last - out.cpu_first) / (out.n - 1) : ms;
            double cmp = threads == 1 ? cpu_ms : ms;  // what x plain compares
            if (c == 0) plain_ms[t] = cmp;
            char vs[48] = "1.00";
            if (c > 0) {
                double x = plain_ms[t] / cmp;
                snprintf(vs, sizeof vs, "%.2f%s", x, x < 0.95 ? " (loses)" : x > 1.05 ? " (wins)" : "");
                if (x < 0.95 && strlen(losing) + 128 < sizeof losing)
                    snprintf(losing + strlen(losing), sizeof losing - strlen(losing), "%s%s/%s/%s at T %.1f (%.2f)",
                             losing[0] ? ", " : "", configs[c].name, configs[c].drafter_name, bud, (double)temps[t], x);
            }
            printf("| %s | %s | %s | %.1f | %s | %s | %.2f | %lld | %lld | %.1f | %.1f | %.2f / %.2f / %.2f | %s |\n",
                   configs[c].name, configs[c].drafter_name, bud, (double)temps[t], l1, l2,
                   (double)st.n_generated / (double)st.n_l3_verify, (long long)st.n_l3_verify,
                   (long long)st.n_l2_refresh, ms, cpu_ms, st.l1_seconds, st.l2_seconds, st.l3_seconds, vs);
            fflush(stdout);
        }
        tri_spec_free(s);
    }
    tri_model_free(m);
    tri_model_free(draft);
    free(ids);
    if (bad) return 1;
    printf("\ncheck: every mode's greedy output equals plain decoding's (%d tokens)\n", greedy_ref.n);
    printf("slower than plain decoding on this machine (x plain < 0.95): %s\n", losing[0] ? losing : "none");
    return 0;
}
