// test-cpu-backend.c - every CPU op against a naive scalar reference written here (double
// accumulation), at each SIMD level this machine has; RoPE tables against numpy code that follows
// HF transformers (tests/fixtures/make-rope.py; those tests skip in a build without the reference
// Python packages).
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "cpu-kernels.h"
#include "cpu-pool.h"
#include "dtype.h"
#include "rope.h"
#include "test-blocks.h"
#include "test-util.h"

// The references promote f32 data to double on purpose, everywhere.
#pragma GCC diagnostic ignored "-Wdouble-promotion"

// ---- helpers ----

static tri__backend *make_backend(tri__cpu_simd simd) {
    tri__backend *be = NULL;
    cr_assert_eq(tri__backend_cpu_create(2, simd, &be), TRI_STATUS_OK, "%s", tri_last_error());
    return be;
}

// Runs body once per SIMD level the machine has, with `be` and `lvl` in scope.
#define FOR_EACH_LEVEL(body)                                                          \
    for (int lvl = TRI_CPU_SIMD_SCALAR; lvl <= (int)tri__cpu_simd_detect(); lvl++) { \
        tri__backend *be = make_backend((tri__cpu_simd)lvl);                          \
        body;                                                                         \
        tri__backend_free(be);                                                        \
    }

// ---- matmul ----

// y = x @ W^T against the double reference on the decoded weights. Tolerance: float weights
// 1e-5 of sum |x w| (f32 accumulation); quantized weights also the error of quantizing x to 8
// bits per block of 32: at most half a step (max|x_b| / 254) per element, times sum |w| of the block.
static void check_matmul(tri__backend *be, int lvl, tri_dtype t, int64_t m, int64_t n, int64_t k) {
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *w = malloc(sizeof(float) * (size_t)(n * k));
    float *y = malloc(sizeof(float) * (size_t)(m * n));
    fill(x, m * k, 2.0f);
    fill(w, n * k, 0.5f);
    for (int64_t i = 0; i < k; i += 13) x[i] *= 20;  // outliers, as real activations have
    void *wq = encode(w, n, k, t);
    cr_assert_eq(be->ops->matmul(be, y, x, wq, t, m, n, k), TRI_STATUS_OK, "%s", tri_last_error());
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < n; r++) {
            double ref = 0, mag = 0, qerr = 0;
            for (int64_t b = 0; b < (k + 31) / 32; b++) {
                double amax = 0, wsum = 0;
                for (int64_t j = b * 32; j < k && j < b * 32 + 32; j++) {
                    double wv = decode(wq, t, k, r, j);
                    ref += (double)x[i * k + j] * wv;
                    mag += fabs((double)x[i * k + j] * wv);
                    amax = fmax(amax, fabs((double)x[i * k + j]));
                    wsum += fabs(wv);
                }
                qerr += amax / 254 * wsum;
            }
            double tol = 1e-5 * mag + 1e-6 + (tri__dtype_is_quantized(t) ? 1.01 * qerr : 0);
            cr_assert(fabs(y[i * n + r] - ref) <= tol, "%s %s m=%lld n=%lld k=%lld y[%lld,%lld] = %g, ref %g, tol %g",
                      tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(t), (long long)m, (long long)n,
                      (long long)k, (long long)i, (long long)r, (double)y[i * n + r], ref, tol);
        }
    free(x);
    free(w);
    free(y);
    free(wq);
}

Test(cpu_backend, matmul_float_weights) {
    static const int64_t ks[] = {1, 7, 33, 100, 257};
    static const int64_t ms[] = {1, 3, 70};  // 70: more than one tile of x rows
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_BF16; t++)
            for (size_t a = 0; a < 5; a++)
                for (size_t b = 0; b < 3; b++) check_matmul(be, lvl, t, ms[b], 19, ks[a]);
    });
}

Test(cpu_backend, matmul_quantized_weights) {
    static const int64_t ks[] = {32, 96, 160, 4096};  // odd block counts hit the AVX-512 tails
    static const int64_t ms[] = {1, 5, 70};
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_Q8_0; t < TRI_DTYPE_COUNT; t++)
            for (size_t a = 0; a < 4; a++)
                for (size_t b = 0; b < 3; b++)
                    if (ks[a] % tri__dtype_block_elems(t) == 0) check_matmul(be, lvl, t, ms[b], 37, ks[a]);
    });
}

// The K-quants and IQ4_XS: one super-block, three (their pairs of blocks of 32 cross no
// super-block), eight.
Test(cpu_backend, matmul_k_quant_weights) {
    static const int64_t ks[] = {256, 768, 2048};
    static const int64_t ms[] = {1, 5, 70};
    static const tri_dtype types[] = {TRI_DTYPE_Q2_K, TRI_DTYPE_Q3_K, TRI_DTYPE_Q4_K,
                                      TRI_DTYPE_Q5_K, TRI_DTYPE_Q6_K, TRI_DTYPE_IQ4_XS};
    FOR_EACH_LEVEL({
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 3; b++) check_matmul(be, lvl, types[ti], ms[b], 37, ks[a]);
    });
}

// Every tile shape: m and n around the tile sizes (4 rows of x by up to 4 rows of W) and the
// 16-row tasks, k with a partial SIMD vector (float) or an odd number of blocks (quantized).
Test(cpu_backend, matmul_tile_edges) {
    static const int64_t ns[] = {1, 2, 3, 4, 5, 7, 17, 33};
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++)
            for (int64_t m = 1; m <= 9; m++)
                for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                    check_matmul(be, lvl, t, m, ns[a],
                                 !tri__dtype_is_quantized(t) ? 67 : tri__dtype_block_elems(t) == 32 ? 96 : 256);
    });
}

// The SIMD quantizers of x give the scalar one's bytes exactly: same scale, same rounding (ties
// to even), same sums.
Test(cpu_backend, quantize_x_identical_at_every_level) {
    enum { K = 256 };
    float x[K];
    fill(x, K, 3.0f);
    x[5] = 0;
    for (int i = 32; i < 64; i++) x[i] = 0;                  // an all-zero block
    for (int i = 64; i < 96; i++) x[i] = (float)(i - 80) * 0.5f;  // ties: amax 7.5, steps of 127/15
    x[100] = -1e4f;                                          // an outlier
    int8_t q0[K], q[K];
    float d0[K / 4], s0[K / 4], d[K / 4], s[K / 4];
    tri__cpu_quantize_row(q0, d0, s0, x, K);
    const tri__cpu_kernels *levels[4] = {&tri__cpu_kernels_scalar, NULL, NULL, NULL};
#if TRI_CPU_X86
    levels[1] = &tri__cpu_kernels_avx2, levels[2] = &tri__cpu_kernels_avx512, levels[3] = &tri__cpu_kernels_avx512_vnni;
#endif
    for (int lvl = TRI_CPU_SIMD_SCALAR; lvl <= (int)tri__cpu_simd_detect(); lvl++) {
        levels[lvl]->quantize(q, d, s, x, K);
        cr_assert_arr_eq(q, q0, sizeof q, "%s", tri__cpu_simd_name((tri__cpu_simd)lvl));
        cr_assert_arr_eq(d, d0, sizeof d, "%s", tri__cpu_simd_name((tri__cpu_simd)lvl));
        cr_assert_arr_eq(s, s0, sizeof s, "%s", tri__cpu_simd_name((tri__cpu_simd)lvl));
    }
}

Test(cpu_backend, matmul_q8_0_extreme_weights) {
    // -128 is a legal Q8_0 value that no quantizer writes; the integer path must not overflow.
    int64_t k = 64;
    tri__block_q8_0 w[2];
    float x[64], y;
    for (int b = 0; b < 2; b++) {
        w[b].d = tri__f32_to_f16(0.5f);
        for (int i = 0; i < 32; i++) w[b].qs[i] = -128;
    }
    for (int i = 0; i < 64; i++) x[i] = -1.0f;
    FOR_EACH_LEVEL({
        cr_assert_eq(be->ops->matmul(be, &y, x, w, TRI_DTYPE_Q8_0, 1, 1, k), TRI_STATUS_OK);
        cr_assert_float_eq(y, 64 * 64.0f, 1e-3f, "%s: %g", tri__cpu_simd_name((tri__cpu_simd)lvl), (double)y);
    });
}

// ---- batch invariance ----
//
// Speculative decoding verifies a draft in one batched pass and promises plain decoding's greedy
// tokens, so a token's row must come out bit for bit the same whether it is computed alone (m = 1)
// or anywhere in a batch, at 1 thread or 2. Each level is compared with itself only.

// Runs body once per SIMD level the machine has, with be[0] (1 thread), be[1] (2 threads) and
// `lvl` in scope.
#define FOR_EACH_LEVEL_1_2_THREADS(body)                                                                     \
    for (int lvl = TRI_CPU_SIMD_SCALAR; lvl <= (int)tri__cpu_simd_detect(); lvl++) {                        \
        tri__backend *be[2] = {NULL, NULL};                                                                  \
        for (int nt = 0; nt < 2; nt++)                                                                       \
            cr_assert_eq(tri__backend_cpu_create(nt + 1, (tri__cpu_simd)lvl, &be[nt]), TRI_STATUS_OK, "%s", \
                         tri_last_error());                                                                  \
        body;                                                                                                \
        tri__backend_free(be[0]);                                                                            \
        tri__backend_free(be[1]);                                                                            \
    }

