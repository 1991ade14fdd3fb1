// jinja.c - a Jinja interpreter for chat templates: text to tokens to a tree, run over values made
// from a JSON context, as jinja2 runs it in Hugging Face's sandboxed environment (trim_blocks,
// lstrip_blocks, loopcontrols; tojson without HTML escaping; raise_exception, strftime_now).
// Every allocation of a parse or a render comes from one arena freed at its end, so an error
// anywhere leaves by longjmp without leaks. docs/chat-templates.md says what is covered.
#include "jinja.h"

#include <json-c/json.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- arena and failures ----

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct failure {
    jmp_buf jb;
    tri_status status;
    char *err;
    size_t errcap;
} failure;

typedef struct arena {
    chunk *head;
    size_t total, limit;
    failure *f;
} arena;

static _Noreturn void fail_at(failure *f, tri_status st, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static _Noreturn void fail_at(failure *f, tri_status st, int line, int col, const char *fmt, ...) {
    if (f->errcap) {
        int k = 0;
        if (line > 0) k = snprintf(f->err, f->errcap, "line %d, column %d: ", line, col);
        if (k < 0) k = 0;
        if ((size_t)k < f->errcap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(f->err + k, f->errcap - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    f->status = st;
    longjmp(f->jb, 1);
}

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit)
            fail_at(a->f, TRI_STATUS_BAD_FORMAT, 0, 0, "memory limit of %zu bytes reached", a->limit);
        chunk *c = malloc(sizeof *c + cap);
        if (!c) fail_at(a->f, TRI_STATUS_OUT_OF_MEMORY, 0, 0, "out of memory");
        c->next = a->head, c->used = 0, c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a) {
    for (chunk *c = a->head, *n; c; c = n) n = c->next, free(c);
    a->head = NULL;
    a->total = 0;
}

static char *arena_dup(arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

// A growable byte buffer in the arena (doubling: at most twice the bytes it holds).
typedef struct buf {
    char *p;
    size_t n, cap, limit;
} buf;

static void buf_put(arena *a, buf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->n + n > b->limit) fail_at(a->f, TRI_STATUS_BAD_FORMAT, 0, 0, "output limit of %zu bytes reached", b->limit);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n) cap *= 2;
        char *p = arena_alloc(a, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void buf_puts(arena *a, buf *b, const char *s) { buf_put(a, b, s, strlen(s)); }

static void buf_printf(arena *a, buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void buf_printf(arena *a, buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) buf_put(a, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

// ---- values ----

enum {
    V_UNDEF,  // s, n: the name, for messages
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,   // s, n: UTF-8 bytes
    V_LIST,  // l, n (tuples too)
    V_DICT,  // d (insertion order, as Python's)
    V_NS,    // d, mutable: namespace()
    V_FUNC,  // fn
    V_LOOP,  // lp
};

struct jdict;
struct jfunc;
struct jloop;

enum {
    J_SAFE = 1,  // V_STR: Markup (from |safe): what is added to it is HTML-escaped, as markupsafe does
    J_GEN = 2,   // V_LIST: a generator or iterator in jinja2 (map, select, ...): always true, no len()
    J_TUPLE = 4, // V_LIST: a Python tuple: written (a, b)
};

typedef struct jv {
    uint8_t t;
    uint8_t flags;
    size_t n;
    union {
        bool b;
        int64_t i;
        double f;
        const char *s;
        struct jv *l;
        struct jdict *d;
        struct jfunc *fn;
        struct jloop *lp;
    };
} jv;

typedef struct jdict {
    size_t n, cap;
    jv *k, *v;
} jdict;

typedef struct jloop {
    const jv *items;
    size_t n, i;
    int depth;
} jloop;

static const jv UNDEF = {.t = V_UNDEF};
static const jv NONE = {.t = V_NONE};

static jv vbool(bool b) { return (jv){.t = V_BOOL, .b = b}; }
static jv vint(int64_t i) { return (jv){.t = V_INT, .i = i}; }
static jv vfloat(double f) { return (jv){.t = V_FLOAT, .f = f}; }
static jv vstr(const char *s, size_t n) { return (jv){.t = V_STR, .s = s, .n = n}; }
static jv vcstr(const char *s) { return vstr(s, strlen(s)); }

// ---- tokens ----

enum {
    K_EOF,
    K_TEXT,       // s, n: text between tags, whitespace control applied
    K_VAR_BEGIN,  // {{
    K_VAR_END,    // }}
    K_BLOCK_BEGIN,
    K_BLOCK_END,
    K_NAME,
    K_STRING,  // s, n: the value, escapes resolved
    K_INT,
    K_FLOAT,
    K_OP,  // s, n: the operator
};

typedef struct token {
    int kind;
    int line, col;
    const char *s;
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct lexer {
    arena *a;
    const char *src;
    size_t len, pos;
    int line;
    size_t line_start;
    token *toks;
    size_t n, cap;
} lexer;

static int col_of(const lexer *L, size_t pos) { return (int)(pos - L->line_start) + 1; }

static void advance_to(lexer *L, size_t pos) {
    for (; L->pos < pos; L->pos++)
        if (L->src[L->pos] == '\n') L->line++, L->line_start = L->pos + 1;
}

static token *push_tok(lexer *L, int kind) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        token *t = arena_alloc(L->a, cap * sizeof *t);
        if (L->n) memcpy(t, L->toks, L->n * sizeof *t);
        L->toks = t, L->cap = cap;
    }
    token *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = L->line;
    t->col = col_of(L, L->pos);
    return t;
}

// Python's str.isspace() on the character at s (n bytes left): its length, 0 when not a space.
static size_t space_at(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
    if (n >= 2 && c == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n >= 3 && c == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;
    if (n >= 3 && c == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (n >= 3 && c == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;
    if (n >= 3 && c == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

// The length of the run of whitespace at s.
static size_t spaces_at(const char *s, size_t n) {
    size_t k = 0, m;
    while ((m = space_at((const unsigned char *)s + k, n - k))) k += m;
    return k;
}

// The length of s without its trailing whitespace.
static size_t rstrip_len(const char *s, size_t n) {
    for (;;) {
        size_t back = 1;
        while (back < n && back < 4 && ((unsigned char)s[n - back] & 0xc0) == 0x80) back++;
        if (n == 0 || space_at((const unsigned char *)s + n - back, back) != back) return n;
        n -= back;
    }
}

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static void put_utf8(arena *a, buf *b, uint32_t cp) {
    char u[4];
    size_t k;
    if (cp < 0x80)
        u[0] = (char)cp, k = 1;
    else if (cp < 0x800)
        u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), k = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)), u[2] = (char)(0x80 | (cp & 63)), k = 3;
    else
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)), u[2] = (char)(0x80 | ((cp >> 6) & 63)),
        u[3] = (char)(0x80 | (cp & 63)), k = 4;
    buf_put(a, b, u, k);
}

// A string literal at L->pos (a quote): its value as Python's unicode-escape decodes it.
static void lex_string(lexer *L, failure *f) {
    const char *s = L->src;
    char q = s[L->pos];
    size_t p = L->pos + 1;
    buf b = {.limit = (size_t)-1};
    int line = L->line, col = col_of(L, L->pos);
    for (;;) {
        if (p >= L->len) fail_at(f, TRI_STATUS_BAD_FORMAT, line, col, "unterminated string");
        char c = s[p];
        if (c == q) break;
        if (c != '\\') {
            buf_put(L->a, &b, &s[p++], 1);
            continue;
        }
        if (p + 1 >= L->len) fail_at(f, TRI_STATUS_BAD_FORMAT, line, col, "unterminated string");
        char e = s[p + 1];
        p += 2;
        int hex = 0;
        switch (e) {
        case 'n': buf_put(L->a, &b, "\n", 1); break;
        case 't': buf_put(L->a, &b, "\t", 1); break;
        case 'r': buf_put(L->a, &b, "\r", 1); break;
        case 'a': buf_put(L->a, &b, "\a", 1); break;
        case 'b': buf_put(L->a, &b, "\b", 1); break;
        case 'f': buf_put(L->a, &b, "\f", 1); break;
        case 'v': buf_put(L->a, &b, "\v", 1); break;
        case '\\': buf_put(L->a, &b, "\\", 1); break;
        case '\'': buf_put(L->a, &b, "'", 1); break;
        case '"': buf_put(L->a, &b, "\"", 1); break;
        case '\n': break;  // a line continuation
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && p < L->len && s[p] >= '0' && s[p] <= '7'; k++)
                    v = v * 8 + (uint32_t)(s[p++] - '0');
                put_utf8(L->a, &b, v);
            } else {
                buf_put(L->a, &b, &s[p - 2], 2);  // an unknown escape stays as written
            }
        }
        if (hex) {
            uint32_t v = 0;
            for (int k = 0; k < hex; k++, p++) {
                char h = p < L->len ? s[p] : 0;
                int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
                if (d < 0) fail_at(f, TRI_STATUS_BAD_FORMAT, line, col, "truncated \\%c escape in a string", e);
                v = v * 16 + (uint32_t)d;
            }
            if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
                fail_at(f, TRI_STATUS_UNSUPPORTED, line, col, "escape \\%c%X is not a character of UTF-8", e, v);
            put_utf8(L->a, &b, v);
        }
    }
    token *t = push_tok(L, K_STRING);
    t->line = line, t->col = col;
    t->s = b.n ? b.p : "", t->n = b.n;
    advance_to(L, p + 1);
}

// Tokens of one tag's inside up to its end ("%}" or "}}" outside brackets); returns the end's
// whitespace sign ('-', '+' or 0) and leaves L->pos after the end.
static char lex_tag(lexer *L, failure *f, bool block, int open_line, int open_col) {
    const char *s = L->src;
    int depth = 0;
    for (;;) {
        while (L->pos < L->len && spaces_at(s + L->pos, L->len - L->pos))
            advance_to(L, L->pos + spaces_at(s + L->pos, L->len - L->pos));
        if (L->pos >= L->len)
            fail_at(f, TRI_STATUS_BAD_FORMAT, open_line, open_col, "%s tag not closed", block ? "{%" : "{{");
        size_t p = L->pos, left = L->len - p;
        char c = s[p];
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            char sign = 0;
            size_t k = 0;
            if ((c == '-' || c == '+') && left >= 3 && memcmp(s + p + 1, end, 2) == 0)
                sign = c, k = 3;
            else if (left >= 2 && memcmp(s + p, end, 2) == 0)
                k = 2;
            if (k && !(sign == '+' && !block)) {
                push_tok(L, block ? K_BLOCK_END : K_VAR_END);
                advance_to(L, p + k);
                return sign;
            }
        }
        if (c == '\'' || c == '"') {
            lex_string(L, f);
        } else if (is_name_start(c)) {
            size_t q = p;
            while (q < L->len && (is_name_start(s[q]) || is_digit(s[q]))) q++;
            token *t = push_tok(L, K_NAME);
            t->s = s + p, t->n = q - p;
            advance_to(L, q);
        } else if (is_digit(c)) {
            size_t q = p;
            bool fl = false;
            while (q < L->len && (is_digit(s[q]) || s[q] == '_')) q++;
            if (q + 1 < L->len && s[q] == '.' && is_digit(s[q + 1])) {
                fl = true;
                q++;
                while (q < L->len && (is_digit(s[q]) || s[q] == '_')) q++;
            }
            if (q < L->len && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < L->len && (s[r] == '+' || s[r] == '-')) r++;
                if (r < L->len && is_digit(s[r])) {
                    fl = true;
                    q = r;
                    while (q < L->len && is_digit(s[q])) q++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t r = p; r < q && m < sizeof num - 1; r++)
                if (s[r] != '_') num[m++] = s[r];
            num[m] = 0;
            token *t = push_tok(L, fl ? K_FLOAT : K_INT);
            if (fl) {
                t->f = strtod(num, NULL);
            } else {
                char *e;
                unsigned long long v = strtoull(num, &e, 10);
                if (m > 18 && (v > INT64_MAX || m > 19))
                    fail_at(f, TRI_STATUS_UNSUPPORTED, t->line, t->col, "integer literal %s is too large", num);
                t->i = (int64_t)v;
            }
            advance_to(L, q);
        } else {
            static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                              ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", ";"};
            size_t k = 0;
            for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
                size_t m = strlen(ops[i]);
                if (left >= m && memcmp(s + p, ops[i], m) == 0) {
                    k = m;
                    break;
                }
            }
            if (!k) fail_at(f, TRI_STATUS_BAD_FORMAT, L->line, col_of(L, p), "unexpected character '%c'", c);
            if (c == '(' || c == '[' || c == '{') depth++;
            if (c == ')' || c == ']' || c == '}') {
                if (depth == 0) fail_at(f, TRI_STATUS_BAD_FORMAT, L->line, col_of(L, p), "unexpected '%c'", c);
                depth--;
            }
            token *t = push_tok(L, K_OP);
            t->s = s + p, t->n = k;
            advance_to(L, p + k);
        }
    }
}

// The whole template to tokens, with jinja2's whitespace control: "-" strips all whitespace on
// its side; lstrip_blocks removes the spaces and tabs before a block or comment tag that starts
// its line; trim_blocks removes the newline right after one.
static void lex(lexer *L, failure *f) {
    const char *s = L->src;
    bool line_starting = true;
    size_t text_start = 0;
    for (;;) {
        // the next tag start
        size_t p = text_start;
        const char *tag = NULL;
        while (p + 1 < L->len) {
            const char *q = memchr(s + p, '{', L->len - p - 1);
            if (!q) break;
            p = (size_t)(q - s);
            if (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#') {
                tag = s + p;
                break;
            }
            p++;
        }
        size_t text_end = tag ? p : L->len;
        char type = tag ? s[p + 1] : 0;
        char sign = tag && p + 2 < L->len && (s[p + 2] == '-' || s[p + 2] == '+') ? s[p + 2] : 0;
        if (type == '{' && sign == '+') sign = 0;  // {{+ is not a whitespace sign
        size_t tn = text_end - text_start;
        const char *text = s + text_start;
        if (tag && sign == '-') {
            tn = rstrip_len(text, tn);
        } else if (tag && sign != '+' && type != '{') {
            size_t l_pos = 0;
            for (size_t i = tn; i > 0; i--)
                if (text[i - 1] == '\n') {
                    l_pos = i;
                    break;
                }
            if ((l_pos > 0 || line_starting) && l_pos < tn && spaces_at(text + l_pos, tn - l_pos) == tn - l_pos)
                tn = l_pos;
        }
        if (tn) {
            token *t = push_tok(L, K_TEXT);
            t->s = text, t->n = tn;
        }
        advance_to(L, text_end);
        if (!tag) break;
        int line = L->line, col = col_of(L, p);
        size_t after_open = p + 2 + (sign ? 1 : 0);
        char end_sign;
        if (type == '#') {
            // a comment: to the first "#}"
            const char *q = NULL;
            for (size_t r = after_open; r + 1 < L->len; r++)
                if (s[r] == '#' && s[r + 1] == '}') {
                    q = s + r;
                    break;
                }
            if (!q) fail_at(f, TRI_STATUS_BAD_FORMAT, line, col, "comment not closed");
            size_t r = (size_t)(q - s);
            end_sign = r > after_open && (s[r - 1] == '-' || s[r - 1] == '+') ? s[r - 1] : 0;
            advance_to(L, r + 2);
        } else {
            push_tok(L, type == '%' ? K_BLOCK_BEGIN : K_VAR_BEGIN)->col = col;
            advance_to(L, after_open);
            end_sign = lex_tag(L, f, type == '%', line, col);
            // {% raw %} is not run: refuse it rather than render it wrongly
            token *b = &L->toks[L->n - 2];
            if (type == '%' && L->n >= 3 && b[-0].kind == K_NAME && b->n == 3 && memcmp(b->s, "raw", 3) == 0 &&
                L->toks[L->n - 3].kind == K_BLOCK_BEGIN)
                fail_at(f, TRI_STATUS_UNSUPPORTED, b->line, b->col, "{%% raw %%} is not supported");
        }
        size_t q = L->pos;
        if (end_sign == '-') {
            q += spaces_at(s + q, L->len - q);
        } else if (type != '{' && end_sign != '+' && q < L->len && s[q] == '\n') {
            q++;
        }
        line_starting = q > 0 && s[q - 1] == '\n';
        advance_to(L, q);
        text_start = q;
    }
    push_tok(L, K_EOF);
}

