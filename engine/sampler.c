// sampler.c - penalties, temperature, top-k, top-p, min-p, and a reproducible RNG.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

void tri__rng_seed_param(tri__rng *rng, uint64_t seed) {
    if (seed == TRI_SEED_RANDOM) {
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        }
        seed = r;
    }
    tri__rng_seed(rng, seed);
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

// ---- parameters ----

tri_sampler_params tri_sampler_default_params(void) {
    tri_sampler_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0, .min_p = 0.0f,
                            .repeat_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                            .penalty_last_n = 0};
    return p;
}

tri_sampler_params tri_sampler_chat_params(void) {
    tri_sampler_params p = tri_sampler_default_params();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.1f;
    p.penalty_last_n = 64;
    p.seed = TRI_SEED_RANDOM;
    return p;
}

static tri_status check_range(const char *field, float v, float lo, float hi) {
    if (!isfinite(v) || v < lo || v > hi)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sampler: %s %g is outside [%g, %g]", field, (double)v,
                         (double)lo, (double)hi);
    return TRI_STATUS_OK;
}

tri_status tri_sampler_params_check(const tri_sampler_params *p) {
    if (!p) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_sampler_params_check: params is NULL");
    if (!isfinite(p->temperature))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sampler: temperature %g is not a finite number",
                         (double)p->temperature);
    if (p->top_k < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sampler: top_k %d is negative", p->top_k);
    TRY(check_range("top_p", p->top_p, 0.0f, 1.0f));
    TRY(check_range("min_p", p->min_p, 0.0f, 1.0f));
    TRY(check_range("repeat_penalty", p->repeat_penalty, 0.0f, 100.0f));
    TRY(check_range("presence_penalty", p->presence_penalty, -100.0f, 100.0f));
    TRY(check_range("frequency_penalty", p->frequency_penalty, -100.0f, 100.0f));
    if (p->penalty_last_n < -1)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "sampler: penalty_last_n %d is below -1 (the whole context)",
                         p->penalty_last_n);
    return TRI_STATUS_OK;
}

// ---- distributions ----

int32_t tri__argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void tri__sampler_scratch_free(tri__sampler_scratch *s) {
    free(s->idx);
    free(s->val);
    free(s->count);
    memset(s, 0, sizeof *s);
}

static tri_status scratch_grow(tri__sampler_scratch *s, int32_t n) {
    if (s->cap >= n) return TRI_STATUS_OK;
    int32_t *idx = realloc(s->idx, (size_t)n * sizeof *idx);
    if (idx) s->idx = idx;
    float *val = realloc(s->val, (size_t)n * sizeof *val);
    if (val) s->val = val;
    int32_t *count = calloc((size_t)n, sizeof *count);
    if (!idx || !val || !count) {
        free(count);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "sampler: %d-entry scratch", n);
    }
    free(s->count);
    s->count = count;
    s->cap = n;
    return TRI_STATUS_OK;
}

bool tri__sampler_penalises(const tri_sampler_params *p) {
    return (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

// x (n_vocab) <- x penalised for the tokens of the window: the last penalty_last_n of ctx[0..n_ctx).
// count is all 0 on entry and on return.
static void penalise(const tri_sampler_params *p, const int32_t *ctx, int32_t n_ctx, float *x, int32_t n_vocab,
                     int32_t *count) {
    int32_t w = p->penalty_last_n == 0 ? 64 : p->penalty_last_n;
    if (w < 0 || w > n_ctx) w = n_ctx;
    const int32_t *win = ctx + (n_ctx - w);
    for (int32_t i = 0; i < w; i++)
        if (win[i] >= 0 && win[i] < n_vocab) count[win[i]]++;
    const float rp = p->repeat_penalty > 0.0f ? p->repeat_penalty : 1.0f;
    for (int32_t i = 0; i < w; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= n_vocab || count[t] == 0) continue;
        float v = x[t];
        if (rp != 1.0f) v = v > 0.0f ? v / rp : v * rp;
        x[t] = v - ((float)count[t] * p->frequency_penalty + p->presence_penalty);
        count[t] = 0;  // once per distinct token; leaves count zeroed
    }
}

tri_status tri__sampler_greedy(const tri_sampler_params *params, const int32_t *ctx, int32_t n_ctx,
                               const float *logits, int32_t n_vocab, tri__sampler_scratch *scratch, int32_t *out) {
    if (!tri__sampler_penalises(params) || n_ctx == 0) {
        *out = tri__argmax(logits, n_vocab);
        return TRI_STATUS_OK;
    }
    TRY(scratch_grow(scratch, n_vocab));
    memcpy(scratch->val, logits, (size_t)n_vocab * sizeof *logits);
    penalise(params, ctx, n_ctx, scratch->val, n_vocab, scratch->count);
    *out = tri__argmax(scratch->val, n_vocab);
    return TRI_STATUS_OK;
}

// The total order of the candidates: descending probability, ascending id on ties (so the kept
// set does not depend on the sort or selection algorithm). better(i, j): i comes before j.
static inline bool better(const float *probs, int32_t i, int32_t j) {
    return probs[i] > probs[j] || (probs[i] == probs[j] && i < j);
}

static int by_prob_desc(const void *a, const void *b, void *probs) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return better(probs, i, j) ? -1 : better(probs, j, i) ? 1 : 0;
}

// heap[0..n): the root is the worst of them (a min-heap in the candidates' order)
static void sift_down(int32_t *heap, int32_t n, int32_t i, const float *probs) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && better(probs, heap[w], heap[l])) w = l;
        if (r < n && better(probs, heap[w], heap[r])) w = r;
        if (w == i) return;
        int32_t t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

