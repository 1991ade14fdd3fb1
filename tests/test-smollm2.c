// test-smollm2.c - the CPU forward pass on a real model, SmolLM2-135M-Instruct (Q4_1 GGUF),
// against an independent reference.
//
// tests/reference/smollm2_ref.py dequantizes the GGUF named by $TRI_TEST_MODEL with the gguf
// package, puts Q/K rows back in HF order and runs tests/reference/llama_ref.py (numpy float64,
// following transformers) on Genesis 1 (KJV, from tests/fixtures/make-smollm2.py), tokenized by HF
// tokenizers: per-position log-probabilities, perplexity, argmax, and the greedy answer to a chat
// prompt. Its output is cached under $TRI_TEST_TMP/smollm2 (about 30-50 s the first time). We run
// the same ids through our API and compare. Skipped when $TRI_TEST_MODEL is unset.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test-util.h"
#include "triforce.h"

#define MAX_EVAL 512
#define MAX_PROMPT 64
#define MAX_GREEDY 64

// ---- bounds (docs/benchmarks.md has the measured figures) ----

// The reference runs the dequantized weights in float64. Our Q4_1/Q8_0 kernels also round each
// block of 32 activations to 8 bits, which on this 30-layer model moves logits by 0.2 on average
// (logit std 6.4): the reference itself, given the same 8-bit rounding, moves as far (perplexity
// +0.08%, mean |logprob diff| 0.063, 249/256 argmax equal). Measured for ours, f16 / f32 KV cache:
// perplexity +0.54% / -0.73%, mean |logprob diff| 0.074 / 0.076, max 0.84 / 0.54, argmax equal at
// 246 / 246 of 256, disagreeing only where the reference's top two are within 0.68. The signed
// per-token differences have std 0.13-0.14 nats, so the perplexity ratio has a noise of about
// 0.9% (std of the mean over 255 tokens): the bound is 3 sigma.
#define PPL_REL_TOL 0.03         // |ppl - ref| / ref
#define LOGPROB_MEAN_TOL 0.15    // mean |logprob - ref| over the predictions, nats
#define LOGPROB_MAX_TOL 1.5      // max |logprob - ref|, nats
// argmax must agree wherever the reference's top two logits are this far apart; elsewhere a near
// tie may flip either way, but at least TOP1_MIN_FRAC of all positions must still agree
#define TOP1_CLEAR_MARGIN 1.5
#define TOP1_MIN_FRAC 0.93
// The same model dequantized to f32 (HF layout), f32 cache: only summation order and f32 rounding
// separate us from the reference. Measured: max |logit diff| 4.4e-6 of the row's spread,
// against 1.2e-2 with rope theta off by 5%, which the quantized checks above do not catch.
#define TOL_F32 5e-5  // max |logit diff| / max(1, max - min of the reference row)

typedef struct ref_data {
    int32_t n_eval;
    int32_t ids[MAX_EVAL];
    double logprob[MAX_EVAL];  // ln p(ids[i + 1] | ids[..i]); NAN for the last
    int32_t top1[MAX_EVAL];
    double margin[MAX_EVAL];   // top logit minus runner-up
    double ppl;
    int32_t n_prompt, prompt[MAX_PROMPT];
    int32_t n_greedy, greedy[MAX_GREEDY];
    double greedy_margin[MAX_GREEDY];
    char text[4096];
} ref_data;

static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *model_path(void) {
    const char *m = getenv("TRI_TEST_MODEL");
    if (!m || !*m) cr_skip_test("TRI_TEST_MODEL is not set (scripts/get-model.sh fetches SmolLM2-135M-Instruct)");
    return m;
}

