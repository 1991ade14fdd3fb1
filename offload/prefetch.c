// prefetch.c - the weight reader: io_uring (registered buffers, fixed reads, deep queue) or a
// pread thread pool behind one slot interface.
#include "prefetch.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "error.h"
#include "fault.h"
#include "tri-config.h"

#if TRI_HAVE_URING
#include <liburing.h>
#endif

#define ALIGN ((uint64_t)TRI_PREFETCH_ALIGN)
// io_uring_register_buffers takes at most 1 GiB per iovec, so a slot is registered as 1 GiB
// pieces and no request crosses a piece boundary.
#define IOV_MAX_BYTES ((uint64_t)1 << 30)

static uint64_t align_down(uint64_t x) { return x / ALIGN * ALIGN; }
static uint64_t align_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

// ---- slots and requests ----

// One aligned span of the file read into a slot: [file_off, file_off + len) lands at dst.
// Bytes past `need` may lie beyond the end of the file and are not required.
typedef struct extent {
    uint64_t file_off;
    uint64_t len;   // multiple of ALIGN
    uint64_t need;  // bytes from file_off that must be read (the wanted ranges' end)
    uint64_t dst;   // offset in the slot buffer
} extent;

typedef struct slot {
    char *buf;
    uint64_t size;
    int32_t iov0;        // index of its first registered iovec
    bool busy;
    extent *ext;
    int32_t n_ext, cap_ext;
    int32_t cur_ext;     // next piece to issue: extent cur_ext at cur_off
    uint64_t cur_off;
    int64_t in_flight;   // issued pieces not yet finished
    bool queued;         // has pieces not yet issued (is in the issue queue)
    tri_status status;   // first failure
    char err[512];
} slot;

typedef struct request {
    int32_t slot;
    uint64_t file_off;   // of the piece
    char *dst;
    uint32_t len;        // bytes asked for (multiple of ALIGN)
    uint32_t need;       // bytes that must arrive (<= len)
    uint32_t done;       // bytes arrived so far
    int32_t buf_index;   // registered iovec, -1 when not registered
    int32_t next_free;
} request;

struct tri__prefetch {
    char *path;
    int fd;
    bool direct;
    uint64_t file_size;
    tri__prefetch_params p;

    slot *slots;
    int32_t n_slots;
    // issue queue: slots with pieces not yet issued, in submission order
    int32_t *queue;      // (n_slots) ring
    int32_t q_head, q_len;

    request *reqs;       // (queue_depth)
    int32_t free_head;
    int32_t in_flight;

    tri__prefetch_stats stats;

    bool uring;
#if TRI_HAVE_URING
    struct io_uring ring;
    bool fixed_buffers;
    bool fixed_file;
    int32_t *retry;      // (queue_depth) requests to reissue
    int32_t n_retry;
#endif

    // pread engine
    pthread_mutex_t mu;
    pthread_cond_t work;  // a piece can be issued, or stop
    pthread_cond_t done;  // a piece finished
    pthread_t *threads;
    int32_t n_threads;
    bool stop;
};

tri__prefetch_params tri__prefetch_default_params(void) {
    return (tri__prefetch_params){
        .engine = TRI_PREFETCH_ENGINE_AUTO,
        .direct = TRI_PREFETCH_DIRECT_AUTO,
        .queue_depth = 64,
        .request_bytes = 1u << 20,
        .n_threads = 4,
        .debug_short_read = 0,
    };
}

