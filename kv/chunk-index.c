// chunk-index.c - the chunk index: host rows, the exact scan, and dispatch to the FAISS wrapper.
#include "chunk-index.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tri-config.h"

#define FAISS_MARGIN 16  // extra candidates asked of FAISS before exact rescoring
#define OMP_MIN_ROWS 4096  // scans shorter than this run on one thread

struct tri__chunk_index {
    tri__chunk_index_kind kind;
    int32_t dim;
    int64_t n, cap;     // rows held, rows allocated
    float *rows;        // (cap, dim) host: every summary, kept by every backend for rescoring
    double *score;      // (cap) scratch of the exact scan
    tri__faiss *faiss;  // the FAISS backends' index, or NULL
};

int tri__chunk_index_have_faiss(void) { return TRI_HAVE_FAISS; }

tri_status tri__chunk_index_create(tri__chunk_index_kind kind, int32_t dim, tri__chunk_index **out) {
    *out = NULL;
    if (dim <= 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk index: dimension %d", dim);
    if (kind != TRI_CHUNK_INDEX_EXACT && kind != TRI_CHUNK_INDEX_FAISS_FLAT && kind != TRI_CHUNK_INDEX_FAISS_IVF)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk index: unknown kind %d", (int)kind);
    if (kind != TRI_CHUNK_INDEX_EXACT && !TRI_HAVE_FAISS)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk index: this build has no FAISS (meson -Dfaiss=enabled)");
    tri__chunk_index *ix = calloc(1, sizeof *ix);
    if (!ix) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk index");
    ix->kind = kind;
    ix->dim = dim;
    if (kind != TRI_CHUNK_INDEX_EXACT) {
        tri_status st = tri__faiss_create(dim, kind == TRI_CHUNK_INDEX_FAISS_IVF ? 64 : 0, &ix->faiss);
        if (st) {
            free(ix);
            return st;
        }
    }
    *out = ix;
    return TRI_STATUS_OK;
}

void tri__chunk_index_free(tri__chunk_index *ix) {
    if (!ix) return;
    if (ix->faiss) tri__faiss_free(ix->faiss);
    free(ix->rows);
    free(ix->score);
    free(ix);
}

int64_t tri__chunk_index_size(const tri__chunk_index *ix) { return ix->n; }

int32_t tri__chunk_index_dim(const tri__chunk_index *ix) { return ix->dim; }

const float *tri__chunk_index_rows(const tri__chunk_index *ix) { return ix->rows; }

tri_status tri__chunk_index_add(tri__chunk_index *ix, const float *x, int64_t n) {
    if (n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk index: adding %lld rows", (long long)n);
    if (n == 0) return TRI_STATUS_OK;
    if (ix->n + n > ix->cap) {
        int64_t cap = ix->cap ? ix->cap : 256;
        while (cap < ix->n + n) cap *= 2;
        float *r = realloc(ix->rows, (size_t)cap * (size_t)ix->dim * sizeof *r);
        if (!r) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk index: %lld rows", (long long)cap);
        ix->rows = r;
        double *s = realloc(ix->score, (size_t)cap * sizeof *s);
        if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk index: %lld scores", (long long)cap);
        ix->score = s;
        ix->cap = cap;
    }
    if (ix->faiss) {
        tri_status st = tri__faiss_add(ix->faiss, x, n);
        if (st) return st;
    }
    memcpy(ix->rows + ix->n * ix->dim, x, (size_t)n * (size_t)ix->dim * sizeof *x);
    ix->n += n;
    return TRI_STATUS_OK;
}

tri_status tri__chunk_index_truncate(tri__chunk_index *ix, int64_t n) {
    if (n < 0 || n > ix->n)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk index: truncate to %lld of %lld rows", (long long)n,
                         (long long)ix->n);
    if (n == ix->n) return TRI_STATUS_OK;
    if (ix->faiss) {
        tri_status st = tri__faiss_truncate(ix->faiss, n);
        if (st) return st;
    }
    ix->n = n;
    return TRI_STATUS_OK;
}

static double exact_score(const float *q, const float *row, int32_t dim) {
    double s = 0;
    for (int32_t d = 0; d < dim; d++) s += (double)q[d] * (double)row[d];
    return s;
}

// ---- top-k by (score descending, row ascending) with a binary heap of the k best so far ----

typedef struct cand {
    double score;
    int64_t row;
} cand;

// a ranks below b
static int cand_worse(cand a, cand b) { return a.score < b.score || (a.score == b.score && a.row > b.row); }

// Sifts down in a heap whose root is the worst candidate.
static void heap_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_worse(h[l], h[w])) w = l;
        if (r < n && cand_worse(h[r], h[w])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void heap_push(cand *h, int32_t *n, int32_t k, cand c) {
    if (*n < k) {
        int32_t i = (*n)++;
        h[i] = c;
        while (i > 0 && cand_worse(h[i], h[(i - 1) / 2])) {
            cand t = h[i];
            h[i] = h[(i - 1) / 2];
            h[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    } else if (cand_worse(h[0], c)) {
        h[0] = c;
        heap_down(h, *n, 0);
    }
}

// Empties the heap best first into ids/scores.
static void heap_drain(cand *h, int32_t n, int32_t *ids, float *scores) {
    for (int32_t i = n - 1; i >= 0; i--) {
        ids[i] = (int32_t)h[0].row;
        if (scores) scores[i] = (float)h[0].score;
        h[0] = h[i];
        heap_down(h, i, 0);
    }
}

tri_status tri__chunk_index_search(tri__chunk_index *ix, const float *q, int64_t first, int32_t k,
                                   int32_t *ids, float *scores, int32_t *n_found) {
    *n_found = 0;
    if (k < 0 || first < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "chunk index: top-%d from row %lld", k, (long long)first);
    int64_t avail = ix->n - first;
    if (avail <= 0 || k == 0) return TRI_STATUS_OK;
    int32_t kk = avail < k ? (int32_t)avail : k;
    cand *heap = malloc((size_t)kk * sizeof *heap);
    if (!heap) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk index: top-%d heap", kk);
    int32_t hn = 0;
    const int32_t dim = ix->dim;
    if (ix->faiss && avail > kk) {
        // rows before first are filtered here rather than by a FAISS selector, which not every
        // index type of every FAISS version takes
        int64_t want = (int64_t)kk + FAISS_MARGIN + first;
        if (want > ix->n) want = ix->n;
        int64_t *labels = malloc((size_t)want * sizeof *labels);
        if (!labels) {
            free(heap);
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "chunk index: %lld FAISS labels", (long long)want);
        }
        tri_status st = tri__faiss_search(ix->faiss, q, want, labels);
        if (st) {
            free(labels);
            free(heap);
            return st;
        }
        for (int64_t i = 0; i < want; i++) {
            int64_t r = labels[i];
            if (r < first || r >= ix->n) continue;  // -1 (fewer found) or out of range
            heap_push(heap, &hn, kk, (cand){exact_score(q, ix->rows + r * dim, dim), r});
        }
        free(labels);
    } else {
        double *sc = ix->score;
#if TRI_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (avail >= OMP_MIN_ROWS)
#endif
        for (int64_t r = first; r < ix->n; r++) sc[r] = exact_score(q, ix->rows + r * dim, dim);
        for (int64_t r = first; r < ix->n; r++) heap_push(heap, &hn, kk, (cand){sc[r], r});
    }
    heap_drain(heap, hn, ids, scores);
    *n_found = hn;
    free(heap);
    return TRI_STATUS_OK;
}

#if !TRI_HAVE_FAISS
// Without FAISS the wrapper is never reached (create refuses the FAISS kinds); these keep the
// linker happy.
tri_status tri__faiss_create(int32_t dim, int32_t ivf_nlist, tri__faiss **out) {
    *out = NULL;
    return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk index: no FAISS in this build");
}
void tri__faiss_free(tri__faiss *f) { (void)f; }
tri_status tri__faiss_add(tri__faiss *f, const float *rows, int64_t n) {
    return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk index: no FAISS in this build");
}
tri_status tri__faiss_truncate(tri__faiss *f, int64_t n) {
    return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk index: no FAISS in this build");
}
tri_status tri__faiss_search(tri__faiss *f, const float *q, int64_t k, int64_t *labels) {
    return tri__fail(TRI_STATUS_UNSUPPORTED, "chunk index: no FAISS in this build");
}
#endif
