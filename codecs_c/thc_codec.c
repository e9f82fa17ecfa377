/*
 * THC codec: randomized Hadamard transform, clamp, stochastic quantization to a lookup table,
 * bit packing, the homomorphic sum and the checked decoder. Scalar C; the numpy reference
 * (thc_reference.py) follows the same operation order and the tests hold the two bit-identical.
 */
#include "thc_codec.h"
#include "codec_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if CU_X86
#include <immintrin.h>
#endif

#define GOLDEN 0x9E3779B97F4A7C15ull
#define FWHT_BLOCK 2048 /* floats per cache block for the low levels (8 KiB) */

const char *thc_strerror(int status)
{
    switch (status) {
    case THC_OK: return "ok";
    case THC_E_ARG: return "bad argument";
    case THC_E_SPACE: return "output buffer too small";
    case THC_E_TRUNCATED: return "blob shorter than its header says";
    case THC_E_TRAILING: return "bytes left after the payload";
    case THC_E_HEADER: return "bad header (magic, version, kind, bits, granularity, width, count)";
    case THC_E_TABLE: return "bad lookup table";
    case THC_E_COUNT: return "padded dimension does not match the value count";
    case THC_E_VALUE: return "payload value out of range or nonzero padding bits";
    case THC_E_MISMATCH: return "blobs differ in parameters, table, dimension, range or seed";
    case THC_E_OVERFLOW: return "sum would overflow its element width";
    case THC_E_NONFINITE: return "non-finite value, or range M not finite, negative or above FLT_MAX / d";
    default: return "unknown error";
    }
}

size_t thc_padded_dim(size_t n)
{
    size_t d = 1;
    while (d < n) {
        if (d >= ((size_t)1 << THC_MAX_LOG2_DIM))
            return 0;
        d <<= 1;
    }
    return d;
}

static int log2_of(size_t d)
{
    int k = 0;
    while (((size_t)1 << k) < d)
        k++;
    return k;
}

size_t thc_blob_size(size_t n, int bits, int width)
{
    size_t d = thc_padded_dim(n);
    if (d == 0 || bits < 1 || bits > THC_MAX_BITS || width < 1 || width > 32)
        return 0;
    return THC_HEADER_BYTES + ((size_t)1 << bits) + bits_to_bytes(d, (size_t)width);
}

uint64_t thc_random_word(uint64_t seed, uint64_t j)
{
    return mix64(seed + (j + 1) * GOLDEN);
}

double thc_sum_squares(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

/* M is usable for d padded values when it is finite, >= 0 and M * d <= FLT_MAX: a decoded
 * rotated value is at most M in magnitude, the unnormalised inverse Hadamard transform's partial
 * sums at most M * d (rounding is monotone and M * 2^j is exact), so every decoded value is
 * finite. A larger M is refused rather than decoded to inf/NaN (docs/spec.md keeps the operation
 * order: scaling before the transform would change every decode by a rounding). */
static int range_ok(float range, size_t d)
{
    return !nonfinite(range) && range >= 0.0f && (double)range * (double)d <= (double)FLT_MAX;
}

static inline int is_pow2(size_t d)
{
    return d != 0 && (d & (d - 1)) == 0;
}

/* Levels h = h_from, 2*h_from, ... < h_to over x[0..len), two levels per pass where it can
 * (radix 4: each element still sees one add or subtract per level, in level order, so the
 * result is the same float for float as level by level, with half the passes over memory). */
static inline __attribute__((always_inline)) void fwht_levels(float *x, size_t len, size_t h_from, size_t h_to)
{
    size_t h = h_from;
    if (h == 1 && h < h_to) {
        for (size_t i = 0; i < len; i += 2) {
            float a = x[i], b = x[i + 1];
            x[i] = a + b;
            x[i + 1] = a - b;
        }
        h = 2;
    }
    for (; 4 * h <= h_to; h *= 4) {
        for (size_t i = 0; i < len; i += 4 * h) {
            float *p0 = x + i, *p1 = p0 + h, *p2 = p1 + h, *p3 = p2 + h;
            for (size_t j = 0; j < h; j++) {
                float s0 = p0[j] + p1[j], s1 = p0[j] - p1[j];
                float s2 = p2[j] + p3[j], s3 = p2[j] - p3[j];
                p0[j] = s0 + s2;
                p1[j] = s1 + s3;
                p2[j] = s0 - s2;
                p3[j] = s1 - s3;
            }
        }
    }
    if (h < h_to) {
        for (size_t i = 0; i < len; i += 2 * h) {
            float *lo = x + i, *hi = x + i + h;
            for (size_t j = 0; j < h; j++) {
                float a = lo[j], b = hi[j];
                lo[j] = a + b;
                hi[j] = a - b;
            }
        }
    }
}

#define FWHT_STRIP 16     /* columns (floats) of a strip of the upper levels: one cache line a row */
#define FWHT_ROWS 512     /* rows of a strip: the upper levels done in one pass, up to 2^9 of them */

/* Levels FWHT_BLOCK .. S/2 of a super-block of S = rows * FWHT_BLOCK values: the FWHT of length
 * rows over each column j (elements j + k * FWHT_BLOCK), FWHT_STRIP columns at a time copied to a
 * contiguous strip (the rows are FWHT_BLOCK floats apart: every row on the same cache sets), so
 * all of those levels take one pass over memory. The same butterflies in the same level order. */
static inline __attribute__((always_inline)) void fwht_upper(float *x, size_t rows)
{
    float t[FWHT_ROWS * FWHT_STRIP];
    for (size_t j = 0; j < FWHT_BLOCK; j += FWHT_STRIP) {
        for (size_t k = 0; k < rows; k++)
            memcpy(t + k * FWHT_STRIP, x + j + k * FWHT_BLOCK, sizeof(float) * FWHT_STRIP);
        fwht_levels(t, rows * FWHT_STRIP, FWHT_STRIP, rows * FWHT_STRIP);
        for (size_t k = 0; k < rows; k++)
            memcpy(x + j + k * FWHT_BLOCK, t + k * FWHT_STRIP, sizeof(float) * FWHT_STRIP);
    }
}

#if CU_X86
/* Levels 1, 2 and 4 of each group of 8 in registers (SSE2, x86-64's baseline): a - b computed as
 * a + (-b), the same IEEE operation, so the same bits as fwht_levels. len: a multiple of 8. */
static inline __attribute__((always_inline)) void fwht_low8(float *x, size_t len)
{
    const __m128 odd = _mm_castsi128_ps(_mm_set_epi32((int)0x80000000, 0, (int)0x80000000, 0));
    const __m128 high = _mm_castsi128_ps(_mm_set_epi32((int)0x80000000, (int)0x80000000, 0, 0));
    for (size_t i = 0; i < len; i += 8) {
        __m128 v[2] = {_mm_loadu_ps(x + i), _mm_loadu_ps(x + i + 4)};
        for (int k = 0; k < 2; k++) {
            /* h = 1: [a, a, c, c] + [b, -b, d, -d] */
            __m128 u = _mm_shuffle_ps(v[k], v[k], _MM_SHUFFLE(2, 2, 0, 0));
            __m128 w = _mm_xor_ps(_mm_shuffle_ps(v[k], v[k], _MM_SHUFFLE(3, 3, 1, 1)), odd);
            v[k] = _mm_add_ps(u, w);
            /* h = 2: [A, B, A, B] + [C, D, -C, -D] */
            u = _mm_movelh_ps(v[k], v[k]);
            w = _mm_xor_ps(_mm_movehl_ps(v[k], v[k]), high);
            v[k] = _mm_add_ps(u, w);
        }
        _mm_storeu_ps(x + i, _mm_add_ps(v[0], v[1]));       /* h = 4 */
        _mm_storeu_ps(x + i + 4, _mm_sub_ps(v[0], v[1]));
    }
}
#endif

/* The levels inside one block of len = min(d, FWHT_BLOCK) values. */
static inline __attribute__((always_inline)) void fwht_block(float *x, size_t len)
{
#if CU_X86
    if (len >= 8) {
        fwht_low8(x, len);
        fwht_levels(x, len, 8, len);
        return;
    }
#endif
    fwht_levels(x, len, 1, len);
}

/* The levels from FWHT_BLOCK up (none when d <= FWHT_BLOCK). */
static inline __attribute__((always_inline)) void fwht_upper_levels(float *x, size_t d)
{
    if (d <= FWHT_BLOCK)
        return;
    size_t rows = d / FWHT_BLOCK < FWHT_ROWS ? d / FWHT_BLOCK : FWHT_ROWS, super = rows * FWHT_BLOCK;
    for (size_t b = 0; b < d; b += super)
        fwht_upper(x + b, rows);
    fwht_levels(x, d, super, d);
}

static inline __attribute__((always_inline)) void fwht_kernel(float *x, size_t d)
{
    /* Every element sees the levels in the same order and each butterfly is one float add and
     * one subtract, so blocking changes nothing in the result, only the cache traffic. */
    size_t block = d < FWHT_BLOCK ? d : FWHT_BLOCK;
    for (size_t b = 0; b < d; b += block)
        fwht_block(x + b, block);
    fwht_upper_levels(x, d);
}

/* name(params): kernel(args) compiled twice, for x86-64's baseline and for AVX2, the AVX2 build run
 * where the CPU has it and INCEPTIONN_CODEC_SIMD allows (cpu_has_avx2): the same operations in
 * the same order, so the same bits. */
#if CU_X86
#define SIMD_DISPATCH(name, kernel, params, args)                                                  \
    __attribute__((target("avx2"))) static void name##_avx2 params { kernel args; }                \
    static void name params                                                                        \
    {                                                                                              \
        if (cpu_has_avx2())                                                                        \
            name##_avx2 args;                                                                      \
        else                                                                                       \
            kernel args;                                                                           \
    }
#else
#define SIMD_DISPATCH(name, kernel, params, args) static void name params { kernel args; }
#endif

SIMD_DISPATCH(fwht_all, fwht_kernel, (float *x, size_t d), (x, d))
/* thc_fwht in two halves: fwht_low on every block of min(d, FWHT_BLOCK), then fwht_high. */
SIMD_DISPATCH(fwht_low, fwht_block, (float *x, size_t len), (x, len))
SIMD_DISPATCH(fwht_high, fwht_upper_levels, (float *x, size_t d), (x, d))

int thc_fwht(float *x, size_t d)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    fwht_all(x, d);
    return THC_OK;
}

