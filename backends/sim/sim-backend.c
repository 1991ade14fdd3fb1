// sim-backend.c - the simulated device: the engine's calls placed on a timeline (sim-backend.h).
#include "sim-backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"
#include "planner.h"

// ---- profiles ----
//
// Peaks from the vendors' datasheets (docs/offload.md, "Simulated devices", cites them); what a
// kernel reaches is the peak times an efficiency stated once here for all the GPUs: 60 % of the
// dense f16 tensor rate (f32 accumulate) for matmuls, 50 % of the f32 rate for other ops, 85 % of
// the memory bandwidth, and the PCIe rate a pinned cudaMemcpyAsync typically reaches: 25 GB/s on
// 4.0 x16 (of 31.5), 12.5 on x8, 50 on 5.0 x16 (of 63).
// The memory-bound kernels of decode take the share of the bandwidth that scripts/roofline.py
// predicts for the CUDA backend's kernels from their SASS (docs/cuda.md, "Roofline"), at most
// MEM_EFF: the matvec (m <= 16) per weight type F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (the
// least over Llama2-7B's four weight shapes: 0.87 to 1.0 for every type on both cards since the
// quantized types are staged, so MEM_EFF; the kernel before took 0.13 to 0.21 of an H100's for
// the quantized types), and attention at Llama2-7B's 32K keys, one query (f16 rows; the kernel
// re-reads the keys for every query, which the simulator does not time: it reads them once per
// call). The H100 SXM's figures (sm_90) serve the H100s, the H200 and the A100; the RTX 4090's
// (sm_89) the 4090 and 5090.
#define GIB ((uint64_t)1 << 30)
#define MM_EFF 0.60
#define VEC_EFF 0.50
#define MEM_EFF 0.85
// clang-format off
#define HOPPER_MATVEC(bw) {(bw) * MEM_EFF, (bw) * MEM_EFF, (bw) * MEM_EFF, (bw) * MEM_EFF, (bw) * MEM_EFF, \
                           (bw) * MEM_EFF, (bw) * MEM_EFF, (bw) * MEM_EFF}
#define HOPPER_ATTN 0.24
#define ADA_MATVEC(bw) HOPPER_MATVEC(bw)
#define ADA_ATTN 0.57

static const tri__sim_profile profiles[] = {
    {.name = "rtx4090", .desc = "RTX 4090 (AD102, 24 GB GDDR6X 1008 GB/s, 165 TFLOP/s f16 tensor), PCIe 4.0 x16",
     .matmul_tflops = 165.2 * MM_EFF, .vector_tflops = 82.6 * VEC_EFF, .mem_gbps = 1008.0 * MEM_EFF,
     .h2d_gbps = 25.0, .d2h_gbps = 25.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 24 * GIB,
     .matvec_gbps = ADA_MATVEC(1008.0), .attn_gbps = 1008.0 * ADA_ATTN},
    {.name = "rtx4090-x8", .desc = "RTX 4090 as above, PCIe 4.0 x8 (two cards sharing a CPU's 16 lanes)",
     .matmul_tflops = 165.2 * MM_EFF, .vector_tflops = 82.6 * VEC_EFF, .mem_gbps = 1008.0 * MEM_EFF,
     .h2d_gbps = 12.5, .d2h_gbps = 12.5, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 24 * GIB,
     .matvec_gbps = ADA_MATVEC(1008.0), .attn_gbps = 1008.0 * ADA_ATTN},
    {.name = "rtx5090", .desc = "RTX 5090 (GB202, 32 GB GDDR7 1792 GB/s, 210 TFLOP/s f16 tensor), PCIe 5.0 x16",
     .matmul_tflops = 209.5 * MM_EFF, .vector_tflops = 104.8 * VEC_EFF, .mem_gbps = 1792.0 * MEM_EFF,
     .h2d_gbps = 50.0, .d2h_gbps = 50.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 32 * GIB,
     .matvec_gbps = ADA_MATVEC(1792.0), .attn_gbps = 1792.0 * ADA_ATTN},
    {.name = "h100-pcie", .desc = "H100 PCIe (GH100, 80 GB HBM2e 2000 GB/s, 756 TFLOP/s f16 tensor), PCIe 5.0 x16",
     .matmul_tflops = 756.0 * MM_EFF, .vector_tflops = 51.2 * VEC_EFF, .mem_gbps = 2000.0 * MEM_EFF,
     .h2d_gbps = 50.0, .d2h_gbps = 50.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 80 * GIB,
     .matvec_gbps = HOPPER_MATVEC(2000.0), .attn_gbps = 2000.0 * HOPPER_ATTN},
    {.name = "h100-sxm", .desc = "H100 SXM5 (GH100, 80 GB HBM3 3350 GB/s, 989 TFLOP/s f16 tensor), PCIe 5.0 x16",
     .matmul_tflops = 989.4 * MM_EFF, .vector_tflops = 66.9 * VEC_EFF, .mem_gbps = 3350.0 * MEM_EFF,
     .h2d_gbps = 50.0, .d2h_gbps = 50.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 80 * GIB,
     .matvec_gbps = HOPPER_MATVEC(3350.0), .attn_gbps = 3350.0 * HOPPER_ATTN},
    {.name = "h200", .desc = "H200 SXM (GH100, 141 GB HBM3e 4800 GB/s, 989 TFLOP/s f16 tensor), PCIe 5.0 x16",
     .matmul_tflops = 989.4 * MM_EFF, .vector_tflops = 66.9 * VEC_EFF, .mem_gbps = 4800.0 * MEM_EFF,
     .h2d_gbps = 50.0, .d2h_gbps = 50.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 141 * GIB,
     .matvec_gbps = HOPPER_MATVEC(4800.0), .attn_gbps = 4800.0 * HOPPER_ATTN},
    // the GPU of TriForce's on-chip runs (its A100s; the 80 GB part, which holds a batch's KV)
    {.name = "a100", .desc = "A100 SXM4 80 GB (GA100, HBM2e 2039 GB/s, 312 TFLOP/s f16 tensor), PCIe 4.0 x16",
     .matmul_tflops = 312.0 * MM_EFF, .vector_tflops = 19.5 * VEC_EFF, .mem_gbps = 2039.0 * MEM_EFF,
     .h2d_gbps = 25.0, .d2h_gbps = 25.0, .launch_us = 4.0, .kernel_us = 2.5, .mem_bytes = 80 * GIB,
     .matvec_gbps = HOPPER_MATVEC(2039.0), .attn_gbps = 2039.0 * HOPPER_ATTN},
};
// clang-format on

