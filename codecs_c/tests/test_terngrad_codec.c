/*
 * C unit test of the TernGrad codec, built and run under ASan/UBSan by tests/test_c_hardening.py.
 * Every buffer handed to the decoder is malloc'd to its exact size, so a read past the stream is
 * caught by ASan rather than landing in slack.
 */
#include "terngrad_codec.h"

#define CHECK_RNG_SEED 0x2545F4914F6CDD1Dull
#include "check.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float scaler_of(const uint8_t *s)
{
    float f;
    memcpy(&f, s + 4, 4);
    return f;
}

static int decode_exact(const uint8_t *s, size_t len, float *out, size_t n, size_t *at)
{
    uint8_t *copy = copy_exact(s, len);
    int r = tg_decode(len ? copy : NULL, len, out, n, at);
    free(copy);
    return r;
}

static void test_random_bits(void)
{
    /* splitmix64's published outputs: seed 0 -> 0xE220A8397B1DCDAF; seed 1234567 -> ... */
    uint64_t r[3];
    tg_random(0, 0, 1, r);
    CHECK(r[0] == 0xE220A8397B1DCDAFull, "splitmix64(0) = %llx", (unsigned long long)r[0]);
    tg_random(1234567, 0, 3, r);
    CHECK(r[0] == 6457827717110365317ull && r[1] == 3203168211198807973ull &&
              r[2] == 9817491932198370423ull,
          "splitmix64(1234567)");
    uint64_t a[5], b[2];
    tg_random(99, 10, 5, a);
    tg_random(99, 13, 2, b);
    CHECK(a[3] == b[0] && a[4] == b[1], "draw counter addresses the stream");
    CHECK(tg_draws(0) == 0 && tg_draws(1) == 1 && tg_draws(2) == 1 && tg_draws(7) == 4, "draws");
}

static void test_known_bytes(void)
{
    /* No clipping, S = 1, every value 0 or +-S: ternarization is deterministic. */
    const float x[5] = {1.0f, -1.0f, 0.0f, 1.0f, -1.0f};
    uint8_t out[32];
    ptrdiff_t r = tg_encode(x, 5, 0.0, -1.0f, TG_PACK_2BIT, 7, 0, out, sizeof out);
    static const uint8_t want2[] = {0x54, 1, 0, 0, 0x00, 0x00, 0x80, 0x3F, 5, 0, 0, 0,
                                    0x4D /* 01 11 00 01 */, 0x03 /* 11, padding 00 */};
    CHECK(r == (ptrdiff_t)sizeof want2 && memcmp(out, want2, sizeof want2) == 0, "2-bit known bytes");
    r = tg_encode(x, 5, 0.0, -1.0f, TG_PACK_BASE3, 7, 0, out, sizeof out);
    static const uint8_t want3[] = {0x54, 1, 1, 0, 0x00, 0x00, 0x80, 0x3F, 5, 0, 0, 0,
                                    0xB1 /* digits 2,0,1,2,0: 162+9+6 */};
    CHECK(r == (ptrdiff_t)sizeof want3 && memcmp(out, want3, sizeof want3) == 0, "base-3 known bytes");
    float y[5];
    CHECK(decode_exact(out, (size_t)r, y, 5, NULL) == TG_OK && y[0] == 1.0f && y[1] == -1.0f &&
              to_bits(y[2]) == 0 && y[3] == 1.0f && y[4] == -1.0f,
          "base-3 known decode");
    /* An agreed scaler of 2: the same values now hit with probability 1/2 (seeded). */
    r = tg_encode(x, 5, 0.0, 2.0f, TG_PACK_2BIT, 7, 0, out, sizeof out);
    CHECK(r == 14 && scaler_of(out) == 2.0f, "agreed scaler in the header");
    CHECK(tg_encode(x, 5, 0.0, 0.5f, TG_PACK_2BIT, 7, 0, out, sizeof out) == 14 &&
              scaler_of(out) == 1.0f && memcmp(out + 12, want2 + 12, 2) == 0,
          "an agreed scaler below the own one is a floor, not a cap");
    CHECK(tg_encode(x, 5, 0.0, -0.0f, TG_PACK_2BIT, 7, 0, out, sizeof out) == 14 &&
              scaler_of(out) == 1.0f,
          "-0.0 means the own scaler");
}

