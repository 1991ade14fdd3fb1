// bench-kv-quality.c - how close each cache policy stays to full attention on a real model and
// text: the share of full attention's mass the policy's view holds, the agreement of the greedy
// next token, the expected acceptance sum_x min(p, q) of a draft q = policy against p = full (the
// speculative acceptance rate at temperature 1), and KL(p || q), over many positions.
//
// usage: bench-kv-quality MODEL.gguf IDS [context 2048] [positions 64] [budgets 128,256,512,1024]
//                         [threads 0]
//        bench-kv-quality MODEL.gguf IDS CONTEXT 0 types [threads 0]
// The second form compares the KV cache's types (f16, q8_0, q4_0, mixed: full cache) over the first
// CONTEXT tokens of the text, every position scored (kv_types below).
// IDS: token ids as text, one per line (scripts/tokenize-gguf.py), or little-endian int32
// (benchmarks/tokenize-gguf.py): bench_read_ids tells them apart. The first `context` ids are the
// prompt; the next `positions` are fed one by one (teacher forcing) and compared.
// Retrieval selects once after the prompt (TriForce's code never refreshes), chunks of 8;
// StreamingLLM keeps 16 sinks; H2O keeps half its budget as the recent window.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "dtype.h"
#include "kv-policy.h"
#include "llama.h"
#include "model.h"
#include "tri-config.h"
#include "bench-util.h"

static void die(const char *what) {
    fprintf(stderr, "bench-kv-quality: %s: %s\n", what, tri_last_error());
    exit(1);
}

static void softmax(const float *l, double *p, int32_t n) {
    double mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < n; i++) mx = fmax(mx, (double)l[i]);
    for (int32_t i = 0; i < n; i++) s += p[i] = exp((double)l[i] - mx);
    for (int32_t i = 0; i < n; i++) p[i] /= s;
}

// Runs the prompt and the positions through a policy: logits (positions, n_vocab).
static void run(tri__llama *ll, const tri_model *m, tri__kv_policy_params *pp, const int32_t *ids, int32_t ctx,
                int32_t npos, float *logits, double *mass, double *secs) {
    const tri_model_config *c = &m->config;
    tri__kv_policy pol;
    if (tri__kv_policy_init(&pol, pp, ll->be, TRI_DTYPE_F16, c->n_layer, c->n_head, c->n_head_kv, c->head_dim,
                            ctx + npos, ll->n_batch))
        die("policy");
    if (tri__kv_policy_measure(&pol)) die("measure");
    if (tri__llama_forward_policy(ll, &pol, ids, ctx - 1, TRI_LOGITS_NONE, NULL)) die("prefill");
    tri__kv_policy_request_refresh(&pol);  // select from the prompt's last query
    if (tri__llama_forward_policy(ll, &pol, ids + ctx - 1, 1, TRI_LOGITS_LAST, logits)) die("prefill");
    pol.mass_sum = 0;
    pol.mass_n = 0;
    double t0 = bench_now();
    for (int32_t i = 0; i < npos; i++)
        if (tri__llama_forward_policy(ll, &pol, ids + ctx + i, 1, TRI_LOGITS_LAST, logits + (int64_t)i * c->n_vocab))
            die("decode");
    *secs = (bench_now() - t0) / npos;
    *mass = pol.mass_n ? pol.mass_sum / (double)pol.mass_n : 1;
    tri__kv_policy_free(&pol);
}

