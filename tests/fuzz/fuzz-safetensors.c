// fuzz-safetensors.c - libFuzzer target for the safetensors file parser and the shard index.
//
// An input starting with '{' is parsed as a model.safetensors.index.json; anything else as a
// .safetensors file image. Whatever parses must be safe to walk: every tensor's bytes are read
// (ASan catches a byte outside the fuzzer's exactly sized buffer) and every name found again.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    if (size > 0 && data[0] == '{') {
        tri__st_index *idx = NULL;
        if (tri__st_index_parse("fuzz.json", (const char *)data, size, &idx) == TRI_STATUS_OK) {
            for (int64_t i = 0; i < tri__st_index_n_entries(idx); i++) {
                const tri__st_index_entry *e = tri__st_index_entry_at(idx, i);
                TRI_ASSERT(e && e->file[0] && !strchr(e->file, '/') && !strstr(e->file, ".."));
                TRI_ASSERT(strlen(e->tensor) < size);
            }
            tri__st_index_free(idx);
        }
        return 0;
    }
    tri__st_file *f = NULL;
    if (tri__st_file_from_memory("fuzz.safetensors", data, size, &f) != TRI_STATUS_OK) {
        TRI_ASSERT(f == NULL);
        return 0;
    }
    const uint8_t *end = data + size;
    uint64_t covered = 0;
    unsigned sum = 0;
    for (int64_t i = 0; i < tri__st_file_n_tensors(f); i++) {
        const tri__st_tensor *t = tri__st_file_tensor_at(f, i);
        TRI_ASSERT(t->n_dims >= 0 && t->n_dims <= 4);
        TRI_ASSERT((const uint8_t *)t->data >= data && t->n_bytes <= (uint64_t)(end - (const uint8_t *)t->data));
        if (t->n_bytes > 0) {
            sum += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->n_bytes - 1];
        }
        TRI_ASSERT(tri__st_file_find(f, t->name) == t);
        covered += t->n_bytes;
    }
    TRI_ASSERT(covered == tri__st_file_data_size(f));
    for (int64_t i = 0; i < tri__st_file_n_meta(f); i++) {
        const tri__st_meta *m = tri__st_file_meta_at(f, i);
        TRI_ASSERT(tri__st_file_meta_find(f, m->key) != NULL);
    }
    tri__st_file_close(f);
    return (int)(sum & 0);
}
