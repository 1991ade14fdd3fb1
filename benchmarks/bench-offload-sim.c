// bench-offload-sim.c - bench-offload on a simulated device (--device sim:PROFILE): the paper's
// offloading experiment timed from the engine's own schedule instead of a GPU.
//
// usage: bench-offload --device sim:PROFILE [--gpus 1|2] [--shape llama2-7b|tiny] [--ctx N]
//                      [--budgets 8192,12288] [--gamma2 12,16] [--gamma1 2] [--accept 0.9]
//                      [--accept-l1 0.7] [--gpu-mem SIZE] [--weights f16|q8_0|q4_0] [--engine N]
//                      [--reserve SIZE] [--passes N]  (bench-offload's: the passes are accepted so
//                      that its command line runs as is; the timeline repeats exactly)
//                      [--accept-curve FILE] [--hosts desktop,workstation|none]
//                      [--kv-type f16,q8_0,q4_0,mixed]   (the table once per KV cache type; default f16,q8_0)
//                      [--trees 16,32,64,128|none] [--rank-decay 0.5] [--host-bf16] [--tree-general]
//                      [--tree-nodes N]  (with --engine: token trees of N nodes at L3)
//                      [--batch 1,2,4,6,8]  (the TriForce batch instead: B sequences of --ctx tokens each;
//                      the first --kv-type, --budgets and --gamma2)
//        bench-offload --device sim:cpu --self-check MODEL.gguf [--prompt N] [--tokens N] [--threads N]
//                      [--rounds N]
//
// The passes are bench-offload's (bench-offload.c's header says what they are): real forward
// passes of the real runtime over the planner's placement, the offloaded KV streaming through
// kv-store.h's double buffers with its events, on the sim backend (backends/sim/sim-backend.h), which does
// no arithmetic and holds no memory: the weights are a shape (tri__model_synthetic_shape), the
// 127K-token host KV is address space never touched. A pass's time is the simulated timeline's,
// from the first call to the synchronize that ends it; "transfer hidden" is the share of the
// transfer queue's busy time during which the compute queue was busy too, "compute overlapped"
// the share of the compute queue's busy time during which transfers ran (both for the L3 pass).
//
// What is simulated and what is forced:
//   - per-token time combines the passes as bench-offload does, with forced acceptance alpha (L3
//     accepts an L2 token) and beta (L2 accepts an L1 token): the speculative engine's own loop is
//     not run here, and L2's selection (chunk summaries, top-k, gathers) is not included;
//   - --engine N runs the engine itself instead (tri_generate_spec, TRIFORCE, one GPU, the first
//     budget and gamma2): the prompt's prefill, L1 drafts, L2 verifications, L3 passes, rollbacks,
//     L2's selections and refreshes, with acceptance forced inside its loop at the same rates
//     (tri__spec_force_accept), timed on the sim from the end of the prefill. Host-side work on
//     offloaded rows (gathers of a selection's chunks, summaries of host-resident keys) is not
//     done but put on the host's clock at this machine's rates, measured at start (L2's later
//     selections are made during L3's passes from device rows, so only a selection L2 cannot
//     draft without does any); the engine's
//     other host work (sampling over the vocabulary, the chunk index's top-k) runs on this machine
//     and is not on the simulated clock; the chunk summaries of the whole context live in host memory
//     (n_ctx / 8 x n_embd floats per layer: 8.5 GB at 127K), so keep --ctx moderate here;
//   - split attention (docs/offload.md, "Simulated hosts"): for each host profile of --hosts, a
//     second table gives each row with each offloaded layer's first f x ctx rows attended on the
//     host, f the planner's for the profile: the device's part is an L3 pass timed on the sim over
//     the rest, the host's part is timed from its FLOPs and bytes with the DMA sharing its DRAM
//     (tri__sim_host_split_seconds), the pass is the later of the two;
//   - --accept-curve FILE (bench-accept's, docs/formats.md): the split table's rows again with the
//     measured acceptance by depth in place of alpha and beta (tokens per round and L2 passes per
//     round from the curve); with --engine, the engine's forced acceptance follows it by depth,
//     and with --tree-nodes N (the engine's token trees) its siblings by depth and rank as the
//     curve's tree lines give them (tri__spec_force_accept_tree; without them alpha x
//     --rank-decay^rank);
//   - chain vs tree (--trees, docs/offload.md "Token trees in the planner and the simulator"): each
//     chain of --gamma2 and tree of --trees nodes (the engine's shape, or any tree with
//     --tree-general), all streamed and split on each host, at the stated rates (siblings at
//     rate x --rank-decay^(r - 1), a stated model) and at the curve; the L3 and L2 passes timed on
//     the sim at the shape's rows; and the planner's choice per host (tri__plan_choose);
//     --host-bf16 times the host's attention at its bf16 dot-product rate (a kernel not built);
//   - --batch B1,B2,... (run_batch, docs/offload.md "Batches in the planner and the simulator"): for
//     each B, B sequences of --ctx tokens with the planner's placement for the batch; every level's
//     pass carries all B sequences (tri__llama_forward_batch: the weights once, each sequence's own
//     cache, each one's offloaded rows streamed); per round the planner's lockstep L2 passes and B x
//     the tokens of one verification, at the stated rates and the curve's; the autoregressive batch
//     beside it and the planner's prediction under each row;
//   - --gpus 2: the engine splits over two devices (engine/tensor-parallel.c); here one device is
//     simulated with one GPU's share of the work as the planner assumes it (half the heads, half
//     the feed-forward width, the full vocabulary; the KV of its heads over its own link), plus
//     two all-reduces of the activations per layer over PCIe, added to each pass: a prediction
//     (the split itself runs on CPU backends and emulated GPUs, not on two real ones yet).
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-select.h"
#include "bench-model.h"
#include "bench-util.h"
#include "dtype.h"
#include "error.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "llama.h"
#include "model-synthetic.h"
#include "model.h"
#include "planner.h"
#include "sim-backend.h"
#include "spec.h"
#include "weights.h"

#define MAX_LIST 8

int bench_offload_sim(int argc, char **argv);

typedef struct sim_opts {
    const char *shape, *profile, *self_check;
    int32_t engine;      // > 0: run the speculative engine for this many tokens (run_engine)
    int32_t tree_nodes;  // --tree-nodes: the engine's L3 verifies token trees of this many nodes (0: chains)
    int32_t ctx, gamma1, gpus, prompt, tokens, threads, rounds;
    uint64_t gpu_mem, reserve;  // reserve: 0 the planner's default
    int32_t budgets[MAX_LIST], n_budgets;
    int32_t gamma2s[MAX_LIST], n_gamma2;
    double alpha, beta;
    tri_dtype weights;
    const char *curve_path;  // --accept-curve: measured acceptance by depth (bench-accept)
    const char *hosts;       // --hosts: host profiles for the split rows
    tri_dtype kv_types[MAX_LIST];  // --kv-type f16,q8_0,q4_0: the table once per cache type
    int32_t n_kv;
    int32_t trees[MAX_LIST], n_trees;  // --trees: token trees of these node counts beside the chains
    double rank_decay;                 // --rank-decay: a sibling of rank r kept at rate x decay^(r - 1)
    bool host_bf16;                    // --host-bf16: the host's attention at its bf16 dot-product rate
    bool tree_general;                 // --tree-general: any tree (Sequoia's), not the engine's shape
    int32_t batches[MAX_LIST], n_batches;  // --batch: the simulated TriForce batch (run_batch) at these sizes
} sim_opts;

static void sim_usage(void) {
    int n;
    const tri__sim_profile *p = tri__sim_profiles(&n);
    fprintf(stderr,
            "usage: bench-offload --device sim:PROFILE [--gpus 1|2] [--shape llama2-7b|tiny] [--ctx N]\n"
            "                     [--budgets 8192,12288] [--gamma2 12,16] [--gamma1 2] [--accept 0.9]\n"
            "                     [--accept-l1 0.7] [--gpu-mem SIZE] [--weights f16|q8_0|q4_0] [--engine N]\n"
            "                     [--reserve SIZE] [--passes N] [--accept-curve FILE]\n"
            "                     [--hosts desktop,workstation|none]\n"
            "                     [--kv-type f16,q8_0,q4_0,mixed (default f16,q8_0)]\n"
            "                     [--trees 16,32,64,128|none] [--rank-decay 0.5] [--host-bf16]\n"
            "                     [--tree-general] [--tree-nodes N (with --engine)]\n"
            "                     [--batch 1,2,4,6,8 (B sequences of --ctx tokens in one pass per level;\n"
            "                     the first --kv-type, --budgets and --gamma2)]\n"
            "       bench-offload --device sim:cpu --self-check MODEL.gguf [--prompt N] [--tokens N]\n"
            "                     [--threads N] [--rounds N]\n"
            "profiles:");
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", p[i].name);
    fprintf(stderr, " (and cpu, measured here, for --self-check)\n");
}