// ---- the tree ----

enum {
    // statements
    N_TEXT,          // name: the text
    N_OUT,           // a
    N_IF,            // a: condition; body; els
    N_FOR,           // names: targets; a: iterable; b: filter condition or NULL; body; els
    N_SET,           // names: targets (one, or several unpacked); a: value
    N_SET_ATTR,      // name: the namespace variable; attr: the attribute; a: value
    N_SET_BLOCK,     // name; body (args: filters applied to the text, as E_FILTER nodes with a NULL a)
    N_MACRO,         // name; names: parameters; args: their defaults (NULL: none); body
    N_CALL_BLOCK,    // a: the call; names, args: caller's parameters; body
    N_FILTER_BLOCK,  // args: the filters (E_FILTER nodes whose a is NULL); body
    N_BREAK,
    N_CONTINUE,
    N_BODY,  // body ({% generation %})
    // expressions
    E_LIT,     // val
    E_NAME,    // name
    E_ATTR,    // a . name
    E_ITEM,    // a [ b ]
    E_SLICE,   // a [ args[0] : args[1] : args[2] ] (entries may be NULL)
    E_CALL,    // a ( args, kw )
    E_FILTER,  // a | name ( args, kw )
    E_TEST,    // a is [not] name ( args )
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_BIN,   // a op b
    E_COND,  // b if a else c
    E_LIST,  // args
    E_TUPLE,
    E_DICT,  // args: keys; kw: values
};

enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN
};

typedef struct str_t {
    const char *s;
    size_t n;
} str_t;

typedef struct node node;
typedef struct nlist {
    node **v;
    size_t n, cap;
} nlist;

struct node {
    int kind, line, col;
    int op;
    bool neg;
    jv val;
    str_t name, attr;
    node *a, *b, *c;
    nlist args, kw, body, els;
    str_t *kwn;  // names of kw (calls)
    str_t *names;
    size_t nnames;
};

struct tri__jinja {
    arena a;
    nlist body;
};

typedef struct parser {
    arena *a;
    failure *f;
    token *t;
    size_t i, n;
    int depth;
    bool soft;  // inside an if or a conditional expression: unknown filters fail only when run
} parser;

static bool str_is(str_t s, const char *c) { return s.n == strlen(c) && memcmp(s.s, c, s.n) == 0; }

static void nl_push(arena *a, nlist *l, node *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        node **v = arena_alloc(a, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = x;
}

static token *cur(parser *P) { return &P->t[P->i]; }

static _Noreturn void perr(parser *P, tri_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void perr(parser *P, tri_status st, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_at(P->f, st, cur(P)->line, cur(P)->col, "%s", msg);
}

static node *mk(parser *P, int kind) {
    node *x = arena_alloc(P->a, sizeof *x);
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->line = cur(P)->line;
    x->col = cur(P)->col;
    return x;
}

static bool is_op(parser *P, const char *op) {
    token *t = cur(P);
    return t->kind == K_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}

static bool is_name(parser *P, const char *name) {
    token *t = cur(P);
    return t->kind == K_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static bool is_name_at(parser *P, size_t k, const char *name) {
    if (P->i + k >= P->n) return false;
    token *t = &P->t[P->i + k];
    return t->kind == K_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static const char *tok_desc(token *t) {
    switch (t->kind) {
    case K_EOF: return "the end of the template";
    case K_TEXT: return "text";
    case K_VAR_END: return "'}}'";
    case K_BLOCK_END: return "'%}'";
    case K_STRING: return "a string";
    case K_INT:
    case K_FLOAT: return "a number";
    default: return "this token";
    }
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        token *t = cur(P);
        if (t->kind == K_NAME || t->kind == K_OP)
            perr(P, TRI_STATUS_BAD_FORMAT, "expected '%s', got '%.*s'", op, (int)t->n, t->s);
        perr(P, TRI_STATUS_BAD_FORMAT, "expected '%s', got %s", op, tok_desc(t));
    }
    P->i++;
}

static str_t expect_name(parser *P, const char *what) {
    token *t = cur(P);
    if (t->kind != K_NAME) perr(P, TRI_STATUS_BAD_FORMAT, "expected %s, got %s", what, tok_desc(t));
    P->i++;
    return (str_t){t->s, t->n};
}

static void expect_kind(parser *P, int kind) {
    if (cur(P)->kind != kind) {
        token *t = cur(P);
        if (t->kind == K_NAME || t->kind == K_OP)
            perr(P, TRI_STATUS_BAD_FORMAT, "expected %s, got '%.*s'", kind == K_BLOCK_END ? "'%}'" : "'}}'", (int)t->n,
                 t->s);
        perr(P, TRI_STATUS_BAD_FORMAT, "expected %s, got %s", kind == K_BLOCK_END ? "'%}'" : "'}}'", tok_desc(t));
    }
    P->i++;
}

static void enter(parser *P) {
    if (++P->depth > 200) perr(P, TRI_STATUS_BAD_FORMAT, "nested too deeply (over 200 levels)");
}

static node *parse_expr(parser *P, bool with_cond);
static node *parse_unary(parser *P, bool with_filter);

static const char *const filters_known[] = {
    "tojson",      "length",     "count",    "trim",      "string",
    "default",     "d",          "join",     "items",     "upper",
    "lower",       "safe",       "dictsort", "list",      "replace",
    "selectattr",  "rejectattr", "select",   "reject",    "map",
    "indent",      "int",        "float",    "unique",    "sort",
    "min",         "max",        "first",    "last",      "capitalize",
    "title",       "abs",        "e",        "escape",    "batch",
    "sum",         "reverse",    "round",    "wordcount", "center",
    "striptags",   "attr",       "pprint",    "urlencode",
    "format",      "truncate",   "slice",    "groupby",   "filesizeformat",
    "forceescape", "wordwrap",   "xmlattr",  "urlize",    "random",
};
// jinja2 filters not run here (a template using one is refused by name)
static const char *const filters_missing[] = {
    "batch", "round",   "wordcount",      "center",      "striptags", "pprint",  "urlencode", "format", "truncate",
    "slice", "groupby", "filesizeformat", "forceescape", "wordwrap",  "xmlattr", "urlize",    "random", "sum"};

static void check_filter(parser *P, str_t name) {
    bool known = false, missing = false;
    for (size_t i = 0; i < sizeof filters_known / sizeof *filters_known; i++) known |= str_is(name, filters_known[i]);
    for (size_t i = 0; i < sizeof filters_missing / sizeof *filters_missing; i++)
        missing |= str_is(name, filters_missing[i]);
    if (!known && !P->soft) perr(P, TRI_STATUS_BAD_FORMAT, "no filter named '%.*s'", (int)name.n, name.s);
    if (missing) perr(P, TRI_STATUS_UNSUPPORTED, "filter '%.*s' is not supported", (int)name.n, name.s);
}

static const char *const tests_known[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence",    "number", "integer",
    "float",   "boolean",   "true", "false",  "odd",     "even",     "divisibleby", "eq",     "equalto",
    "==",      "ne",        "!=",   "lt",     "<",       "lessthan", "gt",          ">",      "greaterthan",
    "le",      "<=",        "ge",   ">=",     "in",      "callable", "lower",       "upper",  "sameas",
};

// Call arguments after '(': positional then name=value, to ')'.
static void parse_args(parser *P, node *call) {
    expect_op(P, "(");
    size_t nkw = 0, cap = 0;
    while (!is_op(P, ")")) {
        if (call->args.n + call->kw.n) expect_op(P, ",");
        if (is_op(P, ")")) break;  // a trailing comma
        if (is_op(P, "*") || is_op(P, "**")) perr(P, TRI_STATUS_UNSUPPORTED, "*args and **kwargs are not supported");
        if (cur(P)->kind == K_NAME && P->i + 1 < P->n && P->t[P->i + 1].kind == K_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].s[0] == '=') {
            str_t k = expect_name(P, "a name");
            P->i++;
            if (nkw == cap) {
                cap = cap ? cap * 2 : 4;
                str_t *v = arena_alloc(P->a, cap * sizeof *v);
                if (nkw) memcpy(v, call->kwn, nkw * sizeof *v);
                call->kwn = v;
            }
            call->kwn[nkw++] = k;
            nl_push(P->a, &call->kw, parse_expr(P, true));
        } else {
            if (call->kw.n) perr(P, TRI_STATUS_BAD_FORMAT, "a positional argument after a keyword argument");
            nl_push(P->a, &call->args, parse_expr(P, true));
        }
    }
    P->i++;
}

static node *parse_primary(parser *P) {
    token *t = cur(P);
    node *x;
    enter(P);
    if (t->kind == K_NAME) {
        str_t s = {t->s, t->n};
        x = mk(P, E_LIT);
        P->i++;
        if (str_is(s, "true") || str_is(s, "True"))
            x->val = vbool(true);
        else if (str_is(s, "false") || str_is(s, "False"))
            x->val = vbool(false);
        else if (str_is(s, "none") || str_is(s, "None"))
            x->val = NONE;
        else
            x->kind = E_NAME, x->name = s;
    } else if (t->kind == K_STRING) {
        x = mk(P, E_LIT);
        buf b = {.limit = (size_t)-1};
        while (cur(P)->kind == K_STRING) buf_put(P->a, &b, cur(P)->s, cur(P)->n), P->i++;  // 'a' 'b' is 'ab'
        x->val = vstr(b.n ? b.p : "", b.n);
    } else if (t->kind == K_INT || t->kind == K_FLOAT) {
        x = mk(P, E_LIT);
        x->val = t->kind == K_INT ? vint(t->i) : vfloat(t->f);
        P->i++;
    } else if (is_op(P, "(")) {
        x = mk(P, E_TUPLE);
        P->i++;
        bool comma = false;
        while (!is_op(P, ")")) {
            if (x->args.n) expect_op(P, ","), comma = true;
            if (is_op(P, ")")) break;
            nl_push(P->a, &x->args, parse_expr(P, true));
        }
        P->i++;
        if (x->args.n == 1 && !comma) x = x->args.v[0];
    } else if (is_op(P, "[")) {
        x = mk(P, E_LIST);
        P->i++;
        while (!is_op(P, "]")) {
            if (x->args.n) expect_op(P, ",");
            if (is_op(P, "]")) break;
            nl_push(P->a, &x->args, parse_expr(P, true));
        }
        P->i++;
    } else if (is_op(P, "{")) {
        x = mk(P, E_DICT);
        P->i++;
        while (!is_op(P, "}")) {
            if (x->args.n) expect_op(P, ",");
            if (is_op(P, "}")) break;
            nl_push(P->a, &x->args, parse_expr(P, true));
            expect_op(P, ":");
            nl_push(P->a, &x->kw, parse_expr(P, true));
        }
        P->i++;
    } else {
        if (t->kind == K_OP) perr(P, TRI_STATUS_BAD_FORMAT, "unexpected '%.*s'", (int)t->n, t->s);
        perr(P, TRI_STATUS_BAD_FORMAT, "expected an expression, got %s", tok_desc(t));
    }
    P->depth--;
    return x;
}

static node *parse_postfix(parser *P, node *x) {
    for (;;) {
        if (is_op(P, ".")) {
            node *y = mk(P, E_ATTR);
            P->i++;
            token *t = cur(P);
            if (t->kind == K_NAME) {
                y->name = (str_t){t->s, t->n};
                P->i++;
            } else if (t->kind == K_INT) {
                y->kind = E_ITEM;
                y->b = mk(P, E_LIT);
                y->b->val = vint(t->i);
                P->i++;
            } else {
                perr(P, TRI_STATUS_BAD_FORMAT, "expected an attribute name after '.'");
            }
            y->a = x;
            x = y;
        } else if (is_op(P, "[")) {
            node *y = mk(P, E_ITEM);
            P->i++;
            node *parts[3] = {0};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (is_op(P, ":")) {
                    slice = true;
                    if (++k > 2) perr(P, TRI_STATUS_BAD_FORMAT, "a slice takes at most three parts");
                    P->i++;
                    continue;
                }
                if (is_op(P, "]")) break;
                if (parts[k]) expect_op(P, "]");
                parts[k] = parse_expr(P, true);
            }
            P->i++;
            y->a = x;
            if (slice) {
                y->kind = E_SLICE;
                for (int i = 0; i < 3; i++) nl_push(P->a, &y->args, parts[i]);
            } else {
                if (!parts[0]) perr(P, TRI_STATUS_BAD_FORMAT, "expected a subscript");
                y->b = parts[0];
            }
            x = y;
        } else if (is_op(P, "(")) {
            node *y = mk(P, E_CALL);
            y->a = x;
            parse_args(P, y);
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_filter_expr(parser *P, node *x) {
    for (;;) {
        if (is_op(P, "|")) {
            P->i++;
            node *y = mk(P, E_FILTER);
            y->name = expect_name(P, "a filter name");
            check_filter(P, y->name);
            if (is_op(P, "(")) parse_args(P, y);
            y->a = x;
            x = y;
        } else if (is_name(P, "is")) {
            P->i++;
            node *y = mk(P, E_TEST);
            if (is_name(P, "not")) y->neg = true, P->i++;
            token *t = cur(P);
            if (t->kind == K_NAME) {
                y->name = (str_t){t->s, t->n};
                P->i++;
            } else if (t->kind == K_OP && (is_op(P, "==") || is_op(P, "!=") || is_op(P, "<") || is_op(P, ">") ||
                                           is_op(P, "<=") || is_op(P, ">="))) {
                y->name = (str_t){t->s, t->n};
                P->i++;
            } else {
                perr(P, TRI_STATUS_BAD_FORMAT, "expected a test name after 'is'");
            }
            bool known = false;
            for (size_t i = 0; i < sizeof tests_known / sizeof *tests_known; i++)
                known |= str_is(y->name, tests_known[i]);
            if (!known && !P->soft) perr(P, TRI_STATUS_BAD_FORMAT, "no test named '%.*s'", (int)y->name.n, y->name.s);
            y->a = x;
            token *n = cur(P);
            if (is_op(P, "(")) {
                parse_args(P, y);
            } else if ((n->kind == K_NAME || n->kind == K_STRING || n->kind == K_INT || n->kind == K_FLOAT ||
                        is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                node *arg = parse_primary(P);
                nl_push(P->a, &y->args, parse_postfix(P, arg));
            }
            x = y;
        } else if (is_op(P, "(")) {
            node *y = mk(P, E_CALL);
            y->a = x;
            parse_args(P, y);
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_unary(parser *P, bool with_filter) {
    node *x;
    enter(P);
    if (is_op(P, "-") || is_op(P, "+")) {
        x = mk(P, is_op(P, "-") ? E_NEG : E_POS);
        P->i++;
        x->a = parse_unary(P, false);
    } else {
        x = parse_primary(P);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static node *bin(parser *P, int op, node *l, node *r, int line, int col) {
    node *x = mk(P, E_BIN);
    x->op = op, x->a = l, x->b = r, x->line = line, x->col = col;
    return x;
}

static node *parse_pow(parser *P) {
    node *l = parse_unary(P, true);
    while (is_op(P, "**")) {
        int line = cur(P)->line, col = cur(P)->col;
        P->i++;
        l = bin(P, OP_POW, l, parse_unary(P, true), line, col);
    }
    return l;
}

static node *parse_math2(parser *P) {
    node *l = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*")    ? OP_MUL
                 : is_op(P, "/")  ? OP_DIV
                 : is_op(P, "//") ? OP_FLOORDIV
                 : is_op(P, "%")  ? OP_MOD
                                  : -1;
        if (op < 0) return l;
        int line = cur(P)->line, col = cur(P)->col;
        P->i++;
        l = bin(P, op, l, parse_pow(P), line, col);
    }
}

static node *parse_concat(parser *P) {
    node *l = parse_math2(P);
    while (is_op(P, "~")) {
        int line = cur(P)->line, col = cur(P)->col;
        P->i++;
        l = bin(P, OP_CONCAT, l, parse_math2(P), line, col);
    }
    return l;
}

static node *parse_math1(parser *P) {
    node *l = parse_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0) return l;
        int line = cur(P)->line, col = cur(P)->col;
        P->i++;
        l = bin(P, op, l, parse_concat(P), line, col);
    }
}

static node *parse_compare(parser *P) {
    node *l = parse_math1(P);
    node *chain = NULL;
    for (;;) {
        int line = cur(P)->line, col = cur(P)->col, op;
        if (is_op(P, "=="))
            op = OP_EQ;
        else if (is_op(P, "!="))
            op = OP_NE;
        else if (is_op(P, "<"))
            op = OP_LT;
        else if (is_op(P, ">"))
            op = OP_GT;
        else if (is_op(P, "<="))
            op = OP_LE;
        else if (is_op(P, ">="))
            op = OP_GE;
        else if (is_name(P, "in"))
            op = OP_IN;
        else if (is_name(P, "not") && is_name_at(P, 1, "in"))
            op = OP_NOTIN, P->i++;
        else
            break;
        P->i++;
        node *r = parse_math1(P);
        node *c = bin(P, op, chain ? chain->b : l, r, line, col);
        if (!chain) {
            chain = c;
            l = c;
        } else {  // a < b < c is a < b and b < c
            node *and = mk(P, E_AND);
            and->a = l, and->b = c;
            l = and;
            chain = c;
        }
    }
    return l;
}

static node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        node *x = mk(P, E_NOT);
        P->i++;
        enter(P);
        x->a = parse_not(P);
        P->depth--;
        return x;
    }
    return parse_compare(P);
}

static node *parse_and(parser *P) {
    node *l = parse_not(P);
    while (is_name(P, "and")) {
        node *x = mk(P, E_AND);
        P->i++;
        x->a = l, x->b = parse_not(P);
        l = x;
    }
    return l;
}

static node *parse_or(parser *P) {
    node *l = parse_and(P);
    while (is_name(P, "or")) {
        node *x = mk(P, E_OR);
        P->i++;
        x->a = l, x->b = parse_and(P);
        l = x;
    }
    return l;
}

static node *parse_expr(parser *P, bool with_cond) {
    enter(P);
    node *x = parse_or(P);
    while (with_cond && is_name(P, "if")) {
        node *c = mk(P, E_COND);
        P->i++;
        c->b = x;
        bool soft = P->soft;
        P->soft = true;
        c->a = parse_or(P);
        if (is_name(P, "else")) {
            P->i++;
            c->c = parse_expr(P, true);
        }
        P->soft = soft;
        x = c;
    }
    P->depth--;
    return x;
}

// An expression, or several separated by commas (a tuple): {{ a, b }}, {% set x = 1, 2 %}.
static node *parse_tuple(parser *P, bool with_cond) {
    node *x = parse_expr(P, with_cond);
    if (!is_op(P, ",")) return x;
    node *t = mk(P, E_TUPLE);
    nl_push(P->a, &t->args, x);
    while (is_op(P, ",")) {
        P->i++;
        if (cur(P)->kind == K_BLOCK_END || cur(P)->kind == K_VAR_END || is_op(P, ")")) break;
        nl_push(P->a, &t->args, parse_expr(P, with_cond));
    }
    return t;
}

// Names separated by commas, optionally in parentheses: for loops' and set's targets.
static void parse_targets(parser *P, node *x) {
    bool paren = is_op(P, "(");
    if (paren) P->i++;
    str_t tmp[16];
    size_t n = 0;
    do {
        if (n) P->i++;
        if (n == 16) perr(P, TRI_STATUS_UNSUPPORTED, "more than 16 names to unpack");
        tmp[n++] = expect_name(P, "a variable name");
    } while (is_op(P, ","));
    if (paren) expect_op(P, ")");
    x->names = arena_alloc(P->a, n * sizeof *x->names);
    memcpy(x->names, tmp, n * sizeof *tmp);
    x->nnames = n;
}

static str_t parse_body(parser *P, nlist *out, const char *const *ends);

// Filters of {% filter %} and {% set x | f %}: name[(args)] (| name[(args)])*.
static void parse_filter_chain(parser *P, nlist *out) {
    do {
        if (out->n) P->i++;
        node *y = mk(P, E_FILTER);
        y->name = expect_name(P, "a filter name");
        check_filter(P, y->name);
        if (is_op(P, "(")) parse_args(P, y);
        nl_push(P->a, out, y);
    } while (is_op(P, "|"));
}

// One statement after its "{%" and name token.
static node *parse_stmt(parser *P) {
    token *kw = cur(P);
    str_t k = expect_name(P, "a statement name");
    node *x;
    // jinja2 checks filter and test names when it compiles, except inside an if (a soft frame)
    bool soft = P->soft;
    if (str_is(k, "if"))
        P->soft = true;
    else if (!str_is(k, "set"))
        P->soft = false;
    if (str_is(k, "if")) {
        x = mk(P, N_IF);
        x->line = kw->line, x->col = kw->col;
        x->a = parse_tuple(P, true);
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        str_t e = parse_body(P, &x->body, ends);
        node *tail = x;
        while (str_is(e, "elif")) {
            node *y = mk(P, N_IF);
            y->a = parse_tuple(P, true);
            expect_kind(P, K_BLOCK_END);
            nl_push(P->a, &tail->els, y);
            e = parse_body(P, &y->body, ends);
            tail = y;
        }
        if (str_is(e, "else")) {
            expect_kind(P, K_BLOCK_END);
            static const char *const endif[] = {"endif", NULL};
            parse_body(P, &tail->els, endif);
        }
    } else if (str_is(k, "for")) {
        x = mk(P, N_FOR);
        x->line = kw->line, x->col = kw->col;
        parse_targets(P, x);
        if (!is_name(P, "in")) perr(P, TRI_STATUS_BAD_FORMAT, "expected 'in' in a for loop");
        P->i++;
        x->a = parse_tuple(P, false);
        if (is_name(P, "if")) {
            P->i++;
            x->b = parse_expr(P, true);
        }
        if (is_name(P, "recursive")) perr(P, TRI_STATUS_UNSUPPORTED, "recursive loops are not supported");
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"else", "endfor", NULL};
        if (str_is(parse_body(P, &x->body, ends), "else")) {
            expect_kind(P, K_BLOCK_END);
            static const char *const endfor[] = {"endfor", NULL};
            parse_body(P, &x->els, endfor);
        }
    } else if (str_is(k, "set")) {
        x = mk(P, N_SET);
        x->line = kw->line, x->col = kw->col;
        if (cur(P)->kind == K_NAME && P->i + 1 < P->n && P->t[P->i + 1].kind == K_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].s[0] == '.') {
            x->kind = N_SET_ATTR;
            x->name = expect_name(P, "a variable name");
            P->i++;
            x->attr = expect_name(P, "an attribute name");
            expect_op(P, "=");
            x->a = parse_tuple(P, true);
        } else {
            parse_targets(P, x);
            if (is_op(P, "=")) {
                P->i++;
                x->a = parse_tuple(P, true);
            } else {
                if (x->nnames != 1) perr(P, TRI_STATUS_BAD_FORMAT, "a block set takes one name");
                x->kind = N_SET_BLOCK;
                x->name = x->names[0];
                if (is_op(P, "|")) {
                    P->i++;
                    parse_filter_chain(P, &x->args);
                }
                expect_kind(P, K_BLOCK_END);
                static const char *const ends[] = {"endset", NULL};
                parse_body(P, &x->body, ends);
                P->soft = soft;
                return x;
            }
        }
    } else if (str_is(k, "macro")) {
        x = mk(P, N_MACRO);
        x->line = kw->line, x->col = kw->col;
        x->name = expect_name(P, "a macro name");
        expect_op(P, "(");
        str_t tmp[32];
        size_t n = 0;
        while (!is_op(P, ")")) {
            if (n) expect_op(P, ",");
            if (is_op(P, ")")) break;
            if (n == 32) perr(P, TRI_STATUS_UNSUPPORTED, "more than 32 macro parameters");
            tmp[n++] = expect_name(P, "a parameter name");
            node *def = NULL;
            if (is_op(P, "=")) {
                P->i++;
                def = parse_expr(P, true);
            } else if (x->args.n && x->args.v[x->args.n - 1]) {
                perr(P, TRI_STATUS_BAD_FORMAT, "a parameter without a default after one with a default");
            }
            nl_push(P->a, &x->args, def);
        }
        P->i++;
        x->names = arena_alloc(P->a, (n ? n : 1) * sizeof *x->names);
        memcpy(x->names, tmp, n * sizeof *tmp);
        x->nnames = n;
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"endmacro", NULL};
        parse_body(P, &x->body, ends);
    } else if (str_is(k, "call")) {
        x = mk(P, N_CALL_BLOCK);
        x->line = kw->line, x->col = kw->col;
        if (is_op(P, "(")) {
            node tmp;
            memset(&tmp, 0, sizeof tmp);
            P->i++;
            str_t names[32];
            size_t n = 0;
            while (!is_op(P, ")")) {
                if (n) expect_op(P, ",");
                if (n == 32) perr(P, TRI_STATUS_UNSUPPORTED, "more than 32 caller parameters");
                names[n++] = expect_name(P, "a parameter name");
                node *def = NULL;
                if (is_op(P, "=")) {
                    P->i++;
                    def = parse_expr(P, true);
                }
                nl_push(P->a, &x->args, def);
            }
            P->i++;
            x->names = arena_alloc(P->a, (n ? n : 1) * sizeof *x->names);
            memcpy(x->names, names, n * sizeof *names);
            x->nnames = n;
        }
        x->a = parse_expr(P, true);
        if (x->a->kind != E_CALL) perr(P, TRI_STATUS_BAD_FORMAT, "expected a call after {%% call %%}");
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"endcall", NULL};
        parse_body(P, &x->body, ends);
    } else if (str_is(k, "filter")) {
        x = mk(P, N_FILTER_BLOCK);
        x->line = kw->line, x->col = kw->col;
        parse_filter_chain(P, &x->args);
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"endfilter", NULL};
        parse_body(P, &x->body, ends);
    } else if (str_is(k, "break") || str_is(k, "continue")) {
        x = mk(P, str_is(k, "break") ? N_BREAK : N_CONTINUE);
        x->line = kw->line, x->col = kw->col;
        expect_kind(P, K_BLOCK_END);
    } else if (str_is(k, "generation")) {
        x = mk(P, N_BODY);
        expect_kind(P, K_BLOCK_END);
        static const char *const ends[] = {"endgeneration", NULL};
        parse_body(P, &x->body, ends);
    } else {
        static const char *const other[] = {"include", "import",     "from", "extends", "block",
                                            "with",    "autoescape", "do",   "trans"};
        P->i--;
        for (size_t i = 0; i < sizeof other / sizeof *other; i++)
            if (str_is(k, other[i])) perr(P, TRI_STATUS_UNSUPPORTED, "{%% %s %%} is not supported", other[i]);
        perr(P, TRI_STATUS_BAD_FORMAT, "unknown tag '%.*s'", (int)k.n, k.s);
    }
    if (x->kind != N_IF && x->kind != N_FOR && x->kind != N_MACRO && x->kind != N_CALL_BLOCK &&
        x->kind != N_FILTER_BLOCK && x->kind != N_BODY && x->kind != N_BREAK && x->kind != N_CONTINUE)
        expect_kind(P, K_BLOCK_END);
    P->soft = soft;
    return x;
}