const tri__sim_profile *tri__sim_profiles(int *n) {
    *n = (int)(sizeof profiles / sizeof profiles[0]);
    return profiles;
}

const tri__sim_profile *tri__sim_profile_find(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "h100")) name = "h100-pcie";
    for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++)
        if (!strcmp(profiles[i].name, name)) return &profiles[i];
    return NULL;
}

// Hosts. Peak f32 FLOP/s: cores x 32 FLOP/cycle (Zen 4 runs AVX-512 on two 256-bit FMA pipes: 16
// f32 FMAs a cycle) x the all-core clock; bf16 (VDPBF16PS) twice that; reached at HOST_EFF.
// DRAM: channels x 8 bytes x MT/s theoretical, reached at the share a STREAM-like read gets.
#define HOST_EFF 0.50
static const tri__sim_host hosts[] = {
    {.name = "desktop",
     .desc = "16-core desktop (Ryzen 9 7950X, ~5.0 GHz all-core), 2 x DDR5-5200 (83.2 GB/s theoretical, 64 reached)",
     .cores = 16, .f32_tflops = 16 * 32 * 5.0e-3 * HOST_EFF, .bf16_tflops = 2 * 16 * 32 * 5.0e-3 * HOST_EFF,
     .dram_gbps = 64.0, .numa_nodes = 1},
    {.name = "workstation",
     .desc = "32-core workstation (Threadripper PRO 7975WX, ~4.5 GHz all-core), 8 x DDR5-5200 (332.8 GB/s "
             "theoretical, 250 reached)",
     .cores = 32, .f32_tflops = 32 * 32 * 4.5e-3 * HOST_EFF, .bf16_tflops = 2 * 32 * 32 * 4.5e-3 * HOST_EFF,
     .dram_gbps = 250.0, .numa_nodes = 1},
};

const tri__sim_host *tri__sim_hosts(int *n) {
    *n = (int)(sizeof hosts / sizeof hosts[0]);
    return hosts;
}

const tri__sim_host *tri__sim_host_find(const char *name) {
    for (size_t i = 0; name && i < sizeof hosts / sizeof hosts[0]; i++)
        if (!strcmp(hosts[i].name, name)) return &hosts[i];
    return NULL;
}

double tri__sim_host_attention_flops(double rows, int32_t m, int32_t n_head, int32_t head_dim) {
    return 2.0 * 2.0 * (double)head_dim * (double)m * (double)n_head * rows;
}

double tri__sim_host_split_seconds(const tri__sim_host *h, double rows, int32_t m, int32_t n_head, int32_t head_dim,
                                   double row_bytes, bool bf16, double dma_bytes, double pcie_gbps) {
    double flops = tri__sim_host_attention_flops(rows, m, n_head, head_dim);
    double host_bytes = rows * row_bytes, dram = h->dram_gbps * 1e9;
    double t = flops / ((bf16 ? h->bf16_tflops : h->f32_tflops) * 1e12);
    t = fmax(t, (host_bytes + dma_bytes) / dram);
    if (dma_bytes > 0 && pcie_gbps > 0) t = fmax(t, dma_bytes / (pcie_gbps * 1e9));
    return t;
}

double tri__sim_host_attn_gbps(const tri__sim_host *h, int32_t m, int32_t n_head, int32_t head_dim, double row_bytes,
                               bool bf16) {
    double per_byte = tri__sim_host_attention_flops(1.0, m, n_head, head_dim) / row_bytes;
    return fmin(h->dram_gbps, (bf16 ? h->bf16_tflops : h->f32_tflops) * 1e3 / per_byte);
}

// ---- acceptance curves ----

