// gguf.c - GGUF v2/v3 reader: maps a file read-only and validates all of it at open.
//
// Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv key/value
// pairs; n_tensors tensor infos; padding to general.alignment; the data section. Every read goes
// through a cursor that checks the bytes left first, and every count is bounded by the bytes left
// (each item takes at least a known number of bytes) before anything is allocated, so a hostile
// file costs at most a small multiple of its own size in memory.
#include "file.h"
#include "gguf.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads little-endian fields in place and needs a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u   // the specification's limit on key length
#define GGUF_MAX_DEPTH 8          // arrays nested deeper than this are rejected
#define GGUF_MAX_DIMS 4

// Bytes of the smallest possible encoding of a value, used to bound counts before allocating:
// 1 for u8/i8/bool, ..., 8 for a string (its length), 12 for an array (element type + count).
static const uint64_t value_min_bytes[] = {
    [TRI_GGUF_TYPE_UINT8] = 1,   [TRI_GGUF_TYPE_INT8] = 1,    [TRI_GGUF_TYPE_UINT16] = 2,
    [TRI_GGUF_TYPE_INT16] = 2,   [TRI_GGUF_TYPE_UINT32] = 4,  [TRI_GGUF_TYPE_INT32] = 4,
    [TRI_GGUF_TYPE_FLOAT32] = 4, [TRI_GGUF_TYPE_BOOL] = 1,    [TRI_GGUF_TYPE_STRING] = 8,
    [TRI_GGUF_TYPE_ARRAY] = 12,  [TRI_GGUF_TYPE_UINT64] = 8,  [TRI_GGUF_TYPE_INT64] = 8,
    [TRI_GGUF_TYPE_FLOAT64] = 8,
};
#define GGUF_N_VALUE_TYPES (sizeof value_min_bytes / sizeof value_min_bytes[0])

// Smallest key/value pair: key length (8), value type (4), a one-byte value.
#define GGUF_MIN_KV_BYTES 13u
// Smallest tensor info: name length (8), n_dims (4), one dim (8), type (4), offset (8).
#define GGUF_MIN_TENSOR_INFO_BYTES 32u

// ---- value arena ----

// Array items live in blocks freed together at close, so a parse that fails half-way leaks
// nothing and needs no per-array cleanup.
typedef struct value_block {
    struct value_block *next;
    size_t used;
    size_t cap;
    tri__gguf_value vals[];
} value_block;

struct tri__gguf {
    char *path;
    const uint8_t *map;       // the whole file, PROT_READ, MAP_PRIVATE
    uint64_t size;            // bytes
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start;      // file offset of the data section, a multiple of alignment

    tri__gguf_kv *kvs;        // n_kv, file order
    int64_t n_kv;
    int64_t *kv_by_key;       // n_kv indices into kvs, sorted by key

    tri__gguf_tensor *tensors;// n_tensors, file order
    int64_t n_tensors;
    int64_t *tensor_by_name;  // n_tensors indices into tensors, sorted by name

    value_block *arena;
};

static tri__gguf_value *arena_alloc(tri__gguf *g, uint64_t n) {
    if (n == 0) return NULL;
    value_block *b = g->arena;
    if (b && b->cap - b->used >= n) {
        tri__gguf_value *v = &b->vals[b->used];
        b->used += (size_t)n;
        return v;
    }
    uint64_t cap = n > 4096 ? n : 4096;
    if (cap > (SIZE_MAX - sizeof(value_block)) / sizeof(tri__gguf_value)) return NULL;
    b = calloc(1, sizeof(value_block) + (size_t)cap * sizeof(tri__gguf_value));
    if (!b) return NULL;
    b->cap = (size_t)cap;
    b->used = (size_t)n;
    // The new block goes behind the current one when it is a one-off big array, so that the
    // current block's free space stays in use for the small arrays after it.
    if (g->arena && n > 4096) {
        b->next = g->arena->next;
        g->arena->next = b;
    } else {
        b->next = g->arena;
        g->arena = b;
    }
    return b->vals;
}

