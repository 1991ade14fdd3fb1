// family-mistral.c - Mistral: Llama with sliding-window attention.
//
// A query at position p attends to keys at p - sliding_window + 1 .. p (transformers' mask: key j
// is excluded when j <= p - sliding_window). llama.cpp writes Mistral's GGUF files as "llama"
// (family-llama.c reads the window there when the file carries llama.attention.sliding_window).
#include "error.h"
#include "family-window.h"
#include "family.h"
#include "hf-config.h"

// transformers' MistralConfig: a config.json without the key gets 4096 (Mistral-7B-v0.1's window);
// null means none (v0.2 and later).
#define MISTRAL_DEFAULT_WINDOW 4096

static tri_status mistral_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    if (!tri__hf_key_written(k, "sliding_window")) {
        cfg->sliding_window = MISTRAL_DEFAULT_WINDOW;
        return TRI_STATUS_OK;
    }
    return tri__family_hf_window(k, cfg);
}

const tri__family tri__family_mistral = {
    .name = "mistral",
    .gguf_arch = NULL,
    .hf_model_type = "mistral",
    .hf_arch = "MistralForCausalLM",
    .act = TRI_ACT_SILU,
    .gguf_layout = TRI_ROPE_LAYOUT_ADJACENT,
    .hf_config = mistral_hf,
};
