// policy-retrieval.c - TriForce's retrieval cache: the context cut into chunks, each summarised by its
// mean key per (layer, KV head), and a selection of chunks: the first by full attention's mass for
// the last tokens' queries, later ones by the summaries that score best against them; over its own
// store or over rows borrowed from the full cache, selecting after a step or during the full
// cache's step (docs/kv-policies.md).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kv-policy-impl.h"

// Rows of a quantized gather per get_rows / convert pair (bounds gf32).
enum { GATHER_PIECE = 1024 };

// The policy's rows are of its store's type (src's when borrowing): f16, f32, or a quantized full
// cache's q8_0 / q4_0 blocks (head_dim a multiple of 32, so every head's row is whole blocks).
// Bytes of one position of one layer (every KV head).
static int64_t trow(const tri__kv_policy *p) { return tri__dtype_row_bytes(p->kv->type, kv_dim(p)); }
// Bytes of one KV head's row.
static int64_t hrow(const tri__kv_policy *p) { return tri__dtype_row_bytes(p->kv->type, p->head_dim); }
// Bytes into a layer's rows where head h's row of position pos starts.
static int64_t row_at(const tri__kv_policy *p, int64_t pos, int64_t h) { return pos * trow(p) + h * hrow(p); }

// One head's row of type (f16, f32, q8_0 or q4_0) as n floats.
static void row_to_f32(float *x, const char *row, tri_dtype type, int64_t n) {
    if (tri__dtype_is_quantized(type))
        tri__dequantize_row(x, row, type, n);
    else if (type == TRI_DTYPE_F16)
        for (int64_t d = 0; d < n; d++) x[d] = tri__f16_to_f32(((const uint16_t *)row)[d]);
    else
        memcpy(x, row, sizeof(float) * (size_t)n);
}

// Retrieval: one selection of chunks per (layer, KV head).
typedef struct sel_entry {
    int32_t n_sel;   // cache length when it was made
    int32_t bound;   // chunks below it were candidates; the tokens from it on are attended to
    int32_t *cnt;    // (n_layer * n_head_kv) chunks selected
    int32_t *ids;    // (n_layer * n_head_kv, kmax) ascending chunk ids
} sel_entry;

struct tri__retrieval_state {
    int32_t kmax;             // budget / chunk
    tri__chunk_index **ix;    // (n_layer * n_head_kv) summaries of the complete chunks
    int32_t n_chunks;         // complete chunks summarised
    sel_entry *sel;           // (sel_cap) selections in the order made; the last is current
    int32_t n_sel, sel_cap;
    bool armed;               // select at the end of the next step
    // the query history: the queries of the last tokens the policy ran, whatever steps they came
    // in, which a selection at length len reads (positions max(hist_lo, len - nq) .. len - 1)
    float *hq;                // (hist, n_layer, n_head * head_dim) host: position i's queries in row
                              // i % hist (the heads of KV head h are h * g .. h * g + g - 1)
    int32_t hist;             // rows: nq + max_step, so that a step (at most max_step tokens) or a
                              // rollback into the last one still finds the nq before its end
    int32_t hist_lo, hist_hi; // positions hist_lo .. hist_hi - 1 have their queries in hq, ran
                              // contiguously; hist_hi <= the length (adopted tokens have none)
    int32_t nq;               // tokens a selection reads: params.queries, 0 read as 1
    float *qset;              // (nq * g, head_dim) host: the query vectors one KV head selects by
    // the last step, so that a rollback into it can make the selection it would have made
    int32_t step_n0, step_m;  // the step (step_m 0: none remembered)
    bool step_armed;          // armed when the step began
    float *qrow;              // (max(max_step, nq), n_head * head_dim) host scratch
    int32_t rows_chunks;      // chunks summarised per read
    float *means;             // (rows_chunks, n_head_kv * head_dim) host: a read's chunk means
    float *means_dev;         // the same in backend memory, for keys there (allocated when needed)
    float *summ;              // (n_head_kv, rows_chunks, sdim) host: the summaries by head
    int32_t sdim;             // a summary's width: head_dim (means), 2 * head_dim (bounds: max, min)
    char *krows;              // bounds of keys in device memory: (rows_chunks * chunk) rows, host
    // borrowed rows (p->src; kv-policy.h): positions below tail0 are src's, tail0 .. len - 1 the
    // policy's own, in the ring p->own (position i in row i % ring)
    int32_t ring;
    int32_t tail0;
    void **gk, **gv;          // (n_layer) -> (n_head_kv, budget, head_dim) backend: the current
                              // selection's rows, head h's chunks from row h * budget, in chunk order
    int64_t *offs;            // (n_head_kv * budget) host: where each of those rows is in a layer
    void *stage;              // (n_head_kv * budget, head_dim) host: an offloaded layer's gather
    bool stage_pinned;
    tri_dtype gtype;          // the type of gk/gv's rows: params.gather_type when quantized, else src's
    int64_t grow;             // bytes of one of their rows (head_dim values of gtype)
    float *gf32;              // (GATHER_PIECE, head_dim) f32 backend: quantized gathers go through it
    int32_t *gids;            // (GATHER_PIECE) host: the rows of a piece, as get_rows ids
    void *gstage;             // (n_head_kv * budget) rows of gtype, host: an offloaded layer's
                              // gather quantized before its upload
    uint64_t bytes_up;        // host -> backend: offloaded layers' gathers and ring fills
    // a selection being made during the full cache's step (tri__kv_policy_tap)
    sel_entry tap;            // cnt/ids allocated while armed
    int32_t tap_layers;       // layers done
    int32_t tap_first;        // chunks summarised before it
    struct tri__kv_policy *tap_owner;  // the full policy armed to make it; NULL: none armed
    void *tap_rows;           // (n_layer, K/V, chunk rows) backend: each layer's rows from the
                              // bound to the tap's length, put into the ring once it is taken
    float *tq;                // (nq, n_layer, n_head * head_dim) host: the armed full pass's queries
                              // of positions tq_lo .. tq_hi - 1 (its last nq), position i in row i % nq;
                              // they become the history once the selection is taken
    int32_t tq_lo, tq_hi;
    // a selection by full attention's mass (params.mass, oracle): layer_mass's buffers
    float *mq, *mout;         // (nq, n_head * head_dim) backend: the queries, attention's output
    float *mws;               // (mw_cap) backend: the weight sums per key of a layer's view
    float *mw;                // (mw_cap) host: the same, read back
    int64_t mw_cap;
    int32_t *mpos;            // (nq) host: the queries' positions
    double *mass;             // (n_head_kv, mass_cap) host: a layer's mass per head and chunk
    int32_t mass_cap;
};

// Whether layer il's chunks are summarised by bounds (params.bound, params.bound_layers).
static bool layer_bound(const tri__kv_policy *p, int32_t il) {
    return p->p.bound || (p->p.bound_layers >> (il < 63 ? il : 63) & 1);
}

static void ret_free(tri__kv_policy *p) {
    tri__retrieval_state *s = p->ret;
    if (!s) return;
    if (s->ix)
        for (int32_t i = 0; i < p->n_layer * p->n_head_kv; i++) tri__chunk_index_free(s->ix[i]);
    free(s->ix);
    for (int32_t i = 0; i < s->n_sel; i++) {
        free(s->sel[i].cnt);
        free(s->sel[i].ids);
    }
    free(s->sel);
    free(s->hq);
    free(s->tq);
    free(s->qset);
    free(s->qrow);
    free(s->means);
    p->be->ops->free(p->be, s->means_dev);
    free(s->summ);
    free(s->krows);
    for (int32_t il = 0; il < p->n_layer; il++) {
        if (s->gk) p->be->ops->free(p->be, s->gk[il]);
        if (s->gv) p->be->ops->free(p->be, s->gv[il]);
    }
    free(s->gk);
    free(s->gv);
    free(s->offs);
    p->be->ops->free(p->be, s->gf32);
    free(s->gids);
    free(s->gstage);
    free(s->tap.cnt);
    free(s->tap.ids);
    p->be->ops->free(p->be, s->tap_rows);
    p->be->ops->free(p->be, s->mq);
    p->be->ops->free(p->be, s->mout);
    p->be->ops->free(p->be, s->mws);
    free(s->mw);
    free(s->mpos);
    free(s->mass);
    if (s->stage_pinned) p->be->ops->host_unregister(p->be, s->stage);
    free(s->stage);
    free(s);
    p->ret = NULL;
}

