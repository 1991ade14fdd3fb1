// cli-generate.c - `offload-run generate`: stream a model's continuation of a prompt.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char me[] = "offload-run generate";  // the command, in error messages

static void usage(FILE *f) {
    fputs("usage: offload-run generate -m MODEL (-p TEXT | -f FILE | --tokens IDS) [options]\n"
          "\n"
          "Generates text after a prompt and streams it to stdout. Progress and figures go to\n"
          "stderr.\n"
          "\n"
          "  -m, --model PATH     .gguf file or HF checkpoint directory\n"
          "  -p, --prompt TEXT    the prompt\n"
          "  -f, --file FILE      read the prompt from FILE ('-' for stdin), at most what the context\n"
          "                       can hold; repeated: several prompts, run as a batch (below)\n"
          "      --tokens IDS     the prompt as comma-separated token ids\n"
          "      --chat           the prompt is one user turn of a conversation, rendered with the\n"
          "                       model's own chat template (GGUF tokenizer.chat_template or\n"
          "                       tokenizer_config.json); generation ends at the model's end-of-turn\n"
          "                       tokens\n"
          "      --chat-format F  render the conversation as F instead of with the template: chatml,\n"
          "                       llama2, llama3, mistral, phi3, gemma; jinja: the template with no\n"
          "                       fallback (implies --chat)\n"
          "      --system TEXT    a system message before the prompt (implies --chat)\n"
          "      --stop STR       stop once the text contains STR, which is not printed\n"
          "                       (repeatable)\n"
          "      --json FILE      closing figures as one JSON object to FILE ('-': stdout, after\n"
          "                       the text)\n"
          "  -n, --n-predict N    tokens to generate at most (default 128; 0: until the context\n"
          "                       is full or the model ends)\n"
          "      --ctx N          context length in tokens (default: prompt + n-predict; + 4096 with\n"
          "                       -n 0)\n"
          "  -t, --threads N      CPU threads (default: one per core)\n"
          "      --batch N        prompt tokens per prefill step (default 128)\n"
          "      --ignore-eos     keep generating after the end-of-sequence token\n"
          "      --ids            print token ids instead of text\n"
          "      --stats          print acceptance rates, tokens per full-cache pass and time\n"
          "                       per level (without --spec: plain decoding's figures, and the\n"
          "                       --kv policy's)\n"
          "      --prompt-cache FILE  reuse the KV of the longest prefix this prompt shares with\n"
          "                       FILE, and save the prompt's KV there after its prefill\n"
          "                       (plain decoding, --kv full or retrieval; docs/cli.md)\n"
          "      --prompts FILE   several prompts, one JSON object {\"prompt\": TEXT} per line\n"
          "                       (with or without -f files)\n"
          "  -h, --help           this help\n"
          "\n"
          "Several prompts (-f repeated, --prompts) run as a batch: one cache each, their prefills\n"
          "packed into shared passes (no padding) and their decode steps in one pass per token, so\n"
          "every weight is read once for all of them; each output is printed after the others end,\n"
          "under a line '==> SOURCE <=='. Greedy output is what each prompt gives alone. With\n"
          "--spec one engine per prompt, each level's passes shared by the prompts at it. No --stop,\n"
          "--json, --prompt-cache.\n"
          "\n",
          f);
    tri_cli_engine_usage(f);
    fputc('\n', f);
    tri_cli_sampling_usage(f, false);
}

static int32_t *parse_ids(const char *s, int32_t n_vocab, int32_t *n_out) {
    int32_t n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return NULL;
    const char *p = s;
    for (int32_t i = 0; i < n; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= n_vocab || (*end != ',' && *end != 0)) {
            fprintf(stderr, "offload-run generate: --tokens: item %d is not an id in [0, %d)\n", i, n_vocab);
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)v;
        p = end + (*end == ',');
    }
    *n_out = n;
    return ids;
}

// ---- streaming output ----

typedef struct out_state {
    bool ids;           // print ids (else on_text prints the text)
    int32_t n;          // tokens generated
    int32_t last;       // the last one
    char *text;         // the text printed, for --json; NULL when not kept
    size_t n_text, cap_text;
} out_state;

