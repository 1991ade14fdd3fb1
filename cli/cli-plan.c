// cli-plan.c - `offload-run plan`: where a model's weights and KV cache go, and the predicted time.
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: offload-run plan -m MODEL [--ctx N] [options]\n"
          "\n"
          "Plans offloaded decoding of MODEL: which layers' weights stay on the GPU, stream from\n"
          "pinned host memory or are read from disk, how many layers keep their KV cache on the\n"
          "GPU, buffer and retrieval cache sizes, and the predicted time per TriForce round and\n"
          "per token. Needs no GPU: it is arithmetic on the model's shapes (docs/offload.md).\n"
          "\n"
          "  -m, --model PATH     .gguf file or HF checkpoint directory, or a config.json alone (the\n"
          "                       file, or a directory without weights: weights of its torch_dtype)\n"
          "      --ctx N          context tokens to plan for (default: the model's trained context)\n"
          "      --gpu-mem SIZE   device memory budget per GPU (default 24G)\n"
          "      --gpus N         GPUs, tensor parallel (default 1)\n"
          "      --host-mem SIZE  pinned host memory budget of the target machine (default: this\n"
          "                       machine's RAM when it has a GPU and no option below describes\n"
          "                       another's; else no limit; 0: no limit)\n"
          "      --reserve SIZE   device memory kept per GPU for CUDA itself (default 1G)\n"
          "      --pcie-gbps X    host-to-device GB/s per GPU (default 25)\n"
          "      --disk-gbps X    model file read GB/s (default 3)\n"
          "      --gpu-gbps X     device memory GB/s (default 1008, an RTX 4090)\n"
          "      --tflops X       sustained f16 TFLOPS per GPU (default 80)\n"
          "      --budget N       retrieval cache tokens (default 8192, 12288 with 2+ GPUs)\n"
          "      --gamma1 N       L1 drafts per L2 pass (default 2)\n"
          "      --gamma2 N       L2 tokens per L3 pass (default 12)\n"
          "      --accept-l1 P    L2's acceptance rate of L1 tokens, assumed (default 0.7; generate\n"
          "                       --stats measures it)\n"
          "      --accept-l2 P    L3's acceptance rate of L2 tokens, assumed (default 0.9)\n"
          "      --tree-nodes N   L3 verifies a token tree of up to N nodes per pass (default 0: a\n"
          "                       chain of gamma2); siblings assumed kept at accept-l2 x 0.5^(rank - 1)\n"
          "      --kv-type T      f16 (default), f32, q8_0, q4_0 or mixed (q4_0 rows stored and\n"
          "                       streamed, 16 sinks and 240 recent rows also in f16 on the GPU)\n"
          "      --host-attn-gbps X  KV GB/s the host's attention reads at the pass's query count:\n"
          "                       split each offloaded layer between PCIe and host attention\n"
          "                       (default 0: every offloaded row streams; see bench-offload)\n"
          "      --batch N        N sequences of --ctx tokens each, decoded together (one pass per\n"
          "                       level reads the weights once; each sequence's KV, retrieval and\n"
          "                       draft caches; default 1): times per token of the batch\n"
          "      --ar             plan plain autoregressive decoding instead\n"
          "  -h, --help           this help\n"
          "\n"
          "SIZE is a number of bytes with an optional K, M, G or T suffix (powers of 1024).\n",
          f);
}

// Option values: a whole number >= 0, a real number >= 0, a size; false after naming the option
// and what it wants.
static bool parse_int(const char *opt, const char *s, int32_t *out) {
    long v;
    if (!tri_cli_parse_long(tri_cli_name(), opt, s, 0, INT32_MAX, &v)) return false;
    *out = (int32_t)v;
    return true;
}

