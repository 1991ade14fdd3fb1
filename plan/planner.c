// planner.c - placement of weights and KV across GPU, pinned host memory and disk, and the
// predicted time of a TriForce round. Pure computation; docs/offload.md explains the model.
#include "planner.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "dtype.h"
#include "error.h"
#include "hf-config.h"
#include "json-read.h"
#include "kv-policy.h"
#include "model.h"
#include "tp-split.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
// Rows of the retrieval cache besides its budget: the ring of tokens since its selection
// (kv-policy.h), with the engine's default batch of 128.
#define RETRIEVAL_SLACK(p) tri__kv_l2_ring((p)->chunk_size, (p)->gamma1, (p)->gamma2, 128)
// The draft's StreamingLLM cache and activations, beside its weights.
#define DRAFT_EXTRA_BYTES ((uint64_t)16 << 20)
// Staging buffers for weights read from disk: layer i being uploaded, i + 1 and i + 2 being read.
#define DISK_STAGING_LAYERS 3

// ---- sizes ----

double tri__plan_expected_tokens(double alpha, int32_t gamma) {
    if (gamma < 0) gamma = 0;
    if (alpha >= 1.0) return (double)gamma + 1.0;
    if (alpha <= 0.0) return 1.0;
    return (1.0 - pow(alpha, (double)gamma + 1.0)) / (1.0 - alpha);
}

tri_dtype tri__plan_kv_store_type(tri_dtype kv_type) {
    return kv_type == TRI_DTYPE_KV_MIXED ? TRI_DTYPE_Q4_0 : kv_type;
}

double tri__plan_lockstep(const tri__accept_table *l1, int32_t gamma1, int32_t gamma2, int32_t n_batch, double *mean) {
    if (mean) *mean = 0;
    if (gamma1 < 1 || gamma2 < 1) return 1;
    if (gamma1 > TRI_PLAN_TREE_DEPTH) gamma1 = TRI_PLAN_TREE_DEPTH;
    // one pass keeps i of the gamma1 drafts (then adds a token): P(i) = a1 ... ai (1 - a(i+1)), all
    // kept a1 ... a(gamma1); live[t]: P(not done, holding t < gamma2 tokens) after n passes
    double keep[TRI_PLAN_TREE_DEPTH + 1], all = 1;
    for (int32_t i = 0; i <= gamma1; i++) {
        double next = i < gamma1 ? l1->a[i + 1][1] : 0;
        keep[i] = all * (1 - next);
        all *= next;
    }
    double *live = calloc((size_t)gamma2 * 2, sizeof *live);
    if (!live) return 1;
    double *nxt = live + gamma2, e_n = 0, e_max = 0;
    live[0] = 1;
    for (int32_t n = 0; n <= gamma2; n++) {  // each pass adds at least one token
        double surv = 0;  // P(N > n)
        for (int32_t t = 0; t < gamma2; t++) surv += live[t];
        e_n += surv;
        e_max += 1 - pow(1 - surv, n_batch);
        if (surv <= 0) break;
        memset(nxt, 0, sizeof *nxt * (size_t)gamma2);
        for (int32_t t = 0; t < gamma2; t++)
            for (int32_t i = 0; i <= gamma1 && live[t] > 0; i++)
                if (t + i + 1 < gamma2) nxt[t + i + 1] += live[t] * keep[i];
        memcpy(live, nxt, sizeof *live * (size_t)gamma2);
    }
    free(live);
    if (mean) *mean = e_n;
    return n_batch > 1 && e_n > 0 ? e_max / e_n : 1;
}

// ---- token trees ----

void tri__accept_table_constant(tri__accept_table *t, double rate, double decay) {
    memset(t, 0, sizeof *t);
    for (int32_t d = 1; d <= TRI_PLAN_TREE_DEPTH; d++) {
        double a = rate;
        for (int32_t r = 1; r <= TRI_PLAN_TREE_RANKS; r++, a *= decay) t->a[d][r] = a;
    }
}

double tri__accept_chain_expected(const tri__accept_table *t, int32_t g) {
    double e = 1, all = 1;
    for (int32_t d = 1; d <= g && d <= TRI_PLAN_TREE_DEPTH; d++) {
        all *= t->a[d][1];
        e += all;
    }
    return e;
}

// P(the child of rank r at depth d is the one kept | its parent kept): every lower rank rejected,
// then this one kept.
static double child_chance(const tri__accept_table *t, int32_t d, int32_t r) {
    double p = t->a[d][r];
    for (int32_t j = 1; j < r; j++) p *= 1.0 - t->a[d][j];
    return p;
}

double tri__accept_tree_expected(const tri__accept_table *t, tri__tree_shape *s) {
    if (s->n < 0 || s->n > TRI_PLAN_TREE_MAX_NODES) return -1;
    double chance[TRI_PLAN_TREE_MAX_NODES], e = 1;
    int32_t next_rank[TRI_PLAN_TREE_MAX_NODES + 1];  // per parent (+1: the context), the rank due next
    for (int32_t i = 0; i <= s->n; i++) next_rank[i] = 1;
    memset(s->width, 0, sizeof s->width);
    s->depth_max = 0;
    for (int32_t i = 0; i < s->n; i++) {
        int32_t p = s->parent[i], d = p < 0 ? 1 : s->depth[p] + 1, r = s->rank[i];
        if (p >= i || p < -1 || d > TRI_PLAN_TREE_DEPTH || r != next_rank[p + 1] || r > TRI_PLAN_TREE_RANKS) return -1;
        next_rank[p + 1]++;
        s->depth[i] = d;
        s->width[d]++;
        if (d > s->depth_max) s->depth_max = d;
        chance[i] = child_chance(t, d, r) * (p < 0 ? 1.0 : chance[p]);
        e += chance[i];
    }
    s->expected = e;
    return e;
}

// Sequoia's programme. C(d, n): the most a forest of children at depth d (under one kept parent)
// adds with at most n nodes; G(d, r, n): the same with the children of ranks r, r + 1, ... only
// (those of lower rank already placed). A child of rank r whose subtree has s nodes adds
// chance(d, r) x (1 + C(d + 1, s - 1)):
//   G(d, r, n) = max(0, max over s = 1..n of chance(d, r) (1 + C(d + 1, s - 1)) + G(d, r + 1, n - s)),
//   C(d, n) = G(d, 1, n), C(depth limit + 1, n) = 0.
typedef struct tree_dp {
    int32_t N;
    double *C;      // (D + 2, N + 1)
    double *G;      // (R + 2, N + 1) for the depth being computed
    int16_t *pick;  // (D + 1, R + 1, N + 1): the s that G(d, r, n) took (0: no child of rank r)
} tree_dp;

#define DP_C(dp, d, n) (dp)->C[(size_t)(d) * (size_t)((dp)->N + 1) + (size_t)(n)]
#define DP_PICK(dp, d, r, n) \
    (dp)->pick[((size_t)(d) * (TRI_PLAN_TREE_RANKS + 1) + (size_t)(r)) * (size_t)((dp)->N + 1) + (size_t)(n)]

static void tree_build(const tree_dp *dp, int32_t d, int32_t n, int32_t parent, tri__tree_shape *out) {
    for (int32_t r = 1; n > 0 && r <= TRI_PLAN_TREE_RANKS; r++) {
        int32_t s = DP_PICK(dp, d, r, n);
        if (s == 0) break;
        int32_t me = out->n++;
        out->parent[me] = parent;
        out->rank[me] = r;
        out->depth[me] = d;
        tree_build(dp, d + 1, s - 1, me, out);
        n -= s;
    }
}

