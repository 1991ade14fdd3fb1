// test-device.c - choosing the device a session computes on, and a model's weights copied into a
// backend's memory.
//
// No GPU is needed: a CPU backend whose host_memory flag is cleared takes the device path (every
// weight the forward pass reads is copied into one allocation of backend memory), so CI checks
// that path's bookkeeping and that it computes exactly what the mapped weights compute.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "async-backend.h"
#include "backend-select.h"
#include "dtype.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "level.h"
#include "llama.h"
#include "model.h"
#include "placement.h"
#include "spec.h"
#include "test-util.h"
#include "weights.h"

#define N_TOK 20

static const int32_t tokens[N_TOK] = {5, 200, 17, 3, 99, 42, 42, 301, 7, 150, 5, 77, 270, 8, 64, 1, 33, 90, 4, 11};

// A seeded model from tri-gen-model; its GGUF's path.
static const char *gen_model(const char *tag, const char *opts) {
    char name[128];
    snprintf(name, sizeof name, "device-%s", tag);
    return tt_gen_model(name, opts);
}

// Runs tokens through model on be with a fresh full cache; logits (N_TOK, n_vocab) of every one.
static float *forward_all(const tri_model *model, tri__backend *be) {
    const tri_model_config *c = &model->config;
    tri__llama ll;
    tri__kv_store kv;
    cr_assert_eq(tri__llama_init(&ll, model, be, 8), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__kv_store_init(&kv, be, TRI_DTYPE_F16, c->n_layer, c->n_head_kv, c->head_dim, 64),
                 TRI_STATUS_OK, "%s", tri_last_error());
    float *logits = malloc(sizeof(float) * N_TOK * (size_t)c->n_vocab);
    cr_assert(logits);
    cr_assert_eq(tri__llama_forward(&ll, &kv, tokens, N_TOK, TRI_LOGITS_ALL, logits), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri__kv_store_free(&kv);
    tri__llama_free(&ll);
    return logits;
}

static bool inside(const void *p, const tri__tensor *t) {
    return (const char *)p >= (const char *)t->data && (const char *)p < (const char *)t->data + t->n_bytes;
}

// On a backend with host memory the view borrows the mapping: no copy, same pointers.
Test(device, host_backend_uses_the_mapping_in_place) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("host", "--layers 2 --tied"), NULL, &m), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    cr_assert(be->host_memory);
    tri_model *v;
    cr_assert_eq(tri__model_on_backend(m, be, 0, 0, &v), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(v->n_tensors, m->n_tensors);
    for (int64_t i = 0; i < m->n_tensors; i++) cr_assert_eq(v->tensors[i].data, m->tensors[i].data);
    cr_assert_eq(v->layers[1].w_down->data, m->layers[1].w_down->data);
    cr_assert_eq(v->output, v->tok_embd, "tied head stays the embedding entry");
    tri__model_backend_free(v);
    tri__model_backend_free(NULL);
    tri__backend_free(be);
    tri_model_free(m);
}

// The device path: every tensor the forward pass reads is copied (same bytes, new memory), the
// view's tables point at the copies, and the forward pass computes bit for bit the same logits.
static void check_copied_model(const char *tag, const char *opts) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model(tag, opts), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *host, *dev;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &host), TRI_STATUS_OK);
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &dev), TRI_STATUS_OK);
    dev->host_memory = false;
    tri_model *v;
    cr_assert_eq(tri__model_on_backend(m, dev, 0, 0, &v), TRI_STATUS_OK, "%s", tri_last_error());

    const tri__tensor *read[] = {m->tok_embd, m->output_norm, m->output};
    for (size_t i = 0; i < sizeof read / sizeof read[0]; i++) {
        const tri__tensor *src = read[i], *dst = &v->tensors[src - m->tensors];
        cr_assert(dst->data && dst->data != src->data && !inside(dst->data, src), "%s: not copied", src->name);
        cr_assert_eq(memcmp(dst->data, src->data, src->n_bytes), 0, "%s: bytes differ", src->name);
        // the backend's own alignment (64 on the CPU, 256 from cudaMalloc) carries over to each copy
        cr_assert_eq((uintptr_t)dst->data % 64, 0, "%s: copy not aligned", src->name);
    }
    for (int32_t il = 0; il < m->config.n_layer; il++) {
        const tri__layer *a = &m->layers[il], *b = &v->layers[il];
        const tri__tensor *pa[] = {a->attn_norm, a->wq, a->wk, a->wv, a->wo, a->ffn_norm, a->w_gate, a->w_up, a->w_down};
        const tri__tensor *pb[] = {b->attn_norm, b->wq, b->wk, b->wv, b->wo, b->ffn_norm, b->w_gate, b->w_up, b->w_down};
        for (size_t i = 0; i < sizeof pa / sizeof pa[0]; i++) {
            cr_assert_eq(pb[i], &v->tensors[pa[i] - m->tensors], "layer %d: table entry %zu", il, i);
            cr_assert(pb[i]->data != pa[i]->data, "layer %d %s: not copied", il, pa[i]->name);
            cr_assert_eq(memcmp(pb[i]->data, pa[i]->data, pa[i]->n_bytes), 0, "layer %d %s", il, pa[i]->name);
            cr_assert_str_eq(pb[i]->name, pa[i]->name);
        }
    }
    if (m->config.tied_embeddings) cr_assert_eq(v->output, v->tok_embd, "tied head copied once");

    float *want = forward_all(m, host), *got = forward_all(v, dev);
    size_t n = sizeof(float) * N_TOK * (size_t)m->config.n_vocab;
    cr_assert_eq(memcmp(got, want, n), 0, "%s: logits from the copied weights differ", tag);
    free(want);
    free(got);
    tri__model_backend_free(v);
    tri__backend_free(dev);
    tri__backend_free(host);
    tri_model_free(m);
}

Test(device, copied_weights_compute_the_same_f16_gqa) {
    check_copied_model("f16", "--layers 2 --heads 4 --kv-heads 2 --head-dim 16");
}

Test(device, copied_weights_compute_the_same_quantized_tied) {
    check_copied_model("q4", "--layers 3 --gguf-dtype q4_1 --embd 64 --ff 96 --tied");
}

// The self-draft's layer view over a copied model reads the copies.
Test(device, layer_view_over_copied_weights) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("view", "--layers 4"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *dev;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &dev), TRI_STATUS_OK);
    dev->host_memory = false;
    tri_model *v, *lv;
    cr_assert_eq(tri__model_on_backend(m, dev, 0, 0, &v), TRI_STATUS_OK);
    const int32_t keep[2] = {0, 3};
    cr_assert_eq(tri__model_layer_view(v, keep, 2, &lv), TRI_STATUS_OK);
    cr_assert_eq(lv->config.n_layer, 2);
    cr_assert_eq(lv->layers[1].wq->data, v->layers[3].wq->data);
    cr_assert(lv->layers[1].wq->data != m->layers[3].wq->data);
    tri__model_view_free(lv);
    tri__model_backend_free(v);
    tri__backend_free(dev);
    tri_model_free(m);
}

// Device selection through the public API: explicit CPU, AUTO, and a CUDA device that is not there.
Test(device, session_device_selection) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("select", "--layers 1"), NULL, &m), TRI_STATUS_OK);
    tri_session_params sp = tri_session_default_params();
    cr_assert_eq(sp.device_kind, TRI_DEVICE_AUTO);
    sp.n_ctx = 32;
    tri_session *s;
    sp.device_kind = TRI_DEVICE_CPU;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_str_eq(tri_session_device(s), "cpu");
    tri_session_free(s);

    int32_t n_gpu = tri_device_count();
    sp.device_kind = TRI_DEVICE_AUTO;
    if (n_gpu == 0) {  // AUTO on a machine without a GPU is the CPU
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_str_eq(tri_session_device(s), "cpu");
        tri_session_free(s);
    }
    sp.device_kind = TRI_DEVICE_CUDA;
    sp.device = n_gpu;  // one past the last
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_DEVICE);
    cr_assert_null(s);
    char want[32];
    snprintf(want, sizeof want, "cuda:%d", n_gpu);
    cr_assert(strstr(tri_last_error(), want), "error names the device: %s", tri_last_error());
    sp.device = -1;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_DEVICE);
    sp.device_kind = (tri_device_kind)7;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    tri_model_free(m);
}

// ---- the offloaded KV tier (kv-store.h): host regions streamed through two backend buffers ----

static bool collect(int32_t tok, void *user) {
    int32_t **p = user;
    *(*p)++ = tok;
    return true;
}

// Generates n_gen greedy tokens after tokens[0 .. n_prompt) with kv_layers_offloaded = off, and
// checks the logits of a rolled-back continuation too. Writes the tokens and the logits of the
// continuation (N_TOK - 10 rows) into the caller's buffers.
static void run_offloaded(const tri_model *m, int32_t off, int32_t n_batch, int32_t *gen, int32_t n_gen,
                          float *cont, tri_generate_stats *stats) {
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 64;
    sp.n_batch = n_batch;
    sp.kv_layers_offloaded = off;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n_gen;
    gp.stop_at_eos = false;
    int32_t *w = gen;
    cr_assert_eq(tri_generate(s, tokens, 16, &gp, collect, &w, stats), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(w - gen, n_gen);
    // roll back into the prompt and run the rest of the tokens as one batch
    cr_assert_eq(tri_session_truncate(s, 10), TRI_STATUS_OK);
    cr_assert_eq(tri_session_eval(s, tokens + 10, N_TOK - 10, true), TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t V = tri_token_count(m);
    for (int i = 0; i < N_TOK - 10; i++) memcpy(cont + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
    tri_session_free(s);
}

Test(device, offloaded_kv_computes_exactly_the_full_cache) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("off", "--layers 5 --heads 4 --kv-heads 2 --head-dim 16"), NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t V = tri_token_count(m);
    enum { N_GEN = 12 };
    int32_t want_gen[N_GEN], got_gen[N_GEN];
    float *want = malloc(sizeof(float) * (N_TOK - 10) * (size_t)V), *got = malloc(sizeof(float) * (N_TOK - 10) * (size_t)V);
    cr_assert(want && got);
    tri_generate_stats st;
    run_offloaded(m, 0, 5, want_gen, N_GEN, want, &st);
    cr_assert_eq(st.kv_bytes_up, 0);
    cr_assert_eq(st.kv_bytes_down, 0);
    // row: 2 KV heads x 16 dims of f16
    // the figures count decoding only: N_GEN - 1 one-token steps at 16 ..
    const uint64_t row = 2 * 16 * 2;
    uint64_t sum_pos = 0, n_new = N_GEN - 1;
    for (int i = 0; i < N_GEN - 1; i++) sum_pos += 16 + (uint64_t)i;
    const int32_t offs[] = {1, 2, 3, 5};
    for (size_t c = 0; c < sizeof offs / sizeof offs[0]; c++) {
        int32_t off = offs[c];
        run_offloaded(m, off, 5, got_gen, N_GEN, got, &st);
        for (int i = 0; i < N_GEN; i++)
            cr_assert_eq(got_gen[i], want_gen[i], "%d offloaded: token %d: %d vs %d", off, i, got_gen[i], want_gen[i]);
        cr_assert_eq(memcmp(got, want, sizeof(float) * (N_TOK - 10) * (size_t)V), 0,
                     "%d offloaded: logits after the rollback differ", off);
        // every new row of every offloaded layer goes back to host once (K and V)
        cr_assert_eq(st.kv_bytes_down, (uint64_t)off * 2 * row * n_new, "%d offloaded: %llu bytes down", off,
                     (unsigned long long)st.kv_bytes_down);
        // offloaded layer j passes through buffer j % 2: a buffer with one layer keeps it (nothing
        // uploaded after the first, empty pass), one shared by several uploads each of them, its
        // rows before the step, in every pass
        int32_t n0 = (off + 1) / 2, n1 = off / 2, streamed = (n0 > 1 ? n0 : 0) + (n1 > 1 ? n1 : 0);
        uint64_t up = (uint64_t)streamed * 2 * row * sum_pos;
        cr_assert_eq(st.kv_bytes_up, up, "%d offloaded: %llu bytes up, want %llu", off,
                     (unsigned long long)st.kv_bytes_up, (unsigned long long)up);
    }
    free(want);
    free(got);
    tri_model_free(m);
}

Test(device, offloaded_kv_bad_parameters) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("offbad", "--layers 2"), NULL, &m), TRI_STATUS_OK);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 32;
    sp.kv_layers_offloaded = 3;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "kv_layers_offloaded"), "%s", tri_last_error());
    sp.kv_layers_offloaded = -1;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    sp.kv_layers_offloaded = 1;
    sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
    sp.kv_budget = 16;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "retrieval"), "%s", tri_last_error());
    tri_model_free(m);
}

