// test-batch.c - several sessions in shared forward passes (tri_session_eval_batch).
//
// Batch invariance on the CPU backend: every session of a batch gets, bit for bit, the logits it
// gets evaluated alone, over prompts of different lengths packed into one pass (longer than a
// step, so they go in chunks beside the others' rows), then decode steps together, whatever each
// session's cache policy (full f16 / f32, offloaded, StreamingLLM, H2O, retrieval) or batch size.
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
    {TRI_KV_POLICY_FULL, TRI_DTYPE_F16, 0, 0, 16, 37},
    {TRI_KV_POLICY_FULL, TRI_DTYPE_F32, 0, 0, 16, 5},
    {TRI_KV_POLICY_STREAMING, TRI_DTYPE_F16, 24, 0, 16, 41},
    {TRI_KV_POLICY_FULL, TRI_DTYPE_F16, 0, 2, 8, 19},
    {TRI_KV_POLICY_H2O, TRI_DTYPE_F32, 24, 0, 16, 30},
    {TRI_KV_POLICY_RETRIEVAL, TRI_DTYPE_F16, 16, 0, 16, 1},
};

static tri_session *make_session(const tri_model *m, const seq_case *c) {
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
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

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// The prompt of sequence i: n tokens from a seeded walk over the vocabulary.
static void prompt_of(int32_t i, int32_t n, int32_t V, int32_t *out) {
    for (int32_t t = 0; t < n; t++) out[t] = (int32_t)((t * 131 + i * 977 + 7) % V);
}

// Sequences first..first + n - 1 of cases: alone, each prompt then N_DECODE greedy steps (the
// logits of every step kept), then all of them together through tri_session_eval_batch; every
// logit must be the same bits.
static void check_batch(const tri_model *m, int32_t first, int32_t n) {
    const int32_t V = tri_token_count(m);
    float *want = malloc(sizeof(float) * (size_t)(N_SEQ * (N_DECODE + 1)) * (size_t)V);
    int32_t prompts[N_SEQ][64];
    cr_assert(want);
    for (int32_t i = 0; i < n; i++) {
        const seq_case *c = &cases[first + i];
        prompt_of(first + i, c->n_prompt, V, prompts[i]);
        tri_session *s = make_session(m, c);
        cr_assert_eq(tri_session_eval(s, prompts[i], c->n_prompt, false), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t d = 0; d <= N_DECODE; d++) {
            const float *l = tri_session_logits(s, -1);
            memcpy(want + ((int64_t)i * (N_DECODE + 1) + d) * V, l, sizeof(float) * (size_t)V);
            int32_t tok = argmax(l, V);
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
            cr_assert(memcmp(l, want + ((int64_t)i * (N_DECODE + 1) + d) * V, sizeof(float) * (size_t)V) == 0,
                      "sequence %d (policy %d) of a batch of %d: step %d's logits differ from its logits alone",
                      first + i, (int)cases[first + i].policy, n, d);
            next[i] = argmax(l, V);
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
