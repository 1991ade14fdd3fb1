// bench-stream.c - StreamingLLM over a long text in bounded memory: the process's resident set
// and the perplexity of the text's next tokens, per segment, as the stream grows (the
// StreamingLLM paper's experiment, on the CPU).
//
// usage: bench-stream MODEL.gguf IDS [tokens 100000] [budget 1024] [evict_every 1]
//                     [segment 10000] [threads 0]
// IDS: token ids as text, one per line (scripts/tokenize-gguf.py), or little-endian int32
// (benchmarks/tokenize-gguf.py). The first `tokens` ids are fed in
// calls of 64 tokens with the logits of each (teacher forcing), through a StreamingLLM policy with
// 16 sinks over an f16 cache whose capacity is the stream's length: the store holds the sinks and
// a ring of window + step + rollback rows, whatever that length. evict_every 1 is StreamingLLM's
// own cache (one token per step past the window); 64 evicts between intervals of 64 tokens, as
// TriForce's draft prefill does (steps of 64: faster, a slightly different cache).
//
// Prints, per segment: tokens so far, VmRSS, the store's bytes, the segment's perplexity and the
// tokens per second so far. The check: RSS after the first segment does not grow (the limit
// printed is the first segment's RSS + 1 MiB), and every segment's perplexity is finite.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "kv-policy.h"
#include "llama.h"
#include "model.h"
#include "bench-util.h"

static void die(const char *what) {
    fprintf(stderr, "bench-stream: %s: %s\n", what, tri_last_error());
    exit(1);
}

// The resident set of this process in KiB (VmRSS of /proc/self/status), -1 when unreadable.
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

// -log softmax(l)[target], in double.
static double nll(const float *l, int32_t n, int32_t target) {
    double mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < n; i++) mx = fmax(mx, (double)l[i]);
    for (int32_t i = 0; i < n; i++) s += exp((double)l[i] - mx);
    return log(s) + mx - (double)l[target];
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench-stream MODEL.gguf IDS [tokens 100000] [budget 1024] [evict_every 1] "
                        "[segment 10000] [threads 0]\n");
        return 2;
    }
    int32_t n_tok = argc > 3 ? atoi(argv[3]) : 100000, budget = argc > 4 ? atoi(argv[4]) : 1024;
    int32_t every = argc > 5 ? atoi(argv[5]) : 1, segment = argc > 6 ? atoi(argv[6]) : 10000;
    int32_t threads = argc > 7 ? atoi(argv[7]) : 0;
    enum { CALL = 64 };

    tri_model *m;
    if (tri_model_load(argv[1], NULL, &m)) die(argv[1]);
    const tri_model_config *c = &m->config;
    int32_t n = 0;
    int32_t *ids = bench_read_ids(argv[2], c->n_vocab, &n);
    if (!ids) return 1;
    if (n < n_tok) {
        fprintf(stderr, "%s: %d ids, need %d\n", argv[2], n, n_tok);
        return 1;
    }
    tri__backend *be;
    if (tri__backend_cpu_create(threads, TRI_CPU_SIMD_AUTO, &be)) die("backend");
    tri__llama ll;
    if (tri__llama_init(&ll, m, be, CALL)) die("forward pass");
    tri__kv_policy_params pp = tri__kv_policy_default_params(TRI_KV_POLICY_STREAMING, n_tok);
    pp.budget = budget;
    pp.sink = 16;
    pp.evict_every = every;
    tri__kv_policy pol;
    if (tri__kv_policy_init(&pol, &pp, be, TRI_DTYPE_F16, c->n_layer, c->n_head, c->n_head_kv, c->head_dim, n_tok,
                            CALL))
        die("policy");
    const int32_t V = c->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)CALL * (size_t)V);
    if (!logits) return 1;
    const double store_mib = 2.0 * c->n_layer * (double)pol.own.capacity * (double)tri__kv_store_row_bytes(&pol.own) /
                             (1024.0 * 1024.0);
    printf("# bench-stream: %s, %d layers, %d/%d heads, f16 cache, StreamingLLM budget %d (16 sinks), evict every "
           "%d, %d tokens in calls of %d, %d threads\n",
           argv[1], c->n_layer, c->n_head, c->n_head_kv, budget, every < 1 ? 1 : every, n_tok, CALL, be->n_threads);
    printf("# store: %d rows per layer (%.1f MiB for K and V of every layer), whatever the length; a full cache "
           "of %d tokens would hold %.1f MiB\n",
           pol.own.capacity, store_mib, n_tok,
           2.0 * c->n_layer * (double)n_tok * (double)tri__kv_store_row_bytes(&pol.own) / (1024.0 * 1024.0));
    printf("%10s %10s %10s %10s %8s\n", "tokens", "RSS MiB", "store MiB", "seg ppl", "tok/s");
    fflush(stdout);
    double t0 = bench_now(), seg_nll = 0, max_ppl = 0;
    long seg_n = 0, rss_first = -1, rss_max = 0;
    for (int32_t done = 0; done < n_tok;) {
        int32_t nb = n_tok - done < CALL ? n_tok - done : CALL;
        if (tri__llama_forward_policy(&ll, &pol, ids + done, nb, TRI_LOGITS_ALL, logits)) die("forward");
        for (int32_t i = 0; i < nb && done + i + 1 < n_tok; i++, seg_n++)
            seg_nll += nll(logits + (int64_t)i * V, V, ids[done + i + 1]);
        done += nb;
        if (done % segment < CALL || done == n_tok) {
            long rss = rss_kib();
            double ppl = exp(seg_nll / (double)(seg_n > 0 ? seg_n : 1));
            printf("%10d %10.1f %10.1f %10.3f %8.1f\n", done, rss / 1024.0, store_mib, ppl, done / (bench_now() - t0));
            fflush(stdout);
            if (rss_first < 0) rss_first = rss;
            if (rss > rss_max) rss_max = rss;
            if (!(ppl < INFINITY) || ppl > max_ppl) max_ppl = ppl;
            seg_nll = 0;
            seg_n = 0;
        }
    }
    printf("# RSS: first segment %.1f MiB, largest %.1f MiB (limit %.1f MiB: %s); largest segment perplexity %.3f "
           "(%s)\n",
           rss_first / 1024.0, rss_max / 1024.0, rss_first / 1024.0 + 1.0,
           rss_max <= rss_first + 1024 ? "flat" : "GROWS", max_ppl, max_ppl < INFINITY ? "finite" : "NOT FINITE");
    free(logits);
    free(ids);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
    tri__backend_free(be);
    tri_model_free(m);
    return 0;
}
