// level.h - one level of the speculative hierarchy: a model, its forward pass and its KV cache
// policy (internal).
//
// The speculative engine (spec.c) talks to levels only through this adapter. Each level owns a
// cache policy from kv/kv-policy.h and runs through tri__llama_forward_policy: L1 drafts
// over StreamingLLM, L2 is the target over the retrieval cache, L3 the target over the full
// cache. A policy that would evict nothing (a budget or window of the whole context) is served by
// the full policy, so that such a level computes exactly what a full-cache level does. Defaults are
// the engine's business (spec.c): a level checks the values it is given.
#ifndef TRI_LEVEL_H
#define TRI_LEVEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv-policy.h"
#include "llama.h"
#include "triforce.h"

typedef struct tri__level_params {
    tri_kv_policy policy;  // FULL (L3), STREAMING (L1) or RETRIEVAL (L2); H2O is not a level's
    int32_t n_ctx;         // positions of context the level must serve (prompt + generated)
    int32_t n_batch;       // tokens per internal step of a long prefill
    tri_dtype kv_type;     // F16 or F32; FULL also Q8_0, Q4_0 and TRI_DTYPE_KV_MIXED (budget: the
                           // tokens kept in f16 too, sink: its sinks, rollback: the f16 ring's
                           // rollback beyond a step; 0: 256, 16, n_batch)
    int32_t budget;        // STREAMING: sink + recent tokens kept; RETRIEVAL: tokens of selected
                           // chunks; 1 <= budget <= n_ctx (checked, never adjusted); n_ctx:
                           // nothing is evicted, the level is FULL
    int32_t chunk;         // RETRIEVAL: tokens per chunk, divides budget
    int32_t sink;          // STREAMING: attention-sink tokens, < budget
    tri__chunk_index_kind index;  // RETRIEVAL: the chunk index (0: exact scan)
    int32_t kv_offloaded;  // FULL: layers (the last ones) whose cache lives in host memory and
                           // streams through the device per pass (kv-store.h); 0: none
    tri__kv_store *kv_source;  // RETRIEVAL: the full-cache level's store, whose rows the level
                           // borrows instead of keeping a full cache (tri__kv_policy_init_borrowed);
                           // NULL: a cache of its own. Same model; must outlive the level.
    int32_t ring;          // with kv_source: rows of its own tokens since a selection (>= chunk + n_batch)
    tri__act_pool *acts;   // activations shared with the other levels (llama.h; the caller binds
                           // the pool once every level joined); NULL: the level's own
    double kv_host_fraction; // with kv_offloaded: of each offloaded layer's rows, the fraction the
    int32_t kv_host_threads; //   host attends where they lie, with these threads (kv-store.h)
    int32_t rollback;      // STREAMING: tokens a rollback may drop (the store keeps sink + window +
                           // n_batch + rollback rows, not the context); 0: n_batch
    int32_t evict_every;   // STREAMING: past the window, tokens between evictions (kv-policy.h);
                           // 0 or 1: every token; at most n_batch
    tri_dtype gather_type; // RETRIEVAL with kv_source: Q8_0 / Q4_0 quantizes the gathered chunks
                           // (kv-policy.h, gather_type); else (0) kv_source's type
} tri__level_params;

