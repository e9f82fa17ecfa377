/*
 * The MPI_Allreduce library's ring handshake (docs/mpi-allreduce.md, "Who can join a ring"):
 * each rank connects to its right neighbour and accepts its left one, and both connections
 * prove knowledge of the communicator's secret in a challenge-response with a nonce from each
 * side, within one deadline for the whole handshake.
 *
 *   connector -> acceptor  HELLO     magic, version, size, rank + 1, nonce_c
 *   acceptor -> connector  CHALLENGE magic, version, nonce_a, MAC("A")
 *   connector -> acceptor  PROOF     MAC("C")
 *   MAC(role) = HMAC-SHA256(secret, role | setup id | size | connector rank | acceptor rank |
 *                                   nonce_c | nonce_a)
 *
 * Every byte is float32 (both directions may be tagged 0x28 in nic mode, and the soft NIC's codec
 * keeps only floats >= 1 exact): nonces and MACs travel 16 bits per float, as 1 + v.
 */
#ifndef INCEPTIONN_RING_HANDSHAKE_H
#define INCEPTIONN_RING_HANDSHAKE_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#define RING_HS_VERSION 2
#define RING_HS_SECRET 32
#define RING_HS_SETUP_ID 16
#define RING_HS_MAX_PENDING 8     /* unproven connections held at once; the oldest goes first */

struct ring_hs {
    int rank, size;
    int tagged;                   /* ToS 0x28 on the connecting socket (nic mode) */
    int timeout_ms;               /* the one deadline of the whole handshake */
    uint8_t secret[RING_HS_SECRET];
    uint8_t setup_id[RING_HS_SETUP_ID];
    struct in_addr self;          /* the connecting socket's source address */
    uint32_t left_addr;           /* network order: the only source address accepted */
    uint32_t right_addr;          /* network order */
    uint16_t right_port;          /* network order */
    int lfd;                      /* the listener (made non-blocking here; shut down on failure) */
};

/* HMAC-SHA256 (libcrypto) under key of the concatenation of nparts parts (part i: parts[i], lens[i]
 * bytes): the handshake's MAC. 0, or -1 if libcrypto failed. */
#define RING_HS_MAC 32
int ring_hs_hmac(const uint8_t *key, size_t keylen, const void *const *parts, const size_t *lens, size_t nparts,
                 uint8_t out[RING_HS_MAC]);

/* len bytes from getrandom() (the secret's shares, the nonces); 0, or -1 with errno */
int ring_random_bytes(uint8_t *out, size_t len);

/* 0 with *send_fd (to the right) and *recv_fd (from the left) proven; -1 with why filled in.
 * *refused counts the connections closed unproven. On failure the listener is shut down, so
 * that the left neighbour's connection is reset at once (and a later one refused) instead of
 * waiting out its deadline while this rank waits for the others to agree on the fallback. */
int ring_handshake(const struct ring_hs *p, int *send_fd, int *recv_fd, int *refused, char *why, size_t whylen);

#endif
