// cli-engine.c - the options that build the engine, shared by generate and serve: --device,
// --kv-type, the KV cache policy of plain decoding, speculative decoding and its drafters, and
// placement (the planner's budgets and what it leaves to the user).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum {
    E_DEVICE, E_KV_TYPE, E_KV_OFFLOAD, E_STREAM_WEIGHTS, E_WEIGHTS_FROM_DISK, E_GPU_MEM, E_HOST_MEM, E_KV_HOST,
    E_HOST_ATTN, E_KV, E_BUDGET, E_KV_BUDGET, E_CHUNK, E_KV_CHUNK, E_SINK, E_REFRESH, E_KV_INDEX, E_SPEC, E_DRAFT,
    E_DRAFT_LAYERS, E_DRAFT_NGRAM, E_GAMMA1, E_GAMMA2, E_TREE_NODES, E_DRAFT_WINDOW, E_DRAFT_SINK, E_DRAFT_KV,
    E_REFRESH_ACCEPT, E_KV_MIXED_HEAVY,
};

// Layers read from disk stream: they count among the streamed unless --stream-weights was given.
static void engine_disk_streams(tri_cli_engine *e) {
    if (!e->stream_weights_set && e->sp.weight_layers_from_disk > e->sp.weight_layers_streamed)
        e->sp.weight_layers_streamed = e->sp.weight_layers_from_disk;
}

// arg among choices[0 .. n) (the value at the same index into *out); false after printing
// "<cmd>: <opt> '<arg>': want <want>".
static bool engine_pick(const char *cmd, const char *opt, const char *arg, const char *const *choices,
                        const int *values, int n, const char *want, int *out) {
    for (int i = 0; i < n; i++) {
        if (strcmp(arg, choices[i]) == 0) {
            *out = values[i];
            return true;
        }
    }
    fprintf(stderr, "%s: %s '%s': want %s\n", cmd, opt, arg, want);
    return false;
}

void tri_cli_engine_init(tri_cli_engine *e) {
    memset(e, 0, sizeof *e);
    e->sp = tri_session_default_params();
    e->spec = tri_spec_default_params();
    e->spec.mode = TRI_SPEC_MODE_NONE;
    e->draft_kv = TRI_DTYPE_F16;
}

