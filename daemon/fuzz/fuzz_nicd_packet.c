/*
 * libFuzzer target for the soft NIC's packet transforms: the input is an IPv4 or IPv6 packet (by
 * its version nibble) as it would arrive from the network, copied to an exactly-sized buffer. Whatever parses is restored (the
 * ingress path) and compressed at every stream offset (the egress path); a compressed packet
 * must restore, to the same length, and never exceed the original, carry the echo it was given,
 * and have a TCP checksum wrong by exactly NICD_CSUM_MARK (no stack could take it unrestored),
 * while an original with a right checksum is never restorable. A second copy gets a valid
 * CRC32C and a TCP checksum marked as a soft NIC's first, so mutations reach the header checks and the decoder instead of
 * stopping at the integrity checks. The hello option: whatever option list arrives is searched
 * (and a found option removed again); inserting our option into any parsed packet and removing
 * it must give back the same bytes. Both codecs: 1 (the paper's) and 2 (scaled by 2^x per packet,
 * x in header byte 10): a codec-2 packet must carry an exponent in range and restore every
 * infinity and NaN of the original bit for bit; the receiver refuses any other exponent.
 * IPv6: a packet with an extension header never parses (only its class is read); a parsed one has
 * the 40-byte header and 40 + payload length bytes, and every packet made from it keeps its
 * payload length field right. Every parsed IPv4 packet's TCP segment is also put behind an IPv6
 * header: it must compress to the same payload bytes and restore to the same segment (the
 * transforms do not depend on the family but for the headers and the pseudo-header). The tier
 * counts the compressors return (read off the tag words while cutting) must equal what
 * inc_stream_histogram, the validating count, reads from the packets they wrote. Receive
 * offload: a packet cut in two (ACK-only first part) must merge back into itself, checksums
 * right; with the second part's seq off by one, or any packet with itself, it must not merge;
 * a second packet made of p's headers and the input's bytes past p (one header byte changed if
 * the input says so) merges exactly when only the fields a merge may differ in differ.
 * Build: clang -fsanitize=fuzzer,address,undefined (the Makefile's build/fuzz_nicd_packet).
 */
#include "inceptionn_codec.h"
#include "inceptionn_contract.h"
#include "nicd_packet.h"

#include <stdlib.h>
#include <string.h>

static float scratch[16384 + 16];
static uint8_t v6pkt[NICD_MAX_PACKET + 64], out6[NICD_MAX_PACKET + 64], back6[NICD_MAX_PACKET + 64];
static uint8_t out[NICD_MAX_PACKET + 64], back[NICD_MAX_PACKET + 64];
static uint8_t segs[NICD_MAX_PACKET + 64 * 128], stream[2048 * 34];

/* Every packet written from p must say its own length: IPv4 total length, IPv6 payload length. */
static void check_len_field(const struct nicd_pkt *p, const uint8_t *b, size_t len)
{
    size_t said = p->v6 ? 40 + ((size_t)b[4] << 8 | b[5]) : ((size_t)b[2] << 8 | b[3]);
    if (said != len || (b[0] >> 4) != (p->v6 ? 6 : 4))
        abort();
}

/* Add the tier counts of compressed packet c's group stream to t (its header says where the
 * stream lies and how many floats it holds); abort if inc_stream_histogram refuses it. */
static void add_stream_tiers(const struct nicd_pkt *c, uint64_t t[4])
{
    const uint8_t *h = c->ip + c->payload_off;
    size_t head = h[2] & 3, tail = (h[2] >> 2) & 3, n = (size_t)h[4] | ((size_t)h[5] << 8);
    if (c->payload_len < NICD_HDR_LEN + head + tail ||
        inc_stream_histogram(h + NICD_HDR_LEN + head, c->payload_len - NICD_HDR_LEN - head - tail, n, t) != INC_OK)
        abort();
}