// ---- names ----

const char *tri__gguf_type_name(tri__gguf_type type) {
    static const char *const names[] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool", "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)type < GGUF_N_VALUE_TYPES ? names[type] : "?";
}

const char *tri__gguf_ggml_type_name(uint32_t ggml_type) {
    // ggml's type table; the gaps are ids that ggml has retired.
    static const char *const names[] = {
        [0] = "f32",      [1] = "f16",     [2] = "q4_0",    [3] = "q4_1",     [6] = "q5_0",
        [7] = "q5_1",     [8] = "q8_0",    [9] = "q8_1",    [10] = "q2_K",    [11] = "q3_K",
        [12] = "q4_K",    [13] = "q5_K",   [14] = "q6_K",   [15] = "q8_K",    [16] = "iq2_xxs",
        [17] = "iq2_xs",  [18] = "iq3_xxs",[19] = "iq1_s",  [20] = "iq4_nl",  [21] = "iq3_s",
        [22] = "iq2_s",   [23] = "iq4_xs", [24] = "i8",     [25] = "i16",     [26] = "i32",
        [27] = "i64",     [28] = "f64",    [29] = "iq1_m",  [30] = "bf16",    [34] = "tq1_0",
        [35] = "tq2_0",   [39] = "mxfp4",
    };
    if (ggml_type < sizeof names / sizeof names[0] && names[ggml_type]) return names[ggml_type];
    return "unknown";
}

// The runtime dtype of a ggml type id, or -1 when the runtime does not handle it.
static int ggml_to_dtype(uint32_t ggml_type) {
    switch (ggml_type) {
    case 0: return TRI_DTYPE_F32;
    case 1: return TRI_DTYPE_F16;
    case 2: return TRI_DTYPE_Q4_0;
    case 3: return TRI_DTYPE_Q4_1;
    case 6: return TRI_DTYPE_Q5_0;
    case 7: return TRI_DTYPE_Q5_1;
    case 8: return TRI_DTYPE_Q8_0;
    case 10: return TRI_DTYPE_Q2_K;
    case 11: return TRI_DTYPE_Q3_K;
    case 12: return TRI_DTYPE_Q4_K;
    case 13: return TRI_DTYPE_Q5_K;
    case 14: return TRI_DTYPE_Q6_K;
    case 20: return TRI_DTYPE_IQ4_NL;
    case 23: return TRI_DTYPE_IQ4_XS;
    case 30: return TRI_DTYPE_BF16;
    default: return -1;
    }
}

// A printable copy of a name from the file for messages: at most 80 bytes, other bytes than
// printable ASCII shown as '?', so a hostile name cannot break a log line.
typedef struct name_buf {
    char s[88];
} name_buf;

static name_buf printable(tri__gguf_str str) {
    name_buf b;
    uint64_t n = str.len < 80 ? str.len : 80;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)str.ptr[i];
        b.s[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (str.len > 80) {
        memcpy(b.s + n, "...", 4);
    } else {
        b.s[n] = 0;
    }
    return b;
}

bool tri__gguf_str_eq(tri__gguf_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && (n == 0 || memcmp(s.ptr, z, n) == 0);
}

// Orders strings bytewise, a shorter prefix first.
static int str_cmp(tri__gguf_str a, const char *b, uint64_t b_len) {
    uint64_t n = a.len < b_len ? a.len : b_len;
    int c = n ? memcmp(a.ptr, b, (size_t)n) : 0;
    if (c != 0) return c;
    return a.len < b_len ? -1 : a.len > b_len;
}

// ---- cursor ----

// Reads fields in order; what names the field being read for messages ("header", "key 'x'").
typedef struct cursor {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    const char *path;
    char what[128];
} cursor;

static uint64_t cur_left(const cursor *c) { return c->size - c->pos; }

