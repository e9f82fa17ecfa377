/*
 * Soft-NIC packet transforms: compress the payload of a tagged IPv4/TCP or IPv6/TCP packet,
 * restore it on the other side. Pure functions over byte buffers (no netfilter here), so they are unit-tested
 * and fuzzed on their own. The wire format is documented in docs/wire-format.md.
 *
 * Compressed payload = 11-byte shim header, then `head` raw bytes (up to the stream's next float
 * boundary), the INCEPTIONN group stream of n floats, then `tail` raw bytes (0-3).
 *   0  magic 0x49 ('I')
 *   1  version (high nibble, 2) | codec (low nibble, 1 = INCEPTIONN, 2 = INCEPTIONN scaled)
 *   2  head (bits 0-1) | tail (bits 2-3) | echo bits 0-3 (bits 4-7)
 *   3  echo bits 4-11
 *   4  n, the float count (uint16 little-endian)
 *   6  CRC32C of the compressed payload with this field zeroed (uint32 little-endian)
 *  10  codec 1: zero; codec 2: x (int8, |x| <= NICD_SCALE_MAX), the floats were multiplied by 2^x
 * echo: the low 12 bits of the receiver's ISN (the answerer confirms a flow with it; restoring
 * ignores it). The IP DSCP (IPv4 ToS byte, IPv6 traffic class) says "compressed"; TCP sequence
 * numbers keep counting original bytes. IPv6: the fixed 40-byte header directly followed by TCP
 * only; a packet with any extension header is never transformed (NICD_E_EXT_HEADER).
 * The TCP checksum of a compressed packet is deliberately wrong by NICD_CSUM_MARK: no TCP stack
 * accepts it, whatever the network did to its DSCP, until a soft NIC has restored it.
 */
#ifndef NICD_PACKET_H
#define NICD_PACKET_H

#include <stddef.h>
#include <stdint.h>

#define NICD_HDR_LEN 11
#define NICD_MAGIC 0x49
#define NICD_VERSION 2
/* The ones-complement sum over a compressed packet's TCP pseudo-header and segment (checksum
 * field included) folds to this instead of 0xFFFF: its checksum is wrong by this much. */
#define NICD_CSUM_MARK 0x4E43
#define NICD_ECHO_MASK 0xFFF
#define NICD_CODEC_INCEPTIONN 1
/* The same group stream of each packet's floats times 2^x, x chosen per packet (per super-packet
 * with gso) so that the largest finite magnitude lands in [0.5, 1); the receiver multiplies by
 * 2^-x. For senders of raw gradients, which the paper's absolute precision would zero. */
#define NICD_CODEC_SCALED 2
#define NICD_SCALE_MAX 126 /* 2^x and 2^-x stay normal floats */
#define NICD_SCALE_AT 10   /* the shim header byte holding x */
#define NICD_MAX_PACKET 65535
/* Largest packet a verdict can carry: the netlink attribute length is 16 bits and counts its own
 * 4-byte header, so 65532-65535 bytes would wrap it (the kernel then keeps the old packet). */
#define NICD_MAX_VERDICT (NICD_MAX_PACKET - 4)

/* Why a packet was not transformed, or was dropped. Positive values are not errors. */
enum nicd_result {
    NICD_OK = 0,
    NICD_NOT_SMALLER = 1,   /* compressed form is not smaller: send raw */
    NICD_TOO_SHORT = 2,     /* payload too short to hold a float: send raw */
    NICD_E_IP = -1,         /* not a well-formed IPv4 or IPv6 packet */
    NICD_E_NOT_TCP = -2,    /* not TCP, or a fragment */
    NICD_E_TCP = -3,        /* malformed TCP header */
    NICD_E_CHECKSUM = -4,   /* TCP checksum of the received packet is wrong (for a compressed
                               packet: not wrong by exactly NICD_CSUM_MARK) */
    NICD_E_HEADER = -5,     /* shim header malformed (magic, version, codec, reserved bits) */
    NICD_E_CRC = -6,        /* CRC32C mismatch: corrupted in transit */
    NICD_E_DECODE = -7,     /* group stream malformed */
    NICD_E_SPACE = -8,      /* result would exceed NICD_MAX_VERDICT bytes or the buffer; or no
                               room for the hello option */
    NICD_E_EXT_HEADER = -9, /* IPv6 with an extension header before TCP (hop-by-hop, routing,
                               fragment, destination options, ...): never transformed */
};