// ---- interruption ----
// SIGINT (Ctrl-C) sets a flag that the token and prefill callbacks read: the library returns after
// the token or prefill piece in progress (n_batch tokens, a fraction of a second on the CPU;
// 8,192 when offloading makes the prefill layer-major), and the command frees what it holds and
// exits with 130, as a shell reports a process killed by SIGINT. A second SIGINT kills at once.
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void catch_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;  // the next SIGINT takes the default action
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static bool on_token(int32_t token, void *user) {
    out_state *o = user;
    if (interrupted) return false;
    if (o->ids) {
        printf(o->n ? " %d" : "%d", token);
        fflush(stdout);
    }
    o->n++;
    o->last = token;
    return true;
}

static bool on_text(const char *text, size_t len, void *user) {
    out_state *o = user;
    if (!o->ids) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (o->cap_text) {
        if (o->n_text + len + 1 > o->cap_text) {
            size_t cap = 2 * (o->n_text + len + 1);
            char *t = realloc(o->text, cap);
            if (!t) return true;  // the JSON then lacks the tail; the run goes on
            o->text = t;
            o->cap_text = cap;
        }
        memcpy(o->text + o->n_text, text, len);
        o->n_text += len;
    }
    return true;
}

typedef struct prefill_state {
    bool tty;
    int last_decile;
    // --prompt-cache: the prompt's KV is saved when its prefill ends
    tri_session *session;
    const char *cache_path;
    const int32_t *ids;
    int32_t n_ids;
    bool save_failed;
} prefill_state;

// Saves the prompt's KV to --prompt-cache's file once its prefill is done; a failure is reported
// and generation goes on.
static void save_prompt_cache(prefill_state *p) {
    tri_prompt_cache_stats cs;
    tri_status st = tri_session_save_prompt(p->session, p->cache_path, p->ids, p->n_ids, &cs);
    if (st) {
        fprintf(stderr, "offload-run generate: --prompt-cache: %s (%s); not saved\n", tri_last_error(),
                tri_status_str(st));
        p->save_failed = true;
        return;
    }
    fprintf(stderr, "prompt cache: saved %d tokens to %s: %.1f MB in %.3f s (%.2f GB/s, %s%s)\n", cs.n_tokens,
            p->cache_path, (double)cs.bytes / 1e6, cs.seconds, cs.gbps, cs.uring ? "io_uring" : "pwrite",
            cs.direct ? ", O_DIRECT" : "");
}

static bool on_prefill(int64_t done, int64_t total, void *user) {
    prefill_state *p = user;
    if (interrupted) return false;
    if (p->cache_path && done == total && !p->tty) save_prompt_cache(p);
    if (p->tty) {
        fprintf(stderr, "\rprefill: %" PRId64 " / %" PRId64 " tokens (%d%%)", done, total,
                (int)(100 * done / total));
        if (done == total) fputs("\r\033[K", stderr);
        if (p->cache_path && done == total) save_prompt_cache(p);
    } else {
        int decile = (int)(10 * done / total);
        if (decile > p->last_decile && done < total)
            fprintf(stderr, "prefill: %" PRId64 " / %" PRId64 " tokens\n", done, total);
        p->last_decile = decile;
    }
    return true;
}

// The closing line on stderr: tokens, and rates where there is something to time. A prefill of
// under a millisecond (a prompt of a token or two, which speculation prefills not at all) would
// give a rate that measures the clock more than the work: it is reported as short instead. The
// decode rate counts the tokens after the first, which the prefill's logits give.
static void print_figures(const tri_generate_stats *st) {
    fprintf(stderr, "prompt: %d tokens, ", st->n_prompt);
    if (st->prefill_seconds >= 1e-3) {
        double s = st->prefill_seconds;
        fprintf(stderr, "prefill %.1f tok/s (", st->n_prompt / s);
        fprintf(stderr, s >= 1 ? "%.2f s)" : "%.1f ms)", s >= 1 ? s : 1e3 * s);
    } else {
        fputs("prefill under 1 ms", stderr);
    }
    fprintf(stderr, " | generated: %d tokens", st->n_generated);
    if (st->n_generated > 1 && st->decode_seconds > 0)
        fprintf(stderr, ", decode %.1f tok/s (%.3g ms/token)", (st->n_generated - 1) / st->decode_seconds,
                1e3 * st->decode_seconds / (st->n_generated - 1));
    fputc('\n', stderr);
}

