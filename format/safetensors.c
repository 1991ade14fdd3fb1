// safetensors.c - safetensors files over a read-only mmap, and sharded checkpoints.
//
// File layout: u64 little-endian N, then N bytes of JSON header, then the data buffer. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with offsets relative
// to the data buffer, plus an optional "__metadata__" object of strings.
#include "file.h"
#include "safetensors.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "json-read.h"

// Names in messages are cut to this many bytes so a hostile 1 MB name cannot flood the log.
#define NAME_MAX_PRINT 200

struct tri__st_file {
    char *path;
    const uint8_t *base;           // the whole file image, size bytes
    uint64_t size;
    const void *map;               // our mapping of base, or NULL when the image is borrowed
    uint64_t header_len;           // N
    uint64_t data_size;            // size - 8 - N
    json_object *header;           // owns the strings that names and metadata point into
    tri__st_tensor *tensors;       // n_tensors, file order (increasing offset)
    int64_t n_tensors;
    const tri__st_tensor **by_name;// n_tensors, sorted by strcmp of name
    tri__st_meta *meta;            // n_meta, header order
    int64_t n_meta;
};

// ---- dtypes ----

typedef struct st_dtype {
    const char *name;
    uint32_t size;      // bytes per element
    int supported;      // 1: maps to type
    tri_dtype type;
} st_dtype;

// Every fixed-size dtype of the format, so that a file holding one we cannot compute with can
// still be checked whole before it is reported as UNSUPPORTED.
static const st_dtype st_dtypes[] = {
    {"F32", 4, 1, TRI_DTYPE_F32},  {"F16", 2, 1, TRI_DTYPE_F16},  {"BF16", 2, 1, TRI_DTYPE_BF16},
    {"F64", 8, 0, TRI_DTYPE_F32},  {"I64", 8, 0, TRI_DTYPE_F32},  {"U64", 8, 0, TRI_DTYPE_F32},
    {"I32", 4, 0, TRI_DTYPE_F32},  {"U32", 4, 0, TRI_DTYPE_F32},  {"I16", 2, 0, TRI_DTYPE_F32},
    {"U16", 2, 0, TRI_DTYPE_F32},  {"I8", 1, 0, TRI_DTYPE_F32},   {"U8", 1, 0, TRI_DTYPE_F32},
    {"BOOL", 1, 0, TRI_DTYPE_F32}, {"F8_E4M3", 1, 0, TRI_DTYPE_F32},
    {"F8_E5M2", 1, 0, TRI_DTYPE_F32}, {"F8_E8M0", 1, 0, TRI_DTYPE_F32},
};

static const st_dtype *st_dtype_find(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
    }
    return NULL;
}

// ---- helpers ----

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const tri__st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->n_bytes != y->n_bytes) return x->n_bytes < y->n_bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    const tri__st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

// Binary search in an array of tensor pointers sorted by name.
static const tri__st_tensor *find_by_name(const tri__st_tensor *const *by_name, int64_t n,
                                          const char *name) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(by_name[mid]->name, name);
        if (c == 0) return by_name[mid];
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

// A JSON integer >= 0. json-c clamps integers beyond int64 to INT64_MAX, which every later range
// check rejects, so the clamping cannot make a bad file pass.
static bool json_nonneg_int(json_object *v, int64_t *out) {
    if (!json_object_is_type(v, json_type_int)) return false;
    int64_t x = json_object_get_int64(v);
    if (x < 0) return false;
    *out = x;
    return true;
}

// ---- one file ----

// Why a valid file is still unusable here; the first such tensor is reported after the whole
// file has been checked, so BAD_FORMAT always wins over UNSUPPORTED.
typedef struct unsupported_note {
    bool set;
    char msg[512];
} unsupported_note;

