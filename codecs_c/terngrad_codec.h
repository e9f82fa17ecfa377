/*
 * TernGrad (NIPS 2017) ternary gradients, as fixed by docs/spec.md section 4: gradient clipping at
 * c*sigma, a per-tensor scaler, stochastic ternarization, and two packings.
 *
 * Encoding n floats g with clip factor c (c <= 0: no clipping) and scaler S:
 *   sigma = sqrt(sum(g^2)/n - (sum(g)/n)^2) in double (population standard deviation; the sums
 *           run over 8 interleaved lanes, lane j taking the g_i with i % 8 == j, combined as
 *           ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); a negative difference counts as 0)
 *   bound = (float)(c * sigma), or +infinity without clipping
 *   a_i   = min(|g_i|, bound)                          (the clipped magnitude)
 *   s     = max_i a_i                                  (this tensor's scaler, tg_scaler)
 *   S     = max(s, the scaler agreed among workers) (agreed: S = s everywhere it is the max)
 *   t_i   = sign(g_i) if u_i * S < a_i * 2^29 else 0   (exact in double; u_i uniform 29-bit)
 * so P(t_i != 0) = ceil(2^29 a_i / S) / 2^29: E[S t_i] = clip(g_i) up to 2^-29 S.
 *
 * Random bits: counter-based splitmix64. Draw k of seed z is mix(z + (k+1) * 0x9E3779B97F4A7C15)
 * with mix(x) = splitmix64's finalizer; an encode starting at draw k0 gives element i the 29 bits
 * at bit 32*(i%2) of draw k0 + i/2, and uses ceil(n/2) draws (tg_draws).
 *
 * Stream (all integers little-endian), self-contained:
 *   byte 0      magic 0x54 ('T')
 *   byte 1      version 1
 *   byte 2      packing: 0 = 2-bit, 1 = base-3
 *   byte 3      0 (reserved)
 *   bytes 4-7   S as IEEE-754 float32: finite, sign bit clear
 *   bytes 8-11  n, the value count (uint32)
 *   bytes 12-   2-bit: ceil(n/4) bytes, value i in bits 2(i%4)+1..2(i%4) of byte i/4 as the
 *               2-bit two's complement of t_i (00 = 0, 01 = +1, 11 = -1; 10 is invalid), unused
 *               fields of the last byte 00.
 *               base-3: ceil(n/5) bytes 81a+27b+9c+3d+e of five consecutive digits t_i+1 (3LC's
 *               base-3^5 packing), tail padded with digit 0.
 * A value decodes to S * t_i (+0.0 for t_i = 0). The decoder refuses a short or long stream, a
 * bad header byte, a NaN/inf/negative S, a count other than n, code 10 or a byte above 242, and
 * non-zero padding.
 */
#ifndef TERNGRAD_CODEC_H
#define TERNGRAD_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TG_MAGIC 0x54
#define TG_VERSION 1
#define TG_HEADER_BYTES 12
#define TG_MAX_COUNT 0xFFFFFFFFu /* n travels as a uint32 */
#define TG_RANDOM_BITS 29

enum tg_packing { TG_PACK_2BIT = 0, TG_PACK_BASE3 = 1 };

enum tg_status {
    TG_OK = 0,
    TG_E_ARG = -1,        /* bad argument: packing, clip or scaler not finite, n too large, NULL */
    TG_E_SPACE = -2,      /* output buffer smaller than tg_encoded_size(n, packing) */
    TG_E_TRUNCATED = -3,  /* stream shorter than its header and payload */
    TG_E_TRAILING = -4,   /* stream longer than its header and payload */
    TG_E_PADDING = -5,    /* non-zero padding in the last byte */
    TG_E_HEADER = -6,     /* bad magic, version, packing or reserved byte */
    TG_E_COUNT = -7,      /* the stream's count is not n */
    TG_E_SCALER = -8,     /* S is NaN, infinite or negative */
    TG_E_CODE = -9,       /* 2-bit code 10, or a base-3 byte above 242 */
    TG_E_NONFINITE = -10, /* encode: the input holds NaN or infinity */
};

/* Exact stream length for n values (SIZE_MAX for a bad packing or n > TG_MAX_COUNT). */
size_t tg_encoded_size(size_t n, int packing);

/* Random draws one encode of n values uses: ceil(n/2). */
uint64_t tg_draws(size_t n);

/*
 * This tensor's scaler s = max min(|g_i|, bound) and the clip bound (+inf when clip <= 0).
 * TG_OK, TG_E_ARG or TG_E_NONFINITE. This is what a worker contributes to scaler sharing.
 */
int tg_scaler(const float *in, size_t n, double clip, float *scaler, float *bound);

/*
 * Ternarize and pack n floats. shared is the scaler agreed among workers (finite, else TG_E_ARG)
 * and acts as a floor: S = max(own scaler, shared); a shared with its sign bit set means no
 * agreement. Random bits from draw `draw` of `seed` on (the caller advances draw by
 * tg_draws(n) per call). cap must be at least tg_encoded_size(n, packing). Returns the stream
 * length or a negative tg_status.
 */
ptrdiff_t tg_encode(const float *in, size_t n, double clip, float shared, int packing,
                    uint64_t seed, uint64_t draw, uint8_t *out, size_t cap);

/*
 * Decode a stream of exactly len bytes holding n values into out[0..n). Returns TG_OK or a
 * negative tg_status; on error *err_at (if not NULL) is the offset of the offending byte.
 * Never reads in[len] or beyond, never writes out[n] or beyond.
 */
int tg_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at);

/* Use the AVX2 kernels when the CPU has them (enable = 1, the default) or the baseline ones only
 * (0); -1 just asks. Returns the previous setting. Process-wide, for tests and benchmarks: both
 * give the same bytes. */
int tg_simd(int enable);

/* count draws of the generator from draw `draw` of `seed` (for tests and the numpy reference). */
void tg_random(uint64_t seed, uint64_t draw, size_t count, uint64_t *out);

const char *tg_strerror(int status);

/* TernGrad in the ring (codec_table.h): clip, the agreed scaler (negative: none), packing, and the
 * random stream's seed and position, which every encode advances by tg_draws(n) (the caller reads
 * draw back after the call). */
struct re_tg {
    double clip;
    float shared;
    int packing;
    uint64_t seed, draw;
};

void re_codec_terngrad(struct re_codec *c, void *state);   /* state: a struct re_tg */

#ifdef __cplusplus
}
#endif
#endif
