// server.c - `offload-run serve`: an OpenAI-compatible HTTP server on libmicrohttpd.
//
// Threads: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), which
// parses the request, checks it and tokenizes it (server-json.c), then hands it to the slots as a
// job and waits: for the whole answer (a JSON response), or for each piece of it (server-sent
// events, written by a blocking content reader). Each slot has its own session (or speculative
// engine) on the one model; it keeps the tokens of its last conversation, so a request that
// continues it prefills only what is new. A job goes to the idle slot whose cached tokens share
// the longest prefix with its prompt when that prefix is at least --slot-similarity of the
// prompt, else to the least recently used idle slot; with every slot busy it waits in a queue of --queue jobs,
// and past that the request is answered 503. A client that goes away (the connection's socket
// reports the peer's hang-up, polled while it waits) cancels its job.
//
// Plain decoding: one scheduler thread runs every slot in batched passes (continuous batching):
// each pass runs the last sampled token of every decoding slot and a piece of the prompt of every
// slot that is prefilling, all in one tri_session_eval_batch call, then samples each slot's next
// token with its own parameters and streams it. A finished answer leaves and a waiting request
// joins between passes; a long prompt prefills piece by piece beside the others' decoding, so no
// request waits for another's whole prefill. Speculative decoding: one scheduler thread runs the
// slots' engines together (tri_spec_batch: each level's passes of the slots at that level
// batched). docs/server.md describes the endpoints.
#include <errno.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "chat-page.h"
#include "cli.h"
#include "server.h"

#if TRI_HAVE_MICROHTTPD
#include <microhttpd.h>

static const char me[] = "offload-run serve";  // the command, in error messages

static void usage(FILE *f) {
    fputs(
        "usage: offload-run serve -m MODEL [--host ADDR] [--port N] [options]\n"
        "\n"
        "Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions and\n"
        "/v1/completions (streamed as server-sent events with \"stream\": true), GET /v1/models and\n"
        "/health (docs/server.md). Each of --slots slots keeps its conversation's cache, so a next\n"
        "turn prefills only its new tokens. One line per request goes to stderr. Ctrl-C (SIGINT)\n"
        "or SIGTERM stops the server.\n"
        "\n"
        "  -m, --model PATH     .gguf file or HF checkpoint directory\n"
        "      --host ADDR      address to listen on (default 127.0.0.1: this machine only)\n"
        "      --port N         TCP port (default 8080; 0: any free port, printed at start)\n"
        "      --api-key KEY    require \"Authorization: Bearer KEY\" (default: $TRI_SERVER_API_KEY;\n"
        "                       none: no key)\n"
        "      --alias NAME     the model's name in requests and /v1/models (default: the file\n"
        "                       name without .gguf)\n"
        "      --slots N        requests generated at once, each with its own cache; they decode\n"
        "                       together in batched passes (--spec too). Default: on the CPU, as\n"
        "                       many as a context's KV cache fits in a quarter of the available\n"
        "                       memory, 1 to 4; 1 on a GPU or with --spec\n"
        "      --queue N        requests that wait for a slot; more are answered 503 (default 8)\n"
        "      --slot-similarity F  reuse the idle slot whose cache shares the longest prefix with\n"
        "                       a prompt only when that prefix is at least F of the prompt's\n"
        "                       tokens; else take the least recently used idle slot (default 0.5;\n"
        "                       0: always the longest prefix)\n"
        "      --ctx N          context of each slot in tokens (default 4096)\n"
        "      --cors ORIGINS   web pages of these origins (comma-separated, e.g.\n"
        "                       http://localhost:3000; '*': any) may call the server (CORS);\n"
        "                       default none: only the chat page at / (same origin)\n"
        "      --keep-alive S   a stream silent for S seconds (a long prefill, the queue) gets an\n"
        "                       SSE comment, which clients ignore and proxies see (default 15; 0: off)\n"
        "  -n, --n-predict N    tokens per answer when a request sets no max_tokens (default 0:\n"
        "                       until the model ends or the context is full)\n"
        "      --temp T         default temperature (default 0.8; 0 is greedy)\n"
        "      --top-k K        default top-k (default 40; 0: all)\n"
        "      --top-p P        default top-p (default 0.95; 1: all)\n"
        "      --min-p P        default min-p (default 0.05; 0: off)\n"
        "      --repeat-penalty R  default repetition penalty over the last 64 tokens (default 1.1;\n"
        "                       1: off); requests may also set presence_penalty and frequency_penalty\n"
        "      --seed S         default seed (default: a random one per request)\n"
        "      --chat-format F  chatml, llama2, llama3, mistral, phi3 or gemma instead of the\n"
        "                       model's template\n"
        "  -t, --threads N      CPU threads of each slot (default: one per core)\n"
        "      --batch N        prompt tokens per pass, shared by the prompts being prefilled\n"
        "                       (default 128; smaller: a lower time to first token beside a long\n"
        "                       prompt)\n"
        "      --prompt-cache FILE  a prompt's KV on disk, shared by the slots and kept across\n"
        "                       restarts: a slot loads the prefix a prompt shares with the file\n"
        "                       when that is longer than what the slot holds; the file is\n"
        "                       written once after a prefill when it is missing or stale (plain\n"
        "                       decoding, --kv full or retrieval)\n"
        "  -h, --help           this help\n"
        "\n"
        "The engine's options below are offload-run generate's, fixed at start for every slot:\n"
        "each slot has its own session or speculative engine (a draft model is loaded once and\n"
        "shared) and, on a GPU, its own copy of the weights; the planner places one slot in 1/N\n"
        "of --gpu-mem and --host-mem. Every response carries the speculative figures in a\n"
        "\"triforce\" object.\n"
        "\n",
        f);
    tri_cli_engine_usage(f);
}

// ---- jobs and slots ----

typedef struct srv srv;

typedef struct job {
    srv_request rq;
    srv_error err;               // status 0 until an error ends the job
    tri_sampler_params sampler;
    bool explicit_seed;
    char id[48];
    int64_t created;
    double t_submit;             // tri_cli_now()
    // the state, under srv.mu
    int refs;                    // the connection and, while it holds it, the slot
    bool queued, done;
    atomic_bool cancel;          // the client went away, or the server stops
    bool shutdown;               // the server stops (under srv.mu): the answer ends, not the client
    atomic_int prefilled;        // prompt tokens run so far (keep-alive comments say it)
    pthread_cond_t cond;         // signalled on new output and when done
    struct job *next;            // in the queue
    // output: the streamed events not yet written, or the whole body
    char *out;
    size_t n_out, cap_out, sent;
    bool oom;
    char *text;                  // the answer's text (non-streamed)
    size_t n_text, cap_text;
    bool first_chunk_sent;
    srv_result res;
} job;

typedef struct slot {
    srv *s;
    int idx;
    pthread_t thread;
    tri_session *session;        // plain decoding, or
    tri_spec *spec;              // speculative decoding
    int32_t *tokens;             // what the cache holds, in order (the last may be pending)
    int32_t n_tokens, cap_tokens;
    uint64_t last_seed;          // the seed of the last generation, and whether there was one
    bool seeded;
    uint64_t last_used;          // a counter, for ties between slots
    job *job;                    // the job it runs, NULL when idle
    // plain decoding: the job in the scheduler's hands and where it is (the scheduler's thread only)
    job *run;                    // taken from job between passes; NULL: none
    int phase;                   // RUN_PREFILL, RUN_DECODE, RUN_SAMPLE
    int32_t next;                // the prompt's next token to run (an index into rq.ids)
    int32_t step;                // the prompt tokens this pass runs
    int32_t pending;             // the token sampled last, which the next pass runs
    int32_t n_gen, n_max, eos;   // tokens generated, at most; the end-of-sequence token or -1
    bool whole;                  // run the rest of the prompt in one piece (a length-dependent rope)
    double t0, t1;               // when the job started, and when its prefill ended
    struct gen_ctx *g;           // the callbacks' context
    srv_text text;
    // speculative decoding: the job's generation in the scheduler's batch (the job is `run`)
    int32_t spec_id;             // its index in the batch (tri_spec_batch_result)
    tri_generate_params spec_gp; // its parameters, alive while it generates
    tri_spec_stats spec_stats;   // its figures, when done
} slot;

enum { RUN_PREFILL = 1, RUN_DECODE = 2, RUN_SAMPLE = 3 };

struct srv {
    srv_model_ref ref;
    tri_model *model, *draft;
    tri_session_params sp;
    tri_spec_params spec_params;
    int32_t *draft_layers;
    srv_sampling defaults;
    int64_t n_predict;
    int32_t stop_ids[16], n_stop_ids;  // the end-of-turn tokens of chat answers
    const char *api_key;
    int64_t started;
    // the scheduler
    pthread_mutex_t mu;
    pthread_cond_t work;         // a slot got a job, or the server stops
    slot *slots;
    int n_slots;
    job *queue_head, *queue_tail;
    int n_queued, max_queue;
    bool stopping;
    atomic_bool ready;    // the model is loaded and the slots made: requests are served
    int n_active;         // completion requests whose response is not finished (shutdown waits)
    pthread_cond_t idle;  // n_active went to 0
    double keep_alive;    // --keep-alive: seconds of silence in a stream before an SSE comment
    // /metrics: answered requests' figures (under mu), and the scheduler's passes
    uint64_t m_requests, m_prompt_tokens, m_predicted;
    double m_prompt_seconds, m_predicted_seconds;
    atomic_ullong m_passes, m_pass_seqs;
    uint64_t use_counter, id_counter;
    double similarity;           // --slot-similarity: the share of a prompt a slot's cache must hold to be reused
    int32_t chunk;               // plain decoding: prompt tokens a slot runs per pass at most
    bool rope_by_length;         // the rope depends on the first evaluation's length
    // --prompt-cache: the file, the tokens it holds (when it fits the model), under pc_mu
    const char *pc_path;
    pthread_mutex_t pc_mu;
    int32_t *pc_tokens;
    int32_t pc_n;     // 0: missing or stale, to be written after the next prefill
    bool pc_writing;  // a slot is writing it
};

