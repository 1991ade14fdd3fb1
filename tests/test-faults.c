// test-faults.c - fault-injection sweeps (core/fault.h, docs/reliability.md).
//
// Each scenario is a piece of real use of the public API: model load (GGUF, HF safetensors),
// session creation and a short generation with each KV policy, the speculative engine, offloaded
// KV with streamed and disk-read weights on a CPU backend with a transfer stream (the emulated
// GPU of async-backend.h), and the same on the CUDA backend where there is a device (in CI, the
// CPU emulator of tests/cudaemu: scripts/test.sh runs faults/cuda_* with it). A first run counts the calls of the fault kinds; then the scenario runs
// again once for each N (every N up to the end of creation, evenly spaced N after it, see
// sweep()), with the Nth call failing. Every run must
//   - end in a failing status with a message (or succeed, when the failed call had a fallback,
//     and then produce the unfaulted tokens),
//   - leak nothing: under LeakSanitizer each run ends with a leak check of its own,
//   - leave the API usable: a handle whose call failed is reset and generates the unfaulted
//     tokens, and the whole scenario then runs again cleanly.
// A crash (a NULL taken for memory, a double free) kills the test. The figures are printed for
// docs/reliability.md.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async-backend.h"
#include "backend-select.h"
#include "fault.h"
#include "test-util.h"
#include "triforce.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_LSAN 1
#endif
#endif
#if !defined(HAVE_LSAN) && defined(__SANITIZE_ADDRESS__)
#define HAVE_LSAN 1
#endif
#ifdef HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

// ---- scenario plumbing ----

enum { NP = 40, NG = 6, MAX_TOK = 64 };

typedef struct run_out {
    tri_status st;
    tt_tokens out;          // the tokens, at most MAX_TOK (out.cap)
    int64_t calls_created;  // fault-kind calls counted when creation was done
    bool reused;            // a handle whose call failed was reset and rerun
} run_out;

typedef struct scenario {
    const char *name;
    void (*run)(const struct scenario *sc, run_out *out);
    const char *target, *draft, *hf;  // model paths
    tri_kv_policy policy;
    tri_spec_mode spec_mode;
    bool async;            // the emulated GPU (transfer stream, host_memory false)
    bool cuda;             // on CUDA device 0 (else on the CPU)
    int32_t kv_offloaded;  // session params
    int32_t streamed, from_disk;
} scenario;

static const int32_t *prompt(void) {
    static int32_t p[NP];
    for (int i = 0; i < NP; i++) p[i] = i % 13 < 9 ? (i % 13) * 11 + 5 : (i * 31) % 250 + 3;
    return p;
}

static tri_status async_factory(int32_t n_threads, tri__backend **out) {
    tri_status st = async_backend_create(n_threads, ASYNC_LATE, out);
    if (!st) (*out)->host_memory = false;
    return st;
}

static tri_session_params session_params(const scenario *sc) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 96;
    sp.n_batch = 16;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F32;
    sp.device_kind = sc->cuda ? TRI_DEVICE_CUDA : TRI_DEVICE_CPU;
    sp.kv_policy = sc->policy;
    sp.kv_budget = 24;
    sp.kv_chunk = 4;
    sp.kv_sink = 4;
    sp.kv_refresh = 3;
    sp.kv_layers_offloaded = sc->kv_offloaded;
    sp.weight_layers_streamed = sc->streamed;
    sp.weight_layers_from_disk = sc->from_disk;
    return sp;
}

// Sessions sample (temperature 0.8), so the random stream must survive a failed call too. The
// speculative engine decodes greedily: a failed allocation it recovers from (a selection during
// L3's pass that cannot be stored is made by L2 in a step of its own) changes the drafts, and
// with them which random numbers a sampled run draws, but never the greedy tokens, which are
// plain decoding's.
static tri_generate_params gen_params(bool greedy) {
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = greedy ? 0.0f : 0.8f;
    gp.sampler.seed = 42;
    return gp;
}

