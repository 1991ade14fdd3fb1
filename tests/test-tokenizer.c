// test-tokenizer.c - tokenizers against SentencePiece and HF tokenizers (fixtures from
// tests/fixtures/make-tokenizer.py), the SmolLM2 GGUF vocabulary when TRI_TEST_MODEL is set, and
// behaviour no reference defines: invalid UTF-8, streaming decode, broken files.
#include <json-c/json.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "model.h"
#include "test-util.h"
#include "tokenizer-impl.h"
#include "unicode.h"

// ---- helpers ----

static tri__tokenizer *load_json_fixture(const char *name) {
    tri__tokenizer *t = NULL;
    tri_status st = tri__tokenizer_from_json_file(tt_fixture("tokenizer", name), &t);
    cr_assert_eq(st, TRI_STATUS_OK, "%s: %s", name, tri_last_error());
    return t;
}

static tri__tokenizer *load_spm_fixture(void) {
    tri__tokenizer *t = NULL;
    tri_status st = tri__tokenizer_from_spm_file(tt_fixture("tokenizer", "spm.model"), &t);
    cr_assert_eq(st, TRI_STATUS_OK, "%s", tri_last_error());
    return t;
}

static json_object *load_cases(const char *path) {
    json_object *j = json_object_from_file(path);
    cr_assert(j && json_object_is_type(j, json_type_array), "cannot read %s", path);
    return j;
}

// Encodes text and compares with the ids array `key` of case c.
static void expect_ids(const tri__tokenizer *t, json_object *c, const char *key, bool add_special,
                       bool parse_special) {
    json_object *jt, *ji;
    cr_assert(json_object_object_get_ex(c, "text", &jt) && json_object_object_get_ex(c, key, &ji));
    const char *text = json_object_get_string(jt);
    size_t len = (size_t)json_object_get_string_len(jt);
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, text, len, add_special, parse_special, &ids, &n),
                 TRI_STATUS_OK);
    int64_t want_n = (int64_t)json_object_array_length(ji);
    int64_t i = 0;
    for (; i < n && i < want_n; i++)
        if (ids[i] != json_object_get_int(json_object_array_get_idx(ji, (size_t)i))) break;
    cr_assert(i == n && n == want_n,
              "%s: text '%.60s' (%zu bytes): first difference at id %lld: got %d of %lld ids, "
              "reference %d of %lld",
              key, text, len, (long long)i, i < n ? ids[i] : -1, (long long)n,
              i < want_n ? json_object_get_int(json_object_array_get_idx(ji, (size_t)i)) : -1,
              (long long)want_n);
    free(ids);
}

static void expect_roundtrip(const tri__tokenizer *t, const char *text, size_t len) {
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, text, len, false, false, &ids, &n), TRI_STATUS_OK);
    char *back;
    size_t blen;
    cr_assert_eq(tri__tokenizer_decode(t, ids, n, false, &back, &blen), TRI_STATUS_OK);
    cr_assert(blen == len && memcmp(back, text, len) == 0,
              "round trip of '%.60s' (%zu bytes) gave '%.60s' (%zu bytes)", text, len, back, blen);
    free(ids);
    free(back);
}

static void check_cases(const tri__tokenizer *t, const char *cases, bool hf, bool roundtrip) {
    json_object *j = load_cases(tt_fixture("tokenizer", cases));
    size_t n = json_object_array_length(j);
    cr_assert_gt(n, 100);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(j, i);
        expect_ids(t, c, "ids", false, false);
        if (hf) {
            expect_ids(t, c, "ids_special", false, true);
            expect_ids(t, c, "ids_add", true, true);
        }
        // The reference's own decode tells where a round trip is possible: not where a
        // character is missing from the vocabulary (unk, or a dropped byte).
        json_object *jr;
        if (roundtrip && (!json_object_object_get_ex(c, "roundtrip", &jr) ||
                          json_object_get_boolean(jr))) {
            json_object *jt;
            json_object_object_get_ex(c, "text", &jt);
            expect_roundtrip(t, json_object_get_string(jt), (size_t)json_object_get_string_len(jt));
        }
    }
    json_object_put(j);
}

// ---- SentencePiece BPE ----

Test(tokenizer, spm_model_matches_sentencepiece) {
    tri__tokenizer *t = load_spm_fixture();
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_SPM);
    cr_assert_eq(tri__tokenizer_n_vocab(t), 1200);
    cr_assert_eq(tri__tokenizer_unk(t), 0);
    cr_assert_eq(tri__tokenizer_bos(t), 1);
    cr_assert_eq(tri__tokenizer_eos(t), 2);
    check_cases(t, "spm-cases.json", false, true);
    tri__tokenizer_free(t);
}

