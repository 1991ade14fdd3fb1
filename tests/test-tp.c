// test-tp.c - tensor parallelism over several CPU backends (engine/tensor-parallel.c): the split,
// device lists, logits against one device, greedy speculative output against plain decoding.
//
// The reference is the one-device CPU backend (the reference of every backend). A split changes
// only the order of summation: each device sums its own columns of wo and down, and the partial
// sums are added in rank order, where one device sums every column in one order. The tolerances
// below bound that rounding difference, measured and printed by the tests.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-select.h"
#include "cuda-backend.h"
#include "model.h"
#include "tensor-parallel.h"
#include "test-util.h"
#include "triforce.h"

static tri_model *load(const char *path) {
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

// A model of 6 query heads over 3 KV heads (so 2 and 3 devices split it, 2 unevenly), FFN 192.
static tri_model *tiny(const char *tag, const char *extra) {
    char opts[512];
    snprintf(opts, sizeof opts, "--seed 17 --layers 3 --embd 96 --heads 6 --kv-heads 3 --head-dim 16 --ff 192 %s",
             extra);
    return load(tt_gen_model(tag, opts));
}

static const char *devices_of(int n) {
    static const char *lists[] = {"cpu", "cpu:0,cpu:1", "cpu:0,cpu:1,cpu:2"};
    return lists[n - 1];
}

static tri_session_params params(int n, int32_t n_ctx) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_threads = n;  // one per device
    sp.devices = devices_of(n);
    return sp;
}

// ---- the split and device lists ----

static tri_model_config config(int32_t embd, int32_t ff, int32_t heads, int32_t kv_heads, int32_t head_dim) {
    tri_model_config c = {0};
    c.n_embd = embd, c.n_ff = ff, c.n_head = heads, c.n_head_kv = kv_heads, c.head_dim = head_dim;
    c.n_layer = 1, c.n_vocab = 512;
    return c;
}

Test(tp, split_by_kv_head) {
    tri__tp_split sp;
    // SmolLM2-135M: 9 query heads over 3 KV heads, FFN 1536 (6 blocks of 256). Two devices: 2 + 1
    // heads; per layer a KV head with its 3 query heads is 294,912 weight elements, an FFN row
    // 1,728, so the mean is 1,769,472 and device 0 wants (1769472 - 589824) / 1728 = 682.7 rows:
    // 3 blocks of 256 (768), device 1 the other 768.
    tri_model_config c = config(576, 1536, 9, 3, 64);
    cr_assert_eq(tri__tp_split_plan(&c, 2, &sp), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(sp.kv0[0] == 0 && sp.kv0[1] == 2 && sp.kv0[2] == 3);
    cr_assert(sp.ff0[0] == 0 && sp.ff0[1] == 768 && sp.ff0[2] == 1536, "%d %d", sp.ff0[1], sp.ff0[2]);
    // three: one head each, 512 rows each (exactly the mean)
    cr_assert_eq(tri__tp_split_plan(&c, 3, &sp), TRI_STATUS_OK);
    for (int r = 0; r <= 3; r++) cr_assert(sp.kv0[r] == r && sp.ff0[r] == 512 * r, "rank %d", r);
    // four devices for three KV heads
    cr_assert_eq(tri__tp_split_plan(&c, 4, &sp), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "4 devices but the model has 3 KV heads (9 query heads)"), "%s",
              tri_last_error());
    // Llama2-7B: 32 heads, FFN 11008 = 43 blocks of 256: 16 heads each, the 43 blocks 22 + 21
    // (the mean is 21.5 blocks, rounded up for the first)
    c = config(4096, 11008, 32, 32, 128);
    cr_assert_eq(tri__tp_split_plan(&c, 2, &sp), TRI_STATUS_OK);
    cr_assert(sp.kv0[1] == 16 && sp.kv0[2] == 32 && sp.ff0[1] == 22 * 256 && sp.ff0[2] == 11008);
    // an FFN of 96 rows: blocks of 32, 3 of them; 4 devices over 8 heads cannot each get a block
    c = config(64, 96, 8, 8, 8);
    cr_assert_eq(tri__tp_split_plan(&c, 4, &sp), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "96 rows make only 3 blocks of 32"), "%s", tri_last_error());
    cr_assert_eq(tri__tp_split_plan(&c, 3, &sp), TRI_STATUS_OK);
    cr_assert(sp.ff0[1] == 32 && sp.ff0[2] == 64 && sp.ff0[3] == 96);
}

