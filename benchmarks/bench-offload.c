// bench-offload.c - the TriForce paper's offloading experiment in shape: time per token of
// autoregressive decoding over an offloaded KV cache and of the three-level hierarchy, against
// the PCIe floor.
//
// usage: bench-offload [--shape llama2-7b|tiny] [--ctx N] [--gpu-mem SIZE] [--device D]
//                      [--budgets 8192,12288] [--gamma2 12,16] [--gamma1 2] [--accept 0.9]
//                      [--accept-l1 0.7] [--passes N] [--weights f16|q8_0|q4_0] [--reserve SIZE]
//                      [--host-gbps 60,100]
//
// Attending where the KV lives (docs/offload.md): the host attention's KV GB/s is measured on this
// machine at each pass's query count (1 and gamma2 + 1), for the 7B-128K shape the planner predicts
// ms/token all streamed and split at that figure and at the stated ones of --host-gbps (desktop,
// workstation), and each measured L3 pass is timed again split at the planner's fraction.
//
// What is real and what is not:
//   - weights are synthetic (tri__model_synthetic) in the model's shape, and the KV cache is
//     filled with synthetic rows up to --ctx tokens (no 127K-token prefill): the forward passes do
//     exactly the work and move exactly the bytes of the real model, their outputs are noise;
//   - placement is the planner's under --gpu-mem (default 24G: an RTX 4090): which blocks stay
//     resident, how many layers keep their KV on the device; the runtime then streams the rest
//     (kv-store.h, backend-select.h) and the bytes it moved are counted, not modelled;
//   - L3 is measured as a pass of gamma2 + 1 tokens over the full offloaded cache; L2 as a pass of
//     gamma1 + 1 tokens over a device cache holding `budget` tokens (what the retrieval cache
//     attends to; selection costs are not included); L1 as a one-token pass of a llama-68m-shaped
//     draft over a 256-token cache;
//   - acceptance cannot come from synthetic weights: per-token rates alpha (L3 accepts an L2
//     token) and beta (L2 accepts an L1 token) are forced (defaults: the planner's 0.9 and 0.7,
//     stated in the output) and combined as the planner does (docs/offload.md):
//       E(a, g) = (1 - a^(g+1)) / (1 - a),  L2 passes = gamma2 / E(beta, gamma1),
//       t_token = (t_L3 + L2 passes x t_L2 + gamma1 x L2 passes x t_L1) / E(alpha, gamma2).
// The host-to-device peak is a raw copy of pinned memory on the same link (the backend's transfer
// path), so "floor" = bytes moved per token / peak.
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-model.h"
#include "bench-util.h"
#include "dtype.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "llama.h"
#include "model-synthetic.h"
#include "model.h"
#include "placement.h"
#include "weights.h"

#define MAX_LIST 8

typedef struct opts {
    const char *shape, *device;
    int32_t ctx, passes, gamma1;
    uint64_t gpu_mem, reserve;
    bool reserve_set;
    int32_t budgets[MAX_LIST], n_budgets;
    int32_t gamma2s[MAX_LIST], n_gamma2;
    double alpha, beta;
    tri_dtype weights;
    double host_gbps[MAX_LIST];  // stated host attention figures (GB/s) to predict with
    int n_host_gbps;
} opts;

static void usage(void) {
    fprintf(stderr, "usage: bench-offload [--shape llama2-7b|tiny] [--ctx N] [--gpu-mem SIZE] [--device cpu|cuda[:N]]\n"
                    "                     [--budgets 8192,12288] [--gamma2 12,16] [--gamma1 2] [--accept 0.9]\n"
                    "                     [--accept-l1 0.7] [--passes N] [--weights f16|q8_0|q4_0]\n"
                    "                     [--reserve SIZE]   (device memory kept out of the plan; default 1G)\n"
                    "                     [--host-gbps 60,100]  (stated host attention GB/s: desktop, workstation)\n");
}

