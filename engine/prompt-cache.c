// prompt-cache.c - a session's KV cache on disk: format, checksums, and the io_uring / pread
// engine that writes and reads it (prompt-cache.h, docs/formats.md "Prompt cache").
#include "prompt-cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "fault.h"
#include "model.h"
#include "tri-config.h"

#if TRI_HAVE_URING
#include <liburing.h>
#endif

#define ALIGN TRI_PCACHE_ALIGN
#define N_SLOTS 16               // staging blocks in flight while the next is filled / emptied
#define BLOCK_TARGET (4u << 20)  // bytes of a block's payload the writer aims for
#define BLOCK_MAX (1ull << 30)   // the most a block may hold (a reader stages N_SLOTS of them)

static uint64_t align_up(uint64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

// ---- checksum ----

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t lane(uint64_t acc, uint64_t w) { return rotl(acc + w * P2, 31) * P1; }
static inline uint64_t load64(const unsigned char *p) {  // little-endian whatever the host
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
#else
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--) w = w << 8 | p[i];
    return w;
#endif
}

uint64_t tri__pcache_sum(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t a0 = seed + P1 + P2, a1 = seed + P2, a2 = seed, a3 = seed - P1;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {  // four independent chains: the multiplies overlap
        a0 = lane(a0, load64(p + i));
        a1 = lane(a1, load64(p + i + 8));
        a2 = lane(a2, load64(p + i + 16));
        a3 = lane(a3, load64(p + i + 24));
    }
    uint64_t h = rotl(a0, 1) + rotl(a1, 7) + rotl(a2, 12) + rotl(a3, 18) + (uint64_t)n;
    for (; i + 8 <= n; i += 8) h = rotl(h ^ lane(0, load64(p + i)), 27) * P1 + P3;
    for (; i < n; i++) h = rotl(h ^ (p[i] * P3), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

#define MIX(h, x) ((h) = tri__pcache_sum(&(x), sizeof(x), (h)))

static uint64_t mix_str(uint64_t h, const char *s) {
    if (!s) s = "";
    return tri__pcache_sum(s, strlen(s) + 1, h);
}

uint64_t tri__pcache_model_id(const tri_model *model) {
    const tri_model_config *c = &model->config;
    uint64_t h = mix_str(0x7472692d6b7670ull, tri__model_family(model)->name);
    // field by field: a struct's padding bytes are not part of the identity
    MIX(h, c->n_vocab), MIX(h, c->n_embd), MIX(h, c->n_ff), MIX(h, c->n_layer), MIX(h, c->n_head);
    MIX(h, c->n_head_kv), MIX(h, c->head_dim), MIX(h, c->n_ctx_train), MIX(h, c->rms_eps), MIX(h, c->rope_theta);
    MIX(h, c->tied_embeddings), MIX(h, c->rope_layout), MIX(h, c->rope_scaling), MIX(h, c->rope_factor);
    MIX(h, c->rope_orig_ctx), MIX(h, c->yarn_beta_fast), MIX(h, c->yarn_beta_slow), MIX(h, c->yarn_mscale);
    MIX(h, c->llama3_low_freq_factor), MIX(h, c->llama3_high_freq_factor), MIX(h, c->has_rope_freqs);
    MIX(h, c->sliding_window), MIX(h, c->rope_attn_factor);
    MIX(h, model->n_tensors);
    for (int64_t i = 0; i < model->n_tensors; i++) {
        const tri__tensor *t = &model->tensors[i];
        h = mix_str(h, t->name);
        MIX(h, t->type), MIX(h, t->n_dims), MIX(h, t->n_bytes);
        for (int d = 0; d < 4; d++) MIX(h, t->shape[d]);
        if (t->data) h = tri__pcache_sum(t->data, t->n_bytes < 4096 ? (size_t)t->n_bytes : 4096, h);
    }
    return h;
}

// ---- layout and header ----

tri_status tri__pcache_layout(tri__pcache_header *h) {
    if (h->n_layer < 1 || h->n_layer > 4096 || h->n_head_kv < 1 || h->head_dim < 1 ||
        (int64_t)h->n_head_kv * h->head_dim > (1 << 20) ||
        (h->kv_type != TRI_DTYPE_F16 && h->kv_type != TRI_DTYPE_F32) || h->n_vocab < 1 || h->n_vocab > (1 << 24) ||
        h->n_tokens < 1 || h->block_tokens < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "prompt cache: shape n_layer %d, n_head_kv %d, head_dim %d, kv type %d, n_vocab %d, "
                         "n_tokens %d, block_tokens %d is out of range",
                         h->n_layer, h->n_head_kv, h->head_dim, h->kv_type, h->n_vocab, h->n_tokens, h->block_tokens);
    uint64_t per_token = tri__pcache_payload_bytes(h, 1);
    if (h->block_tokens == 0) {
        uint64_t bt = BLOCK_TARGET / per_token;
        h->block_tokens = bt < 1 ? 1 : bt > (uint64_t)h->n_tokens ? h->n_tokens : (int32_t)bt;
    }
    if (h->block_tokens > h->n_tokens || per_token * (uint64_t)h->block_tokens > BLOCK_MAX)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "prompt cache: block of %d tokens (%d in all) is out of range",
                         h->block_tokens, h->n_tokens);
    h->n_blocks = (int32_t)(((int64_t)h->n_tokens + h->block_tokens - 1) / h->block_tokens);
    h->block_bytes = align_up(per_token * (uint64_t)h->block_tokens);
    uint64_t meta = TRI_PCACHE_HEADER_BYTES + 4ull * (uint64_t)h->n_tokens +
                    (h->flags & TRI_PCACHE_LOGITS ? 4ull * (uint64_t)h->n_vocab : 0) + 8ull * (uint64_t)h->n_blocks;
    h->region_bytes = align_up(meta);
    int32_t last = h->n_tokens - (h->n_blocks - 1) * h->block_tokens;
    h->file_bytes =
        h->region_bytes + (uint64_t)(h->n_blocks - 1) * h->block_bytes + align_up(per_token * (uint64_t)last);
    return TRI_STATUS_OK;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void encode_header(const tri__pcache_header *h, unsigned char *p) {
    memset(p, 0, TRI_PCACHE_HEADER_BYTES);
    memcpy(p, TRI_PCACHE_MAGIC, 8);
    put32(p + 8, h->version);
    put32(p + 12, TRI_PCACHE_HEADER_BYTES);
    put64(p + 16, h->model_id);
    put64(p + 24, h->region_bytes);
    put64(p + 32, h->block_bytes);
    put64(p + 40, h->file_bytes);
    put64(p + 48, h->region_sum);
    const int32_t f[] = {h->n_layer,  h->n_head_kv,    h->head_dim, h->kv_type,        h->n_vocab, h->n_ctx,
                         h->n_tokens, h->block_tokens, h->n_blocks, (int32_t)h->flags, h->n_prompt};
    for (int i = 0; i < 11; i++) put32(p + 56 + 4 * i, (uint32_t)f[i]);
    put64(p + 120, tri__pcache_sum(p, 120, 0));
}

tri_status tri__pcache_parse_header(const char *path, const void *data, size_t len, uint64_t file_bytes,
                                    tri__pcache_header *h) {
    const unsigned char *p = data;
    memset(h, 0, sizeof *h);
    if (len < TRI_PCACHE_HEADER_BYTES || file_bytes < TRI_PCACHE_HEADER_BYTES)
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "prompt cache %s: %llu bytes, shorter than the %u-byte header (truncated?)", path,
                         (unsigned long long)(len < file_bytes ? len : file_bytes), TRI_PCACHE_HEADER_BYTES);
    if (memcmp(p, TRI_PCACHE_MAGIC, 8) != 0)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: not a prompt cache (no \"TRIKVPC\" magic)", path);
    h->version = get32(p + 8);
    if (h->version != TRI_PCACHE_VERSION)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: format version %u; this build reads version %u", path,
                         h->version, TRI_PCACHE_VERSION);
    if (get32(p + 12) != TRI_PCACHE_HEADER_BYTES || load64(p + 120) != tri__pcache_sum(p, 120, 0))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: the header's checksum does not match (corrupt file)",
                         path);
    h->model_id = load64(p + 16);
    h->region_bytes = load64(p + 24);
    h->block_bytes = load64(p + 32);
    h->file_bytes = load64(p + 40);
    h->region_sum = load64(p + 48);
    int32_t f[11];
    for (int i = 0; i < 11; i++) f[i] = (int32_t)get32(p + 56 + 4 * i);
    h->n_layer = f[0], h->n_head_kv = f[1], h->head_dim = f[2], h->kv_type = f[3], h->n_vocab = f[4];
    h->n_ctx = f[5], h->n_tokens = f[6], h->block_tokens = f[7], h->n_blocks = f[8], h->flags = (uint32_t)f[9];
    h->n_prompt = f[10];
    if (h->flags & ~TRI_PCACHE_LOGITS)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: unknown flags 0x%x", path, h->flags);
    if (h->n_ctx < 1 || h->n_tokens > h->n_ctx || h->block_tokens < 1)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: n_tokens %d, n_ctx %d, block_tokens %d out of range",
                         path, h->n_tokens, h->n_ctx, h->block_tokens);
    if (h->n_prompt < 0 || h->n_prompt > h->n_ctx)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: n_prompt %d out of range [0, n_ctx %d]", path,
                         h->n_prompt, h->n_ctx);
    tri__pcache_header want = *h;
    if (tri__pcache_layout(&want))
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: the header's shape is out of range (%s)", path,
                         tri_last_error());
    if (want.n_blocks != h->n_blocks || want.block_bytes != h->block_bytes || want.region_bytes != h->region_bytes ||
        want.file_bytes != h->file_bytes)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: the header's layout fields disagree with its shape",
                         path);
    if (file_bytes != h->file_bytes)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: %llu bytes where the header says %llu (%s)", path,
                         (unsigned long long)file_bytes, (unsigned long long)h->file_bytes,
                         file_bytes < h->file_bytes ? "truncated" : "trailing bytes");
    return TRI_STATUS_OK;
}

