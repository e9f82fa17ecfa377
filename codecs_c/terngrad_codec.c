/*
 * TernGrad codec (docs/spec.md section 4): portable C, every decoder read checked against the input
 * length. The numpy reference (terngrad_reference.py) must agree bit for bit given the same
 * seed and draw counter; the tests hold them so.
 */
#include "terngrad_codec.h"
#include "codec_util.h"
#include "threelc_base3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The clip bound must not depend on whether the compiler fuses a multiply and an add. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define TG_GOLDEN 0x9E3779B97F4A7C15ull
#define TG_U_MASK ((1u << TG_RANDOM_BITS) - 1)
#define TG_CHUNK 640 /* values ternarized per packing step: a multiple of 2, 4 and 5 */

#define TG_X86 CU_X86

size_t tg_encoded_size(size_t n, int packing)
{
    if (n > TG_MAX_COUNT)
        return SIZE_MAX;
    if (packing == TG_PACK_2BIT)
        return TG_HEADER_BYTES + n / 4 + (n % 4 != 0);
    if (packing == TG_PACK_BASE3)
        return TG_HEADER_BYTES + n / 5 + (n % 5 != 0);
    return SIZE_MAX;
}

uint64_t tg_draws(size_t n)
{
    return (uint64_t)(n / 2 + (n % 2));
}

const char *tg_strerror(int status)
{
    switch (status) {
    case TG_OK: return "ok";
    case TG_E_ARG: return "bad argument";
    case TG_E_SPACE: return "output buffer too small";
    case TG_E_TRUNCATED: return "stream ends early";
    case TG_E_TRAILING: return "bytes left after the last value";
    case TG_E_PADDING: return "non-zero padding in the last byte";
    case TG_E_HEADER: return "bad header (magic, version, packing or reserved byte)";
    case TG_E_COUNT: return "value count in the stream differs from the expected count";
    case TG_E_SCALER: return "scaler is NaN, infinite or negative";
    case TG_E_CODE: return "invalid code (2-bit code 10 or base-3 byte above 242)";
    case TG_E_NONFINITE: return "input holds NaN or infinity";
    default: return "unknown error";
    }
}

void tg_random(uint64_t seed, uint64_t draw, size_t count, uint64_t *out)
{
    uint64_t z = seed + (draw + 1) * TG_GOLDEN;
    for (size_t k = 0; k < count; k++, z += TG_GOLDEN)
        out[k] = mix64(z);
}

/*
 * One pass over the tensor: the largest |g| as bits (NaN and infinity sort above every finite
 * value, so one compare finds them) and, when sums != NULL, the clip statistics: sum and sum of
 * squares in double over 8 interleaved lanes (lane j takes the g_i with i % 8 == j; the tail goes
 * to lanes 0, 1, ... in order). The lane structure is part of the format: it fixes the rounding.
 * A float squared is exact in double, so fusing the multiply-add would not change anything.
 */
static inline __attribute__((always_inline)) uint32_t stats_kernel(const float *in, size_t n,
                                                                  double sums[16])
{
    uint32_t mx[8] = {0};
    double l[8] = {0}, q[8] = {0};
    size_t i = 0;
    if (sums) {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                uint32_t a = f2u(in[i + j]) & 0x7FFFFFFFu;
                mx[j] = a > mx[j] ? a : mx[j];
                double v = in[i + j];
                l[j] += v;
                q[j] += v * v;
            }
        for (int j = 0; i < n; i++, j++) {
            double v = in[i];
            l[j] += v;
            q[j] += v * v;
            uint32_t a = f2u(in[i]) & 0x7FFFFFFFu;
            mx[j] = a > mx[j] ? a : mx[j];
        }
        memcpy(sums, l, sizeof l);
        memcpy(sums + 8, q, sizeof q);
    } else {
        return max_abs_kernel(in, n);
    }
    uint32_t m = 0;
    for (int j = 0; j < 8; j++)
        m = mx[j] > m ? mx[j] : m;
    return m;
}

static uint32_t stats_default(const float *in, size_t n, double sums[16])
{
    return stats_kernel(in, n, sums);
}

#if TG_X86
__attribute__((target("avx2"))) static uint32_t stats_avx2(const float *in, size_t n, double sums[16])
{
    return stats_kernel(in, n, sums);
}
#endif