bool tri_cli_engine_option(const char *cmd, int c, const char *arg, tri_cli_engine *e, bool *handled) {
    *handled = c >= TRI_CLI_OPT_ENGINE && c < TRI_CLI_OPT_ENGINE + TRI_CLI_ENGINE_COUNT;
    if (!*handled) return true;
    switch (c - TRI_CLI_OPT_ENGINE) {
    case E_DEVICE: return tri_cli_parse_device(cmd, arg, &e->sp);
    case E_KV_TYPE: return tri_cli_parse_kv_type(cmd, "--kv-type", arg, &e->sp.kv_type);
    case E_KV_OFFLOAD:
        e->kv_offload_set = true;
        return tri_cli_parse_long(cmd, "--kv-offload", arg, 0, 65536, &e->kv_offload);
    case E_STREAM_WEIGHTS:
        e->stream_weights_set = true;
        return tri_cli_parse_long(cmd, "--stream-weights", arg, 0, 65536, &e->stream_weights);
    case E_WEIGHTS_FROM_DISK:
        e->weights_from_disk_set = true;
        return tri_cli_parse_long(cmd, "--weights-from-disk", arg, 0, 65536, &e->weights_from_disk);
    case E_GPU_MEM:
    case E_HOST_MEM: {
        const bool gpu = c - TRI_CLI_OPT_ENGINE == E_GPU_MEM;
        if (tri_cli_parse_size(arg, gpu ? &e->gpu_mem : &e->host_mem)) return true;
        fprintf(stderr, "%s: %s '%s': want a size like 24G or 512M\n", cmd, gpu ? "--gpu-mem" : "--host-mem", arg);
        return false;
    }
    case E_KV_HOST:
        e->kv_host_set = true;
        return tri_cli_parse_float(cmd, "--kv-host", arg, 0.0, 1.0, &e->kv_host);
    case E_HOST_ATTN: return tri_cli_parse_float(cmd, "--host-attn-gbps", arg, 0.0, 1e6, &e->host_attn_gbps);
    case E_KV: {
        static const char *const policies[] = {"full", "streaming", "h2o", "retrieval"};
        static const int values[] = {TRI_KV_POLICY_FULL, TRI_KV_POLICY_STREAMING, TRI_KV_POLICY_H2O,
                                     TRI_KV_POLICY_RETRIEVAL};
        int v;
        e->kv_set = true;
        if (!engine_pick(cmd, "--kv", arg, policies, values, 4, "full, streaming, h2o or retrieval", &v)) return false;
        e->sp.kv_policy = (tri_kv_policy)v;
        return true;
    }
    case E_BUDGET:
    case E_KV_BUDGET:
        return tri_cli_parse_long(cmd, c - TRI_CLI_OPT_ENGINE == E_BUDGET ? "--budget" : "--kv-budget", arg, 1,
                                  INT32_MAX, &e->budget);
    case E_CHUNK:
    case E_KV_CHUNK:
        return tri_cli_parse_long(cmd, c - TRI_CLI_OPT_ENGINE == E_CHUNK ? "--chunk" : "--kv-chunk", arg, 1, 4096,
                                  &e->chunk);
    case E_SINK: return tri_cli_parse_long(cmd, "--sink", arg, 1, INT32_MAX, &e->sink);
    case E_REFRESH: return tri_cli_parse_long(cmd, "--refresh", arg, 1, INT32_MAX, &e->refresh);
    case E_KV_INDEX: {
        static const char *const indexes[] = {"exact", "faiss", "faiss-ivf"};
        static const int values[] = {TRI_KV_INDEX_EXACT, TRI_KV_INDEX_FAISS_FLAT, TRI_KV_INDEX_FAISS_IVF};
        int v;
        e->index_set = true;
        if (!engine_pick(cmd, "--kv-index", arg, indexes, values, 3, "exact, faiss or faiss-ivf", &v)) return false;
        e->sp.kv_index = (tri_kv_index)v;
        return true;
    }
    case E_SPEC: {
        static const char *const modes[] = {"none", "draft", "retrieval", "triforce"};
        static const int values[] = {TRI_SPEC_MODE_NONE, TRI_SPEC_MODE_DRAFT, TRI_SPEC_MODE_RETRIEVAL,
                                     TRI_SPEC_MODE_TRIFORCE};
        int v;
        if (!engine_pick(cmd, "--spec", arg, modes, values, 4, "none, draft, retrieval or triforce", &v)) return false;
        e->spec.mode = (tri_spec_mode)v;
        return true;
    }
    case E_DRAFT: e->draft_path = arg; return true;
    case E_DRAFT_LAYERS: e->draft_layers = arg; return true;
    case E_DRAFT_NGRAM: return tri_cli_parse_long(cmd, "--draft-ngram", arg, 1, 64, &e->ngram);
    case E_GAMMA1: return tri_cli_parse_long(cmd, "--gamma1", arg, 1, 64, &e->gamma1);
    case E_GAMMA2: return tri_cli_parse_long(cmd, "--gamma2", arg, 1, 256, &e->gamma2);
    case E_TREE_NODES: return tri_cli_parse_long(cmd, "--tree-nodes", arg, 0, 1024, &e->tree_nodes);
    case E_DRAFT_WINDOW: return tri_cli_parse_long(cmd, "--draft-window", arg, 2, INT32_MAX, &e->draft_window);
    case E_DRAFT_SINK: return tri_cli_parse_long(cmd, "--draft-sink", arg, 1, INT32_MAX, &e->draft_sink);
    case E_DRAFT_KV:
        e->draft_kv_set = true;
        return tri_cli_parse_kv_type(cmd, "--draft-kv-type", arg, &e->draft_kv);
    case E_REFRESH_ACCEPT:
        e->refresh_accept_set = true;
        return tri_cli_parse_float(cmd, "--refresh-accept", arg, 0.0, 1.0, &e->spec.refresh_accept);
    case E_KV_MIXED_HEAVY: {
        long heavy = 0;
        if (!tri_cli_parse_long(cmd, "--kv-mixed-heavy", arg, 0, 1 << 20, &heavy)) return false;
        e->sp.kv_mixed_heavy = (int32_t)heavy;
        return true;
    }
    }
    return true;
}

