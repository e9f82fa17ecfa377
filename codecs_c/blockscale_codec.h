/*
 * Per-block power-of-two scaling for the compressed ring (docs/collectives.md, "Wire format v2").
 *
 * The INCEPTIONN codec keeps absolute precision (values below 2^k become 0), so the ring scales
 * what it sends: values go in blocks of `block` (the last one may be shorter), and each block is
 * sent as one exponent float followed by its values times 2^s, through inc_reconstruct:
 *
 *   wire = [BS_MARK_BASE + s] [q_0 .. q_{m-1}]   q_i = the value nearest x_i * 2^s that the
 *                                                 codec represents (inc_reconstruct truncates
 *                                                 toward zero; the nearest is unbiased)
 *
 * s = -e where the block's max |x| = f * 2^e, f in [0.5, 1) (frexpf, never log2: every host
 * must get the same s), so the scaled block's max lies in [0.5, 1); s = 0 for a block that is all
 * zero or holds an inf or NaN; s is clamped to [BS_MIN_SHIFT, BS_MAX_SHIFT] so that 2^s and 2^-s
 * are normal floats. The exponent float (898..1150, an integer >= 1.0) and every q_i are fixed
 * points of inc_reconstruct, so a soft NIC running the codec delivers the wire floats unchanged
 * whether it compressed them or not. A receiver gets x'_i = q_i * 2^-s (float32 multiply).
 *
 * Capacity: n values take bs_wire_values(n, block) = n + ceil(n / block) floats. Bounds: block in
 * [1, BS_MAX_BLOCK], k in [INC_MIN_ERROR_BOUND, INC_MAX_ERROR_BOUND]. bs_decode never reads
 * wire[len] or beyond, never writes out[n] or beyond, and refuses anything the encoder cannot
 * produce (wrong length, an exponent float that is not an integer in range, a value that is not
 * finite or not below 1.0 in a block with s != 0 and s != BS_MIN_SHIFT).
 */
#ifndef BLOCKSCALE_CODEC_H
#define BLOCKSCALE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "inceptionn_contract.h"   /* the headroom's range */

#ifdef __cplusplus
extern "C" {
#endif

#define BS_BLOCK_VALUES 256     /* the ring's block (measured in docs/collectives.md) */
#define BS_MAX_BLOCK 65536
#define BS_MARK_BASE 1024
#define BS_MIN_SHIFT (-126)
#define BS_MAX_SHIFT 126
#define BS_HEADROOM 0           /* the ring's headroom h (measured in docs/collectives.md) */
#define BS_MAX_HEADROOM INCEPTIONN_MAX_HEADROOM

enum bs_status {
    BS_OK = 0,
    BS_E_ARG = -1,      /* bad argument (block or k out of range, NULL buffer) */
    BS_E_LENGTH = -2,   /* the wire holds a different number of floats than n values take */
    BS_E_EXPONENT = -3, /* an exponent float that is not an integer in BS_MARK_BASE + [MIN, MAX] */
    BS_E_VALUE = -4,    /* a value the encoder cannot produce for that exponent */
};

/* Floats the wire of n values takes: n + ceil(n / block) (0 if block is out of range). */
size_t bs_wire_values(size_t n, size_t block);

/* The exponent s of one block (see above). */
int bs_shift(const float *x, size_t m);
/* ... with headroom h in [0, BS_MAX_HEADROOM] instead of BS_HEADROOM: s = -e - h (then clamped),
 * so the scaled block's max lies in [2^(-1-h), 2^-h). */
int bs_shift_h(const float *x, size_t m, int headroom);

/*
 * x[0..n) -> wire[0..bs_wire_values(n, block)) (cap floats available). decoded, if not NULL,
 * gets x'[0..n): what a receiver decodes (it may be x itself, after the wire is written).
 * Returns the number of wire floats, or a negative bs_status.
 */
ptrdiff_t bs_encode(const float *x, size_t n, size_t block, int k, float *wire, size_t cap, float *decoded);

/* bs_encode with headroom h instead of BS_HEADROOM (BS_E_ARG outside [0, BS_MAX_HEADROOM]): the
 * decoder needs no h, the exponent float carries s. */
ptrdiff_t bs_encode_h(const float *x, size_t n, size_t block, int k, int headroom, float *wire, size_t cap,
                      float *decoded);

/* wire[0..len) -> out[0..n). BS_OK or a negative bs_status; *err_at (if not NULL) is the wire
 * index where the check failed. */
int bs_decode(const float *wire, size_t len, float *out, size_t n, size_t block, size_t *err_at);

const char *bs_strerror(int status);

#ifdef __cplusplus
}
#endif
#endif