/* 1/sqrt(d) in float for d = 2^k: 2^(-k/2), or float(sqrt(0.5)) * 2^(-(k-1)/2) for odd k.
 * Exact power-of-two scalings of one constant, so numpy gets the same float. */
static float inv_sqrt_dim(size_t d)
{
    int k = log2_of(d);
    float s = (k & 1) ? 0x1.6a09e6p-1f : 1.0f;
    for (int i = 0; i < k / 2; i++)
        s *= 0.5f;
    return s;
}

/* o[i] = v[i] * s with its sign flipped where bit i of b is 1, i < m <= 32 (exact flips;
 * branch-free: vector shifts where the CPU has them). */
static inline __attribute__((always_inline)) void scale_flip(float *o, const float *v, size_t m, uint32_t b, float s)
{
    for (uint32_t i = 0; i < m; i++) {
        float f = v[i] * s;
        uint32_t u;
        memcpy(&u, &f, 4);
        u ^= (b >> i) << 31;
        memcpy(&o[i], &u, 4);
    }
}

/* dst[0..m) = src[0..m) with the signs of D (seed) from position `at` (a multiple of 64), scaled by
 * s first (scale, then flip: thc_irht's order; s = 1 changes no float); src may be dst. Each
 * 32-bit half of a word shifted by the lane's position: vector shifts where the CPU has them. */
static inline __attribute__((always_inline)) void signs_kernel(float *dst, const float *src, size_t m, size_t at,
                                                               uint64_t seed, float s)
{
    for (size_t w = 0; w * 64 < m; w++) {
        uint64_t bits = thc_random_word(seed, (at / 64) + w);
        size_t end = m - w * 64 < 64 ? m - w * 64 : 64;
        for (size_t h = 0; h * 32 < end; h++) {
            uint32_t b = (uint32_t)(bits >> (32 * h));
            size_t e = end - h * 32 < 32 ? end - h * 32 : 32;
            scale_flip(dst + w * 64 + h * 32, src + w * 64 + h * 32, e, b, s);
        }
    }
}

SIMD_DISPATCH(signs_copy, signs_kernel, (float *dst, const float *src, size_t m, size_t at, uint64_t seed, float s),
              (dst, src, m, at, seed, s))

static void scale(float *x, size_t d, float s)
{
    for (size_t i = 0; i < d; i++)
        x[i] *= s;
}

float thc_rht_scale(size_t d)
{
    return is_pow2(d) ? inv_sqrt_dim(d) : 0.0f;
}

int thc_rotate_unscaled(const float *in, size_t n, size_t d, uint64_t seed, float *work)
{
    if (!is_pow2(d) || n > d || work == NULL || (n > 0 && in == NULL))
        return THC_E_ARG;
    /* block by block: the signs while copying in, then the block's levels while it is in cache */
    size_t block = d < FWHT_BLOCK ? d : FWHT_BLOCK;
    for (size_t b = 0; b < d; b += block) {
        size_t m = b >= n ? 0 : (n - b < block ? n - b : block);
        if (m > 0)
            signs_copy(work + b, in + b, m, b, seed, 1.0f);
        if (m < block)
            memset(work + b + m, 0, (block - m) * sizeof(float)); /* -0.0 or +0.0: the same sums */
        fwht_low(work + b, block);
    }
    fwht_high(work, d);
    return THC_OK;
}

