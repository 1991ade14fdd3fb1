// test-offload.c - the host side of offloading: weight reader (io_uring and pread, O_DIRECT on and
// off) against plain reads of the same file, the arena, the topology fallback, the planner.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "backend-select.h"
#include "cuda-backend.h"
#include "error.h"
#include "placement.h"
#include "planner.h"
#include "prefetch.h"
#include "test-util.h"
#include "topology.h"
#include "tri-config.h"

// ---- a generated file and its bytes ----

static uint64_t rng_state;
static uint64_t rng(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A file of n bytes of a seeded pattern (not block-aligned in length); returns its contents.
static unsigned char *make_file(const char *path, size_t n, uint64_t seed) {
    unsigned char *b = malloc(n);
    cr_assert(b);
    rng_state = seed;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rng();
        memcpy(b + i, &v, n - i < 8 ? n - i : 8);
    }
    tt_write_file(path, b, n);
    return b;
}

#define FILE_BYTES ((size_t)(12u << 20) + 777)
#define SLOT_BYTES ((size_t)4 << 20)
#define N_SLOTS 3

typedef struct reader_case {
    tri__prefetch_engine engine;
    tri__prefetch_direct direct;
    int32_t queue_depth;
    uint32_t request_bytes;
    uint32_t short_read;
} reader_case;

// Random layers of ranges: unaligned offsets and lengths, neighbours (merged spans), the file's
// unaligned tail; up to N_SLOTS layers in flight; every byte compared with the file.
static void run_reader_case(reader_case rc, uint64_t seed) {
    // Criterion runs tests in parallel processes: one file per case
    char name[64];
    snprintf(name, sizeof name, "prefetch-data-%llu.bin", (unsigned long long)seed);
    const char *path = tt_tmp(name);
    unsigned char *want = make_file(path, FILE_BYTES, 42);

    tri__prefetch_params p = tri__prefetch_default_params();
    p.engine = rc.engine;
    p.direct = rc.direct;
    p.queue_depth = rc.queue_depth;
    p.request_bytes = rc.request_bytes;
    p.debug_short_read = rc.short_read;
    tri__prefetch *pf;
    tri_status st = tri__prefetch_open(path, &p, &pf);
#if !TRI_HAVE_URING
    if (rc.engine == TRI_PREFETCH_ENGINE_URING) {
        cr_assert_eq(st, TRI_STATUS_UNSUPPORTED);
        free(want);
        return;
    }
#endif
    if (st == TRI_STATUS_UNSUPPORTED) {
        // io_uring or O_DIRECT refused here (a container, tmpfs): the case does not apply
        cr_log_info("skipped: %s", tri_last_error());
        free(want);
        return;
    }
    cr_assert_eq(st, TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__prefetch_file_size(pf), FILE_BYTES);
    if (rc.direct == TRI_PREFETCH_DIRECT_OFF) cr_assert(!tri__prefetch_uses_direct(pf));
    if (rc.direct == TRI_PREFETCH_DIRECT_ON) cr_assert(tri__prefetch_uses_direct(pf));
    if (rc.engine == TRI_PREFETCH_ENGINE_PREAD) cr_assert(!tri__prefetch_uses_uring(pf));

    // staging buffers from the arena, as the engine will use them
    tri__arena *arena;
    cr_assert_eq(tri__arena_create(NULL, &arena), TRI_STATUS_OK);
    void *bufs[N_SLOTS];
    size_t sizes[N_SLOTS];
    for (int i = 0; i < N_SLOTS; i++) {
        cr_assert_eq(tri__arena_alloc(arena, SLOT_BYTES, "staging", &bufs[i]), TRI_STATUS_OK);
        sizes[i] = SLOT_BYTES;
    }
    cr_assert_eq(tri__prefetch_set_slots(pf, N_SLOTS, bufs, sizes), TRI_STATUS_OK, "%s",
                 tri_last_error());
    if (rc.engine == TRI_PREFETCH_ENGINE_URING)
        cr_log_info("io_uring: registered buffers %s",
                    tri__prefetch_uses_fixed_buffers(pf) ? "yes" : "no (refused)");

    enum { MAX_R = 12 };
    tri__read_range ranges[N_SLOTS][MAX_R];
    uint64_t dst[N_SLOTS][MAX_R];
    int32_t n_r[N_SLOTS] = {0};
    bool busy[N_SLOTS] = {false};
    rng_state = seed;
    int rounds = 60;
    for (int round = 0; round < rounds + N_SLOTS; round++) {
        int s = round % N_SLOTS;
        if (busy[s]) {
            if (round % 2) {
                cr_assert_eq(tri__prefetch_wait(pf, s), TRI_STATUS_OK, "%s", tri_last_error());
            } else {
                bool done = false;
                while (!done)
                    cr_assert_eq(tri__prefetch_poll(pf, s, &done), TRI_STATUS_OK, "%s",
                                 tri_last_error());
            }
            busy[s] = false;
            for (int i = 0; i < n_r[s]; i++)
                cr_assert(memcmp((char *)bufs[s] + dst[s][i], want + ranges[s][i].offset,
                                 ranges[s][i].len) == 0,
                          "slot %d range %d [%llu, +%llu) differs", s, i,
                          (unsigned long long)ranges[s][i].offset,
                          (unsigned long long)ranges[s][i].len);
        }
        if (round >= rounds) continue;
        // a "layer": some tensors following each other, some elsewhere, one at the tail
        int n = 1 + (int)(rng() % MAX_R);
        uint64_t off = rng() % (FILE_BYTES - 1);
        for (int i = 0; i < n; i++) {
            uint64_t len = 1 + rng() % (256u << 10);
            int kind = (int)(rng() % 4);
            if (kind == 0) off = rng() % (FILE_BYTES - 1);          // anywhere
            if (kind == 1) off = FILE_BYTES - 1 - rng() % 5000;     // the unaligned tail
            if (off >= FILE_BYTES) off = FILE_BYTES - 1;
            if (len > FILE_BYTES - off) len = FILE_BYTES - off;
            ranges[s][i] = (tri__read_range){off, len};
            off += len + (kind == 2 ? rng() % 300 : 0);             // 2, 3: neighbours
            if (off >= FILE_BYTES) off = rng() % (FILE_BYTES - 1);
        }
        while (tri__prefetch_slot_bytes(ranges[s], n) > SLOT_BYTES) n--;
        cr_assert(n >= 1);
        n_r[s] = n;
        cr_assert_eq(tri__prefetch_submit(pf, s, ranges[s], n, dst[s]), TRI_STATUS_OK, "%s",
                     tri_last_error());
        busy[s] = true;
    }
    tri__prefetch_stats stats;
    tri__prefetch_stats_get(pf, &stats);
    cr_assert(stats.bytes_read > 0);
    if (rc.short_read) cr_assert(stats.n_retries > 0, "the short-read path did not run");
    tri__prefetch_close(pf);
    tri__arena_free(arena);
    unlink(path);
    free(want);
}

#define URING TRI_PREFETCH_ENGINE_URING
#define PREAD TRI_PREFETCH_ENGINE_PREAD
#define D_ON TRI_PREFETCH_DIRECT_ON
#define D_OFF TRI_PREFETCH_DIRECT_OFF

