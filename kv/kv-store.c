// kv-store.c - per-layer K/V storage with append and rollback.
#include "kv-store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "clock.h"
#include "dtype.h"
#include "error.h"
#include "placement.h"

// ---- offloaded layers: host regions streamed through two backend buffers ----

struct tri__kv_offload {
    int32_t on_chip;            // layers below stay in backend memory
    tri__arena *arena;          // owns the host regions below
    void **host_k, **host_v;    // (n_layer) (capacity, n_head_kv, head_dim) host; NULL below on_chip
    void *buf_k[2], *buf_v[2];  // (capacity, n_head_kv, head_dim) backend: offloaded layer j uses
                                // buffer j & 1 (j counted from on_chip)
    int32_t slot_layer[2];      // layer whose rows [0, slot_len) the buffer holds (or is receiving
    int32_t slot_len[2];        //   on TRANSFER), -1: none
    bool async;                 // the backend has a transfer stream: the events below are used
    tri__event *loaded[2];      // TRANSFER: the last upload into the buffer is done
    tri__event *released[2];    // COMPUTE: the work queued so far that reads the buffer is done
    tri__event *written;        // COMPUTE: a layer's new rows are in its buffer
    tri__kv_offload_stats stats;
    // ---- split attention (tri__kv_store_attend_split) ----
    double host_frac;           // of an offloaded layer's rows, attended on the host when a step splits
    tri__backend *host_be;      // CPU backend of the host half; NULL: nothing splits
    tri__event *down;           // TRANSFER: the last write-back of new rows is done
    tri__event *q_ev, *state_ev; // COMPUTE: the queries, the device half's state have reached the host
    float *d_state;             // (rows_cap, head_dim + 2) backend: the device half's state
    void *h_block;              // one pinned arena region holding the three below: copies to and
                                // from pageable memory would block the host until they are done
    float *h_q, *h_out;         // (rows_cap, head_dim) host: queries down, output up
    float *h_state;             // (rows_cap, head_dim + 2) host
    float *h_chunks;            // (chunks_cap) floats host: the host half's chunk partials
    int64_t rows_cap, chunks_cap;
    tri__kv_span *dev_spans, *host_spans; // (n_head_kv) each
    int32_t *split_head_span;   // (n_head_kv + 1): h
    bool split_refused;         // the backend has no attention_state (logged once)
    // ---- kv_type mixed's split (tri__kv_store_attend_split_view) ----
    tri__kv_span *mdev, *mhost; // (mspans_cap) the two halves' spans
    int32_t mspans_cap;
    int32_t *mhead;             // (n_head_kv + 1) host
    void *mstage;               // (mstage_cap) bytes host: f16 rows past split_dev, keys then values
    size_t mstage_cap;
};

// Releases the split attention's host backend, events and buffers (after a synchronize).
static void split_free(tri__kv_store *kv) {
    tri__kv_offload *o = kv->off;
    const tri__backend_ops *op = kv->be->ops;
    if (o->async) {
        op->event_destroy(kv->be, o->down);
        op->event_destroy(kv->be, o->q_ev);
        op->event_destroy(kv->be, o->state_ev);
    }
    o->down = o->q_ev = o->state_ev = NULL;
    op->free(kv->be, o->d_state);
    o->d_state = NULL;
    tri__backend_free(o->host_be);
    o->host_be = NULL;
    if (o->h_block) tri__arena_release(o->arena, o->h_block);
    o->h_block = NULL;
    free(o->h_chunks);
    free(o->dev_spans), free(o->host_spans), free(o->split_head_span);
    free(o->mdev), free(o->mhost), free(o->mhead), free(o->mstage);
    o->mdev = o->mhost = NULL, o->mhead = NULL, o->mstage = NULL, o->mspans_cap = 0, o->mstage_cap = 0;
    o->h_q = o->h_out = o->h_state = o->h_chunks = NULL;
    o->dev_spans = o->host_spans = NULL;
    o->split_head_span = NULL;
    o->rows_cap = o->chunks_cap = 0;
    o->host_frac = 0;
}

static void offload_free(tri__kv_store *kv) {
    tri__kv_offload *o = kv->off;
    if (!o) return;
    const tri__backend_ops *op = kv->be->ops;
    if (o->async) (void)op->synchronize(kv->be);  // no copy may still use what is released below
    for (int i = 0; i < 2; i++) {
        op->free(kv->be, o->buf_k[i]);
        op->free(kv->be, o->buf_v[i]);
        if (o->async) {
            op->event_destroy(kv->be, o->loaded[i]);
            op->event_destroy(kv->be, o->released[i]);
        }
    }
    if (o->async) op->event_destroy(kv->be, o->written);
    split_free(kv);
    tri__arena_free(o->arena);  // unpins and unmaps every host region
    free(o->host_k);
    free(o->host_v);
    free(o);
    kv->off = NULL;
}

