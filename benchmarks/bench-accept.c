// bench-accept.c - acceptance measured on real text: TRIFORCE's chain (L1 self-draft -> L2 retrieval
// cache -> L3 full cache) decoding after a long prompt of a text, with the acceptance of every
// verification counted by level and by depth (the position of a drafted token in the chain it came
// in), and tokens emitted per L3 pass; written as an acceptance curve (docs/formats.md, "Acceptance
// curves") that bench-offload --device sim:PROFILE --accept-curve FILE uses instead of stated rates.
//
// usage: bench-accept MODEL TEXT OUT [--n-prompt N] [--n-gen N] [--threads N] [--gamma1 N]
//                     [--gamma2 N] [--budget N] [--window N] [--draft-layers LIST] [--temp T]
//                     [--tree-nodes N,N,...]
//                     [--draft-kv-type f16|q8_0|q4_0]
// TEXT: a plain text file (UTF-8); its first --n-prompt tokens (default 1024, CI-sized; the run in
// docs/benchmarks-log.md uses 4096) are the prompt, then --n-gen tokens (default 64) are generated at
// temperature --temp (default 0: greedy, the acceptance of exact greedy verification). L1 is the
// target running --draft-layers (bench-spec's default self-draft, 22 of SmolLM2's 30 layers) over
// a StreamingLLM cache of --window tokens (256), L2 the target over a retrieval cache of --budget
// tokens (256: 1/16 of a 4K context, TriForce's 8K of 128K), gamma1 2, gamma2 16 by default.
// --tree-nodes: L3 verifies token trees of each size in turn (0: the chain; docs/speculative.md,
// "Token trees"), the same prompt prefilled once (the engine rolled back to it between runs), each
// run's curve written to OUT with "-treeN" before its extension (OUT itself for 0), with the
// acceptance by depth and sibling rank ("tree" lines).
// --draft-kv-type: the type of both draft caches' rows (L1's window, L2's gathered chunks; f16 by
// default); the bytes each holds are printed, so that runs at equal memory give q8_0 / q4_0 the
// larger --budget and --window that fit the f16 run's bytes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "spec.h"
#include "triforce.h"

static int parse_layers(const char *s, int32_t *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s) return -1;
        if (*end == '-') {
            const char *t = end + 1;
            b = strtol(t, &end, 10);
            if (end == t || b < a) return -1;
        }
        for (long v = a; v <= b && n < cap; v++) out[n++] = (int32_t)v;
        if (*end && *end != ',') return -1;
        s = *end ? end + 1 : end;
    }
    return n;
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

