// cli-chat.c - `offload-run chat`: a conversation with a model, one user turn per input line.
//
// Each turn renders the whole conversation with the model's chat template and prefills only what
// the session's cache does not already hold: the tokens after the longest common prefix of the
// new rendering and the tokens in the cache (the previous turns, the answers as generated). The
// answer streams to stdout; the figures of each turn go to stderr, and with --json to one JSON
// object at the end.
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char me[] = "offload-run chat";  // the command, in error messages

static void usage(FILE *f) {
    fputs("usage: offload-run chat -m MODEL [options]\n"
          "\n"
          "Talks with a model: each line read from stdin is a user turn, answered on stdout. The\n"
          "conversation is rendered with the model's own chat template; the session's cache is kept\n"
          "between turns, so each turn prefills only its new tokens. Ctrl-C stops the answer being\n"
          "written; Ctrl-C at the prompt, or the end of the input, ends the program. Works with\n"
          "stdin not a terminal (one turn per line, for scripts).\n"
          "\n"
          "  -m, --model PATH     .gguf file or HF checkpoint directory\n"
          "      --system TEXT    the system message\n"
          "      --chat-format F  chatml, llama2, llama3, mistral, phi3 or gemma instead of the\n"
          "                       model's template (for a template of no known format, or none)\n"
          "  -n, --n-predict N    tokens per answer at most (default 512; 0: until the model ends\n"
          "                       its turn or the context is full)\n"
          "      --stop STR       end an answer once it contains STR, which is not printed\n"
          "                       (repeatable, at most 16)\n"
          "      --ignore-eos     do not end an answer at the model's end-of-sequence and\n"
          "                       end-of-turn tokens\n"
          "      --temp T         sampling temperature; 0 is greedy (default 0)\n"
          "      --top-k K        keep the K most likely tokens (default 0: all)\n"
          "      --top-p P        keep the smallest set of tokens with mass P (default 1: all)\n"
          "      --seed S         random seed (default 0)\n"
          "      --ctx N          context of the whole conversation in tokens (default 4096)\n"
          "  -t, --threads N      CPU threads (default: one per core)\n"
          "      --device D       cpu, cuda or cuda:N (default: the first GPU when there is one)\n"
          "      --batch N        prompt tokens per prefill step (default 128)\n"
          "      --kv-type T      f16 (default), f32, q8_0 or q4_0 KV cache\n"
          "      --json FILE      the figures of every turn as one JSON object to FILE at the end\n"
          "                       ('-': stdout, after the last answer)\n"
          "  -h, --help           this help\n",
          f);
}

// ---- interruption ----
// SIGINT sets the flag: the token and prefill callbacks then stop the answer, and a read at the
// prompt returns (no SA_RESTART), which ends the program.
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

// ---- one turn ----

typedef struct answer {
    int32_t *tokens;  // every token generated this turn
    int32_t n, cap;
    char *text;       // the answer's text as printed (stop strings excluded)
    size_t n_text, cap_text;
    bool oom;
} answer;

static bool on_token(int32_t token, void *user) {
    answer *a = user;
    if (a->n == a->cap) {
        int32_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *t = realloc(a->tokens, (size_t)cap * sizeof *t);
        if (!t) {
            a->oom = true;
            return false;
        }
        a->tokens = t;
        a->cap = cap;
    }
    a->tokens[a->n++] = token;
    return !interrupted;
}

static bool on_text(const char *text, size_t len, void *user) {
    answer *a = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (a->n_text + len + 1 > a->cap_text) {
        size_t cap = 2 * (a->n_text + len + 1);
        char *t = realloc(a->text, cap);
        if (!t) {
            a->oom = true;
            return false;
        }
        a->text = t;
        a->cap_text = cap;
    }
    memcpy(a->text + a->n_text, text, len);
    a->n_text += len;
    a->text[a->n_text] = 0;
    return true;
}

static bool on_prefill(int64_t done, int64_t total, void *user) {
    int *last = user;
    if (interrupted) return false;
    int decile = (int)(10 * done / total);
    if (decile > *last && done < total)
        fprintf(stderr, "prefill: %lld / %lld tokens\n", (long long)done, (long long)total);
    *last = decile;
    return true;
}

// The figures of one turn, for stderr and --json.
typedef struct turn {
    int32_t prompt_tokens;  // the whole conversation as rendered for this turn
    int32_t cached;         // of those, already in the cache
    int32_t generated;
    double prefill_s, decode_s;
    bool interrupted;
} turn;

// ---- the conversation ----

typedef struct conv {
    tri_chat_message *msgs;  // contents malloc'd (roles static)
    size_t n, cap;
} conv;