const float *tri__pcache_logits(const tri__pcache_header *h, const void *region) {
    if (!(h->flags & TRI_PCACHE_LOGITS)) return NULL;
    return (const float *)((const char *)region + TRI_PCACHE_HEADER_BYTES + 4 * (size_t)h->n_tokens);
}

const uint64_t *tri__pcache_block_sums(const tri__pcache_header *h, const void *region) {
    size_t off =
        TRI_PCACHE_HEADER_BYTES + 4 * (size_t)h->n_tokens + (h->flags & TRI_PCACHE_LOGITS ? 4 * (size_t)h->n_vocab : 0);
    return (const uint64_t *)((const char *)region + off);
}

tri_status tri__pcache_check_region(const char *path, const tri__pcache_header *h, const void *data) {
    const char *r = data;
    if (tri__pcache_sum(r + TRI_PCACHE_HEADER_BYTES, h->region_bytes - TRI_PCACHE_HEADER_BYTES, 0) != h->region_sum)
        return tri__fail(TRI_STATUS_BAD_FORMAT,
                         "prompt cache %s: the checksum of its tokens and block table does not match (corrupt file)",
                         path);
    const int32_t *tok = tri__pcache_tokens(data);
    for (int32_t i = 0; i < h->n_tokens; i++)
        if (tok[i] < 0 || tok[i] >= h->n_vocab)
            return tri__fail(TRI_STATUS_BAD_FORMAT, "prompt cache %s: token %d at %d is outside [0, %d)", path, tok[i],
                             i, h->n_vocab);
    return TRI_STATUS_OK;
}

