/*
 * libFuzzer target for the THC codec. Byte 0 picks the mode (mod 3):
 *   0 decode: bytes 1-2 are the value count n (little-endian), the rest is a blob copied to an
 *     exactly-sized buffer. thc_decode and thc_decode_rotated must agree on the status; a
 *     decoded value must be finite.
 *   1 sum:    bytes 1-2 n, byte 3 the width selector, bytes 4-5 the length of the first blob;
 *     the rest splits into two blobs. thc_sum must not crash; a sum it produces must decode to
 *     finite values.
 *     thc_add_indices of the first blob and indices taken from the second's bytes must not
 *     crash, and what it writes must be thc_sum of that blob and thc_pack_indices of the indices.
 *   2 encode: byte 1 picks b and g, the rest are float bit patterns. Encoding must succeed (or
 *     refuse a non-finite value) and the blob must decode and sum with itself; the ring's path
 *     (thc_rotate_unscaled, thc_quantize, thc_pack_indices) must write the same blob.
 * Every decode also runs thc_decode_rotated_sum, which must agree on the status, and a decode
 * that succeeds must give thc_decode's floats through thc_unrotate, the ring's inverse.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "thc_codec.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t T4[16] = {0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 21, 23, 25, 27, 30};

/* Decodes a blob both ways; aborts unless they agree and every decoded value is finite.
 * Returns the status. */
static int check_decodes(const uint8_t *blob, size_t len, size_t n)
{
    size_t d = thc_padded_dim(n);
    float *work = malloc(d * sizeof(float)), *work2 = malloc(d * sizeof(float));
    float *out = fz_floats(n);
    size_t at = 0, at2 = 0;
    int r = thc_decode(blob, len, n, work, out, &at);
    int r2 = thc_decode_rotated(blob, len, n, work2, &at2);
    if (r != r2 || (r != THC_OK && (at != at2 || at > len)))
        abort();
    r2 = thc_decode_rotated_sum(blob, len, n, work2, &at2);
    if (r != r2 || (r != THC_OK && at != at2))
        abort();
    if (r == THC_OK) {
        for (size_t i = 0; i < n; i++)
            if (!fz_finite(out[i]))
                abort();
        /* the ring's inverse (thc_unrotate of the rotated mean) gives thc_decode's floats */
        float *out2 = fz_floats(n);
        uint64_t seed = 0;
        for (int i = 7; i >= 0; i--)
            seed = (seed << 8) | blob[16 + i];
        if (thc_decode_rotated(blob, len, n, work2, NULL) != THC_OK || thc_unrotate(work2, d, seed, out2, n) != THC_OK ||
            (n > 0 && memcmp(out, out2, n * sizeof(float)) != 0))
            abort();
        free(out2);
    }
    if (r > 0 || r < THC_E_NONFINITE)
        abort();
    free(work);
    free(work2);
    free(out);
    return r;
}

static void decode_case(const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    size_t n = fz_le16(data + 1);
    uint8_t *blob = fz_exact(data + 3, size - 3);
    check_decodes(blob, size - 3, n);
    free(blob);
}

/* thc_add_indices(a, z): z from the bytes zb (cycled; a byte may be >= 2^b); what it writes must be
 * thc_sum of a and thc_pack_indices(z), and decode. */
static void add_indices_case(const uint8_t *a, size_t alen, const uint8_t *zb, size_t zlen, size_t n, int width)
{
    size_t d = thc_padded_dim(n);
    if (d == 0 || d > 4096)
        return;
    uint8_t *z = malloc(d);
    for (size_t i = 0; i < d; i++)
        z[i] = zlen ? zb[i % zlen] : 0;
    size_t cap = thc_blob_size(n, 8, 32);
    uint8_t *out = malloc(cap), *ref = malloc(cap), *idx = malloc(cap);
    size_t at = 0;
    ptrdiff_t r = thc_add_indices(a, alen, z, d, width, out, cap, &at);
    struct thc_info info;
    if (r < 0) {
        if (r > 0 || r < THC_E_NONFINITE || at > alen)
            abort();
    } else {
        if ((size_t)r > cap || thc_inspect(a, alen, &info) != THC_OK)
            abort();
        ptrdiff_t il = thc_pack_indices(z, d, info.range, info.seed, info.bits, info.granularity, info.table, idx, cap);
        if (il < 0)
            abort();
        const uint8_t *blobs[2] = {a, idx};
        size_t lens[2] = {alen, (size_t)il};
        ptrdiff_t rr = thc_sum(blobs, lens, 2, n, width, ref, cap, NULL);
        if (rr != r || memcmp(out, ref, (size_t)r) != 0)
            abort();
        uint8_t *s = fz_exact(out, (size_t)r);
        if (check_decodes(s, (size_t)r, n) != THC_OK)
            abort();
        free(s);
    }
    free(z);
    free(out);
    free(ref);
    free(idx);
}