// Allocates the host regions of layers on_chip .. n_layer - 1, the two buffers and the events.
static tri_status offload_init(tri__kv_store *kv, int32_t on_chip) {
    tri__backend *be = kv->be;
    const tri__backend_ops *op = be->ops;
    tri__kv_offload *o = calloc(1, sizeof *o);
    if (!o) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: offload state");
    kv->off = o;
    o->on_chip = on_chip;
    o->stats.on_chip = on_chip;
    o->slot_layer[0] = o->slot_layer[1] = -1;
    o->async = op->event_create && op->event_record && op->stream_wait && op->transfer_to_backend &&
               op->transfer_to_host;
    o->host_k = calloc((size_t)kv->n_layer, sizeof *o->host_k);
    o->host_v = calloc((size_t)kv->n_layer, sizeof *o->host_v);
    if (!o->host_k || !o->host_v) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: offload tables");
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, be);
    TRY(tri__arena_create(&ap, &o->arena));
    size_t bytes = (size_t)tri__kv_store_row_bytes(kv) * (size_t)kv->capacity;
    for (int32_t il = on_chip; il < kv->n_layer; il++) {
        char what[64];
        snprintf(what, sizeof what, "kv cache layer %d keys", il);
        TRY(tri__arena_alloc(o->arena, bytes, what, &o->host_k[il]));
        snprintf(what, sizeof what, "kv cache layer %d values", il);
        TRY(tri__arena_alloc(o->arena, bytes, what, &o->host_v[il]));
    }
    for (int i = 0; i < 2; i++) {
        TRY(op->alloc(be, bytes, &o->buf_k[i]));
        TRY(op->alloc(be, bytes, &o->buf_v[i]));
        if (o->async) {
            TRY(op->event_create(be, &o->loaded[i]));
            TRY(op->event_create(be, &o->released[i]));
        }
    }
    if (o->async) TRY(op->event_create(be, &o->written));
    return TRI_STATUS_OK;
}

static bool offloaded(const tri__kv_store *kv, int32_t il) { return kv->off && il >= kv->off->on_chip; }
static int slot_of(const tri__kv_store *kv, int32_t il) { return (il - kv->off->on_chip) & 1; }

// Makes layer il's buffer hold its rows [0, len): nothing when it does already, else an upload
// queued behind the compute that still reads the buffer (the layer two before il).
static tri_status offload_load(tri__kv_store *kv, int32_t il, int32_t len) {
    tri__kv_offload *o = kv->off;
    tri__backend *be = kv->be;
    const tri__backend_ops *op = be->ops;
    int s = slot_of(kv, il);
    if (o->slot_layer[s] == il && o->slot_len[s] >= len) {
        o->stats.n_reused++;
        return TRI_STATUS_OK;
    }
    size_t bytes = (size_t)tri__kv_store_row_bytes(kv) * (size_t)len;
    if (o->async) {
        TRY(op->event_record(be, o->released[s], TRI_STREAM_COMPUTE));
        TRY(op->stream_wait(be, TRI_STREAM_TRANSFER, o->released[s]));
        TRY(op->transfer_to_backend(be, o->buf_k[s], o->host_k[il], bytes));
        TRY(op->transfer_to_backend(be, o->buf_v[s], o->host_v[il], bytes));
        TRY(op->event_record(be, o->loaded[s], TRI_STREAM_TRANSFER));
    } else {
        TRY(op->copy_to_backend(be, o->buf_k[s], o->host_k[il], bytes));
        TRY(op->copy_to_backend(be, o->buf_v[s], o->host_v[il], bytes));
    }
    o->slot_layer[s] = il;
    o->slot_len[s] = len;
    o->stats.bytes_up += 2 * (uint64_t)bytes;
    o->stats.n_uploads++;
    return TRI_STATUS_OK;
}

// Writes n new rows at pos of offloaded layer il into its buffer and copies them back to host.
static tri_status offload_write(tri__kv_store *kv, int32_t il, int32_t pos, int32_t n, const float *k,
                                const float *v) {
    tri__kv_offload *o = kv->off;
    tri__backend *be = kv->be;
    const tri__backend_ops *op = be->ops;
    int s = slot_of(kv, il);
    TRY(offload_load(kv, il, kv->split_step ? kv->split_dev : pos));
    if (o->async) TRY(op->stream_wait(be, TRI_STREAM_COMPUTE, o->loaded[s]));
    int64_t row = tri__kv_store_row_bytes(kv);
    int64_t elems = (int64_t)n * kv->n_head_kv * kv->head_dim;
    char *kd = (char *)o->buf_k[s] + (int64_t)pos * row, *vd = (char *)o->buf_v[s] + (int64_t)pos * row;
    char *kh = (char *)o->host_k[il] + (int64_t)pos * row, *vh = (char *)o->host_v[il] + (int64_t)pos * row;
    TRY(op->convert(be, kd, kv->type, k, elems));
    TRY(op->convert(be, vd, kv->type, v, elems));
    size_t bytes = (size_t)(n * row);
    if (o->async) {
        TRY(op->event_record(be, o->written, TRI_STREAM_COMPUTE));
        TRY(op->stream_wait(be, TRI_STREAM_TRANSFER, o->written));
        TRY(op->transfer_to_host(be, kh, kd, bytes));
        TRY(op->transfer_to_host(be, vh, vd, bytes));
        if (o->down) TRY(op->event_record(be, o->down, TRI_STREAM_TRANSFER));  // the host half reads them
    } else {
        TRY(op->copy_to_host(be, kh, kd, bytes));
        TRY(op->copy_to_host(be, vh, vd, bytes));
    }
    // the buffer's rows are current up to pos + n, unless a split left rows [slot_len, pos) out
    if (o->slot_len[s] >= pos) o->slot_len[s] = pos + n;
    o->stats.bytes_down += 2 * (uint64_t)bytes;
    return TRI_STATUS_OK;
}

