// cli-chat.c - `offload-run chat`: a conversation with a model, one user turn per input line.
//
// Each turn renders the whole conversation with the model's chat template and prefills only what
// the session's cache does not already hold: the tokens after the longest common prefix of the
// new rendering and the tokens in the cache (the previous turns, the answers as generated). The
// answer streams to stdout; the figures of each turn go to stderr, and with --json to one JSON
// object at the end.
//
// Input: on a terminal, lines are edited with libedit (history kept in ~/.offload_run_history) when
// the build has it; otherwise, and whenever stdin is not a terminal, lines are read as they come.
// A line ending in a backslash continues on the next; a line of three double quotes opens a block
// that the next such line closes. A line starting with '/' is a command (/help lists them). When
// the conversation no longer fits the context, the oldest turns are dropped with a note.
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <json-c/json.h>
#include <unistd.h>

#ifdef TRI_CLI_LIBEDIT
#include <editline/readline.h>
#endif

#include "cli.h"

static const char me[] = "offload-run chat";  // the command, in error messages

static void usage(FILE *f) {
    fputs("usage: offload-run chat -m MODEL [options]\n"
          "\n"
          "Talks with a model: each line read from stdin is a user turn, answered on stdout. The\n"
          "conversation is rendered with the model's own chat template; the session's cache is kept\n"
          "between turns, so each turn prefills only its new tokens. Ctrl-C stops the answer being\n"
          "written; Ctrl-C at the prompt, /bye, or the end of the input ends the program. Works with\n"
          "stdin not a terminal (one turn per line, for scripts). "
#ifdef TRI_CLI_LIBEDIT
          "On a terminal lines are edited\n"
          "with history (libedit, ~/.offload_run_history). "
#else
          "Lines are read as typed: this\n"
          "build has no line editing (no libedit). "
#endif
          "A line ending in '\\' continues on the next\n"
          "one; a line \"\"\" opens a block of lines that the next \"\"\" line closes. When the\n"
          "conversation no longer fits the context, its oldest turns are dropped (with a note on\n"
          "stderr).\n"
          "\n"
          "commands: /help, /clear, /system [TEXT], /load FILE, /save FILE, /set [KEY VALUE], /bye\n"
          "(/help describes them; '//' at the start of a line sends a line starting with '/')\n"
          "\n"
          "  -m, --model PATH     .gguf file or HF checkpoint directory\n"
          "      --system TEXT    the system message\n"
          "      --chat-format F  chatml, llama2, llama3, mistral, phi3 or gemma instead of the\n"
          "                       model's template (for a template the interpreter refuses, or\n"
          "                       none); jinja: the template with no fallback\n"
          "  -n, --n-predict N    tokens per answer at most (default 512; 0: until the model ends\n"
          "                       its turn or the context is full)\n"
          "      --stop STR       end an answer once it contains STR, which is not printed\n"
          "                       (repeatable, at most 16)\n"
          "      --ignore-eos     do not end an answer at the model's end-of-sequence and\n"
          "                       end-of-turn tokens\n"
          "      --ctx N          context of the whole conversation in tokens (default 4096)\n"
          "  -t, --threads N      CPU threads (default: one per core)\n"
          "      --device D       cpu, cuda or cuda:N (default: the first GPU when there is one)\n"
          "      --batch N        prompt tokens per prefill step (default 128)\n"
          "      --kv-type T      f16 (default), f32, q8_0 or q4_0 KV cache\n"
          "      --prompt-cache FILE  a conversation's start on disk: a turn (or /load) loads the\n"
          "                       prefix it shares with the file when that beats the cache; the\n"
          "                       file is written after the first prefill when missing or stale\n"
          "      --json FILE      the figures of every turn as one JSON object to FILE at the end\n"
          "                       ('-': stdout, after the last answer)\n"
          "  -h, --help           this help\n"
          "\n",
          f);
    tri_cli_sampling_usage(f, true);
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

// ---- --prompt-cache ----

typedef struct pcache {
    const char *path;  // NULL without --prompt-cache
    int32_t *tokens;   // what the file holds
    int32_t n;         // 0: missing or stale, written after the next prefill
} pcache;

// At start: the file checked against the model (an empty prompt reuses nothing) and its tokens
// read. False where the session cannot have a prompt cache.
static bool pcache_start(pcache *pc, tri_session *s) {
    tri_status st = tri_session_load_prompt(s, pc->path, NULL, 0, NULL);
    if (st == TRI_STATUS_UNSUPPORTED) {
        fprintf(stderr, "offload-run chat: --prompt-cache: %s\n", tri_last_error());
        return false;
    }
    if (!st) st = tri_prompt_cache_tokens(pc->path, &pc->tokens, &pc->n);
    if (st == TRI_STATUS_NOT_FOUND)
        fprintf(stderr, "prompt cache: %s does not exist yet; it is written after the first prefill\n", pc->path);
    else if (st)
        fprintf(stderr, "prompt cache: %s (%s); it is written again after the first prefill\n", tri_last_error(),
                tri_status_str(st));
    else
        fprintf(stderr, "prompt cache: %s holds %d tokens\n", pc->path, pc->n);
    return true;
}

// Loads the prefix ids[0 .. n) shares with the file when it is longer than keep, the prefix the
// cache holds. The tokens the cache holds afterwards.
static int32_t pcache_load(pcache *pc, tri_session *s, const int32_t *ids, int32_t n, int32_t keep) {
    int32_t shared = 0;
    while (shared < pc->n && shared < n && pc->tokens[shared] == ids[shared]) shared++;
    if (!pc->path || shared <= keep || keep >= n - 1) return keep;
    tri_prompt_cache_stats cs;
    tri_status st = tri_session_load_prompt(s, pc->path, ids, n, &cs);
    if (!st) {
        fprintf(stderr, "prompt cache: reused %d of %d tokens from %s (%.3f s)\n", cs.n_tokens, n, pc->path,
                cs.seconds);
        return cs.n_tokens;
    }
    fprintf(stderr, "prompt cache: %s (%s); ignored\n", tri_last_error(), tri_status_str(st));
    if (st == TRI_STATUS_NOT_FOUND || st == TRI_STATUS_BAD_FORMAT || st == TRI_STATUS_IO) pc->n = 0;
    return 0;  // the load emptied the cache
}

// The cache holds ids[0 .. n): written when the file is missing or stale.
static void pcache_save(pcache *pc, tri_session *s, const int32_t *ids, int32_t n) {
    if (!pc->path || pc->n > 0 || n < 1) return;
    tri_prompt_cache_stats cs;
    tri_status st = tri_session_save_prompt(s, pc->path, ids, n, &cs);
    int32_t *t = st ? NULL : malloc((size_t)n * sizeof *t);
    if (st || !t) {
        fprintf(stderr, "prompt cache: %s; not saved\n", st ? tri_last_error() : "out of memory");
        return;
    }
    memcpy(t, ids, (size_t)n * sizeof *t);
    free(pc->tokens);
    pc->tokens = t;
    pc->n = n;
    fprintf(stderr, "prompt cache: saved %d tokens to %s (%.1f MB in %.3f s)\n", n, pc->path, (double)cs.bytes / 1e6,
            cs.seconds);
}

typedef struct prefill_ctx {
    int last;  // the decile reported last
    pcache *pc;
    tri_session *s;
    const int32_t *ids;  // the turn's tokens, saved at the prefill's end
    int32_t n;
} prefill_ctx;

static bool on_prefill(int64_t done, int64_t total, void *user) {
    prefill_ctx *p = user;
    if (interrupted) return false;
    int decile = (int)(10 * done / total);
    if (decile > p->last && done < total)
        fprintf(stderr, "prefill: %lld / %lld tokens\n", (long long)done, (long long)total);
    p->last = decile;
    if (done == total) pcache_save(p->pc, p->s, p->ids, p->n);
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

// Drops messages [from, from + n) (their contents freed).
static void conv_drop(conv *c, size_t from, size_t n) {
    for (size_t i = from; i < from + n; i++) free((char *)c->msgs[i].content);
    memmove(c->msgs + from, c->msgs + from + n, (c->n - from - n) * sizeof *c->msgs);
    c->n -= n;
}

// Sets the system message (first in the conversation), or removes it when text is NULL.
static bool conv_set_system(conv *c, const char *text) {
    bool has = c->n > 0 && strcmp(c->msgs[0].role, "system") == 0;
    if (has) conv_drop(c, 0, 1);
    if (!text) return true;
    if (!conv_add(c, "system", text, strlen(text))) return false;
    tri_chat_message m = c->msgs[c->n - 1];  // to the front
    memmove(c->msgs + 1, c->msgs, (c->n - 1) * sizeof *c->msgs);
    c->msgs[0] = m;
    return true;
}

// ---- input: lines, continuations, blocks ----

typedef struct input {
    bool tty;          // stdin is a terminal: prompts, and libedit when built with it
    bool edit;         // lines come from libedit's readline
    char *buf;         // getline's buffer
    size_t cap;
    char *history;     // libedit's history file, malloc'd; NULL: none
    bool ctrl_c;       // the last line was ended by Ctrl-C: another one ends the chat
} input;

// Ctrl-C at a terminal's prompt: the first clears the line being typed (the terminal drops it;
// libedit's readline returns) and says so, a second in a row ends the chat. True: end it.
static bool ctrl_c_ends(input *in) {
    interrupted = 0;
    if (in->ctrl_c) {
        fputc('\n', stderr);
        return true;
    }
    in->ctrl_c = true;
    fputs("^C (the line is cleared; Ctrl-C again or /bye ends the chat)\n", stderr);
    return false;
}

// One line without its line ending, malloc'd; NULL at the end of the input, or on Ctrl-C twice at
// a terminal (once when stdin is not one).
static char *read_line(input *in, const char *prompt) {
#ifdef TRI_CLI_LIBEDIT
    while (in->edit) {
        char *l = readline(prompt);
        if (interrupted) {
            free(l);
            if (ctrl_c_ends(in)) return NULL;
            continue;
        }
        in->ctrl_c = false;
        if (!l) fputc('\n', stderr);  // Ctrl-D: end the line the prompt is on
        return l;
    }
#endif
    ssize_t got;
    for (;;) {
        if (in->tty) fputs(prompt, stderr);
        errno = 0;
        got = getline(&in->buf, &in->cap, stdin);
        if (interrupted && in->tty) {
            clearerr(stdin);
            if (ctrl_c_ends(in)) return NULL;
            continue;
        }
        in->ctrl_c = false;
        break;
    }
    if (got < 0 || interrupted) {
        if (in->tty) fputc('\n', stderr);
        return NULL;
    }
    while (got > 0 && (in->buf[got - 1] == '\n' || in->buf[got - 1] == '\r')) in->buf[--got] = 0;
    return strdup(in->buf);
}

// A growing string.
typedef struct text {
    char *s;
    size_t n, cap;
} text;

static bool text_add(text *t, const char *s, size_t len) {
    if (t->n + len + 1 > t->cap) {
        size_t cap = 2 * (t->n + len + 1);
        char *b = realloc(t->s, cap);
        if (!b) return false;
        t->s = b;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, len);
    t->n += len;
    t->s[t->n] = 0;
    return true;
}

static bool is_fence(const char *l) {
    while (*l == ' ' || *l == '\t') l++;
    if (strncmp(l, "\"\"\"", 3) != 0) return false;
    for (l += 3; *l == ' ' || *l == '\t'; l++) {}
    return *l == 0;
}

// One message: a line, lines joined by trailing backslashes, or a """ block. *out is malloc'd;
// false at the end of the input (or Ctrl-C). Errors of memory end the input too (reported).
static bool read_message(input *in, char **out) {
    *out = NULL;
    char *l = read_line(in, "> ");
    if (!l) return false;
    text t = {0};
    bool ok = true;
    if (is_fence(l)) {  // a block: every line up to the closing fence, as typed
        bool first = true;
        for (;;) {
            free(l);
            if (!(l = read_line(in, "... "))) break;  // an unclosed block ends with the input
            if (is_fence(l)) break;
            ok = (first || text_add(&t, "\n", 1)) && text_add(&t, l, strlen(l));
            first = false;
            if (!ok) break;
        }
    } else {
        for (;;) {
            size_t n = strlen(l);
            bool more = n > 0 && l[n - 1] == '\\';
            ok = text_add(&t, l, more ? n - 1 : n) && (!more || text_add(&t, "\n", 1));
            if (!ok || !more) break;
            free(l);
            if (!(l = read_line(in, "... "))) break;
        }
    }
    free(l);
    if (!ok) {
        fprintf(stderr, "offload-run chat: out of memory\n");
        free(t.s);
        return false;
    }
    if (!t.s && !(t.s = strdup(""))) return false;
#ifdef TRI_CLI_LIBEDIT
    if (in->edit && t.n > 0) add_history(t.s);
#endif
    *out = t.s;
    return true;
}

// ---- commands ----

static void print_help(void) {
    fputs("commands:\n"
          "  /help              this list\n"
          "  /clear             forget the conversation (the system message stays)\n"
          "  /system [TEXT]     set the system message; without TEXT, remove it\n"
          "  /load FILE         put a document into the conversation: it opens your next message\n"
          "                     (prefilled now, so the question that follows is quick)\n"
          "  /save FILE         write the conversation to FILE as JSON ({\"messages\": [{\"role\", \"content\"}]})\n"
          "  /set [KEY VALUE]   change a sampling setting: temp, top-k, top-p, min-p, repeat-penalty,\n"
          "                     presence-penalty, frequency-penalty, repeat-last-n, seed, or n-predict;\n"
          "                     without arguments, show them\n"
          "  /bye               end the chat (also /exit, /quit, Ctrl-D)\n"
          "a line ending in '\\' continues on the next; a line \"\"\" opens a block the next \"\"\" closes;\n"
          "'//' at the start sends a line that starts with '/'\n",
          stderr);
}

// Reads a whole file into a NUL-terminated buffer (*len bytes); NULL after printing the error.
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "offload-run chat: /load %s: %s\n", path, strerror(errno));
        return NULL;
    }
    text t = {0};
    char buf[1 << 14];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = text_add(&t, buf, n);
    bool err = ferror(f);
    fclose(f);
    if (!ok || err) {
        fprintf(stderr, "offload-run chat: /load %s: %s\n", path, ok ? "read error" : "out of memory");
        free(t.s);
        return NULL;
    }
    if (!t.s && !(t.s = strdup(""))) return NULL;
    *len = t.n;
    return t.s;
}

