// test-sampler.c - sampling distributions against numpy following HF's warpers; the RNG and the
// draw against their distributions.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sampler.h"
#include "test-util.h"

Test(sampler, probs_match_hf_warpers) {
    size_t len;
    uint8_t *buf = tt_read_file(tt_fixture("sampler", "cases.bin"), &len);
    size_t off = 0;
    int n_cases = 0;
    tri__sampler_scratch scratch = {0};
    while (off < len) {
        int32_t n, top_k;
        float temp, top_p;
        memcpy(&n, buf + off, 4);
        memcpy(&temp, buf + off + 4, 4);
        memcpy(&top_k, buf + off + 8, 4);
        memcpy(&top_p, buf + off + 12, 4);
        off += 16;
        float *logits = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        memcpy(logits, buf + off, (size_t)n * 4);
        memcpy(want, buf + off + (size_t)n * 4, (size_t)n * 4);
        off += (size_t)n * 8;
        tri_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p};
        cr_assert_eq(tri__sampler_probs(&p, NULL, 0, logits, n, got, &scratch), TRI_STATUS_OK);
        double sum = 0;
        for (int32_t i = 0; i < n; i++) {
            sum += got[i];
            // zero exactly where HF removed the token; otherwise within f32 rounding
            cr_assert_eq(got[i] == 0.0f, want[i] == 0.0f, "n=%d T=%g k=%d p=%g token %d: %g vs %g",
                         n, (double)temp, top_k, (double)top_p, i, (double)got[i], (double)want[i]);
            cr_assert(fabsf(got[i] - want[i]) <= 1e-6f + 1e-4f * want[i],
                      "n=%d T=%g k=%d p=%g token %d: %g vs %g", n, (double)temp, top_k, (double)top_p, i,
                      (double)got[i], (double)want[i]);
        }
        cr_assert(fabs(sum - 1.0) < 1e-4);
        free(logits);
        free(want);
        free(got);
        n_cases++;
    }
    cr_assert(n_cases >= 28);
    tri__sampler_scratch_free(&scratch);
    free(buf);
}

// Penalties over a window of the context, then temperature, top-k, top-p and min-p, against numpy
// following HF's RepetitionPenaltyLogitsProcessor and MinPLogitsWarper and OpenAI's presence and
// frequency penalties (tests/fixtures/make-sampler.py); temperature 0 is the penalised argmax.
Test(sampler, penalties_and_min_p_match_the_reference) {
    size_t len;
    uint8_t *buf = tt_read_file(tt_fixture("sampler", "penalties.bin"), &len);
    size_t off = 0;
    int n_cases = 0, n_greedy = 0, n_changed = 0;
    tri__sampler_scratch scratch = {0};
    while (off < len) {
        int32_t n, top_k, last_n, n_ctx;
        float temp, top_p, min_p, rep, pres, freq;
        memcpy(&n, buf + off, 4);
        memcpy(&temp, buf + off + 4, 4);
        memcpy(&top_k, buf + off + 8, 4);
        memcpy(&top_p, buf + off + 12, 4);
        memcpy(&min_p, buf + off + 16, 4);
        memcpy(&rep, buf + off + 20, 4);
        memcpy(&pres, buf + off + 24, 4);
        memcpy(&freq, buf + off + 28, 4);
        memcpy(&last_n, buf + off + 32, 4);
        memcpy(&n_ctx, buf + off + 36, 4);
        off += 40;
        int32_t *ctx = malloc((size_t)n_ctx * 4);
        memcpy(ctx, buf + off, (size_t)n_ctx * 4);
        off += (size_t)n_ctx * 4;
        float *logits = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        float *plain = malloc((size_t)n * 4);
        memcpy(logits, buf + off, (size_t)n * 4);
        memcpy(want, buf + off + (size_t)n * 4, (size_t)n * 4);
        off += (size_t)n * 8;
        tri_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                .repeat_penalty = rep, .presence_penalty = pres, .frequency_penalty = freq,
                                .penalty_last_n = last_n};
        cr_assert_eq(tri_sampler_params_check(&p), TRI_STATUS_OK);
        cr_assert_eq(tri__sampler_probs(&p, ctx, n_ctx, logits, n, got, &scratch), TRI_STATUS_OK);
        double sum = 0;
        for (int32_t i = 0; i < n; i++) {
            sum += got[i];
            cr_assert_eq(got[i] == 0.0f, want[i] == 0.0f, "case %d n=%d T=%g token %d: %g vs %g", n_cases, n,
                         (double)temp, i, (double)got[i], (double)want[i]);
            cr_assert(fabsf(got[i] - want[i]) <= 1e-6f + 1e-4f * want[i], "case %d n=%d T=%g token %d: %g vs %g",
                      n_cases, n, (double)temp, i, (double)got[i], (double)want[i]);
        }
        cr_assert(fabs(sum - 1.0) < 1e-4);
        // the penalties matter in the cases: without the context the distribution differs
        cr_assert_eq(tri__sampler_probs(&p, NULL, 0, logits, n, plain, &scratch), TRI_STATUS_OK);
        bool changed = false;
        for (int32_t i = 0; i < n; i++) changed |= fabsf(plain[i] - want[i]) > 1e-3f;
        n_changed += changed;
        if (temp <= 0.0f) {  // greedy: the one-hot's token is tri__sampler_greedy's
            int32_t tok;
            cr_assert_eq(tri__sampler_greedy(&p, ctx, n_ctx, logits, n, &scratch, &tok), TRI_STATUS_OK);
            cr_assert_eq(want[tok], 1.0f);
            n_greedy++;
        }
        free(ctx);
        free(logits);
        free(want);
        free(got);
        free(plain);
        n_cases++;
    }
    cr_assert(n_cases >= 30 && n_greedy >= 6, "%d cases, %d greedy", n_cases, n_greedy);
    cr_assert(n_changed >= 12, "the penalties changed only %d of %d cases", n_changed, n_cases);
    // scratch's counts are left at zero: a call without penalties after many with them
    for (int32_t i = 0; i < scratch.cap; i++) cr_assert_eq(scratch.count[i], 0);
    tri__sampler_scratch_free(&scratch);
    free(buf);
}

