// test-cuda-backend.c - every CUDA op against the CPU backend and against a naive double
// reference written here, on awkward shapes, with the tolerance stated at each check. Mirrors
// tests/test-cpu-backend.c. Every test that needs a GPU skips with "no CUDA device" when
// tri__cuda_device_count() is 0 (CI, and any build without CUDA).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend-select.h"
#include "backend.h"
#include "cuda-backend.h"
#include "dtype.h"
#include "kv-policy.h"
#include "llama.h"
#include "rope.h"
#include "test-blocks.h"
#include "test-util.h"
#include "tri-config.h"
#include "weights.h"

#pragma GCC diagnostic ignored "-Wdouble-promotion"

// ---- helpers ----

// Declares `gpu` (the CUDA backend on device 0) and `cpu` (the reference), or skips the test.
#define NEED_GPU()                                                                                  \
    if (tri__cuda_device_count() == 0) cr_skip_test("no CUDA device: %s", tri__cuda_unavailable());  \
    tri__backend *gpu = NULL, *cpu = NULL;                                                          \
    cr_assert_eq(tri__backend_cuda_create(0, &gpu), TRI_STATUS_OK, "%s", tri_last_error());        \
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &cpu), TRI_STATUS_OK, "%s", tri_last_error())

#define DONE()                  \
    tri__backend_free(gpu);     \
    tri__backend_free(cpu)

// A device copy of bytes of host data.
static void *up(tri__backend *be, const void *src, size_t bytes) {
    void *d = NULL;
    cr_assert_eq(be->ops->alloc(be, bytes, &d), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->copy_to_backend(be, d, src, bytes), TRI_STATUS_OK, "%s", tri_last_error());
    return d;
}

// Device memory of bytes, uninitialised.
static void *dalloc(tri__backend *be, size_t bytes) {
    void *d = NULL;
    cr_assert_eq(be->ops->alloc(be, bytes, &d), TRI_STATUS_OK, "%s", tri_last_error());
    return d;
}

// Copies back and waits; fails the test on any error the device reported.
static void down(tri__backend *be, void *dst, const void *src, size_t bytes) {
    cr_assert_eq(be->ops->copy_to_host(be, dst, src, bytes), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(be->ops->synchronize(be), TRI_STATUS_OK, "%s", tri_last_error());
}

// ---- backend lifecycle (these run without a GPU too) ----

Test(cuda_backend, create_rejects_missing_device) {
    tri__backend *be = (tri__backend *)1;
    int n = tri__cuda_device_count();
    cr_assert_geq(n, 0);
    cr_assert_eq(tri__backend_cuda_create(n, &be), TRI_STATUS_DEVICE);
    cr_assert_null(be);
    cr_assert_eq(tri__backend_cuda_create(-1, &be), TRI_STATUS_DEVICE);
    cr_assert(strlen(tri_last_error()) > 0);
}

Test(cuda_backend, device_info_matches_count) {
    int n = tri__cuda_device_count();
    tri__cuda_device_info info;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(tri__cuda_device_info_get(i, &info), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(info.name[0] != 0 && info.total_bytes > 0 && info.cc_major > 0);
    }
    cr_assert_neq(tri__cuda_device_info_get(n, &info), TRI_STATUS_OK);
}

Test(cuda_backend, system_info_api) {
    tri_host_info h;
    cr_assert_eq(tri_host_get_info(&h), TRI_STATUS_OK);
    cr_assert_gt(h.n_cpus, 0);
    cr_assert_gt(h.total_bytes, 0);
    cr_assert_not_null(h.simd);
    cr_assert_eq(tri_device_count(), tri__cuda_device_count());
    if (!h.cuda_support) cr_assert_eq(tri_device_count(), 0);
    tri_device_info d;
    for (int32_t i = 0; i < tri_device_count(); i++) {
        cr_assert_eq(tri_device_get_info(i, &d), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert(d.name[0] && d.total_bytes >= d.free_bytes && d.sm_count > 0);
    }
    cr_assert_eq(tri_device_get_info(tri_device_count(), &d), TRI_STATUS_DEVICE);
    cr_assert_eq(tri_host_get_info(NULL), TRI_STATUS_INVALID_ARGUMENT);
}

Test(cuda_backend, memory_copies_and_out_of_memory) {
    NEED_GPU();
    uint8_t a[1000], b[1000];
    for (int i = 0; i < 1000; i++) a[i] = (uint8_t)(i * 7);
    void *d1 = up(gpu, a, sizeof a), *d2 = dalloc(gpu, sizeof a);
    cr_assert_eq(gpu->ops->copy(gpu, d2, d1, sizeof a), TRI_STATUS_OK);
    memset(b, 0, sizeof b);
    down(gpu, b, d2, sizeof b);
    cr_assert_arr_eq(a, b, sizeof a);
    void *z = (void *)1;
    cr_assert_eq(gpu->ops->alloc(gpu, 0, &z), TRI_STATUS_OK);
    cr_assert_null(z);
    gpu->ops->free(gpu, NULL);
    // far more than any GPU has: a status, not a crash, and the backend still works after it
    void *huge = (void *)1;
    cr_assert_eq(gpu->ops->alloc(gpu, (size_t)1 << 52, &huge), TRI_STATUS_DEVICE_OUT_OF_MEMORY);
    cr_assert_null(huge);
    memset(b, 0, sizeof b);
    down(gpu, b, d1, sizeof b);
    cr_assert_arr_eq(a, b, sizeof a);
    gpu->ops->free(gpu, d1);
    gpu->ops->free(gpu, d2);
    DONE();
}

// A runtime call that fails leaves its error as the thread's last error; the backend clears it, or
// the cudaGetLastError() after the next launch would report it and fail an op that ran fine.
Test(cuda_backend, failed_call_does_not_fail_later_ops) {
    NEED_GPU();
    float a[300], b[300], o[300];
    fill(a, 300, 1.0f);
    fill(b, 300, 1.0f);
    float *da = up(gpu, a, sizeof a), *db = up(gpu, b, sizeof b);
    // pinning a range twice (cudaErrorHostMemoryAlreadyRegistered), an unknown device's info
    // (cudaErrorInvalidDevice): recoverable failures, each a status
    void *page = aligned_alloc(4096, 4096);
    cr_assert_eq(gpu->ops->host_register(gpu, page, 4096), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(gpu->ops->host_register(gpu, page, 4096), TRI_STATUS_DEVICE);
    cr_assert_eq(gpu->ops->add(gpu, da, da, db, 300), TRI_STATUS_OK, "stale error: %s", tri_last_error());
    tri__cuda_device_info info;
    cr_assert_neq(tri__cuda_device_info_get(tri__cuda_device_count(), &info), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->swiglu(gpu, db, da, db, 300), TRI_STATUS_OK, "stale error: %s", tri_last_error());
    down(gpu, o, db, sizeof o);
    for (int i = 0; i < 300; i++) {
        float s = a[i] + b[i];
        cr_assert(fabsf(o[i] - s / (1.0f + expf(-s)) * b[i]) <= 1e-6f * (1 + fabsf(o[i])), "[%d] %g", i, (double)o[i]);
    }
    gpu->ops->host_unregister(gpu, page);
    free(page);
    gpu->ops->free(gpu, da);
    gpu->ops->free(gpu, db);
    DONE();
}

// The transfer stream: pinned host rows copied up on TRANSFER, an op on COMPUTE that waits for them
// through an event, its result copied back on TRANSFER after an event of COMPUTE, and
// event_synchronize before the host reads it.
Test(cuda_backend, transfer_stream_and_events) {
    NEED_GPU();
    const int64_t n = 1 << 20;  // 4 MiB: long enough for a missing wait to show
    size_t bytes = sizeof(float) * (size_t)n;
    float *a = aligned_alloc(4096, bytes), *r = aligned_alloc(4096, bytes), *b = malloc(bytes);
    fill(a, n, 2.0f);
    fill(b, n, 2.0f);
    cr_assert_eq(gpu->ops->host_register(gpu, a, bytes), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(gpu->ops->host_register(gpu, r, bytes), TRI_STATUS_OK, "%s", tri_last_error());
    float *da = dalloc(gpu, bytes), *db = up(gpu, b, bytes), *dout = dalloc(gpu, bytes);
    tri__event *loaded = NULL, *done = NULL, *back = NULL;
    cr_assert_eq(gpu->ops->event_create(gpu, &loaded), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->event_create(gpu, &done), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->event_create(gpu, &back), TRI_STATUS_OK);
    for (int round = 0; round < 3; round++) {
        for (int64_t i = 0; i < n; i++) a[i] += 1.0f;  // a refilled: the last round's copy is done
        cr_assert_eq(gpu->ops->transfer_to_backend(gpu, da, a, bytes), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->event_record(gpu, loaded, TRI_STREAM_TRANSFER), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->stream_wait(gpu, TRI_STREAM_COMPUTE, loaded), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->add(gpu, dout, da, db, n), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->event_record(gpu, done, TRI_STREAM_COMPUTE), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->stream_wait(gpu, TRI_STREAM_TRANSFER, done), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->transfer_to_host(gpu, r, dout, bytes), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->event_record(gpu, back, TRI_STREAM_TRANSFER), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->event_synchronize(gpu, back), TRI_STATUS_OK, "%s", tri_last_error());
        for (int64_t i = 0; i < n; i++) cr_assert_eq(r[i], a[i] + b[i], "round %d [%lld]", round, (long long)i);
    }
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_OK);
    gpu->ops->event_destroy(gpu, loaded);
    gpu->ops->event_destroy(gpu, done);
    gpu->ops->event_destroy(gpu, back);
    gpu->ops->event_destroy(gpu, NULL);
    gpu->ops->host_unregister(gpu, a);
    gpu->ops->host_unregister(gpu, r);
    gpu->ops->free(gpu, da);
    gpu->ops->free(gpu, db);
    gpu->ops->free(gpu, dout);
    free(a), free(r), free(b);
    DONE();
}

// ---- matmul ----

// y = x @ W^T on the GPU, against the double reference on the decoded weights and against the CPU
// backend. Tolerances (mag = sum |x w| of the output):
//   m <= 16 (matvec kernels, f32 x and accumulation, every type):       2e-5 mag + 1e-6
//   m > 16, F32 (cuBLAS sgemm, no TF32):                                 2e-5 mag + 1e-6
//   m > 16, F16/BF16 (x split into hi + lo halves, tensor cores):         2e-4 mag + 1e-6
//   m > 16, quantized (W dequantized to f16: 2^-11 relative per weight): 2e-4 mag + 2^-11 mag + 1e-6
// (tensor cores accumulate f32 with truncated alignment, a bias that grows with k: 2e-4 covers k =
// 4096) and against the CPU backend, the GPU tolerance plus the CPU's (its 8-bit x for quantized W).
// x_off: x starts x_off floats into its device buffer (4 bytes past 16-byte alignment for 1).
static void check_matmul_at(tri__backend *gpu, tri__backend *cpu, tri_dtype t, int64_t m, int64_t n, int64_t k,
                            int64_t x_off) {
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *w = malloc(sizeof(float) * (size_t)(n * k));
    float *y = malloc(sizeof(float) * (size_t)(m * n)), *yc = malloc(sizeof(float) * (size_t)(m * n));
    fill(x, m * k, 2.0f);
    fill(w, n * k, 0.5f);
    for (int64_t i = 0; i < k; i += 13) x[i] *= 20;
    void *wq = encode(w, n, k, t);
    size_t wbytes = (size_t)(tri__dtype_row_bytes(t, k) * n);
    float *dx = dalloc(gpu, sizeof(float) * (size_t)(m * k + x_off));
    cr_assert_eq(gpu->ops->copy_to_backend(gpu, dx + x_off, x, sizeof(float) * (size_t)(m * k)), TRI_STATUS_OK);
    void *dw = up(gpu, wq, wbytes), *dy = dalloc(gpu, sizeof(float) * (size_t)(m * n));
    cr_assert_eq(gpu->ops->matmul(gpu, dy, dx + x_off, dw, t, m, n, k), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, y, dy, sizeof(float) * (size_t)(m * n));
    cr_assert_eq(cpu->ops->matmul(cpu, yc, x, wq, t, m, n, k), TRI_STATUS_OK);
    bool quant = tri__dtype_is_quantized(t);
    double rel = m <= 16 || t == TRI_DTYPE_F32 ? 2e-5 : quant ? 2e-4 + 1.0 / 2048 : 2e-4;
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
            double tol = rel * mag + 1e-6;
            double tol_cpu = 1e-5 * mag + 1e-6 + (quant ? 1.01 * qerr : 0);
            float got = y[i * n + r];
            cr_assert(fabs(got - ref) <= tol, "%s m=%lld n=%lld k=%lld x+%lld y[%lld,%lld] = %.9g, ref %.9g, tol %g",
                      tri_dtype_name(t), (long long)m, (long long)n, (long long)k, (long long)x_off, (long long)i,
                      (long long)r,
                      (double)got, ref, tol);
            cr_assert(fabs(got - yc[i * n + r]) <= tol + tol_cpu, "%s vs cpu: %.9g vs %.9g", tri_dtype_name(t),
                      (double)got, (double)yc[i * n + r]);
        }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dy);
    free(x), free(w), free(y), free(yc), free(wq);
}

static void check_matmul(tri__backend *gpu, tri__backend *cpu, tri_dtype t, int64_t m, int64_t n, int64_t k) {
    check_matmul_at(gpu, cpu, t, m, n, k, 0);
}

Test(cuda_backend, matmul_float_weights) {
    NEED_GPU();
    static const int64_t ks[] = {1, 7, 33, 100, 257, 4096};  // odd k: unaligned rows, scalar path
    static const int64_t ms[] = {1, 3, 5, 16, 17, 70};       // every matvec width, then cuBLAS
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_BF16; t++)
        for (size_t a = 0; a < 6; a++)
            for (size_t b = 0; b < 6; b++) check_matmul(gpu, cpu, t, ms[b], 19, ks[a]);
    DONE();
}

Test(cuda_backend, matmul_quantized_weights) {
    NEED_GPU();
    static const int64_t ks[] = {32, 96, 160, 4096};  // 1, 3, 5 and 128 blocks per row
    static const int64_t ms[] = {1, 2, 4, 5, 16, 17, 70};
    for (tri_dtype t = TRI_DTYPE_Q8_0; t < TRI_DTYPE_COUNT; t++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 7; b++)
                if (ks[a] % tri__dtype_block_elems(t) == 0) check_matmul(gpu, cpu, t, ms[b], 37, ks[a]);
    DONE();
}

// The K-quants and IQ4_XS: 1, 3 and 8 super-blocks per row (m past the matvec's limit dequantizes
// to f16).
Test(cuda_backend, matmul_k_quant_weights) {
    NEED_GPU();
    static const int64_t ks[] = {256, 768, 2048};
    static const int64_t ms[] = {1, 4, 5, 17, 70};
    static const tri_dtype types[] = {TRI_DTYPE_Q2_K, TRI_DTYPE_Q3_K, TRI_DTYPE_Q4_K,
                                      TRI_DTYPE_Q5_K, TRI_DTYPE_Q6_K, TRI_DTYPE_IQ4_XS};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 5; b++) check_matmul(gpu, cpu, types[ti], ms[b], 37, ks[a]);
    DONE();
}

