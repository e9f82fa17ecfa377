/*
 * 3LC codec (docs/spec.md section 5): portable C, every decoder read checked against the input length.
 * The numpy reference (threelc_reference.py) must agree bit for bit; the tests hold them so.
 */
#include "threelc_codec.h"
#include "codec_util.h"
#include "threelc_base3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t tlc_max_encoded_size(size_t n)
{
    if (n > TLC_MAX_COUNT)
        return SIZE_MAX;
    return TLC_HEADER_BYTES + n / 5 + (n % 5 != 0);
}

const char *tlc_strerror(int status)
{
    switch (status) {
    case TLC_OK: return "ok";
    case TLC_E_ARG: return "bad argument";
    case TLC_E_SPACE: return "output buffer too small";
    case TLC_E_TRUNCATED: return "stream ends early";
    case TLC_E_TRAILING: return "bytes left after the last value";
    case TLC_E_PADDING: return "padding digit of the last byte is not 0";
    case TLC_E_HEADER: return "bad header (magic, version, flags or reserved byte)";
    case TLC_E_COUNT: return "value count in the stream differs from the expected count";
    case TLC_E_SCALER: return "scaler M is NaN, infinite or negative";
    case TLC_E_CODE: return "byte above 242 in a stream without zero-run encoding";
    case TLC_E_OVERFLOW: return "zero run goes past the last value";
    case TLC_E_NONFINITE: return "input holds NaN or infinity";
    case TLC_E_RANGE: return "scaler s * max|x| overflows float32";
    default: return "unknown error";
    }
}

#define TLC_X86 CU_X86

#define TLC_CHUNK 640 /* values quantized per packing step, a multiple of 5 */

static int simd_enabled = 1;

int tlc_simd(int enable)
{
    return simd_switch(&simd_enabled, enable);
}

static int use_avx2(void)
{
    return cpu_has_avx2() && simd_enabled;
}

/* The kernels are flat loops the compiler vectorizes; each is compiled for the baseline and, on
 * x86-64, for AVX2, chosen at run time. Both compute the same exact operations. */

/* Digits Q+1 of m values: 2 if A > M/2, 0 if A < -M/2, else 1. 2|A| > M is exact in float32:
 * doubling only overflows when |A| > FLT_MAX/2 >= M/2, where the answer is "above" anyway. A tie
 * 2|A| = M gives 1 (round half to even). When recon != NULL it gets M*Q: -M, +0.0 or M. */
static inline __attribute__((always_inline)) void digits_kernel(const float *in, size_t m,
                                                               float M, uint8_t *d, float *recon)
{
    for (size_t i = 0; i < m; i++) {
        int32_t above = 2.0f * fabsf(in[i]) > M;
        int32_t neg = (int32_t)(f2u(in[i]) >> 31);
        d[i] = (uint8_t)(1 + above - 2 * (above & neg));
    }
    if (recon)
        for (size_t i = 0; i < m; i++)
            recon[i] = (float)((int32_t)d[i] - 1) * M;
}

static uint32_t max_abs_default(const float *in, size_t n)
{
    return max_abs_kernel(in, n);
}

static void digits_default(const float *in, size_t m, float M, uint8_t *d, float *recon)
{
    digits_kernel(in, m, M, d, recon);
}

#if TLC_X86
__attribute__((target("avx2"))) static uint32_t max_abs_avx2(const float *in, size_t n)
{
    return max_abs_kernel(in, n);
}

__attribute__((target("avx2"))) static void digits_avx2(const float *in, size_t m, float M,
                                                        uint8_t *d, float *recon)
{
    digits_kernel(in, m, M, d, recon);
}
#endif

static uint32_t max_abs_bits(const float *in, size_t n)
{
#if TLC_X86
    if (use_avx2())
        return max_abs_avx2(in, n);
#endif
    return max_abs_default(in, n);
}

static int valid_sparsity(float s)
{
    return s >= 1.0f && s < 2.0f; /* false for NaN */
}

int tlc_scaler(const float *in, size_t n, float s, float *m)
{
    if (!valid_sparsity(s) || (n > 0 && in == NULL) || m == NULL)
        return TLC_E_ARG;
    uint32_t mb = max_abs_bits(in, n);
    if (mb >= 0x7F800000u)
        return TLC_E_NONFINITE;
    float v = s * u2f(mb);
    if (!isfinite(v))
        return TLC_E_RANGE;
    *m = v;
    return TLC_OK;
}