static bool conv_add(conv *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        tri_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return false;
        c->msgs = m;
        c->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return false;
    memcpy(s, content, len);
    s[len] = 0;
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = s;
    c->n++;
    return true;
}

static void conv_free(conv *c) {
    for (size_t i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

static void write_json(FILE *f, const char *model_path, const char *device, double load_s, double total_s,
                       const turn *turns, int32_t n_turns) {
    fputs("{\"command\": \"chat\", \"model\": ", f);
    tri_cli_json_str(f, model_path, strlen(model_path));
    fprintf(f, ", \"device\": \"%s\", \"load_seconds\": %.6f, \"total_seconds\": %.6f", device, load_s, total_s);
    int64_t gen = 0, prefilled = 0;
    fputs(", \"turns\": [", f);
    for (int32_t i = 0; i < n_turns; i++) {
        const turn *t = &turns[i];
        int32_t pre = t->prompt_tokens - t->cached;
        gen += t->generated;
        prefilled += pre;
        fprintf(f,
                "%s{\"prompt_tokens\": %d, \"cached_tokens\": %d, \"prefilled_tokens\": %d, "
                "\"generated_tokens\": %d, \"prefill_seconds\": %.6f, \"prefill_tokens_per_second\": %.3f, "
                "\"decode_seconds\": %.6f, \"decode_tokens_per_second\": %.3f, \"interrupted\": %s}",
                i ? ", " : "", t->prompt_tokens, t->cached, pre, t->generated, t->prefill_s,
                t->prefill_s > 0 ? pre / t->prefill_s : 0.0, t->decode_s,
                t->generated > 1 && t->decode_s > 0 ? (t->generated - 1) / t->decode_s : 0.0,
                t->interrupted ? "true" : "false");
    }
    fprintf(f, "], \"prefilled_tokens\": %lld, \"generated_tokens\": %lld, \"peak_rss_bytes\": %llu}\n",
            (long long)prefilled, (long long)gen, (unsigned long long)tri_cli_peak_rss());
}

int tri_cli_chat(int argc, char **argv) {
    enum { OPT_SYSTEM = 256, OPT_CHAT_FORMAT, OPT_STOP, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_SEED, OPT_CTX,
           OPT_DEVICE, OPT_BATCH, OPT_KV, OPT_JSON, OPT_IGNORE_EOS };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},        {"system", required_argument, NULL, OPT_SYSTEM},
        {"chat-format", required_argument, NULL, OPT_CHAT_FORMAT},
        {"n-predict", required_argument, NULL, 'n'},   {"stop", required_argument, NULL, OPT_STOP},
        {"temp", required_argument, NULL, OPT_TEMP},   {"top-k", required_argument, NULL, OPT_TOPK},
        {"top-p", required_argument, NULL, OPT_TOPP},  {"seed", required_argument, NULL, OPT_SEED},
        {"ctx", required_argument, NULL, OPT_CTX},     {"threads", required_argument, NULL, 't'},
        {"device", required_argument, NULL, OPT_DEVICE}, {"batch", required_argument, NULL, OPT_BATCH},
        {"kv-type", required_argument, NULL, OPT_KV},  {"json", required_argument, NULL, OPT_JSON},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"help", no_argument, NULL, 'h'},              {0},
    };
    const char *model_path = NULL, *system_msg = NULL, *json_path = NULL;
    const char *stops[16];
    int32_t n_stops = 0;
    tri_chat_format format = TRI_CHAT_FORMAT_AUTO;
    long n_predict = 512, top_k = 0, seed = 0, ctx = 4096, threads = 0, batch = 0;
    tri_generate_params gp = tri_generate_default_params();
    tri_session_params sp = tri_session_default_params();
    int c;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_SYSTEM: system_msg = optarg; break;
        case OPT_CHAT_FORMAT:
            if (tri_chat_format_from_name(optarg, &format) != TRI_STATUS_OK || format == TRI_CHAT_FORMAT_AUTO) {
                fprintf(stderr, "offload-run chat: --chat-format '%s': want chatml, llama2, llama3, mistral, phi3 "
                        "or gemma\n", optarg);
                ok = false;
            }
            break;
        case 'n': ok = tri_cli_parse_long(me, "--n-predict", optarg, 0, INT32_MAX, &n_predict); break;
        case OPT_STOP:
            if (!optarg[0] || n_stops == 16) {
                fprintf(stderr, "offload-run chat: --stop '%s': %s\n", optarg,
                        optarg[0] ? "at most 16 stop strings" : "want a non-empty string");
                ok = false;
                break;
            }
            stops[n_stops++] = optarg;
            break;
        case OPT_TEMP: ok = tri_cli_parse_float(me, "--temp", optarg, 0.0, 100.0, &gp.sampler.temperature); break;
        case OPT_TOPK: ok = tri_cli_parse_long(me, "--top-k", optarg, 0, INT32_MAX, &top_k); break;
        case OPT_TOPP: ok = tri_cli_parse_float(me, "--top-p", optarg, 1e-6, 1.0, &gp.sampler.top_p); break;
        case OPT_SEED: ok = tri_cli_parse_long(me, "--seed", optarg, 0, INT64_MAX, &seed); break;
        case OPT_CTX: ok = tri_cli_parse_long(me, "--ctx", optarg, 16, INT32_MAX, &ctx); break;
        case 't': ok = tri_cli_parse_long(me, "--threads", optarg, 1, 4096, &threads); break;
        case OPT_DEVICE: ok = tri_cli_parse_device("offload-run chat", optarg, &sp); break;
        case OPT_BATCH: ok = tri_cli_parse_long(me, "--batch", optarg, 1, 65536, &batch); break;
        case OPT_KV:
            if (strcmp(optarg, "f16") == 0) sp.kv_type = TRI_DTYPE_F16;
            else if (strcmp(optarg, "f32") == 0) sp.kv_type = TRI_DTYPE_F32;
            else if (strcmp(optarg, "q8_0") == 0) sp.kv_type = TRI_DTYPE_Q8_0;
            else if (strcmp(optarg, "q4_0") == 0) sp.kv_type = TRI_DTYPE_Q4_0;
            else {
                fprintf(stderr, "offload-run chat: --kv-type '%s': want f16, f32, q8_0 or q4_0\n", optarg);
                ok = false;
            }
            break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_IGNORE_EOS: gp.stop_at_eos = false; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) return 2;
    }
    if (!model_path || optind != argc) {
        fprintf(stderr, "offload-run chat: %s\n", !model_path ? "-m MODEL is required" : "unexpected argument");
        usage(stderr);
        return 2;
    }

    double t_start = tri_cli_now();
    tri_model *model = tri_cli_load_model(model_path);
    if (!model) return 1;
    double load_s = tri_cli_now() - t_start;
    int rc = 1;
    tri_session *session = NULL;
    conv cv = {0};
    answer ans = {0};
    int32_t *ctx_tokens = NULL, n_ctx_tokens = 0;  // what the cache holds (its first n_past)
    int32_t *ids = NULL;
    char *rendered = NULL, *line = NULL;
    size_t line_cap = 0;
    turn *turns = NULL;
    int32_t n_turns = 0;
    FILE *json_file = NULL;
    tri_status st;

    if (tri_token_count(model) == 0) {
        fprintf(stderr, "offload-run chat: %s: the model has no tokenizer\n", model_path);
        goto done;
    }
    // the template is checked before the first turn: an unknown one is reported at once
    if (format == TRI_CHAT_FORMAT_AUTO) {
        tri_chat_format f;
        if ((st = tri_chat_model_format(model, &f))) {
            fprintf(stderr, "offload-run chat: cannot chat with this model: %s%s\n", tri_last_error(),
                    st == TRI_STATUS_NOT_FOUND ? "; name a format with --chat-format" : "");
            goto done;
        }
        fprintf(stderr, "chat format: %s (the model's template)\n", tri_chat_format_name(f));
    } else {
        fprintf(stderr, "chat format: %s (--chat-format)\n", tri_chat_format_name(format));
    }
    sp.n_ctx = (int32_t)ctx;
    sp.n_threads = (int32_t)threads;
    sp.n_batch = (int32_t)batch;
    if ((st = tri_session_create(model, &sp, &session))) {
        rc = tri_cli_fail("cannot create a session", st);
        goto done;
    }
    fprintf(stderr, "device: %s, context %d tokens\n", tri_session_device(session), tri_session_n_ctx(session));
    if (json_path && !(json_file = tri_cli_json_open("offload-run chat", json_path))) goto done;
    if (system_msg && !conv_add(&cv, "system", system_msg, strlen(system_msg))) goto oom;

    int32_t stop_ids[16], n_stop_ids = 0;
    if (gp.stop_at_eos && tri_chat_stop_tokens(model, stop_ids, 16, &n_stop_ids) == TRI_STATUS_OK) {
        gp.stop_tokens = stop_ids;
        gp.n_stop_tokens = n_stop_ids < 16 ? n_stop_ids : 16;
    }
    gp.stop = stops;
    gp.n_stop = n_stops;
    gp.on_text = on_text;
    gp.text_user = &ans;
    gp.sampler.top_k = (int32_t)top_k;
    gp.sampler.seed = (uint64_t)seed;
    int prefill_decile = 0;
    gp.on_prefill = on_prefill;
    gp.user = &prefill_decile;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;  // no SA_RESTART: a read at the prompt returns
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    const bool tty = isatty(STDIN_FILENO);

    for (;;) {
        if (tty) fputs("> ", stderr);
        errno = 0;
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) {
            if (tty) fputc('\n', stderr);
            break;  // the end of the input, or Ctrl-C at the prompt
        }
        if (interrupted) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!conv_add(&cv, "user", line, (size_t)got)) goto oom;

        // ---- the conversation as tokens, and what the cache already holds of it ----
        size_t len = 0;
        free(rendered);
        if (!(rendered = tri_cli_render_chat("offload-run chat", model, format, cv.msgs, cv.n, &len))) goto done;
        int32_t n_ids = 0;
        free(ids);
        if (!(ids = tri_cli_text_ids("offload-run chat", model, rendered, len, false, true, &n_ids))) goto done;
        int32_t n_past = tri_session_n_past(session), keep = 0;
        while (keep < n_past && keep < n_ctx_tokens && keep < n_ids && ctx_tokens[keep] == ids[keep]) keep++;
        if (keep == n_ids) keep--;  // a turn prefills at least one token
        if (n_ids - keep + (n_predict > 0 ? 1 : 0) > tri_session_n_ctx(session) - keep) {
            fprintf(stderr, "offload-run chat: the conversation (%d tokens) no longer fits the context of %d tokens "
                    "(--ctx)\n", n_ids, tri_session_n_ctx(session));
            goto done;
        }
        if ((st = tri_session_truncate(session, keep))) {
            rc = tri_cli_fail("cannot reuse the cache", st);
            goto done;
        }

        // ---- the answer ----
        turn *tn = realloc(turns, (size_t)(n_turns + 1) * sizeof *tn);
        if (!tn) goto oom;
        turns = tn;
        tn = &turns[n_turns++];
        memset(tn, 0, sizeof *tn);
        tn->prompt_tokens = n_ids;
        tn->cached = keep;
        ans.n = 0;
        ans.n_text = 0;
        prefill_decile = 0;
        int32_t room = tri_session_n_ctx(session) - n_ids;
        gp.n_predict = n_predict > 0 && n_predict < room ? (int32_t)n_predict : room;
        tri_generate_stats gs;
        st = tri_generate(session, ids + keep, n_ids - keep, &gp, on_token, &ans, &gs);
        fputc('\n', stdout);
        fflush(stdout);
        if (ans.oom) goto oom;
        if (st) {
            rc = tri_cli_fail("generation failed", st);
            goto done;
        }
        tn->generated = gs.n_generated;
        tn->prefill_s = gs.prefill_seconds;
        tn->decode_s = gs.decode_seconds;
        tn->interrupted = interrupted;
        fprintf(stderr, "turn %d: prefill %d new tokens (%d of the conversation's %d from the cache) in %.1f ms | "
                "generated %d tokens", n_turns, n_ids - keep, keep, n_ids, 1e3 * gs.prefill_seconds, gs.n_generated);
        if (gs.n_generated > 1 && gs.decode_seconds > 0)
            fprintf(stderr, ", %.1f tok/s", (gs.n_generated - 1) / gs.decode_seconds);
        fputs(interrupted ? " (stopped)\n" : "\n", stderr);
        interrupted = 0;

        // the cache now holds the rendering and the answer's tokens (the last one not yet run)
        int32_t *t = realloc(ctx_tokens, (size_t)(n_ids + ans.n + 1) * sizeof *t);
        if (!t) goto oom;
        ctx_tokens = t;
        memcpy(ctx_tokens, ids, (size_t)n_ids * sizeof *ids);
        memcpy(ctx_tokens + n_ids, ans.tokens, (size_t)ans.n * sizeof *ids);
        n_ctx_tokens = n_ids + ans.n;
        if (!conv_add(&cv, "assistant", ans.text ? ans.text : "", ans.n_text)) goto oom;
    }
    rc = 0;
    if (json_file) {
        write_json(json_file, model_path, tri_session_device(session), load_s, tri_cli_now() - t_start, turns,
                   n_turns);
        FILE *f = json_file;
        json_file = NULL;
        if (!tri_cli_json_close("offload-run chat", json_path, f)) rc = 1;
    }
    goto done;
oom:
    fprintf(stderr, "offload-run chat: out of memory\n");
    rc = 1;
done:
    if (json_file && json_file != stdout) fclose(json_file);
    free(turns);
    free(line);
    free(rendered);
    free(ids);
    free(ctx_tokens);
    free(ans.tokens);
    free(ans.text);
    conv_free(&cv);
    tri_session_free(session);
    tri_model_free(model);
    return rc;
}
