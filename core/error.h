// error.h - status messages and logging shared by every module (internal).
#ifndef TRI_ERROR_H
#define TRI_ERROR_H

#include <stdarg.h>

#include "triforce.h"

#if defined(__GNUC__) || defined(__clang__)
#define TRI__PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define TRI__PRINTF(fmt_idx, arg_idx)
#endif

#ifdef __cplusplus  // included from the .cu files of backends/cuda/
#define TRI__NORETURN [[noreturn]]
#else
#define TRI__NORETURN _Noreturn
#endif

// Records a failure: formats the message into this thread's last-error buffer, logs it at debug
// level (the caller reports it; the log would print it twice) and returns status, so call sites read `return tri__fail(TRI_STATUS_BAD_FORMAT, ...)`.
// Messages name the file, the field and the problem: "m.gguf: tensor 'x': offset past end".
tri_status tri__fail(tri_status status, const char *fmt, ...) TRI__PRINTF(2, 3);

// Logs one line; cheap when the level is filtered out.
void tri__log(tri_log_level level, const char *fmt, ...) TRI__PRINTF(2, 3);

// The same with a va_list (the CUDA module reaches the library's through these).
tri_status tri__vfail(tri_status status, const char *fmt, va_list ap) TRI__PRINTF(2, 0);
void tri__vlog(tri_log_level level, const char *fmt, va_list ap) TRI__PRINTF(2, 0);

// Aborts with file and line for a broken internal invariant; never for bad input.
#define TRI_ASSERT(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) tri__assert_fail(__FILE__, __LINE__, #cond);                          \
    } while (0)
TRI__NORETURN void tri__assert_fail(const char *file, int line, const char *expr);

// Returns the status of call from the enclosing function when it is not TRI_STATUS_OK.
#define TRY(call)                                  \
    do {                                           \
        tri_status try_st_ = (call);               \
        if (try_st_ != TRI_STATUS_OK) return try_st_; \
    } while (0)

#endif  // TRI_ERROR_H