static bool parse_real(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= 0) || v > 1e12) {
        fprintf(stderr, "%s: %s '%s': want a number >= 0\n", tri_cli_name(), opt, s);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_rate(const char *opt, const char *s, double *out) {
    if (!parse_real(opt, s, out)) return false;
    if (*out > 1) {
        fprintf(stderr, "%s: %s '%s': want a rate in [0, 1]\n", tri_cli_name(), opt, s);
        return false;
    }
    return true;
}

static bool parse_size(const char *opt, const char *s, uint64_t *out) {
    if (tri_cli_parse_size(s, out)) return true;
    fprintf(stderr, "%s: %s '%s': want a size like 24G or 512M\n", tri_cli_name(), opt, s);
    return false;
}

// Whether path names a config.json alone: the file itself, or a directory with one and no
// safetensors weights.
static bool config_only(const char *path, char *config, size_t n) {
    size_t len = strlen(path);
    if (len >= 5 && strcmp(path + len - 5, ".json") == 0 && !strstr(path, ".safetensors.index.json")) {
        snprintf(config, n, "%s", path);
        return true;
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/model.safetensors", path);
    if (access(probe, F_OK) == 0) return false;
    snprintf(probe, sizeof probe, "%s/model.safetensors.index.json", path);
    if (access(probe, F_OK) == 0) return false;
    snprintf(config, n, "%s/config.json", path);
    return access(config, F_OK) == 0;
}

int tri_cli_plan(int argc, char **argv) {
    enum {
        O_CTX = 256, O_GPU_MEM, O_GPUS, O_HOST_MEM, O_RESERVE, O_PCIE, O_DISK, O_GPU_GBPS,
        O_TFLOPS, O_BUDGET, O_GAMMA1, O_GAMMA2, O_ACC1, O_ACC2, O_KV, O_AR, O_HOST_ATTN, O_TREE, O_BATCH,
    };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"ctx", required_argument, NULL, O_CTX},
        {"gpu-mem", required_argument, NULL, O_GPU_MEM},
        {"gpus", required_argument, NULL, O_GPUS},
        {"host-mem", required_argument, NULL, O_HOST_MEM},
        {"reserve", required_argument, NULL, O_RESERVE},
        {"pcie-gbps", required_argument, NULL, O_PCIE},
        {"disk-gbps", required_argument, NULL, O_DISK},
        {"gpu-gbps", required_argument, NULL, O_GPU_GBPS},
        {"tflops", required_argument, NULL, O_TFLOPS},
        {"budget", required_argument, NULL, O_BUDGET},
        {"gamma1", required_argument, NULL, O_GAMMA1},
        {"gamma2", required_argument, NULL, O_GAMMA2},
        {"accept-l1", required_argument, NULL, O_ACC1},
        {"accept-l2", required_argument, NULL, O_ACC2},
        {"kv-type", required_argument, NULL, O_KV},
        {"ar", no_argument, NULL, O_AR},
        {"host-attn-gbps", required_argument, NULL, O_HOST_ATTN},
        {"tree-nodes", required_argument, NULL, O_TREE},
        {"batch", required_argument, NULL, O_BATCH},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    tri_plan_params p = tri_plan_default_params();
    const char *path = NULL;
    bool host_mem_set = false, other_machine = false, acc_set = false;
    int c, li = -1;
    bool ok = true;
    while (ok && (c = getopt_long(argc, argv, "m:h", opts, &li)) != -1) {
        const char *o = li >= 0 ? opts[li].name : "";
        char opt[32];
        snprintf(opt, sizeof opt, "--%s", o);
        li = -1;
        // options that describe the target's hardware: the plan is then for another machine
        other_machine |= c == O_GPU_MEM || c == O_GPUS || c == O_PCIE || c == O_GPU_GBPS || c == O_TFLOPS ||
                         c == O_DISK;
        acc_set |= c == O_ACC1 || c == O_ACC2;
        switch (c) {
        case 'm': path = optarg; break;
        case O_CTX: ok = parse_int(opt, optarg, &p.n_ctx); break;
        case O_GPU_MEM: ok = parse_size(opt, optarg, &p.gpu_mem_bytes); break;
        case O_GPUS: ok = parse_int(opt, optarg, &p.n_gpu); break;
        case O_HOST_MEM: host_mem_set = true, ok = parse_size(opt, optarg, &p.host_mem_bytes); break;
        case O_RESERVE: ok = parse_size(opt, optarg, &p.gpu_reserve_bytes); break;
        case O_PCIE: ok = parse_real(opt, optarg, &p.pcie_gbps); break;
        case O_DISK: ok = parse_real(opt, optarg, &p.disk_gbps); break;
        case O_GPU_GBPS: ok = parse_real(opt, optarg, &p.gpu_mem_gbps); break;
        case O_TFLOPS: ok = parse_real(opt, optarg, &p.gpu_tflops); break;
        case O_BUDGET: ok = parse_int(opt, optarg, &p.retrieval_budget); break;
        case O_GAMMA1: ok = parse_int(opt, optarg, &p.gamma1); break;
        case O_GAMMA2: ok = parse_int(opt, optarg, &p.gamma2); break;
        case O_ACC1: ok = parse_rate(opt, optarg, &p.accept_l1); break;
        case O_ACC2: ok = parse_rate(opt, optarg, &p.accept_l2); break;
        case O_KV:
            if (!tri_cli_parse_kv_type("offload-run plan", "--kv-type", optarg, &p.kv_type)) return tri_cli_see_help();
            break;
        case O_AR: p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE; break;
        case O_HOST_ATTN: ok = parse_real(opt, optarg, &p.host_attn_gbps); break;
        case O_TREE: ok = parse_int(opt, optarg, &p.tree_nodes); break;
        case O_BATCH: ok = parse_int(opt, optarg, &p.n_batch); break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
    }
    if (!ok) return 2;
    if (!path) return tri_cli_usage_error("-m MODEL is required");
    if (optind != argc) return tri_cli_usage_error("unexpected argument '%s'", argv[optind]);

    tri_plan_model pm;
    char config[4096];
    if (config_only(path, config, sizeof config)) {
        // no weights: their sizes follow from the shapes and config.json's torch_dtype
        tri_status st = tri_plan_model_from_config_file(config, &pm);
        if (st) return tri_cli_fail("cannot read the model's configuration", st);
        fprintf(stderr, "%s: planning from %s alone: weights of %s as its torch_dtype says\n", tri_cli_name(),
                config, tri_dtype_name(pm.weight_type));
    } else {
        tri_model *model = tri_cli_load_model(path);
        if (!model) return 1;
        tri_plan_model_from_model(model, &pm);
        tri_model_free(model);
    }
    // the host budget: this machine's RAM when the plan is for this machine (it has a GPU and no
    // option describes another one's hardware); else the target's, which only --host-mem knows
    if (!host_mem_set) {
        other_machine |= tri_device_count() == 0;
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        p.host_mem_bytes = other_machine || pages <= 0 || page <= 0 ? 0 : (uint64_t)pages * (uint64_t)page;
        fprintf(stderr, "%s: host memory %s\n", tri_cli_name(),
                p.host_mem_bytes ? "budget: this machine's RAM (--host-mem SIZE sets another)"
                : "not limited: the plan is for another machine than this one (no GPU here, or an option "
                  "describes the target's); --host-mem SIZE gives the target's");
    }
    tri_plan plan;
    tri_status st = tri_plan_compute(&pm, &p, &plan);
    if (st != TRI_STATUS_OK) return tri_cli_fail("no placement fits", st);
    if (p.mode == TRI_PLAN_MODE_TRIFORCE && !acc_set)
        fprintf(stderr, "%s: the acceptance rates are assumed, not measured (--accept-l1 %.2f, --accept-l2 %.2f); "
                "offload-run generate --stats measures a model's\n", tri_cli_name(), plan.params.accept_l1,
                plan.params.accept_l2);
    size_t need = 0;
    tri_plan_format(&plan, NULL, 0, &need);
    char *text = malloc(need + 1);
    if (!text) return tri_cli_fail("cannot format the plan", TRI_STATUS_OUT_OF_MEMORY);
    st = tri_plan_format(&plan, text, need + 1, NULL);
    if (st == TRI_STATUS_OK) fputs(text, stdout);
    free(text);
    return st == TRI_STATUS_OK ? 0 : tri_cli_fail("cannot format the plan", st);
}
