// tokenizer-impl.h - the tokenizer's fields and the builder the loaders share (internal to the
// tokenizer-*.c files).
#ifndef TRI_TOKENIZER_IMPL_H
#define TRI_TOKENIZER_IMPL_H

#include "tokenizer.h"

// One merge rule of a rank-ordered BPE: (a, b) -> result; a == -1 marks an empty hash slot.
typedef struct tri__merge {
    int32_t a, b;
    int32_t rank;    // position in the merges list; lower merges first
    int32_t result;  // id of the concatenation
} tri__merge;

struct tri__tokenizer {
    tri_tokenizer_kind kind;
    tri__pretok pretok;
    char *name;  // the source file, for messages
    int32_t n_vocab;

    // Token i is text[tok_off[i], tok_off[i] + tok_len[i]).
    char *text;
    uint64_t text_len, text_cap;
    uint64_t *tok_off;  // (n_vocab)
    uint32_t *tok_len;  // (n_vocab)
    float *score;       // (n_vocab) SPM merge priority: higher merges first
    uint8_t *type;      // (n_vocab) tri__token_type; 0 while unset during loading

    // What each token decodes to: dec[dec_off[i], dec_off[i] + dec_len[i]).
    char *dec;
    uint64_t *dec_off;  // (n_vocab)
    uint32_t *dec_len;  // (n_vocab)

    int32_t *vhash;      // open-addressing table text -> id, -1 empty; vhash_mask + 1 slots
    uint64_t vhash_mask;
    tri__merge *mhash;   // open-addressing table (a, b) -> merge; mhash_mask + 1 slots
    uint64_t mhash_mask;
    int64_t n_merges;
    bool merge_by_score; // SPM from scores: merge the adjacent pair whose text scores highest

    int32_t bos, eos, unk, pad;  // -1 when none
    bool add_bos, add_eos;
    bool add_space_prefix;       // SPM: "▁" in front of the text
    bool remove_extra_ws;        // SPM normalizer: trim and collapse runs of spaces
    bool byte_fallback;          // SPM: unknown characters become <0xXX> tokens
    bool ignore_merges;          // BPE: a word that is a token is emitted whole (Llama-3)
    bool unk_bytes;              // BPE: a byte missing from the vocabulary becomes unk (HF with
                                 // unk_token), instead of being dropped (HF without, llama.cpp)
    bool fuse_unk;               // a run of unknown symbols gives one unk (SentencePiece always;
                                 // HF's fuse_unk, which fuses within a pre-tokenized word)
    bool split_unk;              // parse_special also splits UNKNOWN tokens ("<unk>") out of the
                                 // text, as llama.cpp does (GGUF, tokenizer.model); not from a
                                 // tokenizer.json, where HF splits out added tokens only

    int32_t byte_tok[256];  // SPM: id of <0xXX>; BPE: id of the byte's mapped character; or -1

    // CONTROL and USER_DEFINED tokens (and UNKNOWN with split_unk), sorted by first byte then
    // longest first;
    // special[special_first[b], special_first[b + 1]) start with byte b.
    int32_t *special;
    int32_t n_special;
    int32_t special_first[257];
};

// ---- builder, in this order: alloc, set, index, add_merge*, finish ----

tri_status tri__tok_alloc(tri_tokenizer_kind kind, int64_t n_vocab, const char *name,
                          tri__tokenizer **out);
// Sets token id (0 <= id < n_vocab, checked); BAD_FORMAT when id was already set.
tri_status tri__tok_set(tri__tokenizer *t, int64_t id, const char *text, size_t len, float score,
                        int type);
// Fills unset ids with empty UNUSED tokens and builds the text -> id table.
tri_status tri__tok_index(tri__tokenizer *t);
// Sizes the merge table for n merges; then add each merge in rank order. BAD_FORMAT when a side
// or the concatenation is not in the vocabulary.
tri_status tri__tok_reserve_merges(tri__tokenizer *t, int64_t n);
tri_status tri__tok_add_merge(tri__tokenizer *t, const char *a, size_t alen, const char *b,
                              size_t blen);
// Checks the special ids, builds byte tokens, decoded pieces and the special-token index.
tri_status tri__tok_finish(tri__tokenizer *t);

// The GPT-2 byte-to-unicode map: the code point byte b is written as in byte-level vocabularies.
uint32_t tri__bpe_byte_to_cp(uint8_t b);

// Reads a whole regular file (at most 4 GiB) into a malloc'ed buffer plus a NUL.
tri_status tri__read_whole_file(const char *path, char **out, size_t *out_len);

#endif  // TRI_TOKENIZER_IMPL_H