tri_status tri__accept_tree_best(const tri__accept_table *t, int32_t n_nodes, int32_t max_depth, bool leaf_siblings,
                                 tri__tree_shape *out) {
    memset(out, 0, sizeof *out);
    if (n_nodes < 0 || n_nodes > TRI_PLAN_TREE_MAX_NODES || max_depth < 0 || max_depth > TRI_PLAN_TREE_DEPTH)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "token tree: %d nodes (0 .. %d), depth at most %d (0 .. %d)",
                         n_nodes, TRI_PLAN_TREE_MAX_NODES, max_depth, TRI_PLAN_TREE_DEPTH);
    const int32_t D = max_depth ? max_depth : TRI_PLAN_TREE_DEPTH, R = TRI_PLAN_TREE_RANKS, N = n_nodes;
    tree_dp dp = {.N = N};
    dp.C = calloc((size_t)(D + 2) * (size_t)(N + 1), sizeof *dp.C);
    dp.G = calloc((size_t)(R + 2) * (size_t)(N + 1), sizeof *dp.G);
    dp.pick = calloc((size_t)(D + 1) * (R + 1) * (size_t)(N + 1), sizeof *dp.pick);
    if (!dp.C || !dp.G || !dp.pick) {
        free(dp.C), free(dp.G), free(dp.pick);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "token tree: programme for %d nodes", N);
    }
    for (int32_t d = D; d >= 1; d--) {
        double *G = dp.G;
        for (int32_t n = 0; n <= N; n++) G[(size_t)(R + 1) * (size_t)(N + 1) + (size_t)n] = 0;
        for (int32_t r = R; r >= 1; r--) {
            const double ch = child_chance(t, d, r);
            const double *next = G + (size_t)(r + 1) * (size_t)(N + 1);
            double *cur = G + (size_t)r * (size_t)(N + 1);
            for (int32_t n = 0; n <= N; n++) {
                double best = 0;
                int32_t pick = 0;
                for (int32_t s = 1; s <= (leaf_siblings && r > 1 && n > 0 ? 1 : n); s++) {
                    double v = ch * (1.0 + DP_C(&dp, d + 1, s - 1)) + next[n - s];
                    if (v > best * (1 + 1e-12) + 1e-15) best = v, pick = s;  // a tie keeps fewer nodes
                }
                cur[n] = best;
                DP_PICK(&dp, d, r, n) = (int16_t)pick;
            }
        }
        for (int32_t n = 0; n <= N; n++) DP_C(&dp, d, n) = G[(size_t)(N + 1) + (size_t)n];
    }
    tree_build(&dp, 1, N, -1, out);
    double e = tri__accept_tree_expected(t, out);
    TRI_ASSERT(e >= 1 && fabs(e - (1.0 + DP_C(&dp, 1, N))) <= 1e-9 * e);
    free(dp.C), free(dp.G), free(dp.pick);
    return TRI_STATUS_OK;
}

void tri__accept_tree_drafting(const tri__tree_shape *s, double e1, double *passes, int32_t *extra_rows) {
    double when[TRI_PLAN_TREE_MAX_NODES];  // the L2 pass (counted from 0) that produced node i
    bool main_path[TRI_PLAN_TREE_MAX_NODES], internal[TRI_PLAN_TREE_MAX_NODES];
    int32_t main_depth = 0;
    for (int32_t i = 0; i < s->n; i++) internal[i] = false;
    for (int32_t i = 0; i < s->n; i++)
        if (s->parent[i] >= 0) internal[s->parent[i]] = true;
    double last = 0;
    int32_t extra = 0;
    for (int32_t i = 0; i < s->n; i++) {
        int32_t p = s->parent[i];
        main_path[i] = s->rank[i] == 1 && (p < 0 || main_path[p]);
        if (main_path[i]) {
            when[i] = s->depth[i] / e1;  // the chain advances e1 tokens per pass
            if (s->depth[i] > main_depth) main_depth = s->depth[i];
        } else {
            // its parent's distribution: from the main path's pass (siblings of a main-path node come
            // with it), or from the pass that evaluated an off-path parent, one after it was drafted
            when[i] = p < 0 ? 0 : main_path[p] ? when[p] : when[p] + 1;
            if (internal[i]) {
                extra++;
                if (when[i] + 1 > last) last = when[i] + 1;
            }
        }
    }
    *passes = fmax((double)main_depth / e1, last);
    *extra_rows = extra;
}

static uint64_t matrix_bytes(tri_dtype t, int64_t rows, int64_t cols) {
    int64_t row = tri__dtype_row_bytes(t, cols);
    return row < 0 ? 0 : (uint64_t)row * (uint64_t)rows;
}

uint64_t tri__plan_layer_bytes(const tri_model_config *c, tri_dtype t) {
    int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    uint64_t parts[] = {
        matrix_bytes(t, q, c->n_embd),         // wq
        matrix_bytes(t, kv, c->n_embd),        // wk
        matrix_bytes(t, kv, c->n_embd),        // wv
        matrix_bytes(t, c->n_embd, q),         // wo
        matrix_bytes(t, c->n_ff, c->n_embd),   // gate
        matrix_bytes(t, c->n_ff, c->n_embd),   // up
        matrix_bytes(t, c->n_embd, c->n_ff),   // down
    };
    uint64_t sum = 2 * (uint64_t)c->n_embd * 4;  // two norms, f32
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i] == 0) return 0;
        sum += parts[i];
    }
    return sum;
}

uint64_t tri__plan_other_bytes(const tri_model_config *c, tri_dtype t) {
    uint64_t embd = matrix_bytes(t, c->n_vocab, c->n_embd);
    if (embd == 0) return 0;
    return embd * (c->tied_embeddings ? 1 : 2) + (uint64_t)c->n_embd * 4;
}

tri_plan_model tri_plan_model_from_config(const tri_model_config *config, tri_dtype weight_type) {
    tri_plan_model m;
    memset(&m, 0, sizeof m);
    if (config) m.config = *config;
    m.weight_type = weight_type;
    return m;
}

void tri_plan_model_from_model(const tri_model *model, tri_plan_model *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!model) return;
    out->config = model->config;
    out->weight_type = model->layers && model->n_tensors > 0 && model->layers[0].wq
                           ? model->layers[0].wq->type
                           : TRI_DTYPE_F16;
    uint64_t other = 0, layer_max = 0;
    for (int32_t l = 0; l < model->config.n_layer; l++) {
        char prefix[32];
        int n = snprintf(prefix, sizeof prefix, "blk.%d.", l);
        uint64_t sum = 0;
        for (int64_t i = 0; i < model->n_tensors; i++)
            if (strncmp(model->tensors[i].name, prefix, (size_t)n) == 0)
                sum += model->tensors[i].n_bytes;
        if (sum > layer_max) layer_max = sum;
    }
    for (int64_t i = 0; i < model->n_tensors; i++)
        if (strncmp(model->tensors[i].name, "blk.", 4) != 0) other += model->tensors[i].n_bytes;
    out->layer_bytes = layer_max;
    out->other_bytes = other;
}

