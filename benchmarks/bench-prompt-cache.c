// bench-prompt-cache.c - the prompt cache's write and read speed against the disk's sequential
// peak, measured on the same file system by the same engine at its best.
//
// usage: bench-prompt-cache [DIR [TOKENS [LAYERS KV_HEADS HEAD_DIM]]]
//        (default: ., 6080 tokens of SmolLM2-135M's shape: 30 layers x 3 KV heads x 64, f16)
//
// The peak: as many bytes as the cache file, and 1 GiB, written in 4 MiB requests, 16 in flight,
// O_DIRECT where allowed, fdatasync, then read back (tri__pcache_disk_peak). The cache: a file of the given shape written and read by
// tri__pcache_write / tri__pcache_read, rows filled with a pattern that the read checks, so each
// figure counts the staging copies and checksums a session's save and load pay (not the copies
// out of and into the KV store). Best of three each way; the files are deleted after. Last, the
// checksum's own speed on one thread.
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench-util.h"
#include "error.h"
#include "prompt-cache.h"

// The rows of every block: a pattern made once, copied in as a session's save copies rows out of
// its cache, with the block's index in the first word.
static uint32_t *pattern;

static tri_status fill(void *user, int32_t b, int32_t tok0, int32_t nb, void *buf) {
    const tri__pcache_header *h = user;
    (void)tok0;
    memcpy(buf, pattern, (size_t)tri__pcache_payload_bytes(h, nb));
    ((uint32_t *)buf)[0] = (uint32_t)b;
    return TRI_STATUS_OK;
}

static tri_status take(void *user, int32_t b, int32_t tok0, int32_t nb, int32_t n_use, const void *buf) {
    const tri__pcache_header *h = user;
    (void)tok0, (void)n_use;
    size_t n = (size_t)tri__pcache_payload_bytes(h, nb) / 4;
    const uint32_t *w = buf;
    if (w[0] != (uint32_t)b) return tri__fail(TRI_STATUS_INTERNAL, "block %d holds block %u", b, w[0]);
    for (size_t i = 1; i < n; i += 997)
        if (w[i] != pattern[i]) return tri__fail(TRI_STATUS_INTERNAL, "block %d word %zu differs", b, i);
    return TRI_STATUS_OK;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    int32_t n_tokens = argc > 2 ? atoi(argv[2]) : 6080;
    int32_t n_layer = argc > 5 ? atoi(argv[3]) : 30, n_head_kv = argc > 5 ? atoi(argv[4]) : 3;
    int32_t head_dim = argc > 5 ? atoi(argv[5]) : 64;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench-prompt-cache.kv", dir);

    tri__pcache_header h = {.model_id = 1,
                            .n_layer = n_layer,
                            .n_head_kv = n_head_kv,
                            .head_dim = head_dim,
                            .kv_type = TRI_DTYPE_F16,
                            .n_vocab = 49152,
                            .n_ctx = n_tokens,
                            .n_tokens = n_tokens};
    if (tri__pcache_layout(&h)) {
        fprintf(stderr, "bench-prompt-cache: %s\n", tri_last_error());
        return 1;
    }
    // the peak over as many bytes as the cache file, and over 1 GiB (past what a host-side cache
    // of a virtual disk may absorb); best of three each
    double peak_w[2] = {0, 0}, peak_r[2] = {0, 0};
    uint64_t peak_bytes[2] = {h.file_bytes, 1ull << 30};
    for (int k = 0; k < 2; k++)
        for (int rep = 0; rep < 3; rep++) {
            double w, r;
            if (tri__pcache_disk_peak(path, peak_bytes[k], &w, &r)) {
                fprintf(stderr, "bench-prompt-cache: disk peak: %s\n", tri_last_error());
                return 1;
            }
            if (w > peak_w[k]) peak_w[k] = w;
            if (r > peak_r[k]) peak_r[k] = r;
        }
    int32_t *tokens = calloc((size_t)n_tokens, sizeof *tokens);
    size_t n_words = (size_t)tri__pcache_payload_bytes(&h, h.block_tokens) / 4;
    pattern = malloc(n_words * 4);
    if (!tokens || !pattern) return 1;
    for (size_t i = 0; i < n_words; i++) pattern[i] = (uint32_t)i * 2654435761u;
    double best_w = 0, best_r = 0;
    tri__pcache_io wio = {0}, rio = {0};
    for (int rep = 0; rep < 3; rep++) {
        tri__pcache_io io;
        if (tri__pcache_write(path, &h, tokens, NULL, fill, &h, &io)) {
            fprintf(stderr, "bench-prompt-cache: write: %s\n", tri_last_error());
            return 1;
        }
        double g = (double)io.bytes / io.seconds / 1e9;
        if (g > best_w) best_w = g, wio = io;
        tri__pcache_file *f;
        if (tri__pcache_open(path, &f) || tri__pcache_read(f, n_tokens, take, &h, &io, NULL)) {
            fprintf(stderr, "bench-prompt-cache: read: %s\n", tri_last_error());
            return 1;
        }
        tri__pcache_close(f);
        g = (double)io.bytes / io.seconds / 1e9;
        if (g > best_r) best_r = g, rio = io;
    }
    unlink(path);
    free(tokens);
    free(pattern);

    // the checksum every block pays on both sides, one thread, over a buffer of 64 MiB
    size_t nbuf = (size_t)64 << 20;
    unsigned char *buf = malloc(nbuf);
    if (!buf) return 1;
    memset(buf, 0x3c, nbuf);
    double sum_gbps = 0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now();
        sink += tri__pcache_sum(buf, nbuf, 0);
        double g = (double)nbuf / (bench_now() - t0) / 1e9;
        if (g > sum_gbps) sum_gbps = g;
    }
    free(buf);

    struct utsname u;
    uname(&u);
    printf("machine: %s %s, %ld CPUs; files under %s\n", u.nodename, u.machine, sysconf(_SC_NPROCESSORS_ONLN), dir);
    for (int k = 0; k < 2; k++)
        printf("disk sequential peak over %.0f MB (4 MiB x 16 in flight, %s): write %.2f GB/s, read %.2f GB/s\n",
               (double)peak_bytes[k] / 1e6, wio.direct ? "O_DIRECT" : "buffered", peak_w[k], peak_r[k]);
    printf("prompt cache, %d tokens of %d layers x %d KV heads x %d f16 (%.1f MB, blocks of %d tokens):\n", n_tokens,
           n_layer, n_head_kv, head_dim, (double)wio.bytes / 1e6, h.block_tokens);
    printf("  write %.2f GB/s (%.0f%% of the same size's peak, %.3f s, %s%s)\n", best_w, 100 * best_w / peak_w[0],
           wio.seconds, wio.uring ? "io_uring" : "pwrite", wio.direct ? ", O_DIRECT" : "");
    printf("  read  %.2f GB/s (%.0f%% of the same size's peak, %.3f s, %s%s)\n", best_r, 100 * best_r / peak_r[0],
           rio.seconds, rio.uring ? "io_uring" : "pread", rio.direct ? ", O_DIRECT" : "");
    printf("checksum: %.2f GB/s on one thread\n", sum_gbps);
    return 0;
}
