// tokenizer.c - the tokenizer core: building the vocabulary tables, pre-tokenizers, the BPE merge
// loop, encoding and decoding. The loaders live in tokenizer-gguf.c, tokenizer-json.c and
// tokenizer-spm.c.
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer-impl.h"
#include "unicode.h"

// ---- hashing ----

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 31);
}

// The smallest power of two >= 2 n (at least 16), or 0 on overflow.
static uint64_t table_size(int64_t n) {
    uint64_t size = 16;
    while (size < (uint64_t)n * 2) {
        if (size > (UINT64_MAX >> 2)) return 0;
        size <<= 1;
    }
    return size;
}

int32_t tri__tokenizer_find(const tri__tokenizer *t, const char *text, size_t len) {
    if (!t->vhash) return -1;
    for (uint64_t i = hash_bytes(text, len) & t->vhash_mask;; i = (i + 1) & t->vhash_mask) {
        int32_t id = t->vhash[i];
        if (id < 0) return -1;
        if (t->tok_len[id] == len && memcmp(t->text + t->tok_off[id], text, len) == 0) return id;
    }
}

static const tri__merge *find_merge(const tri__tokenizer *t, int32_t a, int32_t b) {
    if (!t->mhash) return NULL;
    for (uint64_t i = hash_pair(a, b) & t->mhash_mask;; i = (i + 1) & t->mhash_mask) {
        const tri__merge *m = &t->mhash[i];
        if (m->a < 0) return NULL;
        if (m->a == a && m->b == b) return m;
    }
}

// ---- GPT-2 byte-to-unicode map ----

// Bytes that print as themselves: '!'..'~', 0xa1..0xac, 0xae..0xff. The other 68 map, in byte
// order, to U+0100 upwards.
uint32_t tri__bpe_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xa0) return 0x100u + 33 + (b - 0x7fu);
    return 0x100u + 67;  // 0xad
}

// The byte a code point of a byte-level vocabulary stands for, or -1.
static int bpe_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp < 0x100 || cp > 0x100 + 67) return -1;
    uint32_t n = cp - 0x100;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(0x7f + (n - 33));
    return 0xad;
}

// ---- builder ----

tri_status tri__tok_alloc(tri_tokenizer_kind kind, int64_t n_vocab, const char *name,
                          tri__tokenizer **out) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > INT32_MAX / 4)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: vocabulary size %lld out of range", name,
                         (long long)n_vocab);
    tri__tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->kind = kind;
    t->n_vocab = (int32_t)n_vocab;
    t->bos = t->eos = t->unk = t->pad = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    size_t n = (size_t)n_vocab;
    t->name = strdup(name);
    t->tok_off = calloc(n, sizeof *t->tok_off);
    t->tok_len = calloc(n, sizeof *t->tok_len);
    t->score = calloc(n, sizeof *t->score);
    t->type = calloc(n, sizeof *t->type);
    t->dec_off = calloc(n, sizeof *t->dec_off);
    t->dec_len = calloc(n, sizeof *t->dec_len);
    if (!t->name || !t->tok_off || !t->tok_len || !t->score || !t->type || !t->dec_off ||
        !t->dec_len)
        goto oom;
    *out = t;
    return TRI_STATUS_OK;
oom:
    tri__tokenizer_free(t);
    return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for %lld tokens", name,
                     (long long)n_vocab);
}

// Appends len bytes to a growable arena; *off receives where they start.
static bool arena_put(char **buf, uint64_t *used, uint64_t *cap, const char *s, size_t len,
                      uint64_t *off) {
    if (len > UINT64_MAX - *used - 1) return false;
    if (*used + len + 1 > *cap) {
        uint64_t ncap = *cap ? *cap : 4096;
        while (ncap < *used + len + 1) {
            if (ncap > UINT64_MAX / 2) return false;
            ncap *= 2;
        }
        if (ncap > SIZE_MAX) return false;
        char *nb = realloc(*buf, (size_t)ncap);
        if (!nb) return false;
        *buf = nb;
        *cap = ncap;
    }
    if (len) memcpy(*buf + *used, s, len);
    *off = *used;
    *used += len;
    (*buf)[*used] = 0;
    return true;
}

tri_status tri__tok_set(tri__tokenizer *t, int64_t id, const char *text, size_t len, float score,
                        int type) {
    if (id < 0 || id >= t->n_vocab)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token id %lld out of range [0, %d)",
                         t->name, (long long)id, t->n_vocab);
    if (t->type[id])
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token id %lld defined twice", t->name,
                         (long long)id);
    if (type < TRI__TOKEN_NORMAL || type > TRI__TOKEN_BYTE)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token %lld: unknown type %d", t->name,
                         (long long)id, type);
    if (len > UINT32_MAX)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: token %lld: text too long", t->name,
                         (long long)id);
    uint64_t off;
    if (!arena_put(&t->text, &t->text_len, &t->text_cap, text, len, &off))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for token texts", t->name);
    t->tok_off[id] = off;
    t->tok_len[id] = (uint32_t)len;
    t->score[id] = score;
    t->type[id] = (uint8_t)type;
    return TRI_STATUS_OK;
}