bool tri_cli_engine_check(const char *cmd, tri_cli_engine *e) {
    const tri_spec_mode mode = e->spec.mode;
    const int n_drafters = (e->draft_path != NULL) + (e->draft_layers != NULL) + (e->ngram != 0);
    const bool needs_drafter = mode == TRI_SPEC_MODE_DRAFT || mode == TRI_SPEC_MODE_TRIFORCE;
    if (n_drafters > 1 || (needs_drafter && n_drafters == 0) || (!needs_drafter && n_drafters == 1)) {
        fprintf(stderr, "%s: %s\n", cmd,
                n_drafters > 1 ? "give at most one of --draft, --draft-layers, --draft-ngram"
                : needs_drafter ? "--spec draft and --spec triforce need one of --draft, --draft-layers, --draft-ngram"
                                : "a drafter needs --spec draft or --spec triforce");
        return false;
    }
    // every cache option must do something under the chosen policy or mode
    const bool plain = mode == TRI_SPEC_MODE_NONE;
    const bool has_l2 = mode == TRI_SPEC_MODE_RETRIEVAL || mode == TRI_SPEC_MODE_TRIFORCE;
    const bool l1_cache = needs_drafter && e->ngram == 0;  // the n-gram drafter has no cache
    const tri_kv_policy pol = e->sp.kv_policy;
    const bool mixed = e->sp.kv_type == TRI_DTYPE_KV_MIXED;  // --budget, --sink: its f16 tokens and sinks
    const bool retrieval = pol == TRI_KV_POLICY_RETRIEVAL;
    const char *l2 = "L2, the retrieval cache of --spec retrieval and triforce";
    const char *l1 = "an L1 model or layers (--spec draft or triforce)";
    if (!tri_cli_applies(cmd, "--kv", e->kv_set, plain, "plain decoding; the levels of --spec have their own caches") ||
        !tri_cli_applies(cmd, "--budget", e->budget, plain ? pol != TRI_KV_POLICY_FULL || mixed : has_l2 || mixed,
                         plain ? "--kv streaming, h2o or retrieval, or --kv-type mixed (the cache policy is full)"
                               : "L2, the retrieval cache of --spec retrieval and triforce, or --kv-type mixed") ||
        !tri_cli_applies(cmd, "--chunk", e->chunk, plain ? retrieval : has_l2, plain ? "--kv retrieval" : l2) ||
        !tri_cli_applies(cmd, "--kv-index", e->index_set, plain ? retrieval : has_l2, plain ? "--kv retrieval" : l2) ||
        !tri_cli_applies(cmd, "--refresh", e->refresh, plain ? retrieval : has_l2, plain ? "--kv retrieval" : l2) ||
        !tri_cli_applies(cmd, "--sink", e->sink, (plain && pol == TRI_KV_POLICY_STREAMING) || mixed,
                         plain ? "--kv streaming"
                               : "--kv streaming or --kv-type mixed (L1's sinks are --draft-sink)") ||
        !tri_cli_applies(cmd, "--draft-window", e->draft_window, l1_cache, l1) ||
        !tri_cli_applies(cmd, "--draft-sink", e->draft_sink, l1_cache, l1) ||
        !tri_cli_applies(cmd, "--draft-kv-type", e->draft_kv_set, l1_cache || has_l2,
                         "a draft cache: an L1 model or layers (--spec draft or triforce), or L2 (--spec "
                         "retrieval or triforce)") ||
        !tri_cli_applies(cmd, "--gamma1", e->gamma1, mode == TRI_SPEC_MODE_TRIFORCE, "--spec triforce") ||
        !tri_cli_applies(cmd, "--gamma2", e->gamma2, !plain, "--spec draft, retrieval or triforce") ||
        !tri_cli_applies(cmd, "--tree-nodes", e->tree_nodes, !plain, "--spec draft, retrieval or triforce") ||
        !tri_cli_applies(cmd, "--refresh-accept", e->refresh_accept_set, has_l2, "--spec retrieval or triforce"))
        return false;
    tri_session_params *sp = &e->sp;
    if (plain || mixed) {  // with --spec, mixed's f16 tokens and sinks (it serves no L2)
        sp->kv_budget = (int32_t)e->budget;
        sp->kv_chunk = (int32_t)e->chunk;
        sp->kv_sink = (int32_t)e->sink;
        sp->kv_refresh = (int32_t)e->refresh;
    }
    sp->kv_layers_offloaded = (int32_t)e->kv_offload;
    sp->weight_layers_streamed = (int32_t)e->stream_weights;
    sp->weight_layers_from_disk = (int32_t)e->weights_from_disk;
    sp->kv_host_fraction = e->kv_host;
    engine_disk_streams(e);
    tri_spec_params *s = &e->spec;
    s->refresh = (int32_t)e->refresh;
    s->draft_window = (int32_t)e->draft_window;
    s->draft_sink = (int32_t)e->draft_sink;
    if (e->draft_kv_set) s->draft_kv_type = e->draft_kv;
    s->ngram_n = (int32_t)e->ngram;
    s->gamma1 = (int32_t)e->gamma1;
    s->gamma2 = (int32_t)e->gamma2;
    s->tree_nodes = (int32_t)e->tree_nodes;
    s->budget = (int32_t)e->budget;
    s->chunk = (int32_t)e->chunk;
    if (e->draft_path) s->drafter = TRI_SPEC_DRAFTER_MODEL;
    if (e->draft_layers) s->drafter = TRI_SPEC_DRAFTER_LAYERS;
    if (e->ngram) s->drafter = TRI_SPEC_DRAFTER_NGRAM;
    return true;
}

