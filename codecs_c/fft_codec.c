/*
 * FFT sparsification + range-based float: top-k selection by radix select, bitmap, N-bit range
 * float, bit packing and the checked decoder. The transform itself is numpy's (see fft.py).
 */
#include "fft_codec.h"
#include "codec_util.h"

#include <stdlib.h>
#include <string.h>

const char *fft_strerror(int status)
{
    switch (status) {
    case FFT_OK: return "ok";
    case FFT_E_ARG: return "bad argument";
    case FFT_E_SPACE: return "output buffer too small";
    case FFT_E_TRUNCATED: return "blob shorter than its header says";
    case FFT_E_TRAILING: return "bytes left after the codes";
    case FFT_E_HEADER: return "bad header (magic, version, bits or mantissa)";
    case FFT_E_COUNT: return "value count differs, or more kept components than bins";
    case FFT_E_BITMAP: return "bitmap popcount differs from k, or bits set past the last bin";
    case FFT_E_VALUE: return "nonzero padding bits after the codes";
    case FFT_E_RANGE: return "bad range (eps not canonical or not positive, top code not finite)";
    case FFT_E_NONFINITE: return "non-finite spectrum value";
    case FFT_E_NOMEM: return "out of memory";
    default: return "unknown error";
    }
}

size_t fft_length(size_t n)
{
    if (n == 0 || n > FFT_MAX_N)
        return 0;
    uint64_t best = (uint64_t)1 << 32; /* 2^32 >= every n <= 2^31: always beaten or kept */
    for (uint64_t a = 1; a < best; a *= 2)
        for (uint64_t b = a; b < best; b *= 3)
            for (uint64_t c = b; c < best; c *= 5)
                if (c >= n) {
                    best = c;
                    break;
                }
    return (size_t)best;
}

size_t fft_bins(size_t n)
{
    size_t L = fft_length(n);
    return L ? L / 2 + 1 : 0;
}

size_t fft_encoded_size(size_t n, size_t k, int bits)
{
    size_t K = fft_bins(n);
    if (n > FFT_MAX_N || k > K || bits < FFT_MIN_BITS || bits > FFT_MAX_BITS)
        return 0;
    return FFT_HEADER_BYTES + (K + 7) / 8 + bits_to_bytes(2 * k, (size_t)bits);
}

