// model.c - tri_model_load: one format-independent model over a GGUF file or an HF checkpoint.
//
// Both formats end in the same place: a table of tri__tensor under canonical (GGUF) names, a
// tri_model_config, and per-layer weight views whose shapes and types were checked against the
// config, so nothing after loading has to know where the weights came from.
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtype.h"
#include "error.h"
#include "gguf.h"
#include "hf-config.h"
#include "safetensors.h"
#include "tokenizer.h"

// ---- small helpers ----

static char *dup_str(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool progress(const tri_model_params *p, float fraction) {
    return !p->progress || p->progress(fraction, p->progress_user);
}

const tri__tensor *tri__model_find_tensor(const tri_model *model, const char *name) {
    for (int64_t i = 0; i < model->n_tensors; i++)
        if (strcmp(model->tensors[i].name, name) == 0) return &model->tensors[i];
    return NULL;
}

// ---- binding tensors to the config ----
//
// Every message names the file that holds the tensor, the tensor by the name it has there, and
// the config key a wanted size comes from, as the file's format spells it: "intermediate_size" in
// an HF config.json, "llama.feed_forward_length" in GGUF.

// The config values a tensor's shape is checked against.
typedef enum cfg_dim {
    CFG_DIM_VOCAB,  // n_vocab
    CFG_DIM_EMBD,   // n_embd
    CFG_DIM_FF,     // n_ff
    CFG_DIM_Q,      // n_head * head_dim
    CFG_DIM_KV,     // n_head_kv * head_dim
    CFG_DIM_ROT,    // head_dim / 2
    CFG_DIM_HEAD,   // head_dim
} cfg_dim;

static int64_t dim_value(const tri_model_config *c, cfg_dim d) {
    switch (d) {
    case CFG_DIM_VOCAB: return c->n_vocab;
    case CFG_DIM_EMBD: return c->n_embd;
    case CFG_DIM_FF: return c->n_ff;
    case CFG_DIM_Q: return (int64_t)c->n_head * c->head_dim;
    case CFG_DIM_KV: return (int64_t)c->n_head_kv * c->head_dim;
    case CFG_DIM_ROT: return c->head_dim / 2;
    case CFG_DIM_HEAD: return c->head_dim;
    }
    return 0;
}

// A GGUF key of the model's architecture: "<arch>.<suffix>" in buf.
static const char *gkey(const tri_model *m, const char *suffix, char *buf, size_t size) {
    const char *arch = m->family && m->family->gguf_arch ? m->family->gguf_arch : "llama";
    snprintf(buf, size, "%s.%s", arch, suffix);
    return buf;
}

// The GGUF key the head size came from, in tri__gguf_family_config's order, in buf.
static const char *gguf_head_key(const tri_model *m, char *buf, size_t size) {
    if (tri__gguf_find(m->gguf, gkey(m, "attention.key_length", buf, size))) return buf;
    if (tri__gguf_find(m->gguf, gkey(m, "rope.dimension_count", buf, size))) return buf;
    char a[96], b[96];
    snprintf(buf, size, "(%s / %s)", gkey(m, "embedding_length", a, sizeof a), gkey(m, "attention.head_count", b, sizeof b));
    return buf;
}

// Writes "intermediate_size = 170" or "num_attention_heads x head_dim = 4 x 16" for d into buf.
static void describe_dim(const tri_model *m, cfg_dim d, char *buf, size_t size) {
    const tri_model_config *c = &m->config;
    bool hf = m->config_path != NULL;
    char k1[96], k2[200];
    switch (d) {
    case CFG_DIM_VOCAB:
        // GGUF: read_vocab takes the key, else the token list (the embedding agrees with itself)
        snprintf(buf, size, "%s = %d",
                 hf ? "vocab_size"
                 : tri__gguf_find(m->gguf, gkey(m, "vocab_size", k1, sizeof k1)) ? k1
                                                                                  : "the length of tokenizer.ggml.tokens",
                 c->n_vocab);
        break;
    case CFG_DIM_EMBD:
        snprintf(buf, size, "%s = %d", hf ? "hidden_size" : gkey(m, "embedding_length", k1, sizeof k1), c->n_embd);
        break;
    case CFG_DIM_FF:
        snprintf(buf, size, "%s = %d", hf ? "intermediate_size" : gkey(m, "feed_forward_length", k1, sizeof k1),
                 c->n_ff);
        break;
    case CFG_DIM_Q:
    case CFG_DIM_KV:
        snprintf(buf, size, "%s x %s = %d x %d",
                 d == CFG_DIM_Q ? (hf ? "num_attention_heads" : gkey(m, "attention.head_count", k1, sizeof k1))
                                : (hf ? "num_key_value_heads" : gkey(m, "attention.head_count_kv", k1, sizeof k1)),
                 hf ? "head_dim" : gguf_head_key(m, k2, sizeof k2), d == CFG_DIM_Q ? c->n_head : c->n_head_kv,
                 c->head_dim);
        break;
    case CFG_DIM_ROT:
        snprintf(buf, size, "%s / 2 = %d / 2", hf ? "head_dim" : gguf_head_key(m, k2, sizeof k2), c->head_dim);
        break;
    case CFG_DIM_HEAD:
        snprintf(buf, size, "%s = %d", hf ? "head_dim" : gguf_head_key(m, k2, sizeof k2), c->head_dim);
        break;
    }
}

// " in DIR/config.json" for an HF checkpoint, "" for GGUF, whose keys are in the file named first.
static const char *config_where(const tri_model *m, char *buf, size_t size) {
    if (!m->config_path) return "";
    snprintf(buf, size, " in %s", m->config_path);
    return buf;
}

// num_hidden_layers, or <arch>.block_count (in a buffer of the calling thread, valid until its next call).
static const char *layers_key(const tri_model *m) {
    static _Thread_local char buf[96];
    return m->config_path ? "num_hidden_layers" : gkey(m, "block_count", buf, sizeof buf);
}

static tri__tensor *find_tensor(tri_model *m, const char *name) {
    for (int64_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

// NOT_FOUND for the tensor `name` (canonical), named as the model's format names it.
static tri_status missing(const tri_model *m, const char *name) {
    char hf[160], where[4200];
    const char *shown = name;
    if (m->config_path && tri__hf_tensor_name_from_gguf_family(name, tri__model_family(m)->post_norms, hf, sizeof hf))
        shown = hf;
    if (strncmp(name, "blk.", 4) != 0)
        return tri__fail(TRI_STATUS_NOT_FOUND, "%s: tensor '%s' is missing", m->path, shown);
    return tri__fail(TRI_STATUS_NOT_FOUND, "%s: tensor '%s' is missing (%s = %d%s)", m->path, shown,
                     layers_key(m), m->config.n_layer, config_where(m, where, sizeof where));
}

// Looks up a required tensor and checks its shape (outermost first; n_dims entries, d1 unused for
// a vector) and that its type is one the kernels take: any type for matrices, a float type for
// vectors. The tensor is marked bound.
static tri_status bind(tri_model *m, const char *name, int32_t n_dims, cfg_dim d0, cfg_dim d1,
                       const tri__tensor **out) {
    tri__tensor *t = find_tensor(m, name);
    if (!t) return missing(m, name);
    int64_t want0 = dim_value(&m->config, d0), want1 = n_dims == 2 ? dim_value(&m->config, d1) : 0;
    // A vector may be stored as (1, n) by some writers; a matrix must be 2-D.
    bool ok;
    if (n_dims == 1)
        ok = (t->n_dims == 1 && t->shape[0] == want0) ||
             (t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == want0);
    else
        ok = t->n_dims == 2 && t->shape[0] == want0 && t->shape[1] == want1;
    if (!ok) {
        char got[96], want[64], keys[256], where[4200];
        int len = snprintf(got, sizeof got, "(");
        for (int i = 0; i < t->n_dims && len < (int)sizeof got - 24; i++)
            len += snprintf(got + len, sizeof got - (size_t)len, "%s%lld", i ? ", " : "",
                            (long long)t->shape[i]);
        snprintf(got + len, sizeof got - (size_t)len, ")");
        // name the key behind each size that disagrees, every key when the rank does
        bool same_rank = t->n_dims == n_dims;
        const bool bad[2] = {n_dims == 1 || !same_rank || t->shape[0] != want0,
                             n_dims == 2 && (!same_rank || t->shape[1] != want1)};
        const cfg_dim dims[2] = {d0, d1};
        len = 0;
        keys[0] = 0;
        for (int i = 0; i < n_dims; i++) {
            if (!bad[i]) continue;
            if (len) len += snprintf(keys + len, sizeof keys - (size_t)len, ", ");
            describe_dim(m, dims[i], keys + len, sizeof keys - (size_t)len);
            len = (int)strlen(keys);
        }
        if (n_dims == 1)
            snprintf(want, sizeof want, "(%lld)", (long long)want0);
        else
            snprintf(want, sizeof want, "(%lld, %lld)", (long long)want0, (long long)want1);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': shape %s, config wants %s (%s%s)",
                         t->file, t->source, got, want, keys, config_where(m, where, sizeof where));
    }
    if (n_dims == 1 && tri__dtype_is_quantized(t->type))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': type %s for a vector, want f32/f16/bf16",
                         t->file, t->source, tri_dtype_name(t->type));
    t->bound = true;
    *out = t;
    return TRI_STATUS_OK;
}

// Every tensor must have been taken by a slot: a weight the forward pass would skip (a bias, a
// block beyond the config's count, a tensor of another architecture) means that the file is not
// the model its config describes, or not a model this runtime computes.
static tri_status check_all_bound(const tri_model *m) {
    char where[4200];
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const tri__tensor *t = &m->tensors[i];
        if (t->bound) continue;
        if (strncmp(t->name, "blk.", 4) == 0) {
            char *end;
            long long layer = strtoll(t->name + 4, &end, 10);
            if (end != t->name + 4 && *end == '.' && layer >= m->config.n_layer)
                return tri__fail(TRI_STATUS_BAD_FORMAT,
                                 "%s: tensor '%s': layer %lld is beyond %s = %d%s", t->file,
                                 t->source, layer, layers_key(m), m->config.n_layer,
                                 config_where(m, where, sizeof where));
        }
        if (has_suffix(t->name, ".bias"))
            return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': biases are unsupported (%s has none there)",
                             t->file, t->source, m->family->name);
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': not a weight of the %s architecture",
                         t->file, t->source, m->family->name);
    }
    return TRI_STATUS_OK;
}

