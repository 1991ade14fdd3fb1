// bench-table1.c - TriForce's Table 1 on our model: how well each cache policy stands in for full
// attention, by the two measures the paper uses, plus the acceptance they imply for L2.
//
//   text:   a prompt of CONTEXT tokens of TEXT, then POSITIONS more tokens fed one by one (teacher
//           forcing); per policy and budget: top1, the share of positions whose greedy next token
//           equals full attention's (L2's acceptance at temperature 0), and accept@0.6, the mean of
//           sum_x min(p(x), q(x)) with p the full cache's and q the policy's next-token
//           distributions at temperature 0.6 (the probability that speculative sampling at 0.6
//           accepts L2's token; expected, from the distributions, not from a run of the engine).
//   needle: a chat prompt of CONTEXT tokens of TEXT with "The special magic number is N." buried
//           at DEPTH (a fraction of the text) and a question about it at the end; greedy decoding
//           of 16 tokens; a hit when the answer holds N. Per policy at a budget of CONTEXT / DIV.
//
// usage: bench-table1 MODEL TEXT text   CONTEXT POSITIONS BUDGETS POLICIES [threads]
//        bench-table1 MODEL TEXT needle CONTEXTS DEPTHS DIV POLICIES [threads]
// A needle's key is a function of its context's and depth's places in the lists, and of
// $TRI_NEEDLE_SEED (default 0): other seeds hide other numbers in the same prompts.
// BUDGETS, CONTEXTS, DEPTHS: comma lists. POLICIES: comma list of streaming, h2o and retrieval
// variants "ret[:index][:sum|:max|:soft][:oracle[A-B]][:bound[A-B]][:wN][:qN][:cN][:rN][:fN][:diag]": the
// first selection by the group rule over the index too (default: by full attention's mass); group
// scoring; the oracle (a measurement: the chunks with the most true attention mass of full
// attention) in every layer or in layers A to B; chunk bounds for summaries instead of mean keys,
// in every layer or in layers A to B; a recent window of N tokens; the last N tokens' queries;
// chunks of N; a refresh every N tokens; N chunks after each chosen one (follow); default: the
// policy defaults. diag: after the prompt's selection, per layer, the share of full attention's
// mass the view keeps against the oracle's share, and in a needle prompt the mass on the needle's
// chunks and in how many KV heads the selection and the oracle keep them.
//
// Every policy runs the same prompt. Full attention and the retrieval variants share one
// full-attention prefill of all but the last 64 tokens (retrieval attends fully until its first
// selection, as TriForce's L2 does: adopting those rows is exact); the last 64 tokens (the
// question, in a needle prompt) are one step, at whose end retrieval selects. StreamingLLM (16
// sinks) and H2O (half the budget recent) build their caches through their own steps.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "kv-policy.h"
#include "llama.h"
#include "model.h"
#include "tri-config.h"
#include "bench-util.h"

#define LAST 64     // tokens of the prompt's last step
#define ANSWER 16   // greedy tokens of a needle answer

static void die(const char *what) {
    fprintf(stderr, "bench-table1: %s: %s\n", what, tri_last_error());
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void softmax_t(const float *l, double *p, int32_t n, double temp) {
    double mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < n; i++) mx = fmax(mx, (double)l[i]);
    for (int32_t i = 0; i < n; i++) s += p[i] = exp(((double)l[i] - mx) / temp);
    for (int32_t i = 0; i < n; i++) p[i] /= s;
}

// A policy to compare, parsed from its name.
typedef struct variant {
    char name[64];
    tri_kv_policy kind;
    tri__kv_group group;
    int32_t window, queries, chunk, refresh, follow;
    uint64_t oracle;        // layers the oracle selects in
    uint64_t bound_layers;  // layers summarised by bounds
    bool set_group, bound, diag, index;  // index: the first selection by the group rule too
} variant;

