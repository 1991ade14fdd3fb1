// llama.h - the Llama forward pass, written once against the backend interface (internal).
#ifndef TRI_LLAMA_H
#define TRI_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "model.h"
#include "rope.h"

typedef struct tri__act_pool tri__act_pool;

// Everything one forward pass needs besides the cache: the model's weights (host memory on the
// CPU backend), the rope table, and activation buffers sized for n_batch tokens (its own, or a
// pool's shared with other passes).
// Tensor parallelism's all-reduce, given by whoever splits the model (engine/tensor-parallel.c):
// sum adds x (n floats, backend memory of rank's device) over the ranks, in place, every rank
// getting the sum. The forward pass only calls it; it knows nothing of ranks' threads or links.
typedef struct tri__allreduce {
    tri_status (*sum)(void *ctx, int32_t rank, float *x, int64_t n);  // NULL: one device
    void *ctx;
    int32_t rank;
    bool recordable;  // sum may be recorded in a backend graph (a device collective such as NCCL's)
} tri__allreduce;

typedef struct tri__llama {
    const tri_model *model;
    tri__backend *be;     // not owned
    tri__rope rope;
    int32_t n_batch;      // most tokens per internal step; longer inputs are processed in chunks
    int32_t n_logits;     // rows of the logits buffer (0 until first needed)

    // activations in backend memory, f32:
    float *x;       // (n_batch, n_embd) residual stream
    float *xb;      // (n_batch, n_embd) normalised input of a block
    float *q;       // (n_batch, n_head * head_dim)
    float *k;       // (n_batch, n_head_kv * head_dim)
    float *v;       // (n_batch, n_head_kv * head_dim)
    float *att;     // (n_batch, n_head * head_dim)
    float *proj;    // (n_batch, n_embd) output of attn_output / ffn_down
    float *gate;    // (n_batch, n_ff)
    float *up;      // (n_batch, n_ff)
    float *logits;  // (n_logits, n_vocab)
    int32_t *pos;   // (n_batch) host: absolute positions of the current chunk (keys rotate at them)
    int32_t *q_pos; // (n_batch) host: positions the cache policy rotates and masks queries at
    // A token tree among the next passes' rows (tri__kv_tree, backend.h), set by the caller around
    // a verification pass over a FULL policy: rows row0 .. row0 + n - 1 of the cache are its nodes,
    // masked by it in every layer's attention, and node i's key and query rotate at tree_pos[i]
    // (its prefix length + depth) instead of its row. NULL: none.
    const tri__kv_tree *tree;
    const int32_t *tree_pos;  // (tree->n) host
    tri__act_pool *pool;  // the activations above (but logits) are the pool's; NULL: its own
    // sliding window: one query's view trimmed to its window (host)
    tri__kv_span *win_spans;  // (win_cap)
    int64_t win_cap;
    int32_t *win_head_span;   // (n_head_kv + 1)
    tri__allreduce ar;        // tensor parallelism: model is rank ar.rank's shard, the outputs of wo and
                              // down are summed over the ranks by ar.sum and only rank 0 computes
                              // logits; ar.sum NULL: one device
    int32_t n_prompt;     // the length announced for the context's first evaluation (rope.h's P);
                          // 0: the first call's own length
} tri__llama;

tri_status tri__llama_init(tri__llama *ll, const tri_model *model, tri__backend *be, int32_t n_batch);
void tri__llama_free(tri__llama *ll);

// Announces P, the length of the context's first evaluation, for rotary rules that depend on the
// sequence's length (LongRoPE, dynamic NTK; rope.h), when a caller runs that evaluation in several
// calls (a prompt in pieces): the next call on an empty cache takes its tables from n_prompt
// instead of from its own length. It stays for every later start from an empty cache until
// announced again; 0: each start takes its own length.
void tri__llama_set_prompt(tri__llama *ll, int32_t n_prompt);

// ---- activation pools ----
//
// Forward passes that never run at the same time on one backend, the levels of a speculative
// engine (they run one after another on one stream), can share their activation buffers: each
// buffer (x, xb, q, ..., up) is then one allocation sized for the largest pass, instead of one per
// pass. A pass reads nothing it wrote in an earlier call, so sharing changes no result. On a
// Llama2-7B target with n_batch 128 that is 25 MiB less device memory per level sharing it.