Test(tokenizer, spm_bos_eos_and_pieces) {
    tri__tokenizer *t = load_spm_fixture();
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, "", 0, true, false, &ids, &n), TRI_STATUS_OK);
    cr_assert(n == 1 && ids[0] == 1, "empty text with add_special is just BOS");
    free(ids);
    cr_assert_eq(tri__tokenizer_encode(t, "", 0, false, false, &ids, &n), TRI_STATUS_OK);
    cr_assert_eq(n, 0);
    free(ids);
    // "<s>" in text is plain text unless parse_special; as a control token it is split out.
    cr_assert_eq(tri__tokenizer_encode(t, "a<s>b", 5, false, true, &ids, &n), TRI_STATUS_OK);
    bool found = false;
    for (int64_t i = 0; i < n; i++) found |= ids[i] == 1;
    cr_assert(found, "parse_special splits <s> out");
    free(ids);
    cr_assert_eq(tri__tokenizer_encode(t, "a<s>b", 5, false, false, &ids, &n), TRI_STATUS_OK);
    for (int64_t i = 0; i < n; i++) cr_assert_neq(ids[i], 1, "<s> as plain text");
    free(ids);
    // Byte pieces decode to their byte; control tokens are skipped unless rendered.
    int32_t seq[] = {1, tri__tokenizer_find(t, "<0x41>", 6), 2};
    cr_assert_geq(seq[1], 0);
    char *out;
    size_t len;
    cr_assert_eq(tri__tokenizer_decode(t, seq, 3, false, &out, &len), TRI_STATUS_OK);
    cr_assert_str_eq(out, "A");
    free(out);
    cr_assert_eq(tri__tokenizer_decode(t, seq, 3, true, &out, &len), TRI_STATUS_OK);
    cr_assert_str_eq(out, "<s>A</s>");
    free(out);
    tri__tokenizer_free(t);
}

