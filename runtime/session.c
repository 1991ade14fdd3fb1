// session.c - the session API: a model, a backend, a KV cache; plain autoregressive decoding.
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend-select.h"
#include "backend.h"
#include "dtype.h"
#include "error.h"
#include "kv-policy.h"
#include "llama.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "textgen.h"
#include "tensor-parallel.h"

// What ranks 1 .. N-1 of a tensor-parallel session hold (rank 0's is the session's own).
typedef struct session_rank {
    tri__llama ll;
    tri__kv_policy kv;
    tri__kv_store store;
} session_rank;

struct tri_session {
    const tri_model *model;
    tri__backend *be;     // rank 0's (group.be[0])
    tri_model *weights;   // model's view (rank 0's shard's) with its weights in be's memory
    tri__tp_group group;  // the devices, their shards and weights (tensor-parallel.h); name: "cpu",
                          // "cuda:N", "cpu:0,cpu:1", ...
    session_rank *peers;  // (group.n - 1) the other ranks' passes and caches
    tri__llama ll;
    tri__kv_policy kv;    // the cache and the policy that chooses what each layer attends to
    tri__kv_store store;  // with offloaded layers: the store kv wraps (FULL policy); else unused
    tri__llama_step step; // StreamingLLM on a backend with graphs, one device: one-token evals as a
                          // recorded step (llama.h); else unused (step.ll NULL)
    tri__rng rng;
    bool seeded;          // rng was seeded (from `seed`) since the session was created or reset
    int32_t pending;      // the last token tri_generate emitted, not yet run (the next call runs
                          // it first, so a continuation sees it); -1: none
    uint64_t seed;
    tri__sampler_scratch scratch;
    float *logits;        // (logits_cap, n_vocab) host: rows of the last eval
    int32_t logits_cap;
    int32_t n_logits;     // rows valid: 0 (none), 1 (last only) or the eval's token count
    bool all_logits;
    float *probs;         // (n_vocab) host
    _Atomic int run;      // TRI__RUN_IDLE, _GENERATING or _ABORT (tri_session_abort)
};

tri_session_params tri_session_default_params(void) {
    tri_session_params p = {.n_ctx = 0, .n_threads = 0, .n_batch = 0, .kv_type = TRI_DTYPE_F16,
                            .kv_policy = TRI_KV_POLICY_FULL};
    return p;
}

tri_generate_params tri_generate_default_params(void) {
    tri_generate_params p = {.n_predict = 0, .stop_at_eos = true};
    p.sampler = tri_sampler_default_params();
    return p;
}

void tri_session_free(tri_session *s) {
    if (!s) return;
    tri__llama_step_free(&s->step);
    tri__kv_policy_free(&s->kv);
    tri__kv_store_free(&s->store);
    tri__llama_free(&s->ll);
    for (int32_t r = 1; s->peers && r < s->group.n; r++) {
        tri__kv_policy_free(&s->peers[r - 1].kv);
        tri__kv_store_free(&s->peers[r - 1].store);
        tri__llama_free(&s->peers[r - 1].ll);
    }
    free(s->peers);
    tri__tp_group_close(&s->group);
    tri__sampler_scratch_free(&s->scratch);
    free(s->logits);
    free(s->probs);
    free(s);
}