// One record's integer fields after its keyword: n of them into v, each named in names for the
// message. BAD_FORMAT naming the file, line and field.
static tri_status curve_fields(const char *name, int ln, char *rest, int n, const char *const *names, long long *v) {
    char *save = NULL, *tok = strtok_r(rest, " \t\r\n", &save);
    for (int i = 0; i < n; i++, tok = strtok_r(NULL, " \t\r\n", &save)) {
        if (!tok)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: field %s missing (want %d numbers)", name,
                             ln, names[i], n);
        char *end;
        v[i] = strtoll(tok, &end, 10);
        if (end == tok || *end || v[i] < 0 || v[i] > (long long)1 << 53)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: field %s: '%.32s' is not a count", name,
                             ln, names[i], tok);
    }
    if (tok)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: '%.32s' after the %d fields", name, ln, tok,
                         n);
    return TRI_STATUS_OK;
}

tri_status tri__sim_curve_parse(const char *name, const char *text, size_t len, tri__sim_curve *c) {
    memset(c, 0, sizeof *c);
    double sum_r[2] = {0, 0}, sum_a[2] = {0, 0}, tr[TRI_SIM_TREE_RANKS + 1] = {0}, ta[TRI_SIM_TREE_RANKS + 1] = {0};
    static const char *const chain_names[] = {"DEPTH", "REACHED", "ACCEPTED"};
    static const char *const tree_names[] = {"DEPTH", "RANK", "REACHED", "ACCEPTED"};
    char line[512];
    int ln = 0;
    tri_status st = TRI_STATUS_OK;
    for (size_t at = 0; !st && at < len; ln++) {
        size_t eol = at;
        while (eol < len && text[eol] != '\n') eol++;
        size_t n = eol - at;
        if (n >= sizeof line)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: line longer than %zu bytes", name, ln + 1,
                             sizeof line - 1);
        memcpy(line, text + at, n);
        line[n] = 0;
        at = eol + 1;
        if (memchr(line, 0, n))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: a NUL byte", name, ln + 1);
        char *kw = line + strspn(line, " \t\r");
        if (*kw == '#' || *kw == 0 || *kw == '\n') continue;
        size_t kl = strcspn(kw, " \t\r");
        char *rest = kw[kl] ? kw + kl + 1 : kw + kl;
        kw[kl] = 0;
        long long v[4];
        double x;
        char *end;
        if (!strcmp(kw, "l1") || !strcmp(kw, "l2")) {
            int w = kw[1] - '1';
            if ((st = curve_fields(name, ln + 1, rest, 3, chain_names, v))) break;
            if (v[0] != c->depth[w] + 1 || v[0] > TRI_SIM_CURVE_DEPTH) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT,
                               "acceptance curve %s:%d: field DEPTH: %lld, want %s depth %d "
                               "(depths 1, 2, ... up to %d in order)",
                               name, ln + 1, v[0], kw, c->depth[w] + 1, TRI_SIM_CURVE_DEPTH);
            } else if (v[1] < 1 || v[2] > v[1]) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT,
                               "acceptance curve %s:%d: field %s: want REACHED >= 1 and "
                               "0 <= ACCEPTED <= REACHED (%lld, %lld)",
                               name, ln + 1, v[1] < 1 ? "REACHED" : "ACCEPTED", v[1], v[2]);
            } else {
                c->rate[w][v[0]] = (double)v[2] / (double)v[1];
                c->depth[w] = (int32_t)v[0];
                sum_r[w] += (double)v[1], sum_a[w] += (double)v[2];
            }
        } else if (!strcmp(kw, "tree")) {
            if ((st = curve_fields(name, ln + 1, rest, 4, tree_names, v))) break;
            int32_t d = c->tree_depth;
            v[1]++;  // the file's rank 0 is the chain's token: rank 1 here
            // depths 1, 2, ... in order; within a depth, ascending ranks starting with the chain's
            bool next_rank = d > 0 && v[0] == d && v[1] > c->tree_ranks[d];
            bool next_depth = v[0] == d + 1 && v[1] == 1;
            if (!next_rank && !next_depth) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT,
                               "acceptance curve %s:%d: field %s: depth %lld rank %lld, want "
                               "depth %d with a rank above %d or depth %d rank 0 (depths in order, each from rank 0 "
                               "up)",
                               name, ln + 1, v[0] != d && v[0] != d + 1 ? "DEPTH" : "RANK", v[0], v[1] - 1, d,
                               d > 0 ? c->tree_ranks[d] - 1 : -1, d + 1);
            } else if (v[0] > TRI_SIM_CURVE_DEPTH || v[1] > TRI_SIM_TREE_RANKS) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: field %s: %lld, at most %d", name,
                               ln + 1, v[0] > TRI_SIM_CURVE_DEPTH ? "DEPTH" : "RANK",
                               v[0] > TRI_SIM_CURVE_DEPTH ? v[0] : v[1] - 1,
                               v[0] > TRI_SIM_CURVE_DEPTH ? TRI_SIM_CURVE_DEPTH : TRI_SIM_TREE_RANKS - 1);
            } else if (v[2] < 1 || v[3] > v[2]) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT,
                               "acceptance curve %s:%d: field %s: want REACHED >= 1 and "
                               "0 <= ACCEPTED <= REACHED (%lld, %lld)",
                               name, ln + 1, v[2] < 1 ? "REACHED" : "ACCEPTED", v[2], v[3]);
            } else {
                c->tree_depth = (int32_t)v[0];
                c->tree_ranks[v[0]] = (int32_t)v[1];
                c->tree[v[0]][v[1]] = (double)v[3] / (double)v[2];
                c->tree_reached[v[0]][v[1]] = (double)v[2];
                tr[v[1]] += (double)v[2], ta[v[1]] += (double)v[3];
            }
        } else if (!strcmp(kw, "gamma1") || !strcmp(kw, "gamma2") || !strcmp(kw, "tree_nodes")) {
            static const char *const one[] = {"N"};
            if ((st = curve_fields(name, ln + 1, rest, 1, one, v))) break;
            if (v[0] < 1 || v[0] > INT32_MAX) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s:%d: field N of %s: %lld, want >= 1", name,
                               ln + 1, kw, v[0]);
                break;
            }
            *(!strcmp(kw, "gamma1") ? &c->gamma1 : !strcmp(kw, "gamma2") ? &c->gamma2 : &c->tree_nodes) = (int32_t)v[0];
        } else if (!strcmp(kw, "tokens_per_l3")) {
            rest += strspn(rest, " \t");
            x = strtod(rest, &end);
            if (end == rest || !(x >= 1 && x < 1e6) || end[strspn(end, " \t\r")]) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT,
                               "acceptance curve %s:%d: field X of tokens_per_l3: want a number "
                               ">= 1",
                               name, ln + 1);
                break;
            }
            c->tokens_per_l3 = x;
        } else {
            st = tri__fail(TRI_STATUS_BAD_FORMAT,
                           "acceptance curve %s:%d: not a curve line (want 'l1|l2 DEPTH REACHED ACCEPTED', 'tree DEPTH "
                           "RANK REACHED ACCEPTED', 'gamma1 N', 'gamma2 N', 'tree_nodes N', 'tokens_per_l3 X' or a '#' "
                           "comment)",
                           name, ln + 1);
        }
    }
    if (!st && (c->depth[0] == 0 || c->depth[1] == 0))
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "acceptance curve %s: needs both an l1 and an l2 level", name);
    for (int w = 0; !st && w < 2; w++) c->pooled[w] = sum_a[w] / sum_r[w];
    for (int r = 1; !st && r <= TRI_SIM_TREE_RANKS; r++) c->tree_pooled[r] = tr[r] > 0 ? ta[r] / tr[r] : 0;
    return st;
}

