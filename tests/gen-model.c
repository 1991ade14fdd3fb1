// gen-model.c - tri-gen-model: writes one seeded Llama as a GGUF file and as an HF directory.
//
// Both files describe exactly the same model, so that a loader or a forward pass can be checked
// against each and against the Python reference (tests/reference/llama_ref.py) that reads the HF
// form. Every weight is a function of (seed, HF tensor name, HF row), so each file is generated row
// by row in its own order and nothing larger than one row is ever held: the Llama-2-7B shape in
// f16 (13 GB per file) streams to disk in a few MiB of memory.
//
// What "the same model" means per tensor:
//   - 1-D norms: values rounded to --dtype; the HF file stores them in --dtype, the GGUF in f32
//     (as llama.cpp's converter does), so both hold the same numbers exactly.
//   - matrices, --gguf-dtype unset: values rounded to --dtype in both files.
//   - matrices, --gguf-dtype q8_0|q4_0|q4_1|q4_K|q6_K|iq4_xs: the GGUF holds the quantized blocks; the HF
//     file holds their dequantized values, rounded to --dtype (exact for f32; one storage rounding for
//     f16/bf16).
//   - attn_q/attn_k: GGUF rows are the HF rows permuted as llama.cpp's convert_hf_to_gguf does, so
//     the GGUF uses the adjacent-pair rope layout and the HF file the rotate_half layout.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtype.h"
#include "error.h"

// ---- errors: this is a tool, so a failure prints one line and exits ----

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tri-gen-model: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("out of memory allocating %zu bytes", n);
    return q;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

// ---- growable byte buffer (headers, JSON) ----

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void buf_put(buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) die("vsnprintf failed for format '%s'", fmt);
    char *tmp = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(tmp, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf_put(b, tmp, (size_t)n);
    free(tmp);
}

// A JSON string literal; s is UTF-8, only '"', '\\' and control bytes need escaping.
static void buf_json_str(buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            buf_put(b, "\\", 1);
            buf_put(b, c, 1);
        } else if (*c < 0x20) {
            buf_printf(b, "\\u%04x", *c);
        } else {
            buf_put(b, c, 1);
        }
    }
    buf_put(b, "\"", 1);
}

static void buf_u32(buf *b, uint32_t v) {
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    buf_put(b, le, 4);
}

static void buf_u64(buf *b, uint64_t v) {
    buf_u32(b, (uint32_t)v);
    buf_u32(b, (uint32_t)(v >> 32));
}

// ---- output files: every write is checked ----

typedef struct sink {
    FILE *f;
    const char *path;
    uint64_t pos;  // bytes written so far
} sink;

static void sink_open(sink *s, const char *path) {
    s->f = fopen(path, "wb");
    if (!s->f) die("%s: cannot create: %s", path, strerror(errno));
    // 4 MiB of stdio buffer: row-sized writes of a few KiB become large write(2) calls
    if (setvbuf(s->f, NULL, _IOFBF, (size_t)4 << 20) != 0) die("%s: setvbuf failed", path);
    s->path = path;
    s->pos = 0;
}

static void sink_write(sink *s, const void *data, size_t n) {
    if (n && fwrite(data, 1, n, s->f) != n) die("%s: write failed: %s", s->path, strerror(errno));
    s->pos += n;
}

static void sink_pad(sink *s, uint64_t align) {
    static const char zeros[64];
    while (s->pos % align) {
        size_t n = (size_t)(align - s->pos % align);
        sink_write(s, zeros, n < sizeof zeros ? n : sizeof zeros);
    }
}

static void sink_close(sink *s) {
    if (fflush(s->f) != 0) die("%s: write failed: %s", s->path, strerror(errno));
    if (fclose(s->f) != 0) die("%s: close failed: %s", s->path, strerror(errno));
    s->f = NULL;
}

static void write_text_file(const char *path, const buf *b) {
    sink s;
    sink_open(&s, path);
    sink_write(&s, b->p, b->len);
    sink_close(&s);
}

// ---- options ----

typedef enum rope_scaling { RS_NONE, RS_LINEAR, RS_DYNAMIC, RS_YARN, RS_LLAMA3 } rope_scaling;
static const char *const rope_scaling_names[] = {"none", "linear", "dynamic", "yarn", "llama3"};

typedef struct opts {
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_ctx;
    double theta, eps;
    bool tied;
    rope_scaling scaling;
    double rope_factor;
    int64_t rope_orig_ctx;  // 0: n_ctx / rope_factor
    tri_dtype dtype;        // both files; f32, f16 or bf16
    tri_dtype gguf_dtype;   // GGUF matrices; == dtype unless quantized
    int64_t n_shards;
    uint64_t seed;
    const char *out_gguf, *out_hf, *shape;
    bool dry_run;
} opts;

static void apply_shape(opts *o, const char *shape) {
    // (vocab, embd, ff, layers, heads, kv heads, head dim, ctx, theta, eps, tied)
    if (!strcmp(shape, "tiny")) {
        *o = (opts){.n_vocab = 384, .n_embd = 64, .n_ff = 160, .n_layer = 2, .n_head = 4,
                    .n_head_kv = 2, .head_dim = 16, .n_ctx = 512, .theta = 10000, .eps = 1e-5};
    } else if (!strcmp(shape, "llama2-7b")) {
        *o = (opts){.n_vocab = 32000, .n_embd = 4096, .n_ff = 11008, .n_layer = 32, .n_head = 32,
                    .n_head_kv = 32, .head_dim = 128, .n_ctx = 4096, .theta = 10000, .eps = 1e-5};
    } else if (!strcmp(shape, "llama-68m")) {
        *o = (opts){.n_vocab = 32000, .n_embd = 768, .n_ff = 3072, .n_layer = 2, .n_head = 12,
                    .n_head_kv = 12, .head_dim = 64, .n_ctx = 2048, .theta = 10000, .eps = 1e-6};
    } else if (!strcmp(shape, "smollm2-135m")) {
        *o = (opts){.n_vocab = 49152, .n_embd = 576, .n_ff = 1536, .n_layer = 30, .n_head = 9,
                    .n_head_kv = 3, .head_dim = 64, .n_ctx = 8192, .theta = 100000, .eps = 1e-5,
                    .tied = true};
    } else {
        die("--shape: unknown shape '%s' (tiny, llama2-7b, llama-68m, smollm2-135m)", shape);
    }
    o->shape = shape;
}

