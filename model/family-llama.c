// family-llama.c - Llama (and what llama.cpp writes as "llama": Mistral's GGUF files).
//
// The reference family: RMSNorm, SwiGLU, no biases. llama.cpp's converter permutes the Q and K
// rows of its GGUF files so that rope pairs adjacent elements. A window in a GGUF file (a Mistral
// checkpoint, which llama.cpp labels llama) is masked; config.json's sliding_window is not, as
// transformers' LlamaModel never reads it. attention_bias adds q, k, v and o biases.
#include <stdio.h>

#include "error.h"
#include "family-window.h"
#include "family.h"
#include "gguf.h"
#include "hf-config.h"

static tri_status llama_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    cfg->sliding_window = 0;
    if (tri__hf_key_present(k, "sliding_window"))
        tri__log(TRI_LOG_LEVEL_INFO, "%s: field 'sliding_window': not masked, as transformers' llama does not",
                 k->path);
    return TRI_STATUS_OK;
}

static tri_status llama_gguf(const tri__gguf *g, const char *prefix, tri_model_config *cfg, tri__family_data *data) {
    // llama.cpp's llama architecture takes optional q, k, v and o biases (attention_bias checkpoints)
    data->attn_bias = tri__gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    return tri__family_gguf_window(g, prefix, cfg);
}

const tri__family tri__family_llama = {
    .name = "llama",
    .gguf_arch = "llama",
    .hf_model_type = "llama",
    .hf_arch = "LlamaForCausalLM",
    .act = TRI_ACT_SILU,
    .attn_bias_key = true,
    .gguf_layout = TRI_ROPE_LAYOUT_ADJACENT,
    .hf_config = llama_hf,
    .gguf_config = llama_gguf,
};

// ---- the window readers the masking families share ----

tri_status tri__family_hf_window(const tri__hf_keys *k, tri_model_config *cfg) {
    cfg->sliding_window = 0;
    return tri__hf_key_int(k, "sliding_window", false, 0, 1, &cfg->sliding_window);
}

tri_status tri__family_gguf_window(const tri__gguf *g, const char *prefix, tri_model_config *cfg) {
    char key[96];
    snprintf(key, sizeof key, "%sattention.sliding_window", prefix);
    cfg->sliding_window = 0;
    if (!tri__gguf_find(g, key)) return TRI_STATUS_OK;
    uint32_t w;
    TRI_TRY_STATUS(tri__gguf_get_u32(g, key, &w));
    if (w > INT32_MAX)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %u is beyond 2^31-1", tri__gguf_path(g), key, w);
    cfg->sliding_window = (int32_t)w;
    return TRI_STATUS_OK;
}