// Writes one level's counts as "LEVEL DEPTH REACHED ACCEPTED" lines and prints its rates.
static void put_level(FILE *f, const char *name, const int64_t *reached, const int64_t *accepted, int32_t depth) {
    printf("%s:", name);
    for (int32_t d = 1; d <= depth && d <= TRI__SPEC_MAX_DEPTH; d++) {
        if (reached[d] == 0) break;
        fprintf(f, "%s %d %lld %lld\n", name, d, (long long)reached[d], (long long)accepted[d]);
        printf(" %.2f", (double)accepted[d] / (double)reached[d]);
    }
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL TEXT OUT [--n-prompt N] [--n-gen N] [--threads N] [--gamma1 N] [--gamma2 N] "
                        "[--budget N] [--window N] [--draft-layers LIST] [--temp T] [--draft-kv-type T]\n",
                argv[0]);
        return 2;
    }
    int32_t n_prompt = 1024, n_gen = 64, threads = 2, gamma1 = 2, gamma2 = 16, budget = 256, window = 256;
    const char *layers_arg = "0-11,13,15,17,19,21,23,25,27-29";
    float temp = 0;
    int32_t trees[16] = {0}, n_trees = 1, tree_max = 0;
    tri_dtype draft_type = TRI_DTYPE_F16;
    for (int i = 4; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t *dst = !strcmp(k, "--n-prompt") ? &n_prompt : !strcmp(k, "--n-gen") ? &n_gen
                     : !strcmp(k, "--threads") ? &threads : !strcmp(k, "--gamma1") ? &gamma1
                     : !strcmp(k, "--gamma2") ? &gamma2 : !strcmp(k, "--budget") ? &budget
                     : !strcmp(k, "--window") ? &window : NULL;
        if (v && dst) {
            *dst = atoi(v);
            if (*dst <= 0) {
                fprintf(stderr, "bench-accept: %s must be a positive integer, not '%s'\n", k, v);
                return 2;
            }
        } else if (v && !strcmp(k, "--draft-layers")) {
            layers_arg = v;
        } else if (v && !strcmp(k, "--tree-nodes")) {
            n_trees = 0;
            for (const char *t = v; *t && n_trees < 16;) {
                char *end;
                long x = strtol(t, &end, 10);
                if (end == t || x < 0 || x > 1024 || (*end && *end != ',')) {
                    fprintf(stderr, "bench-accept: --tree-nodes: bad list '%s' (sizes 0..1024, commas)\n", v);
                    return 2;
                }
                trees[n_trees++] = (int32_t)x;
                tree_max = (int32_t)x > tree_max ? (int32_t)x : tree_max;
                t = *end ? end + 1 : end;
            }
        } else if (v && !strcmp(k, "--draft-kv-type")) {
            draft_type = !strcmp(v, "f16") ? TRI_DTYPE_F16 : !strcmp(v, "q8_0") ? TRI_DTYPE_Q8_0
                       : !strcmp(v, "q4_0") ? TRI_DTYPE_Q4_0 : TRI_DTYPE_COUNT;
            if (draft_type == TRI_DTYPE_COUNT) {
                fprintf(stderr, "bench-accept: --draft-kv-type: want f16, q8_0 or q4_0, not '%s'\n", v);
                return 2;
            }
        } else if (v && !strcmp(k, "--temp")) {
            temp = (float)atof(v);
        } else {
            fprintf(stderr, "bench-accept: unknown option or missing value: %s\n", k);
            return 2;
        }
    }
    if (gamma2 > TRI__SPEC_MAX_DEPTH || gamma1 > TRI__SPEC_MAX_DEPTH) {
        fprintf(stderr, "bench-accept: gamma1 and gamma2 are counted up to depth %d\n", TRI__SPEC_MAX_DEPTH);
        return 2;
    }
    int32_t layers[256];
    int n_layers = parse_layers(layers_arg, layers, 256);
    if (n_layers <= 0) {
        fprintf(stderr, "bench-accept: --draft-layers: bad list '%s'\n", layers_arg);
        return 2;
    }
    size_t len = 0;
    char *text = read_text(argv[2], &len);
    if (!text) {
        fprintf(stderr, "bench-accept: %s: cannot read\n", argv[2]);
        return 1;
    }
    tri_model *m = NULL;
    if (tri_model_load(argv[1], NULL, &m)) {
        fprintf(stderr, "bench-accept: %s\n", tri_last_error());
        free(text);
        return 1;
    }
    int64_t n_ids = 0;
    int32_t *ids = NULL;
    int rc = 1;
    tri_spec *s = NULL;
    if (tri_tokenize(m, text, len, false, false, NULL, 0, &n_ids) ||
        !(ids = malloc(sizeof *ids * (size_t)(n_ids + 1))) ||
        tri_tokenize(m, text, len, false, false, ids, n_ids + 1, &n_ids)) {
        fprintf(stderr, "bench-accept: %s: %s\n", argv[2], tri_last_error());
        goto done;
    }
    if (n_ids < n_prompt) {
        fprintf(stderr, "bench-accept: %s: %lld tokens, fewer than --n-prompt %d\n", argv[2], (long long)n_ids,
                n_prompt);
        goto done;
    }
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_prompt + n_gen + gamma2 + 16 + tree_max;
    sp.n_threads = threads;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_TRIFORCE;
    p.drafter = TRI_SPEC_DRAFTER_LAYERS;
    p.draft_layers = layers;
    p.n_draft_layers = n_layers;
    p.gamma1 = gamma1;
    p.gamma2 = gamma2;
    p.budget = budget;
    p.draft_window = window;
    p.tree_nodes = tree_max;
    p.draft_kv_type = draft_type;
    if (tri_spec_create(m, &sp, &p, &s)) {
        fprintf(stderr, "bench-accept: %s\n", tri_last_error());
        goto done;
    }
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n_gen;
    gp.stop_at_eos = false;
    gp.sampler.temperature = temp;
    gp.sampler.seed = 42;
    enum { R1 = TRI__TREE_MAX_RANK + 1 };
    static int64_t tr[(TRI__SPEC_MAX_DEPTH + 1) * R1], ta[(TRI__SPEC_MAX_DEPTH + 1) * R1];
    int64_t r1[TRI__SPEC_MAX_DEPTH + 1], a1[TRI__SPEC_MAX_DEPTH + 1], r2[TRI__SPEC_MAX_DEPTH + 1],
        a2[TRI__SPEC_MAX_DEPTH + 1], b1[2][TRI__SPEC_MAX_DEPTH + 1], b2[2][TRI__SPEC_MAX_DEPTH + 1];
    // the draft caches' rows: L2's gathered keys and values per layer, L1's window (its layers)
    tri_model_info info;
    tri_model_get_info(m, &info);
    const tri_model_config *c = &info.config;
    const int64_t row = 2 * tri__dtype_row_bytes(draft_type, c->head_dim) * c->n_head_kv;
    const double l2_mib = (double)budget * (double)row * c->n_layer / 1048576.0;
    const double l1_mib = (double)window * (double)row * n_layers / 1048576.0;
    printf("draft caches %s: L2 %d tokens (%.2f MiB), L1 %d (%.2f MiB)\n", tri_dtype_name(draft_type), budget, l2_mib,
           window, l1_mib);
    const char *base = strrchr(argv[2], '/');
    for (int t = 0; t < n_trees; t++) {
        tri__spec_set_tree_nodes(s, trees[t]);
        tri__spec_depth_counts(s, 0, b1[0], b1[1]);  // the counts so far: this run's are the difference
        tri__spec_depth_counts(s, 1, b2[0], b2[1]);
        tri_spec_stats st;
        // the first run prefills the prompt; the others roll back to its last token and run it again
        bool again = t > 0 && !tri_spec_truncate(s, n_prompt - 1);
        if (t > 0 && !again) {
            fprintf(stderr, "bench-accept: %s\n", tri_last_error());
            goto done;
        }
        if (tri_generate_spec(s, again ? ids + n_prompt - 1 : ids, again ? 1 : n_prompt, &gp, NULL, NULL, &st)) {
            fprintf(stderr, "bench-accept: %s\n", tri_last_error());
            goto done;
        }
        char path[4096];
        const char *dot = strrchr(argv[3], '.');
        if (trees[t] == 0 || !dot)
            snprintf(path, sizeof path, trees[t] ? "%s-tree%d" : "%s", argv[3], trees[t]);
        else
            snprintf(path, sizeof path, "%.*s-tree%d%s", (int)(dot - argv[3]), argv[3], trees[t], dot);
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "bench-accept: %s: cannot write\n", path);
            goto done;
        }
        tri__spec_depth_counts(s, 0, r1, a1);
        tri__spec_depth_counts(s, 1, r2, a2);
        for (int d = 0; d <= TRI__SPEC_MAX_DEPTH; d++) {
            r1[d] -= b1[0][d], a1[d] -= b1[1][d];
            r2[d] -= b2[0][d], a2[d] -= b2[1][d];
        }
        double tpp = (double)st.n_generated / (double)st.n_l3_verify;
        fprintf(f,
                "# triforce acceptance curve\n# bench-accept: %s, text %s, prompt %d tokens, %d generated, "
                "temperature %.2f\n# L1 self-draft layers %s over a %d-token StreamingLLM cache, L2 retrieval "
                "budget %d, gamma1 %d, gamma2 %d, tree of %d nodes, draft caches %s\n",
                strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1], base ? base + 1 : argv[2], n_prompt,
                st.n_generated, temp, layers_arg, window, budget, gamma1, gamma2, trees[t],
                tri_dtype_name(draft_type));
        fprintf(f, "gamma1 %d\ngamma2 %d\ntokens_per_l3 %.4f\n", gamma1, gamma2, tpp);
        if (trees[t] > 0) fprintf(f, "tree_nodes %d\n", trees[t]);
        printf(
            "%s, tree %d: prompt %d, %d generated, %lld L3 passes (%.2f tokens each, %.1f drafted tokens "
            "verified each), %lld L2 verifications, %.1f s decoding; acceptance by depth\n",
            argv[2], trees[t], n_prompt, st.n_generated, (long long)st.n_l3_verify, tpp,
            st.n_l3_verify && trees[t] ? (double)st.n_l3_tree_nodes / (double)st.n_l3_verify : 0.0,
            (long long)st.n_l2_verify, st.decode_seconds);
        put_level(f, "l1", r1, a1, gamma1);
        put_level(f, "l2", r2, a2, gamma2);
        if (trees[t] > 0) {
            tri__spec_tree_counts(s, tr, ta);
            printf("tree (depth: accepted/tested by rank 0, 1, ...):\n");
            for (int d = 1; d <= TRI__SPEC_MAX_DEPTH; d++) {
                if (tr[d * R1] == 0) break;
                printf("  %2d:", d);
                for (int r = 0; r < R1; r++) {
                    if (tr[d * R1 + r] == 0) continue;
                    fprintf(f, "tree %d %d %lld %lld\n", d, r, (long long)tr[d * R1 + r], (long long)ta[d * R1 + r]);
                    printf(" %lld/%lld", (long long)ta[d * R1 + r], (long long)tr[d * R1 + r]);
                }
                printf("\n");
            }
        }
        if (fclose(f)) {
            fprintf(stderr, "bench-accept: %s: write failed\n", path);
            goto done;
        }
    }
    rc = 0;
done:
    tri_spec_free(s);
    free(ids);
    free(text);
    tri_model_free(m);
    return rc;
}
