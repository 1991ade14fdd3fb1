// gguf.h - read-only GGUF (v2, v3) reader over a private read-only mmap (internal).
//
// The whole file is validated at open: every length, count and offset is checked against the
// file size before it is used, so the accessors below never read out of bounds.
#ifndef TRI_GGUF_H
#define TRI_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

typedef enum tri__gguf_type {
    TRI_GGUF_TYPE_UINT8 = 0,
    TRI_GGUF_TYPE_INT8 = 1,
    TRI_GGUF_TYPE_UINT16 = 2,
    TRI_GGUF_TYPE_INT16 = 3,
    TRI_GGUF_TYPE_UINT32 = 4,
    TRI_GGUF_TYPE_INT32 = 5,
    TRI_GGUF_TYPE_FLOAT32 = 6,
    TRI_GGUF_TYPE_BOOL = 7,
    TRI_GGUF_TYPE_STRING = 8,
    TRI_GGUF_TYPE_ARRAY = 9,
    TRI_GGUF_TYPE_UINT64 = 10,
    TRI_GGUF_TYPE_INT64 = 11,
    TRI_GGUF_TYPE_FLOAT64 = 12,
} tri__gguf_type;

// A string inside the mapping: not NUL-terminated, may contain any bytes.
typedef struct tri__gguf_str {
    const char *ptr;
    uint64_t len;
} tri__gguf_str;

// One metadata value. Integers of every width are widened into u (unsigned types) or i (signed),
// floats into f. Arrays, nested ones included, are parsed into items owned by the reader.
typedef struct tri__gguf_value {
    tri__gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        tri__gguf_str str;
        struct {
            tri__gguf_type elem;                  // type of every item
            uint64_t n;
            const struct tri__gguf_value *items;  // n items
        } arr;
    };
} tri__gguf_value;

typedef struct tri__gguf_kv {
    tri__gguf_str key;
    tri__gguf_value value;
} tri__gguf_kv;

typedef struct tri__gguf_tensor {
    tri__gguf_str name;
    tri_dtype type;
    int32_t n_dims;      // 1..4
    int64_t shape[4];    // outermost first (GGUF stores innermost first; the reader reverses)
    uint64_t offset;     // from the start of the data section
    uint64_t n_bytes;
    const void *data;    // inside the mapping, aligned to general.alignment
} tri__gguf_tensor;

typedef struct tri__gguf tri__gguf;

// Maps and validates a file. Fails with TRI_STATUS_IO, BAD_FORMAT (bad magic, version, any
// length past the end, overlapping or misaligned tensors, ...) or UNSUPPORTED (a tensor type
// other than F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K..Q6_K/IQ4_NL/IQ4_XS, named in the message), the
// file path in every message.
//
// Requirements beyond the specification's (documented in docs/formats.md): every dimension >= 1,
// arrays nested at most 8 deep, bool values 0 or 1. Tensors may lie in any order in the data
// section as long as no two share a byte.
tri_status tri__gguf_open(const char *path, tri__gguf **out);
// As tri__gguf_open; populate reads every page in at open (MAP_POPULATE).
tri_status tri__gguf_open_ex(const char *path, bool populate, tri__gguf **out);
// Unmaps the file and frees everything; every pointer obtained from g dies with it. NULL is a no-op.
void tri__gguf_close(tri__gguf *g);

const char *tri__gguf_path(const tri__gguf *g);
uint32_t tri__gguf_version(const tri__gguf *g);
uint32_t tri__gguf_alignment(const tri__gguf *g);
uint64_t tri__gguf_file_size(const tri__gguf *g);
// File offset of the data section (a multiple of the alignment): tensor t lies at file offset
// data_start + t->offset, for readers that bypass the mapping (O_DIRECT, io_uring).
uint64_t tri__gguf_data_start(const tri__gguf *g);

int64_t tri__gguf_n_kv(const tri__gguf *g);
const tri__gguf_kv *tri__gguf_kv_at(const tri__gguf *g, int64_t i);
// The value of a key, or NULL when absent.
const tri__gguf_value *tri__gguf_find(const tri__gguf *g, const char *key);

// Typed getters. NOT_FOUND when absent (a caller with a default ignores that); BAD_FORMAT when the
// value has another type or does not fit, e.g. a negative int for get_u32. Integer getters accept
// any integer type whose value fits; get_f32 also accepts integers and float64.
tri_status tri__gguf_get_u32(const tri__gguf *g, const char *key, uint32_t *out);
tri_status tri__gguf_get_f32(const tri__gguf *g, const char *key, float *out);
tri_status tri__gguf_get_bool(const tri__gguf *g, const char *key, bool *out);
tri_status tri__gguf_get_str(const tri__gguf *g, const char *key, tri__gguf_str *out);
// An array whose items have type elem; *out is the array value.
tri_status tri__gguf_get_arr(const tri__gguf *g, const char *key, tri__gguf_type elem,
                             const tri__gguf_value **out);

int64_t tri__gguf_n_tensors(const tri__gguf *g);
const tri__gguf_tensor *tri__gguf_tensor_at(const tri__gguf *g, int64_t i);
// The tensor of that name, or NULL.
const tri__gguf_tensor *tri__gguf_find_tensor(const tri__gguf *g, const char *name);

// True when s equals the NUL-terminated string z.
bool tri__gguf_str_eq(tri__gguf_str s, const char *z);

// "uint8", ..., "float64"; "?" for other values. Static storage.
const char *tri__gguf_type_name(tri__gguf_type type);
// ggml's name of a tensor type id ("q6_K" for 14), or "unknown". Static storage.
const char *tri__gguf_ggml_type_name(uint32_t ggml_type);

// ---- llama (gguf-llama.c) ----

// Fills *cfg from general.architecture (llama, qwen2, phi3, gemma: model/family.h) and its keys,
// "llama.embedding_length" and so on (see docs/formats.md). UNSUPPORTED for another architecture
// or rope scaling type, BAD_FORMAT naming the key when a required key is missing, has the wrong
// type or an impossible value. rope_layout is the family's (ADJACENT for llama).
tri_status tri__gguf_llama_config(const tri__gguf *g, tri_model_config *cfg);

struct tri__family;
struct tri__family_data;
// The same for any family of model/family.h (general.architecture names it; keys under its
// prefix): *fam_out (if not NULL) receives the family, data its values beyond the config (the
// caller frees them with tri__family_data_free, also on failure).
tri_status tri__gguf_family_config(const tri__gguf *g, tri_model_config *cfg, const struct tri__family **fam_out,
                                   struct tri__family_data *data);

#endif  // TRI_GGUF_H
