/*
 * C unit test of the INCEPTIONN codec, built and run under ASan/UBSan by tests/test_c_hardening.py.
 * Every buffer handed to the decoder is malloc'd to its exact size, so a read past the stream is
 * caught by ASan rather than landing in slack.
 */
#include "inceptionn_codec.h"

#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Random floats over every exponent, with the specials and tier edges mixed in. */
static void fill(float *x, size_t n)
{
    static const uint32_t special[] = {0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000,
                                       0xFF800000, 0x7FC00000, 0x00000001, 0x807FFFFF, 0x3F7FFFFF,
                                       0x3A800000, 0x3C000000, 0x3D000000, 0x3C7FFFFF};
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd();
        if (r % 7 == 0)
            x[i] = from_bits(special[rnd() % (sizeof special / sizeof special[0])]);
        else if (r % 3 == 0)
            x[i] = from_bits(rnd()); /* any bit pattern */
        else /* gradient-like: exponents 100..130 */
            x[i] = from_bits((rnd() & 0x807FFFFF) | ((100 + rnd() % 31) << 23));
    }
}

static void test_known_vector(void)
{
    /* k = -10: Eb = 117, mid = 122. One value per tier plus a signed 16BIT. */
    float x[5] = {0.75f, 0.015625f /* 2^-6: 8BIT, field 2 */, 1e-5f, 2.5f, -0.5f};
    uint8_t out[34];
    ptrdiff_t r = inc_encode(x, 5, -10, out, sizeof out, INC_IMPL_SCALAR);
    /* tags: 2,1,0,3,2 -> 0b10 11 00 01 10 = 0x2C6 */
    static const uint8_t want[] = {0xC6, 0x02, 0x00, 0x60, 0x02, 0x00, 0x00, 0x20, 0x40, 0x00, 0xC0};
    CHECK(r == (ptrdiff_t)sizeof want, "known vector: %td bytes", r);
    CHECK(r == (ptrdiff_t)sizeof want && memcmp(out, want, sizeof want) == 0, "known vector bytes");
    float y[5];
    CHECK(inc_decode(out, (size_t)r, y, 5, NULL, INC_IMPL_SCALAR) == INC_OK, "known vector decode");
    CHECK(y[0] == 0.75f && y[1] == 0.015625f && to_bits(y[2]) == 0 && y[3] == 2.5f && y[4] == -0.5f,
          "known vector values %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4]);
}

static void test_paths_agree(void)
{
    if (!inc_have_avx2()) {
        printf("note: no AVX2 on this CPU, scalar path only\n");
        return;
    }
    for (int trial = 0; trial < 400; trial++) {
        size_t n = trial < 100 ? (size_t)trial : (size_t)(rnd() % 5000);
        int k = -1 - (int)(rnd() % 30);
        float *x = malloc(n * sizeof(float) + 1);
        fill(x, n);
        size_t cap = inc_max_encoded_size(n);
        uint8_t *a = malloc(cap + 1), *b = malloc(cap + 1);
        ptrdiff_t ra = inc_encode(x, n, k, a, cap, INC_IMPL_SCALAR);
        ptrdiff_t rb = inc_encode(x, n, k, b, cap, INC_IMPL_AVX2);
        CHECK(ra >= 0 && ra == rb && memcmp(a, b, (size_t)ra) == 0, "encode paths differ n=%zu k=%d", n, k);
        CHECK((size_t)ra == inc_encoded_size(x, n, k), "encoded_size n=%zu", n);
        uint8_t *exact = malloc((size_t)ra + 1);
        memcpy(exact, a, (size_t)ra);
        float *ya = malloc(n * sizeof(float) + 1), *yb = malloc(n * sizeof(float) + 1);
        int da = inc_decode(exact, (size_t)ra, ya, n, NULL, INC_IMPL_SCALAR);
        int db = inc_decode(exact, (size_t)ra, yb, n, NULL, INC_IMPL_AVX2);
        CHECK(da == INC_OK && db == INC_OK && memcmp(ya, yb, n * sizeof(float)) == 0,
              "decode paths differ n=%zu k=%d", n, k);
        /* Precision of each tier. */
        for (size_t i = 0; i < n && da == INC_OK; i++) {
            float v = x[i], d = ya[i];
            if (isnan(v)) {
                CHECK(isnan(d), "NaN lost");
                continue;
            }
            float err = fabsf(v - d);
            unsigned e = (to_bits(v) >> 23) & 0xFF;
            if (e >= 127)
                CHECK(to_bits(v) == to_bits(d), "NO_COMPRESS changed");
            else if (e >= (unsigned)(127 + k) + (unsigned)((-k + 1) / 2))
                CHECK(err < 0x1p-15f, "16BIT error %g", err);
            else if (e >= (unsigned)(127 + k))
                CHECK(err < 0x1p-7f, "8BIT error %g", err);
            else
                CHECK(to_bits(d) == 0, "0BIT not +0");
        }
        free(x); free(a); free(b); free(exact); free(ya); free(yb);
    }
}

static void test_every_capacity(void)
{
    float x[37];
    fill(x, 37);
    uint8_t full[INC_MAX_GROUP_BYTES * 5];
    ptrdiff_t need = inc_encode(x, 37, -10, full, sizeof full, INC_IMPL_AUTO);
    for (size_t cap = 0; cap <= (size_t)need; cap++) {
        uint8_t *o = malloc(cap + 1);
        for (int impl = INC_IMPL_SCALAR; impl <= (inc_have_avx2() ? INC_IMPL_AVX2 : INC_IMPL_SCALAR); impl++) {
            ptrdiff_t r = inc_encode(x, 37, -10, o, cap, impl);
            if (cap < (size_t)need)
                CHECK(r == INC_E_SPACE, "cap %zu gave %td", cap, r);
            else
                CHECK(r == need && memcmp(o, full, cap) == 0, "exact cap gave %td", r);
        }
        free(o);
    }
}

static void test_malformed(void)
{
    float x[29];
    fill(x, 29);
    x[28] = 2.5f; /* NO_COMPRESS, so the stream is not also a valid stream of 28 values */
    uint8_t enc[INC_MAX_GROUP_BYTES * 4];
    ptrdiff_t len = inc_encode(x, 29, -8, enc, sizeof enc, INC_IMPL_AUTO);
    float y[29];
    for (int impl = INC_IMPL_SCALAR; impl <= (inc_have_avx2() ? INC_IMPL_AVX2 : INC_IMPL_SCALAR); impl++) {
        /* Every truncation fails, never overreads. */
        for (size_t cut = 0; cut < (size_t)len; cut++) {
            uint8_t *p = malloc(cut + 1);
            memcpy(p, enc, cut);
            int r = inc_decode(p, cut, y, 29, NULL, impl);
            CHECK(r == INC_E_TRUNCATED || r == INC_E_TRAILING, "cut %zu gave %d", cut, r);
            free(p);
        }
        /* One byte too many. */
        uint8_t *p = malloc((size_t)len + 1);
        memcpy(p, enc, (size_t)len);
        p[len] = 0;
        size_t at = 0;
        CHECK(inc_decode(p, (size_t)len + 1, y, 29, &at, impl) == INC_E_TRAILING && at == (size_t)len,
              "trailing byte at %zu", at);
        /* A tag in a padding lane (29 values: lanes 5..7 of group 3 are padding). */
        uint8_t *q = malloc((size_t)len);
        memcpy(q, enc, (size_t)len);
        CHECK(inc_decode(q, (size_t)len, y, 28, NULL, impl) != INC_OK, "fewer values accepted");
        free(p);
        free(q);
        /* Garbage of every length into every count: a status, never a crash. */
        for (int trial = 0; trial < 3000; trial++) {
            size_t glen = rnd() % 200, n = rnd() % 300;
            uint8_t *gbuf = malloc(glen + 1);
            float *out = malloc(n * sizeof(float) + 1);
            for (size_t i = 0; i < glen; i++)
                gbuf[i] = (uint8_t)rnd();
            int r = inc_decode(gbuf, glen, out, n, NULL, impl);
            CHECK(r == INC_OK || r == INC_E_TRUNCATED || r == INC_E_TRAILING || r == INC_E_PADDING,
                  "garbage gave %d", r);
            free(gbuf);
            free(out);
        }
    }
    /* A hostile count with a tiny stream is refused up front. */
    uint8_t two[2] = {0, 0};
    CHECK(inc_decode(two, 2, NULL, (size_t)1 << 40, NULL, INC_IMPL_AUTO) == INC_E_ARG, "NULL out with n");
    CHECK(inc_decode(two, 2, y, 29, NULL, INC_IMPL_AUTO) == INC_E_TRUNCATED, "count beyond stream");
    CHECK(inc_encode(x, 29, 0, enc, sizeof enc, INC_IMPL_AUTO) == INC_E_ARG, "k = 0 accepted");
    CHECK(inc_encode(x, 29, -31, enc, sizeof enc, INC_IMPL_AUTO) == INC_E_ARG, "k = -31 accepted");
    CHECK(inc_max_encoded_size(SIZE_MAX) == SIZE_MAX, "max size saturates");
}

int main(void)
{
    test_known_vector();
    test_paths_agree();
    test_every_capacity();
    test_malformed();
    return check_report("");
}