Test(cuda_backend, matmul_large_n_and_unaligned_x) {
    NEED_GPU();
    // a vocabulary-sized output (grid of 8K blocks of rows), and x starting 4 bytes past a 16-byte
    // boundary (the matvec falls back to scalar loads of x)
    check_matmul(gpu, cpu, TRI_DTYPE_Q8_0, 2, 32003, 64);
    check_matmul(gpu, cpu, TRI_DTYPE_F16, 1, 32003, 64);
    for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++) {
        int64_t k = tri__dtype_row_bytes(t, 64) > 0 ? 64 : 256;  // the K-quants: one super-block
        check_matmul_at(gpu, cpu, t, 3, 11, k, 1);
        check_matmul_at(gpu, cpu, t, 17, 11, k, 1);  // the split-half conversion reads it too
    }
    DONE();
}

Test(cuda_backend, matmul_q8_0_extreme_weights) {
    NEED_GPU();
    tri__block_q8_0 w[2];
    float x[64], y[1];
    for (int b = 0; b < 2; b++) {
        w[b].d = tri__f32_to_f16(0.5f);
        for (int i = 0; i < 32; i++) w[b].qs[i] = -128;
    }
    for (int i = 0; i < 64; i++) x[i] = -1.0f;
    void *dw = up(gpu, w, sizeof w), *dx = up(gpu, x, sizeof x), *dy = dalloc(gpu, sizeof y);
    cr_assert_eq(gpu->ops->matmul(gpu, dy, dx, dw, TRI_DTYPE_Q8_0, 1, 1, 64), TRI_STATUS_OK);
    down(gpu, y, dy, sizeof y);
    cr_assert_float_eq(y[0], 64 * 64.0f, 1e-3f, "%g", (double)y[0]);
    // partial blocks are refused before anything runs
    cr_assert_eq(gpu->ops->matmul(gpu, dy, dx, dw, TRI_DTYPE_Q4_0, 1, 1, 40), TRI_STATUS_INVALID_ARGUMENT);
    gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy);
    DONE();
}

// ---- get_rows, convert, rmsnorm, swiglu, add ----

Test(cuda_backend, get_rows_every_type) {
    NEED_GPU();
    int64_t rows = 9, n = 256;  // one super-block of the K-quants
    float w[9 * 256], out[4 * 256], outc[4 * 256];
    fill(w, rows * n, 3.0f);
    int32_t ids[4] = {8, 0, 3, 3};
    float *dout = dalloc(gpu, sizeof out);
    for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++) {
        void *e = encode(w, rows, n, t);
        void *de = up(gpu, e, (size_t)(tri__dtype_row_bytes(t, n) * rows));
        cr_assert_eq(gpu->ops->get_rows(gpu, dout, de, t, rows, n, ids, 4), TRI_STATUS_OK, "%s", tri_last_error());
        down(gpu, out, dout, sizeof out);
        cr_assert_eq(cpu->ops->get_rows(cpu, outc, e, t, rows, n, ids, 4), TRI_STATUS_OK);
        // exact: both decode d * q in f32
        for (int64_t j = 0; j < 4 * n; j++)
            cr_assert_eq(out[j], outc[j], "%s [%lld] %g vs cpu %g", tri_dtype_name(t), (long long)j, (double)out[j],
                         (double)outc[j]);
        gpu->ops->free(gpu, de);
        free(e);
    }
    int32_t bad = 9;
    cr_assert_eq(gpu->ops->get_rows(gpu, dout, dout, TRI_DTYPE_F32, rows, n, &bad, 1), TRI_STATUS_INVALID_ARGUMENT);
    gpu->ops->free(gpu, dout);
    DONE();
}

Test(cuda_backend, gather_rows_words_and_bytes) {
    NEED_GPU();
    // 4-byte rows at 4-aligned offsets take the word path; 6-byte rows at odd offsets the byte path
    enum { SRC = 4096 };
    unsigned char src[SRC], got[300 * 8], want[300 * 8];
    for (int i = 0; i < SRC; i++) src[i] = (unsigned char)(i * 13 + 5);
    unsigned char *dsrc = up(gpu, src, SRC), *ddst = dalloc(gpu, sizeof got);
    int64_t off[300];
    for (int aligned = 1; aligned >= 0; aligned--) {
        int64_t row = aligned ? 8 : 6;
        for (int i = 0; i < 300; i++) off[i] = aligned ? (int64_t)((i * 37) % 500) * 8 : (int64_t)(i * 29 % 4000) + 1;
        cr_assert_eq(gpu->ops->gather(gpu, ddst, dsrc, off, 300, row), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(cpu->ops->gather(cpu, want, src, off, 300, row), TRI_STATUS_OK);
        down(gpu, got, ddst, (size_t)(300 * row));
        cr_assert_eq(memcmp(got, want, (size_t)(300 * row)), 0, "%s rows", aligned ? "word" : "byte");
    }
    const int64_t bad = -1;
    cr_assert_eq(gpu->ops->gather(gpu, ddst, dsrc, &bad, 1, 8), TRI_STATUS_INVALID_ARGUMENT);
    gpu->ops->free(gpu, dsrc);
    gpu->ops->free(gpu, ddst);
    DONE();
}

Test(cuda_backend, chunk_mean_bit_exact) {
    NEED_GPU();
    enum { CH = 8, NC = 300, W = 384, STRIDE = 384 };
    size_t n = (size_t)CH * NC * STRIDE;
    float *xf = malloc(n * sizeof *xf), *got = malloc(sizeof(float) * NC * W), *want = malloc(sizeof(float) * NC * W);
    uint16_t *xh = malloc(n * sizeof *xh);
    for (size_t i = 0; i < n; i++) {
        xf[i] = (float)((int64_t)(i * 7919) % 2001 - 1000) / 37.0f;
        xh[i] = tri__f32_to_f16(xf[i]);
    }
    xh[0] = 0x0001, xh[1] = 0x7c00, xh[2] = 0x7c01, xh[3] = 0x8400;
    float *dout = dalloc(gpu, sizeof(float) * NC * W);
    for (int f16 = 0; f16 < 2; f16++) {
        const void *x = f16 ? (const void *)xh : (const void *)xf;
        void *dx = up(gpu, x, n * (f16 ? 2 : 4));
        tri_dtype t = f16 ? TRI_DTYPE_F16 : TRI_DTYPE_F32;
        cr_assert_eq(gpu->ops->chunk_mean(gpu, dout, dx, t, NC, CH, W, STRIDE), TRI_STATUS_OK, "%s", tri_last_error());
        down(gpu, got, dout, sizeof(float) * NC * W);
        cr_assert_eq(cpu->ops->chunk_mean(cpu, want, x, t, NC, CH, W, STRIDE), TRI_STATUS_OK);
        cr_assert_eq(memcmp(got, want, sizeof(float) * NC * W), 0, "%s means differ from the CPU's", tri_dtype_name(t));
        gpu->ops->free(gpu, dx);
    }
    // a quantized cache's keys (q8_0, q4_0): the same values quantized, a zero block and a block of
    // the f16 scale's subnormals among them; rows of STRIDE values start blocks
    const tri_dtype qtypes[2] = {TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const tri_dtype t = qtypes[ti];
        const size_t bytes = (size_t)tri__dtype_row_bytes(t, (int64_t)n);
        uint8_t *xq = malloc(bytes);
        for (int i = 0; i < 32; i++) xf[i] = 0.0f, xf[32 + i] = (float)(i - 16) * 1e-7f;
        cr_assert(tri__quantize_row(xq, xf, t, (int64_t)n));
        void *dx = up(gpu, xq, bytes);
        cr_assert_eq(gpu->ops->chunk_mean(gpu, dout, dx, t, NC, CH, W - 40, STRIDE), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, got, dout, sizeof(float) * NC * (W - 40));
        cr_assert_eq(cpu->ops->chunk_mean(cpu, want, xq, t, NC, CH, W - 40, STRIDE), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(memcmp(got, want, sizeof(float) * NC * (W - 40)), 0, "%s means differ from the CPU's",
                     tri_dtype_name(t));
        cr_assert_eq(gpu->ops->chunk_mean(gpu, dout, dx, t, NC, CH, 40, 40), TRI_STATUS_INVALID_ARGUMENT,
                     "%s rows of 40 values start inside blocks", tri_dtype_name(t));
        gpu->ops->free(gpu, dx);
        free(xq);
    }
    cr_assert_eq(gpu->ops->chunk_mean(gpu, dout, xh, TRI_DTYPE_Q4_1, NC, CH, W, STRIDE), TRI_STATUS_UNSUPPORTED);
    gpu->ops->free(gpu, dout);
    free(xf), free(xh), free(got), free(want);
    DONE();
}

// The device's means of the q8_0 / q4_0 blocks of tests/fixtures/make-kv-quant.py read as a cache's
// keys (rows of 96 values, 14 chunks of 8 rows, 80 columns) are numpy's float64 means of
// gguf.quants.dequantize's values, bit for bit.
Test(cuda_backend, chunk_mean_quantized_matches_numpy) {
    NEED_GPU();
    tt_need_fixtures("kv-quant");
    enum { STRIDE = 96, ROWS = 112, CH = 8, NC = ROWS / CH, W = 80 };
    const char *names[2] = {"q8_0", "q4_0"};
    const tri_dtype types[2] = {TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    float *dout = dalloc(gpu, sizeof(float) * NC * W), got[NC * W];
    for (int ti = 0; ti < 2; ti++) {
        char bn[32], mn[32];
        snprintf(bn, sizeof bn, "%s.blocks", names[ti]);
        snprintf(mn, sizeof mn, "%s.means", names[ti]);
        size_t nb, nm;
        uint8_t *blocks = tt_read_file(tt_fixture("kv-quant", bn), &nb);
        float *want = tt_read_file(tt_fixture("kv-quant", mn), &nm);
        cr_assert(nm == sizeof got && nb >= (size_t)tri__dtype_row_bytes(types[ti], ROWS * STRIDE));
        void *dx = up(gpu, blocks, nb);
        cr_assert_eq(gpu->ops->chunk_mean(gpu, dout, dx, types[ti], NC, CH, W, STRIDE), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, got, dout, sizeof got);
        for (int i = 0; i < NC * W; i++)
            cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s chunk %d, column %d: %.9g, numpy's %.9g",
                      names[ti], i / W, i % W, (double)got[i], (double)want[i]);
        gpu->ops->free(gpu, dx);
        free(blocks), free(want);
    }
    gpu->ops->free(gpu, dout);
    DONE();
}

Test(cuda_backend, convert_bit_exact) {
    NEED_GPU();
    // specials and rounding edges: ties, subnormal halves, overflow to inf, nan, -0
    float x[] = {1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 3.14159f, -0.0f, INFINITY, -INFINITY, NAN,
                 5.96046448e-8f, 2.98023224e-8f, 1.00048828f, 1.00146484f, 3.0e38f, -1.17549435e-38f};
    int64_t n = (int64_t)(sizeof x / sizeof x[0]);
    float big[3001];
    fill(big, 3001, 1000.0f);
    void *dx = up(gpu, x, sizeof x), *dbig = up(gpu, big, sizeof big), *dh = dalloc(gpu, 2 * sizeof big);
    for (tri_dtype t = TRI_DTYPE_F16; t <= TRI_DTYPE_BF16; t++) {
        uint16_t h[17], hb[3001];
        cr_assert_eq(gpu->ops->convert(gpu, dh, t, dx, n), TRI_STATUS_OK);
        down(gpu, h, dh, sizeof(uint16_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            uint16_t want = t == TRI_DTYPE_F16 ? tri__f32_to_f16(x[i]) : tri__f32_to_bf16(x[i]);
            cr_assert_eq(h[i], want, "%s of %g: 0x%04x, cpu 0x%04x", tri_dtype_name(t), (double)x[i], h[i], want);
        }
        cr_assert_eq(gpu->ops->convert(gpu, dh, t, dbig, 3001), TRI_STATUS_OK);
        down(gpu, hb, dh, sizeof hb);
        for (int64_t i = 0; i < 3001; i++)
            cr_assert_eq(hb[i], t == TRI_DTYPE_F16 ? tri__f32_to_f16(big[i]) : tri__f32_to_bf16(big[i]));
    }
    float back[17];
    cr_assert_eq(gpu->ops->convert(gpu, dh, TRI_DTYPE_F32, dx, n), TRI_STATUS_OK);
    down(gpu, back, dh, sizeof back);
    cr_assert_arr_eq(back, x, sizeof x);
    cr_assert_eq(gpu->ops->convert(gpu, dh, TRI_DTYPE_Q8_0, dx, n), TRI_STATUS_INVALID_ARGUMENT,
                 "17 values: no blocks");
    cr_assert_eq(gpu->ops->convert(gpu, dh, TRI_DTYPE_Q4_1, dx, 16), TRI_STATUS_UNSUPPORTED);
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dbig);
    gpu->ops->free(gpu, dh);
    DONE();
}

// A quantized KV cache's rows: convert and set_rows to Q8_0 / Q4_0 give tri__quantize_row's blocks
// bit for bit (that function is checked against the gguf package in the kv-quant suite): random
// blocks at several scales, codes at exact halves (roundf's ties away from zero, Q4_0's + 8.5),
// the largest magnitude twice with both signs (Q4_0 takes the first), zero and -0 blocks,
// subnormal and huge scales, and NaN and infinities (first and later in a block).
static void quant_blocks(float *x, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float *y = x + b * 32;
        float scale = b % 5 == 0 ? 1e-6f : b % 5 == 1 ? 1.0f : b % 5 == 2 ? 300.0f : b % 5 == 3 ? 1e-38f : 3e4f;
        for (int e = 0; e < 32; e++) y[e] = frand() * scale;
        switch (b % 16) {
        case 0:
            for (int e = 0; e < 32; e++) y[e] = 0.0f;
            break;
        case 1:
            for (int e = 0; e < 32; e++) y[e] = -0.0f;
            break;
        case 2: y[3] = 8.0f, y[20] = -8.0f; break;  // ties of magnitude: the first wins (Q4_0 d = -1)
        case 3: y[0] = -8.0f, y[31] = 8.0f; break;
        case 4:  // exact halves: Q8_0 with amax 127 (d 1), Q4_0 with max -8 (d 1, x + 8.5 at .5 + .5)
            for (int e = 0; e < 32; e++) y[e] = (float)(e % 9) - 4.5f;
            y[7] = 127.0f, y[8] = -8.0f;
            break;
        case 5: y[5] = NAN; break;
        case 6: y[0] = NAN; break;
        case 7: y[9] = INFINITY; break;
        case 8: y[0] = -INFINITY, y[1] = INFINITY; break;
        case 9:
            for (int e = 0; e < 32; e++) y[e] = NAN;
            break;
        case 10:  // all equal
            for (int e = 0; e < 32; e++) y[e] = 2.5f;
            break;
        default: break;
        }
    }
}

Test(cuda_backend, convert_and_set_rows_quantized_bit_exact) {
    NEED_GPU();
    enum { NB = 100, ROW = 96, M = 5, SLOTS = 11 };  // convert: 100 blocks; set_rows: 5 rows of 3 blocks
    float x[NB * 32];
    quant_blocks(x, NB);
    float *dx = up(gpu, x, sizeof x);
    const tri_dtype types[2] = {TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const tri_dtype t = types[ti];
        const size_t bytes = (size_t)tri__dtype_row_bytes(t, NB * 32), rb = (size_t)tri__dtype_row_bytes(t, ROW);
        uint8_t *want = malloc(bytes), *got = malloc(bytes);
        void *dq = dalloc(gpu, bytes);
        cr_assert(tri__quantize_row(want, x, t, NB * 32));
        for (int64_t n = 32; n <= NB * 32; n += NB * 32 - 32) {  // one block, and every block
            cr_assert_eq(gpu->ops->convert(gpu, dq, t, dx, n), TRI_STATUS_OK, "%s", tri_last_error());
            down(gpu, got, dq, (size_t)tri__dtype_row_bytes(t, n));
            for (int64_t b = 0; b < n / 32; b++) {
                size_t bb = (size_t)tri__dtype_block_bytes(t);
                cr_assert(memcmp(got + b * bb, want + b * bb, bb) == 0,
                          "%s block %lld (x[0] %g, x[1] %g): not tri__quantize_row's bytes", tri_dtype_name(t),
                          (long long)b, (double)x[b * 32], (double)x[b * 32 + 1]);
            }
        }
        // set_rows: row i of x's first M rows of ROW values into store row rows[i] of SLOTS
        int32_t rows[M] = {7, 0, 10, 3, 4}, *drows = up(gpu, rows, sizeof rows);
        uint8_t *store = malloc(rb * SLOTS), *hstore = malloc(rb * SLOTS);
        memset(store, 0x5a, rb * SLOTS);
        void *dstore = up(gpu, store, rb * SLOTS);
        cr_assert_eq(gpu->ops->set_rows(gpu, dstore, t, dx, drows, M, ROW), TRI_STATUS_OK, "%s", tri_last_error());
        down(gpu, hstore, dstore, rb * SLOTS);
        for (int i = 0; i < M; i++) cr_assert(tri__quantize_row(store + rows[i] * rb, x + i * ROW, t, ROW));
        cr_assert(memcmp(hstore, store, rb * SLOTS) == 0,
                  "%s set_rows: not tri__quantize_row's rows (others untouched)", tri_dtype_name(t));
        cr_assert_eq(gpu->ops->set_rows(gpu, dstore, t, dx, drows, M, 40), TRI_STATUS_INVALID_ARGUMENT,
                     "rows of 40 values are not whole blocks");
        cr_assert_eq(gpu->ops->convert(gpu, dq, t, dx, 48), TRI_STATUS_INVALID_ARGUMENT);
        gpu->ops->free(gpu, dq);
        gpu->ops->free(gpu, dstore);
        gpu->ops->free(gpu, drows);
        free(want), free(got), free(store), free(hstore);
    }
    gpu->ops->free(gpu, dx);
    DONE();
}

Test(cuda_backend, rmsnorm_every_weight_type) {
    NEED_GPU();
    static const int64_t shapes[][2] = {{3, 77}, {1, 4096}, {70, 1}, {2, 16384}};
    for (size_t sh = 0; sh < 4; sh++) {
        int64_t m = shapes[sh][0], n = shapes[sh][1];
        float *x = malloc(sizeof(float) * (size_t)(m * n)), *w = malloc(sizeof(float) * (size_t)n);
        float *y = malloc(sizeof(float) * (size_t)(m * n)), *yc = malloc(sizeof(float) * (size_t)(m * n));
        fill(x, m * n, 4.0f);
        fill(w, n, 2.0f);
        float *dx = up(gpu, x, sizeof(float) * (size_t)(m * n)), *dy = dalloc(gpu, sizeof(float) * (size_t)(m * n));
        for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_BF16; t++) {
            void *e = encode(w, 1, n, t);
            void *de = up(gpu, e, (size_t)tri__dtype_row_bytes(t, n));
            cr_assert_eq(gpu->ops->rmsnorm(gpu, dy, dx, de, t, m, n, 1e-5f), TRI_STATUS_OK);
            down(gpu, y, dy, sizeof(float) * (size_t)(m * n));
            cr_assert_eq(cpu->ops->rmsnorm(cpu, yc, x, e, t, m, n, 1e-5f), TRI_STATUS_OK);
            // the same double sum of squares; only its summation order differs: 2e-6 relative
            for (int64_t j = 0; j < m * n; j++)
                cr_assert(fabsf(y[j] - yc[j]) <= 2e-6f * fabsf(yc[j]) + 1e-7f, "%s (%lld, %lld) [%lld] %g vs %g",
                          tri_dtype_name(t), (long long)m, (long long)n, (long long)j, (double)y[j], (double)yc[j]);
            // in place gives the same
            cr_assert_eq(gpu->ops->copy(gpu, dy, dx, sizeof(float) * (size_t)(m * n)), TRI_STATUS_OK);
            cr_assert_eq(gpu->ops->rmsnorm(gpu, dy, dy, de, t, m, n, 1e-5f), TRI_STATUS_OK);
            float *y2 = malloc(sizeof(float) * (size_t)(m * n));
            down(gpu, y2, dy, sizeof(float) * (size_t)(m * n));
            cr_assert_arr_eq(y2, y, sizeof(float) * (size_t)(m * n));
            free(y2);
            gpu->ops->free(gpu, de);
            free(e);
        }
        gpu->ops->free(gpu, dx);
        gpu->ops->free(gpu, dy);
        free(x), free(w), free(y), free(yc);
    }
    DONE();
}

