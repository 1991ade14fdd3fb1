// weights.c - a model's weights in a backend's memory, resident or streamed (see weights.h).
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "error.h"
#include "placement.h"
#include "prefetch.h"

// Device copies of tensors start at this alignment (cuBLAS and 16-byte vector loads want 16;
// 256 is what cudaMalloc itself guarantees).
#define WEIGHT_ALIGN 256

// ---- weights on a backend ----

static uint64_t aligned(uint64_t n) { return (n + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN; }

// A block's nine tensors in the order they are packed for streaming.
#define BLOCK_TENSORS 9
static void block_tensors(const tri__layer *L, const tri__tensor *out[BLOCK_TENSORS]) {
    const tri__tensor *t[BLOCK_TENSORS] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo,
                                           L->ffn_norm, L->w_gate, L->w_up, L->w_down};
    memcpy(out, t, sizeof t);
}

// Staging slots of the disk tier: one block uploading from a slot, and the reads of the next two
// (a read starts two blocks ahead).
#define DISK_SLOTS 3

// Layers first .. n_layer - 1 streamed through two device buffers; of them, first_disk ..
// n_layer - 1 come from the model file each pass, through three staging slots.
struct tri__weight_stream {
    tri__backend *be;         // not owned
    int32_t first, n_layer;
    int32_t first_disk;       // == n_layer when no layer is read from disk
    tri__arena *arena;        // owns the packed host blocks and the staging slots
    void **host;              // (n_layer) packed block of a host layer, host; NULL below first and
                              // from first_disk on
    uint64_t *bytes;          // (n_layer) its size packed (as in its device buffer)
    tri__read_range *ranges;  // (n_layer, BLOCK_TENSORS) a disk layer's tensors in the model file
    tri__prefetch *reader;    // the model file; NULL without disk layers
    void *stage[DISK_SLOTS];  // (stage_bytes) host, pinned: disk layer d reads into stage[d % 3]
    uint64_t stage_off[DISK_SLOTS][BLOCK_TENSORS];  // bytes: where the reader puts each tensor
    int32_t stage_layer[DISK_SLOTS];  // layer a slot holds or is receiving, -1: none
    bool stage_reading[DISK_SLOTS];   // its read is in flight (not waited for yet)
    bool stage_sent[DISK_SLOTS];      // an upload from it was queued: staged[] marks its end
    tri__event *staged[DISK_SLOTS];   // TRANSFER: the last upload from the slot is done
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
    tri__prefetch_close(ws->reader);                // waits for its reads into the slots
    for (int i = 0; i < 2; i++) {
        op->free(ws->be, ws->buf[i]);
        if (ws->async) {
            op->event_destroy(ws->be, ws->loaded[i]);
            op->event_destroy(ws->be, ws->released[i]);
        }
    }
    if (ws->async)
        for (int k = 0; k < DISK_SLOTS; k++) op->event_destroy(ws->be, ws->staged[k]);
    tri__arena_free(ws->arena);
    free(ws->host);
    free(ws->bytes);
    free(ws->ranges);
    free(ws);
}

static tri_status disk_init(tri__weight_stream *ws, const tri_model *model) {
    const char *file = model->layers[ws->first_disk].attn_norm->file;  // one file (checked by the caller)
    uint64_t stage_bytes = 0;
    for (int32_t il = ws->first_disk; il < ws->n_layer; il++) {
        uint64_t need = tri__prefetch_slot_bytes(&ws->ranges[(size_t)il * BLOCK_TENSORS], BLOCK_TENSORS);
        if (need > stage_bytes) stage_bytes = need;
    }
    stage_bytes = (stage_bytes + TRI_PREFETCH_ALIGN - 1) / TRI_PREFETCH_ALIGN * TRI_PREFETCH_ALIGN;
    tri__prefetch_params pp = tri__prefetch_default_params();
    TRY(tri__prefetch_open(file, &pp, &ws->reader));
    size_t sizes[DISK_SLOTS];
    for (int k = 0; k < DISK_SLOTS; k++) {
        char what[64];
        snprintf(what, sizeof what, "weight staging slot %d", k);
        TRY(tri__arena_alloc(ws->arena, (size_t)stage_bytes, what, &ws->stage[k]));  // page-aligned
        sizes[k] = (size_t)stage_bytes;
        ws->stage_layer[k] = -1;
        if (ws->async) TRY(ws->be->ops->event_create(ws->be, &ws->staged[k]));
    }
    TRY(tri__prefetch_set_slots(ws->reader, DISK_SLOTS, ws->stage, sizes));
    tri__log(TRI_LOG_LEVEL_INFO, "%s: %d of them are read from %s each pass (%s%s) through three %.1f MiB slots",
             model->path, ws->n_layer - ws->first_disk, file,
             tri__prefetch_uses_uring(ws->reader) ? "io_uring" : "pread",
             tri__prefetch_uses_direct(ws->reader) ? ", O_DIRECT" : "", (double)stage_bytes / (1 << 20));
    return TRI_STATUS_OK;
}