// ---- streamed weights (backend-select.h): blocks packed in host memory, two device buffers ----

Test(device, streamed_weights_compute_the_same) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("stream", "--layers 5 --heads 4 --kv-heads 2 --head-dim 16 --gguf-dtype q8_0"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *host, *dev;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &host), TRI_STATUS_OK);
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &dev), TRI_STATUS_OK);
    dev->host_memory = false;
    float *want = forward_all(m, host);
    size_t n = sizeof(float) * N_TOK * (size_t)m->config.n_vocab;
    for (int32_t k = 1; k <= 5; k++) {
        tri_model *v;
        cr_assert_eq(tri__model_on_backend(m, dev, k, 0, &v), TRI_STATUS_OK, "%s", tri_last_error());
        // a streamed layer's tensors sit in one of two buffers, the same ones for every layer of
        // its parity
        const tri__tensor *a = v->layers[5 - k].wq, *b = k >= 3 ? v->layers[5 - k + 2].wq : NULL;
        cr_assert(a->data && a->data != m->layers[5 - k].wq->data);
        if (b) cr_assert_eq(a->data, b->data, "layers %d and %d share a buffer", 5 - k, 7 - k);
        float *got = forward_all(v, dev);
        cr_assert_eq(memcmp(got, want, n), 0, "%d streamed layers: logits differ", k);
        free(got);
        // forward_all runs 3 steps (8 + 8 + 4 tokens): a buffer with one layer keeps it, the
        // layers of a shared buffer upload in every step
        tri__weight_stream_stats ws;
        tri__model_stream_stats(v, &ws);
        int32_t n0 = (k + 1) / 2, n1 = k / 2, shared = (n0 > 1 ? n0 : 0) + (n1 > 1 ? n1 : 0);
        cr_assert_eq(ws.n_streamed, k);
        cr_assert_eq(ws.n_uploads, 3 * shared + (k - shared), "%d streamed: %lld uploads", k, (long long)ws.n_uploads);
        if (k == 3) {  // a layer view of streamed layers is refused, not computed wrong
            tri_model *lv;
            const int32_t keep[2] = {0, 4};
            cr_assert_eq(tri__model_layer_view(v, keep, 2, &lv), TRI_STATUS_UNSUPPORTED);
        }
        tri__model_backend_free(v);
    }
    tri_model *v;
    cr_assert_eq(tri__model_on_backend(m, dev, 6, 0, &v), TRI_STATUS_INVALID_ARGUMENT);
    free(want);
    tri__backend_free(dev);
    tri__backend_free(host);
    tri_model_free(m);
}

// Rows loaded from host memory reach the view of an offloaded layer and of one on chip alike.
Test(device, kv_store_load_rows) {
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    tri__kv_store kv;
    enum { CAP = 40, KVH = 2, HD = 8, N = 30 };
    cr_assert_eq(tri__kv_store_init_offload(&kv, be, TRI_DTYPE_F32, 3, KVH, HD, CAP, 1), TRI_STATUS_OK, "%s",
                 tri_last_error());
    float k[N][KVH * HD], v[N][KVH * HD], newk[KVH * HD], newv[KVH * HD];
    for (int il = 0; il < 3; il++) {
        for (int i = 0; i < N; i++)
            for (int j = 0; j < KVH * HD; j++) {
                k[i][j] = (float)(il * 1000 + i * 10 + j);
                v[i][j] = -k[i][j];
            }
        cr_assert_eq(tri__kv_store_load_rows(&kv, il, 0, N, k, v), TRI_STATUS_OK);
    }
    cr_assert_eq(tri__kv_store_load_rows(&kv, 1, CAP - 2, 3, k, v), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tri__kv_store_set_len(&kv, N), TRI_STATUS_OK);
    for (int j = 0; j < KVH * HD; j++) newk[j] = newv[j] = 0.5f;
    for (int il = 0; il < 3; il++) {  // a step's write makes the layer's rows current, then its view
        cr_assert_eq(tri__kv_store_write(&kv, il, N, 1, newk, newv), TRI_STATUS_OK, "%s", tri_last_error());
        tri__kv_view view;
        const tri__kv_view *vw = tri__kv_store_view(&kv, il, N + 1, &view);
        for (int h = 0; h < KVH; h++) {
            const tri__kv_span *sp = &vw->spans[vw->head_span[h]];
            cr_assert_eq(sp->n, N + 1);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < HD; j++) {
                    float want = (float)(il * 1000 + i * 10 + h * HD + j);
                    cr_assert_eq(((const float *)sp->k)[i * sp->stride + j], want, "layer %d row %d", il, i);
                    cr_assert_eq(((const float *)sp->v)[i * sp->stride + j], -want, "layer %d row %d", il, i);
                }
            cr_assert_eq(((const float *)sp->k)[N * sp->stride], 0.5f);
        }
    }
    tri__kv_store_free(&kv);
    tri__backend_free(be);
}

// Bandwidth probe: on a CPU backend it times memcpy (a positive figure); a CUDA device that is not
// there is a clear error.
Test(device, host_to_device_bandwidth) {
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    double gbps = -1;
    cr_assert_eq(tri__backend_measure_h2d(be, (uint64_t)8 << 20, &gbps), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(gbps > 0.01 && gbps < 10000, "%g GB/s", gbps);
    tri__backend_free(be);
    int32_t n = tri_device_count();
    cr_assert_eq(tri_device_measure_h2d(n, 0, &gbps), TRI_STATUS_DEVICE);
    cr_assert_eq(gbps, 0.0);
    cr_assert_eq(tri_device_measure_h2d(0, 0, NULL), TRI_STATUS_INVALID_ARGUMENT);
}

// ---- the disk tier (backend-select.h): the last streamed blocks read from the model file ----

// Bytes of the nine tensors of layer il's block.
static uint64_t block_bytes(const tri_model *m, int32_t il) {
    const tri__layer *L = &m->layers[il];
    const tri__tensor *t[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) n += t[i]->n_bytes;
    return n;
}

// Views of m with n_streamed streamed blocks, the last n_disk of them read from the file, compute
// the logits of the resident model bit for bit, and read what the three slots make necessary: a
// slot that only one disk layer uses keeps it after the first pass; the layers of a shared slot
// are read in each of forward_all's three passes.
static void check_disk_tier(tri_model *m, int32_t n_streamed, int32_t n_disk) {
    tri__backend *host, *dev;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &host), TRI_STATUS_OK);
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &dev), TRI_STATUS_OK);
    dev->host_memory = false;
    const int32_t n_layer = m->config.n_layer, first_disk = n_layer - n_disk;
    float *want = forward_all(m, host);
    tri_model *v;
    cr_assert_eq(tri__model_on_backend(m, dev, n_streamed, n_disk, &v), TRI_STATUS_OK, "%s", tri_last_error());
    float *got = forward_all(v, dev);
    size_t n = sizeof(float) * N_TOK * (size_t)m->config.n_vocab;
    cr_assert_eq(memcmp(got, want, n), 0, "%d streamed, %d from disk: logits differ", n_streamed, n_disk);
    int64_t reads = 0;
    uint64_t bytes = 0;
    for (int32_t il = first_disk; il < n_layer; il++) {
        int32_t sharing = 0;  // disk layers in il's slot
        for (int32_t j = first_disk; j < n_layer; j++) sharing += (j - first_disk) % 3 == (il - first_disk) % 3;
        int32_t passes = sharing == 1 ? 1 : 3;
        reads += passes;
        bytes += (uint64_t)passes * block_bytes(m, il);
    }
    tri__weight_stream_stats ws;
    tri__model_stream_stats(v, &ws);
    cr_assert_eq(ws.n_streamed, n_streamed);
    cr_assert_eq(ws.n_disk, n_disk);
    cr_assert_eq(ws.n_reads, reads, "%d from disk: %lld block reads, want %lld", n_disk, (long long)ws.n_reads,
                 (long long)reads);
    cr_assert_eq(ws.bytes_disk, bytes, "%d from disk: %llu bytes, want %llu", n_disk, (unsigned long long)ws.bytes_disk,
                 (unsigned long long)bytes);
    // the reader reads whole pages around each block's tensors (merged when they touch)
    cr_assert(ws.bytes_read >= bytes && ws.bytes_read <= bytes + (uint64_t)reads * 9 * 2 * 4096, "%llu bytes read",
              (unsigned long long)ws.bytes_read);
    // a second run of the same view reads again what shared slots hold, and computes the same
    float *again = forward_all(v, dev);
    cr_assert_eq(memcmp(again, want, n), 0, "%d streamed, %d from disk: second run differs", n_streamed, n_disk);
    free(again);
    free(got);
    free(want);
    tri__model_backend_free(v);
    tri__backend_free(dev);
    tri__backend_free(host);
}

Test(device, disk_tier_computes_the_same_q8_0) {
    tri_model *m;
    const char *path = gen_model("disk-q8", "--layers 5 --heads 4 --kv-heads 2 --head-dim 16 --gguf-dtype q8_0");
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t d = 1; d <= 3; d++) check_disk_tier(m, 3, d);
    check_disk_tier(m, 5, 4);  // two disk layers share a slot: it is refilled every pass
    check_disk_tier(m, 5, 5);  // from the first block on
    tri_model_free(m);
}

Test(device, disk_tier_computes_the_same_f16) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("disk-f16", "--layers 5 --heads 4 --kv-heads 2 --head-dim 16 --dtype f16"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    for (int32_t d = 1; d <= 3; d++) check_disk_tier(m, 3, d);
    tri_model_free(m);
}