// Parses the header entry of one tensor into *t (name and data not yet set).
static tri_status parse_tensor(tri__st_file *f, const char *name, json_object *v, tri__st_tensor *t,
                               unsupported_note *unsup) {
    const char *path = f->path;
    if (!json_object_is_type(v, json_type_object)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': entry is not an object", path,
                         NAME_MAX_PRINT, name);
    }
    json_object *jdtype, *jshape, *joff;
    if (!json_object_object_get_ex(v, "dtype", &jdtype) ||
        !json_object_is_type(jdtype, json_type_string)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': field 'dtype': missing or not a string",
                         path, NAME_MAX_PRINT, name);
    }
    if (!json_object_object_get_ex(v, "shape", &jshape) ||
        !json_object_is_type(jshape, json_type_array)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': field 'shape': missing or not an array",
                         path, NAME_MAX_PRINT, name);
    }
    if (!json_object_object_get_ex(v, "data_offsets", &joff) ||
        !json_object_is_type(joff, json_type_array) || json_object_array_length(joff) != 2) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%.*s': field 'data_offsets': missing or not an array of 2",
                         path, NAME_MAX_PRINT, name);
    }

    const char *dname = json_object_get_string(jdtype);
    const st_dtype *dt = st_dtype_find(dname);
    if (!dt) {
        // Sub-byte and future dtypes: their sizes are unknown to us, so nothing further can be
        // checked; the file may well be valid.
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: tensor '%.*s': field 'dtype': unsupported dtype '%.32s'",
                         path, NAME_MAX_PRINT, name, dname);
    }
    if (!dt->supported && !unsup->set) {
        unsup->set = true;
        snprintf(unsup->msg, sizeof unsup->msg,
                 "%s: tensor '%.*s': field 'dtype': unsupported dtype '%s' (F32, F16 and BF16 are)",
                 path, NAME_MAX_PRINT, name, dt->name);
    }
    t->type = dt->type;

    // Elements: product of the dims, kept within INT64_MAX (zeros aside, so that a huge dim next to
    // a zero one is still rejected rather than handed to code that multiplies shapes).
    size_t rank = json_object_array_length(jshape);
    uint64_t prod_nonzero = 1;
    bool has_zero = false;
    for (size_t i = 0; i < rank; i++) {
        int64_t d;
        if (!json_nonneg_int(json_object_array_get_idx(jshape, i), &d)) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: tensor '%.*s': field 'shape': entry %zu is not an integer >= 0", path,
                             NAME_MAX_PRINT, name, i);
        }
        if (d == 0) {
            has_zero = true;
        } else if (prod_nonzero > (uint64_t)INT64_MAX / (uint64_t)d) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': field 'shape': element count overflows",
                             path, NAME_MAX_PRINT, name);
        } else {
            prod_nonzero *= (uint64_t)d;
        }
        if (i < 4) t->shape[i] = d;
    }
    if (prod_nonzero > (uint64_t)INT64_MAX / dt->size) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': field 'shape': byte count overflows",
                         path, NAME_MAX_PRINT, name);
    }
    for (size_t i = rank; i < 4; i++) t->shape[i] = 1;
    if (rank > 4 && !unsup->set) {
        unsup->set = true;
        snprintf(unsup->msg, sizeof unsup->msg,
                 "%s: tensor '%.*s': field 'shape': rank %zu is unsupported (at most 4)", path,
                 NAME_MAX_PRINT, name, rank);
    }
    t->n_dims = rank > 4 ? 4 : (int32_t)rank;
    uint64_t want = has_zero ? 0 : prod_nonzero * dt->size;

    int64_t begin, end;
    if (!json_nonneg_int(json_object_array_get_idx(joff, 0), &begin) ||
        !json_nonneg_int(json_object_array_get_idx(joff, 1), &end)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%.*s': field 'data_offsets': entries are not integers >= 0", path,
                         NAME_MAX_PRINT, name);
    }
    if (begin > end) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%.*s': field 'data_offsets': begin %lld > end %lld", path,
                         NAME_MAX_PRINT, name, (long long)begin, (long long)end);
    }
    if ((uint64_t)end > f->data_size) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%.*s': field 'data_offsets': end %lld is past the data buffer of %llu bytes",
                         path, NAME_MAX_PRINT, name, (long long)end, (unsigned long long)f->data_size);
    }
    if ((uint64_t)(end - begin) != want) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: tensor '%.*s': field 'data_offsets': %lld bytes, but shape and dtype %s need %llu",
                         path, NAME_MAX_PRINT, name, (long long)(end - begin), dt->name,
                         (unsigned long long)want);
    }
    t->offset = (uint64_t)begin;
    t->n_bytes = want;
    return TRI_STATUS_OK;
}

