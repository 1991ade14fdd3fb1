// bench-tokenizer.c - tokenizer throughput: tokens/s and MB/s for encoding a ~500 KB text (the
// size of a 128K-token prompt), and for decoding it back. The round trip is checked first; the
// encode time is then printed against the limit (issue 3: a 500 KB text in well under 1 s). The
// exit status reports only the round trip: benchmarks print against a limit, they do not gate.
//
// usage: bench-tokenizer TOKENIZER [TEXT_FILE]
//   TOKENIZER: a .gguf file, a tokenizer.json, a tokenizer.model, or a directory holding one.
//   TEXT_FILE: the text to encode; default: 512 KiB of generated mixed text (words, numbers,
//   punctuation, newlines, accented, Cyrillic, CJK and emoji characters).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>

#include "gguf.h"
#include "tokenizer.h"

// The limit: tokenizing 500 KB (a 128K-token prompt) must take well under LIMIT_S.
#define LIMIT_BYTES 500e3
#define LIMIT_S 1.0

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static char *generated_text(size_t target, size_t *len) {
    static const char *const words[] = {
        "the", "model", "attention", "cache", "retrieval", "speculative", "decoding", "of",
        "tokens", "and", "a", "long", "context", "window", "is", "offloaded", "to", "memory",
        "GPU", "PCIe", "bandwidth", "déjà", "naïve", "Straße", "привет", "мир", "日本語",
        "中文", "😀", "🚀", "x86_64", "don't", "it's", "they'll", "(see", "below)", "—", "...",
    };
    size_t nw = sizeof words / sizeof words[0];
    char *buf = malloc(target + 64);
    if (!buf) return NULL;
    size_t n = 0;
    uint32_t x = 2024;
    while (n < target) {
        x = x * 1664525u + 1013904223u;
        uint32_t r = x >> 8;
        if (r % 11 == 0) {
            n += (size_t)snprintf(buf + n, 64, "%u", r % 100000);
        } else {
            const char *w = words[r % nw];
            size_t k = strlen(w);
            memcpy(buf + n, w, k);
            n += k;
        }
        buf[n++] = (r % 23 == 0) ? '\n' : (r % 17 == 0) ? ',' : ' ';
    }
    *len = n;
    return buf;
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat sb;
    char *buf = NULL;
    if (fstat(fileno(f), &sb) == 0 && sb.st_size > 0 && (buf = malloc((size_t)sb.st_size))) {
        *len = fread(buf, 1, (size_t)sb.st_size, f);
        if (*len != (size_t)sb.st_size) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

static void print_machine(void) {
    struct utsname u;
    char cpu[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        }
        fclose(f);
    }
    if (uname(&u) == 0) printf("machine: %s %s, %s (one thread)\n", u.sysname, u.machine, cpu);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench-tokenizer TOKENIZER [TEXT_FILE]\n");
        return 2;
    }
    const char *path = argv[1];
    tri__gguf *g = NULL;
    tri__tokenizer *t = NULL;
    tri_status st;
    struct stat sb;
    double t0 = now();
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = tri__tokenizer_from_dir(path, &t);
    } else if (ends_with(path, ".gguf")) {
        st = tri__gguf_open(path, &g);
        if (!st) st = tri__tokenizer_from_gguf(g, &t);
    } else if (ends_with(path, ".json")) {
        st = tri__tokenizer_from_json_file(path, &t);
    } else {
        st = tri__tokenizer_from_spm_file(path, &t);
    }
    if (st) {
        fprintf(stderr, "bench-tokenizer: %s\n", tri_last_error());
        return 1;
    }
    double t_load = now() - t0;
    size_t len = 0;
    char *text = argc > 2 ? read_text(argv[2], &len) : generated_text(512 * 1024, &len);
    if (!text) {
        fprintf(stderr, "bench-tokenizer: cannot read the text\n");
        return 1;
    }

    // Check first: decoding gives the text back (true for byte-level BPE, and for SPM with byte
    // fallback when the text has no leading space issue: generated text starts with a word).
    int32_t *ids;
    int64_t n;
    char *back;
    size_t blen;
    if (tri__tokenizer_encode(t, text, len, false, false, &ids, &n) ||
        tri__tokenizer_decode(t, ids, n, false, &back, &blen)) {
        fprintf(stderr, "bench-tokenizer: %s\n", tri_last_error());
        return 1;
    }
    bool same = blen == len && memcmp(back, text, len) == 0;
    free(back);
    free(ids);

    int reps = 5;
    double best_enc = 1e30, best_dec = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now();
        if (tri__tokenizer_encode(t, text, len, false, false, &ids, &n)) return 1;
        double dt = now() - t0;
        if (dt < best_enc) best_enc = dt;
        t0 = now();
        if (tri__tokenizer_decode(t, ids, n, false, &back, &blen)) return 1;
        dt = now() - t0;
        if (dt < best_dec) best_dec = dt;
        free(back);
        free(ids);
    }
    print_machine();
    printf("tokenizer: %s (%s, %d tokens), loaded in %.3f s\n", path,
           tri__tokenizer_kind(t) == TRI_TOKENIZER_SPM ? "sentencepiece-bpe" : "byte-level-bpe",
           tri__tokenizer_n_vocab(t), t_load);
    printf("text: %zu bytes -> %lld tokens (%.2f bytes/token); round trip %s\n", len,
           (long long)n, (double)len / (double)n, same ? "exact" : "NOT EXACT");
    printf("encode: %.4f s  %.0f tokens/s  %.1f MB/s (best of %d)\n", best_enc,
           (double)n / best_enc, (double)len / best_enc / 1e6, reps);
    printf("decode: %.4f s  %.0f tokens/s  %.1f MB/s\n", best_dec, (double)n / best_dec,
           (double)len / best_dec / 1e6);
    // Scaled linearly to 500 KB: the merge loop is O(n log n) per word and words are short, so
    // the rate of a text this size carries over.
    double t_limit = best_enc * LIMIT_BYTES / (double)len;
    printf("limit: 500 KB in well under %.0f s; at this rate 500 KB encodes in %.4f s = %.1f%% of "
           "it%s\n", LIMIT_S, t_limit, 100.0 * t_limit / LIMIT_S,
           t_limit < 0.1 * LIMIT_S ? " (well under)" : t_limit < LIMIT_S ? " (under, not well under)"
                                                            : " (OVER THE LIMIT)");
    free(text);
    tri__tokenizer_free(t);
    tri__gguf_close(g);
    return same ? 0 : 1;
}