void tri__kv_store_offload_stats(const tri__kv_store *kv, tri__kv_offload_stats *out) {
    if (kv->off) {
        *out = kv->off->stats;
        return;
    }
    *out = (tri__kv_offload_stats){.on_chip = kv->n_layer};
}

int64_t tri__kv_store_row_bytes(const tri__kv_store *kv) {
    return tri__dtype_row_bytes(kv->type, (int64_t)kv->n_head_kv * kv->head_dim);
}

tri_status tri__kv_store_init(tri__kv_store *kv, tri__backend *be, tri_dtype type, int32_t n_layer,
                              int32_t n_head_kv, int32_t head_dim, int32_t capacity) {
    return tri__kv_store_init_offload(kv, be, type, n_layer, n_head_kv, head_dim, capacity, n_layer);
}

tri_status tri__kv_store_init_offload(tri__kv_store *kv, tri__backend *be, tri_dtype type, int32_t n_layer,
                                      int32_t n_head_kv, int32_t head_dim, int32_t capacity, int32_t on_chip) {
    memset(kv, 0, sizeof *kv);
    if (!tri__kv_type_ok(type))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: type %s (kv_type), want f16, f32, q8_0 or q4_0",
                         tri_dtype_name(type));
    if (tri__dtype_is_quantized(type) && head_dim % TRI_QK != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv cache: kv_type %s quantizes blocks of %d values of a head; head_dim %d is not a multiple",
                         tri_dtype_name(type), TRI_QK, head_dim);
    if (tri__dtype_is_quantized(type) && be && !(be->ops->caps & TRI_BACKEND_CAP_QUANT_KV))
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "kv cache: kv_type %s is not supported on the %s backend (CPU and CUDA only)",
                         tri_dtype_name(type), be->ops->name);
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || capacity <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv cache: sizes must be positive (layers %d, kv heads %d, head dim %d, "
                         "capacity %d)", n_layer, n_head_kv, head_dim, capacity);
    if (on_chip < 0 || on_chip > n_layer)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: %d layers on chip, the model has %d", on_chip,
                         n_layer);
    kv->be = be;
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->capacity = capacity;
    tri_status st = TRI_STATUS_OK;
    kv->k = calloc((size_t)n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)n_layer, sizeof *kv->v);
    kv->spans = calloc((size_t)n_head_kv, sizeof *kv->spans);
    kv->head_span = calloc((size_t)n_head_kv + 1, sizeof *kv->head_span);
    if (!kv->k || !kv->v || !kv->spans || !kv->head_span) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: tables");
        goto fail;
    }
    size_t bytes = (size_t)tri__kv_store_row_bytes(kv) * (size_t)capacity;
    for (int32_t il = 0; il < on_chip; il++) {
        if ((st = be->ops->alloc(be, bytes, &kv->k[il]))) goto fail;
        if ((st = be->ops->alloc(be, bytes, &kv->v[il]))) goto fail;
    }
    if (on_chip < n_layer && (st = offload_init(kv, on_chip))) goto fail;
    return TRI_STATUS_OK;

fail:
    tri__kv_store_free(kv);
    return st;
}

void tri__kv_store_free(tri__kv_store *kv) {
    if (kv->be) {
        offload_free(kv);
        for (int32_t il = 0; il < kv->n_layer; il++) {
            if (kv->k) kv->be->ops->free(kv->be, kv->k[il]);
            if (kv->v) kv->be->ops->free(kv->be, kv->v[il]);
        }
    }
    free(kv->k);
    free(kv->v);
    free(kv->spans);
    free(kv->head_span);
    memset(kv, 0, sizeof *kv);
}

tri_status tri__kv_store_write(tri__kv_store *kv, int32_t il, int32_t pos, int32_t n, const float *k,
                               const float *v) {
    if (il < 0 || il >= kv->n_layer || pos < 0 || n < 0 || pos > kv->capacity - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv cache: write of %d positions at %d (layer %d) exceeds its capacity of %d",
                         n, pos, il, kv->capacity);
    if (offloaded(kv, il)) TRY(offload_write(kv, il, pos, n, k, v));
    // double buffering: the next offloaded layer's rows before this step upload while this layer
    // computes (the last layer on chip starts the first one)
    if (!kv->no_prefetch) TRY(tri__kv_store_prefetch(kv, il + 1, pos));
    if (offloaded(kv, il)) return TRI_STATUS_OK;
    int64_t row = tri__kv_store_row_bytes(kv);
    int64_t elems = (int64_t)n * kv->n_head_kv * kv->head_dim;
    char *kd = (char *)kv->k[il] + (int64_t)pos * row;
    char *vd = (char *)kv->v[il] + (int64_t)pos * row;
    tri_status st = kv->be->ops->convert(kv->be, kd, kv->type, k, elems);
    if (!st) st = kv->be->ops->convert(kv->be, vd, kv->type, v, elems);
    return st;
}

tri_status tri__kv_store_set_len(tri__kv_store *kv, int32_t n) {
    if (n < 0 || n > kv->capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: length %d outside [0, %d]", n,
                         kv->capacity);
    kv->n = n;
    return TRI_STATUS_OK;
}

