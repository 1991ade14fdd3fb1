// test-cli.c - offload-run as a user runs it: exit codes, messages, and that every speculative
// mode prints the same greedy tokens as plain decoding.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test-util.h"

// Runs `offload-run ARGS`, capturing stdout and stderr; returns the exit status.
static int cli(const char *args, char *out, size_t out_size, char *err, size_t err_size) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin, "TRI_OFFLOAD_RUN is not set: run through meson test");
    char o[4096], e[4096], cmd[16384];
    // Criterion runs tests in parallel processes: every scratch name carries the pid
    char name[64];
    snprintf(name, sizeof name, "cli-%d.out", (int)getpid());
    snprintf(o, sizeof o, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "cli-%d.err", (int)getpid());
    snprintf(e, sizeof e, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s' </dev/null", bin, args, o, e);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc), "%s", cmd);
    char *so = tt_read_file(o, NULL), *se = tt_read_file(e, NULL);
    snprintf(out, out_size, "%s", so);
    snprintf(err, err_size, "%s", se);
    free(so);
    free(se);
    return WEXITSTATUS(rc);
}

static char out[1 << 16], err[1 << 16];

// A tiny seeded model with a byte-level tokenizer, written once per test.
static const char *tiny_model(void) {
    static char path[4096];
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    char name[64], hf[4096], cmd[16384];
    snprintf(name, sizeof name, "cli-tiny-%d.gguf", (int)getpid());
    snprintf(path, sizeof path, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "cli-tiny-%d.hf", (int)getpid());
    snprintf(hf, sizeof hf, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "'%s' --layers 4 --seed 5 --out-gguf '%s' --out-hf '%s' >/dev/null", gen, path, hf);
    cr_assert_eq(system(cmd), 0);
    return path;
}

Test(cli, help_and_usage_errors) {
    cr_assert_eq(cli("--help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "generate") && strstr(out, "info") && strstr(out, "tokenize"));
    cr_assert_eq(cli("frobnicate", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "unknown command 'frobnicate'"), "%s", err);
    cr_assert_eq(cli("generate --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--spec MODE"));
    cr_assert_eq(cli("generate -p hi", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "-m MODEL is required"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --temp lots", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--temp 'lots'"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --spec fast", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--spec 'fast'"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --spec triforce", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(cli("generate -m x -p hi --draft-ngram 3", out, sizeof out, err, sizeof err), 2);
}

Test(cli, bad_model_files_name_the_file) {
    cr_assert_eq(cli("info -m /nonexistent/model.gguf", out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "/nonexistent/model.gguf"), "%s", err);
    char junk_name[64];
    snprintf(junk_name, sizeof junk_name, "junk-%d.gguf", (int)getpid());
    const char *junk = tt_tmp(junk_name);
    tt_write_file(junk, "GGUF\x03\x00\x00\x00garbage", 15);
    char args[8192];
    snprintf(args, sizeof args, "info -m '%s'", junk);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, junk_name), "%s", err);
    cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
}

Test(cli, info_describes_the_model) {
    const char *m = tiny_model();
    char args[8192];
    snprintf(args, sizeof args, "info -m '%s' --tensors", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "layers             4"), "%s", out);
    cr_assert(strstr(out, "byte-level-bpe"), "%s", out);
    cr_assert(strstr(out, "blk.3.ffn_down.weight"), "%s", out);
}

// Whether text has a line that starts with line and ends there or goes on after a space.
static bool has_line(const char *text, const char *line) {
    size_t n = strlen(line);
    for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == ' ' || p[n] == 0)) return true;
    return false;
}

