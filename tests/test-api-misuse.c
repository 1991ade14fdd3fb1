// test-api-misuse.c - every public function of triforce.h given NULL, a handle whose create failed
// (NULL, as the header promises) or NULL outputs: each refuses with INVALID_ARGUMENT, or returns
// the neutral value the header documents, and never dereferences the NULL (a crash fails the
// test; under ASan so does any stray read). Handles used after their free are undefined
// behaviour (triforce.h) and are not called.
#include <string.h>
#include <unistd.h>

#include "test-util.h"
#include "triforce.h"

#define INVALID TRI_STATUS_INVALID_ARGUMENT

// One per test process (Criterion runs tests side by side), written at the first call.
static const char *small_model(void) {
    static char path[4096];
    if (!path[0]) {
        char tag[64];
        snprintf(tag, sizeof tag, "misuse-%d", (int)getpid());
        snprintf(path, sizeof path, "%s", tt_gen_model(tag, "--seed 5 --layers 1 --vocab 300"));
    }
    return path;
}

// The last error names the function (or its module) and is a line of its own.
static void check_message(const char *what) {
    const char *e = tri_last_error();
    cr_assert(e && e[0], "%s: no message", what);
    cr_assert(!strchr(e, '\n'), "%s: message spans lines: %s", what, e);
}

#define REFUSES(call)                                                              \
    do {                                                                           \
        tri_status st_ = (call);                                                   \
        cr_assert_eq(st_, INVALID, "%s returned %d (%s), not INVALID_ARGUMENT", #call, \
                     st_, tri_status_str(st_));                                     \
        check_message(#call);                                                      \
    } while (0)

Test(api_misuse, process_wide_functions) {
    cr_assert(tri_version() && strcmp(tri_version(), TRI_VERSION_STRING) == 0);
    cr_assert_str_eq(tri_status_str((tri_status)12345), "unknown status");
    cr_assert(tri_last_error() != NULL);
    cr_assert_str_eq(tri_dtype_name((tri_dtype)-1), "?");
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_COUNT), "?");
    tri_log_set(NULL, NULL, TRI_LOG_LEVEL_ERROR);  // restores the default; nothing to check but no crash
    cr_assert_geq(tri_device_count(), 0);
    REFUSES(tri_device_get_info(0, NULL));
    REFUSES(tri_device_measure_h2d(0, 0, NULL));
    REFUSES(tri_host_get_info(NULL));
    // parameter defaults take nothing
    (void)tri_model_default_params();
    (void)tri_sampler_default_params();
    (void)tri_sampler_chat_params();
    REFUSES(tri_sampler_params_check(NULL));
    (void)tri_session_default_params();
    (void)tri_generate_default_params();
    (void)tri_spec_default_params();
    (void)tri_plan_default_params();
}

