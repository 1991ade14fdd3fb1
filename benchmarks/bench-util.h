// bench-util.h - what every benchmark program measures the same way: wall time and the memory
// bandwidth limit of this machine.
#ifndef TRI_BENCH_UTIL_H
#define TRI_BENCH_UTIL_H

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

#endif  // TRI_BENCH_UTIL_H