// Statements up to a "{% name %}" with name in ends (NULL-terminated; NULL: to the end of the
// template). Returns that name, with the parser after it (before the tag's own arguments).
static str_t parse_body(parser *P, nlist *out, const char *const *ends) {
    int line = cur(P)->line, col = cur(P)->col;
    enter(P);
    for (;;) {
        token *t = cur(P);
        if (t->kind == K_EOF) {
            if (!ends) {
                P->depth--;
                return (str_t){0};
            }
            fail_at(P->f, TRI_STATUS_BAD_FORMAT, line, col, "block not closed: expected {%% %s %%}", ends[0]);
        }
        if (t->kind == K_TEXT) {
            node *x = mk(P, N_TEXT);
            x->name = (str_t){t->s, t->n};
            nl_push(P->a, out, x);
            P->i++;
        } else if (t->kind == K_VAR_BEGIN) {
            P->i++;
            node *x = mk(P, N_OUT);
            x->a = parse_tuple(P, true);
            expect_kind(P, K_VAR_END);
            nl_push(P->a, out, x);
        } else if (t->kind == K_BLOCK_BEGIN) {
            P->i++;
            if (ends && cur(P)->kind == K_NAME)
                for (size_t i = 0; ends[i]; i++)
                    if (is_name(P, ends[i])) {
                        str_t e = {cur(P)->s, cur(P)->n};
                        P->i++;
                        if (strncmp(ends[i], "end", 3) == 0) {
                            if (cur(P)->kind == K_NAME && !str_is(e, "endset")) P->i++;  // {% endmacro name %}
                            expect_kind(P, K_BLOCK_END);
                        }
                        P->depth--;
                        return e;
                    }
            if (cur(P)->kind == K_NAME && cur(P)->n >= 3 && memcmp(cur(P)->s, "end", 3) == 0)
                perr(P, TRI_STATUS_BAD_FORMAT, "unexpected '%.*s'%s%s", (int)cur(P)->n, cur(P)->s,
                     ends ? ": expected " : "", ends ? ends[0] : "");
            if (is_name(P, "elif") || is_name(P, "else"))
                perr(P, TRI_STATUS_BAD_FORMAT, "unexpected '%.*s'", (int)cur(P)->n, cur(P)->s);
            nl_push(P->a, out, parse_stmt(P));
        } else {
            perr(P, TRI_STATUS_BAD_FORMAT, "unexpected %s", tok_desc(t));
        }
    }
}

static void set_err(char *err, size_t cap, const char *msg) {
    if (cap) snprintf(err, cap, "%s", msg);
}

tri_status tri__jinja_parse(const char *text, size_t len, tri__jinja **out, char *err, size_t errcap) {
    if (errcap) err[0] = 0;
    if (!out || (!text && len)) {
        set_err(err, errcap, "NULL argument");
        return TRI_STATUS_INVALID_ARGUMENT;
    }
    *out = NULL;
    tri__jinja *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errcap, "out of memory");
        return TRI_STATUS_OUT_OF_MEMORY;
    }
    failure f = {.err = err, .errcap = errcap};
    t->a.limit = (size_t)64 << 20;
    t->a.f = &f;
    if (setjmp(f.jb)) {
        arena_free(&t->a);
        free(t);
        return f.status;
    }
    // newlines as jinja2 reads them: \r\n and \r become \n, and one at the very end is dropped
    char *src = arena_alloc(&t->a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    lexer L = {.a = &t->a, .src = src, .len = n, .line = 1};
    lex(&L, &f);
    parser P = {.a = &t->a, .f = &f, .t = L.toks, .n = L.n};
    parse_body(&P, &t->body, NULL);
    t->a.f = NULL;
    *out = t;
    return TRI_STATUS_OK;
}

void tri__jinja_free(tri__jinja *t) {
    if (!t) return;
    arena_free(&t->a);
    free(t);
}

// ---- rendering: state ----

typedef struct frame {
    struct frame *parent;
    str_t *k;
    jv *v;
    size_t n, cap;
} frame;

enum { F_MACRO, F_CALLER, F_BUILTIN, F_METHOD, F_CYCLE };

typedef struct jfunc {
    int kind;
    const node *def;  // F_MACRO: the macro; F_CALLER: the call block
    frame *closure;
    jv self;  // F_METHOD: the receiver; F_CYCLE: the loop
    str_t name;
} jfunc;

typedef struct R {
    arena a;
    failure *f;
    buf *out;
    uint64_t steps, max_steps;
    int depth, max_depth;
    size_t max_output;
    int64_t now;
    frame *globals;
    int ctl;         // 1: break, 2: continue pending
    const node *at;  // the node being run, for messages
} R;

static _Noreturn void rerr(R *r, const node *x, tri_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static _Noreturn void rerr(R *r, const node *x, tri_status st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!x) x = r->at;
    fail_at(r->f, st, x ? x->line : 0, x ? x->col : 0, "%s", msg);
}

static void step(R *r, const node *x) {
    if (++r->steps > r->max_steps)
        rerr(r, x, TRI_STATUS_BAD_FORMAT, "step limit of %llu reached (a loop that does not end?)",
             (unsigned long long)r->max_steps);
}