tri_plan_params tri_plan_default_params(void) {
    return (tri_plan_params){
        .mode = TRI_PLAN_MODE_TRIFORCE,
        .n_ctx = 0,
        .n_gpu = 1,
        .gpu_mem_bytes = (uint64_t)24 << 30,
        .gpu_reserve_bytes = (uint64_t)1 << 30,
        .host_mem_bytes = 0,
        .pcie_gbps = 25.0,
        .disk_gbps = 3.0,
        .gpu_mem_gbps = 1008.0,
        .gpu_tflops = 80.0,
        .layer_overhead_us = 20.0,
        .kv_type = TRI_DTYPE_F16,
        .retrieval_budget = 0,
        .chunk_size = 8,
        .gamma1 = 2,
        .gamma2 = 12,
        .accept_l1 = 0.7,
        .accept_l2 = 0.9,
        .draft_bytes = 136000000,
        .draft_n_layer = 2,
    };
}

// ---- placement ----

static uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
static double gib(uint64_t b) { return (double)b / GIB; }

// What the planner works with, resolved once.
typedef struct ctx {
    tri_plan_params p;
    const tri_model_config *c;
    int32_t L, G;
    uint64_t W, K;        // one block's weights, one layer's KV at n_ctx (all GPUs, every sequence)
    int32_t nb;           // sequences in a batch (params.n_batch); passes carry nb x m rows
    uint64_t kv_tok;      // KV bytes of one token in one layer (all GPUs), as stored and streamed
    // kv_type mixed: f16 K and V bytes of one token in one layer, the rows a full-cache pass
    // attends in f16 (sinks and window) and those resident per layer (with the ring's two steps)
    uint64_t kv_tok16;
    int64_t f16_attend, f16_rows;
    uint64_t other;
    double params_layer;  // weight elements of one block
    double B, D, H, F;    // aggregate PCIe, disk, device memory bytes/s; FLOP/s
    double Hh;            // host attention's KV bytes/s; 0: no split
    double Hd;            // host memory bytes/s shared by the host's reads and the DMA; 0: unlimited
    // tensor parallelism (engine/tensor-parallel.h, the split the engine builds): the largest
    // share any GPU has of a block's weights and of the KV (1/G when the heads divide evenly);
    // that GPU sets the time, so the aggregate rates above are one GPU's over that share
    double sh_w, sh_kv;
    double ar_link;       // one GPU's PCIe bytes/s, for the all-reduces
    const tri__accept_table *l1, *l2;  // acceptance by depth and rank: L2 of L1's, L3 of L2's
    int tree_flags;                    // TRI__PLAN_TREE_GENERAL: any tree; 0: the engine's
} ctx;

// Per all-reduce (two per layer and pass with G > 1): a device-to-host copy, the wait for every
// GPU, the sum on the host and the host-to-device copy; the copies' launch and completion
// latencies dominate at decode sizes (a prediction: no GPU has measured it).
#define ALLREDUCE_LATENCY_US 15.0

// Per layer and pass, for an offloaded layer split between the device and the host: queries down,
// the device half's state down and the output up are three small copies the host waits for.
#define SPLIT_LATENCY_US 30.0

// The fraction of an offloaded layer's kv_bytes attended on the host so that the streamed rest
// (behind w_bytes of streamed weights on the same link) and the host part take the same time:
// (w + (1 - f) kv) / B = f kv / Hh.
static double split_fraction(const ctx *x, double kv_bytes, double w_bytes) {
    if (x->Hh <= 0 || kv_bytes <= 0) return 0;
    double f = (w_bytes + kv_bytes) / x->B / (kv_bytes * (1.0 / x->B + 1.0 / x->Hh));
    return f < 1 ? f : 1;
}

// The time of one forward pass of m tokens attending to c keys per layer, with the placement in
// plan; kv_streams: the KV of layers >= on_chip comes over PCIe. *pcie receives the bytes moved.
// With split (x->Hh > 0), each offloaded layer streams only part of its KV and the host attends the
// rest at the same time: *host_read receives the host's KV bytes, *frac the mean fraction.
static double pass_time(const ctx *x, const tri_plan *plan, int64_t m, int64_t c, bool kv_streams,
                        uint64_t *pcie, bool split, uint64_t *host_read, double *frac) {
    const tri_model_config *cf = x->c;
    double ovh = x->p.layer_overhead_us * 1e-6;
    double t = 0, computed = 0, fill = -1, f_sum = 0;
    uint64_t bytes = 0, host = 0;
    int32_t n_split = 0;
    for (int32_t i = 0; i < x->L; i++) {
        bool w_gpu = i < plan->n_weights_gpu;
        bool w_disk = i >= plan->n_weights_gpu + plan->n_weights_host;
        bool kv = kv_streams && i >= plan->on_chip;
        uint64_t kv_bytes = kv ? x->K * (uint64_t)c / (uint64_t)plan->params.n_ctx : 0;  // every sequence's
        double f = split ? split_fraction(x, (double)kv_bytes, w_gpu ? 0 : (double)x->W) : 0;
        uint64_t kv_host = (uint64_t)((double)kv_bytes * f);
        int64_t c_dev = c - (int64_t)((double)c * f);  // the keys the device attends to
        uint64_t layer_pcie = kv_bytes - kv_host + (w_gpu ? 0 : x->W);
        double t_x = (double)layer_pcie / x->B;
        double t_d = w_disk ? (double)x->W / x->D : 0;
        // a batch: nb x m rows through the weights, each sequence's m rows over its own c keys
        const double rows = (double)m * x->nb;
        double flops = 2.0 * x->params_layer * rows + 4.0 * rows * (double)c_dev * cf->n_head * cf->head_dim;
        // kv_type mixed: a full-cache pass reads the sinks and window from the resident f16 rows
        int64_t c16 = kv_streams && x->f16_attend > 0 ? (c_dev < x->f16_attend ? c_dev : x->f16_attend) : 0;
        double rd = (double)x->W +
                    x->nb * ((double)(c_dev - c16) * (double)x->kv_tok + (double)c16 * (double)x->kv_tok16);
        double t_c = fmax(rd / x->H, flops / x->F) + ovh;
        if (kv_host > 0) {  // the host's part runs beside the device's; the merge waits for both
            t_c = fmax(t_c, (double)kv_host / x->Hh + ovh) + SPLIT_LATENCY_US * 1e-6;
            host += kv_host;
            f_sum += f;
            n_split++;
        }
        double t_in = fmax(t_x, t_d);
        // the DMA and the host's attention read the same DRAM: together no faster than it
        if (x->Hd > 0) t_in = fmax(t_in, (double)(layer_pcie + kv_host) / x->Hd);
        // The first streamed layer cannot hide behind a previous layer of this pass beyond what
        // the layers before it compute; later ones overlap with their predecessor (double
        // buffer).
        if (layer_pcie > 0 && fill < 0) fill = fmax(0.0, t_in - computed);
        t += fmax(t_in, t_c);
        computed += t_c;
        bytes += layer_pcie;
    }
    // output norm and head: read once per pass
    t += (double)x->other / (x->c->tied_embeddings ? 1.0 : 2.0) / x->H + ovh;
    if (x->G > 1) t += x->L * tri__plan_allreduce_seconds(cf, m * x->nb, x->ar_link);
    if (pcie) *pcie = bytes;
    if (host_read) *host_read = host;
    if (frac) *frac = n_split ? f_sum / n_split : 0;
    return t + (fill > 0 ? fill : 0);
}

