// tensor-parallel.c - device lists, the split by KV head, shard models, rank threads and the
// host-memory all-reduce (see tensor-parallel.h).
#include "tensor-parallel.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend-select.h"
#include "dtype.h"
#include "error.h"
#include "placement.h"
#include "topology.h"
#include "weights.h"

// ---- device lists ----

tri_status tri__device_list_parse(const char *list, tri__device_ref *out, int32_t *n) {
    *n = 0;
    if (!list || !*list) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list: empty");
    const char *p = list;
    for (int32_t i = 0;; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list '%s': entry %d is %s", list, i + 1,
                             len == 0 ? "empty" : "too long");
        if (i >= TRI_TP_MAX)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list '%s': more than %d devices", list, TRI_TP_MAX);
        memcpy(item, p, len);
        item[len] = 0;
        tri__device_ref d = {TRI_DEVICE_CPU, 0};
        const char *num = NULL;
        if (strncmp(item, "cpu", 3) == 0) d.kind = TRI_DEVICE_CPU, num = item + 3;
        else if (strncmp(item, "cuda", 4) == 0) d.kind = TRI_DEVICE_CUDA, num = item + 4;
        else
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "device list '%s': '%s' is not a device (want cpu:N or cuda:N)", list, item);
        if (*num == ':') {
            char *e;
            errno = 0;
            long v = num[1] >= '0' && num[1] <= '9' ? strtol(num + 1, &e, 10) : -1;
            if (v < 0 || errno || *e || v > 1024)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list '%s': '%s' has no valid device index", list,
                                 item);
            d.index = (int32_t)v;
        } else if (*num) {
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "device list '%s': '%s' is not a device (want cpu:N or cuda:N)", list, item);
        }
        for (int32_t j = 0; j < i; j++) {
            if (out[j].kind != d.kind)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list '%s': cpu and cuda devices mixed", list);
            if (out[j].index == d.index)
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "device list '%s': '%s' appears twice", list, item);
        }
        out[i] = d;
        *n = i + 1;
        if (!end) break;
        p = end + 1;
    }
    return TRI_STATUS_OK;
}

// ---- ranks and the all-reduce ----

typedef struct rank_buf {
    float *host[2];  // (cap) each, pinned where the backend can pin; calls alternate between them
    int64_t cap;
    float *sum;      // (cap) host: what goes back up
    bool pinned;
} rank_buf;

struct tri__tp {
    int32_t n;
    tri__backend *be[TRI_TP_MAX];
    int32_t node[TRI_TP_MAX];
    pthread_t thread[TRI_TP_MAX];
    int32_t started;  // threads running (ranks 1 .. started)
    rank_buf buf[TRI_TP_MAX];
    int64_t calls[TRI_TP_MAX];  // all-reduces each rank made in this run (picks the buffer parity)
    // peer path (every pair of devices has peer access): each rank reads the others' partials
    // device to device and sums on its device
    bool peer;
    float *xptr[TRI_TP_MAX];    // each rank's x of the current all-reduce (its backend's memory)
    float *acc[TRI_TP_MAX], *tmp[TRI_TP_MAX];  // (dcap) each, rank r's backend memory
    int64_t dcap[TRI_TP_MAX];
    // the backend's collective (NCCL on CUDA devices) where it has one: the all-reduce is one op on
    // each rank's compute stream, with no host wait and no barrier
    tri__comm *comm;
    // recorded on each rank's compute stream when its x is complete: the all-reduce waits for that
    // work only, not for the next layer's KV or weights the transfer stream is prefetching
    tri__event *done[TRI_TP_MAX];

    pthread_mutex_t mu;
    pthread_cond_t cv;       // a new job, a rank done
    pthread_cond_t bar_cv;   // the barrier
    // the job
    uint64_t job;            // incremented per run
    bool quit;
    tri__tp_fn fn;
    void *ctx;
    int32_t n_done;
    tri_status st[TRI_TP_MAX];
    char msg[TRI_TP_MAX][512];
    int32_t failed;          // the first rank that failed in this run, -1
    // the barrier
    int32_t arrived;
    uint64_t gen;
};

int32_t tri__tp_n(const tri__tp *tp) { return tp ? tp->n : 1; }

static void rank_exec(tri__tp *tp, int32_t r) {
    tri_status st = tp->fn(tp->ctx, r);
    pthread_mutex_lock(&tp->mu);
    tp->st[r] = st;
    if (st) {
        snprintf(tp->msg[r], sizeof tp->msg[r], "%s", tri_last_error());
        if (tp->failed < 0) tp->failed = r;
        pthread_cond_broadcast(&tp->bar_cv);  // nobody waits for this rank any more
    }
    tp->n_done++;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
}

