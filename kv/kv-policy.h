// kv-policy.h - KV cache policies: which past tokens each layer and KV head attends to (internal).
//
// A policy owns the keys and values it may attend to (a tri__kv_store: every position for FULL and
// RETRIEVAL; for STREAMING and H2O only what their budget, a step and a rollback need, whatever the
// length) and, per step of the forward pass, hands back the tri__kv_view the step attends to.
// docs/kv-policies.md describes each policy.
//
// One step of m tokens (the forward pass does exactly this, for every chunk of a prefill):
//   tri__kv_policy_begin(p, m, rope, q_pos)   -> positions to rotate the queries at and mask with
//   for each layer il:
//     tri__kv_policy_layer(p, il, q, k, v, &view, &ws)   q rotated at q_pos; k rotated at the
//                                                        absolute positions (unless p->raw_keys)
//     attention(..., q_pos, view, ws)
//     tri__kv_policy_observe(p, il)                      reads ws if the policy asked for it
//   tri__kv_policy_commit(p)                  or tri__kv_policy_abort(p) on failure
//
// Budgets count past tokens: a step always attends to its own tokens besides the budget (so a
// verification step of gamma tokens sees budget + gamma keys), as TriForce's caches do.
#ifndef TRI_KV_POLICY_H
#define TRI_KV_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "chunk-index.h"
#include "kv-store.h"
#include "rope.h"
#include "stream-window.h"
#include "triforce.h"

typedef struct tri__kv_policy_params {
    tri_kv_policy kind;
    int32_t budget;   // past tokens kept (not FULL); 1 <= budget <= capacity
    int32_t chunk;    // RETRIEVAL: tokens per chunk, divides budget
    int32_t sink;     // STREAMING: attention sinks, < budget
    int32_t refresh;  // RETRIEVAL: re-select once this many tokens came since the last selection
                      // (none before the first, requested one); 0: only on request
    int32_t recent;   // H2O: recent tokens always kept, < budget; 0: budget / 2
    int32_t history;  // H2O: steps remembered for rollback; 0: 8. The store then keeps
                      // 2 * budget + (history + 1) * max_step rows (fewer than the capacity)
    tri__chunk_index_kind index;  // RETRIEVAL: chunk index backend
    int32_t rollback;     // STREAMING: tokens a rollback may drop beyond the step in progress
                          // (the store keeps them); kv_type mixed: the same for the f16 ring
                          // (a speculative target's verification pass, its tree); 0: max_step
    int32_t evict_every;  // STREAMING: past the window, tokens between evictions (a step of that
                          // many attends to the window before it and to itself, TriForce's draft
                          // prefill); 0 or 1: every token, StreamingLLM's own cache; <= max_step
    bool keep_all;        // STREAMING, H2O: the store keeps every position instead of the rows the
                          // policy needs (tri__kv_policy_measure needs them)
    tri__kv_group group;  // RETRIEVAL: how a KV head's query vectors score a chunk
    int32_t window;       // RETRIEVAL: tokens of the latest complete chunks always kept besides
                          // chunk 0 (a recent window, part of the budget): window / chunk chunks,
                          // at most half of the budget's other chunks
    bool bound;           // RETRIEVAL: a chunk's summary is, per dimension, the largest and the
                          // smallest of its keys instead of their mean, and a query scores it by
                          // the bound sum_d max(q_d * max_d, q_d * min_d) on any key's logit
                          // (an inner product of [max(q, 0), min(q, 0)] with [max, min])
    int32_t queries;      // RETRIEVAL: a selection reads the queries of the last `queries` tokens
                          // the policy ran (a question, not only its last token), whatever steps
                          // they came in: a history kept across steps, rolled back with the cache
                          // and started again after adopted tokens (they did not run here) and with
                          // a tap's pass (which counts as run); fewer when fewer ran since; 0: 1
    bool mass;            // RETRIEVAL: a selection made while the policy attends to every key
                          // (the first, after the prompt; one after a rollback past every
                          // selection; one during the full cache's pass, tri__kv_policy_tap) keeps,
                          // besides chunk 0 and the window, the chunks on which full attention puts
                          // the most mass for the queries it reads (the backend's attention op with
                          // weight sums, over every key); a selection that replaces one (a refresh)
                          // uses the group rule over the chunk index. false: the index always
    int32_t follow;       // RETRIEVAL: each chunk a selection by mass (`mass`, oracle) chooses
                          // brings the `follow` chunks after it, within the budget: where a model
                          // copies, its attention reads on past the tokens it found (a passphrase's
                          // later digits); 0: none. The index's rules take none (measured: it
                          // moves their agreement both ways)
    uint64_t oracle;      // RETRIEVAL, a measurement (bench-table1), never a default: bit il set,
                          // layer il selects by full attention's mass (as `mass` does) at every
                          // selection, refreshes too (layers past 63: bit 63); own store only
                          // (UNSUPPORTED when borrowing); 0: none
    uint64_t bound_layers; // RETRIEVAL, an experiment (bench-table1 :boundA-B): bit il set, layer
                          // il summarises its chunks by bounds as `bound` does for every layer
                          // (layers past 63: bit 63); 0: none
    int32_t heavy;        // FULL with kv_type mixed: per (layer, KV head), positions past the window
                          // kept in f16 as well by their accumulated attention (MiKV's heavy
                          // hitters, H2O's scores; policy-mixed.c); 0: none
    tri_dtype gather_type; // RETRIEVAL over borrowed rows (a draft cache: L3 verifies its tokens):
                          // Q8_0 or Q4_0 stores the gathered chunks' rows quantized (the ring of
                          // its own tokens keeps the source's type; its views then carry span
                          // types, backend.h; CPU only); anything else (0): the source's type
} tri__kv_policy_params;

