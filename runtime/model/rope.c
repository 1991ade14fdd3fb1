// rope.c - rotary frequencies for every scaling rule, after HF transformers' rope init functions.
#include "rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define ROPE_PI 3.14159265358979323846

// The default table for base theta: inv_freq[i] = theta^(-2i / head_dim). Computed in double and
// rounded once; HF computes the power in float32, which differs by at most an ulp or two.
static void rope_default(float *inv_freq, int32_t head_dim, double theta) {
    for (int32_t i = 0; i < head_dim / 2; i++)
        inv_freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / head_dim));
}

// YaRN's correction dimension: the pair index whose wavelength fits n_rot rotations in orig_ctx.
static double yarn_corr_dim(double n_rot, int32_t dim, double theta, double orig_ctx) {
    return dim * log(orig_ctx / (n_rot * 2 * ROPE_PI)) / (2 * log(theta));
}

static void rope_yarn(tri__rope *rope, double theta, double factor, double orig_ctx,
                      double beta_fast, double beta_slow) {
    int32_t dim = rope->head_dim, half = dim / 2;
    // correction range, truncated to whole pairs as HF does by default (truncate=True)
    double low = floor(yarn_corr_dim(beta_fast, dim, theta, orig_ctx));
    double high = ceil(yarn_corr_dim(beta_slow, dim, theta, orig_ctx));
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;  // avoid a zero-width ramp
    for (int32_t i = 0; i < half; i++) {
        double pos_freq = pow(theta, (double)(2 * i) / dim);
        double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
        // ramp 0 below low (high frequencies: extrapolate), 1 above high (interpolate)
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double w_extra = 1.0 - ramp;
        rope->inv_freq[i] = (float)(inter * (1.0 - w_extra) + extra * w_extra);
    }
}

static void rope_llama3(tri__rope *rope, double factor, double low_ff, double high_ff,
                        double orig_ctx) {
    double low_wavelen = orig_ctx / low_ff, high_wavelen = orig_ctx / high_ff;
    for (int32_t i = 0; i < rope->head_dim / 2; i++) {
        double f = (double)rope->inv_freq[i];
        double wavelen = 2 * ROPE_PI / f;
        if (wavelen > low_wavelen) {
            f = f / factor;  // low frequencies: fully interpolated
        } else if (!(wavelen < high_wavelen)) {
            // medium: blend between interpolated and original
            double smooth = (orig_ctx / wavelen - low_ff) / (high_ff - low_ff);
            f = (1 - smooth) * f / factor + smooth * f;
        }
        rope->inv_freq[i] = (float)f;
    }
}

static void rope_apply_div(tri__rope *rope) {
    if (!rope->freq_div) return;
    for (int32_t i = 0; i < rope->head_dim / 2; i++) rope->inv_freq[i] /= rope->freq_div[i];
}

