// kv-policy.c - full, StreamingLLM, H2O and retrieval (TriForce) cache policies.
#include "kv-policy.h"

#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"

#define TRY(call)                              \
    do {                                       \
        tri_status st_ = (call);               \
        if (st_ != TRI_STATUS_OK) return st_;  \
    } while (0)

// ---- per-policy state ----

// H2O: what one step changed, to undo it exactly.
typedef struct h2o_record {
    int32_t n0, m;    // the step's first position and length
    int32_t *row0;    // (n_layer * n_head_kv) the store row of the step's first token per head
    int32_t *slot;    // (n_layer * n_head_kv, cap) snapshot before the step
    int32_t *cnt;     // (n_layer * n_head_kv) snapshot before the step
    int32_t *pos;     // (n_layer * n_head_kv, cap)
    float *score;     // (n_layer * n_head_kv, cap)
    float *q;         // (n_layer, max_step, n_head * head_dim) the step's rotated queries
} h2o_record;

struct tri__h2o_state {
    int32_t cap;       // budget + max_step: kept rows per (layer, head) during a step
    int32_t recent;    // always-kept recent tokens
    int32_t *cnt;      // (n_layer * n_head_kv) rows kept
    int32_t *pos;      // (n_layer * n_head_kv, cap) kept positions, ascending
    float *score;      // (n_layer * n_head_kv, cap) accumulated attention of each kept position
    int32_t *slot;     // (n_layer * n_head_kv, cap) the store row holding each kept position, ascending
    // the store: a head's kept rows in position order with holes where positions were evicted; a
    // step's tokens go to rows top .. top + m - 1 (every head). Bounded (rows < the capacity), the
    // rows still needed (kept now or by a remembered step) move down when the next step does not
    // fit; else row = position, as a full cache.
    bool bounded;
    int32_t rows;      // store rows per layer
    int32_t top;       // bounded: rows in use
    int32_t *step_row0;  // (n_layer * n_head_kv) the step's first row per head (top, or n0)
    int32_t *row_pos;  // bounded: (n_layer * n_head_kv, rows) the position each row holds
    int32_t *remap;    // bounded: (rows) compaction scratch
    int64_t *offs;     // bounded: (rows * n_head_kv) compaction gather offsets
    void *moved;       // bounded: (rows, n_head_kv * head_dim) backend, the cache type: compacted rows
    unsigned char *drop;  // (cap) eviction scratch
    float *ws_dev;     // (n_head_kv * cap) backend: the attention op's weight sums
    float *ws;         // (n_head_kv * cap) host copy
    float *q_dev;      // (max_step, n_head * head_dim) backend: replayed queries
    float *out_dev;    // (max_step, n_head * head_dim) backend: replayed attention output
    int32_t *q_pos;    // (max_step) host: replayed positions
    h2o_record *rec;   // (history) oldest first
    int32_t n_rec;
};

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
    // the last step, so that a rollback into it can make the selection it would have made
    float *stepq;             // (max_step, n_layer, n_head_kv, head_dim) host: each token's query
                              // summed over its KV head's group
    int32_t step_n0, step_m;  // the step (step_m 0: none remembered)
    bool step_armed;          // armed when the step began
    float *qrow;              // (max_step, n_head * head_dim) host scratch
    int32_t rows_chunks;      // chunks summarised per read
    float *means;             // (rows_chunks, n_head_kv * head_dim) host: a read's chunk means
    float *means_dev;         // the same in backend memory, for keys there (allocated when needed)
    float *summ;              // (n_head_kv, rows_chunks, head_dim) host: the means by head
    int32_t *found;           // (kmax) host scratch
    // borrowed rows (p->src; kv-policy.h): positions below tail0 are src's, tail0 .. len - 1 the
    // policy's own, in the ring p->own (position i in row i % ring)
    int32_t ring;
    int32_t tail0;
    void **gk, **gv;          // (n_layer) -> (n_head_kv, budget, head_dim) backend: the current
                              // selection's rows, head h's chunks from row h * budget, in chunk order
    int64_t *offs;            // (n_head_kv * budget) host: where each of those rows is in a layer
    void *stage;              // (n_head_kv * budget, head_dim) host: an offloaded layer's gather
    bool stage_pinned;
    uint64_t bytes_up;        // host -> backend: offloaded layers' gathers and ring fills
    // a selection being made during the full cache's step (tri__kv_policy_tap)
    sel_entry tap;            // cnt/ids allocated while armed
    int32_t tap_layers;       // layers done
    int32_t tap_first;        // chunks summarised before it
    struct tri__kv_policy *tap_owner;  // the full policy armed to make it; NULL: none armed
    void *tap_rows;           // (n_layer, K/V, chunk rows) backend: each layer's rows from the
                              // bound to the tap's length, put into the ring once it is taken
};

const char *tri__kv_policy_name(tri_kv_policy kind) {
    switch (kind) {
    case TRI_KV_POLICY_FULL: return "full";
    case TRI_KV_POLICY_STREAMING: return "streaming";
    case TRI_KV_POLICY_H2O: return "h2o";
    case TRI_KV_POLICY_RETRIEVAL: return "retrieval";
    }
    return "?";
}

tri__kv_policy_params tri__kv_policy_default_params(tri_kv_policy kind, int32_t capacity) {
    tri__kv_policy_params p = {.kind = kind, .budget = 4096, .chunk = 8, .refresh = 0, .index = TRI_CHUNK_INDEX_EXACT};
    if (capacity > 0 && p.budget > capacity) p.budget = capacity;
    p.sink = p.budget >= 32 ? 16 : p.budget / 2;
    return p;
}

void tri__kv_policy_default_budget(tri__kv_policy_params *p, int32_t capacity) {
    if (p->kind == TRI_KV_POLICY_FULL) return;
    int32_t budget = 4096;
    if (budget >= capacity) {
        *p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, capacity);
        return;
    }
    if (p->kind == TRI_KV_POLICY_RETRIEVAL && p->chunk > 0 && p->chunk <= budget) budget -= budget % p->chunk;
    p->budget = budget;
}

void tri__kv_policy_cover(tri__kv_policy_params *p, int32_t capacity) {
    if (p->kind != TRI_KV_POLICY_FULL && p->budget > capacity)
        *p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, capacity);
}

