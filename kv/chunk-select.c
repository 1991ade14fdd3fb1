// chunk-select.c - which chunks a KV head keeps: the sink, a recent window and the best by its group's
// query vectors (chunk-index.h, tri__chunk_select; docs/kv-policies.md, "GQA").
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chunk-index.h"
#include "error.h"

typedef struct scored {
    double score, tie;  // tie: MAX's second key
    int32_t id;
} scored;

// Better first: higher score, then the higher second key, then the lower chunk.
static int scored_cmp(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->tie != y->tie) return x->tie > y->tie ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static double dot(const float *q, const float *row, int32_t dim) {
    double s = 0;
    for (int32_t d = 0; d < dim; d++) s += (double)q[d] * (double)row[d];
    return s;
}

// A query of qd values as the bounds' query: [max(q, 0), min(q, 0)] (2 * qd values), so that its
// dot product with [max, min] is sum_d max(q_d * max_d, q_d * min_d).
static void bound_query(float *out, const float *q, int32_t qd) {
    for (int32_t d = 0; d < qd; d++) {
        out[d] = q[d] > 0 ? q[d] : 0;
        out[qd + d] = q[d] < 0 ? q[d] : 0;
    }
}

int32_t tri__chunk_keep(const int32_t *ranked, int32_t n_ranked, int32_t r, int32_t follow, int32_t n_chunks,
                        int32_t recent, unsigned char *keep, int32_t *ids) {
    memset(keep, 0, (size_t)n_chunks);
    keep[0] = 1;
    memset(keep + recent, 1, (size_t)(n_chunks - recent));
    int32_t got = 0;
    for (int32_t a = 0; a < n_ranked && got < r; a++)
        for (int32_t c = ranked[a]; c < recent && c - ranked[a] <= follow && got < r; c++)
            if (!keep[c]) {
                keep[c] = 1;
                got++;
            }
    int32_t n = 0;
    for (int32_t c = 0; c < n_chunks; c++)
        if (keep[c]) ids[n++] = c;
    return n;
}

