// hf-config.c - transformers' config.json for Llama-family models, and HF tensor names.
//
// Keys, defaults and rope scaling semantics follow transformers' LlamaConfig and its
// rope-initialisation functions (modeling_rope_utils); docs/formats.md lists them.
#include "hf-config.h"

#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "family.h"
#include "json-read.h"

// ---- typed getters ----
//
// Each names the file (path) and the key (prefix + key, e.g. "rope_scaling.factor") when it fails.
// A key that is absent or JSON null takes the default when not required.

typedef tri__hf_keys cfg_ctx;

// The value of key, or NULL when absent or null.
static json_object *cfg_get(const cfg_ctx *c, const char *key) {
    json_object *v = NULL;
    if (!json_object_object_get_ex(c->obj, key, &v)) return NULL;
    return v;  // NULL for a JSON null
}

static tri_status cfg_missing(const cfg_ctx *c, const char *key) {
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': missing", c->path, c->prefix, key);
}

// An integer in [min, INT32_MAX].
static tri_status cfg_int(const cfg_ctx *c, const char *key, bool required, int32_t def,
                          int32_t min, int32_t *out) {
    json_object *v = cfg_get(c, key);
    if (!v) {
        if (required) return cfg_missing(c, key);
        *out = def;
        return TRI_STATUS_OK;
    }
    if (!json_object_is_type(v, json_type_int)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not an integer", c->path,
                         c->prefix, key);
    }
    int64_t x = json_object_get_int64(v);  // json-c clamps beyond int64, still out of range below
    if (x < min || x > INT32_MAX) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': %lld is out of range [%d, %d]",
                         c->path, c->prefix, key, (long long)x, (int)min, (int)INT32_MAX);
    }
    *out = (int32_t)x;
    return TRI_STATUS_OK;
}

// A finite number (integer or not), > 0 when positive is set, that fits a float.
static tri_status cfg_float(const cfg_ctx *c, const char *key, bool required, float def,
                            bool positive, float *out) {
    json_object *v = cfg_get(c, key);
    if (!v) {
        if (required) return cfg_missing(c, key);
        *out = def;
        return TRI_STATUS_OK;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not a number", c->path, c->prefix,
                         key);
    }
    double x = json_object_get_double(v);
    if (!isfinite(x) || fabs(x) > (double)3.0e38f) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not a finite float", c->path,
                         c->prefix, key);
    }
    // checked after the conversion: 1e-85 is > 0 but 0 as a float
    if (positive && !((float)x > 0)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': %g is not > 0 as a float",
                         c->path, c->prefix, key, x);
    }
    *out = (float)x;
    return TRI_STATUS_OK;
}

static tri_status cfg_bool(const cfg_ctx *c, const char *key, bool def, bool *out) {
    json_object *v = cfg_get(c, key);
    if (!v) {
        *out = def;
        return TRI_STATUS_OK;
    }
    if (!json_object_is_type(v, json_type_boolean)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not a boolean", c->path, c->prefix,
                         key);
    }
    *out = json_object_get_boolean(v);
    return TRI_STATUS_OK;
}

// A string or NULL when absent.
static tri_status cfg_str(const cfg_ctx *c, const char *key, const char **out) {
    json_object *v = cfg_get(c, key);
    *out = NULL;
    if (!v) return TRI_STATUS_OK;
    if (!json_object_is_type(v, json_type_string)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not a string", c->path, c->prefix,
                         key);
    }
    *out = json_object_get_string(v);
    return TRI_STATUS_OK;
}

// ---- architecture ----