static tri__tokenizer *load_gguf_fixture(const char *name, tri__gguf **g) {
    cr_assert_eq(tri__gguf_open(tt_fixture("tokenizer", name), g), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri__tokenizer *t = NULL;
    cr_assert_eq(tri__tokenizer_from_gguf(*g, &t), TRI_STATUS_OK, "%s", tri_last_error());
    return t;
}

Test(tokenizer, spm_gguf_matches_sentencepiece) {
    tri__gguf *g;
    tri__tokenizer *t = load_gguf_fixture("spm.gguf", &g);
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_SPM);
    cr_assert(tri__tokenizer_add_bos(t), "Llama-2 GGUF default: BOS");
    check_cases(t, "spm-cases.json", false, true);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

// BOS and EOS as SentencePiece adds them (encode(add_bos=True, add_eos=True)), for every text:
// a GGUF with tokenizer.ggml.add_eos_token true.
Test(tokenizer, spm_gguf_add_eos_matches_sentencepiece) {
    tri__gguf *g;
    tri__tokenizer *t = load_gguf_fixture("spm-eos.gguf", &g);
    cr_assert(tri__tokenizer_add_bos(t) && tri__tokenizer_add_eos(t));
    json_object *j = load_cases(tt_fixture("tokenizer", "spm-cases.json"));
    for (size_t i = 0; i < json_object_array_length(j); i++) {
        json_object *c = json_object_array_get_idx(j, i);
        expect_ids(t, c, "ids_add", true, false);
        expect_ids(t, c, "ids", false, false);
    }
    json_object_put(j);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

// Without byte fallback a character no piece covers is <unk>, and SentencePiece gives one <unk>
// for a run of them ("☃☃☃" -> one id).
Test(tokenizer, spm_without_byte_fallback_fuses_unknowns_as_sentencepiece) {
    tri__tokenizer *t = NULL;
    cr_assert_eq(tri__tokenizer_from_spm_file(tt_fixture("tokenizer", "spm-nobf.model"), &t),
                 TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(!t->byte_fallback && t->fuse_unk);
    check_cases(t, "spm-nobf-cases.json", false, true);
    tri__tokenizer_free(t);
    tri__gguf *g;
    t = load_gguf_fixture("spm-nobf.gguf", &g);
    cr_assert(!t->byte_fallback);
    check_cases(t, "spm-nobf-cases.json", false, true);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

// HF fuses a run of unknowns only with the model's fuse_unk.
Test(tokenizer, spm_tokenizer_json_fuse_unk_matches_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("spm-nobf-hf.json");
    cr_assert(t->fuse_unk);
    check_cases(t, "spm-nobf-hf-cases.json", true, true);
    check_cases(t, "spm-nobf-cases.json", false, false);  // and SentencePiece's ids
    tri__tokenizer_free(t);
    t = load_json_fixture("spm-nobf-hf-nofuse.json");
    cr_assert(!t->fuse_unk);
    check_cases(t, "spm-nobf-hf-nofuse-cases.json", true, true);
    tri__tokenizer_free(t);
}

Test(tokenizer, spm_tokenizer_json_matches_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("spm-hf.json");
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_SPM);
    cr_assert(!t->merge_by_score, "converted tokenizers merge by rank");
    // BOS from the "<s> $A" post-processor, as a real Llama-2 tokenizer.json; no EOS. The cases'
    // ids_add are HF's encode(add_special_tokens=True).
    cr_assert(tri__tokenizer_add_bos(t) && !tri__tokenizer_add_eos(t));
    cr_assert_eq(tri__tokenizer_bos(t), 1);
    check_cases(t, "spm-hf-cases.json", true, true);
    // The same vocabulary from tokenizer.model gives SentencePiece's ids too.
    check_cases(t, "spm-cases.json", false, false);
    tri__tokenizer_free(t);
}

// With parse_special, llama.cpp splits out of the text the tokens of type CONTROL, USER_DEFINED
// and UNKNOWN (its special-token cache; without parse_special only USER_DEFINED). So a Llama-2
// GGUF (and tokenizer.model, the same vocabulary) splits out "<unk>" as well as "<s>" and "</s>",
// which is what HF does with the converted tokenizer.json, where all three are added special
// tokens: HF's ids_special and ids_add (BOS in front) are the independent reference. Texts with
// "<unk>" ("a<unk>b <unk>") are among the cases.
Test(tokenizer, spm_parse_special_splits_unknown_as_llama_cpp) {
    const char *text = "a<unk>b <unk>";
    json_object *want = NULL;
    json_object *j = load_cases(tt_fixture("tokenizer", "spm-hf-cases.json"));
    for (size_t i = 0; i < json_object_array_length(j); i++) {
        json_object *c = json_object_array_get_idx(j, i), *jt;
        if (json_object_object_get_ex(c, "text", &jt) && strcmp(json_object_get_string(jt), text) == 0)
            want = c;
    }
    cr_assert(want, "the cases hold '%s'", text);
    tri__gguf *g;
    tri__tokenizer *t = load_gguf_fixture("spm.gguf", &g);
    cr_assert(t->split_unk);
    expect_ids(t, want, "ids_special", false, true);  // <unk> split out: id 0 twice
    expect_ids(t, want, "ids", false, false);         // as text
    check_cases(t, "spm-hf-cases.json", true, false);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
    t = load_spm_fixture();
    check_cases(t, "spm-hf-cases.json", true, false);
    tri__tokenizer_free(t);
    t = load_gguf_fixture("spm-nobf.gguf", &g);
    check_cases(t, "spm-nobf-hf-cases.json", true, false);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
    json_object_put(j);
}

// From a tokenizer.json, HF splits out added tokens only: an unk_token that is not one stays
// text even with special parsing (cases from HF tokenizers), while the converted file that adds
// "<unk>" splits it out (spm_tokenizer_json_matches_hf_tokenizers).
Test(tokenizer, tokenizer_json_unk_not_added_stays_text_as_hf) {
    tri__tokenizer *t = load_json_fixture("spm-hf-unkplain.json");
    cr_assert(!t->split_unk);
    cr_assert_eq(tri__tokenizer_unk(t), 0);
    cr_assert_eq(tri__tokenizer_type(t, 0), TRI__TOKEN_UNKNOWN);
    check_cases(t, "spm-hf-unkplain-cases.json", true, true);
    tri__tokenizer_free(t);
}

// ---- byte-level BPE ----

Test(tokenizer, bpe_llama3_gguf_matches_hf_tokenizers) {
    tri__gguf *g;
    tri__tokenizer *t = load_gguf_fixture("bpe-llama3.gguf", &g);
    cr_assert_eq(tri__tokenizer_pretok(t), TRI__PRETOK_LLAMA3);
    check_cases(t, "bpe-llama3-cases.json", true, true);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

Test(tokenizer, gguf_without_tokenizer_is_not_found) {
    tri__gguf *g;
    cr_assert_eq(tri__gguf_open(tt_fixture("tokenizer", "no-tokenizer.gguf"), &g), TRI_STATUS_OK,
                 "%s", tri_last_error());
    tri__tokenizer *t = NULL;
    cr_assert_eq(tri__tokenizer_from_gguf(g, &t), TRI_STATUS_NOT_FOUND);
    cr_assert_null(t);
    cr_assert(strstr(tri_last_error(), "no-tokenizer.gguf"), "message names the file");
    tri__gguf_close(g);
}

Test(tokenizer, bpe_gpt2_matches_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("bpe-gpt2.json");
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_BPE);
    cr_assert_eq(tri__tokenizer_pretok(t), TRI__PRETOK_GPT2);
    // No round trip: bytes never seen in training are not in this vocabulary and are dropped.
    check_cases(t, "bpe-gpt2-cases.json", true, false);
    tri__tokenizer_free(t);
}

// A byte missing from the vocabulary: unk when tokenizer.json sets unk_token (one unk per run
// within a word with fuse_unk), dropped otherwise; a GGUF's unknown_token_id does not make it
// unk (llama.cpp drops it, as HF without unk_token does, so the gpt2 cases apply).
Test(tokenizer, bpe_missing_bytes_match_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("bpe-gpt2-unk.json");
    cr_assert(t->unk_bytes && !t->fuse_unk);
    check_cases(t, "bpe-gpt2-unk-cases.json", true, false);
    tri__tokenizer_free(t);
    t = load_json_fixture("bpe-gpt2-unkfuse.json");
    cr_assert(t->unk_bytes && t->fuse_unk);
    check_cases(t, "bpe-gpt2-unkfuse-cases.json", true, false);
    tri__tokenizer_free(t);
    tri__gguf *g;
    t = load_gguf_fixture("bpe-gpt2-unk.gguf", &g);
    cr_assert_geq(tri__tokenizer_unk(t), 0);
    cr_assert(!t->unk_bytes);
    check_cases(t, "bpe-gpt2-cases.json", true, false);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

Test(tokenizer, bpe_merges_as_strings_and_as_pairs_agree) {
    tri__tokenizer *t = load_json_fixture("bpe-gpt2-strmerges.json");
    check_cases(t, "bpe-gpt2-cases.json", true, false);
    tri__tokenizer_free(t);
}

Test(tokenizer, bpe_smollm_matches_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("bpe-smollm.json");
    cr_assert_eq(tri__tokenizer_pretok(t), TRI__PRETOK_SMOLLM);
    check_cases(t, "bpe-smollm-cases.json", true, true);
    tri__tokenizer_free(t);
}

Test(tokenizer, bpe_llama3_matches_hf_tokenizers) {
    tri__tokenizer *t = load_json_fixture("bpe-llama3.json");
    cr_assert_eq(tri__tokenizer_pretok(t), TRI__PRETOK_LLAMA3);
    cr_assert(tri__tokenizer_add_bos(t), "BOS from the TemplateProcessing post-processor");
    check_cases(t, "bpe-llama3-cases.json", true, true);
    tri__tokenizer_free(t);
}

// Splits of the pre-tokenizers on hand-checked strings, independent of any vocabulary.
static void expect_split(tri__pretok kind, const char *text, const char *const *want) {
    size_t len = strlen(text), seg = 0, p = 0;
    int i = 0;
    while (p < len) {
        size_t q = tri__pretok_next(kind, (const uint8_t *)text, len, p, &seg);
        cr_assert(want[i], "'%s': more words than expected at byte %zu", text, p);
        cr_assert(q - p == strlen(want[i]) && memcmp(text + p, want[i], q - p) == 0,
                  "'%s': word %d is '%.*s', want '%s'", text, i, (int)(q - p), text + p, want[i]);
        p = q;
        i++;
    }
    cr_assert(!want[i], "'%s': fewer words than expected", text);
}

Test(tokenizer, pretokenizer_splits) {
    expect_split(TRI__PRETOK_GPT2, "Hello  world's 123\n\nx",
                 (const char *const[]){"Hello", " ", " world", "'s", " 123", "\n", "\n", "x",
                                       NULL});
    expect_split(TRI__PRETOK_SMOLLM, "ab 123  ",
                 (const char *const[]){"ab", " ", "1", "2", "3", "  ", NULL});
    expect_split(TRI__PRETOK_LLAMA3, "I'M 12345 a\n\n  b!?\n",
                 (const char *const[]){"I", "'M", " ", "123", "45", " a", "\n\n", " ", " b",
                                       "!?\n", NULL});
}

// ---- invalid UTF-8, streaming ----

static const char bad_utf8[] = "ok \xff\xfe mid \xc3 x \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 "
                               "\xc0\xaf end \xf0\x9f\x98";

Test(tokenizer, invalid_utf8_is_encoded_losslessly) {
    tri__tokenizer *ts[] = {load_spm_fixture(), load_json_fixture("bpe-smollm.json"),
                            load_json_fixture("bpe-llama3.json")};
    for (int i = 0; i < 3; i++) {
        expect_roundtrip(ts[i], bad_utf8, sizeof bad_utf8 - 1);
        tri__tokenizer_free(ts[i]);
    }
    tri__tokenizer *t = load_json_fixture("bpe-gpt2.json");
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, bad_utf8, sizeof bad_utf8 - 1, false, false, &ids, &n),
                 TRI_STATUS_OK, "bytes missing from the vocabulary are dropped, not an error");
    free(ids);
    tri__tokenizer_free(t);
}

static bool valid_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)tri__utf8_decode((const uint8_t *)s + i, len - i, &cp);
        if (cp & TRI_UTF8_INVALID) return false;
    }
    return true;
}

