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