tri_status tri__kv_policy_check(const tri__kv_policy_params *p, int32_t capacity) {
    const char *name = tri__kv_policy_name(p->kind);
    if (p->kind < TRI_KV_POLICY_FULL || p->kind > TRI_KV_POLICY_RETRIEVAL)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: unknown policy %d", (int)p->kind);
    if (p->kind == TRI_KV_POLICY_FULL) return TRI_STATUS_OK;
    if (p->budget <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: budget %d must be positive", name, p->budget);
    if (p->budget > capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy %s: budget %d is larger than the context (%d positions)",
                         name, p->budget, capacity);
    switch (p->kind) {
    case TRI_KV_POLICY_STREAMING:
        if (p->sink < 0 || p->sink >= p->budget)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy streaming: sink %d must be in [0, budget %d) to leave room for recent tokens",
                             p->sink, p->budget);
        break;
    case TRI_KV_POLICY_H2O:
        if (p->recent < 0 || p->recent >= p->budget)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy h2o: recent window %d must be in [0, budget %d) to leave room for heavy hitters",
                             p->recent, p->budget);
        if (p->history < 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy h2o: history %d must be >= 0", p->history);
        break;
    case TRI_KV_POLICY_RETRIEVAL:
        if (p->chunk <= 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: chunk size %d must be positive", p->chunk);
        if (p->chunk > p->budget || p->budget % p->chunk != 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy retrieval: chunk size %d must divide the budget %d (whole chunks are kept)",
                             p->chunk, p->budget);
        if (p->refresh < 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: refresh interval %d must be >= 0",
                             p->refresh);
        if (p->index < TRI_CHUNK_INDEX_EXACT || p->index > TRI_CHUNK_INDEX_FAISS_IVF)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy retrieval: unknown chunk index %d", (int)p->index);
        if (p->index != TRI_CHUNK_INDEX_EXACT && !tri__chunk_index_have_faiss())
            return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy retrieval: FAISS index asked for, but this build has no FAISS");
        break;
    default: break;
    }
    return TRI_STATUS_OK;
}

static int32_t kv_dim(const tri__kv_policy *p) { return p->n_head_kv * p->head_dim; }
static int64_t esize(const tri__kv_policy *p) { return p->kv->type == TRI_DTYPE_F16 ? 2 : 4; }
// Bytes of one position of one layer (every KV head), keys or values.
static int64_t row_bytes(const tri__kv_policy *p) { return kv_dim(p) * esize(p); }

// ---- life cycle ----

static void h2o_free(tri__kv_policy *p) {
    tri__h2o_state *s = p->h2o;
    if (!s) return;
    free(s->cnt);
    free(s->pos);
    free(s->score);
    free(s->drop);
    free(s->ws);
    free(s->q_pos);
    free(s->slot);
    free(s->step_row0);
    free(s->row_pos);
    free(s->remap);
    free(s->offs);
    p->be->ops->free(p->be, s->moved);
    p->be->ops->free(p->be, s->ws_dev);
    p->be->ops->free(p->be, s->q_dev);
    p->be->ops->free(p->be, s->out_dev);
    if (s->rec)
        for (int32_t i = 0; i < p->p.history; i++) {
            free(s->rec[i].cnt);
            free(s->rec[i].pos);
            free(s->rec[i].score);
            free(s->rec[i].q);
            free(s->rec[i].slot);
            free(s->rec[i].row0);
        }
    free(s->rec);
    free(s);
    p->h2o = NULL;
}

static void retrieval_free(tri__kv_policy *p) {
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
    free(s->stepq);
    free(s->qrow);
    free(s->means);
    p->be->ops->free(p->be, s->means_dev);
    free(s->summ);
    free(s->found);
    for (int32_t il = 0; il < p->n_layer; il++) {
        if (s->gk) p->be->ops->free(p->be, s->gk[il]);
        if (s->gv) p->be->ops->free(p->be, s->gv[il]);
    }
    free(s->gk);
    free(s->gv);
    free(s->offs);
    free(s->tap.cnt);
    free(s->tap.ids);
    p->be->ops->free(p->be, s->tap_rows);
    if (s->stage_pinned) p->be->ops->host_unregister(p->be, s->stage);
    free(s->stage);
    free(s);
    p->ret = NULL;
}

void tri__kv_policy_free(tri__kv_policy *p) {
    h2o_free(p);
    retrieval_free(p);
    if (p->be) {
        p->be->ops->free(p->be, p->sk);
        p->be->ops->free(p->be, p->sv);
    }
    if (p->be) {
        p->be->ops->free(p->be, p->m_ws);
        p->be->ops->free(p->be, p->m_out);
        p->be->ops->free(p->be, p->m_k);
        p->be->ops->free(p->be, p->m_v);
        p->be->ops->free(p->be, p->m_q);
    }
    free(p->m_ws_host);
    free(p->m_pos);
    free(p->gather);
    free(p->cache_pos);
    free(p->q_pos);
    free(p->spans);
    free(p->head_span);
    tri__kv_store_free(&p->own);
    memset(p, 0, sizeof *p);
}

#define ALLOC(ptr, count)                                                                   \
    do {                                                                                    \
        (ptr) = calloc((size_t)(count), sizeof *(ptr));                                     \
        if (!(ptr)) {                                                                       \
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy: %s (%lld)", #ptr, (long long)(count)); \
            goto fail;                                                                      \
        }                                                                                   \
    } while (0)

// The descriptors every policy needs.
static tri_status common_init(tri__kv_policy *p, int32_t spans_per_head) {
    tri_status st = TRI_STATUS_OK;
    p->spans_cap = spans_per_head * p->n_head_kv;
    ALLOC(p->spans, p->spans_cap);
    ALLOC(p->head_span, p->n_head_kv + 1);
    ALLOC(p->q_pos, p->max_step);
    return TRI_STATUS_OK;
fail:
    return st;
}

static tri_status h2o_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    tri__h2o_state *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy h2o");
    p->h2o = s;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv, qd = (int64_t)p->n_head * p->head_dim;
    s->cap = p->p.budget + p->max_step;
    s->recent = p->p.recent;
    ALLOC(s->cnt, heads);
    ALLOC(s->pos, heads * s->cap);
    ALLOC(s->score, heads * s->cap);
    ALLOC(s->slot, heads * s->cap);
    ALLOC(s->step_row0, heads);
    ALLOC(s->drop, s->cap);
    s->rows = p->kv->capacity;
    s->bounded = p->cap > 0;
    if (s->bounded) {
        ALLOC(s->row_pos, heads * s->rows);
        ALLOC(s->remap, s->rows);
        ALLOC(s->offs, (int64_t)s->rows * p->n_head_kv);
        TRY(p->be->ops->alloc(p->be, (size_t)(s->rows * row_bytes(p)), &s->moved));
    }
    ALLOC(s->ws, (int64_t)p->n_head_kv * s->cap);
    ALLOC(s->q_pos, p->max_step);
    ALLOC(s->rec, p->p.history);
    for (int32_t i = 0; i < p->p.history; i++) {
        ALLOC(s->rec[i].cnt, heads);
        ALLOC(s->rec[i].pos, heads * s->cap);
        ALLOC(s->rec[i].score, heads * s->cap);
        ALLOC(s->rec[i].slot, heads * s->cap);
        ALLOC(s->rec[i].row0, heads);
        ALLOC(s->rec[i].q, (int64_t)p->n_layer * p->max_step * qd);
    }
    TRY(p->be->ops->alloc(p->be, sizeof(float) * (size_t)p->n_head_kv * (size_t)s->cap, (void **)&s->ws_dev));
    TRY(p->be->ops->alloc(p->be, sizeof(float) * (size_t)(p->max_step * qd), (void **)&s->q_dev));
    TRY(p->be->ops->alloc(p->be, sizeof(float) * (size_t)(p->max_step * qd), (void **)&s->out_dev));
    return TRI_STATUS_OK;
fail:
    return st;
}

static tri_status retrieval_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    tri__retrieval_state *s = calloc(1, sizeof *s);
    if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval");
    p->ret = s;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    s->kmax = p->p.budget / p->p.chunk;
    ALLOC(s->ix, heads);
    for (int64_t i = 0; i < heads; i++) TRY(tri__chunk_index_create(p->p.index, p->head_dim, &s->ix[i]));
    ALLOC(s->stepq, (int64_t)p->max_step * heads * p->head_dim);
    ALLOC(s->qrow, (int64_t)p->max_step * p->n_head * p->head_dim);
    s->rows_chunks = p->p.chunk < 2048 ? 2048 / p->p.chunk : 1;  // ~2K rows per read
    ALLOC(s->means, (int64_t)s->rows_chunks * kv_dim(p));
    ALLOC(s->summ, (int64_t)s->rows_chunks * kv_dim(p));
    ALLOC(s->found, s->kmax);
    return TRI_STATUS_OK;
fail:
    return st;
}

tri_status tri__kv_policy_init(tri__kv_policy *p, const tri__kv_policy_params *params, tri__backend *be,
                               tri_dtype kv_type, int32_t n_layer, int32_t n_head, int32_t n_head_kv,
                               int32_t head_dim, int32_t capacity, int32_t max_step) {
    memset(p, 0, sizeof *p);
    tri_status st = tri__kv_policy_check(params, capacity);
    if (st) return st;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || max_step <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: %d heads over %d KV heads, steps of %d", n_head,
                         n_head_kv, max_step);
    p->p = *params;
    if (p->p.kind == TRI_KV_POLICY_H2O) {
        if (p->p.recent == 0) p->p.recent = p->p.budget / 2;
        if (p->p.history == 0) p->p.history = 8;
    }
    p->be = be;
    p->n_layer = n_layer;
    p->n_head = n_head;
    p->n_head_kv = n_head_kv;
    p->head_dim = head_dim;
    p->max_step = max_step;
    int32_t store_rows = capacity;
    if (p->p.kind == TRI_KV_POLICY_STREAMING) {
        if (p->p.evict_every < 0 || p->p.evict_every > max_step || p->p.rollback < 0) {
            st = tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                           "kv policy streaming: evict_every %d must be in [0, %d] (a step) and rollback %d >= 0",
                           p->p.evict_every, max_step, p->p.rollback);
            goto fail;
        }
        if (p->p.rollback == 0) p->p.rollback = max_step;
        // the sinks, the window before a step, the step and the rows a rollback may need again; a
        // store of every position where that is no less
        int64_t ring = (int64_t)(p->p.budget - p->p.sink) + max_step + p->p.rollback;
        if (!p->p.keep_all && p->p.sink + ring < capacity) {
            p->ring_rows = (int32_t)ring;
            p->cap = capacity;
            store_rows = p->p.sink + p->ring_rows;
        }
    }
    if (p->p.kind == TRI_KV_POLICY_H2O && !p->p.keep_all) {
        // the kept rows, the rows of the remembered steps (their evictions and tokens, which a
        // rollback replays), a step, and as many again so that rows move once per budget tokens
        int64_t rows = 2 * (int64_t)p->p.budget + (int64_t)(p->p.history + 1) * max_step;
        if (rows < capacity) {
            p->cap = capacity;
            store_rows = (int32_t)rows;
        }
    }
    if ((st = tri__kv_store_init(&p->own, be, kv_type, n_layer, n_head_kv, head_dim, store_rows))) goto fail;
    p->kv = &p->own;
    switch (p->p.kind) {
    case TRI_KV_POLICY_FULL:
        if ((st = common_init(p, 1))) goto fail;
        break;
    case TRI_KV_POLICY_STREAMING: {
        p->raw_keys = true;
        if ((st = common_init(p, 1))) goto fail;
        int64_t rows = (int64_t)p->p.budget + max_step;
        if ((st = be->ops->alloc(be, sizeof(float) * (size_t)(rows * kv_dim(p)), (void **)&p->sk))) goto fail;
        if ((st = be->ops->alloc(be, sizeof(float) * (size_t)(rows * kv_dim(p)), (void **)&p->sv))) goto fail;
        ALLOC(p->gather, rows);
        ALLOC(p->cache_pos, rows);
        for (int32_t i = 0; i < rows; i++) p->cache_pos[i] = i;
        break;
    }
    case TRI_KV_POLICY_H2O:
        // one span per run of kept positions: at most one per kept row, plus the step's tokens
        if ((st = common_init(p, p->p.budget + 1))) goto fail;
        if ((st = h2o_init(p))) goto fail;
        break;
    case TRI_KV_POLICY_RETRIEVAL:
        // one span per selected chunk, plus the tokens since the selection
        if ((st = common_init(p, p->p.budget / p->p.chunk + 1))) goto fail;
        if ((st = retrieval_init(p))) goto fail;
        break;
    }
    return TRI_STATUS_OK;