Test(cuda_backend, swiglu_and_add) {
    NEED_GPU();
    int64_t n = 100003;  // more than one grid-stride pass is not needed, but a ragged last block is
    float *g = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
    float *o = malloc(sizeof(float) * (size_t)n), *oc = malloc(sizeof(float) * (size_t)n);
    fill(g, n, 10.0f);
    fill(u, n, 3.0f);
    float *dg = up(gpu, g, sizeof(float) * (size_t)n), *du = up(gpu, u, sizeof(float) * (size_t)n);
    float *dout = dalloc(gpu, sizeof(float) * (size_t)n);
    cr_assert_eq(gpu->ops->swiglu(gpu, dout, dg, du, n), TRI_STATUS_OK);
    down(gpu, o, dout, sizeof(float) * (size_t)n);
    cr_assert_eq(cpu->ops->swiglu(cpu, oc, g, u, n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++)  // expf within 2 ulp on both sides
        cr_assert(fabsf(o[i] - oc[i]) <= 1e-6f * fabsf(oc[i]) + 1e-7f, "[%lld] %g vs %g", (long long)i, (double)o[i],
                  (double)oc[i]);
    cr_assert_eq(gpu->ops->add(gpu, dg, dg, du, n), TRI_STATUS_OK);  // out == a
    down(gpu, o, dg, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(o[i], g[i] + u[i]);
    gpu->ops->free(gpu, dg);
    gpu->ops->free(gpu, du);
    gpu->ops->free(gpu, dout);
    free(g), free(u), free(o), free(oc);
    DONE();
}

// The families' ops (model/family.h) against the CPU's: GeGLU, the embedding scale, row biases.
Test(cuda_backend, family_ops) {
    NEED_GPU();
    int64_t n = 10007, rows = 13, cols = 769;  // rows x cols == 9997 < n
    float *g = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
    float *o = malloc(sizeof(float) * (size_t)n), *oc = malloc(sizeof(float) * (size_t)n);
    fill(g, n, 10.0f);
    fill(u, n, 3.0f);
    float *dg = up(gpu, g, sizeof(float) * (size_t)n), *du = up(gpu, u, sizeof(float) * (size_t)n);
    float *dout = dalloc(gpu, sizeof(float) * (size_t)n);
    cr_assert_eq(gpu->ops->geglu(gpu, dout, dg, du, n), TRI_STATUS_OK);
    down(gpu, o, dout, sizeof(float) * (size_t)n);
    cr_assert_eq(cpu->ops->geglu(cpu, oc, g, u, n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++)  // tanhf within a few ulp on both sides
        cr_assert(fabsf(o[i] - oc[i]) <= 2e-6f * fabsf(oc[i]) + 1e-6f, "[%lld] %g vs %g", (long long)i, (double)o[i],
                  (double)oc[i]);
    cr_assert_eq(gpu->ops->scale(gpu, dg, n, 45.254833f), TRI_STATUS_OK);
    down(gpu, o, dg, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(o[i], g[i] * 45.254833f);
    cr_assert_eq(gpu->ops->add_rows(gpu, dout, du, rows, cols), TRI_STATUS_OK);
    down(gpu, o, dout, sizeof(float) * (size_t)n);
    memcpy(oc, o, sizeof(float) * (size_t)n);
    float *dg2 = up(gpu, g, sizeof(float) * (size_t)n);  // dout again without the biases
    cr_assert_eq(gpu->ops->geglu(gpu, dout, dg2, du, n), TRI_STATUS_OK);
    float *plain = malloc(sizeof(float) * (size_t)n);
    down(gpu, plain, dout, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < rows * cols; i++) cr_assert_eq(oc[i], plain[i] + u[i % cols]);
    for (int64_t i = rows * cols; i < n; i++) cr_assert_eq(oc[i], plain[i]);  // past the rows: untouched
    gpu->ops->free(gpu, dg);
    gpu->ops->free(gpu, dg2);
    gpu->ops->free(gpu, du);
    gpu->ops->free(gpu, dout);
    free(g), free(u), free(o), free(oc), free(plain);
    DONE();
}

// ---- rope ----

Test(cuda_backend, rope_both_layouts_every_rule) {
    NEED_GPU();
    // head_dim 128 (Llama-2), 64 and 96 (YaRN given), positions up to 128K
    static const struct {
        int32_t hd;
        float theta;
        tri_rope_scaling sc;
        float factor;
        int32_t orig;
    } cfgs[] = {{128, 10000, TRI_ROPE_SCALING_YARN, 32, 4096},
                {128, 500000, TRI_ROPE_SCALING_LLAMA3, 8, 8192},
                {64, 10000, TRI_ROPE_SCALING_NONE, 1, 0},
                {96, 10000, TRI_ROPE_SCALING_DYNAMIC, 2, 2048}};
    int64_t m = 7, nh = 5;
    int32_t pos[7] = {0, 1, 17, 4095, 4096, 65537, 131071};
    for (size_t ci = 0; ci < 4; ci++) {
        tri_model_config c;
        memset(&c, 0, sizeof c);
        c.head_dim = cfgs[ci].hd;
        c.rope_theta = cfgs[ci].theta;
        c.rope_scaling = cfgs[ci].sc;
        c.rope_factor = cfgs[ci].factor;
        c.rope_orig_ctx = cfgs[ci].orig;
        c.llama3_low_freq_factor = 1;
        c.llama3_high_freq_factor = 4;
        tri__rope r;
        cr_assert_eq(tri__rope_init(&r, &c, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        tri__rope_set_prompt(&r, 131072);
        int64_t len = m * nh * c.head_dim;
        float *x = malloc(sizeof(float) * (size_t)len), *xg = malloc(sizeof(float) * (size_t)len);
        fill(x, len, 3.0f);
        float *dx = dalloc(gpu, sizeof(float) * (size_t)len);
        for (int l = 0; l < 2; l++) {
            r.layout = (tri_rope_layout)l;
            cr_assert_eq(gpu->ops->copy_to_backend(gpu, dx, x, sizeof(float) * (size_t)len), TRI_STATUS_OK);
            cr_assert_eq(gpu->ops->rope(gpu, dx, m, nh, pos, &r), TRI_STATUS_OK, "%s", tri_last_error());
            down(gpu, xg, dx, sizeof(float) * (size_t)len);
            float *xc = malloc(sizeof(float) * (size_t)len);
            memcpy(xc, x, sizeof(float) * (size_t)len);
            cr_assert_eq(cpu->ops->rope(cpu, xc, m, nh, pos, &r), TRI_STATUS_OK);
            // the same float32 angle; sincosf and cosf/sinf within 2 ulp each
            for (int64_t i = 0; i < len; i++)
                cr_assert(fabsf(xg[i] - xc[i]) <= 2e-6f * (1 + fabsf(xc[i])), "cfg %zu layout %d [%lld] %g vs %g", ci,
                          l, (long long)i, (double)xg[i], (double)xc[i]);
            free(xc);
        }
        // a changed table at the same address is picked up (a new context's length rules)
        tri__rope_set_prompt(&r, 100);
        cr_assert_eq(gpu->ops->copy_to_backend(gpu, dx, x, sizeof(float) * (size_t)len), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->rope(gpu, dx, m, nh, pos, &r), TRI_STATUS_OK);
        down(gpu, xg, dx, sizeof(float) * (size_t)len);
        cr_assert_eq(cpu->ops->rope(cpu, x, m, nh, pos, &r), TRI_STATUS_OK);
        for (int64_t i = 0; i < len; i++) cr_assert(fabsf(xg[i] - x[i]) <= 2e-6f * (1 + fabsf(x[i])));
        int32_t bad = -1;
        cr_assert_eq(gpu->ops->rope(gpu, dx, 1, nh, &bad, &r), TRI_STATUS_INVALID_ARGUMENT);
        gpu->ops->free(gpu, dx);
        free(x), free(xg);
        tri__rope_free(&r);
    }
    DONE();
}

// ---- softmax, top-k ----

Test(cuda_backend, softmax_with_temperature_and_masked_entries) {
    NEED_GPU();
    static const int64_t ns[] = {1, 203, 32000, 131072};
    for (size_t a = 0; a < 4; a++) {
        int64_t m = 3, n = ns[a];
        float *x = malloc(sizeof(float) * (size_t)(m * n)), *xg = malloc(sizeof(float) * (size_t)(m * n));
        fill(x, m * n, 30.0f);
        if (n > 5) x[5] = -INFINITY, x[n + n - 2] = -INFINITY;
        float *dx = up(gpu, x, sizeof(float) * (size_t)(m * n));
        cr_assert_eq(gpu->ops->softmax(gpu, dx, m, n, 0.7f), TRI_STATUS_OK);
        down(gpu, xg, dx, sizeof(float) * (size_t)(m * n));
        cr_assert_eq(cpu->ops->softmax(cpu, x, m, n, 0.7f), TRI_STATUS_OK);
        // the same max, expf and double sum (in another order): 1e-6 relative
        for (int64_t j = 0; j < m * n; j++)
            cr_assert(fabsf(xg[j] - x[j]) <= 1e-6f * x[j] + 1e-12f, "n=%lld [%lld] %g vs %g", (long long)n,
                      (long long)j, (double)xg[j], (double)x[j]);
        if (n > 5) cr_assert_eq(xg[5], 0.0f);
        gpu->ops->free(gpu, dx);
        free(x), free(xg);
    }
    // an all -inf row: known only on the device, so synchronize reports it, once
    float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    float *dm = up(gpu, all_masked, sizeof all_masked);
    cr_assert_eq(gpu->ops->softmax(gpu, dm, 1, 3, 1.0f), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->softmax(gpu, dm, 1, 3, 0.0f), TRI_STATUS_INVALID_ARGUMENT);
    gpu->ops->free(gpu, dm);
    DONE();
}

static void check_top_k(tri__backend *gpu, tri__backend *cpu, const float *x, int64_t m, int64_t n, int64_t k) {
    float *v = malloc(sizeof(float) * (size_t)(m * k)), *vc = malloc(sizeof(float) * (size_t)(m * k));
    int32_t *ix = malloc(sizeof(int32_t) * (size_t)(m * k)), *ic = malloc(sizeof(int32_t) * (size_t)(m * k));
    float *dx = up(gpu, x, sizeof(float) * (size_t)(m * n)), *dv = dalloc(gpu, sizeof(float) * (size_t)(m * k));
    int32_t *di = dalloc(gpu, sizeof(int32_t) * (size_t)(m * k));
    cr_assert_eq(gpu->ops->top_k(gpu, dv, di, dx, m, n, k), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, v, dv, sizeof(float) * (size_t)(m * k));
    down(gpu, ix, di, sizeof(int32_t) * (size_t)(m * k));
    cr_assert_eq(cpu->ops->top_k(cpu, vc, ic, x, m, n, k), TRI_STATUS_OK);
    // exact: the same order (value, NaN last, lower index first)
    for (int64_t j = 0; j < m * k; j++) {
        cr_assert_eq(ix[j], ic[j], "n=%lld k=%lld [%lld]: %d vs cpu %d", (long long)n, (long long)k, (long long)j, ix[j],
                     ic[j]);
        cr_assert(v[j] == vc[j] || (isnan(v[j]) && isnan(vc[j])));
    }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dv);
    gpu->ops->free(gpu, di);
    free(v), free(vc), free(ix), free(ic);
}

Test(cuda_backend, top_k_ties_nan_and_signed_zero) {
    NEED_GPU();
    int64_t m = 2, n = 300;
    float x[2 * 300];
    for (int64_t i = 0; i < m * n; i++) x[i] = (float)(int)(frand() * 20);  // many ties, +0 and -0
    x[7] = NAN;
    x[n + 3] = INFINITY;
    x[11] = -0.0f;
    x[n + 9] = -INFINITY;
    static const int64_t ks[] = {1, 5, 64, 65, 300};
    for (size_t a = 0; a < 5; a++) check_top_k(gpu, cpu, x, m, n, ks[a]);
    float v1;
    int32_t i1;
    cr_assert_eq(gpu->ops->top_k(gpu, &v1, &i1, x, 1, n, 0), TRI_STATUS_INVALID_ARGUMENT);
    DONE();
}

Test(cuda_backend, top_k_vocabulary_rows) {
    NEED_GPU();
    // 4097 and 128256 columns: padded past the shared-memory limit, sorted in global memory
    static const int64_t ns[] = {4096, 4097, 128256};
    for (size_t a = 0; a < 3; a++) {
        int64_t m = 3, n = ns[a];
        float *x = malloc(sizeof(float) * (size_t)(m * n));
        fill(x, m * n, 8.0f);
        for (int64_t j = 0; j < m * n; j += 97) x[j] = 3.0f;  // ties
        check_top_k(gpu, cpu, x, m, n, 40);
        check_top_k(gpu, cpu, x, m, n, n);  // a whole sorted row (top-p)
        free(x);
    }
    DONE();
}

// Rows longer than 4,096 take the radix select: ties across thousands of columns at the k-th
// value (the select narrows down to the column bits), NaN, +-inf and -0 among them, k from 1 to the
// whole row, and k past 4,096 (the selected keys sorted in global scratch), against the CPU.
Test(cuda_backend, top_k_radix_select_long_rows) {
    NEED_GPU();
    int64_t m = 3, n = 9000;
    float *x = malloc(sizeof(float) * (size_t)(m * n));
    for (int64_t i = 0; i < m * n; i++) x[i] = (float)(int)(frand() * 4);  // 4 values: thousands of ties
    x[5] = NAN, x[n + 1] = NAN, x[17] = -0.0f, x[2 * n + 8] = INFINITY, x[2 * n + 4000] = -INFINITY;
    for (int64_t j = 0; j < n; j += 2) x[2 * n + j] = -(float)j;  // row 2: distinct values too
    static const int64_t ks[] = {1, 2, 37, 2500, 4096, 4097, 6000, 9000};
    for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++) check_top_k(gpu, cpu, x, m, n, ks[a]);
    for (int64_t i = 0; i < m * n; i++) x[i] = 1.5f;  // every column ties
    check_top_k(gpu, cpu, x, m, n, 40);
    check_top_k(gpu, cpu, x, m, n, 8999);
    free(x);
    DONE();
}

// ---- attention ----

// The attention-logit soft-cap the next views and naive_attn apply (Gemma 2); 0: none.
static float test_softcap = 0;

static void naive_attn(const float *q, int32_t qpos, int64_t hd, int64_t nk, const int32_t *kpos, const float *k,
                       const float *v, double *out, double *wsum) {
    double mx = -INFINITY, sum = 0;
    double *s = malloc(sizeof(double) * (size_t)(nk > 0 ? nk : 1));
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

// A layer's cache: per KV head nk keys with positions kpos (0 .. nk/2 - 1, then 1000 + j), stored
// as f32 or f16 rows of stride hd + 3, or Q8_0 / Q4_0 rows of stride hd + 32 (whole blocks, the
// padding quantized too), in host memory (ks, vs) and on the device (dks, dvs); k and v hold the
// values the rows hold (rounded to f16, or dequantized).
typedef struct test_cache {
    int64_t nkv, nk, hd, stride;
    tri_dtype type;
    float *k, *v;
    void *ks, *vs, *dks, *dvs;
    int32_t *kpos;
} test_cache;

static void cache_make(tri__backend *gpu, test_cache *c, int64_t nkv, int64_t nk, int64_t hd, tri_dtype type,
                       float kscale) {
    const bool quant = type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;
    c->nkv = nkv, c->nk = nk, c->hd = hd, c->stride = quant ? hd + 32 : hd + 3, c->type = type;
    size_t bytes = (size_t)tri__dtype_row_bytes(type, nkv * nk * c->stride);
    c->k = malloc(sizeof(float) * (size_t)(nkv * nk * hd));
    c->v = malloc(sizeof(float) * (size_t)(nkv * nk * hd));
    c->ks = calloc(bytes, 1);
    c->vs = calloc(bytes, 1);
    c->kpos = malloc(sizeof(int32_t) * (size_t)nk);
    for (int64_t j = 0; j < nk; j++) c->kpos[j] = (int32_t)(j < nk / 2 ? j : 1000 + j);
    if (quant) {  // rows quantized as the cache writes them, then the values they hold
        float *row = malloc(sizeof(float) * (size_t)c->stride);
        for (int64_t r = 0; r < nkv * nk; r++)
            for (int w = 0; w < 2; w++) {
                for (int64_t e = 0; e < c->stride; e++) row[e] = frand() * (w ? 2.0f : kscale);
                uint8_t *dst = (uint8_t *)(w ? c->vs : c->ks) + tri__dtype_row_bytes(type, r * c->stride);
                cr_assert(tri__quantize_row(dst, row, type, c->stride));
                tri__dequantize_row(row, dst, type, c->stride);
                memcpy((w ? c->v : c->k) + r * hd, row, sizeof(float) * (size_t)hd);
            }
        free(row);
    } else {
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
    c->dks = up(gpu, c->ks, bytes);
    c->dvs = up(gpu, c->vs, bytes);
}

static void cache_free(tri__backend *gpu, test_cache *c) {
    gpu->ops->free(gpu, c->dks);
    gpu->ops->free(gpu, c->dvs);
    free(c->k), free(c->v), free(c->ks), free(c->vs), free(c->kpos);
}

// Spans for every head, cut at the given row indices (a piece whose positions are not consecutive,
// and every odd-numbered piece, carry explicit positions), over host (dev false) or device rows.
static void cache_view(const test_cache *c, bool dev, const int64_t *cuts, int n_cuts, tri__kv_span *spans,
                       int32_t *head_span, tri__kv_view *view) {
    const uint8_t *kbase = dev ? c->dks : c->ks, *vbase = dev ? c->dvs : c->vs;
    int32_t ns = 0;
    for (int64_t h = 0; h < c->nkv; h++) {
        head_span[h] = ns;
        for (int p = 0; p <= n_cuts; p++) {
            int64_t a = p == 0 ? 0 : cuts[p - 1], b = p == n_cuts ? c->nk : cuts[p];
            const uint8_t *kb = kbase + tri__dtype_row_bytes(c->type, (h * c->nk + a) * c->stride);
            const uint8_t *vb = vbase + tri__dtype_row_bytes(c->type, (h * c->nk + a) * c->stride);
            bool consecutive = b == a || c->kpos[b - 1] - c->kpos[a] == b - 1 - a;
            spans[ns++] = (tri__kv_span){.pos0 = a < c->nk ? c->kpos[a] : 0, .n = (int32_t)(b - a), .k = kb, .v = vb,
                                         .stride = c->stride, .pos = (consecutive && p % 2 == 0) ? NULL : c->kpos + a};
        }
    }
    head_span[c->nkv] = ns;
    *view = (tri__kv_view){
        .type = c->type, .n_head_kv = (int32_t)c->nkv, .spans = spans, .head_span = head_span, .softcap = test_softcap};
}

// Output within 2e-5 (1 + |ref|) of the double reference and 4e-5 (1 + |cpu|) of the CPU backend;
// weight sums within 1e-5 (1 + ref) of the reference (over quantized rows too).
static void check_attention(tri__backend *gpu, tri__backend *cpu, tri_dtype type, int64_t nh, int64_t nkv, int64_t hd,
                            int64_t nk, const int64_t *cuts, int n_cuts, float kscale) {
    int64_t m = 4, g = nh / nkv;
    test_cache c;
    cache_make(gpu, &c, nkv, nk, hd, type, kscale);
    float *q = malloc(sizeof(float) * (size_t)(m * nh * hd)), *out = malloc(sizeof(float) * (size_t)(m * nh * hd));
    float *outc = malloc(sizeof(float) * (size_t)(m * nh * hd));
    fill(q, m * nh * hd, 1.0f);
    int32_t qpos[4] = {3, 500, (int32_t)(1000 + nk - 5), 1 << 20};
    int n_spans = (int)nkv * (n_cuts + 1);
    tri__kv_span *spans = malloc(sizeof *spans * (size_t)n_spans), *hspans = malloc(sizeof *hspans * (size_t)n_spans);
    int32_t *head_span = malloc(sizeof(int32_t) * (size_t)(nkv + 1)), *hhead = malloc(sizeof(int32_t) * (size_t)(nkv + 1));
    tri__kv_view view, hview;
    cache_view(&c, true, cuts, n_cuts, spans, head_span, &view);
    cache_view(&c, false, cuts, n_cuts, hspans, hhead, &hview);
    float *dq = up(gpu, q, sizeof(float) * (size_t)(m * nh * hd)), *dout = dalloc(gpu, sizeof(float) * (size_t)(m * nh * hd));
    float *dws = dalloc(gpu, sizeof(float) * (size_t)(nkv * nk)), *ws = malloc(sizeof(float) * (size_t)(nkv * nk));
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, m, nh, hd, &view, dws), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, out, dout, sizeof(float) * (size_t)(m * nh * hd));
    down(gpu, ws, dws, sizeof(float) * (size_t)(nkv * nk));
    cr_assert_eq(cpu->ops->attention(cpu, outc, q, qpos, m, nh, hd, &hview, NULL), TRI_STATUS_OK);
    double *wref = calloc((size_t)(nkv * nk), sizeof(double)), *ref = malloc(sizeof(double) * (size_t)hd);
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kh = h / g;
            naive_attn(q + (i * nh + h) * hd, qpos[i], hd, nk, c.kpos, c.k + kh * nk * hd, c.v + kh * nk * hd, ref,
                       wref + kh * nk);
            for (int64_t e = 0; e < hd; e++) {
                float got = out[(i * nh + h) * hd + e], cv = outc[(i * nh + h) * hd + e];
                cr_assert(fabs(got - ref[e]) <= 2e-5 * (1 + fabs(ref[e])),
                          "%s nh=%lld nkv=%lld hd=%lld nk=%lld q%lld h%lld [%lld] %g vs %g", tri_dtype_name(type),
                          (long long)nh, (long long)nkv, (long long)hd, (long long)nk, (long long)i, (long long)h,
                          (long long)e, (double)got, ref[e]);
                cr_assert(fabsf(got - cv) <= 4e-5f * (1 + fabsf(cv)), "vs cpu %g %g", (double)got, (double)cv);
            }
        }
    for (int64_t j = 0; j < nkv * nk; j++)
        cr_assert(fabs(ws[j] - wref[j]) <= 1e-5 * (1 + wref[j]), "weight sum %lld: %g vs %g", (long long)j,
                  (double)ws[j], wref[j]);
    gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    gpu->ops->free(gpu, dws);
    free(q), free(out), free(outc), free(ws), free(wref), free(ref);
    free(spans), free(hspans), free(head_span), free(hhead);
    cache_free(gpu, &c);
}

Test(cuda_backend, attention_gqa_spans) {
    NEED_GPU();
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
        int64_t cuts20[3] = {1, 17, 18}, cuts601[3] = {1, 307, 599};
        check_attention(gpu, cpu, t, 6, 2, 40, 20, cuts20, 3, 1.0f);
        check_attention(gpu, cpu, t, 6, 2, 40, 601, cuts601, 3, 3.0f);  // several chunks, peaked scores
        check_attention(gpu, cpu, t, 32, 8, 128, 601, cuts601, 3, 1.0f);  // Llama-3 grouping, head_dim 128
        check_attention(gpu, cpu, t, 9, 3, 64, 601, NULL, 0, 1.0f);       // SmolLM2: one span per head
        check_attention(gpu, cpu, t, 4, 4, 256, 300, cuts601, 1, 1.0f);    // MHA, head_dim 256
    }
    DONE();
}

// Gemma 2's soft-capped scores (a cap of 1.5 that bites): output and weight sums against the
// double reference and the CPU backend, f32 and f16 rows, several chunks.
Test(cuda_backend, attention_softcap) {
    NEED_GPU();
    test_softcap = 1.5f;
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
        int64_t cuts601[3] = {1, 307, 599};
        check_attention(gpu, cpu, t, 6, 2, 40, 601, cuts601, 3, 3.0f);
        check_attention(gpu, cpu, t, 8, 2, 64, 2600, cuts601, 3, 2.0f);
    }
    test_softcap = 0;
    DONE();
}

// Q8_0 and Q4_0 rows read in place (row stride hd + 32, spans cut with explicit positions, GQA
// groups of 1, 3, 4 and 8, head_dim 32 to 256), against the double reference over the values
// the blocks hold and the CPU's attention over the same blocks; attention_dev (q_pos in device
// memory) gives attention's bits; misplaced rows are refused.
Test(cuda_backend, attention_quantized_rows) {
    NEED_GPU();
    const tri_dtype types[2] = {TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const tri_dtype t = types[ti];
        int64_t cuts20[3] = {1, 17, 18}, cuts601[3] = {1, 307, 599};
        check_attention(gpu, cpu, t, 6, 2, 64, 601, cuts601, 3, 3.0f);   // several chunks, peaked scores
        check_attention(gpu, cpu, t, 32, 8, 128, 300, cuts20, 3, 1.0f);  // Llama-3 grouping, head_dim 128
        check_attention(gpu, cpu, t, 9, 3, 32, 40, cuts20, 2, 1.0f);     // one block per row
        check_attention(gpu, cpu, t, 4, 4, 256, 100, NULL, 0, 1.0f);     // MHA, head_dim 256, one span
    }
    // attention_dev: the same kernels, the query positions read on the device
    test_cache c;
    cache_make(gpu, &c, 2, 70, 64, TRI_DTYPE_Q4_0, 1.0f);
    int64_t cuts[1] = {33};
    tri__kv_span spans[4];
    int32_t head_span[3], qpos[2] = {20, 1040};
    tri__kv_view view;
    cache_view(&c, true, cuts, 1, spans, head_span, &view);
    float q[2 * 6 * 64], a[2 * 6 * 64], b[2 * 6 * 64];
    fill(q, 2 * 6 * 64, 1.0f);
    float *dq = up(gpu, q, sizeof q), *dout = dalloc(gpu, sizeof a);
    int32_t *dpos = up(gpu, qpos, sizeof qpos);
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, a, dout, sizeof a);
    cr_assert_eq(gpu->ops->attention_dev(gpu, dout, dq, dpos, 2, 6, 64, &view), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, b, dout, sizeof b);
    cr_assert(memcmp(a, b, sizeof a) == 0, "attention_dev over q4_0 rows: not attention's bits");
    // refusals: a stride that is not whole blocks, a row that does not start a block, head_dim 48
    spans[0].stride = 70;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_INVALID_ARGUMENT);
    spans[0].stride = c.stride;
    spans[0].k = (const uint8_t *)spans[0].k + 1;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_INVALID_ARGUMENT);
    spans[0].k = (const uint8_t *)spans[0].k - 1;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 48, &view, NULL), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "q4_0") && strstr(tri_last_error(), "head_dim 48"), "%s", tri_last_error());
    gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    gpu->ops->free(gpu, dpos);
    cache_free(gpu, &c);
    DONE();
}