tri_status tri__tok_index(tri__tokenizer *t) {
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->type[i]) {
            // A hole in the ids (tokenizer.json may skip some): an empty token nothing produces.
            t->type[i] = TRI__TOKEN_UNUSED;
            t->tok_len[i] = 0;
            t->tok_off[i] = 0;
        }
    }
    uint64_t size = table_size(t->n_vocab);
    if (!size || size > SIZE_MAX / sizeof(int32_t) ||
        !(t->vhash = malloc((size_t)size * sizeof(int32_t))))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for the vocabulary index",
                         t->name);
    memset(t->vhash, 0xff, (size_t)size * sizeof(int32_t));
    t->vhash_mask = size - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->type[id] == TRI__TOKEN_UNUSED && t->tok_len[id] == 0) continue;
        const char *s = t->text + t->tok_off[id];
        size_t len = t->tok_len[id];
        uint64_t i = hash_bytes(s, len) & t->vhash_mask;
        bool dup = false;
        for (; t->vhash[i] >= 0; i = (i + 1) & t->vhash_mask) {
            int32_t o = t->vhash[i];
            if (t->tok_len[o] == len && memcmp(t->text + t->tok_off[o], s, len) == 0) {
                dup = true;  // a repeated text keeps its lowest id, as lookups need one answer
                break;
            }
        }
        if (!dup) t->vhash[i] = id;
    }
    return TRI_STATUS_OK;
}

tri_status tri__tok_reserve_merges(tri__tokenizer *t, int64_t n) {
    uint64_t size = table_size(n);
    if (n < 0 || n > INT32_MAX || !size || size > SIZE_MAX / sizeof(tri__merge) ||
        !(t->mhash = malloc((size_t)size * sizeof(tri__merge))))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for %lld merges", t->name,
                         (long long)n);
    memset(t->mhash, 0xff, (size_t)size * sizeof(tri__merge));
    t->mhash_mask = size - 1;
    return TRI_STATUS_OK;
}

tri_status tri__tok_add_merge(tri__tokenizer *t, const char *a, size_t alen, const char *b,
                              size_t blen) {
    TRI_ASSERT(t->mhash && t->vhash);
    int32_t ia = tri__tokenizer_find(t, a, alen), ib = tri__tokenizer_find(t, b, blen);
    if (ia < 0 || ib < 0)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: merge %lld: '%.*s' is not in the vocabulary",
                         t->name, (long long)t->n_merges, (int)(ia < 0 ? alen : blen),
                         ia < 0 ? a : b);
    if (alen > SIZE_MAX - blen || alen + blen > 65536)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: merge %lld: too long", t->name,
                         (long long)t->n_merges);
    char stackbuf[512];
    char *cat = alen + blen <= sizeof stackbuf ? stackbuf : malloc(alen + blen);
    if (!cat) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", t->name);
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t ir = tri__tokenizer_find(t, cat, alen + blen);
    if (cat != stackbuf) free(cat);
    if (ir < 0)
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "%s: merge %lld: '%.*s' + '%.*s' is not in the vocabulary", t->name,
                         (long long)t->n_merges, (int)alen, a, (int)blen, b);
    if ((uint64_t)t->n_merges * 2 >= t->mhash_mask + 1)
        return tri__fail(TRI_STATUS_INTERNAL, "%s: more merges than reserved", t->name);
    uint64_t i = hash_pair(ia, ib) & t->mhash_mask;
    for (; t->mhash[i].a >= 0; i = (i + 1) & t->mhash_mask)
        if (t->mhash[i].a == ia && t->mhash[i].b == ib) break;  // repeated: the first rank wins
    if (t->mhash[i].a < 0)
        t->mhash[i] = (tri__merge){.a = ia, .b = ib, .rank = (int32_t)t->n_merges, .result = ir};
    t->n_merges++;
    return TRI_STATUS_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The byte of a "<0xXX>" text, or -1.
