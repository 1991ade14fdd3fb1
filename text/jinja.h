// jinja.h - a Jinja interpreter for chat templates (internal; docs/chat-templates.md): the subset
// of jinja2 that real chat templates use, set up as Hugging Face transformers sets jinja2 up
// (trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception and strftime_now).
#ifndef TRI_JINJA_H
#define TRI_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

struct json_object;

typedef struct tri__jinja tri__jinja;  // a parsed template

// Limits that keep untrusted template text from running away; 0 in a field: its default.
typedef struct tri__jinja_limits {
    uint64_t max_steps;  // statements and expression nodes evaluated (default 20 M)
    int max_depth;       // nesting of statements, expressions and macro calls (default 200)
    size_t max_output;   // bytes of output, also of each macro's or block's (default 16 MiB)
    size_t max_memory;   // bytes of values made while rendering (default 256 MiB)
} tri__jinja_limits;

// Parses template text (len bytes, any bytes). On failure returns BAD_FORMAT for a syntax error
// or UNSUPPORTED for a construct this interpreter does not run (a filter, test or tag jinja2 has
// and it lacks), with a message "line L, column C: ..." in err (errcap bytes, may be 0) and
// nothing logged, so that a caller with a fallback stays quiet. *out is freed with
// tri__jinja_free (NULL is a no-op).
tri_status tri__jinja_parse(const char *text, size_t len, tri__jinja **out, char *err, size_t errcap);
void tri__jinja_free(tri__jinja *t);

// Renders t with the variables of ctx (a JSON object: each key a variable, each value converted
// to Jinja's: objects to dicts, arrays to lists), now (seconds since the epoch, UTC) for
// strftime_now. *out (malloc'd, NUL-terminated) and *n_out get the text. Failures as jinja2's:
// INVALID_ARGUMENT when the template raises (raise_exception, an undefined variable's attribute,
// a type error), UNSUPPORTED for a method or operation not implemented here, BAD_FORMAT when a
// limit is hit, OUT_OF_MEMORY; the message in err names the line and column. limits may be NULL.
tri_status tri__jinja_render(const tri__jinja *t, struct json_object *ctx, int64_t now, const tri__jinja_limits *limits,
                             char **out, size_t *n_out, char *err, size_t errcap);

#endif  // TRI_JINJA_H