static int simd_enabled = 1;

int tg_simd(int enable)
{
    return simd_switch(&simd_enabled, enable);
}

static int have_avx2(void)
{
    return cpu_has_avx2() && simd_enabled;
}

int tg_scaler(const float *in, size_t n, double clip, float *scaler, float *bound)
{
    if ((n > 0 && in == NULL) || scaler == NULL || bound == NULL || isnan(clip) || isinf(clip))
        return TG_E_ARG;
    int clipping = clip > 0.0 && n > 0;
    double sums[16];
#if TG_X86
    uint32_t mb = have_avx2() ? stats_avx2(in, n, clipping ? sums : NULL)
                              : stats_default(in, n, clipping ? sums : NULL);
#else
    uint32_t mb = stats_default(in, n, clipping ? sums : NULL);
#endif
    if (mb >= 0x7F800000u)
        return TG_E_NONFINITE;
    float b = INFINITY;
    if (clipping) {
        const double *l = sums, *q = sums + 8;
        double sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        double sq = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        double mean = sum / (double)n;
        volatile double mean2 = mean * mean; /* rounded on its own: no fused multiply-subtract */
        double var = sq / (double)n - mean2;
        if (!(var > 0.0))
            var = 0.0;
        b = (float)(clip * sqrt(var));
    }
    float mx = u2f(mb);
    *scaler = mx < b ? mx : b;
    *bound = b;
    return TG_OK;
}

/*
 * Ternarize one chunk of m <= TG_CHUNK values; z is the state of its first draw. Value i uses
 * the 29 low bits of half i%2 of draw i/2: on a little-endian machine that is simply the i-th
 * uint32 of the draws. t_i = sign(g_i) if u_i * S < min(|g_i|, bound) * 2^29: both products are
 * exact in double (29 + 24 bits, and a power of two), so the test is exact and the result does not
 * depend on vector width. Written as flat loops the compiler vectorizes; compiled twice below.
 */
static inline __attribute__((always_inline)) void ternarize_kernel(const float *in, size_t m,
                                                                  float bound, double S,
                                                                  uint64_t z, int8_t *t)
{
    union {
        uint64_t r[TG_CHUNK / 2];
        uint32_t u[TG_CHUNK];
    } draws;
    size_t pairs = m / 2 + (m & 1);
    for (size_t k = 0; k < pairs; k++)
        draws.r[k] = mix64(z + (uint64_t)k * TG_GOLDEN);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t k = 0; k < pairs; k++) {
        uint64_t r = draws.r[k];
        draws.u[2 * k] = (uint32_t)r;
        draws.u[2 * k + 1] = (uint32_t)(r >> 32);
    }
#endif
    for (size_t i = 0; i < m; i++) {
        float a = fabsf(in[i]);
        a = a < bound ? a : bound;
        int32_t u = (int32_t)(draws.u[i] & TG_U_MASK);
        int32_t hit = (double)u * S < (double)a * 536870912.0;
        int32_t neg = (int32_t)(f2u(in[i]) >> 31);
        t[i] = (int8_t)(hit - 2 * (hit & neg));
    }
}

static void ternarize_default(const float *in, size_t m, float bound, double S, uint64_t z, int8_t *t)
{
    ternarize_kernel(in, m, bound, S, z, t);
}

#if TG_X86
__attribute__((target("avx2"))) static void ternarize_avx2(const float *in, size_t m, float bound,
                                                           double S, uint64_t z, int8_t *t)
{
    ternarize_kernel(in, m, bound, S, z, t);
}
#endif

