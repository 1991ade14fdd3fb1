// fault-wrap.h - force-included (-include) into every library source of a build with fault
// injection (meson -Dfault_injection): routes the library's own allocations and mmaps through the
// counting wrappers of fault.h. Never included by hand.
#ifndef TRI_FAULT_WRAP_H
#define TRI_FAULT_WRAP_H

// The real declarations first, so that the macros below rename only the calls that follow.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fault.h"

#define malloc(n) tri__fault_malloc(n)
#define calloc(n, size) tri__fault_calloc(n, size)
#define realloc(p, n) tri__fault_realloc(p, n)
#define aligned_alloc(align, n) tri__fault_aligned_alloc(align, n)
#define posix_memalign(out, align, n) tri__fault_posix_memalign(out, align, n)
#define strdup(s) tri__fault_strdup(s)
#define strndup(s, n) tri__fault_strndup(s, n)
#define mmap(addr, len, prot, flags, fd, off) tri__fault_mmap(addr, len, prot, flags, fd, off)

#endif  // TRI_FAULT_WRAP_H
