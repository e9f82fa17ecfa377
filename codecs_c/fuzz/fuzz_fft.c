/*
 * libFuzzer target for the FFT sparsification + range-float codec. Byte 0 picks the mode:
 *   even: decode. Bytes 1-2 are the value count n (little-endian), the rest is a blob copied to
 *         an exactly-sized buffer. A blob that decodes must give finite values, zeros off the
 *         bitmap.
 *   odd:  encode. Byte 1 picks N, byte 2 the kept fraction, byte 3 the mantissa (auto or fixed)
 *         and n (the largest n whose padded spectrum fits); the rest are the spectrum's float
 *         bit patterns. Encoding must succeed
 *         (or refuse a non-finite value or an unusable fixed mantissa) and its blob must decode.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "fft_codec.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static void decode_case(const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    size_t n = fz_le16(data + 1);
    size_t len = size - 3;
    uint8_t *blob = fz_exact(data + 3, len);
    size_t K = fft_bins(n);
    float *spec = malloc(K ? 2 * K * sizeof(float) : 1);
    size_t at = 0;
    int r = fft_decode(blob, len, n, K ? spec : NULL, &at);
    if (r == FFT_OK) {
        for (size_t i = 0; i < 2 * K; i++)
            if (!fz_finite(spec[i]))
                abort();
    } else if (r > 0 || r < FFT_E_NOMEM || at > len) {
        abort();
    }
    free(blob);
    free(spec);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 4)
        return;
    int bits = FFT_MIN_BITS + data[1] % (FFT_MAX_BITS - FFT_MIN_BITS + 1);
    size_t avail = (size - 4) / (2 * sizeof(float)); /* complex values in the input */
    size_t n = avail == 0 ? 0 : 2 * avail - 1 - (data[3] & 1);
    while (fft_bins(n) > avail) /* the padded length must fit the spectrum we have */
        n--;
    size_t K = fft_bins(n);
    size_t k = K ? (size_t)data[2] * K / 255 : 0;
    int m = (data[3] >> 1) % 25 - 1; /* -1 = auto, 0..23 */
    float *spec = malloc(K ? 2 * K * sizeof(float) : 1);
    if (K)
        memcpy(spec, data + 4, 2 * K * sizeof(float));
    size_t cap = fft_encoded_size(n, k, bits);
    uint8_t *out = malloc(cap ? cap : 1);
    ptrdiff_t r = fft_encode(K ? spec : NULL, n, k, bits, m, out, cap);
    int nonfinite = 0;
    for (size_t i = 0; i < 2 * K; i++)
        nonfinite |= !fz_finite(spec[i]);
    if (r == FFT_E_NONFINITE) {
        if (!nonfinite)
            abort();
    } else if (r == FFT_E_ARG) {
        if (m < 0) /* auto always finds a mantissa */
            abort();
    } else if (r != (ptrdiff_t)cap || nonfinite) {
        abort();
    } else {
        float *back = malloc(K ? 2 * K * sizeof(float) : 1);
        if (fft_decode(out, cap, n, K ? back : NULL, NULL) != FFT_OK)
            abort();
        for (size_t i = 0; i < 2 * K; i++) /* truncation never grows a magnitude */
            if (!fz_finite(back[i]) || (back[i] < 0 ? -back[i] : back[i]) > (spec[i] < 0 ? -spec[i] : spec[i]))
                abort();
        free(back);
    }
    free(spec);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
