// cli-template.c - `offload-run template`: the prompt a conversation becomes with the model's
// chat template, printed as the model reads it (special tokens as text).
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs(
        "usage: offload-run template -m MODEL [--messages FILE.json] [--tools FILE.json]\n"
        "                            [--chat-format F] [--no-generation-prompt]\n"
        "\n"
        "Renders a conversation with the model's own chat template (run by the Jinja interpreter,\n"
        "as Hugging Face transformers renders it) and prints the prompt the model reads.\n"
        "\n"
        "  -m, --model PATH       a .gguf file or an HF checkpoint directory\n"
        "      --messages FILE    a JSON array of OpenAI-style messages: role, content and what the\n"
        "                         template reads besides (tool_calls, tool_call_id, name,\n"
        "                         reasoning_content); '-': stdin. Default: a system message and a\n"
        "                         user message\n"
        "      --tools FILE       a JSON array of tool definitions ({\"type\": \"function\", ...}), the\n"
        "                         template's tools\n"
        "      --chat-format F    chatml, llama2, llama3, mistral, phi3, gemma (a built-in format\n"
        "                         instead of the template), jinja (the template, no fallback) or auto\n"
        "                         (default: the template, else the built-in format it shows)\n"
        "      --no-generation-prompt\n"
        "                         end after the last message, without an assistant turn's header\n"
        "  -h, --help             this help\n",
        f);
}

static const char default_messages[] =
    "[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
    " {\"role\": \"user\", \"content\": \"Hello! Who are you?\"}]";

int tri_cli_template(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"messages", required_argument, NULL, 'M'},
        {"tools", required_argument, NULL, 'T'},
        {"chat-format", required_argument, NULL, 'F'},
        {"no-generation-prompt", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *path = NULL, *messages_path = NULL, *tools_path = NULL;
    tri_chat_format format = TRI_CHAT_FORMAT_AUTO;
    bool gen = true;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'M': messages_path = optarg; break;
        case 'T': tools_path = optarg; break;
        case 'F':
            if (tri_chat_format_from_name(optarg, &format) != TRI_STATUS_OK)
                return tri_cli_usage_error(
                    "--chat-format '%s': want auto, chatml, llama2, llama3, mistral, phi3, gemma or jinja", optarg);
            break;
        case 'n': gen = false; break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
    }
    if (!path) return tri_cli_usage_error("-m MODEL is required");
    if (optind != argc) return tri_cli_usage_error("unexpected argument '%s'", argv[optind]);
    if (messages_path && tools_path && strcmp(messages_path, "-") == 0 && strcmp(tools_path, "-") == 0)
        return tri_cli_usage_error("--messages and --tools cannot both read stdin");
    int rc = 1;
    size_t len;
    char *messages = NULL, *tools = NULL, *text = NULL;
    tri_model *model = NULL;
    // 64 MiB: more than any conversation a context holds; /dev/zero is refused, not read forever
    if (messages_path &&
        !(messages = tri_cli_read_prompt(messages_path, (uint64_t)64 << 20, "more than --messages reads", &len)))
        goto done;
    if (tools_path && !(tools = tri_cli_read_prompt(tools_path, (uint64_t)64 << 20, "more than --tools reads", &len)))
        goto done;
    if (!(model = tri_cli_load_model(path))) goto done;
    const char *msgs = messages ? messages : default_messages;
    size_t need = 0;
    tri_status st = tri_chat_apply_json(model, format, msgs, tools, gen, NULL, 0, &need);
    if (!st && !(text = malloc(need + 1))) {
        fprintf(stderr, "%s: out of memory\n", tri_cli_name());
        goto done;
    }
    if (!st) st = tri_chat_apply_json(model, format, msgs, tools, gen, text, need + 1, &need);
    if (st) {
        rc = tri_cli_fail("cannot render the conversation", st);
        goto done;
    }
    fwrite(text, 1, need, stdout);
    rc = fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
done:
    free(text);
    free(messages);
    free(tools);
    tri_model_free(model);
    return rc;
}