static double now_s(void) { return tri_cli_now(); }

static void job_unref_locked(job *j) {
    if (--j->refs > 0) return;
    pthread_cond_destroy(&j->cond);
    srv_request_free(&j->rq);
    free(j->out);
    free(j->text);
    free(j);
}

// Appends n bytes to the job's output (under srv.mu).
static void job_out_locked(job *j, const char *s, size_t n) {
    if (j->oom || !s) {
        j->oom = true;
        return;
    }
    if (j->n_out + n > j->cap_out) {
        size_t cap = 2 * (j->n_out + n) + 256;
        char *o = realloc(j->out, cap);
        if (!o) {
            j->oom = true;
            return;
        }
        j->out = o;
        j->cap_out = cap;
    }
    memcpy(j->out + j->n_out, s, n);
    j->n_out += n;
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

// Gives queued jobs to idle slots: to the idle slot whose cache shares the longest prefix with
// the prompt when that prefix is a real part of it (at least --slot-similarity of its tokens, as
// llama-server's slot prompt similarity), else to the least recently used idle slot, so that the
// few template tokens every prompt shares never pull a new conversation onto another's cache.
// Under srv.mu.
static void assign_locked(srv *s) {
    while (s->queue_head) {
        job *j = s->queue_head;
        slot *best = NULL, *lru = NULL;
        int32_t best_len = -1;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->job) continue;
            int32_t len = common_prefix(sl->tokens, sl->n_tokens, j->rq.ids, j->rq.n_ids);
            if (len > best_len || (len == best_len && sl->last_used < best->last_used)) {
                best = sl;
                best_len = len;
            }
            if (!lru || sl->last_used < lru->last_used) lru = sl;
        }
        if (!best) return;
        if (best_len == 0 || (double)best_len < s->similarity * (double)j->rq.n_ids) best = lru;
        s->queue_head = j->next;
        if (!s->queue_head) s->queue_tail = NULL;
        s->n_queued--;
        j->queued = false;
        j->next = NULL;
        j->refs++;
        best->job = j;
        best->last_used = ++s->use_counter;
        pthread_cond_broadcast(&s->work);
    }
}

// Removes a queued job from the queue (under srv.mu).
static void unqueue_locked(srv *s, job *j) {
    job **p = &s->queue_head, *prev = NULL;
    while (*p && *p != j) prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = j->next;
    if (s->queue_tail == j) s->queue_tail = prev;
    s->n_queued--;
    j->queued = false;
}

// ---- generating, in a slot's thread ----

typedef struct gen_ctx {
    srv *s;
    slot *sl;
    job *j;
    bool pc_save;  // write --prompt-cache's file when the prefill ends
} gen_ctx;

static bool on_token(int32_t token, void *user) {
    gen_ctx *g = user;
    slot *sl = g->sl;
    if (sl->n_tokens == sl->cap_tokens) {
        int32_t cap = 2 * sl->cap_tokens + 256;
        int32_t *t = realloc(sl->tokens, (size_t)cap * sizeof *t);
        if (!t) return false;  // the slot's token list is then reset after the call
        sl->tokens = t;
        sl->cap_tokens = cap;
    }
    sl->tokens[sl->n_tokens++] = token;
    return !atomic_load(&g->j->cancel);
}

static bool on_text(const char *text, size_t len, void *user) {
    gen_ctx *g = user;
    job *j = g->j;
    if (j->rq.stream) {
        size_t n = 0;
        char *ev = srv_chunk_sse(j->rq.chat, &j->res, text, len, !j->first_chunk_sent, false, &n);
        pthread_mutex_lock(&g->s->mu);
        job_out_locked(j, ev, n);
        pthread_cond_broadcast(&j->cond);
        pthread_mutex_unlock(&g->s->mu);
        free(ev);
        j->first_chunk_sent = true;
    } else {
        if (j->n_text + len + 1 > j->cap_text) {
            size_t cap = 2 * (j->n_text + len + 1);
            char *t = realloc(j->text, cap);
            if (!t) {
                j->oom = true;
                return false;
            }
            j->text = t;
            j->cap_text = cap;
        }
        memcpy(j->text + j->n_text, text, len);
        j->n_text += len;
    }
    return !atomic_load(&j->cancel);
}

// --prompt-cache: the slot's session holds the whole prompt now; written when the file is missing
// or stale and no other slot writes it (once: afterwards it holds tokens).
static void prompt_cache_save(srv *s, slot *sl, const srv_request *rq) {
    pthread_mutex_lock(&s->pc_mu);
    bool go = s->pc_n == 0 && !s->pc_writing;
    s->pc_writing = s->pc_writing || go;
    pthread_mutex_unlock(&s->pc_mu);
    if (!go) return;
    tri_prompt_cache_stats cs;
    tri_status st = tri_session_save_prompt(sl->session, s->pc_path, rq->ids, rq->n_ids, &cs);
    int32_t *t = st ? NULL : malloc((size_t)rq->n_ids * sizeof *t);
    if (t) memcpy(t, rq->ids, (size_t)rq->n_ids * sizeof *t);
    if (st)
        fprintf(stderr, "prompt cache: %s (%s); not saved\n", tri_last_error(), tri_status_str(st));
    else
        fprintf(stderr, "prompt cache: slot %d saved %d tokens to %s: %.1f MB in %.3f s (%.2f GB/s)\n", sl->idx,
                cs.n_tokens, s->pc_path, (double)cs.bytes / 1e6, cs.seconds, cs.gbps);
    pthread_mutex_lock(&s->pc_mu);
    s->pc_writing = false;
    if (t) {
        free(s->pc_tokens);
        s->pc_tokens = t;
        s->pc_n = rq->n_ids;
    }
    pthread_mutex_unlock(&s->pc_mu);
}

// --prompt-cache: loads the prefix the file shares with rq into the slot when it is longer than
// keep, the prefix the slot holds. The tokens the session holds afterwards.
static int32_t prompt_cache_load(srv *s, slot *sl, const srv_request *rq, int32_t keep) {
    pthread_mutex_lock(&s->pc_mu);
    int32_t shared = common_prefix(s->pc_tokens, s->pc_n, rq->ids, rq->n_ids);
    pthread_mutex_unlock(&s->pc_mu);
    if (shared <= keep || keep >= rq->n_ids - 1) return keep;
    tri_prompt_cache_stats cs;
    tri_status st = tri_session_load_prompt(sl->session, s->pc_path, rq->ids, rq->n_ids, &cs);
    if (!st) {  // the slot's own rows are gone: what the file gave is more
        fprintf(stderr, "prompt cache: slot %d reused %d of the prompt's %d tokens from %s (%.3f s)%s\n", sl->idx,
                cs.n_tokens, rq->n_ids, s->pc_path, cs.seconds,
                cs.damaged ? "; a later block fails its checksum: the file is written again after this prefill" : "");
        if (cs.damaged) {
            pthread_mutex_lock(&s->pc_mu);
            s->pc_n = 0;
            pthread_mutex_unlock(&s->pc_mu);
        }
        return cs.n_tokens;
    }
    fprintf(stderr, "prompt cache: slot %d: %s (%s); the whole prompt is run\n", sl->idx, tri_last_error(),
            tri_status_str(st));
    if (st == TRI_STATUS_NOT_FOUND || st == TRI_STATUS_BAD_FORMAT || st == TRI_STATUS_IO) {
        pthread_mutex_lock(&s->pc_mu);  // gone or damaged since: written again after this prefill
        s->pc_n = 0;
        pthread_mutex_unlock(&s->pc_mu);
    }
    return 0;  // the load emptied the session
}

static bool on_prefill(int64_t done, int64_t total, void *user) {
    gen_ctx *g = user;
    if (g->pc_save && done == total) prompt_cache_save(g->s, g->sl, &g->j->rq);
    return !atomic_load(&g->j->cancel);
}

static const char *const mode_names[] = {"none", "draft", "retrieval", "triforce"};

// --prompt-cache at start: refused where the prompt cache is (speculative modes; policies and
// device groups tri_session_load_prompt refuses), else the file's tokens when it fits the model.
static bool prompt_cache_start(srv *s, bool plain) {
    if (!plain) {
        fprintf(stderr, "offload-run serve: --prompt-cache applies to plain decoding (no --spec): the speculative "
                        "engines have no prompt cache\n");
        return false;
    }
    // an empty prompt reuses nothing, but the file is opened and checked against the model
    tri_status st = tri_session_load_prompt(s->slots[0].session, s->pc_path, NULL, 0, NULL);
    if (st == TRI_STATUS_UNSUPPORTED) {
        fprintf(stderr, "offload-run serve: --prompt-cache: %s\n", tri_last_error());
        return false;
    }
    if (st == TRI_STATUS_NOT_FOUND) {
        fprintf(stderr, "prompt cache: %s does not exist yet; it is written after the first prefill\n", s->pc_path);
    } else if (st) {
        fprintf(stderr, "prompt cache: %s (%s); it is written again after the first prefill\n", tri_last_error(),
                tri_status_str(st));
    } else if ((st = tri_prompt_cache_tokens(s->pc_path, &s->pc_tokens, &s->pc_n))) {
        fprintf(stderr, "prompt cache: %s (%s); it is written again after the first prefill\n", tri_last_error(),
                tri_status_str(st));
        s->pc_n = 0;
    } else {
        fprintf(stderr, "prompt cache: %s holds %d tokens; each slot loads the prefix a prompt shares with them\n",
                s->pc_path, s->pc_n);
    }
    return true;
}

