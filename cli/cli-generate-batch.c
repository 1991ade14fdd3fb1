// cli-generate-batch.c - `offload-run generate` with several prompts (-f repeated, --prompts
// FILE.jsonl): one session per prompt, the prompts prefilled packed in shared passes and decoded
// together (tri_session_eval_batch), each output printed on its own afterwards; with --spec one
// speculative engine per prompt, generating together (tri_generate_spec_batch).
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char several_me[] = "offload-run generate";

// One prompt: where it came from, its text, its ids, what was generated after it.
typedef struct several_seq {
    char source[64];  // "FILE" or "FILE:LINE"
    char *text;
    size_t len;
    int32_t *ids, n_ids;
    int32_t *gen, n_gen, n_max;
    bool done;
    const char *reason;
} several_seq;

static void several_free(several_seq *q, int32_t n) {
    for (int32_t i = 0; q && i < n; i++) free(q[i].text), free(q[i].ids), free(q[i].gen);
    free(q);
}

static several_seq *several_push(several_seq **q, int32_t *n, int32_t *cap) {
    if (*n == *cap) {
        int32_t c = *cap ? 2 * *cap : 8;
        several_seq *g = realloc(*q, sizeof *g * (size_t)c);
        if (!g) return NULL;
        *q = g;
        *cap = c;
    }
    memset(&(*q)[*n], 0, sizeof **q);
    return &(*q)[(*n)++];
}

// The prompts of --prompts FILE: one JSON object per line with a string "prompt" (other members
// ignored), blank lines skipped. False after printing an error that names the file and line.
static bool several_jsonl(const char *path, uint64_t max_bytes, several_seq **q, int32_t *n, int32_t *cap) {
    size_t len;
    char *all = tri_cli_read_prompt(path, max_bytes, "too long for the context's prompts", &len);
    if (!all) return false;
    bool ok = true;
    int32_t line = 0;
    for (char *p = all, *end; ok && p < all + len; p = end + 1) {
        line++;
        end = memchr(p, '\n', (size_t)(all + len - p));
        if (!end) end = all + len;
        size_t n_line = (size_t)(end - p);
        size_t blank = strspn(p, " \t\r");
        if (blank >= n_line) continue;
        json_tokener *tok = json_tokener_new();
        if (!tok) {
            fprintf(stderr, "%s: --prompts %s: out of memory\n", several_me, path);
            ok = false;
            break;
        }
        json_object *o = json_tokener_parse_ex(tok, p, (int)n_line);
        enum json_tokener_error je = json_tokener_get_error(tok);
        json_object *v = NULL;
        if (!o || je != json_tokener_success) {
            fprintf(stderr, "%s: --prompts %s: line %d: not a JSON object (%s)\n", several_me, path, line,
                    json_tokener_error_desc(je == json_tokener_success ? json_tokener_continue : je));
            ok = false;
        } else if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "prompt", &v) ||
                   !json_object_is_type(v, json_type_string)) {
            fprintf(stderr, "%s: --prompts %s: line %d: want an object with a string \"prompt\"\n", several_me, path,
                    line);
            ok = false;
        } else {
            several_seq *s = several_push(q, n, cap);
            size_t tl = (size_t)json_object_get_string_len(v);
            char *t = s ? malloc(tl + 1) : NULL;
            if (!t) {
                fprintf(stderr, "%s: --prompts %s: out of memory\n", several_me, path);
                ok = false;
            } else {
                memcpy(t, json_object_get_string(v), tl);
                t[tl] = 0;
                s->text = t;
                s->len = tl;
                snprintf(s->source, sizeof s->source, "%.48s:%d", path, line);
            }
        }
        json_object_put(o);
        json_tokener_free(tok);
    }
    free(all);
    if (ok && *n == 0) {
        fprintf(stderr, "%s: --prompts %s: no prompts in it\n", several_me, path);
        ok = false;
    }
    return ok;
}

// What one prompt's engine emits: its tokens, in order.
static bool several_on_token(int32_t token, void *user) {
    several_seq *s = user;
    if (s->n_gen < s->n_max) s->gen[s->n_gen++] = token;
    return true;
}

