// tokenizer.h - SentencePiece BPE and byte-level BPE tokenizers (internal).
//
// A tokenizer is built by one of the loaders (GGUF metadata, HF tokenizer.json, SentencePiece
// tokenizer.model) and is read-only afterwards: encode and decode may run on several threads at
// once. Text is UTF-8; bytes that are not valid UTF-8 are never refused (see docs/tokenizers.md):
// each such byte is a character of its own, which byte fallback (SPM) or the byte-level map (BPE)
// encode losslessly, so decode(encode(x)) == x holds for those tokenizers on any bytes.
#ifndef TRI_TOKENIZER_H
#define TRI_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

struct tri__gguf;

// Token types; the numbers are those of GGUF's tokenizer.ggml.token_type and of SentencePiece's
// ModelProto.SentencePiece.Type.
typedef enum tri__token_type {
    TRI__TOKEN_NORMAL = 1,
    TRI__TOKEN_UNKNOWN = 2,
    TRI__TOKEN_CONTROL = 3,       // <s>, <|im_start|>: split out of text only when asked
    TRI__TOKEN_USER_DEFINED = 4,  // always split out of text as a whole
    TRI__TOKEN_UNUSED = 5,
    TRI__TOKEN_BYTE = 6,          // <0xXX> byte fallback pieces (SPM)
} tri__token_type;

// How byte-level BPE splits text into words before merging.
typedef enum tri__pretok {
    TRI__PRETOK_NONE = 0,    // SPM: no split
    TRI__PRETOK_GPT2 = 1,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    TRI__PRETOK_SMOLLM = 2,  // every \p{N} alone, then GPT2 on the rest (StarCoder, SmolLM)
    TRI__PRETOK_LLAMA3 = 3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                             //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
} tri__pretok;

typedef struct tri__tokenizer tri__tokenizer;

// ---- loading ----

// From the tokenizer.ggml.* keys. NOT_FOUND when the file has none; BAD_FORMAT for inconsistent
// arrays or ids; UNSUPPORTED for another tokenizer.ggml.model or an unknown tokenizer.ggml.pre.
tri_status tri__tokenizer_from_gguf(const struct tri__gguf *g, tri__tokenizer **out);
// From dir/tokenizer.json, else dir/tokenizer.model. NOT_FOUND when neither exists.
tri_status tri__tokenizer_from_dir(const char *dir, tri__tokenizer **out);
// Whether dir holds tokenizer.json or tokenizer.model (no error recorded either way).
bool tri__tokenizer_in_dir(const char *dir);
// One file: an HF tokenizer.json, or a SentencePiece model (tokenizer.model).
tri_status tri__tokenizer_from_json_file(const char *path, tri__tokenizer **out);
tri_status tri__tokenizer_from_json_buf(const char *buf, size_t len, const char *name,
                                        tri__tokenizer **out);
tri_status tri__tokenizer_from_spm_file(const char *path, tri__tokenizer **out);
// A serialized SentencePiece ModelProto in memory; name is used in messages.
tri_status tri__tokenizer_from_spm_buf(const uint8_t *buf, size_t len, const char *name,
                                       tri__tokenizer **out);
void tri__tokenizer_free(tri__tokenizer *t);

// ---- queries ----

tri_tokenizer_kind tri__tokenizer_kind(const tri__tokenizer *t);
tri__pretok tri__tokenizer_pretok(const tri__tokenizer *t);
int32_t tri__tokenizer_n_vocab(const tri__tokenizer *t);
int32_t tri__tokenizer_bos(const tri__tokenizer *t);  // -1 when none
int32_t tri__tokenizer_eos(const tri__tokenizer *t);  // -1 when none
int32_t tri__tokenizer_unk(const tri__tokenizer *t);  // -1 when none
bool tri__tokenizer_add_bos(const tri__tokenizer *t); // whether encode(add_special) prepends BOS
bool tri__tokenizer_add_eos(const tri__tokenizer *t);
// The vocabulary text of token id (as stored: "▁the", "Ġthe", "<0x0A>"), not NUL-terminated;
// NULL when id is out of range.
const char *tri__tokenizer_text(const tri__tokenizer *t, int32_t id, size_t *len);
tri__token_type tri__tokenizer_type(const tri__tokenizer *t, int32_t id);
// The id of a vocabulary text, or -1.
int32_t tri__tokenizer_find(const tri__tokenizer *t, const char *text, size_t len);

// ---- encoding ----

// Encodes len bytes of text into a malloc'ed array *ids of *n_ids ids (NULL when 0), which the
// caller frees. add_special: add BOS/EOS as the tokenizer's metadata says (add_bos/add_eos).
// parse_special: control tokens written in the text ("<|im_start|>") become their ids; otherwise
// they are encoded as plain text. User-defined tokens are always split out.
tri_status tri__tokenizer_encode(const tri__tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, int32_t **ids,
                                 int64_t *n_ids);

// ---- decoding ----

// The bytes token id decodes to: "▁" as a space (SPM), <0xXX> as that byte, byte-level chars
// mapped back to bytes (BPE). Control and unknown tokens decode to their text, marked *special
// so that callers skip them unless they render special tokens. NULL when id is out of range.
const char *tri__tokenizer_piece(const tri__tokenizer *t, int32_t id, size_t *len, bool *special);

// Decodes n ids into a malloc'ed buffer *out of *out_len bytes plus a NUL (the caller frees).
// Invalid ids fail with INVALID_ARGUMENT. The space an SPM tokenizer adds in front of the text is
// removed from the start of the output, as SentencePiece does.
tri_status tri__tokenizer_decode(const tri__tokenizer *t, const int32_t *ids, int64_t n,
                                 bool render_special, char **out, size_t *out_len);

// Streaming decoder: holds back the bytes of a character split across tokens until it is
// complete, so every chunk it returns is valid UTF-8. Bytes that can never complete a character
// are replaced by U+FFFD.
typedef struct tri__detok {
    const tri__tokenizer *t;
    bool render_special;
    bool started;      // a token has been pushed (for the SPM leading-space rule)
    uint8_t pending[4];// an incomplete UTF-8 sequence carried over, pending_len <= 3
    int pending_len;
    char *buf;         // output of the last push, buf_cap bytes
    size_t buf_cap;
} tri__detok;

void tri__detok_init(tri__detok *d, const tri__tokenizer *t, bool render_special);
// Decodes one token; *text/*len: the complete UTF-8 now ready (possibly empty), valid until the
// next call on d.
tri_status tri__detok_push(tri__detok *d, int32_t id, const char **text, size_t *len);
// Ends the stream: what is still pending comes out as U+FFFD.
tri_status tri__detok_flush(tri__detok *d, const char **text, size_t *len);
void tri__detok_free(tri__detok *d);

// ---- pre-tokenizer (exposed for tests) ----

// The end of the word that starts at byte pos of s[0, len), per the rules of kind. *seg_end is
// iterator state: set it to 0 before the first call on a text.
size_t tri__pretok_next(tri__pretok kind, const uint8_t *s, size_t len, size_t pos,
                        size_t *seg_end);

#endif  // TRI_TOKENIZER_H
