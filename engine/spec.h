// spec.h - the speculative engine: one verification rule, generic over levels (internal).
//
// A drafter proposes tokens together with the distributions q they were drawn from; a verifier
// scores them all in one batched forward pass and keeps each with probability min(1, p(x)/q(x)),
// drawing from norm(max(0, p - q)) at the first rejection and from the last p when every token
// was kept. docs/speculative.md has the argument that this, applied at every level, is exact.
#ifndef TRI_SPEC_H
#define TRI_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "level.h"
#include "sampler.h"
#include "triforce.h"

// The acceptance rule. Only EXACT is ever used outside tests: the others are deliberately broken
// rules that the statistical tests must catch.
typedef enum tri__spec_rule {
    TRI_SPEC_RULE_EXACT = 0,
    // After a rejection draw from p instead of the residual (TriForce's reference code does this).
    TRI_SPEC_RULE_RESAMPLE_FROM_P = 1,
    // Hand the level above, as q of a token, the residual when this level resampled it and p when
    // it accepted the drafter's token. Plausible, and wrong: conditioned on acceptance the token
    // has law min(p, q) / alpha, not p (docs/speculative.md, "Which q L3 gets").
    TRI_SPEC_RULE_BRANCH_Q = 2,
    // Token trees: test each sibling against L3's p itself, not against the residual left by the
    // candidates rejected before it (and keep them in it). Wrong: the siblings then over-emit.
    TRI_SPEC_RULE_TREE_NO_RESIDUAL = 3,
} tri__spec_rule;

// A run of proposed tokens and the distributions they were drawn from.
typedef struct tri__spec_draft {
    int32_t n;        // tokens proposed
    int32_t cap;      // most tokens (rows of q)
    int32_t *tokens;  // (cap) not owned: points into the engine's token sequence
    bool *onehot;     // (cap) q of token i is the one-hot at tokens[i] (greedy, n-gram): no row
    float *q;         // (cap, n_vocab) row i = q of token i when !onehot[i]
} tri__spec_draft;

// Allocates onehot and q for cap tokens of a vocabulary of n_vocab; tokens is set by the caller.
tri_status tri__spec_draft_init(tri__spec_draft *d, int32_t cap, int32_t n_vocab);
void tri__spec_draft_free(tri__spec_draft *d);

// Work space of tri__spec_verify.
typedef struct tri__spec_work {
    tri__sampler_scratch scratch;  // for top-k / top-p
    float *p;                      // (n_vocab) the verifier's distribution when out is NULL
    int32_t n_vocab;
} tri__spec_work;

tri_status tri__spec_work_init(tri__spec_work *w, int32_t n_vocab);
void tri__spec_work_free(tri__spec_work *w);

// The verification rule. logits: (d->n + 1, n_vocab) host rows, row i the verifier's logits before
// d->tokens[i], row d->n after the last. The context before the draft is ctx[0..n_ctx), and the
// draft follows it in memory (d->tokens == ctx + n_ctx when d->n > 0), so that row i's context is
// ctx[0..n_ctx + i). p = tri__sampler_probs(sampler, that context, row) at each position;
// q of token i is d's row i (or the one-hot). Sets *n_accepted (0..d->n) and *next: the token drawn
// from the residual at the first rejection, or the bonus drawn from row d->n when all were
// accepted and want_bonus, else -1.
//
// out (may be NULL): the emitted tokens' distributions are appended to it for the level above:
// for each accepted token and for next, the verifier's p at that position (the token's law given
// the context before it, which is what the level above must test against); out->tokens must
// already hold them (the caller's sequence does). Needs room for n_accepted + 1 more rows.
// temperature <= 0 compares each token with the (penalised) argmax, and out gets one-hot rows.
tri_status tri__spec_verify(const tri_sampler_params *sampler, tri__spec_rule rule, const int32_t *ctx,
                            int32_t n_ctx, const float *logits, const tri__spec_draft *d, bool want_bonus,
                            tri__rng *rng, tri__spec_work *w, tri__spec_draft *out, int32_t *n_accepted,
                            int32_t *next);