// Model load alone.
static void run_load(const scenario *sc, run_out *o) {
    tri_model *m = NULL;
    o->st = tri_model_load(sc->hf ? sc->hf : sc->target, NULL, &m);
    o->calls_created = tri__fault_calls();
    if (!o->st) {
        // the tokenizer works: one encode and decode
        int32_t ids[32];
        int64_t n = 0;
        o->st = tri_tokenize(m, "Hello, world", 12, true, false, ids, 32, &n);
        char buf[64];
        size_t len;
        if (!o->st) o->st = tri_detokenize(m, ids, n, false, buf, sizeof buf, &len);
        for (int64_t i = 0; !o->st && i < n && i < MAX_TOK; i++) o->out.tok[o->out.n++] = ids[i];
    }
    tri_model_free(m);
}

// Session create and a short generation; a generation that fails is retried from a reset.
static void run_session(const scenario *sc, run_out *o) {
    tri_model *m = NULL;
    tri_session *s = NULL;
    if (sc->async) tri__backend_cpu_factory = async_factory;
    o->st = tri_model_load(sc->target, NULL, &m);
    tri_session_params sp = session_params(sc);
    if (!o->st) o->st = tri_session_create(m, &sp, &s);
    o->calls_created = tri__fault_calls();
    tri_generate_params gp = gen_params(false);
    if (!o->st) {
        o->st = tri_generate(s, prompt(), NP, &gp, tt_collect_upto, &o->out, NULL);
        if (o->st) {  // the API is usable afterwards: the same session, reset, generates again
            tri_status failed = o->st;
            tri__fault_disarm();
            tri_session_reset(s);
            o->out.n = 0;
            cr_assert_eq(tri_generate(s, prompt(), NP, &gp, tt_collect_upto, &o->out, NULL), TRI_STATUS_OK,
                         "%s: generate after a failed one: %s", sc->name, tri_last_error());
            o->st = failed;
            o->reused = true;
        }
    }
    tri_session_free(s);
    tri_model_free(m);
    tri__backend_cpu_factory = NULL;
}

// Speculative engine create and a short generation, retried after a reset when it fails.
static void run_spec(const scenario *sc, run_out *o) {
    tri_model *m = NULL, *d = NULL;
    tri_spec *e = NULL;
    if (sc->async) tri__backend_cpu_factory = async_factory;
    o->st = tri_model_load(sc->target, NULL, &m);
    if (!o->st && sc->draft) o->st = tri_model_load(sc->draft, NULL, &d);
    tri_session_params sp = session_params(sc);
    tri_spec_params p = tri_spec_default_params();
    p.mode = sc->spec_mode;
    p.draft_model = d;
    if (!d) p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    p.budget = 16;
    p.chunk = 4;
    p.gamma2 = 3;
    p.draft_window = 12;
    p.draft_sink = 4;
    p.refresh = 4;
    if (!o->st) o->st = tri_spec_create(m, &sp, &p, &e);
    o->calls_created = tri__fault_calls();
    tri_generate_params gp = gen_params(true);
    if (!o->st) {
        o->st = tri_generate_spec(e, prompt(), NP, &gp, tt_collect_upto, &o->out, NULL);
        if (o->st) {
            tri_status failed = o->st;
            tri__fault_disarm();
            tri_spec_reset(e);
            o->out.n = 0;
            cr_assert_eq(tri_generate_spec(e, prompt(), NP, &gp, tt_collect_upto, &o->out, NULL), TRI_STATUS_OK,
                         "%s: generate after a failed one: %s", sc->name, tri_last_error());
            o->st = failed;
            o->reused = true;
        }
    }
    tri_spec_free(e);
    tri_model_free(d);
    tri_model_free(m);
    tri__backend_cpu_factory = NULL;
}