// The family named by "architectures" (any entry a family knows) or else by "model_type".
static tri_status check_arch(const cfg_ctx *c, const tri__family **fam) {
    json_object *archs = cfg_get(c, "architectures");
    const char *model_type;
    TRY(cfg_str(c, "model_type", &model_type));
    const char *first_arch = NULL;
    if (archs) {
        if (!json_object_is_type(archs, json_type_array)) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'architectures': not an array", c->path);
        }
        size_t n = json_object_array_length(archs);
        for (size_t i = 0; i < n; i++) {
            json_object *a = json_object_array_get_idx(archs, i);
            if (!json_object_is_type(a, json_type_string)) {
                return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'architectures': entry %zu is not a string",
                                 c->path, i);
            }
            const char *s = json_object_get_string(a);
            if ((*fam = tri__family_by_hf_arch(s))) return TRI_STATUS_OK;
            if (!first_arch) first_arch = s;
        }
    }
    if (model_type && (*fam = tri__family_by_hf_model_type(model_type))) return TRI_STATUS_OK;
    // the near relatives of the families here, named with what they compute that we do not
    static const struct {
        const char *arch, *model_type, *what;
    } relatives[] = {
        {"Gemma3ForCausalLM", "gemma3_text", "Gemma 3: QK-norm, two rope bases, 5 local : 1 global layers"},
        {"MixtralForCausalLM", "mixtral", "Mixtral: a mixture of experts"},
        {"Qwen2MoeForCausalLM", "qwen2_moe", "Qwen2-MoE: a mixture of experts"},
        {"PhimoeForCausalLM", "phimoe", "Phi-3.5-MoE: a mixture of experts"},
    };
    const char *what = "";
    for (size_t i = 0; i < sizeof relatives / sizeof relatives[0]; i++)
        if ((first_arch && strcmp(first_arch, relatives[i].arch) == 0) ||
            (model_type && strcmp(model_type, relatives[i].model_type) == 0))
            what = relatives[i].what;
    if (first_arch) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'architectures': '%.100s' is unsupported%s%s (model types %s are)", c->path,
                         first_arch, *what ? ", " : "", what, tri__family_list(false));
    }
    if (model_type) {
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field 'model_type': '%.100s' is unsupported%s%s (%s are)",
                         c->path, model_type, *what ? ", " : "", what, tri__family_list(false));
    }
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'architectures': missing, and so is 'model_type'",
                     c->path);
}

// Keys of features no family here computes: present and not null/false/0, the model is refused.
static tri_status refuse_features(const cfg_ctx *c, const tri__family *fam) {
    static const struct {
        const char *key, *feature;
    } keys[] = {
        {"attn_logit_softcapping", "attention logit soft-capping (gemma2 reads it)"},
        {"final_logit_softcapping", "final logit soft-capping (gemma2 reads it)"},
        {"num_local_experts", "mixture of experts"},
        {"num_experts", "mixture of experts"},
        {"partial_rotary_factor", "partial rotary embeddings"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_object *v = cfg_get(c, keys[i].key);
        if (!v || (fam->softcap && strstr(keys[i].key, "softcapping"))) continue;  // the family's own
        if (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v)) continue;
        if ((json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) &&
            json_object_get_double(v) == (strcmp(keys[i].key, "partial_rotary_factor") == 0 ? 1.0 : 0.0))
            continue;
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field '%s': %s is unsupported", c->path, keys[i].key,
                         keys[i].feature);
    }
    // GPTQ, AWQ, bitsandbytes, FP8 ...: weights that need the scales this runtime does not read
    json_object *q = cfg_get(c, "quantization_config");
    if (q) {
        json_object *method = NULL;
        const char *name = json_object_is_type(q, json_type_object) &&
                                   json_object_object_get_ex(q, "quant_method", &method) &&
                                   json_object_is_type(method, json_type_string)
                               ? json_object_get_string(method)
                               : "?";
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'quantization_config': quantized HF weights ('%.32s') are unsupported (GGUF "
                         "quantizations are)", c->path, name);
    }
    return TRI_STATUS_OK;
}

// ---- rope scaling ----

// transformers' get_mscale: the YaRN attention factor for a scale and an mscale coefficient.
static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