static variant parse_variant(const char *s) {
    variant v = {.kind = TRI_KV_POLICY_RETRIEVAL, .window = -1, .queries = -1, .chunk = 0, .refresh = 0, .follow = -1};
    snprintf(v.name, sizeof v.name, "%s", s);
    if (!strcmp(s, "streaming")) v.kind = TRI_KV_POLICY_STREAMING;
    else if (!strcmp(s, "h2o")) v.kind = TRI_KV_POLICY_H2O;
    else if (!strncmp(s, "ret", 3)) {
        for (const char *c = strchr(s, ':'); c; c = strchr(c + 1, ':')) {
            if (!strncmp(c, ":sum", 4)) v.group = TRI__KV_GROUP_SUM, v.set_group = true;
            else if (!strncmp(c, ":max", 4)) v.group = TRI__KV_GROUP_MAX, v.set_group = true;
            else if (!strncmp(c, ":soft", 5)) v.group = TRI__KV_GROUP_SOFTMAX, v.set_group = true;
            else if (!strncmp(c, ":bound", 6) && c[6] >= '0' && c[6] <= '9') {  // layers A-B only
                int a = 0, b = 63;
                sscanf(c + 6, "%d-%d", &a, &b);
                for (int il = a; il <= b && il < 64; il++) v.bound_layers |= 1ull << il;
            } else if (!strncmp(c, ":bound", 6)) v.bound = true;
            else if (!strncmp(c, ":oracle", 7)) {  // every layer, or layers A-B (inclusive)
                int a = 0, b = 63;
                if (c[7] >= '0' && c[7] <= '9') sscanf(c + 7, "%d-%d", &a, &b);
                for (int il = a; il <= b && il < 64; il++) v.oracle |= 1ull << il;
            }
            else if (!strncmp(c, ":diag", 5)) v.diag = true;
            else if (!strncmp(c, ":index", 6)) v.index = true;
            else if (c[1] == 'w') v.window = atoi(c + 2);
            else if (c[1] == 'q') v.queries = atoi(c + 2);
            else if (c[1] == 'c') v.chunk = atoi(c + 2);
            else if (c[1] == 'r') v.refresh = atoi(c + 2);
            else if (c[1] == 'f') v.follow = atoi(c + 2);
            else {
                fprintf(stderr, "bench-table1: policy %s: unknown option at %s\n", s, c);
                exit(2);
            }
        }
    } else {
        fprintf(stderr, "bench-table1: unknown policy %s (streaming, h2o, ret[:...])\n", s);
        exit(2);
    }
    return v;
}

static tri__kv_policy_params params_of(const variant *v, int32_t budget, int32_t cap) {
    tri__kv_policy_params pp = tri__kv_policy_default_params(v->kind, cap);
    pp.budget = budget;
    pp.sink = 16;
    if (v->kind == TRI_KV_POLICY_RETRIEVAL) {
        if (v->chunk) pp.chunk = v->chunk;
        if (v->set_group) pp.group = v->group;
        if (v->window >= 0) pp.window = v->window;
        if (v->queries >= 0) pp.queries = v->queries;
        if (v->follow >= 0) pp.follow = v->follow;
        pp.refresh = v->refresh;
        if (v->bound) pp.bound = true;
        pp.oracle = v->oracle;
        if (v->index) pp.mass = false;
        pp.bound_layers = v->bound_layers;
        pp.budget -= pp.budget % pp.chunk;
    }
    return pp;
}

typedef struct rig {
    tri_model *m;
    tri__backend *be;
    tri__llama ll;
    int32_t V;
} rig;

static void policy_init(rig *r, tri__kv_policy *pol, const tri__kv_policy_params *pp, int32_t cap) {
    const tri_model_config *c = &r->m->config;
    if (tri__kv_policy_init(pol, pp, r->be, TRI_DTYPE_F16, c->n_layer, c->n_head, c->n_head_kv, c->head_dim, cap,
                            r->ll.n_batch))
        die("policy");
}

// The prompt ids[0 .. n) through a policy, leaving the last token's logits in `logits`. FULL and
// retrieval adopt base's rows (a full cache holding n - LAST positions) and run the last LAST
// tokens as one step (retrieval selects at its end); the others run the whole prompt.
static void prompt(rig *r, tri__kv_policy *pol, tri__kv_policy *base, const int32_t *ids, int32_t n, float *logits) {
    int32_t from = 0;
    if (pol->p.kind == TRI_KV_POLICY_FULL || pol->p.kind == TRI_KV_POLICY_RETRIEVAL) {
        from = n - LAST;
        if (tri__kv_policy_adopt(pol, base->kv, from)) die("adopt");
        tri__kv_policy_request_refresh(pol);
    }
    if (tri__llama_forward_policy(&r->ll, pol, ids + from, n - from, TRI_LOGITS_LAST, logits)) die("prompt");
}