// The attention sinks a window of budget tokens keeps by default: 16, or half the budget under 32.
static inline int32_t tri__kv_default_sink(int32_t budget) { return budget >= 32 ? 16 : budget / 2; }

// kv_type mixed's tokens kept in f16 as well (policy-mixed.c): sink sinks (0: 16) and the recent
// window, f16 (0: 256) in all. Sets params's sink and recent; INVALID_ARGUMENT, naming who and the
// two counts, when the sinks leave no window.
#define TRI_KV_MIXED_SINK 16
#define TRI_KV_MIXED_F16 256
tri_status tri__kv_policy_mixed_rows(tri__kv_policy_params *params, int32_t sink, int32_t f16, const char *who);

// Defaults for kind (budget 4096, chunk 8, sink 16, refresh 0, exact index; retrieval: the first
// selection by full attention's mass with each chosen chunk followed by the next, refreshes by MAX
// group scoring of mean keys, a window of 32 tokens, the last 16 tokens' queries), the budget
// clipped to capacity (and the sink to half of it under 32).
tri__kv_policy_params tri__kv_policy_default_params(tri_kv_policy kind, int32_t capacity);

// Sets the budget of params, which the caller left to the default, once its chunk is known:
// 4096 rounded down to whole chunks for RETRIEVAL. When the context (capacity) is no longer than
// that, nothing would ever be evicted and the policy becomes FULL, which computes the same; the
// chunk then need not divide anything. A budget the caller gave is never adjusted: it is checked
// (tri__kv_policy_check).
void tri__kv_policy_default_budget(tri__kv_policy_params *params, int32_t capacity);

// A budget the caller gave past the context (capacity): nothing would ever be evicted, so the
// policy becomes FULL, which computes the same, as with a default budget that covers the context
// (the chunk then need not divide anything). A budget of the whole context is kept (retrieval then
// selects every chunk). No-op otherwise.
void tri__kv_policy_cover(tri__kv_policy_params *params, int32_t capacity);

// Checks params against the cache capacity; INVALID_ARGUMENT with a message naming the field.
tri_status tri__kv_policy_check(const tri__kv_policy_params *params, int32_t capacity);

typedef struct tri__h2o_state tri__h2o_state;
typedef struct tri__retrieval_state tri__retrieval_state;
typedef struct tri__kv_policy_ops tri__kv_policy_ops;
typedef struct tri__mixed_state tri__mixed_state;  // what differs per policy (kv-policy-impl.h)