static int sim_list(const char *s, int32_t *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > INT32_MAX || (*end && *end != ',')) return -1;
        out[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static double sim_expected(double a, int32_t g) { return a >= 1.0 ? g + 1 : (1.0 - pow(a, g + 1)) / (1.0 - a); }

// ---- one pass on the timeline ----

typedef struct sim_pass {
    double seconds;          // the pass, issue to synchronize
    double transfer_busy;    // seconds the transfer queue copied
    double compute_busy;     // seconds the compute queue ran
    double hidden;           // of them, while compute ran
    double h2d_bytes;        // every host -> device byte (transfer queue and compute queue)
    double kv_up, w_up;      // the runtime's own counters: offloaded KV and streamed weights uploaded
} sim_pass;

// One pass of m tokens after the store's positions (rolled back after it), timed on the sim after
// a warm-up pass; the runtime's byte counters are read around the same pass.
static tri_status sim_time_pass(const tri_model *model, tri__backend *be, tri__kv_store *kv, int32_t m, sim_pass *out) {
    tri__llama ll;
    tri__kv_policy pol;
    tri_status st = tri__llama_init(&ll, model, be, m);
    if (st) return st;
    if ((st = tri__kv_policy_wrap_full(&pol, kv, model->config.n_head, m))) {
        tri__llama_free(&ll);
        return st;
    }
    int32_t n0 = kv->n;
    int32_t *tok = malloc(sizeof *tok * (size_t)m);
    float *logits = malloc(sizeof(float) * (size_t)m * (size_t)model->config.n_vocab);
    if (!tok || !logits) st = TRI_STATUS_OUT_OF_MEMORY;
    for (int32_t i = 0; !st && i < m; i++) tok[i] = (7 * i + 3) % model->config.n_vocab;
    tri__kv_offload_stats k0, k1;
    tri__weight_stream_stats w0, w1;
    for (int rep = 0; !st && rep < 2; rep++) {
        if (rep == 1) {
            tri__kv_store_offload_stats(kv, &k0);
            tri__model_stream_stats(model, &w0);
            tri__sim_reset(be);
        }
        st = tri__llama_forward_policy(&ll, &pol, tok, m, m > 1 ? TRI_LOGITS_ALL : TRI_LOGITS_LAST, logits);
        if (!st) st = tri__kv_policy_truncate(&pol, n0);
    }
    if (!st) {
        tri__sim_stats s;
        tri__sim_stats_get(be, &s);
        tri__kv_store_offload_stats(kv, &k1);
        tri__model_stream_stats(model, &w1);
        *out = (sim_pass){.seconds = s.end, .transfer_busy = s.transfer_busy, .compute_busy = s.compute_busy, .hidden = s.transfer_hidden,
                          .h2d_bytes = (double)s.h2d_bytes, .kv_up = (double)(k1.bytes_up - k0.bytes_up),
                          .w_up = (double)(w1.bytes_up - w0.bytes_up)};
    }
    free(tok);
    free(logits);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
    return st;
}

// A store over c with capacity positions, on_chip layers on the device, holding n positions of
// rows that are never written (a simulated device reads none of them).
static tri_status sim_store(tri__kv_store *kv, tri__backend *be, tri_dtype type, const tri_model_config *c,
                            int32_t capacity, int32_t on_chip, int32_t n) {
    tri_status st = tri__kv_store_init_offload(kv, be, type, c->n_layer, c->n_head_kv, c->head_dim, capacity,
                                               on_chip);
    if (!st) st = tri__kv_store_set_len(kv, n);
    return st;
}

// The two all-reduces per layer of a pass of m tokens, as the engine does them (engine/
// tensor-parallel.c: each GPU's m x n_embd f32 partial down to pinned host memory, the sum up) and
// the planner counts them (15 µs per all-reduce, an assumption no GPU has measured).
static double allreduce_seconds(const tri_model_config *c, const tri__sim_profile *p, int32_t m) {
    return c->n_layer * tri__plan_allreduce_seconds(c, m, p->h2d_gbps * 1e9);
}

// ---- the experiment ----

// What an L3 pass is timed against: the target's shard on the sim, its store, the placement.
typedef struct l3_ctx {
    const sim_opts *o;
    tri__backend *be;
    const tri__sim_profile *p;
    const tri_model *tv;
    tri__kv_store *l3;
    tri_dtype kvt;  // the cache's type (its name in the tables)
    tri_dtype kst;  // the type its rows are stored and streamed in (mixed: q4_0)
    const tri_model_config *tc, *full;
    int32_t capacity, on_chip;
    double t_f16;   // kv_type mixed: seconds a full-cache pass reads the f16 sinks and window (0 otherwise)
} l3_ctx;

// kv_type mixed on the sim (docs/offload.md, "kv_type mixed in the planner"): the stores hold q4_0
// rows (the offloaded ones stream as q4_0's), and every layer's f16 sinks, window and ring are one
// device allocation (the planner's size for this GPU's heads), so the memory peak counts them. A
// full-cache pass also reads the sink + window f16 rows of every layer: their bytes over the
// profile's memory rate, added to the pass (not overlapped with its transfers: an upper bound).
static tri_status mixed_f16_rows(tri__backend *be, const tri__sim_profile *p, const tri_model_config *tc,
                                 void **buf, double *t_read) {
    const double row16 = 2.0 * 2.0 * tc->n_head_kv * tc->head_dim;  // f16 K and V of one token and layer
    const int64_t attend = 16 + 240, rows = attend + 2 * TRI__PLAN_MIXED_STEP;
    *t_read = tc->n_layer * (double)attend * row16 / ((p->attn_gbps > 0 ? p->attn_gbps : p->mem_gbps) * 1e9);
    return be->ops->alloc(be, (size_t)(rows * tc->n_layer * row16), buf);
}

// The split L3 pass of m rows with the host attending f of every offloaded layer's rows: the
// device's part timed on the sim over the rest (the store made again holding them: two would not
// fit the device; the layers on the device attend the host's share too, at the device's memory
// rate), the host's part from its FLOPs and bytes with every GPU's DMA sharing its DRAM
// (tri__sim_host_split_seconds) and 30 us per layer for the queries down, the partial state down
// and the output up. The store is left holding ctx rows.
static tri_status split_pass(const l3_ctx *x, const tri__sim_host *h, int32_t m, double f, double *dev, double *host) {
    const sim_opts *o = x->o;
    const tri_model_config *tc = x->tc, *full = x->full;
    int32_t n_dev = o->ctx - (int32_t)(f * o->ctx);
    double row_full = 2.0 * full->n_head_kv * (double)tri__dtype_row_bytes(x->kst, full->head_dim);
    double row_shard = 2.0 * tc->n_head_kv * (double)tri__dtype_row_bytes(x->kst, tc->head_dim);
    sim_pass ps3 = {0};
    tri__kv_store_free(x->l3);
    tri_status st = sim_store(x->l3, x->be, x->kst, tc, x->capacity, x->on_chip, n_dev);
    if (!st) st = sim_time_pass(x->tv, x->be, x->l3, m, &ps3);
    tri__kv_store_free(x->l3);
    tri_status st2 = sim_store(x->l3, x->be, x->kst, tc, x->capacity, x->on_chip, o->ctx);
    if (st || st2) return st ? st : st2;
    *dev = ps3.seconds + x->t_f16 +
           x->on_chip * (double)(o->ctx - n_dev) * row_shard /
               ((x->p->attn_gbps > 0 ? x->p->attn_gbps : x->p->mem_gbps) * 1e9);
    if (o->gpus == 2) *dev += allreduce_seconds(tc, x->p, m);
    int32_t n_off = tc->n_layer - x->on_chip;
    double dma = (ps3.kv_up + ps3.w_up) * o->gpus;  // every GPU's DMA reads this host's memory
    *host = tri__sim_host_split_seconds(h, (double)n_off * (o->ctx - n_dev), m, full->n_head, full->head_dim, row_full,
                                        o->host_bf16, dma, x->p->h2d_gbps * o->gpus) +
            n_off * 30e-6;
    return TRI_STATUS_OK;
}

// Simulated passes by rows (the L3 pass, full or split, and the L2 pass depend on nothing else here).
#define PASS_CACHE 64
typedef struct pass_cache {
    int32_t n;
    struct {
        int32_t m, host;  // host: -1 the whole L3 pass, -2 the L2 pass, else the host profile's index
        double a, b[2];   // seconds: the pass (or the split's device part); the split's f and host part
    } e[PASS_CACHE];
} pass_cache;

static double *cache_find(pass_cache *c, int32_t m, int32_t host, double **b) {
    for (int32_t i = 0; i < c->n; i++)
        if (c->e[i].m == m && c->e[i].host == host) {
            *b = c->e[i].b;
            return &c->e[i].a;
        }
    return NULL;
}

static double *cache_add(pass_cache *c, int32_t m, int32_t host, double **b) {
    if (c->n == PASS_CACHE) c->n = 0;  // forget all: a rerun is exact
    c->e[c->n].m = m;
    c->e[c->n].host = host;
    *b = c->e[c->n].b;
    return &c->e[c->n++].a;
}

// A growing text buffer for a table.
typedef struct sbuf {
    char *buf;
    size_t len, cap;
} sbuf;

TRI__PRINTF(2, 3)
static void sput(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap : 4096);
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *q = realloc(b->buf, cap);
        if (!q) return;
        b->buf = q;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

// The chain vs tree rows of one TriForce placement: for each acceptance (stated, and the curve's
// when there is one), each chain of --gamma2 and tree of --trees, each host (none: all rows
// stream; then --hosts with the split): the L3 pass at the shape's rows and the L2 pass at its
// drafting's rows timed on the sim, tokens per pass from the best tree under the acceptance table,
// and the planner's choice per host (tri__plan_choose) against the best simulated row.
static tri_status tree_rows(const l3_ctx *x, const tri_plan_model *pm, const tri_plan_params *pp,
                            const tri__sim_curve *cv, const tri__sim_host *const *hosts, int n_hosts, int32_t budget,
                            double t1, tri__kv_store *l2, sbuf *out, double paper) {
    const sim_opts *o = x->o;
    const tri_model_config *full = x->full;
    tri__accept_table *tab = malloc(2 * sizeof *tab);
    tri__tree_shape *ts = malloc(sizeof *ts);
    pass_cache *cache = calloc(1, sizeof *cache);
    tri_status st = tab && ts && cache ? TRI_STATUS_OK : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "bench-offload: trees");
    const char *kvn = tri_dtype_name(x->kvt);
    const int flags = o->tree_general ? TRI__PLAN_TREE_GENERAL : 0;
    // a curve with tree records twice: its siblings modelled (rank 1's rate by depth x decay, as a
    // chain curve's), then as measured per depth and rank, beside each other
    const bool has_tree = cv && cv->tree_depth > 0;
    tri__sim_curve *chain_only = has_tree ? malloc(sizeof *chain_only) : NULL;
    if (has_tree && !chain_only) st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "bench-offload: trees");
    if (chain_only) *chain_only = *cv, chain_only->tree_depth = 0;
    for (int ai = 0; !st && ai < (cv ? has_tree ? 3 : 2 : 1); ai++) {
        bool measured = false;
        if (ai == 0) {
            tri__accept_table_constant(&tab[0], o->beta, o->rank_decay);
            tri__accept_table_constant(&tab[1], o->alpha, o->rank_decay);
        } else {
            const tri__sim_curve *c = ai == 1 && has_tree ? chain_only : cv;
            tri__sim_curve_table(c, 0, o->rank_decay, &tab[0], NULL);
            tri__sim_curve_table(c, 1, o->rank_decay, &tab[1], &measured);
        }
        const char *acc = ai == 0 ? "stated" : measured ? "curve, ranks measured" : "curve, ranks modelled";
        double e1 = tri__accept_chain_expected(&tab[0], o->gamma1);
        double best_ms[5] = {0, 0, 0, 0, 0};
        char best_what[5][32] = {"", "", "", "", ""};
        for (int si = 0; !st && si < o->n_gamma2 + o->n_trees; si++) {
            bool tree = si >= o->n_gamma2;
            int32_t N = tree ? o->trees[si - o->n_gamma2] : o->gamma2s[si];
            for (int hi = -1; !st && hi < n_hosts; hi++) {
                const tri__sim_host *h = hi >= 0 ? hosts[hi] : NULL;
                // the planner first: the split's f and, for a tree, its depth (the best tree of N
                // at the depth that costs least per token on this host)
                tri_plan_params ps = *pp;
                ps.gamma2 = tree ? pp->gamma2 : N;
                ps.tree_nodes = tree ? N : 0;
                double row_full = 2.0 * full->n_head_kv * (double)tri__dtype_row_bytes(x->kst, full->head_dim);
                if (h) {
                    ps.host_attn_gbps =
                        tri__sim_host_attn_gbps(h, N + 1, full->n_head, full->head_dim, row_full, o->host_bf16);
                    ps.host_dram_gbps = h->dram_gbps;
                }
                tri_plan pls;
                bool planned = tri__plan_compute_accept(pm, &ps, &tab[0], &tab[1], flags, &pls) == TRI_STATUS_OK;
                int32_t m3 = N + 1, m2 = o->gamma1 + 1, depth = N, nodes = N;
                double passes = N / e1, per_round = tri__accept_chain_expected(&tab[1], N);
                if (tree) {
                    int32_t extra;
                    if ((st = tri__accept_tree_best(&tab[1], N, planned ? pls.tree_depth : 0, !flags, ts))) break;
                    tri__accept_tree_drafting(ts, e1, &passes, &extra);
                    m3 = ts->n + 1;
                    m2 += (int32_t)ceil(extra / fmax(passes, 1.0));
                    per_round = ts->expected;
                    depth = ts->depth_max;
                    nodes = ts->n;
                }
                // the whole L3 pass and the L2 pass at their rows, on the sim
                double *a, *b, t3, t2;
                if ((a = cache_find(cache, m3, -1, &b))) {
                    t3 = *a;
                } else {
                    sim_pass q;
                    if ((st = sim_time_pass(x->tv, x->be, x->l3, m3, &q))) break;
                    t3 = q.seconds + x->t_f16 + (o->gpus == 2 ? allreduce_seconds(x->tc, x->p, m3) : 0);
                    *cache_add(cache, m3, -1, &b) = t3;
                }
                if ((a = cache_find(cache, m2, -2, &b))) {
                    t2 = *a;
                } else {
                    sim_pass q;
                    if ((st = sim_time_pass(x->tv, x->be, l2, m2, &q))) break;
                    t2 = q.seconds + (o->gpus == 2 ? allreduce_seconds(x->tc, x->p, m2) : 0);
                    *cache_add(cache, m2, -2, &b) = t2;
                }
                double t21 = passes * t2 + passes * o->gamma1 * t1;
                double f = planned && h ? pls.kv_host_fraction : 0, t3s = t3;
                if (h && f > 0) {
                    double dev, host;
                    if ((a = cache_find(cache, m3, hi, &b)) && fabs(*b - f) < 1e-12) {
                        dev = *a, host = b[1];
                    } else {
                        if ((st = split_pass(x, h, m3, f, &dev, &host))) break;
                        double *fb;
                        *cache_add(cache, m3, hi, &fb) = dev;
                        fb[0] = f;
                        fb[1] = host;
                    }
                    t3s = fmax(dev, host);
                }
                double ms = 1e3 * (t3s + t21) / per_round;
                char what[32];
                snprintf(what, sizeof what, tree ? "tree of %d" : "chain of %d", N);
                if (best_what[hi + 1][0] == 0 || ms < best_ms[hi + 1]) {
                    best_ms[hi + 1] = ms;
                    snprintf(best_what[hi + 1], sizeof best_what[0], "%s", what);
                }
                sput(out,
                     "| %s | %d | %s | %s | %s | %d | %d | %d | %.2f | %.2f | %d | %.2f | %.1f | %.1f | %.1f | %.1f "
                     "| %.0f |\n",
                     kvn, budget, acc, h ? h->name : "none (all streamed)", what, nodes, depth, m3, per_round, passes,
                     m2, f, 1e3 * t3s, 1e3 * t21, ms, planned ? 1e3 * pls.t_token : NAN, paper);
            }
        }
        // the planner's choice per host, against the best simulated row
        for (int hi = -1; !st && hi < n_hosts; hi++) {
            const tri__sim_host *h = hi >= 0 ? hosts[hi] : NULL;
            tri_plan ch;
            double tflops = h ? (o->host_bf16 ? h->bf16_tflops : h->f32_tflops) : 0;
            if (tri__plan_choose(pm, pp, &tab[0], &tab[1], flags, tflops, h ? h->dram_gbps : 0, o->gamma2s, o->n_gamma2,
                                 o->trees, o->n_trees, &ch))
                continue;
            char what[32];
            snprintf(what, sizeof what, ch.params.tree_nodes > 0 ? "tree of %d" : "chain of %d",
                     ch.params.tree_nodes > 0 ? ch.params.tree_nodes : ch.params.gamma2);
            sput(out,
                 "| %s | %d | %s | %s | **planner's choice: %s** (best simulated: %s, %.1f ms/token) | | | | %.2f | "
                 "%.2f | | %.2f | %.1f | | | %.1f | %.0f |\n",
                 kvn, budget, acc, h ? h->name : "none (all streamed)", what, best_what[hi + 1], best_ms[hi + 1],
                 ch.tokens_per_round, ch.l2_passes, ch.kv_host_fraction, 1e3 * ch.t_l3, 1e3 * ch.t_token, paper);
        }
    }
    free(cache);
    free(chain_only);
    free(ts);
    free(tab);
    return st;
}

