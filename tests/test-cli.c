// test-cli.c - offload-run as a user runs it: exit codes, messages, that every speculative
// mode prints the same greedy tokens as plain decoding, and that tokenize prints HF tokenizers'
// ids (fixtures from tests/fixtures/make-tokenizer.py).
#include <fcntl.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdbool.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chunk-index.h"
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

// Each sampling option's default in the helps is the one the command uses: chat's are the API's
// chat settings (its repeat penalty was shown as 1 where chat uses 1.1: issue 41), generate's
// greedy ones.
Test(cli, help_gives_the_sampling_defaults_in_use) {
    const tri_sampler_params c = tri_sampler_chat_params();
    char want[128];
    cr_assert_eq(cli("chat --help", out, sizeof out, err, sizeof err), 0);
    snprintf(want, sizeof want, "(1: off; default %g)", (double)c.repeat_penalty);
    cr_assert(strstr(out, want), "chat --help lacks '%s':\n%s", want, out);
    snprintf(want, sizeof want, "0 is greedy (default %g)", (double)c.temperature);
    cr_assert(strstr(out, want), "chat --help lacks '%s'", want);
    snprintf(want, sizeof want, "(0: all; default %d)", c.top_k);
    cr_assert(strstr(out, want), "chat --help lacks '%s'", want);
    cr_assert_eq(cli("generate --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "(1: off; default 1)") && strstr(out, "0 is greedy (default 0)"), "%s", out);
    snprintf(want, sizeof want, "repeat-penalty %g over the last 64 tokens", (double)c.repeat_penalty);
    cr_assert(strstr(out, want), "generate --help lacks '%s'", want);
}

// scripts/get-model.sh prints an absolute path, which works from any directory (it printed
// models/..., true only from the repository's root: issue 41). Run where the model is already
// fetched (nothing is downloaded here).
Test(cli, get_model_prints_an_absolute_path) {
    const char *src = getenv("TRI_TEST_SRC");
    cr_assert(src, "TRI_TEST_SRC is not set: run through meson test");
    char script[4096], model[4200], cmd[16384];
    snprintf(script, sizeof script, "%s/../scripts/get-model.sh", src);
    snprintf(model, sizeof model, "%s/../models/SmolLM2-135M-Instruct.Q4_1.gguf", src);
    struct stat sb;
    if (stat(model, &sb) != 0 || sb.st_size == 0) cr_skip_test("the model is not fetched (scripts/get-model.sh)");
    snprintf(cmd, sizeof cmd, "cd / && '%s'", script);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char line[4096] = {0};
    cr_assert(fgets(line, sizeof line, p));
    cr_assert_eq(pclose(p), 0);
    line[strcspn(line, "\n")] = 0;
    cr_assert(line[0] == '/', "get-model.sh printed '%s'", line);
    cr_assert(stat(line, &sb) == 0 && sb.st_size > 1000000, "'%s' is not the model", line);
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
                           "--refresh-accept 0.9 --stats",
                           // token trees
                           "--spec retrieval --budget 8 --chunk 4 --tree-nodes 12 --stats",
                           "--spec triforce --draft-layers 0 --budget 8 --chunk 4 --tree-nodes 40 --stats"};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos %s", m,
                 modes[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", modes[i], err);
        cr_assert_str_eq(out, plain, "%s", modes[i]);
    }
    cr_assert(strstr(err, "full-cache passes") && strstr(err, "selections") && strstr(err, "token trees:"),
              "--stats: %s", err);
    // plain decoding (--spec none, the default) prints its own figures
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --spec none --stats",
             m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, plain);
    cr_assert(strstr(err, "plain decoding: 24 tokens in 24 full-cache passes (1.00 tokens per pass)") &&
                  strstr(err, "time: decode"),
              "--spec none --stats: %s", err);
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
    // the defaults work for any context: here prompt + 4 = 20 positions, not a multiple of the
    // chunk of 8, and no longer than the default budget, so nothing is evicted
    for (size_t i = 1; i < sizeof policies / sizeof policies[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 4 --ids --ignore-eos --kv %s", m,
                 i == 1 ? "streaming" : i == 2 ? "h2o" : "retrieval");
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", args, err);
        cr_assert(strstr(err, "generated: 4 tokens"), "%s: %s", args, err);
    }
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 4 --kv retrieval --kv-budget 10", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "chunk size 8 must divide the budget 10"), "%s", err);
    cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
    cr_assert_eq(cli("generate -m x -p hi --kv lru", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv 'lru'"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --kv streaming --spec retrieval", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(cli("generate --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--kv POLICY") && strstr(out, "--draft-window N"), "%s", out);
}

// Devices, the offloaded KV cache, streamed weights and the planner: the same greedy tokens, and
// clear errors.
Test(cli, devices_offload_and_placement) {
    const char *m = tiny_model();
    static char args[8192], plain[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ids --ignore-eos --device cpu", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "device: cpu"), "%s", err);
    snprintf(plain, sizeof plain, "%s", out);
    const char *ways[] = {"--kv-offload 1", "--kv-offload 3", "--kv-offload 4 --batch 3",
                          "--kv-offload 3 --stream-weights 2",  // streaming is ignored on the CPU
                          "--weights-from-disk 1", "--stream-weights 3 --weights-from-disk 2",  // so is the disk
                          "--spec triforce --draft-layers 0,2 --kv-offload 3 --budget 8 --chunk 4",
                          "--gpu-mem 2G --ctx 64"};
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ids --ignore-eos --device cpu %s",
                 m, ways[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", ways[i], err);
        cr_assert_str_eq(out, plain, "%s", ways[i]);
    }
    cr_assert(strstr(err, "plan: 2.0 GiB device budget"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --kv-offload 3", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "offloaded KV while decoding:"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 8 --kv-offload 3 --spec triforce "
             "--draft-ngram 2 --budget 8 --chunk 4", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "offloaded KV while decoding:"), "the engine counts L3's streaming: %s", err);

    snprintf(args, sizeof args, "generate -m '%s' -p hi --device gpu", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--device 'gpu': want cpu, cuda or cuda:N"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --device cuda:99", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "cuda:99"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --kv-offload 5", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "kv_layers_offloaded 5 outside [0, 4]"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --stream-weights 1 --weights-from-disk 2", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "weight_layers_from_disk 2 outside [0, 1]"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --kv-offload 2 --kv retrieval --kv-budget 8", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "streams the full cache"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --gpu-mem 1M", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "cannot hold what must stay on the GPU"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --gpu-mem lots", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--gpu-mem 'lots'"), "%s", err);
}

// --budget, --chunk, --sink and --refresh set the --kv policy of plain decoding (--kv-budget and
// --kv-chunk are the same options): the budget given is the one used.
Test(cli, budget_chunk_sink_apply_to_the_kv_policy) {
    const char *m = tiny_model();
    static char args[8192], a[1 << 16];
    // 16 prompt tokens + 24: a budget of 8 in chunks of 4 evicts, one of 40 keeps all
    const char *same[][2] = {{"--kv retrieval --budget 8 --chunk 4", "--kv retrieval --kv-budget 8 --kv-chunk 4"},
                             {"--kv retrieval --budget 40 --chunk 4", "--kv full"},
                             {"--kv streaming --budget 40 --sink 4", "--kv full"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        snprintf(args, sizeof args,
                 "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --kv-type f32 %s",
                 m, same[i][0]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", same[i][0], err);
        snprintf(a, sizeof a, "%s", out);
        snprintf(args, sizeof args,
                 "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --kv-type f32 %s",
                 m, same[i][1]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", same[i][1], err);
        cr_assert_str_eq(a, out, "%s vs %s", same[i][0], same[i][1]);
    }
    // and a small budget is really used: its greedy tokens part from the full cache's (on this
    // model and prompt they do for each policy; before, --budget without --spec was ignored)
    static char full[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --kv-type f32", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(full, sizeof full, "%s", out);
    const char *evicting[] = {"--kv streaming --budget 4 --sink 1", "--kv h2o --budget 4",
                              "--kv retrieval --budget 4 --chunk 4"};
    for (size_t i = 0; i < sizeof evicting / sizeof evicting[0]; i++) {
        snprintf(args, sizeof args,
                 "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --kv-type f32 %s",
                 m, evicting[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", evicting[i], err);
        cr_assert_str_neq(out, full, "%s: the same tokens as the full cache", evicting[i]);
    }
}

// A long prompt in small steps: off a terminal, one progress line per tenth of the prompt (at the
// first step boundary past it), then a closing line whose rates agree with its token counts and
// times to the precision printed.
Test(cli, prefill_progress_and_closing_figures) {
    const char *m = tiny_model();
    static char args[16384];
    int n = snprintf(args, sizeof args, "generate -m '%s' --batch 8 -n 16 --ids --ignore-eos --tokens ", m);
    for (int i = 0; i < 600; i++) n += snprintf(args + n, sizeof args - (size_t)n, i ? ",%d" : "%d", i % 200 + 3);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    // progress: the first multiple of 8 at or past 60, 120, ..., 540 (after the device line)
    const char *line = err;
    // (and the library's warning that 616 positions are past this model's trained 512)
    while (!strncmp(line, "loading model: ", 15) || !strncmp(line, "device: ", 8) || !strncmp(line, "plan: ", 6) ||
           !strncmp(line, "triforce: warning: ", 19))
        line = strchr(line, '\n') + 1;
    for (int k = 1; k <= 9; k++) {
        int done, total, want = (60 * k + 7) / 8 * 8;
        cr_assert(sscanf(line, "prefill: %d / %d tokens\n", &done, &total) == 2, "progress line %d: %s", k, line);
        cr_assert(done == want && total == 600, "progress line %d: %d / %d, want %d / 600", k, done, total, want);
        line = strchr(line, '\n') + 1;
    }
    int n_prompt, n_gen;
    double rate, ms, drate, ms_tok;
    char unit[8];
    cr_assert(sscanf(line,
                     "prompt: %d tokens, prefill %lf tok/s (%lf %7[a-z]) | generated: %d tokens, "
                     "decode %lf tok/s (%lf ms/token)", &n_prompt, &rate, &ms, unit, &n_gen, &drate, &ms_tok) == 7,
              "closing line: %s", line);
    cr_assert(n_prompt == 600 && n_gen == 16, "%s", line);
    if (!strcmp(unit, "s")) ms *= 1e3;
    else cr_assert_str_eq(unit, "ms", "%s", line);
    // rates are counts over times: the time is printed to 0.05 ms (or 5 ms past a second), the
    // rate to 0.05 tok/s, the time per token to 3 digits
    cr_assert(fabs(rate * ms / 1e3 - 600) <= 600 * (0.05 / ms + 1e-3), "%s", line);
    cr_assert(fabs(drate * ms_tok / 1e3 - 1) <= 6e-3, "%s", line);
    cr_assert(strchr(line, '\n') == strrchr(line, '\n'), "one closing line: %s", line);

    // a prompt of one token, which speculation does not prefill at all: no prefill rate; and one
    // generated token: no decode rate
    snprintf(args, sizeof args, "generate -m '%s' --tokens 5 -n 8 --ids --ignore-eos --spec draft --draft-ngram 2", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "prompt: 1 tokens, prefill under 1 ms | generated: 8 tokens, decode "), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' --tokens 5 -n 1 --ids", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "| generated: 1 tokens\n"), "no decode rate for one token: %s", err);
}

// --kv-index faiss (FAISS's flat index) selects what the exact scan does: the same tokens, plain
// and as L2; without FAISS in the build it is a clear error.
Test(cli, kv_index_faiss) {
    const char *m = tiny_model();
    static char args[8192], exact[1 << 16], plain[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(plain, sizeof plain, "%s", out);
    snprintf(args, sizeof args,
             "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos --kv retrieval --budget 12 --chunk 4 "
             "--refresh 2", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(exact, sizeof exact, "%s", out);
    const char *with_faiss[] = {"--kv retrieval --budget 12 --chunk 4 --refresh 2 --kv-index faiss",
                                "--spec retrieval --budget 12 --chunk 4 --refresh 2 --kv-index faiss"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids --ignore-eos %s", m,
                 with_faiss[i]);
        int rc = cli(args, out, sizeof out, err, sizeof err);
        if (!tri__chunk_index_have_faiss()) {
            cr_assert_eq(rc, 1, "%s", err);
            cr_assert(strstr(err, "this build has no FAISS"), "%s", err);
            cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: %s", with_faiss[i], err);
        // plain decoding over the retrieval cache, or speculation, whose output is the target's
        cr_assert_str_eq(out, i == 0 ? exact : plain, "%s", with_faiss[i]);
    }
    cr_assert_eq(cli("generate -m x -p hi --kv retrieval --kv-index hnsw", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv-index 'hnsw'"), "%s", err);
    cr_assert_eq(cli("generate -m x -p hi --kv h2o --kv-index faiss", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv-index applies only to --kv retrieval"), "%s", err);
    if (!tri__chunk_index_have_faiss()) cr_skip_test("no FAISS in this build: only the error is checked");
}

// Every cache option that does nothing under the chosen policy or mode, and every value the policy
// refuses, is a one-line error instead of being ignored or quietly replaced.
Test(cli, cache_options_that_do_not_apply_are_refused) {
    const char *m = tiny_model();
    static char args[8192];
    struct {
        const char *opts;
        int rc;
        const char *needle;
    } cases[] = {
        // usage: the option does nothing here
        {"--chunk 3", 2, "--chunk applies only to --kv retrieval"},
        {"--budget 8", 2, "--budget applies only to --kv streaming, h2o or retrieval"},
        {"--refresh 4", 2, "--refresh applies only to --kv retrieval"},
        {"--sink 2", 2, "--sink applies only to --kv streaming"},
        {"--kv retrieval --sink 2", 2, "--sink applies only to --kv streaming"},
        {"--kv h2o --chunk 4", 2, "--chunk applies only to --kv retrieval"},
        {"--kv streaming --kv-chunk 4", 2, "--chunk applies only to --kv retrieval"},
        {"--kv streaming --refresh 4", 2, "--refresh applies only to --kv retrieval"},
        {"--kv full --budget 8", 2, "--budget applies only"},
        {"--kv streaming --spec retrieval", 2, "--kv applies only to plain decoding"},
        {"--spec draft --draft-ngram 2 --budget 8", 2, "--budget applies only to L2"},
        {"--spec draft --draft-ngram 2 --refresh-accept 0.5", 2, "--refresh-accept applies only"},
        {"--spec triforce --draft-layers 0 --sink 2", 2, "L1's sinks are --draft-sink"},
        {"--spec retrieval --draft-window 8", 2, "--draft-window applies only"},
        {"--spec triforce --draft-ngram 2 --draft-sink 2", 2, "--draft-sink applies only"},
        {"--spec draft --draft-ngram 2 --gamma1 2", 2, "--gamma1 applies only to --spec triforce"},
        {"--gamma2 4", 2, "--gamma2 applies only"},
        {"--tree-nodes 8", 2, "--tree-nodes applies only to --spec draft, retrieval or triforce"},
        {"--spec retrieval --tree-nodes 1025", 2, "--tree-nodes '1025': want a whole number in [0, 1024]"},
        // values the policy refuses: budget past the context, chunk not dividing, sink >= budget
        {"--spec retrieval --budget 128 --chunk 3 --ctx 256", 1, "chunk size 3 must divide the budget 128"},
        {"--spec retrieval --budget 256 --chunk 3 --ctx 256", 1, "chunk size 3 must divide the budget 256"},
        {"--spec draft --draft-layers 0 --draft-window 100 --ctx 64", 1, "draft_window 100 is larger than the context"},
        {"--kv retrieval --budget 48 --chunk 5 --ctx 64", 1, "chunk size 5 must divide the budget 48"},
        {"--kv retrieval --budget 64 --chunk 3 --ctx 64", 1, "chunk size 3 must divide the budget 64"},
        {"--kv streaming --budget 8 --sink 8", 1, "sink 8 must be in [0, budget 8)"},
        {"--kv streaming --sink 40 --ctx 40", 1, "sink 40 must be in [0, budget 40)"},
        {"--kv streaming --budget 41 --sink 41", 1, "sink 41 must be in [0, budget 41)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 24 --ids %s", m, cases[i].opts);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), cases[i].rc, "%s: rc, %s", cases[i].opts, err);
        cr_assert(strstr(err, cases[i].needle), "%s: '%s' lacks '%s'", cases[i].opts, err, cases[i].needle);
        cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "%s: not one line: %s", cases[i].opts, err);
    }
}

static int count_lines(const char *s);

// Whether help lists option opt: "--kv" itself, not as the start of "--kv-type".
static bool help_lists(const char *help, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = strstr(help, opt); p; p = strstr(p + 1, opt))
        if (p[n] == ' ' || p[n] == ',' || p[n] == '\n') return true;
    return false;
}

// serve parses the engine's options with generate's code (cli/cli-engine.c): both helps list every
// one, and each set of options below gets the same exit status and the same message from both,
// the command's name aside. Before, serve had its own copy: it did not know --tree-nodes,
// --draft-kv-type or --host-attn-gbps, refused --budget and --sink with --kv-type mixed, and
// answered an unknown option with its whole help.
Test(cli, serve_takes_the_engine_options_of_generate) {
    static const char *const engine[] = {
        "--device", "--kv-type", "--kv-offload", "--stream-weights", "--weights-from-disk", "--gpu-mem",
        "--host-mem", "--kv-host", "--host-attn-gbps", "--kv", "--budget", "--kv-budget", "--chunk", "--kv-chunk",
        "--sink", "--refresh", "--kv-index", "--spec", "--draft", "--draft-layers", "--draft-ngram", "--gamma1",
        "--gamma2", "--tree-nodes", "--draft-window", "--draft-sink", "--draft-kv-type", "--refresh-accept",
    };
    static char gen_help[1 << 16];
    cr_assert_eq(cli("generate --help", gen_help, sizeof gen_help, err, sizeof err), 0);
    int serve_rc = cli("serve --help", out, sizeof out, err, sizeof err);
    const bool have_server = serve_rc == 0;
    if (!have_server) cr_assert(serve_rc == 1 && strstr(err, "this build has no server"), "%s", err);
    for (size_t i = 0; i < sizeof engine / sizeof *engine; i++) {
        cr_assert(help_lists(gen_help, engine[i]), "generate --help lacks %s", engine[i]);
        cr_assert(!have_server || help_lists(out, engine[i]), "serve --help lacks %s", engine[i]);
    }
    if (!have_server) return;
    static const struct {
        const char *opts;
        int rc;  // 1: parsed and checked, then the model (which does not exist) fails to load
    } cases[] = {
        {"--tree-nodes 8", 2},
        {"--spec retrieval --tree-nodes 1025", 2},
        {"--spec retrieval --tree-nodes 4 --draft-kv-type q4_0 --host-attn-gbps 10", 1},
        {"--draft-kv-type q8_0", 2},
        {"--spec retrieval --draft-kv-type mixed", 2},
        {"--kv-type q5_0", 2},
        {"--kv-type mixed --budget 64 --sink 4", 1},
        {"--host-attn-gbps fast", 2},
        {"--kv-budget 0", 2},
        {"--kv-chunk 5000", 2},
        {"--sink 2", 2},
        {"--kv h2o --chunk 4", 2},
        {"--kv streaming --spec retrieval", 2},
        {"--kv lru", 2},
        {"--kv-index hnsw", 2},
        {"--spec fast", 2},
        {"--spec triforce", 2},
        {"--spec draft --draft-ngram 2 --draft-layers 0", 2},
        {"--draft-ngram 2", 2},
        {"--spec draft --draft-ngram 2 --gamma1 2", 2},
        {"--gamma2 4", 2},
        {"--spec retrieval --draft-window 8", 2},
        {"--spec retrieval --refresh-accept 2", 2},
        {"--device gpu", 2},
        {"--gpu-mem lots", 2},
        {"--host-mem 1Q", 2},
        {"--kv-host 1.5", 2},
        {"--kv-offload -1", 2},
        {"--weights-from-disk 70000", 2},
        {"--frobnicate", 2},
    };
    static char gen_err[1 << 16];
    char args[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "generate -m /nonexistent/m.gguf -p hi %s", cases[i].opts);
        int rc = cli(args, out, sizeof out, gen_err, sizeof gen_err);
        cr_assert_eq(rc, cases[i].rc, "generate %s: %d, %s", cases[i].opts, rc, gen_err);
        snprintf(args, sizeof args, "serve -m /nonexistent/m.gguf --port 0 %s", cases[i].opts);
        rc = cli(args, out, sizeof out, err, sizeof err);
        cr_assert_eq(rc, cases[i].rc, "serve %s: %d, %s", cases[i].opts, rc, err);
        // the same text once "serve" reads "generate"
        static char same[1 << 16];
        size_t k = 0;
        for (const char *p = err; *p && k + 16 < sizeof same;) {
            if (strncmp(p, "offload-run serve", 17) == 0) {
                k += (size_t)snprintf(same + k, sizeof same - k, "offload-run generate");
                p += 17;
            } else {
                same[k++] = *p++;
            }
        }
        same[k] = 0;
        cr_assert_str_eq(same, gen_err, "%s", cases[i].opts);
        cr_assert(gen_err[0] && count_lines(gen_err) <= 2, "%s: %s", cases[i].opts, gen_err);
    }
}

// ---- tokenize ----

// An HF checkpoint directory: a generated model whose tokenizer.json is the fixture `name` of
// tests/fixtures/make-tokenizer.py, whose <name>-cases.json hold HF tokenizers' ids.
static const char *tokenizer_model(const char *name) {
    static char dir[4096];
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    if (access(tt_fixture("tokenizer", name), R_OK) != 0)
        cr_skip_test("no tokenizer fixtures (the reference Python packages are missing: scripts/setup-python.sh)");
    char gguf[4096], file[64], cmd[32768];
    snprintf(file, sizeof file, "cli-tok-%d.gguf", (int)getpid());
    snprintf(gguf, sizeof gguf, "%s", tt_tmp(file));
    snprintf(file, sizeof file, "cli-tok-%d.hf", (int)getpid());
    snprintf(dir, sizeof dir, "%s", tt_tmp(file));
    // 1200 ids: the largest fixture vocabulary, which must fit in the model's
    snprintf(cmd, sizeof cmd,
             "'%s' --layers 1 --vocab 1200 --seed 3 --out-gguf '%s' --out-hf '%s' >/dev/null && "
             "cp '%s' '%s/tokenizer.json'", gen, gguf, dir, tt_fixture("tokenizer", name), dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return dir;
}

// The case of `cases` (a make-tokenizer.py cases file) whose text is `text`; the caller puts j.
static json_object *hf_case(const char *cases, const char *text, json_object **j) {
    *j = json_object_from_file(tt_fixture("tokenizer", cases));
    cr_assert(*j && json_object_is_type(*j, json_type_array), "cannot read %s", cases);
    for (size_t i = 0; i < json_object_array_length(*j); i++) {
        json_object *c = json_object_array_get_idx(*j, i), *jt;
        if (json_object_object_get_ex(c, "text", &jt) && strcmp(json_object_get_string(jt), text) == 0)
            return c;
    }
    cr_assert_fail("%s: no case for '%s'", cases, text);
    return NULL;
}

// HF's ids for text under key ("ids", "ids_special", "ids_add") as `tokenize --ids` prints them.
static void hf_ids(const char *cases, const char *text, const char *key, char *ids, size_t size) {
    json_object *j, *a;
    cr_assert(json_object_object_get_ex(hf_case(cases, text, &j), key, &a));
    size_t used = 0;
    for (size_t i = 0; i < json_object_array_length(a); i++)
        used += (size_t)snprintf(ids + used, size - used, i ? " %d" : "%d",
                                 json_object_get_int(json_object_array_get_idx(a, i)));
    snprintf(ids + used, size - used, "\n");
    json_object_put(j);
}

// Runs `tokenize -m model -f <file holding text> flags` and checks stdout against HF's ids.
static void expect_tokenize_file(const char *model, const char *cases, const char *text,
                                 const char *flags, const char *key) {
    char name[64], path[4096], args[16384], want[1 << 14];
    snprintf(name, sizeof name, "cli-text-%d.txt", (int)getpid());
    snprintf(path, sizeof path, "%s", tt_tmp(name));
    tt_write_file(path, text, strlen(text));
    snprintf(args, sizeof args, "tokenize -m '%s' -f '%s' %s", model, path, flags);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", args, err);
    hf_ids(cases, text, key, want, sizeof want);
    cr_assert_str_eq(out, want, "'%s' %s", text, flags);
}

Test(cli, tokenize_ids_match_hf_tokenizers) {
    // Converted Llama-2 tokenizer.json: BOS from its "<s> $A" post-processor.
    const char *m = tokenizer_model("spm-hf.json");
    static char args[8192], want[1 << 14];
    snprintf(args, sizeof args, "tokenize -m '%s' -p 'Hello world' --ids", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    hf_ids("spm-hf-cases.json", "Hello world", "ids_add", want, sizeof want);
    cr_assert_str_eq(out, want);
    cr_assert(strncmp(out, "1 ", 2) == 0, "BOS first: %s", out);
    snprintf(args, sizeof args, "tokenize -m '%s' -p 'Hello world' --ids --no-bos", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    hf_ids("spm-hf-cases.json", "Hello world", "ids", want, sizeof want);
    cr_assert_str_eq(out, want);
    // Without --ids: the count on a line of its own, then the ids.
    snprintf(args, sizeof args, "tokenize -m '%s' -p 'Hello world' --no-bos", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    int n_ids = 1;
    for (const char *p = want; *p; p++) n_ids += *p == ' ';
    char head[64];
    snprintf(head, sizeof head, "%d tokens\n", n_ids);
    cr_assert(strncmp(out, head, strlen(head)) == 0 && strcmp(out + strlen(head), want) == 0,
              "%s", out);
    // -f: the bytes as they are, newlines and CR included.
    const char *s = "line one\nline two\r\nline three\n\n";
    expect_tokenize_file(m, "spm-hf-cases.json", s, "--ids", "ids_add");
    // Control-token strings: plain text unless --special.
    s = "<s>text</s>";
    expect_tokenize_file(m, "spm-hf-cases.json", s, "--ids --no-bos", "ids");
    expect_tokenize_file(m, "spm-hf-cases.json", s, "--ids --no-bos --special", "ids_special");
    expect_tokenize_file(m, "spm-hf-cases.json", s, "--ids --special", "ids_add");

    // Byte-level (SmolLM2 pre-tokenizer; adds no BOS).
    m = tokenizer_model("bpe-smollm.json");
    s = "emoji 👍🏽 😀🚀 and 🇫🇷 flags";
    expect_tokenize_file(m, "bpe-smollm-cases.json", s, "--ids", "ids_add");
    s = "<|im_start|>user\nhello<|im_end|>";
    expect_tokenize_file(m, "bpe-smollm-cases.json", s, "--ids", "ids");
    expect_tokenize_file(m, "bpe-smollm-cases.json", s, "--ids --special", "ids_special");
}

// One --pieces line, "%8d  'vocabulary text'  'decoded bytes'", split into its fields (the
// texts here have no quote or backslash to unescape).
static void split_piece_line(char *line, int *id, char **text, char **dec) {
    char *sep = strstr(line, "'  '");
    size_t len = strlen(line);
    cr_assert(sep && len >= 2 && line[len - 1] == '\'', "bad line '%s'", line);
    *id = atoi(line);
    *text = strchr(line, '\'') + 1;
    *sep = 0;
    *dec = sep + 4;
    line[len - 1] = 0;
}

// The id and vocabulary text columns are HF's ids and tokens; the decoded bytes, concatenated,
// are the text (after the space the SentencePiece prefix adds).
static void expect_pieces(const char *model, const char *cases, const char *text,
                          const char *decoded) {
    static char args[8192], cat[4096];
    snprintf(args, sizeof args, "tokenize -m '%s' -p '%s' --pieces", model, text);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    json_object *j, *ids, *pieces;
    json_object *c = hf_case(cases, text, &j);
    cr_assert(json_object_object_get_ex(c, "ids_add", &ids) &&
              json_object_object_get_ex(c, "pieces", &pieces));
    size_t i = 0;
    cat[0] = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), i++) {
        cr_assert_lt(i, json_object_array_length(ids), "more lines than HF's ids: %s", line);
        int id;
        char *piece, *dec;
        split_piece_line(line, &id, &piece, &dec);
        cr_assert_eq(id, json_object_get_int(json_object_array_get_idx(ids, i)), "line %zu", i);
        cr_assert_str_eq(piece, json_object_get_string(json_object_array_get_idx(pieces, i)),
                         "line %zu", i);
        if (!strcmp(piece, "<s>")) continue;  // special: its decoded text is its name
        strncat(cat, dec, sizeof cat - strlen(cat) - 1);
    }
    cr_assert_eq(i, json_object_array_length(ids));
    cr_assert_str_eq(cat, decoded);
    json_object_put(j);
}

Test(cli, tokenize_pieces_match_hf_tokens) {
    expect_pieces(tokenizer_model("spm-hf.json"), "spm-hf-cases.json", "Hello world",
                  " Hello world");
    const char *s = "emoji 👍🏽 😀🚀 and 🇫🇷 flags";
    expect_pieces(tokenizer_model("bpe-smollm.json"), "bpe-smollm-cases.json", s, s);
}

Test(cli, tokenize_usage_and_file_errors) {
    cr_assert_eq(cli("tokenize --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--ids") && strstr(out, "--pieces") && strstr(out, "--special") &&
              strstr(out, "--no-bos"), "%s", out);
    cr_assert_eq(cli("tokenize -p hi", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "offload-run tokenize: -m MODEL is required"), "%s", err);
    cr_assert_eq(cli("tokenize -m x", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "give exactly one of -p TEXT and -f FILE"), "%s", err);
    cr_assert_eq(cli("tokenize -m x -p hi -f y", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "give exactly one of -p TEXT and -f FILE"), "%s", err);
    cr_assert_eq(cli("tokenize -m x -p hi --ids --pieces", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--ids and --pieces exclude each other"), "%s", err);
    cr_assert_eq(cli("tokenize -m x -p hi extra", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "unexpected argument"), "%s", err);
    cr_assert_eq(cli("tokenize -m x -p hi --frobnicate", out, sizeof out, err, sizeof err), 2);
    // A missing text file: one line naming the command, the file and the reason.
    const char *m = tokenizer_model("spm-hf.json");
    static char args[8192];
    snprintf(args, sizeof args, "tokenize -m '%s' -f /nonexistent/text.txt", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert_str_eq(err, "offload-run tokenize: /nonexistent/text.txt: No such file or directory\n");
    cr_assert_str_eq(out, "");
    // A model without a tokenizer.
    snprintf(args, sizeof args, "rm '%s/tokenizer.json'", m);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "tokenize -m '%s' -p hi", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "offload-run tokenize: cannot tokenize: ") && strstr(err, "no tokenizer"), "%s", err);
    cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
}

// Split attention from the CLI: --kv-host attends part (here, under 1,024 rows, all) of each
// offloaded layer on the host with the same tokens and says how much it read; bad values are
// named; the planner splits with --host-attn-gbps.
Test(cli, kv_host_split_and_plan) {
    const char *m = tiny_model();
    static char args[8192], plain[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ids --ignore-eos --device cpu", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(plain, sizeof plain, "%s", out);
    const char *ways[] = {"--kv-offload 3 --kv-host 1", "--kv-offload 4 --kv-host 0.5",
                          "--spec triforce --draft-ngram 2 --kv-offload 3 --kv-host 1 --budget 8 --chunk 4"};
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ids --ignore-eos --device cpu %s",
                 m, ways[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", ways[i], err);
        cr_assert_str_eq(out, plain, "%s", ways[i]);
        cr_assert(strstr(err, "offloaded KV attended on the host:"), "%s: %s", ways[i], err);
    }
    snprintf(args, sizeof args, "generate -m '%s' -p hi --kv-offload 2 --kv-host 1.5", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv-host '1.5'"), "%s", err);
    // a context of a million tokens and a budget that leaves only the double buffers: all KV offloaded
    snprintf(args, sizeof args, "plan -m '%s' --ctx 1000000 --gpu-mem 1500M --host-mem 0 --host-attn-gbps 60", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "host attention 60.0 GB/s reads 70.6% of each offloaded layer"), "%s", out);
    snprintf(args, sizeof args, "plan -m '%s' --host-attn-gbps fast", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
}

// SIGINT during a long prefill: generate returns after the piece in progress, and the command
// frees what it holds and exits with 130 within a second of the signal (under LeakSanitizer a
// leak at that exit would change the status).
Test(cli, sigint_during_prefill_stops_within_a_second, .timeout = TT_TIMEOUT(300)) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(bin && gen);
    char name[64], path[4096], cmd[8192];
    snprintf(name, sizeof name, "cli-sigint-%d.gguf", (int)getpid());
    snprintf(path, sizeof path, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd,
             "'%s' --layers 4 --embd 256 --ff 512 --heads 4 --kv-heads 2 --ctx 16384 --seed 8 --out-gguf '%s' >/dev/null",
             gen, path);
    cr_assert_eq(system(cmd), 0);
    enum { NP = 12000 };
    char *ids = malloc(NP * 6 + 1), *p = ids;
    cr_assert(ids);
    for (int i = 0; i < NP; i++) p += sprintf(p, i ? ",%d" : "%d", 3 + (i * 37) % 250);
    int errp[2];
    cr_assert_eq(pipe(errp), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(errp[1], 2);
        close(errp[0]);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execl(bin, bin, "generate", "-m", path, "--tokens", ids, "-n", "4", "--ids", "--device", "cpu",
              (char *)NULL);
        _exit(127);
    }
    close(errp[1]);
    free(ids);
    // wait for the first prefill report (10% done), then interrupt
    FILE *f = fdopen(errp[0], "r");
    char line[1024], all[8192] = "";
    bool started = false;
    while (!started && fgets(line, sizeof line, f)) {
        strncat(all, line, sizeof all - strlen(all) - 1);
        started = strncmp(line, "prefill:", 8) == 0;
    }
    cr_assert(started, "no prefill report before the end:\n%s", all);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(kill(pid, SIGINT), 0);
    while (fgets(line, sizeof line, f)) strncat(all, line, sizeof all - strlen(all) - 1);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fclose(f);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_assert(WIFEXITED(status), "killed by signal %d instead of exiting:\n%s", WTERMSIG(status), all);
    cr_assert_eq(WEXITSTATUS(status), 130, "exit status %d:\n%s", WEXITSTATUS(status), all);
    cr_assert(strstr(all, "interrupted after 0 generated tokens"), "%s", all);
    cr_assert_lt(secs, 1.0, "exited %.2f s after SIGINT", secs);
    printf("cli: SIGINT during prefill: exited %.3f s after the signal\n", secs);
}

// ---- chat, stop strings, --json ----

// Runs `offload-run ARGS` with input on stdin; as cli() otherwise.
static int cli_in(const char *args, const char *input, char *o_buf, size_t o_size, char *e_buf, size_t e_size) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin);
    char in[4096], o[4096], e[4096], cmd[16384], name[64];
    snprintf(name, sizeof name, "cli-%d.in", (int)getpid());
    snprintf(in, sizeof in, "%s", tt_tmp(name));
    tt_write_file(in, input, strlen(input));
    snprintf(name, sizeof name, "cli-%d.out", (int)getpid());
    snprintf(o, sizeof o, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "cli-%d.err", (int)getpid());
    snprintf(e, sizeof e, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s' <'%s'", bin, args, o, e, in);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc), "%s", cmd);
    char *so = tt_read_file(o, NULL), *se = tt_read_file(e, NULL);
    snprintf(o_buf, o_size, "%s", so);
    snprintf(e_buf, e_size, "%s", se);
    free(so);
    free(se);
    return WEXITSTATUS(rc);
}

static int64_t jint(struct json_object *o, const char *key) {
    struct json_object *v;
    cr_assert(json_object_object_get_ex(o, key, &v), "no '%s' in %s", key, json_object_to_json_string(o));
    return json_object_get_int64(v);
}

// A scripted conversation (stdin not a terminal): one answer per line, and from the second turn
// on only the new turn's tokens are prefilled, the rest coming from the session's cache.
Test(cli, chat_scripted_keeps_the_cache_between_turns, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    char json[4096], name[64], args[8192];
    snprintf(name, sizeof name, "chat-%d.json", (int)getpid());
    snprintf(json, sizeof json, "%s", tt_tmp(name));
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml --system 'be brief' -n 6 --json '%s'", m, json);
    cr_assert_eq(cli_in(args, "hello there\n\nwhat next\nand then\n", out, sizeof out, err, sizeof err), 0, "%s", err);
    // three answers, one line each (empty input lines are not turns)
    int lines = 0;
    for (const char *p = out; *p; p++) lines += *p == '\n';
    cr_assert_geq(lines, 3, "%s", out);
    cr_assert(strstr(err, "chat format: chatml (--chat-format)"), "%s", err);
    cr_assert(strstr(err, "turn 3: prefill "), "%s", err);
    char *text = tt_read_file(json, NULL);
    struct json_object *root = json_tokener_parse(text);
    cr_assert(root, "--json wrote no JSON: %s", text);
    free(text);
    struct json_object *turns;
    cr_assert(json_object_object_get_ex(root, "turns", &turns));
    cr_assert_eq(json_object_array_length(turns), 3);
    int64_t prev_prompt = 0, prefilled = 0, generated = 0;
    for (size_t i = 0; i < 3; i++) {
        struct json_object *t = json_object_array_get_idx(turns, i);
        int64_t prompt = jint(t, "prompt_tokens"), cached = jint(t, "cached_tokens"), pre = jint(t, "prefilled_tokens");
        cr_assert_eq(cached + pre, prompt);
        cr_assert_gt(pre, 0);
        if (i == 0) cr_assert_eq(cached, 0);
        // everything the last turn rendered is still there, bar a token or two where the
        // answer's text tokenizes differently from the tokens generated
        else cr_assert_geq(cached, prev_prompt - 2, "turn %zu: %lld cached of the previous %lld", i, (long long)cached,
                           (long long)prev_prompt);
        cr_assert_lt(pre, prompt - prev_prompt + 8, "turn %zu prefilled %lld of %lld", i, (long long)pre,
                     (long long)prompt);
        prev_prompt = prompt;
        prefilled += pre;
        generated += jint(t, "generated_tokens");
        cr_assert_leq(jint(t, "generated_tokens"), 6);
    }
    cr_assert_eq(jint(root, "prefilled_tokens"), prefilled);
    cr_assert_eq(jint(root, "generated_tokens"), generated);
    cr_assert_gt(jint(root, "peak_rss_bytes"), 1 << 20);
    json_object_put(root);
    // the end of the input at once: no turn, exit 0
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml", m);
    cr_assert_eq(cli_in(args, "", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, "");
}

// --prompt-cache: a first chat writes its first prompt to the file; a second chat with the file
// reuses that prompt whole (its first turn prefills one token), leaves the file alone and answers
// as the first did (greedy, the chat's repetition penalty seeing the loaded prefix).
Test(cli, chat_prompt_cache_reused_across_runs, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    static char out1[1 << 16], err1[1 << 16];
    char path[4096], name[64], args[8192];
    snprintf(name, sizeof name, "chat-pcache-%d.kv", (int)getpid());
    snprintf(path, sizeof path, "%s", tt_tmp(name));
    unlink(path);
    snprintf(args, sizeof args,
             "chat -m '%s' --chat-format chatml --temp 0 -n 6 --prompt-cache '%s' --system 'you answer questions "
             "about the weather in the valley, briefly and in plain words'",
             m, path);
    const char *in = "hello there\nwhat next\n";
    cr_assert_eq(cli_in(args, in, out1, sizeof out1, err1, sizeof err1), 0, "%s", err1);
    cr_assert(strstr(err1, "does not exist yet"), "%s", err1);
    const char *saved = strstr(err1, "prompt cache: saved ");
    cr_assert(saved, "%s", err1);
    int n_saved = atoi(saved + strlen("prompt cache: saved "));
    cr_assert_gt(n_saved, 10, "%s", err1);
    cr_assert(strstr(err1, "turn 1: prefill "), "%s", err1);
    cr_assert_eq(cli_in(args, in, out, sizeof out, err, sizeof err), 0, "%s", err);
    char want[128];
    snprintf(want, sizeof want, "prompt cache: reused %d of %d tokens", n_saved, n_saved);
    cr_assert(strstr(err, want), "want '%s': %s", want, err);
    cr_assert(strstr(err, "turn 1: prefill 1 new tokens"), "%s", err);
    cr_assert_null(strstr(err, "prompt cache: saved"), "the file was written again: %s", err);
    cr_assert_str_eq(out, out1, "answers after a load differ from the first run's");
    unlink(path);
}

Test(cli, chat_needs_a_template_or_a_format) {
    const char *m = tiny_model();
    char args[8192];
    snprintf(args, sizeof args, "chat -m '%s'", m);
    cr_assert_eq(cli_in(args, "hi\n", out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "no chat template") && strstr(err, "--chat-format"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' --chat -p hi", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "no chat template"), "%s", err);
    snprintf(args, sizeof args, "chat -m '%s' --chat-format vicuna", m);
    cr_assert_eq(cli_in(args, "hi\n", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--chat-format 'vicuna'"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --stop ''", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--stop ''"), "%s", err);
    // Gemma's template takes no system message: the renderer's refusal is the error
    snprintf(args, sizeof args, "generate -m '%s' --chat-format gemma --system s -p hi", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "system role not supported"), "%s", err);
}

// --json on generate: one object with the figures the closing line gives, and why it ended.
Test(cli, generate_json_figures) {
    const char *m = tiny_model();
    char args[8192];
    snprintf(args, sizeof args, "generate -m '%s' --tokens 5,6,7,8 -n 8 --ignore-eos --json - --spec draft "
             "--draft-ngram 2", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    const char *brace = strchr(out, '{');
    cr_assert(brace, "%s", out);
    struct json_object *root = json_tokener_parse(brace);
    cr_assert(root, "%s", out);
    cr_assert_eq(jint(root, "prompt_tokens"), 4);
    cr_assert_eq(jint(root, "generated_tokens"), 8);
    struct json_object *v, *spec;
    cr_assert(json_object_object_get_ex(root, "stop_reason", &v));
    cr_assert_str_eq(json_object_get_string(v), "length");
    cr_assert(json_object_object_get_ex(root, "speculative", &spec) && spec);
    cr_assert_eq(jint(spec, "full_cache_passes") > 0, 1);
    cr_assert(json_object_object_get_ex(root, "text", &v));
    // the text in the JSON is the text printed before it
    const char *t = json_object_get_string(v);
    cr_assert(strncmp(out, t, strlen(t)) == 0, "printed [%s], JSON [%s]", out, t);
    json_object_put(root);
}

// Stop strings on the real model: the text ends right before the first occurrence of the stop
// string in the unstopped run, and fewer tokens are generated.
Test(cli, stop_string_on_smollm2, .timeout = TT_TIMEOUT(120)) {
    const char *m = getenv("TRI_TEST_MODEL");
    if (!m || !*m) cr_skip_test("TRI_TEST_MODEL is not set");
    char args[8192];
    snprintf(args, sizeof args, "generate -m '%s' --chat -p 'Name three colours.' -n 24 -t 2 --seed 7 --json -", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    struct json_object *root = json_tokener_parse(strrchr(out, '{')), *v;
    cr_assert(root);
    cr_assert(json_object_object_get_ex(root, "text", &v));
    char full[4096];
    snprintf(full, sizeof full, "%s", json_object_get_string(v));
    int64_t n_full = jint(root, "generated_tokens");
    json_object_put(root);
    // a stop string of two letters and what follows, from the middle of the text
    size_t at = strlen(full) / 2;
    while (full[at] && !(full[at] >= 'a' && full[at] <= 'z')) at++;
    cr_assert(full[at] && full[at + 1] && full[at + 2], "%s", full);
    char stop[4] = {full[at], full[at + 1], full[at + 2], 0};
    cr_assert(!strchr(stop, '\''), "%s", stop);
    size_t first = (size_t)(strstr(full, stop) - full);
    snprintf(args, sizeof args,
             "generate -m '%s' --chat -p 'Name three colours.' -n 24 -t 2 --seed 7 --stop '%s' --json -", m, stop);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    root = json_tokener_parse(strrchr(out, '{'));
    cr_assert(root);
    cr_assert(json_object_object_get_ex(root, "text", &v));
    cr_assert_eq(strlen(json_object_get_string(v)), first, "stop '%s': [%s] of [%s]", stop, json_object_get_string(v),
                 full);
    cr_assert(strncmp(json_object_get_string(v), full, first) == 0);
    cr_assert(strncmp(out, full, first) == 0 && out[first] == '\n', "printed [%s]", out);
    cr_assert_lt(jint(root, "generated_tokens"), n_full);
    cr_assert(json_object_object_get_ex(root, "stop_reason", &v));
    cr_assert_str_eq(json_object_get_string(v), "stop_string");
    json_object_put(root);
}

// generate: greedy by default (no settings line); --temp samples with a seed drawn per run unless
// --seed is given, which repeats the tokens; --chat takes the chat settings; bad values are named.
Test(cli, generate_sampling_defaults_and_seed, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    char args[8192], a[1 << 12], b[1 << 12];
    snprintf(args, sizeof args, "generate -m '%s' -p 'hello' -n 12 --ids --ignore-eos", m);
    cr_assert_eq(cli(args, a, sizeof a, err, sizeof err), 0, "%s", err);
    cr_assert(!strstr(err, "sampling:"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p 'hello' -n 12 --ids --ignore-eos --temp 0", m);
    cr_assert_eq(cli(args, b, sizeof b, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(a, b, "greedy is the default");
    // sampled: a drawn seed, printed; two runs differ (12 tokens from a near-uniform tiny model)
    snprintf(args, sizeof args, "generate -m '%s' -p 'hello' -n 12 --ids --ignore-eos --temp 1.5", m);
    cr_assert_eq(cli(args, a, sizeof a, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "sampling: temperature 1.5, seed "), "%s", err);
    unsigned long long seed = strtoull(strstr(err, ", seed ") + 7, NULL, 10);
    cr_assert_eq(cli(args, b, sizeof b, err, sizeof err), 0, "%s", err);
    cr_assert_str_neq(a, b, "two runs without --seed gave the same tokens");
    // the printed seed repeats the first run
    snprintf(args, sizeof args, "generate -m '%s' -p 'hello' -n 12 --ids --ignore-eos --temp 1.5 --seed %llu", m, seed);
    cr_assert_eq(cli(args, b, sizeof b, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(a, b);
    // --chat: the chat settings
    snprintf(args, sizeof args, "generate -m '%s' --chat-format chatml -p 'hello' -n 4 --seed 1", m);
    cr_assert_eq(cli(args, a, sizeof a, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "sampling: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat-penalty 1.1, over the "
                          "last 64 tokens, seed 1"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --min-p 2", m);
    cr_assert_eq(cli(args, a, sizeof a, err, sizeof err), 2);
    cr_assert(strstr(err, "--min-p '2': want a number in [0, 1]"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --repeat-last-n -5", m);
    cr_assert_eq(cli(args, a, sizeof a, err, sizeof err), 2);
    cr_assert(strstr(err, "--repeat-last-n '-5'"), "%s", err);
}

// Counts the "turn N:" lines of chat's stderr.
static int count_turns(const char *e) {
    int n = 0;
    for (const char *p = e; (p = strstr(p, "turn ")); p++)
        if (p == e || p[-1] == '\n') n++;
    return n;
}

// The content of message i of a /save transcript, with its role checked.
static const char *msg_content(struct json_object *msgs, size_t i, const char *role) {
    struct json_object *m = json_object_array_get_idx(msgs, i), *v;
    cr_assert(m, "no message %zu", i);
    cr_assert(json_object_object_get_ex(m, "role", &v));
    cr_assert_str_eq(json_object_get_string(v), role, "message %zu", i);
    cr_assert(json_object_object_get_ex(m, "content", &v));
    return json_object_get_string(v);
}

// The commands, multi-line input and a document, read from a pipe (libedit only on a terminal):
// each command does what /help says, a bad one is reported and the chat goes on, /bye ends it.
Test(cli, chat_commands_and_multiline_input, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    char doc[4096], save[4096], json[4096], name[64], args[8192], input[16384];
    snprintf(name, sizeof name, "chat-doc-%d.txt", (int)getpid());
    snprintf(doc, sizeof doc, "%s", tt_tmp(name));
    tt_write_file(doc, "the secret word is zebra\n", 25);
    snprintf(name, sizeof name, "chat-save-%d.json", (int)getpid());
    snprintf(save, sizeof save, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "chat-cmd-%d.json", (int)getpid());
    snprintf(json, sizeof json, "%s", tt_tmp(name));
    snprintf(input, sizeof input,
             "/help\n"
             "/set temp 0\n"
             "/set n-predict 3\n"
             "/set bogus 1\n"
             "/set top-p 7\n"
             "/system be brief\n"
             "first \\\n"
             "line\n"
             "\"\"\"\n"
             "block one\n"
             "\n"
             "block two\n"
             "\"\"\"\n"
             "/load %s\n"
             "what is the word\n"
             "/load /nonexistent/doc.txt\n"
             "/save %s\n"
             "/frobnicate\n"
             "/clear\n"
             "//slashed\n"
             "/bye\n"
             "not answered\n",
             doc, save);
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml --json '%s'", m, json);
    cr_assert_eq(cli_in(args, input, out, sizeof out, err, sizeof err), 0, "%s", err);
    // the settings at start are the chat settings; /set changes them
    cr_assert(strstr(err, "sampling: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat-penalty 1.1"), "%s",
              err);
    cr_assert(strstr(err, "sampling: greedy, repeat-penalty 1.1, over the last 64 tokens; n-predict 3"), "%s", err);
    cr_assert(strstr(err, "/help") && strstr(err, "/load FILE") && strstr(err, "/bye"), "%s", err);
    cr_assert(strstr(err, "/set 'bogus': unknown key"), "%s", err);
    cr_assert(strstr(err, "/set top-p '7': want a number in [0, 1]"), "%s", err);
    cr_assert(strstr(err, "system message set"), "%s", err);
    cr_assert(strstr(err, "loaded ") && strstr(err, "/nonexistent/doc.txt: No such file"), "%s", err);
    cr_assert(strstr(err, "saved 7 messages"), "%s", err);
    cr_assert(strstr(err, "unknown command '/frobnicate'"), "%s", err);
    cr_assert(strstr(err, "the conversation is cleared"), "%s", err);
    // four messages answered, none after /bye
    cr_assert_eq(count_turns(err), 4, "%s", err);

    char *text = tt_read_file(save, NULL);
    struct json_object *root = json_tokener_parse(text), *msgs;
    cr_assert(root, "/save wrote no JSON: %s", text);
    free(text);
    cr_assert(json_object_object_get_ex(root, "messages", &msgs));
    cr_assert_eq(json_object_array_length(msgs), 7);
    cr_assert_str_eq(msg_content(msgs, 0, "system"), "be brief");
    cr_assert_str_eq(msg_content(msgs, 1, "user"), "first \nline");
    msg_content(msgs, 2, "assistant");
    cr_assert_str_eq(msg_content(msgs, 3, "user"), "block one\n\nblock two");
    cr_assert_str_eq(msg_content(msgs, 5, "user"), "the secret word is zebra\n\nwhat is the word");
    msg_content(msgs, 6, "assistant");
    json_object_put(root);

    // the turns' figures: the document was prefilled by /load, so its turn took most of its
    // tokens from the cache; after /clear the conversation is the system message and one line
    text = tt_read_file(json, NULL);
    root = json_tokener_parse(text);
    cr_assert(root, "%s", text);
    free(text);
    struct json_object *turns;
    cr_assert(json_object_object_get_ex(root, "turns", &turns));
    cr_assert_eq(json_object_array_length(turns), 4);
    struct json_object *t2 = json_object_array_get_idx(turns, 2), *t3 = json_object_array_get_idx(turns, 3);
    cr_assert_gt(jint(t2, "cached_tokens"), jint(json_object_array_get_idx(turns, 1), "prompt_tokens") + 20,
                 "the document was not in the cache");
    cr_assert_lt(jint(t3, "prompt_tokens"), jint(json_object_array_get_idx(turns, 0), "prompt_tokens") + 4);
    for (size_t i = 0; i < 4; i++) cr_assert_leq(jint(json_object_array_get_idx(turns, i), "generated_tokens"), 3);
    json_object_put(root);
}

// When the conversation no longer fits the context, the oldest turns are dropped with a note and
// every line is still answered; a line too long for the context on its own is refused, and the
// chat goes on.
Test(cli, chat_drops_the_oldest_turns_when_the_context_fills, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    char args[8192], input[8192];
    char longline[200];
    memset(longline, 'x', sizeof longline - 1);
    longline[sizeof longline - 1] = 0;
    snprintf(input, sizeof input,
             "hello there\nwhat next is it\nand then some more\nfourth line here\n%s\nfifth one now\n", longline);
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml --system 'be brief' -n 4 --ctx 64", m);
    cr_assert_eq(cli_in(args, input, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "the context of 64 tokens is full: dropped the 2 oldest messages"), "%s", err);
    cr_assert(strstr(err, "does not fit the context of 64 tokens (--ctx); it is dropped"), "%s", err);
    cr_assert_eq(count_turns(err), 5, "%s", err);
    cr_assert(strstr(err, "turn 5: "), "%s", err);
}

// Reads the pseudo-terminal into buf (appending, *n bytes) until it holds needle or timeout_s
// passes; whether it does.
static bool pty_wait(int fd, char *buf, size_t cap, size_t *n, const char *needle, double timeout_s) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        buf[*n] = 0;
        if (strstr(buf, needle)) return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        double left = timeout_s - ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec));
        if (left <= 0) return false;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t r = read(fd, buf + *n, cap - 1 - *n);
        if (r <= 0) {
            buf[*n] = 0;
            return strstr(buf, needle) != NULL;
        }
        *n += (size_t)r;
    }
}

// On a terminal (a pseudo-terminal here) lines go through libedit: the arrow keys move the cursor
// instead of reaching the model as "^[[D", and the line is kept in the history file.
Test(cli, chat_edits_lines_on_a_terminal, .timeout = TT_TIMEOUT(120)) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin);
    char args[256];
    snprintf(args, sizeof args, "chat --help");
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0);
    if (!strstr(out, "(libedit")) cr_skip_test("this build has no libedit (-Dlibedit)");
    const char *m = tiny_model();
    char home[4096], save[4096], hist[4096], name[64], cmd[16384];
    snprintf(name, sizeof name, "chat-home-%d", (int)getpid());
    snprintf(home, sizeof home, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", home, home);
    cr_assert_eq(system(cmd), 0);
    snprintf(name, sizeof name, "chat-home-%d/t.json", (int)getpid());
    snprintf(save, sizeof save, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "chat-home-%d/.offload_run_history", (int)getpid());
    snprintf(hist, sizeof hist, "%s", tt_tmp(name));
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("HOME", home, 1);
        execl(bin, bin, "chat", "-m", m, "--chat-format", "chatml", "-n", "3", "--ctx", "256", (char *)NULL);
        _exit(127);
    }
    static char buf[1 << 16];
    size_t n = 0;
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "> ", 60), "no prompt: %s", buf);
    const char *typed = "abc\x1b[D\x1b[DX\r";  // abc, left, left, X: aXbc
    cr_assert_eq(write(fd, typed, strlen(typed)), (ssize_t)strlen(typed));
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "turn 1:", 60), "no answer: %s", buf);
    char line[8192];
    snprintf(line, sizeof line, "/save %s\r", save);
    cr_assert_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "saved 2 messages", 60), "%s", buf);
    cr_assert_eq(write(fd, "/bye\r", 5), 5);
    pty_wait(fd, buf, sizeof buf, &n, "\x01", 10);  // drain until the program closes the terminal
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    close(fd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, buf);
    char *t = tt_read_file(save, NULL);
    cr_assert(strstr(t, "\"content\": \"aXbc\""), "the edited line: %s", t);
    free(t);
    t = tt_read_file(hist, NULL);
    cr_assert(strstr(t, "aXbc") && strstr(t, "/bye"), "history: %s", t);
    free(t);
}

// Ctrl-C at the prompt clears a half-typed line and the chat goes on (it used to end the chat); a
// second Ctrl-C in a row ends it, with status 0 (issue 41).
Test(cli, chat_ctrl_c_clears_the_line, .timeout = TT_TIMEOUT(120)) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin);
    const char *m = tiny_model();
    char home[4096], save[4096], name[64], cmd[16384];
    snprintf(name, sizeof name, "chat-cc-%d", (int)getpid());
    snprintf(home, sizeof home, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", home, home);
    cr_assert_eq(system(cmd), 0);
    snprintf(name, sizeof name, "chat-cc-%d/t.json", (int)getpid());
    snprintf(save, sizeof save, "%s", tt_tmp(name));
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("HOME", home, 1);
        execl(bin, bin, "chat", "-m", m, "--chat-format", "chatml", "-n", "3", "--ctx", "256", (char *)NULL);
        _exit(127);
    }
    static char buf[1 << 16];
    size_t n = 0;
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "> ", 60), "no prompt: %s", buf);
    cr_assert_eq(write(fd, "half typed", 10), 10);
    usleep(200 * 1000);
    cr_assert_eq(write(fd, "\x03", 1), 1);  // Ctrl-C: the terminal sends SIGINT
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "the line is cleared", 30), "no note: %s", buf);
    cr_assert_eq(write(fd, "hello\r", 6), 6);
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "turn 1:", 60), "the chat did not go on: %s", buf);
    char line[8192];
    snprintf(line, sizeof line, "/save %s\r", save);
    cr_assert_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    cr_assert(pty_wait(fd, buf, sizeof buf, &n, "saved 2 messages", 60), "%s", buf);
    usleep(200 * 1000);
    cr_assert_eq(write(fd, "\x03", 1), 1);
    usleep(300 * 1000);
    cr_assert_eq(write(fd, "\x03", 1), 1);  // twice: the end
    pty_wait(fd, buf, sizeof buf, &n, "\x01", 10);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    close(fd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, buf);
    char *t = tt_read_file(save, NULL);
    cr_assert(strstr(t, "\"content\": \"hello\"") && !strstr(t, "half typed"), "the cleared line was sent: %s", t);
    free(t);
}

// /save writes the whole chat, the turns dropped from a full context too, and /load of that file
// restores it (the next turn continues it); an answer that fills the context says it was cut
// (issue 41: /save left dropped turns out, nothing restored a chat, a cut answer said nothing).
Test(cli, chat_save_restores_the_whole_chat, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    char save[4096], save2[4096], name[64], args[16384];
    snprintf(name, sizeof name, "chat-all-%d.json", (int)getpid());
    snprintf(save, sizeof save, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "chat-all2-%d.json", (int)getpid());
    snprintf(save2, sizeof save2, "%s", tt_tmp(name));
    static char in[1 << 14];
    size_t at = 0;
    for (int i = 0; i < 6; i++)
        at += (size_t)snprintf(in + at, sizeof in - at,
                               "message number %d with a few more words in it to fill the "
                               "context\n",
                               i);
    snprintf(in + at, sizeof in - at, "/save %s\n", save);
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml -n 16 --ctx 128 --temp 0", m);
    cr_assert_eq(cli_in(args, in, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "dropped the"), "the context never filled: %s", err);
    cr_assert(strstr(err, "saved 12 messages"), "%s", err);
    char *t = tt_read_file(save, NULL);
    for (int i = 0; i < 6; i++) {
        char want[64];
        snprintf(want, sizeof want, "message number %d ", i);
        cr_assert(strstr(t, want), "/save lacks '%s': %s", want, t);
    }
    free(t);
    // restored: the next turn continues the chat, and a second save holds both
    snprintf(in, sizeof in, "/load %s\nand one more\n/save %s\n", save, save2);
    cr_assert_eq(cli_in(args, in, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "restored 12 messages"), "%s", err);
    cr_assert(strstr(err, "saved 14 messages"), "%s", err);
    t = tt_read_file(save2, NULL);
    cr_assert(strstr(t, "message number 0 ") && strstr(t, "and one more"), "%s", t);
    free(t);
    // a broken saved chat is refused by name, the chat goes on
    tt_write_file(save2, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 49);
    snprintf(in, sizeof in, "/load %s\nhello\n", save2);
    cr_assert_eq(cli_in(args, in, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, save2) && strstr(err, "message 0: want a role") && strstr(err, "turn 1:"), "%s", err);
    // an answer without a limit fills the context and says it was cut
    snprintf(args, sizeof args, "chat -m '%s' --chat-format chatml -n 0 --ctx 64 --temp 0", m);
    cr_assert_eq(cli_in(args, "tell me everything\n", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "(cut: the context of 64 tokens is full"), "%s", err);
    unlink(save), unlink(save2);
}

// Ctrl-C during an answer stops that answer, not the program: the next line is answered, and the
// end of the input then ends it cleanly.
Test(cli, chat_sigint_stops_the_answer_not_the_program, .timeout = TT_TIMEOUT(120)) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    const char *m = tiny_model();
    char json[4096], name[64], errf[4096], outf[4096];
    snprintf(name, sizeof name, "chat-int-%d.json", (int)getpid());
    snprintf(json, sizeof json, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "chat-int-%d.err", (int)getpid());
    snprintf(errf, sizeof errf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "chat-int-%d.out", (int)getpid());
    snprintf(outf, sizeof outf, "%s", tt_tmp(name));
    tt_write_file(outf, "", 0);
    int in[2];
    cr_assert_eq(pipe(in), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        dup2(in[0], 0);
        close(in[1]);
        int o = open(outf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        execl(bin, bin, "chat", "-m", m, "--chat-format", "chatml", "-n", "20000", "--ctx", "45000", "-t", "1",
              "--ignore-eos", "--json", json, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    signal(SIGPIPE, SIG_IGN);  // a child that died is reported by its status, not by a write
    cr_assert_eq(write(in[1], "tell me a long story\n", 21), 21);
    // wait for the answer to start streaming, then interrupt it (20,000 tokens take seconds)
    struct timespec ms10 = {0, 10 * 1000 * 1000}, ms100 = {0, 100 * 1000 * 1000};
    for (int i = 0; i < 3000; i++) {
        nanosleep(&ms10, NULL);
        size_t len = 0;
        free(tt_read_file(outf, &len));
        if (len > 0) break;
    }
    cr_assert_eq(kill(pid, SIGINT), 0);
    nanosleep(&ms100, NULL);
    (void)!write(in[1], "and another\n", 12);
    close(in[1]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    char *e = tt_read_file(errf, NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, e);
    cr_assert(strstr(e, "turn 2: "), "the second line was not answered: %s", e);
    free(e);
    char *text = tt_read_file(json, NULL);
    struct json_object *root = json_tokener_parse(text), *turns, *v;
    free(text);
    cr_assert(root && json_object_object_get_ex(root, "turns", &turns));
    cr_assert_eq(json_object_array_length(turns), 2);
    struct json_object *t0 = json_object_array_get_idx(turns, 0);
    cr_assert(json_object_object_get_ex(t0, "interrupted", &v));
    cr_assert(json_object_get_boolean(v), "the first answer was not interrupted");
    cr_assert_lt(jint(t0, "generated_tokens"), 20000);
    json_object_put(root);
}

// Tensor parallelism over two and three CPU backends (--device cpu:0,cpu:1): the default model's
// greedy text is the one device's, plain and speculative; bad lists are named.
Test(cli, device_lists_give_the_one_device_greedy_text, .timeout = TT_TIMEOUT(300)) {
    const char *model = getenv("TRI_TEST_MODEL");
    if (!model || !*model) cr_skip_test("TRI_TEST_MODEL is not set");
    static char args[8192], plain[1 << 16];
    snprintf(args, sizeof args, "generate -m '%s' -p 'The capital of France is' -n 32 --ignore-eos --device cpu", model);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(plain, sizeof plain, "%s", out);
    cr_assert(strlen(plain) > 32, "%s", plain);
    const char *ways[] = {"--device cpu:0,cpu:1", "--device cpu:0,cpu:1,cpu:2",
                          "--device cpu:0,cpu:1 --spec triforce --draft-layers 0-11 --budget 16 --chunk 4",
                          "--device cpu:0,cpu:1 --kv-offload 10"};
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'The capital of France is' -n 32 --ignore-eos %s", model,
                 ways[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", ways[i], err);
        cr_assert_str_eq(out, plain, "%s", ways[i]);
    }
    cr_assert(strstr(err, "device: cpu:0,cpu:1"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --device cpu:0,cpu:0", model);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "'cpu:0' appears twice"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --device cpu:0,cpu:1,cpu:2,cpu:3", model);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "4 devices but the model has 3 KV heads (9 query heads)"), "%s", err);
}

// ---- issue 32: messages, input, figures, plan ----

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// Every message starts "offload-run COMMAND: ", getopt's too; an unknown option is one line and a
// pointer to --help, not the help; a bad value names its option; no "plan: plan:"; --gpu-mem on the
// CPU says that the plan is a GPU's.
Test(cli, messages_one_prefix_and_one_line) {
    const char *m = tiny_model();
    static char args[8192];
    snprintf(args, sizeof args, "generate -m '%s' -p hi --frobnicate", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "offload-run generate: unrecognized option '--frobnicate'"), "%s", err);
    cr_assert(strstr(err, "see 'offload-run generate --help'"), "%s", err);
    cr_assert_leq(count_lines(err), 2, "%s", err);
    for (const char *const *c = (const char *const[]){"plan", "chat", "info", "tokenize", NULL}; *c; c++) {
        snprintf(args, sizeof args, "%s --frobnicate", *c);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
        char want[64];
        snprintf(want, sizeof want, "offload-run %s: unrecognized option", *c);
        cr_assert(strstr(err, want) && count_lines(err) <= 2, "%s", err);
    }
    cr_assert_eq(cli("generate -p hi", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "offload-run generate: -m MODEL is required") && count_lines(err) <= 2, "%s", err);
    cr_assert_eq(cli("frobnicate", out, sizeof out, err, sizeof err), 2);
    cr_assert_leq(count_lines(err), 2, "%s", err);

    snprintf(args, sizeof args, "plan -m '%s' --gpu-mem abc", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "offload-run plan: --gpu-mem 'abc'"), "%s", err);
    snprintf(args, sizeof args, "plan -m '%s' --accept-l1 1.5", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--accept-l1 '1.5'"), "%s", err);
    snprintf(args, sizeof args, "plan -m '%s' --ctx 100000000 --gpu-mem 100M", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "offload-run plan: ") && !strstr(err, "plan: plan:") && !strstr(err, "offload-run: "),
              "%s", err);

    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 2 --device cpu --gpu-mem 2G --ctx 64", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "for a GPU, but this run is on the CPU (--device cpu)"), "%s", err);
}

// A prompt file that never ends (/dev/zero) is refused at what the context can hold, at once; a
// FIFO with no writer yet gets a note that the command waits for it, and is read once written.
Test(cli, prompt_input_that_never_ends, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    static char cmd[16384];
    char name[64], errf[4096], fifo[4096];
    snprintf(name, sizeof name, "cli-zero-%d.err", (int)getpid());
    snprintf(errf, sizeof errf, "%s", tt_tmp(name));
    // before the cap this grew by a gigabyte every few seconds: the timeout ends it
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' generate -m '%s' -f /dev/zero --ctx 64 >/dev/null 2>'%s'", bin, m, errf);
    int rc = system(cmd);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "exit %d", WEXITSTATUS(rc));
    char *e = tt_read_file(errf, NULL);
    cr_assert(strstr(e, "offload-run generate: /dev/zero: longer than") && strstr(e, "context of 64 tokens"), "%s", e);
    free(e);

    snprintf(name, sizeof name, "cli-fifo-%d", (int)getpid());
    snprintf(fifo, sizeof fifo, "%s", tt_tmp(name));
    unlink(fifo);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(name, sizeof name, "cli-fifo-%d.err", (int)getpid());
    snprintf(errf, sizeof errf, "%s", tt_tmp(name));
    tt_write_file(errf, "", 0);  // read before the child writes
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fe = open(errf, O_WRONLY), fn = open("/dev/null", O_WRONLY);
        dup2(fe, 2);
        dup2(fn, 1);
        execl(bin, bin, "generate", "-m", m, "-f", fifo, "-n", "2", "--ids", (char *)NULL);
        _exit(127);
    }
    bool waiting = false;
    for (int i = 0; i < 600 && !waiting; i++) {  // up to 60 s for the note
        e = tt_read_file(errf, NULL);
        waiting = strstr(e, "waiting for the prompt on") != NULL;
        free(e);
        if (!waiting) usleep(100000);
    }
    if (!waiting) kill(pid, SIGKILL);
    cr_assert(waiting, "no note while the FIFO has no writer");
    int fd = open(fifo, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "hello there", 11), 11);
    close(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    unlink(fifo);
}

// --stats: the plain-decoding figure of a speculative run says it is a bound from this run's L3
// passes; --kv retrieval reports its budget, chunks and selections.
Test(cli, stats_say_what_they_are) {
    const char *m = tiny_model();
    static char args[8192];
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ignore-eos --ids --spec triforce "
             "--draft-ngram 2 --budget 8 --chunk 4 --stats", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "the mean time of this run's") && strstr(err, "an upper bound, not measured"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -p 'the quick brown fox' -n 16 --ignore-eos --ids --kv retrieval "
             "--budget 8 --chunk 4 --refresh 4 --stats", m);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    // selections: after the 16-token prompt, then every 4 of the 15 tokens run after it
    cr_assert(strstr(err, "retrieval: budget 8 tokens = 2 chunks of 4 per layer and KV head"), "%s", err);
    cr_assert(strstr(err, "4 selections"), "%s", err);
}

// plan from a config.json alone gives the plan of the checkpoint it describes (weights of its
// torch_dtype); a plan for another machine does not take this one's RAM as its host budget; the
// acceptance rates are labelled as assumed.
Test(cli, plan_from_a_config_for_another_machine) {
    const char *m = tiny_model();
    static char args[16384], full[1 << 16], hf[4096], dir[4096], cmd[20480];
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(m) - 5), m);
    char name[64];
    snprintf(name, sizeof name, "cli-config-%d", (int)getpid());
    snprintf(dir, sizeof dir, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir '%s' && cp '%s/config.json' '%s/'", dir, dir, hf, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "plan -m '%s' --ctx 4096 --gpu-mem 8G", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(full, sizeof full, "%s", out);
    cr_assert(strstr(full, "host unlimited"), "%s", full);
    cr_assert(strstr(full, "(assumed)"), "%s", full);
    cr_assert(strstr(err, "acceptance rates are assumed"), "%s", err);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "plan -m '%s%s' --ctx 4096 --gpu-mem 8G", dir, i ? "/config.json" : "");
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
        cr_assert_str_eq(out, full);
        cr_assert(strstr(err, "planning from") && strstr(err, "alone: weights of f16"), "%s", err);
    }
    snprintf(args, sizeof args, "plan -m '%s' --ctx 4096 --gpu-mem 8G --host-mem 64G", dir);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "host 64.00 GiB"), "%s", out);
    // the weights' type follows torch_dtype; one the planner does not know is named
    snprintf(cmd, sizeof cmd, "sed -i 's/\"float16\"/\"bfloat16\"/' '%s/config.json'", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "plan -m '%s'", dir);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "weights bf16"), "%s", out);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"bfloat16\"/\"int3\"/' '%s/config.json'", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "torch_dtype 'int3'") && strstr(err, "config.json"), "%s", err);
}

