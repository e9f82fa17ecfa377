/* Unit tests of the ring's per-block scaling (blockscale_codec.h), under ASan/UBSan. */
#include "blockscale_codec.h"
#include "check.h"
#include "inceptionn_codec.h"

#include <math.h>

/* Random float32 with exponents spread over the range; some specials. */
static float spread(void)
{
    uint32_t r = rnd();
    if ((r & 255) == 0)
        return 0.0f;
    float m = (float)uniform() + 0.5f;
    return ((r >> 8) & 1 ? -m : m) * ldexpf(1.0f, (int)((r >> 9) % 120) - 100);
}

static void roundtrip_case(size_t n, size_t block, int k, int h)
{
    float *x = malloc((n ? n : 1) * sizeof *x), *dec = malloc((n ? n : 1) * sizeof *dec);
    float *out = malloc((n ? n : 1) * sizeof *out);
    size_t wn = bs_wire_values(n, block);
    float *w = malloc((wn ? wn : 1) * sizeof *w), *rc = malloc((wn ? wn : 1) * sizeof *rc);
    for (size_t i = 0; i < n; i++)
        x[i] = spread();
    if (n > 10 && (rnd() & 1))
        x[rnd() % n] = (rnd() & 1) ? INFINITY : NAN;
    CHECK(bs_encode_h(x, n, block, k, h, w, wn - (wn > 0), dec) == (wn ? BS_E_ARG : 0),
          "a short wire buffer is refused");
    ptrdiff_t got = bs_encode_h(x, n, block, k, h, w, wn, dec);
    CHECK(got == (ptrdiff_t)wn, "encode wrote %td floats, want %zu", got, wn);
    /* every wire float is a fixed point of the codec: a soft NIC delivers it unchanged */
    inc_reconstruct(w, wn, k, rc);
    size_t moved = 0;
    for (size_t i = 0; i < wn; i++)
        moved += to_bits(w[i]) != to_bits(rc[i]) && !(isnan(w[i]) && isnan(rc[i]));
    CHECK(moved == 0, "%zu wire floats are not fixed points (n %zu, block %zu, k %d)", moved, n, block, k);
    CHECK(bs_decode(w, wn, out, n, block, NULL) == BS_OK, "decode of an encoded wire");
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += to_bits(out[i]) != to_bits(dec[i]) && !(isnan(out[i]) && isnan(dec[i]));
    CHECK(differ == 0, "%zu decoded values differ from what the encoder predicted", differ);
    /* the error per value: half a step of the codec at the block's scale (rounded to the nearest),
     * or half the smallest magnitude it represents, 2^max(k, -7), for values nearer zero */
    float half = ldexpf(1.0f, (k > -7 ? k : -7) - 1);
    for (size_t a = 0; a < n; a += block) {
        size_t m = n - a < block ? n - a : block;
        int s = (int)w[a / block * (block + 1)] - BS_MARK_BASE;
        CHECK(s == bs_shift_h(x + a, m, h), "block exponent");
        /* headroom h: the scaled block's max lies in [2^(-1-h), 2^-h) unless the shift is clamped */
        float top = 0;
        int finite_block = 1;
        for (size_t i = a; i < a + m; i++) {
            finite_block &= isfinite(x[i]) != 0;
            top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
        }
        if (finite_block && top > 0 && s != BS_MIN_SHIFT && s != BS_MAX_SHIFT) {
            float t = ldexpf(top, s);
            CHECK(t >= ldexpf(1.0f, -1 - h) && t < ldexpf(1.0f, -h), "block max %g scaled to %g (h %d)", top, t, h);
        }
        for (size_t i = a; i < a + m; i++)
            if (isfinite(x[i]) && s != 0 && s != BS_MIN_SHIFT && s != BS_MAX_SHIFT)
                CHECK(fabsf(out[i] - x[i]) <= ldexpf(half, -s),
                      "value %zu: %g for %g (s %d)", i, out[i], x[i], s);
    }
    free(x), free(dec), free(out), free(w), free(rc);
}