Test(tokenizer, streaming_decode_holds_back_split_characters) {
    tri__tokenizer *t = load_json_fixture("bpe-smollm.json");
    const char text[] = "emoji 👍🏽 😀🚀 𝔘𝔫𝔦 日本語 done";
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, text, sizeof text - 1, false, false, &ids, &n),
                 TRI_STATUS_OK);
    tri__detok d;
    tri__detok_init(&d, t, false);
    char all[256] = {0};
    size_t used = 0;
    bool held_back = false;
    for (int64_t i = 0; i < n; i++) {
        const char *chunk;
        size_t len;
        cr_assert_eq(tri__detok_push(&d, ids[i], &chunk, &len), TRI_STATUS_OK);
        cr_assert(valid_utf8(chunk, len), "chunk %lld is not valid UTF-8", (long long)i);
        if (len == 0) held_back = true;
        cr_assert_lt(used + len, sizeof all);
        memcpy(all + used, chunk, len);
        used += len;
    }
    cr_assert(held_back, "some character of the text spans tokens in this small vocabulary");
    const char *chunk;
    size_t len;
    cr_assert_eq(tri__detok_flush(&d, &chunk, &len), TRI_STATUS_OK);
    cr_assert_eq(len, 0);
    cr_assert(used == sizeof text - 1 && memcmp(all, text, used) == 0, "got '%s'", all);
    tri__detok_free(&d);
    free(ids);
    tri__tokenizer_free(t);
}