// Three sessions (full, streaming, retrieval) as one batch: their prompts (of different lengths)
// packed, then NG sampled tokens each, every token one pass for all. Reseeded each time, so a
// batch retried after a reset draws the unfaulted tokens.
static tri_status batch_generate(tri_session **s, run_out *o) {
    const int32_t *toks[3];
    int32_t n[3], next[3];
    tri_generate_params gp = gen_params(false);
    for (int i = 0; i < 3; i++) {
        tri_session_seed(s[i], 42 + (uint64_t)i);
        toks[i] = prompt() + 7 * i;
        n[i] = NP - 7 * i;
    }
    tri_status st = tri_session_eval_batch(s, toks, n, 3);
    for (int k = 0; !st && k < NG; k++) {
        for (int i = 0; !st && i < 3; i++) {
            st = tri_session_sample(s[i], &gp.sampler, &next[i]);
            if (!st) tt_collect_upto(next[i], &o->out);
            toks[i] = &next[i];
            n[i] = 1;
        }
        if (!st) st = tri_session_eval_batch(s, toks, n, 3);
    }
    return st;
}

// Sessions created, then a batch; a batch that fails is retried from a reset of every session.
static void run_batch(const scenario *sc, run_out *o) {
    static const tri_kv_policy pol[3] = {TRI_KV_POLICY_FULL, TRI_KV_POLICY_STREAMING, TRI_KV_POLICY_RETRIEVAL};
    tri_model *m = NULL;
    tri_session *s[3] = {NULL, NULL, NULL};
    o->st = tri_model_load(sc->target, NULL, &m);
    for (int i = 0; i < 3 && !o->st; i++) {
        tri_session_params sp = session_params(sc);
        sp.kv_policy = pol[i];
        o->st = tri_session_create(m, &sp, &s[i]);
    }
    o->calls_created = tri__fault_calls();
    if (!o->st) {
        o->st = batch_generate(s, o);
        if (o->st) {
            tri_status failed = o->st;
            tri__fault_disarm();
            for (int i = 0; i < 3; i++) tri_session_reset(s[i]);
            o->out.n = 0;
            cr_assert_eq(batch_generate(s, o), TRI_STATUS_OK, "%s: a batch after a failed one: %s", sc->name,
                         tri_last_error());
            o->st = failed;
            o->reused = true;
        }
    }
    for (int i = 0; i < 3; i++) tri_session_free(s[i]);
    tri_model_free(m);
}

// ---- the sweep ----

typedef struct sweep_stats {
    int64_t sites;      // fault-kind calls in one clean run
    int64_t runs;       // runs with a fault
    int64_t failed;     // of them, ending in a failing status
    int64_t recovered;  // ending in success although a call failed (a fallback took over)
    int64_t reused;     // a handle whose call failed was reset and generated again
} sweep_stats;

static bool leak_check(void) {
#ifdef HAVE_LSAN
    return __lsan_do_recoverable_leak_check() == 0;
#else
    return true;
#endif
}

static bool expected_status(unsigned kinds, tri_status st) {
    if (kinds & (TRI__FAULT_READ | TRI__FAULT_URING)) return st == TRI_STATUS_IO || st == TRI_STATUS_UNSUPPORTED;
    return st == TRI_STATUS_OUT_OF_MEMORY || ((kinds & TRI__FAULT_DEVICE) && st == TRI_STATUS_DEVICE_OUT_OF_MEMORY) ||
           ((kinds & TRI__FAULT_MMAP) && st == TRI_STATUS_IO);
}