// The profile --profile names and the curve --accept-curve reads (*cv NULL without one): 0, or the
// exit status after saying what is wrong.
static int sim_inputs(const sim_opts *o, const tri__sim_profile **prof, tri__sim_curve *curve,
                      const tri__sim_curve **cv) {
    *cv = NULL;
    if (!(*prof = tri__sim_profile_find(o->profile))) {
        sim_usage();
        return 2;
    }
    if (o->curve_path) {
        if (tri__sim_curve_read(o->curve_path, curve)) {
            fprintf(stderr, "bench-offload: %s\n", tri_last_error());
            return 2;
        }
        *cv = curve;
    }
    return 0;
}

// The planner's parameters for a run on the simulated profile p: its rates and memory, n_ctx
// tokens, a retrieval budget, the KV type and the stated acceptance (mode TriForce, the default).
static tri_plan_params sim_plan_params(const sim_opts *o, const tri__sim_profile *p, int32_t n_ctx, int32_t budget,
                                       tri_dtype kv_type) {
    tri_plan_params pp = tri_plan_default_params();
    pp.n_ctx = n_ctx;
    pp.n_gpu = o->gpus;
    pp.gpu_mem_bytes = p->mem_bytes;
    pp.pcie_gbps = p->h2d_gbps;
    pp.gpu_mem_gbps = p->mem_gbps;
    pp.gpu_tflops = p->matmul_tflops;
    pp.layer_overhead_us = 0;
    pp.retrieval_budget = budget;
    if (o->reserve) pp.gpu_reserve_bytes = o->reserve;  // 1 byte for --reserve 0, as bench-offload
    pp.gamma1 = o->gamma1;
    pp.accept_l1 = o->beta;
    pp.accept_l2 = o->alpha;
    pp.kv_type = kv_type;
    return pp;
}