static void base_prefill(rig *r, tri__kv_policy *base, const int32_t *ids, int32_t n, int32_t cap) {
    tri__kv_policy_params fp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, cap);
    policy_init(r, base, &fp, cap);
    if (tri__llama_forward_policy(&r->ll, base, ids, n - LAST, TRI_LOGITS_NONE, NULL)) die("prefill");
}

static int32_t *tokenize(const tri_model *m, const char *text, size_t len, bool special, int64_t *n) {
    if (tri_tokenize(m, text, len, false, special, NULL, 0, n)) die("tokenize");
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n + 1));
    if (!ids || tri_tokenize(m, text, len, false, special, ids, *n + 1, n)) die("tokenize");
    return ids;
}

static int parse_list(const char *s, double *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = strtod(s, (char **)&s);
        if (*s == ',') s++;
        else break;
    }
    return n;
}

// ---- diag: what a selection keeps of full attention's mass ----

// After v's selection at the prompt's end: per layer, summed over the KV heads, the share of full
// attention's mass (of the queries the selection read) on the positions its view holds, the share
// the oracle's view of the same structure holds, and, when [lo, hi) is a needle, the share on the
// needle's chunks and how many (KV head, needle chunk) pairs the selection and the oracle keep.
static void diagnose(tri__kv_policy *pol, const variant *v, int32_t lo, int32_t hi) {
    const int32_t L = pol->n_layer, H = pol->n_head_kv, C = pol->p.chunk, kmax = pol->p.budget / C;
    const int32_t window = tri__kv_policy_window_chunks(pol);
    int32_t cap = tri__kv_policy_selected_at(pol) / C + 1;
    double *mass = malloc(sizeof *mass * (size_t)cap);
    int32_t *ids = malloc(sizeof *ids * (size_t)kmax), *oids = malloc(sizeof *oids * (size_t)kmax);
    unsigned char *kept = malloc((size_t)cap), *oracle = malloc((size_t)cap);
    if (!mass || !ids || !oids || !kept || !oracle) die("diag scratch");
    const int32_t c_lo = lo / C, c_hi = hi > lo ? (hi - 1) / C + 1 : c_lo;
    double tot_sel = 0, tot_or = 0, tot = 0;
    printf("#diag %-18s layer  kept  oracle  needle-mass  needle-chunks kept/oracle (of %d)  last-128 kept/oracle\n",
           v->name, H * (c_hi - c_lo));
    for (int32_t il = 0; il < L; il++) {
        double sel = 0, orc = 0, all = 0, nm = 0;
        int32_t nk = 0, no = 0, near_k = 0, near_o = 0, chosen = 0;
        for (int32_t h = 0; h < H; h++) {
            double rest;
            int32_t nc = tri__kv_policy_chunk_mass(pol, il, h, mass, &rest);
            int32_t cnt = tri__kv_policy_selection(pol, il, h, ids, NULL);
            int32_t ocnt = nc > 0 ? tri__kv_policy_mass_choice(pol, mass, nc, oids) : -1;
            if (nc <= 0 || cnt < 0 || ocnt < 0) die("diag");
            memset(kept, 0, (size_t)nc);
            memset(oracle, 0, (size_t)nc);
            for (int32_t a = 0; a < cnt; a++) kept[ids[a]] = 1;
            for (int32_t a = 0; a < ocnt; a++) oracle[oids[a]] = 1;
            double sum = rest;
            sel += rest;
            orc += rest;
            for (int32_t c = 0; c < nc; c++) {
                sum += mass[c];
                sel += kept[c] ? mass[c] : 0;
                orc += oracle[c] ? mass[c] : 0;
            }
            all += sum;
            for (int32_t c = c_lo; c < c_hi && c < nc; c++) nm += mass[c], nk += kept[c], no += oracle[c];
            // how many of the chosen chunks (not the sink or the window) lie in the 128 tokens
            // before the window, by the selection and by the oracle
            const int32_t recent = nc <= kmax ? 1 : nc - window;
            for (int32_t c = recent - 128 / C > 1 ? recent - 128 / C : 1; c < recent; c++)
                near_k += kept[c], near_o += oracle[c];
            chosen += nc <= kmax ? 0 : kmax - 1 - window;
        }
        tot_sel += sel, tot_or += orc, tot += all;
        printf("#diag %-18s %5d %5.3f %7.3f %12.4f  %d/%d  %d/%d of %d\n", v->name, il, sel / all, orc / all, nm / all,
               nk, no, near_k, near_o, chosen);
    }
    printf("#diag %-18s   all %5.3f %7.3f\n", v->name, tot_sel / tot, tot_or / tot);
    free(mass);
    free(ids);
    free(oids);
    free(kept);
    free(oracle);
}

