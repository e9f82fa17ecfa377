/*
 * THC codec: randomized Hadamard transform, clamp, stochastic quantization to a lookup table,
 * bit packing, the homomorphic sum and the checked decoder. Scalar C; the numpy reference
 * (thc_reference.py) follows the same operation order and the tests hold the two bit-identical.
 */
#include "thc_codec.h"
#include "codec_util.h"

#include <float.h>
#include <string.h>

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
static void fwht_levels(float *x, size_t len, size_t h_from, size_t h_to)
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

int thc_fwht(float *x, size_t d)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    /* Every element sees the levels in the same order and each butterfly is one float add and
     * one subtract, so blocking changes nothing in the result, only the cache traffic. */
    size_t block = d < FWHT_BLOCK ? d : FWHT_BLOCK;
    for (size_t b = 0; b < d; b += block)
        fwht_levels(x + b, block, 1, block);
    fwht_levels(x, d, block, d);
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

static void apply_signs(float *x, size_t d, uint64_t seed)
{
    for (size_t w = 0; w * 64 < d; w++) {
        uint64_t bits = thc_random_word(seed, w);
        size_t end = d - w * 64 < 64 ? d - w * 64 : 64;
        float *v = x + w * 64;
        for (size_t i = 0; i < end; i++) { /* exact: flips the sign bit; branch-free */
            uint32_t u;
            memcpy(&u, &v[i], 4);
            u ^= (uint32_t)((bits >> i) & 1) << 31;
            memcpy(&v[i], &u, 4);
        }
    }
}

static void scale(float *x, size_t d, float s)
{
    for (size_t i = 0; i < d; i++)
        x[i] *= s;
}

int thc_rht(float *x, size_t d, uint64_t seed)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    apply_signs(x, d, seed);
    thc_fwht(x, d);
    scale(x, d, inv_sqrt_dim(d));
    return THC_OK;
}

int thc_irht(float *x, size_t d, uint64_t seed)
{
    if (!is_pow2(d) || x == NULL)
        return THC_E_ARG;
    thc_fwht(x, d);
    scale(x, d, inv_sqrt_dim(d));
    apply_signs(x, d, seed);
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

    /* zlo[k]: the last table index whose level is <= k, for k in [0, g). */
    uint8_t zlo[THC_MAX_GRANULARITY];
    size_t levels = (size_t)1 << bits;
    for (size_t z = 0, k = 0; k < (size_t)g; k++) {
        while (z + 2 < levels && table[z + 1] <= k)
            z++;
        zlo[k] = (uint8_t)z;
    }

    double gap[1 << THC_MAX_BITS];
    for (size_t z = 0; z + 1 < levels; z++)
        gap[z] = (double)(table[z + 1] - table[z]);

    int log2d = log2_of(d);
    write_header(out, THC_KIND_INDEX, bits, g, bits, log2d, 1, range, rot_seed, table);
    struct packer p = {out, THC_HEADER_BYTES + levels, 0, 0};
    double M = (double)range;
    double sc = range > 0.0f ? (double)g / (2.0 * M) : 0.0;
    for (size_t i = 0; i < d; i++) {
        float r = work[i];
        if (nonfinite(r))
            return THC_E_NONFINITE; /* the transform overflowed float */
        float c = r > range ? range : (r < -range ? -range : r);
        work[i] = c;
        uint32_t z = 0;
        if (range > 0.0f) {
            double y = ((double)c + M) * sc;
            if (y > (double)g)
                y = (double)g;
            int k = (int)y; /* 0 <= y <= g <= 255: a plain signed conversion */
            if (k > g - 1)
                k = g - 1;
            z = zlo[k];
            /* Round up with probability (y - lo) / (hi - lo): u * (hi - lo) < y - lo, where
             * u * (hi - lo) is exact (24-bit u, 8-bit gap), so no division is needed. */
            double u = (double)(thc_random_word(noise_seed, i) >> 40) * 0x1p-24;
            z += (u * gap[z] < y - (double)table[z]);
        }
        pack(&p, z, (unsigned)bits);
    }
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

/* Unpack and check the payload into sums S (as floats of the rotated mean written to work).
 * Returns a status; *err_at gets the byte offset of a bad element. */
static int decode_payload(const uint8_t *in, const struct thc_info *info, float *work, size_t *err_at)
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
            val[z] = (float)((double)((int64_t)(2 * (uint64_t)info->table[z]) - (int64_t)cmax) * f);
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
    } else {
        for (size_t i = 0; i < d; i++) {
            uint64_t s = unpack(&u, w);
            if (s > cmax) {
                *err_at = info->payload_offset + (i * w) / 8;
                return THC_E_VALUE;
            }
            work[i] = (float)((double)((int64_t)(2 * s) - (int64_t)cmax) * f);
        }
    }
    if (u.nbits > 0 && u.acc != 0) {
        *err_at = info->length - 1;
        return THC_E_VALUE;
    }
    return THC_OK;
}

static int decode_common(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at,
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
    r = decode_payload(in, info, work, &at);
    if (r != THC_OK && err_at)
        *err_at = at;
    return r;
}

int thc_decode_rotated(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at)
{
    struct thc_info info;
    return decode_common(in, len, n, work, err_at, &info);
}

int thc_decode(const uint8_t *in, size_t len, size_t n, float *work, float *out, size_t *err_at)
{
    if (n > 0 && out == NULL)
        return THC_E_ARG;
    struct thc_info info;
    int r = decode_common(in, len, n, work, err_at, &info);
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
