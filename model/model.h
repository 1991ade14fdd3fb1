// model.h - a loaded model: the format-independent view of its tensors and config (internal).
#ifndef TRI_MODEL_H
#define TRI_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/family.h"
#include "triforce.h"

struct tri__gguf;
struct tri__st_model;
struct tri__tokenizer;

// One tensor of a loaded model, whatever file it came from.
typedef struct tri__tensor {
    const char *name;   // canonical name (GGUF naming: "blk.3.attn_q.weight"), owned by the model
    tri_dtype type;
    int32_t n_dims;
    int64_t shape[4];   // outermost first: a weight matrix is (n_out rows, n_in cols), row-major
    uint64_t n_bytes;
    const void *data;   // inside a read-only mapping owned by the model
    const char *source; // its name in the file ("model.layers.3.self_attn.q_proj.weight" in an HF
                        // checkpoint; == name for GGUF), for messages; owned by the model
    const char *file;   // the file that holds it (the shard of a sharded checkpoint), for messages
                        // and for reading it without the mapping (the disk tier of streamed weights)
    uint64_t offset;    // bytes from the start of `file` to its first byte
    bool bound;         // taken by a slot of the model; loading fails on a tensor left unbound
    bool slice;         // rows of another entry (a fused matrix split at load): not counted in the
                        // model's totals
    bool computed;      // data computed at load into memory the model owns (Gemma's 1 + w from an
                        // HF checkpoint, an f32 copy of a bias): `offset` does not locate it
} tri__tensor;

// The weights of one transformer block; every pointer is into tri_model.tensors.
typedef struct tri__layer {
    const tri__tensor *attn_norm;  // (n_embd) f32/f16/bf16
    const tri__tensor *wq;         // (n_head * head_dim, n_embd)
    const tri__tensor *wk;         // (n_head_kv * head_dim, n_embd)
    const tri__tensor *wv;         // (n_head_kv * head_dim, n_embd)
    const tri__tensor *wo;         // (n_embd, n_head * head_dim)
    const tri__tensor *ffn_norm;   // (n_embd)
    const tri__tensor *w_gate;     // (n_ff, n_embd)
    const tri__tensor *w_up;       // (n_ff, n_embd)
    const tri__tensor *w_down;     // (n_embd, n_ff)
    const tri__tensor *bq;         // (n_head * head_dim) f32 or NULL (family qkv_bias, attention_bias)
    const tri__tensor *bk;         // (n_head_kv * head_dim) f32 or NULL
    const tri__tensor *bv;         // (n_head_kv * head_dim) f32 or NULL
    const tri__tensor *bo;         // (n_embd) f32 or NULL (attention_bias: added after the output projection)
    const tri__tensor *q_norm;     // (head_dim) f32/f16/bf16 or NULL: every query head's RMSNorm (family qk_norm)
    const tri__tensor *k_norm;     // (head_dim) or NULL: every key head's
    const tri__tensor *post_attn_norm;  // (n_embd) or NULL: the attention output's RMSNorm before its residual
                                        // (family post_norms)
    const tri__tensor *post_ffn_norm;   // (n_embd) or NULL: the FFN output's
} tri__layer;

struct tri_model {
    tri_model_info info;
    char *path;
    char *config_path;             // an HF checkpoint's config.json; NULL for GGUF (keys in path)
    char *arch;
    char *name;
    tri_model_config config;       // == info.config
    const tri__family *family;     // what the forward pass does differently (model/family.h)
    tri__family_data fdata;        // LongRoPE factors, owned
    void **owned;                  // (n_owned) buffers of computed tensors, malloc'd
    int32_t n_owned;

    tri__tensor *tensors;          // n_tensors, file order
    int64_t n_tensors;
    const tri__tensor *tok_embd;   // (n_vocab, n_embd)
    const tri__tensor *output_norm;// (n_embd)
    const tri__tensor *output;     // (n_vocab, n_embd); == tok_embd when tied
    const tri__tensor *rope_freqs; // (head_dim / 2) f32 frequency divisors, or NULL
    tri__layer *layers;            // n_layer

    struct tri__gguf *gguf;        // the source, one of the two
    struct tri__st_model *st;
    struct tri__tokenizer *tokenizer;  // NULL when the model carries none
    struct tri__weight_stream *stream;  // a device view's streamed layers (weights.h), else NULL
};

// The model's family; a model built without one (tests' synthetic models) is llama.
static inline const tri__family *tri__model_family(const tri_model *model) {
    return model->family ? model->family : &tri__family_llama;
}

// The tensor of that canonical name, or NULL.
const tri__tensor *tri__model_find_tensor(const tri_model *model, const char *name);

#endif  // TRI_MODEL_H
