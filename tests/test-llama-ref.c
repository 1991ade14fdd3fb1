// test-llama-ref.c - the Python reference forward pass (tests/reference/llama_ref.py) is sound.
//
// It produces the golden logits of the CPU forward-pass tests, so it is checked here on models from
// tri-gen-model: tests/reference/check_llama_ref.py tests its self-consistency (prompt vs
// incremental decoding, GQA vs MHA, HF vs GGUF rope layouts, rope tables vs published formulas),
// and the command line is checked for the file format the C tests read.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test-util.h"

static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Writes a model with opts into $TRI_TEST_TMP/ref-<tag>.{gguf,hf}; paths into gguf and hf.
static void gen(const char *tag, const char *opts, char *gguf, char *hf, size_t n) {
    const char *g = getenv("TRI_GEN_MODEL");
    cr_assert(g, "TRI_GEN_MODEL is not set: run through meson test");
    char name[128], cmd[16384];
    snprintf(name, sizeof name, "ref-%s.gguf", tag);
    snprintf(gguf, n, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "ref-%s.hf", tag);
    snprintf(hf, n, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && '%s' %s --out-gguf '%s' --out-hf '%s'", gguf, hf, g, opts, gguf, hf);
    cr_assert_eq(run(cmd), 0, "%s", cmd);
}

static void self_check(const char *tag, const char *opts) {
    const char *py = tt_python("reference/check_llama_ref.py");
    char gguf[4096], hf[4096], cmd[16384];
    gen(tag, opts, gguf, hf, sizeof gguf);
    snprintf(cmd, sizeof cmd, "'%s' '%s/reference/check_llama_ref.py' '%s' '%s'", py, getenv("TRI_TEST_SRC"), hf, gguf);
    cr_assert_eq(run(cmd), 0, "reference self-check failed: %s", cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", gguf, hf);
    run(cmd);
}

Test(llama_ref, gqa_default_rope) { self_check("gqa", ""); }
Test(llama_ref, mha_linear_f32) { self_check("linear", "--kv-heads 4 --rope-scaling linear --rope-factor 2 --dtype f32"); }
Test(llama_ref, tied_yarn_bf16_sharded) { self_check("yarn", "--tied --rope-scaling yarn --rope-factor 8 --ctx 2048 --dtype bf16 --shards 2"); }
Test(llama_ref, llama3) { self_check("llama3", "--rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 128 --head-dim 32 --heads 2 --kv-heads 1"); }
Test(llama_ref, dynamic) {
    // the check keeps its prompt within --ctx: past it, dynamic NTK (in transformers too) rotates
    // cached keys with the base of the step that computed them, so prompt and incremental logits
    // legitimately differ; the grown base is checked against the NTK formula instead
    self_check("dynamic", "--rope-scaling dynamic --rope-factor 2 --ctx 16");
}

// --out writes (n_tokens, n_vocab) f32 logits; --greedy's first id is the argmax of the last row.
Test(llama_ref, command_line) {
    const char *py = tt_python("reference/llama_ref.py");
    char gguf[4096], hf[4096], out[4096], ids[4096], cmd[32768];
    gen("cli", "--seed 3", gguf, hf, sizeof gguf);
    snprintf(out, sizeof out, "%s", tt_tmp("ref-cli-logits.bin"));
    snprintf(ids, sizeof ids, "%s", tt_tmp("ref-cli-ids.txt"));
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/reference/llama_ref.py' --model '%s' --tokens 5,300,7,42,9 --out '%s' --greedy 6 > '%s'", py,
             getenv("TRI_TEST_SRC"), hf, out, ids);
    cr_assert_eq(run(cmd), 0, "%s", cmd);
    const int n_tok = 5, n_vocab = 384;  // the tiny shape
    size_t len;
    float *logits = tt_read_file(out, &len);
    cr_assert_eq(len, (size_t)n_tok * n_vocab * sizeof(float));
    int best = 0;
    for (int i = 0; i < n_tok * n_vocab; i++) cr_assert(isfinite(logits[i]), "logit %d is %g", i, (double)logits[i]);
    for (int v = 1; v < n_vocab; v++)
        if (logits[(n_tok - 1) * n_vocab + v] > logits[(n_tok - 1) * n_vocab + best]) best = v;
    char *text = tt_read_file(ids, NULL);
    int g[6], k = 0;
    for (char *p = text; k < 6; k++) {
        char *end;
        long v = strtol(p, &end, 10);
        cr_assert(end != p, "bad greedy output '%s'", text);
        g[k] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    cr_assert_eq(g[0], best, "first greedy id %d, argmax of the last logits %d", g[0], best);
    for (int i = 0; i < 6; i++) cr_assert(g[i] >= 0 && g[i] < n_vocab);
    free(logits);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s' '%s'", gguf, hf, out, ids);
    run(cmd);
}
