// tokenizer-json.c - loads an HF tokenizers tokenizer.json (json-c).
//
// Supported: model.type "BPE" with either a byte-level pre-tokenizer (GPT-2, SmolLM2/StarCoder
// digits + GPT-2, Llama-3 Split regex) or the SentencePiece-style normalizer of converted Llama-2
// tokenizers (Prepend "▁", Replace " " -> "▁", byte_fallback). Anything else is UNSUPPORTED,
// naming the field, rather than tokenized wrongly.
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "tokenizer-impl.h"

// The pre-tokenizer regexes as tokenizer.json writes them (after JSON unescaping).
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_object *get(json_object *o, const char *key) {
    json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object)) return NULL;
    if (!json_object_object_get_ex(o, key, &v)) return NULL;
    return v;  // NULL too for a JSON null
}

static const char *get_str(json_object *o, const char *key) {
    json_object *v = get(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static bool get_bool(json_object *o, const char *key, bool dflt) {
    json_object *v = get(o, key);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

static bool type_is(json_object *o, const char *type) {
    const char *s = get_str(o, "type");
    return s && strcmp(s, type) == 0;
}

// ---- pre-tokenizer and normalizer ----

// The byte-level pre-tokenizer of a pre_tokenizer object; UNSUPPORTED for anything else.
static tri_status detect_pretok(const char *name, json_object *pre, tri__pretok *out) {
    json_object *steps[8];
    size_t n = 0;
    if (type_is(pre, "Sequence")) {
        json_object *arr = get(pre, "pretokenizers");
        if (!arr || !json_object_is_type(arr, json_type_array) ||
            json_object_array_length(arr) > 8)
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: field 'pre_tokenizer.pretokenizers': not an array of at most 8",
                             name);
        n = json_object_array_length(arr);
        for (size_t i = 0; i < n; i++) steps[i] = json_object_array_get_idx(arr, i);
    } else {
        steps[0] = pre;
        n = 1;
    }
    bool digits = false, split_gpt2 = false, split_llama3 = false, bytelevel = false,
         bytelevel_regex = false;
    for (size_t i = 0; i < n; i++) {
        json_object *s = steps[i];
        const char *type = get_str(s, "type");
        if (!type) type = "?";
        if (strcmp(type, "Digits") == 0 && get_bool(s, "individual_digits", false) && !bytelevel) {
            digits = true;
        } else if (strcmp(type, "Split") == 0 && !bytelevel) {
            const char *re = get_str(get(s, "pattern"), "Regex");
            const char *behavior = get_str(s, "behavior");
            if (!re || !behavior || strcmp(behavior, "Isolated") != 0 ||
                get_bool(s, "invert", false))
                return tri__fail(TRI_STATUS_UNSUPPORTED,
                                 "%s: field 'pre_tokenizer': Split other than an isolated regex",
                                 name);
            if (strcmp(re, llama3_regex) == 0) {
                split_llama3 = true;
            } else if (strcmp(re, gpt2_regex) == 0) {
                split_gpt2 = true;
            } else {
                return tri__fail(TRI_STATUS_UNSUPPORTED,
                                 "%s: field 'pre_tokenizer': unknown Split regex '%.80s'", name, re);
            }
        } else if (strcmp(type, "ByteLevel") == 0) {
            if (get_bool(s, "add_prefix_space", false))
                return tri__fail(TRI_STATUS_UNSUPPORTED,
                                 "%s: field 'pre_tokenizer': ByteLevel add_prefix_space", name);
            bytelevel = true;
            bytelevel_regex = get_bool(s, "use_regex", true);
        } else {
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: field 'pre_tokenizer': unsupported step '%s'", name, type);
        }
    }
    int splits = (int)split_gpt2 + (int)split_llama3 + (int)bytelevel_regex;
    if (!bytelevel || splits != 1 || (digits && !bytelevel_regex))
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'pre_tokenizer': unsupported combination of steps", name);
    *out = split_llama3 ? TRI__PRETOK_LLAMA3 : digits ? TRI__PRETOK_SMOLLM : TRI__PRETOK_GPT2;
    return TRI_STATUS_OK;
}

// The normalizer of converted SentencePiece tokenizers: Prepend("▁") and Replace(" ", "▁").
static tri_status check_spm_normalizer(const char *name, json_object *norm, bool *prefix) {
    *prefix = false;
    if (!norm) return TRI_STATUS_OK;
    json_object *single[1] = {norm};
    json_object **steps = single;
    size_t n = 1;
    json_object *arr = type_is(norm, "Sequence") ? get(norm, "normalizers") : NULL;
    if (arr) {
        if (!json_object_is_type(arr, json_type_array))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'normalizer.normalizers': not an "
                             "array", name);
        n = json_object_array_length(arr);
    }
    for (size_t i = 0; i < n; i++) {
        json_object *s = arr ? json_object_array_get_idx(arr, i) : steps[i];
        const char *prepend = type_is(s, "Prepend") ? get_str(s, "prepend") : NULL;
        if (prepend && strcmp(prepend, "\xe2\x96\x81") == 0) {
            *prefix = true;
            continue;
        }
        const char *with = type_is(s, "Replace") ? get_str(s, "content") : NULL;
        const char *what = get_str(get(s, "pattern"), "String");
        if (with && what && strcmp(what, " ") == 0 && strcmp(with, "\xe2\x96\x81") == 0) continue;
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field 'normalizer': step %zu unsupported",
                         name, i);
    }
    return TRI_STATUS_OK;
}

