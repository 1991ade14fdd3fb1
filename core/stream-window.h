// stream-window.h - which store rows a StreamingLLM step attends to, as one set of inline
// functions for the host (kv/policy-streaming.c, the CPU backend) and the device (the CUDA
// backend's window kernel), so that a step whose view is computed on the device gathers exactly
// the rows the policy's own step gathers (internal; docs/kv-policies.md, "StreamingLLM").
//
// Positions are a stream's token indices; rows are where a bounded store keeps them: the sinks in
// rows 0 .. sink - 1, position i >= sink in row sink + (i - sink) % ring_rows (ring_rows 0: the
// store keeps every position at its own row).
#ifndef TRI_STREAM_WINDOW_H
#define TRI_STREAM_WINDOW_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(TRI_CUDA_EMULATED)
#define TRI_HOST_DEVICE __host__ __device__
#else
#define TRI_HOST_DEVICE
#endif

typedef struct tri__stream_window {
    int32_t sink;         // attention sinks, < budget
    int32_t budget;       // sinks + window: past tokens a step attends to
    int32_t evict_every;  // past the budget, tokens between evictions; <= 1: every token
    int32_t ring_rows;    // rows of the store's ring; 0: every position has its own row
} tri__stream_window;

// The store row of position pos.
static inline TRI_HOST_DEVICE int32_t tri__window_row(const tri__stream_window *w, int32_t pos) {
    if (!w->ring_rows || pos < w->sink) return pos;
    return w->sink + (pos - w->sink) % w->ring_rows;
}

// The first position of the eviction interval holding pos: 0 up to the budget (nothing evicted),
// past it intervals of evict_every tokens from budget + 1 on.
static inline TRI_HOST_DEVICE int32_t tri__window_start(const tri__stream_window *w, int32_t pos) {
    if (pos <= w->budget) return 0;
    int32_t e = w->evict_every > 1 ? w->evict_every : 1;
    return w->budget + 1 + (pos - w->budget - 1) / e * e;
}

// Past rows a step starting at length n0 attends to: every position before n0 up to the budget,
// then the sinks, the budget - sink positions before n0's interval and the interval up to n0. The
// step's first token sits at this cache position (its rank in the view).
static inline TRI_HOST_DEVICE int32_t tri__window_kept(const tri__stream_window *w, int32_t n0) {
    int32_t start = tri__window_start(w, n0);
    return start == 0 ? n0 : w->budget + (n0 - start);
}

// The position of row i (0 <= i < kept) of the view of a step at n0, in cache order.
static inline TRI_HOST_DEVICE int32_t tri__window_pos(const tri__stream_window *w, int32_t n0, int32_t i) {
    int32_t start = tri__window_start(w, n0);
    if (start == 0 || i < w->sink) return i;
    return start - (w->budget - w->sink) + (i - w->sink);
}

#endif  // TRI_STREAM_WINDOW_H