static void frame_set(R *r, frame *fr, str_t k, jv v) {
    for (size_t i = 0; i < fr->n; i++)
        if (fr->k[i].n == k.n && memcmp(fr->k[i].s, k.s, k.n) == 0) {
            fr->v[i] = v;
            return;
        }
    if (fr->n == fr->cap) {
        size_t cap = fr->cap ? fr->cap * 2 : 8;
        str_t *nk = arena_alloc(&r->a, cap * sizeof *nk);
        jv *nv = arena_alloc(&r->a, cap * sizeof *nv);
        if (fr->n) memcpy(nk, fr->k, fr->n * sizeof *nk), memcpy(nv, fr->v, fr->n * sizeof *nv);
        fr->k = nk, fr->v = nv, fr->cap = cap;
    }
    fr->k[fr->n] = k;
    fr->v[fr->n++] = v;
}

static frame *frame_new(R *r, frame *parent) {
    frame *fr = arena_alloc(&r->a, sizeof *fr);
    memset(fr, 0, sizeof *fr);
    fr->parent = parent;
    return fr;
}

static const char *const builtins[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static jv lookup(R *r, frame *fr, str_t k) {
    for (; fr; fr = fr->parent)
        for (size_t i = fr->n; i > 0; i--)
            if (fr->k[i - 1].n == k.n && memcmp(fr->k[i - 1].s, k.s, k.n) == 0) return fr->v[i - 1];
    for (size_t i = 0; builtins[i]; i++)
        if (str_is(k, builtins[i])) {
            jfunc *fn = arena_alloc(&r->a, sizeof *fn);
            memset(fn, 0, sizeof *fn);
            fn->kind = F_BUILTIN;
            fn->name = k;
            return (jv){.t = V_FUNC, .fn = fn};
        }
    return (jv){.t = V_UNDEF, .s = k.s, .n = k.n};
}

static jv *vals(R *r, size_t n) { return arena_alloc(&r->a, (n ? n : 1) * sizeof(jv)); }

static jdict *dict_new(R *r, size_t cap) {
    jdict *d = arena_alloc(&r->a, sizeof *d);
    d->n = 0, d->cap = cap ? cap : 4;
    d->k = vals(r, d->cap);
    d->v = vals(r, d->cap);
    return d;
}

static bool equal(const jv *a, const jv *b);

static jv *dict_find(const jdict *d, const jv *k) {
    for (size_t i = 0; i < d->n; i++)
        if (equal(&d->k[i], k)) return &d->v[i];
    return NULL;
}

static void dict_set(R *r, jdict *d, jv k, jv v) {
    jv *p = dict_find(d, &k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        jv *nk = vals(r, cap), *nv = vals(r, cap);
        memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

// ---- values: Python semantics ----

static const char *type_name(const jv *v) {
    switch (v->t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_LOOP: return "LoopContext";
    default: return "function";
    }
}

static bool truthy(const jv *v) {
    switch (v->t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->n != 0;
    case V_LIST: return (v->flags & J_GEN) || v->n != 0;
    case V_DICT: return v->d->n != 0;
    default: return true;
    }
}

static bool is_num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }

static double num(const jv *v) { return v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : v->b; }

static bool equal(const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return (a->t == V_INT ? a->i : a->b) == (b->t == V_INT ? b->i : b->b);
        return num(a) == num(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case V_LIST:
        if (a->n != b->n) return false;
        for (size_t i = 0; i < a->n; i++)
            if (!equal(&a->l[i], &b->l[i])) return false;
        return true;
    case V_DICT:
        if (a->d->n != b->d->n) return false;
        for (size_t i = 0; i < a->d->n; i++) {
            jv *o = dict_find(b->d, &a->d->k[i]);
            if (!o || !equal(&a->d->v[i], o)) return false;
        }
        return true;
    default: return a->d == b->d;
    }
}

// Python's ordering of numbers, strings (by code point, which UTF-8 byte order keeps) and lists.
static int compare(R *r, const node *x, const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) {
            int64_t p = a->t == V_INT ? a->i : a->b, q = b->t == V_INT ? b->i : b->b;
            return p < q ? -1 : p > q;
        }
        double p = num(a), q = num(b);
        return p < q ? -1 : p > q;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, m);
        return c ? (c < 0 ? -1 : 1) : a->n < b->n ? -1 : a->n > b->n;
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        for (size_t i = 0; i < a->n && i < b->n; i++) {
            if (equal(&a->l[i], &b->l[i])) continue;
            return compare(r, x, &a->l[i], &b->l[i]);
        }
        return a->n < b->n ? -1 : a->n > b->n;
    }
    rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'<' not supported between instances of '%s' and '%s'", type_name(a),
         type_name(b));
}

// Python's repr of a float: the shortest digits that read back as the same double, positional
// for exponents -4..15, else d.ddde+XX.
static void put_float(R *r, buf *b, double f) {
    if (isnan(f)) return buf_puts(&r->a, b, "nan");
    if (isinf(f)) return buf_puts(&r->a, b, f < 0 ? "-inf" : "inf");
    char tmp[48];
    for (int prec = 0; prec <= 16; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int ex = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    size_t n = 0;
    if (neg) out[n++] = '-';
    if (ex >= -5 + 1 && ex < 16) {
        if (ex >= 0) {
            for (int i = 0; i <= ex; i++) out[n++] = (size_t)i < nd ? digits[i] : '0';
            out[n++] = '.';
            if ((size_t)ex + 1 >= nd) out[n++] = '0';
            for (size_t i = (size_t)ex + 1; i < nd; i++) out[n++] = digits[i];
        } else {
            out[n++] = '0', out[n++] = '.';
            for (int i = 0; i < -ex - 1; i++) out[n++] = '0';
            for (size_t i = 0; i < nd; i++) out[n++] = digits[i];
        }
        out[n] = 0;
    } else {
        out[n++] = digits[0];
        if (nd > 1) {
            out[n++] = '.';
            for (size_t i = 1; i < nd; i++) out[n++] = digits[i];
        }
        snprintf(out + n, sizeof out - n, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
    buf_puts(&r->a, b, out);
}

static void put_repr(R *r, buf *b, const jv *v);

// Python's str() of a value, as {{ v }} writes it.
static void put_str(R *r, buf *b, const jv *v) {
    if (v->t == V_LIST && (v->flags & J_GEN))
        rerr(r, NULL, TRI_STATUS_UNSUPPORTED, "writing a generator (jinja2 writes its address)");
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: buf_puts(&r->a, b, "None"); break;
    case V_BOOL: buf_puts(&r->a, b, v->b ? "True" : "False"); break;
    case V_INT: buf_printf(&r->a, b, "%lld", (long long)v->i); break;
    case V_FLOAT: put_float(r, b, v->f); break;
    case V_STR: buf_put(&r->a, b, v->s, v->n); break;
    default: put_repr(r, b, v);
    }
}

static void put_repr(R *r, buf *b, const jv *v) {
    switch (v->t) {
    case V_STR: {
        bool sq = memchr(v->s, '\'', v->n) != NULL, dq = memchr(v->s, '"', v->n) != NULL;
        char q = sq && !dq ? '"' : '\'';
        buf_put(&r->a, b, &q, 1);
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            if (c == '\\')
                buf_puts(&r->a, b, "\\\\");
            else if (c == (unsigned char)q)
                buf_printf(&r->a, b, "\\%c", q);
            else if (c == '\n')
                buf_puts(&r->a, b, "\\n");
            else if (c == '\r')
                buf_puts(&r->a, b, "\\r");
            else if (c == '\t')
                buf_puts(&r->a, b, "\\t");
            else if (c < 0x20 || c == 0x7f)
                buf_printf(&r->a, b, "\\x%02x", c);
            else
                buf_put(&r->a, b, (const char *)&c, 1);
        }
        buf_put(&r->a, b, &q, 1);
        break;
    }
    case V_LIST: {
        bool tuple = v->flags & J_TUPLE;
        buf_puts(&r->a, b, tuple ? "(" : "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) buf_puts(&r->a, b, ", ");
            put_repr(r, b, &v->l[i]);
        }
        buf_puts(&r->a, b, tuple ? (v->n == 1 ? ",)" : ")") : "]");
        break;
    }
    case V_DICT:
        buf_puts(&r->a, b, "{");
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) buf_puts(&r->a, b, ", ");
            put_repr(r, b, &v->d->k[i]);
            buf_puts(&r->a, b, ": ");
            put_repr(r, b, &v->d->v[i]);
        }
        buf_puts(&r->a, b, "}");
        break;
    case V_UNDEF: break;
    case V_NS: buf_puts(&r->a, b, "<Namespace>"); break;
    case V_LOOP: buf_puts(&r->a, b, "<LoopContext>"); break;
    case V_FUNC: buf_puts(&r->a, b, "<function>"); break;
    default: put_str(r, b, v);
    }
}

static jv to_str(R *r, const jv *v) {
    if (v->t == V_STR) return *v;
    buf b = {.limit = r->max_output};
    put_str(r, &b, v);
    return vstr(b.n ? b.p : "", b.n);
}

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort) as HF's tojson.
static void put_json(R *r, const node *x, buf *b, const jv *v, int indent, int level, const char *item_sep,
                     const char *key_sep, bool sort_keys, bool ascii) {
    if (level > r->max_depth) rerr(r, x, TRI_STATUS_BAD_FORMAT, "tojson: nested too deeply");
    switch (v->t) {
    case V_NONE: buf_puts(&r->a, b, "null"); return;
    case V_BOOL: buf_puts(&r->a, b, v->b ? "true" : "false"); return;
    case V_INT: buf_printf(&r->a, b, "%lld", (long long)v->i); return;
    case V_FLOAT:
        if (isnan(v->f))
            buf_puts(&r->a, b, "NaN");
        else if (isinf(v->f))
            buf_puts(&r->a, b, v->f < 0 ? "-Infinity" : "Infinity");
        else
            put_float(r, b, v->f);
        return;
    case V_STR:
        buf_puts(&r->a, b, "\"");
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            switch (c) {
            case '"': buf_puts(&r->a, b, "\\\""); break;
            case '\\': buf_puts(&r->a, b, "\\\\"); break;
            case '\n': buf_puts(&r->a, b, "\\n"); break;
            case '\r': buf_puts(&r->a, b, "\\r"); break;
            case '\t': buf_puts(&r->a, b, "\\t"); break;
            case '\b': buf_puts(&r->a, b, "\\b"); break;
            case '\f': buf_puts(&r->a, b, "\\f"); break;
            default:
                if (c < 0x20 || (ascii && c == 0x7f)) {
                    buf_printf(&r->a, b, "\\u%04x", c);
                } else if (ascii && c >= 0x80) {
                    // a UTF-8 sequence to \uXXXX (pairs beyond the BMP); a bad byte as itself
                    uint32_t cp = 0;
                    size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
                    if (k == 1 || i + k > v->n) {
                        buf_printf(&r->a, b, "\\u%04x", c);
                        break;
                    }
                    cp = c & (0xff >> (k + 1));
                    for (size_t j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)v->s[i + j] & 63);
                    i += k - 1;
                    if (cp >= 0x10000) {
                        cp -= 0x10000;
                        buf_printf(&r->a, b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
                    } else {
                        buf_printf(&r->a, b, "\\u%04x", cp);
                    }
                } else {
                    buf_put(&r->a, b, (const char *)&c, 1);
                }
            }
        }
        buf_puts(&r->a, b, "\"");
        return;
    case V_LIST:
    case V_DICT: {
        if (v->flags & J_GEN)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "tojson: Object of type generator is not JSON serializable");
        bool list = v->t == V_LIST;
        size_t n = list ? v->n : v->d->n;
        if (n == 0) {
            buf_puts(&r->a, b, list ? "[]" : "{}");
            return;
        }
        size_t *order = arena_alloc(&r->a, n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (!list) {
            for (size_t i = 0; i < n; i++)
                if (v->d->k[i].t != V_STR)
                    rerr(r, x, TRI_STATUS_UNSUPPORTED, "tojson: a dict key of type %s", type_name(&v->d->k[i]));
            if (sort_keys)
                for (size_t i = 1; i < n; i++)
                    for (size_t j = i; j > 0 && compare(r, x, &v->d->k[order[j - 1]], &v->d->k[order[j]]) > 0; j--) {
                        size_t t = order[j];
                        order[j] = order[j - 1], order[j - 1] = t;
                    }
        }
        buf_puts(&r->a, b, list ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i) buf_puts(&r->a, b, item_sep);
            if (indent >= 0) {
                buf_puts(&r->a, b, "\n");
                for (int s = 0; s < indent * (level + 1); s++) buf_puts(&r->a, b, " ");
            }
            if (list) {
                put_json(r, x, b, &v->l[i], indent, level + 1, item_sep, key_sep, sort_keys, ascii);
            } else {
                put_json(r, x, b, &v->d->k[order[i]], indent, level + 1, item_sep, key_sep, sort_keys, ascii);
                buf_puts(&r->a, b, key_sep);
                put_json(r, x, b, &v->d->v[order[i]], indent, level + 1, item_sep, key_sep, sort_keys, ascii);
            }
        }
        if (indent >= 0) {
            buf_puts(&r->a, b, "\n");
            for (int s = 0; s < indent * level; s++) buf_puts(&r->a, b, " ");
        }
        buf_puts(&r->a, b, list ? "]" : "}");
        return;
    }
    default:
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
}

// Code points of a UTF-8 string: byte offsets of each character (n + 1 entries).
static size_t *char_offsets(R *r, const jv *s, size_t *count) {
    size_t *off = arena_alloc(&r->a, (s->n + 1) * sizeof *off), n = 0;
    for (size_t i = 0; i < s->n; n++) {
        off[n] = i;
        unsigned char c = (unsigned char)s->s[i];
        size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        i += k;
        while (k > 1 && i > s->n) i--, k--;
    }
    off[n] = s->n;
    *count = n;
    return off;
}

// The items a for loop or a filter goes over: a list's items, a dict's keys, a string's characters.
static jv as_list(R *r, const node *x, const jv *v) {
    switch (v->t) {
    case V_LIST: return *v;
    case V_UNDEF: return (jv){.t = V_LIST, .l = NULL, .n = 0};
    case V_DICT: {
        jv *l = vals(r, v->d->n);
        memcpy(l, v->d->k, v->d->n * sizeof *l);
        return (jv){.t = V_LIST, .l = l, .n = v->d->n};
    }
    case V_STR: {
        size_t n;
        size_t *off = char_offsets(r, v, &n);
        jv *l = vals(r, n);
        for (size_t i = 0; i < n; i++) l[i] = vstr(v->s + off[i], off[i + 1] - off[i]);
        return (jv){.t = V_LIST, .l = l, .n = n};
    }
    default: rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%s' object is not iterable", type_name(v));
    }
}

static jv make_func(R *r, int kind, jv self, const char *name) {
    jfunc *fn = arena_alloc(&r->a, sizeof *fn);
    memset(fn, 0, sizeof *fn);
    fn->kind = kind;
    fn->self = self;
    fn->name = (str_t){name, strlen(name)};
    return (jv){.t = V_FUNC, .fn = fn};
}

