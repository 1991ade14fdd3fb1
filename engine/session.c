// session.c - the session API: a model, a backend, a KV cache; plain autoregressive decoding.
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "dtype.h"
#include "error.h"
#include "kv-policy.h"
#include "llama.h"
#include "model.h"
#include "prompt-cache.h"
#include "sampler.h"
#include "session.h"
#include "tensor-parallel.h"
#include "textgen.h"

// What ranks 1 .. N-1 of a tensor-parallel session hold (rank 0's is the session's own).
typedef struct session_rank {
    tri__llama ll;
    tri__llama batch_ll;  // the rank's share of tri_session_eval_batch's pass (tri_session.batch_ll)
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
    tri__llama batch_ll;  // tri_session_eval_batch's pass when this session leads a batch (its rows:
                          // one step of every session); unused until then
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
    int64_t n_selections; // retrieval policy: chunk selections made since create or reset
    bool all_logits;
    float *probs;         // (n_vocab) host
    int32_t *hist;        // (hist_cap) the tokens in the cache, for the sampler's penalties: the first
    int32_t hist_cap;     // n_hist of them are known (eval records them; a cache filled another way,
    int32_t n_hist;       // e.g. restored from disk, must record its tokens here too)
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
    tri__llama_free(&s->batch_ll);
    for (int32_t r = 1; s->peers && r < s->group.n; r++) {
        tri__kv_policy_free(&s->peers[r - 1].kv);
        tri__kv_store_free(&s->peers[r - 1].store);
        tri__llama_free(&s->peers[r - 1].ll);
        tri__llama_free(&s->peers[r - 1].batch_ll);
    }
    free(s->peers);
    tri__tp_group_close(&s->group);
    tri__sampler_scratch_free(&s->scratch);
    free(s->logits);
    free(s->probs);
    free(s->hist);
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
    else
        kp.sink = tri__kv_default_sink(kp.budget);
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
    const bool kv_mixed = p.kv_type == TRI_DTYPE_KV_MIXED;  // q4_0 with f16 sinks and window (policy-mixed.c)
    if (!tri__kv_type_ok(p.kv_type) && !kv_mixed)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: kv_type %s (%d): want f16, f32, q8_0, q4_0 or mixed",
                         tri_dtype_name(p.kv_type), (int)p.kv_type);
    if ((tri__dtype_is_quantized(p.kv_type) || kv_mixed) && kp.kind != TRI_KV_POLICY_FULL)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "session: kv_type %s holds only the full cache; policy %s keeps f16 or f32",
                         tri_dtype_name(p.kv_type), tri__kv_policy_name(kp.kind));
    if (kv_mixed) {  // kv_budget: the tokens kept in f16 as well, sinks (kv_sink) and window
        TRY(tri__kv_policy_mixed_rows(&kp, p.kv_sink, p.kv_budget, "session"));
        kp.heavy = p.kv_mixed_heavy;
    }
    if (p.kv_mixed_heavy < 0 || (p.kv_mixed_heavy > 0 && !kv_mixed))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "session: kv_mixed_heavy %d: kv_type mixed's heavy hitters, >= 0 "
                         "(kv_type %s)", p.kv_mixed_heavy, tri_dtype_name(p.kv_type));
    if (p.kv_mixed_heavy > 0 && p.kv_layers_offloaded > 0 && p.kv_host_fraction > 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "session: kv_mixed_heavy %d with kv_host_fraction %g: the heavy "
                         "hitters' views are not split", p.kv_mixed_heavy, p.kv_host_fraction);
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
    // its views mix two types (backend.h span_types)
    if (kv_mixed && !(s->be->ops->caps & TRI_BACKEND_CAP_TYPED_VIEWS)) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED,
                       "session: kv_type mixed is not supported on the %s backend (CPU and CUDA only)",
                       s->be->ops->name);
        goto fail;
    }
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
        ll->ar = tri__tp_allreduce_for(s->group.tp, r);
        if (p.kv_layers_offloaded > 0) {  // the full cache, its last layers in host memory (mixed: the q4_0
                                          // rows; the f16 sinks and window stay in backend memory)
            if ((st = tri__kv_store_init_offload(store, be, kv_mixed ? TRI_DTYPE_Q4_0 : p.kv_type, cr->n_layer,
                                                 cr->n_head_kv, cr->head_dim, p.n_ctx,
                                                 cr->n_layer - p.kv_layers_offloaded)))
                goto fail;
            if ((st = tri__kv_store_set_split(store, p.kv_host_fraction, p.kv_host_threads))) goto fail;
            if ((st = kv_mixed ? tri__kv_policy_wrap_mixed(kv, &kp, store, cr->n_head, p.n_batch)
                               : tri__kv_policy_wrap_full(kv, store, cr->n_head, p.n_batch)))
                goto fail;
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
    s->hist_cap = tri__kv_policy_capacity(&s->kv);
    s->hist = calloc((size_t)s->hist_cap, sizeof *s->hist);
    if (!s->probs || !s->hist) {
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

// The length of the context's first evaluation, for the rotary rules that depend on it (llama.h).
static void announce_prompt(tri_session *s, int32_t n_prompt) {
    for (int32_t r = 0; r < s->group.n; r++) tri__llama_set_prompt(rank_ll(s, r), n_prompt);
}

tri_status tri_session_eval(tri_session *s, const int32_t *tokens, int32_t n, bool all_logits) {
    if (!s) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_eval: session is NULL");
    s->pending = -1;  // the caller runs the cache by hand from here
    if (tri__kv_policy_len(&s->kv) == 0) announce_prompt(s, 0);  // this eval is the first: its length
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
    int32_t len0 = tri__kv_policy_len(&s->kv);
    eval_job job = {s, tokens, n, all_logits ? TRI_LOGITS_ALL : TRI_LOGITS_LAST};
    int32_t sel = tri__kv_policy_selected_at(&s->kv);
    tri_status st = s->group.tp ? tri__tp_run(s->group.tp, eval_rank, &job) : eval_rank(&job, 0);
    if (st) return st;
    if (len0 <= s->n_hist && len0 + n <= s->hist_cap) {
        memcpy(s->hist + len0, tokens, (size_t)n * sizeof *tokens);
        s->n_hist = len0 + n;
    }
    int32_t sel_now = tri__kv_policy_selected_at(&s->kv);
    if (sel_now >= 0 && sel_now != sel) s->n_selections++;  // a selection ends at its step
    s->n_logits = rows;
    s->all_logits = all_logits;
    return TRI_STATUS_OK;
}

// ---- batches: several sessions in shared forward passes ----

// Checks a batch before anything runs: distinct sessions of one model on one kind of device,
// tokens in the vocabulary, each session's tokens fitting its context.
static tri_status batch_check(tri_session *const *ss, const int32_t *const *tokens, const int32_t *n_tokens,
                              int32_t n) {
    if (!ss || !tokens || !n_tokens || n < 1)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_eval_batch: NULL argument or %d sessions", n);
    for (int32_t i = 0; i < n; i++) {
        const tri_session *s = ss[i];
        if (!s || !tokens[i] || n_tokens[i] < 1)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval batch: session %d is NULL or has %d tokens", i,
                             s && tokens[i] ? n_tokens[i] : 0);
        if (s->model != ss[0]->model)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval batch: session %d runs another model than session 0",
                             i);
        if (strcmp(s->group.name, ss[0]->group.name) != 0 || s->group.n != ss[0]->group.n)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "eval batch: session %d computes on %s, session 0 on %s: one device per batch", i,
                             s->group.name, ss[0]->group.name);
        for (int32_t j = 0; j < i; j++)
            if (ss[j] == s)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval batch: sessions %d and %d are the same session", j,
                                 i);
        const int32_t V = s->model->config.n_vocab;
        for (int32_t t = 0; t < n_tokens[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= V)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                                 "eval batch: session %d: token %d at %d is outside the vocabulary [0, %d)", i,
                                 tokens[i][t], t, V);
        int32_t len = tri__kv_policy_len(&s->kv), cap = tri__kv_policy_capacity(&s->kv);
        if (len > cap - n_tokens[i])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "eval batch: session %d: context full: %d tokens in the cache + %d new > capacity %d", i,
                             len, n_tokens[i], cap);
    }
    return TRI_STATUS_OK;
}

