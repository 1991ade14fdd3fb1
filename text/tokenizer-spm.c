// tokenizer-spm.c - loads a SentencePiece tokenizer.model: a serialized ModelProto, read with a
// small protobuf reader that checks every length against the bytes left before using it.
//
// Fields used (sentencepiece_model.proto): ModelProto.pieces = 1 {piece = 1, score = 2 (float),
// type = 3}, trainer_spec = 2 {model_type = 3, treat_whitespace_as_suffix = 24,
// byte_fallback = 35, unk_id = 40, bos_id = 41, eos_id = 42, pad_id = 43}, normalizer_spec = 3
// {name = 1, precompiled_charsmap = 2, add_dummy_prefix = 3, remove_extra_whitespaces = 4,
// escape_whitespaces = 5}. Only BPE models with an identity normalizer are supported.
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer-impl.h"

// ---- protobuf reader ----

typedef struct pb {
    const uint8_t *p, *end;
} pb;

enum { PB_VARINT = 0, PB_I64 = 1, PB_LEN = 2, PB_I32 = 5 };

static bool pb_varint(pb *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return false;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;  // more than 10 bytes
}

// One field: its number and wire type; for PB_LEN the payload in *sub, for PB_VARINT/PB_I32/
// PB_I64 the value in *val. false on a truncated or malformed field.
static bool pb_next(pb *r, uint32_t *field, int *wire, pb *sub, uint64_t *val) {
    uint64_t key;
    if (!pb_varint(r, &key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return false;
    *field = (uint32_t)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case PB_VARINT:
        return pb_varint(r, val);
    case PB_I64:
        if (r->end - r->p < 8) return false;
        memcpy(val, r->p, 8);  // little-endian hosts only, as everywhere in the runtime
        r->p += 8;
        return true;
    case PB_I32: {
        if (r->end - r->p < 4) return false;
        uint32_t v32;
        memcpy(&v32, r->p, 4);
        *val = v32;
        r->p += 4;
        return true;
    }
    case PB_LEN: {
        uint64_t len;
        if (!pb_varint(r, &len) || len > (uint64_t)(r->end - r->p)) return false;
        sub->p = r->p;
        sub->end = r->p + len;
        r->p += len;
        return true;
    }
    default:
        return false;  // groups (3, 4) and reserved wire types
    }
}

// ---- the model ----

typedef struct spm_spec {
    int64_t model_type;  // 1 unigram, 2 BPE
    bool byte_fallback, suffix;
    int64_t unk, bos, eos, pad;
    bool dummy_prefix, remove_extra_ws, escape_ws;
    bool has_charsmap;
    pb name;
} spm_spec;

static tri_status bad(const char *name, const char *what) {
    return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field '%s': truncated or malformed", name, what);
}

static tri_status read_trainer(const char *name, pb r, spm_spec *s) {
    uint32_t f;
    int w;
    pb sub;
    uint64_t v;
    while (r.p < r.end) {
        if (!pb_next(&r, &f, &w, &sub, &v)) return bad(name, "trainer_spec");
        if (w != PB_VARINT) continue;
        switch (f) {
        case 3: s->model_type = (int64_t)v; break;
        case 24: s->suffix = v != 0; break;
        case 35: s->byte_fallback = v != 0; break;
        case 40: s->unk = (int64_t)v; break;  // int32 fields: negatives arrive sign-extended
        case 41: s->bos = (int64_t)v; break;
        case 42: s->eos = (int64_t)v; break;
        case 43: s->pad = (int64_t)v; break;
        default: break;
        }
    }
    return TRI_STATUS_OK;
}

static tri_status read_normalizer(const char *name, pb r, spm_spec *s) {
    uint32_t f;
    int w;
    pb sub;
    uint64_t v;
    while (r.p < r.end) {
        if (!pb_next(&r, &f, &w, &sub, &v)) return bad(name, "normalizer_spec");
        if (f == 1 && w == PB_LEN) s->name = sub;
        if (f == 2 && w == PB_LEN) s->has_charsmap = sub.end > sub.p;
        if (w != PB_VARINT) continue;
        if (f == 3) s->dummy_prefix = v != 0;
        if (f == 4) s->remove_extra_ws = v != 0;
        if (f == 5) s->escape_ws = v != 0;
    }
    return TRI_STATUS_OK;
}

static tri_status read_piece(tri__tokenizer *t, const char *name, pb r, int64_t id) {
    uint32_t f;
    int w;
    pb sub, text = {0};
    uint64_t v;
    float score = 0;
    int64_t type = TRI__TOKEN_NORMAL;
    bool has_text = false;
    while (r.p < r.end) {
        if (!pb_next(&r, &f, &w, &sub, &v)) return bad(name, "pieces");
        if (f == 1 && w == PB_LEN) {
            text = sub;
            has_text = true;
        } else if (f == 2 && w == PB_I32) {
            uint32_t bits = (uint32_t)v;
            memcpy(&score, &bits, 4);
        } else if (f == 3 && w == PB_VARINT) {
            type = (int64_t)v;
        }
    }
    if (!has_text)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'pieces[%lld].piece': missing", name,
                         (long long)id);
    if (type < TRI__TOKEN_NORMAL || type > TRI__TOKEN_BYTE)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'pieces[%lld].type': %lld unknown",
                         name, (long long)id, (long long)type);
    return tri__tok_set(t, id, (const char *)text.p, (size_t)(text.end - text.p), score,
                        (int)type);
}

