// bench-attention.c - CPU attention at long contexts: decode (m = 1) time and GB/s of the K/V
// bytes it must read (against a measured stream-like copy), at 4K, 32K and 128K keys, and prefill
// (512 queries over 4K keys, causal) time and GFLOP/s of the unmasked half.
//
// usage: bench-attention [n_threads] [simd: scalar|avx2|avx512|avx512vnni] [max_keys]
//   (defaults: all cores, best level, 131072). Shapes: SmolLM2-135M (9 heads over 3 KV heads,
//   head_dim 64) and Llama2-7B (32 over 32, head_dim 128), f16 cache, one layer, one span per head.
//   BENCH_SPLIT_ONLY=1 in the environment skips to the split attention rows below.
// Every configuration is first checked against a double-precision reference on a few heads.
//
// Then the host's half of split attention (docs/offload.md, "Attending where the KV lives"):
// tri__cpu_attention_chunks + tri__cpu_attention_merge over a span of Llama2-7B f16 rows (32 heads
// over 32 KV heads, head_dim 128) at m = 1, 13 and 64 queries per row, in GFLOP/s (4 m n_head
// head_dim FLOPs per KV row) against this machine's measured f32 FMA peak (all threads) and in
// GB/s of K/V read against its measured streaming-read and copy peaks; each m twice: f32 scores
// (the default) and bf16 scores (tri__cpu_set_attn_bf16, where the CPU has AVX512-BF16), the bf16
// rows with their output's largest difference from the f32 rows'.
//
// Last, the score kernel alone (attn_scores_f16: q . k over f16 keys, one thread, 128-key tiles
// of one head's 16K keys): f32 FMAs against the bf16 kernel (vdpbf16ps) at 1, 13 and 64 query
// rows, in GFLOP/s (2 m head_dim per key) against one thread's f32 FMA and bf16 dot-product peaks,
// and the bf16 scores' largest error against the f32 ones (absolute, and over the largest |score|).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu-kernels.h"
#include "dtype.h"
#include "bench-util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_X86 1
#else
#define BENCH_X86 0
#endif

typedef struct shape {
    const char *name;
    int64_t n_head, n_head_kv, hd;
} shape;