static bool save_transcript(const char *path, const conv *c) {
    if (!tri_cli_may_replace("offload-run chat", "/save", path, TRI_CLI_TRANSCRIPT_PREFIX)) return false;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "offload-run chat: /save %s: %s\n", path, strerror(errno));
        return false;
    }
    fputs(TRI_CLI_TRANSCRIPT_PREFIX, f);
    for (size_t i = 0; i < c->n; i++) {
        fprintf(f, "%s\n  {\"role\": \"%s\", \"content\": ", i ? "," : "", c->msgs[i].role);
        tri_cli_json_str(f, c->msgs[i].content, strlen(c->msgs[i].content));
        fputc('}', f);
    }
    fputs("\n]}\n", f);
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "offload-run chat: /save %s: write error\n", path);
    return ok;
}

static void print_settings(const tri_cli_sampling *smp, long n_predict) {
    char desc[256];
    tri_cli_sampling_describe(smp, desc, sizeof desc);
    fprintf(stderr, "sampling: %s; n-predict %ld\n", desc, n_predict);
}

// ---- the cache ----

// Runs ids[keep..n) after the first keep tokens of the cache (truncating it there), in pieces of
// n_batch, for a document that the next message starts with. On success the cache holds ids[0..n).
// A prefill of more than one piece reports its progress on stderr, as a turn's does.
static tri_status prefill_ids(tri_session *s, const int32_t *ids, int32_t keep, int32_t n, int32_t n_batch) {
    tri_status st = tri_session_truncate(s, keep);
    int last = 0;
    for (int32_t done = keep; !st && done < n && !interrupted;) {
        int32_t step = n - done < n_batch ? n - done : n_batch;
        st = tri_session_eval(s, ids + done, step, false);
        done += step;
        int decile = (int)(10LL * (done - keep) / (n - keep));
        if (!st && decile > last && done < n) fprintf(stderr, "prefill: %d / %d tokens\n", done - keep, n - keep);
        last = decile;
    }
    return st;
}