// Reads the scaling object rs (keys named with prefix, e.g. "rope_scaling.") into cfg.
static tri_status parse_rope_scaling(const char *path, json_object *rs, const char *prefix,
                                     tri_model_config *cfg) {
    if (!json_object_is_type(rs, json_type_object)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%.*s': not an object", path,
                         (int)strlen(prefix) - 1, prefix);
    }
    cfg_ctx c = {path, rs, prefix};
    // transformers reads "rope_type" first and falls back on the older "type".
    const char *type, *key = "rope_type";
    TRY(cfg_str(&c, "rope_type", &type));
    if (!type) {
        key = "type";
        TRY(cfg_str(&c, "type", &type));
    }
    if (!type) return cfg_missing(&c, "rope_type");

    if (strcmp(type, "default") == 0) return TRI_STATUS_OK;
    int32_t max_pos = cfg->n_ctx_train;
    if (strcmp(type, "linear") == 0) {
        cfg->rope_scaling = TRI_ROPE_SCALING_LINEAR;
        TRY(cfg_float(&c, "factor", true, 1, true, &cfg->rope_factor));
    } else if (strcmp(type, "dynamic") == 0) {
        cfg->rope_scaling = TRI_ROPE_SCALING_DYNAMIC;
        TRY(cfg_float(&c, "factor", true, 1, true, &cfg->rope_factor));
        // transformers (4.4x to 5.x) scales from max_position_embeddings: it is what
        // _compute_dynamic_ntk_parameters reads, and the rotary embedding's original_max_seq_len,
        // below which dynamic_rope_update restores the unscaled table. original_max_position_embeddings,
        // in rope_scaling or at the top level, is accepted but unused. We do the same, and warn when
        // it names another context.
        cfg->rope_orig_ctx = max_pos;
        json_object *orig = cfg_get(&c, "original_max_position_embeddings");
        if (orig && json_object_is_type(orig, json_type_int) && json_object_get_int64(orig) != max_pos) {
            tri__log(TRI_LOG_LEVEL_WARN,
                     "%s: field '%soriginal_max_position_embeddings': %lld ignored for dynamic scaling, as transformers does; the original context is max_position_embeddings = %d",
                     path, prefix, (long long)json_object_get_int64(orig), (int)max_pos);
        }
    } else if (strcmp(type, "yarn") == 0) {
        cfg->rope_scaling = TRI_ROPE_SCALING_YARN;
        TRY(cfg_float(&c, "factor", true, 1, true, &cfg->rope_factor));
        TRY(cfg_int(&c, "original_max_position_embeddings", false, max_pos, 1, &cfg->rope_orig_ctx));
        // Newer transformers derive the factor as max_position_embeddings / original when the
        // latter is given; published configs agree (Yarn-Llama-2-7b-128k: 131072 / 4096 = 32).
        // We keep the written factor and say so when they disagree.
        if (cfg_get(&c, "original_max_position_embeddings") &&
            fabs((double)max_pos / cfg->rope_orig_ctx - (double)cfg->rope_factor) > 1e-3) {
            tri__log(TRI_LOG_LEVEL_WARN,
                     "%s: field '%sfactor': %g, but max_position_embeddings / original_max_position_embeddings = %g; using %g",
                     path, prefix, (double)cfg->rope_factor, (double)max_pos / cfg->rope_orig_ctx,
                     (double)cfg->rope_factor);
        }
        TRY(cfg_float(&c, "beta_fast", false, 32, false, &cfg->yarn_beta_fast));
        TRY(cfg_float(&c, "beta_slow", false, 1, false, &cfg->yarn_beta_slow));
        // attention_factor is the factor itself. Without it, transformers uses
        // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both coefficients
        // are non-zero, else get_mscale(factor) = 0.1 ln(factor) + 1, which 0 stands for here.
        float attn = 0, mscale = 0, mscale_all_dim = 0;
        TRY(cfg_float(&c, "attention_factor", false, 0, true, &attn));
        TRY(cfg_float(&c, "mscale", false, 0, false, &mscale));
        TRY(cfg_float(&c, "mscale_all_dim", false, 0, false, &mscale_all_dim));
        if (attn > 0) {
            cfg->yarn_mscale = attn;
        } else if (mscale != 0 && mscale_all_dim != 0) {
            double den = yarn_get_mscale((double)cfg->rope_factor, (double)mscale_all_dim);
            double x = yarn_get_mscale((double)cfg->rope_factor, (double)mscale) / den;
            if (!(den != 0) || !isfinite(x) || !(x > 0)) {
                return tri__fail(TRI_STATUS_BAD_FORMAT,
                                 "%s: field '%smscale': attention factor %g from mscale and mscale_all_dim is not > 0",
                                 path, prefix, x);
            }
            cfg->yarn_mscale = (float)x;
        }
    } else if (strcmp(type, "llama3") == 0) {
        cfg->rope_scaling = TRI_ROPE_SCALING_LLAMA3;
        TRY(cfg_float(&c, "factor", true, 1, true, &cfg->rope_factor));
        TRY(cfg_float(&c, "low_freq_factor", true, 1, true, &cfg->llama3_low_freq_factor));
        TRY(cfg_float(&c, "high_freq_factor", true, 1, true, &cfg->llama3_high_freq_factor));
        TRY(cfg_int(&c, "original_max_position_embeddings", true, 0, 1, &cfg->rope_orig_ctx));
        // The smooth ramp divides by (high - low).
        if (!(cfg->llama3_high_freq_factor > cfg->llama3_low_freq_factor)) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: field '%shigh_freq_factor': %g is not > low_freq_factor %g", path,
                             prefix, (double)cfg->llama3_high_freq_factor,
                             (double)cfg->llama3_low_freq_factor);
        }
    } else {
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field '%s%s': rope scaling '%.64s' is unsupported",
                         path, prefix, key, type);
    }
    return TRI_STATUS_OK;
}

