// test-kv-policy.c - cache policies and the chunk index.
//
// Selections are checked on constructed keys and queries whose answer is worked out by hand (the
// chunk index, retrieval with GQA) or by a naive double-precision simulation written here (H2O);
// policies that keep everything must give exactly the full cache's logits; rollback must leave
// every policy as if the dropped tokens had never been run; StreamingLLM must keep going past the
// model's trained context.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend.h"
#include "chunk-index.h"
#include "kv-policy.h"
#include "llama.h"
#include "test-util.h"
#include "triforce.h"
#include "weights.h"

// ---- chunk index ----

static void check_search(tri__chunk_index_kind kind) {
    tri__chunk_index *ix;
    cr_assert_eq(tri__chunk_index_create(kind, 4, &ix), TRI_STATUS_OK, "%s", tri_last_error());
    // row i scores (row . q) with q = (1, 0, 0, 0): 0, 5, 2, 5, 7, -1, 2, 5
    const float x[8][4] = {{0, 1, 0, 0}, {5, 0, 0, 0}, {2, 3, 0, 0}, {5, 0, 1, 0},
                           {7, 0, 0, 0}, {-1, 0, 0, 0}, {2, 0, 0, 9}, {5, 0, 0, 0}};
    cr_assert_eq(tri__chunk_index_add(ix, &x[0][0], 5), TRI_STATUS_OK);
    cr_assert_eq(tri__chunk_index_add(ix, &x[5][0], 3), TRI_STATUS_OK);
    cr_assert_eq(tri__chunk_index_size(ix), 8);
    const float q[4] = {1, 0, 0, 0};
    int32_t ids[8], n;
    float sc[8];
    cr_assert_eq(tri__chunk_index_search(ix, q, 0, 5, ids, sc, &n), TRI_STATUS_OK);
    // 7 (row 4), then the three 5s by row, then the first 2 (row 2 before row 6)
    const int32_t want[5] = {4, 1, 3, 7, 2};
    cr_assert_eq(n, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(ids[i], want[i], "kind %d rank %d: row %d, want %d", kind, i, ids[i], want[i]);
    cr_assert_float_eq(sc[0], 7.0f, 0);
    // from row 2 on, top 2: rows 4 and 3
    cr_assert_eq(tri__chunk_index_search(ix, q, 2, 2, ids, NULL, &n), TRI_STATUS_OK);
    cr_assert(n == 2 && ids[0] == 4 && ids[1] == 3);
    // rollback: without rows 4..7 the best from 0 are 1, 3, 2
    cr_assert_eq(tri__chunk_index_truncate(ix, 4), TRI_STATUS_OK);
    cr_assert_eq(tri__chunk_index_search(ix, q, 0, 8, ids, NULL, &n), TRI_STATUS_OK);
    cr_assert(n == 4 && ids[0] == 1 && ids[1] == 3 && ids[2] == 2 && ids[3] == 0);
    cr_assert_eq(tri__chunk_index_truncate(ix, 5), TRI_STATUS_INVALID_ARGUMENT);
    tri__chunk_index_free(ix);
}

Test(chunk_index, exact_known_answers_ties_by_lower_row) { check_search(TRI_CHUNK_INDEX_EXACT); }

Test(chunk_index, faiss_known_answers) {
    if (!tri__chunk_index_have_faiss()) {
        tri__chunk_index *ix;
        cr_assert_eq(tri__chunk_index_create(TRI_CHUNK_INDEX_FAISS_FLAT, 4, &ix), TRI_STATUS_UNSUPPORTED);
        cr_skip_test("no FAISS in this build");
    }
    check_search(TRI_CHUNK_INDEX_FAISS_FLAT);
}

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {  // xorshift64, uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

// Random summaries (with planted duplicates, so ties happen) and queries: FAISS flat and IVF give
// the exact scan's answer, also after rollback and regrowth.
Test(chunk_index, faiss_agrees_with_exact) {
    if (!tri__chunk_index_have_faiss()) cr_skip_test("no FAISS in this build");
    const int32_t dim = 64, n = 3000;
    float *x = malloc(sizeof(float) * (size_t)(n * dim));
    for (int64_t i = 0; i < (int64_t)n * dim; i++) x[i] = frand();
    // rows i * 37 stand out (5x longer) and are duplicated at i * 37 + 5: a query equal to one
    // has those two on top, tied
    for (int i = 0; i < 40; i++) {
        for (int d = 0; d < dim; d++) x[(int64_t)(i * 37) * dim + d] *= 5;
        memcpy(x + (int64_t)(i * 37 + 5) * dim, x + (int64_t)(i * 37) * dim, sizeof(float) * dim);
    }
    tri__chunk_index_kind kinds[2] = {TRI_CHUNK_INDEX_FAISS_FLAT, TRI_CHUNK_INDEX_FAISS_IVF};
    for (int kk = 0; kk < 2; kk++) {
        tri__chunk_index *ex, *fa;
        cr_assert_eq(tri__chunk_index_create(TRI_CHUNK_INDEX_EXACT, dim, &ex), TRI_STATUS_OK);
        cr_assert_eq(tri__chunk_index_create(kinds[kk], dim, &fa), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t done = 0; done < n; done += 500) {
            cr_assert_eq(tri__chunk_index_add(ex, x + (int64_t)done * dim, 500), TRI_STATUS_OK);
            cr_assert_eq(tri__chunk_index_add(fa, x + (int64_t)done * dim, 500), TRI_STATUS_OK, "%s", tri_last_error());
        }
        cr_assert_eq(tri__chunk_index_truncate(ex, 2500), TRI_STATUS_OK);
        cr_assert_eq(tri__chunk_index_truncate(fa, 2500), TRI_STATUS_OK, "%s", tri_last_error());
        for (int t = 0; t < 20; t++) {
            float q[64];
            // half the queries are a stored row: its duplicates tie at the top
            if (t % 2) memcpy(q, x + (int64_t)(t * 37) * dim, sizeof q);
            else
                for (int d = 0; d < dim; d++) q[d] = frand();
            int32_t a[32], b[32], na, nb;
            cr_assert_eq(tri__chunk_index_search(ex, q, 1, 32, a, NULL, &na), TRI_STATUS_OK);
            cr_assert_eq(tri__chunk_index_search(fa, q, 1, 32, b, NULL, &nb), TRI_STATUS_OK);
            cr_assert_eq(na, nb);
            if (kinds[kk] == TRI_CHUNK_INDEX_FAISS_FLAT)
                for (int i = 0; i < na; i++) cr_assert_eq(a[i], b[i], "query %d rank %d: exact %d, faiss %d", t, i, a[i], b[i]);
            // IVF probes 8 of 64 lists, approximate by design (random rows have no clusters to find),
            // but a stored row lies in the list nearest to itself: it and its twin come first,
            // the lower row first
            if (t % 2) cr_assert(b[0] == t * 37 && b[1] == t * 37 + 5, "query %d: %d, %d first", t, b[0], b[1]);
        }
        tri__chunk_index_free(ex);
        tri__chunk_index_free(fa);
    }
    free(x);
}

// The grouped selection (tri__chunk_select) from FAISS's flat index equals the exact scan's for
// every group rule, with and without chunk bounds, a window and many query vectors: MAX asks each
// vector's top rows of the index and SOFTMAX reads every row, so the two agree by construction
// when the index's top rows agree.
Test(chunk_index, grouped_selection_faiss_equals_exact) {
    if (!tri__chunk_index_have_faiss()) cr_skip_test("no FAISS in this build");
    const int32_t hd = 16, n = 600, n_q = 12;
    float *x = malloc(sizeof(float) * (size_t)(n * 2 * hd)), q[12 * 16];
    for (int64_t i = 0; i < (int64_t)n * 2 * hd; i++) x[i] = frand();
    for (int b = 0; b < 2; b++) {
        const int32_t dim = b ? 2 * hd : hd;
        tri__chunk_index *ex, *fa;
        cr_assert_eq(tri__chunk_index_create(TRI_CHUNK_INDEX_EXACT, dim, &ex), TRI_STATUS_OK);
        cr_assert_eq(tri__chunk_index_create(TRI_CHUNK_INDEX_FAISS_FLAT, dim, &fa), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri__chunk_index_add(ex, x, n), TRI_STATUS_OK);
        cr_assert_eq(tri__chunk_index_add(fa, x, n), TRI_STATUS_OK, "%s", tri_last_error());
        for (int t = 0; t < 12; t++) {
            for (int i = 0; i < n_q * hd; i++) q[i] = frand();
            tri__kv_group g = (tri__kv_group)(t % 3);
            int32_t window = t % 2 ? 4 : 0, nq = 1 + t % n_q, a[40], c[40], na, nc;
            cr_assert_eq(tri__chunk_select(ex, g, b, q, nq, n - t, 40, window, a, &na), TRI_STATUS_OK);
            cr_assert_eq(tri__chunk_select(fa, g, b, q, nq, n - t, 40, window, c, &nc), TRI_STATUS_OK, "%s",
                         tri_last_error());
            cr_assert_eq(na, 40);
            cr_assert_eq(nc, na);
            for (int i = 0; i < na; i++) {
                cr_assert_eq(a[i], c[i], "bound %d rule %d window %d, %d queries: chunk %d: exact %d, faiss %d", b,
                             (int)g, window, nq, i, a[i], c[i]);
                if (i) cr_assert(a[i] > a[i - 1], "ascending");
            }
            cr_assert_eq(a[0], 0, "chunk 0 kept");
            for (int w = 0; w < window; w++) cr_assert_eq(a[na - window + w], n - t - window + w, "the window kept");
        }
        tri__chunk_index_free(ex);
        tri__chunk_index_free(fa);
    }
    free(x);
}

// Each ranked chunk brings the `follow` chunks after it while the budget's r last (tri__chunk_keep):
// 12 chunks, a window of 2 (10 and 11), r = 5, ranked 4, 5, 9, 2, 7, 1. None follow: the first five.
// One: 4 brings 5, and 5 (kept already) brings 6; 9's next is in the window; 2 fills the last place
// without its next. Two: 4 brings 5 and 6, 5 brings 7 (6 is kept), and 9 fills the last place.
// Every count is chunk 0, r and the window.
Test(chunk_index, follow_brings_the_chunks_after_each_chosen) {
    const int32_t ranked[] = {4, 5, 9, 2, 7, 1};
    const int32_t want[3][8] = {{0, 2, 4, 5, 7, 9, 10, 11}, {0, 2, 4, 5, 6, 9, 10, 11}, {0, 4, 5, 6, 7, 9, 10, 11}};
    unsigned char keep[12];
    for (int32_t f = 0; f < 3; f++) {
        int32_t ids[12];
        int32_t n = tri__chunk_keep(ranked, 6, 5, f, 12, 10, keep, ids);
        cr_assert_eq(n, 8, "follow %d: %d chunks", f, n);
        for (int32_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], want[f][i], "follow %d: chunk %d is %d, want %d", f, i, ids[i], want[f][i]);
    }
    // fewer ranked than room: what they bring, and no more
    int32_t ids[12];
    cr_assert_eq(tri__chunk_keep((int32_t[]){8}, 1, 5, 1, 12, 10, keep, ids), 5);
    cr_assert(ids[0] == 0 && ids[1] == 8 && ids[2] == 9 && ids[3] == 10 && ids[4] == 11);
}

// ---- policies driven directly, with constructed keys and queries ----

typedef struct rig {
    tri__backend *be;
    tri__kv_policy pol;
    tri__rope rope;
    int32_t n_head, n_head_kv, hd;
} rig;

static void rig_init(rig *r, const tri__kv_policy_params *pp, int32_t n_head, int32_t n_head_kv, int32_t hd,
                     int32_t cap, int32_t max_step) {
    memset(r, 0, sizeof *r);
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_SCALAR, &r->be), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_init(&r->pol, pp, r->be, TRI_DTYPE_F32, 1, n_head, n_head_kv, hd, cap, max_step),
                 TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_config c = {.n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd, .rope_theta = 10000,
                          .rope_factor = 1};
    cr_assert_eq(tri__rope_init(&r->rope, &c, NULL), TRI_STATUS_OK);
    r->n_head = n_head;
    r->n_head_kv = n_head_kv;
    r->hd = hd;
}

