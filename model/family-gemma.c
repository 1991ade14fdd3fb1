// family-gemma.c - Gemma (1): GeGLU with tanh GELU, embeddings scaled by sqrt(n_embd),
// RMSNorm by (1 + w), a head tied unless tie_word_embeddings is false (then lm_head.weight is
// read, as transformers does), head_dim independent of n_embd / n_head (256 in the 2B and 7B).
//
// transformers computes (1 + w) in f32 and the scale as sqrt(hidden_size) rounded to the
// activations' dtype; llama.cpp's converter stores 1 + w in GGUF, so only HF weights get the 1
// added at load. Gemma-2 (soft-capping, alternating windows, four norms per block) is another
// model type and is refused.
#include <string.h>

#include "error.h"
#include "family.h"
#include "hf-config.h"

// transformers' GemmaConfig: head_dim 256 when config.json does not say (both published sizes).
#define GEMMA_DEFAULT_HEAD_DIM 256

static tri_status gemma_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    if (!tri__hf_key_present(k, "head_dim")) cfg->head_dim = GEMMA_DEFAULT_HEAD_DIM;
    // transformers 4.44: hidden_activation, or gelu_pytorch_tanh when it is null (hidden_act is
    // ignored with a warning)
    const char *act;
    TRI_TRY_STATUS(tri__hf_key_str(k, "hidden_activation", &act));
    if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'hidden_activation': '%.64s' is unsupported (gelu_pytorch_tanh is)", k->path, act);
    return TRI_STATUS_OK;
}

const tri__family tri__family_gemma = {
    .name = "gemma",
    .gguf_arch = "gemma",
    .hf_model_type = "gemma",
    .hf_arch = "GemmaForCausalLM",
    .act = TRI_ACT_GELU_TANH,
    .norm_plus_one = true,
    .attn_bias_key = true,
    .embd_scale = true,
    .tied_default = true,
    .gguf_layout = TRI_ROPE_LAYOUT_HALF,
    .hf_config = gemma_hf,
};
