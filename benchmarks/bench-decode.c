// bench-decode.c - decode speed of a whole model on one backend against its memory bandwidth,
// and attention time at long contexts.
//
// usage: bench-decode [--device cpu|cuda[:N]] [--shapes llama2-7b,llama-68m] [--ctx 1024]
//                     [--attn 4096,32768,131072] [--passes N] [--weights f16|q8_0|q4_0]
//                     [--draft llama-68m|tiny|none] [--draft-fill N] [--draft-steps N]
//
// Weights are synthetic (tri__model_synthetic) in each shape, all resident in the backend's
// memory; the KV cache holds --ctx synthetic rows (f16). For each shape: one-token decode passes,
// tokens/s, and the bandwidth they achieve (every weight byte read once plus the KV rows read,
// per pass) against the backend's own copy peak (a device-to-device copy on a GPU, counted as
// read + write bytes; a stream-like copy on the CPU). Then the attention op alone, one layer of
// the first shape, one query over 4K, 32K and 128K keys: time and GB/s of the K/V it reads. Last,
// the draft's step (--draft llama-68m): one-token decode over a StreamingLLM cache of TriForce's
// draft window (16 sinks + 240, evicting every 64, past 1,000 tokens), issued op by op
// (tri__llama_forward_policy) and as the step computed from device memory (tri__llama_step), issued
// op by op and, on a backend that records graphs, recorded once and replayed: ms/token against the
// time its weights take to read at the copy peak.
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-model.h"
#include "bench-util.h"
#include "kv-policy.h"
#include "model-synthetic.h"

#define MAX_LIST 8

// Copy peak of be's memory: bytes read + written per second of a 512 MiB backend-to-backend copy.
static double copy_peak(tri__backend *be) {
    if (be->host_memory) return bench_copy_peak(be->n_threads);
    const size_t bytes = (size_t)512 << 20;
    void *a = NULL, *b = NULL;
    double best = 0;
    if (!be->ops->copy || be->ops->alloc(be, bytes, &a) || be->ops->alloc(be, bytes, &b)) goto done;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_now();
        if (be->ops->copy(be, b, a, bytes) || be->ops->synchronize(be)) break;
        double bw = 2.0 * (double)bytes / (bench_now() - t0);
        if (bw > best) best = bw;
    }
done:
    be->ops->free(be, a);
    be->ops->free(be, b);
    return best;
}

// ms/token of the draft step over StreamingLLM in shape c: op by op, from device memory op by op,
// and recorded (NAN where the backend has no graphs); every way gives the same greedy tokens.
// The cache is filled with n_fill tokens first (1,000 by default; at least the window and one
// eviction interval, so that the ring has wrapped), then steps tokens are timed each way (16 per
// pass by default; the emulated dry run of gpu-check takes 320 and 4).
static tri_status draft_step_times(const tri_model_config *c, tri_dtype wtype, tri__backend *be, int32_t steps,
                                   int32_t n_fill, double ms[3], double *weight_bytes) {
    enum { WINDOW = 256, SINK = 16, EVERY = 64 };
    tri_model *m = NULL, *v = NULL;
    tri__llama ll = {0};
    tri__kv_policy pol = {0};
    tri__llama_step step[2] = {{0}};
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab * 3);
    int32_t *fill = malloc(sizeof(int32_t) * n_fill);
    tri_status st = logits && fill ? TRI_STATUS_OK : TRI_STATUS_OUT_OF_MEMORY;
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 1 << 20);
    pp.budget = WINDOW;
    pp.sink = SINK;
    pp.evict_every = EVERY;
    if (!st) st = tri__model_synthetic(c, wtype, 1, &m);
    if (!st) st = tri__model_on_backend(m, be, 0, 0, &v);
    if (!st) st = tri__llama_init(&ll, v, be, EVERY);
    if (!st) st = tri__kv_policy_init(&pol, &pp, be, TRI_DTYPE_F16, c->n_layer, c->n_head, c->n_head_kv, c->head_dim,
                                      1 << 20, EVERY);
    for (int32_t i = 0; !st && i < n_fill; i++) fill[i] = (7 * i + 3) % c->n_vocab;
    if (!st) st = tri__llama_forward_policy(&ll, &pol, fill, n_fill, TRI_LOGITS_LAST, logits);
    if (!st) {
        tri_plan_model pm;
        tri_plan_model_from_model(m, &pm);
        *weight_bytes = (double)pm.layer_bytes * c->n_layer + (double)pm.other_bytes;
    }
    bool graphs = be->ops->graph_begin != NULL;
    for (int way = 0; way < 3 && !st; way++) {
        ms[way] = NAN;
        if (way > 0 && !tri__llama_step_supported(&ll, &pol)) continue;
        if (way == 2 && !graphs) continue;
        if (way > 0 && (st = tri__llama_step_init(&step[way - 1], &ll, &pol, way == 2))) break;
        int32_t tok = 5;
        double t = 0;
        for (int32_t rep = 0; !st && rep <= steps; rep++) {
            double t0 = bench_now();
            st = way == 0 ? tri__llama_forward_policy(&ll, &pol, &tok, 1, TRI_LOGITS_LAST, logits)
                          : tri__llama_step_run(&step[way - 1], tok, logits);
            if (rep > 0) t += bench_now() - t0;  // the first records the graph, and warms up
            tok = (tok * 31 + 7) % c->n_vocab;
        }
        if (!st) ms[way] = 1e3 * t / steps;
    }
    for (int i = 0; i < 2; i++) tri__llama_step_free(&step[i]);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
    tri__model_backend_free(v);
    tri__model_synthetic_free(m);
    free(logits);
    free(fill);
    return st;
}

