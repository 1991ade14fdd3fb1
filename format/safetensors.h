// safetensors.h - read-only safetensors files and sharded HF checkpoints (internal).
//
// A file is validated whole when it is opened: header length, JSON header, every tensor's dtype,
// shape and data_offsets, and that the tensors tile the data buffer exactly (no overlap, no gap,
// nothing after the last one), so the accessors below never point out of bounds. docs/formats.md
// (## safetensors) lists what is enforced.
#ifndef TRI_SAFETENSORS_H
#define TRI_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

// The format's own limit on the JSON header (the reference implementation's MAX_HEADER_SIZE).
#define TRI_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct tri__st_tensor {
    const char *name;     // NUL-terminated, owned by the file
    tri_dtype type;       // F32, F16 or BF16
    int32_t n_dims;       // 0 (a scalar) .. 4
    int64_t shape[4];     // outermost first, as in the file; entries past n_dims are 1
    uint64_t offset;      // begin of data_offsets: bytes from the start of the data buffer
    uint64_t n_bytes;     // end - begin == product(shape) * dtype size
    const void *data;     // inside the read-only mapping; aligned only as the writer aligned it
    int32_t file;         // in a model set: index of the file (shard) that holds it; 0 otherwise
} tri__st_tensor;

// One entry of __metadata__.
typedef struct tri__st_meta {
    const char *key;
    const char *value;
} tri__st_meta;

// ---- one file ----

typedef struct tri__st_file tri__st_file;

// Maps path read-only (MAP_POPULATE when populate) and validates it. IO when it cannot be opened
// or mapped; BAD_FORMAT when it breaks the format; UNSUPPORTED for a valid file holding a dtype
// other than F32/F16/BF16 or a tensor of rank > 4 (the tensor and dtype named). Messages start
// with the path.
tri_status tri__st_file_open(const char *path, bool populate, tri__st_file **out);

// Validates a file image already in memory, e.g. from a fuzzer; `name` stands in for the path in
// messages. buf must outlive the result, which does not free it.
tri_status tri__st_file_from_memory(const char *name, const void *buf, size_t len,
                                    tri__st_file **out);

void tri__st_file_close(tri__st_file *f);

const char *tri__st_file_path(const tri__st_file *f);
uint64_t tri__st_file_size(const tri__st_file *f);      // bytes of the whole file
uint64_t tri__st_file_data_size(const tri__st_file *f); // bytes of the data buffer
// File offset of the data buffer (8 + the header's length): tensor t lies at file offset
// data_start + t->offset, for readers that bypass the mapping.
uint64_t tri__st_file_data_start(const tri__st_file *f);
int64_t tri__st_file_n_tensors(const tri__st_file *f);
// Tensor i in file order (increasing offset), 0 <= i < n_tensors; NULL otherwise.
const tri__st_tensor *tri__st_file_tensor_at(const tri__st_file *f, int64_t i);
// The tensor of that name, or NULL.
const tri__st_tensor *tri__st_file_find(const tri__st_file *f, const char *name);
int64_t tri__st_file_n_meta(const tri__st_file *f);
const tri__st_meta *tri__st_file_meta_at(const tri__st_file *f, int64_t i);
// The __metadata__ value of key, or NULL.
const char *tri__st_file_meta_find(const tri__st_file *f, const char *key);

// ---- sharded index (model.safetensors.index.json) ----

typedef struct tri__st_index_entry {
    const char *tensor;   // owned by the index
    const char *file;     // shard file name, a plain name inside the index's directory
} tri__st_index_entry;

typedef struct tri__st_index tri__st_index;

// Parses the text of an index file; `name` stands in for its path in messages. BAD_FORMAT when
// weight_map is missing or not an object of strings, or when a shard name is empty or contains
// '/', '\\' or ".." (so no shard can escape the index's directory). Entries keep the order of
// the file.
tri_status tri__st_index_parse(const char *name, const char *text, size_t len, tri__st_index **out);
void tri__st_index_free(tri__st_index *idx);
int64_t tri__st_index_n_entries(const tri__st_index *idx);
const tri__st_index_entry *tri__st_index_entry_at(const tri__st_index *idx, int64_t i);

// ---- model set: one file or all the shards of a checkpoint ----

typedef struct tri__st_model tri__st_model;

// Opens a model from path, which is one of
//   - a .safetensors file;
//   - a model.safetensors.index.json (any name ending in ".json"): each shard named in weight_map
//     is opened once; every mapped tensor must exist in its shard; a tensor name present in two
//     shard files is BAD_FORMAT; tensors of a shard that the map does not list are ignored;
//   - a directory holding model.safetensors (preferred, as transformers does) or
//     model.safetensors.index.json.
// Shards are numbered in the order of their file names; tensors are listed shard by shard, in
// file order within a shard.
tri_status tri__st_model_open(const char *path, bool populate, tri__st_model **out);
void tri__st_model_close(tri__st_model *m);

int64_t tri__st_model_n_tensors(const tri__st_model *m);
// Tensor i, 0 <= i < n_tensors; NULL otherwise. Its `file` is the shard index.
const tri__st_tensor *tri__st_model_tensor_at(const tri__st_model *m, int64_t i);
const tri__st_tensor *tri__st_model_find(const tri__st_model *m, const char *name);
int32_t tri__st_model_n_files(const tri__st_model *m);
const tri__st_file *tri__st_model_file_at(const tri__st_model *m, int32_t i);
// Bytes of tensor data of the set's tensors (sum of n_bytes).
uint64_t tri__st_model_total_bytes(const tri__st_model *m);
// The directory that holds the files, without a trailing '/' ("." for a bare file name); this is
// where config.json and the tokenizer files are looked for.
const char *tri__st_model_dir(const tri__st_model *m);

#endif  // TRI_SAFETENSORS_H
