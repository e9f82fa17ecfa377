/*
 * INCEPTIONN codec: portable scalar path, run-time dispatch to the AVX2 path, and the checks.
 * The scalar path follows docs/spec.md's bit formulas literally; the AVX2 path computes the same
 * fields with float arithmetic, and the tests hold the two bit-identical.
 */
#include "inceptionn_codec.h"
#include "inceptionn_codec_internal.h"
#include "codec_util.h"

#include <stdio.h>
#include <string.h>


size_t inc_max_encoded_size(size_t n)
{
    size_t groups = n / INC_LANES + (n % INC_LANES != 0);
    if (groups > SIZE_MAX / INC_MAX_GROUP_BYTES)
        return SIZE_MAX; /* saturate: no buffer that large exists */
    return groups * INC_MAX_GROUP_BYTES;
}

int inc_have_avx2(void)
{
    return cpu_has_avx2();
}

const char *inc_strerror(int status)
{
    switch (status) {
    case INC_OK: return "ok";
    case INC_E_ARG: return "bad argument";
    case INC_E_SPACE: return "output buffer too small";
    case INC_E_TRUNCATED: return "stream ends inside a group";
    case INC_E_TRAILING: return "bytes left after the last group";
    case INC_E_PADDING: return "a lane past the value count is not 0BIT";
    default: return "unknown error";
    }
}

static inline unsigned tier_of(uint32_t bits, uint32_t eb, uint32_t mid)
{
    uint32_t e = (bits >> 23) & 0xFF;
    if (e >= 127) return INC_NO_COMPRESS;
    if (e < eb) return INC_0BIT;
    if (e >= mid) return INC_16BIT;
    return INC_8BIT;
}

/* Bits 22..0 of the value as a fixed-point fraction below 1.0 (SPEC: (1<<23 | m) >> (127-e)). */
static inline uint32_t fixed_fraction(uint32_t bits)
{
    uint32_t e = (bits >> 23) & 0xFF;
    return ((1u << 23) | (bits & 0x7FFFFF)) >> (127 - e);
}

static inline size_t encode_group_scalar(const float *in, size_t lanes, uint32_t eb,
                                         uint32_t mid, uint8_t *o)
{
    uint16_t key = 0;
    size_t p = 2;
    for (size_t j = 0; j < lanes; j++) {
        uint32_t bits;
        memcpy(&bits, &in[j], 4);
        unsigned t = tier_of(bits, eb, mid);
        uint32_t s = bits >> 31;
        key |= (uint16_t)(t << (2 * j));
        switch (t) {
        case INC_8BIT:
            o[p++] = (uint8_t)((s << 7) | ((fixed_fraction(bits) >> 16) & 0x7F));
            break;
        case INC_16BIT: {
            uint32_t v = (s << 15) | ((fixed_fraction(bits) >> 8) & 0x7FFF);
            o[p++] = (uint8_t)v;
            o[p++] = (uint8_t)(v >> 8);
            break;
        }
        case INC_NO_COMPRESS:
            o[p++] = (uint8_t)bits;
            o[p++] = (uint8_t)(bits >> 8);
            o[p++] = (uint8_t)(bits >> 16);
            o[p++] = (uint8_t)(bits >> 24);
            break;
        default:
            break;
        }
    }
    o[0] = (uint8_t)key;
    o[1] = (uint8_t)(key >> 8);
    return p;
}

/* The implementation a call runs: AUTO resolved for this CPU; -1 for an unknown one or AVX2
 * on a CPU without it. */
static int pick_impl(int impl)
{
    if (impl == INC_IMPL_AUTO)
        impl = inc_have_avx2() ? INC_IMPL_AVX2 : INC_IMPL_SCALAR;
    if (impl == INC_IMPL_AVX2 && !inc_have_avx2())
        return -1;
    return impl == INC_IMPL_SCALAR || impl == INC_IMPL_AVX2 ? impl : -1;
}

