/*
 * libFuzzer target for the INCEPTIONN codec. Byte 0 picks the mode:
 *   even: decode. Bytes 1-2 are the value count n (little-endian), the rest is the stream, copied
 *         to an exactly-sized buffer. Scalar and AVX2 must agree on status and on every value. A
 *         compressed lane (8BIT, 16BIT) decodes to a finite value below 1 in magnitude, a 0BIT
 *         lane to +0.0; only a NO_COMPRESS lane can be inf/NaN, and it is the stream's 4 bytes.
 *         The stream histogram's two builds (portable, POPCNT) give decode's status and the
 *         same counts.
 *   odd:  encode. The rest are float bit patterns, byte 1 also picks k. Both paths must give the
 *         same bytes, and the stream must decode: values with |x| >= 1, inf and NaN bit-exactly,
 *         every other value to a finite one no larger in magnitude.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "inceptionn_codec.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

/* Walks a stream inc_decode accepted and aborts unless every value follows its lane's tag. */
static void check_lanes(const uint8_t *stream, const float *out, size_t n)
{
    size_t pos = 0;
    for (size_t g = 0; g * 8 < n; g++) {
        unsigned key = (unsigned)stream[pos] | ((unsigned)stream[pos + 1] << 8);
        pos += 2;
        for (size_t j = 0; j < 8 && g * 8 + j < n; j++) {
            float v = out[g * 8 + j];
            uint32_t bits;
            memcpy(&bits, &v, 4);
            switch ((key >> (2 * j)) & 3) {
            case INC_0BIT:
                if (bits != 0)
                    abort();
                break;
            case INC_8BIT:
            case INC_16BIT:
                if (!fz_finite(v) || (v < 0 ? -v : v) >= 1.0f)
                    abort();
                pos += (key >> (2 * j)) & 3;
                break;
            default: {
                uint32_t raw;
                memcpy(&raw, stream + pos, 4); /* little-endian host (x86, the soft NIC's) */
                if (bits != raw)
                    abort();
                pos += 4;
            }
            }
        }
    }
}

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
    if (ra == INC_OK)
        check_lanes(stream, a, n);
    uint64_t ha[4] = {0}, hb[4] = {0};
    int sa = inc_stream_histogram_impl(stream, len, n, ha, INC_IMPL_SCALAR);
    int sb = inc_stream_histogram_impl(stream, len, n, hb, INC_IMPL_AUTO);
    if (sa != ra || sb != ra || memcmp(ha, hb, sizeof ha) != 0)
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
    check_lanes(a, y, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t xb, yb;
        memcpy(&xb, &x[i], 4);
        memcpy(&yb, &y[i], 4);
        if (((xb >> 23) & 0xFF) >= 127 ? xb != yb /* NO_COMPRESS: verbatim */
                                       : (!fz_finite(y[i]) || (yb & 0x7FFFFFFFu) > (xb & 0x7FFFFFFFu)))
            abort();
    }
    free(x);
    free(a);
    free(b);
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
