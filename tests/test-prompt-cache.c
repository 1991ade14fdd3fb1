// test-prompt-cache.c - the prompt cache on disk (tri_session_save_prompt / tri_session_load_prompt,
// engine/prompt-cache.c): a reload reproduces the state after the prefill (greedy output token for
// token), a longer prompt reuses the common prefix and prefills only its new tokens, and a file for
// another model or other parameters, or a truncated or corrupt one, is refused with a message that
// says why, leaving the session empty and usable.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "prompt-cache.h"
#include "test-util.h"
#include "triforce.h"

// 4 layers x 8 KV heads x 64 dims of f16: 8 KiB of K and V per token, so a block of the file holds
// 512 tokens and the prompts below span several blocks.
#define MODEL_A "--seed 31 --layers 4 --embd 256 --ff 256 --heads 8 --kv-heads 8 --head-dim 64 --vocab 300 --ctx 4096"
#define MODEL_B "--seed 32 --layers 4 --embd 256 --ff 256 --heads 8 --kv-heads 8 --head-dim 64 --vocab 300 --ctx 4096"
#define N_PROMPT 1200
#define N_GEN 12

static tri_model *load_model(const char *tag, const char *opts) {
    char t[96];
    snprintf(t, sizeof t, "pcache-%s-%d", tag, (int)getpid());
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model(t, opts), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

static const char *cache_path(const char *tag) {
    char name[96];
    snprintf(name, sizeof name, "pcache-%s-%d.kv", tag, (int)getpid());
    return tt_tmp(name);
}

// A prompt of n ids in [1, 300), seeded.
static void make_prompt(int32_t *ids, int32_t n, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = 1 + (int32_t)((seed >> 8) % 299);
    }
}

static tri_session *new_session(const tri_model *m, tri_dtype kv_type, int32_t offloaded, int32_t n_ctx) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_ctx;
    sp.kv_type = kv_type;
    sp.device_kind = TRI_DEVICE_CPU;
    sp.kv_layers_offloaded = offloaded;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    return s;
}

// Saves the prompt's KV from on_prefill at the end of the prefill, as the CLI does.
typedef struct saver {
    tri_session *s;
    const char *path;
    const int32_t *ids;
    int32_t n;
    tri_prompt_cache_stats stats;
    int saves;
} saver;

static bool save_at_end(int64_t done, int64_t total, void *user) {
    saver *sv = user;
    if (done == total) {
        cr_assert_eq(tri_session_save_prompt(sv->s, sv->path, sv->ids, sv->n, &sv->stats), TRI_STATUS_OK, "%s",
                     tri_last_error());
        sv->saves++;
    }
    return true;
}

// Greedy generation of N_GEN tokens after prompt[from .. n) on s; the stats' n_prompt is what the
// call prefilled.
static float run_penalty = 1.0f;  // the repetition penalty run's greedy sampler applies

