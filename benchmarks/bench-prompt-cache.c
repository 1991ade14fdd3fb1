// bench-prompt-cache.c - the prompt cache's write and read speed against the disk's sequential
// peak, measured on the same file system by the same engine at its best.
//
// usage: bench-prompt-cache [DIR [TOKENS [LAYERS KV_HEADS HEAD_DIM]]]
//        (default: ., 6080 tokens of SmolLM2-135M's shape: 30 layers x 3 KV heads x 64, f16)
//
// The peak: 1 GiB written in 4 MiB requests, 16 in flight, O_DIRECT where allowed, fdatasync, then
// read back (tri__pcache_disk_peak). The cache: a file of the given shape written and read by
// tri__pcache_write / tri__pcache_read, rows filled with a pattern that the read checks, so each
// figure counts the staging copies and checksums a session's save and load pay (not the copies
// out of and into the KV store). Best of three each way; the files are deleted after.
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench-util.h"
#include "error.h"
#include "prompt-cache.h"

static uint32_t word(int32_t b, size_t i) { return (uint32_t)b * 2654435761u ^ (uint32_t)i * 40503u; }

static tri_status fill(void *user, int32_t b, int32_t tok0, int32_t nb, void *buf) {
    const tri__pcache_header *h = user;
    (void)tok0;
    size_t n = (size_t)tri__pcache_payload_bytes(h, nb) / 4;
    uint32_t *w = buf;
    for (size_t i = 0; i < n; i++) w[i] = word(b, i);
    return TRI_STATUS_OK;
}

static tri_status take(void *user, int32_t b, int32_t tok0, int32_t nb, int32_t n_use, const void *buf) {
    const tri__pcache_header *h = user;
    (void)tok0, (void)n_use;
    size_t n = (size_t)tri__pcache_payload_bytes(h, nb) / 4;
    const uint32_t *w = buf;
    for (size_t i = 0; i < n; i += 997)
        if (w[i] != word(b, i)) return tri__fail(TRI_STATUS_INTERNAL, "block %d word %zu differs", b, i);
    return TRI_STATUS_OK;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    int32_t n_tokens = argc > 2 ? atoi(argv[2]) : 6080;
    int32_t n_layer = argc > 5 ? atoi(argv[3]) : 30, n_head_kv = argc > 5 ? atoi(argv[4]) : 3;
    int32_t head_dim = argc > 5 ? atoi(argv[5]) : 64;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench-prompt-cache.kv", dir);

    double peak_w = 0, peak_r = 0;
    for (int rep = 0; rep < 3; rep++) {
        double w, r;
        if (tri__pcache_disk_peak(path, 1ull << 30, &w, &r)) {
            fprintf(stderr, "bench-prompt-cache: disk peak: %s\n", tri_last_error());
            return 1;
        }
        if (w > peak_w) peak_w = w;
        if (r > peak_r) peak_r = r;
    }

    tri__pcache_header h = {.model_id = 1, .n_layer = n_layer, .n_head_kv = n_head_kv, .head_dim = head_dim,
                            .kv_type = TRI_DTYPE_F16, .n_vocab = 49152, .n_ctx = n_tokens, .n_tokens = n_tokens};
    int32_t *tokens = calloc((size_t)n_tokens, sizeof *tokens);
    if (!tokens) return 1;
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
        if (tri__pcache_open(path, &f) || tri__pcache_read(f, n_tokens, take, &h, &io)) {
            fprintf(stderr, "bench-prompt-cache: read: %s\n", tri_last_error());
            return 1;
        }
        tri__pcache_close(f);
        g = (double)io.bytes / io.seconds / 1e9;
        if (g > best_r) best_r = g, rio = io;
    }
    unlink(path);
    free(tokens);

    struct utsname u;
    uname(&u);
    printf("machine: %s %s, %ld CPUs; files under %s\n", u.nodename, u.machine, sysconf(_SC_NPROCESSORS_ONLN), dir);
    printf("disk sequential peak (4 MiB x 16 in flight, %s): write %.2f GB/s, read %.2f GB/s\n",
           wio.direct ? "O_DIRECT" : "buffered", peak_w, peak_r);
    printf("prompt cache, %d tokens of %d layers x %d KV heads x %d f16 (%.1f MB, blocks of %d tokens):\n", n_tokens,
           n_layer, n_head_kv, head_dim, (double)wio.bytes / 1e6, h.block_tokens);
    printf("  write %.2f GB/s (%.0f%% of peak, %.3f s, %s%s)\n", best_w, 100 * best_w / peak_w, wio.seconds,
           wio.uring ? "io_uring" : "pwrite", wio.direct ? ", O_DIRECT" : "");
    printf("  read  %.2f GB/s (%.0f%% of peak, %.3f s, %s%s)\n", best_r, 100 * best_r / peak_r, rio.seconds,
           rio.uring ? "io_uring" : "pread", rio.direct ? ", O_DIRECT" : "");
    return 0;
}