static void test_clipping(void)
{
    /* 99 values +-1 and one outlier 100: sigma ~ 10, bound 2.5 sigma ~ 25, scaler = bound. */
    float x[100];
    for (int i = 0; i < 99; i++)
        x[i] = (i & 1) ? 1.0f : -1.0f;
    x[99] = 100.0f;
    float s, bound;
    CHECK(tg_scaler(x, 100, 2.5, &s, &bound) == TG_OK, "scaler");
    double sum = 0, sq = 0;
    for (int i = 0; i < 100; i++)
        sum += x[i], sq += (double)x[i] * x[i];
    double sigma = sqrt(sq / 100 - (sum / 100) * (sum / 100));
    CHECK(fabs(bound - 2.5 * sigma) < 1e-4 && s == bound, "bound %g vs %g, s %g", bound, 2.5 * sigma, s);
    CHECK(tg_scaler(x, 100, 0.0, &s, &bound) == TG_OK && s == 100.0f && isinf(bound), "no clipping");
    /* Constant tensor: sigma 0, everything clips to 0. */
    float c[10];
    for (int i = 0; i < 10; i++)
        c[i] = 0.5f;
    CHECK(tg_scaler(c, 10, 2.5, &s, &bound) == TG_OK && s == 0.0f && bound == 0.0f, "constant tensor");
    x[5] = NAN;
    CHECK(tg_scaler(x, 100, 2.5, &s, &bound) == TG_E_NONFINITE, "NaN input");
    x[5] = -INFINITY;
    uint8_t out[64];
    CHECK(tg_encode(x, 100, 0.0, -1.0f, TG_PACK_2BIT, 0, 0, out, sizeof out) == TG_E_NONFINITE, "inf");
}

/* Mean of many decodes is close to clip(x); every decode is in {-S, 0, S} with x's sign. */
static void test_unbiased(void)
{
    enum { N = 64, TRIALS = 20000 };
    float x[N], y[N];
    double acc[N] = {0};
    for (int i = 0; i < N; i++)
        x[i] = ((float)(rnd() % 2001) - 1000.0f) / 1000.0f;
    x[7] = 0.0f;
    uint8_t out[64];
    int sign_ok = 1;
    float S = 0;
    for (uint64_t t = 0; t < TRIALS; t++) {
        ptrdiff_t r = tg_encode(x, N, 0.0, -1.0f, (int)(t & 1), 42, t * tg_draws(N), out, sizeof out);
        if (r < 0 || decode_exact(out, (size_t)r, y, N, NULL) != TG_OK) {
            CHECK(0, "trial %llu failed", (unsigned long long)t);
            return;
        }
        S = scaler_of(out);
        for (int i = 0; i < N; i++) {
            acc[i] += y[i];
            sign_ok &= y[i] == 0.0f || (y[i] == S && x[i] > 0) || (y[i] == -S && x[i] < 0);
        }
    }
    CHECK(sign_ok, "values in {-S, 0, S} with the input's sign");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double p = fabs(x[i]) / S, sd = S * sqrt(p * (1 - p) / TRIALS) + 1e-12;
        double z = fabs(acc[i] / TRIALS - x[i]) / sd;
        worst = z > worst ? z : worst;
    }
    CHECK(worst < 5.0, "mean of %d decodes: worst deviation %.2f sigma", TRIALS, worst);
}

static void test_roundtrip_random(void)
{
    for (int trial = 0; trial < 200; trial++) {
        size_t n = rnd() % 1500;
        int packing = trial & 1;
        float *x = malloc((n ? n : 1) * sizeof(float)), *y = malloc((n ? n : 1) * sizeof(float));
        float scale = powf(10.0f, -(float)(rnd() % 8));
        for (size_t i = 0; i < n; i++)
            x[i] = scale * ((float)rnd() / 4294967296.0f * 2.0f - 1.0f);
        size_t cap = tg_encoded_size(n, packing);
        uint8_t *out = malloc(cap);
        CHECK(tg_encode(x, n, 2.5, -1.0f, packing, 1, 0, out, cap - 1) == TG_E_SPACE,
              "one byte short");
        ptrdiff_t r = tg_encode(x, n, (trial % 3) ? 2.5 : 0.0, -1.0f, packing, (uint64_t)trial, 5, out, cap);
        CHECK(r == (ptrdiff_t)cap, "size trial %d", trial);
        if (r < 0)
            continue;
        /* The baseline kernels give the same bytes as the SIMD ones. */
        uint8_t *base = malloc(cap);
        int was = tg_simd(0);
        ptrdiff_t rb = tg_encode(x, n, (trial % 3) ? 2.5 : 0.0, -1.0f, packing, (uint64_t)trial, 5, base, cap);
        tg_simd(was);
        CHECK(rb == r && memcmp(base, out, cap) == 0, "baseline == SIMD, trial %d", trial);
        free(base);
        CHECK(decode_exact(out, (size_t)r, y, n, NULL) == TG_OK, "decode trial %d", trial);
        for (size_t len = 0; len < (size_t)r; len++)
            CHECK(decode_exact(out, len, y, n, NULL) != TG_OK, "truncated to %zu accepted", len);
        uint8_t *longer = malloc((size_t)r + 1);
        memcpy(longer, out, (size_t)r);
        longer[r] = 0;
        CHECK(decode_exact(longer, (size_t)r + 1, y, n, NULL) == TG_E_TRAILING, "trailing byte");
        free(longer);
        free(x);
        free(y);
        free(out);
    }
}