// ---- the engine: a file, staging slots, io_uring or pread / pwrite ----

typedef struct engine {
    const char *path;
    int fd;
    bool writing, direct, uring;
#if TRI_HAVE_URING
    struct io_uring ring;
#endif
    int32_t n_slots;
    size_t slot_bytes;
    void *mem;         // (n_slots, slot_bytes) ALIGN-aligned
    bool busy[16];     // an I/O of the slot is in flight
    uint64_t off[16];  // its file offset
    size_t len[16];    // its length
    uint64_t bytes;
} engine;

static void *slot_buf(engine *e, int32_t s) { return (char *)e->mem + (size_t)s * e->slot_bytes; }

// Without O_DIRECT from now on (a file system that refuses an aligned transfer, or a short one
// that left the rest unaligned).
static void drop_direct(engine *e) {
    int fl = fcntl(e->fd, F_GETFL);
    if (fl >= 0) (void)fcntl(e->fd, F_SETFL, fl & ~O_DIRECT);
    e->direct = false;
}

// The whole transfer [done, len) of buf at off, synchronously, retrying short and interrupted
// calls. A read that meets the end of the file stops there when upto is set (*got: bytes read).
static tri_status sync_io(engine *e, void *buf, size_t len, uint64_t off, bool upto, size_t *got) {
    size_t done = 0;
    while (done < len) {
        char *at = (char *)buf + done;
        ssize_t r = e->writing
                        ? pwrite(e->fd, at, len - done, (off_t)(off + done))
                        : tri__fault_read_result(pread(e->fd, at, len - done, (off_t)(off + done)), len - done, ALIGN);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL && e->direct) {
            drop_direct(e);
            continue;
        }
        if (r < 0)
            return tri__fail(TRI_STATUS_IO, "prompt cache %s: %s of %zu bytes at %llu: %s", e->path,
                             e->writing ? "write" : "read", len - done, (unsigned long long)(off + done),
                             strerror(errno));
        if (r == 0) {
            if (upto) break;
            return tri__fail(e->writing ? TRI_STATUS_IO : TRI_STATUS_BAD_FORMAT,
                             "prompt cache %s: %s stopped at byte %llu (truncated file?)", e->path,
                             e->writing ? "a write" : "the file", (unsigned long long)(off + done));
        }
        done += (size_t)r;
        if (e->direct && done < len && (done % ALIGN)) drop_direct(e);
    }
    if (got) *got = done;
    e->bytes += done;
    return TRI_STATUS_OK;
}

