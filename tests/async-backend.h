// async-backend.h - a CPU backend whose transfer stream runs copies late or early (tests only).
//
// The CPU backend completes every op and copy before it returns and has no transfer stream, so
// the offload engine's asynchronous paths (events, the transfer stream: the offloaded KV cache,
// streamed weights, the disk tier) never run on it, and CI has no GPU. This wrapper gives a CPU
// backend the transfer-stream ops of backend.h with the freedom a GPU takes, at its two extremes:
//
//   LATE   a copy queued on TRANSFER runs only when something forces it: COMPUTE waiting for an
//          event recorded after it (stream_wait), event_synchronize, synchronize. copy_to_host on
//          COMPUTE reaches host memory only at synchronize or at event_synchronize of an event
//          recorded on COMPUTE after it (the source is taken at the call, as the stream order
//          says). Code that reads a buffer before waiting for the copy that
//          fills it, or host memory before the copy back is known to be done, reads stale data.
//   EARLY  a transfer runs when it is queued, before any compute queued after it. Code that
//          refills a buffer that compute queued later still expects to hold its old contents
//          reads the new contents.
//
// Compute runs at once in both modes (as the CPU backend does), so every event recorded on
// COMPUTE is complete when recorded. One wrapped backend per test process at a time.
#ifndef TRI_TEST_ASYNC_BACKEND_H
#define TRI_TEST_ASYNC_BACKEND_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error.h"

typedef enum async_mode { ASYNC_LATE = 0, ASYNC_EARLY = 1 } async_mode;

typedef struct async_copy {
    void *dst;
    const void *src;  // LATE copy_to_host: a snapshot owned by the queue
    size_t bytes;
} async_copy;

static struct {
    async_mode mode;
    tri__backend_ops ops;             // the CPU backend's table with the transfer ops below
    void (*cpu_destroy)(tri__backend *be);
    tri_status (*cpu_sync)(tri__backend *be);
    async_copy *q;                    // transfers in queue order; q[0 .. done) have run
    size_t n, done, cap;
    async_copy *host;                 // LATE: compute-stream copies to host, until synchronize (or
    size_t n_host, cap_host;          //   event_synchronize of an event recorded on COMPUTE after them)
    size_t host_queued, host_landed;  // compute-stream copies to host ever queued, ever landed
    long n_transfers, n_deferred;     // copies queued on TRANSFER; of them, run later than queued
} async_emu;

typedef struct async_event {
    bool transfer;  // recorded on TRANSFER: complete once the first `upto` transfers ran
    size_t upto;
    size_t host_upto;  // recorded on COMPUTE: complete once the first host_upto copies to host landed
} async_event;

static void async_push(async_copy **q, size_t *n, size_t *cap, async_copy c) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *q = realloc(*q, sizeof **q * *cap);
        if (!*q) abort();
    }
    (*q)[(*n)++] = c;
}

static void async_run_transfers(size_t upto) {
    for (; async_emu.done < upto; async_emu.done++) {
        async_copy *c = &async_emu.q[async_emu.done];
        memcpy(c->dst, c->src, c->bytes);
    }
}

// Lands the pending compute-stream copies to host until host_upto have landed in all.
static void async_land_host_copies(size_t host_upto) {
    size_t k = 0;
    for (; k < async_emu.n_host && async_emu.host_landed < host_upto; k++, async_emu.host_landed++) {
        memcpy(async_emu.host[k].dst, async_emu.host[k].src, async_emu.host[k].bytes);
        free((void *)async_emu.host[k].src);
    }
    if (k == 0) return;  // (the array may still be NULL: no memmove of it)
    memmove(async_emu.host, async_emu.host + k, sizeof *async_emu.host * (async_emu.n_host - k));
    async_emu.n_host -= k;
}

static void async_run_host_copies(void) { async_land_host_copies(async_emu.host_queued); }

static tri_status async_event_create(tri__backend *be, tri__event **out) {
    (void)be;
    async_event *ev = calloc(1, sizeof *ev);
    if (!ev) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "async event");
    *out = (tri__event *)ev;
    return TRI_STATUS_OK;
}

static void async_event_destroy(tri__backend *be, tri__event *ev) {
    (void)be;
    free(ev);
}

