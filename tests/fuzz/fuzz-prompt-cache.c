// fuzz-prompt-cache.c - libFuzzer target for the prompt cache's reader (engine/prompt-cache.c):
// the input becomes a file (a memfd, reached through /proc/self/fd so the real open and read path
// runs, O_DIRECT refusal included) that is opened and read block by block; then the header parser
// and the region check run on a copy whose checksums were made to match, so that the range and
// layout checks behind them are reached too. A file that opens must describe itself consistently.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "prompt-cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) { (void)level, (void)msg, (void)user; }

static tri_status take(void *user, int32_t b, int32_t tok0, int32_t nb, int32_t n_use, const void *buf) {
    const tri__pcache_header *h = user;
    TRI_ASSERT(b >= 0 && b < h->n_blocks && tok0 == b * h->block_tokens && n_use >= 0 && n_use <= nb);
    const unsigned char *p = buf;
    volatile unsigned x = 0;
    for (uint64_t i = 0; i < tri__pcache_payload_bytes(h, nb); i += 64) x += p[i];  // ASan sees the slot
    return TRI_STATUS_OK;
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    int fd = memfd_create("fuzz-prompt-cache", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tri__pcache_file *f;
    if (tri__pcache_open(path, &f) == TRI_STATUS_OK) {
        const tri__pcache_header *h = tri__pcache_file_header(f);
        TRI_ASSERT(h->file_bytes == size && h->region_bytes <= size && h->n_tokens >= 1);
        (void)tri__pcache_read(f, h->n_tokens, take, (void *)h, NULL, NULL);
        tri__pcache_close(f);
    }
    close(fd);

    // the same bytes with the header's and the region's checksums recomputed
    if (size >= TRI_PCACHE_HEADER_BYTES) {
        unsigned char *copy = malloc(size);
        if (!copy) return 0;
        memcpy(copy, data, size);
        put64(copy + 120, tri__pcache_sum(copy, 120, 0));
        tri__pcache_header h;
        if (tri__pcache_parse_header("fuzz.kv", copy, size, size, &h) == TRI_STATUS_OK) {
            TRI_ASSERT(h.region_bytes <= size && h.n_blocks >= 1 && h.block_tokens >= 1);
            put64(copy + 48,
                  tri__pcache_sum(copy + TRI_PCACHE_HEADER_BYTES, h.region_bytes - TRI_PCACHE_HEADER_BYTES, 0));
            put64(copy + 120, tri__pcache_sum(copy, 120, 0));
            if (tri__pcache_parse_header("fuzz.kv", copy, size, size, &h) == TRI_STATUS_OK &&
                tri__pcache_check_region("fuzz.kv", &h, copy) == TRI_STATUS_OK) {
                const int32_t *tok = tri__pcache_tokens(copy);
                for (int32_t i = 0; i < h.n_tokens; i++) TRI_ASSERT(tok[i] >= 0 && tok[i] < h.n_vocab);
                (void)tri__pcache_block_sums(&h, copy);
            }
        }
        free(copy);
    }
    return 0;
}