static int byte_piece_value(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// The decoded bytes of token id into dst (room for 3 * tok_len bytes); returns their count.
static size_t decode_token_text(const tri__tokenizer *t, int32_t id, char *dst) {
    const char *s = t->text + t->tok_off[id];
    size_t len = t->tok_len[id], n = 0;
    int type = t->type[id];
    if (type == TRI__TOKEN_CONTROL || type == TRI__TOKEN_UNKNOWN || type == TRI__TOKEN_UNUSED) {
        memcpy(dst, s, len);
        return len;
    }
    if (t->kind == TRI_TOKENIZER_SPM) {
        int byte = type == TRI__TOKEN_BYTE ? byte_piece_value(s, len) : -1;
        if (byte >= 0) {
            dst[0] = (char)byte;
            return 1;
        }
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {  // U+2581 "▁"
                dst[n++] = ' ';
                i += 3;
            } else {
                dst[n++] = s[i++];
            }
        }
        return n;
    }
    if (type == TRI__TOKEN_USER_DEFINED) {  // added tokens are stored as plain text
        memcpy(dst, s, len);
        return len;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tri__utf8_decode((const uint8_t *)s + i, len - i, &cp);
        int byte = (cp & TRI_UTF8_INVALID) ? -1 : bpe_cp_to_byte(cp);
        if (byte >= 0) {
            dst[n++] = (char)byte;
        } else {
            memcpy(dst + n, s + i, (size_t)k);  // not from the byte map: keep as written
            n += (size_t)k;
        }
        i += (size_t)k;
    }
    return n;
}

// qsort has no context argument; loading on several threads at once stays safe.
static _Thread_local const tri__tokenizer *sort_ctx;

// First byte ascending, then longest first, so the first match at a position is the longest.
static int cmp_special(const void *pa, const void *pb) {
    const tri__tokenizer *t = sort_ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint8_t fa = (uint8_t)t->text[t->tok_off[a]], fb = (uint8_t)t->text[t->tok_off[b]];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (t->tok_len[a] != t->tok_len[b]) return t->tok_len[a] > t->tok_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

// Whether token i is split out of the text before the model sees it: user-defined tokens always,
// control tokens (and, with split_unk, the unknown token) with parse_special. Empty texts never.
static bool splits_out(const tri__tokenizer *t, int32_t i) {
    int type = t->type[i];
    return t->tok_len[i] > 0 && (type == TRI__TOKEN_CONTROL || type == TRI__TOKEN_USER_DEFINED ||
                                 (type == TRI__TOKEN_UNKNOWN && t->split_unk));
}

tri_status tri__tok_finish(tri__tokenizer *t) {
    int32_t *ids[] = {&t->bos, &t->eos, &t->unk, &t->pad};
    static const char *const names[] = {"bos", "eos", "unknown", "padding"};
    for (int i = 0; i < 4; i++)
        if (*ids[i] >= t->n_vocab)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: %s token id %d out of range [0, %d)",
                             t->name, names[i], *ids[i], t->n_vocab);
    if (t->unk < 0) {
        for (int32_t i = 0; i < t->n_vocab; i++) {
            if (t->type[i] == TRI__TOKEN_UNKNOWN) {
                t->unk = i;
                break;
            }
        }
    }
    if (t->kind == TRI_TOKENIZER_SPM) {
        for (int32_t i = 0; i < t->n_vocab; i++) {
            int b = byte_piece_value(t->text + t->tok_off[i], t->tok_len[i]);
            if (b >= 0 && t->byte_tok[b] < 0 && t->type[i] == TRI__TOKEN_BYTE) t->byte_tok[b] = i;
        }
    } else {
        for (int b = 0; b < 256; b++) {
            uint8_t u[4];
            int n = tri__utf8_encode(tri__bpe_byte_to_cp((uint8_t)b), u);
            t->byte_tok[b] = tri__tokenizer_find(t, (const char *)u, (size_t)n);
        }
    }

    // Decoded pieces: never longer than the text (a 3-byte "▁" becomes one space, a 2-byte
    // mapped character one byte).
    if (t->text_len > SIZE_MAX - 1 || !(t->dec = malloc((size_t)t->text_len + 1)))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory for decoded pieces",
                         t->name);
    uint64_t used = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n = decode_token_text(t, i, t->dec + used);
        TRI_ASSERT(n <= t->tok_len[i]);
        t->dec_off[i] = used;
        t->dec_len[i] = (uint32_t)n;
        used += n;
    }

    t->n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (splits_out(t, i)) t->n_special++;
    if (t->n_special) {
        if (!(t->special = malloc((size_t)t->n_special * sizeof *t->special)))
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: out of memory", t->name);
        int32_t k = 0;
        for (int32_t i = 0; i < t->n_vocab; i++)
            if (splits_out(t, i)) t->special[k++] = i;
        sort_ctx = t;
        qsort(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special);
        sort_ctx = NULL;
    }
    int32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_special && (uint8_t)t->text[t->tok_off[t->special[k]]] < b) k++;
        t->special_first[b] = k;
    }
    return TRI_STATUS_OK;
}