// A single-file safetensors checkpoint: its tensors' offsets count from the file's start.
Test(device, disk_tier_safetensors) {
    char hf[4096];
    const char *gguf = gen_model("disk-st", "--layers 4 --heads 4 --kv-heads 2 --head-dim 16");
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    tri_model *m;
    cr_assert_eq(tri_model_load(hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(m->info.n_files, 1);
    check_disk_tier(m, 4, 4);
    tri_model_free(m);
}

Test(device, disk_tier_refused) {
    char hf[4096];
    const char *gguf = gen_model("disk-shards", "--layers 3 --shards 2");
    snprintf(hf, sizeof hf, "%.*s.hf", (int)(strlen(gguf) - 5), gguf);
    tri_model *m, *v;
    cr_assert_eq(tri_model_load(hf, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *host, *dev;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &host), TRI_STATUS_OK);
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &dev), TRI_STATUS_OK);
    dev->host_memory = false;
    cr_assert_eq(tri__model_on_backend(m, dev, 2, 1, &v), TRI_STATUS_UNSUPPORTED);
    cr_assert(strstr(tri_last_error(), "2 shards"), "%s", tri_last_error());
    cr_assert_eq(tri__model_on_backend(m, dev, 2, 0, &v), TRI_STATUS_OK, "%s", tri_last_error());  // host blocks
    tri__model_backend_free(v);
    cr_assert_eq(tri__model_on_backend(m, host, 2, 1, &v), TRI_STATUS_OK, "ignored on host memory: %s",
                 tri_last_error());
    tri__model_backend_free(v);
    cr_assert_eq(tri__model_on_backend(m, dev, 2, 3, &v), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "3 layers read from disk"), "%s", tri_last_error());
    cr_assert_eq(tri__model_on_backend(m, host, 2, -1, &v), TRI_STATUS_INVALID_ARGUMENT);
    tri__backend_free(dev);
    tri__backend_free(host);
    tri_model_free(m);
}

// ---- activation pools (llama.h) ----

// Runs tokens through ll with a fresh full cache of its model; logits of every token.
static float *forward_with(tri__llama *ll, tri__backend *be) {
    const tri_model_config *c = &ll->model->config;
    tri__kv_store kv;
    cr_assert_eq(tri__kv_store_init(&kv, be, TRI_DTYPE_F16, c->n_layer, c->n_head_kv, c->head_dim, 64),
                 TRI_STATUS_OK, "%s", tri_last_error());
    float *logits = malloc(sizeof(float) * N_TOK * (size_t)c->n_vocab);
    cr_assert(logits);
    cr_assert_eq(tri__llama_forward(ll, &kv, tokens, N_TOK, TRI_LOGITS_ALL, logits), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri__kv_store_free(&kv);
    return logits;
}

// Two passes of different shapes share one set of buffers, each sized for the larger; each still
// computes exactly what it computes with buffers of its own, however their calls interleave.
Test(device, activation_pool_shared_exactly) {
    tri_model *big, *small;
    cr_assert_eq(tri_model_load(gen_model("pool-big", "--layers 2 --embd 96 --ff 160 --heads 6 --kv-heads 2"), NULL,
                                &big),
                 TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_model_load(gen_model("pool-small", "--layers 1 --embd 64 --ff 224 --heads 4 --kv-heads 4"),
                                NULL, &small),
                 TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    float *want_big = forward_all(big, be), *want_small = forward_all(small, be);
    tri__act_pool *pool;
    cr_assert_eq(tri__act_pool_create(be, &pool), TRI_STATUS_OK);
    tri__llama a, b;
    cr_assert_eq(tri__llama_init_pooled(&a, big, be, 8, pool), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__llama_init_pooled(&b, small, be, 8, pool), TRI_STATUS_OK, "%s", tri_last_error());
    // not bound yet: no buffers to run in
    tri__kv_store kv;
    cr_assert_eq(tri__kv_store_init(&kv, be, TRI_DTYPE_F16, 2, 2, 16, 64), TRI_STATUS_OK);
    float dummy[1];
    cr_assert_eq(tri__llama_forward(&a, &kv, tokens, 1, TRI_LOGITS_NONE, dummy), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "not bound"), "%s", tri_last_error());
    tri__kv_store_free(&kv);
    cr_assert_eq(tri__act_pool_bind(pool), TRI_STATUS_OK);
    cr_assert(a.x == b.x && a.gate == b.gate && a.att == b.att, "buffers shared");
    // per buffer the larger need, 8 tokens: x, xb, proj 96; q, att 6 x 16 = 96 (big) vs 4 x 16 = 64;
    // k, v 2 x 16 = 32 vs 64; gate, up 224 (small)
    const int64_t want_floats[9] = {96, 96, 96, 64, 64, 96, 96, 224, 224};
    uint64_t want_bytes = 0;
    for (int i = 0; i < 9; i++) want_bytes += ((uint64_t)want_floats[i] * 8 * 4 + 255) / 256 * 256;
    cr_assert_eq(big->config.head_dim, 16);
    cr_assert_eq(small->config.head_dim, 16);
    cr_assert_eq(tri__act_pool_bytes(pool), want_bytes, "%llu bytes, want %llu",
                 (unsigned long long)tri__act_pool_bytes(pool), (unsigned long long)want_bytes);
    for (int round = 0; round < 2; round++) {
        float *got_big = forward_with(&a, be), *got_small = forward_with(&b, be);
        cr_assert_eq(memcmp(got_big, want_big, sizeof(float) * N_TOK * (size_t)big->config.n_vocab), 0);
        cr_assert_eq(memcmp(got_small, want_small, sizeof(float) * N_TOK * (size_t)small->config.n_vocab), 0);
        free(got_big);
        free(got_small);
    }
    tri__llama_free(&b);  // a pass may leave before the pool goes, or after
    tri__act_pool_free(pool);
    tri__llama_free(&a);
    free(want_big);
    free(want_small);
    tri__backend_free(be);
    tri_model_free(small);
    tri_model_free(big);
}

// ---- layer-major prefill (llama.h) ----

// A prompt of two spans (8,192 + 108 tokens) prefilled into a cache with 3 of 4 layers offloaded
// runs layer by layer: the same rows and logits as a cache in memory, bit for bit, and offloaded
// rows move once per span: nothing for the first span (no earlier rows), for the second the 8,192
// rows of each offloaded layer whose buffer does not hold them already (layers 1 and 3: layer 2's
// buffer kept its rows from the first span).
Test(device, layer_major_prefill_exact_and_moves_rows_once_per_span, .timeout = TT_TIMEOUT(120)) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("span", "--layers 4 --ctx 16384"), NULL, &m), TRI_STATUS_OK, "%s",
                 tri_last_error());
    const tri_model_config *c = &m->config;
    enum { NP = 8300 };
    int32_t *toks = malloc(sizeof(int32_t) * (NP + 1));
    for (int i = 0; i <= NP; i++) toks[i] = (int32_t)((i * 7919 + i / 13) % 380) + 3;
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    tri__level_params lp = {.policy = TRI_KV_POLICY_FULL, .n_ctx = 8400, .n_batch = 64, .kv_type = TRI_DTYPE_F16};
    tri__level mem, off;
    cr_assert_eq(tri__level_init(&mem, m, be, &lp), TRI_STATUS_OK, "%s", tri_last_error());
    lp.kv_offloaded = 3;
    cr_assert_eq(tri__level_init(&off, m, be, &lp), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__llama_prefill_step(&mem.ll, &mem.pol), 64, "nothing streams: steps of n_batch");
    cr_assert_eq(tri__llama_prefill_step(&off.ll, &off.pol), 8192);
    cr_assert_eq(tri__level_prefill(&mem, toks, NP), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri__level_prefill(&off, toks, NP), TRI_STATUS_OK, "%s", tri_last_error());
    tri__kv_offload_stats st;
    tri__kv_store_offload_stats(off.pol.kv, &st);
    const int64_t row = tri__kv_store_row_bytes(off.pol.kv);
    cr_assert_eq(st.bytes_up, (uint64_t)(2 * 2 * 8192 * row), "%llu bytes up", (unsigned long long)st.bytes_up);
    cr_assert_eq(st.bytes_down, (uint64_t)(3 * 2 * NP * row), "every new row goes back once");
    // the rows, in memory and offloaded, bit for bit
    size_t bytes = (size_t)(NP * row);
    void *a = malloc(bytes), *b = malloc(bytes);
    for (int32_t il = 0; il < c->n_layer; il++)
        for (int which = 0; which < 2; which++) {
            cr_assert_eq(tri__kv_store_read_rows(mem.pol.kv, il, which, 0, NP, a), TRI_STATUS_OK);
            cr_assert_eq(tri__kv_store_read_rows(off.pol.kv, il, which, 0, NP, b), TRI_STATUS_OK);
            cr_assert_eq(memcmp(a, b, bytes), 0, "layer %d %s", il, which ? "V" : "K");
        }
    // and a decode step after it
    cr_assert_eq(tri__level_eval(&mem, toks + NP, 1, false), TRI_STATUS_OK);
    cr_assert_eq(tri__level_eval(&off, toks + NP, 1, false), TRI_STATUS_OK);
    cr_assert_eq(memcmp(tri__level_logits(&mem, 0), tri__level_logits(&off, 0), sizeof(float) * (size_t)c->n_vocab), 0);
    free(a);
    free(b);
    tri__level_free(&off);
    tri__level_free(&mem);
    tri__backend_free(be);
    free(toks);
    tri_model_free(m);
}

// ---- the asynchronous paths, on a CPU backend with a transfer stream (async-backend.h) ----

// L3 with 3 of 4 layers offloaded and L2 over its rows, driven the way the speculative engine
// drives them (prefill, L2 selecting and drafting, L3 verifying, rollbacks, a second selection),
// every logits row appended to out; returns the rows written.
static int64_t drive_levels(const tri_model *m, tri__backend *be, float *out) {
    const int64_t V = m->config.n_vocab;
    enum { P = 150 };
    int32_t t[P + 64];
    for (int i = 0; i < P + 64; i++) t[i] = (int32_t)((i * 97 + i / 7) % 380) + 3;
    tri__level_params lp = {.policy = TRI_KV_POLICY_FULL, .n_ctx = 256, .n_batch = 16, .kv_type = TRI_DTYPE_F16,
                            .kv_offloaded = 3};
    tri__level l3, l2;
    cr_assert_eq(tri__level_init(&l3, m, be, &lp), TRI_STATUS_OK, "%s", tri_last_error());
    lp.kv_offloaded = 0;
    lp.policy = TRI_KV_POLICY_RETRIEVAL;
    lp.budget = 32;
    lp.chunk = 8;
    lp.kv_source = l3.pol.kv;
    lp.ring = 64;
    cr_assert_eq(tri__level_init(&l2, m, be, &lp), TRI_STATUS_OK, "%s", tri_last_error());
    int64_t rows = 0;
#define KEEP(lv, n)                                                                                \
    do {                                                                                           \
        for (int32_t r_ = 0; r_ < (n); r_++)                                                       \
            memcpy(out + (rows++) * V, tri__level_logits((lv), r_), sizeof(float) * (size_t)V);    \
    } while (0)
    cr_assert_eq(tri__level_prefill(&l3, t, P - 1), TRI_STATUS_OK, "%s", tri_last_error());  // layer-major
    cr_assert_eq(tri__level_adopt(&l2, &l3, P - 1), TRI_STATUS_OK);
    // three rounds: L2 selects (full attention over L3's streamed rows the first time), drafts 4,
    // L3 verifies 5 and keeps 2 of them
    int32_t n = P;
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(tri__level_eval_refresh(&l2, t + tri__level_n_past(&l2), n - tri__level_n_past(&l2)),
                     TRI_STATUS_OK, "%s", tri_last_error());
        KEEP(&l2, 1);
        cr_assert_eq(tri__level_eval(&l2, t + n, 4, true), TRI_STATUS_OK, "%s", tri_last_error());
        KEEP(&l2, 4);
        cr_assert_eq(tri__level_eval(&l3, t + n - 1, 5, true), TRI_STATUS_OK, "%s", tri_last_error());
        KEEP(&l3, 5);
        cr_assert_eq(tri__level_truncate(&l3, n + 2), TRI_STATUS_OK);
        cr_assert_eq(tri__level_truncate(&l2, n + 2), TRI_STATUS_OK);
        n += 3;
    }
