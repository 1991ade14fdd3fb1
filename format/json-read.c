// json-read.c - strict JSON parsing with json-c, with messages that say where parsing stopped.
#include "file.h"
#include "json-read.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

#define JSON_MAX_DEPTH 64

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Line and column (both from 1) of byte offset off in text.
static void line_col(const char *text, size_t off, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

tri_status tri__json_parse(const char *what, const char *text, size_t len, struct json_object **out) {
    *out = NULL;
    if (len > (size_t)INT_MAX) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: JSON text of %zu bytes is too large", what, len);
    }
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        size_t off = (size_t)(nul - text), line, col;
        line_col(text, off, &line, &col);
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: malformed JSON at byte %zu (line %zu, column %zu): NUL byte", what,
                         off, line, col);
    }
    json_tokener *tok = json_tokener_new_ex(JSON_MAX_DEPTH);
    if (!tok) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate a JSON parser", what);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *obj = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (end > len) end = len;  // never trust a count from elsewhere with an index
    const char *reason = NULL;
    if (jerr == json_tokener_continue) {
        reason = "unexpected end of text";
    } else if (jerr != json_tokener_success) {
        reason = json_tokener_error_desc(jerr);
    } else if (!obj) {
        // "null" parses to NULL with success; no reader accepts a bare null
        reason = "the text is null, not an object";
    } else {
        while (end < len && is_json_space(text[end])) end++;
        if (end < len) reason = "text after the JSON value";
    }
    if (reason) {
        json_object_put(obj);
        size_t line, col;
        line_col(text, end, &line, &col);
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: malformed JSON at byte %zu (line %zu, column %zu): %s", what, end,
                         line, col, reason);
    }
    *out = obj;
    return TRI_STATUS_OK;
}

tri_status tri__json_read_file(const char *path, size_t max_bytes, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    tri_status st;
    int fd;
    uint64_t size;
    if ((st = tri__file_open(path, &fd, &size))) return st;
    if (size > max_bytes) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %llu bytes, more than the limit of %zu", path,
                       (unsigned long long)size, max_bytes);
        goto fail_fd;
    }
    size_t n = (size_t)size;
    char *buf = malloc(n + 1);
    if (!buf) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", path, n + 1);
        goto fail_fd;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = tri__fail(TRI_STATUS_IO, "%s: read failed: %s", path, strerror(errno));
            goto fail_buf;
        }
        if (r == 0) {
            st = tri__fail(TRI_STATUS_IO, "%s: file shrank while being read", path);
            goto fail_buf;
        }
        got += (size_t)r;
    }
    buf[n] = '\0';
    tri__file_close(path, fd);
    *text = buf;
    *len = n;
    return TRI_STATUS_OK;

fail_buf:
    free(buf);
fail_fd:
    tri__file_close(path, fd);
    return st;
}