ptrdiff_t inc_encode(const float *in, size_t n, int k, uint8_t *out, size_t cap, int impl)
{
    if (k < INC_MIN_ERROR_BOUND || k > INC_MAX_ERROR_BOUND)
        return INC_E_ARG;
    if (n > 0 && (in == NULL || out == NULL))
        return INC_E_ARG;
    impl = pick_impl(impl);
    if (impl < 0)
        return INC_E_ARG;

    uint32_t eb = (uint32_t)(127 + k);
    uint32_t mid = eb + (uint32_t)((-k + 1) / 2);
    size_t groups = n / INC_LANES + (n % INC_LANES != 0);
    size_t g = 0, pos = 0;
#if INC_X86
    if (impl == INC_IMPL_AVX2)
        g = inc__encode_avx2(in, n / INC_LANES, eb, mid, out, cap, &pos);
#endif
    uint8_t tmp[INC_MAX_GROUP_BYTES];
    for (; g < groups; g++) {
        size_t lanes = n - g * INC_LANES < INC_LANES ? n - g * INC_LANES : INC_LANES;
        if (cap - pos >= INC_MAX_GROUP_BYTES) {
            pos += encode_group_scalar(in + g * INC_LANES, lanes, eb, mid, out + pos);
        } else {
            /* Near the end of a tight buffer: stage the group, copy only if it fits. */
            size_t len = encode_group_scalar(in + g * INC_LANES, lanes, eb, mid, tmp);
            if (len > cap - pos)
                return INC_E_SPACE;
            memcpy(out + pos, tmp, len);
            pos += len;
        }
    }
    return (ptrdiff_t)pos;
}

/* SPEC decode of a 16BIT/8BIT field f of width w (15 or 7) with sign s. */
static inline uint32_t decode_field(uint32_t s, uint32_t f, unsigned w)
{
    if (f == 0)
        return s << 31; /* (choice) a signed zero */
    unsigned bitlen = 32 - (unsigned)__builtin_clz(f);
    unsigned nshift = w + 1 - bitlen;
    uint32_t e = 127 - nshift;
    uint32_t mant = ((f << nshift) & ((1u << w) - 1)) << (23 - w);
    return (s << 31) | (e << 23) | mant;
}

/* Checks the group at in[0..avail) holding `lanes` values: its tag word, its padding lanes and
 * that it fits. Returns its byte length, or a negative status; *key_out gets the tag word. */
/* always_inline: so that the POPCNT build of the stream histogram counts with the instruction. */
static inline __attribute__((always_inline)) ptrdiff_t check_group(const uint8_t *in, size_t avail,
                                                                   size_t lanes, unsigned *key_out)
{
    if (avail < 2)
        return INC_E_TRUNCATED;
    unsigned key = (unsigned)in[0] | ((unsigned)in[1] << 8);
    if (lanes < INC_LANES && (key >> (2 * lanes)) != 0)
        return INC_E_PADDING; /* lanes past n must be 0BIT */
    /* Payload bytes from the lane counts per tag, without a loop over the lanes. */
    unsigned lo = key & 0x5555u, hi = (key >> 1) & 0x5555u;
    size_t need = 2 + (size_t)__builtin_popcount(lo & ~hi) + 2 * (size_t)__builtin_popcount(hi & ~lo) +
                  4 * (size_t)__builtin_popcount(lo & hi);
    if (avail < need)
        return INC_E_TRUNCATED;
    *key_out = key;
    return (ptrdiff_t)need;
}

/* One group at in[0..avail). Returns its byte length, or a negative status. */
static inline ptrdiff_t decode_group_scalar(const uint8_t *in, size_t avail, float *out,
                                            size_t lanes)
{
    unsigned key;
    ptrdiff_t need = check_group(in, avail, lanes, &key);
    if (need < 0)
        return need;
    size_t p = 2;
    for (unsigned j = 0; j < lanes; j++) {
        uint32_t bits;
        switch ((key >> (2 * j)) & 3) {
        case INC_8BIT:
            bits = decode_field(in[p] >> 7, in[p] & 0x7Fu, 7);
            p += 1;
            break;
        case INC_16BIT: {
            uint32_t v = (uint32_t)in[p] | ((uint32_t)in[p + 1] << 8);
            bits = decode_field(v >> 15, v & 0x7FFFu, 15);
            p += 2;
            break;
        }
        case INC_NO_COMPRESS:
            bits = (uint32_t)in[p] | ((uint32_t)in[p + 1] << 8) | ((uint32_t)in[p + 2] << 16) |
                   ((uint32_t)in[p + 3] << 24);
            p += 4;
            break;
        default:
            bits = 0;
            break;
        }
        memcpy(&out[j], &bits, 4);
    }
    return need;
}