// A span of f32 or f16 rows at an address its kernels cannot read (a misaligned-address fault on a
// GPU is a sticky error that ends the context) is refused with INVALID_ARGUMENT naming the span,
// for keys and values, by attention and attention_dev, and the instance works on afterwards.
Test(cuda_backend, attention_refuses_misaligned_spans_of_every_type) {
    NEED_GPU();
    const tri_dtype types[4] = {TRI_DTYPE_F32, TRI_DTYPE_F16, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    const size_t off[4] = {2, 1, 1, 1};  // bytes: misaligned for each
    for (int ti = 0; ti < 4; ti++) {
        test_cache c;
        cache_make(gpu, &c, 2, 70, 64, types[ti], 1.0f);
        int64_t cuts[1] = {33};
        tri__kv_span spans[4];
        int32_t head_span[3], qpos[2] = {20, 69};
        tri__kv_view view;
        cache_view(&c, true, cuts, 1, spans, head_span, &view);
        float q[2 * 6 * 64], a[2 * 6 * 64], b[2 * 6 * 64];
        fill(q, 2 * 6 * 64, 1.0f);
        float *dq = up(gpu, q, sizeof q), *dout = dalloc(gpu, sizeof a);
        int32_t *dpos = up(gpu, qpos, sizeof qpos);
        cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, a, dout, sizeof a);
        for (int kv = 0; kv < 2; kv++) {
            const void **p = kv ? &spans[2].v : &spans[2].k;
            *p = (const uint8_t *)*p + off[ti];
            cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_INVALID_ARGUMENT,
                         "%s", tri_dtype_name(types[ti]));
            cr_assert(strstr(tri_last_error(), "span 2") && strstr(tri_last_error(), "aligned") &&
                          strstr(tri_last_error(), tri_dtype_name(types[ti])),
                      "%s", tri_last_error());
            cr_assert_eq(gpu->ops->attention_dev(gpu, dout, dq, dpos, 2, 6, 64, &view), TRI_STATUS_INVALID_ARGUMENT);
            *p = (const uint8_t *)*p - off[ti];
        }
        // nothing was launched: the same attention again gives the same bits
        cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 6, 64, &view, NULL), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, b, dout, sizeof b);
        cr_assert(memcmp(a, b, sizeof a) == 0, "%s: not the same bits after the refusals", tri_dtype_name(types[ti]));
        gpu->ops->free(gpu, dq);
        gpu->ops->free(gpu, dout);
        gpu->ops->free(gpu, dpos);
        cache_free(gpu, &c);
    }
    DONE();
}