typedef struct tri__kv_policy {
    tri__kv_policy_params p;
    const tri__kv_policy_ops *ops;  // the policy's own file's table, by p.kind
    tri__kv_store own;        // the keys and values, unless wrapping an outside store
    tri__kv_store *kv;        // &own, or the wrapped store (tri__kv_policy_wrap_full)
    tri__backend *be;         // not owned
    int32_t n_layer, n_head, n_head_kv, head_dim;
    int32_t max_step;         // most tokens per step
    bool raw_keys;            // the forward pass hands keys before RoPE (STREAMING)

    // ---- the step in progress ----
    bool in_step;
    int32_t step_n0;          // positions before the step
    int32_t step_m;           // tokens in the step
    int32_t step_kept;        // STREAMING: past rows in the step's view
    const tri__rope *rope;    // STREAMING: rotates the gathered keys
    int32_t *q_pos;           // (max_step) host

    // ---- view descriptors, rebuilt per layer ----
    tri__kv_span *spans;      // (spans_cap) host
    int32_t spans_cap;
    int32_t *head_span;       // (n_head_kv + 1) host
    tri__kv_view view;

    // ---- STREAMING: the step's view, gathered and rotated by cache position ----
    float *sk, *sv;           // (budget + max_step, n_head_kv * head_dim) f32 backend memory
    int32_t *gather;          // (budget + max_step) host: absolute position of each view row
    int32_t *cache_pos;       // (budget + max_step) host: 0, 1, 2, ...

    tri__h2o_state *h2o;
    tri__retrieval_state *ret;

    // ---- RETRIEVAL over borrowed rows (tri__kv_policy_init_borrowed) ----
    tri__kv_store *src;       // the full cache whose rows the policy reads; NULL: its own store
    int32_t len;              // with src or cap: positions covered (kv is then the ring of its own
                              // rows, or the bounded store)
    // ---- STREAMING with a bounded store: positions 0 .. sink - 1 in rows 0 .. sink - 1, position
    // i >= sink in row sink + (i - sink) % ring_rows; 0: the store holds every position at its row ----
    int32_t ring_rows;        // window + max_step + rollback
    int32_t cap;              // STREAMING, H2O over a bounded store (fewer rows than positions): the
                              // positions the policy may reach (the capacity it was made for); 0: none
    int32_t hw;               // the highest length written since the last reset: rows of positions
                              // below hw - ring_rows may be overwritten
    // FULL: a policy borrowing this one's rows that selects from the step ending at tap_at
    // (tri__kv_policy_tap); NULL: none
    struct tri__kv_policy *tap;
    int32_t tap_at;

    // ---- measurement (tri__kv_policy_measure) ----
    bool measure;
    float *m_ws;              // (n_head_kv * capacity) backend: full attention's weight sums
    float *m_ws_host;         // (n_head_kv * capacity) host
    float *m_out;             // (n_head * head_dim) backend scratch
    float *m_k, *m_v;         // (capacity, n_head_kv * head_dim) f32 backend: STREAMING's keys
                              // rotated at absolute positions
    float *m_q;               // (n_head * head_dim) f32 backend: STREAMING's query at its absolute position
    int32_t *m_pos;           // (capacity) host: 0, 1, 2, ...
    double mass_sum;          // sum over (layer, KV head, query) of the full-attention mass the view
                              // holds, as a fraction of the group's total
    int64_t mass_n;           // terms in mass_sum
    tri__mixed_state *mixed;  // FULL with kv_type mixed (policy-mixed.c): the f16 sinks and window
} tri__kv_policy;

// A policy over a new store of capacity positions of type kv_type (F16/F32; for FULL also Q8_0,
// Q4_0 and TRI_DTYPE_KV_MIXED: a q4_0 store with the sinks and the recent window in f16 as well,
// policy-mixed.c) in be's memory, for steps of at most max_step tokens. Checks params first. Free
// with tri__kv_policy_free.
tri_status tri__kv_policy_init(tri__kv_policy *p, const tri__kv_policy_params *params, tri__backend *be,
                               tri_dtype kv_type, int32_t n_layer, int32_t n_head, int32_t n_head_kv,
                               int32_t head_dim, int32_t capacity, int32_t max_step);