// The pass that carries a batch of rows rows, per rank: s's own, made (again) when it holds fewer.
// It computes with s's weights and backends; each other session's cache and attention stay on its
// own backend (on a GPU its own stream on the same device, whose memory the pass reads), which the
// pass waits for where their work meets. Over several devices rank r's pass all-reduces through
// s's ranks.
static tri_status batch_runner(tri_session *s, int32_t rows) {
    rows = (rows + 63) / 64 * 64;  // room to grow a little before the next reallocation
    for (int32_t r = 0; r < s->group.n; r++) {
        tri__llama *run = r ? &s->peers[r - 1].batch_ll : &s->batch_ll;
        if (run->x && run->n_batch >= rows) continue;
        tri__llama_free(run);
        TRY(tri__llama_init(run, s->group.weights[r], s->group.be[r], rows));
        run->ar = tri__tp_allreduce_for(s->group.tp, r);
    }
    return TRI_STATUS_OK;
}

// Most rows of a batched pass (activations of 1024 rows: 0.5 GiB for a 7B Llama-2), unless one
// session's step is longer.
#define BATCH_ROWS 1024

typedef struct batch_job {
    tri_session *const *ss;
    tri__llama_seq *seqs;  // (group.n, n): each rank's sequences
    int32_t n;
} batch_job;

