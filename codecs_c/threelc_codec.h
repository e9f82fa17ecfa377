/*
 * 3LC (SysML 2019) tensor compression, as fixed by docs/spec.md section 5: 3-value quantization with a
 * sparsity multiplier, base-3^5 packing and zero-run encoding (ZRE). The error-accumulation
 * buffer is the caller's (inceptionn.codecs.memory.ErrorFeedback): this library quantizes what
 * it is given and can hand back the dequantized values M*Q the receiver will see.
 *
 * Quantization of A (n floats): M = s * max|A| (float32 product), Q_i = round(A_i / M) in
 * {-1,0,1}, evaluated exactly as Q_i = sign(A_i) if 2|A_i| > M else 0 (a tie |A_i| = M/2 rounds
 * to 0, half to even). M = 0 (all zeros) gives Q = 0.
 *
 * Stream (all integers little-endian), self-contained:
 *   byte 0      magic 0x33 ('3')
 *   byte 1      version 1
 *   byte 2      flags: bit 0 = zero-run encoded; the other bits 0
 *   byte 3      0 (reserved)
 *   bytes 4-7   M as IEEE-754 float32: finite, sign bit clear
 *   bytes 8-11  n, the value count (uint32)
 *   bytes 12-   payload: B = ceil(n/5) base-3^5 bytes 81a+27b+9c+3d+e of five consecutive
 *               digits Q+1 (tail padded with digit 0, i.e. Q = -1); with ZRE each run of k bytes
 *               equal to 121 (2 <= k <= 14, longer runs split greedily: 14, 14, ..., rest) is the
 *               one byte 243 + (k-2).
 * The decoder checks every read against len and refuses: a short header, a bad magic, version,
 * flag or reserved byte, a NaN/inf/negative M, a count other than n, a byte above 242 without
 * ZRE, a zero run past the B-th byte, padding digits other than 0, bytes missing or left over.
 */
#ifndef THREELC_CODEC_H
#define THREELC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TLC_MAGIC 0x33
#define TLC_VERSION 1
#define TLC_HEADER_BYTES 12
#define TLC_FLAG_ZRE 1
#define TLC_MAX_COUNT 0xFFFFFFFFu /* n travels as a uint32 */
#define TLC_MAX_RUN 14            /* longest zero run one byte holds (byte 255) */

enum tlc_status {
    TLC_OK = 0,
    TLC_E_ARG = -1,        /* bad argument: sparsity outside [1, 2), n too large, NULL buffer */
    TLC_E_SPACE = -2,      /* output buffer smaller than tlc_max_encoded_size(n) */
    TLC_E_TRUNCATED = -3,  /* stream ends before the header or before n values */
    TLC_E_TRAILING = -4,   /* bytes left after the n-th value */
    TLC_E_PADDING = -5,    /* a padding digit of the last byte is not 0 */
    TLC_E_HEADER = -6,     /* bad magic, version, flags or reserved byte */
    TLC_E_COUNT = -7,      /* the stream's count is not n */
    TLC_E_SCALER = -8,     /* M is NaN, infinite or negative */
    TLC_E_CODE = -9,       /* a byte above 242 in a stream without ZRE */
    TLC_E_OVERFLOW = -10,  /* a zero run goes past the last value */
    TLC_E_NONFINITE = -11, /* encode: the input holds NaN or infinity */
    TLC_E_RANGE = -12,     /* encode: s * max|A| overflows float32 */
};

/* Largest stream for n values: header + ceil(n/5) (SIZE_MAX when n > TLC_MAX_COUNT). */
size_t tlc_max_encoded_size(size_t n);

/*
 * Quantize and pack n floats with sparsity multiplier s (1 <= s < 2); zre != 0 turns zero-run
 * encoding on. cap must be at least tlc_max_encoded_size(n). When recon is not NULL it receives
 * the n values the receiver will decode (M*Q, bit for bit), so error feedback needs no decode.
 * Returns the stream length or a negative tlc_status.
 */
ptrdiff_t tlc_encode(const float *in, size_t n, float s, int zre, uint8_t *out, size_t cap,
                     float *recon);

/*
 * Decode a stream of exactly len bytes holding n values into out[0..n). Returns TLC_OK or a
 * negative tlc_status; on error *err_at (if not NULL) is the offset of the offending byte.
 * Never reads in[len] or beyond, never writes out[n] or beyond.
 */
int tlc_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at);

/* M = s * max|in| as tlc_encode computes it (TLC_OK, TLC_E_ARG, TLC_E_NONFINITE, TLC_E_RANGE). */
int tlc_scaler(const float *in, size_t n, float s, float *m);

/* Use the AVX2 kernels when the CPU has them (enable = 1, the default) or the baseline ones only
 * (0); -1 just asks. Returns the previous setting. Process-wide, for tests and benchmarks: both
 * give the same bytes. */
int tlc_simd(int enable);

const char *tlc_strerror(int status);

/* 3LC in the ring (codec_table.h) with sparsity multiplier s and zero-run encoding on or off:
 * stateless, the same stream as threelc.py's C path. */
struct re_tlc {
    float sparsity;
    int zre;
};

void re_codec_threelc(struct re_codec *c, void *state);   /* state: a struct re_tlc */

#ifdef __cplusplus
}
#endif
#endif