static void print_spec_stats(const tri_spec_stats *st, tri_spec_mode mode) {
    fprintf(stderr, "speculation: %d tokens in %lld full-cache passes (%.2f tokens per pass)\n", st->n_generated,
            (long long)st->n_l3_verify, st->n_l3_verify ? (double)st->n_generated / (double)st->n_l3_verify : 0.0);
    if (st->n_l3_tree_nodes > 0)
        fprintf(stderr, "  token trees:       %lld drafted tokens verified (%.1f per pass)\n",
                (long long)st->n_l3_tree_nodes,
                st->n_l3_verify ? (double)st->n_l3_tree_nodes / (double)st->n_l3_verify : 0.0);
    if (mode == TRI_SPEC_MODE_DRAFT || mode == TRI_SPEC_MODE_TRIFORCE)
        fprintf(stderr, "  L1 drafter:        %lld of %lld accepted (%.3f)\n", (long long)st->l1_accepted,
                (long long)st->l1_proposed, st->l1_proposed ? (double)st->l1_accepted / (double)st->l1_proposed : 0.0);
    if (mode == TRI_SPEC_MODE_RETRIEVAL || mode == TRI_SPEC_MODE_TRIFORCE)
        fprintf(stderr, "  L2 retrieval:      %lld of %lld accepted (%.3f), %lld checks, %lld selections\n",
                (long long)st->l2_accepted, (long long)st->l2_proposed,
                st->l2_proposed ? (double)st->l2_accepted / (double)st->l2_proposed : 0.0,
                (long long)st->n_l2_verify, (long long)st->n_l2_refresh);
    fprintf(stderr, "  time: L1 %.3f s, L2 %.3f s, L3 %.3f s, prefill %.3f s\n", st->l1_seconds, st->l2_seconds,
            st->l3_seconds, st->prefill_seconds);
    // whether it paid: plain decoding runs one full-cache pass of one token per token, which costs
    // at most what this run's verification passes of several tokens cost, so their mean bounds
    // plain decoding's time per token from above. A bound, not a measurement: where compute rather
    // than reading the weights and the cache bounds a pass (the CPU), a pass of one token costs much
    // less, so the line says what it is made of, and claims only what the bound proves.
    if (st->n_l3_verify > 0 && st->n_generated > 0) {
        double pass = st->l3_seconds / (double)st->n_l3_verify, plain = pass * (double)st->n_generated;
        double spent = st->l1_seconds + st->l2_seconds + st->l3_seconds;
        int64_t checked = mode == TRI_SPEC_MODE_DRAFT ? st->l1_proposed : st->l2_proposed;
        fprintf(stderr, "  per token: %.1f ms; plain decoding: at most %.1f ms per token, the mean time of this "
                "run's %lld L3 passes of %.1f tokens each (an upper bound, not measured: a pass of one token "
                "costs less, much less where compute bounds it, as on the CPU)%s\n",
                1e3 * spent / st->n_generated, 1e3 * pass, (long long)st->n_l3_verify,
                1.0 + (double)checked / (double)st->n_l3_verify,
                spent > plain ? ": speculation did not pay here, plain decoding (--spec none) is faster" : "");
        if (st->n_l2_verify > 0) {
            double l2 = st->l2_seconds / (double)st->n_l2_verify;
            if (l2 > 0.5 * pass)
                fprintf(stderr, "  L2 checks cost %.1f ms, %.2f of an L3 pass: a level that costs about what the "
                        "pass it saves cannot win (on the CPU every level sweeps the same weights)\n",
                        1e3 * l2, l2 / pass);
        }
    }
}

// --spec none: plain decoding runs one full-cache pass per token (the prompt's last step gives the
// first), so the figures are the tokens, the passes and the time.
static void print_plain_stats(const tri_generate_stats *st, const tri_session *session) {
    tri_kv_info kv;
    bool full = tri_session_kv_info(session, &kv) != TRI_STATUS_OK || kv.policy == TRI_KV_POLICY_FULL;
    fprintf(stderr, "plain decoding: %d tokens in %d %s passes (%.2f tokens per pass)\n", st->n_generated,
            st->n_generated, full ? "full-cache" : "policy", st->n_generated ? 1.0 : 0.0);
    fprintf(stderr, "  time: decode %.3f s, prefill %.3f s\n", st->decode_seconds, st->prefill_seconds);
    if (full) return;
    // what the policy kept of the cache's n_past positions
    if (kv.policy == TRI_KV_POLICY_RETRIEVAL) {
        fprintf(stderr, "  retrieval: budget %d tokens = %d chunks of %d per layer and KV head (of %d in the cache), "
                "%lld selection%s", kv.budget, kv.budget / kv.chunk, kv.chunk, (kv.n_past + kv.chunk - 1) / kv.chunk,
                (long long)kv.n_selections, kv.n_selections == 1 ? "" : "s");
        if (kv.refresh) fprintf(stderr, " (one after the prompt, then every %d tokens)", kv.refresh);
        else fputs(" (after the prompt only: --refresh N selects again)", stderr);
        if (kv.selected_at >= 0) fprintf(stderr, ", the last at %d tokens", kv.selected_at);
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "  %s: budget %d of %d tokens in the cache", kv.policy == TRI_KV_POLICY_H2O ? "h2o" : "streaming",
                kv.budget, kv.n_past);
        if (kv.policy == TRI_KV_POLICY_STREAMING) fprintf(stderr, ", %d sinks", kv.sink);
        fputc('\n', stderr);
    }
}