// One rank's share of a batch (tri__tp_run): its pass over its passes and caches of every session.
static tri_status batch_rank(void *ctx, int32_t r) {
    batch_job *j = ctx;
    tri_session *s0 = j->ss[0];
    return tri__llama_forward_batch(r ? &s0->peers[r - 1].batch_ll : &s0->batch_ll, j->seqs + (int64_t)r * j->n, j->n);
}

// The batch; n_rows (NULL: 1 each) the rows of logits each session keeps, its last tokens'.
static tri_status eval_batch(tri_session *const *sessions, const int32_t *const *tokens, const int32_t *n_tokens,
                             const int32_t *n_rows, int32_t n_sessions) {
    TRY(batch_check(sessions, tokens, n_tokens, n_sessions));
    for (int32_t i = 0; n_rows && i < n_sessions; i++)
        if (n_rows[i] < 1 || n_rows[i] > n_tokens[i])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "eval batch: session %d: %d rows of logits of %d tokens", i,
                             n_rows[i], n_tokens[i]);
    tri_session *s0 = sessions[0];
    // one session alone: tri_session_eval (which takes a recorded step where it has one) for the
    // last row or every row
    if (n_sessions == 1 && (!n_rows || n_rows[0] == 1 || n_rows[0] == n_tokens[0]))
        return tri_session_eval(s0, tokens[0], n_tokens[0], n_rows && n_rows[0] > 1);
    const int32_t V = s0->model->config.n_vocab, n_rank = s0->group.n;
    tri__llama_seq *seqs = calloc((size_t)(n_sessions * n_rank), sizeof *seqs);
    if (!seqs) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "eval batch: %d sessions", n_sessions);
    // a pass holds one step of every session (the sum of their first steps), up to BATCH_ROWS rows
    // unless one step is longer: the steps that do not fit wait for the next pass
    int32_t rows = 0, most = 0;
    tri_status st = TRI_STATUS_OK;
    for (int32_t i = 0; !st && i < n_sessions; i++) {
        tri_session *s = sessions[i];
        int32_t nb = s->ll.n_batch, keep = n_rows ? n_rows[i] : 1;
        rows += n_tokens[i] < nb ? n_tokens[i] : nb;
        most = nb > most ? nb : most;
        if (s->logits_cap < keep) {
            float *l = realloc(s->logits, (size_t)keep * (size_t)V * sizeof *l);
            if (!l) st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "eval batch: logits of %d rows", keep);
            else s->logits = l, s->logits_cap = keep;
        }
        // several rows: ALL from the first kept token on (the same head over the same rows)
        tri__logits_mode mode = keep > 1 ? TRI_LOGITS_ALL : TRI_LOGITS_LAST;
        int32_t skip = keep > 1 ? n_tokens[i] - keep : 0;
        for (int32_t r = 0; !st && r < n_rank; r++)
            seqs[r * n_sessions + i] =
                (tri__llama_seq){rank_ll(s, r), rank_kv(s, r), tokens[i], n_tokens[i], mode, r ? NULL : s->logits, skip};
    }
    if (rows > BATCH_ROWS) rows = BATCH_ROWS;
    if (!st) st = batch_runner(s0, rows > most ? rows : most);
    int32_t *len0 = malloc(sizeof *len0 * (size_t)n_sessions), *sel = malloc(sizeof *sel * (size_t)n_sessions);
    if (!st && (!len0 || !sel)) st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "eval batch: %d sessions", n_sessions);
    for (int32_t i = 0; !st && i < n_sessions; i++) {  // as tri_session_eval
        tri_session *s = sessions[i];
        s->pending = -1;
        len0[i] = tri__kv_policy_len(&s->kv);
        if (len0[i] == 0) announce_prompt(s, 0);
        sel[i] = tri__kv_policy_selected_at(&s->kv);
        s->n_logits = 0;
    }
    batch_job job = {sessions, seqs, n_sessions};
    if (!st) st = s0->group.tp ? tri__tp_run(s0->group.tp, batch_rank, &job) : batch_rank(&job, 0);
    for (int32_t i = 0; !st && i < n_sessions; i++) {  // as eval after its pass
        tri_session *s = sessions[i];
        int32_t n = n_tokens[i];
        if (len0[i] <= s->n_hist && len0[i] + n <= s->hist_cap) {
            memcpy(s->hist + len0[i], tokens[i], (size_t)n * sizeof *tokens[i]);
            s->n_hist = len0[i] + n;
        }
        int32_t sel_now = tri__kv_policy_selected_at(&s->kv);
        if (sel_now >= 0 && sel_now != sel[i]) s->n_selections++;
        s->n_logits = n_rows ? n_rows[i] : 1;
        s->all_logits = s->n_logits > 1;
    }
    free(seqs), free(len0), free(sel);
    return st;
}

