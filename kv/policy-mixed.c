// policy-mixed.c - the full cache in two precisions (kv_type mixed, after MiKV): every position's
// keys and values in q4_0 (the store), and the attention sinks and the recent window in f16 as
// well. Each query reads its own window: a query at position pos reads the f16 rows of the sinks
// and of positions max(pos - recent, sink) .. pos, the q4_0 rows of everything between
// (docs/kv-policies.md, "Mixed precision"), so that a pass computes the same whatever its steps
// (a prefill in batches, a speculative verification of several tokens, one token at a time). A
// view of two types: its spans carry their own (backend.h span_types), which the CPU attention
// reads. The q4_0 store may keep its last layers in host memory (tri__kv_policy_wrap_mixed), which
// stream through the device as the full cache's do; the f16 rows stay in backend memory.
#include <string.h>

#include "dtype.h"
#include "kv-policy-impl.h"

struct tri__mixed_state {
    int32_t sink;    // positions 0 .. sink - 1 in f16 (the attention sinks)
    int32_t recent;  // the recent window: a query at pos reads positions from pos - recent on in f16
    int32_t keep;    // f16 rows past the sinks a step keeps below its end: recent + a step + a
                     // rollback (params rollback, 0: a step)
    int32_t cap;     // rows of each f16 buffer: keep and half as many again, so that moving the
                     // kept rows to its front happens once every keep / 2 tokens or more
    int32_t *base;   // (n_layer) the position in row 0 of layer il's buffer (>= sink)
    void **sk, **sv; // (n_layer) -> (sink, n_head_kv * head_dim) f16 backend: the sinks
    void **rk, **rv; // (n_layer) -> (cap, n_head_kv * head_dim) f16 backend: position i >= sink in
                     // row i - base[il], one run in position order (never wrapping: the attention
                     // then reads a query's window as one span, the same bits whatever its pass)
    // a step of several queries: the q4_0 rows they read (positions sink .. dq_n - 1) dequantized
    // once per layer instead of once per query; the attention over f32 rows of those values gives
    // the bits of reading the blocks in place (tests/test-kv-quant.c, cpu_attention_*_reads_rows_in_place)
    float *dk, *dv;  // (dq_cap, n_head_kv * head_dim) f32 backend, or NULL
    int32_t dq_cap;  // rows
    int32_t dq_n;    // positions below it hold layer dq_layer's values; 0: none (in place)
    int32_t dq_layer;
    int32_t *ids;    // (dq_cap) host: sink, sink + 1, ...
    // ---- MiKV's heavy hitters (params heavy > 0): per (layer, KV head) up to `heavy` positions past
    // the window kept in f16 too, by their accumulated attention (H2O's scores) ----
    int32_t heavy;
    float *score;    // (n_layer, n_head_kv, capacity) host: attention each position received so far,
                     // summed over the queries and the KV head's query heads
    int32_t *hpos;   // (n_layer, n_head_kv, heavy) host: the position in each slot of the pool
    int32_t *hn;     // (n_layer, n_head_kv) host: slots used
    int32_t *hsorted; // (heavy) host scratch: one head's pool positions, ascending
    void **hk, **hv; // (n_layer) -> (n_head_kv, heavy, head_dim) f16 backend: the pool's rows
    int32_t *lo_done; // (n_layer) positions below it have left the window (and met the pool)
    float *ws;       // (n_head_kv * capacity) backend: one query's weight sums
    float *ws_host;  // (n_head_kv * capacity) host
};

// The most bytes the dequantized rows may take (K and V): past it a step reads the blocks in place.
#define MIXED_DQ_BYTES ((size_t)64 << 20)