// The start of job j on slot sl: the result's first figures, the prefix the slot's cache shares
// with the prompt kept (or a longer one loaded from --prompt-cache) and the rest dropped, the
// slot's token list set to the prompt. The tokens to skip; -1 with j->err set on failure.
static int32_t slot_prepare(srv *s, slot *sl, job *j) {
    srv_request *rq = &j->rq;
    srv_result *r = &j->res;
    r->slot = sl->idx;
    r->mode = mode_names[s->spec_params.mode];
    r->queue_seconds = now_s() - j->t_submit;
    r->prompt_tokens = rq->n_ids;
    // the prefix the cache already holds; a prompt prefills at least one token
    int32_t n_past = sl->spec ? tri_spec_n_past(sl->spec) : tri_session_n_past(sl->session);
    int32_t keep = common_prefix(sl->tokens, sl->n_tokens < n_past ? sl->n_tokens : n_past, rq->ids, rq->n_ids);
    if (keep == rq->n_ids) keep--;
    // a seed given again must give the same tokens: a session reseeds at once; an engine reseeds
    // only when the seed changes or it is reset, so the same seed as its last call means a reset
    if (sl->session && j->explicit_seed) tri_session_seed(sl->session, j->sampler.seed);
    if (sl->spec && j->explicit_seed && sl->seeded && sl->last_seed == j->sampler.seed) {
        tri_spec_reset(sl->spec);
        keep = 0;
    }
    tri_status st = sl->spec ? tri_spec_truncate(sl->spec, keep) : tri_session_truncate(sl->session, keep);
    if (st) {
        // a cache that cannot roll back that far (a policy that keeps only its budget's rows):
        // start afresh
        if (sl->spec) tri_spec_reset(sl->spec);
        else tri_session_reset(sl->session);
        keep = 0;
    }
    if (s->pc_path && sl->session) keep = prompt_cache_load(s, sl, rq, keep);
    r->cached_tokens = keep;
    // the token list: the prompt now (its first keep tokens are in the cache), the generated tokens
    // after it
    if (sl->cap_tokens < rq->n_ids) {
        int32_t *t = realloc(sl->tokens, (size_t)rq->n_ids * sizeof *t);
        if (!t) {
            sl->n_tokens = 0;
            srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        sl->tokens = t;
        sl->cap_tokens = rq->n_ids;
    }
    memcpy(sl->tokens, rq->ids, (size_t)rq->n_ids * sizeof *rq->ids);  // a load replaced the slot's prefix too
    sl->n_tokens = rq->n_ids;
    return keep;
}

// Tokens a request may generate on slot sl: its max_tokens (or -n), within the context.
static int32_t slot_n_max(const srv *s, const srv_request *rq) {
    int32_t room = s->ref.n_ctx - rq->n_ids;
    int64_t want = rq->max_tokens ? rq->max_tokens : s->n_predict;
    return want > 0 && want < room ? (int32_t)want : room;
}

// After a generation: the result's counts, and the slot's token list forgotten (its cache
// emptied) unless it is exactly what the cache holds, a pending last token aside.
static void slot_settle(slot *sl, job *j, tri_status st, int32_t n_gen, bool length) {
    srv_result *r = &j->res;
    sl->seeded = true;
    sl->last_seed = j->sampler.seed;
    r->completion_tokens = n_gen;
    r->finish_reason = length ? "length" : "stop";
    int32_t held = sl->spec ? tri_spec_n_past(sl->spec) : tri_session_n_past(sl->session);
    if (st || sl->n_tokens < held || sl->n_tokens != j->rq.n_ids + n_gen) {
        sl->n_tokens = 0;
        if (sl->spec) tri_spec_reset(sl->spec);
        else tri_session_reset(sl->session);
    }
    if (st) srv_fail(&j->err, 500, "server_error", NULL, NULL, "generation failed: %s", tri_last_error());
    else if (j->oom) srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory");
}

// The start of job j on slot sl for a generation call (speculative decoding): the cached prefix
// reused (slot_prepare), the callbacks' context g and the call's parameters gp. The tokens to
// skip; -1 with j->err set on failure.
static int32_t slot_gen_begin(srv *s, slot *sl, job *j, gen_ctx *g, tri_generate_params *out) {
    srv_request *rq = &j->rq;
    int32_t keep = slot_prepare(s, sl, j);
    if (keep < 0) return -1;
    *g = (gen_ctx){s, sl, j, false};
    if (s->pc_path && sl->session && keep < rq->n_ids) {
        pthread_mutex_lock(&s->pc_mu);
        g->pc_save = s->pc_n == 0;
        pthread_mutex_unlock(&s->pc_mu);
    }
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = slot_n_max(s, rq);
    gp.sampler = j->sampler;
    gp.stop = (const char *const *)rq->stop;
    gp.n_stop = rq->n_stop;
    gp.stop_at_eos = !rq->ignore_eos;
    if (rq->chat && !rq->ignore_eos) {
        gp.stop_tokens = s->stop_ids;
        gp.n_stop_tokens = s->n_stop_ids;
    }
    gp.on_text = on_text;
    gp.text_user = g;
    gp.on_prefill = on_prefill;
    gp.user = g;
    *out = gp;
    return keep;
}

// The end of job j's speculative generation on slot sl (status st, figures ss): j's result.
static void slot_spec_end(slot *sl, job *j, tri_status st, const tri_spec_stats *ss) {
    srv_result *r = &j->res;
    r->prefill_seconds = ss->prefill_seconds;
    r->decode_seconds = ss->decode_seconds;
    r->spec = true;
    r->full_cache_passes = ss->n_l3_verify;
    r->l1_proposed = ss->l1_proposed;
    r->l1_accepted = ss->l1_accepted;
    r->l2_proposed = ss->l2_proposed;
    r->l2_accepted = ss->l2_accepted;
    r->batch_passes = ss->n_batch_passes;
    r->batch_sequences = ss->n_batch_sequences;
    tri_stop_reason why = ss->stop_reason;
    slot_settle(sl, j, st, ss->n_generated, why == TRI_STOP_LENGTH || why == TRI_STOP_CONTEXT);
}

// The end of a job on slot sl: its closing events, then done, and the slot idle in the same step
// (a client that sends its next turn as soon as it has this answer finds the slot free).
static void job_finish(srv *s, slot *sl, job *j) {
    srv_result *r = &j->res;
    pthread_mutex_lock(&s->mu);
    bool shutdown = j->shutdown;
    pthread_mutex_unlock(&s->mu);
    if (shutdown && !j->rq.stream && !j->err.status)  // an answer cut short is not one: the client retries
        srv_fail(&j->err, 503, "server_error", "server_busy", NULL,
                 "the server stopped before the answer was complete; try again");
    r->text = j->text;
    r->n_text = j->n_text;
    char *tail = NULL, *usage = NULL;
    size_t n_tail = 0, n_usage = 0;
    if (j->rq.stream && !j->err.status) {
        tail = srv_chunk_sse(j->rq.chat, r, NULL, 0, !j->first_chunk_sent, false, &n_tail);
        if (j->rq.include_usage) usage = srv_chunk_sse(j->rq.chat, r, NULL, 0, false, true, &n_usage);
    } else if (j->rq.stream) {
        // the stream has begun with 200: the error comes as an event
        char *e = srv_error_json(&j->err);
        if (e && (tail = malloc(strlen(e) + 9))) n_tail = (size_t)sprintf(tail, "data: %s\n\n", e);
        free(e);
    }
    pthread_mutex_lock(&s->mu);
    if (!j->err.status) {
        s->m_requests++;
        s->m_prompt_tokens += (uint64_t)(r->prompt_tokens - r->cached_tokens);
        s->m_prompt_seconds += r->prefill_seconds;
        s->m_predicted += (uint64_t)r->completion_tokens;
        s->m_predicted_seconds += r->decode_seconds;
    }
    if (j->rq.stream) {
        job_out_locked(j, tail, n_tail);
        if (usage) job_out_locked(j, usage, n_usage);
        job_out_locked(j, "data: [DONE]\n\n", 14);
    }
    j->done = true;
    pthread_cond_broadcast(&j->cond);
    sl->job = NULL;
    job_unref_locked(j);
    assign_locked(s);
    pthread_mutex_unlock(&s->mu);
    free(tail);
    free(usage);
}

static const char *path_of(const job *j) { return j->rq.chat ? "/v1/chat/completions" : "/v1/completions"; }

// The request's line on stderr.
static void job_log(const slot *sl, job *j) {
    bool gone = atomic_load(&j->cancel);
    if (j->err.status)
        fprintf(stderr, "POST %s %d %s slot %d: %s\n", path_of(j), j->err.status, j->id, sl->idx, j->err.message);
    else
        fprintf(stderr,
                "POST %s %s %s slot %d: prompt %d tokens (%d cached), %d generated (%s), queue %.2f s, "
                "prefill %.2f s, decode %.2f s%s\n",
                path_of(j), gone ? (j->shutdown ? "ended" : "cancelled") : "200", j->id, sl->idx, j->res.prompt_tokens,
                j->res.cached_tokens, j->res.completion_tokens, j->res.finish_reason, j->res.queue_seconds,
                j->res.prefill_seconds, j->res.decode_seconds,
                gone ? (j->shutdown ? " (the server is stopping)" : " (the client went away)") : "");
}

// ---- speculative decoding: the slots' engines generate together ----
//
// One scheduler thread drives every slot's engine through one tri_spec_batch: a job that joins
// starts a generation on its slot's engine (tri_generate_spec's, with the slot's cached prefix
// reused), each step runs every generation up to its next forward pass and then the passes of the
// lowest level posted, together with every other over the same weights, in one batched pass (each
// slot's acceptance, rollbacks and sampler its own: its output is the one it gets alone); a
// finished one leaves between steps and a waiting one joins.

// Starts job j on slot sl in batch *b (made when NULL); a job that cannot start ends here.
static void spec_start(srv *s, slot *sl, job *j, tri_spec_batch **b) {
    if (atomic_load(&j->cancel)) {  // gone while it waited: no line, no work
        job_finish(s, sl, j);
        return;
    }
    gen_ctx *g = malloc(sizeof *g);
    int32_t keep = -1;
    tri_status st = TRI_STATUS_OK;
    if (!g) srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory");
    else keep = slot_gen_begin(s, sl, j, g, &sl->spec_gp);
    if (keep >= 0) {
        memset(&sl->spec_stats, 0, sizeof sl->spec_stats);
        if (!*b) st = tri_spec_batch_create(b);
        if (!st)
            st = tri_spec_batch_add(*b, sl->spec, j->rq.ids + keep, j->rq.n_ids - keep, &sl->spec_gp, on_token, g,
                                    &sl->spec_stats, &sl->spec_id);
        if (!st) {
            sl->g = g;
            sl->run = j;
            return;
        }
        slot_spec_end(sl, j, st, &sl->spec_stats);
    }
    free(g);
    job_log(sl, j);
    job_finish(s, sl, j);
}

static void *spec_sched_thread(void *arg) {
    srv *s = arg;
    job *start[256];
    tri_spec_batch *b = NULL;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            start[i] = sl->job && !sl->run ? sl->job : NULL;  // joined since the last step
            busy += sl->job != NULL;
        }
        if (!busy) {
            if (s->stopping) break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_slots; i++)
            if (start[i]) spec_start(s, &s->slots[i], start[i], &b);
        int32_t running = 0;
        tri_status st = b ? tri_spec_batch_step(b, &running) : TRI_STATUS_OK;
        if (b) atomic_fetch_add(&s->m_passes, 1), atomic_fetch_add(&s->m_pass_seqs, (unsigned long long)busy);
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->run) continue;
            bool done = false;
            tri_status gst = TRI_STATUS_OK;
            if (st) {  // the step itself failed (out of memory): every generation in it ends
                atomic_store(&sl->run->cancel, true);
                tri_spec_abort(sl->spec);
            }
            if (tri_spec_batch_result(b, sl->spec_id, &done, &gst) && !done) gst = TRI_STATUS_INTERNAL;
            if (!done) continue;
            job *j = sl->run;
            slot_spec_end(sl, j, gst, &sl->spec_stats);
            job_log(sl, j);
            free(sl->g);
            sl->g = NULL;
            sl->run = NULL;
            job_finish(s, sl, j);
        }
        if (b && running == 0) {  // nothing in it: a fresh batch for the next jobs
            tri_spec_batch_free(b);
            b = NULL;
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    tri_spec_batch_free(b);
    return NULL;
}

