// backend-select.c - the backend a session asks for, and a model's weights in its memory.
#include "backend-select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "cuda-backend.h"
#include "error.h"
#include "model.h"

// Device copies of tensors start at this alignment (cuBLAS and 16-byte vector loads want 16;
// 256 is what cudaMalloc itself guarantees).
#define WEIGHT_ALIGN 256

#define TRY(call)                              \
    do {                                       \
        tri_status st_ = (call);               \
        if (st_ != TRI_STATUS_OK) return st_;  \
    } while (0)

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

static uint64_t aligned(uint64_t n) { return (n + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN; }

// A block's nine tensors in the order they are packed for streaming.
#define BLOCK_TENSORS 9
static void block_tensors(const tri__layer *L, const tri__tensor *out[BLOCK_TENSORS]) {
    const tri__tensor *t[BLOCK_TENSORS] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo,
                                           L->ffn_norm, L->w_gate, L->w_up, L->w_down};
    memcpy(out, t, sizeof t);
}

// Layers first .. n_layer - 1 streamed through two device buffers.
struct tri__weight_stream {
    tri__backend *be;         // not owned
    int32_t first, n_layer;
    tri__arena *arena;        // owns the packed host blocks
    void **host;              // (n_layer) packed block of a streamed layer, host; NULL below first
    uint64_t *bytes;          // (n_layer) its size
    void *buf[2];             // (largest block) backend: streamed layer j runs from buf[j % 2]
    int32_t slot_layer[2];    // layer whose block a buffer holds or is receiving, -1: none
    bool async;               // the backend has a transfer stream: the events are used
    tri__event *loaded[2];    // TRANSFER: the last upload into the buffer is done
    tri__event *released[2];  // COMPUTE: the work queued so far that reads the buffer is done
    tri__weight_stream_stats stats;
};

static void stream_free(tri__weight_stream *ws) {
    if (!ws) return;
    const tri__backend_ops *op = ws->be->ops;
    if (ws->async) (void)op->synchronize(ws->be);  // no upload may still read what is released
    for (int i = 0; i < 2; i++) {
        op->free(ws->be, ws->buf[i]);
        if (ws->async) {
            op->event_destroy(ws->be, ws->loaded[i]);
            op->event_destroy(ws->be, ws->released[i]);
        }
    }
    tri__arena_free(ws->arena);
    free(ws->host);
    free(ws->bytes);
    free(ws);
}

static tri_status pin_region(void *ptr, size_t bytes, void *user) {
    tri__backend *be = user;
    return be->ops->host_register(be, ptr, bytes);
}

static void unpin_region(void *ptr, size_t bytes, void *user) {
    (void)bytes;
    tri__backend *be = user;
    be->ops->host_unregister(be, ptr);
}

void tri__arena_params_pin_for(tri__arena_params *ap, tri__backend *be) {
    if (!be->ops->host_register || !be->ops->host_unregister) return;
    ap->pin = pin_region;
    ap->unpin = unpin_region;
    ap->pin_user = be;
}