tri_status tri__tokenizer_from_spm_buf(const uint8_t *buf, size_t len, const char *name,
                                       tri__tokenizer **out) {
    *out = NULL;
    spm_spec spec = {.model_type = 1, .unk = 0, .bos = 1, .eos = 2, .pad = -1,
                     .dummy_prefix = true, .remove_extra_ws = true, .escape_ws = true};
    pb r = {buf, buf + len}, sub;
    uint32_t f;
    int w;
    uint64_t v;
    int64_t n_pieces = 0;
    tri_status st;
    while (r.p < r.end) {
        if (!pb_next(&r, &f, &w, &sub, &v)) return bad(name, "ModelProto");
        if (f == 1 && w == PB_LEN) n_pieces++;
        if (f == 2 && w == PB_LEN && (st = read_trainer(name, sub, &spec))) return st;
        if (f == 3 && w == PB_LEN && (st = read_normalizer(name, sub, &spec))) return st;
    }
    if (n_pieces == 0)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'pieces': none", name);
    if (spec.model_type != 2)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'trainer_spec.model_type': %lld, only BPE (2)", name,
                         (long long)spec.model_type);
    if (spec.suffix || !spec.escape_ws)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'trainer_spec.treat_whitespace_as_suffix' or "
                         "'normalizer_spec.escape_whitespaces': unsupported setting", name);
    if (spec.has_charsmap)
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: field 'normalizer_spec.precompiled_charsmap': normalization rule "
                         "'%.*s' is not supported, only identity", name,
                         (int)(spec.name.end - spec.name.p > 32 ? 32 : spec.name.end - spec.name.p),
                         spec.name.p ? (const char *)spec.name.p : "");

    tri__tokenizer *t;
    if ((st = tri__tok_alloc(TRI_TOKENIZER_SPM, n_pieces, name, &t))) return st;
    r = (pb){buf, buf + len};
    int64_t id = 0;
    while (r.p < r.end) {
        if (!pb_next(&r, &f, &w, &sub, &v)) {  // checked above; kept for safety
            st = bad(name, "ModelProto");
            goto fail;
        }
        if (f == 1 && w == PB_LEN && (st = read_piece(t, name, sub, id++))) goto fail;
    }
    if ((st = tri__tok_index(t))) goto fail;
    t->merge_by_score = true;
    t->add_space_prefix = spec.dummy_prefix;
    t->remove_extra_ws = spec.remove_extra_ws;
    t->byte_fallback = spec.byte_fallback;
    t->fuse_unk = true;  // SentencePiece always merges a run of unknown pieces into one
    t->split_unk = true;  // parse_special as for the GGUF made from this file (llama.cpp's rule)
    int64_t ids[4] = {spec.bos, spec.eos, spec.unk, spec.pad};
    int32_t *dst[4] = {&t->bos, &t->eos, &t->unk, &t->pad};
    for (int i = 0; i < 4; i++) {
        if (ids[i] >= n_pieces) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: field 'trainer_spec': special id %lld "
                           "past the %lld pieces", name, (long long)ids[i], (long long)n_pieces);
            goto fail;
        }
        *dst[i] = ids[i] < 0 ? -1 : (int32_t)ids[i];
    }
    t->add_bos = t->bos >= 0;  // SentencePiece's Llama convention: BOS yes, EOS no
    if ((st = tri__tok_finish(t))) goto fail;
    *out = t;
    return TRI_STATUS_OK;
fail:
    tri__tokenizer_free(t);
    return st;
}

tri_status tri__tokenizer_from_spm_file(const char *path, tri__tokenizer **out) {
    char *buf;
    size_t len;
    *out = NULL;
    tri_status st = tri__read_whole_file(path, &buf, &len);
    if (st) return st;
    st = tri__tokenizer_from_spm_buf((const uint8_t *)buf, len, path, out);
    free(buf);
    return st;
}
