// policy-h2o.c - H2O (Heavy-Hitter Oracle): per (layer, KV head), the recent tokens and the ones with the
// largest accumulated attention (docs/kv-policies.md).
#include <string.h>

#include "kv-policy-impl.h"

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

static tri_status h2o_init(tri__kv_policy *p) {
    tri_status st = TRI_STATUS_OK;
    // one span per run of kept positions: at most one per kept row, plus the step's tokens
    TRY(tri__kv_policy_common_init(p, p->p.budget + 1));
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

// ---- the op table ----

static tri_status h2o_check(const tri__kv_policy_params *p) {
    if (p->recent < 0 || p->recent >= p->budget)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "kv policy h2o: recent window %d must be in [0, budget %d) to leave room for heavy hitters",
                         p->recent, p->budget);
    if (p->history < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "kv policy h2o: history %d must be >= 0", p->history);
    return TRI_STATUS_OK;
}

// The defaults of recent and history, and a bounded store's size.
static tri_status h2o_setup(tri__kv_policy *p, int32_t capacity, int32_t *store_rows) {
    if (p->p.recent == 0) p->p.recent = p->p.budget / 2;
    if (p->p.history == 0) p->p.history = 8;
    if (!p->p.keep_all) {
        // the kept rows, the rows of the remembered steps (their evictions and tokens, which a
        // rollback replays), a step, and as many again so that rows move once per budget tokens
        int64_t rows = 2 * (int64_t)p->p.budget + (int64_t)(p->p.history + 1) * p->max_step;
        if (rows < capacity) {
            p->cap = capacity;
            *store_rows = (int32_t)rows;
        }
    }
    return TRI_STATUS_OK;
}

static tri_status h2o_begin(tri__kv_policy *p, int32_t n0, int32_t m, int32_t *base) {
    (void)base;
    TRY(h2o_place(p, n0, m));
    h2o_push(p, n0, m);
    return TRI_STATUS_OK;
}

static tri_status h2o_layer(tri__kv_policy *p, int32_t il, const float *q, const float *k, const float *v,
                            int32_t end, const tri__kv_view **view, float **weight_sums) {
    (void)end;
    const int32_t n0 = p->step_n0, m = p->step_m;
    if (p->h2o->bounded) TRY(tri__kv_store_write(p->kv, il, p->h2o->step_row0[0], m, k, v));
    else TRY(tri__kv_store_write(p->kv, il, n0, m, k, v));
    h2o_record *r = &p->h2o->rec[p->h2o->n_rec - 1];
    int64_t qd = (int64_t)p->n_head * p->head_dim;
    TRY(p->be->ops->copy_to_host(p->be, r->q + (int64_t)il * p->max_step * qd, q, sizeof(float) * (size_t)(m * qd)));
    h2o_view(p, il, n0, m, p->h2o->step_row0);
    *weight_sums = p->h2o->ws_dev;
    *view = tri__kv_policy_own_view(p);
    return TRI_STATUS_OK;
}

static tri_status h2o_observe(tri__kv_policy *p, int32_t il) {
    int64_t n_keys = 0;
    for (int32_t si = 0; si < p->head_span[p->n_head_kv]; si++) n_keys += p->spans[si].n;
    TRY(p->be->ops->copy_to_host(p->be, p->h2o->ws, p->h2o->ws_dev, sizeof(float) * (size_t)n_keys));
    TRY(p->be->ops->synchronize(p->be));
    h2o_accumulate(p, il, p->step_n0, p->step_m, p->h2o->step_row0);
    return TRI_STATUS_OK;
}

static tri_status h2o_commit(tri__kv_policy *p, int32_t end) {
    for (int32_t il = 0; il < p->n_layer; il++) h2o_evict(p, il, end);
    return TRI_STATUS_OK;
}

static void h2o_abort(tri__kv_policy *p) {
    if (p->in_step && p->h2o->n_rec > 0) {
        h2o_restore(p, &p->h2o->rec[p->h2o->n_rec - 1]);
        p->h2o->n_rec--;
    }
}

static void h2o_reset(tri__kv_policy *p) {
    memset(p->h2o->cnt, 0, sizeof *p->h2o->cnt * (size_t)(p->n_layer * p->n_head_kv));
    p->h2o->n_rec = 0;
    p->h2o->top = 0;
}

int32_t tri__kv_policy_h2o_kept(const tri__kv_policy *p, int32_t il, int32_t h, int32_t *pos) {
    if (!p->h2o) return 0;
    int32_t cnt = p->h2o->cnt[il * p->n_head_kv + h];
    memcpy(pos, h2o_pos(p, il, h), sizeof *pos * (size_t)cnt);
    return cnt;
}

const tri__kv_policy_ops tri__kv_policy_h2o_ops = {
    .name = "h2o",
    .check = h2o_check,
    .setup = h2o_setup,
    .init = h2o_init,
    .free = h2o_free,
    .begin = h2o_begin,
    .layer = h2o_layer,
    .observe = h2o_observe,
    .commit = h2o_commit,
    .abort = h2o_abort,
    .truncate = h2o_truncate,
    .reset = h2o_reset,
};
