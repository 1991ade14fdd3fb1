// tp-split.h - how one model divides over N devices for tensor parallelism: the split by KV head
// and FFN rows, and each rank's shard model (internal). The ranks, their threads and the
// all-reduce are the engine's (engine/tensor-parallel.h, which describes the scheme).
#ifndef TRI_TP_SPLIT_H
#define TRI_TP_SPLIT_H

#include <stdint.h>

#include "model.h"
#include "triforce.h"

#define TRI_TP_MAX 8  // devices in one list

// ---- the split ----

typedef struct tri__tp_split {
    int32_t n;                    // ranks, 1 .. TRI_TP_MAX
    int32_t kv0[TRI_TP_MAX + 1];  // rank r: KV heads [kv0[r], kv0[r + 1])
    int32_t ff0[TRI_TP_MAX + 1];  // rank r: FFN rows [ff0[r], ff0[r + 1])
} tri__tp_split;

// The split of config c over n ranks. KV heads: n_head_kv / n each, the first n_head_kv % n
// ranks one more (3 heads over 2: 2 + 1). FFN rows: each rank gets what brings its weight
// elements per layer nearest the mean (a rank with fewer heads takes more rows), in whole
// multiples of 256 rows when n_ff is a multiple of 256, else of 32, else of 1 (so the columns of
// a quantized down projection split at whole blocks), at least one multiple each; the last rank
// takes the rest. INVALID_ARGUMENT, naming the counts, when n < 1, n > TRI_TP_MAX, n > n_head_kv
// or n_ff has fewer multiples than ranks. The planner's split (plan/planner.c) is this one.
tri_status tri__tp_split_plan(const tri_model_config *c, int32_t n, tri__tp_split *out);

// Rank rank's shard of base: a tri_model in host memory whose config has the rank's n_head,
// n_head_kv and n_ff, whose row slices (wq, wk, wv, gate, up) point into base's data and whose
// column slices (wo, down) are packed copies the shard owns. Everything else is base's
// (replicated). UNSUPPORTED, naming the tensor, when a column split falls inside a quantized
// block. base must outlive the shard; free it with tri__tp_shard_free.
tri_status tri__tp_shard_model(const tri_model *base, const tri__tp_split *sp, int32_t rank, tri_model **out);
void tri__tp_shard_free(tri_model *shard);

// Bytes one rank sends and receives through host memory per all-reduce of n floats: its partial
// down (4n) and the sum up (4n); the other ranks' partials are read in host memory.
static inline uint64_t tri__tp_allreduce_bytes(int64_t n) { return 8u * (uint64_t)n; }

#endif  // TRI_TP_SPLIT_H
