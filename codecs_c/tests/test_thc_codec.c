/*
 * C unit test of the THC codec, built and run under ASan/UBSan by tests/test_c_hardening.py.
 * Every buffer handed to the decoder is malloc'd to its exact size, so a read past the blob is
 * caught by ASan rather than landing in slack.
 */
#include "thc_codec.h"

#include "check.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The shipped optimal table for b = 4, g = 30, p = 1/32. */
static const uint8_t T4[16] = {0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 21, 23, 25, 27, 30};

static double gauss(void)
{
    /* Sum of 12 uniforms minus 6: good enough for test vectors, no libm needed. */
    double s = 0;
    for (int i = 0; i < 12; i++)
        s += uniform();
    return s - 6.0;
}

/* Encode x[0..n) with M = t_p * ||x|| / sqrt(d); returns a malloc'd blob of exactly *len bytes. */
static uint8_t *encode(const float *x, size_t n, uint64_t rot, uint64_t noise, float *range_out, size_t *len)
{
    size_t d = thc_padded_dim(n);
    float range = (float)(2.1538746940614555 * sqrt(thc_sum_squares(x, n)) / sqrt((double)d));
    size_t cap = thc_blob_size(n, 4, 4);
    uint8_t *out = malloc(cap);
    float *work = malloc(d * sizeof(float));
    ptrdiff_t r = thc_encode(x, n, range, rot, noise, 4, 30, T4, work, out, cap);
    CHECK(r == (ptrdiff_t)cap, "encode returned %td, want %zu", r, cap);
    free(work);
    if (range_out)
        *range_out = range;
    *len = cap;
    return out;
}

static void test_sizes(void)
{
    CHECK(thc_padded_dim(0) == 1 && thc_padded_dim(1) == 1 && thc_padded_dim(2) == 2, "pad small");
    CHECK(thc_padded_dim(3) == 4 && thc_padded_dim(1025) == 2048, "pad");
    CHECK(thc_padded_dim(((size_t)1 << 31) + 1) == 0, "pad limit");
    CHECK(thc_blob_size(3, 4, 4) == 24 + 16 + 2, "blob size b=4: %zu", thc_blob_size(3, 4, 4));
    CHECK(thc_blob_size(5, 3, 3) == 24 + 8 + 3, "blob size b=3 d=8: %zu", thc_blob_size(5, 3, 3));
    CHECK(thc_blob_size(100, 4, 16) == 24 + 16 + 256, "sum size");
}

