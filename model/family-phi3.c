// family-phi3.c - Phi-3 and Phi-3.5 (mini, medium): fused qkv and gate_up matrices, LongRoPE.
//
// LongRoPE ("longrope", older "su"): pair i's frequency is theta^(-2i / head_dim) / factor[i],
// with the short factors while a forward call's last position is below
// original_max_position_embeddings and the long ones past it (transformers 4.44's
// Phi3LongRoPEScaledRotaryEmbedding; keys already cached keep their rotation), and cos and sin
// multiplied by sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original, when
// s > 1. llama.cpp's GGUF carries the factors as rope_factors_{short,long}.weight and that factor
// as rope.scaling.attn_factor. transformers masks no sliding window for Phi-3 outside
// flash-attention (Phi-3-mini-4k's 2047), and neither do we: the field is ignored, as there.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "family.h"
#include "gguf.h"
#include "hf-config.h"

static tri_status phi3_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    if (tri__hf_key_present(k, "sliding_window"))
        tri__log(TRI_LOG_LEVEL_INFO, "%s: field 'sliding_window': not masked, as transformers' phi3 does not", k->path);
    if (!tri__hf_key_present(k, "rope_scaling")) return TRI_STATUS_OK;
    tri__hf_keys rs;
    TRI_TRY_STATUS(tri__hf_key_object(k, "rope_scaling", "rope_scaling.", &rs));
    const char *type, *key = "type";
    TRI_TRY_STATUS(tri__hf_key_str(&rs, "type", &type));
    if (!type) {
        key = "rope_type";
        TRI_TRY_STATUS(tri__hf_key_str(&rs, "rope_type", &type));
    }
    if (!type || (strcmp(type, "longrope") != 0 && strcmp(type, "su") != 0))
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'rope_scaling.%s': rope scaling '%.64s' is unsupported for phi3 (longrope, su are)",
                         k->path, key, type ? type : "(missing)");
    int32_t orig;
    TRI_TRY_STATUS(tri__hf_key_int(k, "original_max_position_embeddings", true, 0, 2, &orig));
    int32_t n = cfg->head_dim / 2;
    TRI_TRY_STATUS(tri__hf_key_floats(&rs, "short_factor", n, &data->rope_short));
    TRI_TRY_STATUS(tri__hf_key_floats(&rs, "long_factor", n, &data->rope_long));
    double s = (double)cfg->n_ctx_train / orig;
    cfg->rope_scaling = TRI_ROPE_SCALING_LONGROPE;
    cfg->rope_orig_ctx = orig;
    cfg->rope_factor = (float)s;
    cfg->rope_attn_factor = s <= 1 ? 1.0f : (float)sqrt(1 + log(s) / log((double)orig));
    return TRI_STATUS_OK;
}

static tri_status phi3_gguf(const tri__gguf *g, const char *prefix, tri_model_config *cfg, tri__family_data *data) {
    const tri__gguf_tensor *lf = tri__gguf_find_tensor(g, "rope_factors_long.weight");
    const tri__gguf_tensor *sf = tri__gguf_find_tensor(g, "rope_factors_short.weight");
    if (!lf && !sf) return TRI_STATUS_OK;
    int32_t n = cfg->head_dim / 2;
    TRI_TRY_STATUS(tri__family_gguf_factors(g, "rope_factors_short.weight", n, &data->rope_short));
    TRI_TRY_STATUS(tri__family_gguf_factors(g, "rope_factors_long.weight", n, &data->rope_long));
    char key[96];
    snprintf(key, sizeof key, "%srope.scaling.original_context_length", prefix);
    uint32_t orig;
    if (!tri__gguf_find(g, key))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': missing, required with LongRoPE factors",
                         tri__gguf_path(g), key);
    TRI_TRY_STATUS(tri__gguf_get_u32(g, key, &orig));
    if (orig < 2 || orig > INT32_MAX)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %u is not in 2..2^31-1", tri__gguf_path(g), key, orig);
    double s = (double)cfg->n_ctx_train / orig;
    float attn = s <= 1 ? 1.0f : (float)sqrt(1 + log(s) / log((double)orig));
    snprintf(key, sizeof key, "%srope.scaling.attn_factor", prefix);
    if (tri__gguf_find(g, key)) {
        TRI_TRY_STATUS(tri__gguf_get_f32(g, key, &attn));
        if (!(attn > 0) || !isfinite(attn))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %g is not a positive finite number",
                             tri__gguf_path(g), key, (double)attn);
    }
    cfg->rope_scaling = TRI_ROPE_SCALING_LONGROPE;
    cfg->rope_orig_ctx = (int32_t)orig;
    cfg->rope_factor = (float)s;
    cfg->rope_attn_factor = attn;
    return TRI_STATUS_OK;
}

const tri__family tri__family_phi3 = {
    .name = "phi3",
    .gguf_arch = "phi3",
    .hf_model_type = "phi3",
    .hf_arch = "Phi3ForCausalLM",
    .act = TRI_ACT_SILU,
    .fused_qkv = true,
    .fused_gate_up = true,
    .gguf_layout = TRI_ROPE_LAYOUT_HALF,
    .hf_config = phi3_hf,
    .gguf_config = phi3_gguf,
};
