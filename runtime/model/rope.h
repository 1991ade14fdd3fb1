// rope.h - rotary position embedding tables shared by every backend (internal).
//
// The frequencies are computed once from tri_model_config, following HF transformers' rope init
// functions (_compute_default/linear/dynamic_ntk/yarn/llama3_parameters). A backend's rope kernel
// rotates pair i of a head by angle (float)pos * inv_freq[i] and multiplies cos and sin by
// attn_factor:
//   x0' = (x0 cos - x1 sin) * attn_factor,  x1' = (x0 sin + x1 cos) * attn_factor
// where (x0, x1) are elements (2i, 2i + 1) in the ADJACENT layout and (i, i + head_dim / 2) in the
// HALF layout. The angle is a float32 product, as HF computes it, so that logits match HF's.
#ifndef TRI_ROPE_H
#define TRI_ROPE_H

#include <stdint.h>

#include "triforce.h"

typedef struct tri__rope {
    tri_rope_layout layout;
    int32_t head_dim;     // elements per head; even
    float attn_factor;    // multiplies cos and sin (YaRN's mscale; 1 otherwise)
    float *inv_freq;      // (head_dim / 2) radians per position, owned; host memory

    // ---- kept for the dynamic rule (tri__rope_update) ----
    tri_rope_scaling scaling;
    float theta;          // the configured base
    float factor;
    int32_t orig_ctx;     // original context; the dynamic rule starts past it (for HF
                          // checkpoints max_position_embeddings, transformers' original_max_seq_len)
    int64_t seq_len;      // the sequence length inv_freq was computed for (dynamic); 0 otherwise
    float *freq_div;      // (head_dim / 2) per-pair divisors (GGUF rope_freqs; LongRoPE's in use), owned,
                          // or NULL
    float *long_div;      // LONGROPE: (head_dim / 2) the divisors not in use, owned; seq_len is 1
                          // while the long ones are in freq_div, else 0
} tri__rope;

// Computes the table for cfg. freq_div, if not NULL, holds head_dim / 2 per-pair frequency
// divisors (llama.cpp's rope_freqs.weight, f32): inv_freq[i] is divided by freq_div[i]. Those
// divisors already encode Llama-3 scaling, so with freq_div the LLAMA3 rule is not applied again.
// Fails with TRI_STATUS_INVALID_ARGUMENT on an odd or non-positive head_dim, a non-positive theta,
// or a scaling rule whose parameters are out of range. Free with tri__rope_free().
tri_status tri__rope_init(tri__rope *rope, const tri_model_config *cfg, const float *freq_div);
void tri__rope_free(tri__rope *rope);

// LONGROPE: the short and long per-pair divisors ((head_dim / 2) each, copied). The table starts
// with the short ones; tri__rope_update(rope, n) takes the long ones when n > orig_ctx and the
// short ones again otherwise (transformers decides per forward call by its last position).
tri_status tri__rope_set_longrope(tri__rope *rope, const float *short_div, const float *long_div);

// Dynamic NTK only (a no-op for the other rules), as HF's dynamic_rope_update does: when seq_len
// exceeds both orig_ctx and the longest length seen so far, the base grows to
//   theta * (factor * seq_len / orig_ctx - (factor - 1)) ^ (head_dim / (head_dim - 2))
// and inv_freq is recomputed; when seq_len falls below orig_ctx the original table returns.
// Keys already in a cache keep the rotation they were stored with.
void tri__rope_update(tri__rope *rope, int64_t seq_len);

#endif  // TRI_ROPE_H
