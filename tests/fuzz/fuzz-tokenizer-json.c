// fuzz-tokenizer-json.c - libFuzzer target for the tokenizer.json loader: the input is parsed as a
// tokenizer.json and, when it loads, exercised (fuzz-tokenizer.h).
#include "fuzz-tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri__tokenizer *t = NULL;
    if (tri__tokenizer_from_json_buf((const char *)data, size, "fuzz.json", &t)) return 0;
    fuzz_tokenizer_exercise(t, data, size);
    return 0;
}
