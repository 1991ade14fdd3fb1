// test-safetensors.c - safetensors files, sharded checkpoints, config.json and HF tensor names,
// against files written by the `safetensors` Python package (tests/fixtures/make-safetensors.py).
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "hf-config.h"
#include "safetensors.h"
#include "test-util.h"

#define FX(name) tt_fixture("safetensors", name)

// Fails the test unless the last error names every one of the given pieces.
static void assert_msg_has(const char *piece) {
    cr_assert(strstr(tri_last_error(), piece) != NULL, "message '%s' does not mention '%s'",
              tri_last_error(), piece);
}

static json_object *load_json(const char *path) {
    json_object *o = json_object_from_file(path);
    cr_assert(o != NULL, "cannot parse %s", path);
    return o;
}

static float elem_f32(const tri__st_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    uint16_t h;
    float f;
    switch (t->type) {
    case TRI_DTYPE_F32: memcpy(&f, p + 4 * i, 4); return f;
    case TRI_DTYPE_F16: memcpy(&h, p + 2 * i, 2); return tri__f16_to_f32(h);
    case TRI_DTYPE_BF16: memcpy(&h, p + 2 * i, 2); return tri__bf16_to_f32(h);
    default: cr_assert_fail("unexpected dtype"); return 0;
    }
}

static tri_dtype dtype_of(const char *s) {
    if (strcmp(s, "F32") == 0) return TRI_DTYPE_F32;
    if (strcmp(s, "F16") == 0) return TRI_DTYPE_F16;
    if (strcmp(s, "BF16") == 0) return TRI_DTYPE_BF16;
    cr_assert_fail("fixture dtype %s", s);
    return TRI_DTYPE_COUNT;
}

// Checks tensor t against the fixture's description: dtype, shape, offsets and every value.
static void check_tensor(const char *name, const tri__st_tensor *t, json_object *want) {
    cr_assert(t != NULL, "tensor %s not found", name);
    cr_assert_str_eq(t->name, name);
    json_object *v;
    cr_assert(json_object_object_get_ex(want, "dtype", &v));
    cr_assert_eq(t->type, dtype_of(json_object_get_string(v)), "%s: dtype", name);
    cr_assert(json_object_object_get_ex(want, "shape", &v));
    int n_dims = (int)json_object_array_length(v);
    cr_assert_eq(t->n_dims, n_dims, "%s: n_dims", name);
    int64_t n_elems = 1;
    for (int i = 0; i < n_dims; i++) {
        int64_t d = json_object_get_int64(json_object_array_get_idx(v, i));
        cr_assert_eq(t->shape[i], d, "%s: dim %d", name, i);
        n_elems *= d;
    }
    for (int i = n_dims; i < 4; i++) cr_assert_eq(t->shape[i], 1);
    cr_assert(json_object_object_get_ex(want, "begin", &v));
    int64_t begin = json_object_get_int64(v);
    cr_assert(json_object_object_get_ex(want, "end", &v));
    int64_t end = json_object_get_int64(v);
    cr_assert_eq(t->offset, (uint64_t)begin, "%s: offset", name);
    cr_assert_eq(t->n_bytes, (uint64_t)(end - begin), "%s: n_bytes", name);
    cr_assert(json_object_object_get_ex(want, "values", &v));
    cr_assert_eq((int64_t)json_object_array_length(v), n_elems, "%s: values", name);
    for (int64_t i = 0; i < n_elems; i++) {
        float w = (float)json_object_get_double(json_object_array_get_idx(v, (size_t)i));
        cr_assert_eq(elem_f32(t, i), w, "%s[%lld]: %g != %g", name, (long long)i,
                     (double)elem_f32(t, i), (double)w);
    }
}

// ---- single files ----

