// test-batch.c - several sessions in shared forward passes (tri_session_eval_batch).
//
// Batch invariance on the CPU backend: every session of a batch gets, bit for bit, the logits it
// gets evaluated alone, over prompts of different lengths packed into one pass (longer than a
// step, so they go in chunks beside the others' rows), then decode steps together, whatever each
// session's cache policy (full f16 / f32, offloaded, StreamingLLM, H2O, retrieval) or batch size.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test-util.h"
#include "triforce.h"

#define N_SEQ 6
#define N_DECODE 5

typedef struct seq_case {
    tri_kv_policy policy;
    tri_dtype kv_type;
    int32_t kv_budget, offloaded, n_batch, n_prompt;
} seq_case;

// Prompts of different lengths (longer than n_batch in places), each with its own policy.
static const seq_case cases[N_SEQ] = {
    {TRI_KV_POLICY_FULL, TRI_DTYPE_F16, 0, 0, 16, 37},       {TRI_KV_POLICY_FULL, TRI_DTYPE_F32, 0, 0, 16, 5},
    {TRI_KV_POLICY_STREAMING, TRI_DTYPE_F16, 24, 0, 16, 41}, {TRI_KV_POLICY_FULL, TRI_DTYPE_F16, 0, 2, 8, 19},
    {TRI_KV_POLICY_H2O, TRI_DTYPE_F32, 24, 0, 16, 30},       {TRI_KV_POLICY_RETRIEVAL, TRI_DTYPE_F16, 16, 0, 16, 1},
};

static tri_device_kind device = TRI_DEVICE_CPU;  // where make_session puts the sessions
static const char *devices;                       // or over which devices

static tri_session *make_session(const tri_model *m, const seq_case *c) {
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = device;
    sp.devices = devices;
    sp.n_ctx = 96;
    sp.n_batch = c->n_batch;
    sp.kv_type = c->kv_type;
    sp.kv_policy = c->policy;
    sp.kv_budget = c->kv_budget;
    sp.kv_layers_offloaded = c->offloaded;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    return s;
}

// The prompt of sequence i: n tokens from a seeded walk over the vocabulary.
static void prompt_of(int32_t i, int32_t n, int32_t V, int32_t *out) {
    for (int32_t t = 0; t < n; t++) out[t] = (int32_t)((t * 131 + i * 977 + 7) % V);
}

