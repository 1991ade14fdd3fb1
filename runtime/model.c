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

// Looks up a required tensor and checks its shape (outermost first; n_dims entries) and that its
// type is one the kernels take: any type for matrices, a float type for vectors.
static tri_status bind(tri_model *m, const char *name, int32_t n_dims, int64_t d0, int64_t d1,
                       const tri__tensor **out) {
    const tri__tensor *t = tri__model_find_tensor(m, name);
    if (!t) return tri__fail(TRI_STATUS_NOT_FOUND, "%s: tensor '%s' is missing", m->path, name);
    // A vector may be stored as (1, n) by some writers; a matrix must be 2-D.
    int64_t want[2] = {d0, d1};
    bool ok;
    if (n_dims == 1)
        ok = (t->n_dims == 1 && t->shape[0] == d0) ||
             (t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == d0);
    else
        ok = t->n_dims == 2 && t->shape[0] == want[0] && t->shape[1] == want[1];
    if (!ok) {
        char got[96];
        int len = snprintf(got, sizeof got, "(");
        for (int i = 0; i < t->n_dims && len < (int)sizeof got - 24; i++)
            len += snprintf(got + len, sizeof got - (size_t)len, "%s%lld", i ? ", " : "",
                            (long long)t->shape[i]);
        snprintf(got + len, sizeof got - (size_t)len, ")");
        if (n_dims == 1)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': shape %s, config wants (%lld)",
                             m->path, name, got, (long long)d0);
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%s': shape %s, config wants (%lld, %lld)", m->path, name, got,
                         (long long)d0, (long long)d1);
    }
    if (n_dims == 1 && tri__dtype_is_quantized(t->type))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%s': type %s for a vector, want f32/f16/bf16",
                         m->path, name, tri_dtype_name(t->type));
    *out = t;
    return TRI_STATUS_OK;
}

static tri_status bind_all(tri_model *m) {
    const tri_model_config *c = &m->config;
    int64_t q_rows = (int64_t)c->n_head * c->head_dim;
    int64_t kv_rows = (int64_t)c->n_head_kv * c->head_dim;
    tri_status st;

    if ((st = bind(m, "token_embd.weight", 2, c->n_vocab, c->n_embd, &m->tok_embd))) return st;
    if ((st = bind(m, "output_norm.weight", 1, c->n_embd, 0, &m->output_norm))) return st;
    if (c->tied_embeddings) {
        m->output = m->tok_embd;
    } else if ((st = bind(m, "output.weight", 2, c->n_vocab, c->n_embd, &m->output))) {
        return st;
    }
    m->rope_freqs = NULL;
    if (c->has_rope_freqs) {
        if ((st = bind(m, "rope_freqs.weight", 1, c->head_dim / 2, 0, &m->rope_freqs))) return st;
        if (m->rope_freqs->type != TRI_DTYPE_F32)
            return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor 'rope_freqs.weight': type %s, want f32",
                             m->path, tri_dtype_name(m->rope_freqs->type));
    }

    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: layer table", m->path);
    for (int32_t il = 0; il < c->n_layer; il++) {
        tri__layer *L = &m->layers[il];
        const struct {
            const char *suffix;
            int32_t n_dims;
            int64_t d0, d1;
            const tri__tensor **slot;
        } want[] = {
            {"attn_norm", 1, c->n_embd, 0, &L->attn_norm},
            {"attn_q", 2, q_rows, c->n_embd, &L->wq},
            {"attn_k", 2, kv_rows, c->n_embd, &L->wk},
            {"attn_v", 2, kv_rows, c->n_embd, &L->wv},
            {"attn_output", 2, c->n_embd, q_rows, &L->wo},
            {"ffn_norm", 1, c->n_embd, 0, &L->ffn_norm},
            {"ffn_gate", 2, c->n_ff, c->n_embd, &L->w_gate},
            {"ffn_up", 2, c->n_ff, c->n_embd, &L->w_up},
            {"ffn_down", 2, c->n_embd, c->n_ff, &L->w_down},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, want[i].suffix);
            if ((st = bind(m, name, want[i].n_dims, want[i].d0, want[i].d1, want[i].slot))) return st;
        }
    }
    return TRI_STATUS_OK;
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
    if ((st = tri__gguf_llama_config(g, &m->config))) return st;

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
    if ((st = tri__hf_config_load(cfg_path, &m->config, &m->arch))) return st;
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
        char name[128];
        // tensors that are not Llama weights (rotary_emb.inv_freq, ...) are not the model's
        if (!tri__hf_tensor_name_to_gguf(t->name, name, sizeof name)) {
            tri__log(TRI_LOG_LEVEL_DEBUG, "%s: ignoring tensor '%s'", m->path, t->name);
            continue;
        }
        if (tri__model_find_tensor(m, name))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s' appears twice (as '%s')", m->path,
                             name, t->name);
        tri__tensor *d = &m->tensors[m->n_tensors];
        d->name = dup_str(name, strlen(name));
        if (!d->name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor names", m->path);
        d->type = t->type;
        d->n_dims = t->n_dims;
        memcpy(d->shape, t->shape, sizeof d->shape);
        d->n_bytes = t->n_bytes;
        d->data = t->data;
        m->n_tensors++;
        if ((i & 63) == 0 && !progress(params, 0.5f * (float)i / (float)n))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "%s: loading cancelled", m->path);
    }
    // some checkpoints tie embeddings without saying so in config.json: no lm_head means tied
    if (!m->config.tied_embeddings && !tri__model_find_tensor(m, "output.weight"))
        m->config.tied_embeddings = true;
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
    tri__tokenizer_free(model->tokenizer);
    tri__gguf_close(model->gguf);
    tri__st_model_close(model->st);
    free(model->arch);
    free(model->name);
    free(model->path);
    free(model);
}

tri_status tri_model_load(const char *path, const tri_model_params *params, tri_model **out_model) {
    if (!path || !out_model) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_model_load: NULL argument");
    *out_model = NULL;
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
    if ((st = bind_all(m))) goto fail;

    if (m->tokenizer && tri__tokenizer_n_vocab(m->tokenizer) > m->config.n_vocab) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tokenizer has %d tokens, the model's vocabulary only %d",
                       path, tri__tokenizer_n_vocab(m->tokenizer), m->config.n_vocab);
        goto fail;
    }

    m->info.architecture = m->arch;
    m->info.name = m->name;
    m->info.config = m->config;
    m->info.n_tensors = m->n_tensors;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const tri__tensor *t = &m->tensors[i];
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

void tri_model_get_info(const tri_model *model, tri_model_info *out) { *out = model->info; }

tri_status tri_model_tensor_info(const tri_model *model, int64_t i, tri_tensor_info *out) {
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