// The state both kinds of retrieval policy keep (after the view descriptors).
static tri_status ret_state_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    tri__retrieval_state *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval");
    p->ret = s;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    s->kmax = p->p.budget / p->p.chunk;
    ALLOC(s->ix, heads);
    s->sdim = p->p.bound || p->p.bound_layers ? 2 * p->head_dim : p->head_dim;  // the widest layer's
    for (int64_t i = 0; i < heads; i++)
        TRY(tri__chunk_index_create(p->p.index, layer_bound(p, (int32_t)(i / p->n_head_kv)) ? 2 * p->head_dim
                                                                                            : p->head_dim, &s->ix[i]));
    s->nq = p->p.queries > 1 ? p->p.queries : 1;
    s->hist = s->nq + p->max_step;
    const int64_t qd = (int64_t)p->n_head * p->head_dim;
    ALLOC(s->hq, (int64_t)s->hist * p->n_layer * qd);
    ALLOC(s->qset, (int64_t)s->nq * qd);
    ALLOC(s->qrow, (int64_t)(p->max_step > s->nq ? p->max_step : s->nq) * qd);
    s->rows_chunks = p->p.chunk < 2048 ? 2048 / p->p.chunk : 1;  // ~2K rows per read
    ALLOC(s->means, (int64_t)s->rows_chunks * kv_dim(p));
    ALLOC(s->summ, (int64_t)s->rows_chunks * p->n_head_kv * s->sdim);
    return TRI_STATUS_OK;
fail:
    return st;
}

tri_status tri__kv_policy_init_borrowed(tri__kv_policy *p, const tri__kv_policy_params *params, tri__kv_store *src,
                                        int32_t n_head, int32_t ring, int32_t max_step) {
    memset(p, 0, sizeof *p);
    if (params->kind != TRI_KV_POLICY_RETRIEVAL)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: only retrieval borrows another cache's rows",
                         tri__kv_policy_name(params->kind));
    tri_status st = tri__kv_policy_check(params, src->capacity);
    if (st) return st;
    if (n_head <= 0 || n_head % src->n_head_kv != 0 || max_step <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: %d heads over %d KV heads, steps of %d", n_head,
                         src->n_head_kv, max_step);
    if (params->oracle)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy retrieval: the oracle reads its own store's keys only");
    if (ring < params->chunk + max_step)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: a ring of %d own rows is smaller than a chunk (%d) and a step (%d)",
                         ring, params->chunk, max_step);
    p->p = *params;
    p->ops = &tri__kv_policy_retrieval_ops;
    p->be = src->be;
    p->src = src;
    p->n_layer = src->n_layer;
    p->n_head = n_head;
    p->n_head_kv = src->n_head_kv;
    p->head_dim = src->head_dim;
    p->max_step = max_step;
    if ((st = tri__kv_store_init(&p->own, p->be, src->type, p->n_layer, p->n_head_kv, p->head_dim, ring))) goto fail;
    p->kv = &p->own;
    // per head: one span per selected chunk and two for the ring (it may wrap), or, before a
    // selection, src's rows and the ring
    if ((st = tri__kv_policy_common_init(p, p->p.budget / p->p.chunk + 2))) goto fail;
    if ((st = ret_state_init(p))) goto fail;
    tri__retrieval_state *s = p->ret;
    s->ring = ring;
    const int64_t rows = (int64_t)p->n_head_kv * p->p.budget, row_bytes = hrow(p);
    s->gtype = src->type;
    if (tri__dtype_is_quantized(params->gather_type)) {
        if (p->head_dim % TRI_QK != 0) {
            st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                           "kv policy retrieval: gathered rows of %s need head_dim %d a multiple of %d",
                           tri_dtype_name(params->gather_type), p->head_dim, TRI_QK);
            goto fail;
        }
        s->gtype = params->gather_type;
        ALLOC(s->gids, GATHER_PIECE);
        if ((st = p->be->ops->alloc(p->be, sizeof(float) * (size_t)GATHER_PIECE * (size_t)p->head_dim,
                                    (void **)&s->gf32)))
            goto fail;
    }
    s->grow = tri__dtype_row_bytes(s->gtype, p->head_dim);
    ALLOC(s->gk, p->n_layer);
    ALLOC(s->gv, p->n_layer);
    for (int32_t il = 0; il < p->n_layer; il++) {
        if ((st = p->be->ops->alloc(p->be, (size_t)(rows * s->grow), &s->gk[il]))) goto fail;
        if ((st = p->be->ops->alloc(p->be, (size_t)(rows * s->grow), &s->gv[il]))) goto fail;
    }
    ALLOC(s->offs, rows);
    if (src->off) {  // an offloaded layer's chunks are gathered on the host and uploaded at once
        s->stage = malloc((size_t)(rows * row_bytes));
        if (!s->stage) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: %lld bytes of gather staging",
                           (long long)(rows * row_bytes));
            goto fail;
        }
        if (p->be->ops->host_register && p->be->ops->host_unregister &&
            p->be->ops->host_register(p->be, s->stage, (size_t)(rows * row_bytes)) == TRI_STATUS_OK)
            s->stage_pinned = true;
        if (s->gtype != src->type && !(s->gstage = malloc((size_t)(rows * s->grow)))) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: %lld bytes of quantized gather staging",
                           (long long)(rows * s->grow));
            goto fail;
        }
    }
    return TRI_STATUS_OK;
fail:
    tri__kv_policy_free(p);
    return st;
}

uint64_t tri__kv_policy_bytes_up(const tri__kv_policy *p) { return p->src ? p->ret->bytes_up : 0; }

// Borrowing: the own rows left in the ring; own store: the capacity left.
static int32_t ret_room(const tri__kv_policy *p) {
    if (!p->src) return tri__kv_policy_capacity(p) - tri__kv_policy_len(p);
    return p->ret->ring - (p->len - p->ret->tail0);
}

// Borrowing: whether a step of m tokens fits the ring.
static tri_status ret_begin(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base) {
    (void)n0, (void)base;
    if (!p->src || m <= ret_room(p)) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                     "kv policy retrieval: %d more tokens do not fit the ring of %d own rows (%d since the tail at "
                     "%d): select again first", m, p->ret->ring, p->len - p->ret->tail0, p->ret->tail0);
}

// ---- summaries ----

static sel_entry *ret_current(const tri__kv_policy *p) {
    const tri__retrieval_state *s = p->ret;
    return s->n_sel ? &s->sel[s->n_sel - 1] : NULL;
}

// Where a layer's keys and values are for a reader: row pos starts pos * row bytes in.
typedef struct layer_rows {
    const char *k, *v;
    bool region;  // an offloaded layer's host region; else backend memory
} layer_rows;

static layer_rows store_layer(tri__kv_store *kv, int32_t il) {
    layer_rows L;
    bool hv;
    L.k = tri__kv_store_rows(kv, il, 0, &L.region);
    L.v = tri__kv_store_rows(kv, il, 1, &hv);
    return L;
}

// Bounds of nc chunks of keys from rows (host memory when host, else the backend's, copied over
// first) into s->summ: per head and chunk, the per-dimension max then min of its keys.
static tri_status bound_rows(tri__kv_policy *p, const char *rows, int32_t nc, bool host) {
    tri__retrieval_state *s = p->ret;
    const int32_t C = p->p.chunk, hd = p->head_dim, kd = kv_dim(p);
    const int64_t row = trow(p);
    if (!host) {
        if (!s->krows && !(s->krows = malloc((size_t)(s->rows_chunks * C * row))))
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: key rows for chunk bounds");
        TRY(p->be->ops->copy_to_host(p->be, s->krows, rows, (size_t)(nc * C * row)));
        TRY(p->be->ops->synchronize(p->be));
        rows = s->krows;
    }
    float *x = malloc(sizeof(float) * (size_t)hd);  // one head's row
    if (!x) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: a row of keys for chunk bounds");
    for (int32_t h = 0; h < p->n_head_kv; h++)
        for (int32_t c = 0; c < nc; c++) {
            float *mx = s->summ + ((int64_t)h * s->rows_chunks + c) * s->sdim, *mn = mx + hd;
            for (int32_t t = 0; t < C; t++) {
                row_to_f32(x, rows + ((int64_t)c * C + t) * row + h * hrow(p), p->kv->type, hd);
                for (int32_t d = 0; d < hd; d++) {
                    if (t == 0 || x[d] > mx[d]) mx[d] = x[d];
                    if (t == 0 || x[d] < mn[d]) mn[d] = x[d];
                }
            }
        }
    free(x);
    (void)kd;
    return TRI_STATUS_OK;
}