/* TCP header flags (byte 13), as nicd_pkt.tcp_flags holds them. */
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10
#define TCP_CWR 0x80

/* A parsed IPv4/TCP or IPv6/TCP packet; ports and seq in host order, addresses as on the wire. */
struct nicd_pkt {
    const uint8_t *ip;
    size_t len;        /* IP total length (IPv6: 40 + payload length; the captured length may
                          not be shorter) */
    size_t ihl;        /* IP header bytes (IPv6: 40) */
    size_t thl;        /* TCP header bytes */
    size_t payload_off;
    size_t payload_len;
    uint32_t saddr, daddr;
    uint16_t sport, dport;
    uint32_t seq, ack;
    uint8_t tcp_flags;
    uint8_t tos;       /* IPv4 ToS byte, IPv6 traffic class (DSCP and ECN alike) */
    uint8_t v6;        /* 1: IPv6, addresses in saddr6/daddr6 (saddr, daddr are 0) */
    uint8_t saddr6[16], daddr6[16];
};

/* Parse an IPv4 or IPv6 packet (by its version nibble) of caplen bytes. NICD_OK fills *p. On
 * NICD_E_EXT_HEADER only p->v6 and p->tos are set (the fixed header's), so a caller can tell a
 * tagged packet it leaves raw. */
int nicd_parse(const uint8_t *buf, size_t caplen, struct nicd_pkt *p);

/*
 * Compress p's payload. stream_off is the payload's offset in the byte stream (seq - ISN - 1;
 * only its value mod 4 matters); echo goes into the shim header (NICD_ECHO_MASK bits). Writes
 * the new packet (same headers, DSCP/ToS byte set to `tos`, lengths fixed, IP checksum right,
 * TCP checksum wrong by NICD_CSUM_MARK) to out. Returns its length, or NICD_NOT_SMALLER /
 * NICD_TOO_SHORT (out untouched), or a negative error. tiers[4], if not NULL, gets the tier
 * counts of the values sent. `scratch` holds at least (payload_len / 4) floats.
 */
ptrdiff_t nicd_compress(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                        uint8_t tos, uint16_t echo, uint8_t *out, size_t cap, float *scratch, uint64_t *tiers);

/* The same with the codec given: NICD_CODEC_INCEPTIONN (what nicd_compress does) or
 * NICD_CODEC_SCALED (scaled by 2^x first, x in byte NICD_SCALE_AT of the shim header). */
ptrdiff_t nicd_compress_codec(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                              uint8_t tos, uint16_t echo, uint8_t *out, size_t cap, float *scratch,
                              uint64_t *tiers);

/*
 * The GSO fast path (docs/wire-format.md, "Super-packets"): compress the payload of a TSO/GSO
 * super-packet (up to 64 KB) into the fewest compressed packets whose IP length is at most mtu.
 * Each covers a contiguous range of the original sequence space and is an ordinary compressed
 * packet (its own shim header, seq = the start of its range), so the receiver restores each on
 * its own; ranges are cut at 8-float group boundaries of one encoded stream. Headers are copied
 * with seq, IP id (+1 per packet), lengths, ToS (`tos`), the IP checksum and the marked TCP
 * checksum (as nicd_compress) set; PSH and FIN stay
 * on the last packet only, CWR on the first only. The packets are written back to back to out;
 * *nsegs gets how many (1..max_segs), seg_len[i] the i-th one's length. Returns the bytes
 * written, or NICD_NOT_SMALLER when any range's compressed form would not be smaller than the
 * range (or they would be more than max_segs), NICD_TOO_SHORT, or a negative error. `stream` holds stream_cap bytes for the
 * encoded payload (inc_max_encoded_size(16384) is enough for any packet), `scratch` 16384
 * floats.
 */
ptrdiff_t nicd_compress_gso(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                            uint8_t tos, uint16_t echo, size_t mtu, uint8_t *out, size_t cap, size_t *seg_len,
                            int *nsegs, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                            uint64_t *tiers);

/* 1 if p's TCP checksum is wrong by exactly NICD_CSUM_MARK (what a soft NIC compressed: an intact
 * original segment sums right and cannot be one), else 0. */
int nicd_marked_checksum(const struct nicd_pkt *p);

/* The echo field of a compressed packet's shim header (0 if the payload holds no header). */
uint16_t nicd_echo(const struct nicd_pkt *p);

/* nicd_compress_gso with the codec given; with NICD_CODEC_SCALED one exponent is chosen for the
 * whole super-packet and every packet cut from it carries it. */