// Packs layers first .. first_disk - 1 of model into host regions, records where the blocks of
// first_disk .. n_layer - 1 lie in the model file, and points the view's block tensors of all
// those layers at the two device buffers.
static tri_status stream_init(const tri_model *model, tri_model *v, tri__backend *be, int32_t first,
                              int32_t first_disk, tri__weight_stream **out) {
    const tri__backend_ops *op = be->ops;
    const int32_t n_layer = model->config.n_layer;
    tri__weight_stream *ws = calloc(1, sizeof *ws);
    if (!ws) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: weight stream", model->path);
    *out = ws;
    ws->be = be;
    ws->first = first;
    ws->n_layer = n_layer;
    ws->first_disk = first_disk;
    ws->stats.n_streamed = n_layer - first;
    ws->stats.n_disk = n_layer - first_disk;
    ws->slot_layer[0] = ws->slot_layer[1] = -1;
    ws->async = op->event_create && op->event_record && op->stream_wait && op->transfer_to_backend;
    ws->host = calloc((size_t)n_layer, sizeof *ws->host);
    ws->bytes = calloc((size_t)n_layer, sizeof *ws->bytes);
    ws->ranges = calloc((size_t)n_layer * BLOCK_TENSORS, sizeof *ws->ranges);
    if (!ws->host || !ws->bytes || !ws->ranges)
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: weight stream tables", model->path);
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, be);
    TRY(tri__arena_create(&ap, &ws->arena));
    uint64_t largest = 0;
    for (int32_t il = first; il < n_layer; il++) {
        const tri__tensor *t[BLOCK_TENSORS];
        block_tensors(&model->layers[il], t);
        uint64_t total = 0;
        for (int i = 0; i < BLOCK_TENSORS; i++) total += aligned(t[i]->n_bytes);
        ws->bytes[il] = total;
        if (total > largest) largest = total;
        if (il >= first_disk) {  // read per pass, not held
            for (int i = 0; i < BLOCK_TENSORS; i++)
                ws->ranges[(size_t)il * BLOCK_TENSORS + i] = (tri__read_range){t[i]->offset, t[i]->n_bytes};
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "weights of layer %d", il);
        TRY(tri__arena_alloc(ws->arena, (size_t)total, what, &ws->host[il]));
        if (be->simulated) continue;  // a simulated device never reads the packed blocks
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
    if (first_disk < n_layer) TRY(disk_init(ws, model));
    return TRI_STATUS_OK;
}

// ---- the disk tier: reads into staging slots, two blocks ahead ----

static int disk_slot(const tri__weight_stream *ws, int32_t il) { return (il - ws->first_disk) % DISK_SLOTS; }

// Starts reading disk layer il's block into its slot unless the slot holds it or is receiving it
// already (a slot keeps its block until another layer needs it: with three or fewer disk layers
// each is read once). The slot is refilled only after its last upload is done, and after a read
// still in flight into it (a pass cut short by an error) has finished.
static tri_status disk_read(tri__weight_stream *ws, int32_t il) {
    if (il < ws->first_disk || il >= ws->n_layer) return TRI_STATUS_OK;
    const tri__backend_ops *op = ws->be->ops;
    int k = disk_slot(ws, il);
    if (ws->stage_layer[k] == il) return TRI_STATUS_OK;
    if (ws->stage_reading[k]) {
        ws->stage_reading[k] = false;
        ws->stage_layer[k] = -1;
        TRY(tri__prefetch_wait(ws->reader, k));
    }
    if (ws->stage_sent[k]) {
        TRY(op->event_synchronize ? op->event_synchronize(ws->be, ws->staged[k]) : op->synchronize(ws->be));
        ws->stage_sent[k] = false;
    }
    TRY(tri__prefetch_submit(ws->reader, k, &ws->ranges[(size_t)il * BLOCK_TENSORS], BLOCK_TENSORS,
                             ws->stage_off[k]));
    ws->stage_layer[k] = il;
    ws->stage_reading[k] = true;
    ws->stats.n_reads++;
    for (int i = 0; i < BLOCK_TENSORS; i++) ws->stats.bytes_disk += ws->ranges[(size_t)il * BLOCK_TENSORS + i].len;
    return TRI_STATUS_OK;
}

