// test-llama.c - the CPU forward pass against an independent reference.
//
// Each case generates a seeded model with tri-gen-model (GGUF with adjacent-pair Q/K rows, HF
// with half-split rows: the same model), has tests/reference/llama_ref.py (numpy, float64,
// following HF transformers' LlamaForCausalLM) compute the logits of a prompt at every position
// from the HF files, and compares ours from both files with them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test-util.h"
#include "triforce.h"

#define N_PROMPT 24

static const int32_t prompt[N_PROMPT] = {17, 260, 3,   99, 42, 42, 301, 7,  150, 5,   77, 270,
                                         8,  64,  200, 1,  33, 90, 4,   11, 250, 260, 19, 0};

static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

typedef struct ref_case {
    char gguf[4096], hf[4096];
    float *logits;   // (N_PROMPT, n_vocab) from the reference
    int32_t n_vocab;
    int32_t greedy[8];
} ref_case;

// Generates the model pair for opts and runs the reference on its HF half.
static void make_case(ref_case *rc, const char *tag, const char *opts) {
    const char *gen = getenv("TRI_GEN_MODEL"), *py = tt_python("reference/llama_ref.py"), *src = getenv("TRI_TEST_SRC");
    cr_assert(gen && py && src, "TRI_GEN_MODEL, TRI_TEST_PYTHON, TRI_TEST_SRC: run through meson test");
    char name[128], out[4096], greedy_out[4096], cmd[32768], toks[512];
    snprintf(name, sizeof name, "llama-%s.gguf", tag);
    snprintf(rc->gguf, sizeof rc->gguf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "llama-%s.hf", tag);
    snprintf(rc->hf, sizeof rc->hf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "llama-%s.logits", tag);
    snprintf(out, sizeof out, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "llama-%s.greedy", tag);
    snprintf(greedy_out, sizeof greedy_out, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && '%s' %s --out-gguf '%s' --out-hf '%s' >/dev/null",
             rc->gguf, rc->hf, gen, opts, rc->gguf, rc->hf);
    cr_assert_eq(run(cmd), 0, "generator failed: %s", cmd);
    int len = 0;
    for (int i = 0; i < N_PROMPT; i++) len += snprintf(toks + len, sizeof toks - (size_t)len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd, sizeof cmd, "'%s' '%s/reference/llama_ref.py' --model '%s' --tokens %s --out '%s' --greedy 8 > '%s'",
             py, src, rc->hf, toks, out, greedy_out);
    cr_assert_eq(run(cmd), 0, "reference failed: %s", cmd);
    size_t n;
    rc->logits = tt_read_file(out, &n);
    cr_assert(n % (N_PROMPT * 4) == 0 && n > 0);
    rc->n_vocab = (int32_t)(n / (N_PROMPT * 4));
    char *g = tt_read_file(greedy_out, NULL);
    char *p = g;
    for (int i = 0; i < 8; i++) {
        while (*p && (*p < '0' || *p > '9')) p++;
        cr_assert(*p, "reference printed fewer than 8 greedy ids: %s", g);
        rc->greedy[i] = (int32_t)strtol(p, &p, 10);
    }
    free(g);
}