// The output of every prompt, each under its "==> SOURCE <==" line.
static int several_print(tri_model *model, const tri_cli_several *a, several_seq *q, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        printf("%s==> %s <==\n", i ? "\n" : "", q[i].source);
        if (a->print_ids) {
            for (int32_t j = 0; j < q[i].n_gen; j++) printf(j ? " %d" : "%d", q[i].gen[j]);
        } else {
            size_t bytes = 0;
            tri_status st;
            tri_detokenize(model, q[i].gen, q[i].n_gen, false, NULL, 0, &bytes);
            char *text = malloc(bytes + 1);
            if (!text || (st = tri_detokenize(model, q[i].gen, q[i].n_gen, false, text, bytes + 1, &bytes))) {
                free(text);
                return text ? tri_cli_fail("detokenizing failed", st) : 1;
            }
            fwrite(text, 1, bytes, stdout);
            free(text);
        }
        fputc('\n', stdout);
    }
    fflush(stdout);
    return 0;
}

// ---- --json ----

// One JSON object for the batch, as `generate --json` writes one for a prompt: the figures of the
// whole batch, then each prompt's (source, tokens, why it stopped, text; speculative: its passes and
// acceptance). stats: the engines' figures (--spec), else NULL. False after printing an error.
static bool several_json(tri_model *model, const tri_cli_several *a, const several_seq *q, int32_t n,
                         const char *device, double prefill_s, double decode_s, int64_t n_passes,
                         const tri_spec_stats *stats) {
    FILE *f = tri_cli_json_open(several_me, a->json_path);
    if (!f) return false;
    int64_t n_prompt = 0, n_gen = 0;
    for (int32_t i = 0; i < n; i++) {
        n_prompt += q[i].n_ids;
        n_gen += stats ? stats[i].n_generated : q[i].n_gen;
    }
    fputs("{\"command\": \"generate\", \"model\": ", f);
    tri_cli_json_str(f, a->model_path ? a->model_path : "", a->model_path ? strlen(a->model_path) : 0);
    fprintf(f, ", \"device\": \"%s\", \"prompts\": %d, \"prompt_tokens\": %lld, \"generated_tokens\": %lld", device, n,
            (long long)n_prompt, (long long)n_gen);
    if (stats)
        fprintf(f, ", \"seconds\": %.6f, \"tokens_per_second\": %.3f", decode_s,
                decode_s > 0 ? (double)n_gen / decode_s : 0.0);
    else
        fprintf(f,
                ", \"prefill_seconds\": %.6f, \"prefill_tokens_per_second\": %.3f, \"decode_seconds\": %.6f, "
                "\"decode_tokens_per_second\": %.3f, \"batched_passes\": %lld",
                prefill_s, prefill_s > 0 ? (double)n_prompt / prefill_s : 0.0, decode_s,
                decode_s > 0 ? (double)(n_gen - n) / decode_s : 0.0, (long long)n_passes);
    fprintf(f, ", \"peak_rss_bytes\": %llu, \"outputs\": [", (unsigned long long)tri_cli_peak_rss());
    for (int32_t i = 0; i < n; i++) {
        fputs(i ? ", {\"source\": " : "{\"source\": ", f);
        tri_cli_json_str(f, q[i].source, strlen(q[i].source));
        fprintf(f, ", \"prompt_tokens\": %d, \"generated_tokens\": %d, \"stop_reason\": \"%s\"", q[i].n_ids,
                stats ? stats[i].n_generated : q[i].n_gen,
                stats         ? tri_stop_reason_str(stats[i].stop_reason)
                : q[i].reason ? q[i].reason
                              : "none");
        if (stats)
            fprintf(f,
                    ", \"full_cache_passes\": %lld, \"l1_accepted\": %lld, \"l1_proposed\": %lld, "
                    "\"l2_accepted\": %lld, \"l2_proposed\": %lld",
                    (long long)stats[i].n_l3_verify, (long long)stats[i].l1_accepted, (long long)stats[i].l1_proposed,
                    (long long)stats[i].l2_accepted, (long long)stats[i].l2_proposed);
        size_t bytes = 0;
        tri_detokenize(model, q[i].gen, q[i].n_gen, false, NULL, 0, &bytes);
        char *text = malloc(bytes + 1);
        if (text && tri_detokenize(model, q[i].gen, q[i].n_gen, false, text, bytes + 1, &bytes) == TRI_STATUS_OK) {
            fputs(", \"text\": ", f);
            tri_cli_json_str(f, text, bytes);
        }
        free(text);
        fputc('}', f);
    }
    fputs("]}\n", f);
    return tri_cli_json_close(several_me, a->json_path, f);
}