// Batches of m = 1 .. 17 and 70 rows (more than one pass of 64 rows of x), taken at different
// offsets of 70 rows of x, against each row multiplied alone on 1 thread.
static void check_matmul_rows_alone(tri__backend *const be[2], int lvl, tri_dtype t, int64_t n, int64_t k) {
    enum { M = 70 };
    float *x = malloc(sizeof(float) * (size_t)(M * k)), *w = malloc(sizeof(float) * (size_t)(n * k));
    float *ref = malloc(sizeof(float) * (size_t)(M * n)), *y = malloc(sizeof(float) * (size_t)(M * n));
    fill(x, M * k, 2.0f);
    fill(w, n * k, 0.5f);
    for (int64_t i = 0; i < M * k; i += 13) x[i] *= 20;
    void *wq = encode(w, n, k, t);
    for (int64_t i = 0; i < M; i++)
        cr_assert_eq(be[0]->ops->matmul(be[0], ref + i * n, x + i * k, wq, t, 1, n, k), TRI_STATUS_OK);
    for (int nt = 0; nt < 2; nt++)
        for (int64_t m = 1; m <= M; m = m < 17 ? m + 1 : m == 17 ? M : M + 1) {
            int64_t o = 3 * m % (M - m + 1);  // the batch is rows o .. o + m - 1
            cr_assert_eq(be[nt]->ops->matmul(be[nt], y, x + o * k, wq, t, m, n, k), TRI_STATUS_OK);
            for (int64_t i = 0; i < m; i++)
                cr_assert(memcmp(y + i * n, ref + (o + i) * n, sizeof(float) * (size_t)n) == 0,
                          "%s %s, %d threads, n %lld k %lld: row %lld of a batch of %lld differs from the row alone",
                          tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(t), nt + 1, (long long)n,
                          (long long)k, (long long)i, (long long)m);
        }
    free(x), free(w), free(ref), free(y), free(wq);
}

Test(cpu_backend, matmul_rows_batch_invariant_every_level) {
    FOR_EACH_LEVEL_1_2_THREADS({
        for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++) {
            bool quant = tri__dtype_is_quantized(t);
            bool kq = tri__dtype_block_elems(t) == 256;
            // serial; then n split over the threads even for m = 1 (n k / 8 >= 32768)
            check_matmul_rows_alone(be, lvl, t, 37, kq ? 256 : quant ? 96 : 67);
            check_matmul_rows_alone(be, lvl, t, 300, kq ? 1024 : quant ? 1056 : 1003);
        }
    });
}

Test(cpu_backend, matmul_rejects_partial_blocks) {
    tri__backend *be = make_backend(TRI_CPU_SIMD_SCALAR);
    float x[40] = {0}, y[1];
    uint8_t w[64] = {0};
    cr_assert_eq(be->ops->matmul(be, y, x, w, TRI_DTYPE_Q4_0, 1, 1, 40), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->matmul(be, y, x, w, TRI_DTYPE_Q4_K, 1, 1, 32), TRI_STATUS_INVALID_ARGUMENT,
                 "a block of 32 is not a super-block");
    tri__backend_free(be);
}

// ---- the thread pool ----

static void pool_count(void *arg, int64_t c) {
    __atomic_fetch_add((int *)arg + c, 1, __ATOMIC_RELAXED);
}

// Thousands of back-to-back jobs of every size: each chunk runs exactly once, whichever thread
// claims it, and no job sees a chunk of the previous one.
Test(cpu_backend, pool_runs_every_chunk_once) {
    for (int nt = 1; nt <= 4; nt++) {
        tri__cpu_pool *p;
        cr_assert_eq(tri__cpu_pool_create(nt, &p), TRI_STATUS_OK);
        static int counts[257];
        for (int job = 0; job < 3000; job++) {
            int64_t n = job % 257;
            memset(counts, 0, sizeof counts);
            tri__cpu_pool_run(p, pool_count, counts, n);
            for (int64_t c = 0; c < 257; c++)
                cr_assert_eq(counts[c], c < n ? 1 : 0, "threads %d job %d chunk %lld", nt, job, (long long)c);
        }
        tri__cpu_pool_free(p);
    }
    tri__cpu_pool_free(NULL);
}

// Callers on several threads share one acquired pool: each job still runs each of its chunks
// exactly once (the callers take turns); the same CPUs give the same pool.
typedef struct pool_caller {
    tri__cpu_pool *p;
    int counts[257];
    int bad;
} pool_caller;

static void *pool_caller_run(void *arg) {
    pool_caller *c = arg;
    for (int job = 0; job < 800; job++) {
        int64_t n = (job * 7) % 257;
        memset(c->counts, 0, sizeof c->counts);
        tri__cpu_pool_run(c->p, pool_count, c->counts, n);
        for (int64_t k = 0; k < 257; k++) c->bad += c->counts[k] != (k < n ? 1 : 0);
    }
    return NULL;
}

