/*
 * libFuzzer target for the 3LC codec. Byte 0 picks the mode:
 *   even: decode. The rest is the stream, copied to an exactly-sized buffer. The value count n
 *         is the stream's own count (bytes 8-11, capped at 65535) when bit 1 of byte 0 is set,
 *         else byte 0 >> 2: both the consistent and the inconsistent case get exercised. A
 *         stream that decodes must give finite values in {-M, 0, M} only.
 *   odd:  encode. Byte 1 picks the sparsity and ZRE, the rest are float bit patterns. Encoding
 *         must succeed (or refuse non-finite input / scaler overflow), the baseline and SIMD
 *         kernels must agree, the stream must decode to the values tlc_encode reported, bit for
 *         bit, and every truncation must be refused.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "threelc_codec.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static void decode_case(const uint8_t *data, size_t size)
{
    size_t len = size - 1;
    uint8_t *stream = fz_exact(data + 1, len);
    size_t n = fz_stream_count(data[0], stream, len, TLC_HEADER_BYTES);
    float *y = fz_floats(n);
    size_t at = 0;
    int r = tlc_decode(len ? stream : NULL, len, y, n, &at);
    if (r == TLC_OK) {
        float m;
        memcpy(&m, stream + 4, 4);
        for (size_t i = 0; i < n; i++)
            if (!fz_finite(y[i]) || !(y[i] == 0.0f || y[i] == m || y[i] == -m))
                abort();
    } else if (r > TLC_OK || r < TLC_E_OVERFLOW || r == TLC_E_ARG || r == TLC_E_SPACE || at > len) {
        abort(); /* only stream errors, at an offset inside the stream */
    }
    free(stream);
    free(y);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    static const float sparsities[4] = {1.0f, 1.5f, 1.75f, 1.9f};
    float s = sparsities[data[1] & 3];
    int zre = (data[1] >> 2) & 1;
    size_t n = (size - 2) / sizeof(float);
    float *x = fz_floats(n), *rec = fz_floats(n);
    float *y = fz_floats(n);
    memcpy(x, data + 2, n * sizeof(float));
    size_t cap = tlc_max_encoded_size(n);
    uint8_t *out = malloc(cap);
    ptrdiff_t r = tlc_encode(x, n, s, zre, out, cap, rec);
    if (r == TLC_E_NONFINITE || r == TLC_E_RANGE)
        goto done;
    if (r < TLC_HEADER_BYTES || (size_t)r > cap)
        abort();
    uint8_t *base = malloc(cap);
    int was = tlc_simd(0);
    ptrdiff_t rb = tlc_encode(x, n, s, zre, base, cap, y);
    tlc_simd(was);
    if (rb != r || memcmp(base, out, (size_t)r) != 0 || memcmp(y, rec, n * sizeof(float)) != 0)
        abort(); /* the baseline kernels must give the SIMD kernels' bytes */
    free(base);
    uint8_t *exact = malloc((size_t)r);
    memcpy(exact, out, (size_t)r);
    if (tlc_decode(exact, (size_t)r, y, n, NULL) != TLC_OK || memcmp(y, rec, n * sizeof(float)) != 0)
        abort();
    for (size_t len = (size_t)r > 8 ? (size_t)r - 8 : 0; len < (size_t)r; len++)
        if (tlc_decode(exact, len, y, n, NULL) == TLC_OK)
            abort();
    free(exact);
done:
    free(x);
    free(rec);
    free(y);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