tri_status tri_session_create(const tri_model *model, const tri_session_params *params,
                              tri_session **out) {
    if (out) *out = NULL;
    if (!model || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_create: NULL argument");
    tri_session_params p = params ? *params : tri_session_default_params();
    const tri_model_config *c = &model->config;
    if (p.n_ctx < 0 || p.n_batch < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: n_ctx %d and n_batch %d must be >= 0",
                         p.n_ctx, p.n_batch);
    p.n_ctx = tri__session_n_ctx(c, p.n_ctx, "session");
    if (p.n_batch == 0) p.n_batch = 128;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    // the cache policy: 0 picks the default of each field; what is left is checked before anything
    // is allocated
    if (p.kv_budget < 0 || p.kv_chunk < 0 || p.kv_sink < 0 || p.kv_refresh < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "session: kv_budget %d, kv_chunk %d, kv_sink %d and kv_refresh %d must be >= 0",
                         p.kv_budget, p.kv_chunk, p.kv_sink, p.kv_refresh);
    tri__kv_policy_params kp = tri__kv_policy_default_params(p.kv_policy, p.n_ctx);
    if (p.kv_chunk > 0) kp.chunk = p.kv_chunk;
    if (p.kv_budget > 0) kp.budget = p.kv_budget;
    if (p.kv_sink > 0) kp.sink = p.kv_sink;
    else kp.sink = kp.budget >= 32 ? 16 : kp.budget / 2;
    kp.refresh = p.kv_refresh;
    kp.index = (tri__chunk_index_kind)p.kv_index;
    tri_status st;
    if (p.kv_budget == 0) {
        // a sink given must fit the budget left to the default even where nothing will be evicted
        if (kp.kind == TRI_KV_POLICY_STREAMING && (st = tri__kv_policy_check(&kp, p.n_ctx))) return st;
        tri__kv_policy_default_budget(&kp, p.n_ctx);  // whole chunks, or FULL if it covers n_ctx
    } else if (kp.budget > p.n_ctx) {
        // past the context: FULL, as the default is; a sink given must still fit the budget
        if (kp.kind == TRI_KV_POLICY_STREAMING && (kp.sink < 0 || kp.sink >= kp.budget))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy streaming: sink %d must be in [0, budget %d) to leave room for recent tokens",
                             kp.sink, kp.budget);
        tri__kv_policy_cover(&kp, p.n_ctx);
    }
    if ((st = tri__kv_policy_check(&kp, p.n_ctx))) return st;
    if (p.kv_layers_offloaded < 0 || p.kv_layers_offloaded > c->n_layer)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: kv_layers_offloaded %d outside [0, %d] (the model's layers)",
                         p.kv_layers_offloaded, c->n_layer);
    if (p.weight_layers_streamed < 0 || p.weight_layers_streamed > c->n_layer)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: weight_layers_streamed %d outside [0, %d] (the model's layers)",
                         p.weight_layers_streamed, c->n_layer);
    if (p.weight_layers_from_disk < 0 || p.weight_layers_from_disk > p.weight_layers_streamed)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "session: weight_layers_from_disk %d outside [0, %d] (weight_layers_streamed)",
                         p.weight_layers_from_disk, p.weight_layers_streamed);
    if (!(p.kv_host_fraction >= 0 && p.kv_host_fraction <= 1))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: kv_host_fraction %g outside [0, 1]", p.kv_host_fraction);
    // the cache's type: f16, f32, or the blocks of q8_0 / q4_0 (the full cache, offloaded or not)
    if (!tri__kv_type_ok(p.kv_type))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: kv_type %s (%d): want f16, f32, q8_0 or q4_0",
                         tri_dtype_name(p.kv_type), (int)p.kv_type);
    if (tri__dtype_is_quantized(p.kv_type) && kp.kind != TRI_KV_POLICY_FULL)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "session: kv_type %s holds only the full cache; policy %s keeps f16 or f32",
                         tri_dtype_name(p.kv_type), tri__kv_policy_name(kp.kind));
    if (p.kv_layers_offloaded > 0 && p.kv_policy != TRI_KV_POLICY_FULL)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "session: kv_layers_offloaded streams the full cache; policy %s keeps its cache on the device",
                         tri__kv_policy_name(p.kv_policy));

    tri_session *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "session");
    s->model = model;
    if ((st = tri__tp_group_open(&s->group, model, &p))) goto fail;
    s->be = s->group.be[0];
    s->weights = s->group.weights[0];
    if (s->group.n > 1 && !(s->peers = calloc((size_t)s->group.n - 1, sizeof *s->peers))) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "session: %d ranks", s->group.n);
        goto fail;
    }
    for (int32_t r = 0; r < s->group.n; r++) {
        // each rank its pass and its share of the cache: its KV heads (the shard's config)
        tri__llama *ll = r ? &s->peers[r - 1].ll : &s->ll;
        tri__kv_policy *kv = r ? &s->peers[r - 1].kv : &s->kv;
        tri__kv_store *store = r ? &s->peers[r - 1].store : &s->store;
        tri__backend *be = s->group.be[r];
        const tri_model_config *cr = &s->group.weights[r]->config;
        if ((st = tri__llama_init(ll, s->group.weights[r], be, p.n_batch))) goto fail;
        ll->tp = s->group.tp;
        ll->rank = r;
        if (p.kv_layers_offloaded > 0) {  // the full cache, its last layers in host memory
            if ((st = tri__kv_store_init_offload(store, be, p.kv_type, cr->n_layer, cr->n_head_kv, cr->head_dim,
                                                 p.n_ctx, cr->n_layer - p.kv_layers_offloaded)))
                goto fail;
            if ((st = tri__kv_store_set_split(store, p.kv_host_fraction, p.kv_host_threads))) goto fail;
            if ((st = tri__kv_policy_wrap_full(kv, store, cr->n_head, p.n_batch))) goto fail;
        } else if ((st = tri__kv_policy_init(kv, &kp, be, p.kv_type, cr->n_layer, cr->n_head, cr->n_head_kv,
                                             cr->head_dim, p.n_ctx, p.n_batch))) {
            goto fail;
        }
    }
    // decoding over StreamingLLM: each token one recorded step, where the backend records graphs
    if (s->group.n == 1 && s->be->ops->graph_begin && tri__llama_step_supported(&s->ll, &s->kv) &&
        (st = tri__llama_step_init(&s->step, &s->ll, &s->kv, true)))
        goto fail;
    s->probs = malloc((size_t)c->n_vocab * sizeof *s->probs);
    if (!s->probs) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "session: %d-entry distribution", c->n_vocab);
        goto fail;
    }
    tri__rng_seed(&s->rng, 0);
    s->pending = -1;
    atomic_init(&s->run, TRI__RUN_IDLE);
    *out = s;
    return TRI_STATUS_OK;