tri_status tri_session_eval_batch(tri_session *const *sessions, const int32_t *const *tokens, const int32_t *n_tokens,
                                  int32_t n_sessions) {
    return eval_batch(sessions, tokens, n_tokens, NULL, n_sessions);
}

tri_status tri_session_eval_batch_rows(tri_session *const *sessions, const int32_t *const *tokens,
                                       const int32_t *n_tokens, const int32_t *n_rows, int32_t n_sessions) {
    return eval_batch(sessions, tokens, n_tokens, n_rows, n_sessions);
}

int32_t tri_batch_plan(const int32_t *n_left, int32_t n, int32_t budget, int32_t *n_take) {
    if (!n_left || !n_take || n < 0 || budget < 1) return -1;
    int32_t total = 0, n_prefill = 0;
    for (int32_t i = 0; i < n; i++) {
        if (n_left[i] < 0) return -1;
        n_take[i] = n_left[i] == 1;  // decode steps first, whatever the budget
        total += n_take[i];
        n_prefill += n_left[i] > 1;
    }
    // the prompts share what is left in equal parts, again and again while some take less
    while (total < budget && n_prefill > 0) {
        int32_t share = (budget - total) / n_prefill, open = 0;
        if (share < 1) share = 1;
        for (int32_t i = 0; i < n && total < budget; i++) {
            if (n_left[i] <= 1 || n_take[i] == n_left[i]) continue;
            int32_t give = n_left[i] - n_take[i] < share ? n_left[i] - n_take[i] : share;
            if (give > budget - total) give = budget - total;
            n_take[i] += give;
            total += give;
            open += n_take[i] < n_left[i];
        }
        n_prefill = open;
    }
    return total;
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
    if (s->n_hist > n_past) s->n_hist = n_past;
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
    s->n_hist = 0;
    s->seeded = false;  // the next tri_generate starts its seed's stream afresh
    s->n_selections = 0;
}