Test(tokenizer, streaming_decode_byte_pieces) {
    tri__tokenizer *t = load_spm_fixture();
    int32_t b[256];
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b[i] = tri__tokenizer_find(t, name, 6);
        cr_assert_geq(b[i], 0);
    }
    tri__detok d;
    tri__detok_init(&d, t, false);
    const char *s;
    size_t len;
    // U+1F600 in four byte tokens: nothing until the last.
    uint8_t smile[] = {0xf0, 0x9f, 0x98, 0x80};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tri__detok_push(&d, b[smile[i]], &s, &len), TRI_STATUS_OK);
        cr_assert_eq(len, 0);
    }
    cr_assert_eq(tri__detok_push(&d, b[smile[3]], &s, &len), TRI_STATUS_OK);
    cr_assert(len == 4 && memcmp(s, smile, 4) == 0);
    // A byte that starts no character, and a lead byte followed by ASCII: U+FFFD each.
    cr_assert_eq(tri__detok_push(&d, b[0xff], &s, &len), TRI_STATUS_OK);
    cr_assert(len == 3 && memcmp(s, "\xef\xbf\xbd", 3) == 0);
    cr_assert_eq(tri__detok_push(&d, b[0xe2], &s, &len), TRI_STATUS_OK);
    cr_assert_eq(len, 0);
    cr_assert_eq(tri__detok_push(&d, b['A'], &s, &len), TRI_STATUS_OK);
    cr_assert(len == 4 && memcmp(s, "\xef\xbf\xbd" "A", 4) == 0);
    // A truncated character at the end of the stream.
    cr_assert_eq(tri__detok_push(&d, b[0xf0], &s, &len), TRI_STATUS_OK);
    cr_assert_eq(len, 0);
    cr_assert_eq(tri__detok_flush(&d, &s, &len), TRI_STATUS_OK);
    cr_assert(len == 3 && memcmp(s, "\xef\xbf\xbd", 3) == 0);
    cr_assert_eq(tri__detok_push(&d, -1, &s, &len), TRI_STATUS_INVALID_ARGUMENT);
    tri__detok_free(&d);
    tri__tokenizer_free(t);
}

// ---- public API over a model ----

