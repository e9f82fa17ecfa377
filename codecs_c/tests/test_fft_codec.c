/*
 * C unit test of the FFT sparsification + range-based float codec, built and run under
 * ASan/UBSan by tests/test_c_hardening.py. Blobs handed to the decoder are malloc'd to their
 * exact size, so a read past the end is caught by ASan.
 */
#include "fft_codec.h"

#define CHECK_RNG_SEED 0x2545F4914F6CDD1Dull
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The paper's Figure 8: m = 3, eps = 0.125, 8-bit codes: 0.256 -> pattern 0x3E8, pbase 0x3E0,
 * offset 8 + 1 = 9, decodes to 0.25. Our sign-magnitude code keeps q = 9 in the low 7 bits. */
static void test_paper_example(void)
{
    uint32_t pbase = to_bits(0.125f) >> 20;
    CHECK(pbase == 0x3E0, "pbase %x", pbase);
    float v[3] = {0.256f, -0.256f, 0.1f};
    uint16_t c[3];
    float back[3];
    CHECK(fft_rf_quantize(v, 3, 8, 3, pbase, c) == FFT_OK, "quantize");
    CHECK(c[0] == 9 && c[1] == (0x80 | 9) && c[2] == 0, "codes %u %u %u", c[0], c[1], c[2]);
    CHECK(fft_rf_dequantize(c, 3, 8, 3, pbase, back) == FFT_OK, "dequantize");
    CHECK(back[0] == 0.25f && back[1] == -0.25f && back[2] == 0.0f, "values %g %g %g", back[0], back[1], back[2]);
}

/* |v - Q(v)| < 2^-m |v| on [eps, max], < eps below eps; the top code is max truncated. */
static void test_range_float_bound(void)
{
    int bad = 0, checked = 0;
    for (int bits = 4; bits <= 16; bits += 3) {
        for (int m = 0; m <= bits - 1 && m <= 12; m++) {
            float max_abs = (float)(0.5 + uniform() * 100.0);
            uint32_t pbase = fft_rf_pbase(max_abs, bits, m);
            /* No valid range when the magnitude codes outnumber float's patterns above 0. */
            int possible = ((1u << (bits - 1)) - 1) < (255u << m);
            if (pbase == 0) {
                bad += possible;
                continue;
            }
            float eps;
            uint32_t e = pbase << (23 - m);
            memcpy(&eps, &e, 4);
            for (int i = 0; i < 2000; i++) {
                /* log-uniform magnitudes from far below eps up to max_abs, both signs */
                float v = (float)(max_abs * pow(2.0, -40.0 * uniform()) * (uniform() < 0.5 ? -1 : 1));
                uint16_t c;
                float q;
                fft_rf_quantize(&v, 1, bits, m, pbase, &c);
                fft_rf_dequantize(&c, 1, bits, m, pbase, &q);
                double err = fabs((double)v - (double)q);
                double bound = fabs(v) < eps ? eps : ldexp(fabs(v), -m);
                bad += !(err < bound) || fabs(q) > fabs(v) || (q != 0 && signbit(q) != signbit(v));
                checked++;
            }
            uint16_t top;
            fft_rf_quantize(&max_abs, 1, bits, m, pbase, &top);
            bad += top != (1u << (bits - 1)) - 1 && pbase != 1; /* max uses the top code */
        }
    }
    CHECK(bad == 0 && checked > 10000, "range float bound: %d of %d violate it", bad, checked);
    CHECK(fft_rf_pbase(INFINITY, 10, 6) == 0, "no range for inf");
    CHECK(fft_rf_pbase(1.0f, 1, 0) == 0 && fft_rf_pbase(1.0f, 10, 24) == 0, "bad parameters");
    CHECK(fft_rf_pbase(0.0f, 10, 6) == 1, "all-zero data: pbase 1");
    uint16_t c = 0xFFFF;
    float q;
    CHECK(fft_rf_dequantize(&c, 1, 10, 6, 5, &q) == FFT_E_ARG, "code wider than N bits");
}