const tri__kv_view *tri__kv_store_view(tri__kv_store *kv, int32_t il, int32_t n_pos,
                                       tri__kv_view *view) {
    TRI_ASSERT(il >= 0 && il < kv->n_layer && n_pos >= 0 && n_pos <= kv->capacity);
    const void *kb = kv->k[il], *vb = kv->v[il];
    if (offloaded(kv, il)) {  // the buffer the layer's write made current
        int s = slot_of(kv, il);
        TRI_ASSERT(kv->off->slot_layer[s] == il &&
                   kv->off->slot_len[s] >= (kv->split_step && kv->split_dev < n_pos ? kv->split_dev : n_pos));
        kb = kv->off->buf_k[s];
        vb = kv->off->buf_v[s];
    }
    for (int32_t h = 0; h < kv->n_head_kv; h++) {
        int64_t off = tri__dtype_row_bytes(kv->type, (int64_t)h * kv->head_dim);
        kv->spans[h] = (tri__kv_span){
            .pos0 = 0,
            .n = n_pos,
            .k = (const char *)kb + off,
            .v = (const char *)vb + off,
            .stride = (int64_t)kv->n_head_kv * kv->head_dim,
            .pos = NULL,
        };
        kv->head_span[h] = h;
    }
    kv->head_span[kv->n_head_kv] = kv->n_head_kv;
    *view = (tri__kv_view){
        .type = kv->type,
        .n_head_kv = kv->n_head_kv,
        .spans = kv->spans,
        .head_span = kv->head_span,
    };
    return view;
}

tri_status tri__kv_store_prefetch(tri__kv_store *kv, int32_t il, int32_t len) {
    if (il < 0 || il >= kv->n_layer || !offloaded(kv, il)) return TRI_STATUS_OK;
    return offload_load(kv, il, kv->split_step && kv->split_dev < len ? kv->split_dev : len);
}

tri_status tri__kv_store_view_read(tri__kv_store *kv, int32_t il, int32_t n_pos, const tri__kv_view **view,
                                   tri__kv_view *storage) {
    if (il < 0 || il >= kv->n_layer || n_pos < 0 || n_pos > kv->n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: read of %d positions of layer %d (%d held)", n_pos,
                         il, kv->n);
    if (offloaded(kv, il)) {
        TRY(offload_load(kv, il, n_pos));
        if (kv->off->async) TRY(kv->be->ops->stream_wait(kv->be, TRI_STREAM_COMPUTE, kv->off->loaded[slot_of(kv, il)]));
    }
    TRY(tri__kv_store_prefetch(kv, il + 1, n_pos));
    *view = tri__kv_store_view(kv, il, n_pos, storage);
    return TRI_STATUS_OK;
}

const void *tri__kv_store_rows(const tri__kv_store *kv, int32_t il, int which, bool *host) {
    *host = offloaded(kv, il);
    if (*host) return which ? kv->off->host_v[il] : kv->off->host_k[il];
    return which ? kv->v[il] : kv->k[il];
}

tri_status tri__kv_store_read_rows(tri__kv_store *kv, int32_t il, int which, int32_t pos, int32_t n, void *host) {
    if (il < 0 || il >= kv->n_layer || pos < 0 || n < 0 || pos > kv->capacity - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: read of %d positions at %d (layer %d) exceeds %d", n,
                         pos, il, kv->capacity);
    bool on_host;
    const char *rows = tri__kv_store_rows(kv, il, which, &on_host);
    int64_t row = tri__kv_store_row_bytes(kv);
    // an offloaded layer's new rows may still be on their way back; a copy out of backend memory
    // completes at the synchronize
    if (!on_host) TRY(kv->be->ops->copy_to_host(kv->be, host, rows + pos * row, (size_t)(n * row)));
    if (!on_host || kv->off->async) TRY(kv->be->ops->synchronize(kv->be));
    if (on_host) memcpy(host, rows + pos * row, (size_t)(n * row));
    return TRI_STATUS_OK;
}

tri_status tri__kv_store_load_rows(tri__kv_store *kv, int32_t il, int32_t pos, int32_t n, const void *k_host,
                                   const void *v_host) {
    if (il < 0 || il >= kv->n_layer || pos < 0 || n < 0 || pos > kv->capacity - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: load of %d positions at %d (layer %d) exceeds %d",
                         n, pos, il, kv->capacity);
    int64_t row = tri__kv_store_row_bytes(kv);
    size_t bytes = (size_t)(n * row);
    if (offloaded(kv, il)) {
        tri__kv_offload *o = kv->off;
        if (o->async) TRY(kv->be->ops->synchronize(kv->be));  // no copy in flight may read the rows
        memcpy((char *)o->host_k[il] + pos * row, k_host, bytes);
        memcpy((char *)o->host_v[il] + pos * row, v_host, bytes);
        for (int s = 0; s < 2; s++)  // a buffer holding the layer is stale now
            if (o->slot_layer[s] == il) o->slot_layer[s] = -1;
        return TRI_STATUS_OK;
    }
    TRY(kv->be->ops->copy_to_backend(kv->be, (char *)kv->k[il] + pos * row, k_host, bytes));
    TRY(kv->be->ops->copy_to_backend(kv->be, (char *)kv->v[il] + pos * row, v_host, bytes));
    return kv->be->ops->synchronize(kv->be);
}