void tri_session_kv_refresh(tri_session *s) {
    if (s) request_refresh(s);
}

tri_status tri_session_kv_info(const tri_session *s, tri_kv_info *out) {
    if (!s || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_kv_info: NULL argument");
    const tri__kv_policy *p = &s->kv;
    memset(out, 0, sizeof *out);
    out->policy = p->p.kind;
    out->n_past = tri__kv_policy_len(p);
    out->n_ctx = tri__kv_policy_capacity(p);
    if (p->p.kind != TRI_KV_POLICY_FULL) out->budget = p->p.budget;
    if (p->p.kind == TRI_KV_POLICY_RETRIEVAL) {
        out->chunk = p->p.chunk;
        out->refresh = p->p.refresh;
        out->n_selections = s->n_selections;
        out->selected_at = tri__kv_policy_selected_at(p);
    } else {
        out->selected_at = -1;
    }
    if (p->p.kind == TRI_KV_POLICY_STREAMING) out->sink = p->p.sink;
    return TRI_STATUS_OK;
}

void tri_session_seed(tri_session *s, uint64_t seed) {
    if (!s) return;
    tri__rng_seed_param(&s->rng, seed);
    s->seeded = true;
    s->seed = seed;
}

tri_status tri_session_sample(tri_session *s, const tri_sampler_params *params, int32_t *out) {
    if (!s || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_sample: NULL argument");
    const float *logits = tri_session_logits(s, -1);
    if (!logits) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sample: no logits (run tokens first)");
    tri_sampler_params greedy = tri_sampler_default_params();
    if (!params) params = &greedy;
    TRY(tri_sampler_params_check(params));
    int32_t V = s->model->config.n_vocab;
    // the context the logits follow: the tokens in the cache (every one eval ran is in hist)
    int32_t n_ctx = tri__kv_policy_len(&s->kv);
    if (n_ctx > s->n_hist) n_ctx = s->n_hist;
    if (params->temperature <= 0.0f) return tri__sampler_greedy(params, s->hist, n_ctx, logits, V, &s->scratch, out);
    TRY(tri__sampler_probs(params, s->hist, n_ctx, logits, V, s->probs, &s->scratch));
    *out = tri__sample(s->probs, V, &s->rng);
    return TRI_STATUS_OK;
}

// ---- generation ----

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
    TRY(tri_sampler_params_check(&p.sampler));
    int32_t len = tri__kv_policy_len(&s->kv), cap = tri__kv_policy_capacity(&s->kv);
    int32_t n_pending = s->pending >= 0;
    if (n_prompt + n_pending > cap - len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "generate: prompt of %d tokens does not fit the context (%d of %d used)",
                         n_prompt + n_pending, len, cap);
    // one stream per seed: a call that continues with the same seed draws fresh numbers, so a
    // generation split over several calls samples as it would in one
    if (!s->seeded || s->seed != p.sampler.seed) tri_session_seed(s, p.sampler.seed);

    // prefill in steps of n_batch tokens, so progress can be reported and cancelled: the whole
    // prompt is the context's first evaluation (rope.h)
    if (len == 0) announce_prompt(s, n_prompt + n_pending);
    double t0 = tri__now_seconds();
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
            stats->prefill_seconds = tri__now_seconds() - t0;
            stats->stop_reason = aborted ? TRI_STOP_ABORT : TRI_STOP_CALLBACK;
            return TRI_STATUS_OK;
        }
    }
    double t1 = tri__now_seconds();
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
    stats->decode_seconds = tri__now_seconds() - t1;
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
    case TRI_STOP_STRING: return "stop_string";
    }
    return "?";
}

