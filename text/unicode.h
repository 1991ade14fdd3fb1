// unicode.h - UTF-8 decoding and the code point classes the pre-tokenizers need (internal).
#ifndef TRI_UNICODE_H
#define TRI_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    TRI_UCLASS_OTHER = 0,
    TRI_UCLASS_LETTER = 1,  // \p{L}
    TRI_UCLASS_NUMBER = 2,  // \p{N}
    TRI_UCLASS_SPACE = 3,   // \s (White_Space)
};

typedef struct tri__urange {
    uint32_t first, last;
    uint8_t cls;
} tri__urange;

extern const char tri__unicode_version[];
extern const tri__urange tri__unicode_ranges[];
extern const int32_t tri__unicode_n_ranges;

// The class of a code point; TRI_UCLASS_OTHER for anything not in the table, including values
// past U+10FFFF (which the decoder uses for invalid bytes).
int tri__unicode_class(uint32_t cp);

// Marks a byte that is not part of a valid UTF-8 sequence: decoded as TRI_UTF8_INVALID | byte,
// one byte long, class OTHER. Callers that re-encode must copy the source bytes, not the value.
#define TRI_UTF8_INVALID 0x80000000u

// Decodes one code point of s[0, len), len >= 1, into *cp; returns its length in bytes (1..4).
// Overlong forms, surrogates, values past U+10FFFF and truncated sequences decode as one invalid
// byte (see TRI_UTF8_INVALID), so every input makes progress.
int tri__utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

// Writes the UTF-8 form of cp (< 0x110000) to out (4 bytes of room); returns its length.
int tri__utf8_encode(uint32_t cp, uint8_t *out);

// The length of the complete UTF-8 character that starts with byte b as a lead byte (2..4), 1 for
// ASCII, 0 for a byte that cannot start a character.
int tri__utf8_lead_len(uint8_t b);

#endif  // TRI_UNICODE_H
