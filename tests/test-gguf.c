// test-gguf.c - the GGUF reader against files written by the gguf Python package and by struct
// code following the specification (tests/fixtures/make-gguf.py), and against broken files.
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "test-util.h"

// ---- helpers ----

static json_object *load_json(const char *path) {
    json_object *j = json_object_from_file(path);
    cr_assert(j != NULL, "cannot parse %s", path);
    return j;
}

static json_object *jget(json_object *o, const char *key) {
    json_object *v = NULL;
    cr_assert(json_object_object_get_ex(o, key, &v), "expectation has no '%s'", key);
    return v;
}

static const char *jstr(json_object *o, const char *key) { return json_object_get_string(jget(o, key)); }
static uint64_t ju64(json_object *o, const char *key) { return strtoull(jstr(o, key), NULL, 10); }

// Decodes lowercase hex; the caller frees.
static uint8_t *unhex(const char *s, size_t *n) {
    size_t len = strlen(s);
    cr_assert(len % 2 == 0);
    uint8_t *b = malloc(len / 2 + 1);
    cr_assert(b != NULL);
    for (size_t i = 0; i < len / 2; i++) {
        unsigned x;
        cr_assert(sscanf(s + 2 * i, "%2x", &x) == 1);
        b[i] = (uint8_t)x;
    }
    b[len / 2] = 0;
    *n = len / 2;
    return b;
}

static bool str_eq_hex(tri__gguf_str s, const char *hex) {
    size_t n;
    uint8_t *b = unhex(hex, &n);
    bool eq = s.len == n && memcmp(s.ptr, b, n) == 0;
    free(b);
    return eq;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static tri_status status_named(const char *name) {
    if (!strcmp(name, "BAD_FORMAT")) return TRI_STATUS_BAD_FORMAT;
    if (!strcmp(name, "UNSUPPORTED")) return TRI_STATUS_UNSUPPORTED;
    if (!strcmp(name, "IO")) return TRI_STATUS_IO;
    cr_assert_fail("unknown status name %s", name);
    return TRI_STATUS_INTERNAL;
}

// Compares a decoded value with its expectation {"type", "value"} or {"type", "elem", "items"}.
static void check_value(const tri__gguf_value *v, json_object *e, const char *ctx) {
    int type = json_object_get_int(jget(e, "type"));
    cr_assert_eq((int)v->type, type, "%s: type %d, expected %d", ctx, v->type, type);
    switch (v->type) {
    case TRI_GGUF_TYPE_UINT8:
    case TRI_GGUF_TYPE_UINT16:
    case TRI_GGUF_TYPE_UINT32:
    case TRI_GGUF_TYPE_UINT64:
        cr_assert_eq(v->u, ju64(e, "value"), "%s: %" PRIu64 " != %s", ctx, v->u, jstr(e, "value"));
        break;
    case TRI_GGUF_TYPE_INT8:
    case TRI_GGUF_TYPE_INT16:
    case TRI_GGUF_TYPE_INT32:
    case TRI_GGUF_TYPE_INT64:
        cr_assert_eq(v->i, strtoll(jstr(e, "value"), NULL, 10), "%s: %" PRId64 " != %s", ctx, v->i,
                     jstr(e, "value"));
        break;
    case TRI_GGUF_TYPE_FLOAT32:
    case TRI_GGUF_TYPE_FLOAT64:
        cr_assert_eq(v->f, json_object_get_double(jget(e, "value")), "%s: %.17g", ctx, v->f);
        break;
    case TRI_GGUF_TYPE_BOOL:
        cr_assert_eq(v->b, json_object_get_boolean(jget(e, "value")), "%s", ctx);
        break;
    case TRI_GGUF_TYPE_STRING:
        cr_assert(str_eq_hex(v->str, jstr(e, "value")), "%s: string differs", ctx);
        break;
    case TRI_GGUF_TYPE_ARRAY: {
        json_object *items = jget(e, "items");
        cr_assert_eq((int)v->arr.elem, json_object_get_int(jget(e, "elem")), "%s: element type", ctx);
        cr_assert_eq(v->arr.n, json_object_array_length(items), "%s: count", ctx);
        for (uint64_t k = 0; k < v->arr.n; k++) {
            cr_assert_eq((int)v->arr.items[k].type, (int)v->arr.elem, "%s[%" PRIu64 "]", ctx, k);
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%" PRIu64 "]", ctx, k);
            check_value(&v->arr.items[k], json_object_array_get_idx(items, k), sub);
        }
        break;
    }
    }
}

