// bench-spec-batch.c - speculative decoding over several sequences in batched passes
// (tri_spec_batch) against the same sequences one after another (tri_generate_spec each):
// aggregate tokens per second at batch 1, 2 and 4, a ratio in one run.
//
// usage: bench-spec-batch MODEL [TOKENS=48] [N_THREADS=1] [MAX_BATCH=4] [REPEATS=2] [CLOCK=cpu|wall]
//                         [MODE=triforce|draft|retrieval|none] [DRAFTER=layers:LIST|ngram:N] [GAMMA2=6]
//
// Each batch size B takes B engines (one per sequence) with prompts of different lengths (37, 150,
// 96 and 64 tokens at B = 4) and TOKENS greedy tokens each. One by one: each engine's tri_generate_spec in turn. Batched:
// the same engines reset and added to one tri_spec_batch, stepped until all are done. The check comes
// first: every sequence's tokens in the batch are the ones it gets alone (on the CPU each batched
// pass is bit for bit each sequence's pass alone). The figure is tokens generated over the time of
// the whole run (prefills included, which batch too), best of REPEATS interleaved runs; with it the
// batched passes the batch ran and the sequences' passes they carried. CLOCK cpu (the default) times
// by the process's CPU time, which with N_THREADS 1 is the work each way takes whatever else loads
// the machine. The default drafter is SmolLM2-135M's self-draft of bench-spec
// (docs/benchmarks-log.md, "Speculative decoding").
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spec.h"
#include "triforce.h"

#define MAX_B 8
#define MAX_TOKENS 512

static const int32_t lengths[MAX_B] = {37, 150, 96, 64, 18, 120, 80, 110};

static clockid_t bench_clock = CLOCK_PROCESS_CPUTIME_ID;

static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, tri_status st) {
    fprintf(stderr, "bench-spec-batch: %s: %s (%s)\n", what, tri_last_error(), tri_status_str(st));
    return 1;
}

typedef struct out {
    int32_t *tok;
    int32_t n, cap;
} out;

static bool on_token(int32_t t, void *user) {
    out *o = user;
    if (o->n < o->cap) o->tok[o->n++] = t;
    return true;
}