tri_status tri__sim_curve_read(const char *path, tri__sim_curve *c) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return tri__fail(TRI_STATUS_IO, "acceptance curve %s: cannot open", path);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *b = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        return tri__fail(err ? TRI_STATUS_IO : TRI_STATUS_BAD_FORMAT, "acceptance curve %s: %s", path,
                         err ? "read error" : "larger than 64 MiB or out of memory");
    }
    tri_status st = tri__sim_curve_parse(path, buf, len, c);
    free(buf);
    return st;
}

void tri__sim_curve_table(const tri__sim_curve *c, int w, double decay, tri__accept_table *t, bool *measured_ranks) {
    memset(t, 0, sizeof *t);
    bool tree = w == 1 && c->tree_depth > 0;
    if (measured_ranks) *measured_ranks = tree;
    for (int32_t d = 1; d <= TRI_PLAN_TREE_DEPTH; d++) {
        double a1 = d <= c->depth[w] ? c->rate[w][d] : c->pooled[w];
        for (int32_t r = 1; r <= TRI_PLAN_TREE_RANKS; r++) {
            if (!tree) {
                t->a[d][r] = a1 * pow(decay, r - 1);
            } else if (r <= TRI_SIM_TREE_RANKS && d <= c->tree_depth && c->tree_reached[d][r] > 0) {
                t->a[d][r] = c->tree[d][r];
            } else {
                t->a[d][r] = r <= TRI_SIM_TREE_RANKS ? c->tree_pooled[r] : 0;
            }
        }
    }
}

double tri__sim_curve_expected(const tri__sim_curve *c, int w, int32_t g) {
    double e = 1, all = 1;
    for (int32_t d = 1; d <= g; d++) {
        all *= d <= c->depth[w] ? c->rate[w][d] : c->pooled[w];
        e += all;
    }
    return e;
}

// ---- state ----

// Fake device addresses: non-canonical on x86-64 and AArch64 (bit 62 set, bit 47 clear), so a
// host dereference faults. Allocations are 256-aligned and never reused.
#define FAKE_BASE ((uintptr_t)1 << 62)
#define FAKE_ALIGN 256

typedef struct block {
    uintptr_t addr;
    uint64_t bytes;
} block;

// Busy intervals of one queue, in time order, touching ones merged.
typedef struct busy {
    double *t;  // (2 n) start, end pairs
    int64_t n, cap;
} busy;

struct tri__event {
    double t;  // the point it marks: the end of what its queue held when recorded
};

typedef struct sim {
    tri__sim_profile p;
    double host;         // the issuing thread's clock (s)
    double tail[2];      // when each queue is free (s); raised by waits too
    uintptr_t next;      // next fake address
    block *blocks;
    int64_t n_blocks, cap_blocks;
    tri__sim_stats st;
    busy busy[2];
    double t0;           // start of the current measurement
    bool tracing;
    tri__sim_item *trace;
    int64_t n_trace, cap_trace;
} sim;

static sim *S(tri__backend *be) { return be->priv; }

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