// The KV cache's types against f16 over the first n ids: the text is fed in passes of 128 tokens
// with every position's logits (teacher forcing, as a perplexity run), through one full cache per
// type side by side, and each position's next-token distribution q of a type is compared with p
// of the f16 cache: top-1 agreement, accept = sum_x min(p, q), KL(p || q), and the perplexity of
// the text's next tokens under each.
static void kv_types(tri__llama *ll, const tri_model *m, const int32_t *ids, int32_t n) {
    enum { NT = 5, PASS = 128, HEAVY = 64 };
    // mixed: q4_0 with 16 sinks and each query's window of 240 in f16 too (policy-mixed.c); the
    // last also with HEAVY heavy hitters per layer and KV head in f16 (MiKV's, by H2O's scores)
    const tri_dtype types[NT] = {TRI_DTYPE_F16, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0, TRI_DTYPE_KV_MIXED,
                                 TRI_DTYPE_KV_MIXED};
    const tri_model_config *c = &m->config;
    const int32_t V = c->n_vocab;
    tri__kv_policy pol[NT];
    float *lg[NT];
    double nll[NT] = {0}, top1[NT] = {0}, acc[NT] = {0}, kl[NT] = {0}, secs[NT] = {0};
    double *p = malloc(sizeof(double) * (size_t)V), *q = malloc(sizeof(double) * (size_t)V);
    for (int t = 0; t < NT; t++) {
        tri__kv_policy_params fp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, n);
        if (t == NT - 1) fp.heavy = HEAVY;
        if (tri__kv_policy_init(&pol[t], &fp, ll->be, types[t], c->n_layer, c->n_head, c->n_head_kv, c->head_dim, n,
                                PASS))
            die("policy");
        lg[t] = malloc(sizeof(float) * (size_t)PASS * (size_t)V);
        if (!lg[t] || !p || !q) die("logits");
    }
    for (int32_t i0 = 0; i0 < n; i0 += PASS) {
        int32_t nb = n - i0 < PASS ? n - i0 : PASS;
        for (int t = 0; t < NT; t++) {
            double t0 = bench_now();
            if (tri__llama_forward_policy(ll, &pol[t], ids + i0, nb, TRI_LOGITS_ALL, lg[t])) die("forward");
            secs[t] += bench_now() - t0;
        }
        for (int32_t r = 0; r < nb; r++) {
            const int32_t pos = i0 + r;
            const float *lf = lg[0] + (int64_t)r * V;
            softmax(lf, p, V);
            for (int t = 0; t < NT; t++) {
                const float *lq = lg[t] + (int64_t)r * V;
                softmax(lq, q, V);
                if (pos + 1 < n) nll[t] -= log(q[ids[pos + 1]]);
                top1[t] += bench_argmax(lf, V) == bench_argmax(lq, V);
                for (int32_t x = 0; x < V; x++) {
                    if (p[x] > 0) kl[t] += p[x] * (log(p[x]) - log(fmax(q[x], 1e-300)));
                    acc[t] += fmin(p[x], q[x]);
                }
            }
        }
    }
    printf("%-6s %11s %9s %9s %8s %9s %10s %12s\n", "kv", "bytes/value", "ppl", "d_ppl", "top1", "accept", "KL",
           "ms/token");
    double ppl0 = exp(nll[0] / (n - 1));
    for (int t = 0; t < NT; t++) {
        double ppl = exp(nll[t] / (n - 1));
        // mixed: its q4_0 rows and, over the n tokens, its f16 rows besides: 16 sinks and a buffer
        // of 1.5 x (the window of 240 and two passes) (policy-mixed.c)
        // (the heavy hitters: HEAVY f16 rows per KV head besides, and a 4-byte score per position)
        double bpv = types[t] == TRI_DTYPE_KV_MIXED
                         ? (double)tri__dtype_row_bytes(TRI_DTYPE_Q4_0, TRI_QK) / TRI_QK +
                               2.0 * (16 + 1.5 * (240 + 2 * PASS) + (t == NT - 1 ? HEAVY : 0)) / n +
                               (t == NT - 1 ? 4.0 / (2.0 * c->head_dim) : 0)
                         : (double)tri__dtype_row_bytes(types[t], TRI_QK) / TRI_QK;
        const char *name = t == NT - 1 ? "mixedh" : tri_dtype_name(types[t]);
        printf("%-6s %11.4f %9.4f %+9.4f %8.4f %9.4f %10.6f %12.2f\n", name, bpv, ppl,
               ppl - ppl0, top1[t] / n, acc[t] / n,
               kl[t] / n, secs[t] * 1e3 / n);
        free(lg[t]);
        tri__kv_policy_free(&pol[t]);
    }
    free(p), free(q);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench-kv-quality MODEL.gguf IDS [context 2048] [positions 64] "
                        "[budgets 128,256,512,1024] [threads 0]\n");
        return 2;
    }
    int32_t ctx = argc > 3 ? atoi(argv[3]) : 2048, npos = argc > 4 ? atoi(argv[4]) : 64;
    const char *budgets_arg = argc > 5 ? argv[5] : "128,256,512,1024";
    int32_t threads = argc > 6 ? atoi(argv[6]) : 0;
    const bool types = strcmp(budgets_arg, "types") == 0;  // the KV types over `context` tokens
    if (types) npos = 0;
    if (ctx < 2 || npos < 0 || (!types && npos < 2)) {
        fprintf(stderr, "bench-kv-quality: context %d and positions %d\n", ctx, npos);
        return 2;
    }

    tri_model *m;
    if (tri_model_load(argv[1], NULL, &m)) die(argv[1]);
    const tri_model_config *c = &m->config;
    int32_t cap = ctx + npos, n = 0;
    int32_t *ids = bench_read_ids(argv[2], c->n_vocab, &n);
    if (!ids) return 1;
    if (n < cap) {
        fprintf(stderr, "%s: %d ids, need %d (context %d + positions %d)\n", argv[2], n, cap, ctx, npos);
        return 1;
    }
    tri__backend *be;
    if (tri__backend_cpu_create(threads, TRI_CPU_SIMD_AUTO, &be)) die("backend");
    tri__llama ll;
    if (tri__llama_init(&ll, m, be, 128)) die("forward pass");
    const int32_t V = c->n_vocab;

    if (types) {
        printf("# bench-kv-quality: %s, %d layers, %d/%d heads x %d, the first %d tokens, KV types vs f16, %s, %d "
               "threads\n", argv[1], c->n_layer, c->n_head, c->n_head_kv, c->head_dim, ctx,
               tri__cpu_simd_name(tri__cpu_simd_detect()), be->n_threads);
        kv_types(&ll, m, ids, ctx);
        free(ids);
        tri__llama_free(&ll);
        tri__backend_free(be);
        tri_model_free(m);
        return 0;
    }
    printf("# bench-kv-quality: %s, %d layers, %d/%d heads, context %d, %d positions, f16 cache, %s, %d threads\n",
           argv[1], c->n_layer, c->n_head, c->n_head_kv, ctx, npos, tri__cpu_simd_name(tri__cpu_simd_detect()),
           be->n_threads);
    float *full = malloc(sizeof(float) * (size_t)npos * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)npos * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V), *q = malloc(sizeof(double) * (size_t)V);
    tri__kv_policy_params fp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, cap);
    double mass, secs;
    run(&ll, m, &fp, ids, ctx, npos, full, &mass, &secs);
    printf("%-10s %7s %8s %8s %9s %9s %10s %9s\n", "policy", "budget", "mass", "top1", "accept", "KL", "ms/token",
           "ppl");
    double nll_full = 0;
    for (int32_t i = 0; i + 1 < npos; i++) {
        softmax(full + (int64_t)i * V, p, V);
        nll_full -= log(p[ids[ctx + i + 1]]);
    }
    printf("%-10s %7s %8.4f %8.4f %9.4f %9.5f %10.1f %9.3f\n", "full", "-", 1.0, 1.0, 1.0, 0.0, secs * 1e3,
           exp(nll_full / (npos - 1)));
    fflush(stdout);

    tri_kv_policy kinds[3] = {TRI_KV_POLICY_RETRIEVAL, TRI_KV_POLICY_STREAMING, TRI_KV_POLICY_H2O};
    for (const char *b = budgets_arg; *b;) {
        int32_t budget = (int32_t)strtol(b, (char **)&b, 10);
        if (*b == ',') b++;
        for (int k = 0; k < 3; k++) {
            tri__kv_policy_params pp = tri__kv_policy_default_params(kinds[k], cap);
            pp.budget = budget;
            pp.sink = 16;
            pp.keep_all = true;  // the measurement attends to every position besides the view
            run(&ll, m, &pp, ids, ctx, npos, got, &mass, &secs);
            double kl = 0, acc = 0, top1 = 0, nll = 0;
            for (int32_t i = 0; i < npos; i++) {
                const float *lf = full + (int64_t)i * V, *lg = got + (int64_t)i * V;
                softmax(lf, p, V);
                softmax(lg, q, V);
                for (int32_t x = 0; x < V; x++) {
                    if (p[x] > 0) kl += p[x] * (log(p[x]) - log(fmax(q[x], 1e-300)));
                    acc += fmin(p[x], q[x]);
                }
                top1 += bench_argmax(lf, V) == bench_argmax(lg, V);
                if (i + 1 < npos) nll -= log(q[ids[ctx + i + 1]]);
            }
            printf("%-10s %7d %8.4f %8.4f %9.4f %9.5f %10.1f %9.3f\n", tri__kv_policy_name(kinds[k]), budget, mass,
                   top1 / npos, acc / npos, kl / npos, secs * 1e3, exp(nll / (npos - 1)));
            fflush(stdout);
        }
    }
    free(full);
    free(got);
    free(p);
    free(q);
    free(ids);
    tri__llama_free(&ll);
    tri__backend_free(be);
    tri_model_free(m);
    return 0;
}
