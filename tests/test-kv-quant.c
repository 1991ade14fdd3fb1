// test-kv-quant.c - the quantized KV cache (kv_type q8_0 / q4_0).
//
// The quantizer against the gguf package's (bit for bit, tests/fixtures/make-kv-quant.py); the CPU
// attention reading quantized rows in place against the same attention over their dequantized
// f32 values; greedy decoding and every position's logits of a seeded model with a quantized cache
// against tests/reference/llama_ref.py run with --kv-quant (numpy, float64, every cache row
// rounded through gguf.quants), in memory and offloaded; and the refusals that name kv_type.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend.h"
#include "dtype.h"
#include "kv-policy.h"
#include "level.h"
#include "spec.h"
#include "test-util.h"
#include "triforce.h"

// ---- the quantizer ----

static void check_quantizer(tri_dtype type, const char *name) {
    char in_name[32], blk_name[32];
    snprintf(in_name, sizeof in_name, "%s.in", name);
    snprintf(blk_name, sizeof blk_name, "%s.blocks", name);
    size_t nx, nb;
    float *x = tt_read_file(tt_fixture("kv-quant", in_name), &nx);
    uint8_t *want = tt_read_file(tt_fixture("kv-quant", blk_name), &nb);
    int64_t n = (int64_t)(nx / sizeof(float)), bb = tri__dtype_block_bytes(type);
    cr_assert(n > 0 && n % TRI_QK == 0 && (int64_t)nb == n / TRI_QK * bb, "%s fixture sizes %zu, %zu", name, nx, nb);
    uint8_t *got = malloc(nb);
    cr_assert(tri__quantize_row(got, x, type, n));
    for (int64_t b = 0; b < n / TRI_QK; b++) {
        int at = 0;
        while (at < bb && got[b * bb + at] == want[b * bb + at]) at++;
        cr_assert(at == bb, "%s block %lld (first value %g): byte %d is %02x, gguf.quants.quantize's %02x", name,
                  (long long)b, (double)x[b * TRI_QK], at, got[b * bb + at], want[b * bb + at]);
    }
    free(got), free(x), free(want);
}

Test(kv_quant, q8_0_blocks_match_gguf_package) { check_quantizer(TRI_DTYPE_Q8_0, "q8_0"); }
Test(kv_quant, q4_0_blocks_match_gguf_package) { check_quantizer(TRI_DTYPE_Q4_0, "q4_0"); }

Test(kv_quant, names_and_other_types) {
    tri_dtype t;
    cr_assert(tri__kv_type_parse("q8_0", &t) && t == TRI_DTYPE_Q8_0);
    cr_assert(tri__kv_type_parse("q4_0", &t) && t == TRI_DTYPE_Q4_0);
    cr_assert(tri__kv_type_parse("f16", &t) && t == TRI_DTYPE_F16);
    cr_assert(!tri__kv_type_parse("q4_1", &t) && !tri__kv_type_parse("Q8_0", &t) && !tri__kv_type_parse(NULL, &t));
    float x[TRI_QK] = {1};
    uint8_t blk[64];
    cr_assert(!tri__quantize_row(blk, x, TRI_DTYPE_Q4_1, TRI_QK), "only the KV cache's two types");
}

// ---- chunk summaries of quantized keys (the retrieval index over a quantized cache) ----

// The fixture's layout (tests/fixtures/make-kv-quant.py): rows of MEAN_STRIDE values of the blocks,
// the first MEAN_ROWS of them, chunks of MEAN_CHUNK rows, the first MEAN_WIDTH values of a row.
enum { MEAN_STRIDE = 96, MEAN_ROWS = 112, MEAN_CHUNK = 8, MEAN_WIDTH = 80 };

// The CPU's chunk_mean op (and tri__chunk_mean under it) over the fixture's q8_0 / q4_0 blocks read
// as a cache's keys gives the bits of numpy's float64 means of gguf.quants.dequantize's values; a
// stride that would start rows inside a block is INVALID_ARGUMENT, a type of no KV cache
// UNSUPPORTED.
static void check_chunk_mean(tri_dtype type, const char *name) {
    tt_need_fixtures("kv-quant");
    char blk_name[32], mean_name[32];
    snprintf(blk_name, sizeof blk_name, "%s.blocks", name);
    snprintf(mean_name, sizeof mean_name, "%s.means", name);
    size_t nb, nm;
    uint8_t *blocks = tt_read_file(tt_fixture("kv-quant", blk_name), &nb);
    float *want = tt_read_file(tt_fixture("kv-quant", mean_name), &nm);
    enum { NC = MEAN_ROWS / MEAN_CHUNK };
    cr_assert(nm == sizeof(float) * NC * MEAN_WIDTH &&
                  nb >= (size_t)tri__dtype_row_bytes(type, (int64_t)MEAN_ROWS * MEAN_STRIDE),
              "%s fixture sizes %zu, %zu", name, nb, nm);
    float got[NC * MEAN_WIDTH], direct[NC * MEAN_WIDTH];
    tri__backend *be = NULL;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->chunk_mean(be, got, blocks, type, NC, MEAN_CHUNK, MEAN_WIDTH, MEAN_STRIDE), TRI_STATUS_OK,
                 "%s", tri_last_error());
    tri__chunk_mean(direct, blocks, type, NC, MEAN_CHUNK, MEAN_WIDTH, MEAN_STRIDE);
    for (int64_t i = 0; i < NC * MEAN_WIDTH; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0 && memcmp(&direct[i], &want[i], sizeof(float)) == 0,
                  "%s chunk %lld, column %lld: mean %.9g (direct %.9g), numpy's %.9g", name,
                  (long long)(i / MEAN_WIDTH), (long long)(i % MEAN_WIDTH), (double)got[i], (double)direct[i],
                  (double)want[i]);
    cr_assert_eq(be->ops->chunk_mean(be, got, blocks, type, NC, MEAN_CHUNK, MEAN_WIDTH, MEAN_STRIDE - 16),
                 TRI_STATUS_INVALID_ARGUMENT, "a stride of 80 starts rows inside blocks");
    cr_assert_eq(be->ops->chunk_mean(be, got, blocks, TRI_DTYPE_Q4_1, NC, MEAN_CHUNK, MEAN_WIDTH, MEAN_STRIDE),
                 TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "q4_1"), "%s", tri_last_error());
    tri__backend_free(be);
    free(blocks), free(want);
}

Test(kv_quant, q8_0_chunk_means_match_numpy) { check_chunk_mean(TRI_DTYPE_Q8_0, "q8_0"); }
Test(kv_quant, q4_0_chunk_means_match_numpy) { check_chunk_mean(TRI_DTYPE_Q4_0, "q4_0"); }

// ---- the CPU attention over quantized rows ----

