/*
 * libFuzzer target for the INCEPTIONN codec. Byte 0 picks the mode:
 *   even: decode. Bytes 1-2 are the value count n (little-endian), the rest is the stream, copied
 *         to an exactly-sized buffer. Scalar and AVX2 must agree on status and on every value.
 *   odd:  encode. The rest are float bit patterns, byte 1 also picks k. Both paths must give the
 *         same bytes, and the stream must decode.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "inceptionn_codec.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static void decode_case(const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    size_t n = fz_le16(data + 1);
    size_t len = size - 3;
    uint8_t *stream = fz_exact(data + 3, len);
    float *a = fz_floats(n), *b = fz_floats(n);
    size_t at_a = 0, at_b = 0;
    int ra = inc_decode(stream, len, a, n, &at_a, INC_IMPL_SCALAR);
    int rb = inc_have_avx2() ? inc_decode(stream, len, b, n, &at_b, INC_IMPL_AVX2) : ra;
    if (ra != rb || (ra == INC_OK && inc_have_avx2() && memcmp(a, b, n * sizeof(float)) != 0))
        abort();
    if (ra != INC_OK && ra != INC_E_TRUNCATED && ra != INC_E_TRAILING && ra != INC_E_PADDING)
        abort();
    if (ra != INC_OK && at_a > len)
        abort();
    free(stream);
    free(a);
    free(b);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    int k = -1 - (int)(data[1] % 30);
    size_t n = (size - 2) / sizeof(float);
    float *x = fz_floats(n);
    memcpy(x, data + 2, n * sizeof(float));
    size_t cap = inc_max_encoded_size(n);
    uint8_t *a = malloc(cap ? cap : 1), *b = malloc(cap ? cap : 1);
    ptrdiff_t ra = inc_encode(x, n, k, a, cap, INC_IMPL_SCALAR);
    ptrdiff_t rb = inc_have_avx2() ? inc_encode(x, n, k, b, cap, INC_IMPL_AVX2) : ra;
    if (ra < 0 || ra != rb || (inc_have_avx2() && memcmp(a, b, (size_t)ra) != 0))
        abort();
    float *y = fz_floats(n);
    if (inc_decode(a, (size_t)ra, y, n, NULL, INC_IMPL_AUTO) != INC_OK)
        abort();
    free(x);
    free(a);
    free(b);
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
