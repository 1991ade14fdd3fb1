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
          "  -m, --model PATH     .gguf file or HF checkpoint directory\n"
          "      --ctx N          context tokens to plan for (default: the model's trained context)\n"
          "      --gpu-mem SIZE   device memory budget per GPU (default 24G)\n"
          "      --gpus N         GPUs, tensor parallel (default 1)\n"
          "      --host-mem SIZE  pinned host memory budget (default: this machine's RAM; 0: no limit)\n"
          "      --reserve SIZE   device memory kept per GPU for CUDA itself (default 1G)\n"
          "      --pcie-gbps X    host-to-device GB/s per GPU (default 25)\n"
          "      --disk-gbps X    model file read GB/s (default 3)\n"
          "      --gpu-gbps X     device memory GB/s (default 1008, an RTX 4090)\n"
          "      --tflops X       sustained f16 TFLOPS per GPU (default 80)\n"
          "      --budget N       retrieval cache tokens (default 8192, 12288 with 2+ GPUs)\n"
          "      --gamma1 N       L1 drafts per L2 pass (default 2)\n"
          "      --gamma2 N       L2 tokens per L3 pass (default 12)\n"
          "      --accept-l1 P    L2's acceptance rate of L1 tokens (default 0.7, assumed)\n"
          "      --accept-l2 P    L3's acceptance rate of L2 tokens (default 0.9, assumed)\n"
          "      --kv-type T      f16 (default), f32, q8_0 or q4_0\n"
          "      --host-attn-gbps X  KV GB/s the host's attention reads at the pass's query count:\n"
          "                       split each offloaded layer between PCIe and host attention\n"
          "                       (default 0: every offloaded row streams; see bench-offload)\n"
          "      --ar             plan plain autoregressive decoding instead\n"
          "  -h, --help           this help\n"
          "\n"
          "SIZE is a number of bytes with an optional K, M, G or T suffix (powers of 1024).\n",
          f);
}

static bool parse_int(const char *s, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

static bool parse_real(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= 0)) return false;
    *out = v;
    return true;
}

int tri_cli_plan(int argc, char **argv) {
    enum {
        O_CTX = 256, O_GPU_MEM, O_GPUS, O_HOST_MEM, O_RESERVE, O_PCIE, O_DISK, O_GPU_GBPS,
        O_TFLOPS, O_BUDGET, O_GAMMA1, O_GAMMA2, O_ACC1, O_ACC2, O_KV, O_AR, O_HOST_ATTN,
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
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    tri_plan_params p = tri_plan_default_params();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    p.host_mem_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    const char *path = NULL;
    int c;
    bool ok = true;
    while (ok && (c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case O_CTX: ok = parse_int(optarg, &p.n_ctx); break;
        case O_GPU_MEM: ok = tri_cli_parse_size(optarg, &p.gpu_mem_bytes); break;
        case O_GPUS: ok = parse_int(optarg, &p.n_gpu); break;
        case O_HOST_MEM: ok = tri_cli_parse_size(optarg, &p.host_mem_bytes); break;
        case O_RESERVE: ok = tri_cli_parse_size(optarg, &p.gpu_reserve_bytes); break;
        case O_PCIE: ok = parse_real(optarg, &p.pcie_gbps); break;
        case O_DISK: ok = parse_real(optarg, &p.disk_gbps); break;
        case O_GPU_GBPS: ok = parse_real(optarg, &p.gpu_mem_gbps); break;
        case O_TFLOPS: ok = parse_real(optarg, &p.gpu_tflops); break;
        case O_BUDGET: ok = parse_int(optarg, &p.retrieval_budget); break;
        case O_GAMMA1: ok = parse_int(optarg, &p.gamma1); break;
        case O_GAMMA2: ok = parse_int(optarg, &p.gamma2); break;
        case O_ACC1: ok = parse_real(optarg, &p.accept_l1); break;
        case O_ACC2: ok = parse_real(optarg, &p.accept_l2); break;
        case O_KV:
            if (strcmp(optarg, "f16") == 0) p.kv_type = TRI_DTYPE_F16;
            else if (strcmp(optarg, "f32") == 0) p.kv_type = TRI_DTYPE_F32;
            else if (strcmp(optarg, "q8_0") == 0) p.kv_type = TRI_DTYPE_Q8_0;
            else if (strcmp(optarg, "q4_0") == 0) p.kv_type = TRI_DTYPE_Q4_0;
            else ok = false;
            break;
        case O_AR: p.mode = TRI_PLAN_MODE_AUTOREGRESSIVE; break;
        case O_HOST_ATTN: ok = parse_real(optarg, &p.host_attn_gbps); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) fprintf(stderr, "offload-run plan: bad value '%s'\n", optarg);
    }
    if (!ok) return 2;
    if (!path || optind != argc) {
        fprintf(stderr, "offload-run plan: %s\n", path ? "unexpected argument" : "-m MODEL is required");
        usage(stderr);
        return 2;
    }
    tri_model *model = tri_cli_load_model(path);
    if (!model) return 1;
    tri_plan_model pm;
    tri_plan_model_from_model(model, &pm);
    tri_model_free(model);

    tri_plan plan;
    tri_status st = tri_plan_compute(&pm, &p, &plan);
    if (st != TRI_STATUS_OK) return tri_cli_fail("plan", st);
    size_t need = 0;
    tri_plan_format(&plan, NULL, 0, &need);
    char *text = malloc(need + 1);
    if (!text) return tri_cli_fail("plan", TRI_STATUS_OUT_OF_MEMORY);
    st = tri_plan_format(&plan, text, need + 1, NULL);
    if (st == TRI_STATUS_OK) fputs(text, stdout);
    free(text);
    return st == TRI_STATUS_OK ? 0 : tri_cli_fail("plan", st);
}