ptrdiff_t nicd_compress_gso_codec(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                                  uint8_t tos, uint16_t echo, size_t mtu, uint8_t *out, size_t cap,
                                  size_t *seg_len, int *nsegs, int max_segs, float *scratch, uint8_t *stream,
                                  size_t stream_cap, uint64_t *tiers);

/*
 * Wire format v3 (docs/wire-format.md, "Segment trains"): the compressed form of one super-packet
 * as one segment train, a single packet whose payload the kernel's GSO cuts every gso_size bytes
 * (and a receiver's GRO merges back). Every segment but the last is exactly gso_size bytes; each
 * starts with a 20-byte v3 shim header and is decodable alone:
 *   0  magic 0x49        1  version 3 | codec      2-3  head, tail, echo (as v2)
 *   4  n (uint16 LE)     6  CRC32C of the segment's wlen bytes with this field zeroed (LE)
 *  10  scale (as v2)    11  zero                  12  the original seq of its first byte (LE)
 *  16  slen: the group stream's bytes (LE)       18  wlen: the segment's bytes, this header
 *      included; after head, stream and tail, zero padding up to wlen
 * The train's TCP seq is the original seq + NICD_V3_SEQ_OFFSET: outside any window a receiver
 * could accept (at most 2^30), so a stack without a soft NIC drops every segment (the
 * fail-closed mark: it survives GSO, TSO and GRO, which a wrong checksum does not). Its TCP
 * checksum is right. A segment's wire offset in its train never exceeds its original offset.
 */
#define NICD_V3_VERSION 3
#define NICD_V3_HDR_LEN 20
#define NICD_V3_SEQ_OFFSET 0x80000000u

/* Compress super-packet p into one train of segments of gso_size payload bytes (the last
 * shorter), written to out; *nsegs gets their number (1..max_segs). Returns the train's length,
 * NICD_NOT_SMALLER (a segment would not be smaller than the range it covers, more than max_segs
 * segments, or gso_size leaves no room for a group), NICD_TOO_SHORT, or a negative error.
 * `stream` and `scratch` as nicd_compress_gso_codec. */
ptrdiff_t nicd_compress_train(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                              uint8_t tos, uint16_t echo, size_t gso_size, uint8_t *out, size_t cap,
                              int *nsegs, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                              uint64_t *tiers);

/* Restore a train, whole or any run of its consecutive segments (what GRO merged, or one segment
 * alone): each segment's header, padding and CRC32C checked, decoded, their original ranges
 * joined into one packet at the first segment's original seq, ToS `tos`, lengths and checksums
 * right. verify_csum: the packet's TCP checksum must be right (0 when the kernel says it is
 * partial, as on a GRO-merged packet whose segments it verified). Segments after one that fails,
 * that does not continue the range before it, or that would pass NICD_MAX_VERDICT or cap, are
 * left off (*left_off counts them; the FIN and PSH go with them); the first failing is an error
 * (the packet is dropped). *restored gets the segments restored. Never reads past p->len. */
ptrdiff_t nicd_restore_train(const struct nicd_pkt *p, int verify_csum, uint8_t tos, uint8_t *out, size_t cap,
                             float *scratch, int *restored, int *left_off);

/* The shim version of a compressed packet's payload (2 or 3; not validated), or -1 if it has none. */
int nicd_shim_version(const struct nicd_pkt *p);

/* Codec 2's scale: the exponent x for v (largest finite magnitude times 2^x in [0.5, 1), clamped
 * to +-NICD_SCALE_MAX; 0 if none is finite and non-zero), and v *= 2^x on finite values only. */
int nicd_scale_exponent(const float *v, size_t n);
void nicd_scale(float *v, size_t n, int x);

/* The codec id in a compressed packet's shim header (not validated), or -1 if it has none. */
int nicd_codec_of(const struct nicd_pkt *p);

/*
 * Restore a compressed packet: verify its TCP checksum (wrong by exactly NICD_CSUM_MARK) and
 * CRC32C, decode, write the original
 * packet (ToS byte set to `tos`, lengths and checksums fixed) to out. Returns its length or a
 * negative error; never reads past p->len nor writes past cap. `scratch` holds 16384 floats.
 */
ptrdiff_t nicd_restore(const struct nicd_pkt *p, uint8_t tos, uint8_t *out, size_t cap,
                       float *scratch);