/* The upper levels of one super-block covering all of x[0..d) (FWHT_BLOCK < d <= FWHT_BLOCK *
 * FWHT_ROWS), each strip's last level followed by thc_irht's scale and signs while it is copied
 * out to out[0..n) instead of back to x: the same floats as thc_fwht then signs_copy, one pass
 * fewer. */
static inline __attribute__((always_inline)) void upper_out_kernel(float *x, size_t d, uint64_t seed, float s,
                                                                   float *out, size_t n)
{
    float t[FWHT_ROWS * FWHT_STRIP];
    size_t rows = d / FWHT_BLOCK;
    for (size_t j = 0; j < FWHT_BLOCK; j += FWHT_STRIP) {
        for (size_t k = 0; k < rows; k++)
            memcpy(t + k * FWHT_STRIP, x + j + k * FWHT_BLOCK, sizeof(float) * FWHT_STRIP);
        fwht_levels(t, rows * FWHT_STRIP, FWHT_STRIP, rows * FWHT_STRIP);
        for (size_t k = 0; k < rows; k++) {
            size_t at = j + k * FWHT_BLOCK;
            if (at >= n)
                continue;
            size_t m = n - at < FWHT_STRIP ? n - at : FWHT_STRIP;
            uint32_t b = (uint32_t)(thc_random_word(seed, at / 64) >> (at % 64)); /* FWHT_STRIP <= 32 bits */
            scale_flip(out + at, t + k * FWHT_STRIP, m, b, s);
        }
    }
}

SIMD_DISPATCH(upper_out, upper_out_kernel, (float *x, size_t d, uint64_t seed, float s, float *out, size_t n),
              (x, d, seed, s, out, n))

int thc_unrotate(float *work, size_t d, uint64_t seed, float *out, size_t n)
{
    if (!is_pow2(d) || n > d || work == NULL || (n > 0 && out == NULL))
        return THC_E_ARG;
    if (d <= FWHT_BLOCK || d > (size_t)FWHT_BLOCK * FWHT_ROWS || n == 0) {
        thc_fwht(work, d);
        if (n > 0)
            signs_copy(out, work, n, 0, seed, inv_sqrt_dim(d));
        return THC_OK;
    }
    for (size_t b = 0; b < d; b += FWHT_BLOCK)
        fwht_low(work + b, FWHT_BLOCK);
    upper_out(work, d, seed, inv_sqrt_dim(d), out, n);
    return THC_OK;
}

int thc_rht(float *x, size_t d, uint64_t seed)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    signs_copy(x, x, d, 0, seed, 1.0f);
    thc_fwht(x, d);
    scale(x, d, inv_sqrt_dim(d));
    return THC_OK;
}

int thc_irht(float *x, size_t d, uint64_t seed)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    thc_fwht(x, d);
    signs_copy(x, x, d, 0, seed, inv_sqrt_dim(d)); /* scale, then the signs */
    return THC_OK;
}

int thc_check_table(const uint8_t *table, int bits, int g)
{
    if (table == NULL || bits < 1 || bits > THC_MAX_BITS || g > THC_MAX_GRANULARITY ||
        g < (1 << bits) - 1)
        return THC_E_ARG;
    size_t levels = (size_t)1 << bits;
    if (table[0] != 0 || table[levels - 1] != g)
        return THC_E_TABLE;
    for (size_t z = 1; z < levels; z++)
        if (table[z] <= table[z - 1])
            return THC_E_TABLE;
    return THC_OK;
}

struct unpacker {
    const uint8_t *in;
    size_t pos;
    uint64_t acc;
    unsigned nbits;
};

/* The caller has checked that the payload holds every element it asks for. */
static inline uint32_t unpack(struct unpacker *u, unsigned w)
{
    while (u->nbits < w) {
        u->acc |= (uint64_t)u->in[u->pos++] << u->nbits;
        u->nbits += 8;
    }
    uint32_t v = (uint32_t)(u->acc & ((w == 32) ? 0xFFFFFFFFull : ((1ull << w) - 1)));
    u->acc >>= w;
    u->nbits -= w;
    return v;
}

static void write_header(uint8_t *o, int kind, int bits, int g, int width, int log2d, uint32_t count,
                         float range, uint64_t seed, const uint8_t *table)
{
    o[0] = THC_MAGIC;
    o[1] = THC_VERSION;
    o[2] = (uint8_t)kind;
    o[3] = (uint8_t)bits;
    o[4] = (uint8_t)g;
    o[5] = (uint8_t)width;
    o[6] = (uint8_t)log2d;
    o[7] = 0;
    put_u32(o + 8, count);
    put_u32(o + 12, f2u(range));
    for (int i = 0; i < 8; i++)
        o[16 + i] = (uint8_t)(seed >> (8 * i));
    memcpy(o + THC_HEADER_BYTES, table, (size_t)1 << bits);
}

/* Stochastic rounding of a clamped rotated coordinate to a table index (spec.md section 6). */
struct quant {
    uint8_t zlo[THC_MAX_GRANULARITY]; /* zlo[k]: the last table index whose level is <= k, k in [0, g) */
    uint8_t table[1 << THC_MAX_BITS];
    double gap[1 << THC_MAX_BITS];
    float range;
    double M, sc;
    int g;
};

static void quant_init(struct quant *q, float range, int bits, int g, const uint8_t *table)
{
    size_t levels = (size_t)1 << bits;
    for (size_t z = 0, k = 0; k < (size_t)g; k++) {
        while (z + 2 < levels && table[z + 1] <= k)
            z++;
        q->zlo[k] = (uint8_t)z;
    }
    memcpy(q->table, table, levels);
    for (size_t z = 0; z + 1 < levels; z++)
        q->gap[z] = (double)(table[z + 1] - table[z]);
    q->range = range;
    q->M = (double)range;
    q->sc = range > 0.0f ? (double)g / (2.0 * q->M) : 0.0;
    q->g = g;
}

/* c: the clamped coordinate, word: its random word (thc_random_word(noise seed, i)). */
static inline uint32_t quant_one(const struct quant *q, float c, uint64_t word)
{
    if (!(q->range > 0.0f))
        return 0;
    double y = ((double)c + q->M) * q->sc;
    if (y > (double)q->g)
        y = (double)q->g;
    int k = (int)y; /* 0 <= y <= g <= 255: a plain signed conversion */
    if (k > q->g - 1)
        k = q->g - 1;
    uint32_t z = q->zlo[k];
    /* Round up with probability (y - lo) / (hi - lo): u * (hi - lo) < y - lo, where
     * u * (hi - lo) is exact (24-bit u, 8-bit gap), so no division is needed. */
    double u = (double)(word >> 40) * 0x1p-24;
    return z + (u * q->gap[z] < y - (double)q->table[z]);
}