static void engine_close(engine *e) {
#if TRI_HAVE_URING
    if (e->uring) io_uring_queue_exit(&e->ring);
#endif
    e->uring = false;
    if (e->fd >= 0) close(e->fd);
    e->fd = -1;
    free(e->mem);
    e->mem = NULL;
}

// Opens path (created or truncated when writing) with O_DIRECT where the file system takes it, and
// n_slots staging slots of slot_bytes. NOT_FOUND for a file to read that does not exist.
static tri_status engine_open(engine *e, const char *path, bool writing, int32_t n_slots, size_t slot_bytes) {
    memset(e, 0, sizeof *e);
    e->fd = -1;
    e->path = path;
    e->writing = writing;
    e->n_slots = n_slots;
    e->slot_bytes = slot_bytes;
    // a file to write is a new one (a temporary or scratch name): one that exists is not ours to truncate
    int flags = (writing ? O_WRONLY | O_CREAT | O_EXCL : O_RDONLY) | O_CLOEXEC;
    e->fd = open(path, flags | O_DIRECT, 0644);
    e->direct = e->fd >= 0;
    if (e->fd < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) e->fd = open(path, flags, 0644);
    if (e->fd < 0) {
        if (errno == ENOENT && !writing) return tri__fail(TRI_STATUS_NOT_FOUND, "prompt cache %s: no such file", path);
        return tri__fail(TRI_STATUS_IO, "prompt cache %s: open: %s", path, strerror(errno));
    }
    if (posix_memalign(&e->mem, ALIGN, (size_t)n_slots * slot_bytes) != 0) {
        e->mem = NULL;
        engine_close(e);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: %d staging blocks of %zu bytes", path, n_slots,
                         slot_bytes);
    }
#if TRI_HAVE_URING
    int r = tri__fault_hit(TRI__FAULT_URING) ? -ENOSYS : io_uring_queue_init(16, &e->ring, 0);
    e->uring = r == 0;
    if (r < 0)
        tri__log(TRI_LOG_LEVEL_INFO, "prompt cache %s: io_uring_queue_init: %s; using pread / pwrite", path,
                 strerror(-r));
#endif
    return TRI_STATUS_OK;
}

