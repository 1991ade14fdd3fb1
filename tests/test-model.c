// test-model.c - tri_model_load on models that are broken one way at a time.
//
// Each case generates a seeded model with tri-gen-model (tiny shape: vocab 384, hidden 64,
// feed-forward 160, 2 layers, 4 heads, 2 KV heads, head_dim 16; the HF half in 3 shards), breaks
// one thing in it with tests/fixtures/edit-model.py (the safetensors and gguf packages, not our
// code), and checks the status and that the message names the file, the field and the problem.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test-util.h"
#include "triforce.h"

static int run(const char *cmd) {
    int rc = system(cmd);
    cr_assert(rc != -1, "system(%s) failed", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

typedef struct model_pair {
    char gguf[4096], hf[4096];  // the generated files; the test edits copies or these
} model_pair;

// Generates the tiny model (plus generator options opts) as GGUF and as a 3-shard HF directory
// under a per-test name.
static void generate(model_pair *mp, const char *tag, const char *opts) {
    const char *gen = getenv("TRI_GEN_MODEL");
    cr_assert(gen, "TRI_GEN_MODEL is not set: run through meson test");
    char name[128], cmd[20480];
    // Criterion runs tests in parallel processes: every scratch name carries the pid
    snprintf(name, sizeof name, "model-%s-%d.gguf", tag, (int)getpid());
    snprintf(mp->gguf, sizeof mp->gguf, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "model-%s-%d.hf", tag, (int)getpid());
    snprintf(mp->hf, sizeof mp->hf, "%s", tt_tmp(name));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && '%s' --shards 3 %s --out-gguf '%s' --out-hf '%s' >/dev/null",
             mp->gguf, mp->hf, gen, opts, mp->gguf, mp->hf);
    cr_assert_eq(run(cmd), 0, "generator failed: %s", cmd);
}

// Runs tests/fixtures/edit-model.py with args (already quoted as needed).
static void edit(const char *args) {
    const char *py = tt_python("fixtures/edit-model.py"), *src = getenv("TRI_TEST_SRC");
    cr_assert(py && src, "TRI_TEST_PYTHON, TRI_TEST_SRC: run through meson test");
    char cmd[20480];
    snprintf(cmd, sizeof cmd, "'%s' '%s/fixtures/edit-model.py' %s", py, src, args);
    cr_assert_eq(run(cmd), 0, "edit failed: %s", cmd);
}

// Loads path, expecting status want and a message that contains every one of parts (NULL-ended).
static void load_fails(const char *path, tri_status want, const char *const *parts) {
    tri_model *m = (tri_model *)1;
    tri_status st = tri_model_load(path, NULL, &m);
    cr_assert_eq(st, want, "%s: status %s, want %s: %s", path, tri_status_str(st), tri_status_str(want),
                 tri_last_error());
    cr_assert_null(m, "no model on failure");
    const char *msg = tri_last_error();
    for (int i = 0; parts[i]; i++) cr_assert(strstr(msg, parts[i]), "%s: no '%s' in: %s", path, parts[i], msg);
}

// The file name of path (what messages must contain, whatever directory the tests run in).
static const char *base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void load_ok(const char *path) {
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s: %s", path, tri_last_error());
    tri_model_free(m);
}

// ---- shapes that disagree with the config ----

Test(model, hf_shape_names_shard_tensor_and_config_key) {
    model_pair mp;
    generate(&mp, "ff", "");
    load_ok(mp.hf);
    char args[16384], idx[4200];
    snprintf(args, sizeof args, "config '%s' intermediate_size=170", mp.hf);
    edit(args);
    const char *parts[] = {"-of-00003.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight'",
                           "shape (160, 64), config wants (170, 64)", "intermediate_size = 170",
                           "/config.json", NULL};
    load_fails(mp.hf, TRI_STATUS_BAD_FORMAT, parts);
    // the same through the index file
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", mp.hf);
    load_fails(idx, TRI_STATUS_BAD_FORMAT, parts);

    // KV heads: the size is a product, and both factors are named
    snprintf(args, sizeof args, "config '%s' intermediate_size=160 num_key_value_heads=4", mp.hf);
    edit(args);
    const char *kv[] = {"tensor 'model.layers.0.self_attn.k_proj.weight'", "shape (32, 64), config wants (64, 64)",
                        "num_key_value_heads x head_dim = 4 x 16", NULL};
    load_fails(mp.hf, TRI_STATUS_BAD_FORMAT, kv);
}

Test(model, gguf_shape_names_the_key) {
    model_pair mp;
    generate(&mp, "ff-gguf", "");
    char args[16384], bad[4200];
    snprintf(bad, sizeof bad, "%s.ff.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --set llama.feed_forward_length=170", mp.gguf, bad);
    edit(args);
    const char *parts[] = {base(bad), ": tensor 'blk.0.ffn_gate.weight': shape (160, 64), config wants (170, 64)",
                           "llama.feed_forward_length = 170", NULL};
    load_fails(bad, TRI_STATUS_BAD_FORMAT, parts);

    snprintf(args, sizeof args, "gguf '%s' '%s' --set llama.embedding_length=48", mp.gguf, bad);
    edit(args);
    const char *embd[] = {"tensor 'token_embd.weight': shape (384, 64), config wants (384, 48)",
                          "(llama.embedding_length = 48)", NULL};
    load_fails(bad, TRI_STATUS_BAD_FORMAT, embd);
}

// ---- missing tensors ----

Test(model, hf_missing_tensor_is_named_as_hf_names_it) {
    model_pair mp;
    generate(&mp, "drop", "");
    char args[16384];
    snprintf(args, sizeof args, "safetensors '%s' --drop model.layers.1.mlp.down_proj.weight", mp.hf);
    edit(args);
    const char *parts[] = {base(mp.hf), "tensor 'model.layers.1.mlp.down_proj.weight' is missing",
                           "num_hidden_layers = 2", "/config.json", NULL};
    load_fails(mp.hf, TRI_STATUS_NOT_FOUND, parts);
}

Test(model, more_layers_in_config_than_in_file) {
    model_pair mp;
    generate(&mp, "layers", "");
    char args[16384];
    snprintf(args, sizeof args, "config '%s' num_hidden_layers=3", mp.hf);
    edit(args);
    const char *hf[] = {"tensor 'model.layers.2.input_layernorm.weight' is missing", "num_hidden_layers = 3", NULL};
    load_fails(mp.hf, TRI_STATUS_NOT_FOUND, hf);
    // a count no file could hold fails the same way, before anything is sized by it
    snprintf(args, sizeof args, "config '%s' num_hidden_layers=2000000000", mp.hf);
    edit(args);
    const char *huge[] = {"tensor 'model.layers.2.input_layernorm.weight' is missing",
                          "num_hidden_layers = 2000000000", NULL};
    load_fails(mp.hf, TRI_STATUS_NOT_FOUND, huge);

    char bad[4200];
    snprintf(bad, sizeof bad, "%s.drop.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --drop blk.1.ffn_down.weight", mp.gguf, bad);
    edit(args);
    const char *gguf[] = {base(bad), "tensor 'blk.1.ffn_down.weight' is missing (llama.block_count = 2)", NULL};
    load_fails(bad, TRI_STATUS_NOT_FOUND, gguf);
}

// ---- tensors the config does not account for ----

Test(model, extra_layers_are_refused) {
    model_pair mp;
    generate(&mp, "extra", "");
    char args[16384], bad[4200];
    snprintf(args, sizeof args, "config '%s' num_hidden_layers=1", mp.hf);
    edit(args);
    const char *hf[] = {"-of-00003.safetensors: tensor 'model.layers.1.", "layer 1 is beyond num_hidden_layers = 1",
                        "/config.json", NULL};
    load_fails(mp.hf, TRI_STATUS_BAD_FORMAT, hf);

    snprintf(bad, sizeof bad, "%s.extra.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --set llama.block_count=1", mp.gguf, bad);
    edit(args);
    const char *gguf[] = {base(bad), ": tensor 'blk.1.", "layer 1 is beyond llama.block_count = 1", NULL};
    load_fails(bad, TRI_STATUS_BAD_FORMAT, gguf);
}

Test(model, biases_are_refused_by_name) {
    model_pair mp;
    generate(&mp, "bias", "");
    char args[16384], bad[4200];
    snprintf(args, sizeof args, "safetensors '%s' --add model.layers.0.self_attn.q_proj.bias=64", mp.hf);
    edit(args);
    const char *hf[] = {"model-00001-of-00003.safetensors: tensor 'model.layers.0.self_attn.q_proj.bias'",
                        "biases are unsupported", NULL};
    load_fails(mp.hf, TRI_STATUS_UNSUPPORTED, hf);

    snprintf(bad, sizeof bad, "%s.bias.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --add blk.1.ffn_down.bias=64", mp.gguf, bad);
    edit(args);
    const char *gguf[] = {base(bad), ": tensor 'blk.1.ffn_down.bias': biases are unsupported", NULL};
    load_fails(bad, TRI_STATUS_UNSUPPORTED, gguf);
}

// llama.cpp writes Mixtral as llama with llama.expert_count: refused by that key, as a mixture of
// experts, not as a file that lacks ffn_gate.
Test(model, gguf_experts_are_refused_by_key) {
    model_pair mp;
    generate(&mp, "experts", "");
    char args[16384], bad[4200];
    snprintf(bad, sizeof bad, "%s.moe.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --add-u32 llama.expert_count=8", mp.gguf, bad);
    edit(args);
    const char *gguf[] = {base(bad), ": key 'llama.expert_count': 8 experts: a mixture of experts is unsupported",
                          NULL};
    load_fails(bad, TRI_STATUS_UNSUPPORTED, gguf);
}

Test(model, unknown_tensors_are_refused_rotary_tables_ignored) {
    model_pair mp;
    generate(&mp, "unknown", "");
    char args[16384];
    // older checkpoints store the rotary table: computed, not a weight, so it is skipped
    snprintf(args, sizeof args, "safetensors '%s' --add model.layers.0.self_attn.rotary_emb.inv_freq=8", mp.hf);
    edit(args);
    load_ok(mp.hf);
    snprintf(args, sizeof args, "safetensors '%s' --add model.layers.0.self_attn.q_norm.weight=16", mp.hf);
    edit(args);
    const char *parts[] = {"model-00001-of-00003.safetensors: tensor 'model.layers.0.self_attn.q_norm.weight'",
                           "not a weight of the llama architecture", NULL};
    load_fails(mp.hf, TRI_STATUS_UNSUPPORTED, parts);

    // a copy of the embedding as lm_head beside tie_word_embeddings: transformers ties it on
    // load, so it is skipped with a warning
    generate(&mp, "tied", "--tied");
    snprintf(args, sizeof args, "safetensors '%s' --add lm_head.weight=384x64", mp.hf);
    edit(args);
    tri_model *m;
    cr_assert_eq(tri_model_load(mp.hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri_model_info info;
    tri_model_get_info(m, &info);
    cr_assert(info.config.tied_embeddings);
    tri_model_free(m);
}

// ---- tokenizers larger than the vocabulary ----

Test(model, tokenizer_larger_than_vocab) {
    model_pair mp;
    generate(&mp, "vocab", "");
    char args[16384], bad[4200];
    snprintf(args, sizeof args, "tokenizer '%s' 2", mp.hf);
    edit(args);
    const char *hf[] = {"/tokenizer.json: 386 tokens, more than vocab_size = 384", "/config.json", NULL};
    load_fails(mp.hf, TRI_STATUS_BAD_FORMAT, hf);

    snprintf(bad, sizeof bad, "%s.vocab.gguf", mp.gguf);
    snprintf(args, sizeof args, "gguf '%s' '%s' --extra-tokens 3", mp.gguf, bad);
    edit(args);
    const char *gguf[] = {base(bad), ": key 'tokenizer.ggml.tokens': 387 tokens, more than llama.vocab_size = 384",
                          NULL};
    load_fails(bad, TRI_STATUS_BAD_FORMAT, gguf);
}