// The extents of ranges laid out one after the other in a slot, merging a range into the
// previous extent when its aligned span starts inside or right after it. Writes ext (may be NULL)
// and dst (may be NULL); returns the slot bytes.
static uint64_t layout(const tri__read_range *r, int32_t n, extent *ext, int32_t *n_ext,
                       uint64_t *dst) {
    uint64_t total = 0;
    int32_t ne = 0;
    extent cur = {0};
    for (int32_t i = 0; i < n; i++) {
        uint64_t a0 = align_down(r[i].offset), end = r[i].offset + r[i].len;
        if (ne > 0 && a0 >= cur.file_off && a0 <= cur.file_off + cur.len) {
            if (end > cur.need + cur.file_off) cur.need = end - cur.file_off;
            uint64_t len = align_up(cur.file_off + cur.need) - cur.file_off;
            total += len - cur.len;
            cur.len = len;
        } else {
            if (ne > 0 && ext) ext[ne - 1] = cur;
            cur.file_off = a0;
            cur.need = end - a0;
            cur.len = align_up(end) - a0;
            cur.dst = total;
            total += cur.len;
            ne++;
        }
        if (dst) dst[i] = cur.dst + (r[i].offset - cur.file_off);
    }
    if (ne > 0 && ext) ext[ne - 1] = cur;
    if (n_ext) *n_ext = ne;
    return total;
}

uint64_t tri__prefetch_slot_bytes(const tri__read_range *ranges, int32_t n) {
    if (!ranges || n <= 0) return 0;
    return layout(ranges, n, NULL, NULL, NULL);
}

// Records the first failure of a slot; later ones are dropped (the first is the cause).
TRI__PRINTF(3, 4)
static void slot_fail(slot *s, tri_status st, const char *fmt, ...) {
    if (s->status != TRI_STATUS_OK) return;
    s->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

// Takes the next piece of the first queued slot into a free request; false when there is no
// piece or no free request. Caller holds mu (pread engine).
static bool next_piece(tri__prefetch *pf, int32_t *out_req) {
    while (pf->q_len > 0) {
        if (pf->free_head < 0) return false;
        int32_t si = pf->queue[pf->q_head];
        slot *s = &pf->slots[si];
        if (s->status != TRI_STATUS_OK || s->cur_ext >= s->n_ext) {
            // failed (stop issuing) or everything issued
            s->queued = false;
            pf->q_head = (pf->q_head + 1) % pf->n_slots;
            pf->q_len--;
            continue;
        }
        extent *e = &s->ext[s->cur_ext];
        uint64_t dst = e->dst + s->cur_off;
        uint64_t len = e->len - s->cur_off;
        if (len > pf->p.request_bytes) len = pf->p.request_bytes;
        uint64_t to_piece_end = IOV_MAX_BYTES - dst % IOV_MAX_BYTES;
        if (len > to_piece_end) len = to_piece_end;
        uint64_t need = e->need > s->cur_off ? e->need - s->cur_off : 0;
        if (need > len) need = len;

        int32_t ri = pf->free_head;
        request *q = &pf->reqs[ri];
        pf->free_head = q->next_free;
        q->slot = si;
        q->file_off = e->file_off + s->cur_off;
        q->dst = s->buf + dst;
        q->len = (uint32_t)len;
        q->need = (uint32_t)need;
        q->done = 0;
        q->buf_index = -1;
#if TRI_HAVE_URING
        if (pf->fixed_buffers) q->buf_index = s->iov0 + (int32_t)(dst / IOV_MAX_BYTES);
#endif
        s->in_flight++;
        pf->in_flight++;
        s->cur_off += len;
        if (s->cur_off >= e->len) {
            s->cur_ext++;
            s->cur_off = 0;
        }
        *out_req = ri;
        return true;
    }
    return false;
}

// What a finished read of res bytes (or -errno) means for request q.
typedef enum { READ_DONE, READ_AGAIN, READ_FAILED } read_outcome;

static read_outcome account(tri__prefetch *pf, request *q, long long res) {
    slot *s = &pf->slots[q->slot];
    uint64_t at = q->file_off + q->done;
    if (res >= 0) {  // an armed read fault (fault.h) makes this read fail with EIO or come up short
        ssize_t f = tri__fault_read_result((ssize_t)res, q->len - q->done, pf->direct ? ALIGN : 1);
        res = f < 0 ? -EIO : f;
    }
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) return READ_AGAIN;
        slot_fail(s, TRI_STATUS_IO, "%s: %s read of %u bytes at offset %llu: %s", pf->path,
                  pf->uring ? "io_uring" : "pread", q->len - q->done, (unsigned long long)at,
                  strerror((int)-res));
        return READ_FAILED;
    }
    if (pf->p.debug_short_read && (uint64_t)res > pf->p.debug_short_read)
        res = pf->p.debug_short_read;
    pf->stats.bytes_read += (uint64_t)res;
    if (res == 0) {
        if (q->done >= q->need) return READ_DONE;
        slot_fail(s, TRI_STATUS_IO,
                  "%s: unexpected end of file at offset %llu (the file is shorter than the range "
                  "being read; it was %llu bytes at open)",
                  pf->path, (unsigned long long)at, (unsigned long long)pf->file_size);
        return READ_FAILED;
    }
    q->done += (uint32_t)res;
    if (q->done >= q->need) return READ_DONE;
    if (q->done >= q->len) return READ_DONE;  // cannot happen: need <= len
    if (pf->direct && (q->file_off + q->done) % ALIGN != 0) {
        slot_fail(s, TRI_STATUS_IO, "%s: short O_DIRECT read ended at unaligned offset %llu",
                  pf->path, (unsigned long long)(q->file_off + q->done));
        return READ_FAILED;
    }
    return READ_AGAIN;
}