// ---- special ids ----

// Special-token id of a template item {"SpecialToken": {"id": "<s>"}}, or -1.
static int32_t template_special(const tri__tokenizer *t, json_object *item) {
    const char *text = get_str(get(item, "SpecialToken"), "id");
    return text ? tri__tokenizer_find(t, text, strlen(text)) : -1;
}

// BOS/EOS from a TemplateProcessing post-processor: special tokens before and after $A.
static void read_post_processor(tri__tokenizer *t, json_object *post) {
    json_object *single = NULL;
    if (type_is(post, "TemplateProcessing")) {
        single = get(post, "single");
    } else if (type_is(post, "Sequence")) {
        json_object *arr = get(post, "processors");
        size_t n = arr && json_object_is_type(arr, json_type_array)
                       ? json_object_array_length(arr) : 0;
        for (size_t i = 0; i < n && !single; i++) {
            json_object *p = json_object_array_get_idx(arr, i);
            if (type_is(p, "TemplateProcessing")) single = get(p, "single");
        }
    }
    if (!single || !json_object_is_type(single, json_type_array)) return;
    bool seen_a = false;
    for (size_t i = 0; i < json_object_array_length(single); i++) {
        json_object *item = json_object_array_get_idx(single, i);
        if (get(item, "Sequence")) {
            seen_a = true;
            continue;
        }
        int32_t id = template_special(t, item);
        if (id < 0) continue;
        if (!seen_a && !t->add_bos) {
            t->bos = id;
            t->add_bos = true;
        } else if (seen_a && !t->add_eos) {
            t->eos = id;
            t->add_eos = true;
        }
    }
}

// ---- loader ----

static tri_status add_token(tri__tokenizer *t, const char *name, int64_t id, const char *text,
                            size_t len, int type) {
    if (id < 0 || id >= t->n_vocab)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token '%.*s': id %lld out of range", name,
                         (int)(len > 64 ? 64 : len), text, (long long)id);
    if (t->type[id]) {
        if (t->tok_len[id] == len && memcmp(t->text + t->tok_off[id], text, len) == 0)
            return TRI_STATUS_OK;  // an added token that is also in model.vocab
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token id %lld: two different texts", name,
                         (long long)id);
    }
    return tri__tok_set(t, id, text, len, 0.0f, type);
}

static bool is_byte_piece(const char *s, size_t len) {
    return len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
           strchr("0123456789ABCDEFabcdef", s[3]) && strchr("0123456789ABCDEFabcdef", s[4]) &&
           s[3] && s[4];
}

