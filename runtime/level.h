// level.h - one level of the speculative hierarchy: a model, its forward pass and its KV cache
// (internal).
//
// The speculative engine (spec.c) talks to levels only through this adapter, so that when the KV
// cache policies (StreamingLLM, chunked retrieval) arrive, only level.c changes. Until then every
// policy is served by the full cache: a retrieval or StreamingLLM level computes exactly what a
// full-cache level computes (degenerate, but it exercises every path of the engine).
#ifndef TRI_LEVEL_H
#define TRI_LEVEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv-store.h"
#include "llama.h"
#include "triforce.h"

typedef enum tri__cache_policy {
    TRI_CACHE_POLICY_FULL = 0,       // every position
    TRI_CACHE_POLICY_STREAMING = 1,  // sink tokens + a recent window (L1 of TriForce)
    TRI_CACHE_POLICY_RETRIEVAL = 2,  // chunk 0 + the top-k chunks per head up to a budget (L2)
} tri__cache_policy;

typedef struct tri__level_params {
    tri__cache_policy policy;
    int32_t n_ctx;     // positions of context the level must serve (prompt + generated)
    int32_t n_batch;   // tokens per internal step of a long prefill
    tri_dtype kv_type; // F16 or F32
    int32_t budget;    // RETRIEVAL: cache tokens; STREAMING: window; unused by FULL
    int32_t chunk;     // RETRIEVAL: tokens per chunk
} tri__level_params;

typedef struct tri__level {
    const tri_model *model;  // not owned
    tri__backend *be;        // not owned
    tri__level_params params;
    tri__llama ll;
    tri__kv_store kv;
    float *logits;           // (logits_cap, n_vocab) host: rows of the last eval
    int32_t logits_cap;
    int32_t n_logits;        // rows valid after the last eval
    double seconds;          // wall time spent in eval, accumulated
    int64_t n_evals;         // forward passes run
} tri__level;

// Allocates the level's cache and buffers on be. model and be must outlive the level.
tri_status tri__level_init(tri__level *lv, const tri_model *model, tri__backend *be,
                           const tri__level_params *params);
// Frees what init allocated; a zeroed level is a no-op.
void tri__level_free(tri__level *lv);

// Runs tokens (n >= 1) after the n_past already cached and caches them. all_logits: one row of
// logits per token, else only the last token's row; tri__level_logits reads them. n == 0 with
// NONE semantics is not allowed. INVALID_ARGUMENT when they do not fit the context.
tri_status tri__level_eval(tri__level *lv, const int32_t *tokens, int32_t n, bool all_logits);
// Runs tokens only to fill the cache (a prefill), in chunks of n_batch; no logits.
tri_status tri__level_prefill(tri__level *lv, const int32_t *tokens, int32_t n);

// Row i (n_vocab floats) of the last eval's logits, i in [0, n_logits); NULL otherwise.
const float *tri__level_logits(const tri__level *lv, int32_t i);

// Rolls the cache back to its first n_past positions (0 <= n_past <= tri__level_n_past).
tri_status tri__level_truncate(tri__level *lv, int32_t n_past);

// Positions cached.
int32_t tri__level_n_past(const tri__level *lv);
// Positions the level can hold.
int32_t tri__level_n_ctx(const tri__level *lv);

// ---- layer-skipping self-draft ----

// A model that runs only the listed layers of base (n_layers indices, strictly increasing, each in
// [0, base n_layer)), sharing base's weights: a borrowed view, not a loaded model. Free it with
// tri__model_view_free, never tri_model_free; base must outlive it.
tri_status tri__model_layer_view(const tri_model *base, const int32_t *layers, int32_t n_layers,
                                 tri_model **out);
void tri__model_view_free(tri_model *view);

#endif  // TRI_LEVEL_H