static void rig_free(rig *r) {
    tri__kv_policy_free(&r->pol);
    tri__rope_free(&r->rope);
    tri__backend_free(r->be);
}

// One step of m tokens with keys k (m, n_head_kv * hd), values v and queries q (m, n_head * hd):
// what the forward pass does for one layer. Returns the view's spans of KV head 0 in *view.
static void rig_step(rig *r, int32_t m, const float *q, const float *k, const float *v, tri__kv_view *view) {
    int32_t qpos[64];
    float out[64 * 64];
    cr_assert_eq(tri__kv_policy_begin(&r->pol, m, &r->rope, qpos), TRI_STATUS_OK, "%s", tri_last_error());
    const tri__kv_view *vw;
    float *ws;
    cr_assert_eq(tri__kv_policy_layer(&r->pol, 0, q, k, v, &vw, &ws), TRI_STATUS_OK, "%s", tri_last_error());
    if (view) *view = *vw;
    cr_assert_eq(r->be->ops->attention(r->be, out, q, qpos, m, r->n_head, r->hd, vw, ws), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_observe(&r->pol, 0), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_commit(&r->pol), TRI_STATUS_OK, "%s", tri_last_error());
}

// A selection requested, then a step of m tokens (rig_step): returns layer 0, KV head 0's chunks
// into ids (their count); *n_sel receives the length the selection was made at.
static int32_t rig_select(rig *r, int32_t m, const float *q, const float *k, const float *v, int32_t *ids,
                          int32_t *n_sel) {
    tri__kv_policy_request_refresh(&r->pol);
    rig_step(r, m, q, k, v, NULL);
    return tri__kv_policy_selection(&r->pol, 0, 0, ids, n_sel);
}

// Retrieval with chunks of 2 and a budget of 4 (chunk 0 + one more). Chunk keys point along
// axes; the two query heads of the KV head disagree, and their sum decides.
Test(retrieval, selection_by_summed_group_query) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 32);
    pp.budget = 4;
    pp.chunk = 2;
    pp.group = TRI__KV_GROUP_SUM;
    pp.window = 0;
    pp.queries = 1;
    pp.mass = false;  // the first selection by the group rule too
    rig r;
    rig_init(&r, &pp, 2, 1, 4, 32, 8);
    // chunk 0: (0, 0, 0, 1); chunk 1: e0; chunk 2: e1; chunk 3: e2 (both tokens of each)
    float k[8][4] = {{0}}, v[8][4] = {{0}}, q[8][8] = {{0}};
    for (int t = 0; t < 8; t++) {
        int c = t / 2;
        k[t][c == 0 ? 3 : c - 1] = 1;
        v[t][0] = (float)t;
    }
    // the last query: head 0 wants chunk 1 strongly (2 e0), head 1 leans away from it and towards
    // chunk 3: the sum (0.5, 0, 0.9, 0) picks chunk 3, the max of the heads would pick chunk 1
    q[7][0] = 2;
    q[7][4] = -1.5f;
    q[7][6] = 0.9f;
    int32_t ids[8], n_sel;
    cr_assert_eq(rig_select(&r, 8, &q[0][0], &k[0][0], &v[0][0], ids, &n_sel), 2);
    cr_assert_eq(n_sel, 8);
    cr_assert(ids[0] == 0 && ids[1] == 3, "selected %d, %d; want 0, 3", ids[0], ids[1]);
    // the next token attends to chunk 0 and to chunk 3 merged with itself: [0, 2) and [6, 9)
    tri__kv_view view;
    float k1[4] = {0}, v1[4] = {0}, q1[8] = {0};
    rig_step(&r, 1, q1, k1, v1, &view);
    cr_assert_eq(view.head_span[1], 2);
    cr_assert(view.spans[0].pos0 == 0 && view.spans[0].n == 2);
    cr_assert(view.spans[1].pos0 == 6 && view.spans[1].n == 3, "span [%d, +%d)", view.spans[1].pos0, view.spans[1].n);
    // rolling back before the selection returns to full attention
    cr_assert_eq(tri__kv_policy_truncate(&r.pol, 7), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_selection(&r.pol, 0, 0, ids, &n_sel), -1);
    rig_free(&r);
}

// Chunks of 2 tokens along axes of an 8-dimensional head: chunk 0 e7 (the sink), chunks 1-4 e0,
// e1, e2, e3. Two query heads share the KV head: head 0 wants chunk 1 strongly (3 e0 + e3), head 1
// wants chunks 3 and 2 and pushes chunk 1 away (-2.5 e0 + 0.9 e1 + e2). Their sum
// (0.5, 0.9, 1, 1) buries chunk 1, head 0's needle: budget 6 (chunk 0 and two more) by the sum
// keeps chunks 3 and 4. Scored per head, each head's best chunk counts: the max of the logits
// relative to each head's best (chunk 1: 0 by head 0; chunk 3: 0 by head 1; chunk 2: -0.1) and the
// sum of per-head softmaxes over the chunks (chunk 1 .474, chunk 3 .410, chunk 2 .401, chunk 4
// .387 at 1/sqrt(8)) both keep chunks 1 and 3. A recent window of one chunk keeps chunk 4 and
// leaves room for one chosen chunk: chunks 1 and 3 tie at 0 by the max, and the second key,
// sum_j exp(rel_j / sqrt(8)), prefers 3 (1.346 against 1.290). Reading the previous token's
// queries too (head 0 on e0 again, head 1 on e1 alone) adds chunk 2 as a third favourite:
// chunks 1, 2, 3 all score 0 by the max, and the second key keeps 2 (2.657) and 1 (2.636).
static void group_case(tri__kv_group group, int32_t window, int32_t queries, const int32_t *want, int32_t n_want) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 32);
    pp.budget = 6;
    pp.chunk = 2;
    pp.group = group;
    pp.window = window;
    pp.queries = queries;
    pp.mass = false;
    rig r;
    rig_init(&r, &pp, 2, 1, 8, 32, 16);
    float k[10][8] = {{0}}, v[10][8] = {{0}}, q[10][16] = {{0}};
    for (int t = 0; t < 10; t++) {
        int c = t / 2;
        k[t][c == 0 ? 7 : c - 1] = 1;
        v[t][0] = (float)t;
    }
    q[9][0] = 3;
    q[9][3] = 1;
    q[9][8 + 0] = -2.5f;
    q[9][8 + 1] = 0.9f;
    q[9][8 + 2] = 1;
    q[8][0] = 3;  // token 8: head 0 on chunk 1, head 1 on chunk 2
    q[8][8 + 1] = 3;
    int32_t ids[8], n_sel;
    int32_t n = rig_select(&r, 10, &q[0][0], &k[0][0], &v[0][0], ids, &n_sel);
    cr_assert_eq(n, n_want, "group %d window %d queries %d: %d chunks", (int)group, window, queries, n);
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "group %d window %d queries %d: chunk %d is %d, want %d", (int)group, window,
                     queries, i, ids[i], want[i]);
    rig_free(&r);
}

Test(retrieval, gqa_selection_finds_one_heads_needle) {
    group_case(TRI__KV_GROUP_SUM, 0, 1, (int32_t[]){0, 3, 4}, 3);
    group_case(TRI__KV_GROUP_MAX, 0, 1, (int32_t[]){0, 1, 3}, 3);
    group_case(TRI__KV_GROUP_SOFTMAX, 0, 1, (int32_t[]){0, 1, 3}, 3);
    group_case(TRI__KV_GROUP_MAX, 2, 1, (int32_t[]){0, 3, 4}, 3);
    group_case(TRI__KV_GROUP_SUM, 2, 1, (int32_t[]){0, 3, 4}, 3);
    group_case(TRI__KV_GROUP_MAX, 0, 2, (int32_t[]){0, 1, 2}, 3);
}