// ---- config ----

tri_status tri__hf_config_parse(const char *name, const char *text, size_t len,
                                tri_model_config *cfg, char **arch_out) {
    tri__family_data data = {0};
    tri_status st = tri__hf_config_parse_family(name, text, len, cfg, arch_out, NULL, &data);
    tri__family_data_free(&data);
    return st;
}

tri_status tri__hf_config_parse_family(const char *name, const char *text, size_t len, tri_model_config *cfg,
                                       char **arch_out, const tri__family **fam_out, tri__family_data *data) {
    if (arch_out) *arch_out = NULL;
    const tri__family *fam = NULL;
    json_object *root = NULL;
    tri_status st = tri__json_parse(name, text, len, &root);
    if (st != TRI_STATUS_OK) return st;
    tri_model_config c = {0};
    c.rope_layout = TRI_ROPE_LAYOUT_HALF;
    c.rope_scaling = TRI_ROPE_SCALING_NONE;
    c.rope_factor = 1;
    c.yarn_beta_fast = 32;
    c.yarn_beta_slow = 1;
    if (!json_object_is_type(root, json_type_object)) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: not a JSON object", name);
        goto done;
    }
    cfg_ctx x = {name, root, ""};
#define STEP(expr)                         \
    do {                                   \
        st = (expr);                       \
        if (st != TRI_STATUS_OK) goto done; \
    } while (0)
    STEP(check_arch(&x, &fam));
    STEP(refuse_features(&x, fam));

    const char *act;
    STEP(cfg_str(&x, "hidden_act", &act));
    if (fam->act == TRI_ACT_SILU && act && strcmp(act, "silu") != 0) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field 'hidden_act': '%.64s' is unsupported (silu is)",
                       name, act);
        goto done;
    }
    // attention_bias: q, k, v and o biases where the family's transformers class reads the key;
    // mlp_bias (llama's gate, up and down biases) is not computed here
    bool bias = false;
    STEP(cfg_bool(&x, "attention_bias", false, &bias));
    if (bias && !fam->attn_bias_key) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED,
                       "%s: field 'attention_bias': true: %s has no attention biases (llama, gemma, qwen3 do)", name,
                       fam->name);
        goto done;
    }
    data->attn_bias = bias;
    STEP(cfg_bool(&x, "mlp_bias", false, &bias));
    if (bias) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field 'mlp_bias': true: feed-forward biases are unsupported", name);
        goto done;
    }

    STEP(cfg_int(&x, "vocab_size", true, 0, 1, &c.n_vocab));
    STEP(cfg_int(&x, "hidden_size", true, 0, 1, &c.n_embd));
    STEP(cfg_int(&x, "intermediate_size", true, 0, 1, &c.n_ff));
    STEP(cfg_int(&x, "num_hidden_layers", true, 0, 1, &c.n_layer));
    STEP(cfg_int(&x, "num_attention_heads", true, 0, 1, &c.n_head));
    STEP(cfg_int(&x, "num_key_value_heads", false, c.n_head, 1, &c.n_head_kv));
    STEP(cfg_int(&x, "max_position_embeddings", true, 0, 1, &c.n_ctx_train));
    STEP(cfg_float(&x, "rms_norm_eps", true, 0, true, &c.rms_eps));
    STEP(cfg_float(&x, "rope_theta", false, 10000, true, &c.rope_theta));
    STEP(cfg_bool(&x, "tie_word_embeddings", fam->tied_default, &c.tied_embeddings));

    if (cfg_get(&x, "head_dim")) {
        STEP(cfg_int(&x, "head_dim", true, 0, 1, &c.head_dim));
    } else if (c.n_embd % c.n_head != 0) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT,
                       "%s: field 'num_attention_heads': %d does not divide hidden_size %d (and head_dim is absent)",
                       name, (int)c.n_head, (int)c.n_embd);
        goto done;
    } else {
        c.head_dim = c.n_embd / c.n_head;
    }
    if (c.head_dim % 2 != 0) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'head_dim': %d is odd; rope needs pairs", name,
                       (int)c.head_dim);
        goto done;
    }
    if ((int64_t)c.n_head * c.head_dim > INT32_MAX) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'head_dim': heads x head_dim overflows", name);
        goto done;
    }
    if (c.n_head_kv > c.n_head || c.n_head % c.n_head_kv != 0) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT,
                       "%s: field 'num_key_value_heads': %d does not divide num_attention_heads %d",
                       name, (int)c.n_head_kv, (int)c.n_head);
        goto done;
    }

    // Rope scaling: "rope_scaling" (transformers 4.x), or "rope_parameters" (transformers 5),
    // which also carries rope_theta.
    // the family's own keys (its activation, window, rope scaling), before the common rope scaling
    if (fam->hf_config) STEP(fam->hf_config(&x, &c, data));
    json_object *rs = cfg_get(&x, "rope_scaling");
    json_object *rp = cfg_get(&x, "rope_parameters");
    if (c.rope_scaling != TRI_ROPE_SCALING_NONE) {
        // the family read it
    } else if (rs) {
        STEP(parse_rope_scaling(name, rs, "rope_scaling.", &c));
    } else if (rp) {
        STEP(parse_rope_scaling(name, rp, "rope_parameters.", &c));
        cfg_ctx p = {name, rp, "rope_parameters."};
        STEP(cfg_float(&p, "rope_theta", false, c.rope_theta, true, &c.rope_theta));
    }
