// fuzz-tokenizer.h - what the tokenizer fuzz targets do with a tokenizer that loaded: encode,
// decode and stream-decode fixed texts and the input's own bytes, and read every piece, so the
// tables the loader built are exercised too.
#ifndef TRI_FUZZ_TOKENIZER_H
#define TRI_FUZZ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer.h"

static void fuzz_tokenizer_text(const tri__tokenizer *t, const char *text, size_t len) {
    int32_t *ids;
    int64_t n;
    for (int special = 0; special < 2; special++) {
        if (tri__tokenizer_encode(t, text, len, special, special, &ids, &n)) continue;
        char *out;
        size_t out_len;
        if (!tri__tokenizer_decode(t, ids, n, special, &out, &out_len)) free(out);
        tri__detok d;
        tri__detok_init(&d, t, special);
        const char *s;
        size_t k;
        for (int64_t i = 0; i < n; i++) (void)tri__detok_push(&d, ids[i], &s, &k);
        (void)tri__detok_flush(&d, &s, &k);
        tri__detok_free(&d);
        free(ids);
    }
}

// Exercises t with fixed text and the fuzzer's input, then frees it.
static void fuzz_tokenizer_exercise(tri__tokenizer *t, const uint8_t *data, size_t size) {
    static const char text[] = "Hello  world's 123\n\n\t<|im_start|> x\xff\xc3 😀 日本";
    fuzz_tokenizer_text(t, text, sizeof text - 1);
    fuzz_tokenizer_text(t, (const char *)data, size < 4096 ? size : 4096);
    for (int32_t id = -1; id <= tri__tokenizer_n_vocab(t); id++) {
        size_t len;
        bool special;
        (void)tri__tokenizer_piece(t, id, &len, &special);
    }
    tri__tokenizer_free(t);
}

#endif  // TRI_FUZZ_TOKENIZER_H
