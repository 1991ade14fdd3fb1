// test-sim.c - the simulated device (backends/sim/sim-backend.h): its timeline keeps the stream rules
// (order on a queue, events, waits), the engine's double buffering shows as overlap on it, the
// bytes it moves are the bytes the runtime counts, and nothing it simulates takes memory.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend-select.h"
#include "backend.h"
#include "kv-policy.h"
#include "kv-store.h"
#include "llama.h"
#include "model-synthetic.h"
#include "model.h"
#include "sim-backend.h"
#include "spec.h"
#include "weights.h"

// Round rates, no launch cost: every duration below is exact by hand.
static tri__sim_profile plain_profile(void) {
    return (tri__sim_profile){.name = "test", .desc = "test", .matmul_tflops = 1.0, .vector_tflops = 1.0,
                              .mem_gbps = 100.0, .h2d_gbps = 10.0, .d2h_gbps = 5.0, .launch_us = 0, .kernel_us = 0,
                              .mem_bytes = (uint64_t)1 << 30};
}

static tri__backend *sim_open(const tri__sim_profile *p) {
    tri__backend *be;
    cr_assert_eq(tri__backend_sim_create(p, &be), TRI_STATUS_OK);
    tri__sim_trace(be, true);
    return be;
}

static void assert_near(double got, double want, const char *what) {
    cr_assert(got > want * (1 - 1e-9) - 1e-15 && got < want * (1 + 1e-9) + 1e-15, "%s: %.12g, want %.12g", what, got,
              want);
}

Test(sim, profiles_are_complete) {
    int n;
    const tri__sim_profile *all = tri__sim_profiles(&n);
    cr_assert_geq(n, 6);
    for (int i = 0; i < n; i++) cr_assert_eq(tri__sim_profile_find(all[i].name), &all[i], "%s", all[i].name);
    const char *want[] = {"rtx4090", "rtx4090-x8", "rtx5090", "h100-pcie", "h100-sxm", "h200", "a100"};
    for (int i = 0; i < 7; i++) {
        const tri__sim_profile *q = tri__sim_profile_find(want[i]);
        cr_assert_not_null(q, "%s", want[i]);
        tri__backend *be;
        cr_assert_eq(tri__backend_sim_create(q, &be), TRI_STATUS_OK, "%s", want[i]);
        cr_assert(be->simulated && !be->host_memory);
        tri__backend_free(be);
    }
    cr_assert_null(tri__sim_profile_find("rtx3090"));
    // x8 has half the link of x16 and the same card
    cr_assert_float_eq(tri__sim_profile_find("rtx4090-x8")->h2d_gbps * 2, tri__sim_profile_find("rtx4090")->h2d_gbps,
                       1e-12);
    tri__sim_profile bad = plain_profile();
    bad.mem_gbps = 0;
    tri__backend *be;
    cr_assert_eq(tri__backend_sim_create(&bad, &be), TRI_STATUS_INVALID_ARGUMENT);
}

Test(sim, costs_follow_the_profile) {
    tri__sim_profile p = plain_profile();
    tri__backend *be = sim_open(&p);
    const tri__backend_ops *op = be->ops;
    void *w, *x, *y;
    cr_assert_eq(op->alloc(be, 2000000, &w), TRI_STATUS_OK);
    cr_assert_eq(op->alloc(be, 4096, &x), TRI_STATUS_OK);
    cr_assert_eq(op->alloc(be, 4096, &y), TRI_STATUS_OK);
    // m = 1: memory-bound, 1000 x 1000 f16 weights + x and y in f32 at 100 GB/s
    cr_assert_eq(op->matmul(be, y, x, w, TRI_DTYPE_F16, 1, 1000, 1000), TRI_STATUS_OK);
    // m = 1000 (pretend): 2e9 FLOPs at 1 TFLOP/s beats 2e6 + 8e6 bytes at 100 GB/s
    cr_assert_eq(op->matmul(be, y, x, w, TRI_DTYPE_F16, 1000, 1000, 1000), TRI_STATUS_OK);
    char host[64];
    memset(host, 0x5a, sizeof host);
    cr_assert_eq(op->copy_to_host(be, host, y, sizeof host), TRI_STATUS_OK);
    for (size_t i = 0; i < sizeof host; i++) cr_assert_eq(host[i], 0, "what the host reads back is zeros");
    cr_assert_eq(op->synchronize(be), TRI_STATUS_OK);
    int64_t n;
    const tri__sim_item *it = tri__sim_trace_items(be, &n);
    cr_assert_eq(n, 3);
    assert_near(it[0].end - it[0].start, (2e6 + 4.0 * 2000) / 100e9, "matvec");
    assert_near(it[1].end - it[1].start, 2e9 / 1e12, "matmul");
    assert_near(it[1].start, it[0].end, "ops on a queue run in order");
    cr_assert_eq(it[2].kind, TRI_SIM_KIND_D2H);
    assert_near(it[2].end - it[2].start, 64 / 5e9, "device -> host at the D2H rate");
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    assert_near(s.host, it[2].end, "synchronize waits for the last item");
    cr_assert_eq(s.n_ops, 2);
    cr_assert_eq(s.d2h_bytes, 64);
    op->free(be, w);
    op->free(be, x);
    op->free(be, y);
    tri__backend_free(be);
}

Test(sim, events_and_waits_are_honoured) {
    tri__sim_profile p = plain_profile();
    tri__backend *be = sim_open(&p);
    const tri__backend_ops *op = be->ops;
    void *w, *buf;
    char host[16];
    cr_assert_eq(op->alloc(be, 200000000, &w), TRI_STATUS_OK);  // a 2 ms matvec
    cr_assert_eq(op->alloc(be, 10000000, &buf), TRI_STATUS_OK);
    tri__event *ev;
    cr_assert_eq(op->event_create(be, &ev), TRI_STATUS_OK);
    cr_assert_eq(op->matmul(be, buf, buf, w, TRI_DTYPE_F16, 1, 10000, 10000), TRI_STATUS_OK);
    // without a wait the upload starts at once, beside the compute
    cr_assert_eq(op->transfer_to_backend(be, buf, host, 10000000), TRI_STATUS_OK);
    // with one, after the event compute recorded behind the matvec
    cr_assert_eq(op->event_record(be, ev, TRI_STREAM_COMPUTE), TRI_STATUS_OK);
    cr_assert_eq(op->stream_wait(be, TRI_STREAM_TRANSFER, ev), TRI_STATUS_OK);
    cr_assert_eq(op->transfer_to_backend(be, buf, host, 10000000), TRI_STATUS_OK);
    // and compute that waits for that upload starts after it
    cr_assert_eq(op->event_record(be, ev, TRI_STREAM_TRANSFER), TRI_STATUS_OK);
    cr_assert_eq(op->stream_wait(be, TRI_STREAM_COMPUTE, ev), TRI_STATUS_OK);
    cr_assert_eq(op->add(be, buf, buf, buf, 16), TRI_STATUS_OK);
    // event_synchronize brings the host to the event only
    cr_assert_eq(op->event_synchronize(be, ev), TRI_STATUS_OK);
    int64_t n;
    const tri__sim_item *it = tri__sim_trace_items(be, &n);
    cr_assert_eq(n, 4);
    double mv_end = it[0].end;
    assert_near(mv_end, (2e8 + 8e4) / 100e9, "matvec");
    assert_near(it[1].start, 0, "an upload with no wait starts at once");
    cr_assert_lt(it[1].end, mv_end, "and overlaps the matvec");
    cr_assert_geq(it[2].start, mv_end, "an upload waits for the event recorded after the matvec");
    assert_near(it[2].start, mv_end, "and starts as soon as it is reached");
    assert_near(it[2].end - it[2].start, 1e7 / 10e9, "host -> device at the H2D rate");
    cr_assert_geq(it[3].start, it[2].end, "compute waits for the upload");
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    assert_near(s.host, it[2].end, "event_synchronize: the host reaches the event");
    assert_near(s.transfer_hidden, it[1].end - it[1].start, "only the first upload ran beside compute");
    cr_assert_eq(s.transfer_h2d_bytes, 20000000);
    cr_assert_eq(s.n_waits, 2);
    op->event_destroy(be, ev);
    op->free(be, w);
    op->free(be, buf);
    tri__backend_free(be);
}