Test(tp, device_lists) {
    tri__device_ref d[TRI_TP_MAX];
    int32_t n;
    cr_assert_eq(tri__device_list_parse("cuda:0,cuda:1", d, &n), TRI_STATUS_OK);
    cr_assert(n == 2 && d[0].kind == TRI_DEVICE_CUDA && d[1].index == 1);
    cr_assert_eq(tri__device_list_parse("cpu:1,cpu:0,cpu:2", d, &n), TRI_STATUS_OK);
    cr_assert(n == 3 && d[0].kind == TRI_DEVICE_CPU && d[0].index == 1 && d[1].index == 0);
    cr_assert_eq(tri__device_list_parse("cpu", d, &n), TRI_STATUS_OK);
    cr_assert(n == 1 && d[0].kind == TRI_DEVICE_CPU);
    static const struct {
        const char *list, *why;
    } bad[] = {
        {"", "empty"},
        {"cuda:0,cuda:0", "'cuda:0' appears twice"},
        {"cuda:0,,cuda:1", "entry 2 is empty"},
        {"cuda:0,", "entry 2 is empty"},
        {"gpu:0,gpu:1", "'gpu:0' is not a device"},
        {"cuda:", "'cuda:' has no valid device index"},
        {"cuda:x", "'cuda:x' has no valid device index"},
        {"cuda:-1", "'cuda:-1' has no valid device index"},
        {"cudax", "'cudax' is not a device"},
        {"cpu:0,cuda:1", "cpu and cuda devices mixed"},
        {"cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6,cpu:7,cpu:8", "more than 8 devices"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tri__device_list_parse(bad[i].list, d, &n), TRI_STATUS_INVALID_ARGUMENT, "%s", bad[i].list);
        cr_assert(strstr(tri_last_error(), bad[i].why), "%s: %s", bad[i].list, tri_last_error());
    }
}

// Sessions refuse bad lists with the parser's message, and more devices than KV heads.
Test(tp, sessions_refuse_bad_device_lists) {
    tri_model *m = tiny("tp-bad", "");
    static const struct {
        const char *list, *why;
        tri_status st;
    } bad[] = {
        {"cpu:0,cpu:0", "'cpu:0' appears twice", TRI_STATUS_INVALID_ARGUMENT},
        {"cpu:0,cpu:1,cpu:2,cpu:3", "4 devices but the model has 3 KV heads", TRI_STATUS_INVALID_ARGUMENT},
        {"cpu:0,tpu:1", "'tpu:1' is not a device", TRI_STATUS_INVALID_ARGUMENT},
        {"cuda:0,cuda:7", "cuda:", TRI_STATUS_DEVICE},  // no such device (or no CUDA at all)
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tri_session_params sp = params(1, 64);
        sp.devices = bad[i].list;
        tri_session *s = NULL;
        if (bad[i].st == TRI_STATUS_DEVICE && tri_device_count() >= 8) continue;
        cr_assert_eq(tri_session_create(m, &sp, &s), bad[i].st, "%s", bad[i].list);
        cr_assert_null(s);
        cr_assert(strstr(tri_last_error(), bad[i].why), "%s: %s", bad[i].list, tri_last_error());
        tri_spec *e = NULL;
        tri_spec_params p = tri_spec_default_params();
        p.mode = TRI_SPEC_MODE_RETRIEVAL;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &e), bad[i].st, "%s", bad[i].list);
        cr_assert_null(e);
    }
    tri_session_params sp = params(2, 64);
    sp.weight_layers_streamed = 1;
    sp.weight_layers_from_disk = 1;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "weight_layers_from_disk"), "%s", tri_last_error());
    tri_model_free(m);
}

// A column split inside a quantized block (heads of 16 columns in blocks of 32) is refused, naming
// the tensor.
Test(tp, refuses_a_split_inside_a_quantized_block) {
    tri_model *m = load(tt_gen_model("tp-q8", "--seed 3 --layers 1 --embd 64 --heads 4 --kv-heads 4 --head-dim 16 "
                                              "--ff 128 --gguf-dtype q8_0"));
    tri_session_params sp = params(3, 32);
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "blk.0.attn_output.weight") && strstr(tri_last_error(), "blocks of 32"), "%s",
              tri_last_error());
    sp = params(2, 32);  // 2 + 2 heads: 32 columns each
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_str_eq(tri_session_device(s), "cpu:0,cpu:1");
    tri_session_free(s);
    tri_model_free(m);
}

// ---- logits against one device ----

#define N_PROMPT 40