fail:
    tri_session_free(s);
    return st;
}

static tri_status eval(tri_session *s, const int32_t *tokens, int32_t n, bool all_logits);

// Rank r's pass and cache.
static tri__llama *rank_ll(tri_session *s, int32_t r) { return r ? &s->peers[r - 1].ll : &s->ll; }
static tri__kv_policy *rank_kv(tri_session *s, int32_t r) { return r ? &s->peers[r - 1].kv : &s->kv; }

typedef struct eval_job {
    tri_session *s;
    const int32_t *tokens;
    int32_t n;
    tri__logits_mode mode;
} eval_job;

// One rank's share of an eval (tri__tp_run): the same tokens through its shard; rank 0's logits.
static tri_status eval_rank(void *ctx, int32_t r) {
    eval_job *j = ctx;
    if (j->n == 1 && j->mode != TRI_LOGITS_NONE && j->s->step.ll)  // the same cache and logits
        return tri__llama_step_run(&j->s->step, j->tokens[0], j->s->logits);
    return tri__llama_forward_policy(rank_ll(j->s, r), rank_kv(j->s, r), j->tokens, j->n, j->mode,
                                     r ? NULL : j->s->logits);
}

// The retrieval policy's next step selects afresh, on every rank (each over its own KV heads).
static void request_refresh(tri_session *s) {
    for (int32_t r = 0; r < s->group.n; r++) tri__kv_policy_request_refresh(rank_kv(s, r));
}

tri_status tri_session_eval(tri_session *s, const int32_t *tokens, int32_t n, bool all_logits) {
    if (!s) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_eval: session is NULL");
    s->pending = -1;  // the caller runs the cache by hand from here
    return eval(s, tokens, n, all_logits);
}

static tri_status eval(tri_session *s, const int32_t *tokens, int32_t n, bool all_logits) {
    const int32_t V = s->model->config.n_vocab;
    if (n <= 0 || !tokens) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval: %d tokens", n);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval: token %d at %d is outside the vocabulary [0, %d)",
                             tokens[i], i, V);
    int32_t rows = all_logits ? n : 1;
    if (rows > s->logits_cap) {
        float *l = realloc(s->logits, (size_t)rows * (size_t)V * sizeof *l);
        if (!l) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "eval: logits for %d tokens", rows);
        s->logits = l;
        s->logits_cap = rows;
    }
    s->n_logits = 0;
    eval_job job = {s, tokens, n, all_logits ? TRI_LOGITS_ALL : TRI_LOGITS_LAST};
    tri_status st = s->group.tp ? tri__tp_run(s->group.tp, eval_rank, &job) : eval_rank(&job, 0);
    if (st) return st;
    s->n_logits = rows;
    s->all_logits = all_logits;
    return TRI_STATUS_OK;
}

const float *tri_session_logits(const tri_session *s, int32_t i) {
    if (!s || s->n_logits == 0) return NULL;
    if (i == -1) i = s->n_logits - 1;
    if (i < 0 || i >= s->n_logits) return NULL;
    return s->logits + (int64_t)i * s->model->config.n_vocab;
}

int32_t tri_session_n_past(const tri_session *s) { return s ? tri__kv_policy_len(&s->kv) : 0; }
int32_t tri_session_n_ctx(const tri_session *s) { return s ? tri__kv_policy_capacity(&s->kv) : 0; }