static void mixed_free(tri__kv_policy *p) {
    tri__mixed_state *s = p->mixed;
    if (!s) return;
    for (int32_t il = 0; il < p->n_layer; il++) {
        if (s->sk) p->be->ops->free(p->be, s->sk[il]);
        if (s->sv) p->be->ops->free(p->be, s->sv[il]);
        if (s->rk) p->be->ops->free(p->be, s->rk[il]);
        if (s->rv) p->be->ops->free(p->be, s->rv[il]);
    }
    p->be->ops->free(p->be, s->dk), p->be->ops->free(p->be, s->dv);
    for (int32_t il = 0; s->hk && il < p->n_layer; il++) p->be->ops->free(p->be, s->hk[il]);
    for (int32_t il = 0; s->hv && il < p->n_layer; il++) p->be->ops->free(p->be, s->hv[il]);
    p->be->ops->free(p->be, s->ws);
    free(s->hk), free(s->hv), free(s->score), free(s->hpos), free(s->hn), free(s->hsorted), free(s->lo_done);
    free(s->ws_host);
    free(s->sk), free(s->sv), free(s->rk), free(s->rv), free(s->base), free(s->ids);
    free(s);
    p->mixed = NULL;
}

static void mixed_reset(tri__kv_policy *p) {
    tri__mixed_state *s = p->mixed;
    for (int32_t il = 0; il < p->n_layer; il++) s->base[il] = s->sink;
    if (!s->heavy) return;
    memset(s->score, 0, sizeof(float) * (size_t)p->n_layer * (size_t)p->n_head_kv * (size_t)p->kv->capacity);
    memset(s->hn, 0, sizeof(int32_t) * (size_t)p->n_layer * (size_t)p->n_head_kv);
    for (int32_t il = 0; il < p->n_layer; il++) s->lo_done[il] = s->sink;
}

static tri_status mixed_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    // per head: the sinks, the q4_0 rows between (in heavy + 1 runs around the heavy hitters), the
    // heavy hitters, the window
    const int32_t heavy = p->p.heavy > 0 ? p->p.heavy : 0;
    TRY(tri__kv_policy_common_init(p, heavy ? heavy + 4 : 3));
    tri__mixed_state *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv type mixed");
    p->mixed = s;
    s->heavy = heavy;
    s->sink = p->p.sink > 0 ? p->p.sink : 16;
    s->recent = p->p.recent > 0 ? p->p.recent : 240;
    s->keep = s->recent + p->max_step + (p->p.rollback > 0 ? p->p.rollback : p->max_step);
    s->cap = s->keep + (s->keep + 1) / 2;
    const size_t row = sizeof(uint16_t) * (size_t)kv_dim(p);
    ALLOC(s->base, p->n_layer);
    ALLOC(s->sk, p->n_layer);
    ALLOC(s->sv, p->n_layer);
    ALLOC(s->rk, p->n_layer);
    ALLOC(s->rv, p->n_layer);
    for (int32_t il = 0; il < p->n_layer; il++) {
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->sink, &s->sk[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->sink, &s->sv[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->cap, &s->rk[il]));
        TRY(p->be->ops->alloc(p->be, row * (size_t)s->cap, &s->rv[il]));
    }
    if (heavy) {
        const int64_t lh = (int64_t)p->n_layer * p->n_head_kv, cap = p->kv->capacity;
        ALLOC(s->score, lh * cap);
        ALLOC(s->hpos, lh * heavy);
        ALLOC(s->hn, lh);
        ALLOC(s->hsorted, heavy);
        ALLOC(s->lo_done, p->n_layer);
        ALLOC(s->ws_host, (int64_t)p->n_head_kv * cap);
        ALLOC(s->hk, p->n_layer);
        ALLOC(s->hv, p->n_layer);
        for (int32_t il = 0; il < p->n_layer; il++) {
            TRY(p->be->ops->alloc(p->be, row * (size_t)heavy, &s->hk[il]));
            TRY(p->be->ops->alloc(p->be, row * (size_t)heavy, &s->hv[il]));
        }
        TRY(p->be->ops->alloc(p->be, sizeof(float) * (size_t)(p->n_head_kv * cap), (void **)&s->ws));
    }
    mixed_reset(p);
    return TRI_STATUS_OK;
fail:
    return st;
}

// The first position a query at pos reads in f16 past the sinks.
static int32_t window_start(const tri__mixed_state *s, int32_t pos) {
    return pos - s->recent > s->sink ? pos - s->recent : s->sink;
}

