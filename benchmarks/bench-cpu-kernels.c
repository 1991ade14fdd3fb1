// bench-cpu-kernels.c - CPU matmul against the machine's limits: GB/s of weight bytes at m = 1
// (decode: memory bound) against a measured stream-like copy, and GFLOP/s at m = 128 (prefill).
//
// usage: bench-cpu-kernels [n_threads] [simd: scalar|avx2|avx512|avx512vnni]   (defaults: all cores, best)
// The result of every configuration is first checked against the f32 weights' result.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "dtype.h"
#include "tri-config.h"
#include "bench-util.h"

#if TRI_HAVE_OPENMP
#include <omp.h>
#endif

// Weights (n, k) of type t (F32 .. Q4_1) from f32 values: float types converted, quantized ones
// with d = amax/127 (Q8_0) or a plain min/max (Q4): the benchmark measures speed, the tests
// measure accuracy.
static void *make_weights(const float *w, int64_t n, int64_t k, tri_dtype t) {
    int64_t rb = tri__dtype_row_bytes(t, k);
    uint8_t *out = malloc((size_t)(rb * n));
    for (int64_t r = 0; r < n; r++) {
        const float *wr = w + r * k;
        uint8_t *o = out + r * rb;
        for (int64_t b = 0; b < (t >= TRI_DTYPE_Q8_0 ? k / 32 : k); b++) {
            if (t == TRI_DTYPE_F32) ((float *)o)[b] = wr[b];
            if (t == TRI_DTYPE_F16) ((uint16_t *)o)[b] = tri__f32_to_f16(wr[b]);
            if (t == TRI_DTYPE_BF16) ((uint16_t *)o)[b] = tri__f32_to_bf16(wr[b]);
            if (t < TRI_DTYPE_Q8_0) continue;
            const float *x = wr + b * 32;
            float mn = x[0], mx = x[0], amax = 0;
            for (int i = 0; i < 32; i++) {
                mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]), amax = fmaxf(amax, fabsf(x[i]));
            }
            if (t == TRI_DTYPE_Q8_0) {
                tri__block_q8_0 *q = (tri__block_q8_0 *)o + b;
                q->d = tri__f32_to_f16(amax / 127);
                for (int i = 0; i < 32; i++) q->qs[i] = (int8_t)lrintf(x[i] / (amax / 127));
            } else if (t == TRI_DTYPE_Q4_0) {
                tri__block_q4_0 *q = (tri__block_q4_0 *)o + b;
                float d = amax / 7.5f;
                q->d = tri__f32_to_f16(d);
                for (int i = 0; i < 16; i++) {
                    int lo = (int)lrintf(x[i] / d + 8), hi = (int)lrintf(x[i + 16] / d + 8);
                    lo = lo < 0 ? 0 : lo > 15 ? 15 : lo, hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
                    q->qs[i] = (uint8_t)(lo | hi << 4);
                }
            } else {
                tri__block_q4_1 *q = (tri__block_q4_1 *)o + b;
                float d = (mx - mn) / 15;
                q->d = tri__f32_to_f16(d), q->m = tri__f32_to_f16(mn);
                for (int i = 0; i < 16; i++) {
                    int lo = (int)lrintf((x[i] - mn) / d), hi = (int)lrintf((x[i + 16] - mn) / d);
                    q->qs[i] = (uint8_t)((lo > 15 ? 15 : lo) | (hi > 15 ? 15 : hi) << 4);
                }
            }
        }
    }
    return out;
}