tri_status tri__act_pool_create(tri__backend *be, tri__act_pool **out);
// Frees the pool's buffers; the passes using it must not run again. NULL is a no-op.
void tri__act_pool_free(tri__act_pool *pool);
// As tri__llama_init, with its activations in pool (same backend; NULL: its own). They exist only
// once the pool is bound: tri__act_pool_bind after the last pass joined.
tri_status tri__llama_init_pooled(tri__llama *ll, const tri_model *model, tri__backend *be, int32_t n_batch,
                                  tri__act_pool *pool);
// Allocates the pool's buffers for every pass that joined (again, larger, if one joined since) and
// points the passes at them.
tri_status tri__act_pool_bind(tri__act_pool *pool);
// Backend bytes the pool holds.
uint64_t tri__act_pool_bytes(const tri__act_pool *pool);

// Which rows of logits a forward pass produces.
typedef enum tri__logits_mode {
    TRI_LOGITS_NONE = 0,  // only fill the cache (the middle of a prefill)
    TRI_LOGITS_LAST = 1,  // the last token's row
    TRI_LOGITS_ALL = 2,   // one row per token (verification, perplexity)
} tri__logits_mode;

// Runs tokens (n, host) at positions len .. len + n - 1 of the cache policy pol (len =
// tri__kv_policy_len), hands their keys and values to pol layer by layer, attends over the views
// pol returns, and commits them (the policy's length advances by n), in steps of n_batch tokens
// or fewer where tri__kv_policy_step_limit says (StreamingLLM past its window: one token per step,
// so pol's cache does not depend on how the caller split the tokens into calls). pol's steps must
// hold n_batch tokens (its max_step >= ll->n_batch). logits (host): (1, n_vocab) for LAST, (n,
// n_vocab) for ALL, unused for NONE. The caller checks that the tokens fit pol's capacity
// (INVALID_ARGUMENT otherwise) and that every id is in [0, n_vocab). On failure pol is rolled back
// to len.
tri_status tri__llama_forward_policy(tri__llama *ll, tri__kv_policy *pol, const int32_t *tokens, int32_t n,
                                     tri__logits_mode mode, float *logits);

// Layer-major prefill. With a full cache (FULL, not H2O or a window) and something that streams
// once per pass (offloaded KV layers of the store, streamed weight blocks of the model), a call
// of more than n_batch tokens with no or the last logits runs in spans of 8,192 tokens, each span
// through layer 0 in steps of n_batch, then through layer 1, and so on, its hidden states held in
// backend memory: every offloaded layer's earlier rows and every streamed block move once per
// span instead of once per step (n_batch 128: 64 times fewer). Same cache and logits as the
// token-major order, bit for bit on the CPU backend (a step attends to the same rows in the same
// order). Not with dynamic NTK rope, whose table follows the longest length seen so far.
// Callers that prefill in pieces for progress reports take pieces of this many tokens: the span
// where the pass is layer-major, else n_batch.
int32_t tri__llama_prefill_step(const tri__llama *ll, const tri__kv_policy *pol);

// The same over a plain store with full attention: runs tokens at kv->n .. kv->n + n - 1, appends
// their keys and values to kv and advances kv->n. On failure kv->n is unchanged (the partial
// writes past it are garbage).
tri_status tri__llama_forward(tri__llama *ll, tri__kv_store *kv, const int32_t *tokens, int32_t n,
                              tri__logits_mode mode, float *logits);

// ---- batches: several sequences in one pass ----
//
// A sequence of a batch: its own pass ll (its rotary table, its position scratch of ll->n_batch,
// its step size), its cache policy and its tokens. Its model must be the batch's (the same
// weights: run's model, or a copy of it on the same kind of backend, whose memory run's ops read).
typedef struct tri__llama_seq {
    tri__llama *ll;          // not owned
    tri__kv_policy *pol;     // not owned
    const int32_t *tokens;   // (n) host
    int32_t n;
    tri__logits_mode mode;   // LAST: the last token's row; ALL: every token's; NONE
    float *logits;           // host: (1, n_vocab) for LAST, (n - skip, n_vocab) for ALL
    int32_t skip;            // ALL: the first skip tokens (< n) give no row (a verification's catch-up
                             // tokens before the rows it scores); 0: every token's
} tri__llama_seq;