ptrdiff_t tg_encode(const float *in, size_t n, double clip, float shared, int packing,
                    uint64_t seed, uint64_t draw, uint8_t *out, size_t cap)
{
    if ((packing != TG_PACK_2BIT && packing != TG_PACK_BASE3) || n > TG_MAX_COUNT ||
        out == NULL || (n > 0 && in == NULL) || isnan(shared) || isinf(shared))
        return TG_E_ARG;
    size_t size = tg_encoded_size(n, packing);
    if (cap < size)
        return TG_E_SPACE;
    float own, bound;
    int r = tg_scaler(in, n, clip, &own, &bound);
    if (r != TG_OK)
        return r;
    /* The agreed scaler is a floor: a tensor whose own scaler is larger (a partial sum in a ring)
     * keeps its own, so the encoding stays unbiased. -0.0 and negatives: the own scaler. */
    float S = (!signbit(shared) && shared > own) ? shared : own;

    out[0] = TG_MAGIC;
    out[1] = TG_VERSION;
    out[2] = (uint8_t)packing;
    out[3] = 0;
    put_u32(out + 4, f2u(S));
    put_u32(out + 8, (uint32_t)n);

    void (*ternarize)(const float *, size_t, float, double, uint64_t, int8_t *) = ternarize_default;
#if TG_X86
    if (have_avx2())
        ternarize = ternarize_avx2;
#endif
    uint8_t *o = out + TG_HEADER_BYTES;
    uint64_t z = seed + (draw + 1) * TG_GOLDEN;
    int8_t t[TG_CHUNK + 4];
    for (size_t i = 0; i < n; i += TG_CHUNK) {
        size_t m = n - i < TG_CHUNK ? n - i : TG_CHUNK;
        ternarize(in + i, m, bound, (double)S, z, t);
        z += (uint64_t)(TG_CHUNK / 2) * TG_GOLDEN; /* only the last chunk can be shorter */
        memset(t + m, packing == TG_PACK_2BIT ? 0 : -1, 4); /* padding: code 00 / digit 0 */
        if (packing == TG_PACK_2BIT) {
            for (size_t j = 0; j < m; j += 4)
                *o++ = (uint8_t)((t[j] & 3) | ((t[j + 1] & 3) << 2) | ((t[j + 2] & 3) << 4) |
                                 ((t[j + 3] & 3) << 6));
        } else {
            for (size_t j = 0; j < m; j += 5)
                *o++ = tlc_base3_pack(t[j] + 1, t[j + 1] + 1, t[j + 2] + 1, t[j + 3] + 1, t[j + 4] + 1);
        }
    }
    return (ptrdiff_t)(o - out);
}

int tg_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at)
{
    size_t at = 0;
    int st = TG_OK;
    if ((len > 0 && in == NULL) || (n > 0 && out == NULL)) {
        st = TG_E_ARG;
        goto fail;
    }
    if (len < TG_HEADER_BYTES) {
        st = TG_E_TRUNCATED;
        at = len;
        goto fail;
    }
    if (in[0] != TG_MAGIC || in[1] != TG_VERSION || in[2] > TG_PACK_BASE3 || in[3] != 0) {
        st = TG_E_HEADER;
        at = in[0] != TG_MAGIC ? 0 : in[1] != TG_VERSION ? 1 : in[2] > TG_PACK_BASE3 ? 2 : 3;
        goto fail;
    }
    int packing = in[2];
    uint32_t sb = get_u32(in + 4);
    if (sb >= 0x7F800000u) { /* sign bit set, infinity or NaN */
        st = TG_E_SCALER;
        at = 4;
        goto fail;
    }
    if (n > TG_MAX_COUNT || get_u32(in + 8) != n) {
        st = TG_E_COUNT;
        at = 8;
        goto fail;
    }
    size_t size = tg_encoded_size(n, packing);
    if (len != size) {
        st = len < size ? TG_E_TRUNCATED : TG_E_TRAILING;
        at = len < size ? len : size;
        goto fail;
    }
    float S = u2f(sb);
    const uint8_t *p = in + TG_HEADER_BYTES;
    size_t pos = 0;
    int use_tab = n >= 2048; /* long streams: every byte's values built once, copied per byte */
    if (packing == TG_PACK_2BIT) {
        const float vals[4] = {0.0f, S, 0.0f, -S};
        float tab[256][4];
        if (use_tab)
            for (int b = 0; b < 256; b++)
                for (int j = 0; j < 4; j++)
                    tab[b][j] = vals[(b >> (2 * j)) & 3];
        size_t full = n / 4;
        for (; pos < full; pos++) {
            unsigned b = p[pos];
            if ((b >> 1) & ~b & 0x55u) {
                st = TG_E_CODE;
                goto fail_here;
            }
            float *o = out + 4 * pos;
            if (use_tab) {
                memcpy(o, tab[b], sizeof tab[b]);
            } else {
                o[0] = vals[b & 3];
                o[1] = vals[(b >> 2) & 3];
                o[2] = vals[(b >> 4) & 3];
                o[3] = vals[b >> 6];
            }
        }
        if (n % 4) {
            unsigned b = p[pos], lanes = (unsigned)(n % 4);
            if ((b >> 1) & ~b & 0x55u) {
                st = TG_E_CODE;
                goto fail_here;
            }
            if (b >> (2 * lanes)) {
                st = TG_E_PADDING;
                goto fail_here;
            }
            for (unsigned j = 0; j < lanes; j++)
                out[4 * pos + j] = vals[(b >> (2 * j)) & 3];
        }
    } else {
        const float vals[3] = {-S, 0.0f, S};
        float tab[TLC_BASE3_MAX_BYTE + 1][5];
        if (use_tab)
            for (int b = 0; b <= TLC_BASE3_MAX_BYTE; b++)
                for (int j = 0; j < 5; j++)
                    tab[b][j] = vals[(tlc_base3_digits[b] >> (2 * j)) & 3];
        size_t nbytes = size - TG_HEADER_BYTES, full = n / 5;
        for (; pos < nbytes; pos++) {
            uint8_t b = p[pos];
            if (b > TLC_BASE3_MAX_BYTE) {
                st = TG_E_CODE;
                goto fail_here;
            }
            float *o = out + 5 * pos;
            if (pos < full && use_tab) {
                memcpy(o, tab[b], sizeof tab[b]);
                continue;
            }
            uint32_t dg = tlc_base3_digits[b];
            size_t lanes = pos < full ? 5 : n - 5 * pos;
            if (lanes < 5 && (dg >> (2 * lanes)) != 0) {
                st = TG_E_PADDING;
                goto fail_here;
            }
            for (size_t j = 0; j < lanes; j++)
                o[j] = vals[(dg >> (2 * j)) & 3];
        }
    }
    return TG_OK;
fail_here:
    at = TG_HEADER_BYTES + pos;
fail:
    if (err_at)
        *err_at = at;
    return st;
}