// The first selection, made while the policy attends to every key, keeps what full attention
// reads where the mean keys hide it; a refresh replaces it by the group rule over the index, unless
// the layer is the oracle's (mass at every selection). Chunks of 2 over a 4-dimensional head, a
// budget of 4 (chunk 0 and one more), two query heads on one KV head: chunk 0 e3, chunk 1 the keys
// 4 e0 and -4 e0 (mean 0), chunk 2 two keys 0.5 e1, chunk 3 zeros. The last token's queries are
// 2 e0 (head 0) and 2 e1 (head 1). By the means every chunk but 2 scores 0 for both heads, so MAX
// keeps chunk 2 (head 1's favourite, and the tie goes to it); full attention puts exp(4) of head
// 0's weight on the key 4 e0, so a selection by mass keeps chunk 1. The mass probe (the double-
// precision reference) sums to the two query vectors and matches a softmax written out here.
Test(retrieval, mass_keeps_what_full_attention_reads) {
    float k[8][4] = {{0}}, v[8][4] = {{0}}, q[8][8] = {{0}};
    k[0][3] = k[1][3] = 1;
    k[2][0] = 4;
    k[3][0] = -4;
    k[4][1] = k[5][1] = 0.5f;
    for (int t = 0; t < 8; t++) v[t][0] = (float)t;
    q[7][0] = 2;
    q[7][4 + 1] = 2;
    for (int mode = 0; mode < 3; mode++) {  // the index always, mass first (the default), the oracle
        tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 32);
        pp.budget = 4;
        pp.chunk = 2;
        pp.window = 0;
        pp.queries = 1;
        pp.mass = mode > 0;
        pp.oracle = mode == 2;
        rig r;
        rig_init(&r, &pp, 2, 1, 4, 32, 8);
        int32_t ids[8], n_sel;
        cr_assert_eq(rig_select(&r, 8, &q[0][0], &k[0][0], &v[0][0], ids, &n_sel), 2);
        cr_assert(ids[0] == 0 && ids[1] == (mode ? 1 : 2), "mode %d: selected %d, %d", mode, ids[0], ids[1]);
        double mass[4], rest, want[4] = {0}, sum = 0;
        cr_assert_eq(tri__kv_policy_chunk_mass(&r.pol, 0, 0, mass, &rest), 4, "%s", tri_last_error());
        for (int j = 0; j < 2; j++) {  // head j's softmax of q.k / 2 over positions 0 .. 7
            double e[8], z = 0;
            for (int t = 0; t < 8; t++) {
                double d = 0;
                for (int x = 0; x < 4; x++) d += (double)q[7][4 * j + x] * k[t][x];
                z += e[t] = exp(d / 2);
            }
            for (int t = 0; t < 8; t++) want[t / 2] += e[t] / z;
        }
        for (int c = 0; c < 4; c++) {
            cr_assert(fabs(mass[c] - want[c]) < 1e-9, "chunk %d: mass %g, want %g", c, mass[c], want[c]);
            sum += mass[c];
        }
        cr_assert(rest == 0 && fabs(sum - 2) < 1e-9, "rest %g, sum %g", rest, sum);
        // a refresh with the same queries at position 8 (a zero key): the index's choice, chunk
        // 2, unless the oracle chooses
        float k8[4] = {0}, v8[4] = {0};
        cr_assert_eq(rig_select(&r, 1, &q[7][0], k8, v8, ids, &n_sel), 2);
        cr_assert_eq(n_sel, 9);
        cr_assert(ids[0] == 0 && ids[1] == (mode == 2 ? 1 : 2), "mode %d, refresh: selected %d, %d", mode, ids[0],
                  ids[1]);
        rig_free(&r);
    }
}

// A selection by mass keeps the chunk after the one it chooses (params.follow); the index's rule
// does not. Chunks of 2 over a 4-dimensional head, a budget of 6 (chunk 0 and two more), no window:
// chunk 0 e3, chunk 1 two keys 1.5 e0, chunk 2 the keys 2 e0 and 2 e0, chunks 3 and 4 zeros; both
// query heads 2 e0. Chunk 2 is the best by mass and by mean key, chunk 1 the second: without follow
// (or by the index) the selection is 0, 1, 2; by mass with it chunk 2 brings chunk 3 in chunk 1's
// place.
Test(retrieval, follow_keeps_the_chunk_after_the_chosen) {
    float k[10][4] = {{0}}, v[10][4] = {{0}}, q[10][8] = {{0}};
    k[0][3] = k[1][3] = 1;
    k[2][0] = k[3][0] = 1.5f;
    k[4][0] = k[5][0] = 2;
    for (int t = 0; t < 10; t++) v[t][0] = (float)t;
    q[9][0] = q[9][4] = 2;
    for (int mode = 0; mode < 4; mode++) {  // by the index, by mass; follow 0, 1
        tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 32);
        pp.budget = 6;
        pp.chunk = 2;
        pp.window = 0;
        pp.queries = 1;
        pp.mass = mode & 1;
        pp.follow = mode >> 1;
        rig r;
        rig_init(&r, &pp, 2, 1, 4, 32, 16);
        int32_t ids[8], n_sel;
        cr_assert_eq(rig_select(&r, 10, &q[0][0], &k[0][0], &v[0][0], ids, &n_sel), 3);
        const bool follows = pp.mass && pp.follow;
        cr_assert(ids[0] == 0 && ids[1] == (follows ? 2 : 1) && ids[2] == (follows ? 3 : 2),
                  "mass %d follow %d: selected %d, %d, %d", pp.mass, pp.follow, ids[0], ids[1], ids[2]);
        rig_free(&r);
    }
}

// A refresh count counts generated tokens: steps before the first selection (a long prompt, run
// in pieces) never select by count, however many tokens they hold; the request after the prompt
// selects, and from then on every `refresh` tokens.
Test(retrieval, refresh_count_waits_for_the_first_selection) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 64);
    pp.budget = 8;
    pp.chunk = 2;
    pp.refresh = 4;
    rig r;
    rig_init(&r, &pp, 2, 1, 4, 64, 8);
    static float k[64][4], v[64][4], q[64][8];
    for (int t = 0; t < 64; t++) {
        for (int d = 0; d < 4; d++) k[t][d] = frand(), v[t][d] = frand();
        for (int d = 0; d < 8; d++) q[t][d] = frand();
    }
    int32_t ids[8], n_sel;
    // a prompt of 24 in steps of 8: three times the budget and six times the count, no selection
    for (int s = 0; s < 3; s++) {
        rig_step(&r, 8, q[8 * s], k[8 * s], v[8 * s], NULL);
        cr_assert_eq(tri__kv_policy_selection(&r.pol, 0, 0, ids, &n_sel), -1, "selected after %d prompt tokens",
                     8 * (s + 1));
    }
    // its last piece with the request: selects at 32
    cr_assert_eq(rig_select(&r, 8, q[24], k[24], v[24], ids, &n_sel), 4);
    cr_assert_eq(n_sel, 32);
    // then every 4 generated tokens
    for (int t = 32; t < 41; t++) {
        rig_step(&r, 1, q[t], k[t], v[t], NULL);
        tri__kv_policy_selection(&r.pol, 0, 0, ids, &n_sel);
        int32_t want = t + 1 < 36 ? 32 : t + 1 < 40 ? 36 : 40;
        cr_assert_eq(n_sel, want, "after %d tokens: selection at %d, want %d", t + 1, n_sel, want);
    }
    rig_free(&r);
}

// Adopting a prompt's rows from a full store equals running them: the same rows, the same chunk
// summaries (so the same selection), and no adoption once the policy selects over its own view.
Test(retrieval, adopted_rows_equal_run_rows) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 64);
    pp.budget = 8;
    pp.chunk = 2;
    pp.queries = 1;  // adopted tokens have no queries: only the last token's are in both histories
    rig a, b;
    rig_init(&a, &pp, 2, 1, 4, 64, 8);
    rig_init(&b, &pp, 2, 1, 4, 64, 8);
    static float k[64][4], v[64][4], q[64][8];
    for (int t = 0; t < 64; t++) {
        for (int d = 0; d < 4; d++) k[t][d] = frand(), v[t][d] = frand();
        for (int d = 0; d < 8; d++) q[t][d] = frand();
    }
    // b runs 23 prompt tokens; a copies them from a full store on its backend that holds them
    for (int t = 0; t < 23; t += 8) rig_step(&b, t + 8 <= 23 ? 8 : 23 - t, q[t], k[t], v[t], NULL);
    tri__kv_store src;
    cr_assert_eq(tri__kv_store_init(&src, a.be, TRI_DTYPE_F32, 1, 1, 4, 64), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_load_rows(&src, 0, 0, 23, k, v), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_set_len(&src, 23), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_adopt(&a.pol, &src, 10), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_adopt(&a.pol, &src, 23), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_len(&a.pol), 23);
    cr_assert_eq(memcmp(a.pol.kv->k[0], b.pol.kv->k[0], sizeof(float) * 23 * 4), 0);
    cr_assert_eq(memcmp(a.pol.kv->v[0], b.pol.kv->v[0], sizeof(float) * 23 * 4), 0);
    // the last prompt token with the request: both select, the same chunks
    tri__kv_policy_request_refresh(&a.pol);
    tri__kv_policy_request_refresh(&b.pol);
    rig_step(&a, 1, q[23], k[23], v[23], NULL);
    rig_step(&b, 1, q[23], k[23], v[23], NULL);
    int32_t ia[8], ib[8], na, nb;
    int32_t ca = tri__kv_policy_selection(&a.pol, 0, 0, ia, &na), cb = tri__kv_policy_selection(&b.pol, 0, 0, ib, &nb);
    cr_assert(ca == 4 && cb == 4 && na == 24 && nb == 24, "selections: %d at %d, %d at %d", ca, na, cb, nb);
    cr_assert_eq(memcmp(ia, ib, sizeof(int32_t) * 4), 0);
    // now a's own rows come from its selected view: adopting more would not be what it computes
    cr_assert_eq(tri__kv_store_load_rows(&src, 0, 23, 8, k[23], v[23]), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_set_len(&src, 31), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_adopt(&a.pol, &src, 30), TRI_STATUS_UNSUPPORTED);
    cr_assert_eq(tri__kv_policy_len(&a.pol), 24, "a refused adoption changes nothing");
    cr_assert_eq(tri__kv_policy_adopt(&a.pol, &src, 40), TRI_STATUS_INVALID_ARGUMENT, "past what the source holds");
    tri__kv_store_free(&src);
    rig_free(&a);
    rig_free(&b);

    // a StreamingLLM cache keeps raw keys rotated in its own way: never adopted
    tri__kv_policy_params sp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 64);
    sp.budget = 8;
    sp.sink = 2;
    rig st;
    rig_init(&st, &sp, 2, 1, 4, 64, 8);
    cr_assert_eq(tri__kv_store_init(&src, st.be, TRI_DTYPE_F32, 1, 1, 4, 64), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_load_rows(&src, 0, 0, 4, k, v), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_set_len(&src, 4), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_adopt(&st.pol, &src, 4), TRI_STATUS_UNSUPPORTED);
    tri__kv_store_free(&src);
    rig_free(&st);
}

