// model-synthetic.c - a Llama model of any shape with seeded weights, built in memory.
//
// For benchmarks of shapes whose real weights we cannot ship (Llama2-7B-128K): the forward pass
// does the same work on any values, so timings are real while outputs are meaningless.
#include "model-synthetic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dtype.h"
#include "error.h"
#include "model.h"

// The model and the one allocation holding every tensor's data.
typedef struct synthetic_model {
    tri_model m;  // first: a tri_model * to it is a synthetic_model *
    void *data;
    size_t mapped;  // shape-only: data is an untouched mapping of this many bytes; 0: malloc'd
} synthetic_model;

// splitmix64: a fast, well-mixed sequence from a seed.
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [-a, a).
static float uniform(uint64_t *s, float a) { return a * ((float)(mix(s) >> 40) * (2.0f / 16777216.0f) - 1.0f); }

// Fills n_bytes of a tensor of type with values of magnitude about a. Matrices are filled with a
// short random period repeated (4096 values), so building a 7B model takes seconds, not minutes;
// the forward pass's cost does not depend on the values.
static void fill(void *dst, tri_dtype type, int64_t n_elems, uint64_t n_bytes, float a, uint64_t seed) {
    uint64_t s = seed;
    if (type == TRI_DTYPE_F32 && n_elems <= 65536) {  // norms: near 1, every value drawn
        float *f = dst;
        for (int64_t i = 0; i < n_elems; i++) f[i] = 1.0f + uniform(&s, 0.1f);
        return;
    }
    unsigned char period[8192];
    size_t plen = sizeof period;
    switch (type) {
    case TRI_DTYPE_F32:
        for (size_t i = 0; i < plen / 4; i++) ((float *)period)[i] = uniform(&s, a);
        break;
    case TRI_DTYPE_F16:
        for (size_t i = 0; i < plen / 2; i++) ((uint16_t *)period)[i] = tri__f32_to_f16(uniform(&s, a));
        break;
    case TRI_DTYPE_BF16:
        for (size_t i = 0; i < plen / 2; i++) ((uint16_t *)period)[i] = tri__f32_to_bf16(uniform(&s, a));
        break;
    default: {  // quantized blocks: random bytes, then a small finite scale (and min) per block
        size_t bb = (size_t)tri__dtype_block_bytes(type);
        plen = plen / bb * bb;
        for (size_t i = 0; i < plen; i++) period[i] = (unsigned char)mix(&s);
        // where the f16 scale and minimum (or a second f16 scale) sit in a block, -1 none
        int d_at = 0, m_at = type == TRI_DTYPE_Q4_1 || type == TRI_DTYPE_Q5_1 ? 2 : -1;
        float d_val = a / 64.0f;
        switch (type) {
        case TRI_DTYPE_Q2_K: d_at = 80, m_at = 82; break;
        case TRI_DTYPE_Q3_K: d_at = 108; break;
        case TRI_DTYPE_Q4_K:
        case TRI_DTYPE_Q5_K: m_at = 2, d_val = a / 1024.0f; break;
        case TRI_DTYPE_Q6_K: d_at = 208, d_val = a / 4096.0f; break;
        case TRI_DTYPE_IQ4_NL: d_val = a / 128.0f; break;
        case TRI_DTYPE_IQ4_XS: d_val = a / 4096.0f; break;
        default: break;
        }
        for (size_t b = 0; b < plen; b += bb) {
            uint16_t d = tri__f32_to_f16(d_val);
            memcpy(period + b + d_at, &d, 2);
            if (m_at >= 0) {
                uint16_t mn = tri__f32_to_f16(type >= TRI_DTYPE_Q2_K ? d_val * 16.0f : -a / 2.0f);
                memcpy(period + b + m_at, &mn, 2);
            }
        }
        break;
    }
    }
    for (uint64_t off = 0; off < n_bytes; off += plen) {
        uint64_t n = n_bytes - off < plen ? n_bytes - off : plen;
        memcpy((char *)dst + off, period, (size_t)n);
    }
}

void tri__model_synthetic_free(tri_model *model) {
    if (!model) return;
    synthetic_model *sm = (synthetic_model *)model;
    for (int64_t i = 0; i < model->n_tensors; i++) free((char *)model->tensors[i].name);
    free(model->tensors);
    free(model->layers);
    free(model->path);
    free(model->name);
    free(model->arch);
    if (sm->mapped) munmap(sm->data, sm->mapped);
    else free(sm->data);
    free(sm);
}