int main(void)
{
    const size_t sizes[] = {0, 1, 7, 255, 256, 257, 1000, 65536 + 3};
    const size_t blocks[] = {1, 32, 256, 4096};
    const int ks[] = {-30, -12, -10, -8, -7, -6, -1};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t j = 0; j < sizeof blocks / sizeof *blocks; j++)
            for (size_t l = 0; l < sizeof ks / sizeof *ks; l++)
                for (int h = 0; h <= BS_MAX_HEADROOM; h += (h < 3 ? 1 : 7))
                    roundtrip_case(sizes[i], blocks[j], ks[l], h);

    /* exponents: frexp of the block max, zero/inf/NaN unscaled, clamped */
    float b[4] = {0.3f, -0.2f, 0, 0};
    CHECK(bs_shift(b, 4) == 1, "0.3 = 0.6 * 2^-1");
    b[0] = 0.5f;
    CHECK(bs_shift(b, 4) == 0, "0.5 = 0.5 * 2^0");
    b[0] = 1e-45f, b[1] = 0;
    CHECK(bs_shift(b, 4) == BS_MAX_SHIFT, "clamped at the top");
    b[0] = 3e38f;
    CHECK(bs_shift(b, 4) == BS_MIN_SHIFT, "clamped at the bottom");
    b[0] = NAN;
    CHECK(bs_shift(b, 4) == 0, "NaN: unscaled");
    b[0] = 0;
    CHECK(bs_shift(b, 4) == 0, "zero: unscaled");
    b[0] = 0.3f;
    CHECK(bs_shift_h(b, 4, 0) == bs_shift(b, 4) - BS_HEADROOM, "bs_shift is bs_shift_h at BS_HEADROOM");
    CHECK(bs_shift_h(b, 4, 2) == -1, "h 2: 0.3 * 2^-1 = 0.15 in [1/8, 1/4)");

    /* the decoder refuses what the encoder cannot produce */
    float x[300], w[302], out[300];
    for (int i = 0; i < 300; i++)
        x[i] = 0.001f * (float)(i - 150);
    CHECK(bs_encode(x, 300, 256, -10, w, 302, NULL) == 302, "encode");
    CHECK(bs_decode(w, 301, out, 300, 256, NULL) == BS_E_LENGTH, "short");
    CHECK(bs_decode(w, 302, out, 301, 256, NULL) == BS_E_LENGTH, "count");
    size_t at = 0;
    float keep = w[0];
    const float bad_marks[] = {1024.5f, 1024 + 127, 1024 - 127, NAN, INFINITY, -1024, 0};
    for (size_t i = 0; i < sizeof bad_marks / sizeof *bad_marks; i++) {
        w[0] = bad_marks[i];
        CHECK(bs_decode(w, 302, out, 300, 256, &at) == BS_E_EXPONENT && at == 0, "exponent %g", bad_marks[i]);
    }
    w[0] = keep;
    keep = w[100];
    const float bad_values[] = {1.0f, -1.5f, INFINITY, NAN};
    for (size_t i = 0; i < sizeof bad_values / sizeof *bad_values; i++) {
        w[100] = bad_values[i];
        CHECK(bs_decode(w, 302, out, 300, 256, &at) == BS_E_VALUE && at == 100, "value %g", bad_values[i]);
    }
    w[100] = keep;
    CHECK(bs_decode(w, 302, out, 300, 256, NULL) == BS_OK, "restored");
    CHECK(bs_decode(w, 302, out, 300, 0, NULL) == BS_E_ARG, "block 0");
    CHECK(bs_encode(x, 300, 256, 0, w, 302, NULL) == BS_E_ARG, "k out of range");
    CHECK(bs_encode_h(x, 300, 256, -10, -1, w, 302, NULL) == BS_E_ARG, "negative headroom");
    CHECK(bs_encode_h(x, 300, 256, -10, BS_MAX_HEADROOM + 1, w, 302, NULL) == BS_E_ARG, "headroom too big");
    CHECK(bs_wire_values(300, 0) == 0 && bs_wire_values(512, 256) == 514, "wire sizes");
    return check_report("blockscale");
}
