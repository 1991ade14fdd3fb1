// fuzz-tokenize.c - libFuzzer target for tokenizer encode of arbitrary bytes and decode of
// arbitrary ids, over one tokenizer of each kind and source: SentencePiece from a GGUF, from a
// tokenizer.model and from a tokenizer.json; byte-level BPE from a GGUF (Llama-3) and from
// tokenizer.json files (GPT-2, SmolLM2). The tokenizers are loaded once from the committed seed
// corpora (TRI_FUZZ_DIR); the loaders themselves are fuzzed by fuzz-gguf, fuzz-spm-model and
// fuzz-tokenizer-json.
//
// Input: byte 0 picks the tokenizer, byte 1 the operation and flags, the rest is the payload:
// text to encode (then its ids decoded back, in one call and streamed), or little-endian int32
// ids to decode (arbitrary: negative and past the vocabulary too, which must be refused).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

enum { N_TOK = 6 };
static tri__tokenizer *toks[N_TOK];
static bool all_bytes[N_TOK];  // a byte-level BPE whose vocabulary has a token for every byte
static tri__gguf *ggufs[2];

static void load_all(void) {
    static const char *const json[] = {"corpus-tokenizer-json/spm.json", "corpus-tokenizer-json/gpt2.json",
                                       "corpus-tokenizer-json/smollm.json"};
    static const char *const gg[] = {"corpus-gguf/seed-tokenizer-spm.gguf", "corpus-gguf/seed-tokenizer-bpe-llama3.gguf"};
    char path[4096];
    int k = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", TRI_FUZZ_DIR, json[i]);
        if (tri__tokenizer_from_json_file(path, &toks[k++])) goto fail;
    }
    snprintf(path, sizeof path, "%s/corpus-spm-model/bpe-1200.model", TRI_FUZZ_DIR);
    if (tri__tokenizer_from_spm_file(path, &toks[k++])) goto fail;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", TRI_FUZZ_DIR, gg[i]);
        if (tri__gguf_open(path, &ggufs[i]) || tri__tokenizer_from_gguf(ggufs[i], &toks[k++])) goto fail;
    }
    // the seed tokenizer.json files are small: only those with every byte round-trip any text
    for (k = 0; k < N_TOK; k++) {
        all_bytes[k] = tri__tokenizer_kind(toks[k]) == TRI_TOKENIZER_BPE;
        for (int b = 0; all_bytes[k] && b < 256; b++) {
            char c = (char)b, *out = NULL;
            int32_t *ids = NULL;
            int64_t n = 0;
            size_t len = 0;
            all_bytes[k] = !tri__tokenizer_encode(toks[k], &c, 1, false, false, &ids, &n) &&
                           !tri__tokenizer_decode(toks[k], ids, n, true, &out, &len) && len == 1 && out[0] == c;
            free(ids);
            free(out);
        }
    }
    return;
fail:
    fprintf(stderr, "fuzz-tokenize: %s\n", tri_last_error());
    abort();
}

// Decodes ids in one call and streamed; both must give the same bytes when every id is valid.
static void decode_both(const tri__tokenizer *t, const int32_t *ids, int64_t n, bool special) {
    char *out = NULL;
    size_t out_len = 0;
    tri_status st = tri__tokenizer_decode(t, ids, n, special, &out, &out_len);
    bool valid = true;
    for (int64_t i = 0; i < n; i++) valid &= ids[i] >= 0 && ids[i] < tri__tokenizer_n_vocab(t);
    TRI_ASSERT(valid ? st == TRI_STATUS_OK : st == TRI_STATUS_INVALID_ARGUMENT);
    if (st == TRI_STATUS_OK) TRI_ASSERT(out && out[out_len] == '\0');
    tri__detok d;
    tri__detok_init(&d, t, special);
    const char *s;
    size_t k;
    for (int64_t i = 0; i < n; i++) {
        tri_status ps = tri__detok_push(&d, ids[i], &s, &k);
        TRI_ASSERT((ps == TRI_STATUS_OK) == (ids[i] >= 0 && ids[i] < tri__tokenizer_n_vocab(t)));
    }
    TRI_ASSERT(tri__detok_flush(&d, &s, &k) == TRI_STATUS_OK);
    tri__detok_free(&d);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    if (!toks[0]) load_all();
    if (size < 2) return 0;
    const int k = data[0] % N_TOK;
    const tri__tokenizer *t = toks[k];
    const uint8_t op = data[1];
    const bool special = op & 2, parse = op & 4;
    data += 2, size -= 2;
    if (op & 1) {  // decode arbitrary ids
        int64_t n = (int64_t)(size / 4);
        int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        if (!ids) return 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 | (uint32_t)data[4 * i + 2] << 16 |
                         (uint32_t)data[4 * i + 3] << 24;
            // mostly ids in and around the vocabulary, sometimes any int32
            ids[i] = op & 8 ? (int32_t)v : (int32_t)(v % (uint32_t)(tri__tokenizer_n_vocab(t) + 2)) - 1;
        }
        decode_both(t, ids, n, special);
        free(ids);
        return 0;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    tri_status st = tri__tokenizer_encode(t, (const char *)data, size, special, parse, &ids, &n);
    TRI_ASSERT(st == TRI_STATUS_OK);  // any bytes encode: invalid UTF-8 becomes byte tokens
    for (int64_t i = 0; i < n; i++) TRI_ASSERT(ids[i] >= 0 && ids[i] < tri__tokenizer_n_vocab(t));
    decode_both(t, ids, n, special);
    if (!special && !parse && all_bytes[k]) {
        // byte-level BPE with every byte in its vocabulary round-trips every byte string
        // (docs/tokenizers.md): with no control token parsed, the ids decode to the input exactly
        char *out = NULL;
        size_t out_len = 0;
        TRI_ASSERT(tri__tokenizer_decode(t, ids, n, true, &out, &out_len) == TRI_STATUS_OK);
        TRI_ASSERT(out_len == size && memcmp(out, data, size) == 0);
        free(out);
    }
    free(ids);
    return 0;
}