fail:
    tri__kv_policy_free(p);
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
    if (ring < params->chunk + max_step)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: a ring of %d own rows is smaller than a chunk (%d) and a step (%d)",
                         ring, params->chunk, max_step);
    p->p = *params;
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
    if ((st = common_init(p, p->p.budget / p->p.chunk + 2))) goto fail;
    if ((st = retrieval_init(p))) goto fail;
    tri__retrieval_state *s = p->ret;
    s->ring = ring;
    const int64_t rows = (int64_t)p->n_head_kv * p->p.budget, row_bytes = (int64_t)p->head_dim * esize(p);
    ALLOC(s->gk, p->n_layer);
    ALLOC(s->gv, p->n_layer);
    for (int32_t il = 0; il < p->n_layer; il++) {
        if ((st = p->be->ops->alloc(p->be, (size_t)(rows * row_bytes), &s->gk[il]))) goto fail;
        if ((st = p->be->ops->alloc(p->be, (size_t)(rows * row_bytes), &s->gv[il]))) goto fail;
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
    }
    return TRI_STATUS_OK;
fail:
    tri__kv_policy_free(p);
    return st;
}

uint64_t tri__kv_policy_bytes_up(const tri__kv_policy *p) { return p->src ? p->ret->bytes_up : 0; }

int32_t tri__kv_policy_room(const tri__kv_policy *p) {
    if (p->src) return p->ret->ring - (p->len - p->ret->tail0);
    return tri__kv_policy_capacity(p) - tri__kv_policy_len(p);
}

tri_status tri__kv_policy_wrap_full(tri__kv_policy *p, tri__kv_store *kv, int32_t n_head, int32_t max_step) {
    memset(p, 0, sizeof *p);
    p->p = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, kv->capacity);
    p->kv = kv;
    p->be = kv->be;
    p->n_layer = kv->n_layer;
    p->n_head = n_head;
    p->n_head_kv = kv->n_head_kv;
    p->head_dim = kv->head_dim;
    p->max_step = max_step;
    tri_status st = common_init(p, 1);
    if (st) tri__kv_policy_free(p);
    return st;
}

// ---- H2O ----

static int32_t *h2o_pos(const tri__kv_policy *p, int32_t il, int32_t h) {
    return p->h2o->pos + ((int64_t)il * p->n_head_kv + h) * p->h2o->cap;
}
static float *h2o_score(const tri__kv_policy *p, int32_t il, int32_t h) {
    return p->h2o->score + ((int64_t)il * p->n_head_kv + h) * p->h2o->cap;
}

// Layer il's view: runs of kept positions in consecutive rows, then the step's tokens [n0, n0 + m)
// from row row0[h] of each head (row0: (n_layer * n_head_kv)). Rows are positions unless bounded,
// where each span reads its rows' positions from row_pos.
static void h2o_view(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const int32_t *row0) {
    tri__h2o_state *s = p->h2o;
    const int64_t es = esize(p), kd = kv_dim(p);
    int32_t ns = 0;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        p->head_span[h] = ns;
        const int64_t hi = (int64_t)il * p->n_head_kv + h;
        const int32_t *pos = h2o_pos(p, il, h), *slot = s->slot + hi * s->cap;
        int32_t cnt = s->cnt[hi];
        for (int32_t i = 0; i <= cnt;) {
            int32_t start, row, len;
            if (i == cnt) {  // the step's tokens
                start = n0;
                row = row0[hi];
                len = m;
                i++;
            } else {
                start = pos[i];
                row = slot[i];
                len = 1;
                while (i + len < cnt && slot[i + len] == row + len && (s->bounded || pos[i + len] == start + len))
                    len++;
                i += len;
            }
            if (len == 0) continue;
            if (ns > p->head_span[h]) {
                tri__kv_span *last = &p->spans[ns - 1];
                int64_t last_row = ((const char *)last->k - (const char *)p->kv->k[il]) / es / kd + last->n;
                if (last_row == row && (s->bounded || last->pos0 + last->n == start)) {
                    last->n += len;  // contiguous with the step: one span, as the full view has
                    continue;
                }
            }
            int64_t off = ((int64_t)row * kd + (int64_t)h * p->head_dim) * es;
            p->spans[ns++] = (tri__kv_span){.pos0 = start, .n = len, .k = (const char *)p->kv->k[il] + off,
                                            .v = (const char *)p->kv->v[il] + off, .stride = kd,
                                            .pos = s->bounded ? s->row_pos + hi * s->rows + row : NULL};
        }
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
}

// Adds the weight sums (host, in view order) to the kept scores and appends the step's tokens.
static void h2o_accumulate(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const int32_t *row0) {
    const float *ws = p->h2o->ws;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        const int64_t hi = (int64_t)il * p->n_head_kv + h;
        int32_t *cnt = &p->h2o->cnt[hi];
        int32_t *pos = h2o_pos(p, il, h), *slot = p->h2o->slot + hi * p->h2o->cap;
        float *sc = h2o_score(p, il, h);
        for (int32_t j = 0; j < *cnt; j++) sc[j] += ws[j];
        for (int32_t j = 0; j < m; j++) {
            pos[*cnt + j] = n0 + j;
            slot[*cnt + j] = row0[hi] + j;
            sc[*cnt + j] = ws[*cnt + j];
        }
        ws += *cnt + m;
        *cnt += m;
    }
}