/* The GSO path: a parsed packet taken as a super-packet, cut for a few MTUs. Every packet must
 * fit the MTU, be smaller than the range it covers, and restore to exactly that range's length
 * at exactly that range's seq; the ranges must cover the payload once, in order. */
static void check_gso(const struct nicd_pkt *p, uint32_t off, int codec)
{
    static const size_t mtus[] = {90, 576, 1500, 9000};
    size_t len[64];
    for (size_t m = 0; m < sizeof mtus / sizeof *mtus; m++) {
        int n = 0;
        uint16_t echo = (uint16_t)((p->seq ^ mtus[m]) & NICD_ECHO_MASK);
        uint64_t tiers[4] = {0, 0, 0, 0}, want[4] = {0, 0, 0, 0};
        ptrdiff_t r = nicd_compress_gso_codec(p, off, codec, -10, 0x2C, echo, mtus[m], segs, sizeof segs, len, &n,
                                              64, scratch, stream, sizeof stream, tiers);
        if (r <= (ptrdiff_t)NICD_TOO_SHORT)
            continue;
        size_t at = 0, covered = 0;
        for (int i = 0; i < n; i++) {
            struct nicd_pkt c;
            check_len_field(p, segs + at, len[i]);
            if (len[i] > mtus[m] || nicd_parse(segs + at, len[i], &c) != NICD_OK || c.seq != (uint32_t)(p->seq + covered) ||
                !nicd_marked_checksum(&c) || nicd_echo(&c) != echo)
                abort();
            /* one exponent per super-packet: every packet cut from it carries the first one's */
            if (nicd_codec_of(&c) != codec || segs[at + c.payload_off + NICD_SCALE_AT] != segs[c.payload_off + NICD_SCALE_AT])
                abort();
            add_stream_tiers(&c, want);
            ptrdiff_t b = nicd_restore(&c, INCEPTIONN_TOS_TAGGED, back, sizeof back, scratch);
            if (b <= 0 || c.payload_len >= (size_t)b - c.payload_off)
                abort(); /* restores, and was smaller than what it covers */
            covered += (size_t)b - c.payload_off;
            at += len[i];
        }
        if (covered != p->payload_len || at != (size_t)r || memcmp(tiers, want, sizeof tiers) != 0)
            abort();
    }
}

/* Codec 2's promise: a restored packet has the original's infinities and NaNs, bit for bit, at
 * the same places (the whole floats after `head`), and finite values stay finite. */
static void check_specials(const struct nicd_pkt *p, uint32_t off, const uint8_t *restored)
{
    size_t head = (4 - (off & 3)) & 3;
    if (head > p->payload_len)
        return;
    const uint8_t *a = p->ip + p->payload_off + head, *b = restored + p->payload_off + head;
    for (size_t i = 0; i + 4 <= p->payload_len - head; i += 4) {
        uint32_t x, y;
        memcpy(&x, a + i, 4);
        memcpy(&y, b + i, 4);
        int special = (x & 0x7F800000u) == 0x7F800000u;
        if (special ? x != y : (y & 0x7F800000u) == 0x7F800000u)
            abort();
    }
}

/* Receive offload (nicd_can_append, nicd_append, nicd_finish_merged): p cut in two at a point its
 * seq picks, each part a well-formed packet with right checksums, the first ACK-only, the second
 * ACK with p's PSH; the two merge back into p's bytes with those flags and right checksums. */