static void usage(FILE *f) {
    fputs(
        "usage: tri-gen-model [options] --out-gguf FILE --out-hf DIR\n"
        "Writes one seeded Llama model twice: as GGUF v3 and as an HF directory (safetensors,\n"
        "config.json, tokenizer.json). See docs/test-models.md.\n"
        "\n"
        "  --shape NAME        tiny (default), llama2-7b, llama-68m, smollm2-135m; options below\n"
        "                      given after or before it override its values\n"
        "  --vocab N           vocabulary size (>= 259: 3 specials + 256 bytes)\n"
        "  --embd N            hidden size\n"
        "  --ff N              feed-forward size\n"
        "  --layers N          transformer blocks\n"
        "  --heads N           query heads\n"
        "  --kv-heads N        key/value heads (divides --heads)\n"
        "  --head-dim N        per-head size (even)\n"
        "  --ctx N             max_position_embeddings / llama.context_length\n"
        "  --theta X           rope frequency base\n"
        "  --eps X             RMSNorm epsilon\n"
        "  --tied              output projection is the token embedding (no lm_head / output)\n"
        "  --rope-scaling T    none, linear, dynamic, yarn, llama3\n"
        "  --rope-factor X     scaling factor (default 4 when scaling)\n"
        "  --rope-orig-ctx N   pre-scaling context (default ctx / factor)\n"
        "  --dtype T           f32, f16 (default), bf16: storage type of both files\n"
        "  --gguf-dtype T      q8_0, q4_0, q4_1, q4_K, q6_K, iq4_xs: quantize GGUF matrices (HF holds dequantized\n"
        "                      values; the last three need rows of whole super-blocks of 256)\n"
        "  --shards N          number of safetensors shards (default 1)\n"
        "  --seed N            PRNG seed (default 1)\n"
        "  --out-gguf FILE     GGUF output\n"
        "  --out-hf DIR        HF output directory (created if missing)\n"
        "  --dry-run           print the tensors and file sizes, write nothing\n"
        "  --help              this text\n",
        f);
}

static int64_t parse_int(const char *opt, const char *s, int64_t lo, int64_t hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("%s: '%s' is not an integer in [%" PRId64 ", %" PRId64 "]", opt, s, lo, hi);
    return (int64_t)v;
}

static double parse_double(const char *opt, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0) die("%s: '%s' is not a positive number", opt, s);
    return v;
}

static tri_dtype parse_dtype(const char *opt, const char *s, bool quantized) {
    static const struct { const char *name; tri_dtype t; bool q; } types[] = {
        {"f32", TRI_DTYPE_F32, false},   {"f16", TRI_DTYPE_F16, false},
        {"bf16", TRI_DTYPE_BF16, false}, {"q8_0", TRI_DTYPE_Q8_0, true},
        {"q4_0", TRI_DTYPE_Q4_0, true},  {"q4_1", TRI_DTYPE_Q4_1, true},
        {"q4_K", TRI_DTYPE_Q4_K, true},  {"q6_K", TRI_DTYPE_Q6_K, true},
        {"iq4_xs", TRI_DTYPE_IQ4_XS, true},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(s, types[i].name) && types[i].q == quantized) return types[i].t;
    die("%s: unknown type '%s' (%s)", opt, s, quantized ? "q8_0, q4_0, q4_1, q4_K, q6_K, iq4_xs" : "f32, f16, bf16");
}

static void parse_args(opts *o, int argc, char **argv) {
    apply_shape(o, "tiny");
    // the shape first, wherever it is, so that explicit options override it
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--shape")) apply_shape(o, argv[i + 1]);
    o->dtype = TRI_DTYPE_F16;
    o->gguf_dtype = (tri_dtype)-1;
    o->n_shards = 1;
    o->seed = 1;
    const int64_t big = (int64_t)1 << 31;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--tied")) { o->tied = true; continue; }
        if (!strcmp(a, "--dry-run")) { o->dry_run = true; continue; }
        if (i + 1 >= argc) die("%s: missing value (or unknown option; see --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--shape")) continue;  // applied above
        else if (!strcmp(a, "--vocab")) o->n_vocab = parse_int(a, v, 1, big);
        else if (!strcmp(a, "--embd")) o->n_embd = parse_int(a, v, 1, big);
        else if (!strcmp(a, "--ff")) o->n_ff = parse_int(a, v, 1, big);
        else if (!strcmp(a, "--layers")) o->n_layer = parse_int(a, v, 1, 100000);
        else if (!strcmp(a, "--heads")) o->n_head = parse_int(a, v, 1, 100000);
        else if (!strcmp(a, "--kv-heads")) o->n_head_kv = parse_int(a, v, 1, 100000);
        else if (!strcmp(a, "--head-dim")) o->head_dim = parse_int(a, v, 2, 100000);
        else if (!strcmp(a, "--ctx")) o->n_ctx = parse_int(a, v, 1, big);
        else if (!strcmp(a, "--theta")) o->theta = parse_double(a, v);
        else if (!strcmp(a, "--eps")) o->eps = parse_double(a, v);
        else if (!strcmp(a, "--rope-factor")) o->rope_factor = parse_double(a, v);
        else if (!strcmp(a, "--rope-orig-ctx")) o->rope_orig_ctx = parse_int(a, v, 1, big);
        else if (!strcmp(a, "--dtype")) o->dtype = parse_dtype(a, v, false);
        else if (!strcmp(a, "--gguf-dtype")) o->gguf_dtype = parse_dtype(a, v, true);
        else if (!strcmp(a, "--shards")) o->n_shards = parse_int(a, v, 1, 99999);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)parse_int(a, v, 0, INT64_MAX);
        else if (!strcmp(a, "--out-gguf")) o->out_gguf = v;
        else if (!strcmp(a, "--out-hf")) o->out_hf = v;
        else if (!strcmp(a, "--rope-scaling")) {
            size_t k = 0;
            while (k < 5 && strcmp(v, rope_scaling_names[k])) k++;
            if (k == 5) die("--rope-scaling: unknown type '%s' (none, linear, dynamic, yarn, llama3)", v);
            o->scaling = (rope_scaling)k;
        } else {
            die("unknown option '%s' (see --help)", a);
        }
    }
    if (o->gguf_dtype == (tri_dtype)-1) o->gguf_dtype = o->dtype;
    if (o->scaling == RS_NONE) {
        o->rope_factor = 1;
        o->rope_orig_ctx = 0;
    } else {
        if (o->rope_factor == 0) o->rope_factor = 4;
        if (o->rope_orig_ctx == 0) o->rope_orig_ctx = (int64_t)llround((double)o->n_ctx / o->rope_factor);
        if (o->rope_orig_ctx < 1) die("--rope-orig-ctx: must be >= 1");
    }
    if (o->n_head % o->n_head_kv) die("--kv-heads %" PRId64 " does not divide --heads %" PRId64, o->n_head_kv, o->n_head);
    if (o->head_dim % 2) die("--head-dim %" PRId64 " must be even (rope rotates pairs)", o->head_dim);
    if (o->n_vocab < 259) die("--vocab %" PRId64 ": must be >= 259 (3 specials + 256 byte tokens)", o->n_vocab);
    if (tri__dtype_is_quantized(o->gguf_dtype)) {
        const int64_t be = tri__dtype_block_elems(o->gguf_dtype);
        if (o->n_embd % be || o->n_ff % be || (o->n_head * o->head_dim) % be)
            die("--gguf-dtype %s: --embd, --ff and --heads x --head-dim must be multiples of %" PRId64,
                tri_dtype_name(o->gguf_dtype), be);
    }
    int64_t n_hf_tensors = 2 + (o->tied ? 0 : 1) + 9 * o->n_layer;
    if (o->n_shards > n_hf_tensors)
        die("--shards %" PRId64 ": more shards than the model's %" PRId64 " tensors", o->n_shards, n_hf_tensors);
    if (!o->dry_run && !o->out_gguf && !o->out_hf) die("nothing to do: give --out-gguf and/or --out-hf (see --help)");
}

// ---- the tensors ----