static tri_status parse_metadata(tri__st_file *f, json_object *v) {
    if (!json_object_is_type(v, json_type_object)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '__metadata__': not an object", f->path);
    }
    int n = json_object_object_length(v);
    if (n == 0) return TRI_STATUS_OK;
    f->meta = calloc((size_t)n, sizeof *f->meta);
    if (!f->meta) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate metadata", f->path);
    json_object_object_foreach(v, key, val) {
        if (!json_object_is_type(val, json_type_string)) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '__metadata__.%.*s': not a string",
                             f->path, NAME_MAX_PRINT, key);
        }
        f->meta[f->n_meta].key = key;
        f->meta[f->n_meta].value = json_object_get_string(val);
        f->n_meta++;
    }
    return TRI_STATUS_OK;
}

// Validates the image f->base[0, f->size); fills everything else.
static tri_status st_parse(tri__st_file *f) {
    const char *path = f->path;
    if (f->size < 8) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %llu bytes, too short for the 8-byte header length",
                         path, (unsigned long long)f->size);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->base[i];
    if (n > TRI_ST_MAX_HEADER) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes",
                         path, (unsigned long long)n, (unsigned long long)TRI_ST_MAX_HEADER);
    }
    if (n > f->size - 8) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: header length %llu is past the end of the file (%llu bytes)", path,
                         (unsigned long long)n, (unsigned long long)f->size);
    }
    f->header_len = n;
    f->data_size = f->size - 8 - n;
    const char *text = (const char *)f->base + 8;
    if (n == 0 || text[0] != '{') {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: header does not start with '{'", path);
    }
    tri_status st = tri__json_parse(path, text, (size_t)n, &f->header);
    if (st != TRI_STATUS_OK) return st;
    if (!json_object_is_type(f->header, json_type_object)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: header is not a JSON object", path);
    }

    int n_entries = json_object_object_length(f->header);
    if (n_entries > 0) {
        f->tensors = calloc((size_t)n_entries, sizeof *f->tensors);
        f->by_name = calloc((size_t)n_entries, sizeof *f->by_name);
        if (!f->tensors || !f->by_name) {
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %d tensors", path, n_entries);
        }
    }
    unsupported_note unsup = {0};
    json_object_object_foreach(f->header, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, val);
        } else {
            tri__st_tensor *t = &f->tensors[f->n_tensors];
            t->name = key;
            st = parse_tensor(f, key, val, t, &unsup);
            f->n_tensors++;
        }
        if (st != TRI_STATUS_OK) return st;
    }

    // The tensors must tile [0, data_size): sorted by offset, each begins where the previous one
    // ends, and the last ends at the end of the file. This rejects overlaps, gaps and trailing bytes.
    if (f->n_tensors > 0) qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_offset);
    uint64_t pos = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const tri__st_tensor *t = &f->tensors[i];
        if (t->offset < pos) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: tensor '%.*s': field 'data_offsets': [%llu, %llu) overlaps tensor '%.*s'",
                             path, NAME_MAX_PRINT, t->name, (unsigned long long)t->offset,
                             (unsigned long long)(t->offset + t->n_bytes), NAME_MAX_PRINT,
                             f->tensors[i - 1].name);
        }
        if (t->offset > pos) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: tensor '%.*s': field 'data_offsets': gap: bytes [%llu, %llu) of the data buffer belong to no tensor",
                             path, NAME_MAX_PRINT, t->name, (unsigned long long)pos,
                             (unsigned long long)t->offset);
        }
        pos = t->offset + t->n_bytes;
    }
    if (pos != f->data_size) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: data buffer: %llu bytes, but the tensors cover only %llu", path,
                         (unsigned long long)f->data_size, (unsigned long long)pos);
    }
    if (unsup.set) return tri__fail(TRI_STATUS_UNSUPPORTED, "%s", unsup.msg);

    const uint8_t *data = f->base + 8 + f->header_len;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        f->tensors[i].data = data + f->tensors[i].offset;
        f->by_name[i] = &f->tensors[i];
    }
    if (f->n_tensors > 0) {
        qsort(f->by_name, (size_t)f->n_tensors, sizeof *f->by_name, cmp_tensor_ptr_name);
    }
    // Defensive: json-c replaces a duplicate key (also one made equal by an escaped "\u0000",
    // where it cuts keys), so two equal names would mean a json-c change we did not expect.
    for (int64_t i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': name appears twice", path,
                             NAME_MAX_PRINT, f->by_name[i]->name);
        }
    }
    return TRI_STATUS_OK;
}