Test(cpu_backend, shared_pool_serves_concurrent_callers) {
    tri__cpu_pool *a, *b;
    cr_assert_eq(tri__cpu_pool_acquire(&a), TRI_STATUS_OK);
    cr_assert_eq(tri__cpu_pool_acquire(&b), TRI_STATUS_OK);
    cr_assert_eq(a, b, "the same CPUs must give the same pool");
    static pool_caller callers[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        callers[i].p = a;
        cr_assert_eq(pthread_create(&th[i], NULL, pool_caller_run, &callers[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(callers[i].bad, 0, "caller %d: %d chunks run other than once", i, callers[i].bad);
    tri__cpu_pool_release(b);
    tri__cpu_pool_release(a);
    tri__cpu_pool_release(NULL);
}

// run_max(1) runs every chunk on the calling thread.
static void pool_note_thread(void *arg, int64_t c) { ((pthread_t *)arg)[c] = pthread_self(); }

Test(cpu_backend, pool_run_max_one_is_the_caller) {
    tri__cpu_pool *p;
    cr_assert_eq(tri__cpu_pool_create(4, &p), TRI_STATUS_OK);
    pthread_t who[64];
    tri__cpu_pool_run_max(p, 1, pool_note_thread, who, 64);
    for (int c = 0; c < 64; c++) cr_assert(pthread_equal(who[c], pthread_self()), "chunk %d on a worker", c);
    tri__cpu_pool_free(p);
}

// ---- get_rows, convert, rmsnorm, swiglu, add ----

Test(cpu_backend, get_rows_every_type) {
    int64_t rows = 9, n = 256;  // one super-block of the K-quants, 8 blocks of the others
    float w[9 * 256], out[4 * 256];
    fill(w, rows * n, 3.0f);
    int32_t ids[4] = {8, 0, 3, 3};
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++) {
        void *e = encode(w, rows, n, t);
        cr_assert_eq(be->ops->get_rows(be, out, e, t, rows, n, ids, 4), TRI_STATUS_OK);
        for (int i = 0; i < 4; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = decode(e, t, n, ids[i], j);
                cr_assert(fabs(out[i * n + j] - ref) <= 1e-6 * fabs(ref), "%s [%d,%lld] %g vs %g", tri_dtype_name(t), i,
                          (long long)j, (double)out[i * n + j], ref);
            }
        free(e);
    }
    int32_t bad = 9;
    cr_assert_eq(be->ops->get_rows(be, out, w, TRI_DTYPE_F32, rows, n, &bad, 1), TRI_STATUS_INVALID_ARGUMENT);
    tri__backend_free(be);
}

Test(cpu_backend, gather_rows_by_byte_offsets) {
    // 6 source rows of 12 bytes; dst row i is the 12 bytes at offsets[i] (unaligned ones too)
    unsigned char src[80], dst[5 * 12];
    for (int i = 0; i < 80; i++) src[i] = (unsigned char)(i * 7 + 1);
    const int64_t off[5] = {60, 0, 13, 60, 36};
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    cr_assert_eq(be->ops->gather(be, dst, src, off, 5, 12), TRI_STATUS_OK);
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 12; b++)
            cr_assert_eq(dst[i * 12 + b], (unsigned char)((off[i] + b) * 7 + 1), "row %d byte %d", i, b);
    const int64_t bad = -4;
    cr_assert_eq(be->ops->gather(be, dst, src, &bad, 1, 12), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->gather(be, dst, src, off, 1, 0), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->gather(be, dst, src, off, 0, 12), TRI_STATUS_OK);
    tri__backend_free(be);
}

// The mean of each chunk of rows, against the definition summed here: f16 and f32 rows, a width
// below the stride, a chunk of 1, extreme halves (subnormal, the largest, infinities, NaN).
Test(cpu_backend, chunk_mean_of_rows) {
    enum { CH = 3, NC = 5, W = 70, STRIDE = 75 };
    static float xf[CH * NC * STRIDE];
    static uint16_t xh[CH * NC * STRIDE];
    for (int i = 0; i < CH * NC * STRIDE; i++) {
        xf[i] = (float)((i * 7919) % 2001 - 1000) / 37.0f;
        xh[i] = tri__f32_to_f16(xf[i]);
    }
    xh[0] = 0x0001, xh[STRIDE] = 0x0003, xh[2 * STRIDE] = 0x7bff;  // chunk 0, column 0
    xh[1] = 0x7c00;                                                  // +inf in column 1
    xh[2] = 0x7c01;                                                  // NaN in column 2
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    float out[NC * W];
    for (int f16 = 0; f16 < 2; f16++)
        for (int chunk = 1; chunk <= CH; chunk += CH - 1) {
            int nc = CH * NC / chunk < NC ? CH * NC / chunk : NC;
            cr_assert_eq(be->ops->chunk_mean(be, out, f16 ? (const void *)xh : (const void *)xf,
                                             f16 ? TRI_DTYPE_F16 : TRI_DTYPE_F32, nc, chunk, W, STRIDE),
                         TRI_STATUS_OK);
            for (int c = 0; c < nc; c++)
                for (int j = 0; j < W; j++) {
                    double acc = 0;
                    for (int r = 0; r < chunk; r++) {
                        int e = (c * chunk + r) * STRIDE + j;
                        acc += f16 ? (double)tri__f16_to_f32(xh[e]) : (double)xf[e];
                    }
                    float want = (float)(acc / chunk), got = out[c * W + j];
                    if (isnan(want)) cr_assert(isnan(got), "f16 %d chunk %d [%d][%d]: %g, want NaN", f16, chunk, c, j, (double)got);
                    else cr_assert(memcmp(&got, &want, sizeof got) == 0, "f16 %d chunk %d [%d][%d]: %g, want %g", f16,
                                   chunk, c, j, (double)got, (double)want);
                }
        }
    cr_assert(isinf(out[1]) && out[1] > 0 && isnan(out[2]));  // the f16 rows, chunk 3
    cr_assert_eq(be->ops->chunk_mean(be, out, xf, TRI_DTYPE_Q4_1, 1, 1, 1, 1), TRI_STATUS_UNSUPPORTED);
    // a quantized cache's blocks (tests/test-kv-quant.c checks their means): rows start blocks
    cr_assert_eq(be->ops->chunk_mean(be, out, xf, TRI_DTYPE_Q8_0, 1, 1, 1, 1), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->chunk_mean(be, out, xf, TRI_DTYPE_F32, 1, 1, 10, 5), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->chunk_mean(be, out, xf, TRI_DTYPE_F32, 1, 0, 1, 1), TRI_STATUS_INVALID_ARGUMENT);
    tri__backend_free(be);
}

Test(cpu_backend, convert_to_half) {
    float x[5] = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159f};
    uint16_t h[5], b[5];
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    cr_assert_eq(be->ops->convert(be, h, TRI_DTYPE_F16, x, 5), TRI_STATUS_OK);
    cr_assert_eq(be->ops->convert(be, b, TRI_DTYPE_BF16, x, 5), TRI_STATUS_OK);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(h[i], tri__f32_to_f16(x[i]));
        cr_assert_eq(b[i], tri__f32_to_bf16(x[i]));
    }
    // the quantized KV cache's types take whole blocks of 32 (test-kv-quant.c); others none
    cr_assert_eq(be->ops->convert(be, h, TRI_DTYPE_Q8_0, x, 5), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(be->ops->convert(be, h, TRI_DTYPE_Q4_1, x, 5), TRI_STATUS_UNSUPPORTED);
    tri__backend_free(be);
}

Test(cpu_backend, rmsnorm_every_weight_type) {
    int64_t m = 3, n = 77;
    float x[3 * 77], w[77], y[3 * 77];
    fill(x, m * n, 4.0f);
    fill(w, n, 2.0f);
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_BF16; t++) {
        void *e = encode(w, 1, n, t);
        cr_assert_eq(be->ops->rmsnorm(be, y, x, e, t, m, n, 1e-5f), TRI_STATUS_OK);
        for (int64_t i = 0; i < m; i++) {
            double ss = 0;
            for (int64_t j = 0; j < n; j++) ss += (double)x[i * n + j] * x[i * n + j];
            double s = 1 / sqrt(ss / n + 1e-5);
            for (int64_t j = 0; j < n; j++) {
                double ref = x[i * n + j] * s * decode(e, t, n, 0, j);
                cr_assert(fabs(y[i * n + j] - ref) <= 1e-5 * fabs(ref) + 1e-7, "%s %g vs %g", tri_dtype_name(t),
                          (double)y[i * n + j], ref);
            }
        }
        free(e);
    }
    // in place
    float x2[3 * 77];
    memcpy(x2, x, sizeof x);
    cr_assert_eq(be->ops->rmsnorm(be, x2, x2, w, TRI_DTYPE_F32, m, n, 1e-5f), TRI_STATUS_OK);
    cr_assert_eq(be->ops->rmsnorm(be, y, x, w, TRI_DTYPE_F32, m, n, 1e-5f), TRI_STATUS_OK);
    cr_assert_arr_eq(x2, y, sizeof y);
    cr_assert_eq(be->ops->rmsnorm(be, y, x, w, TRI_DTYPE_Q8_0, m, n, 1e-5f), TRI_STATUS_UNSUPPORTED);
    tri__backend_free(be);
}