#if TRI_HAVE_URING
// Takes one completion: a failure is an error (EINVAL under O_DIRECT: redone without it), a short
// transfer is finished synchronously.
static tri_status uring_complete_one(engine *e) {
    struct io_uring_cqe *cqe;
    int r;
    do r = io_uring_wait_cqe(&e->ring, &cqe);
    while (r == -EINTR);
    if (r < 0) return tri__fail(TRI_STATUS_IO, "prompt cache %s: io_uring_wait_cqe: %s", e->path, strerror(-r));
    int32_t s = (int32_t)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    if (!e->writing && res >= 0) {  // the reliability tests' failed and short reads (fault.h)
        ssize_t f = tri__fault_read_result(res, e->len[s], ALIGN);
        res = f < 0 ? -errno : (int)f;
    }
    io_uring_cqe_seen(&e->ring, cqe);
    e->busy[s] = false;
    size_t done = 0;
    if (res < 0 && !(res == -EINVAL && e->direct) && res != -EAGAIN && res != -EINTR)
        return tri__fail(TRI_STATUS_IO, "prompt cache %s: io_uring %s of %zu bytes at %llu: %s", e->path,
                         e->writing ? "write" : "read", e->len[s], (unsigned long long)e->off[s], strerror(-res));
    if (res > 0) {
        done = (size_t)res;
        e->bytes += done;
    }
    if (done < e->len[s]) {
        if (e->direct && (done % ALIGN || res < 0)) drop_direct(e);
        return sync_io(e, (char *)slot_buf(e, s) + done, e->len[s] - done, e->off[s] + done, false, NULL);
    }
    return TRI_STATUS_OK;
}
#endif

// Starts the transfer of slot s's first len bytes at off (done at once without io_uring).
static tri_status engine_submit(engine *e, int32_t s, uint64_t off, size_t len) {
    e->off[s] = off;
    e->len[s] = len;
#if TRI_HAVE_URING
    if (e->uring) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
        if (sqe) {
            if (e->writing)
                io_uring_prep_write(sqe, e->fd, slot_buf(e, s), (unsigned)len, off);
            else
                io_uring_prep_read(sqe, e->fd, slot_buf(e, s), (unsigned)len, off);
            io_uring_sqe_set_data64(sqe, (uint64_t)s);
            int r = io_uring_submit(&e->ring);
            if (r >= 0) {
                e->busy[s] = true;
                return TRI_STATUS_OK;
            }
            return tri__fail(TRI_STATUS_IO, "prompt cache %s: io_uring_submit: %s", e->path, strerror(-r));
        }
    }
#endif
    return sync_io(e, slot_buf(e, s), len, off, false, NULL);
}

// Waits until slot s's transfer is done (completing others on the way).
static tri_status engine_wait(engine *e, int32_t s) {
#if TRI_HAVE_URING
    while (e->busy[s]) TRY(uring_complete_one(e));
#else
    (void)e, (void)s;
#endif
    return TRI_STATUS_OK;
}

static tri_status engine_drain(engine *e) {
    for (int32_t s = 0; s < e->n_slots; s++) TRY(engine_wait(e, s));
    return TRI_STATUS_OK;
}

// ---- writer ----

