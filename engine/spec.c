// spec.c - lossless hierarchical speculative decoding over levels.
//
// The engine keeps one token sequence `seq`: seq[0..n_seq) is the context the caller has seen
// (prompt and emitted tokens); past it, during a round, lie the tokens L2 holds for L3 (the
// draft d2) and past those the tokens L1 drafted for L2 (d1). Drafts point into seq, so accepting
// a token moves nothing. Every level caches some prefix seq[0..n_past); whenever seq changes at
// index i, every level is cut back to at most i (cut_at), and a level catches up on whatever it
// has not run yet in the same batched forward that scores new tokens (level_run).
#include "spec.h"
#include "tensor-parallel.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "dtype.h"
#include "error.h"
#include "gguf.h"
#include "model.h"
#include "session.h"
#include "textgen.h"
#include "tokenizer.h"
#include "weights.h"

// ---- drafts and work space ----

tri_status tri__spec_draft_init(tri__spec_draft *d, int32_t cap, int32_t n_vocab) {
    memset(d, 0, sizeof *d);
    if (cap <= 0) return TRI_STATUS_OK;
    d->cap = cap;
    d->onehot = calloc((size_t)cap, sizeof *d->onehot);
    d->q = malloc((size_t)cap * (size_t)n_vocab * sizeof *d->q);
    if (!d->onehot || !d->q) {
        tri__spec_draft_free(d);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative draft: %d x %d distributions", cap, n_vocab);
    }
    return TRI_STATUS_OK;
}

void tri__spec_draft_free(tri__spec_draft *d) {
    free(d->onehot);
    free(d->q);
    memset(d, 0, sizeof *d);
}

tri_status tri__spec_work_init(tri__spec_work *w, int32_t n_vocab) {
    memset(w, 0, sizeof *w);
    w->n_vocab = n_vocab;
    w->p = malloc((size_t)n_vocab * sizeof *w->p);
    if (!w->p) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative work: %d-entry distribution", n_vocab);
    return TRI_STATUS_OK;
}

void tri__spec_work_free(tri__spec_work *w) {
    tri__sampler_scratch_free(&w->scratch);
    free(w->p);
    memset(w, 0, sizeof *w);
}

// ---- the verification rule ----

// Draws from norm(max(0, p - q)) by inverse CDF over the unnormalised residual; q == NULL means
// the one-hot at x. Falls back to p when the residual has no mass (p == q up to rounding, so a
// rejection was a rounding accident and p is the right law).
static int32_t sample_residual(const float *p, const float *q, int32_t x, int32_t V, tri__rng *rng) {
    double sum = 0.0;
    if (q) {
        for (int32_t j = 0; j < V; j++)
            if (p[j] > q[j]) sum += (double)p[j] - (double)q[j];
    } else {
        sum = 1.0 - (double)p[x];
    }
    double u = tri__rng_uniform(rng);
    if (!(sum > 1e-12)) return tri__sample(p, V, rng);
    double target = u * sum, cum = 0.0;
    int32_t last = -1;
    for (int32_t j = 0; j < V; j++) {
        double r = q ? (double)p[j] - (double)q[j] : (j == x ? 0.0 : (double)p[j]);
        if (r <= 0.0) continue;
        cum += r;
        last = j;
        if (target < cum) return j;
    }
    TRI_ASSERT(last >= 0);
    return last;
}

// row <- norm(max(0, p - q)) in place (p is row); q == NULL: the one-hot at x. Left as p when the
// residual has no mass, as sample_residual then drew from p.
static void residual_in_place(float *row, const float *q, int32_t x, int32_t V) {
    double sum = 0.0;
    for (int32_t j = 0; j < V; j++) {
        float r = q ? row[j] - q[j] : (j == x ? 0.0f : row[j]);
        if (r > 0.0f) sum += r;
    }
    if (!(sum > 1e-12)) return;
    float inv = (float)(1.0 / sum);
    for (int32_t j = 0; j < V; j++) {
        float r = q ? row[j] - q[j] : (j == x ? 0.0f : row[j]);
        row[j] = r > 0.0f ? r * inv : 0.0f;
    }
}

tri_status tri__spec_verify(const tri_sampler_params *sampler, tri__spec_rule rule, const int32_t *ctx,
                            int32_t n_ctx, const float *logits, const tri__spec_draft *d, bool want_bonus,
                            tri__rng *rng, tri__spec_work *w, tri__spec_draft *out, int32_t *n_accepted,
                            int32_t *next) {
    const int32_t V = w->n_vocab;
    TRI_ASSERT(d->n == 0 || ctx + n_ctx == d->tokens);  // row i follows ctx and the draft's first i tokens
    const bool greedy = sampler->temperature <= 0.0f;
    *n_accepted = 0;
    *next = -1;
    if (out && out->n + d->n + (want_bonus ? 1 : 0) > out->cap)
        return tri__fail(TRI_STATUS_INTERNAL, "verify: %d + %d tokens may not fit a draft of %d", out->n,
                         d->n + (want_bonus ? 1 : 0), out->cap);

    for (int32_t i = 0; i <= d->n; i++) {
        const bool bonus = i == d->n;
        if (bonus && !want_bonus) break;
        const float *row = logits + (int64_t)i * V;
        const int32_t slot = out ? out->n + i : -1;

        if (greedy) {
            int32_t best;
            TRY(tri__sampler_greedy(sampler, ctx, n_ctx + i, row, V, &w->scratch, &best));
            if (out) out->onehot[slot] = true;
            if (!bonus && d->tokens[i] == best) {
                (*n_accepted)++;
                continue;
            }
            *next = best;  // a one-hot residual or the bonus: the argmax either way
            return TRI_STATUS_OK;
        }

        float *p = out ? out->q + (int64_t)slot * V : w->p;
        if (out) out->onehot[slot] = false;
        TRY(tri__sampler_probs(sampler, ctx, n_ctx + i, row, V, p, &w->scratch));
        if (bonus) {
            *next = tri__sample(p, V, rng);
            return TRI_STATUS_OK;
        }
        int32_t x = d->tokens[i];
        const float *q = d->onehot[i] ? NULL : d->q + (int64_t)i * V;
        double px = p[x], qx = q ? (double)q[x] : 1.0;
        double u = tri__rng_uniform(rng);
        TRI_ASSERT(qx > 0.0);  // x was drawn from q
        if (u * qx < px) {     // u < min(1, p(x) / q(x))
            (*n_accepted)++;
            continue;
        }
        if (rule == TRI_SPEC_RULE_RESAMPLE_FROM_P) {
            *next = tri__sample(p, V, rng);
        } else {
            *next = sample_residual(p, q, x, V, rng);
            if (rule == TRI_SPEC_RULE_BRANCH_Q && out) residual_in_place(p, q, x, V);
        }
        return TRI_STATUS_OK;
    }
    return TRI_STATUS_OK;
}

// ---- prompt lookup ----

int32_t tri__ngram_draft(const int32_t *ctx, int32_t n_ctx, int32_t ngram_n, int32_t max_tokens,
                         int32_t *out) {
    return tri__ngram_draft_min(ctx, n_ctx, ngram_n, 1, max_tokens, out);
}

int32_t tri__ngram_draft_min(const int32_t *ctx, int32_t n_ctx, int32_t ngram_n, int32_t min_n, int32_t max_tokens,
                             int32_t *out) {
    if (min_n < 1) min_n = 1;
    for (int32_t m = ngram_n < n_ctx - 1 ? ngram_n : n_ctx - 1; m >= min_n; m--) {
        const int32_t *tail = ctx + n_ctx - m;
        // latest start j < n_ctx - m whose m tokens equal the tail
        for (int32_t j = n_ctx - m - 1; j >= 0; j--) {
            if (memcmp(ctx + j, tail, (size_t)m * sizeof *ctx) != 0) continue;
            // copy one by one: the continuation may run into the tokens being written (a period)
            int32_t n = 0;
            for (; n < max_tokens; n++) {
                int32_t src = j + m + n;
                out[n] = src < n_ctx ? ctx[src] : out[src - n_ctx];
            }
            return n;
        }
    }
    return 0;
}

// ---- the engine ----

// L3 passes over which L2's acceptance is judged for a refresh (tri_spec_params.refresh_accept).
#define ACC_ROUNDS 4