Test(cpu_backend, swiglu_and_add) {
    int64_t n = 1001;
    float g[1001], u[1001], o[1001];
    fill(g, n, 10.0f);
    fill(u, n, 3.0f);
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    cr_assert_eq(be->ops->swiglu(be, o, g, u, n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++) {
        double ref = (double)g[i] / (1 + exp(-(double)g[i])) * u[i];
        cr_assert(fabs(o[i] - ref) <= 1e-6 * fabs(ref) + 1e-7, "%g vs %g", (double)o[i], ref);
    }
    cr_assert_eq(be->ops->add(be, o, g, u, n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(o[i], g[i] + u[i]);
    tri__backend_free(be);
}

// Gemma's GeGLU against the tanh-GELU formula in double, its embedding scale and Qwen2's row
// biases (model/family.h).
Test(cpu_backend, family_ops) {
    int64_t n = 1001;
    float g[1001], u[1001], o[1001], x[1001];
    fill(g, n, 10.0f);
    fill(u, n, 3.0f);
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    cr_assert_eq(be->ops->geglu(be, o, g, u, n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++) {
        double v = g[i], ref = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) * u[i];
        cr_assert(fabs(o[i] - ref) <= 2e-6 * fabs(ref) + 1e-6, "%g vs %g", (double)o[i], ref);
    }
    memcpy(x, g, sizeof x);
    cr_assert_eq(be->ops->scale(be, x, n, 5.656854f), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(x[i], g[i] * 5.656854f);
    memcpy(x, g, sizeof x);  // 7 rows of 143
    cr_assert_eq(be->ops->add_rows(be, x, u, 7, 143), TRI_STATUS_OK);
    for (int64_t i = 0; i < 7 * 143; i++) cr_assert_eq(x[i], g[i] + u[i % 143]);
    tri__backend_free(be);
}

// ---- softmax, top-k ----

Test(cpu_backend, softmax_with_temperature_and_masked_entries) {
    int64_t m = 2, n = 203;
    float x[2 * 203], ref_in[2 * 203];
    fill(x, m * n, 30.0f);
    x[5] = -INFINITY;
    x[n + 200] = -INFINITY;
    memcpy(ref_in, x, sizeof x);
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    cr_assert_eq(be->ops->softmax(be, x, m, n, 0.7f), TRI_STATUS_OK);
    for (int64_t i = 0; i < m; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++) mx = fmax(mx, ref_in[i * n + j] / 0.7);
        for (int64_t j = 0; j < n; j++) sum += exp(ref_in[i * n + j] / 0.7 - mx);
        for (int64_t j = 0; j < n; j++) {
            double ref = exp(ref_in[i * n + j] / 0.7 - mx) / sum;
            cr_assert(fabs(x[i * n + j] - ref) <= 1e-5 * ref + 1e-9, "[%lld,%lld] %g vs %g", (long long)i, (long long)j,
                      (double)x[i * n + j], ref);
        }
    }
    cr_assert_eq(x[5], 0.0f);
    float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    cr_assert_eq(be->ops->softmax(be, all_masked, 1, 3, 1.0f), TRI_STATUS_INVALID_ARGUMENT);
    tri__backend_free(be);
}

// Reference: repeatedly pick the best remaining entry (larger value, NaN last, lower index).
static void naive_top_k(const float *x, int64_t n, int64_t k, int32_t *idx) {
    char *used = calloc((size_t)n, 1);
    for (int64_t r = 0; r < k; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++) {
            if (used[j]) continue;
            if (best < 0) { best = j; continue; }
            bool jn = isnan(x[j]), bn = isnan(x[best]);
            if ((bn && !jn) || (!jn && !bn && x[j] > x[best])) best = j;
        }
        used[best] = 1;
        idx[r] = (int32_t)best;
    }
    free(used);
}

Test(cpu_backend, top_k_ties_and_nan) {
    int64_t m = 2, n = 300;
    float x[2 * 300];
    for (int64_t i = 0; i < m * n; i++) x[i] = (float)(int)(frand() * 20);  // many ties
    x[7] = NAN;
    x[n + 3] = INFINITY;
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    static const int64_t ks[] = {1, 5, 64, 65, 300};  // both the insertion and the sorting paths
    for (size_t a = 0; a < 5; a++) {
        int64_t k = ks[a];
        float *v = malloc(sizeof(float) * (size_t)(m * k));
        int32_t *ix = malloc(sizeof(int32_t) * (size_t)(m * k)), *ref = malloc(sizeof(int32_t) * (size_t)k);
        cr_assert_eq(be->ops->top_k(be, v, ix, x, m, n, k), TRI_STATUS_OK);
        for (int64_t i = 0; i < m; i++) {
            naive_top_k(x + i * n, n, k, ref);
            for (int64_t j = 0; j < k; j++) {
                cr_assert_eq(ix[i * k + j], ref[j], "k=%lld row %lld rank %lld: %d vs %d", (long long)k, (long long)i,
                             (long long)j, ix[i * k + j], ref[j]);
                float want = x[i * n + ref[j]];
                cr_assert(v[i * k + j] == want || (isnan(want) && isnan(v[i * k + j])));
            }
        }
        free(v);
        free(ix);
        free(ref);
    }
    float v1;
    int32_t i1;
    cr_assert_eq(be->ops->top_k(be, &v1, &i1, x, 1, n, 0), TRI_STATUS_INVALID_ARGUMENT);
    tri__backend_free(be);
}

// ---- RoPE tables (numpy, after HF) and rotations ----

static tri_model_config rope_cfg(int32_t head_dim, float theta, tri_rope_scaling sc, float factor, int32_t orig) {
    tri_model_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = head_dim;
    c.rope_theta = theta;
    c.rope_scaling = sc;
    c.rope_factor = factor;
    c.rope_orig_ctx = orig;
    c.rope_layout = TRI_ROPE_LAYOUT_HALF;
    return c;
}

// Our table for cfg equals numpy's NAME.inv_freq.bin within 2e-6 relative (HF itself computes the
// powers in float32, within a few ulp of numpy's float64 ones) and NAME.attn.bin within 1e-6.
static void check_table(const char *name, const tri__rope *r) {
    char fn[128];
    size_t len;
    snprintf(fn, sizeof fn, "%s.inv_freq.bin", name);
    float *want = tt_read_file(tt_fixture("rope", fn), &len);
    cr_assert_eq(len, sizeof(float) * (size_t)(r->head_dim / 2), "%s", name);
    for (int i = 0; i < r->head_dim / 2; i++)
        cr_assert(fabsf(r->inv_freq[i] - want[i]) <= 2e-6f * want[i], "%s inv_freq[%d] = %.9g, numpy %.9g", name, i,
                  (double)r->inv_freq[i], (double)want[i]);
    free(want);
    snprintf(fn, sizeof fn, "%s.attn.bin", name);
    float *attn = tt_read_file(tt_fixture("rope", fn), &len);
    cr_assert_float_eq(r->attn_factor, attn[0], 1e-6f, "%s attention factor %g vs %g", name, (double)r->attn_factor,
                       (double)attn[0]);
    free(attn);
}

Test(cpu_backend, rope_tables_match_hf) {
    tt_need_fixtures("rope");
    tri__rope r;
    tri_model_config c = rope_cfg(64, 10000, TRI_ROPE_SCALING_NONE, 1, 0);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    check_table("none", &r);
    tri__rope_free(&r);

    c = rope_cfg(64, 10000, TRI_ROPE_SCALING_LINEAR, 4, 0);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    check_table("linear", &r);
    tri__rope_free(&r);

    // NousResearch/Yarn-Llama-2-7b-128k: factor 32 over 4096, default betas, mscale from factor
    c = rope_cfg(128, 10000, TRI_ROPE_SCALING_YARN, 32, 4096);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    check_table("yarn", &r);
    tri__rope_free(&r);

    c = rope_cfg(96, 10000, TRI_ROPE_SCALING_YARN, 8, 2048);
    c.yarn_beta_fast = 16;
    c.yarn_beta_slow = 2;
    c.yarn_mscale = 1.25f;
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    check_table("yarn_given", &r);
    tri__rope_free(&r);

    // Llama-3.1
    c = rope_cfg(128, 500000, TRI_ROPE_SCALING_LLAMA3, 8, 8192);
    c.llama3_low_freq_factor = 1;
    c.llama3_high_freq_factor = 4;
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    check_table("llama3", &r);
    tri__rope_free(&r);

    // GGUF rope_freqs divisors (they replace the Llama-3 rule)
    size_t len;
    float *div = tt_read_file(tt_fixture("rope", "freqs.div.bin"), &len);
    cr_assert_eq(len, 32 * sizeof(float));
    c = rope_cfg(64, 10000, TRI_ROPE_SCALING_LLAMA3, 8, 8192);
    cr_assert_eq(tri__rope_init(&r, &c, div), TRI_STATUS_OK);
    check_table("freqs", &r);
    tri__rope_free(&r);
    free(div);

    c = rope_cfg(63, 10000, TRI_ROPE_SCALING_NONE, 1, 0);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_INVALID_ARGUMENT);
    c = rope_cfg(64, 10000, TRI_ROPE_SCALING_YARN, 32, 0);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_INVALID_ARGUMENT, "YaRN without orig ctx");
}

// Dynamic NTK as a rule of positions (rope.h): with P the context's first length, positions below
// max(P, orig) share the table of that length, each later position p the table of length p + 1.
Test(cpu_backend, rope_dynamic_ntk_follows_sequence_length) {
    tt_need_fixtures("rope");
    tri__rope r;
    tri_model_config c = rope_cfg(128, 10000, TRI_ROPE_SCALING_DYNAMIC, 2, 4096);
    cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK);
    float base0 = r.inv_freq[10], scratch[64], table[64];
    tri__rope_set_prompt(&r, 4000);  // within orig: unchanged up to orig, then per position
    cr_assert_eq(r.inv_freq[10], base0);
    cr_assert_eq(r.split, 4096);
    cr_assert_eq(tri__rope_freqs(&r, 4095, scratch), r.inv_freq);
    tri__rope_table(&r, 10000, table);  // transformers' table for 10000 tokens
    tri__rope ref = r;
    ref.inv_freq = table;
    check_table("dynamic", &ref);
    // position 9999 (length 10000) has that table of its own
    const float *f = tri__rope_freqs(&r, 9999, scratch);
    for (int i = 0; i < 64; i++) cr_assert_eq(f[i], table[i]);
    tri__rope_set_prompt(&r, 10000);  // a first evaluation of 10000: its table below 10000
    check_table("dynamic", &r);
    cr_assert_eq(r.split, 10000);
    cr_assert_eq(tri__rope_freqs(&r, 9999, scratch), r.inv_freq);
    cr_assert(tri__rope_freqs(&r, 10000, scratch)[10] > r.inv_freq[10] * 0.99f);
    cr_assert(tri__rope_freqs(&r, 10000, scratch)[10] < r.inv_freq[10]);  // a larger base: lower
    tri__rope_set_prompt(&r, 100);  // a new context of 100: the original table below orig
    cr_assert_eq(r.inv_freq[10], base0);
    cr_assert(tri__rope_same_prompt(&r, 100, 4096) && !tri__rope_same_prompt(&r, 100, 4097));
    cr_assert(tri__rope_same_prompt(&r, 5000, 5000) && !tri__rope_same_prompt(&r, 5000, 5001));
    tri__rope_free(&r);
}

// The kernel against numpy's rotation of the same input with the same float32 table, both layouts.
Test(cpu_backend, rope_rotates_both_layouts) {
    tt_need_fixtures("rope");
    static const char *names[] = {"yarn", "llama3", "dynamic"};
    static const char *layouts[] = {"adjacent", "half"};
    size_t len;
    float *x0 = tt_read_file(tt_fixture("rope", "rot.x.bin"), &len);
    int64_t m = 7, nh = 3, hd = 128;
    cr_assert_eq(len, sizeof(float) * (size_t)(m * nh * hd));
    int32_t *pos = tt_read_file(tt_fixture("rope", "rot.pos.bin"), &len);
    cr_assert_eq(len, sizeof(int32_t) * (size_t)m);
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    float x[7 * 3 * 128];
    for (int a = 0; a < 3; a++)
        for (int l = 0; l < 2; l++) {
            char fn[128];
            snprintf(fn, sizeof fn, "%s.inv_freq.bin", names[a]);
            float *inv = tt_read_file(tt_fixture("rope", fn), &len);
            snprintf(fn, sizeof fn, "%s.attn.bin", names[a]);
            float *attn = tt_read_file(tt_fixture("rope", fn), &len);
            tri__rope r = {.layout = (tri_rope_layout)l, .head_dim = (int32_t)hd, .attn_factor = attn[0], .inv_freq = inv};
            memcpy(x, x0, sizeof x);
            cr_assert_eq(be->ops->rope(be, x, m, nh, pos, &r), TRI_STATUS_OK);
            snprintf(fn, sizeof fn, "rot.%s.%s.bin", names[a], layouts[l]);
            float *want = tt_read_file(tt_fixture("rope", fn), &len);
            for (int64_t i = 0; i < m * nh * hd; i++)
                cr_assert(fabsf(x[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])), "%s %s [%lld] %g vs numpy %g", names[a],
                          layouts[l], (long long)i, (double)x[i], (double)want[i]);
            free(inv);
            free(attn);
            free(want);
        }
    tri__backend_free(be);
    free(x0);
    free(pos);
}