// A chat saved by /save: {"messages": [{"role", "content"}, ...]} with roles system, user and
// assistant, put into c (emptied first). False after printing what is wrong with path.
static bool load_transcript(const char *path, const char *body, conv *c) {
    struct json_object *root = json_tokener_parse(body), *msgs;
    bool ok = root && json_object_object_get_ex(root, "messages", &msgs) && json_object_is_type(msgs, json_type_array);
    if (!ok) fprintf(stderr, "offload-run chat: /load %s: not a saved chat ({\"messages\": [...]})\n", path);
    size_t n = ok ? json_object_array_length(msgs) : 0;
    for (size_t i = 0; ok && i < n; i++) {
        struct json_object *m = json_object_array_get_idx(msgs, i), *role, *content;
        const char *r = m && json_object_object_get_ex(m, "role", &role) ? json_object_get_string(role) : NULL;
        static const char *const roles[] = {"system", "user", "assistant"};
        const char *known = NULL;
        for (int k = 0; r && k < 3; k++)
            if (strcmp(r, roles[k]) == 0) known = roles[k];
        if (!known || (i > 0 && known == roles[0]) || !json_object_object_get_ex(m, "content", &content) ||
            !json_object_is_type(content, json_type_string)) {
            fprintf(stderr,
                    "offload-run chat: /load %s: message %zu: want a role (system first, user or assistant) and "
                    "a string content\n",
                    path, i);
            ok = false;
        }
    }
    if (ok) {
        while (c->n) conv_drop(c, 0, c->n);
        for (size_t i = 0; ok && i < n; i++) {
            struct json_object *m = json_object_array_get_idx(msgs, i), *role, *content;
            json_object_object_get_ex(m, "role", &role);
            json_object_object_get_ex(m, "content", &content);
            const char *r = json_object_get_string(role);
            r = strcmp(r, "system") == 0 ? "system" : strcmp(r, "user") == 0 ? "user" : "assistant";
            ok = conv_add(c, r, json_object_get_string(content), (size_t)json_object_get_string_len(content));
            if (!ok) fprintf(stderr, "offload-run chat: /load %s: out of memory\n", path);
        }
    }
    json_object_put(root);
    return ok;
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
    enum { OPT_SYSTEM = 256, OPT_CHAT_FORMAT, OPT_STOP, OPT_CTX,
           OPT_DEVICE, OPT_BATCH, OPT_KV, OPT_JSON, OPT_IGNORE_EOS, OPT_PROMPT_CACHE };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},        {"system", required_argument, NULL, OPT_SYSTEM},
        {"chat-format", required_argument, NULL, OPT_CHAT_FORMAT},
        {"n-predict", required_argument, NULL, 'n'},   {"stop", required_argument, NULL, OPT_STOP},
        TRI_CLI_SAMPLING_OPTIONS,
        {"ctx", required_argument, NULL, OPT_CTX},     {"threads", required_argument, NULL, 't'},
        {"device", required_argument, NULL, OPT_DEVICE}, {"batch", required_argument, NULL, OPT_BATCH},
        {"kv-type", required_argument, NULL, OPT_KV},  {"json", required_argument, NULL, OPT_JSON},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"prompt-cache", required_argument, NULL, OPT_PROMPT_CACHE},
        {"help", no_argument, NULL, 'h'},              {0},
    };
    const char *model_path = NULL, *system_msg = NULL, *json_path = NULL;
    pcache pc = {0};
    const char *stops[16];
    int32_t n_stops = 0;
    tri_chat_format format = TRI_CHAT_FORMAT_AUTO;
    long n_predict = 512, ctx = 4096, threads = 0, batch = 0;
    tri_generate_params gp = tri_generate_default_params();
    tri_session_params sp = tri_session_default_params();
    tri_cli_sampling smp = {0};
    int c;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        bool ok = true, sampling;
        if (!tri_cli_sampling_option(me, c, optarg, &smp, &sampling)) return 2;
        if (sampling) continue;
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_SYSTEM: system_msg = optarg; break;
        case OPT_CHAT_FORMAT:
            if (tri_chat_format_from_name(optarg, &format) != TRI_STATUS_OK || format == TRI_CHAT_FORMAT_AUTO) {
                fprintf(stderr, "offload-run chat: --chat-format '%s': want chatml, llama2, llama3, mistral, phi3, "
                        "gemma or jinja\n", optarg);
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
        case OPT_CTX: ok = tri_cli_parse_long(me, "--ctx", optarg, 16, INT32_MAX, &ctx); break;
        case 't': ok = tri_cli_parse_long(me, "--threads", optarg, 1, 4096, &threads); break;
        case OPT_DEVICE: ok = tri_cli_parse_device("offload-run chat", optarg, &sp); break;
        case OPT_BATCH: ok = tri_cli_parse_long(me, "--batch", optarg, 1, 65536, &batch); break;
        case OPT_KV:
            ok = tri_cli_parse_kv_type(me, "--kv-type", optarg, &sp.kv_type);
            break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_IGNORE_EOS: gp.stop_at_eos = false; break;
        case OPT_PROMPT_CACHE: pc.path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return tri_cli_see_help();
        }
        if (!ok) return 2;
    }
    if (!model_path || optind != argc) {
        fprintf(stderr, "offload-run chat: %s\n", !model_path ? "-m MODEL is required" : "unexpected argument");
        return tri_cli_see_help();
    }
    tri_cli_sampling_resolve(&smp, true);

    double t_start = tri_cli_now();
    tri_model *model = tri_cli_load_model(model_path);
    if (!model) return 1;
    double load_s = tri_cli_now() - t_start;
    int rc = 1;
    tri_session *session = NULL;
    conv cv = {0}, full = {0};  // what the context holds; the whole chat (what /save writes)
    answer ans = {0};
    int32_t *ctx_tokens = NULL, n_ctx_tokens = 0;  // what the cache holds (its first n_past)
    int32_t *ids = NULL;
    char *rendered = NULL, *line = NULL;
    char *doc = NULL;  // a document /load put before the next message
    size_t doc_len = 0;
    input in = {0};
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
    const int32_t n_ctx = tri_session_n_ctx(session);
    fprintf(stderr, "device: %s, context %d tokens\n", tri_session_device(session), n_ctx);
    print_settings(&smp, n_predict);
    if (pc.path && !pcache_start(&pc, session)) goto done;
    if (json_path && !(json_file = tri_cli_json_open("offload-run chat", json_path))) goto done;
    if (system_msg && (!conv_add(&cv, "system", system_msg, strlen(system_msg)) ||
                       !conv_add(&full, "system", system_msg, strlen(system_msg))))
        goto oom;

    int32_t stop_ids[16], n_stop_ids = 0;
    if (gp.stop_at_eos && tri_chat_stop_tokens(model, stop_ids, 16, &n_stop_ids) == TRI_STATUS_OK) {
        gp.stop_tokens = stop_ids;
        gp.n_stop_tokens = n_stop_ids < 16 ? n_stop_ids : 16;
    }
    gp.stop = stops;
    gp.n_stop = n_stops;
    gp.on_text = on_text;
    gp.text_user = &ans;
    prefill_ctx pf = {.pc = &pc, .s = session};
    gp.on_prefill = on_prefill;
    gp.user = &pf;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;  // no SA_RESTART: a read at the prompt returns
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    in.tty = isatty(STDIN_FILENO);
#ifdef TRI_CLI_LIBEDIT
    if (in.tty) {
        in.edit = true;
        rl_catch_signals = 0;  // Ctrl-C at the prompt reaches on_sigint: read_line clears the line
        using_history();
        const char *home = getenv("HOME");
        if (home && home[0] && (in.history = malloc(strlen(home) + 32))) {
            sprintf(in.history, "%s/.offload_run_history", home);
            read_history(in.history);
        }
    }
