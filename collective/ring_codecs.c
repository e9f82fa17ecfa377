/*
 * The codecs behind the ring engine's codec interface (ring_engine.h, struct re_codec) besides
 * INCEPTIONN's, which ring_engine.c keeps: THC (codecs_c/thc_codec.h), whose encoded streams the
 * engine sums without decoding (docs/collectives.md, "The ring engine"), 3LC
 * (codecs_c/threelc_codec.h) and TernGrad (codecs_c/terngrad_codec.h), decoded, added and
 * re-encoded per hop like any codec.
 *
 * Everything a peer sends is read by the codecs' checked decoders (thc_inspect, thc_sum,
 * thc_decode_rotated); the header of a received stream must also carry this call's parameters
 * (bits, granularity, table, range M, rotation seed), or it is refused as THC_E_MISMATCH; 3LC's
 * and TernGrad's streams are read by tlc_decode and tg_decode, which check every read against the
 * stream's length.
 */
#include "ring_engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "thc_codec.h"
#include "terngrad_codec.h"
#include "threelc_codec.h"

/* --- THC ---------------------------------------------------------------------------------------- */

/* The smallest sum width (8, 16 or 32 bits) that holds `count` contributions; 0 when none does. */
static int thc_width(const struct re_thc *s, uint64_t count)
{
    static const int widths[] = {8, 16, 32};
    for (int i = 0; i < 3; i++)
        if (count * (uint64_t)s->granularity <= (widths[i] == 32 ? 0xFFFFFFFFull : (1ull << widths[i]) - 1))
            return widths[i];
    return 0;
}

/* M = t_p * l / sqrt(d) as the float32 the header carries (thc.py range_for: the same double
 * operations, so the same float). */
static float thc_range(const struct re_thc *s, size_t n)
{
    return (float)(s->t_p * s->norm / sqrt((double)thc_padded_dim(n)));
}

static size_t thc_max_size(const struct re_codec *c, size_t n)
{
    const struct re_thc *s = c->state;
    int w = thc_width(s, s->ranks > 0 ? (uint64_t)s->ranks : 1);
    return w ? thc_blob_size(n, s->bits, w) : 0;
}

/* The state's scratch for padded length d: work (d floats) and index (d bytes), kept for the call
 * (grown when a longer block comes; re_thc_release frees them). NULL when out of memory. */
static float *thc_scratch(struct re_thc *s, size_t d)
{
    if (s->work_dim < d || !s->work || !s->index) {
        re_thc_release(s);
        s->work = malloc(d * sizeof(float));
        s->index = malloc(d);
        if (!s->work || !s->index) {
            re_thc_release(s);
            return NULL;
        }
        s->work_dim = d;
    }
    return s->work;
}

void re_thc_release(struct re_thc *s)
{
    free(s->work);
    free(s->index);
    s->work = NULL;
    s->index = NULL;
    s->work_dim = 0;
}

static void thc_release(const struct re_codec *c)
{
    re_thc_release(c->state);
}

static ptrdiff_t thc_enc(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap)
{
    struct re_thc *s = c->state;
    size_t d = thc_padded_dim(n);
    if (d == 0)
        return THC_E_ARG;
    float *work = thc_scratch(s, d);
    if (!work)
        return THC_E_ARG;
    /* every encode of the call rounds with its own noise (thc.py draws one seed per encode) */
    uint64_t noise = thc_random_word(s->noise_seed, s->encodes++);
    return thc_encode(x, n, thc_range(s, n), s->rot_seed, noise, s->bits, s->granularity, s->table, work, out, cap);
}

/* A received stream's header, checked, and that it carries this call's parameters. */
static int thc_expect(const struct re_thc *s, const uint8_t *in, size_t len, size_t n, struct thc_info *info)
{
    int st = thc_inspect(in, len, info);
    if (st)
        return st;
    if (((size_t)1 << info->log2_dim) != thc_padded_dim(n))
        return THC_E_COUNT;
    float m = thc_range(s, n);
    if (info->bits != s->bits || info->granularity != s->granularity ||
        memcmp(info->table, s->table, (size_t)1 << s->bits) || info->seed != s->rot_seed ||
        memcmp(&info->range, &m, sizeof m))
        return THC_E_MISMATCH;
    return THC_OK;
}

static int thc_count(const struct re_codec *c, const uint8_t *in, size_t len, size_t n, uint32_t *count)
{
    struct thc_info info;
    int st = thc_expect(c->state, in, len, n, &info);
    if (!st)
        *count = info.count;
    return st;
}

/* The SUM of the stream's contributions (thc_decode gives their mean): the rotated mean times
 * the count (one float32 multiply, exact for a count that is a power of two), inverse-rotated. */
