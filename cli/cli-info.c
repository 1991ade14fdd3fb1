// cli-info.c - `offload-run info`: what a model file holds, or (--system) what the machine offers.
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: offload-run info -m MODEL [--tensors]\n"
          "       offload-run info --system\n"
          "\n"
          "Prints a model's architecture, configuration, tokenizer, tensor types and sizes; or,\n"
          "with --system, the CPU, memory and GPUs (memory, PCIe link) this machine offers.\n"
          "\n"
          "  -m, --model PATH   a .gguf file, a .safetensors file, or an HF checkpoint directory\n"
          "                     (config.json with model.safetensors or model.safetensors.index.json),\n"
          "                     or the index file itself\n"
          "      --tensors      also list every tensor: name, type, shape, bytes\n"
          "      --system       describe the machine instead of a model\n"
          "  -h, --help         this help\n",
          f);
}

static const char *scaling_name(tri_rope_scaling s) {
    switch (s) {
    case TRI_ROPE_SCALING_NONE: return "none";
    case TRI_ROPE_SCALING_LINEAR: return "linear";
    case TRI_ROPE_SCALING_DYNAMIC: return "dynamic-ntk";
    case TRI_ROPE_SCALING_YARN: return "yarn";
    case TRI_ROPE_SCALING_LLAMA3: return "llama3";
    case TRI_ROPE_SCALING_LONGROPE: return "longrope";
    }
    return "?";
}

static const char *tokenizer_name(tri_tokenizer_kind k) {
    switch (k) {
    case TRI_TOKENIZER_NONE: return "none";
    case TRI_TOKENIZER_SPM: return "sentencepiece-bpe";
    case TRI_TOKENIZER_BPE: return "byte-level-bpe";
    }
    return "?";
}

static void print_bytes(const char *label, uint64_t n) {
    printf("%-18s %" PRIu64 " (%.2f GiB)\n", label, n, (double)n / (1024.0 * 1024.0 * 1024.0));
}

static double gib(uint64_t n) { return (double)n / (1024.0 * 1024.0 * 1024.0); }

static int print_system(void) {
    tri_host_info h;
    if (tri_host_get_info(&h)) return tri_cli_fail("cannot describe this machine", TRI_STATUS_INTERNAL);
    printf("%-18s %s\n", "cpu", h.cpu_name[0] ? h.cpu_name : "(unknown)");
    printf("%-18s %d logical, SIMD %s\n", "cpus", h.n_cpus, h.simd);
    printf("%-18s %.1f GiB", "memory", gib(h.total_bytes));
    if (h.available_bytes) printf(" (%.1f GiB available)", gib(h.available_bytes));
    printf("\n");
    int32_t n = tri_device_count();
    if (n == 0) {
        printf("%-18s none: %s\n", "gpus", tri_cuda_status());
        return 0;
    }
    printf("%-18s %d (%s)\n", "gpus", n, tri_cuda_status());
    for (int32_t i = 0; i < n; i++) {
        tri_device_info d;
        tri_status st = tri_device_get_info(i, &d);
        char label[32];
        snprintf(label, sizeof label, "gpu %d", i);
        if (st) {
            printf("%-18s (cannot be queried: %s)\n", label, tri_last_error());
            continue;
        }
        printf("%-18s %s, compute capability %d.%d, %d SMs\n", label, d.name, d.cc_major, d.cc_minor, d.sm_count);
        printf("%-18s %.1f GiB (%.1f GiB free)\n", "  memory", gib(d.total_bytes), gib(d.free_bytes));
        printf("%-18s %s", "  pcie", d.pci_bus_id[0] ? d.pci_bus_id : "(bus unknown)");
        if (d.pcie_gen) printf(", gen %d x%d now", d.pcie_gen, d.pcie_width);
        if (d.pcie_max_gen) printf(", gen %d x%d at most", d.pcie_max_gen, d.pcie_max_width);
        if (!d.pcie_gen && !d.pcie_max_gen) printf(", link unknown");
        double gbps;
        if (tri_device_measure_h2d(i, 0, &gbps) == TRI_STATUS_OK) printf(", %.1f GB/s host -> device measured", gbps);
        printf("\n");
    }
    return 0;
}

