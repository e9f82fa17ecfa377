/* Per-block power-of-two scaling for the compressed ring: see blockscale_codec.h. */
#include "blockscale_codec.h"

#include <math.h>
#include <string.h>

#include "codec_util.h"
#include "inceptionn_codec.h"

size_t bs_wire_values(size_t n, size_t block)
{
    if (block < 1 || block > BS_MAX_BLOCK)
        return 0;
    return n + n / block + (n % block != 0);
}

int bs_shift(const float *x, size_t m)
{
    return bs_shift_h(x, m, BS_HEADROOM);
}

int bs_shift_h(const float *x, size_t m, int headroom)
{
    uint32_t top = max_abs_kernel(x, m);   /* as bits: inf and NaN sort above every finite value */
    if (top == 0 || top >= 0x7F800000u)    /* all zero, or inf/NaN: the block goes unscaled */
        return 0;
    int e;
    frexpf(u2f(top), &e);                  /* max = f * 2^e, f in [0.5, 1): exact, same on every CPU */
    int s = -e - headroom;
    return s < BS_MIN_SHIFT ? BS_MIN_SHIFT : s > BS_MAX_SHIFT ? BS_MAX_SHIFT : s;
}

/* 2^s as a float; s in [BS_MIN_SHIFT, BS_MAX_SHIFT], so always a normal float. */
static float pow2f(int s)
{
    uint32_t bits = (uint32_t)(127 + s) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* q[0..m) = the representable value nearest to x[i] * up (ties: the one nearer zero). The codec's own
 * reconstruction truncates toward zero, a bias that adds up hop after hop; any value it represents
 * is as good on the wire (a fixed point: it arrives unchanged), so the sender picks the nearest:
 * lo = the truncation, hi = the next representable magnitude above it. Values >= 1.0, inf and NaN
 * go verbatim, as in the codec. */
static void round_nearest(const float *x, float up, float *q, size_t m, int k)
{
    const float first = pow2f(k > -7 ? k : -7);          /* the smallest representable magnitude > 0 */
    const float t16 = pow2f(k + (-k + 1) / 2);            /* where the 16-bit tier starts */
    const float q8 = pow2f(-7), q16 = pow2f(-15);         /* the 8- and 16-bit tiers' steps */
    float v[64];
    for (size_t b = 0; b < m; b += 64) {
        size_t c = m - b < 64 ? m - b : 64;
        for (size_t i = 0; i < c; i++)
            v[i] = x[b + i] * up;                         /* exact unless it leaves the normal range */
        inc_reconstruct(v, c, k, q + b);
        /* masks, not branches (which way a value rounds is a coin toss the branch predictor
         * loses): the compiler vectorizes this */
        for (size_t i = 0; i < c; i++) {
            float a = fabsf(v[i]), lo = fabsf(q[b + i]);
            uint32_t tier8 = -(uint32_t)(lo < t16), zero = -(uint32_t)(lo == 0.0f);
            float step = u2f((f2u(q8) & tier8) | (f2u(q16) & ~tier8));
            float hi = u2f((f2u(first) & zero) | (f2u(lo + step) & ~zero));
            uint32_t up = -(uint32_t)((a < 1.0f) & (hi < 1.0f) & (hi - a < a - lo));
            uint32_t signed_hi = f2u(hi) | (f2u(v[i]) & 0x80000000u);
            q[b + i] = u2f((signed_hi & up) | (f2u(q[b + i]) & ~up));
        }
    }
}

ptrdiff_t bs_encode(const float *x, size_t n, size_t block, int k, float *wire, size_t cap, float *decoded)
{
    return bs_encode_h(x, n, block, k, BS_HEADROOM, wire, cap, decoded);
}

ptrdiff_t bs_encode_h(const float *x, size_t n, size_t block, int k, int headroom, float *wire, size_t cap,
                      float *decoded)
{
    if (block < 1 || block > BS_MAX_BLOCK || k < INC_MIN_ERROR_BOUND || k > INC_MAX_ERROR_BOUND ||
        headroom < 0 || headroom > BS_MAX_HEADROOM)
        return BS_E_ARG;
    size_t need = bs_wire_values(n, block);
    if (n > 0 && (x == NULL || wire == NULL))
        return BS_E_ARG;
    if (cap < need)
        return BS_E_ARG;
    size_t w = 0;
    for (size_t a = 0; a < n; a += block) {
        size_t m = n - a < block ? n - a : block;
        int s = bs_shift_h(x + a, m, headroom);
        float up = pow2f(s), down = pow2f(-s);
        wire[w++] = (float)(BS_MARK_BASE + s);
        float *q = wire + w;
        round_nearest(x + a, up, q, m, k);
        if (decoded)
            for (size_t i = 0; i < m; i++)
                decoded[a + i] = q[i] * down;
        w += m;
    }
    return (ptrdiff_t)w;
}

int bs_decode(const float *wire, size_t len, float *out, size_t n, size_t block, size_t *err_at)
{
    if (err_at)
        *err_at = 0;
    if (block < 1 || block > BS_MAX_BLOCK || (n > 0 && (wire == NULL || out == NULL)))
        return BS_E_ARG;
    if (len != bs_wire_values(n, block))
        return BS_E_LENGTH;
    size_t w = 0;
    for (size_t a = 0; a < n; a += block) {
        size_t m = n - a < block ? n - a : block;
        float mark = wire[w];
        /* the range test first: it also refuses NaN and inf before the integer test */
        if (!(mark >= (float)(BS_MARK_BASE + BS_MIN_SHIFT) && mark <= (float)(BS_MARK_BASE + BS_MAX_SHIFT)) ||
            mark != (float)(int)mark) {
            if (err_at)
                *err_at = w;
            return BS_E_EXPONENT;
        }
        int s = (int)mark - BS_MARK_BASE;
        float down = pow2f(-s);
        const float *q = wire + w + 1;
        /* a scaled block's values are finite and below 1.0 (unless s is clamped at the bottom, where
         * values up to FLT_MAX scaled down may stay >= 1); an unscaled block may hold anything */
        int bounded = s != 0 && s != BS_MIN_SHIFT, finite = s != 0;
        for (size_t i = 0; i < m; i++) {
            float v = q[i];
            if ((bounded && !(fabsf(v) < 1.0f)) || (finite && !isfinite(v))) {
                if (err_at)
                    *err_at = w + 1 + i;
                return BS_E_VALUE;
            }
            out[a + i] = v * down;
        }
        w += 1 + m;
    }
    return BS_OK;
}

const char *bs_strerror(int status)
{
    switch (status) {
    case BS_OK: return "ok";
    case BS_E_ARG: return "bad argument";
    case BS_E_LENGTH: return "wrong length for the value count";
    case BS_E_EXPONENT: return "a block exponent that is not an integer in range";
    case BS_E_VALUE: return "a value the encoder cannot produce for its block exponent";
    default: return "unknown status";
    }
}