struct tri_spec {
    const tri_model *target;
    tri_spec_params params;  // defaults filled in; draft_layers points to layers
    int32_t *layers;         // (n_draft_layers) copy of the self-draft's layer list
    tri_model *view;         // the self-draft's view of tw, owned
    tri__backend *be;        // rank 0's device (group.be[0])
    tri_model *tw, *dw;      // the target's (rank 0's shard's) and the draft model's views on be
    tri__tp_group group;     // the devices (tensor-parallel.h); name "cpu", "cuda:N", "cpu:0,cpu:1"
    tri__level l1, l2, l3;   // rank 0's; each holds its peers on the other ranks (level.h), but a
                             // separate draft model, which runs on rank 0's device alone
    tri__act_pool *acts;     // the levels' activations: they run one after another
    tri__act_pool *rank_acts[TRI_TP_MAX];  // ranks 1 ..: theirs
    tri_model *rank_view[TRI_TP_MAX];      // ranks 1 ..: the self-draft's view of their shard
    tri__level *lv1, *lv2;   // NULL when absent (lv1 is NULL for the n-gram drafter too)
    int32_t n_vocab;
    int32_t n_ctx;           // positions every level holds
    int32_t n_batch;
    int32_t *seq;            // (seq_cap) context, then the round's drafts
    int32_t seq_cap;
    int32_t n_seq;           // tokens of context
    tri__spec_draft d1;      // L1's draft: gamma1 rows (TRIFORCE) or gamma2 (DRAFT)
    tri__spec_draft d2;      // what L3 verifies in RETRIEVAL and TRIFORCE: gamma2 rows
    tri__spec_work work;
    tri__rng rng;
    bool seeded;             // rng was seeded (from `seed`) since create or the last reset
    uint64_t seed;
    tri__spec_rule rule;
    // forced acceptance (tri__spec_force_accept): rate[0] L2 accepting L1's tokens, rate[1] L3
    // accepting L2's (or the drafter's); used instead of the logits when forced
    bool forced;
    double force_rate[2];
    double force_depth[2][TRI__SPEC_MAX_DEPTH + 1];  // by depth (tri__spec_force_accept_depth): 1..force_n
    int32_t force_n[2];
    double force_tree[(TRI__SPEC_MAX_DEPTH + 1) * (TRI__TREE_MAX_RANK + 1)];  // by depth and rank (force_accept_tree)
    int32_t force_tree_n;  // depths in force_tree; 0: forced runs verify chains
    tri__rng force_rng;
    // acceptance by depth (tri__spec_depth_counts): [0] L2 verifying L1's tokens, [1] L3 verifying
    int64_t depth_reached[2][TRI__SPEC_MAX_DEPTH + 1], depth_accepted[2][TRI__SPEC_MAX_DEPTH + 1];
    int32_t ngram_len;       // the prompt-lookup drafter's current draft length (tri__ngram_next_len)
    // token trees (params.tree_nodes > 0, docs/speculative.md "Token trees"): per slot of the
    // round's draft for L3, the drafting level's most likely tokens there (by its logits,
    // descending), of which those other than the chain's token are the slot's sibling candidates
    int32_t *cand;         // (gamma2, TRI__TREE_MAX_RANK + 1)
    int32_t *n_cand;       // (gamma2) candidates recorded this round, 0: none
    int32_t *tree_shape;   // (gamma2) siblings at depth d + 1 in this round's tree
    int32_t *tree_first;   // (gamma2) index of depth d + 1's first sibling among the siblings
    int32_t *tree_parent;  // (tree_nodes) node i's parent (chain nodes first, then siblings), -1: root
    int32_t *tree_pos;     // (tree_nodes) node i's position: the context's length + depth - 1
    uint32_t *tree_anc;    // (tree_nodes, (tree_nodes + 31) / 32) ancestor-or-self masks
    int32_t tree_cap;      // the tree_nodes the arrays were made for
    int64_t tree_reached[(TRI__SPEC_MAX_DEPTH + 1) * (TRI__TREE_MAX_RANK + 1)];
    int64_t tree_accepted[(TRI__SPEC_MAX_DEPTH + 1) * (TRI__TREE_MAX_RANK + 1)];
    // L2's refreshes: the next L2 run selects its chunks afresh (see l2_refresh_due); the L2 -> L3
    // acceptance of the L3 passes since the last selection, the last ACC_ROUNDS of them
    bool refresh_next;
    int32_t acc_proposed[ACC_ROUNDS], acc_accepted[ACC_ROUNDS];
    int32_t n_acc;            // L3 passes recorded since the last selection
    // of the current tri_generate_spec call
    tri_sampler_params sampler;
    tri_spec_stats *stats;
    _Atomic int run;          // TRI__RUN_IDLE, _GENERATING or _ABORT (tri_spec_abort)
};

tri_spec_params tri_spec_default_params(void) {
    tri_spec_params p = {
        .mode = TRI_SPEC_MODE_TRIFORCE, .drafter = TRI_SPEC_DRAFTER_MODEL, .ngram_n = 3,
        .gamma1 = 2, .gamma2 = 6, .budget = 0, .chunk = 8, .draft_window = 0, .draft_sink = 0,
        .refresh = 0, .refresh_accept = 0.5f,
        .draft_kv_type = TRI_DTYPE_COUNT,  // as the target's cache
    };
    return p;
}

void tri__spec_set_rule(tri_spec *s, tri__spec_rule rule) { s->rule = rule; }

void tri__spec_force_accept(tri_spec *s, double l2_accept, double l3_accept, uint64_t seed) {
    s->forced = l2_accept > 0 || l3_accept > 0;
    s->force_rate[0] = l2_accept;
    s->force_rate[1] = l3_accept;
    s->force_n[0] = s->force_n[1] = 0;
    s->force_tree_n = 0;
    tri__rng_seed(&s->force_rng, seed);
}

void tri__spec_force_accept_depth(tri_spec *s, int which, const double *rate, int32_t n) {
    if (which < 0 || which > 1) return;
    if (n > TRI__SPEC_MAX_DEPTH) n = TRI__SPEC_MAX_DEPTH;
    s->force_n[which] = n > 0 ? n : 0;
    for (int32_t d = 1; d <= s->force_n[which]; d++) s->force_depth[which][d] = rate[d];
}

void tri__spec_force_accept_tree(tri_spec *s, const double *rate, int32_t n) {
    const int32_t R1 = TRI__TREE_MAX_RANK + 1;
    if (n > TRI__SPEC_MAX_DEPTH) n = TRI__SPEC_MAX_DEPTH;
    s->force_tree_n = n > 0 ? n : 0;
    for (int32_t i = R1; i < (s->force_tree_n + 1) * R1; i++) s->force_tree[i] = rate[i];
}

// One verification of n drafted tokens of which the first k were kept, counted by depth.
static void count_depth(tri_spec *s, int which, int32_t n, int32_t k) {
    for (int32_t d = 1; d <= n && d <= k + 1 && d <= TRI__SPEC_MAX_DEPTH; d++) {
        s->depth_reached[which][d]++;
        if (d <= k) s->depth_accepted[which][d]++;
    }
}

void tri__spec_depth_counts(const tri_spec *s, int which, int64_t *reached, int64_t *accepted) {
    for (int d = 0; d <= TRI__SPEC_MAX_DEPTH; d++) {
        reached[d] = s->depth_reached[which][d];
        accepted[d] = s->depth_accepted[which][d];
    }
}

void tri__spec_set_tree_nodes(tri_spec *s, int32_t tree_nodes) {
    TRI_ASSERT(tree_nodes >= 0 && tree_nodes <= s->tree_cap);
    s->params.tree_nodes = tree_nodes;
    memset(s->tree_reached, 0, sizeof s->tree_reached);
    memset(s->tree_accepted, 0, sizeof s->tree_accepted);
}

void tri__spec_tree_counts(const tri_spec *s, int64_t *reached, int64_t *accepted) {
    memcpy(reached, s->tree_reached, sizeof s->tree_reached);
    memcpy(accepted, s->tree_accepted, sizeof s->tree_accepted);
}

// ---- token trees ----

// The acceptance of rank r at depth d as measured, shrunk towards the rank's rate pooled over
// every depth by TREE_PRIOR_W tests, which is itself the rank's measured rate shrunk towards a
// base of 0.8 for the chain's token and 0.3 / r for the r-th sibling by TREE_PRIOR_W tests. With
// nothing measured the base rates give the fixed default shape (a chain of a few tokens, then
// siblings at the shallow depths first); as L3 verifies, a depth's own rate takes over where it
// has been tested often, the rank's pooled rate where it has not.
#define TREE_PRIOR_W 4.0
static void tree_pooled(const tri_spec *s, double *pooled) {
    for (int32_t r = 0; r <= TRI__TREE_MAX_RANK; r++) {
        int64_t acc = 0, tested = 0;
        for (int32_t d = 1; d <= TRI__SPEC_MAX_DEPTH; d++) {
            acc += s->tree_accepted[(int64_t)d * (TRI__TREE_MAX_RANK + 1) + r];
            tested += s->tree_reached[(int64_t)d * (TRI__TREE_MAX_RANK + 1) + r];
        }
        double base = r == 0 ? 0.8 : 0.3 / r;
        pooled[r] = ((double)acc + TREE_PRIOR_W * base) / ((double)tested + TREE_PRIOR_W);
    }
}

static double tree_rate(const tri_spec *s, const double *pooled, int32_t d, int32_t r) {
    if (d > TRI__SPEC_MAX_DEPTH) d = TRI__SPEC_MAX_DEPTH;
    int64_t i = (int64_t)d * (TRI__TREE_MAX_RANK + 1) + r;
    return ((double)s->tree_accepted[i] + TREE_PRIOR_W * pooled[r]) / ((double)s->tree_reached[i] + TREE_PRIOR_W);
}

void tri__spec_tree_shape(const tri_spec *s, int32_t g, int32_t siblings, const int32_t *avail, int32_t *shape) {
    double pooled[TRI__TREE_MAX_RANK + 1];
    tree_pooled(s, pooled);
    // the chance to reach depth d (every chain token before it kept), and that every candidate
    // placed at depth d so far is rejected given that
    double reach = 1.0, reach_d[TRI__SPEC_MAX_DEPTH + 1], miss[TRI__SPEC_MAX_DEPTH + 1];
    int32_t gd = g < TRI__SPEC_MAX_DEPTH ? g : TRI__SPEC_MAX_DEPTH;
    for (int32_t d = 1; d <= g; d++) shape[d - 1] = 0;
    for (int32_t d = 1; d <= gd; d++) {
        reach_d[d] = reach;
        miss[d] = 1.0 - tree_rate(s, pooled, d, 0);
        reach *= tree_rate(s, pooled, d, 0);
    }
    for (int32_t b = 0; b < siblings; b++) {
        int32_t best = 0;
        double gain = 0.0;
        for (int32_t d = 1; d <= gd; d++) {
            int32_t r = shape[d - 1] + 1;
            if (r > avail[d - 1] || r > TRI__TREE_MAX_RANK) continue;
            double gd_ = reach_d[d] * miss[d] * tree_rate(s, pooled, d, r);  // P(the sibling is on the path)
            if (gd_ > gain) gain = gd_, best = d;
        }
        if (best == 0) break;
        miss[best] *= 1.0 - tree_rate(s, pooled, best, ++shape[best - 1]);
    }
}

int32_t tri__spec_tree_chain(const tri_spec *s, int32_t gmax) {
    const int32_t N = s->params.tree_nodes;
    if (gmax > TRI__SPEC_MAX_DEPTH) gmax = TRI__SPEC_MAX_DEPTH;
    if (gmax > N) gmax = N;
    if (gmax <= 1) return gmax;
    double pooled[TRI__TREE_MAX_RANK + 1];
    tree_pooled(s, pooled);
    // the same greedy as tri__spec_tree_shape over the chain's next node and every depth's next
    // sibling (as if each depth had all TRI__TREE_MAX_RANK candidates), for N nodes
    int32_t g = 1, shape[TRI__SPEC_MAX_DEPTH + 1] = {0};
    double reach[TRI__SPEC_MAX_DEPTH + 2], miss[TRI__SPEC_MAX_DEPTH + 1];
    reach[1] = 1.0;
    miss[1] = 1.0 - tree_rate(s, pooled, 1, 0);
    reach[2] = tree_rate(s, pooled, 1, 0);
    for (int32_t placed = 1; placed < N; placed++) {
        int32_t best = -1;  // 0: the chain's next node; d >= 1: depth d's next sibling
        double gain = 0.0;
        if (g < gmax) gain = reach[g + 1] * tree_rate(s, pooled, g + 1, 0), best = 0;
        for (int32_t d = 1; d <= g; d++) {
            int32_t r = shape[d] + 1;
            if (r > TRI__TREE_MAX_RANK) continue;
            double x = reach[d] * miss[d] * tree_rate(s, pooled, d, r);
            if (x > gain) gain = x, best = d;
        }
        if (best < 0) break;
        if (best == 0) {
            g++;
            miss[g] = 1.0 - tree_rate(s, pooled, g, 0);
            reach[g + 1] = reach[g] * tree_rate(s, pooled, g, 0);
        } else {
            miss[best] *= 1.0 - tree_rate(s, pooled, best, ++shape[best]);
        }
    }
    return g;
}