// Adds [a, b) to a queue's busy list (a is never before the last interval's start).
static tri_status busy_add(busy *b, double a, double e) {
    if (e <= a) return TRI_STATUS_OK;
    if (b->n > 0 && a <= b->t[2 * b->n - 1]) {
        if (e > b->t[2 * b->n - 1]) b->t[2 * b->n - 1] = e;
        return TRI_STATUS_OK;
    }
    int64_t cap2 = b->cap * 2;
    if (!grow((void **)&b->t, &cap2, 2 * (b->n + 1), sizeof *b->t))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sim backend: busy intervals");
    b->cap = cap2 / 2;
    b->t[2 * b->n] = a;
    b->t[2 * b->n + 1] = e;
    b->n++;
    return TRI_STATUS_OK;
}

// Places one item of `seconds` on queue q: it starts when the queue is free and the host has
// issued it (the host pays launch_us first).
static tri_status place(tri__backend *be, tri__sim_queue q, tri__sim_kind kind, const char *what, double seconds,
                        uint64_t bytes, double flops) {
    sim *s = S(be);
    s->host += s->p.launch_us * 1e-6;
    double start = s->tail[q] > s->host ? s->tail[q] : s->host;
    double kmin = s->p.kernel_us * 1e-6;
    double end = start + (seconds > kmin ? seconds : kmin);
    s->tail[q] = end;
    tri_status st = busy_add(&s->busy[q], start, end);
    if (st) return st;
    if (q == TRI_SIM_QUEUE_COMPUTE) s->st.compute_busy += end - start;
    else s->st.transfer_busy += end - start;
    if (kind == TRI_SIM_KIND_OP) {
        s->st.n_ops++;
    } else {
        s->st.n_copies++;
        uint64_t *tot = kind == TRI_SIM_KIND_H2D ? &s->st.h2d_bytes : kind == TRI_SIM_KIND_D2H ? &s->st.d2h_bytes
                                                                                               : &s->st.d2d_bytes;
        *tot += bytes;
        if (q == TRI_SIM_QUEUE_TRANSFER && kind == TRI_SIM_KIND_H2D) s->st.transfer_h2d_bytes += bytes;
        if (q == TRI_SIM_QUEUE_TRANSFER && kind == TRI_SIM_KIND_D2H) s->st.transfer_d2h_bytes += bytes;
    }
    if (s->tracing) {
        if (!grow((void **)&s->trace, &s->cap_trace, s->n_trace + 1, sizeof *s->trace))
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sim backend: trace");
        s->trace[s->n_trace++] = (tri__sim_item){q, kind, what, start, end, bytes, flops};
    }
    return TRI_STATUS_OK;
}

// An op on COMPUTE, the slower of its FLOPs and its bytes: weight_bytes of bytes (a matmul's
// weights) at wrate (GB/s; 0: mem_gbps), or with matmul false (an attention's rows) at attn_gbps
// when the profile sets it.
static tri_status op_time_rate(tri__backend *be, const char *what, double flops, double bytes, bool matmul,
                               double weight_bytes, double wrate) {
    const tri__sim_profile *p = &S(be)->p;
    double rate = (matmul ? p->matmul_tflops : p->vector_tflops) * 1e12;
    double t = flops / rate;
    double tm = bytes / (p->mem_gbps * 1e9);
    if (!matmul && p->attn_gbps > 0) wrate = p->attn_gbps;
    if (weight_bytes > 0 && wrate > 0)  // weights or rows at their kernel's own rate
        tm = weight_bytes / (wrate * 1e9) + (bytes - weight_bytes) / (p->mem_gbps * 1e9);
    return place(be, TRI_SIM_QUEUE_COMPUTE, TRI_SIM_KIND_OP, what, t > tm ? t : tm, (uint64_t)bytes, flops);
}

// An op on COMPUTE: the slower of its FLOPs and its bytes (a matmul's weights at matmul_gbps).
static tri_status op_time(tri__backend *be, const char *what, double flops, double bytes, bool matmul,
                          double weight_bytes, tri_dtype wtype) {
    const tri__sim_profile *p = &S(be)->p;
    double wrate = matmul && (unsigned)wtype < 8 ? p->matmul_gbps[wtype] : 0;
    return op_time_rate(be, what, flops, bytes, matmul, weight_bytes, wrate);
}

static tri_status copy_time(tri__backend *be, tri__sim_queue q, tri__sim_kind kind, size_t bytes) {
    const tri__sim_profile *p = &S(be)->p;
    double t = kind == TRI_SIM_KIND_H2D   ? (double)bytes / (p->h2d_gbps * 1e9)
               : kind == TRI_SIM_KIND_D2H ? (double)bytes / (p->d2h_gbps * 1e9)
                                          : 2.0 * (double)bytes / (p->mem_gbps * 1e9);
    const char *what = kind == TRI_SIM_KIND_H2D ? "h2d" : kind == TRI_SIM_KIND_D2H ? "d2h" : "d2d";
    return place(be, q, kind, what, t, bytes, 0);
}

// ---- memory ----