// Adds the summaries of chunks first .. last - 1 of layer il (keys L->k) to its heads' indexes: the
// mean of each chunk's keys per head (tri__chunk_mean: double-precision sums, the same bits
// everywhere). Keys in host memory (an offloaded layer's region, a host backend's memory) are
// summarised in place by the host; keys in device memory by the backend's chunk_mean op, so only
// the means cross to the host. A read covers rows_chunks chunks; the means go to each head's index
// in chunk order. The caller waited for the copies that write the keys.
static tri_status summarise_layer(tri__kv_policy *p, int32_t il, const layer_rows *L, int32_t first, int32_t last) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const int32_t C = p->p.chunk, kd = kv_dim(p), hd = p->head_dim, nkv = p->n_head_kv;
    const int64_t row = trow(p);
    const bool host = L->region || p->be->host_memory;
    for (int32_t c0 = first; c0 < last; c0 += s->rows_chunks) {
        const int32_t nc = last - c0 < s->rows_chunks ? last - c0 : s->rows_chunks;
        const char *rows = L->k + (int64_t)c0 * C * row;
        if (layer_bound(p, il)) {
            TRY(bound_rows(p, rows, nc, host));
            for (int32_t h = 0; h < nkv; h++)
                TRY(tri__chunk_index_add(s->ix[il * nkv + h], s->summ + (int64_t)h * s->rows_chunks * s->sdim, nc));
            continue;
        }
        if (host && op->host_work) {  // a simulated device: rows that do not exist, work on its clock
            memset(s->means, 0, sizeof(float) * (size_t)nc * (size_t)kd);
            op->host_work(p->be, TRI_HOST_WORK_REDUCE, (double)nc * C * (double)row);
        } else if (host) {
            tri__chunk_mean(s->means, rows, p->kv->type, nc, C, kd, kd);
        } else {
            if (!s->means_dev)
                TRY(op->alloc(p->be, sizeof(float) * (size_t)s->rows_chunks * (size_t)kd, (void **)&s->means_dev));
            TRY(op->chunk_mean(p->be, s->means_dev, rows, p->kv->type, nc, C, kd, kd));
            TRY(op->copy_to_host(p->be, s->means, s->means_dev, sizeof(float) * (size_t)nc * (size_t)kd));
            TRY(op->synchronize(p->be));
        }
        // (chunk, head, dim) -> (head, chunk, dim): each head's summaries are one add
        for (int32_t h = 0; h < nkv; h++)
            for (int32_t c = 0; c < nc; c++)
                memcpy(s->summ + ((int64_t)h * s->rows_chunks + c) * hd, s->means + (int64_t)c * kd + (int64_t)h * hd,
                       sizeof(float) * (size_t)hd);
        for (int32_t h = 0; h < nkv; h++)
            TRY(tri__chunk_index_add(s->ix[il * nkv + h], s->summ + (int64_t)h * s->rows_chunks * hd, nc));
    }
    return TRI_STATUS_OK;
}

// Summarises the chunks completed by a length of len (src's keys when borrowing) in every layer.
static tri_status ret_summarise(tri__kv_policy *p, int32_t len) {
    tri__retrieval_state *s = p->ret;
    const int32_t first = s->n_chunks, last = len / p->p.chunk;
    if (last <= first) return TRI_STATUS_OK;
    tri__kv_store *kv = p->src ? p->src : p->kv;
    tri_status st = p->be->ops->synchronize(p->be);
    for (int32_t il = 0; !st && il < p->n_layer; il++) {
        layer_rows L = store_layer(kv, il);
        st = summarise_layer(p, il, &L, first, last);
    }
    if (st) {  // every index back to the chunks summarised before
        for (int32_t i = 0; i < p->n_layer * p->n_head_kv; i++) (void)tri__chunk_index_truncate(s->ix[i], first);
        return st;
    }
    s->n_chunks = last;
    return TRI_STATUS_OK;
}

// ---- retrieval over borrowed rows ----

// The first position a selection at length len does not choose chunks from: whole chunks only,
// and, borrowing, only rows src holds.
static int32_t ret_bound(const tri__kv_policy *p, int32_t len) {
    int32_t upto = p->src && p->src->n < len ? p->src->n : len;
    return upto / p->p.chunk * p->p.chunk;
}

// Copies n rows of keys (k) and values (v), positions pos .. pos + n - 1, into layer il's ring
// slots; from an offloaded layer's host region (uploads, counted) or from backend memory.
static tri_status ring_put(tri__kv_policy *p, int32_t il, int32_t pos, int32_t n, const char *k, const char *v,
                           bool region) {
    const tri__backend_ops *op = p->be->ops;
    const int32_t R = p->ret->ring;
    const int64_t row = trow(p);
    for (int which = 0; which < 2; which++) {
        const char *from = which ? v : k;
        char *ring = which ? p->own.v[il] : p->own.k[il];
        for (int32_t i = 0; i < n;) {
            int32_t slot = (pos + i) % R, cnt = n - i < R - slot ? n - i : R - slot;
            size_t bytes = (size_t)(cnt * row);
            if (region) {
                TRY(op->copy_to_backend(p->be, ring + slot * row, from + i * row, bytes));
                p->ret->bytes_up += bytes;
            } else if (op->copy) {
                TRY(op->copy(p->be, ring + slot * row, from + i * row, bytes));
            } else {
                return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy retrieval: backend %s copies no rows", op->name);
            }
            i += cnt;
        }
    }
    return TRI_STATUS_OK;
}

// Copies rows pos .. pos + n - 1 of a layer's keys and values (L) into the ring.
static tri_status ring_fill(tri__kv_policy *p, int32_t il, const layer_rows *L, int32_t pos, int32_t n) {
    return ring_put(p, il, pos, n, L->k + pos * trow(p), L->v + pos * trow(p), L->region);
}

// Quantized gather out of backend memory: the rows at s->offs (bytes into from, rows of the
// source's type) read as f32 by get_rows, a piece at a time, and converted into to (rows of gtype).
// The layer's rows are a table of (capacity * n_head_kv) rows of head_dim values.
static tri_status gather_quantized(tri__kv_policy *p, void *to, const char *from) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const int64_t rows = (int64_t)p->n_head_kv * p->p.budget, hd = p->head_dim, srow = hrow(p);
    const int64_t table = (int64_t)p->src->capacity * p->n_head_kv;
    for (int64_t r0 = 0; r0 < rows; r0 += GATHER_PIECE) {
        const int64_t n = rows - r0 < GATHER_PIECE ? rows - r0 : GATHER_PIECE;
        for (int64_t r = 0; r < n; r++) s->gids[r] = (int32_t)(s->offs[r0 + r] / srow);
        TRY(op->get_rows(p->be, s->gf32, from, p->src->type, table, hd, s->gids, n));
        TRY(op->convert(p->be, (char *)to + r0 * s->grow, s->gtype, s->gf32, n * hd));
    }
    return TRI_STATUS_OK;
}

// An offloaded layer's gathered rows in s->stage (the source's type) quantized into s->gstage.
static tri_status quantize_stage(tri__kv_policy *p) {
    tri__retrieval_state *s = p->ret;
    const int64_t rows = (int64_t)p->n_head_kv * p->p.budget, hd = p->head_dim;
    float *x = malloc(sizeof(float) * (size_t)hd);
    if (!x) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: a row to quantize");
    for (int64_t r = 0; r < rows; r++) {
        row_to_f32(x, (const char *)s->stage + r * hrow(p), p->src->type, hd);
        tri__quantize_row((char *)s->gstage + r * s->grow, x, s->gtype, hd);
    }
    free(x);
    return TRI_STATUS_OK;
}

// Gathers layer il's chunks of selection e out of L into gk/gv.
static tri_status gather_layer(tri__kv_policy *p, const sel_entry *e, int32_t il, const layer_rows *L) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const int32_t C = p->p.chunk, budget = p->p.budget;
    const int64_t row_bytes = hrow(p), rows = (int64_t)p->n_head_kv * budget;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        int64_t i = (int64_t)il * p->n_head_kv + h, r = (int64_t)h * budget;
        const int32_t *ids = e->ids + i * s->kmax;
        for (int32_t a = 0; a < e->cnt[i]; a++)
            for (int32_t t = 0; t < C; t++) s->offs[r++] = row_at(p, (int64_t)ids[a] * C + t, h);
        for (; r < (int64_t)(h + 1) * budget; r++) s->offs[r] = 0;  // unused rows
    }
    const bool quant = s->gtype != p->src->type;
    for (int which = 0; which < 2; which++) {
        const char *from = which ? L->v : L->k;
        void *to = which ? s->gv[il] : s->gk[il];
        if (!L->region && quant) {
            TRY(gather_quantized(p, to, from));
            continue;
        }
        if (!L->region) {
            TRY(op->gather(p->be, to, from, s->offs, rows, row_bytes));
            continue;
        }
        if (op->host_work)  // a simulated device: rows that do not exist, work on its clock
            op->host_work(p->be, TRI_HOST_WORK_COPY, (double)(rows * row_bytes));
        else
            for (int64_t r = 0; r < rows; r++)
                memcpy((char *)s->stage + r * row_bytes, from + s->offs[r], (size_t)row_bytes);
        const void *up = s->stage;
        if (quant) {  // quantized on the host: fewer bytes cross
            TRY(quantize_stage(p));
            up = s->gstage;
        }
        TRY(op->copy_to_backend(p->be, to, up, (size_t)(rows * s->grow)));
        TRY(op->synchronize(p->be));  // the staging is refilled next
        s->bytes_up += (uint64_t)(rows * s->grow);
    }
    return TRI_STATUS_OK;
}