static int run_paper(const sim_opts *o) {
    const tri__sim_profile *prof;
    tri__sim_curve curve;
    const tri__sim_curve *cv;
    int rc = sim_inputs(o, &prof, &curve, &cv);
    if (rc) return rc;
    const tri__sim_host *hosts[4];
    int n_hosts = 0;
    if (strcmp(o->hosts, "none")) {
        char list[128];
        snprintf(list, sizeof list, "%s", o->hosts);
        for (char *t = strtok(list, ","); t && n_hosts < 4; t = strtok(NULL, ",")) {
            if (!(hosts[n_hosts++] = tri__sim_host_find(t))) {
                fprintf(stderr, "bench-offload: --hosts: unknown host '%s' (desktop, workstation or none)\n", t);
                return 2;
            }
        }
    }
    tri_model_config full, tc, dc;
    bench_shape(o->shape, &full);
    bench_shape("llama-68m", &dc);
    if (!strcmp(o->shape, "tiny")) dc = full, dc.n_layer = 1;
    tc = full;
    if (o->gpus == 2) {  // one GPU's shard of a tensor-parallel split
        tc.n_head /= 2;
        tc.n_head_kv /= 2;
        tc.n_ff /= 2;
    }
    tri__sim_profile p = *prof;
    p.mem_bytes = o->gpu_mem ? o->gpu_mem : prof->mem_bytes;
    tri__backend *be = NULL;
    tri_model *target = NULL, *draft = NULL;
    if (tri__backend_sim_create(&p, &be) || tri__model_synthetic_shape(&tc, o->weights, &target) ||
        tri__model_synthetic_shape(&dc, TRI_DTYPE_F16, &draft)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        tri__backend_free(be);
        tri__model_synthetic_free(target);
        return 1;
    }
    bench_print_machine();
    printf("device: SIMULATED sim:%s x %d: %s\n", p.name, o->gpus, p.desc);
    printf("profile rates reached: matmul %.1f TFLOP/s, other ops %.1f TFLOP/s, memory %.0f GB/s, PCIe %.1f GB/s "
           "each way, launch %.1f us, least kernel %.1f us, memory %.1f GiB\n",
           p.matmul_tflops, p.vector_tflops, p.mem_gbps, p.h2d_gbps, p.launch_us, p.kernel_us,
           (double)p.mem_bytes / (1 << 30));
    if (o->gpus == 2)
        printf("two GPUs (tensor parallel): one GPU's shard is simulated (%d of %d heads, n_ff %d of %d) plus two "
               "all-reduces per layer through pinned host memory (15 us + f32 bytes down and up / PCIe rate each)\n",
               tc.n_head, full.n_head, tc.n_ff, full.n_ff);
    printf("model: %s shape, %s weights (shape only: no memory), context %d tokens (KV never materialised)\n",
           o->shape, tri_dtype_name(o->weights), o->ctx);
    printf("forced acceptance: alpha %.2f (L3 accepts an L2 token), beta %.2f (L2 accepts an L1 token), gamma1 %d\n",
           o->alpha, o->beta, o->gamma1);
    printf("every level's cache of the KV type in the first column (the planner's assumption; the runtime's "
           "TriForce holds q8_0 / q4_0 full caches, but not mixed ones: the mixed TriForce rows are a prediction; "
           "mixed: q4_0 rows streamed and stored, 16 + 240 f16 rows read from a resident ring of 512 per layer)\n");
    printf("\n| KV | mode | budget | gamma2 | resident blocks | KV layers on device | L3 pass ms | L2 pass ms | L1 pass ms | tokens/round "
           "| ms/token (simulated) | planner ms/token | MB over PCIe/token | PCIe floor ms/token | transfer hidden "
           "| compute overlapped | paper ms/token |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double paper_ar = o->gpus == 2 ? 840 : 1516, paper_tf = o->gpus == 2 ? 108 : 312;
    rc = 0;
    size_t cap_rows = 1 << 16, n_rows = 0;
    char *rows = calloc(1, cap_rows);  // the split table, printed after the main one
    sbuf trows = {0};                  // the chain vs tree table, after that
    if (!rows) {
        tri__model_synthetic_free(draft);
        tri__model_synthetic_free(target);
        tri__backend_free(be);
        return 1;
    }
    for (int run = 0; run < (o->n_budgets + 1) * o->n_kv && !rc; run++) {
        const tri_dtype kvt = o->kv_types[run / (o->n_budgets + 1)], kst = tri__plan_kv_store_type(kvt);
        const char *kvn = tri_dtype_name(kvt);
        bool ar = run % (o->n_budgets + 1) == 0;
        int32_t budget = ar ? 0 : o->budgets[run % (o->n_budgets + 1) - 1];
        int32_t g2max = 1;
        for (int i = 0; i < o->n_gamma2; i++) g2max = o->gamma2s[i] > g2max ? o->gamma2s[i] : g2max;
        int32_t rows_max = g2max;  // the L3 store holds the longest pass's rows past the context
        for (int i = 0; i < o->n_trees; i++) rows_max = o->trees[i] > rows_max ? o->trees[i] : rows_max;
        // the planner, on the whole model and both GPUs, with the profile's rates
        tri_plan_params pp = sim_plan_params(o, &p, o->ctx + g2max + 1, budget, kvt);
        pp.mode = ar ? TRI_PLAN_MODE_AUTOREGRESSIVE : TRI_PLAN_MODE_TRIFORCE;
        // pp.n_ctx: the chains' placement; a tree's longer pass takes a few more rows
        const int32_t cap3 = o->ctx + rows_max + 1;
        tri_plan_model pm, dm;
        tri_model *whole = NULL;
        if (tri__model_synthetic_shape(&full, o->weights, &whole)) {
            rc = 1;
            break;
        }
        tri_plan_model_from_model(whole, &pm);
        tri__model_synthetic_free(whole);
        tri_plan_model_from_model(draft, &dm);
        pp.draft_bytes = (uint64_t)dc.n_layer * dm.layer_bytes + dm.other_bytes;
        pp.draft_n_layer = dc.n_layer;
        pp.gamma2 = g2max;
        tri_plan plan;
        if (tri_plan_compute(&pm, &pp, &plan)) {
            printf("| %s | %s | %d | | cannot place: %s |\n", kvn, ar ? "autoregressive" : "TriForce", budget,
                   tri_last_error());
            continue;
        }
        if (plan.n_weights_disk > 0) {
            printf("| %s | %s | %d | | the plan reads weights from disk, which the simulation does not model |\n", kvn,
                   ar ? "autoregressive" : "TriForce", budget);
            continue;
        }
        int32_t streamed = plan.n_weights_host;
        tri_model *tv = NULL, *dv = NULL;
        tri__kv_store l3 = {0}, l2 = {0}, l1 = {0};
        void *f16_rows = NULL;
        double t_f16 = 0;
        tri_status st = tri__model_on_backend(target, be, streamed, 0, &tv);
        if (!st && kvt == TRI_DTYPE_KV_MIXED) st = mixed_f16_rows(be, &p, &tc, &f16_rows, &t_f16);
        if (!st) st = sim_store(&l3, be, kst, &tc, cap3, plan.on_chip, o->ctx);
        if (!st && !ar) {
            st = sim_store(&l2, be, kst, &tc, budget + 256, tc.n_layer, budget);
            if (!st) st = tri__model_on_backend(draft, be, 0, 0, &dv);
            if (!st) st = sim_store(&l1, be, kst, &dc, 256 + 64, dc.n_layer, 256);
        }
        sim_pass p2 = {0}, p1 = {0};
        if (!st && !ar) st = sim_time_pass(tv, be, &l2, o->gamma1 + 1, &p2);
        if (!st && !ar) st = sim_time_pass(dv, be, &l1, 1, &p1);
        if (o->gpus == 2 && !ar) p2.seconds += allreduce_seconds(&tc, &p, o->gamma1 + 1);
        l3_ctx lx = {.o = o,
                     .be = be,
                     .p = &p,
                     .tv = tv,
                     .l3 = &l3,
                     .kvt = kvt,
                     .kst = kst,
                     .tc = &tc,
                     .full = &full,
                     .capacity = cap3,
                     .on_chip = plan.on_chip,
                     .t_f16 = t_f16};
        for (int gi = 0; !st && gi < (ar ? 1 : o->n_gamma2); gi++) {
            int32_t g2 = ar ? 0 : o->gamma2s[gi];
            sim_pass p3;
            if ((st = sim_time_pass(tv, be, &l3, g2 + 1, &p3))) break;
            p3.seconds += t_f16;
            if (o->gpus == 2) p3.seconds += allreduce_seconds(&tc, &p, g2 + 1);
            double per_round = ar ? 1.0 : sim_expected(o->alpha, g2);
            double l2_passes = ar ? 0 : g2 / sim_expected(o->beta, o->gamma1);
            double l1_passes = l2_passes * o->gamma1;
            double t_round = p3.seconds + l2_passes * p2.seconds + l1_passes * p1.seconds;
            // bytes over one GPU's link per token (each GPU moves its shard over its own link)
            double bytes = (p3.kv_up + p3.w_up + l2_passes * p2.w_up) / per_round;
            double floor_s = bytes / (p.h2d_gbps * 1e9);
            double t_tok = t_round / per_round;
            // the planner for this gamma2
            tri_plan_params pg = pp;
            pg.gamma2 = ar ? pp.gamma2 : g2;
            tri_plan pl;
            double plan_ms = tri_plan_compute(&pm, &pg, &pl) ? NAN : 1e3 * pl.t_token;
            char b2[16] = "-", g2s[16] = "-", t2[16] = "-", t1[16] = "-";
            if (!ar) {
                snprintf(b2, sizeof b2, "%d", budget);
                snprintf(g2s, sizeof g2s, "%d", g2);
                snprintf(t2, sizeof t2, "%.2f", 1e3 * p2.seconds);
                snprintf(t1, sizeof t1, "%.3f", 1e3 * p1.seconds);
            }
            printf("| %s | %s | %s | %s | %d of %d | %d of %d | %.1f | %s | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.0f |\n",
                   kvn, ar ? "autoregressive" : "TriForce", b2, g2s, tc.n_layer - streamed, tc.n_layer, plan.on_chip,
                   tc.n_layer, 1e3 * p3.seconds, t2, t1,
                   per_round, 1e3 * t_tok, plan_ms, bytes / 1e6, 1e3 * floor_s,
                   p3.transfer_busy > 0 ? 100.0 * p3.hidden / p3.transfer_busy : 0.0,
                   p3.compute_busy > 0 ? 100.0 * p3.hidden / p3.compute_busy : 0.0, ar ? paper_ar : paper_tf);
            fflush(stdout);
            // the split rows: each host profile, stated rates and the measured curve
            for (int hi = 0; !st && hi < n_hosts; hi++) {
                const tri__sim_host *h = hosts[hi];
                int32_t m = g2 + 1;
                // K and V of the KV type, every GPU's heads
                double row_full = 2.0 * full.n_head_kv * (double)tri__dtype_row_bytes(kst, full.head_dim);
                tri_plan_params ps = pg;
                ps.host_attn_gbps = tri__sim_host_attn_gbps(h, m, full.n_head, full.head_dim, row_full, o->host_bf16);
                ps.host_dram_gbps = h->dram_gbps;
                tri_plan pls;
                if (tri_plan_compute(&pm, &ps, &pls)) continue;
                double f = pls.kv_host_fraction, dev = 0, host = 0;
                if ((st = split_pass(&lx, h, m, f, &dev, &host))) break;
                double t3s = fmax(dev, host);
                for (int ai = 0; ai < (cv && !ar ? 2 : 1); ai++) {
                    bool use_curve = ai == 1;
                    double rnd = ar ? 1.0 : use_curve ? tri__sim_curve_expected(cv, 1, g2) : sim_expected(o->alpha, g2);
                    double l2p = ar ? 0 : g2 / (use_curve ? tri__sim_curve_expected(cv, 0, o->gamma1)
                                                          : sim_expected(o->beta, o->gamma1));
                    double l2l1 = l2p * p2.seconds + l2p * o->gamma1 * p1.seconds;
                    double no_split = (p3.seconds + l2l1) / rnd, split = (t3s + l2l1) / rnd;
                    if (n_rows + 512 > cap_rows) break;
                    n_rows += (size_t)snprintf(rows + n_rows, cap_rows - n_rows,
                                               "| %s | %s | %s | %s | %s | %s | %.0f GB/s | %.2f | %.2f | %.1f | "
                                               "%.1f | %.2f | %.1f | %.1f | %.1f | %.0f |\n",
                                               kvn, ar ? "autoregressive" : "TriForce", b2, g2s, h->name,
                                               ar ? "-" : use_curve ? "measured curve" : "stated",
                                               ps.host_attn_gbps, f, rnd, 1e3 * p3.seconds, 1e3 * dev, 1e3 * host,
                                               1e3 * no_split, 1e3 * split, 1e3 * pls.t_token, ar ? paper_ar : paper_tf);
                }
            }
            // the simulator's bytes are the runtime's: every upload of a decode pass is counted by both
            if (fabs(p3.h2d_bytes - (p3.kv_up + p3.w_up)) > 0.5 + 0.001 * p3.h2d_bytes)
                fprintf(stderr, "bench-offload: note: the timeline moved %.0f bytes host -> device, the runtime "
                                "counted %.0f (KV and weights; the rest are small copies)\n",
                        p3.h2d_bytes, p3.kv_up + p3.w_up);
        }
        if (!st && !ar && o->n_trees > 0)
            st = tree_rows(&lx, &pm, &pp, cv, hosts, n_hosts, budget, p1.seconds, &l2, &trows, paper_tf);
        if (st) {
            fprintf(stderr, "bench-offload: %s: %s\n", ar ? "autoregressive" : "TriForce", tri_last_error());
            rc = 1;
        }
        tri__kv_store_free(&l1);
        tri__kv_store_free(&l2);
        tri__kv_store_free(&l3);
        if (f16_rows) be->ops->free(be, f16_rows);
        tri__model_backend_free(dv);
        tri__model_backend_free(tv);
    }
    if (n_rows > 0) {
        printf("\nsplit attention (docs/offload.md): each offloaded layer's rows [0, f x ctx) attended on the host "
               "where they lie, the rest streamed; f the planner's for the host profile; the device's pass timed "
               "on the simulator over its share, the host's from its FLOPs and bytes with the DMA sharing DRAM\n");
        for (int hi = 0; hi < n_hosts; hi++)
            printf("host %s: %s; %d cores, f32 %.2f / bf16 %.2f TFLOP/s reached, DRAM %.0f GB/s, %d NUMA node(s)\n",
                   hosts[hi]->name, hosts[hi]->desc, hosts[hi]->cores, hosts[hi]->f32_tflops, hosts[hi]->bf16_tflops,
                   hosts[hi]->dram_gbps, hosts[hi]->numa_nodes);
        if (cv)
            printf("acceptance: stated alpha %.2f beta %.2f, and the curve measured in %s: L1 chain %.2f pooled, L2 "
                   "chain %.2f pooled, %.2f tokens per L3 pass measured at gamma2 %d\n",
                   o->alpha, o->beta, o->curve_path, cv->pooled[0], cv->pooled[1], cv->tokens_per_l3, cv->gamma2);
        printf("\n| KV | mode | budget | gamma2 | host | acceptance | host attention | split f | tokens/round | L3 pass ms | L3 device "
               "part ms | L3 host part ms | ms/token no split | ms/token split | planner ms/token split | paper "
               "ms/token |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n%s",
               rows);
    }
    free(rows);
    if (trows.len > 0) {
        printf(
            "\nchain vs tree (docs/offload.md, \"Token trees\"): L3 verifies a chain of gamma2 or the best tree of at "
            "most N nodes (Sequoia's programme) under the acceptance by depth and sibling rank in one pass of its "
            "nodes + 1 rows; a sibling of rank r >= 2 is kept at the depth's rate x %.2f^(r - 1) (stated model) "
            "unless the curve measured ranks; L2 drafts the tree's main path as the chain (L1 feeding it) and "
            "evaluates each internal off-path node one pass after its parent's, beside it (tri__accept_tree_drafting); "
            "host none: every offloaded row streams; the split's f is the planner's for the host at the pass's query "
            "count; simulated L3 and L2 passes at their row counts\n",
            o->rank_decay);
        printf(
            "\n| KV | budget | acceptance | host | L3 verifies | nodes | depth | rows / L3 pass | tokens / L3 pass "
            "| L2 passes / round | L2 rows | split f | L3 pass ms | L2 + L1 ms / round | ms/token (simulated) | "
            "planner "
            "ms/token | paper ms/token |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n%s",
            trows.buf);
    }
    free(trows.buf);
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    printf("\npaper (Llama2-7B-128K, 127K-token prompt): autoregressive 1516 ms/token on one RTX 4090 and 840 on "
           "two; TriForce 312 ms/token on one, 108 on two. Simulated device memory at most %.2f GiB.\n",
           (double)s.mem_peak / (1 << 30));
    tri__model_synthetic_free(draft);
    tri__model_synthetic_free(target);
    tri__backend_free(be);
    return rc;
}

// ---- the TriForce batch (issue 31): B sequences in one pass per level ----

// One batched pass of m tokens for each of the n sequences whose caches are kv[0 .. n) (each
// rolled back after it), through tri__llama_forward_batch: one pass over the weights for the
// n x m rows, each sequence's attention over its own cache (an offloaded layer streams each
// sequence's rows). Timed on the sim after a warm-up pass, as sim_time_pass.
static tri_status sim_time_batch(const tri_model *model, tri__backend *be, tri__kv_store *kv, int32_t n, int32_t m,
                                 sim_pass *out) {
    const tri_model_config *c = &model->config;
    tri__llama run;
    tri_status st = tri__llama_init(&run, model, be, n * m);
    if (st) return st;
    tri__llama *ll = calloc((size_t)n, sizeof *ll);
    tri__kv_policy *pol = calloc((size_t)n, sizeof *pol);
    tri__llama_seq *seq = calloc((size_t)n, sizeof *seq);
    int32_t *tok = malloc(sizeof *tok * (size_t)m);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)m * (size_t)c->n_vocab);
    int32_t n_ll = 0, n_pol = 0;
    if (!ll || !pol || !seq || !tok || !logits)
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "bench-offload: batch of %d", n);
    for (int32_t i = 0; !st && i < m; i++) tok[i] = (7 * i + 3) % c->n_vocab;
    for (int32_t i = 0; !st && i < n; i++) {
        if (!(st = tri__llama_init(&ll[i], model, be, m))) n_ll++;
        if (!st && !(st = tri__kv_policy_wrap_full(&pol[i], &kv[i], c->n_head, m))) n_pol++;
        seq[i] = (tri__llama_seq){.ll = &ll[i],
                                  .pol = &pol[i],
                                  .tokens = tok,
                                  .n = m,
                                  .mode = m > 1 ? TRI_LOGITS_ALL : TRI_LOGITS_LAST,
                                  .logits = logits + (size_t)i * (size_t)m * (size_t)c->n_vocab};
    }
    tri__kv_offload_stats k0 = {0}, k1;
    tri__weight_stream_stats w0, w1;
    for (int rep = 0; !st && rep < 2; rep++) {
        if (rep == 1) {
            memset(&k0, 0, sizeof k0);
            for (int32_t i = 0; i < n; i++) {
                tri__kv_offload_stats ki;
                tri__kv_store_offload_stats(&kv[i], &ki);
                k0.bytes_up += ki.bytes_up;
            }
            tri__model_stream_stats(model, &w0);
            tri__sim_reset(be);
        }
        int32_t n0 = kv[0].n;
        st = tri__llama_forward_batch(&run, seq, n);
        for (int32_t i = 0; !st && i < n; i++) st = tri__kv_policy_truncate(&pol[i], n0);
    }
    if (!st) {
        tri__sim_stats ss;
        tri__sim_stats_get(be, &ss);
        uint64_t up = 0;
        for (int32_t i = 0; i < n; i++) {
            tri__kv_store_offload_stats(&kv[i], &k1);
            up += k1.bytes_up;
        }
        tri__model_stream_stats(model, &w1);
        *out = (sim_pass){.seconds = ss.end,
                          .transfer_busy = ss.transfer_busy,
                          .compute_busy = ss.compute_busy,
                          .hidden = ss.transfer_hidden,
                          .h2d_bytes = (double)ss.h2d_bytes,
                          .kv_up = (double)(up - k0.bytes_up),
                          .w_up = (double)(w1.bytes_up - w0.bytes_up)};
    }
    for (int32_t i = 0; i < n_pol; i++) tri__kv_policy_free(&pol[i]);
    for (int32_t i = 0; i < n_ll; i++) tri__llama_free(&ll[i]);
    tri__llama_free(&run);
    free(ll), free(pol), free(seq), free(tok), free(logits);
    return st;
}