// The k most likely tokens by logits (descending, lower id first on ties) into out; returns k
// (fewer when the vocabulary is smaller).
static int32_t top_tokens(const float *logits, int32_t V, int32_t k, int32_t *out) {
    int32_t n = 0;
    for (int32_t j = 0; j < V; j++) {
        float x = logits[j];
        if (x != x) continue;  // NaN
        if (n == k && !(x > logits[out[n - 1]])) continue;
        int32_t i = n < k ? n++ : n - 1;
        while (i > 0 && x > logits[out[i - 1]]) {
            out[i] = out[i - 1];
            i--;
        }
        out[i] = j;
    }
    return n;
}

// Records the drafting level's candidates at slot i of the round's draft for L3 (a tree round).
static void record_cands(tri_spec *s, int32_t i, const float *logits) {
    if (!s->cand || s->params.tree_nodes <= 0 || i < 0 || i >= s->params.gamma2) return;
    s->n_cand[i] =
        top_tokens(logits, s->n_vocab, TRI__TREE_MAX_RANK + 1, s->cand + (int64_t)i * (TRI__TREE_MAX_RANK + 1));
}

// tri__spec_verify with the decision forced: each drafted token is kept with probability rate
// until the first that is not; that one is replaced by another token, or a bonus follows when all
// were kept and want_bonus. The distributions handed up (out) are one-hot, as at temperature 0.
static tri_status forced_verify(tri_spec *s, int w, const tri__spec_draft *d, bool want_bonus, tri__spec_draft *out,
                                int32_t *n_accepted, int32_t *next) {
    const int32_t V = s->n_vocab;
    *n_accepted = 0;
    *next = -1;
    if (out && out->n + d->n + (want_bonus ? 1 : 0) > out->cap)
        return tri__fail(TRI_STATUS_INTERNAL, "verify: %d + %d tokens may not fit a draft of %d", out->n,
                         d->n + (want_bonus ? 1 : 0), out->cap);
    int32_t k = 0;
    while (k < d->n &&
           tri__rng_uniform(&s->force_rng) < (k < s->force_n[w] ? s->force_depth[w][k + 1] : s->force_rate[w]))
        k++;
    int32_t z = -1;
    if (k < d->n) z = (d->tokens[k] + 1) % V;  // a token other than the rejected one
    else if (want_bonus) z = d->n > 0 ? (d->tokens[d->n - 1] + 1) % V : 1;
    if (out)
        for (int32_t i = 0; i < k + (z >= 0); i++) out->onehot[out->n + i] = true;
    *n_accepted = k;
    *next = z;
    return TRI_STATUS_OK;
}

tri__level *tri__spec_level(tri_spec *s, int level) {
    switch (level) {
    case 1: return s->lv1;
    case 2: return s->lv2;
    case 3: return &s->l3;
    default: return NULL;
    }
}

const int32_t *tri__spec_tokens(const tri_spec *s) { return s->seq; }

bool tri__spec_set_seat(tri_spec *s, struct tri__batch_seat *seat) {
    tri__level *lv[3] = {s->lv1, s->lv2, &s->l3};
    bool any = false;
    for (int k = 0; k < 3; k++)
        if (lv[k] && lv[k]->n_ranks == 1) lv[k]->seat = seat, any = true;
    return any;
}

bool tri__spec_generating(const tri_spec *s) { return atomic_load(&s->run) != TRI__RUN_IDLE; }
int32_t tri_spec_n_past(const tri_spec *s) { return s ? s->n_seq : 0; }

// Every level forgets what it cached at or after index i of seq (which is about to change).
static tri_status cut_at(tri_spec *s, int32_t i) {
    tri__level *lv[3] = {s->lv1, s->lv2, &s->l3};
    for (int k = 0; k < 3; k++)
        if (lv[k] && tri__level_n_past(lv[k]) > i) TRY(tri__level_truncate(lv[k], i));
    return TRI_STATUS_OK;
}

void tri_spec_reset(tri_spec *s) {
    if (!s) return;
    s->n_seq = 0;
    s->n_acc = 0;
    s->ngram_len = s->params.mode == TRI_SPEC_MODE_DRAFT ? s->params.gamma2 : s->params.gamma1;
    s->seeded = false;  // the next call starts its seed's stream afresh
    (void)cut_at(s, 0);
}

tri_status tri_spec_truncate(tri_spec *s, int32_t n_past) {
    if (!s) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_truncate: engine is NULL");
    if (n_past < 0 || n_past > s->n_seq)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative truncate: %d outside [0, %d]", n_past, s->n_seq);
    s->n_seq = n_past;
    s->n_acc = 0;
    return cut_at(s, n_past);
}

// Gets lv's logits for positions m - 1 .. m + extra - 1 of seq (the distributions of seq[m] ..
// seq[m + extra]) in one forward pass that first catches up on whatever lv has not run:
// runs seq[np .. m + extra) where np = min(n_past, m - 1). *row0: the logits row of position m - 1.
// When L2 is due for a refresh, it runs seq[np .. m) first, selecting its chunks from the query
// of seq[m - 1] (the context's last token), then the drafted tokens in a second pass.
static tri_status level_run(tri_spec *s, tri__level *lv, int32_t m, int32_t extra, int32_t *row0) {
    const int32_t *seq = s->seq;
    TRI_ASSERT(m >= 1);
    int32_t np = tri__level_n_past(lv);
    if (np > m - 1) {
        TRY(tri__level_truncate(lv, m - 1));
        np = tri__level_n_past(lv);  // m - 1, or 0 where a draft level started again (level.h)
    }
    if (lv == s->lv2 && s->refresh_next) {
        TRY(tri__level_eval_refresh(lv, seq + np, m - np));
        if (extra > 0) TRY(tri__level_eval_more(lv, seq + m, extra));
        s->refresh_next = false;
        s->n_acc = 0;
        s->stats->n_l2_refresh++;
        *row0 = 0;
        return TRI_STATUS_OK;
    }
    bool all = extra > 0;
    TRY(tri__level_eval(lv, seq + np, m + extra - np, all));
    *row0 = all ? m - 1 - np : 0;
    return TRI_STATUS_OK;
}

// Drafts up to n_max tokens after seq[0..m) autoregressively from lv's own distribution under the
// call's sampler, writing them to seq[m..) and their distributions to d (d->tokens = seq + m).
static tri_status model_draft(tri_spec *s, tri__level *lv, int32_t m, int32_t n_max, tri__spec_draft *d, bool cands) {
    const int32_t V = s->n_vocab;
    d->tokens = s->seq + m;
    d->n = 0;
    for (int32_t i = 0; i < n_max; i++) {
        int32_t row0;
        TRY(level_run(s, lv, m + i, 0, &row0));
        const float *logits = tri__level_logits(lv, row0);
        if (cands) record_cands(s, i, logits);  // the draft for L3: its siblings
        int32_t tok;
        // the level's logits under the call's sampler, penalties from the same context as the
        // verifier's at this position (seq before it), so that acceptance stays frequent
        if (s->sampler.temperature <= 0.0f) {
            d->onehot[i] = true;
            TRY(tri__sampler_greedy(&s->sampler, s->seq, m + i, logits, V, &s->work.scratch, &tok));
        } else {
            float *q = d->q + (int64_t)i * V;
            d->onehot[i] = false;
            TRY(tri__sampler_probs(&s->sampler, s->seq, m + i, logits, V, q, &s->work.scratch));
            tok = tri__sample(q, V, &s->rng);
        }
        s->seq[m + i] = tok;
        d->n = i + 1;
    }
    return TRI_STATUS_OK;
}

// L1: a model (separate or self-draft) or prompt lookup.
static tri_status l1_draft(tri_spec *s, int32_t m, int32_t n_max, tri__spec_draft *d) {
    double t0 = tri__now_seconds();
    tri_status st = TRI_STATUS_OK;
    if (s->lv1) {
        st = model_draft(s, s->lv1, m, n_max, d, s->params.mode == TRI_SPEC_MODE_DRAFT);
    } else {
        d->tokens = s->seq + m;
        // only where the whole n-gram recurs, and as far as recent drafts were accepted
        if (n_max > s->ngram_len) n_max = s->ngram_len;
        d->n = tri__ngram_draft_min(s->seq, m, s->params.ngram_n, s->params.ngram_n, n_max, d->tokens);
        for (int32_t i = 0; i < d->n; i++) d->onehot[i] = true;
    }
    s->stats->l1_proposed += d->n;
    s->stats->l1_seconds += tri__now_seconds() - t0;
    return st;
}

// TRIFORCE's middle level: L1 drafts gamma1 tokens at a time, L2 verifies them exactly, until L2
// holds g2 tokens (seq[n .. n + g2), distributions in d2) for L3.
static tri_status hierarchy_draft(tri_spec *s, int32_t n, int32_t g2) {
    tri__spec_draft *d1 = &s->d1, *d2 = &s->d2;
    d2->tokens = s->seq + n;
    d2->n = 0;
    while (d2->n < g2) {
        int32_t b = n + d2->n, room = g2 - d2->n;
        TRY(cut_at(s, b));
        TRY(l1_draft(s, b, s->params.gamma1 < room ? s->params.gamma1 : room, d1));
        double t0 = tri__now_seconds();
        int32_t row0, k, z;
        TRY(level_run(s, s->lv2, b, d1->n, &row0));
        // no bonus when it would overfill d2: L3 verifies exactly g2 tokens
        bool want_bonus = d2->n + d1->n < g2;
        if (s->forced)
            TRY(forced_verify(s, 0, d1, want_bonus, d2, &k, &z));
        else TRY(tri__spec_verify(&s->sampler, s->rule, s->seq, b, tri__level_logits(s->lv2, row0), d1,
                                  want_bonus, &s->rng, &s->work, d2, &k, &z));
        s->stats->n_l2_verify++;
        s->stats->l1_accepted += k;
        count_depth(s, 0, d1->n, k);
        if (!s->lv1) s->ngram_len = tri__ngram_next_len(s->ngram_len, d1->n, k, s->params.gamma1);
        if (s->cand && (!s->forced || s->force_tree_n > 0))  // L2's distributions at its slots: the siblings' source
            for (int32_t i = 0; i < k + (z >= 0); i++) record_cands(s, d2->n + i, tri__level_logits(s->lv2, row0 + i));
        d2->n += k;
        if (z >= 0) {
            TRY(cut_at(s, b + k));
            s->seq[b + k] = z;
            d2->n++;
        }
        s->stats->l2_seconds += tri__now_seconds() - t0;
    }
    return TRI_STATUS_OK;
}