// Evicts down to the budget: the lowest accumulated scores outside the recent window go first,
// ties by the older position.
static void h2o_evict(tri__kv_policy *p, int32_t il, int32_t len) {
    tri__h2o_state *s = p->h2o;
    int32_t protect = len - s->recent;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        int32_t *cnt = &s->cnt[il * p->n_head_kv + h];
        int32_t *pos = h2o_pos(p, il, h);
        float *sc = h2o_score(p, il, h);
        int32_t over = *cnt - p->p.budget;
        if (over <= 0) continue;
        memset(s->drop, 0, (size_t)*cnt);
        for (int32_t r = 0; r < over; r++) {
            int32_t w = -1;
            for (int32_t j = 0; j < *cnt && pos[j] < protect; j++)
                if (!s->drop[j] && (w < 0 || sc[j] < sc[w])) w = j;
            TRI_ASSERT(w >= 0);
            s->drop[w] = 1;
        }
        int32_t o = 0;
        int32_t *slot = s->slot + ((int64_t)il * p->n_head_kv + h) * s->cap;
        for (int32_t j = 0; j < *cnt; j++)
            if (!s->drop[j]) {
                pos[o] = pos[j];
                slot[o] = slot[j];
                sc[o] = sc[j];
                o++;
            }
        *cnt = o;
    }
}

static void h2o_snapshot(tri__kv_policy *p, h2o_record *r) {
    tri__h2o_state *s = p->h2o;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    memcpy(r->cnt, s->cnt, sizeof *r->cnt * (size_t)heads);
    memcpy(r->pos, s->pos, sizeof *r->pos * (size_t)(heads * s->cap));
    memcpy(r->slot, s->slot, sizeof *r->slot * (size_t)(heads * s->cap));
    memcpy(r->score, s->score, sizeof *r->score * (size_t)(heads * s->cap));
}

static void h2o_restore(tri__kv_policy *p, const h2o_record *r) {
    tri__h2o_state *s = p->h2o;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    memcpy(s->cnt, r->cnt, sizeof *r->cnt * (size_t)heads);
    memcpy(s->pos, r->pos, sizeof *r->pos * (size_t)(heads * s->cap));
    memcpy(s->slot, r->slot, sizeof *r->slot * (size_t)(heads * s->cap));
    memcpy(s->score, r->score, sizeof *r->score * (size_t)(heads * s->cap));
}

// Opens a record for a step at n0, dropping the oldest when the history is full.
static h2o_record *h2o_push(tri__kv_policy *p, int32_t n0, int32_t m) {
    tri__h2o_state *s = p->h2o;
    if (s->n_rec == p->p.history) {
        h2o_record first = s->rec[0];
        memmove(s->rec, s->rec + 1, sizeof *s->rec * (size_t)(s->n_rec - 1));
        s->rec[--s->n_rec] = first;
    }
    h2o_record *r = &s->rec[s->n_rec++];
    r->n0 = n0;
    r->m = m;
    memcpy(r->row0, s->step_row0, sizeof *r->row0 * (size_t)(p->n_layer * p->n_head_kv));
    h2o_snapshot(p, r);
    return r;
}

// Runs the first k queries of record r again over the restored state: exactly what a step of k
// tokens would have done (the attention of a query ignores later keys, and its weight sums add
// the same terms in the same order).
static tri_status h2o_replay(tri__kv_policy *p, h2o_record *r, int32_t k) {
    tri__h2o_state *s = p->h2o;
    const tri__backend_ops *op = p->be->ops;
    int64_t qd = (int64_t)p->n_head * p->head_dim;
    for (int32_t i = 0; i < k; i++) s->q_pos[i] = r->n0 + i;
    for (int32_t il = 0; il < p->n_layer; il++) {
        h2o_view(p, il, r->n0, k, r->row0);
        p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                                 .head_span = p->head_span};
        const float *q = r->q + (int64_t)il * p->max_step * qd;
        TRY(op->copy_to_backend(p->be, s->q_dev, q, sizeof(float) * (size_t)(k * qd)));
        TRY(op->attention(p->be, s->out_dev, s->q_dev, s->q_pos, k, p->n_head, p->head_dim, &p->view, s->ws_dev));
        int64_t n_keys = 0;
        for (int32_t si = 0; si < p->head_span[p->n_head_kv]; si++) n_keys += p->spans[si].n;
        TRY(op->copy_to_host(p->be, s->ws, s->ws_dev, sizeof(float) * (size_t)n_keys));
        TRY(op->synchronize(p->be));
        h2o_accumulate(p, il, r->n0, k, r->row0);
        h2o_evict(p, il, r->n0 + k);
    }
    r->m = k;
    return TRI_STATUS_OK;
}

// Bounded: moves each head's rows still needed (kept now, kept before a remembered step, or a
// remembered step's tokens) down to rows 0, 1, ... in order, one gather per layer for K and one
// for V, and renumbers the slots.
static tri_status h2o_compact(tri__kv_policy *p) {
    tri__h2o_state *s = p->h2o;
    const tri__backend_ops *op = p->be->ops;
    const int32_t nkv = p->n_head_kv, hd = p->head_dim;
    const int64_t es = esize(p), kd = kv_dim(p);
    if (!op->copy) return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy h2o: backend %s copies no rows", op->name);
    int32_t new_top = 0;
    for (int32_t il = 0; il < p->n_layer; il++) {
        for (int32_t h = 0; h < nkv; h++) {
            const int64_t hi = (int64_t)il * nkv + h;
            // mark (remap 1) the rows needed, then number them in order
            memset(s->remap, 0, sizeof *s->remap * (size_t)s->rows);
            for (int32_t j = 0; j < s->cnt[hi]; j++) s->remap[s->slot[hi * s->cap + j]] = 1;
            for (int32_t r = 0; r < s->n_rec; r++) {
                const h2o_record *rc = &s->rec[r];
                for (int32_t j = 0; j < rc->cnt[hi]; j++) s->remap[rc->slot[hi * s->cap + j]] = 1;
                for (int32_t j = 0; j < rc->m; j++) s->remap[rc->row0[hi] + j] = 1;
            }
            int32_t n = 0;
            int32_t *rp = s->row_pos + hi * s->rows;
            for (int32_t row = 0; row < s->top; row++) {
                if (!s->remap[row]) {
                    s->remap[row] = -1;
                    continue;
                }
                s->offs[(int64_t)n * nkv + h] = ((int64_t)row * kd + (int64_t)h * hd) * es;
                rp[n] = rp[row];  // n <= row: in place
                s->remap[row] = n++;
            }
            for (int32_t r = n; r < s->rows; r++) s->offs[(int64_t)r * nkv + h] = (int64_t)h * hd * es;
            if (n > new_top) new_top = n;
            for (int32_t j = 0; j < s->cnt[hi]; j++) s->slot[hi * s->cap + j] = s->remap[s->slot[hi * s->cap + j]];
            for (int32_t r = 0; r < s->n_rec; r++) {
                h2o_record *rc = &s->rec[r];
                int32_t *rs = rc->slot + hi * s->cap;
                for (int32_t j = 0; j < rc->cnt[hi]; j++) rs[j] = s->remap[rs[j]];
                if (rc->m > 0) rc->row0[hi] = s->remap[rc->row0[hi]];
            }
        }
        // every head of the layer numbered: move its K and V rows
        int64_t n_rows = (int64_t)new_top;
        for (int which = 0; which < 2; which++) {
            void *base = which ? p->kv->v[il] : p->kv->k[il];
            if (n_rows == 0) break;
            TRY(op->gather(p->be, s->moved, base, s->offs, n_rows * nkv, hd * es));
            TRY(op->copy(p->be, base, s->moved, (size_t)(n_rows * kd * es)));
        }
    }
    s->top = new_top;
    return TRI_STATUS_OK;
}

// Chooses the rows of a step of m tokens at n0 (step_row0) and records their positions: the
// position's own row, or, bounded, the next rows free (after moving the rows still needed down
// when the step would not fit).
static tri_status h2o_place(tri__kv_policy *p, int32_t n0, int32_t m) {
    tri__h2o_state *s = p->h2o;
    const int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    if (!s->bounded) {
        for (int64_t i = 0; i < heads; i++) s->step_row0[i] = n0;
        return TRI_STATUS_OK;
    }
    if (s->top + m > s->rows) TRY(h2o_compact(p));
    if (s->top + m > s->rows)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy h2o: %d rows still needed and a step of %d exceed the store's %d rows", s->top, m,
                         s->rows);
    for (int64_t i = 0; i < heads; i++) {
        s->step_row0[i] = s->top;
        for (int32_t j = 0; j < m; j++) s->row_pos[i * s->rows + s->top + j] = n0 + j;
    }
    s->top += m;
    return TRI_STATUS_OK;
}

