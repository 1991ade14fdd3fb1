// bench-attention.c - CPU attention at long contexts: decode (m = 1) time and GB/s of the K/V
// bytes it must read (against a measured stream-like copy), at 4K, 32K and 128K keys, and prefill
// (512 queries over 4K keys, causal) time and GFLOP/s of the unmasked half.
//
// usage: bench-attention [n_threads] [simd: scalar|avx2|avx512|avx512vnni] [max_keys]
//   (defaults: all cores, best level, 131072). Shapes: SmolLM2-135M (9 heads over 3 KV heads,
//   head_dim 64) and Llama2-7B (32 over 32, head_dim 128), f16 cache, one layer, one span per head.
// Every configuration is first checked against a double-precision reference on a few heads.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "bench-util.h"

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
    tri__backend_free(be);
    return 0;
}