tri_status tri__chunk_select(tri__chunk_index *ix, tri__kv_group group, bool bound, const float *Q, int32_t n_q,
                             int32_t n_chunks, int32_t kmax, int32_t window, int32_t *ids, int32_t *cnt) {
    *cnt = 0;
    if (n_chunks <= kmax) {
        for (int32_t c = 0; c < n_chunks; c++) ids[c] = c;
        *cnt = n_chunks;
        return TRI_STATUS_OK;
    }
    if (n_q <= 0 || window < 0 || window > kmax - 1 || n_chunks > tri__chunk_index_size(ix))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk select: %d queries, window %d of %d chunks, %d of %lld rows",
                         n_q, window, kmax, n_chunks, (long long)tri__chunk_index_size(ix));
    const int32_t dim = tri__chunk_index_dim(ix), r = kmax - 1 - window, recent = n_chunks - window;
    const int32_t qd = bound ? dim / 2 : dim;  // values of a query vector
    // candidates: chunks 1 .. recent - 1 (n_chunks > kmax, so more of them than r)
    if (r == 0) {  // chunk 0 and the window
        int32_t n = 0;
        ids[n++] = 0;
        for (int32_t c = recent; c < n_chunks; c++) ids[n++] = c;
        *cnt = n;
        return TRI_STATUS_OK;
    }
    tri_status st = TRI_STATUS_OK;
    int32_t *ranked = NULL;
    unsigned char *keep = NULL;
    const float *rows = tri__chunk_index_rows(ix);
    const int32_t want = r + window;  // the index's top rows from 1 on: at most `window` are recent
    int32_t *found = malloc(sizeof *found * (size_t)want);
    scored *cand = malloc(sizeof *cand * (size_t)n_chunks);
    float *qs = malloc(sizeof *qs * (size_t)(group == TRI__KV_GROUP_SUM ? 2 * dim : (int64_t)n_q * dim));
    unsigned char *seen = group == TRI__KV_GROUP_MAX ? calloc((size_t)n_chunks, 1) : NULL;
    double *best = malloc(sizeof *best * (size_t)n_q);
    if (!found || !cand || !best || !qs || (group == TRI__KV_GROUP_MAX && !seen)) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk select: scratch for %d chunks", n_chunks);
        goto done;
    }
    int32_t nc = 0;
    if (group != TRI__KV_GROUP_SUM) {  // the query vectors as the index's rows read them
        for (int32_t j = 0; j < n_q; j++) {
            if (bound) bound_query(qs + (int64_t)j * dim, Q + (int64_t)j * qd, qd);
            else memcpy(qs + (int64_t)j * dim, Q + (int64_t)j * dim, sizeof *qs * (size_t)dim);
        }
        Q = qs;
    }
    switch (group) {
    case TRI__KV_GROUP_SUM: {
        // the summed query, in the order the group's heads come (float, as the forward pass sums)
        float *sum = bound ? qs + dim : qs;
        for (int32_t d = 0; d < qd; d++) {
            float acc = 0;
            for (int32_t j = 0; j < n_q; j++) acc += Q[(int64_t)j * qd + d];
            sum[d] = acc;
        }
        if (bound) bound_query(qs, sum, qd);
        int32_t nf = 0;
        if ((st = tri__chunk_index_search(ix, qs, 1, want, found, NULL, &nf))) goto done;
        // the index's order is already (score, lower row): the first r outside the window
        for (int32_t a = 0; a < nf && nc < r; a++)
            if (found[a] < recent) cand[nc++] = (scored){.id = found[a]};
        break;
    }
    case TRI__KV_GROUP_MAX: {
        for (int32_t j = 0; j < n_q; j++) {
            const float *q = Q + (int64_t)j * dim;
            int32_t nf = 0;
            if ((st = tri__chunk_index_search(ix, q, 1, want, found, NULL, &nf))) goto done;
            best[j] = nf > 0 ? dot(q, rows + (int64_t)found[0] * dim, dim) : 0;
            for (int32_t a = 0; a < nf; a++)
                if (found[a] < recent && !seen[found[a]]) {
                    seen[found[a]] = 1;
                    cand[nc++] = (scored){.id = found[a]};
                }
        }
        // every vector's own best chunk scores 0, so with many vectors (a group reading several
        // tokens) ties are common: the second key, sum_j exp(rel_j / sqrt(dim)), prefers the chunk
        // that more vectors nearly want
        const double scale = 1.0 / sqrt((double)qd);
        for (int32_t a = 0; a < nc; a++) {
            const float *row = rows + (int64_t)cand[a].id * dim;
            double s = -INFINITY, t = 0;
            for (int32_t j = 0; j < n_q; j++) {
                double rel = dot(Q + (int64_t)j * dim, row, dim) - best[j];
                s = fmax(s, rel);
                t += exp(rel * scale);
            }
            cand[a].score = s;
            cand[a].tie = t;
        }
        qsort(cand, (size_t)nc, sizeof *cand, scored_cmp);
        break;
    }
    case TRI__KV_GROUP_SOFTMAX: {
        // each query vector's attention over the chunk summaries, summed: every chunk is scored
        const double scale = 1.0 / sqrt((double)qd);
        for (int32_t c = 1; c < recent; c++) cand[c - 1] = (scored){.id = c};
        nc = recent - 1;
        double *lg = malloc(sizeof *lg * (size_t)n_chunks);
        if (!lg) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk select: %d logits", n_chunks);
            goto done;
        }
        for (int32_t j = 0; j < n_q; j++) {
            const float *q = Q + (int64_t)j * dim;
            double mx = -INFINITY, z = 0;
            for (int32_t c = 0; c < n_chunks; c++) mx = fmax(mx, lg[c] = dot(q, rows + (int64_t)c * dim, dim) * scale);
            for (int32_t c = 0; c < n_chunks; c++) z += lg[c] = exp(lg[c] - mx);
            for (int32_t c = 1; c < recent; c++) cand[c - 1].score += lg[c] / z;
        }
        free(lg);
        qsort(cand, (size_t)nc, sizeof *cand, scored_cmp);
        break;
    }
    }
    if (!(ranked = malloc(sizeof *ranked * (size_t)(nc > 0 ? nc : 1))) || !(keep = malloc((size_t)n_chunks))) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk select: scratch for %d chunks", n_chunks);
        goto done;
    }
    for (int32_t a = 0; a < nc; a++) ranked[a] = cand[a].id;
    *cnt = tri__chunk_keep(ranked, nc, r, 0, n_chunks, recent, keep, ids);
done:
    free(found);
    free(cand);
    free(qs);
    free(seen);
    free(best);
    free(ranked);
    free(keep);
    return st;
}