void tri__tokenizer_free(tri__tokenizer *t) {
    if (!t) return;
    free(t->name);
    free(t->text);
    free(t->tok_off);
    free(t->tok_len);
    free(t->score);
    free(t->type);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->vhash);
    free(t->mhash);
    free(t->special);
    free(t);
}

// ---- queries ----

tri_tokenizer_kind tri__tokenizer_kind(const tri__tokenizer *t) { return t->kind; }
tri__pretok tri__tokenizer_pretok(const tri__tokenizer *t) { return t->pretok; }
int32_t tri__tokenizer_n_vocab(const tri__tokenizer *t) { return t->n_vocab; }
int32_t tri__tokenizer_bos(const tri__tokenizer *t) { return t->bos; }
int32_t tri__tokenizer_eos(const tri__tokenizer *t) { return t->eos; }
int32_t tri__tokenizer_unk(const tri__tokenizer *t) { return t->unk; }
bool tri__tokenizer_add_bos(const tri__tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool tri__tokenizer_add_eos(const tri__tokenizer *t) { return t->add_eos && t->eos >= 0; }

const char *tri__tokenizer_text(const tri__tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->tok_len[id];
    return t->text + t->tok_off[id];
}

tri__token_type tri__tokenizer_type(const tri__tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return TRI__TOKEN_UNUSED;
    return (tri__token_type)t->type[id];
}

static bool is_special_piece(const tri__tokenizer *t, int32_t id) {
    int type = t->type[id];
    return type == TRI__TOKEN_CONTROL || type == TRI__TOKEN_UNKNOWN || type == TRI__TOKEN_UNUSED;
}

const char *tri__tokenizer_piece(const tri__tokenizer *t, int32_t id, size_t *len, bool *special) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->dec_len[id];
    if (special) *special = is_special_piece(t, id);
    return t->dec + t->dec_off[id];
}

// ---- pre-tokenizers ----

static inline uint32_t cp_at(const uint8_t *s, size_t end, size_t pos, int *n) {
    uint32_t cp;
    *n = tri__utf8_decode(s + pos, end - pos, &cp);
    return cp;
}

static inline int cls_of(uint32_t cp) {
    return (cp & TRI_UTF8_INVALID) ? TRI_UCLASS_OTHER : tri__unicode_class(cp);
}

// Advances over characters of class c.
static size_t skip_class(const uint8_t *s, size_t end, size_t q, int c) {
    while (q < end) {
        int n;
        uint32_t cp = cp_at(s, end, q, &n);
        if (cls_of(cp) != c) break;
        q += (size_t)n;
    }
    return q;
}

// \s+(?!\S)|\s+ at p (a whitespace character): the run, less its last character when a
// non-space follows and the run has more than one character.
static size_t match_space_run(const uint8_t *s, size_t end, size_t p) {
    size_t q = p, last = p;
    while (q < end) {
        int n;
        uint32_t cp = cp_at(s, end, q, &n);
        if (cls_of(cp) != TRI_UCLASS_SPACE) break;
        last = q;
        q += (size_t)n;
    }
    if (q == end || last == p) return q;
    return last;
}