// idx[0..k) <- the k first tokens of the order (in no particular order): O(n log k), and mostly one
// comparison per token, since few beat the heap's worst.
static void select_top_k(const float *probs, int32_t n, int32_t k, int32_t *idx) {
    for (int32_t i = 0; i < k; i++) idx[i] = i;
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(idx, k, i, probs);
    for (int32_t i = k; i < n; i++) {
        if (!better(probs, i, idx[0])) continue;
        idx[0] = i;
        sift_down(idx, k, 0, probs);
    }
}

// The mass of the tokens at least t likely.
static double mass_from(const float *probs, int32_t n, float t) {
    double m = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (probs[i] >= t) m += probs[i];
    return m;
}

tri_status tri__sampler_probs(const tri_sampler_params *params, const int32_t *ctx, int32_t n_ctx,
                              const float *logits, int32_t n_vocab, float *probs, tri__sampler_scratch *scratch) {
    const float *x = logits;
    if (tri__sampler_penalises(params) && n_ctx > 0) {
        TRY(scratch_grow(scratch, n_vocab));
        memcpy(scratch->val, logits, (size_t)n_vocab * sizeof *logits);
        penalise(params, ctx, n_ctx, scratch->val, n_vocab, scratch->count);
        x = scratch->val;
    }
    if (params->temperature <= 0.0f) {
        int32_t best = tri__argmax(x, n_vocab);
        memset(probs, 0, (size_t)n_vocab * sizeof *probs);
        probs[best] = 1.0f;
        return TRI_STATUS_OK;
    }
    // softmax(x / T) in double for the normaliser: 128K terms of very different size. probs holds
    // it unnormalised, the most likely token at exactly 1.
    float max = x[tri__argmax(x, n_vocab)];
    double inv_t = 1.0 / (double)params->temperature, sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        probs[i] = (float)exp(((double)x[i] - (double)max) * inv_t);
        sum += probs[i];
    }
    const bool top_k = params->top_k > 0 && params->top_k < n_vocab;
    const bool top_p = params->top_p > 0.0f && params->top_p < 1.0f;
    const bool min_p = params->min_p > 0.0f;
    if (!top_k && !top_p && !min_p) {
        float inv = (float)(1.0 / sum);
        for (int32_t i = 0; i < n_vocab; i++) probs[i] *= inv;
        return TRI_STATUS_OK;
    }

    TRY(scratch_grow(scratch, n_vocab));
    int32_t *idx = scratch->idx;
    // Each filter keeps a prefix of the order, so the kept set is the shortest of the three
    // prefixes. top_p's is measured against the mass top_k kept (HF's order: top-k, then top-p
    // over the renormalised top-k mass, then min-p); min_p's is relative to the most likely token,
    // at 1 here, whatever the renormalisations before it.
    int32_t n = n_vocab;
    double kept_sum = sum;
    if (top_k) {
        n = params->top_k;
        select_top_k(probs, n_vocab, n, idx);
        kept_sum = 0.0;
        for (int32_t i = 0; i < n; i++) kept_sum += probs[idx[i]];
    } else {
        // The nucleus is the first tokens of the order up to top_p of the mass: find a probability
        // t whose tokens (p >= t, a prefix of the order, ties all in or all out) hold that mass
        // with room to spare for rounding, and sort only those: a sort of all 49K tokens costs tens
        // of ms. t falls 16-fold until it is enough, then 6 bisections in log between the last two.
        if (top_p) {
            const double target = (double)params->top_p * sum + 1e-6 * sum;
            float good = 1.0f, bad = 1.0f;  // the most likely token is at 1
            double m = mass_from(probs, n_vocab, good);
            while (m < target && good > 1e-30f) {
                bad = good;
                good *= 1.0f / 16.0f;
                m = mass_from(probs, n_vocab, good);
            }
            if (m >= target) {
                for (int it = 0; it < 6 && bad > good; it++) {
                    float mid = sqrtf(good * bad);
                    if (mass_from(probs, n_vocab, mid) >= target) good = mid;
                    else bad = mid;
                }
                n = 0;
                for (int32_t i = 0; i < n_vocab; i++)
                    if (probs[i] >= good) idx[n++] = i;
            }
        }
        if (n == n_vocab)
            for (int32_t i = 0; i < n_vocab; i++) idx[i] = i;
    }
    if (min_p) {  // HF's MinPLogitsWarper drops p < min_p * max; the most likely token always stays
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (!(probs[idx[i]] < params->min_p)) idx[m++] = idx[i];
        n = m;
    }
    // The single-threaded qsort is the simple total order we need; top_k or min_p leave few to sort.
    qsort_r(idx, (size_t)n, sizeof *idx, by_prob_desc, probs);
    int32_t keep = n;
    if (top_p) {
        double target = (double)params->top_p * kept_sum, cum = 0.0;
        keep = 0;
        while (keep < n) {
            cum += probs[idx[keep++]];
            if (cum >= target) break;
        }
    }
    double kept = 0.0;
    for (int32_t i = 0; i < keep; i++) kept += probs[idx[i]];
    float inv = (float)(1.0 / kept);
    float *val = scratch->val;
    for (int32_t i = 0; i < keep; i++) val[i] = probs[idx[i]] * inv;
    memset(probs, 0, (size_t)n_vocab * sizeof *probs);
    for (int32_t i = 0; i < keep; i++) probs[idx[i]] = val[i];
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