// n is a field size (at most 8 bytes); on failure dst is zeroed so no caller reads garbage.
static tri_status cur_bytes(cursor *c, void *dst, uint64_t n, const char *field) {
    if (n > cur_left(c)) {
        memset(dst, 0, (size_t)n);
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: %s: %s: %" PRIu64 " bytes at offset %" PRIu64 " past end of file (%" PRIu64
                         " bytes)",
                         c->path, c->what, field, n, c->pos, c->size);
    }
    memcpy(dst, c->p + c->pos, (size_t)n);
    c->pos += n;
    return TRI_STATUS_OK;
}

static tri_status cur_u32(cursor *c, uint32_t *v, const char *field) { return cur_bytes(c, v, 4, field); }
static tri_status cur_u64(cursor *c, uint64_t *v, const char *field) { return cur_bytes(c, v, 8, field); }

static tri_status cur_str(cursor *c, tri__gguf_str *s, const char *field) {
    uint64_t len;
    tri_status st = cur_u64(c, &len, field);
    if (st) return st;
    if (len > cur_left(c)) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: %s: %s: string length %" PRIu64 " at offset %" PRIu64
                         " past end of file (%" PRIu64 " bytes left)",
                         c->path, c->what, field, len, c->pos - 8, cur_left(c));
    }
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += len;
    return TRI_STATUS_OK;
}

// ---- metadata values ----

static tri_status read_type(cursor *c, tri__gguf_type *type, const char *field) {
    uint32_t t;
    *type = TRI_GGUF_TYPE_UINT8;
    tri_status st = cur_u32(c, &t, field);
    if (st) return st;
    if (t >= GGUF_N_VALUE_TYPES) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: %s: unknown value type %" PRIu32, c->path,
                         c->what, field, t);
    }
    *type = (tri__gguf_type)t;
    return TRI_STATUS_OK;
}

static tri_status read_value(tri__gguf *g, cursor *c, tri__gguf_type type, tri__gguf_value *v,
                             int depth) {
    tri_status st = TRI_STATUS_OK;
    v->type = type;
    switch (type) {
    case TRI_GGUF_TYPE_UINT8: {
        uint8_t x;
        st = cur_bytes(c, &x, 1, "value");
        v->u = x;
        break;
    }
    case TRI_GGUF_TYPE_INT8: {
        int8_t x;
        st = cur_bytes(c, &x, 1, "value");
        v->i = x;
        break;
    }
    case TRI_GGUF_TYPE_UINT16: {
        uint16_t x;
        st = cur_bytes(c, &x, 2, "value");
        v->u = x;
        break;
    }
    case TRI_GGUF_TYPE_INT16: {
        int16_t x;
        st = cur_bytes(c, &x, 2, "value");
        v->i = x;
        break;
    }
    case TRI_GGUF_TYPE_UINT32: {
        uint32_t x;
        st = cur_bytes(c, &x, 4, "value");
        v->u = x;
        break;
    }
    case TRI_GGUF_TYPE_INT32: {
        int32_t x;
        st = cur_bytes(c, &x, 4, "value");
        v->i = x;
        break;
    }
    case TRI_GGUF_TYPE_UINT64: {
        uint64_t x;
        st = cur_bytes(c, &x, 8, "value");
        v->u = x;
        break;
    }
    case TRI_GGUF_TYPE_INT64: {
        int64_t x;
        st = cur_bytes(c, &x, 8, "value");
        v->i = x;
        break;
    }
    case TRI_GGUF_TYPE_FLOAT32: {
        float x;
        st = cur_bytes(c, &x, 4, "value");
        v->f = (double)x;
        break;
    }
    case TRI_GGUF_TYPE_FLOAT64: {
        double x;
        st = cur_bytes(c, &x, 8, "value");
        v->f = x;
        break;
    }
    case TRI_GGUF_TYPE_BOOL: {
        uint8_t x = 0;
        st = cur_bytes(c, &x, 1, "value");
        if (!st && x > 1) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: bool value %u is neither 0 nor 1",
                           c->path, c->what, x);
        }
        v->b = x != 0;
        break;
    }
    case TRI_GGUF_TYPE_STRING:
        st = cur_str(c, &v->str, "string value");
        break;
    case TRI_GGUF_TYPE_ARRAY: {
        tri__gguf_type elem;
        uint64_t n;
        if ((st = read_type(c, &elem, "array element type"))) break;
        if ((st = cur_u64(c, &n, "array count"))) break;
        if (elem == TRI_GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_DEPTH) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: arrays nested more than %d deep",
                           c->path, c->what, GGUF_MAX_DEPTH);
            break;
        }
        if (n > cur_left(c) / value_min_bytes[elem]) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT,
                           "%s: %s: array count %" PRIu64 " of %s at offset %" PRIu64
                           " past end of file (%" PRIu64 " bytes left)",
                           c->path, c->what, n, tri__gguf_type_name(elem), c->pos - 8, cur_left(c));
            break;
        }
        tri__gguf_value *items = arena_alloc(g, n);
        if (n && !items) {
            st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: %s: no memory for %" PRIu64 " array items",
                           c->path, c->what, n);
            break;
        }
        for (uint64_t k = 0; k < n && !st; k++) st = read_value(g, c, elem, &items[k], depth + 1);
        v->arr.elem = elem;
        v->arr.n = n;
        v->arr.items = items;
        break;
    }
    }
    return st;
}