static int parse_ints(const char *s, int32_t *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > INT32_MAX || (*end && *end != ',')) return -1;
        out[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *device = NULL, *shapes = "llama2-7b,llama-68m", *draft = "llama-68m";
    int32_t ctx = 1024, passes = 5, attn[MAX_LIST] = {4096, 32768, 131072}, n_attn = 3, draft_fill = 1000;
    int32_t draft_steps = 0;
    tri_dtype wtype = TRI_DTYPE_F16;
    setvbuf(stdout, NULL, _IOLBF, 0);  // each table line as it comes: a run killed midway keeps what it printed
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (ok && !strcmp(a, "--device")) device = v;
        else if (ok && !strcmp(a, "--shapes")) shapes = v;
        else if (ok && !strcmp(a, "--draft")) draft = v;
        else if (ok && !strcmp(a, "--ctx")) ok = (ctx = atoi(v)) > 0;
        else if (ok && !strcmp(a, "--passes")) ok = (passes = atoi(v)) > 0;
        else if (ok && !strcmp(a, "--draft-fill"))
            ok = (draft_fill = atoi(v)) >= 320;
        else if (ok && !strcmp(a, "--draft-steps"))
            ok = (draft_steps = atoi(v)) > 0;
        else if (ok && !strcmp(a, "--attn")) ok = (n_attn = parse_ints(v, attn)) > 0;
        else if (ok && !strcmp(a, "--weights")) {
            wtype = !strcmp(v, "q8_0") ? TRI_DTYPE_Q8_0 : !strcmp(v, "q4_0") ? TRI_DTYPE_Q4_0 : TRI_DTYPE_F16;
            ok = wtype != TRI_DTYPE_F16 || !strcmp(v, "f16");
        } else ok = false;
        if (!ok) {
            fprintf(stderr,
                    "usage: bench-decode [--device cpu|cuda[:N]] [--shapes llama2-7b,llama-68m] [--ctx 1024]\n"
                    "                    [--attn 4096,32768,131072] [--passes N] [--weights f16|q8_0|q4_0]\n"
                    "                    [--draft llama-68m|tiny|none] [--draft-fill N >= 320]\n"
                    "                    [--draft-steps N]\n");
            return 2;
        }
        i++;
    }
    tri__backend *be;
    char name[16];
    int32_t dev;
    if (bench_open_backend(device, &be, name, &dev)) {
        fprintf(stderr, "bench-decode: %s\n", tri_last_error());
        return 1;
    }
    bench_print_machine();
    tri_device_info di;
    if (!strncmp(name, "cuda", 4) && tri_device_get_info(dev, &di) == TRI_STATUS_OK)
        printf("device: %s (%s, %.1f GiB)\n", name, di.name, (double)di.total_bytes / (1 << 30));
    else
        printf("device: %s, %d threads\n", name, be->n_threads);
    double peak = copy_peak(be);
    printf("copy peak: %.1f GB/s (read + write)\n\n", peak / 1e9);
    printf("| shape | weights | context | ms/token | tokens/s | GB read/token | GB/s | of peak |\n");
    printf("|---|---|---|---|---|---|---|---|\n");

    int rc = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", shapes);
    tri_model_config first = {0};
    char first_name[32] = "";
    for (char *sv = NULL, *s = strtok_r(list, ",", &sv); s && !rc; s = strtok_r(NULL, ",", &sv)) {
        tri_model_config c;
        if (!bench_shape(s, &c)) {
            fprintf(stderr, "bench-decode: unknown shape '%s' (llama2-7b, llama-68m, tiny)\n", s);
            rc = 2;
            break;
        }
        if (!first.n_layer) {
            first = c;
            snprintf(first_name, sizeof first_name, "%s", s);
        }
        tri_model *m = NULL, *v = NULL;
        tri__kv_store kv = {0};
        pass_time pt;
        tri_status st = tri__model_synthetic(&c, wtype, 1, &m);
        if (!st) st = tri__model_on_backend(m, be, 0, 0, &v);
        if (!st) st = bench_filled_store(&kv, be, &c, ctx + 1, c.n_layer, ctx);
        if (!st) st = bench_time_pass(v, be, &kv, 1, passes, &pt);
        if (st) {
            fprintf(stderr, "bench-decode: %s: %s\n", s, tri_last_error());
            rc = 1;
        } else {
            tri_plan_model pm;
            tri_plan_model_from_model(m, &pm);
            double bytes = (double)pm.layer_bytes * c.n_layer + (double)pm.other_bytes +
                           2.0 * (double)tri__kv_store_row_bytes(&kv) * ctx * c.n_layer;
            double gbs = bytes / pt.seconds;
            printf("| %s | %s | %d | %.2f | %.1f | %.3f | %.1f | %.0f%% |\n", s, tri_dtype_name(wtype), ctx,
                   1e3 * pt.seconds, 1.0 / pt.seconds, bytes / 1e9, gbs / 1e9, peak > 0 ? 100.0 * gbs / peak : 0.0);
        }
        tri__kv_store_free(&kv);
        tri__model_backend_free(v);
        tri__model_synthetic_free(m);
    }

    // the attention op alone: one layer of the first shape, one query at the end of the context
    if (!rc && first.n_layer) {
        printf("\n| shape | keys | attention ms | K/V GB/s | of peak |\n|---|---|---|---|---|\n");
        tri_model_config one = first;
        one.n_layer = 1;
        const int64_t qd = (int64_t)one.n_head * one.head_dim;
        float *q = NULL, *out = NULL;
        float *hq = malloc(sizeof(float) * (size_t)qd);
        if (!hq || be->ops->alloc(be, sizeof(float) * (size_t)qd, (void **)&q) ||
            be->ops->alloc(be, sizeof(float) * (size_t)qd, (void **)&out))
            rc = 1;
        for (int64_t i = 0; !rc && i < qd; i++) hq[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
        if (!rc && (be->ops->copy_to_backend(be, q, hq, sizeof(float) * (size_t)qd) || be->ops->synchronize(be))) rc = 1;
        for (int ai = 0; !rc && ai < n_attn; ai++) {
            tri__kv_store kv = {0};
            if (bench_filled_store(&kv, be, &one, attn[ai], 1, attn[ai])) {
                fprintf(stderr, "bench-decode: attention at %d keys: %s\n", attn[ai], tri_last_error());
                rc = 1;
                break;
            }
            tri__kv_view view;
            const tri__kv_view *vw = tri__kv_store_view(&kv, 0, attn[ai], &view);
            int32_t qpos = attn[ai] - 1;
            double t = 0;
            for (int rep = 0; !rc && rep <= passes; rep++) {
                double t0 = bench_now();
                if (be->ops->attention(be, out, q, &qpos, 1, one.n_head, one.head_dim, vw, NULL) ||
                    be->ops->synchronize(be))
                    rc = 1;
                if (rep > 0) t += bench_now() - t0;  // the first is a warm-up
            }
            if (!rc) {
                t /= passes;
                double bytes = 2.0 * (double)tri__kv_store_row_bytes(&kv) * attn[ai];
                printf("| %s | %d | %.3f | %.1f | %.0f%% |\n", first_name, attn[ai], 1e3 * t, bytes / t / 1e9,
                       peak > 0 ? 100.0 * bytes / t / peak : 0.0);
            }
            tri__kv_store_free(&kv);
        }
        be->ops->free(be, q);
        be->ops->free(be, out);
        free(hq);
    }
    // the draft's step over StreamingLLM: op by op, from device memory, recorded and replayed
    tri_model_config dc;
    if (!rc && strcmp(draft, "none") != 0) {
        double ms[3], wbytes = 0;
        if (!bench_shape(draft, &dc)) {
            fprintf(stderr, "bench-decode: unknown draft shape '%s'\n", draft);
            rc = 2;
        } else if (draft_step_times(&dc, wtype, be, draft_steps ? draft_steps : 16 * passes, draft_fill, ms, &wbytes)) {
            fprintf(stderr, "bench-decode: draft step: %s\n", tri_last_error());
            rc = 1;
        } else {
            printf("\n| draft | window | op by op ms/token | from device memory | recorded graph | weights at peak ms |\n"
                   "|---|---|---|---|---|---|\n");
            char cell[2][32];
            for (int i = 0; i < 2; i++) {
                if (ms[i + 1] == ms[i + 1]) snprintf(cell[i], sizeof cell[i], "%.3f", ms[i + 1]);
                else snprintf(cell[i], sizeof cell[i], "-");
            }
            printf("| %s | 16 + 240 | %.3f | %s | %s | %.3f |\n", draft, ms[0], cell[0], cell[1],
                   peak > 0 ? 1e3 * wbytes / peak : 0.0);
        }
    }
    tri__backend_free(be);
    return rc;
}
