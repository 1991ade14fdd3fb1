// cli-tokenize.c - `offload-run tokenize`: text to token ids (and pieces) with a model's tokenizer.
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: offload-run tokenize -m MODEL (-p TEXT | -f FILE) [--ids] [--pieces] [--special]\n"
          "                            [--no-bos]\n"
          "\n"
          "Tokenizes text with the model's tokenizer and prints the ids.\n"
          "\n"
          "  -m, --model PATH   a .gguf file or an HF checkpoint directory\n"
          "  -p, --prompt TEXT  the text\n"
          "  -f, --file PATH    read the text from a file ('-': stdin; bytes as they are, no newline\n"
          "                     removed; at most 1 GiB)\n"
          "      --ids          print only the ids, space-separated on one line\n"
          "      --pieces       print one token per line: id, vocabulary text, decoded bytes\n"
          "      --special      split control-token strings such as <|im_start|> out of the text\n"
          "                     (otherwise they are tokenized as plain text)\n"
          "      --no-bos       do not add the BOS/EOS tokens the model's metadata asks for\n"
          "  -h, --help         this help\n",
          f);
}

// Prints bytes with quotes, escaping what a terminal would not show.
static void print_escaped(const char *s, size_t len) {
    putchar('\'');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') {
            fputs("\\n", stdout);
        } else if (c == '\t') {
            fputs("\\t", stdout);
        } else if (c == '\\' || c == '\'') {
            printf("\\%c", c);
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\x%02x", c);
        } else {
            putchar(c);  // UTF-8 passes through; a partial character prints as the terminal likes
        }
    }
    putchar('\'');
}

int tri_cli_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},
        {"ids", no_argument, NULL, 'i'},
        {"pieces", no_argument, NULL, 'P'},
        {"special", no_argument, NULL, 's'},
        {"no-bos", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *path = NULL, *prompt = NULL, *file = NULL;
    bool ids_only = false, pieces = false, special = false, add_special = true;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'i': ids_only = true; break;
        case 'P': pieces = true; break;
        case 's': special = true; break;
        case 'n': add_special = false; break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
    }
    if (!path || (!prompt) == (!file) || optind != argc || (ids_only && pieces)) {
        fprintf(stderr, "offload-run tokenize: %s\n",
                !path ? "-m MODEL is required"
                : optind != argc ? "unexpected argument"
                : ids_only && pieces ? "--ids and --pieces exclude each other"
                : "give exactly one of -p TEXT and -f FILE");
        return tri_cli_see_help();
    }
    size_t len;
    char *text = NULL;
    if (file) {
        // a bound, so that /dev/zero or an endless pipe is refused rather than read without end
        if (!(text = tri_cli_read_prompt(file, (uint64_t)1 << 30, "more than tokenize reads", &len))) return 1;
    } else {
        len = strlen(prompt);
    }
    const char *src = text ? text : prompt;
    int rc = 1;
    int32_t *ids = NULL;
    tri_model *model = tri_cli_load_model(path);
    if (!model) goto done;
    int64_t n;
    tri_status st = tri_tokenize(model, src, len, add_special, special, NULL, 0, &n);
    if (st) {
        rc = tri_cli_fail("cannot tokenize", st);
        goto done;
    }
    if (!(ids = malloc((size_t)(n ? n : 1) * sizeof *ids))) {
        fprintf(stderr, "offload-run tokenize: out of memory for %" PRId64 " ids\n", n);
        goto done;
    }
    if ((st = tri_tokenize(model, src, len, add_special, special, ids, n ? n : 1, &n))) {
        rc = tri_cli_fail("cannot tokenize", st);
        goto done;
    }
    if (pieces) {
        for (int64_t i = 0; i < n; i++) {
            const char *piece, *dec;
            size_t plen, dlen;
            if ((st = tri_token_text(model, ids[i], &piece, &plen)) ||
                (st = tri_token_piece(model, ids[i], &dec, &dlen))) {
                rc = tri_cli_fail("cannot decode a token", st);
                goto done;
            }
            printf("%8" PRId32 "  ", ids[i]);
            print_escaped(piece, plen);
            fputs("  ", stdout);
            print_escaped(dec, dlen);
            putchar('\n');
        }
    } else {
        if (!ids_only) printf("%" PRId64 " tokens\n", n);
        for (int64_t i = 0; i < n; i++) printf(i ? " %" PRId32 : "%" PRId32, ids[i]);
        putchar('\n');
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    free(text);
    tri_model_free(model);
    return rc;
}
