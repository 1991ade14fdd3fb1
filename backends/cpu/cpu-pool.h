// cpu-pool.h - the CPU backend's persistent worker threads (internal to backends/cpu/).
//
// A job is n chunks of work; the calling thread and the workers claim chunks one at a time from
// a shared counter, and the call returns once every chunk is done. No thread waits for another to
// *arrive*, only for claimed chunks to finish: on a machine shared with other processes a worker
// that is not running simply claims nothing, where a fork/join barrier would wait a time slice for
// it. Idle workers spin briefly (ops follow each other within microseconds during a forward
// pass), then sleep on a condition variable.
//
// Backends share pools: tri__cpu_pool_acquire gives every backend whose thread runs on the same
// CPUs (its affinity mask: the whole machine, or one NUMA node's cores for a thread bound there)
// the same pool, one thread per CPU, so several sessions never start more threads than there are
// cores. Callers on different threads take turns, one job at a time on the whole pool, first come
// first served; each job runs on all of the pool's threads, or as many as the caller asks.
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
// done. Calls from several threads run one after another, in the order they came. n < 2^24. A
// chunk that calls it again on the same pool runs that job on its own thread.
void tri__cpu_pool_run(tri__cpu_pool *p, tri__cpu_chunk_fn fn, void *arg, int64_t n);
// As tri__cpu_pool_run on at most max_threads of the pool's threads, the caller included
// (<= 0: all of them).
void tri__cpu_pool_run_max(tri__cpu_pool *p, int max_threads, tri__cpu_chunk_fn fn, void *arg, int64_t n);

// The process-wide pool of the calling thread's CPUs (its affinity mask), made with one thread per
// CPU by the first caller, whose binding its workers inherit; later callers on the same CPUs get
// the same pool. Each acquire is paired with a release; the last release stops the workers.
tri_status tri__cpu_pool_acquire(tri__cpu_pool **out);
// Releases a pool from tri__cpu_pool_acquire (a pool from tri__cpu_pool_create is freed); NULL is
// a no-op.
void tri__cpu_pool_release(tri__cpu_pool *p);

#endif  // TRI_CPU_POOL_H