// ---- lookup ----

static const tri__gguf_kv *kv_sorted(const tri__gguf *g, int64_t i) { return &g->kvs[g->kv_by_key[i]]; }
static const tri__gguf_tensor *tensor_sorted(const tri__gguf *g, int64_t i) {
    return &g->tensors[g->tensor_by_name[i]];
}

const tri__gguf_value *tri__gguf_find(const tri__gguf *g, const char *key) {
    uint64_t klen = strlen(key);
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(kv_sorted(g, mid)->key, key, klen);
        if (c == 0) return &kv_sorted(g, mid)->value;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const tri__gguf_tensor *tri__gguf_find_tensor(const tri__gguf *g, const char *name) {
    uint64_t nlen = strlen(name);
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(tensor_sorted(g, mid)->name, name, nlen);
        if (c == 0) return tensor_sorted(g, mid);
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

// qsort has no context argument; the arrays being sorted are reached through this pointer, which
// is only set during open. open is not reentrant through it because a comparison never calls out.
static _Thread_local const tri__gguf *sort_ctx;

static int cmp_kv_index(const void *a, const void *b) {
    const tri__gguf_str *ka = &sort_ctx->kvs[*(const int64_t *)a].key;
    const tri__gguf_str *kb = &sort_ctx->kvs[*(const int64_t *)b].key;
    return str_cmp(*ka, kb->ptr, kb->len);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const tri__gguf_str *na = &sort_ctx->tensors[*(const int64_t *)a].name;
    const tri__gguf_str *nb = &sort_ctx->tensors[*(const int64_t *)b].name;
    return str_cmp(*na, nb->ptr, nb->len);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    uint64_t oa = sort_ctx->tensors[*(const int64_t *)a].offset;
    uint64_t ob = sort_ctx->tensors[*(const int64_t *)b].offset;
    return oa < ob ? -1 : oa > ob;
}

static int64_t *sorted_indices(const tri__gguf *g, int64_t n, int (*cmp)(const void *, const void *)) {
    int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    if (!idx) return NULL;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    sort_ctx = g;
    if (n > 1) qsort(idx, (size_t)n, sizeof *idx, cmp);
    sort_ctx = NULL;
    return idx;
}

// ---- typed getters ----

static tri_status wrong_type(const tri__gguf *g, const char *key, const tri__gguf_value *v,
                             const char *want) {
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': value has type %s, expected %s",
                     g->path, key, tri__gguf_type_name(v->type), want);
}

static bool is_unsigned(tri__gguf_type t) {
    return t == TRI_GGUF_TYPE_UINT8 || t == TRI_GGUF_TYPE_UINT16 || t == TRI_GGUF_TYPE_UINT32 ||
           t == TRI_GGUF_TYPE_UINT64;
}

static bool is_signed(tri__gguf_type t) {
    return t == TRI_GGUF_TYPE_INT8 || t == TRI_GGUF_TYPE_INT16 || t == TRI_GGUF_TYPE_INT32 ||
           t == TRI_GGUF_TYPE_INT64;
}

static tri_status find_or_fail(const tri__gguf *g, const char *key, const tri__gguf_value **v) {
    *v = tri__gguf_find(g, key);
    if (!*v) return tri__fail(TRI_STATUS_NOT_FOUND, "%s: key '%s': not found", g->path, key);
    return TRI_STATUS_OK;
}

tri_status tri__gguf_get_u32(const tri__gguf *g, const char *key, uint32_t *out) {
    const tri__gguf_value *v;
    tri_status st = find_or_fail(g, key, &v);
    if (st) return st;
    if (is_unsigned(v->type)) {
        if (v->u > UINT32_MAX) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': value %" PRIu64 " does not fit uint32",
                             g->path, key, v->u);
        }
        *out = (uint32_t)v->u;
        return TRI_STATUS_OK;
    }
    if (is_signed(v->type)) {
        if (v->i < 0 || v->i > (int64_t)UINT32_MAX) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': value %" PRId64 " does not fit uint32",
                             g->path, key, v->i);
        }
        *out = (uint32_t)v->i;
        return TRI_STATUS_OK;
    }
    return wrong_type(g, key, v, "an integer");
}