static inline uint64_t d2u(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

/* --- range-based float ------------------------------------------------------------------------ */

static inline int rf_params_ok(int bits, int m)
{
    return bits >= FFT_MIN_BITS && bits <= FFT_MAX_BITS && m >= 0 && m <= FFT_MAX_MANTISSA;
}

/* The top pattern pbase + qmax - 1 must stay below exponent 255 (inf/NaN). */
static inline int rf_pbase_ok(uint32_t pbase, int bits, int m)
{
    uint32_t qmax = (1u << (bits - 1)) - 1;
    return pbase >= 1 && (uint64_t)pbase + qmax - 1 < ((uint64_t)255 << m);
}

uint32_t fft_rf_pbase(float max_abs, int bits, int m)
{
    if (!rf_params_ok(bits, m) || nonfinite(max_abs))
        return 0;
    uint32_t qmax = (1u << (bits - 1)) - 1;
    uint32_t top = (f2u(max_abs) & 0x7FFFFFFFu) >> (23 - m);
    uint32_t pbase = top > qmax - 1 ? top - (qmax - 1) : 1;
    return rf_pbase_ok(pbase, bits, m) ? pbase : 0;
}

static inline uint32_t rf_code(float v, int bits, int m, uint32_t pbase)
{
    uint32_t u = f2u(v);
    uint32_t qmax = (1u << (bits - 1)) - 1;
    uint32_t pattern = (u & 0x7FFFFFFFu) >> (23 - m);
    uint32_t q = pattern < pbase ? 0 : pattern - pbase + 1;
    if (q > qmax)
        q = qmax; /* clamp at the range */
    return ((u >> 31) << (bits - 1)) | q;
}

static inline float rf_value(uint32_t code, int bits, int m, uint32_t pbase)
{
    uint32_t sign = (code >> (bits - 1)) & 1;
    uint32_t q = code & ((1u << (bits - 1)) - 1);
    uint32_t mag = q == 0 ? 0 : (pbase + q - 1) << (23 - m);
    return u2f((sign << 31) | mag);
}

int fft_rf_quantize(const float *in, size_t count, int bits, int m, uint32_t pbase, uint16_t *codes)
{
    if (!rf_params_ok(bits, m) || !rf_pbase_ok(pbase, bits, m) || (count && (!in || !codes)))
        return FFT_E_ARG;
    for (size_t i = 0; i < count; i++) {
        if (nonfinite(in[i]))
            return FFT_E_NONFINITE;
        codes[i] = (uint16_t)rf_code(in[i], bits, m, pbase);
    }
    return FFT_OK;
}

int fft_rf_dequantize(const uint16_t *codes, size_t count, int bits, int m, uint32_t pbase, float *out)
{
    if (!rf_params_ok(bits, m) || !rf_pbase_ok(pbase, bits, m) || (count && (!codes || !out)))
        return FFT_E_ARG;
    for (size_t i = 0; i < count; i++) {
        if (codes[i] >> bits)
            return FFT_E_ARG;
        out[i] = rf_value(codes[i], bits, m, pbase);
    }
    return FFT_OK;
}

/* --- selection --------------------------------------------------------------------------------- */

/* The k-th largest key (k >= 1) by MSB-first radix select; *ties_out = how many keys equal to it
 * are kept (the lowest indices), so that count(key > t) + ties = k. */
static uint64_t radix_select(uint64_t *key, size_t K, size_t k, size_t *ties_out)
{
    uint64_t prefix = 0, mask = 0;
    size_t remaining = k;
    size_t hist[256];
    for (int shift = 56; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (size_t i = 0; i < K; i++)
            if ((key[i] & mask) == prefix)
                hist[(key[i] >> shift) & 0xFF]++;
        int dgt = 255;
        for (; dgt > 0; dgt--) {
            if (hist[dgt] >= remaining)
                break;
            remaining -= hist[dgt];
        }
        prefix |= (uint64_t)dgt << shift;
        mask |= (uint64_t)0xFF << shift;
    }
    *ties_out = remaining;
    return prefix;
}

/* Squared error of quantizing vals[0..count) with (m, pbase), summed left to right in double. */
static double rf_sse(const float *vals, size_t count, int bits, int m, uint32_t pbase)
{
    double s = 0.0;
    for (size_t i = 0; i < count; i++) {
        double e = (double)vals[i] - (double)rf_value(rf_code(vals[i], bits, m, pbase), bits, m, pbase);
        s += e * e;
    }
    return s;
}

ptrdiff_t fft_encode(const float *spec, size_t n, size_t k, int bits, int mantissa, uint8_t *out, size_t cap)
{
    size_t K = fft_bins(n);
    if ((K > 0 && spec == NULL) || out == NULL || n > FFT_MAX_N || k > K || bits < FFT_MIN_BITS ||
        bits > FFT_MAX_BITS || mantissa < FFT_AUTO_MANTISSA || mantissa > FFT_MAX_MANTISSA)
        return FFT_E_ARG;
    size_t need = fft_encoded_size(n, k, bits);
    if (cap < need)
        return FFT_E_SPACE;
    for (size_t i = 0; i < 2 * K; i++)
        if (nonfinite(spec[i]))
            return FFT_E_NONFINITE;

    uint8_t *bitmap = out + FFT_HEADER_BYTES;
    size_t bitmap_bytes = (K + 7) / 8;
    if (bitmap_bytes)
        memset(bitmap, 0, bitmap_bytes);
    float *kept = malloc(2 * k * sizeof(float) + 1);
    if (kept == NULL)
        return FFT_E_NOMEM;
    if (k == 0) {
        /* nothing kept: an empty bitmap and no codes */
    } else if (k == K) {
        for (size_t i = 0; i < K; i++)
            bitmap[i / 8] |= (uint8_t)(1u << (i % 8));
        memcpy(kept, spec, 2 * K * sizeof(float));
    } else {
        uint64_t *key = malloc(K * sizeof(uint64_t));
        if (key == NULL) {
            free(kept);
            return FFT_E_NOMEM;
        }
        for (size_t i = 0; i < K; i++) {
            double re = spec[2 * i], im = spec[2 * i + 1];
            key[i] = d2u(re * re + im * im); /* >= 0: bit order is numeric order */
        }
        size_t ties;
        uint64_t t = radix_select(key, K, k, &ties);
        size_t j = 0;
        for (size_t i = 0; i < K; i++) {
            if (key[i] > t || (key[i] == t && ties > 0 && (ties--, 1))) {
                bitmap[i / 8] |= (uint8_t)(1u << (i % 8));
                kept[2 * j] = spec[2 * i];
                kept[2 * j + 1] = spec[2 * i + 1];
                j++;
            }
        }
        free(key);
    }

    /* Range: the largest kept |re| or |im|; mantissa bits: least squared error. */
    float max_abs = 0.0f;
    for (size_t i = 0; i < 2 * k; i++) {
        float a = u2f(f2u(kept[i]) & 0x7FFFFFFFu);
        if (a > max_abs)
            max_abs = a;
    }
    int m = mantissa;
    if (m == FFT_AUTO_MANTISSA) {
        int m_hi = bits - 1 < FFT_MAX_MANTISSA ? bits - 1 : FFT_MAX_MANTISSA;
        double best = 0;
        for (int c = 0; c <= m_hi; c++) {
            uint32_t pb = fft_rf_pbase(max_abs, bits, c);
            if (pb == 0)
                continue;
            double e = rf_sse(kept, 2 * k, bits, c, pb);
            if (m < 0 || e < best) {
                best = e;
                m = c;
            }
        }
    }
    uint32_t pbase = m >= 0 ? fft_rf_pbase(max_abs, bits, m) : 0;
    if (pbase == 0) {
        free(kept);
        return FFT_E_ARG; /* no valid range for this m (cannot happen for m <= 7 with finite input) */
    }

    out[0] = FFT_MAGIC;
    out[1] = FFT_VERSION;
    out[2] = (uint8_t)bits;
    out[3] = (uint8_t)m;
    uint32_t eps = pbase << (23 - m);
    uint32_t nn = (uint32_t)n, kk = (uint32_t)k;
    for (int i = 0; i < 4; i++) {
        out[4 + i] = (uint8_t)(eps >> (8 * i));
        out[8 + i] = (uint8_t)(nn >> (8 * i));
        out[12 + i] = (uint8_t)(kk >> (8 * i));
    }
    struct packer p = {out, FFT_HEADER_BYTES + bitmap_bytes, 0, 0};
    for (size_t i = 0; i < 2 * k; i++)
        pack(&p, rf_code(kept[i], bits, m, pbase), (unsigned)bits);
    pack_flush(&p);
    free(kept);
    return (ptrdiff_t)p.pos;
}

int fft_inspect(const uint8_t *in, size_t len, struct fft_info *info)
{
    if ((len > 0 && in == NULL) || info == NULL)
        return FFT_E_ARG;
    memset(info, 0, sizeof *info);
    if ((len >= 1 && in[0] != FFT_MAGIC) || (len >= 2 && in[1] != FFT_VERSION))
        return FFT_E_HEADER;
    if (len < FFT_HEADER_BYTES)
        return FFT_E_TRUNCATED;
    int bits = in[2], m = in[3];
    if (!rf_params_ok(bits, m))
        return FFT_E_HEADER;
    uint32_t eps = get_u32(in + 4);
    uint32_t pbase = eps >> (23 - m);
    if ((eps >> 31) != 0 || (pbase << (23 - m)) != eps || !rf_pbase_ok(pbase, bits, m))
        return FFT_E_RANGE;
    uint32_t n = get_u32(in + 8), k = get_u32(in + 12);
    size_t K = fft_bins(n);
    if (n > FFT_MAX_N || k > K)
        return FFT_E_COUNT;
    size_t total = FFT_HEADER_BYTES + (K + 7) / 8 + bits_to_bytes(2 * (size_t)k, (size_t)bits);
    if (len < total)
        return FFT_E_TRUNCATED;
    if (len > total)
        return FFT_E_TRAILING;
    info->bits = bits;
    info->mantissa = m;
    info->eps = u2f(eps);
    info->pbase = pbase;
    info->n = n;
    info->k = k;
    info->bins = K;
    info->length = total;
    return FFT_OK;
}

static size_t fault_offset(int status, size_t len)
{
    switch (status) {
    case FFT_E_TRUNCATED:
    case FFT_E_TRAILING: return len;
    case FFT_E_RANGE: return 4;
    case FFT_E_COUNT: return 8;
    default: return 0;
    }
}

int fft_decode(const uint8_t *in, size_t len, size_t n, float *spec, size_t *err_at)
{
    if (err_at)
        *err_at = 0;
    size_t K = fft_bins(n);
    if ((len > 0 && in == NULL) || (K > 0 && spec == NULL))
        return FFT_E_ARG;
    struct fft_info info;
    int r = fft_inspect(in, len, &info);
    if (r == FFT_OK && info.n != n)
        r = FFT_E_COUNT;
    if (r != FFT_OK) {
        if (err_at)
            *err_at = fault_offset(r, len);
        if (r == FFT_E_HEADER && err_at)
            *err_at = in[0] != FFT_MAGIC ? 0 : (in[1] != FFT_VERSION ? 1 : 2);
        return r;
    }
    const uint8_t *bitmap = in + FFT_HEADER_BYTES;
    size_t bitmap_bytes = (K + 7) / 8;
    size_t pop = 0;
    for (size_t i = 0; i < bitmap_bytes; i++)
        pop += (size_t)__builtin_popcount(bitmap[i]);
    if (K % 8 != 0 && (bitmap[bitmap_bytes - 1] >> (K % 8)) != 0) {
        if (err_at)
            *err_at = FFT_HEADER_BYTES + bitmap_bytes - 1;
        return FFT_E_BITMAP;
    }
    if (pop != info.k) {
        if (err_at)
            *err_at = FFT_HEADER_BYTES;
        return FFT_E_BITMAP;
    }
    size_t w = (size_t)info.bits;
    size_t code_bits = 2 * (size_t)info.k * w;
    if (code_bits % 8 != 0 && (in[len - 1] >> (code_bits % 8)) != 0) {
        if (err_at)
            *err_at = len - 1;
        return FFT_E_VALUE;
    }

    if (K > 0)
        memset(spec, 0, 2 * K * sizeof(float));
    const uint8_t *codes = bitmap + bitmap_bytes;
    size_t pos = 0;
    uint64_t acc = 0;
    unsigned nbits = 0;
    uint32_t mask = (1u << w) - 1;
    for (size_t byte = 0; byte < bitmap_bytes; byte++) {
        unsigned bm = bitmap[byte];
        while (bm) {
            size_t i = byte * 8 + (size_t)__builtin_ctz(bm);
            bm &= bm - 1;
            for (int part = 0; part < 2; part++) {
                while (nbits < w) { /* 2k*N bits are in the blob: checked by fft_inspect */
                    acc |= (uint64_t)codes[pos++] << nbits;
                    nbits += 8;
                }
                spec[2 * i + part] = rf_value((uint32_t)acc & mask, info.bits, info.mantissa, info.pbase);
                acc >>= w;
                nbits -= (unsigned)w;
            }
        }
    }
    return FFT_OK;
}

/* --- in the ring (codec_table.h) --------------------------------------------------------------- */

/* a whole tensor per encode (its spectrum), error feedback off by default; no ring codec in C (the
 * transform is numpy's, fft.py): the engine calls its Python methods, the MPI library refuses it */
const struct re_codec_desc re_codec_fft_desc = {.name = "fft"};