static void test_decode_errors(void)
{
    const float x[6] = {1.0f, -1.0f, 0.0f, 1.0f, -1.0f, 1.0f};
    uint8_t s2[14], s3[14], b[14];
    CHECK(tg_encode(x, 6, 0.0, -1.0f, TG_PACK_2BIT, 0, 0, s2, sizeof s2) == 14, "setup 2-bit");
    CHECK(tg_encode(x, 6, 0.0, -1.0f, TG_PACK_BASE3, 0, 0, s3, sizeof s3) == 14, "setup base-3");
    float y[6];
    size_t at;
    struct {
        const uint8_t *src;
        int byte, value, want;
        const char *what;
    } cases[] = {
        {s2, 0, 0x33, TG_E_HEADER, "magic"},      {s2, 1, 0, TG_E_HEADER, "version"},
        {s2, 2, 2, TG_E_HEADER, "packing"},       {s2, 3, 9, TG_E_HEADER, "reserved"},
        {s2, 7, 0xBF, TG_E_SCALER, "negative S"}, {s2, 7, 0x7F, TG_E_SCALER, "NaN/inf S"},
        {s2, 8, 7, TG_E_COUNT, "count"},          {s2, 12, 0x02, TG_E_CODE, "code 10"},
        {s2, 13, 0x13, TG_E_PADDING, "2-bit padding"},
        {s3, 12, 243, TG_E_CODE, "base-3 byte 243"}, {s3, 13, 81 * 2 + 27 * 2 + 1, TG_E_PADDING, "base-3 padding"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(b, cases[c].src, 14);
        b[cases[c].byte] = (uint8_t)cases[c].value;
        int st = decode_exact(b, 14, y, 6, &at);
        CHECK(st == cases[c].want, "%s: got %s", cases[c].what, tg_strerror(st));
    }
    CHECK(decode_exact(s3, 14, y, 6, NULL) == TG_OK, "base-3 setup decodes");
    /* 9 values: 2-bit takes 12+3 bytes, base-3 12+2; the packing byte decides. */
    float x9[9] = {0}, y9[9];
    uint8_t s9[15];
    CHECK(tg_encode(x9, 9, 0.0, -1.0f, TG_PACK_BASE3, 0, 0, s9, sizeof s9) == 14, "9 in base-3");
    s9[2] = TG_PACK_2BIT;
    CHECK(decode_exact(s9, 14, y9, 9, &at) == TG_E_TRUNCATED && at == 14, "base-3 read as 2-bit");
    CHECK(decode_exact(s2, 11, y, 6, NULL) == TG_E_TRUNCATED, "short header");
    CHECK(tg_encoded_size(1, 7) == SIZE_MAX, "bad packing size");
    uint8_t out[16];
    CHECK(tg_encode(x, 6, 0.0, -1.0f, 3, 0, 0, out, sizeof out) == TG_E_ARG, "bad packing");
    CHECK(tg_encode(x, 6, NAN, -1.0f, 0, 0, 0, out, sizeof out) == TG_E_ARG, "NaN clip");
    CHECK(tg_encode(x, 6, 0.0, INFINITY, 0, 0, 0, out, sizeof out) == TG_E_ARG, "inf shared");
}

static void test_garbage(void)
{
    for (int trial = 0; trial < 3000; trial++) {
        size_t len = rnd() % 40;
        uint8_t *b = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)rnd();
        if (len >= 12 && trial % 2) {
            size_t n = (len - 12) * (4 + (rnd() & 1)) - rnd() % 4;
            b[0] = 0x54, b[1] = 1, b[2] = (uint8_t)(rnd() & 1), b[3] = 0;
            b[7] &= 0x3F;
            b[8] = (uint8_t)n, b[9] = (uint8_t)(n >> 8), b[10] = 0, b[11] = 0;
        }
        size_t n = len >= 12 ? (size_t)b[8] | ((size_t)b[9] << 8) : rnd() % 50;
        float *y = malloc((n ? n : 1) * sizeof(float));
        if (decode_exact(b, len, y, n, NULL) == TG_OK) {
            float S = scaler_of(b);
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= y[i] == 0.0f || y[i] == S || y[i] == -S;
            CHECK(ok, "decoded values outside {-S, 0, S}");
        }
        free(b);
        free(y);
    }
    passed++;
}

int main(void)
{
    test_random_bits();
    test_known_bytes();
    test_clipping();
    test_unbiased();
    test_roundtrip_random();
    test_decode_errors();
    test_garbage();
    return check_report("terngrad codec");
}
