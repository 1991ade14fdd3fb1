// unicode.c - UTF-8 decoding and code point classes over the generated table.
#include "unicode.h"

int tri__unicode_class(uint32_t cp) {
    if (cp < 0x80) {
        // ASCII fast path: most text is ASCII and this avoids the binary search.
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return TRI_UCLASS_LETTER;
        if (cp >= '0' && cp <= '9') return TRI_UCLASS_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return TRI_UCLASS_SPACE;
        return TRI_UCLASS_OTHER;
    }
    int32_t lo = 0, hi = tri__unicode_n_ranges - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        const tri__urange *r = &tri__unicode_ranges[mid];
        if (cp < r->first) {
            hi = mid - 1;
        } else if (cp > r->last) {
            lo = mid + 1;
        } else {
            return r->cls;
        }
    }
    return TRI_UCLASS_OTHER;
}

int tri__utf8_lead_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return 2;
    if (b >= 0xe0 && b <= 0xef) return 3;
    if (b >= 0xf0 && b <= 0xf4) return 4;
    return 0;
}

int tri__utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    uint8_t b = s[0];
    int n = tri__utf8_lead_len(b);
    if (n == 1) {
        *cp = b;
        return 1;
    }
    if (n == 0 || (size_t)n > len) goto invalid;
    uint32_t v = b & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) goto invalid;
        v = (v << 6) | (s[i] & 0x3f);
    }
    // Overlong 3- and 4-byte forms, surrogates and values past U+10FFFF (0xc0/0xc1 and leads past
    // 0xf4 were already refused by tri__utf8_lead_len).
    if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || (v >= 0xd800 && v <= 0xdfff) ||
        v > 0x10ffff)
        goto invalid;
    *cp = v;
    return n;
invalid:
    *cp = TRI_UTF8_INVALID | b;
    return 1;
}

int tri__utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}