int inc_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at, int impl)
{
    size_t pos = 0;
    if (err_at)
        *err_at = 0;
    if ((len > 0 && in == NULL) || (n > 0 && out == NULL))
        return INC_E_ARG;
    impl = pick_impl(impl);
    if (impl < 0)
        return INC_E_ARG;

    size_t groups = n / INC_LANES + (n % INC_LANES != 0);
    /* Every group is at least its 2-byte tag word: reject a count the input cannot hold before
     * touching anything (a hostile header must not make us walk a huge output). */
    if (groups > len / 2) {
        if (err_at)
            *err_at = len & ~(size_t)1;
        return INC_E_TRUNCATED;
    }
    size_t g = 0;
#if INC_X86
    if (impl == INC_IMPL_AVX2)
        g = inc__decode_avx2(in, len, out, n / INC_LANES, &pos);
#endif
    for (; g < groups; g++) {
        size_t lanes = n - g * INC_LANES < INC_LANES ? n - g * INC_LANES : INC_LANES;
        ptrdiff_t r = decode_group_scalar(in + pos, len - pos, out + g * INC_LANES, lanes);
        if (r < 0) {
            if (err_at)
                *err_at = pos;
            return (int)r;
        }
        pos += (size_t)r;
    }
    if (pos != len) {
        if (err_at)
            *err_at = pos;
        return INC_E_TRAILING;
    }
    return INC_OK;
}

/* What encode-then-decode gives, value by value, without building the stream: the tiers are
 * fixed-point truncations (16BIT to a multiple of 2^-15, 8BIT to 2^-7), so keeping the mantissa
 * bits above that position is the same thing. Zeros come out as +0.0 (the round trip can give
 * -0.0), which makes the function idempotent. Branch-free integer work, so the compiler
 * vectorises it; compiled twice (baseline, AVX2) and picked like the codec's other paths, so
 * INCEPTIONN_CODEC_SIMD=off reaches it too. */
static inline __attribute__((always_inline)) void reconstruct_kernel(const float *in, size_t n, int k, float *out)
{
    const uint32_t eb = (uint32_t)(127 + k), mid = eb + (uint32_t)((-k + 1) / 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        uint32_t e = (u >> 23) & 0xFFu;
        int32_t kept = (int32_t)e - (e >= mid ? 112 : 120); /* fraction bits the tier keeps */
        uint32_t sh = (uint32_t)(23 - kept);                  /* mantissa bits dropped */
        uint32_t mask = kept < 0 ? 0u : ~((1u << (sh & 31)) - 1u);
        uint32_t r = e < eb ? 0u : u & mask;
        r = e >= 127 ? u : r;
        r = (r & 0x7FFFFFFFu) ? r : 0u; /* -0.0 -> +0.0 */
        memcpy(&out[i], &r, 4);
    }
}

#if CU_X86
__attribute__((target("avx2"))) static void reconstruct_avx2(const float *in, size_t n, int k, float *out)
{
    reconstruct_kernel(in, n, k, out);
}
#endif

void inc_reconstruct(const float *in, size_t n, int k, float *out)
{
#if CU_X86
    if (cpu_has_avx2()) {
        reconstruct_avx2(in, n, k, out);
        return;
    }
#endif
    reconstruct_kernel(in, n, k, out);
}

size_t inc_encoded_size(const float *in, size_t n, int k)
{
    uint64_t c[4] = {0, 0, 0, 0};
    inc_histogram(in, n, k, c);
    size_t groups = n / INC_LANES + (n % INC_LANES != 0);
    return 2 * groups + (size_t)(c[1] + 2 * c[2] + 4 * c[3]);
}

void inc_histogram(const float *in, size_t n, int k, uint64_t counts[4])
{
    if (k < INC_MIN_ERROR_BOUND || k > INC_MAX_ERROR_BOUND || (n > 0 && in == NULL))
        return;
    uint32_t eb = (uint32_t)(127 + k);
    uint32_t mid = eb + (uint32_t)((-k + 1) / 2);
    uint64_t c[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &in[i], 4);
        c[tier_of(bits, eb, mid)]++;
    }
    for (int t = 0; t < 4; t++)
        counts[t] += c[t];
}

/* The stream histogram counts tags with popcount, which GCC compiles to a call into libgcc
 * (__popcountdi2) unless the target has the POPCNT instruction: the body is built twice, for
 * POPCNT and portably, and picked at run time. Integer counts: both builds agree bit for bit. */