tri_status tri__gguf_get_f32(const tri__gguf *g, const char *key, float *out) {
    const tri__gguf_value *v;
    tri_status st = find_or_fail(g, key, &v);
    if (st) return st;
    if (v->type == TRI_GGUF_TYPE_FLOAT32 || v->type == TRI_GGUF_TYPE_FLOAT64) {
        if (isfinite(v->f) && fabs(v->f) > (double)FLT_MAX) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': value %g does not fit float32",
                             g->path, key, v->f);
        }
        *out = (float)v->f;
        return TRI_STATUS_OK;
    }
    if (is_unsigned(v->type)) {
        *out = (float)v->u;
        return TRI_STATUS_OK;
    }
    if (is_signed(v->type)) {
        *out = (float)v->i;
        return TRI_STATUS_OK;
    }
    return wrong_type(g, key, v, "a number");
}

tri_status tri__gguf_get_bool(const tri__gguf *g, const char *key, bool *out) {
    const tri__gguf_value *v;
    tri_status st = find_or_fail(g, key, &v);
    if (st) return st;
    if (v->type != TRI_GGUF_TYPE_BOOL) return wrong_type(g, key, v, "bool");
    *out = v->b;
    return TRI_STATUS_OK;
}

tri_status tri__gguf_get_str(const tri__gguf *g, const char *key, tri__gguf_str *out) {
    const tri__gguf_value *v;
    tri_status st = find_or_fail(g, key, &v);
    if (st) return st;
    if (v->type != TRI_GGUF_TYPE_STRING) return wrong_type(g, key, v, "string");
    *out = v->str;
    return TRI_STATUS_OK;
}

tri_status tri__gguf_get_arr(const tri__gguf *g, const char *key, tri__gguf_type elem,
                             const tri__gguf_value **out) {
    const tri__gguf_value *v;
    tri_status st = find_or_fail(g, key, &v);
    if (st) return st;
    if (v->type != TRI_GGUF_TYPE_ARRAY) return wrong_type(g, key, v, "array");
    if (v->arr.elem != elem) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': array of %s, expected an array of %s",
                         g->path, key, tri__gguf_type_name(v->arr.elem), tri__gguf_type_name(elem));
    }
    *out = v;
    return TRI_STATUS_OK;
}

// ---- accessors ----

const char *tri__gguf_path(const tri__gguf *g) { return g->path; }
uint32_t tri__gguf_version(const tri__gguf *g) { return g->version; }
uint32_t tri__gguf_alignment(const tri__gguf *g) { return g->alignment; }
uint64_t tri__gguf_file_size(const tri__gguf *g) { return g->size; }
uint64_t tri__gguf_data_start(const tri__gguf *g) { return g->data_start; }
int64_t tri__gguf_n_kv(const tri__gguf *g) { return g->n_kv; }
int64_t tri__gguf_n_tensors(const tri__gguf *g) { return g->n_tensors; }