/* --- in the ring (codec_table.h): TernGrad ----------------------------------------------------- */

static size_t tg_max_size(const struct re_codec *c, size_t n)
{
    const struct re_tg *s = c->state;
    return tg_encoded_size(n, s->packing);
}

/* each encode takes the next tg_draws(n) draws of the random stream, as terngrad.py's encode */
static ptrdiff_t tg_enc(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap)
{
    struct re_tg *s = c->state;
    ptrdiff_t got = tg_encode(x, n, s->clip, s->shared, s->packing, s->seed, s->draw, out, cap);
    if (got >= 0)
        s->draw += tg_draws(n);
    return got;
}

static int tg_dec(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n)
{
    (void)c;
    return tg_decode(in, len, out, n, NULL);
}

void re_codec_terngrad(struct re_codec *c, void *state)
{
    *c = (struct re_codec){.name = "terngrad", .state = state, .max_encoded_size = tg_max_size, .encode = tg_enc,
                           .decode = tg_dec, .strerror = tg_strerror};
}


/* this rank's random stream; its position (draw) carries on from call to call in the state */
static int tg_begin(void *state, const struct re_call *call)
{
    ((struct re_tg *)state)->seed = call->seed;
    return 0;
}

static void tg_describe(const void *state, const struct re_call *call, char *out, size_t cap)
{
    (void)call;
    const struct re_tg *s = state;
    snprintf(out, cap, "terngrad (clip %g, %s packing, %s)", s->clip, s->packing == TG_PACK_2BIT ? "2-bit" : "base-3",
             s->shared < 0 ? "no shared scaler" : "a shared scaler");
}

static const struct re_tg TG_DEFAULTS = {.clip = 2.5, .shared = -1.0f, .packing = TG_PACK_2BIT};

/* a whole tensor per encode (its scaler), no error feedback, a random stream per worker */
const struct re_codec_desc re_codec_terngrad_desc = {
    .name = "terngrad", .app = 1, .state_type = "struct re_tg", .state_size = sizeof TG_DEFAULTS,
    .defaults = &TG_DEFAULTS, .make = re_codec_terngrad, .begin = tg_begin, .describe = tg_describe};
