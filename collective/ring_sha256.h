/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained: the MPI_Allreduce library is
 * preloaded into programs that may link another crypto library, or none; it depends on nothing
 * but libc. Checked against Python's hashlib/hmac (tests/test_ring_security.py).
 */
#ifndef INCEPTIONN_RING_SHA256_H
#define INCEPTIONN_RING_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define RING_SHA256_BYTES 32

struct ring_sha256 {
    uint32_t h[8];
    uint64_t len;        /* bytes hashed so far */
    uint8_t buf[64];
    size_t fill;
};

void ring_sha256_init(struct ring_sha256 *c);
void ring_sha256_update(struct ring_sha256 *c, const void *data, size_t n);
void ring_sha256_final(struct ring_sha256 *c, uint8_t out[RING_SHA256_BYTES]);
void ring_sha256(const void *data, size_t n, uint8_t out[RING_SHA256_BYTES]);

/* HMAC-SHA256 of the concatenation of nparts parts (part i: parts[i], lens[i] bytes). */
void ring_hmac_sha256(const uint8_t *key, size_t keylen, const void *const *parts, const size_t *lens,
                      size_t nparts, uint8_t out[RING_SHA256_BYTES]);

#endif