double tri__plan_allreduce_seconds(const tri_model_config *c, int64_t m, double link_bytes_per_s) {
    // each all-reduce: the partial (m, n_embd) f32 down, the sum up, over one GPU's link
    double bytes = (double)tri__tp_allreduce_bytes((int64_t)m * c->n_embd);
    return 2.0 * (ALLREDUCE_LATENCY_US * 1e-6 + bytes / link_bytes_per_s);
}

static tri_status plan_mode(const ctx *x, tri_plan *out) {
    const tri_plan_params *p = &x->p;
    bool tf = p->mode == TRI_PLAN_MODE_TRIFORCE;
    uint64_t G = (uint64_t)x->G;
    int32_t L = x->L;
    // the GPU with the largest share holds (weights, KV) that much; 1/G of it when even
    uint64_t Wg = G > 1 ? (uint64_t)ceil((double)x->W * x->sh_w) : x->W;
    uint64_t Kg = G > 1 ? (uint64_t)ceil((double)x->K * x->sh_kv) : x->K;

    out->n_layer = L;
    out->kv_layer_bytes = x->K;
    out->weight_layer_bytes = x->W;
    out->retrieval_budget = tf ? p->retrieval_budget : 0;

    // ---- device: what must be there ----
    // activations: a step of the default batch of 128 (the prefill; a verification pass has
    // gamma2 + 1 rows of logits), the hidden states of a layer-major prefill span (llama.h: 8,192
    // tokens) and the attention tiles
    int64_t m_max = tf ? (int64_t)(p->tree_nodes > p->gamma2 ? p->tree_nodes : p->gamma2) + 1 : 1;
    const tri_model_config *c = x->c;
    out->gpu_act_bytes = ((uint64_t)128 * ((uint64_t)6 * c->n_embd + 3 * (uint64_t)c->n_ff) +
                          (uint64_t)m_max * (uint64_t)x->nb * (uint64_t)c->n_vocab + (uint64_t)8192 * c->n_embd) * 4 +
                         ((uint64_t)16 << 20);
    out->gpu_retrieval_bytes =
        tf ? (uint64_t)ceil((double)(((uint64_t)p->retrieval_budget + (uint64_t)RETRIEVAL_SLACK(p)) * x->kv_tok *
                                      (uint64_t)L * (uint64_t)x->nb) * (G > 1 ? x->sh_kv : 1.0))
           : 0;
    // one draft model; each sequence its own StreamingLLM cache (and activations)
    out->gpu_draft_bytes = tf ? p->draft_bytes + (uint64_t)x->nb * DRAFT_EXTRA_BYTES : 0;
    // kv_type mixed: every layer's f16 sinks, window and ring stay on the device, whether its q4_0
    // rows are on chip or stream
    out->gpu_kv_f16_bytes =
        (uint64_t)ceil((double)((uint64_t)x->f16_rows * x->kv_tok16 * (uint64_t)L * (uint64_t)x->nb) *
                       (G > 1 ? x->sh_kv : 1.0));
    uint64_t other_g = x->other;  // embeddings and head: every GPU holds them (replicated)
    uint64_t fixed = p->gpu_reserve_bytes + other_g + out->gpu_act_bytes +
                     out->gpu_retrieval_bytes + out->gpu_draft_bytes + out->gpu_kv_f16_bytes;
    if (fixed > p->gpu_mem_bytes)
        return tri__fail(TRI_STATUS_DEVICE_OUT_OF_MEMORY,
                         "plan: a device budget of %.2f GiB per GPU cannot hold what must stay on "
                         "the GPU: %.2f GiB (reserve %.2f, embeddings and head %.2f, retrieval "
                         "cache %.2f for %d tokens, draft %.2f, activations %.2f, mixed KV's f16 rows %.2f)",
                         gib(p->gpu_mem_bytes), gib(fixed), gib(p->gpu_reserve_bytes),
                         gib(other_g), gib(out->gpu_retrieval_bytes), out->retrieval_budget,
                         gib(out->gpu_draft_bytes), gib(out->gpu_act_bytes), gib(out->gpu_kv_f16_bytes));
    uint64_t avail = p->gpu_mem_bytes - fixed;

    // ---- device: weights first, then KV ----
    // A resident block saves its bytes on every pass (L3 and each L2), an on-chip KV layer only
    // on L3 passes, so per byte of device memory weights come first.
    int32_t n_res = -1, on_chip = 0;
    for (int32_t r = L; r >= 0 && n_res < 0; r--) {
        uint64_t wbuf = (uint64_t)(L - r < 2 ? L - r : 2) * Wg;
        uint64_t used = (uint64_t)r * Wg + wbuf;
        if (used > avail) continue;
        uint64_t left = avail - used;
        for (int32_t k = L; k >= 0; k--) {
            uint64_t kbuf = (uint64_t)(L - k < 2 ? L - k : 2) * Kg;
            if ((uint64_t)k * Kg + kbuf <= left) {
                n_res = r;
                on_chip = k;
                break;
            }
        }
    }
    if (n_res < 0)
        return tri__fail(TRI_STATUS_DEVICE_OUT_OF_MEMORY,
                         "plan: a device budget of %.2f GiB per GPU leaves %.2f GiB after the "
                         "fixed parts, less than the double buffers for streaming: KV 2 x %.2f "
                         "GiB (one layer at %d tokens%s) and weights 2 x %.2f GiB",
                         gib(p->gpu_mem_bytes), gib(avail), gib(Kg), p->n_ctx,
                         x->nb > 1 ? ", every sequence of the batch" : "", gib(Wg));
    out->n_weights_gpu = n_res;
    out->on_chip = on_chip;
    out->n_kv_host = L - on_chip;
    int32_t n_stream = L - n_res;
    out->gpu_weight_bytes = (uint64_t)n_res * Wg + other_g;
    out->gpu_kv_bytes = (uint64_t)on_chip * Kg;
    out->gpu_kv_buffer_bytes = (uint64_t)(out->n_kv_host < 2 ? out->n_kv_host : 2) * Kg;
    out->gpu_weight_buffer_bytes = (uint64_t)(n_stream < 2 ? n_stream : 2) * Wg;
    out->gpu_total_bytes = p->gpu_reserve_bytes + out->gpu_weight_bytes + out->gpu_kv_bytes +
                           out->gpu_kv_buffer_bytes + out->gpu_weight_buffer_bytes +
                           out->gpu_retrieval_bytes + out->gpu_draft_bytes + out->gpu_act_bytes +
                           out->gpu_kv_f16_bytes;

    // ---- host: offloaded KV and summaries must fit; streamed weights spill to disk ----
    out->host_kv_bytes = (uint64_t)out->n_kv_host * x->K;
    // chunk summaries: per chunk, layer and KV head the mean key in f32 (chunk-index.h), whatever
    // the cache's type
    out->host_summary_bytes = tf ? div_up((uint64_t)p->n_ctx, (uint64_t)p->chunk_size) * sizeof(float) *
                                       (uint64_t)c->n_head_kv * (uint64_t)c->head_dim * (uint64_t)L * (uint64_t)x->nb
                                 : 0;
    uint64_t must = out->host_kv_bytes + out->host_summary_bytes;
    int32_t n_host_w = n_stream;
    if (p->host_mem_bytes) {
        if (must > p->host_mem_bytes)
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY,
                             "plan: a host budget of %.2f GiB cannot hold the offloaded KV cache "
                             "(%.2f GiB for %d layers at %d tokens) and chunk summaries (%.2f GiB)",
                             gib(p->host_mem_bytes), gib(out->host_kv_bytes), out->n_kv_host,
                             p->n_ctx, gib(out->host_summary_bytes));
        while (n_host_w > 0) {
            uint64_t staging = n_host_w < n_stream ? DISK_STAGING_LAYERS * x->W : 0;
            if (must + (uint64_t)n_host_w * x->W + staging <= p->host_mem_bytes) break;
            n_host_w--;
        }
        if (n_host_w < n_stream && must + DISK_STAGING_LAYERS * x->W > p->host_mem_bytes)
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY,
                             "plan: a host budget of %.2f GiB cannot hold the offloaded KV cache "
                             "(%.2f GiB), chunk summaries (%.2f GiB) and %d staging buffers for "
                             "weights read from disk (%.2f GiB each)",
                             gib(p->host_mem_bytes), gib(out->host_kv_bytes),
                             gib(out->host_summary_bytes), DISK_STAGING_LAYERS, gib(x->W));
    }
    out->n_weights_host = n_host_w;
    out->n_weights_disk = n_stream - n_host_w;
    out->host_weight_bytes = (uint64_t)n_host_w * x->W;
    out->host_staging_bytes = out->n_weights_disk > 0 ? DISK_STAGING_LAYERS * x->W : 0;
    out->host_total_bytes = must + out->host_weight_bytes + out->host_staging_bytes;

    // ---- time ----
    double t_l3_streamed;
    if (tf) {
        int64_t c_l2 = (int64_t)p->retrieval_budget + RETRIEVAL_SLACK(p);
        if (c_l2 > p->n_ctx) c_l2 = p->n_ctx;
        // a chain of gamma2, or the best tree of tree_nodes under the acceptance by depth and rank
        double e1 = tri__accept_chain_expected(x->l1, p->gamma1);
        int64_t m3 = (int64_t)p->gamma2 + 1, m2 = (int64_t)p->gamma1 + 1;
        out->l2_passes = (double)p->gamma2 / e1;
        out->tokens_per_round = tri__accept_chain_expected(x->l2, p->gamma2);
        out->tree_depth = p->gamma2;
        if (p->tree_nodes > 0) {
            // the deeper the tree, the more L2 passes draft it: of the best trees of tree_nodes
            // nodes at each depth limit, the one with the least time per token (L3 and L2 passes
            // at their rows)
            tri__tree_shape *ts = malloc(sizeof *ts);
            if (!ts) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "plan: token tree");
            static const int32_t depths[] = {4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64};
            const bool general = x->tree_flags & TRI__PLAN_TREE_GENERAL;
            int32_t deepest = general ? TRI_PLAN_TREE_DEPTH : p->gamma2;
            if (deepest > p->tree_nodes) deepest = p->tree_nodes;
            double best = -1;
            int64_t c_l2b = c_l2;
            int32_t cand[sizeof depths / sizeof *depths + 1], n_cand = 0;  // those below the deepest, and it
            for (size_t k = 0; k < sizeof depths / sizeof *depths; k++)
                if (depths[k] < deepest) cand[n_cand++] = depths[k];
            cand[n_cand++] = deepest;
            for (int32_t k = 0; k < n_cand; k++) {
                const int32_t dk = cand[k];
                tri_status st = tri__accept_tree_best(x->l2, p->tree_nodes, dk, !general, ts);
                if (st) {
                    free(ts);
                    return st;
                }
                double passes;
                int32_t extra;
                tri__accept_tree_drafting(ts, e1, &passes, &extra);
                int64_t m2k = (int64_t)p->gamma1 + 1 + (int64_t)ceil(extra / fmax(passes, 1.0));
                double t = (pass_time(x, out, (int64_t)ts->n + 1, p->n_ctx, true, NULL, true, NULL, NULL) +
                            passes * pass_time(x, out, m2k, c_l2b, false, NULL, false, NULL, NULL)) /
                           ts->expected;
                if (best < 0 || t < best) {
                    best = t;
                    out->l2_passes = passes;
                    m3 = (int64_t)ts->n + 1;
                    m2 = m2k;
                    out->tokens_per_round = ts->expected;
                    out->tree_nodes_used = ts->n;
                    out->tree_depth = ts->depth_max;
                }
            }
            free(ts);
        }
        out->l3_rows = (int32_t)m3;
        // a batch drafts in lockstep: the round waits for the sequence whose L2 needs the most passes
        out->l2_lockstep = tri__plan_lockstep(x->l1, p->gamma1, out->tree_depth, x->nb, NULL);
        out->l2_passes *= out->l2_lockstep;
        out->t_l3 = pass_time(x, out, m3, p->n_ctx, true, &out->pcie_bytes_l3, true, &out->host_kv_read_bytes_l3,
                              &out->kv_host_fraction);
        t_l3_streamed = pass_time(x, out, m3, p->n_ctx, true, NULL, false, NULL, NULL);
        out->t_l2 = pass_time(x, out, m2, c_l2, false, &out->pcie_bytes_l2, false, NULL, NULL);
        out->t_l1 = (double)out->gpu_draft_bytes / (p->gpu_mem_gbps * 1e9) +
                    (p->draft_n_layer + 1) * p->layer_overhead_us * 1e-6;
        out->l1_passes = out->l2_passes * p->gamma1;
        out->t_round = out->t_l3 + out->l2_passes * out->t_l2 + out->l1_passes * out->t_l1;
    } else {
        out->t_l3 = pass_time(x, out, 1, p->n_ctx, true, &out->pcie_bytes_l3, true, &out->host_kv_read_bytes_l3,
                              &out->kv_host_fraction);
        t_l3_streamed = pass_time(x, out, 1, p->n_ctx, true, NULL, false, NULL, NULL);
        out->pcie_bytes_l2 = 0;
        out->l3_rows = 1;
        out->tokens_per_round = 1;
        out->t_round = out->t_l3;
    }
    out->tokens_per_round *= x->nb;  // every sequence of the batch emits its own
    out->t_token = out->t_round / out->tokens_per_round;
    out->t_token_streamed = (out->t_round - out->t_l3 + t_l3_streamed) / out->tokens_per_round;
    out->host_kv_read_bytes_token = (double)out->host_kv_read_bytes_l3 / out->tokens_per_round;
    out->pcie_bytes_token =
        ((double)out->pcie_bytes_l3 + out->l2_passes * (double)out->pcie_bytes_l2) /
        out->tokens_per_round;
    out->t_token_pcie_floor = out->pcie_bytes_token / x->B;
    if (!tf) out->t_token_ar = out->t_token;
    if (G > 1) {  // the all-reduces' share of the time (in the passes above), per emitted token
        int64_t m3 = (int64_t)out->l3_rows * x->nb, m2 = ((int64_t)p->gamma1 + 1) * x->nb;
        double t3 = L * tri__plan_allreduce_seconds(c, m3, x->ar_link);
        double t2 = tf ? L * tri__plan_allreduce_seconds(c, m2, x->ar_link) : 0;
        out->t_allreduce_token = (t3 + out->l2_passes * t2) / out->tokens_per_round;
        out->allreduce_bytes_token =
            (2.0 * L * (double)tri__tp_allreduce_bytes(m3 * c->n_embd) +
             out->l2_passes * 2.0 * L * (double)tri__tp_allreduce_bytes(m2 * c->n_embd)) /
            out->tokens_per_round;
    }
    return TRI_STATUS_OK;
}