static tt_tokens run(tri_session *s, const int32_t *prompt, int32_t from, int32_t n, saver *sv, int32_t *n_prefilled) {
    tri_generate_params gp = tri_generate_default_params();
    gp.sampler.repeat_penalty = run_penalty;
    gp.sampler.presence_penalty = run_penalty > 1.0f ? 2.0f : 0.0f;
    gp.sampler.penalty_last_n = 256;
    gp.n_predict = N_GEN;
    gp.stop_at_eos = false;
    if (sv) {
        gp.on_prefill = save_at_end;
        gp.user = sv;
    }
    tt_tokens out = {.cap = 64};
    tri_generate_stats st;
    cr_assert_eq(tri_generate(s, prompt + from, n - from, &gp, tt_collect, &out, &st), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(out.n, N_GEN);
    if (n_prefilled) *n_prefilled = st.n_prompt;
    return out;
}

static void assert_same(const tt_tokens *a, const tt_tokens *b, const char *what) {
    cr_assert_eq(a->n, b->n, "%s: %d tokens, %d expected", what, a->n, b->n);
    for (int32_t i = 0; i < a->n; i++)
        cr_assert_eq(a->tok[i], b->tok[i], "%s: token %d is %d, %d expected", what, i, a->tok[i], b->tok[i]);
}

// Writes a cache of prompt[0 .. n) computed by a fresh session of m; returns that run's output.
static tt_tokens write_cache(const tri_model *m, const char *path, const int32_t *prompt, int32_t n, tri_dtype kv_type,
                             int32_t offloaded) {
    tri_session *s = new_session(m, kv_type, offloaded, 4096);
    saver sv = {s, path, prompt, n, {0}, 0};
    tt_tokens out = run(s, prompt, 0, n, &sv, NULL);
    cr_assert_eq(sv.saves, 1);
    cr_assert_eq(sv.stats.n_tokens, n);
    cr_assert(sv.stats.logits, "the prefill's logits are saved");
    cr_assert(sv.stats.bytes > (uint64_t)n * 4096, "%llu bytes written", (unsigned long long)sv.stats.bytes);
    tri_session_free(s);
    return out;
}

// ---- round trip ----

// A session loaded from the file holds the prompt and its logits: it prefills nothing and its
// greedy tokens are the fresh run's, for a cache in memory and for one whose last layers are
// offloaded to host memory (saved from there and loaded into either kind).
Test(prompt_cache, round_trip_reproduces_the_prefill, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("a", MODEL_A);
    static int32_t prompt[N_PROMPT];
    make_prompt(prompt, N_PROMPT, 7);
    for (int off = 0; off < 2; off++) {
        const char *path = cache_path(off ? "rt-off" : "rt");
        char p[4096];
        snprintf(p, sizeof p, "%s", path);
        tt_tokens fresh = write_cache(m, p, prompt, N_PROMPT, TRI_DTYPE_F16, off ? 2 : 0);
        for (int into_off = 0; into_off < 2; into_off++) {
            // another n_ctx than the writer's: the rows do not depend on it for this rope
            tri_session *s = new_session(m, TRI_DTYPE_F16, into_off ? 3 : 0, 3000);
            tri_prompt_cache_stats cs;
            cr_assert_eq(tri_session_load_prompt(s, p, prompt, N_PROMPT, &cs), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(cs.n_tokens, N_PROMPT);
            cr_assert_eq(cs.n_file, N_PROMPT);
            cr_assert(cs.logits);
            cr_assert_eq(tri_session_n_past(s), N_PROMPT);
            cr_assert(cs.bytes >= (uint64_t)N_PROMPT * 4096 && cs.seconds > 0 && cs.gbps > 0);
            int32_t n_prefilled = -1;
            tt_tokens again = run(s, prompt, N_PROMPT, N_PROMPT, NULL, &n_prefilled);
            cr_assert_eq(n_prefilled, 0, "a whole hit prefills nothing (%d tokens)", n_prefilled);
            assert_same(&again, &fresh, off ? "saved offloaded" : "saved in memory");
            tri_session_free(s);
        }
        unlink(p);
    }
    tri_model_free(m);
}

// ---- prefix reuse ----

// A prompt that extends the saved one reuses all of the saved tokens and prefills only the new
// ones; one that departs from it at position k reuses k; one that is a prefix of it reuses all but
// its last token (run for its logits). Each gives the fresh run's greedy tokens.
Test(prompt_cache, longest_common_prefix_is_reused, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("a2", MODEL_A);
    static int32_t saved[N_PROMPT], longer[N_PROMPT + 300];
    make_prompt(saved, N_PROMPT, 9);
    memcpy(longer, saved, sizeof saved);
    make_prompt(longer + N_PROMPT, 300, 10);
    char path[4096];
    snprintf(path, sizeof path, "%s", cache_path("lcp"));
    write_cache(m, path, saved, N_PROMPT, TRI_DTYPE_F16, 0);

    struct {
        const char *what;
        int32_t n, diverge, reused;
    } cases[] = {
        {"extends the saved prompt", N_PROMPT + 300, -1, N_PROMPT},
        {"departs at 700 (inside the second block)", N_PROMPT + 300, 700, 700},
        {"departs at 0", 600, 0, 0},
        {"a prefix of the saved prompt", 900, -1, 899},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        static int32_t q[N_PROMPT + 300];
        memcpy(q, longer, sizeof q);
        if (cases[c].diverge >= 0) q[cases[c].diverge] = q[cases[c].diverge] % 299 + 1;  // another id
        int32_t n = cases[c].n;
        tri_session *fresh_s = new_session(m, TRI_DTYPE_F16, 0, 4096);
        tt_tokens fresh = run(fresh_s, q, 0, n, NULL, NULL);
        tri_session_free(fresh_s);

        tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 4096);
        tri_prompt_cache_stats cs;
        cr_assert_eq(tri_session_load_prompt(s, path, q, n, &cs), TRI_STATUS_OK, "%s: %s", cases[c].what,
                     tri_last_error());
        cr_assert_eq(cs.n_tokens, cases[c].reused, "%s: %d reused, %d expected", cases[c].what, cs.n_tokens,
                     cases[c].reused);
        cr_assert_not(cs.logits, "%s: the saved logits are not this prompt's", cases[c].what);
        cr_assert_eq(tri_session_n_past(s), cases[c].reused);
        int32_t n_prefilled = -1;
        tt_tokens out = run(s, q, cs.n_tokens, n, NULL, &n_prefilled);
        cr_assert_eq(n_prefilled, n - cases[c].reused, "%s: %d tokens prefilled, %d expected", cases[c].what,
                     n_prefilled, n - cases[c].reused);
        assert_same(&out, &fresh, cases[c].what);
        tri_session_free(s);
    }
    unlink(path);
    tri_model_free(m);
}

// The sampler's penalties look back over the prompt: the loaded prefix counts as a prefilled one
// (the greedy tokens under strong penalties over 256 tokens are the fresh run's).
Test(prompt_cache, penalties_see_the_loaded_prefix, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("pen", MODEL_A);
    static int32_t q[N_PROMPT + 40];
    make_prompt(q, N_PROMPT + 40, 11);
    for (int32_t i = N_PROMPT; i < N_PROMPT + 40; i++) q[i] = q[i - 30];  // a repeating tail
    char path[4096];
    snprintf(path, sizeof path, "%s", cache_path("pen"));
    run_penalty = 1.0f;
    write_cache(m, path, q, N_PROMPT, TRI_DTYPE_F16, 0);
    run_penalty = 1.5f;
    tri_session *fresh_s = new_session(m, TRI_DTYPE_F16, 0, 4096);
    tt_tokens fresh = run(fresh_s, q, 0, N_PROMPT + 40, NULL, NULL);
    tri_session_free(fresh_s);
    tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 4096);
    tri_prompt_cache_stats cs;
    cr_assert_eq(tri_session_load_prompt(s, path, q, N_PROMPT + 40, &cs), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(cs.n_tokens, N_PROMPT);
    tt_tokens out = run(s, q, cs.n_tokens, N_PROMPT + 40, NULL, NULL);
    assert_same(&out, &fresh, "penalties after a load");
    run_penalty = 1.0f;
    tri_session_free(s);
    unlink(path);
    tri_model_free(m);
}

// ---- the retrieval policy: rebuilt from the loaded rows ----

static tri_session *retrieval_session(const tri_model *m) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 4096;
    sp.device_kind = TRI_DEVICE_CPU;
    sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
    sp.kv_budget = 256;
    sp.kv_chunk = 8;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    return s;
}