// n stores of one shape (capacity, on_chip, holding len rows), or none: on failure every one made
// is freed.
static tri_status sim_stores(tri__kv_store *kv, int32_t n, tri__backend *be, tri_dtype type, const tri_model_config *c,
                             int32_t capacity, int32_t on_chip, int32_t len) {
    for (int32_t i = 0; i < n; i++) {
        tri_status st = sim_store(&kv[i], be, type, c, capacity, on_chip, len);
        if (st) {
            for (int32_t j = 0; j <= i; j++) tri__kv_store_free(&kv[j]);
            return st;
        }
    }
    return TRI_STATUS_OK;
}

static void sim_stores_free(tri__kv_store *kv, int32_t n) {
    for (int32_t i = 0; i < n; i++) tri__kv_store_free(&kv[i]);
}

// What the batch table needs of one placement timed on the sim: its passes.
typedef struct batch_times {
    double t3, t2, t1;   // seconds of one batched L3 pass (gamma2 + 1 rows each), L2 (gamma1 + 1), L1 (1)
    double kv_up, w_up;  // bytes the L3 pass uploaded: every sequence's offloaded KV, streamed weights
} batch_times;

// Places the plan's target (streamed blocks) and n sequences' caches on be and times the batched
// passes; tf: the L2 and L1 passes too (n retrieval caches of budget rows, n draft caches of 256).
static tri_status batch_time(const sim_opts *o, tri__backend *be, const tri__sim_profile *p, const tri_model *target,
                             const tri_model *draft, const tri_model_config *tc, const tri_model_config *dc,
                             const tri_plan *plan, tri_dtype kvt, int32_t n, int32_t budget, int32_t g2, bool tf,
                             batch_times *out) {
    const tri_dtype kst = tri__plan_kv_store_type(kvt);
    tri__kv_store *l3 = calloc((size_t)n, sizeof *l3), *l2 = calloc((size_t)n, sizeof *l2),
                  *l1 = calloc((size_t)n, sizeof *l1);
    tri_model *tv = NULL, *dv = NULL;
    void **f16 = calloc((size_t)n, sizeof *f16);  // kv_type mixed: each sequence's f16 rows
    double t_f16 = 0;
    bool h3 = false, h2 = false, h1 = false;
    tri_status st = l3 && l2 && l1 && f16 ? TRI_STATUS_OK : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "bench-offload: batch");
    if (!st) st = tri__model_on_backend(target, be, plan->n_weights_host, 0, &tv);
    if (!st && kvt == TRI_DTYPE_KV_MIXED) {  // every sequence's f16 rows, read by every L3 pass
        for (int32_t i = 0; !st && i < n; i++) st = mixed_f16_rows(be, p, tc, &f16[i], &t_f16);
        t_f16 *= n;
    }
    if (!st) h3 = !(st = sim_stores(l3, n, be, kst, tc, o->ctx + g2 + 1, plan->on_chip, o->ctx));
    if (!st && tf) h2 = !(st = sim_stores(l2, n, be, kst, tc, budget + 256, tc->n_layer, budget));
    if (!st && tf) st = tri__model_on_backend(draft, be, 0, 0, &dv);
    if (!st && tf) h1 = !(st = sim_stores(l1, n, be, kst, dc, 256 + 64, dc->n_layer, 256));
    sim_pass q = {0};
    *out = (batch_times){0};
    if (!st) st = sim_time_batch(tv, be, l3, n, tf ? g2 + 1 : 1, &q);
    if (!st) {
        out->t3 = q.seconds + t_f16 + (o->gpus == 2 ? allreduce_seconds(tc, p, n * (tf ? g2 + 1 : 1)) : 0);
        out->kv_up = q.kv_up, out->w_up = q.w_up;
    }
    if (!st && tf && !(st = sim_time_batch(tv, be, l2, n, o->gamma1 + 1, &q)))
        out->t2 = q.seconds + (o->gpus == 2 ? allreduce_seconds(tc, p, n * (o->gamma1 + 1)) : 0);
    if (!st && tf && !(st = sim_time_batch(dv, be, l1, n, 1, &q))) out->t1 = q.seconds;
    if (h1) sim_stores_free(l1, n);
    if (h2) sim_stores_free(l2, n);
    if (h3) sim_stores_free(l3, n);
    for (int32_t i = 0; f16 && i < n; i++)
        if (f16[i]) be->ops->free(be, f16[i]);
    free(f16);
    tri__model_backend_free(dv);
    tri__model_backend_free(tv);
    free(l1), free(l2), free(l3);
    return st;
}