static const char *const str_methods[] = {
    "strip",   "lstrip",     "rstrip",  "split",   "rsplit",  "startswith", "endswith", "upper",      "lower",
    "title",   "capitalize", "replace", "find",    "rfind",   "count",      "join",     "splitlines", "isdigit",
    "isalpha", "isalnum",    "isspace", "isupper", "islower", "format",     "index",    NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
// methods jinja2's immutable sandbox refuses to call (they change the object)
static const char *const mutating[] = {"append",     "pop",     "extend", "insert",  "remove", "clear",   "update",
                                       "setdefault", "popitem", "sort",   "reverse", "add",    "discard", NULL};

static bool in_names(str_t s, const char *const *names) {
    for (size_t i = 0; names[i]; i++)
        if (str_is(s, names[i])) return true;
    return false;
}

static jv getattr_(R *r, const node *x, const jv *v, str_t name);

static jv loop_attr(R *r, const node *x, const jv *v, str_t name) {
    jloop *lp = v->lp;
    int64_t i = (int64_t)lp->i, n = (int64_t)lp->n;
    if (str_is(name, "index")) return vint(i + 1);
    if (str_is(name, "index0")) return vint(i);
    if (str_is(name, "revindex")) return vint(n - i);
    if (str_is(name, "revindex0")) return vint(n - i - 1);
    if (str_is(name, "first")) return vbool(i == 0);
    if (str_is(name, "last")) return vbool(i == n - 1);
    if (str_is(name, "length")) return vint(n);
    if (str_is(name, "depth")) return vint(lp->depth + 1);
    if (str_is(name, "depth0")) return vint(lp->depth);
    if (str_is(name, "previtem")) return i > 0 ? lp->items[i - 1] : (jv){.t = V_UNDEF, .s = "previtem", .n = 8};
    if (str_is(name, "nextitem")) return i + 1 < n ? lp->items[i + 1] : (jv){.t = V_UNDEF, .s = "nextitem", .n = 8};
    if (str_is(name, "cycle")) return make_func(r, F_CYCLE, *v, "cycle");
    (void)x;
    return (jv){.t = V_UNDEF, .s = name.s, .n = name.n};
}

// obj.name: Python's attribute first (a method), then the item, as jinja2's getattr does.
static jv getattr_(R *r, const node *x, const jv *v, str_t name) {
    switch (v->t) {
    case V_UNDEF:
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%.*s' is undefined (reading its attribute '%.*s')", (int)v->n,
             v->s ? v->s : "", (int)name.n, name.s);
    case V_STR:
        if (in_names(name, str_methods)) return make_func(r, F_METHOD, *v, arena_dup(&r->a, name.s, name.n));
        if (in_names(name, mutating)) break;
        break;
    case V_DICT: {
        if (in_names(name, dict_methods)) return make_func(r, F_METHOD, *v, arena_dup(&r->a, name.s, name.n));
        if (in_names(name, mutating))
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "access to attribute '%.*s' of 'dict' object is unsafe",
                 (int)name.n, name.s);
        jv k = vstr(name.s, name.n);
        jv *p = dict_find(v->d, &k);
        if (p) return *p;
        break;
    }
    case V_NS: {
        jv k = vstr(name.s, name.n);
        jv *p = dict_find(v->d, &k);
        if (p) return *p;
        break;
    }
    case V_LIST:
        if (in_names(name, mutating))
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "access to attribute '%.*s' of 'list' object is unsafe",
                 (int)name.n, name.s);
        if (str_is(name, "index") || str_is(name, "count"))
            return make_func(r, F_METHOD, *v, arena_dup(&r->a, name.s, name.n));
        break;
    case V_LOOP: return loop_attr(r, x, v, name);
    default: break;
    }
    return (jv){.t = V_UNDEF, .s = name.s, .n = name.n};
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

// obj[key]: the item first, then the attribute.
static jv getitem(R *r, const node *x, const jv *v, const jv *k) {
    switch (v->t) {
    case V_UNDEF:
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%.*s' is undefined (reading an item of it)", (int)v->n,
             v->s ? v->s : "");
    case V_LIST:
        if (k->t == V_INT || k->t == V_BOOL) {
            int64_t i = norm_index(k->t == V_INT ? k->i : k->b, v->n);
            if (i >= 0 && (size_t)i < v->n) return v->l[i];
            return (jv){.t = V_UNDEF, .s = "list index out of range", .n = 23};
        }
        break;
    case V_STR:
        if (k->t == V_INT) {
            size_t n;
            size_t *off = char_offsets(r, v, &n);
            int64_t i = norm_index(k->i, n);
            if (i >= 0 && (size_t)i < n) return vstr(v->s + off[i], off[i + 1] - off[i]);
            return (jv){.t = V_UNDEF, .s = "string index out of range", .n = 25};
        }
        break;
    case V_DICT:
    case V_NS: {
        jv *p = dict_find(v->d, k);
        if (p) return *p;
        break;
    }
    default: break;
    }
    if (k->t == V_STR) return getattr_(r, x, v, (str_t){k->s, k->n});
    return (jv){.t = V_UNDEF, .s = "item", .n = 4};
}

static jv slice(R *r, const node *x, const jv *v, const jv *a, const jv *b, const jv *c) {
    int64_t stepv = c->t == V_NONE || c->t == V_UNDEF ? 1 : c->t == V_INT ? c->i : 0;
    if (stepv == 0) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "slice step cannot be zero or non-integer");
    for (const jv *e = a; e; e = e == a ? b : NULL)
        if (e->t != V_NONE && e->t != V_UNDEF && e->t != V_INT)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "slice indices must be integers or None");
    size_t n;
    size_t *off = NULL;
    if (v->t == V_STR)
        off = char_offsets(r, v, &n);
    else if (v->t == V_LIST)
        n = v->n;
    else  // jinja2 slices with Python's own subscript: no undefined here
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%s' object is not subscriptable", type_name(v));
    int64_t len = (int64_t)n, lo, hi;
    // Python's slice.indices
    if (stepv > 0) {
        lo = a->t == V_INT ? norm_index(a->i, n) : 0;
        hi = b->t == V_INT ? norm_index(b->i, n) : len;
        lo = lo < 0 ? 0 : lo > len ? len : lo;
        hi = hi < 0 ? 0 : hi > len ? len : hi;
    } else {
        lo = a->t == V_INT ? norm_index(a->i, n) : len - 1;
        hi = b->t == V_INT ? norm_index(b->i, n) : -1;
        lo = lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo;
        hi = hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi;
        if (b->t == V_INT && b->i < 0 && b->i + len < 0) hi = -1;
    }
    if (v->t == V_LIST) {
        jv *l = vals(r, n);
        size_t m = 0;
        for (int64_t i = lo; stepv > 0 ? i < hi : i > hi; i += stepv) l[m++] = v->l[i];
        return (jv){.t = V_LIST, .l = l, .n = m};
    }
    buf out = {.limit = r->max_output};
    for (int64_t i = lo; stepv > 0 ? i < hi : i > hi; i += stepv)
        buf_put(&r->a, &out, v->s + off[i], off[i + 1] - off[i]);
    return vstr(out.n ? out.p : "", out.n);
}

static jv from_json(R *r, struct json_object *o, int depth) {
    if (depth > 100) rerr(r, NULL, TRI_STATUS_BAD_FORMAT, "the context is nested too deeply");
    switch (json_object_get_type(o)) {
    case json_type_null: return NONE;
    case json_type_boolean: return vbool(json_object_get_boolean(o));
    case json_type_int: return vint(json_object_get_int64(o));
    case json_type_double: return vfloat(json_object_get_double(o));
    case json_type_string: return vstr(json_object_get_string(o), (size_t)json_object_get_string_len(o));
    case json_type_array: {
        size_t n = json_object_array_length(o);
        jv *l = vals(r, n);
        for (size_t i = 0; i < n; i++) l[i] = from_json(r, json_object_array_get_idx(o, i), depth + 1);
        return (jv){.t = V_LIST, .l = l, .n = n};
    }
    case json_type_object: {
        jdict *d = dict_new(r, (size_t)json_object_object_length(o));
        json_object_object_foreach(o, key, val) {
            d->k[d->n] = vcstr(key);
            d->v[d->n++] = from_json(r, val, depth + 1);
        }
        return (jv){.t = V_DICT, .d = d};
    }
    }
    return NONE;
}

// ---- rendering: expressions ----

static jv eval(R *r, frame *fr, const node *x);
static void exec_body(R *r, frame *fr, const nlist *body);

typedef struct args {
    jv *pos;
    size_t npos;
    const str_t *kwn;
    jv *kwv;
    size_t nkw;
} args;

static args eval_args(R *r, frame *fr, const node *x) {
    args a = {.npos = x->args.n, .kwn = x->kwn, .nkw = x->kw.n};
    a.pos = vals(r, a.npos);
    a.kwv = vals(r, a.nkw);
    for (size_t i = 0; i < a.npos; i++) a.pos[i] = eval(r, fr, x->args.v[i]);
    for (size_t i = 0; i < a.nkw; i++) a.kwv[i] = eval(r, fr, x->kw.v[i]);
    return a;
}

// Argument i (positional) or by name; UNDEF when not given.
static jv arg(const args *a, size_t i, const char *name) {
    if (i < a->npos) return a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (name && str_is(a->kwn[k], name)) return a->kwv[k];
    return UNDEF;
}

static bool given(const jv *v) { return v->t != V_UNDEF; }

static jv want_str(R *r, const node *x, const jv *v, const char *what) {
    if (v->t != V_STR) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "%s: want a string, got %s", what, type_name(v));
    return *v;
}

static int64_t want_int(R *r, const node *x, const jv *v, const char *what) {
    if (v->t == V_INT) return v->i;
    if (v->t == V_BOOL) return v->b;
    rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "%s: want an integer, got %s", what, type_name(v));
}

static jv concat(R *r, const jv *a, const jv *b) {
    buf o = {.limit = r->max_output};
    put_str(r, &o, a);
    put_str(r, &o, b);
    return vstr(o.n ? o.p : "", o.n);
}

static jv strip_chars(R *r, const jv *s, const jv *chars, bool left, bool right) {
    (void)r;
    size_t lo = 0, hi = s->n;
    if (!given(chars) || chars->t == V_NONE) {
        if (left) lo = spaces_at(s->s, s->n);
        if (right) hi = lo + rstrip_len(s->s + lo, s->n - lo);
    } else {
        // chars is a set of characters; ASCII-exact, multi-byte characters compared whole
        size_t nc;
        size_t *off = char_offsets(r, chars, &nc);
        size_t ns;
        size_t *so = char_offsets(r, s, &ns);
        size_t a = 0, b = ns;
        for (;;) {
            if (a >= b) break;
            bool hit = false;
            if (left) {
                for (size_t k = 0; k < nc && !hit; k++)
                    hit = off[k + 1] - off[k] == so[a + 1] - so[a] &&
                          memcmp(chars->s + off[k], s->s + so[a], so[a + 1] - so[a]) == 0;
                if (hit) {
                    a++;
                    continue;
                }
            }
            break;
        }
        for (;;) {
            if (a >= b || !right) break;
            bool hit = false;
            for (size_t k = 0; k < nc && !hit; k++)
                hit = off[k + 1] - off[k] == so[b] - so[b - 1] &&
                      memcmp(chars->s + off[k], s->s + so[b - 1], so[b] - so[b - 1]) == 0;
            if (!hit) break;
            b--;
        }
        lo = so[a], hi = so[b];
    }
    return vstr(s->s + lo, hi - lo);
}

static jv upper_lower(R *r, const jv *s, int mode) {  // 0 upper, 1 lower, 2 title, 3 capitalize
    char *o = arena_alloc(&r->a, s->n + 1);
    bool prev_alpha = false;
    for (size_t i = 0; i < s->n; i++) {
        char c = s->s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool up;
        if (mode == 0)
            up = true;
        else if (mode == 1)
            up = false;
        else if (mode == 2)
            up = !prev_alpha;
        else
            up = i == 0;
        if (alpha) c = up ? (char)(c & ~0x20) : (char)(c | 0x20);
        o[i] = c;
        prev_alpha = alpha || ((unsigned char)c >= 0x80 && mode == 2 && prev_alpha);
    }
    return vstr(o, s->n);
}

static bool has_non_ascii(const jv *s) {
    for (size_t i = 0; i < s->n; i++)
        if ((unsigned char)s->s[i] >= 0x80) return true;
    return false;
}

static jv replace_str(R *r, const jv *s, const jv *old, const jv *new_, int64_t count) {
    buf o = {.limit = r->max_output};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {
        // Python inserts new between characters and at both ends
        size_t n;
        size_t *off = char_offsets(r, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) buf_put(&r->a, &o, new_->s, new_->n), done++;
            if (k < n) buf_put(&r->a, &o, s->s + off[k], off[k + 1] - off[k]);
        }
        return vstr(o.n ? o.p : "", o.n);
    }
    while (i < s->n) {
        const char *p = (count < 0 || done < count) ? memmem(s->s + i, s->n - i, old->s, old->n) : NULL;
        if (!p) break;
        size_t at = (size_t)(p - s->s);
        buf_put(&r->a, &o, s->s + i, at - i);
        buf_put(&r->a, &o, new_->s, new_->n);
        i = at + old->n;
        done++;
    }
    buf_put(&r->a, &o, s->s + i, s->n - i);
    return vstr(o.n ? o.p : "", o.n);
}

static jv split_str(R *r, const node *x, const jv *s, const jv *sep, int64_t maxsplit) {
    size_t cap = 8, n = 0;
    jv *l = vals(r, cap);
#define PUSH(v)                            \
    do {                                   \
        if (n == cap) {                    \
            jv *nl = vals(r, cap * 2);     \
            memcpy(nl, l, n * sizeof *nl); \
            l = nl, cap *= 2;              \
        }                                  \
        l[n++] = (v);                      \
    } while (0)
    if (!given(sep) || sep->t == V_NONE) {
        size_t i = spaces_at(s->s, s->n);
        while (i < s->n) {
            if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                PUSH(vstr(s->s + i, rstrip_len(s->s + i, s->n - i)));
                break;
            }
            size_t j = i;
            while (j < s->n && !space_at((const unsigned char *)s->s + j, s->n - j)) j++;
            PUSH(vstr(s->s + i, j - i));
            i = j + spaces_at(s->s + j, s->n - j);
        }
    } else {
        jv sp = want_str(r, x, sep, "split");
        if (sp.n == 0) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "split: empty separator");
        size_t i = 0;
        for (;;) {
            const char *p = (maxsplit < 0 || (int64_t)n < maxsplit) ? memmem(s->s + i, s->n - i, sp.s, sp.n) : NULL;
            if (!p) {
                PUSH(vstr(s->s + i, s->n - i));
                break;
            }
            PUSH(vstr(s->s + i, (size_t)(p - s->s) - i));
            i = (size_t)(p - s->s) + sp.n;
        }
    }
#undef PUSH
    return (jv){.t = V_LIST, .l = l, .n = n};
}

static bool starts_ends(R *r, const node *x, const jv *s, const jv *p, bool end) {
    if (p->t == V_LIST) {
        for (size_t i = 0; i < p->n; i++)
            if (starts_ends(r, x, s, &p->l[i], end)) return true;
        return false;
    }
    jv q = want_str(r, x, p, end ? "endswith" : "startswith");
    if (q.n > s->n) return false;
    return memcmp(end ? s->s + s->n - q.n : s->s, q.s, q.n) == 0;
}

static jv str_format(R *r, const node *x, const jv *fmt, const args *a) {
    buf o = {.limit = r->max_output};
    size_t auto_i = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char c = fmt->s[i];
        if (c == '{' && i + 1 < fmt->n && fmt->s[i + 1] == '{') {
            buf_put(&r->a, &o, "{", 1), i++;
        } else if (c == '}' && i + 1 < fmt->n && fmt->s[i + 1] == '}') {
            buf_put(&r->a, &o, "}", 1), i++;
        } else if (c == '{') {
            const char *e = memchr(fmt->s + i, '}', fmt->n - i);
            if (!e) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "format: single '{' encountered in format string");
            str_t field = {fmt->s + i + 1, (size_t)(e - fmt->s) - i - 1};
            if (memchr(field.s, ':', field.n) || memchr(field.s, '!', field.n) || memchr(field.s, '.', field.n) ||
                memchr(field.s, '[', field.n))
                rerr(r, x, TRI_STATUS_UNSUPPORTED, "format: conversions and format specs are not supported");
            jv v;
            if (field.n == 0) {
                v = arg(a, auto_i++, NULL);
            } else if (is_digit(field.s[0])) {
                v = arg(a, (size_t)atoi(field.s), NULL);
            } else {
                char nm[64];
                snprintf(nm, sizeof nm, "%.*s", (int)field.n, field.s);
                v = arg(a, (size_t)-1, nm);
            }
            if (!given(&v))
                rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "format: no argument for {%.*s}", (int)field.n, field.s);
            put_str(r, &o, &v);
            i = (size_t)(e - fmt->s);
        } else if (c == '}') {
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "format: single '}' encountered in format string");
        } else {
            buf_put(&r->a, &o, &c, 1);
        }
    }
    return vstr(o.n ? o.p : "", o.n);
}