// ---- continuous batching: plain decoding's scheduler ----

// The one place a pass runs: n sequences, tokens[i][0 .. n_tokens[i]) after what sessions[i]
// holds, each leaving its last token's logits as tri_session_eval does, the weights read once for
// all of them (on the CPU each sequence's logits are the bits it gets alone).
static tri_status pass_eval(tri_session *const *sessions, const int32_t *const *tokens, const int32_t *n_tokens,
                            int32_t n) {
    return tri_session_eval_batch(sessions, tokens, n_tokens, n);
}

// The end of the job the scheduler runs on sl (st: a failure that ends it).
static void run_end(srv *s, slot *sl, tri_status st, bool length) {
    job *j = sl->run;
    if (sl->t1 > 0) j->res.decode_seconds = now_s() - sl->t1;
    else j->res.prefill_seconds = now_s() - sl->t0;
    slot_settle(sl, j, st, sl->n_gen, length);
    if (sl->text.err == TRI_STATUS_OUT_OF_MEMORY)  // the text's own buffer (tri_last_error says nothing)
        srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory");
    job_log(sl, j);
    srv_text_free(&sl->text);
    free(sl->g);
    sl->g = NULL;
    sl->run = NULL;
    job_finish(s, sl, j);
}

// Takes job j onto slot sl: its cached prefix, its seed, its limits; the prompt's rest is then
// prefilled by the passes. A job that cannot start ends here.
static void run_start(srv *s, slot *sl, job *j) {
    srv_request *rq = &j->rq;
    sl->run = j;
    sl->n_gen = 0;
    sl->t0 = now_s();
    sl->t1 = 0;
    if (atomic_load(&j->cancel)) {  // gone while it waited: no line, no work
        sl->run = NULL;
        job_finish(s, sl, j);
        return;
    }
    int32_t keep = slot_prepare(s, sl, j);
    gen_ctx *g = keep < 0 ? NULL : malloc(sizeof *g);
    tri_status st = TRI_STATUS_OK;
    if (keep >= 0 && !g) srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory");
    if (g) {
        *g = (gen_ctx){s, sl, j, false};
        if (s->pc_path && keep < rq->n_ids) {
            pthread_mutex_lock(&s->pc_mu);
            g->pc_save = s->pc_n == 0;
            pthread_mutex_unlock(&s->pc_mu);
        }
        bool eot = rq->chat && !rq->ignore_eos;
        st = srv_text_init(&sl->text, s->model, (const char *const *)rq->stop, rq->n_stop, eot ? s->stop_ids : NULL,
                           eot ? s->n_stop_ids : 0, on_text, g);
    }
    sl->g = g;
    if (keep < 0 || !g || st) {
        run_end(s, sl, st, false);
        return;
    }
    // the random stream of the request's seed from its start, as tri_generate seeds it
    tri_session_seed(sl->session, j->sampler.seed);
    sl->next = keep;
    sl->pending = -1;
    sl->n_max = slot_n_max(s, rq);
    sl->eos = rq->ignore_eos ? -1 : tri_token_eos(s->model);
    // a rope whose tables depend on the first evaluation's length sees the whole prompt at once,
    // as tri_generate announces it
    sl->whole = s->rope_by_length && keep == 0;
    sl->phase = keep < rq->n_ids ? RUN_PREFILL : RUN_SAMPLE;  // all of it loaded, with its logits
    if (sl->phase == RUN_SAMPLE) sl->t1 = now_s();
}

// Samples sl's next token from the logits its pass left, streams it, and ends the job or leaves
// the token pending for the next pass (tri_generate's loop, a token at a time).
static void run_sample(srv *s, slot *sl) {
    job *j = sl->run;
    int32_t tok;
    tri_status st = tri_session_sample(sl->session, &j->sampler, &tok);
    if (st) {
        run_end(s, sl, st, false);
        return;
    }
    sl->n_gen++;
    bool go = on_token(tok, sl->g) && srv_text_push(&sl->text, tok);
    if (go && tok != sl->eos && sl->n_gen < sl->n_max) {
        sl->pending = tok;
        sl->phase = RUN_DECODE;
        return;
    }
    // emitted, not run: the slot's token list ends with it, and the next request's prefix match
    // stops before it
    st = srv_text_finish(&sl->text);
    run_end(s, sl, st, go && tok != sl->eos);
}