// --spec with several prompts: one engine per prompt, generating together (tri_spec_batch: each
// level's passes of the prompts at it batched), each exactly as `generate --spec` alone.
static int several_run_spec(tri_model *model, const tri_cli_several *a, several_seq *q, int32_t n) {
    tri_spec **specs = calloc((size_t)n, sizeof *specs);
    const int32_t **toks = calloc((size_t)n, sizeof *toks);
    int32_t *n_toks = calloc((size_t)n, sizeof *n_toks);
    void **users = calloc((size_t)n, sizeof *users);
    tri_spec_stats *stats = calloc((size_t)n, sizeof *stats);
    tri_status *sts = calloc((size_t)n, sizeof *sts);
    int rc = 1;
    if (!specs || !toks || !n_toks || !users || !stats || !sts) {
        fprintf(stderr, "%s: out of memory for %d prompts\n", several_me, n);
        goto done;
    }
    int32_t stop_ids[16], n_stop_ids = 0;
    tri_generate_params gp = a->gp;
    if (a->chat && gp.stop_at_eos && tri_chat_stop_tokens(model, stop_ids, 16, &n_stop_ids) == TRI_STATUS_OK) {
        gp.stop_tokens = stop_ids;
        gp.n_stop_tokens = n_stop_ids < 16 ? n_stop_ids : 16;
    }
    tri_generate_params *gps = calloc((size_t)n, sizeof *gps);
    if (!gps) {
        fprintf(stderr, "%s: out of memory for %d prompts\n", several_me, n);
        goto done;
    }
    int64_t n_prompt = 0;
    for (int32_t i = 0; i < n; i++) {
        tri_session_params sp = a->sp;
        tri_status st = tri_spec_create(model, &sp, a->spec, &specs[i]);
        if (st) {
            free(gps);
            rc = tri_cli_fail("cannot set up speculative decoding", st);
            goto done;
        }
        int32_t room = sp.n_ctx - q[i].n_ids + 1;
        q[i].n_max = gp.n_predict > 0 && gp.n_predict < room ? gp.n_predict : room;
        if (!(q[i].gen = malloc(sizeof *q[i].gen * (size_t)(q[i].n_max > 0 ? q[i].n_max : 1)))) {
            free(gps);
            fprintf(stderr, "%s: out of memory\n", several_me);
            goto done;
        }
        toks[i] = q[i].ids, n_toks[i] = q[i].n_ids, users[i] = &q[i], gps[i] = gp;
        n_prompt += q[i].n_ids;
    }
    fprintf(stderr, "device: %s\n", tri_spec_device(specs[0]));
    double t0 = tri_cli_now();
    tri_status st = tri_generate_spec_batch(specs, toks, n_toks, gps, several_on_token, users, stats, sts, n);
    double t1 = tri_cli_now();
    free(gps);
    if (st) {
        rc = tri_cli_fail("speculative decoding failed", st);
        goto done;
    }
    if ((rc = several_print(model, a, q, n))) goto done;
    if (a->json_path && !several_json(model, a, q, n, tri_spec_device(specs[0]), 0, t1 - t0, 0, stats)) {
        rc = 1;
        goto done;
    }
    int64_t n_gen = 0, n_l3 = 0;
    for (int32_t i = 0; i < n; i++) n_gen += stats[i].n_generated, n_l3 += stats[i].n_l3_verify;
    fprintf(stderr,
            "prompts: %d, %lld tokens | generated: %lld tokens, %lld L3 verifications, speculative decoding "
            "together %.1f tok/s (%.3f s, prefills included)\n",
            n, (long long)n_prompt, (long long)n_gen, (long long)n_l3, t1 > t0 ? (double)n_gen / (t1 - t0) : 0.0,
            t1 - t0);
    if (a->print_stats) {
        for (int32_t i = 0; i < n; i++) {
            const tri_spec_stats *s = &stats[i];
            fprintf(stderr,
                    "  %s: %d prompt tokens, %d generated, %lld L3 passes (%.2f tokens each), L1 accepted %lld of "
                    "%lld, L2 accepted %lld of %lld, stopped: %s\n",
                    q[i].source, q[i].n_ids, s->n_generated, (long long)s->n_l3_verify,
                    s->n_l3_verify ? (double)s->n_generated / (double)s->n_l3_verify : 0.0, (long long)s->l1_accepted,
                    (long long)s->l1_proposed, (long long)s->l2_accepted, (long long)s->l2_proposed,
                    tri_stop_reason_str(s->stop_reason));
        }
    }
    rc = 0;

done:
    for (int32_t i = 0; specs && i < n; i++) tri_spec_free(specs[i]);
    free(specs), free(toks), free(n_toks), free(users), free(stats), free(sts);
    return rc;
}

