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
          "      --chat-format F  render the conversation as F instead of recognising the template:\n"
          "                       chatml, llama2, llama3, mistral, phi3, gemma (implies --chat)\n"
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
          "      --device D       cpu, cuda or cuda:N (default: the first GPU when there is one,\n"
          "                       else the CPU), or a list for tensor parallelism: cuda:0,cuda:1\n"
          "                       or cpu:0,cpu:1 (KV heads, attention and FFN split over them)\n"
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
          "      --batch N        prompt tokens per prefill step (default 128)\n"
          "      --kv-type T      f16 (default), f32, q8_0, q4_0 or mixed KV cache (mixed: q4_0 with\n"
          "                       the sinks and the recent window in f16 too; --budget, --sink; with\n"
          "                       --spec none or draft)\n"
          "      --kv-mixed-heavy N  mixed: also keep N heavy hitters per layer and KV head in f16\n"
          "                       (positions past the window by the attention they received; no\n"
          "                       --spec, no --kv-host)\n"
          "      --ignore-eos     keep generating after the end-of-sequence token\n"
          "      --ids            print token ids instead of text\n"
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
          "                       4 passes (default 0.5; 0: never)\n"
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
          "under a line '==> SOURCE <=='. Greedy output is what each prompt gives alone. Plain\n"
          "decoding only (no --spec, --stop, --json, --prompt-cache).\n"
          "\n",
          f);
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