Test(sim, memory_is_accounted_not_allocated) {
    tri__sim_profile p = plain_profile();
    tri__backend *be = sim_open(&p);
    const tri__backend_ops *op = be->ops;
    void *a, *b, *c;
    cr_assert_eq(op->alloc(be, (size_t)600 << 20, &a), TRI_STATUS_OK);
    cr_assert_eq(op->alloc(be, (size_t)600 << 20, &b), TRI_STATUS_DEVICE_OUT_OF_MEMORY, "1.2 GiB of a 1 GiB device");
    cr_assert_eq(op->alloc(be, (size_t)400 << 20, &b), TRI_STATUS_OK);
    cr_assert_neq(a, b);
    cr_assert((char *)b >= (char *)a + ((size_t)600 << 20) || (char *)a >= (char *)b + ((size_t)400 << 20),
              "allocations do not overlap");
    op->free(be, a);
    cr_assert_eq(op->alloc(be, (size_t)600 << 20, &c), TRI_STATUS_OK, "freed memory counts as free again");
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    cr_assert_eq(s.mem_used, (uint64_t)1000 << 20);
    cr_assert_eq(s.mem_peak, (uint64_t)1000 << 20);
    op->free(be, b);
    op->free(be, c);
    tri__backend_free(be);
}

// Resident set size of this process in bytes.
static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    unsigned long size, res;
    cr_assert_eq(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

// A llama shape with 8 layers (6 of them offloaded below), small enough to run in a test.
static tri_model_config small_shape(void) {
    return (tri_model_config){.n_vocab = 512, .n_embd = 256, .n_ff = 704, .n_layer = 8, .n_head = 8, .n_head_kv = 4,
                              .head_dim = 32, .n_ctx_train = 65536, .rms_eps = 1e-5f, .rope_theta = 10000.0f,
                              .rope_factor = 1.0f};
}

// One pass of m tokens over n cached positions of a store with on_chip layers on the device.
typedef struct pass_out {
    tri__sim_stats s;
    tri__kv_offload_stats k0, k1;
} pass_out;

static void run_pass(tri__backend *be, const tri_model *tv, tri__kv_store *kv, int32_t m, pass_out *out) {
    tri__llama ll;
    tri__kv_policy pol;
    cr_assert_eq(tri__llama_init(&ll, tv, be, m), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_policy_wrap_full(&pol, kv, tv->config.n_head, m), TRI_STATUS_OK);
    int32_t tok[16];
    float *logits = malloc(sizeof(float) * 16 * (size_t)tv->config.n_vocab);
    cr_assert_not_null(logits);
    for (int32_t i = 0; i < m; i++) tok[i] = (5 * i + 1) % tv->config.n_vocab;
    int32_t n0 = kv->n;
    tri__kv_store_offload_stats(kv, &out->k0);
    tri__sim_reset(be);
    cr_assert_eq(tri__llama_forward_policy(&ll, &pol, tok, m, TRI_LOGITS_ALL, logits), TRI_STATUS_OK);
    tri__sim_stats_get(be, &out->s);
    tri__kv_store_offload_stats(kv, &out->k1);
    cr_assert_eq(tri__kv_policy_truncate(&pol, n0), TRI_STATUS_OK);
    free(logits);
    tri__kv_policy_free(&pol);
    tri__llama_free(&ll);
}

// A pass over offloaded layers on a device of memory rate mem_gbps and link h2d_gbps.
static void offloaded_pass(double mem_gbps, double h2d_gbps) {
    tri__sim_profile p = plain_profile();
    p.launch_us = 4;
    p.kernel_us = 2;
    p.mem_gbps = mem_gbps;
    p.h2d_gbps = h2d_gbps;
    tri__backend *be = sim_open(&p);
    tri_model_config c = small_shape();
    tri_model *model, *tv;
    cr_assert_eq(tri__model_synthetic_shape(&c, TRI_DTYPE_F16, &model), TRI_STATUS_OK);
    cr_assert_eq(tri__model_on_backend(model, be, 0, 0, &tv), TRI_STATUS_OK);
    const int32_t ctx = 16384, on_chip = 2, m = 5;
    tri__kv_store kv;
    cr_assert_eq(tri__kv_store_init_offload(&kv, be, TRI_DTYPE_F16, c.n_layer, c.n_head_kv, c.head_dim, ctx + 64,
                                            on_chip),
                 TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_set_len(&kv, ctx), TRI_STATUS_OK);
    pass_out warm, o;
    run_pass(be, tv, &kv, m, &warm);
    run_pass(be, tv, &kv, m, &o);
    // the bytes on the timeline are the runtime's: every offloaded layer's rows up, the new rows down
    uint64_t up = o.k1.bytes_up - o.k0.bytes_up, down = o.k1.bytes_down - o.k0.bytes_down;
    int64_t row = tri__kv_store_row_bytes(&kv);
    cr_assert_eq(up, (uint64_t)(c.n_layer - on_chip) * 2 * (uint64_t)(ctx * row), "runtime: %llu bytes up",
                 (unsigned long long)up);
    cr_assert_eq(o.s.transfer_h2d_bytes, up);
    cr_assert_eq(o.s.transfer_d2h_bytes, down);
    cr_assert_eq(down, (uint64_t)(c.n_layer - on_chip) * 2 * (uint64_t)(m * row));
    // double buffering: uploads run while layers compute, so the pass is shorter than compute and
    // transfers one after the other, and the share hidden is what the busy intervals say
    double shorter = o.s.transfer_busy < o.s.compute_busy ? o.s.transfer_busy : o.s.compute_busy;
    cr_assert_gt(o.s.transfer_hidden, 0.5 * shorter, "overlap %g s of transfers %g s and compute %g s",
                 o.s.transfer_hidden, o.s.transfer_busy, o.s.compute_busy);
    cr_assert_lt(o.s.end, o.s.compute_busy + o.s.transfer_busy - 0.5 * o.s.transfer_hidden);
    cr_assert_geq(o.s.end, o.s.transfer_busy, "the pass lasts at least its transfers");
    // every attention of an offloaded layer starts after an upload of that size ended (its layer's)
    int64_t n;
    const tri__sim_item *it = tri__sim_trace_items(be, &n);
    int32_t n_attn = 0;
    for (int64_t i = 0; i < n; i++) {
        if (strcmp(it[i].what, "attention") != 0) continue;
        if (n_attn++ < on_chip) continue;
        int32_t uploads_done = 0;
        for (int64_t j = 0; j < n; j++)
            if (it[j].queue == TRI_SIM_QUEUE_TRANSFER && it[j].kind == TRI_SIM_KIND_H2D && it[j].end <= it[i].start)
                uploads_done++;
        // K and V of each offloaded layer up to this one
        cr_assert_geq(uploads_done, 2 * (n_attn - on_chip), "attention %d started before its rows arrived", n_attn);
    }
    cr_assert_eq(n_attn, c.n_layer);
    tri__kv_store_free(&kv);
    tri__model_backend_free(tv);
    tri__model_synthetic_free(model);
    tri__backend_free(be);
}

// Compute-bound: a slow device hides most of each upload behind the layer before.
Test(sim, offloaded_pass_compute_bound) { offloaded_pass(0.5, 10.0); }
// Transfer-bound: a slow link, so attention must wait for its rows (the events order it).
Test(sim, offloaded_pass_transfer_bound) { offloaded_pass(100.0, 0.2); }

// A batch of three sequences in one pass (tri__llama_forward_batch, as bench-offload --batch times
// it): each offloaded layer streams every sequence's rows once, (L - on_chip) x 2 x ctx rows each,
// and the streamed weight blocks come up once for the whole batch, as for one sequence alone.
Test(sim, a_batched_pass_streams_each_sequences_kv_and_the_weights_once) {
    tri__sim_profile p = plain_profile();
    tri__backend *be = sim_open(&p);
    tri_model_config c = small_shape();
    tri_model *model, *tv;
    cr_assert_eq(tri__model_synthetic_shape(&c, TRI_DTYPE_F16, &model), TRI_STATUS_OK);
    cr_assert_eq(tri__model_on_backend(model, be, 5, 0, &tv), TRI_STATUS_OK);  // five blocks stream
    enum { B = 3, M = 4 };
    const int32_t ctx = 4096, on_chip = 2;
    tri__kv_store kv[B];
    for (int i = 0; i < B; i++) {
        cr_assert_eq(tri__kv_store_init_offload(&kv[i], be, TRI_DTYPE_F16, c.n_layer, c.n_head_kv, c.head_dim, ctx + 64,
                                                on_chip),
                     TRI_STATUS_OK);
        cr_assert_eq(tri__kv_store_set_len(&kv[i], ctx), TRI_STATUS_OK);
    }
    const uint64_t per_seq =
        (uint64_t)(c.n_layer - on_chip) * 2 * (uint64_t)ctx * (uint64_t)tri__kv_store_row_bytes(&kv[0]);
    // one sequence alone
    pass_out warm, one;
    run_pass(be, tv, &kv[0], M, &warm);
    tri__weight_stream_stats w0, w1, w2;
    tri__model_stream_stats(tv, &w0);
    run_pass(be, tv, &kv[0], M, &one);
    tri__model_stream_stats(tv, &w1);
    cr_assert_eq(one.k1.bytes_up - one.k0.bytes_up, per_seq);
    const uint64_t w_one = w1.bytes_up - w0.bytes_up;
    cr_assert_gt(w_one, 0);
    // the batch
    tri__llama run, ll[B];
    tri__kv_policy pol[B];
    tri__llama_seq seq[B];
    int32_t tok[M] = {1, 2, 3, 4};
    float *logits = malloc(sizeof(float) * B * M * (size_t)c.n_vocab);
    cr_assert_not_null(logits);
    cr_assert_eq(tri__llama_init(&run, tv, be, B * M), TRI_STATUS_OK);
    tri__kv_offload_stats k0[B], k1[B];
    for (int i = 0; i < B; i++) {
        cr_assert_eq(tri__llama_init(&ll[i], tv, be, M), TRI_STATUS_OK);
        cr_assert_eq(tri__kv_policy_wrap_full(&pol[i], &kv[i], c.n_head, M), TRI_STATUS_OK);
        seq[i] = (tri__llama_seq){.ll = &ll[i], .pol = &pol[i], .tokens = tok, .n = M, .mode = TRI_LOGITS_ALL,
                                  .logits = logits + (size_t)i * M * (size_t)c.n_vocab};
        tri__kv_store_offload_stats(&kv[i], &k0[i]);
    }
    tri__sim_reset(be);
    cr_assert_eq(tri__llama_forward_batch(&run, seq, B), TRI_STATUS_OK, "%s", tri_last_error());
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    tri__model_stream_stats(tv, &w2);
    uint64_t kv_up = 0;
    for (int i = 0; i < B; i++) {
        tri__kv_store_offload_stats(&kv[i], &k1[i]);
        cr_assert_eq(k1[i].bytes_up - k0[i].bytes_up, per_seq, "sequence %d", i);
        kv_up += k1[i].bytes_up - k0[i].bytes_up;
        cr_assert_eq(kv[i].n, ctx + M);
    }
    cr_assert_eq(w2.bytes_up - w1.bytes_up, w_one, "the streamed blocks come up once for the batch");
    cr_assert_eq(s.transfer_h2d_bytes, kv_up + w_one);
    cr_assert_gt(s.end, one.s.end, "three sequences' rows take longer than one's");
    for (int i = 0; i < B; i++) {
        tri__kv_policy_free(&pol[i]);
        tri__llama_free(&ll[i]);
        tri__kv_store_free(&kv[i]);
    }
    tri__llama_free(&run);
    free(logits);
    tri__model_backend_free(tv);
    tri__model_synthetic_free(model);
    tri__backend_free(be);
}

Test(sim, a_long_offloaded_context_takes_no_host_memory) {
    // Llama2-7B's KV shape at 64K positions: 32 GiB of host regions for 30 offloaded layers,
    // mapped and never touched (this machine has less memory than that)
    const tri__sim_profile *p = tri__sim_profile_find("rtx4090");
    tri__backend *be;
    cr_assert_eq(tri__backend_sim_create(p, &be), TRI_STATUS_OK);
    uint64_t rss0 = rss_bytes();
    tri__kv_store kv;
    cr_assert_eq(tri__kv_store_init_offload(&kv, be, TRI_DTYPE_F16, 32, 32, 128, 65536, 2), TRI_STATUS_OK);
    cr_assert_eq(tri__kv_store_set_len(&kv, 65536), TRI_STATUS_OK);
    uint64_t rss1 = rss_bytes();
    cr_assert_lt(rss1, rss0 + ((uint64_t)64 << 20), "rss grew by %llu bytes",
                 (unsigned long long)(rss1 - rss0));
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    // on the device: two layers' K and V and the two double buffers of K and V
    cr_assert_eq(s.mem_used, (uint64_t)(2 * 2 + 2 * 2) * 65536 * 32 * 128 * 2);
    tri__kv_store_free(&kv);
    tri__backend_free(be);
}

// ---- the speculative engine on the simulated device, acceptance forced ----

static tri__sim_profile engine_profile;
static tri__backend *engine_be;

static tri_status sim_factory(int32_t n_threads, tri__backend **out) {
    (void)n_threads;
    tri_status st = tri__backend_sim_create(&engine_profile, out);
    if (!st) engine_be = *out;
    return st;
}

// Runs TRIFORCE for n tokens after a 600-token prompt with L3 accepting L2's tokens at rate
// alpha and L2 accepting L1's at beta; *st_out gets the engine's counts, *sim_out the timeline.
// L3's acceptance of the first drafted token in the last forced_run
static double forced_depth1;
static const double *forced_l3_depth;  // L3's acceptance by depth (index 1..forced_l3_n), or NULL
static int32_t forced_l3_n;
static int32_t forced_tree_nodes;        // > 0: L3 verifies token trees of this many nodes
static const double *forced_tree_rate;  // siblings' acceptance by depth and rank (tri__spec_force_accept_tree)
static int32_t forced_tree_n;

static void forced_run(double alpha, double beta, int32_t n, tri_spec_stats *st_out, tri__sim_stats *sim_out) {
    tri_model_config c = small_shape(), dc = small_shape();
    dc.n_layer = 1;
    tri_model *target, *draft;
    cr_assert_eq(tri__model_synthetic_shape(&c, TRI_DTYPE_F16, &target), TRI_STATUS_OK);
    cr_assert_eq(tri__model_synthetic_shape(&dc, TRI_DTYPE_F16, &draft), TRI_STATUS_OK);
    engine_profile = *tri__sim_profile_find("rtx4090");
    engine_profile.host_copy_gbps = 2.0;
    engine_profile.host_reduce_gbps = 4.0;
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 1024;
    sp.kv_layers_offloaded = 4;
    tri_spec_params p = tri_spec_default_params();
    p.mode = TRI_SPEC_MODE_TRIFORCE;
    p.drafter = TRI_SPEC_DRAFTER_MODEL;
    p.draft_model = draft;
    p.gamma1 = 2;
    p.gamma2 = 6;
    p.budget = 128;
    p.tree_nodes = forced_tree_nodes;
    tri_spec *spec;
    tri__backend_cpu_factory = sim_factory;
    tri_status st = tri_spec_create(target, &sp, &p, &spec);
    tri__backend_cpu_factory = NULL;
    cr_assert_eq(st, TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(tri__backend_is_sim(engine_be));
    tri__spec_force_accept(spec, beta, alpha, 7);
    if (forced_l3_depth) tri__spec_force_accept_depth(spec, 1, forced_l3_depth, forced_l3_n);
    if (forced_tree_rate) tri__spec_force_accept_tree(spec, forced_tree_rate, forced_tree_n);
    int32_t prompt[600];
    for (int i = 0; i < 600; i++) prompt[i] = (3 * i + 1) % c.n_vocab;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = n;
    gp.sampler.temperature = 0;
    gp.stop_at_eos = false;
    cr_assert_eq(tri_generate_spec(spec, prompt, 600, &gp, NULL, NULL, st_out), TRI_STATUS_OK, "%s", tri_last_error());
    // acceptance by depth (tri__spec_depth_counts) adds up to the totals: every kept token was kept at
    // one depth, a depth is tested only after the one before it was kept, and every L3 pass tests
    // depth 1 (but perhaps the last, cut to no draft by the token limit)
    int64_t r[2][TRI__SPEC_MAX_DEPTH + 1], a[2][TRI__SPEC_MAX_DEPTH + 1];
    for (int w = 0; w < 2; w++) {
        tri__spec_depth_counts(spec, w, r[w], a[w]);
        int64_t kept = 0;
        for (int d = 1; d <= TRI__SPEC_MAX_DEPTH; d++) {
            kept += a[w][d];
            cr_assert(a[w][d] <= r[w][d] && (d == 1 || r[w][d] <= a[w][d - 1]), "level %d depth %d", w, d);
        }
        cr_assert_eq(kept, w == 0 ? st_out->l1_accepted : st_out->l2_accepted, "level %d", w);
    }
    cr_assert(r[1][1] == st_out->n_l3_verify || r[1][1] == st_out->n_l3_verify - 1);
    cr_assert_eq(r[0][1], st_out->n_l2_verify);
    forced_depth1 = (double)a[1][1] / (double)r[1][1];
    tri__sim_stats_get(engine_be, sim_out);
    tri_spec_free(spec);
    tri__model_synthetic_free(draft);
    tri__model_synthetic_free(target);
}

Test(sim, host_work_is_on_the_hosts_clock) {
    tri__sim_profile p = plain_profile();
    p.host_copy_gbps = 2.0;
    p.host_reduce_gbps = 4.0;
    tri__backend *be = sim_open(&p);
    be->ops->host_work(be, TRI_HOST_WORK_COPY, 1e9);    // a gather: 0.5 s at 2 GB/s
    be->ops->host_work(be, TRI_HOST_WORK_REDUCE, 2e9);  // summaries: 0.5 s at 4 GB/s
    tri__sim_stats s;
    tri__sim_stats_get(be, &s);
    assert_near(s.host_work, 1.0, "host work seconds");
    assert_near(s.host, 1.0, "the host's clock");
    assert_near(s.host_work_bytes, 3e9, "host work bytes");
    tri__backend_free(be);
}

Test(sim, engine_runs_with_forced_acceptance) {
    tri_spec_stats all, none, some;
    tri__sim_stats s_all, s_none, s_some;
    // every token kept: each L3 pass emits gamma2 + 1, L2 verifies gamma2 / gamma1 drafts of L1
    forced_run(1.0, 1.0, 70, &all, &s_all);
    cr_assert_eq(all.n_generated, 70);
    cr_assert_eq(all.n_l3_verify, 10, "%lld L3 passes", (long long)all.n_l3_verify);
    cr_assert_eq(all.l2_accepted, all.l2_proposed);
    cr_assert_eq(all.l1_accepted, all.l1_proposed);
    // none kept: one token per L3 pass, one per L2 verification
    forced_run(1e-9, 1e-9, 20, &none, &s_none);
    cr_assert_eq(none.n_generated, 20);
    cr_assert_eq(none.n_l3_verify, 20);
    cr_assert_eq(none.l2_accepted, 0);
    cr_assert_eq(none.l1_accepted, 0);
    // L3 rejecting everything makes L2 select again (refresh_accept), during L3's passes: from the
    // rows those passes bring to the device, so nothing is gathered or summarised out of host memory
    // (on the host's clock, ops->host_work); before that, each later selection gathered its chunks
    // of the offloaded layers out of host rows in a sweep of its own
    cr_assert_gt(none.n_l2_refresh, 1);
    cr_assert_eq(s_none.host_work_bytes, 0, "%g bytes of host work", s_none.host_work_bytes);
    // in between: tokens per L3 pass near (1 - a^(g + 1)) / (1 - a) = 3.95 for a 0.8 and gamma2 6
    // (about 95 passes, a standard error near 0.2), and L2 keeping (0.6 + 0.36) / 2 = 0.48 of
    // L1's pairs of tokens
    forced_run(0.8, 0.6, 400, &some, &s_some);
    double per_pass = (double)some.n_generated / (double)some.n_l3_verify;
    double b = (double)some.l1_accepted / (double)some.l1_proposed;
    cr_assert(per_pass > 3.2 && per_pass < 4.7, "%.2f tokens per L3 pass", per_pass);
    cr_assert(b > 0.35 && b < 0.6, "L2 kept %.3f of L1's tokens", b);
    cr_assert(forced_depth1 > 0.7 && forced_depth1 < 0.9, "L3 kept the first token in %.3f", forced_depth1);
    // the timeline: more passes per token cost more simulated time per token, and the offloaded
    // layers' rows went up once per L3 pass at least
    cr_assert_gt(s_none.end / none.n_generated, s_all.end / all.n_generated);
    cr_assert_gt(s_all.transfer_h2d_bytes, 0);
}

// ---- the host: split attention's clock (tri__sim_host_*) and the planner's split on it ----

// Llama2-7B's layer: 32 heads of 128, one token's K and V in f16 = 2 x 32 x 128 x 2 = 16,384 bytes;
// attention costs 2 x 2 x 128 x 32 = 16,384 FLOPs per row and query.
#define ROW_7B 16384.0

Test(sim, host_profiles_are_the_stated_machines) {
    const tri__sim_host *d = tri__sim_host_find("desktop"), *w = tri__sim_host_find("workstation");
    cr_assert(d && w && !tri__sim_host_find("laptop"));
    int n;
    cr_assert(tri__sim_hosts(&n) == d && n == 2);
    cr_assert_eq(d->cores, 16);
    cr_assert_eq(w->cores, 32);
    // reached, below the channels' theoretical products: 2 and 8 x 8 bytes x 5200 MT/s
    cr_assert(d->dram_gbps < 2 * 8 * 5.2 && d->dram_gbps > 0.6 * 2 * 8 * 5.2);
    cr_assert(w->dram_gbps < 8 * 8 * 5.2 && w->dram_gbps > 0.6 * 8 * 8 * 5.2);
    assert_near(d->bf16_tflops, 2 * d->f32_tflops, "bf16 dot products: twice f32");
    assert_near(tri__sim_host_attention_flops(1000, 13, 32, 128), 1000.0 * 13 * ROW_7B, "flops");
}

Test(sim, host_attention_is_bandwidth_or_flop_bound) {
    const tri__sim_host *d = tri__sim_host_find("desktop");
    // one query over a million rows: 16.4 GB at the DRAM rate; the FLOPs (16.4 GFLOP) take far less
    double rows = 1e6, bytes = rows * ROW_7B;
    assert_near(tri__sim_host_split_seconds(d, rows, 1, 32, 128, ROW_7B, false, 0, 0), bytes / (d->dram_gbps * 1e9),
                "m=1: bytes / DRAM");
    assert_near(tri__sim_host_attn_gbps(d, 1, 32, 128, ROW_7B, false), d->dram_gbps, "m=1 reaches DRAM");
    // 64 queries: 64 FLOPs per byte, FLOP-bound at the f32 rate, twice as fast in bf16
    double flops = 64.0 * ROW_7B * 1e5;
    assert_near(tri__sim_host_split_seconds(d, 1e5, 64, 32, 128, ROW_7B, false, 0, 0), flops / (d->f32_tflops * 1e12),
                "m=64: FLOPs / f32 rate");
    assert_near(tri__sim_host_split_seconds(d, 1e5, 64, 32, 128, ROW_7B, true, 0, 0), flops / (d->bf16_tflops * 1e12),
                "m=64: FLOPs / bf16 rate");
    assert_near(tri__sim_host_attn_gbps(d, 64, 32, 128, ROW_7B, false), d->f32_tflops * 1e3 / 64, "m=64 GB/s");
}

Test(sim, dma_and_host_reads_share_dram) {
    const tri__sim_host *d = tri__sim_host_find("desktop");
    double rows = 1e6, host = rows * ROW_7B, dma = 16e9, pcie = 50;
    double host_alone = tri__sim_host_split_seconds(d, rows, 1, 32, 128, ROW_7B, false, 0, 0);
    double dma_alone = dma / (pcie * 1e9);
    double both = tri__sim_host_split_seconds(d, rows, 1, 32, 128, ROW_7B, false, dma, pcie);
    // 16.4 + 16 GB through 64 GB/s: 0.506 s, later than either alone (0.256 s, 0.32 s)
    assert_near(both, (host + dma) / (d->dram_gbps * 1e9), "shared DRAM");
    cr_assert(both > host_alone * 1.5 && both > dma_alone * 1.5);
    // a slow link: the DMA alone sets the time (32 GB at 25 GB/s = 1.28 s > 48.4 GB / 64 GB/s)
    assert_near(tri__sim_host_split_seconds(d, rows, 1, 32, 128, ROW_7B, false, 2 * dma, 25), 2 * dma / 25e9,
                "PCIe-bound");
}

static tri_plan plan_split(const tri__sim_host *h, bool share) {
    tri_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32, c.head_dim = 128, c.n_ff = 11008;
    c.n_vocab = 32000, c.n_ctx_train = 131072;
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE;
    p.n_ctx = 127 * 1024;
    p.gpu_mem_bytes = (uint64_t)24 << 30;
    p.pcie_gbps = 25;
    p.layer_overhead_us = 0;
    if (h) p.host_attn_gbps = tri__sim_host_attn_gbps(h, 1, 32, 128, ROW_7B, false);
    if (h && share) p.host_dram_gbps = h->dram_gbps;
    tri_plan pl;
    cr_assert_eq(tri_plan_compute(&m, &p, &pl), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(pl.n_weights_gpu, 32, "every block resident: the offloaded layers stream only KV");
    return pl;
}

Test(sim, planner_splits_by_host_profile) {
    const tri__sim_host *d = tri__sim_host_find("desktop"), *w = tri__sim_host_find("workstation");
    tri_plan none = plan_split(NULL, false), pd = plan_split(d, true), pw = plan_split(w, true);
    cr_assert_eq(none.kv_host_fraction, 0);
    // no streamed weights: (1 - f) K / B = f K / Hh, so f = Hh / (B + Hh): 64 / 89 and 250 / 275
    cr_assert(fabs(pd.kv_host_fraction - 64.0 / 89.0) < 1e-3, "desktop f %.4f", pd.kv_host_fraction);
    cr_assert(fabs(pw.kv_host_fraction - 250.0 / 275.0) < 1e-3, "workstation f %.4f", pw.kv_host_fraction);
    // the desktop's DRAM carries the DMA and the host's reads: every offloaded byte crosses it once,
    // so the pass takes at least them all over 64 GB/s, later than the split that ignores sharing
    double kv = (double)pd.pcie_bytes_l3 + (double)pd.host_kv_read_bytes_l3;
    cr_assert(pd.t_l3 >= kv / 64e9 * (1 - 1e-9), "%.4f s < %.4f s", pd.t_l3, kv / 64e9);
    tri_plan pd_free = plan_split(d, false);
    cr_assert(pd.t_l3 > pd_free.t_l3 * 1.2, "sharing DRAM slows the split: %.3f vs %.3f s", pd.t_l3, pd_free.t_l3);
    // the workstation's host alone reads at 250 GB/s, so host and DMA together (275) still exceed
    // its DRAM: at most 275 / 250 slower (less where the offloaded KV is not all of the pass)
    tri_plan pw_free = plan_split(w, false);
    cr_assert(pw.t_l3 > pw_free.t_l3 && pw.t_l3 <= pw_free.t_l3 * 1.1 * (1 + 1e-9), "%.4f vs %.4f s", pw.t_l3,
              pw_free.t_l3);
    cr_assert(pw.t_l3 < pd.t_l3 / 2, "workstation %.3f s, desktop %.3f s", pw.t_l3, pd.t_l3);
    cr_assert(none.t_l3 > pd.t_l3 * 2);
}

// ---- acceptance curves (bench-accept's files, docs/formats.md) ----

static char *curve_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/tri-test-curve-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

Test(sim, acceptance_curve_read_and_expected_tokens) {
    tri__sim_curve c;
    char *path = curve_file("# a comment\n\ngamma1 2\ngamma2 16\ntokens_per_l3 1.5\n"
                            "l1 1 10 7\nl1 2 7 5\nl2 1 4 2\nl2 2 2 1\n");
    cr_assert_eq(tri__sim_curve_read(path, &c), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(c.gamma1 == 2 && c.gamma2 == 16 && c.depth[0] == 2 && c.depth[1] == 2);
    assert_near(c.tokens_per_l3, 1.5, "tokens per L3 pass");
    assert_near(c.pooled[0], 12.0 / 17.0, "pooled L1");
    // 1 + 0.7 + 0.7 x 5/7; a third depth at the pooled rate; L2: 1 + 1/2 + 1/4
    assert_near(tri__sim_curve_expected(&c, 0, 2), 2.2, "L1 chain of 2");
    assert_near(tri__sim_curve_expected(&c, 0, 3), 2.2 + 0.5 * 12.0 / 17.0, "L1 chain of 3");
    assert_near(tri__sim_curve_expected(&c, 1, 2), 1.75, "L2 chain of 2");
    assert_near(tri__sim_curve_expected(&c, 1, 0), 1.0, "no draft: one token");
    unlink(path);
}

Test(sim, acceptance_curve_errors_name_file_and_line) {
    tri__sim_curve c;
    const char *bad[] = {"l1 1 10 7\nl1 3 5 1\nl2 1 1 1\n",  // depth skipped
                         "l1 1 10 11\nl2 1 1 1\n",           // accepted > reached
                         "l1 1 10 7\nalpha 0.9\n",           // not a curve line
                         "l1 1 10 7\n"};                     // no l2 level
    const char *want[] = {":2:", ":1:", ":2:", "l2 level"};
    for (int i = 0; i < 4; i++) {
        char *path = curve_file(bad[i]);
        cr_assert_eq(tri__sim_curve_read(path, &c), TRI_STATUS_BAD_FORMAT, "case %d", i);
        cr_assert(strstr(tri_last_error(), path) && strstr(tri_last_error(), want[i]), "case %d: %s", i,
                  tri_last_error());
        unlink(path);
    }
    cr_assert_eq(tri__sim_curve_read("/nonexistent/curve", &c), TRI_STATUS_IO);
}

// ---- token trees: the expected tokens of a tree verified in one pass (plan/planner.h) ----

#include "planner.h"

// Every ordered forest of n nodes, by its preorder depth sequence (depth[0] = 1, depth[i + 1] in
// 1 .. depth[i] + 1: one sequence per forest); for each, the expected tokens computed here from the
// definition (product of each node's child chance along its path), independently of the planner.
static double brute_value(const tri__accept_table *t, const int32_t *depth, int32_t n, bool leaf_siblings,
                          tri__tree_shape *s) {
    double chance[16], e = 1;
    int32_t last_at[17], next_rank[16];  // the latest node of each depth; per node, its next child's rank
    int32_t roots = 1;
    for (int32_t i = 0; i < n; i++) {
        int32_t d = depth[i], p = d == 1 ? -1 : last_at[d - 1];
        int32_t r = p < 0 ? roots++ : next_rank[p]++;
        if (leaf_siblings && p >= 0 && s->rank[p] > 1) return -1;  // a sibling with children: not the engine's
        double ch = t->a[d][r];
        for (int32_t j = 1; j < r; j++) ch *= 1 - t->a[d][j];
        chance[i] = ch * (p < 0 ? 1 : chance[p]);
        e += chance[i];
        last_at[d] = i;
        next_rank[i] = 1;
        s->parent[i] = p;
        s->rank[i] = r;
    }
    s->n = n;
    return e;
}

static void brute_best(const tri__accept_table *t, int32_t *depth, int32_t i, int32_t n, int32_t limit, bool leaf,
                       double *best, int64_t *count) {
    if (i == n) {
        tri__tree_shape s;
        double e = brute_value(t, depth, n, leaf, &s);
        if (e < 0) return;
        (*count)++;
        // the planner's own evaluation of the same tree agrees with the definition
        cr_assert(fabs(tri__accept_tree_expected(t, &s) - e) < 1e-12, "tree of %d: %.15g vs %.15g", n,
                  tri__accept_tree_expected(t, &s), e);
        if (e > *best) *best = e;
        return;
    }
    int32_t hi = i == 0 ? 1 : depth[i - 1] + 1;
    for (int32_t d = 1; d <= hi && d <= limit; d++) {
        depth[i] = d;
        brute_best(t, depth, i + 1, n, limit, leaf, best, count);
    }
}

Test(sim, best_tree_equals_brute_force_enumeration) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int trial = 0; trial < 6; trial++) {
        tri__accept_table t;
        memset(&t, 0, sizeof t);
        for (int32_t d = 1; d <= TRI_PLAN_TREE_DEPTH; d++)
            for (int32_t r = 1; r <= TRI_PLAN_TREE_RANKS; r++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                // rank 1 high, later ranks lower, varying by depth (trial 0: one rate everywhere)
                double u = (double)(x >> 11) / 9007199254740992.0;
                t.a[d][r] = trial == 0 ? 0.6 : (r == 1 ? 0.5 + 0.5 * u : 0.6 * u);
            }
        for (int32_t n = 1; n <= 7; n++)
            for (int32_t limit = 0; limit <= 3; limit++)  // 0: no depth limit but the table's
                for (int leaf = 0; leaf < 2; leaf++) {    // any tree, or the engine's (leaf siblings)
                    double best = 1;
                    int64_t count = 0;
                    int32_t depth[16];
                    for (int32_t k = 1; k <= n; k++)  // at most n nodes
                        brute_best(&t, depth, 0, k, limit ? limit : TRI_PLAN_TREE_DEPTH, leaf, &best, &count);
                    tri__tree_shape s;
                    cr_assert_eq(tri__accept_tree_best(&t, n, limit, leaf, &s), TRI_STATUS_OK);
                    cr_assert(fabs(s.expected - best) < 1e-12 * best,
                              "trial %d, %d nodes, depth <= %d, leaf %d: programme "
                              "%.15g, enumeration %.15g over %lld trees",
                              trial, n, limit, leaf, s.expected, best, (long long)count);
                    for (int32_t i = 0; leaf && i < s.n; i++)
                        cr_assert(s.parent[i] < 0 || s.rank[s.parent[i]] == 1, "a sibling with a child");
                    cr_assert(s.n <= n && (limit == 0 || s.depth_max <= limit));
                    cr_assert(fabs(tri__accept_tree_expected(&t, &s) - s.expected) < 1e-12, "its tree has its value");
                }
    }
}

Test(sim, a_chain_curve_gives_the_chain_formula) {
    tri__accept_table t;
    // one rate, no sibling ever kept: the best tree of N is the chain of N, (1 - a^(N+1)) / (1 - a)
    tri__accept_table_constant(&t, 0.8, 0.0);
    for (int32_t n = 1; n <= TRI_PLAN_TREE_DEPTH; n *= 2) {  // (the deepest a tree can be)
        tri__tree_shape s;
        cr_assert_eq(tri__accept_tree_best(&t, n, 0, false, &s), TRI_STATUS_OK);
        assert_near(s.expected, (1 - pow(0.8, n + 1)) / (1 - 0.8), "chain formula");
        cr_assert(s.n == n && s.depth_max == n, "a chain: %d nodes, depth %d", s.n, s.depth_max);
        assert_near(tri__accept_chain_expected(&t, n), s.expected, "chain expected");
    }
    // a measured chain curve (depth-dependent) with no sibling kept: the file's chain expectation
    tri__sim_curve c;
    const char *text = "l1 1 10 7\nl2 1 10 9\nl2 2 9 6\nl2 3 6 3\n";
    cr_assert_eq(tri__sim_curve_parse("chain", text, strlen(text), &c), TRI_STATUS_OK, "%s", tri_last_error());
    bool measured;
    tri__sim_curve_table(&c, 1, 0.0, &t, &measured);
    cr_assert(!measured);
    for (int32_t n = 1; n <= 8; n++) {
        tri__tree_shape s;
        cr_assert_eq(tri__accept_tree_best(&t, n, 0, false, &s), TRI_STATUS_OK);
        assert_near(s.expected, tri__sim_curve_expected(&c, 1, n), "curve chain");
    }
    // by hand: 0.9, then 0.9 x 6/9, then x 3/6
    assert_near(tri__sim_curve_expected(&c, 1, 3), 1 + 0.9 + 0.6 + 0.3, "by hand");
}

Test(sim, tree_by_hand_and_its_drafting) {
    tri__accept_table t;
    tri__accept_table_constant(&t, 0.8, 0.5);  // rank 2: 0.4, kept in 0.2 x 0.4 = 0.08 of verifications
    // two children of the context: 1 + 0.8 + 0.08
    tri__tree_shape s = {.n = 2, .parent = {-1, -1}, .rank = {1, 2}};
    assert_near(tri__accept_tree_expected(&t, &s), 1.88, "two siblings");
    // a rank that skips one, a parent after its child: not trees
    tri__tree_shape bad = {.n = 2, .parent = {-1, -1}, .rank = {1, 3}};
    cr_assert_lt(tri__accept_tree_expected(&t, &bad), 0);
    tri__tree_shape bad2 = {.n = 2, .parent = {1, -1}, .rank = {1, 1}};
    cr_assert_lt(tri__accept_tree_expected(&t, &bad2), 0);
    // the best tree of 64 beats the chain of 64 at these rates, and the chain of 16 by more
    tri__tree_shape best;
    cr_assert_eq(tri__accept_tree_best(&t, 64, 0, false, &best), TRI_STATUS_OK);
    cr_assert_gt(best.expected, tri__accept_chain_expected(&t, 64) + 0.1);
    cr_assert(best.depth_max < 64 && best.width[1] >= 2, "depth %d, %d at depth 1", best.depth_max, best.width[1]);
    // drafting: a chain of 6 with L1 giving 2 per L2 pass: 3 passes, nothing off the path
    tri__tree_shape chain = {.n = 6, .parent = {-1, 0, 1, 2, 3, 4}, .rank = {1, 1, 1, 1, 1, 1}};
    cr_assert_gt(tri__accept_tree_expected(&t, &chain), 0);
    double passes;
    int32_t extra;
    tri__accept_tree_drafting(&chain, 2.0, &passes, &extra);
    assert_near(passes, 3.0, "chain passes");
    cr_assert_eq(extra, 0);
    // a side branch of three below the first node's sibling: that sibling (off the path, drafted
    // with pass 0's distribution) is evaluated in pass 1, its child in pass 2: 3 passes either way,
    // 2 off-path nodes to evaluate (the last is a leaf)
    tri__tree_shape side = {.n = 5, .parent = {-1, 0, -1, 2, 3}, .rank = {1, 1, 2, 1, 1}};
    cr_assert_gt(tri__accept_tree_expected(&t, &side), 0);
    tri__accept_tree_drafting(&side, 2.0, &passes, &extra);
    assert_near(passes, 2.0, "side passes: the branch's second evaluation in pass 1, done by 2");
    cr_assert_eq(extra, 2);
    cr_assert_eq(tri__accept_tree_best(&t, TRI_PLAN_TREE_MAX_NODES + 1, 0, false, &best), TRI_STATUS_INVALID_ARGUMENT);
}

Test(sim, tree_curve_records_read_and_errors_name_file_line_and_field) {
    tri__sim_curve c;
    const char *text =
        "gamma1 2\ngamma2 16\ntree_nodes 32\nl1 1 10 7\nl2 1 10 8\n"
        "tree 1 0 10 8\ntree 1 1 2 1\ntree 1 2 1 0\ntree 2 0 8 4\ntree 2 1 4 1\n";
    cr_assert_eq(tri__sim_curve_parse("t", text, strlen(text), &c), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert(c.tree_depth == 2 && c.tree_ranks[1] == 3 && c.tree_ranks[2] == 2 && c.tree_nodes == 32);
    assert_near(c.tree[1][2], 0.5, "depth 1 rank 2");
    assert_near(c.tree_pooled[2], 2.0 / 6.0, "rank 2 pooled over depths");
    tri__accept_table t;
    bool measured;
    tri__sim_curve_table(&c, 1, 0.5, &t, &measured);
    cr_assert(measured);
    assert_near(t.a[2][1], 0.5, "measured");
    assert_near(t.a[5][1], 12.0 / 18.0, "beyond the deepest depth: the rank's pooled rate");
    assert_near(t.a[2][3], 0.0, "rank 3 at depth 2 ... pooled over the depths that measured it");
    cr_assert_eq(t.a[1][4], 0, "a rank never measured is never drafted");
    // errors: file, line and field named
    const char *bad[] = {"l1 1 10 7\nl2 1 5 5\ntree 1 1 3 1\n",                 // rank 1 before the chain's (0)
                         "l1 1 10 7\nl2 1 5 5\ntree 1 0 3 4\n",                 // accepted > reached
                         "l1 1 10 7\nl2 1 5 5\ntree 1 0 3\n",                   // a field missing
                         "l1 1 10 7\nl2 1 5 x5\n",                              // not a count
                         "l1 1 10 7\nl2 1 5 5 9\n",                             // one too many
                         "l1 1 10 7\nl2 1 5 5\ntree 1 0 3 1\ntree 1 17 3 1\n",  // rank past the limit
                         "l1 1 10 7\nl2 1 5 5\ntokens_per_l3 0.5\n",
                         "l1 1 10 7\nl2 1 5 5\ntree 1 0 3 1\ntree 3 0 3 1\n"};  // a depth skipped
    const char *want[] = {":3: field RANK",     ":3: field ACCEPTED", ":3: field ACCEPTED missing",
                          ":2: field ACCEPTED", ":2: '9' after",      ":4: field RANK",
                          ":3: field X",        ":4: field DEPTH"};
    for (int i = 0; i < 8; i++) {
        char *path = curve_file(bad[i]);
        cr_assert_eq(tri__sim_curve_read(path, &c), TRI_STATUS_BAD_FORMAT, "case %d", i);
        cr_assert(strstr(tri_last_error(), path) && strstr(tri_last_error(), want[i]), "case %d: %s", i,
                  tri_last_error());
        unlink(path);
    }
}

Test(sim, planner_trees_cost_a_flat_pass_and_the_choice_is_the_fastest) {
    tri_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32, c.head_dim = 128, c.n_ff = 11008;
    c.n_vocab = 32000, c.n_ctx_train = 131072;
    tri_plan_model m = tri_plan_model_from_config(&c, TRI_DTYPE_F16);
    tri_plan_params p = tri_plan_default_params();
    p.n_ctx = 127 * 1024 + 129;
    p.gamma2 = 16;
    p.retrieval_budget = 8192;
    tri_plan chain, tree;
    cr_assert_eq(tri_plan_compute(&m, &p, &chain), TRI_STATUS_OK, "%s", tri_last_error());
    p.tree_nodes = 64;
    cr_assert_eq(tri_plan_compute(&m, &p, &tree), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(chain.l3_rows, 17);
    cr_assert(chain.tree_nodes_used == 0 && chain.tree_depth == 16);
    cr_assert(tree.l3_rows == tree.tree_nodes_used + 1 && tree.tree_nodes_used <= 64 && tree.tree_nodes_used > 16);
    // PCIe-bound: 4x the rows cost the L3 pass a few percent; more tokens per pass
    cr_assert(tree.t_l3 < chain.t_l3 * 1.05, "tree pass %.1f ms, chain %.1f ms", 1e3 * tree.t_l3, 1e3 * chain.t_l3);
    cr_assert_gt(tree.tokens_per_round, chain.tokens_per_round + 0.2, "%.3f vs %.3f", tree.tokens_per_round,
                 chain.tokens_per_round);
    // the same tree by hand: the best at the chosen depth under alpha 0.9, decay 0.5
    tri__accept_table t;
    tri__accept_table_constant(&t, 0.9, 0.5);
    tri__tree_shape s;
    cr_assert_eq(tri__accept_tree_best(&t, 64, tree.tree_depth, true, &s), TRI_STATUS_OK);  // the engine's shape
    cr_assert(tree.tree_depth <= 16, "the engine's chain is at most gamma2: %d", tree.tree_depth);
    assert_near(tree.tokens_per_round, s.expected, "the planner's tree");
    // the chooser: the faster of the two
    int32_t chains[] = {16}, trees[] = {64};
    tri_plan best;
    p.tree_nodes = 0;
    cr_assert_eq(tri__plan_choose(&m, &p, NULL, NULL, 0, 0, 0, chains, 1, trees, 1, &best), TRI_STATUS_OK);
    assert_near(best.t_token, fmin(chain.t_token, tree.t_token), "choice");
    p.tree_nodes = TRI_PLAN_TREE_MAX_NODES + 1;
    cr_assert_eq(tri_plan_compute(&m, &p, &best), TRI_STATUS_INVALID_ARGUMENT);
}

Test(sim, engine_acceptance_forced_by_depth) {
    // L3 keeps the first drafted token always, the second never (a curve), the rest at 0.5: every
    // pass emits exactly two tokens, the kept first and the replacement of the second
    static const double by_depth[] = {0, 1.0, 0.0};
    forced_l3_depth = by_depth;
    forced_l3_n = 2;
    tri_spec_stats st;
    tri__sim_stats sim;
    forced_run(0.5, 0.7, 40, &st, &sim);
    forced_l3_depth = NULL;
    cr_assert_eq(st.n_generated, 40);
    cr_assert_eq(st.n_l3_verify, 20, "%lld passes", (long long)st.n_l3_verify);
    cr_assert_eq(st.l2_accepted, 20);
}

Test(sim, engine_runs_token_trees_with_siblings_forced_by_rank) {
    // the simulated device takes a tree pass (TRI_BACKEND_CAP_TREES), and forced acceptance covers the
    // siblings: L3 never keeps the chain's first token but always the first sibling at depth 1, so
    // every pass emits exactly two tokens (the sibling and the token after it), which a chain could
    // not (it would emit one per pass), with a tree of siblings drafted at depth 1 in every pass
    static const double by_depth[] = {0, 0.0};
    static double by_rank[2 * (TRI__TREE_MAX_RANK + 1)];
    by_rank[(TRI__TREE_MAX_RANK + 1) + 1] = 1.0;  // depth 1, rank 1; the other ranks never
    forced_l3_depth = by_depth;
    forced_l3_n = 1;
    forced_tree_nodes = 24;
    forced_tree_rate = by_rank;
    forced_tree_n = 1;
    tri_spec_stats st;
    tri__sim_stats sim;
    forced_run(0.5, 0.7, 40, &st, &sim);
    forced_l3_depth = NULL;
    forced_tree_nodes = 0;
    forced_tree_rate = NULL;
    cr_assert_eq(st.n_generated, 40);
    cr_assert_eq(st.n_l3_verify, 20, "%lld passes", (long long)st.n_l3_verify);
    cr_assert_eq(st.l2_accepted, 20, "%lld kept", (long long)st.l2_accepted);
    cr_assert_gt(st.n_l3_tree_nodes, st.l2_proposed, "%lld tree nodes for %lld chain tokens",
                 (long long)st.n_l3_tree_nodes, (long long)st.l2_proposed);
    cr_assert_gt(sim.transfer_h2d_bytes, 0);
}