// A RETRIEVAL policy that keeps no full cache of its own: it borrows src's rows (the full-cache
// level's store, same model, possibly with offloaded layers) read-only, and owns only
//   - per layer, a backend buffer of `budget` rows per KV head, into which a selection gathers
//     its chunks out of src (from backend memory with the gather op, from an offloaded layer's
//     host region through a host staging buffer and one upload), and
//   - a ring of `ring` rows for the tokens it ran itself since its selection.
// Positions below its tail (tail0) are src's rows; positions tail0 .. len - 1 are its own, in the
// ring. Before a selection it attends fully: to src's rows [0, tail0) (an offloaded layer streams
// through src's buffers, tri__kv_store_view_read) and to the ring. A selection at length len
// (from the query history, as the own-store policy selects) chooses among
// the chunks complete in both (below bound = min(len, src->n) rounded down to whole chunks), with
// summaries made from src's keys; its view is the gathered chunks and the ring from bound on (rows
// bound .. tail0 - 1 are copied into the ring from src first). Only the current selection is kept:
// a rollback below it leaves the policy attending fully again until the next one. Adopting
// positions (tri__kv_policy_adopt, src only) drops the selection and moves the tail. The caller
// selects again before the ring fills (tri__kv_policy_room). src must hold every position below
// the tail whenever the policy runs a step: roll both back together, as the speculative engine
// does. ring >= chunk + max_step. Free with tri__kv_policy_free; src must outlive it.
tri_status tri__kv_policy_init_borrowed(tri__kv_policy *p, const tri__kv_policy_params *params, tri__kv_store *src,
                                        int32_t n_head, int32_t ring, int32_t max_step);
// A FULL policy over an existing store (not owned; kv->n is the policy's length).
tri_status tri__kv_policy_wrap_full(tri__kv_policy *p, tri__kv_store *kv, int32_t n_head, int32_t max_step);
// kv_type mixed over an existing q4_0 store (not owned; kv->n is the policy's length), whose last
// layers may be offloaded (tri__kv_store_init_offload): params as tri__kv_policy_init's for
// TRI_DTYPE_KV_MIXED (FULL; sink, recent, rollback). Its f16 rows live in kv->be's memory.
tri_status tri__kv_policy_wrap_mixed(tri__kv_policy *p, const tri__kv_policy_params *params, tri__kv_store *kv,
                                     int32_t n_head, int32_t max_step);
void tri__kv_policy_free(tri__kv_policy *p);

// Positions appended so far, and the most the store holds.
static inline int32_t tri__kv_policy_len(const tri__kv_policy *p) { return p->src || p->cap ? p->len : p->kv->n; }
static inline int32_t tri__kv_policy_capacity(const tri__kv_policy *p) {
    return p->src ? p->src->capacity : p->cap ? p->cap : p->kv->capacity;
}
// Tokens the policy can still append: up to the capacity, or, borrowing, until its ring of own
// rows is full (a selection frees it: its rows then start at the selection's bound).
int32_t tri__kv_policy_room(const tri__kv_policy *p);
// Borrowing: bytes copied host -> backend so far by its own copies (chunks gathered out of src's
// offloaded layers, rows of them put into the ring); src's own streaming is src's count. 0 else.
uint64_t tri__kv_policy_bytes_up(const tri__kv_policy *p);

// STREAMING: the window's parameters (stream-window.h), for the functions that compute a step's
// view from them on the host or on a device.
static inline tri__stream_window tri__kv_policy_window(const tri__kv_policy *p) {
    return (tri__stream_window){p->p.sink, p->p.budget, p->p.evict_every, p->ring_rows};
}