static void test_fwht(void)
{
    float x[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    thc_fwht(x, 8);
    int ok = 1;
    for (int i = 0; i < 8; i++)
        ok &= x[i] == 1.0f;
    CHECK(ok, "H e0 = ones");
    float y[4] = {1, 2, 3, 4};
    thc_fwht(y, 4);
    CHECK(y[0] == 10 && y[1] == -2 && y[2] == -4 && y[3] == 0, "H [1 2 3 4] = %g %g %g %g", y[0], y[1], y[2], y[3]);
    CHECK(thc_fwht(y, 3) == THC_E_ARG, "d not a power of two");

    /* Blocked FWHT on a large vector against the definition H[i][j] = (-1)^popcount(i & j). */
    size_t d = 8192;
    float *v = malloc(d * sizeof(float));
    for (size_t i = 0; i < d; i++)
        v[i] = (i % 7 == 3) ? 1.0f : 0.0f;
    float *w = malloc(d * sizeof(float));
    memcpy(w, v, d * sizeof(float));
    thc_fwht(w, d);
    int bad = 0;
    for (size_t i = 0; i < d; i += 97) {
        double s = 0;
        for (size_t j = 0; j < d; j++)
            if (v[j] != 0.0f)
                s += (__builtin_popcountll(i & j) & 1) ? -1.0 : 1.0;
        bad += w[i] != (float)s;
    }
    CHECK(bad == 0, "blocked FWHT matches the Hadamard matrix (%d bad)", bad);

    /* RHT then inverse RHT is the identity up to rounding, and keeps the norm. */
    for (size_t i = 0; i < d; i++)
        v[i] = (float)gauss();
    memcpy(w, v, d * sizeof(float));
    thc_rht(w, d, 99);
    double n0 = thc_sum_squares(v, d), n1 = thc_sum_squares(w, d);
    CHECK(fabs(n0 - n1) < 1e-4 * n0, "RHT keeps the norm: %g vs %g", n0, n1);
    thc_irht(w, d, 99);
    double err = 0;
    for (size_t i = 0; i < d; i++)
        err = fmax(err, fabs(w[i] - v[i]));
    CHECK(err < 1e-5, "inverse RHT: max error %g", err);
    free(v);
    free(w);
}

static void test_known_blob(void)
{
    /* A zero vector with M = 1: every rotated value is 0, y = g/2 = 15 = T[7], so every index is
     * 7 whatever the noise, and decodes to exactly 0. */
    float x[3] = {0, 0, 0};
    uint8_t out[42];
    float work[4];
    ptrdiff_t r = thc_encode(x, 3, 1.0f, 0x0102030405060708ull, 5, 4, 30, T4, work, out, sizeof out);
    static const uint8_t head[24] = {0x54, 1, 0, 4, 30, 4, 2, 0, 1, 0, 0, 0, 0x00, 0x00, 0x80, 0x3F,
                                     8, 7, 6, 5, 4, 3, 2, 1};
    CHECK(r == 42, "known blob: %td bytes", r);
    CHECK(memcmp(out, head, 24) == 0, "known header bytes");
    CHECK(memcmp(out + 24, T4, 16) == 0, "table in the header");
    CHECK(out[40] == 0x77 && out[41] == 0x77, "indices 7: %02x %02x", out[40], out[41]);
    float y[3] = {9, 9, 9};
    CHECK(thc_decode(out, 42, 3, work, y, NULL) == THC_OK && y[0] == 0 && y[1] == 0 && y[2] == 0, "decodes to 0");
    CHECK(thc_encode(x, 3, 1.0f, 1, 1, 4, 30, T4, work, out, 41) == THC_E_SPACE, "tight capacity");
    /* M = 0: every index is 0 and the blob decodes to 0. */
    CHECK(thc_encode(x, 3, 0.0f, 1, 1, 4, 30, T4, work, out, 42) == 42 && out[40] == 0 && out[41] == 0, "M = 0");
}

static void test_encode_args(void)
{
    float x[5] = {1, 2, 3, 4, 5};
    float work[8];
    uint8_t out[64];
    uint8_t bad[16];
    memcpy(bad, T4, 16);
    bad[5] = bad[4];
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 4, 30, bad, work, out, sizeof out) == THC_E_TABLE, "flat table");
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 4, 29, T4, work, out, sizeof out) == THC_E_TABLE, "table end != g");
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 4, 14, T4, work, out, sizeof out) == THC_E_ARG, "g < 2^b - 1");
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 9, 300, T4, work, out, sizeof out) == THC_E_ARG, "b > 8");
    CHECK(thc_encode(x, 5, -1.0f, 1, 1, 4, 30, T4, work, out, sizeof out) == THC_E_NONFINITE, "negative M");
    CHECK(thc_encode(x, 5, NAN, 1, 1, 4, 30, T4, work, out, sizeof out) == THC_E_NONFINITE, "NaN M");
    x[2] = INFINITY;
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 4, 30, T4, work, out, sizeof out) == THC_E_NONFINITE, "inf input");
    x[2] = 3e38f;
    x[3] = 3e38f;
    CHECK(thc_encode(x, 5, 1.0f, 1, 1, 4, 30, T4, work, out, sizeof out) == THC_E_NONFINITE, "overflow in the RHT");
}