// A sharded checkpoint as transformers lays it out (3 shards, model.safetensors.index.json),
// given as the directory and as the index file; YaRN and Llama-3 parameters on the rope line.
Test(cli, info_on_a_sharded_checkpoint) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    char name[64], gguf[4096], hf[4096], cmd[16384], args[8192];
    snprintf(name, sizeof name, "cli-shards-%d.gguf", (int)getpid());
    snprintf(gguf, sizeof gguf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "cli-shards-%d.hf", (int)getpid());
    snprintf(hf, sizeof hf, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && '%s' --shards 3 --rope-scaling yarn --rope-factor 8 --out-gguf '%s' --out-hf '%s' >/dev/null",
             hf, gen, gguf, hf);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "info -m '%s%s'", hf, i ? "/model.safetensors.index.json" : "");
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", args, err);
        // the generator's tiny shape (docs/test-models.md), orig context 512 / 8, and
        // 0.1 ln 8 + 1 = 1.2079441...
        static const char *const lines[] = {
            "format             safetensors (3 files)", "architecture       llama", "vocab              384",
            "hidden             64", "feed-forward       160", "layers             2",
            "heads              4 query, 2 key/value (GQA)", "head dim           16",
            "rope               theta 10000, half-split pairs, scaling yarn (factor 8, original context 64, "
            "beta_fast 32, beta_slow 1, mscale 1.20794 = 0.1 ln(factor) + 1)",
            "tied embeddings    no", "tokenizer          byte-level-bpe", "tensors            21",
            "types              f16: 21"};
        for (size_t j = 0; j < sizeof lines / sizeof lines[0]; j++)
            cr_assert(has_line(out, lines[j]), "%s: no line '%s' in:\n%s", args, lines[j], out);
    }
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && '%s' --shards 2 --rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 16 --out-gguf '%s' "
             "--out-hf '%s' >/dev/null",
             hf, gen, gguf, hf);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "info -m '%s'", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    const char *rope = "rope               theta 10000, half-split pairs, scaling llama3 (factor 8, original context 16, "
                       "low_freq_factor 1, high_freq_factor 4)";
    cr_assert(has_line(out, rope), "no line '%s' in:\n%s", rope, out);
    cr_assert(has_line(out, "format             safetensors (2 files)"), "%s", out);
}

// The real model: every fact that the gguf package reads in the file (tests/fixtures/info-lines.py).
Test(cli, info_on_the_real_gguf) {
    const char *model = getenv("TRI_TEST_MODEL"), *py = getenv("TRI_TEST_PYTHON");
    if (!model || !*model || !py) cr_skip_test("TRI_TEST_MODEL or TRI_TEST_PYTHON is not set");
    char name[64], want_path[4096], cmd[16384], args[8192];
    snprintf(name, sizeof name, "cli-real-%d.lines", (int)getpid());
    snprintf(want_path, sizeof want_path, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "'%s' '%s/fixtures/info-lines.py' '%s' >'%s'", py, getenv("TRI_TEST_SRC"), model,
             want_path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "info -m '%s'", model);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    char *want = tt_read_file(want_path, NULL);
    int n = 0;
    for (char *line = strtok(want, "\n"); line; line = strtok(NULL, "\n"), n++)
        cr_assert(has_line(out, line), "no line '%s' in:\n%s", line, out);
    cr_assert_geq(n, 10, "info-lines.py printed %d lines", n);
    free(want);
}

Test(cli, every_spec_mode_prints_the_plain_greedy_tokens) {
    const char *m = tiny_model();
    static char args[8192], plain[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(plain, sizeof plain, "%s", out);
    cr_assert(strlen(plain) > 24, "%s", plain);
    cr_assert(strstr(err, "generated: 24 tokens"), "%s", err);
    const char *modes[] = {"--spec draft --draft-ngram 2", "--spec draft --draft-layers 0-1",
                           "--spec retrieval", "--spec triforce --draft-layers 0,2 --gamma1 3 --gamma2 5",
                           "--spec triforce --draft-ngram 3 --stats",
                           // small caches: L1 evicts, L2 selects 2 chunks of 4, again every 4 tokens
                           "--spec draft --draft-layers 0-1 --draft-window 8 --draft-sink 2",
                           "--spec retrieval --budget 8 --chunk 4 --refresh 4",
                           "--spec triforce --draft-layers 0,2 --draft-window 8 --draft-sink 2 --budget 8 --chunk 4 "
                           "--refresh-accept 0.9 --stats"};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos %s", m,
                 modes[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", modes[i], err);
        cr_assert_str_eq(out, plain, "%s", modes[i]);
    }
    cr_assert(strstr(err, "full-cache passes") && strstr(err, "selections"), "--stats: %s", err);
}

// Plain decoding through every cache policy runs, and the parameters are checked.
Test(cli, kv_policies_for_plain_decoding) {
    const char *m = tiny_model();
    static char args[8192];
    const char *policies[] = {"--kv full", "--kv streaming --kv-budget 8 --sink 2", "--kv h2o --kv-budget 8",
                              "--kv retrieval --kv-budget 8 --kv-chunk 4 --refresh 4"};
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos %s", m,
                 policies[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", policies[i], err);
        cr_assert(strstr(err, "generated: 24 tokens"), "%s: %s", policies[i], err);
    }
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 4 --kv retrieval --kv-budget 10", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "chunk size 8 must divide the budget 10"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --kv lru", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv 'lru'"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --kv streaming --spec retrieval", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(cli("generate --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--kv POLICY") && strstr(out, "--draft-window N"), "%s", out);
}