// STREAMING: the first position of the eviction interval holding position pos. Up to the budget
// nothing is evicted (one interval); past it, intervals of evict_every tokens from budget + 1 on.
// A token at pos attends to the sinks, the budget - sink positions before that start, and the
// positions from the start to itself (evict_every 1: StreamingLLM's window before the token).
static inline int32_t tri__kv_policy_evict_start(const tri__kv_policy *p, int32_t pos) {
    tri__stream_window w = tri__kv_policy_window(p);
    return tri__window_start(&w, pos);
}

// The most tokens a step at cache length len may hold for the cache to be the same however the
// caller batches: a StreamingLLM step attends to one window plus its own tokens, so all of them
// must lie in one eviction interval (tri__kv_policy_evict_start): up to the budget while nothing is
// evicted, then to the end of the interval (evict_every 1: one token per step,
// docs/kv-policies.md). No limit (INT32_MAX) for the other policies. tri__llama_forward_policy
// keeps to it.
static inline int32_t tri__kv_policy_step_limit_at(const tri__kv_policy *p, int32_t len) {
    if (p->p.kind != TRI_KV_POLICY_STREAMING) return INT32_MAX;
    if (len <= p->p.budget) return p->p.budget - len + 1;
    int32_t e = p->p.evict_every > 1 ? p->p.evict_every : 1;
    return tri__kv_policy_evict_start(p, len) + e - len;
}
// The same at the policy's length.
static inline int32_t tri__kv_policy_step_limit(const tri__kv_policy *p) {
    return tri__kv_policy_step_limit_at(p, tri__kv_policy_len(p));
}

// Starts a step of m tokens at absolute positions len .. len + m - 1 (1 <= m <= max_step, fits
// the capacity). Fills q_pos (m, host) with the positions at which the step's queries are rotated
// and masked: the absolute ones, except STREAMING (positions inside the cache). rope is kept for
// the step (STREAMING rotates keys with it) and must be the table the queries are rotated with.
tri_status tri__kv_policy_begin(tri__kv_policy *p, int32_t m, const tri__rope *rope, int32_t *q_pos);

// Layer il of the step: stores k and v (m, n_head_kv * head_dim) f32 backend memory, and returns
// in *view what the step's queries q (m, n_head * head_dim) f32 backend memory, rotated at q_pos,
// attend to, and in *weight_sums a buffer to pass to the attention op (NULL: none wanted). Both
// stay valid until the next call on p.
tri_status tri__kv_policy_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                                const tri__kv_view **view, float **weight_sums);
// After layer il's attention (with the weight sums asked for).
tri_status tri__kv_policy_observe(tri__kv_policy *p, int32_t il);
// Ends the step: the m tokens become part of the cache (evictions, chunk summaries, selection).
tri_status tri__kv_policy_commit(tri__kv_policy *p);
// At the end of a whole forward call over p (llama.c): a selection armed with tri__kv_policy_tap
// is taken when the call succeeded (ok) and reached its length, forgotten when it failed; taken
// only then, so a call that fails after the tap's step (and rolls p back) leaves ret as it was.
void tri__kv_policy_tap_settle(tri__kv_policy *p, bool ok);
// Forgets a selection armed for ret (tri__kv_policy_tap) that was not made, disarming the full
// policy; a no-op when none is armed.
void tri__kv_policy_untap(tri__kv_policy *ret);
// Abandons the step in progress, leaving the policy as before tri__kv_policy_begin (and a
// selection armed with tri__kv_policy_tap forgotten).
void tri__kv_policy_abort(tri__kv_policy *p);