Test(offload, uring_direct_matches_file) { run_reader_case((reader_case){URING, D_ON, 64, 1u << 20, 0}, 1); }
Test(offload, uring_buffered_matches_file) { run_reader_case((reader_case){URING, D_OFF, 64, 1u << 20, 0}, 2); }
Test(offload, uring_small_requests_shallow_queue) { run_reader_case((reader_case){URING, D_ON, 4, 8192, 0}, 3); }
Test(offload, uring_short_reads_retried) { run_reader_case((reader_case){URING, D_ON, 16, 65536, 8192}, 4); }
Test(offload, uring_short_reads_retried_buffered) { run_reader_case((reader_case){URING, D_OFF, 16, 65536, 4096}, 5); }
Test(offload, pread_direct_matches_file) { run_reader_case((reader_case){PREAD, D_ON, 64, 1u << 20, 0}, 6); }
Test(offload, pread_buffered_matches_file) { run_reader_case((reader_case){PREAD, D_OFF, 8, 65536, 0}, 7); }
Test(offload, pread_short_reads_retried) { run_reader_case((reader_case){PREAD, D_ON, 16, 65536, 8192}, 8); }
Test(offload, auto_engine_matches_file) {
    run_reader_case((reader_case){TRI_PREFETCH_ENGINE_AUTO, TRI_PREFETCH_DIRECT_AUTO, 0, 0, 0}, 9);
}

Test(offload, slot_layout_merges_neighbours) {
    tri__read_range a[] = {{100, 50}, {150, 5000}};   // one span [0, 8192)
    cr_assert_eq(tri__prefetch_slot_bytes(a, 2), 8192);
    tri__read_range b[] = {{100, 50}, {1 << 20, 1}};  // two spans of one block each
    cr_assert_eq(tri__prefetch_slot_bytes(b, 2), 8192);
    tri__read_range c[] = {{4096, 4096}};             // aligned: exactly itself
    cr_assert_eq(tri__prefetch_slot_bytes(c, 1), 4096);
    tri__read_range d[] = {{4095, 2}};                // straddles a boundary
    cr_assert_eq(tri__prefetch_slot_bytes(d, 1), 8192);
    cr_assert_eq(tri__prefetch_slot_bytes(d, 0), 0);
}

static void reader_errors(tri__prefetch_engine engine, tri__prefetch_direct direct) {
    char name[64];
    snprintf(name, sizeof name, "prefetch-short-%d-%d.bin", (int)engine, (int)direct);
    const char *path = tt_tmp(name);
    size_t n = (size_t)1 << 20;
    unsigned char *want = make_file(path, n, 7);
    tri__prefetch_params p = tri__prefetch_default_params();
    p.engine = engine;
    p.direct = direct;
    p.request_bytes = 65536;
    tri__prefetch *pf;
    tri_status st = tri__prefetch_open(path, &p, &pf);
#if !TRI_HAVE_URING
    if (engine == TRI_PREFETCH_ENGINE_URING) {
        cr_assert_eq(st, TRI_STATUS_UNSUPPORTED);
        unlink(path);
        free(want);
        return;
    }
#endif
    if (st == TRI_STATUS_UNSUPPORTED) {
        cr_log_info("skipped: %s", tri_last_error());
        unlink(path);
        free(want);
        return;
    }
    cr_assert_eq(st, TRI_STATUS_OK, "%s", tri_last_error());
    void *buf;
    cr_assert_eq(posix_memalign(&buf, TRI_PREFETCH_ALIGN, n), 0);
    size_t size = n;
    void *unaligned = (char *)buf + 8;
    cr_assert_eq(tri__prefetch_set_slots(pf, 1, &unaligned, &size), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__prefetch_set_slots(pf, 1, &buf, &size), TRI_STATUS_OK);

    // a range past the end is refused before anything starts
    tri__read_range past = {n - 10, 11};
    cr_assert_eq(tri__prefetch_submit(pf, 0, &past, 1, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "past the end") != NULL, "%s", tri_last_error());
    tri__read_range empty = {0, 0};
    cr_assert_eq(tri__prefetch_submit(pf, 0, &empty, 1, NULL), TRI_STATUS_INVALID_ARGUMENT);
    tri__read_range too_big[] = {{0, n / 2}, {n / 2 + 8192, 1}};
    size_t small = 8192;
    void *b2;
    cr_assert_eq(posix_memalign(&b2, TRI_PREFETCH_ALIGN, small), 0);
    cr_assert_eq(tri__prefetch_set_slots(pf, 1, &b2, &small), TRI_STATUS_OK);
    cr_assert_eq(tri__prefetch_submit(pf, 0, too_big, 2, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__prefetch_submit(pf, 1, too_big, 1, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__prefetch_set_slots(pf, 1, &buf, &size), TRI_STATUS_OK);

    // busy slot
    tri__read_range r = {5, 1000};
    cr_assert_eq(tri__prefetch_submit(pf, 0, &r, 1, NULL), TRI_STATUS_OK);
    cr_assert_eq(tri__prefetch_submit(pf, 0, &r, 1, NULL), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__prefetch_wait(pf, 0), TRI_STATUS_OK);
    cr_assert_eq(tri__prefetch_wait(pf, 0), TRI_STATUS_OK, "an idle slot is done");

    // the file shrinks after open: the read meets the end of file and says so
    cr_assert_eq(truncate(path, (off_t)(n / 2)), 0);
    tri__read_range tail = {n / 2 + 100, 50000};
    uint64_t at;
    cr_assert_eq(tri__prefetch_submit(pf, 0, &tail, 1, &at), TRI_STATUS_OK);
    cr_assert_eq(tri__prefetch_wait(pf, 0), TRI_STATUS_IO);
    cr_assert(strstr(tri_last_error(), "unexpected end of file") != NULL, "%s", tri_last_error());
    cr_assert(strstr(tri_last_error(), name) != NULL, "%s", tri_last_error());
    // the reader still works for what remains
    tri__read_range head = {3, 4000};
    cr_assert_eq(tri__prefetch_submit(pf, 0, &head, 1, &at), TRI_STATUS_OK);
    cr_assert_eq(tri__prefetch_wait(pf, 0), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(memcmp((char *)buf + at, want + 3, 4000) == 0);

    tri__prefetch_close(pf);
    free(buf);
    free(b2);
    unlink(path);
    free(want);
}

Test(offload, errors_uring_direct) { reader_errors(URING, D_ON); }
Test(offload, errors_uring_buffered) { reader_errors(URING, D_OFF); }
Test(offload, errors_pread_direct) { reader_errors(PREAD, D_ON); }
Test(offload, errors_pread_buffered) { reader_errors(PREAD, D_OFF); }

Test(offload, open_errors) {
    tri__prefetch *pf;
    cr_assert_eq(tri__prefetch_open("/nonexistent/x.gguf", NULL, &pf), TRI_STATUS_IO);
    cr_assert(strstr(tri_last_error(), "/nonexistent/x.gguf") != NULL);
    tri__prefetch_params p = tri__prefetch_default_params();
    p.request_bytes = 1000;
    cr_assert_eq(tri__prefetch_open("/dev/null", &p, &pf), TRI_STATUS_INVALID_ARGUMENT);
    tri__prefetch_close(NULL);
}

// ---- arena ----

static int n_pinned, n_unpinned;
static tri_status fake_pin(void *ptr, size_t bytes, void *user) {
    (void)ptr;
    if (user && bytes > 100000) return TRI_STATUS_DEVICE_OUT_OF_MEMORY;
    n_pinned++;
    return TRI_STATUS_OK;
}
static void fake_unpin(void *ptr, size_t bytes, void *user) {
    (void)ptr, (void)bytes, (void)user;
    n_unpinned++;
}

Test(offload, arena_alignment_zero_fill_limit) {
    tri__arena_params ap = tri__arena_default_params();
    ap.limit_bytes = (uint64_t)8 << 20;
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK);
    size_t sizes[] = {1, 4097, (size_t)3 << 20};
    void *p[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tri__arena_alloc(a, sizes[i], "test", &p[i]), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq((uintptr_t)p[i] % 4096, 0);
        for (size_t j = 0; j < sizes[i]; j += 511) cr_assert_eq(((unsigned char *)p[i])[j], 0);
        memset(p[i], 0xab, sizes[i]);
        tri__arena_region_info info;
        cr_assert_eq(tri__arena_region_info_get(a, p[i], &info), TRI_STATUS_OK);
        cr_assert_eq(info.bytes, sizes[i]);
        cr_assert(info.mapped_bytes >= sizes[i] && info.mapped_bytes % 4096 == 0);
        cr_assert(!info.bound, "no topology, no binding");
        cr_assert_eq(info.node, -1);
        cr_assert(!info.pinned);
    }
    tri__arena_stats s;
    tri__arena_stats_get(a, &s);
    cr_assert_eq(s.n_regions, 3);
    cr_assert_eq(s.bytes, 1 + 4097 + (3u << 20));
    cr_assert_eq(s.node, -1);
    void *q;
    cr_assert_eq(tri__arena_alloc(a, (size_t)6 << 20, "kv layer 7", &q), TRI_STATUS_OUT_OF_MEMORY);
    cr_assert(strstr(tri_last_error(), "kv layer 7") != NULL, "%s", tri_last_error());
    cr_assert_eq(tri__arena_alloc(a, 0, "zero", &q), TRI_STATUS_INVALID_ARGUMENT);
    tri__arena_release(a, p[2]);
    tri__arena_release(a, NULL);
    cr_assert_eq(tri__arena_region_info_get(a, p[2], &(tri__arena_region_info){0}),
                 TRI_STATUS_NOT_FOUND);
    cr_assert_eq(tri__arena_alloc(a, (size_t)6 << 20, "fits now", &q), TRI_STATUS_OK);
    tri__arena_stats_get(a, &s);
    cr_assert_eq(s.n_regions, 3);
    cr_assert(s.peak_mapped_bytes >= s.mapped_bytes);
    tri__arena_free(a);
    tri__arena_free(NULL);
}

Test(offload, arena_pin_hook) {
    tri__arena_params ap = tri__arena_default_params();
    ap.pin = fake_pin;
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_INVALID_ARGUMENT, "pin needs unpin");
    ap.unpin = fake_unpin;
    ap.pin_user = &n_pinned;  // non-NULL: refuse regions over 100000 bytes
    n_pinned = n_unpinned = 0;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK);
    void *p, *q;
    cr_assert_eq(tri__arena_alloc(a, 5000, "small", &p), TRI_STATUS_OK);
    tri__arena_region_info info;
    cr_assert_eq(tri__arena_region_info_get(a, p, &info), TRI_STATUS_OK);
    cr_assert(info.pinned);
    cr_assert_eq(tri__arena_alloc(a, 200000, "big", &q), TRI_STATUS_DEVICE_OUT_OF_MEMORY);
    cr_assert_null(q);
    tri__arena_stats s;
    tri__arena_stats_get(a, &s);
    cr_assert_eq(s.n_regions, 1, "a failed pin leaves nothing mapped");
    cr_assert_eq(s.n_pinned, 1);
    tri__arena_free(a);
    cr_assert_eq(n_pinned, 1);
    cr_assert_eq(n_unpinned, 1);
}