// Before writing positions up to end into layer il's buffer: where they would not fit, the last
// keep rows before end that it holds move to its front (in pieces that do not overlap).
static tri_status make_room(tri__kv_policy *p, int32_t il, int32_t end) {
    tri__mixed_state *s = p->mixed;
    if (end - s->base[il] <= s->cap) return TRI_STATUS_OK;
    const int64_t row = 2 * (int64_t)kv_dim(p);
    int32_t nb = end - s->keep, from = nb - s->base[il], n = p->step_n0 - nb;  // rows [from, from + n) to [0, n)
    TRI_ASSERT(from > 0 && n >= 0);
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < from ? n - done : from;
        for (int which = 0; which < 2; which++) {
            char *buf = (which ? s->rv : s->rk)[il];
            TRY(p->be->ops->copy(p->be, buf + done * row, buf + (from + done) * row, (size_t)(k * row)));
        }
        done += k;
    }
    s->base[il] = nb;
    return TRI_STATUS_OK;
}

// The f16 row of position pos of layer il, keys (which 0) or values (1).
static char *f16_row(tri__kv_policy *p, int32_t il, int which, int32_t pos) {
    tri__mixed_state *s = p->mixed;
    const int64_t row = 2 * (int64_t)kv_dim(p);
    if (pos < s->sink) return (char *)(which ? s->sv : s->sk)[il] + pos * row;
    return (char *)(which ? s->rv : s->rk)[il] + (int64_t)(pos - s->base[il]) * row;
}

// Writes the step's rows k, v (m, n_head_kv * head_dim) f32 at n0 in f16: the sinks' in place,
// the rest into the buffer.
static tri_status write_f16(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const float *k, const float *v) {
    tri__mixed_state *s = p->mixed;
    const tri__backend_ops *op = p->be->ops;
    const int64_t kd = kv_dim(p);
    TRY(make_room(p, il, n0 + m));
    for (int32_t done = 0; done < m;) {
        int32_t pos = n0 + done, n = pos < s->sink ? (m - done < s->sink - pos ? m - done : s->sink - pos) : m - done;
        TRY(op->convert(p->be, f16_row(p, il, 0, pos), TRI_DTYPE_F16, k + done * kd, n * kd));
        TRY(op->convert(p->be, f16_row(p, il, 1, pos), TRI_DTYPE_F16, v + done * kd, n * kd));
        done += n;
    }
    return TRI_STATUS_OK;
}