static tri__st_file *st_file_new(const char *path) {
    tri__st_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->path = dup_str(path);
    if (!f->path) {
        free(f);
        return NULL;
    }
    return f;
}

tri_status tri__st_file_from_memory(const char *name, const void *buf, size_t len,
                                    tri__st_file **out) {
    *out = NULL;
    tri__st_file *f = st_file_new(name);
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", name);
    f->base = buf;
    f->size = len;
    tri_status st = st_parse(f);
    if (st != TRI_STATUS_OK) {
        tri__st_file_close(f);
        return st;
    }
    *out = f;
    return TRI_STATUS_OK;
}

tri_status tri__st_file_open(const char *path, bool populate, tri__st_file **out) {
    *out = NULL;
    tri_status st;
    tri__st_file *f = st_file_new(path);
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
    int fd;
    uint64_t size;
    if ((st = tri__file_open(path, &fd, &size))) goto fail_file;
    if (size < 8) {
        tri__file_close(path, fd);
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %" PRIu64 " bytes, too short for the 8-byte header length",
                       path, size);
        goto fail_file;
    }
    const void *map;
    if ((st = tri__file_map(path, fd, size, populate, &map))) goto fail_file;
    f->map = map;
    f->base = map;
    f->size = size;
    st = st_parse(f);
    if (st != TRI_STATUS_OK) goto fail_file;
    *out = f;
    return TRI_STATUS_OK;

fail_file:
    tri__st_file_close(f);
    return st;
}

void tri__st_file_close(tri__st_file *f) {
    if (!f) return;
    tri__file_unmap(f->path, f->map, f->size);
    json_object_put(f->header);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->path);
    free(f);
}

const char *tri__st_file_path(const tri__st_file *f) { return f->path; }
uint64_t tri__st_file_size(const tri__st_file *f) { return f->size; }
uint64_t tri__st_file_data_size(const tri__st_file *f) { return f->data_size; }
uint64_t tri__st_file_data_start(const tri__st_file *f) { return 8 + f->header_len; }
int64_t tri__st_file_n_tensors(const tri__st_file *f) { return f->n_tensors; }

const tri__st_tensor *tri__st_file_tensor_at(const tri__st_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const tri__st_tensor *tri__st_file_find(const tri__st_file *f, const char *name) {
    return find_by_name(f->by_name, f->n_tensors, name);
}

int64_t tri__st_file_n_meta(const tri__st_file *f) { return f->n_meta; }

const tri__st_meta *tri__st_file_meta_at(const tri__st_file *f, int64_t i) {
    return i >= 0 && i < f->n_meta ? &f->meta[i] : NULL;
}

const char *tri__st_file_meta_find(const tri__st_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_meta; i++) {
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    }
    return NULL;
}

// ---- sharded index ----

struct tri__st_index {
    json_object *root;              // owns the strings of entries
    tri__st_index_entry *entries;   // n_entries, file order
    int64_t n_entries;
};

