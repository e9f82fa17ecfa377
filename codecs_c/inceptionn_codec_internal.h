/* Private glue between the scalar driver and the AVX2 kernels. Not part of the public header. */
#ifndef INCEPTIONN_CODEC_INTERNAL_H
#define INCEPTIONN_CODEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define INC_X86 1
#else
#define INC_X86 0
#endif

#if INC_X86
/* Encode up to `full_groups` whole groups while a worst-case group still fits in out[*pos..cap).
 * Advances *pos; returns the number of groups done. */
size_t inc__encode_avx2(const float *in, size_t full_groups, uint32_t eb, uint32_t mid,
                        uint8_t *out, size_t cap, size_t *pos);

/* Decode up to `full_groups` whole groups while a worst-case group still lies inside in[*pos..len),
 * so no load can cross the end of the input. Stops early at a group the scalar path must judge.
 * Advances *pos; returns the number of groups done. */
size_t inc__decode_avx2(const uint8_t *in, size_t len, float *out, size_t full_groups,
                        size_t *pos);
#endif

#endif