typedef enum tkind {
    T_EMBD, T_OUTPUT_NORM, T_OUTPUT, T_ROPE_FREQS,
    T_ATTN_NORM, T_Q, T_K, T_V, T_O, T_FFN_NORM, T_GATE, T_UP, T_DOWN,
} tkind;

typedef struct gtensor {
    tkind kind;
    int64_t layer;
    int64_t rows, cols;  // HF shape (rows, cols); 1-D tensors have rows == 1, n_dims == 1
    int n_dims;
    char gguf_name[64];
    char hf_name[96];    // "" for GGUF-only tensors (rope_freqs)
    uint64_t seed;       // per tensor: hash of the HF name mixed with --seed
} gtensor;

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

typedef struct model {
    opts o;
    gtensor *t;
    int64_t n_t;
} model;

static void add_tensor(model *m, tkind kind, int64_t layer, int64_t rows, int64_t cols, int n_dims,
                       const char *gguf_fmt, const char *hf_fmt) {
    gtensor *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->layer = layer;
    t->rows = rows;
    t->cols = cols;
    t->n_dims = n_dims;
    snprintf(t->gguf_name, sizeof t->gguf_name, gguf_fmt, (int)layer);
    if (hf_fmt) snprintf(t->hf_name, sizeof t->hf_name, hf_fmt, (int)layer);
    uint64_t s = m->o.seed ^ fnv1a(hf_fmt ? t->hf_name : t->gguf_name);
    t->seed = splitmix64(&s);
}

// The tensors in GGUF order (llama.cpp's: embeddings, output, then blocks).
static void build_tensors(model *m) {
    const opts *o = &m->o;
    int64_t q_rows = o->n_head * o->head_dim, kv_rows = o->n_head_kv * o->head_dim;
    m->t = xmalloc(sizeof(gtensor) * (size_t)(4 + 9 * o->n_layer));
    m->n_t = 0;
    add_tensor(m, T_EMBD, 0, o->n_vocab, o->n_embd, 2, "token_embd.weight", "model.embed_tokens.weight");
    add_tensor(m, T_OUTPUT_NORM, 0, 1, o->n_embd, 1, "output_norm.weight", "model.norm.weight");
    if (!o->tied) add_tensor(m, T_OUTPUT, 0, o->n_vocab, o->n_embd, 2, "output.weight", "lm_head.weight");
    if (o->scaling == RS_LLAMA3) add_tensor(m, T_ROPE_FREQS, 0, 1, o->head_dim / 2, 1, "rope_freqs.weight", NULL);
    for (int64_t l = 0; l < o->n_layer; l++) {
        add_tensor(m, T_ATTN_NORM, l, 1, o->n_embd, 1, "blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight");
        add_tensor(m, T_Q, l, q_rows, o->n_embd, 2, "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight");
        add_tensor(m, T_K, l, kv_rows, o->n_embd, 2, "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight");
        add_tensor(m, T_V, l, kv_rows, o->n_embd, 2, "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight");
        add_tensor(m, T_O, l, o->n_embd, q_rows, 2, "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight");
        add_tensor(m, T_FFN_NORM, l, 1, o->n_embd, 1, "blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight");
        add_tensor(m, T_GATE, l, o->n_ff, o->n_embd, 2, "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight");
        add_tensor(m, T_UP, l, o->n_ff, o->n_embd, 2, "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight");
        add_tensor(m, T_DOWN, l, o->n_embd, o->n_ff, 2, "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight");
    }
}

static bool is_norm(const gtensor *t) {
    return t->kind == T_OUTPUT_NORM || t->kind == T_ATTN_NORM || t->kind == T_FFN_NORM;
}

// Storage type of a tensor in the GGUF file: 1-D tensors stay f32, matrices take --gguf-dtype.
static tri_dtype gguf_type(const model *m, const gtensor *t) {
    return t->n_dims == 1 ? TRI_DTYPE_F32 : m->o.gguf_dtype;
}

static uint64_t tensor_bytes(tri_dtype type, const gtensor *t) {
    int64_t rb = tri__dtype_row_bytes(type, t->cols);
    if (rb < 0) die("tensor %s: %" PRId64 " columns do not fit type %s", t->gguf_name, t->cols, tri_dtype_name(type));
    return (uint64_t)rb * (uint64_t)t->rows;
}

// ---- values ----

// The standard deviation of a tensor's values. Matrices get 1/sqrt(n_in) (0.016 at n_in = 4096,
// close to the 0.02 of real checkpoints) so that every projection keeps the activation scale and
// attention scores are O(1) rather than uniform even in tiny models. The embedding and the output
// get 2/sqrt(n_embd), so that logits over a normalised hidden state have a std of about 2: peaked
// enough that greedy decoding is well defined, not so peaked that one token always wins.
static double tensor_std(const model *m, const gtensor *t) {
    switch (t->kind) {
    case T_EMBD:
    case T_OUTPUT: return 2.0 / sqrt((double)m->o.n_embd);
    case T_OUTPUT_NORM:
    case T_ATTN_NORM:
    case T_FFN_NORM: return 0.05;  // around 1
    default: return 1.0 / sqrt((double)t->cols);
    }
}

// Raw values of HF row `row` of a tensor: out (cols) f32. A pure function of (seed, name, row).
static void raw_row(const model *m, const gtensor *t, int64_t row, float *out) {
    uint64_t s = t->seed ^ ((uint64_t)row * 0xD1B54A32D192ED03ull);
    splitmix64(&s);
    double sd = tensor_std(m, t);
    double mean = is_norm(t) ? 1.0 : 0.0;
    for (int64_t c = 0; c < t->cols; c += 2) {
        // Box-Muller: two normals from two uniforms in (0, 1]
        double u1 = (double)((splitmix64(&s) >> 11) + 1) * 0x1p-53;
        double u2 = (double)((splitmix64(&s) >> 11) + 1) * 0x1p-53;
        double r = sqrt(-2.0 * log(u1)), a = 2.0 * 3.14159265358979323846 * u2;
        out[c] = (float)(mean + sd * r * cos(a));
        if (c + 1 < t->cols) out[c + 1] = (float)(mean + sd * r * sin(a));
    }
}

// The HF row whose values GGUF row `row` holds. convert_hf_to_gguf reshapes each head's rows as
// (2, head_dim / 2) and swaps the axes, so GGUF row 2p + j of a head is HF row j * head_dim/2 + p:
// the two halves that rotate_half pairs become adjacent.
static int64_t gguf_to_hf_row(const model *m, const gtensor *t, int64_t row) {
    if (t->kind != T_Q && t->kind != T_K) return row;
    int64_t hd = m->o.head_dim, h = row / hd, i = row % hd;
    return h * hd + (i % 2) * (hd / 2) + i / 2;
}

static float round_to(tri_dtype type, float v) {
    switch (type) {
    case TRI_DTYPE_F16: return tri__f16_to_f32(tri__f32_to_f16(v));
    case TRI_DTYPE_BF16: return tri__bf16_to_f32(tri__f32_to_bf16(v));
    default: return v;
    }
}

// ---- quantizers: the GGML block layouts of dtype.h, with ggml's reference rounding ----