// Makes selection e current over borrowed rows: gathers its chunks out of src into gk/gv and moves
// the tail to its bound (rows bound .. tail0 - 1 come from src). The caller dropped the previous
// selection (its rows are overwritten here), so on failure the policy has none and attends fully;
// the tail moves only on success.
static tri_status ret_install(tri__kv_policy *p, const sel_entry *e, int32_t len) {
    tri__retrieval_state *s = p->ret;
    if (len - e->bound > s->ring)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: %d tokens from the selection's bound %d exceed the ring of %d rows",
                         len - e->bound, e->bound, s->ring);
    // src's newest rows of offloaded layers may still be on their way to its host regions
    TRY(p->be->ops->synchronize(p->be));
    for (int32_t il = 0; il < p->n_layer; il++) {
        layer_rows L = store_layer(p->src, il);
        TRY(gather_layer(p, e, il, &L));
        if (e->bound < s->tail0) TRY(ring_fill(p, il, &L, e->bound, s->tail0 - e->bound));
    }
    TRY(p->be->ops->synchronize(p->be));
    s->tail0 = e->bound;
    return TRI_STATUS_OK;
}

// Adds head h's spans over the ring for positions from .. end - 1 (two where the ring wraps).
static void ring_spans(tri__kv_policy *p, int32_t il, int32_t h, int32_t from, int32_t end, int32_t *ns) {
    const int32_t R = p->ret->ring;
    const int64_t kd = kv_dim(p);
    while (from < end) {
        int32_t slot = from % R, n = end - from < R - slot ? end - from : R - slot;
        int64_t off = row_at(p, slot, h);
        p->spans[(*ns)++] = (tri__kv_span){.pos0 = from, .n = n, .k = (const char *)p->own.k[il] + off,
                                           .v = (const char *)p->own.v[il] + off, .stride = kd, .type = p->kv->type};
        from += n;
    }
}

// Layer il's view over borrowed rows: before a selection src's rows below the tail and the ring;
// with one, the gathered chunks and the ring from the selection's bound.
static tri_status ret_view_borrowed(tri__kv_policy *p, int32_t il, int32_t end) {
    tri__retrieval_state *s = p->ret;
    const sel_entry *e = ret_current(p);
    const int64_t hd = p->head_dim, C = p->p.chunk;
    const tri__kv_view *full = NULL;
    tri__kv_view storage;
    if (!e && s->tail0 > 0) TRY(tri__kv_store_view_read(p->src, il, s->tail0, &full, &storage));
    int32_t ns = 0;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->head_span[h] = ns;
        if (!e) {
            if (full) p->spans[ns++] = full->spans[full->head_span[h]];
            ring_spans(p, il, h, s->tail0, end, &ns);
            continue;
        }
        int64_t i = (int64_t)il * p->n_head_kv + h;
        const int32_t *ids = e->ids + i * s->kmax;
        int32_t first = ns;
        for (int32_t a = 0; a < e->cnt[i]; a++) {
            int32_t start = ids[a] * (int32_t)C;
            if (ns > first && p->spans[ns - 1].pos0 + p->spans[ns - 1].n == start) {
                p->spans[ns - 1].n += (int32_t)C;  // adjacent chunks are adjacent rows
                continue;
            }
            int64_t off = ((int64_t)h * p->p.budget + a * C) * s->grow;
            p->spans[ns++] = (tri__kv_span){.pos0 = start, .n = (int32_t)C, .k = (const char *)s->gk[il] + off,
                                            .v = (const char *)s->gv[il] + off, .stride = hd, .type = s->gtype};
        }
        ring_spans(p, il, h, e->bound, end, &ns);
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
    return TRI_STATUS_OK;
}

// The view ret_view_borrowed made: with a selection of quantized rows (gather_type), its spans carry
// their types (the gathered chunks', the ring's).
static const tri__kv_view *borrowed_view(tri__kv_policy *p) {
    const tri__kv_view *v = tri__kv_policy_own_view(p);
    p->view.span_types = ret_current(p) && p->ret->gtype != p->kv->type;
    return v;
}

// Writes the step's new rows into the ring (two writes where it wraps).
static tri_status ring_write(tri__kv_policy *p, int32_t il, int32_t pos, int32_t m, const float *k, const float *v) {
    const int32_t R = p->ret->ring;
    const int64_t kd = kv_dim(p);
    for (int32_t done = 0; done < m;) {
        int32_t slot = (pos + done) % R, n = m - done < R - slot ? m - done : R - slot;
        TRY(tri__kv_store_write(&p->own, il, slot, n, k + done * kd, v + done * kd));
        done += n;
    }
    return TRI_STATUS_OK;
}

// Forgets every selection.
static void ret_drop_selections(tri__retrieval_state *s) {
    while (s->n_sel > 0) {
        s->n_sel--;
        free(s->sel[s->n_sel].cnt);
        free(s->sel[s->n_sel].ids);
    }
}

// The query vectors KV head h of layer il selects by, out of a ring of queries (rows rows of
// (n_layer, n_head * head_dim) floats, position i in row i % rows) holding positions lo .. hi - 1:
// the group's heads of each of the last nq of them, token by token, into s->qset; returns their
// count (0 when the ring holds none).
static int32_t ring_queries(tri__kv_policy *p, const float *ring, int32_t rows, int32_t lo, int32_t hi, int32_t il,
                            int32_t h) {
    const int32_t g = p->n_head / p->n_head_kv, hd = p->head_dim, nq = p->ret->nq;
    const int64_t qd = (int64_t)p->n_head * hd;
    int32_t n = 0;
    for (int32_t t = hi - nq > lo ? hi - nq : lo; t < hi; t++, n += g) {
        const float *row = ring + ((int64_t)(t % rows) * p->n_layer + il) * qd;  // position t's, layer il
        memcpy(p->ret->qset + (int64_t)n * hd, row + (int64_t)h * g * hd, sizeof(float) * (size_t)(g * hd));
    }
    return n;
}

// Notes that the policy ran positions n0 .. n0 + m - 1 (their queries are in hq): the history
// continues when they follow it, else starts again at n0; the rows the step overwrote are gone.
static void hist_ran(tri__retrieval_state *s, int32_t n0, int32_t m) {
    if (s->hist_hi != n0 || s->hist_lo > n0) s->hist_lo = n0;
    s->hist_hi = n0 + m;
    if (s->hist_lo < s->hist_hi - s->hist) s->hist_lo = s->hist_hi - s->hist;
}

// ---- the oracle: full attention's own mass per chunk (a measurement, params.oracle) ----