ptrdiff_t thc_encode(const float *in, size_t n, float range, uint64_t rot_seed, uint64_t noise_seed,
                     int bits, int g, const uint8_t *table, float *work, uint8_t *out, size_t cap)
{
    if ((n > 0 && in == NULL) || work == NULL || out == NULL)
        return THC_E_ARG;
    int t = thc_check_table(table, bits, g);
    if (t != THC_OK)
        return t;
    size_t d = thc_padded_dim(n);
    if (d == 0)
        return THC_E_ARG;
    if (!range_ok(range, d))
        return THC_E_NONFINITE;
    size_t need = thc_blob_size(n, bits, bits);
    if (cap < need)
        return THC_E_SPACE;
    for (size_t i = 0; i < n; i++)
        if (nonfinite(in[i]))
            return THC_E_NONFINITE;

    if (n > 0)
        memcpy(work, in, n * sizeof(float));
    if (d > n)
        memset(work + n, 0, (d - n) * sizeof(float));
    thc_rht(work, d, rot_seed);

    struct quant q;
    quant_init(&q, range, bits, g, table);
    size_t levels = (size_t)1 << bits;
    int log2d = log2_of(d);
    write_header(out, THC_KIND_INDEX, bits, g, bits, log2d, 1, range, rot_seed, table);
    struct packer p = {out, THC_HEADER_BYTES + levels, 0, 0};
    for (size_t i = 0; i < d; i++) {
        float r = work[i];
        if (nonfinite(r))
            return THC_E_NONFINITE; /* the transform overflowed float */
        float c = r > range ? range : (r < -range ? -range : r);
        work[i] = c;
        pack(&p, quant_one(&q, c, thc_random_word(noise_seed, i)), (unsigned)bits);
    }
    pack_flush(&p);
    return (ptrdiff_t)p.pos;
}

/* The loop of thc_quantize, its tables in locals (no byte store can alias them), in blocks whose
 * indices are kept as ints until written out. */
static inline __attribute__((always_inline)) int quantize_kernel(float *restrict r, size_t d, float scale,
                                                                 const struct quant *q, const float *val,
                                                                 uint64_t noise_seed, uint8_t *restrict z)
{
    int32_t zlo[THC_MAX_GRANULARITY + 1], table[1 << THC_MAX_BITS]; /* 32-bit: gathers where the CPU has them */
    double gap[1 << THC_MAX_BITS];
    float v[1 << THC_MAX_BITS];
    for (size_t k = 0; k < THC_MAX_GRANULARITY; k++)
        zlo[k] = q->zlo[k];
    zlo[THC_MAX_GRANULARITY] = 0;
    for (size_t k = 0; k < (1 << THC_MAX_BITS); k++)
        table[k] = q->table[k];
    memcpy(gap, q->gap, sizeof gap);
    memcpy(v, val, sizeof v);
    const float range = q->range;
    const double M = q->M, sc = q->sc, gd = (double)q->g;
    const int32_t g1 = q->g - 1;
    uint32_t bad = 0;
    int32_t kb[256];
    uint64_t base = noise_seed;
    for (size_t i0 = 0; i0 < d; i0 += 256) {
        size_t m = d - i0 < 256 ? d - i0 : 256;
        float *rr = r + i0;
        for (size_t i = 0; i < m; i++) {
            float x = rr[i] * scale; /* scale 1: x itself */
            uint32_t u32;
            memcpy(&u32, &x, 4);
            bad |= (u32 & 0x7F800000u) == 0x7F800000u;
            float c = x > range ? range : x;
            c = c < -range ? -range : c;
            /* noise_seed + (i + 1) * GOLDEN: thc_random_word(noise_seed, i) */
            uint64_t word = mix64(base + (uint64_t)(i0 + i + 1) * GOLDEN);
            double y = ((double)c + M) * sc;
            y = y > gd ? gd : y;
            int32_t k = (int32_t)y;
            k = k > g1 ? g1 : k;
            int32_t zz = zlo[k];
            double u = (double)(int32_t)(uint32_t)(word >> 40) * 0x1p-24;
            zz += (u * gap[zz] < y - (double)table[zz]);
            kb[i] = zz;
            rr[i] = x - v[zz];
        }
        for (size_t i = 0; i < m; i++)
            z[i0 + i] = (uint8_t)kb[i];
    }
    return bad;
}