// ---- token trees: building and verifying ----

// Lays out this round's tree after the chain of g tokens seq[n .. n + g) (docs/speculative.md,
// "Token trees"): siblings from the recorded candidates, as many per depth as
// tri__spec_tree_shape places within tree_nodes and the context, written to seq[n + g ..) in depth
// order, with the parents, positions and ancestor masks of the g + siblings nodes. Returns the
// siblings placed (0: a plain chain round).
static int32_t tree_build(tri_spec *s, int32_t n, int32_t g) {
    const int32_t R1 = TRI__TREE_MAX_RANK + 1;
    int32_t budget = s->params.tree_nodes - g;
    if (budget > s->n_ctx - n - g) budget = s->n_ctx - n - g;  // L3 holds the tree's rows for a pass
    if (budget <= 0 || g <= 0) return 0;
    int32_t *avail = s->tree_first;  // (reused: set below)
    for (int32_t d = 1; d <= g; d++) {
        int32_t a = 0;
        for (int32_t r = 0; r < s->n_cand[d - 1]; r++) a += s->cand[(int64_t)(d - 1) * R1 + r] != s->seq[n + d - 1];
        avail[d - 1] = a < TRI__TREE_MAX_RANK ? a : TRI__TREE_MAX_RANK;
    }
    tri__spec_tree_shape(s, g, budget, avail, s->tree_shape);
    int32_t S = 0;
    for (int32_t d = 1; d <= g; d++) {
        s->tree_first[d - 1] = S;
        const int32_t *c = s->cand + (int64_t)(d - 1) * R1;
        for (int32_t r = 0, placed = 0; r < s->n_cand[d - 1] && placed < s->tree_shape[d - 1]; r++) {
            if (c[r] == s->seq[n + d - 1]) continue;
            s->seq[n + g + S] = c[r];
            s->tree_parent[g + S] = d - 2;  // the chain's node at depth d - 1 (-1: the context)
            s->tree_pos[g + S] = n + d - 1;
            S++, placed++;
        }
    }
    for (int32_t i = 0; i < g; i++) {
        s->tree_parent[i] = i - 1;
        s->tree_pos[i] = n + i;
    }
    if (S > 0) tri__kv_tree_masks(s->tree_anc, s->tree_parent, g + S);
    return S;
}

// L3's pass over the context it has not run, the chain and the S siblings of tree_build, masked
// by the tree; *row0 as level_run's (the logits row of position n - 1).
static tri_status tree_run(tri_spec *s, int32_t n, int32_t g, int32_t S, int32_t *row0) {
    tri__level *lv = &s->l3;
    int32_t np = tri__level_n_past(lv);
    if (np > n - 1) {
        TRY(tri__level_truncate(lv, n - 1));
        np = tri__level_n_past(lv);
    }
    tri__kv_tree tree = {.row0 = n, .n = g + S, .words = (g + S + 31) / 32, .anc = s->tree_anc};
    TRY(tri__level_eval_tree(lv, s->seq + np, n + g + S - np, &tree, s->tree_pos));
    *row0 = n - 1 - np;
    return TRI_STATUS_OK;
}

// Draws from p (V entries, unnormalised, summing to mass > 0) by inverse CDF.
static int32_t sample_mass(const float *p, int32_t V, double mass, tri__rng *rng) {
    double target = tri__rng_uniform(rng) * mass, cum = 0.0;
    int32_t last = -1;
    for (int32_t j = 0; j < V; j++) {
        if (p[j] <= 0.0f) continue;
        cum += p[j];
        last = j;
        if (target < cum) return j;
    }
    TRI_ASSERT(last >= 0);
    return last;
}

// L3's verification of the tree (docs/speculative.md, "Token trees"). logits: L3's rows from the
// one of position n - 1: row d - 1 is the distribution at depth d (after the chain's first
// d - 1 tokens), row g + 1 + j the one after sibling j. Walks down the chain: at depth d the
// chain's token x (drawn from q, d's row) is kept with probability min(1, p(x) / q(x)); else p
// becomes the residual norm(max(p - q, 0)), and the siblings at d, in rank order, are each kept
// with probability p(s) under the current p, which loses s (renormalised) when s is rejected;
// when all are rejected the token is drawn from what is left. *k: tokens kept (the chain's first
// k, or its first k - 1 and then sibling *sib, written to seq[n + k - 1]); *next: the token after
// them (the residual's draw, or the bonus from the last kept node's row).
static tri_status tree_verify(tri_spec *s, int32_t n, const float *logits, const tri__spec_draft *d, int32_t g,
                              int32_t *k, int32_t *sib, int32_t *next) {
    const int32_t V = s->n_vocab, R1 = TRI__TREE_MAX_RANK + 1;
    const bool greedy = s->sampler.temperature <= 0.0f;
    const bool broken = s->rule == TRI_SPEC_RULE_TREE_NO_RESIDUAL;
    float *p = s->work.p;
    *k = 0;
    *sib = -1;
    *next = -1;
    for (int32_t dd = 1; dd <= g; dd++) {
        const float *row = logits + (int64_t)(dd - 1) * V;
        const int32_t x = d->tokens[dd - 1], first = s->tree_first[dd - 1], ns = s->tree_shape[dd - 1];
        int64_t *reached = s->tree_reached + (int64_t)(dd < TRI__SPEC_MAX_DEPTH ? dd : TRI__SPEC_MAX_DEPTH) * R1;
        int64_t *accepted = s->tree_accepted + (reached - s->tree_reached);
        int32_t take = -1;  // the sibling kept
        if (greedy) {
            int32_t best;
            TRY(tri__sampler_greedy(&s->sampler, s->seq, n + dd - 1, row, V, &s->work.scratch, &best));
            reached[0]++;
            if (x == best) {
                accepted[0]++;
                (*k)++;
                continue;
            }
            for (int32_t r = 0; r < ns && take < 0; r++) {
                reached[r + 1]++;
                if (s->seq[n + g + first + r] == best) accepted[r + 1]++, take = first + r;
            }
            if (take < 0) {
                *next = best;  // the argmax, which no candidate was
                return TRI_STATUS_OK;
            }
        } else {
            TRY(tri__sampler_probs(&s->sampler, s->seq, n + dd - 1, row, V, p, &s->work.scratch));
            const float *q = d->onehot[dd - 1] ? NULL : d->q + (int64_t)(dd - 1) * V;
            double px = p[x], qx = q ? (double)q[x] : 1.0;
            TRI_ASSERT(qx > 0.0);
            reached[0]++;
            if (tri__rng_uniform(&s->rng) * qx < px) {
                accepted[0]++;
                (*k)++;
                continue;
            }
            if (!broken) residual_in_place(p, q, x, V);  // the law of the token given x's rejection
            double mass = 1.0;
            for (int32_t r = 0; r < ns && take < 0; r++) {
                int32_t t = s->seq[n + g + first + r];
                reached[r + 1]++;
                double pt = p[t];
                if (tri__rng_uniform(&s->rng) * mass < pt) {
                    accepted[r + 1]++;
                    take = first + r;
                } else if (!broken) {  // the law given t's rejection too: t removed
                    mass -= pt;
                    p[t] = 0.0f;
                }
            }
            if (take < 0) {
                if (broken) {
                    residual_in_place(p, q, x, V);
                    mass = 1.0;
                }
                if (mass > 1e-9) {
                    *next = sample_mass(p, V, mass, &s->rng);
                } else {  // every bit of the residual was on rejected siblings: a rounding accident
                    TRY(tri__sampler_probs(&s->sampler, s->seq, n + dd - 1, row, V, p, &s->work.scratch));
                    *next = sample_residual(p, q, x, V, &s->rng);
                }
                return TRI_STATUS_OK;
            }
        }
        // sibling `take` kept at depth dd: the path ends with it, the next token is its bonus
        *k = dd;
        *sib = take;
        s->seq[n + dd - 1] = s->seq[n + g + take];
        row = logits + (int64_t)(g + 1 + take) * V;
        if (greedy) return tri__sampler_greedy(&s->sampler, s->seq, n + dd, row, V, &s->work.scratch, next);
        TRY(tri__sampler_probs(&s->sampler, s->seq, n + dd, row, V, p, &s->work.scratch));
        *next = tri__sample(p, V, &s->rng);
        return TRI_STATUS_OK;
    }
    // the whole chain kept: the bonus after it
    const float *row = logits + (int64_t)g * V;
    if (greedy) return tri__sampler_greedy(&s->sampler, s->seq, n + g, row, V, &s->work.scratch, next);
    TRY(tri__sampler_probs(&s->sampler, s->seq, n + g, row, V, p, &s->work.scratch));
    *next = tri__sample(p, V, &s->rng);
    return TRI_STATUS_OK;
}

// tree_verify with acceptance forced (tri__spec_force_accept_tree): at depth dd the chain's token
// is kept at the forced rate by depth, else its siblings in rank order each at their rank's rate;
// the first kept ends the path as in tree_verify. The token after the path is one other than a
// rejected one (as forced_verify's), counted per depth and rank as tree_verify counts.
static void forced_tree_verify(tri_spec *s, int32_t n, const tri__spec_draft *d, int32_t g, int32_t *k, int32_t *sib,
                               int32_t *next) {
    const int32_t V = s->n_vocab, R1 = TRI__TREE_MAX_RANK + 1;
    *k = 0;
    *sib = -1;
    *next = -1;
    for (int32_t dd = 1; dd <= g; dd++) {
        const int32_t x = d->tokens[dd - 1], first = s->tree_first[dd - 1], ns = s->tree_shape[dd - 1];
        int64_t *reached = s->tree_reached + (int64_t)(dd < TRI__SPEC_MAX_DEPTH ? dd : TRI__SPEC_MAX_DEPTH) * R1;
        int64_t *accepted = s->tree_accepted + (reached - s->tree_reached);
        const double *rate = s->force_tree + (int64_t)(dd < s->force_tree_n ? dd : s->force_tree_n) * R1;
        reached[0]++;
        if (tri__rng_uniform(&s->force_rng) < (dd <= s->force_n[1] ? s->force_depth[1][dd] : s->force_rate[1])) {
            accepted[0]++;
            (*k)++;
            continue;
        }
        int32_t take = -1;
        for (int32_t r = 0; r < ns && take < 0; r++) {
            reached[r + 1]++;
            if (tri__rng_uniform(&s->force_rng) < rate[r + 1]) accepted[r + 1]++, take = first + r;
        }
        if (take < 0) {
            *next = (x + 1) % V;
            return;
        }
        *k = dd;
        *sib = take;
        s->seq[n + dd - 1] = s->seq[n + g + take];
        *next = (s->seq[n + dd - 1] + 1) % V;
        return;
    }
    *next = g > 0 ? (d->tokens[g - 1] + 1) % V : 1;
}