// Runs the reference on model (or reuses its cache under $TRI_TEST_TMP/dir) and parses its output.
static void load_ref_in(ref_data *r, const char *model, const char *dir) {
    const char *py = tt_python("reference/smollm2_ref.py"), *src = getenv("TRI_TEST_SRC");
    cr_assert(py && src, "TRI_TEST_PYTHON, TRI_TEST_SRC: run through meson test");
    char missing[4096], text[4096], out[4096], cmd[16384];
    snprintf(missing, sizeof missing, "%s", tt_fixture("smollm2", "MISSING"));
    FILE *f = fopen(missing, "r");
    if (f) {
        char why[1024] = "";
        cr_assert(fgets(why, sizeof why, f) != NULL);
        fclose(f);
        cr_assert_fail("no passage to score: %s", why);
    }
    snprintf(text, sizeof text, "%s", tt_fixture("smollm2", "genesis-1.txt"));
    snprintf(out, sizeof out, "%s", tt_tmp(dir));
    snprintf(cmd, sizeof cmd, "'%s' '%s/reference/smollm2_ref.py' --gguf '%s' --text '%s' --out '%s' --n-eval 256 --greedy 16",
             py, src, model, text, out);
    double t0 = now();
    cr_assert_eq(run(cmd), 0, "reference failed: %s", cmd);
    fprintf(stderr, "smollm2: reference ready in %.1f s\n", now() - t0);

    char path[4200];
    snprintf(path, sizeof path, "%s/smollm2.txt", out);
    char *buf = tt_read_file(path, NULL);
    memset(r, 0, sizeof *r);
    int n_evals = 0, n_greedy = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        int p, id, t1;
        double mg;
        char lpbuf[64];
        if (sscanf(line, "n_eval %d", &r->n_eval) == 1) {
            cr_assert(r->n_eval > 1 && r->n_eval <= MAX_EVAL);
        } else if (sscanf(line, "eval %d %d %63s %d %lf", &p, &id, lpbuf, &t1, &mg) == 5) {
            cr_assert(p == n_evals && p < r->n_eval, "eval line out of order: %s", line);
            r->ids[p] = id;
            r->logprob[p] = strtod(lpbuf, NULL);
            r->top1[p] = t1;
            r->margin[p] = mg;
            n_evals++;
        } else if (sscanf(line, "ppl %lf", &r->ppl) == 1) {
        } else if (sscanf(line, "n_prompt %d", &r->n_prompt) == 1) {
            cr_assert(r->n_prompt > 0 && r->n_prompt <= MAX_PROMPT);
        } else if (strncmp(line, "prompt ", 7) == 0) {
            char *s = line + 7;
            for (int i = 0; i < r->n_prompt; i++) {
                r->prompt[i] = (int32_t)strtol(s, &s, 10);
                if (*s == ',') s++;
            }
        } else if (sscanf(line, "n_greedy %d", &r->n_greedy) == 1) {
            cr_assert(r->n_greedy > 0 && r->n_greedy <= MAX_GREEDY);
        } else if (sscanf(line, "greedy %d %lf", &id, &mg) == 2) {
            cr_assert(n_greedy < r->n_greedy);
            r->greedy[n_greedy] = id;
            r->greedy_margin[n_greedy++] = mg;
        } else if (strncmp(line, "text ", 5) == 0) {
            snprintf(r->text, sizeof r->text, "%s", line + 5);
        }
    }
    free(buf);
    cr_assert(n_evals == r->n_eval && n_greedy == r->n_greedy && r->ppl > 1, "truncated reference output %s", path);
}

static void load_ref(ref_data *r, const char *model) { load_ref_in(r, model, "smollm2"); }