static size_t contraction(const uint8_t *s, size_t end, size_t p, bool fold) {
    if (s[p] != '\'' || p + 1 >= end) return 0;
    uint8_t a = s[p + 1], b = p + 2 < end ? s[p + 2] : 0;
    if (fold) {
        if (a >= 'A' && a <= 'Z') a = (uint8_t)(a + 32);
        if (b >= 'A' && b <= 'Z') b = (uint8_t)(b + 32);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t gpt2_next(const uint8_t *s, size_t end, size_t p) {
    size_t k = contraction(s, end, p, false);
    if (k) return p + k;
    int n0;
    uint32_t c0 = cp_at(s, end, p, &n0);
    size_t q = c0 == ' ' ? p + 1 : p;
    if (q < end) {
        int n;
        int c = cls_of(cp_at(s, end, q, &n));
        if (c != TRI_UCLASS_SPACE) return skip_class(s, end, q + (size_t)n, c);
    }
    return match_space_run(s, end, p);
}

static size_t llama3_next(const uint8_t *s, size_t end, size_t p) {
    size_t k = contraction(s, end, p, true);
    if (k) return p + k;
    int n0;
    uint32_t c0 = cp_at(s, end, p, &n0);
    int k0 = cls_of(c0);
    size_t p1 = p + (size_t)n0;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (k0 == TRI_UCLASS_LETTER) return skip_class(s, end, p1, TRI_UCLASS_LETTER);
    if (k0 != TRI_UCLASS_NUMBER && c0 != '\r' && c0 != '\n' && p1 < end) {
        int n1;
        if (cls_of(cp_at(s, end, p1, &n1)) == TRI_UCLASS_LETTER)
            return skip_class(s, end, p1 + (size_t)n1, TRI_UCLASS_LETTER);
    }
    // \p{N}{1,3}
    if (k0 == TRI_UCLASS_NUMBER) {
        size_t q = p1;
        for (int i = 1; i < 3 && q < end; i++) {
            int n;
            if (cls_of(cp_at(s, end, q, &n)) != TRI_UCLASS_NUMBER) break;
            q += (size_t)n;
        }
        return q;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t q = c0 == ' ' ? p1 : p;
    if (q < end) {
        int n;
        if (cls_of(cp_at(s, end, q, &n)) == TRI_UCLASS_OTHER) {
            q = skip_class(s, end, q + (size_t)n, TRI_UCLASS_OTHER);
            while (q < end && (s[q] == '\r' || s[q] == '\n')) q++;
            return q;
        }
    }
    // \s*[\r\n]+ : the whitespace run up to and including its last newline
    size_t r = 0, run_end = p;
    bool newline = false;
    while (run_end < end) {
        int n;
        uint32_t cp = cp_at(s, end, run_end, &n);
        if (cls_of(cp) != TRI_UCLASS_SPACE) break;
        if (cp == '\r' || cp == '\n') {
            newline = true;
            r = run_end;
        }
        run_end += (size_t)n;
    }
    if (newline) return r + 1;
    if (run_end > p) return match_space_run(s, end, p);
    return p1;  // unreachable for valid classes; still makes progress
}

size_t tri__pretok_next(tri__pretok kind, const uint8_t *s, size_t len, size_t pos,
                        size_t *seg_end) {
    switch (kind) {
    case TRI__PRETOK_GPT2:
        return gpt2_next(s, len, pos);
    case TRI__PRETOK_LLAMA3:
        return llama3_next(s, len, pos);
    case TRI__PRETOK_SMOLLM: {
        // Digits are isolated first; the regex then runs on each stretch between them, so its
        // look-ahead sees the end of the stretch, not the digit.
        int n;
        if (cls_of(cp_at(s, len, pos, &n)) == TRI_UCLASS_NUMBER) return pos + (size_t)n;
        if (*seg_end <= pos) {
            size_t q = pos;
            while (q < len) {
                if (cls_of(cp_at(s, len, q, &n)) == TRI_UCLASS_NUMBER) break;
                q += (size_t)n;
            }
            *seg_end = q;
        }
        return gpt2_next(s, *seg_end, pos);
    }
    case TRI__PRETOK_NONE:
        break;
    }
    return len;
}

// ---- the merge loop ----

// A symbol of the word being merged: bytes [start, start + len) of the word; len 0 once merged
// into its left neighbour.
typedef struct sym {
    int32_t id;  // -1 when the text is not a token
    int32_t prev, next;
    uint32_t start, len;
} sym;

// A candidate merge of symbols left and left's right neighbour. Stale candidates stay in the heap
// and are dropped when popped: valid only while both sides still span len bytes together.
typedef struct cand {
    double key;  // lower merges first: the rank, or minus the SPM score
    int32_t left, right;
    uint32_t len;
    int32_t result;
} cand;

typedef struct scratch {
    sym *syms;
    size_t syms_cap;
    cand *heap;
    size_t heap_len, heap_cap;
    char *buf;  // the escaped SPM text or a byte-mapped BPE word
    size_t buf_cap;
    int32_t *ids;  // output
    int64_t n_ids, ids_cap;
} scratch;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem) return false;
        ncap *= 2;
    }
    void *np = realloc(*p, ncap * elem);
    if (!np) return false;
    *p = np;
    *cap = ncap;
    return true;
}

static bool push_id(scratch *sc, int32_t id) {
    if (sc->n_ids == sc->ids_cap) {
        size_t cap = (size_t)sc->ids_cap;
        if (!grow((void **)&sc->ids, &cap, (size_t)sc->n_ids + 1, sizeof *sc->ids)) return false;
        sc->ids_cap = (int64_t)cap;
    }
    sc->ids[sc->n_ids++] = id;
    return true;
}

static inline bool cand_less(const cand *a, const cand *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static bool heap_push(scratch *sc, cand c) {
    if (!grow((void **)&sc->heap, &sc->heap_cap, sc->heap_len + 1, sizeof(cand))) return false;
    size_t i = sc->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &sc->heap[parent])) break;
        sc->heap[i] = sc->heap[parent];
        i = parent;
    }
    sc->heap[i] = c;
    return true;
}

