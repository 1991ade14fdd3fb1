// gguf-llama.c - the model config of a llama GGUF file, from its llama.* keys.
//
// Key names follow llama.cpp's conventions (gguf-py constants.py), prefixed with the
// architecture: "llama.embedding_length", "llama.rope.scaling.type", ...
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "family.h"
#include "gguf.h"

typedef struct llama_keys {
    const tri__gguf *g;
    const char *arch;  // the key prefix without its dot: "llama", "qwen2", ...
    char key[96];      // the key being read, arch + "." + suffix
} llama_keys;

static const char *key_of(llama_keys *k, const char *suffix) {
    snprintf(k->key, sizeof k->key, "%s.%s", k->arch, suffix);
    return k->key;
}

// An int32 in 1..INT32_MAX. When the key is absent: def if def > 0, else (def == 0: required)
// BAD_FORMAT naming the key.
static tri_status get_pos_i32(llama_keys *k, const char *suffix, int32_t def, int32_t *out) {
    const char *key = key_of(k, suffix);
    if (!tri__gguf_find(k->g, key)) {
        if (def > 0) {
            *out = def;
            return TRI_STATUS_OK;
        }
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': missing, required for %s",
                         tri__gguf_path(k->g), key, k->arch);
    }
    uint32_t v;
    tri_status st = tri__gguf_get_u32(k->g, key, &v);
    if (st) return st;
    if (v == 0 || v > INT32_MAX) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %" PRIu32 " is not in 1..2^31-1",
                         tri__gguf_path(k->g), key, v);
    }
    *out = (int32_t)v;
    return TRI_STATUS_OK;
}

// A finite float; def when absent, or BAD_FORMAT when absent and required.
static tri_status get_f32(llama_keys *k, const char *suffix, bool required, float def, float *out) {
    const char *key = key_of(k, suffix);
    if (!tri__gguf_find(k->g, key)) {
        if (!required) {
            *out = def;
            return TRI_STATUS_OK;
        }
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': missing, required for %s",
                         tri__gguf_path(k->g), key, k->arch);
    }
    tri_status st = tri__gguf_get_f32(k->g, key, out);
    if (st) return st;
    if (!isfinite(*out)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': value is not finite",
                         tri__gguf_path(k->g), key);
    }
    return TRI_STATUS_OK;
}

static tri_status require_positive(llama_keys *k, float v) {
    if (v > 0) return TRI_STATUS_OK;
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %g is not positive", tri__gguf_path(k->g),
                     k->key, (double)v);
}

static tri_status read_vocab(llama_keys *k, int32_t *n_vocab) {
    const tri__gguf *g = k->g;
    if (tri__gguf_find(g, key_of(k, "vocab_size"))) return get_pos_i32(k, "vocab_size", 0, n_vocab);
    const tri__gguf_value *tokens = tri__gguf_find(g, "tokenizer.ggml.tokens");
    if (tokens) {
        if (tokens->type != TRI_GGUF_TYPE_ARRAY || tokens->arr.n == 0 || tokens->arr.n > INT32_MAX) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: key 'tokenizer.ggml.tokens': not an array of 1..2^31-1 tokens",
                             tri__gguf_path(g));
        }
        *n_vocab = (int32_t)tokens->arr.n;
        return TRI_STATUS_OK;
    }
    const tri__gguf_tensor *embd = tri__gguf_find_tensor(g, "token_embd.weight");
    if (embd && embd->n_dims == 2 && embd->shape[0] <= INT32_MAX) {
        *n_vocab = (int32_t)embd->shape[0];
        return TRI_STATUS_OK;
    }
    return tri__fail(TRI_STATUS_BAD_FORMAT,
                     "%s: key '%s.vocab_size': missing, and neither tokenizer.ggml.tokens nor a "
                     "2-d token_embd.weight gives the vocabulary size",
                     tri__gguf_path(g), k->arch);
}

