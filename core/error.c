// error.c - thread-local last error, the log callback, status strings.
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char last_error[1024];

static tri_log_fn log_fn;
static void *log_user;
static tri_log_level log_max = TRI_LOG_LEVEL_WARN;

const char *tri_version(void) { return TRI_VERSION_STRING; }

const char *tri_status_str(tri_status status) {
    switch (status) {
    case TRI_STATUS_OK: return "ok";
    case TRI_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case TRI_STATUS_IO: return "i/o error";
    case TRI_STATUS_BAD_FORMAT: return "bad format";
    case TRI_STATUS_UNSUPPORTED: return "unsupported";
    case TRI_STATUS_OUT_OF_MEMORY: return "out of memory";
    case TRI_STATUS_DEVICE: return "device error";
    case TRI_STATUS_DEVICE_OUT_OF_MEMORY: return "device out of memory";
    case TRI_STATUS_NOT_FOUND: return "not found";
    case TRI_STATUS_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *tri_last_error(void) { return last_error; }

void tri_log_set(tri_log_fn fn, void *user, tri_log_level max_level) {
    log_fn = fn;
    log_user = user;
    log_max = max_level;
}

static void log_emit(tri_log_level level, const char *msg) {
    if (log_fn) {
        log_fn(level, msg, log_user);
        return;
    }
    static const char *const tags[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "triforce: %s: %s\n", tags[level], msg);
}

void tri__vlog(tri_log_level level, const char *fmt, va_list ap) {
    if (level > log_max) return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    log_emit(level, buf);
}

void tri__log(tri_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tri__vlog(level, fmt, ap);
    va_end(ap);
}

tri_status tri__vfail(tri_status status, const char *fmt, va_list ap) {
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    // Errors reach the caller through the status and tri_last_error(); the log sees them at
    // debug level only, so a caller that reports errors itself does not print them twice.
    if (log_max >= TRI_LOG_LEVEL_DEBUG) log_emit(TRI_LOG_LEVEL_DEBUG, last_error);
    return status;
}

tri_status tri__fail(tri_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tri_status st = tri__vfail(status, fmt, ap);
    va_end(ap);
    return st;
}

void tri__assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "triforce: %s:%d: internal invariant broken: %s\n", file, line, expr);
    abort();
}