static void test_sizes(void)
{
    CHECK(fft_length(0) == 0 && fft_length(1) == 1 && fft_length(7) == 8 && fft_length(77) == 80, "length");
    CHECK(fft_length(789010) == 800000 && fft_length(2147483648u) == 2147483648u && fft_length(2147483649u) == 0,
          "length %zu", fft_length(789010));
    CHECK(fft_bins(0) == 0 && fft_bins(1) == 1 && fft_bins(2) == 2 && fft_bins(7) == 5, "bins");
    CHECK(fft_encoded_size(100, 8, 10) == 16 + 7 + 20, "size %zu", fft_encoded_size(100, 8, 10));
    CHECK(fft_encoded_size(100, 52, 10) == 0, "k > K");
    CHECK(fft_encoded_size(0, 0, 10) == 16, "empty");
}

static void test_known_blob(void)
{
    /* n = 6: K = 4 bins. Keep the 2 largest: bins 1 and 3 (bin 2 ties bin 3 in magnitude but
     * bin 3 is larger). N = 8, m = 2 fixed. max |part| = 4.0 -> pattern (0x40800000 >> 21) =
     * 0x204, qmax = 127: pbase = 0x204 - 126 = 0x186. */
    float spec[8] = {0.5f, 0, 4.0f, -1.0f, 1.0f, 1.0f, -1.5f, 0};
    uint8_t out[64];
    ptrdiff_t r = fft_encode(spec, 6, 2, 8, 2, out, sizeof out);
    CHECK(r == 16 + 1 + 4, "known blob size %td", r);
    uint32_t eps = 0x186u << 21;
    uint8_t head[16] = {0x46, 1, 8, 2, (uint8_t)eps, (uint8_t)(eps >> 8), (uint8_t)(eps >> 16), (uint8_t)(eps >> 24),
                        6, 0, 0, 0, 2, 0, 0, 0};
    CHECK(memcmp(out, head, 16) == 0, "known header");
    CHECK(out[16] == 0x0A, "bitmap %02x", out[16]);
    /* codes: 4.0 -> 127; -1.0 -> pattern 0x1FC -> q = 0x1FC - 0x186 + 1 = 119, sign; -1.5 ->
     * pattern 0x1FE -> 121, sign; 0 -> 0 */
    CHECK(out[17] == 127 && out[18] == (0x80 | 119) && out[19] == (0x80 | 121) && out[20] == 0,
          "codes %u %u %u %u", out[17], out[18], out[19], out[20]);
    float back[8];
    uint8_t *b = copy_exact(out, (size_t)r);
    CHECK(fft_decode(b, (size_t)r, 6, back, NULL) == FFT_OK, "decode");
    CHECK(back[0] == 0 && back[1] == 0 && back[2] == 4.0f && back[3] == -1.0f && back[4] == 0 && back[5] == 0 &&
              back[6] == -1.5f && back[7] == 0,
          "decoded spectrum");
    free(b);
    CHECK(fft_encode(spec, 6, 2, 8, 2, out, 20) == FFT_E_SPACE, "tight capacity");
    CHECK(fft_encode(spec, 6, 5, 8, 2, out, sizeof out) == FFT_E_ARG, "k > K");
    CHECK(fft_encode(spec, 6, 2, 17, 2, out, sizeof out) == FFT_E_ARG, "17 bits");
    spec[3] = NAN;
    CHECK(fft_encode(spec, 6, 2, 8, 2, out, sizeof out) == FFT_E_NONFINITE, "NaN");
}

static void test_selection_and_roundtrip(void)
{
    size_t n = 5000, K = fft_bins(n);
    float *spec = malloc(2 * K * sizeof(float));
    for (size_t i = 0; i < 2 * K; i++)
        spec[i] = (float)((uniform() - 0.5) * pow(10.0, 3.0 * uniform()));
    for (size_t i = 100; i < 140; i++) { /* a run of equal magnitudes */
        spec[2 * i] = 3.0f;
        spec[2 * i + 1] = -4.0f;
    }
    float *back = malloc(2 * K * sizeof(float));
    for (size_t k = 0; k <= K; k += K / 7 + 1) {
        size_t cap = fft_encoded_size(n, k, 10);
        uint8_t *out = malloc(cap);
        ptrdiff_t r = fft_encode(spec, n, k, 10, FFT_AUTO_MANTISSA, out, cap);
        CHECK(r == (ptrdiff_t)cap, "encode k=%zu: %td", k, r);
        CHECK(fft_decode(out, cap, n, back, NULL) == FFT_OK, "decode k=%zu", k);
        /* Kept = the k largest magnitudes: every kept one >= every dropped one. */
        double min_kept = INFINITY, max_dropped = 0;
        size_t kept = 0;
        for (size_t i = 0; i < K; i++) {
            double mag = (double)spec[2 * i] * spec[2 * i] + (double)spec[2 * i + 1] * spec[2 * i + 1];
            int on = (out[16 + i / 8] >> (i % 8)) & 1;
            kept += (size_t)on;
            if (on)
                min_kept = fmin(min_kept, mag);
            else
                max_dropped = fmax(max_dropped, mag);
            if (!on && (back[2 * i] != 0 || back[2 * i + 1] != 0))
                kept = (size_t)-1;
        }
        CHECK(kept == k && (k == 0 || k == K || min_kept >= max_dropped), "top-k k=%zu kept %zu", k, kept);
        free(out);
    }
    free(spec);
    free(back);
}