// A retrieval cache keeps every row: the file holds them, a load summarises their chunks again and
// leaves the prompt's last 16 tokens (the query history the selection after a prompt reads) to run,
// so the selection, and the greedy tokens after it, are the fresh run's; for the saved prompt and
// for one that extends it.
Test(prompt_cache, retrieval_cache_is_rebuilt, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("r", MODEL_A);
    static int32_t prompt[N_PROMPT + 200];
    make_prompt(prompt, N_PROMPT + 200, 17);
    char path[4096];
    snprintf(path, sizeof path, "%s", cache_path("ret"));
    tri_session *w = retrieval_session(m);
    saver sv = {w, path, prompt, N_PROMPT, {0}, 0};
    tt_tokens fresh = run(w, prompt, 0, N_PROMPT, &sv, NULL);
    cr_assert_eq(sv.saves, 1);
    tri_session_free(w);
    tri_session *f2 = retrieval_session(m);
    tt_tokens fresh_longer = run(f2, prompt, 0, N_PROMPT + 200, NULL, NULL);
    tri_session_free(f2);

    for (int longer = 0; longer < 2; longer++) {
        int32_t n = N_PROMPT + (longer ? 200 : 0);
        tri_session *s = retrieval_session(m);
        tri_prompt_cache_stats cs;
        cr_assert_eq(tri_session_load_prompt(s, path, prompt, n, &cs), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(cs.n_tokens, longer ? N_PROMPT : N_PROMPT - 16, "%d reused", cs.n_tokens);
        cr_assert_not(cs.logits);
        int32_t n_prefilled = -1;
        tt_tokens out = run(s, prompt, cs.n_tokens, n, NULL, &n_prefilled);
        cr_assert_eq(n_prefilled, n - cs.n_tokens);
        assert_same(&out, longer ? &fresh_longer : &fresh, longer ? "retrieval, extended" : "retrieval, same prompt");
        tri_session_free(s);
    }
    // the full policy reads a retrieval session's file as well: the rows are the same
    tri_session *full = new_session(m, TRI_DTYPE_F16, 0, 4096);
    tri_prompt_cache_stats cs;
    cr_assert_eq(tri_session_load_prompt(full, path, prompt, N_PROMPT, &cs), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(cs.n_tokens, N_PROMPT);
    tri_session_free(full);
    unlink(path);
    tri_model_free(m);
}

// ---- refused files ----

// After a refused load the session is empty and runs the whole prompt as a fresh one does.
static void assert_refused(tri_session *s, const char *path, const int32_t *prompt, int32_t n, tri_status want,
                           const char *words, const tt_tokens *fresh) {
    tri_prompt_cache_stats cs;
    cs.n_tokens = 99;
    tri_status st = tri_session_load_prompt(s, path, prompt, n, &cs);
    cr_assert_eq(st, want, "%s: status %s, %s expected (%s)", words, tri_status_str(st), tri_status_str(want),
                 tri_last_error());
    cr_assert(strstr(tri_last_error(), words), "message \"%s\" lacks \"%s\"", tri_last_error(), words);
    cr_assert(strstr(tri_last_error(), path), "message \"%s\" names no file", tri_last_error());
    cr_assert_eq(cs.n_tokens, 0);
    cr_assert_eq(tri_session_n_past(s), 0, "a refused file leaves the session empty");
    if (fresh) {
        int32_t n_prefilled = -1;
        tt_tokens out = run(s, prompt, 0, n, NULL, &n_prefilled);
        cr_assert_eq(n_prefilled, n);
        assert_same(&out, fresh, words);
        tri_session_reset(s);
    }
}

// A file of another model (same shapes, other weights) or of another KV type is refused, and so is
// a session whose policy keeps no full cache.
Test(prompt_cache, stale_file_is_refused, .timeout = TT_TIMEOUT(120)) {
    tri_model *a = load_model("sa", MODEL_A), *b = load_model("sb", MODEL_B);
    static int32_t prompt[1200];
    make_prompt(prompt, 1200, 11);
    char path[4096];
    snprintf(path, sizeof path, "%s", cache_path("stale"));
    write_cache(a, path, prompt, 1200, TRI_DTYPE_F16, 0);

    tri_session *sb = new_session(b, TRI_DTYPE_F16, 0, 4096);
    tt_tokens fresh_b = run(sb, prompt, 0, 1200, NULL, NULL);
    tri_session_reset(sb);
    // filled first, so that the refusal has something to empty
    tri_session *sb2 = new_session(b, TRI_DTYPE_F16, 0, 4096);
    run(sb2, prompt, 0, 50, NULL, NULL);
    assert_refused(sb2, path, prompt, 1200, TRI_STATUS_INVALID_ARGUMENT, "another model", &fresh_b);
    assert_refused(sb, path, prompt, 1200, TRI_STATUS_INVALID_ARGUMENT, "another model", NULL);

    tri_session *sa32 = new_session(a, TRI_DTYPE_F32, 0, 4096);
    assert_refused(sa32, path, prompt, 1200, TRI_STATUS_INVALID_ARGUMENT, "KV type f16; the session's is f32", NULL);

    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 4096;
    sp.kv_policy = TRI_KV_POLICY_STREAMING;
    sp.kv_budget = 256;
    tri_session *ss;
    cr_assert_eq(tri_session_create(a, &sp, &ss), TRI_STATUS_OK, "%s", tri_last_error());
    assert_refused(ss, path, prompt, 1200, TRI_STATUS_UNSUPPORTED, "only the full and retrieval policies", NULL);
    run(ss, prompt, 0, 300, NULL, NULL);
    cr_assert_eq(tri_session_save_prompt(ss, path, prompt, 300, NULL), TRI_STATUS_UNSUPPORTED);

    // a save names the tokens the session holds
    tri_session *sa = new_session(a, TRI_DTYPE_F16, 0, 4096);
    run(sa, prompt, 0, 100, NULL, NULL);  // 100 prompt tokens + 11 generated run, 1 pending
    cr_assert_eq(tri_session_save_prompt(sa, path, prompt, 100, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "holding 111"), "%s", tri_last_error());

    assert_refused(sa, "/nonexistent/dir/x.kv", prompt, 1200, TRI_STATUS_NOT_FOUND, "no such file", NULL);
    // an empty prompt reuses nothing (the file is still checked)
    tri_prompt_cache_stats cs;
    cr_assert_eq(tri_session_load_prompt(sa, path, prompt, 0, &cs), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(cs.n_tokens, 0);
    cr_assert_eq(cs.n_file, 1200);
    cr_assert_eq(tri_session_n_past(sa), 0);
    tri_session_free(sa);
    tri_session_free(ss);
    tri_session_free(sa32);
    tri_session_free(sb2);
    tri_session_free(sb);
    unlink(path);
    tri_model_free(a);
    tri_model_free(b);
}

static void write_bytes(const char *path, const void *data, size_t len) { tt_write_file(path, data, len); }

// Truncated files, a flipped byte in the header, the token table or the first block of rows, a
// file that is no prompt cache: each refused as BAD_FORMAT with the reason, the session left
// empty. A flipped byte in a later block keeps the blocks before it (issue 41).
Test(prompt_cache, corrupt_file_is_refused, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("c", MODEL_A);
    static int32_t prompt[N_PROMPT];
    make_prompt(prompt, N_PROMPT, 13);
    char good[4096], bad[4096];
    snprintf(good, sizeof good, "%s", cache_path("good"));
    snprintf(bad, sizeof bad, "%s", cache_path("bad"));
    tt_tokens fresh = write_cache(m, good, prompt, N_PROMPT, TRI_DTYPE_F16, 0);
    size_t len;
    unsigned char *file = tt_read_file(good, &len);
    cr_assert(len > (size_t)N_PROMPT * 8192, "%zu bytes", len);
    tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 4096);
    tri__pcache_header h;
    cr_assert_eq(tri__pcache_parse_header(good, file, len, len, &h), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(h.n_blocks, 3);

    write_bytes(bad, file, len - 4096);
    assert_refused(s, bad, prompt, N_PROMPT, TRI_STATUS_BAD_FORMAT, "truncated", &fresh);
    write_bytes(bad, file, 100);
    assert_refused(s, bad, prompt, N_PROMPT, TRI_STATUS_BAD_FORMAT, "shorter than the 128-byte header", NULL);
    write_bytes(bad, file, 0);
    assert_refused(s, bad, prompt, N_PROMPT, TRI_STATUS_BAD_FORMAT, "shorter than the 128-byte header", NULL);
    static const char text[] =
        "this is not a prompt cache, only text that is long enough to hold a header ......"
        "..................................................................................";
    write_bytes(bad, text, sizeof text);
    assert_refused(s, bad, prompt, N_PROMPT, TRI_STATUS_BAD_FORMAT, "not a prompt cache", NULL);

    const struct {
        size_t at;
        const char *words;
    } flips[] = {
        {60, "header's checksum"},                  // n_head_kv
        {128 + 4 * 700, "tokens and block table"},  // a token id
        {h.region_bytes + 1000, "block 0"},
    };
    for (size_t i = 0; i < sizeof flips / sizeof *flips; i++) {
        file[flips[i].at] ^= 0x10;
        write_bytes(bad, file, len);
        file[flips[i].at] ^= 0x10;
        // the whole prompt run afterwards once (the others leave the session as empty)
        assert_refused(s, bad, prompt, N_PROMPT, TRI_STATUS_BAD_FORMAT, flips[i].words, i == 2 ? &fresh : NULL);
    }
    // a later block that fails keeps the good prefix: blocks 0 and 1 (512 tokens each) load, the
    // rest is prefilled, and the output is the fresh run's
    tri_prompt_cache_stats cs;
    for (int blk = 1; blk <= 2; blk++) {
        size_t at = blk == 2 ? len - 5000 : (size_t)(h.region_bytes + h.block_bytes + 777);
        file[at] ^= 0x10;
        write_bytes(bad, file, len);
        file[at] ^= 0x10;
        cr_assert_eq(tri_session_load_prompt(s, bad, prompt, N_PROMPT, &cs), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(cs.damaged, "block %d: damaged", blk);
        cr_assert_not(cs.logits);
        cr_assert_eq(cs.n_tokens, blk * h.block_tokens, "block %d bad: %d tokens kept", blk, cs.n_tokens);
        cr_assert_eq(tri_session_n_past(s), blk * h.block_tokens);
        int32_t n_prefilled = 0;
        tt_tokens out = run(s, prompt, cs.n_tokens, N_PROMPT, NULL, &n_prefilled);
        cr_assert_eq(n_prefilled, N_PROMPT - cs.n_tokens);
        assert_same(&out, &fresh, "the good prefix of a damaged file");
    }
    // a block past the prefix wanted is not read, so its corruption does not matter to this prompt
    file[len - 5000] ^= 0x10;
    write_bytes(bad, file, len);
    cr_assert_eq(tri_session_load_prompt(s, bad, prompt, 1000, &cs), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(cs.n_tokens, 999);
    cr_assert_not(cs.damaged);

    tri_session_free(s);
    unlink(bad);
    unlink(good);
    free(file);
    tri_model_free(m);
}

// ---- files that are not ours ----

// A path that holds something other than a prompt cache (a document given as --prompt-cache by
// mistake, a directory) is refused by the save with a message naming it, and left as it was; an
// empty file and a cache of ours (stale: another prompt) are replaced. Issue 41, item 1.
Test(prompt_cache, foreign_file_is_not_replaced, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("foreign", "--seed 5 --layers 1 --vocab 300");
    tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 64);
    int32_t tok[3] = {1, 2, 3};
    cr_assert_eq(tri_session_eval(s, tok, 3, false), TRI_STATUS_OK, "%s", tri_last_error());
    char doc[4096];
    snprintf(doc, sizeof doc, "%s", cache_path("doc"));
    static const char text[] = "A document the user meant to give with -f, not --prompt-cache.\n";
    write_bytes(doc, text, sizeof text - 1);
    cr_assert_eq(tri_prompt_cache_writable(doc), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_save_prompt(s, doc, tok, 3, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), doc) && strstr(tri_last_error(), "not a prompt cache") &&
                  strstr(tri_last_error(), "not replaced"),
              "%s", tri_last_error());
    size_t len;
    char *back = tt_read_file(doc, &len);
    cr_assert(len == sizeof text - 1 && memcmp(back, text, len) == 0, "the document is unchanged");
    free(back);
    // a file that starts with our magic but whose header fails its checksum is not known to be ours
    unsigned char fake[256] = "TRIKVPC";
    write_bytes(doc, fake, sizeof fake);
    cr_assert_eq(tri_session_save_prompt(s, doc, tok, 3, NULL), TRI_STATUS_INVALID_ARGUMENT);
    // a directory
    cr_assert_eq(tri_session_save_prompt(s, "/tmp", tok, 3, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "directory"), "%s", tri_last_error());
    // an empty file is written; then, holding a cache of ours, replaced by another prompt's
    write_bytes(doc, "", 0);
    cr_assert_eq(tri_prompt_cache_writable(doc), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_save_prompt(s, doc, tok, 3, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, tok, 2, false), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t five[5] = {1, 2, 3, 1, 2};
    cr_assert_eq(tri_session_save_prompt(s, doc, five, 5, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *held, n_held;
    cr_assert_eq(tri_prompt_cache_tokens(doc, &held, &n_held), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(n_held, 5);
    free(held);
    cr_assert_eq(tri_prompt_cache_writable(NULL), TRI_STATUS_INVALID_ARGUMENT);
    unlink(doc);
    tri_session_free(s);
    tri_model_free(m);
}

// ---- the format's pieces ----

// The checksum sees every byte: a flip anywhere in 1 .. 100 bytes changes it, and so does the seed.
Test(prompt_cache, checksum_sees_every_byte) {
    unsigned char buf[100];
    for (int i = 0; i < 100; i++) buf[i] = (unsigned char)(i * 37 + 1);
    for (size_t n = 1; n <= 100; n++) {
        uint64_t h = tri__pcache_sum(buf, n, 0);
        cr_assert_neq(h, tri__pcache_sum(buf, n, 1));
        for (size_t i = 0; i < n; i++) {
            buf[i] ^= 1;
            cr_assert_neq(tri__pcache_sum(buf, n, 0), h, "a flip of byte %zu of %zu", i, n);
            buf[i] ^= 1;
        }
    }
}

// The layout: blocks of about 4 MiB of rows, every part aligned to 4 KiB, the file's size what the
// blocks add up to.
Test(prompt_cache, layout) {
    tri__pcache_header h = {.n_layer = 30,
                            .n_head_kv = 3,
                            .head_dim = 64,
                            .kv_type = TRI_DTYPE_F16,
                            .n_vocab = 49152,
                            .n_ctx = 8192,
                            .n_tokens = 6080,
                            .flags = TRI_PCACHE_LOGITS};
    cr_assert_eq(tri__pcache_layout(&h), TRI_STATUS_OK);
    // SmolLM2-135M: 30 layers x 2 x 3 x 64 x 2 bytes = 23,040 bytes a token
    cr_assert_eq(tri__pcache_payload_bytes(&h, 1), 23040);
    cr_assert_eq(h.block_tokens, (4 << 20) / 23040);
    cr_assert_eq(h.n_blocks, (6080 + h.block_tokens - 1) / h.block_tokens);
    cr_assert_eq(h.block_bytes % 4096, 0);
    cr_assert_eq(h.region_bytes % 4096, 0);
    cr_assert(h.region_bytes >= 128 + 4 * 6080 + 4 * 49152 + 8 * (uint64_t)h.n_blocks);
    cr_assert(h.region_bytes < 128 + 4 * 6080 + 4 * 49152 + 8 * (uint64_t)h.n_blocks + 4096);
    int32_t last = 6080 - (h.n_blocks - 1) * h.block_tokens;
    uint64_t last_bytes = ((uint64_t)last * 23040 + 4095) / 4096 * 4096;
    cr_assert_eq(h.file_bytes, h.region_bytes + (uint64_t)(h.n_blocks - 1) * h.block_bytes + last_bytes);
    h.kv_type = TRI_DTYPE_Q8_0;
    cr_assert_eq(tri__pcache_layout(&h), TRI_STATUS_INVALID_ARGUMENT);
}

// ---- offload-run generate --prompt-cache ----

// Runs offload-run with args; stdout and stderr into out and err. Returns the exit status.
static int cli(const char *args, char *out, size_t out_size, char *err, size_t err_size) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin, "TRI_OFFLOAD_RUN is not set: run through meson test");
    char o[4096], e[4096], cmd[32768], name[64];
    snprintf(name, sizeof name, "pcache-cli-%d.out", (int)getpid());
    snprintf(o, sizeof o, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "pcache-cli-%d.err", (int)getpid());
    snprintf(e, sizeof e, "%s", tt_tmp(name));
    int n = snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s' </dev/null", bin, args, o, e);
    cr_assert(n > 0 && (size_t)n < sizeof cmd);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc), "%s", cmd);
    char *so = tt_read_file(o, NULL), *se = tt_read_file(e, NULL);
    snprintf(out, out_size, "%s", so);
    snprintf(err, err_size, "%s", se);
    free(so);
    free(se);
    return WEXITSTATUS(rc);
}

// The first run writes the file, the second reuses the whole prompt and prints the same tokens, a
// longer prompt reuses the common prefix; a corrupt file is reported, ignored and written again;
// --spec is refused.
Test(prompt_cache, cli_generate, .timeout = TT_TIMEOUT(120)) {
    static char out[1 << 14], err[1 << 14], first[1 << 14], args[16384];
    int n;
    char model[4096], path[4096];
    snprintf(model, sizeof model, "%s", tt_gen_model("pcache-cli", MODEL_A));
    snprintf(path, sizeof path, "%s", cache_path("cli"));
    unlink(path);
    const char *prompt =
        "A prompt cache keeps the keys and values of a long document on disk, so that the "
        "next question about it does not pay for the prefill again.";
    n = snprintf(args, sizeof args, "generate -m '%s' -p '%s' -n 8 --ids --ignore-eos --prompt-cache '%s'", model,
                 prompt, path);
    cr_assert(n > 0 && (size_t)n < sizeof args);
    cr_assert_eq(cli(args, first, sizeof first, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "does not exist yet"), "%s", err);
    cr_assert(strstr(err, "prompt cache: saved"), "%s", err);
    cr_assert(strlen(first) > 8, "%s", first);

    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "prompt cache: reused") && strstr(err, "prompt: 0 tokens"), "%s", err);
    cr_assert_str_eq(out, first);

    // a flipped byte in the rows: reported, the whole prompt run, the file written again
    size_t len;
    unsigned char *file = tt_read_file(path, &len);
    file[len - 100] ^= 1;
    tt_write_file(path, file, len);
    free(file);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "fails its checksum") && strstr(err, "ignored"), "%s", err);
    cr_assert(strstr(err, "prompt cache: saved"), "%s", err);
    cr_assert_str_eq(out, first);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "prompt cache: reused"), "%s", err);

    // the same prompt and more: only what follows is prefilled
    n = snprintf(args, sizeof args,
                 "generate -m '%s' -p '%s And a question.' -n 8 --ids --ignore-eos --prompt-cache '%s'", model, prompt,
                 path);
    cr_assert(n > 0 && (size_t)n < sizeof args);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    const char *r = strstr(err, "prompt cache: reused ");
    cr_assert(r, "%s", err);
    int reused = atoi(r + strlen("prompt cache: reused "));
    cr_assert(reused > 20, "%s", err);

    // a document given as --prompt-cache (or --json) by mistake: refused before anything runs, unchanged
    char doc[4096];
    snprintf(doc, sizeof doc, "%s", cache_path("cli-doc"));
    static const char text[] = "chapter one\n";
    tt_write_file(doc, text, sizeof text - 1);
    for (int k = 0; k < 2; k++) {
        n = snprintf(args, sizeof args, "generate -m '%s' -p x -n 2 %s '%s'", model, k ? "--json" : "--prompt-cache",
                     doc);
        cr_assert(n > 0 && (size_t)n < sizeof args);
        cr_assert_neq(cli(args, out, sizeof out, err, sizeof err), 0);
        cr_assert(strstr(err, doc) && strstr(err, "not replaced"), "%s", err);
        size_t dl;
        char *d = tt_read_file(doc, &dl);
        cr_assert(dl == sizeof text - 1 && memcmp(d, text, dl) == 0, "%s is unchanged", doc);
        free(d);
    }
    // a --json file of ours is replaced
    tt_write_file(doc, "", 0);
    n = snprintf(args, sizeof args, "generate -m '%s' -p x -n 2 --json '%s'", model, doc);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    unlink(doc);

    n = snprintf(args, sizeof args, "generate -m '%s' -p x --spec draft --draft-ngram 2 --prompt-cache '%s'", model,
                 path);
    cr_assert(n > 0 && (size_t)n < sizeof args);
    cr_assert_neq(cli(args, out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(err, "--prompt-cache applies to plain decoding"), "%s", err);
    unlink(path);
}