static void check_single(const tri__st_file *f) {
    json_object *want = load_json(FX("single.json"));
    json_object *tensors = json_object_object_get(want, "tensors");
    cr_assert_eq(tri__st_file_n_tensors(f), json_object_object_length(tensors));
    json_object_object_foreach(tensors, name, info) {
        check_tensor(name, tri__st_file_find(f, name), info);
    }
    // file order: increasing offsets, each tensor right after the previous one
    uint64_t pos = 0;
    for (int64_t i = 0; i < tri__st_file_n_tensors(f); i++) {
        const tri__st_tensor *t = tri__st_file_tensor_at(f, i);
        cr_assert_eq(t->offset, pos);
        cr_assert_eq((const uint8_t *)t->data - (const uint8_t *)tri__st_file_tensor_at(f, 0)->data,
                     (ptrdiff_t)t->offset);
        pos += t->n_bytes;
    }
    cr_assert_eq(pos, tri__st_file_data_size(f));
    cr_assert_null(tri__st_file_tensor_at(f, -1));
    cr_assert_null(tri__st_file_tensor_at(f, tri__st_file_n_tensors(f)));
    cr_assert_null(tri__st_file_find(f, "nope"));
    cr_assert_null(tri__st_file_find(f, "b"));

    json_object *meta = json_object_object_get(want, "metadata");
    cr_assert_eq(tri__st_file_n_meta(f), json_object_object_length(meta));
    json_object_object_foreach(meta, key, val) {
        const char *got = tri__st_file_meta_find(f, key);
        cr_assert(got != NULL, "metadata %s", key);
        cr_assert_str_eq(got, json_object_get_string(val));
    }
    cr_assert_str_eq(tri__st_file_meta_find(f, "note"), "h\xc3\xa9llo w\xc3\xb6rld");
    cr_assert_null(tri__st_file_meta_find(f, "missing"));
    // the writer's metadata order is a hash map's: only check that meta_at lists every key once
    for (int64_t i = 0; i < tri__st_file_n_meta(f); i++) {
        const tri__st_meta *m = tri__st_file_meta_at(f, i);
        cr_assert_str_eq(m->value, json_object_get_string(json_object_object_get(meta, m->key)));
        for (int64_t j = 0; j < i; j++) cr_assert_str_neq(tri__st_file_meta_at(f, j)->key, m->key);
    }
    cr_assert_null(tri__st_file_meta_at(f, tri__st_file_n_meta(f)));
    json_object_put(want);
}

Test(safetensors, single_file_matches_python) {
    tri__st_file *f = NULL;
    cr_assert_eq(tri__st_file_open(FX("single.safetensors"), false, &f), TRI_STATUS_OK, "%s",
                 tri_last_error());
    check_single(f);
    size_t len;
    free(tt_read_file(FX("single.safetensors"), &len));
    cr_assert_eq(tri__st_file_size(f), len);
    tri__st_file_close(f);
    tri__st_file_close(NULL);
}

Test(safetensors, populate_and_from_memory) {
    tri__st_file *f = NULL;
    cr_assert_eq(tri__st_file_open(FX("single.safetensors"), true, &f), TRI_STATUS_OK);
    check_single(f);
    tri__st_file_close(f);
    size_t len;
    uint8_t *buf = tt_read_file(FX("single.safetensors"), &len);
    cr_assert_eq(tri__st_file_from_memory("mem", buf, len, &f), TRI_STATUS_OK, "%s", tri_last_error());
    check_single(f);
    cr_assert_str_eq(tri__st_file_path(f), "mem");
    tri__st_file_close(f);
    free(buf);
}

Test(safetensors, rank0_tensor) {
    tri__st_file *f = NULL;
    cr_assert_eq(tri__st_file_open(FX("ok-raw.safetensors"), false, &f), TRI_STATUS_OK, "%s",
                 tri_last_error());
    const tri__st_tensor *s = tri__st_file_find(f, "s");
    cr_assert_eq(s->n_dims, 0);
    cr_assert_eq(s->n_bytes, 4);
    cr_assert_eq(elem_f32(s, 0), 2.5f);
    cr_assert_eq(tri__st_file_n_meta(f), 0);
    tri__st_file_close(f);
}