typedef struct worker_arg {
    tri__tp *tp;
    int32_t rank;
} worker_arg;

static void *worker(void *p) {
    worker_arg a = *(worker_arg *)p;
    free(p);
    tri__tp *tp = a.tp;
    if (tp->node[a.rank] >= 0) {  // this rank's host work (and its CPU backend's threads) on its node
        const tri__topology *topo = NULL;
        (void)tri__host_node_near(NULL, &topo);
        if (topo && tri__topology_bind_thread(topo, tp->node[a.rank]) != TRI_STATUS_OK)
            tri__log(TRI_LOG_LEVEL_INFO, "tensor parallel: rank %d stays unbound (node %d refused)", a.rank,
                     tp->node[a.rank]);
    }
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->quit && tp->job == seen) pthread_cond_wait(&tp->cv, &tp->mu);
        if (tp->quit) break;
        seen = tp->job;
        pthread_mutex_unlock(&tp->mu);
        rank_exec(tp, a.rank);
        pthread_mutex_lock(&tp->mu);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

static void buf_release(tri__tp *tp, int32_t r) {
    rank_buf *b = &tp->buf[r];
    tri__backend *be = tp->be[r];
    for (int i = 0; i < 2; i++) {
        if (b->pinned && b->host[i]) be->ops->host_unregister(be, b->host[i]);
        free(b->host[i]);
        b->host[i] = NULL;
    }
    free(b->sum);
    b->sum = NULL;
    b->cap = 0;
    b->pinned = false;
}

void tri__tp_free(tri__tp *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int32_t r = 1; r <= tp->started; r++) pthread_join(tp->thread[r], NULL);
    if (tp->comm) {  // after the ranks' work: a synchronize of each first
        for (int32_t r = 0; r < tp->n; r++) (void)tp->be[r]->ops->synchronize(tp->be[r]);
        tp->be[0]->ops->comm_free(tp->comm);
    }
    for (int32_t r = 0; r < tp->n; r++) {
        buf_release(tp, r);
        tp->be[r]->ops->free(tp->be[r], tp->acc[r]);
        tp->be[r]->ops->free(tp->be[r], tp->tmp[r]);
        if (tp->done[r]) tp->be[r]->ops->event_destroy(tp->be[r], tp->done[r]);
    }
    pthread_cond_destroy(&tp->bar_cv);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->mu);
    free(tp);
}

tri_status tri__tp_create(int32_t n, tri__backend *const *bes, const int32_t *nodes, tri__tp **out) {
    *out = NULL;
    if (n < 2 || n > TRI_TP_MAX)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tensor parallel: %d ranks, want 2 .. %d", n, TRI_TP_MAX);
    tri__tp *tp = calloc(1, sizeof *tp);
    if (!tp) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: ranks");
    tp->n = n;
    tp->failed = -1;
    for (int32_t r = 0; r < n; r++) tp->be[r] = bes[r], tp->node[r] = nodes ? nodes[r] : -1;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    pthread_cond_init(&tp->bar_cv, NULL);
    for (int32_t r = 1; r < n; r++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) *a = (worker_arg){tp, r};
        int err = a ? pthread_create(&tp->thread[r], NULL, worker, a) : ENOMEM;
        if (err) {
            free(a);
            tri__tp_free(tp);
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: thread for rank %d: %s", r, strerror(err));
        }
        tp->started = r;
    }
    // the backend's collective where every rank has the same backend and it has one (NCCL, unless
    // TRI_NO_NCCL is set); else peer copies where every pair of devices allows them (and the
    // backend can add and copy); else host memory
    bool same = true;
    for (int32_t r = 1; r < n; r++) same = same && bes[r]->ops == bes[0]->ops;
    if (same && bes[0]->ops->comm_create && bes[0]->ops->allreduce) {
        tri_status st = bes[0]->ops->comm_create(bes, n, &tp->comm);
        if (st) {
            tp->comm = NULL;
            tri__log(st == TRI_STATUS_NOT_FOUND ? TRI_LOG_LEVEL_INFO : TRI_LOG_LEVEL_WARN,
                     "tensor parallel: no collective library (%s); the all-reduce goes another way", tri_last_error());
        }
    }
    tp->peer = !tp->comm;
    for (int32_t r = 0; r < n && tp->peer; r++) {
        const tri__backend_ops *op = bes[r]->ops;
        tp->peer = op->peer_enable && op->copy_peer && op->copy && op->add;
        for (int32_t s = 0; s < n && tp->peer; s++)
            if (s != r) tp->peer = op->peer_enable(bes[r], bes[s]);
    }
    tri__log(TRI_LOG_LEVEL_INFO, "tensor parallel: %d devices, all-reduce %s", n,
             tp->comm   ? "by the backend's collective (NCCL)"
             : tp->peer ? "by peer copies"
                        : "through host memory");
    *out = tp;
    return TRI_STATUS_OK;
}