// A naive double-precision RoPE of one head (ADJACENT layout, theta 10000, no scaling): pair i of
// x (hd) turned by pos * 10000^(-2i / hd).
static void naive_rope(double *out, const float *x, int32_t hd, int32_t pos) {
    for (int32_t i = 0; i < hd / 2; i++) {
        double a = pos * pow(10000.0, -2.0 * i / hd), c = cos(a), s = sin(a);
        out[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
        out[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c;
    }
}

// StreamingLLM on constructed keys: at every step the view holds the sinks and the most recent
// tokens (or everything, while it fits), then the step's own tokens, in position order; each row
// is the raw key turned by its rank in that list, and the queries sit at the ranks after them.
Test(streaming, view_keeps_sinks_and_window_rotated_by_rank) {
    enum { T = 40, HD = 8, NKV = 2, NH = 4, KD = NKV * HD, BUDGET = 8, SINK = 2 };
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 64);
    pp.budget = BUDGET;
    pp.sink = SINK;
    rig r;
    rig_init(&r, &pp, NH, NKV, HD, 64, 4);
    cr_assert(r.pol.raw_keys, "StreamingLLM wants keys before RoPE");
    static float k[T][KD], v[T][KD], q[T][NH * HD];
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < KD; d++) k[t][d] = frand(), v[t][d] = frand();
        for (int d = 0; d < NH * HD; d++) q[t][d] = frand();
    }
    const int steps[] = {3, 1, 4, 1, 1, 2, 4, 1, 1, 1, 3, 4, 1, 2, 1, 1, 4, 1, 1, 3};
    int t0 = 0;
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        int m = steps[si];
        // what the view should hold, by absolute position
        int want[BUDGET + 4], n_want = 0;
        if (t0 <= BUDGET) {
            for (int j = 0; j < t0; j++) want[n_want++] = j;
        } else {
            for (int j = 0; j < SINK; j++) want[n_want++] = j;
            for (int j = t0 - (BUDGET - SINK); j < t0; j++) want[n_want++] = j;
        }
        int kept = n_want;
        for (int j = 0; j < m; j++) want[n_want++] = t0 + j;

        int32_t qpos[4];
        float out[4 * NH * HD];
        cr_assert_eq(tri__kv_policy_begin(&r.pol, m, &r.rope, qpos), TRI_STATUS_OK, "%s", tri_last_error());
        for (int i = 0; i < m; i++) cr_assert_eq(qpos[i], kept + i, "after %d: query %d at %d", t0, i, qpos[i]);
        const tri__kv_view *vw;
        float *ws;
        cr_assert_eq(tri__kv_policy_layer(&r.pol, 0, q[t0], k[t0], v[t0], &vw, &ws), TRI_STATUS_OK);
        cr_assert_eq(vw->type, TRI_DTYPE_F32);
        for (int h = 0; h < NKV; h++) {
            cr_assert_eq(vw->head_span[h + 1] - vw->head_span[h], 1);
            const tri__kv_span *sp = &vw->spans[vw->head_span[h]];
            cr_assert(sp->pos0 == 0 && sp->n == n_want, "after %d, head %d: %d rows, want %d", t0, h, sp->n, n_want);
            for (int row = 0; row < n_want; row++) {
                // the store keeps the sinks and a ring of window + step + rollback rows
                int ring = BUDGET - SINK + 4 + 4, at = want[row] < SINK ? want[row] : SINK + (want[row] - SINK) % ring;
                cr_assert_eq(r.pol.ring_rows, ring);
                cr_assert_eq(r.pol.gather[row], at, "after %d: row %d holds store row %d, want %d (position %d)", t0,
                             row, r.pol.gather[row], at, want[row]);
                double rot[HD];
                naive_rope(rot, &k[want[row]][h * HD], HD, row);
                const float *got = (const float *)sp->k + (int64_t)row * sp->stride;
                const float *val = (const float *)sp->v + (int64_t)row * sp->stride;
                for (int d = 0; d < HD; d++) {
                    cr_assert(fabs(got[d] - rot[d]) < 1e-5, "after %d, head %d, row %d (position %d) elem %d: %g, "
                              "rope at rank %d gives %g", t0, h, row, want[row], d, (double)got[d], row, rot[d]);
                    cr_assert_eq(val[d], v[want[row]][h * HD + d]);
                }
            }
        }
        cr_assert_eq(r.be->ops->attention(r.be, out, q[t0], qpos, m, NH, HD, vw, ws), TRI_STATUS_OK);
        cr_assert_eq(tri__kv_policy_observe(&r.pol, 0), TRI_STATUS_OK);
        cr_assert_eq(tri__kv_policy_commit(&r.pol), TRI_STATUS_OK);
        t0 += m;
    }
    cr_assert_eq(t0, T);
    rig_free(&r);
}

// H2O against a naive simulation in double precision: softmax of each query over what it sees,
// probabilities summed over the group's heads and the step's queries, lowest accumulated score
// outside the recent window evicted first.
static void h2o_naive(int bounded);

// Twice: with a store of every position, and with a bounded one (history 1: 2 * budget + 2 steps
// of rows) whose rows move down when a step does not fit.
Test(h2o, heavy_hitters_match_naive_simulation) {
    for (int bounded = 0; bounded < 2; bounded++) h2o_naive(bounded);
}

static void h2o_naive(int bounded) {
    enum { T = 40, HD = 8, NH = 2, BUDGET = 10, RECENT = 4 };
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_H2O, 64);
    pp.budget = BUDGET;
    pp.recent = RECENT;
    pp.history = bounded ? 1 : 0;
    rig r;
    rig_init(&r, &pp, NH, 1, HD, 64, 8);
    cr_assert_eq(r.pol.own.capacity, bounded ? 2 * BUDGET + 2 * 8 : 64, "store rows %d", r.pol.own.capacity);
    static float k[T][HD], v[T][HD], q[T][NH * HD];
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < HD; d++) k[t][d] = frand() * (t % 7 == 3 ? 3.0f : 1.0f);  // some keys stand out
        for (int d = 0; d < HD; d++) v[t][d] = frand();
        for (int d = 0; d < NH * HD; d++) q[t][d] = frand();
    }
    // naive state
    int kept[T + 8], n_kept = 0;
    double score[T];
    int steps[] = {6, 1, 3, 1, 1, 5, 2, 1, 4, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 4};
    int t0 = 0;
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        int m = steps[si];
        rig_step(&r, m, q[t0], k[t0], v[t0], NULL);
        // naive: every query sees the kept positions and the step's tokens up to itself
        double add[T] = {0};
        for (int i = 0; i < m; i++)
            for (int a = 0; a < NH; a++) {
                int vis[T + 8], nv = 0;
                for (int j = 0; j < n_kept; j++) vis[nv++] = kept[j];
                for (int j = 0; j <= i; j++) vis[nv++] = t0 + j;
                double s[T + 8], mx = -1e300, sum = 0;
                for (int j = 0; j < nv; j++) {
                    s[j] = 0;
                    for (int d = 0; d < HD; d++) s[j] += (double)q[t0 + i][a * HD + d] * k[vis[j]][d];
                    s[j] /= sqrt((double)HD);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j < nv; j++) sum += exp(s[j] - mx);
                for (int j = 0; j < nv; j++) add[vis[j]] += exp(s[j] - mx) / sum;
            }
        for (int j = 0; j < n_kept; j++) score[kept[j]] += add[kept[j]];
        for (int j = 0; j < m; j++) {
            kept[n_kept++] = t0 + j;
            score[t0 + j] = add[t0 + j];
        }
        t0 += m;
        while (n_kept > BUDGET) {
            int w = -1;
            for (int j = 0; j < n_kept; j++)
                if (kept[j] < t0 - RECENT && (w < 0 || score[kept[j]] < score[kept[w]])) w = j;
            memmove(kept + w, kept + w + 1, sizeof(int) * (size_t)(n_kept - w - 1));
            n_kept--;
        }
        int32_t got[T + 8];
        int32_t n_got = tri__kv_policy_h2o_kept(&r.pol, 0, 0, got);
        cr_assert_eq(n_got, n_kept, "after %d tokens: %d kept, naive %d", t0, n_got, n_kept);
        for (int j = 0; j < n_kept; j++)
            cr_assert_eq(got[j], kept[j], "after %d tokens, kept[%d]: %d, naive %d", t0, j, got[j], kept[j]);
    }
    cr_assert_eq(t0, T);
    rig_free(&r);
}

// H2O remembers `history` steps (default 8) to roll back into: further back is an error naming
// the oldest position it can return to, and leaves the state as it was.
Test(h2o, rollback_past_the_remembered_steps_is_refused) {
    enum { HD = 4 };
    static float k[16][HD], v[16][HD], q[16][2 * HD];
    for (int t = 0; t < 16; t++) {
        for (int d = 0; d < HD; d++) k[t][d] = frand(), v[t][d] = frand();
        for (int d = 0; d < 2 * HD; d++) q[t][d] = frand();
    }
    for (int history = 0; history <= 2; history += 2) {
        tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_H2O, 32);
        pp.budget = 4;
        pp.history = history;
        rig r;
        rig_init(&r, &pp, 2, 1, HD, 32, 4);
        int remembered = history ? history : 8;
        cr_assert_eq(r.pol.p.history, remembered);
        // 10 one-token steps: the remembered ones start at 10 - remembered
        for (int t = 0; t < 10; t++) rig_step(&r, 1, q[t], k[t], v[t], NULL);
        int oldest = 10 - remembered;
        int32_t before[8], after[8];
        int32_t n_before = tri__kv_policy_h2o_kept(&r.pol, 0, 0, before);
        cr_assert_eq(tri__kv_policy_truncate(&r.pol, oldest - 1), TRI_STATUS_INVALID_ARGUMENT);
        char want[128];
        snprintf(want, sizeof want, "cannot roll back to %d of 10 positions: the last %d steps are remembered "
                 "(from position %d)", oldest - 1, remembered, oldest);
        cr_assert(strstr(tri_last_error(), want), "'%s' lacks '%s'", tri_last_error(), want);
        cr_assert_eq(tri__kv_policy_len(&r.pol), 10);
        cr_assert_eq(tri__kv_policy_h2o_kept(&r.pol, 0, 0, after), n_before);
        cr_assert(memcmp(before, after, sizeof(int32_t) * (size_t)n_before) == 0);
        // the oldest remembered step's start is within reach
        cr_assert_eq(tri__kv_policy_truncate(&r.pol, oldest), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri__kv_policy_len(&r.pol), oldest);
        rig_free(&r);
    }
}

// ---- policies in a session on a generated model ----

// A seeded model of the suite (kvp-<tag>, test-util.h), loaded.
static tri_model *gen_model(const char *tag, const char *opts) {
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model_as("kvp", tag, opts), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

static tri_session *session(tri_model *m, tri_kv_policy kind, int32_t n_ctx, int32_t budget, int32_t chunk,
                            int32_t sink, int32_t refresh) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = 16;
    sp.kv_type = TRI_DTYPE_F32;
    sp.kv_policy = kind;
    sp.kv_budget = budget;
    sp.kv_chunk = chunk;
    sp.kv_sink = sink;
    sp.kv_refresh = refresh;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    return s;
}

static int32_t tok(int i) { return (int32_t)((i * 37 + 11) % 250) + 3; }