// Full attention's mass per chunk for layer il, KV head h over the first n_chunks chunks, from the
// history's last nq tokens (tri__kv_policy_chunk_mass); *n_vec receives the query vectors read.
static tri_status chunk_mass(tri__kv_policy *p, int32_t il, int32_t h, int32_t n_chunks, double *mass, double *rest,
                             int32_t *n_vec) {
    tri__retrieval_state *s = p->ret;
    bool region;
    const char *K = p->src ? NULL : tri__kv_store_rows(p->kv, il, 0, &region);
    if (!K || !(region || p->be->host_memory))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy retrieval: chunk mass reads its own store in host memory");
    const int32_t g = p->n_head / p->n_head_kv, hd = p->head_dim, C = p->p.chunk, len = s->hist_hi;
    const int64_t qd = (int64_t)p->n_head * hd, kd = kv_dim(p);
    const bool f16 = p->kv->type == TRI_DTYPE_F16;
    const double scale = 1.0 / sqrt((double)hd);
    TRY(p->be->ops->synchronize(p->be));  // the step's keys are written
    float *keys = malloc(sizeof *keys * (size_t)((int64_t)len * hd));  // (len, hd): head h's keys
    double *lg = malloc(sizeof *lg * (size_t)len);
    if (!keys || !lg) {
        free(keys);
        free(lg);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: chunk mass over %d keys", len);
    }
    for (int32_t pos = 0; pos < len; pos++)
        for (int32_t d = 0; d < hd; d++) {
            int64_t e = (int64_t)pos * kd + (int64_t)h * hd + d;
            keys[(int64_t)pos * hd + d] = f16 ? tri__f16_to_f32(((const uint16_t *)K)[e]) : ((const float *)K)[e];
        }
    for (int32_t c = 0; c < n_chunks; c++) mass[c] = 0;
    *rest = 0;
    *n_vec = 0;
    for (int32_t t = s->hist_hi - s->nq > s->hist_lo ? s->hist_hi - s->nq : s->hist_lo; t < s->hist_hi; t++)
        for (int32_t j = 0; j < g; j++, (*n_vec)++) {
            const float *q = s->hq + ((int64_t)(t % s->hist) * p->n_layer + il) * qd + (int64_t)(h * g + j) * hd;
            double mx = -INFINITY, z = 0;
            for (int32_t pos = 0; pos <= t; pos++) {  // causal: position t sees 0 .. t
                double dt = 0;
                for (int32_t d = 0; d < hd; d++) dt += (double)q[d] * (double)keys[(int64_t)pos * hd + d];
                mx = fmax(mx, lg[pos] = dt * scale);
            }
            for (int32_t pos = 0; pos <= t; pos++) z += lg[pos] = exp(lg[pos] - mx);
            for (int32_t pos = 0; pos <= t; pos++) {
                if (pos / C < n_chunks) mass[pos / C] += lg[pos] / z;
                else *rest += lg[pos] / z;
            }
        }
    free(keys);
    free(lg);
    return TRI_STATUS_OK;
}

int32_t tri__kv_policy_chunk_mass(tri__kv_policy *p, int32_t il, int32_t h, double *mass, double *rest) {
    if (!p->ret)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: no chunks", tri__kv_policy_name(p->p.kind));
    const int32_t n_chunks = p->ret->hist_hi / p->p.chunk;
    int32_t n_vec = 0;
    tri_status st = chunk_mass(p, il, h, n_chunks, mass, rest, &n_vec);
    if (st) return st;
    return n_vec ? n_chunks : 0;
}

typedef struct massed {
    double mass;
    int32_t id;
} massed;

// More mass first, then the lower chunk.
static int massed_cmp(const void *a, const void *b) {
    const massed *x = a, *y = b;
    if (x->mass != y->mass) return x->mass > y->mass ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t tri__kv_policy_mass_choice(const tri__kv_policy *p, const double *mass, int32_t n_chunks, int32_t *ids) {
    const int32_t kmax = p->p.budget / p->p.chunk, window = tri__kv_policy_window_chunks(p);
    if (n_chunks <= kmax) {
        for (int32_t c = 0; c < n_chunks; c++) ids[c] = c;
        return n_chunks;
    }
    const int32_t recent = n_chunks - window;
    massed *cand = malloc(sizeof *cand * (size_t)n_chunks);
    int32_t *ranked = malloc(sizeof *ranked * (size_t)n_chunks);
    unsigned char *keep = malloc((size_t)n_chunks);
    int32_t cnt;
    if (cand && ranked && keep) {
        for (int32_t c = 1; c < recent; c++) cand[c - 1] = (massed){.mass = mass[c], .id = c};
        qsort(cand, (size_t)(recent - 1), sizeof *cand, massed_cmp);
        for (int32_t a = 0; a < recent - 1; a++) ranked[a] = cand[a].id;
        cnt = tri__chunk_keep(ranked, recent - 1, kmax - 1 - window, p->p.follow, n_chunks, recent, keep, ids);
    } else {
        cnt = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: scratch for the mass of %d chunks", n_chunks);
    }
    free(cand);
    free(ranked);
    free(keep);
    return cnt;
}

// Room in layer_mass's buffers for a view of `keys` keys and n_chunks chunks.
static tri_status mass_reserve(tri__kv_policy *p, int64_t keys, int32_t n_chunks) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const size_t qbytes = sizeof(float) * (size_t)((int64_t)s->nq * p->n_head * p->head_dim);
    if (!s->mq) TRY(op->alloc(p->be, qbytes, (void **)&s->mq));
    if (!s->mout) TRY(op->alloc(p->be, qbytes, (void **)&s->mout));
    if (!s->mpos && !(s->mpos = malloc(sizeof *s->mpos * (size_t)s->nq)))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: query positions");
    if (keys > s->mw_cap) {
        op->free(p->be, s->mws);
        free(s->mw);
        s->mws = NULL;
        s->mw_cap = 0;
        if (!(s->mw = malloc(sizeof *s->mw * (size_t)keys)))
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: weight sums of %lld keys",
                             (long long)keys);
        TRY(op->alloc(p->be, sizeof(float) * (size_t)keys, (void **)&s->mws));
        s->mw_cap = keys;
    }
    if (n_chunks > s->mass_cap) {
        double *m = realloc(s->mass, sizeof *m * (size_t)((int64_t)p->n_head_kv * n_chunks));
        if (!m) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: mass of %d chunks", n_chunks);
        s->mass = m;
        s->mass_cap = n_chunks;
    }
    return TRI_STATUS_OK;
}

// Full attention's mass per chunk in layer il: the probability each query vector of the last nq
// of positions lo .. hi - 1 in a query ring (rows rows, as ring_queries reads it) gives each key of
// view (the layer's every key up to hi - 1, each KV head's in position order or not), summed over
// the group's heads, the queries and the chunk's keys, into s->mass (n_head_kv, n_chunks); keys
// past the complete chunks count for none. The backend's attention op computes it (weight sums),
// where the keys are. *n_vec receives the query vectors per KV head (0: none, nothing computed).
static tri_status layer_mass(tri__kv_policy *p, int32_t il, const tri__kv_view *view, const float *ring, int32_t rows,
                             int32_t lo, int32_t hi, int32_t n_chunks, int32_t *n_vec) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const int32_t t0 = hi - s->nq > lo ? hi - s->nq : lo, m = hi - t0, nkv = p->n_head_kv, C = p->p.chunk;
    const int64_t qd = (int64_t)p->n_head * p->head_dim;
    *n_vec = m > 0 ? m * (p->n_head / nkv) : 0;
    if (m <= 0) return TRI_STATUS_OK;
    int64_t keys = 0;
    for (int32_t a = 0; a < view->head_span[nkv]; a++) keys += view->spans[a].n;
    TRY(mass_reserve(p, keys, n_chunks));
    for (int32_t t = t0; t < hi; t++) {
        const float *row = ring + ((int64_t)(t % rows) * p->n_layer + il) * qd;  // position t's, layer il
        memcpy(s->qrow + (t - t0) * qd, row, sizeof(float) * (size_t)qd);
        s->mpos[t - t0] = t;
    }
    TRY(op->copy_to_backend(p->be, s->mq, s->qrow, sizeof(float) * (size_t)(m * qd)));
    TRY(op->attention(p->be, s->mout, s->mq, s->mpos, m, p->n_head, p->head_dim, view, s->mws));
    TRY(op->copy_to_host(p->be, s->mw, s->mws, sizeof(float) * (size_t)keys));
    TRY(op->synchronize(p->be));
    memset(s->mass, 0, sizeof *s->mass * (size_t)((int64_t)nkv * n_chunks));
    const float *w = s->mw;
    for (int32_t h = 0; h < nkv; h++) {
        double *mass = s->mass + (int64_t)h * n_chunks;
        for (int32_t a = view->head_span[h]; a < view->head_span[h + 1]; a++) {
            const tri__kv_span *sp = &view->spans[a];
            for (int32_t r = 0; r < sp->n; r++, w++) {
                int32_t c = (sp->pos ? sp->pos[r] : sp->pos0 + r) / C;
                if (c < n_chunks) mass[c] += *w;
            }
        }
    }
    return TRI_STATUS_OK;
}

// Whether layer il selects by mass: params.mass in a selection made while attending fully (fully),
// the oracle's layers always.
static bool by_mass(const tri__kv_policy *p, int32_t il, bool fully) {
    return (p->p.mass && fully) || (p->p.oracle >> (il < 63 ? il : 63) & 1);
}