Test(cuda_backend, attention_many_small_spans_and_empty_ones) {
    NEED_GPU();
    // a retrieval cache: spans of 8 keys (every other one with explicit positions), and an empty one
    int64_t cuts[80];
    int n = 0;
    for (int64_t a = 8; a < 640; a += 8) cuts[n++] = a;
    cuts[n++] = 640;  // 640 .. 640: an empty span
    check_attention(gpu, cpu, TRI_DTYPE_F16, 8, 2, 64, 640, cuts, n, 2.0f);
    DONE();
}

Test(cuda_backend, attention_causal_mask_and_nothing_visible) {
    NEED_GPU();
    int64_t hd = 8, nk = 10;
    float k[10 * 8], v[10 * 8], q[2 * 8], out[2 * 8];
    for (int64_t j = 0; j < nk; j++)
        for (int64_t e = 0; e < hd; e++) {
            k[j * hd + e] = j >= 5 ? 10.0f : 0.0f;
            v[j * hd + e] = j >= 5 ? 100.0f : (float)j;
        }
    for (int64_t e = 0; e < 2 * hd; e++) q[e] = 1.0f;
    void *dk = up(gpu, k, sizeof k), *dv = up(gpu, v, sizeof v);
    float *dq = up(gpu, q, sizeof q), *dout = dalloc(gpu, sizeof out);
    int32_t qpos[2] = {4, 9}, head_span[2] = {0, 1};
    tri__kv_span sp = {.pos0 = 0, .n = 10, .k = dk, .v = dv, .stride = hd};
    tri__kv_view view = {.type = TRI_DTYPE_F32, .n_head_kv = 1, .spans = &sp, .head_span = head_span};
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 2, 1, hd, &view, NULL), TRI_STATUS_OK);
    down(gpu, out, dout, sizeof out);
    for (int64_t e = 0; e < hd; e++) {
        cr_assert_float_eq(out[e], 2.0f, 1e-5f, "uniform over keys 0..4: mean 2, got %g", (double)out[e]);
        cr_assert_float_eq(out[hd + e], 100.0f, 1e-3f);
    }
    int32_t early = -1;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, &early, 1, 1, hd, &view, NULL), TRI_STATUS_OK);
    down(gpu, out, dout, sizeof(float) * (size_t)hd);
    for (int64_t e = 0; e < hd; e++) cr_assert_eq(out[e], 0.0f);
    // a head with no spans at all: zeros too
    int32_t none[2] = {0, 0};
    view.head_span = none;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 1, 1, hd, &view, NULL), TRI_STATUS_OK);
    down(gpu, out, dout, sizeof(float) * (size_t)hd);
    for (int64_t e = 0; e < hd; e++) cr_assert_eq(out[e], 0.0f);
    view.type = TRI_DTYPE_BF16;
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 1, 1, hd, &view, NULL), TRI_STATUS_UNSUPPORTED);
    gpu->ops->free(gpu, dk);
    gpu->ops->free(gpu, dv);
    gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    DONE();
}

Test(cuda_backend, attention_128k_keys) {
    NEED_GPU();
    // One decode query and a 3-token verification against 131072 F16 keys per KV head (Llama-2-7B
    // head_dim, 4 query heads over 2 KV heads to keep the double reference quick).
    int64_t nkv = 2, nh = 4, hd = 128, nk = 131072, g = nh / nkv, m = 3;
    size_t rows = (size_t)(nkv * nk * hd);
    uint16_t *ks = malloc(rows * 2), *vs = malloc(rows * 2);
    float *kf = malloc(rows * sizeof(float)), *vf = malloc(rows * sizeof(float));
    for (size_t i = 0; i < rows; i++) {
        ks[i] = tri__f32_to_f16(frand() * 2.0f);
        vs[i] = tri__f32_to_f16(frand());
        kf[i] = tri__f16_to_f32(ks[i]);
        vf[i] = tri__f16_to_f32(vs[i]);
    }
    int32_t *kpos = malloc(sizeof(int32_t) * (size_t)nk);
    for (int64_t j = 0; j < nk; j++) kpos[j] = (int32_t)j;
    float q[3 * 4 * 128], out[3 * 4 * 128];
    fill(q, m * nh * hd, 1.0f);
    int32_t qpos[3] = {131071, 131071, 70000};
    void *dk = up(gpu, ks, rows * 2), *dv = up(gpu, vs, rows * 2);
    float *dq = up(gpu, q, sizeof q), *dout = dalloc(gpu, sizeof out), *dws = dalloc(gpu, sizeof(float) * (size_t)(nkv * nk));
    tri__kv_span sp[2];
    int32_t head_span[3] = {0, 1, 2};
    for (int64_t h = 0; h < nkv; h++)
        sp[h] = (tri__kv_span){.pos0 = 0, .n = (int32_t)nk, .k = (uint16_t *)dk + h * nk * hd,
                               .v = (uint16_t *)dv + h * nk * hd, .stride = hd};
    tri__kv_view view = {.type = TRI_DTYPE_F16, .n_head_kv = (int32_t)nkv, .spans = sp, .head_span = head_span};
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, m, nh, hd, &view, dws), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, out, dout, sizeof out);
    float *ws = malloc(sizeof(float) * (size_t)(nkv * nk));
    down(gpu, ws, dws, sizeof(float) * (size_t)(nkv * nk));
    double ref[128], *wref = calloc((size_t)(nkv * nk), sizeof(double));
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kh = h / g;
            naive_attn(q + (i * nh + h) * hd, qpos[i], hd, nk, kpos, kf + kh * nk * hd, vf + kh * nk * hd, ref,
                       wref + kh * nk);
            for (int64_t e = 0; e < hd; e++)
                cr_assert(fabs(out[(i * nh + h) * hd + e] - ref[e]) <= 2e-5 * (1 + fabs(ref[e])), "q%lld h%lld [%lld] %g vs %g",
                          (long long)i, (long long)h, (long long)e, (double)out[(i * nh + h) * hd + e], ref[e]);
        }
    for (int64_t j = 0; j < nkv * nk; j++)
        cr_assert(fabs(ws[j] - wref[j]) <= 1e-5 * (1 + wref[j]), "weight sum %lld: %g vs %g", (long long)j, (double)ws[j],
                  wref[j]);
    gpu->ops->free(gpu, dk);
    gpu->ops->free(gpu, dv);
    gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    gpu->ops->free(gpu, dws);
    free(ks), free(vs), free(kf), free(vf), free(kpos), free(ws), free(wref);
    DONE();
}

// ---- uploads and per-launch limits ----

// Host descriptors (here token ids) are staged in pinned upload slots and copied with the op, so
// the caller may overwrite them as soon as the op returns. Forty ops are queued without a
// synchronize, five times the backend's eight slots: a slot refilled before the copy out of it
// ran would send a later op's ids, and the rows gathered by an earlier op would be wrong.
Test(cuda_backend, uploads_past_the_slots_without_synchronize) {
    NEED_GPU();
    enum { ROWS = 50, N = 64, OPS = 40, M = 3 };
    float *w = malloc(sizeof(float) * ROWS * N), *out = malloc(sizeof(float) * OPS * M * N);
    fill(w, ROWS * N, 1.0f);
    float *dw = up(gpu, w, sizeof(float) * ROWS * N), *dout = dalloc(gpu, sizeof(float) * OPS * M * N);
    int32_t ids[M];
    for (int op = 0; op < OPS; op++) {
        for (int j = 0; j < M; j++) ids[j] = (op * 7 + j * 13) % ROWS;
        cr_assert_eq(gpu->ops->get_rows(gpu, dout + op * M * N, dw, TRI_DTYPE_F32, ROWS, N, ids, M), TRI_STATUS_OK,
                     "%s", tri_last_error());
        for (int j = 0; j < M; j++) ids[j] = -1;  // reused at once, as a caller may
    }
    down(gpu, out, dout, sizeof(float) * OPS * M * N);
    for (int op = 0; op < OPS; op++)
        for (int j = 0; j < M; j++)
            for (int e = 0; e < N; e++)
                cr_assert_eq(out[(op * M + j) * N + e], w[((op * 7 + j * 13) % ROWS) * N + e], "op %d row %d [%d]",
                             op, j, e);
    gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dout);
    free(w), free(out);
    DONE();
}

// An op's host descriptors reach the device without queueing behind a transfer: with the
// emulator's copies in one FIFO copy engine (CUDAEMU_COPY_ENGINES=1, a GPU with one engine per
// direction), a copy on the transfer stream queued first (a layer's prefetch) is still pending
// when the op, waited for by an event on the compute stream, is done. Had the ids gone up by a
// copy, that copy would have waited for the transfer in the engine's FIFO.
Test(cuda_backend, uploads_do_not_queue_behind_a_transfer) {
    if (!TRI_CUDA_EMULATED) cr_skip_test("needs the emulated CUDA runtime (-Dcudaemu=true) for one FIFO copy engine");
    NEED_GPU();
    enum { ROWS = 50, N = 64, M = 3, BIG = 1 << 16 };
    float *w = malloc(sizeof(float) * ROWS * N), out[M * N];
    fill(w, ROWS * N, 1.0f);
    float *dw = up(gpu, w, sizeof(float) * ROWS * N), *dout = dalloc(gpu, sizeof(float) * M * N);
    float *dbig = dalloc(gpu, sizeof(float) * BIG), *hbig = NULL;
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_OK);
    cr_assert_eq(posix_memalign((void **)&hbig, 4096, sizeof(float) * BIG), 0);
    for (int i = 0; i < BIG; i++) hbig[i] = -1.0f;
    cr_assert_eq(gpu->ops->host_register(gpu, hbig, sizeof(float) * BIG), TRI_STATUS_OK, "%s", tri_last_error());
    tri__event *ev = NULL;
    cr_assert_eq(gpu->ops->event_create(gpu, &ev), TRI_STATUS_OK);
    int32_t ids[M] = {7, 0, 49};
    for (int i = 0; i < 8; i++)  // every staging slot allocated (cudaFreeHost, cudaHostAlloc wait for the device)
        cr_assert_eq(gpu->ops->get_rows(gpu, dout, dw, TRI_DTYPE_F32, ROWS, N, ids, M), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_OK);
    setenv("CUDAEMU_COPY_ENGINES", "1", 1);
    cr_assert_eq(gpu->ops->transfer_to_host(gpu, hbig, dbig, sizeof(float) * BIG), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->get_rows(gpu, dout, dw, TRI_DTYPE_F32, ROWS, N, ids, M), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(gpu->ops->event_record(gpu, ev, TRI_STREAM_COMPUTE), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->event_synchronize(gpu, ev), TRI_STATUS_OK);
    cr_assert(hbig[0] == -1.0f && hbig[BIG - 1] == -1.0f, "the op's descriptors waited for the transfer");
    down(gpu, out, dout, sizeof out);  // synchronizes both streams
    cr_assert(hbig[0] != -1.0f, "the transfer never ran");
    for (int j = 0; j < M; j++)
        for (int e = 0; e < N; e++) cr_assert_eq(out[j * N + e], w[ids[j] * N + e], "row %d [%d]", j, e);
    unsetenv("CUDAEMU_COPY_ENGINES");
    gpu->ops->event_destroy(gpu, ev);
    gpu->ops->host_unregister(gpu, hbig);
    free(hbig);
    gpu->ops->free(gpu, dbig);
    gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dout);
    free(w);
    DONE();
}