// Why L2 (a retrieval level) should select its chunks afresh (l2_refresh_due).
typedef enum refresh_why {
    REFRESH_NO = 0,
    REFRESH_NOW,   // before it drafts this round: no selection, or its ring would overflow
    REFRESH_DUE,   // by count or by falling acceptance
    REFRESH_SOON,  // the ring or the count would make it due within the next round
} refresh_why;

// Whether L2 should select its chunks afresh around the round at context length n, which runs it
// up to n + g2: it has no selection (after a prompt or a rollback below it) or its ring of own rows
// would overflow in the round (with one row to spare, so that the next round's refresh step still
// fits): NOW; `refresh` tokens came since its last one, or L3 accepted less than refresh_accept of
// L2's tokens over the last ACC_ROUNDS passes: DUE; the ring or the count would be short after the
// round however many tokens it emits (at most g2 + 1): SOON.
static refresh_why l2_refresh_due(const tri_spec *s, int32_t n, int32_t g2) {
    if (!s->lv2 || s->lv2->pol.p.kind != TRI_KV_POLICY_RETRIEVAL) return REFRESH_NO;
    int32_t last = tri__level_last_refresh(s->lv2);
    if (last < 0) return REFRESH_NOW;
    int32_t room = tri__level_room(s->lv2), np = tri__level_n_past(s->lv2);
    if (room < n + g2 + 1 - np) return REFRESH_NOW;
    if (s->params.refresh > 0 && n - last >= s->params.refresh) return REFRESH_DUE;
    if (s->params.refresh_accept > 0.0f && s->n_acc >= ACC_ROUNDS) {
        int64_t prop = 0, acc = 0;
        for (int i = 0; i < ACC_ROUNDS; i++) {
            prop += s->acc_proposed[i];
            acc += s->acc_accepted[i];
        }
        if (prop > 0 && (double)acc < (double)s->params.refresh_accept * (double)prop) return REFRESH_DUE;
    }
    const int32_t next = n + g2 + 1;  // the next round's length at most
    if (room < next + g2 + 1 - np || (s->params.refresh > 0 && next - last >= s->params.refresh)) return REFRESH_SOON;
    return REFRESH_NO;
}

static tri_status spec_generate(tri_spec *s, const int32_t *prompt, int32_t n_prompt,
                                const tri_generate_params *params, tri_token_fn on_token, void *user,
                                tri_spec_stats *stats);

tri_status tri_generate_spec(tri_spec *s, const int32_t *prompt, int32_t n_prompt,
                             const tri_generate_params *params, tri_token_fn on_token, void *user,
                             tri_spec_stats *stats) {
    tri_spec_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!s) {
        stats->stop_reason = TRI_STOP_ERROR;
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate (speculative): NULL handle");
    }
    if (tri__textgen_wanted(params))  // stop strings, stop tokens, text: wrapped, then back here
        return tri__textgen_generate(s->target, NULL, s, prompt, n_prompt, params, on_token, user, stats);
    atomic_store(&s->run, TRI__RUN_GENERATING);
    tri_status st = spec_generate(s, prompt, n_prompt, params, on_token, user, stats);
    atomic_store(&s->run, TRI__RUN_IDLE);
    s->stats = NULL;
    if (st) stats->stop_reason = TRI_STOP_ERROR;
    return st;
}

bool tri_spec_abort(tri_spec *s) {
    if (!s) return false;
    int expected = TRI__RUN_GENERATING;
    return atomic_compare_exchange_strong(&s->run, &expected, TRI__RUN_ABORT);
}

static bool spec_aborted(tri_spec *s) {
    return atomic_load_explicit(&s->run, memory_order_relaxed) == TRI__RUN_ABORT;
}