tri_status tri_session_truncate(tri_session *s, int32_t n_past) {
    if (!s) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_truncate: session is NULL");
    int32_t len = tri__kv_policy_len(&s->kv);
    if (n_past < 0 || n_past > len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "truncate: %d outside [0, %d]", n_past, len);
    s->n_logits = 0;
    s->pending = -1;
    for (int32_t r = 0; r < s->group.n; r++) {
        tri_status st = tri__kv_policy_truncate(rank_kv(s, r), n_past);
        if (st) return st;
    }
    return TRI_STATUS_OK;
}

void tri_session_reset(tri_session *s) {
    if (!s) return;
    for (int32_t r = 0; r < s->group.n; r++) tri__kv_policy_reset(rank_kv(s, r));
    s->n_logits = 0;
    s->pending = -1;
    s->seeded = false;  // the next tri_generate starts its seed's stream afresh
}

void tri_session_kv_refresh(tri_session *s) {
    if (s) request_refresh(s);
}

void tri_session_seed(tri_session *s, uint64_t seed) {
    if (!s) return;
    tri__rng_seed(&s->rng, seed);
    s->seeded = true;
    s->seed = seed;
}

tri_status tri_session_sample(tri_session *s, const tri_sampler_params *params, int32_t *out) {
    if (!s || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_sample: NULL argument");
    const float *logits = tri_session_logits(s, -1);
    if (!logits) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sample: no logits (run tokens first)");
    tri_sampler_params greedy = tri_sampler_default_params();
    if (!params) params = &greedy;
    int32_t V = s->model->config.n_vocab;
    tri_status st = tri__sampler_probs(params, logits, V, s->probs, &s->scratch);
    if (st) return st;
    *out = params->temperature <= 0.0f ? tri__argmax(logits, V) : tri__sample(s->probs, V, &s->rng);
    return TRI_STATUS_OK;
}

// ---- generation ----

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


static tri_status generate(tri_session *s, const int32_t *prompt, int32_t n_prompt, const tri_generate_params *params,
                           tri_token_fn on_token, void *user, tri_generate_stats *stats,
                           tri__kv_offload_stats *at_decode);

// The offloaded cache's copies, summed over the devices (each streams its own KV heads' rows).
static void offload_stats(tri_session *s, tri__kv_offload_stats *out) {
    tri__kv_store_offload_stats(s->kv.kv, out);
    for (int32_t r = 1; r < s->group.n; r++) {
        tri__kv_offload_stats o;
        tri__kv_store_offload_stats(rank_kv(s, r)->kv, &o);
        out->bytes_up += o.bytes_up, out->bytes_down += o.bytes_down, out->bytes_host += o.bytes_host;
        out->bytes_partial += o.bytes_partial;
    }
}

tri_status tri_generate(tri_session *s, const int32_t *prompt, int32_t n_prompt,
                        const tri_generate_params *params, tri_token_fn on_token, void *user,
                        tri_generate_stats *stats) {
    tri_generate_stats local = {0};
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!s) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_generate: session is NULL");
    if (tri__textgen_wanted(params))  // stop strings, stop tokens, text: wrapped, then back here
        return tri__textgen_generate(s->model, s, NULL, prompt, n_prompt, params, on_token, user, stats);
    tri__kv_offload_stats a, b;
    offload_stats(s, &a);  // moved to the start of decoding by generate
    atomic_store(&s->run, TRI__RUN_GENERATING);
    tri_status st = generate(s, prompt, n_prompt, params, on_token, user, stats, &a);
    atomic_store(&s->run, TRI__RUN_IDLE);
    if (st) stats->stop_reason = TRI_STOP_ERROR;
    offload_stats(s, &b);
    stats->kv_bytes_up = b.bytes_up - a.bytes_up;
    stats->kv_bytes_down = b.bytes_down - a.bytes_down;
    stats->kv_bytes_host = b.bytes_host - a.bytes_host;
    return st;
}

