/*
 * AVX2 kernels of the INCEPTIONN codec, in the shape of streamvbyte's 0/1/2/4-byte variant:
 * tags come from three exponent compares, the 8 lane words are built in one register, and each
 * half (4 lanes, an 8-bit key) is packed or unpacked with one pshufb from a 256-entry table.
 * Fields are computed as floor(|x| * 2^w) in float arithmetic, which equals the spec's shift
 * formula for every value of the tier (scaling by a power of two is exact).
 *
 * Functions carry target("avx2") so the file builds without -mavx2; the driver only calls them
 * after checking the CPU.
 */
#include "inceptionn_codec.h"
#include "inceptionn_codec_internal.h"

#if INC_X86
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2")))
#ifndef ENCODE_PREFETCH_BYTES
#define ENCODE_PREFETCH_BYTES 2048
#endif

static uint8_t enc_shuffle[256][16];
static uint8_t dec_shuffle[256][16];
static uint8_t half_bytes[256]; /* payload bytes of 4 lanes under an 8-bit key */
static uint16_t spread_bits[256]; /* bit i of the index moved to bit 2i */

__attribute__((constructor)) static void build_tables(void)
{
    static const uint8_t lane_bytes[4] = {0, 1, 2, 4};
    for (unsigned key = 0; key < 256; key++) {
        unsigned o = 0;
        memset(enc_shuffle[key], 0x80, 16);
        memset(dec_shuffle[key], 0x80, 16);
        for (unsigned j = 0; j < 4; j++) {
            unsigned len = lane_bytes[(key >> (2 * j)) & 3];
            for (unsigned b = 0; b < len; b++) {
                enc_shuffle[key][o + b] = (uint8_t)(4 * j + b);
                dec_shuffle[key][4 * j + b] = (uint8_t)(o + b);
            }
            o += len;
        }
        half_bytes[key] = (uint8_t)o;
        uint16_t s = 0;
        for (unsigned i = 0; i < 8; i++)
            s |= (uint16_t)(((key >> i) & 1u) << (2 * i));
        spread_bits[key] = s;
    }
}

size_t AVX2 inc__encode_avx2(const float *in, size_t full_groups, uint32_t eb, uint32_t mid,
                             uint8_t *out, size_t cap, size_t *pos_io)
{
    const __m256i exp_mask = _mm256_set1_epi32(0xFF);
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i below_eb = _mm256_set1_epi32((int)eb - 1);
    const __m256i below_mid = _mm256_set1_epi32((int)mid - 1);
    const __m256i below_one = _mm256_set1_epi32(126);
    const __m256 scale16 = _mm256_set1_ps(32768.0f);
    const __m256 scale8 = _mm256_set1_ps(128.0f);
    size_t pos = *pos_io, g = 0;

    for (; g < full_groups && cap - pos >= INC_MAX_GROUP_BYTES; g++) {
        /* Every store address hangs on the running offset, which caps how far out-of-order
         * execution runs ahead; fetch the input early so that chain never waits on DRAM. */
        _mm_prefetch((const char *)(in + g * INC_LANES) + ENCODE_PREFETCH_BYTES, _MM_HINT_T0);
        __m256i bits = _mm256_loadu_si256((const __m256i *)(in + g * INC_LANES));
        __m256i e = _mm256_and_si256(_mm256_srli_epi32(bits, 23), exp_mask);
        __m256i ge_eb = _mm256_cmpgt_epi32(e, below_eb);
        __m256i ge_mid = _mm256_cmpgt_epi32(e, below_mid);
        __m256i ge_one = _mm256_cmpgt_epi32(e, below_one);
        /* The masks nest (ge_one => ge_mid => ge_eb), so tag = their count:
         * bit 0 is their parity and bit 1 is ge_mid. */
        __m256i bit0 = _mm256_xor_si256(_mm256_xor_si256(ge_eb, ge_mid), ge_one);
        unsigned b0 = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(bit0));
        unsigned b1 = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(ge_mid));
        unsigned key = spread_bits[b0] | (unsigned)(spread_bits[b1] << 1);

        __m256 ax = _mm256_castsi256_ps(_mm256_and_si256(bits, abs_mask));
        __m256i sign = _mm256_srli_epi32(bits, 31);
        __m256i f16 = _mm256_or_si256(_mm256_cvttps_epi32(_mm256_mul_ps(ax, scale16)),
                                      _mm256_slli_epi32(sign, 15));
        __m256i f8 = _mm256_or_si256(_mm256_cvttps_epi32(_mm256_mul_ps(ax, scale8)),
                                     _mm256_slli_epi32(sign, 7));
        __m256i w = _mm256_blendv_epi8(f8, f16, ge_mid);
        w = _mm256_blendv_epi8(w, bits, ge_one);

        uint8_t *o = out + pos;
        unsigned klo = key & 0xFF, khi = key >> 8;
        o[0] = (uint8_t)key;
        o[1] = (uint8_t)(key >> 8);
        __m128i lo = _mm_shuffle_epi8(_mm256_castsi256_si128(w),
                                      _mm_loadu_si128((const __m128i *)enc_shuffle[klo]));
        __m128i hi = _mm_shuffle_epi8(_mm256_extracti128_si256(w, 1),
                                      _mm_loadu_si128((const __m128i *)enc_shuffle[khi]));
        /* Each store writes 16 bytes; the second ends at most 34 bytes past o, inside cap. */
        _mm_storeu_si128((__m128i *)(o + 2), lo);
        _mm_storeu_si128((__m128i *)(o + 2 + half_bytes[klo]), hi);
        pos += 2u + half_bytes[klo] + half_bytes[khi];
    }
    *pos_io = pos;
    return g;
}