// ---- prompt cache (prompt-cache.h) ----

// The store a prompt cache reads and writes: the FULL policy's own, or the offloaded one it wraps.
static tri_status cache_store(tri_session *s, const char *path, const char *what, tri__kv_store **out) {
    if (s->group.n > 1)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "prompt cache %s: cannot %s a session over %d devices", path, what,
                         s->group.n);
    tri_kv_policy kind = s->kv.p.kind;
    if ((kind != TRI_KV_POLICY_FULL && kind != TRI_KV_POLICY_RETRIEVAL) || s->kv.src || s->kv.cap)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "prompt cache %s: cannot %s a %s cache: only the full and retrieval policies' caches, which "
                         "hold every row, are saved and loaded",
                         path, what, tri__kv_policy_name(kind));
    if (s->kv.mixed)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "prompt cache %s: cannot %s a cache of kv_type mixed (its f16 rows "
                         "are not in the file format)", path, what);
    *out = s->kv.kv;
    return TRI_STATUS_OK;
}

static void cache_header(tri_session *s, const tri__kv_store *kv, tri__pcache_header *h) {
    memset(h, 0, sizeof *h);
    h->model_id = tri__pcache_model_id(s->model);
    h->n_layer = kv->n_layer;
    h->n_head_kv = kv->n_head_kv;
    h->head_dim = kv->head_dim;
    h->kv_type = (int32_t)kv->type;
    h->n_vocab = s->model->config.n_vocab;
    h->n_ctx = kv->capacity;
    h->n_prompt = (int32_t)rank_ll(s, 0)->rope.n_prompt;  // 0 unless the rope depends on the length
}

static void cache_stats(tri_prompt_cache_stats *out, int32_t n, int32_t n_file, bool logits, const tri__pcache_io *io) {
    if (!out) return;
    *out = (tri_prompt_cache_stats){.n_tokens = n,
                                    .n_file = n_file,
                                    .logits = logits,
                                    .bytes = io->bytes,
                                    .seconds = io->seconds,
                                    .uring = io->uring,
                                    .direct = io->direct};
    out->gbps = io->seconds > 0 ? (double)io->bytes / io->seconds / 1e9 : 0;
}

// A block's payload: per layer, K rows then V rows of its nb tokens.
static tri_status cache_fill(void *user, int32_t b, int32_t tok0, int32_t nb, void *buf) {
    (void)b;
    tri__kv_store *kv = user;
    size_t rows = (size_t)nb * (size_t)tri__kv_store_row_bytes(kv);
    char *p = buf;
    for (int32_t il = 0; il < kv->n_layer; il++)
        for (int which = 0; which < 2; which++, p += rows) TRY(tri__kv_store_read_rows(kv, il, which, tok0, nb, p));
    return TRI_STATUS_OK;
}

static tri_status cache_take(void *user, int32_t b, int32_t tok0, int32_t nb, int32_t n_use, const void *buf) {
    (void)b;
    tri__kv_store *kv = user;
    size_t rows = (size_t)nb * (size_t)tri__kv_store_row_bytes(kv);
    const char *p = buf;
    for (int32_t il = 0; il < kv->n_layer; il++, p += 2 * rows)
        TRY(tri__kv_store_load_rows(kv, il, tok0, n_use, p, p + rows));
    return TRI_STATUS_OK;
}