// Growing the descriptor buffers (the device argument buffer, a pinned staging slot) must not wait
// for the whole device: a device-wide cudaFree or cudaFreeHost would wait for the transfer
// stream's prefetch. On the emulator streams are deferred queues, so a transfer still queued after
// the op's own work completed shows that nothing waited for it; with CUDAEMU_MEMPOOLS=0 (a device
// without stream-ordered allocation) the argument buffer's cudaFree does.
Test(cuda_backend, grown_descriptors_do_not_wait_for_a_transfer) {
    if (!TRI_CUDA_EMULATED) cr_skip_test("needs the emulated CUDA runtime (-Dcudaemu=true): its streams are deferred");
    for (int pools = 1; pools >= 0; pools--) {
        setenv("CUDAEMU_MEMPOOLS", pools ? "1" : "0", 1);
        NEED_GPU();
        enum { ROWS = 50, BIG = 1 << 12 };
        const int64_t M = 400000;  // 1.6 MB of ids: past the first argument buffer and staging slot
        float w[ROWS], *out = malloc(sizeof(float) * (size_t)M);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)M);
        fill(w, ROWS, 1.0f);
        for (int64_t i = 0; i < M; i++) ids[i] = (int32_t)((i * 7) % ROWS);
        float *dw = up(gpu, w, sizeof w), *dout = dalloc(gpu, sizeof(float) * (size_t)M);
        float *dbig = dalloc(gpu, sizeof(float) * BIG), *hbig = NULL;
        // the first argument buffer and staging slot (1 MiB, 64 KiB), then the transfer
        cr_assert_eq(gpu->ops->get_rows(gpu, dout, dw, TRI_DTYPE_F32, ROWS, 1, ids, 3), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_OK);
        cr_assert_eq(posix_memalign((void **)&hbig, 4096, sizeof(float) * BIG), 0);
        for (int i = 0; i < BIG; i++) hbig[i] = -1.0f;
        cr_assert_eq(gpu->ops->host_register(gpu, hbig, sizeof(float) * BIG), TRI_STATUS_OK, "%s", tri_last_error());
        tri__event *ev = NULL;
        cr_assert_eq(gpu->ops->event_create(gpu, &ev), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->transfer_to_host(gpu, hbig, dbig, sizeof(float) * BIG), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->get_rows(gpu, dout, dw, TRI_DTYPE_F32, ROWS, 1, ids, M), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(gpu->ops->event_record(gpu, ev, TRI_STREAM_COMPUTE), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->event_synchronize(gpu, ev), TRI_STATUS_OK);
        if (pools)
            cr_assert(hbig[0] == -1.0f, "growing the descriptor buffers waited for the transfer stream");
        else
            cr_assert(hbig[0] != -1.0f, "without memory pools the argument buffer's cudaFree waits for the device");
        down(gpu, out, dout, sizeof(float) * (size_t)M);  // synchronizes both streams
        cr_assert(hbig[0] != -1.0f, "the transfer never ran");
        for (int64_t i = 0; i < M; i++) cr_assert_eq(out[i], w[ids[i]], "row %lld", (long long)i);
        gpu->ops->event_destroy(gpu, ev);
        gpu->ops->host_unregister(gpu, hbig);
        free(hbig);
        gpu->ops->free(gpu, dbig);
        gpu->ops->free(gpu, dw);
        gpu->ops->free(gpu, dout);
        free(out), free(ids);
        DONE();
    }
    unsetenv("CUDAEMU_MEMPOOLS");
}

// The tiled and batched paths, reached at test sizes by making each launch's limit tiny: attention
// one query per tile (its partials over a limit of 1 byte), top-k one row per launch over 4,096
// columns (sorted in global memory), and quantized weights dequantized one row per GEMM (m > 16).
// Each against the CPU and the naive references as the untiled tests check them.
Test(cuda_backend, tiles_and_batches_at_small_limits) {
    NEED_GPU();
    cr_assert_eq(tri__backend_cuda_set_limits(cpu, &(tri__cuda_limits){1, 1, 1}), TRI_STATUS_NOT_FOUND);
    cr_assert_eq(tri__backend_cuda_set_limits(gpu, &(tri__cuda_limits){1, 1, 1}), TRI_STATUS_OK, "%s",
                 tri_last_error());
    static const int64_t cuts[] = {7, 300, 301};
    check_attention(gpu, cpu, TRI_DTYPE_F16, 6, 2, 40, 601, cuts, 3, 2.0f);
    check_attention(gpu, cpu, TRI_DTYPE_F32, 9, 3, 64, 20, NULL, 0, 1.0f);
    int64_t m = 3, n = 5000;
    float *x = malloc(sizeof(float) * (size_t)(m * n));
    fill(x, m * n, 4.0f);
    check_top_k(gpu, cpu, x, m, n, 37);
    free(x);
    check_matmul(gpu, cpu, TRI_DTYPE_Q4_1, 20, 9, 64);
    check_matmul(gpu, cpu, TRI_DTYPE_Q8_0, 17, 5, 96);
    // 0 keeps a limit: back to the defaults' paths, same results
    cr_assert_eq(tri__backend_cuda_set_limits(gpu, &(tri__cuda_limits){0, 0, 0}), TRI_STATUS_OK);
    check_matmul(gpu, cpu, TRI_DTYPE_Q4_1, 20, 9, 64);
    DONE();
}

// A driver older than the runtime is named as such, not as "no device". The emulator plays such a
// driver (CUDAEMU_DRIVER, read before the module is loaded: each test runs in a process of its own).
Test(cuda_backend, driver_too_old_is_named) {
    if (!TRI_CUDA_EMULATED) cr_skip_test("needs the emulated CUDA runtime (-Dcudaemu=true) to play an old driver");
    setenv("CUDAEMU_DRIVER", "11080", 1);
    cr_assert_eq(tri__cuda_device_count(), 0);
    cr_assert(strstr(tri__cuda_unavailable(), "the NVIDIA driver supports CUDA 11.8, older than this build's CUDA "
                                              "runtime 13.0: update the driver"),
              "%s", tri__cuda_unavailable());
    tri__backend *be = NULL;
    cr_assert_eq(tri__backend_cuda_create(0, &be), TRI_STATUS_DEVICE);
    cr_assert(strstr(tri_last_error(), "older than this build's CUDA runtime"), "%s", tri_last_error());
}

// A GPU our kernels cannot run on (no SASS for it, no PTX it can compile): the automatic choice
// falls back to the CPU and the log says why; a device named explicitly fails at its first op,
// naming the CUDA error.
static char fallback_log[1024];
static void fallback_log_fn(tri_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == TRI_LOG_LEVEL_WARN) snprintf(fallback_log, sizeof fallback_log, "%s", msg);
}
Test(cuda_backend, auto_device_without_a_kernel_image_falls_back_to_the_cpu) {
    if (!TRI_CUDA_EMULATED)
        cr_skip_test("needs the emulated CUDA runtime (-Dcudaemu=true) to play a GPU without a kernel image");
    if (tri__cuda_device_count() == 0) cr_skip_test("no CUDA device: %s", tri__cuda_unavailable());
    tri__backend *be = NULL;
    char name[16];
    // the GPU works: the automatic choice is the GPU
    cr_assert_eq(tri__backend_select(TRI_DEVICE_AUTO, 0, 1, &be, name), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_str_eq(name, "cuda:0");
    cr_assert(!be->host_memory);
    tri__backend_free(be);
    setenv("CUDAEMU_NO_KERNEL_IMAGE", "1", 1);
    tri_log_set(fallback_log_fn, NULL, TRI_LOG_LEVEL_WARN);
    cr_assert_eq(tri__backend_select(TRI_DEVICE_AUTO, 0, 1, &be, name), TRI_STATUS_OK, "%s", tri_last_error());
    tri_log_set(NULL, NULL, TRI_LOG_LEVEL_WARN);
    cr_assert_str_eq(name, "cpu");
    cr_assert(be->host_memory);
    cr_assert(strstr(fallback_log, "cuda:0 was chosen automatically, but its first kernel failed") &&
                  strstr(fallback_log, "cudaErrorNoKernelImageForDevice") && strstr(fallback_log, "running on the CPU"),
              "%s", fallback_log);
    tri__backend_free(be);
    // named explicitly: the GPU, whose first op fails with the reason
    cr_assert_eq(tri__backend_select(TRI_DEVICE_CUDA, 0, 1, &be, name), TRI_STATUS_OK, "%s", tri_last_error());
    float *x = NULL;
    cr_assert_eq(be->ops->alloc(be, 16 * sizeof(float), (void **)&x), TRI_STATUS_OK);
    cr_assert_eq(be->ops->add(be, x, x, x, 16), TRI_STATUS_DEVICE);
    cr_assert(strstr(tri_last_error(), "cudaErrorNoKernelImageForDevice"), "%s", tri_last_error());
    be->ops->free(be, x);
    tri__backend_free(be);
    unsetenv("CUDAEMU_NO_KERNEL_IMAGE");
}

// ---- split attention (backend.h attention_state, kv-store.h) ----

// The device's state over the first 1024 keys of each head, folded with the CPU's chunk partials
// of the rest (tri__cpu_attention_merge), gives the CPU's attention over all of them within the
// attention tolerance (the device's fold rounds differently from the CPU's).
Test(cuda_backend, attention_state_merges_with_host_chunks) {
    NEED_GPU();
    // f32, f16, and the quantized caches' blocks (split attention over an offloaded q8_0 / q4_0 layer)
    const tri_dtype types[4] = {TRI_DTYPE_F32, TRI_DTYPE_F16, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (int ti = 0; ti < 4; ti++) {
        const tri_dtype t = types[ti];
        int64_t nh = 8, nkv = 2, hd = 64, nk = 2600, m = 3, S = 1024, rows = m * nh;
        test_cache c;
        cache_make(gpu, &c, nkv, nk, hd, t, 2.0f);
        tri__kv_span all[2], dev[2], host[2];
        int32_t hs[3] = {0, 1, 2};
        for (int64_t h = 0; h < nkv; h++) {
            size_t at = (size_t)tri__dtype_row_bytes(t, h * nk * c.stride);
            size_t at_s = (size_t)tri__dtype_row_bytes(t, (h * nk + S) * c.stride);
            all[h] = (tri__kv_span){.n = (int32_t)nk, .k = (uint8_t *)c.ks + at, .v = (uint8_t *)c.vs + at,
                                    .stride = c.stride, .pos = c.kpos};
            dev[h] = (tri__kv_span){.n = (int32_t)S, .k = (uint8_t *)c.dks + at, .v = (uint8_t *)c.dvs + at,
                                    .stride = c.stride, .pos = c.kpos};
            host[h] = (tri__kv_span){.n = (int32_t)(nk - S), .k = (uint8_t *)c.ks + at_s, .v = (uint8_t *)c.vs + at_s,
                                     .stride = c.stride, .pos = c.kpos + S};
        }
        tri__kv_view vall = {t, (int32_t)nkv, all, hs, NULL, false, 0},
                     vdev = {t, (int32_t)nkv, dev, hs, NULL, false, 0};
        tri__kv_view vhost = {t, (int32_t)nkv, host, hs, NULL, false, 0};
        float *q = malloc(sizeof(float) * (size_t)(rows * hd)), *want = malloc(sizeof(float) * (size_t)(rows * hd));
        float *got = malloc(sizeof(float) * (size_t)(rows * hd)), *state = malloc(sizeof(float) * (size_t)(rows * (hd + 2)));
        fill(q, rows * hd, 1.0f);
        int32_t qpos[3] = {500, 1000 + 1500, 1 << 20};  // sees only device keys, part of the host's, all
        cr_assert_eq(cpu->ops->attention(cpu, want, q, qpos, m, nh, hd, &vall, NULL), TRI_STATUS_OK);
        float *dq = up(gpu, q, sizeof(float) * (size_t)(rows * hd));
        float *dstate = dalloc(gpu, sizeof(float) * (size_t)(rows * (hd + 2)));
        cr_assert_eq(gpu->ops->attention_state(gpu, dstate, dq, qpos, m, nh, hd, &vdev), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, state, dstate, sizeof(float) * (size_t)(rows * (hd + 2)));
        int64_t nc;
        cr_assert_eq(tri__cpu_attention_chunks(cpu, NULL, &nc, q, qpos, m, nh, hd, &vhost), TRI_STATUS_OK);
        float *chunks = malloc(sizeof(float) * (size_t)(nc * rows * (hd + 2)));
        cr_assert_eq(tri__cpu_attention_chunks(cpu, chunks, &nc, q, qpos, m, nh, hd, &vhost), TRI_STATUS_OK);
        tri__cpu_attention_merge(got, state, chunks, nc, rows, hd);
        for (int64_t i = 0; i < rows * hd; i++)
            cr_assert(fabsf(got[i] - want[i]) <= 4e-5f * (1 + fabsf(want[i])), "%s [%lld] %g vs %g", tri_dtype_name(t),
                      (long long)i, (double)got[i], (double)want[i]);
        gpu->ops->free(gpu, dq);
        gpu->ops->free(gpu, dstate);
        free(q), free(want), free(got), free(state), free(chunks);
        cache_free(gpu, &c);
    }
    DONE();
}

// ---- spans of their own types (backend.h span_types) ----

// A run of keys of one type in a typed view: n rows from position pos0 (every other position when
// gaps: then the span carries explicit positions).
typedef struct typed_seg {
    tri_dtype type;
    int32_t n, pos0;
    bool gaps;
} typed_seg;

// Every KV head holds the segments (odd heads in reverse order), each a span of its own rows of
// stride hd + 32 in host memory and on the device; k, v (nkv, nk, hd) the values they hold, kpos
// (nkv, nk) their positions, in span order.
typedef struct typed_view {
    int64_t nkv, hd, nk;
    tri__kv_span *hs, *ds;
    int32_t head_span[9];
    int32_t *kpos;
    float *k, *v;
    void *host[128], *dev[128];
    int n_bufs;
    tri__kv_view hv, dv;
} typed_view;

static void typed_make(tri__backend *gpu, typed_view *t, int64_t nkv, int64_t hd, const typed_seg *segs, int n_seg) {
    cr_assert(nkv <= 8 && 2 * nkv * n_seg <= 128);
    const int64_t stride = hd + 32;
    t->nkv = nkv, t->hd = hd, t->nk = 0, t->n_bufs = 0;
    for (int i = 0; i < n_seg; i++) t->nk += segs[i].n;
    t->hs = calloc((size_t)(nkv * n_seg), sizeof *t->hs);
    t->ds = calloc((size_t)(nkv * n_seg), sizeof *t->ds);
    t->kpos = malloc(sizeof(int32_t) * (size_t)(nkv * t->nk + 1));
    t->k = malloc(sizeof(float) * (size_t)(nkv * t->nk * hd + 1));
    t->v = malloc(sizeof(float) * (size_t)(nkv * t->nk * hd + 1));
    float *row = malloc(sizeof(float) * (size_t)stride);
    int64_t key = 0;
    for (int64_t h = 0; h < nkv; h++) {
        t->head_span[h] = (int32_t)(h * n_seg);
        for (int si = 0; si < n_seg; si++) {
            const typed_seg *sg = &segs[h % 2 ? n_seg - 1 - si : si];
            const int64_t rb = tri__dtype_row_bytes(sg->type, stride), n = sg->n;
            void *kv[2];
            int32_t *pos = sg->gaps ? t->kpos + key : NULL;
            for (int w = 0; w < 2; w++) {
                kv[w] = calloc((size_t)(rb * (n > 0 ? n : 1)), 1);
                for (int64_t j = 0; j < n; j++) {
                    for (int64_t e = 0; e < stride; e++) row[e] = frand() * (w ? 2.0f : 2.5f);
                    uint8_t *dst = (uint8_t *)kv[w] + j * rb;
                    if (sg->type == TRI_DTYPE_F32) {
                        memcpy(dst, row, sizeof(float) * (size_t)stride);
                    } else if (sg->type == TRI_DTYPE_F16) {
                        for (int64_t e = 0; e < stride; e++) {
                            ((uint16_t *)dst)[e] = tri__f32_to_f16(row[e]);
                            row[e] = tri__f16_to_f32(((uint16_t *)dst)[e]);
                        }
                    } else {
                        cr_assert(tri__quantize_row(dst, row, sg->type, stride));
                        tri__dequantize_row(row, dst, sg->type, stride);
                    }
                    memcpy((w ? t->v : t->k) + (key + j) * hd, row, sizeof(float) * (size_t)hd);
                }
                t->host[t->n_bufs] = kv[w];
                t->dev[t->n_bufs++] = up(gpu, kv[w], (size_t)(rb * (n > 0 ? n : 1)));
            }
            for (int64_t j = 0; j < n; j++) t->kpos[key + j] = sg->pos0 + (int32_t)(sg->gaps ? 2 * j : j);
            const int64_t at = h * n_seg + si;
            t->hs[at] = (tri__kv_span){.pos0 = sg->pos0, .n = sg->n, .k = kv[0], .v = kv[1], .stride = stride,
                                       .pos = pos, .type = sg->type};
            t->ds[at] = t->hs[at];
            t->ds[at].k = t->dev[t->n_bufs - 2], t->ds[at].v = t->dev[t->n_bufs - 1];
            key += n;
        }
    }
    t->head_span[nkv] = (int32_t)(nkv * n_seg);
    free(row);
    // the view's own type is a decoy (no attention reads bf16 rows): with span_types only the spans' count
    t->hv = (tri__kv_view){.type = TRI_DTYPE_BF16, .n_head_kv = (int32_t)nkv, .spans = t->hs,
                           .head_span = t->head_span, .span_types = true};
    t->dv = t->hv;
    t->dv.spans = t->ds;
}

static void typed_free(tri__backend *gpu, typed_view *t) {
    for (int i = 0; i < t->n_bufs; i++) free(t->host[i]), gpu->ops->free(gpu, t->dev[i]);
    free(t->hs), free(t->ds), free(t->kpos), free(t->k), free(t->v);
}

// Attention (out), attention_dev and attention_state over the typed view on the device, against the
// double reference over the values the rows hold (2e-5 (1 + |ref|)) and the CPU backend over the
// same view in host memory (4e-5 (1 + |cpu|)); attention_dev gives attention's bits, and the state's
// accumulator over its sum gives them too. Weight sums (kv_type mixed's heavy hitters are H2O's
// scores over such views): against the reference, 1e-5 (1 + ref).
static void check_typed(tri__backend *gpu, tri__backend *cpu, typed_view *t, int64_t g) {
    const int64_t nkv = t->nkv, hd = t->hd, nk = t->nk, nh = nkv * g, m = 4, n = m * nh * hd;
    int32_t qpos[4] = {2, 350, 700, 1 << 20};
    float *q = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)n);
    float *outc = malloc(sizeof(float) * (size_t)n), *out2 = malloc(sizeof(float) * (size_t)n);
    float *state = malloc(sizeof(float) * (size_t)(m * nh * (hd + 2)));
    float *ws = malloc(sizeof(float) * (size_t)(nkv * nk));
    fill(q, n, 1.0f);
    float *dq = up(gpu, q, sizeof(float) * (size_t)n), *dout = dalloc(gpu, sizeof(float) * (size_t)n);
    float *dstate = dalloc(gpu, sizeof(float) * (size_t)(m * nh * (hd + 2)));
    float *dws = dalloc(gpu, sizeof(float) * (size_t)(nkv * nk));
    int32_t *dpos = up(gpu, qpos, sizeof qpos);
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, m, nh, hd, &t->dv, dws), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, out, dout, sizeof(float) * (size_t)n);
    down(gpu, ws, dws, sizeof(float) * (size_t)(nkv * nk));
    cr_assert_eq(cpu->ops->attention(cpu, outc, q, qpos, m, nh, hd, &t->hv, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    double *ref = malloc(sizeof(double) * (size_t)hd), *wref = calloc((size_t)(nkv * nk), sizeof(double));
    for (int64_t i = 0; i < m; i++)
        for (int64_t hq = 0; hq < nh; hq++) {
            const int64_t h = hq / g;
            naive_attn(q + (i * nh + hq) * hd, qpos[i], hd, nk, t->kpos + h * nk, t->k + h * nk * hd,
                       t->v + h * nk * hd, ref, wref + h * nk);
            for (int64_t e = 0; e < hd; e++) {
                const float got = out[(i * nh + hq) * hd + e], cv = outc[(i * nh + hq) * hd + e];
                cr_assert(fabs(got - ref[e]) <= 2e-5 * (1 + fabs(ref[e])), "typed view: q%lld h%lld [%lld] %g vs %g",
                          (long long)i, (long long)hq, (long long)e, (double)got, ref[e]);
                cr_assert(fabsf(got - cv) <= 4e-5f * (1 + fabsf(cv)), "typed view vs cpu %g %g", (double)got,
                          (double)cv);
            }
        }
    for (int64_t j = 0; j < nkv * nk; j++)
        cr_assert(fabs(ws[j] - wref[j]) <= 1e-5 * (1 + wref[j]), "typed view: weight sum %lld: %g vs %g", (long long)j,
                  (double)ws[j], wref[j]);
    cr_assert_eq(gpu->ops->attention_dev(gpu, dout, dq, dpos, m, nh, hd, &t->dv), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, out2, dout, sizeof(float) * (size_t)n);
    cr_assert(memcmp(out, out2, sizeof(float) * (size_t)n) == 0,
              "attention_dev over a typed view: not attention's bits");
    cr_assert_eq(gpu->ops->attention_state(gpu, dstate, dq, qpos, m, nh, hd, &t->dv), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, state, dstate, sizeof(float) * (size_t)(m * nh * (hd + 2)));
    for (int64_t r = 0; r < m * nh; r++) {
        const float *sr = state + r * (hd + 2);
        for (int64_t e = 0; e < hd; e++) {
            const float o = sr[hd + 1] > 0 ? sr[e] / sr[hd + 1] : 0.0f;
            cr_assert(o == out[r * hd + e], "typed view: state row %lld [%lld] gives %g, attention %g", (long long)r,
                      (long long)e, (double)o, (double)out[r * hd + e]);
        }
    }
    gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dout), gpu->ops->free(gpu, dstate);
    gpu->ops->free(gpu, dws), gpu->ops->free(gpu, dpos);
    free(q), free(out), free(outc), free(out2), free(state), free(ws), free(ref), free(wref);
}