bool tri_cli_engine_place(const tri_model *model, tri_cli_engine *e, int32_t n_slots, char *line, size_t n) {
    tri_session_params *sp = &e->sp;
    const tri_spec_params *spec = &e->spec;
    line[0] = 0;
    bool on_gpu = sp->device_kind == TRI_DEVICE_CUDA || (sp->device_kind == TRI_DEVICE_AUTO && tri_device_count() > 0);
    int32_t n_gpu = 1, first = 0;  // a device list of GPUs: the planner splits as the session will
    if (sp->devices) {
        on_gpu = strncmp(sp->devices, "cuda", 4) == 0;
        for (const char *c = sp->devices; on_gpu && *c; c++) n_gpu += *c == ',';
        if (on_gpu && sp->devices[4] == ':') first = atoi(sp->devices + 5);
    }
    if (!e->gpu_mem && !on_gpu) return true;  // the CPU: nothing to place
    if (n_slots < 1) n_slots = 1;
    tri_plan_params pp = tri_plan_default_params();
    pp.mode = spec->mode == TRI_SPEC_MODE_NONE ? TRI_PLAN_MODE_AUTOREGRESSIVE : TRI_PLAN_MODE_TRIFORCE;
    pp.n_ctx = sp->n_ctx;
    pp.kv_type = sp->kv_type;
    pp.host_mem_bytes = e->host_mem / (uint64_t)n_slots;
    pp.n_gpu = n_gpu;
    if (spec->budget > 0) pp.retrieval_budget = spec->budget;
    if (spec->gamma1 > 0) pp.gamma1 = spec->gamma1;
    if (spec->gamma2 > 0) pp.gamma2 = spec->gamma2;
    tri_device_info di;
    int32_t dev = sp->devices ? first : sp->device_kind == TRI_DEVICE_CUDA ? sp->device : 0;
    if (e->gpu_mem) pp.gpu_mem_bytes = e->gpu_mem;
    else if (tri_device_get_info(dev, &di) == TRI_STATUS_OK) pp.gpu_mem_bytes = di.free_bytes;
    const uint64_t gpu_all = pp.gpu_mem_bytes;
    pp.gpu_mem_bytes /= (uint64_t)n_slots;  // each slot's session holds its own weights and caches
    double gbps = 0;  // the link as it is, not the planner's PCIe 4.0 x16 default
    if (on_gpu && tri_device_measure_h2d(dev, 0, &gbps) == TRI_STATUS_OK && gbps > 0) pp.pcie_gbps = gbps;
    tri_plan_model pm;
    tri_plan_model_from_model(model, &pm);
    // the host's attention at the pass's query count, for the split of offloaded layers
    bool host_measured = false;
    double host_attn_gbps = e->host_attn_gbps;
    if (host_attn_gbps == 0 && on_gpu && !e->kv_host_set) {
        int32_t m = pp.mode == TRI_PLAN_MODE_TRIFORCE ? (pp.gamma2 > 0 ? pp.gamma2 : 12) + 1 : 1;
        tri_status ms = tri_measure_host_attention(&pm.config, m, sp->kv_host_threads, &host_attn_gbps);
        host_measured = ms == TRI_STATUS_OK;
    }
    pp.host_attn_gbps = host_attn_gbps;
    tri_plan plan;
    tri_status st = tri_plan_compute(&pm, &pp, &plan);
    if (st) {
        tri_cli_fail("cannot place the model in the memory budget", st);
        return false;
    }
    if (!e->kv_offload_set) sp->kv_layers_offloaded = plan.n_kv_host;
    if (!e->stream_weights_set) sp->weight_layers_streamed = plan.n_weights_host + plan.n_weights_disk;
    // the disk blocks are the last of the streamed ones: never more than an explicit --stream-weights
    if (!e->weights_from_disk_set)
        sp->weight_layers_from_disk = plan.n_weights_disk < sp->weight_layers_streamed ? plan.n_weights_disk
                                                                                         : sp->weight_layers_streamed;
    char share[96] = "";
    if (n_slots > 1)
        snprintf(share, sizeof share, " per slot (1/%d of %.1f GiB)", n_slots, (double)gpu_all / (1 << 30));
    snprintf(line, n,
             "plan: %.1f GiB device budget%s, host -> device %.1f GB/s%s: weights of %d of %d blocks resident (%d "
             "read from disk), KV of %d layers on the device, %d streamed (predicted %.3f s/token)\n",
             (double)plan.params.gpu_mem_bytes / (1 << 30), share, plan.params.pcie_gbps,
             gbps > 0 ? " measured" : " assumed", plan.n_layer - sp->weight_layers_streamed, plan.n_layer,
             sp->weight_layers_from_disk, plan.n_layer - sp->kv_layers_offloaded, sp->kv_layers_offloaded,
             plan.t_token);
    if (!e->kv_host_set) sp->kv_host_fraction = plan.kv_host_fraction;
    size_t used = strlen(line);
    if (!on_gpu) {  // --gpu-mem without a GPU: the placement is emulated, and the line says so
        snprintf(line + used, n - used,
                 "plan: for a GPU, but this run is on the CPU (%s%s): its offloaded KV layers are kept apart and "
                 "copied as on a GPU, its streamed weights stay in memory, and the predicted time is not this run's\n",
                 sp->device_kind == TRI_DEVICE_CPU || sp->devices ? "--device " : "no GPU: ",
                 sp->devices ? sp->devices : sp->device_kind == TRI_DEVICE_CPU ? "cpu" : tri_cuda_status());
        used = strlen(line);
    }
    if (plan.kv_host_fraction > 0)
        snprintf(line + used, n - used,
                 "plan: host attention %.1f GB/s%s: %.1f%% of each offloaded layer's rows attended on the host%s "
                 "(all streamed: predicted %.3f s/token)\n",
                 pp.host_attn_gbps, host_measured ? " measured" : " given", 100 * plan.kv_host_fraction,
                 e->kv_host_set ? ", --kv-host overrides it" : "", plan.t_token_streamed);
    engine_disk_streams(e);
    return true;
}