static int thc_dec(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n)
{
    struct re_thc *s = c->state;
    struct thc_info info;
    int st = thc_expect(s, in, len, n, &info);
    if (st)
        return st;
    size_t d = thc_padded_dim(n);
    float *work = thc_scratch(s, d);
    if (!work)
        return THC_E_ARG;
    if ((st = thc_decode_rotated_sum(in, len, n, work, NULL)) == THC_OK)
        thc_unrotate(work, d, info.seed, out, n);
    return st;
}

/* a (received: checked against this call) + b (this rank's own stream) in the encoded domain, in
 * the narrowest sum width that holds both counts. */
static ptrdiff_t thc_add(const struct re_codec *c, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen,
                         size_t n, uint8_t *out, size_t cap)
{
    const struct re_thc *s = c->state;
    struct thc_info ia, ib;
    int st = thc_expect(s, a, alen, n, &ia);
    if (st || (st = thc_expect(s, b, blen, n, &ib)))
        return st;
    int w = thc_width(s, (uint64_t)ia.count + ib.count);
    if (!w)
        return THC_E_OVERFLOW;
    const uint8_t *blobs[2] = {a, b};
    size_t lens[2] = {alen, blen};
    return thc_sum(blobs, lens, 2, n, w, out, cap, NULL);
}

/* A hop in one pass: rotate x once, quantize it to indices (the noise of this encode, as thc_enc),
 * then either pack them (a == NULL: the SEND) or add their table values to the received stream a
 * (checked against this call) in the narrowest width; no stream of x is built or decoded. Error
 * feedback's residual x - decode(own stream) is the inverse transform of the rotated residual
 * thc_quantize leaves (R^-1 (Rx - q); the same up to float rounding). */
static ptrdiff_t thc_enc_sum(const struct re_codec *c, const float *x, size_t n, const uint8_t *a, size_t alen,
                             float *lost, uint8_t *out, size_t cap)
{
    struct re_thc *s = c->state;
    size_t d = thc_padded_dim(n);
    if (d == 0 || (n > 0 && !x))
        return THC_E_ARG;
    struct thc_info ia;
    int w = s->bits, st;
    if (a) {
        if ((st = thc_expect(s, a, alen, n, &ia)))
            return st;
        if (!(w = thc_width(s, (uint64_t)ia.count + 1)))
            return THC_E_OVERFLOW;
    }
    if (cap < thc_blob_size(n, s->bits, w))
        return THC_E_SPACE;
    float *work = thc_scratch(s, d);
    if (!work)
        return THC_E_ARG;
    /* a non-finite x[i] makes rotated values non-finite (inf and NaN never sum to a finite float),
     * which thc_quantize refuses as thc_encode does */
    thc_rotate_unscaled(x, n, d, s->rot_seed, work);       /* thc_rht, its 1/sqrt(d) left to thc_quantize */
    float range = thc_range(s, n);
    uint64_t noise = thc_random_word(s->noise_seed, s->encodes++);
    if ((st = thc_quantize(work, d, thc_rht_scale(d), range, noise, s->bits, s->granularity, s->table, s->index)))
        return st;
    ptrdiff_t got = a ? thc_add_indices(a, alen, s->index, d, w, out, cap, NULL)
                      : thc_pack_indices(s->index, d, range, s->rot_seed, s->bits, s->granularity, s->table, out, cap);
    if (got >= 0 && lost)
        thc_unrotate(work, d, s->rot_seed, lost, n);
    return got;
}

void re_codec_thc(struct re_codec *c, struct re_thc *s)
{
    *c = (struct re_codec){.name = "thc", .state = s, .max_encoded_size = thc_max_size, .encode = thc_enc,
                           .decode = thc_dec, .sum_encoded = thc_add, .count_encoded = thc_count,
                           .encode_sum = thc_enc_sum, .release = thc_release, .strerror = thc_strerror};
}

/* --- 3LC ---------------------------------------------------------------------------------------- */

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

void re_codec_threelc(struct re_codec *c, struct re_tlc *s)
{
    *c = (struct re_codec){.name = "3lc", .state = s, .max_encoded_size = tlc_max_size, .encode = tlc_enc,
                           .decode = tlc_dec, .strerror = tlc_strerror};
}

/* --- TernGrad ----------------------------------------------------------------------------------- */

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

void re_codec_terngrad(struct re_codec *c, struct re_tg *s)
{
    *c = (struct re_codec){.name = "terngrad", .state = s, .max_encoded_size = tg_max_size, .encode = tg_enc,
                           .decode = tg_dec, .strerror = tg_strerror};
}
