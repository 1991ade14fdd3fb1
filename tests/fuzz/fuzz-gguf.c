// fuzz-gguf.c - libFuzzer target for the GGUF reader: the input becomes a file (a memfd, reached
// through /proc/self/fd so the real open/fstat/mmap path runs), then every accessor is touched.
// A file that parses also goes through what reads it next: the llama config reader, the GGUF
// tokenizer loader (whose tokenizer is then exercised like the other tokenizer targets'), and
// tri_model_load, which binds the tensors to the config.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "fuzz-tokenizer.h"
#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

// Reads every byte of a value so that ASan sees any pointer that escapes the mapping.
static uint64_t touch_value(const tri__gguf_value *v) {
    uint64_t h = (uint64_t)v->type;
    switch (v->type) {
    case TRI_GGUF_TYPE_STRING:
        for (uint64_t i = 0; i < v->str.len; i++) h = h * 31 + (uint8_t)v->str.ptr[i];
        break;
    case TRI_GGUF_TYPE_ARRAY:
        for (uint64_t i = 0; i < v->arr.n; i++) h += touch_value(&v->arr.items[i]);
        break;
    case TRI_GGUF_TYPE_FLOAT32:
    case TRI_GGUF_TYPE_FLOAT64:
        h += v->f == v->f;
        break;
    case TRI_GGUF_TYPE_BOOL:
        h += v->b;
        break;
    default:
        h += v->u;
        break;
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    int fd = memfd_create("fuzz-gguf", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    tri__gguf *g = NULL;
    if (tri__gguf_open(path, &g) == TRI_STATUS_OK) {
        volatile uint64_t sink = tri__gguf_version(g) + tri__gguf_alignment(g) +
                                 tri__gguf_file_size(g) + tri__gguf_data_start(g);
        char name[256];
        for (int64_t i = 0; i < tri__gguf_n_kv(g); i++) {
            const tri__gguf_kv *kv = tri__gguf_kv_at(g, i);
            sink += touch_value(&kv->value);
            if (kv->key.len < sizeof name && !memchr(kv->key.ptr, 0, kv->key.len)) {
                memcpy(name, kv->key.ptr, kv->key.len);
                name[kv->key.len] = 0;
                if (tri__gguf_find(g, name) != &kv->value) __builtin_trap();
                uint32_t u;
                float f;
                bool b;
                tri__gguf_str s;
                const tri__gguf_value *a;
                sink += (uint64_t)tri__gguf_get_u32(g, name, &u) + (uint64_t)tri__gguf_get_f32(g, name, &f) +
                        (uint64_t)tri__gguf_get_bool(g, name, &b) + (uint64_t)tri__gguf_get_str(g, name, &s);
                sink += (uint64_t)tri__gguf_get_arr(g, name, TRI_GGUF_TYPE_UINT8, &a);
            }
        }
        for (int64_t i = 0; i < tri__gguf_n_tensors(g); i++) {
            const tri__gguf_tensor *t = tri__gguf_tensor_at(g, i);
            const uint8_t *p = t->data;
            // first and last byte: both must lie inside the mapping
            if (t->n_bytes) sink += p[0] + p[t->n_bytes - 1];
            sink += (uint64_t)t->shape[0] + (uint64_t)t->type;
            if (t->name.len < sizeof name && !memchr(t->name.ptr, 0, t->name.len)) {
                memcpy(name, t->name.ptr, t->name.len);
                name[t->name.len] = 0;
                if (tri__gguf_find_tensor(g, name) != t) __builtin_trap();
            }
        }
        tri_model_config cfg;
        if (tri__gguf_llama_config(g, &cfg) == TRI_STATUS_OK) {
            // what every consumer of the config relies on
            TRI_ASSERT(cfg.n_vocab > 0 && cfg.n_embd > 0 && cfg.n_ff > 0 && cfg.n_layer > 0);
            TRI_ASSERT(cfg.n_head > 0 && cfg.n_head_kv > 0 && cfg.n_head % cfg.n_head_kv == 0);
            TRI_ASSERT(cfg.head_dim > 0 && cfg.head_dim % 2 == 0 && cfg.n_ctx_train > 0);
            TRI_ASSERT(cfg.rms_eps > 0 && cfg.rope_theta > 0 && cfg.rope_factor > 0);
            TRI_ASSERT(cfg.rope_scaling != TRI_ROPE_SCALING_YARN || cfg.rope_orig_ctx > 0);
        }
        tri__tokenizer *tok = NULL;
        if (tri__tokenizer_from_gguf(g, &tok) == TRI_STATUS_OK) {
            TRI_ASSERT(tok != NULL);
            fuzz_tokenizer_exercise(tok, data, size);
        } else {
            TRI_ASSERT(tok == NULL);
        }
        (void)sink;
        tri__gguf_close(g);

        // the whole load: config, tensor table, tokenizer, binding to the config
        tri_model *model = NULL;
        if (tri_model_load(path, NULL, &model) == TRI_STATUS_OK) {
            tri_model_info info;
            tri_model_get_info(model, &info);
            TRI_ASSERT(info.n_tensors > 0 && info.config.n_layer > 0);
            tri_model_free(model);
        } else {
            TRI_ASSERT(model == NULL);
        }
    }
    close(fd);
    return 0;
}
