// fuzz-jinja.c - libFuzzer target for the Jinja interpreter of chat templates: parsing arbitrary
// template text and rendering it over an arbitrary JSON context, under small limits, so that a
// template that loops or recurses forever ends at a limit rather than a timeout. Whatever the
// input: no crash, no leak, a status among those jinja.h names, and a message when it fails.
//
// Input: the template text up to the first NUL; after it a JSON object, the context (when it does
// not parse, a fixed conversation is used).
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fallback[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"reasoning_content\": \"greet\", \"tool_calls\":"
    " [{\"id\": \"abc123XYZ\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\":"
    " \"f\", \"parameters\": {}}}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    size_t n_tmpl = nul ? (size_t)(nul - text) : size;
    char err[256];
    tri__jinja *t = NULL;
    tri_status st = tri__jinja_parse(text, n_tmpl, &t, err, sizeof err);
    if (st) {
        TRI_ASSERT(!t && err[0]);
        TRI_ASSERT(st == TRI_STATUS_BAD_FORMAT || st == TRI_STATUS_UNSUPPORTED);
        return 0;
    }
    struct json_object *ctx = NULL;
    if (nul) {
        struct json_tokener *tok = json_tokener_new();
        ctx = json_tokener_parse_ex(tok, nul + 1, (int)(size - n_tmpl - 1));
        json_tokener_free(tok);
        if (ctx && !json_object_is_type(ctx, json_type_object)) json_object_put(ctx), ctx = NULL;
    }
    if (!ctx) ctx = json_tokener_parse(fallback);
    tri__jinja_limits lim = {.max_steps = 200000, .max_depth = 100, .max_output = 1 << 20, .max_memory = 64 << 20};
    char *out = NULL;
    size_t n = 0;
    st = tri__jinja_render(t, ctx, 1721952000, &lim, &out, &n, err, sizeof err);
    if (st == TRI_STATUS_OK) {
        TRI_ASSERT(out && strlen(out) <= n && n <= lim.max_output);
    } else {
        TRI_ASSERT(!out && err[0]);
        TRI_ASSERT(st == TRI_STATUS_BAD_FORMAT || st == TRI_STATUS_UNSUPPORTED || st == TRI_STATUS_INVALID_ARGUMENT ||
                   st == TRI_STATUS_OUT_OF_MEMORY);
    }
    free(out);
    json_object_put(ctx);
    tri__jinja_free(t);
    return 0;
}