// Pinning many regions (60+ GB of offloaded KV is 64 regions of 1 GiB): progress in the log, and
// when the OS refuses (here a pin function that refuses past a budget, as cudaHostRegister does
// past RLIMIT_MEMLOCK), a failure that says how much was pinned before, the region and the limit.
static uint64_t pin_budget, pin_used;
static tri_status budget_pin(void *ptr, size_t bytes, void *user) {
    (void)ptr, (void)user;
    if (pin_used + bytes > pin_budget)
        return tri__fail(TRI_STATUS_DEVICE, "cudaHostRegister: cudaErrorMemoryAllocation (test: past the budget)");
    pin_used += bytes;
    return TRI_STATUS_OK;
}
static void budget_unpin(void *ptr, size_t bytes, void *user) {
    (void)ptr, (void)user;
    pin_used -= bytes;
}
static char pin_log[8][256];
static int n_pin_log;
static void pin_log_fn(tri_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == TRI_LOG_LEVEL_INFO && strstr(msg, "arena: pinned") && n_pin_log < 8)
        snprintf(pin_log[n_pin_log++], sizeof pin_log[0], "%s", msg);
}
Test(offload, arena_pins_in_regions_with_progress_and_a_clear_refusal) {
    tri__arena_params ap = tri__arena_default_params();
    ap.huge_pages = false;
    ap.pin = budget_pin;
    ap.unpin = budget_unpin;
    ap.pin_report_bytes = (uint64_t)2 << 20;  // a line every 2 MiB pinned
    pin_budget = (uint64_t)5 << 20, pin_used = 0;
    n_pin_log = 0;
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK);
    tri_log_set(pin_log_fn, NULL, TRI_LOG_LEVEL_INFO);
    void *p[6] = {0};
    int i = 0;
    tri_status st = TRI_STATUS_OK;
    for (; i < 6 && !st; i++) {
        char what[64];
        snprintf(what, sizeof what, "kv cache layer %d keys", i);
        st = tri__arena_alloc(a, (size_t)1 << 20, what, &p[i]);
    }
    tri_log_set(NULL, NULL, TRI_LOG_LEVEL_WARN);
    cr_assert_eq(st, TRI_STATUS_DEVICE, "the sixth MiB is past the budget");
    cr_assert_eq(i, 6);
    const char *e = tri_last_error();
    cr_assert(strstr(e, "arena: kv cache layer 5 keys: pinning 0.00 GiB failed after 0.0 GiB pinned in 5 regions") &&
                  strstr(e, "test: past the budget") && strstr(e, "locked-memory limit") && strstr(e, "ulimit -l") &&
                  strstr(e, "memory available"),
              "%s", e);
    cr_assert_eq(n_pin_log, 2, "progress at 2 and 4 MiB: %d lines", n_pin_log);
    cr_assert(strstr(pin_log[0], "arena: pinned 0.0 GiB in 2 regions"), "%s", pin_log[0]);
    cr_assert(strstr(pin_log[1], "in 4 regions"), "%s", pin_log[1]);
    tri__arena_stats s;
    tri__arena_stats_get(a, &s);
    cr_assert_eq(s.n_pinned, 5);
    tri__arena_free(a);
    cr_assert_eq(pin_used, 0, "every region unpinned");
}

Test(offload, arena_numa_placement_or_fallback) {
    tri__topology *t;
    cr_assert_eq(tri__topology_open(&t), TRI_STATUS_OK);
    tri__arena_params ap = tri__arena_default_params();
    ap.topo = t;
    ap.pci_bus_id = "not a bus id";
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_INVALID_ARGUMENT);
    ap.pci_bus_id = "0000:ff:1f.7";  // no such device: falls back to the current node
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK, "%s", tri_last_error());
    tri__arena_stats s;
    tri__arena_stats_get(a, &s);
    if (tri__topology_is_hwloc(t))
        cr_assert(s.node >= 0 && s.node < tri__topology_n_nodes(t));
    else
        cr_assert_eq(s.node, -1, "the fallback does not bind");
    void *p;
    cr_assert_eq(tri__arena_alloc(a, (size_t)5 << 20, "kv", &p), TRI_STATUS_OK);
    tri__arena_region_info info;
    cr_assert_eq(tri__arena_region_info_get(a, p, &info), TRI_STATUS_OK);
    if (info.bound) cr_assert_eq(info.node, s.node);
    cr_log_info("arena: node %d, bound %d, huge %d", s.node, info.bound, info.huge);
    tri__arena_free(a);
    ap.pci_bus_id = NULL;
    ap.node = tri__topology_n_nodes(t);
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_INVALID_ARGUMENT);
    tri__topology_free(t);
}