const tri__gguf_kv *tri__gguf_kv_at(const tri__gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL;
}

const tri__gguf_tensor *tri__gguf_tensor_at(const tri__gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

// ---- parsing ----

static tri_status parse_header(tri__gguf *g, cursor *c, uint64_t *n_tensors, uint64_t *n_kv) {
    char magic[4];
    snprintf(c->what, sizeof c->what, "header");
    tri_status st = cur_bytes(c, magic, 4, "magic");
    if (st) return st;
    if (memcmp(magic, "GGUF", 4) != 0) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: header: magic: bytes %02x %02x %02x %02x are not \"GGUF\"", g->path,
                         (unsigned char)magic[0], (unsigned char)magic[1], (unsigned char)magic[2],
                         (unsigned char)magic[3]);
    }
    if ((st = cur_u32(c, &g->version, "version"))) return st;
    if (g->version == 1) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: header: version: GGUF v1 (32-bit counts) is not supported, only v2 and "
                         "v3; convert the file again with a current llama.cpp",
                         g->path);
    }
    if (g->version == 0x02000000u || g->version == 0x03000000u) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: header: version: the file is big endian; only little-endian GGUF is "
                         "supported",
                         g->path);
    }
    if (g->version != 2 && g->version != 3) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: header: version: %" PRIu32 " is not 2 or 3",
                         g->path, g->version);
    }
    if ((st = cur_u64(c, n_tensors, "tensor count"))) return st;
    if ((st = cur_u64(c, n_kv, "key/value count"))) return st;
    // Bound both counts by the bytes left before anything is allocated for them.
    if (*n_kv > cur_left(c) / GGUF_MIN_KV_BYTES) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: header: key/value count: %" PRIu64 " pairs cannot fit in the %" PRIu64
                         " bytes left",
                         g->path, *n_kv, cur_left(c));
    }
    if (*n_tensors > cur_left(c) / GGUF_MIN_TENSOR_INFO_BYTES) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: header: tensor count: %" PRIu64 " tensor infos cannot fit in the %" PRIu64
                         " bytes left",
                         g->path, *n_tensors, cur_left(c));
    }
    return TRI_STATUS_OK;
}

static tri_status parse_kvs(tri__gguf *g, cursor *c, uint64_t n_kv) {
    g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kvs);
    if (!g->kvs) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for %" PRIu64 " keys", g->path, n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        tri__gguf_kv *kv = &g->kvs[i];
        tri_status st;
        snprintf(c->what, sizeof c->what, "key #%" PRIu64, i);
        if ((st = cur_str(c, &kv->key, "key"))) return st;
        snprintf(c->what, sizeof c->what, "key '%s'", printable(kv->key).s);
        if (kv->key.len > GGUF_MAX_KEY_LEN) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: key is %" PRIu64 " bytes, more than %u",
                             g->path, c->what, kv->key.len, GGUF_MAX_KEY_LEN);
        }
        tri__gguf_type type;
        if ((st = read_type(c, &type, "value type"))) return st;
        if ((st = read_value(g, c, type, &kv->value, 0))) return st;
        g->n_kv = (int64_t)i + 1;
    }
    g->kv_by_key = sorted_indices(g, g->n_kv, cmp_kv_index);
    if (!g->kv_by_key) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for the key index", g->path);
    for (int64_t i = 1; i < g->n_kv; i++) {
        tri__gguf_str a = kv_sorted(g, i - 1)->key, b = kv_sorted(g, i)->key;
        if (str_cmp(a, b.ptr, b.len) == 0) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': duplicate key", g->path,
                             printable(b).s);
        }
    }
    return TRI_STATUS_OK;
}