// The simulated TriForce batch: for each B of --batch, B sequences of --ctx tokens each, the
// planner's placement for the batch (tri_plan_params.n_batch), the L3, L2 and L1 passes of the
// whole batch timed on the sim, and per round: L2 passes = gamma2 / E(L1's chain) x the lockstep
// factor (tri__plan_lockstep: the round waits for the sequence that needs the most), tokens =
// B x E(L3's chain of gamma2); at the stated rates and, with --accept-curve, at the curve's. The
// autoregressive batch beside it (its own placement, one row per sequence per pass).
static int run_batch(const sim_opts *o) {
    const tri__sim_profile *prof;
    tri__sim_curve curve;
    const tri__sim_curve *cv;
    int rc = sim_inputs(o, &prof, &curve, &cv);
    if (rc) return rc;
    tri_model_config full, tc, dc;
    bench_shape(o->shape, &full);
    bench_shape("llama-68m", &dc);
    if (!strcmp(o->shape, "tiny")) dc = full, dc.n_layer = 1;
    tc = full;
    if (o->gpus == 2) tc.n_head /= 2, tc.n_head_kv /= 2, tc.n_ff /= 2;
    tri__sim_profile p = *prof;
    p.mem_bytes = o->gpu_mem ? o->gpu_mem : prof->mem_bytes;
    const int32_t budget = o->budgets[0], g2 = o->gamma2s[0];
    const tri_dtype kvt = o->kv_types[0];
    tri__backend *be = NULL;
    tri_model *target = NULL, *draft = NULL, *whole = NULL;
    if (tri__backend_sim_create(&p, &be) || tri__model_synthetic_shape(&tc, o->weights, &target) ||
        tri__model_synthetic_shape(&dc, TRI_DTYPE_F16, &draft) ||
        tri__model_synthetic_shape(&full, o->weights, &whole)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        tri__backend_free(be);
        tri__model_synthetic_free(target);
        tri__model_synthetic_free(draft);
        return 1;
    }
    tri_plan_model pm, dm;
    tri_plan_model_from_model(whole, &pm);
    tri__model_synthetic_free(whole);
    tri_plan_model_from_model(draft, &dm);
    bench_print_machine();
    printf("device: SIMULATED sim:%s x %d: %s; memory %.1f GiB per GPU\n", p.name, o->gpus, p.desc,
           (double)p.mem_bytes / (1 << 30));
    printf(
        "model: %s shape, %s weights (shape only), %s KV, every sequence %d tokens of context (KV never "
        "materialised); retrieval budget %d per sequence, gamma1 %d, gamma2 %d\n",
        o->shape, tri_dtype_name(o->weights), tri_dtype_name(kvt), o->ctx, budget, o->gamma1, g2);
    printf(
        "a batch of B: one pass per level carries every sequence's rows (tri__llama_forward_batch): the weights "
        "read once, each sequence's attention over its own cache, each sequence's offloaded KV streamed once per "
        "layer; L2 drafts in lockstep (a round waits for the sequence needing the most L2 passes)\n");
    tri__accept_table *tab = malloc(2 * sizeof *tab);
    if (!tab) return 1;
    const int n_acc = cv ? 2 : 1;
    printf(
        "\n| GPUs | B | acceptance | resident blocks | KV layers on device | L3 pass ms | L2 pass ms | L1 pass ms "
        "| L2 passes / round (lockstep x) | tokens / round | TriForce tokens/s (simulated) | x batch 1 | planner "
        "tokens/s | autoregressive tokens/s (simulated) | TriForce / autoregressive | paper |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double base[2] = {0, 0};
    rc = 0;
    for (int bi = 0; bi < o->n_batches && !rc; bi++) {
        const int32_t B = o->batches[bi];
        tri_plan_params pp = sim_plan_params(o, &p, o->ctx + g2 + 1, budget, kvt);
        pp.gamma2 = g2;
        pp.draft_bytes = (uint64_t)dc.n_layer * dm.layer_bytes + dm.other_bytes;
        pp.draft_n_layer = dc.n_layer;
        pp.n_batch = B;
        tri_plan pl, pa;
        tri_plan_params pq = pp;
        pq.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
        bool ok_tf = tri_plan_compute(&pm, &pp, &pl) == TRI_STATUS_OK && pl.n_weights_disk == 0;
        char why[256] = "";
        if (!ok_tf) snprintf(why, sizeof why, "%s", pl.n_weights_disk ? "weights from disk" : tri_last_error());
        bool ok_ar = tri_plan_compute(&pm, &pq, &pa) == TRI_STATUS_OK && pa.n_weights_disk == 0;
        batch_times bt = {0}, ba = {0};
        tri_status st = TRI_STATUS_OK;
        if (ok_tf) st = batch_time(o, be, &p, target, draft, &tc, &dc, &pl, kvt, B, budget, g2, true, &bt);
        if (!st && ok_ar) st = batch_time(o, be, &p, target, draft, &tc, &dc, &pa, kvt, B, budget, g2, false, &ba);
        if (st) {
            fprintf(stderr, "bench-offload: batch %d: %s\n", B, tri_last_error());
            rc = 1;
            break;
        }
        double ar_tps = ok_ar ? B / ba.t3 : NAN;
        if (!ok_tf) {
            printf("| %d | %d | | cannot place TriForce: %s | | | | | | | | | | %.1f | | %s |\n", o->gpus, B, why,
                   ar_tps, B == 6 ? "~1.9x (batch 6, 19K)" : "");
            continue;
        }
        for (int ai = 0; ai < n_acc; ai++) {
            double e3, e1, lock;
            if (ai == 0) {
                tri__accept_table_constant(&tab[0], o->beta, o->rank_decay);
                e3 = sim_expected(o->alpha, g2), e1 = sim_expected(o->beta, o->gamma1);
            } else {
                tri__sim_curve_table(cv, 0, o->rank_decay, &tab[0], NULL);
                e3 = tri__sim_curve_expected(cv, 1, g2), e1 = tri__sim_curve_expected(cv, 0, o->gamma1);
            }
            lock = tri__plan_lockstep(&tab[0], o->gamma1, g2, B, NULL);
            double passes = g2 / e1 * lock;
            double t_round = bt.t3 + passes * (bt.t2 + o->gamma1 * bt.t1);
            double tps = B * e3 / t_round;
            if (B == 1) base[ai] = tps;
            char ratio[32] = "-";
            if (base[ai] > 0) snprintf(ratio, sizeof ratio, "%.2fx", tps / base[ai]);
            printf(
                "| %d | %d | %s | %d of %d | %d of %d | %.1f | %.2f | %.3f | %.2f (x %.3f) | %.1f | %.1f | %s | %s | "
                "%.1f | %.2fx | %s |\n",
                o->gpus, B, ai == 0 ? "stated" : "measured curve", pl.n_weights_gpu, tc.n_layer, pl.on_chip, tc.n_layer,
                1e3 * bt.t3, 1e3 * bt.t2, 1e3 * bt.t1, passes, lock, B * e3, tps, ratio, ai == 0 ? "" : "", ar_tps,
                tps / ar_tps, B == 6 ? "~1.9x (batch 6, 19K)" : "");
            if (ai == 0) {
                // the planner's own prediction, the same stated rates
                printf(
                    "|  |  | planner (stated) | | | %.1f | %.2f | %.3f | %.2f (x %.3f) | %.1f | | | %.1f | %.1f | "
                    "%.2fx | |\n",
                    1e3 * pl.t_l3, 1e3 * pl.t_l2, 1e3 * pl.t_l1, pl.l2_passes, pl.l2_lockstep, pl.tokens_per_round,
                    1 / pl.t_token, 1 / pa.t_token, pa.t_token / pl.t_token);
            }
        }
        fflush(stdout);
    }
    free(tab);
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    printf(
        "\nL3 bytes uploaded per pass are every sequence's offloaded KV plus streamed weights; simulated device "
        "memory at most %.2f GiB. Acceptance: stated alpha %.2f, beta %.2f",
        (double)s.mem_peak / (1 << 30), o->alpha, o->beta);
    if (cv) printf("; curve %s (L1 pooled %.2f, L2 pooled %.2f)", o->curve_path, cv->pooled[0], cv->pooled[1]);
    printf(".\n");
    tri__model_synthetic_free(draft);
    tri__model_synthetic_free(target);
    tri__backend_free(be);
    return rc;
}

// ---- self-check: this machine's CPU as a profile ----

// out = seconds per execution of stmt over reps executions (the best of three batches).
#define TIME_BEST(out, reps, stmt)                                \
    do {                                                          \
        double best_ = 1e30;                                      \
        for (int b_ = 0; b_ < 3; b_++) {                          \
            double t0_ = bench_now();                             \
            for (int r_ = 0; r_ < (reps); r_++) (void)(stmt);     \
            double d_ = (bench_now() - t0_) / (reps);             \
            if (d_ < best_) best_ = d_;                           \
        }                                                         \
        (out) = best_;                                            \
    } while (0)

// Runs `tokens` one-token passes after `prompt` positions on be and returns the mean seconds per
// pass: wall time on a real backend, the timeline on the sim.
static tri_status decode_time(const tri_model *model, tri__backend *be, int32_t prompt, int32_t tokens, double *out) {
    tri__kv_store kv;
    const tri_model_config *c = &model->config;
    tri_status st = tri__kv_store_init(&kv, be, TRI_DTYPE_F16, c->n_layer, c->n_head_kv, c->head_dim, prompt + tokens);
    if (st) return st;
    tri__llama ll;
    tri__kv_policy pol;
    if ((st = tri__llama_init(&ll, model, be, 128))) {
        tri__kv_store_free(&kv);
        return st;
    }
    if ((st = tri__kv_policy_wrap_full(&pol, &kv, c->n_head, 128))) {
        tri__llama_free(&ll);
        tri__kv_store_free(&kv);
        return st;
    }
    int32_t *tok = malloc(sizeof *tok * (size_t)(prompt + tokens));
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab);
    if (!tok || !logits) st = TRI_STATUS_OUT_OF_MEMORY;
    for (int32_t i = 0; !st && i < prompt + tokens; i++) tok[i] = (int32_t)((7u * (uint32_t)i + 3u) % (uint32_t)c->n_vocab);
    for (int32_t i = 0; !st && i < prompt; i += 128)
        st = tri__llama_forward_policy(&ll, &pol, tok + i, prompt - i < 128 ? prompt - i : 128, TRI_LOGITS_LAST, logits);
    bool sim = tri__backend_is_sim(be);
    if (sim) tri__sim_reset(be);
    double t0 = bench_now();
    for (int32_t i = 0; !st && i < tokens; i++)
        st = tri__llama_forward_policy(&ll, &pol, tok + prompt + i, 1, TRI_LOGITS_LAST, logits);
    if (!st) {
        if (sim) {
            tri__sim_stats s;
            tri__sim_stats_get(be, &s);
            *out = s.end / tokens;
        } else {
            *out = (bench_now() - t0) / tokens;
        }
    }
    free(tok);
    free(logits);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
    tri__kv_store_free(&kv);
    return st;
}

// The profile of this machine's CPU backend: each rate from single ops timed now (best of three
// batches), printed when verbose. 1 on failure.
static int calibrate(tri__backend *cpu, const tri_model *model, const sim_opts *o, bool verbose, tri__sim_profile *out) {
    const tri_model_config *c = &model->config;
    tri__sim_profile p = {.name = "cpu", .desc = "this machine's CPU backend, rates measured by single ops",
                          .h2d_gbps = 1e3, .d2h_gbps = 1e3, .launch_us = 0, .mem_bytes = (uint64_t)64 << 30};
    const tri__backend_ops *op = cpu->ops;
    int64_t big = (int64_t)1 << 22, n_buf = big > c->n_vocab ? big : c->n_vocab;
    float *x = calloc((size_t)n_buf, sizeof *x), *y = calloc((size_t)n_buf, sizeof *y);
    float *z = calloc((size_t)big, sizeof *z);
    float *xm = calloc((size_t)64 * (size_t)c->n_ff, sizeof *xm), *ym = calloc((size_t)64 * (size_t)c->n_ff, sizeof *ym);
    tri__kv_store kv = {0};
    int rc = 1;
    if (!x || !y || !z || !xm || !ym) goto done;
    for (int64_t i = 0; i < big; i++) x[i] = (float)(i % 17) * 0.01f;
    // memory: a residual add over 16 MiB (reads two, writes one)
    double t_add;
    TIME_BEST(t_add, 20, op->add(cpu, z, x, y, big));
    p.mem_gbps = 12.0 * (double)big / t_add / 1e9;
    // the least time of an op: an rmsnorm of one row (the smallest op of a decode step)
    const tri__layer *L0 = &model->layers[0];
    double t_small;
    TIME_BEST(t_small, 2000, op->rmsnorm(cpu, y, x, L0->attn_norm->data, L0->attn_norm->type, 1, c->n_embd, 1e-5f));
    p.kernel_us = 1e6 * t_small;
    if (verbose)
        printf("calibration: add over 4M floats %.2f GB/s (memory rate); rmsnorm of one row %.2f us (least op)\n",
               p.mem_gbps, p.kernel_us);
    // matmuls at m = 1: weight bytes per second per weight type, over every weight of the type in
    // turn (as a decode step reads them: from memory, not from a cache that one matrix fits in)
    for (int t = 0; t < 8; t++) {
        double best = 1e30, bytes = 0;
        int64_t count = 0;
        for (int b = 0; b < 3; b++) {
            double t0 = bench_now();
            bytes = 0;
            count = 0;
            for (int64_t i = 0; i < model->n_tensors; i++) {
                const tri__tensor *w = &model->tensors[i];
                if (w->type != (tri_dtype)t || w->n_dims != 2 || !w->data) continue;
                (void)op->matmul(cpu, y, x, w->data, w->type, 1, w->shape[0], w->shape[1]);
                bytes += (double)w->n_bytes;
                count++;
            }
            double d = bench_now() - t0;
            if (d < best) best = d;
        }
        if (count == 0) continue;
        p.matmul_gbps[t] = bytes / best / 1e9;
        if (verbose)
            printf("calibration: matmul m=1 over the %lld %s weights (%.1f MB): %.3f ms, %.2f GB/s of weights\n",
                   (long long)count, tri_dtype_name((tri_dtype)t), bytes / 1e6, 1e3 * best, p.matmul_gbps[t]);
    }
    // matmuls at m = 64: FLOP/s (prefill; a decode step never reaches it)
    const tri__tensor *w = L0->w_gate;
    double tm;
    TIME_BEST(tm, 3, op->matmul(cpu, ym, xm, w->data, w->type, 64, w->shape[0], w->shape[1]));
    p.matmul_tflops = 2.0 * 64 * (double)w->shape[0] * (double)w->shape[1] / tm / 1e12;
    // attention of one token over the decode's mean context: FLOP/s of the other ops
    int32_t n = o->prompt + o->tokens / 2;
    if (tri__kv_store_init(&kv, cpu, TRI_DTYPE_F16, 1, c->n_head_kv, c->head_dim, n)) goto done;
    (void)tri__kv_store_set_len(&kv, n);
    tri__kv_view view;
    const tri__kv_view *v = tri__kv_store_view(&kv, 0, n, &view);
    int32_t pos = n - 1;
    double ta;
    TIME_BEST(ta, 50, op->attention(cpu, y, x, &pos, 1, c->n_head, c->head_dim, v, NULL));
    p.vector_tflops = 4.0 * (double)c->n_head * (double)n * (double)c->head_dim / ta / 1e12;
    if (verbose)
        printf("calibration: attention of one token over %d keys %.3f ms: %.1f GFLOP/s (other ops); matmul m=64 "
               "%.1f GFLOP/s\n",
               n, 1e3 * ta, 1e3 * p.vector_tflops, 1e3 * p.matmul_tflops);
    *out = p;
    rc = 0;
done:
    tri__kv_store_free(&kv);
    free(x);
    free(y);
    free(z);
    free(xm);
    free(ym);
    return rc;
}