// Views whose spans carry their own types, as L2's retrieval cache (q8_0 / q4_0 chunks of 8 with
// gaps beside its f16 ring) and kv_type mixed (f16 sinks, q4_0 rows, f16 window) make them, with
// f32 rows and empty spans of other types between, each head's runs in another order: attention,
// attention_dev and attention_state (split attention's device half) against the reference and the
// CPU; at the default limits (chunks of up to 256 keys cut where a type's run ends) and one query
// per tile (tiles_and_batches_at_small_limits' path); weight sums over every view, f16 beside f32
// rows too.
Test(cuda_backend, attention_spans_of_their_own_types) {
    NEED_GPU();
    static const typed_seg mixed[] = {
        {TRI_DTYPE_F16, 4, 0, false},   {TRI_DTYPE_Q8_0, 0, 4, false}, {TRI_DTYPE_Q4_0, 300, 4, false},
        {TRI_DTYPE_F32, 0, 304, false}, {TRI_DTYPE_Q8_0, 8, 320, true}, {TRI_DTYPE_Q8_0, 8, 400, true},
        {TRI_DTYPE_Q4_0, 8, 480, true}, {TRI_DTYPE_F32, 5, 500, false}, {TRI_DTYPE_F16, 37, 680, true},
        {TRI_DTYPE_Q8_0, 0, 900, false},
    };
    static const typed_seg plain[] = {
        {TRI_DTYPE_F16, 40, 0, false}, {TRI_DTYPE_F32, 270, 40, true}, {TRI_DTYPE_F16, 9, 600, false},
    };
    typed_view t;
    typed_make(gpu, &t, 2, 64, mixed, (int)(sizeof mixed / sizeof mixed[0]));
    check_typed(gpu, cpu, &t, 3);
    typed_free(gpu, &t);
    typed_make(gpu, &t, 4, 128, mixed, (int)(sizeof mixed / sizeof mixed[0]));
    check_typed(gpu, cpu, &t, 1);
    typed_free(gpu, &t);
    typed_make(gpu, &t, 2, 40, plain, (int)(sizeof plain / sizeof plain[0]));
    check_typed(gpu, cpu, &t, 2);
    typed_free(gpu, &t);
    cr_assert_eq(tri__backend_cuda_set_limits(gpu, &(tri__cuda_limits){1, 1, 1}), TRI_STATUS_OK, "%s",
                 tri_last_error());
    typed_make(gpu, &t, 2, 64, mixed, (int)(sizeof mixed / sizeof mixed[0]));
    check_typed(gpu, cpu, &t, 3);
    // a span of a type attention does not read is refused, naming it, even an empty one
    t.ds[3].type = TRI_DTYPE_Q5_0;
    float *dq = dalloc(gpu, sizeof(float) * 4 * 6 * 64), *dout = dalloc(gpu, sizeof(float) * 4 * 6 * 64);
    int32_t qpos[4] = {0, 1, 2, 3};
    cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, 4, 6, 64, &t.dv, NULL), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "q5_0"), "%s", tri_last_error());
    gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dout);
    typed_free(gpu, &t);
    DONE();
}

// ---- token trees (backend.h tri__kv_tree) ----

// A tree of 24 nodes (random parents) over the last rows of a 300-key cache cut into spans (one
// cut inside the tree): every node and a query before the tree, attention and weight sums and the
// state form, on the device against the CPU backend (whose tree mask the spec suite checks against
// a reference written from the rule).
Test(cuda_backend, attention_tree_mask_matches_cpu) {
    NEED_GPU();
    enum { T = 24, NK = 300, NH = 8, NKV = 2, HD = 64, M = T + 1 };
    for (tri_dtype t = TRI_DTYPE_F32; t <= TRI_DTYPE_F16; t++) {
        test_cache c;
        cache_make(gpu, &c, NKV, NK, HD, t, 2.0f);
        int32_t par[T];
        for (int i = 0; i < T; i++) par[i] = i < 5 ? i - 1 : (int32_t)((frand() + 1.0f) * 1e6f) % (i + 1) - 1;
        uint32_t anc[T * ((T + 31) / 32)];
        tri__kv_tree_masks(anc, par, T);
        tri__kv_tree tree = {.row0 = c.kpos[NK - T], .n = T, .words = (T + 31) / 32, .anc = anc};
        int32_t qpos[M];
        for (int i = 0; i < M; i++) qpos[i] = c.kpos[NK - T] - 1 + i;
        int64_t cuts[2] = {100, NK - 11};
        tri__kv_span spans[NKV * 3], hspans[NKV * 3];
        int32_t hs[NKV + 1], hhs[NKV + 1];
        tri__kv_view view, hview;
        cache_view(&c, true, cuts, 2, spans, hs, &view);
        cache_view(&c, false, cuts, 2, hspans, hhs, &hview);
        view.tree = hview.tree = &tree;
        const int64_t rows = (int64_t)M * NH;
        float *q = malloc(sizeof(float) * (size_t)(rows * HD)), *out = malloc(sizeof(float) * (size_t)(rows * HD));
        float *want = malloc(sizeof(float) * (size_t)(rows * HD));
        float *st = malloc(sizeof(float) * (size_t)(rows * (HD + 2))),
              *stc = malloc(sizeof(float) * (size_t)(rows * (HD + 2)));
        float *ws = malloc(sizeof(float) * NKV * NK), *wsc = malloc(sizeof(float) * NKV * NK);
        fill(q, rows * HD, 1.0f);
        float *dq = up(gpu, q, sizeof(float) * (size_t)(rows * HD)),
              *dout = dalloc(gpu, sizeof(float) * (size_t)(rows * HD));
        float *dws = dalloc(gpu, sizeof(float) * NKV * NK),
              *dst = dalloc(gpu, sizeof(float) * (size_t)(rows * (HD + 2)));
        cr_assert_eq(gpu->ops->attention(gpu, dout, dq, qpos, M, NH, HD, &view, dws), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(gpu->ops->attention_state(gpu, dst, dq, qpos, M, NH, HD, &view), TRI_STATUS_OK, "%s",
                     tri_last_error());
        down(gpu, out, dout, sizeof(float) * (size_t)(rows * HD));
        down(gpu, ws, dws, sizeof(float) * NKV * NK);
        down(gpu, st, dst, sizeof(float) * (size_t)(rows * (HD + 2)));
        cr_assert_eq(cpu->ops->attention(cpu, want, q, qpos, M, NH, HD, &hview, wsc), TRI_STATUS_OK);
        cr_assert_eq(cpu->ops->attention_state(cpu, stc, q, qpos, M, NH, HD, &hview), TRI_STATUS_OK);
        for (int64_t i = 0; i < rows * HD; i++)
            cr_assert(fabsf(out[i] - want[i]) <= 4e-5f * (1 + fabsf(want[i])), "%s [%lld] %g vs cpu %g",
                      tri_dtype_name(t), (long long)i, (double)out[i], (double)want[i]);
        for (int64_t j = 0; j < NKV * NK; j++)
            cr_assert(fabsf(ws[j] - wsc[j]) <= 1e-4f * (1 + wsc[j]), "%s weight sum %lld: %g vs cpu %g",
                      tri_dtype_name(t), (long long)j, (double)ws[j], (double)wsc[j]);
        for (int64_t r = 0; r < rows; r++)  // the state's quotient: the output
            for (int64_t e = 0; e < HD; e++) {
                float a = st[r * (HD + 2) + e] / st[r * (HD + 2) + HD + 1];
                float b = stc[r * (HD + 2) + e] / stc[r * (HD + 2) + HD + 1];
                cr_assert(fabsf(a - b) <= 4e-5f * (1 + fabsf(b)), "%s state row %lld [%lld] %g vs cpu %g",
                          tri_dtype_name(t), (long long)r, (long long)e, (double)a, (double)b);
            }
        gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dout), gpu->ops->free(gpu, dws), gpu->ops->free(gpu, dst);
        free(q), free(out), free(want), free(st), free(stc), free(ws), free(wsc);
        cache_free(gpu, &c);
    }
    DONE();
}

