// test-util.h - helpers shared by the Criterion suites.
#ifndef TRI_TEST_UTIL_H
#define TRI_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

// A test's Criterion timeout of s seconds, scaled for builds that run slower by design: tests/
// meson.build sets TT_TIME_SCALE under sanitizers (x4) and on the CPU-emulated GPU (x8).
#ifndef TT_TIME_SCALE
#define TT_TIME_SCALE 1
#endif
#define TT_TIMEOUT(s) ((s) * TT_TIME_SCALE)

// Whether the build lacks the reference Python packages (tests/meson.build sets TRI_TEST_REFERENCE).
static inline bool tt_no_reference(void) {
    const char *have = getenv("TRI_TEST_REFERENCE");
    return have && strcmp(have, "0") == 0;
}

// Skips the calling test when the build has no reference Python packages, so that the fixtures
// of group (tests/fixtures/make-<group>.py) were not generated; the suite's other tests still run.
static inline void tt_need_fixtures(const char *group) {
    if (tt_no_reference())
        cr_skip_test(
            "needs the '%s' fixtures, made by the reference Python packages this build lacks "
            "(scripts/setup-python.sh installs them)",
            group);
}

// The path of a fixture written by tests/fixtures/make-<group>.py: $TRI_TEST_FIXTURES/group/name.
// Returns a static buffer, overwritten by the next call. Skips the calling test, naming the file,
// when the build has no reference Python packages to make it.
static inline const char *tt_fixture(const char *group, const char *name) {
    static char path[4096];
    if (tt_no_reference())
        cr_skip_test(
            "needs the fixture %s/%s, made by tests/fixtures/make-%s.py with the reference Python packages "
            "this build lacks (scripts/setup-python.sh installs them)",
            group, name, group);
    const char *root = getenv("TRI_TEST_FIXTURES");
    cr_assert(root != NULL, "TRI_TEST_FIXTURES is not set: run the suites through meson test");
    snprintf(path, sizeof path, "%s/%s/%s", root, group, name);
    return path;
}

// The Python with the reference packages ($TRI_TEST_PYTHON), to run script (a path under tests/);
// skips the calling test, naming script, when the build has none.
static inline const char *tt_python(const char *script) {
    const char *py = getenv("TRI_TEST_PYTHON");
    if (tt_no_reference() || !py)
        cr_skip_test(
            "needs the reference Python packages to run tests/%s, which this build lacks "
            "(scripts/setup-python.sh installs them)",
            script);
    return py;
}

// A fresh path for a scratch file under $TRI_TEST_TMP (created if missing).
static inline const char *tt_tmp(const char *name) {
    static char path[4096];
    const char *root = getenv("TRI_TEST_TMP");
    if (!root) root = "/tmp";
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", root);
    cr_assert(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/%s", root, name);
    return path;
}

// Writes a seeded model with tri-gen-model ($TRI_GEN_MODEL) and options opts as
// <tag>.gguf and the HF directory <tag>.hf under $TRI_TEST_TMP; returns the GGUF's path (a
// static buffer, overwritten by the next call). Aborts the test if the generator fails.
static inline const char *tt_gen_model(const char *tag, const char *opts) {
    static char gguf[4096];
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen, "TRI_GEN_MODEL is not set: run the suites through meson test");
    char name[160], hf[4096], cmd[16384];
    snprintf(name, sizeof name, "%s.gguf", tag);
    snprintf(gguf, sizeof gguf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "%s.hf", tag);
    snprintf(hf, sizeof hf, "%s", tt_tmp(name));
    int n = snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && '%s' %s --out-gguf '%s' --out-hf '%s' >/dev/null", gguf, hf,
                     gen, opts, gguf, hf);
    cr_assert(n > 0 && (size_t)n < sizeof cmd, "generator command too long");
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "generator failed: %s", cmd);
    return gguf;
}

// Reads a whole file; aborts the test if it cannot. The caller frees.
static inline void *tt_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n + 1);
    cr_assert(buf != NULL);
    cr_assert(fread(buf, 1, (size_t)n, f) == (size_t)n, "short read of %s", path);
    fclose(f);
    ((char *)buf)[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

// Writes bytes to a file; aborts the test if it cannot.
static inline void tt_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot create %s", path);
    cr_assert(fwrite(data, 1, len, f) == len);
    fclose(f);
}

// ---- the test kit: tests/test-kit.c, linked into every suite ----

// Tokens a generation produced (tri_generate's callback): tok[0..n), at most cap (0: TT_TOKENS_MAX).
enum { TT_TOKENS_MAX = 4096 };
typedef struct tt_tokens {
    int32_t tok[TT_TOKENS_MAX];
    int32_t n;
    int32_t cap;  // 0: TT_TOKENS_MAX
} tt_tokens;

// Appends tok to the tt_tokens user; fails the test when it holds cap tokens already.
bool tt_collect(int32_t tok, void *user);
// Appends tok to the tt_tokens user while it holds fewer than cap, drops it after.
bool tt_collect_upto(int32_t tok, void *user);

// Tokens collected into the caller's array tok (cap entries).
typedef struct tt_token_span {
    int32_t *tok;
    int32_t n, cap;
} tt_token_span;

// Appends tok to the tt_token_span user; fails the test when it holds cap tokens already.
bool tt_collect_span(int32_t tok, void *user);

// Stores tok at *cursor and advances it: user is an int32_t ** into an array with room.
bool tt_collect_cursor(int32_t tok, void *user);

// tt_gen_model with a prefix: the model written as <prefix>-<tag> (suites whose tests share tags).
const char *tt_gen_model_as(const char *prefix, const char *tag, const char *opts);

// ---- logits ----

// The index of the largest of x[0..n), the first of equals (greedy decoding's token).
int32_t tt_argmax(const float *x, int32_t n);

#endif  // TRI_TEST_UTIL_H