// Queues the upload of disk layer il's block, once its read is done, from its slot into device
// buffer s, each tensor at its fixed place there (the reader put it where its alignment allowed).
static tri_status disk_upload(tri__weight_stream *ws, int32_t il, int s) {
    const tri__backend_ops *op = ws->be->ops;
    int k = disk_slot(ws, il);
    TRY(disk_read(ws, il));  // not started yet: the first streamed block of a pass
    if (ws->stage_reading[k]) {
        ws->stage_reading[k] = false;
        tri_status st = tri__prefetch_wait(ws->reader, k);
        if (st) {
            ws->stage_layer[k] = -1;  // read again next time
            return st;
        }
    }
    const tri__read_range *r = &ws->ranges[(size_t)il * BLOCK_TENSORS];
    uint64_t off = 0;
    for (int i = 0; i < BLOCK_TENSORS; i++) {
        void *dst = (char *)ws->buf[s] + off;
        const char *src = (const char *)ws->stage[k] + ws->stage_off[k][i];
        TRY(ws->async ? op->transfer_to_backend(ws->be, dst, src, (size_t)r[i].len)
                      : op->copy_to_backend(ws->be, dst, src, (size_t)r[i].len));  // done on return
        off += aligned(r[i].len);
    }
    if (ws->async) {
        TRY(op->event_record(ws->be, ws->staged[k], TRI_STREAM_TRANSFER));
        ws->stage_sent[k] = true;
    }
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
        if (il >= ws->first_disk)
            TRY(disk_upload(ws, il, s));
        else
            TRY(op->transfer_to_backend(ws->be, ws->buf[s], ws->host[il], (size_t)ws->bytes[il]));
        TRY(op->event_record(ws->be, ws->loaded[s], TRI_STREAM_TRANSFER));
    } else if (il >= ws->first_disk) {
        TRY(disk_upload(ws, il, s));
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
    // the disk block two ahead starts reading (the nearer ones started before, unless the pass
    // starts among the disk layers)
    if (ws->reader)
        for (int32_t j = il; j <= il + 2; j++) TRY(disk_read(ws, j));
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
    if (m->stream && m->stream->reader) {
        tri__prefetch_stats ps;
        tri__prefetch_stats_get(m->stream->reader, &ps);
        out->bytes_read = ps.bytes_read;
    }
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

tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, int32_t n_streamed, int32_t n_disk,
                                 tri_model **out) {
    *out = NULL;
    const int32_t n_layer = model->config.n_layer;
    if (n_streamed < 0 || n_streamed > n_layer)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: %d streamed layers, the model has %d", model->path,
                         n_streamed, n_layer);
    if (n_disk < 0 || n_disk > n_streamed)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "%s: %d layers read from disk, outside [0, %d] (the streamed layers)", model->path, n_disk,
                         n_streamed);
    // the reader reads one file by byte offsets; a tensor's offset is within its own shard
    if (n_disk > 0 && !be->host_memory && model->info.n_files != 1)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: weights read from disk need the model in one file, this checkpoint has %d shards",
                         model->path, (int)model->info.n_files);
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
        b->bq = remap(model, v, a->bq);
        b->bk = remap(model, v, a->bk);
        b->bv = remap(model, v, a->bv);
        b->bo = remap(model, v, a->bo);
        b->q_norm = remap(model, v, a->q_norm);
        b->k_norm = remap(model, v, a->k_norm);
        b->post_attn_norm = remap(model, v, a->post_attn_norm);
        b->post_ffn_norm = remap(model, v, a->post_ffn_norm);
    }
    // the disk tier reads a block's tensors by their file offsets: none may be computed at load
    for (int32_t il = n_layer - n_disk; il < n_layer && !be->host_memory; il++) {
        const tri__tensor *w[BLOCK_TENSORS];
        block_tensors(&model->layers[il], w);
        for (int i = 0; i < BLOCK_TENSORS; i++)
            if (w[i]->computed) {
                st = tri__fail(TRI_STATUS_UNSUPPORTED,
                               "%s: tensor '%s' is computed at load (the %s family), so it cannot be read from disk",
                               model->path, w[i]->source, tri__model_family(model)->name);
                goto done;
            }
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
    for (int32_t il = 0; il < n_layer; il++) {  // biases and the extra norms stay resident, streamed or not
        const tri__layer *L = &model->layers[il];
        const tri__tensor *b[8] = {L->bq,           L->bk, L->bv, L->bo, L->q_norm, L->k_norm, L->post_attn_norm,
                                   L->post_ffn_norm};
        for (int i = 0; i < 8; i++)
            if (b[i]) used[b[i] - model->tensors] = true;
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
    if (n_streamed > 0 && (st = stream_init(model, v, be, first_streamed, n_layer - n_disk, &v->stream))) goto done;
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