// Compares every position's logits of model_path with the reference: max |diff| <= tol (scaled by
// the logits' spread) and the same argmax wherever the reference's top two are apart.
static void check_logits(const ref_case *rc, const char *model_path, tri_dtype kv_type, int32_t n_batch,
                         double tol) {
    tri_model *m;
    cr_assert_eq(tri_model_load(model_path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.kv_type = kv_type;
    sp.n_batch = n_batch;
    sp.n_ctx = 64;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < N_PROMPT; i++) {
        const float *got = tri_session_logits(s, i), *want = rc->logits + (int64_t)i * rc->n_vocab;
        float lo = want[0], hi = want[0];
        for (int j = 0; j < rc->n_vocab; j++) {
            lo = fminf(lo, want[j]);
            hi = fmaxf(hi, want[j]);
        }
        double scale = fmax(1.0, (double)(hi - lo));
        for (int j = 0; j < rc->n_vocab; j++)
            cr_assert(fabs((double)got[j] - (double)want[j]) <= tol * scale,
                      "%s pos %d token %d: %g vs reference %g (tol %g x %g)", model_path, i, j,
                      (double)got[j], (double)want[j], tol, scale);
    }
    tri_session_free(s);
    tri_model_free(m);
}

static void check_greedy(const ref_case *rc, const char *model_path) {
    tri_model *m;
    cr_assert_eq(tri_model_load(model_path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session *s;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.kv_type = TRI_DTYPE_F32;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK);
    int32_t got[8], *w = got;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 8;
    gp.stop_at_eos = false;
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(w - got, 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(got[i], rc->greedy[i], "%s: greedy token %d: %d, reference %d", model_path, i, got[i],
                     rc->greedy[i]);
    tri_session_free(s);
    tri_model_free(m);
}

static void free_case(ref_case *rc) { free(rc->logits); }

// f32 weights and cache: only summation order separates us from the float64 reference.
#define TOL_F32 2e-4
// f16 cache: keys and values rounded to 11 bits
#define TOL_F16_KV 5e-3
// quantized weights: the HF half holds the dequantized values, but our kernels also quantize the
// activations to 8 bits per block of 32 before the dot product
#define TOL_QUANT 3e-2

Test(llama, mha_f32_both_layouts_every_position) {
    ref_case rc;
    make_case(&rc, "mha", "--dtype f32 --heads 4 --kv-heads 4 --head-dim 16");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_F32);
    check_logits(&rc, rc.gguf, TRI_DTYPE_F16, 128, TOL_F16_KV);
    check_greedy(&rc, rc.hf);
    check_greedy(&rc, rc.gguf);
    free_case(&rc);
}

Test(llama, gqa_chunked_prefill) {
    ref_case rc;
    make_case(&rc, "gqa", "--dtype f32 --heads 8 --kv-heads 2 --head-dim 8 --layers 3");
    // chunks of 5 and 1 tokens see the same cache as one pass
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 5, TOL_F32);
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 1, TOL_F32);
    check_greedy(&rc, rc.gguf);
    free_case(&rc);
}

Test(llama, yarn_scaling) {
    ref_case rc;
    make_case(&rc, "yarn", "--dtype f32 --rope-scaling yarn --rope-factor 8 --ctx 2048 --theta 10000");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_F32);
    free_case(&rc);
}

// Dynamic NTK past the original context: a model trained on 16 positions, a prompt of 24. The
// reference (as HF's dynamic_rope_update) computes the base once per forward call from its last
// position: one pass for the prompt (base for 24 positions, all 24 rotated with it), then one per
// greedy token (base for its position + 1, the cached keys keeping theirs). One prefill step and
// tri_generate's one-token steps do the same. The config also says
// rope_scaling.original_max_position_embeddings = 8, which transformers ignores for dynamic (it
// scales from max_position_embeddings, 16): reading 8 would grow the base from position 8 on, with
// another formula, and the logits would differ. HF checkpoints only: GGUF has no dynamic rule
// (llama.cpp has none; the file the generator writes is refused as unsupported).
Test(llama, dynamic_ntk_past_the_original_context) {
    ref_case rc;
    make_case(&rc, "dynamic",
              "--dtype f32 --rope-scaling dynamic --rope-factor 2 --ctx 16 --rope-orig-ctx 8 --theta 10000");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    check_logits(&rc, rc.hf, TRI_DTYPE_F16, 128, TOL_F16_KV);
    check_greedy(&rc, rc.hf);
    tri_model *m;
    cr_assert_eq(tri_model_load(rc.gguf, NULL, &m), TRI_STATUS_UNSUPPORTED);
    free_case(&rc);
}