typedef struct tri__level {
    const tri_model *model;  // not owned
    tri__backend *be;        // not owned
    tri__level_params params;  // as given to init
    tri__llama ll;
    tri__kv_policy pol;      // the cache; pol.p.kind is the policy really served
    tri__kv_store store;     // with offloaded layers: the store pol wraps (FULL); else unused
    tri__llama_step step;    // STREAMING on a backend with graphs: one-token evals run as a recorded
                             // step computed from backend memory (llama.h); else unused (step.ll NULL)
    float *logits;           // (logits_cap, n_vocab) host: rows of the last eval
    int32_t logits_cap;
    int32_t n_logits;        // rows valid after the last eval
    int32_t *refresh_at;     // (refresh_cap) RETRIEVAL: cache lengths at which the chunks were
                             // selected afresh (tri__level_eval_refresh), ascending
    int32_t *refresh_from;   // (refresh_cap) for each of them, the length where the full level's pass
                             // that made it began (tri__level_select_during); -1: the level's own step
    int32_t n_refresh, refresh_cap;
    int32_t adopted;         // the length the last tri__level_adopt reached, lowered by rollbacks: a
                             // retrieval level's query history holds no token before it (adopted
                             // tokens ran elsewhere), so a replay of the level adopts there too
    double seconds;          // wall time spent in eval, accumulated
    int64_t n_evals;         // forward passes run
    // tensor parallelism (tensor-parallel.h): this level is rank 0's; peers (n_ranks - 1, owned)
    // are ranks 1 .. over the other devices' shards. Every call below that runs tokens runs them on
    // every rank at once (tp's threads); the others (rollback, adoption, selections) go to each rank
    // in turn; queries and logits read rank 0. n_ranks 1: one device.
    struct tri__level *peers;
    int32_t n_ranks;
    struct tri__tp *tp;
    // speculative decoding in batches (spec-batch.c): the seat of the engine's generation in a
    // batch, whose passes of this level join the other engines' passes over the same weights; NULL:
    // every pass runs alone. Only on a level of one rank.
    struct tri__batch_seat *seat;
} tri__level;

// Allocates the level's cache and buffers on be. model and be must outlive the level.
// INVALID_ARGUMENT for parameters the policy refuses (kv-policy.h).
tri_status tri__level_init(tri__level *lv, const tri_model *model, tri__backend *be,
                           const tri__level_params *params);
// Frees what init allocated (and the peers); a zeroed level is a no-op.
void tri__level_free(tri__level *lv);

// Makes lv (rank 0, initialised) and peers (n_ranks - 1 levels initialised on ranks 1 .. of tp with
// the same parameters over their shards, in one malloc'd array) one tensor-parallel level: lv takes
// the array and frees it with itself; their passes all-reduce over tp.
void tri__level_set_ranks(tri__level *lv, tri__level *peers, int32_t n_ranks, struct tri__tp *tp);
// Rank r's level: lv itself for r == 0.
static inline tri__level *tri__level_rank(tri__level *lv, int32_t r) { return r ? &lv->peers[r - 1] : lv; }

// Runs tokens (n >= 1) after the n_past already cached and caches them. all_logits: one row of
// logits per token, else only the last token's row; tri__level_logits reads them.
// INVALID_ARGUMENT when they do not fit the context. A STREAMING level runs them one token per
// step once its window is full (before that, a step of several tokens computes the same), so that
// its cache depends only on the tokens, not on how the engine batched them: it is the cache that
// one-token steps build (a step attends to its own tokens besides the window, docs/kv-policies.md).
tri_status tri__level_eval(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits);
// tri__level_eval of n tokens with all logits over a FULL level whose last tree->n tokens form a
// token tree (tri__kv_tree, backend.h: rows row0 .. row0 + n - 1 with row0 + tree->n = n_past + n),
// each rotated at tree_pos[i] (its prefix length + depth) and attending to its ancestors; the rows
// stay in the cache (tri__level_move_row keeps a path's, tri__level_truncate drops the rest).
// UNSUPPORTED for other policies.
tri_status tri__level_eval_tree(tri__level *lv, const int32_t *tokens, int32_t n, const tri__kv_tree *tree,
                                const int32_t *tree_pos);
