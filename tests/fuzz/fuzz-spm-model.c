// fuzz-spm-model.c - libFuzzer target for the SentencePiece tokenizer.model reader: the input is
// parsed as a ModelProto and, when it loads, exercised (fuzz-tokenizer.h).
#include "fuzz-tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri__tokenizer *t = NULL;
    if (tri__tokenizer_from_spm_buf(data, size, "fuzz.model", &t)) return 0;
    fuzz_tokenizer_exercise(t, data, size);
    return 0;
}