// One pass: every running slot's next tokens through the model at once, then each samples.
static void sched_pass(srv *s) {
    tri_session *ss[256];
    const int32_t *tk[256];
    int32_t nt[256], left[256], take[256], n = 0, n_decode = 0;
    slot *in[256];
    // what each slot has to run before it samples: its token, or the rest of its prompt
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->run && atomic_load(&sl->run->cancel))  // the client went away, or the server stops
            run_end(s, sl, TRI_STATUS_OK, false);
        left[i] = 0;
        if (sl->run && sl->phase == RUN_DECODE) left[i] = 1, n_decode++;
        else if (sl->run && sl->phase == RUN_PREFILL) left[i] = sl->run->rq.n_ids - sl->next;
    }
    // Dynamic SplitFuse: every decoding slot's token, and --batch prompt tokens shared by the
    // prefilling slots in equal parts (what a short prompt leaves goes to the others), so a pass
    // keeps about one size and a short prompt beside a long one is done at once
    tri_batch_plan(left, s->n_slots, s->chunk + n_decode, take);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->run) continue;
        if (sl->phase == RUN_PREFILL) {
            const srv_request *rq = &sl->run->rq;
            int32_t step = sl->whole ? left[i] : take[i];
            if (step == 0) continue;  // more prompts than the budget's tokens: the next pass
            sl->step = step;
            // the retrieval policy selects its chunks from the prompt's last query
            if (sl->next + step == rq->n_ids) tri_session_kv_refresh(sl->session);
            tk[n] = rq->ids + sl->next;
            nt[n] = step;
        } else if (sl->phase == RUN_DECODE) {
            tk[n] = &sl->pending;
            nt[n] = 1;
        } else {
            continue;
        }
        ss[n] = sl->session;
        in[n++] = sl;
    }
    tri_status st = n ? pass_eval(ss, tk, nt, n) : TRI_STATUS_OK;
    if (n) atomic_fetch_add(&s->m_passes, 1), atomic_fetch_add(&s->m_pass_seqs, (unsigned long long)n);
    for (int32_t k = 0; k < n; k++) {
        slot *sl = in[k];
        if (st) {  // the pass is one call: every sequence in it fails
            run_end(s, sl, st, false);
            continue;
        }
        sl->run->res.batch_passes++;
        sl->run->res.batch_sequences += n;
        if (sl->phase == RUN_PREFILL) {
            sl->next += sl->step;
            atomic_store(&sl->run->prefilled, sl->next);
            if (sl->next < sl->run->rq.n_ids) continue;
            sl->t1 = now_s();
            sl->run->res.prefill_seconds = sl->t1 - sl->t0;
            if (sl->g->pc_save) prompt_cache_save(s, sl, &sl->run->rq);
        }
        sl->phase = RUN_SAMPLE;
    }
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].run && s->slots[i].phase == RUN_SAMPLE) run_sample(s, &s->slots[i]);
}

static void *sched_thread(void *arg) {
    srv *s = arg;
    job *start[256];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            start[i] = sl->job && !sl->run ? sl->job : NULL;  // joined since the last pass
            busy += sl->job != NULL;
        }
        if (!busy) {
            if (s->stopping) break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_slots; i++)
            if (start[i]) run_start(s, &s->slots[i], start[i]);
        sched_pass(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ---- HTTP ----

// Per connection and request: the body as it arrives.
typedef struct conn {
    char *body;
    size_t n, cap;
    bool too_big;
    bool active;  // a completion request counted in srv.n_active until its response is done
} conn;

#define MAX_BODY (64u << 20)

static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// --cors: the origins whose pages may call the server ("*": any), comma-separated; NULL: none. One
// server per process, set once at start.
static const char *cors_origins;

// The Origin header of the request when --cors allows it, else NULL.
static const char *cors_allowed(struct MHD_Connection *c) {
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!o || !cors_origins) return NULL;
    if (strcmp(cors_origins, "*") == 0) return o;
    size_t n = strlen(o);
    for (const char *p = cors_origins; *p;) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && strncmp(p, o, n) == 0) return o;
        p += k + (e != NULL);
    }
    return NULL;
}

// The CORS headers of a response to an allowed origin.
static void add_cors(struct MHD_Connection *c, struct MHD_Response *r) {
    const char *o = cors_allowed(c);
    if (!o) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", o);
    MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, char *body) {
    static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", \"param\": "
                              "null, \"code\": null}}";
    struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)
                                     : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom,
                                                                       MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    if (!body) status = 500;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    add_cors(c, resp);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const char *method, const char *url, const srv_error *e) {
    fprintf(stderr, "%s %s %d: %s\n", method, url, e->status, e->message);
    return send_json(c, (unsigned)e->status, srv_error_json(e));
}

// The streamed response: waits for events, writes them, ends after [DONE]. A client that went
// away cancels the job.
typedef struct stream {
    srv *s;
    job *j;
    struct MHD_Connection *c;
    double t_last;  // when the last bytes were handed to libmicrohttpd
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    srv *s = st->s;
    job *j = st->j;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (j->sent < j->n_out) {
            size_t n = j->n_out - j->sent < max ? j->n_out - j->sent : max;
            memcpy(buf, j->out + j->sent, n);
            j->sent += n;
            if (j->sent == j->n_out) j->sent = j->n_out = 0;
            pthread_mutex_unlock(&s->mu);
            st->t_last = now_s();
            return (ssize_t)n;
        }
        // a long prefill (or queue) sends nothing for a while: an SSE comment, which clients
        // ignore, keeps proxies with read timeouts from dropping the stream, and says how far it is
        if (!j->done && s->keep_alive > 0 && now_s() - st->t_last >= s->keep_alive && max >= 96) {
            int n = j->queued ? snprintf(buf, max, ": keep-alive: queued\n\n")
                              : snprintf(buf, max, ": keep-alive: prompt %d of %d tokens run\n\n",
                                         atomic_load(&j->prefilled), j->rq.n_ids);
            pthread_mutex_unlock(&s->mu);
            st->t_last = now_s();
            return n;
        }
        if (j->done) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&j->cond, &s->mu, &ts);
        if (!j->done && client_gone(st->c)) {
            atomic_store(&j->cancel, true);
            if (j->queued) {
                unqueue_locked(s, j);
                j->done = true;
                fprintf(stderr, "POST %s cancelled %s: the client went away while queued\n", path_of(j), j->id);
            }
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    pthread_mutex_lock(&st->s->mu);
    if (!st->j->done) {
        atomic_store(&st->j->cancel, true);  // the connection ended before the answer did
        if (st->j->queued) {
            unqueue_locked(st->s, st->j);
            st->j->done = true;
        }
    }
    job_unref_locked(st->j);
    pthread_mutex_unlock(&st->s->mu);
    free(st);
}

// A completion request, parsed: queued, then answered.
static enum MHD_Result complete(srv *s, struct MHD_Connection *c, const char *method, const char *url, bool chat,
                                conn *cn) {
    srv_error err = {0};
    job *j = calloc(1, sizeof *j);
    if (!j) return send_json(c, 500, NULL);
    if (!srv_parse_request(&s->ref, chat, cn->body, cn->n, &j->rq, &err) ||
        !srv_sampling_apply(&j->rq.sampling, &s->defaults, &j->sampler, &j->explicit_seed, &err)) {
        srv_request_free(&j->rq);
        free(j);
        return send_error(c, method, url, &err);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&j->cancel, false);
    j->created = (int64_t)time(NULL);
    j->t_submit = now_s();
    j->refs = 1;
    j->res.model = s->ref.id;
    j->res.id = j->id;
    j->res.created = j->created;

    pthread_mutex_lock(&s->mu);
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)s->started,
             (unsigned long long)++s->id_counter);
    if (!j->explicit_seed) j->sampler.seed = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ s->id_counter;
    int idle = 0;
    for (int i = 0; i < s->n_slots; i++) idle += !s->slots[i].job;
    if (s->stopping || (idle == 0 && s->n_queued >= s->max_queue)) {
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        srv_fail(&err, 503, "server_error", "server_busy", NULL,
                 stopping ? "the server is stopping"
                          : "the server is busy: all %d slots are generating and %d requests wait (--slots, --queue); "
                            "try again later",
                 s->n_slots, s->max_queue);
        pthread_cond_destroy(&j->cond);
        srv_request_free(&j->rq);
        free(j);
        return send_error(c, method, url, &err);
    }
    j->queued = true;
    if (s->queue_tail) s->queue_tail->next = j;
    else s->queue_head = j;
    s->queue_tail = j;
    s->n_queued++;
    s->n_active++;  // until on_completed: the shutdown lets its response finish
    cn->active = true;
    assign_locked(s);

    if (j->rq.stream) {
        pthread_mutex_unlock(&s->mu);
        stream *st = malloc(sizeof *st);
        struct MHD_Response *resp =
            st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, stream_read, st, stream_free) : NULL;
        if (!resp) {
            pthread_mutex_lock(&s->mu);
            atomic_store(&j->cancel, true);
            if (j->queued) unqueue_locked(s, j);
            job_unref_locked(j);
            pthread_mutex_unlock(&s->mu);
            free(st);
            return send_json(c, 500, NULL);
        }
        *st = (stream){s, j, c, now_s()};
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        add_cors(c, resp);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }

    // not streamed: wait for the whole answer, watching the connection
    while (!j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&j->cond, &s->mu, &ts);
        if (!j->done && !atomic_load(&j->cancel) && client_gone(c)) {
            atomic_store(&j->cancel, true);
            if (j->queued) {
                unqueue_locked(s, j);
                j->done = true;
                fprintf(stderr, "POST %s cancelled %s: the client went away while queued\n", path_of(j), j->id);
            }
        }
    }
    bool gone = atomic_load(&j->cancel) && !j->shutdown;
    srv_error e = j->err;
    char *body = e.status || gone ? NULL : srv_response_json(chat, &j->res);
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
    if (gone) {
        free(body);
        return MHD_NO;  // nobody to answer: close the connection
    }
    if (e.status) return send_error(c, method, url, &e);
    return send_json(c, 200, body);
}

// Whether the request carries the API key (always true without one). Compared in constant time.
static bool authorized(srv *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;  // the scheme is case-insensitive (RFC 9110)
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h), m = strlen(s->api_key);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i < m ? i : 0];
    return diff == 0;
}

