// sampler.h - turning logits into the distribution a token is drawn from, and drawing it (internal).
//
// Speculative decoding needs the exact distribution each token was drawn from (p for the
// verifier, q for the drafter), so the sampler's first step is a function from logits to a full,
// normalised distribution, and drawing is a separate step.
#ifndef TRI_SAMPLER_H
#define TRI_SAMPLER_H

#include <stdint.h>

#include "triforce.h"

// xoshiro256** seeded through splitmix64: fast, reproducible across platforms.
typedef struct tri__rng {
    uint64_t s[4];
} tri__rng;

void tri__rng_seed(tri__rng *rng, uint64_t seed);
uint64_t tri__rng_next(tri__rng *rng);
// Uniform in [0, 1), 53 random bits.
double tri__rng_uniform(tri__rng *rng);

// Workspace for tri__sampler_probs: holds n_vocab indices for the sort of top-k / top-p.
typedef struct tri__sampler_scratch {
    int32_t *idx;
    int32_t cap;
} tri__sampler_scratch;

void tri__sampler_scratch_free(tri__sampler_scratch *s);

// probs (n_vocab) = the distribution to draw from: softmax(logits / temperature), restricted to
// the top_k most likely tokens and then to the smallest prefix (by descending probability, ties
// by lower id) whose mass reaches top_p, renormalised. temperature <= 0 gives a one-hot at the
// argmax (lowest id on ties): greedy decoding. Returns OUT_OF_MEMORY if scratch cannot grow.
tri_status tri__sampler_probs(const tri_sampler_params *params, const float *logits, int32_t n_vocab,
                              float *probs, tri__sampler_scratch *scratch);

// Draws from probs (n, summing to 1 up to rounding) by inverse CDF with one uniform from rng.
// Never returns a token of probability 0.
int32_t tri__sample(const float *probs, int32_t n, tri__rng *rng);

// The index of the largest value, lowest index on ties.
int32_t tri__argmax(const float *x, int32_t n);

#endif  // TRI_SAMPLER_H