/* Flush a pending run of `run` zero bytes (0 <= run <= 14) as ZRE output. */
static inline size_t flush_run(uint8_t *o, size_t p, unsigned run)
{
    if (run == 1)
        o[p++] = TLC_BASE3_ZERO_BYTE;
    else if (run >= 2)
        o[p++] = (uint8_t)(243 + run - 2);
    return p;
}

ptrdiff_t tlc_encode(const float *in, size_t n, float s, int zre, uint8_t *out, size_t cap,
                     float *recon)
{
    if (!valid_sparsity(s) || n > TLC_MAX_COUNT || out == NULL || (n > 0 && in == NULL))
        return TLC_E_ARG;
    if (cap < tlc_max_encoded_size(n))
        return TLC_E_SPACE;
    float m;
    int r = tlc_scaler(in, n, s, &m);
    if (r != TLC_OK)
        return r;

    out[0] = TLC_MAGIC;
    out[1] = TLC_VERSION;
    out[2] = zre ? TLC_FLAG_ZRE : 0;
    out[3] = 0;
    put_u32(out + 4, f2u(m));
    put_u32(out + 8, (uint32_t)n);

    void (*digits)(const float *, size_t, float, uint8_t *, float *) = digits_default;
#if TLC_X86
    if (use_avx2())
        digits = digits_avx2;
#endif
    uint8_t d[TLC_CHUNK + 4];
    size_t p = TLC_HEADER_BYTES;
    unsigned run = 0;
    for (size_t i = 0; i < n; i += TLC_CHUNK) {
        size_t cm = n - i < TLC_CHUNK ? n - i : TLC_CHUNK;
        digits(in + i, cm, m, d, recon ? recon + i : NULL);
        memset(d + cm, 0, 4); /* padding past n: digit 0 (Q = -1) */
        size_t nb = cm / 5 + (cm % 5 != 0);
        const uint8_t *g = d;
        if (!zre) {
            for (size_t j = 0; j < nb; j++, g += 5)
                out[p++] = tlc_base3_pack(g[0], g[1], g[2], g[3], g[4]);
            continue;
        }
        for (size_t j = 0; j < nb; j++, g += 5) {
            uint8_t b = tlc_base3_pack(g[0], g[1], g[2], g[3], g[4]);
            if (b == TLC_BASE3_ZERO_BYTE) {
                if (++run == TLC_MAX_RUN) {
                    out[p++] = 255;
                    run = 0;
                }
            } else {
                p = flush_run(out, p, run);
                run = 0;
                out[p++] = b;
            }
        }
    }
    p = flush_run(out, p, run);
    return (ptrdiff_t)p;
}

/* Write the values of base-3^5 byte number `idx` (of B) holding `lanes` values; check padding. */
static inline int emit_byte(uint8_t b, float *out, size_t lanes, const float vals[3])
{
    uint32_t dg = tlc_base3_digits[b];
    for (size_t j = 0; j < lanes; j++)
        out[j] = vals[(dg >> (2 * j)) & 3];
    if (lanes < 5 && (dg >> (2 * lanes)) != 0)
        return TLC_E_PADDING;
    return TLC_OK;
}