static tri_status parse_alignment(tri__gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!tri__gguf_find(g, "general.alignment")) return TRI_STATUS_OK;
    uint32_t a;
    tri_status st = tri__gguf_get_u32(g, "general.alignment", &a);
    if (st) return st;
    if (a == 0 || (a & (a - 1)) != 0) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: key 'general.alignment': %" PRIu32 " is not a nonzero power of two",
                         g->path, a);
    }
    g->alignment = a;
    return TRI_STATUS_OK;
}

static tri_status parse_tensor_info(tri__gguf *g, cursor *c, uint64_t i, tri__gguf_tensor *t) {
    tri_status st;
    snprintf(c->what, sizeof c->what, "tensor #%" PRIu64, i);
    if ((st = cur_str(c, &t->name, "name"))) return st;
    snprintf(c->what, sizeof c->what, "tensor '%s'", printable(t->name).s);

    uint32_t n_dims;
    if ((st = cur_u32(c, &n_dims, "n_dims"))) return st;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: n_dims %" PRIu32 " is not in 1..%d", g->path,
                         c->what, n_dims, GGUF_MAX_DIMS);
    }
    uint64_t ne[GGUF_MAX_DIMS];  // innermost first, as stored
    for (uint32_t d = 0; d < n_dims; d++) {
        if ((st = cur_u64(c, &ne[d], "dimension"))) return st;
        if (ne[d] == 0 || ne[d] > INT64_MAX) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: dimension %" PRIu32 " is %" PRIu64
                             ", not in 1..2^63-1", g->path, c->what, d, ne[d]);
        }
    }
    uint32_t ggml_type;
    if ((st = cur_u32(c, &ggml_type, "type"))) return st;
    if ((st = cur_u64(c, &t->offset, "offset"))) return st;

    int dtype = ggml_to_dtype(ggml_type);
    if (dtype < 0) {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: %s: type: ggml type %s (%" PRIu32
                         ") is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                         "q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs are)",
                         g->path, c->what, tri__gguf_ggml_type_name(ggml_type), ggml_type);
    }
    t->type = (tri_dtype)dtype;
    t->n_dims = (int32_t)n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->shape[d] = d < n_dims ? (int64_t)ne[n_dims - 1 - d] : 1;
    }

    int64_t row = tri__dtype_row_bytes(t->type, (int64_t)ne[0]);
    if (row < 0) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: %s: innermost dimension %" PRIu64 " is not a multiple of the %s block of %"
                         PRId64 " elements",
                         g->path, c->what, ne[0], tri_dtype_name(t->type),
                         tri__dtype_block_elems(t->type));
    }
    uint64_t n_bytes = (uint64_t)row;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] > (uint64_t)INT64_MAX / n_bytes) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s: size in bytes overflows 2^63", g->path,
                             c->what);
        }
        n_bytes *= ne[d];
    }
    t->n_bytes = n_bytes;
    return TRI_STATUS_OK;
}