// Returns request ri to the free list and counts its piece as finished.
static void finish(tri__prefetch *pf, int32_t ri) {
    request *q = &pf->reqs[ri];
    slot *s = &pf->slots[q->slot];
    s->in_flight--;
    pf->in_flight--;
    q->next_free = pf->free_head;
    pf->free_head = ri;
}

static bool slot_finished(const slot *s) {
    return s->in_flight == 0 && (s->status != TRI_STATUS_OK || s->cur_ext >= s->n_ext);
}

// ---- io_uring engine ----

#if TRI_HAVE_URING
// Queues the retries, then new pieces, while SQEs and requests last; then submits. An error of
// io_uring_submit itself is returned (the SQEs stay queued for the next call).
static tri_status uring_pump(tri__prefetch *pf) {
    bool queued = false;
    for (;;) {
        int32_t ri;
        bool retry = false;
        if (pf->n_retry > 0) {
            ri = pf->retry[pf->n_retry - 1];
            retry = true;
        } else if (!next_piece(pf, &ri)) {
            break;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&pf->ring);
        if (!sqe) {
            if (!retry) {
                // give the piece back: it becomes a retry of nothing done yet
                pf->retry[pf->n_retry++] = ri;
            }
            break;
        }
        if (retry) pf->n_retry--;
        request *q = &pf->reqs[ri];
        int fd = pf->fixed_file ? 0 : pf->fd;
        char *dst = q->dst + q->done;
        unsigned len = q->len - q->done;
        uint64_t off = q->file_off + q->done;
        if (q->buf_index >= 0)
            io_uring_prep_read_fixed(sqe, fd, dst, len, off, q->buf_index);
        else
            io_uring_prep_read(sqe, fd, dst, len, off);
        if (pf->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, (uint64_t)ri);
        pf->stats.n_requests++;
        queued = true;
    }
    if (!queued && io_uring_sq_ready(&pf->ring) == 0) return TRI_STATUS_OK;
    int r = io_uring_submit(&pf->ring);
    if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR)
        return tri__fail(TRI_STATUS_IO, "%s: io_uring_submit: %s", pf->path, strerror(-r));
    return TRI_STATUS_OK;
}

static void uring_complete(tri__prefetch *pf, struct io_uring_cqe *cqe) {
    int32_t ri = (int32_t)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&pf->ring, cqe);
    switch (account(pf, &pf->reqs[ri], res)) {
    case READ_AGAIN:
        pf->stats.n_retries++;
        pf->retry[pf->n_retry++] = ri;
        break;
    case READ_DONE:
    case READ_FAILED: finish(pf, ri); break;
    }
}

