// bench-sessions.c - several sessions decoding at once, each in a thread of its own, as a desktop
// application with several chats would: the aggregate tokens per second and the threads the
// process holds meanwhile. A client of the public API only (tri_dep), so that the same program can
// be run against another build of libtriforce.so (LD_LIBRARY_PATH) to compare.
//
// usage: bench-sessions MODEL [N_SESSIONS=4] [TOKENS=32] [N_THREADS=0]
//
// Each session's output is checked first: greedy, every session must give the tokens one session
// alone gives. Then it prints, for 1 and for N sessions at once: tokens/s of all sessions together
// and the process's threads (/proc/self/task) sampled while they run, against the CPUs.
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triforce.h"

#define MAX_SESSIONS 64
#define MAX_TOKENS 1024

typedef struct job {
    tri_session *s;
    int32_t n;
    int32_t out[MAX_TOKENS];
    int32_t n_out;
    tri_status st;
} job;

static const int32_t prompt[] = {1, 504, 3340, 282, 260, 1789, 30};  // ids: any vocabulary of 3,400+
static atomic_int max_threads, running;

static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static bool on_token(int32_t tok, void *user) {
    job *j = user;
    if (j->n_out < MAX_TOKENS) j->out[j->n_out++] = tok;
    int t = count_threads();
    for (int m = atomic_load(&max_threads); t > m && !atomic_compare_exchange_weak(&max_threads, &m, t);) {
    }
    return true;
}

static void *run(void *arg) {
    job *j = arg;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = j->n;
    gp.stop_at_eos = false;
    tri_session_reset(j->s);
    j->n_out = 0;
    j->st = tri_generate(j->s, prompt, (int32_t)(sizeof prompt / sizeof prompt[0]), &gp, on_token, j, NULL);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Runs jobs[0 .. n) at once; returns the wall seconds.
static double run_all(job *jobs, int n) {
    pthread_t th[MAX_SESSIONS];
    atomic_store(&max_threads, 0);
    atomic_store(&running, n);
    double t0 = now();
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, run, &jobs[i])) {
            fprintf(stderr, "bench-sessions: pthread_create failed\n");
            exit(1);
        }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [N_SESSIONS=4] [TOKENS=32] [N_THREADS=0]\n", argv[0]);
        return 2;
    }
    int n_sessions = argc > 2 ? atoi(argv[2]) : 4, n_tokens = argc > 3 ? atoi(argv[3]) : 32;
    int n_threads = argc > 4 ? atoi(argv[4]) : 0;
    if (n_sessions < 1 || n_sessions > MAX_SESSIONS || n_tokens < 1 || n_tokens > MAX_TOKENS) {
        fprintf(stderr, "bench-sessions: 1..%d sessions, 1..%d tokens\n", MAX_SESSIONS, MAX_TOKENS);
        return 2;
    }
    cpu_set_t cpus;
    sched_getaffinity(0, sizeof cpus, &cpus);
    tri_model *m;
    if (tri_model_load(argv[1], NULL, &m)) {
        fprintf(stderr, "bench-sessions: %s\n", tri_last_error());
        return 1;
    }
    static job jobs[MAX_SESSIONS];
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 64 + n_tokens;
    sp.n_threads = n_threads;
    for (int i = 0; i < n_sessions; i++) {
        jobs[i].n = n_tokens;
        if (tri_session_create(m, &sp, &jobs[i].s)) {
            fprintf(stderr, "bench-sessions: %s\n", tri_last_error());
            return 1;
        }
    }
    printf("library %s, %d CPUs, %d sessions of n_threads %d, %d tokens each, base %d threads\n", tri_version(),
           CPU_COUNT(&cpus), n_sessions, n_threads, n_tokens, count_threads());

    run_all(jobs, 1);  // warm-up: pages of the weights, the pool
    double t1 = run_all(jobs, 1);
    int threads1 = atomic_load(&max_threads);
    if (jobs[0].st) {
        fprintf(stderr, "bench-sessions: %s\n", tri_last_error());
        return 1;
    }
    job solo = jobs[0];
    double tn = run_all(jobs, n_sessions);
    int threads_n = atomic_load(&max_threads);
    for (int i = 0; i < n_sessions; i++)
        if (jobs[i].st || jobs[i].n_out != n_tokens ||
            memcmp(jobs[i].out, solo.out, sizeof(int32_t) * (size_t)n_tokens)) {
            fprintf(stderr, "bench-sessions: session %d does not give the solo session's tokens\n", i);
            return 1;
        }
    printf("1 session : %7.1f tok/s, %3d threads at most while decoding\n", n_tokens / t1, threads1);
    printf("%d sessions: %7.1f tok/s in all, %3d threads at most (%d of them the sessions' own)\n", n_sessions,
           n_sessions * n_tokens / tn, threads_n, n_sessions);
    for (int i = 0; i < n_sessions; i++) tri_session_free(jobs[i].s);
    tri_model_free(m);
    return 0;
}