// Runs a batch: the prompts packed into shared prefill passes, then one decode pass per token for
// all that still generate. Tokens are chosen as tri_generate chooses them (the same sampler, the
// same seed per session), so each output is what `generate` prints for that prompt alone.
static int several_run(tri_model *model, const tri_cli_several *a, several_seq *q, int32_t n) {
    if (a->spec) return several_run_spec(model, a, q, n);
    tri_session **ss = calloc((size_t)n, sizeof *ss);
    const int32_t **toks = calloc((size_t)n, sizeof *toks);
    int32_t *n_toks = calloc((size_t)n, sizeof *n_toks), *next = calloc((size_t)n, sizeof *next);
    tri_session **run = calloc((size_t)n, sizeof *run);
    int rc = 1;
    if (!ss || !toks || !n_toks || !next || !run) {
        fprintf(stderr, "%s: out of memory for %d prompts\n", several_me, n);
        goto done;
    }
    int32_t stop_ids[16], n_stop_ids = 0;
    if (a->chat && a->gp.stop_at_eos && tri_chat_stop_tokens(model, stop_ids, 16, &n_stop_ids) == TRI_STATUS_OK &&
        n_stop_ids > 16)
        n_stop_ids = 16;
    const int32_t eos = a->gp.stop_at_eos ? tri_token_eos(model) : -1;
    int64_t n_prompt = 0;
    for (int32_t i = 0; i < n; i++) {
        tri_session_params sp = a->sp;
        tri_status st = tri_session_create(model, &sp, &ss[i]);
        if (st) {
            rc = tri_cli_fail("cannot create a session", st);
            goto done;
        }
        tri_session_seed(ss[i], a->gp.sampler.seed);
        int32_t room = tri_session_n_ctx(ss[i]) - q[i].n_ids + 1;  // the last token need not be run
        q[i].n_max = a->gp.n_predict > 0 && a->gp.n_predict < room ? a->gp.n_predict : room;
        if (!(q[i].gen = malloc(sizeof *q[i].gen * (size_t)(q[i].n_max > 0 ? q[i].n_max : 1)))) {
            fprintf(stderr, "%s: out of memory\n", several_me);
            goto done;
        }
        toks[i] = q[i].ids;
        n_toks[i] = q[i].n_ids;
        n_prompt += q[i].n_ids;
    }
    fprintf(stderr, "device: %s\n", tri_session_device(ss[0]));
    double t0 = tri_cli_now();
    tri_status st = tri_session_eval_batch(ss, toks, n_toks, n);  // every prompt, packed
    if (st) {
        rc = tri_cli_fail("prefill failed", st);
        goto done;
    }
    double t1 = tri_cli_now();
    int64_t n_gen = 0, n_passes = 0;
    for (;;) {
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            if (q[i].done) continue;
            if ((st = tri_session_sample(ss[i], &a->gp.sampler, &next[i]))) {
                rc = tri_cli_fail("sampling failed", st);
                goto done;
            }
            int32_t t = next[i];
            q[i].gen[q[i].n_gen++] = t;
            n_gen++;
            bool end = t == eos;
            for (int32_t j = 0; j < n_stop_ids; j++) end |= t == stop_ids[j];
            if (end || q[i].n_gen == q[i].n_max) {  // emitted, not run
                q[i].done = true;
                q[i].reason = end                                                    ? "end_token"
                              : a->gp.n_predict > 0 && q[i].n_gen == a->gp.n_predict ? "length"
                                                                                     : "context";
                continue;
            }
            run[k] = ss[i], toks[k] = &next[i], n_toks[k++] = 1;
        }
        if (k == 0) break;
        if ((st = tri_session_eval_batch(run, toks, n_toks, k))) {
            rc = tri_cli_fail("decoding failed", st);
            goto done;
        }
        n_passes++;
    }
    double t2 = tri_cli_now();
    if ((rc = several_print(model, a, q, n))) goto done;
    rc = 1;
    if (a->json_path && !several_json(model, a, q, n, tri_session_device(ss[0]), t1 - t0, t2 - t1, n_passes, NULL))
        goto done;
    fprintf(stderr,
            "prompts: %d, %lld tokens packed, prefill %.1f tok/s (%.3f s) | generated: %lld tokens in %lld "
            "batched passes, decode %.1f tok/s together (%.3f s)\n",
            n, (long long)n_prompt, t1 > t0 ? (double)n_prompt / (t1 - t0) : 0.0, t1 - t0, (long long)n_gen,
            (long long)n_passes, t2 > t1 ? (double)(n_gen - n) / (t2 - t1) : 0.0, t2 - t1);
    if (a->print_stats)
        for (int32_t i = 0; i < n; i++)
            fprintf(stderr, "  %s: %d prompt tokens, %d generated, stopped: %s\n", q[i].source, q[i].n_ids, q[i].n_gen,
                    q[i].reason ? q[i].reason : "none");
    rc = 0;

