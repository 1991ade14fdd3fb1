// test-gen-model.c - tri-gen-model writes the same model as GGUF and HF, checked by Python.
//
// Each test runs the generator with one option set into $TRI_TEST_TMP, then runs
// tests/fixtures/check-gen-model.py, which reads both outputs with the gguf, safetensors and
// tokenizers packages only and compares them tensor by tensor and key by key with the options.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test-util.h"

// Runs a shell command; returns its exit status, or -1 if it did not exit normally.
static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Generates into $TRI_TEST_TMP/gen-<tag>.{gguf,hf} with opts and checks the pair.
static void gen_and_check(const char *tag, const char *opts) {
    const char *gen = getenv("TRI_GEN_MODEL");
    const char *py = tt_python("fixtures/check-gen-model.py");
    const char *src = getenv("TRI_TEST_SRC");
    cr_assert(gen && py && src, "TRI_GEN_MODEL, TRI_TEST_PYTHON, TRI_TEST_SRC: run through meson test");
    char name[128], gguf[4096], hf[4096], cmd[16384];
    snprintf(name, sizeof name, "gen-%s.gguf", tag);
    snprintf(gguf, sizeof gguf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "gen-%s.hf", tag);
    snprintf(hf, sizeof hf, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", gguf, hf);
    cr_assert_eq(run(cmd), 0);

    snprintf(cmd, sizeof cmd, "'%s' %s --out-gguf '%s' --out-hf '%s'", gen, opts, gguf, hf);
    cr_assert_eq(run(cmd), 0, "generator failed: %s", cmd);
    snprintf(cmd, sizeof cmd, "'%s' '%s/fixtures/check-gen-model.py' '%s' '%s' %s", py, src, gguf, hf, opts);
    cr_assert_eq(run(cmd), 0, "checker found differences: %s", cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", gguf, hf);
    run(cmd);
}

Test(gen_model, tiny_defaults) { gen_and_check("tiny", ""); }
Test(gen_model, gqa_q4_1_f32) { gen_and_check("gqa", "--heads 8 --kv-heads 2 --head-dim 8 --dtype f32 --gguf-dtype q4_1"); }
// K-quants: the HF values are our dequantization of the GGUF's blocks, which the checker compares
// with the gguf package's
Test(gen_model, k_quants_f32) {
    gen_and_check("q4k", "--heads 4 --kv-heads 2 --head-dim 64 --embd 256 --ff 512 --dtype f32 --gguf-dtype q4_K");
    gen_and_check("q6k", "--heads 4 --kv-heads 2 --head-dim 64 --embd 256 --ff 512 --dtype f32 --gguf-dtype q6_K");
    gen_and_check("iq4xs", "--heads 4 --kv-heads 2 --head-dim 64 --embd 256 --ff 512 --dtype f32 --gguf-dtype iq4_xs");
}
Test(gen_model, tied_yarn_bf16_3_shards) {
    gen_and_check("yarn", "--tied --rope-scaling yarn --rope-factor 8 --ctx 2048 --dtype bf16 --shards 3");
}
Test(gen_model, llama3_q8_0) { gen_and_check("llama3", "--rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 128 --gguf-dtype q8_0"); }
Test(gen_model, linear_q4_0_bf16) { gen_and_check("linear", "--rope-scaling linear --rope-factor 2 --gguf-dtype q4_0 --dtype bf16"); }
Test(gen_model, dynamic_mha_small_vocab) {
    gen_and_check("dynamic", "--rope-scaling dynamic --heads 2 --kv-heads 2 --head-dim 32 --vocab 270 --layers 1 --seed 7");
}
Test(gen_model, smollm2_shape_one_layer) { gen_and_check("smollm2", "--shape smollm2-135m --layers 1 --vocab 1024"); }

// The same seed gives the same bytes; another seed different ones.
Test(gen_model, deterministic) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    char a[4096], b[4096], c[4096], cmd[16384];
    snprintf(a, sizeof a, "%s", tt_tmp("det-a.gguf"));
    snprintf(b, sizeof b, "%s", tt_tmp("det-b.gguf"));
    snprintf(c, sizeof c, "%s", tt_tmp("det-c.gguf"));
    snprintf(cmd, sizeof cmd, "'%s' --seed 5 --out-gguf '%s' && '%s' --seed 5 --out-gguf '%s' && '%s' --seed 6 --out-gguf '%s'",
             gen, a, gen, b, gen, c);
    cr_assert_eq(run(cmd), 0);
    size_t na, nb, nc;
    char *da = tt_read_file(a, &na), *db = tt_read_file(b, &nb), *dc = tt_read_file(c, &nc);
    cr_assert(na == nb && memcmp(da, db, na) == 0, "same seed, different files");
    cr_assert(na == nc && memcmp(da, dc, na) != 0, "different seeds, same file");
    free(da);
    free(db);
    free(dc);
    remove(a);
    remove(b);
    remove(c);
}

// Bad options fail with a message and exit status 1, before writing anything.
Test(gen_model, rejects_bad_options) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    const char *bad[] = {"--heads 4 --kv-heads 3", "--head-dim 15", "--vocab 100", "--gguf-dtype q4_0 --embd 48",
                         "--rope-scaling ntk", "--dtype q8_0", "--shards 1000", "--bogus 1", "--ctx -5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "'%s' %s --out-gguf '%s' 2>/dev/null", gen, bad[i], tt_tmp("bad.gguf"));
        cr_assert_eq(run(cmd), 1, "accepted: %s", bad[i]);
    }
}

// The 7B shape is only sized, never written: 6.74 B parameters, 13.5 GB in f16.
Test(gen_model, llama2_7b_dry_run) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' --shape llama2-7b --dry-run | grep -qx 'params 6738415616'", gen);
    cr_assert_eq(run(cmd), 0, "llama2-7b should have 6738415616 parameters");
}