// Attention over a view of q8_0 / q4_0 rows (two spans per head, the second with explicit
// positions; head offsets and stride in elements of whole blocks) gives the bits of the same
// attention over an f32 view of their dequantized values: the rows are read in place and nothing
// but the dequantization separates the two.
static void check_attention(tri_dtype type) {
    enum { NKV = 2, G = 3, HD = 64, N = 300, M = 5 };
    const int64_t stride = NKV * HD, row = tri__dtype_row_bytes(type, stride);
    float *kf = malloc(sizeof(float) * N * stride), *vf = malloc(sizeof(float) * N * stride);
    uint8_t *kq = malloc((size_t)(row * N)), *vq = malloc((size_t)(row * N));
    float *q = malloc(sizeof(float) * M * NKV * G * HD), *o1 = malloc(sizeof(float) * M * NKV * G * HD),
          *o2 = malloc(sizeof(float) * M * NKV * G * HD);
    uint64_t s = 12345;
    for (int64_t i = 0; i < N * stride; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        kf[i] = (float)((int64_t)(s >> 40) % 2001 - 1000) / 300.0f;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        vf[i] = (float)((int64_t)(s >> 40) % 2001 - 1000) / 500.0f;
    }
    for (int64_t i = 0; i < M * NKV * G * HD; i++) q[i] = sinf((float)i * 0.37f);
    for (int j = 0; j < N; j++) {
        cr_assert(tri__quantize_row(kq + j * row, kf + j * stride, type, stride));
        cr_assert(tri__quantize_row(vq + j * row, vf + j * stride, type, stride));
        tri__dequantize_row(kf + j * stride, kq + j * row, type, stride);  // the values the cache holds
        tri__dequantize_row(vf + j * stride, vq + j * row, type, stride);
    }
    int32_t pos2[40], q_pos[M] = {250, 299, 300, 301, 120};
    for (int j = 0; j < 40; j++) pos2[j] = 260 + j;  // rows 260 .. 299 as a span with positions
    tri__kv_span sq[2 * NKV], sf[2 * NKV];
    int32_t head_span[NKV + 1] = {0, 2, 4};
    for (int h = 0; h < NKV; h++) {
        sq[2 * h] = (tri__kv_span){.pos0 = 0, .n = 260, .k = kq + tri__dtype_row_bytes(type, h * HD),
                                   .v = vq + tri__dtype_row_bytes(type, h * HD), .stride = stride};
        sq[2 * h + 1] = (tri__kv_span){.n = 40, .k = kq + 260 * row + tri__dtype_row_bytes(type, h * HD),
                                       .v = vq + 260 * row + tri__dtype_row_bytes(type, h * HD), .stride = stride,
                                       .pos = pos2};
        sf[2 * h] = (tri__kv_span){.pos0 = 0, .n = 260, .k = kf + h * HD, .v = vf + h * HD, .stride = stride};
        sf[2 * h + 1] = (tri__kv_span){.n = 40, .k = kf + 260 * stride + h * HD, .v = vf + 260 * stride + h * HD,
                                       .stride = stride, .pos = pos2};
    }
    tri__kv_view vq_view = {type, NKV, sq, head_span, NULL, false, 0},
                 vf_view = {TRI_DTYPE_F32, NKV, sf, head_span, NULL, false, 0};
    for (int lvl = TRI_CPU_SIMD_SCALAR; lvl <= (int)tri__cpu_simd_detect(); lvl++) {
        tri__backend *be = NULL;
        cr_assert_eq(tri__backend_cpu_create(2, (tri__cpu_simd)lvl, &be), TRI_STATUS_OK, "%s", tri_last_error());
        for (int m = 1; m <= M; m += M - 1) {  // one query (chunk tasks) and a batch
            cr_assert_eq(be->ops->attention(be, o1, q, q_pos, m, NKV * G, HD, &vq_view, NULL), TRI_STATUS_OK, "%s",
                         tri_last_error());
            cr_assert_eq(be->ops->attention(be, o2, q, q_pos, m, NKV * G, HD, &vf_view, NULL), TRI_STATUS_OK, "%s",
                         tri_last_error());
            cr_assert(memcmp(o1, o2, sizeof(float) * (size_t)(m * NKV * G * HD)) == 0,
                      "%s attention at SIMD level %d, %d queries: not the f32 attention over its values",
                      tri_dtype_name(type), lvl, m);
        }
        // weight sums (H2O's scores, kv_type mixed's heavy hitters) over quantized rows: those of
        // their values in f32, within f32 rounding (the second pass recomputes each score)
        float ws[N * NKV], wf[N * NKV];
        cr_assert_eq(be->ops->attention(be, o1, q, q_pos, 1, NKV * G, HD, &vq_view, ws), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(be->ops->attention(be, o2, q, q_pos, 1, NKV * G, HD, &vf_view, wf), TRI_STATUS_OK, "%s",
                     tri_last_error());
        for (int i = 0; i < N * NKV; i++)
            cr_assert(fabsf(ws[i] - wf[i]) <= 1e-6f + 1e-5f * fabsf(wf[i]), "%s weight sum %d: %g, f32's %g",
                      tri_dtype_name(type), i, (double)ws[i], (double)wf[i]);
        tri__backend_free(be);
    }
    free(kf), free(vf), free(kq), free(vq), free(q), free(o1), free(o2);
}

// A view whose spans carry their own types (backend.h span_types): per head a span of q8_0 / q4_0
// rows and a span of f16 rows with explicit positions, as a retrieval draft cache's gathered chunks
// beside its ring, against the f32 attention over the values both hold.
static void check_mixed_attention(tri_dtype type) {
    enum { NKV = 2, G = 2, HD = 64, N = 200, NQ = 150, M = 4 };
    const int64_t stride = NKV * HD, row = tri__dtype_row_bytes(type, stride);
    float *kf = malloc(sizeof(float) * N * stride), *vf = malloc(sizeof(float) * N * stride);
    uint8_t *kq = malloc((size_t)(row * NQ)), *vq = malloc((size_t)(row * NQ));
    uint16_t *kh = malloc(sizeof(uint16_t) * (N - NQ) * stride), *vh = malloc(sizeof(uint16_t) * (N - NQ) * stride);
    float *q = malloc(sizeof(float) * M * NKV * G * HD), *o1 = malloc(sizeof(float) * M * NKV * G * HD),
          *o2 = malloc(sizeof(float) * M * NKV * G * HD);
    for (int64_t i = 0; i < N * stride; i++) kf[i] = sinf((float)i * 0.71f) * 2.5f, vf[i] = cosf((float)i * 0.29f);
    for (int64_t i = 0; i < M * NKV * G * HD; i++) q[i] = sinf((float)i * 0.37f);
    for (int j = 0; j < NQ; j++) {  // rows 0 .. NQ - 1 quantized, the rest f16: the values each holds
        cr_assert(tri__quantize_row(kq + j * row, kf + j * stride, type, stride));
        cr_assert(tri__quantize_row(vq + j * row, vf + j * stride, type, stride));
        tri__dequantize_row(kf + j * stride, kq + j * row, type, stride);
        tri__dequantize_row(vf + j * stride, vq + j * row, type, stride);
    }
    for (int64_t i = NQ * stride; i < N * stride; i++) {
        kh[i - NQ * stride] = tri__f32_to_f16(kf[i]), kf[i] = tri__f16_to_f32(kh[i - NQ * stride]);
        vh[i - NQ * stride] = tri__f32_to_f16(vf[i]), vf[i] = tri__f16_to_f32(vh[i - NQ * stride]);
    }
    int32_t pos2[N - NQ], q_pos[M] = {199, 120, 180, 200};
    for (int j = 0; j < N - NQ; j++) pos2[j] = NQ + j;
    tri__kv_span sm[2 * NKV], sf[2 * NKV];
    int32_t head_span[NKV + 1] = {0, 2, 4};
    for (int h = 0; h < NKV; h++) {
        sm[2 * h] = (tri__kv_span){.pos0 = 0, .n = NQ, .k = kq + tri__dtype_row_bytes(type, h * HD),
                                   .v = vq + tri__dtype_row_bytes(type, h * HD), .stride = stride, .type = type};
        sm[2 * h + 1] = (tri__kv_span){.n = N - NQ, .k = kh + h * HD, .v = vh + h * HD, .stride = stride,
                                       .pos = pos2, .type = TRI_DTYPE_F16};
        sf[2 * h] = (tri__kv_span){.pos0 = 0, .n = NQ, .k = kf + h * HD, .v = vf + h * HD, .stride = stride};
        sf[2 * h + 1] = (tri__kv_span){.n = N - NQ, .k = kf + NQ * stride + h * HD, .v = vf + NQ * stride + h * HD,
                                       .stride = stride, .pos = pos2};
    }
    // the view's own type is a decoy: with span_types only the spans' count
    tri__kv_view vm = {TRI_DTYPE_F32, NKV, sm, head_span, NULL, true, 0},
                 vf_view = {TRI_DTYPE_F32, NKV, sf, head_span, NULL, false, 0};
    tri__backend *be = NULL;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK, "%s", tri_last_error());
    for (int m = 1; m <= M; m += M - 1) {
        cr_assert_eq(be->ops->attention(be, o1, q, q_pos, m, NKV * G, HD, &vm, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(be->ops->attention(be, o2, q, q_pos, m, NKV * G, HD, &vf_view, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        for (int64_t i = 0; i < (int64_t)m * NKV * G * HD; i++)
            cr_assert(fabsf(o1[i] - o2[i]) <= 1e-5f * (1.0f + fabsf(o2[i])),
                      "%s + f16 spans, %d queries: output %lld is %g, the f32 attention over their values %g",
                      tri_dtype_name(type), m, (long long)i, (double)o1[i], (double)o2[i]);
    }
    sm[1].type = TRI_DTYPE_Q5_0;  // a span of a type the attention does not read is refused
    cr_assert_eq(be->ops->attention(be, o1, q, q_pos, 1, NKV * G, HD, &vm, NULL), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "q5_0"), "%s", tri_last_error());
    tri__backend_free(be);
    free(kf), free(vf), free(kq), free(vq), free(kh), free(vh), free(q), free(o1), free(o2);
}

Test(kv_quant, cpu_attention_reads_spans_of_their_own_types) {
    check_mixed_attention(TRI_DTYPE_Q8_0);
    check_mixed_attention(TRI_DTYPE_Q4_0);
}

Test(kv_quant, cpu_attention_q8_0_reads_rows_in_place) { check_attention(TRI_DTYPE_Q8_0); }
Test(kv_quant, cpu_attention_q4_0_reads_rows_in_place) { check_attention(TRI_DTYPE_Q4_0); }

// ---- the model with a quantized cache against the reference ----

#define N_PROMPT 20
#define N_GEN 10

static const int32_t prompt[N_PROMPT] = {17, 260, 3, 99, 42, 42, 301, 7, 150, 5, 77, 270, 8, 64, 200, 1, 33, 90, 4, 11};

static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

typedef struct ref_out {
    float *logits;  // (N_PROMPT, n_vocab)
    int32_t n_vocab;
    int32_t greedy[N_GEN];
} ref_out;

// llama_ref.py over the HF half of the model at hf, its cache quantized as kv_quant ("" none) with
// the keys' elements in order ("hf" or "gguf") while quantized.
static void reference_opts(ref_out *r, const char *hf, const char *kv_quant, const char *order, const char *tag,
                           const char *opts);
static void reference(ref_out *r, const char *hf, const char *kv_quant, const char *order, const char *tag) {
    reference_opts(r, hf, kv_quant, order, tag, "");
}

// The same with more options of llama_ref.py (opts: "--kv-mixed S,W --batch B").
static void reference_opts(ref_out *r, const char *hf, const char *kv_quant, const char *order, const char *tag,
                           const char *opts) {
    const char *py = tt_python("reference/llama_ref.py"), *src = getenv("TRI_TEST_SRC");
    cr_assert(py && src, "TRI_TEST_PYTHON, TRI_TEST_SRC: run through meson test");
    char name[128], out[4096], gout[4096], cmd[16384], toks[512];
    snprintf(name, sizeof name, "kvq-%s-%s-%s.logits", tag, *kv_quant ? kv_quant : "none", order);
    snprintf(out, sizeof out, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "kvq-%s-%s-%s.greedy", tag, *kv_quant ? kv_quant : "none", order);
    snprintf(gout, sizeof gout, "%s", tt_tmp(name));
    int len = 0;
    for (int i = 0; i < N_PROMPT; i++)
        len += snprintf(toks + len, sizeof toks - (size_t)len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/reference/llama_ref.py' --model '%s' --tokens %s --out '%s' --greedy %d --kv-quant-order %s "
             "%s%s %s > '%s'",
             py, src, hf, toks, out, N_GEN, order, *kv_quant ? "--kv-quant " : "", kv_quant, opts, gout);
    cr_assert_eq(run(cmd), 0, "reference failed: %s", cmd);
    size_t n;
    r->logits = tt_read_file(out, &n);
    cr_assert(n % (N_PROMPT * 4) == 0 && n > 0);
    r->n_vocab = (int32_t)(n / (N_PROMPT * 4));
    char *g = tt_read_file(gout, NULL), *p = g;
    for (int i = 0; i < N_GEN; i++) {
        while (*p && (*p < '0' || *p > '9')) p++;
        cr_assert(*p, "reference printed fewer than %d greedy ids: %s", N_GEN, g);
        r->greedy[i] = (int32_t)strtol(p, &p, 10);
    }
    free(g);
}

// Our logits of every prompt position (out, (N_PROMPT, n_vocab)) and greedy tokens with a cache of
// kv_type, its last `offloaded` layers in host memory and attended there in part (split).
static void ours(const char *gguf, tri_dtype kv_type, int32_t offloaded, float *logits, int32_t n_vocab,
                 int32_t *greedy, bool *on_cpu) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gguf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.kv_type = kv_type;
    sp.n_ctx = 64;
    sp.kv_layers_offloaded = offloaded;
    sp.kv_host_fraction = offloaded ? 0.5 : 0;  // and split: the host half reads the blocks in place
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    *on_cpu = strcmp(tri_session_device(s), "cpu") == 0;
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < N_PROMPT; i++)
        memcpy(logits + (int64_t)i * n_vocab, tri_session_logits(s, i), sizeof(float) * (size_t)n_vocab);
    tri_session_free(s);
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *w = greedy;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = N_GEN;
    gp.stop_at_eos = false;
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(w - greedy, N_GEN);
    tri_session_free(s);
    tri_model_free(m);
}

// Largest |ours - reference| over every position's logits, each row scaled by its spread.
static double max_diff(const float *got, const ref_out *r) {
    double worst = 0;
    for (int i = 0; i < N_PROMPT; i++) {
        const float *want = r->logits + (int64_t)i * r->n_vocab, *g = got + (int64_t)i * r->n_vocab;
        float lo = want[0], hi = want[0];
        for (int j = 0; j < r->n_vocab; j++) lo = fminf(lo, want[j]), hi = fmaxf(hi, want[j]);
        double scale = fmax(1.0, (double)(hi - lo));
        for (int j = 0; j < r->n_vocab; j++) worst = fmax(worst, fabs((double)g[j] - (double)want[j]) / scale);
    }
    return worst;
}

// f32 weights, so the cache's rounding is the only approximation besides f32 arithmetic: our
// q8_0 / q4_0 session is the reference model with that cache (greedy tokens equal, logits within
// f32 rounding: 2e-7 of the logits' spread measured), and measurably not the model without it.
// Offloading the cache to host memory, with split attention, gives the same bits (on the CPU; on
// a device the same tokens and logits as close to the reference). Blocks hold a key's
// elements in the order of the file's rows: the HF directory's rope halves, the GGUF's adjacent
// pairs (llama.cpp's permutation), each against the reference quantizing in that order.
static void check_file(tri_dtype type, const char *tag, const char *path, const char *order, const char *hf) {
    ref_out rq, rn;
    reference(&rq, hf, tri_dtype_name(type), order, tag);
    reference(&rn, hf, "", "hf", tag);
    int32_t nv = rq.n_vocab, g[N_GEN], g_off[N_GEN];
    float *l = malloc(sizeof(float) * (size_t)N_PROMPT * (size_t)nv);
    float *l_off = malloc(sizeof(float) * (size_t)N_PROMPT * (size_t)nv);
    bool cpu;
    ours(path, type, 0, l, nv, g, &cpu);
    ours(path, type, 2, l_off, nv, g_off, &cpu);
    double dq = max_diff(l, &rq), dn = max_diff(l, &rn);
    cr_log_info("%s (%s order): logits vs the reference with a %s cache %.2e, without %.2e", tag, order,
                tri_dtype_name(type), dq, dn);
    for (int i = 0; i < N_GEN; i++)
        cr_assert_eq(g[i], rq.greedy[i], "%s, %s cache: greedy token %d: %d, reference with a %s cache %d", path,
                     tri_dtype_name(type), i, g[i], tri_dtype_name(type), rq.greedy[i]);
    // (on a device, the default one in an emulated build, the split's host half is the CPU's
    // kernel: other rounding than the device's attention, so the offloaded logits are only close)
    const bool same =
        cpu ? memcmp(l, l_off, sizeof(float) * (size_t)N_PROMPT * (size_t)nv) == 0 : max_diff(l_off, &rq) <= 1e-5;
    cr_assert(memcmp(g, g_off, sizeof g) == 0 && same, "%s: the offloaded cache gives other %s", tri_dtype_name(type),
              cpu ? "bits" : "logits");
    cr_assert(dq <= 1e-5, "%s: logits %.3e from the reference with a %s cache", path, dq, tri_dtype_name(type));
    cr_assert(dn > 4 * dq, "%s: the %s cache should be measurably nearer its own reference (%.2e) than the "
              "unquantized one (%.2e)", path, tri_dtype_name(type), dq, dn);
    free(l), free(l_off), free(rq.logits), free(rn.logits);
}

static void check_model(tri_dtype type, const char *tag, const char *opts) {
    char gguf[4096], hf[4096];
    snprintf(gguf, sizeof gguf, "%s", tt_gen_model(tag, opts));
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    check_file(type, tag, hf, "hf", hf);
    check_file(type, tag, gguf, "gguf", hf);
}

Test(kv_quant, q8_0_cache_is_the_reference_with_a_q8_0_cache, .timeout = TT_TIMEOUT(120)) {
    tt_need_fixtures("kv-quant");
    check_model(TRI_DTYPE_Q8_0, "kvq8", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 3");
}

Test(kv_quant, q4_0_cache_is_the_reference_with_a_q4_0_cache, .timeout = TT_TIMEOUT(120)) {
    tt_need_fixtures("kv-quant");
    check_model(TRI_DTYPE_Q4_0, "kvq4", "--dtype f32 --heads 4 --kv-heads 4 --head-dim 64 --layers 3");
}

// ---- kv_type mixed: f16 sinks and window, q4_0 rows between ----

static void expect_refused(const tri_model *m, const tri_session_params *sp, const char *want);

// Our prompt logits (passes of 4 tokens) and greedy tokens with kv_type mixed: 2 sinks and a window
// of 4 in f16 (kv_budget 6), or with plain kv_type type when not mixed.
static void ours_mixed_heavy(const char *gguf, tri_dtype type, int32_t heavy, float *logits, int32_t n_vocab,
                             int32_t *greedy);
static void ours_mixed(const char *gguf, tri_dtype type, float *logits, int32_t n_vocab, int32_t *greedy) {
    ours_mixed_heavy(gguf, type, 0, logits, n_vocab, greedy);
}

// The same with `heavy` heavy hitters per layer and KV head kept in f16 as well.
static void ours_mixed_heavy(const char *gguf, tri_dtype type, int32_t heavy, float *logits, int32_t n_vocab,
                             int32_t *greedy) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gguf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.kv_type = type;
    sp.n_ctx = 64;
    sp.n_batch = 4;
    if (type == TRI_DTYPE_KV_MIXED) sp.kv_sink = 2, sp.kv_budget = 6, sp.kv_mixed_heavy = heavy;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, true), TRI_STATUS_OK, "%s", tri_last_error());
    for (int i = 0; i < N_PROMPT; i++)
        memcpy(logits + (int64_t)i * n_vocab, tri_session_logits(s, i), sizeof(float) * (size_t)n_vocab);
    tri_session_free(s);
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *w = greedy;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = N_GEN;
    gp.stop_at_eos = false;
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri_session_free(s);
    tri_model_free(m);
}