static jv call_method(R *r, const node *x, jfunc *fn, const args *a) {
    jv self = fn->self;
    str_t m = fn->name;
    jv a0 = arg(a, 0, NULL), a1 = arg(a, 1, NULL);
    if (self.t == V_DICT) {
        if (str_is(m, "get")) {
            jv *p = dict_find(self.d, &a0);
            return p ? *p : given(&a1) ? a1 : NONE;
        }
        size_t n = self.d->n;
        jv *l = vals(r, n);
        for (size_t i = 0; i < n; i++) {
            if (str_is(m, "keys")) {
                l[i] = self.d->k[i];
            } else if (str_is(m, "values")) {
                l[i] = self.d->v[i];
            } else {
                jv *pair = vals(r, 2);
                pair[0] = self.d->k[i], pair[1] = self.d->v[i];
                l[i] = (jv){.t = V_LIST, .flags = J_TUPLE, .l = pair, .n = 2};
            }
        }
        return (jv){.t = V_LIST, .l = l, .n = n};
    }
    if (self.t == V_LIST) {
        int64_t k = 0;
        for (size_t i = 0; i < self.n; i++) {
            if (!equal(&self.l[i], &a0)) continue;
            if (str_is(m, "index")) return vint((int64_t)i);
            k++;
        }
        if (str_is(m, "index")) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "list.index(x): x not in list");
        return vint(k);
    }
    // strings
    if (str_is(m, "strip")) return strip_chars(r, &self, &a0, true, true);
    if (str_is(m, "lstrip")) return strip_chars(r, &self, &a0, true, false);
    if (str_is(m, "rstrip")) return strip_chars(r, &self, &a0, false, true);
    if (str_is(m, "split")) {
        jv ms = arg(a, 1, "maxsplit");
        jv sep = arg(a, 0, "sep");
        return split_str(r, x, &self, &sep, given(&ms) ? want_int(r, x, &ms, "split") : -1);
    }
    if (str_is(m, "rsplit")) {
        jv ms = arg(a, 1, "maxsplit");
        jv sep = arg(a, 0, "sep");
        if (given(&ms) && want_int(r, x, &ms, "rsplit") >= 0)
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "rsplit with maxsplit is not supported");
        return split_str(r, x, &self, &sep, -1);
    }
    if (str_is(m, "startswith") || str_is(m, "endswith")) return vbool(starts_ends(r, x, &self, &a0, m.s[0] == 'e'));
    if (str_is(m, "upper") || str_is(m, "lower") || str_is(m, "title") || str_is(m, "capitalize")) {
        if (has_non_ascii(&self))
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "%.*s of non-ASCII text is not supported", (int)m.n, m.s);
        return upper_lower(r, &self, str_is(m, "upper") ? 0 : str_is(m, "lower") ? 1 : str_is(m, "title") ? 2 : 3);
    }
    if (str_is(m, "replace")) {
        jv o = want_str(r, x, &a0, "replace"), n = want_str(r, x, &a1, "replace");
        jv c = arg(a, 2, "count");
        return replace_str(r, &self, &o, &n, given(&c) ? want_int(r, x, &c, "replace") : -1);
    }
    if (str_is(m, "find") || str_is(m, "rfind") || str_is(m, "index") || str_is(m, "count")) {
        jv q = want_str(r, x, &a0, "find");
        if (given(&a1)) rerr(r, x, TRI_STATUS_UNSUPPORTED, "%.*s with a start is not supported", (int)m.n, m.s);
        int64_t found = -1, count = 0;
        for (size_t i = 0; i + q.n <= self.n;) {
            if (memcmp(self.s + i, q.s, q.n) == 0) {
                if (found < 0 || str_is(m, "rfind")) found = (int64_t)i;
                count++;
                i += q.n ? q.n : 1;
            } else {
                i++;
            }
        }
        if (str_is(m, "count")) return vint(count);
        if (found >= 0 && has_non_ascii(&self)) {
            size_t n = 0;
            for (int64_t i = 0; i < found; i++) n += ((unsigned char)self.s[i] & 0xc0) != 0x80;
            found = (int64_t)n;
        }
        if (found < 0 && str_is(m, "index")) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "substring not found");
        return vint(found);
    }
    if (str_is(m, "join")) {
        jv l = as_list(r, x, &a0);
        buf o = {.limit = r->max_output};
        for (size_t i = 0; i < l.n; i++) {
            if (i) buf_put(&r->a, &o, self.s, self.n);
            jv e = want_str(r, x, &l.l[i], "join");
            buf_put(&r->a, &o, e.s, e.n);
        }
        return vstr(o.n ? o.p : "", o.n);
    }
    if (str_is(m, "splitlines")) {
        jv nl = vcstr("\n");
        jv l = split_str(r, x, &self, &nl, -1);
        if (l.n && l.l[l.n - 1].n == 0) l.n--;
        return l;
    }
    if (str_is(m, "format")) return str_format(r, x, &self, a);
    if (m.n > 2 && memcmp(m.s, "is", 2) == 0) {
        if (has_non_ascii(&self))
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "%.*s of non-ASCII text is not supported", (int)m.n, m.s);
        bool ok = self.n > 0, any_cased = false;
        for (size_t i = 0; i < self.n; i++) {
            char c = self.s[i];
            bool d = is_digit(c), lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
            bool sp = c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
            any_cased |= lo || up;
            if (str_is(m, "isdigit"))
                ok &= d;
            else if (str_is(m, "isalpha"))
                ok &= lo || up;
            else if (str_is(m, "isalnum"))
                ok &= lo || up || d;
            else if (str_is(m, "isspace"))
                ok &= sp;
            else if (str_is(m, "isupper"))
                ok &= !lo;
            else
                ok &= !up;
        }
        if (str_is(m, "isupper") || str_is(m, "islower")) ok = ok && any_cased;
        return vbool(ok);
    }
    rerr(r, x, TRI_STATUS_UNSUPPORTED, "method '%.*s' is not supported", (int)m.n, m.s);
}

static jv render_to_string(R *r, frame *fr, const nlist *body) {
    buf o = {.limit = r->max_output};
    buf *saved = r->out;
    r->out = &o;
    exec_body(r, fr, body);
    r->out = saved;
    return vstr(o.n ? o.p : "", o.n);
}

static jv call_macro(R *r, const node *x, jfunc *fn, const args *a, jfunc *caller) {
    const node *m = fn->def;
    if (++r->depth > r->max_depth) rerr(r, x, TRI_STATUS_BAD_FORMAT, "calls nested too deeply (over %d)", r->max_depth);
    frame *f = frame_new(r, fn->closure);
    if (a->npos > m->nnames)
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "macro '%.*s' takes not more than %zu argument(s)", (int)m->name.n,
             m->name.s, m->nnames);
    for (size_t i = 0; i < m->nnames; i++) {
        jv v = i < a->npos ? a->pos[i] : UNDEF;
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kwn[k].n == m->names[i].n && memcmp(a->kwn[k].s, m->names[i].s, a->kwn[k].n) == 0) v = a->kwv[k];
        if (!given(&v)) {
            if (m->args.v[i])
                v = eval(r, f, m->args.v[i]);
            else
                v = (jv){.t = V_UNDEF, .s = m->names[i].s, .n = m->names[i].n};
        }
        frame_set(r, f, m->names[i], v);
    }
    for (size_t k = 0; k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->nnames; i++)
            known |= a->kwn[k].n == m->names[i].n && memcmp(a->kwn[k].s, m->names[i].s, a->kwn[k].n) == 0;
        if (!known)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->name.n,
                 m->name.s, (int)a->kwn[k].n, a->kwn[k].s);
    }
    if (caller) frame_set(r, f, (str_t){"caller", 6}, (jv){.t = V_FUNC, .fn = caller});
    int ctl = r->ctl;
    jv out = render_to_string(r, f, &m->body);
    r->ctl = ctl;
    r->depth--;
    return out;
}

static jv call_builtin(R *r, const node *x, jfunc *fn, const args *a) {
    str_t nm = fn->name;
    if (str_is(nm, "range")) {
        int64_t lo = 0, hi, st = 1;
        if (a->npos == 1)
            hi = want_int(r, x, &a->pos[0], "range");
        else if (a->npos == 2 || a->npos == 3) {
            lo = want_int(r, x, &a->pos[0], "range");
            hi = want_int(r, x, &a->pos[1], "range");
            if (a->npos == 3) st = want_int(r, x, &a->pos[2], "range");
        } else
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "range expected 1 to 3 arguments, got %zu", a->npos);
        if (st == 0) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "range() arg 3 must not be zero");
        int64_t n = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
        if (n > 100000)
            rerr(r, x, TRI_STATUS_BAD_FORMAT, "range() too big: %lld items (the sandbox allows 100000)", (long long)n);
        jv *l = vals(r, (size_t)n);
        for (int64_t i = 0; i < n; i++) l[i] = vint(lo + i * st);
        return (jv){.t = V_LIST, .l = l, .n = (size_t)n};
    }
    if (str_is(nm, "namespace") || str_is(nm, "dict")) {
        jdict *d = dict_new(r, a->nkw + 4);
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_DICT)
                rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "%.*s: positional arguments must be dicts", (int)nm.n, nm.s);
            for (size_t k = 0; k < a->pos[i].d->n; k++) dict_set(r, d, a->pos[i].d->k[k], a->pos[i].d->v[k]);
        }
        for (size_t i = 0; i < a->nkw; i++) dict_set(r, d, vstr(a->kwn[i].s, a->kwn[i].n), a->kwv[i]);
        return (jv){.t = str_is(nm, "dict") ? V_DICT : V_NS, .d = d};
    }
    if (str_is(nm, "raise_exception")) {
        jv m = a->npos ? to_str(r, &a->pos[0]) : vcstr("");
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "raise_exception: %.*s", (int)m.n, m.s);
    }
    // strftime_now(format): the render's time in UTC
    jv f = want_str(r, x, &a->pos[a->npos ? 0 : 0], "strftime_now");
    if (!a->npos) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "strftime_now takes a format");
    for (size_t i = 0; i + 1 < f.n; i++)
        if (f.s[i] == '%' && !strchr("dbBYmyHMSaAjpIe%", f.s[i + 1]))
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "strftime_now: conversion %%%c is not supported", f.s[i + 1]);
    time_t t = (time_t)r->now;
    struct tm tm;
    gmtime_r(&t, &tm);
    char *fmt = arena_dup(&r->a, f.s, f.n);
    char out[512];
    size_t n = f.n ? strftime(out, sizeof out, fmt, &tm) : 0;
    if (f.n && n == 0) rerr(r, x, TRI_STATUS_UNSUPPORTED, "strftime_now: the result is too long");
    return vstr(arena_dup(&r->a, out, n), n);
}

static jv call(R *r, const node *x, const jv *fv, const args *a, jfunc *caller) {
    if (fv->t != V_FUNC) {
        if (fv->t == V_UNDEF)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%.*s' is undefined", (int)fv->n, fv->s ? fv->s : "");
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%s' object is not callable", type_name(fv));
    }
    jfunc *fn = fv->fn;
    switch (fn->kind) {
    case F_MACRO: return call_macro(r, x, fn, a, caller);
    case F_CALLER: {
        jfunc m = *fn;  // the call block's body as a macro of its parameters
        return call_macro(r, x, &m, a, NULL);
    }
    case F_BUILTIN: return call_builtin(r, x, fn, a);
    case F_CYCLE:
        if (!a->npos) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "no items for cycling given");
        return a->pos[fn->self.lp->i % a->npos];
    default: return call_method(r, x, fn, a);
    }
}

// ---- rendering: filters and tests ----

static bool test(R *r, const node *x, str_t name, const jv *v, const args *a);
static jv html_escape(R *r, const jv *v);

static jv attr_path(R *r, const node *x, const jv *v, const jv *attr) {
    jv s = want_str(r, x, attr, "attribute");
    jv cur_ = *v;
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(s.s + i, '.', s.n - i);
        size_t e = dot ? (size_t)(dot - s.s) : s.n;
        jv k = vstr(s.s + i, e - i);
        if (e > i && is_digit(s.s[i])) k = vint(atoll(k.s));
        cur_ = getitem(r, x, &cur_, &k);
        if (!dot) return cur_;
        i = e + 1;
    }
}

static void sort_values(R *r, const node *x, jv *keys, jv *items, size_t n, bool reverse, bool icase) {
    // a stable insertion sort (Python's sort is stable); templates sort a handful of items
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            jv ka = keys[j - 1], kb = keys[j];
            if (icase && ka.t == V_STR && !has_non_ascii(&ka)) ka = upper_lower(r, &ka, 1);
            if (icase && kb.t == V_STR && !has_non_ascii(&kb)) kb = upper_lower(r, &kb, 1);
            int c = compare(r, x, &ka, &kb);
            if (reverse ? c >= 0 : c <= 0) break;
            jv t = keys[j];
            keys[j] = keys[j - 1], keys[j - 1] = t;
            t = items[j];
            items[j] = items[j - 1], items[j - 1] = t;
        }
}