static cand heap_pop(scratch *sc) {
    cand top = sc->heap[0], last = sc->heap[--sc->heap_len];
    size_t i = 0, n = sc->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&sc->heap[c + 1], &sc->heap[c])) c++;
        if (!cand_less(&sc->heap[c], &last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (n) sc->heap[i] = last;
    return top;
}

// Queues the merge of symbols l and r if the tokenizer has one.
static bool try_pair(const tri__tokenizer *t, scratch *sc, const char *word, int32_t l,
                     int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &sc->syms[l], *b = &sc->syms[r];
    cand c = {.left = l, .right = r, .len = a->len + b->len};
    if (t->merge_by_score) {
        int32_t id = tri__tokenizer_find(t, word + a->start, c.len);
        if (id < 0 || (t->type[id] != TRI__TOKEN_NORMAL && t->type[id] != TRI__TOKEN_USER_DEFINED))
            return true;
        c.key = -(double)t->score[id];
        c.result = id;
    } else {
        if (a->id < 0 || b->id < 0) return true;
        const tri__merge *m = find_merge(t, a->id, b->id);
        if (!m) return true;
        c.key = m->rank;
        c.result = m->result;
    }
    return heap_push(sc, c);
}

// Merges the n symbols sc->syms[0, n) (linked in order) until no queued merge applies: the best
// pair first, the leftmost among equals. O(n log n): each merge queues at most two candidates.
static bool run_merges(const tri__tokenizer *t, scratch *sc, const char *word, int32_t n) {
    sc->heap_len = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        if (!try_pair(t, sc, word, i, i + 1)) return false;
    while (sc->heap_len) {
        cand c = heap_pop(sc);
        sym *a = &sc->syms[c.left], *b = &sc->syms[c.right];
        if (a->len == 0 || b->len == 0 || a->next != c.right || a->len + b->len != c.len)
            continue;
        a->len += b->len;
        a->id = c.result;
        a->next = b->next;
        if (b->next >= 0) sc->syms[b->next].prev = c.left;
        b->len = 0;
        if (!try_pair(t, sc, word, a->prev, c.left) || !try_pair(t, sc, word, c.left, a->next))
            return false;
    }
    return true;
}

// ---- encoding ----

// SPM: escape spaces as "▁" (with the dummy prefix), split into characters, merge, and map
// each symbol to its id, its <0xXX> bytes, or unk (one unk for a run, with fuse_unk).
static bool encode_spm(const tri__tokenizer *t, scratch *sc, const uint8_t *s, size_t len,
                       bool prefix) {
    int64_t first = sc->n_ids;  // where this fragment's ids start: runs of unk end before it
    size_t a = 0, b = len;
    if (t->remove_extra_ws) {
        while (a < b && s[a] == ' ') a++;
        while (b > a && s[b - 1] == ' ') b--;
    }
    if (a == b) return true;
    // Worst case 3 bytes per input byte, plus the prefix.
    if ((b - a) > (SIZE_MAX - 3) / 3 || !grow((void **)&sc->buf, &sc->buf_cap, (b - a) * 3 + 3, 1))
        return false;
    size_t n = 0;
    if (prefix && t->add_space_prefix) {
        memcpy(sc->buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = a; i < b; i++) {
        if (s[i] == ' ') {
            if (t->remove_extra_ws && i > a && s[i - 1] == ' ') continue;
            memcpy(sc->buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            sc->buf[n++] = (char)s[i];
        }
    }
    if (n > UINT32_MAX || !grow((void **)&sc->syms, &sc->syms_cap, n, sizeof(sym))) return false;
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tri__utf8_decode((const uint8_t *)sc->buf + i, n - i, &cp);
        sym *y = &sc->syms[ns];
        y->start = (uint32_t)i;
        y->len = (uint32_t)k;
        y->prev = ns - 1;
        y->next = ns + 1;
        y->id = t->merge_by_score ? -1 : tri__tokenizer_find(t, sc->buf + i, (size_t)k);
        ns++;
        i += (size_t)k;
    }
    sc->syms[ns - 1].next = -1;
    if (!run_merges(t, sc, sc->buf, ns)) return false;
    for (int32_t i = 0; i >= 0; i = sc->syms[i].next) {
        const sym *y = &sc->syms[i];
        int32_t id = tri__tokenizer_find(t, sc->buf + y->start, y->len);
        if (id >= 0 && t->type[id] != TRI__TOKEN_UNUSED) {
            if (!push_id(sc, id)) return false;
            continue;
        }
        for (uint32_t j = 0; j < (t->byte_fallback ? y->len : 1); j++) {
            int32_t bt = t->byte_fallback ? t->byte_tok[(uint8_t)sc->buf[y->start + j]] : -1;
            if (bt < 0) {
                // SentencePiece fuses consecutive unknown pieces ("日本" -> one unk), so that
                // decoding can copy the unknown text back as one span.
                bool run = t->fuse_unk && sc->n_ids > first && sc->ids[sc->n_ids - 1] == t->unk;
                if (run || t->unk < 0) continue;  // no unk at all: dropped, as HF does
                bt = t->unk;
            }
            if (!push_id(sc, bt)) return false;
        }
    }
    return true;
}

// Byte-level BPE on one pre-tokenized word.
static bool encode_bpe_word(const tri__tokenizer *t, scratch *sc, const uint8_t *w, size_t len) {
    if (t->ignore_merges) {
        if (len > SIZE_MAX / 2 || !grow((void **)&sc->buf, &sc->buf_cap, len * 2, 1)) return false;
        size_t n = 0;
        for (size_t i = 0; i < len; i++)
            n += (size_t)tri__utf8_encode(tri__bpe_byte_to_cp(w[i]), (uint8_t *)sc->buf + n);
        int32_t id = tri__tokenizer_find(t, sc->buf, n);
        if (id >= 0) return push_id(sc, id);
    }
    if (len > UINT32_MAX || !grow((void **)&sc->syms, &sc->syms_cap, len, sizeof(sym)))
        return false;
    int32_t ns = 0;
    bool prev_unk = false;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_tok[w[i]];
        bool unknown = id < 0;
        if (unknown) {
            // A byte missing from the vocabulary is dropped (HF without unk_token, llama.cpp,
            // which ignores the unknown_token_id GGUF files carry) or becomes unk (HF with
            // unk_token; fuse_unk makes a run of them one unk, within the word).
            if (!t->unk_bytes) continue;
            if (t->fuse_unk && prev_unk) {
                sc->syms[ns - 1].len++;
                continue;
            }
            id = t->unk;
        }
        prev_unk = unknown;
        sym *y = &sc->syms[ns];
        y->id = id;
        y->start = (uint32_t)i;
        y->len = 1;
        y->prev = ns - 1;
        y->next = ns + 1;
        ns++;
    }
    if (!ns) return true;
    sc->syms[ns - 1].next = -1;
    if (!run_merges(t, sc, (const char *)w, ns)) return false;
    for (int32_t i = 0; i >= 0; i = sc->syms[i].next)
        if (!push_id(sc, sc->syms[i].id)) return false;
    return true;
}

static bool encode_bpe(const tri__tokenizer *t, scratch *sc, const uint8_t *s, size_t len) {
    size_t seg_end = 0;
    for (size_t p = 0; p < len;) {
        size_t q = tri__pretok_next(t->pretok, s, len, p, &seg_end);
        TRI_ASSERT(q > p && q <= len);
        if (!encode_bpe_word(t, sc, s + p, q - p)) return false;
        p = q;
    }
    return true;
}

// The special token at s[0, len) to split out, or -1.
static int32_t match_special(const tri__tokenizer *t, const uint8_t *s, size_t len,
                             bool parse_special) {
    int32_t lo = t->special_first[s[0]], hi = t->special_first[s[0] + 1];
    for (int32_t k = lo; k < hi; k++) {
        int32_t id = t->special[k];
        if (t->type[id] != TRI__TOKEN_USER_DEFINED && !parse_special) continue;
        size_t n = t->tok_len[id];
        if (n <= len && memcmp(s, t->text + t->tok_off[id], n) == 0) return id;
    }
    return -1;
}

static bool encode_fragment(const tri__tokenizer *t, scratch *sc, const uint8_t *s, size_t len,
                            bool prefix) {
    if (len == 0) return true;
    if (t->kind == TRI_TOKENIZER_SPM) return encode_spm(t, sc, s, len, prefix);
    return encode_bpe(t, sc, s, len);
}

tri_status tri__tokenizer_encode(const tri__tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, int32_t **ids,
                                 int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tokenize: text is NULL");
    if (len > INT32_MAX / 4)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tokenize: %zu bytes of text, at most %d",
                         len, INT32_MAX / 4);
    scratch sc = {0};
    const uint8_t *s = (const uint8_t *)text;
    bool ok = true;
    if (add_special && t->add_bos && t->bos >= 0) ok = push_id(&sc, t->bos);
    // Text before the first special token, and after each one, gets the SPM dummy prefix (as
    // llama.cpp does).
    size_t start = 0;
    bool prefix = true;
    for (size_t p = 0; ok && p < len;) {
        int32_t id = t->n_special ? match_special(t, s + p, len - p, parse_special) : -1;
        if (id < 0) {
            p++;
            continue;
        }
        ok = encode_fragment(t, &sc, s + start, p - start, prefix) && push_id(&sc, id);
        p += t->tok_len[id];
        start = p;
        prefix = true;
    }
    if (ok) ok = encode_fragment(t, &sc, s + start, len - start, prefix);
    if (ok && add_special && t->add_eos && t->eos >= 0) ok = push_id(&sc, t->eos);
    free(sc.syms);
    free(sc.heap);
    free(sc.buf);
    if (!ok) {
        free(sc.ids);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "tokenize: out of memory for %zu bytes of text",
                         len);
    }
    *ids = sc.ids;
    *n_ids = sc.n_ids;
    return TRI_STATUS_OK;
}