// Sequences first..first + n - 1 of cases: alone, each prompt then N_DECODE greedy steps (the
// logits of every step kept), then all of them together through tri_session_eval_batch, fed the
// same tokens; every logit must be the same bits (tol 0), or within tol of the largest magnitude.
static void check_batch_tol(const tri_model *m, int32_t first, int32_t n, float tol) {
    const int32_t V = tri_token_count(m);
    float *want = malloc(sizeof(float) * (size_t)(N_SEQ * (N_DECODE + 1)) * (size_t)V);
    int32_t prompts[N_SEQ][64], alone_tok[N_SEQ][N_DECODE + 1];
    cr_assert(want);
    for (int32_t i = 0; i < n; i++) {
        const seq_case *c = &cases[first + i];
        prompt_of(first + i, c->n_prompt, V, prompts[i]);
        tri_session *s = make_session(m, c);
        cr_assert_eq(tri_session_eval(s, prompts[i], c->n_prompt, false), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t d = 0; d <= N_DECODE; d++) {
            const float *l = tri_session_logits(s, -1);
            memcpy(want + ((int64_t)i * (N_DECODE + 1) + d) * V, l, sizeof(float) * (size_t)V);
            int32_t tok = alone_tok[i][d] = tt_argmax(l, V);
            if (d < N_DECODE) cr_assert_eq(tri_session_eval(s, &tok, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        }
        tri_session_free(s);
    }
    tri_session *ss[N_SEQ];
    const int32_t *toks[N_SEQ];
    int32_t n_toks[N_SEQ], next[N_SEQ];
    for (int32_t i = 0; i < n; i++) {
        ss[i] = make_session(m, &cases[first + i]);
        toks[i] = prompts[i];
        n_toks[i] = cases[first + i].n_prompt;
    }
    for (int32_t d = 0; d <= N_DECODE; d++) {
        cr_assert_eq(tri_session_eval_batch(ss, toks, n_toks, n), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t i = 0; i < n; i++) {
            const float *l = tri_session_logits(ss[i], -1);
            cr_assert(l);
            const float *w = want + ((int64_t)i * (N_DECODE + 1) + d) * V;
            if (tol == 0) {
                cr_assert(memcmp(l, w, sizeof(float) * (size_t)V) == 0,
                          "sequence %d (policy %d) of a batch of %d: step %d's logits differ from its logits alone",
                          first + i, (int)cases[first + i].policy, n, d);
            } else {
                float err = 0, mag = 0;
                for (int32_t j = 0; j < V; j++) {
                    err = fmaxf(err, fabsf(l[j] - w[j]));
                    mag = fmaxf(mag, fabsf(w[j]));
                }
                cr_assert(err <= tol * mag, "sequence %d of a batch of %d: step %d's logits %g off alone's (of %g)",
                          first + i, n, d, err, mag);
            }
            next[i] = alone_tok[i][d];
            toks[i] = &next[i];
            n_toks[i] = 1;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        cr_assert_eq(tri_session_n_past(ss[i]), cases[first + i].n_prompt + N_DECODE);
        tri_session_free(ss[i]);
    }
    free(want);
}

// The suite's model, under its own name per test (the tests run at the same time).
static void check_batch(const tri_model *m, int32_t first, int32_t n) { check_batch_tol(m, first, n, 0); }

static const char *gen_model(const char *tag) {
    return tt_gen_model(tag, "--dtype f32 --gguf-dtype q4_1 --heads 4 --kv-heads 2 --head-dim 32 --layers 3");
}

Test(batch, every_sequence_gets_its_logits_alone, .timeout = TT_TIMEOUT(60)) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("batch-q4_1"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    check_batch(m, 0, N_SEQ);  // every policy in one batch
    check_batch(m, 0, 2);      // two full caches
    check_batch(m, 3, 1);      // a batch of one
    tri_model_free(m);
}

Test(batch, refusals_name_the_session_and_change_nothing) {
    tri_model *m, *m2;
    cr_assert_eq(tri_model_load(gen_model("batch-refuse"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_model_load(gen_model("batch-refuse"), NULL, &m2), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session *a = make_session(m, &cases[0]), *b = make_session(m, &cases[1]), *c = make_session(m2, &cases[1]);
    const int32_t t3[3] = {1, 2, 3}, bad[2] = {4, 1 << 30}, *toks[2] = {t3, t3};
    int32_t n[2] = {3, 3};
    cr_assert_eq(tri_session_eval(a, t3, 3, false), TRI_STATUS_OK);

    tri_session *same[2] = {a, a};
    cr_assert_eq(tri_session_eval_batch(same, toks, n, 2), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "sessions 0 and 1 are the same session"), "%s", tri_last_error());
    tri_session *models[2] = {a, c};
    cr_assert_eq(tri_session_eval_batch(models, toks, n, 2), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "session 1 runs another model"), "%s", tri_last_error());
    tri_session *ab[2] = {a, b};
    const int32_t *with_bad[2] = {t3, bad};
    int32_t n_bad[2] = {3, 2};
    cr_assert_eq(tri_session_eval_batch(ab, with_bad, n_bad, 2), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "session 1: token 1073741824 at 1"), "%s", tri_last_error());
    int32_t n_big[2] = {1, 200};
    const int32_t *big_toks[2] = {t3, calloc(200, sizeof(int32_t))};
    cr_assert_eq(tri_session_eval_batch(ab, big_toks, n_big, 2), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "session 1: context full"), "%s", tri_last_error());
    free((void *)big_toks[1]);
    cr_assert_eq(tri_session_eval_batch(ab, toks, n, 0), TRI_STATUS_INVALID_ARGUMENT);
    // a session split over two CPU ranks beside one on the CPU
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 32;
    sp.devices = "cpu:0,cpu:1";
    tri_session *tp[2];
    cr_assert_eq(tri_session_create(m, &sp, &tp[0]), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_create(m, &sp, &tp[1]), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session *mixed[2] = {b, tp[0]};
    cr_assert_eq(tri_session_eval_batch(mixed, toks, n, 2), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "session 1 computes on cpu:0,cpu:1, session 0 on cpu"), "%s", tri_last_error());
    tri_session_free(tp[0]);
    tri_session_free(tp[1]);
    // nothing ran
    cr_assert_eq(tri_session_n_past(a), 3);
    cr_assert_eq(tri_session_n_past(b), 0);
    cr_assert(tri_session_logits(a, -1), "a refused batch keeps the last logits");
    tri_session_free(a);
    tri_session_free(b);
    tri_session_free(c);
    tri_model_free(m);
    tri_model_free(m2);
}

Test(batch, plan_shares_the_budget_decode_first) {
    const int32_t left[5] = {1, 1000, 1, 5, 0};
    int32_t take[5];
    cr_assert_eq(tri_batch_plan(left, 5, 64, take), 64);
    const int32_t want[5] = {1, 57, 1, 5, 0};  // 62 after the decodes: 31 each, then the 26 the short one left
    for (int i = 0; i < 5; i++) cr_assert_eq(take[i], want[i], "sequence %d takes %d, not %d", i, take[i], want[i]);
    const int32_t decodes[3] = {1, 1, 1};
    cr_assert_eq(tri_batch_plan(decodes, 3, 2, take), 3, "every decode step runs, whatever the budget");
    const int32_t few[2] = {3, 4};
    cr_assert_eq(tri_batch_plan(few, 2, 64, take), 7);
    cr_assert(take[0] == 3 && take[1] == 4);
    const int32_t three[3] = {100, 100, 100};  // 10 over 3: 3 each, then the one left to the first
    cr_assert_eq(tri_batch_plan(three, 3, 10, take), 10);
    cr_assert(take[0] == 4 && take[1] == 3 && take[2] == 3, "%d %d %d", take[0], take[1], take[2]);
    cr_assert_eq(tri_batch_plan(left, 5, 0, take), -1);
    cr_assert_eq(tri_batch_plan(NULL, 5, 8, take), -1);
    const int32_t neg[1] = {-1};
    cr_assert_eq(tri_batch_plan(neg, 1, 8, take), -1);
}

// Dynamic SplitFuse: a long prompt prefills in planned chunks beside another sequence's decode
// steps, and a short prompt arriving meanwhile starts at once; every logit is the one alone.
Test(batch, prompt_chunks_fused_with_decode_steps_equal_alone, .timeout = TT_TIMEOUT(60)) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("batch-fuse"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t V = tri_token_count(m);
    enum { LONG = 70, SHORT = 6, BUDGET = 12, STEPS = 12 };
    int32_t p_long[LONG], p_short[SHORT], p_dec[4];
    prompt_of(1, LONG, V, p_long);
    prompt_of(2, SHORT, V, p_short);
    prompt_of(3, 4, V, p_dec);
    const seq_case c = {TRI_KV_POLICY_FULL, TRI_DTYPE_F16, 0, 0, 16, 0};
    // alone: the decoder's greedy steps, the prompts' last logits
    float *dec_alone = malloc(sizeof(float) * (size_t)(STEPS * V)), *long_alone = malloc(sizeof(float) * (size_t)V);
    float *short_alone = malloc(sizeof(float) * (size_t)V);
    tri_session *s = make_session(m, &c);
    cr_assert_eq(tri_session_eval(s, p_dec, 4, false), TRI_STATUS_OK);
    for (int i = 0; i < STEPS; i++) {
        int32_t t = tt_argmax(tri_session_logits(s, -1), V);
        cr_assert_eq(tri_session_eval(s, &t, 1, false), TRI_STATUS_OK);
        memcpy(dec_alone + (int64_t)i * V, tri_session_logits(s, -1), sizeof(float) * (size_t)V);
    }
    tri_session_reset(s);
    cr_assert_eq(tri_session_eval(s, p_long, LONG, false), TRI_STATUS_OK);
    memcpy(long_alone, tri_session_logits(s, -1), sizeof(float) * (size_t)V);
    tri_session_reset(s);
    cr_assert_eq(tri_session_eval(s, p_short, SHORT, false), TRI_STATUS_OK);
    memcpy(short_alone, tri_session_logits(s, -1), sizeof(float) * (size_t)V);
    tri_session_free(s);

    tri_session *ss[3] = {make_session(m, &c), make_session(m, &c), make_session(m, &c)};
    cr_assert_eq(tri_session_eval(ss[0], p_dec, 4, false), TRI_STATUS_OK);
    const int32_t *src[3] = {NULL, p_long, p_short};
    int32_t done[3] = {0, 0, 0}, next = 0, short_passes = 0;
    for (int pass = 0; pass < STEPS; pass++) {
        int32_t left[3] = {1, LONG - done[1], pass >= 2 ? SHORT - done[2] : 0}, take[3];  // the short one comes later
        int32_t all = 1 + left[1] + left[2];
        cr_assert_eq(tri_batch_plan(left, 3, BUDGET, take), all < BUDGET ? all : BUDGET);
        tri_session *run[3];
        const int32_t *toks[3];
        int32_t n[3], k = 0;
        next = tt_argmax(tri_session_logits(ss[0], -1), V);
        for (int i = 0; i < 3; i++) {
            if (!take[i]) continue;
            run[k] = ss[i], n[k] = take[i], toks[k++] = i == 0 ? &next : src[i] + done[i];
        }
        cr_assert_eq(tri_session_eval_batch(run, toks, n, k), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(memcmp(tri_session_logits(ss[0], -1), dec_alone + (int64_t)pass * V, sizeof(float) * (size_t)V) == 0,
                  "decode step %d beside prompt chunks differs from decoding alone", pass);
        for (int i = 1; i < 3; i++) done[i] += take[i];
        short_passes += take[2] > 0;
        if (take[2] && done[2] == SHORT)
            cr_assert(memcmp(tri_session_logits(ss[2], -1), short_alone, sizeof(float) * (size_t)V) == 0);
    }
    cr_assert_eq(done[1], LONG, "the long prompt is done after %d passes", STEPS);
    cr_assert(memcmp(tri_session_logits(ss[1], -1), long_alone, sizeof(float) * (size_t)V) == 0,
              "the long prompt run in chunks beside the others ends with other logits than alone");
    cr_assert_eq(short_passes, 2, "the short prompt waited: %d passes", short_passes);  // 5 + the 1 left
    for (int i = 0; i < 3; i++) tri_session_free(ss[i]);
    free(dec_alone), free(long_alone), free(short_alone);
    tri_model_free(m);
}

// On a GPU (the emulator in CI) each session has its own stream: the batch's pass runs on the
// first one's, each sequence's cache and attention on its own. Not batch-invariant there (cuBLAS
// picks its kernels by shape), so within the suite's tolerance.
Test(batch, cuda_sessions_share_a_pass, .timeout = TT_TIMEOUT(120)) {
    if (tri_device_count() <= 0) cr_skip_test("no CUDA device (%s)", tri_cuda_status());
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("batch-cuda"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    device = TRI_DEVICE_CUDA;
    // full f32, StreamingLLM and an offloaded full cache in one batch
    check_batch_tol(m, 1, 3, 2e-3f);
    tri_model_free(m);
}

// Tensor parallelism: each rank runs its share of the batch's pass over its shards of every
// session, all-reducing through the first session's ranks; the same bits as each session alone.
Test(batch, sessions_over_two_cpu_ranks, .timeout = TT_TIMEOUT(60)) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("batch-tp"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    devices = "cpu:0,cpu:1";
    check_batch(m, 0, N_SEQ);
    tri_model_free(m);
}

// Verification rows: after its prompt, every sequence runs catch-up tokens and a draft in one
// batched pass keeping the draft's rows (or every row, or the last one alone); each kept row is,
// bit for bit, the row tri_session_eval(all_logits) gives the same tokens alone, whatever the policy.
Test(batch, kept_rows_of_a_verification_equal_alone, .timeout = TT_TIMEOUT(60)) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("batch-rows"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t V = tri_token_count(m);
    enum { RUN = 23 };  // longer than a step of 16 (and of 8): the kept rows start in a later step
    const int32_t keep[N_SEQ] = {7, 1, 23, 18, 3, 9};
    int32_t prompts[N_SEQ][64], runs[N_SEQ][RUN];
    float *want = malloc(sizeof(float) * (size_t)(N_SEQ * RUN) * (size_t)V);
    cr_assert(want);
    for (int32_t i = 0; i < N_SEQ; i++) {
        prompt_of(i, cases[i].n_prompt, V, prompts[i]);
        prompt_of(i + 50, RUN, V, runs[i]);
        tri_session *s = make_session(m, &cases[i]);
        cr_assert_eq(tri_session_eval(s, prompts[i], cases[i].n_prompt, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_eval(s, runs[i], RUN, true), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t j = 0; j < RUN; j++)
            memcpy(want + ((int64_t)i * RUN + j) * V, tri_session_logits(s, j), sizeof(float) * (size_t)V);
        tri_session_free(s);
    }
    tri_session *ss[N_SEQ];
    const int32_t *toks[N_SEQ];
    int32_t n_toks[N_SEQ];
    for (int32_t i = 0; i < N_SEQ; i++) {
        ss[i] = make_session(m, &cases[i]);
        toks[i] = prompts[i];
        n_toks[i] = cases[i].n_prompt;
    }
    cr_assert_eq(tri_session_eval_batch(ss, toks, n_toks, N_SEQ), TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t i = 0; i < N_SEQ; i++) toks[i] = runs[i], n_toks[i] = RUN;
    cr_assert_eq(tri_session_eval_batch_rows(ss, toks, n_toks, keep, N_SEQ), TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t i = 0; i < N_SEQ; i++) {
        for (int32_t j = 0; j < keep[i]; j++) {
            const float *l = tri_session_logits(ss[i], j);
            cr_assert(l, "sequence %d: row %d of %d kept", i, j, keep[i]);
            cr_assert(memcmp(l, want + ((int64_t)i * RUN + RUN - keep[i] + j) * V, sizeof(float) * (size_t)V) == 0,
                      "sequence %d (policy %d): kept row %d of %d differs from token %d's row alone", i,
                      (int)cases[i].policy, j, keep[i], RUN - keep[i] + j);
        }
        cr_assert_null(tri_session_logits(ss[i], keep[i]), "sequence %d: a row past the %d kept", i, keep[i]);
        cr_assert(memcmp(tri_session_logits(ss[i], -1), want + ((int64_t)i * RUN + RUN - 1) * V,
                         sizeof(float) * (size_t)V) == 0);
    }
    // a count outside [1, n_tokens] is refused, naming the session, before anything runs
    const int32_t bad[N_SEQ] = {1, 1, 0, 1, 1, 1};
    cr_assert_eq(tri_session_eval_batch_rows(ss, toks, n_toks, bad, N_SEQ), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "session 2: 0 rows of logits of 23 tokens"), "%s", tri_last_error());
    cr_assert_eq(tri_session_n_past(ss[2]), cases[2].n_prompt + RUN);
    for (int32_t i = 0; i < N_SEQ; i++) tri_session_free(ss[i]);
    free(want);
    tri_model_free(m);
}