// Chooses layer il's chunks for every KV head among the first n_chunks into e: chunk 0, the recent
// window and the best others, ascending; all when they fit. By full attention's mass over view when
// view is given (and the ring holds queries), else by the group rule over each head's index; both
// read the query vectors of the last nq of positions lo .. hi - 1 in a query ring of rows rows.
static tri_status select_layer(tri__kv_policy *p, sel_entry *e, int32_t il, int32_t n_chunks, const tri__kv_view *view,
                               const float *ring, int32_t rows, int32_t lo, int32_t hi) {
    tri__retrieval_state *s = p->ret;
    const int32_t nkv = p->n_head_kv, window = tri__kv_policy_window_chunks(p);
    int32_t n_vec = 0;
    if (view && n_chunks > s->kmax) TRY(layer_mass(p, il, view, ring, rows, lo, hi, n_chunks, &n_vec));
    for (int32_t h = 0; h < nkv; h++) {
        int64_t i = (int64_t)il * nkv + h;
        int32_t *ids = e->ids + i * s->kmax;
        if (n_vec > 0) {
            int32_t n = tri__kv_policy_mass_choice(p, s->mass + (int64_t)h * n_chunks, n_chunks, ids);
            if (n < 0) return (tri_status)n;
            e->cnt[i] = n;
            continue;
        }
        int32_t n_q = ring_queries(p, ring, rows, lo, hi, il, h);
        TRY(tri__chunk_select(s->ix[i], p->p.group, layer_bound(p, il), s->qset, n_q, n_chunks, s->kmax, window, ids,
                              &e->cnt[i]));
    }
    return TRI_STATUS_OK;
}

// A selection entry with room for every head's chunks; false when out of memory.
static bool sel_alloc(const tri__kv_policy *p, sel_entry *e) {
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    e->cnt = malloc(sizeof *e->cnt * (size_t)heads);
    e->ids = malloc(sizeof *e->ids * (size_t)(heads * p->ret->kmax));
    if (e->cnt && e->ids) return true;
    free(e->cnt);
    free(e->ids);
    e->cnt = NULL;
    e->ids = NULL;
    return false;
}

// Room for one more selection in the list.
static tri_status sel_reserve(tri__retrieval_state *s) {
    if (s->n_sel < s->sel_cap) return TRI_STATUS_OK;
    int32_t cap = s->sel_cap ? 2 * s->sel_cap : 8;
    sel_entry *e = realloc(s->sel, sizeof *e * (size_t)cap);
    if (!e) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: %d selections", cap);
    s->sel = e;
    s->sel_cap = cap;
    return TRI_STATUS_OK;
}

// Selects, for every (layer, KV head), chunk 0 and the best kmax - 1 other complete chunks by the
// group queries of the last nq tokens of the history (which ends at len), at cache length len.
// Borrowing, the selection replaces the previous one (its rows are gathered over the old ones).
// With no queries before len (the tokens were adopted, or a failed step overwrote them) nothing is
// selected.
static tri_status ret_select(tri__kv_policy *p, int32_t len) {
    tri__retrieval_state *s = p->ret;
    TRI_ASSERT(s->hist_hi == len || s->hist_lo == s->hist_hi);
    if (s->hist_hi != len || s->hist_lo == s->hist_hi) return TRI_STATUS_OK;
    const int32_t bound = ret_bound(p, len);
    TRY(ret_summarise(p, bound));
    TRY(sel_reserve(s));
    sel_entry e = {.n_sel = len, .bound = bound};
    if (!sel_alloc(p, &e)) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: selection");
    // attending fully until now (no selection), the step read every key: so can the selection
    const bool fully = ret_current(p) == NULL;
    TRI_ASSERT(!p->src || !p->p.oracle);  // borrowing selects by mass only while attending fully
    tri_status st = TRI_STATUS_OK;
    for (int32_t il = 0; !st && il < p->n_layer; il++) {
        // by mass: over every key, the own store's or (borrowing, which refuses the oracle, so only
        // while attending fully) src's rows and the ring, the view the step just attended to
        const tri__kv_view *view = NULL;
        if (by_mass(p, il, fully) && !p->src) view = tri__kv_store_view(p->kv, il, len, &p->view);
        else if (by_mass(p, il, fully) && !(st = ret_view_borrowed(p, il, len))) view = borrowed_view(p);
        if (!st) st = select_layer(p, &e, il, bound / p->p.chunk, view, s->hq, s->hist, s->hist_lo, s->hist_hi);
    }
    if (!st && p->src) {
        ret_drop_selections(s);  // the gather overwrites the old selection's rows
        st = ret_install(p, &e, len);
    }
    if (st) {
        free(e.cnt);
        free(e.ids);
        return st;
    }
    s->sel[s->n_sel++] = e;
    s->armed = false;
    return TRI_STATUS_OK;
}

// Layer il's view: the selected chunks, then the tokens since the selection's last whole chunk.
static void ret_view(tri__kv_policy *p, int32_t il, int32_t end) {
    const sel_entry *e = ret_current(p);
    const int64_t kd = kv_dim(p);
    const int32_t C = p->p.chunk;
    int32_t recent = e->bound;
    int32_t ns = 0;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->head_span[h] = ns;
        int64_t i = (int64_t)il * p->n_head_kv + h;
        const int32_t *ids = e->ids + i * p->ret->kmax;
        int32_t cnt = e->cnt[i];
        int32_t first = ns;
        for (int32_t a = 0; a <= cnt; a++) {
            int32_t start = a < cnt ? ids[a] * C : recent, len = a < cnt ? C : end - recent;
            if (len == 0) continue;
            if (ns > first && p->spans[ns - 1].pos0 + p->spans[ns - 1].n == start) {
                p->spans[ns - 1].n += len;  // contiguous: one span, as the full view has
                continue;
            }
            int64_t off = row_at(p, start, h);
            p->spans[ns++] = (tri__kv_span){.pos0 = start, .n = len, .k = (const char *)p->kv->k[il] + off,
                                            .v = (const char *)p->kv->v[il] + off, .stride = kd};
        }
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
}

// Keeps layer il's queries of the step in the history (every head: tri__chunk_select merges a
// group's scores its own way); the commit extends the history over them (hist_ran).
static tri_status ret_keep_query(tri__kv_policy *p, int32_t il, const float *q) {
    tri__retrieval_state *s = p->ret;
    int64_t qd = (int64_t)p->n_head * p->head_dim;
    TRY(p->be->ops->copy_to_host(p->be, s->qrow, q, sizeof(float) * (size_t)(p->step_m * qd)));
    TRY(p->be->ops->synchronize(p->be));
    for (int32_t t = 0; t < p->step_m; t++)
        memcpy(s->hq + ((int64_t)((p->step_n0 + t) % s->hist) * p->n_layer + il) * qd, s->qrow + t * qd,
               sizeof(float) * (size_t)qd);
    return TRI_STATUS_OK;
}

// Whether a step ending at len selects: on request, or once refresh tokens came since the last
// selection. The count needs a selection to count from: before the first one (made on request,
// after the prompt) the steps are the prompt's, and a selection in its middle would leave the
// rest of the prompt attending to part of it, where TriForce prefills with full attention.
static bool ret_due(const tri__kv_policy *p, int32_t len, bool armed) {
    const sel_entry *cur = ret_current(p);
    return armed || (cur && p->p.refresh > 0 && len - cur->n_sel >= p->p.refresh);
}

static tri_status ret_truncate(tri__kv_policy *p, int32_t n) {
    tri__retrieval_state *s = p->ret;
    if (p->src) {  // rows below n stay src's or the ring's; the ring holds from the tail on
        if (s->tail0 > n) s->tail0 = n;
        p->len = n;
    }
    while (s->n_sel > 0 && s->sel[s->n_sel - 1].n_sel > n) {
        s->n_sel--;
        free(s->sel[s->n_sel].cnt);
        free(s->sel[s->n_sel].ids);
    }
    if (s->hist_hi > n) s->hist_hi = n;  // the dropped positions' queries go with them
    if (s->hist_lo > s->hist_hi) s->hist_lo = s->hist_hi;
    int32_t n_chunks = n / p->p.chunk;
    if (n_chunks < s->n_chunks) {
        for (int32_t i = 0; i < p->n_layer * p->n_head_kv; i++) TRY(tri__chunk_index_truncate(s->ix[i], n_chunks));
        s->n_chunks = n_chunks;
    }
    // into the last step: it would have ended at n, and selected then if due
    if (s->step_m > 0 && n <= s->step_n0) {
        if (n == s->step_n0) s->armed = s->step_armed;
        s->step_m = 0;
    } else if (s->step_m > 0 && n < s->step_n0 + s->step_m) {
        s->step_m = n - s->step_n0;
        s->armed = s->step_armed;
        if (ret_due(p, n, s->armed)) TRY(ret_select(p, n));
    }
    return TRI_STATUS_OK;
}

