// tokenizer-gguf.c - builds a tokenizer from a GGUF file's tokenizer.ggml.* metadata.
//
// tokenizer.ggml.model "llama" is SentencePiece BPE (scores decide merges), "gpt2" byte-level BPE
// (tokenizer.ggml.merges decide, in order); tokenizer.ggml.pre names the pre-tokenizer.
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "tokenizer-impl.h"

// tokenizer.ggml.pre names (llama.cpp's) and the splitter each means.
static const struct {
    const char *name;
    tri__pretok pretok;
} pre_names[] = {
    {"default", TRI__PRETOK_GPT2},    {"gpt-2", TRI__PRETOK_GPT2},
    {"gpt2", TRI__PRETOK_GPT2},       {"smollm", TRI__PRETOK_SMOLLM},
    {"starcoder", TRI__PRETOK_SMOLLM}, {"refact", TRI__PRETOK_SMOLLM},
    {"llama-bpe", TRI__PRETOK_LLAMA3}, {"llama3", TRI__PRETOK_LLAMA3},
};

// Reads an optional u32 id key into *out (-1 when absent).
static tri_status opt_id(const tri__gguf *g, const char *key, int32_t *out) {
    uint32_t v;
    tri_status st = tri__gguf_get_u32(g, key, &v);
    if (st == TRI_STATUS_NOT_FOUND) return TRI_STATUS_OK;
    if (st) return st;
    if (v > INT32_MAX)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key '%s': %u out of range",
                         tri__gguf_path(g), key, v);
    *out = (int32_t)v;
    return TRI_STATUS_OK;
}

static tri_status opt_bool(const tri__gguf *g, const char *key, bool *out) {
    tri_status st = tri__gguf_get_bool(g, key, out);
    return st == TRI_STATUS_NOT_FOUND ? TRI_STATUS_OK : st;
}