Test(offload, topology_summary_and_binding) {
    tri__topology *t;
    cr_assert_eq(tri__topology_open(&t), TRI_STATUS_OK);
    int32_t n = tri__topology_n_nodes(t);
    cr_assert(n >= 1);
    int32_t pus = 0;
    for (int32_t i = 0; i < n; i++) {
        const tri__numa_node *nd = tri__topology_node(t, i);
        cr_assert_not_null(nd);
        pus += nd->n_pus;
    }
    cr_assert(pus >= 1);
    cr_assert_null(tri__topology_node(t, n));
    int32_t cur = tri__topology_current_node(t);
    cr_assert(cur >= 0 && cur < n);
    cr_assert_eq(tri__topology_bind_thread(t, cur), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__topology_bind_omp(t, cur, 2), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__topology_bind_thread(t, n), TRI_STATUS_INVALID_ARGUMENT);
    int32_t node;
    cr_assert_eq(tri__topology_node_of_pci(t, "zz:00.0", &node), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__topology_node_of_pci(t, "01:00", &node), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__topology_node_of_pci(t, "0000:ff:1f.7", &node), TRI_STATUS_NOT_FOUND);
    tri__topology_free(t);
    tri__topology_free(NULL);
}

// ---- host placement near the GPU ----

// Points hwloc at a two-socket machine for the rest of the calling test: node 0 holds PUs 0-1 and
// the GPU at 0000:01:00.0, node 1 PUs 2-3 and the GPU at 0000:41:00.0, written as hwloc's XML.
// hwloc loads it in place of the real machine when HWLOC_XMLFILE names it (each Criterion test
// runs in a process of its own, so the variable stays in the test that sets it), and binding
// against such a topology succeeds without asking the OS: the two-node decisions run on a
// one-node CI machine. false in a build without hwloc.
static bool use_two_node_topology(void) {
    if (!TRI_HAVE_HWLOC) return false;
    // one file per test process: Criterion runs the tests side by side, and a file truncated by
    // another test's write would read as no topology
    char name[64];
    snprintf(name, sizeof name, "topology-two-nodes-%ld.xml", (long)getpid());
    const char *path = tt_tmp(name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
#define SETS(cpus, nodes) \
    "cpuset=\"" cpus "\" complete_cpuset=\"" cpus "\" nodeset=\"" nodes "\" complete_nodeset=\"" nodes "\""
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
               "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" " SETS("0xf", "0x3") ">\n");
    static const char *const pkg_cpus[2] = {"0x3", "0xc"}, *const pkg_nodes[2] = {"0x1", "0x2"};
    static const char *const pkg_bus[2] = {"01", "41"};
    for (int p = 0; p < 2; p++) {
        const char *cpus = pkg_cpus[p], *nodes = pkg_nodes[p];
        fprintf(f, "<object type=\"Package\" os_index=\"%d\" " SETS("%s", "%s") ">\n", p, cpus, cpus, nodes, nodes);
        fprintf(f, "<object type=\"NUMANode\" os_index=\"%d\" " SETS("%s", "%s") " local_memory=\"1073741824\"/>\n",
                p, cpus, cpus, nodes, nodes);
        for (int pu = 2 * p; pu < 2 * p + 2; pu++)
            fprintf(f, "<object type=\"PU\" os_index=\"%d\" " SETS("0x%x", "%s") "/>\n", pu, 1u << pu, 1u << pu, nodes,
                    nodes);
        fprintf(f,
                "<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[%s-%s]\">\n"
                "<object type=\"PCIDev\" pci_busid=\"0000:%s:00.0\" pci_type=\"0300 [10de:2684] [10de:0000] a1\"/>\n"
                "</object>\n</object>\n",
                pkg_bus[p], pkg_bus[p], pkg_bus[p]);
    }
#undef SETS
    fprintf(f, "</object>\n</topology>\n");
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(setenv("HWLOC_XMLFILE", path, 1), 0);
    return true;
}

Test(offload, node_for_device_two_nodes) {
    if (!use_two_node_topology()) cr_skip_test("built without hwloc");
    tri__topology *t;
    cr_assert_eq(tri__topology_open(&t), TRI_STATUS_OK);
    cr_assert(tri__topology_is_hwloc(t));
    cr_assert_eq(tri__topology_n_nodes(t), 2);
    cr_assert_eq(tri__topology_node(t, 1)->os_index, 1);
    cr_assert_eq(tri__topology_node(t, 1)->n_pus, 2);
    // each GPU maps to the node of its own socket, in both spellings of the bus id
    cr_assert_eq(tri__topology_node_for_device(t, "0000:41:00.0"), 1);
    cr_assert_eq(tri__topology_node_for_device(t, "41:00.0"), 1);
    cr_assert_eq(tri__topology_node_for_device(t, "0000:01:00.0"), 0);
    int32_t node = -1;
    cr_assert_eq(tri__topology_node_of_pci(t, "0000:41:00.0", &node), TRI_STATUS_OK);
    cr_assert_eq(node, 1);
    // nothing to choose by: -1 (leave it to the kernel), and the caller's last error survives
    (void)tri__topology_node_of_pci(t, "zz", &node);  // records an error of its own
    char before[256];
    snprintf(before, sizeof before, "%s", tri_last_error());
    cr_assert_eq(tri__topology_node_for_device(t, "0000:ff:1f.7"), -1, "a device hwloc does not know");
    cr_assert_eq(tri__topology_node_for_device(t, "not a bus id"), -1);
    cr_assert_eq(tri__topology_node_for_device(t, ""), -1);
    cr_assert_eq(tri__topology_node_for_device(t, NULL), -1);
    cr_assert_str_eq(tri_last_error(), before);
    // binding to the GPU's node: against an XML topology hwloc accepts it without asking the OS
    cr_assert_eq(tri__topology_bind_thread(t, 1), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__topology_bind_omp(t, 1, 2), TRI_STATUS_OK, "%s", tri_last_error());
    tri__topology_free(t);
}

Test(offload, node_for_device_one_node_is_no_choice) {
    tri__topology *t;
    cr_assert_eq(tri__topology_open(&t), TRI_STATUS_OK);
    if (tri__topology_n_nodes(t) > 1) cr_skip_test("this machine has %d NUMA nodes", tri__topology_n_nodes(t));
    // every PCI device of this machine, known to hwloc or not: one node leaves nothing to place
    int n_seen = 0;
    FILE *ls = popen("ls /sys/bus/pci/devices 2>/dev/null", "r");
    cr_assert_not_null(ls);
    char busid[64];
    while (fscanf(ls, "%63s", busid) == 1) {
        cr_assert_eq(tri__topology_node_for_device(t, busid), -1, "%s", busid);
        n_seen++;
    }
    pclose(ls);
    cr_assert_eq(tri__topology_node_for_device(t, "0000:01:00.0"), -1);
    cr_log_info("one node: %d PCI devices, none placed", n_seen);
    tri__topology_free(t);
}

Test(offload, arena_params_place_near_gpu) {
    if (!use_two_node_topology()) cr_skip_test("built without hwloc");
    tri__arena_params ap = tri__arena_default_params();
    char busid[32] = "0000:41:00.0";
    tri__arena_params_place_near(&ap, busid);
    memset(busid, 0, sizeof busid);  // the string need not outlive the call
    cr_assert_not_null(ap.topo);
    cr_assert_eq(ap.node, 1);
    const tri__topology *t = NULL;
    cr_assert_eq(tri__host_node_near("0000:01:00.0", &t), 0);
    cr_assert_eq(t, ap.topo, "one topology per process");
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK, "%s", tri_last_error());
    tri__arena_stats s;
    tri__arena_stats_get(a, &s);
    cr_assert_eq(s.node, 1, "the arena targets the GPU's node, not the creating thread's");
    void *p;
    cr_assert_eq(tri__arena_alloc(a, (size_t)3 << 20, "kv", &p), TRI_STATUS_OK);
    tri__arena_region_info info;
    cr_assert_eq(tri__arena_region_info_get(a, p, &info), TRI_STATUS_OK);
    if (info.bound) cr_assert_eq(info.node, 1);
    tri__arena_free(a);
    // a device hwloc does not know: the params stay unplaced (first touch)
    tri__arena_params un = tri__arena_default_params();
    tri__arena_params_place_near(&un, "0000:ff:1f.7");
    cr_assert_null(un.topo);
    cr_assert_eq(un.node, -1);
    tri__arena_params_place_near(&un, NULL);
    cr_assert_null(un.topo);
}

