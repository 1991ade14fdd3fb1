// sampler.h - turning logits into the distribution a token is drawn from, and drawing it (internal).
//
// Speculative decoding needs the exact distribution each token was drawn from (p for the
// verifier, q for the drafter), so the sampler's first step is a function from logits to a full,
// normalised distribution, and drawing is a separate step. The penalties make that function depend
// on the context before the token too: every caller passes it, so that each level of a speculative
// engine transforms its logits at a position by the same function of the same context.
#ifndef TRI_SAMPLER_H
#define TRI_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

// xoshiro256** seeded through splitmix64: fast, reproducible across platforms.
typedef struct tri__rng {
    uint64_t s[4];
} tri__rng;

void tri__rng_seed(tri__rng *rng, uint64_t seed);
// tri__rng_seed with a seed of tri_sampler_params: TRI_SEED_RANDOM draws one from getrandom()
// (the clock and the process id where that fails).
void tri__rng_seed_param(tri__rng *rng, uint64_t seed);
uint64_t tri__rng_next(tri__rng *rng);
// Uniform in [0, 1), 53 random bits.
double tri__rng_uniform(tri__rng *rng);

// Workspace of the sampler, grown to the vocabulary on first use.
typedef struct tri__sampler_scratch {
    int32_t *idx;    // (cap) candidate ids for top-k / top-p / min-p
    float *val;      // (cap) penalised logits, then the kept probabilities
    int32_t *count;  // (cap) occurrences in the penalty window; all 0 between calls
    int32_t cap;
} tri__sampler_scratch;

void tri__sampler_scratch_free(tri__sampler_scratch *s);

// Whether params change the logits according to the context (some penalty is on).
bool tri__sampler_penalises(const tri_sampler_params *params);

// probs (n_vocab) = the distribution to draw from after the context ctx[0..n_ctx) (ctx may be NULL
// when n_ctx is 0): the penalties over its last penalty_last_n tokens (triforce.h), softmax(logits
// / temperature), restricted to the top_k most likely tokens, then to the smallest prefix (by
// descending probability, ties by lower id) whose mass reaches top_p of what top_k kept, then to
// the tokens at least min_p times as likely as the most likely one, renormalised. temperature <= 0
// gives a one-hot at the argmax of the penalised logits (lowest id on ties): greedy decoding.
// Returns OUT_OF_MEMORY if scratch cannot grow.
tri_status tri__sampler_probs(const tri_sampler_params *params, const int32_t *ctx, int32_t n_ctx,
                              const float *logits, int32_t n_vocab, float *probs, tri__sampler_scratch *scratch);

// The greedy token after ctx: the argmax of the penalised logits (of logits themselves without
// penalties, with no work), lowest id on ties.
tri_status tri__sampler_greedy(const tri_sampler_params *params, const int32_t *ctx, int32_t n_ctx,
                               const float *logits, int32_t n_vocab, tri__sampler_scratch *scratch, int32_t *out);

// Draws from probs (n, summing to 1 up to rounding) by inverse CDF with one uniform from rng.
// Never returns a token of probability 0.
int32_t tri__sample(const float *probs, int32_t n, tri__rng *rng);

// The index of the largest value, lowest index on ties.
int32_t tri__argmax(const float *x, int32_t n);

#endif  // TRI_SAMPLER_H
