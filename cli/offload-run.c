// offload-run.c - the command-line front end: dispatches to the subcommands in cli-*.c.
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "server.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"chat", tri_cli_chat, "talk with a model: multi-turn, its cache kept between turns"},
    {"generate", tri_cli_generate, "generate text after a prompt, streamed as it is produced"},
    {"info", tri_cli_info, "describe a model: architecture, config, tokenizer, tensors"},
    {"plan", tri_cli_plan, "place weights and KV on GPU, host and disk; predict time per token"},
    {"serve", tri_server_main, "an OpenAI-compatible HTTP server: chat and completions, streamed"},
    {"template", tri_cli_template, "the prompt a conversation becomes with the model's chat template"},
    {"tokenize", tri_cli_tokenize, "text to token ids (and pieces) with a model's tokenizer"},
};

static void usage(FILE *f) {
    fprintf(f,
            "offload-run %s - long-context Llama inference with KV offloading and TriForce\n"
            "hierarchical speculative decoding\n"
            "\n"
            "usage: offload-run COMMAND [OPTIONS]   (offload-run COMMAND --help for its options)\n"
            "\n"
            "commands:\n",
            tri_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n  --version  print the version\n  --help     this help\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        tri_host_info h;
        tri_host_get_info(&h);
        printf("offload-run %s\n", tri_version());
        printf("backends: cpu (SIMD %s), cuda: %s\n", h.simd, tri_cuda_status());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0) {
            // getopt names the program by argv[0]: its messages then start as ours do
            tri_cli_set_command(cmd);
            argv[1] = (char *)tri_cli_name();
            return commands[i].run(argc - 1, argv + 1);
        }
    return tri_cli_usage_error("unknown command '%s'", cmd);
}