static tri_status read_head_dim(llama_keys *k, tri_model_config *cfg) {
    const tri__gguf *g = k->g;
    int32_t key_len = 0, rot = 0, val_len = 0;
    tri_status st;
    bool has_key_len = tri__gguf_find(g, key_of(k, "attention.key_length")) != NULL;
    bool has_rot = tri__gguf_find(g, key_of(k, "rope.dimension_count")) != NULL;
    bool has_val_len = tri__gguf_find(g, key_of(k, "attention.value_length")) != NULL;
    if (has_key_len && (st = get_pos_i32(k, "attention.key_length", 0, &key_len))) return st;
    if (has_rot && (st = get_pos_i32(k, "rope.dimension_count", 0, &rot))) return st;
    if (has_val_len && (st = get_pos_i32(k, "attention.value_length", 0, &val_len))) return st;

    if (has_key_len) {
        cfg->head_dim = key_len;
    } else if (has_rot) {
        cfg->head_dim = rot;
    } else {
        if (cfg->n_embd % cfg->n_head != 0) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: key '%s.embedding_length': %" PRId32
                             " is not divisible by %s.attention.head_count %" PRId32,
                             tri__gguf_path(g), k->arch, cfg->n_embd, k->arch, cfg->n_head);
        }
        cfg->head_dim = cfg->n_embd / cfg->n_head;
    }
    // Llama rotates the whole head and uses one head size for keys and values.
    if (has_rot && rot != cfg->head_dim) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: key '%s.rope.dimension_count': partial rotary (%" PRId32
                         " of %" PRId32 " dimensions) is not supported",
                         tri__gguf_path(g), k->arch, rot, cfg->head_dim);
    }
    if (has_val_len && val_len != cfg->head_dim) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: key '%s.attention.value_length': %" PRId32
                         " differs from the key length %" PRId32,
                         tri__gguf_path(g), k->arch, val_len, cfg->head_dim);
    }
    if (cfg->head_dim % 2 != 0) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s.attention.key_length': head size %"
                         PRId32 " is odd, rope needs pairs", tri__gguf_path(g), k->arch, cfg->head_dim);
    }
    return TRI_STATUS_OK;
}

static tri_status read_rope_scaling(llama_keys *k, tri_model_config *cfg) {
    const tri__gguf *g = k->g;
    tri_status st;
    cfg->rope_scaling = TRI_ROPE_SCALING_NONE;
    cfg->rope_factor = 1.0f;
    cfg->rope_orig_ctx = 0;
    cfg->yarn_beta_fast = 32.0f;
    cfg->yarn_beta_slow = 1.0f;
    cfg->yarn_mscale = 0.0f;

    const char *factor_suffix = "rope.scaling.factor";
    const char *type_key = key_of(k, "rope.scaling.type");
    if (tri__gguf_find(g, type_key)) {
        tri__gguf_str type;
        if ((st = tri__gguf_get_str(g, type_key, &type))) return st;
        if (tri__gguf_str_eq(type, "none")) {
            return TRI_STATUS_OK;
        } else if (tri__gguf_str_eq(type, "linear")) {
            cfg->rope_scaling = TRI_ROPE_SCALING_LINEAR;
        } else if (tri__gguf_str_eq(type, "yarn")) {
            cfg->rope_scaling = TRI_ROPE_SCALING_YARN;
        } else {
            char shown[64];
            int n = type.len < 48 ? (int)type.len : 48;
            snprintf(shown, sizeof shown, "%.*s%s", n, type.ptr, type.len > 48 ? "..." : "");
            for (char *p = shown; *p; p++) {
                if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
            }
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: key '%s.rope.scaling.type': '%s' is not supported (none, "
                             "linear, yarn are)",
                             tri__gguf_path(g), k->arch, shown);
        }
    } else if (tri__gguf_find(g, key_of(k, "rope.scale_linear"))) {
        // Files from before rope.scaling.type carry only this linear factor.
        factor_suffix = "rope.scale_linear";
        cfg->rope_scaling = TRI_ROPE_SCALING_LINEAR;
    } else {
        return TRI_STATUS_OK;
    }

    if ((st = get_f32(k, factor_suffix, true, 1.0f, &cfg->rope_factor))) return st;
    if ((st = require_positive(k, cfg->rope_factor))) return st;
    // Absent: llama.cpp's default (n_ctx_orig_yarn = n_ctx_train) for YaRN, which needs it for
    // its ramp; linear scaling does not use it and keeps 0, as config.json's does.
    if (cfg->rope_scaling == TRI_ROPE_SCALING_YARN ||
        tri__gguf_find(g, key_of(k, "rope.scaling.original_context_length"))) {
        if ((st = get_pos_i32(k, "rope.scaling.original_context_length", cfg->n_ctx_train,
                              &cfg->rope_orig_ctx))) {
            return st;
        }
    }

    // rope.scaling.attn_factor (llama.cpp: hparams.rope_attn_factor, default 1) multiplies cos
    // and sin. With YaRN, ggml's rope multiplies them by 0.1 ln(factor) + 1 as well (rope_yarn's
    // mscale; for factor <= 1 llama.cpp cancels it), so the whole YaRN attention factor is
    // attn_factor * get_mscale(factor) -- unlike transformers' attention_factor, which replaces
    // get_mscale. Absent, yarn_mscale stays 0, which stands for get_mscale(factor).
    bool has_attn = tri__gguf_find(g, key_of(k, "rope.scaling.attn_factor")) != NULL;
    float attn = 1.0f;
    if ((st = get_f32(k, "rope.scaling.attn_factor", false, 1.0f, &attn))) return st;
    if ((st = require_positive(k, attn))) return st;
    if (cfg->rope_scaling != TRI_ROPE_SCALING_YARN) {
        // nothing in the config carries a factor for other scalings
        if (attn == 1.0f) return TRI_STATUS_OK;
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: key '%s.rope.scaling.attn_factor': %g with linear scaling is not "
                         "supported (1 is)",
                         tri__gguf_path(g), k->arch, (double)attn);
    }
    if (has_attn) {
        double factor = (double)cfg->rope_factor;
        double mscale = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
        cfg->yarn_mscale = (float)((double)attn * mscale);
    }
    if ((st = get_f32(k, "rope.scaling.yarn_beta_fast", false, 32.0f, &cfg->yarn_beta_fast))) return st;
    if ((st = require_positive(k, cfg->yarn_beta_fast))) return st;
    if ((st = get_f32(k, "rope.scaling.yarn_beta_slow", false, 1.0f, &cfg->yarn_beta_slow))) return st;
    if ((st = require_positive(k, cfg->yarn_beta_slow))) return st;
    return TRI_STATUS_OK;
}

