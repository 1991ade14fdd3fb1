// backend-select.c - the backend a session asks for, and a model's weights in its memory.
#include "backend-select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-backend.h"
#include "error.h"
#include "model.h"

// Device copies of tensors start at this alignment (cuBLAS and 16-byte vector loads want 16;
// 256 is what cudaMalloc itself guarantees).
#define WEIGHT_ALIGN 256

tri_status tri__backend_select(tri_device_kind kind, int32_t device, int32_t n_threads,
                               tri__backend **out, char *name_out) {
    *out = NULL;
    switch (kind) {
    case TRI_DEVICE_AUTO:
        if (tri__cuda_device_count() <= 0) break;  // no GPU: the CPU
        kind = TRI_DEVICE_CUDA;
        device = 0;
        break;
    case TRI_DEVICE_CPU: break;
    case TRI_DEVICE_CUDA: {
        int n = tri__cuda_device_count();
        if (device < 0 || device >= n)
            return tri__fail(TRI_STATUS_DEVICE, "device cuda:%d: %s", device,
                             n == 0 ? "no CUDA device (or no CUDA support in this build)"
                                    : "no such device");
        break;
    }
    default: return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device kind %d unknown", (int)kind);
    }
    tri_status st;
    if (kind == TRI_DEVICE_CUDA) {
        if ((st = tri__backend_cuda_create(device, out))) return st;
        if (name_out) snprintf(name_out, 16, "cuda:%d", (int)device);
    } else {
        if ((st = tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_AUTO, out))) return st;
        if (name_out) snprintf(name_out, 16, "cpu");
    }
    return TRI_STATUS_OK;
}

// ---- weights on a backend ----

// The view and what it owns besides the tables: the device copy of the weights.
typedef struct backend_view {
    tri_model m;        // first: a tri_model * to the view is a backend_view *
    tri__backend *be;   // not owned
    void *weights;      // one allocation of backend memory holding every uploaded tensor, or NULL
} backend_view;

void tri__model_backend_free(tri_model *view) {
    if (!view) return;
    backend_view *bv = (backend_view *)view;
    if (bv->weights) bv->be->ops->free(bv->be, bv->weights);
    free(view->tensors);
    free(view->layers);
    free(bv);
}

// The tensor of the view that stands where t stands in the model's table.
static const tri__tensor *remap(const tri_model *model, tri_model *view, const tri__tensor *t) {
    return t ? &view->tensors[t - model->tensors] : NULL;
}

tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, tri_model **out) {
    *out = NULL;
    const int32_t n_layer = model->config.n_layer;
    backend_view *bv = calloc(1, sizeof *bv);
    tri__tensor *tensors = calloc((size_t)(model->n_tensors > 0 ? model->n_tensors : 1), sizeof *tensors);
    tri__layer *layers = calloc((size_t)(n_layer > 0 ? n_layer : 1), sizeof *layers);
    bool *used = calloc((size_t)(model->n_tensors > 0 ? model->n_tensors : 1), sizeof *used);
    tri_status st = TRI_STATUS_OK;
    if (!bv || !tensors || !layers || !used) {
        free(bv);
        free(tensors);
        free(layers);
        free(used);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: model view", model->path);
    }
    tri_model *v = &bv->m;
    *v = *model;  // config, names, tokenizer and sources are borrowed
    bv->be = be;
    memcpy(tensors, model->tensors, (size_t)model->n_tensors * sizeof *tensors);
    v->tensors = tensors;
    v->layers = layers;
    v->tok_embd = remap(model, v, model->tok_embd);
    v->output_norm = remap(model, v, model->output_norm);
    v->output = remap(model, v, model->output);  // tied: the same entry as tok_embd
    v->rope_freqs = remap(model, v, model->rope_freqs);
    for (int32_t il = 0; il < n_layer; il++) {
        const tri__layer *a = &model->layers[il];
        tri__layer *b = &layers[il];
        b->attn_norm = remap(model, v, a->attn_norm);
        b->wq = remap(model, v, a->wq);
        b->wk = remap(model, v, a->wk);
        b->wv = remap(model, v, a->wv);
        b->wo = remap(model, v, a->wo);
        b->ffn_norm = remap(model, v, a->ffn_norm);
        b->w_gate = remap(model, v, a->w_gate);
        b->w_up = remap(model, v, a->w_up);
        b->w_down = remap(model, v, a->w_down);
    }
    if (be->host_memory) goto done;  // the mapping is backend memory already

    // Mark what the forward pass reads (each entry once: a tied head is the embedding table).
    const tri__tensor *read[3] = {model->tok_embd, model->output_norm, model->output};
    for (int i = 0; i < 3; i++) used[read[i] - model->tensors] = true;
    for (int32_t il = 0; il < n_layer; il++) {
        const tri__layer *a = &model->layers[il];
        const tri__tensor *w[] = {a->attn_norm, a->wq, a->wk, a->wv, a->wo,
                                  a->ffn_norm, a->w_gate, a->w_up, a->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) used[w[i] - model->tensors] = true;
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < model->n_tensors; i++)
        if (used[i]) total += (model->tensors[i].n_bytes + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
    tri__log(TRI_LOG_LEVEL_INFO, "%s: copying %.1f MiB of weights to the %s backend", model->path,
             (double)total / (1 << 20), be->ops->name);
    if ((st = be->ops->alloc(be, (size_t)total, &bv->weights))) {
        char why[256];
        snprintf(why, sizeof why, "%s", tri_last_error());  // tri__fail rewrites that buffer
        st = tri__fail(st, "%s: %.1f MiB of weights do not fit the %s backend's memory (%s)", model->path,
                       (double)total / (1 << 20), be->ops->name, why);
        goto done;
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < model->n_tensors; i++) {
        if (&model->tensors[i] == model->rope_freqs) continue;  // read on the host
        if (!used[i]) {
            tensors[i].data = NULL;  // not read by the forward pass: nothing to point at
            continue;
        }
        void *dst = (char *)bv->weights + off;
        if ((st = be->ops->copy_to_backend(be, dst, model->tensors[i].data, (size_t)model->tensors[i].n_bytes)))
            goto done;
        tensors[i].data = dst;
        off += (model->tensors[i].n_bytes + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
    }
    // the sources are the caller's mapping: the copies must have left it before we return
    st = be->ops->synchronize(be);

done:
    free(used);
    if (st) {
        tri__model_backend_free(v);
        return st;
    }
    *out = v;
    return TRI_STATUS_OK;
}
