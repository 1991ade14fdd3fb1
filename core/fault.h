// fault.h - fault injection for the reliability tests (internal; docs/reliability.md).
//
// A test arms a countdown over some kinds of call; the Nth call of those kinds (1-based, counted
// from the arming) fails as the real call fails when it runs out of memory or hits a disk error,
// and, in PERSIST mode, every later one too. Library code reaches the hook in two ways:
//   - allocations of the host malloc family, strdup and mmap: in a build with fault injection
//     (meson -Dfault_injection, on by default in sanitizer builds) every library source is
//     compiled with fault-wrap.h force-included, whose macros route those calls through the
//     tri__fault_* wrappers below; the published library of an ordinary build has no wrapper;
//   - sites where the failure is not an allocation of libc's (disk-tier reads, io_uring set-up,
//     cudaMalloc / cudaHostAlloc / cudaHostRegister) ask tri__fault_hit() themselves. Unarmed it
//     costs one relaxed atomic load.
// Counting is process-wide and thread-safe; OpenMP workers count too.
#ifndef TRI_FAULT_H
#define TRI_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

// What a countdown counts, as a bit set.
typedef enum tri__fault_kind {
    TRI__FAULT_ALLOC = 1u << 0,   // malloc, calloc, realloc, aligned_alloc, posix_memalign, strdup
    TRI__FAULT_MMAP = 1u << 1,    // mmap: mapped model files, the pinned arena's regions
    TRI__FAULT_DEVICE = 1u << 2,  // device and pinned allocations of a GPU backend
    TRI__FAULT_READ = 1u << 3,    // reads of the disk tier (pread or io_uring completions)
    TRI__FAULT_URING = 1u << 4,   // io_uring_queue_init: io_uring unavailable
} tri__fault_kind;

// How a failed read fails.
typedef enum tri__fault_read_mode {
    TRI__FAULT_READ_EIO = 0,    // -1 with errno EIO (a completion with res -EIO)
    TRI__FAULT_READ_SHORT = 1,  // half the bytes asked for (at least 0), as at the end of a file
} tri__fault_read_mode;

// Arms the countdown: the nth call (>= 1) of the kinds in the set `kinds` fails; with persist,
// every call after it too. nth == 0 counts without failing. Resets the counters.
void tri__fault_arm(unsigned kinds, int64_t nth, bool persist, tri__fault_read_mode read_mode);
// Stops counting and failing.
void tri__fault_disarm(void);
// Calls of the armed kinds since tri__fault_arm, and how many of them were made to fail.
int64_t tri__fault_calls(void);
int64_t tri__fault_failures(void);
// Whether this build routes the library's allocations through the wrappers (fault-wrap.h).
bool tri__fault_wrapped(void);

// Counts one call of kind; true when it must fail. Cheap when nothing is armed.
bool tri__fault_hit(unsigned kind);
// For a read of `want` bytes that would have returned `got` (>= 0): what it returns under the
// armed read fault, got when this read is not failed; -1 with errno EIO, or a short count: half
// of want rounded down to a multiple of align (O_DIRECT reads stay aligned), at most got.
ssize_t tri__fault_read_result(ssize_t got, size_t want, size_t align);

// ---- the wrappers fault-wrap.h routes the library's calls through ----
void *tri__fault_malloc(size_t n);
void *tri__fault_calloc(size_t n, size_t size);
void *tri__fault_realloc(void *p, size_t n);
void *tri__fault_aligned_alloc(size_t align, size_t n);
int tri__fault_posix_memalign(void **out, size_t align, size_t n);
char *tri__fault_strdup(const char *s);
char *tri__fault_strndup(const char *s, size_t n);
void *tri__fault_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

#ifdef __cplusplus
}
#endif

#endif  // TRI_FAULT_H