// A shard name must stay inside the index's directory.
static bool shard_name_ok(const char *s) {
    return s[0] != '\0' && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

tri_status tri__st_index_parse(const char *name, const char *text, size_t len, tri__st_index **out) {
    *out = NULL;
    tri_status st;
    tri__st_index *idx = calloc(1, sizeof *idx);
    if (!idx) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", name);
    st = tri__json_parse(name, text, len, &idx->root);
    if (st != TRI_STATUS_OK) goto fail;
    json_object *map;
    if (!json_object_is_type(idx->root, json_type_object) ||
        !json_object_object_get_ex(idx->root, "weight_map", &map)) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'weight_map': missing", name);
        goto fail;
    }
    if (!json_object_is_type(map, json_type_object)) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'weight_map': not an object", name);
        goto fail;
    }
    int n = json_object_object_length(map);
    if (n == 0) {
        st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'weight_map': empty", name);
        goto fail;
    }
    idx->entries = calloc((size_t)n, sizeof *idx->entries);
    if (!idx->entries) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %d entries", name, n);
        goto fail;
    }
    json_object_object_foreach(map, key, val) {
        if (!json_object_is_type(val, json_type_string)) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'weight_map.%.*s': not a string", name,
                           NAME_MAX_PRINT, key);
            goto fail;
        }
        const char *file = json_object_get_string(val);
        if ((size_t)json_object_get_string_len(val) != strlen(file) || !shard_name_ok(file)) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT,
                           "%s: field 'weight_map.%.*s': shard '%.*s' is not a plain file name in the index's directory",
                           name, NAME_MAX_PRINT, key, NAME_MAX_PRINT, file);
            goto fail;
        }
        idx->entries[idx->n_entries].tensor = key;
        idx->entries[idx->n_entries].file = file;
        idx->n_entries++;
    }
    *out = idx;
    return TRI_STATUS_OK;

fail:
    tri__st_index_free(idx);
    return st;
}

void tri__st_index_free(tri__st_index *idx) {
    if (!idx) return;
    json_object_put(idx->root);
    free(idx->entries);
    free(idx);
}

int64_t tri__st_index_n_entries(const tri__st_index *idx) { return idx->n_entries; }

const tri__st_index_entry *tri__st_index_entry_at(const tri__st_index *idx, int64_t i) {
    return i >= 0 && i < idx->n_entries ? &idx->entries[i] : NULL;
}

// ---- model set ----

struct tri__st_model {
    char *dir;
    tri__st_file **files;            // n_files, ordered by file name
    int32_t n_files;
    tri__st_tensor *tensors;         // n_tensors: shard by shard, file order within each
    int64_t n_tensors;
    const tri__st_tensor **by_name;  // n_tensors, sorted by name
    uint64_t total_bytes;
};

static int cmp_entry_file(const void *a, const void *b) {
    const tri__st_index_entry *const *x = a, *const *y = b;
    return strcmp((*x)->file, (*y)->file);
}

static int cmp_entry_tensor(const void *a, const void *b) {
    const tri__st_index_entry *const *x = a, *const *y = b;
    return strcmp((*x)->tensor, (*y)->tensor);
}

// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/". For a directory path, the path without trailing '/'.
static char *dir_of(const char *path, bool is_dir) {
    size_t n = strlen(path);
    if (is_dir) {
        while (n > 1 && path[n - 1] == '/') n--;
    } else {
        while (n > 0 && path[n - 1] != '/') n--;  // drop the file name
        if (n == 0) return dup_str(".");
        while (n > 1 && path[n - 1] == '/') n--;
    }
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

// dir + "/" + name, malloc'd; NULL when out of memory.
static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + slash + b + 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

static bool is_regular_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

// Fills m->by_name and total_bytes from m->tensors.
static tri_status model_index_names(tri__st_model *m, const char *what) {
    if (m->n_tensors == 0) return TRI_STATUS_OK;
    m->by_name = malloc((size_t)m->n_tensors * sizeof *m->by_name);
    if (!m->by_name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", what);
    for (int64_t i = 0; i < m->n_tensors; i++) {
        m->by_name[i] = &m->tensors[i];
        m->total_bytes += m->tensors[i].n_bytes;
    }
    qsort(m->by_name, (size_t)m->n_tensors, sizeof *m->by_name, cmp_tensor_ptr_name);
    return TRI_STATUS_OK;
}

static tri_status model_open_single(tri__st_model *m, const char *path, bool populate) {
    m->files = calloc(1, sizeof *m->files);
    if (!m->files) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
    tri_status st = tri__st_file_open(path, populate, &m->files[0]);
    if (st != TRI_STATUS_OK) return st;
    m->n_files = 1;
    const tri__st_file *f = m->files[0];
    if (f->n_tensors > 0) {
        m->tensors = malloc((size_t)f->n_tensors * sizeof *m->tensors);
        if (!m->tensors) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
        memcpy(m->tensors, f->tensors, (size_t)f->n_tensors * sizeof *m->tensors);
    }
    m->n_tensors = f->n_tensors;
    return model_index_names(m, path);
}

static tri_status model_open_index(tri__st_model *m, const char *index_path, bool populate) {
    char *text = NULL;
    size_t len = 0;
    tri__st_index *idx = NULL;
    const tri__st_index_entry **by_file = NULL, **by_tensor = NULL;
    const tri__st_tensor **all = NULL;
    const char **shard_names = NULL;  // n_files, into idx
    tri_status st = tri__json_read_file(index_path, TRI_JSON_MAX_BYTES, &text, &len);
    if (st != TRI_STATUS_OK) goto done;
    st = tri__st_index_parse(index_path, text, len, &idx);
    if (st != TRI_STATUS_OK) goto done;

    // Distinct shard names, in name order: each shard is opened once.
    size_t n = (size_t)idx->n_entries;
    by_file = malloc(n * sizeof *by_file);
    by_tensor = malloc(n * sizeof *by_tensor);
    m->files = calloc(n, sizeof *m->files);
    shard_names = calloc(n, sizeof *shard_names);
    if (!by_file || !by_tensor || !m->files || !shard_names) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", index_path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) by_file[i] = by_tensor[i] = &idx->entries[i];
    qsort(by_file, n, sizeof *by_file, cmp_entry_file);
    qsort(by_tensor, n, sizeof *by_tensor, cmp_entry_tensor);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(by_file[i]->file, by_file[i - 1]->file) == 0) continue;
        char *shard_path = join_path(m->dir, by_file[i]->file);
        if (!shard_path) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", index_path);
            goto done;
        }
        st = tri__st_file_open(shard_path, populate, &m->files[m->n_files]);
        free(shard_path);
        if (st != TRI_STATUS_OK) goto done;
        shard_names[m->n_files++] = by_file[i]->file;
    }

    // A tensor name in two shards is ambiguous whatever the map says.
    int64_t n_all = 0;
    for (int32_t s = 0; s < m->n_files; s++) n_all += m->files[s]->n_tensors;
    if (n_all > 0) {
        all = malloc((size_t)n_all * sizeof *all);
        if (!all) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", index_path);
            goto done;
        }
    }
    int64_t k = 0;
    for (int32_t s = 0; s < m->n_files; s++) {
        for (int64_t i = 0; i < m->files[s]->n_tensors; i++) {
            m->files[s]->tensors[i].file = s;
            all[k++] = &m->files[s]->tensors[i];
        }
    }
    if (n_all > 0) qsort(all, (size_t)n_all, sizeof *all, cmp_tensor_ptr_name);
    for (int64_t i = 1; i < n_all; i++) {
        if (strcmp(all[i - 1]->name, all[i]->name) == 0) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%.*s': in two shards, %s and %s",
                           index_path, NAME_MAX_PRINT, all[i]->name,
                           m->files[all[i - 1]->file]->path, m->files[all[i]->file]->path);
            goto done;
        }
    }

    // Every mapped tensor must be in the shard the map names.
    for (size_t i = 0; i < n; i++) {
        const tri__st_index_entry *e = &idx->entries[i];
        const tri__st_tensor *t = find_by_name(all, n_all, e->tensor);
        if (!t || strcmp(shard_names[t->file], e->file) != 0) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'weight_map.%.*s': tensor not in shard '%s'",
                           index_path, NAME_MAX_PRINT, e->tensor, e->file);
            goto done;
        }
    }

    // The set: mapped tensors, shard by shard in file order; unmapped ones are ignored.
    m->tensors = malloc(n * sizeof *m->tensors);
    if (!m->tensors) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", index_path);
        goto done;
    }
    for (int32_t s = 0; s < m->n_files; s++) {
        const tri__st_file *f = m->files[s];
        for (int64_t i = 0; i < f->n_tensors; i++) {
            tri__st_index_entry key = {.tensor = f->tensors[i].name, .file = NULL};
            const tri__st_index_entry *kp = &key;
            if (bsearch(&kp, by_tensor, n, sizeof *by_tensor, cmp_entry_tensor)) {
                m->tensors[m->n_tensors++] = f->tensors[i];
            } else {
                tri__log(TRI_LOG_LEVEL_DEBUG, "%s: tensor '%.*s' is not in the weight map; ignored",
                         f->path, NAME_MAX_PRINT, f->tensors[i].name);
            }
        }
    }
    TRI_ASSERT(m->n_tensors == (int64_t)n);
    st = model_index_names(m, index_path);