// kv_type mixed is the reference model whose cache holds every row in q4_0 and the sinks and the
// recent window before each pass in f16 as well (llama_ref.py --kv-mixed 2,4, the prompt in passes
// of 4 as ours): logits within f32 rounding, greedy tokens equal; and measurably neither the
// model with an f16-rounded cache nor the one with a q4_0 cache.
Test(kv_quant, mixed_cache_is_the_reference_with_f16_sinks_and_window, .timeout = TT_TIMEOUT(120)) {
    tt_need_fixtures("kv-quant");
    char gguf[4096], hf[4096];
    snprintf(gguf, sizeof gguf, "%s", tt_gen_model("kvqm", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 "
                                                          "--layers 3"));
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    ref_out rm, r4;
    reference_opts(&rm, hf, "", "gguf", "kvqm", "--kv-mixed 2,4 --batch 4");
    reference_opts(&r4, hf, "q4_0", "gguf", "kvqm", "--batch 4");
    int32_t nv = rm.n_vocab, g[N_GEN], g16[N_GEN];
    float *l = malloc(sizeof(float) * (size_t)N_PROMPT * (size_t)nv);
    float *l16 = malloc(sizeof(float) * (size_t)N_PROMPT * (size_t)nv);
    ours_mixed(gguf, TRI_DTYPE_KV_MIXED, l, nv, g);
    ours_mixed(gguf, TRI_DTYPE_F16, l16, nv, g16);
    double dm = max_diff(l, &rm), d4 = max_diff(l, &r4), d16 = 0;
    for (int64_t i = 0; i < (int64_t)N_PROMPT * nv; i++) d16 = fmax(d16, fabs((double)l[i] - (double)l16[i]));
    cr_log_info("mixed: logits vs the mixed reference %.2e, vs q4_0's %.2e, vs our f16 cache %.2e", dm, d4, d16);
    for (int i = 0; i < N_GEN; i++)
        cr_assert_eq(g[i], rm.greedy[i], "mixed cache: greedy token %d: %d, the reference's %d", i, g[i], rm.greedy[i]);
    cr_assert(dm <= 1e-5, "mixed: logits %.3e from the reference with a mixed cache", dm);
    cr_assert(d4 > 4 * dm && d16 > 4 * dm, "mixed: should be measurably nearer its own reference (%.2e) than "
              "q4_0's (%.2e) and f16's (%.2e)", dm, d4, d16);
    free(l), free(l16), free(rm.logits), free(r4.logits);
}