// The weights of one block, in the order they are bound.
#define N_LAYER_TENSORS 9
static const char *const layer_suffixes[N_LAYER_TENSORS] = {
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
};

static tri_status bind_all(tri_model *m) {
    const tri_model_config *c = &m->config;
    tri_status st;

    if ((st = bind(m, "token_embd.weight", 2, CFG_DIM_VOCAB, CFG_DIM_EMBD, &m->tok_embd))) return st;
    if ((st = bind(m, "output_norm.weight", 1, CFG_DIM_EMBD, 0, &m->output_norm))) return st;
    if (c->tied_embeddings) {
        m->output = m->tok_embd;
        // transformers ties such a copy to the embedding on load, so it is never read either
        tri__tensor *out = find_tensor(m, "output.weight");
        if (out) {
            tri__log(TRI_LOG_LEVEL_WARN, "%s: ignoring tensor '%s': the config ties the embeddings",
                     out->file, out->source);
            out->bound = true;
        }
    } else if ((st = bind(m, "output.weight", 2, CFG_DIM_VOCAB, CFG_DIM_EMBD, &m->output))) {
        return st;
    }
    m->rope_freqs = NULL;
    if (c->has_rope_freqs) {
        if ((st = bind(m, "rope_freqs.weight", 1, CFG_DIM_ROT, 0, &m->rope_freqs))) return st;
        if (m->rope_freqs->type != TRI_DTYPE_F32)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': type %s, want f32",
                             m->rope_freqs->file, m->rope_freqs->source,
                             tri_dtype_name(m->rope_freqs->type));
    }

    // Every layer takes N_LAYER_TENSORS tensors, so a layer count the file cannot hold (the
    // config is as untrusted as the file) fails, naming the first absent tensor, before it sizes
    // the table; that search stops within n_tensors / N_LAYER_TENSORS + 1 layers.
    if ((int64_t)c->n_layer * N_LAYER_TENSORS > m->n_tensors) {
        for (int32_t il = 0; il < c->n_layer; il++) {
            for (size_t i = 0; i < N_LAYER_TENSORS; i++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.weight", il, layer_suffixes[i]);
                if (!find_tensor(m, name)) return missing(m, name);
            }
        }
    }
    m->layers = calloc(c->n_layer > 0 ? (size_t)c->n_layer : 1, sizeof *m->layers);
    if (!m->layers) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: layer table", m->path);
    for (int32_t il = 0; il < c->n_layer; il++) {
        tri__layer *L = &m->layers[il];
        // shapes in layer_suffixes' order
        const struct {
            int32_t n_dims;
            cfg_dim d0, d1;
            const tri__tensor **slot;
        } want[N_LAYER_TENSORS] = {
            {1, CFG_DIM_EMBD, 0, &L->attn_norm},
            {2, CFG_DIM_Q, CFG_DIM_EMBD, &L->wq},
            {2, CFG_DIM_KV, CFG_DIM_EMBD, &L->wk},
            {2, CFG_DIM_KV, CFG_DIM_EMBD, &L->wv},
            {2, CFG_DIM_EMBD, CFG_DIM_Q, &L->wo},
            {1, CFG_DIM_EMBD, 0, &L->ffn_norm},
            {2, CFG_DIM_FF, CFG_DIM_EMBD, &L->w_gate},
            {2, CFG_DIM_FF, CFG_DIM_EMBD, &L->w_up},
            {2, CFG_DIM_EMBD, CFG_DIM_FF, &L->w_down},
        };
        for (size_t i = 0; i < N_LAYER_TENSORS; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, layer_suffixes[i]);
            if ((st = bind(m, name, want[i].n_dims, want[i].d0, want[i].d1, want[i].slot))) return st;
        }
        // q, k, v biases (qwen2; attention_bias), and o's (attention_bias)
        int n_bias = m->fdata.attn_bias ? 4 : m->family->qkv_bias ? 3 : 0;
        if (n_bias) {
            static const char *const bias[4] = {"attn_q", "attn_k", "attn_v", "attn_output"};
            static const cfg_dim dim[4] = {CFG_DIM_Q, CFG_DIM_KV, CFG_DIM_KV, CFG_DIM_EMBD};
            const tri__tensor **slot[4] = {&L->bq, &L->bk, &L->bv, &L->bo};
            for (int i = 0; i < n_bias; i++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.bias", il, bias[i]);
                if ((st = bind(m, name, 1, dim[i], 0, slot[i]))) return st;
                if ((*slot[i])->type != TRI_DTYPE_F32)  // made f32 at load (prepare_family)
                    return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': type %s, want f32",
                                     (*slot[i])->file, (*slot[i])->source, tri_dtype_name((*slot[i])->type));
            }
        }
        // the norms of the attention's and the FFN's outputs (gemma2)
        if (m->family->post_norms) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", il);
            if ((st = bind(m, name, 1, CFG_DIM_EMBD, 0, &L->post_attn_norm))) return st;
            snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", il);
            if ((st = bind(m, name, 1, CFG_DIM_EMBD, 0, &L->post_ffn_norm))) return st;
        }
        // every query and key head's RMSNorm (qwen3)
        if (m->family->qk_norm) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", il);
            if ((st = bind(m, name, 1, CFG_DIM_HEAD, 0, &L->q_norm))) return st;
            snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", il);
            if ((st = bind(m, name, 1, CFG_DIM_HEAD, 0, &L->k_norm))) return st;
        }
    }
    return check_all_bound(m);
}