// ---- misuse ----

// NULL handles, paths and token arrays are refused with INVALID_ARGUMENT and a message; stats may
// be NULL.
Test(prompt_cache, null_arguments) {
    tri_model *m = load_model("null", "--seed 5 --layers 1 --vocab 300");
    tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 64);
    int32_t tok[2] = {1, 2};
    tri_prompt_cache_stats cs;
    const char *path = cache_path("null");
    cr_assert_eq(tri_session_save_prompt(NULL, path, tok, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_load_prompt(NULL, path, tok, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_save_prompt(s, NULL, tok, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_load_prompt(s, NULL, tok, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_save_prompt(s, path, NULL, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_load_prompt(s, path, NULL, 2, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_load_prompt(s, path, tok, -1, &cs), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "tri_session_load_prompt"), "%s", tri_last_error());
    // an empty session has nothing to save
    cr_assert_eq(tri_session_save_prompt(s, path, tok, 0, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri_session_eval(s, tok, 2, false), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_save_prompt(s, path, tok, 2, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_load_prompt(s, path, tok, 2, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_n_past(s), 2);
    int32_t bad[2] = {1, 300};  // outside the vocabulary
    cr_assert_eq(tri_session_save_prompt(s, path, bad, 2, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "outside [0, 300)"), "%s", tri_last_error());
    unlink(path);
    tri_session_free(s);
    tri_model_free(m);
}

// ---- without io_uring, short reads, failed reads (fault.h) ----

// Without io_uring (its set-up failing) the file is written and read with pwrite / pread; reads
// that come back short are read on; a read that fails is IO, the session left empty.
Test(prompt_cache, faults, .timeout = TT_TIMEOUT(120)) {
    tri_model *m = load_model("f", MODEL_A);
    static int32_t prompt[N_PROMPT];
    make_prompt(prompt, N_PROMPT, 19);
    char path[4096];
    snprintf(path, sizeof path, "%s", cache_path("faults"));
    tri__fault_arm(TRI__FAULT_URING, 1, true, TRI__FAULT_READ_EIO);
    tt_tokens fresh = write_cache(m, path, prompt, N_PROMPT, TRI_DTYPE_F16, 0);
    tri_session *s = new_session(m, TRI_DTYPE_F16, 0, 4096);
    tri_prompt_cache_stats cs;
    cr_assert_eq(tri_session_load_prompt(s, path, prompt, N_PROMPT, &cs), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_not(cs.uring, "io_uring refused: pread");
    cr_assert(tri__fault_failures() >= 2, "the writer's and the reader's rings were refused");
    tt_tokens out = run(s, prompt, N_PROMPT, N_PROMPT, NULL, NULL);
    assert_same(&out, &fresh, "pwrite / pread");

    for (int uring = 0; uring < 2; uring++) {
        // every read short: read on to the end, with io_uring's completions and with pread
        tri__fault_arm(TRI__FAULT_READ | (uring ? 0 : TRI__FAULT_URING), 1, true, TRI__FAULT_READ_SHORT);
        cr_assert_eq(tri_session_load_prompt(s, path, prompt, N_PROMPT, &cs), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(tri__fault_failures() > 10, "%lld reads made short", (long long)tri__fault_failures());
        tri__fault_disarm();
        cr_assert_eq(cs.n_tokens, N_PROMPT);
        cr_assert_eq(cs.uring, (bool)uring);
        out = run(s, prompt, N_PROMPT, N_PROMPT, NULL, NULL);
        assert_same(&out, &fresh, uring ? "short io_uring reads" : "short preads");

        // the fourth read fails
        tri__fault_arm(TRI__FAULT_READ | (uring ? 0 : TRI__FAULT_URING), 4, false, TRI__FAULT_READ_EIO);
        tri_status st = tri_session_load_prompt(s, path, prompt, N_PROMPT, &cs);
        tri__fault_disarm();
        cr_assert_eq(st, TRI_STATUS_IO, "%s", tri_last_error());
        cr_assert(strstr(tri_last_error(), path) && strstr(tri_last_error(), "Input/output error"), "%s",
                  tri_last_error());
        cr_assert_eq(tri_session_n_past(s), 0);
    }
    tri_session_free(s);
    unlink(path);
    tri_model_free(m);
}