// ---- steps driven from device memory, and graphs ----

// set_rows, window_rows and the _dev ops against the CPU backend: the same bits for the index
// ops and conversions, attention and RoPE within the kernels' rounding, q_pos and positions read
// from device memory.
Test(cuda_backend, device_indexed_ops) {
    NEED_GPU();
    enum { M = 3, N = 40, ROWS = 9, HD = 16, NH = 4, NKV = 2, NK = 70 };
    float src[M * N];
    fill(src, M * N, 3.0f);
    const int32_t rows[M] = {7, 0, 4};
    int32_t *drows = up(gpu, rows, sizeof rows);
    float *dsrc = up(gpu, src, sizeof src);
    tri_dtype types[] = {TRI_DTYPE_F32, TRI_DTYPE_F16, TRI_DTYPE_BF16};
    for (int ti = 0; ti < 3; ti++) {
        size_t bytes = (size_t)tri__dtype_row_bytes(types[ti], N) * ROWS;
        unsigned char *want = calloc(1, bytes), *got = malloc(bytes);
        void *d = up(gpu, want, bytes);
        cr_assert_eq(cpu->ops->set_rows(cpu, want, types[ti], src, rows, M, N), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(gpu->ops->set_rows(gpu, d, types[ti], dsrc, drows, M, N), TRI_STATUS_OK, "%s", tri_last_error());
        down(gpu, got, d, bytes);
        cr_assert(memcmp(want, got, bytes) == 0, "set_rows to %s", tri_dtype_name(types[ti]));
        gpu->ops->free(gpu, d);
        free(want), free(got);
    }
    // window_rows at every length through a ring that wraps, with and without eviction intervals
    tri__stream_window ws[] = {{2, 8, 0, 40}, {2, 8, 5, 40}, {4, 16, 0, 0}, {1, 6, 3, 11}};
    for (int wi = 0; wi < 4; wi++) {
        const tri__stream_window *w = &ws[wi];
        int32_t V = w->budget + (w->evict_every > 1 ? w->evict_every : 1);
        int32_t *dstate = dalloc(gpu, sizeof(int32_t) * 4), *dview = dalloc(gpu, sizeof(int32_t) * (size_t)V);
        int32_t want[4 + 32], got[4 + 32];
        for (int32_t n0 = 0; n0 < 200; n0 += 1 + n0 / 40) {
            int32_t st[4] = {0, n0, -1, -1};
            memcpy(want, st, sizeof st);
            cr_assert_eq(cpu->ops->window_rows(cpu, want, want + 4, V, w), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(gpu->ops->copy_to_backend(gpu, dstate, st, sizeof st), TRI_STATUS_OK);
            cr_assert_eq(gpu->ops->window_rows(gpu, dstate, dview, V, w), TRI_STATUS_OK, "%s", tri_last_error());
            down(gpu, got, dstate, sizeof(int32_t) * 4);
            down(gpu, got + 4, dview, sizeof(int32_t) * (size_t)V);
            cr_assert(memcmp(want, got, sizeof(int32_t) * (size_t)(4 + V)) == 0, "window %d at %d", wi, n0);
            // the view against the definition: sinks, then the positions before the interval
            int32_t kept = want[2], start = tri__window_start(w, n0);
            cr_assert_eq(kept, n0 <= w->budget ? n0 : w->budget + n0 - start);
            for (int32_t i = 0; i < kept; i++) {
                int32_t pos = start == 0 || i < w->sink ? i : start - (w->budget - w->sink) + i - w->sink;
                cr_assert(pos >= 0 && pos < n0, "window %d at %d: view row %d is position %d", wi, n0, i, pos);
                cr_assert_eq(want[4 + i], tri__window_row(w, pos));
            }
        }
        gpu->ops->free(gpu, dstate);
        gpu->ops->free(gpu, dview);
    }
    // get_rows_dev, rope_dev, attention_dev with their indices in device memory
    float table[ROWS * N];
    fill(table, ROWS * N, 1.0f);
    float *dtable = up(gpu, table, sizeof table), *dout = dalloc(gpu, sizeof(float) * M * N);
    float want_rows[M * N], got_rows[M * N];
    cr_assert_eq(cpu->ops->get_rows(cpu, want_rows, table, TRI_DTYPE_F32, ROWS, N, rows, M), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->get_rows_dev(gpu, dout, dtable, TRI_DTYPE_F32, ROWS, N, drows, M), TRI_STATUS_OK, "%s",
                 tri_last_error());
    down(gpu, got_rows, dout, sizeof got_rows);
    cr_assert(memcmp(want_rows, got_rows, sizeof got_rows) == 0, "get_rows_dev");
    tri_model_config cfg = {.n_embd = NH * HD, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .rope_theta = 10000.0f};
    tri__rope rope;
    cr_assert_eq(tri__rope_init(&rope, &cfg, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    float x[M * NH * HD], xr[M * NH * HD];
    fill(x, M * NH * HD, 1.0f);
    memcpy(xr, x, sizeof x);
    float *dx = up(gpu, x, sizeof x);
    cr_assert_eq(cpu->ops->rope(cpu, xr, M, NH, rows, &rope), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->rope_dev(gpu, dx, M, NH, drows, &rope), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, x, dx, sizeof x);
    for (int i = 0; i < M * NH * HD; i++) cr_assert(fabsf(x[i] - xr[i]) <= 1e-5f * (1 + fabsf(xr[i])), "rope_dev [%d]", i);
    test_cache c;
    cache_make(gpu, &c, NKV, NK, HD, TRI_DTYPE_F16, 2.0f);
    tri__kv_span spans[NKV], hspans[NKV];
    int32_t hs[NKV + 1], hhs[NKV + 1];
    tri__kv_view vd, vh;
    cache_view(&c, true, NULL, 0, spans, hs, &vd);
    cache_view(&c, false, NULL, 0, hspans, hhs, &vh);
    float q[M * NH * HD], aw[M * NH * HD], ag[M * NH * HD];
    fill(q, M * NH * HD, 1.0f);
    const int32_t qpos[M] = {69, 10, 35};
    int32_t *dqpos = up(gpu, qpos, sizeof qpos);
    float *dq = up(gpu, q, sizeof q), *dao = dalloc(gpu, sizeof ag);
    cr_assert_eq(cpu->ops->attention(cpu, aw, q, qpos, M, NH, HD, &vh, NULL), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->attention_dev(gpu, dao, dq, dqpos, M, NH, HD, &vd), TRI_STATUS_OK, "%s", tri_last_error());
    down(gpu, ag, dao, sizeof ag);
    for (int i = 0; i < M * NH * HD; i++)
        cr_assert(fabsf(ag[i] - aw[i]) <= 4e-5f * (1 + fabsf(aw[i])), "attention_dev [%d] %g vs %g", i, (double)ag[i],
                  (double)aw[i]);
    cache_free(gpu, &c);
    tri__rope_free(&rope);
    void *bufs[] = {drows, dsrc, dtable, dout, dx, dqpos, dq, dao};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu->ops->free(gpu, bufs[i]);
    DONE();
}

// A recorded graph replays its ops with the indices the device holds at each launch; what a replay
// could not repeat is refused while recording, and the backend works as before afterwards.
Test(cuda_backend, graph_replays_with_device_state) {
    NEED_GPU();
    enum { N = 24, ROWS = 48, V = 9 };
    const tri__stream_window w = {2, 8, 0, 40};
    float table[ROWS * N];
    fill(table, ROWS * N, 1.0f);
    float *dtable = up(gpu, table, sizeof table), *dout = dalloc(gpu, sizeof(float) * V * N);
    int32_t *dstate = dalloc(gpu, sizeof(int32_t) * 4), *dview = dalloc(gpu, sizeof(int32_t) * V);
    cr_assert_eq(gpu->ops->graph_begin(gpu), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(gpu->ops->graph_begin(gpu), TRI_STATUS_UNSUPPORTED, "one recording at a time");
    cr_assert_eq(gpu->ops->window_rows(gpu, dstate, dview, V, &w), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(gpu->ops->get_rows_dev(gpu, dout, dtable, TRI_DTYPE_F32, ROWS, N, dview, V), TRI_STATUS_OK);
    float host[V * N];
    cr_assert_eq(gpu->ops->synchronize(gpu), TRI_STATUS_UNSUPPORTED);
    cr_assert_eq(gpu->ops->copy_to_host(gpu, host, dout, sizeof host), TRI_STATUS_UNSUPPORTED);
    tri__graph *g = NULL, *none = NULL;
    cr_assert_eq(gpu->ops->graph_end(gpu, &g), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(g);
    gpu->ops->graph_free(gpu, g);
    cr_assert_eq(gpu->ops->graph_end(gpu, &none), TRI_STATUS_INVALID_ARGUMENT, "not recording");
    cr_assert_null(none);
    cr_assert_eq(gpu->ops->graph_begin(gpu), TRI_STATUS_OK);  // the same ops recorded again
    cr_assert_eq(gpu->ops->window_rows(gpu, dstate, dview, V, &w), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->get_rows_dev(gpu, dout, dtable, TRI_DTYPE_F32, ROWS, N, dview, V), TRI_STATUS_OK);
    cr_assert_eq(gpu->ops->graph_end(gpu, &g), TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t n0 = 0; n0 < 100; n0 += 7) {
        int32_t st[4] = {0, n0, 0, 0}, want[4 + V];
        memcpy(want, st, sizeof st);
        cr_assert_eq(cpu->ops->window_rows(cpu, want, want + 4, V, &w), TRI_STATUS_OK);
        float rows_want[V * N];
        cr_assert_eq(cpu->ops->get_rows(cpu, rows_want, table, TRI_DTYPE_F32, ROWS, N, want + 4, V), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->copy_to_backend(gpu, dstate, st, sizeof st), TRI_STATUS_OK);
        cr_assert_eq(gpu->ops->graph_launch(gpu, g), TRI_STATUS_OK, "%s", tri_last_error());
        down(gpu, host, dout, sizeof host);
        cr_assert(memcmp(host, rows_want, sizeof host) == 0, "replay at %d", n0);
    }
    gpu->ops->graph_free(gpu, g);
    gpu->ops->graph_free(gpu, NULL);
    void *bufs[] = {dtable, dout, dstate, dview};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu->ops->free(gpu, bufs[i]);
    DONE();
}

// The draft's one-token step over StreamingLLM, recorded once and replayed, computes the bits of the
// same step issued op by op, and the CPU policy step's logits within the kernels' rounding, through
// a ring that wraps; a buffer that moves (the logits regrown by a pass of two tokens) records it
// again.
Test(cuda_backend, draft_step_graph_equals_ops_and_cpu) {
    NEED_GPU();
    enum { N = 120, P = 5 };
    tri_model *m;
    cr_assert_eq(tri_model_load(tt_gen_model("cuda-draft-step", "--dtype f16 --heads 4 --kv-heads 2 --head-dim 16 --layers 2"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    const tri_model_config *c = &info.config;
    const int32_t nv = c->n_vocab;
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, 4096);
    pp.budget = 16;
    pp.sink = 4;
    pp.evict_every = 4;
    tri__backend *bes[3] = {gpu, gpu, cpu};
    tri_model *w[3];
    tri__llama ll[3];
    tri__kv_policy pol[3];
    tri__llama_step step[2];
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(tri__model_on_backend(m, bes[r], 0, 0, &w[r]), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri__llama_init(&ll[r], w[r], bes[r], 16), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri__kv_policy_init(&pol[r], &pp, bes[r], TRI_DTYPE_F16, c->n_layer, c->n_head, c->n_head_kv,
                                         c->head_dim, 4096, 16),
                     TRI_STATUS_OK, "%s", tri_last_error());
        if (r < 2)
            cr_assert_eq(tri__llama_step_init(&step[r], &ll[r], &pol[r], r == 0), TRI_STATUS_OK, "%s", tri_last_error());
    }
    cr_assert(pol[0].ring_rows > 0, "a bounded store");
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = (int32_t)((i * 37 + 11) % 250) + 3;
    float *l = malloc(sizeof(float) * 3 * (size_t)nv * 2);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(tri__llama_forward_policy(&ll[r], &pol[r], t, P, TRI_LOGITS_LAST, l), TRI_STATUS_OK, "%s",
                     tri_last_error());
    const float *logits_before = NULL;
    for (int32_t i = P; i < N; i++) {
        if (i == 60) {  // two tokens in one pass: the logits buffer grows (and the graph is recorded
                        // again if it moved)
            logits_before = ll[0].logits;
            for (int r = 0; r < 3; r++)
                cr_assert_eq(tri__llama_forward_policy(&ll[r], &pol[r], t + i, 2, TRI_LOGITS_ALL, l), TRI_STATUS_OK,
                             "%s", tri_last_error());
            i++;
            continue;
        }
        for (int r = 0; r < 2; r++)
            cr_assert_eq(tri__llama_step_run(&step[r], t[i], l + r * nv), TRI_STATUS_OK, "token %d: %s", i,
                         tri_last_error());
        cr_assert_eq(tri__llama_forward_policy(&ll[2], &pol[2], t + i, 1, TRI_LOGITS_LAST, l + 2 * nv), TRI_STATUS_OK);
        cr_assert(memcmp(l, l + nv, sizeof(float) * (size_t)nv) == 0, "token %d: the replayed step differs", i);
        float top = 0;
        for (int32_t j = 0; j < nv; j++) top = fmaxf(top, fabsf(l[2 * nv + j]));
        for (int32_t j = 0; j < nv; j++)
            cr_assert(fabsf(l[j] - l[2 * nv + j]) <= 1e-4f * (1 + top), "token %d logit %d: %g vs the CPU's %g", i, j,
                      (double)l[j], (double)l[2 * nv + j]);
    }
    cr_assert_eq(step[0].n_replays, N - P - 2);
    cr_assert_eq(step[0].n_recorded, 1 + (ll[0].logits != logits_before), "recorded once, and again if the logits moved");
    cr_assert_eq(step[1].n_replays, 0);
    // a buffer the graph was recorded over moves (allocated before the old one goes, so its address
    // differs): the next step records again and still computes the same
    int64_t recorded = step[0].n_recorded;
    float *moved = dalloc(gpu, sizeof(float) * (size_t)nv * (size_t)ll[0].n_logits);
    gpu->ops->free(gpu, ll[0].logits);
    ll[0].logits = moved;
    for (int r = 0; r < 2; r++)
        cr_assert_eq(tri__llama_step_run(&step[r], t[3], l + r * nv), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(memcmp(l, l + nv, sizeof(float) * (size_t)nv) == 0, "after the move");
    cr_assert_eq(step[0].n_recorded, recorded + 1);
    for (int r = 0; r < 3; r++) {
        if (r < 2) tri__llama_step_free(&step[r]);
        tri__kv_policy_free(&pol[r]);
        tri__llama_free(&ll[r]);
        tri__model_backend_free(w[r]);
    }
    free(l);
    tri_model_free(m);
    DONE();
}
