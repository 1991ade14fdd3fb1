// clock.h - the monotonic clock in seconds, for timings and stats (internal).
#ifndef TRI_CLOCK_H
#define TRI_CLOCK_H

#include <time.h>

// Seconds on CLOCK_MONOTONIC, from an arbitrary origin: only differences mean anything.
static inline double tri__now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif  // TRI_CLOCK_H