// ---- text: argmax agreement and acceptance over a teacher-forced continuation ----

static void run_text(rig *r, const int32_t *ids, int32_t ctx, int32_t npos, const double *budgets, int nb,
                     variant *vs, int nv) {
    const int32_t V = r->V, cap = ctx + npos;
    float *full = malloc(sizeof(float) * (size_t)npos * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V), *q = malloc(sizeof(double) * (size_t)V);
    tri__kv_policy base, pol;
    double t0 = now();
    base_prefill(r, &base, ids, ctx, cap);
    fprintf(stderr, "# prefill of %d tokens: %.1f s\n", ctx - LAST, now() - t0);
    tri__kv_policy_params fp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, cap);
    policy_init(r, &pol, &fp, cap);
    prompt(r, &pol, &base, ids, ctx, full);
    for (int32_t i = 0; i + 1 < npos; i++)
        if (tri__llama_forward_policy(&r->ll, &pol, ids + ctx + i, 1, TRI_LOGITS_LAST, full + (int64_t)(i + 1) * V))
            die("decode");
    tri__kv_policy_free(&pol);
    printf("%-24s %7s %8s %10s\n", "policy", "budget", "top1", "accept@0.6");
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < nv; k++) {
            tri__kv_policy_params pp = params_of(&vs[k], (int32_t)budgets[b], cap);
            policy_init(r, &pol, &pp, cap);
            double top1 = 0, acc = 0;
            for (int32_t i = 0; i < npos; i++) {
                if (i == 0) {
                    prompt(r, &pol, &base, ids, ctx, got);
                    if (vs[k].diag) diagnose(&pol, &vs[k], 0, 0);
                }
                else if (tri__llama_forward_policy(&r->ll, &pol, ids + ctx + i - 1, 1, TRI_LOGITS_LAST, got))
                    die("decode");
                const float *lf = full + (int64_t)i * V;
                top1 += bench_argmax(lf, V) == bench_argmax(got, V);
                softmax_t(lf, p, V, 0.6);
                softmax_t(got, q, V, 0.6);
                for (int32_t x = 0; x < V; x++) acc += fmin(p[x], q[x]);
            }
            tri__kv_policy_free(&pol);
            printf("%-24s %7d %8.4f %10.4f\n", vs[k].name, pp.budget, top1 / npos, acc / npos);
            fflush(stdout);
        }
    tri__kv_policy_free(&base);
    free(full);
    free(got);
    free(p);
    free(q);
}

// ---- needle: is the number found ----

static bool answer(rig *r, tri__kv_policy *pol, tri__kv_policy *base, const int32_t *ids, int32_t n, const char *want,
                   char *out, size_t cap_out, const variant *v, int32_t lo, int32_t hi) {
    float *l = malloc(sizeof(float) * (size_t)r->V);
    int32_t toks[ANSWER];
    prompt(r, pol, base, ids, n, l);
    if (v && v->diag) diagnose(pol, v, lo, hi);
    int32_t k = 0;
    for (; k < ANSWER; k++) {
        toks[k] = bench_argmax(l, r->V);
        if (toks[k] == tri_token_eos(r->m) || tri_token_is_special(r->m, toks[k])) break;
        if (k + 1 < ANSWER && tri__llama_forward_policy(&r->ll, pol, &toks[k], 1, TRI_LOGITS_LAST, l)) die("decode");
    }
    size_t len = 0;
    if (tri_detokenize(r->m, toks, k, false, out, cap_out, &len)) snprintf(out, cap_out, "?");
    for (char *c = out; *c; c++)
        if (*c == '\n') *c = ' ';
    free(l);
    return strstr(out, want) != NULL;
}

