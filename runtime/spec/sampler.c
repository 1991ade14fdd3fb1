// sampler.c - temperature, top-k, top-p, and a reproducible RNG.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

// ---- rng ----

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tri__rng_seed(tri__rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tri__rng_next(tri__rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tri__rng_uniform(tri__rng *rng) { return (double)(tri__rng_next(rng) >> 11) * 0x1p-53; }

// ---- distributions ----

tri_sampler_params tri_sampler_default_params(void) {
    tri_sampler_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}

int32_t tri__argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void tri__sampler_scratch_free(tri__sampler_scratch *s) {
    free(s->idx);
    s->idx = NULL;
    s->cap = 0;
}

// Sort order for the nucleus: descending probability, ascending id on ties (a total order, so
// the kept set does not depend on the sort algorithm).
static int by_prob_desc(const void *a, const void *b, void *probs) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float pi = ((const float *)probs)[i], pj = ((const float *)probs)[j];
    if (pi != pj) return pi > pj ? -1 : 1;
    return (i > j) - (i < j);
}

tri_status tri__sampler_probs(const tri_sampler_params *params, const float *logits, int32_t n_vocab,
                              float *probs, tri__sampler_scratch *scratch) {
    if (params->temperature <= 0.0f) {
        memset(probs, 0, (size_t)n_vocab * sizeof *probs);
        probs[tri__argmax(logits, n_vocab)] = 1.0f;
        return TRI_STATUS_OK;
    }
    // softmax(logits / T) in double for the normaliser: 128K terms of very different size
    float max = logits[tri__argmax(logits, n_vocab)];
    double inv_t = 1.0 / (double)params->temperature, sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        probs[i] = (float)exp(((double)logits[i] - (double)max) * inv_t);
        sum += probs[i];
    }
    bool top_k = params->top_k > 0 && params->top_k < n_vocab;
    bool top_p = params->top_p > 0.0f && params->top_p < 1.0f;
    if (!top_k && !top_p) {
        float inv = (float)(1.0 / sum);
        for (int32_t i = 0; i < n_vocab; i++) probs[i] *= inv;
        return TRI_STATUS_OK;
    }

    if (scratch->cap < n_vocab) {
        int32_t *idx = realloc(scratch->idx, (size_t)n_vocab * sizeof *idx);
        if (!idx) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sampler: %d-entry scratch", n_vocab);
        scratch->idx = idx;
        scratch->cap = n_vocab;
    }
    int32_t *idx = scratch->idx;
    for (int32_t i = 0; i < n_vocab; i++) idx[i] = i;
    // The single-threaded qsort is the simple total order we need; a hot path only at sampling
    // temperatures > 0, where the forward pass dominates anyway.
    qsort_r(idx, (size_t)n_vocab, sizeof *idx, by_prob_desc, probs);

    int32_t keep = top_k ? params->top_k : n_vocab;
    if (top_p) {
        double kept_sum = 0.0;
        for (int32_t i = 0; i < keep; i++) kept_sum += probs[idx[i]];
        // HF's order: top-k first, then top-p over the renormalised top-k mass.
        double target = (double)params->top_p * kept_sum, cum = 0.0;
        int32_t n = 0;
        while (n < keep) {
            cum += probs[idx[n++]];
            if (cum >= target) break;
        }
        keep = n;
    }
    double kept = 0.0;
    for (int32_t i = 0; i < keep; i++) kept += probs[idx[i]];
    float inv = (float)(1.0 / kept);
    for (int32_t i = 0; i < keep; i++) probs[idx[i]] *= inv;
    for (int32_t i = keep; i < n_vocab; i++) probs[idx[i]] = 0.0f;
    return TRI_STATUS_OK;
}

int32_t tri__sample(const float *probs, int32_t n, tri__rng *rng) {
    double u = tri__rng_uniform(rng), cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    // rounding left u above the total: the last token with mass takes the remainder
    TRI_ASSERT(last >= 0);
    return last;
}
