// family-qwen2.c - Qwen2 and Qwen2.5: Llama with biases on the q, k and v projections.
//
// llama.cpp's "qwen2" GGUF files keep the HF row order (rope pairs i and i + head_dim / 2). The
// sliding window some configs describe is refused when in use (use_sliding_window): it is not
// masked here.
#include <stdio.h>

#include "error.h"
#include "family.h"
#include "gguf.h"
#include "hf-config.h"

static tri_status qwen2_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    (void)data;
    (void)cfg;
    bool use;
    TRI_TRY_STATUS(tri__hf_key_bool(k, "use_sliding_window", false, &use));
    if (use)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'use_sliding_window': true: sliding-window attention is unsupported for qwen2",
                         k->path);
    return TRI_STATUS_OK;
}

static tri_status qwen2_gguf(const tri__gguf *g, const char *prefix, tri_model_config *cfg, tri__family_data *data) {
    (void)cfg;
    (void)data;
    char key[96];
    snprintf(key, sizeof key, "%sattention.sliding_window", prefix);
    uint32_t w = 0;
    if (tri__gguf_find(g, key)) TRI_TRY_STATUS(tri__gguf_get_u32(g, key, &w));
    if (w)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: key '%s': %u: sliding-window attention is unsupported for qwen2",
                         tri__gguf_path(g), key, w);
    return TRI_STATUS_OK;
}

const tri__family tri__family_qwen2 = {
    .name = "qwen2",
    .gguf_arch = "qwen2",
    .hf_model_type = "qwen2",
    .hf_arch = "Qwen2ForCausalLM",
    .act = TRI_ACT_SILU,
    .qkv_bias = true,
    .gguf_layout = TRI_ROPE_LAYOUT_HALF,
    .hf_config = qwen2_hf,
    .gguf_config = qwen2_gguf,
};