// Packs layers first .. n_layer - 1 of model into host regions and points the view's block
// tensors of those layers at the two device buffers.
static tri_status stream_init(const tri_model *model, tri_model *v, tri__backend *be, int32_t first,
                              tri__weight_stream **out) {
    const tri__backend_ops *op = be->ops;
    const int32_t n_layer = model->config.n_layer;
    tri__weight_stream *ws = calloc(1, sizeof *ws);
    if (!ws) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: weight stream", model->path);
    *out = ws;
    ws->be = be;
    ws->first = first;
    ws->n_layer = n_layer;
    ws->stats.n_streamed = n_layer - first;
    ws->slot_layer[0] = ws->slot_layer[1] = -1;
    ws->async = op->event_create && op->event_record && op->stream_wait && op->transfer_to_backend;
    ws->host = calloc((size_t)n_layer, sizeof *ws->host);
    ws->bytes = calloc((size_t)n_layer, sizeof *ws->bytes);
    if (!ws->host || !ws->bytes) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: weight stream tables", model->path);
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, be);
    TRY(tri__arena_create(&ap, &ws->arena));
    uint64_t largest = 0;
    for (int32_t il = first; il < n_layer; il++) {
        const tri__tensor *t[BLOCK_TENSORS];
        block_tensors(&model->layers[il], t);
        uint64_t total = 0;
        for (int i = 0; i < BLOCK_TENSORS; i++) total += aligned(t[i]->n_bytes);
        char what[64];
        snprintf(what, sizeof what, "weights of layer %d", il);
        TRY(tri__arena_alloc(ws->arena, (size_t)total, what, &ws->host[il]));
        ws->bytes[il] = total;
        if (total > largest) largest = total;
        uint64_t off = 0;
        for (int i = 0; i < BLOCK_TENSORS; i++) {
            memcpy((char *)ws->host[il] + off, t[i]->data, (size_t)t[i]->n_bytes);
            off += aligned(t[i]->n_bytes);
        }
    }
    for (int i = 0; i < 2; i++) {
        TRY(op->alloc(be, (size_t)largest, &ws->buf[i]));
        if (ws->async) {
            TRY(op->event_create(be, &ws->loaded[i]));
            TRY(op->event_create(be, &ws->released[i]));
        }
    }
    // the view's tensors of a streamed layer live at fixed places in its buffer
    for (int32_t il = first; il < n_layer; il++) {
        const tri__tensor *t[BLOCK_TENSORS];
        block_tensors(&v->layers[il], t);
        uint64_t off = 0;
        for (int i = 0; i < BLOCK_TENSORS; i++) {
            tri__tensor *vt = &v->tensors[t[i] - v->tensors];
            vt->data = (char *)ws->buf[(il - first) & 1] + off;
            off += aligned(vt->n_bytes);
        }
    }
    tri__log(TRI_LOG_LEVEL_INFO, "%s: %d layers stream their weights through two %.1f MiB buffers", model->path,
             n_layer - first, (double)largest / (1 << 20));
    return TRI_STATUS_OK;
}

// Queues the upload of layer il's block into its buffer, behind the compute still reading it.
static tri_status stream_load(tri__weight_stream *ws, int32_t il) {
    const tri__backend_ops *op = ws->be->ops;
    int s = (il - ws->first) & 1;
    if (ws->slot_layer[s] == il) {
        ws->stats.n_reused++;
        return TRI_STATUS_OK;
    }
    if (ws->async) {
        TRY(op->event_record(ws->be, ws->released[s], TRI_STREAM_COMPUTE));
        TRY(op->stream_wait(ws->be, TRI_STREAM_TRANSFER, ws->released[s]));
        TRY(op->transfer_to_backend(ws->be, ws->buf[s], ws->host[il], (size_t)ws->bytes[il]));
        TRY(op->event_record(ws->be, ws->loaded[s], TRI_STREAM_TRANSFER));
    } else {
        TRY(op->copy_to_backend(ws->be, ws->buf[s], ws->host[il], (size_t)ws->bytes[il]));
    }
    ws->slot_layer[s] = il;
    ws->stats.bytes_up += ws->bytes[il];
    ws->stats.n_uploads++;
    return TRI_STATUS_OK;
}

tri_status tri__model_stream_layer(const tri_model *m, int32_t il) {
    tri__weight_stream *ws = m->stream;
    if (!ws) return TRI_STATUS_OK;
    if (il >= ws->first) {
        TRY(stream_load(ws, il));  // prefetched by the block before, unless il is the first
        if (ws->async) TRY(ws->be->ops->stream_wait(ws->be, TRI_STREAM_COMPUTE, ws->loaded[(il - ws->first) & 1]));
    }
    // the next block uploads while this one computes (the last resident block starts the first)
    if (il + 1 < ws->n_layer && il + 1 >= ws->first) TRY(stream_load(ws, il + 1));
    return TRI_STATUS_OK;
}

