/*
 * Shared harness of the codecs' C unit tests (codecs_c/tests/test_*_codec.c): the CHECK macro and
 * its pass/fail counters, a xorshift64 generator, float bit casts, exact-size heap copies (so a
 * read past a blob is caught by ASan) and the final report line, which tests/test_c_hardening.py
 * reads as the last line of stdout ("... N passed, 0 failed").
 *
 * A test that wants another generator seed defines CHECK_RNG_SEED before including this header.
 */
#ifndef INCEPTIONN_TESTS_CHECK_H
#define INCEPTIONN_TESTS_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#ifndef CHECK_RNG_SEED
#define CHECK_RNG_SEED 0x9E3779B97F4A7C15ull
#endif

static uint64_t rng_state = CHECK_RNG_SEED;

/* Next state of the xorshift64 generator. */
static inline uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* 32 random bits (bits 11..42 of the next state). */
static inline uint32_t rnd(void)
{
    return (uint32_t)(rng_next() >> 11);
}

/* Uniform double in [0, 1) from the top 53 bits of the next state. */
static inline double uniform(void)
{
    return (double)(rng_next() >> 11) * 0x1p-53;
}

static inline uint32_t to_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static inline float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* A malloc'd copy of exactly len bytes (at least 1 byte allocated); the caller frees it. */
static inline uint8_t *copy_exact(const uint8_t *src, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (len)
        memcpy(p, src, len);
    return p;
}

/* Print the final "<name>: N passed, M failed" line (just the counts when name is empty) and
 * return main's exit status. */
static inline int check_report(const char *name)
{
    if (name[0])
        printf("%s: %d passed, %d failed\n", name, passed, failed);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif
