/*
 * libFuzzer target for the TernGrad codec. Byte 0 picks the mode:
 *   even: decode. The rest is the stream, copied to an exactly-sized buffer. The value count n
 *         is the stream's own count (bytes 8-11, capped at 65535) when bit 1 of byte 0 is set,
 *         else byte 0 >> 2. A stream that decodes must give finite values in {-S, 0, S} only.
 *   odd:  encode. Byte 1 picks packing, clipping and an agreed scaler (none, larger, smaller),
 *         bytes 2-9 the seed, the rest are float bit patterns. Encoding must succeed (or refuse
 *         non-finite input), take exactly tg_encoded_size bytes, match the baseline kernels'
 *         bytes, decode, give only 0 or +-S with the input's sign, and refuse every truncation.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "terngrad_codec.h"
#include "fuzz_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void decode_case(const uint8_t *data, size_t size)
{
    size_t len = size - 1;
    uint8_t *stream = fz_exact(data + 1, len);
    size_t n = fz_stream_count(data[0], stream, len, TG_HEADER_BYTES);
    float *y = fz_floats(n);
    size_t at = 0;
    int r = tg_decode(len ? stream : NULL, len, y, n, &at);
    if (r == TG_OK) {
        float S;
        memcpy(&S, stream + 4, 4);
        for (size_t i = 0; i < n; i++)
            if (!fz_finite(y[i]) || !(y[i] == 0.0f || y[i] == S || y[i] == -S))
                abort();
    } else if (r > TG_OK || r < TG_E_CODE || r == TG_E_ARG || r == TG_E_SPACE || at > len) {
        abort();
    }
    free(stream);
    free(y);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 10)
        return;
    int packing = data[1] & 1;
    double clip = (data[1] & 2) ? 2.5 : 0.0;
    int agreed = (data[1] >> 2) & 1;
    uint64_t seed;
    memcpy(&seed, data + 2, 8);
    size_t n = (size - 10) / sizeof(float);
    float *x = fz_floats(n), *y = fz_floats(n);
    memcpy(x, data + 10, n * sizeof(float));
    float own = 0, bound = 0;
    size_t cap = tg_encoded_size(n, packing);
    uint8_t *out = malloc(cap);
    if (tg_scaler(x, n, clip, &own, &bound) == TG_E_NONFINITE) {
        if (tg_encode(x, n, clip, -1.0f, packing, seed, 0, out, cap) != TG_E_NONFINITE)
            abort();
        goto done;
    }
    float shared = agreed ? ((data[1] & 8) ? own * 0.5f : own * 1.5f) : -1.0f;
    if (agreed && !isfinite(shared))
        shared = own;
    ptrdiff_t r = tg_encode(x, n, clip, shared, packing, seed, 0, out, cap);
    if (r != (ptrdiff_t)cap || tg_decode(out, cap, y, n, NULL) != TG_OK)
        abort();
    uint8_t *base = malloc(cap);
    int was = tg_simd(0);
    ptrdiff_t rb = tg_encode(x, n, clip, shared, packing, seed, 0, base, cap);
    tg_simd(was);
    if (rb != r || memcmp(base, out, cap) != 0)
        abort(); /* the baseline kernels must give the SIMD kernels' bytes */
    free(base);
    float S;
    memcpy(&S, out + 4, 4);
    for (size_t i = 0; i < n; i++)
        if (!(y[i] == 0.0f || (y[i] == S && x[i] > 0) || (y[i] == -S && x[i] < 0)))
            abort();
    for (size_t len = cap > 8 ? cap - 8 : 0; len < cap; len++) {
        uint8_t *t = fz_exact(out, len);
        if (tg_decode(len ? t : NULL, len, y, n, NULL) == TG_OK)
            abort();
        free(t);
    }
done:
    free(out);
    free(x);
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