tri_status tri_plan_compute(const tri_plan_model *model, const tri_plan_params *params,
                            tri_plan *out) {
    return tri__plan_compute_accept(model, params, NULL, NULL, 0, out);
}

tri_status tri__plan_compute_accept(const tri_plan_model *model, const tri_plan_params *params,
                                    const tri__accept_table *l1, const tri__accept_table *l2, int tree_flags,
                                    tri_plan *out) {
    if (!model || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_plan_compute: NULL argument");
    memset(out, 0, sizeof *out);
    tri_plan_params p = params ? *params : tri_plan_default_params();
    tri_plan_model m = *model;
    const tri_model_config *c = &m.config;
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 ||
        c->head_dim < 1 || c->n_ff < 1 || c->n_vocab < 1 || c->n_head % c->n_head_kv != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "plan: model shape n_layer %d, n_embd %d, n_head %d, n_head_kv %d, "
                         "head_dim %d, n_ff %d, n_vocab %d is not a Llama shape",
                         c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
                         c->n_vocab);
    if (p.n_ctx == 0) p.n_ctx = c->n_ctx_train;
    if (p.n_gpu == 0) p.n_gpu = 1;
    if (p.gpu_mem_bytes == 0) p.gpu_mem_bytes = (uint64_t)24 << 30;
    if (p.pcie_gbps == 0) p.pcie_gbps = 25.0;
    if (p.disk_gbps == 0) p.disk_gbps = 3.0;
    if (p.gpu_mem_gbps == 0) p.gpu_mem_gbps = 1008.0;
    if (p.gpu_tflops == 0) p.gpu_tflops = 80.0;
    if (p.retrieval_budget == 0) p.retrieval_budget = p.n_gpu > 1 ? 12288 : 8192;
    if (p.chunk_size == 0) p.chunk_size = 8;
    if (p.gamma1 == 0) p.gamma1 = 2;
    if (p.gamma2 == 0) p.gamma2 = 12;
    if (p.accept_l1 == 0) p.accept_l1 = 0.7;
    if (p.accept_l2 == 0) p.accept_l2 = 0.9;
    if (p.accept_rank_decay == 0) p.accept_rank_decay = 0.5;
    if (p.draft_bytes == 0) p.draft_bytes = 136000000;
    if (p.draft_n_layer == 0) p.draft_n_layer = 2;
    if (p.n_batch == 0) p.n_batch = 1;
    if (p.n_batch < 0 || p.n_batch > 4096)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan: n_batch %d: want 1 .. 4096 sequences", p.n_batch);
    const bool mixed = p.kv_type == TRI_DTYPE_KV_MIXED;
    if (mixed && p.kv_sink == 0) p.kv_sink = 16;
    if (mixed && p.kv_window == 0) p.kv_window = 240;
    if (p.kv_sink < 0 || p.kv_window < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan: kv_sink %d and kv_window %d must be >= 0", p.kv_sink,
                         p.kv_window);
    if (p.n_ctx < 1 || p.n_gpu < 1 || p.n_gpu > 64 || p.pcie_gbps < 0 || p.disk_gbps < 0 || p.gpu_mem_gbps < 0 ||
        p.gpu_tflops < 0 || p.layer_overhead_us < 0 || (!tri__kv_type_ok(p.kv_type) && !mixed) ||
        p.retrieval_budget < 1 ||
        p.chunk_size < 1 || p.gamma1 < 1 || p.gamma2 < 1 || p.accept_l1 < 0 || p.accept_l1 > 1 || p.accept_l2 < 0 ||
        p.accept_l2 > 1 || p.draft_n_layer < 1 || !(p.host_attn_gbps >= 0) || !(p.host_dram_gbps >= 0) ||
        p.tree_nodes < 0 || p.tree_nodes > TRI_PLAN_TREE_MAX_NODES ||
        !(p.accept_rank_decay >= 0 && p.accept_rank_decay <= 1) ||
        (p.mode != TRI_PLAN_MODE_TRIFORCE && p.mode != TRI_PLAN_MODE_AUTOREGRESSIVE))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "plan: invalid parameters (n_ctx %d, n_gpu %d, "
                         "bandwidths >= 0, kv_type f16/f32/q8_0/q4_0/mixed, budget %d, chunk %d, "
                         "gamma1 %d, gamma2 %d, acceptance rates and rank decay in [0, 1], tree_nodes %d in "
                         "[0, %d])",
                         p.n_ctx, p.n_gpu, p.retrieval_budget, p.chunk_size, p.gamma1, p.gamma2, p.tree_nodes,
                         TRI_PLAN_TREE_MAX_NODES);
    // the engine's split over the GPUs (uneven where the KV heads do not divide)
    tri__tp_split split;
    if (tri__tp_split_plan(c, p.n_gpu, &split) != TRI_STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", tri_last_error());
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan: %s", why);
    }
    if (m.layer_bytes == 0) m.layer_bytes = tri__plan_layer_bytes(c, m.weight_type);
    if (m.other_bytes == 0) m.other_bytes = tri__plan_other_bytes(c, m.weight_type);
    if (m.layer_bytes == 0 || m.other_bytes == 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "plan: weight type %s does not fit rows of %d and %d elements",
                         tri_dtype_name(m.weight_type), c->n_embd, c->n_ff);

    tri__accept_table stated[2];  // 9 KiB
    tri__accept_table_constant(&stated[0], p.accept_l1, p.accept_rank_decay);
    tri__accept_table_constant(&stated[1], p.accept_l2, p.accept_rank_decay);
    ctx x = {.p = p,
             .c = c,
             .L = c->n_layer,
             .G = p.n_gpu,
             .l1 = l1 ? l1 : &stated[0],
             .l2 = l2 ? l2 : &stated[1],
             .tree_flags = tree_flags};
    x.W = m.layer_bytes;
    x.other = m.other_bytes;
    // K and V rows of the cache's type as stored (mixed: q4_0), a quantized type's f16 scales included
    const tri_dtype kv_store = tri__plan_kv_store_type(p.kv_type);
    int64_t kv_row = tri__dtype_row_bytes(kv_store, (int64_t)c->n_head_kv * c->head_dim);
    if (tri__dtype_is_quantized(kv_store) && c->head_dim % TRI_QK != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "plan: kv_type %s needs head_dim a multiple of %d (the model's: %d)",
                         tri_dtype_name(p.kv_type), TRI_QK, c->head_dim);
    x.kv_tok = 2 * (uint64_t)kv_row;
    x.kv_tok16 = 2 * (uint64_t)tri__dtype_row_bytes(TRI_DTYPE_F16, (int64_t)c->n_head_kv * c->head_dim);
    x.f16_attend = mixed ? (int64_t)p.kv_sink + p.kv_window : 0;
    // kv/policy-mixed.c: the sinks, and a buffer half as long again as what a step keeps
    // (the window, a step and a step's rollback)
    const int64_t mixed_keep = (int64_t)p.kv_window + 2 * TRI__PLAN_MIXED_STEP;
    x.f16_rows = mixed ? (int64_t)p.kv_sink + mixed_keep + (mixed_keep + 1) / 2 : 0;
    x.nb = p.n_batch;
    x.K = x.kv_tok * (uint64_t)p.n_ctx * (uint64_t)p.n_batch;
    x.params_layer = (double)c->n_embd * ((double)c->n_head + c->n_head_kv) * c->head_dim * 2.0 +
                     3.0 * (double)c->n_embd * c->n_ff;
    double inf = 1e300;  // a bandwidth of 0 after defaults cannot happen; guard anyway
    x.B = p.pcie_gbps > 0 ? p.pcie_gbps * 1e9 * p.n_gpu : inf;
    x.D = p.disk_gbps > 0 ? p.disk_gbps * 1e9 : inf;
    x.H = p.gpu_mem_gbps > 0 ? p.gpu_mem_gbps * 1e9 * p.n_gpu : inf;
    x.F = p.gpu_tflops > 0 ? p.gpu_tflops * 1e12 * p.n_gpu : inf;
    x.Hh = p.host_attn_gbps * 1e9;  // one host feeds every GPU
    x.Hd = p.host_dram_gbps * 1e9;
    {
        const double g = (double)c->n_head / c->n_head_kv;
        const double per_head = 2.0 * g * c->head_dim * c->n_embd + 2.0 * c->head_dim * c->n_embd;
        const double per_row = 3.0 * c->n_embd, all = c->n_head_kv * per_head + c->n_ff * per_row;
        x.sh_w = x.sh_kv = 0;
        for (int32_t r = 0; r < split.n; r++) {
            double kv = split.kv0[r + 1] - split.kv0[r], ff = split.ff0[r + 1] - split.ff0[r];
            x.sh_w = fmax(x.sh_w, (kv * per_head + ff * per_row) / all);
            x.sh_kv = fmax(x.sh_kv, kv / c->n_head_kv);
        }
        // the largest share sets the pace: the aggregate rates are one GPU's over it
        double sh = fmax(x.sh_w, x.sh_kv), one = 1.0 / p.n_gpu;
        x.B *= one / sh;
        x.H *= one / sh;
        x.F *= one / sh;
        x.ar_link = p.pcie_gbps > 0 ? p.pcie_gbps * 1e9 : inf;
        out->tp_kv_heads_max = split.kv0[1] - split.kv0[0];
        out->tp_ff_rows_max = 0;
        for (int32_t r = 0; r < split.n; r++) {
            int32_t rows = split.ff0[r + 1] - split.ff0[r];
            if (rows > out->tp_ff_rows_max) out->tp_ff_rows_max = rows;
        }
    }

    out->params = p;
    out->model = m;
    tri_status st = plan_mode(&x, out);
    if (st != TRI_STATUS_OK) return st;
    if (p.mode == TRI_PLAN_MODE_TRIFORCE) {
        // The baseline: plain decoding over the same budgets, with its own placement (no
        // retrieval cache or draft on the GPU, so possibly more on-chip layers).
        tri_plan ar;
        memset(&ar, 0, sizeof ar);
        ctx xa = x;
        xa.p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
        ar.params = xa.p;
        ar.model = m;
        out->t_token_ar = plan_mode(&xa, &ar) == TRI_STATUS_OK ? ar.t_token : 0;
    }
    return TRI_STATUS_OK;
}