static tri_status h2o_truncate(tri__kv_policy *p, int32_t n) {
    tri__h2o_state *s = p->h2o;
    int32_t len = tri__kv_policy_len(p);
    if (n == len) return TRI_STATUS_OK;
    if (s->n_rec == 0 || n < s->rec[0].n0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy h2o: cannot roll back to %d of %d positions: the last %d steps are remembered "
                         "(from position %d)", n, len, s->n_rec, s->n_rec ? s->rec[0].n0 : len);
    while (s->n_rec > 0 && s->rec[s->n_rec - 1].n0 >= n) {
        h2o_restore(p, &s->rec[s->n_rec - 1]);
        s->n_rec--;
    }
    if (s->n_rec > 0) {
        h2o_record *r = &s->rec[s->n_rec - 1];
        if (n < r->n0 + r->m) {
            h2o_restore(p, r);
            return h2o_replay(p, r, n - r->n0);
        }
    }
    return TRI_STATUS_OK;
}

// ---- retrieval ----

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
    const int64_t row = row_bytes(p);
    const bool host = L->region || p->be->host_memory;
    for (int32_t c0 = first; c0 < last; c0 += s->rows_chunks) {
        const int32_t nc = last - c0 < s->rows_chunks ? last - c0 : s->rows_chunks;
        const char *rows = L->k + (int64_t)c0 * C * row;
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
    const int64_t row = row_bytes(p);
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
    return ring_put(p, il, pos, n, L->k + pos * row_bytes(p), L->v + pos * row_bytes(p), L->region);
}

// Gathers layer il's chunks of selection e out of L into gk/gv.
static tri_status gather_layer(tri__kv_policy *p, const sel_entry *e, int32_t il, const layer_rows *L) {
    tri__retrieval_state *s = p->ret;
    const tri__backend_ops *op = p->be->ops;
    const int32_t C = p->p.chunk, budget = p->p.budget, hd = p->head_dim, kd = kv_dim(p);
    const int64_t es = esize(p), row_bytes = hd * es, rows = (int64_t)p->n_head_kv * budget;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        int64_t i = (int64_t)il * p->n_head_kv + h, r = (int64_t)h * budget;
        const int32_t *ids = e->ids + i * s->kmax;
        for (int32_t a = 0; a < e->cnt[i]; a++)
            for (int32_t t = 0; t < C; t++) s->offs[r++] = (((int64_t)ids[a] * C + t) * kd + (int64_t)h * hd) * es;
        for (; r < (int64_t)(h + 1) * budget; r++) s->offs[r] = 0;  // unused rows
    }
    for (int which = 0; which < 2; which++) {
        const char *from = which ? L->v : L->k;
        void *to = which ? s->gv[il] : s->gk[il];
        if (!L->region) {
            TRY(op->gather(p->be, to, from, s->offs, rows, row_bytes));
            continue;
        }
        if (op->host_work)  // a simulated device: rows that do not exist, work on its clock
            op->host_work(p->be, TRI_HOST_WORK_COPY, (double)(rows * row_bytes));
        else
            for (int64_t r = 0; r < rows; r++)
                memcpy((char *)s->stage + r * row_bytes, from + s->offs[r], (size_t)row_bytes);
        TRY(op->copy_to_backend(p->be, to, s->stage, (size_t)(rows * row_bytes)));
        TRY(op->synchronize(p->be));  // the staging is refilled next
        s->bytes_up += (uint64_t)(rows * row_bytes);
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
    const int64_t es = esize(p), kd = kv_dim(p);
    while (from < end) {
        int32_t slot = from % R, n = end - from < R - slot ? end - from : R - slot;
        int64_t off = ((int64_t)slot * kd + (int64_t)h * p->head_dim) * es;
        p->spans[(*ns)++] = (tri__kv_span){.pos0 = from, .n = n, .k = (const char *)p->own.k[il] + off,
                                           .v = (const char *)p->own.v[il] + off, .stride = kd};
        from += n;
    }
}

// Layer il's view over borrowed rows: before a selection src's rows below the tail and the ring;
// with one, the gathered chunks and the ring from the selection's bound.
static tri_status ret_view_borrowed(tri__kv_policy *p, int32_t il, int32_t end) {
    tri__retrieval_state *s = p->ret;
    const sel_entry *e = ret_current(p);
    const int64_t es = esize(p), hd = p->head_dim, C = p->p.chunk;
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
            int64_t off = (((int64_t)h * p->p.budget + a * C) * hd) * es;
            p->spans[ns++] = (tri__kv_span){.pos0 = start, .n = (int32_t)C, .k = (const char *)s->gk[il] + off,
                                            .v = (const char *)s->gv[il] + off, .stride = hd};
        }
        ring_spans(p, il, h, e->bound, end, &ns);
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
    return TRI_STATUS_OK;
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

// Chooses head i's chunks (i = layer * n_head_kv + KV head) among the first n_chunks by the summed
// group query q: chunk 0 and the best kmax - 1 others, ascending; all when they fit.
static tri_status select_head(tri__kv_policy *p, int64_t i, int32_t n_chunks, const float *q, int32_t *ids,
                              int32_t *cnt_out) {
    tri__retrieval_state *s = p->ret;
    int32_t cnt = 0;
    if (n_chunks <= s->kmax) {
        for (int32_t c = 0; c < n_chunks; c++) ids[cnt++] = c;
    } else {
        ids[cnt++] = 0;  // the attention sink
        int32_t found = 0;
        TRY(tri__chunk_index_search(s->ix[i], q, 1, s->kmax - 1, s->found, NULL, &found));
        // ascending chunk order: spans in position order, adjacent chunks merge
        for (int32_t a = 0; a < found; a++) {
            int32_t c = s->found[a], b = cnt;
            while (b > 1 && ids[b - 1] > c) {
                ids[b] = ids[b - 1];
                b--;
            }
            ids[b] = c;
            cnt++;
        }
    }
    *cnt_out = cnt;
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
// summed group query of the token at len - 1 (row `row` of the last step), at cache length len.
// Borrowing, the selection replaces the previous one (its rows are gathered over the old ones).
static tri_status ret_select(tri__kv_policy *p, int32_t len, int32_t row) {
    tri__retrieval_state *s = p->ret;
    int64_t heads = (int64_t)p->n_layer * p->n_head_kv;
    const int32_t bound = ret_bound(p, len);
    TRY(ret_summarise(p, bound));
    TRY(sel_reserve(s));
    sel_entry e = {.n_sel = len, .bound = bound};
    if (!sel_alloc(p, &e)) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy retrieval: selection");
    tri_status st = TRI_STATUS_OK;
    for (int64_t i = 0; !st && i < heads; i++)
        st = select_head(p, i, bound / p->p.chunk, s->stepq + ((int64_t)row * heads + i) * p->head_dim,
                         e.ids + i * s->kmax, &e.cnt[i]);
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
    const int64_t es = esize(p), kd = kv_dim(p);
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
            int64_t off = ((int64_t)start * kd + (int64_t)h * p->head_dim) * es;
            p->spans[ns++] = (tri__kv_span){.pos0 = start, .n = len, .k = (const char *)p->kv->k[il] + off,
                                            .v = (const char *)p->kv->v[il] + off, .stride = kd};
        }
    }
    p->head_span[p->n_head_kv] = ns;
    TRI_ASSERT(ns <= p->spans_cap);
}