static tri_status sim_alloc(tri__backend *be, size_t bytes, void **out) {
    sim *s = S(be);
    *out = NULL;
    if (bytes == 0) return TRI_STATUS_OK;
    if (s->st.mem_used + bytes > s->p.mem_bytes)
        return tri__fail(TRI_STATUS_DEVICE_OUT_OF_MEMORY,
                         "sim:%s: %.2f GiB more would pass the device's %.1f GiB (%.2f GiB in use)", s->p.name,
                         (double)bytes / GIB, (double)s->p.mem_bytes / GIB, (double)s->st.mem_used / GIB);
    if (!grow((void **)&s->blocks, &s->cap_blocks, s->n_blocks + 1, sizeof *s->blocks))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sim backend: allocation table");
    uintptr_t a = s->next;
    s->next += ((uintptr_t)bytes + FAKE_ALIGN - 1) / FAKE_ALIGN * FAKE_ALIGN;
    s->blocks[s->n_blocks++] = (block){a, bytes};
    s->st.mem_used += bytes;
    if (s->st.mem_used > s->st.mem_peak) s->st.mem_peak = s->st.mem_used;
    *out = (void *)a;
    return TRI_STATUS_OK;
}

static void sim_free(tri__backend *be, void *ptr) {
    sim *s = S(be);
    if (!ptr) return;
    for (int64_t i = 0; i < s->n_blocks; i++)
        if (s->blocks[i].addr == (uintptr_t)ptr) {
            s->st.mem_used -= s->blocks[i].bytes;
            s->blocks[i] = s->blocks[--s->n_blocks];
            return;
        }
    TRI_ASSERT(!"sim backend: free of a pointer alloc did not return");
}

static tri_status sim_copy_to_backend(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src;
    return copy_time(be, TRI_SIM_QUEUE_COMPUTE, TRI_SIM_KIND_H2D, bytes);
}

static tri_status sim_copy_to_host(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)src;
    memset(dst, 0, bytes);  // what the host reads back: logits, queries, selections (all zero)
    return copy_time(be, TRI_SIM_QUEUE_COMPUTE, TRI_SIM_KIND_D2H, bytes);
}

static tri_status sim_copy(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src;
    return copy_time(be, TRI_SIM_QUEUE_COMPUTE, TRI_SIM_KIND_D2D, bytes);
}

static tri_status sim_synchronize(tri__backend *be) {
    sim *s = S(be);
    for (int q = 0; q < 2; q++)
        if (s->tail[q] > s->host) s->host = s->tail[q];
    return TRI_STATUS_OK;
}

// ---- ops: FLOPs and bytes ----

static tri_status sim_matmul(tri__backend *be, float *y, const float *x, const void *w, tri_dtype w_type, int64_t m,
                             int64_t n, int64_t k) {
    (void)y, (void)x, (void)w;
    double wb = (double)n * (double)tri__dtype_row_bytes(w_type, k);
    double io = 4.0 * (double)m * (double)(n + k);
    const tri__sim_profile *p = &S(be)->p;
    double wrate = (unsigned)w_type < 8 ? p->matmul_gbps[w_type] : 0;
    if (m <= 16 && (unsigned)w_type < 8 && p->matvec_gbps[w_type] > 0) wrate = p->matvec_gbps[w_type];
    return op_time_rate(be, "matmul", 2.0 * (double)m * (double)n * (double)k, wb + io, true, wb, wrate);
}

static tri_status sim_get_rows(tri__backend *be, float *out, const void *table, tri_dtype table_type, int64_t n_rows,
                               int64_t n, const int32_t *ids, int64_t m) {
    (void)out, (void)table;
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= n_rows)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "get_rows: id %d at %lld outside [0, %lld)", ids[i],
                             (long long)i, (long long)n_rows);
    double b = (double)m * ((double)tri__dtype_row_bytes(table_type, n) + 4.0 * (double)n);
    return op_time(be, "get_rows", 0, b, false, 0, table_type);
}

static tri_status sim_convert(tri__backend *be, void *dst, tri_dtype dst_type, const float *src, int64_t n) {
    (void)dst, (void)src;
    double b = (double)n * 4.0 + (double)tri__dtype_row_bytes(dst_type, n);  // f32 in, the cache's type out
    return op_time(be, "convert", (double)n, b, false, 0, dst_type);
}

static tri_status sim_rmsnorm(tri__backend *be, float *y, const float *x, const void *weight, tri_dtype wt, int64_t m,
                              int64_t n, float eps) {
    (void)y, (void)x, (void)weight, (void)wt, (void)eps;
    return op_time(be, "rmsnorm", 4.0 * (double)m * (double)n, 8.0 * (double)m * (double)n + 4.0 * (double)n, false,
                   0, wt);
}

static tri_status sim_rope(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                           const tri__rope *rope) {
    (void)x, (void)pos;
    double e = (double)m * (double)n_heads * (double)rope->head_dim;
    return op_time(be, "rope", 6.0 * e, 8.0 * e, false, 0, TRI_DTYPE_F32);
}

static tri_status sim_swiglu(tri__backend *be, float *out, const float *gate, const float *up, int64_t n) {
    (void)out, (void)gate, (void)up;
    return op_time(be, "swiglu", 6.0 * (double)n, 12.0 * (double)n, false, 0, TRI_DTYPE_F32);
}

static tri_status sim_add(tri__backend *be, float *out, const float *a, const float *b, int64_t n) {
    (void)out, (void)a, (void)b;
    return op_time(be, "add", (double)n, 12.0 * (double)n, false, 0, TRI_DTYPE_F32);
}

