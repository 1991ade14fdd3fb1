// bench-prefetch.c - disk read GB/s of the weight reader: io_uring vs pread threads vs one
// synchronous pread loop vs buffered read(), on a file this program writes.
//
// usage: bench-prefetch [FILE [MiB]]   (default: ./bench-prefetch.bin, 1024 MiB; deleted after)
//
// Every word of the file is a hash of its offset, so each layer read is checked before it counts.
// The page cache: after writing, the file is fsynced and its pages dropped with
// posix_fadvise(POSIX_FADV_DONTNEED) before each buffered run (no root needed, unlike
// drop_caches); O_DIRECT runs bypass the cache, so those are the honest disk numbers. The warm
// buffered run reads the file from the page cache on purpose, as a memory-copy ceiling.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "bench-util.h"
#include "prefetch.h"

#define LAYER_BYTES ((uint64_t)64 << 20)  // one "layer" of tensors: 64 MiB
#define N_SLOTS 3                          // upload i, read i + 1 and i + 2

static uint64_t word_at(uint64_t off) {  // the file's content: splitmix64 of the offset
    uint64_t z = off + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int write_file(const char *path, uint64_t bytes) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return perror(path), -1;
    size_t chunk = (size_t)8 << 20;
    uint64_t *buf = malloc(chunk);
    for (uint64_t off = 0; off < bytes; off += chunk) {
        for (size_t i = 0; i < chunk / 8; i++) buf[i] = word_at(off + 8 * i);
        size_t n = bytes - off < chunk ? (size_t)(bytes - off) : chunk;
        if (write(fd, buf, n) != (ssize_t)n) return perror("write"), free(buf), close(fd), -1;
    }
    free(buf);
    if (fsync(fd) != 0) perror("fsync");
    close(fd);
    return 0;
}

// Drops the file's clean pages from the page cache; returns the bytes still cached after (via
// mincore would need a mapping; we report the fadvise status only).
static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (r != 0) fprintf(stderr, "posix_fadvise(DONTNEED): %s\n", strerror(r));
    close(fd);
}

// Checks words of buf that hold file bytes [off, off + len): every 4 KiB, first word.
static int check(const char *buf, uint64_t off, uint64_t len) {
    for (uint64_t o = 0; o + 8 <= len; o += 4096) {
        uint64_t w;
        memcpy(&w, buf + o, 8);
        if ((off + o) % 8 == 0 && w != word_at(off + o)) {
            fprintf(stderr, "data check failed at offset %" PRIu64 "\n", off + o);
            return -1;
        }
    }
    return 0;
}

// Reads the whole file layer by layer through the reader, N_SLOTS layers in flight. Ranges are
// deliberately unaligned by 100 bytes, as GGUF tensors are not page-aligned in general.
static double run_reader(const char *path, uint64_t bytes, tri__prefetch_engine engine,
                         tri__prefetch_direct direct, int32_t qd, uint32_t req, int32_t threads,
                         char *label, size_t label_cap, void **slots) {
    tri__prefetch_params p = tri__prefetch_default_params();
    p.engine = engine;
    p.direct = direct;
    p.queue_depth = qd;
    p.request_bytes = req;
    p.n_threads = threads;
    tri__prefetch *pf;
    if (tri__prefetch_open(path, &p, &pf) != TRI_STATUS_OK) {
        fprintf(stderr, "%s\n", tri_last_error());
        return -1;
    }
    size_t sizes[N_SLOTS];
    for (int i = 0; i < N_SLOTS; i++) sizes[i] = LAYER_BYTES + 8192;
    if (tri__prefetch_set_slots(pf, N_SLOTS, slots, sizes) != TRI_STATUS_OK) {
        fprintf(stderr, "%s\n", tri_last_error());
        tri__prefetch_close(pf);
        return -1;
    }
    snprintf(label, label_cap, "%s%s%s", tri__prefetch_uses_uring(pf) ? "io_uring" : "pread",
             tri__prefetch_uses_direct(pf) ? " O_DIRECT" : " buffered",
             tri__prefetch_uses_fixed_buffers(pf) ? " fixed-bufs" : "");
    int64_t n_layers = (int64_t)((bytes - 200) / LAYER_BYTES);
    tri__read_range r[N_SLOTS];
    uint64_t dst[N_SLOTS];
    double t0 = bench_now();
    int64_t next = 0;
    for (int64_t i = 0; i < n_layers + N_SLOTS; i++) {
        int s = (int)(i % N_SLOTS);
        if (i >= N_SLOTS) {
            if (tri__prefetch_wait(pf, s) != TRI_STATUS_OK) {
                fprintf(stderr, "%s\n", tri_last_error());
                tri__prefetch_close(pf);
                return -1;
            }
            if (check((char *)slots[s] + dst[s], r[s].offset, r[s].len) != 0) {
                tri__prefetch_close(pf);
                return -1;
            }
        }
        if (next < n_layers) {
            r[s] = (tri__read_range){100 + (uint64_t)next * LAYER_BYTES, LAYER_BYTES};
            if (tri__prefetch_submit(pf, s, &r[s], 1, &dst[s]) != TRI_STATUS_OK) {
                fprintf(stderr, "%s\n", tri_last_error());
                tri__prefetch_close(pf);
                return -1;
            }
            next++;
        }
    }
    double dt = bench_now() - t0;
    tri__prefetch_close(pf);
    return (double)n_layers * (double)LAYER_BYTES / dt / 1e9;
}

