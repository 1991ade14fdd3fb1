// rope.c - rotary frequencies for every scaling rule, after HF transformers' rope init functions.
#include "rope.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
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
    rope->split = INT64_MAX;
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
        rope_default(rope->inv_freq, dim, theta);
        break;
    case TRI_ROPE_SCALING_DYNAMIC:  // the default table below orig_ctx; tri__rope_set_prompt
        rope_default(rope->inv_freq, dim, theta);
        rope->split = rope->orig_ctx;
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
    case TRI_ROPE_SCALING_LONGROPE:  // the divisors (and split) come with tri__rope_set_longrope
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
    free(rope->long_freq);
    rope->inv_freq = NULL;
    rope->freq_div = NULL;
    rope->long_freq = NULL;
}

tri_status tri__rope_set_longrope(tri__rope *rope, const float *short_div, const float *long_div) {
    if (rope->scaling != TRI_ROPE_SCALING_LONGROPE || !short_div || !long_div)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "rope: LongRoPE needs a LongRoPE table and both factor lists");
    int32_t half = rope->head_dim / 2;
    size_t bytes = sizeof(float) * (size_t)half;
    float *s = malloc(bytes), *l = malloc(bytes);
    if (!s || !l) {
        free(s);
        free(l);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "rope: LongRoPE factors of %d floats", half);
    }
    memcpy(s, short_div, bytes);
    free(rope->freq_div);
    free(rope->long_freq);
    rope->freq_div = s;
    rope->long_freq = l;
    // 1 / (long_factor[i] * theta^(2i / dim)), as transformers: the division in float32 of the
    // float32 power (ours rounded once from double)
    rope_default(l, rope->head_dim, (double)rope->theta);
    for (int32_t i = 0; i < half; i++) l[i] /= long_div[i];
    tri__rope_set_prompt(rope, rope->n_prompt);
    return TRI_STATUS_OK;
}

// The dynamic NTK table for a sequence of seq_len tokens, as transformers'
// _compute_dynamic_ntk_parameters: below orig_ctx the configured base, past it
//   theta * (factor * seq_len / orig_ctx - (factor - 1)) ^ (head_dim / (head_dim - 2))
static void rope_dynamic(const tri__rope *rope, int64_t seq_len, float *out) {
    double dim = rope->head_dim, factor = (double)rope->factor, base = (double)rope->theta;
    if (seq_len > rope->orig_ctx)
        base *= pow(factor * (double)seq_len / rope->orig_ctx - (factor - 1.0), dim / (dim - 2));
    rope_default(out, rope->head_dim, base);
    if (rope->freq_div)
        for (int32_t i = 0; i < rope->head_dim / 2; i++) out[i] /= rope->freq_div[i];
}

void tri__rope_table(const tri__rope *rope, int64_t seq_len, float *out) {
    size_t bytes = sizeof(float) * (size_t)(rope->head_dim / 2);
    if (rope->scaling == TRI_ROPE_SCALING_DYNAMIC) {
        rope_dynamic(rope, seq_len, out);
    } else if (rope->scaling == TRI_ROPE_SCALING_LONGROPE && rope->long_freq && seq_len > rope->orig_ctx) {
        memcpy(out, rope->long_freq, bytes);
    } else if (rope->scaling == TRI_ROPE_SCALING_LONGROPE && rope->long_freq) {  // the short factors
        rope_default(out, rope->head_dim, (double)rope->theta);
        rope_apply_div(&(tri__rope){.head_dim = rope->head_dim, .inv_freq = out, .freq_div = rope->freq_div});
    } else {
        memcpy(out, rope->inv_freq, bytes);  // the other rules do not depend on the length
    }
}

void tri__rope_set_prompt(tri__rope *rope, int64_t n_prompt) {
    if (n_prompt < 0) n_prompt = 0;
    if (rope->scaling == TRI_ROPE_SCALING_DYNAMIC) {
        // positions below max(P, orig) share the table of that length; each later one its own
        int64_t len = n_prompt > rope->orig_ctx ? n_prompt : rope->orig_ctx;
        rope_dynamic(rope, len, rope->inv_freq);
        rope->split = len;
    } else if (rope->scaling == TRI_ROPE_SCALING_LONGROPE && rope->long_freq) {
        // a prompt past orig: the long factors everywhere; else the short ones up to orig
        tri__rope_table(rope, n_prompt, rope->inv_freq);
        rope->split = n_prompt > rope->orig_ctx ? INT64_MAX : rope->orig_ctx;
    } else {
        return;
    }
    rope->n_prompt = n_prompt;
}

bool tri__rope_same_prompt(const tri__rope *rope, int64_t a, int64_t b) {
    int64_t o = rope->orig_ctx;
    if (rope->scaling == TRI_ROPE_SCALING_LONGROPE) return (a > o) == (b > o);
    if (rope->scaling == TRI_ROPE_SCALING_DYNAMIC) return (a > o ? a : o) == (b > o ? b : o);
    return true;
}

const float *tri__rope_freqs(const tri__rope *rope, int64_t pos, float *scratch) {
    if (pos < rope->split) return rope->inv_freq;
    if (rope->scaling == TRI_ROPE_SCALING_LONGROPE) return rope->long_freq ? rope->long_freq : rope->inv_freq;
    rope_dynamic(rope, pos + 1, scratch);
    return scratch;
}

tri_status tri__rope_apply(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                           const tri__rope *rope) {
    int64_t i = 0;
    while (i < m && pos[i] < rope->split) i++;
    if (i == m) return be->ops->rope(be, x, m, n_heads, pos, rope);  // one table for every row
    float *scratch = malloc(sizeof(float) * (size_t)(rope->head_dim / 2));
    if (!scratch) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "rope: a table of %d floats", rope->head_dim / 2);
    tri_status st = TRI_STATUS_OK;
    const int64_t row = n_heads * rope->head_dim;
    for (i = 0; !st && i < m;) {
        // a run of rows with one table: below split, or LongRoPE's long rows, or one position
        bool low = pos[i] < rope->split;
        int64_t j = i + 1;
        while (j < m && (pos[j] < rope->split) == low &&
               (low || rope->scaling == TRI_ROPE_SCALING_LONGROPE || pos[j] == pos[i]))
            j++;
        tri__rope run = *rope;
        run.inv_freq = (float *)tri__rope_freqs(rope, pos[i], scratch);
        run.split = INT64_MAX;
        st = be->ops->rope(be, x + i * row, j - i, n_heads, pos + i, &run);
        i = j;
    }
    free(scratch);
    return st;
}