int tri_cli_engine_load_drafter(const char *cmd, tri_cli_engine *e) {
    if (e->draft_path && !e->draft && !(e->draft = tri_cli_load_model(e->draft_path))) return 1;
    if (e->draft_layers && !e->layers &&
        !(e->layers = tri_cli_parse_layers(cmd, "--draft-layers", e->draft_layers, &e->spec.n_draft_layers)))
        return 2;
    e->spec.draft_model = e->draft;
    e->spec.draft_layers = e->layers;
    return 0;
}

void tri_cli_engine_free(tri_cli_engine *e) {
    tri_model_free(e->draft);
    free(e->layers);
    e->draft = NULL;
    e->layers = NULL;
    e->spec.draft_model = NULL;
    e->spec.draft_layers = NULL;
}

void tri_cli_engine_usage(FILE *f) {
    fputs("device and placement:\n"
          "      --device D       cpu, cuda or cuda:N (default: the first GPU when there is one,\n"
          "                       else the CPU), or a list for tensor parallelism: cuda:0,cuda:1\n"
          "                       or cpu:0,cpu:1 (KV heads, attention and FFN split over them)\n"
          "      --kv-type T      f16 (default), f32, q8_0, q4_0 or mixed KV cache (mixed: q4_0 with\n"
          "                       the sinks and the recent window in f16 too; --budget, --sink; with\n"
          "                       --spec none or draft)\n"
          "      --kv-mixed-heavy N  mixed: also keep N heavy hitters per layer and KV head in f16\n"
          "                       (positions past the window by the attention they received; no\n"
          "                       --spec, no --kv-host)\n"
          "      --kv-offload N   keep the full KV cache of the last N layers in host memory and\n"
          "                       stream it through the device every pass (default 0)\n"
          "      --stream-weights N  keep the weights of the last N layers in host memory and\n"
          "                       stream them through the device every pass (default 0; a GPU only)\n"
          "      --weights-from-disk N  of the streamed layers, read the last N from the model file\n"
          "                       every pass instead of keeping them in host memory (default 0; a\n"
          "                       GPU and a model in one file only; without --stream-weights at\n"
          "                       least N layers stream)\n"
          "      --gpu-mem SIZE   device memory budget (e.g. 24G): the placement planner then sets\n"
          "                       --kv-offload, --stream-weights and --weights-from-disk (on a\n"
          "                       GPU by default, with its free memory; see offload-run plan)\n"
          "      --host-mem SIZE  host memory budget for the planner (default: no limit)\n"
          "      --kv-host F      of each offloaded layer's rows, attend the fraction F (0 .. 1) on\n"
          "                       the host where they lie while the rest streams (default: the\n"
          "                       planner's split when it plans, else 0)\n"
          "      --host-attn-gbps X  host attention GB/s for the planner's split (default: measured\n"
          "                       at start-up when the planner runs on a GPU)\n"
          "\n"
          "KV cache policy of plain decoding (an option that does not apply to the chosen\n"
          "policy is refused):\n"
          "      --kv POLICY      which past tokens each step attends to: full (default),\n"
          "                       streaming (sinks + recent), h2o (heavy hitters + recent) or\n"
          "                       retrieval (top chunks by query . mean key)\n"
          "      --budget N       past tokens the policy keeps; past the context: all (default\n"
          "                       4096 in whole chunks; a context no longer is kept whole)\n"
          "      --chunk N        retrieval: chunk size in tokens, divides the budget (default 8)\n"
          "      --sink N         streaming: attention sinks, fewer than the budget (default 16)\n"
          "      --refresh N      retrieval: select chunks again every N generated tokens\n"
          "                       (default: only after the prompt)\n"
          "      --kv-index I     retrieval: exact (default), faiss (FAISS flat index, the same\n"
          "                       chunks as exact) or faiss-ivf (approximate, for very long\n"
          "                       contexts); FAISS needs a build with it\n"
          "      --kv-budget N, --kv-chunk N  the same as --budget, --chunk\n"
          "\n"
          "speculative decoding (exact: the output has the target's distribution):\n"
          "      --spec MODE      none (default), draft (L1 -> full cache), retrieval (retrieval\n"
          "                       cache -> full cache) or triforce (L1 -> retrieval -> full)\n"
          "      --draft MODEL    L1 is a separate small model with the same vocabulary\n"
          "      --draft-layers L L1 is the target itself running only layers L (e.g. 0-7,20)\n"
          "      --draft-ngram N  L1 is prompt lookup of n-grams up to N tokens (no model)\n"
          "      --gamma1 N       tokens L1 drafts per retrieval-level check (default 2)\n"
          "      --gamma2 N       tokens the full-cache level checks per pass (default 6)\n"
          "      --tree-nodes N   the full-cache level checks a token tree of up to N drafted\n"
          "                       tokens per pass: the chain and siblings at each depth\n"
          "                       (default 0: the chain alone)\n"
          "      --budget N, --chunk N, --refresh N, --kv-index I  L2's retrieval cache, as for\n"
          "                       --kv retrieval\n"
          "      --draft-window N L1's StreamingLLM cache in tokens, sinks included (default 256)\n"
          "      --draft-sink N   L1's attention sinks (default 16)\n"
          "      --draft-kv-type T  the draft caches' type (L1's cache, L2's gathered chunks): f16,\n"
          "                       f32, q8_0 or q4_0 (default: q8_0 on the CPU over f16)\n"
          "      --refresh-accept X  L2 selects again when L3 accepts less than X of its tokens over\n"
          "                       4 passes (default 0.5; 0: never)\n",
          f);
}