// tri__rope_apply over rows of mixed positions (in no order, repeated, on both sides of the split)
// equals rotating each row alone with the table transformers computes for max(p + 1, P): LongRoPE
// with a first length below and above its original 32, dynamic NTK below and above it.
Test(cpu_backend, rope_apply_takes_each_positions_table) {
    enum { M = 7, NH = 2, HD = 16 };
    const int32_t pos[M] = {40, 0, 31, 32, 5, 41, 41};
    const float short_div[HD / 2] = {1.0f, 1.1f, 1.2f, 1.05f, 1.3f, 1.0f, 1.4f, 1.5f};
    const float long_div[HD / 2] = {2.0f, 3.5f, 4.0f, 5.0f, 6.5f, 7.0f, 7.5f, 8.0f};
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    float x0[M * NH * HD], x[M * NH * HD], y[M * NH * HD], table[HD / 2];
    for (int i = 0; i < M * NH * HD; i++) x0[i] = sinf(0.37f * (float)i) + 0.1f;
    const tri_rope_scaling rules[2] = {TRI_ROPE_SCALING_LONGROPE, TRI_ROPE_SCALING_DYNAMIC};
    const int64_t prompts[2] = {10, 36};
    for (int k = 0; k < 2; k++)
        for (int pi = 0; pi < 2; pi++) {
            tri_model_config c = rope_cfg(HD, 10000, rules[k], 4, 32);
            c.rope_attn_factor = 1.2f;
            tri__rope r;
            cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
            if (k == 0) cr_assert_eq(tri__rope_set_longrope(&r, short_div, long_div), TRI_STATUS_OK);
            tri__rope_set_prompt(&r, prompts[pi]);
            memcpy(x, x0, sizeof x);
            cr_assert_eq(tri__rope_apply(be, x, M, NH, pos, &r), TRI_STATUS_OK, "%s", tri_last_error());
            for (int i = 0; i < M; i++) {
                int64_t len = pos[i] + 1 > prompts[pi] ? pos[i] + 1 : prompts[pi];
                tri__rope_table(&r, len, table);
                if (k == 0) {  // the factors by hand: long past 32
                    for (int j = 0; j < HD / 2; j++) {
                        float div = len > 32 ? long_div[j] : short_div[j];
                        float want = (float)(1.0 / pow(10000.0, 2.0 * j / HD)) / div;
                        cr_assert(fabsf(table[j] - want) <= 1e-6f * want, "longrope len %lld pair %d", (long long)len,
                                  j);
                    }
                }
                tri__rope one = r;
                one.inv_freq = table;
                one.split = INT64_MAX;
                memcpy(y, x0 + i * NH * HD, sizeof(float) * NH * HD);
                cr_assert_eq(be->ops->rope(be, y, 1, NH, pos + i, &one), TRI_STATUS_OK);
                for (int j = 0; j < NH * HD; j++)
                    cr_assert_eq(x[i * NH * HD + j], y[j], "rule %d P %lld row %d (position %d) [%d]", k,
                                 (long long)prompts[pi], i, pos[i], j);
            }
            tri__rope_free(&r);
        }
    tri__backend_free(be);
}

// The kernel at head sizes other than 128 (72 as in some small models, and 6, smaller than any
// SIMD width), both layouts, every SIMD level, against a naive rotation written here: angle the
// float32 product pos * inv_freq[i] (rope.h), cos and sin in double, times attn_factor. The
// table is YaRN's, so attn_factor is not 1.
Test(cpu_backend, rope_kernel_other_head_sizes) {
    const int64_t dims[] = {72, 6}, m = 5, nh = 3;
    const int32_t pos[5] = {0, 1, 17, 1000, 4095};
    for (int di = 0; di < 2; di++) {
        const int64_t hd = dims[di];
        tri_model_config c = rope_cfg((int32_t)hd, 10000, TRI_ROPE_SCALING_YARN, 4, 1024);
        tri__rope r;
        cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(r.attn_factor != 1.0f);
        float *x0 = malloc(sizeof(float) * (size_t)(m * nh * hd)), *x = malloc(sizeof(float) * (size_t)(m * nh * hd));
        double *want = malloc(sizeof(double) * (size_t)(m * nh * hd));
        fill(x0, m * nh * hd, 2.0f);
        for (int l = 0; l < 2; l++) {
            r.layout = (tri_rope_layout)l;
            for (int64_t t = 0; t < m; t++)
                for (int64_t h = 0; h < nh; h++) {
                    const float *a = x0 + (t * nh + h) * hd;
                    double *w = want + (t * nh + h) * hd;
                    for (int64_t i = 0; i < hd / 2; i++) {
                        int64_t i0 = l == TRI_ROPE_LAYOUT_ADJACENT ? 2 * i : i;
                        int64_t i1 = l == TRI_ROPE_LAYOUT_ADJACENT ? 2 * i + 1 : i + hd / 2;
                        double ang = (double)((float)pos[t] * r.inv_freq[i]);
                        double cs = cos(ang) * r.attn_factor, sn = sin(ang) * r.attn_factor;
                        w[i0] = a[i0] * cs - a[i1] * sn;
                        w[i1] = a[i0] * sn + a[i1] * cs;
                    }
                }
            FOR_EACH_LEVEL({
                memcpy(x, x0, sizeof(float) * (size_t)(m * nh * hd));
                cr_assert_eq(be->ops->rope(be, x, m, nh, pos, &r), TRI_STATUS_OK);
                for (int64_t i = 0; i < m * nh * hd; i++)
                    cr_assert(fabs(x[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])),
                              "head_dim %lld layout %d level %d [%lld] (position %d): %g vs naive %g", (long long)hd, l,
                              lvl, (long long)i, pos[i / (nh * hd)], (double)x[i], want[i]);
            });
        }
        free(x0);
        free(x);
        free(want);
        tri__rope_free(&r);
    }
}

// ---- attention ----

// Naive attention for one query head against a flat list of (position, key, value): double
// softmax over the visible keys. Also adds each key's probability to wsum (may be NULL).
// The attention-logit soft-cap the next views and naive_attn apply (Gemma 2); 0: none.
static float test_softcap = 0;

static void naive_attn(const float *q, int32_t qpos, int64_t hd, int64_t nk, const int32_t *kpos, const float *k,
                       const float *v, double *out, double *wsum) {
    double mx = -INFINITY, sum = 0;
    double *s = malloc(sizeof(double) * (size_t)nk);
    for (int64_t j = 0; j < nk; j++) {
        s[j] = -INFINITY;
        if (kpos[j] > qpos) continue;
        double d = 0;
        for (int64_t e = 0; e < hd; e++) d += (double)q[e] * k[j * hd + e];
        s[j] = d / sqrt((double)hd);
        if (test_softcap > 0) s[j] = test_softcap * tanh(s[j] / test_softcap);
        mx = fmax(mx, s[j]);
    }
    for (int64_t e = 0; e < hd; e++) out[e] = 0;
    for (int64_t j = 0; j < nk; j++) sum += kpos[j] <= qpos ? exp(s[j] - mx) : 0;
    for (int64_t j = 0; j < nk; j++) {
        if (kpos[j] > qpos) continue;
        double p = exp(s[j] - mx) / sum;
        for (int64_t e = 0; e < hd; e++) out[e] += p * v[j * hd + e];
        if (wsum) wsum[j] += p;
    }
    free(s);
}

// A cache for one layer: per KV head nk keys with positions kpos, stored as f32 or f16 rows of
// `stride` elements. Split into spans at the cut points (a span with explicit positions among them).
typedef struct test_cache {
    int64_t nkv, nk, hd, stride;
    tri_dtype type;
    float *k, *v;       // (nkv, nk, hd) f32 as the reference sees them (after f16 rounding)
    void *ks, *vs;      // (nkv, nk, stride) stored
    int32_t *kpos;      // (nk)
} test_cache;

static void cache_make(test_cache *c, int64_t nkv, int64_t nk, int64_t hd, tri_dtype type, float kscale) {
    c->nkv = nkv, c->nk = nk, c->hd = hd, c->stride = hd + 3, c->type = type;
    size_t es = type == TRI_DTYPE_F16 ? 2 : 4;
    c->k = malloc(sizeof(float) * (size_t)(nkv * nk * hd));
    c->v = malloc(sizeof(float) * (size_t)(nkv * nk * hd));
    c->ks = calloc((size_t)(nkv * nk * c->stride), es);
    c->vs = calloc((size_t)(nkv * nk * c->stride), es);
    c->kpos = malloc(sizeof(int32_t) * (size_t)nk);
    // positions with gaps, like a retrieval cache: 0..nk/2-1, then from 1000 on
    for (int64_t j = 0; j < nk; j++) c->kpos[j] = (int32_t)(j < nk / 2 ? j : 1000 + j);
    for (int64_t h = 0; h < nkv; h++)
        for (int64_t j = 0; j < nk; j++)
            for (int64_t e = 0; e < hd; e++) {
                float kv[2] = {frand() * kscale, frand() * 2};
                for (int w = 0; w < 2; w++) {
                    size_t at = (size_t)((h * nk + j) * c->stride + e);
                    if (type == TRI_DTYPE_F16) {
                        uint16_t hv = tri__f32_to_f16(kv[w]);
                        ((uint16_t *)(w ? c->vs : c->ks))[at] = hv;
                        kv[w] = tri__f16_to_f32(hv);
                    } else {
                        ((float *)(w ? c->vs : c->ks))[at] = kv[w];
                    }
                    (w ? c->v : c->k)[(h * nk + j) * hd + e] = kv[w];
                }
            }
}

static void cache_free(test_cache *c) {
    free(c->k), free(c->v), free(c->ks), free(c->vs), free(c->kpos);
}