static void run_needle(rig *r, const char *text, size_t text_len, const double *ctxs, int nc, const double *depths,
                       int nd, int32_t div, variant *vs, int nv) {
    const char *seed_env = getenv("TRI_NEEDLE_SEED");  // other keys for the same prompts (default 0)
    const int seed = seed_env ? atoi(seed_env) : 0;
    int64_t n_hay, n_pre, n_suf;
    int32_t *hay = tokenize(r->m, text, text_len, false, &n_hay);
    const char *pre = "<|im_start|>user\n";
    const char *suf = "\nWhat is the special magic number mentioned in the text above? Answer with the number."
                      "<|im_end|>\n<|im_start|>assistant\nThe special magic number is";
    int32_t *pre_ids = tokenize(r->m, pre, strlen(pre), true, &n_pre);
    int32_t *suf_ids = tokenize(r->m, suf, strlen(suf), true, &n_suf);
    printf("%-24s %6s %6s %7s %4s  %s\n", "policy", "ctx", "depth", "budget", "hit", "answer");
    int *hits = calloc((size_t)nv + 1, sizeof *hits), *full_hits = calloc((size_t)nv + 1, sizeof *full_hits);
    int cases = 0;
    for (int ci = 0; ci < nc; ci++)
        for (int di = 0; di < nd; di++) {
            const int32_t ctx = (int32_t)ctxs[ci];
            char needle[128], want[32];
            snprintf(want, sizeof want, "%d", 1000 + (int)((ci * 7919 + di * 104729 + 4243 + seed * 3571) % 9000));
            snprintf(needle, sizeof needle, "\n\nThe special magic number is %s. Remember it: %s.\n\n", want, want);
            int64_t n_needle;
            int32_t *nd_ids = tokenize(r->m, needle, strlen(needle), false, &n_needle);
            int64_t body = ctx - n_pre - n_suf - n_needle;
            if (body <= 0 || body > n_hay) die("text too short for the context");
            int32_t *ids = malloc(sizeof *ids * (size_t)ctx);
            int64_t at = (int64_t)(depths[di] * (double)body), o = 0;
            memcpy(ids + o, pre_ids, sizeof *ids * (size_t)n_pre), o += n_pre;
            memcpy(ids + o, hay, sizeof *ids * (size_t)at), o += at;
            memcpy(ids + o, nd_ids, sizeof *ids * (size_t)n_needle), o += n_needle;
            memcpy(ids + o, hay + at, sizeof *ids * (size_t)(body - at)), o += body - at;
            memcpy(ids + o, suf_ids, sizeof *ids * (size_t)n_suf), o += n_suf;
            const int32_t cap = ctx + ANSWER, budget = ctx / div;
            tri__kv_policy base, pol;
            double t0 = now();
            base_prefill(r, &base, ids, ctx, cap);
            fprintf(stderr, "# ctx %d depth %.2f: prefill %.1f s\n", ctx, depths[di], now() - t0);
            char out[512];
            tri__kv_policy_params fp = tri__kv_policy_default_params(TRI_KV_POLICY_FULL, cap);
            policy_init(r, &pol, &fp, cap);
            bool fh = answer(r, &pol, &base, ids, ctx, want, out, sizeof out, NULL, 0, 0);
            tri__kv_policy_free(&pol);
            printf("%-24s %6d %6.2f %7s %4s  %s\n", "full", ctx, depths[di], "-", fh ? "yes" : "no", out);
            hits[nv] += fh;
            cases++;
            for (int k = 0; k < nv; k++) {
                tri__kv_policy_params pp = params_of(&vs[k], budget, cap);
                policy_init(r, &pol, &pp, cap);
                const int32_t lo = (int32_t)(n_pre + at);
                bool h = answer(r, &pol, &base, ids, ctx, want, out, sizeof out, &vs[k], lo, lo + (int32_t)n_needle);
                tri__kv_policy_free(&pol);
                hits[k] += h;
                full_hits[k] += h && fh;
                printf("%-24s %6d %6.2f %7d %4s  %s\n", vs[k].name, ctx, depths[di], pp.budget, h ? "yes" : "no", out);
                fflush(stdout);
            }
            tri__kv_policy_free(&base);
            free(ids);
            free(nd_ids);
        }
    printf("# hits of %d prompts: full %d", cases, hits[nv]);
    for (int k = 0; k < nv; k++) printf(", %s %d (%d where full hits)", vs[k].name, hits[k], full_hits[k]);
    printf("\n");
    free(hits);
    free(full_hits);
    free(hay);
    free(pre_ids);
    free(suf_ids);
}