// Logits of a prompt (every row) and of 8 tokens decoded one by one after it, on n devices:
// out (N_PROMPT + 8, V).
static void run_logits(const tri_model *m, int n, tri_kv_policy policy, float *out) {
    const int32_t V = m->config.n_vocab;
    tri_session_params sp = params(n, 128);
    sp.kv_type = TRI_DTYPE_F32;
    sp.kv_policy = policy;
    if (policy != TRI_KV_POLICY_FULL) sp.kv_budget = 16, sp.kv_chunk = 4, sp.kv_sink = 4;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (i * 37 + 11) % V;
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < N_PROMPT; i++) memcpy(out + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * V);
    for (int t = 0; t < 8; t++) {
        int32_t tok = (t * 53 + 7) % V;
        cr_assert_eq(tri_session_eval(s, &tok, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        memcpy(out + (int64_t)(N_PROMPT + t) * V, tri_session_logits(s, -1), sizeof(float) * V);
    }
    // a rollback and the same tokens again give the same logits on every rank
    cr_assert_eq(tri_session_truncate(s, N_PROMPT + 4), TRI_STATUS_OK);
    for (int t = 4; t < 8; t++) {
        int32_t tok = (t * 53 + 7) % V;
        cr_assert_eq(tri_session_eval(s, &tok, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(memcmp(out + (int64_t)(N_PROMPT + t) * V, tri_session_logits(s, -1), sizeof(float) * V), 0,
                     "after truncate, token %d", t);
    }
    tri_session_free(s);
}

static double max_diff(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0;
    *scale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
        if (fabs((double)a[i]) > *scale) *scale = fabs((double)a[i]);
    }
    return d;
}

static void check_logits(const char *tag, const char *extra, tri_kv_policy policy, double tol) {
    tri_model *m = tiny(tag, extra);
    const int64_t rows = N_PROMPT + 8, V = m->config.n_vocab;
    float *one = malloc(sizeof(float) * rows * V), *many = malloc(sizeof(float) * rows * V);
    cr_assert(one && many);
    run_logits(m, 1, policy, one);
    for (int n = 2; n <= 3; n++) {
        run_logits(m, n, policy, many);
        double scale, d = max_diff(one, many, rows * V, &scale);
        printf("tp %s (%s): N = %d, max |dlogit| %.3g over %lld logits of max |logit| %.3g (tolerance %.3g)\n", tag,
               extra[0] ? extra : "f16", n, d, (long long)(rows * V), scale, tol);
        cr_assert(d <= tol, "%s N = %d: max |dlogit| %g > %g", tag, n, d, tol);
        cr_assert(scale > 0.1, "logits of a real spread");
    }
    free(one);
    free(many);
    tri_model_free(m);
}

// f32 weights and cache: only the order of summation differs (rank partials added in rank order).
Test(tp, logits_within_rounding_of_one_device_f32) { check_logits("tp-f32", "--dtype f32", TRI_KV_POLICY_FULL, 1e-4); }
// f16 weights (the generator's default)
Test(tp, logits_within_rounding_of_one_device_f16) { check_logits("tp-f16", "", TRI_KV_POLICY_FULL, 1e-4); }
// Q8_0 weights: x is quantized per block of 32 on every device alike (the splits fall on blocks),
// but a rounding difference upstream can move an activation across a quantization step.
Test(tp, logits_within_rounding_of_one_device_q8_0) {
    check_logits("tp-q8-logits", "--gguf-dtype q8_0", TRI_KV_POLICY_FULL, 1e-3);
}
// StreamingLLM cache over the split heads: every device evicts the same positions.
Test(tp, logits_streaming_cache) { check_logits("tp-stream", "--dtype f32", TRI_KV_POLICY_STREAMING, 1e-4); }

// ---- greedy speculative decoding equals greedy plain decoding on the same devices ----

static const int32_t prompt[24] = {10, 20, 30, 40, 50, 60, 11, 21, 31, 41, 51, 61,
                                   10, 20, 30, 40, 50, 60, 11, 21, 31, 41, 51, 61};

static void plain(const tri_model *m, int n, tt_tokens *c) {
    tri_session_params sp = params(n, 128);
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 40;
    gp.stop_at_eos = false;
    c->n = 0;
    c->cap = 64;
    cr_assert_eq(tri_generate(s, prompt, 24, &gp, tt_collect, c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
}

// The speculative parameters of this file's runs: caches small enough that L2 evicts (budget in
// chunks of 4, selected over each rank's heads) and L1's StreamingLLM window slides.
static tri_spec_params small_spec(tri_spec_mode mode, tri_spec_drafter drafter, const tri_model *draft,
                                  const int32_t *layers, int32_t n_layers, int32_t budget) {
    tri_spec_params p = tri_spec_default_params();
    p.mode = mode;
    p.drafter = drafter;
    p.draft_model = draft;
    p.draft_layers = layers;
    p.n_draft_layers = n_layers;
    p.budget = budget;
    p.chunk = 4;
    p.draft_window = 12;
    p.draft_sink = 2;
    return p;
}

Test(tp, greedy_speculative_equals_plain, .timeout = TT_TIMEOUT(300)) {
    tri_model *m = tiny("tp-spec", "");
    tri_model *draft = load(tt_gen_model("tp-draft", "--seed 18 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1 "
                                                     "--head-dim 16"));
    static const int32_t layers[] = {0, 2};
    for (int n = 1; n <= 3; n++) {
        tt_tokens want;
        plain(m, n, &want);
        cr_assert_eq(want.n, 40);
        struct {
            const char *name;
            tri_spec_mode mode;
            tri_spec_drafter drafter;
        } cases[] = {
            {"triforce, self-draft (split like the target)", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS},
            {"triforce, draft model (on device 0)", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL},
            {"triforce, n-gram", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_NGRAM},
            {"retrieval", TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_MODEL},
            {"draft, self-draft", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            tri_spec_params p = small_spec(cases[i].mode, cases[i].drafter, draft, layers, 2, 16);
            p.ngram_n = 2;
            tri_session_params sp = params(n, 128);
            tri_spec *e;
            cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_str_eq(tri_spec_device(e), devices_of(n));
            tri_generate_params gp = tri_generate_default_params();
            gp.n_predict = 40;
            gp.stop_at_eos = false;
            tt_tokens got = {.n = 0, .cap = 64};
            tri_spec_stats st;
            cr_assert_eq(tri_generate_spec(e, prompt, 24, &gp, tt_collect, &got, &st), TRI_STATUS_OK, "%s",
                         tri_last_error());
            cr_assert_eq(got.n, 40, "%s, N = %d", cases[i].name, n);
            for (int t = 0; t < 40; t++)
                cr_assert_eq(got.tok[t], want.tok[t], "%s, N = %d: token %d is %d, plain decoding's %d",
                             cases[i].name, n, t, got.tok[t], want.tok[t]);
            tri_spec_free(e);
        }
    }
    tri_model_free(draft);
    tri_model_free(m);
}

// Token trees (tri_spec_params.tree_nodes): L3 verifies the chain and siblings in one pass over a
// tree mask, which each rank applies to its own KV heads. On two and three CPU ranks greedy output
// must be plain decoding's on the same ranks, in every mode whose drafter proposes siblings, with
// the KV on the device, offloaded, and offloaded with half its rows attended on the host (the
// split), and the trees must really carry siblings. (A rank left without the tree's mask fails at
// the ninth token.)
typedef struct tree_case {
    const char *name;
    tri_spec_mode mode;
    tri_spec_drafter drafter;
} tree_case;

static void check_trees(const tri_model *m, const tri_model *draft, int n, int off, const tree_case *tc) {
    static const int32_t layers[] = {0, 2};
    tt_tokens want;
    plain(m, n, &want);
    cr_assert_eq(want.n, 40);
    tri_spec_params p = small_spec(tc->mode, tc->drafter, draft, layers, 2, 16);
    p.gamma2 = 4;
    p.tree_nodes = 10;  // the chain of 4 and up to 6 siblings
    tri_session_params sp = params(n, 128);
    sp.kv_layers_offloaded = off ? 2 : 0;
    sp.kv_host_fraction = off == 2 ? 0.5f : 0.0f;
    tri_spec *e;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s: %s", tc->name, tri_last_error());
    cr_assert_str_eq(tri_spec_device(e), devices_of(n));
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 40;
    gp.stop_at_eos = false;
    tt_tokens got = {.n = 0, .cap = 64};
    tri_spec_stats st;
    cr_assert_eq(tri_generate_spec(e, prompt, 24, &gp, tt_collect, &got, &st), TRI_STATUS_OK, "%s: %s", tc->name,
                 tri_last_error());
    cr_assert_eq(got.n, 40, "%s", tc->name);
    for (int t = 0; t < 40; t++)
        cr_assert_eq(got.tok[t], want.tok[t], "%s, trees on %d ranks, KV way %d: token %d is %d, plain decoding's %d",
                     tc->name, n, off, t, got.tok[t], want.tok[t]);
    // the passes verified more drafted tokens than chains of gamma2 hold: siblings were there
    cr_assert_gt(st.n_l3_tree_nodes, (int64_t)p.gamma2 * st.n_l3_verify, "%s: %lld nodes in %lld passes", tc->name,
                 (long long)st.n_l3_tree_nodes, (long long)st.n_l3_verify);
    cr_log_info("%d ranks, KV way %d, %s: %lld tree nodes in %lld L3 passes (%.2f tokens per pass)\n", n, off,
                tc->name, (long long)st.n_l3_tree_nodes, (long long)st.n_l3_verify,
                st.n_l3_verify ? (double)st.n_generated / (double)st.n_l3_verify : 0.0);
    tri_spec_free(e);
}

Test(tp, greedy_token_trees_equal_plain, .timeout = TT_TIMEOUT(300)) {
    tri_model *m = tiny("tp-tree", "");
    tri_model *draft = load(tt_gen_model("tp-tree-draft", "--seed 18 --layers 1 --embd 32 --ff 64 --heads 2 "
                                                          "--kv-heads 1 --head-dim 16"));
    static const tree_case cases[] = {
        {"triforce, self-draft (split like the target)", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS},
        {"triforce, draft model (on device 0)", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL},
        {"retrieval", TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_MODEL},
        {"draft, self-draft", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS},
        {"draft, draft model", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_MODEL},
    };
    for (int n = 2; n <= 3; n++)
        for (int off = 0; off <= 2; off++)  // KV on the device; 2 layers offloaded; and half of those on the host
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_trees(m, draft, n, off, &cases[i]);
    tri_model_free(draft);
    tri_model_free(m);
}

// The default model (SmolLM2-135M, Q4_1, 9 query heads over 3 KV heads: 2 + 1 on two devices):
// logits of a prompt and a few decoded tokens against one device. This model is sensitive to the
// order of summation: x is quantized to 8 bits per block of 32 before each quantized matmul, so a
// rounding difference upstream moves an element across a step, and 30 layers amplify it. The
// yardstick is the reference backend's own SIMD levels, which sum in other orders too: the split
// must stay within 1.5 times what the scalar kernels differ from the best level by.
static tri_status scalar_backend(int32_t n_threads, tri__backend **out) {
    return tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_SCALAR, out);
}

Test(tp, default_model_logits, .timeout = TT_TIMEOUT(300)) {
    const char *path = getenv("TRI_TEST_MODEL");
    if (!path || !*path) cr_skip_test("TRI_TEST_MODEL is not set");
    tri_model *m = load(path);
    const int64_t rows = N_PROMPT + 8, V = m->config.n_vocab;
    float *one = malloc(sizeof(float) * rows * V), *many = malloc(sizeof(float) * rows * V);
    cr_assert(one && many);
    double yard = 0, scale;
    if (tri__cpu_simd_detect() != TRI_CPU_SIMD_SCALAR) {
        tri__backend_cpu_factory = scalar_backend;
        run_logits(m, 1, TRI_KV_POLICY_FULL, many);
        tri__backend_cpu_factory = NULL;
    }
    run_logits(m, 1, TRI_KV_POLICY_FULL, one);
    if (tri__cpu_simd_detect() != TRI_CPU_SIMD_SCALAR) {
        yard = max_diff(one, many, rows * V, &scale);
        printf("tp SmolLM2-135M Q4_1: one device, scalar vs %s kernels: max |dlogit| %.3g\n",
               tri__cpu_simd_name(tri__cpu_simd_detect()), yard);
    }
    for (int n = 2; n <= 3; n++) {
        run_logits(m, n, TRI_KV_POLICY_FULL, many);
        double d = max_diff(one, many, rows * V, &scale);
        printf("tp SmolLM2-135M Q4_1: N = %d, max |dlogit| %.3g over %lld logits of max |logit| %.3g\n", n, d,
               (long long)(rows * V), scale);
        double tol = yard > 0 ? 1.5 * yard : 0.1 * scale;
        cr_assert(d <= tol, "N = %d: max |dlogit| %g > %g", n, d, tol);
    }
    free(one);
    free(many);
    tri_model_free(m);
}

// Two CUDA devices (the emulated GPU in CI: CUDAEMU_DEVICES=2): logits against one device on each
// all-reduce path, and greedy speculative output equal to plain output on both (by NCCL). Skipped
// with fewer than two devices.
// The all-reduce waits for each rank's compute stream, not for its transfer stream: a copy queued
// there just before (the next layer's prefetch) is still pending when the all-reduce returns, on
// both paths. The emulator's streams run queued work only when something waits for it, so a
// synchronize inside the all-reduce (as it was) would have run that copy.
enum { AR_N = 1000 };
typedef struct ar_ctx {
    tri__tp *tp;
    tri__backend *be[2];
    float *x[2], *src[2], *pinned[2];
    bool pending[2], arrived[2];
    float sum[2][AR_N];
} ar_ctx;

static tri_status ar_job(void *p, int32_t rank) {
    ar_ctx *c = p;
    tri__backend *be = c->be[rank];
    float host[AR_N];
    for (int i = 0; i < AR_N; i++) host[i] = (float)(rank + 1) * (float)i;
    // the first all-reduce grows its buffers (and synchronizes for that, once)
    tri_status st = be->ops->copy_to_backend(be, c->x[rank], host, sizeof host);
    if (!st) st = tri__tp_allreduce(c->tp, rank, c->x[rank], AR_N);
    if (!st) st = be->ops->copy_to_backend(be, c->x[rank], host, sizeof host);
    if (!st) st = be->ops->transfer_to_host(be, c->pinned[rank], c->src[rank], sizeof host);  // "prefetch"
    if (!st) st = tri__tp_allreduce(c->tp, rank, c->x[rank], AR_N);
    c->pending[rank] = c->pinned[rank][0] == -1.0f && c->pinned[rank][AR_N - 1] == -1.0f;
    if (!st) st = be->ops->copy_to_host(be, c->sum[rank], c->x[rank], sizeof host);
    if (!st) st = be->ops->synchronize(be);
    c->arrived[rank] = c->pinned[rank][0] == 42.0f && c->pinned[rank][AR_N - 1] == 42.0f;
    return st;
}

// All three paths: NCCL (with and without peer access: NCCL needs none) and, with TRI_NO_NCCL set,
// peer copies and host memory.
Test(tp, allreduce_does_not_wait_for_the_transfer_stream) {
    const char *build = tri__cuda_module_build();
    if (!build || !strstr(build, "emulated")) cr_skip_test("needs the emulated CUDA runtime's deferred streams");
    if (tri_device_count() < 2) cr_skip_test("fewer than two CUDA devices");
    for (int k = 0; k < 4; k++) {
        const int peer = k % 2, nccl = k < 2;
        setenv("CUDAEMU_P2P", peer ? "1" : "0", 1);
        setenv("TRI_NO_NCCL", nccl ? "0" : "1", 1);
        ar_ctx c = {0};
        float fill[AR_N];
        for (int i = 0; i < AR_N; i++) fill[i] = 42.0f;
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(tri__backend_cuda_create(r, &c.be[r]), TRI_STATUS_OK, "%s", tri_last_error());
            tri__backend *be = c.be[r];
            cr_assert_eq(be->ops->alloc(be, sizeof fill, (void **)&c.x[r]), TRI_STATUS_OK);
            cr_assert_eq(be->ops->alloc(be, sizeof fill, (void **)&c.src[r]), TRI_STATUS_OK);
            cr_assert_eq(be->ops->copy_to_backend(be, c.src[r], fill, sizeof fill), TRI_STATUS_OK);
            cr_assert_eq(be->ops->synchronize(be), TRI_STATUS_OK);
            cr_assert_eq(posix_memalign((void **)&c.pinned[r], 4096, 4096 * 2), 0);
            for (int i = 0; i < AR_N; i++) c.pinned[r][i] = -1.0f;
            cr_assert_eq(be->ops->host_register(be, c.pinned[r], 4096 * 2), TRI_STATUS_OK, "%s", tri_last_error());
        }
        int32_t nodes[2] = {-1, -1};
        cr_assert_eq(tri__tp_create(2, c.be, nodes, &c.tp), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri__tp_uses_comm(c.tp), nccl, "NCCL %d, peer %d", nccl, peer);
        cr_assert_eq(tri__tp_uses_peers(c.tp), !nccl && peer == 1);
        cr_assert_eq(tri__tp_run(c.tp, ar_job, &c), TRI_STATUS_OK, "%s", tri_last_error());
        for (int r = 0; r < 2; r++) {
            cr_assert(c.pending[r], "NCCL %d, peer %d, rank %d: the all-reduce waited for the transfer stream", nccl,
                      peer, r);
            cr_assert(c.arrived[r], "NCCL %d, peer %d, rank %d: the transfer never ran", nccl, peer, r);
            for (int i = 0; i < AR_N; i++) cr_assert_eq(c.sum[r][i], 3.0f * (float)i, "rank %d, element %d", r, i);
        }
        tri__tp_free(c.tp);
        for (int r = 0; r < 2; r++) {
            c.be[r]->ops->host_unregister(c.be[r], c.pinned[r]);
            free(c.pinned[r]);
            c.be[r]->ops->free(c.be[r], c.x[r]);
            c.be[r]->ops->free(c.be[r], c.src[r]);
            tri__backend_free(c.be[r]);
        }
    }
    setenv("CUDAEMU_P2P", "0", 1);
    unsetenv("TRI_NO_NCCL");
}

// The NCCL all-reduce is an op on the compute stream like any other: recorded into a graph (the
// draft's one-token steps are), each replay sums what the ranks' x hold when it runs.
typedef struct graph_ctx {
    tri__tp *tp;
    tri__backend *be[2];
    float *x[2];
    float out[2][3][AR_N];
} graph_ctx;

static tri_status graph_job(void *p, int32_t rank) {
    graph_ctx *c = p;
    tri__backend *be = c->be[rank];
    tri__graph *g = NULL;
    tri_status st = be->ops->graph_begin(be);
    if (!st) {
        st = tri__tp_allreduce(c->tp, rank, c->x[rank], AR_N);
        tri_status st2 = be->ops->graph_end(be, &g);  // ends the recording whatever happened
        if (!st) st = st2;
    }
    float host[AR_N];
    for (int t = 0; !st && t < 3; t++) {
        for (int i = 0; i < AR_N; i++) host[i] = (float)((rank + 1) * (t + 1)) * (float)i;
        st = be->ops->copy_to_backend(be, c->x[rank], host, sizeof host);
        if (!st) st = be->ops->graph_launch(be, g);
        if (!st) st = be->ops->copy_to_host(be, c->out[rank][t], c->x[rank], sizeof host);
    }
    if (!st) st = be->ops->synchronize(be);
    be->ops->graph_free(be, g);
    return st;
}

Test(tp, nccl_allreduce_replays_in_a_graph) {
    const char *build = tri__cuda_module_build();
    if (!build || !strstr(build, "emulated")) cr_skip_test("the NCCL of the emulated CUDA runtime");
    if (tri_device_count() < 2) cr_skip_test("fewer than two CUDA devices");
    graph_ctx c = {0};
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(tri__backend_cuda_create(r, &c.be[r]), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(c.be[r]->ops->alloc(c.be[r], sizeof(float) * AR_N, (void **)&c.x[r]), TRI_STATUS_OK);
    }
    cr_assert_eq(tri__tp_create(2, c.be, NULL, &c.tp), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(tri__tp_uses_comm(c.tp));
    cr_assert_eq(tri__tp_run(c.tp, graph_job, &c), TRI_STATUS_OK, "%s", tri_last_error());
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++)
            for (int i = 0; i < AR_N; i++)
                cr_assert_eq(c.out[r][t][i], (float)(3 * (t + 1)) * (float)i, "rank %d, replay %d, element %d", r, t,
                             i);
    tri__tp_free(c.tp);
    for (int r = 0; r < 2; r++) {
        c.be[r]->ops->free(c.be[r], c.x[r]);
        tri__backend_free(c.be[r]);
    }
}

Test(tp, two_cuda_devices, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() < 2) cr_skip_test("fewer than two CUDA devices");
    tri_model *m = load(tt_gen_model("tp-cuda", "--seed 19 --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 16 "
                                                "--ff 128 --vocab 300"));
    const int32_t V = m->config.n_vocab;
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (i * 29 + 5) % V;
    // the emulator's peer access follows CUDAEMU_P2P (read at each call): both all-reduce paths
    const char *build = tri__cuda_module_build();
    const bool emulated = build && strstr(build, "emulated");
    // one device; two through host memory and by peer copies (TRI_NO_NCCL), by NCCL without and
    // with peer access
    enum { K = 5 };
    float *l[K];
    const char *lists[K] = {"cuda:0", "cuda:0,cuda:1", "cuda:0,cuda:1", "cuda:0,cuda:1", "cuda:0,cuda:1"};
    for (int k = 0; k < K; k++) {
        if (emulated) setenv("CUDAEMU_P2P", k == 2 || k == 4 ? "1" : "0", 1);
        setenv("TRI_NO_NCCL", k < 3 ? "1" : "0", 1);
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.devices = lists[k];
        if (k > 0) {
            tri__tp_group g;
            cr_assert_eq(tri__tp_group_open(&g, m, &sp), TRI_STATUS_OK, "%s", tri_last_error());
            printf("tp cuda:0,cuda:1: all-reduce %s\n", tri__tp_uses_comm(g.tp)    ? "by NCCL"
                                                        : tri__tp_uses_peers(g.tp) ? "by peer copies"
                                                                                   : "through host memory");
            if (emulated) {
                cr_assert_eq(tri__tp_uses_comm(g.tp), k >= 3, "case %d", k);
                cr_assert_eq(tri__tp_uses_peers(g.tp), k == 2, "case %d", k);
            }
            tri__tp_group_close(&g);
        }
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(tri_session_device(s), lists[k]);
        l[k] = malloc(sizeof(float) * 12 * V);
        cr_assert_eq(tri_session_eval(s, toks, 12, true), TRI_STATUS_OK, "%s", tri_last_error());
        for (int i = 0; i < 12; i++) memcpy(l[k] + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * V);
        tri_session_free(s);
    }
    double scale, d = max_diff(l[0], l[1], 12 * V, &scale);
    printf("tp cuda:0,cuda:1 vs cuda:0: max |dlogit| %.3g of max |logit| %.3g\n", d, scale);
    cr_assert(d <= 1e-3, "max |dlogit| %g", d);
    // the two paths add the same f32 values in the same order
    cr_assert_eq(memcmp(l[1], l[2], sizeof(float) * 12 * V), 0, "peer copies and host memory differ");
    // NCCL sums in its own order (two ranks: the same bits, a + b = b + a; more: within rounding)
    for (int k = 3; k < K; k++) {
        d = max_diff(l[1], l[k], 12 * V, &scale);
        printf("tp cuda:0,cuda:1 by NCCL (peer access %s) vs through host memory: max |dlogit| %.3g\n",
               k == 4 ? "on" : "off", d);
        cr_assert(d <= 1e-5, "NCCL, case %d: max |dlogit| %g", k, d);
    }
    for (int k = 0; k < K; k++) free(l[k]);
    if (emulated) setenv("CUDAEMU_P2P", "1", 1);

    // plain and speculative greedy decoding (L3 checking chains, then token trees) on the two
    // devices, by NCCL and (TRI_NO_NCCL) by peer copies; the self-draft's StreamingLLM window makes
    // its one-token steps recorded graphs, with NCCL's all-reduce inside them (the other paths wait
    // on the host: its steps are not recorded)
    for (int nccl = 1; nccl >= 0; nccl--) {
        setenv("TRI_NO_NCCL", nccl ? "0" : "1", 1);
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.devices = "cuda:0,cuda:1";
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = 12;
        gp.stop_at_eos = false;
        tt_tokens want = {.n = 0, .cap = 64}, got = {.n = 0, .cap = 64};
        cr_assert_eq(tri_generate(s, prompt, 12, &gp, tt_collect, &want, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        tri_session_free(s);
        static const int32_t layers[] = {0};
        tri_spec_params p = small_spec(TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_LAYERS, NULL, layers, 1, 8);
        p.gamma1 = 2;
        p.gamma2 = 4;
        for (int tree = 0; tree <= 1; tree++) {  // L3 checks the chain, then token trees of 8 nodes
            p.tree_nodes = tree ? 8 : 0;
            tri_spec *e;
            tri_spec_stats st;
            got.n = 0;
            cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(tri_generate_spec(e, prompt, 12, &gp, tt_collect, &got, &st), TRI_STATUS_OK, "NCCL %d: %s",
                         nccl, tri_last_error());
            cr_assert_eq(got.n, 12);
            for (int t = 0; t < 12; t++)
                cr_assert_eq(got.tok[t], want.tok[t], "NCCL %d, tree nodes %d: token %d", nccl, p.tree_nodes, t);
            cr_assert(!tree || st.n_l3_tree_nodes > (int64_t)p.gamma2 * st.n_l3_verify,
                      "NCCL %d: %lld tree nodes in %lld passes", nccl, (long long)st.n_l3_tree_nodes,
                      (long long)st.n_l3_verify);
            tri_spec_free(e);
        }
    }
    unsetenv("TRI_NO_NCCL");
    tri_model_free(m);
}

// ---- biases over the split: conformance cases from transformers ----

// Qwen2's q, k, v biases are split with their heads; llama's and gemma's o bias (attention_bias)
// is added once after the ranks' partial projections are summed. Two devices, one KV head each,
// must give transformers' greedy ids (suite conformance's cases: every margin >= 0.05 logits).
Test(tp, biases_match_transformers) {
    tt_need_fixtures("conformance");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/conformance/SKIPPED", getenv("TRI_TEST_FIXTURES"));
    FILE *skipped = fopen(dir, "r");
    if (skipped) {
        fclose(skipped);
        cr_skip_test("the conformance cases were not made (no torch and transformers)");
    }
    static const char *const cases[] = {"llama-attention-bias", "gemma-attention-bias", "qwen2-untied"};
    for (size_t r = 0; r < sizeof cases / sizeof cases[0]; r++) {
        snprintf(dir, sizeof dir, "%s/conformance/%s/golden.txt", getenv("TRI_TEST_FIXTURES"), cases[r]);
        int32_t ids[64] = {0}, want[64] = {0};
        int n_prompt = 0, n_want = 0;
        char *text = tt_read_file(dir, NULL);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            int32_t *dst = strncmp(line, "prompt ", 7) == 0 ? ids : strncmp(line, "greedy ", 7) == 0 ? want : NULL;
            if (!dst) continue;
            int *n = dst == ids ? &n_prompt : &n_want;
            char *p = line + 7, *end;
            for (long v = strtol(p, &end, 10); end != p && *n < 64; v = strtol(p, &end, 10)) {
                dst[(*n)++] = (int32_t)v;
                p = end;
            }
        }
        free(text);
        cr_assert(n_prompt > 0 && n_want > 0, "%s: golden.txt incomplete", dir);
        snprintf(dir, sizeof dir, "%s/conformance/%s", getenv("TRI_TEST_FIXTURES"), cases[r]);
        tri_model *m = load(dir);
        tri_session_params sp = params(2, 64);
        sp.kv_type = TRI_DTYPE_F32;
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(tri_session_device(s), "cpu:0,cpu:1");
        int32_t tok = 0;
        cr_assert_eq(tri_session_eval(s, ids, n_prompt, false), TRI_STATUS_OK, "%s", tri_last_error());
        for (int i = 0; i < n_want; i++) {
            const float *l = tri_session_logits(s, -1);
            tok = 0;
            for (int32_t v = 1; v < m->config.n_vocab; v++)
                if (l[v] > l[tok]) tok = v;
            cr_assert_eq(tok, want[i], "%s over 2 devices: step %d: %d, transformers' %d", cases[r], i, tok, want[i]);
            cr_assert_eq(tri_session_eval(s, &tok, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        }
        tri_session_free(s);
        tri_model_free(m);
    }
}