static tri_status generate(tri_session *s, const int32_t *prompt, int32_t n_prompt, const tri_generate_params *params,
                           tri_token_fn on_token, void *user, tri_generate_stats *stats,
                           tri__kv_offload_stats *at_decode) {
    tri_generate_params p = params ? *params : tri_generate_default_params();
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate: bad prompt of %d tokens", n_prompt);
    if (n_prompt == 0 && s->n_logits == 0 && s->pending < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate: empty prompt and nothing run before");
    int32_t len = tri__kv_policy_len(&s->kv), cap = tri__kv_policy_capacity(&s->kv);
    int32_t n_pending = s->pending >= 0;
    if (n_prompt + n_pending > cap - len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "generate: prompt of %d tokens does not fit the context (%d of %d used)",
                         n_prompt + n_pending, len, cap);
    // one stream per seed: a call that continues with the same seed draws fresh numbers, so a
    // generation split over several calls samples as it would in one
    if (!s->seeded || s->seed != p.sampler.seed) tri_session_seed(s, p.sampler.seed);

    // prefill in steps of n_batch tokens, so progress can be reported and cancelled
    double t0 = now_seconds();
    if (n_pending) {  // the last call's last token comes before the prompt
        int32_t tok = s->pending;
        s->pending = -1;
        tri_status st = eval(s, &tok, 1, false);
        if (st) {
            s->pending = tok;
            return st;
        }
    }
    for (int32_t done = 0; done < n_prompt;) {
        int32_t step = n_prompt - done, piece = tri__llama_prefill_step(&s->ll, &s->kv);
        if (step > piece) step = piece;
        // the retrieval policy selects its chunks from the prompt's last query
        if (done + step == n_prompt) request_refresh(s);
        tri_status st = eval(s, prompt + done, step, false);
        if (st) return st;
        done += step;
        stats->n_prompt = done;
        bool go = !p.on_prefill || p.on_prefill(done, n_prompt, p.user);
        bool aborted = atomic_load_explicit(&s->run, memory_order_relaxed) == TRI__RUN_ABORT;
        if (!go || aborted) {
            stats->prefill_seconds = now_seconds() - t0;
            stats->stop_reason = aborted ? TRI_STOP_ABORT : TRI_STOP_CALLBACK;
            return TRI_STATUS_OK;
        }
    }
    double t1 = now_seconds();
    stats->prefill_seconds = t1 - t0;
    offload_stats(s, at_decode);

    int32_t eos = p.stop_at_eos ? tri_token_eos(s->model) : -1;
    int32_t room = cap - tri__kv_policy_len(&s->kv) + 1;  // the last token need not be run
    int32_t n_max = p.n_predict > 0 && p.n_predict < room ? p.n_predict : room;
    for (int32_t i = 0; i < n_max; i++) {
        // an abort lands between tokens: what was emitted is in the cache or pending
        if (atomic_load_explicit(&s->run, memory_order_relaxed) == TRI__RUN_ABORT) {
            stats->stop_reason = TRI_STOP_ABORT;
            break;
        }
        int32_t tok;
        tri_status st = tri_session_sample(s, &p.sampler, &tok);
        if (st) return st;
        stats->n_generated = i + 1;
        bool go = !on_token || on_token(tok, user);
        if (!go || tok == eos || i + 1 == n_max) {
            s->pending = tok;  // emitted, not run: a later call runs it first
            stats->stop_reason = !go ? TRI_STOP_CALLBACK
                                 : tok == eos ? TRI_STOP_EOS
                                 : p.n_predict > 0 && i + 1 == p.n_predict ? TRI_STOP_LENGTH
                                                                           : TRI_STOP_CONTEXT;
            break;
        }
        if ((st = eval(s, &tok, 1, false))) return st;
    }
    stats->decode_seconds = now_seconds() - t1;
    return TRI_STATUS_OK;
}

const char *tri_session_device(const tri_session *s) { return s ? s->group.name : NULL; }

// ---- applications: n_ctx, aborting, stop reasons ----

int32_t tri__session_n_ctx(const tri_model_config *c, int32_t n_ctx, const char *who) {
    if (n_ctx == 0) {
        if (c->n_ctx_train > 0) return c->n_ctx_train;
        tri__log(TRI_LOG_LEVEL_WARN, "%s: the model does not say its trained context: n_ctx 0 is 8192", who);
        return 8192;
    }
    if (c->n_ctx_train > 0 && n_ctx > c->n_ctx_train)
        tri__log(TRI_LOG_LEVEL_WARN,
                 "%s: n_ctx %d is beyond the model's trained context of %d tokens: positions past it were "
                 "never trained, and output there may degrade",
                 who, n_ctx, c->n_ctx_train);
    return n_ctx;
}

bool tri_session_abort(tri_session *s) {
    if (!s) return false;
    int expected = TRI__RUN_GENERATING;
    return atomic_compare_exchange_strong(&s->run, &expected, TRI__RUN_ABORT);
}

const char *tri_stop_reason_str(tri_stop_reason reason) {
    switch (reason) {
    case TRI_STOP_NONE: return "none";
    case TRI_STOP_EOS: return "eos";
    case TRI_STOP_LENGTH: return "length";
    case TRI_STOP_CONTEXT: return "context";
    case TRI_STOP_CALLBACK: return "callback";
    case TRI_STOP_ABORT: return "abort";
    case TRI_STOP_ERROR: return "error";
    }
    return "?";
}