static tri_status async_event_record(tri__backend *be, tri__event *e, tri__stream stream) {
    (void)be;
    async_event *ev = (async_event *)e;
    ev->transfer = stream == TRI_STREAM_TRANSFER;
    ev->upto = async_emu.n;
    ev->host_upto = async_emu.host_queued;
    return TRI_STATUS_OK;
}

static tri_status async_stream_wait(tri__backend *be, tri__stream stream, tri__event *e) {
    (void)be;
    async_event *ev = (async_event *)e;
    // compute cannot go on before the transfers the event follows; the transfer stream waiting
    // for compute waits for nothing (compute is done)
    if (stream == TRI_STREAM_COMPUTE && ev->transfer) async_run_transfers(ev->upto);
    return TRI_STATUS_OK;
}

static tri_status async_event_synchronize(tri__backend *be, tri__event *e) {
    (void)be;
    async_event *ev = (async_event *)e;
    if (ev->transfer) async_run_transfers(ev->upto);
    else async_land_host_copies(ev->host_upto);
    return TRI_STATUS_OK;
}

static tri_status async_transfer(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    async_push(&async_emu.q, &async_emu.n, &async_emu.cap, (async_copy){dst, src, bytes});
    async_emu.n_transfers++;
    if (async_emu.mode == ASYNC_EARLY) async_run_transfers(async_emu.n);
    else async_emu.n_deferred++;
    return TRI_STATUS_OK;
}

static tri_status async_copy_to_host(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (async_emu.mode == ASYNC_EARLY || bytes == 0) {
        memcpy(dst, src, bytes);
        async_emu.host_queued++, async_emu.host_landed++;
        return TRI_STATUS_OK;
    }
    void *snap = malloc(bytes);
    if (!snap) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "async copy");
    memcpy(snap, src, bytes);
    async_push(&async_emu.host, &async_emu.n_host, &async_emu.cap_host, (async_copy){dst, snap, bytes});
    async_emu.host_queued++;
    return TRI_STATUS_OK;
}

static tri_status async_synchronize(tri__backend *be) {
    async_run_transfers(async_emu.n);
    async_run_host_copies();
    return async_emu.cpu_sync(be);
}

static tri_status async_host_register(tri__backend *be, void *ptr, size_t bytes) {
    (void)be, (void)ptr, (void)bytes;
    return TRI_STATUS_OK;
}

static void async_host_unregister(tri__backend *be, void *ptr) { (void)be, (void)ptr; }

static void async_destroy(tri__backend *be) {
    async_run_transfers(async_emu.n);
    async_run_host_copies();
    free(async_emu.q);
    free(async_emu.host);
    void (*destroy)(tri__backend *) = async_emu.cpu_destroy;
    memset(&async_emu, 0, sizeof async_emu);
    destroy(be);
}

// A CPU backend of n_threads with the transfer stream of mode; free with tri__backend_free.
static tri_status async_backend_create(int32_t n_threads, async_mode mode, tri__backend **out) {
    tri_status st = tri__backend_cpu_create(n_threads, TRI_CPU_SIMD_AUTO, out);
    if (st) return st;
    memset(&async_emu, 0, sizeof async_emu);
    async_emu.mode = mode;
    async_emu.ops = *(*out)->ops;
    async_emu.cpu_destroy = async_emu.ops.destroy;
    async_emu.cpu_sync = async_emu.ops.synchronize;
    async_emu.ops.name = mode == ASYNC_LATE ? "cpu-async-late" : "cpu-async-early";
    async_emu.ops.destroy = async_destroy;
    async_emu.ops.synchronize = async_synchronize;
    async_emu.ops.copy_to_host = async_copy_to_host;
    async_emu.ops.event_create = async_event_create;
    async_emu.ops.event_destroy = async_event_destroy;
    async_emu.ops.event_record = async_event_record;
    async_emu.ops.stream_wait = async_stream_wait;
    async_emu.ops.event_synchronize = async_event_synchronize;
    async_emu.ops.transfer_to_backend = async_transfer;
    async_emu.ops.transfer_to_host = async_transfer;
    async_emu.ops.host_register = async_host_register;
    async_emu.ops.host_unregister = async_host_unregister;
    (*out)->ops = &async_emu.ops;
    return TRI_STATUS_OK;
}

#endif  // TRI_TEST_ASYNC_BACKEND_H