#undef KEEP
    tri__level_free(&l2);
    tri__level_free(&l3);
    return rows;
}

// Every logits row bit for bit as on the plain CPU backend, with transfers run as late and as early
// as a GPU may run them: the events order every copy the offloaded cache and L2's reads of it need.
Test(device, async_transfers_offloaded_kv_and_l2_exact) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("async-kv", "--layers 4"), NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    size_t cap = sizeof(float) * 64 * (size_t)m->config.n_vocab;
    float *want = malloc(cap), *got = malloc(cap);
    tri__backend *be;
    cr_assert_eq(tri__backend_cpu_create(1, TRI_CPU_SIMD_AUTO, &be), TRI_STATUS_OK);
    int64_t rows = drive_levels(m, be, want);
    tri__backend_free(be);
    // in both modes with host memory and, as a device, keys summarised by the chunk_mean op
    for (int run = 0; run < 4; run++) {
        cr_assert_eq(async_backend_create(1, (async_mode)(run & 1), &be), TRI_STATUS_OK);
        be->host_memory = run < 2;
        cr_assert_eq(drive_levels(m, be, got), rows);
        cr_assert(async_emu.n_transfers > 0, "the transfer stream was used");
        for (int64_t r = 0; r < rows; r++)
            cr_assert_eq(memcmp(got + r * m->config.n_vocab, want + r * m->config.n_vocab,
                                sizeof(float) * (size_t)m->config.n_vocab),
                         0, "%s, host memory %d: logits row %lld differs", be->ops->name, (int)be->host_memory,
                         (long long)r);
        tri__backend_free(be);
    }
    free(want);
    free(got);
    tri_model_free(m);
}

// Streamed weight blocks and the disk tier through the transfer stream, late and early.
Test(device, async_transfers_streamed_and_disk_weights_exact) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("async-w", "--layers 5 --heads 4 --kv-heads 2 --head-dim 16 --gguf-dtype q8_0"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    tri__backend *host;
    cr_assert_eq(tri__backend_cpu_create(2, TRI_CPU_SIMD_AUTO, &host), TRI_STATUS_OK);
    float *want = forward_all(m, host);
    size_t n = sizeof(float) * N_TOK * (size_t)m->config.n_vocab;
    static const int32_t cases[][2] = {{1, 0}, {3, 0}, {5, 0}, {4, 2}, {5, 5}};
    for (int mode = ASYNC_LATE; mode <= ASYNC_EARLY; mode++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            tri__backend *dev;
            cr_assert_eq(async_backend_create(2, (async_mode)mode, &dev), TRI_STATUS_OK);
            dev->host_memory = false;
            tri_model *v;
            cr_assert_eq(tri__model_on_backend(m, dev, cases[c][0], cases[c][1], &v), TRI_STATUS_OK, "%s",
                         tri_last_error());
            for (int pass = 0; pass < 2; pass++) {
                float *got = forward_all(v, dev);
                cr_assert_eq(memcmp(got, want, n), 0, "%s, %d streamed, %d from disk, pass %d: logits differ",
                             dev->ops->name, cases[c][0], cases[c][1], pass);
                free(got);
            }
            cr_assert(async_emu.n_transfers > 0);
            tri__model_backend_free(v);
            tri__backend_free(dev);
        }
    free(want);
    tri__backend_free(host);
    tri_model_free(m);
}

// The whole speculative engine on the emulated transfer stream: L3's cache with 2 of 3 layers
// offloaded (prefilled layer by layer), L2 over it, and 2 of 3 weight blocks streamed (the backend
// is a "device": host_memory cleared). Greedy output must equal plain decoding's, transfers run
// late or early.
static async_mode factory_mode;
static tri_status async_factory(int32_t n_threads, tri__backend **out) {
    tri_status st = async_backend_create(n_threads, factory_mode, out);
    if (!st) (*out)->host_memory = false;
    return st;
}

// A speculative engine of m on the asynchronous CPU backend (transfers late or early) generates
// plain decoding's greedy tokens want (n_gen after prompt); its figures in *st, and the copies it
// queued on the transfer stream in *n_transfers (read before the engine's backend goes).
static void spec_async_greedy(const tri_model *m, const tri_session_params *sp, const tri_spec_params *p,
                              async_mode mode, const int32_t *prompt, int32_t n_prompt,
                              const tri_generate_params *gp, const int32_t *want, int32_t n_gen, tri_spec_stats *st,
                              long *n_transfers) {
    factory_mode = mode;
    tri__backend_cpu_factory = async_factory;
    tri_spec *e;
    cr_assert_eq(tri_spec_create(m, sp, p, &e), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *got = malloc(sizeof *got * (size_t)n_gen), *g = got;
    cr_assert_eq(tri_generate_spec(e, prompt, n_prompt, gp, collect, &g, st), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(g - got, n_gen);
    for (int i = 0; i < n_gen; i++)
        cr_assert_eq(got[i], want[i], "%s: token %d: %d vs plain %d", mode == ASYNC_EARLY ? "early" : "late", i,
                     got[i], want[i]);
    free(got);
    *n_transfers = async_emu.n_transfers;
    tri_spec_free(e);
    tri__backend_cpu_factory = NULL;
}

Test(device, async_transfers_whole_engine_greedy) {
    tri_model *m, *d;
    cr_assert_eq(tri_model_load(gen_model("async-e", "--layers 3 --vocab 300 --seed 9"), NULL, &m), TRI_STATUS_OK);
    cr_assert_eq(tri_model_load(gen_model("async-ed", "--layers 1 --vocab 300 --seed 10"), NULL, &d), TRI_STATUS_OK);
    enum { NP = 120, NG = 24 };
    int32_t prompt[NP], want[NG];
    for (int i = 0; i < NP; i++) prompt[i] = i % 17 < 11 ? (i % 17) * 9 + 4 : (i * 29) % 290 + 3;
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;  // the asynchronous CPU backend below, also where a GPU exists
    sp.n_ctx = 200;
    sp.n_batch = 16;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F32;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *w = want;
    cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK);
    cr_assert_eq(w - want, NG);
    tri_session_free(s);
    sp.kv_layers_offloaded = 2;
    sp.weight_layers_streamed = 2;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_TRIFORCE;
    p.draft_model = d;
    p.budget = 32;
    p.refresh = 10;
    for (int mode = ASYNC_LATE; mode <= ASYNC_EARLY; mode++) {
        tri_spec_stats st;
        long n_transfers;
        spec_async_greedy(m, &sp, &p, (async_mode)mode, prompt, NP, &gp, want, NG, &st, &n_transfers);
        cr_assert(st.n_l2_refresh >= 2 && n_transfers > 0);
    }
    tri_model_free(d);
    tri_model_free(m);
}

// ---- split attention: part of each offloaded layer attended on the host (kv-store.h) ----

// A prompt of n tokens over a vocabulary of 300, repetitive enough for drafts to be accepted.
static void long_prompt(int32_t *p, int32_t n) {
    for (int32_t i = 0; i < n; i++) p[i] = i % 23 < 15 ? (i % 23) * 11 + 5 : (i * 37) % 290 + 3;
}

// Greedy tokens after the prompt, then the logits of every token of a 13-token step (a
// verification pass's shape) after a rollback into the prompt, from a session with sp.
static void split_session_run(const tri_model *m, const tri_session_params *sp, const int32_t *prompt, int32_t np,
                              int32_t *gen, int32_t ng, float *step_logits, tri_generate_stats *stats) {
    tri_session *s;
    cr_assert_eq(tri_session_create(m, sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = ng;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    int32_t *w = gen;
    cr_assert_eq(tri_generate(s, prompt, np, &gp, collect, &w, stats), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(w - gen, ng);
    // other tokens than the rows rolled back held, so that stale rows cannot pass for new ones
    int32_t step[13];
    for (int i = 0; i < 13; i++) step[i] = (prompt[np - 13 + i] * 7 + i) % 290 + 3;
    cr_assert_eq(tri_session_truncate(s, np - 13), TRI_STATUS_OK);
    cr_assert_eq(tri_session_eval(s, step, 13, true), TRI_STATUS_OK, "%s", tri_last_error());
    const int32_t V = tri_token_count(m);
    for (int i = 0; i < 13; i++)
        memcpy(step_logits + (int64_t)i * V, tri_session_logits(s, i), sizeof(float) * (size_t)V);
    tri_session_free(s);
}

// Offloaded layers split at whole 1024-key chunks, the host's part merged in chunk order, give the
// unsplit cache's tokens and logits bit for bit, with every fraction (0.3: part streamed; 1: all on
// the host) and with the transfers late or early; the streamed bytes shrink with the fraction.
Test(device, split_attention_equals_the_full_cache_bit_for_bit) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("split", "--layers 4 --heads 4 --kv-heads 2 --head-dim 16 --vocab 300 --ctx 4096"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    enum { NP = 2600, NG = 6 };
    static int32_t prompt[NP];
    long_prompt(prompt, NP);
    const int32_t V = tri_token_count(m);
    int32_t want_gen[NG], got_gen[NG];
    float *want = malloc(sizeof(float) * 13 * (size_t)V), *got = malloc(sizeof(float) * 13 * (size_t)V);
    cr_assert(want && got);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 2700;
    sp.n_threads = 2;
    tri_generate_stats st, st_all;
    split_session_run(m, &sp, prompt, NP, want_gen, NG, want, &st);
    sp.kv_layers_offloaded = 3;
    sp.kv_host_threads = 2;
    for (int mode = ASYNC_LATE; mode <= ASYNC_EARLY; mode++) {
        factory_mode = (async_mode)mode;
        tri__backend_cpu_factory = async_factory;
        sp.kv_host_fraction = 0;
        split_session_run(m, &sp, prompt, NP, got_gen, NG, got, &st_all);
        const double fracs[] = {0.3, 0.6, 1.0};
        for (size_t f = 0; f < sizeof fracs / sizeof fracs[0]; f++) {
            sp.kv_host_fraction = fracs[f];
            split_session_run(m, &sp, prompt, NP, got_gen, NG, got, &st);
            for (int i = 0; i < NG; i++)
                cr_assert_eq(got_gen[i], want_gen[i], "%s, host %.1f: token %d: %d vs %d", mode ? "early" : "late",
                             fracs[f], i, got_gen[i], want_gen[i]);
            cr_assert_eq(memcmp(got, want, sizeof(float) * 13 * (size_t)V), 0,
                         "%s, host %.1f: logits of the 13-token step differ", mode ? "early" : "late", fracs[f]);
            // decoding: NG - 1 one-token steps after 2600 .. 2604 rows; offloaded layers 0 and 2
            // share a buffer and upload every step, layer 1 keeps its own. All streamed they upload
            // every row before the step; split, whole chunks of 1 - f of them: 2600 x 0.7 and
            // 2600 x 0.4 both round down to 1024 rows, 0 rows with everything on the host
            const uint64_t row = 2 * 16 * 2;  // 2 KV heads x 16 dims of f16
            uint64_t all = 0;
            for (int i = 0; i < NG - 1; i++) all += 2 * 2 * row * (2600 + (uint64_t)i);
            uint64_t split = fracs[f] < 1 ? (NG - 1) * 2 * 2 * row * 1024 : 0;
            cr_assert_eq(st_all.kv_bytes_up, all, "all streamed: %llu bytes up, want %llu",
                         (unsigned long long)st_all.kv_bytes_up, (unsigned long long)all);
            cr_assert_eq(st.kv_bytes_up, split, "host %.1f: %llu bytes up, want %llu", fracs[f],
                         (unsigned long long)st.kv_bytes_up, (unsigned long long)split);
            // the host reads the rest of each of the 3 offloaded layers, the step's new row included
            uint64_t host = 0;
            for (int i = 0; i < NG - 1; i++) host += 3 * 2 * row * (2601 + (uint64_t)i - (fracs[f] < 1 ? 1024 : 0));
            cr_assert_eq(st.kv_bytes_host, host, "host %.1f: %llu bytes read on the host, want %llu", fracs[f],
                         (unsigned long long)st.kv_bytes_host, (unsigned long long)host);
            cr_assert_eq(st_all.kv_bytes_host, 0);
            cr_assert(fracs[f] < 1 || st.kv_bytes_up == 0, "all on the host: %llu bytes up",
                      (unsigned long long)st.kv_bytes_up);
        }
        tri__backend_cpu_factory = NULL;
    }
    free(want);
    free(got);
    tri_model_free(m);
}

// The speculative engine with L3's offloaded layers split: greedy output equals plain decoding's.
Test(device, split_attention_speculative_greedy) {
    tri_model *m, *d;
    cr_assert_eq(tri_model_load(gen_model("split-e", "--layers 3 --vocab 300 --seed 9 --ctx 4096"), NULL, &m),
                 TRI_STATUS_OK);
    cr_assert_eq(tri_model_load(gen_model("split-ed", "--layers 1 --vocab 300 --seed 10 --ctx 4096"), NULL, &d),
                 TRI_STATUS_OK);
    enum { NP = 2200, NG = 20 };
    static int32_t prompt[NP];
    int32_t want[NG];
    long_prompt(prompt, NP);
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;  // the asynchronous CPU backend below, also where a GPU exists
    sp.n_ctx = 2300;
    sp.n_threads = 2;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *w = want;
    cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK);
    tri_session_free(s);
    sp.kv_layers_offloaded = 2;
    sp.kv_host_fraction = 0.4;
    sp.kv_host_threads = 1;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_TRIFORCE;
    p.draft_model = d;
    p.budget = 256;
    p.refresh = 12;
    for (int mode = ASYNC_LATE; mode <= ASYNC_EARLY; mode++) {
        tri_spec_stats st;
        long n_transfers;
        spec_async_greedy(m, &sp, &p, (async_mode)mode, prompt, NP, &gp, want, NG, &st, &n_transfers);
        // L3's passes split: from 2,200 rows on, 1,024 stream and the rest are read on the host
        cr_assert(st.kv_bytes_host > 0 && st.n_l2_refresh >= 1, "%llu bytes on the host",
                  (unsigned long long)st.kv_bytes_host);
    }
    tri_model_free(d);
    tri_model_free(m);
}

// A fraction outside [0, 1] names the field.
Test(device, split_attention_bad_fraction) {
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("splitbad", "--layers 2"), NULL, &m), TRI_STATUS_OK);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 32;
    sp.kv_layers_offloaded = 1;
    sp.kv_host_fraction = 1.5;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(tri_last_error(), "kv_host_fraction"), "%s", tri_last_error());
    tri_model_free(m);
}