static tri_status sim_softmax(tri__backend *be, float *x, int64_t m, int64_t n, float temperature) {
    (void)x;
    if (!(temperature > 0)) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "softmax: temperature %g", (double)temperature);
    return op_time(be, "softmax", 4.0 * (double)m * (double)n, 8.0 * (double)m * (double)n, false, 0, TRI_DTYPE_F32);
}

static tri_status sim_top_k(tri__backend *be, float *values, int32_t *indices, const float *x, int64_t m, int64_t n,
                            int64_t k) {
    (void)values, (void)indices, (void)x;
    if (k < 1 || k > n) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "top_k: k %lld outside [1, %lld]", (long long)k,
                                         (long long)n);
    return op_time(be, "top_k", (double)m * (double)n, 4.0 * (double)m * (double)n + 8.0 * (double)m * (double)k,
                   false, 0, TRI_DTYPE_F32);
}

// Keys of every head are read once per call (the kernel tiles queries of a group over them); each
// query does a dot product and an accumulation per visible key and head. A token tree's mask
// (kv->tree) hides some of the tree's own rows from some queries but reads no fewer bytes, and the
// products it saves are at most the tree's own m x m beside the context's m x n, so a tree pass of
// m rows is timed as any pass of m rows over the same view (TRI_BACKEND_CAP_TREES below).
static tri_status sim_attention(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                int64_t n_head, int64_t head_dim, const tri__kv_view *kv, float *weight_sums) {
    (void)out, (void)q, (void)q_pos, (void)weight_sums;
    if (kv->n_head_kv <= 0 || n_head % kv->n_head_kv != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "attention: %lld heads over %d KV heads", (long long)n_head,
                         kv->n_head_kv);
    double keys = 0;
    for (int32_t h = 0; h < kv->n_head_kv; h++)
        for (int32_t i = kv->head_span[h]; i < kv->head_span[h + 1]; i++) keys += kv->spans[i].n;
    // bytes per value of the cache's type, a quantized type's scales included
    double esz = (double)tri__dtype_row_bytes(kv->type, TRI_QK) / TRI_QK;
    double group = (double)(n_head / kv->n_head_kv);
    double flops = 4.0 * (double)m * group * keys * (double)head_dim;
    double rows = 2.0 * keys * (double)head_dim * esz;
    double bytes = rows + 8.0 * (double)m * (double)n_head * (double)head_dim;
    return op_time_rate(be, "attention", flops, bytes, false, rows, 0);
}

static tri_status sim_gather(tri__backend *be, void *dst, const void *src, const int64_t *offsets, int64_t n,
                             int64_t row_bytes) {
    (void)dst, (void)src, (void)offsets;
    return op_time(be, "gather", 0, 2.0 * (double)n * (double)row_bytes, false, 0, TRI_DTYPE_F32);
}

static tri_status sim_chunk_mean(tri__backend *be, float *out, const void *x, tri_dtype type, int64_t n_chunks,
                                 int64_t chunk, int64_t width, int64_t stride) {
    (void)out, (void)x, (void)stride;
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32 && type != TRI_DTYPE_Q8_0 && type != TRI_DTYPE_Q4_0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk_mean: type %s", tri_dtype_name(type));
    double e = (double)n_chunks * (double)chunk * (double)width;
    double esz = (double)tri__dtype_row_bytes(type, TRI_QK) / TRI_QK;  // bytes per element (blocks: 34 or 18 per 32)
    return op_time(be, "chunk_mean", e, e * esz + 4.0 * (double)n_chunks * width, false, 0, type);
}

// ---- the transfer stream ----

static tri_status sim_event_create(tri__backend *be, tri__event **out) {
    (void)be;
    *out = calloc(1, sizeof **out);
    return *out ? TRI_STATUS_OK : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sim backend: event");
}

static void sim_event_destroy(tri__backend *be, tri__event *ev) {
    (void)be;
    free(ev);
}

static tri_status sim_event_record(tri__backend *be, tri__event *ev, tri__stream stream) {
    sim *s = S(be);
    s->host += s->p.launch_us * 1e-6;
    // an event marks the end of what the queue holds; a queue that is idle reaches it at once
    double t = s->tail[stream];
    ev->t = t > s->host ? t : s->host;
    return TRI_STATUS_OK;
}

static tri_status sim_stream_wait(tri__backend *be, tri__stream stream, tri__event *ev) {
    sim *s = S(be);
    s->host += s->p.launch_us * 1e-6;
    s->st.n_waits++;
    if (ev->t > s->tail[stream]) s->tail[stream] = ev->t;
    return TRI_STATUS_OK;
}

static tri_status sim_transfer_to_backend(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src;
    return copy_time(be, TRI_SIM_QUEUE_TRANSFER, TRI_SIM_KIND_H2D, bytes);
}

static tri_status sim_transfer_to_host(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src;  // offloaded rows: the host regions are never materialised
    return copy_time(be, TRI_SIM_QUEUE_TRANSFER, TRI_SIM_KIND_D2H, bytes);
}

static tri_status sim_host_register(tri__backend *be, void *ptr, size_t bytes) {
    (void)be, (void)ptr, (void)bytes;
    return TRI_STATUS_OK;
}