// ---- what the family stores differently ----

// Appends an entry to the tensor table (pointers into it are taken only after this).
static tri_status append_tensor(tri_model *m, const tri__tensor *t) {
    tri__tensor *n = realloc(m->tensors, sizeof *n * (size_t)(m->n_tensors + 1));
    if (!n) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor table", m->path);
    m->tensors = n;
    m->tensors[m->n_tensors++] = *t;
    return TRI_STATUS_OK;
}

// A buffer the model frees with itself.
static void *own(tri_model *m, size_t bytes) {
    void **o = realloc(m->owned, sizeof *o * (size_t)(m->n_owned + 1));
    if (!o) return NULL;
    m->owned = o;
    void *p = malloc(bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

// Splits the fused matrix `fused` (canonical name) of layer il into rows: parts[i] gets rows[i]
// rows under name blk.il.parts[i].weight; the fused entry is renamed to `rename` and marked bound.
static tri_status split_rows(tri_model *m, int32_t il, const char *fused, const char *rename, int n_parts,
                             const char *const *parts, const int64_t *rows, const char *rows_what) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, fused);
    int64_t idx = -1;
    for (int64_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) idx = i;
    if (idx < 0) return missing(m, name);
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) total += rows[i];
    tri__tensor *t = &m->tensors[idx];
    if (t->n_dims != 2 || t->shape[0] != total || t->shape[1] != m->config.n_embd)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': shape (%lld, %lld), want (%lld, %d): %s", t->file,
                         t->source, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                         (long long)total, (int)m->config.n_embd, rows_what);
    uint64_t row_bytes = t->n_bytes / (uint64_t)total;
    char *renamed = malloc(strlen(name) + 32);
    if (!renamed) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor names", m->path);
    snprintf(renamed, strlen(name) + 32, "blk.%d.%s.weight", il, rename);
    free((char *)t->name);
    t->name = renamed;
    t->bound = true;
    tri__tensor whole = *t;
    int64_t row0 = 0;
    for (int i = 0; i < n_parts; i++) {
        tri__tensor p = whole;
        char pn[64];
        snprintf(pn, sizeof pn, "blk.%d.%s.weight", il, parts[i]);
        p.name = dup_str(pn, strlen(pn));
        if (!p.name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor names", m->path);
        p.shape[0] = rows[i];
        p.n_bytes = row_bytes * (uint64_t)rows[i];
        p.data = (const char *)whole.data + row_bytes * (uint64_t)row0;
        p.offset = whole.offset + row_bytes * (uint64_t)row0;
        p.slice = true;
        p.bound = false;
        row0 += rows[i];
        tri_status st = append_tensor(m, &p);
        if (st) {
            free((char *)p.name);
            return st;
        }
    }
    return TRI_STATUS_OK;
}