// Keeps the step's queries, summed over each KV head's group: for GQA the chunk scores of the
// heads sharing a KV head add up, so the chunks chosen maximise the group's total logit mass
// (the mean would choose the same chunks; the max of the heads would follow one head only).
static tri_status ret_keep_query(tri__kv_policy *p, int32_t il, const float *q) {
    tri__retrieval_state *s = p->ret;
    int64_t qd = (int64_t)p->n_head * p->head_dim, heads = (int64_t)p->n_layer * p->n_head_kv;
    TRY(p->be->ops->copy_to_host(p->be, s->qrow, q, sizeof(float) * (size_t)(p->step_m * qd)));
    TRY(p->be->ops->synchronize(p->be));
    int32_t g = p->n_head / p->n_head_kv;
    for (int32_t t = 0; t < p->step_m; t++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            float *dst = s->stepq + ((int64_t)t * heads + (int64_t)il * p->n_head_kv + h) * p->head_dim;
            for (int32_t d = 0; d < p->head_dim; d++) {
                float acc = 0;
                for (int32_t a = 0; a < g; a++) acc += s->qrow[t * qd + (int64_t)(h * g + a) * p->head_dim + d];
                dst[d] = acc;
            }
        }
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
        if (ret_due(p, n, s->armed)) TRY(ret_select(p, n, s->step_m - 1));
    }
    return TRI_STATUS_OK;
}

// ---- selecting during the full cache's step ----

static void tap_finish(tri__kv_policy *full, bool ok);

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
    if (s->tap_owner) tap_finish(s->tap_owner, false);  // armed before and never made
    if (!s->tap_rows)
        TRY(ret->be->ops->alloc(ret->be, (size_t)(2 * (int64_t)ret->n_layer * ret->p.chunk * row_bytes(ret)),
                                &s->tap_rows));
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
    return (char *)ret->ret->tap_rows + (2 * (int64_t)il + which) * ret->p.chunk * row_bytes(ret);
}

// Layer il of the full cache's step that ends at the tap's length: ret selects that layer's chunks
// from row `row` of the step's queries q and the layer's rows in view (backend memory).
static tri_status tap_layer(tri__kv_policy *ret, int32_t il, const float *q, int32_t row, int32_t n_head,
                            const tri__kv_view *view) {
    tri__retrieval_state *s = ret->ret;
    sel_entry *e = &s->tap;
    const tri__backend_ops *op = ret->be->ops;
    const int32_t nkv = ret->n_head_kv, hd = ret->head_dim, g = n_head / nkv;
    const int64_t qd = (int64_t)n_head * hd;
    TRI_ASSERT(il == s->tap_layers && n_head == ret->n_head);
    // the query, summed over each KV head's group
    TRY(op->copy_to_host(ret->be, s->qrow, q + row * qd, sizeof(float) * (size_t)qd));
    TRY(op->synchronize(ret->be));
    float *gq = s->stepq;  // row 0 of the remembered step, layer 0's place: this layer's query
    for (int32_t h = 0; h < nkv; h++)
        for (int32_t d = 0; d < hd; d++) {
            float acc = 0;
            for (int32_t a = 0; a < g; a++) acc += s->qrow[(int64_t)(h * g + a) * hd + d];
            gq[(int64_t)h * hd + d] = acc;
        }
    // the layer's rows: head 0's span starts at row 0 of the layer
    const tri__kv_span *sp = &view->spans[view->head_span[0]];
    layer_rows L = {.k = sp->k, .v = sp->v, .region = false};
    TRY(summarise_layer(ret, il, &L, s->tap_first, e->bound / ret->p.chunk));
    for (int32_t h = 0; h < nkv; h++) {
        int64_t i = (int64_t)il * nkv + h;
        TRY(select_head(ret, i, e->bound / ret->p.chunk, gq + (int64_t)h * hd, e->ids + i * s->kmax, &e->cnt[i]));
    }
    TRY(gather_layer(ret, e, il, &L));
    // the rows from the bound: staged, the ring still holds the policy's own until it is taken
    if (e->bound < e->n_sel) {
        const int64_t rb = row_bytes(ret);
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
static void tap_finish(tri__kv_policy *full, bool ok) {
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
        // the tail may be overwritten; it keeps none
        if (ret->len > s->tail0) ret->len = s->tail0;
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
}

// ---- StreamingLLM over a bounded store ----

// The store row of position pos (kv-policy.h, ring_rows).
static int32_t stream_row(const tri__kv_policy *p, int32_t pos) {
    if (!p->ring_rows || pos < p->p.sink) return pos;
    return p->p.sink + (pos - p->p.sink) % p->ring_rows;
}

// Writes the step's rows k and v (m, n_head_kv * head_dim) f32 at positions n0 .. n0 + m - 1 of
// layer il into their rows: the sinks in place, the rest into the ring, in two writes where it
// wraps.
static tri_status stream_write(tri__kv_policy *p, int32_t il, int32_t n0, int32_t m, const float *k, const float *v) {
    const int64_t kd = kv_dim(p);
    for (int32_t done = 0; done < m;) {
        int32_t pos = n0 + done, row = stream_row(p, pos), n = m - done;
        if (pos < p->p.sink) {
            if (n > p->p.sink - pos) n = p->p.sink - pos;
        } else if (n > p->p.sink + p->ring_rows - row) {
            n = p->p.sink + p->ring_rows - row;
        }
        TRY(tri__kv_store_write(p->kv, il, row, n, k + done * kd, v + done * kd));
        done += n;
    }
    return TRI_STATUS_OK;
}

// Whether the rows a step at length n attends to are all still in the store: the sinks, and the
// window from budget - sink positions before n's eviction interval (everything before n up to
// the budget). Rows of positions below hw - ring_rows may have been overwritten.
static tri_status stream_check_rollback(const tri__kv_policy *p, int32_t n) {
    int32_t start = tri__kv_policy_evict_start(p, n);
    int32_t need = start == 0 ? p->p.sink : start - (p->p.budget - p->p.sink);
    int32_t have = p->hw - p->ring_rows;
    if (need < p->p.sink) need = p->p.sink;
    if (have <= p->p.sink || need >= have) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                     "kv policy streaming: cannot roll back to %d of %d positions: the store keeps %d rows past the "
                     "window (rollback), the window of %d starts at %d, position %d is overwritten",
                     n, p->len, p->p.rollback, n, need, have - 1);
}

// ---- the step ----

tri_status tri__kv_policy_begin(tri__kv_policy *p, int32_t m, const tri__rope *rope, int32_t *q_pos) {
    TRI_ASSERT(!p->in_step);
    int32_t n0 = tri__kv_policy_len(p), cap = tri__kv_policy_capacity(p);
    if (m <= 0 || m > p->max_step || n0 > cap - m)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: step of %d tokens after %d (steps of at most %d, capacity %d)",
                         m, n0, p->max_step, cap);
    if (p->src && m > tri__kv_policy_room(p))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy retrieval: %d more tokens do not fit the ring of %d own rows (%d since the tail at "
                         "%d): select again first", m, p->ret->ring, n0 - p->ret->tail0, p->ret->tail0);
    p->step_n0 = n0;
    p->step_m = m;
    p->rope = rope;
    int32_t base = n0;
    if (p->p.kind == TRI_KV_POLICY_STREAMING) {
        // sinks and the most recent tokens before the step's eviction interval, then the tokens of
        // the interval before the step: the rows holding them, rotated by their rank in the cache
        int32_t kept = 0, start = tri__kv_policy_evict_start(p, n0);
        if (start == 0) {
            for (int32_t i = 0; i < n0; i++) p->gather[kept++] = stream_row(p, i);
        } else {
            for (int32_t i = 0; i < p->p.sink; i++) p->gather[kept++] = i;
            for (int32_t i = start - (p->p.budget - p->p.sink); i < n0; i++) p->gather[kept++] = stream_row(p, i);
        }
        // a step past its interval attends to the interval's window (tri__kv_policy_step_limit_at
        // keeps the forward pass within one); the view and the ring hold budget + max_step rows
        if (kept + m > p->p.budget + p->max_step)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy streaming: a step of %d tokens at %d, %d into its eviction interval, exceeds "
                             "the %d rows of a step's view", m, n0, n0 - start, p->p.budget + p->max_step);
        for (int32_t i = 0; i < m; i++) p->gather[kept + i] = stream_row(p, n0 + i);
        p->step_kept = kept;
        base = kept;
        if (p->ring_rows && n0 + m > p->hw) p->hw = n0 + m;  // the step's rows overwrite older ones
    }
    if (p->h2o) {
        TRY(h2o_place(p, n0, m));
        h2o_push(p, n0, m);
    }
    for (int32_t i = 0; i < m; i++) q_pos[i] = base + i;
    p->in_step = true;
    return TRI_STATUS_OK;
}