// Runs sc once unfaulted (the reference tokens and the call count), then once for every N in
// [1, calls at the end of creation] and for at most `budget` evenly spaced N after it, each with
// the Nth call of kinds failing (every later one too with persist).
static sweep_stats sweep(const scenario *sc, unsigned kinds, bool persist, tri__fault_read_mode rm, int64_t budget) {
    sweep_stats ss = {0};
    run_out ref = {.out.cap = MAX_TOK};
    tri__fault_arm(kinds, 0, false, rm);
    sc->run(sc, &ref);
    tri__fault_disarm();
    cr_assert_eq(ref.st, TRI_STATUS_OK, "%s: unfaulted run: %s", sc->name, tri_last_error());
    ss.sites = tri__fault_calls();
    int64_t created = ref.calls_created;
    cr_assert(leak_check(), "%s: the unfaulted run leaks", sc->name);
    int64_t after = ss.sites - created;
    int64_t stride = after > budget ? (after + budget - 1) / budget : 1;
    for (int64_t nth = 1; nth <= ss.sites; nth += nth < created ? 1 : stride) {
        run_out o = {.out.cap = MAX_TOK};
        tri__fault_arm(kinds, nth, persist, rm);
        sc->run(sc, &o);
        int64_t failures = tri__fault_failures();
        tri__fault_disarm();
        ss.runs++;
        cr_assert(persist ? failures >= 1 : failures == 1, "%s: fault at call %lld: %lld calls failed", sc->name,
                  (long long)nth, (long long)failures);
        if (o.st) {
            ss.failed++;
            cr_assert(expected_status(kinds, o.st), "%s: fault at call %lld of %lld: status %s: %s", sc->name,
                      (long long)nth, (long long)ss.sites, tri_status_str(o.st), tri_last_error());
            const char *e = tri_last_error();
            cr_assert(e && e[0], "%s: fault at call %lld: a failure without a message", sc->name, (long long)nth);
        } else {
            ss.recovered++;
        }
        if (o.reused || !o.st) {  // whatever ran to the end produced the unfaulted tokens
            cr_assert_eq(o.out.n, ref.out.n, "%s: fault at call %lld: %d tokens, %d unfaulted", sc->name,
                         (long long)nth, o.out.n, ref.out.n);
            for (int32_t i = 0; i < o.out.n; i++)
                cr_assert_eq(o.out.tok[i], ref.out.tok[i], "%s: fault at call %lld: token %d: %d, unfaulted %d",
                             sc->name, (long long)nth, i, o.out.tok[i], ref.out.tok[i]);
        }
        ss.reused += o.reused;
        cr_assert(leak_check(), "%s: fault at call %lld of %lld leaks (report above)", sc->name, (long long)nth,
                  (long long)ss.sites);
    }
    // and the API still works from scratch
    run_out again = {.out.cap = MAX_TOK};
    sc->run(sc, &again);
    cr_assert_eq(again.st, TRI_STATUS_OK, "%s: clean run after the sweep: %s", sc->name, tri_last_error());
    cr_assert_eq(again.out.n, ref.out.n);
    printf("faults %-28s kinds %#x%s%s: %lld sites, %lld runs, %lld failed cleanly, %lld recovered, %lld handles "
           "reused, 0 crashes, 0 leaks%s\n",
           sc->name, kinds, kinds & TRI__FAULT_READ ? (rm == TRI__FAULT_READ_EIO ? " eio" : " short") : "",
           persist ? " persist" : "", (long long)ss.sites, (long long)ss.runs, (long long)ss.failed,
           (long long)ss.recovered, (long long)ss.reused, leak_check() ? "" : " (LEAK)");
    fflush(stdout);
    return ss;
}

// ---- models ----

// Criterion runs the tests in parallel processes: every scratch name carries the pid.
static const char *model(const char *tag, const char *opts) {
    static char paths[4][4096];
    static int next;
    char *p = paths[next++ % 4], name[128];
    snprintf(name, sizeof name, "%s-%d", tag, (int)getpid());
    snprintf(p, 4096, "%s", tt_gen_model(name, opts));
    return p;
}

// The HF directory tt_gen_model wrote beside the GGUF of tag.
static const char *hf_dir(const char *tag) {
    static char p[4096];
    char name[160];
    snprintf(name, sizeof name, "%s-%d.hf", tag, (int)getpid());
    snprintf(p, sizeof p, "%s", tt_tmp(name));
    return p;
}