// TEXT "synthetic": sentences drawn from small word lists by a fixed generator (tests/test-needle.c
// builds its haystack the same way), about n bytes.
static char *synthetic_text(size_t n) {
    static const char *const who[] = {"The old farmer", "A young pilot", "The tired baker", "My neighbour",
                                      "The quiet student", "A travelling doctor", "The harbour master", "Our teacher"};
    static const char *const did[] = {"painted", "sold", "repaired", "borrowed", "carried", "counted", "found",
                                      "forgot"};
    static const char *const what[] = {"a red boat", "seven lanterns", "the garden fence", "a wooden chair",
                                       "two baskets of apples", "the church bell", "an old map", "a blue kettle"};
    static const char *const when[] = {"on Monday", "before dawn", "after the storm", "in the spring",
                                       "last winter", "at noon", "during the fair", "by the river"};
    char *t = malloc(n + 256);
    size_t o = 0;
    uint32_t s = 12345;
    while (o < n) {
        uint32_t r[4];
        for (int i = 0; i < 4; i++) r[i] = (s = s * 1103515245u + 12345u) >> 16;
        o += (size_t)snprintf(t + o, 256, "%s %s %s %s. ", who[r[0] % 8], did[r[1] % 8], what[r[2] % 8], when[r[3] % 8]);
    }
    return t;
}

int main(int argc, char **argv) {
    if (argc < 8 || (strcmp(argv[3], "text") && strcmp(argv[3], "needle"))) {
        fprintf(stderr, "usage: bench-table1 MODEL TEXT text CONTEXT POSITIONS BUDGETS POLICIES [threads]\n"
                        "       bench-table1 MODEL TEXT needle CONTEXTS DEPTHS DIV POLICIES [threads]\n");
        return 2;
    }
    int32_t threads = argc > 8 ? atoi(argv[8]) : 0;
    char *text;
    long len;
    if (!strcmp(argv[2], "synthetic")) {
        text = synthetic_text(200000);
        len = (long)strlen(text);
    } else {
        FILE *f = fopen(argv[2], "rb");
        if (!f) {
            perror(argv[2]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        len = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc((size_t)len + 1);
        if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
            fprintf(stderr, "%s: read failed\n", argv[2]);
            return 1;
        }
        text[len] = 0;
        fclose(f);
    }
    variant vs[32];
    int nv = 0;
    char *list = strdup(argv[7]);
    for (char *tok = strtok(list, ","); tok && nv < 32; tok = strtok(NULL, ",")) vs[nv++] = parse_variant(tok);
    rig r;
    if (tri_model_load(argv[1], NULL, &r.m)) die(argv[1]);
    if (tri__backend_cpu_create(threads, TRI_CPU_SIMD_AUTO, &r.be)) die("backend");
    if (tri__llama_init(&r.ll, r.m, r.be, 128)) die("forward pass");
    r.V = r.m->config.n_vocab;
    const tri_model_config *c = &r.m->config;
    printf("# bench-table1 %s: %s, %d layers, %d/%d heads, text %s, f16 cache, %s, %d threads\n", argv[3], argv[1],
           c->n_layer, c->n_head, c->n_head_kv, argv[2], tri__cpu_simd_name(tri__cpu_simd_detect()), r.be->n_threads);
    if (!strcmp(argv[3], "text")) {
        double budgets[16];
        int nb = parse_list(argv[6], budgets, 16);
        int64_t n;
        int32_t ctx = atoi(argv[4]), npos = atoi(argv[5]);
        int32_t *ids = tokenize(r.m, text, (size_t)len, false, &n);
        if (n < ctx + npos) die("text too short");
        run_text(&r, ids, ctx, npos, budgets, nb, vs, nv);
        free(ids);
    } else {
        double ctxs[16], depths[16];
        int nc = parse_list(argv[4], ctxs, 16), nd = parse_list(argv[5], depths, 16);
        run_needle(&r, text, (size_t)len, ctxs, nc, depths, nd, atoi(argv[6]), vs, nv);
    }
    free(list);
    free(text);
    tri__llama_free(&r.ll);
    tri__backend_free(r.be);
    tri_model_free(r.m);
    return 0;
}
