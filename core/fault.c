// fault.c - the fault-injection countdown and the wrappers of fault.h.
#include "fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// This file calls the real functions: undo fault-wrap.h's renaming for it.
#undef malloc
#undef calloc
#undef realloc
#undef aligned_alloc
#undef posix_memalign
#undef strdup
#undef strndup
#undef mmap

static atomic_uint fault_kinds;      // armed kinds; 0: nothing counted (the fast path)
static atomic_llong fault_calls;     // calls of those kinds since the arming
static atomic_llong fault_failures;  // of them, failed
static int64_t fault_nth;            // the call that fails first; 0: count only
static bool fault_persist;           // every call after it fails too
static tri__fault_read_mode fault_read_mode;

void tri__fault_arm(unsigned kinds, int64_t nth, bool persist, tri__fault_read_mode read_mode) {
    atomic_store(&fault_kinds, 0u);
    fault_nth = nth;
    fault_persist = persist;
    fault_read_mode = read_mode;
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_failures, 0);
    atomic_store(&fault_kinds, kinds);
}

void tri__fault_disarm(void) { atomic_store(&fault_kinds, 0u); }

int64_t tri__fault_calls(void) { return atomic_load(&fault_calls); }
int64_t tri__fault_failures(void) { return atomic_load(&fault_failures); }

bool tri__fault_wrapped(void) {
#ifdef TRI_FAULT_INJECTION
    return true;
#else
    return false;
#endif
}

bool tri__fault_hit(unsigned kind) {
    if (__builtin_expect((atomic_load_explicit(&fault_kinds, memory_order_relaxed) & kind) == 0, 1)) return false;
    int64_t k = atomic_fetch_add(&fault_calls, 1) + 1;
    if (fault_nth <= 0 || k < fault_nth || (k > fault_nth && !fault_persist)) return false;
    atomic_fetch_add(&fault_failures, 1);
    return true;
}

ssize_t tri__fault_read_result(ssize_t got, size_t want, size_t align) {
    if (got < 0 || !tri__fault_hit(TRI__FAULT_READ)) return got;
    if (fault_read_mode == TRI__FAULT_READ_SHORT) {
        size_t half = want / 2 / align * align;  // 0: too small to come up short but for EOF
        return half == 0 || got < (ssize_t)half ? got : (ssize_t)half;
    }
    errno = EIO;
    return -1;
}

// ---- wrappers ----

void *tri__fault_malloc(size_t n) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;
    return malloc(n);
}

void *tri__fault_calloc(size_t n, size_t size) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;
    return calloc(n, size);
}

void *tri__fault_realloc(void *p, size_t n) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;  // p stays valid, as in realloc
    return realloc(p, n);
}

void *tri__fault_aligned_alloc(size_t align, size_t n) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;
    return aligned_alloc(align, n);
}

int tri__fault_posix_memalign(void **out, size_t align, size_t n) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return ENOMEM;
    return posix_memalign(out, align, n);
}

char *tri__fault_strdup(const char *s) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;
    return strdup(s);
}

char *tri__fault_strndup(const char *s, size_t n) {
    if (tri__fault_hit(TRI__FAULT_ALLOC)) return errno = ENOMEM, NULL;
    return strndup(s, n);
}

void *tri__fault_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (tri__fault_hit(TRI__FAULT_MMAP)) return errno = ENOMEM, MAP_FAILED;
    return mmap(addr, len, prot, flags, fd, off);
}