static unsigned rng = 12345;
static float frand(void) { return (float)((rng = rng * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f; }

// One layer's f16 cache of n keys per KV head (positions 0 .. n-1), rows head_dim apart.
typedef struct cache {
    uint16_t *k, *v;  // (n_head_kv, n, hd)
    tri__kv_span *spans;
    int32_t *head_span;
    tri__kv_view view;
} cache;

static int cache_make(cache *c, const shape *s, int64_t n) {
    size_t rows = (size_t)(s->n_head_kv * n * s->hd);
    c->k = malloc(rows * 2), c->v = malloc(rows * 2);
    c->spans = malloc(sizeof(tri__kv_span) * (size_t)s->n_head_kv);
    c->head_span = malloc(sizeof(int32_t) * (size_t)(s->n_head_kv + 1));
    if (!c->k || !c->v || !c->spans || !c->head_span) return -1;
    // a small table of f16 values repeated: filling GBs with a per-element rng takes seconds
    uint16_t tab[4096];
    for (int i = 0; i < 4096; i++) tab[i] = tri__f32_to_f16(frand());
    for (size_t i = 0; i < rows; i++) c->k[i] = tab[(i * 7 + i / 4093) & 4095], c->v[i] = tab[(i * 13 + 5) & 4095];
    for (int64_t h = 0; h <= s->n_head_kv; h++) c->head_span[h] = (int32_t)h;
    for (int64_t h = 0; h < s->n_head_kv; h++)
        c->spans[h] = (tri__kv_span){.pos0 = 0, .n = (int32_t)n, .k = c->k + h * n * s->hd,
                                     .v = c->v + h * n * s->hd, .stride = s->hd};
    c->view = (tri__kv_view){.type = TRI_DTYPE_F16, .n_head_kv = (int32_t)s->n_head_kv, .spans = c->spans,
                             .head_span = c->head_span};
    return 0;
}

static void cache_free(cache *c) { free(c->k), free(c->v), free(c->spans), free(c->head_span); }

// Max abs error of query i, head h of out against a double reference.
static double check_head(const shape *s, const cache *c, int64_t n, const float *q, const int32_t *qpos,
                         const float *out, int64_t i, int64_t h) {
    int64_t hd = s->hd, kh = h / (s->n_head / s->n_head_kv);
    const float *qh = q + (i * s->n_head + h) * hd;
    const uint16_t *k = c->k + kh * n * hd, *v = c->v + kh * n * hd;
    int64_t nv = qpos[i] + 1 < n ? qpos[i] + 1 : n;
    double mx = -INFINITY, sum = 0, *sc = malloc(sizeof(double) * (size_t)nv), acc[128] = {0};
    for (int64_t j = 0; j < nv; j++) {
        double d = 0;
        for (int64_t e = 0; e < hd; e++) d += (double)qh[e] * (double)tri__f16_to_f32(k[j * hd + e]);
        sc[j] = d / sqrt((double)hd);
        mx = fmax(mx, sc[j]);
    }
    for (int64_t j = 0; j < nv; j++) {
        double p = exp(sc[j] - mx);
        sum += p;
        for (int64_t e = 0; e < hd; e++) acc[e] += p * (double)tri__f16_to_f32(v[j * hd + e]);
    }
    double err = 0;
    for (int64_t e = 0; e < hd; e++) err = fmax(err, fabs(acc[e] / sum - (double)out[(i * s->n_head + h) * hd + e]));
    free(sc);
    return err;
}

// Best wall time of reps calls (at least 2, up to 20, stopping after about 1.5 s).
static double time_attention(tri__backend *be, float *out, const float *q, const int32_t *qpos, int64_t m,
                             const shape *s, const cache *c) {
    double best = 1e30, spent = 0;
    for (int rep = 0; rep < 20 && (rep < 2 || spent < 1.5); rep++) {
        double t0 = bench_now();
        be->ops->attention(be, out, q, qpos, m, s->n_head, s->hd, &c->view, NULL);
        double dt = bench_now() - t0;
        spent += dt;
        if (dt < best) best = dt;
    }
    return best;
}

// f32 FMA peak of one thread: 12 independent chains of vector FMAs (enough to cover the FMA
// latency on every x86 core we know), in FLOPs (2 per lane per FMA) per second.
#if BENCH_X86
__attribute__((target("avx512f"))) static double fma_run_avx512(int64_t iters) {
    __m512 a[12], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);
    double t0 = bench_now();
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_ps(a[j], x, y);
    double dt = bench_now() - t0;
    __m512 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 2.0 * 16 * 12 * (double)iters / dt;
}
// The same with AVX512-BF16's vdpbf16ps: 32 bf16 products summed pairwise into 16 f32 lanes per
// instruction, 64 FLOPs; what a bf16 QK^T could reach (not used by the attention kernels).
__attribute__((target("avx512f,avx512bf16"))) static double bf16_run(int64_t iters) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);  // 1.0, 6e-8
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);
    double t0 = bench_now();
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm512_dpbf16_ps(a[j], x, y);
    double dt = bench_now() - t0;
    __m512 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 2.0 * 32 * 12 * (double)iters / dt;
}
__attribute__((target("avx2,fma"))) static double fma_run_avx2(int64_t iters) {
    __m256 a[12], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
    double t0 = bench_now();
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], x, y);
    double dt = bench_now() - t0;
    __m256 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
    float l[8];
    _mm256_storeu_ps(l, s);
    volatile float sink = l[0];
    (void)sink;
    return 2.0 * 8 * 12 * (double)iters / dt;
}
#endif

// f32 FMA peak of nt threads at once (the sum of their rates; best of 3), and the ISA it used.
static double fma_peak(int nt, const char **isa) {
    double best = 0;
    *isa = "none";
#if BENCH_X86
    int w512 = __builtin_cpu_supports("avx512f");
    int w256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!w512 && !w256) return 0;
    *isa = w512 ? "avx512f" : "avx2+fma";
    for (int rep = 0; rep < 3; rep++) {
        double sum = 0;
#if TRI_HAVE_OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : sum)
#endif
        sum += w512 ? fma_run_avx512(20000000) : fma_run_avx2(20000000);
        if (sum > best) best = sum;
    }