tri_status tri__kv_store_copy_rows(tri__kv_store *dst, tri__kv_store *src, int32_t pos, int32_t n) {
    if (dst->type != src->type || dst->n_layer != src->n_layer || dst->n_head_kv != src->n_head_kv ||
        dst->head_dim != src->head_dim || dst->be != src->be)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: copy between stores of different shapes");
    if (pos < 0 || n < 0 || pos > src->n - n || pos > dst->capacity - n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: copy of rows %d .. %d (source holds %d, capacity %d)",
                         pos, pos + n, src->n, dst->capacity);
    if (n == 0) return TRI_STATUS_OK;
    const tri__backend_ops *op = dst->be->ops;
    // an offloaded source's new rows may still be on their way back to its host regions
    if (src->off && src->off->async) TRY(op->synchronize(src->be));
    const int64_t row = tri__kv_store_row_bytes(dst);
    const size_t bytes = (size_t)(n * row);
    for (int32_t il = 0; il < dst->n_layer; il++) {
        for (int kv = 0; kv < 2; kv++) {
            bool src_host, dst_host;
            const char *from = (const char *)tri__kv_store_rows(src, il, kv, &src_host) + pos * row;
            char *to = (char *)tri__kv_store_rows(dst, il, kv, &dst_host) + pos * row;
            if (dst_host && src_host) memcpy(to, from, bytes);
            else if (dst_host) TRY(op->copy_to_host(dst->be, to, from, bytes));
            else if (src_host) TRY(op->copy_to_backend(dst->be, to, from, bytes));
            else if (op->copy) TRY(op->copy(dst->be, to, from, bytes));
            else return tri__fail(TRI_STATUS_UNSUPPORTED, "kv cache: backend %s copies no rows", op->name);
        }
        if (offloaded(dst, il))  // a buffer holding the layer is stale now
            for (int s = 0; s < 2; s++)
                if (dst->off->slot_layer[s] == il) dst->off->slot_layer[s] = -1;
    }
    return op->synchronize(dst->be);  // the host side of the copies is the caller's to reuse
}

// ---- split attention: the device attends the first rows, the host the rest ----

// Host threads for the host half: the cores of the device's NUMA node (or of the machine) less one
// for the thread that submits transfers and the weight reader's.
static int32_t split_default_threads(const tri__backend *be) {
    int32_t n = 0;
    char busid[32];
    if (be && tri__backend_pci_bus_id(be, busid, sizeof busid) == TRI_STATUS_OK) {
        const tri__topology *t;
        int32_t node = tri__host_node_near(busid, &t);
        for (int32_t i = 0; node >= 0 && i < tri__topology_n_nodes(t); i++)
            if (tri__topology_node(t, i)->os_index == node) n = tri__topology_node(t, i)->n_cores;
    }
    if (n <= 0) n = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    return n > 1 ? n - 1 : 1;
}

tri_status tri__kv_store_set_split(tri__kv_store *kv, double host_frac, int32_t n_threads) {
    if (!(host_frac >= 0 && host_frac <= 1))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: host attention fraction %g outside [0, 1]", host_frac);
    tri__kv_offload *o = kv->off;
    if (!o || host_frac == 0) {
        if (o) {
            if (o->async) TRY(kv->be->ops->synchronize(kv->be));
            split_free(kv);
        }
        return TRI_STATUS_OK;
    }
    tri__backend *be = kv->be;
    const tri__backend_ops *op = be->ops;
    if (!op->attention_state) {
        if (!o->split_refused)
            tri__log(TRI_LOG_LEVEL_INFO,
                     "kv cache: backend %s has no partial attention; offloaded layers stream every row", op->name);
        o->split_refused = true;
        return TRI_STATUS_OK;
    }
    if (o->async) TRY(op->synchronize(be));
    split_free(kv);
    tri_status st = TRI_STATUS_OK;
    // the host half's threads: created by this thread, they inherit its binding, which
    // tri__backend_select made the device's NUMA node's (tri__backend_bind_host_threads)
    if (n_threads <= 0) n_threads = split_default_threads(be);
    if ((st = tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_AUTO, &o->host_be))) goto fail;
    o->dev_spans = calloc((size_t)kv->n_head_kv, sizeof *o->dev_spans);
    o->host_spans = calloc((size_t)kv->n_head_kv, sizeof *o->host_spans);
    o->split_head_span = calloc((size_t)kv->n_head_kv + 1, sizeof *o->split_head_span);
    o->mhead = calloc((size_t)kv->n_head_kv + 1, sizeof *o->mhead);
    if (!o->dev_spans || !o->host_spans || !o->split_head_span || !o->mhead) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: split attention views");
        goto fail;
    }
    for (int32_t h = 0; h <= kv->n_head_kv; h++) o->split_head_span[h] = h;
    if (o->async) {
        if ((st = op->event_create(be, &o->down)) || (st = op->event_create(be, &o->q_ev)) ||
            (st = op->event_create(be, &o->state_ev)))
            goto fail;
    }
    o->host_frac = host_frac;
    return TRI_STATUS_OK;

fail:
    split_free(kv);
    return st;
}

void tri__kv_store_split_begin(tri__kv_store *kv, int32_t n0, int32_t m) {
    kv->split_step = false;
    kv->split_dev = n0;
    if (!kv->off || !kv->off->host_be || m > TRI_KV_SPLIT_MAX_STEP || kv->no_prefetch) return;
    // the device's rows: whole chunks of the fold (so the merge folds in the unsplit order), at
    // most the rows before the step; the step's own rows are the host's
    int64_t dev = (int64_t)((double)n0 * (1.0 - kv->off->host_frac)) / TRI_ATTN_CHUNK * TRI_ATTN_CHUNK;
    kv->split_step = true;
    kv->split_dev = (int32_t)(dev < n0 ? dev : n0 / TRI_ATTN_CHUNK * TRI_ATTN_CHUNK);
}

