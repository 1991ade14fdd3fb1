// planner.h - pieces of the placement planner shared with tests (internal). The planner's
// interface is tri_plan_* in triforce.h; the model behind it is described in docs/offload.md.
#ifndef TRI_PLANNER_H
#define TRI_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

// Expected tokens emitted by one verification of gamma drafted tokens when each is accepted
// independently with probability alpha: the accepted prefix plus one corrected or bonus token,
// (1 - alpha^(gamma + 1)) / (1 - alpha) (Leviathan et al.; TriForce uses the same form).
double tri__plan_expected_tokens(double alpha, int32_t gamma);
// Seconds of the two all-reduces of one layer for a pass of m tokens over GPUs each linked at
// link_bytes_per_s (host memory path: the partial down, the sum up, a fixed latency each).
double tri__plan_allreduce_seconds(const tri_model_config *c, int64_t m, double link_bytes_per_s);

// kv_type mixed (TRI_DTYPE_KV_MIXED): every row is stored and streamed as q4_0; its sinks and window
// are also kept in f16 on the device, in a ring with room for two steps of this many rows (the
// engine's batch, as policy-mixed.c sizes it).
#define TRI__PLAN_MIXED_STEP 128
// The type a cache of kv_type stores and streams its rows in: q4_0 for mixed, else kv_type.
tri_dtype tri__plan_kv_store_type(tri_dtype kv_type);

// Bytes of one transformer block of config stored as weight_type (norms f32); 0 when a row size
// is not a whole number of blocks of a quantized type.
uint64_t tri__plan_layer_bytes(const tri_model_config *config, tri_dtype weight_type);
// Token embedding, output norm (f32) and output head (none when tied).
uint64_t tri__plan_other_bytes(const tri_model_config *config, tri_dtype weight_type);

// ---- token trees: expected tokens of a tree verified in one pass ----

// Acceptance by depth and sibling rank: a[d][r] is the chance that the verifier keeps the drafted
// node of sibling rank r (1: the drafter's most likely child) at depth d (1: the first token after
// the context), given that its parent was kept and every sibling of lower rank was rejected. A
// chain uses rank 1 only. Every entry d = 1..TRI_PLAN_TREE_DEPTH, r = 1..TRI_PLAN_TREE_RANKS is
// filled (rows and columns 0 unused).
#define TRI_PLAN_TREE_DEPTH 64
#define TRI_PLAN_TREE_RANKS 17
#define TRI_PLAN_TREE_MAX_NODES 256
typedef struct tri__accept_table {
    double a[TRI_PLAN_TREE_DEPTH + 1][TRI_PLAN_TREE_RANKS + 1];
} tri__accept_table;

// A batch's L2 passes per round against one sequence's: each L2 pass verifies L1's chain of gamma1
// (rank-1 rates by depth from l1) and yields its kept prefix plus one token; a sequence needs N
// passes to hold gamma2 tokens; n_batch sequences in lockstep need E[max of n_batch draws of N].
// Returns E[max] / E[N] (1 for n_batch 1), exactly from N's distribution; *mean receives E[N]
// (may be NULL).
double tri__plan_lockstep(const tri__accept_table *l1, int32_t gamma1, int32_t gamma2, int32_t n_batch, double *mean);

// The table of a constant rate: rank 1 `rate` at every depth, rank r >= 2 rate x decay^(r - 1).
void tri__accept_table_constant(tri__accept_table *t, double rate, double decay);
// Expected tokens of one verification of a chain of g (rank 1 at depths 1..g): the kept prefix
// plus the corrected or bonus token, 1 + sum over d of the product of a[1..d][1].
double tri__accept_chain_expected(const tri__accept_table *t, int32_t g);

