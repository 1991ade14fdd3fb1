// cli-common.c - what every offload-run subcommand shares: model loading and error reports.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

// ---- messages ----

static char cli_name[64] = "offload-run";
static const char *cli_command = "";  // the subcommand's word, "" before main sets it

void tri_cli_set_command(const char *command) {
    snprintf(cli_name, sizeof cli_name, "offload-run %s", command);
    cli_command = cli_name + strlen("offload-run ");
}

const char *tri_cli_name(void) { return cli_name; }

int tri_cli_fail(const char *what, tri_status status) {
    const char *msg = tri_last_error();
    if (!msg[0]) msg = tri_status_str(status);
    size_t n = strlen(cli_command);
    if (n && strncmp(msg, cli_command, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
    fprintf(stderr, "%s: %s: %s\n", cli_name, what, msg);
    return 1;
}

int tri_cli_see_help(void) {
    fprintf(stderr, "see '%s --help'\n", cli_name);
    return 2;
}

int tri_cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cli_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return tri_cli_see_help();
}

// On a terminal: one line rewritten in place. Otherwise (a log, a pipe) a line at each tenth once
// the load has taken a second, so that scripts see a long load progress without carriage returns
// and a quick one prints nothing.
typedef struct load_state {
    bool tty;
    int last;      // the last tenth printed
    double start;  // monotonic seconds
} load_state;

static bool load_progress(float fraction, void *user) {
    load_state *ls = user;
    int pct = (int)(fraction * 100.0f + 0.5f);
    if (ls->tty) {
        fprintf(stderr, "\rloading model: %3d%%", pct);
        if (fraction >= 1.0f) fputc('\n', stderr);
        return true;
    }
    if (pct / 10 > ls->last && tri_cli_now() - ls->start >= 1.0) {
        ls->last = pct / 10;
        fprintf(stderr, "loading model: %d%%\n", pct);
    }
    return true;
}

tri_model *tri_cli_load_model(const char *path) {
    tri_model_params params = tri_model_default_params();
    load_state ls = {.tty = isatty(STDERR_FILENO), .last = 0, .start = tri_cli_now()};
    params.progress = load_progress;
    params.progress_user = &ls;
    tri_model *model = NULL;
    tri_status st = tri_model_load(path, &params, &model);
    if (st) {
        if (ls.tty) fputc('\n', stderr);
        tri_cli_fail("cannot load model", st);
        return NULL;
    }
    return model;
}

double tri_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t tri_cli_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024;  // Linux reports KiB
}

void tri_cli_json_str(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}

bool tri_cli_may_replace(const char *cmd, const char *what, const char *path, const char *prefix) {
    struct stat sb;
    if (stat(path, &sb) != 0) return true;  // nothing there (or unreachable: fopen says why)
    if (!S_ISREG(sb.st_mode)) {
        if (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode)) return true;  // /dev/null, a pipe: nothing to lose
        fprintf(stderr, "%s: %s %s: not replaced: it is a %s, not a file\n", cmd, what, path,
                S_ISDIR(sb.st_mode) ? "directory" : "special file");
        return false;
    }
    if (sb.st_size == 0) return true;
    char head[64] = {0};
    size_t want = strlen(prefix) < sizeof head ? strlen(prefix) : sizeof head, got = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        got = fread(head, 1, want, f);
        fclose(f);
    }
    if (got == want && memcmp(head, prefix, want) == 0) return true;
    fprintf(stderr,
            "%s: %s %s: not replaced: the file exists (%lld bytes) and was not written by offload-run (it does not "
            "start with %s); give another path, or delete it first\n",
            cmd, what, path, (long long)sb.st_size, prefix);
    return false;
}

FILE *tri_cli_json_open(const char *cmd, const char *path) {
    if (strcmp(path, "-") == 0) return stdout;
    if (!tri_cli_may_replace(cmd, "--json", path, TRI_CLI_JSON_PREFIX)) return NULL;
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "%s: --json %s: %s\n", cmd, path, strerror(errno));
    return f;
}