// chat reading from a pipe with nothing in it yet says that it waits for the first turn.
Test(cli, chat_says_it_waits_for_its_input, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    char name[64], errf[4096];
    snprintf(name, sizeof name, "cli-chatwait-%d.err", (int)getpid());
    snprintf(errf, sizeof errf, "%s", tt_tmp(name));
    tt_write_file(errf, "", 0);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fe = open(errf, O_WRONLY), fn = open("/dev/null", O_WRONLY);
        dup2(fds[0], 0);
        close(fds[1]);
        dup2(fe, 2);
        dup2(fn, 1);
        execl(bin, bin, "chat", "-m", m, "--chat-format", "chatml", "-n", "2", (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    bool waiting = false;
    for (int i = 0; i < 600 && !waiting; i++) {
        char *e = tt_read_file(errf, NULL);
        waiting = strstr(e, "offload-run chat: waiting for the first turn on stdin") != NULL;
        free(e);
        if (!waiting) usleep(100000);
    }
    if (!waiting) kill(pid, SIGKILL);
    cr_assert(waiting, "no note while stdin is an empty pipe");
    cr_assert_eq(write(fds[1], "hi\n", 3), 3);
    close(fds[1]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
}

// An IQ4_XS model (every matrix IQ4_XS, the norms f32): info names the type in its totals and per
// tensor, with IQ4_XS's 136 bytes per 256 weights, and generate runs it.
Test(cli, info_and_generate_iq4_xs) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    char name[64], gguf[4096], cmd[16384], args[8192];
    snprintf(name, sizeof name, "cli-iq4xs-%d.gguf", (int)getpid());
    snprintf(gguf, sizeof gguf, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd,
             "'%s' --embd 256 --ff 512 --heads 4 --head-dim 64 --gguf-dtype iq4_xs --out-gguf '%s' >/dev/null", gen,
             gguf);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "info -m '%s' --tensors", gguf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, " f32: 5 (0.0 MiB) iq4_xs: 16 (0.7 MiB)"), "%s", out);
    // 512 x 256 weights: 512 rows of one super-block of 136 bytes
    cr_assert(has_line(out, "blk.1.ffn_up.weight                      iq4_xs 512 x 256                69632"), "%s",
              out);
    snprintf(args, sizeof args, "generate -m '%s' -p hello -n 4 --temp 0", gguf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    remove(gguf);
}

// Several prompts (-f repeated, --prompts FILE.jsonl) run as a batch: each output under its own
// header is, token for token, what generate prints for that prompt alone.
Test(cli, generate_several_prompts_as_a_batch, .timeout = TT_TIMEOUT(120)) {
    const char *m = tiny_model();
    static char args[1 << 15], want[3][1 << 16], files[3][4096], jsonl[4096];
    const char *texts[3] = {"the quick brown fox", "a much longer prompt than the others, to pack beside them", "hi"};
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "cli-several-%d-%d.txt", (int)getpid(), i);
        snprintf(files[i], sizeof files[i], "%s", tt_tmp(name));
        FILE *f = fopen(files[i], "w");
        cr_assert(f);
        fputs(texts[i], f);
        fclose(f);
        snprintf(args, sizeof args, "generate -m '%s' -f '%s' -n 12 --ids --ignore-eos --batch 8", m, files[i]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
        snprintf(want[i], sizeof want[i], "%s", out);
    }
    snprintf(args, sizeof args, "generate -m '%s' -f '%s' -f '%s' -f '%s' -n 12 --ids --ignore-eos --batch 8 --stats",
             m, files[0], files[1], files[2]);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    static char expect[1 << 18];
    size_t at = 0;
    for (int i = 0; i < 3; i++)
        at += (size_t)snprintf(expect + at, sizeof expect - at, "%s==> %s <==\n%s", i ? "\n" : "", files[i], want[i]);
    cr_assert_str_eq(out, expect);
    cr_assert(strstr(err, "prompts: 3, ") && strstr(err, "generated: 36 tokens in 11 batched passes"), "%s", err);
    // --weights-from-disk alone streams that many layers, as for one prompt (the engine options'
    // module applies it to a batch too; before, the batch's sessions refused it); the CPU ignores both
    snprintf(args, sizeof args, "generate -m '%s' -f '%s' -f '%s' -f '%s' -n 12 --ids --ignore-eos --batch 8 --device "
             "cpu --weights-from-disk 2", m, files[0], files[1], files[2]);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, expect);
    // the same prompts from a JSONL file (a blank line, members besides "prompt" ignored)
    snprintf(jsonl, sizeof jsonl, "%s", tt_tmp("cli-several.jsonl"));
    FILE *f = fopen(jsonl, "w");
    cr_assert(f);
    fprintf(f, "{\"prompt\": \"%s\"}\n\n{\"id\": 7, \"prompt\": \"%s\"}\n", texts[1], texts[2]);
    fclose(f);
    snprintf(args, sizeof args, "generate -m '%s' --prompts '%s' -n 12 --ids --ignore-eos --batch 8", m, jsonl);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(expect, sizeof expect, "==> %.48s:1 <==\n%s\n==> %.48s:3 <==\n%s", jsonl, want[1], jsonl, want[2]);
    cr_assert_str_eq(out, expect);
    // bad lines and options that do not apply
    f = fopen(jsonl, "w");
    cr_assert(f);
    fputs("{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "generate -m '%s' --prompts '%s'", m, jsonl);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "line 2: want an object with a string \"prompt\""), "%s", err);
    f = fopen(jsonl, "w");
    cr_assert(f);
    fputs("{\"prompt\": \"unterminated\n", f);
    fclose(f);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "line 1: not a JSON object"), "%s", err);
    snprintf(args, sizeof args, "generate -m '%s' -f '%s' -f '%s' --stop x", m, files[0], files[1]);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "several prompts run as a batch: --stop does not apply"), "%s", err);
    // --json: the batch's figures and each prompt's (it was refused with several prompts: issue 41)
    char json[4096];
    snprintf(json, sizeof json, "%s", tt_tmp("cli-several.json"));
    unlink(json);
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args,
                 "generate -m '%s' -f '%s' -f '%s' -f '%s' -n 12 --ids --ignore-eos --batch 8 %s"
                 "--json '%s'",
                 m, files[0], files[1], files[2], k ? "--spec draft --draft-ngram 2 " : "", json);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
        char *text = tt_read_file(json, NULL);
        struct json_object *root = json_tokener_parse(text), *v, *outs;
        cr_assert(root, "--json wrote no JSON: %s", text);
        cr_assert(json_object_object_get_ex(root, "command", &v) && !strcmp(json_object_get_string(v), "generate"));
        cr_assert(json_object_object_get_ex(root, "prompts", &v) && json_object_get_int(v) == 3, "%s", text);
        cr_assert(json_object_object_get_ex(root, "generated_tokens", &v) && json_object_get_int(v) == 36, "%s", text);
        cr_assert(json_object_object_get_ex(root, "outputs", &outs) && json_object_array_length(outs) == 3, "%s", text);
        for (int i = 0; i < 3; i++) {
            struct json_object *o = json_object_array_get_idx(outs, (size_t)i);
            cr_assert(json_object_object_get_ex(o, "source", &v) && !strcmp(json_object_get_string(v), files[i]));
            cr_assert(json_object_object_get_ex(o, "generated_tokens", &v) && json_object_get_int(v) == 12, "%s", text);
            cr_assert(json_object_object_get_ex(o, "stop_reason", &v) && !strcmp(json_object_get_string(v), "length"),
                      "%s", text);
            cr_assert(json_object_object_get_ex(o, "text", &v), "%s", text);
        }
        json_object_put(root);
        free(text);
    }
    unlink(json);
    // --spec: one engine per prompt, generating together; greedy, each prints plain decoding's tokens
    const char *specs[2] = {"--spec draft --draft-ngram 2", "--spec triforce --draft-layers 0 --budget 8 --chunk 4"};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "generate -m '%s' -f '%s' -f '%s' -f '%s' -n 12 --ids --ignore-eos --batch 8 %s",
                 m, files[0], files[1], files[2], specs[k]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", specs[k], err);
        at = 0;
        for (int i = 0; i < 3; i++)
            at += (size_t)snprintf(expect + at, sizeof expect - at, "%s==> %s <==\n%s", i ? "\n" : "", files[i],
                                   want[i]);
        cr_assert_str_eq(out, expect, "%s", specs[k]);
        cr_assert(strstr(err, "generated: 36 tokens, "), "%s", err);
    }
}