// Runs every sequence's tokens as tri__llama_forward_policy(seq.ll, seq.pol, ...) would, in shared
// passes over run's activations: each pass concatenates one step of each sequence (its tokens in
// steps of its ll->n_batch, or fewer where its policy's step limit says: the steps it takes
// alone) up to run->n_batch rows, so every matmul reads each weight once for all of them, while
// rotary positions, the cache policy's views and attention are each sequence's own (the mask is
// block-diagonal: a row sees only its own cache). A step that does not fit the pass's room waits
// for the next pass. On the CPU backend each sequence's logits and cache are bit for bit those
// of running it alone. run->n_batch must be at least every seq.ll->n_batch; run's rotary table is
// unused. Tensor parallelism: one call per rank (tri__tp_run), run being that rank's pass over its
// shard (run->ar: its all-reduces) and the sequences that rank's passes and caches; only
// rank 0 writes logits. On failure every policy is rolled back to its length before the call.
tri_status tri__llama_forward_batch(tri__llama *run, tri__llama_seq *seqs, int32_t n_seqs);

// ---- the one-token step of a StreamingLLM cache, computed from backend memory ----
//
// A draft level (L1) decodes one token per step over StreamingLLM: on a GPU a few hundred small
// ops whose launches cost more than their work (TriForce records this step as a CUDA graph). A
// step of tri__llama_forward_policy reads host indices that every op uploads (the token, the
// positions, the window's rows), which a recorded step would replay stale. This step keeps them in
// backend memory instead (backend.h, "steps driven from backend memory"): the host writes the token
// and the length (8 bytes), window_rows computes the view's rows, the query's cache position and
// the new token's store row on the device, and get_rows_dev, set_rows, rope_dev and attention_dev
// read them there. The view is a fixed buffer of budget + max(evict_every, 1) rows in cache order;
// rows past the step's own are hidden by their position. So the ops and their arguments are the
// same at every step, and a backend with graphs records them once and replays them (again only when
// a buffer they use moved: the activation pool rebound, the logits regrown). The logits and the
// cache are those of tri__llama_forward_policy's step: bit for bit on the CPU backend (the masked
// rows add exact zeros), to the kernels' rounding on a device.
#define TRI_LLAMA_STEP_BAKED 11
typedef struct tri__llama_step {
    tri__llama *ll;           // not owned
    tri__kv_policy *pol;      // not owned: STREAMING over its own store in backend memory
    int32_t view_rows;        // budget + max(evict_every, 1)
    int32_t *dev;             // backend: state (4: token, n0, cache position, own row) | rows (view_rows)
    tri__kv_span *spans;      // (n_head_kv) host: the view over pol->sk, pol->sv
    int32_t *head_span;       // (n_head_kv + 1) host
    bool record;              // record the step once and replay it (a backend with graphs)
    tri__graph *graph;        // the recorded step, NULL before the first
    const void *baked[TRI_LLAMA_STEP_BAKED];  // the buffers the graph was recorded over (the
                              // activations, the logits, the view)
    int64_t n_steps, n_recorded, n_replays;
} tri__llama_step;

// Whether ll's one-token steps over pol can run from backend memory: a STREAMING policy over its
// own store (no offloaded layers, no measurement), a backend with the ops, one device, weights
// resident, a rotary table that does not change with the length (not dynamic NTK or LongRoPE),
// and no sliding window that the view's positions could cross.
bool tri__llama_step_supported(const tri__llama *ll, const tri__kv_policy *pol);
// Sets s up for ll and pol (both must outlive it); record: replay a recorded graph (the backend's
// graph ops; ignored without them). UNSUPPORTED where tri__llama_step_supported is false.
tri_status tri__llama_step_init(tri__llama_step *s, tri__llama *ll, tri__kv_policy *pol, bool record);
void tri__llama_step_free(tri__llama_step *s);
// Runs token at the policy's end and commits it; logits (n_vocab) host, or NULL. Waits for the
// backend (synchronize). On failure the policy keeps its length.
tri_status tri__llama_step_run(tri__llama_step *s, int32_t token, float *logits);

#endif  // TRI_LLAMA_H