// Every cut of the file short of its full header fails, with the header length past the end.
Test(safetensors, truncated_file_fails_everywhere) {
    size_t len;
    uint8_t *buf = tt_read_file(FX("single.safetensors"), &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    const char *path = tt_tmp("truncated.safetensors");
    for (size_t cut = 0; cut < len; cut++) {
        tri__st_file *f = (tri__st_file *)1;
        tri_status st = tri__st_file_from_memory("cut", buf, cut, &f);
        cr_assert_eq(st, TRI_STATUS_BAD_FORMAT, "cut at %zu", cut);
        cr_assert_null(f);
        assert_msg_has("cut: ");
        if (cut >= 8 && cut < 8 + n) assert_msg_has("past the end");
        if (cut < 8 + n + 8) {  // and through the file system for the header part
            tt_write_file(path, buf, cut);
            cr_assert_eq(tri__st_file_open(path, false, &f), TRI_STATUS_BAD_FORMAT, "cut at %zu", cut);
            assert_msg_has(path);
        }
    }
    free(buf);
}

// The JSON header cut at every byte, with the length field and the data kept consistent: a cut
// inside the JSON object is malformed JSON; a cut in the trailing spaces leaves a valid file.
Test(safetensors, truncated_header_json_fails_everywhere) {
    size_t len;
    uint8_t *buf = tt_read_file(FX("single.safetensors"), &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    size_t close_brace = 0;
    for (size_t i = 8; i < 8 + n; i++) {
        if (buf[i] == '}') close_brace = i - 8;
    }
    uint8_t *img = malloc(len);
    size_t data_len = len - 8 - n;
    for (uint64_t cut = 0; cut <= n; cut++) {
        for (int i = 0; i < 8; i++) img[i] = (uint8_t)(cut >> (8 * i));
        memcpy(img + 8, buf + 8, cut);
        memcpy(img + 8 + cut, buf + 8 + n, data_len);
        tri__st_file *f = NULL;
        tri_status st = tri__st_file_from_memory("hdr", img, 8 + cut + data_len, &f);
        if (cut > close_brace) {
            cr_assert_eq(st, TRI_STATUS_OK, "cut at %llu: %s", (unsigned long long)cut, tri_last_error());
            cr_assert_eq(tri__st_file_n_tensors(f), 6);
            tri__st_file_close(f);
        } else {
            cr_assert_eq(st, TRI_STATUS_BAD_FORMAT, "cut at %llu", (unsigned long long)cut);
            assert_msg_has("hdr: ");
        }
    }
    free(img);
    free(buf);
}

typedef struct bad_case {
    const char *file;
    tri_status status;
    const char *piece1;  // pieces the message must contain besides the path
    const char *piece2;
} bad_case;

static const bad_case bad_files[] = {
    {"bad-short.safetensors", TRI_STATUS_BAD_FORMAT, "too short", "header length"},
    {"bad-hlen-past-eof.safetensors", TRI_STATUS_BAD_FORMAT, "header length 1000", "past the end"},
    {"bad-hlen-huge.safetensors", TRI_STATUS_BAD_FORMAT, "header length 100000001", "limit"},
    {"bad-json.safetensors", TRI_STATUS_BAD_FORMAT, "malformed JSON", "unexpected end"},
    {"bad-json-trailing.safetensors", TRI_STATUS_BAD_FORMAT, "malformed JSON", "column 10"},
    {"bad-not-object.safetensors", TRI_STATUS_BAD_FORMAT, "header", "'{'"},
    {"bad-offsets-range.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x'", "field 'data_offsets': end 17 is past"},
    {"bad-offsets-order.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x'", "begin 8 > end 4"},
    {"bad-overlap.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'y'", "overlaps tensor 'x'"},
    {"bad-gap.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'y'", "gap: bytes [8, 12)"},
    {"bad-trailing.safetensors", TRI_STATUS_BAD_FORMAT, "data buffer", "cover only 8"},
    {"bad-size.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'data_offsets'", "need 24"},
    {"bad-size-overflow.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'shape'", "overflow"},
    {"bad-shape-negative.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'shape'", ">= 0"},
    {"bad-shape-type.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'shape'", "entry 0"},
    {"bad-shape-float.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'shape'", "integer"},
    {"bad-dtype-missing.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'dtype'", "missing"},
    {"bad-offsets-three.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x': field 'data_offsets'", "of 2"},
    {"bad-entry-type.safetensors", TRI_STATUS_BAD_FORMAT, "tensor 'x'", "not an object"},
    {"bad-meta-type.safetensors", TRI_STATUS_BAD_FORMAT, "field '__metadata__.k'", "not a string"},
    {"bad-dtype-unknown.safetensors", TRI_STATUS_UNSUPPORTED, "tensor 'x': field 'dtype'", "'Q4_K'"},
    {"i8.safetensors", TRI_STATUS_UNSUPPORTED, "tensor 'q': field 'dtype'", "'I8'"},
    {"f64.safetensors", TRI_STATUS_UNSUPPORTED, "tensor 'w': field 'dtype'", "'F64'"},
    {"rank5.safetensors", TRI_STATUS_UNSUPPORTED, "tensor 'w': field 'shape'", "rank 5"},
};

Test(safetensors, bad_files_fail_naming_file_and_field) {
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        const bad_case *c = &bad_files[i];
        char path[4096];
        snprintf(path, sizeof path, "%s", FX(c->file));
        tri__st_file *f = (tri__st_file *)1;
        tri_status st = tri__st_file_open(path, false, &f);
        cr_assert_eq(st, c->status, "%s: status %d (%s), want %d", c->file, st, tri_last_error(),
                     c->status);
        cr_assert_null(f);
        assert_msg_has(path);
        assert_msg_has(c->piece1);
        assert_msg_has(c->piece2);
        // the model set reports the same
        tri__st_model *m = (tri__st_model *)1;
        cr_assert_eq(tri__st_model_open(path, false, &m), c->status, "%s", c->file);
        cr_assert_null(m);
        assert_msg_has(c->piece1);
    }
}

Test(safetensors, missing_file_and_directory) {
    tri__st_file *f;
    cr_assert_eq(tri__st_file_open(FX("does-not-exist.safetensors"), false, &f), TRI_STATUS_NOT_FOUND);
    assert_msg_has("does-not-exist.safetensors");
    cr_assert_eq(tri__st_file_open(FX("dir"), false, &f), TRI_STATUS_IO);
    tri__st_model *m;
    cr_assert_eq(tri__st_model_open(FX("does-not-exist"), false, &m), TRI_STATUS_NOT_FOUND);
    cr_assert_eq(tri__st_model_open(FX("emptydir"), false, &m), TRI_STATUS_NOT_FOUND);
    assert_msg_has("emptydir");
    assert_msg_has("model.safetensors.index.json");
}

// ---- model sets ----

Test(safetensors, model_set_single_file_and_directory) {
    tri__st_model *m = NULL;
    cr_assert_eq(tri__st_model_open(FX("single.safetensors"), false, &m), TRI_STATUS_OK);
    cr_assert_eq(tri__st_model_n_files(m), 1);
    cr_assert_eq(tri__st_model_n_tensors(m), 6);
    cr_assert_eq(tri__st_model_total_bytes(m), 174);
    cr_assert_eq(tri__st_model_find(m, "c")->type, TRI_DTYPE_BF16);
    cr_assert_eq(tri__st_model_find(m, "c")->file, 0);
    char want_dir[4096];
    snprintf(want_dir, sizeof want_dir, "%s", FX(""));
    want_dir[strlen(want_dir) - 1] = '\0';  // no trailing '/'
    cr_assert_str_eq(tri__st_model_dir(m), want_dir);
    tri__st_model_close(m);

    cr_assert_eq(tri__st_model_open(FX("dir/"), false, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__st_model_n_tensors(m), 2);
    cr_assert_str_eq(tri__st_model_dir(m), FX("dir"));
    const tri__st_tensor *e = tri__st_model_find(m, "model.embed_tokens.weight");
    cr_assert_eq(e->type, TRI_DTYPE_F16);
    cr_assert_eq(e->shape[0], 16);
    cr_assert_eq(e->shape[1], 8);
    cr_assert_eq(elem_f32(tri__st_model_find(m, "model.norm.weight"), 7), 1.0f);
    tri__st_model_close(m);
    tri__st_model_close(NULL);
}

static void check_sharded(tri__st_model *m) {
    json_object *want = load_json(FX("sharded.json"));
    json_object *files = json_object_object_get(want, "files");
    json_object *tensors = json_object_object_get(want, "tensors");
    cr_assert_eq(tri__st_model_n_files(m), 3);
    for (int32_t i = 0; i < 3; i++) {
        const char *p = tri__st_file_path(tri__st_model_file_at(m, i));
        const char *want_name = json_object_get_string(json_object_array_get_idx(files, (size_t)i));
        cr_assert(strlen(p) > strlen(want_name) && strcmp(p + strlen(p) - strlen(want_name), want_name) == 0,
                  "shard %d is %s, want %s", i, p, want_name);
    }
    cr_assert_null(tri__st_model_file_at(m, 3));
    cr_assert_eq(tri__st_model_n_tensors(m), json_object_object_length(tensors));
    uint64_t total = 0;
    json_object_object_foreach(tensors, name, info) {
        const tri__st_tensor *t = tri__st_model_find(m, name);
        check_tensor(name, t, info);
        cr_assert_eq(t->file, json_object_get_int(json_object_object_get(info, "file")), "%s", name);
        total += t->n_bytes;
    }
    cr_assert_eq(tri__st_model_total_bytes(m), total);
    // listed shard by shard
    for (int64_t i = 1; i < tri__st_model_n_tensors(m); i++) {
        const tri__st_tensor *a = tri__st_model_tensor_at(m, i - 1), *b = tri__st_model_tensor_at(m, i);
        cr_assert(a->file < b->file || (a->file == b->file && a->offset < b->offset));
    }
    cr_assert_null(tri__st_model_tensor_at(m, tri__st_model_n_tensors(m)));
    cr_assert_null(tri__st_model_find(m, "model.layers.3.input_layernorm.weight"));
    cr_assert_str_eq(tri__st_model_dir(m), FX("sharded"));
    json_object_put(want);
}

Test(safetensors, sharded_checkpoint_by_index_and_directory) {
    tri__st_model *m = NULL;
    cr_assert_eq(tri__st_model_open(FX("sharded/model.safetensors.index.json"), false, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    check_sharded(m);
    tri__st_model_close(m);
    cr_assert_eq(tri__st_model_open(FX("sharded"), true, &m), TRI_STATUS_OK, "%s", tri_last_error());
    check_sharded(m);
    tri__st_model_close(m);
}

Test(safetensors, shard_tensor_missing_from_map_is_ignored) {
    tri__st_model *m = NULL;
    cr_assert_eq(tri__st_model_open(FX("sharded-extra"), false, &m), TRI_STATUS_OK, "%s",
                 tri_last_error());
    cr_assert_eq(tri__st_model_n_tensors(m), 8);
    cr_assert_null(tri__st_model_find(m, "rotary_emb.inv_freq"));
    cr_assert_eq(tri__st_file_n_tensors(tri__st_model_file_at(m, 1)), 3);
    tri__st_model_close(m);
}

static const bad_case bad_shards[] = {
    {"shard-missing", TRI_STATUS_BAD_FORMAT, "field 'weight_map.y'", "not in shard 's1.safetensors'"},
    {"shard-dup", TRI_STATUS_BAD_FORMAT, "tensor 'x': in two shards", "s2.safetensors"},
    {"shard-escape", TRI_STATUS_BAD_FORMAT, "field 'weight_map.y'", "not a plain file name"},
    {"shard-dotdot", TRI_STATUS_BAD_FORMAT, "field 'weight_map.y'", "shard '..'"},
    {"shard-absent", TRI_STATUS_NOT_FOUND, "s3.safetensors", "cannot open"},
    {"shard-badjson", TRI_STATUS_BAD_FORMAT, "malformed JSON", "line 1"},
    {"shard-nomap", TRI_STATUS_BAD_FORMAT, "field 'weight_map'", "missing"},
    {"shard-maptype", TRI_STATUS_BAD_FORMAT, "field 'weight_map'", "not an object"},
    {"shard-valtype", TRI_STATUS_BAD_FORMAT, "field 'weight_map.x'", "not a string"},
};

Test(safetensors, bad_sharded_checkpoints) {
    for (size_t i = 0; i < sizeof bad_shards / sizeof bad_shards[0]; i++) {
        const bad_case *c = &bad_shards[i];
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", FX(c->file));
        tri__st_model *m = (tri__st_model *)1;
        tri_status st = tri__st_model_open(dir, false, &m);
        cr_assert_eq(st, c->status, "%s: status %d (%s)", c->file, st, tri_last_error());
        cr_assert_null(m);
        assert_msg_has(dir);
        assert_msg_has(c->piece1);
        assert_msg_has(c->piece2);
    }
}

Test(safetensors, index_parse_keeps_order) {
    static const char text[] = "{\"metadata\": {\"total_size\": 12},\n"
                               " \"weight_map\": {\"b\": \"s2.safetensors\", \"a\": \"s1.safetensors\"}}";
    tri__st_index *idx = NULL;
    cr_assert_eq(tri__st_index_parse("idx", text, sizeof text - 1, &idx), TRI_STATUS_OK);
    cr_assert_eq(tri__st_index_n_entries(idx), 2);
    cr_assert_str_eq(tri__st_index_entry_at(idx, 0)->tensor, "b");
    cr_assert_str_eq(tri__st_index_entry_at(idx, 1)->file, "s1.safetensors");
    cr_assert_null(tri__st_index_entry_at(idx, 2));
    tri__st_index_free(idx);
    static const char *const bad[] = {
        "{\"weight_map\": {}}",
        "{\"weight_map\": {\"a\": \"\"}}",
        "{\"weight_map\": {\"a\": \"/etc/passwd\"}}",
        "{\"weight_map\": {\"a\": \"x\\\\y\"}}",
        "{\"weight_map\": {\"a\": \"x\\u0000y\"}}",
        "null",
        "{\"weight_map\": {\"a\": \"x\"}} 1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idx = (tri__st_index *)1;
        cr_assert_eq(tri__st_index_parse("idx", bad[i], strlen(bad[i]), &idx), TRI_STATUS_BAD_FORMAT,
                     "%s", bad[i]);
        cr_assert_null(idx);
        assert_msg_has("idx: ");
    }
}

// ---- config.json ----

static tri_rope_scaling scaling_of(const char *s) {
    if (strcmp(s, "none") == 0) return TRI_ROPE_SCALING_NONE;
    if (strcmp(s, "linear") == 0) return TRI_ROPE_SCALING_LINEAR;
    if (strcmp(s, "dynamic") == 0) return TRI_ROPE_SCALING_DYNAMIC;
    if (strcmp(s, "yarn") == 0) return TRI_ROPE_SCALING_YARN;
    if (strcmp(s, "llama3") == 0) return TRI_ROPE_SCALING_LLAMA3;
    cr_assert_fail("scaling %s", s);
    return TRI_ROPE_SCALING_NONE;
}

static double want_num(json_object *e, const char *key) {
    json_object *v;
    cr_assert(json_object_object_get_ex(e, key, &v), "expectation lacks %s", key);
    return json_object_get_double(v);
}

Test(safetensors, configs_match_transformers_semantics) {
    json_object *all = load_json(FX("configs-expect.json"));
    int n = 0;
    json_object_object_foreach(all, name, e) {
        char rel[256], path[4096];
        snprintf(rel, sizeof rel, "configs/%s.json", name);
        snprintf(path, sizeof path, "%s", FX(rel));
        tri_model_config c;
        memset(&c, 0xa5, sizeof c);
        char *arch = NULL;
        cr_assert_eq(tri__hf_config_load(path, &c, &arch), TRI_STATUS_OK, "%s: %s", name, tri_last_error());
        cr_assert_str_eq(arch, "llama");
        free(arch);
        cr_assert_eq(c.n_vocab, (int32_t)want_num(e, "n_vocab"), "%s", name);
        cr_assert_eq(c.n_embd, (int32_t)want_num(e, "n_embd"), "%s", name);
        cr_assert_eq(c.n_ff, (int32_t)want_num(e, "n_ff"), "%s", name);
        cr_assert_eq(c.n_layer, (int32_t)want_num(e, "n_layer"), "%s", name);
        cr_assert_eq(c.n_head, (int32_t)want_num(e, "n_head"), "%s", name);
        cr_assert_eq(c.n_head_kv, (int32_t)want_num(e, "n_head_kv"), "%s", name);
        cr_assert_eq(c.head_dim, (int32_t)want_num(e, "head_dim"), "%s", name);
        cr_assert_eq(c.n_ctx_train, (int32_t)want_num(e, "n_ctx_train"), "%s", name);
        cr_assert_eq(c.rms_eps, (float)want_num(e, "rms_eps"), "%s", name);
        cr_assert_eq(c.rope_theta, (float)want_num(e, "rope_theta"), "%s", name);
        cr_assert_eq(c.tied_embeddings,
                     json_object_get_boolean(json_object_object_get(e, "tied_embeddings")), "%s", name);
        cr_assert_eq(c.rope_layout, TRI_ROPE_LAYOUT_HALF);
        cr_assert_eq(c.has_rope_freqs, false);
        cr_assert_eq(c.rope_scaling,
                     scaling_of(json_object_get_string(json_object_object_get(e, "rope_scaling"))),
                     "%s", name);
        cr_assert_eq(c.rope_factor, (float)want_num(e, "rope_factor"), "%s", name);
        cr_assert_eq(c.rope_orig_ctx, (int32_t)want_num(e, "rope_orig_ctx"), "%s", name);
        cr_assert_eq(c.yarn_beta_fast, (float)want_num(e, "yarn_beta_fast"), "%s", name);
        cr_assert_eq(c.yarn_beta_slow, (float)want_num(e, "yarn_beta_slow"), "%s", name);
        cr_assert_float_eq(c.yarn_mscale, (float)want_num(e, "yarn_mscale"), 1e-6f, "%s: %g", name,
                           (double)c.yarn_mscale);
        cr_assert_eq(c.llama3_low_freq_factor, (float)want_num(e, "llama3_low_freq_factor"), "%s", name);
        cr_assert_eq(c.llama3_high_freq_factor, (float)want_num(e, "llama3_high_freq_factor"), "%s", name);
        n++;
    }
    cr_assert_geq(n, 11);
    json_object_put(all);
}

static const bad_case bad_configs[] = {
    {"bad-missing-hidden", TRI_STATUS_BAD_FORMAT, "field 'hidden_size'", "missing"},
    {"bad-missing-eps", TRI_STATUS_BAD_FORMAT, "field 'rms_norm_eps'", "missing"},
    {"bad-type-layers", TRI_STATUS_BAD_FORMAT, "field 'num_hidden_layers'", "not an integer"},
    {"bad-type-layers-float", TRI_STATUS_BAD_FORMAT, "field 'num_hidden_layers'", "not an integer"},
    {"bad-zero-heads", TRI_STATUS_BAD_FORMAT, "field 'num_attention_heads'", "out of range"},
    {"bad-negative-vocab", TRI_STATUS_BAD_FORMAT, "field 'vocab_size'", "-5"},
    {"bad-huge-ff", TRI_STATUS_BAD_FORMAT, "field 'intermediate_size'", "2147483648"},
    {"bad-indivisible", TRI_STATUS_BAD_FORMAT, "field 'num_attention_heads'", "does not divide"},
    {"bad-kv-heads", TRI_STATUS_BAD_FORMAT, "field 'num_key_value_heads'", "5"},
    {"bad-kv-more", TRI_STATUS_BAD_FORMAT, "field 'num_key_value_heads'", "64"},
    {"bad-odd-head-dim", TRI_STATUS_BAD_FORMAT, "field 'head_dim'", "odd"},
    {"bad-eps-type", TRI_STATUS_BAD_FORMAT, "field 'rms_norm_eps'", "not a number"},
    {"bad-eps-zero", TRI_STATUS_BAD_FORMAT, "field 'rms_norm_eps'", "not > 0"},
    {"bad-eps-underflow", TRI_STATUS_BAD_FORMAT, "field 'rms_norm_eps'", "as a float"},
    {"bad-theta-negative", TRI_STATUS_BAD_FORMAT, "field 'rope_theta'", "not > 0"},
    {"bad-tie-type", TRI_STATUS_BAD_FORMAT, "field 'tie_word_embeddings'", "not a boolean"},
    {"bad-arch-type", TRI_STATUS_BAD_FORMAT, "field 'architectures'", "not an array"},
    {"bad-no-arch", TRI_STATUS_BAD_FORMAT, "field 'architectures'", "model_type"},
    {"bad-scaling-type", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling'", "not an object"},
    {"bad-scaling-notype", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling.rope_type'", "missing"},
    {"bad-scaling-nofactor", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling.factor'", "missing"},
    {"bad-scaling-factor-type", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling.factor'", "not a number"},
    {"bad-llama3-missing", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling.low_freq_factor'", "missing"},
    {"bad-llama3-freqs", TRI_STATUS_BAD_FORMAT, "field 'rope_scaling.high_freq_factor'", "low_freq_factor"},
    {"bad-malformed", TRI_STATUS_BAD_FORMAT, "malformed JSON", "line 3"},
    {"bad-nan", TRI_STATUS_BAD_FORMAT, "field 'rms_norm_eps'", "finite"},
    {"unsupported-arch", TRI_STATUS_UNSUPPORTED, "field 'architectures'", "'MixtralForCausalLM'"},
    {"unsupported-scaling", TRI_STATUS_UNSUPPORTED, "field 'rope_scaling.type'", "'longrope'"},
    {"unsupported-act", TRI_STATUS_UNSUPPORTED, "field 'hidden_act'", "'gelu'"},
    {"unsupported-bias", TRI_STATUS_UNSUPPORTED, "field 'mlp_bias'", "biases"},
};

Test(safetensors, bad_configs_fail_naming_file_and_key) {
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        const bad_case *c = &bad_configs[i];
        char rel[256], path[4096];
        snprintf(rel, sizeof rel, "configs/%s.json", c->file);
        snprintf(path, sizeof path, "%s", FX(rel));
        tri_model_config cfg;
        memset(&cfg, 0x5a, sizeof cfg);
        tri_model_config before = cfg;
        char *arch = (char *)1;
        tri_status st = tri__hf_config_load(path, &cfg, &arch);
        cr_assert_eq(st, c->status, "%s: status %d (%s)", c->file, st, tri_last_error());
        cr_assert_null(arch);
        cr_assert(memcmp(&cfg, &before, sizeof cfg) == 0, "%s: cfg written on failure", c->file);
        assert_msg_has(path);
        assert_msg_has(c->piece1);
        assert_msg_has(c->piece2);
    }
    tri_model_config cfg;
    cr_assert_eq(tri__hf_config_load(FX("configs/none.json"), &cfg, NULL), TRI_STATUS_NOT_FOUND);
    assert_msg_has("none.json");
    cr_assert_eq(tri__hf_config_parse("cfg", "{}", 2, &cfg, NULL), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(tri__hf_config_parse("cfg", "[]", 2, &cfg, NULL), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(tri__hf_config_parse("cfg", "{\"a\": \"\xff\"}", 10, &cfg, NULL), TRI_STATUS_BAD_FORMAT);
    assert_msg_has("malformed JSON");
}

// ---- HF tensor names ----

Test(safetensors, hf_names_map_to_gguf_names) {
    static const char *const pairs[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"},
        {"model.layers.7.self_attn.q_proj.weight", "blk.7.attn_q.weight"},
        {"model.layers.10.self_attn.k_proj.weight", "blk.10.attn_k.weight"},
        {"model.layers.31.self_attn.v_proj.weight", "blk.31.attn_v.weight"},
        {"model.layers.2.self_attn.o_proj.weight", "blk.2.attn_output.weight"},
        {"model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"},
        {"model.layers.4.mlp.gate_proj.weight", "blk.4.ffn_gate.weight"},
        {"model.layers.5.mlp.up_proj.weight", "blk.5.ffn_up.weight"},
        {"model.layers.123456789.mlp.down_proj.weight", "blk.123456789.ffn_down.weight"},
        // Qwen3's per-head norms of q and k
        {"model.layers.6.self_attn.q_norm.weight", "blk.6.attn_q_norm.weight"},
        {"model.layers.6.self_attn.k_norm.weight", "blk.6.attn_k_norm.weight"},
        // biases: mapped so that the loader can refuse them by name
        {"model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"},
        {"model.layers.1.self_attn.o_proj.bias", "blk.1.attn_output.bias"},
        {"model.layers.2.mlp.down_proj.bias", "blk.2.ffn_down.bias"},
    };
    char out[64];
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        cr_assert(tri__hf_tensor_name_to_gguf(pairs[i][0], out, sizeof out), "%s", pairs[i][0]);
        cr_assert_str_eq(out, pairs[i][1]);
        // and back, for messages about a tensor a checkpoint lacks
        cr_assert(tri__hf_tensor_name_from_gguf(pairs[i][1], out, sizeof out), "%s", pairs[i][1]);
        cr_assert_str_eq(out, pairs[i][0]);
    }
    static const char *const not_gguf[] = {"blk.01.attn_q.weight", "blk.0.attn_rot_embd", "blk..attn_q.weight",
                                           "rope_freqs.weight", "token_embd", ""};
    for (size_t i = 0; i < sizeof not_gguf / sizeof not_gguf[0]; i++)
        cr_assert(!tri__hf_tensor_name_from_gguf(not_gguf[i], out, sizeof out), "%s", not_gguf[i]);
    static const char *const others[] = {
        "model.layers.0.self_attn.rotary_emb.inv_freq", "rotary_emb.inv_freq",
        "model.layers.0.self_attn.qk_norm.weight", "model.layers.01.mlp.up_proj.weight",
        "model.layers.1234567890.mlp.up_proj.weight", "model.layers..mlp.up_proj.weight",
        "model.layers.x.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight.x",
        "model.layers.0", "model.layers.", "", "lm_head.weightx", "model.embed_tokens",
        "layers.0.mlp.up_proj.weight",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        strcpy(out, "junk");
        cr_assert(!tri__hf_tensor_name_to_gguf(others[i], out, sizeof out), "%s", others[i]);
        cr_assert_str_eq(out, "");
    }
    // too small a buffer: false, never a cut name
    char small[19];  // "output_norm.weight" and its NUL
    cr_assert(tri__hf_tensor_name_to_gguf("model.norm.weight", small, sizeof small));
    cr_assert_str_eq(small, "output_norm.weight");
    cr_assert(!tri__hf_tensor_name_to_gguf("model.norm.weight", small, sizeof small - 1));
    cr_assert(!tri__hf_tensor_name_to_gguf("model.layers.7.mlp.up_proj.weight", small, sizeof small));
    cr_assert_str_eq(small, "");
}
