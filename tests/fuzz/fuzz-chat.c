// fuzz-chat.c - libFuzzer target for chat templates: recognising arbitrary template text
// (tri__chat_detect, the default system message's unescaping) and rendering arbitrary messages
// with every format (tri__chat_render). A rendering must be the same whatever the buffer: the size
// query, an exact buffer and a short one (which fails, with the same length) agree.
//
// Input: byte 0 picks the format (0: the template's, else a named one) and add_generation_prompt;
// then the template text up to the first NUL; then messages separated by 0x1e, each a role byte
// (system, user, assistant, or another role) and its content.
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
    if (size < 1) return 0;
    const int pick = data[0] % TRI_CHAT_FORMAT_COUNT;
    const bool gen = data[0] & 0x80;
    const char *rest = (const char *)data + 1;
    size_t n_rest = size - 1;
    const char *nul = memchr(rest, 0, n_rest);
    size_t n_tmpl = nul ? (size_t)(nul - rest) : n_rest;

    tri__chat_spec spec;
    memset(&spec, 0, sizeof spec);
    tri_status st = tri__chat_detect(rest, n_tmpl, &spec);
    if (st == TRI_STATUS_OK) {
        TRI_ASSERT(spec.format > TRI_CHAT_FORMAT_AUTO && spec.format < TRI_CHAT_FORMAT_COUNT);
        TRI_ASSERT(!spec.default_system || strlen(spec.default_system) <= spec.default_system_len);
    } else {
        TRI_ASSERT(st == TRI_STATUS_UNSUPPORTED && spec.default_system == NULL);
    }
    if (pick != 0 || st != TRI_STATUS_OK) {  // a named format: the variant a named format has
        tri__chat_spec_clear(&spec);
        spec.format = (tri_chat_format)(pick ? pick : 1);
        spec.bos = data[0] & 0x40;
        spec.eos_space = data[0] & 0x20;
        spec.skip_empty_system = data[0] & 0x10;
        spec.gen_prompt_always = data[0] & 0x08;
    }

    // the messages, NUL-terminated copies
    tri_chat_message msgs[32];
    char *copies[32];
    size_t n = 0;
    if (nul) {
        static const char *const roles[] = {"system", "user", "assistant", "tool"};
        const char *p = nul + 1, *end = rest + n_rest;
        while (p < end && n < 32) {
            const char *sep = memchr(p, 0x1e, (size_t)(end - p));
            const char *stop = sep ? sep : end;
            size_t len = (size_t)(stop - p);
            const char *role = roles[len ? (uint8_t)p[0] % 4 : 1];
            copies[n] = malloc(len + 1);
            if (!copies[n]) break;
            if (len) memcpy(copies[n], p + 1, len - 1);
            copies[n][len ? len - 1 : 0] = 0;  // content stops at a NUL inside it
            msgs[n].role = role;
            msgs[n].content = copies[n];
            n++;
            p = sep ? sep + 1 : end;
        }
    }
    size_t need = 0, got = 0;
    st = tri__chat_render(&spec, "<s>", "</s>", msgs, n, gen, NULL, 0, &need);
    if (st == TRI_STATUS_OK) {
        char *buf = malloc(need + 1);
        if (buf) {
            TRI_ASSERT(tri__chat_render(&spec, "<s>", "</s>", msgs, n, gen, buf, need + 1, &got) == TRI_STATUS_OK);
            TRI_ASSERT(got == need && buf[need] == 0);
            if (need > 0) {
                char *small = malloc(need);
                if (small) {
                    size_t got2 = 0;
                    TRI_ASSERT(tri__chat_render(&spec, "<s>", "</s>", msgs, n, gen, small, need, &got2) ==
                               TRI_STATUS_INVALID_ARGUMENT);
                    TRI_ASSERT(got2 == need && small[need - 1] == 0 && memcmp(small, buf, need - 1) == 0);
                    free(small);
                }
            }
            // ChatML and Phi-3 write every user message's content unchanged
            if (spec.format == TRI_CHAT_FORMAT_CHATML || spec.format == TRI_CHAT_FORMAT_PHI3)
                for (size_t i = 0; i < n; i++)
                    if (strcmp(msgs[i].role, "user") == 0) TRI_ASSERT(strstr(buf, msgs[i].content) != NULL);
            free(buf);
        }
    } else {
        TRI_ASSERT(st == TRI_STATUS_INVALID_ARGUMENT || st == TRI_STATUS_OUT_OF_MEMORY);
    }
    for (size_t i = 0; i < n; i++) free(copies[i]);
    tri__chat_spec_clear(&spec);
    return 0;
}
