// bench-generate.c - plain decoding on the CPU against the machine's memory bandwidth.
//
// usage: bench-generate MODEL [n_prompt] [n_decode]   (defaults 256 and 64)
//
// For 1 thread and for every core: prefill tokens/s over an n_prompt-token prompt, decode
// tokens/s over n_decode greedy tokens, and the bandwidth decode achieves: each decoded token
// reads every weight byte once plus the KV cache so far, so bytes/token / seconds/token, printed
// against a stream-like copy measured on the same machine with the same threads.
// The prompt is fixed pseudo-random ids (speed does not depend on the text); the run first checks
// that the greedy tokens are the same with 1 thread and with all.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench-util.h"
#include "triforce.h"

typedef struct run {
    double prefill_tps, decode_tps;
    int32_t tokens[4096];
    int32_t n;
} run;

static bool collect(int32_t tok, void *user) {
    run *r = user;
    if (r->n < 4096) r->tokens[r->n++] = tok;
    return true;
}

static int measure(tri_model *model, const int32_t *prompt, int32_t n_prompt, int32_t n_decode, int32_t threads,
                   run *r) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = n_prompt + n_decode + 1;
    sp.n_threads = threads;
    tri_session *s;
    if (tri_session_create(model, &sp, &s)) {
        fprintf(stderr, "session: %s\n", tri_last_error());
        return 1;
    }
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n_decode;
    gp.stop_at_eos = false;
    tri_generate_stats st;
    r->n = 0;
    if (tri_generate(s, prompt, n_prompt, &gp, collect, r, &st)) {
        fprintf(stderr, "generate: %s\n", tri_last_error());
        tri_session_free(s);
        return 1;
    }
    r->prefill_tps = st.n_prompt / st.prefill_seconds;
    r->decode_tps = (st.n_generated - 1) / st.decode_seconds;
    tri_session_free(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench-generate MODEL [n_prompt] [n_decode]\n");
        return 2;
    }
    int32_t n_prompt = argc > 2 ? atoi(argv[2]) : 256, n_decode = argc > 3 ? atoi(argv[3]) : 64;
    if (n_prompt < 1 || n_decode < 2 || n_decode > 4096) {
        fprintf(stderr, "bench-generate: n_prompt >= 1 and 2 <= n_decode <= 4096\n");
        return 2;
    }
    tri_model *model;
    if (tri_model_load(argv[1], NULL, &model)) {
        fprintf(stderr, "bench-generate: %s\n", tri_last_error());
        return 1;
    }
    tri_model_info info;
    tri_model_get_info(model, &info);
    const tri_model_config *c = &info.config;
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    uint64_t x = 88172645463325252ull;
    for (int32_t i = 0; i < n_prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)c->n_vocab);
    }
    int ncores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bench_print_machine();
    printf("model: %s, %.1f M parameters, %.1f MiB of weights\n", argv[1], (double)info.n_params / 1e6,
           (double)info.n_bytes / (1024.0 * 1024.0));
    // KV bytes read per decoded token: every layer's K and V (f16) for the positions so far, on
    // average the middle of the decode
    double kv_per_token = 2.0 * 2.0 * c->n_layer * c->n_head_kv * c->head_dim * (n_prompt + n_decode / 2.0);
    double bytes_per_token = (double)info.n_bytes + kv_per_token;
    printf("bytes read per decoded token: %.1f MiB (weights %.1f + KV %.1f)\n\n", bytes_per_token / 1048576.0,
           (double)info.n_bytes / 1048576.0, kv_per_token / 1048576.0);
    printf("%-8s %14s %14s %16s %18s %8s\n", "threads", "prefill tok/s", "decode tok/s", "decode GB/s",
           "copy peak GB/s", "ratio");
    run *runs = calloc(2, sizeof *runs);
    int threads[2] = {1, ncores};
    for (int i = 0; i < (ncores > 1 ? 2 : 1); i++) {
        if (measure(model, prompt, n_prompt, n_decode, threads[i], &runs[i])) return 1;
        double peak = bench_copy_peak(threads[i]);
        double bw = bytes_per_token * runs[i].decode_tps;
        printf("%-8d %14.1f %14.1f %16.2f %18.2f %7.0f%%\n", threads[i], runs[i].prefill_tps, runs[i].decode_tps,
               bw / 1e9, peak / 1e9, 100.0 * bw / peak);
    }
    if (ncores > 1)
        for (int32_t i = 0; i < runs[0].n; i++)
            if (runs[0].tokens[i] != runs[1].tokens[i]) {
                fprintf(stderr, "check failed: greedy token %d differs between 1 and %d threads\n", i, ncores);
                return 1;
            }
    printf("\n(decode GB/s counts bytes read; the copy peak counts bytes read + written)\n");
    free(runs);
    free(prompt);
    tri_model_free(model);
    return 0;
}
