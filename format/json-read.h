// json-read.h - strict JSON parsing with json-c for the file readers (internal).
#ifndef TRI_JSON_READ_H
#define TRI_JSON_READ_H

#include <stddef.h>

#include "triforce.h"

struct json_object;

// Largest JSON file (config.json, an index) read into memory: 100 MB, the limit the safetensors
// format puts on its own header.
#define TRI_JSON_MAX_BYTES ((size_t)100 * 1000 * 1000)

// Parses text[0, len) as exactly one JSON value (strict mode, UTF-8 validated, nesting at most 64
// deep); only whitespace may follow it. NUL bytes are rejected because json-c stops at them.
// BAD_FORMAT on failure, the message naming `what` (a file path), json-c's reason and the byte
// offset, line and column where parsing stopped. *out is owned by the caller (json_object_put).
tri_status tri__json_parse(const char *what, const char *text, size_t len, struct json_object **out);

// Reads a whole file of at most max_bytes into a NUL-terminated malloc'd buffer (*len excludes
// the NUL). IO when it cannot be read, BAD_FORMAT when it is larger than max_bytes.
tri_status tri__json_read_file(const char *path, size_t max_bytes, char **text, size_t *len);

#endif  // TRI_JSON_READ_H
