// family-gemma2.c - Gemma 2: Gemma with soft-capped attention and logits, a sliding window on
// every other layer, four norms a block and the scores scaled by query_pre_attn_scalar.
//
// transformers' Gemma2 (4.51): every attention score s, scaled by query_pre_attn_scalar^-1/2
// (not head_dim^-1/2), becomes cap * tanh(s / cap) before the mask and the softmax (cap
// attn_logit_softcapping, 50), and so does every logit of the head (final_logit_softcapping, 30);
// layers 0, 2, 4, ... attend over a sliding window of sliding_window positions (4096), the odd
// ones globally; the attention's output goes through post_attention_layernorm and the FFN's
// through post_feedforward_layernorm before their residuals, the FFN's input through
// pre_feedforward_layernorm; norms by (1 + w), GeGLU with tanh GELU, embeddings times sqrt(n_embd),
// tied head by default, as Gemma. llama.cpp's "gemma2" GGUF files store the norms as 1 + w and
// carry the caps and the window as gemma2.{attn,final}_logit_softcapping and
// gemma2.attention.sliding_window (llama.cpp's defaults 50, 30 and 4096 when absent); they carry
// no query_pre_attn_scalar: llama.cpp scales by head_dim^-1/2, or by (n_embd / n_head)^-1/2 for
// the 46-layer 27B, unless gemma2.attention.scale says (read here too).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "family.h"
#include "gguf.h"
#include "hf-config.h"

// transformers' Gemma2Config and llama.cpp's defaults
#define GEMMA2_DEFAULT_HEAD_DIM 256
#define GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR 256
#define GEMMA2_DEFAULT_WINDOW 4096
#define GEMMA2_DEFAULT_ATTN_SOFTCAP 50.0f
#define GEMMA2_DEFAULT_FINAL_SOFTCAP 30.0f

// A soft-cap key: absent -> def, null -> 0 (none), else a number > 0.
static tri_status hf_cap(const tri__hf_keys *k, const char *key, float def, float *out) {
    if (!tri__hf_key_written(k, key)) {
        *out = def;
        return TRI_STATUS_OK;
    }
    return tri__hf_key_float(k, key, false, 0, true, out);
}

static tri_status gemma2_hf(const tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data) {
    if (!tri__hf_key_present(k, "head_dim")) cfg->head_dim = GEMMA2_DEFAULT_HEAD_DIM;
    const char *act;
    TRI_TRY_STATUS(tri__hf_key_str(k, "hidden_activation", &act));
    if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'hidden_activation': '%.64s' is unsupported (gelu_pytorch_tanh is)", k->path, act);
    float qpas;
    TRI_TRY_STATUS(
        tri__hf_key_float(k, "query_pre_attn_scalar", false, GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR, true, &qpas));
    data->q_scale = (float)sqrt((double)cfg->head_dim / (double)qpas);
    TRI_TRY_STATUS(hf_cap(k, "attn_logit_softcapping", GEMMA2_DEFAULT_ATTN_SOFTCAP, &data->attn_softcap));
    TRI_TRY_STATUS(hf_cap(k, "final_logit_softcapping", GEMMA2_DEFAULT_FINAL_SOFTCAP, &data->final_softcap));
    // absent: 4096; null: none
    cfg->sliding_window = GEMMA2_DEFAULT_WINDOW;
    if (tri__hf_key_written(k, "sliding_window"))
        TRI_TRY_STATUS(tri__hf_key_int(k, "sliding_window", false, 0, 1, &cfg->sliding_window));
    return TRI_STATUS_OK;
}

// An optional f32 key: absent -> def; else a finite number >= 0 (0: none).
static tri_status gguf_cap(const tri__gguf *g, const char *key, float def, float *out) {
    *out = def;
    if (!tri__gguf_find(g, key)) return TRI_STATUS_OK;
    TRI_TRY_STATUS(tri__gguf_get_f32(g, key, out));
    if (!(*out >= 0) || !isfinite(*out))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %g is not a finite number >= 0", tri__gguf_path(g), key,
                         (double)*out);
    return TRI_STATUS_OK;
}

static tri_status gemma2_gguf(const tri__gguf *g, const char *prefix, tri_model_config *cfg, tri__family_data *data) {
    char key[96];
    snprintf(key, sizeof key, "%sattn_logit_softcapping", prefix);
    TRI_TRY_STATUS(gguf_cap(g, key, GEMMA2_DEFAULT_ATTN_SOFTCAP, &data->attn_softcap));
    snprintf(key, sizeof key, "%sfinal_logit_softcapping", prefix);
    TRI_TRY_STATUS(gguf_cap(g, key, GEMMA2_DEFAULT_FINAL_SOFTCAP, &data->final_softcap));
    snprintf(key, sizeof key, "%sattention.sliding_window", prefix);
    cfg->sliding_window = GEMMA2_DEFAULT_WINDOW;
    if (tri__gguf_find(g, key)) {
        uint32_t w;
        TRI_TRY_STATUS(tri__gguf_get_u32(g, key, &w));
        if (w > INT32_MAX)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %u is beyond 2^31-1", tri__gguf_path(g), key, w);
        cfg->sliding_window = (int32_t)w;
    }
    // the scores' scale: the key, else llama.cpp's rule (27B: (n_embd / n_head)^-1/2)
    double scale = 1.0 / sqrt((double)(cfg->n_layer == 46 ? cfg->n_embd / cfg->n_head : cfg->head_dim));
    snprintf(key, sizeof key, "%sattention.scale", prefix);
    if (tri__gguf_find(g, key)) {
        float s;
        TRI_TRY_STATUS(tri__gguf_get_f32(g, key, &s));
        if (!(s > 0) || !isfinite(s))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %g is not a positive finite number",
                             tri__gguf_path(g), key, (double)s);
        scale = s;
    }
    data->q_scale = (float)(scale * sqrt((double)cfg->head_dim));
    return TRI_STATUS_OK;
}

const tri__family tri__family_gemma2 = {
    .name = "gemma2",
    .gguf_arch = "gemma2",
    .hf_model_type = "gemma2",
    .hf_arch = "Gemma2ForCausalLM",
    .act = TRI_ACT_GELU_TANH,
    .norm_plus_one = true,
    .attn_bias_key = true,
    .embd_scale = true,
    .tied_default = true,
    .softcap = true,
    .window_period = 2,
    .post_norms = true,
    .gguf_layout = TRI_ROPE_LAYOUT_HALF,
    .hf_config = gemma2_hf,
    .gguf_config = gemma2_gguf,
};