// Appends positions len .. n - 1 by copying their keys and values from src, a store of the same
// shape that holds them (a full-cache level that ran the same tokens), instead of running them.
// Exact only where this policy would have computed the same rows: while it attends fully to
// everything before them, which is FULL always and RETRIEVAL before its first selection (with none
// due by the end); UNSUPPORTED for STREAMING, H2O and a RETRIEVAL cache with a selection, so the
// caller runs the tokens instead. Chunk summaries are made as a step's commit makes them.
// A policy borrowing src (tri__kv_policy_init_borrowed) copies nothing: it drops its selection and
// reads positions below n from src from now on; any other store is INVALID_ARGUMENT.
tri_status tri__kv_policy_adopt(tri__kv_policy *p, tri__kv_store *src, int32_t n);
// Positions 0 .. n - 1 were written straight into the empty policy's own store
// (tri__kv_store_load_rows: a prompt cache read from disk): takes them as tri__kv_policy_adopt
// takes copied rows, chunk summaries made, no selection, the query history empty. FULL and
// RETRIEVAL over their own store; UNSUPPORTED otherwise, INVALID_ARGUMENT unless the policy is
// empty and n fits.
tri_status tri__kv_policy_loaded(tri__kv_policy *p, int32_t n);

// Rolls back to the first n positions: the state becomes what it would be had the dropped tokens
// never been appended. H2O remembers `history` steps, a bounded STREAMING store the rows of
// max_step + rollback tokens past the window: INVALID_ARGUMENT before those.
tri_status tri__kv_policy_truncate(tri__kv_policy *p, int32_t n);
// After the store's row from was copied to row to (a token tree's accepted node moved into place,
// tri__level_move_row): a policy that keeps rows besides its store (kv_type mixed's f16 ones) moves
// its own too. No-op for the others.
tri_status tri__kv_policy_row_moved(tri__kv_policy *p, int32_t from, int32_t to);

// kv_type mixed (policy-mixed.c, p->mixed set): each query reads its own window. The first position
// whose f16 row a query at position pos reads past the sinks: max(pos - recent, sink) (pos: its
// depth in a token tree, where rows and positions differ).
int32_t tri__kv_policy_mixed_lo(const tri__kv_policy *p, int32_t pos);
// In a step, after tri__kv_policy_layer for il: the view of the step's rows [0, end) for queries
// whose window starts at lo (tri__kv_policy_mixed_lo of their position; at most a step and the
// rollback before the step's first query's). Valid until the next call on p.
const tri__kv_view *tri__kv_policy_mixed_view(tri__kv_policy *p, int32_t il, int32_t lo);

// kv_type mixed with heavy hitters (params heavy > 0): each query of a step, in order, reads its
// own view: tri__kv_policy_mixed_query admits the positions that left the window by the query at
// pos into the pool and returns its view and the weight sums to attend with (one query); after
// the attention tri__kv_policy_mixed_scored adds them to the scores.
bool tri__kv_policy_mixed_heavy(const tri__kv_policy *p);
tri_status tri__kv_policy_mixed_query(tri__kv_policy *p, int32_t il, int32_t pos, const tri__kv_view **view,
                                      float **weight_sums);
tri_status tri__kv_policy_mixed_scored(tri__kv_policy *p, int32_t il);

// Empties the cache.
void tri__kv_policy_reset(tri__kv_policy *p);
// Selecting during the full cache's pass. Arms full (FULL, the store ret borrows) so that the step
// of full that ends at length `at` (the last token of a prefill) also selects ret's chunks: per
// layer, from full's queries of the last `queries` tokens of the armed pass (of every step of it up
// to at; they then become ret's query history) and out of the rows full has just written (the
// streamed buffer of an offloaded layer: no upload), the summaries of the chunks below
// floor(at / chunk) * chunk made from the same rows, then the chunks gathered and the rows from
// that bound staged. When full's whole forward call has succeeded (tri__kv_policy_tap_settle), ret
// holds `at` positions with that selection and the staged rows in its ring, as if it had adopted
// them and selected at `at`; until then ret has no selection (it must not run meanwhile). A failed
// call leaves ret with none and its own rows as they were, and disarms full; so does
// tri__kv_policy_untap. Arming again forgets one armed before. INVALID_ARGUMENT unless ret
// borrows full's store, at is past full's length and the ring holds the rows from the bound.
tri_status tri__kv_policy_tap(tri__kv_policy *full, tri__kv_policy *ret, int32_t at);

// RETRIEVAL: select again at the end of the next step, from the query history (params.queries).
// No-op otherwise.
void tri__kv_policy_request_refresh(tri__kv_policy *p);
// RETRIEVAL: withdraws a request not yet served. No-op otherwise.
void tri__kv_policy_cancel_refresh(tri__kv_policy *p);