// Replaces t's data by an f32 copy plus `add` (Gemma's HF norms: 1 + w; biases: + 0).
static tri_status to_f32_plus(tri_model *m, tri__tensor *t, float add) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    if (t->type != TRI_DTYPE_F32 && t->type != TRI_DTYPE_F16 && t->type != TRI_DTYPE_BF16)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': type %s, want f32, f16 or bf16", t->file,
                         t->source, tri_dtype_name(t->type));
    float *f = own(m, sizeof *f * (size_t)n);
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor '%s'", t->file, t->source);
    for (int64_t i = 0; i < n; i++) {
        float x = t->type == TRI_DTYPE_F32   ? ((const float *)t->data)[i]
                  : t->type == TRI_DTYPE_F16 ? tri__f16_to_f32(((const uint16_t *)t->data)[i])
                                             : tri__bf16_to_f32(((const uint16_t *)t->data)[i]);
        f[i] = x + add;
    }
    t->data = f;
    t->type = TRI_DTYPE_F32;
    t->n_bytes = sizeof *f * (uint64_t)n;
    t->computed = true;
    return TRI_STATUS_OK;
}

// Brings the family's tensors to the slots the forward pass reads: fused matrices split into row
// views, (1 + w) norms of HF checkpoints and non-f32 biases computed in f32, LongRoPE factor
// tensors taken (their values are in fdata).
static tri_status prepare_family(tri_model *m) {
    const tri__family *f = m->family;
    const tri_model_config *c = &m->config;
    tri_status st;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        tri__tensor *t = &m->tensors[i];
        if (strcmp(t->name, "rope_factors_long.weight") == 0 || strcmp(t->name, "rope_factors_short.weight") == 0)
            t->bound = m->fdata.rope_long != NULL;  // read into fdata; refused as unknown otherwise
        bool norm = has_suffix(t->name, "_norm.weight");
        if (f->norm_plus_one && m->config_path && norm && (st = to_f32_plus(m, t, 1.0f))) return st;
        bool bias = (f->qkv_bias || m->fdata.attn_bias) && has_suffix(t->name, ".bias");
        if (bias && t->type != TRI_DTYPE_F32 && (st = to_f32_plus(m, t, 0.0f))) return st;
    }
    for (int32_t il = 0; il < c->n_layer && (f->fused_qkv || f->fused_gate_up); il++) {
        if (f->fused_qkv) {
            static const char *const parts[3] = {"attn_q", "attn_k", "attn_v"};
            int64_t rows[3] = {(int64_t)c->n_head * c->head_dim, (int64_t)c->n_head_kv * c->head_dim,
                               (int64_t)c->n_head_kv * c->head_dim};
            if ((st = split_rows(m, il, "attn_qkv", "attn_qkv", 3, parts, rows,
                                 "q, k and v rows (heads x head_dim, twice kv heads x head_dim)")))
                return st;
        }
        if (f->fused_gate_up) {
            static const char *const parts[2] = {"ffn_gate", "ffn_up"};
            int64_t rows[2] = {c->n_ff, c->n_ff};
            if ((st = split_rows(m, il, "ffn_up", "ffn_gate_up", 2, parts, rows, "gate and up rows (2 x n_ff)")))
                return st;
        }
    }
    return TRI_STATUS_OK;
}