// `template`: the model's own template (Llama-3.1's, from tokenizer_config.json) run over messages
// with a tool call and a tool result and over tools, byte for byte as jinja2 renders it
// (tests/fixtures/chat-templates/goldens.json); and its usage and file errors.
Test(cli, template_renders_the_models_template_as_jinja2) {
    tiny_model();
    char hf[4096], path[4200], name[64];
    snprintf(name, sizeof name, "cli-tiny-%d.hf", (int)getpid());
    snprintf(hf, sizeof hf, "%s", tt_tmp(name));
    const char *src = getenv("TRI_TEST_SRC");
    cr_assert(src);
    char rel[4096];
    snprintf(rel, sizeof rel, "%s/fixtures/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja", src);
    char *tmpl = tt_read_file(rel, NULL);
    snprintf(rel, sizeof rel, "%s/fixtures/chat-templates/goldens.json", src);
    char *gtext = tt_read_file(rel, NULL);
    struct json_object *g = json_tokener_parse(gtext), *ctx = NULL;
    free(gtext);
    const char *want = NULL;
    struct json_object *ts = json_object_object_get(g, "templates");
    for (size_t i = 0; i < json_object_array_length(ts); i++) {
        struct json_object *t = json_object_array_get_idx(ts, i), *cs = json_object_object_get(t, "cases");
        if (strcmp(json_object_get_string(json_object_object_get(t, "template")),
                   "meta-llama-Llama-3.1-8B-Instruct.jinja"))
            continue;
        for (size_t k = 0; k < json_object_array_length(cs); k++) {
            struct json_object *c = json_object_array_get_idx(cs, k);
            if (strcmp(json_object_get_string(json_object_object_get(c, "name")), "tools-gen-tools") == 0) {
                ctx = json_object_object_get(c, "context");
                want = json_object_get_string(json_object_object_get(c, "output"));
            }
        }
    }
    cr_assert(ctx && want);
    struct json_object *cfg = json_object_new_object();
    json_object_object_add(cfg, "chat_template", json_object_new_string(tmpl));
    json_object_object_add(cfg, "bos_token", json_object_new_string("<s>"));
    json_object_object_add(cfg, "eos_token", json_object_new_string("</s>"));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", hf);
    const char *js = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN);
    tt_write_file(path, js, strlen(js));
    char msgs[4200], tools[4200];
    snprintf(msgs, sizeof msgs, "%s/messages.json", hf);
    snprintf(tools, sizeof tools, "%s/tools.json", hf);
    js = json_object_to_json_string_ext(json_object_object_get(ctx, "messages"), JSON_C_TO_STRING_PLAIN);
    tt_write_file(msgs, js, strlen(js));
    js = json_object_to_json_string_ext(json_object_object_get(ctx, "tools"), JSON_C_TO_STRING_PLAIN);
    tt_write_file(tools, js, strlen(js));

    char args[16384];
    snprintf(args, sizeof args, "template -m '%s' --messages '%s' --tools '%s'", hf, msgs, tools);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, want);
    // the same conversation through `generate --chat` is refused by nothing: the format is jinja
    snprintf(args, sizeof args, "generate -m '%s' --chat -p hi -n 1", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    // a built-in format takes no tools
    snprintf(args, sizeof args, "template -m '%s' --messages '%s' --tools '%s' --chat-format llama3", hf, msgs, tools);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "tools need the model's template"), "%s", err);
    // errors name the file and the problem
    tt_write_file(msgs, "[{\"content\": \"x\"}]", 18);
    snprintf(args, sizeof args, "template -m '%s' --messages '%s'", hf, msgs);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "messages: item 0 is not an object with a string 'role'"), "%s", err);
    snprintf(args, sizeof args, "template -m '%s' --messages /no/such/file.json", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "/no/such/file.json"), "%s", err);
    cr_assert_eq(cli("template --messages x.json", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "-m MODEL is required"), "%s", err);
    snprintf(args, sizeof args, "template -m '%s' --chat-format vicuna", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--chat-format 'vicuna'"), "%s", err);
    // the template's own refusal (raise_exception) is the error
    json_object_object_add(cfg, "chat_template", json_object_new_string("{{ raise_exception('no way') }}"));
    js = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN);
    tt_write_file(path, js, strlen(js));
    snprintf(args, sizeof args, "template -m '%s'", hf);
    cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "tokenizer_config.json: chat template: line 1, column 19: raise_exception: no way"), "%s",
              err);
    json_object_put(cfg);
    json_object_put(g);
    free(tmpl);
}