// Builds the model; shape_only: the weights are a read-only mapping never written (zeros, no
// memory behind them until read).
static tri_status build(const tri_model_config *config, tri_dtype weight_type, uint64_t seed, bool shape_only,
                        tri_model **out) {
    *out = NULL;
    const tri_model_config *c = config;
    if (c->n_layer <= 0 || c->n_embd <= 0 || c->n_ff <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 ||
        c->head_dim <= 0 || c->n_vocab <= 0 || c->n_head % c->n_head_kv != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "synthetic model: bad shape");
    if ((unsigned)weight_type >= TRI_DTYPE_COUNT)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "synthetic model: weight type %d", (int)weight_type);
    int64_t bs = tri__dtype_block_elems(weight_type);
    if (bs <= 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "synthetic model: weight type %s", tri_dtype_name(weight_type));
    if (c->n_embd % bs || c->n_ff % bs || ((int64_t)c->n_head * c->head_dim) % bs)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "synthetic model: sizes must be multiples of %s's block of %lld",
                         tri_dtype_name(weight_type), (long long)bs);
    synthetic_model *sm = calloc(1, sizeof *sm);
    if (!sm) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "synthetic model");
    tri_model *m = &sm->m;
    m->config = *c;
    m->config.tied_embeddings = false;
    m->info.config = m->config;
    m->path = strdup("(synthetic)");
    m->name = strdup("synthetic");
    m->arch = strdup("llama");
    const int64_t E = c->n_embd, F = c->n_ff, QD = (int64_t)c->n_head * c->head_dim,
                  KD = (int64_t)c->n_head_kv * c->head_dim;
    // per layer: attn_norm, q, k, v, o, ffn_norm, gate, up, down; then embeddings, norm, head
    const int64_t n_tensors = 9 * (int64_t)c->n_layer + 3;
    m->tensors = calloc((size_t)n_tensors, sizeof *m->tensors);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    tri_status st = TRI_STATUS_OK;
    if (!m->path || !m->name || !m->arch || !m->tensors || !m->layers) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "synthetic model: tables");
        goto fail;
    }
    struct {
        const char *name;
        tri_dtype type;
        int64_t rows, cols;
    } shapes[9] = {
        {"attn_norm", TRI_DTYPE_F32, 1, E}, {"attn_q", weight_type, QD, E},   {"attn_k", weight_type, KD, E},
        {"attn_v", weight_type, KD, E},     {"attn_output", weight_type, E, QD}, {"ffn_norm", TRI_DTYPE_F32, 1, E},
        {"ffn_gate", weight_type, F, E},    {"ffn_up", weight_type, F, E},    {"ffn_down", weight_type, E, F},
    };
    uint64_t total = 0;
    int64_t it = 0;
    for (int32_t il = 0; il <= c->n_layer; il++) {
        for (int j = 0; j < (il < c->n_layer ? 9 : 3); j++) {
            tri__tensor *t = &m->tensors[it++];
            char name[64];
            if (il < c->n_layer) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", il, shapes[j].name);
                t->type = shapes[j].type;
                t->shape[0] = shapes[j].rows;
                t->shape[1] = shapes[j].cols;
            } else {
                static const char *const tail[3] = {"token_embd.weight", "output_norm.weight", "output.weight"};
                snprintf(name, sizeof name, "%s", tail[j]);
                t->type = j == 1 ? TRI_DTYPE_F32 : weight_type;
                t->shape[0] = j == 1 ? 1 : c->n_vocab;
                t->shape[1] = E;
            }
            if (t->shape[0] == 1) {  // a norm: one dimension
                t->n_dims = 1;
                t->shape[0] = t->shape[1];
                t->shape[1] = 0;
            } else {
                t->n_dims = 2;
            }
            t->name = strdup(name);
            if (!t->name) {
                m->n_tensors = it;
                st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "synthetic model: names");
                goto fail;
            }
            int64_t elems = t->shape[0] * (t->n_dims == 2 ? t->shape[1] : 1);
            t->n_bytes = (uint64_t)(elems / tri__dtype_block_elems(t->type) * tri__dtype_block_bytes(t->type));
            total += (t->n_bytes + 63) / 64 * 64;
        }
    }
    m->n_tensors = n_tensors;
    if (shape_only) {
        void *p = mmap(NULL, (size_t)total, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            sm->data = p;
            sm->mapped = (size_t)total;
        }
    } else {
        sm->data = malloc((size_t)total);
    }
    if (!sm->data) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "synthetic model: %.1f GiB of weights", (double)total / (1 << 30));
        goto fail;
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        tri__tensor *t = &m->tensors[i];
        t->data = (char *)sm->data + off;
        int64_t cols = t->n_dims == 2 ? t->shape[1] : t->shape[0];
        int64_t elems = t->n_dims == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
        if (!shape_only) fill((void *)t->data, t->type, elems, t->n_bytes, 1.0f / (float)cols, seed + (uint64_t)i);
        off += (t->n_bytes + 63) / 64 * 64;
    }
    for (int32_t il = 0; il < c->n_layer; il++) {
        tri__tensor *t = &m->tensors[9 * (int64_t)il];
        m->layers[il] = (tri__layer){.attn_norm = &t[0],
                                     .wq = &t[1],
                                     .wk = &t[2],
                                     .wv = &t[3],
                                     .wo = &t[4],
                                     .ffn_norm = &t[5],
                                     .w_gate = &t[6],
                                     .w_up = &t[7],
                                     .w_down = &t[8]};
    }
    m->family = &tri__family_llama;
    m->tok_embd = &m->tensors[n_tensors - 3];
    m->output_norm = &m->tensors[n_tensors - 2];
    m->output = &m->tensors[n_tensors - 1];
    m->info.n_tensors = n_tensors;
    *out = m;
    return TRI_STATUS_OK;

fail:
    tri__model_synthetic_free(m);
    return st;
}

tri_status tri__model_synthetic(const tri_model_config *config, tri_dtype weight_type, uint64_t seed,
                                tri_model **out) {
    return build(config, weight_type, seed, false, out);
}

tri_status tri__model_synthetic_shape(const tri_model_config *config, tri_dtype weight_type, tri_model **out) {
    return build(config, weight_type, 0, true, out);
}
