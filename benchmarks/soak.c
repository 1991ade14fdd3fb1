// soak.c - a long run of mixed use of the public API, for leaks, growth and drift that short
// tests miss (docs/reliability.md). Not part of CI: scripts/soak.sh builds it under ASan and runs
// it for as long as asked.
//
// usage: soak TARGET.gguf DRAFT.gguf SECONDS [SEED]
//
// Keeps one handle of each configuration alive: sessions with each KV policy and speculative
// engines in each mode and drafter (a separate draft model, the target's own layers, n-grams,
// the retrieval cache, the whole TriForce hierarchy), and recreates one of them every 16 rounds.
// Each round picks a handle and does one of: generate after a fresh prompt, continue, roll back
// to a random point and generate again, reset. Temperatures vary; at temperature 0 a speculative
// engine's tokens must equal plain greedy decoding of the same context (the output is lossless),
// checked against a full-cache session. Resident memory is sampled every round: once the caches
// and the allocator's pools are warm, it must not keep growing.
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "triforce.h"

enum { N_CTX = 384, MAX_SEQ = N_CTX, N_HANDLES = 9 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {  // xorshift64*, uniform enough for choosing actions
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 33) % n;
}

typedef struct handle {
    const char *name;
    bool spec;
    tri_kv_policy policy;    // sessions
    tri_spec_params sp;      // engines
    tri_session *s;
    tri_spec *e;
    int32_t seq[MAX_SEQ];    // the context: prompts and emitted tokens (engines)
    int32_t n_seq;
} handle;

typedef struct collect {
    int32_t *tok;
    int32_t n, cap;
} collect;

static bool on_token(int32_t t, void *user) {
    collect *c = user;
    if (c->n < c->cap) c->tok[c->n++] = t;
    return true;
}

static tri_model *target, *draft;
static const int32_t draft_layers[] = {0};

static tri_session_params session_params(tri_kv_policy policy) {
    tri_session_params p = tri_session_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 1;
    p.n_batch = 32;
    p.kv_policy = policy;
    p.kv_budget = 64;
    p.kv_chunk = 8;
    p.kv_sink = 8;
    p.kv_refresh = 16;
    return p;
}

static void die(const char *what, tri_status st) {
    fprintf(stderr, "soak: %s: %s (%s)\n", what, tri_status_str(st), tri_last_error());
    exit(1);
}

static void open_handle(handle *h) {
    tri_status st;
    tri_session_params p = session_params(h->spec ? TRI_KV_POLICY_FULL : h->policy);
    if (h->spec) st = tri_spec_create(target, &p, &h->sp, &h->e);
    else st = tri_session_create(target, &p, &h->s);
    if (st) die(h->name, st);
    h->n_seq = 0;
}

static void close_handle(handle *h) {
    tri_session_free(h->s);
    tri_spec_free(h->e);
    h->s = NULL;
    h->e = NULL;
}