tri_status tri__plan_choose(const tri_plan_model *model, const tri_plan_params *params, const tri__accept_table *l1,
                            const tri__accept_table *l2, int tree_flags, double host_tflops, double host_dram_gbps,
                            const int32_t *chains, int n_chains, const int32_t *trees, int n_trees, tri_plan *out) {
    if (!model || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan choose: NULL argument");
    const tri_model_config *c = &model->config;
    tri_plan_params base = params ? *params : tri_plan_default_params();
    tri_dtype kvt = tri__plan_kv_store_type(base.kv_type == TRI_DTYPE_COUNT ? TRI_DTYPE_F16 : base.kv_type);
    double row = 2.0 * (double)tri__dtype_row_bytes(kvt, (int64_t)c->n_head_kv * c->head_dim);  // K and V
    tri_plan *cand = malloc(sizeof *cand);
    if (!cand) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "plan choose");
    bool have = false;
    for (int i = 0; i < n_chains + n_trees; i++) {
        tri_plan_params p = base;
        bool tree = i >= n_chains;
        if (tree)
            p.tree_nodes = trees[i - n_chains];
        else
            p.gamma2 = chains[i], p.tree_nodes = 0;
        if (host_dram_gbps > 0 && host_tflops > 0 && row > 0) {
            // the host's rate at this candidate's query count: bandwidth- or FLOP-bound
            int32_t m = (tree ? p.tree_nodes : p.gamma2) + 1;
            double flop_per_byte = 4.0 * m * (double)c->n_head * c->head_dim / row;
            p.host_attn_gbps = fmin(host_dram_gbps, host_tflops * 1e3 / flop_per_byte);
            p.host_dram_gbps = host_dram_gbps;
        }
        if (tri__plan_compute_accept(model, &p, l1, l2, tree_flags, cand) != TRI_STATUS_OK) continue;
        if (!have || cand->t_token < out->t_token) *out = *cand;
        have = true;
    }
    free(cand);
    return have ? TRI_STATUS_OK
                : tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan choose: none of %d chains and %d trees can be planned",
                            n_chains, n_trees);
}