bool tri__tp_uses_peers(const tri__tp *tp) { return tp && tp->peer; }

bool tri__tp_uses_comm(const tri__tp *tp) { return tp && tp->comm; }

tri_status tri__tp_run(tri__tp *tp, tri__tp_fn fn, void *ctx) {
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_done = 0;
    tp->failed = -1;
    tp->arrived = 0;
    for (int32_t r = 0; r < tp->n; r++) tp->st[r] = TRI_STATUS_OK, tp->calls[r] = 0;
    tp->job++;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    rank_exec(tp, 0);
    pthread_mutex_lock(&tp->mu);
    while (tp->n_done < tp->n) pthread_cond_wait(&tp->cv, &tp->mu);
    int32_t f = tp->failed;
    pthread_mutex_unlock(&tp->mu);
    if (f < 0) return TRI_STATUS_OK;
    return tri__fail(tp->st[f], "%s", tp->msg[f]);
}

// Waits until every rank arrived; CANCELLED when one failed (and will never arrive).
static tri_status barrier(tri__tp *tp) {
    pthread_mutex_lock(&tp->mu);
    tri_status st = TRI_STATUS_OK;
    if (tp->failed >= 0) {
        st = tp->st[tp->failed];
    } else if (++tp->arrived == tp->n) {
        tp->arrived = 0;
        tp->gen++;
        pthread_cond_broadcast(&tp->bar_cv);
    } else {
        uint64_t gen = tp->gen;
        while (tp->gen == gen && tp->failed < 0) pthread_cond_wait(&tp->bar_cv, &tp->mu);
        if (tp->gen == gen) st = tp->st[tp->failed];
    }
    pthread_mutex_unlock(&tp->mu);
    return st ? tri__fail(st, "tensor parallel: another device failed; the all-reduce stops") : TRI_STATUS_OK;
}

// Room for n floats in rank r's buffers (its own: only r touches them outside the barrier).
static tri_status buf_reserve(tri__tp *tp, int32_t r, int64_t n) {
    rank_buf *b = &tp->buf[r];
    if (n <= b->cap) return TRI_STATUS_OK;
    buf_release(tp, r);
    tri__backend *be = tp->be[r];
    size_t bytes = ((size_t)n * sizeof(float) + 4095) / 4096 * 4096;
    for (int i = 0; i < 2; i++)
        if (posix_memalign((void **)&b->host[i], 4096, bytes)) b->host[i] = NULL;
    b->sum = malloc(bytes);
    if (!b->host[0] || !b->host[1] || !b->sum) {
        buf_release(tp, r);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tensor parallel: all-reduce buffers of %lld floats", (long long)n);
    }
    if (be->ops->host_register) {
        tri_status st = be->ops->host_register(be, b->host[0], bytes);
        if (!st) {
            st = be->ops->host_register(be, b->host[1], bytes);
            if (st) be->ops->host_unregister(be, b->host[0]);
        }
        b->pinned = !st;  // pageable copies still work, only slower
    }
    b->cap = (int64_t)(bytes / sizeof(float));
    return TRI_STATUS_OK;
}

// Waits until the work queued so far on rank's compute stream is done: an event recorded there,
// so that a transfer queued on the transfer stream (the next layer's prefetch) is not waited for,
// as a synchronize of the backend would. Backends without events synchronize.
static tri_status compute_done(tri__tp *tp, int32_t rank) {
    tri__backend *be = tp->be[rank];
    if (!be->ops->event_create || !be->ops->event_record || !be->ops->event_synchronize)
        return be->ops->synchronize(be);
    tri_status st = TRI_STATUS_OK;
    if (!tp->done[rank]) st = be->ops->event_create(be, &tp->done[rank]);
    if (!st) st = be->ops->event_record(be, tp->done[rank], TRI_STREAM_COMPUTE);
    if (!st) st = be->ops->event_synchronize(be, tp->done[rank]);
    return st;
}

// src (rank r's memory) into dst (this rank's), on this rank's compute stream.
static tri_status fetch(tri__tp *tp, int32_t rank, int32_t r, float *dst, const float *src, size_t bytes) {
    tri__backend *be = tp->be[rank];
    return r == rank ? be->ops->copy(be, dst, src, bytes) : be->ops->copy_peer(be, dst, tp->be[r], src, bytes);
}