// Rounds of calibrate, simulate, measure, back to back, so that each round's prediction and
// measurement see the same load on this shared machine.
static int run_self_check(const sim_opts *o) {
    tri_model *model = NULL;
    tri__backend *cpu = NULL;
    if (tri_model_load(o->self_check, NULL, &model) || tri__backend_cpu_create(o->threads, TRI_CPU_SIMD_AUTO, &cpu)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        tri_model_free(model);
        return 1;
    }
    bench_print_machine();
    printf("self-check: %s on the CPU backend (%d threads), prompt %d, %d decoded tokens, %d rounds\n", o->self_check,
           cpu->n_threads, o->prompt, o->tokens, o->rounds);
    int rc = 0;
    double err_sum = 0, err_max = 0;
    for (int r = 0; r < o->rounds && !rc; r++) {
        tri__sim_profile p;
        tri__backend *be = NULL;
        tri_model *sv = NULL;
        double t_sim = 0, t_cpu = 0;
        if (calibrate(cpu, model, o, r == 0, &p)) {
            rc = 1;
            break;
        }
        if (r == 0) printf("\n| round | simulated ms/token | measured ms/token | error | ops/token |\n|---|---|---|---|---|\n");
        tri_status st = tri__backend_sim_create(&p, &be);
        if (!st) st = tri__model_on_backend(model, be, 0, 0, &sv);
        if (!st) st = decode_time(sv, be, o->prompt, o->tokens, &t_sim);
        if (!st) st = decode_time(model, cpu, o->prompt, o->tokens, &t_cpu);
        if (st) {
            fprintf(stderr, "bench-offload: %s\n", tri_last_error());
            rc = 1;
        } else {
            tri__sim_stats s;
            tri__sim_stats_get(be, &s);
            double err = (t_sim - t_cpu) / t_cpu;
            err_sum += fabs(err);
            if (fabs(err) > err_max) err_max = fabs(err);
            printf("| %d | %.2f | %.2f | %+.1f%% | %" PRId64 " |\n", r + 1, 1e3 * t_sim, 1e3 * t_cpu, 100.0 * err,
                   s.n_ops / o->tokens);
            fflush(stdout);
        }
        tri__model_backend_free(sv);
        tri__backend_free(be);
    }
    if (!rc) printf("\nmean |error| %.1f%%, largest %.1f%% over %d rounds\n", 100.0 * err_sum / o->rounds,
                    100.0 * err_max, o->rounds);
    tri__backend_free(cpu);
    tri_model_free(model);
    return rc;
}

// ---- the speculative engine itself on the simulated device ----

// This machine's rates for host-side work on offloaded rows (ops->host_work): a gather of 256-byte
// rows (a head's key of head_dim 128 in f16) at scattered offsets of a 256 MiB region, and chunk
// summaries (tri__chunk_mean) over 64 MiB of f16 keys; best of three each.
static void measure_host_rates(tri__sim_profile *p) {
    const size_t region = (size_t)256 << 20, row = 256, n_rows = 65536;
    char *src = malloc(region), *dst = malloc(n_rows * row);
    float *means = malloc(sizeof(float) * 4096 * 2048);
    if (!src || !dst || !means) goto done;
    memset(src, 0x3c, region);  // f16 0x3c3c: 1.06, a normal number (subnormals would be slow)
    uint64_t x = 88172645463325252ull;
    double best = 1e30;
    for (int b = 0; b < 3; b++) {
        double t0 = bench_now();
        for (size_t r = 0; r < n_rows; r++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(dst + r * row, src + (x % (region / row)) * row, row);
        }
        double d = bench_now() - t0;
        if (d < best) best = d;
    }
    p->host_copy_gbps = (double)(n_rows * row) / best / 1e9;
    best = 1e30;
    const int64_t chunks = 2048, width = 4096;  // 2048 chunks of 8 rows of 4096 f16: 128 MiB
    for (int b = 0; b < 3; b++) {
        double t0 = bench_now();
        tri__chunk_mean(means, src, TRI_DTYPE_F16, chunks / 4, 8, width, width);  // 32 MiB
        double d = bench_now() - t0;
        if (d < best) best = d;
    }
    p->host_reduce_gbps = (double)(chunks / 4 * 8 * width * 2) / best / 1e9;
done:
    free(src);
    free(dst);
    free(means);
}


// tri_spec_create opens its backend through tri__backend_select; with this factory set its "CPU"
// is a simulated device of engine_profile, and engine_be remembers it for the clock.
static const tri__sim_profile *engine_profile;
static tri__backend *engine_be;

static tri_status engine_factory(int32_t n_threads, tri__backend **out) {
    (void)n_threads;
    tri_status st = tri__backend_sim_create(engine_profile, out);
    if (!st) engine_be = *out;
    return st;
}

// At the end of the prefill, the timeline restarts: what follows is decoding.
static bool engine_on_prefill(int64_t done, int64_t total, void *user) {
    (void)user;
    if (done == total && engine_be) tri__sim_reset(engine_be);
    return true;
}