void tri__kv_store_split_end(tri__kv_store *kv) {
    kv->split_step = false;
    kv->split_dev = 0;
}

bool tri__kv_store_splits(const tri__kv_store *kv, int32_t il) { return kv->split_step && offloaded(kv, il); }

// Grows the split attention's buffers to rows (query, head) rows and chunk_floats of partials.
static tri_status split_reserve(tri__kv_store *kv, int64_t rows, int64_t chunk_floats) {
    tri__kv_offload *o = kv->off;
    int64_t hd = kv->head_dim;
    if (rows > o->rows_cap) {
        // the buffers may still be read by queued copies (the last layer's output upload)
        if (o->async) TRY(kv->be->ops->synchronize(kv->be));
        kv->be->ops->free(kv->be, o->d_state);
        o->d_state = NULL;
        if (o->h_block) tri__arena_release(o->arena, o->h_block);
        o->h_block = NULL;
        o->rows_cap = 0;
        // pinned (the arena pins through the backend) and on the device's NUMA node
        TRY(tri__arena_alloc(o->arena, sizeof(float) * (size_t)(rows * (3 * hd + 2)),
                             "split attention queries, state and output", &o->h_block));
        o->h_q = o->h_block;
        o->h_out = o->h_q + rows * hd;
        o->h_state = o->h_out + rows * hd;
        TRY(kv->be->ops->alloc(kv->be, sizeof(float) * (size_t)(rows * (hd + 2)), (void **)&o->d_state));
        o->rows_cap = rows;
    }
    if (chunk_floats > o->chunks_cap) {
        free(o->h_chunks);
        o->h_chunks = malloc(sizeof(float) * (size_t)chunk_floats);
        o->chunks_cap = o->h_chunks ? chunk_floats : 0;
        if (!o->h_chunks)
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: split attention partials (%lld floats)",
                             (long long)chunk_floats);
    }
    return TRI_STATUS_OK;
}

// Waits (host) for ev's point, or for everything on a backend without event_synchronize.
static tri_status split_wait(tri__kv_store *kv, tri__event *ev) {
    const tri__backend_ops *op = kv->be->ops;
    if (!kv->off->async) return TRI_STATUS_OK;  // (copies are done when they return)
    return op->event_synchronize ? op->event_synchronize(kv->be, ev) : op->synchronize(kv->be);
}

// The split's two halves: dev (rows below split_dev, in backend memory) on the device as a state,
// host (the rest, in host memory) on the host in chunks, folded in chunk order; host_bytes: what
// the host half read in place.
static tri_status split_run(tri__kv_store *kv, float *out, const float *q, const int32_t *q_pos, int32_t m,
                            int32_t n_head, const tri__kv_view *dev, const tri__kv_view *host, uint64_t host_bytes) {
    tri__kv_offload *o = kv->off;
    tri__backend *be = kv->be;
    const tri__backend_ops *op = be->ops;
    const int64_t hd = kv->head_dim, rows = (int64_t)m * n_head;
    const int32_t S = kv->split_dev;
    int64_t n_chunk;
    TRY(tri__cpu_attention_chunks(o->host_be, NULL, &n_chunk, NULL, q_pos, m, n_head, hd, host));
    TRY(split_reserve(kv, rows, n_chunk * rows * (hd + 2)));

    // device: the queries down, then the first S rows' state, then that down, each behind an event
    TRY(op->copy_to_host(be, o->h_q, q, sizeof(float) * (size_t)(rows * hd)));
    if (o->async) TRY(op->event_record(be, o->q_ev, TRI_STREAM_COMPUTE));
    if (S > 0) {
        TRY(op->attention_state(be, o->d_state, q, q_pos, m, n_head, hd, dev));
        TRY(op->copy_to_host(be, o->h_state, o->d_state, sizeof(float) * (size_t)(rows * (hd + 2))));
        if (o->async) TRY(op->event_record(be, o->state_ev, TRI_STREAM_COMPUTE));
    }
    // host, meanwhile: rows S .. end where they lie, the step's new ones once written back
    TRY(split_wait(kv, o->q_ev));
    TRY(split_wait(kv, o->down));
    TRY(tri__cpu_attention_chunks(o->host_be, o->h_chunks, &n_chunk, o->h_q, q_pos, m, n_head, hd, host));
    if (S > 0) {
        TRY(split_wait(kv, o->state_ev));
    } else {  // nothing on the device: the fold starts empty, as attention's does
        for (int64_t r = 0; r < rows; r++) {
            float *st = o->h_state + r * (hd + 2);
            memset(st, 0, sizeof(float) * (size_t)hd);
            st[hd] = -INFINITY, st[hd + 1] = 0;
        }
    }
    tri__cpu_attention_merge(o->h_out, o->h_state, o->h_chunks, n_chunk, rows, hd);
    TRY(op->copy_to_backend(be, out, o->h_out, sizeof(float) * (size_t)(rows * hd)));
    o->stats.bytes_host += host_bytes;
    o->stats.bytes_partial += sizeof(float) * (uint64_t)rows * (uint64_t)(hd + (S > 0 ? hd + 2 : 0) + hd);
    o->stats.n_split++;
    return TRI_STATUS_OK;
}