static jv filter(R *r, frame *fr, const node *x, str_t nm, jv v, const args *a) {
    (void)fr;
    jv a0 = arg(a, 0, NULL);
    if (str_is(nm, "safe")) {
        jv s = to_str(r, &v);
        s.flags |= J_SAFE;
        return s;
    }
    if (str_is(nm, "tojson")) {
        jv ind = arg(a, 0, "indent"), seps = arg(a, (size_t)-1, "separators"), sk = arg(a, (size_t)-1, "sort_keys"),
           asc = arg(a, (size_t)-1, "ensure_ascii");
        int indent = given(&ind) && ind.t != V_NONE ? (int)want_int(r, x, &ind, "tojson indent") : -1;
        if (indent > 64) rerr(r, x, TRI_STATUS_UNSUPPORTED, "tojson: indent over 64");
        const char *is = indent >= 0 ? "," : ", ", *ks = ": ";
        if (given(&seps) && seps.t != V_NONE) {
            if (seps.t != V_LIST || seps.n != 2 || seps.l[0].t != V_STR || seps.l[1].t != V_STR)
                rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "tojson: separators must be two strings");
            is = arena_dup(&r->a, seps.l[0].s, seps.l[0].n);
            ks = arena_dup(&r->a, seps.l[1].s, seps.l[1].n);
        }
        buf o = {.limit = r->max_output};
        put_json(r, x, &o, &v, indent, 0, is, ks, given(&sk) && truthy(&sk), given(&asc) && truthy(&asc));
        return vstr(o.n ? o.p : "", o.n);
    }
    if (str_is(nm, "length") || str_is(nm, "count")) {
        if (v.t == V_STR) {
            size_t n;
            char_offsets(r, &v, &n);
            return vint((int64_t)n);
        }
        if (v.t == V_LIST && (v.flags & J_GEN))
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "object of type 'generator' has no len()");
        if (v.t == V_LIST) return vint((int64_t)v.n);
        if (v.t == V_DICT) return vint((int64_t)v.d->n);
        if (v.t == V_UNDEF) return vint(0);
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "object of type '%s' has no len()", type_name(&v));
    }
    if (str_is(nm, "string")) return to_str(r, &v);
    if (str_is(nm, "trim")) {
        jv s = to_str(r, &v);
        return strip_chars(r, &s, &a0, true, true);
    }
    if (str_is(nm, "default") || str_is(nm, "d")) {
        jv b = arg(a, 1, "boolean");
        bool use = given(&b) && truthy(&b) ? !truthy(&v) : v.t == V_UNDEF;
        if (!use) return v;
        jv dv = arg(a, 0, "default_value");
        return given(&dv) ? dv : vstr("", 0);
    }
    if (str_is(nm, "upper") || str_is(nm, "lower") || str_is(nm, "title") || str_is(nm, "capitalize")) {
        jv s = to_str(r, &v);
        if (has_non_ascii(&s))
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "%.*s of non-ASCII text is not supported", (int)nm.n, nm.s);
        if (str_is(nm, "capitalize")) {
            jv low = upper_lower(r, &s, 1);
            if (low.n) ((char *)low.s)[0] = (char)(low.s[0] >= 'a' && low.s[0] <= 'z' ? low.s[0] & ~0x20 : low.s[0]);
            return low;
        }
        if (str_is(nm, "title")) {
            // jinja2's do_title: words begin after runs of whitespace, '-', '(', '{', '[', '<'
            char *o = arena_alloc(&r->a, s.n + 1);
            bool start = true;
            for (size_t i = 0; i < s.n; i++) {
                char c = s.s[i];
                bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' ||
                           (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
                if (sep) o[i] = c;
                else if (start) o[i] = (char)(c >= 'a' && c <= 'z' ? c & ~0x20 : c);
                else o[i] = (char)(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
                start = sep;
            }
            return vstr(o, s.n);
        }
        return upper_lower(r, &s, str_is(nm, "upper") ? 0 : 1);
    }
    if (str_is(nm, "replace")) {
        jv s = to_str(r, &v), o = to_str(r, &a0), n0 = arg(a, 1, "new"), n = to_str(r, &n0);
        jv c = arg(a, 2, "count");
        return replace_str(r, &s, &o, &n, given(&c) && c.t != V_NONE ? want_int(r, x, &c, "replace") : -1);
    }
    if (str_is(nm, "join")) {
        jv l = as_list(r, x, &v);
        jv sep = arg(a, 0, "d"), at = arg(a, 1, "attribute");
        buf o = {.limit = r->max_output};
        for (size_t i = 0; i < l.n; i++) {
            if (i && given(&sep)) put_str(r, &o, &sep);
            jv e = given(&at) ? attr_path(r, x, &l.l[i], &at) : l.l[i];
            put_str(r, &o, &e);
        }
        return vstr(o.n ? o.p : "", o.n);
    }
    if (str_is(nm, "items")) {
        if (v.t == V_UNDEF) return (jv){.t = V_LIST, .n = 0};
        if (v.t != V_DICT) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "items: can only get item pairs from a mapping");
        jfunc fn = {.kind = F_METHOD, .self = v, .name = {"items", 5}};
        args none = {0};
        jv l = call_method(r, x, &fn, &none);
        l.flags = J_GEN;
        return l;
    }
    if (str_is(nm, "list")) {
        jv l = as_list(r, x, &v);
        l.flags = 0;
        return l;
    }
    if (str_is(nm, "first") || str_is(nm, "last")) {
        jv l = as_list(r, x, &v);
        if (!l.n) return (jv){.t = V_UNDEF, .s = "first", .n = 5};
        return nm.s[0] == 'f' ? l.l[0] : l.l[l.n - 1];
    }
    if (str_is(nm, "reverse")) {
        if (v.t == V_STR) {
            jv none = UNDEF, m1 = vint(-1);
            return slice(r, x, &v, &none, &none, &m1);
        }
        jv l = as_list(r, x, &v);
        jv *o = vals(r, l.n);
        for (size_t i = 0; i < l.n; i++) o[i] = l.l[l.n - 1 - i];
        return (jv){.t = V_LIST, .flags = J_GEN, .l = o, .n = l.n};
    }
    if (str_is(nm, "dictsort")) {
        if (v.t != V_DICT) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "dictsort: want a dict");
        jv cs = arg(a, 0, "case_sensitive"), by = arg(a, 1, "by"), rev = arg(a, 2, "reverse");
        bool by_value = given(&by) && by.t == V_STR && by.n == 5 && memcmp(by.s, "value", 5) == 0;
        size_t n = v.d->n;
        jv *keys = vals(r, n), *items = vals(r, n);
        for (size_t i = 0; i < n; i++) {
            jv *pair = vals(r, 2);
            pair[0] = v.d->k[i], pair[1] = v.d->v[i];
            items[i] = (jv){.t = V_LIST, .flags = J_TUPLE, .l = pair, .n = 2};
            keys[i] = by_value ? v.d->v[i] : v.d->k[i];
        }
        sort_values(r, x, keys, items, n, given(&rev) && truthy(&rev), !(given(&cs) && truthy(&cs)));
        return (jv){.t = V_LIST, .l = items, .n = n};
    }
    if (str_is(nm, "sort")) {
        jv l = as_list(r, x, &v);
        jv rev = arg(a, 0, "reverse"), cs = arg(a, 1, "case_sensitive"), at = arg(a, 2, "attribute");
        jv *keys = vals(r, l.n), *items = vals(r, l.n);
        for (size_t i = 0; i < l.n; i++)
            items[i] = l.l[i], keys[i] = given(&at) ? attr_path(r, x, &l.l[i], &at) : l.l[i];
        sort_values(r, x, keys, items, l.n, given(&rev) && truthy(&rev), !(given(&cs) && truthy(&cs)));
        return (jv){.t = V_LIST, .l = items, .n = l.n};
    }
    if (str_is(nm, "unique")) {
        jv l = as_list(r, x, &v);
        jv *o = vals(r, l.n);
        size_t n = 0;
        for (size_t i = 0; i < l.n; i++) {
            bool dup = false;
            for (size_t k = 0; k < n && !dup; k++) {
                jv p = o[k], q = l.l[i];
                if (p.t == V_STR && q.t == V_STR && !has_non_ascii(&p) && !has_non_ascii(&q))
                    p = upper_lower(r, &p, 1), q = upper_lower(r, &q, 1);
                dup = equal(&p, &q);
            }
            if (!dup) o[n++] = l.l[i];
        }
        return (jv){.t = V_LIST, .flags = J_GEN, .l = o, .n = n};
    }
    if (str_is(nm, "min") || str_is(nm, "max")) {
        jv l = as_list(r, x, &v);
        if (!l.n) return (jv){.t = V_UNDEF, .s = "min", .n = 3};
        size_t best = 0;
        for (size_t i = 1; i < l.n; i++) {
            int c = compare(r, x, &l.l[i], &l.l[best]);
            if (nm.s[1] == 'i' ? c < 0 : c > 0) best = i;
        }
        return l.l[best];
    }
    if (str_is(nm, "int")) {
        if (v.t == V_INT) return v;
        if (v.t == V_BOOL) return vint(v.b);
        if (v.t == V_FLOAT) return vint((int64_t)v.f);
        if (v.t == V_STR) {
            char *s = arena_dup(&r->a, v.s, v.n), *e;
            long long k = strtoll(s, &e, 10);
            if (e != s && *e == 0) return vint(k);
            double d = strtod(s, &e);
            if (e != s && *e == 0) return vint((int64_t)d);
        }
        return given(&a0) ? a0 : vint(0);
    }
    if (str_is(nm, "float")) {
        if (is_num(&v)) return vfloat(num(&v));
        if (v.t == V_STR) {
            char *s = arena_dup(&r->a, v.s, v.n), *e;
            double d = strtod(s, &e);
            if (e != s && *e == 0) return vfloat(d);
        }
        return given(&a0) ? a0 : vfloat(0);
    }
    if (str_is(nm, "abs")) {
        if (v.t == V_INT) return vint(v.i < 0 ? -v.i : v.i);
        if (v.t == V_FLOAT) return vfloat(fabs(v.f));
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "bad operand type for abs(): '%s'", type_name(&v));
    }
    if (str_is(nm, "indent")) {
        if (v.t != V_STR)  // jinja2 3.1 appends "\n" to the value itself
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "indent: unsupported operand type(s) for +=: '%s' and 'str'",
                 type_name(&v));
        jv s = to_str(r, &v), w = arg(a, 0, "width"), first = arg(a, 1, "first"), blank = arg(a, 2, "blank");
        buf pad = {.limit = r->max_output};
        if (!given(&w))
            pad.n = 0, buf_puts(&r->a, &pad, "    ");
        else if (w.t == V_STR)
            put_str(r, &pad, &w);
        else
            for (int64_t i = want_int(r, x, &w, "indent"); i > 0; i--) buf_puts(&r->a, &pad, " ");
        buf o = {.limit = r->max_output};
        // jinja2: s += "\n" (lines joined back), each line after the first indented unless blank
        bool ind_first = given(&first) && truthy(&first), ind_blank = given(&blank) && truthy(&blank);
        jv nl = vcstr("\n");
        jv text = concat(r, &s, &nl);
        jv lines = split_str(r, x, &text, &nl, -1);  // the last is the empty rest after "\n"
        // Python's splitlines() also splits at \r, \v, \f, \x1c-\x1e, \x85, U+2028/9; take \n only
        for (size_t i = 0; i + 1 < lines.n; i++) {
            if (i) buf_puts(&r->a, &o, "\n");
            bool blank_line = lines.l[i].n == 0 || spaces_at(lines.l[i].s, lines.l[i].n) == lines.l[i].n;
            if ((i > 0 || ind_first) && (ind_blank || !blank_line)) buf_put(&r->a, &o, pad.p, pad.n);
            buf_put(&r->a, &o, lines.l[i].s, lines.l[i].n);
        }
        for (size_t i = 0; i < s.n; i++)
            if (strchr("\r\v\f\x1c\x1d\x1e", s.s[i]) && s.s[i])
                rerr(r, x, TRI_STATUS_UNSUPPORTED, "indent: line breaks other than \\n are not supported");
        return vstr(o.n ? o.p : "", o.n);
    }
    if (str_is(nm, "e") || str_is(nm, "escape")) {
        if (v.t == V_STR && (v.flags & J_SAFE)) return v;
        jv s = html_escape(r, &v);
        s.flags = J_SAFE;
        return s;
    }
    if (str_is(nm, "attr")) return getattr_(r, x, &v, (str_t){want_str(r, x, &a0, "attr").s, a0.n});
    if (str_is(nm, "map")) {
        jv l = truthy(&v) ? as_list(r, x, &v) : (jv){.t = V_LIST};  // jinja2: "if seq:" first
        jv at = arg(a, (size_t)-1, "attribute"), dflt = arg(a, (size_t)-1, "default");
        jv *o = vals(r, l.n);
        if (given(&at)) {
            for (size_t i = 0; i < l.n; i++) {
                o[i] = attr_path(r, x, &l.l[i], &at);
                if (o[i].t == V_UNDEF && given(&dflt)) o[i] = dflt;
            }
        } else {
            jv fname = want_str(r, x, &a0, "map");
            str_t f = {fname.s, fname.n};
            bool known = false;
            for (size_t i = 0; i < sizeof filters_known / sizeof *filters_known; i++)
                known |= str_is(f, filters_known[i]);
            for (size_t i = 0; i < sizeof filters_missing / sizeof *filters_missing; i++)
                if (str_is(f, filters_missing[i])) known = false;
            if (!known || str_is(f, "map"))
                rerr(r, x, TRI_STATUS_UNSUPPORTED, "map: filter '%.*s' is not supported", (int)f.n, f.s);
            args rest = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
            for (size_t i = 0; i < l.n; i++) o[i] = filter(r, fr, x, f, l.l[i], &rest);
        }
        return (jv){.t = V_LIST, .flags = J_GEN, .l = o, .n = l.n};
    }
    if (str_is(nm, "select") || str_is(nm, "reject") || str_is(nm, "selectattr") || str_is(nm, "rejectattr")) {
        bool attr = nm.n > 6, keep = nm.s[0] == 's';
        jv l = truthy(&v) ? as_list(r, x, &v) : (jv){.t = V_LIST};
        size_t first = attr ? 1 : 0;
        jv at = attr ? want_str(r, x, &a0, nm.s) : UNDEF;
        jv tname = arg(a, first, NULL);
        args rest = {.pos = a->pos + (a->npos > first + 1 ? first + 1 : a->npos),
                     .npos = a->npos > first + 1 ? a->npos - first - 1 : 0};
        jv *o = vals(r, l.n);
        size_t n = 0;
        for (size_t i = 0; i < l.n; i++) {
            jv e = attr ? attr_path(r, x, &l.l[i], &at) : l.l[i];
            bool ok;
            if (!given(&tname)) {
                ok = truthy(&e);
            } else {
                jv t = want_str(r, x, &tname, nm.s);
                str_t tn = {t.s, t.n};
                bool known = false;
                for (size_t k = 0; k < sizeof tests_known / sizeof *tests_known; k++)
                    known |= str_is(tn, tests_known[k]);
                if (!known) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "no test named '%.*s'", (int)tn.n, tn.s);
                ok = test(r, x, tn, &e, &rest);
            }
            if (ok == keep) o[n++] = l.l[i];
        }
        return (jv){.t = V_LIST, .flags = J_GEN, .l = o, .n = n};
    }
    bool known = false;
    for (size_t i = 0; i < sizeof filters_known / sizeof *filters_known; i++) known |= str_is(nm, filters_known[i]);
    if (!known) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "no filter named '%.*s'", (int)nm.n, nm.s);
    rerr(r, x, TRI_STATUS_UNSUPPORTED, "filter '%.*s' is not supported", (int)nm.n, nm.s);
}

static bool test(R *r, const node *x, str_t nm, const jv *v, const args *a) {
    jv a0 = arg(a, 0, NULL);
    bool known = false;
    for (size_t i = 0; i < sizeof tests_known / sizeof *tests_known; i++) known |= str_is(nm, tests_known[i]);
    if (!known) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "no test named '%.*s'", (int)nm.n, nm.s);
    if (str_is(nm, "defined")) return v->t != V_UNDEF;
    if (str_is(nm, "undefined")) return v->t == V_UNDEF;
    if (str_is(nm, "none")) return v->t == V_NONE;
    if (str_is(nm, "string")) return v->t == V_STR;
    if (str_is(nm, "mapping")) return v->t == V_DICT;
    if (str_is(nm, "iterable")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    if (str_is(nm, "sequence")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT;
    if (str_is(nm, "number")) return is_num(v);
    if (str_is(nm, "integer")) return v->t == V_INT;
    if (str_is(nm, "float")) return v->t == V_FLOAT;
    if (str_is(nm, "boolean")) return v->t == V_BOOL;
    if (str_is(nm, "true")) return v->t == V_BOOL && v->b;
    if (str_is(nm, "false")) return v->t == V_BOOL && !v->b;
    if (str_is(nm, "callable")) return v->t == V_FUNC;
    if (str_is(nm, "odd") || str_is(nm, "even")) {
        int64_t k = want_int(r, x, v, "odd/even");
        return (k % 2 != 0) == (nm.s[0] == 'o');
    }
    if (str_is(nm, "divisibleby")) {
        int64_t d = want_int(r, x, &a0, "divisibleby");
        if (!d) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "integer division or modulo by zero");
        return want_int(r, x, v, "divisibleby") % d == 0;
    }
    if (str_is(nm, "lower") || str_is(nm, "upper")) {
        if (v->t != V_STR) return false;
        jfunc fn = {
            .kind = F_METHOD, .self = *v, .name = nm.s[0] == 'l' ? (str_t){"islower", 7} : (str_t){"isupper", 7}};
        args none = {0};
        jv res = call_method(r, x, &fn, &none);
        return res.b;
    }
    if (str_is(nm, "sameas")) return equal(v, &a0) && v->t == a0.t;
    if (str_is(nm, "in")) {
        if (a0.t == V_STR) {
            jv s = want_str(r, x, v, "in");
            return s.n == 0 || memmem(a0.s, a0.n, s.s, s.n) != NULL;
        }
        jv l = as_list(r, x, &a0);
        for (size_t i = 0; i < l.n; i++)
            if (equal(&l.l[i], v)) return true;
        return false;
    }
    if (str_is(nm, "eq") || str_is(nm, "equalto") || str_is(nm, "==")) return equal(v, &a0);
    if (str_is(nm, "ne") || str_is(nm, "!=")) return !equal(v, &a0);
    int c = compare(r, x, v, &a0);
    if (str_is(nm, "lt") || str_is(nm, "<") || str_is(nm, "lessthan")) return c < 0;
    if (str_is(nm, "gt") || str_is(nm, ">") || str_is(nm, "greaterthan")) return c > 0;
    if (str_is(nm, "le") || str_is(nm, "<=")) return c <= 0;
    return c >= 0;
}

// ---- rendering: the tree ----

static _Noreturn void undefined_err(R *r, const node *x, const jv *v) {
    rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'%.*s' is undefined", (int)v->n, v->s ? v->s : "");
}

static jv html_escape(R *r, const jv *v) {
    jv s = to_str(r, v);
    buf o = {.limit = r->max_output};
    for (size_t i = 0; i < s.n; i++) {
        switch (s.s[i]) {
        case '&': buf_puts(&r->a, &o, "&amp;"); break;
        case '<': buf_puts(&r->a, &o, "&lt;"); break;
        case '>': buf_puts(&r->a, &o, "&gt;"); break;
        case '"': buf_puts(&r->a, &o, "&#34;"); break;
        case '\'': buf_puts(&r->a, &o, "&#39;"); break;
        default: buf_put(&r->a, &o, &s.s[i], 1);
        }
    }
    return vstr(o.n ? o.p : "", o.n);
}