// Handles every completion already there.
static void uring_reap(tri__prefetch *pf) {
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&pf->ring, &cqe) == 0) uring_complete(pf, cqe);
}

// Blocks for one completion and handles it.
static tri_status uring_wait_one(tri__prefetch *pf) {
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&pf->ring, &cqe);
    if (r == -EINTR || r == -EAGAIN) return TRI_STATUS_OK;
    if (r < 0) return tri__fail(TRI_STATUS_IO, "%s: io_uring_wait_cqe: %s", pf->path, strerror(-r));
    uring_complete(pf, cqe);
    return TRI_STATUS_OK;
}

static void uring_unregister(tri__prefetch *pf) {
    if (!pf->fixed_buffers) return;
    int r = io_uring_unregister_buffers(&pf->ring);
    if (r < 0)
        tri__log(TRI_LOG_LEVEL_WARN, "%s: io_uring_unregister_buffers: %s", pf->path, strerror(-r));
    pf->fixed_buffers = false;
}
#endif

// ---- pread engine ----

static void *pread_worker(void *arg) {
    tri__prefetch *pf = arg;
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        int32_t ri;
        while (!pf->stop && !next_piece(pf, &ri)) pthread_cond_wait(&pf->work, &pf->mu);
        if (pf->stop) break;
        request *q = &pf->reqs[ri];
        for (;;) {
            char *dst = q->dst + q->done;
            size_t len = q->len - q->done;
            off_t off = (off_t)(q->file_off + q->done);
            pthread_mutex_unlock(&pf->mu);
            ssize_t r = pread(pf->fd, dst, len, off);
            long long res = r < 0 ? -(long long)errno : (long long)r;
            pthread_mutex_lock(&pf->mu);
            pf->stats.n_requests++;
            read_outcome o = account(pf, q, res);
            if (o == READ_AGAIN) {
                pf->stats.n_retries++;
                continue;
            }
            break;
        }
        finish(pf, ri);
        pthread_cond_broadcast(&pf->done);
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

// ---- open and close ----

// Opens path with O_DIRECT and checks that an aligned read works; -1 (errno set) when the file
// system refuses either. Some file systems accept the open and refuse the read (EINVAL).
static int open_direct(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) return -1;
    void *probe = NULL;
    if (posix_memalign(&probe, ALIGN, ALIGN) != 0) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    ssize_t r;
    do r = pread(fd, probe, ALIGN, 0);
    while (r < 0 && errno == EINTR);
    int err = errno;
    free(probe);
    if (r < 0) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

#if TRI_HAVE_URING
static atomic_bool uring_warned;
#endif

tri_status tri__prefetch_open(const char *path, const tri__prefetch_params *params,
                              tri__prefetch **out) {
    *out = NULL;
    tri__prefetch_params p = params ? *params : tri__prefetch_default_params();
    if (p.queue_depth == 0) p.queue_depth = 64;
    if (p.request_bytes == 0) p.request_bytes = 1u << 20;
    if (p.n_threads == 0) p.n_threads = 4;
    if (p.queue_depth < 1 || p.queue_depth > 4096 || p.request_bytes % ALIGN != 0 ||
        p.request_bytes > (1u << 30) || p.n_threads < 1 || p.n_threads > 256 ||
        p.debug_short_read % ALIGN != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "%s: prefetch: queue_depth %d (1..4096), request_bytes %u (multiple of %u, "
                         "<= 1 GiB), n_threads %d (1..256), debug_short_read %u (multiple of %u)",
                         path, p.queue_depth, p.request_bytes, TRI_PREFETCH_ALIGN, p.n_threads,
                         p.debug_short_read, TRI_PREFETCH_ALIGN);

    tri__prefetch *pf = calloc(1, sizeof *pf);
    if (!pf) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", path);
    tri_status st = TRI_STATUS_OK;
    pf->fd = -1;
    pf->p = p;
    pf->free_head = -1;
    pf->path = strdup(path);
    pf->reqs = calloc((size_t)p.queue_depth, sizeof *pf->reqs);
    if (!pf->path || !pf->reqs) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", path);
        goto fail_alloc;
    }
    for (int32_t i = p.queue_depth - 1; i >= 0; i--) {
        pf->reqs[i].next_free = pf->free_head;
        pf->free_head = i;
    }

    // ---- the file: O_DIRECT when allowed ----
    if (p.direct != TRI_PREFETCH_DIRECT_OFF) {
        pf->fd = open_direct(path);
        if (pf->fd >= 0) {
            pf->direct = true;
        } else if (errno == EINVAL || errno == EOPNOTSUPP) {
            if (p.direct == TRI_PREFETCH_DIRECT_ON) {
                st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: O_DIRECT: %s", path, strerror(errno));
                goto fail_alloc;
            }
            tri__log(TRI_LOG_LEVEL_INFO, "%s: O_DIRECT refused (%s); reading through the page cache",
                     path, strerror(errno));
        } else {
            st = tri__fail(TRI_STATUS_IO, "%s: open(O_DIRECT): %s", path, strerror(errno));
            goto fail_alloc;
        }
    }
    if (pf->fd < 0) {
        pf->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (pf->fd < 0) {
            st = tri__fail(TRI_STATUS_IO, "%s: open: %s", path, strerror(errno));
            goto fail_alloc;
        }
    }
    struct stat sb;
    if (fstat(pf->fd, &sb) != 0) {
        st = tri__fail(TRI_STATUS_IO, "%s: fstat: %s", path, strerror(errno));
        goto fail_fd;
    }
    pf->file_size = (uint64_t)sb.st_size;

    // ---- the engine ----
    if (p.engine != TRI_PREFETCH_ENGINE_PREAD) {
#if TRI_HAVE_URING
        pf->retry = calloc((size_t)p.queue_depth, sizeof *pf->retry);
        if (!pf->retry) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", path);
            goto fail_fd;
        }
        int r = tri__fault_hit(TRI__FAULT_URING) ? -ENOSYS
                                                 : io_uring_queue_init((unsigned)p.queue_depth, &pf->ring, 0);
        if (r == 0) {
            pf->uring = true;
            int rf = io_uring_register_files(&pf->ring, &pf->fd, 1);
            pf->fixed_file = rf == 0;
            if (rf < 0)
                tri__log(TRI_LOG_LEVEL_DEBUG, "%s: io_uring_register_files: %s", path, strerror(-rf));
        } else if (p.engine == TRI_PREFETCH_ENGINE_URING) {
            st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: io_uring_queue_init(%d): %s", path,
                           p.queue_depth, strerror(-r));
            goto fail_fd;
        } else if (!atomic_exchange(&uring_warned, true)) {
            tri__log(TRI_LOG_LEVEL_WARN,
                     "io_uring_queue_init: %s (a kernel or container that forbids io_uring); "
                     "weights are read with pread threads",
                     strerror(-r));
        }
