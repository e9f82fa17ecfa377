/*
 * C unit test of the 3LC codec, built and run under ASan/UBSan by tests/test_c_hardening.py.
 * Every buffer handed to the decoder is malloc'd to its exact size, so a read past the stream is
 * caught by ASan rather than landing in slack.
 */
#include "threelc_codec.h"

#include "check.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Decode from an exactly-sized heap copy of the stream. */
static int decode_exact(const uint8_t *s, size_t len, float *out, size_t n, size_t *at)
{
    uint8_t *copy = copy_exact(s, len);
    int r = tlc_decode(len ? copy : NULL, len, out, n, at);
    free(copy);
    return r;
}

/* 22 values: one full byte of every kind of value, 15 zeros (three 121 bytes), a 2-value tail. */
static const float known_x[22] = {1.0f, -0.25f, 0.6f, 0.0f, -1.0f, 0, 0, 0, 0, 0, 0, 0,
                                  0,    0,      0,    0,    0,     0, 0, 0, 0.5f, -0.7f};

static void test_known_bytes(void)
{
    /* s = 1: M = 1. Q = 1, 0, 1, 0, -1 -> digits 2,1,2,1,0 -> 162+27+18+3+0 = 210 (0xD2).
     * 0.5 is a tie (2|A| = M) and rounds to 0; -0.7 -> -1. Tail digits 1,0 + padding 0,0,0 = 81. */
    static const uint8_t head[12] = {0x33, 0x01, 0x01, 0x00, 0x00, 0x00, 0x80, 0x3F, 22, 0, 0, 0};
    uint8_t out[64];
    float recon[22];
    ptrdiff_t r = tlc_encode(known_x, 22, 1.0f, 1, out, sizeof out, recon);
    static const uint8_t zre_payload[] = {0xD2, 0xF4 /* 243 + (3-2) */, 0x51};
    CHECK(r == 15, "known ZRE stream is %td bytes", r);
    CHECK(r == 15 && memcmp(out, head, 12) == 0 && memcmp(out + 12, zre_payload, 3) == 0,
          "known ZRE bytes");
    float y[22];
    CHECK(decode_exact(out, (size_t)r, y, 22, NULL) == TLC_OK, "known ZRE decode");
    static const float want[22] = {1, 0, 1, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1};
    int same = 1;
    for (int i = 0; i < 22; i++)
        same &= to_bits(y[i]) == to_bits(want[i]) && to_bits(recon[i]) == to_bits(want[i]);
    CHECK(same, "known values decode and recon");

    r = tlc_encode(known_x, 22, 1.0f, 0, out, sizeof out, NULL);
    static const uint8_t raw_payload[] = {0xD2, 121, 121, 121, 0x51};
    CHECK(r == 17 && out[2] == 0 && memcmp(out + 12, raw_payload, 5) == 0, "known no-ZRE bytes");
    CHECK(decode_exact(out, (size_t)r, y, 22, NULL) == TLC_OK, "known no-ZRE decode");

    /* s = 1.5: M = 1.5; 2|A| > 1.5 for 1.0, -1.0, -0.7 (1.4 < 1.5? no: 1.4 -> 0) */
    r = tlc_encode(known_x, 22, 1.5f, 1, out, sizeof out, recon);
    CHECK(r > 12 && to_bits(recon[0]) == to_bits(1.5f) && recon[2] == 0.0f && recon[21] == 0.0f &&
              to_bits(recon[4]) == to_bits(-1.5f),
          "s=1.5 quantization");
}

/* Runs of k zero bytes for every k up to 40: split greedily into 14s and the rest. */
static void test_zero_runs(void)
{
    for (size_t k = 0; k <= 40; k++) {
        size_t n = 5 * k + 5;
        float *x = calloc(n, sizeof(float));
        x[n - 1] = 1.0f; /* a last byte that is not 121: digits 1,1,1,1,2 = 122 */
        uint8_t *out = malloc(tlc_max_encoded_size(n));
        ptrdiff_t r = tlc_encode(x, n, 1.0f, 1, out, tlc_max_encoded_size(n), NULL);
        uint8_t want[8];
        size_t w = 0, left = k;
        while (left >= 14) {
            want[w++] = 255;
            left -= 14;
        }
        if (left == 1)
            want[w++] = 121;
        else if (left >= 2)
            want[w++] = (uint8_t)(243 + left - 2);
        want[w++] = 122;
        CHECK(r == (ptrdiff_t)(12 + w) && memcmp(out + 12, want, w) == 0, "run of %zu zero bytes", k);
        float *y = malloc(n * sizeof(float));
        CHECK(decode_exact(out, (size_t)r, y, n, NULL) == TLC_OK && y[n - 1] == 1.0f && y[0] == 0.0f,
              "run of %zu decodes", k);
        free(x);
        free(out);
        free(y);
    }
    /* All zeros: M = 0, every value 0; 70 values = 14 bytes 121 = one byte 255. */
    float z[70] = {0};
    uint8_t out[64];
    ptrdiff_t r = tlc_encode(z, 70, 1.0f, 1, out, sizeof out, NULL);
    CHECK(r == 13 && out[12] == 255 && to_bits(0.0f) == (uint32_t)(out[4] | out[5] | out[6] | out[7]),
          "all zeros: one byte 255, M = 0");
}

