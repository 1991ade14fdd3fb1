// prefetch.h - the weight reader: byte ranges of a model file into aligned staging buffers,
// asynchronously, with io_uring or a pread thread pool (internal).
//
// Use: open the file; hand over the staging buffers once ("slots": e.g. three layer-sized pinned
// regions from the arena); then per layer submit the layer's tensor ranges to a free slot and,
// when the layer is about to be uploaded, wait for the slot. The engine reads layer i + 2 while
// layer i computes.
//
// Alignment. Reads go through O_DIRECT when the file system allows it (probed at open), which
// needs file offsets, lengths and buffer addresses aligned to the block size. The reader
// therefore reads the aligned superset of each range, TRI_PREFETCH_ALIGN bytes at a time, and
// tells the caller where the wanted bytes of each range start inside the slot. Ranges whose
// aligned spans touch or overlap (the tensors of one layer usually follow each other in the file)
// share one span, so a layer costs at most a page of extra reading on each side.
//
// Engines. io_uring (liburing): queue_depth requests of request_bytes in flight, buffers
// registered with io_uring_register_buffers and read with READ_FIXED when the kernel allows it
// (plain READ otherwise), the file registered too. pread: n_threads worker threads taking
// request_bytes pieces from the same queue, for builds without liburing and for kernels or
// containers that refuse io_uring (detected at open, logged once). Both engines retry short
// reads and interrupted calls, and report an end of file before the wanted bytes as an error.
//
// Threads. One thread drives a reader (submit, poll, wait, close); the pread workers are
// internal.
#ifndef TRI_PREFETCH_H
#define TRI_PREFETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

// Alignment of file offsets, lengths and buffer addresses for every read (O_DIRECT's block size
// on every common file system, and the page size). Slots must be aligned to it.
#define TRI_PREFETCH_ALIGN 4096u

typedef enum tri__prefetch_engine {
    TRI_PREFETCH_ENGINE_AUTO = 0,   // io_uring when built and allowed, else pread
    TRI_PREFETCH_ENGINE_URING = 1,  // io_uring or fail (UNSUPPORTED)
    TRI_PREFETCH_ENGINE_PREAD = 2,
} tri__prefetch_engine;

typedef enum tri__prefetch_direct {
    TRI_PREFETCH_DIRECT_AUTO = 0,  // O_DIRECT when the file system accepts it, else buffered
    TRI_PREFETCH_DIRECT_ON = 1,    // O_DIRECT or fail (UNSUPPORTED)
    TRI_PREFETCH_DIRECT_OFF = 2,   // through the page cache
} tri__prefetch_direct;

typedef struct tri__prefetch_params {
    tri__prefetch_engine engine;
    tri__prefetch_direct direct;
    int32_t queue_depth;     // requests in flight (io_uring SQ entries); 0: 64
    uint32_t request_bytes;  // bytes per read request, a multiple of TRI_PREFETCH_ALIGN; 0: 1 MiB
    int32_t n_threads;       // pread engine worker threads; 0: 4
    // Test hook: > 0 makes every read that returned more than this many bytes count as having
    // returned this many (a multiple of TRI_PREFETCH_ALIGN), so the short-read path runs. 0: off.
    uint32_t debug_short_read;
} tri__prefetch_params;

// A byte range of the file: for a tensor of a GGUF file, offset = data_start + t->offset and
// len = t->n_bytes.
typedef struct tri__read_range {
    uint64_t offset;
    uint64_t len;  // > 0
} tri__read_range;

typedef struct tri__prefetch_stats {
    uint64_t bytes_read;     // bytes the kernel returned, alignment padding included
    int64_t n_requests;      // reads issued, retries included
    int64_t n_retries;       // reads reissued after a short read or EINTR/EAGAIN
} tri__prefetch_stats;

typedef struct tri__prefetch tri__prefetch;

tri__prefetch_params tri__prefetch_default_params(void);

// Opens path for reading. IO when it cannot be opened; UNSUPPORTED when params demand io_uring or
// O_DIRECT and they are not available (the call and errno named); INVALID_ARGUMENT for bad params.
tri_status tri__prefetch_open(const char *path, const tri__prefetch_params *params,
                              tri__prefetch **out);
// Waits for every read in flight, then closes the file and frees the reader; NULL is a no-op.
// The slot buffers stay the caller's.
void tri__prefetch_close(tri__prefetch *pf);

bool tri__prefetch_uses_uring(const tri__prefetch *pf);
bool tri__prefetch_uses_direct(const tri__prefetch *pf);
// True when the slots are registered with io_uring (READ_FIXED).
bool tri__prefetch_uses_fixed_buffers(const tri__prefetch *pf);
uint64_t tri__prefetch_file_size(const tri__prefetch *pf);  // at open
void tri__prefetch_stats_get(const tri__prefetch *pf, tri__prefetch_stats *out);

// Bytes a slot needs to receive these ranges (their aligned spans, merged as submit does); 0 for
// n == 0. Pure computation.
uint64_t tri__prefetch_slot_bytes(const tri__read_range *ranges, int32_t n);

// Hands the reader n_slots staging buffers: slot i is bufs[i], sizes[i] bytes, both multiples of
// TRI_PREFETCH_ALIGN (INVALID_ARGUMENT otherwise). Replaces earlier slots; no read may be in
// flight (INVALID_ARGUMENT). The buffers must stay valid until the reader is closed or given new
// slots. Failing to register them with io_uring is not an error (logged; plain reads are used).
tri_status tri__prefetch_set_slots(tri__prefetch *pf, int32_t n_slots, void *const *bufs,
                                   const size_t *sizes);

// Starts reading ranges (n >= 1, each inside the file) into slot, which must be idle. On return
// dst_offsets[i] (n entries, may be NULL) is where range i's first byte will be in the slot
// buffer. INVALID_ARGUMENT (nothing started) for a busy or unknown slot, an empty or past-the-end
// range, or ranges that need more than the slot's size.
tri_status tri__prefetch_submit(tri__prefetch *pf, int32_t slot, const tri__read_range *ranges,
                                int32_t n, uint64_t *dst_offsets);

// Makes progress without blocking. *done is set when every read of slot has finished; then the
// slot is idle again and the call returns the slot's outcome (OK, or IO naming the file, offset
// and error of the first failed read). An idle slot is done with OK.
tri_status tri__prefetch_poll(tri__prefetch *pf, int32_t slot, bool *done);

// Blocks until every read of slot has finished; the slot is then idle. Returns its outcome as
// poll does.
tri_status tri__prefetch_wait(tri__prefetch *pf, int32_t slot);

#endif  // TRI_PREFETCH_H