// Spans of the first n rows for every head: cut at the given row indices (each < n); the second
// piece carries explicit positions.
static void cache_view_n(const test_cache *c, int64_t n, const int64_t *cuts, int n_cuts, tri__kv_span *spans,
                         int32_t *head_span, tri__kv_view *view) {
    size_t es = c->type == TRI_DTYPE_F16 ? 2 : 4;
    int32_t ns = 0;
    for (int64_t h = 0; h < c->nkv; h++) {
        head_span[h] = ns;
        for (int p = 0; p <= n_cuts; p++) {
            int64_t a = p == 0 ? 0 : cuts[p - 1], b = p == n_cuts ? n : cuts[p];
            const uint8_t *kb = (const uint8_t *)c->ks + (size_t)((h * c->nk + a) * c->stride) * es;
            const uint8_t *vb = (const uint8_t *)c->vs + (size_t)((h * c->nk + a) * c->stride) * es;
            // positions are consecutive within a piece except across nk/2; give explicit ones then
            bool consecutive = c->kpos[b - 1] - c->kpos[a] == b - 1 - a;
            spans[ns++] = (tri__kv_span){.pos0 = c->kpos[a], .n = (int32_t)(b - a), .k = kb, .v = vb,
                                         .stride = c->stride, .pos = (consecutive && p != 1) ? NULL : c->kpos + a};
        }
    }
    head_span[c->nkv] = ns;
    *view = (tri__kv_view){
        .type = c->type, .n_head_kv = (int32_t)c->nkv, .spans = spans, .head_span = head_span, .softcap = test_softcap};
}

// The same over all rows.
static void cache_view(const test_cache *c, const int64_t *cuts, int n_cuts, tri__kv_span *spans, int32_t *head_span,
                       tri__kv_view *view) {
    cache_view_n(c, c->nk, cuts, n_cuts, spans, head_span, view);
}

static void check_attention(tri__backend *be, int lvl, tri_dtype type, int64_t nk, float kscale) {
    int64_t nh = 6, nkv = 2, hd = 40, m = 4, g = nh / nkv;
    test_cache c;
    cache_make(&c, nkv, nk, hd, type, kscale);
    float q[4 * 6 * 40], out[4 * 6 * 40], out1[4 * 6 * 40];
    fill(q, m * nh * hd, 1.0f);
    // queries: before any key's end, in the gap, inside the second half, past everything
    int32_t qpos[4] = {3, 500, (int32_t)(1000 + nk - 5), 1 << 20};
    int64_t cuts[3] = {1, nk / 2 + 7, nk - 2};
    tri__kv_span spans[8], one[2];
    int32_t head_span[3], head_one[3];
    tri__kv_view view, whole;
    cache_view(&c, cuts, 3, spans, head_span, &view);
    cache_view(&c, NULL, 0, one, head_one, &whole);
    float *ws = malloc(sizeof(float) * (size_t)(nkv * nk));
    cr_assert_eq(be->ops->attention(be, out, q, qpos, m, nh, hd, &view, ws), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->attention(be, out1, q, qpos, m, nh, hd, &whole, NULL), TRI_STATUS_OK);
    double *wref = calloc((size_t)(nkv * nk), sizeof(double));
    double ref[40];
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kh = h / g;
            naive_attn(q + (i * nh + h) * hd, qpos[i], hd, nk, c.kpos, c.k + kh * nk * hd, c.v + kh * nk * hd, ref,
                       wref + kh * nk);
            for (int64_t e = 0; e < hd; e++) {
                float got = out[(i * nh + h) * hd + e];
                cr_assert(fabs(got - ref[e]) <= 2e-5 * (1 + fabs(ref[e])), "%s %s nk=%lld q%lld h%lld [%lld] %g vs %g",
                          tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(type), (long long)nk, (long long)i,
                          (long long)h, (long long)e, (double)got, ref[e]);
                // split spans == one span over the concatenation (same keys, different tiling)
                cr_assert(fabsf(got - out1[(i * nh + h) * hd + e]) <= 1e-5f * (1 + fabsf(got)));
            }
        }
    for (int64_t j = 0; j < nkv * nk; j++)
        cr_assert(fabs(ws[j] - wref[j]) <= 1e-5 * (1 + wref[j]), "weight sum %lld: %g vs %g", (long long)j,
                  (double)ws[j], wref[j]);
    free(ws);
    free(wref);
    cache_free(&c);
}

Test(cpu_backend, attention_gqa_spans_every_level) {
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
            check_attention(be, lvl, t, 20, 1.0f);
            check_attention(be, lvl, t, 601, 3.0f);  // several tiles of keys, peaked scores
        }
    });
}

Test(cpu_backend, attention_causal_mask) {
    // One KV head, keys at positions 0..9; key 5..9 have huge scores and distinct values. A query
    // at position 4 must ignore them entirely; the query at 9 must be dominated by them.
    int64_t hd = 8, nk = 10;
    float k[10 * 8], v[10 * 8], q[2 * 8], out[2 * 8];
    for (int64_t j = 0; j < nk; j++)
        for (int64_t e = 0; e < hd; e++) {
            k[j * hd + e] = j >= 5 ? 10.0f : 0.0f;
            v[j * hd + e] = j >= 5 ? 100.0f : (float)j;
        }
    for (int64_t e = 0; e < 2 * hd; e++) q[e] = 1.0f;
    int32_t qpos[2] = {4, 9}, head_span[2] = {0, 1};
    tri__kv_span sp = {.pos0 = 0, .n = 10, .k = k, .v = v, .stride = hd};
    tri__kv_view view = {.type = TRI_DTYPE_F32, .n_head_kv = 1, .spans = &sp, .head_span = head_span};
    FOR_EACH_LEVEL({
        cr_assert_eq(be->ops->attention(be, out, q, qpos, 2, 1, hd, &view, NULL), TRI_STATUS_OK);
        for (int64_t e = 0; e < hd; e++) {
            cr_assert_float_eq(out[e], 2.0f, 1e-5f, "uniform over keys 0..4: mean 2, got %g", (double)out[e]);
            cr_assert_float_eq(out[hd + e], 100.0f, 1e-3f);
        }
        // a query before every key sees nothing: zeros
        int32_t early = -1;
        sp.pos0 = 0;
        cr_assert_eq(be->ops->attention(be, out, q, &early, 1, 1, hd, &view, NULL), TRI_STATUS_OK);
        for (int64_t e = 0; e < hd; e++) cr_assert_eq(out[e], 0.0f);
    });
}

// ---- attention: tiled, split and long paths ----

typedef struct attn_case {
    int64_t nh, nkv, hd, m, nk;
    int n_cuts;     // spans per head: n_cuts + 1, cut at evenly spread rows
    bool gap;       // positions 0 .. nk/2 - 1 then 1000 + j (else 0 .. nk - 1)
    bool prefill;   // queries at the last m positions in order (else a mix, see below)
    bool sums;      // also check the weight sums
} attn_case;

// Against naive_attn: outputs within 2e-5 (1 + |ref|), weight sums within 2e-5 (1 + ref). Split
// spans over the same keys give the same output as one span (1e-5 relative).
static void check_attention_case(tri__backend *be, int lvl, tri_dtype type, attn_case ac) {
    int64_t nh = ac.nh, nkv = ac.nkv, hd = ac.hd, m = ac.m, nk = ac.nk, g = nh / nkv;
    test_cache c;
    cache_make(&c, nkv, nk, hd, type, 2.0f);
    if (!ac.gap)
        for (int64_t j = 0; j < nk; j++) c.kpos[j] = (int32_t)j;
    float *q = malloc(sizeof(float) * (size_t)(m * nh * hd)), *out = malloc(sizeof(float) * (size_t)(m * nh * hd));
    float *out1 = malloc(sizeof(float) * (size_t)(m * nh * hd));
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)m);
    fill(q, m * nh * hd, 1.0f);
    int32_t last = c.kpos[nk - 1];
    for (int64_t i = 0; i < m; i++) {
        // a query seeing no key, one in the middle of the first half, one in the gap (or the
        // middle), ones near the end, one past everything
        int32_t mix[6] = {-1, (int32_t)(nk / 4 + i), (int32_t)(ac.gap ? 500 : nk / 2), last - (int32_t)(3 * i % 50),
                          last - 1, 1 << 20};
        qpos[i] = ac.prefill ? last - (int32_t)(m - 1 - i) : mix[i % 6];
    }
    int64_t *cuts = calloc((size_t)(ac.n_cuts + 1), sizeof(int64_t));
    for (int p = 0; p < ac.n_cuts; p++) cuts[p] = 1 + (nk - 2) * (p + 1) / (ac.n_cuts + 1);
    tri__kv_span *spans = malloc(sizeof(tri__kv_span) * (size_t)(nkv * (ac.n_cuts + 1)));
    tri__kv_span *one = malloc(sizeof(tri__kv_span) * (size_t)nkv);
    int32_t *head_span = malloc(sizeof(int32_t) * (size_t)(nkv + 1));
    int32_t *head_one = malloc(sizeof(int32_t) * (size_t)(nkv + 1));
    tri__kv_view view, whole;
    cache_view(&c, cuts, ac.n_cuts, spans, head_span, &view);
    cache_view(&c, NULL, 0, one, head_one, &whole);
    float *ws = ac.sums ? malloc(sizeof(float) * (size_t)(nkv * nk)) : NULL;
    cr_assert_eq(be->ops->attention(be, out, q, qpos, m, nh, hd, &view, ws), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->attention(be, out1, q, qpos, m, nh, hd, &whole, NULL), TRI_STATUS_OK);
    double *wref = calloc((size_t)(nkv * nk), sizeof(double)), *ref = malloc(sizeof(double) * (size_t)hd);
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kh = h / g;
            naive_attn(q + (i * nh + h) * hd, qpos[i], hd, nk, c.kpos, c.k + kh * nk * hd, c.v + kh * nk * hd, ref,
                       wref + kh * nk);
            for (int64_t e = 0; e < hd; e++) {
                float got = out[(i * nh + h) * hd + e];
                cr_assert(fabs(got - ref[e]) <= 2e-5 * (1 + fabs(ref[e])),
                          "%s %s heads %lld/%lld hd %lld m %lld nk %lld spans %d: q%lld (pos %d) h%lld [%lld] %g vs %g",
                          tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(type), (long long)nh, (long long)nkv,
                          (long long)hd, (long long)m, (long long)nk, ac.n_cuts + 1, (long long)i, qpos[i],
                          (long long)h, (long long)e, (double)got, ref[e]);
                cr_assert(fabsf(got - out1[(i * nh + h) * hd + e]) <= 1e-5f * (1 + fabsf(got)));
            }
        }
    for (int64_t j = 0; ws && j < nkv * nk; j++)
        cr_assert(fabs(ws[j] - wref[j]) <= 2e-5 * (1 + wref[j]), "%s weight sum %lld: %g vs %g",
                  tri__cpu_simd_name((tri__cpu_simd)lvl), (long long)j, (double)ws[j], wref[j]);
    free(ws), free(wref), free(ref), free(q), free(out), free(out1), free(qpos), free(cuts);
    free(spans), free(one), free(head_span), free(head_one);
    cache_free(&c);
}

