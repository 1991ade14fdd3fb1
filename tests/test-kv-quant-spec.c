// test-kv-quant-spec.c - a quantized full cache (kv_type q8_0 / q4_0) as the speculative target.
//
// L3 verifies every token, so greedy speculative decoding over a quantized L3 gives plain greedy
// decoding of the same quantized cache (itself checked against tests/reference/llama_ref.py with
// --kv-quant in test-kv-quant.c) token for token, in every mode: draft (L1's own cache),
// retrieval and triforce (L2 gathering its chunks out of L3's quantized rows, in memory and
// offloaded), and with token trees. L2's gathered rows are checked against L3's own rows: the same
// blocks where the draft type is L3's, L3's values quantized again where it is another. And
// `offload-run generate --kv-type q8_0|q4_0 --spec ...` prints plain decoding's tokens.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtype.h"
#include "kv-policy.h"
#include "level.h"
#include "spec.h"
#include "test-util.h"
#include "triforce.h"

enum { N_PROMPT = 20, N_CTX = 96, GEN = 48 };
static const int32_t prompt[N_PROMPT] = {17, 260, 3, 99, 42, 42, 301, 7, 150, 5, 77, 270, 8, 64, 200, 1, 33, 90, 4, 11};

// Whether L2's gathered rows hold L3's rows (of type l3) as rows of gtype: the last layer's first
// selected chunk of each KV head (an offloaded layer when L3 offloads any), keys and values: the
// same bytes when gtype is l3, else L3's values quantized to gtype. Returns the rows compared (0:
// no selection).
static int check_l2_rows(tri_spec *spec, tri_dtype l3, tri_dtype gtype) {
    tri__level *l2 = tri__spec_level(spec, 2), *lv3 = tri__spec_level(spec, 3);
    cr_assert(l2 && lv3 && lv3->pol.kv->type == l3, "L3 holds %s, want %s", tri_dtype_name(lv3->pol.kv->type),
              tri_dtype_name(l3));
    if (tri__kv_policy_selected_at(&l2->pol) < 0) return 0;
    const int32_t hd = l2->model->config.head_dim, C = l2->pol.p.chunk, il = l2->model->config.n_layer - 1;
    cr_assert(hd <= 64);
    int compared = 0;
    for (int32_t h = 0; h < l2->pol.n_head_kv; h++) {
        int32_t ids[64], n_sel;
        if (tri__kv_policy_selection(&l2->pol, il, h, ids, &n_sel) <= 0) continue;
        for (int which = 0; which < 2; which++) {
            uint8_t r3[256], got[256], want[256];
            float x[64];
            cr_assert(tri__kv_policy_peek(&lv3->pol, il, h, ids[0] * C, which, r3));
            if (gtype == l3) {
                memcpy(want, r3, (size_t)tri__dtype_row_bytes(l3, hd));
            } else {
                tri__dequantize_row(x, r3, l3, hd);
                cr_assert(tri__quantize_row(want, x, gtype, hd));
            }
            cr_assert(tri__kv_policy_peek(&l2->pol, il, h, ids[0] * C, which, got));
            cr_assert(memcmp(got, want, (size_t)tri__dtype_row_bytes(gtype, hd)) == 0,
                      "L2's gathered %s row of position %d (head %d) is not L3's %s row as %s", which ? "value" : "key",
                      ids[0] * C, h, tri_dtype_name(l3), tri_dtype_name(gtype));
            compared++;
        }
    }
    return compared;
}

// Greedy speculative decoding over an L3 of type, in each mode (and L3's last two layers offloaded,
// and trees of 8 nodes), against plain greedy decoding with the same cache.
static void check_target(tri_model *m, tri_dtype type, tri_dtype other) {
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = N_CTX;
    sp.kv_type = type;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = GEN;
    gp.stop_at_eos = false;
    int32_t want[GEN], got[GEN], *w = want;
    tri_session *s;
    cr_assert_eq(tri_session_create(m, &sp, &s), TRI_STATUS_OK, "%s", tri_last_error());
    cr_assert_eq(tri_generate(s, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, NULL), TRI_STATUS_OK, "%s",
                 tri_last_error());
    tri_session_free(s);
    static const int32_t layer0[1] = {0};
    const tri_spec_mode modes[3] = {TRI_SPEC_MODE_DRAFT, TRI_SPEC_MODE_RETRIEVAL, TRI_SPEC_MODE_TRIFORCE};
    int gathered = 0, gathered_offloaded = 0, converted = 0;
    // runs: the three modes, triforce offloaded, triforce with L2's chunks converted to `other`
    // (in memory, then offloaded), draft and triforce with trees
    for (int run = 0; run < 8; run++) {
        tri_spec_params p = tri_spec_default_params();
        tri_session_params spo = sp;
        spo.kv_layers_offloaded = run == 3 || run == 5 ? 2 : 0;
        p.mode = run < 3 ? modes[run] : run == 6 ? TRI_SPEC_MODE_DRAFT : TRI_SPEC_MODE_TRIFORCE;
        p.drafter = TRI_SPEC_DRAFTER_LAYERS;
        p.draft_layers = layer0;
        p.n_draft_layers = 1;
        p.gamma1 = 2;
        p.gamma2 = 4;
        p.budget = 32;
        p.chunk = 8;
        p.draft_window = 24;
        p.draft_sink = 4;
        if (run == 4 || run == 5) p.draft_kv_type = other;
        if (run >= 6) p.tree_nodes = 8;
        const tri_dtype gtype = run == 4 || run == 5 ? other : type;  // left to the default: L3's type
        tri_spec *spec;
        cr_assert_eq(tri_spec_create(m, &spo, &p, &spec), TRI_STATUS_OK, "%s", tri_last_error());
        w = got;
        tri_spec_stats st;
        cr_assert_eq(tri_generate_spec(spec, prompt, N_PROMPT, &gp, tt_collect_cursor, &w, &st), TRI_STATUS_OK, "%s",
                     tri_last_error());
        cr_assert_eq(w - got, GEN);
        for (int i = 0; i < GEN; i++)
            cr_assert_eq(got[i], want[i], "L3 %s, run %d (mode %d%s, draft %s): token %d is %d, plain %d",
                         tri_dtype_name(type), run, (int)p.mode, spo.kv_layers_offloaded ? " offloaded" : "",
                         tri_dtype_name(gtype), i, got[i], want[i]);
        cr_assert(st.l1_proposed > 0 || st.l2_proposed > 0);
        if (p.mode != TRI_SPEC_MODE_DRAFT) {
            int n = check_l2_rows(spec, type, gtype);
            gathered += n;
            if (spo.kv_layers_offloaded) gathered_offloaded += n;
            if (gtype != type) converted += n;
        }
        tri_spec_free(spec);
    }
    cr_assert(gathered > 0 && gathered_offloaded > 0 && converted > 0,
              "L3 %s: L2 made no selection%s: its gather went untested", tri_dtype_name(type),
              !gathered             ? ""
              : !gathered_offloaded ? " over offloaded rows"
                                    : " of converted rows");
}