tri_status tri_session_save_prompt(tri_session *s, const char *path, const int32_t *tokens, int32_t n_tokens,
                                   tri_prompt_cache_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!s || !path || (!tokens && n_tokens > 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_save_prompt: NULL argument");
    tri__kv_store *kv = NULL;
    TRY(cache_store(s, path, "save", &kv));
    int32_t len = tri__kv_policy_len(&s->kv);
    if (n_tokens < 1 || n_tokens != len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "prompt cache %s: %d tokens given for a session holding %d (save after a prefill, with the "
                         "tokens it ran)",
                         path, n_tokens, len);
    const int32_t V = s->model->config.n_vocab;
    for (int32_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "prompt cache %s: token %d at %d is outside [0, %d)", path,
                             tokens[i], i, V);
    tri__pcache_header h;
    cache_header(s, kv, &h);
    h.n_tokens = n_tokens;
    const float *logits = tri_session_logits(s, -1);
    if (logits) h.flags |= TRI_PCACHE_LOGITS;
    tri__pcache_io io = {0};
    TRY(tri__pcache_write(path, &h, tokens, logits, cache_fill, kv, &io));
    cache_stats(stats, n_tokens, n_tokens, logits != NULL, &io);
    tri__log(TRI_LOG_LEVEL_INFO, "prompt cache %s: %d tokens written, %.1f MB in %.3f s (%.2f GB/s, %s%s)", path,
             n_tokens, (double)io.bytes / 1e6, io.seconds, stats ? stats->gbps : 0, io.uring ? "io_uring" : "pwrite",
             io.direct ? ", O_DIRECT" : "");
    return TRI_STATUS_OK;
}

tri_status tri_session_load_prompt(tri_session *s, const char *path, const int32_t *tokens, int32_t n_tokens,
                                   tri_prompt_cache_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!s || !path || (!tokens && n_tokens > 0) || n_tokens < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_session_load_prompt: NULL argument or %d tokens", n_tokens);
    tri_session_reset(s);
    tri__kv_store *kv = NULL;
    TRY(cache_store(s, path, "load", &kv));
    tri__pcache_file *f;
    TRY(tri__pcache_open(path, &f));
    const tri__pcache_header *fh = tri__pcache_file_header(f);
    tri__pcache_header h;
    cache_header(s, kv, &h);
    const tri_model_config *c = &s->model->config;
    tri_status st = TRI_STATUS_OK;
    if (fh->model_id != h.model_id)
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                       "prompt cache %s: written for another model (identity %016llx, this model's %016llx)", path,
                       (unsigned long long)fh->model_id, (unsigned long long)h.model_id);
    else if (fh->n_layer != h.n_layer || fh->n_head_kv != h.n_head_kv || fh->head_dim != h.head_dim ||
             fh->n_vocab != h.n_vocab)
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                       "prompt cache %s: cache of %d layers x %d KV heads x %d, %d-token vocabulary; the session's is "
                       "%d x %d x %d, %d",
                       path, fh->n_layer, fh->n_head_kv, fh->head_dim, fh->n_vocab, h.n_layer, h.n_head_kv, h.head_dim,
                       h.n_vocab);
    else if (fh->kv_type != h.kv_type)
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT, "prompt cache %s: KV type %s; the session's is %s", path,
                       tri_dtype_name((tri_dtype)fh->kv_type), tri_dtype_name((tri_dtype)h.kv_type));
    else if (n_tokens > 0 && !tri__rope_same_prompt(&rank_ll(s, 0)->rope, fh->n_prompt, n_tokens))
        // the rows were rotated with the tables of the writer's first length, P (rope.h); this
        // prompt, run afresh, takes those of its own length
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                       "prompt cache %s: written after a first evaluation of %d tokens; the model's rope scaling (%s) "
                       "rotates a prompt of %d tokens with other tables, so the cached rows do not fit it",
                       path, fh->n_prompt, c->rope_scaling == TRI_ROPE_SCALING_DYNAMIC ? "dynamic NTK" : "LongRoPE",
                       n_tokens);
    if (st) {
        tri__pcache_close(f);
        return st;
    }
    // the longest common prefix; all of it with the logits only when it is the whole of both
    const int32_t *ft = tri__pcache_tokens(tri__pcache_file_region(f));
    int32_t common = 0, most = fh->n_tokens < n_tokens ? fh->n_tokens : n_tokens;
    while (common < most && ft[common] == tokens[common]) common++;
    const float *flogits = tri__pcache_logits(fh, tri__pcache_file_region(f));
    bool with_logits = flogits && common == fh->n_tokens && common == n_tokens;
    int32_t use = with_logits ? common : common < n_tokens ? common : n_tokens - 1;
    if (use < 0) use = 0;  // an empty prompt reuses nothing
    if (use > kv->capacity) use = kv->capacity, with_logits = false;
    if (s->kv.p.kind == TRI_KV_POLICY_RETRIEVAL) {
        // the selection after the prompt reads the queries of its last tokens: they run again
        int32_t q = s->kv.p.queries > 0 ? s->kv.p.queries : 1;
        if (use > n_tokens - q) use = n_tokens - q > 0 ? n_tokens - q : 0;
        with_logits = false;
    }
    if (with_logits && s->logits_cap < 1) {
        float *l = malloc((size_t)h.n_vocab * sizeof *l);
        if (!l) st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: logits", path);
        s->logits = l ? l : s->logits;
        s->logits_cap = l ? 1 : s->logits_cap;
    }
    tri__pcache_io io = {0};
    int32_t taken = use;
    if (!st) st = tri__pcache_read(f, use, cache_take, kv, &io, &taken);
    bool damaged = !st && taken < use;  // a block failed its checksum: the good prefix before it
    if (damaged) use = taken, with_logits = false;
    if (!st) st = tri__kv_policy_loaded(&s->kv, use);
    // what follows the prefix is rotated as in a fresh run of the whole prompt, whose first
    // evaluation it is (rope.h); the loaded rows have those tables already (checked above)
    if (!st) announce_prompt(s, n_tokens);
    if (!st && use > 0 && use <= s->hist_cap) {  // the tokens the sampler's penalties look back over
        memcpy(s->hist, tokens, (size_t)use * sizeof *tokens);
        s->n_hist = use;
    }
    if (!st && with_logits) {
        memcpy(s->logits, flogits, (size_t)h.n_vocab * sizeof *s->logits);
        s->n_logits = 1;
        s->all_logits = false;
    }
    int32_t n_file = fh->n_tokens;
    tri__pcache_close(f);
    if (st) {
        tri_session_reset(s);
        return st;
    }
    cache_stats(stats, use, n_file, with_logits, &io);
    if (stats) stats->damaged = damaged;
    tri__log(TRI_LOG_LEVEL_INFO,
             "prompt cache %s: %d of its %d tokens reused, %.1f MB read in %.3f s (%.2f GB/s, %s%s)", path, use, n_file,
             (double)io.bytes / 1e6, io.seconds, stats ? stats->gbps : 0, io.uring ? "io_uring" : "pread",
             io.direct ? ", O_DIRECT" : "");
    return TRI_STATUS_OK;
}

tri_status tri_prompt_cache_writable(const char *path) {
    if (!path) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_prompt_cache_writable: NULL path");
    return tri__pcache_may_replace(path);
}

tri_status tri_prompt_cache_tokens(const char *path, int32_t **tokens, int32_t *n_tokens) {
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    if (!path || !tokens || !n_tokens)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_prompt_cache_tokens: NULL argument");
    tri__pcache_file *f;
    TRY(tri__pcache_open(path, &f));
    const tri__pcache_header *h = tri__pcache_file_header(f);
    int32_t *t = malloc((size_t)h->n_tokens * sizeof *t);
    if (!t) {
        tri__pcache_close(f);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: %d tokens", path, h->n_tokens);
    }
    memcpy(t, tri__pcache_tokens(tri__pcache_file_region(f)), (size_t)h->n_tokens * sizeof *t);
    *tokens = t;
    *n_tokens = h->n_tokens;
    tri__pcache_close(f);
    return TRI_STATUS_OK;
}