// The view of layer il over positions [0, end) for queries that read f16 from lo on (and the sinks):
// per head the sinks, the q4_0 rows between, the f16 rows of the window and the step.
static const tri__kv_view *mixed_view(tri__kv_policy *p, int32_t il, int32_t lo, int32_t end) {
    tri__mixed_state *s = p->mixed;
    const int64_t kd = kv_dim(p), hd = p->head_dim;
    const int32_t sinks = end < s->sink ? end : s->sink;
    // where the store's layer lies in backend memory: its own, or an offloaded layer's buffer, which
    // the step's write made hold the layer's rows
    tri__kv_view q4_storage;
    const tri__kv_view *q4 = tri__kv_store_view(p->kv, il, end, &q4_storage);
    int32_t ns = 0;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->head_span[h] = ns;
        const int64_t off = 2 * h * hd;
        p->spans[ns++] = (tri__kv_span){.pos0 = 0, .n = sinks, .k = (const char *)s->sk[il] + off,
                                        .v = (const char *)s->sv[il] + off, .stride = kd, .type = TRI_DTYPE_F16};
        // between the sinks and the window: q4_0 (dequantized once for the step, or the store's head h
        // in place), in runs around the heavy hitters of the head
        const bool dq = s->dq_layer == il && lo <= s->dq_n;
        int32_t nh = 0;
        if (s->heavy) {
            const int32_t *hp = s->hpos + ((int64_t)il * p->n_head_kv + h) * s->heavy;
            nh = s->hn[(int64_t)il * p->n_head_kv + h];
            for (int32_t a = 0; a < nh; a++) {  // ascending (insertion: a few dozen)
                int32_t x = hp[a], b = a;
                while (b > 0 && s->hsorted[b - 1] > x) s->hsorted[b] = s->hsorted[b - 1], b--;
                s->hsorted[b] = x;
            }
        }
        for (int32_t r = 0, a = s->sink; r <= nh && a < lo; r++) {
            int32_t b = r < nh ? s->hsorted[r] : lo;
            if (b > a) {
                const int64_t qa = tri__dtype_row_bytes(p->kv->type, a * kd);
                if (dq)
                    p->spans[ns++] = (tri__kv_span){.pos0 = a, .n = b - a, .k = s->dk + (a - s->sink) * kd + h * hd,
                                                    .v = s->dv + (a - s->sink) * kd + h * hd, .stride = kd,
                                                    .type = TRI_DTYPE_F32};
                else
                    p->spans[ns++] = (tri__kv_span){.pos0 = a, .n = b - a, .k = (const char *)q4->spans[h].k + qa,
                                                    .v = (const char *)q4->spans[h].v + qa, .stride = kd,
                                                    .type = p->kv->type};
            }
            a = b + 1;
        }
        if (nh > 0) {  // the heavy hitters' f16 rows, in their slots' order
            const int64_t slot0 = (int64_t)h * s->heavy * hd * 2;
            p->spans[ns++] = (tri__kv_span){.n = nh, .k = (const char *)s->hk[il] + slot0,
                                            .v = (const char *)s->hv[il] + slot0, .stride = hd,
                                            .pos = s->hpos + ((int64_t)il * p->n_head_kv + h) * s->heavy,
                                            .type = TRI_DTYPE_F16};
        }
        if (end > lo)  // the window and the step
            p->spans[ns++] = (tri__kv_span){.pos0 = lo, .n = end - lo, .k = f16_row(p, il, 0, lo) + off,
                                            .v = f16_row(p, il, 1, lo) + off, .stride = kd, .type = TRI_DTYPE_F16};
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
    p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                             .head_span = p->head_span, .span_types = true};
    return &p->view;
}

// A step of several queries on layer il (not split: the host reads the blocks where they lie): the
// q4_0 rows its last query reads, dequantized once into dk, dv (within MIXED_DQ_BYTES), else none.
static tri_status dequantize_step(tri__kv_policy *p, int32_t il, int32_t end) {
    tri__mixed_state *s = p->mixed;
    const tri__backend_ops *op = p->be->ops;
    const int64_t kd = kv_dim(p);
    const int32_t n = window_start(s, end - 1) - s->sink;  // rows: positions sink .. sink + n - 1
    s->dq_n = 0;
    if (p->step_m < 2 || n <= 0 || tri__kv_store_splits(p->kv, il) ||
        2 * sizeof(float) * (size_t)n * (size_t)kd > MIXED_DQ_BYTES)
        return TRI_STATUS_OK;
    if (n > s->dq_cap) {
        int32_t cap = n + n / 2 + 64;
        if (2 * sizeof(float) * (size_t)cap * (size_t)kd > MIXED_DQ_BYTES)
            cap = (int32_t)(MIXED_DQ_BYTES / (2 * sizeof(float) * (size_t)kd));
        op->free(p->be, s->dk), op->free(p->be, s->dv);
        s->dk = s->dv = NULL, s->dq_cap = 0;
        int32_t *ids = realloc(s->ids, sizeof *ids * (size_t)cap);
        if (!ids) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv_type mixed: %d row ids", cap);
        s->ids = ids;
        TRY(op->alloc(p->be, sizeof(float) * (size_t)cap * (size_t)kd, (void **)&s->dk));
        TRY(op->alloc(p->be, sizeof(float) * (size_t)cap * (size_t)kd, (void **)&s->dv));
        s->dq_cap = cap;
    }
    for (int32_t i = 0; i < n; i++) s->ids[i] = s->sink + i;
    tri__kv_view storage;
    const tri__kv_view *q4 = tri__kv_store_view(p->kv, il, end, &storage);  // head 0: the layer's row 0
    TRY(op->get_rows(p->be, s->dk, q4->spans[0].k, p->kv->type, p->kv->capacity, kd, s->ids, n));
    TRY(op->get_rows(p->be, s->dv, q4->spans[0].v, p->kv->type, p->kv->capacity, kd, s->ids, n));
    s->dq_n = s->sink + n, s->dq_layer = il;
    return TRI_STATUS_OK;
}