static void test_malformed(void)
{
    size_t n = 77, K = fft_bins(n); /* L = 80: K = 41 */
    float spec[2 * 41];
    for (size_t i = 0; i < 2 * K; i++)
        spec[i] = (float)(uniform() - 0.5);
    size_t k = 9, len = fft_encoded_size(n, k, 10);
    uint8_t *blob = malloc(len);
    CHECK(fft_encode(spec, n, k, 10, FFT_AUTO_MANTISSA, blob, len) == (ptrdiff_t)len, "encode");
    float back[2 * 41];
    size_t at;
    int bad = 0;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *t = copy_exact(blob, cut);
        bad += fft_decode(t, cut, n, back, &at) != FFT_E_TRUNCATED;
        free(t);
    }
    CHECK(bad == 0, "every truncation is FFT_E_TRUNCATED (%d not)", bad);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, blob, len);
    longer[len] = 0;
    CHECK(fft_decode(longer, len + 1, n, back, &at) == FFT_E_TRAILING && at == len + 1, "trailing");
    free(longer);
    CHECK(fft_decode(blob, len, n, back, &at) == FFT_OK, "valid");
    CHECK(fft_decode(blob, len, n + 1, back, &at) == FFT_E_COUNT, "other n");

    struct {
        size_t off;
        uint8_t val;
        int want;
    } cases[] = {
        {0, 0x47, FFT_E_HEADER}, {1, 0, FFT_E_HEADER},  {2, 1, FFT_E_HEADER},   {2, 17, FFT_E_HEADER},
        {3, 24, FFT_E_HEADER},   {4, 1, FFT_E_RANGE},   {7, 0x80, FFT_E_RANGE}, {7, 0x7F, FFT_E_RANGE},
        {12, 42, FFT_E_COUNT},   {12, 10, FFT_E_TRUNCATED}, {12, 8, FFT_E_TRAILING},
        {8, 78, FFT_E_COUNT},    {11, 0x80, FFT_E_COUNT},  {16 + 5, 0xFF, FFT_E_BITMAP},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t *t = copy_exact(blob, len);
        t[cases[c].off] = cases[c].val;
        int r = fft_decode(t, len, n, back, &at);
        CHECK(r == cases[c].want, "byte %zu = %u: got %d (%s), want %d", cases[c].off, cases[c].val, r,
              fft_strerror(r), cases[c].want);
        free(t);
    }
    /* K = 41: the last bitmap byte holds bin 40; bit 7 is past K. */
    uint8_t *t = copy_exact(blob, len);
    t[16 + 5] |= 0x80;
    CHECK(fft_decode(t, len, n, back, &at) == FFT_E_BITMAP && at == 21, "bit past K at %zu", at);
    free(t);
    /* 2 * 9 * 10 = 180 bits: the last byte uses 4 bits. */
    t = copy_exact(blob, len);
    t[len - 1] |= 0x80;
    CHECK(fft_decode(t, len, n, back, &at) == FFT_E_VALUE && at == len - 1, "padding bits");
    free(t);
    CHECK(fft_decode(NULL, 0, 0, NULL, &at) == FFT_E_TRUNCATED, "empty blob");
    uint8_t empty[16];
    float none[1];
    CHECK(fft_encode(none, 0, 0, 10, FFT_AUTO_MANTISSA, empty, 16) == 16, "n = 0 encodes");
    uint8_t *e = copy_exact(empty, 16);
    CHECK(fft_decode(e, 16, 0, NULL, &at) == FFT_OK, "n = 0 decodes");
    free(e);
    free(blob);
}

int main(void)
{
    test_paper_example();
    test_range_float_bound();
    test_sizes();
    test_known_blob();
    test_selection_and_roundtrip();
    test_malformed();
    return check_report("test_fft_codec");
}
