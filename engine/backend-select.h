// backend-select.h - opening the backend a session asks for (internal).
#ifndef TRI_BACKEND_SELECT_H
#define TRI_BACKEND_SELECT_H

#include <stdint.h>

#include "backend.h"
#include "triforce.h"

// Opens the backend for (kind, device): AUTO is CUDA device 0 when tri_device_count() > 0 and its
// first kernel runs (a GPU that no SASS or PTX of the module fits: the CPU, with a warning in the
// log saying why), else the CPU with n_threads threads (<= 0: every core). TRI_STATUS_DEVICE for
// a CUDA device that does not exist or a build without CUDA, naming the device. *name_out (may
// be NULL) receives "cpu" or "cuda:N" in a buffer of at least 16 bytes. On a CUDA device it also binds the calling
// thread and OpenMP's workers to the device's NUMA node (tri__backend_bind_host_threads).
tri_status tri__backend_select(tri_device_kind kind, int32_t device, int32_t n_threads, tri__backend **out,
                               char *name_out);
// Tests only: when set, the CPU backends tri__backend_select opens come from here (the test suite
// runs whole sessions on a CPU backend with a transfer stream, tests/async-backend.h). NULL: the
// CPU backend.
extern tri_status (*tri__backend_cpu_factory)(int32_t n_threads, tri__backend **out);

#endif  // TRI_BACKEND_SELECT_H