#endif
    (void)nt;
    return best;
}

// The bf16 dot-product peak of nt threads (best of 3), 0 without AVX512-BF16.
static double bf16_peak(int nt) {
    double best = 0;
#if BENCH_X86
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    for (int rep = 0; rep < 3; rep++) {
        double sum = 0;
#if TRI_HAVE_OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : sum)
#endif
        sum += bf16_run(20000000);
        if (sum > best) best = sum;
    }
#endif
    (void)nt;
    return best;
}

// Streaming read of 512 MiB (far beyond the caches) with nt threads, bytes read per second, best
// of 5: the limit of attention's reads of K and V.
#if BENCH_X86
__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const uint64_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)));
    return l[0] ^ l[1] ^ l[2] ^ l[3];
}
#endif
static uint64_t read_sum(const uint64_t *p, size_t n) {
#if BENCH_X86
    if (__builtin_cpu_supports("avx2")) return read_sum_avx2(p, n);
#endif
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s ^= p[i];
    return s;
}

static double read_peak(int nt) {
    size_t n = (size_t)64 << 20;  // 64 Mi words = 512 MiB
    uint64_t *a = malloc(n * sizeof(uint64_t));
    if (!a) return 0.0;
    for (size_t i = 0; i < n; i++) a[i] = i;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t x = 0;
        double t0 = bench_now();
#if TRI_HAVE_OPENMP
#pragma omp parallel num_threads(nt) reduction(^ : x)
        {
            size_t per = (n / (size_t)omp_get_num_threads()) & ~(size_t)15, t = (size_t)omp_get_thread_num();
            x ^= read_sum(a + t * per, per);
        }
#else
        x = read_sum(a, n);
#endif
        double bw = (double)(n * sizeof(uint64_t)) / (bench_now() - t0);
        sink ^= x;
        if (bw > best) best = bw;
    }
    (void)nt;
    free(a);
    return best;
}

// The host half of split attention over n f16 rows of shape s at m queries, all after the rows
// (each sees every row): chunks then merge into a fresh state, as the store runs it. Checks against
// the double reference first (returns -1 on failure), prints one line.
static int split_row(tri__backend *be, const shape *s, const cache *c, int64_t n, int64_t m, double flop_peak,
                     double rd_peak, double cp_peak, bool bf16, float *out_f32) {
    int64_t hd = s->hd, rows = m * s->n_head, n_chunk = 0;
    float *q = malloc(sizeof(float) * (size_t)(rows * hd)), *out = malloc(sizeof(float) * (size_t)(rows * hd));
    float *state = malloc(sizeof(float) * (size_t)(rows * (hd + 2)));
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)m);
    int rc = -1;
    if (!q || !out || !state || !qpos) goto done;
    unsigned rng0 = rng;  // the f32 and bf16 rows of one m see the same queries
    for (int64_t i = 0; i < rows * hd; i++) q[i] = frand();
    if (!bf16) rng = rng0;
    for (int64_t i = 0; i < m; i++) qpos[i] = (int32_t)(n + i);
    tri__cpu_attention_chunks(be, NULL, &n_chunk, q, qpos, m, s->n_head, hd, &c->view);
    float *chunks = malloc(sizeof(float) * (size_t)(n_chunk * rows * (hd + 2)));
    if (!chunks) goto done;
    double best = 1e30, spent = 0, err = 0;
    for (int rep = 0; rep < 20 && (rep < 2 || spent < 2.0); rep++) {
        double t0 = bench_now();
        for (int64_t r = 0; r < rows; r++) {  // empty state: acc 0, max -inf, sum 0
            memset(state + r * (hd + 2), 0, sizeof(float) * (size_t)(hd + 2));
            state[r * (hd + 2) + hd] = -INFINITY;
        }
        if (tri__cpu_attention_chunks(be, chunks, &n_chunk, q, qpos, m, s->n_head, hd, &c->view) != TRI_STATUS_OK) {
            fprintf(stderr, "%s\n", tri_last_error());
            free(chunks);
            goto done;
        }
        tri__cpu_attention_merge(out, state, chunks, n_chunk, rows, hd);
        double dt = bench_now() - t0;
        spent += dt;
        if (dt < best) best = dt;
        if (rep == 0) {
            for (int64_t i = 0; i < m; i += m > 1 ? (m - 1) / 2 : 1)
                for (int64_t h = 0; h < s->n_head; h += s->n_head / 4)
                    err = fmax(err, check_head(s, c, n, q, qpos, out, i, h));
            if (err > (bf16 ? 5e-2 : 1e-3)) {  // bf16 scores: about 3 significant digits
                printf("split %lld rows m=%lld CHECK FAILED: max error %.3g\n", (long long)n, (long long)m, err);
                free(chunks);
                goto done;
            }
        }
    }
    free(chunks);
    double dout = 0;  // bf16: the output's largest difference from the f32 row's
    if (bf16)
        for (int64_t i = 0; i < rows * hd; i++) dout = fmax(dout, fabs((double)out[i] - (double)out_f32[i]));
    else
        memcpy(out_f32, out, sizeof(float) * (size_t)(rows * hd));
    double flops = 4.0 * (double)(m * s->n_head * hd) * (double)n;
    double bytes = (double)(s->n_head_kv * n * hd * 2 * 2);
    printf("%-10s %7lld %4lld %-6s %9.2f %9.1f %7.1f%% %9.2f %7.0f%% %7.0f%% %9.1e", s->name, (long long)n,
           (long long)m, bf16 ? "bf16" : "f32", best * 1e3, flops / best / 1e9, 100 * flops / best / flop_peak,
           bytes / best / 1e9, 100 * bytes / best / rd_peak, 100 * bytes / best / cp_peak, err);
    if (bf16) printf(" %9.1e", dout);
    printf("\n");
    rc = 0;