size_t AVX2 inc__decode_avx2(const uint8_t *in, size_t len, float *out, size_t full_groups,
                             size_t *pos_io)
{
    /* Per-tag constants picked with permutevar8x32 (index = tag 0..3). */
    const __m256i field_mask = _mm256_setr_epi32(0, 0x7F, 0x7FFF, 0, 0, 0, 0, 0);
    const __m256i field_width = _mm256_setr_epi32(0, 7, 15, 0, 0, 0, 0, 0);
    const __m256 field_scale = _mm256_setr_ps(0.0f, 0x1p-7f, 0x1p-15f, 0.0f, 0, 0, 0, 0);
    const __m256i lane_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i three = _mm256_set1_epi32(3);
    const __m256i one = _mm256_set1_epi32(1);
    size_t pos = *pos_io, g = 0;

    /* A group is at most 34 bytes, so with 34 bytes left every load below stays in bounds. */
    for (; g < full_groups && len - pos >= INC_MAX_GROUP_BYTES; g++) {
        const uint8_t *p = in + pos;
        unsigned key = (unsigned)p[0] | ((unsigned)p[1] << 8);
        unsigned klo = key & 0xFF, khi = key >> 8;
        __m128i a = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 2)),
                                     _mm_loadu_si128((const __m128i *)dec_shuffle[klo]));
        __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 2 + half_bytes[klo])),
                                     _mm_loadu_si128((const __m128i *)dec_shuffle[khi]));
        __m256i w = _mm256_set_m128i(b, a);
        __m256i tag = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)key), lane_shift),
                                       three);
        __m256i f = _mm256_and_si256(w, _mm256_permutevar8x32_epi32(field_mask, tag));
        __m256i s = _mm256_and_si256(
            _mm256_srlv_epi32(w, _mm256_permutevar8x32_epi32(field_width, tag)), one);
        /* f * 2^-w is exactly the spec's reconstruction; f == 0 gives a zero of sign s. */
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(f), _mm256_permutevar8x32_ps(field_scale, tag));
        __m256i r = _mm256_or_si256(_mm256_castps_si256(v), _mm256_slli_epi32(s, 31));
        r = _mm256_blendv_epi8(r, w, _mm256_cmpeq_epi32(tag, three));
        _mm256_storeu_si256((__m256i *)(out + g * INC_LANES), r);
        pos += 2u + half_bytes[klo] + half_bytes[khi];
    }
    *pos_io = pos;
    return g;
}
#endif