// ---- decoding ----

tri_status tri__tokenizer_decode(const tri__tokenizer *t, const int32_t *ids, int64_t n,
                                 bool render_special, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (n < 0 || (n > 0 && !ids))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "detokenize: bad id array");
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "detokenize: id %d at %lld out of range [0, %d)", ids[i],
                             (long long)i, t->n_vocab);
        total += t->dec_len[ids[i]];  // each at most 2^32, n at most 2^63: fits a 64-bit size_t
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "detokenize: out of memory for %zu bytes",
                         total);
    size_t used = 0;
    bool started = false;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        bool special = is_special_piece(t, id);
        if (special && !render_special) continue;
        const char *p = t->dec + t->dec_off[id];
        size_t len = t->dec_len[id];
        if (!started && !special && t->kind == TRI_TOKENIZER_SPM && t->add_space_prefix &&
            len && p[0] == ' ') {
            p++;
            len--;
        }
        if (len) started = true;
        memcpy(buf + used, p, len);
        used += len;
    }
    buf[used] = 0;
    *out = buf;
    *out_len = used;
    return TRI_STATUS_OK;
}

void tri__detok_init(tri__detok *d, const tri__tokenizer *t, bool render_special) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->render_special = render_special;
}

void tri__detok_free(tri__detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}

