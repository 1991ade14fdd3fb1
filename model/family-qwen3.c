// family-qwen3.c - Qwen3 (dense): Llama with an RMSNorm of every query and key head before rope.
//
// transformers' Qwen3Attention normalizes each head's q and k over head_dim with its own weights
// (self_attn.q_norm, self_attn.k_norm; llama.cpp's attn_q_norm, attn_k_norm), then rotates them.
// head_dim is explicit (128 when config.json does not say, as Qwen3Config), independent of
// hidden_size / heads (Qwen3-0.6B: 16 heads of 128 over 1024). There are no q, k, v biases unless
// attention_bias says so (then q, k, v and o, as transformers reads it); the head is untied unless
// tie_word_embeddings (the 0.6B to 4B sizes tie it). YaRN comes from rope_scaling through the
// common reader. The sliding window of Qwen3Config is refused when in use (use_sliding_window),
// as for qwen2. llama.cpp's "qwen3" GGUF files keep the HF row order (rope pairs i and
// i + head_dim / 2).
#include <stdio.h>

#include "error.h"
#include "family.h"
#include "gguf.h"
#include "hf-config.h"

// transformers' Qwen3Config: head_dim 128 when config.json does not say.
#define QWEN3_DEFAULT_HEAD_DIM 128

static tri_status qwen3_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    if (!tri__hf_key_present(k, "head_dim")) cfg->head_dim = QWEN3_DEFAULT_HEAD_DIM;
    bool use;
    TRI_TRY_STATUS(tri__hf_key_bool(k, "use_sliding_window", false, &use));
    if (use)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'use_sliding_window': true: sliding-window attention is unsupported for qwen3",
                         k->path);
    return TRI_STATUS_OK;
}

static tri_status qwen3_gguf(const tri__gguf *g, const char *prefix, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    (void)cfg;
    char key[96];
    snprintf(key, sizeof key, "%sattention.sliding_window", prefix);
    uint32_t w = 0;
    if (tri__gguf_find(g, key)) TRI_TRY_STATUS(tri__gguf_get_u32(g, key, &w));
    if (w)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: key '%s': %u: sliding-window attention is unsupported for qwen3",
                         tri__gguf_path(g), key, w);
    return TRI_STATUS_OK;
}

const tri__family tri__family_qwen3 = {
    .name = "qwen3",
    .gguf_arch = "qwen3",
    .hf_model_type = "qwen3",
    .hf_arch = "Qwen3ForCausalLM",
    .act = TRI_ACT_SILU,
    .qk_norm = true,
    .attn_bias_key = true,
    .gguf_layout = TRI_ROPE_LAYOUT_HALF,
    .hf_config = qwen3_hf,
    .gguf_config = qwen3_gguf,
};