Test(tokenizer, public_api) {
    tri_model m = {0};
    m.path = "test-model";
    int64_t n;
    cr_assert_eq(tri_tokenize(&m, "x", 1, false, false, NULL, 0, &n), TRI_STATUS_NOT_FOUND);
    m.tokenizer = load_json_fixture("bpe-llama3.json");
    const char text[] = "<|im_start|>Hello world 123";
    cr_assert_eq(tri_tokenize(&m, text, sizeof text - 1, true, true, NULL, 0, &n), TRI_STATUS_OK);
    cr_assert_gt(n, 3);
    int32_t ids[64];
    int64_t n2;
    cr_assert_eq(tri_tokenize(&m, text, sizeof text - 1, true, true, ids, 2, &n2),
                 TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(n2, n, "the needed count is reported");
    cr_assert_eq(tri_tokenize(&m, text, sizeof text - 1, true, true, ids, 64, &n2), TRI_STATUS_OK);
    cr_assert_eq(n2, n);
    cr_assert_eq(ids[0], tri_token_bos(&m));
    cr_assert(tri_token_is_special(&m, ids[1]));
    const char *piece;
    size_t plen;
    cr_assert_eq(tri_token_text(&m, ids[1], &piece, &plen), TRI_STATUS_OK);
    cr_assert(plen == 12 && memcmp(piece, "<|im_start|>", 12) == 0);
    cr_assert_eq(tri_token_text(&m, tri_token_count(&m), &piece, &plen),
                 TRI_STATUS_INVALID_ARGUMENT);
    // Decoded bytes of one token: "Ġ" is the space byte, a special token its text.
    cr_assert_eq(tri_token_piece(&m, tri__tokenizer_find(m.tokenizer, "\xc4\xa0", 2), &piece,
                                 &plen), TRI_STATUS_OK);
    cr_assert(plen == 1 && piece[0] == ' ');
    cr_assert_eq(tri_token_piece(&m, ids[1], &piece, &plen), TRI_STATUS_OK);
    cr_assert(plen == 12 && memcmp(piece, "<|im_start|>", 12) == 0);
    cr_assert_eq(tri_token_piece(&m, -1, &piece, &plen), TRI_STATUS_INVALID_ARGUMENT);
    char buf[128];
    size_t len;
    cr_assert_eq(tri_detokenize(&m, ids, n, false, buf, sizeof buf, &len), TRI_STATUS_OK);
    cr_assert_str_eq(buf, "Hello world 123");
    cr_assert_eq(tri_detokenize(&m, ids, n, true, buf, sizeof buf, &len), TRI_STATUS_OK);
    cr_assert_str_eq(buf, "<|endoftext|><|im_start|>Hello world 123");
    cr_assert_eq(tri_detokenize(&m, ids, n, true, buf, 5, &len), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(len, strlen("<|endoftext|><|im_start|>Hello world 123"));
    tri_detokenizer *d;
    cr_assert_eq(tri_detokenizer_create(&m, false, &d), TRI_STATUS_OK);
    char all[128] = {0};
    for (int64_t i = 0; i < n; i++) {
        const char *s;
        cr_assert_eq(tri_detokenizer_push(d, ids[i], &s, &len), TRI_STATUS_OK);
        strncat(all, s, len);
    }
    cr_assert_str_eq(all, "Hello world 123");
    tri_detokenizer_free(d);
    tri_detokenizer_free(NULL);
    tri__tokenizer_free(m.tokenizer);
}

// ---- broken and unsupported files ----

Test(tokenizer, truncated_and_corrupted_spm_model_never_crash) {
    size_t len;
    uint8_t *buf = tt_read_file(tt_fixture("tokenizer", "spm.model"), &len);
    for (size_t cut = 0; cut < len; cut += (cut < 256 ? 1 : 97)) {
        tri__tokenizer *t = NULL;
        tri_status st = tri__tokenizer_from_spm_buf(buf, cut, "cut.model", &t);
        cr_assert(st == TRI_STATUS_OK || st == TRI_STATUS_BAD_FORMAT ||
                      st == TRI_STATUS_UNSUPPORTED, "cut at %zu: status %d", cut, st);
        cr_assert((st == TRI_STATUS_OK) == (t != NULL));
        tri__tokenizer_free(t);
    }
    uint32_t x = 12345;
    for (int i = 0; i < 300; i++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        for (int k = 0; k < 4; k++) {
            x = x * 1103515245u + 12345u;
            copy[(x >> 8) % len] = (uint8_t)(x >> 24);
        }
        tri__tokenizer *t = NULL;
        if (tri__tokenizer_from_spm_buf(copy, len, "bad.model", &t) == TRI_STATUS_OK) {
            int32_t *ids;
            int64_t n;
            cr_assert_eq(tri__tokenizer_encode(t, "hello world", 11, true, true, &ids, &n),
                         TRI_STATUS_OK);
            free(ids);
        }
        tri__tokenizer_free(t);
        free(copy);
    }
    free(buf);
}

static tri_status load_json_string(const char *json) {
    tri__tokenizer *t = NULL;
    tri_status st = tri__tokenizer_from_json_buf(json, strlen(json), "t.json", &t);
    tri__tokenizer_free(t);
    return st;
}

Test(tokenizer, bad_tokenizer_json) {
    cr_assert_eq(load_json_string("{"), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(load_json_string("[]"), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(load_json_string("{\"model\": {\"type\": \"Unigram\"}}"), TRI_STATUS_UNSUPPORTED);
    const char *ok_head = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "
                          "\"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": ";
    char buf[512];
    snprintf(buf, sizeof buf, "%s[\"a b\"]}}", ok_head);
    cr_assert_eq(load_json_string(buf), TRI_STATUS_OK);
    snprintf(buf, sizeof buf, "%s[\"a c\"]}}", ok_head);
    cr_assert_eq(load_json_string(buf), TRI_STATUS_BAD_FORMAT, "merge of an unknown token");
    snprintf(buf, sizeof buf, "%s[\"b a\"]}}", ok_head);
    cr_assert_eq(load_json_string(buf), TRI_STATUS_BAD_FORMAT, "merge result not in vocab");
    snprintf(buf, sizeof buf, "%s[\"ab\"]}}", ok_head);
    cr_assert_eq(load_json_string(buf), TRI_STATUS_BAD_FORMAT, "merge without a space");
    snprintf(buf, sizeof buf, "%s[[\"a\", 3]]}}", ok_head);
    cr_assert_eq(load_json_string(buf), TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(load_json_string("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
                                  "{\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}"),
                 TRI_STATUS_BAD_FORMAT);
    cr_assert_eq(load_json_string("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": "
                                  "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}"),
                 TRI_STATUS_UNSUPPORTED);
    cr_assert_eq(load_json_string("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
                                  "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, "
                                  "\"merges\": []}}"),
                 TRI_STATUS_BAD_FORMAT, "two texts for one id");
    // A sparse id (found by the fuzzer: 2.6 GB asked for by a 1.7 KB file) is refused; a few
    // holes, as real vocabularies have, are not.
    cr_assert_eq(load_json_string("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
                                  "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 133333332}, "
                                  "\"merges\": []}}"),
                 TRI_STATUS_BAD_FORMAT, "sparse ids");
    cr_assert_eq(load_json_string("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
                                  "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 200}, "
                                  "\"merges\": []}}"),
                 TRI_STATUS_OK, "a few holes");
}

Test(tokenizer, from_dir) {
    tri__tokenizer *t = NULL;
    const char *dir = tt_tmp("tok-empty-dir");
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(tri__tokenizer_from_dir(dir, &t), TRI_STATUS_NOT_FOUND);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.model'", tt_fixture("tokenizer", "spm.model"),
             dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(tri__tokenizer_from_dir(dir, &t), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_SPM);
    tri__tokenizer_free(t);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.json'",
             tt_fixture("tokenizer", "bpe-smollm.json"), dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(tri__tokenizer_from_dir(dir, &t), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_BPE, "tokenizer.json wins");
    tri__tokenizer_free(t);
}

// ---- speed: no quadratic merge loop ----

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(tokenizer, long_words_are_not_quadratic) {
    // One 256 KB word of a repeated pattern: a quadratic merge loop takes minutes on this.
    size_t len = 256 * 1024;
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++) text[i] = "kalorianthe"[i % 11];
    tri__tokenizer *ts[] = {load_spm_fixture(), load_json_fixture("bpe-llama3.json")};
    for (int k = 0; k < 2; k++) {
        double t0 = now_s();
        int32_t *ids;
        int64_t n;
        cr_assert_eq(tri__tokenizer_encode(ts[k], text, len, false, false, &ids, &n),
                     TRI_STATUS_OK);
        double dt = now_s() - t0;
        cr_assert_lt(dt, 5.0, "256 KB word took %.2f s", dt);
        cr_assert_gt(n, 1000);
        free(ids);
        tri__tokenizer_free(ts[k]);
    }
    free(text);
}

// ---- the SmolLM2 vocabulary from its GGUF, against HF tokenizers ----

Test(tokenizer, smollm2_gguf_matches_hf_tokenizers) {
    const char *model = getenv("TRI_TEST_MODEL");
    if (!model || !*model) cr_skip_test("TRI_TEST_MODEL is not set");
    const char *py = tt_python("fixtures/make-tokenizer.py");
    char cases[4096];
    snprintf(cases, sizeof cases, "%s", tt_tmp("smollm2-cases.json"));
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' '%s/fixtures/make-tokenizer.py' --smollm '%s' '%s'", py,
             getenv("TRI_TEST_SRC"), model, cases);
    cr_assert_eq(system(cmd), 0, "reference failed: %s", cmd);
    tri__gguf *g;
    cr_assert_eq(tri__gguf_open(model, &g), TRI_STATUS_OK, "%s", tri_last_error());
    tri__tokenizer *t;
    cr_assert_eq(tri__tokenizer_from_gguf(g, &t), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_BPE);
    cr_assert_eq(tri__tokenizer_pretok(t), TRI__PRETOK_SMOLLM);
    cr_assert_eq(tri__tokenizer_n_vocab(t), 49152);
    cr_assert(!tri__tokenizer_add_bos(t), "SmolLM2 adds no BOS");
    json_object *j = load_cases(cases);
    for (size_t i = 0; i < json_object_array_length(j); i++) {
        json_object *c = json_object_array_get_idx(j, i), *jt, *jr;
        expect_ids(t, c, "ids", false, false);
        expect_ids(t, c, "ids_special", false, true);
        json_object_object_get_ex(c, "text", &jt);
        // Not where the text has a byte the vocabulary lacks (control bytes 0x04, 0x13 ...).
        if (json_object_object_get_ex(c, "roundtrip", &jr) && json_object_get_boolean(jr))
            expect_roundtrip(t, json_object_get_string(jt),
                             (size_t)json_object_get_string_len(jt));
    }
    json_object_put(j);
    // Invalid UTF-8 has no HF reference; 0xff is missing from this vocabulary and dropped (the
    // GGUF's unknown_token_id 0 is <|endoftext|>, not an unk to insert), 0xc3 is "Ã".
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, "a\xff" "b\xc3", 4, false, false, &ids, &n),
                 TRI_STATUS_OK);
    int32_t want[] = {tri__tokenizer_find(t, "a", 1), tri__tokenizer_find(t, "b", 1),
                      tri__tokenizer_find(t, "\xc3\x83", 2)};
    cr_assert(n == 3 && ids[0] == want[0] && ids[1] == want[1] && ids[2] == want[2],
              "got %lld ids: %d %d %d ...", (long long)n, ids[0], n > 1 ? ids[1] : -1,
              n > 2 ? ids[2] : -1);
    free(ids);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
}

// ---- the fuzz seeds: small hand-written files of each supported shape ----

static tri__tokenizer *load_seed(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/fuzz/corpus-tokenizer-json/%s", getenv("TRI_TEST_SRC"), name);
    tri__tokenizer *t = NULL;
    cr_assert_eq(tri__tokenizer_from_json_file(path, &t), TRI_STATUS_OK, "%s: %s", name,
                 tri_last_error());
    return t;
}

static void expect_encode(const tri__tokenizer *t, const char *text, bool add, bool special,
                          const int32_t *want, int64_t n_want) {
    int32_t *ids;
    int64_t n;
    cr_assert_eq(tri__tokenizer_encode(t, text, strlen(text), add, special, &ids, &n),
                 TRI_STATUS_OK);
    cr_assert_eq(n, n_want, "'%s': %lld ids, want %lld", text, (long long)n, (long long)n_want);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "'%s': id %lld", text, (long long)i);
    free(ids);
}