// ---- --json ----

// The closing figures as one JSON object: what print_figures and the --stats lines say, plus the
// load time, the reason generation ended and the peak resident memory.
static void write_json(FILE *f, const char *model_path, const char *device, const char *reason, double load_s,
                       double total_s, const tri_generate_stats *st, const tri_spec_stats *sst, tri_spec_mode mode,
                       const out_state *out) {
    fputs("{\"command\": \"generate\", \"model\": ", f);
    tri_cli_json_str(f, model_path, strlen(model_path));
    fprintf(f, ", \"device\": \"%s\", \"stop_reason\": \"%s\", \"load_seconds\": %.6f", device, reason, load_s);
    fprintf(f, ", \"prompt_tokens\": %d, \"generated_tokens\": %d", st->n_prompt, st->n_generated);
    fprintf(f, ", \"prefill_seconds\": %.6f, \"prefill_tokens_per_second\": %.3f", st->prefill_seconds,
            st->prefill_seconds > 0 ? st->n_prompt / st->prefill_seconds : 0.0);
    fprintf(f, ", \"decode_seconds\": %.6f, \"decode_tokens_per_second\": %.3f", st->decode_seconds,
            st->n_generated > 1 && st->decode_seconds > 0 ? (st->n_generated - 1) / st->decode_seconds : 0.0);
    fprintf(f, ", \"total_seconds\": %.6f", total_s);
    fprintf(f, ", \"kv_bytes_up\": %llu, \"kv_bytes_down\": %llu, \"kv_bytes_host\": %llu",
            (unsigned long long)st->kv_bytes_up, (unsigned long long)st->kv_bytes_down,
            (unsigned long long)st->kv_bytes_host);
    if (sst) {
        static const char *const modes[] = {"none", "draft", "retrieval", "triforce"};
        fprintf(f, ", \"speculative\": {\"mode\": \"%s\", \"full_cache_passes\": %lld, \"tokens_per_pass\": %.4f",
                modes[mode], (long long)sst->n_l3_verify,
                sst->n_l3_verify ? (double)sst->n_generated / (double)sst->n_l3_verify : 0.0);
        fprintf(f, ", \"l1_proposed\": %lld, \"l1_accepted\": %lld, \"l2_proposed\": %lld, \"l2_accepted\": %lld",
                (long long)sst->l1_proposed, (long long)sst->l1_accepted, (long long)sst->l2_proposed,
                (long long)sst->l2_accepted);
        fprintf(f, ", \"l2_checks\": %lld, \"l2_selections\": %lld", (long long)sst->n_l2_verify,
                (long long)sst->n_l2_refresh);
        fprintf(f, ", \"l1_seconds\": %.6f, \"l2_seconds\": %.6f, \"l3_seconds\": %.6f}", sst->l1_seconds,
                sst->l2_seconds, sst->l3_seconds);
    } else {
        fputs(", \"speculative\": null", f);
    }
    fprintf(f, ", \"peak_rss_bytes\": %llu", (unsigned long long)tri_cli_peak_rss());
    if (out->cap_text) {
        fputs(", \"text\": ", f);
        tri_cli_json_str(f, out->text ? out->text : "", out->n_text);
    }
    fputs("}\n", f);
}

