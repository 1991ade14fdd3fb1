// family.h - what one model family does differently, described once for the one forward pass
// (internal).
//
// The forward pass (llama.c) and the loader (model.c) read a tri__family and never test a
// family's name: a difference lives in the family's own file (family-<name>.c), as a field of
// its description or as its config hooks. docs/formats.md, "What loads", lists the families.
#ifndef TRI_FAMILY_H
#define TRI_FAMILY_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

#define TRI_TRY_STATUS(expr)                          \
    do {                                              \
        tri_status try_status_ = (expr);              \
        if (try_status_ != TRI_STATUS_OK) return try_status_; \
    } while (0)

struct tri__gguf;
struct tri__hf_keys;

// The feed-forward activation: out = act(gate) * up.
typedef enum tri__act {
    TRI_ACT_SILU = 0,       // SwiGLU: silu(g) = g / (1 + e^-g)
    TRI_ACT_GELU_TANH = 1,  // GeGLU with the tanh approximation of GELU
} tri__act;

// Values read from a file besides tri_model_config that the family needs; freed with the model.
typedef struct tri__family_data {
    float *rope_short;  // (head_dim / 2) LongRoPE per-pair divisors up to orig_ctx, malloc'd, or NULL
    float *rope_long;   // (head_dim / 2) past orig_ctx, malloc'd, or NULL
    bool attn_bias;     // the q, k, v and o projections add a bias (config.json attention_bias of a
                        // family with attn_bias_key; a GGUF llama file with blk.0.attn_q.bias)
    float attn_softcap;   // attention-logit soft-cap (Gemma 2's attn_logit_softcapping): each scaled
                          // score s becomes cap * tanh(s / cap); 0: none
    float final_softcap;  // the same on the logits (final_logit_softcapping); 0: none
    float q_scale;        // the queries times this before attention, whose scores are scaled by
                          // 1 / sqrt(head_dim): sqrt(head_dim / query_pre_attn_scalar); 0: 1
} tri__family_data;

typedef struct tri__family {
    const char *name;           // tri_model_info.architecture: "llama", "qwen2", ...
    const char *gguf_arch;      // its general.architecture and key prefix, NULL: none of its own
                                // (llama.cpp writes Mistral as "llama")
    const char *hf_model_type;  // config.json "model_type"
    const char *hf_arch;        // config.json "architectures" entry
    tri__act act;
    bool qkv_bias;              // the q, k and v projections add a bias (n_out) f32
    bool fused_qkv;             // q, k, v rows in one (q_dim + 2 kv_dim, n_embd) matrix, in that
                                // order (GGUF attn_qkv, HF self_attn.qkv_proj)
    bool fused_gate_up;         // gate then up rows in one (2 n_ff, n_embd) matrix (GGUF ffn_up,
                                // HF mlp.gate_up_proj)
    bool norm_plus_one;         // RMSNorm multiplies by (1 + w); HF stores w, llama.cpp's
                                // converter stores 1 + w in GGUF
    bool embd_scale;            // the embedding rows are multiplied by sqrt(n_embd)
    bool qk_norm;               // every head's query and key go through an RMSNorm of head_dim
                                // weights before rope (GGUF attn_{q,k}_norm, HF self_attn.{q,k}_norm)
    bool attn_bias_key;         // config.json's attention_bias: true adds biases to q, k, v and o (transformers'
                                // llama and gemma); refused in the other families, whose classes have none
    bool tied_default;          // config.json without tie_word_embeddings ties the head to the
                                // embedding (transformers' default for the model type)
    bool softcap;               // reads attention and final logit soft-caps (config.json
                                // attn_logit_softcapping, final_logit_softcapping), refused elsewhere
    int32_t window_period;      // with a sliding window: every window_period-th layer (il + 1 a
                                // multiple of it) attends globally (Gemma 2: 2, the odd layers);
                                // 0: the window on every layer
    bool post_norms;            // RMSNorms of the attention's and the FFN's outputs before their
                                // residuals (GGUF post_attention_norm, post_ffw_norm; HF
                                // post_attention_layernorm and post_feedforward_layernorm, the FFN's
                                // input norm then pre_feedforward_layernorm)
    tri_rope_layout gguf_layout;  // ADJACENT where llama.cpp's converter permutes Q/K rows
    // Family keys of config.json (activation, window, rope scaling the common reader leaves to
    // the family) into cfg and data; NULL: none.
    tri_status (*hf_config)(const struct tri__hf_keys *k, tri_model_config *cfg, tri__family_data *data);
    // The same for a GGUF file whose keys start with prefix ("phi3."); NULL: none.
    tri_status (*gguf_config)(const struct tri__gguf *g, const char *prefix, tri_model_config *cfg,
                              tri__family_data *data);
} tri__family;

// Llama: also the family of a model built without one (tests' synthetic models).
extern const tri__family tri__family_llama;

// The families the runtime computes (family.c's table): i from 0 to tri__family_count() - 1.
size_t tri__family_count(void);
const tri__family *tri__family_at(size_t i);

// The family of a GGUF general.architecture (len bytes, not NUL-terminated), or NULL.
const tri__family *tri__family_by_gguf_arch(const char *arch, size_t len);
// The family of a config.json architectures entry or model_type, or NULL.
const tri__family *tri__family_by_hf_arch(const char *arch);
const tri__family *tri__family_by_hf_model_type(const char *model_type);
// "llama, qwen2, ..." for messages: the GGUF architectures (gguf) or the HF model types, from
// the table.
const char *tri__family_list(bool gguf);

void tri__family_data_free(tri__family_data *data);

// Reads an (n) array of positive finite numbers from GGUF tensor name (f32, shape (n)) into a
// malloc'd *out: llama.cpp's rope_factors_{long,short}.weight.
tri_status tri__family_gguf_factors(const struct tri__gguf *g, const char *name, int32_t n, float **out);

#endif  // TRI_FAMILY_H