tri_status tri__tokenizer_from_gguf(const tri__gguf *g, tri__tokenizer **out) {
    *out = NULL;
    const char *path = tri__gguf_path(g);
    tri__gguf_str model;
    tri_status st = tri__gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st == TRI_STATUS_NOT_FOUND || (st == TRI_STATUS_OK && (tri__gguf_str_eq(model, "none") ||
                                                              tri__gguf_str_eq(model, "no_vocab"))))
        return tri__fail(TRI_STATUS_NOT_FOUND, "%s: key 'tokenizer.ggml.model': no tokenizer",
                         path);
    if (st) return st;
    tri_tokenizer_kind kind;
    if (tri__gguf_str_eq(model, "llama")) {
        kind = TRI_TOKENIZER_SPM;
    } else if (tri__gguf_str_eq(model, "gpt2")) {
        kind = TRI_TOKENIZER_BPE;
    } else {
        return tri__fail(TRI_STATUS_UNSUPPORTED,
                         "%s: key 'tokenizer.ggml.model': '%.*s', only llama and gpt2", path,
                         (int)(model.len > 32 ? 32 : model.len), model.ptr);
    }

    const tri__gguf_value *tokens, *scores = NULL, *types = NULL, *merges = NULL;
    if ((st = tri__gguf_get_arr(g, "tokenizer.ggml.tokens", TRI_GGUF_TYPE_STRING, &tokens)))
        return st == TRI_STATUS_NOT_FOUND
                   ? tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.tokens': missing",
                               path)
                   : st;
    uint64_t n = tokens->arr.n;
    st = tri__gguf_get_arr(g, "tokenizer.ggml.scores", TRI_GGUF_TYPE_FLOAT32, &scores);
    if (st && st != TRI_STATUS_NOT_FOUND) return st;
    st = tri__gguf_get_arr(g, "tokenizer.ggml.token_type", TRI_GGUF_TYPE_INT32, &types);
    if (st && st != TRI_STATUS_NOT_FOUND) return st;
    if ((scores && scores->arr.n != n) || (types && types->arr.n != n))
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: key 'tokenizer.ggml.scores' or 'token_type': length differs from "
                         "the %llu tokens", path, (unsigned long long)n);
    if (kind == TRI_TOKENIZER_SPM && !scores)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.scores': missing", path);
    if (kind == TRI_TOKENIZER_BPE) {
        st = tri__gguf_get_arr(g, "tokenizer.ggml.merges", TRI_GGUF_TYPE_STRING, &merges);
        if (st)
            return st == TRI_STATUS_NOT_FOUND
                       ? tri__fail(TRI_STATUS_BAD_FORMAT,
                                   "%s: key 'tokenizer.ggml.merges': missing", path)
                       : st;
    }
    tri__pretok pretok = TRI__PRETOK_NONE;
    if (kind == TRI_TOKENIZER_BPE) {
        tri__gguf_str pre;
        st = tri__gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (st == TRI_STATUS_NOT_FOUND) {
            tri__log(TRI_LOG_LEVEL_WARN, "%s: no tokenizer.ggml.pre; using the GPT-2 splitter",
                     path);
            pretok = TRI__PRETOK_GPT2;
        } else if (st) {
            return st;
        } else {
            for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
                if (tri__gguf_str_eq(pre, pre_names[i].name)) pretok = pre_names[i].pretok;
            if (pretok == TRI__PRETOK_NONE)
                return tri__fail(TRI_STATUS_UNSUPPORTED,
                                 "%s: key 'tokenizer.ggml.pre': '%.*s' is not a supported "
                                 "pre-tokenizer", path, (int)(pre.len > 32 ? 32 : pre.len),
                                 pre.ptr);
        }
    }
    if (n > (uint64_t)INT32_MAX)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.tokens': %llu tokens",
                         path, (unsigned long long)n);

    tri__tokenizer *t;
    if ((st = tri__tok_alloc(kind, (int64_t)n, path, &t))) return st;
    t->pretok = pretok;
    t->ignore_merges = pretok == TRI__PRETOK_LLAMA3;  // as the Llama-3 tokenizer.json says
    for (uint64_t i = 0; i < n; i++) {
        tri__gguf_str s = tokens->arr.items[i].str;
        int64_t type = types ? types->arr.items[i].i : TRI__TOKEN_NORMAL;
        if (type < TRI__TOKEN_NORMAL || type > TRI__TOKEN_BYTE) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.token_type': token "
                           "%llu has type %lld", path, (unsigned long long)i, (long long)type);
            goto fail;
        }
        if (s.len > SIZE_MAX) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token %llu too long", path,
                           (unsigned long long)i);
            goto fail;
        }
        float score = scores ? (float)scores->arr.items[i].f : 0.0f;
        if ((st = tri__tok_set(t, (int64_t)i, s.ptr, (size_t)s.len, score, (int)type))) goto fail;
        if (type == TRI__TOKEN_BYTE) t->byte_fallback = true;
    }
    if ((st = tri__tok_index(t))) goto fail;
    t->split_unk = true;  // llama.cpp's parse_special splits out UNKNOWN tokens too
    if (kind == TRI_TOKENIZER_SPM) {
        t->merge_by_score = true;
        t->add_bos = true;
        t->add_space_prefix = true;
        t->fuse_unk = true;  // as SentencePiece, which made the vocabulary
    } else {
        uint64_t nm = merges->arr.n;
        if (nm > INT32_MAX) {
            st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.merges': too many",
                           path);
            goto fail;
        }
        if ((st = tri__tok_reserve_merges(t, (int64_t)nm))) goto fail;
        for (uint64_t i = 0; i < nm; i++) {
            tri__gguf_str m = merges->arr.items[i].str;
            // "a b": the first space separates; byte-level pieces never contain a space.
            const char *sp = m.len ? memchr(m.ptr, ' ', (size_t)m.len) : NULL;
            if (!sp) {
                st = tri__fail(TRI_STATUS_BAD_FORMAT, "%s: key 'tokenizer.ggml.merges': merge "
                               "%llu has no space", path, (unsigned long long)i);
                goto fail;
            }
            size_t alen = (size_t)(sp - m.ptr);
            if ((st = tri__tok_add_merge(t, m.ptr, alen, sp + 1, (size_t)m.len - alen - 1)))
                goto fail;
        }
    }
    // unknown_token_id is only a label for byte-level BPE (SmolLM2 names <|endoftext|>):
    // unk_bytes stays false, so a byte missing from the vocabulary is dropped, as in llama.cpp.
    if ((st = opt_id(g, "tokenizer.ggml.bos_token_id", &t->bos)) ||
        (st = opt_id(g, "tokenizer.ggml.eos_token_id", &t->eos)) ||
        (st = opt_id(g, "tokenizer.ggml.unknown_token_id", &t->unk)) ||
        (st = opt_id(g, "tokenizer.ggml.padding_token_id", &t->pad)) ||
        (st = opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (st = opt_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos)) ||
        (st = opt_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)))
        goto fail;
    if ((st = tri__tok_finish(t))) goto fail;
    *out = t;
    return TRI_STATUS_OK;
fail:
    tri__tokenizer_free(t);
    return st;
}
