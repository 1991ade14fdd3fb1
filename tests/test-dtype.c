// test-dtype.c - type sizes and half-precision conversion against numpy.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "test-util.h"

Test(dtype, sizes) {
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_F32, 7), 28);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_BF16, 3), 6);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q8_0, 64), 68);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q4_0, 96), 54);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q4_1, 32), 20);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q4_1, 33), -1, "not a whole number of blocks");
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q8_0, INT64_MAX - 31), -1, "overflow");
    cr_assert_eq(tri__dtype_row_bytes((tri_dtype)99, 32), -1);
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_Q4_1), "q4_1");
    cr_assert_str_eq(tri_dtype_name((tri_dtype)99), "?");
}

Test(dtype, f16_to_f32_matches_numpy_for_every_half) {
    size_t len;
    uint32_t *want = tt_read_file(tt_fixture("dtype", "f16_to_f32.bin"), &len);
    cr_assert_eq(len, 65536 * 4);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tri__f16_to_f32((uint16_t)h);
        uint32_t got;
        memcpy(&got, &f, 4);
        if (isnan(f)) {
            cr_assert((want[h] & 0x7f800000u) == 0x7f800000u && (want[h] & 0x7fffff), "h=%04x", h);
            continue;
        }
        cr_assert_eq(got, want[h], "half %04x: got %08x, numpy %08x", h, got, want[h]);
    }
    free(want);
}

Test(dtype, f32_to_f16_matches_numpy) {
    size_t len;
    uint32_t *pairs = tt_read_file(tt_fixture("dtype", "f32_to_f16.bin"), &len);
    size_t n = len / 8;
    cr_assert(n > 30000);
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, &pairs[2 * i], 4);
        uint16_t got = tri__f32_to_f16(f);
        cr_assert_eq(got, (uint16_t)pairs[2 * i + 1], "f32 %08x (%g): got %04x, numpy %04x",
                     pairs[2 * i], (double)f, got, pairs[2 * i + 1]);
    }
    free(pairs);
}

Test(dtype, bf16_round_trip_and_rounding) {
    // every bf16 value survives the trip through f32
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tri__bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(tri__f32_to_bf16(f), h);
    }
    // 1 + 2^-8 lies exactly between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0)
    cr_assert_eq(tri__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(tri__f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);
    cr_assert_eq(tri__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-12f), 0x3f81);
    cr_assert(isnan(tri__bf16_to_f32(tri__f32_to_bf16(NAN))));
}

// ---- quantized blocks ----

// Our dequantization of random blocks (every code and scale byte drawn) against the gguf
// package's (tests/fixtures/make-dtype.py). Both compute each value in f32 from the same terms,
// so they agree to the last bit, but for a sum whose terms the package may order differently:
// bound 1 ulp of the block's largest magnitude.
static void check_dequant(tri_dtype t) {
    char blocks_name[32], vals_name[32];
    snprintf(blocks_name, sizeof blocks_name, "%s.blocks", tri_dtype_name(t));
    snprintf(vals_name, sizeof vals_name, "%s.f32", tri_dtype_name(t));
    size_t nb, nv;
    uint8_t *blocks = tt_read_file(tt_fixture("dtype", blocks_name), &nb);
    float *want = tt_read_file(tt_fixture("dtype", vals_name), &nv);
    int64_t be = tri__dtype_block_elems(t), bb = tri__dtype_block_bytes(t);
    cr_assert_eq(nb % (size_t)bb, 0);
    int64_t n = (int64_t)(nb / (size_t)bb) * be;
    cr_assert_eq((int64_t)(nv / 4), n, "%s: %zu values for %lld elements", tri_dtype_name(t), nv / 4, (long long)n);
    cr_assert_eq(tri__dtype_row_bytes(t, n), (int64_t)nb);
    float *got = malloc(sizeof(float) * (size_t)n);
    tri__dequantize_row(got, blocks, t, n);
    int64_t exact = 0;
    for (int64_t b = 0; b < n / be; b++) {
        float amax = 0;
        for (int64_t e = 0; e < be; e++) amax = fmaxf(amax, fabsf(want[b * be + e]));
        float tol = amax * 0x1p-23f;
        for (int64_t e = 0; e < be; e++) {
            int64_t i = b * be + e;
            exact += got[i] == want[i];
            cr_assert(fabsf(got[i] - want[i]) <= tol, "%s: element %lld (block %lld): %.9g, gguf %.9g",
                      tri_dtype_name(t), (long long)i, (long long)b, (double)got[i], (double)want[i]);
        }
    }
    cr_assert_geq(exact, n * 99 / 100, "%s: only %lld of %lld values bit-identical", tri_dtype_name(t),
                  (long long)exact, (long long)n);
    free(got);
    free(blocks);
    free(want);
}

Test(dtype, dequantize_matches_gguf_package) {
    for (tri_dtype t = TRI_DTYPE_Q8_0; t < TRI_DTYPE_COUNT; t++) check_dequant(t);
}

Test(dtype, quantized_sizes) {
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q5_0, 64), 44);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q5_1, 32), 24);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q2_K, 512), 168);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q3_K, 256), 110);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q4_K, 1536), 864);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q5_K, 256), 176);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q6_K, 256), 210);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_Q4_K, 576), -1, "576 is not a whole number of super-blocks");
    cr_assert_eq(tri__dtype_block_elems(TRI_DTYPE_Q6_K), 256);
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_Q4_K), "q4_K");
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_Q5_1), "q5_1");
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_IQ4_NL, 64), 36);
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_IQ4_NL), "iq4_nl");
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_IQ4_XS, 512), 272);
    cr_assert_eq(tri__dtype_row_bytes(TRI_DTYPE_IQ4_XS, 96), -1, "96 is not a whole number of super-blocks");
    cr_assert_eq(tri__dtype_block_elems(TRI_DTYPE_IQ4_XS), 256);
    cr_assert_str_eq(tri_dtype_name(TRI_DTYPE_IQ4_XS), "iq4_xs");
}