static tri_session *open_session(const char *model, tri_model **m, tri_dtype kv_type) {
    double t0 = now();
    cr_assert_eq(tri_model_load(model, NULL, m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 512;
    sp.kv_type = kv_type;
    tri_session *s;
    cr_assert_eq(tri_session_create(*m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    fprintf(stderr, "smollm2: %s loaded in %.2f s\n", model, now() - t0);
    return s;
}

// ln softmax(row)[tok] in double
static double log_prob(const float *row, int32_t n_vocab, int32_t tok) {
    double mx = row[0];
    for (int32_t j = 1; j < n_vocab; j++) mx = fmax(mx, (double)row[j]);
    double sum = 0;
    for (int32_t j = 0; j < n_vocab; j++) sum += exp((double)row[j] - mx);
    return (double)row[tok] - mx - log(sum);
}

// ---- perplexity and argmax over Genesis 1 ----

// Our perplexity of model on the reference's ids, checked against the reference r (run on the
// same weights) with the bounds above; returns it.
static double check_perplexity_of(const char *model, const ref_data *r_in, tri_dtype kv_type) {
    const ref_data r = *r_in;
    tri_model *m;
    tri_session *s = open_session(model, &m, kv_type);
    tri_model_info info;
    tri_model_get_info(m, &info);
    const int32_t n_vocab = info.config.n_vocab;

    double t0 = now();
    cr_assert_eq(tri_session_eval(s, r.ids, r.n_eval, true), TRI_STATUS_OK, "%s", tri_last_error());
    double secs = now() - t0;

    double lp_sum = 0, diff_sum = 0, diff_max = 0;
    int32_t agree = 0, clear = 0, worst = 0;
    for (int32_t p = 0; p < r.n_eval; p++) {
        const float *row = tri_session_logits(s, p);
        cr_assert(row != NULL);
        int32_t t1 = tt_argmax(row, n_vocab);
        agree += t1 == r.top1[p];
        if (r.margin[p] >= TOP1_CLEAR_MARGIN) {
            clear++;
            cr_expect_eq(t1, r.top1[p], "position %d: our argmax %d, reference %d (its margin %.3f)", p, t1,
                         r.top1[p], r.margin[p]);
        }
        if (p + 1 == r.n_eval) break;
        double lp = log_prob(row, n_vocab, r.ids[p + 1]), d = fabs(lp - r.logprob[p]);
        lp_sum += lp;
        diff_sum += d;
        if (d > diff_max) {
            diff_max = d;
            worst = p;
        }
    }
    const int32_t n_pred = r.n_eval - 1;
    double ppl = exp(-lp_sum / n_pred), rel = fabs(ppl - r.ppl) / r.ppl;
    fprintf(stderr,
            "smollm2 (kv %s): perplexity %.5f, reference %.5f (rel diff %.2e) over %d predictions; "
            "|logprob diff| mean %.4f max %.4f (pos %d); argmax agrees at %d/%d positions "
            "(%d with reference margin >= %.2f); %d tokens in %.2f s (%.1f tok/s)\n",
            tri_dtype_name(kv_type), ppl, r.ppl, rel, n_pred, diff_sum / n_pred, diff_max, worst, agree,
            r.n_eval, clear, TOP1_CLEAR_MARGIN, r.n_eval, secs, r.n_eval / secs);
    cr_expect(rel <= PPL_REL_TOL, "perplexity %.5f vs reference %.5f: relative diff %.2e > %.2e", ppl, r.ppl, rel,
              PPL_REL_TOL);
    cr_expect(diff_sum / n_pred <= LOGPROB_MEAN_TOL, "mean |logprob diff| %.4f > %.4f", diff_sum / n_pred,
              LOGPROB_MEAN_TOL);
    cr_expect(diff_max <= LOGPROB_MAX_TOL, "max |logprob diff| %.4f at position %d > %.4f", diff_max, worst,
              LOGPROB_MAX_TOL);
    cr_expect(agree >= TOP1_MIN_FRAC * r.n_eval, "argmax agrees at only %d/%d positions", agree, r.n_eval);
    tri_session_free(s);
    tri_model_free(m);
    return ppl;
}

static void check_perplexity(tri_dtype kv_type) {
    const char *model = model_path();
    static ref_data r;
    load_ref(&r, model);
    check_perplexity_of(model, &r, kv_type);
}

Test(smollm2, genesis_perplexity_matches_reference, .timeout = TT_TIMEOUT(300)) { check_perplexity(TRI_DTYPE_F16); }

// ---- the model requantized to Q4_K_M ----

// tests/reference/requant_gguf.py rewrites $TRI_TEST_MODEL in llama.cpp's Q4_K_M mix (Q4_K and
// Q6_K where rows are whole super-blocks, Q5_0 and Q8_0 elsewhere: SmolLM2's 576-wide rows are
// not), from the weights as the file holds them. Two checks: our forward pass on the new file
// against the reference run on the same (requantized) weights, with the bounds above (measured:
// perplexity +0.37%, mean |logprob diff| 0.077, argmax equal at 244/256); and its perplexity
// against the reference's on the original weights: what requantizing costs, measured +27.7% for
// the reference itself on the requantized weights and +27.2% for ours. The source is already
// quantized (Q4_1), so every matrix is rounded twice; most of the loss is llama.cpp's Q5_0
// fallback for the 576-wide rows (4.3-5.2% relative RMS error added per matrix, against 2% for
// Q6_K and under 1% for Q8_0). The bound is loose: the forward pass is checked by the first part.
#define KQ_PPL_REL_TOL 0.35

Test(smollm2, q4_k_m_requantized_perplexity, .timeout = 600) {
    const char *model = model_path();
    static ref_data orig, r;
    load_ref(&orig, model);
    char q4km[4096], cmd[16384];
    snprintf(q4km, sizeof q4km, "%s", tt_tmp("smollm2-q4km.gguf"));
    FILE *f = fopen(q4km, "rb");
    if (f) {
        fclose(f);
    } else {
        char part[4200];
        snprintf(part, sizeof part, "%s.part.%d", q4km, (int)getpid());
        snprintf(cmd, sizeof cmd, "'%s' '%s/reference/requant_gguf.py' '%s' '%s' && mv '%s' '%s'",
                 tt_python("reference/requant_gguf.py"), getenv("TRI_TEST_SRC"), model, part, part, q4km);
        cr_assert_eq(run(cmd), 0, "requantizing failed: %s", cmd);
    }
    tri_model *m;
    cr_assert_eq(tri_model_load(q4km, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    // what the file holds: the mix, K-quants included
    tri_model_info info;
    tri_model_get_info(m, &info);
    int n_of[TRI_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < info.n_tensors; i++) {
        tri_tensor_info ti;
        cr_assert_eq(tri_model_tensor_info(m, i, &ti), TRI_STATUS_OK);
        n_of[ti.type]++;
    }
    tri_model_free(m);
    fprintf(stderr, "smollm2 Q4_K_M: q4_K %d, q6_K %d, q5_0 %d, q8_0 %d, f32 %d tensors\n", n_of[TRI_DTYPE_Q4_K],
            n_of[TRI_DTYPE_Q6_K], n_of[TRI_DTYPE_Q5_0], n_of[TRI_DTYPE_Q8_0], n_of[TRI_DTYPE_F32]);
    cr_assert(n_of[TRI_DTYPE_Q4_K] > 0 && n_of[TRI_DTYPE_Q6_K] > 0 && n_of[TRI_DTYPE_Q5_0] > 0);
    load_ref_in(&r, q4km, "smollm2-q4km");
    double ppl = check_perplexity_of(q4km, &r, TRI_DTYPE_F16);
    double rel = (ppl - orig.ppl) / orig.ppl;
    fprintf(stderr, "smollm2 Q4_K_M: perplexity %.5f, reference on the requantized weights %.5f, on the original "
            "weights %.5f: %+.2f%% from the original\n", ppl, r.ppl, orig.ppl, 100 * rel);
    cr_expect(fabs(rel) <= KQ_PPL_REL_TOL, "Q4_K_M perplexity %.5f vs original %.5f: %+.2f%% beyond %.0f%%", ppl,
              orig.ppl, 100 * rel, 100 * KQ_PPL_REL_TOL);
}

// ---- the model requantized to IQ4_XS ----

// tests/reference/requant_gguf.py --mix iq4_xs: every matrix IQ4_XS where its rows are whole
// super-blocks (SmolLM2's ffn_down, 1536 wide), IQ4_NL elsewhere (llama.cpp's fallback for the
// 576-wide rows), quantized by numpy code written from the gguf package's dequantizer. Our
// forward pass on it against the reference (tests/reference/smollm2_ref.py, which dequantizes
// with the gguf package) on the same weights, with the bounds above.
Test(smollm2, iq4_xs_requantized_perplexity, .timeout = 600) {
    const char *model = model_path();
    static ref_data r;
    char path[4096], cmd[16384];
    snprintf(path, sizeof path, "%s", tt_tmp("smollm2-iq4xs.gguf"));
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
    } else {
        char part[4200];
        snprintf(part, sizeof part, "%s.part.%d", path, (int)getpid());
        snprintf(cmd, sizeof cmd, "'%s' '%s/reference/requant_gguf.py' --mix iq4_xs '%s' '%s' && mv '%s' '%s'",
                 tt_python("reference/requant_gguf.py"), getenv("TRI_TEST_SRC"), model, part, part, path);
        cr_assert_eq(run(cmd), 0, "requantizing failed: %s", cmd);
    }
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    int n_of[TRI_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < info.n_tensors; i++) {
        tri_tensor_info ti;
        cr_assert_eq(tri_model_tensor_info(m, i, &ti), TRI_STATUS_OK);
        n_of[ti.type]++;
    }
    tri_model_free(m);
    fprintf(stderr, "smollm2 IQ4_XS: iq4_xs %d, iq4_nl %d, f32 %d tensors\n", n_of[TRI_DTYPE_IQ4_XS],
            n_of[TRI_DTYPE_IQ4_NL], n_of[TRI_DTYPE_F32]);
    cr_assert(n_of[TRI_DTYPE_IQ4_XS] > 0);
    load_ref_in(&r, path, "smollm2-iq4xs");
    check_perplexity_of(path, &r, TRI_DTYPE_F16);
}

// ---- greedy answer to a chat prompt ----

Test(smollm2, greedy_answer_matches_reference, .timeout = TT_TIMEOUT(300)) {
    const char *model = model_path();
    static ref_data r;
    load_ref(&r, model);
    tri_model *m;
    tri_session *s = open_session(model, &m, TRI_DTYPE_F16);
    int32_t got[MAX_GREEDY], *w = got;
    tri_generate_params gp = tri_generate_default_params();
    // the reference's answer ends with <|im_end|> (it was asked for at most 16 tokens); compare
    // all of it, N = its length
    gp.n_predict = r.n_greedy;
    tri_generate_stats st;
    cr_assert_eq(tri_generate(s, r.prompt, r.n_prompt, &gp, tt_collect_cursor, &w, &st), TRI_STATUS_OK, "%s",
                 tri_last_error());
    int32_t n = (int32_t)(w - got);

    // our tokens as text, through the reference's tokenizer
    char ids[1024] = "", cmd[8192], ours_path[4096], ours[4096] = "";
    int len = 0;
    for (int32_t i = 0; i < n; i++) len += snprintf(ids + len, sizeof ids - (size_t)len, "%s%d", i ? "," : "", got[i]);
    snprintf(ours_path, sizeof ours_path, "%s", tt_tmp("smollm2-ours.txt"));
    snprintf(cmd, sizeof cmd, "'%s' '%s/reference/smollm2_ref.py' --gguf '%s' --decode '%s' > '%s'",
             tt_python("reference/smollm2_ref.py"), getenv("TRI_TEST_SRC"), model, n ? ids : "0", ours_path);
    if (n && run(cmd) == 0) {
        char *t = tt_read_file(ours_path, NULL);
        snprintf(ours, sizeof ours, "%s", t);
        free(t);
        ours[strcspn(ours, "\n")] = 0;
    }
    fprintf(stderr, "smollm2 greedy: ours      [%s] \"%s\"\nsmollm2 greedy: reference (%d tokens) \"%s\"\n"
            "smollm2 greedy: prefill %d tokens %.2f s, decode %d tokens %.2f s\n",
            ids, ours, r.n_greedy, r.text, st.n_prompt, st.prefill_seconds, st.n_generated, st.decode_seconds);

    // every step of the reference's answer is decided by a clear margin, so ours must match all of it
    for (int32_t i = 0; i < r.n_greedy; i++)
        cr_assert(r.greedy_margin[i] >= TOP1_CLEAR_MARGIN, "reference step %d is a near tie (%.3f): shorten N", i,
                  r.greedy_margin[i]);
    cr_assert_eq(n, r.n_greedy, "we generated %d tokens, asked for %d", n, r.n_greedy);
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(got[i], r.greedy[i], "greedy token %d: %d, reference %d", i, got[i], r.greedy[i]);
    cr_assert(strstr(r.text, "Paris") != NULL, "the reference's answer does not mention Paris: %s", r.text);
    tri_session_free(s);
    tri_model_free(m);
}

// ---- the dequantized model in f32: every logit ----

Test(smollm2, dequantized_f32_every_logit_matches_reference, .timeout = TT_TIMEOUT(300)) {
    const char *model = model_path();
    static ref_data r;
    load_ref(&r, model);
    char hf[4096], logits_path[4200];
    snprintf(hf, sizeof hf, "%s", tt_tmp("smollm2/hf"));
    snprintf(logits_path, sizeof logits_path, "%s", tt_tmp("smollm2/logits.f32"));
    size_t n_bytes;
    float *want = tt_read_file(logits_path, &n_bytes);
    tri_model *m;
    tri_session *s = open_session(hf, &m, TRI_DTYPE_F32);
    tri_model_info info;
    tri_model_get_info(m, &info);
    const int32_t n_vocab = info.config.n_vocab;
    cr_assert_eq(n_bytes, (size_t)r.n_eval * (size_t)n_vocab * 4, "%s: size", logits_path);
    cr_assert_eq(info.config.rope_layout, TRI_ROPE_LAYOUT_HALF);

    double t0 = now();
    cr_assert_eq(tri_session_eval(s, r.ids, r.n_eval, true), TRI_STATUS_OK, "%s", tri_last_error());
    double secs = now() - t0;
    double worst = 0;  // max |diff| / spread
    int32_t worst_pos = 0, worst_tok = 0;
    for (int32_t p = 0; p < r.n_eval; p++) {
        const float *got = tri_session_logits(s, p), *w = want + (int64_t)p * n_vocab;
        float lo = w[0], hi = w[0];
        for (int32_t j = 0; j < n_vocab; j++) {
            lo = fminf(lo, w[j]);
            hi = fmaxf(hi, w[j]);
        }
        double spread = fmax(1.0, (double)(hi - lo));
        for (int32_t j = 0; j < n_vocab; j++) {
            double d = fabs((double)got[j] - (double)w[j]) / spread;
            if (d > worst) {
                worst = d;
                worst_pos = p;
                worst_tok = j;
            }
        }
    }
    fprintf(stderr, "smollm2 (HF f32, kv f32): max |logit diff| / spread %.2e (pos %d token %d); %d tokens in %.2f s\n",
            worst, worst_pos, worst_tok, r.n_eval, secs);
    cr_expect(worst <= TOL_F32, "max |logit diff| / spread %.2e > %.1e at position %d token %d", worst, TOL_F32,
              worst_pos, worst_tok);
    free(want);
    tri_session_free(s);
    tri_model_free(m);
}