// A device backend that is no PCI device (host_memory false, not CUDA) with pinning hooks.
static tri_status fake_register(tri__backend *be, void *ptr, size_t bytes) {
    (void)be, (void)ptr, (void)bytes;
    return TRI_STATUS_OK;
}
static void fake_unregister(tri__backend *be, void *ptr) { (void)be, (void)ptr; }
static const tri__backend_ops fake_device_ops = {
    .name = "fake-device",
    .host_register = fake_register,
    .host_unregister = fake_unregister,
};

Test(offload, arena_params_pin_for_backends) {
    (void)use_two_node_topology();  // with hwloc: even where a GPU's node would be chosen
    char busid[32] = "x";
    // the CPU: host memory, no bus id, nothing pinned or placed
    tri__backend *cpu;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &cpu), TRI_STATUS_OK);
    cr_assert_eq(tri__backend_pci_bus_id(cpu, busid, sizeof busid), TRI_STATUS_NOT_FOUND);
    cr_assert_str_eq(busid, "");
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, cpu);
    cr_assert_null(ap.pin);
    cr_assert_null(ap.topo);
    cr_assert_eq(ap.node, -1);
    // no thread binding either: the calling thread keeps its CPUs
    cpu_set_t before, after;
    cr_assert_eq(sched_getaffinity(0, sizeof before, &before), 0);
    tri__backend_bind_host_threads(cpu, "cpu");
    cr_assert_eq(sched_getaffinity(0, sizeof after, &after), 0);
    cr_assert(CPU_EQUAL(&before, &after));
    tri__backend_free(cpu);
    // a device without a PCI bus id (not CUDA): pinned through its hooks, placement left alone
    tri__backend fake = {.ops = &fake_device_ops, .n_threads = 1, .host_memory = false};
    snprintf(busid, sizeof busid, "x");
    cr_assert_eq(tri__backend_pci_bus_id(&fake, busid, sizeof busid), TRI_STATUS_NOT_FOUND);
    cr_assert_str_eq(busid, "");
    ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, &fake);
    cr_assert_not_null(ap.pin);
    cr_assert_eq(ap.pin_user, &fake);
    cr_assert_null(ap.topo);
    tri__backend_bind_host_threads(&fake, "fake");
    cr_assert_eq(sched_getaffinity(0, sizeof after, &after), 0);
    cr_assert(CPU_EQUAL(&before, &after));
}

Test(offload, bind_host_threads_one_node_keeps_affinity) {
    tri__topology *t;
    cr_assert_eq(tri__topology_open(&t), TRI_STATUS_OK);
    int32_t n = tri__topology_n_nodes(t);
    tri__topology_free(t);
    if (n > 1) cr_skip_test("this machine has %d NUMA nodes", n);
    // A narrower binding than the node's (taskset -c 0) must survive: on one node there is
    // nothing to bind to, so the runtime leaves the threads alone.
    cpu_set_t one, after;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0, "%s", strerror(errno));
    const tri__topology *pt = NULL;
    cr_assert_eq(tri__host_node_near("0000:01:00.0", &pt), -1);
    cr_assert_not_null(pt);
    if (tri__cuda_device_count() > 0) {
        tri__backend *gpu;
        char name[16];
        cr_assert_eq(tri__backend_select(TRI_DEVICE_CUDA, 0, 0, &gpu, name), TRI_STATUS_OK, "%s", tri_last_error());
        tri__backend_free(gpu);
    }
    cr_assert_eq(sched_getaffinity(0, sizeof after, &after), 0);
    cr_assert(CPU_EQUAL(&one, &after));
}

Test(offload, cuda_backend_reports_its_bus_id) {
    if (tri__cuda_device_count() == 0) cr_skip_test("no CUDA device");
    tri__backend *gpu;
    char name[16];
    cr_assert_eq(tri__backend_select(TRI_DEVICE_CUDA, 0, 0, &gpu, name), TRI_STATUS_OK, "%s", tri_last_error());
    tri__cuda_device_info ci;
    cr_assert_eq(tri__cuda_device_info_get(0, &ci), TRI_STATUS_OK, "%s", tri_last_error());
    char busid[32];
    cr_assert_eq(tri__backend_pci_bus_id(gpu, busid, sizeof busid), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_str_eq(busid, ci.pci_bus_id);
    cr_assert_eq(tri__backend_cuda_pci_bus_id(gpu, busid, 8), TRI_STATUS_INVALID_ARGUMENT);
    tri__arena_params ap = tri__arena_default_params();
    tri__arena_params_pin_for(&ap, gpu);
    cr_assert_not_null(ap.pin);
    int32_t node = tri__host_node_near(ci.pci_bus_id, NULL);
    cr_assert_eq(ap.node, node);
    cr_assert(node < 0 ? ap.topo == NULL : ap.topo != NULL);
    tri__arena *a;
    cr_assert_eq(tri__arena_create(&ap, &a), TRI_STATUS_OK, "%s", tri_last_error());
    void *p;
    cr_assert_eq(tri__arena_alloc(a, (size_t)4 << 20, "probe", &p), TRI_STATUS_OK, "%s", tri_last_error());
    tri__arena_region_info info;
    cr_assert_eq(tri__arena_region_info_get(a, p, &info), TRI_STATUS_OK);
    cr_assert(info.pinned);
    if (info.bound) cr_assert_eq(info.node, node);
    cr_log_info("%s at %s: NUMA node %d, region bound %d", name, busid, node, info.bound);
    tri__arena_free(a);
    tri__backend_free(gpu);
}

// ---- planner ----

static tri_model_config llama2_7b_128k(void) {
    tri_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 32;
    c.n_embd = 4096;
    c.n_head = 32;
    c.n_head_kv = 32;
    c.head_dim = 128;
    c.n_ff = 11008;
    c.n_vocab = 32000;
    c.n_ctx_train = 131072;
    return c;
}

#define CTX_127K (127 * 1024)

static tri_plan plan_7b(uint64_t gpu_gib, int32_t n_gpu, uint64_t host_gib, tri_status want) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = CTX_127K;
    p.gpu_mem_bytes = gpu_gib << 30;
    p.n_gpu = n_gpu;
    p.host_mem_bytes = host_gib << 30;
    tri_plan plan;
    tri_status st = tri_plan_compute(&m, &p, &plan);
    cr_assert_eq(st, want, "%s", tri_last_error());
    return plan;
}