bool tri_cli_json_close(const char *cmd, const char *path, FILE *f) {
    bool ok = !ferror(f);
    if (f == stdout) ok = fflush(f) == 0 && ok;
    else ok = fclose(f) == 0 && ok;
    if (!ok) fprintf(stderr, "%s: --json %s: write error\n", cmd, path);
    return ok;
}

char *tri_cli_render_chat(const char *cmd, const tri_model *model, tri_chat_format format,
                          const tri_chat_message *msgs, size_t n, size_t *len) {
    size_t need = 0;
    tri_status st = tri_chat_apply(model, format, msgs, n, true, NULL, 0, &need);
    char *text = st ? NULL : malloc(need + 1);
    if (!st && !text) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return NULL;
    }
    if (!st) st = tri_chat_apply(model, format, msgs, n, true, text, need + 1, len);
    if (st) {
        const char *msg = tri_last_error();
        fprintf(stderr, "%s: cannot render the conversation with the model's chat template: %s\n", cmd,
                msg[0] ? msg : tri_status_str(st));
        free(text);
        return NULL;
    }
    return text;
}

int32_t *tri_cli_text_ids(const char *cmd, const tri_model *model, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *n_out) {
    int64_t need = 0;
    tri_status st = tri_tokenize(model, text, len, add_special, parse_special, NULL, 0, &need);
    if (st) {
        tri_cli_fail("cannot tokenize the prompt", st);
        return NULL;
    }
    if (need > INT32_MAX / 2) {
        fprintf(stderr, "%s: prompt of %lld tokens is too long\n", cmd, (long long)need);
        return NULL;
    }
    int32_t *ids = malloc((size_t)(need > 0 ? need : 1) * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return NULL;
    }
    int64_t got = 0;
    if ((st = tri_tokenize(model, text, len, add_special, parse_special, ids, need, &got))) {
        tri_cli_fail("cannot tokenize the prompt", st);
        free(ids);
        return NULL;
    }
    *n_out = (int32_t)got;
    return ids;
}

bool tri_cli_parse_device(const char *cmd, const char *arg, tri_session_params *sp) {
    if (strchr(arg, ',') || strncmp(arg, "cpu:", 4) == 0) {
        // a device list (tensor parallelism): the session checks it and names what is wrong
        sp->devices = arg;
        return true;
    }
    tri_device_kind kind;
    int32_t index;
    if (tri_device_parse(arg, &kind, &index) != TRI_STATUS_OK) {
        fprintf(stderr, "%s: --device '%s': want cpu, cuda or cuda:N, or a list (cuda:0,cuda:1 or cpu:0,cpu:1)\n", cmd,
                arg);
        return false;
    }
    sp->device_kind = kind;
    if (kind == TRI_DEVICE_CUDA) sp->device = index;
    return true;
}

bool tri_cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return false;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0, end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024, end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)) end += strlen(end);
    if (*end) return false;
    double b = v * mul;
    if (b > 1.8e19) return false;
    *out = (uint64_t)(b + 0.5);
    return true;
}

bool tri_cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s': want a whole number in [%ld, %ld]\n", cmd, opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool tri_cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s '%s': want a number in [%g, %g]\n", cmd, opt, s, lo, hi);
        return false;
    }
    *out = (float)v;
    return true;
}

// ---- prompts from files ----

uint64_t tri_cli_prompt_bytes(const tri_model *model, int64_t n_tokens, size_t *longest) {
    size_t most = 1;
    for (int32_t id = 0; id < tri_token_count(model); id++) {
        const char *piece;
        size_t n;
        if (tri_token_piece(model, id, &piece, &n) == TRI_STATUS_OK && n > most) most = n;
    }
    if (longest) *longest = most;
    return (uint64_t)(n_tokens > 0 ? n_tokens : 1) * most;
}

bool tri_cli_wait_note(int fd, const char *name, const char *what, const char *how) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !(S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))) return false;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 1000) != 0) return false;
    fprintf(stderr, "%s: waiting for %s on %s (a %s): %s\n", cli_name, what, name,
            S_ISFIFO(sb.st_mode) ? "FIFO or pipe" : "socket", how);
    return true;
}