static int parse_list(const char *s, int32_t *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > INT32_MAX) return -1;
        out[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static bool parse_size(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return false;
    double mul = *end == 'G' || *end == 'g' ? 1 << 30 : *end == 'M' || *end == 'm' ? 1 << 20 : 1;
    *out = (uint64_t)(v * mul);
    return true;
}

static double expected(double a, int32_t g) { return a >= 1.0 ? g + 1 : (1.0 - pow(a, g + 1)) / (1.0 - a); }

// ---- attending where the KV lives: the split of offloaded layers between PCIe and host ----

static int parse_reals(const char *s, double *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v > 0) || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

// Host attention's KV GB/s on this machine for a layer of c at m queries (16,384 rows of f16 K and
// V, beyond any cache), with the split's default threads; 0 if it could not be measured.
static double split_host_gbps(const tri_model_config *c, int32_t m) {
    double gbps = 0;
    if (tri__kv_host_attention_gbps(0, m, c->n_head, c->n_head_kv, c->head_dim, 16384, 3, &gbps))
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
    return gbps;
}

// The planner's prediction for Llama2-7B-128K (130,048 tokens, one 24 GiB GPU, PCIe pcie_gbps)
// all streamed and split at host_gbps: one table row.
static void split_predict_row(const char *mode, int32_t g2, double pcie_gbps, double host_gbps, const char *source) {
    tri_model_config c;
    bench_shape("llama2-7b", &c);
    tri_plan_model pm = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params pp = tri_plan_default_params();
    pp.mode = g2 ? TRI_PLAN_MODE_TRIFORCE : TRI_PLAN_MODE_AUTOREGRESSIVE;
    pp.n_ctx = 130048;
    if (g2) pp.gamma2 = g2;
    pp.pcie_gbps = pcie_gbps;
    pp.host_attn_gbps = host_gbps;
    tri_plan pl;
    if (tri_plan_compute(&pm, &pp, &pl)) {
        printf("| %s | %d | %.1f (%s) | cannot place: %s |\n", mode, g2, host_gbps, source, tri_last_error());
        return;
    }
    char g2s[16] = "-";
    if (g2) snprintf(g2s, sizeof g2s, "%d", g2);
    printf("| %s | %s | %.1f (%s) | %.1f%% | %.0f | %.0f | %.1f | %.1f | %.2fx |\n", mode, g2s, host_gbps,
           source, 100 * pl.kv_host_fraction, pl.pcie_bytes_token / 1e6, pl.host_kv_read_bytes_token / 1e6,
           1e3 * pl.t_token_streamed, 1e3 * pl.t_token, pl.t_token_streamed / pl.t_token);
}

// Predictions for the 7B-128K shape at the host attention measured here and the stated figures.
static void split_report(const opts *o, double pcie_gbps) {
    tri_model_config c;
    bench_shape("llama2-7b", &c);
    printf("\nattending where the KV lives: Llama2-7B-128K (130,048 tokens), one 24 GiB GPU, PCIe %.1f GB/s; "
           "host attention measured here over 16,384 rows of one layer (%d KV heads x %d, f16) with the split's "
           "default threads (predictions, not measurements)\n",
           pcie_gbps, c.n_head_kv, c.head_dim);
    printf("\n| mode | gamma2 | host attention GB/s | rows on host | MB over PCIe/token | host KV MB read/token "
           "| predicted ms/token all streamed | split | speedup |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; r <= o->n_gamma2; r++) {
        int32_t g2 = r == 0 ? 0 : o->gamma2s[r - 1];
        double here = split_host_gbps(&c, g2 + 1);
        char mode[64];
        snprintf(mode, sizeof mode, "%s, %d quer%s", g2 ? "TriForce L3" : "autoregressive", g2 + 1, g2 ? "ies" : "y");
        if (here > 0) split_predict_row(mode, g2, pcie_gbps, here, "this machine");
        for (int i = 0; i < o->n_host_gbps; i++)
            split_predict_row(mode, g2, pcie_gbps, o->host_gbps[i], i == 0 ? "stated: desktop" : "stated: workstation");
        fflush(stdout);
    }
}

// Times the L3 pass of m tokens over kv again with a host fraction of frac (the planner's at the
// host attention measured here) and prints it beside the all-streamed figure; restores kv.
static tri_status split_measured_pass(const tri_model *tv, tri__backend *be, tri__kv_store *kv, int32_t m,
                                      int32_t passes, double frac, const pass_time *streamed) {
    if (frac <= 0 || !kv->off) return TRI_STATUS_OK;
    tri_status st = tri__kv_store_set_split(kv, frac, 0);
    pass_time p;
    if (!st) st = bench_time_pass(tv, be, kv, m, passes, &p);
    tri_status st2 = tri__kv_store_set_split(kv, 0, 0);
    if (st) return st;
    printf("|   split, %.1f%% of each offloaded layer on the host | | | | | %.1f (all streamed %.1f) | | | | | %.1f MB "
           "over PCIe/pass | | |\n",
           100 * frac, 1e3 * p.seconds, 1e3 * streamed->seconds, p.kv_bytes_up / 1e6);
    return st2;
}

// --device sim:PROFILE: the simulated device (bench-offload-sim.c).
int bench_offload_sim(int argc, char **argv);
static bool wants_sim(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && !strncmp(argv[i + 1], "sim:", 4)) return true;
    return false;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // each table line as it comes: a run killed midway keeps what it printed
    if (wants_sim(argc, argv)) return bench_offload_sim(argc, argv);
    opts o = {.shape = "llama2-7b", .device = NULL, .ctx = 130048, .passes = 3, .gamma1 = 2,
              .gpu_mem = (uint64_t)24 << 30, .budgets = {8192, 12288}, .n_budgets = 2, .gamma2s = {12, 16},
              .n_gamma2 = 2, .alpha = 0.9, .beta = 0.7, .weights = TRI_DTYPE_F16, .host_gbps = {60, 100},
              .n_host_gbps = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(a, "--shape") && v) o.shape = v;
        else if (!strcmp(a, "--device") && v) o.device = v;
        else if (!strcmp(a, "--ctx") && v) ok = (o.ctx = atoi(v)) > 0;
        else if (!strcmp(a, "--passes") && v) ok = (o.passes = atoi(v)) > 0;
        else if (!strcmp(a, "--gamma1") && v) ok = (o.gamma1 = atoi(v)) > 0;
        else if (!strcmp(a, "--gpu-mem") && v) ok = parse_size(v, &o.gpu_mem);
        else if (!strcmp(a, "--reserve") && v) ok = o.reserve_set = parse_size(v, &o.reserve) || !strcmp(v, "0");
        else if (!strcmp(a, "--budgets") && v) ok = (o.n_budgets = parse_list(v, o.budgets)) > 0;
        else if (!strcmp(a, "--gamma2") && v) ok = (o.n_gamma2 = parse_list(v, o.gamma2s)) > 0;
        else if (!strcmp(a, "--accept") && v) ok = (o.alpha = atof(v)) > 0 && o.alpha <= 1;
        else if (!strcmp(a, "--accept-l1") && v) ok = (o.beta = atof(v)) > 0 && o.beta <= 1;
        else if (!strcmp(a, "--host-gbps") && v) ok = (o.n_host_gbps = parse_reals(v, o.host_gbps)) > 0;
        else if (!strcmp(a, "--weights") && v) {
            o.weights = !strcmp(v, "q8_0") ? TRI_DTYPE_Q8_0 : !strcmp(v, "q4_0") ? TRI_DTYPE_Q4_0 : TRI_DTYPE_F16;
            ok = !strcmp(v, "f16") || o.weights != TRI_DTYPE_F16;
        } else ok = false;
        if (!ok) {
            usage();
            return 2;
        }
        i++;
    }
    tri_model_config tc, dc;
    if (strcmp(o.shape, "llama2-7b") && strcmp(o.shape, "tiny")) {
        usage();
        return 2;
    }
    bench_shape(o.shape, &tc);
    bench_shape("llama-68m", &dc);
    if (!strcmp(o.shape, "tiny")) dc = tc, dc.n_layer = 1;
    tri__backend *be;
    char be_name[16];
    int32_t dev;
    if (bench_open_backend(o.device, &be, be_name, &dev)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        return 1;
    }
    bench_print_machine();
    if (!strncmp(be_name, "cuda", 4)) {
        tri_device_info di;
        if (tri_device_get_info(dev, &di) == TRI_STATUS_OK)
            printf("device: %s (%s), %.1f GiB, PCIe gen %d x%d\n", be_name, di.name,
                   (double)di.total_bytes / (1 << 30), di.pcie_gen, di.pcie_width);
    } else {
        printf("device: cpu (no GPU: copies are memcpy, figures show the mechanics only)\n");
    }

    tri_model *target = NULL, *draft = NULL;
    double t_build = bench_now();
    if (tri__model_synthetic(&tc, o.weights, 1, &target) || tri__model_synthetic(&dc, TRI_DTYPE_F16, 2, &draft)) {
        fprintf(stderr, "bench-offload: %s\n", tri_last_error());
        return 1;
    }
    printf("model: %s shape, synthetic %s weights (built in %.1f s), context %d tokens of synthetic KV (f16)\n",
           o.shape, tri_dtype_name(o.weights), bench_now() - t_build, o.ctx);
    double peak_gbps = 0;
    if (tri__backend_measure_h2d(be, 0, &peak_gbps)) fprintf(stderr, "bench-offload: %s\n", tri_last_error());
    double peak = 1e9 * peak_gbps;
    printf("host -> device peak (pinned, raw copy): %.2f GB/s\n", peak / 1e9);
    printf("forced acceptance: alpha %.2f (L3 accepts an L2 token), beta %.2f (L2 accepts an L1 token), gamma1 %d\n",
           o.alpha, o.beta, o.gamma1);
    printf("\n| mode | budget | gamma2 | resident blocks | KV layers on device | L3 pass ms | L2 pass ms | L1 pass ms "
           "| tokens/round | ms/token | MB over PCIe/token | floor ms/token | time/floor |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

    int rc = 0;
    // mode 0: autoregressive; then TriForce per budget
    for (int run = 0; run <= o.n_budgets && !rc; run++) {
        bool ar = run == 0;
        int32_t budget = ar ? 0 : o.budgets[run - 1];
        int32_t g2max = 1;
        for (int i = 0; i < o.n_gamma2; i++) g2max = o.gamma2s[i] > g2max ? o.gamma2s[i] : g2max;
        tri_plan_params pp = tri_plan_default_params();
        pp.mode = ar ? TRI_PLAN_MODE_AUTOREGRESSIVE : TRI_PLAN_MODE_TRIFORCE;
        pp.n_ctx = o.ctx + g2max + 1;
        pp.gpu_mem_bytes = o.gpu_mem;
        pp.retrieval_budget = budget;
        pp.gamma1 = o.gamma1;
        pp.gamma2 = g2max;
        if (o.reserve_set) pp.gpu_reserve_bytes = o.reserve ? o.reserve : 1;  // 0 would mean the default
        tri_plan_model pm, dm;
        tri_plan_model_from_model(target, &pm);
        tri_plan_model_from_model(draft, &dm);
        pp.draft_bytes = (uint64_t)dc.n_layer * dm.layer_bytes + dm.other_bytes;
        pp.draft_n_layer = dc.n_layer;
        tri_plan plan;
        if (tri_plan_compute(&pm, &pp, &plan)) {
            printf("| %s | %d | | cannot place: %s |\n", ar ? "autoregressive" : "TriForce", budget, tri_last_error());
            continue;
        }
        int32_t streamed = plan.n_weights_host + plan.n_weights_disk;
        tri_model *tv = NULL, *dv = NULL;
        tri__kv_store l3 = {0}, l2 = {0}, l1 = {0};
        tri_status st = tri__model_on_backend(target, be, streamed, plan.n_weights_disk, &tv);
        if (!st) st = bench_filled_store(&l3, be, &tc, pp.n_ctx, plan.on_chip, o.ctx);
        if (!st && !ar) {
            st = bench_filled_store(&l2, be, &tc, budget + 256, tc.n_layer, budget);
            if (!st) st = tri__model_on_backend(draft, be, 0, 0, &dv);
            if (!st) st = bench_filled_store(&l1, be, &dc, 256 + 64, dc.n_layer, 256);
        }
        pass_time p2 = {0}, p1 = {0};
        if (!st && !ar) st = bench_time_pass(tv, be, &l2, o.gamma1 + 1, o.passes, &p2);
        if (!st && !ar) st = bench_time_pass(dv, be, &l1, 1, o.passes, &p1);
        for (int gi = 0; !st && gi < (ar ? 1 : o.n_gamma2); gi++) {
            int32_t g2 = ar ? 0 : o.gamma2s[gi];
            pass_time p3;
            if ((st = bench_time_pass(tv, be, &l3, g2 + 1, o.passes, &p3))) break;
            double per_round = ar ? 1.0 : expected(o.alpha, g2);
            double l2_passes = ar ? 0 : g2 / expected(o.beta, o.gamma1);
            double l1_passes = l2_passes * o.gamma1;
            double t_round = p3.seconds + l2_passes * p2.seconds + l1_passes * p1.seconds;
            double bytes = (p3.kv_bytes_up + p3.weight_bytes_up + l2_passes * p2.weight_bytes_up) / per_round;
            double floor_s = peak > 0 ? bytes / peak : 0;
            double t_tok = t_round / per_round;
            char b2[16] = "-", g2s[16] = "-", t2[16] = "-", t1[16] = "-";
            if (!ar) {
                snprintf(b2, sizeof b2, "%d", budget);
                snprintf(g2s, sizeof g2s, "%d", g2);
                snprintf(t2, sizeof t2, "%.2f", 1e3 * p2.seconds);
                snprintf(t1, sizeof t1, "%.2f", 1e3 * p1.seconds);
            }
            printf("| %s | %s | %s | %d of %d | %d of %d | %.1f | %s | %s | %.2f | %.1f | %.1f | %.1f | %.2f |\n",
                   ar ? "autoregressive" : "TriForce", b2, g2s, tc.n_layer - streamed, tc.n_layer, plan.on_chip,
                   tc.n_layer, 1e3 * p3.seconds, t2, t1, per_round, 1e3 * t_tok, bytes / 1e6, 1e3 * floor_s,
                   floor_s > 0 ? t_tok / floor_s : 0.0);
            fflush(stdout);
            pp.host_attn_gbps = split_host_gbps(&tc, ar ? 1 : g2 + 1);
            tri_plan sp_plan;
            if (pp.host_attn_gbps > 0 && !tri_plan_compute(&pm, &pp, &sp_plan))
                st = split_measured_pass(tv, be, &l3, ar ? 1 : g2 + 1, o.passes, sp_plan.kv_host_fraction, &p3);
        }
        if (st) {
            fprintf(stderr, "bench-offload: %s: %s\n", ar ? "autoregressive" : "TriForce", tri_last_error());
            rc = 1;
        }
        tri__kv_store_free(&l1);
        tri__kv_store_free(&l2);
        tri__kv_store_free(&l3);
        tri__model_backend_free(dv);
        tri__model_backend_free(tv);
    }
    split_report(&o, peak_gbps > 0 && !strncmp(be_name, "cuda", 4) ? peak_gbps : 25.0);
    printf("\npaper (Llama2-7B-128K, 127K-token prompt): autoregressive 1516 ms/token on one RTX 4090 and 840 on "
           "two; TriForce 312 ms/token on one, 108 on two\n");
    tri__model_synthetic_free(draft);
    tri__model_synthetic_free(target);
    tri__backend_free(be);
    return rc;
}