Test(cpu_backend, attention_decode_long_split_every_level) {
    // 5000 keys per head: split over tasks (2 threads), ranges crossing span and tile boundaries
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
            check_attention_case(be, lvl, t, (attn_case){9, 3, 64, 1, 5000, 0, false, false, false});
            check_attention_case(be, lvl, t, (attn_case){6, 2, 64, 3, 5000, 2, true, false, true});
            check_attention_case(be, lvl, t, (attn_case){4, 1, 36, 2, 5000, 40, true, false, false});  // many spans
            check_attention_case(be, lvl, t, (attn_case){2, 2, 128, 1, 3001, 1, false, false, false});
        }
    });
}

Test(cpu_backend, attention_queries_1_to_17_every_level) {
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++)
            for (int64_t m = 1; m <= 17; m += m < 4 ? 1 : 4) {
                check_attention_case(be, lvl, t, (attn_case){6, 2, 40, m, 700, 3, true, false, m == 5});
                check_attention_case(be, lvl, t, (attn_case){3, 3, 20, m, 300, 0, false, false, false});
                check_attention_case(be, lvl, t, (attn_case){2, 2, 100, m, 260, 1, true, false, false});  // wide rows
            }
    });
}

Test(cpu_backend, attention_prefill_tiles_every_level) {
    // many query blocks (64 rows each), causal diagonal tiles, with and without explicit positions
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
            check_attention_case(be, lvl, t, (attn_case){6, 2, 64, 150, 400, 0, false, true, false});
            check_attention_case(be, lvl, t, (attn_case){2, 2, 48, 130, 900, 5, true, true, true});
            check_attention_case(be, lvl, t, (attn_case){3, 1, 36, 70, 70, 0, false, true, false});
        }
    });
}

// ---- attention: batch invariance (see matmul_rows_batch_invariant_every_level) ----

// The query at key row j, alone and seeing the view of rows 0 .. j (decode: the cache ends at its
// own key), on 1 thread, against batches of the last m = 1 .. 17 and 40 rows' queries over the view
// of all nk rows (verification: later queries' keys are in the view, masked), at 1 and 2 threads.
// Cuts fall before the batches, so every view has the same spans up to its end.
static void check_attention_rows_alone(tri__backend *const be[2], int lvl, tri_dtype type, int64_t nh, int64_t nkv,
                                       int64_t hd, int64_t nk, int n_cuts, bool gap) {
    enum { M = 40 };
    int64_t row = nh * hd, j0 = nk - M;  // the queries belong to key rows j0 .. nk - 1
    test_cache c;
    cache_make(&c, nkv, nk, hd, type, 2.0f);
    if (!gap)
        for (int64_t j = 0; j < nk; j++) c.kpos[j] = (int32_t)j;
    float *q = malloc(sizeof(float) * (size_t)(M * row)), *ref = malloc(sizeof(float) * (size_t)(M * row));
    float *out = malloc(sizeof(float) * (size_t)(M * row));
    fill(q, M * row, 1.0f);
    int64_t cuts[4];
    for (int p = 0; p < n_cuts; p++) cuts[p] = 1 + (j0 - 2) * (p + 1) / (n_cuts + 1);
    tri__kv_span *spans = malloc(sizeof(tri__kv_span) * (size_t)(nkv * (n_cuts + 1)));
    int32_t *head_span = malloc(sizeof(int32_t) * (size_t)(nkv + 1));
    tri__kv_view view;
    for (int64_t i = 0; i < M; i++) {
        cache_view_n(&c, j0 + i + 1, cuts, n_cuts, spans, head_span, &view);
        cr_assert_eq(be[0]->ops->attention(be[0], ref + i * row, q + i * row, c.kpos + j0 + i, 1, nh, hd, &view, NULL),
                     TRI_STATUS_OK, "%s", tri_last_error());
    }
    cache_view(&c, cuts, n_cuts, spans, head_span, &view);
    for (int nt = 0; nt < 2; nt++)
        for (int64_t m = 1; m <= M; m = m < 17 ? m + 1 : m == 17 ? M : M + 1) {
            int64_t o = M - m;
            cr_assert_eq(be[nt]->ops->attention(be[nt], out, q + o * row, c.kpos + j0 + o, m, nh, hd, &view, NULL),
                         TRI_STATUS_OK);
            for (int64_t i = 0; i < m; i++)
                cr_assert(memcmp(out + i * row, ref + (o + i) * row, sizeof(float) * (size_t)row) == 0,
                          "%s %s, %d threads, heads %lld/%lld hd %lld, %lld keys, %d spans: query %lld of %lld "
                          "differs from the query alone",
                          tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(type), nt + 1, (long long)nh,
                          (long long)nkv, (long long)hd, (long long)nk, n_cuts + 1, (long long)i, (long long)m);
        }
    free(q), free(ref), free(out), free(spans), free(head_span);
    cache_free(&c);
}

Test(cpu_backend, attention_rows_batch_invariant_every_level) {
    FOR_EACH_LEVEL_1_2_THREADS({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
            check_attention_rows_alone(be, lvl, t, 6, 2, 40, 60, 0, false);
            // SmolLM2's shape; the batches cross key 1024, where a head's second chunk of keys starts
            check_attention_rows_alone(be, lvl, t, 9, 3, 64, 1050, 0, false);
            check_attention_rows_alone(be, lvl, t, 9, 3, 64, 1100, 2, true);
            // 4 KV heads: alone, a task per chunk; 40 queries make 8 (KV head, query block) pairs,
            // whose tasks walk their chunks
            check_attention_rows_alone(be, lvl, t, 8, 4, 32, 1100, 0, false);
            // few KV heads (decode splits a head's keys over the threads), one group of 4, odd hd;
            // the last span has explicit positions
            check_attention_rows_alone(be, lvl, t, 4, 1, 36, 1300, 1, true);
            // no grouping, wide rows: 1 row per query alone, tiles of 4 in a batch
            check_attention_rows_alone(be, lvl, t, 2, 2, 128, 1100, 0, false);
        }
    });
}

// ---- split attention: a state over the first chunks, the rest's chunk partials, the merge ----

// Views of rows [a, b) of every head of c, one span each with explicit positions.
static void cache_rows_view(const test_cache *c, int64_t a, int64_t b, tri__kv_span *spans, int32_t *head_span,
                            tri__kv_view *view) {
    size_t es = c->type == TRI_DTYPE_F16 ? 2 : 4;
    for (int64_t h = 0; h < c->nkv; h++) {
        spans[h] = (tri__kv_span){.n = (int32_t)(b - a),
                                  .k = (const uint8_t *)c->ks + (size_t)((h * c->nk + a) * c->stride) * es,
                                  .v = (const uint8_t *)c->vs + (size_t)((h * c->nk + a) * c->stride) * es,
                                  .stride = c->stride, .pos = c->kpos + a};
        head_span[h] = (int32_t)h;
    }
    head_span[c->nkv] = (int32_t)c->nkv;
    *view = (tri__kv_view){
        .type = c->type, .n_head_kv = (int32_t)c->nkv, .spans = spans, .head_span = head_span, .softcap = test_softcap};
}