static jv arith(R *r, const node *x, int op, const jv *a, const jv *b) {
    if (a->t == V_UNDEF) undefined_err(r, x, a);
    if (b->t == V_UNDEF) undefined_err(r, x, b);
    if (is_num(a) && is_num(b)) {
        bool ints = a->t != V_FLOAT && b->t != V_FLOAT;
        // (the integer operands, read only when ints: a float's union member is not a bool)
        int64_t p = a->t == V_INT ? a->i : a->t == V_BOOL ? a->b : 0;
        int64_t q = b->t == V_INT ? b->i : b->t == V_BOOL ? b->b : 0, res;
        double f = num(a), g = num(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return vfloat(f + g);
            if (__builtin_add_overflow(p, q, &res)) break;
            return vint(res);
        case OP_SUB:
            if (!ints) return vfloat(f - g);
            if (__builtin_sub_overflow(p, q, &res)) break;
            return vint(res);
        case OP_MUL:
            if (!ints) return vfloat(f * g);
            if (__builtin_mul_overflow(p, q, &res)) break;
            return vint(res);
        case OP_DIV:
            if (g == 0) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "division by zero");
            return vfloat(f / g);
        case OP_FLOORDIV:
        case OP_MOD:
            if (g == 0) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "integer division or modulo by zero");
            if (ints) {
                if (p == INT64_MIN && q == -1) break;
                int64_t d = p / q, m = p % q;
                if (m != 0 && ((m < 0) != (q < 0))) d--, m += q;
                return vint(op == OP_MOD ? m : d);
            } else {
                double d = floor(f / g), m = fmod(f, g);
                if (m != 0 && ((m < 0) != (g < 0))) m += g;
                return vfloat(op == OP_MOD ? m : d);
            }
        case OP_POW:
            if (ints && q >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < q; i++)
                    if (__builtin_mul_overflow(acc, p, &acc)) rerr(r, x, TRI_STATUS_UNSUPPORTED, "integer too large");
                return vint(acc);
            }
            return vfloat(pow(f, g));
        }
        rerr(r, x, TRI_STATUS_UNSUPPORTED, "integer overflow (Python's integers are unbounded; these are 64-bit)");
    }
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        if (!((a->flags | b->flags) & J_SAFE)) return concat(r, a, b);
        // markupsafe: Markup + str escapes the str, and the sum is Markup
        jv p = a->flags & J_SAFE ? *a : html_escape(r, a), q = b->flags & J_SAFE ? *b : html_escape(r, b);
        jv s = concat(r, &p, &q);
        s.flags = J_SAFE;
        return s;
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST) {
        jv *l = vals(r, a->n + b->n);
        memcpy(l, a->l, a->n * sizeof *l);
        if (b->n) memcpy(l + a->n, b->l, b->n * sizeof *l);
        return (jv){.t = V_LIST, .l = l, .n = a->n + b->n};
    }
    if (op == OP_MUL && (a->t == V_STR || a->t == V_LIST) && (b->t == V_INT || b->t == V_BOOL)) {
        int64_t k = b->t == V_INT ? b->i : b->b;
        if (k < 0) k = 0;
        if (a->t == V_STR) {
            buf o = {.limit = r->max_output};
            for (int64_t i = 0; i < k; i++) buf_put(&r->a, &o, a->s, a->n);
            return vstr(o.n ? o.p : "", o.n);
        }
        if (a->n && (uint64_t)k > r->max_output / a->n) rerr(r, x, TRI_STATUS_BAD_FORMAT, "list repetition too large");
        jv *l = vals(r, a->n * (size_t)k);
        for (int64_t i = 0; i < k; i++) memcpy(l + (size_t)i * a->n, a->l, a->n * sizeof *l);
        return (jv){.t = V_LIST, .l = l, .n = a->n * (size_t)k};
    }
    if (op == OP_MOD && a->t == V_STR) rerr(r, x, TRI_STATUS_UNSUPPORTED, "string formatting with %% is not supported");
    static const char *const syms[] = {"+", "-", "*", "/", "//", "%", "**"};
    rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "unsupported operand type(s) for %s: '%s' and '%s'", syms[op], type_name(a),
         type_name(b));
}

static bool contains(R *r, const node *x, const jv *hay, const jv *needle) {
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "'in <string>' requires string as left operand, not %s",
                 type_name(needle));
        return needle->n == 0 || memmem(hay->s, hay->n, needle->s, needle->n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay->n; i++)
            if (equal(&hay->l[i], needle)) return true;
        return false;
    case V_DICT:
    case V_NS: return dict_find(hay->d, needle) != NULL;
    case V_UNDEF: return false;
    default: rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static jv eval(R *r, frame *fr, const node *x) {
    step(r, x);
    if (++r->depth > r->max_depth)
        rerr(r, x, TRI_STATUS_BAD_FORMAT, "nested too deeply (over %d levels)", r->max_depth);
    jv v;
    switch (x->kind) {
    case E_LIT: v = x->val; break;
    case E_NAME: v = lookup(r, fr, x->name); break;
    case E_ATTR: {
        jv o = eval(r, fr, x->a);
        v = getattr_(r, x, &o, x->name);
        break;
    }
    case E_ITEM: {
        jv o = eval(r, fr, x->a), k = eval(r, fr, x->b);
        v = getitem(r, x, &o, &k);
        break;
    }
    case E_SLICE: {
        jv o = eval(r, fr, x->a), p[3];
        for (int i = 0; i < 3; i++) p[i] = x->args.v[i] ? eval(r, fr, x->args.v[i]) : NONE;
        if (o.t == V_UNDEF) undefined_err(r, x, &o);
        v = slice(r, x, &o, &p[0], &p[1], &p[2]);
        break;
    }
    case E_CALL: {
        jv f = eval(r, fr, x->a);
        args a = eval_args(r, fr, x);
        v = call(r, x, &f, &a, NULL);
        break;
    }
    case E_FILTER: {
        jv in = eval(r, fr, x->a);
        args a = eval_args(r, fr, x);
        v = filter(r, fr, x, x->name, in, &a);
        break;
    }
    case E_TEST: {
        jv in = eval(r, fr, x->a);
        args a = eval_args(r, fr, x);
        v = vbool(test(r, x, x->name, &in, &a) != x->neg);
        break;
    }
    case E_NEG:
    case E_POS: {
        jv o = eval(r, fr, x->a);
        if (o.t == V_UNDEF) undefined_err(r, x, &o);
        if (!is_num(&o))
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "bad operand type for unary %c: '%s'", x->kind == E_NEG ? '-' : '+',
                 type_name(&o));
        if (x->kind == E_POS)
            v = o.t == V_BOOL ? vint(o.b) : o;
        else if (o.t == V_FLOAT)
            v = vfloat(-o.f);
        else if (o.t == V_INT && o.i == INT64_MIN)
            rerr(r, x, TRI_STATUS_UNSUPPORTED, "integer overflow");
        else
            v = vint(-(o.t == V_INT ? o.i : o.b));
        break;
    }
    case E_NOT: {
        jv o = eval(r, fr, x->a);
        v = vbool(!truthy(&o));
        break;
    }
    case E_AND: {
        jv o = eval(r, fr, x->a);
        v = truthy(&o) ? eval(r, fr, x->b) : o;
        break;
    }
    case E_OR: {
        jv o = eval(r, fr, x->a);
        v = truthy(&o) ? o : eval(r, fr, x->b);
        break;
    }
    case E_COND: {
        jv c = eval(r, fr, x->a);
        if (truthy(&c))
            v = eval(r, fr, x->b);
        else if (x->c)
            v = eval(r, fr, x->c);
        else
            v = (jv){.t = V_UNDEF, .s = "the else branch", .n = 15};
        break;
    }
    case E_BIN: {
        jv a = eval(r, fr, x->a), b = eval(r, fr, x->b);
        switch (x->op) {
        case OP_CONCAT: v = concat(r, &a, &b); break;
        case OP_EQ: v = vbool(equal(&a, &b)); break;
        case OP_NE: v = vbool(!equal(&a, &b)); break;
        case OP_LT: v = vbool(compare(r, x, &a, &b) < 0); break;
        case OP_GT: v = vbool(compare(r, x, &a, &b) > 0); break;
        case OP_LE: v = vbool(compare(r, x, &a, &b) <= 0); break;
        case OP_GE: v = vbool(compare(r, x, &a, &b) >= 0); break;
        case OP_IN: v = vbool(contains(r, x, &b, &a)); break;
        case OP_NOTIN: v = vbool(!contains(r, x, &b, &a)); break;
        default: v = arith(r, x, x->op, &a, &b);
        }
        break;
    }
    case E_LIST:
    case E_TUPLE: {
        jv *l = vals(r, x->args.n);
        for (size_t i = 0; i < x->args.n; i++) l[i] = eval(r, fr, x->args.v[i]);
        v = (jv){.t = V_LIST, .flags = x->kind == E_TUPLE ? J_TUPLE : 0, .l = l, .n = x->args.n};
        break;
    }
    case E_DICT: {
        jdict *d = dict_new(r, x->args.n);
        for (size_t i = 0; i < x->args.n; i++) {
            jv k = eval(r, fr, x->args.v[i]);
            if (k.t == V_LIST || k.t == V_DICT)
                rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "unhashable type: '%s'", type_name(&k));
            dict_set(r, d, k, eval(r, fr, x->kw.v[i]));
        }
        v = (jv){.t = V_DICT, .d = d};
        break;
    }
    default: rerr(r, x, TRI_STATUS_BAD_FORMAT, "internal: node %d is not an expression", x->kind);
    }
    r->depth--;
    return v;
}

static void assign(R *r, frame *fr, const node *x, jv v) {
    if (x->nnames == 1) {
        frame_set(r, fr, x->names[0], v);
        return;
    }
    jv l = as_list(r, x, &v);
    if (l.n != x->nnames)
        rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "cannot unpack %zu values into %zu names", l.n, x->nnames);
    for (size_t i = 0; i < l.n; i++) frame_set(r, fr, x->names[i], l.l[i]);
}

static void exec_for(R *r, frame *fr, const node *x) {
    jv it = eval(r, fr, x->a);
    jv l = as_list(r, x, &it);
    if (x->b) {  // the filter runs first: loop.length and loop.last count what passes it
        jv *kept = vals(r, l.n);
        size_t n = 0;
        frame *f = frame_new(r, fr);
        for (size_t i = 0; i < l.n; i++) {
            step(r, x);
            f->n = 0;
            assign(r, f, x, l.l[i]);
            jv c = eval(r, f, x->b);
            if (truthy(&c)) kept[n++] = l.l[i];
        }
        l = (jv){.t = V_LIST, .l = kept, .n = n};
    }
    jloop *lp = arena_alloc(&r->a, sizeof *lp);
    lp->items = l.l, lp->n = l.n, lp->i = 0, lp->depth = 0;
    jv loopv = (jv){.t = V_LOOP, .lp = lp};
    frame *f = frame_new(r, fr);  // emptied for each iteration, as jinja2 scopes a loop's body
    for (size_t i = 0; i < l.n; i++) {
        step(r, x);
        lp->i = i;
        f->n = 0;
        frame_set(r, f, (str_t){"loop", 4}, loopv);
        assign(r, f, x, l.l[i]);
        exec_body(r, f, &x->body);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    if (l.n == 0) exec_body(r, fr, &x->els);
}

static jv apply_filters(R *r, frame *fr, const nlist *filters, jv v) {
    for (size_t i = 0; i < filters->n; i++) {
        const node *fx = filters->v[i];
        args a = eval_args(r, fr, fx);
        v = filter(r, fr, fx, fx->name, v, &a);
    }
    return v;
}

static void exec_node(R *r, frame *fr, const node *x) {
    step(r, x);
    r->at = x;
    switch (x->kind) {
    case N_TEXT: buf_put(&r->a, r->out, x->name.s, x->name.n); break;
    case N_OUT: {
        jv v = eval(r, fr, x->a);
        put_str(r, r->out, &v);
        break;
    }
    case N_IF: {
        jv c = eval(r, fr, x->a);
        exec_body(r, fr, truthy(&c) ? &x->body : &x->els);
        break;
    }
    case N_FOR: exec_for(r, fr, x); break;
    case N_SET: assign(r, fr, x, eval(r, fr, x->a)); break;
    case N_SET_ATTR: {
        jv ns = lookup(r, fr, x->name);
        if (ns.t != V_NS) rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "cannot assign attribute on non-namespace object");
        dict_set(r, ns.d, vstr(x->attr.s, x->attr.n), eval(r, fr, x->a));
        break;
    }
    case N_SET_BLOCK:
        frame_set(r, fr, x->name, apply_filters(r, fr, &x->args, render_to_string(r, fr, &x->body)));
        break;
    case N_MACRO: {
        jfunc *fn = arena_alloc(&r->a, sizeof *fn);
        memset(fn, 0, sizeof *fn);
        fn->kind = F_MACRO, fn->def = x, fn->closure = fr, fn->name = x->name;
        frame_set(r, fr, x->name, (jv){.t = V_FUNC, .fn = fn});
        break;
    }
    case N_CALL_BLOCK: {
        jfunc *caller = arena_alloc(&r->a, sizeof *caller);
        memset(caller, 0, sizeof *caller);
        caller->kind = F_CALLER, caller->def = x, caller->closure = fr, caller->name = (str_t){"caller", 6};
        jv f = eval(r, fr, x->a->a);
        args a = eval_args(r, fr, x->a);
        if (f.t != V_FUNC || f.fn->kind != F_MACRO)
            rerr(r, x, TRI_STATUS_INVALID_ARGUMENT, "{%% call %%} needs a macro");
        jv v = call_macro(r, x, f.fn, &a, caller);
        buf_put(&r->a, r->out, v.s, v.n);
        break;
    }
    case N_FILTER_BLOCK: {
        jv v = apply_filters(r, fr, &x->args, render_to_string(r, fr, &x->body));
        put_str(r, r->out, &v);
        break;
    }
    case N_BREAK: r->ctl = 1; break;
    case N_CONTINUE: r->ctl = 2; break;
    case N_BODY: exec_body(r, fr, &x->body); break;
    default: rerr(r, x, TRI_STATUS_BAD_FORMAT, "internal: node %d is not a statement", x->kind);
    }
}

static void exec_body(R *r, frame *fr, const nlist *body) {
    if (++r->depth > r->max_depth)
        rerr(r, NULL, TRI_STATUS_BAD_FORMAT, "nested too deeply (over %d levels)", r->max_depth);
    for (size_t i = 0; i < body->n && !r->ctl; i++) exec_node(r, fr, body->v[i]);
    r->depth--;
}

tri_status tri__jinja_render(const tri__jinja *t, struct json_object *ctx, int64_t now, const tri__jinja_limits *limits,
                             char **out, size_t *n_out, char *err, size_t errcap) {
    if (errcap) err[0] = 0;
    if (!t || !out || !n_out || (ctx && !json_object_is_type(ctx, json_type_object))) {
        set_err(err, errcap, "NULL argument, or a context that is not a JSON object");
        return TRI_STATUS_INVALID_ARGUMENT;
    }
    *out = NULL;
    *n_out = 0;
    tri__jinja_limits lim = limits ? *limits : (tri__jinja_limits){0};
    failure f = {.err = err, .errcap = errcap};
    R r = {.f = &f, .now = now};
    r.a.f = &f;
    r.a.limit = lim.max_memory ? lim.max_memory : (size_t)256 << 20;
    r.max_steps = lim.max_steps ? lim.max_steps : 20000000;
    r.max_depth = lim.max_depth ? lim.max_depth : 200;
    r.max_output = lim.max_output ? lim.max_output : (size_t)16 << 20;
    if (setjmp(f.jb)) {
        arena_free(&r.a);
        return f.status;
    }
    frame *g = frame_new(&r, NULL);
    if (ctx) {
        json_object_object_foreach(ctx, key, val) frame_set(&r, g, (str_t){key, strlen(key)}, from_json(&r, val, 0));
    }
    frame *top = frame_new(&r, g);
    buf o = {.limit = r.max_output};
    r.out = &o;
    exec_body(&r, top, &t->body);
    char *s = malloc(o.n + 1);
    if (!s) {
        arena_free(&r.a);
        set_err(err, errcap, "out of memory");
        return TRI_STATUS_OUT_OF_MEMORY;
    }
    if (o.n) memcpy(s, o.p, o.n);
    s[o.n] = 0;
    *out = s;
    *n_out = o.n;
    arena_free(&r.a);
    return TRI_STATUS_OK;
}