// The logits of every token of a fixed 48-token sequence, run as a prompt of 30 then one by one.
static float *run_sequence(tri_session *s, int32_t V) {
    float *l = malloc(sizeof(float) * (size_t)(48 * V));
    int32_t t[48];
    for (int i = 0; i < 48; i++) t[i] = tok(i);
    tri_session_kv_refresh(s);
    cr_assert_eq(tri_session_eval(s, t, 30, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < 30; i++) memcpy(l + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
    for (int i = 30; i < 48; i++) {
        cr_assert_eq(tri_session_eval(s, t + i, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        memcpy(l + (int64_t)i * V, tri_session_logits(s, -1), sizeof(float) * (size_t)V);
    }
    return l;
}

// Retrieval with a budget of the whole context, StreamingLLM and H2O with nothing to evict: the
// same views as the full cache, hence bit for bit the same logits.
Test(policy, nothing_evicted_equals_full_exactly) {
    tri_model *m = gen_model("exact", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    tri_session *full = session(m, TRI_KV_POLICY_FULL, 64, 0, 0, 0, 0);
    float *want = run_sequence(full, V);
    struct {
        tri_kv_policy kind;
        int32_t refresh;
    } cases[] = {{TRI_KV_POLICY_RETRIEVAL, 0}, {TRI_KV_POLICY_RETRIEVAL, 5}, {TRI_KV_POLICY_STREAMING, 0},
                 {TRI_KV_POLICY_H2O, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tri_session *s = session(m, cases[c].kind, 64, 64, 8, 4, cases[c].refresh);
        float *got = run_sequence(s, V);
        for (int i = 0; i < 48; i++)
            cr_assert(memcmp(got + (int64_t)i * V, want + (int64_t)i * V, sizeof(float) * (size_t)V) == 0,
                      "policy %d refresh %d: logits of token %d differ from the full cache", cases[c].kind,
                      cases[c].refresh, i);
        free(got);
        tri_session_free(s);
    }
    free(want);
    tri_session_free(full);
    tri_model_free(m);
}

// Retrieval over FAISS's flat index selects the chunks the exact scan selects, so a session gives
// bit for bit the same logits with either; a small budget and a refresh every 3 tokens make it
// select from up to 24 chunks again and again (and the logits part from the full cache's).
Test(policy, faiss_flat_index_equals_exact) {
    tri_model *m = gen_model("faiss", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 128;
    sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
    sp.kv_index = TRI_KV_INDEX_FAISS_FLAT;
    if (!tri__chunk_index_have_faiss()) {
        tri_session *s = NULL;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_UNSUPPORTED);
        cr_assert(strstr(tri_last_error(), "no FAISS"), "%s", tri_last_error());
        tri_model_free(m);
        cr_skip_test("no FAISS in this build");
    }
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    tri_session *ex = session(m, TRI_KV_POLICY_RETRIEVAL, 128, 16, 4, 0, 3);
    tri_session *full = session(m, TRI_KV_POLICY_FULL, 128, 0, 0, 0, 0);
    tri_session *fa;
    sp = tri_session_default_params();
    sp.n_ctx = 128;
    sp.n_batch = 16;
    sp.kv_type = TRI_DTYPE_F32;
    sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
    sp.kv_budget = 16;
    sp.kv_chunk = 4;
    sp.kv_refresh = 3;
    sp.kv_index = TRI_KV_INDEX_FAISS_FLAT;
    cr_assert_eq(tri_session_create(m, &sp, &fa), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = tok(i);
    int differs = 0;
    tri_session *all[3] = {ex, fa, full};
    for (int k = 0; k < 3; k++) {
        tri_session_kv_refresh(all[k]);
        cr_assert_eq(tri_session_eval(all[k], t, 40, false), TRI_STATUS_OK, "%s", tri_last_error());
    }
    for (int i = 40; i < 100; i++) {
        for (int k = 0; k < 3; k++) cr_assert_eq(tri_session_eval(all[k], t + i, 1, false), TRI_STATUS_OK);
        cr_assert(memcmp(tri_session_logits(ex, -1), tri_session_logits(fa, -1), sizeof(float) * (size_t)V) == 0,
                  "token %d: FAISS flat and exact logits differ", i);
        differs += memcmp(tri_session_logits(ex, -1), tri_session_logits(full, -1), sizeof(float) * (size_t)V) != 0;
    }
    cr_assert(differs > 0, "the retrieval cache never left out anything that mattered");
    // an index that does not exist is refused
    sp.kv_index = (tri_kv_index)7;
    tri_session *bad = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &bad), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "unknown chunk index 7"), "%s", tri_last_error());
    for (int k = 0; k < 3; k++) tri_session_free(all[k]);
    tri_model_free(m);
}

// The same through a session: a prompt of 64 run in steps of 16 under a budget of 8 and a refresh
// count of 4 attends to all of itself, as the full cache does, bit for bit.
Test(policy, prompt_in_pieces_attends_to_all_of_itself) {
    tri_model *m = gen_model("prompt", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = tok(i);
    tri_session *full = session(m, TRI_KV_POLICY_FULL, 80, 0, 0, 0, 0);
    tri_session *ret = session(m, TRI_KV_POLICY_RETRIEVAL, 80, 8, 4, 0, 4);
    cr_assert_eq(tri_session_eval(full, t, 64, true), TRI_STATUS_OK);
    cr_assert_eq(tri_session_eval(ret, t, 64, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < 64; i++)
        cr_assert(memcmp(tri_session_logits(ret, i), tri_session_logits(full, i), sizeof(float) * (size_t)V) == 0,
                  "prompt token %d: logits differ from the full cache", i);
    tri_session_free(ret);
    tri_session_free(full);
    tri_model_free(m);
}

// A budget left to the default: 4096 in whole chunks, and a context no longer than that is served
// in full, whatever its length (a context of 13 is not a multiple of the chunk of 8).
Test(policy, default_budget_whole_chunks_or_full) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 5000);
    pp.chunk = 3;
    tri__kv_policy_default_budget(&pp, 5000);
    cr_assert(pp.kind == TRI_KV_POLICY_RETRIEVAL && pp.budget == 4095, "budget %d", pp.budget);
    cr_assert_eq(tri__kv_policy_check(&pp, 5000), TRI_STATUS_OK, "%s", tri_last_error());
    pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 5000);
    tri__kv_policy_default_budget(&pp, 5000);
    cr_assert(pp.kind == TRI_KV_POLICY_STREAMING && pp.budget == 4096);
    pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 13);
    tri__kv_policy_default_budget(&pp, 13);
    cr_assert_eq(pp.kind, TRI_KV_POLICY_FULL);

    tri_model *m = gen_model("defbudget", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    int32_t t[13];
    for (int i = 0; i < 13; i++) t[i] = tok(i);
    tri_session *full = session(m, TRI_KV_POLICY_FULL, 13, 0, 0, 0, 0);
    cr_assert_eq(tri_session_eval(full, t, 13, true), TRI_STATUS_OK);
    tri_kv_policy kinds[] = {TRI_KV_POLICY_RETRIEVAL, TRI_KV_POLICY_STREAMING, TRI_KV_POLICY_H2O};
    for (int k = 0; k < 3; k++) {
        tri_session *s = session(m, kinds[k], 13, 0, 0, 0, 0);
        tri_session_kv_refresh(s);
        cr_assert_eq(tri_session_eval(s, t, 13, true), TRI_STATUS_OK, "%s", tri_last_error());
        for (int i = 0; i < 13; i++)
            cr_assert(memcmp(tri_session_logits(s, i), tri_session_logits(full, i), sizeof(float) * (size_t)V) == 0,
                      "policy %d: logits of token %d differ from the full cache", kinds[k], i);
        tri_session_free(s);
    }
    // an explicit budget past the context is the full cache too, for every policy (the chunk then
    // divides nothing)
    for (int k = 0; k < 3; k++) {
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 13;
        sp.n_batch = 16;
        sp.kv_type = TRI_DTYPE_F32;
        sp.kv_policy = kinds[k];
        sp.kv_budget = 100;
        sp.kv_chunk = 3;
        tri_session *s = NULL;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "policy %d: %s", kinds[k], tri_last_error());
        cr_assert_eq(tri_session_eval(s, t, 13, true), TRI_STATUS_OK, "%s", tri_last_error());
        for (int i = 0; i < 13; i++)
            cr_assert(memcmp(tri_session_logits(s, i), tri_session_logits(full, i), sizeof(float) * (size_t)V) == 0,
                      "policy %d, budget 100: logits of token %d differ from the full cache", kinds[k], i);
        tri_session_free(s);
    }
    // an explicit budget within the context is checked, not adjusted
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 13;
    sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
    sp.kv_budget = 13;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "chunk size 8 must divide the budget 13"), "%s", tri_last_error());
    tri_session_free(full);
    tri_model_free(m);
}