// ---- the whole engine on a CUDA device (a GPU, or the emulator in CI) ----

// Greedy decoding on the CUDA device gives the CPU's tokens, plainly, with KV layers offloaded and
// weights streamed, and through the speculative engine (retrieval and full-cache levels over the
// offloaded store; greedy output is plain decoding's by construction on any device). Logits on the
// device are within the matmul kernels' tolerance of the CPU's (tests/test-cuda-backend.c), so a
// tie within it could change a token; this seeded model has no such near tie over its 12 tokens.
Test(device, cuda_engine_greedy_equals_cpu, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("gpu-e2e", "--layers 2 --vocab 300 --seed 21"), NULL, &m), TRI_STATUS_OK);
    enum { NP = 40, NG = 12 };
    int32_t prompt[NP], want[NG], got[NG];
    for (int i = 0; i < NP; i++) prompt[i] = i % 13 < 9 ? (i % 13) * 11 + 5 : (i * 31) % 290 + 3;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 16;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F16;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    struct {
        tri_device_kind kind;
        int32_t kv_off, streamed;
    } runs[] = {{TRI_DEVICE_CPU, 0, 0}, {TRI_DEVICE_CUDA, 0, 0}, {TRI_DEVICE_CUDA, 1, 1}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        sp.device_kind = runs[r].kind;
        sp.kv_layers_offloaded = runs[r].kv_off;
        sp.weight_layers_streamed = runs[r].streamed;
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        int32_t *w = r == 0 ? want : got;
        cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(w - (r == 0 ? want : got), NG);
        if (r > 0)
            for (int i = 0; i < NG; i++)
                cr_assert_eq(got[i], want[i], "%s, %d KV layers offloaded: token %d: %d vs the CPU's %d",
                             tri_session_device(s), runs[r].kv_off, i, got[i], want[i]);
        tri_session_free(s);
    }
    sp.device_kind = TRI_DEVICE_CUDA;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_TRIFORCE;
    p.drafter = TRI_SPEC_DRAFTER_NGRAM;
    p.ngram_n = 2;
    p.budget = 16;
    p.chunk = 4;
    tri_spec *e;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *g = got;
    tri_spec_stats st;
    cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(g - got, NG);
    for (int i = 0; i < NG; i++)
        cr_assert_eq(got[i], want[i], "%s speculative: token %d: %d vs the CPU's %d", tri_spec_device(e), i, got[i],
                     want[i]);
    tri_spec_free(e);
    // L1 as a model (the target's first layer, a self-draft) over StreamingLLM whose window the
    // prompt overflows: on the device each of its one-token evals is one recorded step replayed
    // (tri__llama_step), and the output is still plain decoding's
    static const int32_t first_layer[] = {0};
    sp.weight_layers_streamed = 0;  // a layer view needs resident weights (the KV stays offloaded)
    p.drafter = TRI_SPEC_DRAFTER_LAYERS;
    p.draft_layers = first_layer;
    p.n_draft_layers = 1;
    p.draft_window = 12;
    p.draft_sink = 4;
    cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
    g = got;
    cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(g - got, NG);
    cr_assert(st.l1_proposed > 0, "L1 drafted");
    for (int i = 0; i < NG; i++)
        cr_assert_eq(got[i], want[i], "%s speculative, a self-draft L1: token %d: %d vs the CPU's %d", tri_spec_device(e),
                     i, got[i], want[i]);
    tri_spec_free(e);
    // plain decoding over StreamingLLM (a window of 16 under the 40-token prompt): the device's
    // recorded steps give the CPU's tokens
    sp.kv_policy = TRI_KV_POLICY_STREAMING;
    sp.kv_layers_offloaded = 0;
    sp.kv_budget = 16;
    sp.kv_sink = 4;
    for (int r = 0; r < 2; r++) {
        sp.device_kind = r ? TRI_DEVICE_CUDA : TRI_DEVICE_CPU;
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        int32_t *w = r ? got : want;
        cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(w - (r ? got : want), NG);
        tri_session_free(s);
    }
    for (int i = 0; i < NG; i++)
        cr_assert_eq(got[i], want[i], "StreamingLLM on the device: token %d: %d vs the CPU's %d", i, got[i], want[i]);
    tri_model_free(m);
}

// Token trees on the device (docs/speculative.md, "Token trees"): greedy speculative decoding with
// trees of 24 nodes gives the CPU's plain tokens: DRAFT (self-draft) and TRIFORCE (self-draft) with
// the KV resident, TRIFORCE with one layer offloaded, RETRIEVAL offloaded and split with the host;
// L2 keeps 16 rows, so L3 rejects chains and keeps siblings (counted).
Test(device, cuda_engine_tree_greedy_equals_cpu, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m;
    cr_assert_eq(tri_model_load(gen_model("gpu-tree", "--layers 2 --vocab 300 --seed 21"), NULL, &m), TRI_STATUS_OK);
    enum { NP = 40, NG = 16 };
    int32_t prompt[NP], want[NG], got[NG];
    for (int i = 0; i < NP; i++) prompt[i] = i % 13 < 9 ? (i % 13) * 11 + 5 : (i * 31) % 290 + 3;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 96;
    sp.n_batch = 16;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F16;
    sp.device_kind = TRI_DEVICE_CPU;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    int32_t *w = want;
    cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
    static const int32_t first_layer[] = {0};
    int64_t kept = 0;
    static const struct {
        int place;  // 0 resident, 1 one layer offloaded, 2 offloaded and split
        tri_spec_mode mode;
    } runs[] = {{0, TRI_SPEC_MODE_DRAFT}, {0, TRI_SPEC_MODE_TRIFORCE}, {1, TRI_SPEC_MODE_TRIFORCE},
                {2, TRI_SPEC_MODE_RETRIEVAL}};
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        const int place = runs[ri].place;
        const tri_spec_mode mode = runs[ri].mode;
        sp.device_kind = TRI_DEVICE_CUDA;
        sp.kv_layers_offloaded = place ? 1 : 0;
        sp.kv_host_fraction = place == 2 ? 1.0 : 0.0;
        sp.kv_host_threads = 1;
        tri_spec_params p = tri_spec_default_params();
        p.mode = mode;
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        p.draft_layers = first_layer;
        p.n_draft_layers = 1;
        p.draft_window = 12;
        p.draft_sink = 4;
        p.budget = 16;
        p.chunk = 4;
        p.gamma2 = 6;
        p.tree_nodes = 24;
        tri_spec *e;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
        int32_t *g = got;
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(g - got, NG);
        cr_assert(st.n_l3_tree_nodes > 0, "no tree verified");
        for (int i = 0; i < NG; i++)
            cr_assert_eq(got[i], want[i], "%s, mode %d, placement %d, trees: token %d: %d vs the CPU's %d",
                         tri_spec_device(e), (int)mode, place, i, got[i], want[i]);
        if (place == 2) cr_assert(st.kv_bytes_host > 0, "nothing attended on the host");
        enum { R1 = TRI__TREE_MAX_RANK + 1 };
        static int64_t reached[(TRI__SPEC_MAX_DEPTH + 1) * R1], accepted[(TRI__SPEC_MAX_DEPTH + 1) * R1];
        tri__spec_tree_counts(e, reached, accepted);
        for (int d = 1; d <= TRI__SPEC_MAX_DEPTH; d++)
            for (int r = 1; r < R1; r++) kept += accepted[d * R1 + r];
        tri_spec_free(e);
    }
    cr_assert(kept > 0, "no sibling was ever kept: the tree path went untested");
    tri_model_free(m);
}