static tri_status load_json(json_object *root, const char *name, tri__tokenizer **out) {
    tri_status st;
    tri__tokenizer *t = NULL;
    json_object *model = get(root, "model");
    const char *mtype = get_str(model, "type");
    if (!model || !json_object_is_type(model, json_type_object))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model': missing or not an object",
                         name);
    if (!mtype || strcmp(mtype, "BPE") != 0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: field 'model.type': '%s', only BPE", name,
                         mtype ? mtype : "(missing)");
    json_object *vocab = get(model, "vocab"), *merges = get(model, "merges");
    json_object *added = get(root, "added_tokens");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.vocab': not an object", name);
    if (!merges || !json_object_is_type(merges, json_type_array))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.merges': not an array", name);
    if (added && !json_object_is_type(added, json_type_array))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'added_tokens': not an array", name);

    // Which kind: a byte-level pre-tokenizer, or SentencePiece-style escaping.
    json_object *pre = get(root, "pre_tokenizer");
    tri_tokenizer_kind kind;
    tri__pretok pretok = TRI__PRETOK_NONE;
    bool prefix = false;
    if (pre && !type_is(pre, "Metaspace")) {
        kind = TRI_TOKENIZER_BPE;
        if ((st = detect_pretok(name, pre, &pretok))) return st;
        if (get(root, "normalizer"))
            return tri__fail(TRI_STATUS_UNSUPPORTED,
                             "%s: field 'normalizer': not supported with a byte-level "
                             "pre-tokenizer", name);
    } else {
        kind = TRI_TOKENIZER_SPM;
        if ((st = check_spm_normalizer(name, get(root, "normalizer"), &prefix))) return st;
        if (pre) {  // Metaspace: replacement "▁", prefix unless prepend_scheme is "never"
            const char *scheme = get_str(pre, "prepend_scheme");
            prefix = scheme ? strcmp(scheme, "never") != 0 : get_bool(pre, "add_prefix_space", true);
        }
    }

    // The vocabulary size: one past the largest id anywhere.
    int64_t n_vocab = 0;
    json_object_object_foreach(vocab, key, val) {
        (void)key;
        if (!json_object_is_type(val, json_type_int))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.vocab': '%.64s' has no "
                             "integer id", name, key);
        int64_t id = json_object_get_int64(val);
        if (id < 0 || id >= INT32_MAX / 4)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.vocab': '%.64s': id %lld "
                             "out of range", name, key, (long long)id);
        if (id + 1 > n_vocab) n_vocab = id + 1;
    }
    size_t n_added = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i), *idv = get(a, "id");
        if (!idv || !json_object_is_type(idv, json_type_int) || !get_str(a, "content"))
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'added_tokens[%zu]': needs id and "
                             "content", name, i);
        int64_t id = json_object_get_int64(idv);
        if (id < 0 || id >= INT32_MAX / 4)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'added_tokens[%zu].id': out of "
                             "range", name, i);
        if (id + 1 > n_vocab) n_vocab = id + 1;
    }
    // Ids index dense arrays: a vocabulary whose ids leave more holes than it has tokens is
    // refused, so a few bytes of JSON cannot ask for gigabytes.
    int64_t n_listed = (int64_t)json_object_object_length(vocab) + (int64_t)n_added;
    if (n_vocab > 2 * n_listed + 256)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.vocab': largest id %lld is far "
                         "beyond the %lld tokens listed (ids must be nearly dense)", name,
                         (long long)(n_vocab - 1), (long long)n_listed);
    if ((st = tri__tok_alloc(kind, n_vocab, name, &t))) return st;
    t->pretok = pretok;
    t->add_space_prefix = prefix;
    t->byte_fallback = get_bool(model, "byte_fallback", false);
    t->ignore_merges = get_bool(model, "ignore_merges", false);

    // Added tokens first: they decide the types of the ids they share with model.vocab.
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        json_object *cv = get(a, "content");
        int type = get_bool(a, "special", false) ? TRI__TOKEN_CONTROL : TRI__TOKEN_USER_DEFINED;
        if ((st = add_token(t, name, json_object_get_int64(get(a, "id")),
                            json_object_get_string(cv), (size_t)json_object_get_string_len(cv),
                            type)))
            goto fail;
    }
    json_object_object_foreach(vocab, key2, val2) {
        size_t len = strlen(key2);  // json-c keys are NUL-terminated; a "\u0000" key is refused
        int type = kind == TRI_TOKENIZER_SPM && is_byte_piece(key2, len) ? TRI__TOKEN_BYTE
                                                                         : TRI__TOKEN_NORMAL;
        if ((st = add_token(t, name, json_object_get_int64(val2), key2, len, type))) goto fail;
    }
    const char *unk = get_str(model, "unk_token");
    if (unk) {
        int32_t id = tri__tokenizer_find(t, unk, strlen(unk));
        // The vocabulary index is not built yet; look the text up by scanning once.
        for (int32_t i = 0; id < 0 && i < t->n_vocab; i++)
            if (t->type[i] && t->tok_len[i] == strlen(unk) &&
                memcmp(t->text + t->tok_off[i], unk, t->tok_len[i]) == 0)
                id = i;
        if (id >= 0) {
            t->unk = id;
            // An added special token ("<unk>" in Llama-2 files) stays one: HF splits it out of
            // the text like any other.
            if (t->type[id] != TRI__TOKEN_CONTROL) t->type[id] = TRI__TOKEN_UNKNOWN;
        }
    }
    // HF's BPE model gives unk for a character (a byte, for byte-level) missing from the
    // vocabulary only when unk_token is set, and fuses a run of them only with fuse_unk.
    t->unk_bytes = kind == TRI_TOKENIZER_BPE && t->unk >= 0;
    t->fuse_unk = get_bool(model, "fuse_unk", false);
    if ((st = tri__tok_index(t))) goto fail;

    // Merges: "a b" strings, or [a, b] pairs (tokenizers >= 0.20).
    size_t n_merges = json_object_array_length(merges);
    if ((st = tri__tok_reserve_merges(t, (int64_t)n_merges))) goto fail;
    for (size_t i = 0; i < n_merges; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (json_object_is_type(m, json_type_string)) {
            const char *s = json_object_get_string(m);
            size_t len = (size_t)json_object_get_string_len(m);
            const char *sp = memchr(s, ' ', len);
            if (sp) {
                a = s;
                alen = (size_t)(sp - s);
                b = sp + 1;
                blen = len - alen - 1;
            }
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
            json_object *ma = json_object_array_get_idx(m, 0), *mb = json_object_array_get_idx(m, 1);
            if (json_object_is_type(ma, json_type_string) &&
                json_object_is_type(mb, json_type_string)) {
                a = json_object_get_string(ma);
                alen = (size_t)json_object_get_string_len(ma);
                b = json_object_get_string(mb);
                blen = (size_t)json_object_get_string_len(mb);
            }
        }
        if (!a || !b) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'model.merges[%zu]': neither \"a b\" "
                           "nor [a, b]", name, i);
            goto fail;
        }
        if ((st = tri__tok_add_merge(t, a, alen, b, blen))) goto fail;
    }

    read_post_processor(t, get(root, "post_processor"));
    // Converted Llama-2 tokenizers name <s> and </s>; whether BOS is added is the
    // post-processor's business, as in HF tokenizers.
    if (kind == TRI_TOKENIZER_SPM && t->bos < 0) t->bos = tri__tokenizer_find(t, "<s>", 3);
    if (kind == TRI_TOKENIZER_SPM && t->eos < 0) t->eos = tri__tokenizer_find(t, "</s>", 4);
    if ((st = tri__tok_finish(t))) goto fail;
    *out = t;
    return TRI_STATUS_OK;