static void quantize_q8_0(const float *x, tri__block_q8_0 *b) {
    float amax = 0;
    for (int i = 0; i < TRI_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b->d = tri__f32_to_f16(d);
    for (int i = 0; i < TRI_QK; i++) b->qs[i] = (int8_t)roundf(x[i] * id);
}

static void quantize_q4_0(const float *x, tri__block_q4_0 *b) {
    float amax = 0, max = 0;  // max: the value of largest magnitude, with its sign
    for (int i = 0; i < TRI_QK; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b->d = tri__f32_to_f16(d);
    for (int i = 0; i < TRI_QK / 2; i++) {
        int q0 = (int)(x[i] * id + 8.5f), q1 = (int)(x[i + TRI_QK / 2] * id + 8.5f);
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        b->qs[i] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quantize_q4_1(const float *x, tri__block_q4_1 *b) {
    float min = x[0], max = x[0];
    for (int i = 1; i < TRI_QK; i++) { min = fminf(min, x[i]); max = fmaxf(max, x[i]); }
    float d = (max - min) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b->d = tri__f32_to_f16(d);
    b->m = tri__f32_to_f16(min);
    for (int i = 0; i < TRI_QK / 2; i++) {
        int q0 = (int)((x[i] - min) * id + 0.5f), q1 = (int)((x[i + TRI_QK / 2] - min) * id + 0.5f);
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        b->qs[i] = (uint8_t)(q0 | (q1 << 4));
    }
}

// K-quants (written for this generator), plainly: per group a min/max (Q4_K) or absolute-max (Q6_K) scale, the group scales
// rounded to 6 / 8 bits against the super-block's f16 scale, codes rounded to nearest.
static void quantize_q4_k(const float *x, tri__block_q4_k *b) {
    float scale[8], mins[8], smax = 0, mmax = 0;
    for (int g = 0; g < 8; g++) {
        float lo = 0, hi = x[32 * g];
        for (int i = 0; i < 32; i++) { lo = fminf(lo, x[32 * g + i]); hi = fmaxf(hi, x[32 * g + i]); }
        scale[g] = (hi - lo) / 15.0f, mins[g] = -lo;
        smax = fmaxf(smax, scale[g]), mmax = fmaxf(mmax, mins[g]);
    }
    b->d = tri__f32_to_f16(smax / 63.0f), b->dmin = tri__f32_to_f16(mmax / 63.0f);
    float d = tri__f16_to_f32(b->d), dmin = tri__f16_to_f32(b->dmin);
    int sc[8], mn[8];
    for (int g = 0; g < 8; g++) {
        sc[g] = d > 0 ? (int)fminf(63.0f, roundf(scale[g] / d)) : 0;
        mn[g] = dmin > 0 ? (int)fminf(63.0f, roundf(mins[g] / dmin)) : 0;
    }
    for (int g = 0; g < 4; g++) {
        b->scales[g] = (uint8_t)(sc[g] | (sc[g + 4] >> 4) << 6);
        b->scales[g + 4] = (uint8_t)(mn[g] | (mn[g + 4] >> 4) << 6);
        b->scales[g + 8] = (uint8_t)((sc[g + 4] & 15) | (mn[g + 4] & 15) << 4);
    }
    memset(b->qs, 0, sizeof b->qs);
    for (int g = 0; g < 8; g++) {
        float s = d * (float)sc[g], m = dmin * (float)mn[g];
        for (int l = 0; l < 32; l++) {
            int q = s > 0 ? (int)roundf((x[32 * g + l] + m) / s) : 0;
            q = q < 0 ? 0 : q > 15 ? 15 : q;
            b->qs[32 * (g / 2) + l] |= (uint8_t)(q << (4 * (g % 2)));
        }
    }
}

static void quantize_q6_k(const float *x, tri__block_q6_k *b) {
    float scale[16], smax = 0;
    for (int g = 0; g < 16; g++) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[16 * g + i]));
        scale[g] = amax / 31.0f, smax = fmaxf(smax, scale[g]);
    }
    b->d = tri__f32_to_f16(smax / 127.0f);
    float d = tri__f16_to_f32(b->d);
    memset(b->ql, 0, sizeof b->ql);
    memset(b->qh, 0, sizeof b->qh);
    for (int g = 0; g < 16; g++) b->scales[g] = (int8_t)(d > 0 ? fminf(127.0f, roundf(scale[g] / d)) : 0);
    for (int e = 0; e < 256; e++) {
        float s = d * (float)b->scales[e / 16];
        int q = s > 0 ? (int)roundf(x[e] / s) : 0;
        q = (q < -32 ? -32 : q > 31 ? 31 : q) + 32;
        int h = e / 128, j = (e / 32) % 4, l = e % 32;
        b->ql[64 * h + 32 * (j % 2) + l] |= (uint8_t)((q & 15) << (4 * (j / 2)));
        b->qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * j));
    }
}

// IQ4_XS, as plainly: per block of 32 the scale that takes its element of largest magnitude to the
// level -127 (so the sign of the scale follows that element), the 8 scales rounded to 6 bits
// (-32..31) against the super-block's f16 scale, each code the nearest of the 16 levels.
static void quantize_iq4_xs(const float *x, tri__block_iq4_xs *b) {
    static const int8_t levels[16] = TRI__IQ4NL_VALUES;
    float scale[8], smax = 0;
    for (int j = 0; j < 8; j++) {
        float mx = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[32 * j + i]) > fabsf(mx)) mx = x[32 * j + i];
        scale[j] = mx / -127.0f, smax = fmaxf(smax, fabsf(scale[j]));
    }
    b->d = tri__f32_to_f16(smax / 31.0f);
    float d = tri__f16_to_f32(b->d);
    b->scales_h = 0;
    memset(b->scales_l, 0, sizeof b->scales_l);
    for (int j = 0; j < 8; j++) {
        int ls = d > 0 ? (int)roundf(scale[j] / d) : 0;
        ls = (ls < -32 ? -32 : ls > 31 ? 31 : ls) + 32;
        b->scales_l[j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
        b->scales_h |= (uint16_t)((ls >> 4) << (2 * j));
        float s = d * (float)(ls - 32);
        for (int i = 0; i < 32; i++) {
            int best = 0;
            for (int c = 1; c < 16; c++)
                if (fabsf(s * (float)levels[c] - x[32 * j + i]) < fabsf(s * (float)levels[best] - x[32 * j + i]))
                    best = c;
            b->qs[16 * j + i % 16] = (uint8_t)(i < 16 ? best : b->qs[16 * j + i % 16] | best << 4);
        }
    }
}