// A tokenizer with more tokens than the embedding has rows would hand the forward pass ids it
// cannot look up.
static tri_status check_vocab(const tri_model *m) {
    int32_t n_tok = tri__tokenizer_n_vocab(m->tokenizer);
    if (n_tok <= m->config.n_vocab) return TRI_STATUS_OK;
    char vocab[160];
    describe_dim(m, CFG_DIM_VOCAB, vocab, sizeof vocab);
    if (!m->config_path)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.tokens': %d tokens, more than %s",
                         m->path, n_tok, vocab);
    // the file tri__tokenizer_from_dir read: tokenizer.json, else tokenizer.model
    const char *dir = tri__st_model_dir(m->st);
    char tok_path[4200];
    struct stat sb;
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    if (stat(tok_path, &sb) != 0) snprintf(tok_path, sizeof tok_path, "%s/tokenizer.model", dir);
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %d tokens, more than %s in %s", tok_path, n_tok, vocab,
                     m->config_path);
}

// ---- GGUF ----

// A tokenizer this runtime does not support leaves the model usable with token ids: warn and go
// on without one. Any other failure (a broken file) fails the load.
static tri_status keep_tokenizer(tri_model *m, tri_status st) {
    if (st == TRI_STATUS_UNSUPPORTED) {
        tri__log(TRI_LOG_LEVEL_WARN, "%s: continuing without a tokenizer: %s", m->path,
                 tri_last_error());
        return TRI_STATUS_OK;
    }
    if (st == TRI_STATUS_OK) m->info.tokenizer = tri__tokenizer_kind(m->tokenizer);
    return st;
}