int tlc_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at)
{
    size_t at = 0;
    int st = TLC_OK;
    if ((len > 0 && in == NULL) || (n > 0 && out == NULL)) {
        st = TLC_E_ARG;
        goto fail;
    }
    if (len < TLC_HEADER_BYTES) {
        st = TLC_E_TRUNCATED;
        at = len;
        goto fail;
    }
    if (in[0] != TLC_MAGIC || in[1] != TLC_VERSION || (in[2] & ~TLC_FLAG_ZRE) != 0 || in[3] != 0) {
        st = TLC_E_HEADER;
        at = in[0] != TLC_MAGIC ? 0 : in[1] != TLC_VERSION ? 1 : (in[2] & ~TLC_FLAG_ZRE) ? 2 : 3;
        goto fail;
    }
    int zre = in[2] & TLC_FLAG_ZRE;
    uint32_t mb = get_u32(in + 4);
    if (mb >= 0x7F800000u) { /* sign bit set, infinity or NaN */
        st = TLC_E_SCALER;
        at = 4;
        goto fail;
    }
    if (n > TLC_MAX_COUNT || get_u32(in + 8) != n) {
        st = TLC_E_COUNT;
        at = 8;
        goto fail;
    }
    float m = u2f(mb);
    const float vals[3] = {-m, 0.0f, m};
    size_t nbytes = n / 5 + (n % 5 != 0); /* B */
    size_t full = n / 5;                  /* bytes holding 5 values */
    /* Long streams: the five values of every byte value, built once, copied per byte. */
    float tab[TLC_BASE3_MAX_BYTE + 1][5];
    int use_tab = n >= 2048;
    if (use_tab)
        for (int b = 0; b <= TLC_BASE3_MAX_BYTE; b++)
            for (int j = 0; j < 5; j++)
                tab[b][j] = vals[(tlc_base3_digits[b] >> (2 * j)) & 3];
    size_t idx = 0, pos = TLC_HEADER_BYTES;
    for (; pos < len; pos++) {
        uint8_t b = in[pos];
        if (b <= TLC_BASE3_MAX_BYTE) {
            if (idx >= nbytes) {
                st = TLC_E_TRAILING;
                goto fail_here;
            }
            if (idx < full && use_tab) {
                memcpy(out + 5 * idx, tab[b], sizeof tab[b]);
            } else {
                size_t lanes = idx < full ? 5 : n - 5 * idx;
                if ((st = emit_byte(b, out + 5 * idx, lanes, vals)) != TLC_OK)
                    goto fail_here;
            }
            idx++;
        } else {
            if (!zre) {
                st = TLC_E_CODE;
                goto fail_here;
            }
            size_t k = (size_t)b - 241;
            if (k > nbytes - idx) {
                st = idx >= nbytes ? TLC_E_TRAILING : TLC_E_OVERFLOW;
                goto fail_here;
            }
            size_t whole = idx + k <= full ? k : full - idx; /* bytes with 5 values */
            memset(out + 5 * idx, 0, whole * 5 * sizeof(float));
            idx += whole;
            if (whole < k) { /* the run covers the partial last byte */
                if ((st = emit_byte(TLC_BASE3_ZERO_BYTE, out + 5 * idx, n - 5 * idx, vals)) != TLC_OK)
                    goto fail_here;
                idx++;
            }
        }
    }
    if (idx < nbytes) {
        st = TLC_E_TRUNCATED;
        at = len;
        goto fail;
    }
    return TLC_OK;
fail_here:
    at = pos;
fail:
    if (err_at)
        *err_at = at;
    return st;
}

/* --- in the ring (codec_table.h): 3LC ---------------------------------------------------------- */

static size_t tlc_max_size(const struct re_codec *c, size_t n)
{
    (void)c;
    return tlc_max_encoded_size(n);
}

static ptrdiff_t tlc_enc(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap)
{
    const struct re_tlc *s = c->state;
    return tlc_encode(x, n, s->sparsity, s->zre, out, cap, NULL);
}

static int tlc_dec(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n)
{
    (void)c;
    return tlc_decode(in, len, out, n, NULL);
}

void re_codec_threelc(struct re_codec *c, void *state)
{
    *c = (struct re_codec){.name = "3lc", .state = state, .max_encoded_size = tlc_max_size, .encode = tlc_enc,
                           .decode = tlc_dec, .strerror = tlc_strerror};
}


static void tlc_describe(const void *state, const struct re_call *call, char *out, size_t cap)
{
    (void)call;
    const struct re_tlc *s = state;
    snprintf(out, cap, "3lc (sparsity %g, zero-run encoding %s)", (double)s->sparsity, s->zre ? "on" : "off");
}

static const struct re_tlc TLC_DEFAULTS = {.sparsity = 1.0f, .zre = 1};

/* a whole tensor per encode (max|A|), specified with an error-accumulation buffer, stateless */
const struct re_codec_desc re_codec_threelc_desc = {
    .name = "3lc", .wants_error_feedback = 1, .thread_safe = 1, .app = 1, .state_type = "struct re_tlc",
    .state_size = sizeof TLC_DEFAULTS, .defaults = &TLC_DEFAULTS, .make = re_codec_threelc, .describe = tlc_describe};