// Copies the keys and values of cached row from into row to (both < n_past) in every layer, on
// every rank, wherever the layer lives: an accepted tree node's row moved to its place in the path.
// FULL levels only (UNSUPPORTED otherwise).
tri_status tri__level_move_row(tri__level *lv, int32_t from, int32_t to);
// As tri__level_eval with all_logits, appending the n rows after the rows already there.
tri_status tri__level_eval_more(tri__level *lv, const int32_t *tokens, int32_t n);
// As tri__level_eval with the last row only, and a RETRIEVAL level then selects its chunks
// afresh at the length after it, from its query history (the last `queries` tokens it ran,
// whatever steps they came in: kv-policy.h); the last token runs in a step of its own. The length
// is appended to refresh_at. Other policies: a plain eval.
tri_status tri__level_eval_refresh(tri__level *lv, const int32_t *tokens, int32_t n);
// Arms full (a FULL level, the store lv borrows) so that its pass ending at length `at` also
// selects lv's chunks, from full's queries of the pass's last tokens and the rows it has just
// written (tri__kv_policy_tap: no
// extra pass, no upload of offloaded rows). lv must not run before that pass; then
// tri__level_took_selection records it.
tri_status tri__level_select_during(tri__level *lv, tri__level *full, int32_t at);
// After the pass armed by tri__level_select_during: whether lv took its selection (recorded in
// refresh_at); false when the pass did not reach it or failed.
bool tri__level_took_selection(tri__level *lv);
// Runs tokens only to fill the cache (a prefill), in steps of n_batch; no logits. A STREAMING
// level steps as in tri__level_eval, so a prefill builds the same cache as evals of one token.
tri_status tri__level_prefill(tri__level *lv, const int32_t *tokens, int32_t n);

// Caches positions n_past .. n - 1 by copying them from `from`'s cache (which holds them, for
// the same model and tokens) instead of running them, where that is exact (tri__kv_policy_adopt);
// UNSUPPORTED otherwise, and the caller runs the tokens.
tri_status tri__level_adopt(tri__level *lv, tri__level *from, int32_t n);

// Row i (n_vocab floats) of the last eval's logits, i in [0, n_logits); NULL otherwise.
const float *tri__level_logits(const tri__level *lv, int32_t i);

// Rolls the cache back to its first n_past positions (0 <= n_past <= tri__level_n_past), exactly
// as if the dropped tokens had never been run: selections made after n_past are dropped too.
// Exact for every policy a level serves, however far back: FULL and STREAMING hold nothing but
// the store, and a RETRIEVAL level selects only inside tri__level_eval_refresh, so no rollback
// can land in a step that would have selected (docs/speculative.md, "Caches and rollback"). A
// STREAMING level keeps only `rollback` tokens past its window: asked to go further back, it
// empties itself (n_past 0), and the caller runs the tokens again.
tri_status tri__level_truncate(tri__level *lv, int32_t n_past);

// Positions cached.
int32_t tri__level_n_past(const tri__level *lv);
// Tokens the level can still run before it must select again (a retrieval level over borrowed
// rows, whose ring of own rows fills) or its context is full.
int32_t tri__level_room(const tri__level *lv);
// Positions the level can hold.
int32_t tri__level_n_ctx(const tri__level *lv);
// The length the current selection was made at (tri__level_eval_refresh), -1 when none: never
// selected, or rolled back below it with no earlier one kept (a level over borrowed rows keeps
// only the current selection), or positions adopted since (which drops it, borrowing).
int32_t tri__level_last_refresh(const tri__level *lv);

// Runs tokens on lv as tri__llama_forward_policy(&lv->ll, &lv->pol, tokens, n, mode, dst) would,
// in the next batched pass of seat's batch together with the other generations' passes over the
// same weights (tri__llama_forward_batch: bit for bit the same cache and logits on the CPU);
// blocks until that pass ran (spec-batch.c).
tri_status tri__batch_seat_run(struct tri__batch_seat *seat, tri__level *lv, const int32_t *tokens, int32_t n,
                               tri__logits_mode mode, float *dst);

// ---- layer-skipping self-draft ----

// A model that runs only the listed layers of base (n_layers indices, strictly increasing, each in
// [0, base n_layer)), sharing base's weights: a borrowed view, not a loaded model. Free it with
// tri__model_view_free, never tri_model_free; base must outlive it.
tri_status tri__model_layer_view(const tri_model *base, const int32_t *layers, int32_t n_layers,
                                 tri_model **out);
void tri__model_view_free(tri_model *view);

#endif  // TRI_LEVEL_H