tri_status tri__pcache_may_replace(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return TRI_STATUS_OK;
        return tri__fail(TRI_STATUS_IO, "prompt cache %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "prompt cache %s: not replaced: it is a %s, not a prompt cache file (give another path)", path,
                         S_ISDIR(sb.st_mode)   ? "directory"
                         : S_ISLNK(sb.st_mode) ? "symbolic link"
                                               : "special file");
    if (sb.st_size == 0) return TRI_STATUS_OK;  // nothing in it to lose
    unsigned char hd[TRI_PCACHE_HEADER_BYTES];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tri__fail(TRI_STATUS_IO, "prompt cache %s: open: %s", path, strerror(errno));
    size_t got = 0;
    while (got < sizeof hd) {
        ssize_t r = read(fd, hd + got, sizeof hd - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    // ours: the magic, the header's size and the header's own checksum (whatever its version or
    // what follows: a stale or damaged cache of ours is written again)
    bool ours = got == sizeof hd && memcmp(hd, TRI_PCACHE_MAGIC, 8) == 0 && get32(hd + 12) == TRI_PCACHE_HEADER_BYTES;
    if (ours) {
        uint64_t sum = 0;
        for (int i = 7; i >= 0; i--) sum = sum << 8 | hd[120 + i];
        ours = sum == tri__pcache_sum(hd, 120, 0);
    }
    if (!ours)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                         "prompt cache %s: not replaced: the file exists (%lld bytes) and is not a prompt cache (no "
                         "valid prompt cache header); give another path, or delete it if it is a cache of ours",
                         path, (long long)sb.st_size);
    return TRI_STATUS_OK;
}

tri_status tri__pcache_write(const char *path, tri__pcache_header *h, const int32_t *tokens, const float *logits,
                             tri__pcache_fill_fn fill, void *user, tri__pcache_io *io) {
    double t0 = tri__now_seconds();
    h->version = TRI_PCACHE_VERSION;
    h->block_tokens = 0;
    TRY(tri__pcache_layout(h));
    TRY(tri__pcache_may_replace(path));
    char *tmp = malloc(strlen(path) + 32);
    if (!tmp) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s", path);
    sprintf(tmp, "%s.tmp.%ld", path, (long)getpid());
    uint64_t *sums = calloc((size_t)h->n_blocks, sizeof *sums);
    void *region = NULL;
    engine e;
    tri_status st = sums ? TRI_STATUS_OK : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s", path);
    int32_t n_slots = h->n_blocks < N_SLOTS ? h->n_blocks : N_SLOTS;
    if (!st) st = engine_open(&e, tmp, true, n_slots, (size_t)h->block_bytes);
    if (st) {
        free(sums);
        free(tmp);
        return st;
    }
    // the blocks, N_SLOTS in flight: block b fills slot b % N_SLOTS once its last write is done
    for (int32_t b = 0; b < h->n_blocks && !st; b++) {
        int32_t s = b % n_slots, tok0 = b * h->block_tokens;
        int32_t nb = h->n_tokens - tok0 < h->block_tokens ? h->n_tokens - tok0 : h->block_tokens;
        if ((st = engine_wait(&e, s))) break;
        uint64_t payload = tri__pcache_payload_bytes(h, nb), padded = align_up(payload);
        char *buf = slot_buf(&e, s);
        if ((st = fill(user, b, tok0, nb, buf))) break;
        memset(buf + payload, 0, (size_t)(padded - payload));
        sums[b] = tri__pcache_sum(buf, (size_t)payload, (uint64_t)b);
        st = engine_submit(&e, s, h->region_bytes + (uint64_t)b * h->block_bytes, (size_t)padded);
    }
    tri_status st2 = engine_drain(&e);
    if (!st) st = st2;
    // the region last: header, tokens, logits, block sums
    if (!st && posix_memalign(&region, ALIGN, (size_t)h->region_bytes) != 0) {
        region = NULL;
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: %llu-byte header region", path,
                       (unsigned long long)h->region_bytes);
    }
    if (!st) {
        char *r = region;
        memset(r, 0, (size_t)h->region_bytes);
        memcpy(r + TRI_PCACHE_HEADER_BYTES, tokens, 4 * (size_t)h->n_tokens);
        if (h->flags & TRI_PCACHE_LOGITS) memcpy((void *)tri__pcache_logits(h, r), logits, 4 * (size_t)h->n_vocab);
        memcpy((void *)tri__pcache_block_sums(h, r), sums, 8 * (size_t)h->n_blocks);
        h->region_sum = tri__pcache_sum(r + TRI_PCACHE_HEADER_BYTES, h->region_bytes - TRI_PCACHE_HEADER_BYTES, 0);
        encode_header(h, (unsigned char *)r);
        st = sync_io(&e, r, (size_t)h->region_bytes, 0, false, NULL);
    }
    if (!st && fdatasync(e.fd) != 0)
        st = tri__fail(TRI_STATUS_IO, "prompt cache %s: fdatasync: %s", tmp, strerror(errno));
    if (io) *io = (tri__pcache_io){.bytes = e.bytes, .uring = e.uring, .direct = e.direct};
    engine_close(&e);
    if (!st && rename(tmp, path) != 0)
        st = tri__fail(TRI_STATUS_IO, "prompt cache %s: rename from %s: %s", path, tmp, strerror(errno));
    if (st) unlink(tmp);
    if (io) io->seconds = tri__now_seconds() - t0;
    free(region);
    free(sums);
    free(tmp);
    return st;
}