// ---- inspection (tests, benchmarks) ----

// RETRIEVAL: the cache length the current selection was made at; -1 when there is none.
int32_t tri__kv_policy_selected_at(const tri__kv_policy *p);
// RETRIEVAL: the chunks layer il, KV head h attends to in the current selection, ascending, into
// ids (capacity budget / chunk); returns their count, and -1 when there is no selection yet (full
// attention). *n_sel receives the length the selection was made at.
int32_t tri__kv_policy_selection(const tri__kv_policy *p, int32_t il, int32_t h, int32_t *ids, int32_t *n_sel);
// RETRIEVAL over its own store in host memory: full attention's true mass per chunk for layer il,
// KV head h, as a selection at the current length would read it, computed on the host in double
// precision (the reference the selections' own computation, by the backend's attention op, is
// tested against). The queries of the last `queries`
// tokens of the history (every query head of the group; the token at position t attends to
// positions 0 .. t) each give a softmax of q.k / sqrt(head_dim) over the keys; their probabilities
// are summed per chunk over the queries into mass (capacity: the complete chunks), and
// *rest receives the mass on the positions past the last complete chunk. The sum over mass and
// *rest is the number of query vectors. Returns the chunk count, 0 with no queries in the history,
// or a negative status (UNSUPPORTED: borrowed rows or keys in device memory).
int32_t tri__kv_policy_chunk_mass(tri__kv_policy *p, int32_t il, int32_t h, double *mass, double *rest);
// RETRIEVAL: the chunks of the recent window a selection keeps besides chunk 0: window / chunk, at
// most half of the others the budget holds.
static inline int32_t tri__kv_policy_window_chunks(const tri__kv_policy *p) {
    int32_t kmax = p->p.budget / p->p.chunk, w = p->p.window / p->p.chunk;
    return w > (kmax - 1) / 2 ? (kmax - 1) / 2 : w;
}
// RETRIEVAL: a selection by mass (params.mass, oracle) among n_chunks chunks given full attention's
// mass on each (tri__kv_policy_chunk_mass): chunk 0, the window's chunks and the most massive others
// (ties: the lower chunk), each followed by params.follow chunks (tri__chunk_keep); every chunk when
// all fit. ids (budget / chunk) receives them ascending.
// Returns their count, or a negative status.
int32_t tri__kv_policy_mass_choice(const tri__kv_policy *p, const double *mass, int32_t n_chunks, int32_t *ids);
// FULL and RETRIEVAL: copies the keys (which 0) or values (which 1) of position pos that layer il,
// KV head h attends to now (from a selected chunk, the tokens since, the own store or, borrowing,
// src, its gathered rows or its ring) into out (head_dim values of the cache type; gathered rows of
// a quantized gather_type: one row of that type). Returns false when the position is not in the
// current view (an unselected chunk, past the length) or on a copy failure. Synchronizes the backend.
bool tri__kv_policy_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out);
// H2O: the positions layer il, KV head h keeps, ascending, into pos (capacity budget + max_step);
// returns their count.
int32_t tri__kv_policy_h2o_kept(const tri__kv_policy *p, int32_t il, int32_t h, int32_t *pos);

// Benchmarks: from now on every one-token step also computes full attention over every position
// and adds to mass_sum the share of it that the policy's view holds (an extra O(context) pass).
tri_status tri__kv_policy_measure(tri__kv_policy *p);

const char *tri__kv_policy_name(tri_kv_policy kind);

// The ring the speculative engine gives its retrieval level over L3's rows: 512 tokens past a
// selection before it selects again for want of room, plus a round's drafts and a step of n_batch.
// The planner sizes L2 with it.
static inline int32_t tri__kv_l2_ring(int32_t chunk, int32_t gamma1, int32_t gamma2, int32_t n_batch) {
    return 512 + chunk + gamma1 + gamma2 + n_batch;
}

#endif  // TRI_KV_POLICY_H
