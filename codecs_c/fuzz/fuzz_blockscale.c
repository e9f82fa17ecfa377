/*
 * libFuzzer target for the ring's per-block scaling (blockscale_codec.h). Byte 0 picks the mode:
 *   even: decode. Bytes 1-2 are the value count n (little-endian), byte 0's bits 1-7 the block
 *         (1..128), the rest are wire floats, copied to an exactly-sized buffer. On BS_OK every
 *         exponent float is an integer in range and every decoded value of a scaled block finite.
 *   odd:  encode. Byte 0's bits 1-7 pick the headroom (mod BS_MAX_HEADROOM + 1), byte 1 k and
 *         the block; the rest are float bit patterns. The wire must decode to what the encoder
 *         predicted, every wire float be a fixed point of inc_reconstruct, and every block's
 *         exponent be bs_shift_h's.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "blockscale_codec.h"
#include "fuzz_util.h"
#include "inceptionn_codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void decode_case(const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    size_t block = (size_t)(data[0] >> 1) + 1, n = fz_le16(data + 1);
    size_t len = (size - 3) / 4;
    float *w = fz_floats(len), *out = fz_floats(n);
    if (len)
        memcpy(w, data + 3, len * 4);
    size_t at = 0;
    int st = bs_decode(w, len, out, n, block, &at);
    if (st == BS_OK) {
        for (size_t a = 0, p = 0; a < n; a += block) {
            size_t m = n - a < block ? n - a : block;
            float mark = w[p];
            if (!(mark >= BS_MARK_BASE + BS_MIN_SHIFT && mark <= BS_MARK_BASE + BS_MAX_SHIFT) || mark != floorf(mark))
                abort();
            for (size_t i = 0; i < m; i++)
                if (mark != BS_MARK_BASE && !fz_finite(out[a + i]))
                    abort();
            p += 1 + m;
        }
    } else if (st != BS_E_LENGTH && at >= len) {
        abort();   /* a value check names a wire index it read */
    }
    free(w);
    free(out);
}

static void encode_case(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    int k = -1 - (int)(data[1] % 30);
    int headroom = (data[0] >> 1) % (BS_MAX_HEADROOM + 1);
    size_t block = (size_t)(data[1] >> 5) * 37 + 1;
    size_t n = (size - 2) / 4;
    float *x = fz_floats(n), *dec = fz_floats(n), *out = fz_floats(n);
    if (n)
        memcpy(x, data + 2, n * 4);
    size_t wn = bs_wire_values(n, block);
    float *w = fz_floats(wn), *rc = fz_floats(wn);
    if (bs_encode_h(x, n, block, k, headroom, w, wn, dec) != (ptrdiff_t)wn)
        abort();
    for (size_t a = 0, p = 0; a < n; a += block, p += 1 + block)
        if (w[p] != (float)(BS_MARK_BASE + bs_shift_h(x + a, n - a < block ? n - a : block, headroom)))
            abort();
    inc_reconstruct(w, wn, k, rc);
    for (size_t i = 0; i < wn; i++) {
        uint32_t a, b;
        memcpy(&a, &w[i], 4);
        memcpy(&b, &rc[i], 4);
        if (a != b && !(isnan(w[i]) && isnan(rc[i])))
            abort();
    }
    if (bs_decode(w, wn, out, n, block, NULL) != BS_OK)
        abort();
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &out[i], 4);
        memcpy(&b, &dec[i], 4);
        if (a != b && !(isnan(out[i]) && isnan(dec[i])))
            abort();
    }
    free(x), free(dec), free(out), free(w), free(rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_dispatch(data, size, decode_case, encode_case);
}
