// cpu-pool.h - the CPU backend's persistent worker threads (internal to cpu/).
//
// A job is n chunks of work; the calling thread and the workers claim chunks one at a time from
// a shared counter, and the call returns once every chunk is done. No thread waits for another to
// *arrive*, only for claimed chunks to finish: on a machine shared with other processes a worker
// that is not running simply claims nothing, where a fork/join barrier would wait a time slice for
// it. Idle workers spin briefly (ops follow each other within microseconds during a forward
// pass), then sleep on a condition variable.
#ifndef TRI_CPU_POOL_H
#define TRI_CPU_POOL_H

#include <stdint.h>

#include "triforce.h"

typedef struct tri__cpu_pool tri__cpu_pool;

// Runs chunk c of a job: fn(arg, c) for c in [0, n).
typedef void (*tri__cpu_chunk_fn)(void *arg, int64_t c);

// A pool of n_threads - 1 workers (the caller is the last thread); n_threads >= 1.
tri_status tri__cpu_pool_create(int n_threads, tri__cpu_pool **out);
// Stops and joins the workers; NULL is a no-op.
void tri__cpu_pool_free(tri__cpu_pool *p);
// Threads of the pool, the caller included.
int tri__cpu_pool_threads(const tri__cpu_pool *p);
// Runs fn(arg, c) for every c in [0, n) on the pool and the calling thread; returns when all are
// done. One job at a time (the backend issues ops from one thread). n < 2^24.
void tri__cpu_pool_run(tri__cpu_pool *p, tri__cpu_chunk_fn fn, void *arg, int64_t n);

#endif  // TRI_CPU_POOL_H