static tri_status policy_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                               const tri__kv_view **view, float **weight_sums);
static tri_status measure_layer(tri__kv_policy *p, int32_t il, const float *q, const tri__kv_view *view);

tri_status tri__kv_policy_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                                const tri__kv_view **view, float **weight_sums) {
    TRY(policy_layer(p, il, q, k, v, view, weight_sums));
    if (p->measure && p->step_m == 1) TRY(measure_layer(p, il, q, *view));
    return TRI_STATUS_OK;
}

static tri_status policy_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                               const tri__kv_view **view, float **weight_sums) {
    TRI_ASSERT(p->in_step && il >= 0 && il < p->n_layer);
    const int32_t n0 = p->step_n0, m = p->step_m, end = n0 + m;
    *weight_sums = NULL;
    if (p->src) {
        TRY(ring_write(p, il, n0, m, k, v));
        TRY(ret_keep_query(p, il, q));
        TRY(ret_view_borrowed(p, il, end));
        p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                                 .head_span = p->head_span};
        *view = &p->view;
        return TRI_STATUS_OK;
    }
    if (p->ring_rows) TRY(stream_write(p, il, n0, m, k, v));
    else if (p->h2o && p->h2o->bounded) TRY(tri__kv_store_write(p->kv, il, p->h2o->step_row0[0], m, k, v));
    else TRY(tri__kv_store_write(p->kv, il, n0, m, k, v));
    switch (p->p.kind) {
    case TRI_KV_POLICY_FULL:
        *view = tri__kv_store_view(p->kv, il, end, &p->view);
        if (p->tap && end == p->tap_at) TRY(tap_layer(p->tap, il, q, m - 1, p->n_head, *view));
        return TRI_STATUS_OK;
    case TRI_KV_POLICY_STREAMING: {
        const tri__backend_ops *op = p->be->ops;
        int32_t rows = p->step_kept + m, kd = kv_dim(p);
        TRY(op->get_rows(p->be, p->sk, p->kv->k[il], p->kv->type, p->kv->capacity, kd, p->gather, rows));
        TRY(op->get_rows(p->be, p->sv, p->kv->v[il], p->kv->type, p->kv->capacity, kd, p->gather, rows));
        TRY(op->rope(p->be, p->sk, rows, p->n_head_kv, p->cache_pos, p->rope));
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            p->spans[h] = (tri__kv_span){.pos0 = 0, .n = rows, .k = p->sk + (int64_t)h * p->head_dim,
                                         .v = p->sv + (int64_t)h * p->head_dim, .stride = kd};
            p->head_span[h] = h;
        }
        p->head_span[p->n_head_kv] = p->n_head_kv;
        p->view = (tri__kv_view){.type = TRI_DTYPE_F32, .n_head_kv = p->n_head_kv, .spans = p->spans,
                                 .head_span = p->head_span};
        *view = &p->view;
        return TRI_STATUS_OK;
    }
    case TRI_KV_POLICY_H2O: {
        h2o_record *r = &p->h2o->rec[p->h2o->n_rec - 1];
        int64_t qd = (int64_t)p->n_head * p->head_dim;
        TRY(p->be->ops->copy_to_host(p->be, r->q + (int64_t)il * p->max_step * qd, q, sizeof(float) * (size_t)(m * qd)));
        h2o_view(p, il, n0, m, p->h2o->step_row0);
        *weight_sums = p->h2o->ws_dev;
        break;
    }
    case TRI_KV_POLICY_RETRIEVAL:
        TRY(ret_keep_query(p, il, q));
        if (!ret_current(p)) {
            *view = tri__kv_store_view(p->kv, il, end, &p->view);
            return TRI_STATUS_OK;
        }
        ret_view(p, il, end);
        break;
    }
    p->view = (tri__kv_view){.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = p->spans,
                             .head_span = p->head_span};
    *view = &p->view;
    return TRI_STATUS_OK;
}

// ---- measurement ----

tri_status tri__kv_policy_measure(tri__kv_policy *p) {
    if (p->src) return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy: measuring a policy over borrowed rows");
    if (p->cap)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: measuring needs every position (keep_all)",
                         tri__kv_policy_name(p->p.kind));
    tri__backend *be = p->be;
    int64_t cap = p->kv->capacity, kd = kv_dim(p);
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)(p->n_head_kv * cap), (void **)&p->m_ws));
    TRY(be->ops->alloc(be, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim, (void **)&p->m_out));
    p->m_ws_host = malloc(sizeof(float) * (size_t)(p->n_head_kv * cap));
    p->m_pos = malloc(sizeof(int32_t) * (size_t)cap);
    if (!p->m_ws_host || !p->m_pos) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "kv policy: measurement");
    for (int64_t i = 0; i < cap; i++) p->m_pos[i] = (int32_t)i;
    if (p->raw_keys) {
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)(cap * kd), (void **)&p->m_k));
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)(cap * kd), (void **)&p->m_v));
        TRY(be->ops->alloc(be, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim, (void **)&p->m_q));
    }
    p->measure = true;
    return TRI_STATUS_OK;
}

// Full attention of the step's one query over [0, end), and the share of it on the positions the
// policy's view holds.
static tri_status measure_layer(tri__kv_policy *p, int32_t il, const float *q, const tri__kv_view *view) {
    const tri__backend_ops *op = p->be->ops;
    int32_t end = p->step_n0 + 1, kd = kv_dim(p);
    tri__kv_span spans[64];
    int32_t head_span[65];
    if (p->n_head_kv > 64) return TRI_STATUS_OK;
    tri__kv_view full = {.type = p->kv->type, .n_head_kv = p->n_head_kv, .spans = spans, .head_span = head_span};
    int32_t qpos = p->step_n0;
    const int64_t es = esize(p);
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        head_span[h] = h;
        if (p->raw_keys) {
            spans[h] = (tri__kv_span){.pos0 = 0, .n = end, .k = p->m_k + (int64_t)h * p->head_dim,
                                      .v = p->m_v + (int64_t)h * p->head_dim, .stride = kd};
        } else {
            int64_t off = (int64_t)h * p->head_dim * es;
            spans[h] = (tri__kv_span){.pos0 = 0, .n = end, .k = (const char *)p->kv->k[il] + off,
                                      .v = (const char *)p->kv->v[il] + off, .stride = kd};
        }
    }
    head_span[p->n_head_kv] = p->n_head_kv;
    if (p->raw_keys) {
        // keys rotated at their absolute positions, and the query (rotated at its cache position
        // step_kept) turned on by the difference, so that it sits at its absolute position too
        full.type = TRI_DTYPE_F32;
        int32_t shift = p->step_n0 - p->step_kept;
        TRY(op->get_rows(p->be, p->m_k, p->kv->k[il], p->kv->type, p->kv->capacity, kd, p->m_pos, end));
        TRY(op->get_rows(p->be, p->m_v, p->kv->v[il], p->kv->type, p->kv->capacity, kd, p->m_pos, end));
        TRY(op->rope(p->be, p->m_k, end, p->n_head_kv, p->m_pos, p->rope));
        TRY(op->copy(p->be, p->m_q, q, sizeof(float) * (size_t)p->n_head * (size_t)p->head_dim));
        TRY(op->rope(p->be, p->m_q, 1, p->n_head, &shift, p->rope));
        q = p->m_q;
    }
    TRY(op->attention(p->be, p->m_out, q, &qpos, 1, p->n_head, p->head_dim, &full, p->m_ws));
    TRY(op->copy_to_host(p->be, p->m_ws_host, p->m_ws, sizeof(float) * (size_t)(p->n_head_kv * end)));
    TRY(op->synchronize(p->be));
    int32_t g = p->n_head / p->n_head_kv;
    for (int32_t h = 0; h < p->n_head_kv; h++) {
        const float *w = p->m_ws_host + (int64_t)h * end;
        double got = 0;
        if (p->raw_keys) {
            for (int32_t r = 0; r < p->step_kept + 1; r++) got += w[p->gather[r]];
        } else {
            for (int32_t si = view->head_span[h]; si < view->head_span[h + 1]; si++)
                for (int32_t j = 0; j < view->spans[si].n; j++) got += w[view->spans[si].pos0 + j];
        }
        p->mass_sum += got / g;
        p->mass_n++;
    }
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_observe(tri__kv_policy *p, int32_t il) {
    if (!p->h2o) return TRI_STATUS_OK;
    int64_t n_keys = 0;
    for (int32_t si = 0; si < p->head_span[p->n_head_kv]; si++) n_keys += p->spans[si].n;
    TRY(p->be->ops->copy_to_host(p->be, p->h2o->ws, p->h2o->ws_dev, sizeof(float) * (size_t)n_keys));
    TRY(p->be->ops->synchronize(p->be));
    h2o_accumulate(p, il, p->step_n0, p->step_m, p->h2o->step_row0);
    return TRI_STATUS_OK;
}