// ---- selecting during the full cache's step ----

tri_status tri__kv_policy_tap(tri__kv_policy *full, tri__kv_policy *ret, int32_t at) {
    TRI_ASSERT(!full->in_step && !ret->in_step);
    if (full->p.kind != TRI_KV_POLICY_FULL || !ret->src || ret->src != full->kv || at <= full->kv->n ||
        at > full->kv->capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: a selection at %d during a pass of the full cache "
                         "(length %d) that the retrieval policy does not borrow", at, full->kv->n);
    tri__retrieval_state *s = ret->ret;
    const int32_t bound = at / ret->p.chunk * ret->p.chunk;
    if (at - bound > s->ring)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: ring of %d rows for %d rows from the bound",
                         s->ring, at - bound);
    if (s->tap_owner) tri__ret_tap_finish(s->tap_owner, false);  // armed before and never made
    if (!s->tap_rows)
        TRY(ret->be->ops->alloc(ret->be, (size_t)(2 * (int64_t)ret->n_layer * ret->p.chunk * trow(ret)),
                                &s->tap_rows));
    if (!s->tq && !(s->tq = malloc(sizeof(float) * (size_t)((int64_t)s->nq * ret->n_layer * ret->n_head *
                                                            ret->head_dim))))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: %d tokens' queries of a tap", s->nq);
    s->tq_lo = s->tq_hi = full->kv->n;  // none of the pass's yet
    free(s->tap.cnt);
    free(s->tap.ids);
    s->tap = (sel_entry){.n_sel = at, .bound = bound};
    if (!sel_alloc(ret, &s->tap)) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: selection");
    // its rows are about to be overwritten; the tail stays where it is until the step commits; the
    // remembered step's queries are scratch now (no replay of a selection into it)
    ret_drop_selections(s);
    s->step_m = 0;
    s->tap_layers = 0;
    s->tap_first = s->n_chunks;
    s->tap_owner = full;
    full->tap = ret;
    full->tap_at = at;
    return TRI_STATUS_OK;
}

// Where layer il's staged rows (keys: which 0, values 1) of a tap are.
static char *tap_rows(tri__kv_policy *ret, int32_t il, int which) {
    return (char *)ret->ret->tap_rows + (2 * (int64_t)il + which) * ret->p.chunk * trow(ret);
}

tri_status tri__ret_tap_queries(tri__kv_policy *ret, int32_t il, const float *q, int32_t n0, int32_t m,
                                int32_t n_head) {
    tri__retrieval_state *s = ret->ret;
    const int64_t qd = (int64_t)n_head * ret->head_dim;
    TRI_ASSERT(n_head == ret->n_head && m > 0);
    const int32_t t0 = m > s->nq ? m - s->nq : 0;  // only the last nq can be read
    TRY(ret->be->ops->copy_to_host(ret->be, s->qrow, q + t0 * qd, sizeof(float) * (size_t)((m - t0) * qd)));
    TRY(ret->be->ops->synchronize(ret->be));
    for (int32_t t = t0; t < m; t++)
        memcpy(s->tq + ((int64_t)((n0 + t) % s->nq) * ret->n_layer + il) * qd, s->qrow + (t - t0) * qd,
               sizeof(float) * (size_t)qd);
    if (il == 0) {  // every layer of a step holds the same positions
        if (s->tq_hi != n0) s->tq_lo = n0;
        s->tq_hi = n0 + m;
        if (s->tq_lo < s->tq_hi - s->nq) s->tq_lo = s->tq_hi - s->nq;
    }
    return TRI_STATUS_OK;
}

// Layer il of the full cache's step that ends at the tap's length: ret selects that layer's chunks
// by the pass's last queries (tri__ret_tap_queries took this step's) and the layer's rows in view
// (backend memory).
tri_status tri__ret_tap_layer(tri__kv_policy *ret, int32_t il, int32_t n_head, const tri__kv_view *view) {
    tri__retrieval_state *s = ret->ret;
    sel_entry *e = &s->tap;
    const tri__backend_ops *op = ret->be->ops;
    TRI_ASSERT(il == s->tap_layers && n_head == ret->n_head && s->tq_hi == e->n_sel);
    // the layer's rows: head 0's span starts at row 0 of the layer
    const tri__kv_span *sp = &view->spans[view->head_span[0]];
    layer_rows L = {.k = sp->k, .v = sp->v, .region = false};
    TRY(summarise_layer(ret, il, &L, s->tap_first, e->bound / ret->p.chunk));
    // the pass's tokens count as run, and only they: what the policy ran before it is replaced
    // (its selection, rows from the bound and history), as adopting replaces it
    TRY(select_layer(ret, e, il, e->bound / ret->p.chunk, by_mass(ret, il, true) ? view : NULL, s->tq, s->nq, s->tq_lo,
                     s->tq_hi));
    TRY(gather_layer(ret, e, il, &L));
    // the rows from the bound: staged, the ring still holds the policy's own until it is taken
    if (e->bound < e->n_sel) {
        const int64_t rb = trow(ret);
        size_t bytes = (size_t)((e->n_sel - e->bound) * rb);
        if (!op->copy) return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy retrieval: backend %s copies no rows", op->name);
        TRY(op->copy(ret->be, tap_rows(ret, il, 0), L.k + e->bound * rb, bytes));
        TRY(op->copy(ret->be, tap_rows(ret, il, 1), L.v + e->bound * rb, bytes));
    }
    s->tap_layers++;
    return TRI_STATUS_OK;
}

// After the full cache's pass: ret takes the selection when every layer made it and the pass
// succeeded (ok), else forgets it; either way the full policy is disarmed.
void tri__ret_tap_finish(tri__kv_policy *full, bool ok) {
    tri__kv_policy *ret = full->tap;
    full->tap = NULL;
    if (!ret) return;
    tri__retrieval_state *s = ret->ret;
    s->tap_owner = NULL;
    ok = ok && s->tap_layers == ret->n_layer && sel_reserve(s) == TRI_STATUS_OK;
    const sel_entry *e = &s->tap;
    for (int32_t il = 0; ok && il < ret->n_layer && e->bound < e->n_sel; il++)
        ok = ring_put(ret, il, e->bound, e->n_sel - e->bound, tap_rows(ret, il, 0), tap_rows(ret, il, 1), false) ==
             TRI_STATUS_OK;
    if (!ok && s->tap_layers == ret->n_layer && e->bound < e->n_sel) {
        // a device failure while putting the rows into the ring: the policy's own rows from
        // the tail may be overwritten; it keeps none (nor their queries)
        if (ret->len > s->tail0) ret->len = s->tail0;
        if (s->hist_hi > ret->len) s->hist_hi = ret->len;
        if (s->hist_lo > s->hist_hi) s->hist_lo = s->hist_hi;
    }
    if (!ok) {  // the indexes back to the chunks before the step
        for (int32_t i = 0; i < ret->n_layer * ret->n_head_kv; i++) (void)tri__chunk_index_truncate(s->ix[i], s->tap_first);
        s->n_chunks = s->tap_first;
        free(s->tap.cnt);
        free(s->tap.ids);
        s->tap = (sel_entry){0};
        return;
    }
    s->n_chunks = s->tap.bound / ret->p.chunk;
    s->sel[s->n_sel++] = s->tap;
    s->tap = (sel_entry){0};
    s->tail0 = s->sel[s->n_sel - 1].bound;
    ret->len = s->sel[s->n_sel - 1].n_sel;
    s->step_m = 0;
    s->armed = false;
    // the history starts again with the pass's queries, as if the policy had run those tokens
    // after adopting the ones before them
    const int64_t qd = (int64_t)ret->n_head * ret->head_dim, row = ret->n_layer * qd;
    s->hist_lo = s->hist_hi = s->tq_lo;
    for (int32_t t = s->tq_lo; t < s->tq_hi; t++)
        memcpy(s->hq + (int64_t)(t % s->hist) * row, s->tq + (int64_t)(t % s->nq) * row, sizeof(float) * (size_t)row);
    hist_ran(s, s->tq_lo, s->tq_hi - s->tq_lo);
}

// ---- the op table ----