// ---- reader ----

struct tri__pcache_file {
    char *path;
    engine e;
    tri__pcache_header h;
    void *region;  // (h.region_bytes) ALIGN-aligned
    double t_open;
};

void tri__pcache_close(tri__pcache_file *f) {
    if (!f) return;
    engine_close(&f->e);
    free(f->region);
    free(f->path);
    free(f);
}

tri_status tri__pcache_open(const char *path, tri__pcache_file **out) {
    *out = NULL;
    tri__pcache_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s", path);
    }
    f->t_open = tri__now_seconds();
    f->e.fd = -1;
    tri_status st = engine_open(&f->e, f->path, false, 1, ALIGN);
    struct stat sb;
    if (!st && fstat(f->e.fd, &sb) != 0)
        st = tri__fail(TRI_STATUS_IO, "prompt cache %s: fstat: %s", path, strerror(errno));
    size_t got = 0;
    if (!st) st = sync_io(&f->e, f->e.mem, ALIGN, 0, true, &got);
    if (!st) st = tri__pcache_parse_header(path, f->e.mem, got, (uint64_t)sb.st_size, &f->h);
    if (!st && posix_memalign(&f->region, ALIGN, (size_t)f->h.region_bytes) != 0) {
        f->region = NULL;
        st = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: %llu-byte header region", path,
                       (unsigned long long)f->h.region_bytes);
    }
    if (!st) st = sync_io(&f->e, f->region, (size_t)f->h.region_bytes, 0, false, NULL);
    if (!st) st = tri__pcache_check_region(path, &f->h, f->region);
    if (st) {
        tri__pcache_close(f);
        return st;
    }
    *out = f;
    return TRI_STATUS_OK;
}

const tri__pcache_header *tri__pcache_file_header(const tri__pcache_file *f) { return &f->h; }
const void *tri__pcache_file_region(const tri__pcache_file *f) { return f->region; }

tri_status tri__pcache_read(tri__pcache_file *f, int32_t n_use, tri__pcache_take_fn take, void *user,
                            tri__pcache_io *io, int32_t *n_taken) {
    const tri__pcache_header *h = &f->h;
    int32_t bad = -1;  // the first block that failed its checksum
    if (n_taken) *n_taken = 0;
    if (n_use < 0 || n_use > h->n_tokens)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "prompt cache %s: %d tokens wanted, %d held", f->path, n_use,
                         h->n_tokens);
    int32_t n_read = (int32_t)(((int64_t)n_use + h->block_tokens - 1) / h->block_tokens);
    const uint64_t *sums = tri__pcache_block_sums(h, f->region);
    tri_status st = TRI_STATUS_OK;
    if (n_read > 0) {  // the slots, sized now: a block each
        engine *e = &f->e;
        int32_t n_slots = n_read < N_SLOTS ? n_read : N_SLOTS;
        free(e->mem);
        e->n_slots = n_slots;
        e->slot_bytes = (size_t)h->block_bytes;
        if (posix_memalign(&e->mem, ALIGN, (size_t)n_slots * e->slot_bytes) != 0) {
            e->mem = NULL;
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "prompt cache %s: %d staging blocks of %llu bytes", f->path,
                             n_slots, (unsigned long long)h->block_bytes);
        }
        // block b lands in slot b % n_slots; the slot is read again for b + n_slots once taken
        for (int32_t b = 0; b < n_read && b < n_slots && !st; b++) {
            int32_t nb = h->n_tokens - b * h->block_tokens < h->block_tokens ? h->n_tokens - b * h->block_tokens
                                                                             : h->block_tokens;
            st = engine_submit(e, b, h->region_bytes + (uint64_t)b * h->block_bytes,
                               (size_t)align_up(tri__pcache_payload_bytes(h, nb)));
        }
        for (int32_t b = 0; b < n_read && !st; b++) {
            int32_t s = b % n_slots, tok0 = b * h->block_tokens;
            int32_t nb = h->n_tokens - tok0 < h->block_tokens ? h->n_tokens - tok0 : h->block_tokens;
            if ((st = engine_wait(e, s))) break;
            const void *buf = slot_buf(e, s);
            if (tri__pcache_sum(buf, (size_t)tri__pcache_payload_bytes(h, nb), (uint64_t)b) != sums[b]) {
                // the blocks before it were checked and taken: they are the good prefix
                if (b == 0)
                    st = tri__fail(TRI_STATUS_BAD_FORMAT,
                                   "prompt cache %s: block 0 (tokens 0 .. %d) fails its checksum (corrupt file)",
                                   f->path, nb - 1);
                else
                    tri__log(TRI_LOG_LEVEL_WARN,
                             "prompt cache %s: block %d (tokens %d .. %d) fails its checksum (corrupt file): the %d "
                             "tokens before it are used",
                             f->path, b, tok0, tok0 + nb - 1, tok0);
                bad = b;
                break;
            }
            int32_t use = n_use - tok0 < nb ? n_use - tok0 : nb;
            if ((st = take(user, b, tok0, nb, use, buf))) break;
            int32_t nxt = b + n_slots;
            if (nxt < n_read) {
                int32_t t1 = nxt * h->block_tokens;
                int32_t nb1 = h->n_tokens - t1 < h->block_tokens ? h->n_tokens - t1 : h->block_tokens;
                st = engine_submit(e, s, h->region_bytes + (uint64_t)nxt * h->block_bytes,
                                   (size_t)align_up(tri__pcache_payload_bytes(h, nb1)));
            }
        }
        tri_status st2 = engine_drain(e);
        if (!st) st = st2;
    }
    if (!st && n_taken) *n_taken = bad < 0 ? n_use : bad * h->block_tokens;
    if (io)
        *io = (tri__pcache_io){
            .bytes = f->e.bytes, .seconds = tri__now_seconds() - f->t_open, .uring = f->e.uring, .direct = f->e.direct};
    return st;
}