// ---- printing ----

typedef struct sbuf {
    char *buf;
    size_t cap, len;
} sbuf;

TRI__PRINTF(2, 3)
static void put(sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->len < s->cap ? s->cap - s->len : 0;
    int n = vsnprintf(room ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) s->len += (size_t)n;
}

tri_status tri_plan_format(const tri_plan *pl, char *buf, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!pl || (cap > 0 && !buf)) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_plan_format: NULL argument");
    sbuf s = {buf, cap, 0};
    if (buf && cap) buf[0] = 0;
    const tri_plan_params *p = &pl->params;
    const tri_model_config *c = &pl->model.config;
    bool tf = p->mode == TRI_PLAN_MODE_TRIFORCE;
    put(&s, "model      %d layers, n_embd %d, heads %d/%d kv x %d, ff %d, vocab %d, weights %s "
            "(%.2f GiB), KV %s\n",
        c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff, c->n_vocab,
        tri_dtype_name(pl->model.weight_type),
        gib(pl->weight_layer_bytes * (uint64_t)pl->n_layer + pl->model.other_bytes),
        tri_dtype_name(p->kv_type));
    put(&s, "context    %d tokens: KV %.2f GiB (%.3f GiB per layer)\n", p->n_ctx,
        gib(pl->kv_layer_bytes * (uint64_t)pl->n_layer), gib(pl->kv_layer_bytes));
    put(&s, "budgets    %d GPU%s x %.2f GiB (%.2f reserved), host ", p->n_gpu,
        p->n_gpu > 1 ? "s (tensor parallel)" : "", gib(p->gpu_mem_bytes),
        gib(p->gpu_reserve_bytes));
    if (p->host_mem_bytes)
        put(&s, "%.2f GiB\n", gib(p->host_mem_bytes));
    else
        put(&s, "unlimited\n");
    if (tf)
        put(&s, "mode       TriForce: retrieval budget %d, chunk %d, gamma1 %d, gamma2 %d, "
                "acceptance L1->L2 %.2f, L2->L3 %.2f (assumed)\n",
            p->retrieval_budget, p->chunk_size, p->gamma1, p->gamma2, p->accept_l1, p->accept_l2);
    else
        put(&s, "mode       autoregressive over the offloaded cache\n");
    if (p->n_batch > 1) {
        char lock[64] = "";
        if (tf) snprintf(lock, sizeof lock, "; L2 in lockstep: x %.3f passes", pl->l2_lockstep);
        put(&s, "batch      %d sequences of %d tokens each, in one pass per level (KV, retrieval and draft caches "
                "per sequence%s); times and bytes per token of the batch\n",
            p->n_batch, p->n_ctx, lock);
    }

    put(&s, "\nplacement                          layers\n");
    put(&s, "  weights resident on GPU          %6d\n", pl->n_weights_gpu);
    put(&s, "  weights streamed from host       %6d\n", pl->n_weights_host);
    put(&s, "  weights read from disk           %6d\n", pl->n_weights_disk);
    put(&s, "  KV on chip (on_chip)             %6d\n", pl->on_chip);
    put(&s, "  KV in pinned host memory         %6d\n", pl->n_kv_host);

    put(&s, "\ndevice memory, per GPU               GiB\n");
    put(&s, "  weights (resident + emb/head)    %9.2f\n", gib(pl->gpu_weight_bytes));
    put(&s, "  KV of on-chip layers             %9.2f\n", gib(pl->gpu_kv_bytes));
    put(&s, "  KV double buffer                 %9.2f\n", gib(pl->gpu_kv_buffer_bytes));
    if (pl->gpu_kv_f16_bytes)
        put(&s, "  KV f16 sinks and window (mixed)  %9.2f   %d + 1.5 x (%d + 2 x %d) rows per layer\n",
            gib(pl->gpu_kv_f16_bytes), p->kv_sink, p->kv_window, TRI__PLAN_MIXED_STEP);
    put(&s, "  weight double buffer             %9.2f\n", gib(pl->gpu_weight_buffer_bytes));
    if (tf) {
        put(&s, "  retrieval cache                  %9.2f\n", gib(pl->gpu_retrieval_bytes));
        put(&s, "  draft model and cache            %9.2f\n", gib(pl->gpu_draft_bytes));
    }
    put(&s, "  activations                      %9.2f\n", gib(pl->gpu_act_bytes));
    put(&s, "  reserve                          %9.2f\n", gib(p->gpu_reserve_bytes));
    put(&s, "  total                            %9.2f of %.2f\n", gib(pl->gpu_total_bytes),
        gib(p->gpu_mem_bytes));

    put(&s, "\nhost memory (pinned)                 GiB\n");
    put(&s, "  offloaded KV                     %9.2f\n", gib(pl->host_kv_bytes));
    put(&s, "  streamed weights                 %9.2f\n", gib(pl->host_weight_bytes));
    if (tf) put(&s, "  chunk summaries                  %9.2f\n", gib(pl->host_summary_bytes));
    put(&s, "  disk staging buffers             %9.2f\n", gib(pl->host_staging_bytes));
    put(&s, "  total                            %9.2f\n", gib(pl->host_total_bytes));

    put(&s, "\npredicted time (PCIe %.1f GB/s x %d, disk %.1f GB/s, device %.0f GB/s, %.0f TFLOPS)\n",
        p->pcie_gbps, p->n_gpu, p->disk_gbps, p->gpu_mem_gbps, p->gpu_tflops);
    put(&s, "  %-32s %9.1f ms   %.2f GB host->device\n", tf ? "L3 pass (full cache)" : "pass",
        pl->t_l3 * 1e3, (double)pl->pcie_bytes_l3 / 1e9);
    if (tf) {
        put(&s, "  %-32s %9.2f ms   x %.2f per round, %.2f GB host->device each\n",
            "L2 pass (retrieval cache)", pl->t_l2 * 1e3, pl->l2_passes,
            (double)pl->pcie_bytes_l2 / 1e9);
        put(&s, "  %-32s %9.2f ms   x %.2f per round\n", "L1 draft token", pl->t_l1 * 1e3,
            pl->l1_passes);
        put(&s, "  %-32s %9.1f ms   %.2f tokens expected\n", "round", pl->t_round * 1e3,
            pl->tokens_per_round);
        if (p->tree_nodes > 0)
            put(&s, "  %-32s %9d nodes  depth %d, %d rows per L3 pass (rank decay %.2f, assumed)\n",
                "token tree verified by L3", pl->tree_nodes_used, pl->tree_depth, pl->l3_rows, p->accept_rank_decay);
    }
    put(&s, "  %-32s %9.1f ms   PCIe floor %.1f ms (%.2f GB per token)\n", "per token",
        pl->t_token * 1e3, pl->t_token_pcie_floor * 1e3, pl->pcie_bytes_token / 1e9);
    if (p->n_gpu > 1)
        put(&s, "  %-32s %9.2f ms   2 per layer and pass through pinned host memory, %.1f KiB per GPU "
                "per token (largest share: %d KV heads, %d FFN rows)\n",
            "  of which all-reduces", pl->t_allreduce_token * 1e3, pl->allreduce_bytes_token / 1024,
            pl->tp_kv_heads_max, pl->tp_ff_rows_max);
    if (pl->kv_host_fraction > 0)
        put(&s, "  %-32s %9.1f ms   host attention %.1f GB/s reads %.1f%% of each offloaded layer "
                "(%.2f GB per token)\n",
            "  all offloaded KV streamed", pl->t_token_streamed * 1e3, p->host_attn_gbps,
            pl->kv_host_fraction * 100, pl->host_kv_read_bytes_token / 1e9);
    if (tf) {
        if (pl->t_token_ar > 0)
            put(&s, "  %-32s %9.1f ms   (its own placement; speedup %.2fx)\n",
                "autoregressive, same budgets", pl->t_token_ar * 1e3,
                pl->t_token_ar / pl->t_token);
        else
            put(&s, "  autoregressive, same budgets     does not fit\n");
    }
    if (n_out) *n_out = s.len;
    if (buf && s.len >= cap)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "plan: %zu bytes needed, buffer holds %zu",
                         s.len + 1, cap);
    return TRI_STATUS_OK;
}