// ---- a quantized KV cache on the device (kv_type q8_0 / q4_0) ----

// The quantized-KV tests' model: 3 layers, 4 heads over 2 KV heads of 32 dims (one q8_0 / q4_0
// block a head row), f32 weights. Each test process writes its own copy (a few hundred KiB): the
// generator deletes the files first, so two tests sharing a tag race when Criterion runs them at once.
static tri_model *kvq_model(void) {
    tri_model *m = NULL;
    char tag[32];
    snprintf(tag, sizeof tag, "kvq-%ld", (long)getpid());
    cr_assert_eq(tri_model_load(gen_model(tag,
                                          "--layers 3 --heads 4 --kv-heads 2 --head-dim 32 --vocab 300 --seed 29 "
                                          "--ctx 2048 --dtype f32"),
                                NULL, &m),
                 TRI_STATUS_OK, "%s", tri_last_error());
    return m;
}

// q8_0 and q4_0 caches on the device: greedy tokens equal the CPU's with the same cache type, the
// cache in device memory, with its 3 layers offloaded (streamed through the store's two buffers),
// and split (kv_host_fraction: under 1024 rows the host attends every row of an offloaded layer
// where it lies, reading the blocks in place; the device half of a split, attention_state over
// quantized rows, is checked in the cuda-backend suite, since 1024 rows of prompt cost minutes on
// the emulator). The offloaded layers stream the blocks themselves: a decode step's bytes up are
// 34/64 of f16's with q8_0 and 18/64 with q4_0, counted by the engine. Then a q4_0 draft cache.
Test(device, cuda_quantized_kv_greedy_equals_cpu, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m = kvq_model();
    enum { NP = 40, NG = 6 };
    int32_t prompt[NP];
    long_prompt(prompt, NP);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 16;
    sp.n_threads = 1;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    const tri_dtype types[3] = {TRI_DTYPE_F16, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    uint64_t up[3] = {0};
    int32_t want_f16[NG];
    for (int t = 0; t < 3; t++) {
        sp.kv_type = types[t];
        int32_t want[NG], got[NG];
        // CPU in memory; the device in memory, offloaded, split
        const struct {
            tri_device_kind kind;
            int32_t off;
            double host;
        } runs[] = {
            {TRI_DEVICE_CPU, 0, 0}, {TRI_DEVICE_CUDA, 0, 0}, {TRI_DEVICE_CUDA, 3, 0}, {TRI_DEVICE_CUDA, 3, 0.5}};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            if (t == 0 && r != 0 && r != 2) continue;  // f16: the CPU's tokens and the streamed bytes
            sp.device_kind = runs[r].kind;
            sp.kv_layers_offloaded = runs[r].off;
            sp.kv_host_fraction = runs[r].host;
            tri_session *s;
            cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
            int32_t *w = r == 0 ? want : got;
            tri_generate_stats st;
            cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, &st), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(w - (r == 0 ? want : got), NG);
            for (int i = 0; r > 0 && t > 0 && i < NG; i++)
                cr_assert_eq(got[i], want[i],
                             "%s cache on %s, %d layers offloaded, host fraction %.2f: token %d: %d, "
                             "the CPU's %d",
                             tri_dtype_name(types[t]), tri_session_device(s), runs[r].off, runs[r].host, i, got[i],
                             want[i]);
            if (r == 2) up[t] = st.kv_bytes_up;
            if (r == 0 && t == 0) memcpy(want_f16, want, sizeof want);
            if (r == 3) {  // nothing streamed: the host read every row of the 3 layers, K and V, in place
                uint64_t host = 0;
                for (int i = 0; i < NG - 1; i++)
                    host += 3 * 2 * (uint64_t)tri__dtype_row_bytes(types[t], 2 * 32) * (NP + 1 + (uint64_t)i);
                cr_assert(st.kv_bytes_up == 0 && st.kv_bytes_host == host,
                          "split: %llu bytes up, %llu read on the host "
                          "(want 0, %llu)",
                          (unsigned long long)st.kv_bytes_up, (unsigned long long)st.kv_bytes_host,
                          (unsigned long long)host);
            }
            tri_session_free(s);
        }
    }
    // the same steps over the same lengths: bytes in the ratio of the rows' sizes (32 values: 64,
    // 34, 18 bytes). Layers 0 and 2 share a buffer and upload every row before each step, K and V;
    // layer 1 keeps its own
    uint64_t f16 = 0;
    for (int i = 0; i < NG - 1; i++) f16 += 2 * 2 * (uint64_t)(2 * 32 * 2) * (NP + (uint64_t)i);
    cr_assert_eq(up[0], f16, "f16: %llu bytes up, want %llu", (unsigned long long)up[0], (unsigned long long)f16);
    cr_assert_eq(up[1] * 64, up[0] * 34, "q8_0: %llu bytes up against f16's %llu (want 34/64)",
                 (unsigned long long)up[1], (unsigned long long)up[0]);
    cr_assert_eq(up[2] * 64, up[0] * 18, "q4_0: %llu bytes up against f16's %llu (want 18/64)",
                 (unsigned long long)up[2], (unsigned long long)up[0]);
    cr_log_info("KV bytes up over %d decode steps: f16 %llu, q8_0 %llu (%.4fx), q4_0 %llu (%.4fx)", NG - 1,
                (unsigned long long)up[0], (unsigned long long)up[1], (double)up[1] / (double)up[0],
                (unsigned long long)up[2], (double)up[2] / (double)up[0]);
    // an f16 target with a q4_0 L1 (the whole model as its own draft over a StreamingLLM window the
    // prompt overflows; on the device its one-token steps are a recorded graph whose set_rows
    // quantizes and whose get_rows_dev dequantizes): plain decoding's tokens, and the draft proposes
    // and has accepted what the CPU's q4_0 draft does (set_rows' blocks themselves are checked byte
    // by byte in the cuda-backend suite)
    sp.kv_type = TRI_DTYPE_F16;
    sp.kv_layers_offloaded = 0;
    sp.kv_host_fraction = 0;
    static const int32_t all_layers[] = {0, 1, 2};
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_DRAFT;
    p.drafter = TRI_SPEC_DRAFTER_LAYERS;
    p.draft_layers = all_layers;
    p.n_draft_layers = 3;
    p.draft_window = 32;
    p.draft_sink = 4;
    p.draft_kv_type = TRI_DTYPE_Q4_0;
    tri_spec_stats sst[2];
    for (int r = 0; r < 2; r++) {
        sp.device_kind = r ? TRI_DEVICE_CUDA : TRI_DEVICE_CPU;
        tri_spec *e;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
        int32_t got[NG], *g = got;
        cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &sst[r]), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(g - got, NG);
        for (int i = 0; i < NG; i++)
            cr_assert_eq(got[i], want_f16[i], "%s, a q4_0 draft cache: token %d: %d, plain %d", tri_spec_device(e), i,
                         got[i], want_f16[i]);
        tri_spec_free(e);
    }
    cr_log_info("q4_0 draft: device %lld proposed, %lld accepted; CPU %lld, %lld", (long long)sst[1].l1_proposed,
                (long long)sst[1].l1_accepted, (long long)sst[0].l1_proposed, (long long)sst[0].l1_accepted);
    cr_assert(
        sst[1].l1_accepted > 0 && sst[1].l1_proposed == sst[0].l1_proposed && sst[1].l1_accepted == sst[0].l1_accepted,
        "q4_0 draft on the device: %lld proposed, %lld accepted; on the CPU %lld, %lld", (long long)sst[1].l1_proposed,
        (long long)sst[1].l1_accepted, (long long)sst[0].l1_proposed, (long long)sst[0].l1_accepted);
    tri_model_free(m);
}

// Whether L2's gathered rows hold L3's rows quantized to type: the last layer's first selected
// chunk of each KV head, keys and values, read back from the device. Returns the rows compared (0:
// no selection yet).
static int l2_gathered_rows(tri_spec *spec, tri_dtype type) {
    tri__level *l2 = tri__spec_level(spec, 2), *l3 = tri__spec_level(spec, 3);
    cr_assert(l2 && l3 && l3->pol.kv->type == TRI_DTYPE_F16);
    if (tri__kv_policy_selected_at(&l2->pol) < 0) return 0;
    const int32_t hd = l2->model->config.head_dim, C = l2->pol.p.chunk, il = l2->model->config.n_layer - 1;
    cr_assert(hd <= 64);
    int compared = 0;
    for (int32_t h = 0; h < l2->pol.n_head_kv; h++) {
        int32_t ids[64], n_sel;
        if (tri__kv_policy_selection(&l2->pol, il, h, ids, &n_sel) <= 0) continue;
        for (int which = 0; which < 2; which++) {
            uint16_t r3[64];
            uint8_t got[64], want[64];
            float x[64];
            cr_assert(tri__kv_policy_peek(&l3->pol, il, h, ids[0] * C, which, r3));
            for (int32_t d = 0; d < hd; d++) x[d] = tri__f16_to_f32(r3[d]);
            cr_assert(tri__quantize_row(want, x, type, hd));
            cr_assert(tri__kv_policy_peek(&l2->pol, il, h, ids[0] * C, which, got));
            cr_assert(memcmp(got, want, (size_t)tri__dtype_row_bytes(type, hd)) == 0,
                      "L2's gathered %s row of position %d (head %d) is not L3's row in %s", which ? "value" : "key",
                      ids[0] * C, h, tri_dtype_name(type));
            compared++;
        }
    }
    return compared;
}

