/*
 * Shared helpers of the codecs' libFuzzer targets (codecs_c/fuzz/fuzz_*.c): exactly-sized heap
 * copies (so a read past a blob is caught by ASan), float buffers, the little-endian counts the
 * inputs carry, and the even/odd decode/encode dispatch most targets use.
 */
#ifndef INCEPTIONN_FUZZ_UTIL_H
#define INCEPTIONN_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A malloc'd copy of exactly len bytes (at least 1 byte allocated); the caller frees it. */
static inline uint8_t *fz_exact(const uint8_t *src, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (len)
        memcpy(p, src, len);
    return p;
}

/* A malloc'd buffer of n floats (at least 1 byte allocated). */
static inline float *fz_floats(size_t n)
{
    return malloc(n ? n * sizeof(float) : 1);
}

static inline int fz_finite(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x7F800000u) != 0x7F800000u;
}

/* Little-endian 16-bit count at p. */
static inline size_t fz_le16(const uint8_t *p)
{
    return (size_t)p[0] | ((size_t)p[1] << 8);
}

/* The value count for decoding a header + payload stream whose 32-bit count sits at bytes 8-11:
 * the stream's own count (capped at 65535) when bit 1 of mode is set and the header is there,
 * else mode >> 2. */
static inline size_t fz_stream_count(uint8_t mode, const uint8_t *stream, size_t len,
                                     size_t header_bytes)
{
    size_t n = mode >> 2;
    if ((mode & 2) && len >= header_bytes) {
        n = (size_t)stream[8] | ((size_t)stream[9] << 8) | ((size_t)stream[10] << 16) |
            ((size_t)stream[11] << 24);
        if (n > 65535)
            n = 65535;
    }
    return n;
}

/* Byte 0 picks the mode: odd encodes, even decodes; empty inputs are skipped. */
static inline int fz_dispatch(const uint8_t *data, size_t size,
                              void (*decode_case)(const uint8_t *, size_t),
                              void (*encode_case)(const uint8_t *, size_t))
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        encode_case(data, size);
    else
        decode_case(data, size);
    return 0;
}

#endif