// Placement: on a GPU, or when --gpu-mem gives a budget, the planner decides how many layers keep
// their weights and their KV cache in host memory, and how many of those blocks are read from
// the model file (explicit --kv-offload / --stream-weights / --weights-from-disk win).
// Writes the plan's line into line (n bytes; "" when there is nothing to place), printed once the
// session exists: an option the session refuses is then the run's one line of output. False after
// printing an error.
static bool place(const tri_model *model, tri_session_params *sp, const tri_spec_params *spec, uint64_t gpu_mem,
                  uint64_t host_mem, bool kv_set, bool weights_set, bool disk_set, bool kv_host_set,
                  double host_attn_gbps, char *line, size_t n) {
    line[0] = 0;
    bool on_gpu = sp->device_kind == TRI_DEVICE_CUDA || (sp->device_kind == TRI_DEVICE_AUTO && tri_device_count() > 0);
    int32_t n_gpu = 1, first = 0;  // a device list of GPUs: the planner splits as the session will
    if (sp->devices) {
        on_gpu = strncmp(sp->devices, "cuda", 4) == 0;
        for (const char *c = sp->devices; on_gpu && *c; c++) n_gpu += *c == ',';
        if (on_gpu && sp->devices[4] == ':') first = atoi(sp->devices + 5);
    }
    if (!gpu_mem && !on_gpu) return true;  // the CPU: nothing to place
    tri_plan_params pp = tri_plan_default_params();
    pp.mode = spec->mode == TRI_SPEC_MODE_NONE ? TRI_PLAN_MODE_AUTOREGRESSIVE : TRI_PLAN_MODE_TRIFORCE;
    pp.n_ctx = sp->n_ctx;
    pp.kv_type = sp->kv_type;
    pp.host_mem_bytes = host_mem;
    pp.n_gpu = n_gpu;
    if (spec->budget > 0) pp.retrieval_budget = spec->budget;
    if (spec->gamma1 > 0) pp.gamma1 = spec->gamma1;
    if (spec->gamma2 > 0) pp.gamma2 = spec->gamma2;
    tri_device_info di;
    int32_t dev = sp->devices ? first : sp->device_kind == TRI_DEVICE_CUDA ? sp->device : 0;
    if (gpu_mem) pp.gpu_mem_bytes = gpu_mem;
    else if (tri_device_get_info(dev, &di) == TRI_STATUS_OK) pp.gpu_mem_bytes = di.free_bytes;
    double gbps = 0;  // the link as it is, not the planner's PCIe 4.0 x16 default
    if (on_gpu && tri_device_measure_h2d(dev, 0, &gbps) == TRI_STATUS_OK && gbps > 0) pp.pcie_gbps = gbps;
    tri_plan_model pm;
    tri_plan_model_from_model(model, &pm);
    // the host's attention at the pass's query count, for the split of offloaded layers
    bool host_measured = false;
    if (host_attn_gbps == 0 && on_gpu && !kv_host_set) {
        int32_t m = pp.mode == TRI_PLAN_MODE_TRIFORCE ? (pp.gamma2 > 0 ? pp.gamma2 : 12) + 1 : 1;
        host_measured = tri_measure_host_attention(&pm.config, m, sp->kv_host_threads, &host_attn_gbps) == TRI_STATUS_OK;
    }
    pp.host_attn_gbps = host_attn_gbps;
    tri_plan plan;
    tri_status st = tri_plan_compute(&pm, &pp, &plan);
    if (st) {
        tri_cli_fail("cannot place the model in the memory budget", st);
        return false;
    }
    if (!kv_set) sp->kv_layers_offloaded = plan.n_kv_host;
    if (!weights_set) sp->weight_layers_streamed = plan.n_weights_host + plan.n_weights_disk;
    // the disk blocks are the last of the streamed ones: never more than an explicit --stream-weights
    if (!disk_set)
        sp->weight_layers_from_disk = plan.n_weights_disk < sp->weight_layers_streamed ? plan.n_weights_disk
                                                                                         : sp->weight_layers_streamed;
    snprintf(line, n,
            "plan: %.1f GiB device budget, host -> device %.1f GB/s%s: weights of %d of %d blocks resident (%d read "
            "from disk), KV of %d layers on the device, %d streamed (predicted %.3f s/token)\n",
            (double)plan.params.gpu_mem_bytes / (1 << 30), plan.params.pcie_gbps, gbps > 0 ? " measured" : " assumed",
            plan.n_layer - sp->weight_layers_streamed, plan.n_layer, sp->weight_layers_from_disk,
            plan.n_layer - sp->kv_layers_offloaded, sp->kv_layers_offloaded, plan.t_token);
    if (!kv_host_set) sp->kv_host_fraction = plan.kv_host_fraction;
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
                kv_host_set ? ", --kv-host overrides it" : "", plan.t_token_streamed);
    return true;
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
           OPT_KV, OPT_IGNORE_EOS, OPT_IDS, OPT_SPEC, OPT_DRAFT, OPT_DRAFT_LAYERS, OPT_DRAFT_NGRAM,
           OPT_GAMMA1, OPT_GAMMA2, OPT_BUDGET, OPT_CHUNK, OPT_STATS, OPT_KV_POLICY, OPT_KV_BUDGET,
           OPT_KV_CHUNK, OPT_SINK, OPT_REFRESH, OPT_DRAFT_WINDOW, OPT_DRAFT_SINK, OPT_REFRESH_ACCEPT,
           OPT_DEVICE, OPT_KV_OFFLOAD, OPT_STREAM_WEIGHTS, OPT_WEIGHTS_FROM_DISK, OPT_GPU_MEM, OPT_HOST_MEM,
           OPT_KV_INDEX, OPT_KV_HOST, OPT_HOST_ATTN, OPT_PROMPT_CACHE, OPT_DRAFT_KV, OPT_TREE_NODES, OPT_PROMPTS,
           OPT_KV_MIXED_HEAVY };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},    {"tokens", required_argument, NULL, OPT_TOKENS},
        {"chat", no_argument, NULL, OPT_CHAT},     {"n-predict", required_argument, NULL, 'n'},
        {"chat-format", required_argument, NULL, OPT_CHAT_FORMAT},
        {"system", required_argument, NULL, OPT_SYSTEM}, {"stop", required_argument, NULL, OPT_STOP},
        {"json", required_argument, NULL, OPT_JSON},
        TRI_CLI_SAMPLING_OPTIONS,
        {"ctx", required_argument, NULL, OPT_CTX}, {"threads", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, OPT_BATCH}, {"kv-type", required_argument, NULL, OPT_KV},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS}, {"ids", no_argument, NULL, OPT_IDS},
        {"spec", required_argument, NULL, OPT_SPEC}, {"draft", required_argument, NULL, OPT_DRAFT},
        {"draft-layers", required_argument, NULL, OPT_DRAFT_LAYERS},
        {"draft-ngram", required_argument, NULL, OPT_DRAFT_NGRAM},
        {"gamma1", required_argument, NULL, OPT_GAMMA1}, {"gamma2", required_argument, NULL, OPT_GAMMA2},
        {"budget", required_argument, NULL, OPT_BUDGET}, {"chunk", required_argument, NULL, OPT_CHUNK},
        {"stats", no_argument, NULL, OPT_STATS},
        {"kv", required_argument, NULL, OPT_KV_POLICY}, {"kv-budget", required_argument, NULL, OPT_KV_BUDGET},
        {"kv-chunk", required_argument, NULL, OPT_KV_CHUNK}, {"sink", required_argument, NULL, OPT_SINK},
        {"refresh", required_argument, NULL, OPT_REFRESH},
        {"draft-window", required_argument, NULL, OPT_DRAFT_WINDOW},
        {"draft-sink", required_argument, NULL, OPT_DRAFT_SINK},
        {"draft-kv-type", required_argument, NULL, OPT_DRAFT_KV},
        {"refresh-accept", required_argument, NULL, OPT_REFRESH_ACCEPT},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"kv-offload", required_argument, NULL, OPT_KV_OFFLOAD},
        {"stream-weights", required_argument, NULL, OPT_STREAM_WEIGHTS},
        {"weights-from-disk", required_argument, NULL, OPT_WEIGHTS_FROM_DISK},
        {"gpu-mem", required_argument, NULL, OPT_GPU_MEM}, {"host-mem", required_argument, NULL, OPT_HOST_MEM},
        {"kv-index", required_argument, NULL, OPT_KV_INDEX},
        {"kv-host", required_argument, NULL, OPT_KV_HOST},
        {"host-attn-gbps", required_argument, NULL, OPT_HOST_ATTN},
        {"prompt-cache", required_argument, NULL, OPT_PROMPT_CACHE},
        {"tree-nodes", required_argument, NULL, OPT_TREE_NODES},
        {"kv-mixed-heavy", required_argument, NULL, OPT_KV_MIXED_HEAVY},
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
    const char *draft_path = NULL, *draft_layers = NULL;
    // 0: not given (every one of these options wants a positive number)
    long ngram = 0, gamma1 = 0, gamma2 = 0, budget = 0, chunk = 0;
    long sink = 0, refresh = 0, draft_window = 0, draft_sink = 0, tree_nodes = 0;
    bool draft_kv_set = false;
    tri_dtype draft_kv = TRI_DTYPE_F16;
    bool kv_set = false, refresh_accept_set = false, index_set = false, kv_host_set = false;
    float kv_host = 0, host_attn_gbps = 0;
    tri_spec_params spec_params = tri_spec_default_params();
    spec_params.mode = TRI_SPEC_MODE_NONE;
    long n_predict = 128, ctx = 0, threads = 0, batch = 0, kv_offload = 0, stream_weights = 0;
    long weights_from_disk = 0;
    bool kv_offload_set = false, stream_weights_set = false, weights_from_disk_set = false;
    uint64_t gpu_mem = 0, host_mem = 0;
    tri_generate_params gp = tri_generate_default_params();
    tri_session_params sp = tri_session_default_params();
    tri_cli_sampling sampler = {0};
    int c;
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:h", opts, NULL)) != -1) {
        bool ok = true, sampling;
        if (!tri_cli_sampling_option(me, c, optarg, &sampler, &sampling)) return 2;
        if (sampling) continue;
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
                fprintf(stderr, "offload-run generate: --chat-format '%s': want chatml, llama2, llama3, mistral, phi3 "
                        "or gemma\n", optarg);
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
        case OPT_KV:
            ok = tri_cli_parse_kv_type(me, "--kv-type", optarg, &sp.kv_type);
            break;
        case OPT_IGNORE_EOS: gp.stop_at_eos = false; break;
        case OPT_IDS: print_ids = true; break;
        case OPT_SPEC:
            if (strcmp(optarg, "none") == 0) spec_params.mode = TRI_SPEC_MODE_NONE;
            else if (strcmp(optarg, "draft") == 0) spec_params.mode = TRI_SPEC_MODE_DRAFT;
            else if (strcmp(optarg, "retrieval") == 0) spec_params.mode = TRI_SPEC_MODE_RETRIEVAL;
            else if (strcmp(optarg, "triforce") == 0) spec_params.mode = TRI_SPEC_MODE_TRIFORCE;
            else {
                fprintf(stderr, "offload-run generate: --spec '%s': want none, draft, retrieval or triforce\n", optarg);
                ok = false;
            }
            break;
        case OPT_DRAFT: draft_path = optarg; break;
        case OPT_DRAFT_LAYERS: draft_layers = optarg; break;
        case OPT_DRAFT_NGRAM: ok = tri_cli_parse_long(me, "--draft-ngram", optarg, 1, 64, &ngram); break;
        case OPT_GAMMA1: ok = tri_cli_parse_long(me, "--gamma1", optarg, 1, 64, &gamma1); break;
        case OPT_GAMMA2: ok = tri_cli_parse_long(me, "--gamma2", optarg, 1, 256, &gamma2); break;
        case OPT_TREE_NODES: ok = tri_cli_parse_long(me, "--tree-nodes", optarg, 0, 1024, &tree_nodes); break;
        case OPT_KV_MIXED_HEAVY: {
            long heavy = 0;
            ok = tri_cli_parse_long(me, "--kv-mixed-heavy", optarg, 0, 1 << 20, &heavy);
            sp.kv_mixed_heavy = (int32_t)heavy;
            break;
        }
        case OPT_BUDGET:
        case OPT_KV_BUDGET:
            ok = tri_cli_parse_long(me, c == OPT_BUDGET ? "--budget" : "--kv-budget", optarg, 1, INT32_MAX, &budget);
            break;
        case OPT_CHUNK:
        case OPT_KV_CHUNK:
            ok = tri_cli_parse_long(me, c == OPT_CHUNK ? "--chunk" : "--kv-chunk", optarg, 1, 4096, &chunk);
            break;
        case OPT_STATS: print_stats = true; break;
        case OPT_PROMPT_CACHE: cache_path = optarg; break;
        case OPT_KV_POLICY:
            kv_set = true;
            if (strcmp(optarg, "full") == 0) sp.kv_policy = TRI_KV_POLICY_FULL;
            else if (strcmp(optarg, "streaming") == 0) sp.kv_policy = TRI_KV_POLICY_STREAMING;
            else if (strcmp(optarg, "h2o") == 0) sp.kv_policy = TRI_KV_POLICY_H2O;
            else if (strcmp(optarg, "retrieval") == 0) sp.kv_policy = TRI_KV_POLICY_RETRIEVAL;
            else {
                fprintf(stderr, "offload-run generate: --kv '%s': want full, streaming, h2o or retrieval\n", optarg);
                ok = false;
            }
            break;
        case OPT_SINK: ok = tri_cli_parse_long(me, "--sink", optarg, 1, INT32_MAX, &sink); break;
        case OPT_REFRESH: ok = tri_cli_parse_long(me, "--refresh", optarg, 1, INT32_MAX, &refresh); break;
        case OPT_DRAFT_WINDOW:
            ok = tri_cli_parse_long(me, "--draft-window", optarg, 2, INT32_MAX, &draft_window);
            break;
        case OPT_DRAFT_SINK: ok = tri_cli_parse_long(me, "--draft-sink", optarg, 1, INT32_MAX, &draft_sink); break;
        case OPT_DRAFT_KV:
            draft_kv_set = true;
            ok = tri_cli_parse_kv_type(me, "--draft-kv-type", optarg, &draft_kv);
            break;
        case OPT_REFRESH_ACCEPT:
            refresh_accept_set = true;
            ok = tri_cli_parse_float(me, "--refresh-accept", optarg, 0.0, 1.0, &spec_params.refresh_accept);
            break;
        case OPT_DEVICE: ok = tri_cli_parse_device("offload-run generate", optarg, &sp); break;
        case OPT_KV_OFFLOAD:
            kv_offload_set = true;
            ok = tri_cli_parse_long(me, "--kv-offload", optarg, 0, 65536, &kv_offload);
            break;
        case OPT_STREAM_WEIGHTS:
            stream_weights_set = true;
            ok = tri_cli_parse_long(me, "--stream-weights", optarg, 0, 65536, &stream_weights);
            break;
        case OPT_WEIGHTS_FROM_DISK:
            weights_from_disk_set = true;
            ok = tri_cli_parse_long(me, "--weights-from-disk", optarg, 0, 65536, &weights_from_disk);
            break;
        case OPT_KV_HOST:
            kv_host_set = true;
            ok = tri_cli_parse_float(me, "--kv-host", optarg, 0.0, 1.0, &kv_host);
            break;
        case OPT_HOST_ATTN: ok = tri_cli_parse_float(me, "--host-attn-gbps", optarg, 0.0, 1e6, &host_attn_gbps); break;
        case OPT_GPU_MEM:
        case OPT_HOST_MEM:
            if (!tri_cli_parse_size(optarg, c == OPT_GPU_MEM ? &gpu_mem : &host_mem)) {
                fprintf(stderr, "offload-run generate: %s '%s': want a size like 24G or 512M\n",
                        c == OPT_GPU_MEM ? "--gpu-mem" : "--host-mem", optarg);
                ok = false;
            }
            break;
        case OPT_KV_INDEX:
            index_set = true;
            if (strcmp(optarg, "exact") == 0) sp.kv_index = TRI_KV_INDEX_EXACT;
            else if (strcmp(optarg, "faiss") == 0) sp.kv_index = TRI_KV_INDEX_FAISS_FLAT;
            else if (strcmp(optarg, "faiss-ivf") == 0) sp.kv_index = TRI_KV_INDEX_FAISS_IVF;
            else {
                fprintf(stderr, "offload-run generate: --kv-index '%s': want exact, faiss or faiss-ivf\n", optarg);
                ok = false;
            }
            break;
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
    int n_drafters = (draft_path != NULL) + (draft_layers != NULL) + (ngram != 0);
    bool needs_drafter = spec_params.mode == TRI_SPEC_MODE_DRAFT || spec_params.mode == TRI_SPEC_MODE_TRIFORCE;
    if (n_drafters > 1 || (needs_drafter && n_drafters == 0) || (!needs_drafter && n_drafters == 1)) {
        fprintf(stderr, "offload-run generate: %s\n",
                n_drafters > 1 ? "give at most one of --draft, --draft-layers, --draft-ngram"
                : needs_drafter ? "--spec draft and --spec triforce need one of --draft, --draft-layers, --draft-ngram"
                                : "a drafter needs --spec draft or --spec triforce");
        return 2;
    }
    // every cache option must do something under the chosen policy or mode
    const tri_spec_mode mode = spec_params.mode;
    const bool plain = mode == TRI_SPEC_MODE_NONE;
    const bool has_l2 = mode == TRI_SPEC_MODE_RETRIEVAL || mode == TRI_SPEC_MODE_TRIFORCE;
    const bool l1_cache = needs_drafter && ngram == 0;  // the n-gram drafter has no cache
    const tri_kv_policy pol = sp.kv_policy;
    const bool mixed = sp.kv_type == TRI_DTYPE_KV_MIXED;  // --budget, --sink: its f16 tokens and sinks
    if (!tri_cli_applies("offload-run generate", "--kv", kv_set, plain,
                         "plain decoding; the levels of --spec have their own caches") ||
        !tri_cli_applies("offload-run generate", "--budget", budget,
                         plain ? pol != TRI_KV_POLICY_FULL || mixed : has_l2 || mixed,
                         plain ? "--kv streaming, h2o or retrieval, or --kv-type mixed (the cache policy is full)"
                               : "L2, the retrieval cache of --spec retrieval and triforce, or --kv-type mixed") ||
        !tri_cli_applies("offload-run generate", "--chunk", chunk, plain ? pol == TRI_KV_POLICY_RETRIEVAL : has_l2,
                         plain ? "--kv retrieval" : "L2, the retrieval cache of --spec retrieval and triforce") ||
        !tri_cli_applies("offload-run generate", "--kv-index", index_set,
                         plain ? pol == TRI_KV_POLICY_RETRIEVAL : has_l2,
                         plain ? "--kv retrieval" : "L2, the retrieval cache of --spec retrieval and triforce") ||
        !tri_cli_applies("offload-run generate", "--refresh", refresh, plain ? pol == TRI_KV_POLICY_RETRIEVAL : has_l2,
                         plain ? "--kv retrieval" : "L2, the retrieval cache of --spec retrieval and triforce") ||
        !tri_cli_applies("offload-run generate", "--sink", sink, (plain && pol == TRI_KV_POLICY_STREAMING) || mixed,
                         plain ? "--kv streaming"
                               : "--kv streaming or --kv-type mixed (L1's sinks are --draft-sink)") ||
        !tri_cli_applies("offload-run generate", "--draft-window", draft_window, l1_cache,
                         "an L1 model or layers (--spec draft or triforce)") ||
        !tri_cli_applies("offload-run generate", "--draft-sink", draft_sink, l1_cache,
                         "an L1 model or layers (--spec draft or triforce)") ||
        !tri_cli_applies("offload-run generate", "--draft-kv-type", draft_kv_set, l1_cache || has_l2,
                         "a draft cache: an L1 model or layers (--spec draft or triforce), or L2 (--spec "
                         "retrieval or triforce)") ||
        !tri_cli_applies("offload-run generate", "--gamma1", gamma1, mode == TRI_SPEC_MODE_TRIFORCE,
                         "--spec triforce") ||
        !tri_cli_applies("offload-run generate", "--gamma2", gamma2, !plain, "--spec draft, retrieval or triforce") ||
        !tri_cli_applies("offload-run generate", "--tree-nodes", tree_nodes, !plain,
                         "--spec draft, retrieval or triforce") ||
        !tri_cli_applies("offload-run generate", "--refresh-accept", refresh_accept_set, has_l2,
                         "--spec retrieval or triforce"))
        return 2;
    if (plain || mixed) {  // with --spec, mixed's f16 tokens and sinks (it serves no L2)
        sp.kv_budget = (int32_t)budget;
        sp.kv_chunk = (int32_t)chunk;
        sp.kv_sink = (int32_t)sink;
        sp.kv_refresh = (int32_t)refresh;
    }
    spec_params.refresh = (int32_t)refresh;
    spec_params.draft_window = (int32_t)draft_window;
    spec_params.draft_sink = (int32_t)draft_sink;
    if (draft_kv_set) spec_params.draft_kv_type = draft_kv;
    spec_params.ngram_n = (int32_t)ngram;
    spec_params.gamma1 = (int32_t)gamma1;
    spec_params.gamma2 = (int32_t)gamma2;
    spec_params.tree_nodes = (int32_t)tree_nodes;
    spec_params.budget = (int32_t)budget;
    spec_params.chunk = (int32_t)chunk;
    if (draft_path) spec_params.drafter = TRI_SPEC_DRAFTER_MODEL;
    if (draft_layers) spec_params.drafter = TRI_SPEC_DRAFTER_LAYERS;
    if (ngram) spec_params.drafter = TRI_SPEC_DRAFTER_NGRAM;

    if (several && (!plain || cache_path || json_path || n_stops || gpu_mem)) {
        fprintf(stderr, "offload-run generate: several prompts run as plain decoding in a batch: %s does not apply\n",
                !plain ? "--spec" : cache_path ? "--prompt-cache" : json_path ? "--json" : n_stops ? "--stop"
                                                                                               : "--gpu-mem");
        return 2;
    }
    double t_start = tri_cli_now();
    tri_model *model = tri_cli_load_model(model_path);
    if (!model) return 1;
    if (several) {  // -f repeated or --prompts: a batch (cli-generate-batch.c)
        sp.n_threads = (int32_t)threads;
        sp.n_batch = (int32_t)batch;
        sp.kv_layers_offloaded = (int32_t)kv_offload;
        sp.weight_layers_streamed = (int32_t)stream_weights;
        sp.weight_layers_from_disk = (int32_t)weights_from_disk;
        sp.kv_host_fraction = kv_host;
        gp.n_predict = (int32_t)n_predict;
        tri_cli_sampling_resolve(&sampler, chat);
        gp.sampler = sampler.p;
        tri_cli_several a = {files, n_files, prompts_path, chat, chat_format, system_msg, print_ids, print_stats,
                             ctx, sp, gp};
        int rc = tri_cli_generate_several(model, &a);
        tri_model_free(model);
        return rc;
    }
    double load_s = tri_cli_now() - t_start;
    int32_t stop_ids[16];
    int rc = 1;
    tri_session *session = NULL;
    tri_spec *spec = NULL;
    tri_model *draft = NULL;
    int32_t *layers = NULL;
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
    sp.n_ctx = (int32_t)ctx;
    sp.n_threads = (int32_t)threads;
    sp.n_batch = (int32_t)batch;
    sp.kv_layers_offloaded = (int32_t)kv_offload;
    sp.weight_layers_streamed = (int32_t)stream_weights;
    sp.weight_layers_from_disk = (int32_t)weights_from_disk;
    sp.kv_host_fraction = kv_host;
    char plan_line[1024];
    if (!place(model, &sp, &spec_params, gpu_mem, host_mem, kv_offload_set, stream_weights_set,
               weights_from_disk_set, kv_host_set, host_attn_gbps, plan_line, sizeof plan_line))
        goto done;
    // layers read from disk stream: they count among the streamed unless those were given
    if (!stream_weights_set && sp.weight_layers_from_disk > sp.weight_layers_streamed)
        sp.weight_layers_streamed = sp.weight_layers_from_disk;
    if (spec_params.mode == TRI_SPEC_MODE_NONE) {
        if ((st = tri_session_create(model, &sp, &session))) {
            rc = tri_cli_fail("cannot create a session", st);
            goto done;
        }
    } else {
        if (draft_path && !(draft = tri_cli_load_model(draft_path))) goto done;
        if (draft_layers && !(layers = tri_cli_parse_layers("offload-run generate", "--draft-layers", draft_layers,
                                                            &spec_params.n_draft_layers))) {
            rc = 2;
            goto done;
        }
        spec_params.draft_model = draft;
        spec_params.draft_layers = layers;
        if ((st = tri_spec_create(model, &sp, &spec_params, &spec))) {
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
            print_spec_stats(&sstats, spec_params.mode);
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
                   tri_cli_now() - t_start, &stats, spec ? &sstats : NULL, spec_params.mode, &out);
        FILE *f = json_file;
        json_file = NULL;
        if (!tri_cli_json_close("offload-run generate", json_path, f)) rc = 1;
    }

done:
    if (json_file && json_file != stdout) fclose(json_file);
    free(out.text);
    tri_session_free(session);
    tri_spec_free(spec);
    tri_model_free(draft);
    free(layers);
    free(ids);
    free(text);
    free(wrapped);
    tri_model_free(model);
    return rc;
}