// OPTIONS: a CORS preflight (204 with the methods and headers a page may use, when --cors allows
// its origin; 403 naming the origin otherwise), or a plain OPTIONS (204 with Allow).
static enum MHD_Result send_options(struct MHD_Connection *c, const char *url) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && !cors_allowed(c)) {
        srv_error err = {0};
        srv_fail(&err, 403, "invalid_request_error", "origin_not_allowed", NULL,
                 "pages from %s may not call this server: start it with --cors '%s' (or --cors '*')", origin, origin);
        return send_error(c, "OPTIONS", url, &err);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Allow", "GET, HEAD, POST, OPTIONS");
    if (origin) {
        add_cors(c, resp);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", h ? h : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ret = MHD_queue_response(c, 204, resp);
    MHD_destroy_response(resp);
    return ret;
}

// GET /props (what 0), /slots (1), /metrics (2: Prometheus text, llama-server's names).
static enum MHD_Result send_info(srv *s, struct MHD_Connection *c, int what) {
    if (what == 0) {
        char *body = srv_props_json(&s->ref, &s->defaults, s->n_predict, s->n_slots, mode_names[s->spec_params.mode]);
        return send_json(c, 200, body);
    }
    pthread_mutex_lock(&s->mu);
    srv_slot_info info[256];
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) {
        info[i] = (srv_slot_info){i, s->slots[i].job != NULL, s->slots[i].n_tokens};
        busy += info[i].processing;
    }
    uint64_t req = s->m_requests, pt = s->m_prompt_tokens, pr = s->m_predicted;
    double ps = s->m_prompt_seconds, prs = s->m_predicted_seconds;
    int queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    if (what == 1) return send_json(c, 200, srv_slots_json(&s->ref, info, s->n_slots, s->spec_params.mode != 0));
    unsigned long long passes = atomic_load(&s->m_passes), seqs = atomic_load(&s->m_pass_seqs);
    char *body = NULL;
    if (asprintf(&body,
                 "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
                 "# TYPE llamacpp:prompt_tokens_total counter\n"
                 "llamacpp:prompt_tokens_total %llu\n"
                 "# HELP llamacpp:prompt_seconds_total Prompt process time.\n"
                 "# TYPE llamacpp:prompt_seconds_total counter\n"
                 "llamacpp:prompt_seconds_total %.6f\n"
                 "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
                 "# TYPE llamacpp:tokens_predicted_total counter\n"
                 "llamacpp:tokens_predicted_total %llu\n"
                 "# HELP llamacpp:tokens_predicted_seconds_total Predict process time.\n"
                 "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
                 "llamacpp:tokens_predicted_seconds_total %.6f\n"
                 "# HELP llamacpp:n_decode_total Total number of batched passes.\n"
                 "# TYPE llamacpp:n_decode_total counter\n"
                 "llamacpp:n_decode_total %llu\n"
                 "# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per pass.\n"
                 "# TYPE llamacpp:n_busy_slots_per_decode gauge\n"
                 "llamacpp:n_busy_slots_per_decode %.6f\n"
                 "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n"
                 "# TYPE llamacpp:prompt_tokens_seconds gauge\n"
                 "llamacpp:prompt_tokens_seconds %.6f\n"
                 "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.\n"
                 "# TYPE llamacpp:predicted_tokens_seconds gauge\n"
                 "llamacpp:predicted_tokens_seconds %.6f\n"
                 "# HELP llamacpp:requests_processing Number of requests processing.\n"
                 "# TYPE llamacpp:requests_processing gauge\n"
                 "llamacpp:requests_processing %d\n"
                 "# HELP llamacpp:requests_deferred Number of requests deferred (queued).\n"
                 "# TYPE llamacpp:requests_deferred gauge\n"
                 "llamacpp:requests_deferred %d\n"
                 "# HELP triforce:requests_total Requests answered.\n"
                 "# TYPE triforce:requests_total counter\n"
                 "triforce:requests_total %llu\n",
                 (unsigned long long)pt, ps, (unsigned long long)pr, prs, passes,
                 passes ? (double)seqs / (double)passes : 0.0, ps > 0 ? (double)pt / ps : 0.0,
                 prs > 0 ? (double)pr / prs : 0.0, busy, queued, (unsigned long long)req) < 0)
        return send_json(c, 500, NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    add_cors(c, resp);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    conn *cn = *con_cls;
    if (!cn) {  // the headers: the body follows in the next calls
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->too_big || cn->n + n > MAX_BODY) {
            cn->too_big = true;
            return MHD_YES;
        }
        if (cn->n + n + 1 > cn->cap) {
            size_t cap = 2 * (cn->n + n) + 1;
            char *b = realloc(cn->body, cap);
            if (!b) {
                cn->too_big = true;
                return MHD_YES;
            }
            cn->body = b;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->n, upload_data, n);
        cn->n += n;
        return MHD_YES;
    }