Test(kv_quant_spec, q8_0_target_keeps_greedy_output, .timeout = TT_TIMEOUT(120)) {
    const char *path = tt_gen_model("kvqs", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 3");
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    check_target(m, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0);
    tri_model_free(m);
}

Test(kv_quant_spec, q4_0_target_keeps_greedy_output, .timeout = TT_TIMEOUT(120)) {
    const char *path = tt_gen_model("kvqs", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 3");
    tri_model *m;
    cr_assert_eq(tri_model_load(path, NULL, &m), TRI_STATUS_OK, "%s", tri_last_error());
    check_target(m, TRI_DTYPE_Q4_0, TRI_DTYPE_Q8_0);
    tri_model_free(m);
}

// ---- offload-run generate ----

// Runs `offload-run ARGS`, stdout into out, stderr into err; returns the exit status.
static int cli(const char *args, char *out, size_t out_size, char *err, size_t err_size) {
    const char *bin = getenv("TRI_OFFLOAD_RUN");
    cr_assert(bin, "TRI_OFFLOAD_RUN is not set: run through meson test");
    char o[4096], e[4096], cmd[24576], name[64];
    snprintf(name, sizeof name, "kvqs-cli-%d.out", (int)getpid());  // Criterion's tests run in parallel
    snprintf(o, sizeof o, "%s", tt_tmp(name));
    snprintf(name, sizeof name, "kvqs-cli-%d.err", (int)getpid());
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

// --kv-type q8_0 / q4_0 with --spec draft, retrieval and triforce (small caches, so that L1 evicts
// and L2 selects; L3 offloaded; a tree): the tokens of plain decoding with the same --kv-type.
Test(kv_quant_spec, offload_run_generate_with_a_quantized_target, .timeout = TT_TIMEOUT(120)) {
    const char *m = tt_gen_model("kvqs-cli", "--dtype f32 --heads 4 --kv-heads 2 --head-dim 32 --layers 4");
    static char args[8192], out[1 << 16], err[1 << 16], plain[1 << 16];
    const char *types[2] = {"q8_0", "q4_0"};
    const char *modes[] = {"--spec draft --draft-layers 0-1 --draft-window 8 --draft-sink 2",
                           "--spec retrieval --budget 8 --chunk 4 --refresh 4",
                           "--spec triforce --draft-layers 0,2 --draft-window 8 --draft-sink 2 --budget 8 --chunk 4 "
                           "--stats",
                           "--spec triforce --draft-layers 0 --budget 8 --chunk 4 --kv-offload 2",
                           "--spec triforce --draft-layers 0 --budget 8 --chunk 4 --draft-kv-type f16",
                           "--spec retrieval --budget 8 --chunk 4 --tree-nodes 12"};
    for (int t = 0; t < 2; t++) {
        snprintf(args, sizeof args,
                 "generate -m '%s' --tokens 17,260,3,99,42,42,301,7,150,5,77,270 -n 24 --ids --ignore-eos "
                 "--kv-type %s",
                 m, types[t]);
        cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
        snprintf(plain, sizeof plain, "%s", out);
        cr_assert(strlen(plain) > 24, "%s", plain);
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
            snprintf(args, sizeof args,
                     "generate -m '%s' --tokens 17,260,3,99,42,42,301,7,150,5,77,270 -n 24 --ids --ignore-eos "
                     "--kv-type %s %s",
                     m, types[t], modes[i]);
            cr_assert_eq(cli(args, out, sizeof out, err, sizeof err), 0, "--kv-type %s %s: %s", types[t], modes[i],
                         err);
            cr_assert_str_eq(out, plain, "--kv-type %s %s", types[t], modes[i]);
        }
        cr_assert(strstr(err, "generated: 24 tokens"), "%s", err);
    }
}