static void sim_host_unregister(tri__backend *be, void *ptr) { (void)be, (void)ptr; }

static tri_status sim_event_synchronize(tri__backend *be, tri__event *ev) {
    sim *s = S(be);
    if (ev->t > s->host) s->host = ev->t;
    return TRI_STATUS_OK;
}

static void sim_host_work(tri__backend *be, int kind, double bytes) {
    sim *s = S(be);
    double rate = kind == TRI_HOST_WORK_COPY ? s->p.host_copy_gbps : s->p.host_reduce_gbps;
    double t = rate > 0 ? bytes / (rate * 1e9) : 0;
    s->host += t;
    s->st.host_work += t;
    s->st.host_work_bytes += bytes;
}

static void sim_destroy(tri__backend *be) {
    sim *s = S(be);
    if (s) {
        free(s->blocks);
        free(s->busy[0].t);
        free(s->busy[1].t);
        free(s->trace);
        free(s);
    }
    free(be);
}

static const tri__backend_ops sim_ops = {
    .name = "sim",
    .destroy = sim_destroy,
    .alloc = sim_alloc,
    .free = sim_free,
    .copy_to_backend = sim_copy_to_backend,
    .copy_to_host = sim_copy_to_host,
    .copy = sim_copy,
    .synchronize = sim_synchronize,
    .matmul = sim_matmul,
    .get_rows = sim_get_rows,
    .convert = sim_convert,
    .rmsnorm = sim_rmsnorm,
    .rope = sim_rope,
    .swiglu = sim_swiglu,
    .add = sim_add,
    .softmax = sim_softmax,
    .top_k = sim_top_k,
    .attention = sim_attention,
    .caps = TRI_BACKEND_CAP_TREES | TRI_BACKEND_CAP_QUANT_KV,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait = sim_stream_wait,
    .transfer_to_backend = sim_transfer_to_backend,
    .transfer_to_host = sim_transfer_to_host,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .event_synchronize = sim_event_synchronize,
    .gather = sim_gather,
    .chunk_mean = sim_chunk_mean,
    .host_work = sim_host_work,
};

tri_status tri__backend_sim_create(const tri__sim_profile *p, tri__backend **out) {
    *out = NULL;
    if (!p || !(p->matmul_tflops > 0) || !(p->vector_tflops > 0) || !(p->mem_gbps > 0) || !(p->h2d_gbps > 0) ||
        !(p->d2h_gbps > 0) || p->launch_us < 0 || p->kernel_us < 0 || p->mem_bytes == 0 ||
        !(p->host_copy_gbps >= 0) || !(p->host_reduce_gbps >= 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sim backend: profile '%s' needs positive rates and memory",
                         p && p->name ? p->name : "(null)");
    tri__backend *be = calloc(1, sizeof *be);
    sim *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sim backend");
    }
    s->p = *p;
    s->next = FAKE_BASE;
    be->ops = &sim_ops;
    be->n_threads = 1;
    be->host_memory = false;
    be->simulated = true;
    be->priv = s;
    *out = be;
    return TRI_STATUS_OK;
}

bool tri__backend_is_sim(const tri__backend *be) { return be && be->ops == &sim_ops; }

// ---- reading the timeline ----

// Seconds during which both lists are busy (both sorted, disjoint within each).
static double overlap(const busy *a, const busy *b) {
    double sum = 0;
    int64_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        double s0 = a->t[2 * i], e0 = a->t[2 * i + 1], s1 = b->t[2 * j], e1 = b->t[2 * j + 1];
        double lo = s0 > s1 ? s0 : s1, hi = e0 < e1 ? e0 : e1;
        if (hi > lo) sum += hi - lo;
        if (e0 < e1) i++;
        else j++;
    }
    return sum;
}

void tri__sim_stats_get(tri__backend *be, tri__sim_stats *out) {
    TRI_ASSERT(tri__backend_is_sim(be));
    sim *s = S(be);
    *out = s->st;
    double end = s->host;
    for (int q = 0; q < 2; q++)
        if (s->tail[q] > end) end = s->tail[q];
    out->host = s->host - s->t0;
    out->end = end - s->t0;
    out->transfer_hidden = overlap(&s->busy[0], &s->busy[1]);
}

void tri__sim_reset(tri__backend *be) {
    TRI_ASSERT(tri__backend_is_sim(be));
    sim *s = S(be);
    (void)sim_synchronize(be);
    s->tail[0] = s->tail[1] = s->t0 = s->host;
    uint64_t used = s->st.mem_used, peak = s->st.mem_peak;
    memset(&s->st, 0, sizeof s->st);
    s->st.mem_used = used;
    s->st.mem_peak = peak;
    s->busy[0].n = s->busy[1].n = 0;
    s->n_trace = 0;
}

void tri__sim_trace(tri__backend *be, bool on) {
    TRI_ASSERT(tri__backend_is_sim(be));
    S(be)->tracing = on;
    S(be)->n_trace = 0;
}

const tri__sim_item *tri__sim_trace_items(tri__backend *be, int64_t *n) {
    TRI_ASSERT(tri__backend_is_sim(be));
    *n = S(be)->n_trace;
    return S(be)->trace;
}