#if CU_X86
/* a * b mod 2^64 per 64-bit lane (AVX2 has no 64-bit multiply): lo*lo + ((hi*lo + lo*hi) << 32). */
__attribute__((target("avx2"))) static inline __m256i mul64(__m256i a, __m256i b)
{
    __m256i lo = _mm256_mul_epu32(a, b);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                     _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

/* quantize_kernel four coordinates at a time for tables of up to 16 levels and g <= 31 (THC's
 * b = 4 tables): the same operations on the same types (the double math, splitmix64), the table
 * lookups as byte shuffles (zlo of k < 32, T of z < 16) and a float permute (the values), so the
 * same indices and residuals; other tables take quantize_kernel. */
__attribute__((target("avx2"))) static int quantize_avx2(float *r, size_t d, float scale, const struct quant *q,
                                                         const float *val, uint64_t noise_seed, uint8_t *z)
{
    if (d < 4 || q->g > 31 || q->table[15] == 0 || q->table[16] != 0)   /* exactly 16 levels */
        return quantize_kernel(r, d, scale, q, val, noise_seed, z);
    /* q->table past its 16 levels is 0 (the caller memsets q) */
    uint8_t zl[32] = {0}, tb[16] = {0};
    memcpy(zl, q->zlo, (size_t)q->g);
    memcpy(tb, q->table, 16);
    const __m128i zlo_lo = _mm_loadu_si128((const __m128i *)(const void *)zl);
    const __m128i zlo_hi = _mm_loadu_si128((const __m128i *)(const void *)(zl + 16));
    const __m128i ttab = _mm_loadu_si128((const __m128i *)(const void *)tb);
    const __m256 val_lo = _mm256_loadu_ps(val), val_hi = _mm256_loadu_ps(val + 8);
    const __m128i hibytes = _mm_set1_epi32((int)0x80808000u), fifteen = _mm_set1_epi32(15), one = _mm_set1_epi32(1);
    const __m128i seven = _mm_set1_epi32(7);
    const __m128 vscale = _mm_set1_ps(scale), vr = _mm_set1_ps(q->range), vnr = _mm_set1_ps(-q->range);
    const __m128i expo = _mm_set1_epi32(0x7F800000);
    const __m256d vM = _mm256_set1_pd(q->M), vsc = _mm256_set1_pd(q->sc), vg = _mm256_set1_pd((double)q->g);
    const __m128i vg1 = _mm_set1_epi32(q->g - 1);
    const __m256i c1 = _mm256_set1_epi64x((long long)0xBF58476D1CE4E5B9ull);
    const __m256i c2 = _mm256_set1_epi64x((long long)0x94D049BB133111EBull);
    const __m256i step = _mm256_set1_epi64x((long long)(4 * GOLDEN));
    const __m256i magic = _mm256_set1_epi64x(0x4330000000000000ll); /* 2^52: exact int -> double */
    const __m256d vmagic = _mm256_set1_pd(4503599627370496.0), u24 = _mm256_set1_pd(0x1p-24);
    const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128i bytes = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i ctr = _mm256_setr_epi64x((long long)(noise_seed + GOLDEN), (long long)(noise_seed + 2 * GOLDEN),
                                     (long long)(noise_seed + 3 * GOLDEN), (long long)(noise_seed + 4 * GOLDEN));
    __m128i bad = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 4 <= d; i += 4) {
        __m128 x = _mm_mul_ps(_mm_loadu_ps(r + i), vscale);
        bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(x), expo), expo));
        /* x > range ? range : x, then c < -range ? -range : c (NaN: flagged above) */
        __m128 c = _mm_blendv_ps(x, vr, _mm_cmpgt_ps(x, vr));
        c = _mm_blendv_ps(c, vnr, _mm_cmplt_ps(c, vnr));
        __m256d y = _mm256_mul_pd(_mm256_add_pd(_mm256_cvtps_pd(c), vM), vsc);
        y = _mm256_blendv_pd(y, vg, _mm256_cmp_pd(y, vg, _CMP_GT_OQ));
        __m128i k = _mm_min_epi32(_mm256_cvttpd_epi32(y), vg1);
        /* zlo[k], k < 32: a shuffle of each half, picked by k >= 16 (bytes 1-3 of a lane: 0x80, zero) */
        __m128i ki = _mm_or_si128(k, hibytes);
        __m128i zz = _mm_blendv_epi8(_mm_shuffle_epi8(zlo_lo, ki), _mm_shuffle_epi8(zlo_hi, ki),
                                     _mm_cmpgt_epi32(k, fifteen));
        /* splitmix64 of noise_seed + (i + 1) * GOLDEN */
        __m256i w = _mm256_xor_si256(ctr, _mm256_srli_epi64(ctr, 30));
        w = mul64(w, c1);
        w = _mm256_xor_si256(w, _mm256_srli_epi64(w, 27));
        w = mul64(w, c2);
        w = _mm256_xor_si256(w, _mm256_srli_epi64(w, 31));
        ctr = _mm256_add_epi64(ctr, step);
        __m256d u = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(w, 40), magic)), vmagic);
        u = _mm256_mul_pd(u, u24);
        /* T[z] and T[z + 1] (z <= levels - 2 < 15), the gap as the difference of the two */
        __m128i t0 = _mm_shuffle_epi8(ttab, _mm_or_si128(zz, hibytes));
        __m128i t1 = _mm_shuffle_epi8(ttab, _mm_or_si128(_mm_add_epi32(zz, one), hibytes));
        __m256d gap = _mm256_cvtepi32_pd(_mm_sub_epi32(t1, t0));
        __m256d lo = _mm256_cvtepi32_pd(t0);
        __m256d up = _mm256_cmp_pd(_mm256_mul_pd(u, gap), _mm256_sub_pd(y, lo), _CMP_LT_OQ);
        __m128i up32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(up), pick));
        zz = _mm_sub_epi32(zz, up32);                /* + 1 where rounded up (the mask is -1) */
        /* val[z], z < 16: a permute of each half, picked by z >= 8 */
        __m256i zi = _mm256_castsi128_si256(zz);
        __m128 v = _mm_blendv_ps(_mm256_castps256_ps128(_mm256_permutevar8x32_ps(val_lo, zi)),
                                 _mm256_castps256_ps128(_mm256_permutevar8x32_ps(val_hi, zi)),
                                 _mm_castsi128_ps(_mm_cmpgt_epi32(zz, seven)));
        _mm_storeu_ps(r + i, _mm_sub_ps(x, v));
        int32_t four = _mm_cvtsi128_si32(_mm_shuffle_epi8(zz, bytes));
        memcpy(z + i, &four, 4);
    }
    int any = _mm_movemask_epi8(bad) != 0;
    if (i < d) /* d is a power of two >= 4: none left; kept for safety */
        any |= quantize_kernel(r + i, d - i, scale, q, val, noise_seed + i * GOLDEN, z + i);
    return any;
}
#endif

/* The table and the range M for d padded values, as thc_encode checks them. */
static int check_quantizer(const uint8_t *table, int bits, int g, float range, size_t d)
{
    int t = thc_check_table(table, bits, g);
    if (t != THC_OK)
        return t;
    return range_ok(range, d) ? THC_OK : THC_E_NONFINITE;
}

int thc_quantize(float *r, size_t d, float scale, float range, uint64_t noise_seed, int bits, int g,
                 const uint8_t *table, uint8_t *z)
{
    if (!is_pow2(d) || r == NULL || z == NULL)
        return THC_E_ARG;
    int t = check_quantizer(table, bits, g, range, d);
    if (t != THC_OK)
        return t;
    struct quant q;
    memset(&q, 0, sizeof q);
    quant_init(&q, range, bits, g, table);
    /* what thc_decode_rotated gives index z of a one-worker blob (decode_payload, count 1) */
    float val[1 << THC_MAX_BITS] = {0};
    double f = (double)range / ((double)g * 1.0);
    for (size_t k = 0; k < ((size_t)1 << bits); k++)
        val[k] = (float)((double)((int64_t)(2 * (uint64_t)table[k]) - (int64_t)g) * f);
    int bad;
    if (!(range > 0.0f)) { /* M = 0: every index 0 (thc_encode's), whose value is 0 */
        bad = 0;
        for (size_t i = 0; i < d; i++) {
            float x = r[i] * scale;
            bad |= nonfinite(x);
            z[i] = 0;
            r[i] = x - val[0];
        }
    } else
#if CU_X86
    if (cpu_has_avx2())
        bad = quantize_avx2(r, d, scale, &q, val, noise_seed, z);
    else
#endif
        bad = quantize_kernel(r, d, scale, &q, val, noise_seed, z);
    return bad ? THC_E_NONFINITE : THC_OK;
}

ptrdiff_t thc_pack_indices(const uint8_t *z, size_t d, float range, uint64_t rot_seed, int bits, int g,
                           const uint8_t *table, uint8_t *out, size_t cap)
{
    if (!is_pow2(d) || d > ((size_t)1 << THC_MAX_LOG2_DIM) || z == NULL || out == NULL)
        return THC_E_ARG;
    int t = check_quantizer(table, bits, g, range, d);
    if (t != THC_OK)
        return t;
    size_t levels = (size_t)1 << bits, need = thc_blob_size(d, bits, bits);
    if (cap < need)
        return THC_E_SPACE;
    for (size_t i = 0; i < d; i++)
        if (z[i] >= levels)
            return THC_E_ARG;
    write_header(out, THC_KIND_INDEX, bits, g, bits, log2_of(d), 1, range, rot_seed, table);
    uint8_t *o = out + THC_HEADER_BYTES + levels;
    if (bits == 4 && d >= 2) {
        for (size_t i = 0; i < d / 2; i++)
            o[i] = (uint8_t)(z[2 * i] | (z[2 * i + 1] << 4));
        return (ptrdiff_t)need;
    }
    struct packer p = {out, THC_HEADER_BYTES + levels, 0, 0};
    for (size_t i = 0; i < d; i++)
        pack(&p, z[i], (unsigned)bits);
    pack_flush(&p);
    return (ptrdiff_t)p.pos;
}