static tri_status load_gguf(tri_model *m, const tri_model_params *params) {
    tri_status st = tri__gguf_open(m->path, &m->gguf);
    if (st) return st;
    const tri__gguf *g = m->gguf;
    if ((st = tri__gguf_family_config(g, &m->config, &m->family, &m->fdata))) return st;

    tri__gguf_str s;
    m->arch = tri__gguf_get_str(g, "general.architecture", &s) == TRI_STATUS_OK
                  ? dup_str(s.ptr, s.len) : dup_str("llama", 5);
    m->name = tri__gguf_get_str(g, "general.name", &s) == TRI_STATUS_OK ? dup_str(s.ptr, s.len)
                                                                         : dup_str("", 0);
    if (!m->arch || !m->name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: names", m->path);

    int64_t n = tri__gguf_n_tensors(g);
    m->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *m->tensors);
    if (!m->tensors) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor table", m->path);
    for (int64_t i = 0; i < n; i++) {
        const tri__gguf_tensor *gt = tri__gguf_tensor_at(g, i);
        tri__tensor *t = &m->tensors[i];
        t->name = dup_str(gt->name.ptr, gt->name.len);
        if (!t->name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor names", m->path);
        t->type = gt->type;
        t->n_dims = gt->n_dims;
        memcpy(t->shape, gt->shape, sizeof t->shape);
        t->n_bytes = gt->n_bytes;
        t->data = gt->data;
        t->source = t->name;
        t->file = m->path;
        t->offset = tri__gguf_data_start(g) + gt->offset;
        m->n_tensors = i + 1;
        if ((i & 63) == 0 && !progress(params, 0.5f * (float)i / (float)n))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: loading cancelled", m->path);
    }
    m->info.format = TRI_FILE_FORMAT_GGUF;
    m->info.n_files = 1;
    if (tri__gguf_find(g, "tokenizer.ggml.model"))
        return keep_tokenizer(m, tri__tokenizer_from_gguf(g, &m->tokenizer));
    return TRI_STATUS_OK;
}

// ---- HF checkpoints (safetensors + config.json) ----

static tri_status load_hf(tri_model *m, const tri_model_params *params) {
    tri_status st = tri__st_model_open(m->path, params->populate, &m->st);
    if (st) return st;
    const char *dir = tri__st_model_dir(m->st);
    char cfg_path[4096];
    if (snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir) >= (int)sizeof cfg_path)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    m->config_path = dup_str(cfg_path, strlen(cfg_path));
    if (!m->config_path) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: names", m->path);
    if ((st = tri__hf_config_load_family(cfg_path, &m->config, &m->arch, &m->family, &m->fdata))) return st;
    // the directory's last component names the model
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    m->name = dup_str(base, strlen(base));
    if (!m->name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: names", m->path);

    int64_t n = tri__st_model_n_tensors(m->st);
    m->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *m->tensors);
    if (!m->tensors) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor table", m->path);
    for (int64_t i = 0; i < n; i++) {
        const tri__st_tensor *t = tri__st_model_tensor_at(m->st, i);
        const tri__st_file *sf = tri__st_model_file_at(m->st, t->file);
        const char *file = tri__st_file_path(sf);
        char name[128];
        if (!tri__hf_tensor_name_to_gguf_family(t->name, m->family->post_norms, name, sizeof name)) {
            // older checkpoints store the rotary table, which is computed, not a weight
            if (has_suffix(t->name, "rotary_emb.inv_freq")) {
                tri__log(TRI_LOG_LEVEL_DEBUG, "%s: ignoring tensor '%s'", file, t->name);
                continue;
            }
            return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': not a weight of the %s architecture", file,
                             t->name, m->family->name);
        }
        const tri__tensor *dup = tri__model_find_tensor(m, name);
        if (dup)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': the same weight as '%s' in %s",
                             file, t->name, dup->source, dup->file);
        tri__tensor *d = &m->tensors[m->n_tensors];
        d->name = dup_str(name, strlen(name));
        if (!d->name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor names", m->path);
        d->type = t->type;
        d->n_dims = t->n_dims;
        memcpy(d->shape, t->shape, sizeof d->shape);
        d->n_bytes = t->n_bytes;
        d->data = t->data;
        d->source = t->name;
        d->file = file;
        d->offset = tri__st_file_data_start(sf) + t->offset;
        m->n_tensors++;
        if ((i & 63) == 0 && !progress(params, 0.5f * (float)i / (float)n))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: loading cancelled", m->path);
    }
    // some checkpoints tie embeddings without saying so in config.json: no lm_head means tied (where
    // transformers would start a head at random, and say so)
    if (!m->config.tied_embeddings && !tri__model_find_tensor(m, "output.weight")) {
        tri__log(TRI_LOG_LEVEL_WARN,
                 "%s: field 'tie_word_embeddings': false, but there is no lm_head.weight: the head is the embedding",
                 m->config_path);
        m->config.tied_embeddings = true;
    }
    m->info.format = TRI_FILE_FORMAT_SAFETENSORS;
    m->info.n_files = tri__st_model_n_files(m->st);
    if (tri__tokenizer_in_dir(dir))
        return keep_tokenizer(m, tri__tokenizer_from_dir(dir, &m->tokenizer));
    return TRI_STATUS_OK;
}