/* Mean over trials of the rotated-domain decode equals the clamped rotated vector. */
static void test_unbiased(void)
{
    size_t n = 200, d = 256, trials = 3000;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)gauss();
    float range;
    size_t len;
    double *acc = calloc(d, sizeof(double));
    float *work = malloc(d * sizeof(float));
    float *clamped = malloc(d * sizeof(float));
    for (uint64_t t = 0; t < trials; t++) {
        uint8_t *blob = encode(x, n, 5, 1000 + t, &range, &len);
        if (t == 0) {
            size_t cap = len;
            uint8_t *tmp = malloc(cap);
            thc_encode(x, n, range, 5, 1, 4, 30, T4, clamped, tmp, cap); /* work = clamped R */
            free(tmp);
        }
        CHECK(thc_decode_rotated(blob, len, n, work, NULL) == THC_OK, "decode rotated");
        for (size_t i = 0; i < d; i++)
            acc[i] += work[i];
        free(blob);
    }
    /* Per-coordinate std of one draw <= (largest gap 3 steps) * (2M/g) / 2. */
    double step = 2.0 * range / 30.0, tol = 5.0 * 1.5 * step / sqrt((double)trials);
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < d; i++) {
        double e = fabs(acc[i] / (double)trials - clamped[i]);
        worst = fmax(worst, e / tol);
        bad += e > tol;
    }
    CHECK(bad == 0, "unbiased: %d coordinates off, worst %.2f of the 5-sigma bound", bad, worst);
    free(x);
    free(acc);
    free(work);
    free(clamped);
}

