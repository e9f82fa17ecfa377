/*
 * INCEPTIONN gradient codec (MICRO 2018, Algorithms 2 and 3), as fixed by docs/spec.md section 1.
 *
 * Lossy, per float32 value, stateless. Values go in groups of 8 lanes (one 256-bit burst of the
 * paper's engine). A group is a little-endian uint16 tag word (lane i's 2-bit tag in bits
 * 2i+1..2i) followed by the lane payloads in lane order, little-endian:
 *
 *   tag 0  0BIT         nothing (decodes to +0.0)           |x| < 2^k
 *   tag 1  8BIT         1 byte:  s<<7  | floor(|x|*2^7)     2^k <= |x| < 2^(mid-127)
 *   tag 2  16BIT        2 bytes: s<<15 | floor(|x|*2^15)    2^(mid-127) <= |x| < 1
 *   tag 3  NO_COMPRESS  4 bytes: the float's bits           |x| >= 1, inf, NaN
 *
 * A stream of n values is ceil(n/8) groups back to back; lanes past n in the last group are 0BIT.
 * The decoder does not need k. Every decoder entry point checks every read against the input
 * length: this is the code that faces the network.
 */
#ifndef INCEPTIONN_CODEC_H
#define INCEPTIONN_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"
#include "inceptionn_contract.h"   /* the error-bound range and default */

#ifdef __cplusplus
extern "C" {
#endif

#define INC_LANES 8
#define INC_MAX_GROUP_BYTES 34 /* 2-byte tag word + 8 lanes x 4 bytes */
#define INC_MIN_ERROR_BOUND INCEPTIONN_ERROR_BOUND_MIN
#define INC_MAX_ERROR_BOUND INCEPTIONN_ERROR_BOUND_MAX

enum inc_tag { INC_0BIT = 0, INC_8BIT = 1, INC_16BIT = 2, INC_NO_COMPRESS = 3 };

enum inc_status {
    INC_OK = 0,
    INC_E_ARG = -1,       /* bad argument (error bound out of range, NULL buffer) */
    INC_E_SPACE = -2,     /* output buffer too small */
    INC_E_TRUNCATED = -3, /* input ends inside a group */
    INC_E_TRAILING = -4,  /* bytes left after the last group */
    INC_E_PADDING = -5,   /* a lane past n in the last group is not 0BIT */
};

enum inc_impl { INC_IMPL_AUTO = 0, INC_IMPL_SCALAR = 1, INC_IMPL_AVX2 = 2 };

/* Largest stream n values can encode to: ceil(n/8) * 34 bytes. */
size_t inc_max_encoded_size(size_t n);

/* 1 when this CPU runs the AVX2 path. */
int inc_have_avx2(void);

/*
 * Encode n floats with error bound 2^k (k in [-30, -1]) into out (capacity cap).
 * Returns the number of bytes written, or a negative inc_status. Any cap works: the SIMD path
 * only runs while a worst-case group still fits, so a small cap fails cleanly with INC_E_SPACE.
 */
ptrdiff_t inc_encode(const float *in, size_t n, int k, uint8_t *out, size_t cap, int impl);

/*
 * Decode a stream of exactly len bytes holding n values into out[0..n).
 * Returns INC_OK or a negative inc_status; on error *err_at (if not NULL) is the byte offset of
 * the group that failed. Never reads in[len] or beyond, never writes out[n] or beyond.
 */
int inc_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at, int impl);

/* Encoded size of n floats without writing them (same result as inc_encode's return value). */
size_t inc_encoded_size(const float *in, size_t n, int k);

/* Tier histogram: counts[tag] += number of values with that tag. */
void inc_histogram(const float *in, size_t n, int k, uint64_t counts[4]);

/* out[i] = what a receiver decodes for in[i] (decode(encode(in))[i]), except that every zero is
 * +0.0: idempotent, and no stream is built. in and out may be the same array. */
void inc_reconstruct(const float *in, size_t n, int k, float *out);

/* Tier histogram read from an encoded stream's tag words (no float pass): counts[tag] += lanes
 * with that tag among the first n. Same checks as inc_decode; returns INC_OK or a status. */
int inc_stream_histogram(const uint8_t *in, size_t len, size_t n, uint64_t counts[4]);

/* The same with the build chosen: INC_IMPL_SCALAR the portable one, INC_IMPL_AVX2 the one that
 * counts with the POPCNT instruction (every AVX2 CPU has it; INC_E_ARG if this CPU has not),
 * INC_IMPL_AUTO (what inc_stream_histogram does) POPCNT where the CPU has it. Same counts. */
int inc_stream_histogram_impl(const uint8_t *in, size_t len, size_t n, uint64_t counts[4], int impl);

const char *inc_strerror(int status);

/* In the ring (codec_table.h, re_codec_inceptionn): the codec at error bound k
 * (INC_MIN_ERROR_BOUND..INC_MAX_ERROR_BOUND), scaled; its state is the bound. */
struct re_inc {
    int error_bound;
};

void re_codec_inceptionn(struct re_codec *c, int k);

#ifdef __cplusplus
}
#endif
#endif
