// policy-mixed.c - the full cache in two precisions (kv_type mixed, after MiKV): every position's
// keys and values in q4_0 (the store), and the attention sinks and the recent window in f16 as
// well; a step's view reads the f16 rows where it has them and the q4_0 rows for everything else
// (docs/kv-policies.md, "Mixed precision"). A view of two types: its spans carry their own
// (backend.h span_types), which the CPU attention reads.
#include <string.h>

#include "dtype.h"
#include "kv-policy-impl.h"

struct tri__mixed_state {
    int32_t sink;    // positions 0 .. sink - 1 in f16 (the attention sinks)
    int32_t recent;  // the recent window: a step at n0 reads positions from n0 - recent on in f16
    int32_t ring;    // rows of the f16 ring: recent + a step + a rollback of a step
    void **sk, **sv; // (n_layer) -> (sink, n_head_kv * head_dim) f16 backend: the sinks
    void **rk, **rv; // (n_layer) -> (ring, n_head_kv * head_dim) f16 backend: position i >= sink
                     // in row (i - sink) % ring
};

static void mixed_free(tri__kv_policy *p) {
    tri__mixed_state *s = p->mixed;
    if (!s) return;
    for (int32_t il = 0; il < p->n_layer; il++) {
        if (s->sk) p->be->ops->free(p->be, s->sk[il]);
        if (s->sv) p->be->ops->free(p->be, s->sv[il]);
        if (s->rk) p->be->ops->free(p->be, s->rk[il]);
        if (s->rv) p->be->ops->free(p->be, s->rv[il]);
    }
    free(s->sk), free(s->sv), free(s->rk), free(s->rv);
    free(s);
    p->mixed = NULL;
}

static tri_status mixed_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    // per head: the sinks, the q4_0 rows between, the window in the ring (two spans where it wraps)
    TRY(tri__kv_policy_common_init(p, 4));
    tri__mixed_state *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv type mixed");
    p->mixed = s;
    s->sink = p->p.sink > 0 ? p->p.sink : 16;
    s->recent = p->p.recent > 0 ? p->p.recent : 240;
    s->ring = s->recent + 2 * p->max_step;
    const size_t row = sizeof(uint16_t) * (size_t)kv_dim(p);
    ALLOC(s->sk, p->n_layer);
    ALLOC(s->sv, p->n_layer);
    ALLOC(s->rk, p->n_layer);
    ALLOC(s->rv, p->n_layer);
    for (int32_t il = 0; il < p->n_layer; il++) {
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->sink, &s->sk[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->sink, &s->sv[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->ring, &s->rk[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->ring, &s->rv[il]));
    }
    return TRI_STATUS_OK;
fail:
    return st;
}

// The first position a step at n0 reads in f16 past the sinks.
static int32_t window_start(const tri__mixed_state *s, int32_t n0) {
    return n0 - s->recent > s->sink ? n0 - s->recent : s->sink;
}

// Writes the step's rows k, v (m, n_head_kv * head_dim) f32 at n0 in f16: the sinks' in place,
// the rest into the ring (in pieces where it wraps).
static tri_status write_f16(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const float *k, const float *v) {
    tri__mixed_state *s = p->mixed;
    const tri__backend_ops *op = p->be->ops;
    const int64_t kd = kv_dim(p), row = 2 * kd;
    for (int32_t done = 0; done < m;) {
        int32_t pos = n0 + done, n = m - done;
        char *dk, *dv;
        if (pos < s->sink) {
            if (n > s->sink - pos) n = s->sink - pos;
            dk = (char *)s->sk[il] + pos * row, dv = (char *)s->sv[il] + pos * row;
        } else {
            int32_t slot = (pos - s->sink) % s->ring;
            if (n > s->ring - slot) n = s->ring - slot;
            dk = (char *)s->rk[il] + slot * row, dv = (char *)s->rv[il] + slot * row;
        }
        TRY(op->convert(p->be, dk, TRI_DTYPE_F16, k + done * kd, n * kd));
        TRY(op->convert(p->be, dv, TRI_DTYPE_F16, v + done * kd, n * kd));
        done += n;
    }
    return TRI_STATUS_OK;
}

static tri_status mixed_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                              int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)q, (void)weight_sums;
    tri__mixed_state *s = p->mixed;
    const int32_t n0 = p->step_n0;
    TRY(tri__kv_store_write(p->kv, il, n0, p->step_m, k, v));  // q4_0, every position
    TRY(write_f16(p, il, n0, p->step_m, k, v));
    const int64_t kd = kv_dim(p), hd = p->head_dim, row = 2 * kd;
    const int32_t lo = window_start(s, n0), sinks = end < s->sink ? end : s->sink;
    int32_t ns = 0;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->head_span[h] = ns;
        const int64_t off = 2 * h * hd;
        p->spans[ns++] = (tri__kv_span){.pos0 = 0, .n = sinks, .k = (const char *)s->sk[il] + off,
                                        .v = (const char *)s->sv[il] + off, .stride = kd, .type = TRI_DTYPE_F16};
        if (lo > s->sink) {  // between the sinks and the window: q4_0
            int64_t qoff = tri__dtype_row_bytes(p->kv->type, s->sink * kd + h * hd);
            p->spans[ns++] = (tri__kv_span){.pos0 = s->sink, .n = lo - s->sink, .k = (const char *)p->kv->k[il] + qoff,
                                            .v = (const char *)p->kv->v[il] + qoff, .stride = kd, .type = p->kv->type};
        }
        for (int32_t pos = lo; pos < end;) {  // the window and the step, from the ring
            int32_t slot = (pos - s->sink) % s->ring, n = end - pos < s->ring - slot ? end - pos : s->ring - slot;
            p->spans[ns++] = (tri__kv_span){.pos0 = pos, .n = n, .k = (const char *)s->rk[il] + slot * row + off,
                                            .v = (const char *)s->rv[il] + slot * row + off, .stride = kd,
                                            .type = TRI_DTYPE_F16};
            pos += n;
        }
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
    p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                             .head_span = p->head_span, .span_types = true};
    *view = &p->view;
    return TRI_STATUS_OK;
}

static tri_status mixed_begin(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base) {
    (void)base;
    if (n0 + m > p->hw) p->hw = n0 + m;  // the step's f16 rows overwrite older ones in the ring
    return TRI_STATUS_OK;
}

// A rollback to n keeps the f16 rows the next step reads (positions from window_start(n)) only
// while the ring still holds them: rows of positions below hw - ring are overwritten.
static tri_status mixed_truncate(tri__kv_policy *p, int32_t n) {
    const tri__mixed_state *s = p->mixed;
    int32_t need = window_start(s, n), have = p->hw - s->ring;
    if (n <= s->sink || need >= have) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_UNSUPPORTED,
                     "kv_type mixed: cannot roll back to %d of %d positions: the f16 window of %d tokens from %d "
                     "was overwritten (the ring keeps %d rows)",
                     n, p->kv->n, s->recent, need, s->ring);
}

static void mixed_reset(tri__kv_policy *p) { p->hw = 0; }

const tri__kv_policy_ops tri__kv_policy_mixed_ops = {
    .name = "full",  // the full cache, in two precisions
    .init = mixed_init,
    .free = mixed_free,
    .begin = mixed_begin,
    .layer = mixed_layer,
    .truncate = mixed_truncate,
    .reset = mixed_reset,
};