int thc_inspect(const uint8_t *in, size_t len, struct thc_info *info)
{
    if ((len > 0 && in == NULL) || info == NULL)
        return THC_E_ARG;
    memset(info, 0, sizeof *info);
    if (len >= 1 && in[0] != THC_MAGIC)
        return THC_E_HEADER;
    if (len >= 2 && in[1] != THC_VERSION)
        return THC_E_HEADER;
    if (len < THC_HEADER_BYTES)
        return THC_E_TRUNCATED;
    int kind = in[2], bits = in[3], g = in[4], width = in[5], log2d = in[6];
    uint32_t count = get_u32(in + 8);
    if (kind != THC_KIND_INDEX && kind != THC_KIND_SUM)
        return THC_E_HEADER;
    if (bits < 1 || bits > THC_MAX_BITS || g < (1 << bits) - 1 || in[7] != 0 || log2d > THC_MAX_LOG2_DIM)
        return THC_E_HEADER;
    if (kind == THC_KIND_INDEX ? (width != bits || count != 1)
                               : ((width != 8 && width != 16 && width != 32) || count == 0 ||
                                  (uint64_t)count * (uint64_t)g > (width == 32 ? 0xFFFFFFFFull : (1ull << width) - 1)))
        return THC_E_HEADER;
    float range = u2f(get_u32(in + 12));
    if (!range_ok(range, (size_t)1 << log2d))
        return THC_E_NONFINITE;
    size_t levels = (size_t)1 << bits;
    if (len < THC_HEADER_BYTES + levels)
        return THC_E_TRUNCATED;
    if (thc_check_table(in + THC_HEADER_BYTES, bits, g) != THC_OK)
        return THC_E_TABLE;
    size_t d = (size_t)1 << log2d;
    size_t total = THC_HEADER_BYTES + levels + bits_to_bytes(d, (size_t)width);
    if (len < total)
        return THC_E_TRUNCATED;
    if (len > total)
        return THC_E_TRAILING;
    info->kind = kind;
    info->bits = bits;
    info->granularity = g;
    info->width = width;
    info->log2_dim = log2d;
    info->count = count;
    info->range = range;
    info->seed = 0;
    for (int i = 7; i >= 0; i--)
        info->seed = (info->seed << 8) | in[16 + i];
    memcpy(info->table, in + THC_HEADER_BYTES, levels);
    info->payload_offset = THC_HEADER_BYTES + levels;
    info->length = total;
    return THC_OK;
}

/* Header offsets of the fields a status points at, for err_at. */
static size_t header_fault_offset(const uint8_t *in, size_t len, int status)
{
    if (status == THC_E_TRUNCATED || status == THC_E_TRAILING)
        return len;
    if (status == THC_E_TABLE)
        return THC_HEADER_BYTES;
    if (status == THC_E_NONFINITE)
        return 12;
    for (size_t i = 0; i < 8 && i < len; i++) {
        static const uint8_t ok_first[2] = {THC_MAGIC, THC_VERSION};
        if (i < 2 && in[i] != ok_first[i])
            return i;
    }
    return 2;
}

/* Unpack and check the payload into sums S (as floats of the rotated mean written to work, each
 * then multiplied by the float k: 1 for the mean, the count for the sum; k = 1 leaves every float as
 * it is). Returns a status; *err_at gets the byte offset of a bad element. */
static int decode_payload(const uint8_t *in, const struct thc_info *info, float k, float *work, size_t *err_at)
{
    size_t d = (size_t)1 << info->log2_dim;
    unsigned w = (unsigned)info->width;
    uint64_t cmax = (uint64_t)info->count * (uint64_t)info->granularity;
    double f = (double)info->range / ((double)info->granularity * (double)info->count);
    struct unpacker u = {in + info->payload_offset, 0, 0, 0};
    if (info->kind == THC_KIND_INDEX) {
        /* Every b-bit index is valid: one value per table entry, looked up. */
        float val[1 << THC_MAX_BITS];
        for (size_t z = 0; z < ((size_t)1 << info->bits); z++)
            val[z] = (float)((double)((int64_t)(2 * (uint64_t)info->table[z]) - (int64_t)cmax) * f) * k;
        if (w == 4) {
            const uint8_t *p = in + info->payload_offset;
            for (size_t i = 0; i + 1 < d; i += 2) {
                work[i] = val[p[i / 2] & 15];
                work[i + 1] = val[p[i / 2] >> 4];
            }
            if (d == 1)
                work[0] = val[p[0] & 15];
            u.pos = (d + 1) / 2;
            u.acc = d == 1 ? (uint64_t)(p[0] >> 4) : 0;
            u.nbits = d == 1 ? 4 : 0;
        } else {
            for (size_t i = 0; i < d; i++)
                work[i] = val[unpack(&u, w)];
        }
    } else if (w == 8) {
        /* 8-bit sums: one value per possible byte, looked up; a byte above count * g is refused */
        float val[256];
        const uint8_t *p = in + info->payload_offset;
        for (size_t s = 0; s < 256; s++)
            val[s] = (float)((double)((int64_t)(2 * s) - (int64_t)cmax) * f) * k;
        uint8_t hi = 0;
        for (size_t i = 0; i < d; i++) {
            hi = p[i] > hi ? p[i] : hi;
            work[i] = val[p[i]];
        }
        if (hi > cmax) {
            size_t i = 0;
            while (p[i] <= cmax)
                i++;
            *err_at = info->payload_offset + i;
            return THC_E_VALUE;
        }
        u.pos = d;
    } else {
        for (size_t i = 0; i < d; i++) {
            uint64_t s = unpack(&u, w);
            if (s > cmax) {
                *err_at = info->payload_offset + (i * w) / 8;
                return THC_E_VALUE;
            }
            work[i] = (float)((double)((int64_t)(2 * s) - (int64_t)cmax) * f) * k;
        }
    }
    if (u.nbits > 0 && u.acc != 0) {
        *err_at = info->length - 1;
        return THC_E_VALUE;
    }
    return THC_OK;
}

static int decode_common(const uint8_t *in, size_t len, size_t n, float k, float *work, size_t *err_at,
                         struct thc_info *info)
{
    size_t at = 0;
    if (err_at)
        *err_at = 0;
    if ((len > 0 && in == NULL) || work == NULL)
        return THC_E_ARG;
    int r = thc_inspect(in, len, info);
    if (r != THC_OK) {
        if (err_at)
            *err_at = header_fault_offset(in, len, r);
        return r;
    }
    size_t d = thc_padded_dim(n);
    if (d == 0 || d != ((size_t)1 << info->log2_dim)) {
        if (err_at)
            *err_at = 6;
        return THC_E_COUNT;
    }
    r = decode_payload(in, info, k, work, &at);
    if (r != THC_OK && err_at)
        *err_at = at;
    return r;
}