#undef STEP

    if (arch_out) {
        *arch_out = malloc(strlen(fam->name) + 1);
        if (!*arch_out) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", name);
            goto done;
        }
        memcpy(*arch_out, fam->name, strlen(fam->name) + 1);
    }
    if (fam_out) *fam_out = fam;
    *cfg = c;
    st = TRI_STATUS_OK;

done:
    json_object_put(root);
    return st;
}

tri_status tri__hf_config_load(const char *config_json_path, tri_model_config *cfg, char **arch_out) {
    tri__family_data data = {0};
    tri_status st = tri__hf_config_load_family(config_json_path, cfg, arch_out, NULL, &data);
    tri__family_data_free(&data);
    return st;
}

tri_status tri__hf_config_load_family(const char *config_json_path, tri_model_config *cfg, char **arch_out,
                                      const tri__family **fam_out, tri__family_data *data) {
    if (arch_out) *arch_out = NULL;
    char *text;
    size_t len;
    tri_status st = tri__json_read_file(config_json_path, TRI_JSON_MAX_BYTES, &text, &len);
    if (st != TRI_STATUS_OK) return st;
    st = tri__hf_config_parse_family(config_json_path, text, len, cfg, arch_out, fam_out, data);
    free(text);
    return st;
}

// ---- keys for the families' hooks ----

tri_status tri__hf_key_int(const tri__hf_keys *k, const char *key, bool required, int32_t def, int32_t min,
                           int32_t *out) {
    return cfg_int(k, key, required, def, min, out);
}

tri_status tri__hf_key_float(const tri__hf_keys *k, const char *key, bool required, float def, bool positive,
                             float *out) {
    return cfg_float(k, key, required, def, positive, out);
}

tri_status tri__hf_key_bool(const tri__hf_keys *k, const char *key, bool def, bool *out) {
    return cfg_bool(k, key, def, out);
}

tri_status tri__hf_key_str(const tri__hf_keys *k, const char *key, const char **out) { return cfg_str(k, key, out); }

bool tri__hf_key_present(const tri__hf_keys *k, const char *key) { return cfg_get(k, key) != NULL; }

bool tri__hf_key_written(const tri__hf_keys *k, const char *key) {
    json_object *v;
    return json_object_object_get_ex(k->obj, key, &v);
}

tri_status tri__hf_key_object(const tri__hf_keys *k, const char *key, const char *prefix, tri__hf_keys *out) {
    json_object *v = cfg_get(k, key);
    if (!v) return cfg_missing(k, key);
    if (!json_object_is_type(v, json_type_object))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not an object", k->path, k->prefix, key);
    *out = (tri__hf_keys){k->path, v, prefix};
    return TRI_STATUS_OK;
}

tri_status tri__hf_key_floats(const tri__hf_keys *k, const char *key, int32_t n, float **out) {
    *out = NULL;
    json_object *v = cfg_get(k, key);
    if (!v) return cfg_missing(k, key);
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != (size_t)n)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': not an array of %d numbers (head_dim / 2)",
                         k->path, k->prefix, key, (int)n);
    float *f = malloc(sizeof *f * (size_t)(n > 0 ? n : 1));
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: field '%s%s'", k->path, k->prefix, key);
    for (int32_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, (size_t)i);
        double x = json_object_is_type(e, json_type_int) || json_object_is_type(e, json_type_double)
                       ? json_object_get_double(e) : NAN;
        if (!isfinite(x) || !((float)x > 0) || x > 3.0e38) {
            free(f);
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s%s': entry %d is not a positive finite number",
                             k->path, k->prefix, key, (int)i);
        }
        f[i] = (float)x;
    }
    *out = f;
    return TRI_STATUS_OK;
}

