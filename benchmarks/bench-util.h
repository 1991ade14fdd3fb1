// bench-util.h - what every benchmark program measures the same way: wall time and the memory
// bandwidth limit of this machine.
#ifndef TRI_BENCH_UTIL_H
#define TRI_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "tri-config.h"

#if TRI_HAVE_OPENMP
#include <omp.h>
#endif

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The index of the largest of x[0 .. n), the first on ties (a greedy token from a row of logits).
static inline int32_t bench_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Stream-like copy of a buffer much larger than the caches with nt threads: the best of 5 runs,
// in bytes read + written per second. 0 if the buffers cannot be allocated.
static inline double bench_copy_peak(int nt) {
    size_t n = (size_t)64 << 20;  // 256 MiB of floats per side
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return 0.0;
    }
    memset(a, 1, n * sizeof(float));
    memset(b, 0, n * sizeof(float));
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_now();
#if TRI_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
        for (size_t i = 0; i < n; i++) b[i] = a[i];
        double bw = 2.0 * (double)(n * sizeof(float)) / (bench_now() - t0);
        if (bw > best) best = bw;
    }
    (void)nt;
    if (b[n / 2] != a[n / 2]) fprintf(stderr, "copy check failed\n");
    free(a);
    free(b);
    return best;
}

// One line naming the machine: CPU model, cores, kernel.
static inline void bench_print_machine(void) {
    char model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p) {
                    snprintf(model, sizeof model, "%s", p + 2);
                    model[strcspn(model, "\n")] = 0;
                }
                break;
            }
        }
        fclose(f);
    }
    struct utsname u;
    uname(&u);
    printf("machine: %s, %ld cores, %s %s\n", model, sysconf(_SC_NPROCESSORS_ONLN), u.sysname, u.release);
}

// ---- token ids of a benchmark's text ----

// Reads the token ids in path, in either of the two forms the tokenizer scripts write: text, decimal
// ids separated by white space (scripts/tokenize-gguf.py, one per line), or raw little-endian int32
// (benchmarks/tokenize-gguf.py). The form is told by the bytes: text has only digits and white
// space, while int32 ids below 2^24 carry a NUL byte each, so no binary file of real ids reads as
// text. Every id must lie in [0, n_vocab) (n_vocab 0: not checked). Returns the ids (malloc'd, *n
// of them, at least 1), or NULL after printing "PATH: <what is wrong>" to stderr: a file that
// cannot be read, is empty, is neither form (its size is not a multiple of 4, or a value is
// negative), or holds an id out of range.
static inline int32_t *bench_read_ids(const char *path, int32_t n_vocab, int32_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    long bytes = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (bytes < 0 || fseek(f, 0, SEEK_SET) != 0 || bytes > ((long)1 << 32)) {
        fprintf(stderr, "%s: not a regular file of token ids under 4 GiB\n", path);
        fclose(f);
        return NULL;
    }
    unsigned char *buf = malloc((size_t)bytes + 1);
    int32_t *ids = malloc(((size_t)bytes / 2 + 1) * sizeof *ids);  // text: at most one id per 2 bytes
    if (!buf || !ids || fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "%s: cannot read %ld bytes\n", path, bytes);
        goto fail;
    }
    fclose(f);
    f = NULL;
    buf[bytes] = 0;
    bool text = bytes > 0;
    for (long i = 0; i < bytes && text; i++)
        text = (buf[i] >= '0' && buf[i] <= '9') || buf[i] == '\n' || buf[i] == ' ' || buf[i] == '\r' || buf[i] == '\t';
    const char *form = text ? "text ids" : "little-endian int32 ids";
    if (text) {
        char *p = (char *)buf, *end;
        for (;;) {
            while (*p == '\n' || *p == ' ' || *p == '\r' || *p == '\t') p++;
            if (!*p) break;
            long long v = strtoll(p, &end, 10);
            if (v > INT32_MAX) {
                fprintf(stderr, "%s: %s: id %d is %.20s..., past int32\n", path, form, *n, p);
                goto fail;
            }
            ids[(*n)++] = (int32_t)v;
            p = end;
        }
    } else if (bytes == 0) {
        fprintf(stderr, "%s: empty, no token ids\n", path);
        goto fail;
    } else if (bytes % 4) {
        fprintf(stderr, "%s: not token ids in either form: not text (a byte that is neither a digit nor white space) "
                "and not little-endian int32 (%ld bytes, not a multiple of 4); want decimal ids one per line "
                "(scripts/tokenize-gguf.py) or int32 (benchmarks/tokenize-gguf.py)\n", path, bytes);
        goto fail;
    } else {
        *n = (int32_t)(bytes / 4);
        for (int32_t i = 0; i < *n; i++) {
            const unsigned char *b = buf + 4 * (size_t)i;
            ids[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        }
    }
    if (*n == 0) {
        fprintf(stderr, "%s: no token ids (white space only)\n", path);
        goto fail;
    }
    for (int32_t i = 0; i < *n; i++) {
        if (ids[i] < 0 || (n_vocab > 0 && ids[i] >= n_vocab)) {
            fprintf(stderr, "%s: %s: id %d is %d, outside the vocabulary [0, %d)%s\n", path, form, i, ids[i], n_vocab,
                    text ? "" : " (is it int32 ids at all?)");
            goto fail;
        }
    }
    free(buf);
    return ids;
fail:
    if (f) fclose(f);
    free(buf);
    free(ids);
    *n = 0;
    return NULL;
}

#endif  // TRI_BENCH_UTIL_H