fail:
    tri__tokenizer_free(t);
    return st;
}

tri_status tri__tokenizer_from_json_buf(const char *buf, size_t len, const char *name,
                                        tri__tokenizer **out) {
    *out = NULL;
    if (len > INT_MAX)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "%s: %zu bytes, larger than json-c can parse",
                         name, len);
    json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    json_object *root = json_tokener_parse_ex(tok, buf, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: not valid JSON: %s", name,
                         jerr == json_tokener_continue ? "unexpected end"
                                                       : json_tokener_error_desc(jerr));
    }
    (void)used;  // trailing whitespace or bytes after the top object are ignored
    tri_status st = load_json(root, name, out);
    json_object_put(root);
    return st;
}

tri_status tri__read_whole_file(const char *path, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tri__fail(TRI_STATUS_IO, "%s: cannot open", path);
    struct stat sb;
    char *buf = NULL;
    tri_status st = TRI_STATUS_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = tri__fail(TRI_STATUS_IO, "%s: not a readable regular file", path);
        goto done;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX - 1 || (uint64_t)sb.st_size > (1ull << 32)) {
        st = tri__fail(TRI_STATUS_UNSUPPORTED, "%s: %lld bytes, too large for a tokenizer file",
                       path, (long long)sb.st_size);
        goto done;
    }
    size_t len = (size_t)sb.st_size;
    if (!(buf = malloc(len + 1))) {
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, len);
        goto done;
    }
    if (fread(buf, 1, len, f) != len) {
        st = tri__fail(TRI_STATUS_IO, "%s: short read", path);
        free(buf);
        buf = NULL;
        goto done;
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
done:
    fclose(f);
    return st;
}

tri_status tri__tokenizer_from_json_file(const char *path, tri__tokenizer **out) {
    char *buf;
    size_t len;
    *out = NULL;
    tri_status st = tri__read_whole_file(path, &buf, &len);
    if (st) return st;
    st = tri__tokenizer_from_json_buf(buf, len, path, out);
    free(buf);
    return st;
}

// ---- a model directory ----

bool tri__tokenizer_in_dir(const char *dir) {
    char path[4096];
    struct stat sb;
    for (int i = 0; i < 2; i++) {
        const char *file = i ? "tokenizer.model" : "tokenizer.json";
        if (snprintf(path, sizeof path, "%s/%s", dir, file) < (int)sizeof path &&
            stat(path, &sb) == 0)
            return true;
    }
    return false;
}

tri_status tri__tokenizer_from_dir(const char *dir, tri__tokenizer **out) {
    *out = NULL;
    size_t n = strlen(dir);
    char *path = malloc(n + sizeof "/tokenizer.model");
    if (!path) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", dir);
    struct stat sb;
    tri_status st;
    snprintf(path, n + sizeof "/tokenizer.model", "%s/tokenizer.json", dir);
    if (stat(path, &sb) == 0) {
        st = tri__tokenizer_from_json_file(path, out);
    } else {
        snprintf(path, n + sizeof "/tokenizer.model", "%s/tokenizer.model", dir);
        if (stat(path, &sb) == 0) {
            st = tri__tokenizer_from_spm_file(path, out);
        } else {
            st = tri__fail(TRI_STATUS_NOT_FOUND, "%s: no tokenizer.json or tokenizer.model", dir);
        }
    }
    free(path);
    return st;
}
