/*
 * Internal helpers shared by the codec sources (the codecs_c NAME_codec.c files): float bit casts,
 * little-endian 32-bit fields, the splitmix64 finalizer, LSB-first bit packing, the run-time AVX2
 * check and the max-|x| kernel. Everything is static inline, so each codec gets its own copy and
 * no symbol is added to the library. Not a public header: not named *_codec.h on purpose.
 */
#ifndef INCEPTIONN_CODEC_UTIL_H
#define INCEPTIONN_CODEC_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CU_X86 1
#else
#define CU_X86 0
#endif

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* NaN or infinity (exponent all ones). */
static inline int nonfinite(float f)
{
    return (f2u(f) & 0x7F800000u) == 0x7F800000u;
}

static inline void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The splitmix64 output function. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bytes taken by count elements of w bits, packed LSB first (no overflow for count near SIZE_MAX). */
static inline size_t bits_to_bytes(size_t count, size_t w)
{
    return (count / 8) * w + ((count % 8) * w + 7) / 8;
}

/* LSB-first bit packing of w-bit elements (w <= 32). */
struct packer {
    uint8_t *out;
    size_t pos;
    uint64_t acc;
    unsigned nbits;
};

static inline void pack(struct packer *p, uint32_t v, unsigned w)
{
    p->acc |= (uint64_t)v << p->nbits;
    p->nbits += w;
    while (p->nbits >= 8) {
        p->out[p->pos++] = (uint8_t)p->acc;
        p->acc >>= 8;
        p->nbits -= 8;
    }
}

/* Write out the last, partial byte (zero bits above the elements). */
static inline void pack_flush(struct packer *p)
{
    if (p->nbits > 0)
        p->out[p->pos++] = (uint8_t)p->acc;
    p->acc = 0;
    p->nbits = 0;
}

/* INCEPTIONN_CODEC_SIMD=off in the environment runs every codec's portable path, as on a CPU
 * without the extensions: how the tests show both paths give the same bytes and values. */
static inline int codec_simd_allowed(void)
{
    const char *v = getenv("INCEPTIONN_CODEC_SIMD");
    return !(v && (strcmp(v, "off") == 0 || strcmp(v, "0") == 0));
}

/* The CPU features the codecs dispatch on, asked once per codec: CU_AVX2 | CU_POPCNT (none when
 * SIMD is not allowed). */
enum { CU_AVX2 = 1, CU_POPCNT = 2 };
static inline int cpu_features(void)
{
#if CU_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = !codec_simd_allowed() ? 0
                 : (__builtin_cpu_supports("avx2") ? CU_AVX2 : 0) | (__builtin_cpu_supports("popcnt") ? CU_POPCNT : 0);
    }
    return cached;
#else
    return 0;
#endif
}

static inline int cpu_has_avx2(void)
{
    return (cpu_features() & CU_AVX2) != 0;
}

static inline int cpu_has_popcnt(void)
{
    return (cpu_features() & CU_POPCNT) != 0;
}

/* The codecs' *_simd(enable) switch: sets *flag when enable >= 0, returns the previous value. */
static inline int simd_switch(int *flag, int enable)
{
    int was = *flag;
    if (enable >= 0)
        *flag = enable != 0;
    return was;
}

/* Largest |x| as bits over 8 interleaved lanes (NaN and infinity sort above every finite
 * value, so one compare finds them). A flat loop the compiler vectorizes; inlined into both the
 * baseline and the AVX2 builds of a kernel. */
static inline __attribute__((always_inline)) uint32_t max_abs_kernel(const float *in, size_t n)
{
    uint32_t mx[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            uint32_t a = f2u(in[i + j]) & 0x7FFFFFFFu;
            mx[j] = a > mx[j] ? a : mx[j];
        }
    for (int j = 0; i < n; i++, j++) {
        uint32_t a = f2u(in[i]) & 0x7FFFFFFFu;
        mx[j] = a > mx[j] ? a : mx[j];
    }
    uint32_t m = 0;
    for (int j = 0; j < 8; j++)
        m = mx[j] > m ? mx[j] : m;
    return m;
}

#endif