static uint8_t ma[NICD_MAX_PACKET + 64], mb[NICD_MAX_PACKET + 64], mw[NICD_MAX_PACKET + 64];
static void check_merge(const struct nicd_pkt *p)
{
    if (p->payload_len && nicd_can_append(p->ip, p->len, p->ip, p->len, sizeof ma))
        abort(); /* a packet never continues itself */
    if (p->payload_len < 2 || p->len > NICD_MAX_VERDICT)
        return;
    size_t cut = 1 + p->seq % (p->payload_len - 1), off = p->payload_off, ihl = p->ihl;
    size_t alen = off + cut, blen = p->len - cut;
    uint8_t flags = (uint8_t)(TCP_ACK | (p->tcp_flags & TCP_PSH));
    memcpy(ma, p->ip, alen);
    memcpy(mb, p->ip, off);
    memcpy(mb + off, p->ip + off + cut, p->payload_len - cut);
    ma[ihl + 13] = TCP_ACK, mb[ihl + 13] = flags;
    uint32_t seq = p->seq + (uint32_t)cut;
    mb[ihl + 4] = (uint8_t)(seq >> 24), mb[ihl + 5] = (uint8_t)(seq >> 16), mb[ihl + 6] = (uint8_t)(seq >> 8);
    mb[ihl + 7] = (uint8_t)(seq + 1); /* off by one first */
    nicd_finish(ma, alen, p->tos);
    nicd_finish(mb, blen, p->tos);
    if (nicd_can_append(ma, alen, mb, blen, sizeof ma))
        abort();
    mb[ihl + 7] = (uint8_t)seq;
    nicd_finish(mb, blen, p->tos);
    if (!nicd_can_append(ma, alen, mb, blen, sizeof ma) || nicd_can_append(ma, alen, mb, blen, p->len - 1))
        abort();
    size_t m = nicd_append(ma, alen, mb, blen);
    nicd_finish_merged(ma, m);
    memcpy(mw, p->ip, p->len);
    mw[ihl + 13] = flags;
    nicd_finish(mw, p->len, p->tos);
    if (m != p->len || memcmp(ma, mw, m) != 0)
        abort();
}

/* Receive offload against any second packet: b is a's headers (a = p made ACK-only, b's seq
 * where a's data ends) with the input's bytes past p as its payload, its flags ACK, ACK|PSH or any the input gives, and,
 * when the input says so, one header byte (at an index the input picks) changed after its
 * checksums were made. nicd_can_append must take b exactly when the headers differ only where a
 * merge may (IPv4 id and checksum, TCP checksum, flags) and b's flags are ACK or ACK|PSH; merged,
 * the packet parses, says its length, both checksums are right, its payload is a's then b's, and
 * its headers are a's but for length, checksums and b's flags. With one byte less room it is
 * refused. The bytes past p as they are (any b) are asked too, for the bounds. */
static uint8_t tb[NICD_MAX_PACKET + 64];

static int ipv4_header_ok(const uint8_t *ip, size_t ihl)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < ihl; i += 2)
        sum += (uint32_t)(ip[i] << 8 | ip[i + 1]);
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    return sum == 0xFFFF;
}

static void check_merge_any(const struct nicd_pkt *p, const uint8_t *rest, size_t nrest)
{
    nicd_can_append(p->ip, p->len, rest, nrest, sizeof ma); /* whatever it says, in bounds */
    if (nrest < 4 || !p->payload_len || p->len > NICD_MAX_VERDICT)
        return;
    size_t off = p->payload_off, ihl = p->ihl, alen = p->len, blen = off + (nrest - 3);
    if (blen > NICD_MAX_VERDICT)
        blen = NICD_MAX_VERDICT;
    memcpy(ma, p->ip, alen);
    ma[ihl + 13] = TCP_ACK;
    nicd_finish(ma, alen, p->tos);
    memcpy(mw, ma, alen); /* a as it was, to compare with */
    memcpy(tb, ma, off);
    memcpy(tb + off, rest + 3, blen - off);
    uint32_t seq = p->seq + (uint32_t)p->payload_len;
    tb[ihl + 4] = (uint8_t)(seq >> 24), tb[ihl + 5] = (uint8_t)(seq >> 16), tb[ihl + 6] = (uint8_t)(seq >> 8);
    tb[ihl + 7] = (uint8_t)seq; /* flags: ACK or ACK|PSH, or any the input gives */
    tb[ihl + 13] = rest[0] & 0x40 ? rest[0] : (uint8_t)(TCP_ACK | (rest[0] & TCP_PSH));
    nicd_finish(tb, blen, p->tos);
    size_t at = rest[1] % off;
    int changed = (rest[1] & 0x80) == 0 && rest[2] != 0;
    if (changed)
        tb[at] ^= rest[2];
    int may_differ = at == ihl + 13 || at == ihl + 16 || at == ihl + 17 || /* TCP flags, checksum */
                     (!p->v6 && (at == 4 || at == 5 || at == 10 || at == 11)); /* IPv4 id, checksum */
    uint8_t bflags = tb[ihl + 13];
    size_t m = alen + (blen - off);
    int want = (!changed || may_differ) && (bflags & ~TCP_PSH) == TCP_ACK && m <= NICD_MAX_VERDICT;
    if (nicd_can_append(ma, alen, tb, blen, sizeof ma) != want)
        abort();
    if (!want)
        return;
    if (nicd_can_append(ma, alen, tb, blen, m - 1))
        abort(); /* one byte less room than the merged packet needs */
    if (nicd_append(ma, alen, tb, blen) != m)
        abort();
    nicd_finish_merged(ma, m);
    struct nicd_pkt q;
    if (nicd_parse(ma, m, &q) != NICD_OK || q.len != m || q.seq != p->seq || q.tcp_flags != bflags ||
        nicd_tcp_checksum(ma, m) != 0 || nicd_marked_checksum(&q) || (!p->v6 && !ipv4_header_ok(ma, ihl)))
        abort();
    check_len_field(p, ma, m);
    /* the headers: a's but for the length field, the IPv4 checksum, the TCP flags and checksum */
    if (p->v6 ? memcmp(ma, mw, 4) != 0 || memcmp(ma + 6, mw + 6, 34) != 0
              : memcmp(ma, mw, 2) != 0 || memcmp(ma + 4, mw + 4, 6) != 0 || memcmp(ma + 12, mw + 12, ihl - 12) != 0)
        abort();
    if (memcmp(ma + ihl, mw + ihl, 13) != 0 || memcmp(ma + ihl + 14, mw + ihl + 14, 2) != 0 ||
        memcmp(ma + ihl + 18, mw + ihl + 18, p->thl - 18) != 0)
        abort();
    if (memcmp(ma + off, mw + off, p->payload_len) != 0 || memcmp(ma + alen, tb + off, blen - off) != 0)
        abort();
}

/* The option paths: find/strip on the packet as it came, add/find/strip round trip. The packet's
 * TCP checksum is already valid here (strip checks it). */
static void check_option(const struct nicd_pkt *p)
{
    struct nicd_hello_opt o;
    int off = nicd_find_option(p, &o);
    if (off > 0) {
        if ((size_t)off < 20 || (size_t)off + NICD_OPT_LEN > p->thl)
            abort();
        ptrdiff_t r = nicd_strip_option(p, (size_t)off, o.orig_tos, out, sizeof out);
        struct nicd_pkt s;
        if (r != (ptrdiff_t)(p->len - NICD_OPT_LEN) || nicd_parse(out, (size_t)r, &s) != NICD_OK ||
            s.thl != p->thl - NICD_OPT_LEN || s.payload_len != p->payload_len)
            abort();
    }
    struct nicd_hello_opt mine = {.version = 1, .role = NICD_ROLE_HELLO, .codec = 1, .tos_compressed = 0x2C,
                                  .orig_tos = p->tos, .error_bound = -10, .nonce = {1, 2, 3, 4, 5, 6}};
    ptrdiff_t a = nicd_add_option(p, &mine, INCEPTIONN_TOS_HELLO, out, sizeof out);
    if (a < 0)
        return;
    struct nicd_pkt q;
    struct nicd_hello_opt got;
    if (a != (ptrdiff_t)(p->len + NICD_OPT_LEN) || nicd_parse(out, (size_t)a, &q) != NICD_OK ||
        nicd_find_option(&q, &got) != 20 || memcmp(&got, &mine, sizeof got) != 0)
        abort();
    ptrdiff_t b = nicd_strip_option(&q, 20, p->tos, back, sizeof back);
    /* everything but the IP header checksum (rewritten) comes back */
    if (b != (ptrdiff_t)p->len || memcmp(back, p->ip, 10) != 0 ||
        memcmp(back + 12, p->ip + 12, p->len - 12) != 0)
        abort();
}