// Weights (n, k) of the types without a quantizer here (Q5_0, Q5_1, the K-quants): random codes
// and scale bytes, the f16 scales (at their offsets in dtype.h's layouts) chosen so values are
// about 0.5 in magnitude; *deq gets their values (f32), the reference the check uses.
static void *random_weights(int64_t n, int64_t k, tri_dtype t, float **deq) {
    int64_t rb = tri__dtype_row_bytes(t, k), bb = tri__dtype_block_bytes(t);
    uint8_t *out = malloc((size_t)(rb * n));
    *deq = malloc(sizeof(float) * (size_t)(n * k));
    int d_at = 0, m_at = -1;
    float d = 0.5f / 16;
    switch (t) {
    case TRI_DTYPE_Q5_1: m_at = 2, d = 1.0f / 32; break;
    case TRI_DTYPE_Q2_K: d_at = 80, m_at = 82, d = 0.5f / 45; break;
    case TRI_DTYPE_Q3_K: d_at = 108, d = 0.5f / 128; break;
    case TRI_DTYPE_Q4_K: m_at = 2, d = 0.5f / 945; break;
    case TRI_DTYPE_Q5_K: m_at = 2, d = 0.5f / 1953; break;
    case TRI_DTYPE_Q6_K: d_at = 208, d = 0.5f / 4064; break;
    case TRI_DTYPE_IQ4_NL: d = 0.5f / 127; break;
    case TRI_DTYPE_IQ4_XS: d = 0.5f / 4064; break;
    default: break;
    }
    unsigned s = 777;
    for (int64_t b = 0; b < rb * n / bb; b++) {
        uint8_t *blk = out + b * bb;
        for (int64_t i = 0; i < bb; i++) blk[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 16);
        uint16_t h = tri__f32_to_f16(d), mn = tri__f32_to_f16(t == TRI_DTYPE_Q5_1 ? -0.5f : d * 8);
        memcpy(blk + d_at, &h, 2);
        if (m_at >= 0) memcpy(blk + m_at, &mn, 2);
    }
    for (int64_t r = 0; r < n; r++) tri__dequantize_row(*deq + r * k, out + r * rb, t, k);
    return out;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 0;
    tri__cpu_simd simd = TRI_CPU_SIMD_AUTO;
    for (int l = TRI_CPU_SIMD_SCALAR; argc > 2 && l <= TRI_CPU_SIMD_AVX512_VNNI; l++)
        if (!strcmp(argv[2], tri__cpu_simd_name((tri__cpu_simd)l))) simd = (tri__cpu_simd)l;
    tri__backend *be;
    if (tri__backend_cpu_create(nt, simd, &be) != TRI_STATUS_OK) {
        fprintf(stderr, "%s\n", tri_last_error());
        return 1;
    }
    nt = be->n_threads;
    double peak = bench_copy_peak(nt);
    printf("machine: %d threads, SIMD %s (best %s)\n", nt, tri__cpu_simd_name(simd == TRI_CPU_SIMD_AUTO ? tri__cpu_simd_detect() : simd),
           tri__cpu_simd_name(tri__cpu_simd_detect()));
    printf("stream-like copy peak: %.2f GB/s (read + write)\n\n", peak / 1e9);

    // a Llama-7B projection: 4096 x 4096 (64 MiB in f32, well past the caches; the 8-18 MiB of the
    // quantized types can sit in a large L3, so their m = 1 GB/s may exceed the DRAM copy peak)
    int64_t n = 4096, k = 4096, m_big = 128;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *x = malloc(sizeof(float) * (size_t)(m_big * k));
    float *y = malloc(sizeof(float) * (size_t)(m_big * n)), *yref = malloc(sizeof(float) * (size_t)n);
    unsigned s = 12345;
    for (int64_t i = 0; i < n * k; i++) w[i] = (float)((s = s * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0f - 0.5f;
    for (int64_t i = 0; i < m_big * k; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0f - 0.5f;
    be->ops->matmul(be, yref, x, w, TRI_DTYPE_F32, 1, n, k);

    printf("%-5s %10s %10s %8s %12s\n", "dtype", "m=1 ms", "GB/s", "of peak", "m=128 GFLOP/s");
    for (tri_dtype t = TRI_DTYPE_F32; t < TRI_DTYPE_COUNT; t++) {
        float *wdq = NULL;
        void *wt = t < TRI_DTYPE_Q5_0 ? make_weights(w, n, k, t) : random_weights(n, k, t, &wdq);
        double bytes = (double)tri__dtype_row_bytes(t, k) * (double)n;
        // check first: against the f32 result, loosely (quantization of W and x); random weights
        // against their dequantized values (quantization of x alone)
        if (wdq) be->ops->matmul(be, yref, x, wdq, TRI_DTYPE_F32, 1, n, k);
        be->ops->matmul(be, y, x, wt, t, 1, n, k);
        double err = 0, mag = 0;
        for (int64_t r = 0; r < n; r++) err += fabs((double)(y[r] - yref[r])), mag += fabs((double)yref[r]);
        if (err > 0.1 * mag) {
            printf("%-5s CHECK FAILED: relative L1 error %.3g\n", tri_dtype_name(t), err / mag);
            return 1;
        }
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = bench_now();
            be->ops->matmul(be, y, x, wt, t, 1, n, k);
            double dt = bench_now() - t0;
            if (dt < best) best = dt;
        }
        double best_big = 1e9;
        for (int rep = 0; rep < 2; rep++) {
            double t0 = bench_now();
            be->ops->matmul(be, y, x, wt, t, m_big, n, k);
            double dt = bench_now() - t0;
            if (dt < best_big) best_big = dt;
        }
        // decode reads each weight byte once: compare with the copy's read + write traffic
        printf("%-5s %10.3f %10.2f %7.0f%% %12.1f\n", tri_dtype_name(t), best * 1e3, bytes / best / 1e9,
               100 * bytes / best / peak, 2.0 * (double)m_big * (double)n * (double)k / best_big / 1e9);
        free(wt);
        if (wdq) free(wdq), be->ops->matmul(be, yref, x, w, TRI_DTYPE_F32, 1, n, k);
    }
    free(w), free(x), free(y), free(yref);
    tri__backend_free(be);
    return 0;
}