static tri_status spec_generate(tri_spec *s, const int32_t *prompt, int32_t n_prompt,
                                const tri_generate_params *params, tri_token_fn on_token, void *user,
                                tri_spec_stats *stats) {
    tri_generate_params p = params ? *params : tri_generate_default_params();
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate (speculative): bad prompt of %d tokens",
                         n_prompt);
    if (n_prompt == 0 && s->n_seq == 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate (speculative): empty prompt and nothing run before");
    if (n_prompt > s->n_ctx - s->n_seq)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "generate (speculative): prompt of %d tokens does not fit the context (%d of %d used)",
                         n_prompt, s->n_seq, s->n_ctx);
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->n_vocab)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "generate (speculative): token %d at %d is outside the vocabulary [0, %d)",
                             prompt[i], i, s->n_vocab);
    TRY(tri_sampler_params_check(&p.sampler));
    s->sampler = p.sampler;
    s->stats = stats;
    // the whole prompt is the context's first evaluation, for every level and however the levels
    // run it (pieces, all but its last token, a draft level starting again): rope.h
    if (s->n_seq == 0) {
        tri__level *all[3] = {&s->l3, s->lv2, s->lv1};
        for (int k = 0; k < 3; k++)
            if (all[k]) tri__llama_set_prompt(&all[k]->ll, n_prompt);
    }
    // one stream per seed, as tri_generate: a call that continues with the same seed draws fresh
    // numbers instead of replaying the last call's
    if (!s->seeded || s->seed != p.sampler.seed) {
        tri__rng_seed_param(&s->rng, p.sampler.seed);
        s->seeded = true;
        s->seed = p.sampler.seed;
    }
    // L3 first: L2 reads L3's rows (adopting their length, or selecting during L3's last step)
    // instead of running the prompt a second time
    tri__level *levels[3] = {&s->l3, s->lv2, s->lv1};

    // prefill every level with all but the last token, which the first round runs
    double t0 = tri__now_seconds();
    if (n_prompt > 0) memcpy(s->seq + s->n_seq, prompt, (size_t)n_prompt * sizeof *prompt);  // prompt may be NULL
    int32_t end = s->n_seq + n_prompt - 1;
    TRY(cut_at(s, end));
    int32_t from = end;
    for (int k = 0; k < 3; k++)
        if (levels[k] && tri__level_n_past(levels[k]) < from) from = tri__level_n_past(levels[k]);
    // pieces of n_batch tokens, or of a layer-major span when L3 streams (llama.h)
    const int32_t piece = tri__llama_prefill_step(&s->l3.ll, &s->l3.pol);
    // L2 over L3's rows selects during L3's last prefill step, from L3's queries of the last tokens
    // it prefills and the rows it has just written (no pass of its own over the whole context, no
    // upload of offloaded rows); otherwise, as TriForce does, in a step of its own after the prefill
    const bool l2_borrows = s->lv2 && s->lv2->pol.src == s->l3.pol.kv;
    // L2's selection reads the queries of the armed pass's last `queries` tokens: the last piece
    // holds at least that many where the prompt does, so that they do not depend on where the
    // pieces fall (a shorter piece before it instead)
    const int32_t last_min = l2_borrows && s->lv2->pol.p.queries > 1 ? s->lv2->pol.p.queries : 1;
    bool selected = false;
    for (int32_t done = from; done < end;) {
        int32_t step = end - done < piece ? end - done : piece;
        if (last_min <= piece && end - done > step && end - done - step < last_min)
            step = end - done - last_min;
        for (int k = 0; k < 3; k++) {
            tri__level *lv = levels[k];
            if (!lv || tri__level_n_past(lv) >= done + step) continue;
            int32_t np = tri__level_n_past(lv);
            if (lv == &s->l3 && l2_borrows && done + step == end) {
                TRY(tri__level_select_during(s->lv2, &s->l3, end));
                TRY(tri__level_prefill(lv, s->seq + np, done + step - np));
                selected = tri__level_took_selection(s->lv2);
                continue;
            }
            if (lv == s->lv2) {  // over L3's rows, or a full cache that copies them (level.h)
                TRY(tri__level_adopt(lv, &s->l3, done + step));
                continue;
            }
            TRY(tri__level_prefill(lv, s->seq + np, done + step - np));
        }
        done += step;
        bool go = !p.on_prefill || p.on_prefill(done - s->n_seq + 1, n_prompt, p.user);
        bool aborted = spec_aborted(s);
        if (!go || aborted) {
            s->n_seq = done;  // what every level holds; the rest of the prompt is dropped
            stats->prefill_seconds = tri__now_seconds() - t0;
            stats->stop_reason = aborted ? TRI_STOP_ABORT : TRI_STOP_CALLBACK;
            return TRI_STATUS_OK;
        }
    }
    s->n_seq += n_prompt;
    stats->n_prompt = n_prompt;
    stats->n_l2_refresh += selected;
    // a new prompt: L2 selects in its first step (unless it did during L3's prefill)
    if (n_prompt > 0) s->refresh_next = s->lv2 && s->lv2->pol.p.kind == TRI_KV_POLICY_RETRIEVAL && !selected;
    double t1 = tri__now_seconds();
    stats->prefill_seconds = t1 - t0;
    tri__kv_offload_stats kv0, kv1;  // L3's offloaded cache, counted while decoding
    tri__kv_store_offload_stats(s->l3.pol.kv, &kv0);
    uint64_t l2_up0 = s->lv2 ? tri__kv_policy_bytes_up(&s->lv2->pol) : 0;

    const tri_spec_mode mode = s->params.mode;
    const int32_t eos = p.stop_at_eos ? tri_token_eos(s->target) : -1;
    const int32_t room = s->n_ctx - s->n_seq + 1;  // the last token need not be run
    const int32_t n_max = p.n_predict > 0 && p.n_predict < room ? p.n_predict : room;
    tri__spec_draft none = {0};
    tri__spec_draft *d3 = mode == TRI_SPEC_MODE_DRAFT ? &s->d1
                          : mode == TRI_SPEC_MODE_NONE ? &none
                                                       : &s->d2;
    bool go = true;
    while (go && stats->n_generated < n_max) {
        if (spec_aborted(s)) {  // between rounds: what was emitted is in the context
            stats->stop_reason = TRI_STOP_ABORT;
            break;
        }
        const int32_t n = s->n_seq;
        int32_t g2 = s->params.gamma2;
        if (g2 > s->n_ctx - n) g2 = s->n_ctx - n;                       // L3 runs seq[.. n + g2)
        if (g2 > n_max - stats->n_generated - 1) g2 = n_max - stats->n_generated - 1;  // no waste
        if (mode == TRI_SPEC_MODE_NONE) g2 = 0;
        // (forced: chains unless tri__spec_force_accept_tree; the n-gram drafter straight to L3 proposes no siblings)
        const bool tree = s->cand && s->params.tree_nodes > 0 && (!s->forced || s->force_tree_n > 0) &&
                          (mode != TRI_SPEC_MODE_DRAFT || s->lv1);
        if (tree) {  // a tree of tree_nodes: the chain within it; candidates recorded afresh
            g2 = tri__spec_tree_chain(s, g2);
            memset(s->n_cand, 0, (size_t)s->params.gamma2 * sizeof *s->n_cand);
        }
        d3->tokens = s->seq + n;
        d3->n = 0;
        // L2's selections after the prompt's: made during this round's L3 pass, from L3's query of
        // the context's last token and the rows that pass brings to the device anyway (L2 borrows
        // L3's store), when one is due or soon would be; L2 drafts this round on the one it has.
        // Otherwise, and when L2 cannot draft without one, in a step of its own before it drafts.
        const bool can_tap = s->lv2 && s->lv2->pol.src == s->l3.pol.kv && g2 > 0 && mode != TRI_SPEC_MODE_DRAFT &&
                             tri__level_n_past(&s->l3) < n;
        const refresh_why why = l2_refresh_due(s, n, g2);
        const bool tap = can_tap && (why == REFRESH_DUE || why == REFRESH_SOON);
        if (why == REFRESH_NOW || (why == REFRESH_DUE && !tap)) s->refresh_next = true;
        if (g2 > 0) {
            if (mode == TRI_SPEC_MODE_DRAFT) {
                TRY(l1_draft(s, n, g2, d3));
            } else if (mode == TRI_SPEC_MODE_RETRIEVAL) {
                double t2 = tri__now_seconds();
                TRY(model_draft(s, s->lv2, n, g2, d3, true));
                stats->l2_seconds += tri__now_seconds() - t2;
            } else {
                TRY(hierarchy_draft(s, n, g2));
            }
        }

        double t3 = tri__now_seconds();
        int32_t row0, k, z, sib = -1;
        bool tapped = false;
        const int32_t S = tree ? tree_build(s, n, d3->n) : 0;
        if (S > 0) {  // one pass over the chain and its siblings, then the walk down the tree
            if (tap) s->refresh_next = true;  // (a tree pass carries no selection: L2 takes a step of its own)
            TRY(tree_run(s, n, d3->n, S, &row0));
            if (s->forced)
                forced_tree_verify(s, n, d3, d3->n, &k, &sib, &z);
            else
                TRY(tree_verify(s, n, tri__level_logits(&s->l3, row0), d3, d3->n, &k, &sib, &z));
        } else {
            if (tap && d3->n > 0) {
                TRY(tri__level_select_during(s->lv2, &s->l3, n));
                tri_status st = level_run(s, &s->l3, n, d3->n, &row0);
                tapped = tri__level_took_selection(s->lv2);  // disarms L3 when the pass failed
                TRY(st);
                stats->n_l2_refresh += tapped;
            } else {
                TRY(level_run(s, &s->l3, n, d3->n, &row0));
            }
            if (s->forced)
                TRY(forced_verify(s, 1, d3, true, NULL, &k, &z));
            else
                TRY(tri__spec_verify(&s->sampler, s->rule, s->seq, n, tri__level_logits(&s->l3, row0), d3, true,
                                     &s->rng, &s->work, NULL, &k, &z));
        }
        if (tree) stats->n_l3_tree_nodes += d3->n + S;
        if (sib >= 0) {
            // the kept sibling's row to its place on the path (L3 keeps the path's rows and drops the
            // rest below); L1 and L2 ran the chain's token there, which the sibling replaced
            TRY(tri__level_move_row(&s->l3, n + d3->n + sib, n + k - 1));
            tri__level *dl[2] = {s->lv1, s->lv2};
            for (int i = 0; i < 2; i++)
                if (dl[i] && tri__level_n_past(dl[i]) > n + k - 1) TRY(tri__level_truncate(dl[i], n + k - 1));
            if (tri__level_n_past(&s->l3) > n + k) TRY(tri__level_truncate(&s->l3, n + k));
        }
        stats->n_l3_verify++;
        if (mode != TRI_SPEC_MODE_NONE) count_depth(s, 1, d3->n, k);
        if (mode == TRI_SPEC_MODE_DRAFT) {
            stats->l1_accepted += k;
            if (!s->lv1) s->ngram_len = tri__ngram_next_len(s->ngram_len, d3->n, k, s->params.gamma2);
        } else if (mode != TRI_SPEC_MODE_NONE) {
            stats->l2_proposed += d3->n;
            stats->l2_accepted += k;
            int32_t slot = s->n_acc++ % ACC_ROUNDS;
            s->acc_proposed[slot] = d3->n;
            s->acc_accepted[slot] = k;
            if (tapped) s->n_acc = 0;  // a new selection: its acceptance is judged from the next pass
        }
        TRY(cut_at(s, n + k));
        s->seq[n + k] = z;
        stats->l3_seconds += tri__now_seconds() - t3;

        // emit seq[n .. n + k], stopping where the caller, the limit or end-of-sequence says
        int32_t emitted = 0;
        while (emitted <= k) {
            int32_t tok = s->seq[n + emitted++];
            stats->n_generated++;
            go = !on_token || on_token(tok, user);
            if (!go || tok == eos || stats->n_generated == n_max) {
                stats->stop_reason = !go ? TRI_STOP_CALLBACK
                                     : tok == eos ? TRI_STOP_EOS
                                     : p.n_predict > 0 && stats->n_generated == p.n_predict ? TRI_STOP_LENGTH
                                                                                          : TRI_STOP_CONTEXT;
                go = false;
                break;
            }
        }
        s->n_seq = n + emitted;
        TRY(cut_at(s, s->n_seq));
    }
    stats->decode_seconds = tri__now_seconds() - t1;
    tri__kv_store_offload_stats(s->l3.pol.kv, &kv1);
    // L3's rows streaming (for L2 too, before its selections), and L2's gathers of offloaded chunks
    stats->kv_bytes_up = kv1.bytes_up - kv0.bytes_up + (s->lv2 ? tri__kv_policy_bytes_up(&s->lv2->pol) : 0) - l2_up0;
    stats->kv_bytes_down = kv1.bytes_down - kv0.bytes_down;
    stats->kv_bytes_host = kv1.bytes_host - kv0.bytes_host;
    s->stats = NULL;
    return TRI_STATUS_OK;
}

// ---- construction ----

// Refuses a draft whose vocabulary is not the target's: the sizes, then, when both models carry a
// tokenizer (GGUF metadata or an HF directory's tokenizer.json, in any mix), every token's text
// and the bos/eos ids where both define them (-1 is "none"; a draft's own bos/eos is never used,
// but two tokenizers that name different ones are not the same). Without two tokenizers, two GGUF
// files are still compared by their token lists; otherwise the sizes are all there is.
// L2's budget left to the default (tri__kv_policy_default_budget): 4096 tokens of f16 rows, in
// bytes, so that a quantized draft type (gather_type) holds more tokens in the same memory (q8_0
// about 1.9x, q4_0 about 3.6x), in whole chunks; the full cache when that covers the context.
static void default_l2_budget(tri__kv_policy_params *kp, int32_t n_ctx, tri_dtype draft, int32_t head_dim) {
    tri__kv_policy_default_budget(kp, n_ctx);
    if (kp->kind != TRI_KV_POLICY_RETRIEVAL || !tri__dtype_is_quantized(draft)) return;
    int64_t budget = (int64_t)kp->budget * tri__dtype_row_bytes(TRI_DTYPE_F16, head_dim) /
                     tri__dtype_row_bytes(draft, head_dim);
    budget -= budget % kp->chunk;
    if (budget >= n_ctx) *kp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, n_ctx);
    else kp->budget = (int32_t)budget;
}