#endif
    if (in.tty) fputs("/help lists the commands\n", stderr);
    else tri_cli_wait_note(STDIN_FILENO, "stdin", "the first turn", "one turn a line, to the end of the input");

    for (;;) {
        free(line);
        if (!read_message(&in, &line)) break;
        if (interrupted) break;
        size_t got = strlen(line);
        if (got == 0) continue;

        // ---- commands ----
        if (line[0] == '/' && line[1] != '/') {
            char *cmd = line + 1, *arg = cmd + strcspn(cmd, " \t");
            if (*arg) *arg++ = 0;
            arg += strspn(arg, " \t");
            size_t al = strlen(arg);
            while (al > 0 && (arg[al - 1] == ' ' || arg[al - 1] == '\t')) arg[--al] = 0;
            if (strcmp(cmd, "bye") == 0 || strcmp(cmd, "exit") == 0 || strcmp(cmd, "quit") == 0) break;
            if (strcmp(cmd, "help") == 0 || strcmp(cmd, "?") == 0) {
                print_help();
            } else if (strcmp(cmd, "clear") == 0) {
                size_t first = cv.n > 0 && strcmp(cv.msgs[0].role, "system") == 0;
                conv_drop(&cv, first, cv.n - first);
                conv_drop(&full, first, full.n - first);
                free(doc);
                doc = NULL;
                fputs("the conversation is cleared\n", stderr);
            } else if (strcmp(cmd, "system") == 0) {
                if (!conv_set_system(&cv, al ? arg : NULL) || !conv_set_system(&full, al ? arg : NULL)) goto oom;
                fputs(al ? "system message set\n" : "system message removed\n", stderr);
            } else if (strcmp(cmd, "set") == 0) {
                char *key = arg, *val = arg + strcspn(arg, " \t");
                if (*val) *val++ = 0;
                val += strspn(val, " \t");
                if (!key[0]) {
                    print_settings(&smp, n_predict);
                } else if (!val[0]) {
                    fprintf(stderr, "offload-run chat: /set %s: want a value (/set KEY VALUE)\n", key);
                } else if (strcmp(key, "n-predict") == 0 || strcmp(key, "n_predict") == 0) {
                    if (tri_cli_parse_long(me, "/set n-predict", val, 0, INT32_MAX, &n_predict))
                        print_settings(&smp, n_predict);
                } else if (tri_cli_sampling_set(me, key, val, &smp)) {
                    print_settings(&smp, n_predict);
                }
            } else if (strcmp(cmd, "save") == 0) {
                if (!al) fputs("offload-run chat: /save: want a file name (/save FILE)\n", stderr);
                else if (save_transcript(arg, &full))  // the whole chat, turns dropped for space too
                    fprintf(stderr, "saved %zu messages to %s (/load %s restores the chat)\n", full.n, arg, arg);
            } else if (strcmp(cmd, "load") == 0) {
                size_t len;
                char *d = al ? read_file(arg, &len) : NULL;
                if (!al) fputs("offload-run chat: /load: want a file name (/load FILE)\n", stderr);
                if (!d) continue;
                if (strncmp(d, TRI_CLI_TRANSCRIPT_PREFIX, strlen(TRI_CLI_TRANSCRIPT_PREFIX)) == 0) {
                    // a chat /save wrote: restored, and prefilled by the next turn
                    if (load_transcript(arg, d, &full)) {
                        while (cv.n) conv_drop(&cv, 0, cv.n);
                        for (size_t i = 0; i < full.n; i++)
                            if (!conv_add(&cv, full.msgs[i].role, full.msgs[i].content, strlen(full.msgs[i].content)))
                                goto oom;
                        free(doc);
                        doc = NULL;
                        fprintf(stderr, "restored %zu messages from %s; your next message continues the chat\n", full.n,
                                arg);
                    }
                    free(d);
                    continue;
                }
                while (len > 0 && (d[len - 1] == '\n' || d[len - 1] == '\r' || d[len - 1] == ' ')) d[--len] = 0;
                free(doc);
                doc = d;
                doc_len = len;
                // prefill it now, as the start of the next message: the conversation with the
                // document as a user message, up to the document's end (the template's end of turn
                // is not what the question will bring, so the last tokens are left to the turn)
                if (!conv_add(&cv, "user", doc, doc_len)) goto oom;
                size_t rl = 0;
                free(rendered);
                rendered = tri_cli_render_chat(me, model, format, cv.msgs, cv.n, &rl);
                conv_drop(&cv, cv.n - 1, 1);
                int32_t n_ids = 0;
                free(ids);
                ids = rendered ? tri_cli_text_ids(me, model, rendered, rl, false, true, &n_ids) : NULL;
                if (!ids) continue;
                int32_t n_past = tri_session_n_past(session), keep = 0;
                while (keep < n_past && keep < n_ctx_tokens && keep < n_ids && ctx_tokens[keep] == ids[keep]) keep++;
                int32_t upto = n_ids - 8 > keep ? n_ids - 8 : keep;  // leave the end of turn and header
                if (pc.path && upto + 16 <= n_ctx) keep = pcache_load(&pc, session, ids, upto, keep);
                if (upto + 16 > n_ctx) {
                    fprintf(stderr, "loaded %s (%zu bytes, %d tokens): larger than the context of %d tokens; it "
                            "goes before your next message, where the oldest turns will make room if they can\n",
                            arg, doc_len, n_ids, n_ctx);
                    continue;
                }
                double t0 = tri_cli_now();
                if ((st = prefill_ids(session, ids, keep, upto, sp.n_batch > 0 ? sp.n_batch : 128))) {
                    rc = tri_cli_fail("cannot prefill the document", st);
                    goto done;
                }
                int32_t *t = realloc(ctx_tokens, (size_t)(upto > 0 ? upto : 1) * sizeof *t);
                if (!t) goto oom;
                ctx_tokens = t;
                memcpy(ctx_tokens, ids, (size_t)upto * sizeof *ids);
                n_ctx_tokens = tri_session_n_past(session);
                if (!interrupted && n_ctx_tokens == upto) pcache_save(&pc, session, ids, upto);
                fprintf(stderr, "loaded %s (%zu bytes): prefilled %d tokens in %.1f ms; it goes before your next "
                        "message\n", arg, doc_len, n_ctx_tokens - keep, 1e3 * (tri_cli_now() - t0));
                interrupted = 0;
            } else {
                fprintf(stderr, "offload-run chat: unknown command '/%s' (/help lists them; '//' sends a line "
                        "starting with '/')\n", cmd);
            }
            continue;
        }
        const char *msg = line[0] == '/' ? line + 1 : line;  // "//..." sends "/..."
        size_t msg_len = strlen(msg);
        if (doc) {  // the loaded document opens this message
            char *m = malloc(doc_len + 2 + msg_len + 1);
            if (!m) goto oom;
            memcpy(m, doc, doc_len);
            memcpy(m + doc_len, "\n\n", 2);
            memcpy(m + doc_len + 2, msg, msg_len + 1);
            free(line);
            line = m;
            msg = m;
            msg_len += doc_len + 2;
            free(doc);
            doc = NULL;
        }
        if (!conv_add(&cv, "user", msg, msg_len) || !conv_add(&full, "user", msg, msg_len)) goto oom;

        // ---- the conversation as tokens; the oldest turns dropped while it does not fit ----
        // room for the answer: n-predict tokens, at most a quarter of the context
        const int32_t reserve = n_predict > 0 && n_predict < n_ctx / 4 ? (int32_t)n_predict : n_ctx / 4;
        int32_t n_ids = 0, dropped = 0, dropped_tokens = 0;
        bool fits = false;
        for (;;) {
            size_t len = 0;
            free(rendered);
            free(ids);
            ids = NULL;
            if (!(rendered = tri_cli_render_chat(me, model, format, cv.msgs, cv.n, &len))) break;
            int32_t n_before = n_ids;
            if (!(ids = tri_cli_text_ids(me, model, rendered, len, false, true, &n_ids))) break;
            if (dropped) dropped_tokens = n_before - n_ids + dropped_tokens;
            if (n_ids + reserve <= n_ctx || (n_ids < n_ctx && cv.n <= 1u + (strcmp(cv.msgs[0].role, "system") == 0))) {
                fits = n_ids < n_ctx;
                break;
            }
            // the oldest message after the system message, with the answer to it
            size_t first = strcmp(cv.msgs[0].role, "system") == 0;
            if (cv.n - first <= 1) break;  // only this message is left, and it does not fit
            size_t n_drop = cv.n - first >= 3 && strcmp(cv.msgs[first + 1].role, "assistant") == 0 ? 2 : 1;
            conv_drop(&cv, first, n_drop);
            dropped += (int32_t)n_drop;
        }
        if (dropped && ids)
            fprintf(stderr, "(the context of %d tokens is full: dropped the %d oldest messages, %d tokens; the "
                    "conversation is now %d tokens)\n", n_ctx, dropped, dropped_tokens, n_ids);
        if (!fits) {
            if (ids)
                fprintf(stderr, "offload-run chat: the message (%d tokens with the conversation's start) does not "
                        "fit the context of %d tokens (--ctx); it is dropped\n", n_ids, n_ctx);
            conv_drop(&cv, cv.n - 1, 1);  // the message that could not be sent
            conv_drop(&full, full.n - 1, 1);
            continue;
        }
        int32_t n_past = tri_session_n_past(session), keep = 0;
        while (keep < n_past && keep < n_ctx_tokens && keep < n_ids && ctx_tokens[keep] == ids[keep]) keep++;
        if (pc.path) keep = pcache_load(&pc, session, ids, n_ids, keep);
        if (keep == n_ids) keep--;  // a turn prefills at least one token
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
        pf.last = 0;
        pf.ids = ids;
        pf.n = n_ids;
        int32_t room = n_ctx - n_ids;
        gp.n_predict = n_predict > 0 && n_predict < room ? (int32_t)n_predict : room;
        gp.sampler = smp.p;
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
        // an answer that ends because the context is full (the room left was its limit, not -n) says so
        if (gs.stop_reason == TRI_STOP_CONTEXT ||
            (gs.stop_reason == TRI_STOP_LENGTH && gp.n_predict == room && (n_predict == 0 || n_predict > room)))
            fprintf(stderr, " (cut: the context of %d tokens is full; the next turn drops the oldest turns)", n_ctx);
        fputs(interrupted ? " (stopped)\n" : "\n", stderr);
        interrupted = 0;

        // the cache now holds the rendering and the answer's tokens (the last one not yet run)
        int32_t *t = realloc(ctx_tokens, (size_t)(n_ids + ans.n + 1) * sizeof *t);
        if (!t) goto oom;
        ctx_tokens = t;
        memcpy(ctx_tokens, ids, (size_t)n_ids * sizeof *ids);
        memcpy(ctx_tokens + n_ids, ans.tokens, (size_t)ans.n * sizeof *ids);
        n_ctx_tokens = n_ids + ans.n;
        if (!conv_add(&cv, "assistant", ans.text ? ans.text : "", ans.n_text) ||
            !conv_add(&full, "assistant", ans.text ? ans.text : "", ans.n_text))
            goto oom;
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
#ifdef TRI_CLI_LIBEDIT
    if (in.history) write_history(in.history);
#endif
    free(in.history);
    free(in.buf);
    if (json_file && json_file != stdout) fclose(json_file);
    free(turns);
    free(line);
    free(doc);
    free(rendered);
    free(ids);
    free(ctx_tokens);
    free(ans.tokens);
    free(ans.text);
    conv_free(&cv);
    conv_free(&full);
    free(pc.tokens);
    tri_session_free(session);
    tri_model_free(model);
    return rc;
}