static void test_sum(void)
{
    size_t n = 1000, d = 1024;
    enum { W = 9 };
    uint8_t *blobs[W];
    size_t lens[W];
    float *x = malloc(n * sizeof(float));
    float range = 0;
    /* All workers agree on one range: the max over their M (same n, so same d). */
    float ranges[W];
    float *xs[W];
    for (int w = 0; w < W; w++) {
        xs[w] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            xs[w][i] = (float)(gauss() * (1 + w));
        ranges[w] = (float)(2.1538746940614555 * sqrt(thc_sum_squares(xs[w], n)) / sqrt((double)d));
        range = ranges[w] > range ? ranges[w] : range;
    }
    float *work = malloc(d * sizeof(float));
    double *mean = calloc(d, sizeof(double));
    for (int w = 0; w < W; w++) {
        lens[w] = thc_blob_size(n, 4, 4);
        blobs[w] = malloc(lens[w]);
        CHECK(thc_encode(xs[w], n, range, 77, 500 + w, 4, 30, T4, work, blobs[w], lens[w]) == (ptrdiff_t)lens[w], "enc");
        if (w < 8) {
            CHECK(thc_decode_rotated(blobs[w], lens[w], n, work, NULL) == THC_OK, "dec");
            for (size_t i = 0; i < d; i++)
                mean[i] += work[i] / 8.0;
        }
    }
    size_t cap8 = thc_blob_size(n, 4, 8), cap16 = thc_blob_size(n, 4, 16);
    uint8_t *s8 = malloc(cap8), *s16 = malloc(cap16);
    size_t at = 99;
    ptrdiff_t r = thc_sum((const uint8_t *const *)blobs, lens, 8, n, 8, s8, cap8, &at);
    CHECK(r == (ptrdiff_t)cap8, "8 workers fit 8-bit sums: %td", r);
    CHECK(s8[2] == THC_KIND_SUM && s8[5] == 8 && s8[8] == 8, "sum header");
    CHECK(thc_decode_rotated(s8, cap8, n, work, NULL) == THC_OK, "decode sum");
    double err = 0;
    for (size_t i = 0; i < d; i++)
        err = fmax(err, fabs(work[i] - mean[i]));
    CHECK(err <= 1e-6 * range, "sum decodes to the mean of the decodes: %g", err);
    CHECK(thc_sum((const uint8_t *const *)blobs, lens, 9, n, 8, s8, cap8, &at) == THC_E_OVERFLOW, "9 workers overflow 8 bits");
    CHECK(thc_sum((const uint8_t *const *)blobs, lens, 9, n, 16, s16, cap16, &at) == (ptrdiff_t)cap16, "16 bits hold 9");
    /* A partial sum plus one more blob (a ring step) equals the sum of all. */
    CHECK(thc_sum((const uint8_t *const *)blobs, lens, 8, n, 16, s16, cap16, &at) == (ptrdiff_t)cap16, "partial");
    const uint8_t *pair[2] = {s16, blobs[8]};
    size_t plens[2] = {cap16, lens[8]};
    uint8_t *s16b = malloc(cap16), *s16c = malloc(cap16);
    CHECK(thc_sum(pair, plens, 2, n, 16, s16b, cap16, &at) == (ptrdiff_t)cap16, "ring step");
    CHECK(thc_sum((const uint8_t *const *)blobs, lens, 9, n, 16, s16c, cap16, &at) == (ptrdiff_t)cap16, "all");
    CHECK(memcmp(s16b, s16c, cap16) == 0, "partial sum + blob == sum of all");
    CHECK(s16b[8] == 9, "count 9");

    /* Mismatches: another seed, another range. */
    uint8_t *other = malloc(lens[0]);
    CHECK(thc_encode(xs[0], n, range, 78, 1, 4, 30, T4, work, other, lens[0]) == (ptrdiff_t)lens[0], "enc other");
    const uint8_t *mm[2] = {blobs[0], other};
    size_t mml[2] = {lens[0], lens[0]};
    CHECK(thc_sum(mm, mml, 2, n, 8, s8, cap8, &at) == THC_E_MISMATCH && at == 1, "seed mismatch");
    CHECK(thc_encode(xs[0], n, range * 2, 77, 1, 4, 30, T4, work, other, lens[0]) == (ptrdiff_t)lens[0], "enc other");
    CHECK(thc_sum(mm, mml, 2, n, 8, s8, cap8, &at) == THC_E_MISMATCH, "range mismatch");
    CHECK(thc_sum(mm, mml, 2, 2000, 8, s8, cap8, &at) == THC_E_COUNT, "n mismatch");
    CHECK(thc_sum(mm, mml, 2, n, 8, s8, cap8 - 1, &at) != THC_OK, "tight capacity");
    CHECK(thc_sum(mm, mml, 0, n, 8, s8, cap8, &at) == THC_E_ARG, "no blobs");
    CHECK(thc_sum(mm, mml, 1, n, 12, s8, cap8, &at) == THC_E_ARG, "width 12");

    /* A sum element above count * g is refused by decode and by sum. */
    uint8_t *hostile = copy_exact(s8, cap8);
    thc_sum((const uint8_t *const *)blobs, lens, 8, n, 8, hostile, cap8, &at);
    hostile[cap8 - 1] = 241; /* 8 * 30 = 240 */
    CHECK(thc_decode_rotated(hostile, cap8, n, work, &at) == THC_E_VALUE && at == cap8 - 1, "sum > count*g: at %zu", at);
    const uint8_t *hs[1] = {hostile};
    size_t hl[1] = {cap8};
    CHECK(thc_sum(hs, hl, 1, n, 16, s16, cap16, &at) == THC_E_VALUE, "sum of a hostile sum");
    hostile[cap8 - 1] = 0;
    hostile[8] = 9; /* count 9 at 8 bits: 270 > 255 */
    CHECK(thc_decode_rotated(hostile, cap8, n, work, NULL) == THC_E_HEADER, "count overflowing its width");

    for (int w = 0; w < W; w++) {
        free(blobs[w]);
        free(xs[w]);
    }
    free(x);
    free(work);
    free(mean);
    free(s8);
    free(s16);
    free(s16b);
    free(s16c);
    free(other);
    free(hostile);
}