// Quantizes n values (a multiple of the type's block) into out; returns bytes written.
static size_t quantize_row(tri_dtype type, const float *x, int64_t n, void *out) {
    if (type == TRI_DTYPE_Q4_K || type == TRI_DTYPE_Q6_K || type == TRI_DTYPE_IQ4_XS) {
        for (int64_t b = 0; b < n / TRI_QK_K; b++) {
            if (type == TRI_DTYPE_Q4_K) quantize_q4_k(x + b * TRI_QK_K, (tri__block_q4_k *)out + b);
            else if (type == TRI_DTYPE_Q6_K) quantize_q6_k(x + b * TRI_QK_K, (tri__block_q6_k *)out + b);
            else quantize_iq4_xs(x + b * TRI_QK_K, (tri__block_iq4_xs *)out + b);
        }
        return (size_t)tri__dtype_row_bytes(type, n);
    }
    for (int64_t b = 0; b < n / TRI_QK; b++) {
        const float *xb = x + b * TRI_QK;
        switch (type) {
        case TRI_DTYPE_Q8_0: quantize_q8_0(xb, (tri__block_q8_0 *)out + b); break;
        case TRI_DTYPE_Q4_0: quantize_q4_0(xb, (tri__block_q4_0 *)out + b); break;
        case TRI_DTYPE_Q4_1: quantize_q4_1(xb, (tri__block_q4_1 *)out + b); break;
        default: die("internal: quantize_row(%s)", tri_dtype_name(type));
        }
    }
    return (size_t)tri__dtype_row_bytes(type, n);
}

// The inverse of quantize_row: value = d * q (q8_0), d * (q - 8) (q4_0), d * q + m (q4_1); the
// K-quants through the runtime's tri__dequantize_row (the checker compares the HF values with
// the gguf package's dequantization of the GGUF, so this is checked independently).
static void dequantize_row(tri_dtype type, const void *in, int64_t n, float *x) {
    if (type == TRI_DTYPE_Q4_K || type == TRI_DTYPE_Q6_K || type == TRI_DTYPE_IQ4_XS) {
        tri__dequantize_row(x, in, type, n);
        return;
    }
    for (int64_t b = 0; b < n / TRI_QK; b++) {
        float *xb = x + b * TRI_QK;
        if (type == TRI_DTYPE_Q8_0) {
            const tri__block_q8_0 *q = (const tri__block_q8_0 *)in + b;
            float d = tri__f16_to_f32(q->d);
            for (int i = 0; i < TRI_QK; i++) xb[i] = d * (float)q->qs[i];
        } else if (type == TRI_DTYPE_Q4_0) {
            const tri__block_q4_0 *q = (const tri__block_q4_0 *)in + b;
            float d = tri__f16_to_f32(q->d);
            for (int i = 0; i < TRI_QK / 2; i++) {
                xb[i] = d * (float)((q->qs[i] & 15) - 8);
                xb[i + TRI_QK / 2] = d * (float)((q->qs[i] >> 4) - 8);
            }
        } else {
            const tri__block_q4_1 *q = (const tri__block_q4_1 *)in + b;
            float d = tri__f16_to_f32(q->d), mn = tri__f16_to_f32(q->m);
            for (int i = 0; i < TRI_QK / 2; i++) {
                // two statements: c_std=c11 keeps -ffp-contract=off, so no FMA, as numpy computes
                float lo = d * (float)(q->qs[i] & 15), hi = d * (float)(q->qs[i] >> 4);
                xb[i] = lo + mn;
                xb[i + TRI_QK / 2] = hi + mn;
            }
        }
    }
}

// Encodes n f32 values as a float type; returns bytes written.
static size_t encode_row(tri_dtype type, const float *x, int64_t n, void *out) {
    if (type == TRI_DTYPE_F32) {
        memcpy(out, x, (size_t)n * 4);
        return (size_t)n * 4;
    }
    uint16_t *h = out;
    for (int64_t i = 0; i < n; i++) h[i] = type == TRI_DTYPE_F16 ? tri__f32_to_f16(x[i]) : tri__f32_to_bf16(x[i]);
    return (size_t)n * 2;
}

// Llama-3.1 rope_freqs as llama.cpp's converter writes them: per frequency pair, the divisor of
// the base frequency (1 for high frequencies, factor for low ones, a smooth blend between).
static void llama3_rope_freqs(const opts *o, float *out) {
    const double low_freq_factor = 1, high_freq_factor = 4;
    double low_wavelen = (double)o->rope_orig_ctx / low_freq_factor;
    double high_wavelen = (double)o->rope_orig_ctx / high_freq_factor;
    for (int64_t i = 0; i < o->head_dim / 2; i++) {
        double freq = pow(o->theta, -(double)(2 * i) / (double)o->head_dim);
        double wavelen = 2 * 3.14159265358979323846 / freq;
        double div;
        if (wavelen < high_wavelen) div = 1;
        else if (wavelen > low_wavelen) div = o->rope_factor;
        else {
            double smooth = ((double)o->rope_orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            div = 1 / ((1 - smooth) / o->rope_factor + smooth);
        }
        out[i] = (float)div;
    }
}

// One row as a file stores it. gguf: GGUF row `row` in GGUF encoding; else HF row `row` in --dtype.
// scratch holds 2 * cols floats; out holds a row of the widest encoding (cols * 4 bytes).
static size_t make_row(const model *m, const gtensor *t, int64_t row, bool gguf, float *scratch, void *out) {
    const opts *o = &m->o;
    float *x = scratch, *y = scratch + t->cols;
    if (t->kind == T_ROPE_FREQS) {
        llama3_rope_freqs(o, x);
        return encode_row(TRI_DTYPE_F32, x, t->cols, out);
    }
    raw_row(m, t, gguf ? gguf_to_hf_row(m, t, row) : row, x);
    if (t->n_dims == 1) {
        for (int64_t i = 0; i < t->cols; i++) x[i] = round_to(o->dtype, x[i]);
        return encode_row(gguf ? TRI_DTYPE_F32 : o->dtype, x, t->cols, out);
    }
    if (!tri__dtype_is_quantized(o->gguf_dtype)) return encode_row(o->dtype, x, t->cols, out);
    if (gguf) return quantize_row(o->gguf_dtype, x, t->cols, out);
    // HF side of a quantized model: the values the GGUF blocks decode to
    quantize_row(o->gguf_dtype, x, t->cols, out);
    dequantize_row(o->gguf_dtype, out, t->cols, y);
    return encode_row(o->dtype, y, t->cols, out);
}

static void write_tensor_rows(const model *m, const gtensor *t, bool gguf, sink *s, float *scratch, void *row) {
    for (int64_t r = 0; r < t->rows; r++) {
        size_t n = make_row(m, t, r, gguf, scratch, row);
        sink_write(s, row, n);
    }
}

// ---- tokenizer: byte-level BPE (GPT-2 byte symbols) ----

// Text pairs merged in this order, with ' ' for the space (written as U+0120 in the vocabulary).
static const char *const merges_text[][2] = {
    {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"}, {"e", "r"}, {"o", "n"},
    {" a", "n"}, {" an", "d"}, {"r", "e"}, {" ", "s"}, {" ", "o"}, {"o", "u"}, {" ", "w"},
    {"i", "s"}, {"e", "n"}, {"a", "t"}, {"i", "t"}, {"o", "r"}, {"e", "s"}, {"l", "l"},
    {" ", "b"}, {" ", "f"}, {" ", "c"}, {" o", "f"}, {"in", "g"}, {" ", "i"}, {" i", "s"},
    {" t", "o"}, {"a", "n"},
};
static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
enum { N_SPECIALS = 3, TOK_BOS = 0, TOK_EOS = 0 };
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_UNUSED = 5 };  // GGUF token_type values

typedef struct vocab {
    char **tokens;  // n UTF-8 strings
    int32_t *types; // n
    int64_t n;
    char **merges;  // n_merges "left right"
    int64_t n_merges;
} vocab;

// GPT-2's reversible byte -> code point map: printable bytes keep their value, the others are
// moved to 256 + k so that every byte is a visible character.
static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    uint32_t k = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) k++;
    return 256 + k;
}

