// fuzz-tokenizer-config.c - libFuzzer target for an HF checkpoint's tokenizer_config.json
// (tri__chat_from_tokenizer_config): its chat template, string or list of named templates, and
// its bos_token / eos_token, strings or objects with "content". A template that comes out is then
// recognised and, when it is of a known format, renders a short conversation.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    char *tmpl = NULL, *bos = NULL, *eos = NULL;
    tri_status st = tri__chat_from_tokenizer_config("fuzz.json", (const char *)data, size, &tmpl, &bos, &eos);
    if (st != TRI_STATUS_OK) {
        TRI_ASSERT(st == TRI_STATUS_BAD_FORMAT || st == TRI_STATUS_OUT_OF_MEMORY);
        TRI_ASSERT(!tmpl && !bos && !eos);
        return 0;
    }
    if (tmpl) {
        tri__chat_spec spec;
        if (tri__chat_detect(tmpl, strlen(tmpl), &spec) == TRI_STATUS_OK) {
            const tri_chat_message msgs[] = {{"system", "s"}, {"user", "u"}, {"assistant", " a "}, {"user", "v"}};
            size_t need = 0;
            char buf[512];
            tri_status r = tri__chat_render(&spec, bos, eos, msgs, 4, true, buf, sizeof buf, &need);
            TRI_ASSERT(r == TRI_STATUS_OK || r == TRI_STATUS_INVALID_ARGUMENT);
            tri__chat_spec_clear(&spec);
        }
    }
    free(tmpl);
    free(bos);
    free(eos);
    return 0;
}