Test(sampler, params_check_names_the_field) {
    tri_sampler_params ok = tri_sampler_default_params();
    cr_assert_eq(tri_sampler_params_check(&ok), TRI_STATUS_OK);
    tri_sampler_params chat = tri_sampler_chat_params();
    cr_assert_eq(tri_sampler_params_check(&chat), TRI_STATUS_OK);
    cr_assert_eq(chat.seed, TRI_SEED_RANDOM);
    cr_assert(chat.temperature == 0.8f && chat.top_k == 40 && chat.top_p == 0.95f && chat.min_p == 0.05f);
    cr_assert(chat.repeat_penalty == 1.1f && chat.penalty_last_n == 64 && chat.presence_penalty == 0.0f);
    struct {
        const char *field;
        tri_sampler_params p;
    } bad[] = {
        {"temperature", {.temperature = NAN}},   {"top_k", {.top_k = -1}},
        {"top_p", {.top_p = 1.5f}},              {"min_p", {.min_p = -0.1f}},
        {"repeat_penalty", {.repeat_penalty = -1.0f}}, {"presence_penalty", {.presence_penalty = 1000.0f}},
        {"frequency_penalty", {.frequency_penalty = NAN}}, {"penalty_last_n", {.penalty_last_n = -2}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tri_sampler_params_check(&bad[i].p), TRI_STATUS_INVALID_ARGUMENT, "%s", bad[i].field);
        cr_assert(strstr(tri_last_error(), bad[i].field), "%s: %s", bad[i].field, tri_last_error());
    }
    cr_assert_eq(tri_sampler_params_check(NULL), TRI_STATUS_INVALID_ARGUMENT);
}

Test(sampler, random_seed_differs_between_seedings) {
    tri__rng a, b;
    tri__rng_seed_param(&a, TRI_SEED_RANDOM);
    tri__rng_seed_param(&b, TRI_SEED_RANDOM);
    cr_assert_neq(tri__rng_next(&a), tri__rng_next(&b));  // 2^-64 to fail by chance
    tri__rng_seed_param(&a, 5);
    tri__rng_seed(&b, 5);
    cr_assert_eq(tri__rng_next(&a), tri__rng_next(&b));
}

Test(sampler, greedy_is_argmax_lowest_on_ties) {
    float logits[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 0.0f};
    float probs[6];
    tri__sampler_scratch scratch = {0};
    tri_sampler_params p = tri_sampler_default_params();
    cr_assert_eq(tri__sampler_probs(&p, NULL, 0, logits, 6, probs, &scratch), TRI_STATUS_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(probs[i], i == 1 ? 1.0f : 0.0f);
    tri__rng rng;
    tri__rng_seed(&rng, 3);
    for (int i = 0; i < 100; i++) cr_assert_eq(tri__sample(probs, 6, &rng), 1);
}

Test(sampler, rng_reproducible_and_uniform) {
    tri__rng a, b;
    tri__rng_seed(&a, 42);
    tri__rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) cr_assert_eq(tri__rng_next(&a), tri__rng_next(&b));
    tri__rng_seed(&b, 43);
    cr_assert_neq(tri__rng_next(&a), tri__rng_next(&b));
    // 20 equal bins, 200000 draws: chi-square with 19 degrees of freedom; 43.8 is its 0.999
    // quantile, so this fails by chance once in a thousand seeds (the seed is fixed).
    int bins[20] = {0};
    for (int i = 0; i < 200000; i++) {
        double u = tri__rng_uniform(&a);
        cr_assert(u >= 0.0 && u < 1.0);
        bins[(int)(u * 20)]++;
    }
    double chi2 = 0;
    for (int i = 0; i < 20; i++) chi2 += (bins[i] - 10000.0) * (bins[i] - 10000.0) / 10000.0;
    cr_assert(chi2 < 43.8, "chi2 = %g", chi2);
}

Test(sampler, draws_follow_the_distribution) {
    // 8 tokens, one with zero mass; chi-square over 100000 draws with 6 degrees of freedom
    // (7 non-empty cells); 22.46 is the 0.999 quantile.
    const float probs[8] = {0.05f, 0.25f, 0.0f, 0.1f, 0.3f, 0.15f, 0.1f, 0.05f};
    int counts[8] = {0};
    tri__rng rng;
    tri__rng_seed(&rng, 9);
    const int n = 100000;
    for (int i = 0; i < n; i++) counts[tri__sample(probs, 8, &rng)]++;
    cr_assert_eq(counts[2], 0, "a zero-probability token was drawn");
    double chi2 = 0;
    for (int i = 0; i < 8; i++) {
        if (probs[i] == 0) continue;
        double e = probs[i] * n;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    cr_assert(chi2 < 22.46, "chi2 = %g", chi2);
}