// Stores the step's rows in both precisions; the view returned is the step's first query's (the
// forward pass asks for each query's own, tri__kv_policy_mixed_view).
static tri_status mixed_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                              int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)q, (void)weight_sums;
    tri__mixed_state *s = p->mixed;
    const int32_t n0 = p->step_n0;
    TRY(tri__kv_store_write(p->kv, il, n0, p->step_m, k, v));  // q4_0, every position
    TRY(write_f16(p, il, n0, p->step_m, k, v));
    TRY(dequantize_step(p, il, end));
    *view = mixed_view(p, il, window_start(s, n0), end);
    return TRI_STATUS_OK;
}

int32_t tri__kv_policy_mixed_lo(const tri__kv_policy *p, int32_t pos) { return window_start(p->mixed, pos); }

const tri__kv_view *tri__kv_policy_mixed_view(tri__kv_policy *p, int32_t il, int32_t lo) {
    const int32_t end = p->step_n0 + p->step_m;
    TRI_ASSERT(p->mixed && p->in_step && lo >= p->mixed->sink && lo >= p->mixed->base[il]);  // still held
    return mixed_view(p, il, lo, end);
}

bool tri__kv_policy_mixed_heavy(const tri__kv_policy *p) { return p->mixed && p->mixed->heavy > 0; }

// Positions lo_done .. lo - 1 of layer il leave the window: each KV head keeps one in its pool (a copy
// of its f16 row) while the pool has room, or in place of the pool's lowest score when its own is
// higher (ties keep the pool's); one that does not stay is q4_0 for good.
static tri_status heavy_admit(tri__kv_policy *p, int32_t il, int32_t lo) {
    tri__mixed_state *s = p->mixed;
    const int64_t hd = p->head_dim, cap = p->kv->capacity;
    for (int32_t j = s->lo_done[il]; j < lo; j++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            const int64_t lh = (int64_t)il * p->n_head_kv + h;
            const float *sc = s->score + lh * cap;
            int32_t *hp = s->hpos + lh * s->heavy, slot = s->hn[lh];
            if (slot == s->heavy) {
                int32_t low = 0;
                for (int32_t a = 1; a < s->heavy; a++)
                    if (sc[hp[a]] < sc[hp[low]]) low = a;
                if (!(sc[j] > sc[hp[low]])) continue;
                slot = low;
            } else {
                s->hn[lh]++;
            }
            hp[slot] = j;
            for (int which = 0; which < 2; which++) {
                char *to = (char *)(which ? s->hv : s->hk)[il] + ((int64_t)h * s->heavy + slot) * hd * 2;
                TRY(p->be->ops->copy(p->be, to, f16_row(p, il, which, j) + h * hd * 2, sizeof(uint16_t) * (size_t)hd));
            }
        }
    if (lo > s->lo_done[il]) s->lo_done[il] = lo;
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_mixed_query(tri__kv_policy *p, int32_t il, int32_t pos, const tri__kv_view **view,
                                      float **weight_sums) {
    tri__mixed_state *s = p->mixed;
    const int32_t lo = window_start(s, pos);
    TRI_ASSERT(s->heavy > 0 && p->in_step && lo >= s->base[il]);
    TRY(heavy_admit(p, il, lo));
    *weight_sums = s->ws;
    *view = mixed_view(p, il, lo, p->step_n0 + p->step_m);
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_mixed_scored(tri__kv_policy *p, int32_t il) {
    tri__mixed_state *s = p->mixed;
    const tri__kv_view *v = &p->view;
    const int64_t cap = p->kv->capacity;
    const int32_t n = v->head_span[v->n_head_kv];
    int64_t keys = 0;
    for (int32_t si = 0; si < n; si++) keys += v->spans[si].n;
    TRY(p->be->ops->copy_to_host(p->be, s->ws_host, s->ws, sizeof(float) * (size_t)keys));
    TRY(p->be->ops->synchronize(p->be));
    const float *w = s->ws_host;
    for (int32_t h = 0; h < v->n_head_kv; h++) {
        float *sc = s->score + ((int64_t)il * p->n_head_kv + h) * cap;
        for (int32_t si = v->head_span[h]; si < v->head_span[h + 1]; si++) {
            const tri__kv_span *sp = &v->spans[si];
            for (int32_t j = 0; j < sp->n; j++) sc[sp->pos ? sp->pos[j] : sp->pos0 + j] += *w++;
        }
    }
    return TRI_STATUS_OK;
}

// A rollback to n keeps the f16 rows the next step reads (positions from window_start(n)) only
// while the buffers still hold them: a step keeps `keep` rows below its end, no more.
static tri_status mixed_truncate(tri__kv_policy *p, int32_t n) {
    const tri__mixed_state *s = p->mixed;
    if (s->heavy && n < p->kv->n)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv_type mixed with heavy hitters (kv_mixed_heavy %d): cannot roll "
                         "back to %d of %d positions (their scores and pool keep no history)", s->heavy, n, p->kv->n);
    int32_t need = window_start(s, n), have = s->sink;
    for (int32_t il = 0; il < p->n_layer; il++) have = s->base[il] > have ? s->base[il] : have;
    if (n <= s->sink || need >= have) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_UNSUPPORTED,
                     "kv_type mixed: cannot roll back to %d of %d positions: the f16 window of %d tokens from %d "
                     "is no longer held (f16 rows from %d on: a step keeps %d rows)",
                     n, p->kv->n, s->recent, need, have, s->keep);
}