static inline __attribute__((always_inline)) int stream_histogram(const uint8_t *in, size_t len,
                                                                  size_t n, uint64_t counts[4])
{
    size_t groups = n / INC_LANES + (n % INC_LANES != 0), pos = 0;
    uint64_t c[4] = {0, 0, 0, 0};
    if (len > 0 && in == NULL)
        return INC_E_ARG;
    for (size_t g = 0; g < groups; g++) {
        unsigned key;
        size_t lanes = n - g * INC_LANES < INC_LANES ? n - g * INC_LANES : INC_LANES;
        ptrdiff_t need = check_group(in + pos, len - pos, lanes, &key);
        if (need < 0)
            return (int)need;
        unsigned lo = key & 0x5555u, hi = (key >> 1) & 0x5555u;
        unsigned n8 = (unsigned)__builtin_popcount(lo & ~hi), n16 = (unsigned)__builtin_popcount(hi & ~lo),
                 n32 = (unsigned)__builtin_popcount(lo & hi);
        c[1] += n8, c[2] += n16, c[3] += n32, c[0] += lanes - n8 - n16 - n32;
        pos += (size_t)need;
    }
    if (pos != len)
        return INC_E_TRAILING;
    for (int t = 0; t < 4; t++)
        counts[t] += c[t];
    return INC_OK;
}

static int stream_histogram_portable(const uint8_t *in, size_t len, size_t n, uint64_t counts[4])
{
    return stream_histogram(in, len, n, counts);
}

#if INC_X86
__attribute__((target("popcnt"))) static int stream_histogram_popcnt(const uint8_t *in, size_t len,
                                                                     size_t n, uint64_t counts[4])
{
    return stream_histogram(in, len, n, counts);
}
#endif

int inc_stream_histogram_impl(const uint8_t *in, size_t len, size_t n, uint64_t counts[4], int impl)
{
    if (impl == INC_IMPL_AUTO)
        impl = cpu_has_popcnt() ? INC_IMPL_AVX2 : INC_IMPL_SCALAR;
    if (impl == INC_IMPL_AVX2 && !cpu_has_popcnt())
        return INC_E_ARG;
#if INC_X86
    if (impl == INC_IMPL_AVX2)
        return stream_histogram_popcnt(in, len, n, counts);
#endif
    if (impl != INC_IMPL_SCALAR)
        return INC_E_ARG;
    return stream_histogram_portable(in, len, n, counts);
}

int inc_stream_histogram(const uint8_t *in, size_t len, size_t n, uint64_t counts[4])
{
    return inc_stream_histogram_impl(in, len, n, counts, INC_IMPL_AUTO);
}

/* --- in the ring (codec_table.h) --------------------------------------------------------------- */

static size_t ring_max_size(const struct re_codec *c, size_t n)
{
    (void)c;
    return inc_max_encoded_size(n);
}

static ptrdiff_t ring_encode(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap)
{
    return inc_encode(x, n, c->error_bound, out, cap, INC_IMPL_AUTO);
}

static int ring_decode(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n)
{
    (void)c;
    return inc_decode(in, len, out, n, NULL, INC_IMPL_AUTO);
}

static void ring_reconstruct(const struct re_codec *c, const float *x, size_t n, float *out)
{
    inc_reconstruct(x, n, c->error_bound, out);
}

void re_codec_inceptionn(struct re_codec *c, int k)
{
    *c = (struct re_codec){.name = "inceptionn", .scaled = 1, .error_bound = k, .max_encoded_size = ring_max_size,
                           .encode = ring_encode, .decode = ring_decode, .reconstruct = ring_reconstruct,
                           .strerror = inc_strerror};
}

static void ring_make(struct re_codec *c, void *state)
{
    re_codec_inceptionn(c, ((const struct re_inc *)state)->error_bound);
}

static int ring_begin(void *state, const struct re_call *call)
{
    ((struct re_inc *)state)->error_bound = call->error_bound;
    return 0;
}

static void ring_describe(const void *state, const struct re_call *call, char *out, size_t cap)
{
    (void)state;
    snprintf(out, cap, "inceptionn, error bound %d", call->error_bound);
}

static const struct re_inc DEFAULTS = {.error_bound = INCEPTIONN_DEFAULT_ERROR_BOUND};

/* per value (8-value groups, but every value decodes to its own reconstruction), scaled (absolute
 * precision: below 2^-7 most values become zero), error feedback (it brings back what was
 * dropped), stateless; the one codec the soft NIC runs */
const struct re_codec_desc re_codec_inceptionn_desc = {
    .name = "inceptionn", .per_value = 1, .wants_scaling = 1, .wants_error_feedback = 1, .thread_safe = 1,
    .app = 1, .nic = 1, .state_type = "struct re_inc", .state_size = sizeof DEFAULTS, .defaults = &DEFAULTS,
    .make = ring_make, .begin = ring_begin, .describe = ring_describe};
