// bench-batch.c - several sequences in one forward pass (tri_session_eval_batch) against the same
// sequences one after another: aggregate tokens per second of prefill and decode at batch 1, 2, 4
// and 8, and what packing prompts of different lengths saves over padding them to the longest.
// A client of the public API only (tri_dep).
//
// usage: bench-batch MODEL [TOKENS=32] [N_THREADS=0] [MAX_BATCH=8] [REPEATS=3] [CLOCK=wall]
//
// CLOCK cpu times everything by the process's CPU time instead of the wall clock: with N_THREADS 1
// that is the work each way takes, which other work on a shared machine hardly changes.
//
// Each batch size B takes B sessions with prompts of different lengths (37 to 240 tokens). First
// the sequences run one by one: each prompt, then TOKENS greedy tokens. Then the same sequences
// as a batch: the prompts in one tri_session_eval_batch call (packed), then one call per token
// for all of them. The check comes first: every sequence's tokens in the batch must be the ones
// it gets alone (on the CPU its logits are bit for bit the same). Then, with the prompts padded to
// the longest (the rows a padded batch computes), the same prefill again: the time packing saves.
// Each figure is the best of REPEATS runs, the one-by-one, batched and padded runs interleaved,
// so that a machine shared with other work slows each of them alike.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triforce.h"

#define MAX_B 8
#define MAX_TOKENS 1024

static const int32_t lengths[MAX_B] = {37, 201, 96, 150, 18, 240, 64, 120};

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int fail(const char *what, tri_status st) {
    fprintf(stderr, "bench-batch: %s: %s (%s)\n", what, tri_last_error(), tri_status_str(st));
    return 1;
}

// Time to first token of a short prompt that arrives while a long one prefills: after the long
// one's whole prefill (first come, first served), or in the next pass of a continuous batch whose
// passes tri_batch_plan keeps at BUDGET tokens (Dynamic SplitFuse: the long prompt in chunks).
#define TTFT_LONG 2048
#define TTFT_SHORT 32
#define TTFT_BUDGET 256