// The vocabulary spelling of raw text: each byte as its GPT-2 symbol, UTF-8 encoded.
static char *byte_symbols(const char *text) {
    size_t n = strlen(text);
    char *s = xmalloc(2 * n + 1), *p = s;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_to_cp((unsigned char)text[i]);
        if (cp < 0x80) *p++ = (char)cp;
        else {
            *p++ = (char)(0xC0 | (cp >> 6));
            *p++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *p = 0;
    return s;
}

// ids: 0..2 specials, 3..258 bytes in byte order, then merges, then <|unused_K|> up to n_vocab.
static void build_vocab(const opts *o, vocab *v) {
    v->n = o->n_vocab;
    v->tokens = xmalloc(sizeof(char *) * (size_t)v->n);
    v->types = xmalloc(sizeof(int32_t) * (size_t)v->n);
    int64_t id = 0;
    for (int i = 0; i < N_SPECIALS; i++, id++) {
        v->tokens[id] = xstrdup(specials[i]);
        v->types[id] = TT_CONTROL;
    }
    for (unsigned b = 0; b < 256; b++, id++) {
        char text[2] = {(char)b, 0};
        if (b == 0) {  // strlen cannot see a NUL byte: spell U+0100 by hand
            v->tokens[id] = xstrdup("\xC4\x80");
        } else {
            v->tokens[id] = byte_symbols(text);
        }
        v->types[id] = TT_NORMAL;
    }
    int64_t max_merges = (int64_t)(sizeof merges_text / sizeof merges_text[0]);
    v->n_merges = o->n_vocab - id < max_merges ? o->n_vocab - id : max_merges;
    v->merges = xmalloc(sizeof(char *) * (size_t)(v->n_merges ? v->n_merges : 1));
    for (int64_t k = 0; k < v->n_merges; k++, id++) {
        char *l = byte_symbols(merges_text[k][0]), *r = byte_symbols(merges_text[k][1]);
        size_t ll = strlen(l), rl = strlen(r);
        v->merges[k] = xmalloc(ll + rl + 2);
        snprintf(v->merges[k], ll + rl + 2, "%s %s", l, r);
        v->tokens[id] = xmalloc(ll + rl + 1);
        snprintf(v->tokens[id], ll + rl + 1, "%s%s", l, r);
        v->types[id] = TT_NORMAL;
        free(l);
        free(r);
    }
    for (int64_t k = 0; id < v->n; k++, id++) {
        char name[48];
        snprintf(name, sizeof name, "<|unused_%" PRId64 "|>", k);
        v->tokens[id] = xstrdup(name);
        v->types[id] = TT_UNUSED;
    }
}

static void write_tokenizer_json(const vocab *v, const char *path) {
    buf b = {0};
    buf_printf(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (int64_t i = 0; i < v->n; i++) {
        if (v->types[i] != TT_CONTROL) continue;
        buf_printf(&b, "%s\n    {\"id\": %" PRId64 ", \"content\": ", i ? "," : "", i);
        buf_json_str(&b, v->tokens[i]);
        buf_printf(&b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                       "\"normalized\": false, \"special\": true}");
    }
    // SmolLM2's pipeline (digits split one by one, then GPT-2 byte level), which is what
    // tokenizer.ggml.pre = "smollm" means to llama.cpp
    buf_printf(&b, "\n  ],\n  \"normalizer\": null,\n"
                   "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
                   "    {\"type\": \"Digits\", \"individual_digits\": true},\n"
                   "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}]},\n"
                   "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true},\n"
                   "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n"
                   "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                   "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
                   "\"byte_fallback\": false, \"ignore_merges\": false,\n    \"vocab\": {");
    for (int64_t i = 0; i < v->n; i++) {
        buf_printf(&b, "%s\n      ", i ? "," : "");
        buf_json_str(&b, v->tokens[i]);
        buf_printf(&b, ": %" PRId64, i);
    }
    buf_printf(&b, "\n    },\n    \"merges\": [");
    for (int64_t k = 0; k < v->n_merges; k++) {
        buf_printf(&b, "%s\n      ", k ? "," : "");
        buf_json_str(&b, v->merges[k]);
    }
    buf_printf(&b, "\n    ]\n  }\n}\n");
    write_text_file(path, &b);
    free(b.p);
}

// ---- GGUF v3 ----

enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9 };
enum { GGUF_ALIGN = 32 };

static uint32_t ggml_type(tri_dtype t) {
    switch (t) {
    case TRI_DTYPE_F32: return 0;
    case TRI_DTYPE_F16: return 1;
    case TRI_DTYPE_Q4_0: return 2;
    case TRI_DTYPE_Q4_1: return 3;
    case TRI_DTYPE_Q8_0: return 8;
    case TRI_DTYPE_Q4_K: return 12;
    case TRI_DTYPE_Q6_K: return 14;
    case TRI_DTYPE_IQ4_XS: return 23;
    case TRI_DTYPE_BF16: return 30;
    default: die("internal: ggml_type(%d)", (int)t);
    }
}

// llama_ftype: what general.file_type says about the bulk of the weights
static uint32_t gguf_file_type(tri_dtype t) {
    switch (t) {
    case TRI_DTYPE_F32: return 0;
    case TRI_DTYPE_F16: return 1;
    case TRI_DTYPE_Q4_0: return 2;
    case TRI_DTYPE_Q4_1: return 3;
    case TRI_DTYPE_Q8_0: return 7;
    case TRI_DTYPE_Q4_K: return 15;  // MOSTLY_Q4_K_M
    case TRI_DTYPE_Q6_K: return 18;
    case TRI_DTYPE_IQ4_XS: return 30;
    default: return 32;  // bf16
    }
}

static void gguf_str(buf *b, const char *s) {
    buf_u64(b, strlen(s));
    buf_put(b, s, strlen(s));
}

typedef struct kvs {
    buf b;
    uint64_t n;
} kvs;

static void kv_key(kvs *k, const char *key, uint32_t type) {
    gguf_str(&k->b, key);
    buf_u32(&k->b, type);
    k->n++;
}
static void kv_u32(kvs *k, const char *key, uint32_t v) { kv_key(k, key, GGUF_U32); buf_u32(&k->b, v); }
static void kv_f32(kvs *k, const char *key, double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    kv_key(k, key, GGUF_F32);
    buf_u32(&k->b, u);
}
static void kv_bool(kvs *k, const char *key, bool v) {
    kv_key(k, key, GGUF_BOOL);
    unsigned char c = v;
    buf_put(&k->b, &c, 1);
}
static void kv_str(kvs *k, const char *key, const char *v) { kv_key(k, key, GGUF_STRING); gguf_str(&k->b, v); }
static void kv_str_array(kvs *k, const char *key, char *const *v, int64_t n) {
    kv_key(k, key, GGUF_ARRAY);
    buf_u32(&k->b, GGUF_STRING);
    buf_u64(&k->b, (uint64_t)n);
    for (int64_t i = 0; i < n; i++) gguf_str(&k->b, v[i]);
}
static void kv_i32_array(kvs *k, const char *key, const int32_t *v, int64_t n) {
    kv_key(k, key, GGUF_ARRAY);
    buf_u32(&k->b, GGUF_I32);
    buf_u64(&k->b, (uint64_t)n);
    for (int64_t i = 0; i < n; i++) buf_u32(&k->b, (uint32_t)v[i]);
}

static void write_gguf(const model *m, const vocab *v, const char *path, float *scratch, void *row) {
    const opts *o = &m->o;
    kvs k = {0};
    char name[64];
    snprintf(name, sizeof name, "tri-gen-model %s seed %" PRIu64, o->shape, o->seed);
    kv_str(&k, "general.architecture", "llama");
    kv_str(&k, "general.name", name);
    kv_u32(&k, "general.alignment", GGUF_ALIGN);
    kv_u32(&k, "general.file_type", gguf_file_type(o->gguf_dtype));
    kv_u32(&k, "llama.vocab_size", (uint32_t)o->n_vocab);
    kv_u32(&k, "llama.context_length", (uint32_t)o->n_ctx);
    kv_u32(&k, "llama.embedding_length", (uint32_t)o->n_embd);
    kv_u32(&k, "llama.feed_forward_length", (uint32_t)o->n_ff);
    kv_u32(&k, "llama.block_count", (uint32_t)o->n_layer);
    kv_u32(&k, "llama.attention.head_count", (uint32_t)o->n_head);
    kv_u32(&k, "llama.attention.head_count_kv", (uint32_t)o->n_head_kv);
    kv_u32(&k, "llama.attention.key_length", (uint32_t)o->head_dim);
    kv_u32(&k, "llama.attention.value_length", (uint32_t)o->head_dim);
    kv_u32(&k, "llama.rope.dimension_count", (uint32_t)o->head_dim);
    kv_f32(&k, "llama.rope.freq_base", o->theta);
    kv_f32(&k, "llama.attention.layer_norm_rms_epsilon", o->eps);
    if (o->scaling != RS_NONE && o->scaling != RS_LLAMA3) {
        // llama.cpp names linear and yarn; "dynamic" is ours (a loader that does not know it
        // refuses the file); llama3 is expressed, as llama.cpp's converter does, by the
        // rope_freqs tensor alone
        kv_str(&k, "llama.rope.scaling.type", rope_scaling_names[o->scaling]);
        kv_f32(&k, "llama.rope.scaling.factor", o->rope_factor);
        kv_u32(&k, "llama.rope.scaling.original_context_length", (uint32_t)o->rope_orig_ctx);
        if (o->scaling == RS_YARN) {
            kv_f32(&k, "llama.rope.scaling.yarn_beta_fast", 32);
            kv_f32(&k, "llama.rope.scaling.yarn_beta_slow", 1);
        }
    }
    kv_str(&k, "tokenizer.ggml.model", "gpt2");
    kv_str(&k, "tokenizer.ggml.pre", "smollm");
    kv_str_array(&k, "tokenizer.ggml.tokens", v->tokens, v->n);
    kv_i32_array(&k, "tokenizer.ggml.token_type", v->types, v->n);
    kv_str_array(&k, "tokenizer.ggml.merges", v->merges, v->n_merges);
    kv_u32(&k, "tokenizer.ggml.bos_token_id", TOK_BOS);
    kv_u32(&k, "tokenizer.ggml.eos_token_id", TOK_EOS);
    kv_bool(&k, "tokenizer.ggml.add_bos_token", false);

    // tensor infos: dims innermost first (ne0 = columns), offsets relative to the data section
    buf ti = {0};
    uint64_t off = 0;
    for (int64_t i = 0; i < m->n_t; i++) {
        const gtensor *t = &m->t[i];
        gguf_str(&ti, t->gguf_name);
        buf_u32(&ti, (uint32_t)t->n_dims);
        buf_u64(&ti, (uint64_t)t->cols);
        if (t->n_dims == 2) buf_u64(&ti, (uint64_t)t->rows);
        buf_u32(&ti, ggml_type(gguf_type(m, t)));
        buf_u64(&ti, off);
        off += tensor_bytes(gguf_type(m, t), t);
        off = (off + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    }

    sink s;
    sink_open(&s, path);
    buf h = {0};
    buf_put(&h, "GGUF", 4);
    buf_u32(&h, 3);
    buf_u64(&h, (uint64_t)m->n_t);
    buf_u64(&h, k.n);
    sink_write(&s, h.p, h.len);
    sink_write(&s, k.b.p, k.b.len);
    sink_write(&s, ti.p, ti.len);
    sink_pad(&s, GGUF_ALIGN);
    uint64_t data_start = s.pos;
    for (int64_t i = 0; i < m->n_t; i++) {
        write_tensor_rows(m, &m->t[i], true, &s, scratch, row);
        sink_pad(&s, GGUF_ALIGN);
    }
    if (s.pos - data_start != off) die("internal: %s: wrote %" PRIu64 " data bytes, planned %" PRIu64, path, s.pos - data_start, off);
    sink_close(&s);
    free(h.p);
    free(k.b.p);
    free(ti.p);
}

// ---- HF: safetensors shards, index, config.json ----

static const char *st_dtype(tri_dtype t) {
    return t == TRI_DTYPE_F32 ? "F32" : t == TRI_DTYPE_F16 ? "F16" : "BF16";
}

static void join_path(char *out, size_t n, const char *dir, const char *name) {
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n) die("%s/%s: path too long", dir, name);
}

static void write_hf(const model *m, const vocab *v, const char *dir, float *scratch, void *row) {
    const opts *o = &m->o;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) die("%s: cannot create directory: %s", dir, strerror(errno));

    // HF tensor order: the embedding, each layer's tensors, the final norm, lm_head.
    int64_t n_hf = 0;
    const gtensor **order = xmalloc(sizeof(gtensor *) * (size_t)m->n_t);
    for (int pass = 0; pass < 3; pass++)
        for (int64_t i = 0; i < m->n_t; i++) {
            const gtensor *t = &m->t[i];
            if (!t->hf_name[0]) continue;
            int want = t->kind == T_EMBD ? 0 : (t->kind == T_OUTPUT_NORM || t->kind == T_OUTPUT) ? 2 : 1;
            if (want == pass) order[n_hf++] = t;
        }
    TRI_ASSERT(o->n_shards <= n_hf);  // checked in parse_args

    // shard k takes tensors while the running byte total stays under (k + 1) / n of the whole,
    // each shard at least one tensor
    uint64_t total = 0;
    for (int64_t i = 0; i < n_hf; i++) total += tensor_bytes(o->dtype, order[i]);
    int64_t *shard_of = xmalloc(sizeof(int64_t) * (size_t)n_hf);
    {
        uint64_t acc = 0;
        int64_t k = 0, in_k = 0;
        for (int64_t i = 0; i < n_hf; i++) {
            int64_t left = n_hf - i;
            bool full = in_k > 0 && (double)acc >= (double)total * (double)(k + 1) / (double)o->n_shards;
            if (k + 1 < o->n_shards && in_k > 0 && (full || left == o->n_shards - k - 1)) {
                k++;
                in_k = 0;
            }
            shard_of[i] = k;
            in_k++;
            acc += tensor_bytes(o->dtype, order[i]);
        }
    }

    char path[4096], fname[64];
    buf index = {0};
    buf_printf(&index, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
    for (int64_t k = 0, first = 0; k < o->n_shards; k++) {
        if (o->n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05" PRId64 "-of-%05" PRId64 ".safetensors", k + 1, o->n_shards);
        int64_t end = first;
        while (end < n_hf && shard_of[end] == k) end++;

        buf hdr = {0};
        buf_printf(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
        uint64_t off = 0;
        for (int64_t i = first; i < end; i++) {
            const gtensor *t = order[i];
            uint64_t nb = tensor_bytes(o->dtype, t);
            buf_printf(&hdr, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->hf_name, st_dtype(o->dtype));
            if (t->n_dims == 2) buf_printf(&hdr, "%" PRId64 ",%" PRId64, t->rows, t->cols);
            else buf_printf(&hdr, "%" PRId64, t->cols);
            buf_printf(&hdr, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + nb);
            off += nb;
            buf_printf(&index, "%s\n    \"%s\": \"%s\"", i ? "," : "", t->hf_name, fname);
        }
        buf_printf(&hdr, "}");
        while (hdr.len % 8) buf_put(&hdr, " ", 1);  // data starts 8-aligned, as safetensors writes

        join_path(path, sizeof path, dir, fname);
        sink s;
        sink_open(&s, path);
        buf len8 = {0};
        buf_u64(&len8, hdr.len);
        sink_write(&s, len8.p, len8.len);
        sink_write(&s, hdr.p, hdr.len);
        for (int64_t i = first; i < end; i++) write_tensor_rows(m, order[i], false, &s, scratch, row);
        if (s.pos != 8 + hdr.len + off) die("internal: %s: size mismatch", path);
        sink_close(&s);
        free(hdr.p);
        free(len8.p);
        first = end;
    }
    buf_printf(&index, "\n  }\n}\n");
    if (o->n_shards > 1) {
        join_path(path, sizeof path, dir, "model.safetensors.index.json");
        write_text_file(path, &index);
    }
    free(index.p);

    buf c = {0};
    const char *torch_dtype = o->dtype == TRI_DTYPE_F32 ? "float32" : o->dtype == TRI_DTYPE_F16 ? "float16" : "bfloat16";
    buf_printf(&c, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n");
    buf_printf(&c, "  \"vocab_size\": %" PRId64 ",\n  \"hidden_size\": %" PRId64 ",\n  \"intermediate_size\": %" PRId64 ",\n",
               o->n_vocab, o->n_embd, o->n_ff);
    buf_printf(&c, "  \"num_hidden_layers\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64 ",\n"
                   "  \"num_key_value_heads\": %" PRId64 ",\n  \"head_dim\": %" PRId64 ",\n",
               o->n_layer, o->n_head, o->n_head_kv, o->head_dim);
    buf_printf(&c, "  \"max_position_embeddings\": %" PRId64 ",\n  \"rope_theta\": %.17g,\n  \"rms_norm_eps\": %.17g,\n",
               o->n_ctx, o->theta, o->eps);
    buf_printf(&c, "  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n"
                   "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n  \"initializer_range\": 0.02,\n"
                   "  \"torch_dtype\": \"%s\",\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"use_cache\": true,\n",
               o->tied ? "true" : "false", torch_dtype, TOK_BOS, TOK_EOS);
    if (o->scaling == RS_NONE) {
        buf_printf(&c, "  \"rope_scaling\": null\n}\n");
    } else {
        const char *t = rope_scaling_names[o->scaling];
        buf_printf(&c, "  \"rope_scaling\": {\"rope_type\": \"%s\", \"type\": \"%s\", \"factor\": %.17g", t, t, o->rope_factor);
        // For dynamic the key is written but transformers ignores it (it scales from
        // max_position_embeddings); with the default ctx / factor the two differ, so a reader that
        // took this one would compute other logits than the reference.
        if (o->scaling == RS_YARN || o->scaling == RS_LLAMA3 || o->scaling == RS_DYNAMIC)
            buf_printf(&c, ", \"original_max_position_embeddings\": %" PRId64, o->rope_orig_ctx);
        if (o->scaling == RS_YARN) buf_printf(&c, ", \"beta_fast\": 32.0, \"beta_slow\": 1.0");
        if (o->scaling == RS_LLAMA3) buf_printf(&c, ", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0");
        buf_printf(&c, "}\n}\n");
    }
    join_path(path, sizeof path, dir, "config.json");
    write_text_file(path, &c);
    free(c.p);

    join_path(path, sizeof path, dir, "tokenizer.json");
    write_tokenizer_json(v, path);
    free(order);
    free(shard_of);
}

// ---- main ----

int main(int argc, char **argv) {
    model m = {0};
    parse_args(&m.o, argc, argv);
    build_tensors(&m);
    const opts *o = &m.o;

    uint64_t gguf_bytes = 0, hf_bytes = 0, n_params = 0;
    int64_t max_cols = 0;
    for (int64_t i = 0; i < m.n_t; i++) {
        const gtensor *t = &m.t[i];
        gguf_bytes += (tensor_bytes(gguf_type(&m, t), t) + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
        if (t->hf_name[0]) {
            hf_bytes += tensor_bytes(o->dtype, t);
            n_params += (uint64_t)(t->rows * t->cols);
        }
        if (t->cols > max_cols) max_cols = t->cols;
    }
    if (o->dry_run) {
        printf("shape %s: vocab %" PRId64 " embd %" PRId64 " ff %" PRId64 " layers %" PRId64 " heads %" PRId64
               "/%" PRId64 " head_dim %" PRId64 " ctx %" PRId64 " rope %s x%g\n",
               o->shape, o->n_vocab, o->n_embd, o->n_ff, o->n_layer, o->n_head, o->n_head_kv, o->head_dim,
               o->n_ctx, rope_scaling_names[o->scaling], o->rope_factor);
        for (int64_t i = 0; i < m.n_t; i++) {
            const gtensor *t = &m.t[i];
            printf("  %-28s %-48s (%" PRId64 ", %" PRId64 ") %s\n", t->gguf_name, t->hf_name[0] ? t->hf_name : "-",
                   t->rows, t->cols, tri_dtype_name(gguf_type(&m, t)));
        }
        printf("params %" PRIu64 "\ngguf tensor bytes %" PRIu64 "\nhf tensor bytes %" PRIu64 "\n", n_params, gguf_bytes, hf_bytes);
        free(m.t);
        return 0;
    }

    vocab v;
    build_vocab(o, &v);
    float *scratch = xmalloc(sizeof(float) * 2 * (size_t)max_cols);  // (2, max_cols) f32
    void *row = xmalloc(4 * (size_t)max_cols);                         // one encoded row, <= f32
    if (o->out_gguf) write_gguf(&m, &v, o->out_gguf, scratch, row);
    if (o->out_hf) write_hf(&m, &v, o->out_hf, scratch, row);

    free(scratch);
    free(row);
    for (int64_t i = 0; i < v.n; i++) free(v.tokens[i]);
    for (int64_t k = 0; k < v.n_merges; k++) free(v.merges[k]);
    free(v.tokens);
    free(v.types);
    free(v.merges);
    free(m.t);
    return 0;
}