done:
    free(q), free(out), free(state), free(qpos);
    return rc;
}

// The score kernel alone on one thread (see the top): f32 (the best level's attn_scores_f16) and,
// with has_bf16, the bf16 kernel, over head 0's n keys in 128-key tiles.
static void score_kernel(const cache *c, const shape *s, int64_t n, bool has_bf16) {
    const tri__cpu_kernels *kr = &tri__cpu_kernels_scalar;
#if BENCH_X86
    tri__cpu_simd lvl = tri__cpu_simd_detect();
    kr = lvl == TRI_CPU_SIMD_AVX512_VNNI ? &tri__cpu_kernels_avx512_vnni
         : lvl == TRI_CPU_SIMD_AVX512    ? &tri__cpu_kernels_avx512
         : lvl == TRI_CPU_SIMD_AVX2      ? &tri__cpu_kernels_avx2
                                         : kr;
#endif
    const char *isa;
    double fpk = fma_peak(1, &isa), bpk = bf16_peak(1);
    int64_t hd = s->hd;
    printf("\nscore kernel alone (q . k, f16 keys, 1 thread, %lld keys of one head in 128-key tiles)\n", (long long)n);
    printf("one thread: f32 FMA peak %.1f GFLOP/s, bf16 dot-product peak %.1f GFLOP/s\n", fpk / 1e9, bpk / 1e9);
    printf("%4s %-6s %9s %9s %8s %8s %9s %9s %9s\n", "m", "scores", "ms", "GFLOP/s", "of FMA", "of bf16", "K GB/s",
           "max abs", "rel");
    const int64_t ms[3] = {1, 13, 64};
    for (int mi = 0; mi < 3; mi++) {
        int64_t m = ms[mi];
        float *q = malloc(sizeof(float) * (size_t)(m * hd)), *sf = malloc(sizeof(float) * (size_t)(m * n));
        float *sb = malloc(sizeof(float) * (size_t)(m * n));
        if (!q || !sf || !sb) {
            free(q), free(sf), free(sb);
            return;
        }
        for (int64_t i = 0; i < m * hd; i++) q[i] = frand() / sqrtf((float)hd);
        for (int b = 0; b < (has_bf16 ? 2 : 1); b++) {
            float *sc = b ? sb : sf;
            double best = 1e30, spent = 0;
            for (int rep = 0; rep < 50 && (rep < 2 || spent < 0.5); rep++) {
                double t0 = bench_now();
                for (int64_t j0 = 0; j0 < n; j0 += 128) {
                    int64_t nk = n - j0 < 128 ? n - j0 : 128;
#if BENCH_X86
                    if (b)
                        tri__cpu_attn_scores_f16_bf16(sc + j0, n, q, m, c->k + j0 * hd, hd, nk, hd);
                    else
#endif
                        kr->attn_scores_f16(sc + j0, n, q, m, c->k + j0 * hd, hd, nk, hd);
                }
                double dt = bench_now() - t0;
                spent += dt;
                best = dt < best ? dt : best;
            }
            double flops = 2.0 * (double)(m * hd) * (double)n, bytes = (double)(n * hd * 2);
            printf("%4lld %-6s %9.3f %9.1f %7.1f%% %7.1f%% %9.2f", (long long)m, b ? "bf16" : "f32", best * 1e3,
                   flops / best / 1e9, 100 * flops / best / fpk, bpk > 0 ? 100 * flops / best / bpk : 0.0,
                   bytes / best / 1e9);
            if (b) {
                double mabs = 0, mref = 0;
                for (int64_t i = 0; i < m * n; i++)
                    mabs = fmax(mabs, fabs((double)sb[i] - (double)sf[i])), mref = fmax(mref, fabs((double)sf[i]));
                printf(" %9.1e %9.1e", mabs, mabs / mref);
            }
            printf("\n");
        }
        free(q), free(sf), free(sb);
    }
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 0;
    tri__cpu_simd simd = TRI_CPU_SIMD_AUTO;
    for (int l = TRI_CPU_SIMD_SCALAR; argc > 2 && l <= TRI_CPU_SIMD_AVX512_VNNI; l++)
        if (!strcmp(argv[2], tri__cpu_simd_name((tri__cpu_simd)l))) simd = (tri__cpu_simd)l;
    int64_t max_keys = argc > 3 ? atoll(argv[3]) : 131072;
    tri__backend *be;
    if (tri__backend_cpu_create(nt, simd, &be) != TRI_STATUS_OK) {
        fprintf(stderr, "%s\n", tri_last_error());
        return 1;
    }
    nt = be->n_threads;
    bench_print_machine();
    double peak = bench_copy_peak(nt);
    printf("%d threads, SIMD %s; stream-like copy peak %.2f GB/s (read + write)\n\n", nt,
           tri__cpu_simd_name(simd == TRI_CPU_SIMD_AUTO ? tri__cpu_simd_detect() : simd), peak / 1e9);

    const shape shapes[2] = {{"smollm2", 9, 3, 64}, {"llama2-7b", 32, 32, 128}};
    if (getenv("BENCH_SPLIT_ONLY")) goto split;
    printf("%-10s %-8s %7s %6s %10s %9s %8s %9s\n", "shape", "phase", "keys", "m", "ms", "K/V GB/s", "of peak",
           "max err");
    for (int si = 0; si < 2; si++) {
        const shape *s = &shapes[si];
        const int64_t lens[3] = {4096, 32768, 131072};
        for (int li = 0; li < 3; li++) {
            int64_t n = lens[li];
            if (n > max_keys) continue;
            cache c;
            if (cache_make(&c, s, n)) {
                printf("%-10s %7lld keys: cannot allocate\n", s->name, (long long)n);
                cache_free(&c);
                continue;
            }
            // decode: one query after every key, then (at 4K only) prefill: 512 queries at the end
            for (int phase = 0; phase < (n == 4096 ? 2 : 1); phase++) {
                int64_t m = phase ? 512 : 1;
                float *q = malloc(sizeof(float) * (size_t)(m * s->n_head * s->hd));
                float *out = malloc(sizeof(float) * (size_t)(m * s->n_head * s->hd));
                int32_t *qpos = malloc(sizeof(int32_t) * (size_t)m);
                for (int64_t i = 0; i < m * s->n_head * s->hd; i++) q[i] = frand();
                for (int64_t i = 0; i < m; i++) qpos[i] = (int32_t)(n - m + i);
                be->ops->attention(be, out, q, qpos, m, s->n_head, s->hd, &c.view, NULL);
                double err = 0;
                for (int64_t i = 0; i < m; i += m > 1 ? m / 2 - 1 : 1)
                    for (int64_t h = 0; h < s->n_head; h += s->n_head / 3)
                        err = fmax(err, check_head(s, &c, n, q, qpos, out, i, h));
                if (err > 1e-3) {
                    printf("%s %lld keys m=%lld CHECK FAILED: max error %.3g\n", s->name, (long long)n, (long long)m,
                           err);
                    return 1;
                }
                double t = time_attention(be, out, q, qpos, m, s, &c);
                double bytes = (double)(s->n_head_kv * n * s->hd * 2 * 2);
                if (phase == 0)
                    printf("%-10s %-8s %7lld %6lld %10.3f %9.2f %7.0f%% %9.1e\n", s->name, "decode", (long long)n,
                           (long long)m, t * 1e3, bytes / t / 1e9, 100 * bytes / t / peak, err);
                else  // causal: query i sees n - m + i + 1 keys; 4 flops per (query head, key, dim)
                {
                    double pairs = 0;
                    for (int64_t i = 0; i < m; i++) pairs += (double)(n - m + i + 1);
                    printf("%-10s %-8s %7lld %6lld %10.3f %9s %8s %9.1e  (%.1f GFLOP/s)\n", s->name, "prefill",
                           (long long)n, (long long)m, t * 1e3, "-", "-", err,
                           4.0 * pairs * (double)(s->n_head * s->hd) / t / 1e9);
                }
                free(q), free(out), free(qpos);
            }
            cache_free(&c);
        }
    }

split:;
    // the host half of split attention, against this machine's FMA and read limits
    const char *isa;
    double fpk = fma_peak(nt, &isa), bpk = bf16_peak(nt), rpk = read_peak(nt);
    printf("\nsplit attention, host half (chunks + merge), f16 rows, every query sees every row\n");
    printf("f32 FMA peak %.1f GFLOP/s (%s, %d threads); streaming read peak %.2f GB/s, copy %.2f GB/s\n", fpk / 1e9,
           isa, nt, rpk / 1e9, peak / 1e9);
    if (bpk > 0) printf("bf16 dot-product peak (vdpbf16ps) %.1f GFLOP/s, %.2fx the f32 FMA's\n", bpk / 1e9, bpk / fpk);
    printf("%-10s %7s %4s %-6s %9s %9s %8s %9s %8s %8s %9s %9s\n", "shape", "rows", "m", "scores", "ms", "GFLOP/s",
           "of FMA", "K/V GB/s", "of read", "of copy", "max err", "vs f32");
    int64_t split_rows = max_keys < 16384 ? max_keys : 16384;
    cache c;
    if (cache_make(&c, &shapes[1], split_rows)) {
        printf("split: cannot allocate %lld rows\n", (long long)split_rows);
        cache_free(&c);
        tri__backend_free(be);
        return 1;
    }
    const int64_t ms[3] = {1, 13, 64};
    bool has_bf16 = tri__cpu_set_attn_bf16(be, false) == TRI_STATUS_OK && tri__cpu_has_bf16();
    float *out_f32 = malloc(sizeof(float) * (size_t)(64 * shapes[1].n_head * shapes[1].hd));
    for (int mi = 0; mi < 3; mi++)
        for (int b = 0; b < (has_bf16 ? 2 : 1); b++) {
            tri__cpu_set_attn_bf16(be, b == 1);
            if (!out_f32 || split_row(be, &shapes[1], &c, split_rows, ms[mi], fpk, rpk, peak, b == 1, out_f32)) {
                free(out_f32);
                cache_free(&c);
                tri__backend_free(be);
                return 1;
            }
        }
    tri__cpu_set_attn_bf16(be, false);
    free(out_f32);
    if (!has_bf16) printf("(no bf16 rows: this CPU lacks AVX512-BF16)\n");
    score_kernel(&c, &shapes[1], split_rows, has_bf16);
    cache_free(&c);
    tri__backend_free(be);
    return 0;
}
