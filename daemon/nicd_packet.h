/*
 * Soft-NIC packet transforms: compress the payload of a tagged IPv4/TCP packet, restore it on
 * the other side. Pure functions over byte buffers (no netfilter here), so they are unit-tested
 * and fuzzed on their own. The wire format is documented in docs/wire-format.md.
 *
 * Compressed payload = 10-byte shim header, then `head` raw bytes (up to the stream's next float
 * boundary), the INCEPTIONN group stream of n floats, then `tail` raw bytes (0-3).
 *   0  magic 0x49 ('I')
 *   1  version (high nibble, 1) | codec (low nibble, 1 = INCEPTIONN)
 *   2  head (bits 0-1) | tail (bits 2-3); bits 4-7 zero
 *   3  zero
 *   4  n, the float count (uint16 little-endian)
 *   6  CRC32C of the compressed payload with this field zeroed (uint32 little-endian)
 * The IP DSCP says "compressed"; TCP sequence numbers keep counting original bytes.
 */
#ifndef NICD_PACKET_H
#define NICD_PACKET_H

#include <stddef.h>
#include <stdint.h>

#define NICD_HDR_LEN 10
#define NICD_MAGIC 0x49
#define NICD_VERSION 1
#define NICD_CODEC_INCEPTIONN 1
#define NICD_MAX_PACKET 65535

/* Why a packet was not transformed, or was dropped. Positive values are not errors. */
enum nicd_result {
    NICD_OK = 0,
    NICD_NOT_SMALLER = 1,   /* compressed form is not smaller: send raw */
    NICD_TOO_SHORT = 2,     /* payload too short to hold a float: send raw */
    NICD_E_IP = -1,         /* not a well-formed IPv4 packet */
    NICD_E_NOT_TCP = -2,    /* not TCP, or a fragment */
    NICD_E_TCP = -3,        /* malformed TCP header */
    NICD_E_CHECKSUM = -4,   /* TCP checksum of the received packet is wrong */
    NICD_E_HEADER = -5,     /* shim header malformed (magic, version, codec, reserved bits) */
    NICD_E_CRC = -6,        /* CRC32C mismatch: corrupted in transit */
    NICD_E_DECODE = -7,     /* group stream malformed */
    NICD_E_SPACE = -8,      /* restored packet would exceed 65535 bytes or the buffer */
};

/* A parsed IPv4/TCP packet; ports and seq in host order, addresses as on the wire. */
struct nicd_pkt {
    const uint8_t *ip;
    size_t len;        /* IP total length (the captured length may not be shorter) */
    size_t ihl;        /* IP header bytes */
    size_t thl;        /* TCP header bytes */
    size_t payload_off;
    size_t payload_len;
    uint32_t saddr, daddr;
    uint16_t sport, dport;
    uint32_t seq;
    uint8_t tcp_flags;
    uint8_t tos;
};

int nicd_parse(const uint8_t *buf, size_t caplen, struct nicd_pkt *p);

/*
 * Compress p's payload. stream_off is the payload's offset in the byte stream (seq - ISN - 1;
 * only its value mod 4 matters). Writes the new packet (same headers, DSCP/ToS byte set to
 * `tos`, lengths and checksums fixed) to out. Returns its length, or NICD_NOT_SMALLER /
 * NICD_TOO_SHORT (out untouched), or a negative error. tiers[4], if not NULL, gets the tier
 * counts of the values sent. `scratch` holds at least (payload_len / 4) floats.
 */
ptrdiff_t nicd_compress(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                        uint8_t tos, uint8_t *out, size_t cap, float *scratch, uint64_t *tiers);

/*
 * Restore a compressed packet: verify its TCP checksum and CRC32C, decode, write the original
 * packet (ToS byte set to `tos`, lengths and checksums fixed) to out. Returns its length or a
 * negative error; never reads past p->len nor writes past cap. `scratch` holds 16384 floats.
 */
ptrdiff_t nicd_restore(const struct nicd_pkt *p, uint8_t tos, uint8_t *out, size_t cap,
                       float *scratch);

/* Rewrite the ToS byte of an IPv4 packet in place and fix the header checksum. */
void nicd_set_tos(uint8_t *ip, uint8_t tos);

/* Checksum helpers, exported for tests. */
uint16_t nicd_tcp_checksum(const uint8_t *ip, size_t len);
uint32_t nicd_crc32c(uint32_t crc, const uint8_t *buf, size_t len);

const char *nicd_strerror(int result);

#endif