done:
    free(shard_names);
    free(all);
    free(by_tensor);
    free(by_file);
    tri__st_index_free(idx);
    free(text);
    return st;
}

tri_status tri__st_model_open(const char *path, bool populate, tri__st_model **out) {
    *out = NULL;
    tri_status st;
    char *file = NULL;
    tri__st_model *m = calloc(1, sizeof *m);
    if (!m) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = tri__fail(errno == ENOENT ? TRI_STATUS_NOT_FOUND : TRI_STATUS_IO, "%s: cannot stat: %s",
                       path, strerror(errno));
        goto fail;
    }
    bool is_dir = S_ISDIR(sb.st_mode);
    m->dir = dir_of(path, is_dir);
    if (!m->dir) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
        goto fail;
    }
    bool index;
    if (is_dir) {
        file = join_path(m->dir, "model.safetensors");
        if (!file) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
            goto fail;
        }
        index = !is_regular_file(file);
        if (index) {
            free(file);
            file = join_path(m->dir, "model.safetensors.index.json");
            if (!file) {
                st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
                goto fail;
            }
            if (!is_regular_file(file)) {
                st = tri__fail(TRI_STATUS_NOT_FOUND,
                               "%s: directory holds neither model.safetensors nor model.safetensors.index.json",
                               path);
                goto fail;
            }
        }
    } else {
        file = dup_str(path);
        if (!file) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", path);
            goto fail;
        }
        index = ends_with(path, ".json");
    }
    st = index ? model_open_index(m, file, populate) : model_open_single(m, file, populate);
    if (st != TRI_STATUS_OK) goto fail;
    free(file);
    *out = m;
    return TRI_STATUS_OK;

fail:
    free(file);
    tri__st_model_close(m);
    return st;
}

void tri__st_model_close(tri__st_model *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_files; i++) tri__st_file_close(m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->by_name);
    free(m->dir);
    free(m);
}

int64_t tri__st_model_n_tensors(const tri__st_model *m) { return m->n_tensors; }

const tri__st_tensor *tri__st_model_tensor_at(const tri__st_model *m, int64_t i) {
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

const tri__st_tensor *tri__st_model_find(const tri__st_model *m, const char *name) {
    return find_by_name(m->by_name, m->n_tensors, name);
}

int32_t tri__st_model_n_files(const tri__st_model *m) { return m->n_files; }

const tri__st_file *tri__st_model_file_at(const tri__st_model *m, int32_t i) {
    return i >= 0 && i < m->n_files ? m->files[i] : NULL;
}

uint64_t tri__st_model_total_bytes(const tri__st_model *m) { return m->total_bytes; }
const char *tri__st_model_dir(const tri__st_model *m) { return m->dir; }