static tri_status check_same_vocab(const tri_model *t, const tri_model *d) {
    if (t->config.n_vocab != d->config.n_vocab)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "draft model %s: vocabulary of %d tokens, the target %s has %d", d->path,
                         d->config.n_vocab, t->path, t->config.n_vocab);
    if (t->tokenizer && d->tokenizer) {
        const tri__tokenizer *tt = t->tokenizer, *dt = d->tokenizer;
        int32_t nt = tri__tokenizer_n_vocab(tt), nd = tri__tokenizer_n_vocab(dt);
        if (nt != nd)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "draft model %s: tokenizer of %d tokens, the target %s has %d",
                             d->path, nd, t->path, nt);
        for (int32_t i = 0; i < nt; i++) {
            size_t la, lb;
            const char *a = tri__tokenizer_text(tt, i, &la), *b = tri__tokenizer_text(dt, i, &lb);
            // NULL in both: an id with no token in either (a gap in a sparse list)
            if ((!a && !b) || (a && b && la == lb && memcmp(a, b, la) == 0)) continue;
            if (!a) a = "", la = 0;
            if (!b) b = "", lb = 0;
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "draft model %s: tokenizer differs from the target %s's at token %d ('%.*s' vs '%.*s')",
                             d->path, t->path, i, (int)(lb < 40 ? lb : 40), b, (int)(la < 40 ? la : 40), a);
        }
        int32_t ids[2][2] = {{tri__tokenizer_bos(tt), tri__tokenizer_bos(dt)},
                             {tri__tokenizer_eos(tt), tri__tokenizer_eos(dt)}};
        for (int i = 0; i < 2; i++)
            if (ids[i][0] >= 0 && ids[i][1] >= 0 && ids[i][0] != ids[i][1])
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "draft model %s: %s token is %d, the target's is %d",
                                 d->path, i ? "eos" : "bos", ids[i][1], ids[i][0]);
        return TRI_STATUS_OK;
    }
    if (!t->gguf || !d->gguf) return TRI_STATUS_OK;
    const tri__gguf_value *tt = tri__gguf_find(t->gguf, "tokenizer.ggml.tokens");
    const tri__gguf_value *dt = tri__gguf_find(d->gguf, "tokenizer.ggml.tokens");
    if (tt && dt && tt->type == TRI_GGUF_TYPE_ARRAY && dt->type == TRI_GGUF_TYPE_ARRAY &&
        tt->arr.elem == TRI_GGUF_TYPE_STRING && dt->arr.elem == TRI_GGUF_TYPE_STRING) {
        if (tt->arr.n != dt->arr.n)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "draft model %s: tokenizer of %llu tokens, the target %s has %llu", d->path,
                             (unsigned long long)dt->arr.n, t->path, (unsigned long long)tt->arr.n);
        for (uint64_t i = 0; i < tt->arr.n; i++) {
            tri__gguf_str a = tt->arr.items[i].str, b = dt->arr.items[i].str;
            if (a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0) continue;
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "draft model %s: tokenizer differs from the target %s's at token %llu "
                             "('%.*s' vs '%.*s')",
                             d->path, t->path, (unsigned long long)i, (int)(b.len < 40 ? b.len : 40),
                             b.ptr, (int)(a.len < 40 ? a.len : 40), a.ptr);
        }
    }
    const char *keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
    for (int i = 0; i < 2; i++) {
        uint32_t a, b;
        if (tri__gguf_get_u32(t->gguf, keys[i], &a) || tri__gguf_get_u32(d->gguf, keys[i], &b)) continue;
        if (a != b)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "draft model %s: %s is %u, the target's is %u",
                             d->path, keys[i], b, a);
    }
    return TRI_STATUS_OK;
}

// Initialises lv on every rank of s's devices: rank r over models[r] on its backend with its
// activation pool, borrowing rank r's rows of source (NULL: none) as lp's kv_source.
static tri_status level_init_ranks(tri_spec *s, tri__level *lv, tri_model *const *models, int32_t n,
                                   const tri__level_params *lp, tri__level *source) {
    tri__level_params p = *lp;
    if (source) p.kv_source = source->pol.kv;
    TRY(tri__level_init(lv, models[0], s->group.be[0], &p));
    if (n == 1) return TRI_STATUS_OK;
    tri__level *peers = calloc((size_t)n - 1, sizeof *peers);
    if (!peers) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative: levels of %d ranks", n);
    for (int32_t r = 1; r < n; r++) {
        p.acts = s->rank_acts[r];
        if (source) p.kv_source = tri__level_rank(source, r)->pol.kv;
        tri_status st = tri__level_init(&peers[r - 1], models[r], s->group.be[r], &p);
        if (st) {
            for (int32_t i = 1; i < r; i++) tri__level_free(&peers[i - 1]);
            free(peers);
            return st;
        }
    }
    tri__level_set_ranks(lv, peers, n, s->group.tp);
    return TRI_STATUS_OK;
}

void tri_spec_free(tri_spec *s) {
    if (!s) return;
    tri__level_free(&s->l1);
    tri__level_free(&s->l2);
    tri__level_free(&s->l3);
    tri__act_pool_free(s->acts);
    tri__model_view_free(s->view);
    for (int32_t r = 1; r < TRI_TP_MAX; r++) {
        tri__act_pool_free(s->rank_acts[r]);
        tri__model_view_free(s->rank_view[r]);
    }
    tri__model_backend_free(s->dw);
    tri__tp_group_close(&s->group);  // the target's views and the backends
    tri__spec_draft_free(&s->d1);
    tri__spec_draft_free(&s->d2);
    tri__spec_work_free(&s->work);
    free(s->layers);
    free(s->seq);
    free(s->cand);
    free(s->n_cand);
    free(s->tree_shape);
    free(s->tree_first);
    free(s->tree_parent);
    free(s->tree_pos);
    free(s->tree_anc);
    free(s);
}