// MiKV's heavy hitters: with kv_mixed_heavy 3, each layer and KV head keeps the 3 positions past the
// window that received the most attention so far (H2O's scores; the pool's rule in
// llama_ref.py heavy_attention) in f16 as well: the reference model with that rule (--kv-mixed
// 2,4,3), logits within f32 rounding and greedy tokens equal, and measurably not plain mixed.
Test(kv_quant, mixed_heavy_hitters_are_the_reference, .timeout = TT_TIMEOUT(120)) {
    tt_need_fixtures("kv-quant");
    char gguf[4096], hf[4096];
    snprintf(gguf, sizeof gguf, "%s", tt_gen_model("kvqmh", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 "
                                                          "--layers 3"));
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    ref_out rh, rm;
    reference_opts(&rh, hf, "", "gguf", "kvqmh", "--kv-mixed 2,4,3 --batch 4");
    reference_opts(&rm, hf, "", "gguf", "kvqmh0", "--kv-mixed 2,4 --batch 4");  // (files of its own)
    int32_t nv = rh.n_vocab, g[N_GEN];
    float *l = malloc(sizeof(float) * (size_t)N_PROMPT * (size_t)nv);
    ours_mixed_heavy(gguf, TRI_DTYPE_KV_MIXED, 3, l, nv, g);
    double dh = max_diff(l, &rh), dm = max_diff(l, &rm);
    cr_log_info("mixed with heavy hitters: logits vs its reference %.2e, vs plain mixed's %.2e", dh, dm);
    for (int i = 0; i < N_GEN; i++)
        cr_assert_eq(g[i], rh.greedy[i], "heavy hitters: greedy token %d: %d, the reference's %d", i, g[i],
                     rh.greedy[i]);
    // (within 1e-4 of the spread, not 1e-5: the pool's f16 rows are a span of their own, whose tiles
    // the attention folds apart; measured: with a pool of every position past the window, 2e-5
    // from the same f16 rows read as one span)
    cr_assert(dh <= 1e-4, "heavy hitters: logits %.3e from the reference", dh);
    cr_assert(dm > 100 * dh, "heavy hitters: should be far nearer their own reference (%.2e) than plain "
              "mixed's (%.2e)", dh, dm);
    // no rollback, no speculative target
    tri_model *m;
    cr_assert_eq(tri_model_load(gguf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64, sp.kv_type = TRI_DTYPE_KV_MIXED, sp.kv_sink = 2, sp.kv_budget = 6, sp.kv_mixed_heavy = 3;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, false), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_truncate(s, N_PROMPT - 2), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "kv_mixed_heavy 3"), "%s", tri_last_error());
    tri_session_free(s);
    tri_spec *spec = NULL;
    tri_spec_params pp = tri_spec_default_params();
    pp.mode = TRI_SPEC_MODE_DRAFT, pp.drafter = TRI_SPEC_DRAFTER_NGRAM, pp.ngram_n = 3;
    cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_UNSUPPORTED);
    cr_assert(!spec && strstr(tri_last_error(), "kv_mixed_heavy 3"), "%s", tri_last_error());
    sp.kv_type = TRI_DTYPE_Q4_0;
    expect_refused(m, &sp, "kv_mixed_heavy 3");
    tri_model_free(m);
    free(l), free(rh.logits), free(rm.logits);
}