tri_status tri__rope_init(tri__rope *rope, const tri_model_config *cfg, const float *freq_div) {
    memset(rope, 0, sizeof *rope);
    int32_t dim = cfg->head_dim;
    if (dim <= 0 || dim % 2 != 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: head_dim %d is not a positive even number", dim);
    if (!(cfg->rope_theta > 1.0f))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: theta %g must be > 1", (double)cfg->rope_theta);
    if (cfg->rope_layout != TRI_ROPE_LAYOUT_ADJACENT && cfg->rope_layout != TRI_ROPE_LAYOUT_HALF)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: unknown layout %d", (int)cfg->rope_layout);
    double factor = (double)cfg->rope_factor;
    double orig = cfg->rope_orig_ctx;
    tri_rope_scaling sc = cfg->rope_scaling;
    if (sc != TRI_ROPE_SCALING_NONE && !(factor > 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: scaling factor %g must be > 0", factor);
    if ((sc == TRI_ROPE_SCALING_DYNAMIC || sc == TRI_ROPE_SCALING_YARN || sc == TRI_ROPE_SCALING_LLAMA3 ||
         sc == TRI_ROPE_SCALING_LONGROPE) &&
        orig <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: scaling rule %d needs the original context", (int)sc);
    if (sc == TRI_ROPE_SCALING_LLAMA3 && !freq_div &&
        !(cfg->llama3_high_freq_factor > cfg->llama3_low_freq_factor && cfg->llama3_low_freq_factor > 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: llama3 needs 0 < low_freq_factor < high_freq_factor");
    if ((unsigned)sc > TRI_ROPE_SCALING_LONGROPE)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: unknown scaling rule %d", (int)sc);

    rope->layout = cfg->rope_layout;
    rope->head_dim = dim;
    rope->attn_factor = 1.0f;
    rope->scaling = sc;
    rope->theta = cfg->rope_theta;
    rope->factor = (float)factor;
    rope->orig_ctx = cfg->rope_orig_ctx;
    rope->inv_freq = malloc(sizeof(float) * (size_t)(dim / 2));
    if (!rope->inv_freq) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "rope: table of %d floats", dim / 2);
    if (freq_div) {
        rope->freq_div = malloc(sizeof(float) * (size_t)(dim / 2));
        if (!rope->freq_div) {
            tri__rope_free(rope);
            return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "rope: table of %d floats", dim / 2);
        }
        memcpy(rope->freq_div, freq_div, sizeof(float) * (size_t)(dim / 2));
    }

    double theta = (double)cfg->rope_theta;
    switch (sc) {
    case TRI_ROPE_SCALING_NONE:
    case TRI_ROPE_SCALING_DYNAMIC:  // the default table until the sequence passes orig_ctx
        rope_default(rope->inv_freq, dim, theta);
        break;
    case TRI_ROPE_SCALING_LINEAR:
        rope_default(rope->inv_freq, dim, theta);
        for (int32_t i = 0; i < dim / 2; i++) rope->inv_freq[i] = (float)((double)rope->inv_freq[i] / factor);
        break;
    case TRI_ROPE_SCALING_YARN: {
        double bf = cfg->yarn_beta_fast > 0 ? (double)cfg->yarn_beta_fast : 32.0;
        double bs = cfg->yarn_beta_slow > 0 ? (double)cfg->yarn_beta_slow : 1.0;
        rope_yarn(rope, theta, factor, orig, bf, bs);
        rope->attn_factor = cfg->yarn_mscale > 0 ? cfg->yarn_mscale
                            : factor <= 1     ? 1.0f
                                              : (float)(0.1 * log(factor) + 1.0);
        break;
    }
    case TRI_ROPE_SCALING_LLAMA3:
        rope_default(rope->inv_freq, dim, theta);
        if (!freq_div)
            rope_llama3(rope, factor, (double)cfg->llama3_low_freq_factor, (double)cfg->llama3_high_freq_factor, orig);
        break;
    case TRI_ROPE_SCALING_LONGROPE:  // the divisors come with tri__rope_set_longrope
        rope_default(rope->inv_freq, dim, theta);
        rope->attn_factor = cfg->rope_attn_factor > 0 ? cfg->rope_attn_factor : 1.0f;
        break;
    }
    rope_apply_div(rope);
    return TRI_STATUS_OK;
}

void tri__rope_free(tri__rope *rope) {
    if (!rope) return;
    free(rope->inv_freq);
    free(rope->freq_div);
    free(rope->long_div);
    rope->inv_freq = NULL;
    rope->freq_div = NULL;
    rope->long_div = NULL;
}

tri_status tri__rope_set_longrope(tri__rope *rope, const float *short_div, const float *long_div) {
    if (rope->scaling != TRI_ROPE_SCALING_LONGROPE || !short_div || !long_div)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: LongRoPE needs a LongRoPE table and both factor lists");
    size_t bytes = sizeof(float) * (size_t)(rope->head_dim / 2);
    float *s = malloc(bytes), *l = malloc(bytes);
    if (!s || !l) {
        free(s);
        free(l);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "rope: LongRoPE factors of %d floats", rope->head_dim / 2);
    }
    memcpy(s, short_div, bytes);
    memcpy(l, long_div, bytes);
    free(rope->freq_div);
    rope->freq_div = s;
    rope->long_div = l;
    rope->seq_len = 0;  // short factors until a call passes orig_ctx
    rope_default(rope->inv_freq, rope->head_dim, (double)rope->theta);
    rope_apply_div(rope);
    return TRI_STATUS_OK;
}

void tri__rope_update(tri__rope *rope, int64_t seq_len) {
    if (rope->scaling == TRI_ROPE_SCALING_LONGROPE && rope->long_div) {
        int64_t want = seq_len > rope->orig_ctx;  // seq_len: 1 while the long factors are in use
        if (want == rope->seq_len) return;
        float *t = rope->freq_div;  // the table in use is always in freq_div
        rope->freq_div = rope->long_div;
        rope->long_div = t;
        rope_default(rope->inv_freq, rope->head_dim, (double)rope->theta);
        rope_apply_div(rope);
        rope->seq_len = want;
        return;
    }
    if (rope->scaling != TRI_ROPE_SCALING_DYNAMIC) return;
    int64_t cached = rope->seq_len > rope->orig_ctx ? rope->seq_len : rope->orig_ctx;
    if (seq_len > cached) {
        double dim = rope->head_dim;
        double factor = (double)rope->factor;
        double base = (double)rope->theta * pow(factor * (double)seq_len / rope->orig_ctx - (factor - 1.0),
                                        dim / (dim - 2));
        rope_default(rope->inv_freq, rope->head_dim, base);
        rope_apply_div(rope);
        rope->seq_len = seq_len;
    } else if (seq_len < rope->orig_ctx && rope->seq_len > rope->orig_ctx) {
        rope_default(rope->inv_freq, rope->head_dim, (double)rope->theta);
        rope_apply_div(rope);
        rope->seq_len = 0;
    }
}