// Test hooks: the acceptance rule the handle uses (EXACT by default), and its levels (1, 2 or 3;
// NULL when the mode has none; level 1 is NULL for the n-gram drafter).
void tri__spec_set_rule(tri_spec *spec, tri__spec_rule rule);
// Benchmark hook for a simulated device (sim-backend.h), whose logits mean nothing: every
// verification keeps each drafted token with a fixed probability (l2_accept when L2 verifies L1's
// tokens, l3_accept when L3 verifies, drawn from seed's stream) until the first it rejects, which
// it replaces by another token; a bonus follows when all were kept. The rest of the engine (drafts,
// passes, rollbacks, L2's selections and refreshes) runs as it is. Both rates 0: off (the default).
void tri__spec_force_accept(tri_spec *spec, double l2_accept, double l3_accept, uint64_t seed);
// After tri__spec_force_accept: which = 0 (L2 verifying L1's tokens) or 1 (L3 verifying) keeps its
// d-th drafted token with probability rate[d] (d = 1..n, at most TRI__SPEC_MAX_DEPTH; index 0
// unused) given every one before it kept, and with the rate given there beyond n (a measured
// acceptance curve, sim-backend.h); n 0: that rate at every depth.
void tri__spec_force_accept_depth(tri_spec *spec, int which, const double *rate, int32_t n);
// After tri__spec_force_accept: token trees (tree_nodes) run when forced too, L3 keeping the
// sibling of rank r (1..TRI__TREE_MAX_RANK) at depth d, tested once the chain's token and every
// lower rank there were rejected, with probability rate[d * (TRI__TREE_MAX_RANK + 1) + r] (d = 1..n,
// at most TRI__SPEC_MAX_DEPTH; deeper than n, depth n's): a measured curve's tree lines
// (sim-backend.h). n 0: off (the default): forced runs verify chains only.
void tri__spec_force_accept_tree(tri_spec *spec, const double *rate, int32_t n);
tri__level *tri__spec_level(tri_spec *spec, int level);
// Benchmark hook: acceptance by depth since create, for which = 0 (L2 verifying L1's tokens in
// TRIFORCE) or 1 (L3 verifying the tokens under it). reached[d] counts the verifications in which
// the d-th drafted token was tested (drafted, and every token before it kept), accepted[d] those
// that kept it; d = 1..TRI__SPEC_MAX_DEPTH (deeper ones are not counted), index 0 unused (0).
#define TRI__SPEC_MAX_DEPTH 64
// Token trees (tri_spec_params.tree_nodes): siblings per depth at most, and the acceptance L3's
// verification measured per depth d (1 .. TRI__SPEC_MAX_DEPTH) and rank r (0: the chain's own
// token, r >= 1: the r-th sibling by the drafter's logits): reached[d][r] counts the times the
// candidate was tested (every candidate of lower rank at its node rejected), accepted[d][r] those
// that kept it. Arrays of (TRI__SPEC_MAX_DEPTH + 1) * (TRI__TREE_MAX_RANK + 1), index [d * (R + 1) + r].
#define TRI__TREE_MAX_RANK 16
void tri__spec_tree_counts(const tri_spec *spec, int64_t *reached, int64_t *accepted);
// Benchmark hook: trees of tree_nodes from the next round on (0: chains; at most the tree_nodes the
// engine was created with), the counts above cleared.
void tri__spec_set_tree_nodes(tri_spec *spec, int32_t tree_nodes);
// The siblings per depth (shape[d - 1], d = 1 .. g) of the next tree with a chain of g and
// `siblings` siblings to place, from the acceptance measured so far blended with a prior (the
// fixed default shape when nothing is measured yet); avail[d - 1] caps each depth. Greedy:
// adds the sibling with the largest probability of being on the accepted path (Sequoia's rule
// for this family of trees). Exposed for the tests and the benchmarks.
void tri__spec_tree_shape(const tri_spec *spec, int32_t g, int32_t siblings, const int32_t *avail, int32_t *shape);
// The chain to draft for the next tree of tree_nodes (at most gmax, the round's gamma2): the same
// greedy over the chain's next node and the siblings, before the chain exists.
int32_t tri__spec_tree_chain(const tri_spec *spec, int32_t gmax);
void tri__spec_depth_counts(const tri_spec *spec, int which, int64_t *reached, int64_t *accepted);
// The context: tri_spec_n_past tokens, valid until the next call on spec.
const int32_t *tri__spec_tokens(const tri_spec *spec);

// Speculative decoding in batches (spec-batch.c): seat (NULL: none) on every level of one rank, so
// that their passes join the batch's; false when no level takes it (tensor parallelism).
bool tri__spec_set_seat(tri_spec *spec, struct tri__batch_seat *seat);
// Benchmark and test hook: the batched passes a speculative batch ran and the generations' passes
// they carried (their ratio: sequences per pass).
void tri__spec_batch_counts(const tri_spec_batch *batch, int64_t *n_passes, int64_t *n_rows);
// Whether a tri_generate_spec call runs on spec now.
bool tri__spec_generating(const tri_spec *spec);

// The prompt-lookup drafter: finds the latest earlier occurrence of the last m tokens of
// ctx[0..n_ctx), for m = ngram_n down to 1, and copies up to max_tokens of what followed it into
// out. Returns how many it proposed (0 when nothing matched).
int32_t tri__ngram_draft(const int32_t *ctx, int32_t n_ctx, int32_t ngram_n, int32_t max_tokens,
                         int32_t *out);
// The same, trying match lengths ngram_n down to min_n only (1 <= min_n <= ngram_n): the engine's
// drafter proposes nothing unless the whole n-gram recurs, since a shorter match proposes mostly
// what the target rejects and each rejected token costs a verification row.
int32_t tri__ngram_draft_min(const int32_t *ctx, int32_t n_ctx, int32_t ngram_n, int32_t min_n, int32_t max_tokens,
                             int32_t *out);

// The prompt-lookup drafter's next draft length after one of n tokens had k accepted: doubled
// (up to cap) when all were, else k + 1, so that it proposes as far as the text has been
// repeating and little where it has not. n == 0 (nothing proposed) keeps len.
static inline int32_t tri__ngram_next_len(int32_t len, int32_t n, int32_t k, int32_t cap) {
    if (n == 0) return len;
    if (k == n) return 2 * len < cap ? 2 * len : cap;
    return k + 1 < cap ? k + 1 : cap;
}

#endif  // TRI_SPEC_H