static tri_status ret_check(const tri__kv_policy_params *p) {
    if (p->chunk <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: chunk size %d must be positive", p->chunk);
    if (p->chunk > p->budget || p->budget % p->chunk != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: chunk size %d must divide the budget %d (whole chunks are kept)",
                         p->chunk, p->budget);
    if (p->refresh < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: refresh interval %d must be >= 0",
                         p->refresh);
    if (p->group < TRI__KV_GROUP_SUM || p->group > TRI__KV_GROUP_SOFTMAX)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: unknown group scoring %d", (int)p->group);
    if (p->window < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: recent window %d must be >= 0", p->window);
    if (p->queries < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: queries %d must be >= 0", p->queries);
    if (p->follow < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: follow %d must be >= 0", p->follow);
    if (p->oracle && (p->bound || p->bound_layers))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: the oracle reads keys, not bounds");
    if (p->index < TRI_CHUNK_INDEX_EXACT || p->index > TRI_CHUNK_INDEX_FAISS_IVF)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: unknown chunk index %d", (int)p->index);
    if (p->index != TRI_CHUNK_INDEX_EXACT && !tri__chunk_index_have_faiss())
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "kv policy retrieval: FAISS index asked for, but this build has no FAISS");
    return TRI_STATUS_OK;
}

// An own store: one span per selected chunk, plus the tokens since the selection.
static tri_status ret_init(tri__kv_policy *p) {
    TRY(tri__kv_policy_common_init(p, p->p.budget / p->p.chunk + 1));
    return ret_state_init(p);
}

// Stores the rows where borrowing (the ring), keeps the step's queries and returns the view
// (everything before a selection).
static tri_status ret_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                            int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)weight_sums;
    const int32_t n0 = p->step_n0, m = p->step_m;
    if (p->src) {
        TRY(ring_write(p, il, n0, m, k, v));
        TRY(ret_keep_query(p, il, q));
        TRY(ret_view_borrowed(p, il, end));
        *view = borrowed_view(p);
        return TRI_STATUS_OK;
    }
    TRY(tri__kv_store_write(p->kv, il, n0, m, k, v));
    TRY(ret_keep_query(p, il, q));
    if (!ret_current(p)) {
        *view = tri__kv_store_view(p->kv, il, end, &p->view);
        return TRI_STATUS_OK;
    }
    ret_view(p, il, end);
    *view = tri__kv_policy_own_view(p);
    return TRI_STATUS_OK;
}

// Summaries of the chunks completed, and the selection when one is due.
static tri_status ret_commit(tri__kv_policy *p, int32_t end) {
    // borrowing, chunks are summarised from src's rows when a selection needs them
    if (!p->src) TRY(ret_summarise(p, end));
    p->ret->step_n0 = p->step_n0;
    p->ret->step_m = p->step_m;
    p->ret->step_armed = p->ret->armed;
    hist_ran(p->ret, p->step_n0, p->step_m);
    if (ret_due(p, end, p->ret->armed)) TRY(ret_select(p, end));
    return TRI_STATUS_OK;
}

static void ret_abort(tri__kv_policy *p) {
    if (!p->in_step) return;
    // drop the summaries of a half-committed step; the previous step stays remembered
    tri__retrieval_state *s = p->ret;
    int32_t keep_m = s->step_m, keep_n0 = s->step_n0;
    s->step_m = 0;
    (void)ret_truncate(p, p->step_n0);
    s->step_m = keep_m;
    s->step_n0 = keep_n0;
    // the step's queries overwrote the rows of the positions hist before its own
    int32_t gone = p->step_n0 + p->step_m - s->hist;
    if (s->hist_lo < gone) s->hist_lo = gone < s->hist_hi ? gone : s->hist_hi;
}

static void ret_reset(tri__kv_policy *p) {
    p->ret->step_m = 0;
    p->ret->hist_lo = p->ret->hist_hi = 0;
    (void)ret_truncate(p, 0);
    p->ret->armed = false;
}

static tri_status ret_adopt_borrowed(tri__kv_policy *p, tri__kv_store *src, int32_t n) {
    if (src != p->src || n < p->len || n > src->n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: adopt to %d from %d out of %s store (holding %d)", n, p->len,
                         src == p->src ? "its source" : "another", src->n);
    ret_drop_selections(p->ret);
    p->ret->tail0 = n;
    p->ret->step_m = 0;
    p->ret->hist_lo = p->ret->hist_hi = n;  // adopted tokens have no queries: the history starts again
    p->len = n;
    return TRI_STATUS_OK;
}

// Own store: whether adopting up to n keeps the policy attending fully.
static bool ret_attends_fully(const tri__kv_policy *p, int32_t n) {
    return !ret_current(p) && !ret_due(p, n, p->ret->armed);
}

// Own store: the summaries of the adopted rows (len: the length before).
static tri_status ret_adopted(tri__kv_policy *p, int32_t len, int32_t n) {
    // summarise now, as a step's commit would (a later commit would catch up, but the state
    // should not depend on one coming)
    tri_status st = ret_summarise(p, n);
    if (st) {
        (void)ret_truncate(p, len);  // drop the summaries made before the failure
        return st;
    }
    p->ret->step_m = 0;  // no step to replay: nothing was due in these positions
    p->ret->hist_lo = p->ret->hist_hi = n;  // adopted tokens have no queries: the history starts again
    return TRI_STATUS_OK;
}

void tri__kv_policy_tap_settle(tri__kv_policy *p, bool ok) {
    if (p->tap && (!ok || p->kv->n >= p->tap_at)) tri__ret_tap_finish(p, ok);
}

void tri__kv_policy_untap(tri__kv_policy *ret) {
    if (ret->ret && ret->ret->tap_owner) tri__ret_tap_finish(ret->ret->tap_owner, false);
}

void tri__kv_policy_request_refresh(tri__kv_policy *p) {
    if (p->ret) p->ret->armed = true;
}

void tri__kv_policy_cancel_refresh(tri__kv_policy *p) {
    if (p->ret) p->ret->armed = false;
}

int32_t tri__kv_policy_selected_at(const tri__kv_policy *p) {
    const sel_entry *e = p->ret ? ret_current(p) : NULL;
    return e ? e->n_sel : -1;
}

int32_t tri__kv_policy_selection(const tri__kv_policy *p, int32_t il, int32_t h, int32_t *ids, int32_t *n_sel) {
    const sel_entry *e = p->ret ? ret_current(p) : NULL;
    if (!e) {
        if (n_sel) *n_sel = 0;
        return -1;
    }
    int64_t i = (int64_t)il * p->n_head_kv + h;
    memcpy(ids, e->ids + i * p->ret->kmax, sizeof *ids * (size_t)e->cnt[i]);
    if (n_sel) *n_sel = e->n_sel;
    return e->cnt[i];
}

static bool ret_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    const int64_t row = hrow(p);
    const sel_entry *e = ret_current(p);
    int32_t from_chunk = -1;  // the row of the selection's rows (own store: the position) holding pos
    if (e && pos < e->bound) {
        const int64_t i = (int64_t)il * p->n_head_kv + h;
        const int32_t *ids = e->ids + i * p->ret->kmax, C = p->p.chunk;
        for (int32_t a = 0; a < e->cnt[i]; a++)
            if (ids[a] == pos / C) from_chunk = a * C + pos % C;
        if (from_chunk < 0) return false;
    }
    const tri__backend_ops *op = p->be->ops;
    if (!p->src) {  // the own store, wherever it keeps the layer
        return tri__kv_policy_peek_store(p->kv, il, h, pos, which, out);
    }
    tri__retrieval_state *s = p->ret;
    const char *src;
    int64_t bytes = row;
    if (from_chunk >= 0) {  // of the gathered type (gather_type)
        bytes = s->grow;
        src = (const char *)(which ? s->gv : s->gk)[il] + ((int64_t)h * p->p.budget + from_chunk) * bytes;
    } else if (pos >= s->tail0) {
        src = (const char *)(which ? p->own.v : p->own.k)[il] + row_at(p, pos % s->ring, h);
    } else {  // below the tail with no selection: src's row
        return tri__kv_policy_peek_store(p->src, il, h, pos, which, out);
    }
    return op->copy_to_host(p->be, out, src, (size_t)bytes) == TRI_STATUS_OK && op->synchronize(p->be) == TRI_STATUS_OK;
}

const tri__kv_policy_ops tri__kv_policy_retrieval_ops = {
    .name = "retrieval",
    .check = ret_check,
    .init = ret_init,
    .free = ret_free,
    .room = ret_room,
    .begin = ret_begin,
    .layer = ret_layer,
    .commit = ret_commit,
    .abort = ret_abort,
    .truncate = ret_truncate,
    .reset = ret_reset,
    .adopt_borrowed = ret_adopt_borrowed,
    .attends_fully = ret_attends_fully,
    .adopted = ret_adopted,
    .peek = ret_peek,
};
