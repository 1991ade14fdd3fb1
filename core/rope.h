// rope.h - rotary position embedding tables shared by every backend (internal).
//
// The frequencies are computed from tri_model_config, following HF transformers' rope init
// functions (_compute_default/linear/dynamic_ntk/yarn/llama3_parameters, Phi-3's LongRoPE): once,
// or, for the rules that depend on the sequence's length, per context and position (below; run
// them through tri__rope_apply). A backend's rope kernel rotates pair i of a head by angle
// (float)pos * inv_freq[i] and multiplies cos and sin by attn_factor:
//   x0' = (x0 cos - x1 sin) * attn_factor,  x1' = (x0 sin + x1 cos) * attn_factor
// where (x0, x1) are elements (2i, 2i + 1) in the ADJACENT layout and (i, i + head_dim / 2) in the
// HALF layout. The angle is a float32 product, as HF computes it, so that logits match HF's.
#ifndef TRI_ROPE_H
#define TRI_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

typedef struct tri__rope {
    tri_rope_layout layout;
    int32_t head_dim;     // elements per head; even
    float attn_factor;    // multiplies cos and sin (YaRN's mscale; LongRoPE's; 1 otherwise)
    float *inv_freq;      // (head_dim / 2) radians per position for positions below split, owned;
                          // host memory

    // ---- the rules that depend on the sequence's length (LongRoPE, dynamic NTK) ----
    //
    // transformers computes their table per forward call from the call's length (its last position
    // + 1), and its generate runs the prompt in one call, then one token per call, the cache keeping
    // each key as it was rotated. We make that a rule of positions, so that it does not depend on
    // how the tokens are cut into calls (n_batch pieces, speculative passes, API evals): with P the
    // length of the context's first evaluation (its prompt), the token at position p, its query and
    // its key, is rotated with the table transformers computes for length max(p + 1, P). Positions
    // below split share inv_freq (the table for length max(P, orig) with dynamic NTK; LongRoPE's
    // short factors when P <= orig, else its long ones); each position from split on takes the
    // table of its own length (tri__rope_freqs).
    tri_rope_scaling scaling;
    float theta;          // the configured base
    float factor;
    int32_t orig_ctx;     // original context; the rules change past it (for HF dynamic NTK
                          // max_position_embeddings, transformers' original_max_seq_len)
    int64_t n_prompt;     // P (tri__rope_set_prompt); 0 until set
    int64_t split;        // first position with a table of its own; INT64_MAX for the other rules
    float *freq_div;      // (head_dim / 2) per-pair divisors (GGUF rope_freqs; LongRoPE's short
                          // factors), owned, or NULL
    float *long_freq;     // LONGROPE: (head_dim / 2) the table with the long factors, owned
} tri__rope;

// Computes the table for cfg. freq_div, if not NULL, holds head_dim / 2 per-pair frequency
// divisors (llama.cpp's rope_freqs.weight, f32): inv_freq[i] is divided by freq_div[i]. Those
// divisors already encode Llama-3 scaling, so with freq_div the LLAMA3 rule is not applied again.
// Fails with TRI_STATUS_INVALID_ARGUMENT on an odd or non-positive head_dim, a non-positive theta,
// or a scaling rule whose parameters are out of range. The length rules start as for P = 0.
// Free with tri__rope_free().
tri_status tri__rope_init(tri__rope *rope, const tri_model_config *cfg, const float *freq_div);
void tri__rope_free(tri__rope *rope);

// LONGROPE: the short and long per-pair divisors ((head_dim / 2) each, copied).
tri_status tri__rope_set_longrope(tri__rope *rope, const float *short_div, const float *long_div);

// Sets P, the length of the context's first evaluation, and the tables that follow from it (see
// above); a no-op for the rules that do not depend on the length. Keys already in a cache keep the
// rotation they were stored with: call it when the cache is empty.
void tri__rope_set_prompt(tri__rope *rope, int64_t n_prompt);

// Whether first lengths a and b give every position the same table (rows cached under one may be
// reused under the other: a prompt cache's rows, written by a context whose P was a).
bool tri__rope_same_prompt(const tri__rope *rope, int64_t a, int64_t b);

// The table (head_dim / 2) of position pos: inv_freq below split, else the long table (LONGROPE)
// or the table for length pos + 1 written to scratch (DYNAMIC; head_dim / 2 floats).
const float *tri__rope_freqs(const tri__rope *rope, int64_t pos, float *scratch);

// The table transformers computes for a sequence of seq_len tokens (head_dim / 2 floats into out).
void tri__rope_table(const tri__rope *rope, int64_t seq_len, float *out);

struct tri__backend;

// Rotates x (m, n_heads, head_dim) f32 in backend memory, row i at position pos[i] (host), each row
// with its position's table: one backend rope op per run of rows that share a table.
tri_status tri__rope_apply(struct tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                           const tri__rope *rope);

#endif  // TRI_ROPE_H