// The peer path: every rank reads the partials of all (rank order) into its device scratch and
// adds them there, ((x_0 + x_1) + x_2) as the host path adds them; the second barrier keeps every
// x unchanged until all ranks have read it.
static tri_status allreduce_peer(tri__tp *tp, int32_t rank, float *x, int64_t n) {
    tri__backend *be = tp->be[rank];
    const size_t bytes = (size_t)n * sizeof(float);
    tri_status st = TRI_STATUS_OK;
    if (n > tp->dcap[rank]) {  // device scratch of this rank's own: the work using it first
        st = be->ops->synchronize(be);
        be->ops->free(be, tp->acc[rank]);
        be->ops->free(be, tp->tmp[rank]);
        tp->acc[rank] = tp->tmp[rank] = NULL;
        tp->dcap[rank] = 0;
        if (!st) st = be->ops->alloc(be, bytes, (void **)&tp->acc[rank]);
        if (!st) st = be->ops->alloc(be, bytes, (void **)&tp->tmp[rank]);
        if (st) return st;
        tp->dcap[rank] = n;
    }
    tp->xptr[rank] = x;
    if ((st = compute_done(tp, rank)) || (st = barrier(tp))) return st;  // every x complete
    float *acc = tp->acc[rank], *tmp = tp->tmp[rank];
    st = fetch(tp, rank, 0, acc, tp->xptr[0], bytes);
    for (int32_t r = 1; !st && r < tp->n; r++) {
        st = fetch(tp, rank, r, tmp, tp->xptr[r], bytes);
        if (!st) st = be->ops->add(be, acc, acc, tmp, n);
    }
    if (!st) st = compute_done(tp, rank);  // this rank's reads of the others' x are done
    if (!st) st = barrier(tp);                // and every rank's: x may change now
    if (st) return st;
    return be->ops->copy(be, x, acc, bytes);
}

tri_status tri__tp_allreduce(tri__tp *tp, int32_t rank, float *x, int64_t n) {
    if (tp->comm) {
        // queued on the compute stream, where the other ranks' calls meet it on their devices; a
        // rank that failed before its call would leave them waiting there, so no call is made
        // once another rank has failed (one that fails after the others queued theirs still
        // leaves them waiting: NCCL's abort is not wired in, docs/offload.md)
        pthread_mutex_lock(&tp->mu);
        tri_status failed = tp->failed >= 0 ? tp->st[tp->failed] : TRI_STATUS_OK;
        pthread_mutex_unlock(&tp->mu);
        if (failed) return tri__fail(failed, "tensor parallel: another device failed; the all-reduce stops");
        tri__backend *be = tp->be[rank];
        return be->ops->allreduce(be, tp->comm, rank, x, n);
    }
    if (tp->peer) return allreduce_peer(tp, rank, x, n);
    tri__backend *be = tp->be[rank];
    const size_t bytes = (size_t)n * sizeof(float);
    // Two buffers per rank, alternating: a rank writes buffer k % 2 in call k while a slower rank
    // may still read buffer (k - 1) % 2 of the call before; it cannot reach call k + 1 (which
    // writes that one again) before every rank has passed call k's barrier, i.e. finished reading.
    tri_status st = TRI_STATUS_OK;
    if (n > tp->buf[rank].cap) {
        // Growing: every rank sees the same sizes in the same order, so all grow at this call. The
        // last sum's upload must have read this rank's buffer, and after the barrier no rank still
        // reads the old partials of the call before.
        st = be->ops->synchronize(be);
        if (!st) st = barrier(tp);
        if (!st) st = buf_reserve(tp, rank, n);
        if (st) return st;
    }
    const int par = (int)(tp->calls[rank]++ & 1);
    st = be->ops->copy_to_host(be, tp->buf[rank].host[par], x, bytes);
    if (!st) st = compute_done(tp, rank);
    if (st) return st;  // the run's end marks this rank failed: the others leave the barrier
    if ((st = barrier(tp))) return st;
    float *sum = tp->buf[rank].sum;
    memcpy(sum, tp->buf[0].host[par], bytes);
    for (int32_t r = 1; r < tp->n; r++) {  // rank order: the same bits on every rank
        const float *b = tp->buf[r].host[par];
        for (int64_t i = 0; i < n; i++) sum[i] += b[i];
    }
    // sum is read by the copy until this rank's next synchronize (its next all-reduce or the
    // pass's end), before which nothing writes it
    return be->ops->copy_to_backend(be, x, sum, bytes);
}