static void test_malformed(void)
{
    size_t n = 37, len;
    float x[37];
    for (size_t i = 0; i < n; i++)
        x[i] = (float)gauss();
    uint8_t *blob = encode(x, n, 3, 4, NULL, &len);
    float work[64], out[37];
    size_t at;
    /* Every truncation fails cleanly. */
    int bad = 0;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *t = copy_exact(blob, cut);
        int r = thc_decode(t, cut, n, work, out, &at);
        bad += r != THC_E_TRUNCATED;
        free(t);
    }
    CHECK(bad == 0, "every truncation is THC_E_TRUNCATED (%d not)", bad);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, blob, len);
    longer[len] = 0;
    CHECK(thc_decode(longer, len + 1, n, work, out, &at) == THC_E_TRAILING && at == len + 1, "trailing byte");
    free(longer);
    CHECK(thc_decode(blob, len, n, work, out, NULL) == THC_OK, "valid");
    CHECK(thc_decode(blob, len, 65, work, out, &at) == THC_E_COUNT, "n needs d = 128");
    CHECK(thc_decode(blob, len, 32, work, out, &at) == THC_E_COUNT, "n needs d = 32");

    struct {
        size_t off;
        uint8_t val;
        int want;
    } cases[] = {
        {0, 0x55, THC_E_HEADER},  {1, 2, THC_E_HEADER},   {2, 2, THC_E_HEADER},    {3, 0, THC_E_HEADER},
        {3, 9, THC_E_HEADER},     {4, 14, THC_E_HEADER},  {5, 8, THC_E_HEADER},    {6, 32, THC_E_HEADER},
        {7, 1, THC_E_HEADER},     {8, 2, THC_E_HEADER},   {15, 0x7F, THC_E_NONFINITE}, {15, 0xBF, THC_E_NONFINITE},
        {24, 1, THC_E_TABLE},     {30, 30, THC_E_TABLE},  {39, 29, THC_E_TABLE},   {6, 7, THC_E_TRUNCATED}, {6, 5, THC_E_TRAILING},
        {4, 31, THC_E_TABLE},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t *t = copy_exact(blob, len);
        t[cases[c].off] = cases[c].val;
        if (cases[c].off == 15 && cases[c].val == 0x7F)
            t[14] = 0xC0; /* NaN */
        int r = thc_decode(t, len, n, work, out, &at);
        CHECK(r == cases[c].want, "byte %zu = %u: got %d (%s), want %d", cases[c].off, cases[c].val, r,
              thc_strerror(r), cases[c].want);
        free(t);
    }
    /* Nonzero padding bits: b = 3, d = 8 -> 24 bits exactly; b = 3, d = 1 -> 3 bits of a byte. */
    float one = 0.5f, w1[1];
    uint8_t small[24 + 8 + 1];
    static const uint8_t T3[8] = {0, 1, 2, 3, 5, 7, 8, 9};
    CHECK(thc_encode(&one, 1, 1.0f, 1, 1, 3, 9, T3, w1, small, sizeof small) == (ptrdiff_t)sizeof small, "b=3 encode");
    uint8_t *t = copy_exact(small, sizeof small);
    CHECK(thc_decode(t, sizeof small, 1, w1, out, NULL) == THC_OK, "b=3 decode");
    t[sizeof small - 1] |= 0x80;
    CHECK(thc_decode(t, sizeof small, 1, w1, out, &at) == THC_E_VALUE, "padding bits set");
    free(t);
    CHECK(thc_decode(NULL, 0, 1, w1, out, &at) == THC_E_TRUNCATED, "empty");
    CHECK(thc_decode(blob, len, n, NULL, out, &at) == THC_E_ARG, "no work buffer");
    free(blob);
}

/* A kind-0 blob for d = 4 values, b = 2, g = 3, table {0, 1, 2, 3}, range M, every index 3 (each
 * rotated value +M): the inverse transform's first sum is 4 M, the largest any payload gives. */