// ---- public API ----

tri_model_params tri_model_default_params(void) {
    tri_model_params p = {0};
    return p;
}

void tri_model_free(tri_model *model) {
    if (!model) return;
    for (int64_t i = 0; i < model->n_tensors; i++) free((char *)model->tensors[i].name);
    free(model->tensors);
    free(model->layers);
    for (int32_t i = 0; i < model->n_owned; i++) free(model->owned[i]);
    free(model->owned);
    tri__family_data_free(&model->fdata);
    tri__tokenizer_free(model->tokenizer);
    tri__gguf_close(model->gguf);
    tri__st_model_close(model->st);
    free(model->arch);
    free(model->name);
    free(model->path);
    free(model->config_path);
    free(model);
}

tri_status tri_model_load(const char *path, const tri_model_params *params, tri_model **out_model) {
    if (out_model) *out_model = NULL;
    if (!path || !out_model) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_model_load: NULL argument");
    tri_model_params defaults = tri_model_default_params();
    if (!params) params = &defaults;

    struct stat sb;
    if (stat(path, &sb) != 0)
        return tri__fail(errno == ENOENT ? TRI_STATUS_NOT_FOUND : TRI_STATUS_IO, "%s: cannot open: %s", path,
                         strerror(errno));

    tri_model *m = calloc(1, sizeof *m);
    if (!m) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: model", path);
    tri_status st = TRI_STATUS_OK;
    m->path = dup_str(path, strlen(path));
    if (!m->path) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: model", path);
        goto fail;
    }

    bool hf = S_ISDIR(sb.st_mode) || has_suffix(path, ".safetensors") || has_suffix(path, ".json");
    if ((st = hf ? load_hf(m, params) : load_gguf(m, params))) goto fail;
    if ((st = prepare_family(m))) goto fail;
    if ((st = bind_all(m))) goto fail;

    if (m->tokenizer && (st = check_vocab(m))) goto fail;

    m->info.architecture = m->arch;
    m->info.name = m->name;
    m->info.config = m->config;
    m->info.n_tensors = m->n_tensors;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const tri__tensor *t = &m->tensors[i];
        if (t->slice) continue;  // counted as the fused matrix
        int64_t elems = 1;
        for (int d = 0; d < t->n_dims; d++) elems *= t->shape[d];
        m->info.n_params += elems;
        m->info.n_bytes += t->n_bytes;
    }
    if (!progress(params, 1.0f)) {
        st = tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: loading cancelled", path);
        goto fail;
    }
    *out_model = m;
    return TRI_STATUS_OK;

fail:
    tri_model_free(m);
    return st;
}

void tri_model_get_info(const tri_model *model, tri_model_info *out) {
    if (!out) return;
    if (model) *out = model->info;
    else memset(out, 0, sizeof *out);
}

tri_status tri_model_tensor_info(const tri_model *model, int64_t i, tri_tensor_info *out) {
    if (!model || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_model_tensor_info: NULL argument");
    if (i < 0 || i >= model->n_tensors)
        return tri__fail(TRI_STATUS_NOT_FOUND, "%s: tensor %lld: index out of range (%lld tensors)",
                         model->path, (long long)i, (long long)model->n_tensors);
    const tri__tensor *t = &model->tensors[i];
    out->name = t->name;
    out->type = t->type;
    out->n_dims = t->n_dims;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->n_bytes = t->n_bytes;
    return TRI_STATUS_OK;
}