tri_status tri_spec_create(const tri_model *target, const tri_session_params *session_params,
                           const tri_spec_params *params, tri_spec **out) {
    if (out) *out = NULL;
    if (!target || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_create: NULL argument");
    tri_session_params sp = session_params ? *session_params : tri_session_default_params();
    tri_spec_params p = params ? *params : tri_spec_default_params();
    const tri_model_config *c = &target->config;
    if ((unsigned)p.mode > TRI_SPEC_MODE_TRIFORCE || (unsigned)p.drafter > TRI_SPEC_DRAFTER_NGRAM)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative: mode %d or drafter %d unknown", (int)p.mode,
                         (int)p.drafter);
    if (p.gamma1 < 0 || p.gamma2 < 0 || p.ngram_n < 0 || p.budget < 0 || p.chunk < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "speculative: gamma1 %d, gamma2 %d, ngram %d, budget %d, chunk %d must be >= 0",
                         p.gamma1, p.gamma2, p.ngram_n, p.budget, p.chunk);
    if (p.draft_window < 0 || p.draft_sink < 0 || p.refresh < 0 ||
        !(p.refresh_accept >= 0.0f && p.refresh_accept <= 1.0f))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "speculative: draft_window %d, draft_sink %d, refresh %d must be >= 0 and "
                         "refresh_accept %g in [0, 1]",
                         p.draft_window, p.draft_sink, p.refresh, (double)p.refresh_accept);
    if (p.tree_nodes < 0 || p.tree_nodes > 1024)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative: tree_nodes %d outside [0, 1024]", p.tree_nodes);
    if (p.tree_nodes > 0 && c->sliding_window > 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "speculative: tree_nodes %d with a sliding-window model (%s)",
                         p.tree_nodes, target->path);
    if (sp.n_ctx < 0 || sp.n_batch < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative: n_ctx %d and n_batch %d must be >= 0",
                         sp.n_ctx, sp.n_batch);
    // the levels' caches (retrieval's chunk means and gathered chunks, StreamingLLM's window) read
    // f16, f32 or a quantized full cache's q8_0 / q4_0 rows; an L3 of kv_type mixed serves the modes
    // without L2 (L2 borrows L3's rows, which mixed keeps in two precisions)
    const bool l3_mixed = sp.kv_type == TRI_DTYPE_KV_MIXED;
    if (sp.kv_mixed_heavy != 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "speculative: kv_mixed_heavy %d: heavy hitters keep no history to "
                         "roll back", sp.kv_mixed_heavy);
    if (l3_mixed && (p.mode == TRI_SPEC_MODE_RETRIEVAL || p.mode == TRI_SPEC_MODE_TRIFORCE))
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "speculative: kv_type mixed: modes none and draft only (L2, the retrieval cache of modes "
                         "retrieval and triforce, borrows the full cache's rows: f16, f32, q8_0 or q4_0)");
    if (!tri__kv_type_ok(sp.kv_type) && !l3_mixed)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "speculative: kv_type %s: speculative modes hold f16, f32, q8_0, q4_0 or mixed caches",
                         tri_dtype_name(sp.kv_type));
    if (p.gamma1 == 0) p.gamma1 = 2;
    if (p.gamma2 == 0) p.gamma2 = 6;
    if (p.ngram_n == 0) p.ngram_n = 3;
    if (p.chunk == 0) p.chunk = 8;
    // budget and draft_window stay 0 when left to the default: only then may a cache that covers
    // the whole context quietly become the full cache (below); given ones are checked
    int32_t window = p.draft_window > 0 ? p.draft_window : 256;
    if (p.draft_sink == 0) p.draft_sink = tri__kv_default_sink(window);
    if (p.draft_sink >= window)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "speculative: draft_sink %d must be < draft_window %d to leave room for recent tokens",
                         p.draft_sink, window);
    sp.n_ctx = tri__session_n_ctx(c, sp.n_ctx, "speculative");
    if (p.draft_window > sp.n_ctx)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "speculative: draft_window %d is larger than the context (%d positions)", p.draft_window,
                         sp.n_ctx);
    if (sp.n_batch == 0) sp.n_batch = 128;
    if (sp.n_batch > sp.n_ctx) sp.n_batch = sp.n_ctx;
    const bool has_l1 = p.mode == TRI_SPEC_MODE_DRAFT || p.mode == TRI_SPEC_MODE_TRIFORCE;
    const bool has_l2 = p.mode == TRI_SPEC_MODE_RETRIEVAL || p.mode == TRI_SPEC_MODE_TRIFORCE;
    if (has_l1 && p.drafter == TRI_SPEC_DRAFTER_MODEL) {
        if (!p.draft_model)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative: drafter 'model' without a draft model");
        TRY(check_same_vocab(target, p.draft_model));
    }
    const bool draft_default = p.draft_kv_type == TRI_DTYPE_COUNT;  // may become q8_0 below
    if (draft_default) p.draft_kv_type = l3_mixed ? TRI_DTYPE_F16 : sp.kv_type;
    if ((has_l1 && p.drafter != TRI_SPEC_DRAFTER_NGRAM) || has_l2) {  // L1's own cache, L2's gathered chunks
        if (!tri__kv_type_ok(p.draft_kv_type))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "speculative: draft_kv_type %s (%d): want f16, f32, q8_0 or q4_0",
                             tri_dtype_name(p.draft_kv_type), (int)p.draft_kv_type);
        int32_t hd = has_l1 && p.drafter == TRI_SPEC_DRAFTER_MODEL ? p.draft_model->config.head_dim : c->head_dim;
        if (has_l2 && c->head_dim < hd) hd = c->head_dim;  // whichever fails (both when equal)
        if (tri__dtype_is_quantized(p.draft_kv_type) && (hd % TRI_QK != 0 || (has_l2 && c->head_dim % TRI_QK != 0)))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "speculative: draft_kv_type %s quantizes blocks of %d values; the draft's head_dim %d is "
                             "not a multiple", tri_dtype_name(p.draft_kv_type), TRI_QK,
                             has_l2 && c->head_dim % TRI_QK != 0 ? c->head_dim : hd);
    }

    tri_spec *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative engine");
    s->target = target;
    s->n_vocab = c->n_vocab;
    s->n_ctx = sp.n_ctx;
    s->n_batch = sp.n_batch;
    tri_status st;
    if ((st = tri__tp_group_open(&s->group, target, &sp))) goto fail;
    s->be = s->group.be[0];
    s->tw = s->group.weights[0];
    const int32_t n_ranks = s->group.n;
    // draft caches left to the default: q8_0 where they can be, over an f16 (or mixed) target on
    // the CPU or CUDA, which read such views (measured: more tokens per L3 pass at equal memory,
    // docs/benchmarks-log.md "Quantized draft caches"), else the session's type
    const bool typed_views = s->be->ops->caps & TRI_BACKEND_CAP_TYPED_VIEWS;
    if (draft_default && (sp.kv_type == TRI_DTYPE_F16 || l3_mixed) && typed_views && c->head_dim % TRI_QK == 0 &&
        !(has_l1 && p.drafter == TRI_SPEC_DRAFTER_MODEL && p.draft_model->config.head_dim % TRI_QK != 0))
        p.draft_kv_type = TRI_DTYPE_Q8_0;
    if (has_l1 && p.drafter == TRI_SPEC_DRAFTER_LAYERS) {
        if ((st = tri__model_layer_view(s->tw, p.draft_layers, p.n_draft_layers, &s->view))) goto fail;
        for (int32_t r = 1; r < n_ranks; r++)  // the self-draft splits as the target does
            if ((st = tri__model_layer_view(s->group.weights[r], p.draft_layers, p.n_draft_layers, &s->rank_view[r])))
                goto fail;
        s->layers = malloc((size_t)p.n_draft_layers * sizeof *s->layers);
        if (!s->layers) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative: layer list");
            goto fail;
        }
        memcpy(s->layers, p.draft_layers, (size_t)p.n_draft_layers * sizeof *s->layers);
        p.draft_layers = s->layers;
    } else {
        p.draft_layers = NULL;
        p.n_draft_layers = 0;
    }
    if (!(has_l1 && p.drafter == TRI_SPEC_DRAFTER_MODEL)) p.draft_model = NULL;
    if (p.draft_model && (st = tri__model_on_backend(p.draft_model, s->be, 0, 0, &s->dw))) goto fail;
    s->params = p;
    s->ngram_len = p.mode == TRI_SPEC_MODE_DRAFT ? p.gamma2 : p.gamma1;

    if ((st = tri__act_pool_create(s->be, &s->acts))) goto fail;
    for (int32_t r = 1; r < n_ranks; r++)
        if ((st = tri__act_pool_create(s->group.be[r], &s->rank_acts[r]))) goto fail;
    tri__level_params lp = {.policy = TRI_KV_POLICY_FULL, .n_ctx = sp.n_ctx, .n_batch = sp.n_batch,
                            .kv_type = sp.kv_type, .acts = s->acts};
    tri__level_params l3p = lp;
    l3p.kv_offloaded = sp.kv_layers_offloaded;  // L3's full cache may stream from host memory
    l3p.kv_host_fraction = sp.kv_host_fraction;  // and be attended in part on the host
    l3p.kv_host_threads = sp.kv_host_threads;
    // its views mix two types (backend.h span_types)
    if (l3_mixed && !(s->be->ops->caps & TRI_BACKEND_CAP_TYPED_VIEWS)) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED, "speculative: kv_type mixed is not supported on the %s backend "
                       "(CPU and CUDA only)", s->be->ops->name);
        goto fail;
    }
    if (l3_mixed && p.tree_nodes > 0 && p.mode != TRI_SPEC_MODE_NONE &&
        (sp.kv_budget > 0 ? sp.kv_budget : TRI_KV_MIXED_F16) - (sp.kv_sink > 0 ? sp.kv_sink : TRI_KV_MIXED_SINK) <
            p.gamma2) {
        // a node reads f16 by row, its ancestors' rows past their depths: the same rows as a
        // chain's while the window holds the tree's depth
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                       "speculative: kv_type mixed with tree_nodes %d: the recent window (kv_budget - kv_sink) must "
                       "hold gamma2 %d tokens", p.tree_nodes, p.gamma2);
        goto fail;
    }
    if (l3_mixed) {  // its f16 tokens, and a ring that keeps a round's rows: a rollback of a verification
        l3p.budget = sp.kv_budget;  // pass (its drafts, a catch-up token, a tree's nodes) finds them
        l3p.sink = sp.kv_sink;
        l3p.rollback = p.gamma1 + p.gamma2 + 2 + p.tree_nodes;
    }
    if ((st = level_init_ranks(s, &s->l3, s->group.weights, n_ranks, &l3p, NULL))) goto fail;
    if (has_l2) {
        // a budget left to the default is 4096 in whole chunks, or the full cache when the context
        // is no longer (kv-policy.h); a given one is checked by the level
        tri__kv_policy_params kp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, sp.n_ctx);
        kp.chunk = p.chunk;
        if (p.budget > 0) kp.budget = p.budget;
        else default_l2_budget(&kp, sp.n_ctx, p.draft_kv_type, c->head_dim);
        tri__level_params l2p = lp;
        if (tri__dtype_is_quantized(p.draft_kv_type)) {
            if (!typed_views) {  // L2's view mixes them: spans of their own types (backend.h span_types)
                st = tri__fail(TRI_STATUS_UNSUPPORTED,
                               "speculative: draft_kv_type %s is not supported on the %s backend (CPU and CUDA only): "
                               "L2's view would mix quantized and %s rows",
                               tri_dtype_name(p.draft_kv_type), s->be->ops->name, tri_dtype_name(sp.kv_type));
                goto fail;
            }
            l2p.gather_type = p.draft_kv_type;
        }
        l2p.policy = kp.kind;
        l2p.budget = kp.budget;
        l2p.chunk = kp.chunk;
        l2p.index = (tri__chunk_index_kind)sp.kv_index;
        // no full cache of its own: L2 reads L3's rows (gathering its chunks out of them) and keeps
        // only the rows of the tokens it ran since its selection, in a ring it selects again before
        // filling (l2_refresh_due)
        l2p.ring = tri__kv_l2_ring(p.chunk, p.gamma1, p.gamma2, sp.n_batch);
        if ((st = level_init_ranks(s, &s->l2, s->group.weights, n_ranks, &l2p, &s->l3))) goto fail;
        s->lv2 = &s->l2;
    }
    if (has_l1 && p.drafter != TRI_SPEC_DRAFTER_NGRAM) {
        const tri_model *m = p.drafter == TRI_SPEC_DRAFTER_MODEL ? s->dw : s->view;
        tri__level_params l1p = lp;
        l1p.kv_type = p.draft_kv_type;
        if (tri__dtype_is_quantized(l1p.kv_type) && !typed_views) {
            st = tri__fail(TRI_STATUS_UNSUPPORTED,
                           "speculative: draft_kv_type %s is not supported on the %s backend (CPU and CUDA only)",
                           tri_dtype_name(l1p.kv_type), s->be->ops->name);
            goto fail;
        }
        l1p.policy = p.draft_window == 0 && window >= sp.n_ctx ? TRI_KV_POLICY_FULL : TRI_KV_POLICY_STREAMING;
        l1p.budget = window;
        l1p.sink = p.draft_sink;
        // a round rolls L1 back by at most the drafts of a round (and a catch-up token); its
        // prefill evicts every 64 tokens, as TriForce's does (L1 only proposes: exactness holds)
        l1p.rollback = p.gamma1 + p.gamma2 + 2;
        l1p.evict_every = sp.n_batch < 64 ? sp.n_batch : 64;
        if (p.drafter == TRI_SPEC_DRAFTER_MODEL) {  // a small model: on rank 0's device alone
            if ((st = tri__level_init(&s->l1, m, s->be, &l1p))) goto fail;
        } else {
            s->rank_view[0] = s->view;
            st = level_init_ranks(s, &s->l1, s->rank_view, n_ranks, &l1p, NULL);
            s->rank_view[0] = NULL;
            if (st) goto fail;
        }
        s->lv1 = &s->l1;
    }
    if ((st = tri__act_pool_bind(s->acts))) goto fail;
    for (int32_t r = 1; r < n_ranks; r++)
        if ((st = tri__act_pool_bind(s->rank_acts[r]))) goto fail;
    if (has_l1 && (st = tri__spec_draft_init(&s->d1, p.mode == TRI_SPEC_MODE_DRAFT ? p.gamma2 : p.gamma1,
                                              c->n_vocab)))
        goto fail;
    if (has_l2 && (st = tri__spec_draft_init(&s->d2, p.gamma2, c->n_vocab))) goto fail;
    if ((st = tri__spec_work_init(&s->work, c->n_vocab))) goto fail;
    // token trees: the candidates of the draft's slots, the tree's layout (not in NONE mode)
    if (p.tree_nodes > 0 && p.mode != TRI_SPEC_MODE_NONE) {
        if (!(s->be->ops->caps & TRI_BACKEND_CAP_TREES)) {
            st = tri__fail(TRI_STATUS_UNSUPPORTED,
                           "speculative: tree_nodes %d: the %s backend's attention takes no "
                           "tree mask",
                           p.tree_nodes, s->be->ops->name);
            goto fail;
        }
        int32_t T = p.tree_nodes, W = (T + 31) / 32;
        s->tree_cap = T;
        s->cand = malloc((size_t)p.gamma2 * (TRI__TREE_MAX_RANK + 1) * sizeof *s->cand);
        s->n_cand = calloc((size_t)p.gamma2, sizeof *s->n_cand);
        s->tree_shape = calloc((size_t)p.gamma2, sizeof *s->tree_shape);
        s->tree_first = calloc((size_t)p.gamma2, sizeof *s->tree_first);
        s->tree_parent = malloc((size_t)T * sizeof *s->tree_parent);
        s->tree_pos = malloc((size_t)T * sizeof *s->tree_pos);
        s->tree_anc = malloc((size_t)T * (size_t)W * sizeof *s->tree_anc);
        if (!s->cand || !s->n_cand || !s->tree_shape || !s->tree_first || !s->tree_parent || !s->tree_pos ||
            !s->tree_anc) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative: a tree of %d nodes", T);
            goto fail;
        }
    }
    // drafts run past the context by at most gamma2 tokens (gamma1 within them), and a tree's
    // siblings after them
    s->seq_cap = sp.n_ctx + p.gamma2 + p.gamma1 + 2 + p.tree_nodes;
    s->seq = malloc((size_t)s->seq_cap * sizeof *s->seq);
    if (!s->seq) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative: %d-token sequence", s->seq_cap);
        goto fail;
    }
    *out = s;
    return TRI_STATUS_OK;

fail:
    tri_spec_free(s);
    return st;
}

const char *tri_spec_device(const tri_spec *s) { return s ? s->group.name : NULL; }