// attention_state over the first S keys (S a multiple of TRI_ATTN_CHUNK, 0 included) merged with
// tri__cpu_attention_chunks over the rest gives attention over all of them bit for bit, at every
// level, for queries that see nothing, part of either side, or everything.
static void check_split(tri__backend *be, int lvl) {
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
        int64_t nh = 8, nkv = 2, hd = 64, nk = 3000, m = 13, rows = m * nh;
        test_cache c;
        cache_make(&c, nkv, nk, hd, t, 2.0f);  // positions 0 .. 1499, then 2500 ..
        float *q = malloc(sizeof(float) * (size_t)(rows * hd)), *want = malloc(sizeof(float) * (size_t)(rows * hd));
        float *got = malloc(sizeof(float) * (size_t)(rows * hd));
        float *state = malloc(sizeof(float) * (size_t)(rows * (hd + 2)));
        float *chunks = malloc(sizeof(float) * 3 * (size_t)(rows * (hd + 2)));
        fill(q, rows * hd, 1.0f);
        int32_t qpos[13];
        for (int i = 0; i < 13; i++) {
            int32_t mix[5] = {-1, 700 + i, 1499, 2500 + 600 + 37 * i, 1 << 20};
            qpos[i] = mix[i % 5];
        }
        tri__kv_span all[2], dev[2], host[2];
        int32_t hs_all[3], hs_dev[3], hs_host[3];
        tri__kv_view vall, vdev, vhost;
        cache_rows_view(&c, 0, nk, all, hs_all, &vall);
        cr_assert_eq(be->ops->attention(be, want, q, qpos, m, nh, hd, &vall, NULL), TRI_STATUS_OK);
        for (int64_t S = 0; S < nk; S += TRI_ATTN_CHUNK) {
            cache_rows_view(&c, 0, S, dev, hs_dev, &vdev);
            cache_rows_view(&c, S, nk, host, hs_host, &vhost);
            cr_assert_eq(be->ops->attention_state(be, state, q, qpos, m, nh, hd, &vdev), TRI_STATUS_OK, "%s",
                         tri_last_error());
            int64_t nc;
            cr_assert_eq(tri__cpu_attention_chunks(be, NULL, &nc, q, qpos, m, nh, hd, &vhost), TRI_STATUS_OK);
            cr_assert_eq(nc, (nk - S + TRI_ATTN_CHUNK - 1) / TRI_ATTN_CHUNK);
            cr_assert_eq(tri__cpu_attention_chunks(be, chunks, &nc, q, qpos, m, nh, hd, &vhost), TRI_STATUS_OK);
            tri__cpu_attention_merge(got, state, chunks, nc, rows, hd);
            cr_assert_eq(memcmp(got, want, sizeof(float) * (size_t)(rows * hd)), 0, "%s %s: split at %lld differs",
                         tri__cpu_simd_name((tri__cpu_simd)lvl), tri_dtype_name(t), (long long)S);
        }
        free(q), free(want), free(got), free(state), free(chunks);
        cache_free(&c);
    }
}

Test(cpu_backend, attention_split_state_chunks_merge_bit_exact) {
    FOR_EACH_LEVEL({ check_split(be, lvl); });
}

// Gemma 2's soft-capped scores (cap * tanh(s / cap), a cap of 1.5 that bites on scores of order 1
// to 10) against the naive reference, weight sums too, at every level, over tiles, splits into
// chunk tasks and a prefill; the split's state and host chunks merge to the same bits.
Test(cpu_backend, attention_softcap_every_level) {
    test_softcap = 1.5f;
    FOR_EACH_LEVEL({
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
            check_attention(be, lvl, t, 601, 3.0f);
            check_attention_case(be, lvl, t, (attn_case){8, 2, 64, 3, 2600, 2, true, false, true});
            check_attention_case(be, lvl, t, (attn_case){4, 1, 32, 40, 300, 1, false, true, false});
        }
        check_split(be, lvl);
    });
    test_softcap = 0;
}

// ---- bf16 attention scores (opt-in) ----

// The AVX512-BF16 kernel against the scalar reference of the same arithmetic (kernels-bf16.c), over
// tile edges (rows, keys) and head_dims with a tail of pairs; both against a double dot product of
// the bf16-rounded operands, within f32 summation error.
Test(cpu_backend, attn_scores_bf16_matches_reference) {
    if (!tri__cpu_has_bf16()) cr_skip_test("this CPU lacks AVX512-BF16: the bf16 score kernel is not used here");
#if TRI_CPU_X86
    const int64_t hds[5] = {32, 40, 64, 72, 128};
    for (int hi = 0; hi < 5; hi++) {
        int64_t hd = hds[hi], stride = hd + 5, r = 7, nk = 11;
        float *q = malloc(sizeof(float) * (size_t)(r * hd)), s[7 * 11], s_ref[7 * 11];
        uint16_t *k = malloc(sizeof(uint16_t) * (size_t)(nk * stride));
        fill(q, r * hd, 2.0f);
        for (int64_t j = 0; j < nk * stride; j++) k[j] = tri__f32_to_f16((float)sin(0.37 * (double)j) * 1.5f);
        for (int64_t rr = 1; rr <= r; rr += 3)
            for (int64_t nn = 1; nn <= nk; nn += 2) {
                tri__cpu_attn_scores_f16_bf16(s, nk, q, rr, k, stride, nn, hd);
                tri__cpu_attn_scores_f16_bf16_ref(s_ref, nk, q, rr, k, stride, nn, hd);
                for (int64_t i = 0; i < rr; i++)
                    for (int64_t j = 0; j < nn; j++) {
                        double d = 0, mag = 0;
                        for (int64_t e = 0; e < hd; e++) {
                            double p = (double)tri__bf16_to_f32(tri__f32_to_bf16(q[i * hd + e])) *
                                       (double)tri__bf16_to_f32(tri__f32_to_bf16(tri__f16_to_f32(k[j * stride + e])));
                            d += p, mag += fabs(p);
                        }
                        float got = s[i * nk + j], want = s_ref[i * nk + j];
                        cr_assert(fabs(want - d) <= 1e-6 * mag, "bf16 ref hd=%lld [%lld,%lld]: %g vs %g", (long long)hd,
                                  (long long)i, (long long)j, (double)want, d);
                        cr_assert(fabsf(got - want) <= 1e-6f * (float)mag,
                                  "bf16 kernel hd=%lld r=%lld nk=%lld [%lld,%lld]: %g vs %g", (long long)hd,
                                  (long long)rr, (long long)nn, (long long)i, (long long)j, (double)got, (double)want);
                    }
            }
        free(q);
        free(k);
    }
#endif
}

// The opt-in: off by default (attention bit for bit as before), on it scores with bf16 operands
// (the output moves, within bf16's rounding of the scores), off again restores f32 exactly.
Test(cpu_backend, attention_bf16_opt_in) {
    tri__backend *be = make_backend(TRI_CPU_SIMD_AUTO);
    if (!tri__cpu_has_bf16()) {
        cr_assert_eq(tri__cpu_set_attn_bf16(be, true), TRI_STATUS_UNSUPPORTED);
        tri__backend_free(be);
        cr_skip_test("this CPU lacks AVX512-BF16: checked only that the opt-in is refused");
    }
    int64_t nh = 6, nkv = 2, hd = 64, m = 3, nk = 300, g = nh / nkv;
    test_cache c;
    cache_make(&c, nkv, nk, hd, TRI_DTYPE_F16, 1.0f);
    float q[3 * 6 * 64], out0[3 * 6 * 64], out1[3 * 6 * 64], out2[3 * 6 * 64];
    fill(q, m * nh * hd, 1.0f);
    int32_t qpos[3] = {1000 + 150, 1000 + 299, 1 << 20};
    tri__kv_span spans[4];
    int32_t head_span[3];
    tri__kv_view view;
    cache_view(&c, NULL, 0, spans, head_span, &view);
    cr_assert_eq(be->ops->attention(be, out0, q, qpos, m, nh, hd, &view, NULL), TRI_STATUS_OK);
    cr_assert_eq(tri__cpu_set_attn_bf16(be, true), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->attention(be, out1, q, qpos, m, nh, hd, &view, NULL), TRI_STATUS_OK);
    cr_assert_eq(tri__cpu_set_attn_bf16(be, false), TRI_STATUS_OK);
    cr_assert_eq(be->ops->attention(be, out2, q, qpos, m, nh, hd, &view, NULL), TRI_STATUS_OK);
    cr_assert(!memcmp(out0, out2, sizeof out0), "turning bf16 off must restore the f32 result bit for bit");
    double ref[64], diff = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kh = h / g;
            naive_attn(q + (i * nh + h) * hd, qpos[i], hd, nk, c.kpos, c.k + kh * nk * hd, c.v + kh * nk * hd, ref,
                       NULL);
            for (int64_t e = 0; e < hd; e++) {
                float a = out0[(i * nh + h) * hd + e], b = out1[(i * nh + h) * hd + e];
                cr_assert(fabs(a - ref[e]) <= 2e-5 * (1 + fabs(ref[e])));
                // bf16 operands: each score off by up to about 2^-8 of sum |q_d k_d|
                cr_assert(fabs(b - ref[e]) <= 2e-2 * (1 + fabs(ref[e])), "bf16 q%lld h%lld [%lld] %g vs %g",
                          (long long)i, (long long)h, (long long)e, (double)b, ref[e]);
                diff = fmax(diff, fabs((double)a - (double)b));
            }
        }
    cr_assert(diff > 0, "bf16 scores on, yet attention's output did not change: the opt-in is not wired");
    cache_free(&c);
    tri__backend_free(be);
}