// Quantized draft caches on the device (draft_kv_type): L2's gathered chunks in q8_0 / q4_0 beside
// its ring of L3's f16 rows are one view of two types, which the CUDA attention reads
// (backend.h span_types). Greedy speculative decoding gives the device's plain tokens in every mode
// with a draft cache (draft, retrieval, triforce resident and with L3's 3 layers offloaded, where
// the chunks are quantized on the host before their upload), with q8_0 and q4_0 and with the type
// left to the default, which is q8_0 on CUDA over an f16 target as on the CPU (L1's cache and L2's
// chunks); L2's rows are checked to be L3's quantized, so the test sees the typed views in use.
Test(device, cuda_quantized_draft_caches_keep_greedy_output, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m = kvq_model();
    enum { NP = 40, NG = 8 };
    int32_t prompt[NP], want[NG], got[NG], *w = want;
    long_prompt(prompt, NP);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 16;
    sp.n_threads = 1;
    sp.kv_type = TRI_DTYPE_F16;
    sp.device_kind = TRI_DEVICE_CUDA;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
    static const int32_t layer0[] = {0};
    const struct {
        tri_spec_mode mode;
        tri_dtype type;  // TRI_DTYPE_COUNT: the default
        int32_t off;
    } runs[] = {
        {TRI_SPEC_MODE_DRAFT, TRI_DTYPE_Q8_0, 0},         {TRI_SPEC_MODE_RETRIEVAL, TRI_DTYPE_Q8_0, 0},
        {TRI_SPEC_MODE_RETRIEVAL, TRI_DTYPE_Q4_0, 0},     {TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_Q4_0, 0},
        {TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_Q8_0, 3},      {TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_COUNT, 0},
    };
    int gathered = 0, gathered_offloaded = 0;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tri_spec_params p = tri_spec_default_params();
        p.mode = runs[r].mode;
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        p.draft_layers = layer0;
        p.n_draft_layers = 1;
        p.gamma1 = 2;
        p.gamma2 = 4;
        p.budget = 16;
        p.chunk = 4;
        p.draft_window = 16;
        p.draft_sink = 4;
        p.draft_kv_type = runs[r].type;
        sp.kv_layers_offloaded = runs[r].off;
        tri_spec *e;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
        const tri_dtype type = runs[r].type == TRI_DTYPE_COUNT ? TRI_DTYPE_Q8_0 : runs[r].type;
        if (p.mode != TRI_SPEC_MODE_RETRIEVAL)
            cr_assert_eq(tri__spec_level(e, 1)->params.kv_type, type, "run %zu: L1's cache is %s, want %s", r,
                         tri_dtype_name(tri__spec_level(e, 1)->params.kv_type), tri_dtype_name(type));
        int32_t *g = got;
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(g - got, NG);
        for (int i = 0; i < NG; i++)
            cr_assert_eq(got[i], want[i], "%s, %s draft caches, mode %d, %d layers offloaded: token %d: %d, plain %d",
                         tri_spec_device(e), tri_dtype_name(type), (int)p.mode, runs[r].off, i, got[i], want[i]);
        cr_assert(p.mode == TRI_SPEC_MODE_DRAFT ? st.l1_proposed > 0 : st.l2_proposed > 0, "run %zu drafted nothing",
                  r);
        if (p.mode != TRI_SPEC_MODE_DRAFT) {
            int n = l2_gathered_rows(e, type);
            cr_assert(n > 0, "run %zu: L2 made no selection: its quantized chunks went unread", r);
            gathered += n;
            if (runs[r].off) gathered_offloaded += n;
        }
        tri_spec_free(e);
    }
    cr_assert(gathered > 0 && gathered_offloaded > 0);
    tri_model_free(m);
}

// A quantized target on the device: L3 of kv_type q8_0 / q4_0 (resident, and its 3 layers
// offloaded), L2 gathering its chunks out of L3's blocks (copied with the draft type left to L3's,
// converted by get_rows and convert into another quantized type). Greedy speculative decoding gives
// the device's plain tokens with the same quantized cache in draft, retrieval and triforce modes;
// L2's rows are checked against L3's own (the same bytes, or L3's values quantized again).
Test(device, cuda_quantized_target_keeps_greedy_output, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m = kvq_model();
    enum { NP = 40, NG = 8 };
    int32_t prompt[NP], want[NG], got[NG];
    long_prompt(prompt, NP);
    static const int32_t layer0[] = {0};
    const struct {
        tri_dtype l3;
        tri_spec_mode mode;
        tri_dtype draft;  // TRI_DTYPE_COUNT: the default (L3's type)
        int32_t off;
    } runs[] = {
        {TRI_DTYPE_Q8_0, TRI_SPEC_MODE_DRAFT, TRI_DTYPE_COUNT, 0},
        {TRI_DTYPE_Q8_0, TRI_SPEC_MODE_RETRIEVAL, TRI_DTYPE_COUNT, 0},
        {TRI_DTYPE_Q8_0, TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_Q4_0, 3},
        {TRI_DTYPE_Q4_0, TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_COUNT, 3},
        {TRI_DTYPE_Q4_0, TRI_SPEC_MODE_TRIFORCE, TRI_DTYPE_Q8_0, 0},
    };
    int gathered = 0, converted = 0;
    tri_dtype plain_type = TRI_DTYPE_COUNT;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.n_batch = 16;
        sp.n_threads = 1;
        sp.kv_type = runs[r].l3;
        sp.device_kind = TRI_DEVICE_CUDA;
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = NG;
        gp.stop_at_eos = false;
        gp.sampler.temperature = 0.0f;
        if (plain_type != runs[r].l3) {  // plain decoding on the device with this cache type
            tri_session *s;
            int32_t *w = want;
            cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
            cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
            tri_session_free(s);
            plain_type = runs[r].l3;
        }
        tri_spec_params p = tri_spec_default_params();
        p.mode = runs[r].mode;
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        p.draft_layers = layer0;
        p.n_draft_layers = 1;
        p.gamma1 = 2;
        p.gamma2 = 4;
        p.budget = 16;
        p.chunk = 4;
        p.draft_window = 16;
        p.draft_sink = 4;
        p.draft_kv_type = runs[r].draft;
        sp.kv_layers_offloaded = runs[r].off;
        tri_spec *e;
        cr_assert_eq(tri_spec_create(m, &sp, &p, &e), TRI_STATUS_OK, "%s", tri_last_error());
        const tri_dtype gtype = runs[r].draft == TRI_DTYPE_COUNT ? runs[r].l3 : runs[r].draft;
        int32_t *g = got;
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(g - got, NG);
        for (int i = 0; i < NG; i++)
            cr_assert_eq(got[i], want[i], "%s, L3 %s, drafts %s, mode %d, %d layers offloaded: token %d: %d, plain %d",
                         tri_spec_device(e), tri_dtype_name(runs[r].l3), tri_dtype_name(gtype), (int)p.mode,
                         runs[r].off, i, got[i], want[i]);
        cr_assert(p.mode == TRI_SPEC_MODE_DRAFT ? st.l1_proposed > 0 : st.l2_proposed > 0, "run %zu drafted nothing",
                  r);
        if (p.mode != TRI_SPEC_MODE_DRAFT) {
            tri__level *l2 = tri__spec_level(e, 2), *l3 = tri__spec_level(e, 3);
            cr_assert(l3->pol.kv->type == runs[r].l3 && tri__kv_policy_selected_at(&l2->pol) >= 0,
                      "run %zu: L2 made no selection over L3's %s rows", r, tri_dtype_name(runs[r].l3));
            const int32_t hd = 32, C = l2->pol.p.chunk, il = l2->model->config.n_layer - 1;
            for (int32_t h = 0; h < l2->pol.n_head_kv; h++) {
                int32_t ids[64], n_sel;
                if (tri__kv_policy_selection(&l2->pol, il, h, ids, &n_sel) <= 0) continue;
                for (int which = 0; which < 2; which++) {
                    uint8_t r3[64], got_row[64], want_row[64];
                    float x[32];
                    cr_assert(tri__kv_policy_peek(&l3->pol, il, h, ids[0] * C, which, r3));
                    tri__dequantize_row(x, r3, runs[r].l3, hd);
                    if (gtype == runs[r].l3)  // copied block-wise
                        memcpy(want_row, r3, (size_t)tri__dtype_row_bytes(gtype, hd));
                    else  // converted: L3's values quantized to the draft type
                        cr_assert(tri__quantize_row(want_row, x, gtype, hd));
                    cr_assert(tri__kv_policy_peek(&l2->pol, il, h, ids[0] * C, which, got_row));
                    cr_assert(memcmp(got_row, want_row, (size_t)tri__dtype_row_bytes(gtype, hd)) == 0,
                              "run %zu: L2's %s row of position %d (head %d) is not L3's %s row as %s", r,
                              which ? "value" : "key", ids[0] * C, h, tri_dtype_name(runs[r].l3),
                              tri_dtype_name(gtype));
                    gathered++;
                    if (gtype != runs[r].l3) converted++;
                }
            }
        }
        tri_spec_free(e);
    }
    cr_assert(gathered > 0 && converted > 0);
    tri_model_free(m);
}

// kv_type mixed on the device (its full cache in q4_0, the sinks and the window in f16 as well: a
// view of two types per step, backend.h span_types): greedy tokens equal the CPU's with the same
// cache, and every prompt position's logits (passes of 4 tokens) within 1e-4 of their spread of
// the CPU's, while the device's f16 cache gives logits measurably farther (so the q4_0 rows were
// read: 2 sinks and a window of 4 over a 40-token prompt).
Test(device, cuda_mixed_kv_greedy_equals_cpu, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m = kvq_model();
    enum { NP = 40, NG = 8 };
    const int32_t nv = m->config.n_vocab;
    enum { NR = 5 };
    int32_t prompt[NP], tok[NR][NG];
    long_prompt(prompt, NP);
    float *logits[NR];
    // the CPU's mixed cache, the device's, the device's f16 cache, the device's mixed cache with its
    // last two layers' q4_0 rows offloaded, and offloaded with half their rows attended on the host
    const struct {
        tri_device_kind kind;
        tri_dtype type;
        int32_t offloaded;
        float host;
    } runs[NR] = {{TRI_DEVICE_CPU, TRI_DTYPE_KV_MIXED, 0, 0}, {TRI_DEVICE_CUDA, TRI_DTYPE_KV_MIXED, 0, 0},
                  {TRI_DEVICE_CUDA, TRI_DTYPE_F16, 0, 0},      {TRI_DEVICE_CUDA, TRI_DTYPE_KV_MIXED, 2, 0},
                  {TRI_DEVICE_CUDA, TRI_DTYPE_KV_MIXED, 2, 0.5f}};
    for (int r = 0; r < NR; r++) {
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.n_batch = 4;
        sp.n_threads = 1;
        sp.device_kind = runs[r].kind;
        sp.kv_type = runs[r].type;
        sp.kv_sink = 2;
        sp.kv_budget = 6;
        sp.kv_layers_offloaded = runs[r].offloaded;
        sp.kv_host_fraction = runs[r].host;
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(tri_session_eval(s, prompt, NP, true), TRI_STATUS_OK, "%s", tri_last_error());
        logits[r] = malloc(sizeof(float) * (size_t)NP * (size_t)nv);
        for (int i = 0; i < NP; i++)
            memcpy(logits[r] + (int64_t)i * nv, tri_session_logits(s, i), sizeof(float) * (size_t)nv);
        tri_session_free(s);
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = NG;
        gp.stop_at_eos = false;
        gp.sampler.temperature = 0.0f;
        int32_t *w = tok[r];
        cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(w - tok[r], NG);
        tri_session_free(s);
    }
    // largest difference from the device's mixed logits, per row's spread
    double d_cpu = 0, d_f16 = 0, d_off[2] = {0, 0};
    for (int i = 0; i < NP; i++) {
        const float *a = logits[1] + (int64_t)i * nv, *c = logits[0] + (int64_t)i * nv;
        const float *f = logits[2] + (int64_t)i * nv;
        float lo = c[0], hi = c[0];
        for (int j = 0; j < nv; j++) lo = fminf(lo, c[j]), hi = fmaxf(hi, c[j]);
        double scale = fmax(1.0, (double)(hi - lo));
        for (int j = 0; j < nv; j++) {
            d_cpu = fmax(d_cpu, fabs((double)a[j] - (double)c[j]) / scale);
            d_f16 = fmax(d_f16, fabs((double)a[j] - (double)f[j]) / scale);
            for (int o = 0; o < 2; o++)
                d_off[o] = fmax(d_off[o], fabs((double)a[j] - (double)logits[3 + o][(int64_t)i * nv + j]) / scale);
        }
    }
    cr_log_info("mixed on the device: logits %.2e from the CPU's mixed cache, %.2e from the device's f16 cache", d_cpu,
                d_f16);
    for (int i = 0; i < NG; i++)
        cr_assert_eq(tok[1][i], tok[0][i], "mixed cache on the device: token %d: %d, the CPU's %d", i, tok[1][i],
                     tok[0][i]);
    cr_assert(d_cpu <= 1e-4, "mixed on the device: logits %.3e from the CPU's", d_cpu);
    cr_assert(d_f16 > 10 * d_cpu, "mixed on the device: its logits (%.2e from the CPU's) should be measurably "
              "farther from the f16 cache's (%.2e)", d_cpu, d_f16);
    // offloaded (the q4_0 rows stream, the f16 ones stay) and split: the in-memory cache's output
    for (int o = 0; o < 2; o++) {
        cr_log_info("mixed on the device, offloaded%s: logits %.2e from in memory", o ? " and split" : "", d_off[o]);
        cr_assert(d_off[o] <= 1e-4, "mixed offloaded%s on the device: logits %.3e from in memory", o ? " and split" : "",
                  d_off[o]);
        for (int i = 0; i < NG; i++)
            cr_assert_eq(tok[3 + o][i], tok[1][i], "mixed offloaded%s on the device: token %d: %d, in memory %d",
                         o ? " and split" : "", i, tok[3 + o][i], tok[1][i]);
    }
    for (int r = 0; r < NR; r++) free(logits[r]);
    tri_model_free(m);
}