// "0-11,13,27-29" into layers (at most cap); the count, or -1 when malformed.
static int32_t parse_layers(const char *s, int32_t *layers, int32_t cap) {
    int32_t n = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s) return -1;
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s || b < a) return -1;
        }
        for (long i = a; i <= b; i++) {
            if (n == cap) return -1;
            layers[n++] = (int32_t)i;
        }
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench-spec-batch MODEL [TOKENS=48] [N_THREADS=1] [MAX_BATCH=4] [REPEATS=2] "
                "[CLOCK=cpu|wall] [MODE=triforce|draft|retrieval|none] [DRAFTER=layers:LIST|ngram:N] "
                "[GAMMA2=6]\n");
        return 2;
    }
    int32_t n_tok = argc > 2 ? atoi(argv[2]) : 48, n_threads = argc > 3 ? atoi(argv[3]) : 1;
    int32_t max_b = argc > 4 ? atoi(argv[4]) : 4, reps = argc > 5 ? atoi(argv[5]) : 2;
    if (argc > 6) bench_clock = strcmp(argv[6], "wall") == 0 ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID;
    const char *mode_s = argc > 7 ? argv[7] : "triforce";
    const char *drafter_s = argc > 8 ? argv[8] : "layers:0-11,13,15,17,19,21,23,25,27-29";
    int32_t gamma2 = argc > 9 ? atoi(argv[9]) : 6;
    if (n_tok < 1 || n_tok > MAX_TOKENS || max_b < 1 || max_b > MAX_B || reps < 1 || gamma2 < 1) {
        fprintf(stderr, "bench-spec-batch: TOKENS in [1, %d], MAX_BATCH in [1, %d], REPEATS >= 1, GAMMA2 >= 1\n",
                MAX_TOKENS, MAX_B);
        return 2;
    }
    tri_spec_params p = tri_spec_default_params();
    p.gamma2 = gamma2;
    if (strcmp(mode_s, "triforce") == 0)
        p.mode = TRI_SPEC_MODE_TRIFORCE;
    else if (strcmp(mode_s, "draft") == 0)
        p.mode = TRI_SPEC_MODE_DRAFT;
    else if (strcmp(mode_s, "retrieval") == 0)
        p.mode = TRI_SPEC_MODE_RETRIEVAL;
    else if (strcmp(mode_s, "none") == 0)
        p.mode = TRI_SPEC_MODE_NONE;
    else {
        fprintf(stderr, "bench-spec-batch: MODE '%s': want triforce, draft, retrieval or none\n", mode_s);
        return 2;
    }
    static int32_t layers[256];
    if (strncmp(drafter_s, "layers:", 7) == 0) {
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        p.n_draft_layers = parse_layers(drafter_s + 7, layers, 256);
        p.draft_layers = layers;
        if (p.n_draft_layers < 1) {
            fprintf(stderr, "bench-spec-batch: DRAFTER '%s': a bad layer list\n", drafter_s);
            return 2;
        }
    } else if (strncmp(drafter_s, "ngram:", 6) == 0) {
        p.drafter = TRI_SPEC_DRAFTER_NGRAM;
        p.ngram_n = atoi(drafter_s + 6);
    } else {
        fprintf(stderr, "bench-spec-batch: DRAFTER '%s': want layers:LIST or ngram:N\n", drafter_s);
        return 2;
    }
    tri_model *m;
    tri_status st = tri_model_load(argv[1], NULL, &m);
    if (st) return fail(argv[1], st);
    const int32_t V = tri_token_count(m);
    int32_t *prompts[MAX_B];
    for (int i = 0; i < MAX_B; i++) {
        prompts[i] = malloc(sizeof(int32_t) * 256);
        // text-like: a walk that repeats phrases now and then, as prose does
        for (int t = 0; t < 256; t++)
            prompts[i][t] = (int32_t)(t % 23 < 9 ? (t % 23) * 311 + i * 17 + 100 : (t * 7919 + i * 104729 + 13)) % V;
    }
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 256 + n_tok + 1;
    sp.n_threads = n_threads;
    tri_spec *specs[MAX_B] = {0};
    for (int i = 0; i < max_b; i++)
        if ((st = tri_spec_create(m, &sp, &p, &specs[i]))) return fail("engine", st);
    static int32_t alone[MAX_B][MAX_TOKENS], together[MAX_B][MAX_TOKENS];
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n_tok;
    gp.stop_at_eos = false;
    int32_t shortest = 256, longest = 0;
    for (int i = 0; i < max_b; i++) {
        shortest = lengths[i] < shortest ? lengths[i] : shortest;
        longest = lengths[i] > longest ? lengths[i] : longest;
    }
    printf(
        "model: %s, --spec %s, drafter %s, gamma2 %d, %d greedy tokens per sequence after prompts of %d to %d "
        "tokens, CPU backend, %d threads, timed by %s\n",
        argv[1], mode_s, drafter_s, gamma2, n_tok, shortest, longest, n_threads,
        bench_clock == CLOCK_MONOTONIC ? "the wall clock" : "the process's CPU time");
    printf("%5s | %14s %14s %6s | %8s %8s %9s | %9s\n", "batch", "tok/s 1 by 1", "batched", "ratio", "passes",
           "carried", "per pass", "L3 passes");
    for (int32_t B = 1; B <= max_b; B *= 2) {
        double best[2] = {1e30, 1e30};
        int64_t passes = 0, rows = 0, l3 = 0;
        for (int32_t r = 0; r < reps; r++) {
            double t0 = now();
            for (int i = 0; i < B; i++) {
                tri_spec_reset(specs[i]);
                out o = {alone[i], 0, MAX_TOKENS};
                if ((st = tri_generate_spec(specs[i], prompts[i], lengths[i], &gp, on_token, &o, NULL)))
                    return fail("generate", st);
            }
            double t1 = now();
            tri_spec_batch *b;
            if ((st = tri_spec_batch_create(&b))) return fail("batch", st);
            out os[MAX_B];
            tri_spec_stats stats[MAX_B];
            for (int i = 0; i < B; i++) {
                tri_spec_reset(specs[i]);
                os[i] = (out){together[i], 0, MAX_TOKENS};
                if ((st = tri_spec_batch_add(b, specs[i], prompts[i], lengths[i], &gp, on_token, &os[i], &stats[i],
                                             NULL)))
                    return fail("batch add", st);
            }
            for (int32_t running = B; running > 0;)
                if ((st = tri_spec_batch_step(b, &running))) return fail("batch step", st);
            double t2 = now();
            for (int i = 0; i < B; i++) {
                bool done;
                tri_status si;
                if ((st = tri_spec_batch_result(b, i, &done, &si))) return fail("batched generation", st);
            }
            tri__spec_batch_counts(b, &passes, &rows);
            tri_spec_batch_free(b);
            l3 = 0;
            for (int i = 0; i < B; i++) {
                l3 += stats[i].n_l3_verify;
                if (memcmp(alone[i], together[i], sizeof(int32_t) * (size_t)n_tok) != 0) {
                    fprintf(stderr,
                            "bench-spec-batch: check failed: sequence %d of a batch of %d generates other "
                            "tokens than alone\n",
                            i, B);
                    return 1;
                }
            }
            double t[2] = {t1 - t0, t2 - t1};
            for (int k = 0; k < 2; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
        }
        double n_gen = (double)B * n_tok;
        printf("%5d | %14.1f %14.1f %6.2f | %8lld %8lld %9.2f | %9lld\n", B, n_gen / best[0], n_gen / best[1],
               best[0] / best[1], (long long)passes, (long long)rows, passes ? (double)rows / (double)passes : 0.0,
               (long long)l3);
        fflush(stdout);
    }
    for (int i = 0; i < max_b; i++) tri_spec_free(specs[i]);
    for (int i = 0; i < MAX_B; i++) free(prompts[i]);
    tri_model_free(m);
    return 0;
}
