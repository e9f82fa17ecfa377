/*
 * THC, Tensor Homomorphic Compression (NSDI 2024), as fixed by docs/spec.md section 6.
 *
 * A worker rotates its (error-compensated) vector with a randomized Hadamard transform
 * R = H D x / sqrt(d) (x zero-padded to d = the next power of two, D a Rademacher diagonal drawn
 * from a seed every worker shares for the round), clamps R to [-M, M] with M = t_p * l / sqrt(d)
 * (l = max over workers of ||x||, agreed beforehand), and stochastically quantizes each
 * coordinate to one of 2^b levels T[0] = 0 < ... < T[2^b-1] = g of the grid {-M + i*2M/g}.
 * It sends the b-bit table indices z. A peer (parameter server, switch, ring neighbour) sums the
 * table values T[z] as small integers without decoding; a worker decodes a sum S of c
 * contributions as the mean  (2S - c*g) * M / (g*c)  and applies the inverse transform.
 *
 * Wire format (all little-endian), one self-contained blob:
 *
 *   off  size  field
 *   0    1     magic 0x54 ('T')
 *   1    1     version 1
 *   2    1     kind: 0 = indices (one worker), 1 = sum of table values (count workers)
 *   3    1     b, bits per index, 1..8
 *   4    1     g, granularity, 2^b - 1 .. 255
 *   5    1     w, bits per payload element: kind 0: w == b; kind 1: 8, 16 or 32
 *   6    1     log2(d), 0..31: d = 2^log2(d) payload elements (the padded dimension)
 *   7    1     reserved, 0
 *   8    4     count, u32: contributions summed (1 for kind 0), count * g <= 2^w - 1
 *   12   4     M, f32: the clamp range [-M, M]; finite, >= 0, M * d <= FLT_MAX (so the inverse
 *              transform of any payload stays finite)
 *   16   8     rotation seed, u64
 *   24   2^b   table T, u8 each: T[0] = 0, strictly increasing, T[2^b - 1] = g
 *   24+2^b     payload: d elements of w bits, element i at bit offset i*w, LSB first; kind 0:
 *              indices z; kind 1: sums S <= count * g. Unused bits of the last byte are 0.
 *
 * The blob is exactly 24 + 2^b + ceil(d*w/8) bytes. Random bits (C and numpy agree exactly):
 *   mix(z) = splitmix64 finaliser; word_j(seed) = mix(seed + (j+1) * 0x9E3779B97F4A7C15).
 *   D_i = -1 when bit (i mod 64) of word_{i/64}(rotation seed) is 1, else +1.
 *   Stochastic rounding of coordinate i uses u_i = (word_i(noise seed) >> 40) * 2^-24.
 *
 * Every decoder entry point checks every read against the input length: this faces the network.
 */
#ifndef THC_CODEC_H
#define THC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define THC_MAGIC 0x54
#define THC_VERSION 1
#define THC_HEADER_BYTES 24
#define THC_MAX_BITS 8
#define THC_MAX_GRANULARITY 255
#define THC_MAX_LOG2_DIM 31

/* get_codec("thc")'s defaults (codecs_c/thc.py), for C callers (the MPI library, the ring
 * benchmark): 4 bits, granularity 30, p = 1/32, the shipped optimal table T_{4,30,1/32}
 * (thc_table_generated.py) and t_p = Phi^-1(1 - p/2) on thc_table_generator's 2^-40 grid;
 * tests/test_pmpi_codecs.py holds them to Python's. */
#define THC_DEFAULT_BITS 4
#define THC_DEFAULT_GRANULARITY 30
#define THC_DEFAULT_TABLE {0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 21, 23, 25, 27, 30}
#define THC_DEFAULT_T_P 0x1.13b22a7d56800p+1

enum thc_kind { THC_KIND_INDEX = 0, THC_KIND_SUM = 1 };

