// prompt-cache.h - a session's KV cache on disk: the file format and its reader and writer
// (internal; the API is tri_session_save_prompt / tri_session_load_prompt, docs/formats.md).
//
// A file is a region of metadata followed by blocks of KV rows:
//
//   region (region_bytes, a multiple of TRI_PCACHE_ALIGN)
//     header      128 bytes, little-endian (tri__pcache_header), its own checksum last
//     tokens      (n_tokens) int32: the ids whose keys and values follow
//     logits      (n_vocab) f32 of the last token, when flags has TRI_PCACHE_LOGITS
//     block sums  (n_blocks) u64: the checksum of each block's payload
//     zeros       up to region_bytes
//   block b (at region_bytes + b * block_bytes) holds tokens [b * block_tokens, + nb) with
//     nb = block_tokens except for the last block: per layer, K rows (nb, n_head_kv, head_dim)
//     then V rows of the cache type, keys after RoPE; padded with zeros to a multiple of
//     TRI_PCACHE_ALIGN (block_bytes for a full block).
//
// A prefix of p tokens is the first ceil(p / block_tokens) blocks: one sequential read. Every
// block is checked against its sum as it arrives, the region against header.region_sum.
//
// I/O. io_uring (liburing) with O_DIRECT where the file system allows it, a few staging blocks in
// flight while the next is filled or emptied; pwrite / pread without liburing or where the kernel
// refuses io_uring. A file is written under a temporary name and renamed over path at the end, so
// a reader never sees half of one; a path that holds something other than a prompt cache is
// never replaced (tri__pcache_may_replace).
#ifndef TRI_PROMPT_CACHE_H
#define TRI_PROMPT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

#define TRI_PCACHE_MAGIC "TRIKVPC\0"  // 8 bytes
#define TRI_PCACHE_VERSION 2u         // 2: n_prompt
#define TRI_PCACHE_HEADER_BYTES 128u
#define TRI_PCACHE_ALIGN 4096u  // region and blocks: O_DIRECT's block size, the page size
#define TRI_PCACHE_LOGITS 1u    // flags: the last token's logits follow the tokens

typedef struct tri__pcache_header {
    uint32_t version;
    uint64_t model_id;      // tri__pcache_model_id of the model that computed the rows
    uint64_t region_bytes;  // header, tokens, logits, block sums, padding
    int32_t n_layer;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t kv_type;  // tri_dtype: F16 or F32
    int32_t n_vocab;
    int32_t n_ctx;         // the writing session's context
    int32_t n_tokens;      // >= 1
    int32_t block_tokens;  // >= 1
    int32_t n_blocks;      // ceil(n_tokens / block_tokens)
    uint32_t flags;        // TRI_PCACHE_LOGITS
    uint64_t block_bytes;  // bytes of a full block, padding included
    uint64_t region_sum;   // checksum of the region's bytes after the header (up to region_bytes)
    uint64_t file_bytes;   // the whole file's size
    int32_t n_prompt;      // the writer's P, the length of its context's first evaluation, for the rope
                           // scalings that depend on it (rope.h); 0 for the other rules
} tri__pcache_header;

// 64-bit checksum of n bytes (four independent lanes of multiply-rotate rounds over 8-byte words,
// then the tail and a final avalanche): several GB/s, so that checking costs little next to the
// disk. Not cryptographic: it detects corruption, not tampering.
uint64_t tri__pcache_sum(const void *data, size_t n, uint64_t seed);

// The model's identity: its family, its config (every rope field included), its tensor table
// (names, types, shapes, sizes) and the first 4 KiB of every tensor's data, so that another model
// or another fine-tune of the same shape gets another id. Independent of the file's path.
uint64_t tri__pcache_model_id(const tri_model *model);

// Bytes of one block's payload of nb tokens (before padding).
static inline uint64_t tri__pcache_payload_bytes(const tri__pcache_header *h, int32_t nb) {
    return 2ull * (uint64_t)h->n_layer * (uint64_t)nb * (uint64_t)h->n_head_kv * (uint64_t)h->head_dim *
           (h->kv_type == TRI_DTYPE_F32 ? 4u : 2u);
}

// Fills in block_tokens, n_blocks, block_bytes, region_bytes and file_bytes of h from its shape,
// n_tokens and flags. INVALID_ARGUMENT for a shape that is not one.
tri_status tri__pcache_layout(tri__pcache_header *h);

