// hf-config.h - Hugging Face config.json and tensor names of Llama-family checkpoints (internal).
#ifndef TRI_HF_CONFIG_H
#define TRI_HF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "triforce.h"

// Reads a transformers config.json into *cfg (every field set; rope_layout = HALF,
// has_rope_freqs = false). The model is accepted when an entry of "architectures", or else
// "model_type", names a family of model/family.h (LlamaForCausalLM / llama, Qwen2ForCausalLM /
// qwen2, ...); anything else is UNSUPPORTED, named, and so are the features no family computes
// (soft-capping, experts, partial rotary). The family's own keys are read by its hook.
// Also UNSUPPORTED: hidden_act other than "silu", attention_bias or mlp_bias true, an unknown
// rope_scaling type. BAD_FORMAT, naming the file and the key: malformed JSON (json-c's reason and
// the position), a missing required key, a wrong JSON type, a size <= 0 or > INT32_MAX, hidden
// not divisible by heads when head_dim is absent, an odd head_dim, KV heads not dividing heads,
// a non-finite or non-positive eps, theta or factor. docs/formats.md lists the keys and defaults.
// When arch_out is not NULL, *arch_out receives the family's name (malloc'd; the caller frees) on success
// and NULL on failure.
tri_status tri__hf_config_load(const char *config_json_path, tri_model_config *cfg, char **arch_out);

struct tri__family;
struct tri__family_data;

// As tri__hf_config_load, for any family of model/family.h: *fam_out (if not NULL) receives the
// family, *arch_out its name, data the values beyond the config (LongRoPE factors; the caller
// frees them with tri__family_data_free, also on failure).
tri_status tri__hf_config_load_family(const char *config_json_path, tri_model_config *cfg, char **arch_out,
                                      const struct tri__family **fam_out, struct tri__family_data *data);
tri_status tri__hf_config_parse_family(const char *name, const char *text, size_t len, tri_model_config *cfg,
                                       char **arch_out, const struct tri__family **fam_out,
                                       struct tri__family_data *data);

// ---- keys of a config.json object, for the families' hooks ----
//
// Every getter names the file and prefix + key when it fails; absent or null keys take the default
// when not required.
struct json_object;
typedef struct tri__hf_keys {
    const char *path;
    struct json_object *obj;  // the object the keys are looked up in
    const char *prefix;       // "" or "rope_scaling."
} tri__hf_keys;

tri_status tri__hf_key_int(const tri__hf_keys *k, const char *key, bool required, int32_t def, int32_t min,
                           int32_t *out);
tri_status tri__hf_key_float(const tri__hf_keys *k, const char *key, bool required, float def, bool positive,
                             float *out);
tri_status tri__hf_key_bool(const tri__hf_keys *k, const char *key, bool def, bool *out);
tri_status tri__hf_key_str(const tri__hf_keys *k, const char *key, const char **out);
bool tri__hf_key_present(const tri__hf_keys *k, const char *key);  // there and not null
bool tri__hf_key_written(const tri__hf_keys *k, const char *key);  // there, null or not
// The object under key (required), its keys named with prefix ("rope_scaling.").
tri_status tri__hf_key_object(const tri__hf_keys *k, const char *key, const char *prefix, tri__hf_keys *out);
// An array of n positive finite numbers, malloc'd into *out.
tri_status tri__hf_key_floats(const tri__hf_keys *k, const char *key, int32_t n, float **out);

// The same from text[0, len) already in memory; `name` stands in for the path in messages.
tri_status tri__hf_config_parse(const char *name, const char *text, size_t len,
                                tri_model_config *cfg, char **arch_out);

// Maps an HF Llama weight name to the canonical GGUF-style name of model.h:
//   model.embed_tokens.weight                      -> token_embd.weight
//   model.norm.weight                              -> output_norm.weight
//   lm_head.weight                                 -> output.weight
//   model.layers.N.input_layernorm.weight          -> blk.N.attn_norm.weight
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight -> blk.N.attn_{q,k,v,output}.weight
//   model.layers.N.post_attention_layernorm.weight -> blk.N.ffn_norm.weight
//   model.layers.N.mlp.{gate,up,down}_proj.weight  -> blk.N.ffn_{gate,up,down}.weight
//   model.layers.N.self_attn.{q,k,v,o}_proj.bias   -> blk.N.attn_{q,k,v,output}.bias
//   model.layers.N.mlp.{gate,up,down}_proj.bias    -> blk.N.ffn_{gate,up,down}.bias
//   model.layers.N.self_attn.{q,k}_norm.weight     -> blk.N.attn_{q,k}_norm.weight (qwen3)
// The biases are mapped only so that the loader can name them when it refuses them (Llama has
// none). N is a decimal layer number without leading zeros, below 10^9. Returns false, with out
// set to "" when out_size > 0, for any other name (rotary_emb.inv_freq, ...), and when the
// result does not fit in out_size bytes with its NUL.
bool tri__hf_tensor_name_to_gguf(const char *hf, char *out, size_t out_size);

// The inverse: the HF name of a canonical name, for messages about a tensor an HF checkpoint
// lacks. Same rules and return value.
bool tri__hf_tensor_name_from_gguf(const char *gguf, char *out, size_t out_size);

// The same in a family with four norms a block (family post_norms, Gemma 2), where the names of
// llama.cpp's converter for it differ: post_attention_layernorm -> post_attention_norm,
// pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm.
bool tri__hf_tensor_name_to_gguf_family(const char *hf, bool post_norms, char *out, size_t out_size);
bool tri__hf_tensor_name_from_gguf_family(const char *gguf, bool post_norms, char *out, size_t out_size);

#endif  // TRI_HF_CONFIG_H