enum thc_status {
    THC_OK = 0,
    THC_E_ARG = -1,       /* bad argument (parameters out of range, NULL buffer) */
    THC_E_SPACE = -2,     /* output buffer too small */
    THC_E_TRUNCATED = -3, /* input shorter than its header says */
    THC_E_TRAILING = -4,  /* bytes after the payload */
    THC_E_HEADER = -5,    /* bad magic, version, kind, b, g, w, reserved byte or count */
    THC_E_TABLE = -6,     /* table not 0 = T[0] < ... < T[2^b-1] = g */
    THC_E_COUNT = -7,     /* padded dimension does not match the value count n */
    THC_E_VALUE = -8,     /* a sum above count * g, or nonzero padding bits */
    THC_E_MISMATCH = -9,  /* blobs to sum differ in b, g, table, d, M or seed */
    THC_E_OVERFLOW = -10, /* the sum's count * g does not fit its element width */
    THC_E_NONFINITE = -11 /* M not finite, negative or above FLT_MAX / d, or a non-finite input value */
};

/* What thc_inspect reads from a header (after checking it and the blob length). */
struct thc_info {
    int kind;
    int bits;
    int granularity;
    int width;
    int log2_dim;
    uint32_t count;
    float range;
    uint64_t seed;
    uint8_t table[256];
    size_t payload_offset;
    size_t length;
};

/* d = the smallest power of two >= max(n, 1); 0 when that exceeds 2^31. */
size_t thc_padded_dim(size_t n);

/* Bytes of a blob for n values with 2^bits table entries and w-bit payload elements; 0 when
 * n is too large or bits/width are out of range. */
size_t thc_blob_size(size_t n, int bits, int width);

/* splitmix64 word j of the stream seeded with seed (see the header comment). */
uint64_t thc_random_word(uint64_t seed, uint64_t j);

/* Sum of squares in double, left to right: ||x||^2. */
double thc_sum_squares(const float *x, size_t n);

/* In-place fast Walsh-Hadamard transform (unnormalised) of x[0..d), d a power of two. */
int thc_fwht(float *x, size_t d);

/* In place: x = H D x / sqrt(d), and its inverse x = D H x / sqrt(d). */
int thc_rht(float *x, size_t d, uint64_t seed);
int thc_irht(float *x, size_t d, uint64_t seed);

/* THC_OK when the table is 0 = T[0] < ... < T[2^bits-1] = g (and bits, g in range). */
int thc_check_table(const uint8_t *table, int bits, int g);

/*
 * Encode in[0..n) (the error-compensated vector). work[0..d) is caller scratch (d from
 * thc_padded_dim(n)); on return it holds the clamped rotated vector. Writes a kind-0 blob of
 * thc_blob_size(n, bits, bits) bytes to out (capacity cap). Returns the bytes written or a status.
 */
ptrdiff_t thc_encode(const float *in, size_t n, float range, uint64_t rot_seed, uint64_t noise_seed,
                     int bits, int g, const uint8_t *table, float *work, uint8_t *out, size_t cap);

/* Check a blob's header and total length (not the payload). */
int thc_inspect(const uint8_t *in, size_t len, struct thc_info *info);

/*
 * Decode a blob (either kind) holding n values: the mean of its contributions, inverse-rotated,
 * into out[0..n). work[0..d) is caller scratch (the padded result). Checks the whole blob before
 * writing out; on error *err_at (if not NULL) gets the byte offset of the fault.
 */
int thc_decode(const uint8_t *in, size_t len, size_t n, float *work, float *out, size_t *err_at);

/* The same mean in the rotated domain, before the inverse transform: work[0..d). */
int thc_decode_rotated(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at);

/*
 * The homomorphic sum: add `count` blobs of either kind (same b, g, table, d, M and seed; all
 * for n values) into one kind-1 blob with `width`-bit elements (8, 16 or 32), without decoding.
 * Refuses (THC_E_OVERFLOW) when the summed count * g exceeds 2^width - 1. Returns bytes written
 * (thc_blob_size(n, b, width)) or a status; *err_at gets the index of the blob at fault.
 */
ptrdiff_t thc_sum(const uint8_t *const *blobs, const size_t *lens, size_t count, size_t n, int width,
                  uint8_t *out, size_t cap, size_t *err_at);