Test(llama, linear_and_llama3_scaling_tied) {
    ref_case rc;
    make_case(&rc, "linear", "--dtype f32 --rope-scaling linear --rope-factor 4 --tied");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_F32);
    free_case(&rc);
    make_case(&rc, "llama3", "--dtype f32 --rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 16");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    // the GGUF carries the rule only as rope_freqs divisors, as llama.cpp's converter writes it
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_F32);
    free_case(&rc);
}

Test(llama, bf16_and_quantized_weights) {
    ref_case rc;
    make_case(&rc, "bf16", "--dtype bf16 --heads 4 --kv-heads 2 --head-dim 16");
    check_logits(&rc, rc.hf, TRI_DTYPE_F32, 128, TOL_F32);
    free_case(&rc);
    const char *quants[] = {"q8_0", "q4_0", "q4_1", "q4_K", "q6_K"};
    for (int i = 0; i < 5; i++) {
        char opts[256];
        // the K-quants need rows of whole super-blocks of 256
        snprintf(opts, sizeof opts, "--dtype f32 --gguf-dtype %s %s", quants[i],
                 i < 3 ? "--embd 128 --ff 256" : "--embd 256 --ff 512 --heads 4 --head-dim 64");
        make_case(&rc, quants[i], opts);
        check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_QUANT);
        free_case(&rc);
    }
}

// IQ4_XS weights (a GGUF whose matrices are all IQ4_XS; the HF half holds their values dequantized
// to f32, checked against the gguf package's dequantization by test-gen-model): every position's
// logits within the quantized tolerance of the reference's on the f32 values, and the same 8
// greedy tokens generated, with the batch of 128 (the prompt in one pass) and of 5 (several).
Test(llama, iq4_xs_weights_generate_as_dequantized) {
    ref_case rc;
    make_case(&rc, "iq4_xs",
              "--dtype f32 --gguf-dtype iq4_xs --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64");
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 128, TOL_QUANT);
    check_logits(&rc, rc.gguf, TRI_DTYPE_F32, 5, TOL_QUANT);
    check_greedy(&rc, rc.gguf);
    free_case(&rc);
}

// Rolling the cache back and running other tokens equals never having run the dropped ones.
Test(llama, truncate_then_decode_equals_fresh) {
    ref_case rc;
    make_case(&rc, "rollback", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16");
    tri_model *m;
    cr_assert_eq(tri_model_load(rc.gguf, NULL, &m), TRI_STATUS_OK);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    tri_session *a, *b;
    cr_assert_eq(tri_session_create(m, &sp, &a), TRI_STATUS_OK);
    cr_assert_eq(tri_session_create(m, &sp, &b), TRI_STATUS_OK);
    const int32_t other[5] = {3, 4, 5, 6, 7};
    cr_assert_eq(tri_session_eval(a, prompt, 16, false), TRI_STATUS_OK);
    cr_assert_eq(tri_session_eval(a, other, 5, false), TRI_STATUS_OK);
    cr_assert_eq(tri_session_truncate(a, 10), TRI_STATUS_OK);
    cr_assert_eq(tri_session_n_past(a), 10);
    cr_assert_eq(tri_session_eval(a, prompt + 10, N_PROMPT - 10, true), TRI_STATUS_OK);
    cr_assert_eq(tri_session_eval(b, prompt, N_PROMPT, true), TRI_STATUS_OK);
    // On the CPU the two differ only in summation order. On a GPU the fresh session's batch of
    // N_PROMPT rows goes through cuBLAS (x split into two halves) and the others through the
    // matvec kernels: 2e-4 of sum |x w| apart at most (tests/test-cuda-backend.c), some 1e-4 here.
    float tol = strncmp(tri_session_device(a), "cuda", 4) == 0 ? 5e-4f : 1e-5f;
    for (int i = 0; i < N_PROMPT - 10; i++) {
        const float *x = tri_session_logits(a, i), *y = tri_session_logits(b, 10 + i);
        for (int j = 0; j < rc.n_vocab; j++)
            cr_assert(fabsf(x[j] - y[j]) <= tol, "%s: pos %d token %d: %g vs %g", tri_session_device(a), 10 + i, j,
                      (double)x[j], (double)y[j]);
    }
    // and the bad cases are refused without damage
    cr_assert_eq(tri_session_truncate(a, 100), TRI_STATUS_INVALID_ARGUMENT);
    int32_t bad = rc.n_vocab;
    cr_assert_eq(tri_session_eval(a, &bad, 1, false), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_n_past(a), N_PROMPT);
    int32_t many[64] = {0};
    cr_assert_eq(tri_session_eval(a, many, 64, false), TRI_STATUS_INVALID_ARGUMENT, "context overflow");
    cr_assert_eq(tri_session_n_past(a), N_PROMPT);
    tri_session_free(a);
    tri_session_free(b);
    tri_model_free(m);
    free_case(&rc);
}

// ---- batch invariance ----
//
// Speculative decoding verifies a draft in one pass and promises plain decoding's greedy tokens,
// which holds because the CPU backend computes every token's row the same way in a batch of any
// size: the logits of a sequence evaluated in one pass (2 threads) equal, bit for bit, those of the
// same tokens fed one at a time (1 thread).

// Generates a model with tri-gen-model (GGUF only) into path (4096 bytes).
static void make_model(char *path, const char *tag, const char *opts) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen, "TRI_GEN_MODEL: run through meson test");
    char name[128], cmd[8192];
    snprintf(name, sizeof name, "llama-%s.gguf", tag);
    snprintf(path, 4096, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -f '%s' && '%s' %s --out-gguf '%s' >/dev/null", path, gen, opts, path);
    cr_assert_eq(run(cmd), 0, "generator failed: %s", cmd);
}