// Runs the real engine (tri_generate_spec, TRIFORCE, L1 the llama-68m shape) for o->engine tokens
// after a prompt of o->ctx tokens, with acceptance forced inside its loop (tri__spec_force_accept),
// budget and gamma2 the first of the lists, on the planner's placement; prints simulated ms/token
// of the decode and what the engine counted.
static int run_engine(const sim_opts *o) {
    const tri__sim_profile *prof = tri__sim_profile_find(o->profile);
    if (!prof || o->gpus != 1) {
        fprintf(stderr, "bench-offload: --engine needs a GPU profile and one GPU\n");
        return 2;
    }
    tri__sim_profile p = *prof;
    if (o->gpu_mem) p.mem_bytes = o->gpu_mem;
    tri__sim_curve curve;
    tri__accept_table tab[2];  // the curve's, for the planner's prediction
    if (o->curve_path) {
        if (tri__sim_curve_read(o->curve_path, &curve)) {
            fprintf(stderr, "bench-offload: %s\n", tri_last_error());
            return 2;
        }
        tri__sim_curve_table(&curve, 0, o->rank_decay, &tab[0], NULL);
        tri__sim_curve_table(&curve, 1, o->rank_decay, &tab[1], NULL);
    }
    measure_host_rates(&p);
    engine_profile = &p;
    tri_model_config tc, dc;
    bench_shape(o->shape, &tc);
    bench_shape("llama-68m", &dc);
    if (!strcmp(o->shape, "tiny")) dc = tc, dc.n_layer = 1;
    tri_model *target = NULL, *draft = NULL;
    if (tri__model_synthetic_shape(&tc, o->weights, &target) || tri__model_synthetic_shape(&dc, TRI_DTYPE_F16, &draft)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        tri__model_synthetic_free(target);
        return 1;
    }
    int32_t budget = o->budgets[0], g2 = o->gamma2s[0];
    int32_t n_ctx = o->ctx + o->engine + g2 + 2 + o->tree_nodes;
    tri_plan_params pp = tri_plan_default_params();
    pp.mode = TRI_PLAN_MODE_TRIFORCE;
    pp.n_ctx = n_ctx;
    pp.gpu_mem_bytes = p.mem_bytes;
    pp.pcie_gbps = p.h2d_gbps;
    pp.gpu_mem_gbps = p.mem_gbps;
    pp.gpu_tflops = p.matmul_tflops;
    pp.layer_overhead_us = 0;
    pp.retrieval_budget = budget;
    pp.gamma1 = o->gamma1;
    pp.gamma2 = g2;
    pp.accept_l1 = o->beta;
    pp.accept_l2 = o->alpha;
    tri_plan_model pm, dm;
    tri_plan_model_from_model(target, &pm);
    tri_plan_model_from_model(draft, &dm);
    pp.draft_bytes = (uint64_t)dc.n_layer * dm.layer_bytes + dm.other_bytes;
    pp.draft_n_layer = dc.n_layer;
    tri_plan plan;
    int rc = 1;
    tri_spec *spec = NULL;
    int32_t *prompt = NULL;
    if (tri__plan_compute_accept(&pm, &pp, o->curve_path ? &tab[0] : NULL, o->curve_path ? &tab[1] : NULL, 0, &plan))
        goto fail;
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;  // the factory makes it the simulated device
    sp.n_ctx = n_ctx;
    sp.kv_layers_offloaded = tc.n_layer - plan.on_chip;
    sp.weight_layers_streamed = plan.n_weights_host + plan.n_weights_disk;
    tri_spec_params spp = tri_spec_default_params();
    spp.mode = TRI_SPEC_MODE_TRIFORCE;
    spp.drafter = TRI_SPEC_DRAFTER_MODEL;
    spp.draft_model = draft;
    spp.gamma1 = o->gamma1;
    spp.gamma2 = g2;
    spp.budget = budget;
    spp.tree_nodes = o->tree_nodes;
    tri__backend_cpu_factory = engine_factory;
    tri_status st = tri_spec_create(target, &sp, &spp, &spec);
    tri__backend_cpu_factory = NULL;
    if (st) goto fail;
    if (o->curve_path) {  // acceptance by depth as measured; beyond the deepest, the pooled rate
        tri__spec_force_accept(spec, curve.pooled[0], curve.pooled[1], 42);
        tri__spec_force_accept_depth(spec, 0, curve.rate[0], curve.depth[0]);
        tri__spec_force_accept_depth(spec, 1, curve.rate[1], curve.depth[1]);
    } else {
        tri__spec_force_accept(spec, o->beta, o->alpha, 42);
    }
    // a tree's siblings: by depth and rank as the curve's tree lines measured them (rank r >= 1 the
    // file's r, its index r + 1 there; unmeasured, the rank's pooled rate), else alpha x
    // --rank-decay^r (the tables' stated model)
    const bool tree_curve = o->curve_path && curve.tree_depth > 0;
    if (o->tree_nodes > 0) {
        static double rate[(TRI__SPEC_MAX_DEPTH + 1) * (TRI__TREE_MAX_RANK + 1)];
        const int32_t R1 = TRI__TREE_MAX_RANK + 1;
        int32_t depths = tree_curve ? curve.tree_depth : 1;
        if (depths > TRI__SPEC_MAX_DEPTH) depths = TRI__SPEC_MAX_DEPTH;
        for (int32_t d = 1; d <= depths; d++)
            for (int32_t r = 1; r <= TRI__TREE_MAX_RANK; r++) {
                double a = o->alpha * pow(o->rank_decay, r);
                if (tree_curve && r + 1 <= TRI_SIM_TREE_RANKS)
                    a = d <= TRI_SIM_CURVE_DEPTH && curve.tree_reached[d][r + 1] > 0 ? curve.tree[d][r + 1]
                                                                                     : curve.tree_pooled[r + 1];
                rate[d * R1 + r] = a;
            }
        tri__spec_force_accept_tree(spec, rate, depths);
    }
    prompt = malloc(sizeof *prompt * (size_t)o->ctx);
    if (!prompt) goto fail;
    for (int32_t i = 0; i < o->ctx; i++) prompt[i] = (int32_t)((7u * (uint32_t)i + 3u) % (uint32_t)tc.n_vocab);
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = o->engine;
    gp.sampler.temperature = 0;
    gp.stop_at_eos = false;
    gp.on_prefill = engine_on_prefill;
    tri_spec_stats ss;
    double t0 = bench_now();
    if (tri_generate_spec(spec, prompt, o->ctx, &gp, NULL, NULL, &ss)) goto fail;
    double wall = bench_now() - t0;
    tri__sim_stats s;
    tri__sim_stats_get(engine_be, &s);
    bench_print_machine();
    printf("device: SIMULATED sim:%s: %s\n", p.name, p.desc);
    printf("engine: tri_generate_spec, TRIFORCE, llama-68m-shaped L1, %s-shaped target, prompt %d, budget %d, gamma1 "
           "%d, gamma2 %d; plan: %d of %d blocks resident, %d KV layers on the device\n",
           o->shape, o->ctx, budget, o->gamma1, g2, tc.n_layer - sp.weight_layers_streamed, tc.n_layer, plan.on_chip);
    printf("host-side work on offloaded rows at this machine's rates: gathers %.2f GB/s, chunk summaries %.2f GB/s\n",
           p.host_copy_gbps, p.host_reduce_gbps);
    if (o->tree_nodes > 0) {
        int64_t nodes = ss.n_l3_tree_nodes, passes = ss.n_l3_verify > 0 ? ss.n_l3_verify : 1;
        printf("token trees of %d nodes at L3 (%.1f drafted nodes per pass), siblings kept by rank ", o->tree_nodes,
               (double)nodes / (double)passes);
        if (tree_curve) printf("as the curve's tree lines measured them\n");
        else printf("at alpha x %.2f^rank (a stated model)\n", o->rank_decay);
    }
    if (o->curve_path)
        printf(
            "acceptance forced inside the engine's loop by depth, as measured in %s (pooled: L2 keeps %.2f of L1's "
            "tokens, L3 %.2f of L2's)\n",
            o->curve_path, curve.pooled[0], curve.pooled[1]);
    else
        printf(
            "acceptance forced inside the engine's loop: L2 keeps an L1 token with probability %.2f, L3 an L2 token "
            "with %.2f\n",
            o->beta, o->alpha);
    printf("\n| tokens | L3 passes | tokens / L3 pass | L2 verifications | L1 accepted / proposed | L2 accepted / proposed "
           "| L2 selections | ms/token (simulated) | planner ms/token | MB up/token | host work ms/token | transfer hidden "
           "| run on this machine s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %d | %lld | %.2f | %lld | %lld / %lld | %lld / %lld | %lld | %.1f | %.1f | %.1f | %.2f | %.0f%% | %.1f |\n",
           ss.n_generated, (long long)ss.n_l3_verify, (double)ss.n_generated / (double)ss.n_l3_verify,
           (long long)ss.n_l2_verify, (long long)ss.l1_accepted, (long long)ss.l1_proposed, (long long)ss.l2_accepted,
           (long long)ss.l2_proposed, (long long)ss.n_l2_refresh, 1e3 * s.end / ss.n_generated, 1e3 * plan.t_token,
           (double)s.h2d_bytes / 1e6 / ss.n_generated, 1e3 * s.host_work / ss.n_generated,
           s.transfer_busy > 0 ? 100.0 * s.transfer_hidden / s.transfer_busy : 0.0, wall);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "bench-offload: %s\n", tri_last_error());
    free(prompt);
    tri_spec_free(spec);
    tri__model_synthetic_free(draft);
    tri__model_synthetic_free(target);
    return rc;
}

// --gpu-mem as bench-offload takes it (16G, 1064M), or a plain number of GiB.
static bool sim_size(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = *end == 'M' || *end == 'm' ? 1 << 20 : 1 << 30;
    if (end == s || !(v > 0) || (*end && strchr("GgMm", *end) == NULL) || (*end && end[1])) return false;
    *out = (uint64_t)(v * mul);
    return true;
}

int bench_offload_sim(int argc, char **argv) {
    sim_opts o = {.shape = "llama2-7b",
                  .ctx = 130048,
                  .gamma1 = 2,
                  .gpus = 1,
                  .prompt = 256,
                  .tokens = 32,
                  .threads = 0,
                  .rounds = 3,
                  .budgets = {8192, 12288},
                  .n_budgets = 2,
                  .gamma2s = {12, 16},
                  .n_gamma2 = 2,
                  .alpha = 0.9,
                  .beta = 0.7,
                  .weights = TRI_DTYPE_F16,
                  .hosts = "desktop,workstation",
                  .kv_types = {TRI_DTYPE_F16, TRI_DTYPE_Q8_0},
                  .n_kv = 2,
                  .trees = {16, 32, 64, 128},
                  .n_trees = 4,
                  .rank_decay = 0.5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(a, "--device") && v) ok = !strncmp(v, "sim:", 4) && (o.profile = v + 4)[0];
        else if (!strcmp(a, "--shape") && v) ok = !strcmp((o.shape = v), "llama2-7b") || !strcmp(v, "tiny");
        else if (!strcmp(a, "--self-check") && v) o.self_check = v;
        else if (!strcmp(a, "--engine") && v) ok = (o.engine = atoi(v)) > 0;
        else if (!strcmp(a, "--tree-nodes") && v) ok = (o.tree_nodes = atoi(v)) >= 0 && o.tree_nodes <= 1024;
        else if (!strcmp(a, "--ctx") && v) ok = (o.ctx = atoi(v)) > 0;
        else if (!strcmp(a, "--gpus") && v) ok = (o.gpus = atoi(v)) == 1 || o.gpus == 2;
        else if (!strcmp(a, "--prompt") && v) ok = (o.prompt = atoi(v)) > 0;
        else if (!strcmp(a, "--tokens") && v) ok = (o.tokens = atoi(v)) > 0;
        else if (!strcmp(a, "--threads") && v) ok = (o.threads = atoi(v)) > 0;
        else if (!strcmp(a, "--rounds") && v) ok = (o.rounds = atoi(v)) > 0;
        else if (!strcmp(a, "--gamma1") && v) ok = (o.gamma1 = atoi(v)) > 0;
        else if (!strcmp(a, "--gpu-mem") && v) ok = sim_size(v, &o.gpu_mem);
        else if (!strcmp(a, "--passes") && v) ok = atoi(v) > 0;  // bench-offload's; the timeline repeats exactly
        else if (!strcmp(a, "--reserve") && v) ok = sim_size(v, &o.reserve) || (!strcmp(v, "0") && (o.reserve = 1));
        else if (!strcmp(a, "--budgets") && v) ok = (o.n_budgets = sim_list(v, o.budgets)) > 0;
        else if (!strcmp(a, "--gamma2") && v) ok = (o.n_gamma2 = sim_list(v, o.gamma2s)) > 0;
        else if (!strcmp(a, "--accept") && v) ok = (o.alpha = atof(v)) > 0 && o.alpha <= 1;
        else if (!strcmp(a, "--accept-l1") && v) ok = (o.beta = atof(v)) > 0 && o.beta <= 1;
        else if (!strcmp(a, "--accept-curve") && v) o.curve_path = v;
        else if (!strcmp(a, "--hosts") && v) o.hosts = v;
        else if (!strcmp(a, "--batch") && v) {
            ok = (o.n_batches = sim_list(v, o.batches)) > 0;
            for (int b = 0; ok && b < o.n_batches; b++) ok = o.batches[b] <= 64;
        }
        else if (!strcmp(a, "--trees") && v) {
            o.n_trees = !strcmp(v, "none") ? 0 : sim_list(v, o.trees);
            for (int t = 0; ok && t < o.n_trees; t++) ok = o.trees[t] <= TRI_PLAN_TREE_MAX_NODES;
            ok = ok && (o.n_trees > 0 || !strcmp(v, "none"));
        } else if (!strcmp(a, "--rank-decay") && v)
            ok = (o.rank_decay = atof(v)) >= 0 && o.rank_decay <= 1;
        else if (!strcmp(a, "--host-bf16"))
            o.host_bf16 = ok = true, i--;
        else if (!strcmp(a, "--tree-general"))
            o.tree_general = ok = true, i--;
        else if (!strcmp(a, "--kv-type") && v) {
            o.n_kv = 0;
            for (const char *t = v; ok && *t && o.n_kv < MAX_LIST;) {
                size_t len = strcspn(t, ",");
                char name[16] = "";
                if (len < sizeof name) memcpy(name, t, len);
                ok = len < sizeof name && (tri__kv_type_parse(name, &o.kv_types[o.n_kv]) ||
                                           (!strcmp(name, "mixed") && (o.kv_types[o.n_kv] = TRI_DTYPE_KV_MIXED)));
                o.n_kv++;
                t += len + (t[len] == ',');
            }
            ok = ok && o.n_kv > 0;
        } else if (!strcmp(a, "--weights") && v) {
            o.weights = !strcmp(v, "q8_0") ? TRI_DTYPE_Q8_0 : !strcmp(v, "q4_0") ? TRI_DTYPE_Q4_0 : TRI_DTYPE_F16;
            ok = !strcmp(v, "f16") || o.weights != TRI_DTYPE_F16;
        } else ok = false;
        if (!ok) {
            sim_usage();
            return 2;
        }
        i++;
    }
    if (o.self_check) {
        if (strcmp(o.profile, "cpu")) {
            sim_usage();
            return 2;
        }
        return run_self_check(&o);
    }
    if (o.n_batches > 0) return run_batch(&o);
    return o.engine > 0 ? run_engine(&o) : run_paper(&o);
}