#else
        if (p.engine == TRI_PREFETCH_ENGINE_URING) {
            st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: built without liburing", path);
            goto fail_fd;
        }
#endif
    }
    if (pthread_mutex_init(&pf->mu, NULL) != 0) {
        st = tri__fail(TRI_STATUS_INTERNAL, "%s: pthread_mutex_init failed", path);
        goto fail_ring;
    }
    if (pthread_cond_init(&pf->work, NULL) != 0) {
        st = tri__fail(TRI_STATUS_INTERNAL, "%s: pthread_cond_init failed", path);
        goto fail_mu;
    }
    if (pthread_cond_init(&pf->done, NULL) != 0) {
        st = tri__fail(TRI_STATUS_INTERNAL, "%s: pthread_cond_init failed", path);
        goto fail_work;
    }
    if (!pf->uring) {
        pf->threads = calloc((size_t)p.n_threads, sizeof *pf->threads);
        if (!pf->threads) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", path);
            goto fail_done;
        }
        for (; pf->n_threads < p.n_threads; pf->n_threads++) {
            int r = pthread_create(&pf->threads[pf->n_threads], NULL, pread_worker, pf);
            if (r != 0) {
                st = tri__fail(TRI_STATUS_INTERNAL, "%s: pthread_create: %s", path, strerror(r));
                goto fail_threads;
            }
        }
    }
    *out = pf;
    return TRI_STATUS_OK;