static tri__gguf *open_ok(const char *path) {
    tri__gguf *g = NULL;
    tri_status st = tri__gguf_open(path, &g);
    cr_assert_eq(st, TRI_STATUS_OK, "open %s: %s", path, tri_last_error());
    cr_assert(g != NULL);
    return g;
}

// Opens fixture NAME.gguf and checks everything NAME.json says about it.
static void check_file(const char *name) {
    char file[256], exp_name[256];
    snprintf(file, sizeof file, "%s.gguf", name);
    snprintf(exp_name, sizeof exp_name, "%s.json", name);
    json_object *e = load_json(tt_fixture("gguf", exp_name));
    tri__gguf *g = open_ok(tt_fixture("gguf", file));

    cr_assert_eq(tri__gguf_version(g), (uint32_t)json_object_get_int(jget(e, "version")), "%s", name);
    cr_assert_eq(tri__gguf_alignment(g), (uint32_t)json_object_get_int(jget(e, "alignment")), "%s", name);
    cr_assert_eq(tri__gguf_data_start(g), ju64(e, "data_start"), "%s: data start", name);
    cr_assert_eq(tri__gguf_file_size(g), (uint64_t)json_object_get_int64(jget(e, "file_size")));
    cr_assert_eq(tri__gguf_data_start(g) % tri__gguf_alignment(g), 0);

    json_object *kvs = jget(e, "kvs");
    cr_assert_eq(tri__gguf_n_kv(g), (int64_t)json_object_array_length(kvs), "%s: n_kv", name);
    for (int64_t i = 0; i < tri__gguf_n_kv(g); i++) {
        json_object *ek = json_object_array_get_idx(kvs, (size_t)i);
        const tri__gguf_kv *kv = tri__gguf_kv_at(g, i);
        cr_assert(str_eq_hex(kv->key, jstr(ek, "key")), "%s: key %" PRId64 " is '%.*s'", name, i,
                  (int)kv->key.len, kv->key.ptr);
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: key '%.*s'", name, (int)kv->key.len, kv->key.ptr);
        check_value(&kv->value, ek, ctx);
        // find() reaches the same value when the key has no NUL byte
        if (!memchr(kv->key.ptr, 0, kv->key.len)) {
            char key[512];
            snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
            cr_assert_eq(tri__gguf_find(g, key), &kv->value, "%s", ctx);
        }
    }
    cr_assert_null(tri__gguf_kv_at(g, tri__gguf_n_kv(g)));
    cr_assert_null(tri__gguf_kv_at(g, -1));
    cr_assert_null(tri__gguf_find(g, "no.such.key"));

    json_object *ts = jget(e, "tensors");
    cr_assert_eq(tri__gguf_n_tensors(g), (int64_t)json_object_array_length(ts), "%s: n_tensors", name);
    for (int64_t i = 0; i < tri__gguf_n_tensors(g); i++) {
        json_object *et = json_object_array_get_idx(ts, (size_t)i);
        const tri__gguf_tensor *t = tri__gguf_tensor_at(g, i);
        cr_assert(str_eq_hex(t->name, jstr(et, "name")), "%s: tensor %" PRId64, name, i);
        char tname[256];
        snprintf(tname, sizeof tname, "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_str_eq(tri_dtype_name(t->type), jstr(et, "dtype"), "%s: %s", name, tname);
        json_object *shape = jget(et, "shape");
        cr_assert_eq(t->n_dims, (int32_t)json_object_array_length(shape), "%s: %s", name, tname);
        for (int d = 0; d < 4; d++) {
            int64_t want = d < t->n_dims ? strtoll(json_object_get_string(json_object_array_get_idx(shape, d)), NULL, 10) : 1;
            cr_assert_eq(t->shape[d], want, "%s: %s: dim %d", name, tname, d);
        }
        cr_assert_eq(t->offset, ju64(et, "offset"), "%s: %s: offset", name, tname);
        cr_assert_eq(t->n_bytes, ju64(et, "n_bytes"), "%s: %s: n_bytes", name, tname);
        size_t n;
        uint8_t *want = unhex(jstr(et, "data"), &n);
        cr_assert_eq(n, t->n_bytes);
        cr_assert(memcmp(t->data, want, n) == 0, "%s: %s: data differs", name, tname);
        free(want);
        uintptr_t mem_align = tri__gguf_alignment(g) < 4096 ? tri__gguf_alignment(g) : 4096;
        cr_assert_eq((uintptr_t)t->data % mem_align, 0, "%s: %s: data pointer alignment", name, tname);
        cr_assert_eq(tri__gguf_find_tensor(g, tname), t);
    }
    cr_assert_null(tri__gguf_tensor_at(g, tri__gguf_n_tensors(g)));
    cr_assert_null(tri__gguf_find_tensor(g, "no.such.tensor"));
    tri__gguf_close(g);
    json_object_put(e);
}

// ---- valid files ----

Test(gguf, every_value_type_and_tensor_type) { check_file("types"); }
Test(gguf, alignment_1) { check_file("types-align-1"); }
Test(gguf, alignment_64) { check_file("types-align-64"); }
Test(gguf, alignment_4096) { check_file("types-align-4096"); }
Test(gguf, v2_empty_array_out_of_order_tensors) { check_file("v2"); }
Test(gguf, llama_file) { check_file("llama-yarn"); }

Test(gguf, no_tensors) {
    tri__gguf *g = open_ok(tt_fixture("gguf", "no-tensors.gguf"));
    cr_assert_eq(tri__gguf_n_tensors(g), 0);
    cr_assert_eq(tri__gguf_n_kv(g), 1);
    // the file ends right after its metadata, without the padding that would lead to no data
    cr_assert_eq(tri__gguf_data_start(g) % 32, 0);
    cr_assert(tri__gguf_data_start(g) >= tri__gguf_file_size(g));
    cr_assert(tri__gguf_data_start(g) < tri__gguf_file_size(g) + 32);
    cr_assert_null(tri__gguf_tensor_at(g, 0));
    cr_assert_null(tri__gguf_find_tensor(g, "w"));
    tri__gguf_close(g);
    tri__gguf_close(NULL);
}

Test(gguf, populate_flag) {
    tri__gguf *g = NULL;
    cr_assert_eq(tri__gguf_open_ex(tt_fixture("gguf", "types.gguf"), true, &g), TRI_STATUS_OK);
    cr_assert_eq(tri__gguf_n_tensors(g), 16);
    tri__gguf_close(g);
}

Test(gguf, typed_getters) {
    const char *path = tt_fixture("gguf", "types.gguf");
    tri__gguf *g = open_ok(path);
    uint32_t u;
    float f;
    bool b;
    tri__gguf_str s;
    const tri__gguf_value *arr;

    cr_assert_eq(tri__gguf_get_u32(g, "t.u8", &u), TRI_STATUS_OK);
    cr_assert_eq(u, 250);
    cr_assert_eq(tri__gguf_get_u32(g, "t.u32", &u), TRI_STATUS_OK);
    cr_assert_eq(u, 4000000000u);
    cr_assert_eq(tri__gguf_get_u32(g, "t.i8", &u), TRI_STATUS_BAD_FORMAT, "negative");
    cr_assert(contains(tri_last_error(), path) && contains(tri_last_error(), "'t.i8'") &&
              contains(tri_last_error(), "-120"), "%s", tri_last_error());
    cr_assert_eq(tri__gguf_get_u32(g, "t.u64", &u), TRI_STATUS_BAD_FORMAT, "too big");
    cr_assert_eq(tri__gguf_get_u32(g, "t.str", &u), TRI_STATUS_BAD_FORMAT);
    cr_assert(contains(tri_last_error(), "string"), "%s", tri_last_error());
    cr_assert_eq(tri__gguf_get_u32(g, "t.absent", &u), TRI_STATUS_NOT_FOUND);

    cr_assert_eq(tri__gguf_get_f32(g, "t.f32", &f), TRI_STATUS_OK);
    cr_assert_eq(f, 0.1f);
    cr_assert_eq(tri__gguf_get_f32(g, "t.f64", &f), TRI_STATUS_OK);
    cr_assert_eq(f, (float)(1.0 / 3.0));
    cr_assert_eq(tri__gguf_get_f32(g, "t.i32", &f), TRI_STATUS_OK);
    cr_assert_eq(f, -2000000000.0f);
    cr_assert_eq(tri__gguf_get_f32(g, "t.bool.true", &f), TRI_STATUS_BAD_FORMAT);

    cr_assert_eq(tri__gguf_get_bool(g, "t.bool.true", &b), TRI_STATUS_OK);
    cr_assert(b);
    cr_assert_eq(tri__gguf_get_bool(g, "t.bool.false", &b), TRI_STATUS_OK);
    cr_assert(!b);
    cr_assert_eq(tri__gguf_get_bool(g, "t.u8", &b), TRI_STATUS_BAD_FORMAT);

    cr_assert_eq(tri__gguf_get_str(g, "general.architecture", &s), TRI_STATUS_OK);
    cr_assert(tri__gguf_str_eq(s, "test"));
    cr_assert(!tri__gguf_str_eq(s, "tes"));
    cr_assert(!tri__gguf_str_eq(s, "tests"));
    cr_assert_eq(tri__gguf_get_str(g, "t.str.nul", &s), TRI_STATUS_OK);
    cr_assert_eq(s.len, 3, "a NUL byte inside a string is kept");
    cr_assert_eq(tri__gguf_get_str(g, "t.u8", &s), TRI_STATUS_BAD_FORMAT);

    cr_assert_eq(tri__gguf_get_arr(g, "t.arr.i32", TRI_GGUF_TYPE_INT32, &arr), TRI_STATUS_OK);
    cr_assert_eq(arr->arr.n, 3);
    cr_assert_eq(arr->arr.items[1].i, -2);
    cr_assert_eq(tri__gguf_get_arr(g, "t.arr.i32", TRI_GGUF_TYPE_UINT8, &arr), TRI_STATUS_BAD_FORMAT);
    cr_assert(contains(tri_last_error(), "array of int32"), "%s", tri_last_error());
    cr_assert_eq(tri__gguf_get_arr(g, "t.u8", TRI_GGUF_TYPE_UINT8, &arr), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(tri__gguf_get_arr(g, "t.arr.nested", TRI_GGUF_TYPE_ARRAY, &arr), TRI_STATUS_OK);
    cr_assert_eq(arr->arr.items[2].arr.n, 3);
    cr_assert_eq(arr->arr.items[2].arr.items[2].i, 6);

    cr_assert_str_eq(tri__gguf_type_name(TRI_GGUF_TYPE_FLOAT64), "float64");
    cr_assert_str_eq(tri__gguf_type_name((tri__gguf_type)13), "?");
    cr_assert_str_eq(tri__gguf_ggml_type_name(14), "q6_K");
    cr_assert_str_eq(tri__gguf_ggml_type_name(4), "unknown");
    cr_assert_str_eq(tri__gguf_ggml_type_name(1000), "unknown");
    tri__gguf_close(g);
}

// ---- broken files ----

static void check_failures(const char *manifest, bool config) {
    json_object *list = load_json(tt_fixture("gguf", manifest));
    size_t n = json_object_array_length(list);
    cr_assert(n >= 10);
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(list, i);
        const char *file = jstr(e, "file");
        char path[4096];
        snprintf(path, sizeof path, "%s", tt_fixture("gguf", file));
        tri_status want = status_named(jstr(e, "status"));
        tri__gguf *g = (tri__gguf *)(uintptr_t)1;
        tri_status st = tri__gguf_open(path, &g);
        if (config) {
            cr_assert_eq(st, TRI_STATUS_OK, "%s: %s", file, tri_last_error());
            tri_model_config cfg;
            st = tri__gguf_llama_config(g, &cfg);
            tri__gguf_close(g);
        } else {
            cr_assert_null(g, "%s: *out is NULL after a failure", file);
        }
        cr_assert_eq(st, want, "%s: status %s, expected %s (%s)", file, tri_status_str(st),
                     jstr(e, "status"), tri_last_error());
        const char *msg = tri_last_error();
        cr_assert(contains(msg, path), "%s: message does not name the file: %s", file, msg);
        json_object *parts = jget(e, "contains");
        for (size_t k = 0; k < json_object_array_length(parts); k++) {
            const char *part = json_object_get_string(json_object_array_get_idx(parts, k));
            cr_assert(contains(msg, part), "%s: message lacks '%s': %s", file, part, msg);
        }
    }
    json_object_put(list);
}

Test(gguf, broken_files_fail_with_named_field) { check_failures("bad.json", false); }

Test(gguf, missing_file_and_directory) {
    tri__gguf *g;
    cr_assert_eq(tri__gguf_open(tt_fixture("gguf", "no-such-file.gguf"), &g), TRI_STATUS_NOT_FOUND);
    cr_assert(contains(tri_last_error(), "no-such-file.gguf"));
    cr_assert_eq(tri__gguf_open(getenv("TRI_TEST_FIXTURES"), &g), TRI_STATUS_IO);
    cr_assert(contains(tri_last_error(), "regular file"), "%s", tri_last_error());
    cr_assert_eq(tri__gguf_open(NULL, &g), TRI_STATUS_INVALID_ARGUMENT);
}

// Every prefix of a valid file that cuts the header, metadata, tensor infos or some tensor's
// data must fail cleanly; prefixes that only drop padding after the last tensor still open.
static void check_truncations(const char *name, const char *tmp_name) {
    size_t len;
    uint8_t *full = tt_read_file(tt_fixture("gguf", name), &len);
    tri__gguf *g = open_ok(tt_fixture("gguf", name));
    uint64_t data_start = tri__gguf_data_start(g), end = data_start;
    for (int64_t i = 0; i < tri__gguf_n_tensors(g); i++) {
        const tri__gguf_tensor *t = tri__gguf_tensor_at(g, i);
        if (data_start + t->offset + t->n_bytes > end) end = data_start + t->offset + t->n_bytes;
    }
    tri__gguf_close(g);
    cr_assert(end <= len && data_start < end);

    const char *path = tt_tmp(tmp_name);
    int n_fail = 0;
    for (size_t cut = 0; cut <= len; cut += cut < data_start + 40 || cut + 40 > end ? 1 : 7) {
        tt_write_file(path, full, cut);
        tri__gguf *t = NULL;
        tri_status st = tri__gguf_open(path, &t);
        if (cut < end) {
            cr_assert_eq(st, TRI_STATUS_BAD_FORMAT, "%s cut at %zu of %zu: %s", name, cut, len,
                         st ? tri_last_error() : "opened");
            cr_assert(contains(tri_last_error(), path), "%s", tri_last_error());
            cr_assert_null(t);
            n_fail++;
        } else {
            cr_assert_eq(st, TRI_STATUS_OK, "%s cut at %zu (after the data): %s", name, cut, tri_last_error());
            tri__gguf_close(t);
        }
    }
    cr_assert(n_fail > (int)data_start);
    free(full);
}

Test(gguf, truncated_everywhere_fails_cleanly) {
    check_truncations("types.gguf", "trunc-types.gguf");
    check_truncations("v2.gguf", "trunc-v2.gguf");
    check_truncations("llama-yarn.gguf", "trunc-llama.gguf");
}

// ---- llama config ----

static tri_rope_scaling scaling_named(const char *s) {
    if (!strcmp(s, "none")) return TRI_ROPE_SCALING_NONE;
    if (!strcmp(s, "linear")) return TRI_ROPE_SCALING_LINEAR;
    if (!strcmp(s, "yarn")) return TRI_ROPE_SCALING_YARN;
    cr_assert_fail("scaling %s", s);
    return TRI_ROPE_SCALING_NONE;
}

Test(gguf, llama_configs) {
    json_object *all = load_json(tt_fixture("gguf", "llama-configs.json"));
    int n = 0;
    json_object_object_foreach(all, name, e) {
        char file[256];
        snprintf(file, sizeof file, "%s.gguf", name);
        tri__gguf *g = open_ok(tt_fixture("gguf", file));
        tri_model_config c;
        memset(&c, 0xab, sizeof c);
        cr_assert_eq(tri__gguf_llama_config(g, &c), TRI_STATUS_OK, "%s: %s", name, tri_last_error());
#define CHECK_I(field) \
    cr_assert_eq(c.field, json_object_get_int(jget(e, #field)), "%s: " #field " = %d", name, (int)c.field)
#define CHECK_F(field)                                                                 \
    cr_assert_eq((double)c.field, json_object_get_double(jget(e, #field)), "%s: " #field " = %g", \
                 name, (double)c.field)
#define CHECK_B(field) cr_assert_eq(c.field, json_object_get_boolean(jget(e, #field)), "%s: " #field, name)
        CHECK_I(n_vocab);
        CHECK_I(n_embd);
        CHECK_I(n_ff);
        CHECK_I(n_layer);
        CHECK_I(n_head);
        CHECK_I(n_head_kv);
        CHECK_I(head_dim);
        CHECK_I(n_ctx_train);
        CHECK_I(rope_orig_ctx);
        CHECK_F(rms_eps);
        CHECK_F(rope_theta);
        CHECK_F(rope_factor);
        CHECK_F(yarn_beta_fast);
        CHECK_F(yarn_beta_slow);
        // a product of logs: computed in double here and in the fixture, so within a float ulp
        double mscale = json_object_get_double(jget(e, "yarn_mscale"));
        cr_assert(fabs((double)c.yarn_mscale - mscale) <= 1e-6 * fabs(mscale), "%s: yarn_mscale = %.9g, want %.9g",
                  name, (double)c.yarn_mscale, mscale);
        CHECK_B(tied_embeddings);
        CHECK_B(has_rope_freqs);
        cr_assert_eq(c.rope_scaling, scaling_named(jstr(e, "rope_scaling")), "%s", name);
        cr_assert_eq(c.rope_layout, TRI_ROPE_LAYOUT_ADJACENT);
        tri__gguf_close(g);
        n++;
    }
    cr_assert_eq(n, 5);
    json_object_put(all);
}

Test(gguf, llama_config_rejections_name_the_key) { check_failures("llama-bad.json", true); }

Test(gguf, llama_config_needs_architecture) {
    tri__gguf *g = open_ok(tt_fixture("gguf", "types.gguf"));  // general.architecture = "test"
    tri_model_config c;
    cr_assert_eq(tri__gguf_llama_config(g, &c), TRI_STATUS_UNSUPPORTED);
    cr_assert(contains(tri_last_error(), "'test'"), "%s", tri_last_error());
    tri__gguf_close(g);
}

// ---- the real model ----

// Opens $TRI_TEST_MODEL and compares with what the gguf package reads from the same file.
Test(gguf, real_model_matches_gguf_package) {
    const char *model = getenv("TRI_TEST_MODEL");
    if (!model || !*model) cr_skip_test("TRI_TEST_MODEL is not set");
    const char *py = tt_python("fixtures/make-gguf.py");
    char facts_path[4096], cmd[12288];
    snprintf(facts_path, sizeof facts_path, "%s", tt_tmp("gguf-model-facts.json"));
    snprintf(cmd, sizeof cmd, "'%s' '%s/fixtures/make-gguf.py' --model-facts '%s' '%s'", py,
             getenv("TRI_TEST_SRC"), model, facts_path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    json_object *e = load_json(facts_path);

    tri__gguf *g = open_ok(model);
    cr_assert_eq(tri__gguf_version(g), (uint32_t)json_object_get_int(jget(e, "version")));
    cr_assert_eq(tri__gguf_alignment(g), (uint32_t)json_object_get_int(jget(e, "alignment")));
    cr_assert_eq(tri__gguf_data_start(g), ju64(e, "data_start"));

    json_object *kvs = jget(e, "kvs");
    cr_assert_eq(tri__gguf_n_kv(g), json_object_object_length(kvs));
    json_object_object_foreach(kvs, key, ek) {
        const tri__gguf_value *v = tri__gguf_find(g, key);
        cr_assert(v != NULL, "key %s", key);
        int type = json_object_get_int(jget(ek, "type"));
        cr_assert_eq((int)v->type, type, "key %s", key);
        if (type == TRI_GGUF_TYPE_ARRAY) {
            cr_assert_eq((int)v->arr.elem, json_object_get_int(jget(ek, "elem")), "key %s", key);
            cr_assert_eq(v->arr.n, (uint64_t)json_object_get_int64(jget(ek, "n")), "key %s", key);
        } else {
            check_value(v, ek, key);
        }
    }

    json_object *ts = jget(e, "tensors");
    cr_assert_eq(tri__gguf_n_tensors(g), (int64_t)json_object_array_length(ts));
    for (int64_t i = 0; i < tri__gguf_n_tensors(g); i++) {
        json_object *et = json_object_array_get_idx(ts, (size_t)i);
        const tri__gguf_tensor *t = tri__gguf_tensor_at(g, i);
        const char *name = jstr(et, "name");
        cr_assert(tri__gguf_str_eq(t->name, name), "tensor %" PRId64 " is not %s", i, name);
        static const tri_dtype by_ggml[] = {[0] = TRI_DTYPE_F32,   [1] = TRI_DTYPE_F16,   [2] = TRI_DTYPE_Q4_0,
                                            [3] = TRI_DTYPE_Q4_1,  [6] = TRI_DTYPE_Q5_0,  [7] = TRI_DTYPE_Q5_1,
                                            [8] = TRI_DTYPE_Q8_0,  [10] = TRI_DTYPE_Q2_K, [11] = TRI_DTYPE_Q3_K,
                                            [12] = TRI_DTYPE_Q4_K, [13] = TRI_DTYPE_Q5_K, [14] = TRI_DTYPE_Q6_K,
                                            [20] = TRI_DTYPE_IQ4_NL, [23] = TRI_DTYPE_IQ4_XS,
                                            [30] = TRI_DTYPE_BF16};
        int gt = json_object_get_int(jget(et, "ggml_type"));
        cr_assert(gt >= 0 && gt <= 30);
        cr_assert_eq(t->type, by_ggml[gt], "%s", name);
        json_object *shape = jget(et, "shape");
        cr_assert_eq(t->n_dims, (int32_t)json_object_array_length(shape), "%s", name);
        for (int d = 0; d < t->n_dims; d++) {
            cr_assert_eq(t->shape[d], strtoll(json_object_get_string(json_object_array_get_idx(shape, d)), NULL, 10),
                         "%s dim %d", name, d);
        }
        cr_assert_eq(t->offset, ju64(et, "offset"), "%s", name);
        cr_assert_eq(t->n_bytes, ju64(et, "n_bytes"), "%s", name);
        size_t n;
        uint8_t *head = unhex(jstr(et, "head"), &n);
        cr_assert(memcmp(t->data, head, n) == 0, "%s: first bytes differ", name);
        free(head);
    }

    // The config agrees with the keys the gguf package read.
    tri_model_config c;
    cr_assert_eq(tri__gguf_llama_config(g, &c), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(c.n_embd, json_object_get_int(jget(jget(kvs, "llama.embedding_length"), "value")));
    cr_assert_eq(c.n_layer, json_object_get_int(jget(jget(kvs, "llama.block_count"), "value")));
    cr_assert_eq(c.n_head, json_object_get_int(jget(jget(kvs, "llama.attention.head_count"), "value")));
    cr_assert_eq(c.n_head_kv, json_object_get_int(jget(jget(kvs, "llama.attention.head_count_kv"), "value")));
    cr_assert_eq(c.n_ff, json_object_get_int(jget(jget(kvs, "llama.feed_forward_length"), "value")));
    cr_assert_eq(c.n_ctx_train, json_object_get_int(jget(jget(kvs, "llama.context_length"), "value")));
    cr_assert_eq(c.n_vocab, json_object_get_int(jget(jget(kvs, "tokenizer.ggml.tokens"), "n")));
    cr_assert_eq((double)c.rms_eps,
                 json_object_get_double(jget(jget(kvs, "llama.attention.layer_norm_rms_epsilon"), "value")));
    cr_assert_eq(c.tied_embeddings, tri__gguf_find_tensor(g, "output.weight") == NULL);
    cr_assert_eq(c.head_dim * c.n_head, c.n_embd);
    tri__gguf_close(g);
    json_object_put(e);
}