// A tree of n nodes, parents before children: node i is at depth[i] with sibling rank rank[i]
// under parent[i] (-1: a child of the context). The chance that node i is on the accepted path is
// the product over its path of P(child of rank r kept | parent kept) = a[d][r] x prod over j < r
// of (1 - a[d][j]); the expected tokens of its verification are 1 + the sum of those chances
// (Sequoia's expected gain; each node's marginal chance that it is accepted).
typedef struct tri__tree_shape {
    int32_t n;          // nodes
    int32_t depth_max;  // deepest node's depth (0 when empty)
    double expected;    // tokens per verification
    int32_t parent[TRI_PLAN_TREE_MAX_NODES];
    int32_t depth[TRI_PLAN_TREE_MAX_NODES];
    int32_t rank[TRI_PLAN_TREE_MAX_NODES];
    int32_t width[TRI_PLAN_TREE_DEPTH + 1];  // nodes at each depth
} tri__tree_shape;

// Expected tokens of the tree in s (n, parent, rank; depth is recomputed); -1 when the tree is not
// one (a parent after its child, a rank that skips one among its siblings, too deep).
double tri__accept_tree_expected(const tri__accept_table *t, tri__tree_shape *s);
// The tree of at most n_nodes nodes (<= TRI_PLAN_TREE_MAX_NODES) and at most max_depth deep (0:
// TRI_PLAN_TREE_DEPTH) with the most expected tokens under t (Sequoia's dynamic programme over
// depth, sibling rank and nodes left; a node that adds nothing is left out). leaf_siblings: only
// the trees the engine drafts (engine/spec.c, docs/speculative.md "Token trees"): a chain of rank-1
// nodes with siblings (rank >= 2) that are leaves; else any tree. INVALID_ARGUMENT for a bad
// n_nodes or depth, OUT_OF_MEMORY.
tri_status tri__accept_tree_best(const tri__accept_table *t, int32_t n_nodes, int32_t max_depth, bool leaf_siblings,
                                 tri__tree_shape *out);

// What drafting the tree costs L2 (a stated model, docs/offload.md): its main path (the rank-1 chain
// from the context) is drafted as today's chain, L1 proposing gamma1 at a time, e1 tokens per L2
// pass (E of L1's chain); a node off that path is evaluated by L2 (for its children's
// distributions) in the pass after its parent's, beside the main path's rows under a tree mask;
// leaves need no evaluation. *passes receives the L2 passes per round, max(main depth / e1, the
// latest off-path evaluation), *extra_rows the off-path nodes L2 evaluates (spread over the passes).
void tri__accept_tree_drafting(const tri__tree_shape *s, double e1, double *passes, int32_t *extra_rows);

// Which trees the planner considers: the engine's (a chain of at most gamma2 with leaf siblings,
// 0) or any tree of at most TRI_PLAN_TREE_DEPTH (TRI__PLAN_TREE_GENERAL: Sequoia's, a design step
// the engine does not draft).
#define TRI__PLAN_TREE_GENERAL 1

// tri_plan_compute with acceptance tables instead of accept_l1 / accept_l2 (and the rank decay):
// l1 for L2 verifying L1's chain of gamma1, l2 for L3 verifying L2's chain or tree; NULL: the
// stated rate's table. tree_flags: TRI__PLAN_TREE_GENERAL or 0.
tri_status tri__plan_compute_accept(const tri_plan_model *model, const tri_plan_params *params,
                                    const tri__accept_table *l1, const tri__accept_table *l2, int tree_flags,
                                    tri_plan *out);

// The planner's choice of how L3 verifies: each chain of chains[i] and tree of trees[i] nodes
// planned under params (their gamma2 / tree_nodes replaced), with the split on a host whose
// attention reaches host_tflops of FLOPs and host_dram_gbps of memory (the split's host_attn_gbps
// recomputed for each candidate's query count: min(DRAM, FLOP rate / (4 m n_head head_dim / row
// bytes)); host_dram_gbps 0: no split), the acceptance from l1 / l2 (NULL: the stated rates). *out
// receives the fastest plan per token; INVALID_ARGUMENT when no candidate can be planned.
tri_status tri__plan_choose(const tri_plan_model *model, const tri_plan_params *params, const tri__accept_table *l1,
                            const tri__accept_table *l2, int tree_flags, double host_tflops, double host_dram_gbps,
                            const int32_t *chains, int n_chains, const int32_t *trees, int n_trees, tri_plan *out);

#endif  // TRI_PLANNER_H