// Whether s[0, n) (n < the lead's length) can still become a valid UTF-8 character.
static bool utf8_prefix_ok(const uint8_t *s, size_t n) {
    int need = tri__utf8_lead_len(s[0]);
    if (need <= 1 || n >= (size_t)need) return false;
    for (size_t i = 1; i < n; i++) {
        uint8_t lo = 0x80, hi = 0xbf;
        if (i == 1) {
            if (s[0] == 0xe0) lo = 0xa0;
            if (s[0] == 0xed) hi = 0x9f;
            if (s[0] == 0xf0) lo = 0x90;
            if (s[0] == 0xf4) hi = 0x8f;
        }
        if (s[i] < lo || s[i] > hi) return false;
    }
    return true;
}

// Moves the complete characters of pending + piece into d->buf; keeps an incomplete tail unless
// final.
static tri_status detok_emit(tri__detok *d, const char *piece, size_t len, bool final,
                             size_t *out_len) {
    size_t total = (size_t)d->pending_len + len;
    size_t need = total * 3 + 1;  // an invalid byte becomes the 3 bytes of U+FFFD
    if (total > SIZE_MAX / 4 || !grow((void **)&d->buf, &d->buf_cap, need, 1))
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "detokenize: out of memory");
    // Assemble the input at the tail of buf so it is read ahead of where output is written.
    uint8_t *in = (uint8_t *)d->buf + need - total;
    memcpy(in, d->pending, (size_t)d->pending_len);
    if (len) memcpy(in + d->pending_len, piece, len);
    d->pending_len = 0;
    size_t o = 0;
    for (size_t i = 0; i < total;) {
        uint32_t cp;
        int k = tri__utf8_decode(in + i, total - i, &cp);
        if (!(cp & TRI_UTF8_INVALID)) {
            memmove(d->buf + o, in + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
            continue;
        }
        if (!final && utf8_prefix_ok(in + i, total - i)) {
            d->pending_len = (int)(total - i);
            memcpy(d->pending, in + i, total - i);
            break;
        }
        memcpy(d->buf + o, "\xef\xbf\xbd", 3);  // U+FFFD
        o += 3;
        i++;
    }
    d->buf[o] = 0;
    *out_len = o;
    return TRI_STATUS_OK;
}

tri_status tri__detok_push(tri__detok *d, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    const tri__tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "detokenize: id %d out of range [0, %d)",
                         id, t->n_vocab);
    bool special = is_special_piece(t, id);
    if (special && !d->render_special) return TRI_STATUS_OK;
    const char *p = t->dec + t->dec_off[id];
    size_t n = t->dec_len[id];
    if (!d->started && !special && t->kind == TRI_TOKENIZER_SPM && t->add_space_prefix && n &&
        p[0] == ' ') {
        p++;
        n--;
    }
    if (n) d->started = true;
    tri_status st = detok_emit(d, p, n, false, len);
    if (st == TRI_STATUS_OK) *text = d->buf;
    return st;
}

tri_status tri__detok_flush(tri__detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (!d->pending_len) return TRI_STATUS_OK;
    tri_status st = detok_emit(d, NULL, 0, true, len);
    if (st == TRI_STATUS_OK) *text = d->buf;
    return st;
}