// Plain greedy decoding of n tokens after ctx[0, n_ctx) with a full-cache session.
static void reference(tri_session *plain, const int32_t *ctx, int32_t n_ctx, int32_t n, int32_t *out) {
    tri_session_reset(plain);
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n;
    gp.stop_at_eos = false;
    collect c = {out, 0, n};
    tri_status st = tri_generate(plain, ctx, n_ctx, &gp, on_token, &c, NULL);
    if (st) die("reference decoding", st);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: soak TARGET.gguf DRAFT.gguf SECONDS [SEED]\n");
        return 2;
    }
    double seconds = atof(argv[3]);
    if (argc > 4) rng = strtoull(argv[4], NULL, 10) * 2654435761ull + 1;
    tri_status st;
    if ((st = tri_model_load(argv[1], NULL, &target))) die(argv[1], st);
    if ((st = tri_model_load(argv[2], NULL, &draft))) die(argv[2], st);
    const int32_t V = tri_token_count(target) > 0 ? tri_token_count(target) : 256;

    handle h[N_HANDLES];
    memset(h, 0, sizeof h);
    static const struct { const char *name; tri_kv_policy p; } pol[] = {
        {"session full", TRI_KV_POLICY_FULL},
        {"session streaming", TRI_KV_POLICY_STREAMING},
        {"session h2o", TRI_KV_POLICY_H2O},
        {"session retrieval", TRI_KV_POLICY_RETRIEVAL},
    };
    for (int i = 0; i < 4; i++) h[i] = (handle){.name = pol[i].name, .policy = pol[i].p};
    static const struct { const char *name; tri_spec_mode m; tri_spec_drafter d; } modes[] = {
        {"spec draft model", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_MODEL},
        {"spec draft layers", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_LAYERS},
        {"spec draft ngram", TRI_SPEC_MODE_DRAFT, TRI_SPEC_DRAFTER_NGRAM},
        {"spec retrieval", TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_DRAFTER_MODEL},
        {"spec triforce", TRI_SPEC_MODE_TRIFORCE, TRI_SPEC_DRAFTER_MODEL},
    };
    for (int i = 0; i < 5; i++) {
        handle *x = &h[4 + i];
        x->name = modes[i].name;
        x->spec = true;
        x->sp = tri_spec_default_params();
        x->sp.mode = modes[i].m;
        x->sp.drafter = modes[i].d;
        x->sp.draft_model = draft;
        x->sp.draft_layers = draft_layers;
        x->sp.n_draft_layers = 1;
        x->sp.budget = 64;
        x->sp.chunk = 8;
        x->sp.gamma2 = 4;
        x->sp.draft_window = 48;
        x->sp.draft_sink = 8;
        x->sp.refresh = 24;
    }
    for (int i = 0; i < N_HANDLES; i++) open_handle(&h[i]);
    tri_session *plain;
    tri_session_params pp = session_params(TRI_KV_POLICY_FULL);
    if ((st = tri_session_create(target, &pp, &plain))) die("plain session", st);

    const double t0 = now(), warm = seconds / 10 < 60 ? seconds / 10 : 60;
    uint64_t rss_warm = 0, rss_max = 0, rss = 0;
    int64_t rounds = 0, tokens = 0, checks = 0, rollbacks = 0, refused = 0, recreated = 0;
    double next_report = 60;
    int32_t got[64], want[64];
    for (;;) {
        double t = now() - t0;
        if (t >= seconds) break;
        handle *x = &h[rnd(N_HANDLES)];
        if (rounds % 16 == 15) {
            close_handle(x);
            open_handle(x);
            recreated++;
        }
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = 1 + (int32_t)rnd(24);
        gp.stop_at_eos = false;
        bool greedy = rnd(2) == 0;
        gp.sampler.temperature = greedy ? 0.0f : 0.5f + 0.1f * (float)rnd(8);
        gp.sampler.top_k = (int32_t)rnd(3) * 20;
        gp.sampler.seed = rnd(1000);
        int32_t n_past = x->spec ? tri_spec_n_past(x->e) : tri_session_n_past(x->s);
        int action = (int)rnd(4);
        if (action == 2 && n_past > 1) {  // roll back, then generate with a short prompt
            int32_t keep = 1 + (int32_t)rnd((uint32_t)n_past - 1);
            st = x->spec ? tri_spec_truncate(x->e, keep) : tri_session_truncate(x->s, keep);
            if (st == TRI_STATUS_INVALID_ARGUMENT && !x->spec &&
                (x->policy == TRI_KV_POLICY_H2O || x->policy == TRI_KV_POLICY_STREAMING)) {
                // H2O rolls back only over its last steps, StreamingLLM's bounded store over the rows
                // its ring keeps past the window (docs/kv-policies.md): start over
                tri_session_reset(x->s);
                keep = 0;
                refused++;
            } else if (st) {
                die("truncate", st);
            } else {
                rollbacks++;
            }
            if (x->spec) x->n_seq = keep;
            n_past = keep;
        } else if (action == 3) {
            if (x->spec) tri_spec_reset(x->e);
            else tri_session_reset(x->s);
            x->n_seq = 0;
            n_past = 0;
        }
        // a prompt when the context is empty or after a rollback, sometimes otherwise
        int32_t prompt[128], n_prompt = 0;
        if (n_past == 0 || action == 2 || rnd(3) == 0) n_prompt = 1 + (int32_t)rnd(n_past == 0 ? 128 : 16);
        if (n_past + n_prompt + gp.n_predict + 2 > N_CTX) {  // full: start over
            if (x->spec) tri_spec_reset(x->e);
            else tri_session_reset(x->s);
            x->n_seq = 0;
            n_past = 0;
            if (n_prompt == 0) n_prompt = 1 + (int32_t)rnd(128);
        }
        for (int32_t i = 0; i < n_prompt; i++) prompt[i] = 3 + (int32_t)rnd((uint32_t)(V - 3));
        collect c = {got, 0, 64};
        if (x->spec) {
            st = tri_generate_spec(x->e, prompt, n_prompt, &gp, on_token, &c, NULL);
            if (st) die(x->name, st);
            // the context the engine holds now: what it had, the prompt, what it emitted
            memcpy(x->seq + x->n_seq, prompt, (size_t)n_prompt * sizeof *prompt);
            int32_t before = x->n_seq + n_prompt;
            if (greedy) {
                reference(plain, x->seq, before, c.n, want);
                for (int32_t i = 0; i < c.n; i++)
                    if (got[i] != want[i]) {
                        fprintf(stderr, "soak: %s: round %" PRId64 ": token %d is %d, plain greedy decoding gives %d\n",
                                x->name, rounds, i, got[i], want[i]);
                        return 1;
                    }
                checks++;
            }
            memcpy(x->seq + before, got, (size_t)c.n * sizeof *got);
            x->n_seq = tri_spec_n_past(x->e);
            if (x->n_seq != before + c.n) {
                fprintf(stderr, "soak: %s: n_past %d after %d + %d tokens\n", x->name, x->n_seq, before, c.n);
                return 1;
            }
        } else {
            if (n_prompt == 0 && n_past == 0) continue;
            st = tri_generate(x->s, prompt, n_prompt, &gp, on_token, &c, NULL);
            if (st) die(x->name, st);
        }
        tokens += c.n;
        rounds++;
        rss = rss_bytes();
        if (t >= warm && !rss_warm) rss_warm = rss;
        if (rss > rss_max) rss_max = rss;
        if (t >= next_report) {
            printf("soak %6.0f s: %" PRId64 " rounds, %" PRId64 " tokens, %" PRId64 " greedy checks, %" PRId64
                   " rollbacks, %" PRId64 " handles recreated, RSS %.1f MiB (max %.1f)\n",
                   t, rounds, tokens, checks, rollbacks, recreated, rss / 1048576.0, rss_max / 1048576.0);
            fflush(stdout);
            next_report += 60;
        }
    }
    for (int i = 0; i < N_HANDLES; i++) close_handle(&h[i]);
    tri_session_free(plain);
    tri_model_free(draft);
    tri_model_free(target);
    double growth = rss_warm ? ((double)rss - (double)rss_warm) / 1048576.0 : 0;
    printf("soak done: %.0f s, %" PRId64 " rounds, %" PRId64 " tokens, %" PRId64 " greedy checks equal to plain "
           "decoding, %" PRId64 " rollbacks (+%" PRId64 " refused by H2O or StreamingLLM), %" PRId64 " handles recreated; RSS after warm-up %.1f MiB, at the "
           "end %.1f MiB (%+.1f), max %.1f MiB\n",
           now() - t0, rounds, tokens, checks, rollbacks, refused, recreated, rss_warm / 1048576.0, rss / 1048576.0, growth,
           rss_max / 1048576.0);
    return 0;
}