tri_status tri__gguf_llama_config(const tri__gguf *g, tri_model_config *cfg) {
    tri__family_data data = {0};
    tri_status st = tri__gguf_family_config(g, cfg, NULL, &data);
    tri__family_data_free(&data);
    return st;
}

tri_status tri__gguf_family_config(const tri__gguf *g, tri_model_config *cfg, const tri__family **fam_out,
                                   tri__family_data *data) {
    const char *path = tri__gguf_path(g);
    const tri__family *fam;
    tri__gguf_str arch;
    tri_status st;
    if (!tri__gguf_find(g, "general.architecture")) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'general.architecture': missing", path);
    }
    if ((st = tri__gguf_get_str(g, "general.architecture", &arch))) return st;
    if (!(fam = tri__family_by_gguf_arch(arch.ptr, arch.len))) {
        char shown[64];
        int n = arch.len < 48 ? (int)arch.len : 48;
        snprintf(shown, sizeof shown, "%.*s%s", n, arch.ptr, arch.len > 48 ? "..." : "");
        for (char *p = shown; *p; p++) {
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
        }
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: key 'general.architecture': architecture '%s' is not supported (%s are)",
                         path, shown, tri__family_list(true));
    }

    tri_model_config c;
    memset(&c, 0, sizeof c);
    llama_keys k = {.g = g, .arch = fam->gguf_arch};
    // llama.cpp writes Mixtral as llama with experts: refused by its key, not by a missing tensor
    uint32_t experts = 0;
    if (tri__gguf_find(g, key_of(&k, "expert_count")) && (st = tri__gguf_get_u32(g, k.key, &experts))) return st;
    if (experts > 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: key '%s': %u experts: a mixture of experts is unsupported", path,
                         k.key, experts);
    if ((st = get_pos_i32(&k, "embedding_length", 0, &c.n_embd))) return st;
    if ((st = get_pos_i32(&k, "feed_forward_length", 0, &c.n_ff))) return st;
    if ((st = get_pos_i32(&k, "block_count", 0, &c.n_layer))) return st;
    if ((st = get_pos_i32(&k, "attention.head_count", 0, &c.n_head))) return st;
    if ((st = get_pos_i32(&k, "attention.head_count_kv", c.n_head, &c.n_head_kv))) return st;
    if (c.n_head % c.n_head_kv != 0) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: key '%s.attention.head_count_kv': %" PRId32
                         " does not divide %s.attention.head_count %" PRId32,
                         path, k.arch, c.n_head_kv, k.arch, c.n_head);
    }
    if ((st = read_head_dim(&k, &c))) return st;
    if ((st = get_pos_i32(&k, "context_length", 0, &c.n_ctx_train))) return st;
    if ((st = read_vocab(&k, &c.n_vocab))) return st;
    if ((st = get_f32(&k, "attention.layer_norm_rms_epsilon", true, 0.0f, &c.rms_eps))) return st;
    if ((st = require_positive(&k, c.rms_eps))) return st;
    if ((st = get_f32(&k, "rope.freq_base", false, 10000.0f, &c.rope_theta))) return st;
    if ((st = require_positive(&k, c.rope_theta))) return st;
    if ((st = read_rope_scaling(&k, &c))) return st;

    c.tied_embeddings = tri__gguf_find_tensor(g, "output.weight") == NULL;
    c.has_rope_freqs = tri__gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    c.rope_layout = fam->gguf_layout;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", fam->gguf_arch);
    if (fam->gguf_config && (st = fam->gguf_config(g, prefix, &c, data))) return st;
    if (fam_out) *fam_out = fam;
    *cfg = c;
    return TRI_STATUS_OK;
}
