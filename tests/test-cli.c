// test-cli.c - offload-run as a user runs it: exit codes, messages, that every speculative
// mode prints the same greedy tokens as plain decoding, and that tokenize prints HF tokenizers'
// ids (fixtures from tests/fixtures/make-tokenizer.py).
#include <json-c/json.h>
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

// ---- tokenize ----

// An HF checkpoint directory: a generated model whose tokenizer.json is the fixture `name` of
// tests/fixtures/make-tokenizer.py, whose <name>-cases.json hold HF tokenizers' ids.
static const char *tokenizer_model(const char *name) {
    static char dir[4096];
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
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
    cr_assert(strstr(err, "offload-run: tokenize: ") && strstr(err, "no tokenizer"), "%s", err);
    cr_assert(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
}