static void check_consistent(const tri_plan *pl) {
    cr_assert_eq(pl->n_weights_gpu + pl->n_weights_host + pl->n_weights_disk, pl->n_layer);
    cr_assert_eq(pl->on_chip + pl->n_kv_host, pl->n_layer);
    cr_assert(pl->gpu_total_bytes <= pl->params.gpu_mem_bytes);
    if (pl->params.host_mem_bytes) cr_assert(pl->host_total_bytes <= pl->params.host_mem_bytes);
    cr_assert(pl->t_token > 0 && pl->t_token >= pl->t_token_pcie_floor * 0.999);
    size_t need;
    cr_assert_eq(tri_plan_format(pl, NULL, 0, &need), TRI_STATUS_OK);
    char *text = malloc(need + 1);
    size_t got;
    cr_assert_eq(tri_plan_format(pl, text, need + 1, &got), TRI_STATUS_OK);
    cr_assert_eq(got, need);
    cr_assert_eq(strlen(text), need);
    cr_assert(strstr(text, "on_chip") != NULL);
    cr_assert_eq(tri_plan_format(pl, text, need, NULL), TRI_STATUS_INVALID_ARGUMENT, "truncated");
    free(text);
}

Test(offload, plan_sizes_of_llama2_7b) {
    tri_model_config c = llama2_7b_128k();
    // per block: 4 attention matrices 4096 x 4096 and 3 FFN matrices 4096 x 11008 in f16, two
    // f32 norms
    uint64_t layer = 4ull * 4096 * 4096 * 2 + 3ull * 4096 * 11008 * 2 + 2ull * 4096 * 4;
    cr_assert_eq(tri__plan_layer_bytes(&c, TRI_DTYPE_F16), layer);
    uint64_t all = 32 * layer + tri__plan_other_bytes(&c, TRI_DTYPE_F16);
    cr_assert(all > 13.4e9 && all < 13.6e9, "%llu", (unsigned long long)all);  // "13.5 GB"
    cr_assert_eq(tri__plan_layer_bytes(&c, TRI_DTYPE_Q4_0), 4ull * 4096 * 4096 / 32 * 18 +
                                                                 3ull * 4096 * 11008 / 32 * 18 +
                                                                 2ull * 4096 * 4);
    cr_assert(fabs(tri__plan_expected_tokens(0.9, 12) - (1 - pow(0.9, 13)) / 0.1) < 1e-12);
    cr_assert_eq(tri__plan_expected_tokens(1.0, 12), 13.0);
    cr_assert_eq(tri__plan_expected_tokens(0.0, 12), 1.0);
}

Test(offload, plan_7b_127k_one_24g_gpu_keeps_weights_offloads_kv) {
    tri_plan pl = plan_7b(24, 1, 0, TRI_STATUS_OK);
    check_consistent(&pl);
    cr_assert_eq(pl.n_weights_gpu, 32, "13.5 GB of weights fit in 24 GiB");
    double kv = (double)pl.kv_layer_bytes * 32;
    cr_assert(kv > 66e9 && kv < 69e9, "%g", kv);  // 2 x 32 x 4096 x 2 B x 130048 = 68.2 GB
    cr_assert(pl.n_kv_host >= 28, "%d", pl.n_kv_host);
    cr_assert_eq(pl.gpu_kv_buffer_bytes, 2 * pl.kv_layer_bytes);
    cr_assert_eq(pl.gpu_weight_buffer_bytes, 0);
    cr_assert_eq(pl.retrieval_budget, 8192);
    // the sweep of the offloaded KV dominates: within 15% of its PCIe floor per round
    double floor = (double)pl.n_kv_host * (double)pl.kv_layer_bytes / 25e9;
    cr_assert(pl.t_l3 >= floor && pl.t_l3 < 1.15 * floor, "%g vs %g", pl.t_l3, floor);
    cr_assert(pl.t_token < pl.t_token_ar / 4, "TriForce %g s, AR %g s", pl.t_token, pl.t_token_ar);
}

Test(offload, plan_7b_127k_two_24g_gpus) {
    tri_plan one = plan_7b(24, 1, 0, TRI_STATUS_OK);
    tri_plan two = plan_7b(24, 2, 0, TRI_STATUS_OK);
    check_consistent(&two);
    cr_assert_eq(two.n_weights_gpu, 32);
    cr_assert_eq(two.retrieval_budget, 12288);
    cr_assert(two.on_chip > one.on_chip, "%d vs %d", two.on_chip, one.on_chip);
    cr_assert(two.on_chip >= 8, "the paper's code keeps 9 layers on chip on 2 x 4090: %d",
              two.on_chip);
    cr_assert(two.t_token < one.t_token / 2);
}

Test(offload, plan_small_budget_streams_weights) {
    tri_plan pl = plan_7b(12, 1, 0, TRI_STATUS_OK);
    check_consistent(&pl);
    cr_assert(pl.n_weights_gpu < 32 && pl.n_weights_gpu > 0, "%d", pl.n_weights_gpu);
    cr_assert_eq(pl.n_weights_host, 32 - pl.n_weights_gpu);
    cr_assert_eq(pl.n_weights_disk, 0);
    cr_assert_eq(pl.gpu_weight_buffer_bytes, 2 * pl.weight_layer_bytes);
    cr_assert(pl.pcie_bytes_l2 == (uint64_t)pl.n_weights_host * pl.weight_layer_bytes,
              "every L2 pass streams the weights that are not resident");
    tri_plan roomy = plan_7b(24, 1, 0, TRI_STATUS_OK);
    cr_assert(pl.t_token > roomy.t_token);
}

Test(offload, plan_host_budget_sends_weights_to_disk) {
    tri_plan pl = plan_7b(12, 1, 76, TRI_STATUS_OK);
    check_consistent(&pl);
    cr_assert(pl.n_weights_disk > 0, "%d on disk", pl.n_weights_disk);
    cr_assert_eq(pl.host_staging_bytes, 3 * pl.weight_layer_bytes);
    tri_plan all_host = plan_7b(12, 1, 0, TRI_STATUS_OK);
    cr_assert(pl.t_token > all_host.t_token);
}

Test(offload, plan_impossible_budgets) {
    plan_7b(4, 1, 0, TRI_STATUS_DEVICE_OUT_OF_MEMORY);
    cr_assert(strstr(tri_last_error(), "device budget of 4.00 GiB") != NULL, "%s",
              tri_last_error());
    plan_7b(24, 1, 40, TRI_STATUS_OUT_OF_MEMORY);
    cr_assert(strstr(tri_last_error(), "host budget of 40.00 GiB") != NULL, "%s",
              tri_last_error());
    // fixed parts fit, the double buffers do not
    plan_7b(7, 1, 0, TRI_STATUS_DEVICE_OUT_OF_MEMORY);
    cr_assert(strstr(tri_last_error(), "double buffers") != NULL, "%s", tri_last_error());

    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    tri_plan pl;
    p.n_ctx = -1;
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_INVALID_ARGUMENT);
    p = tri_plan_default_params();
    p.n_gpu = 3;  // 32 KV heads split 11 + 11 + 10, as the engine splits them
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(pl.tp_kv_heads_max, 11);
    cr_assert(pl.t_allreduce_token > 0 && pl.t_allreduce_token < pl.t_token);
    p.n_gpu = 9;  // more devices than a device list holds
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "9 devices, want 1 .. 8"), "%s", tri_last_error());
    p = tri_plan_default_params();
    p.accept_l2 = 1.5;
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_INVALID_ARGUMENT);
    c.n_head_kv = 5;
    m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    cr_assert_eq(tri_plan_compute(&m, NULL, &pl), TRI_STATUS_INVALID_ARGUMENT);
}

Test(offload, plan_short_context_fits_on_chip) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = 4096;
    tri_plan pl;
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&pl);
    cr_assert_eq(pl.on_chip, 32);
    cr_assert_eq(pl.n_kv_host, 0);
    cr_assert_eq(pl.pcie_bytes_l3, 0);
    cr_assert_eq(pl.host_kv_bytes, 0);
}