// A: 20 tokens, then a step of 6, rolled back to 23 (into the step) or 20 (its start);
// B: the same without the dropped tokens. Both then run the same tokens: equal bit for bit.
Test(policy, rollback_as_if_never_appended) {
    tri_model *m = gen_model("rollback", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    int32_t t[64], other[6] = {5, 6, 7, 8, 9, 10};
    for (int i = 0; i < 64; i++) t[i] = tok(i);
    struct {
        tri_kv_policy kind;
        int32_t budget, chunk, sink, refresh;
    } cases[] = {{TRI_KV_POLICY_FULL, 0, 0, 0, 0},   {TRI_KV_POLICY_STREAMING, 12, 0, 4, 0},
                 {TRI_KV_POLICY_H2O, 12, 0, 0, 0},   {TRI_KV_POLICY_RETRIEVAL, 16, 4, 0, 3},
                 {TRI_KV_POLICY_RETRIEVAL, 8, 4, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int keep = 0; keep <= 3; keep += 3) {
            tri_session *a = session(m, cases[c].kind, 64, cases[c].budget, cases[c].chunk, cases[c].sink, cases[c].refresh);
            tri_session *b = session(m, cases[c].kind, 64, cases[c].budget, cases[c].chunk, cases[c].sink, cases[c].refresh);
            tri_session_kv_refresh(a);
            tri_session_kv_refresh(b);
            cr_assert_eq(tri_session_eval(a, t, 20, false), TRI_STATUS_OK);
            cr_assert_eq(tri_session_eval(b, t, 20, false), TRI_STATUS_OK);
            int32_t step[6];
            memcpy(step, t + 20, sizeof(int32_t) * (size_t)keep);
            memcpy(step + keep, other, sizeof(int32_t) * (size_t)(6 - keep));
            cr_assert_eq(tri_session_eval(a, step, 6, false), TRI_STATUS_OK);
            cr_assert_eq(tri_session_truncate(a, 20 + keep), TRI_STATUS_OK, "%s", tri_last_error());
            if (keep) cr_assert_eq(tri_session_eval(b, t + 20, keep, false), TRI_STATUS_OK);
            for (int i = 20 + keep; i < 44; i++) {
                cr_assert_eq(tri_session_eval(a, t + i, 1, false), TRI_STATUS_OK);
                cr_assert_eq(tri_session_eval(b, t + i, 1, false), TRI_STATUS_OK);
                cr_assert(memcmp(tri_session_logits(a, -1), tri_session_logits(b, -1), sizeof(float) * (size_t)V) == 0,
                          "policy %d, rolled back to %d: logits of token %d differ", cases[c].kind, 20 + keep, i);
            }
            tri_session_free(a);
            tri_session_free(b);
        }
    tri_model_free(m);
}

// A one-layer model trained on 32 positions, run for 300 with a StreamingLLM cache of 24 (4 sinks).
// With one layer a token's key and value depend on the token alone, so StreamingLLM's answer at
// token i is, by definition, full attention over the sequence of the sinks, the 20 tokens before
// i and i itself, at positions 0 .. 24: a fresh full-cache session run on those 25 tokens, never
// past the trained context, is the naive reference. The streaming session's own positions go to
// 300, far past 32.
Test(streaming, runs_past_trained_context) {
    enum { N = 300, PROMPT = 100, BUDGET = 24, SINK = 4 };
    tri_model *m = gen_model("stream", "--dtype f16 --ctx 32 --heads 4 --kv-heads 2 --head-dim 16 --layers 1");
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert_eq(info.config.n_ctx_train, 32);
    cr_assert(BUDGET + 1 <= info.config.n_ctx_train && N > 8 * info.config.n_ctx_train);
    int32_t V = info.config.n_vocab;
    tri_session *s = session(m, TRI_KV_POLICY_STREAMING, N + 20, BUDGET, 0, SINK, 0);
    tri_session *ref = session(m, TRI_KV_POLICY_FULL, BUDGET + 1, 0, 0, 0, 0);
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    cr_assert_eq(tri_session_eval(s, t, PROMPT, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < PROMPT; i++)
        for (int j = 0; j < V; j++) cr_assert(isfinite(tri_session_logits(s, i)[j]));
    double worst = 0;
    for (int i = PROMPT; i < N; i++) {
        cr_assert_eq(tri_session_eval(s, t + i, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_n_past(s), i + 1);
        const float *l = tri_session_logits(s, -1);
        int32_t seq[BUDGET + 1], n = 0;
        for (int j = 0; j < SINK; j++) seq[n++] = t[j];
        for (int j = i - (BUDGET - SINK); j <= i; j++) seq[n++] = t[j];
        tri_session_reset(ref);
        cr_assert_eq(tri_session_eval(ref, seq, n, false), TRI_STATUS_OK, "%s", tri_last_error());
        const float *want = tri_session_logits(ref, -1);
        double scale = 0;
        for (int j = 0; j < V; j++) scale = fmax(scale, fabs(want[j]));
        for (int j = 0; j < V; j++) {
            cr_assert(isfinite(l[j]), "token %d logit %d: %g", i, j, (double)l[j]);
            double err = fabs(l[j] - want[j]) / scale;
            worst = fmax(worst, err);
            cr_assert(err < 1e-4, "token %d (position %d) logit %d: %g, sink + window attention %g", i, i, j,
                      (double)l[j], (double)want[j]);
        }
    }
    cr_assert_eq(tri_session_n_past(s), N);
    cr_log_info("worst logit error against sink + window attention: %.2e of the largest", worst);
    tri_session_free(ref);
    tri_session_free(s);
    tri_model_free(m);
}

typedef struct token_log {
    int32_t ids[16];
    int n;
} token_log;

static bool log_token(int32_t token, void *user) {
    token_log *l = user;
    if (l->n < 16) l->ids[l->n++] = token;
    return true;
}

// A StreamingLLM session's cache does not depend on how its tokens were batched: a step attends
// to the window before it plus its own tokens, so past the window (8 here) the forward pass runs
// one token per step, and a 40-token prompt given in one call (tri_session_eval, or tri_generate's
// prefill in steps of n_batch = 16) gives bit for bit the logits of feeding it token by token
// (the CPU backend is batch-invariant). Generation from both then emits the same tokens.
Test(streaming, prompt_in_one_call_equals_token_by_token) {
    enum { N = 40, BUDGET = 8, SINK = 2, GEN = 6 };
    tri_model *m = gen_model("stream-batch", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    tri_model_info info;
    tri_model_get_info(m, &info);
    int32_t V = info.config.n_vocab;
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    tri_session *one = session(m, TRI_KV_POLICY_STREAMING, 64, BUDGET, 0, SINK, 0);
    tri_session *each = session(m, TRI_KV_POLICY_STREAMING, 64, BUDGET, 0, SINK, 0);
    cr_assert_eq(tri_session_eval(one, t, N, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < N; i++) {
        cr_assert_eq(tri_session_eval(each, t + i, 1, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(memcmp(tri_session_logits(one, i), tri_session_logits(each, -1), sizeof(float) * (size_t)V) == 0,
                  "token %d: logits of the prompt in one call differ from token by token", i);
    }

    // tri_generate: the whole prompt in one call, against all but its last token fed one by one
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = GEN;
    gp.stop_at_eos = false;
    token_log got[2] = {{{0}, 0}, {{0}, 0}};
    tri_session *gen[2] = {one, each};
    for (int k = 0; k < 2; k++) {
        tri_session_reset(gen[k]);
        if (k == 1)
            for (int i = 0; i < N - 1; i++) cr_assert_eq(tri_session_eval(each, t + i, 1, false), TRI_STATUS_OK);
        tri_generate_stats stats;
        cr_assert_eq(tri_generate(gen[k], k ? t + N - 1 : t, k ? 1 : N, &gp, log_token, &got[k], &stats),
                     TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(stats.n_generated == GEN && got[k].n == GEN);
        cr_assert_eq(tri_session_n_past(gen[k]), N + GEN - 1);
    }
    cr_assert(memcmp(tri_session_logits(one, -1), tri_session_logits(each, -1), sizeof(float) * (size_t)V) == 0,
              "after tri_generate: last logits differ");
    cr_assert(memcmp(got[0].ids, got[1].ids, sizeof(int32_t) * GEN) == 0, "generated tokens differ");
    tri_session_free(each);
    tri_session_free(one);
    tri_model_free(m);
}

// ---- StreamingLLM over a bounded store ----

// A forward pass over a StreamingLLM policy built by hand (budget 8, sink 2, steps of 16), so that
// the store's bound, its rollback rows and its eviction interval can be set.
typedef struct stream_rig {
    tri__backend *be;
    tri_model *w;
    tri__llama ll;
    tri__kv_policy pol;
    int32_t V;
} stream_rig;

// The rig over policy parameters pp: a cache of kv_type rows, capacity positions, steps of up to
// max_step tokens.
static void model_rig_init(stream_rig *r, tri_model *m, const tri__kv_policy_params *pp, tri_dtype kv_type,
                           int32_t capacity, int32_t max_step) {
    memset(r, 0, sizeof *r);
    tri_model_info info;
    tri_model_get_info(m, &info);
    const tri_model_config *c = &info.config;
    r->V = c->n_vocab;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &r->be), TRI_STATUS_OK);
    cr_assert_eq(tri__model_on_backend(m, r->be, 0, 0, &r->w), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__llama_init(&r->ll, r->w, r->be, max_step), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_init(&r->pol, pp, r->be, kv_type, c->n_layer, c->n_head, c->n_head_kv,
                                     c->head_dim, capacity, max_step),
                 TRI_STATUS_OK, "%s", tri_last_error());
}

static void policy_rig_init(stream_rig *r, tri_model *m, const tri__kv_policy_params *pp, int32_t capacity) {
    model_rig_init(r, m, pp, TRI_DTYPE_F16, capacity, 16);
}

static void stream_rig_init(stream_rig *r, tri_model *m, int32_t capacity, bool keep_all, int32_t rollback,
                            int32_t evict_every) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, capacity);
    pp.budget = 8;
    pp.sink = 2;
    pp.keep_all = keep_all;
    pp.rollback = rollback;
    pp.evict_every = evict_every;
    policy_rig_init(r, m, &pp, capacity);
}

static void stream_rig_free(stream_rig *r) {
    tri__kv_policy_free(&r->pol);
    tri__llama_free(&r->ll);
    tri__model_backend_free(r->w);
    tri__backend_free(r->be);
}

// Runs t[0 .. n) one call per token, the logits of each into l (n, V).
static void stream_run(stream_rig *r, const int32_t *t, int32_t n, float *l) {
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(tri__llama_forward_policy(&r->ll, &r->pol, t + i, 1, TRI_LOGITS_LAST, l + (int64_t)i * r->V),
                     TRI_STATUS_OK, "token %d: %s", i, tri_last_error());
}

// The store keeps the sinks and a ring of window + step + rollback rows, whatever the length the
// policy may reach, and computes bit for bit what a store of every position computes.
Test(streaming, bounded_store_equals_every_position) {
    enum { N = 300 };
    tri_model *m = gen_model("stream-bound", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    stream_rig all, small, huge;
    stream_rig_init(&all, m, 512, true, 0, 0);
    stream_rig_init(&small, m, 512, false, 0, 0);
    stream_rig_init(&huge, m, 1 << 30, false, 0, 0);
    cr_assert_eq(all.pol.ring_rows, 0);
    cr_assert_eq(all.pol.own.capacity, 512, "keep_all: every position");
    // sink 2 + (window 6 + step 16 + rollback 16 by default): the same for any capacity
    for (stream_rig *r = &small; r; r = r == &small ? &huge : NULL) {
        cr_assert_eq(r->pol.ring_rows, 6 + 16 + 16);
        cr_assert_eq(r->pol.own.capacity, 2 + 6 + 16 + 16, "store rows %d", r->pol.own.capacity);
    }
    cr_assert_eq(tri__kv_policy_capacity(&huge.pol), 1 << 30);
    const size_t bytes = sizeof(float) * (size_t)N * (size_t)all.V;
    float *la = malloc(bytes), *lb = malloc(bytes);
    cr_assert(la && lb);
    stream_run(&all, t, N, la);
    for (stream_rig *r = &small; r; r = r == &small ? &huge : NULL) {
        stream_run(r, t, N, lb);
        for (int i = 0; i < N; i++)
            cr_assert(memcmp(la + (int64_t)i * all.V, lb + (int64_t)i * all.V, sizeof(float) * (size_t)all.V) == 0,
                      "token %d: the bounded store's logits differ from those over every position", i);
        cr_assert_eq(tri__kv_policy_len(&r->pol), N);
    }
    free(la);
    free(lb);
    stream_rig_free(&all);
    stream_rig_free(&small);
    stream_rig_free(&huge);
    tri_model_free(m);
}

// A rollback within the rows kept (a step of 16 and rollback 5 past the window: 21 tokens back
// from the highest length reached) is exact; one further is refused with the position overwritten.
Test(streaming, bounded_rollback_within_its_rows) {
    enum { N = 100, DEPTH = 16 + 5 };
    tri_model *m = gen_model("stream-rollback", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    stream_rig r;
    stream_rig_init(&r, m, 4096, false, 5, 0);
    float *la = malloc(sizeof(float) * (size_t)N * (size_t)r.V), *lb = malloc(sizeof(float) * (size_t)N * (size_t)r.V);
    cr_assert(la && lb);
    stream_run(&r, t, N, la);
    cr_assert_eq(tri__kv_policy_truncate(&r.pol, N - DEPTH - 1), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "cannot roll back to 78 of 100 positions"), "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_len(&r.pol), N, "a refused rollback changes nothing");
    cr_assert_eq(tri__kv_policy_truncate(&r.pol, N - DEPTH), TRI_STATUS_OK, "%s", tri_last_error());
    stream_run(&r, t + N - DEPTH, DEPTH, lb);
    for (int i = 0; i < DEPTH; i++)
        cr_assert(memcmp(la + (int64_t)(N - DEPTH + i) * r.V, lb + (int64_t)i * r.V, sizeof(float) * (size_t)r.V) == 0,
                  "token %d after the rollback differs", N - DEPTH + i);
    // the whole stream once more from a reset
    tri__kv_policy_reset(&r.pol);
    stream_run(&r, t, N, lb);
    cr_assert(memcmp(la, lb, sizeof(float) * (size_t)N * (size_t)r.V) == 0, "after a reset");
    free(la);
    free(lb);
    stream_rig_free(&r);
    tri_model_free(m);
}

// Evicting every 5 tokens past the window (TriForce's draft prefill, in intervals of 64): a token
// attends to the sinks, the window before its interval and the interval up to itself, which is
// the same whether the prompt comes in one call (steps of whole intervals) or token by token.
Test(streaming, evict_every_interval_same_however_batched) {
    enum { N = 90, E = 5 };
    tri_model *m = gen_model("stream-every", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    stream_rig one, each;
    stream_rig_init(&one, m, 4096, false, 0, E);
    stream_rig_init(&each, m, 4096, false, 0, E);
    // the steps one call takes: to the budget (8) in one, then one per interval [9, 14), [14, 19) ...
    int32_t len = 0, steps = 0;
    while (len < N) {
        int32_t lim = tri__kv_policy_step_limit_at(&one.pol, len), n = N - len < 16 ? N - len : 16;
        len += n < lim ? n : lim;
        steps++;
        if (len > 8) cr_assert((len - 9) % E == 0 || len == N, "a step ends at %d, inside an interval", len);
    }
    cr_assert_eq(steps, 1 + (N - 9 + E - 1) / E);
    const size_t bytes = sizeof(float) * (size_t)N * (size_t)one.V;
    float *la = malloc(bytes), *lb = malloc(bytes);
    cr_assert(la && lb);
    cr_assert_eq(tri__llama_forward_policy(&one.ll, &one.pol, t, N, TRI_LOGITS_ALL, la), TRI_STATUS_OK, "%s",
                 tri_last_error());
    stream_run(&each, t, N, lb);
    for (int i = 0; i < N; i++)
        cr_assert(memcmp(la + (int64_t)i * one.V, lb + (int64_t)i * one.V, sizeof(float) * (size_t)one.V) == 0,
                  "token %d: one call and token by token differ", i);
    // what a token attends to: for position 30 (interval [29, 34)) the sinks, 23 .. 28 and 29, 30
    tri__kv_policy_reset(&each.pol);
    stream_run(&each, t, 30, lb);
    int32_t qpos[1];
    cr_assert_eq(tri__kv_policy_begin(&each.pol, 1, &each.ll.rope, qpos), TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t want[] = {0, 1, 23, 24, 25, 26, 27, 28, 29, 30};
    cr_assert_eq(each.pol.step_kept + 1, 10);
    cr_assert_eq(qpos[0], 9);
    for (int i = 0; i < 10; i++) {
        int32_t row = want[i] < 2 ? want[i] : 2 + (want[i] - 2) % each.pol.ring_rows;
        cr_assert_eq(each.pol.gather[i], row, "view row %d: store row %d, want %d (position %d)", i,
                     each.pol.gather[i], row, want[i]);
    }
    tri__kv_policy_abort(&each.pol);
    free(la);
    free(lb);
    stream_rig_free(&one);
    stream_rig_free(&each);
    tri_model_free(m);
}

// The one-token step computed from backend memory (llama.h, tri__llama_step: the draft's step
// that a device records as a graph) gives the bits of the policy's own step, on the CPU backend,
// with every kind of store: every position (ring 0), a bounded ring that wraps many times, an
// eviction interval of 5, f16 and f32 rows. The prompt's first tokens come in one call of the
// policy's forward pass and the steps go on from there; a rollback into the steps and the stream
// again from there through the device step gives the same bits too.
Test(streaming, device_step_equals_policy_step) {
    enum { N = 200, P = 6, BACK = 12 };
    tri_model *m = gen_model("stream-devstep", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    struct {
        bool keep_all;
        int32_t evict_every;
        tri_dtype type;
    } cases[] = {{true, 0, TRI_DTYPE_F16}, {false, 0, TRI_DTYPE_F16}, {false, 5, TRI_DTYPE_F32}, {false, 0, TRI_DTYPE_F32}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 512);
        pp.budget = 8;
        pp.sink = 2;
        pp.keep_all = cases[ci].keep_all;
        pp.evict_every = cases[ci].evict_every;
        stream_rig a, b;
        model_rig_init(&a, m, &pp, cases[ci].type, 512, 16);
        model_rig_init(&b, m, &pp, cases[ci].type, 512, 16);
        cr_assert(tri__llama_step_supported(&b.ll, &b.pol));
        tri__llama_step step;
        cr_assert_eq(tri__llama_step_init(&step, &b.ll, &b.pol, true), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(step.view_rows, 8 + (cases[ci].evict_every > 1 ? cases[ci].evict_every : 1));
        const size_t bytes = sizeof(float) * (size_t)N * (size_t)a.V;
        float *la = malloc(bytes), *lb = malloc(bytes);
        cr_assert(la && lb);
        stream_run(&a, t, N, la);
        cr_assert_eq(tri__llama_forward_policy(&b.ll, &b.pol, t, P, TRI_LOGITS_ALL, lb), TRI_STATUS_OK, "%s",
                     tri_last_error());
        for (int32_t i = P; i < N; i++)
            cr_assert_eq(tri__llama_step_run(&step, t[i], lb + (int64_t)i * a.V), TRI_STATUS_OK, "case %zu token %d: %s",
                         ci, i, tri_last_error());
        for (int32_t i = 0; i < N; i++)
            cr_assert(memcmp(la + (int64_t)i * a.V, lb + (int64_t)i * a.V, sizeof(float) * (size_t)a.V) == 0,
                      "case %zu token %d: the device step's logits differ from the policy step's", ci, i);
        cr_assert_eq(tri__kv_policy_len(&b.pol), N);
        cr_assert_eq(step.n_steps, N - P);
        cr_assert_eq(step.n_replays, 0, "the CPU backend records no graph");
        cr_assert_eq(tri__kv_policy_truncate(&b.pol, N - BACK), TRI_STATUS_OK, "%s", tri_last_error());
        for (int32_t i = N - BACK; i < N; i++) {
            float *l = lb + (int64_t)i * a.V;
            cr_assert_eq(tri__llama_step_run(&step, t[i], l), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert(memcmp(la + (int64_t)i * a.V, l, sizeof(float) * (size_t)a.V) == 0,
                      "case %zu token %d after a rollback", ci, i);
        }
        tri__llama_step_free(&step);
        free(la);
        free(lb);
        stream_rig_free(&a);
        stream_rig_free(&b);
    }
    tri_model_free(m);
}

// ---- retrieval: the query history ----

// A forward pass over a retrieval policy built by hand: GQA (6 query heads over 2 KV heads), chunks
// of 4, a budget of 16 (chunk 0, a window of one chunk, two chosen), selections reading the last
// `queries` tokens' queries, steps of up to 64.
static void history_rig_init(stream_rig *r, tri_model *m, int32_t refresh, int32_t queries) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 128);
    pp.budget = 16;
    pp.chunk = 4;
    pp.window = 4;
    pp.queries = queries;
    pp.refresh = refresh;
    model_rig_init(r, m, &pp, TRI_DTYPE_F32, 128, 64);
}

// Every (layer, KV head) of a and b selected the same chunks at the same length.
static void same_selection(const tri__kv_policy *a, const tri__kv_policy *b, const char *what) {
    cr_assert(tri__kv_policy_selected_at(a) > 0, "%s: no selection", what);
    for (int32_t il = 0; il < a->n_layer; il++)
        for (int32_t h = 0; h < a->n_head_kv; h++) {
            int32_t ia[16], ib[16], na, nb;
            int32_t ca = tri__kv_policy_selection(a, il, h, ia, &na), cb = tri__kv_policy_selection(b, il, h, ib, &nb);
            cr_assert(ca == cb && na == nb, "%s: layer %d head %d: %d chunks at %d vs %d at %d", what, il, h, ca, na,
                      cb, nb);
            for (int32_t c = 0; c < ca; c++)
                cr_assert_eq(ia[c], ib[c], "%s: layer %d head %d: chunk %d is %d vs %d", what, il, h, c, ia[c], ib[c]);
        }
}

// Runs t[0 .. n) one call per token from position `from` of the policy, requesting a selection at
// the end of token `arm_at` (-1: none), the logits of each into l (n, V).
static void history_run(stream_rig *r, const int32_t *t, int32_t n, int32_t arm_at, float *l) {
    for (int32_t i = 0; i < n; i++) {
        if (i == arm_at) tri__kv_policy_request_refresh(&r->pol);
        cr_assert_eq(tri__llama_forward_policy(&r->ll, &r->pol, t + i, 1, TRI_LOGITS_LAST, l + (int64_t)i * r->V),
                     TRI_STATUS_OK, "token %d: %s", i, tri_last_error());
    }
}

// A selection reads the queries of the last 12 tokens the policy ran, whatever steps they came in:
// a prompt of 40 as one step and a question of 8 as another (the selection at 48 reads positions
// 36 .. 47, across both) selects the chunks that the same tokens fed one at a time select, and the
// logits are the same bits; so are the selections every 5 generated tokens after it, which read
// generated tokens only (one token per step: the last token's queries alone before the history).
// A rollback into the question's step makes the selection it would have made there (reading
// 32 .. 43 at 44), and one into the generated tokens drops their queries: running them again gives
// the same bits.
Test(retrieval, query_history_same_however_batched) {
    enum { P = 40, Q = 8, N = 70, CUT = 44, BACK = 57 };
    tri_model *m = gen_model("history", "--dtype f32 --heads 6 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i);
    stream_rig one, each;
    history_rig_init(&one, m, 5, 12);
    history_rig_init(&each, m, 5, 12);
    const size_t bytes = sizeof(float) * (size_t)N * (size_t)one.V;
    float *la = malloc(bytes), *lb = malloc(bytes);
    cr_assert(la && lb);
    cr_assert_eq(tri__llama_forward_policy(&one.ll, &one.pol, t, P, TRI_LOGITS_ALL, la), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri__kv_policy_request_refresh(&one.pol);
    cr_assert_eq(tri__llama_forward_policy(&one.ll, &one.pol, t + P, Q, TRI_LOGITS_ALL, la + (int64_t)P * one.V),
                 TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_selected_at(&one.pol), P + Q);
    history_run(&each, t, P + Q, P + Q - 1, lb);
    same_selection(&one.pol, &each.pol, "the question's selection");
    cr_assert(memcmp(la, lb, sizeof(float) * (size_t)(P + Q) * (size_t)one.V) == 0, "the prompt's logits differ");
    history_run(&one, t + P + Q, N - P - Q, -1, la + (int64_t)(P + Q) * one.V);
    history_run(&each, t + P + Q, N - P - Q, -1, lb + (int64_t)(P + Q) * one.V);
    cr_assert_eq(tri__kv_policy_selected_at(&one.pol), N - (N - P - Q) % 5);
    same_selection(&one.pol, &each.pol, "the last refresh");
    for (int i = P + Q; i < N; i++)
        cr_assert(memcmp(la + (int64_t)i * one.V, lb + (int64_t)i * one.V, sizeof(float) * (size_t)one.V) == 0,
                  "token %d: logits differ", i);

    // back into the generated tokens: their queries go, and running them again gives the same bits
    cr_assert_eq(tri__kv_policy_truncate(&each.pol, BACK), TRI_STATUS_OK, "%s", tri_last_error());
    history_run(&each, t + BACK, N - BACK, -1, lb + (int64_t)BACK * one.V);
    same_selection(&one.pol, &each.pol, "after a rollback to 57");
    for (int i = BACK; i < N; i++)
        cr_assert(memcmp(la + (int64_t)i * one.V, lb + (int64_t)i * one.V, sizeof(float) * (size_t)one.V) == 0,
                  "token %d after the rollback: logits differ", i);

    // back into the question's step (it was armed): the selection at 44, from positions 32 .. 43
    tri__kv_policy_reset(&one.pol);
    tri__kv_policy_reset(&each.pol);
    cr_assert_eq(tri__llama_forward_policy(&one.ll, &one.pol, t, P, TRI_LOGITS_NONE, NULL), TRI_STATUS_OK);
    tri__kv_policy_request_refresh(&one.pol);
    cr_assert_eq(tri__llama_forward_policy(&one.ll, &one.pol, t + P, Q, TRI_LOGITS_NONE, NULL), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_truncate(&one.pol, CUT), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_selected_at(&one.pol), CUT);
    history_run(&each, t, CUT, CUT - 1, lb);
    same_selection(&one.pol, &each.pol, "a rollback into the armed step");
    history_run(&one, t + CUT, N - CUT, -1, la + (int64_t)CUT * one.V);
    history_run(&each, t + CUT, N - CUT, -1, lb + (int64_t)CUT * one.V);
    same_selection(&one.pol, &each.pol, "after the rollback into the armed step");
    for (int i = CUT; i < N; i++)
        cr_assert(memcmp(la + (int64_t)i * one.V, lb + (int64_t)i * one.V, sizeof(float) * (size_t)one.V) == 0,
                  "token %d after the rollback into the step: logits differ", i);

    // the history matters here: the last token's queries alone select other chunks somewhere (else
    // this test could not tell a selection that reads the history from one that does not)
    stream_rig last;
    history_rig_init(&last, m, 5, 1);
    tri__kv_policy_reset(&each.pol);
    history_run(&each, t, P + Q, P + Q - 1, lb);
    history_run(&last, t, P + Q, P + Q - 1, lb);
    int differ = 0;
    for (int32_t il = 0; il < each.pol.n_layer; il++)
        for (int32_t h = 0; h < each.pol.n_head_kv; h++) {
            int32_t ia[16], ib[16];
            int32_t ca = tri__kv_policy_selection(&each.pol, il, h, ia, NULL);
            int32_t cb = tri__kv_policy_selection(&last.pol, il, h, ib, NULL);
            differ += ca != cb || memcmp(ia, ib, sizeof *ia * (size_t)ca) != 0;
        }
    cr_assert(differ > 0, "12 tokens' queries select what the last token's select");
    stream_rig_free(&last);
    free(la);
    free(lb);
    stream_rig_free(&one);
    stream_rig_free(&each);
    tri_model_free(m);
}

// H2O over a bounded store (budget 8, history 2, steps of 16: 64 rows for any length) keeps the
// positions a store of every position keeps and computes the same logits (to f32 rounding: its
// rows move, so its spans are cut elsewhere), through rollbacks after its rows moved.
Test(h2o, bounded_store_keeps_what_every_position_keeps) {
    enum { N = 300, BACK = 2 };
    tri_model *m = gen_model("h2o-bound", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = tok(i) ^ (i % 7);
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_H2O, 4096);
    pp.budget = 8;
    pp.history = 2;
    stream_rig all, small;
    pp.keep_all = true;
    policy_rig_init(&all, m, &pp, 4096);
    pp.keep_all = false;
    policy_rig_init(&small, m, &pp, 4096);
    cr_assert_eq(all.pol.own.capacity, 4096);
    cr_assert_eq(small.pol.own.capacity, 2 * 8 + 3 * 16, "store rows %d", small.pol.own.capacity);
    cr_assert_eq(tri__kv_policy_capacity(&small.pol), 4096);
    const int32_t V = all.V;
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    float *back = malloc(sizeof(float) * (size_t)BACK * (size_t)V);
    cr_assert(la && lb && back);
    int32_t pa[64], pb[64];
    for (int i = 0; i < N; i++) {
        cr_assert_eq(tri__llama_forward_policy(&all.ll, &all.pol, t + i, 1, TRI_LOGITS_LAST, la), TRI_STATUS_OK);
        cr_assert_eq(tri__llama_forward_policy(&small.ll, &small.pol, t + i, 1, TRI_LOGITS_LAST, lb), TRI_STATUS_OK,
                     "token %d: %s", i, tri_last_error());
        float mx = 0, diff = 0;
        for (int32_t x = 0; x < V; x++) {
            mx = fmaxf(mx, fabsf(la[x]));
            diff = fmaxf(diff, fabsf(la[x] - lb[x]));
        }
        cr_assert(diff <= 1e-4f * mx, "token %d: logits differ by %g (largest %g)", i, (double)diff, (double)mx);
        for (int32_t il = 0; il < 2; il++)
            for (int32_t h = 0; h < 2; h++) {
                int32_t na = tri__kv_policy_h2o_kept(&all.pol, il, h, pa);
                int32_t nb = tri__kv_policy_h2o_kept(&small.pol, il, h, pb);
                cr_assert(na == nb && memcmp(pa, pb, sizeof(int32_t) * (size_t)na) == 0,
                          "token %d, layer %d, head %d: kept positions differ", i, il, h);
            }
        if (i >= N - BACK) memcpy(back + (int64_t)(i - (N - BACK)) * V, lb, sizeof(float) * (size_t)V);
    }
    // back two steps (the history), after the rows moved many times, and the same tokens again
    cr_assert_eq(tri__kv_policy_truncate(&small.pol, N - BACK), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_policy_len(&small.pol), N - BACK);
    for (int i = N - BACK; i < N; i++) {
        cr_assert_eq(tri__llama_forward_policy(&small.ll, &small.pol, t + i, 1, TRI_LOGITS_LAST, lb), TRI_STATUS_OK,
                     "%s", tri_last_error());
        float mx = 0, diff = 0;
        const float *want = back + (int64_t)(i - (N - BACK)) * V;
        for (int32_t x = 0; x < V; x++) {
            mx = fmaxf(mx, fabsf(want[x]));
            diff = fmaxf(diff, fabsf(want[x] - lb[x]));
        }
        cr_assert(diff <= 1e-4f * mx, "token %d after the rollback: logits differ by %g", i, (double)diff);
    }
    for (int32_t il = 0; il < 2; il++)
        for (int32_t h = 0; h < 2; h++) {
            int32_t na = tri__kv_policy_h2o_kept(&all.pol, il, h, pa);
            int32_t nb = tri__kv_policy_h2o_kept(&small.pol, il, h, pb);
            cr_assert(na == nb && memcmp(pa, pb, sizeof(int32_t) * (size_t)na) == 0, "after the rollback: kept differ");
        }
    free(la);
    free(lb);
    free(back);
    stream_rig_free(&all);
    stream_rig_free(&small);
    tri_model_free(m);
}

// Bad parameters: a clear error naming the field, before anything is allocated.
Test(policy, bad_parameters) {
    tri_model *m = gen_model("bad", "--dtype f32");
    struct {
        tri_kv_policy kind;
        int32_t budget, chunk, sink, refresh;
        const char *needle;
    } cases[] = {
        {TRI_KV_POLICY_STREAMING, 100, 0, 100, 0, "sink 100"},
        {TRI_KV_POLICY_RETRIEVAL, 16, 3, 0, 0, "must divide the budget"},
        {TRI_KV_POLICY_RETRIEVAL, 16, 32, 0, 0, "must divide the budget"},
        {TRI_KV_POLICY_STREAMING, 16, 0, 16, 0, "sink 16"},
        {TRI_KV_POLICY_STREAMING, 16, 0, 40, 0, "sink 40"},
        {TRI_KV_POLICY_H2O, -1, 0, 0, 0, "kv_budget -1"},
        {TRI_KV_POLICY_RETRIEVAL, 16, 8, 0, -2, "kv_refresh -2"},
        {(tri_kv_policy)9, 16, 8, 0, 0, "unknown policy"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.kv_policy = cases[c].kind;
        sp.kv_budget = cases[c].budget;
        sp.kv_chunk = cases[c].chunk;
        sp.kv_sink = cases[c].sink;
        sp.kv_refresh = cases[c].refresh;
        tri_session *s = (tri_session *)1;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT, "case %zu accepted", c);
        cr_assert_null(s);
        cr_assert(strstr(tri_last_error(), cases[c].needle), "case %zu: '%s' lacks '%s'", c, tri_last_error(),
                  cases[c].needle);
    }
    // and at the policy level, chunk 0 is refused rather than defaulted
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, 64);
    pp.chunk = 0;
    cr_assert_eq(tri__kv_policy_check(&pp, 64), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "chunk size 0"));
    tri_model_free(m);
}
