// test-bench-util.c - bench_read_ids (benchmarks/bench-util.h), the token-id reader of
// bench-kv-quality, bench-stream and bench-spec: the two forms the tokenizer scripts write (text,
// one id per line, scripts/tokenize-gguf.py; little-endian int32, benchmarks/tokenize-gguf.py, as
// numpy's tofile writes '<i4') give the same ids, and anything else is refused naming the file.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../benchmarks/bench-util.h"
#include "test-util.h"

static const int32_t want[] = {198, 30622, 216, 33, 39892, 0, 49151, 10, 32, 12345};
enum { N_WANT = sizeof want / sizeof *want };

static const char *path_of(const char *name) {
    static char p[4096];
    char n[128];
    snprintf(n, sizeof n, "bench-ids-%d-%s", (int)getpid(), name);
    snprintf(p, sizeof p, "%s", tt_tmp(n));
    return p;
}

// bench_read_ids on path with its stderr captured into err (cap bytes).
static int32_t *read_capturing(const char *path, int32_t n_vocab, int32_t *n, char *err, size_t cap) {
    const char *log = path_of("stderr");
    fflush(stderr);
    int saved = dup(fileno(stderr));
    cr_assert(saved >= 0 && freopen(log, "w", stderr));
    int32_t *ids = bench_read_ids(path, n_vocab, n);
    fflush(stderr);
    cr_assert(dup2(saved, fileno(stderr)) >= 0);
    close(saved);
    char *e = tt_read_file(log, NULL);
    snprintf(err, cap, "%s", e);
    free(e);
    return ids;
}

Test(bench_util, text_and_int32_ids_read_the_same) {
    // text: one per line as scripts/tokenize-gguf.py prints them (and spaces, tabs, CRLF too)
    char text[512];
    size_t k = 0;
    for (int i = 0; i < N_WANT; i++) {
        const char *fmt = i == 3 ? "%d\r\n" : i == 5 ? "%d\t " : "%d\n";
        k += (size_t)snprintf(text + k, sizeof text - k, fmt, want[i]);
    }
    char paths[2][4096];
    snprintf(paths[0], sizeof paths[0], "%s", path_of("ids.txt"));
    snprintf(paths[1], sizeof paths[1], "%s", path_of("ids.bin"));
    tt_write_file(paths[0], text, k);
    // int32: little-endian bytes, whatever the host's order
    unsigned char bin[4 * N_WANT];
    for (int i = 0; i < N_WANT; i++)
        for (int b = 0; b < 4; b++) bin[4 * i + b] = (unsigned char)((uint32_t)want[i] >> (8 * b));
    tt_write_file(paths[1], bin, sizeof bin);
    for (int f = 0; f < 2; f++) {
        int32_t n = -1;
        char err[1024];
        int32_t *ids = read_capturing(paths[f], 49152, &n, err, sizeof err);
        cr_assert(ids, "%s: %s", paths[f], err);
        cr_assert_eq(n, N_WANT, "%s", paths[f]);
        for (int i = 0; i < N_WANT; i++) cr_assert_eq(ids[i], want[i], "%s: id %d", paths[f], i);
        cr_assert_str_empty(err);
        free(ids);
    }
}

Test(bench_util, other_files_are_refused_naming_them) {
    static const struct {
        const char *name, *bytes;
        size_t len;
        const char *why;
    } cases[] = {
        {"empty", "", 0, "empty, no token ids"},
        {"blank", " \n\n", 3, "no token ids"},
        {"words", "the quick fox\n", 14, "not token ids in either form"},
        {"odd", "\x01\x00\x00\x00\x02\x00", 6, "6 bytes, not a multiple of 4"},
        {"neg", "\xff\xff\xff\xff", 4, "outside the vocabulary"},
        {"vocab", "5\n49152\n", 8, "id 1 is 49152, outside the vocabulary [0, 49152)"},
        {"huge", "99999999999999\n", 15, "past int32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", path_of(cases[i].name));
        tt_write_file(path, cases[i].bytes, cases[i].len);
        int32_t n = 7;
        char err[1024];
        int32_t *ids = read_capturing(path, 49152, &n, err, sizeof err);
        cr_assert_null(ids, "%s: read %d ids", cases[i].name, n);
        cr_assert_eq(n, 0, "%s", cases[i].name);
        cr_assert(strncmp(err, path, strlen(path)) == 0 && strstr(err, cases[i].why), "%s: %s", cases[i].name, err);
    }
    int32_t n;
    char err[1024];
    cr_assert_null(read_capturing("/nonexistent/ids.txt", 0, &n, err, sizeof err));
    cr_assert(strstr(err, "/nonexistent/ids.txt"), "%s", err);
}
