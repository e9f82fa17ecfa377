/*
 * FFT sparsification with a range-based N-bit float (HPDC 2020), as fixed by docs/spec.md section 7.
 *
 * The caller supplies the real-to-complex spectrum X[0..K) of n float32 gradients zero-padded to
 * L = fft_length(n), the smallest 2^a 3^b 5^c >= n (a fast FFT size), K = L/2 + 1 bins,
 * interleaved re, im (the Python wrapper uses numpy.fft.rfft(x, L)). This library keeps the k
 * components of largest magnitude |X|^2 (ties: lower index first), records them in a bitmap,
 * quantizes the real and imaginary part of each kept component to the range-based float, packs
 * everything into one self-contained blob, and decodes such blobs back into a sparse spectrum,
 * checking every byte (this is the code that faces the network).
 *
 * Range-based N-bit float (docs/spec.md section 7, with our choices): a code is a sign bit (bit N-1)
 * and an (N-1)-bit magnitude code q. With m mantissa bits, the pattern of a float is
 * bits(|v|) >> (23 - m) (its exponent and top m mantissa bits), pbase = pattern(eps):
 *   encode: q = 0 if pattern(|v|) < pbase, else min(pattern(|v|) - pbase + 1, 2^(N-1) - 1)
 *   decode: q = 0 -> a zero with the sign; else bits = sign | (pbase + q - 1) << (23 - m)
 * The encoder picks, per blob, pbase so that the top code is the truncated pattern of the
 * largest kept |re| or |im| (pbase >= 1), and m in [0, min(23, N-1)] minimising the squared
 * error of the kept values (ties: smaller m); an m is usable only when the 2^(N-1) - 1
 * magnitude codes fit below float's exponent 255 (2^(N-1) - 1 < 255 * 2^m). Error bound for
 * normal floats: |v - Q(v)| < eps when |v| < eps, |v - Q(v)| < 2^-m |v| for eps <= |v| <= max
 * (truncation, as in the paper).
 *
 * Wire format (little-endian):
 *   off  size  field
 *   0    1     magic 0x46 ('F')
 *   1    1     version 1
 *   2    1     N, bits per code, 2..16
 *   3    1     m, mantissa bits, 0..23
 *   4    4     eps, f32: the smallest nonzero magnitude; finite, > 0, its low 23-m bits 0, and
 *              the top code's pattern pbase + 2^(N-1) - 2 has exponent < 255
 *   8    4     n, u32: the number of gradient values, <= 2^31 (must equal the decoder's n)
 *   12   4     k, u32: kept components, k <= K = fft_length(n)/2 + 1 (K = 0 when n = 0)
 *   16   ceil(K/8)  bitmap, bit i (LSB first) = component i kept; popcount k; unused bits 0
 *   ...  ceil(2kN/8) codes, N bits each LSB first: re then im of each kept component in index
 *              order; unused bits of the last byte 0
 */
#ifndef FFT_CODEC_H
#define FFT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FFT_MAGIC 0x46
#define FFT_VERSION 1
#define FFT_HEADER_BYTES 16
#define FFT_MIN_BITS 2
#define FFT_MAX_BITS 16
#define FFT_MAX_MANTISSA 23
#define FFT_AUTO_MANTISSA (-1)
#define FFT_MAX_N 2147483648u

enum fft_status {
    FFT_OK = 0,
    FFT_E_ARG = -1,       /* bad argument (bits, mantissa, k > K, NULL buffer) */
    FFT_E_SPACE = -2,     /* output buffer too small */
    FFT_E_TRUNCATED = -3, /* blob shorter than its header says */
    FFT_E_TRAILING = -4,  /* bytes after the codes */
    FFT_E_HEADER = -5,    /* bad magic, version, N or m */
    FFT_E_COUNT = -6,     /* n differs from the decoder's, or k > K */
    FFT_E_BITMAP = -7,    /* popcount != k, or bits set past K */
    FFT_E_VALUE = -8,     /* nonzero padding bits after the codes */
    FFT_E_RANGE = -9,     /* eps not canonical, not > 0, or the top code not finite */
    FFT_E_NONFINITE = -10,/* a non-finite spectrum value */
    FFT_E_NOMEM = -11     /* scratch allocation failed */
};

struct fft_info {
    int bits;
    int mantissa;
    float eps;
    uint32_t pbase;
    uint32_t n;
    uint32_t k;
    size_t bins;
    size_t length;
};

/* L = the smallest 2^a 3^b 5^c >= n (0 for n = 0 or n > 2^31): the padded FFT length. */
size_t fft_length(size_t n);

/* K = L/2 + 1 for n >= 1, 0 for n = 0. */
size_t fft_bins(size_t n);

/* Blob bytes for n values, k kept components, N-bit codes (0 if out of range). */
size_t fft_encoded_size(size_t n, size_t k, int bits);

/*
 * Encode the spectrum spec[0..2K) (re, im interleaved) of n values, keeping k components, with
 * N = bits and m = mantissa (or FFT_AUTO_MANTISSA). Returns the bytes written
 * (fft_encoded_size(n, k, bits)) or a status. Allocates O(K) scratch.
 */
ptrdiff_t fft_encode(const float *spec, size_t n, size_t k, int bits, int mantissa, uint8_t *out, size_t cap);

/* Check a blob's header and length (not the bitmap or codes). */
int fft_inspect(const uint8_t *in, size_t len, struct fft_info *info);

/* Decode a blob of n values into spec[0..2K): the kept components, zeros elsewhere. Checks the
 * whole blob before writing spec. On error *err_at (if not NULL) is the byte offset at fault. */
int fft_decode(const uint8_t *in, size_t len, size_t n, float *spec, size_t *err_at);

/* The range-based float on its own: pbase for a largest magnitude (0 if none is valid), and the
 * quantization of count values to codes and back. */
uint32_t fft_rf_pbase(float max_abs, int bits, int mantissa);
int fft_rf_quantize(const float *in, size_t count, int bits, int mantissa, uint32_t pbase, uint16_t *codes);
int fft_rf_dequantize(const uint16_t *codes, size_t count, int bits, int mantissa, uint32_t pbase, float *out);

const char *fft_strerror(int status);

#ifdef __cplusplus
}
#endif
#endif