/* Random vectors: decode(encode(x)) equals the recon output bit for bit; |x - y| <= M/2. */
static void test_roundtrip_random(void)
{
    static const float sparsities[] = {1.0f, 1.5f, 1.75f, 1.9f};
    for (int trial = 0; trial < 200; trial++) {
        size_t n = rnd() % 2000;
        float *x = malloc((n ? n : 1) * sizeof(float)), *rec = malloc((n ? n : 1) * sizeof(float));
        float *y = malloc((n ? n : 1) * sizeof(float));
        float scale = powf(10.0f, -(float)(rnd() % 8));
        for (size_t i = 0; i < n; i++)
            x[i] = (rnd() % 3 == 0) ? 0.0f : scale * ((float)rnd() / 4294967296.0f * 2.0f - 1.0f);
        float s = sparsities[trial % 4];
        int zre = trial & 1;
        size_t cap = tlc_max_encoded_size(n);
        uint8_t *out = malloc(cap);
        ptrdiff_t r = tlc_encode(x, n, s, zre, out, cap, rec);
        CHECK(r >= 12 && (size_t)r <= cap, "encode trial %d: %td", trial, r);
        if (r < 12)
            continue;
        /* The baseline kernels give the same bytes and the same recon as the SIMD ones. */
        uint8_t *base = malloc(cap);
        float *rec2 = malloc((n ? n : 1) * sizeof(float));
        int was = tlc_simd(0);
        ptrdiff_t rb = tlc_encode(x, n, s, zre, base, cap, rec2);
        tlc_simd(was);
        CHECK(rb == r && memcmp(base, out, (size_t)r) == 0 && memcmp(rec, rec2, n * sizeof(float)) == 0,
              "baseline == SIMD, trial %d", trial);
        free(base);
        free(rec2);
        size_t at = 0;
        int st = decode_exact(out, (size_t)r, y, n, &at);
        CHECK(st == TLC_OK, "decode trial %d: %s at %zu", trial, tlc_strerror(st), at);
        float m;
        memcpy(&m, out + 4, 4);
        int same = 1, bounded = 1;
        for (size_t i = 0; i < n; i++) {
            same &= to_bits(y[i]) == to_bits(rec[i]);
            bounded &= fabsf(x[i] - y[i]) <= m / 2;
        }
        CHECK(same, "recon == decode, trial %d", trial);
        CHECK(bounded, "error <= M/2, trial %d", trial);
        /* Every truncation fails cleanly, so does one trailing byte. */
        for (size_t len = 0; len < (size_t)r; len++)
            CHECK(decode_exact(out, len, y, n, NULL) != TLC_OK, "truncated to %zu accepted", len);
        uint8_t *longer = malloc((size_t)r + 1);
        memcpy(longer, out, (size_t)r);
        longer[r] = 0;
        CHECK(decode_exact(longer, (size_t)r + 1, y, n, NULL) == TLC_E_TRAILING, "trailing byte");
        free(longer);
        free(x);
        free(rec);
        free(y);
        free(out);
    }
}

static void test_encode_errors(void)
{
    float x[3] = {1.0f, NAN, 0.0f};
    uint8_t out[32];
    CHECK(tlc_encode(x, 3, 1.0f, 1, out, sizeof out, NULL) == TLC_E_NONFINITE, "NaN input");
    x[1] = INFINITY;
    CHECK(tlc_encode(x, 3, 1.0f, 1, out, sizeof out, NULL) == TLC_E_NONFINITE, "inf input");
    x[1] = FLT_MAX;
    CHECK(tlc_encode(x, 3, 1.5f, 1, out, sizeof out, NULL) == TLC_E_RANGE, "M overflows");
    CHECK(tlc_encode(x, 3, 1.0f, 1, out, sizeof out, NULL) == 13, "M = FLT_MAX is fine");
    CHECK(tlc_encode(x, 3, 2.0f, 1, out, sizeof out, NULL) == TLC_E_ARG, "s = 2");
    CHECK(tlc_encode(x, 3, 0.99f, 1, out, sizeof out, NULL) == TLC_E_ARG, "s < 1");
    CHECK(tlc_encode(x, 3, NAN, 1, out, sizeof out, NULL) == TLC_E_ARG, "s NaN");
    CHECK(tlc_encode(x, 3, 1.0f, 1, out, 12, NULL) == TLC_E_SPACE, "small buffer");
    CHECK(tlc_encode(NULL, 0, 1.0f, 1, out, 12, NULL) == 12, "empty vector: header only");
    float y[1];
    CHECK(decode_exact(out, 12, y, 0, NULL) == TLC_OK, "empty decodes");
    CHECK(tlc_max_encoded_size((size_t)TLC_MAX_COUNT + 1) == SIZE_MAX, "count limit");
}