Test(api_misuse, model_functions) {
    tri_model *m = (tri_model *)0x1;
    REFUSES(tri_model_load(NULL, NULL, &m));
    cr_assert_null(m, "a failed load leaves the out-pointer NULL");
    REFUSES(tri_model_load(small_model(), NULL, NULL));
    tri_model_free(NULL);

    tri_model_info info;
    memset(&info, 0xab, sizeof info);
    tri_model_get_info(NULL, &info);
    cr_assert_eq(info.n_tensors, 0);
    cr_assert_null(info.architecture);
    tri_model_get_info(NULL, NULL);
    tri_tensor_info ti;
    REFUSES(tri_model_tensor_info(NULL, 0, &ti));

    cr_assert_eq(tri_model_load(small_model(), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_get_info(m, NULL);
    REFUSES(tri_model_tensor_info(m, 0, NULL));
    tri_plan_model pm;
    tri_plan_model_from_model(NULL, &pm);
    cr_assert_eq(pm.config.n_layer, 0);
    tri_plan_model_from_model(m, NULL);
    tri_model_free(m);
}

Test(api_misuse, tokenizer_functions) {
    const char *text;
    size_t len;
    int64_t n;
    int32_t ids[4] = {1, 2, 3, 4};
    char buf[16];
    cr_assert_eq(tri_token_count(NULL), 0);
    cr_assert_eq(tri_token_bos(NULL), -1);
    cr_assert_eq(tri_token_eos(NULL), -1);
    cr_assert(!tri_token_is_special(NULL, 0));
    REFUSES(tri_token_text(NULL, 0, &text, &len));
    REFUSES(tri_token_piece(NULL, 0, &text, &len));
    REFUSES(tri_tokenize(NULL, "a", 1, false, false, ids, 4, &n));
    REFUSES(tri_detokenize(NULL, ids, 1, false, buf, sizeof buf, &len));
    tri_detokenizer *d = (tri_detokenizer *)0x1;
    REFUSES(tri_detokenizer_create(NULL, false, &d));
    cr_assert_null(d);
    REFUSES(tri_detokenizer_create(NULL, false, NULL));
    REFUSES(tri_detokenizer_push(NULL, 0, &text, &len));
    REFUSES(tri_detokenizer_flush(NULL, &text, &len));
    tri_detokenizer_free(NULL);

    tri_model *m;
    cr_assert_eq(tri_model_load(small_model(), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_token_text(m, 0, NULL, &len));
    REFUSES(tri_token_text(m, 0, &text, NULL));
    REFUSES(tri_token_piece(m, 0, NULL, &len));
    REFUSES(tri_token_piece(m, 0, &text, NULL));
    REFUSES(tri_tokenize(m, NULL, 3, false, false, ids, 4, &n));
    REFUSES(tri_tokenize(m, "abc", 3, false, false, NULL, 4, &n));
    REFUSES(tri_tokenize(m, "abc", 3, false, false, ids, 4, NULL));
    REFUSES(tri_detokenize(m, NULL, 2, false, buf, sizeof buf, &len));
    REFUSES(tri_detokenize(m, ids, 1, false, NULL, sizeof buf, &len));
    REFUSES(tri_detokenize(m, ids, 1, false, buf, sizeof buf, NULL));
    cr_assert_eq(tri_detokenizer_create(m, false, &d), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_detokenizer_push(d, 0, NULL, &len));
    REFUSES(tri_detokenizer_push(d, 0, &text, NULL));
    REFUSES(tri_detokenizer_flush(d, NULL, &len));
    REFUSES(tri_detokenizer_flush(d, &text, NULL));
    tri_detokenizer_free(d);
    tri_model_free(m);
}

// Every session function on NULL, and on the NULL a failed create leaves.
Test(api_misuse, session_functions) {
    tri_model *m;
    cr_assert_eq(tri_model_load(small_model(), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session *s = (tri_session *)0x1;
    REFUSES(tri_session_create(NULL, NULL, &s));
    cr_assert_null(s);
    REFUSES(tri_session_create(m, NULL, NULL));
    tri_session_params bad = tri_session_default_params();
    bad.n_ctx = -5;
    s = (tri_session *)0x1;
    cr_assert_neq(tri_session_create(m, &bad, &s), TRI_STATUS_OK);
    cr_assert_null(s, "a failed create leaves the out-pointer NULL");

    // s is now the failed handle: NULL
    int32_t tok = 1, out;
    REFUSES(tri_session_eval(s, &tok, 1, false));
    cr_assert_null(tri_session_logits(s, -1));
    cr_assert_null(tri_session_device(s));
    cr_assert_eq(tri_session_n_past(s), 0);
    cr_assert_eq(tri_session_n_ctx(s), 0);
    REFUSES(tri_session_truncate(s, 0));
    tri_session_reset(s);
    tri_session_kv_refresh(s);
    tri_kv_info kvi;
    REFUSES(tri_session_kv_info(s, &kvi));
    tri_session_seed(s, 7);
    REFUSES(tri_session_sample(s, NULL, &out));
    tri_generate_params gp = tri_generate_default_params();
    tri_generate_stats gs;
    REFUSES(tri_generate(s, &tok, 1, &gp, NULL, NULL, &gs));
    cr_assert_eq(gs.n_generated, 0, "stats are cleared even when the call is refused");
    REFUSES(tri_generate(s, &tok, 1, NULL, NULL, NULL, NULL));
    tri_session_free(s);

    // a live session with NULL arguments
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 1;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_session_eval(s, NULL, 1, false));
    REFUSES(tri_session_sample(s, NULL, NULL));
    REFUSES(tri_generate(s, NULL, 3, &gp, NULL, NULL, NULL));
    tri_session *one[1] = {s};
    const int32_t *toks[1] = {&tok};
    const int32_t n_one[1] = {1}, rows_bad[1] = {2};
    REFUSES(tri_session_eval_batch_rows(NULL, toks, n_one, NULL, 1));
    REFUSES(tri_session_eval_batch_rows(one, toks, n_one, rows_bad, 1));
    cr_assert_eq(tri_session_n_past(s), 0);
    cr_assert_eq(tri_session_eval(s, &tok, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_session_sample(s, NULL, NULL));
    cr_assert_eq(tri_session_sample(s, NULL, &out), TRI_STATUS_OK);
    REFUSES(tri_session_kv_info(s, NULL));
    cr_assert_eq(tri_session_kv_info(s, &kvi), TRI_STATUS_OK);
    cr_assert_eq(kvi.policy, TRI_KV_POLICY_FULL);
    cr_assert_eq(kvi.n_past, 1);
    cr_assert_eq(kvi.n_ctx, 64);
    cr_assert_eq(kvi.selected_at, -1);
    tri_session_free(s);
    tri_model_free(m);
}

Test(api_misuse, spec_functions) {
    tri_model *m;
    cr_assert_eq(tri_model_load(small_model(), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_spec *e = (tri_spec *)0x1;
    REFUSES(tri_spec_create(NULL, NULL, NULL, &e));
    cr_assert_null(e);
    REFUSES(tri_spec_create(m, NULL, NULL, NULL));
    tri_spec_params bad = tri_spec_default_params();
    bad.gamma1 = -1;
    e = (tri_spec *)0x1;
    cr_assert_neq(tri_spec_create(m, NULL, &bad, &e), TRI_STATUS_OK);
    cr_assert_null(e, "a failed create leaves the out-pointer NULL");

    int32_t tok = 1;
    cr_assert_null(tri_spec_device(e));
    tri_spec_reset(e);
    cr_assert_eq(tri_spec_n_past(e), 0);
    REFUSES(tri_spec_truncate(e, 0));
    tri_spec_stats ss;
    REFUSES(tri_generate_spec(e, &tok, 1, NULL, NULL, NULL, &ss));
    cr_assert_eq(ss.n_generated, 0);
    tri_spec_free(e);

    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_NONE;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 1;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_generate_spec(e, NULL, 2, NULL, NULL, NULL, NULL));

    // speculative batches
    REFUSES(tri_spec_batch_create(NULL));
    tri_spec_batch_free(NULL);
    REFUSES(tri_spec_batch_add(NULL, e, &tok, 1, NULL, NULL, NULL, NULL, NULL));
    REFUSES(tri_spec_batch_step(NULL, NULL));
    bool done = true;
    REFUSES(tri_spec_batch_result(NULL, 0, &done, NULL));
    tri_spec_batch *b;
    cr_assert_eq(tri_spec_batch_create(&b), TRI_STATUS_OK);
    REFUSES(tri_spec_batch_add(b, NULL, &tok, 1, NULL, NULL, NULL, NULL, NULL));
    REFUSES(tri_spec_batch_result(b, 0, &done, NULL));
    int32_t running = -1;
    cr_assert_eq(tri_spec_batch_step(b, &running), TRI_STATUS_OK);  // an empty batch: nothing runs
    cr_assert_eq(running, 0);
    tri_spec_batch_free(b);
    tri_spec *none[2] = {e, NULL};
    const int32_t *prompts[2] = {&tok, &tok};
    const int32_t n_prompts[2] = {1, 1};
    REFUSES(tri_generate_spec_batch(NULL, prompts, n_prompts, NULL, NULL, NULL, NULL, NULL, 2));
    REFUSES(tri_generate_spec_batch(none, prompts, n_prompts, NULL, NULL, NULL, NULL, NULL, 2));
    REFUSES(tri_generate_spec_batch(none, prompts, NULL, NULL, NULL, NULL, NULL, NULL, 1));
    REFUSES(tri_generate_spec_batch(none, prompts, n_prompts, NULL, NULL, NULL, NULL, NULL, 0));
    tri_status sts[1] = {TRI_STATUS_INTERNAL};
    REFUSES(tri_generate_spec_batch(none, NULL, n_prompts, NULL, NULL, NULL, NULL, sts, 1));  // 1 token, no prompt
    cr_assert_eq(sts[0], INVALID);
    tri_spec_free(e);
    tri_model_free(m);
}

Test(api_misuse, planner_functions) {
    tri_plan_model pm = tri_plan_model_from_config(NULL, TRI_DTYPE_F16);
    cr_assert_eq(pm.config.n_layer, 0);
    cr_assert_eq(pm.weight_type, TRI_DTYPE_F16);
    tri_plan plan;
    REFUSES(tri_plan_compute(NULL, NULL, &plan));
    REFUSES(tri_plan_compute(&pm, NULL, NULL));
    char buf[64];
    size_t n = 99;
    REFUSES(tri_plan_format(NULL, buf, sizeof buf, &n));
    cr_assert_eq(n, 0);
    REFUSES(tri_plan_format(&plan, NULL, sizeof buf, &n));
    REFUSES(tri_plan_model_from_config_file(NULL, &pm));
    REFUSES(tri_plan_model_from_config_file("config.json", NULL));
    cr_assert_neq(tri_plan_model_from_config_file("/nonexistent/config.json", &pm), TRI_STATUS_OK);
    check_message("tri_plan_model_from_config_file(/nonexistent)");
    cr_assert(strstr(tri_last_error(), "/nonexistent/config.json"), "%s", tri_last_error());
}

Test(api_misuse, chat_functions) {
    tri_chat_format f;
    cr_assert_null(tri_chat_format_name((tri_chat_format)-1));
    REFUSES(tri_chat_format_from_name(NULL, &f));
    REFUSES(tri_chat_format_from_name("chatml", NULL));
    REFUSES(tri_chat_template_format(NULL, 0, &f));
    REFUSES(tri_chat_template_format("x", 1, NULL));
    REFUSES(tri_chat_model_format(NULL, &f));
    tri_chat_message msg = {"user", "hi"}, bad = {NULL, "hi"};
    char buf[64];
    size_t n = 99;
    REFUSES(tri_chat_render(NULL, TRI_CHAT_FORMAT_AUTO, NULL, NULL, &msg, 1, true, buf, sizeof buf, &n));
    REFUSES(tri_chat_render(NULL, TRI_CHAT_FORMAT_CHATML, NULL, NULL, NULL, 1, true, buf, sizeof buf, &n));
    REFUSES(tri_chat_render(NULL, TRI_CHAT_FORMAT_CHATML, NULL, NULL, &msg, 1, true, NULL, sizeof buf, &n));
    REFUSES(tri_chat_render(NULL, TRI_CHAT_FORMAT_CHATML, NULL, NULL, &msg, 1, true, buf, sizeof buf, NULL));
    REFUSES(tri_chat_render(NULL, TRI_CHAT_FORMAT_CHATML, NULL, NULL, &bad, 1, true, buf, sizeof buf, &n));
    REFUSES(tri_chat_render(NULL, (tri_chat_format)99, NULL, NULL, &msg, 1, true, buf, sizeof buf, &n));
    REFUSES(tri_chat_apply(NULL, TRI_CHAT_FORMAT_CHATML, &msg, 1, true, buf, sizeof buf, &n));
    int32_t ids[4], k;
    REFUSES(tri_chat_stop_tokens(NULL, ids, 4, &k));
    tri_model *m;
    cr_assert_eq(tri_model_load(small_model(), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    REFUSES(tri_chat_apply(m, TRI_CHAT_FORMAT_CHATML, NULL, 1, true, buf, sizeof buf, &n));
    REFUSES(tri_chat_apply(m, TRI_CHAT_FORMAT_CHATML, &msg, 1, true, buf, sizeof buf, NULL));
    REFUSES(tri_chat_stop_tokens(m, NULL, 4, &k));
    REFUSES(tri_chat_stop_tokens(m, ids, 4, NULL));
    tri_model_free(m);
}

// tri_device_parse: the names --device takes, and everything else refused by name.
Test(api_misuse, device_names) {
    tri_device_kind kind;
    int32_t index;
    REFUSES(tri_device_parse(NULL, &kind, &index));
    REFUSES(tri_device_parse("cuda", NULL, &index));
    REFUSES(tri_device_parse("cuda", &kind, NULL));
    cr_assert_eq(tri_device_parse("cpu", &kind, &index), TRI_STATUS_OK);
    cr_assert_eq(kind, TRI_DEVICE_CPU);
    cr_assert_eq(tri_device_parse("cuda", &kind, &index), TRI_STATUS_OK);
    cr_assert(kind == TRI_DEVICE_CUDA && index == 0);
    cr_assert_eq(tri_device_parse("cuda:3", &kind, &index), TRI_STATUS_OK);
    cr_assert(kind == TRI_DEVICE_CUDA && index == 3);
    static const char *const bad[] = {"", "gpu", "cuda:", "cuda:x", "cuda:1x", "cuda:-1", "cuda:0,cuda:1", "cudaa"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        REFUSES(tri_device_parse(bad[i], &kind, &index));
        cr_assert(strstr(tri_last_error(), bad[i]), "'%s': message does not name it: %s", bad[i], tri_last_error());
    }
}
