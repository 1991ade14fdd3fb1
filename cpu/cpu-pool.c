// cpu-pool.c - persistent workers that claim chunks of a job from one atomic ticket.
#include "cpu-pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

// The ticket: job generation in the high 40 bits, next unclaimed chunk in the low 24. A claim is
// a compare-and-swap of the ticket, so a thread that read the job's fields of an older
// generation can never run a chunk with them: its swap fails.
#define POOL_CHUNK_BITS 24
#define POOL_CHUNK_MASK ((UINT64_C(1) << POOL_CHUNK_BITS) - 1)
// Idle polls before a worker sleeps: about 50-100 us, longer than the gap between two ops.
#define POOL_SPINS 20000

struct tri__cpu_pool {
    int n_threads;
    pthread_t *workers;  // (n_threads - 1)
    _Atomic uint64_t ticket;
    _Atomic(tri__cpu_chunk_fn) fn;  // the current job, valid for the ticket's generation
    _Atomic(void *) arg;
    _Atomic int64_t n;
    _Atomic int64_t done;  // chunks of the current job finished
    _Atomic int n_sleeping;
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

// Claims and runs chunks of the job current in ticket t until none is left or the job changes.
static void pool_work(tri__cpu_pool *p, uint64_t t) {
    for (;;) {
        tri__cpu_chunk_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        int64_t n = atomic_load_explicit(&p->n, memory_order_relaxed);
        int64_t c = (int64_t)(t & POOL_CHUNK_MASK);
        if (c >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;  // t now holds the current ticket: retry with it (it may be a new job)
        fn(arg, c);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        t++;
    }
}

static void *pool_worker(void *vp) {
    tri__cpu_pool *p = vp;
    uint64_t seen = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        uint64_t t = seen;
        for (int spin = 0; spin < POOL_SPINS; spin++) {
            t = atomic_load_explicit(&p->ticket, memory_order_acquire);
            if (t != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
            POOL_PAUSE();
        }
        if (t == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((t = atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        pool_work(p, t);
        // the next job is a new generation: wait for the ticket to leave this one
        seen = atomic_load_explicit(&p->ticket, memory_order_acquire);
    }
}

tri_status tri__cpu_pool_create(int n_threads, tri__cpu_pool **out) {
    *out = NULL;
    tri__cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu pool");
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    atomic_init(&p->ticket, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->n, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mu, NULL)) goto fail_mu;
    if (pthread_cond_init(&p->cv, NULL)) goto fail_cv;
    p->workers = calloc((size_t)p->n_threads, sizeof *p->workers);
    if (!p->workers) goto fail_workers;
    int started = 0;
    for (; started < p->n_threads - 1; started++)
        if (pthread_create(&p->workers[started], NULL, pool_worker, p)) break;
    if (started < p->n_threads - 1) {
        p->n_threads = started + 1;  // fewer threads than asked: still correct
    }
    *out = p;
    return TRI_STATUS_OK;

fail_workers:
    pthread_cond_destroy(&p->cv);
fail_cv:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    free(p);
    return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu pool: %d threads", n_threads);
}

void tri__cpu_pool_free(tri__cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int tri__cpu_pool_threads(const tri__cpu_pool *p) { return p->n_threads; }

void tri__cpu_pool_run(tri__cpu_pool *p, tri__cpu_chunk_fn fn, void *arg, int64_t n) {
    if (n <= 0) return;
    if (n == 1 || p->n_threads == 1) {
        for (int64_t c = 0; c < n; c++) fn(arg, c);
        return;
    }
    // every chunk of the previous job is done, so no thread is inside pool_work with its fields
    // except to fail a swap
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n, n, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint64_t t = ((atomic_load_explicit(&p->ticket, memory_order_relaxed) >> POOL_CHUNK_BITS) + 1) << POOL_CHUNK_BITS;
    atomic_store(&p->ticket, t);  // seq_cst: ordered before the load of n_sleeping
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    pool_work(p, t);
    for (unsigned spin = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; spin++) {
        POOL_PAUSE();
        if (spin > 4096) sched_yield();  // a worker holding a chunk lost its core
    }
}
