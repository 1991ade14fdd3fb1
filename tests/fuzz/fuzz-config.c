// fuzz-config.c - libFuzzer target for config.json (tri__hf_config_parse) and the HF tensor-name
// mapping. A config that parses must be of a known family and internally consistent.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "family.h"
#include "hf-config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A config parses only as one of the families the runtime computes (docs/formats.md).
static bool known_family(const char *name) {
    for (size_t i = 0; i < tri__family_count(); i++)
        if (strcmp(tri__family_at(i)->name, name) == 0) return true;
    return false;
}

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    tri_model_config cfg;
    char *arch = NULL;
    if (tri__hf_config_parse("fuzz.json", (const char *)data, size, &cfg, &arch) == TRI_STATUS_OK) {
        TRI_ASSERT(arch && known_family(arch));
        TRI_ASSERT(cfg.n_vocab > 0 && cfg.n_embd > 0 && cfg.n_ff > 0 && cfg.n_layer > 0);
        TRI_ASSERT(cfg.n_head > 0 && cfg.n_head_kv > 0 && cfg.n_head % cfg.n_head_kv == 0);
        TRI_ASSERT(cfg.head_dim > 0 && cfg.head_dim % 2 == 0 && cfg.n_ctx_train > 0);
        TRI_ASSERT(cfg.rms_eps > 0 && cfg.rope_theta > 0 && cfg.rope_factor > 0);
        free(arch);
    } else {
        TRI_ASSERT(arch == NULL);
    }

    // the same bytes as a tensor name, into a buffer that is sometimes too small
    char name[256], out[64];
    size_t n = size < sizeof name - 1 ? size : sizeof name - 1;
    memcpy(name, data, n);
    name[n] = '\0';
    size_t out_size = size > 0 ? data[0] % sizeof out : 0;
    if (tri__hf_tensor_name_to_gguf(name, out, out_size)) {
        TRI_ASSERT(strlen(out) < out_size);
        TRI_ASSERT(strncmp(out, "blk.", 4) == 0 || strcmp(out, "token_embd.weight") == 0 ||
                   strcmp(out, "output_norm.weight") == 0 || strcmp(out, "output.weight") == 0);
    }
    return 0;
}