    srv_error err = {0};
    if (!atomic_load(&s->ready)) {  // the port is bound before the model loads
        if (strncmp(url, "/health", 7) == 0 || strncmp(url, "/v1/health", 10) == 0)
            return send_json(c, 503, strdup("{\"status\": \"loading\"}"));
        srv_fail(&err, 503, "server_error", "server_busy", NULL, "the model is loading; try again shortly");
        return send_error(c, method, url, &err);
    }
    // HEAD is GET without the body (libmicrohttpd leaves it out)
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0,
         post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    // the routes with or without /v1, and with trailing slashes
    char route[256];
    size_t ul = strlen(url);
    while (ul > 1 && url[ul - 1] == '/') ul--;
    snprintf(route, sizeof route, "%.*s", (int)(ul < sizeof route ? ul : sizeof route - 1), url);
    if (strcmp(route, "/v1") == 0) route[1] = 0;
    const char *path = strncmp(route, "/v1/", 4) == 0 ? route + 3 : route;
    if (strcmp(method, MHD_HTTP_METHOD_OPTIONS) == 0) return send_options(c, url);
    if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0) {  // the chat page: no key (its requests need one)
        if (!get) goto method;
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(sizeof chat_page - 1, (void *)chat_page, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
        MHD_add_response_header(resp, "Content-Security-Policy",
                                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (strcmp(path, "/health") == 0) {
        if (!get) goto method;
        pthread_mutex_lock(&s->mu);
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].job != NULL;
        char *body = malloc(160);
        if (body)
            snprintf(body, 160, "{\"status\": \"ok\", \"slots\": %d, \"slots_busy\": %d, \"queued\": %d, "
                     "\"queue\": %d}", s->n_slots, busy, s->n_queued, s->max_queue);
        pthread_mutex_unlock(&s->mu);
        return send_json(c, 200, body);
    }
    bool tokenize = strcmp(path, "/tokenize") == 0, detokenize = strcmp(path, "/detokenize") == 0;
    bool props = strcmp(path, "/props") == 0, slots = strcmp(path, "/slots") == 0;
    bool metrics = strcmp(path, "/metrics") == 0;
    bool models = strcmp(path, "/models") == 0, model_one = strncmp(path, "/models/", 8) == 0;
    bool chat = strcmp(path, "/chat/completions") == 0, compl = strcmp(path, "/completions") == 0;
    if (!models && !model_one && !chat && !compl &&!tokenize && !detokenize && !props && !slots && !metrics) {
        srv_fail(&err, 404, "invalid_request_error", "unknown_url", NULL,
                 "unknown URL %s %s: this server has /v1/chat/completions, /v1/completions, /v1/models, /health, "
                 "/tokenize, /detokenize, /props, /slots and /metrics",
                 method, url);
        return send_error(c, method, url, &err);
    }
    if (!authorized(s, c)) {
        srv_fail(&err, 401, "invalid_request_error", "invalid_api_key", NULL,
                 MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)
                     ? "incorrect API key: give the server's key as \"Authorization: Bearer KEY\""
                     : "no API key: this server wants \"Authorization: Bearer KEY\"");
        return send_error(c, method, url, &err);
    }
    if (tokenize || detokenize) {
        if (!post) goto method;
        char *out = NULL;
        if (!(tokenize ? srv_tokenize_json : srv_detokenize_json)(&s->ref, cn->body, cn->n, &out, &err))
            return send_error(c, method, url, &err);
        return send_json(c, 200, out);
    }
    if (props || slots || metrics) {
        if (!get) goto method;
        return send_info(s, c, props ? 0 : slots ? 1 : 2);
    }
    if (models || model_one) {
        if (!get) goto method;
        const char *want = model_one ? path + 8 : NULL;
        if (want && strcmp(want, s->ref.id) != 0) {
            srv_fail(&err, 404, "invalid_request_error", "model_not_found", "model",
                     "the model '%s' does not exist: this server serves '%s'", want, s->ref.id);
            return send_error(c, method, url, &err);
        }
        fprintf(stderr, "%s %s 200\n", method, url);
        return send_json(c, 200, srv_models_json(&s->ref, s->started, model_one));
    }
    if (!post) goto method;
    if (cn->too_big) {
        srv_fail(&err, 413, "invalid_request_error", NULL, NULL, "the request body is larger than %u MiB",
                 MAX_BODY >> 20);
        return send_error(c, method, url, &err);
    }
    return complete(s, c, method, url, chat, cn);
method:
    srv_fail(&err, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %s", method, url);
    return send_error(c, method, url, &err);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    conn *cn = *con_cls;
    if (cn && cn->active) {
        pthread_mutex_lock(&s->mu);
        if (--s->n_active == 0) pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
    }
    if (cn) {
        free(cn->body);
        free(cn);
    }
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    fputs("offload-run serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

// ---- start-up ----

// Bytes of memory the system has available (MemAvailable), 0 if unknown.
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

#define AUTO_SLOTS_MAX 4
#define SHUTDOWN_WAIT 10  // seconds the responses of a stopping server may take to be written

// Whether the address is this machine's only (127.0.0.0/8, ::1, an IPv4-mapped 127.x).
static bool is_loopback(const struct sockaddr *a) {
    if (a->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
    }
    return false;
}

// The slots when --slots is not given: on the CPU with plain decoding, as many as the KV caches of
// a full context each fit in a quarter of the memory available now, from 1 to AUTO_SLOTS_MAX; one
// on a GPU, a device list, with --gpu-mem or --spec (each slot there holds its own copy of the
// weights, or a speculative engine's several caches). why: the rule's line for stderr.
static long auto_slots(const tri_model *model, const tri_cli_engine *eng, long ctx, char *why, size_t n) {
    const tri_session_params *sp = &eng->sp;
    bool gpu = sp->device_kind == TRI_DEVICE_CUDA || (sp->device_kind == TRI_DEVICE_AUTO && tri_device_count() > 0);
    bool spec = eng->spec.mode != TRI_SPEC_MODE_NONE;
    if (gpu || sp->devices || eng->gpu_mem || spec) {
        snprintf(why, n, "slots: 1 (--slots not given; %s: each slot would hold its own %s)\n",
                 spec ? "--spec" : "a GPU or a device list",
                 spec ? "speculative engine and caches" : "copy of the weights");
        return 1;
    }
    tri_model_info mi;
    tri_model_get_info(model, &mi);
    // bytes of one token's key or value element in the cache's type
    double per_value = sp->kv_type == TRI_DTYPE_F32                                         ? 4.0
                       : sp->kv_type == TRI_DTYPE_Q8_0                                      ? 34.0 / 32
                       : sp->kv_type == TRI_DTYPE_Q4_0 || sp->kv_type == TRI_DTYPE_KV_MIXED ? 18.0 / 32
                                                                                            : 2.0;
    double per_slot = 2.0 * mi.config.n_layer * mi.config.n_head_kv * mi.config.head_dim * per_value * (double)ctx;
    uint64_t avail = mem_available();
    long k = per_slot > 0 && avail ? (long)((double)avail / 4 / per_slot) : 1;
    if (k < 1) k = 1;
    if (k > AUTO_SLOTS_MAX) k = AUTO_SLOTS_MAX;
    snprintf(why, n,
             "slots: %ld (--slots not given: the KV cache of a %ld-token context is %.0f MB; as many as fit in a "
             "quarter of the %.1f GB available, at most %d)\n",
             k, ctx, per_slot / 1e6, (double)avail / 1e9, AUTO_SLOTS_MAX);
    return k;
}

int tri_server_main(int argc, char **argv) {
    enum {
        OPT_HOST = 256,
        OPT_PORT,
        OPT_API_KEY,
        OPT_ALIAS,
        OPT_SLOTS,
        OPT_QUEUE,
        OPT_CTX,
        OPT_TEMP,
        OPT_TOPK,
        OPT_TOPP,
        OPT_MINP,
        OPT_REPEAT,
        OPT_SEED,
        OPT_CHAT_FORMAT,
        OPT_BATCH,
        OPT_PROMPT_CACHE,
        OPT_SIMILARITY,
        OPT_KEEP_ALIVE,
        OPT_CORS
    };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"host", required_argument, NULL, OPT_HOST},
        {"port", required_argument, NULL, OPT_PORT},
        {"api-key", required_argument, NULL, OPT_API_KEY},
        {"alias", required_argument, NULL, OPT_ALIAS},
        {"slots", required_argument, NULL, OPT_SLOTS},
        {"queue", required_argument, NULL, OPT_QUEUE},
        {"ctx", required_argument, NULL, OPT_CTX},
        {"n-predict", required_argument, NULL, 'n'},
        {"temp", required_argument, NULL, OPT_TEMP},
        {"top-k", required_argument, NULL, OPT_TOPK},
        {"top-p", required_argument, NULL, OPT_TOPP},
        {"min-p", required_argument, NULL, OPT_MINP},
        {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"chat-format", required_argument, NULL, OPT_CHAT_FORMAT},
        {"threads", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"prompt-cache", required_argument, NULL, OPT_PROMPT_CACHE},
        {"slot-similarity", required_argument, NULL, OPT_SIMILARITY},
        {"keep-alive", required_argument, NULL, OPT_KEEP_ALIVE},
        {"cors", required_argument, NULL, OPT_CORS},
        TRI_CLI_ENGINE_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    srv S;
    memset(&S, 0, sizeof S);
    srv *s = &S;
    const char *model_path = NULL, *host = "127.0.0.1", *alias = NULL;
    const tri_sampler_params chat = tri_sampler_chat_params();  // the defaults below
    long port = 8080, n_slots = 0, max_queue = 8, ctx = 4096, n_predict = 0, top_k = chat.top_k, threads = 0, batch = 0;
    long seed = 0;
    float temp = chat.temperature, top_p = chat.top_p, min_p = chat.min_p, repeat_penalty = chat.repeat_penalty;
    float similarity = 0.5f, keep_alive = 15.0f;
    bool seed_set = false;
    tri_chat_format format = TRI_CHAT_FORMAT_AUTO;
    tri_cli_engine eng;  // --device, --kv-type, --kv, --spec, placement: generate's (cli-engine.c)
    tri_cli_engine_init(&eng);
    s->api_key = getenv("TRI_SERVER_API_KEY");
    if (s->api_key && !s->api_key[0]) s->api_key = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        bool ok = true, handled;
        if (!tri_cli_engine_option(me, c, optarg, &eng, &handled)) return 2;
        if (handled) continue;
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_HOST: host = optarg; break;
        case OPT_PORT: ok = tri_cli_parse_long(me, "--port", optarg, 0, 65535, &port); break;
        case OPT_API_KEY:
            if (!optarg[0]) {
                fprintf(stderr, "%s: --api-key: want a non-empty key\n", me);
                ok = false;
            }
            s->api_key = optarg;
            break;
        case OPT_ALIAS: alias = optarg; break;
        case OPT_SLOTS: ok = tri_cli_parse_long(me, "--slots", optarg, 1, 256, &n_slots); break;
        case OPT_QUEUE: ok = tri_cli_parse_long(me, "--queue", optarg, 0, 65536, &max_queue); break;
        case OPT_CTX: ok = tri_cli_parse_long(me, "--ctx", optarg, 16, INT32_MAX, &ctx); break;
        case 'n': ok = tri_cli_parse_long(me, "--n-predict", optarg, 0, INT32_MAX, &n_predict); break;
        case OPT_TEMP: ok = tri_cli_parse_float(me, "--temp", optarg, 0.0, 100.0, &temp); break;
        case OPT_TOPK: ok = tri_cli_parse_long(me, "--top-k", optarg, 0, INT32_MAX, &top_k); break;
        case OPT_TOPP: ok = tri_cli_parse_float(me, "--top-p", optarg, 1e-6, 1.0, &top_p); break;
        case OPT_MINP: ok = tri_cli_parse_float(me, "--min-p", optarg, 0.0, 1.0, &min_p); break;
        case OPT_REPEAT: ok = tri_cli_parse_float(me, "--repeat-penalty", optarg, 0.0, 100.0, &repeat_penalty); break;
        case OPT_SEED:
            seed_set = true;
            ok = tri_cli_parse_long(me, "--seed", optarg, 0, INT64_MAX, &seed);
            break;
        case OPT_CHAT_FORMAT:
            if (tri_chat_format_from_name(optarg, &format) != TRI_STATUS_OK || format == TRI_CHAT_FORMAT_AUTO) {
                fprintf(stderr, "%s: --chat-format '%s': want chatml, llama2, llama3, mistral, phi3 or gemma\n", me,
                        optarg);
                ok = false;
            }
            break;
        case 't': ok = tri_cli_parse_long(me, "--threads", optarg, 1, 4096, &threads); break;
        case OPT_BATCH: ok = tri_cli_parse_long(me, "--batch", optarg, 1, 65536, &batch); break;
        case OPT_PROMPT_CACHE: s->pc_path = optarg; break;
        case OPT_CORS: cors_origins = optarg[0] ? optarg : NULL; break;
        case OPT_KEEP_ALIVE: ok = tri_cli_parse_float(me, "--keep-alive", optarg, 0.0, 3600.0, &keep_alive); break;
        case OPT_SIMILARITY: ok = tri_cli_parse_float(me, "--slot-similarity", optarg, 0.0, 1.0, &similarity); break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
        if (!ok) return 2;
    }
    if (!model_path || optind != argc) {
        fprintf(stderr, "%s: %s\n", me, !model_path ? "-m MODEL is required" : "unexpected argument");
        return tri_cli_see_help();
    }
    // every cache option must do something under the chosen policy or mode, as generate checks
    if (!tri_cli_engine_check(me, &eng)) return 2;
    const tri_spec_mode mode = eng.spec.mode;
    const bool plain = mode == TRI_SPEC_MODE_NONE;
    s->spec_params = eng.spec;
    s->defaults.has_temperature = true, s->defaults.temperature = temp;
    s->defaults.has_top_k = true, s->defaults.top_k = top_k;
    s->defaults.has_top_p = true, s->defaults.top_p = top_p;
    s->defaults.has_min_p = true, s->defaults.min_p = min_p;
    s->defaults.has_repeat_penalty = true, s->defaults.repeat_penalty = repeat_penalty;
    if (seed_set) s->defaults.has_seed = true, s->defaults.seed = (uint64_t)seed;
    s->n_predict = n_predict;
    s->max_queue = (int)max_queue;
    s->similarity = similarity;
    s->keep_alive = keep_alive;

    // --prompt-cache naming something that is not a cache (a document given by mistake): refused
    // before anything loads, and never overwritten
    if (s->pc_path && tri_prompt_cache_writable(s->pc_path)) {
        fprintf(stderr, "%s: --prompt-cache: %s\n", me, tri_last_error());
        return 2;
    }

    // the address, before the model loads: a bad one is reported at once
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%ld", port);
    int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai) {
        fprintf(stderr, "%s: --host '%s': %s\n", me, host, gai_strerror(gai));
        return 2;
    }

    int rc = 1;
    tri_status st;
    struct MHD_Daemon *d = NULL;
    int n_started = 0;
    char *id = NULL, *chat_why = NULL;
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);  // every thread made from here on blocks them too
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->pc_mu, NULL);
    pthread_cond_init(&s->work, NULL);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->idle, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&s->ready, false);

    // ---- HTTP: the port bound before the model loads (a port in use is reported at once;
    // requests meanwhile are answered 503, /health {"status": "loading"}) ----
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    errno = 0;
    d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)(256 + s->max_queue + 64),
                         MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "%s: cannot listen on %s port %ld: %s\n", me, host, port,
                errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    
    if (!s->api_key && !is_loopback(ai->ai_addr))
        fprintf(stderr,
                "%s: warning: listening on %s, beyond this machine, without an API key: anyone who can reach "
                "the port can use the model (give --api-key KEY or $TRI_SERVER_API_KEY)\n",
                me, host);
    fflush(stderr);

    if (!(s->model = tri_cli_load_model(model_path))) goto done;
    if (tri_token_count(s->model) == 0) {
        fprintf(stderr, "%s: %s: the model has no tokenizer\n", me, model_path);
        goto done;
    }
    // the model's name: --alias, else the file or directory name without .gguf
    if (alias) {
        id = strdup(alias);
    } else {
        size_t n = strlen(model_path);
        while (n > 1 && model_path[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && model_path[b - 1] != '/') b--;
        if (n - b > 5 && strncmp(model_path + n - 5, ".gguf", 5) == 0) n -= 5;
        id = strndup(model_path + b, n - b);
    }
    if (!id) goto oom;
    s->ref.model = s->model;
    s->ref.id = id;
    s->ref.path = model_path;
    s->ref.chat_format = format;
    s->ref.chat_ok = true;
    if (format == TRI_CHAT_FORMAT_AUTO) {
        tri_chat_format f;
        if ((st = tri_chat_model_format(s->model, &f))) {
            if (asprintf(&chat_why, "%s%s", tri_last_error(),
                         st == TRI_STATUS_NOT_FOUND ? "; start the server with --chat-format" : "") < 0)
                goto oom;
            s->ref.chat_ok = false;
            s->ref.chat_why = chat_why;
            fprintf(stderr, "%s: warning: /v1/chat/completions refuses every request: %s\n", me, chat_why);
        } else {
            fprintf(stderr, "chat format: %s (the model's template)\n", tri_chat_format_name(f));
        }
    } else {
        fprintf(stderr, "chat format: %s (--chat-format)\n", tri_chat_format_name(format));
    }
    if (tri_chat_stop_tokens(s->model, s->stop_ids, 16, &s->n_stop_ids) != TRI_STATUS_OK) s->n_stop_ids = 0;
    if (s->n_stop_ids > 16) s->n_stop_ids = 16;

    // ---- the slots ----
    if (n_slots == 0) {  // not given: from the memory a slot's context needs
        char why[256];
        n_slots = auto_slots(s->model, &eng, ctx, why, sizeof why);
        fputs(why, stderr);
    }
    s->n_slots = (int)n_slots;
    eng.sp.n_ctx = (int32_t)ctx;
    eng.sp.n_threads = (int32_t)threads;
    eng.sp.n_batch = (int32_t)batch;
    char plan_line[1024];  // printed once the slots exist, as generate does
    if (!tri_cli_engine_place(s->model, &eng, (int32_t)n_slots, plan_line, sizeof plan_line)) goto done;
    const tri_session_params sp = eng.sp;
    s->sp = sp;
    if (!plain) {
        int drc = tri_cli_engine_load_drafter(me, &eng);
        s->draft = eng.draft, s->draft_layers = eng.layers;  // the server's now: freed below
        eng.draft = NULL, eng.layers = NULL;
        s->spec_params = eng.spec;
        if (drc) {
            rc = drc;
            goto done;
        }
    }
    if (!(s->slots = calloc((size_t)s->n_slots, sizeof *s->slots))) goto oom;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->s = s;
        sl->idx = i;
        st = plain ? tri_session_create(s->model, &sp, &sl->session)
                   : tri_spec_create(s->model, &sp, &s->spec_params, &sl->spec);
        if (st) {
            rc = tri_cli_fail(plain ? "cannot create a session" : "cannot set up speculative decoding", st);
            goto done;
        }
    }
    fputs(plan_line, stderr);
    s->ref.n_ctx = plain ? tri_session_n_ctx(s->slots[0].session) : (int32_t)ctx;
    if (s->pc_path && !prompt_cache_start(s, plain)) goto done;
    // one scheduler batches the slots: plain decoding's passes, or the engines' (speculative)
    s->chunk = sp.n_batch > 0 ? sp.n_batch : 128;
    if (sp.kv_layers_offloaded > 0 || sp.weight_layers_streamed > 0) s->chunk = 8192;  // a pass streams: fewer
    tri_model_info mi;
    tri_model_get_info(s->model, &mi);
    s->rope_by_length = mi.config.rope_scaling == TRI_ROPE_SCALING_DYNAMIC ||
                        mi.config.rope_scaling == TRI_ROPE_SCALING_LONGROPE;
    for (; n_started < 1; n_started++) {
        if (pthread_create(&s->slots[n_started].thread, NULL, plain ? sched_thread : spec_sched_thread, s)) {
            fprintf(stderr, "%s: cannot start the slots' threads: %s\n", me, strerror(errno));
            goto done;
        }
    }

    // ---- ready ----
    struct timespec t0;
    clock_gettime(CLOCK_REALTIME, &t0);
    s->started = (int64_t)t0.tv_sec;
    srand((unsigned)(t0.tv_nsec ^ t0.tv_sec ^ getpid()));
    atomic_store(&s->ready, true);
    fprintf(stderr, "device: %s, context %d tokens per slot, spec %s\n",
            plain ? tri_session_device(s->slots[0].session) : tri_spec_device(s->slots[0].spec), s->ref.n_ctx,
            mode_names[mode]);
    fprintf(stderr, "listening on http://%s%s%s:%u/v1 (model '%s', %d slots, queue %d%s)\n",
            ai->ai_family == AF_INET6 ? "[" : "", host, ai->ai_family == AF_INET6 ? "]" : "",
            di ? (unsigned)di->port : (unsigned)port, id, s->n_slots, s->max_queue,
            s->api_key ? ", API key required" : "");
    fflush(stderr);

    int sig = 0;
    sigset_t stop_sigs;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    sigwait(&stop_sigs, &sig);
    fprintf(stderr, "%s: %s: stopping\n", me, sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "%s: out of memory\n", me);