// ---- a model known by its config.json alone ----

tri_status tri_plan_model_from_config_file(const char *path, tri_plan_model *out) {
    if (!path || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_plan_model_from_config_file: NULL argument");
    tri_model_config cfg;
    tri_status st = tri__hf_config_load(path, &cfg, NULL);
    if (st) return st;
    // the weights' type: torch_dtype (the checkpoint's own), f16 when it says none
    char *text;
    size_t len;
    if ((st = tri__json_read_file(path, TRI_JSON_MAX_BYTES, &text, &len))) return st;
    struct json_object *root = NULL, *v = NULL;
    st = tri__json_parse(path, text, len, &root);
    free(text);
    if (st) return st;
    tri_dtype type = TRI_DTYPE_F16;
    if (json_object_object_get_ex(root, "torch_dtype", &v) && json_object_is_type(v, json_type_string)) {
        const char *name = json_object_get_string(v);
        if (strcmp(name, "float32") == 0) type = TRI_DTYPE_F32;
        else if (strcmp(name, "bfloat16") == 0) type = TRI_DTYPE_BF16;
        else if (strcmp(name, "float16") != 0) st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: torch_dtype '%s': want "
                                                             "float32, bfloat16 or float16", path, name);
    }
    json_object_put(root);
    if (st) return st;
    *out = tri_plan_model_from_config(&cfg, type);
    return TRI_STATUS_OK;
}