fail_threads:
    pthread_mutex_lock(&pf->mu);
    pf->stop = true;
    pthread_cond_broadcast(&pf->work);
    pthread_mutex_unlock(&pf->mu);
    for (int32_t i = 0; i < pf->n_threads; i++) pthread_join(pf->threads[i], NULL);
    free(pf->threads);
fail_done:
    pthread_cond_destroy(&pf->done);
fail_work:
    pthread_cond_destroy(&pf->work);
fail_mu:
    pthread_mutex_destroy(&pf->mu);
fail_ring:
#if TRI_HAVE_URING
    if (pf->uring) io_uring_queue_exit(&pf->ring);
#endif
fail_fd:
    close(pf->fd);
fail_alloc:
#if TRI_HAVE_URING
    free(pf->retry);
#endif
    free(pf->reqs);
    free(pf->path);
    free(pf);
    return st;
}

static void free_slots(tri__prefetch *pf) {
    for (int32_t i = 0; i < pf->n_slots; i++) free(pf->slots[i].ext);
    free(pf->slots);
    free(pf->queue);
    pf->slots = NULL;
    pf->queue = NULL;
    pf->n_slots = 0;
    pf->q_head = pf->q_len = 0;
}

void tri__prefetch_close(tri__prefetch *pf) {
    if (!pf) return;
    // The kernel or a worker may still write into the slots: drain first.
    for (int32_t i = 0; i < pf->n_slots; i++)
        if (pf->slots[i].busy) (void)tri__prefetch_wait(pf, i);
    if (pf->uring) {
#if TRI_HAVE_URING
        uring_unregister(pf);
        io_uring_queue_exit(&pf->ring);
#endif
    } else {
        pthread_mutex_lock(&pf->mu);
        pf->stop = true;
        pthread_cond_broadcast(&pf->work);
        pthread_mutex_unlock(&pf->mu);
        for (int32_t i = 0; i < pf->n_threads; i++) pthread_join(pf->threads[i], NULL);
        free(pf->threads);
    }
    pthread_cond_destroy(&pf->done);
    pthread_cond_destroy(&pf->work);
    pthread_mutex_destroy(&pf->mu);
    if (close(pf->fd) != 0)
        tri__log(TRI_LOG_LEVEL_WARN, "%s: close: %s", pf->path, strerror(errno));
    free_slots(pf);
#if TRI_HAVE_URING
    free(pf->retry);
#endif
    free(pf->reqs);
    free(pf->path);
    free(pf);
}

bool tri__prefetch_uses_uring(const tri__prefetch *pf) { return pf->uring; }
bool tri__prefetch_uses_direct(const tri__prefetch *pf) { return pf->direct; }
bool tri__prefetch_uses_fixed_buffers(const tri__prefetch *pf) {
#if TRI_HAVE_URING
    return pf->fixed_buffers;
#else
    (void)pf;
    return false;
#endif
}
uint64_t tri__prefetch_file_size(const tri__prefetch *pf) { return pf->file_size; }

void tri__prefetch_stats_get(const tri__prefetch *pf, tri__prefetch_stats *out) {
    pthread_mutex_t *mu = (pthread_mutex_t *)&pf->mu;
    pthread_mutex_lock(mu);
    *out = pf->stats;
    pthread_mutex_unlock(mu);
}