int thc_decode_rotated(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at)
{
    struct thc_info info;
    return decode_common(in, len, n, 1.0f, work, err_at, &info);
}

int thc_decode_rotated_sum(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at)
{
    struct thc_info info;
    if (len >= THC_HEADER_BYTES && in != NULL)
        return decode_common(in, len, n, (float)get_u32(in + 8), work, err_at, &info);
    return decode_common(in, len, n, 1.0f, work, err_at, &info);  /* refused by thc_inspect */
}

int thc_decode(const uint8_t *in, size_t len, size_t n, float *work, float *out, size_t *err_at)
{
    if (n > 0 && out == NULL)
        return THC_E_ARG;
    struct thc_info info;
    int r = decode_common(in, len, n, 1.0f, work, err_at, &info);
    if (r != THC_OK)
        return r;
    thc_irht(work, (size_t)1 << info.log2_dim, info.seed);
    if (n > 0)
        memcpy(out, work, n * sizeof(float));
    return THC_OK;
}

static inline uint32_t get_elem(const uint8_t *p, size_t i, unsigned width)
{
    if (width == 8)
        return p[i];
    if (width == 16)
        return (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8);
    return get_u32(p + 4 * i);
}

static inline void put_elem(uint8_t *p, size_t i, unsigned width, uint32_t v)
{
    if (width == 8) {
        p[i] = (uint8_t)v;
    } else if (width == 16) {
        p[2 * i] = (uint8_t)v;
        p[2 * i + 1] = (uint8_t)(v >> 8);
    } else {
        for (int k = 0; k < 4; k++)
            p[4 * i + k] = (uint8_t)(v >> (8 * k));
    }
}

ptrdiff_t thc_sum(const uint8_t *const *blobs, const size_t *lens, size_t count, size_t n, int width,
                  uint8_t *out, size_t cap, size_t *err_at)
{
    if (err_at)
        *err_at = 0;
    if (blobs == NULL || lens == NULL || out == NULL || count == 0 ||
        (width != 8 && width != 16 && width != 32))
        return THC_E_ARG;
    size_t d = thc_padded_dim(n);
    if (d == 0)
        return THC_E_ARG;
    struct thc_info first, info;
    uint64_t total = 0;
    for (size_t b = 0; b < count; b++) {
        if (err_at)
            *err_at = b;
        struct thc_info *cur = b == 0 ? &first : &info;
        if (blobs[b] == NULL && lens[b] > 0)
            return THC_E_ARG;
        int r = thc_inspect(blobs[b], lens[b], cur);
        if (r != THC_OK)
            return r;
        if (d != ((size_t)1 << cur->log2_dim))
            return THC_E_COUNT;
        if (b > 0 && (cur->bits != first.bits || cur->granularity != first.granularity ||
                      memcmp(cur->table, first.table, (size_t)1 << first.bits) != 0 ||
                      cur->log2_dim != first.log2_dim || f2u(cur->range) != f2u(first.range) ||
                      cur->seed != first.seed))
            return THC_E_MISMATCH;
        total += cur->count;
    }
    uint64_t limit = width == 32 ? 0xFFFFFFFFull : (1ull << width) - 1;
    if (total * (uint64_t)first.granularity > limit) /* total <= count * 2^32: no wrap */
        return THC_E_OVERFLOW;
    size_t need = thc_blob_size(n, first.bits, width);
    if (cap < need)
        return THC_E_SPACE;

    write_header(out, THC_KIND_SUM, first.bits, first.granularity, width, first.log2_dim, (uint32_t)total,
                 first.range, first.seed, first.table);
    uint8_t *payload = out + first.payload_offset;
    memset(payload, 0, need - first.payload_offset);
    for (size_t b = 0; b < count; b++) {
        if (err_at)
            *err_at = b;
        struct thc_info *cur = &info;
        thc_inspect(blobs[b], lens[b], cur); /* checked above */
        unsigned w = (unsigned)cur->width;
        uint64_t cmax = (uint64_t)cur->count * (uint64_t)cur->granularity;
        struct unpacker u = {blobs[b] + cur->payload_offset, 0, 0, 0};
        for (size_t i = 0; i < d; i++) {
            uint32_t v = unpack(&u, w);
            uint32_t s;
            if (cur->kind == THC_KIND_INDEX) {
                s = cur->table[v];
            } else {
                if (v > cmax)
                    return THC_E_VALUE;
                s = v;
            }
            put_elem(payload, i, (unsigned)width, get_elem(payload, i, (unsigned)width) + s);
        }
        if (u.nbits > 0 && u.acc != 0)
            return THC_E_VALUE;
    }
    if (err_at)
        *err_at = 0;
    return (ptrdiff_t)need;
}

/* Elements [i0, i0 + m) of a checked blob's payload (m <= 2048, i0 a multiple of 8 past the first
 * call: u carries the position), as the table values (kind 0) or sums (kind 1) they stand for;
 * THC_E_VALUE when a sum exceeds count * g. */
static int read_elems(const struct thc_info *info, struct unpacker *u, size_t m, uint32_t *v)
{
    unsigned w = (unsigned)info->width;
    const uint8_t *p = u->in + u->pos;
    if (info->kind == THC_KIND_INDEX) {
        if (w == 4 && u->nbits == 0 && m % 2 == 0) {
            for (size_t i = 0; i < m / 2; i++) {
                v[2 * i] = info->table[p[i] & 15];
                v[2 * i + 1] = info->table[p[i] >> 4];
            }
            u->pos += m / 2;
        } else {
            for (size_t i = 0; i < m; i++)
                v[i] = info->table[unpack(u, w)];
        }
        return THC_OK;
    }
    uint32_t cmax = (uint32_t)((uint64_t)info->count * (uint64_t)info->granularity), hi = 0;
    if (w == 8 && u->nbits == 0) {
        for (size_t i = 0; i < m; i++)
            v[i] = p[i];
        u->pos += m;
    } else if (w == 16 && u->nbits == 0) {
        for (size_t i = 0; i < m; i++)
            v[i] = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8);
        u->pos += 2 * m;
    } else {
        for (size_t i = 0; i < m; i++)
            v[i] = unpack(u, w);
    }
    for (size_t i = 0; i < m; i++)
        hi = v[i] > hi ? v[i] : hi;
    return hi > cmax ? THC_E_VALUE : THC_OK;
}