static tri_status mixed_row_moved(tri__kv_policy *p, int32_t from, int32_t to) {
    const tri__mixed_state *s = p->mixed;
    for (int32_t il = 0; il < p->n_layer; il++) {
        if ((from >= s->sink && from < s->base[il]) || (to >= s->sink && to < s->base[il]) ||
            from - s->base[il] >= s->cap || to - s->base[il] >= s->cap)
            return tri__fail(TRI_STATUS_INTERNAL, "kv_type mixed: moving row %d to %d, f16 rows from %d held", from, to,
                             s->base[il]);
        for (int which = 0; which < 2; which++)
            TRY(p->be->ops->copy(p->be, f16_row(p, il, which, to), f16_row(p, il, which, from),
                                 sizeof(uint16_t) * (size_t)kv_dim(p)));
    }
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_wrap_mixed(tri__kv_policy *p, const tri__kv_policy_params *params, tri__kv_store *kv,
                                     int32_t n_head, int32_t max_step) {
    memset(p, 0, sizeof *p);
    if (kv->type != TRI_DTYPE_Q4_0 || params->kind != TRI_KV_POLICY_FULL || n_head % kv->n_head_kv != 0 ||
        max_step <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv_type mixed: a full cache over a q4_0 store (%s, policy %s)",
                         tri_dtype_name(kv->type), tri__kv_policy_name(params->kind));
    p->p = *params;
    p->ops = &tri__kv_policy_mixed_ops;
    p->kv = kv;
    p->be = kv->be;
    p->n_layer = kv->n_layer;
    p->n_head = n_head;
    p->n_head_kv = kv->n_head_kv;
    p->head_dim = kv->head_dim;
    p->max_step = max_step;
    tri_status st = mixed_init(p);
    if (st) tri__kv_policy_free(p);
    return st;
}

const tri__kv_policy_ops tri__kv_policy_mixed_ops = {
    .name = "full",  // the full cache, in two precisions
    .init = mixed_init,
    .free = mixed_free,
    .layer = mixed_layer,
    .truncate = mixed_truncate,
    .reset = mixed_reset,
    .row_moved = mixed_row_moved,
};