static void sum_case(const uint8_t *data, size_t size)
{
    if (size < 6)
        return;
    size_t n = fz_le16(data + 1);
    static const int widths[4] = {8, 16, 32, 12};
    int width = widths[data[3] & 3];
    size_t rest = size - 6;
    size_t l1 = ((size_t)data[4] | ((size_t)data[5] << 8));
    if (l1 > rest)
        l1 = rest;
    uint8_t *a = fz_exact(data + 6, l1), *b = fz_exact(data + 6 + l1, rest - l1);
    const uint8_t *blobs[3] = {a, b, a};
    size_t lens[3] = {l1, rest - l1, l1};
    size_t cap = thc_blob_size(n, 8, 32); /* the largest any sum for n values can be */
    uint8_t *out = malloc(cap ? cap : 1);
    for (size_t count = 1; count <= 3; count++) {
        size_t at = 0;
        ptrdiff_t r = thc_sum(blobs, lens, count, n, width, out, cap, &at);
        if (r >= 0) {
            if ((size_t)r > cap)
                abort();
            uint8_t *s = fz_exact(out, (size_t)r);
            if (check_decodes(s, (size_t)r, n) != THC_OK)
                abort(); /* a sum the library made must decode, to finite values */
            free(s);
        } else if (at >= count) {
            abort();
        }
    }
    add_indices_case(a, l1, data + 6 + l1, rest - l1, n, width);
    free(a);
    free(b);
    free(out);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    int bits = 1 + (data[1] & 3); /* 1..4 */
    int g = (1 << bits) - 1 + (data[1] >> 4);
    uint8_t table[16];
    for (int z = 0; z < (1 << bits); z++)
        table[z] = (uint8_t)z;
    table[(1 << bits) - 1] = (uint8_t)g;
    if (bits == 4 && g == 30)
        memcpy(table, T4, 16);
    size_t n = (size - 2) / sizeof(float);
    float *x = fz_floats(n);
    if (n)
        memcpy(x, data + 2, n * sizeof(float));
    size_t d = thc_padded_dim(n);
    float *work = malloc(d * sizeof(float));
    size_t cap = thc_blob_size(n, bits, bits);
    uint8_t *out = malloc(cap);
    double ss = thc_sum_squares(x, n);
    float range = ss < 1e60 ? (float)(2.0 * __builtin_sqrt(ss) / __builtin_sqrt((double)d)) : 1.0f;
    ptrdiff_t r = thc_encode(x, n, range, 11, 12, bits, g, table, work, out, cap);
    if (r == THC_E_NONFINITE) {
        /* fine: a non-finite input, or a transform overflow */
    } else if (r != (ptrdiff_t)cap) {
        abort();
    } else {
        check_decodes(out, cap, n);
        const uint8_t *blobs[2] = {out, out};
        size_t lens[2] = {cap, cap};
        size_t scap = thc_blob_size(n, bits, 16);
        uint8_t *s = malloc(scap);
        if (thc_sum(blobs, lens, 2, n, 16, s, scap, NULL) != (ptrdiff_t)scap)
            abort();
        check_decodes(s, scap, n);
        free(s);
        /* the ring's path: the same blob */
        float *w2 = malloc(d * sizeof(float));
        uint8_t *z = malloc(d), *o2 = malloc(cap);
        if (thc_rotate_unscaled(x, n, d, 11, w2) != THC_OK ||
            thc_quantize(w2, d, thc_rht_scale(d), range, 12, bits, g, table, z) != THC_OK ||
            thc_pack_indices(z, d, range, 11, bits, g, table, o2, cap) != (ptrdiff_t)cap || memcmp(o2, out, cap))
            abort();
        for (size_t i = 0; i < d; i++)
            if (!fz_finite(w2[i]))
                abort();
        free(w2);
        free(z);
        free(o2);
    }
    free(x);
    free(work);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    switch (data[0] % 3) {
    case 0: decode_case(data, size); break;
    case 1: sum_case(data, size); break;
    default: encode_case(data, size); break;
    }
    return 0;
}