int tri_cli_info(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"tensors", no_argument, NULL, 't'},
        {"system", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *path = NULL;
    bool list = false, system = false;
    int c;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 't': list = true; break;
        case 's': system = true; break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
    }
    if (system) {
        if (path || list || optind != argc) {
            fprintf(stderr, "offload-run info: --system takes no model and no other option\n");
            return tri_cli_see_help();
        }
        return print_system();
    }
    if (!path || optind != argc) {
        fprintf(stderr, "offload-run info: %s\n", path ? "unexpected argument" : "-m MODEL is required");
        return tri_cli_see_help();
    }
    tri_model *model = tri_cli_load_model(path);
    if (!model) return 1;

    tri_model_info info;
    tri_model_get_info(model, &info);
    const tri_model_config *k = &info.config;
    printf("%-18s %s\n", "file", path);
    printf("%-18s %s (%d file%s)\n", "format",
           info.format == TRI_FILE_FORMAT_GGUF ? "gguf" : "safetensors", info.n_files,
           info.n_files == 1 ? "" : "s");
    printf("%-18s %s\n", "architecture", info.architecture);
    if (info.name[0]) printf("%-18s %s\n", "name", info.name);
    printf("%-18s %d\n", "vocab", k->n_vocab);
    printf("%-18s %d\n", "hidden", k->n_embd);
    printf("%-18s %d\n", "feed-forward", k->n_ff);
    printf("%-18s %d\n", "layers", k->n_layer);
    printf("%-18s %d query, %d key/value (%s)\n", "heads", k->n_head, k->n_head_kv,
           k->n_head_kv == k->n_head ? "MHA" : "GQA");
    printf("%-18s %d\n", "head dim", k->head_dim);
    printf("%-18s %d\n", "context (trained)", k->n_ctx_train);
    printf("%-18s %g\n", "rms eps", (double)k->rms_eps);
    printf("%-18s theta %g, %s pairs, scaling %s", "rope", (double)k->rope_theta,
           k->rope_layout == TRI_ROPE_LAYOUT_ADJACENT ? "adjacent" : "half-split",
           scaling_name(k->rope_scaling));
    if (k->rope_scaling != TRI_ROPE_SCALING_NONE) {
        printf(" (factor %g, original context %d", (double)k->rope_factor, k->rope_orig_ctx);
        if (k->rope_scaling == TRI_ROPE_SCALING_YARN) {
            // yarn_mscale 0 stands for get_mscale(factor), as the rope tables compute it
            double f = (double)k->rope_factor;
            printf(", beta_fast %g, beta_slow %g, mscale %g%s", (double)k->yarn_beta_fast,
                   (double)k->yarn_beta_slow,
                   k->yarn_mscale > 0 ? (double)k->yarn_mscale : f <= 1 ? 1.0 : 0.1 * log(f) + 1.0,
                   k->yarn_mscale > 0 ? "" : " = 0.1 ln(factor) + 1");
        }
        // GGUF carries the Llama-3 rule as rope_freqs divisors only, without the factors
        if (k->rope_scaling == TRI_ROPE_SCALING_LLAMA3 && k->llama3_high_freq_factor > 0)
            printf(", low_freq_factor %g, high_freq_factor %g", (double)k->llama3_low_freq_factor,
                   (double)k->llama3_high_freq_factor);
        printf(")");
    }
    if (k->has_rope_freqs) printf(", frequency factors from rope_freqs");
    printf("\n");
    printf("%-18s %s\n", "tied embeddings", k->tied_embeddings ? "yes" : "no");
    printf("%-18s %s\n", "tokenizer", tokenizer_name(info.tokenizer));
    printf("%-18s %" PRId64 "\n", "tensors", info.n_tensors);
    printf("%-18s %" PRId64 " (%.1f M)\n", "parameters", info.n_params, (double)info.n_params / 1e6);
    print_bytes("tensor bytes", info.n_bytes);

    // Per-type totals, then the optional per-tensor listing.
    int64_t count[TRI_DTYPE_COUNT] = {0};
    uint64_t bytes[TRI_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < info.n_tensors; i++) {
        tri_tensor_info t;
        if (tri_model_tensor_info(model, i, &t)) continue;
        count[t.type]++;
        bytes[t.type] += t.n_bytes;
    }
    printf("types             ");
    for (int t = 0; t < TRI_DTYPE_COUNT; t++)
        if (count[t])
            printf(" %s: %" PRId64 " (%.1f MiB)", tri_dtype_name((tri_dtype)t), count[t],
                   (double)bytes[t] / (1024.0 * 1024.0));
    printf("\n");
    if (list) {
        printf("\n%-40s %-6s %-24s %s\n", "tensor", "type", "shape", "bytes");
        for (int64_t i = 0; i < info.n_tensors; i++) {
            tri_tensor_info t;
            if (tri_model_tensor_info(model, i, &t)) continue;
            char shape[64];
            int len = 0;
            for (int d = 0; d < t.n_dims; d++)
                len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%" PRId64, d ? " x " : "",
                                t.shape[d]);
            printf("%-40s %-6s %-24s %" PRIu64 "\n", t.name, tri_dtype_name(t.type), shape, t.n_bytes);
        }
    }
    tri_model_free(model);
    return 0;
}