// ---- slots ----

tri_status tri__prefetch_set_slots(tri__prefetch *pf, int32_t n_slots, void *const *bufs,
                                   const size_t *sizes) {
    if (n_slots < 1 || n_slots > 1024 || !bufs || !sizes)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: %d slots (1..1024)", pf->path,
                         n_slots);
    for (int32_t i = 0; i < pf->n_slots; i++)
        if (pf->slots[i].busy)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "%s: prefetch: set_slots while slot %d is busy", pf->path, i);
    int64_t n_iov = 0;
    for (int32_t i = 0; i < n_slots; i++) {
        if (!bufs[i] || (uintptr_t)bufs[i] % ALIGN != 0 || sizes[i] == 0 || sizes[i] % ALIGN != 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "%s: prefetch: slot %d (%p, %zu bytes) is not a non-empty buffer "
                             "aligned to %u bytes",
                             pf->path, i, bufs[i], sizes[i], TRI_PREFETCH_ALIGN);
        n_iov += (int64_t)((sizes[i] + IOV_MAX_BYTES - 1) / IOV_MAX_BYTES);
    }
    slot *slots = calloc((size_t)n_slots, sizeof *slots);
    int32_t *queue = calloc((size_t)n_slots, sizeof *queue);
    if (!slots || !queue) {
        free(slots), free(queue);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", pf->path);
    }
    pthread_mutex_lock(&pf->mu);
    free_slots(pf);
    pf->slots = slots;
    pf->queue = queue;
    pf->n_slots = n_slots;
    int32_t iov = 0;
    for (int32_t i = 0; i < n_slots; i++) {
        slots[i].buf = bufs[i];
        slots[i].size = sizes[i];
        slots[i].iov0 = iov;
        iov += (int32_t)((sizes[i] + IOV_MAX_BYTES - 1) / IOV_MAX_BYTES);
    }
    pthread_mutex_unlock(&pf->mu);

#if TRI_HAVE_URING
    if (pf->uring) {
        uring_unregister(pf);
        struct iovec *v = calloc((size_t)n_iov, sizeof *v);
        if (!v) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", pf->path);
        int32_t k = 0;
        for (int32_t i = 0; i < n_slots; i++)
            for (uint64_t off = 0; off < sizes[i]; off += IOV_MAX_BYTES) {
                v[k].iov_base = (char *)bufs[i] + off;
                v[k].iov_len = sizes[i] - off < IOV_MAX_BYTES ? sizes[i] - off : IOV_MAX_BYTES;
                k++;
            }
        // Registration pins the pages and is charged to RLIMIT_MEMLOCK on some kernels; when it
        // is refused, plain reads do the same work with a page walk per request.
        int r = io_uring_register_buffers(&pf->ring, v, (unsigned)k);
        free(v);
        if (r == 0) {
            pf->fixed_buffers = true;
        } else {
            static atomic_bool warned;
            if (!atomic_exchange(&warned, true))
                tri__log(TRI_LOG_LEVEL_WARN,
                         "%s: io_uring_register_buffers(%d buffers): %s; using unregistered reads",
                         pf->path, k, strerror(-r));
        }
    }
#else
    (void)n_iov;
#endif
    return TRI_STATUS_OK;
}