done:
    for (int32_t i = 0; ss && i < n; i++) tri_session_free(ss[i]);
    free(ss), free(toks), free(n_toks), free(next), free(run);
    return rc;
}

int tri_cli_generate_several(tri_model *model, const tri_cli_several *a) {
    several_seq *q = NULL;
    int32_t n = 0, cap = 0;
    int rc = 1;
    tri_model_info info;
    tri_model_get_info(model, &info);
    int64_t room = a->ctx > 0 ? a->ctx : info.config.n_ctx_train > 0 ? info.config.n_ctx_train : 131072;
    size_t longest;
    uint64_t most = tri_cli_prompt_bytes(model, room, &longest);
    char why[256];
    snprintf(why, sizeof why,
             "more than a context of %lld tokens can hold (no token of the model is longer than %zu "
             "bytes)%s",
             (long long)room, longest, a->ctx > 0 ? "" : "; --ctx N sets the context");
    for (int32_t f = 0; f < a->n_files; f++) {
        several_seq *s = several_push(&q, &n, &cap);
        if (!s) goto oom;
        snprintf(s->source, sizeof s->source, "%.63s", a->files[f]);
        if (!(s->text = tri_cli_read_prompt(a->files[f], most, why, &s->len))) goto done;
    }
    if (a->prompts_path && !several_jsonl(a->prompts_path, most * 64 + (1 << 20), &q, &n, &cap)) goto done;
    int64_t longest_ids = 0;
    for (int32_t i = 0; i < n; i++) {
        const char *body = q[i].text;
        size_t len = q[i].len;
        char *wrapped = NULL;
        if (a->chat) {
            tri_chat_message msgs[2] = {{"system", a->system_msg}, {"user", body}};
            size_t n_msgs = a->system_msg ? 2 : 1;
            if (!(wrapped = tri_cli_render_chat(several_me, model, a->chat_format, a->system_msg ? msgs : msgs + 1,
                                                n_msgs, &len)))
                goto done;
            body = wrapped;
        }
        q[i].ids = tri_cli_text_ids(several_me, model, body, len, !a->chat, a->chat, &q[i].n_ids);
        free(wrapped);
        if (!q[i].ids) goto done;
        if (q[i].n_ids == 0) {
            fprintf(stderr, "%s: %s: the prompt is empty\n", several_me, q[i].source);
            goto done;
        }
        longest_ids = q[i].n_ids > longest_ids ? q[i].n_ids : longest_ids;
    }
    tri_cli_several b = *a;
    if (b.ctx == 0) {  // as for one prompt: the longest prompt + n-predict (+ 4096 with -n 0)
        int64_t want = longest_ids + (a->gp.n_predict > 0 ? a->gp.n_predict : 4096);
        b.ctx = want > INT32_MAX ? INT32_MAX : want;
    }
    for (int32_t i = 0; i < n; i++)
        if (b.ctx < q[i].n_ids) {
            fprintf(stderr, "%s: --ctx %ld is shorter than the prompt of %s (%d tokens)\n", several_me, b.ctx,
                    q[i].source, q[i].n_ids);
            goto done;
        }
    b.sp.n_ctx = (int32_t)b.ctx;
    rc = several_run(model, &b, q, n);
    goto done;
oom:
    fprintf(stderr, "%s: out of memory\n", several_me);
done:
    several_free(q, n);
    return rc;
}