Test(offload, plan_autoregressive_and_gqa) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = CTX_127K;
    p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
    tri_plan ar;
    cr_assert_eq(tri_plan_compute(&m, &p, &ar), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&ar);
    cr_assert_eq(ar.tokens_per_round, 1.0);
    cr_assert_eq(ar.retrieval_budget, 0);
    cr_assert_eq(ar.t_token_ar, ar.t_token);
    tri_plan tf = plan_7b(24, 1, 0, TRI_STATUS_OK);
    cr_assert(fabs(tf.t_token_ar - ar.t_token) < 1e-12, "the baseline is the AR plan");
    cr_assert(ar.on_chip >= tf.on_chip, "no retrieval cache or draft: room for more KV");

    // GQA with 8 KV heads: a quarter of the KV, so more stays on chip
    c.n_head_kv = 8;
    m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    p.mode = TRI_PLAN_MODE_TRIFORCE;
    tri_plan gqa;
    cr_assert_eq(tri_plan_compute(&m, &p, &gqa), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&gqa);
    cr_assert_eq(gqa.kv_layer_bytes * 4, tf.kv_layer_bytes);
    cr_assert(gqa.on_chip > tf.on_chip);
}

// ---- planner: kv_type mixed ----

// Figures from the formats, not from the planner: a token of one Llama2-7B layer is 32 KV heads x
// 128 dims = 4096 values each of K and V. q4_0 stores 32 values in 18 bytes (an f16 scale and 16
// bytes of nibbles): 2 x 4096 / 32 x 18 = 4,608 bytes; f16: 2 x 4096 x 2 = 16,384. Mixed keeps
// every row in q4_0 (host, stream, on-chip layers) and, per layer on the GPU, 16 f16 sinks and a
// buffer half as long again as what a step keeps (240 recent rows + a 128-row step + a 128-row
// rollback = 496): 16 + 744 = 760 f16 rows, 760 x 16,384 x 32 layers = 380 MiB (190 MiB on each of
// two GPUs). On a 64 GiB host at 127K tokens the f16 cache (63.5 GiB + summaries) does not
// fit, mixed does.
Test(offload, plan_kv_mixed_7b_127k_64g_host) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    const uint64_t q4_tok = 2 * 4096 / 32 * 18, f16_tok = 2 * 4096 * 2, n = CTX_127K;
    cr_assert_eq(q4_tok, 4608);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = CTX_127K;
    p.host_mem_bytes = (uint64_t)64 << 30;
    tri_plan f16, q4, mix;
    cr_assert_eq(tri_plan_compute(&m, &p, &f16), TRI_STATUS_OUT_OF_MEMORY, "f16 KV in a 64 GiB host");
    p.kv_type = TRI_DTYPE_Q4_0;
    cr_assert_eq(tri_plan_compute(&m, &p, &q4), TRI_STATUS_OK, "%s", tri_last_error());
    p.kv_type = TRI_DTYPE_KV_MIXED;
    cr_assert_eq(tri_plan_compute(&m, &p, &mix), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&mix);
    cr_assert_eq(mix.params.kv_sink, 16);
    cr_assert_eq(mix.params.kv_window, 240);
    cr_assert_eq(mix.kv_layer_bytes, q4_tok * n);
    cr_assert_eq(mix.gpu_kv_f16_bytes, 760 * f16_tok * 32);
    cr_assert_eq(mix.gpu_kv_f16_bytes, (uint64_t)380 << 20);
    cr_assert_eq(q4.gpu_kv_f16_bytes, 0);
    cr_assert_eq(mix.n_weights_gpu, 32, "weights stay resident");
    cr_assert_eq(mix.host_kv_bytes, (uint64_t)mix.n_kv_host * q4_tok * n);
    cr_assert(mix.host_total_bytes <= p.host_mem_bytes);
    // an L3 pass streams every offloaded layer's q4_0 rows (the store moves a layer whole)
    cr_assert_eq(mix.pcie_bytes_l3, (uint64_t)mix.n_kv_host * q4_tok * n);
    cr_assert_eq(mix.gpu_total_bytes, mix.params.gpu_reserve_bytes + mix.gpu_weight_bytes +
                                          (uint64_t)mix.on_chip * q4_tok * n + mix.gpu_kv_buffer_bytes +
                                          mix.gpu_retrieval_bytes + mix.gpu_draft_bytes + mix.gpu_act_bytes +
                                          ((uint64_t)380 << 20));
    // against q4_0: the f16 rows take 380 MiB of the card (never more KV layers on chip) and their
    // reads a little time; the bytes over PCIe per layer are q4_0's
    cr_assert(mix.on_chip <= q4.on_chip);
    cr_assert(mix.t_l3 >= q4.t_l3);
    if (mix.on_chip == q4.on_chip) {
        cr_assert_eq(mix.pcie_bytes_l3, q4.pcie_bytes_l3);
        cr_assert_eq(mix.gpu_total_bytes, q4.gpu_total_bytes + ((uint64_t)380 << 20));
    }
    char text[8192];
    cr_assert_eq(tri_plan_format(&mix, text, sizeof text, NULL), TRI_STATUS_OK);
    cr_assert(strstr(text, "KV mixed") && strstr(text, "f16 sinks and window"), "%s", text);
    // autoregressive: a one-row pass reads the 256 f16 rows of each layer beside the q4_0 ones
    p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
    tri_plan ar;
    cr_assert_eq(tri_plan_compute(&m, &p, &ar), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(ar.pcie_bytes_l3, (uint64_t)ar.n_kv_host * q4_tok * n);
    // two GPUs: each holds half the heads' f16 rows
    p.mode = TRI_PLAN_MODE_TRIFORCE;
    p.n_gpu = 2;
    tri_plan two;
    cr_assert_eq(tri_plan_compute(&m, &p, &two), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(two.gpu_kv_f16_bytes, (uint64_t)190 << 20);
    // a window of its own: 4 sinks + 1.5 x (60 + 256) = 4 + 474 rows
    p.n_gpu = 1, p.kv_sink = 4, p.kv_window = 60;
    cr_assert_eq(tri_plan_compute(&m, &p, &mix), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(mix.gpu_kv_f16_bytes, 478 * f16_tok * 32);
    p.kv_sink = -1;
    cr_assert_eq(tri_plan_compute(&m, &p, &mix), TRI_STATUS_INVALID_ARGUMENT);
}

// ---- planner: batches (issue 31) ----

// Lockstep drafting by hand. gamma1 1 at rate 0.5, gamma2 2: a pass yields 2 tokens or 1 (1/2
// each), so N = 1 or 2 passes (1/2 each): E[N] = 1.5; the max of two is 1 only if both are
// (1/4): 1/4 + 3/4 x 2 = 1.75; of three, 1/8 + 7/8 x 2 = 1.875. gamma1 2 at 0.5, gamma2 3: a pass
// yields 1, 2, 3 tokens with 1/2, 1/4, 1/4; P(N = 1, 2, 3) = 1/4, 1/2, 1/4, E[N] = 2; the max of
// two: P(<= 1) = 1/16, P(<= 2) = 9/16: 1/16 + 2 x 8/16 + 3 x 7/16 = 2.375. Every draft kept: N is
// gamma2 / (gamma1 + 1) exactly, and the batch waits for nobody.
Test(offload, plan_batch_lockstep_by_hand) {
    tri__accept_table t;
    tri__accept_table_constant(&t, 0.5, 0.5);
    double mean;
    cr_assert_float_eq(tri__plan_lockstep(&t, 1, 2, 1, &mean), 1.0, 1e-12);
    cr_assert_float_eq(mean, 1.5, 1e-12);
    cr_assert_float_eq(tri__plan_lockstep(&t, 1, 2, 2, &mean), 1.75 / 1.5, 1e-12);
    cr_assert_float_eq(tri__plan_lockstep(&t, 1, 2, 3, NULL), 1.875 / 1.5, 1e-12);
    cr_assert_float_eq(tri__plan_lockstep(&t, 2, 3, 2, &mean), 2.375 / 2.0, 1e-12);
    cr_assert_float_eq(mean, 2.0, 1e-12);
    tri__accept_table_constant(&t, 1.0, 0.5);
    cr_assert_float_eq(tri__plan_lockstep(&t, 2, 12, 8, &mean), 1.0, 1e-12);
    cr_assert_float_eq(mean, 4.0, 1e-12);
}

// A batch of B Llama2-7B sequences of 19,456 tokens (TriForce's batch setting): each sequence's KV
// (16,384 bytes per token and layer in f16), retrieval cache and draft cache are its own; the
// weights are one copy. On a device that holds everything, B = 6 holds 6 x the KV and retrieval
// bytes, 5 x 16 MiB more draft caches, and emits 6 x the tokens per round with the lockstep's
// L2 passes. On one 24 GiB card, B = 2 streams both sequences' rows of every offloaded layer.
Test(offload, plan_batch_7b_19k) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    const uint64_t tok = 16384, n = 19456;
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = (int32_t)n;
    p.retrieval_budget = 4096;
    p.gpu_mem_bytes = (uint64_t)200 << 30;
    tri_plan one, six;
    cr_assert_eq(tri_plan_compute(&m, &p, &one), TRI_STATUS_OK, "%s", tri_last_error());
    p.n_batch = 6;
    cr_assert_eq(tri_plan_compute(&m, &p, &six), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&six);
    cr_assert_eq(one.params.n_batch, 1);
    cr_assert_eq(one.l2_lockstep, 1.0);
    cr_assert_eq(six.on_chip, 32);
    cr_assert_eq(six.kv_layer_bytes, 6 * tok * n);
    cr_assert_eq(six.gpu_kv_bytes, 32 * 6 * tok * n);
    cr_assert_eq(six.gpu_retrieval_bytes, 6 * one.gpu_retrieval_bytes);
    cr_assert_eq(six.gpu_draft_bytes - one.gpu_draft_bytes, 5 * ((uint64_t)16 << 20));
    cr_assert_eq(six.gpu_weight_bytes, one.gpu_weight_bytes, "one copy of the weights");
    tri__accept_table l1;
    tri__accept_table_constant(&l1, 0.7, 0.5);
    double lock = tri__plan_lockstep(&l1, 2, 12, 6, NULL);
    cr_assert(lock > 1.0);
    cr_assert_float_eq(six.l2_lockstep, lock, 1e-12);
    cr_assert_float_eq(six.l2_passes, one.l2_passes * lock, 1e-9);
    cr_assert_float_eq(six.tokens_per_round, 6 * one.tokens_per_round, 1e-9);
    cr_assert_float_eq(six.t_token, six.t_round / six.tokens_per_round, 1e-15);
    // the weights are read once per pass: six sequences' L2 pass costs less than two lone ones
    cr_assert(six.t_l2 > one.t_l2 && six.t_l2 < 2 * one.t_l2, "%g %g", six.t_l2, one.t_l2);
    // one 24 GiB card: every offloaded layer streams both sequences' rows
    p.gpu_mem_bytes = (uint64_t)24 << 30;
    p.n_batch = 2;
    tri_plan two;
    cr_assert_eq(tri_plan_compute(&m, &p, &two), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(two.n_weights_gpu, 32);
    cr_assert(two.n_kv_host > 0);
    cr_assert_eq(two.pcie_bytes_l3, (uint64_t)two.n_kv_host * 2 * tok * n);
    cr_assert_eq(two.host_kv_bytes, (uint64_t)two.n_kv_host * 2 * tok * n);
    // autoregressive: one token per sequence per pass
    p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
    p.n_batch = 4;
    tri_plan ar;
    cr_assert_eq(tri_plan_compute(&m, &p, &ar), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_float_eq(ar.tokens_per_round, 4.0, 1e-12);
    p.n_batch = -1;
    cr_assert_eq(tri_plan_compute(&m, &p, &ar), TRI_STATUS_INVALID_ARGUMENT);
}

// ---- planner: attending where the KV lives ----

// With host attention at 60 GB/s beside 25 GB/s of PCIe, each offloaded layer is split so both
// parts take the same time: 60 / 85 of its rows on the host. The one-GPU TriForce prediction for
// Llama2-7B-128K drops below half the paper's 0.312 s/token, the streamed-only figure stays.
Test(offload, plan_split_attention_7b_127k_one_gpu) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = CTX_127K;
    p.pcie_gbps = 25;
    tri_plan all, split;
    cr_assert_eq(tri_plan_compute(&m, &p, &all), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(all.kv_host_fraction, 0);
    cr_assert_eq(all.host_kv_read_bytes_l3, 0);
    cr_assert(fabs(all.t_token_streamed - all.t_token) < 1e-12);
    p.host_attn_gbps = 60;
    cr_assert_eq(tri_plan_compute(&m, &p, &split), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&split);
    cr_assert_eq(split.on_chip, all.on_chip);
    cr_assert(fabs(split.kv_host_fraction - 60.0 / 85.0) < 1e-9, "%g", split.kv_host_fraction);
    // the host reads its fraction of every offloaded layer; PCIe carries the rest
    double kv_off = (double)split.n_kv_host * (double)split.kv_layer_bytes;
    cr_assert(fabs((double)split.host_kv_read_bytes_l3 - kv_off * 60 / 85) < 1e-6 * kv_off);
    cr_assert(fabs((double)split.pcie_bytes_l3 - kv_off * 25 / 85) < 1e-6 * kv_off + split.n_kv_host);
    cr_assert(fabs(split.t_token_streamed - all.t_token) < 1e-12, "%g vs %g", split.t_token_streamed, all.t_token);
    cr_assert(split.t_token < 0.5 * 0.312, "split %g s/token, all streamed %g", split.t_token, all.t_token);
    cr_assert(split.t_token > kv_off * 25 / 85 / 25e9 / split.tokens_per_round, "above its PCIe floor");
    size_t need;
    char text[8192];
    cr_assert_eq(tri_plan_format(&split, text, sizeof text, &need), TRI_STATUS_OK);
    cr_assert(strstr(text, "host attention 60.0 GB/s") != NULL, "%s", text);
    // autoregressive: one query per pass, the same balance
    p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
    cr_assert_eq(tri_plan_compute(&m, &p, &split), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(split.kv_host_fraction > 0.7 && split.t_token < split.t_token_streamed);
    p.host_attn_gbps = -1;
    cr_assert_eq(tri_plan_compute(&m, &p, &split), TRI_STATUS_INVALID_ARGUMENT);
}

// Streamed weights share the link: the host takes a larger part of each layer whose block streams.
Test(offload, plan_split_attention_with_streamed_weights) {
    tri_model_config c = llama2_7b_128k();
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = CTX_127K;
    p.gpu_mem_bytes = (uint64_t)12 << 30;
    p.host_attn_gbps = 60;
    tri_plan pl;
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_OK, "%s", tri_last_error());
    check_consistent(&pl);
    cr_assert(pl.n_weights_host > 0);
    cr_assert(pl.kv_host_fraction > 60.0 / 85.0 && pl.kv_host_fraction <= 1, "%g", pl.kv_host_fraction);
    cr_assert(pl.t_token < pl.t_token_streamed);
}