done:
    // stop: queued requests are answered 503, running ones cancelled, then the slots and the
    // connections end
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    while (s->queue_head) {
        job *j = s->queue_head;
        unqueue_locked(s, j);
        srv_fail(&j->err, 503, "server_error", "server_busy", NULL, "the server is stopping");
        if (j->rq.stream) {  // its stream has begun with 200: the error as an event, then [DONE]
            char *e = srv_error_json(&j->err);
            if (e) {
                job_out_locked(j, "data: ", 6);
                job_out_locked(j, e, strlen(e));
                job_out_locked(j, "\n\ndata: [DONE]\n\n", 16);
            }
            free(e);
        }
        j->done = true;
        pthread_cond_broadcast(&j->cond);
    }
    // running answers end after the token or prefill piece in progress, each stream with its
    // closing chunk and [DONE] (a non-streamed one: 503)
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        if (!s->slots[i].job) continue;
        s->slots[i].job->shutdown = true;
        atomic_store(&s->slots[i].job->cancel, true);
    }
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_started; i++) pthread_join(s->slots[i].thread, NULL);
    // the responses written out before the connections close, for at most SHUTDOWN_WAIT seconds
    pthread_mutex_lock(&s->mu);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += SHUTDOWN_WAIT;
    while (d && s->n_active > 0)
        if (pthread_cond_timedwait(&s->idle, &s->mu, &until) == ETIMEDOUT) {
            fprintf(stderr, "%s: %d responses still being written after %d s: closed\n", me, s->n_active,
                    SHUTDOWN_WAIT);
            break;
        }
    pthread_mutex_unlock(&s->mu);
    if (d) MHD_stop_daemon(d);
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        tri_session_free(s->slots[i].session);
        tri_spec_free(s->slots[i].spec);
        free(s->slots[i].tokens);
    }
    free(s->slots);
    free(s->draft_layers);
    tri_model_free(s->draft);
    tri_model_free(s->model);
    free(id);
    free(chat_why);
    freeaddrinfo(ai);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->pc_mu);
    free(s->pc_tokens);
    return rc;
}

#else  // !TRI_HAVE_MICROHTTPD

int tri_server_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "offload-run serve: this build has no server: libmicrohttpd was not found when it was "
            "configured (install libmicrohttpd-dev, scripts/install-deps.sh, and reconfigure)\n");
    return 1;
}

#endif  // TRI_HAVE_MICROHTTPD