#define TARGET_OPTS "--seed 71 --layers 2 --vocab 260 --embd 32 --ff 64 --heads 4 --kv-heads 2"
#define DRAFT_OPTS "--seed 72 --layers 1 --vocab 260 --embd 16 --ff 32 --heads 2 --kv-heads 1"

static const unsigned ALLOC_KINDS = TRI__FAULT_ALLOC | TRI__FAULT_MMAP | TRI__FAULT_DEVICE;

static void need_wrapped(void) {
    if (!tri__fault_wrapped())
        cr_skip_test("the library was built without fault injection (meson -Dfault_injection=enabled)");
}

// ---- tests ----

Test(faults, model_load, .timeout = 600) {
    need_wrapped();
    scenario gguf = {.name = "load gguf", .run = run_load, .target = model("faults-t", TARGET_OPTS)};
    sweep(&gguf, ALLOC_KINDS, false, 0, 400);
    scenario hf = {.name = "load safetensors", .run = run_load, .hf = hf_dir("faults-t")};
    sweep(&hf, ALLOC_KINDS, false, 0, 400);
    sweep(&hf, ALLOC_KINDS, true, 0, 100);
}

Test(faults, session_each_policy, .timeout = 600) {
    need_wrapped();
    const char *t = model("faults-t", TARGET_OPTS);
    static const struct { tri_kv_policy p; const char *name; } pol[] = {
        {TRI_KV_POLICY_FULL, "session full"},
        {TRI_KV_POLICY_STREAMING, "session streaming"},
        {TRI_KV_POLICY_H2O, "session h2o"},
        {TRI_KV_POLICY_RETRIEVAL, "session retrieval"},
    };
    for (size_t i = 0; i < sizeof pol / sizeof pol[0]; i++) {
        scenario sc = {.name = pol[i].name, .run = run_session, .target = t, .policy = pol[i].p};
        sweep(&sc, ALLOC_KINDS, false, 0, 150);
    }
}

Test(faults, session_batch, .timeout = 600) {
    need_wrapped();
    scenario sc = {.name = "session batch", .run = run_batch, .target = model("faults-t", TARGET_OPTS)};
    sweep(&sc, ALLOC_KINDS, false, 0, 150);
}

Test(faults, spec_engine, .timeout = 600) {
    need_wrapped();
    const char *t = model("faults-t", TARGET_OPTS);
    const char *d = model("faults-d", DRAFT_OPTS);
    scenario tf = {.name = "spec triforce", .run = run_spec, .target = t, .draft = d,
                   .spec_mode = TRI_SPEC_MODE_TRIFORCE};
    sweep(&tf, ALLOC_KINDS, false, 0, 200);
    scenario ng = {.name = "spec draft ngram", .run = run_spec, .target = t, .spec_mode = TRI_SPEC_MODE_DRAFT};
    sweep(&ng, ALLOC_KINDS, false, 0, 100);
}

// Offloaded KV, weights streamed from host memory and read from the file, on the emulated GPU.
Test(faults, offloaded_on_emulated_device, .timeout = 600) {
    need_wrapped();
    const char *t = model("faults-t", TARGET_OPTS);
    scenario off = {.name = "session offloaded", .run = run_session, .target = t, .async = true,
                    .kv_offloaded = 1, .streamed = 2, .from_disk = 1};
    sweep(&off, ALLOC_KINDS, false, 0, 200);
    scenario spec = {.name = "spec offloaded", .run = run_spec, .target = t, .async = true,
                     .spec_mode = TRI_SPEC_MODE_RETRIEVAL, .kv_offloaded = 1, .streamed = 2, .from_disk = 1};
    sweep(&spec, ALLOC_KINDS, false, 0, 150);
}