static int ttft(const tri_model *m, int32_t n_threads, int32_t reps) {
    const int32_t V = tri_token_count(m);
    int32_t *lp = malloc(sizeof(int32_t) * TTFT_LONG), sp_[TTFT_SHORT];
    for (int t = 0; t < TTFT_LONG; t++) lp[t] = (int32_t)((t * 6151 + 17) % V);
    for (int t = 0; t < TTFT_SHORT; t++) sp_[t] = (int32_t)((t * 3571 + 5) % V);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = TTFT_LONG + 1;
    sp.n_threads = n_threads;
    tri_session *L, *S;
    tri_status st;
    if ((st = tri_session_create(m, &sp, &L)) || (st = tri_session_create(m, &sp, &S))) return fail("session", st);
    double best[4] = {1e30, 1e30, 1e30, 1e30};  // FCFS: short's TTFT, long's prefill; SplitFuse: the same
    int32_t passes = 0;
    for (int32_t r = 0; r < reps; r++) {
        tri_session_reset(L), tri_session_reset(S);
        double t0 = now();
        if ((st = tri_session_eval(L, lp, TTFT_LONG, false))) return fail("long prefill", st);
        double t1 = now();
        if ((st = tri_session_eval(S, sp_, TTFT_SHORT, false))) return fail("short prefill", st);
        double t2 = now(), t[4] = {t2 - t0, t1 - t0, 0, 0};
        // the short prompt arrives as the long one's first pass starts: both with the same head start
        tri_session_reset(L), tri_session_reset(S);
        int32_t done[2] = {0, 0}, first = -1;
        tri_session *ss[2] = {L, S};
        const int32_t *src[2] = {lp, sp_};
        passes = 0;
        t0 = now();
        while (done[0] < TTFT_LONG) {
            int32_t left[2] = {TTFT_LONG - done[0], TTFT_SHORT - done[1]}, take[2], n = 0, cnt[2];
            tri_batch_plan(left, 2, TTFT_BUDGET, take);
            tri_session *run[2];
            const int32_t *toks[2];
            for (int i = 0; i < 2; i++)
                if (take[i]) run[n] = ss[i], toks[n] = src[i] + done[i], cnt[n++] = take[i];
            if ((st = tri_session_eval_batch(run, toks, cnt, n))) return fail("continuous batch", st);
            passes++;
            done[0] += take[0], done[1] += take[1];
            if (done[1] == TTFT_SHORT && first < 0) first = passes, t[2] = now() - t0;
        }
        t[3] = now() - t0;
        for (int k = 0; k < 4; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
    }
    printf(
        "time to first token of a %d-token prompt arriving with a %d-token one: first come first served %.3f s, "
        "continuous batch of %d-token passes %.3f s (%.1fx sooner); the long prompt's prefill %.3f s alone, %.3f s "
        "in %d passes beside it\n",
        TTFT_SHORT, TTFT_LONG, best[0], TTFT_BUDGET, best[2], best[0] / best[2], best[1], best[3], passes);
    tri_session_free(L), tri_session_free(S);
    free(lp);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench-batch MODEL [TOKENS=32] [N_THREADS=0] [MAX_BATCH=8] [REPEATS=3] [CLOCK=wall|cpu]\n");
        return 2;
    }
    int32_t n_tok = argc > 2 ? atoi(argv[2]) : 32, n_threads = argc > 3 ? atoi(argv[3]) : 0;
    int32_t max_b = argc > 4 ? atoi(argv[4]) : MAX_B, reps = argc > 5 ? atoi(argv[5]) : 3;
    if (argc > 6) bench_clock = strcmp(argv[6], "cpu") == 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    if (n_tok < 1 || n_tok > MAX_TOKENS || max_b < 1 || max_b > MAX_B || reps < 1) {
        fprintf(stderr, "bench-batch: TOKENS in [1, %d], MAX_BATCH in [1, %d], REPEATS >= 1\n", MAX_TOKENS, MAX_B);
        return 2;
    }
    tri_model *m;
    tri_status st = tri_model_load(argv[1], NULL, &m);
    if (st) return fail(argv[1], st);
    const int32_t V = tri_token_count(m);
    int32_t *prompts[MAX_B], *padded[MAX_B];
    for (int i = 0; i < MAX_B; i++) {
        prompts[i] = malloc(sizeof(int32_t) * 256);
        padded[i] = malloc(sizeof(int32_t) * 256);
        for (int t = 0; t < 256; t++) padded[i][t] = prompts[i][t] = (int32_t)((t * 7919 + i * 104729 + 13) % V);
    }
    static int32_t alone[MAX_B][MAX_TOKENS], together[MAX_B][MAX_TOKENS];
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 256 + n_tok + 1;
    sp.n_threads = n_threads;
    tri_session *ss[MAX_B] = {0};
    for (int i = 0; i < max_b; i++)
        if ((st = tri_session_create(m, &sp, &ss[i]))) return fail("session", st);
    printf(
        "model: %s, %d greedy tokens per sequence after prompts of %d to %d tokens, CPU backend, %s threads, "
        "timed by %s\n",
        argv[1], n_tok, 18, 240, n_threads ? argv[3] : "all",
        bench_clock == CLOCK_MONOTONIC ? "the wall clock" : "the process's CPU time");
    printf("%5s %9s | %12s %12s %6s | %12s %12s %6s | %9s %9s %9s\n", "batch", "prompt", "prefill 1x1", "batched",
           "ratio", "decode 1x1", "batched", "ratio", "padded", "pad tok/s", "saved");
    for (int32_t B = 1; B <= max_b; B *= 2) {
        int64_t n_prompt = 0, longest = 0;
        for (int i = 0; i < B; i++) {
            n_prompt += lengths[i];
            longest = lengths[i] > longest ? lengths[i] : longest;
        }
        double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};  // prefill, decode: 1x1, batched; padded
        for (int32_t r = 0; r < reps; r++) {
            // one by one
            double t_pre1 = 0, t_dec1 = 0;
            for (int i = 0; i < B; i++) {
                tri_session_reset(ss[i]);
                double t0 = now();
                if ((st = tri_session_eval(ss[i], prompts[i], lengths[i], false))) return fail("prefill", st);
                double t1 = now();
                for (int32_t k = 0; k < n_tok; k++) {
                    alone[i][k] = argmax(tri_session_logits(ss[i], -1), V);
                    if (k + 1 < n_tok && (st = tri_session_eval(ss[i], &alone[i][k], 1, false)))
                        return fail("decode", st);
                }
                t_pre1 += t1 - t0;
                t_dec1 += now() - t1;
            }
            // batched
            const int32_t *toks[MAX_B];
            int32_t n[MAX_B], next[MAX_B];
            for (int i = 0; i < B; i++) tri_session_reset(ss[i]), toks[i] = prompts[i], n[i] = lengths[i];
            double t0 = now();
            if ((st = tri_session_eval_batch(ss, toks, n, B))) return fail("batched prefill", st);
            double t1 = now();
            for (int32_t k = 0; k < n_tok; k++) {
                for (int i = 0; i < B; i++) {
                    together[i][k] = next[i] = argmax(tri_session_logits(ss[i], -1), V);
                    toks[i] = &next[i], n[i] = 1;
                }
                if (k + 1 < n_tok && (st = tri_session_eval_batch(ss, toks, n, B))) return fail("batched decode", st);
            }
            double t2 = now();
            for (int i = 0; i < B; i++)
                if (memcmp(alone[i], together[i], sizeof(int32_t) * (size_t)n_tok) != 0) {
                    fprintf(stderr,
                            "bench-batch: check failed: sequence %d of a batch of %d generates other tokens than "
                            "alone\n",
                            i, B);
                    return 1;
                }
            // padded: every prompt as long as the longest, the rows a padded batch computes
            for (int i = 0; i < B; i++) tri_session_reset(ss[i]), toks[i] = padded[i], n[i] = (int32_t)longest;
            double t3 = now();
            if ((st = tri_session_eval_batch(ss, toks, n, B))) return fail("padded prefill", st);
            double t_pad = now() - t3, t[5] = {t_pre1, t_dec1, t1 - t0, t2 - t1, t_pad};
            for (int k = 0; k < 5; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
        }
        const double t_pre1 = best[0], t_dec1 = best[1], t_preb = best[2], t_decb = best[3], t_pad = best[4];
        double dec = (double)B * (n_tok - 1);  // the tokens after each prompt's first
        printf("%5d %9lld | %12.1f %12.1f %6.2f | %12.1f %12.1f %6.2f | %9lld %9.1f %8.0f%%\n", B, (long long)n_prompt,
               n_prompt / t_pre1, n_prompt / t_preb, t_pre1 / t_preb, dec / t_dec1, dec / t_decb, t_dec1 / t_decb,
               (long long)(B * longest), n_prompt / t_pad, 100.0 * (1.0 - t_preb / t_pad));
        fflush(stdout);
    }
    printf("check: every sequence's %d greedy tokens in each batch equal its tokens alone (best of %d runs each)\n",
           n_tok, reps);
    printf(
        "(tok/s: prompt tokens or generated tokens of all sequences per second; ratio: one by one's time over the "
        "batch's; padded: rows of a batch padded to the longest prompt, pad tok/s its useful tokens per second, "
        "saved: the prefill time packing saves over it)\n");
    for (int i = 0; i < MAX_B; i++) free(prompts[i]), free(padded[i]), tri_session_free(ss[i]);
    int rc = ttft(m, n_threads, reps);
    tri_model_free(m);
    return rc;
}