// Parses the fixed header at the start of a file of file_bytes bytes (data: len >= 128 bytes of
// it) into *h and checks it: magic, version, the header's checksum, every field's range and that
// the layout they give is the file's size. BAD_FORMAT naming path and the field otherwise.
tri_status tri__pcache_parse_header(const char *path, const void *data, size_t len, uint64_t file_bytes,
                                    tri__pcache_header *h);
// Checks the region (data: h->region_bytes bytes from the file's start) against h->region_sum
// and its tokens against [0, n_vocab). BAD_FORMAT otherwise.
tri_status tri__pcache_check_region(const char *path, const tri__pcache_header *h, const void *data);

// The region's parts (data: a checked region).
static inline const int32_t *tri__pcache_tokens(const void *region) {
    return (const int32_t *)((const char *)region + TRI_PCACHE_HEADER_BYTES);
}
const float *tri__pcache_logits(const tri__pcache_header *h, const void *region);  // NULL without
const uint64_t *tri__pcache_block_sums(const tri__pcache_header *h, const void *region);

// What the I/O did.
typedef struct tri__pcache_io {
    uint64_t bytes;  // bytes written or read, padding included
    double seconds;  // from the open to the rename (the data on disk: fdatasync), or to the last block
    bool uring;
    bool direct;
} tri__pcache_io;

// Writes the payload of block b (tokens tok0 .. tok0 + nb - 1) into buf (tri__pcache_payload_bytes).
typedef tri_status (*tri__pcache_fill_fn)(void *user, int32_t b, int32_t tok0, int32_t nb, void *buf);
// Takes the payload of block b, of which the first n_use of its nb tokens are wanted.
typedef tri_status (*tri__pcache_take_fn)(void *user, int32_t b, int32_t tok0, int32_t nb, int32_t n_use,
                                          const void *buf);

// Whether path may be replaced by a prompt cache: it does not exist, is an empty regular file, or
// is a regular file that starts with a prompt cache header of ours (magic, header size, the
// header's checksum), whatever its version or the rest. INVALID_ARGUMENT naming the file
// otherwise (a document given by mistake is never overwritten), IO when it cannot be read.
tri_status tri__pcache_may_replace(const char *path);

// Writes a file at path (refused, nothing written, where tri__pcache_may_replace refuses it): h (its shape, model_id, n_ctx, n_prompt, n_tokens, flags; the layout is filled in
// here), tokens (n_tokens), logits (n_vocab, when flags says so) and the blocks fill gives.
tri_status tri__pcache_write(const char *path, tri__pcache_header *h, const int32_t *tokens, const float *logits,
                             tri__pcache_fill_fn fill, void *user, tri__pcache_io *io);

// An open file whose header and region were read and checked.
typedef struct tri__pcache_file tri__pcache_file;
// NOT_FOUND when path does not exist; IO when it cannot be read; BAD_FORMAT for a file that is
// not a prompt cache, is truncated or fails a check.
tri_status tri__pcache_open(const char *path, tri__pcache_file **out);
const tri__pcache_header *tri__pcache_file_header(const tri__pcache_file *f);
const void *tri__pcache_file_region(const tri__pcache_file *f);
// Reads the blocks that hold tokens [0, n_use), checks each, and hands them to take in order. A
// block that fails its checksum ends the read there: the blocks before it are the good prefix and
// *n_taken (NULL: not wanted) their tokens, else n_use; block 0 failing is BAD_FORMAT.
tri_status tri__pcache_read(tri__pcache_file *f, int32_t n_use, tri__pcache_take_fn take, void *user,
                            tri__pcache_io *io, int32_t *n_taken);
void tri__pcache_close(tri__pcache_file *f);

// The disk's sequential speed where path would be: writes a scratch file of bytes (rounded to
// 4 MiB) beside it with the same engine at its best (4 MiB requests, 16 in flight, O_DIRECT where
// allowed, then fdatasync), reads it back, deletes it. GB/s (1e9 bytes per second) each way.
tri_status tri__pcache_disk_peak(const char *path, uint64_t bytes, double *write_gbps, double *read_gbps);

#endif  // TRI_PROMPT_CACHE_H