tri_status tri__kv_store_attend_split(tri__kv_store *kv, int32_t il, float *out, const float *q, const int32_t *q_pos,
                                      int32_t m, int32_t n_head, int32_t end, const tri__kv_tree *tree, float softcap) {
    TRI_ASSERT(tri__kv_store_splits(kv, il) && end >= kv->split_dev && m > 0);
    tri__kv_offload *o = kv->off;
    const int64_t hd = kv->head_dim;
    const int64_t stride = (int64_t)kv->n_head_kv * hd, row = tri__kv_store_row_bytes(kv);
    const int32_t S = kv->split_dev, s = slot_of(kv, il);
    for (int32_t h = 0; h < kv->n_head_kv; h++) {
        int64_t off = tri__dtype_row_bytes(kv->type, h * hd);
        o->dev_spans[h] = (tri__kv_span){.pos0 = 0, .n = S, .k = (const char *)o->buf_k[s] + off,
                                         .v = (const char *)o->buf_v[s] + off, .stride = stride};
        o->host_spans[h] = (tri__kv_span){.pos0 = S, .n = end - S, .k = (const char *)o->host_k[il] + S * row + off,
                                          .v = (const char *)o->host_v[il] + S * row + off, .stride = stride};
    }
    tri__kv_view dev = {kv->type, kv->n_head_kv, o->dev_spans, o->split_head_span, tree, false, softcap};
    tri__kv_view host = {kv->type, kv->n_head_kv, o->host_spans, o->split_head_span, tree, false, softcap};
    return split_run(kv, out, q, q_pos, m, n_head, &dev, &host, 2 * (uint64_t)(end - S) * (uint64_t)row);
}

// Grows the mixed split's descriptors to n spans and its f16 staging to bytes.
static tri_status mixed_reserve(tri__kv_offload *o, int32_t n, size_t bytes) {
    if (n > o->mspans_cap) {
        tri__kv_span *d = realloc(o->mdev, sizeof *d * (size_t)n), *h = d ? realloc(o->mhost, sizeof *h * (size_t)n)
                                                                           : NULL;
        if (d) o->mdev = d;
        if (h) o->mhost = h;
        if (!d || !h) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: mixed split spans (%d)", n);
        o->mspans_cap = n;
    }
    if (bytes > o->mstage_cap) {
        free(o->mstage);
        o->mstage = malloc(bytes);
        o->mstage_cap = o->mstage ? bytes : 0;
        if (!o->mstage) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv cache: mixed split f16 rows (%zu bytes)", bytes);
    }
    return TRI_STATUS_OK;
}

tri_status tri__kv_store_attend_split_view(tri__kv_store *kv, int32_t il, float *out, const float *q,
                                           const int32_t *q_pos, int32_t m, int32_t n_head, const tri__kv_view *view) {
    TRI_ASSERT(tri__kv_store_splits(kv, il) && m > 0 && view->span_types && view->n_head_kv == kv->n_head_kv);
    tri__kv_offload *o = kv->off;
    tri__backend *be = kv->be;
    const int64_t hd = kv->head_dim, kd = (int64_t)kv->n_head_kv * hd;
    const int32_t S = kv->split_dev, s = slot_of(kv, il), nkv = kv->n_head_kv;
    const int32_t per = view->head_span[1] - view->head_span[0], n = view->head_span[nkv];
    for (int32_t h = 0; h < nkv; h++)
        if (view->head_span[h + 1] - view->head_span[h] != per)
            return tri__fail(TRI_STATUS_INTERNAL, "kv cache: a split view whose heads have other spans");
    // head 0's f16 rows at or past S, whole rows (every head's), copied down once
    size_t stage = 0;
    for (int32_t i = 0; i < per; i++) {
        const tri__kv_span *sp = &view->spans[i];
        int32_t a = sp->pos0 > S ? sp->pos0 : S, b = sp->pos0 + sp->n;
        if (sp->type == TRI_DTYPE_F16 && b > a) stage += sizeof(uint16_t) * (size_t)((b - a) * kd);
    }
    TRY(mixed_reserve(o, n, 2 * stage));  // keys, then values
    size_t at = 0;
    uint64_t host_bytes = 0;
    for (int32_t i = 0; i < per; i++) {
        const tri__kv_span *sp0 = &view->spans[i];
        const bool own = sp0->type == kv->type;  // the store's rows; else f16 rows elsewhere
        TRI_ASSERT(!sp0->pos && (own || sp0->type == TRI_DTYPE_F16) && sp0->stride == kd);
        int32_t a = sp0->pos0 > S ? sp0->pos0 : S, b = sp0->pos0 + sp0->n, nd = S - sp0->pos0;
        nd = nd < 0 ? 0 : nd > sp0->n ? sp0->n : nd;  // rows below S: the device's
        const size_t bytes = b > a ? sizeof(uint16_t) * (size_t)((b - a) * kd) : 0;
        char *sk = (char *)o->mstage + at, *sv = sk + stage;
        if (!own && b > a) {
            TRY(be->ops->copy_to_host(be, sk, (const char *)sp0->k + (int64_t)(a - sp0->pos0) * kd * 2, bytes));
            TRY(be->ops->copy_to_host(be, sv, (const char *)sp0->v + (int64_t)(a - sp0->pos0) * kd * 2, bytes));
            at += bytes;
        }
        for (int32_t h = 0; h < nkv; h++) {
            const tri__kv_span *sp = &view->spans[view->head_span[h] + i];
            int32_t j = h * per + i;
            o->mdev[j] = *sp;
            o->mdev[j].n = nd;
            o->mhost[j] = *sp;
            o->mhost[j].pos0 = a;
            o->mhost[j].n = b > a ? b - a : 0;
            if (b <= a) continue;
            if (own) {  // the rows where they lie: the host region at the same offset as in the buffer
                int64_t off = (const char *)sp->k - (const char *)o->buf_k[s] +
                              tri__dtype_row_bytes(kv->type, (int64_t)(a - sp->pos0) * kd);
                o->mhost[j].k = (const char *)o->host_k[il] + off;
                o->mhost[j].v = (const char *)o->host_v[il] + off;
                if (h == 0) host_bytes += 2 * (uint64_t)tri__dtype_row_bytes(kv->type, (int64_t)(b - a) * kd);
            } else {  // head h's columns of the staged rows
                o->mhost[j].k = sk + ((const char *)sp->k - (const char *)sp0->k);
                o->mhost[j].v = sv + ((const char *)sp->v - (const char *)sp0->v);
            }
        }
    }
    TRY(be->ops->synchronize(be));  // the staged rows are here
    for (int32_t h = 0; h <= nkv; h++) o->mhead[h] = h * per;
    tri__kv_view dev = {kv->type, nkv, o->mdev, o->mhead, view->tree, true, view->softcap};
    tri__kv_view host = {kv->type, nkv, o->mhost, o->mhead, view->tree, true, view->softcap};
    return split_run(kv, out, q, q_pos, m, n_head, &dev, &host, host_bytes);
}

