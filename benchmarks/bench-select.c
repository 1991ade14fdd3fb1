// bench-select.c - what one selection of the retrieval level over L3's rows costs on the host.
//
// A full cache of --ctx tokens (synthetic f16 rows, Llama2-7B's KV shape by default: 32 KV heads
// of 128, --layers of them, some offloaded) is borrowed by a retrieval policy
// (tri__kv_policy_init_borrowed), which adopts its length and then selects from a one-token step,
// as the speculative engine's L2 does after a prompt. Printed per phase: the first selection
// (every chunk summarised: the keys read against the machine's copy peak, the top-k searches,
// the gathers), then a second one 512 tokens later, which summarises only the new chunks.
//
// usage: bench-select [--ctx N] [--layers N] [--offload N] [--budget N] [--chunk N] [--threads N]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bench-util.h"
#include "dtype.h"
#include "kv-policy.h"
#include "kv-store.h"

static void die(const char *what) {
    fprintf(stderr, "bench-select: %s: %s\n", what, tri_last_error());
    exit(1);
}

static int32_t arg_int(int argc, char **argv, const char *name, int32_t def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return (int32_t)atoi(argv[i + 1]);
    return def;
}

// One step of one token at the policy's end with a random query, selecting at its commit.
static double select_step(tri__kv_policy *p, float *q, float *k, float *v) {
    int32_t q_pos[1];
    tri__kv_policy_request_refresh(p);
    if (tri__kv_policy_begin(p, 1, NULL, q_pos)) die("begin");
    for (int32_t il = 0; il < p->n_layer; il++) {
        const tri__kv_view *view;
        float *ws;
        if (tri__kv_policy_layer(p, il, q, k, v, &view, &ws)) die("layer");
    }
    double t0 = bench_now();
    if (tri__kv_policy_commit(p)) die("commit");
    return bench_now() - t0;
}

int main(int argc, char **argv) {
    const int32_t ctx = arg_int(argc, argv, "--ctx", 32768), n_layer = arg_int(argc, argv, "--layers", 4);
    const int32_t off = arg_int(argc, argv, "--offload", n_layer), budget = arg_int(argc, argv, "--budget", 4096);
    const int32_t chunk = arg_int(argc, argv, "--chunk", 8), threads = arg_int(argc, argv, "--threads", 0);
    const int32_t nkv = 32, hd = 128, n_head = 32;
    bench_print_machine();
#if TRI_HAVE_OPENMP
    if (threads > 0) omp_set_num_threads(threads);
    const int nt = omp_get_max_threads();
#else
    const int nt = 1;
    (void)threads;
#endif
    double peak = bench_copy_peak(nt);
    tri__backend *be;
    if (tri__backend_cpu_create(nt, TRI_CPU_SIMD_AUTO, &be)) die("cpu backend");
    tri__kv_store src;
    if (tri__kv_store_init_offload(&src, be, TRI_DTYPE_F16, n_layer, nkv, hd, ctx + 1024, n_layer - off))
        die("cache");
    // synthetic keys and values, a few rows repeated so that the summaries differ
    const int64_t row = tri__kv_store_row_bytes(&src), block = 1024;
    uint16_t *rows = malloc((size_t)(block * row));
    if (!rows) die("rows");
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < block * row / 2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        rows[i] = tri__f32_to_f16((float)((double)(x >> 11) / 9007199254740992.0 - 0.5));
    }
    for (int32_t il = 0; il < n_layer; il++)
        for (int32_t pos = 0; pos < ctx + 1024; pos += (int32_t)block)
            if (tri__kv_store_load_rows(&src, il, pos, (int32_t)block, rows, rows)) die("load rows");
    if (tri__kv_store_set_len(&src, ctx)) die("length");

    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_RETRIEVAL, ctx + 1024);
    pp.budget = budget;
    pp.chunk = chunk;
    tri__kv_policy p;
    if (tri__kv_policy_init_borrowed(&p, &pp, &src, n_head, 1024, 8)) die("policy");
    float *q = malloc(sizeof(float) * (size_t)(n_head * hd)), *k = malloc(sizeof(float) * (size_t)(nkv * hd));
    float *v = malloc(sizeof(float) * (size_t)(nkv * hd));
    if (!q || !k || !v) die("step buffers");
    for (int32_t i = 0; i < n_head * hd; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int32_t i = 0; i < nkv * hd; i++) k[i] = v[i] = 0.01f * (float)(i % 7);

    printf("cache: %d tokens x %d layers (%d offloaded) x %d KV heads x %d, f16; budget %d, chunks of %d; "
           "%d threads; copy peak %.1f GB/s\n",
           ctx, n_layer, off, nkv, hd, budget, chunk, nt, peak / 1e9);
    if (tri__kv_policy_adopt(&p, &src, ctx - 1)) die("adopt");
    double t1 = select_step(&p, q, k, v);
    double keys = (double)(ctx / chunk) * chunk * (double)row * n_layer;  // keys read to summarise
    printf("first selection at %d: %.3f s (%.2f GB of keys summarised: %.1f GB/s, %.0f%% of the copy peak; "
           "%llu bytes gathered from host)\n",
           ctx, t1, keys / 1e9, keys / t1 / 1e9, 100.0 * keys / t1 / peak,
           (unsigned long long)tri__kv_policy_bytes_up(&p));
    // 512 tokens later (the engine's ring): only the new chunks are summarised
    if (tri__kv_store_set_len(&src, ctx + 512)) die("length");
    if (tri__kv_policy_adopt(&p, &src, ctx + 511)) die("adopt");
    double t2 = select_step(&p, q, k, v);
    printf("next selection 512 tokens later: %.3f s\n", t2);
    tri__kv_policy_free(&p);
    tri__kv_store_free(&src);
    free(rows);
    free(q);
    free(k);
    free(v);
    tri__backend_free(be);
    return 0;
}