char *tri_cli_read_prompt(const char *path, uint64_t max_bytes, const char *too_long, size_t *len) {
    bool is_stdin = strcmp(path, "-") == 0;
    const char *name = is_stdin ? "stdin" : path;
    // a FIFO opened without O_NONBLOCK blocks in open() until a writer comes: open it at once and
    // wait below, where the wait can be announced
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "%s: %s: %s\n", cli_name, name, strerror(errno));
        if (fd > 0 && !is_stdin) close(fd);
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "%s: %s: is a directory\n", cli_name, name);
        if (!is_stdin) close(fd);
        return NULL;
    }
    if (!is_stdin) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    bool tty = isatty(fd);
    if (tty) {
        fprintf(stderr, "%s: reading the prompt from the terminal: end it with Ctrl-D\n", cli_name);
    } else if (tri_cli_wait_note(fd, name, "the prompt", "it is read to its end, when the writer closes it")) {
        // a FIFO no writer has opened yet reads as ended: wait for one (Ctrl-C ends the wait)
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        while (poll(&pf, 1, -1) < 0 && errno == EINTR) {}
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    bool err = false, over = false;
    while (buf) {
        if (n == cap) {
            if (n > max_bytes) {
                over = true;
                break;
            }
            char *b = cap <= SIZE_MAX / 4 ? realloc(buf, 2 * cap + 1) : NULL;
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            err = true;
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max_bytes) {
            over = true;
            break;
        }
    }
    int saved = errno;
    if (!is_stdin) close(fd);
    if (!buf || err || over) {
        if (over)
            fprintf(stderr, "%s: %s: longer than %llu bytes, %s\n", cli_name, name, (unsigned long long)max_bytes,
                    too_long);
        else
            fprintf(stderr, "%s: %s: %s\n", cli_name, name, buf ? strerror(saved) : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int32_t *tri_cli_parse_layers(const char *cmd, const char *opt, const char *arg, int32_t *n_out) {
    int32_t cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = arg;
    while (v) {
        char *end;
        long lo = strtol(p, &end, 10), hi;
        if (end == p || lo < 0 || lo > INT32_MAX) goto bad;
        hi = lo;
        if (*end == '-') {
            p = end + 1;
            hi = strtol(p, &end, 10);
            if (end == p || hi < lo || hi > INT32_MAX) goto bad;
        }
        for (long l = lo; l <= hi; l++) {
            if (n == cap) {
                int32_t *w = realloc(v, (size_t)(cap *= 2) * sizeof *w);
                if (!w) goto bad;
                v = w;
            }
            if (n > 0 && l <= v[n - 1]) goto bad;
            v[n++] = (int32_t)l;
            if (n > 100000) goto bad;
        }
        if (*end == 0) break;
        if (*end != ',') goto bad;
        p = end + 1;
    }
    *n_out = n;
    return v;
bad:
    fprintf(stderr, "%s: %s '%s': want increasing layer numbers like 0-7,20\n", cmd, opt, arg);
    free(v);
    return NULL;
}

bool tri_cli_applies(const char *cmd, const char *opt, bool set, bool ok, const char *where) {
    if (set && !ok) fprintf(stderr, "%s: %s applies only to %s\n", cmd, opt, where);
    return !set || ok;
}

bool tri_cli_parse_kv_type(const char *cmd, const char *opt, const char *arg, tri_dtype *out) {
    static const tri_dtype types[] = {TRI_DTYPE_F16, TRI_DTYPE_F32, TRI_DTYPE_Q8_0, TRI_DTYPE_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        if (strcmp(arg, tri_dtype_name(types[i])) == 0) {
            *out = types[i];
            return true;
        }
    }
    const bool whole = strcmp(opt, "--kv-type") == 0;  // mixed: the whole cache only, not a draft's
    if (whole && strcmp(arg, "mixed") == 0) {
        *out = TRI_DTYPE_KV_MIXED;
        return true;
    }
    fprintf(stderr, "%s: %s '%s': want f16, f32, q8_0%s\n", cmd, opt, arg, whole ? ", q4_0 or mixed" : " or q4_0");
    return false;
}