// A first session on the device, unfaulted, over model t: what the process sets up once (the CUDA
// module, cuBLAS) is then not counted among every run's calls.
static void cuda_warm_up(const char *t) {
    tri_model *m;
    tri_session *s;
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CUDA;
    sp.n_ctx = 16;
    cr_assert_eq(tri_model_load(t, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
    tri_model_free(m);
}

// The CUDA backend's own allocations (cudaMalloc, cudaHostAlloc, cudaHostRegister through the
// tri__cuda_* wrappers, counted as TRI__FAULT_DEVICE) and the library's around them: a session
// with offloaded KV and streamed weights, and the retrieval engine over it, on device 0.
Test(faults, cuda_offloaded, .timeout = TT_TIMEOUT(600)) {
    need_wrapped();
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    const char *t = model("faults-cuda", TARGET_OPTS);
    cuda_warm_up(t);
    scenario off = {.name = "cuda session offloaded", .run = run_session, .target = t, .cuda = true,
                    .kv_offloaded = 1, .streamed = 1};
    sweep(&off, ALLOC_KINDS, false, 0, 40);
    scenario spec = {.name = "cuda spec offloaded", .run = run_spec, .target = t, .cuda = true,
                     .spec_mode = TRI_SPEC_MODE_RETRIEVAL, .kv_offloaded = 1, .streamed = 1};
    sweep(&spec, ALLOC_KINDS, false, 0, 30);
}

// The draft's recorded step on the device (tri__llama_step: a graph recorded at the first step and
// the buffers it owns): a session decoding over StreamingLLM past its window, and the whole engine
// with a draft model as L1. A failure while recording leaves no graph behind, and the same handle
// records again after its reset.
Test(faults, cuda_recorded_steps, .timeout = TT_TIMEOUT(600)) {
    need_wrapped();
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    const char *t = model("faults-cuda", TARGET_OPTS);
    const char *d = model("faults-cuda-d", DRAFT_OPTS);
    cuda_warm_up(t);
    scenario stream = {.name = "cuda session streaming", .run = run_session, .target = t, .cuda = true,
                       .policy = TRI_KV_POLICY_STREAMING};
    sweep_stats a = sweep(&stream, ALLOC_KINDS, false, 0, 40);
    scenario tf = {.name = "cuda spec triforce", .run = run_spec, .target = t, .draft = d, .cuda = true,
                   .spec_mode = TRI_SPEC_MODE_TRIFORCE};
    sweep_stats b = sweep(&tf, ALLOC_KINDS, false, 0, 40);
    cr_assert(a.failed > 0 && b.failed > 0, "faults that fail the runs were injected");
}

// The disk tier: reads failing with EIO, coming up short, and io_uring refused at set-up.
Test(faults, disk_tier_io, .timeout = 600) {
    // more layers read from disk than the three staging slots hold, so every pass reads again
    const char *t = model("faults-disk", "--seed 73 --layers 5 --vocab 260 --embd 32 --ff 64 --heads 4 --kv-heads 2");
    scenario disk = {.name = "disk weights", .run = run_session, .target = t, .async = true, .streamed = 4,
                     .from_disk = 4};
    sweep_stats eio = sweep(&disk, TRI__FAULT_READ, false, TRI__FAULT_READ_EIO, 1000);
    cr_assert_gt(eio.sites, 0, "the scenario reads nothing from disk");
    cr_assert_eq(eio.failed, eio.runs, "an EIO must fail the call");
    sweep_stats sh = sweep(&disk, TRI__FAULT_READ, false, TRI__FAULT_READ_SHORT, 1000);
    cr_assert_eq(sh.recovered, sh.runs, "a short read is read on, not an error");
    sweep_stats sh_all = sweep(&disk, TRI__FAULT_READ, true, TRI__FAULT_READ_SHORT, 50);
    cr_assert_eq(sh_all.runs, sh_all.recovered + sh_all.failed);
    sweep_stats ur = sweep(&disk, TRI__FAULT_URING, true, 0, 10);
    cr_assert_eq(ur.recovered, ur.runs, "without io_uring the weights are read with pread threads");
}
