// chunk-index.h - top-k inner-product search over chunk summaries (internal).
//
// One index holds the summaries (mean post-RoPE keys) of the chunks of one (layer, KV head), in
// chunk order: row i is chunk i. The retrieval policy adds rows as chunks complete, drops them on
// rollback and asks for the k rows with the largest dot product with a query.
//
// Every backend returns the same answer: the k rows with the largest score, scores computed in
// double precision by the exact rule below, ties broken by the lower row, in that order. The
// FAISS backend lets FAISS propose candidates (more than k) and rescores them with the exact rule,
// so the two differ only if FAISS's own float scores misorder rows by more than the margin.
#ifndef TRI_CHUNK_INDEX_H
#define TRI_CHUNK_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

// The public tri_kv_index, value for value.
typedef enum tri__chunk_index_kind {
    TRI_CHUNK_INDEX_EXACT = TRI_KV_INDEX_EXACT,            // brute-force scan (OpenMP over rows when large)
    TRI_CHUNK_INDEX_FAISS_FLAT = TRI_KV_INDEX_FAISS_FLAT,  // faiss::IndexFlatIP
    TRI_CHUNK_INDEX_FAISS_IVF = TRI_KV_INDEX_FAISS_IVF,    // faiss::IndexIVFFlat (inner product), trained
                                                           // once it holds 64 lists' worth of rows; flat
                                                           // until then
} tri__chunk_index_kind;

typedef struct tri__chunk_index tri__chunk_index;

// Whether this build has FAISS (TRI_HAVE_FAISS).
int tri__chunk_index_have_faiss(void);

// An empty index of dim-dimensional rows. UNSUPPORTED for a FAISS kind in a build without FAISS.
tri_status tri__chunk_index_create(tri__chunk_index_kind kind, int32_t dim, tri__chunk_index **out);
void tri__chunk_index_free(tri__chunk_index *ix);

// Appends n rows x (n, dim) f32 host after the ones already there.
tri_status tri__chunk_index_add(tri__chunk_index *ix, const float *x, int64_t n);
// Keeps the first n rows (n <= size).
tri_status tri__chunk_index_truncate(tri__chunk_index *ix, int64_t n);
int64_t tri__chunk_index_size(const tri__chunk_index *ix);
int32_t tri__chunk_index_dim(const tri__chunk_index *ix);
// The rows held, (size, dim) f32 host, in chunk order (every backend keeps them); valid until the
// next add.
const float *tri__chunk_index_rows(const tri__chunk_index *ix);

// The k rows among [first, size) with the largest score(q, row) = sum_d (double)q[d] * row[d],
// best first, ties by the lower row: ids (k) int32 and scores (k) f32 host (scores may be NULL).
// Returns in *n_found min(k, size - first) (rows past it are left untouched).
tri_status tri__chunk_index_search(tri__chunk_index *ix, const float *q, int64_t first, int32_t k,
                                   int32_t *ids, float *scores, int32_t *n_found);

// Selection with GQA: how the scores of the query heads sharing a KV head (and of the several
// tokens a selection reads, tri__kv_policy_params.queries) become one score per chunk.
typedef enum tri__kv_group {
    TRI__KV_GROUP_SUM = 0,  // the summed query against the mean key: the group's total logit
    TRI__KV_GROUP_MAX = 1,  // per query vector, its logit minus its best chunk's (the log of its
                            // softmax ratio to that chunk); the chunk's score is the max over them
    TRI__KV_GROUP_SOFTMAX = 2,  // per query vector the softmax over every chunk of logit / sqrt(hd),
                                // summed over them
} tri__kv_group;

// Chooses kmax chunks for one KV head among the first n_chunks rows of ix, by the query vectors Q
// (n_q, dim) f32 host (the group's query heads, for each token a selection reads): chunk 0 (the
// attention sink), the `window` latest chunks, and the best kmax - 1 - window others by `group`,
// ties by the lower chunk; every chunk when n_chunks <= kmax. ids (kmax) ascending, *cnt their
// count. SUM asks the index for the summed query's top rows; MAX asks it for each query vector's
// top rows (a chunk among the best by the max is among the best of the vector attaining it) and
// rescores their union exactly; SOFTMAX scores every row. So EXACT and FAISS_FLAT select the same.
// bound: the rows are [max, min] bounds of dim / 2 dimensions and Q's rows have dim / 2 values,
// each turned into [max(q, 0), min(q, 0)] (after the sum, for SUM).
tri_status tri__chunk_select(tri__chunk_index *ix, tri__kv_group group, bool bound, const float *Q, int32_t n_q,
                             int32_t n_chunks, int32_t kmax, int32_t window, int32_t *ids, int32_t *cnt);

// The chunks a KV head keeps once its candidates are ranked: chunk 0, the window (chunks recent ..
// n_chunks - 1) and r others, taken from ranked (n_ranked chunk ids, best first) in order, each
// followed by the `follow` chunks after it that are below recent and not kept yet, until r are
// taken (a copy reads on past the tokens its attention found, so the chunk after one that holds
// them is the likeliest to be read next; the selection by mass, tri__kv_policy_mass_choice;
// tri__chunk_select's rules take none). keep: n_chunks bytes of scratch. ids receives them
// ascending (at most 1 + r + n_chunks - recent); returns their count.
int32_t tri__chunk_keep(const int32_t *ranked, int32_t n_ranked, int32_t r, int32_t follow, int32_t n_chunks,
                        int32_t recent, unsigned char *keep, int32_t *ids);

// ---- the FAISS wrapper (faiss-index.cpp), extern "C" ----

typedef struct tri__faiss tri__faiss;
// ivf_nlist: 0 flat inner product (IndexFlatIP); > 0 IVF with that many lists (IndexIVFFlat,
// inner product, 8 probes): until it holds 39 rows per list it stays flat, then trains on what it
// holds and moves them over.
tri_status tri__faiss_create(int32_t dim, int32_t ivf_nlist, tri__faiss **out);
void tri__faiss_free(tri__faiss *f);
// Appends rows (n, dim) f32 host; row ids continue from the current size.
tri_status tri__faiss_add(tri__faiss *f, const float *rows, int64_t n);
// Keeps the first n rows.
tri_status tri__faiss_truncate(tri__faiss *f, int64_t n);
// The k best rows by FAISS's own scores: labels (k) int64 host, -1 where fewer were found.
tri_status tri__faiss_search(tri__faiss *f, const float *q, int64_t k, int64_t *labels);

#endif  // TRI_CHUNK_INDEX_H
