// test-app.c - what an application embedding the library relies on: one CPU thread pool for every
// session of the process, aborting a generation from another thread, the reason a generation
// stopped, and the context a session gets for n_ctx 0 and the warning beyond the trained context.
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "test-util.h"
#include "triforce.h"

// Every op of this shape is large enough to run on the pool (cpu-backend.c's threshold is 32,768
// elements of work: a 256 x 512 matrix is 131,072).
#define POOL_MODEL "--seed 11 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 400 --ctx 4096"
#define FAST_MODEL "--seed 12 --layers 1 --embd 64 --ff 128 --heads 2 --kv-heads 1 --vocab 300 --ctx 8192"

static tri_model *load(const char *tag, const char *opts) {
    char t[96];
    snprintf(t, sizeof t, "app-%s-%d", tag, (int)getpid());
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model(t, opts), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

// Threads of this process now.
static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    cr_assert(d, "cannot list /proc/self/task");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static int n_cpus(void) {
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    return CPU_COUNT(&set);
}

static const int32_t prompt[] = {5, 77, 140, 9, 33, 260, 18, 201};
#define N_PROMPT ((int32_t)(sizeof prompt / sizeof prompt[0]))

// ---- one thread pool for the process ----

typedef struct gen_job {
    tri_session *s;
    int32_t n;
    tt_tokens out;
    tri_status st;
} gen_job;

static void *gen_thread(void *arg) {
    gen_job *j = arg;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = j->n;
    gp.stop_at_eos = false;
    j->st = tri_generate(j->s, prompt, N_PROMPT, &gp, tt_collect, &j->out, NULL);
    return NULL;
}

// Four sessions generating at the same time from four threads start the pool's threads once (one
// per CPU, the caller's included), not one set each; each gives the tokens it gives alone; the
// pool's threads stop with the last session.
Test(app, sessions_share_one_thread_pool, .timeout = TT_TIMEOUT(300)) {
    tri_model *m = load("pool", POOL_MODEL);
    int base = count_threads(), cpus = n_cpus();
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 64;  // n_threads 0: every CPU

    gen_job solo = {.n = 12};
    cr_assert_eq(tri_session_create(m, &sp, &solo.s), TRI_STATUS_OK, "%s", tri_last_error());
    gen_thread(&solo);
    cr_assert_eq(solo.st, TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(count_threads(), base + cpus - 1, "one session: %d threads besides the %d before, for %d CPUs",
                 count_threads() - base, base, cpus);
    tri_session_free(solo.s);
    cr_assert_eq(count_threads(), base, "the pool's threads outlived its last session");

    gen_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (gen_job){.n = 12};
        cr_assert_eq(tri_session_create(m, &sp, &jobs[i].s), TRI_STATUS_OK, "%s", tri_last_error());
    }
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, gen_thread, &jobs[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    // the application's four threads are gone; what is left is the library's
    int after = count_threads();
    cr_assert_eq(after, base + cpus - 1, "four sessions: %d threads besides the %d before, for %d CPUs", after - base,
                 base, cpus);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(jobs[i].st, TRI_STATUS_OK);
        cr_assert_eq(jobs[i].out.n, 12);
        cr_assert_arr_eq(jobs[i].out.tok, solo.out.tok, 12 * sizeof(int32_t), "session %d differs from the solo run",
                         i);
    }
    for (int i = 0; i < 4; i++) tri_session_free(jobs[i].s);
    cr_assert_eq(count_threads(), base);
    tri_model_free(m);
}

// n_threads caps what one session's ops take from the pool: 1 starts no thread at all.
Test(app, one_thread_session_starts_no_thread) {
    tri_model *m = load("pool1", POOL_MODEL);
    int base = count_threads();
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 64;
    sp.n_threads = 1;
    gen_job j = {.n = 4};
    cr_assert_eq(tri_session_create(m, &sp, &j.s), TRI_STATUS_OK, "%s", tri_last_error());
    gen_thread(&j);
    cr_assert_eq(j.st, TRI_STATUS_OK);
    cr_assert_eq(count_threads(), base);
    tri_session_free(j.s);
    tri_model_free(m);
}

// ---- aborting from another thread ----

typedef struct abort_ctx {
    tri_session *s;
    tri_spec *spec;
    tt_tokens out;
    int32_t abort_after;     // the on_token call that has the other thread abort
    _Atomic int phase;       // 0, 1: that call asks for the abort, 2: the other thread made it
    _Atomic bool abort_ret;  // what tri_*_abort returned
} abort_ctx;

// At its abort_after-th token the callback has the aborting thread call tri_*_abort, and waits
// for it: the abort lands while the generation is running, at a known token, however the two
// threads are scheduled.
static bool count_token(int32_t tok, void *user) {
    abort_ctx *a = user;
    tt_collect(tok, &a->out);
    if (a->out.n == a->abort_after) {
        atomic_store(&a->phase, 1);
        while (atomic_load(&a->phase) != 2) sched_yield();
    }
    return true;
}

static void *abort_thread(void *arg) {
    abort_ctx *a = arg;
    while (atomic_load(&a->phase) != 1) sched_yield();
    atomic_store(&a->abort_ret, a->s ? tri_session_abort(a->s) : tri_spec_abort(a->spec));
    atomic_store(&a->phase, 2);
    return NULL;
}

// A generation until the context is full, aborted by another thread at its 5th token: it returns
// OK with those 5 tokens and stop reason ABORT; the session is left as after a callback's stop,
// so a continuation gives the tokens one uninterrupted run gives.
Test(app, session_abort_from_another_thread, .timeout = TT_TIMEOUT(300)) {
    tri_model *m = load("abort", FAST_MODEL);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 4096;
    tri_generate_params gp = tri_generate_default_params();
    gp.stop_at_eos = false;  // n_predict 0: until the context is full, unless aborted

    tri_session *ref;
    tt_tokens want = {0};
    cr_assert_eq(tri_session_create(m, &sp, &ref), TRI_STATUS_OK, "%s", tri_last_error());
    gp.n_predict = 64;
    cr_assert_eq(tri_generate(ref, prompt, N_PROMPT, &gp, tt_collect, &want, NULL), TRI_STATUS_OK);
    tri_session_free(ref);

    abort_ctx a = {.abort_after = 5};
    cr_assert_eq(tri_session_create(m, &sp, &a.s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_not(tri_session_abort(a.s), "nothing runs: nothing to abort");
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, abort_thread, &a), 0);
    tri_generate_stats st;
    gp.n_predict = 0;
    cr_assert_eq(tri_generate(a.s, prompt, N_PROMPT, &gp, count_token, &a, &st), TRI_STATUS_OK, "%s", tri_last_error());
    pthread_join(th, NULL);
    cr_assert(atomic_load(&a.abort_ret), "the abort did not find the generation running");
    cr_assert_eq(st.stop_reason, TRI_STOP_ABORT, "stop reason %s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(st.n_generated, 5);
    cr_assert_eq(a.out.n, 5);
    cr_assert_not(tri_session_abort(a.s), "the generation is over: nothing to abort");

    // continued: the same tokens as the uninterrupted run, and no abort left over
    int32_t done = a.out.n;
    gp.n_predict = 64 - done;
    cr_assert_eq(tri_generate(a.s, NULL, 0, &gp, tt_collect, &a.out, &st), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(st.stop_reason, TRI_STOP_LENGTH, "stop reason %s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(a.out.n, 64);
    cr_assert_arr_eq(a.out.tok, want.tok, 64 * sizeof(int32_t));
    tri_session_free(a.s);
    tri_model_free(m);
}

typedef struct prefill_abort {
    tri_session *s;
    int64_t pieces;
    bool ret;
} prefill_abort;

static void *abort_session(void *arg) {
    prefill_abort *p = arg;
    p->ret = tri_session_abort(p->s);
    return NULL;
}

// During the prefill of the first piece, another thread aborts: the prefill stops after that piece.
static bool prefill_then_abort(int64_t done, int64_t total, void *user) {
    prefill_abort *p = user;
    if (p->pieces++ == 0) {
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, abort_session, p), 0);
        pthread_join(th, NULL);
    }
    return true;
}

Test(app, session_abort_during_prefill) {
    tri_model *m = load("abortpre", FAST_MODEL);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 256;
    sp.n_batch = 16;
    prefill_abort pa = {0};
    cr_assert_eq(tri_session_create(m, &sp, &pa.s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t long_prompt[100];
    for (int i = 0; i < 100; i++) long_prompt[i] = 3 + (i * 37) % 290;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = 8;
    gp.on_prefill = prefill_then_abort;
    gp.user = &pa;
    tri_generate_stats st;
    cr_assert_eq(tri_generate(pa.s, long_prompt, 100, &gp, NULL, NULL, &st), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(pa.ret);
    cr_assert_eq(st.stop_reason, TRI_STOP_ABORT, "stop reason %s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(st.n_prompt, 16, "prefilled %d of 100", st.n_prompt);
    cr_assert_eq(st.n_generated, 0);
    cr_assert_eq(tri_session_n_past(pa.s), 16);
    tri_session_free(pa.s);
    tri_model_free(m);
}

// The speculative engine: aborted between rounds, with every emitted token in its context.
Test(app, spec_abort_from_another_thread, .timeout = TT_TIMEOUT(300)) {
    tri_model *m = load("specabort", FAST_MODEL);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 4096;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    abort_ctx a = {.abort_after = 5};
    cr_assert_eq(tri_spec_create(m, &sp, &p, &a.spec), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_not(tri_spec_abort(a.spec));
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, abort_thread, &a), 0);
    tri_generate_params gp = tri_generate_default_params();
    gp.stop_at_eos = false;
    tri_spec_stats st;
    cr_assert_eq(tri_generate_spec(a.spec, prompt, N_PROMPT, &gp, count_token, &a, &st), TRI_STATUS_OK, "%s",
                 tri_last_error());
    pthread_join(th, NULL);
    cr_assert(atomic_load(&a.abort_ret));
    cr_assert_eq(st.stop_reason, TRI_STOP_ABORT, "stop reason %s", tri_stop_reason_str(st.stop_reason));
    // the round of the 5th token is emitted whole (up to gamma2 + 1 = 7 tokens), then it stops
    cr_assert(st.n_generated >= 5 && st.n_generated <= 11, "%d tokens", st.n_generated);
    cr_assert_eq(st.n_generated, a.out.n);
    cr_assert_eq(tri_spec_n_past(a.spec), N_PROMPT + st.n_generated);
    cr_assert_not(tri_spec_abort(a.spec));
    tri_spec_free(a.spec);
    tri_model_free(m);
}

// ---- why a generation stopped ----

static bool stop_at_third(int32_t tok, void *user) {
    tt_tokens *t = user;
    tt_collect(tok, t);
    return t->n < 3;
}

Test(app, stop_reasons) {
    tri_model *m = load("stop", FAST_MODEL);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = N_PROMPT + 6;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.stop_at_eos = false;
    tri_generate_stats st;

    gp.n_predict = 4;  // the limit
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, NULL, NULL, &st), TRI_STATUS_OK);
    cr_assert_eq(st.stop_reason, TRI_STOP_LENGTH, "%s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(st.n_generated, 4);
    gp.n_predict = 0;  // until the context is full: 2 more positions, and a last token not run
    cr_assert_eq(tri_generate(s, NULL, 0, &gp, NULL, NULL, &st), TRI_STATUS_OK);
    cr_assert_eq(st.stop_reason, TRI_STOP_CONTEXT, "%s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(st.n_generated, 3);
    // refused before it starts: an error
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, NULL, NULL, &st), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(st.stop_reason, TRI_STOP_ERROR);
    tri_session_reset(s);
    tt_tokens t = {0};  // the callback says stop
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, stop_at_third, &t, &st), TRI_STATUS_OK);
    cr_assert_eq(st.stop_reason, TRI_STOP_CALLBACK, "%s", tri_stop_reason_str(st.stop_reason));
    cr_assert_eq(st.n_generated, 3);
    tri_session_free(s);

    // end of sequence: sampled near uniformly (temperature 50), the end-of-sequence token comes up
    // about once in 300 tokens; 8,000 positions leave it a chance of e^-26 not to
    int32_t eos = tri_token_eos(m);
    cr_assert_geq(eos, 0);
    sp.n_ctx = 8000;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    gp.stop_at_eos = true;
    gp.sampler.temperature = 50.0f;
    gp.sampler.seed = 7;
    tt_tokens e = {0};
    cr_assert_eq(tri_generate(s, prompt, 1, &gp, tt_collect, &e, &st), TRI_STATUS_OK);
    cr_assert_eq(st.stop_reason, TRI_STOP_EOS, "%s after %d tokens", tri_stop_reason_str(st.stop_reason),
                 st.n_generated);
    cr_assert_eq(e.tok[e.n - 1], eos);
    for (int32_t i = 0; i < e.n - 1; i++) cr_assert_neq(e.tok[i], eos);
    tri_session_free(s);

    // the speculative engine: the limit and the callback
    sp.n_ctx = 256;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    tri_spec *spec;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
    tri_spec_stats ss;
    gp = tri_generate_default_params();
    gp.stop_at_eos = false;
    gp.n_predict = 9;
    cr_assert_eq(tri_generate_spec(spec, prompt, N_PROMPT, &gp, NULL, NULL, &ss), TRI_STATUS_OK);
    cr_assert_eq(ss.stop_reason, TRI_STOP_LENGTH, "%s", tri_stop_reason_str(ss.stop_reason));
    tt_tokens t2 = {0};
    cr_assert_eq(tri_generate_spec(spec, NULL, 0, &gp, stop_at_third, &t2, &ss), TRI_STATUS_OK);
    cr_assert_eq(ss.stop_reason, TRI_STOP_CALLBACK, "%s", tri_stop_reason_str(ss.stop_reason));
    cr_assert_eq(ss.n_generated, 3);
    cr_assert_eq(tri_generate_spec(spec, NULL, 300, &gp, NULL, NULL, &ss), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(ss.stop_reason, TRI_STOP_ERROR);
    tri_spec_free(spec);
    tri_model_free(m);

    const char *names[] = {"none", "eos", "length", "context", "callback", "abort", "error"};
    for (int r = TRI_STOP_NONE; r <= TRI_STOP_ERROR; r++) cr_assert_str_eq(tri_stop_reason_str(r), names[r]);
    cr_assert_str_eq(tri_stop_reason_str((tri_stop_reason)99), "?");
    // misuse: NULL handles
    cr_assert_not(tri_session_abort(NULL));
    cr_assert_not(tri_spec_abort(NULL));
}

// ---- an end of turn and a stop string are not a caller's stop ----

typedef struct text_buf {
    char s[4096];
    size_t n;
} text_buf;

static bool collect_text(const char *text, size_t len, void *user) {
    text_buf *b = user;
    cr_assert(b->n + len < sizeof b->s);
    memcpy(b->s + b->n, text, len);
    b->n += len;
    b->s[b->n] = 0;
    return true;
}

// The stop tokens tri_chat_stop_tokens gives (an end of turn) end an answer as end-of-sequence
// does, and a stop string is its own reason: neither is TRI_STOP_CALLBACK, which an application
// shows as "stopped by the user". Plain decoding and the speculative engine alike.
Test(app, stop_tokens_and_strings_are_not_a_callback_stop) {
    tri_model *m = load("eot", FAST_MODEL);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 256;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    for (int engine = 0; engine < 2; engine++) {
        tri_session *s = NULL;
        tri_spec *spec = NULL;
        if (engine == 0) cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        else cr_assert_eq(tri_spec_create(m, &sp, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
        tri_generate_stats gs;
        tri_spec_stats ss;
        tri_stop_reason *reason = engine == 0 ? &gs.stop_reason : &ss.stop_reason;
        int32_t *n_gen = engine == 0 ? &gs.n_generated : &ss.n_generated;
#define GEN(gp, fn, user)                                                                    \
    (engine == 0 ? tri_generate(s, prompt, N_PROMPT, &(gp), fn, user, &gs)                \
                 : tri_generate_spec(spec, prompt, N_PROMPT, &(gp), fn, user, &ss))
#define RESET() (engine == 0 ? tri_session_reset(s) : tri_spec_reset(spec))
        // greedy reference: 8 tokens and their text
        tri_generate_params gp = tri_generate_default_params();
        gp.stop_at_eos = false;
        gp.n_predict = 8;
        tt_tokens ref = {0};
        text_buf ref_text = {0};
        gp.on_text = collect_text;
        gp.text_user = &ref_text;
        cr_assert_eq(GEN(gp, tt_collect, &ref), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(*reason, TRI_STOP_LENGTH, "%s", tri_stop_reason_str(*reason));
        cr_assert_eq(ref.n, 8);
        cr_assert_gt(ref_text.n, 0, "the reference has no text");

        // a stop token (the 5th token, at its first place in the answer)
        int32_t stop = ref.tok[4], at = 0;
        while (ref.tok[at] != stop) at++;
        RESET();
        gp = tri_generate_default_params();
        gp.stop_at_eos = false;
        gp.n_predict = 16;
        gp.stop_tokens = &stop;
        gp.n_stop_tokens = 1;
        tt_tokens t = {0};
        cr_assert_eq(GEN(gp, tt_collect, &t), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(*reason, TRI_STOP_EOS, "engine %d: an end of turn reported as %s", engine,
                     tri_stop_reason_str(*reason));
        cr_assert_eq(*n_gen, at + 1);
        cr_assert_eq(t.tok[t.n - 1], stop);

        // a stop string: the reference's whole text, complete by its 8th token at the latest
        RESET();
        gp = tri_generate_default_params();
        gp.stop_at_eos = false;
        gp.n_predict = 16;
        const char *stops[] = {ref_text.s};
        gp.stop = stops;
        gp.n_stop = 1;
        cr_assert_eq(GEN(gp, NULL, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(*reason, TRI_STOP_STRING, "engine %d: a stop string reported as %s", engine,
                     tri_stop_reason_str(*reason));
        cr_assert_leq(*n_gen, 8);

        // the caller's own stop is still the callback's, through the text path too
        RESET();
        gp.stop = NULL;
        gp.n_stop = 0;
        text_buf t3_text = {0};
        gp.on_text = collect_text;
        gp.text_user = &t3_text;
        tt_tokens t3 = {0};
        cr_assert_eq(GEN(gp, stop_at_third, &t3), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(*reason, TRI_STOP_CALLBACK, "%s", tri_stop_reason_str(*reason));
#undef GEN
#undef RESET
        tri_session_free(s);
        tri_spec_free(spec);
    }
    cr_assert_str_eq(tri_stop_reason_str(TRI_STOP_STRING), "stop_string");
    tri_model_free(m);
}

// ---- n_ctx ----

typedef struct log_capture {
    char text[8192];
    int n_warn;
} log_capture;

static void capture_log(tri_log_level level, const char *msg, void *user) {
    log_capture *c = user;
    if (level != TRI_LOG_LEVEL_WARN) return;
    c->n_warn++;
    size_t len = strlen(c->text);
    snprintf(c->text + len, sizeof c->text - len, "%s\n", msg);
}

// 0 is the model's trained context, whatever its size (this model's is 10,000); a context beyond
// it is made, with a warning naming both numbers; one within it warns of nothing.
Test(app, n_ctx_zero_and_beyond_the_trained_context) {
    tri_model *m = load("ctx", "--seed 13 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1 --vocab 300 --ctx 10000");
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert_eq(info.config.n_ctx_train, 10000);
    log_capture c = {0};
    tri_log_set(capture_log, &c, TRI_LOG_LEVEL_DEBUG);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_n_ctx(s), 10000);
    tri_session_free(s);
    sp.n_ctx = 10000;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
    cr_assert_eq(c.n_warn, 0, "warned: %s", c.text);

    sp.n_ctx = 12000;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_n_ctx(s), 12000);
    tri_session_free(s);
    cr_assert_eq(c.n_warn, 1, "warnings: %s", c.text);
    cr_assert(strstr(c.text, "n_ctx 12000") && strstr(c.text, "10000"), "warning: %s", c.text);

    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    tri_spec *spec;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
    tri_spec_free(spec);
    cr_assert_eq(c.n_warn, 2, "warnings: %s", c.text);
    cr_assert(strstr(c.text, "speculative: n_ctx 12000"), "warning: %s", c.text);
    tri_log_set(NULL, NULL, TRI_LOG_LEVEL_WARN);
    tri_model_free(m);
}