static tri_status parse_tensors(tri__gguf *g, cursor *c, uint64_t n_tensors) {
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    if (!g->tensors) {
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for %" PRIu64 " tensor infos",
                         g->path, n_tensors);
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        tri_status st = parse_tensor_info(g, c, i, &g->tensors[i]);
        if (st) return st;
        g->n_tensors = (int64_t)i + 1;
    }
    g->tensor_by_name = sorted_indices(g, g->n_tensors, cmp_tensor_name);
    if (!g->tensor_by_name) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for the tensor index", g->path);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        tri__gguf_str a = tensor_sorted(g, i - 1)->name, b = tensor_sorted(g, i)->name;
        if (str_cmp(a, b.ptr, b.len) == 0) {
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': duplicate tensor name", g->path,
                             printable(b).s);
        }
    }

    // The data section starts at the first multiple of the alignment after the tensor infos.
    uint64_t a = g->alignment;
    uint64_t pad = (a - c->pos % a) % a;
    if (pad > UINT64_MAX - c->pos) return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: data section: start overflows", g->path);
    g->data_start = c->pos + pad;
    if (g->n_tensors == 0) return TRI_STATUS_OK;  // the padding before no data may be missing
    if (g->data_start > g->size) {
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: data section: starts at %" PRIu64 ", past end of file (%" PRIu64 " bytes)",
                         g->path, g->data_start, g->size);
    }
    uint64_t data_size = g->size - g->data_start;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        tri__gguf_tensor *t = &g->tensors[i];
        if (t->offset % a != 0) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                             g->path, printable(t->name).s, t->offset, g->alignment);
        }
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            return tri__fail(TRI_STATUS_BAD_FORMAT,
                             "%s: tensor '%s': data at offset %" PRIu64 " (%" PRIu64
                             " bytes) past end of file (data section holds %" PRIu64 " bytes)",
                             g->path, printable(t->name).s, t->offset, t->n_bytes, data_size);
        }
        t->data = g->map + g->data_start + t->offset;
    }

    // Tensors may come in any order in the data section but must not share bytes.
    int64_t *by_off = sorted_indices(g, g->n_tensors, cmp_tensor_offset);
    if (!by_off) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for the offset index", g->path);
    tri_status st = TRI_STATUS_OK;
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const tri__gguf_tensor *prev = &g->tensors[by_off[i - 1]], *t = &g->tensors[by_off[i]];
        if (prev->offset + prev->n_bytes > t->offset) {
            name_buf pn = printable(prev->name);
            st = tri__fail(TRI_STATUS_BAD_FORMAT,
                           "%s: tensor '%s': data at offset %" PRIu64 " overlaps tensor '%s' (offset %"
                           PRIu64 ", %" PRIu64 " bytes)",
                           g->path, printable(t->name).s, t->offset, pn.s, prev->offset, prev->n_bytes);
            break;
        }
    }
    free(by_off);
    return st;
}

// ---- open and close ----

static tri_status map_file(tri__gguf *g, bool populate) {
    int fd;
    uint64_t size;
    tri_status st = tri__file_open(g->path, &fd, &size);
    if (st) return st;
    // Smaller than magic, version and the two counts: nothing to map (mmap of 0 bytes fails).
    if (size < 24) {
        tri__file_close(g->path, fd);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: header: file is %" PRIu64 " bytes, too small for a GGUF header (24)",
                         g->path, size);
    }
    g->size = size;
    const void *p;
    if ((st = tri__file_map(g->path, fd, size, populate, &p))) return st;
    g->map = p;
    return TRI_STATUS_OK;
}

tri_status tri__gguf_open_ex(const char *path, bool populate, tri__gguf **out) {
    if (!path || !out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "gguf open: NULL argument");
    *out = NULL;
    tri_status st;
    tri__gguf *g = calloc(1, sizeof *g);
    if (!g) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for the reader", path);
    g->path = strdup(path);
    if (!g->path) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: no memory for the reader", path);
        goto fail;
    }
    if ((st = map_file(g, populate))) goto fail;

    cursor c = {.p = g->map, .size = g->size, .pos = 0, .path = g->path};
    uint64_t n_tensors = 0, n_kv = 0;
    if ((st = parse_header(g, &c, &n_tensors, &n_kv))) goto fail;
    if ((st = parse_kvs(g, &c, n_kv))) goto fail;
    if ((st = parse_alignment(g))) goto fail;
    if ((st = parse_tensors(g, &c, n_tensors))) goto fail;
    *out = g;
    return TRI_STATUS_OK;
fail:
    tri__gguf_close(g);
    return st;
}

tri_status tri__gguf_open(const char *path, tri__gguf **out) { return tri__gguf_open_ex(path, false, out); }

void tri__gguf_close(tri__gguf *g) {
    if (!g) return;
    tri__file_unmap(g->path, g->map, g->size);
    while (g->arena) {
        value_block *next = g->arena->next;
        free(g->arena);
        g->arena = next;
    }
    free(g->kv_by_key);
    free(g->kvs);
    free(g->tensor_by_name);
    free(g->tensors);
    free(g->path);
    free(g);
}