tri_status tri__kv_host_attention_gbps(int32_t n_threads, int32_t m, int32_t n_head, int32_t n_head_kv,
                                       int32_t head_dim, int32_t rows, int32_t reps, double *gbps) {
    *gbps = 0;
    if (m <= 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 || rows <= 0 || reps <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "host attention probe: %d queries, %d/%d heads of %d, %d rows",
                         m, n_head, n_head_kv, head_dim, rows);
    const int64_t kd = (int64_t)n_head_kv * head_dim, rows_bytes = (int64_t)rows * kd * 2;
    tri__backend *be = NULL;
    uint16_t *k = malloc((size_t)rows_bytes), *v = malloc((size_t)rows_bytes);
    float *q = malloc(sizeof(float) * (size_t)((int64_t)m * n_head * head_dim));
    int32_t *q_pos = malloc(sizeof(int32_t) * (size_t)m);
    tri__kv_span *spans = calloc((size_t)n_head_kv, sizeof *spans);
    int32_t *head_span = calloc((size_t)n_head_kv + 1, sizeof *head_span);
    float *chunks = NULL;
    tri_status st = TRI_STATUS_OK;
    if (!k || !v || !q || !q_pos || !spans || !head_span) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "host attention probe: %lld bytes of rows", (long long)rows_bytes);
        goto done;
    }
    // small f16 values (exponent of 2^-4 .. 2^-1, varying mantissas): scores stay finite
    for (int64_t i = 0; i < rows_bytes / 2; i++) {
        k[i] = (uint16_t)(0x2c00 | ((i * 2654435761u) >> 7 & 0x3ff) | (i & 1) << 15);
        v[i] = (uint16_t)(0x3000 | ((i * 40503u) >> 3 & 0x3ff));
    }
    for (int64_t i = 0; i < (int64_t)m * n_head * head_dim; i++) q[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int32_t i = 0; i < m; i++) q_pos[i] = rows + i;  // every key visible
    for (int32_t h = 0; h < n_head_kv; h++) {
        spans[h] = (tri__kv_span){.pos0 = 0, .n = rows, .k = k + (int64_t)h * head_dim, .v = v + (int64_t)h * head_dim,
                                  .stride = kd};
        head_span[h] = h;
    }
    head_span[n_head_kv] = n_head_kv;
    tri__kv_view view = {TRI_DTYPE_F16, n_head_kv, spans, head_span, NULL, false, 0};
    if (n_threads <= 0) n_threads = split_default_threads(NULL);  // the machine's cores less one
    if ((st = tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_AUTO, &be))) goto done;
    int64_t n_chunk;
    if ((st = tri__cpu_attention_chunks(be, NULL, &n_chunk, q, q_pos, m, n_head, head_dim, &view))) goto done;
    chunks = malloc(sizeof(float) * (size_t)(n_chunk * m * n_head * (head_dim + 2)));
    if (!chunks) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "host attention probe: partials");
        goto done;
    }
    double best = 0;
    for (int32_t r = 0; r <= reps; r++) {  // the first is the warm-up
        double t0 = tri__now_seconds();
        if ((st = tri__cpu_attention_chunks(be, chunks, &n_chunk, q, q_pos, m, n_head, head_dim, &view))) goto done;
        double s = tri__now_seconds() - t0;
        if (r > 0 && (best == 0 || s < best)) best = s;
    }
    *gbps = best > 0 ? 2.0 * (double)rows_bytes / best / 1e9 : 0;

done:
    tri__backend_free(be);
    free(k), free(v), free(q), free(q_pos), free(spans), free(head_span), free(chunks);
    return st;
}