ptrdiff_t thc_add_indices(const uint8_t *in, size_t len, const uint8_t *z, size_t d, int width, uint8_t *out,
                          size_t cap, size_t *err_at)
{
    size_t at = 0;
    if (err_at)
        *err_at = 0;
    if ((len > 0 && in == NULL) || z == NULL || out == NULL || (width != 8 && width != 16 && width != 32))
        return THC_E_ARG;
    struct thc_info info;
    int r = thc_inspect(in, len, &info);
    if (r != THC_OK) {
        if (err_at)
            *err_at = header_fault_offset(in, len, r);
        return r;
    }
    if (d != ((size_t)1 << info.log2_dim)) {
        if (err_at)
            *err_at = 6;
        return THC_E_COUNT;
    }
    uint64_t total = (uint64_t)info.count + 1;
    if (total > 0xFFFFFFFFull || total * (uint64_t)info.granularity > (width == 32 ? 0xFFFFFFFFull : (1ull << width) - 1))
        return THC_E_OVERFLOW;
    size_t levels = (size_t)1 << info.bits, need = thc_blob_size(d, info.bits, width);
    if (cap < need)
        return THC_E_SPACE;
    if (out == in || (out < in + len && in < out + need))
        return THC_E_ARG;
    write_header(out, THC_KIND_SUM, info.bits, info.granularity, width, info.log2_dim, (uint32_t)total, info.range,
                 info.seed, info.table);
    uint8_t *o = out + info.payload_offset;
    const uint8_t *p = in + info.payload_offset;
    if (width == 8 && (info.kind == THC_KIND_SUM ? info.width == 8 : (info.width == 4 && d >= 2))) {
        /* byte sums (the ring up to 255 / g contributions): one pass, sums <= count * g checked
         * before anything is written, T[z] looked up from the indices */
        uint8_t t[256] = {0}, zmax = 0;
        memcpy(t, info.table, levels);
        if (info.kind == THC_KIND_SUM) {
            uint8_t hi = 0;
            for (size_t i = 0; i < d; i++)
                hi = p[i] > hi ? p[i] : hi;
            if (hi > info.count * (uint64_t)info.granularity) {
                size_t i = 0;
                while (p[i] <= info.count * (uint64_t)info.granularity)
                    i++;
                if (err_at)
                    *err_at = info.payload_offset + i;
                return THC_E_VALUE;
            }
            for (size_t i = 0; i < d; i++) {
                zmax = z[i] > zmax ? z[i] : zmax;
                o[i] = (uint8_t)(p[i] + t[z[i]]);
            }
        } else {
            for (size_t i = 0; i < d / 2; i++) {
                uint8_t a = z[2 * i], b = z[2 * i + 1];
                zmax = a > zmax ? a : zmax;
                zmax = b > zmax ? b : zmax;
                o[2 * i] = (uint8_t)(t[p[i] & 15] + t[a]);
                o[2 * i + 1] = (uint8_t)(t[p[i] >> 4] + t[b]);
            }
        }
        return zmax >= levels ? THC_E_ARG : (ptrdiff_t)need;
    }
    struct unpacker u = {p, 0, 0, 0};
    uint32_t v[2048];
    int bad_z = 0;
    for (size_t i0 = 0; i0 < d; i0 += 2048) {
        size_t m = d - i0 < 2048 ? d - i0 : 2048;
        if ((r = read_elems(&info, &u, m, v)) != THC_OK) {
            at = info.payload_offset + (i0 * (size_t)info.width) / 8;
            if (err_at)
                *err_at = at;
            return r;
        }
        const uint8_t *zz = z + i0;
        for (size_t i = 0; i < m; i++) {
            bad_z |= zz[i] >= levels;
            v[i] += info.table[zz[i] & (levels - 1)];
        }
        if (width == 8) {
            for (size_t i = 0; i < m; i++)
                o[i0 + i] = (uint8_t)v[i];
        } else if (width == 16) {
            for (size_t i = 0; i < m; i++) {
                o[2 * (i0 + i)] = (uint8_t)v[i];
                o[2 * (i0 + i) + 1] = (uint8_t)(v[i] >> 8);
            }
        } else {
            for (size_t i = 0; i < m; i++)
                put_u32(o + 4 * (i0 + i), v[i]);
        }
    }
    if (bad_z)
        return THC_E_ARG;
    if (u.nbits > 0 && u.acc != 0) {
        if (err_at)
            *err_at = info.length - 1;
        return THC_E_VALUE;
    }
    return (ptrdiff_t)need;
}

/* --- in the ring (codec_table.h): THC ---------------------------------------------------------- */

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

void re_codec_thc(struct re_codec *c, void *state)
{
    *c = (struct re_codec){.name = "thc", .state = state, .max_encoded_size = thc_max_size, .encode = thc_enc,
                           .decode = thc_dec, .sum_encoded = thc_add, .count_encoded = thc_count,
                           .encode_sum = thc_enc_sum, .release = thc_release, .strerror = thc_strerror};
}

/* the norm of the vector to encode (thc.py local_stat), +inf when not finite */
static double thc_local_stat(const float *x, size_t n)
{
    double norm = sqrt(thc_sum_squares(x, n));
    return isfinite(norm) ? norm : INFINITY;
}

/* The call's parameters: the agreed norm, the round's rotation seed (thc.py round_seed of
 * get_codec("thc")'s seed 0) and this rank's noise seed for the round. 1 when the agreed norm is
 * not finite or the range M would not fit THC's float32 header for the largest block
 * (thc_encode's limit, M * d <= FLT_MAX). */
static int thc_begin(void *state, const struct re_call *call)
{
    struct re_thc *s = state;
    size_t d = thc_padded_dim(call->block);
    if (!isfinite(call->shared) || d == 0 || !(s->t_p * call->shared * sqrt((double)d) <= FLT_MAX))
        return 1;
    s->ranks = call->ranks;
    s->norm = call->shared;
    s->rot_seed = thc_random_word(0, call->round);
    s->noise_seed = thc_random_word(call->seed, call->round);
    return 0;
}

static void thc_describe(const void *state, const struct re_call *call, char *out, size_t cap)
{
    (void)call;
    const struct re_thc *s = state;
    int n = snprintf(out, cap, "thc (bits %d, granularity %d, t_p %.17g, table", s->bits, s->granularity, s->t_p);
    for (int i = 0; i < (1 << s->bits) && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%c%d", i ? ',' : ' ', s->table[i]);
    if (n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, ")");
}


static const struct re_thc THC_DEFAULTS = {.bits = THC_DEFAULT_BITS, .granularity = THC_DEFAULT_GRANULARITY,
                                           .table = THC_DEFAULT_TABLE, .t_p = THC_DEFAULT_T_P};

/* a whole tensor per encode (the rotation), error feedback, every worker on the agreed norm and
 * seeds; summed in the encoded domain */
const struct re_codec_desc re_codec_thc_desc = {
    .name = "thc", .wants_error_feedback = 1, .needs_agreement = 1, .app = 1, .summed = 1,
    .state_type = "struct re_thc", .state_size = sizeof THC_DEFAULTS, .defaults = &THC_DEFAULTS, .make = re_codec_thc,
    .local_stat = thc_local_stat, .begin = thc_begin, .describe = thc_describe};