// ---- kv_type mixed as a speculative target ----

// The f16 rows keep what a rollback needs: a step of max_step and `rollback` tokens more below the
// length (whenever their buffer last moved), not a rollback past what they dropped.
Test(kv_quant, mixed_ring_keeps_a_rollback_of_a_round) {
    tri__backend *be = NULL;
    cr_assert_eq(tri__backend_cpu_create(1, tri__cpu_simd_detect(), &be), TRI_STATUS_OK, "%s", tri_last_error());
    enum { NKV = 1, HD = 32, STEP = 4, ROLL = 11, RECENT = 6 };
    for (int32_t roll = 0; roll <= ROLL; roll += ROLL) {
        tri__kv_policy_params kp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, 256);
        kp.sink = 2, kp.recent = RECENT, kp.rollback = roll;
        tri__kv_policy p;
        cr_assert_eq(tri__kv_policy_init(&p, &kp, be, TRI_DTYPE_KV_MIXED, 1, NKV, NKV, HD, 256, STEP), TRI_STATUS_OK,
                     "%s", tri_last_error());
        float *k, *v, *q;
        cr_assert_eq(be->ops->alloc(be, sizeof(float) * STEP * HD, (void **)&k), TRI_STATUS_OK);
        cr_assert_eq(be->ops->alloc(be, sizeof(float) * STEP * HD, (void **)&v), TRI_STATUS_OK);
        cr_assert_eq(be->ops->alloc(be, sizeof(float) * STEP * HD, (void **)&q), TRI_STATUS_OK);
        for (int i = 0; i < STEP * HD; i++) k[i] = v[i] = q[i] = (float)(i % 7) * 0.25f;
        tri__rope rope;
        memset(&rope, 0, sizeof rope);
        int32_t q_pos[STEP];
        for (int step = 0; step < 20; step++) {  // 80 positions
            const tri__kv_view *view;
            float *ws;
            cr_assert_eq(tri__kv_policy_begin(&p, STEP, &rope, q_pos), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(tri__kv_policy_layer(&p, 0, q, k, v, &view, &ws), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(tri__kv_policy_commit(&p), TRI_STATUS_OK, "%s", tri_last_error());
        }
        const int32_t keep = STEP + (roll ? roll : STEP);  // rows below the length still held
        cr_assert_eq(tri__kv_policy_truncate(&p, 30), TRI_STATUS_UNSUPPORTED, "rollback %d", roll);
        cr_assert(strstr(tri_last_error(), "kv_type mixed: cannot roll back"), "%s", tri_last_error());
        cr_assert_eq(tri__kv_policy_truncate(&p, 80 - keep), TRI_STATUS_OK, "rollback %d: %s", roll, tri_last_error());
        cr_assert_eq(tri__kv_policy_len(&p), 80 - keep);
        be->ops->free(be, k), be->ops->free(be, v), be->ops->free(be, q);
        tri__kv_policy_free(&p);
    }
    tri__backend_free(be);
}

typedef struct mixed_collect {
    int32_t *out;
    int32_t n;
} mixed_collect;

static bool mixed_on_token(int32_t tok, void *user) {
    mixed_collect *c = user;
    c->out[c->n++] = tok;
    return true;
}

// A session or speculative engine's parameters: kv_type mixed with 2 sinks and a window of 6 in
// f16 (kv_budget 8), steps of 4.
static tri_session_params mixed_session(void) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 160;
    sp.n_batch = 4;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_KV_MIXED;
    sp.kv_sink = 2;
    sp.kv_budget = 8;
    return sp;
}