// ---- tensor names ----

typedef struct name_map {
    const char *hf;
    const char *gguf;
} name_map;

static const name_map global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// The part after "model.layers.N.".
static const name_map layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    // Qwen3's per-head RMSNorm of q and k
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    // Phi-3's fused matrices, under llama.cpp's names (its converter keeps them fused: gate_up in
    // ffn_up); the loader splits them into rows of the unfused slots
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
    // biases: qwen2's q, k, v; llama's and gemma's q, k, v, o with attention_bias; mlp_bias's are
    // mapped under llama.cpp's names so that the loader can refuse them by name instead of losing them.
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"mlp.gate_proj.bias", "ffn_gate.bias"},
    {"mlp.up_proj.bias", "ffn_up.bias"},
    {"mlp.down_proj.bias", "ffn_down.bias"},
};

// The block's norms of a family with four (post_norms), looked up before layer_names.
static const name_map post_norm_names[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

static bool put_name(char *out, size_t out_size, const char *a, const char *b, const char *c) {
    int n = snprintf(out, out_size, "%s%s%s", a, b, c);
    if (n < 0 || (size_t)n >= out_size) {
        if (out_size > 0) out[0] = '\0';
        return false;
    }
    return true;
}

bool tri__hf_tensor_name_to_gguf(const char *hf, char *out, size_t out_size) {
    return tri__hf_tensor_name_to_gguf_family(hf, false, out, out_size);
}

bool tri__hf_tensor_name_from_gguf(const char *gguf, char *out, size_t out_size) {
    return tri__hf_tensor_name_from_gguf_family(gguf, false, out, out_size);
}

bool tri__hf_tensor_name_to_gguf_family(const char *hf, bool post_norms, char *out, size_t out_size) {
    if (out_size > 0) out[0] = '\0';
    for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++) {
        if (strcmp(hf, global_names[i].hf) == 0) {
            return put_name(out, out_size, global_names[i].gguf, "", "");
        }
    }
    static const char layers[] = "model.layers.";
    if (strncmp(hf, layers, sizeof layers - 1) != 0) return false;
    const char *p = hf + sizeof layers - 1;
    size_t digits = strspn(p, "0123456789");
    // no leading zeros, so that two HF names never map to one canonical name
    if (digits == 0 || digits > 9 || p[digits] != '.' || (p[0] == '0' && digits > 1)) return false;
    char num[16];
    memcpy(num, p, digits);
    num[digits] = '\0';
    const char *rest = p + digits + 1;
    for (size_t i = 0; post_norms && i < sizeof post_norm_names / sizeof post_norm_names[0]; i++) {
        if (strcmp(rest, post_norm_names[i].hf) == 0) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "blk.%s.", num);
            return put_name(out, out_size, prefix, post_norm_names[i].gguf, "");
        }
    }
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        if (strcmp(rest, layer_names[i].hf) == 0) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "blk.%s.", num);
            return put_name(out, out_size, prefix, layer_names[i].gguf, "");
        }
    }
    return false;
}

bool tri__hf_tensor_name_from_gguf_family(const char *gguf, bool post_norms, char *out, size_t out_size) {
    if (out_size > 0) out[0] = '\0';
    for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++) {
        if (strcmp(gguf, global_names[i].gguf) == 0) {
            return put_name(out, out_size, global_names[i].hf, "", "");
        }
    }
    static const char blk[] = "blk.";
    if (strncmp(gguf, blk, sizeof blk - 1) != 0) return false;
    const char *p = gguf + sizeof blk - 1;
    size_t digits = strspn(p, "0123456789");
    if (digits == 0 || digits > 9 || p[digits] != '.' || (p[0] == '0' && digits > 1)) return false;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "model.layers.%.*s.", (int)digits, p);
    const char *rest = p + digits + 1;
    for (size_t i = 0; post_norms && i < sizeof post_norm_names / sizeof post_norm_names[0]; i++)
        if (strcmp(rest, post_norm_names[i].gguf) == 0)
            return put_name(out, out_size, prefix, post_norm_names[i].hf, "");
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        if (strcmp(rest, layer_names[i].gguf) == 0) {
            return put_name(out, out_size, prefix, layer_names[i].hf, "");
        }
    }
    return false;
}