static void check_one_pass_equals_one_by_one(const char *path, tri_dtype kv_type, int32_t n) {
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t n_vocab = info.config.n_vocab, *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) toks[i] = (int32_t)((i * 131 + 7) % n_vocab);
    tri_session_params sp = tri_session_default_params();
    sp.kv_type = kv_type;
    sp.n_ctx = n;
    sp.n_batch = n;
    sp.n_threads = 2;
    tri_session *all, *one;
    cr_assert_eq(tri_session_create(m, &sp, &all), TRI_STATUS_OK, "%s", tri_last_error());
    sp.n_threads = 1;
    cr_assert_eq(tri_session_create(m, &sp, &one), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(all, toks, n, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t i = 0; i < n; i++) {
        cr_assert_eq(tri_session_eval(one, toks + i, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(memcmp(tri_session_logits(one, -1), tri_session_logits(all, i), sizeof(float) * (size_t)n_vocab) == 0,
                  "%s, %s cache: the logits at position %d of a %d-token pass differ from decoding it alone", path,
                  tri_dtype_name(kv_type), i, n);
    }
    free(toks);
    tri_session_free(all);
    tri_session_free(one);
    tri_model_free(m);
}

Test(llama, one_pass_equals_one_token_at_a_time) {
    char path[4096];
    make_model(path, "batch-f32", "--dtype f32 --heads 8 --kv-heads 2 --head-dim 16 --layers 3");
    check_one_pass_equals_one_by_one(path, TRI_DTYPE_F32, 48);
    check_one_pass_equals_one_by_one(path, TRI_DTYPE_F16, 48);
    // quantized weights (x quantized per row) and 1100 tokens: past 1024 keys decoding gives each
    // chunk of a head's keys a task of its own, while the one pass walks them in one task
    make_model(path, "batch-q4_1", "--dtype f32 --gguf-dtype q4_1 --heads 6 --kv-heads 2 --head-dim 32 --ctx 2048");
    check_one_pass_equals_one_by_one(path, TRI_DTYPE_F16, 1100);
    check_one_pass_equals_one_by_one(path, TRI_DTYPE_F32, 1100);
}