static void test_decode_errors(void)
{
    uint8_t s[17];
    ptrdiff_t r = tlc_encode(known_x, 22, 1.0f, 1, s, sizeof s, NULL);
    CHECK(r == 15, "setup");
    float y[22];
    size_t at = 0;
    uint8_t b[16];
    struct {
        int byte, value, want;
        const char *what;
    } cases[] = {
        {0, 0x54, TLC_E_HEADER, "magic"},        {1, 2, TLC_E_HEADER, "version"},
        {2, 3, TLC_E_HEADER, "flag bits"},        {3, 1, TLC_E_HEADER, "reserved"},
        {7, 0xBF, TLC_E_SCALER, "negative M"},    {7, 0x7F, TLC_E_SCALER, "NaN M"},
        {8, 21, TLC_E_COUNT, "count"},            {11, 1, TLC_E_COUNT, "count high byte"},
        {14, 0x52, TLC_E_PADDING, "padding digit"},
        {13, 255, TLC_E_OVERFLOW, "run past the end"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(b, s, 15);
        b[cases[c].byte] = (uint8_t)cases[c].value;
        if (cases[c].byte == 7 && cases[c].value == 0x7F)
            b[6] = 0xC0; /* 0x7FC00000: a NaN */
        int st = decode_exact(b, 15, y, 22, &at);
        CHECK(st == cases[c].want, "%s: got %s", cases[c].what, tlc_strerror(st));
    }
    /* A zero run covering the partial last byte: its padding digits would be 1. */
    uint8_t run[13] = {0x33, 1, 1, 0, 0, 0, 0x80, 0x3F, 7, 0, 0, 0, 243};
    CHECK(decode_exact(run, 13, y, 7, NULL) == TLC_E_PADDING, "run over the partial byte");
    run[8] = 10; /* 10 values = two 121 bytes: fine */
    float y10[10];
    CHECK(decode_exact(run, 13, y10, 10, NULL) == TLC_OK, "run of two for 10 values");
    CHECK(decode_exact(run, 13, y10, 9, NULL) == TLC_E_COUNT, "count 10 vs 9");
    /* ZRE byte in a raw stream; a byte above 242 is a code only with ZRE. */
    uint8_t raw[14] = {0x33, 1, 0, 0, 0, 0, 0x80, 0x3F, 10, 0, 0, 0, 121, 243};
    CHECK(decode_exact(raw, 14, y10, 10, &at) == TLC_E_CODE && at == 13, "243 without ZRE");
    raw[2] = 1;
    CHECK(decode_exact(raw, 14, y10, 10, &at) == TLC_E_OVERFLOW && at == 13, "run of 2 from byte 2 of 2");
    raw[12] = 243;
    CHECK(decode_exact(raw, 14, y10, 10, &at) == TLC_E_TRAILING && at == 13, "run after the last value");
    CHECK(decode_exact(raw, 11, y10, 10, NULL) == TLC_E_TRUNCATED, "short header");
    /* n far beyond what the stream holds: refused from the header, nothing written. */
    CHECK(decode_exact(raw, 14, NULL, 0, NULL) == TLC_E_COUNT, "n = 0 vs 10");
}

/* Garbage never crashes the decoder and never passes with values outside {-M, 0, M}. */
static void test_garbage(void)
{
    for (int trial = 0; trial < 3000; trial++) {
        size_t len = rnd() % 40;
        uint8_t *b = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)rnd();
        if (len >= 12 && trial % 2) { /* a valid header to get past the first checks */
            size_t n = rnd() % 200;
            b[0] = 0x33, b[1] = 1, b[2] = (uint8_t)(rnd() & 1), b[3] = 0;
            b[7] &= 0x3F;
            b[8] = (uint8_t)n, b[9] = (uint8_t)(n >> 8), b[10] = 0, b[11] = 0;
        }
        size_t n = len >= 12 ? (size_t)b[8] | ((size_t)b[9] << 8) : rnd() % 50;
        float *y = malloc((n ? n : 1) * sizeof(float));
        if (decode_exact(b, len, y, n, NULL) == TLC_OK) {
            float m;
            memcpy(&m, b + 4, 4);
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= y[i] == 0.0f || y[i] == m || y[i] == -m;
            CHECK(ok, "decoded values outside {-M, 0, M}");
        }
        free(b);
        free(y);
    }
    passed++;
}

int main(void)
{
    test_known_bytes();
    test_zero_runs();
    test_roundtrip_random();
    test_encode_errors();
    test_decode_errors();
    test_garbage();
    return check_report("threelc codec");
}