static void blob_all_top(uint8_t out[29], float range)
{
    static const uint8_t head[12] = {0x54, 1, 0, 2, 3, 2, 2, 0, 1, 0, 0, 0};
    memcpy(out, head, 12);
    memcpy(out + 12, &range, 4);
    memset(out + 16, 0x5A, 8); /* rotation seed */
    static const uint8_t table[4] = {0, 1, 2, 3};
    memcpy(out + 24, table, 4);
    out[28] = 0xFF;
}

static void test_hostile_range(void)
{
    /* CI's finding (fuzz_thc, issue 11): M = 1.55e38 with d = 4 decoded to inf. */
    static const uint8_t found[29] = {0x54, 0x01, 0x00, 0x02, 0x03, 0x02, 0x02, 0x00, 0x01, 0x00,
                                      0x00, 0x00, 0x3e, 0xe4, 0xe9, 0x7e, 0xaf, 0xcd, 0x1d, 0x7b,
                                      0x30, 0xa8, 0x20, 0xe2, 0x00, 0x01, 0x02, 0x03, 0x5f};
    float work[4], out[4];
    size_t at = 0;
    uint8_t *t = copy_exact(found, sizeof found);
    CHECK(thc_decode(t, sizeof found, 3, work, out, &at) == THC_E_NONFINITE && at == 12, "found blob refused at M");
    CHECK(thc_decode_rotated(t, sizeof found, 3, work, NULL) == THC_E_NONFINITE, "rotated decode refuses it too");
    struct thc_info info;
    CHECK(thc_inspect(t, sizeof found, &info) == THC_E_NONFINITE, "inspect refuses it");
    free(t);

    /* The bound is tight: M = FLT_MAX / d decodes to finite values (the first is FLT_MAX / 2),
     * the next float up is refused, by the decoder, the sum and the encoder alike. */
    uint8_t blob[29];
    float edge = FLT_MAX / 4;
    blob_all_top(blob, edge);
    t = copy_exact(blob, sizeof blob);
    int r = thc_decode(t, sizeof blob, 4, work, out, NULL);
    CHECK(r == THC_OK && isfinite(out[0]) && out[0] == FLT_MAX / 2, "M = FLT_MAX / d: %d, %g", r, (double)out[0]);
    const uint8_t *two[2] = {t, t};
    size_t lens[2] = {sizeof blob, sizeof blob};
    uint8_t sum[24 + 4 + 4];
    CHECK(thc_sum(two, lens, 2, 4, 8, sum, sizeof sum, NULL) == (ptrdiff_t)sizeof sum, "sum at the edge");
    CHECK(thc_decode(sum, sizeof sum, 4, work, out, NULL) == THC_OK && isfinite(out[0]), "sum decodes finite");
    free(t);
    blob_all_top(blob, nextafterf(edge, INFINITY));
    t = copy_exact(blob, sizeof blob);
    CHECK(thc_decode(t, sizeof blob, 4, work, out, &at) == THC_E_NONFINITE && at == 12, "M above FLT_MAX / d");
    two[0] = two[1] = t;
    CHECK(thc_sum(two, lens, 2, 4, 8, sum, sizeof sum, NULL) == THC_E_NONFINITE, "sum refuses it");
    free(t);
    static const uint8_t T2[4] = {0, 1, 2, 3};
    float x[4] = {1, -1, 0.5f, 0};
    uint8_t enc[29];
    CHECK(thc_encode(x, 4, edge, 1, 2, 2, 3, T2, work, enc, sizeof enc) == (ptrdiff_t)sizeof enc, "encode at the edge");
    CHECK(thc_decode(enc, sizeof enc, 4, work, out, NULL) == THC_OK, "and it decodes");
    CHECK(thc_encode(x, 4, nextafterf(edge, INFINITY), 1, 2, 2, 3, T2, work, enc, sizeof enc) == THC_E_NONFINITE,
          "encoder refuses M above FLT_MAX / d");
}

int main(void)
{
    test_sizes();
    test_fwht();
    test_known_blob();
    test_encode_args();
    test_unbiased();
    test_sum();
    test_malformed();
    test_hostile_range();
    return check_report("test_thc_codec");
}