/*
 * Receive offload in the daemon: restored packets of one flow that follow each other go to TCP as
 * one packet, as GRO merges segments (one TCP receive and one ACK decision instead of several).
 * nicd_can_append says whether the restored packet b (blen bytes) continues the restored packet a
 * (alen bytes) so that a with b's payload appended is what the two say together: both parse, the
 * same IP header but for length, id and checksum, the same TCP header (ports, ack, window, options:
 * timestamps included) but for seq, checksum and flags, a's flags ACK only, b's ACK with or without
 * PSH, b's seq where a's payload ends, both carry payload, and the sum is at most cap bytes and fits
 * a verdict. nicd_append then appends b's payload and b's flags, and sets a's length field; its
 * checksums stay stale until nicd_finish_merged (once, after the last append) makes them right.
 */
int nicd_can_append(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, size_t cap);
size_t nicd_append(uint8_t *a, size_t alen, const uint8_t *b, size_t blen);
void nicd_finish_merged(uint8_t *a, size_t len);

/*
 * The hello option: TCP option kind 253 (RFC 6994 experimental, 16-bit ExID) on handshakes.
 * A SYN carries role HELLO with the sender's settings and a per-flow nonce; the answering
 * SYN-ACK carries role ANSWER, the same nonce and the answerer's settings. Layout (16 bytes):
 *   0 kind 253   1 length 16   2-3 ExID 0x494E ("IN")   4 version (high nibble) | role (low)
 *   5 codec      6 error bound (int8)   7 tos_compressed   8 the packet's original ToS
 *   9 zero       10-15 nonce
 * It is inserted first in the option list (so no EOL can hide it) and removed again, byte for
 * byte, by the receiving soft NIC before its stack sees the packet.
 */
#define NICD_OPT_KIND 253
#define NICD_OPT_LEN 16
#define NICD_OPT_EXID 0x494E
#define NICD_NONCE_LEN 6
/* Bit 0 of byte 8 (whose low two bits, ECN's, are never put back): "I restore v3 segment trains".
 * A soft NIC from before v3 writes 0 and ignores it, so old and new agree on everything else. */
#define NICD_OPT_TRAINS 0x01
enum { NICD_ROLE_HELLO = 1, NICD_ROLE_ANSWER = 2 };

struct nicd_hello_opt {
    uint8_t version, role, codec, tos_compressed, orig_tos;
    int8_t error_bound;
    uint8_t nonce[NICD_NONCE_LEN];
};

/* Look for the hello option in p's TCP options. Returns its offset from the start of the TCP
 * header (> 0) with *o filled, 0 if absent, or NICD_E_TCP if the option list is malformed. */
int nicd_find_option(const struct nicd_pkt *p, struct nicd_hello_opt *o);

/* Write p to out with the hello option inserted before its other options and the ToS byte set
 * to tos, checksums fixed. Returns the new length, or NICD_E_SPACE when the TCP header has no
 * 16 bytes left (SYNs with MD5, MPTCP or Fast Open options) or the packet carries data. */
ptrdiff_t nicd_add_option(const struct nicd_pkt *p, const struct nicd_hello_opt *o, uint8_t tos,
                          uint8_t *out, size_t cap);

/* Write p to out without the hello option found at `off` (nicd_find_option), ToS set to tos.
 * Verifies the TCP checksum first (NICD_E_CHECKSUM), as restoring does. Returns the length. */
ptrdiff_t nicd_strip_option(const struct nicd_pkt *p, size_t off, uint8_t tos, uint8_t *out,
                            size_t cap);

/* Rewrite the ToS byte of an IPv4 packet in place and fix the header checksum; or the traffic
 * class of an IPv6 packet (which has no header checksum). */
void nicd_set_tos(uint8_t *ip, uint8_t tos);

/* Set a well-formed packet's length (IPv4 total length, IPv6 payload length) to len and its
 * ToS / traffic class to tos, then write its IPv4 header checksum and a right TCP checksum. */
void nicd_finish(uint8_t *ip, size_t len, uint8_t tos);

/* Checksum helpers, exported for tests. The TCP checksum covers the IPv4 pseudo-header, or the
 * IPv6 one (RFC 8200 section 8.1: addresses, 32-bit upper-layer length, next header 6). */
uint16_t nicd_tcp_checksum(const uint8_t *ip, size_t len);
uint32_t nicd_crc32c(uint32_t crc, const uint8_t *buf, size_t len);

const char *nicd_strerror(int result);

#endif
