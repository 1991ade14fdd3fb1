// bench-model.h - what the benchmarks that time whole forward passes share: model shapes, a KV
// store filled with synthetic rows, and the time and bytes of passes over it (internal APIs).
#ifndef TRI_BENCH_MODEL_H
#define TRI_BENCH_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend-select.h"
#include "bench-util.h"
#include "dtype.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "llama.h"
#include "model.h"
#include "weights.h"

// The shape of a model by name: llama2-7b (Llama2-7B-128K: rope scaling does not change the
// work), llama-68m (JackFram/llama-68m, TriForce's draft), tiny (for trying things out). false
// for another name.
static inline bool bench_shape(const char *name, tri_model_config *out) {
    tri_model_config c = {0};
    if (!strcmp(name, "llama2-7b"))
        c = (tri_model_config){.n_vocab = 32000, .n_embd = 4096, .n_ff = 11008, .n_layer = 32, .n_head = 32,
                               .n_head_kv = 32, .head_dim = 128, .n_ctx_train = 131072};
    else if (!strcmp(name, "llama-68m"))
        c = (tri_model_config){.n_vocab = 32000, .n_embd = 768, .n_ff = 3072, .n_layer = 2, .n_head = 12,
                               .n_head_kv = 12, .head_dim = 64, .n_ctx_train = 2048};
    else if (!strcmp(name, "tiny"))
        c = (tri_model_config){.n_vocab = 512, .n_embd = 128, .n_ff = 352, .n_layer = 6, .n_head = 4,
                               .n_head_kv = 4, .head_dim = 32, .n_ctx_train = 131072};
    else
        return false;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_factor = 1.0f;
    *out = c;
    return true;
}

// Opens the backend --device names: "cpu", "cuda", "cuda:N", or NULL for the default (the first
// GPU when there is one). *dev receives the CUDA device index, name "cpu" or "cuda:N".
static inline tri_status bench_open_backend(const char *device, tri__backend **be, char name[16], int32_t *dev) {
    tri_device_kind kind = TRI_DEVICE_AUTO;
    *dev = 0;
    if (device && !strcmp(device, "cpu")) {
        kind = TRI_DEVICE_CPU;
    } else if (device && !strncmp(device, "cuda", 4)) {
        kind = TRI_DEVICE_CUDA;
        *dev = device[4] == ':' ? atoi(device + 5) : 0;
    }
    return tri__backend_select(kind, *dev, 0, be, name);
}

// A store over model with capacity positions and on_chip layers in backend memory, filled with
// synthetic rows up to n (F16).
static inline tri_status bench_filled_store(tri__kv_store *kv, tri__backend *be, const tri_model_config *c, int32_t capacity,
                               int32_t on_chip, int32_t n) {
    tri_status st = tri__kv_store_init_offload(kv, be, TRI_DTYPE_F16, c->n_layer, c->n_head_kv, c->head_dim,
                                               capacity, on_chip);
    if (st) return st;
    enum { ROWS = 1024 };
    int64_t width = (int64_t)c->n_head_kv * c->head_dim;
    uint16_t *k = malloc(sizeof *k * ROWS * (size_t)width), *v = malloc(sizeof *v * ROWS * (size_t)width);
    if (!k || !v) {
        free(k);
        free(v);
        return TRI_STATUS_OUT_OF_MEMORY;
    }
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < ROWS * width; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        k[i] = tri__f32_to_f16((float)((s >> 40) & 0xffff) / 32768.0f - 1.0f);
        v[i] = tri__f32_to_f16((float)((s >> 20) & 0xffff) / 32768.0f - 1.0f);
    }
    for (int32_t il = 0; !st && il < c->n_layer; il++)
        for (int32_t p = 0; !st && p < n; p += ROWS)
            st = tri__kv_store_load_rows(kv, il, p, n - p < ROWS ? n - p : ROWS, k, v);
    free(k);
    free(v);
    if (!st) st = tri__kv_store_set_len(kv, n);
    return st;
}

typedef struct pass_time {
    double seconds;        // mean over the timed passes
    double kv_bytes_up;    // per pass
    double weight_bytes_up;
} pass_time;

// Times passes of m tokens after the store's n positions (rolled back after each), one warm-up first.
static inline tri_status bench_time_pass(const tri_model *model, tri__backend *be, tri__kv_store *kv, int32_t m, int32_t passes,
                            pass_time *out) {
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
    double t = 0;
    for (int32_t rep = 0; !st && rep <= passes; rep++) {
        if (rep == 1) {  // the warm-up is not counted
            tri__kv_store_offload_stats(kv, &k0);
            tri__model_stream_stats(model, &w0);
        }
        double t0 = bench_now();
        st = tri__llama_forward_policy(&ll, &pol, tok, m, m > 1 ? TRI_LOGITS_ALL : TRI_LOGITS_LAST, logits);
        if (rep > 0) t += bench_now() - t0;
        if (!st) st = tri__kv_policy_truncate(&pol, n0);
    }
    if (!st) {
        tri__kv_store_offload_stats(kv, &k1);
        tri__model_stream_stats(model, &w1);
        out->seconds = t / passes;
        out->kv_bytes_up = (double)(k1.bytes_up - k0.bytes_up) / passes;
        out->weight_bytes_up = (double)(w1.bytes_up - w0.bytes_up) / passes;
    }
    free(tok);
    free(logits);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
    return st;
}

#endif  // TRI_BENCH_MODEL_H