/* p (IPv4, its checksum right) as IPv6: the same TCP segment behind a 40-byte header (class = ToS,
 * ::ffff:-mapped addresses, checksum made right). Codec 1 at offset 0 must give the same payload
 * bytes for both, and restoring must give back the same segment. */
static void check_as_ipv6(const struct nicd_pkt *p)
{
    size_t tcp = p->len - p->ihl;
    if (p->v6 || 40 + tcp > NICD_MAX_VERDICT || p->len > NICD_MAX_VERDICT)
        return;
    memset(v6pkt, 0, 40);
    v6pkt[0] = 0x60;
    v6pkt[6] = 6;
    v6pkt[7] = 64;
    v6pkt[18] = v6pkt[19] = v6pkt[34] = v6pkt[35] = 0xFF;
    memcpy(v6pkt + 20, &p->saddr, 4);
    memcpy(v6pkt + 36, &p->daddr, 4);
    memcpy(v6pkt + 40, p->ip + p->ihl, tcp);
    nicd_finish(v6pkt, 40 + tcp, p->tos);
    struct nicd_pkt q;
    if (nicd_parse(v6pkt, 40 + tcp, &q) != NICD_OK || !q.v6 || q.tos != p->tos || q.payload_len != p->payload_len ||
        q.thl != p->thl || q.seq != p->seq || nicd_marked_checksum(&q))
        abort();
    ptrdiff_t a = nicd_compress(p, 0, -10, 0x2C, 5, out, sizeof out, scratch, NULL);
    ptrdiff_t b = nicd_compress(&q, 0, -10, 0x2C, 5, out6, sizeof out6, scratch, NULL);
    if ((a > (ptrdiff_t)NICD_TOO_SHORT) != (b > (ptrdiff_t)NICD_TOO_SHORT))
        abort();
    if (a <= (ptrdiff_t)NICD_TOO_SHORT)
        return;
    if ((size_t)a - p->payload_off != (size_t)b - q.payload_off ||
        memcmp(out + p->payload_off, out6 + q.payload_off, (size_t)a - p->payload_off) != 0)
        abort();
    check_len_field(&q, out6, (size_t)b);
    struct nicd_pkt c;
    if (nicd_parse(out6, (size_t)b, &c) != NICD_OK || !nicd_marked_checksum(&c) || c.tos != 0x2C)
        abort();
    ptrdiff_t r = nicd_restore(&c, p->tos, back6, sizeof back6, scratch);
    if (r != (ptrdiff_t)(40 + tcp))
        abort();
    check_len_field(&q, back6, (size_t)r);
    struct nicd_pkt d;
    if (nicd_parse(back6, (size_t)r, &d) != NICD_OK || nicd_marked_checksum(&d) || d.tos != p->tos ||
        memcmp(back6 + 40, v6pkt + 40, 16) != 0 || memcmp(back6 + 58, v6pkt + 58, p->thl - 18) != 0)
        abort(); /* the TCP header comes back but for the checksum (right again, not marked) */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *pkt = malloc(size ? size : 1);
    memcpy(pkt, data, size);
    struct nicd_pkt p;
    int pr = nicd_parse(pkt, size, &p);
    if (pr == NICD_E_EXT_HEADER && (size < 40 || (pkt[0] >> 4) != 6 || !p.v6 || pkt[6] == 6))
        abort(); /* only an IPv6 header whose next header is not TCP */
    if (pr == NICD_OK) {
        if (p.len > size || p.payload_off + p.payload_len != p.len)
            abort();
        if (p.v6 && (p.ihl != 40 || p.len != 40 + ((size_t)pkt[4] << 8 | pkt[5]) || pkt[6] != 6))
            abort();
        nicd_restore(&p, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch);
        nicd_echo(&p);
        if (p.payload_len >= NICD_HDR_LEN) {
            uint8_t *c = pkt + p.payload_off;
            memset(c + 6, 0, 4);
            uint32_t crc = nicd_crc32c(0, c, p.payload_len);
            for (int i = 0; i < 4; i++)
                c[6 + i] = (uint8_t)(crc >> (8 * i));
        }
        pkt[p.ihl + 16] = pkt[p.ihl + 17] = 0;
        uint16_t sum = nicd_tcp_checksum(pkt, p.len);
        memcpy(pkt + p.ihl + 16, &sum, 2);
        /* a right checksum: an ordinary segment, never restored (whatever its payload says) */
        if (nicd_marked_checksum(&p) || nicd_restore(&p, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch) != NICD_E_CHECKSUM)
            abort();
        check_option(&p);
        check_merge(&p);
        check_merge_any(&p, pkt + p.len, size - p.len);
        check_as_ipv6(&p);
        /* the same with the checksum marked as a compressed packet's (big-endian arithmetic) */
        uint32_t want = (uint32_t)((pkt[p.ihl + 16] << 8) | pkt[p.ihl + 17]) + NICD_CSUM_MARK;
        want = (want & 0xFFFF) + (want >> 16);
        pkt[p.ihl + 16] = (uint8_t)(want >> 8), pkt[p.ihl + 17] = (uint8_t)want;
        if (!nicd_marked_checksum(&p))
            abort();
        nicd_restore(&p, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch);
        for (int codec = NICD_CODEC_INCEPTIONN; codec <= NICD_CODEC_SCALED; codec++) {
            check_gso(&p, (uint32_t)size & 3, codec);
            for (uint32_t off = 0; off < 4; off++) {
                uint16_t echo = (uint16_t)((p.ack + off) & NICD_ECHO_MASK);
                uint64_t tiers[4] = {0, 0, 0, 0}, want[4] = {0, 0, 0, 0};
                ptrdiff_t r = nicd_compress_codec(&p, off, codec, -10, 0x2C, echo, out, sizeof out, scratch, tiers);
                if (r > (ptrdiff_t)NICD_TOO_SHORT) {
                    if ((size_t)r >= p.len)
                        abort(); /* never bigger */
                    struct nicd_pkt c;
                    if (nicd_parse(out, (size_t)r, &c) != NICD_OK || nicd_codec_of(&c) != codec ||
                        !nicd_marked_checksum(&c) || nicd_echo(&c) != echo)
                        abort();
                    add_stream_tiers(&c, want);
                    if (memcmp(tiers, want, sizeof tiers) != 0)
                        abort();
                    int8_t x = (int8_t)out[c.payload_off + NICD_SCALE_AT];
                    if (codec == NICD_CODEC_INCEPTIONN ? x != 0 : (x < -NICD_SCALE_MAX || x > NICD_SCALE_MAX))
                        abort();
                    check_len_field(&p, out, (size_t)r);
                    ptrdiff_t b = nicd_restore(&c, INCEPTIONN_TOS_TAGGED, back, sizeof back, scratch);
                    if (b != (ptrdiff_t)p.len)
                        abort(); /* what we compress must restore to the original length */
                    check_len_field(&p, back, (size_t)b);
                    if (codec == NICD_CODEC_SCALED)
                        check_specials(&p, off, back);
                }
            }
        }
    }
    free(pkt);
    return 0;
}