/*
 * The ring's fast path (codecs_c/thc_codec.c, "in the ring"): a worker's stream built in pieces, never
 * decoded back.
 *
 * thc_rotate_unscaled: work[0..d) = H D [in, 0, ...] (d a power of two >= n), thc_rht without its
 * final 1/sqrt(d), which thc_quantize applies (scale = thc_rht_scale(d)): the same floats as
 * thc_rht of the zero-padded input, one pass fewer. thc_unrotate: out[0..n) = the first n values of
 * thc_irht(work) (work is clobbered), its scale and signs applied while copying out.
 *
 * thc_quantize: r[i] * scale (scale 1: r[i]) is coordinate i of the rotated, zero-padded vector
 * (thc_rht, not clamped), d a power of two; z[i] gets the table index thc_encode writes for it (the
 * same clamp, the same noise thc_random_word(noise_seed, i), the same comparison), and r[i]
 * becomes r[i] * scale - v(z[i]), v the value thc_decode_rotated gives that index in a one-worker
 * blob: the rounding residual in the rotated domain, whose inverse transform is
 * x - thc_decode(the stream) up to float rounding. THC_E_NONFINITE when a coordinate is not
 * finite (z and r are then written anyway).
 */
float thc_rht_scale(size_t d);
int thc_rotate_unscaled(const float *in, size_t n, size_t d, uint64_t seed, float *work);
int thc_unrotate(float *work, size_t d, uint64_t seed, float *out, size_t n);
int thc_quantize(float *r, size_t d, float scale, float range, uint64_t noise_seed, int bits, int g,
                 const uint8_t *table, uint8_t *z);

/* z[0..d) (indices < 2^bits) as the kind-0 blob thc_encode would write: thc_blob_size(d, bits, bits)
 * bytes, or a status. */
ptrdiff_t thc_pack_indices(const uint8_t *z, size_t d, float range, uint64_t rot_seed, int bits, int g,
                           const uint8_t *table, uint8_t *out, size_t cap);

/*
 * The homomorphic add of one worker's indices z[0..d) (< 2^b of the blob's b) to a received blob
 * of either kind (checked as thc_sum checks it: header, length, every sum <= count * g, padding
 * bits), in one pass, without a blob of z: a kind-1 blob of count + 1 contributions, width-bit
 * elements (8, 16 or 32; THC_E_OVERFLOW when (count + 1) * g does not fit), the parameters and
 * table of `in`. The same bytes as thc_sum of `in` and thc_pack_indices(z) at that width. Returns
 * the bytes written or a status; *err_at gets the byte offset of a fault in `in`. out must not
 * overlap in.
 */
ptrdiff_t thc_add_indices(const uint8_t *in, size_t len, const uint8_t *z, size_t d, int width, uint8_t *out,
                          size_t cap, size_t *err_at);

/* The SUM of a blob's contributions in the rotated domain: thc_decode_rotated's mean times the
 * count as a float32 multiply (exact for a count that is a power of two), same checks. */
int thc_decode_rotated_sum(const uint8_t *in, size_t len, size_t n, float *work, size_t *err_at);

const char *thc_strerror(int status);

/*
 * THC in the ring (codec_table.h) for one call, summed in the encoded domain.
 * Every rank holds the same bits, granularity, table, t_p, agreed norm and rotation seed; a
 * block of n values is quantized on the range M = t_p * norm / sqrt(d), d its padded length
 * (thc.py range_for). noise_seed is this rank's own: encode k of the call rounds with
 * thc_random_word(noise_seed, k) (encodes counts them). ranks: the most contributions a stream
 * sums (sizes the frames). The fields after encodes are the adapter's scratch (zero: none yet),
 * reused by every encode and decode of a call and freed by re_thc_release, which re_allreduce
 * calls when it returns (the codec's release): a caller that zero-initialises the struct and uses
 * it only through re_allreduce has nothing to free.
 */
struct re_thc {
    int bits, granularity, ranks;
    uint8_t table[256];
    double t_p, norm;
    uint64_t rot_seed, noise_seed, encodes;
    float *work;        /* scratch: work_dim floats */
    uint8_t *index;     /* scratch: work_dim table indices */
    size_t work_dim;
};

void re_codec_thc(struct re_codec *c, void *state);   /* state: a struct re_thc */

/* Frees the scratch of s (idempotent; the other fields are left as they are). */
void re_thc_release(struct re_thc *s);

#ifdef __cplusplus
}
#endif
#endif