int tri_cli_generate(int argc, char **argv) {
    enum { OPT_TOKENS = 256, OPT_CHAT, OPT_CHAT_FORMAT, OPT_SYSTEM, OPT_STOP, OPT_JSON, OPT_CTX, OPT_BATCH,
           OPT_IGNORE_EOS, OPT_IDS, OPT_STATS, OPT_PROMPT_CACHE, OPT_PROMPTS };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},    {"tokens", required_argument, NULL, OPT_TOKENS},
        {"chat", no_argument, NULL, OPT_CHAT},     {"n-predict", required_argument, NULL, 'n'},
        {"chat-format", required_argument, NULL, OPT_CHAT_FORMAT},
        {"system", required_argument, NULL, OPT_SYSTEM}, {"stop", required_argument, NULL, OPT_STOP},
        {"json", required_argument, NULL, OPT_JSON},
        TRI_CLI_SAMPLING_OPTIONS,
        TRI_CLI_ENGINE_OPTIONS,
        {"ctx", required_argument, NULL, OPT_CTX}, {"threads", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS}, {"ids", no_argument, NULL, OPT_IDS},
        {"stats", no_argument, NULL, OPT_STATS},
        {"prompt-cache", required_argument, NULL, OPT_PROMPT_CACHE},
        {"prompts", required_argument, NULL, OPT_PROMPTS},
        {"help", no_argument, NULL, 'h'},          {0},
    };
    const char *model_path = NULL, *prompt = NULL, *file = NULL, *tokens = NULL;
    const char *files[64], *prompts_path = NULL;  // several prompts: -f repeated, --prompts
    int32_t n_files = 0;
    bool chat = false, print_ids = false, print_stats = false;
    tri_chat_format chat_format = TRI_CHAT_FORMAT_AUTO;
    const char *system_msg = NULL, *json_path = NULL, *cache_path = NULL;
    const char *stops[16];  // --stop, at most 16
    int32_t n_stops = 0;
    long n_predict = 128, ctx = 0, threads = 0, batch = 0;
    tri_generate_params gp = tri_generate_default_params();
    tri_cli_engine eng;  // --device, --kv-type, --kv, --spec, placement (cli-engine.c)
    tri_cli_engine_init(&eng);
    tri_session_params *const sp = &eng.sp;
    tri_spec_params *const spec_params = &eng.spec;
    tri_cli_sampling sampler = {0};
    int c;
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:h", opts, NULL)) != -1) {
        bool ok = true, handled;
        if (!tri_cli_sampling_option(me, c, optarg, &sampler, &handled)) return 2;
        if (handled) continue;
        if (!tri_cli_engine_option(me, c, optarg, &eng, &handled)) return 2;
        if (handled) continue;
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f':
            if (n_files == 64) {
                fprintf(stderr, "offload-run generate: -f '%s': at most 64 files (--prompts FILE takes more)\n",
                        optarg);
                ok = false;
                break;
            }
            file = files[n_files++] = optarg;
            break;
        case OPT_PROMPTS: prompts_path = optarg; break;
        case OPT_TOKENS: tokens = optarg; break;
        case OPT_CHAT: chat = true; break;
        case OPT_CHAT_FORMAT:
            chat = true;
            if (tri_chat_format_from_name(optarg, &chat_format) != TRI_STATUS_OK) {
                fprintf(stderr, "offload-run generate: --chat-format '%s': want chatml, llama2, llama3, mistral, phi3, "
                        "gemma or jinja\n", optarg);
                ok = false;
            }
            break;
        case OPT_SYSTEM: chat = true, system_msg = optarg; break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_STOP:
            if (!optarg[0] || n_stops == 16) {
                fprintf(stderr, "offload-run generate: --stop '%s': %s\n", optarg,
                        optarg[0] ? "at most 16 stop strings" : "want a non-empty string");
                ok = false;
                break;
            }
            stops[n_stops++] = optarg;
            break;
        case 'n': ok = tri_cli_parse_long(me, "--n-predict", optarg, 0, INT32_MAX, &n_predict); break;
        case OPT_CTX: ok = tri_cli_parse_long(me, "--ctx", optarg, 1, INT32_MAX, &ctx); break;
        case 't': ok = tri_cli_parse_long(me, "--threads", optarg, 1, 4096, &threads); break;
        case OPT_BATCH: ok = tri_cli_parse_long(me, "--batch", optarg, 1, 65536, &batch); break;
        case OPT_IGNORE_EOS: gp.stop_at_eos = false; break;
        case OPT_IDS: print_ids = true; break;
        case OPT_STATS: print_stats = true; break;
        case OPT_PROMPT_CACHE: cache_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
        if (!ok) return 2;
    }
    const bool several = n_files > 1 || prompts_path;
    int n_sources = (prompt != NULL) + (file != NULL || prompts_path) + (tokens != NULL);
    if (!model_path || n_sources != 1 || optind != argc) {
        fprintf(stderr, "offload-run generate: %s\n",
                !model_path ? "-m MODEL is required"
                : n_sources != 1 ? "give exactly one of -p TEXT, -f FILE (or several, or --prompts), --tokens IDS"
                                 : "unexpected argument");
        return tri_cli_see_help();
    }
    if (chat && tokens) {
        fprintf(stderr, "offload-run generate: --chat applies to text prompts, not --tokens\n");
        return 2;
    }
    if (!tri_cli_engine_check(me, &eng)) return 2;
    const bool plain = spec_params->mode == TRI_SPEC_MODE_NONE;
    if (several && (cache_path || n_stops || eng.gpu_mem)) {
        fprintf(stderr, "offload-run generate: several prompts run as a batch: %s does not apply\n",
                cache_path ? "--prompt-cache"
                : n_stops  ? "--stop"
                           : "--gpu-mem");
        return 2;
    }
    // a path that holds something else (a document given by mistake) is refused before anything runs
    if (cache_path && tri_prompt_cache_writable(cache_path)) {
        fprintf(stderr, "offload-run generate: --prompt-cache: %s\n", tri_last_error());
        return 2;
    }
    if (json_path && strcmp(json_path, "-") != 0 && !tri_cli_may_replace(me, "--json", json_path, TRI_CLI_JSON_PREFIX))
        return 2;
    double t_start = tri_cli_now();
    tri_model *model = tri_cli_load_model(model_path);
    if (!model) return 1;
    if (several) {  // -f repeated or --prompts: a batch (cli-generate-batch.c)
        sp->n_threads = (int32_t)threads;
        sp->n_batch = (int32_t)batch;
        gp.n_predict = (int32_t)n_predict;
        tri_cli_sampling_resolve(&sampler, chat);
        gp.sampler = sampler.p;
        tri_cli_several a = {files,       n_files, prompts_path, chat, chat_format, system_msg, print_ids,
                             print_stats, ctx,     *sp,          gp,   NULL,        json_path,  model_path};
        // --spec: one engine per prompt, their passes batched (the drafter as for one prompt)
        int rc = plain ? 0 : tri_cli_engine_load_drafter(me, &eng);
        if (rc == 0) {
            if (!plain) a.spec = spec_params;
            rc = tri_cli_generate_several(model, &a);
        }
        tri_cli_engine_free(&eng);
        tri_model_free(model);
        return rc;
    }
    double load_s = tri_cli_now() - t_start;
    int32_t stop_ids[16];
    int rc = 1;
    tri_session *session = NULL;
    tri_spec *spec = NULL;
    out_state out = {0};
    FILE *json_file = NULL;
    int32_t *ids = NULL;
    char *text = NULL, *wrapped = NULL;
    tri_model_info info;
    tri_model_get_info(model, &info);
    tri_status st;

    // ---- the prompt as token ids ----
    int32_t n_ids = 0;
    if (tokens) {
        if (!(ids = parse_ids(tokens, info.config.n_vocab, &n_ids))) goto done;
    } else {
        size_t len = 0;
        if (file) {  // at most what the context can hold: /dev/zero is refused, not read without end
            int64_t room = ctx > 0 ? ctx : info.config.n_ctx_train > 0 ? info.config.n_ctx_train : 131072;
            size_t longest;
            uint64_t most = tri_cli_prompt_bytes(model, room, &longest);
            char why[256];
            snprintf(why, sizeof why, "more than a context of %lld tokens can hold (no token of the model is longer "
                     "than %zu bytes)%s", (long long)room, longest, ctx > 0 ? "" : "; --ctx N sets the context");
            if (!(text = tri_cli_read_prompt(file, most, why, &len))) goto done;
        } else {
            len = strlen(prompt);
        }
        const char *body = text ? text : prompt;
        if (chat) {
            tri_chat_message msgs[2] = {{"system", system_msg}, {"user", body}};
            size_t n_msgs = system_msg ? 2 : 1;
            if (!(wrapped = tri_cli_render_chat("offload-run generate", model, chat_format,
                                                system_msg ? msgs : msgs + 1, n_msgs, &len)))
                goto done;
            body = wrapped;
        }
        // a rendered conversation carries its BOS as text
        if (!(ids = tri_cli_text_ids("offload-run generate", model, body, len, !chat, chat, &n_ids))) goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "offload-run generate: the prompt is empty\n");
        goto done;
    }

    // ---- session ----
    if (ctx == 0) {
        int64_t want = (int64_t)n_ids + (n_predict > 0 ? n_predict : 4096);
        ctx = want > INT32_MAX ? INT32_MAX : want;
    }
    if (ctx < n_ids) {
        fprintf(stderr, "offload-run generate: --ctx %ld is shorter than the prompt (%d tokens)\n", ctx, n_ids);
        goto done;
    }
    sp->n_ctx = (int32_t)ctx;
    sp->n_threads = (int32_t)threads;
    sp->n_batch = (int32_t)batch;
    char plan_line[1024];
    if (!tri_cli_engine_place(model, &eng, 1, plan_line, sizeof plan_line)) goto done;
    if (plain) {
        if ((st = tri_session_create(model, sp, &session))) {
            rc = tri_cli_fail("cannot create a session", st);
            goto done;
        }
    } else {
        int drc = tri_cli_engine_load_drafter(me, &eng);
        if (drc) {
            rc = drc;
            goto done;
        }
        if ((st = tri_spec_create(model, sp, spec_params, &spec))) {
            rc = tri_cli_fail("cannot set up speculative decoding", st);
            goto done;
        }
    }
    fputs(plan_line, stderr);
    fprintf(stderr, "device: %s\n", spec ? tri_spec_device(spec) : tri_session_device(session));
    out.ids = print_ids;
    if ((!print_ids || n_stops) && tri_token_count(model) == 0) {
        fprintf(stderr, "offload-run generate: %s: the model has no tokenizer (use --ids%s)\n", model_path,
                n_stops ? ", without --stop" : "");
        goto done;
    }
    if (json_path) {
        out.cap_text = 1;  // keep the text for the JSON
        if (!(json_file = tri_cli_json_open("offload-run generate", json_path))) goto done;
    }
    gp.on_text = print_ids && !json_path && !n_stops ? NULL : on_text;
    gp.text_user = &out;
    gp.stop = stops;
    gp.n_stop = n_stops;
    int32_t n_stop_ids = 0;
    // a chat's answer ends at the model's end-of-turn tokens (ChatML's <|im_end|>, ...)
    if (chat && gp.stop_at_eos && tri_chat_stop_tokens(model, stop_ids, 16, &n_stop_ids) == TRI_STATUS_OK) {
        gp.stop_tokens = stop_ids;
        gp.n_stop_tokens = n_stop_ids < 16 ? n_stop_ids : 16;
    }
    gp.n_predict = (int32_t)n_predict;
    // a chat samples with the common chat settings unless told otherwise; plain text is greedy
    tri_cli_sampling_resolve(&sampler, chat);
    gp.sampler = sampler.p;
    if (gp.sampler.temperature > 0.0f || sampler.given) {
        char desc[256];
        tri_cli_sampling_describe(&sampler, desc, sizeof desc);
        fprintf(stderr, "sampling: %s\n", desc);
    }
    prefill_state ps = {.tty = isatty(STDERR_FILENO), .last_decile = 0};
    gp.on_prefill = on_prefill;
    gp.user = &ps;
    // --prompt-cache: the longest prefix the file shares with the prompt is loaded, the rest run
    int32_t n_reused = 0;
    if (cache_path && spec) {
        fprintf(stderr, "offload-run generate: --prompt-cache applies to plain decoding (no --spec)\n");
        goto done;
    }
    if (cache_path) {
        tri_prompt_cache_stats cs;
        st = tri_session_load_prompt(session, cache_path, ids, n_ids, &cs);
        if (st == TRI_STATUS_NOT_FOUND) {
            fprintf(stderr, "prompt cache: %s does not exist yet; it is written after the prefill\n", cache_path);
        } else if (st == TRI_STATUS_UNSUPPORTED) {
            rc = tri_cli_fail("--prompt-cache", st);
            goto done;
        } else if (st) {
            fprintf(stderr, "offload-run generate: --prompt-cache: %s (%s); ignored, the whole prompt is run\n",
                    tri_last_error(), tri_status_str(st));
        } else {
            n_reused = cs.n_tokens;
            fprintf(stderr, "prompt cache: reused %d of the prompt's %d tokens from %s (it holds %d): %.1f MB in %.3f s "
                    "(%.2f GB/s, %s%s)\n", cs.n_tokens, n_ids, cache_path, cs.n_file, (double)cs.bytes / 1e6,
                    cs.seconds, cs.gbps, cs.uring ? "io_uring" : "pread", cs.direct ? ", O_DIRECT" : "");
            if (cs.damaged)
                fprintf(stderr,
                        "prompt cache: %s has a block that fails its checksum: only the blocks before it were "
                        "used; it is written again after the prefill\n",
                        cache_path);
        }
        st = TRI_STATUS_OK;
        ps.session = session;
        ps.cache_path = n_reused < n_ids ? cache_path : NULL;  // a whole hit leaves the file as it is
        ps.ids = ids;
        ps.n_ids = n_ids;
    }

    tri_generate_stats stats = {0};
    tri_spec_stats sstats = {0};
    catch_sigint();
    if (spec) {
        st = tri_generate_spec(spec, ids, n_ids, &gp, on_token, &out, &sstats);
        stats.n_prompt = sstats.n_prompt;
        stats.n_generated = sstats.n_generated;
        stats.prefill_seconds = sstats.prefill_seconds;
        stats.decode_seconds = sstats.decode_seconds;
        stats.kv_bytes_up = sstats.kv_bytes_up;
        stats.kv_bytes_down = sstats.kv_bytes_down;
        stats.kv_bytes_host = sstats.kv_bytes_host;
    } else {
        st = tri_generate(session, ids + n_reused, n_ids - n_reused, &gp, on_token, &out, &stats);
    }
    if (st) {
        fputc('\n', stdout);
        rc = tri_cli_fail("generation failed", st);
        goto done;
    }
    if (interrupted) {
        fputc('\n', stdout);
        fflush(stdout);
        fprintf(stderr, "offload-run generate: interrupted after %d generated tokens\n", out.n);
        rc = 130;
        goto done;
    }
    fputc('\n', stdout);
    fflush(stdout);
    print_figures(&stats);
    if (stats.kv_bytes_up || stats.kv_bytes_down) {
        int32_t n = stats.n_generated > 0 ? stats.n_generated : 1;
        fprintf(stderr,
                "offloaded KV while decoding: %.1f MiB host -> device, %.2f MiB back (%.2f MiB per generated token)\n",
                (double)stats.kv_bytes_up / (1 << 20), (double)stats.kv_bytes_down / (1 << 20),
                (double)(stats.kv_bytes_up + stats.kv_bytes_down) / (1 << 20) / n);
        if (stats.kv_bytes_host)
            fprintf(stderr, "offloaded KV attended on the host: %.1f MiB read in place (%.2f MiB per generated token)\n",
                    (double)stats.kv_bytes_host / (1 << 20), (double)stats.kv_bytes_host / (1 << 20) / n);
    }
    if (print_stats) {
        if (spec)
            print_spec_stats(&sstats, spec_params->mode);
        else
            print_plain_stats(&stats, session);
    }
    rc = 0;
    if (json_file) {
        // why it ended: the end-of-sequence or an end-of-turn token, n_predict, a stop string, or
        // the context
        const char *reason = "context";
        bool end_token = out.n > 0 && gp.stop_at_eos && out.last == tri_token_eos(model);
        for (int32_t i = 0; i < gp.n_stop_tokens; i++) end_token |= out.n > 0 && out.last == gp.stop_tokens[i];
        if (end_token) reason = "end_token";
        else if (n_predict > 0 && out.n >= n_predict) reason = "length";
        else if (n_stops) reason = "stop_string";
        write_json(json_file, model_path, spec ? tri_spec_device(spec) : tri_session_device(session), reason, load_s,
                   tri_cli_now() - t_start, &stats, spec ? &sstats : NULL, spec_params->mode, &out);
        FILE *f = json_file;
        json_file = NULL;
        if (!tri_cli_json_close("offload-run generate", json_path, f)) rc = 1;
    }

done:
    if (json_file && json_file != stdout) fclose(json_file);
    free(out.text);
    tri_session_free(session);
    tri_spec_free(spec);
    tri_cli_engine_free(&eng);
    free(ids);
    free(text);
    free(wrapped);
    tri_model_free(model);
    return rc;
}
