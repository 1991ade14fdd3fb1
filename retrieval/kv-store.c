// kv-store.c - per-layer K/V storage with append and rollback.
#include "kv-store.h"

#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"

int64_t tri__kv_store_row_bytes(const tri__kv_store *kv) {
    return (int64_t)kv->n_head_kv * kv->head_dim * (kv->type == TRI_DTYPE_F16 ? 2 : 4);
}

tri_status tri__kv_store_init(tri__kv_store *kv, tri__backend *be, tri_dtype type, int32_t n_layer,
                              int32_t n_head_kv, int32_t head_dim, int32_t capacity) {
    memset(kv, 0, sizeof *kv);
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv cache: type %s, want f16 or f32",
                         tri_dtype_name(type));
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || capacity <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv cache: sizes must be positive (layers %d, kv heads %d, head dim %d, "
                         "capacity %d)", n_layer, n_head_kv, head_dim, capacity);
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
    for (int32_t il = 0; il < n_layer; il++) {
        if ((st = be->ops->alloc(be, bytes, &kv->k[il]))) goto fail;
        if ((st = be->ops->alloc(be, bytes, &kv->v[il]))) goto fail;
    }
    return TRI_STATUS_OK;

fail:
    tri__kv_store_free(kv);
    return st;
}

void tri__kv_store_free(tri__kv_store *kv) {
    if (kv->be) {
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
    int64_t esz = kv->type == TRI_DTYPE_F16 ? 2 : 4;
    for (int32_t h = 0; h < kv->n_head_kv; h++) {
        int64_t off = (int64_t)h * kv->head_dim * esz;
        kv->spans[h] = (tri__kv_span){
            .pos0 = 0,
            .n = n_pos,
            .k = (const char *)kv->k[il] + off,
            .v = (const char *)kv->v[il] + off,
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
