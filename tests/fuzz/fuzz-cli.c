// fuzz-cli.c - libFuzzer target for the command-line parsers of offload-run: --tokens id lists,
// --draft-layers ranges, whole and real numbers (generate and plan), sizes ("24G", "1.5TiB") and
// --device. The CLI's own sources are compiled into this file so that their static parsers are
// reached directly. Whatever a parser accepts must be what its help promises.
//
// Input: byte 0 picks the parser, the rest is the argument (made NUL-terminated).
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../cli/cli-common.c"
#include "../../cli/cli-sampling.c"  // generate's sampling options
#include "../../cli/cli-engine.c"    // generate's engine options, shared with serve
#include "../../cli/cli-generate.c"
#include "../../cli/cli-generate-batch.c"  // generate with several prompts
#define usage plan_usage  // cli-plan.c's statics beside cli-generate.c's
#include "../../cli/cli-plan.c"
#undef usage

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *s = malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    switch (data[0] % 8) {
    case 0: {  // --tokens: ids in [0, n_vocab), as many as the commas say
        const int32_t n_vocab = 1000 + data[0];
        int32_t n = 0;
        int32_t *ids = parse_ids(s, n_vocab, &n);
        if (ids) {
            int32_t commas = 0;
            for (const char *p = s; *p; p++) commas += *p == ',';
            if (n != commas + 1) abort();
            for (int32_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= n_vocab) abort();
        }
        free(ids);
        break;
    }
    case 1: {  // --draft-layers: strictly increasing, non-negative layer numbers
        int32_t n = 0;
        int32_t *v = tri_cli_parse_layers("fuzz", "--draft-layers", s, &n);
        if (v) {
            if (n < 1) abort();
            for (int32_t i = 0; i < n; i++)
                if (v[i] < 0 || (i > 0 && v[i] <= v[i - 1])) abort();
        }
        free(v);
        break;
    }
    case 2: {
        long v;
        if (tri_cli_parse_long("fuzz", "--fuzz", s, -5, 1L << 40, &v) && (v < -5 || v > 1L << 40)) abort();
        break;
    }
    case 3: {
        float v;
        if (tri_cli_parse_float("fuzz", "--fuzz", s, 0.0, 2.0, &v) && !(v >= 0.0f && v <= 2.0f)) abort();
        break;
    }
    case 4: {
        int32_t v;
        if (parse_int("--fuzz", s, &v) && v < 0) abort();
        break;
    }
    case 5: {
        double v;
        if (parse_real("--fuzz", s, &v) && !(v >= 0)) abort();
        break;
    }
    case 6: {
        uint64_t v;
        (void)tri_cli_parse_size(s, &v);
        break;
    }
    case 7: {
        tri_session_params sp = tri_session_default_params();
        if (tri_cli_parse_device("fuzz", s, &sp) && sp.device_kind == TRI_DEVICE_CUDA &&
            (sp.device < 0 || sp.device > 1024))
            abort();
        break;
    }
    }
    free(s);
    return 0;
}