void tri__model_stream_stats(const tri_model *m, tri__weight_stream_stats *out) {
    *out = m->stream ? m->stream->stats : (tri__weight_stream_stats){0};
}

// The view and what it owns besides the tables: the device copy of the resident weights and the
// stream of the others.
typedef struct backend_view {
    tri_model m;        // first: a tri_model * to the view is a backend_view *
    tri__backend *be;   // not owned
    void *weights;      // one allocation of backend memory holding every uploaded tensor, or NULL
} backend_view;

void tri__model_backend_free(tri_model *view) {
    if (!view) return;
    backend_view *bv = (backend_view *)view;
    stream_free(view->stream);
    if (bv->weights) bv->be->ops->free(bv->be, bv->weights);
    free(view->tensors);
    free(view->layers);
    free(bv);
}

// The tensor of the view that stands where t stands in the model's table.
static const tri__tensor *remap(const tri_model *model, tri_model *view, const tri__tensor *t) {
    return t ? &view->tensors[t - model->tensors] : NULL;
}

tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, int32_t n_streamed, tri_model **out) {
    *out = NULL;
    const int32_t n_layer = model->config.n_layer;
    if (n_streamed < 0 || n_streamed > n_layer)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: %d streamed layers, the model has %d", model->path,
                         n_streamed, n_layer);
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
    v->stream = NULL;
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
    const int32_t first_streamed = n_layer - n_streamed;
    for (int32_t il = 0; il < first_streamed; il++) {
        const tri__tensor *w[BLOCK_TENSORS];
        block_tensors(&model->layers[il], w);
        for (int i = 0; i < BLOCK_TENSORS; i++) used[w[i] - model->tensors] = true;
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < model->n_tensors; i++)
        if (used[i]) total += aligned(model->tensors[i].n_bytes);
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
            tensors[i].data = NULL;  // streamed (set below) or not read by the forward pass
            continue;
        }
        void *dst = (char *)bv->weights + off;
        if ((st = be->ops->copy_to_backend(be, dst, model->tensors[i].data, (size_t)model->tensors[i].n_bytes)))
            goto done;
        tensors[i].data = dst;
        off += aligned(model->tensors[i].n_bytes);
    }
    if (n_streamed > 0 && (st = stream_init(model, v, be, first_streamed, &v->stream))) goto done;
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

// ---- measured bandwidth ----

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tri_status tri__backend_measure_h2d(tri__backend *be, uint64_t bytes, double *gbps) {
    *gbps = 0;
    if (bytes == 0) bytes = (uint64_t)256 << 20;
    const tri__backend_ops *op = be->ops;
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, be);
    tri__arena *a = NULL;
    void *host = NULL, *dev = NULL;
    tri_status st = tri__arena_create(&ap, &a);
    if (!st) st = tri__arena_alloc(a, (size_t)bytes, "bandwidth probe", &host);
    if (!st) st = op->alloc(be, (size_t)bytes, &dev);
    double best = 0;
    for (int rep = 0; !st && rep < 4; rep++) {  // the first copy warms up the path
        double t0 = seconds_now();
        st = op->transfer_to_backend ? op->transfer_to_backend(be, dev, host, (size_t)bytes)
                                     : op->copy_to_backend(be, dev, host, (size_t)bytes);
        if (!st) st = op->synchronize(be);
        double bw = (double)bytes / (seconds_now() - t0) / 1e9;
        if (!st && rep > 0 && bw > best) best = bw;
    }
    op->free(be, dev);
    tri__arena_free(a);
    if (!st) *gbps = best;
    return st;
}

tri_status tri_device_measure_h2d(int32_t device, uint64_t bytes, double *gbps) {
    if (!gbps) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_device_measure_h2d: NULL argument");
    *gbps = 0;
    tri__backend *be;
    TRY(tri__backend_select(TRI_DEVICE_CUDA, device, 0, &be, NULL));
    tri_status st = tri__backend_measure_h2d(be, bytes, gbps);
    tri__backend_free(be);
    return st;
}