tri_status tri__prefetch_submit(tri__prefetch *pf, int32_t si, const tri__read_range *ranges,
                                int32_t n, uint64_t *dst_offsets) {
    if (si < 0 || si >= pf->n_slots)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: no slot %d (%d slots)",
                         pf->path, si, pf->n_slots);
    slot *s = &pf->slots[si];
    if (s->busy)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: slot %d is busy", pf->path, si);
    if (!ranges || n < 1)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: no ranges", pf->path);
    for (int32_t i = 0; i < n; i++)
        if (ranges[i].len == 0 || ranges[i].offset > pf->file_size ||
            ranges[i].len > pf->file_size - ranges[i].offset)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "%s: range %d [%llu, +%llu) is empty or past the end of the file "
                             "(%llu bytes)",
                             pf->path, i, (unsigned long long)ranges[i].offset,
                             (unsigned long long)ranges[i].len, (unsigned long long)pf->file_size);
    uint64_t need = layout(ranges, n, NULL, NULL, NULL);
    if (need > s->size)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "%s: prefetch: the ranges need %llu bytes, slot %d holds %llu", pf->path,
                         (unsigned long long)need, si, (unsigned long long)s->size);

    pthread_mutex_lock(&pf->mu);
    if (s->cap_ext < n) {
        extent *e = realloc(s->ext, (size_t)n * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&pf->mu);
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: prefetch: out of memory", pf->path);
        }
        s->ext = e;
        s->cap_ext = n;
    }
    layout(ranges, n, s->ext, &s->n_ext, dst_offsets);
    s->cur_ext = 0;
    s->cur_off = 0;
    s->in_flight = 0;
    s->status = TRI_STATUS_OK;
    s->err[0] = 0;
    s->busy = true;
    s->queued = true;
    pf->queue[(pf->q_head + pf->q_len) % pf->n_slots] = si;
    pf->q_len++;
    tri_status st = TRI_STATUS_OK;
    if (pf->uring) {
#if TRI_HAVE_URING
        st = uring_pump(pf);
#endif
    } else {
        pthread_cond_broadcast(&pf->work);
    }
    pthread_mutex_unlock(&pf->mu);
    return st;
}

// The outcome of a finished slot, which becomes idle. Caller holds mu.
static tri_status slot_release(tri__prefetch *pf, slot *s) {
    s->busy = false;
    if (s->status == TRI_STATUS_OK) return TRI_STATUS_OK;
    (void)pf;
    return tri__fail(s->status, "%s", s->err);
}

tri_status tri__prefetch_poll(tri__prefetch *pf, int32_t si, bool *done) {
    *done = false;
    if (si < 0 || si >= pf->n_slots)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: no slot %d", pf->path, si);
    slot *s = &pf->slots[si];
    pthread_mutex_lock(&pf->mu);
    tri_status st = TRI_STATUS_OK;
    if (s->busy) {
#if TRI_HAVE_URING
        if (pf->uring) {
            uring_reap(pf);
            st = uring_pump(pf);
        }
#endif
        if (st == TRI_STATUS_OK && slot_finished(s)) {
            *done = true;
            st = slot_release(pf, s);
        }
    } else {
        *done = true;
    }
    pthread_mutex_unlock(&pf->mu);
    return st;
}

tri_status tri__prefetch_wait(tri__prefetch *pf, int32_t si) {
    if (si < 0 || si >= pf->n_slots)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: prefetch: no slot %d", pf->path, si);
    slot *s = &pf->slots[si];
    pthread_mutex_lock(&pf->mu);
    tri_status st = TRI_STATUS_OK;
    if (!s->busy) goto out;
    if (pf->uring) {
#if TRI_HAVE_URING
        for (;;) {
            uring_reap(pf);
            st = uring_pump(pf);
            if (st != TRI_STATUS_OK) break;
            if (slot_finished(s)) break;
            // Not finished means a piece of it is in flight or queued behind in-flight reads of
            // earlier slots: either way a completion will come.
            st = uring_wait_one(pf);
            if (st != TRI_STATUS_OK) break;
        }
        if (st != TRI_STATUS_OK) {
            // The ring itself failed; the slot's reads may never finish. Report, keep it busy.
            goto out;
        }
#endif
    } else {
        while (!slot_finished(s)) pthread_cond_wait(&pf->done, &pf->mu);
    }
    st = slot_release(pf, s);
out:
    pthread_mutex_unlock(&pf->mu);
    return st;
}