// ---- the disk's peak ----

tri_status tri__pcache_disk_peak(const char *path, uint64_t bytes, double *write_gbps, double *read_gbps) {
    const size_t req = 4u << 20;
    const int32_t depth = 16;
    uint64_t n_req = (bytes + req - 1) / req;
    if (n_req < 1) n_req = 1;
    char *tmp = malloc(strlen(path) + 32);
    if (!tmp) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "disk peak");
    sprintf(tmp, "%s.peak.%ld", path, (long)getpid());
    engine e;
    tri_status st = engine_open(&e, tmp, true, depth, req);
    if (st) {
        free(tmp);
        return st;
    }
    for (int32_t s = 0; s < depth; s++) memset(slot_buf(&e, s), 0x5a + s, req);  // not zeros: no sparse shortcut
    double t0 = tri__now_seconds();
    for (uint64_t i = 0; i < n_req && !st; i++) {
        int32_t s = (int32_t)(i % (uint64_t)depth);
        if (!(st = engine_wait(&e, s))) st = engine_submit(&e, s, i * req, req);
    }
    tri_status st2 = engine_drain(&e);
    if (!st) st = st2;
    if (!st && fdatasync(e.fd) != 0) st = tri__fail(TRI_STATUS_IO, "disk peak %s: fdatasync: %s", tmp, strerror(errno));
    double t1 = tri__now_seconds();
    // without O_DIRECT the pages would answer the reads: written back by now, they can be dropped
    if (!st) (void)posix_fadvise(e.fd, 0, 0, POSIX_FADV_DONTNEED);
    engine_close(&e);
    if (!st) st = engine_open(&e, tmp, false, depth, req);
    double t2 = tri__now_seconds();
    for (uint64_t i = 0; i < n_req && !st; i++) {
        int32_t s = (int32_t)(i % (uint64_t)depth);
        if (!(st = engine_wait(&e, s))) st = engine_submit(&e, s, i * req, req);
    }
    if (e.fd >= 0) {
        st2 = engine_drain(&e);
        if (!st) st = st2;
    }
    double t3 = tri__now_seconds();
    engine_close(&e);
    unlink(tmp);
    free(tmp);
    if (st) return st;
    *write_gbps = (double)(n_req * req) / (t1 - t0) / 1e9;
    *read_gbps = (double)(n_req * req) / (t3 - t2) / 1e9;
    return TRI_STATUS_OK;
}