tri_status tri__kv_policy_commit(tri__kv_policy *p) {
    TRI_ASSERT(p->in_step);
    int32_t end = p->step_n0 + p->step_m;
    tri_status st = TRI_STATUS_OK;
    if (p->h2o)
        for (int32_t il = 0; il < p->n_layer; il++) h2o_evict(p, il, end);
    if (p->ret) {
        // borrowing, chunks are summarised from src's rows when a selection needs them
        if (!p->src && (st = ret_summarise(p, end))) goto fail;
        p->ret->step_n0 = p->step_n0;
        p->ret->step_m = p->step_m;
        p->ret->step_armed = p->ret->armed;
        if (ret_due(p, end, p->ret->armed))
            if ((st = ret_select(p, end, p->step_m - 1))) goto fail;
    }
    p->in_step = false;
    if (p->src || p->cap) {
        p->len = end;
        return TRI_STATUS_OK;
    }
    return tri__kv_store_set_len(p->kv, end);
fail:
    tri__kv_policy_abort(p);
    return st;
}

void tri__kv_policy_tap_settle(tri__kv_policy *p, bool ok) {
    if (p->tap && (!ok || p->kv->n >= p->tap_at)) tap_finish(p, ok);
}

void tri__kv_policy_untap(tri__kv_policy *ret) {
    if (ret->ret && ret->ret->tap_owner) tap_finish(ret->ret->tap_owner, false);
}

void tri__kv_policy_abort(tri__kv_policy *p) {
    if (p->tap) tap_finish(p, false);
    if (!p->in_step) return;
    p->in_step = false;
    if (p->h2o && p->h2o->n_rec > 0) {
        h2o_restore(p, &p->h2o->rec[p->h2o->n_rec - 1]);
        p->h2o->n_rec--;
    }
    if (p->ret) {
        // drop the summaries of a half-committed step; the previous step stays remembered
        tri__retrieval_state *s = p->ret;
        int32_t keep_m = s->step_m, keep_n0 = s->step_n0;
        s->step_m = 0;
        (void)ret_truncate(p, p->step_n0);
        s->step_m = keep_m;
        s->step_n0 = keep_n0;
    }
}

tri_status tri__kv_policy_adopt(tri__kv_policy *p, tri__kv_store *src, int32_t n) {
    TRI_ASSERT(!p->in_step);
    if (p->src) {
        if (src != p->src || n < p->len || n > src->n)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "kv policy retrieval: adopt to %d from %d out of %s store (holding %d)", n, p->len,
                             src == p->src ? "its source" : "another", src->n);
        ret_drop_selections(p->ret);
        p->ret->tail0 = n;
        p->ret->step_m = 0;
        p->len = n;
        return TRI_STATUS_OK;
    }
    if (p->cap)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: rows computed over its own view cannot be adopted",
                         tri__kv_policy_name(p->p.kind));
    const int32_t len = p->kv->n;
    if (n < len || n > src->n || n > p->kv->capacity)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: adopt to %d from %d (source holds %d)", n, len,
                         src->n);
    bool full_attention = p->p.kind == TRI_KV_POLICY_FULL ||
                          (p->p.kind == TRI_KV_POLICY_RETRIEVAL && !ret_current(p) && !ret_due(p, n, p->ret->armed));
    if (!full_attention)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "kv policy %s: rows computed over its own view cannot be adopted",
                         tri__kv_policy_name(p->p.kind));
    tri_status st = tri__kv_store_copy_rows(p->kv, src, len, n - len);
    if (!st && p->ret) {
        // summarise now, as a step's commit would (a later commit would catch up, but the state
        // should not depend on one coming)
        if ((st = ret_summarise(p, n))) {
            (void)ret_truncate(p, len);  // drop the summaries made before the failure
        } else {
            p->ret->step_m = 0;  // no step to replay: nothing was due in these positions
        }
    }
    return st ? st : tri__kv_store_set_len(p->kv, n);
}

tri_status tri__kv_policy_truncate(tri__kv_policy *p, int32_t n) {
    TRI_ASSERT(!p->in_step);
    int32_t len = tri__kv_policy_len(p);
    if (n < 0 || n > len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy: truncate to %d outside [0, %d]", n, len);
    if (p->ring_rows) {
        TRY(stream_check_rollback(p, n));
        p->len = n;
        return TRI_STATUS_OK;
    }
    if (p->h2o) TRY(h2o_truncate(p, n));
    if (p->ret) TRY(ret_truncate(p, n));
    if (p->cap) {
        p->len = n;
        return TRI_STATUS_OK;
    }
    return p->src ? TRI_STATUS_OK : tri__kv_store_set_len(p->kv, n);
}

void tri__kv_policy_reset(tri__kv_policy *p) {
    p->in_step = false;
    if (p->h2o) {
        memset(p->h2o->cnt, 0, sizeof *p->h2o->cnt * (size_t)(p->n_layer * p->n_head_kv));
        p->h2o->n_rec = 0;
        p->h2o->top = 0;
    }
    if (p->ret) {
        p->ret->step_m = 0;
        (void)ret_truncate(p, 0);
        p->ret->armed = false;
    }
    p->kv->n = 0;
    p->len = 0;
    p->hw = 0;
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

// Head h's row of position pos in a store, wherever it keeps layer il.
static bool peek_store(tri__kv_store *kv, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    const int64_t row = tri__kv_store_row_bytes(kv) / kv->n_head_kv;
    void *tmp = malloc((size_t)tri__kv_store_row_bytes(kv));
    bool ok = tmp && tri__kv_store_read_rows(kv, il, which, pos, 1, tmp) == TRI_STATUS_OK;
    if (ok) memcpy(out, (char *)tmp + h * row, (size_t)row);
    free(tmp);
    return ok;
}

bool tri__kv_policy_peek(tri__kv_policy *p, int32_t il, int32_t h, int32_t pos, int which, void *out) {
    if (il < 0 || il >= p->n_layer || h < 0 || h >= p->n_head_kv || pos < 0 || pos >= tri__kv_policy_len(p) ||
        (p->p.kind != TRI_KV_POLICY_FULL && p->p.kind != TRI_KV_POLICY_RETRIEVAL))
        return false;
    const int64_t es = esize(p), hd = p->head_dim, kd = kv_dim(p), row = hd * es;
    const sel_entry *e = p->ret ? ret_current(p) : NULL;
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
        return peek_store(p->kv, il, h, pos, which, out);
    }
    tri__retrieval_state *s = p->ret;
    const char *src;
    if (from_chunk >= 0) {
        src = (const char *)(which ? s->gv : s->gk)[il] + ((int64_t)h * p->p.budget + from_chunk) * row;
    } else if (pos >= s->tail0) {
        src = (const char *)(which ? p->own.v : p->own.k)[il] + ((int64_t)(pos % s->ring) * kd + h * hd) * es;
    } else {  // below the tail with no selection: src's row
        return peek_store(p->src, il, h, pos, which, out);
    }
    return op->copy_to_host(p->be, out, src, (size_t)row) == TRI_STATUS_OK && op->synchronize(p->be) == TRI_STATUS_OK;
}

int32_t tri__kv_policy_h2o_kept(const tri__kv_policy *p, int32_t il, int32_t h, int32_t *pos) {
    if (!p->h2o) return 0;
    int32_t cnt = p->h2o->cnt[il * p->n_head_kv + h];
    memcpy(pos, h2o_pos(p, il, h), sizeof *pos * (size_t)cnt);
    return cnt;
}