// One thread, read() of 1 MiB at a time: the simplest possible loader.
static double run_plain(const char *path, uint64_t bytes, bool direct, void *buf) {
    int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0) return perror(path), -1;
    size_t chunk = (size_t)1 << 20;
    double t0 = bench_now();
    uint64_t off = 0;
    for (;;) {
        ssize_t n = read(fd, buf, chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("read");
            close(fd);
            return -1;
        }
        if (n == 0) break;
        if (check(buf, off, (uint64_t)n) != 0) {
            close(fd);
            return -1;
        }
        off += (uint64_t)n;
    }
    double dt = bench_now() - t0;
    close(fd);
    if (off != bytes) fprintf(stderr, "read %" PRIu64 " of %" PRIu64 " bytes\n", off, bytes);
    return (double)off / dt / 1e9;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "bench-prefetch.bin";
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    uint64_t bytes = mib << 20;
    if (bytes < 2 * LAYER_BYTES) bytes = 2 * LAYER_BYTES;
    bench_print_machine();
    printf("file: %s, %" PRIu64 " MiB, layers of %" PRIu64 " MiB (ranges unaligned by 100 B), %d "
           "slots in flight\n",
           path, bytes >> 20, LAYER_BYTES >> 20, N_SLOTS);
    if (write_file(path, bytes) != 0) return 1;

    tri__arena *arena;
    if (tri__arena_create(NULL, &arena) != TRI_STATUS_OK) return 1;
    void *slots[N_SLOTS];
    for (int i = 0; i < N_SLOTS; i++)
        if (tri__arena_alloc(arena, LAYER_BYTES + 8192, "staging", &slots[i]) != TRI_STATUS_OK) {
            fprintf(stderr, "%s\n", tri_last_error());
            return 1;
        }

    struct {
        const char *what;
        tri__prefetch_engine engine;
        tri__prefetch_direct direct;
        int32_t qd;
        uint32_t req;
        int32_t threads;
    } cases[] = {
        {"io_uring QD64 x 1 MiB", TRI_PREFETCH_ENGINE_URING, TRI_PREFETCH_DIRECT_ON, 64, 1u << 20, 1},
        {"io_uring QD8 x 1 MiB", TRI_PREFETCH_ENGINE_URING, TRI_PREFETCH_DIRECT_ON, 8, 1u << 20, 1},
        {"io_uring QD64 x 128 KiB", TRI_PREFETCH_ENGINE_URING, TRI_PREFETCH_DIRECT_ON, 64, 128u << 10, 1},
        {"pread 4 threads x 1 MiB", TRI_PREFETCH_ENGINE_PREAD, TRI_PREFETCH_DIRECT_ON, 64, 1u << 20, 4},
        {"io_uring QD64, cold cache", TRI_PREFETCH_ENGINE_URING, TRI_PREFETCH_DIRECT_OFF, 64, 1u << 20, 1},
    };
    printf("\n%-28s %-34s %8s\n", "case", "engine", "GB/s");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int rep = 0; rep < 2; rep++) {
            if (cases[c].direct == TRI_PREFETCH_DIRECT_OFF) drop_cache(path);
            char label[96] = "";
            double gbs = run_reader(path, bytes, cases[c].engine, cases[c].direct, cases[c].qd,
                                    cases[c].req, cases[c].threads, label, sizeof label, slots);
            if (gbs < 0) return 1;
            printf("%-28s %-34s %8.2f\n", cases[c].what, label, gbs);
        }
    }
    for (int rep = 0; rep < 2; rep++) {
        printf("%-28s %-34s %8.2f\n", "read() 1 MiB, one thread", "sync O_DIRECT",
               run_plain(path, bytes, true, slots[0]));
    }
    for (int rep = 0; rep < 2; rep++) {
        drop_cache(path);
        printf("%-28s %-34s %8.2f\n", "read() 1 MiB, one thread", "sync buffered, cold cache",
               run_plain(path, bytes, false, slots[0]));
    }
    run_plain(path, bytes, false, slots[0]);  // warm the cache
    printf("%-28s %-34s %8.2f\n", "read() 1 MiB, one thread", "sync buffered, warm cache",
           run_plain(path, bytes, false, slots[0]));
    tri__arena_free(arena);
    unlink(path);
    return 0;
}