static tri_status allreduce_sum(void *ctx, int32_t rank, float *x, int64_t n) {
    return tri__tp_allreduce(ctx, rank, x, n);
}

tri__allreduce tri__tp_allreduce_for(tri__tp *tp, int32_t rank) {
    if (!tp) return (tri__allreduce){0};
    return (tri__allreduce){.sum = allreduce_sum, .ctx = tp, .rank = rank, .recordable = tp->comm != NULL};
}

// ---- a model on N devices ----

void tri__tp_group_close(tri__tp_group *g) {
    tri__tp_free(g->tp);
    for (int32_t r = 0; r < g->n; r++) {
        tri__model_backend_free(g->weights[r]);
        tri__tp_shard_free(g->shard[r]);
        tri__backend_free(g->be[r]);
    }
    memset(g, 0, sizeof *g);
}

tri_status tri__tp_group_open(tri__tp_group *g, const tri_model *model, const tri_session_params *sp) {
    memset(g, 0, sizeof *g);
    tri_status st;
    if (!sp->devices || !*sp->devices) {  // one device, as before tensor parallelism
        char name[16] = "";
        g->n = 1;
        g->split.n = 1;
        if ((st = tri__backend_select(sp->device_kind, sp->device, sp->n_threads, &g->be[0], name))) goto fail;
        snprintf(g->name, sizeof g->name, "%s", name);
        if ((st = tri__model_on_backend(model, g->be[0], sp->weight_layers_streamed, sp->weight_layers_from_disk,
                                        &g->weights[0])))
            goto fail;
        return TRI_STATUS_OK;
    }
    tri__device_ref dev[TRI_TP_MAX];
    int32_t n;
    if ((st = tri__device_list_parse(sp->devices, dev, &n))) return st;
    if (n == 1) {  // "cuda:1" or "cpu": one device by name
        tri_session_params one = *sp;
        one.devices = NULL;
        one.device_kind = dev[0].kind;
        one.device = dev[0].index;
        return tri__tp_group_open(g, model, &one);
    }
    if ((st = tri__tp_split_plan(&model->config, n, &g->split))) return st;
    if (sp->weight_layers_from_disk > 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "tensor parallel over %s: weight_layers_from_disk reads whole tensors from the file; "
                         "stream the weights from host memory instead", sp->devices);
    const tri__topology *topo = NULL;
    (void)tri__host_node_near(NULL, &topo);
    const int32_t n_nodes = topo ? tri__topology_n_nodes(topo) : 1;
    int32_t nodes[TRI_TP_MAX] = {0};  // each set below (zeroed for gcc -O2 -Wmaybe-uninitialized)
    // each CPU rank its share of the cores (the caller's thread is rank 0's)
    int32_t threads = sp->n_threads > 0 ? sp->n_threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    int32_t per = threads / n > 0 ? threads / n : 1;
    g->n = n;
    size_t at = 0;
    for (int32_t r = 0; r < n; r++) {
        char name[16] = "";
        if ((st = tri__backend_select(dev[r].kind, dev[r].index, per, &g->be[r], name))) goto fail;
        if (dev[r].kind == TRI_DEVICE_CPU) snprintf(name, sizeof name, "cpu:%d", (int)dev[r].index);
        at += (size_t)snprintf(g->name + at, sizeof g->name - at, "%s%s", r ? "," : "", name);
        if (at >= sizeof g->name) at = sizeof g->name - 1;
        char bus[32] = "";
        if (dev[r].kind == TRI_DEVICE_CUDA && tri__backend_pci_bus_id(g->be[r], bus, sizeof bus) == TRI_STATUS_OK)
            nodes[r] = tri__host_node_near(bus, NULL);
        else  // cpu:N prefers node N (shared when the machine has fewer)
            nodes[r] = n_nodes > 1 ? dev[r].index % n_nodes : -1;
        if ((st = tri__tp_shard_model(model, &g->split, r, &g->shard[r]))) goto fail;
        if ((st = tri__model_on_backend(g->shard[r], g->be[r], sp->weight_layers_streamed, 0, &g->weights[r])))
            goto fail;
    }
    // opening a CUDA device binds the caller to its node: rank 0's thread is the caller
    if (nodes[0] >= 0 && topo) (void)tri__topology_bind_thread(topo, nodes[0]);
    if ((st = tri__tp_create(n, g->be, nodes, &g->tp))) goto fail;
    return TRI_STATUS_OK;

fail:
    tri__tp_group_close(g);
    return st;
}