// Each query of a mixed cache reads its own window, whatever pass it is in: the verification of a
// speculative round's drafts (in steps of 4, rolled back where rejected), a token tree's nodes
// moved into place. So greedy output in every mode the mixed cache serves (none; draft with a
// model, the target itself, the target's first layer, n-grams; chains and trees) equals plain greedy decoding of the
// same mixed cache token for token, and the plain decoding itself is that of the reference
// (llama_ref.py --kv-mixed: mixed_cache_is_the_reference_with_f16_sinks_and_window).
Test(kv_quant, mixed_spec_greedy_equals_plain_mixed_decoding, .timeout = TT_TIMEOUT(120)) {
    tri_model *target, *draft;
    cr_assert_eq(tri_model_load(tt_gen_model("kvqm-spec-t", "--seed 21 --heads 4 --kv-heads 2 --head-dim 32 "
                                                            "--layers 3"), NULL, &target),
                 TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_model_load(tt_gen_model("kvqm-spec-d", "--seed 22 --layers 1 --embd 32 --ff 64 --heads 1 "
                                                            "--kv-heads 1 --head-dim 32"), NULL, &draft),
                 TRI_STATUS_OK, "%s", tri_last_error());
    enum { NP = 48, NG = 40 };
    int32_t prompt2[NP], want[NG], want16[NG], got[NG];
    for (int i = 0; i < NP; i++) prompt2[i] = i % 8 < 5 ? 40 + (i % 8) : (i * 37) % 250 + 3;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    for (int kind = 0; kind < 2; kind++) {  // the mixed cache, and f16 to tell them apart
        tri_session_params sp = mixed_session();
        if (kind) sp.kv_type = TRI_DTYPE_F16, sp.kv_sink = 0, sp.kv_budget = 0;
        tri_session *s;
        cr_assert_eq(tri_session_create(target, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        mixed_collect c = {kind ? want16 : want, 0};
        cr_assert_eq(tri_generate(s, prompt2, NP, &gp, mixed_on_token, &c, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(c.n, NG);
        tri_session_free(s);
    }
    // the same bits whatever the steps (passes of 4, of 3, one token at a time): each query's window
    // is one run of f16 rows, wherever the buffer that holds them moved
    const int32_t V = target->config.n_vocab;
    float *lg[3];
    for (int b = 0; b < 3; b++) {
        tri_session_params sp = mixed_session();
        sp.n_batch = b == 0 ? 4 : b == 1 ? 3 : 1;
        tri_session *s;
        cr_assert_eq(tri_session_create(target, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_eval(s, prompt2, NP, true), TRI_STATUS_OK, "%s", tri_last_error());
        lg[b] = malloc(sizeof(float) * (size_t)NP * (size_t)V);
        for (int i = 0; i < NP; i++)
            memcpy(lg[b] + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
        tri_session_free(s);
    }
    for (int b = 1; b < 3; b++)
        cr_assert(memcmp(lg[0], lg[b], sizeof(float) * (size_t)NP * (size_t)V) == 0,
                  "mixed: the prompt's logits in passes of %d differ from those in passes of 4", b == 1 ? 3 : 1);
    for (int b = 0; b < 3; b++) free(lg[b]);
    int differ = 0;
    for (int i = 0; i < NG; i++) differ += want[i] != want16[i];
    cr_log_info("mixed spec: plain mixed greedy differs from f16's at %d of %d tokens", differ, NG);
    static const int32_t first[] = {0};
    static const int32_t gammas[][2] = {{2, 6}, {1, 3}};
    static const int32_t nodes[] = {0, 10, 40};
    int runs = 0;
    for (int mode = TRI_SPEC_MODE_NONE; mode <= TRI_SPEC_MODE_DRAFT; mode++)
        for (int drafter = 0; drafter < (mode ? 4 : 1); drafter++)
            for (int gi = 0; gi < 2; gi++)
                for (int ni = 0; ni < (mode ? 3 : 1); ni++) {
                    tri_spec_params p = tri_spec_default_params();
                    p.mode = (tri_spec_mode)mode;
                    p.drafter = drafter == 0 || drafter == 3 ? TRI_SPEC_DRAFTER_MODEL
                                : drafter == 1 ? TRI_SPEC_DRAFTER_LAYERS : TRI_SPEC_DRAFTER_NGRAM;
                    p.draft_model = drafter == 0 ? draft : drafter == 3 ? target : NULL;
                    p.draft_layers = drafter == 1 ? first : NULL;
                    p.n_draft_layers = drafter == 1 ? 1 : 0;
                    p.ngram_n = drafter == 2 ? 3 : 0;
                    p.gamma1 = gammas[gi][0];
                    p.gamma2 = gammas[gi][1];
                    p.tree_nodes = nodes[ni];
                    tri_session_params sp = mixed_session();
                    tri_spec *s;
                    cr_assert_eq(tri_spec_create(target, &sp, &p, &s), TRI_STATUS_OK, "%s", tri_last_error());
                    mixed_collect c = {got, 0};
                    tri_spec_stats st;
                    cr_assert_eq(tri_generate_spec(s, prompt2, NP, &gp, mixed_on_token, &c, &st), TRI_STATUS_OK,
                                 "mode %d drafter %d gamma %d/%d tree %d: %s", mode, drafter, p.gamma1, p.gamma2,
                                 p.tree_nodes, tri_last_error());
                    cr_assert_eq(c.n, NG);
                    for (int i = 0; i < NG; i++)
                        cr_assert_eq(got[i], want[i], "mode %d drafter %d gamma %d/%d tree %d: token %d is %d, plain "
                                     "mixed decoding's %d", mode, drafter, p.gamma1, p.gamma2, p.tree_nodes, i,
                                     got[i], want[i]);
                    // the target drafting over its own cache: passes that keep several tokens (the
                    // seeded draft model's are rejected: passes rolled back by all their drafts)
                    if (drafter == 3)
                        cr_assert(st.n_l3_verify <= NG / 2, "target as draft: %lld L3 passes for %d tokens",
                                  (long long)st.n_l3_verify, NG);
                    tri_spec_free(s);
                    runs++;
                }
    cr_log_info("mixed spec: %d configurations equal plain mixed decoding", runs);
    // the window must hold a tree's depth; the retrieval modes borrow f16 or f32 rows
    tri_session_params sp = mixed_session();
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    p.ngram_n = 3;
    p.gamma2 = 7;
    p.tree_nodes = 10;
    tri_spec *s = NULL;
    cr_assert_eq(tri_spec_create(target, &sp, &p, &s), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(!s && strstr(tri_last_error(), "must hold gamma2 7"), "%s", tri_last_error());
    p.mode = TRI_SPEC_MODE_RETRIEVAL;
    p.tree_nodes = 0;
    cr_assert_eq(tri_spec_create(target, &sp, &p, &s), TRI_STATUS_UNSUPPORTED);
    cr_assert(!s && strstr(tri_last_error(), "kv_type mixed"), "%s", tri_last_error());
    tri_model_free(draft);
    tri_model_free(target);
}

// kv_type mixed offloaded: the q4_0 rows of the last layers in host memory, streamed through the
// device every pass (here the CPU's buffers, as the offloaded full cache's tests run), the f16 sinks
// and window in backend memory. The same bits as the mixed cache in memory, prompt and decoding,
// plain and as a speculative target; the bytes streamed are q4_0's: 36 / 128 of an f16 cache's
// (head_dim 32 x 2 KV heads: two blocks of 18 bytes per row against 128 bytes), row for row.
Test(kv_quant, mixed_offloaded_streams_q4_0_rows, .timeout = TT_TIMEOUT(120)) {
    tri_model *target;
    cr_assert_eq(tri_model_load(tt_gen_model("kvqm-off-t", "--seed 21 --heads 4 --kv-heads 2 --head-dim 32 "
                                                            "--layers 3"), NULL, &target),
                 TRI_STATUS_OK, "%s", tri_last_error());
    enum { NP = 48, NG = 24 };
    int32_t prompt2[NP], tok[3][NG];
    for (int i = 0; i < NP; i++) prompt2[i] = i % 8 < 5 ? 40 + (i % 8) : (i * 37) % 250 + 3;
    const int32_t V = target->config.n_vocab;
    float *lg[2];
    uint64_t up[3], down[3];
    // 0: mixed in memory, 1: mixed with every layer offloaded, 2: f16 offloaded alike
    for (int k = 0; k < 3; k++) {
        tri_session_params sp = mixed_session();
        sp.kv_layers_offloaded = k ? 3 : 0;
        if (k == 2) sp.kv_type = TRI_DTYPE_F16;
        tri_session *s;
        cr_assert_eq(tri_session_create(target, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        if (k < 2) {
            cr_assert_eq(tri_session_eval(s, prompt2, NP, true), TRI_STATUS_OK, "%s", tri_last_error());
            lg[k] = malloc(sizeof(float) * (size_t)NP * (size_t)V);
            for (int i = 0; i < NP; i++)
                memcpy(lg[k] + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
            tri_session_reset(s);
        }
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = NG;
        gp.stop_at_eos = false;
        mixed_collect c = {tok[k], 0};
        tri_generate_stats st;
        cr_assert_eq(tri_generate(s, prompt2, NP, &gp, mixed_on_token, &c, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        up[k] = st.kv_bytes_up, down[k] = st.kv_bytes_down;
        tri_session_free(s);
    }
    cr_assert(memcmp(lg[0], lg[1], sizeof(float) * (size_t)NP * (size_t)V) == 0,
              "mixed offloaded: the prompt's logits differ from the mixed cache in memory");
    cr_assert(memcmp(tok[0], tok[1], sizeof tok[0]) == 0, "mixed offloaded: other greedy tokens");
    cr_log_info("mixed offloaded: %llu bytes up, %llu down while decoding; f16 %llu, %llu",
                (unsigned long long)up[1], (unsigned long long)down[1], (unsigned long long)up[2],
                (unsigned long long)down[2]);
    cr_assert(up[0] == 0 && up[1] > 0 && up[1] * 128 == up[2] * 36 && down[1] * 128 == down[2] * 36,
              "mixed offloaded: %llu bytes up and %llu down, f16's %llu and %llu", (unsigned long long)up[1],
              (unsigned long long)down[1], (unsigned long long)up[2], (unsigned long long)down[2]);
    // as a speculative target, offloaded: the same tokens as plain mixed decoding
    tri_session_params sp = mixed_session();
    sp.kv_layers_offloaded = 2;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    p.ngram_n = 3;
    p.tree_nodes = 10;
    tri_spec *spec;
    cr_assert_eq(tri_spec_create(target, &sp, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    int32_t got[NG];
    mixed_collect c = {got, 0};
    cr_assert_eq(tri_generate_spec(spec, prompt2, NP, &gp, mixed_on_token, &c, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert(memcmp(got, tok[0], sizeof got) == 0, "mixed offloaded target: other greedy tokens");
    tri_spec_free(spec);
    free(lg[0]), free(lg[1]);
    tri_model_free(target);
}

// Split attention over an offloaded mixed cache (kv_host_fraction): the device attends the streamed
// rows below split_dev, the host the q4_0 rows past it where they lie and the f16 window copied down:
// the same bits as the mixed cache in memory, with the device's part a whole chunk of 1,024 rows
// (host fraction 0.05 over 1,100 positions) or nothing (fraction 1).
Test(kv_quant, mixed_split_attention_equals_in_memory, .timeout = TT_TIMEOUT(120)) {
    tri_model *target;
    cr_assert_eq(tri_model_load(tt_gen_model("kvqm-split", "--seed 23 --heads 4 --kv-heads 2 --head-dim 32 "
                                                           "--layers 3 --ctx 2048"), NULL, &target),
                 TRI_STATUS_OK, "%s", tri_last_error());
    enum { NP = 1100, NE = 8, NG = 12 };
    int32_t *prompt2 = malloc(sizeof(int32_t) * NP), extra[NE], tok[3][NG];
    for (int i = 0; i < NP; i++) prompt2[i] = i % 19 < 12 ? (i % 19) * 13 + 5 : (i * 41) % 250 + 3;
    for (int i = 0; i < NE; i++) extra[i] = 7 + 11 * i;
    const int32_t V = target->config.n_vocab;
    float *lg[3];
    const double frac[3] = {0, 0.05, 1.0};
    uint64_t host[3];
    for (int k = 0; k < 3; k++) {
        tri_session_params sp = mixed_session();
        sp.n_ctx = 1200;
        sp.kv_layers_offloaded = k ? 3 : 0;
        sp.kv_host_fraction = frac[k];
        sp.kv_host_threads = 1;
        tri_session *s;
        cr_assert_eq(tri_session_create(target, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_eval(s, prompt2, NP, false), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_eval(s, extra, NE, true), TRI_STATUS_OK, "%s", tri_last_error());
        lg[k] = malloc(sizeof(float) * NE * (size_t)V);
        for (int i = 0; i < NE; i++)
            memcpy(lg[k] + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
        tri_session_reset(s);
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = NG;
        gp.stop_at_eos = false;
        mixed_collect c = {tok[k], 0};
        tri_generate_stats st;
        cr_assert_eq(tri_generate(s, prompt2, NP, &gp, mixed_on_token, &c, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        host[k] = st.kv_bytes_host;
        tri_session_free(s);
    }
    for (int k = 1; k < 3; k++) {
        cr_assert(memcmp(lg[0], lg[k], sizeof(float) * NE * (size_t)V) == 0,
                  "mixed split (host fraction %g): logits differ from the cache in memory", frac[k]);
        cr_assert(memcmp(tok[0], tok[k], sizeof tok[0]) == 0, "mixed split (host fraction %g): other tokens", frac[k]);
        // decoding: each of 3 layers reads the q4_0 rows past the device's part in place (K and V,
        // two blocks of 18 bytes a row), every token, whatever else
        cr_assert(host[k] >= (uint64_t)NG * 3 * 2 * 36 * (k == 1 ? NP - 1024 - 8 : NP - 8) / 2,
                  "host fraction %g: %llu bytes read on the host", frac[k], (unsigned long long)host[k]);
    }
    cr_log_info("mixed split: %llu and %llu bytes read in place on the host while decoding",
                (unsigned long long)host[1], (unsigned long long)host[2]);
    for (int k = 0; k < 3; k++) free(lg[k]);
    free(prompt2);
    tri_model_free(target);
}

// ---- refusals ----

static void expect_refused(const tri_model *m, const tri_session_params *sp, const char *want) {
    tri_session *s = NULL;
    tri_status st = tri_session_create(m, sp, &s);
    cr_assert(st != TRI_STATUS_OK && !s, "session created; want an error about %s", want);
    cr_assert(strstr(tri_last_error(), want), "error '%s' does not say '%s'", tri_last_error(), want);
}

Test(kv_quant, refusals_name_kv_type) {
    const char *ok = tt_gen_model("kvq-refuse32", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 2");
    tri_model *m;
    cr_assert_eq(tri_model_load(ok, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 256;
    sp.kv_type = TRI_DTYPE_Q4_1;
    expect_refused(m, &sp, "kv_type q4_1");
    sp.kv_type = (tri_dtype)77;
    expect_refused(m, &sp, "kv_type");
    sp.kv_type = TRI_DTYPE_Q8_0;
    sp.kv_policy = TRI_KV_POLICY_STREAMING;
    sp.kv_budget = 64;
    expect_refused(m, &sp, "kv_type q8_0");
    sp.kv_policy = TRI_KV_POLICY_H2O;
    expect_refused(m, &sp, "kv_type q8_0");
    sp.kv_policy = TRI_KV_POLICY_FULL;
    sp.kv_budget = 0;
    tri_spec *spec = NULL;
    tri_spec_params pp = tri_spec_default_params();
    pp.mode = TRI_SPEC_MODE_RETRIEVAL;
    cr_assert_eq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK, "%s", tri_last_error());  // a q8_0 target
    tri_spec_free(spec);
    spec = NULL;
    tri_session *s = NULL;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());  // the full cache: fine
    tri_session_free(s);
    // kv_type mixed: the full cache in backend memory, sinks inside its f16 tokens, no speculative
    // levels, no prompt cache file
    sp.kv_type = TRI_DTYPE_KV_MIXED;
    sp.kv_policy = TRI_KV_POLICY_H2O;
    sp.kv_budget = 64;
    expect_refused(m, &sp, "kv_type mixed");
    sp.kv_policy = TRI_KV_POLICY_FULL;
    sp.kv_sink = 64;
    expect_refused(m, &sp, "kv_sink 64 must be < kv_budget 64");
    sp.kv_sink = 0;
    cr_assert_neq(tri_spec_create(m, &sp, &pp, &spec), TRI_STATUS_OK);
    cr_assert(!spec && strstr(tri_last_error(), "kv_type mixed"), "%s", tri_last_error());
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_session_eval(s, prompt, N_PROMPT, false), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_neq(tri_session_save_prompt(s, tt_tmp("kvq-mixed.cache"), prompt, N_PROMPT, NULL), TRI_STATUS_OK);
    cr_assert(strstr(tri_last_error(), "kv_type mixed"), "%s", tri_last_error());
    tri_session_free(s);
    tri_model_free(m);

    const char *odd = tt_gen_model("kvq-refuse16", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    cr_assert_eq(tri_model_load(odd, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.kv_type = TRI_DTYPE_Q4_0;
    expect_refused(m, &sp, "kv_type q4_0");
    expect_refused(m, &sp, "head_dim 16");
    tri_model_free(m);
}

// ---- the planner ----

// Llama2-7B-128K at 127K tokens: K and V of 32 x 128 dims per layer and token are 16 KiB in f16,
// 8.5 KiB in q8_0 (34 bytes per 32 values), 4.5 KiB in q4_0 (18 per 32): the whole cache 68.2,
// 36.2 and 19.2 GB. On a 64 GB host beside one 24 GiB GPU the f16 cache does not fit, q8_0 does,
// and an autoregressive pass moves the offloaded layers' bytes in proportion.
Test(kv_quant, planner_counts_the_type) {
    tri_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32, c.head_dim = 128, c.n_ff = 11008;
    c.n_vocab = 32000, c.n_ctx_train = 131072;
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    const tri_dtype types[3] = {TRI_DTYPE_F16, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    const uint64_t per_tok[3] = {16384, 8704, 4608}, n_ctx = 127 * 1024;
    tri_plan pl[3];
    for (int t = 0; t < 3; t++) {
        tri_plan_params p = tri_plan_default_params();
        p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
        p.n_ctx = (int32_t)n_ctx;
        p.kv_type = types[t];
        cr_assert_eq(tri_plan_compute(&m, &p, &pl[t]), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(pl[t].kv_layer_bytes, per_tok[t] * n_ctx, "%s: %llu bytes per layer", tri_dtype_name(types[t]),
                     (unsigned long long)pl[t].kv_layer_bytes);
        char text[8192];
        cr_assert_eq(tri_plan_format(&pl[t], text, sizeof text, NULL), TRI_STATUS_OK);
        cr_assert(strstr(text, tri_dtype_name(types[t])), "the plan names its KV type: %s", text);
        // TriForce on a 64 GB host (the retrieval cache and draft take the card: no layer's KV stays)
        p.mode = TRI_PLAN_MODE_TRIFORCE;
        p.host_mem_bytes = 64000000000u;
        tri_plan h;
        tri_status st = tri_plan_compute(&m, &p, &h);
        if (t == 0) cr_assert_neq(st, TRI_STATUS_OK, "68 GB of f16 KV in a 64 GB host");
        else cr_assert_eq(st, TRI_STATUS_OK, "%s KV in a 64 GB host: %s", tri_dtype_name(types[t]), tri_last_error());
    }
    // more layers' KV stay on the card, and a pass streams fewer bytes
    cr_assert(pl[1].on_chip >= pl[0].on_chip && pl[2].on_chip >= pl[1].on_chip);
    cr_assert(pl[1].pcie_bytes_l3 < pl[0].pcie_bytes_l3 * 0.55 && pl[2].pcie_bytes_l3 < pl[1].pcie_bytes_l3 * 0.55);

    c.head_dim = 48, c.n_embd = 48 * 32;  // not whole blocks of 32
    m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = 4096;
    p.kv_type = TRI_DTYPE_Q8_0;
    cr_assert_neq(tri_plan_compute(&m, &p, &pl[0]), TRI_STATUS_OK);
    cr_assert(strstr(tri_last_error(), "kv_type q8_0"), "%s", tri_last_error());
    p.kv_type = TRI_DTYPE_Q4_1;
    cr_assert_neq(tri_plan_compute(&m, &p, &pl[0]), TRI_STATUS_OK);
}

// ---- quantized draft caches (draft_kv_type) ----

// Whether L2's gathered rows (spec's level 2, a retrieval cache over L3's f16 rows) hold type's
// blocks of L3's rows: the last layer's first selected chunk of each KV head (an offloaded layer
// when L3 offloads any), keys and values, against L3's row quantized here. Returns the rows
// compared (0: no selection).
static int check_l2_gathered(tri_spec *spec, tri_dtype type) {
    tri__level *l2 = tri__spec_level(spec, 2), *l3 = tri__spec_level(spec, 3);
    cr_assert(l2 && l3 && l3->pol.kv->type == TRI_DTYPE_F16);
    if (tri__kv_policy_selected_at(&l2->pol) < 0) return 0;
    const int32_t hd = l2->model->config.head_dim, C = l2->pol.p.chunk, il = l2->model->config.n_layer - 1;
    int compared = 0;
    for (int32_t h = 0; h < l2->pol.n_head_kv; h++) {
        int32_t ids[64], n_sel;
        if (tri__kv_policy_selection(&l2->pol, il, h, ids, &n_sel) <= 0) continue;
        for (int which = 0; which < 2; which++) {
            uint16_t r3[64];
            uint8_t got[64], want[64];
            float x[64];
            cr_assert(hd <= 64);
            cr_assert(tri__kv_policy_peek(&l3->pol, il, h, ids[0] * C, which, r3));
            for (int32_t d = 0; d < hd; d++) x[d] = tri__f16_to_f32(r3[d]);
            cr_assert(tri__quantize_row(want, x, type, hd));
            cr_assert(tri__kv_policy_peek(&l2->pol, il, h, ids[0] * C, which, got));
            cr_assert(memcmp(got, want, (size_t)tri__dtype_row_bytes(type, hd)) == 0,
                      "L2's gathered %s row of position %d (head %d) is not L3's row quantized",
                      which ? "value" : "key", ids[0] * C, h);
            compared++;
        }
    }
    return compared;
}

// The draft caches in q8_0 or q4_0: L1's (a StreamingLLM window of 24 over a 96-token context, or
// the full cache) and L2's gathered chunks (a retrieval cache of 32 tokens over L3's f16 rows).
// L3 verifies every token, so greedy speculative decoding gives plain decoding's tokens in every
// mode with a draft cache (draft, retrieval, triforce), whatever the draft caches hold; L2's rows
// are checked to be L3's quantized, so that the test sees the quantized cache in use.
Test(kv_quant, quantized_draft_caches_keep_greedy_output, .timeout = TT_TIMEOUT(120)) {
    const char *path = tt_gen_model("kvq-draft", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 3");
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    enum { N_CTX = 96, GEN = 48 };
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = N_CTX;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = GEN;
    gp.stop_at_eos = false;
    int32_t want[GEN], got[GEN], *w = want;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri_session_free(s);
    static const int32_t layer0[1] = {0};
    const tri_dtype types[2] = {TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    const tri_spec_mode modes[3] = {TRI_SPEC_MODE_DRAFT, TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_MODE_TRIFORCE};
    int gathered = 0, gathered_offloaded = 0;
    for (int t = 0; t < 2; t++)
        for (int mi = 0; mi < 4; mi++)  // the last: triforce with L3's last two layers offloaded
            for (int window = 24; window <= N_CTX; window += N_CTX - 24) {
                tri_spec_params p = tri_spec_default_params();
                tri_session_params spo = sp;
                spo.kv_layers_offloaded = mi == 3 ? 2 : 0;
                p.mode = modes[mi < 3 ? mi : 2];
                p.drafter = TRI_SPEC_DRAFTER_LAYERS;
                p.draft_layers = layer0;
                p.n_draft_layers = 1;
                p.gamma1 = 2;
                p.gamma2 = 4;
                p.budget = 32;
                p.chunk = 8;
                p.draft_window = window;
                p.draft_sink = 4;
                p.draft_kv_type = types[t];
                tri_spec *spec;
                cr_assert_eq(tri_spec_create(m, &spo, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
                w = got;
                tri_spec_stats st;
                cr_assert_eq(tri_generate_spec(spec, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, &st), TRI_STATUS_OK,
                             "%s", tri_last_error());
                cr_assert_eq(w - got, GEN);
                for (int i = 0; i < GEN; i++)
                    cr_assert_eq(got[i], want[i], "%s draft cache, mode %d%s, window %d: token %d is %d, plain %d",
                                 tri_dtype_name(types[t]), (int)p.mode, mi == 3 ? " offloaded" : "", window, i, got[i],
                                 want[i]);
                cr_assert(st.l1_proposed > 0 || st.l2_proposed > 0);
                if (p.mode != TRI_SPEC_MODE_DRAFT) {
                    int n = check_l2_gathered(spec, types[t]);
                    gathered += n;
                    if (mi == 3) gathered_offloaded += n;
                }
                tri_spec_free(spec);
            }
    cr_assert(gathered > 0 && gathered_offloaded > 0, "no L2 selection was made%s: the quantized gather went untested",
              gathered ? " over offloaded rows" : "");
    // refusals name the field: an unknown type, and a draft whose head_dim is not whole blocks
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_LAYERS;
    p.draft_layers = layer0;
    p.n_draft_layers = 1;
    p.draft_kv_type = TRI_DTYPE_Q5_0;
    tri_spec *spec = NULL;
    cr_assert_neq(tri_spec_create(m, &sp, &p, &spec), TRI_STATUS_OK);
    cr_assert(!spec && strstr(tri_last_error(), "draft_kv_type q5_0"), "%s", tri_last_error());
    tri_model_free(m);
    path = tt_gen_model("kvq-draft16", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 16 --layers 2");
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    p.draft_kv_type = TRI_DTYPE_Q8_0;
    cr_assert_neq(tri_spec_create(m, &sp, &p, &spec), TRI_STATUS_OK);
    cr_assert(!spec && strstr(tri_last_error(), "draft_kv_type q8_0") && strstr(tri_last_error(), "head_dim 16"), "%s",
              tri_last_error());
    tri_model_free(m);
}
