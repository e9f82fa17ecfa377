/*
 * A newcomer's codec for tests/test_codec_table.py: float16, value by value. It is what a new C
 * codec takes: this one file and one line in codecs_c/codec_list.h (the test adds the line to a
 * copy of the list); Group, the DDP hook and the MPI library then run it.
 */
#include "codec_table.h"

#include <string.h>

enum { F16_E_SPACE = -1, F16_E_LENGTH = -2 };

static size_t f16_max_size(const struct re_codec *c, size_t n)
{
    (void)c;
    return 2 * n;
}

static ptrdiff_t f16_encode(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap)
{
    (void)c;
    if (cap < 2 * n)
        return F16_E_SPACE;
    for (size_t i = 0; i < n; i++) {
        _Float16 h = (_Float16)x[i];
        memcpy(out + 2 * i, &h, 2);
    }
    return (ptrdiff_t)(2 * n);
}

static int f16_decode(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n)
{
    (void)c;
    if (len != 2 * n)
        return F16_E_LENGTH;
    for (size_t i = 0; i < n; i++) {
        _Float16 h;
        memcpy(&h, in + 2 * i, 2);
        out[i] = (float)h;
    }
    return 0;
}

static void f16_reconstruct(const struct re_codec *c, const float *x, size_t n, float *out)
{
    (void)c;
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(_Float16)x[i] + 0.0f;
}

static const char *f16_strerror(int status)
{
    return status == F16_E_SPACE ? "output buffer too small" : status == F16_E_LENGTH ? "not 2 bytes per value" : "?";
}

static void f16_make(struct re_codec *c, void *state)
{
    (void)state;
    *c = (struct re_codec){.name = "f16", .max_encoded_size = f16_max_size, .encode = f16_encode,
                           .decode = f16_decode, .reconstruct = f16_reconstruct, .strerror = f16_strerror};
}

const struct re_codec_desc re_codec_f16_desc = {.name = "f16", .per_value = 1, .thread_safe = 1, .app = 1,
                                                .make = f16_make};