// kv_type mixed as the speculative target on the device (mode draft, the target's first layer as
// the drafter: a chain and a token tree, each in memory and with the last two layers' q4_0 rows
// offloaded): greedy output equals plain greedy decoding of the device's mixed cache, token for token.
Test(device, cuda_mixed_target_keeps_greedy_output, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tri_model *m = kvq_model();
    enum { NP = 40, NG = 12 };
    int32_t prompt[NP], want[NG], got[NG], *w = want;
    long_prompt(prompt, NP);
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = 96;
    sp.n_batch = 4;
    sp.n_threads = 1;
    sp.device_kind = TRI_DEVICE_CUDA;
    sp.kv_type = TRI_DTYPE_KV_MIXED;
    sp.kv_sink = 2;
    sp.kv_budget = 10;  // a window of 8 f16 rows: the 40-token prompt reads q4_0 rows, a tree's nodes f16
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = NG;
    gp.stop_at_eos = false;
    gp.sampler.temperature = 0.0f;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_generate(s, prompt, NP, &gp, collect, &w, NULL), TRI_STATUS_OK, "%s", tri_last_error());
    tri_session_free(s);
    static const int32_t layer0[] = {0};
    const struct {
        tri_spec_drafter drafter;
        int32_t tree_nodes, off;
    } runs[] = {{TRI_SPEC_DRAFTER_LAYERS, 0, 0},
                {TRI_SPEC_DRAFTER_LAYERS, 8, 0},
                {TRI_SPEC_DRAFTER_LAYERS, 0, 2},
                {TRI_SPEC_DRAFTER_LAYERS, 8, 2}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tri_spec_params p = tri_spec_default_params();
        p.mode = TRI_SPEC_MODE_DRAFT;
        p.drafter = runs[r].drafter;
        p.draft_layers = layer0;
        p.n_draft_layers = 1;
        p.gamma2 = 4;
        p.tree_nodes = runs[r].tree_nodes;
        p.draft_window = 16;
        p.draft_sink = 4;
        tri_session_params rsp = sp;
        rsp.kv_layers_offloaded = runs[r].off;
        tri_spec *e;
        cr_assert_eq(tri_spec_create(m, &rsp, &p, &e), TRI_STATUS_OK, "run %zu: %s", r, tri_last_error());
        int32_t *g = got;
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(e, prompt, NP, &gp, collect, &g, &st), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(g - got, NG);
        for (int i = 0; i < NG; i++)
            cr_assert_eq(got[i], want[i], "mixed target on %s, run %zu (tree %d, %d layers offloaded): token %d: %d, "
                         "plain %d", tri_spec_device(e), r, runs[r].tree_nodes, runs[r].off, i, got[i], want[i]);
        cr_assert(st.l1_proposed > 0, "run %zu drafted nothing", r);
        tri_spec_free(e);
    }
    tri_model_free(m);
}

// ---- the model families on the device ----

// Each family's tiny model (tests/fixtures/families, transformers' greedy tokens in golden.txt) on
// the device: resident, with its last layer's weights streamed (Qwen2's biases, Qwen3's q/k norms
// and Gemma 2's post-norms stay resident), and, for Mistral and Gemma 2 past their windows and
// Qwen3 with YaRN, with an offloaded KV layer half attended on the host (Gemma 2's soft-capped
// scores in the device's half and the host's). The margins of these goldens (>= 0.01) are far above the device
// kernels' logit differences.
static void family_tokens(const char *family, const char *file, int32_t *prompt, int *n_prompt, int32_t *want,
                          int *n_want) {
    char path[4096];
    snprintf(path, sizeof path, "%s/fixtures/families/%s/%s", getenv("TRI_TEST_SRC"), family, file);
    char *text = tt_read_file(path, NULL);
    *n_prompt = *n_want = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int32_t *dst = strncmp(line, "prompt ", 7) == 0 ? prompt : strncmp(line, "greedy ", 7) == 0 ? want : NULL;
        if (!dst) continue;
        int *n = dst == prompt ? n_prompt : n_want;
        char *p = line + 7, *end;
        for (long v = strtol(p, &end, 10); end != p && *n < 64; v = strtol(p, &end, 10)) {
            dst[(*n)++] = (int32_t)v;
            p = end;
        }
    }
    free(text);
}

Test(device, families_greedy_on_device, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    static const struct {
        const char *family, *model;
        int32_t streamed, kv_off;
    } runs[] = {
        {"qwen2", "model.gguf", 0, 0},  {"qwen2", "hf", 1, 0},         {"mistral", "model.gguf", 0, 1},
        {"phi3", "model.gguf", 1, 0},   {"gemma", "model.gguf", 0, 0}, {"gemma", "hf", 1, 0},
        {"qwen3", "model.gguf", 0, 0},  {"qwen3", "hf", 1, 0},         {"qwen3-tied-yarn", "model.gguf", 1, 1},
        {"gemma2", "model.gguf", 0, 1}, {"gemma2", "hf", 1, 0},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        int32_t prompt[64], want[64], got[64];
        int n_prompt, n_want;
        family_tokens(runs[r].family, "golden.txt", prompt, &n_prompt, want, &n_want);
        char path[4096];
        snprintf(path, sizeof path, "%s/fixtures/families/%s/%s", getenv("TRI_TEST_SRC"), runs[r].family,
                 runs[r].model);
        tri_model *m;
        cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
        tri_session_params sp = tri_session_default_params();
        sp.n_ctx = 64;
        sp.n_threads = 1;
        sp.kv_type = TRI_DTYPE_F32;
        sp.device_kind = TRI_DEVICE_CUDA;
        sp.weight_layers_streamed = runs[r].streamed;
        sp.kv_layers_offloaded = runs[r].kv_off;
        sp.kv_host_fraction = runs[r].kv_off ? 0.5 : 0.0;
        tri_session *s;
        cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = n_want;
        gp.stop_at_eos = false;
        gp.sampler.temperature = 0.0f;
        int32_t *g = got;
        cr_assert_eq(tri_generate(s, prompt, n_prompt, &gp, collect, &g, NULL), TRI_STATUS_OK, "%s", tri_last_error());
        cr_assert_eq(g - got, n_want);
        for (int i = 0; i < n_want; i++)
            cr_assert_eq(got[i], want[i], "%s %s on %s: token %d: %d, transformers' %d", runs[r].family, runs[r].model,
                         tri_session_device(s), i, got[i], want[i]);
        tri_session_free(s);
        // Gemma's HF norms are computed at load (1 + w): the disk tier, which reads blocks by their
        // file offsets, refuses them by name
        if (strcmp(runs[r].family, "gemma") == 0 && strcmp(runs[r].model, "hf") == 0) {
            sp.weight_layers_from_disk = 1;
            cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_UNSUPPORTED);
            cr_assert(strstr(tri_last_error(), "computed at load"), "%s", tri_last_error());
        }
        tri_model_free(m);
    }
}

// Conformance cases (suite conformance; tests/fixtures/make-conformance.py, transformers at build
// time) whose arithmetic the device adds: llama's and gemma's attention biases (o's added after the
// projection, resident when the block streams), Gemma's own head over GQA 8, head_dim != hidden /
// heads; resident and with the last block streamed, f32 and f16 KV. Every margin of these cases is
// at least 0.05 logits.
Test(device, conformance_on_device, .timeout = TT_TIMEOUT(600)) {
    if (tri_device_count() == 0) cr_skip_test("no CUDA device: %s", tri_cuda_status());
    tt_need_fixtures("conformance");
    char dir[4096];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/conformance/SKIPPED", getenv("TRI_TEST_FIXTURES"));
    if (stat(dir, &sb) == 0) cr_skip_test("the conformance cases were not made (no torch and transformers)");
    static const char *const cases[] = {"llama-attention-bias", "gemma-attention-bias", "gemma-untied-gqa8",
                                        "mistral-head-dim"};
    for (size_t r = 0; r < sizeof cases / sizeof cases[0]; r++) {
        snprintf(dir, sizeof dir, "%s/conformance/%s", getenv("TRI_TEST_FIXTURES"), cases[r]);
        char golden[4200];
        snprintf(golden, sizeof golden, "%s/golden.txt", dir);
        int32_t prompt[64] = {0}, want[64] = {0}, got[64];
        int n_prompt = 0, n_want = 0;
        char *text = tt_read_file(golden, NULL);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            int32_t *dst = strncmp(line, "prompt ", 7) == 0 ? prompt : strncmp(line, "greedy ", 7) == 0 ? want : NULL;
            if (!dst) continue;
            int *n = dst == prompt ? &n_prompt : &n_want;
            char *p = line + 7, *end;
            for (long v = strtol(p, &end, 10); end != p && *n < 64; v = strtol(p, &end, 10)) {
                dst[(*n)++] = (int32_t)v;
                p = end;
            }
        }
        free(text);
        cr_assert(n_prompt > 0 && n_want > 0, "%s: golden.txt incomplete", golden);
        tri_model *m;
        cr_assert_eq(tri_model_load(dir, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
        for (int variant = 0; variant < 4; variant++) {
            tri_session_params sp = tri_session_default_params();
            sp.n_ctx = 64;
            sp.n_threads = 1;
            sp.kv_type = variant & 1 ? TRI_DTYPE_F16 : TRI_DTYPE_F32;
            sp.device_kind = TRI_DEVICE_CUDA;
            sp.weight_layers_streamed = variant >> 1;
            tri_session *s;
            cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
            tri_generate_params gp = tri_generate_default_params();
            gp.n_predict = n_want;
            gp.stop_at_eos = false;
            gp.sampler.temperature = 0.0f;
            int32_t *g = got;
            cr_assert_eq(tri_generate(s, prompt, n_prompt, &gp, collect, &g, NULL), TRI_STATUS_OK, "%s",
                         tri_last_error());
            cr_assert_eq(g - got, n_want);
            for (int i = 0; i < n_want; i++)
                cr_assert_eq(got[i], want[i], "%s on %s (%s KV, %d streamed): token %d: %d, transformers' %d",
                             cases[r], tri_session_device(s), tri_dtype_name(sp.kv_type),
                             (int)sp.weight_layers_streamed, i, got[i], want[i]);
            tri_session_free(s);
        }
        tri_model_free(m);
    }
}
