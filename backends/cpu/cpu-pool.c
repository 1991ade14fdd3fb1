// cpu-pool.c - persistent workers that claim chunks of a job from one atomic ticket, and the
// process-wide pools that backends share.
#include "cpu-pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

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

typedef struct pool_worker_arg {
    tri__cpu_pool *p;
    int index;  // 0 .. n_threads - 2
} pool_worker_arg;

struct tri__cpu_pool {
    int n_threads;
    pthread_t *workers;         // (n_threads - 1)
    pool_worker_arg *args;      // (n_threads - 1)
    _Atomic uint64_t ticket;
    _Atomic(tri__cpu_chunk_fn) fn;  // the current job, valid for the ticket's generation
    _Atomic(void *) arg;
    _Atomic int64_t n;
    _Atomic int64_t done;  // chunks of the current job finished
    _Atomic int n_sleeping;
    _Atomic int n_helpers;  // workers with index below this take part in the current job
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    // Callers take turns, first come first served: one job at a time runs on the pool
    pthread_mutex_t turn_mu;
    pthread_cond_t turn_cv;
    uint64_t turn_next;     // tickets handed out
    uint64_t turn_serving;  // the ticket whose job may run
    // shared pools (tri__cpu_pool_acquire): the CPUs they were made for, and their users
    bool shared;
    cpu_set_t cpus;
    int refs;
    tri__cpu_pool *next;
};

// The pool whose job this thread is running (as a worker, or as the caller inside run): a job
// that runs ops on the same pool runs them on its own thread instead of waiting for a turn that
// only its own end would give.
static _Thread_local tri__cpu_pool *tls_pool;

// Claims and runs chunks of the job current in ticket t until none is left or the job changes.
static void pool_work(tri__cpu_pool *p, uint64_t t) {
    for (;;) {
        // acquire: a thread that sees a job's fields sees the closed ticket before them (run_max),
        // so its swap with an older ticket fails
        tri__cpu_chunk_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
        void *arg = atomic_load_explicit(&p->arg, memory_order_acquire);
        int64_t n = atomic_load_explicit(&p->n, memory_order_acquire);
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
    const pool_worker_arg *wa = vp;
    tri__cpu_pool *p = wa->p;
    tls_pool = p;
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
        // written before the ticket (whose store is sequentially consistent): this job's or a
        // later one's, and a later one's only costs a helper, never a wrong chunk (pool_work's swap)
        if (wa->index < atomic_load_explicit(&p->n_helpers, memory_order_relaxed)) pool_work(p, t);
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
    atomic_init(&p->n_helpers, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mu, NULL)) goto fail_mu;
    if (pthread_cond_init(&p->cv, NULL)) goto fail_cv;
    if (pthread_mutex_init(&p->turn_mu, NULL)) goto fail_turn_mu;
    if (pthread_cond_init(&p->turn_cv, NULL)) goto fail_turn_cv;
    p->workers = calloc((size_t)p->n_threads, sizeof *p->workers);
    p->args = calloc((size_t)p->n_threads, sizeof *p->args);
    if (!p->workers || !p->args) goto fail_workers;
    int started = 0;
    for (; started < p->n_threads - 1; started++) {
        p->args[started] = (pool_worker_arg){p, started};
        if (pthread_create(&p->workers[started], NULL, pool_worker, &p->args[started])) break;
    }
    if (started < p->n_threads - 1) {
        p->n_threads = started + 1;  // fewer threads than asked: still correct
    }
    *out = p;
    return TRI_STATUS_OK;

fail_workers:
    free(p->workers);
    free(p->args);
    pthread_cond_destroy(&p->turn_cv);
fail_turn_cv:
    pthread_mutex_destroy(&p->turn_mu);
fail_turn_mu:
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
    free(p->args);
    pthread_cond_destroy(&p->turn_cv);
    pthread_mutex_destroy(&p->turn_mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int tri__cpu_pool_threads(const tri__cpu_pool *p) { return p->n_threads; }

void tri__cpu_pool_run(tri__cpu_pool *p, tri__cpu_chunk_fn fn, void *arg, int64_t n) {
    tri__cpu_pool_run_max(p, 0, fn, arg, n);
}

void tri__cpu_pool_run_max(tri__cpu_pool *p, int max_threads, tri__cpu_chunk_fn fn, void *arg, int64_t n) {
    if (n <= 0) return;
    int nt = max_threads > 0 && max_threads < p->n_threads ? max_threads : p->n_threads;
    if (n == 1 || nt == 1 || tls_pool == p) {
        for (int64_t c = 0; c < n; c++) fn(arg, c);
        return;
    }
    // wait for this caller's turn (jobs of other threads' backends run before it, in order)
    pthread_mutex_lock(&p->turn_mu);
    uint64_t turn = p->turn_next++;
    while (p->turn_serving != turn) pthread_cond_wait(&p->turn_cv, &p->turn_mu);
    pthread_mutex_unlock(&p->turn_mu);
    tri__cpu_pool *outer = tls_pool;  // a job of another pool that this one runs inside
    tls_pool = p;

    // Every chunk of the previous job is done, but a thread may still be inside pool_work with the
    // previous job's last ticket, about to find no chunk left. Were it to read this job's larger
    // n before the ticket moved on, its swap would succeed and run a chunk twice. So the ticket
    // is closed first (a generation whose next chunk, the largest index, is past any job's n) and
    // the fields are released after it: a thread that reads them fails its swap with an older
    // ticket, and claims only once it has read the ticket that opens the job.
    uint64_t gen = atomic_load_explicit(&p->ticket, memory_order_relaxed) >> POOL_CHUNK_BITS;
    atomic_store(&p->ticket, ((gen + 1) << POOL_CHUNK_BITS) | POOL_CHUNK_MASK);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->arg, arg, memory_order_release);
    atomic_store_explicit(&p->n, n, memory_order_release);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_helpers, nt - 1, memory_order_relaxed);
    uint64_t t = (gen + 2) << POOL_CHUNK_BITS;
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

    tls_pool = outer;
    pthread_mutex_lock(&p->turn_mu);
    p->turn_serving++;
    pthread_cond_broadcast(&p->turn_cv);
    pthread_mutex_unlock(&p->turn_mu);
}