Test(tokenizer, fuzz_seeds_load_and_encode_by_hand) {
    tri__tokenizer *t = load_seed("gpt2.json");
    // "Hello w": H e l l o -> He ll -> Hell + o; " w" -> Ġw. BOS from the template.
    expect_encode(t, "Hello w", true, true, (const int32_t[]){7, 8, 3, 9}, 4);
    expect_encode(t, "<|im_start|>", false, true, (const int32_t[]){7}, 1);
    tri__tokenizer_free(t);
    t = load_seed("smollm.json");
    expect_encode(t, "ab12 ab", false, false, (const int32_t[]){4, 0, 1, 6}, 4);
    tri__tokenizer_free(t);
    t = load_seed("llama3.json");
    cr_assert(t->ignore_merges);
    expect_encode(t, "xy\n\n", false, false, (const int32_t[]){2, 4}, 2);
    tri__tokenizer_free(t);
    // SentencePiece-style tokenizer.json: "▁" prefix, merges by rank, byte fallback for "A".
    t = load_seed("spm.json");
    cr_assert_eq(tri__tokenizer_kind(t), TRI_TOKENIZER_SPM);
    expect_encode(t, "a A", true, false, (const int32_t[]){5, 3, 2}, 3);
    cr_assert_eq(tri__tokenizer_bos(t), 1);
    cr_assert(!tri__tokenizer_add_bos(t), "no post-processor: no BOS, as in HF");
    tri__tokenizer_free(t);
}