// ---- shared pools ----

static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static tri__cpu_pool *shared_pools;  // a list: one per CPU set in use

static void calling_thread_cpus(cpu_set_t *set) {
    CPU_ZERO(set);
    if (pthread_getaffinity_np(pthread_self(), sizeof *set, set) == 0 && CPU_COUNT(set) > 0) return;
    // no affinity to read: every online CPU (as far as a cpu_set_t reaches)
    CPU_ZERO(set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < (n < 1 ? 1 : n) && i < CPU_SETSIZE; i++) CPU_SET((int)i, set);
}

tri_status tri__cpu_pool_acquire(tri__cpu_pool **out) {
    *out = NULL;
    cpu_set_t cpus;
    calling_thread_cpus(&cpus);
    pthread_mutex_lock(&shared_mu);
    tri__cpu_pool *p = shared_pools;
    while (p && !CPU_EQUAL(&p->cpus, &cpus)) p = p->next;
    if (p) {
        p->refs++;
    } else {
        // created by this thread, the workers inherit its affinity: they run on these CPUs only
        tri_status st = tri__cpu_pool_create(CPU_COUNT(&cpus), &p);
        if (st) {
            pthread_mutex_unlock(&shared_mu);
            return st;
        }
        p->shared = true;
        p->cpus = cpus;
        p->refs = 1;
        p->next = shared_pools;
        shared_pools = p;
    }
    pthread_mutex_unlock(&shared_mu);
    *out = p;
    return TRI_STATUS_OK;
}

void tri__cpu_pool_release(tri__cpu_pool *p) {
    if (!p) return;
    if (!p->shared) {
        tri__cpu_pool_free(p);
        return;
    }
    pthread_mutex_lock(&shared_mu);
    bool last = --p->refs == 0;
    if (last) {
        tri__cpu_pool **pp = &shared_pools;
        while (*pp != p) pp = &(*pp)->next;
        *pp = p->next;
    }
    pthread_mutex_unlock(&shared_mu);
    if (last) tri__cpu_pool_free(p);  // joins the workers outside the lock
}
