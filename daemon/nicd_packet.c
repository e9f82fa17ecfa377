/* Soft-NIC packet transforms. See nicd_packet.h and docs/wire-format.md. */
#include "nicd_packet.h"

#include <string.h>

#include "inceptionn_codec.h"

/* ---- checksums ---------------------------------------------------------------------------- */

/* Ones-complement sum in the host's little-endian byte order: summing byte-swapped 16-bit words
 * gives the byte-swapped sum, so storing the folded result with memcpy writes network order. */
static uint64_t sum_le(const uint8_t *b, size_t len, uint64_t acc)
{
    while (len >= 4) {
        uint32_t w;
        memcpy(&w, b, 4);
        acc += w;
        b += 4;
        len -= 4;
    }
    if (len >= 2) {
        uint16_t w;
        memcpy(&w, b, 2);
        acc += w;
        b += 2;
        len -= 2;
    }
    if (len)
        acc += b[0]; /* odd byte: the high byte of a zero-padded network word */
    return acc;
}

static uint16_t fold(uint64_t acc)
{
    while (acc >> 16)
        acc = (acc & 0xFFFF) + (acc >> 16);
    return (uint16_t)acc;
}

/* IP header bytes of a well-formed packet: IPv6's fixed header, or IPv4's IHL. */
static size_t ip_hdr_len(const uint8_t *ip)
{
    return (ip[0] >> 4) == 6 ? 40 : (size_t)(ip[0] & 15) * 4;
}

static uint64_t pseudo_header(const uint8_t *ip, size_t tcp_len)
{
    if ((ip[0] >> 4) == 6) { /* RFC 8200 section 8.1: addresses, 32-bit length, 3 zeros, 6 */
        uint8_t ph[40];
        memcpy(ph, ip + 8, 32);
        ph[32] = ph[33] = 0;
        ph[34] = (uint8_t)(tcp_len >> 8);
        ph[35] = (uint8_t)tcp_len;
        ph[36] = ph[37] = ph[38] = 0;
        ph[39] = 6;
        return sum_le(ph, sizeof ph, 0);
    }
    uint8_t ph[12];
    memcpy(ph, ip + 12, 8); /* saddr, daddr */
    ph[8] = 0;
    ph[9] = 6;
    ph[10] = (uint8_t)(tcp_len >> 8);
    ph[11] = (uint8_t)tcp_len;
    return sum_le(ph, sizeof ph, 0);
}

/* Checksum of the TCP segment of a well-formed IPv4 or IPv6 packet of length len (field included). */
uint16_t nicd_tcp_checksum(const uint8_t *ip, size_t len)
{
    size_t ihl = ip_hdr_len(ip);
    return (uint16_t)~fold(sum_le(ip + ihl, len - ihl, pseudo_header(ip, len - ihl)));
}

static void fix_ip_checksum(uint8_t *ip)
{
    size_t ihl = (size_t)(ip[0] & 15) * 4;
    ip[10] = ip[11] = 0;
    uint16_t c = (uint16_t)~fold(sum_le(ip, ihl, 0));
    memcpy(ip + 10, &c, 2);
}

static void fix_tcp_checksum(uint8_t *ip, size_t len)
{
    size_t ihl = ip_hdr_len(ip);
    ip[ihl + 16] = ip[ihl + 17] = 0;
    uint16_t c = nicd_tcp_checksum(ip, len);
    memcpy(ip + ihl + 16, &c, 2);
}

/* NICD_CSUM_MARK as sum_le sees it (byte-swapped words). */
#define CSUM_MARK_LE ((uint16_t)((NICD_CSUM_MARK >> 8) | ((NICD_CSUM_MARK & 0xFF) << 8)))

/* The folded sum over p's TCP pseudo-header and segment, checksum field included: 0xFFFF when
 * the checksum is right, CSUM_MARK_LE when a soft NIC compressed the packet. */
static uint16_t segment_sum(const struct nicd_pkt *p)
{
    return fold(sum_le(p->ip + p->ihl, p->len - p->ihl, pseudo_header(p->ip, p->len - p->ihl)));
}

/* Make the TCP checksum (right after fix_tcp_checksum) wrong by exactly NICD_CSUM_MARK: the
 * whole segment then sums to the mark, never to 0xFFFF, so every TCP stack drops the packet
 * until a soft NIC restores it, whatever DSCP it arrives with. */
static void mark_tcp_checksum(uint8_t *ip)
{
    size_t ihl = ip_hdr_len(ip);
    uint16_t c;
    memcpy(&c, ip + ihl + 16, 2);
    c = fold((uint64_t)c + CSUM_MARK_LE);
    memcpy(ip + ihl + 16, &c, 2);
}

int nicd_marked_checksum(const struct nicd_pkt *p)
{
    return segment_sum(p) == CSUM_MARK_LE;
}

/* IPv6's traffic class: bits 4..11 of the first 32-bit word, after the version nibble. */
static void set_tclass(uint8_t *ip, uint8_t tos)
{
    ip[0] = (uint8_t)(0x60 | tos >> 4);
    ip[1] = (uint8_t)(tos << 4 | (ip[1] & 15));
}

void nicd_set_tos(uint8_t *ip, uint8_t tos)
{
    if ((ip[0] >> 4) == 6) {
        set_tclass(ip, tos);
        return;
    }
    ip[1] = tos;
    fix_ip_checksum(ip);
}

/* CRC32C (Castagnoli): SSE4.2 instruction where present, a table otherwise. */
static uint32_t crc_table[256];

__attribute__((constructor)) static void build_crc_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        crc_table[i] = c;
    }
}

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *b, size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        c = _mm_crc32_u64(c, w);
        b += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = _mm_crc32_u8(c32, *b++);
    return c32;
}
#endif

uint32_t nicd_crc32c(uint32_t crc, const uint8_t *b, size_t len)
{
    crc = ~crc;
#if defined(__x86_64__)
    static int hw = -1;
    if (hw < 0)
        hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (hw)
        return ~crc32c_hw(crc, b, len);
#endif
    while (len--)
        crc = (crc >> 8) ^ crc_table[(crc ^ *b++) & 0xFF];
    return ~crc;
}

/* CRC of a compressed payload (header included) with its CRC field (bytes 6..9) taken as zero. */
static uint32_t payload_crc(const uint8_t *c, size_t len)
{
    static const uint8_t zero[4] = {0, 0, 0, 0};
    uint32_t crc = nicd_crc32c(0, c, 6);
    crc = nicd_crc32c(crc, zero, 4);
    return nicd_crc32c(crc, c + 10, len - 10);
}

/* ---- parsing ------------------------------------------------------------------------------ */

/* IPv6 next-header values that are extension headers (RFC 8200 section 4, the IANA list):
 * hop-by-hop, routing, fragment, ESP, AH, destination options, mobility, HIP, shim6, and the
 * two experimental ones. */
static int ipv6_ext_header(uint8_t nh)
{
    switch (nh) {
    case 0: case 43: case 44: case 50: case 51: case 60: case 135: case 139: case 140: case 253: case 254:
        return 1;
    default:
        return 0;
    }
}

/* The IP layer: header length and total length, checked against caplen; addresses, ToS. */
static int parse_ip(const uint8_t *b, size_t caplen, struct nicd_pkt *p, size_t *ihl_out, size_t *tot_out)
{
    if (caplen < 20)
        return NICD_E_IP;
    if ((b[0] >> 4) == 6) {
        if (caplen < 40)
            return NICD_E_IP;
        p->v6 = 1;
        p->tos = (uint8_t)(b[0] << 4 | b[1] >> 4);
        size_t tot = 40 + (((size_t)b[4] << 8) | b[5]);
        if (tot > caplen) /* a payload length past the packet (or a jumbogram's 0) */
            return NICD_E_IP;
        if (b[6] != 6) /* TCP right after the fixed header, or not ours to transform */
            return ipv6_ext_header(b[6]) ? NICD_E_EXT_HEADER : NICD_E_NOT_TCP;
        p->saddr = p->daddr = 0;
        memcpy(p->saddr6, b + 8, 16);
        memcpy(p->daddr6, b + 24, 16);
        *ihl_out = 40, *tot_out = tot;
        return NICD_OK;
    }
    if ((b[0] >> 4) != 4)
        return NICD_E_IP;
    size_t ihl = (size_t)(b[0] & 15) * 4;
    size_t tot = ((size_t)b[2] << 8) | b[3];
    if (ihl < 20 || tot < ihl || tot > caplen)
        return NICD_E_IP;
    if (b[9] != 6 || ((((unsigned)b[6] << 8) | b[7]) & 0x3FFF) != 0) /* TCP, not a fragment */
        return NICD_E_NOT_TCP;
    p->v6 = 0;
    p->tos = b[1];
    memcpy(&p->saddr, b + 12, 4);
    memcpy(&p->daddr, b + 16, 4);
    *ihl_out = ihl, *tot_out = tot;
    return NICD_OK;
}

int nicd_parse(const uint8_t *b, size_t caplen, struct nicd_pkt *p)
{
    size_t ihl, tot;
    int r = parse_ip(b, caplen, p, &ihl, &tot);
    if (r != NICD_OK)
        return r;
    if (tot - ihl < 20)
        return NICD_E_TCP;
    const uint8_t *t = b + ihl;
    size_t thl = (size_t)(t[12] >> 4) * 4;
    if (thl < 20 || thl > tot - ihl)
        return NICD_E_TCP;
    p->ip = b;
    p->len = tot;
    p->ihl = ihl;
    p->thl = thl;
    p->payload_off = ihl + thl;
    p->payload_len = tot - ihl - thl;
    p->sport = (uint16_t)((t[0] << 8) | t[1]);
    p->dport = (uint16_t)((t[2] << 8) | t[3]);
    p->seq = ((uint32_t)t[4] << 24) | ((uint32_t)t[5] << 16) | ((uint32_t)t[6] << 8) | t[7];
    p->ack = ((uint32_t)t[8] << 24) | ((uint32_t)t[9] << 16) | ((uint32_t)t[10] << 8) | t[11];
    p->tcp_flags = t[13];
    return NICD_OK;
}

/* ---- compress / restore ------------------------------------------------------------------- */

/* The IP header's length field for a packet of len bytes (IPv6: its payload length). */
static void set_ip_length(uint8_t *ip, size_t len)
{
    int v6 = (ip[0] >> 4) == 6;
    size_t said = v6 ? len - 40 : len, at = v6 ? 4 : 2;
    ip[at] = (uint8_t)(said >> 8);
    ip[at + 1] = (uint8_t)said;
}

static void finish_packet(uint8_t *out, size_t len, uint8_t tos)
{
    set_ip_length(out, len);
    if ((out[0] >> 4) == 6) { /* no header checksum */
        set_tclass(out, tos);
    } else {
        out[1] = tos;
        fix_ip_checksum(out);
    }
    fix_tcp_checksum(out, len);
}

void nicd_finish(uint8_t *ip, size_t len, uint8_t tos)
{
    finish_packet(ip, len, tos);
}

/* Write the shim header in front of a compressed payload of clen bytes whose body (raw ends
 * and group stream) is already in place, CRC32C last. Byte 10 is the scale exponent of codec 2
 * (zero for codec 1). */
static void seal_payload(uint8_t *c, size_t head, size_t tail, uint16_t echo, size_t nfloats, size_t clen,
                         int codec, int scale)
{
    c[0] = NICD_MAGIC;
    c[1] = (uint8_t)((NICD_VERSION << 4) | codec);
    c[2] = (uint8_t)(head | (tail << 2) | ((echo & 15) << 4));
    c[3] = (uint8_t)((echo & NICD_ECHO_MASK) >> 4);
    c[NICD_SCALE_AT] = (uint8_t)(int8_t)scale;
    c[4] = (uint8_t)nfloats;
    c[5] = (uint8_t)(nfloats >> 8);
    uint32_t crc = payload_crc(c, clen);
    for (int i = 0; i < 4; i++)
        c[6 + i] = (uint8_t)(crc >> (8 * i));
}

/* Float alignment (rule 2): `head` raw bytes up to the stream's next float boundary, n whole
 * floats, `tail` raw bytes after them. Returns 0 when the payload holds no whole float. */
static int split_payload(size_t plen, uint32_t stream_off, size_t *head, size_t *n, size_t *tail)
{
    size_t h = (4 - (stream_off & 3)) & 3;
    if (h > plen)
        h = plen;
    *head = h;
    *n = (plen - h) / 4;
    *tail = plen - h - 4 * *n;
    return *n != 0;
}

/* Codec 2 (docs/wire-format.md, "Scaled codec"): the power of two 2^x that brings the largest
 * finite magnitude of v into [0.5, 1), where the codec keeps its precision. x is clamped to
 * [-NICD_SCALE_MAX, NICD_SCALE_MAX], so 2^x and 2^-x are normal floats; 0 when no value is
 * finite and non-zero. Infinities and NaNs do not count (they travel as NO_COMPRESS lanes). */
int nicd_scale_exponent(const float *v, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        b &= 0x7FFFFFFFu;
        if (b < 0x7F800000u && b > m)
            m = b;
    }
    if (!m)
        return 0;
    int x = 126 - (int)(m >> 23); /* biased exponent e: m * 2^(126-e) is in [0.5, 1); a denormal's is 0 */
    return x < -NICD_SCALE_MAX ? -NICD_SCALE_MAX : x;
}

/* v *= 2^x for every finite value (exact, unless the product falls into the denormal range);
 * infinities and NaNs keep their bits, a NaN's payload included. */
void nicd_scale(float *v, size_t n, int x)
{
    uint32_t sb = (uint32_t)(127 + x) << 23;
    float s;
    memcpy(&s, &sb, 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        if ((b & 0x7F800000u) != 0x7F800000u)
            v[i] *= s;
    }
}

/* The tier counters (nicd_compress_codec's and nicd_compress_gso_codec's `tiers`) are read off
 * the tag words of the stream we just encoded, in the walk that finds its groups anyway: one table
 * lookup per tag byte (4 lanes) gives the lanes' payload bytes and their tiers, so neither a second
 * pass over the stream (inc_stream_histogram validates each group as a decoder must, which our own
 * encoder's output does not need) nor a loop over the lanes is paid. A tag byte's 8-bit, 16-bit and
 * 32-bit lanes are counted in three 21-bit fields of one word: a packet's at most 16384 values
 * never carry into the next field. */
#define TIER_FIELD 21
#define TIER_MASK ((1u << TIER_FIELD) - 1)
static uint8_t tag_bytes[256];  /* payload bytes of the 4 lanes a tag byte describes */
static uint64_t tag_tiers[256]; /* their 8-, 16- and 32-bit lanes, one field each */

__attribute__((constructor)) static void build_tag_tables(void)
{
    static const uint8_t lane[4] = {0, 1, 2, 4};
    for (unsigned b = 0; b < 256; b++) {
        uint64_t t = 0;
        unsigned bytes = 0;
        for (int i = 0; i < 4; i++) {
            unsigned tag = (b >> (2 * i)) & 3;
            bytes += lane[tag];
            if (tag)
                t += (uint64_t)1 << (TIER_FIELD * (tag - 1));
        }
        tag_bytes[b] = (uint8_t)bytes;
        tag_tiers[b] = t;
    }
}

/* Bytes of one encoded group from its tag word: 2 + each lane's 0, 1, 2 or 4 bytes. */
static size_t group_bytes(const uint8_t *g)
{
    return 2 + (size_t)tag_bytes[g[0]] + tag_bytes[g[1]];
}

/* The tier counts one sum of tag_tiers stands for, added to tiers[4]: n values in all, those not
 * in a field sent in the 0-bit tier (the padding lanes of a last group are 0-bit and not among n). */
static void add_tiers(uint64_t acc, size_t n, uint64_t *tiers)
{
    uint64_t n8 = acc & TIER_MASK, n16 = (acc >> TIER_FIELD) & TIER_MASK, n32 = (acc >> (2 * TIER_FIELD)) & TIER_MASK;
    tiers[0] += n - n8 - n16 - n32;
    tiers[1] += n8, tiers[2] += n16, tiers[3] += n32;
}

/* The tier counts of a stream of n values our encoder wrote (slen bytes, well formed). */
static void stream_tiers(const uint8_t *s, size_t slen, size_t n, uint64_t *tiers)
{
    uint64_t acc = 0;
    for (size_t at = 0; at + 2 <= slen; at += group_bytes(s + at))
        acc += tag_tiers[s[at]] + tag_tiers[s[at + 1]];
    add_tiers(acc, n, tiers);
}

ptrdiff_t nicd_compress(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                        uint8_t tos, uint16_t echo, uint8_t *out, size_t cap, float *scratch, uint64_t *tiers)
{
    return nicd_compress_codec(p, stream_off, NICD_CODEC_INCEPTIONN, error_bound, tos, echo, out, cap, scratch,
                               tiers);
}

ptrdiff_t nicd_compress_codec(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                              uint8_t tos, uint16_t echo, uint8_t *out, size_t cap, float *scratch,
                              uint64_t *tiers)
{
    size_t plen = p->payload_len, head, n, tail;
    if (!split_payload(plen, stream_off, &head, &n, &tail))
        return NICD_TOO_SHORT;
    size_t fixed = NICD_HDR_LEN + head + tail;
    /* Never bigger: the stream must fit in what is left of the original payload minus one byte.
     * inc_encode fails with INC_E_SPACE as soon as it cannot, so this costs no extra pass.
     * A packet the receiver could not hand back restored (over NICD_MAX_VERDICT) stays raw. */
    if (plen <= fixed + 2 || cap < p->len || p->len > NICD_MAX_VERDICT)
        return NICD_NOT_SMALLER;
    size_t budget = plen - 1 - fixed;

    const uint8_t *src = p->ip + p->payload_off;
    uint8_t *c = out + p->payload_off;
    memcpy(scratch, src + head, 4 * n); /* aligned copy: the payload has no float alignment */
    int scale = codec == NICD_CODEC_SCALED ? nicd_scale_exponent(scratch, n) : 0;
    if (scale)
        nicd_scale(scratch, n, scale);
    ptrdiff_t slen = inc_encode(scratch, n, error_bound, c + NICD_HDR_LEN + head, budget,
                                INC_IMPL_AUTO);
    if (slen == INC_E_SPACE)
        return NICD_NOT_SMALLER;
    if (slen < 0)
        return NICD_E_SPACE;
    if (tiers)
        stream_tiers(c + NICD_HDR_LEN + head, (size_t)slen, n, tiers);

    memcpy(out, p->ip, p->payload_off);
    memcpy(c + NICD_HDR_LEN, src, head);
    memcpy(c + NICD_HDR_LEN + head + slen, src + head + 4 * n, tail);
    size_t clen = fixed + (size_t)slen;
    seal_payload(c, head, tail, echo, n, clen, codec, scale);
    size_t len = p->payload_off + clen;
    finish_packet(out, len, tos);
    mark_tcp_checksum(out);
    return (ptrdiff_t)len;
}


/* Where a super-packet's encoded stream is cut into packets (gso) or train segments (v3). */
struct cut {
    size_t s0, bytes;   /* the stream slice */
    size_t nfloats;
    size_t off, orig;   /* the original payload range it covers: offset, length */
};
#define NICD_MAX_CUTS 128

/* Greedy: each piece takes whole groups while its stream and raw ends fit `room` (the fewest
 * pieces for ranges in order); the first also carries `head`, the last `tail`. With `even`, when
 * what is left needs exactly two pieces, they share it evenly: a last piece of a few floats could
 * not shrink below its shim header, and would leave the whole super-packet raw. Returns the number
 * of pieces (acc += the tiers of their groups, stream_tiers), or -1 when more than max_segs (or
 * NICD_MAX_CUTS) would be needed or a group does not fit. */
static int plan_cuts(const uint8_t *stream, size_t slen, size_t n, size_t head, size_t tail, size_t room,
                     int even, int max_segs, struct cut *cuts, uint64_t *acc)
{
    size_t groups = (n + 7) / 8, g = 0, at = 0;
    int segs = 0;
    if (max_segs > NICD_MAX_CUTS)
        max_segs = NICD_MAX_CUTS;
    while (g < groups) {
        size_t g0 = g, s0 = at, bytes = 0;
        size_t ends = (g0 == 0 ? head : 0) + tail; /* tail reserved: this may be the last */
        size_t left = slen - at + ends;
        size_t half = even && left > room && left + 2 * INC_MAX_GROUP_BYTES <= 2 * room ? left / 2 : room;
        while (g < groups) {
            size_t b = group_bytes(stream + at);
            if (bytes + b + ends > room || bytes + ends >= half)
                break;
            *acc += tag_tiers[stream[at]] + tag_tiers[stream[at + 1]];
            bytes += b, at += b, g++;
        }
        if (g == g0 || segs == max_segs)
            return -1;
        int last = g == groups;
        size_t f0 = g0 * 8, f1 = last ? n : g * 8; /* floats covered */
        size_t off = g0 == 0 ? 0 : head + 4 * f0;
        cuts[segs++] = (struct cut){.s0 = s0, .bytes = bytes, .nfloats = f1 - f0, .off = off,
                                    .orig = head + 4 * f1 + (last ? tail : 0) - off};
    }
    return segs;
}

/* A super-packet's n floats at src encoded once into `stream` (the pieces are cut from it); codec
 * 2: one exponent for the super-packet (*scale), carried by every piece cut from it. */
static ptrdiff_t encode_super(const uint8_t *src, size_t n, int codec, int error_bound, float *scratch,
                              uint8_t *stream, size_t stream_cap, int *scale)
{
    memcpy(scratch, src, 4 * n);
    *scale = codec == NICD_CODEC_SCALED ? nicd_scale_exponent(scratch, n) : 0;
    if (*scale)
        nicd_scale(scratch, n, *scale);
    return inc_encode(scratch, n, error_bound, stream, stream_cap, INC_IMPL_AUTO);
}

/* What both cutters (gso's packets, v3's train segments) do first: p's payload split at the
 * stream's float boundaries, encoded once, cut into pieces of at most `piece` bytes (a header of
 * hdr bytes, raw ends and whole groups). `padded`: every piece but the last is padded to `piece`
 * (v3), so the pieces are filled first and shared evenly only when the last would not shrink. Each piece must hold its header, both raw ends and one
 * worst-case group, and the whole restore into one verdict (<= NICD_MAX_VERDICT bytes, <= 16384
 * floats). NICD_OK with *segs pieces in pl, or NICD_TOO_SHORT, NICD_NOT_SMALLER, NICD_E_SPACE. */
struct plan {
    size_t head, n, tail;
    int scale;
    uint64_t acc; /* the tiers of the groups (stream_tiers) */
    struct cut cuts[NICD_MAX_CUTS];
};

static int plan_super(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound, size_t piece,
                      size_t hdr, int padded, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                      struct plan *pl, int *segs)
{
    if (!split_payload(p->payload_len, stream_off, &pl->head, &pl->n, &pl->tail))
        return NICD_TOO_SHORT;
    if (piece < hdr + 6 + INC_MAX_GROUP_BYTES || piece > NICD_MAX_VERDICT || p->len > NICD_MAX_VERDICT ||
        pl->n > 16384 || stream_cap < inc_max_encoded_size(pl->n) || max_segs < 1)
        return NICD_NOT_SMALLER;
    ptrdiff_t slen = encode_super(p->ip + p->payload_off + pl->head, pl->n, codec, error_bound, scratch, stream,
                                  stream_cap, &pl->scale);
    if (slen < 0)
        return NICD_E_SPACE;
    pl->acc = 0;
    *segs = plan_cuts(stream, (size_t)slen, pl->n, pl->head, pl->tail, piece - hdr, !padded, max_segs, pl->cuts,
                      &pl->acc);
    if (padded && *segs > 1) { /* full pieces first; the even split only if the last would not shrink */
        const struct cut *last = &pl->cuts[*segs - 1];
        if (hdr + last->bytes + pl->tail >= last->orig) {
            pl->acc = 0;
            *segs = plan_cuts(stream, (size_t)slen, pl->n, pl->head, pl->tail, piece - hdr, 1, max_segs, pl->cuts,
                              &pl->acc);
        }
    }
    return *segs < 0 ? NICD_NOT_SMALLER : NICD_OK;
}

/* One segment of nicd_compress_gso: the original's headers, then the shim header, `head` raw
 * bytes, the stream slice, `tail` raw bytes; seq advanced by `off` original payload bytes. */
static size_t gso_segment(const struct nicd_pkt *p, size_t off, const uint8_t *head, size_t nhead,
                          const uint8_t *s, size_t slen, size_t nfloats, const uint8_t *tail,
                          size_t ntail, int first, int last, unsigned idx, uint8_t tos, uint16_t echo,
                          int codec, int scale,
                          uint8_t *out)
{
    memcpy(out, p->ip, p->payload_off);
    uint8_t *c = out + p->payload_off;
    memcpy(c + NICD_HDR_LEN, head, nhead);
    memcpy(c + NICD_HDR_LEN + nhead, s, slen);
    memcpy(c + NICD_HDR_LEN + nhead + slen, tail, ntail);
    size_t clen = NICD_HDR_LEN + nhead + slen + ntail;
    seal_payload(c, nhead, ntail, echo, nfloats, clen, codec, scale);
    if (!p->v6) { /* IPv6 has no IP id outside a fragment header */
        uint16_t id = (uint16_t)(((unsigned)p->ip[4] << 8 | p->ip[5]) + idx); /* as the kernel's GSO */
        out[4] = (uint8_t)(id >> 8);
        out[5] = (uint8_t)id;
    }
    uint8_t *t = out + p->ihl;
    uint32_t seq = p->seq + (uint32_t)off;
    t[4] = (uint8_t)(seq >> 24), t[5] = (uint8_t)(seq >> 16), t[6] = (uint8_t)(seq >> 8), t[7] = (uint8_t)seq;
    if (!last)
        t[13] &= (uint8_t)~(TCP_FIN | TCP_PSH);
    if (!first)
        t[13] &= (uint8_t)~TCP_CWR;
    size_t len = p->payload_off + clen;
    finish_packet(out, len, tos);
    mark_tcp_checksum(out);
    return len;
}

ptrdiff_t nicd_compress_gso(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                            uint8_t tos, uint16_t echo, size_t mtu, uint8_t *out, size_t cap, size_t *seg_len,
                            int *nsegs, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                            uint64_t *tiers)
{
    return nicd_compress_gso_codec(p, stream_off, NICD_CODEC_INCEPTIONN, error_bound, tos, echo, mtu, out, cap,
                                   seg_len, nsegs, max_segs, scratch, stream, stream_cap, tiers);
}

ptrdiff_t nicd_compress_gso_codec(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                                  uint8_t tos, uint16_t echo, size_t mtu, uint8_t *out, size_t cap, size_t *seg_len,
                                  int *nsegs, int max_segs, float *scratch, uint8_t *stream,
                                  size_t stream_cap, uint64_t *tiers)
{
    struct plan pl;
    int segs, r = plan_super(p, stream_off, codec, error_bound, mtu > p->payload_off ? mtu - p->payload_off : 0,
                             NICD_HDR_LEN, 0, max_segs, scratch, stream, stream_cap, &pl, &segs);
    if (r != NICD_OK)
        return r;
    const uint8_t *src = p->ip + p->payload_off;
    size_t head = pl.head, n = pl.n, tail = pl.tail;
    int scale = pl.scale;
    const struct cut *cuts = pl.cuts;
    size_t used = 0;
    for (int i = 0; i < segs; i++) {
        const struct cut *k = &cuts[i];
        int first = i == 0, last = i == segs - 1;
        size_t wire = NICD_HDR_LEN + (first ? head : 0) + k->bytes + (last ? tail : 0);
        if (wire >= k->orig) /* never bigger, per packet */
            return NICD_NOT_SMALLER;
        if (used + p->payload_off + wire > cap)
            return NICD_E_SPACE;
        seg_len[i] = gso_segment(p, k->off, src, first ? head : 0, stream + k->s0, k->bytes, k->nfloats,
                                 src + head + 4 * n, last ? tail : 0, first, last, (unsigned)i,
                                 tos, echo, codec, scale, out + used);
        used += seg_len[i];
    }
    *nsegs = segs;
    if (tiers) /* counted only for a super-packet that leaves compressed */
        add_tiers(pl.acc, n, tiers);
    return (ptrdiff_t)used;
}

/* Byte 1 names this version and a codec we decode; byte 10 is zero for codec 1 and a scale
 * exponent in [-NICD_SCALE_MAX, NICD_SCALE_MAX] for codec 2 (v2 and v3 alike). */
static int header_codec_ok(const uint8_t *c, int version)
{
    if (c[1] == ((version << 4) | NICD_CODEC_INCEPTIONN))
        return c[NICD_SCALE_AT] == 0;
    if (c[1] == ((version << 4) | NICD_CODEC_SCALED))
        return (int8_t)c[NICD_SCALE_AT] >= -NICD_SCALE_MAX && (int8_t)c[NICD_SCALE_AT] <= NICD_SCALE_MAX;
    return 0;
}

int nicd_codec_of(const struct nicd_pkt *p)
{
    if (p->payload_len < NICD_HDR_LEN)
        return -1;
    return p->ip[p->payload_off + 1] & 15;
}

ptrdiff_t nicd_restore(const struct nicd_pkt *p, uint8_t tos, uint8_t *out, size_t cap,
                       float *scratch)
{
    /* Check the whole packet first: after restoring we write a fresh checksum, which would
     * otherwise launder a header corrupted in transit. A compressed packet's checksum is wrong
     * by exactly the mark; one that sums right is an ordinary segment, not ours to restore. */
    if (!nicd_marked_checksum(p))
        return NICD_E_CHECKSUM;
    const uint8_t *c = p->ip + p->payload_off;
    size_t clen = p->payload_len;
    if (clen < NICD_HDR_LEN || c[0] != NICD_MAGIC || !header_codec_ok(c, NICD_VERSION))
        return NICD_E_HEADER;
    size_t head = c[2] & 3, tail = (c[2] >> 2) & 3;
    size_t n = (size_t)c[4] | ((size_t)c[5] << 8);
    if (NICD_HDR_LEN + head + tail > clen)
        return NICD_E_HEADER;
    uint32_t crc = (uint32_t)c[6] | ((uint32_t)c[7] << 8) | ((uint32_t)c[8] << 16) | ((uint32_t)c[9] << 24);
    if (payload_crc(c, clen) != crc)
        return NICD_E_CRC;
    size_t len = p->payload_off + head + 4 * n + tail;
    if (len > NICD_MAX_VERDICT || len > cap)
        return NICD_E_SPACE;
    const uint8_t *stream = c + NICD_HDR_LEN + head;
    size_t slen = clen - NICD_HDR_LEN - head - tail;
    if (inc_decode(stream, slen, scratch, n, NULL, INC_IMPL_AUTO) != INC_OK)
        return NICD_E_DECODE;
    if ((c[1] & 15) == NICD_CODEC_SCALED && c[NICD_SCALE_AT])
        nicd_scale(scratch, n, -(int8_t)c[NICD_SCALE_AT]); /* undo the sender's 2^x exactly */
    memcpy(out, p->ip, p->payload_off);
    uint8_t *d = out + p->payload_off;
    memcpy(d, c + NICD_HDR_LEN, head);
    memcpy(d + head, scratch, 4 * n);
    memcpy(d + head + 4 * n, stream + slen, tail);
    finish_packet(out, len, tos);
    return (ptrdiff_t)len;
}

/* ---- wire format v3: segment trains (nicd_packet.h) ---------------------------------------- */

static void put_le16(uint8_t *b, size_t v)
{
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8);
}

static size_t get_le16(const uint8_t *b)
{
    return (size_t)b[0] | (size_t)b[1] << 8;
}

static uint32_t get_le32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_le32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

/* One train segment at c, wlen bytes: header, head, stream slice, tail, zero padding, CRC last. */
static void v3_segment(uint8_t *c, size_t wlen, const uint8_t *head, size_t nhead, const uint8_t *s, size_t slen,
                       size_t nfloats, const uint8_t *tail, size_t ntail, uint16_t echo, int codec, int scale,
                       uint32_t orig_seq)
{
    c[0] = NICD_MAGIC;
    c[1] = (uint8_t)((NICD_V3_VERSION << 4) | codec);
    c[2] = (uint8_t)(nhead | (ntail << 2) | ((echo & 15) << 4));
    c[3] = (uint8_t)((echo & NICD_ECHO_MASK) >> 4);
    put_le16(c + 4, nfloats);
    c[NICD_SCALE_AT] = (uint8_t)(int8_t)scale;
    c[11] = 0;
    put_le32(c + 12, orig_seq);
    put_le16(c + 16, slen);
    put_le16(c + 18, wlen);
    uint8_t *b = c + NICD_V3_HDR_LEN;
    memcpy(b, head, nhead);
    memcpy(b + nhead, s, slen);
    memcpy(b + nhead + slen, tail, ntail);
    size_t body = NICD_V3_HDR_LEN + nhead + slen + ntail;
    memset(c + body, 0, wlen - body);
    put_le32(c + 6, payload_crc(c, wlen));
}

ptrdiff_t nicd_compress_train(const struct nicd_pkt *p, uint32_t stream_off, int codec, int error_bound,
                              uint8_t tos, uint16_t echo, size_t gso_size, uint8_t *out, size_t cap,
                              int *nsegs, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                              uint64_t *tiers)
{
    struct plan pl;
    int segs, r = plan_super(p, stream_off, codec, error_bound, gso_size, NICD_V3_HDR_LEN, 1, max_segs, scratch,
                             stream, stream_cap, &pl, &segs);
    if (r != NICD_OK)
        return r;
    const uint8_t *src = p->ip + p->payload_off;
    size_t head = pl.head, n = pl.n, tail = pl.tail;
    const struct cut *cuts = pl.cuts;
    size_t used = p->payload_off;
    for (int i = 0; i < segs; i++) {
        const struct cut *k = &cuts[i];
        int first = i == 0, last = i == segs - 1;
        /* every segment but the last exactly gso_size: where the kernel's GSO cuts */
        size_t body = NICD_V3_HDR_LEN + (first ? head : 0) + k->bytes + (last ? tail : 0);
        size_t wlen = last ? body : gso_size;
        if (wlen >= k->orig) /* never bigger, per segment */
            return NICD_NOT_SMALLER;
        if (used + wlen > cap)
            return NICD_E_SPACE;
        v3_segment(out + used, wlen, src, first ? head : 0, stream + k->s0, k->bytes, k->nfloats,
                   src + head + 4 * n, last ? tail : 0, echo, codec, pl.scale, p->seq + (uint32_t)k->off);
        used += wlen;
    }
    memcpy(out, p->ip, p->payload_off);
    uint8_t *t = out + p->ihl;
    uint32_t seq = p->seq + NICD_V3_SEQ_OFFSET;
    t[4] = (uint8_t)(seq >> 24), t[5] = (uint8_t)(seq >> 16), t[6] = (uint8_t)(seq >> 8), t[7] = (uint8_t)seq;
    finish_packet(out, used, tos);
    *nsegs = segs;
    if (tiers) /* counted only for a super-packet that leaves compressed */
        add_tiers(pl.acc, n, tiers);
    return (ptrdiff_t)used;
}

/* Check and decode the train segment at c (avail bytes left in the packet, wire_seq its seq on
 * the wire) into d (room bytes): its wire length, original seq and restored length out. The
 * checks in order: header (magic, version 3, codec and exponent, reserved byte, lengths within
 * the packet, the original seq at or past the wire offset by less than 64 KB), zero padding,
 * CRC32C, room, group stream. */
static int v3_restore_segment(const uint8_t *c, size_t avail, uint32_t wire_seq, uint8_t *d, size_t room,
                              float *scratch, size_t *wlen, uint32_t *orig_seq, size_t *olen)
{
    if (avail < NICD_V3_HDR_LEN || c[0] != NICD_MAGIC || !header_codec_ok(c, NICD_V3_VERSION) || c[11] != 0)
        return NICD_E_HEADER;
    size_t head = c[2] & 3, tail = (c[2] >> 2) & 3, n = get_le16(c + 4);
    size_t slen = get_le16(c + 16), w = get_le16(c + 18);
    uint32_t seq = get_le32(c + 12);
    size_t body = NICD_V3_HDR_LEN + head + slen + tail;
    if (w < body || w > avail || seq - (wire_seq - NICD_V3_SEQ_OFFSET) > 0xFFFFu)
        return NICD_E_HEADER;
    for (size_t i = body; i < w; i++)
        if (c[i])
            return NICD_E_HEADER;
    if (payload_crc(c, w) != get_le32(c + 6))
        return NICD_E_CRC;
    size_t len = head + 4 * n + tail;
    if (len > room)
        return NICD_E_SPACE;
    const uint8_t *s = c + NICD_V3_HDR_LEN + head;
    if (inc_decode(s, slen, scratch, n, NULL, INC_IMPL_AUTO) != INC_OK)
        return NICD_E_DECODE;
    if ((c[1] & 15) == NICD_CODEC_SCALED && c[NICD_SCALE_AT])
        nicd_scale(scratch, n, -(int8_t)c[NICD_SCALE_AT]); /* undo the sender's 2^x exactly */
    memcpy(d, c + NICD_V3_HDR_LEN, head);
    memcpy(d + head, scratch, 4 * n);
    memcpy(d + head + 4 * n, s + slen, tail);
    *wlen = w, *orig_seq = seq, *olen = len;
    return NICD_OK;
}

ptrdiff_t nicd_restore_train(const struct nicd_pkt *p, int verify_csum, uint8_t tos, uint8_t *out, size_t cap,
                             float *scratch, int *restored, int *left_off)
{
    *restored = *left_off = 0;
    /* As in nicd_restore: the fresh checksum written below must not launder a corrupted one. */
    if (verify_csum && segment_sum(p) != 0xFFFF)
        return NICD_E_CHECKSUM;
    const uint8_t *c = p->ip + p->payload_off;
    size_t clen = p->payload_len, at = 0, len = p->payload_off;
    size_t limit = cap < NICD_MAX_VERDICT ? cap : NICD_MAX_VERDICT;
    uint32_t first = 0, next = 0;
    if (len > limit)
        return NICD_E_SPACE;
    while (at < clen) {
        size_t w, olen;
        uint32_t seq;
        int r = v3_restore_segment(c + at, clen - at, p->seq + (uint32_t)at, out + len, limit - len, scratch, &w,
                                   &seq, &olen);
        if (r == NICD_OK && *restored && seq != next)
            r = NICD_E_HEADER; /* not the range after the one before: another train */
        if (r != NICD_OK) {
            if (!*restored)
                return r;
            break;
        }
        if (!*restored)
            first = seq;
        next = seq + (uint32_t)olen;
        ++*restored, at += w, len += olen;
    }
    if (!*restored)
        return NICD_E_HEADER; /* no payload at all */
    memcpy(out, p->ip, p->payload_off);
    uint8_t *t = out + p->ihl;
    t[4] = (uint8_t)(first >> 24), t[5] = (uint8_t)(first >> 16), t[6] = (uint8_t)(first >> 8), t[7] = (uint8_t)first;
    if (at < clen) { /* a tail left off: its FIN and PSH went with it */
        *left_off = (int)(clen - at);
        t[13] &= (uint8_t)~(TCP_FIN | TCP_PSH);
    }
    finish_packet(out, len, tos);
    return (ptrdiff_t)len;
}

int nicd_shim_version(const struct nicd_pkt *p)
{
    const uint8_t *c = p->ip + p->payload_off;
    if (p->payload_len < 2 || c[0] != NICD_MAGIC)
        return -1;
    return c[1] >> 4;
}

/* ---- receive offload: restored packets merged (nicd_packet.h) ------------------------------- */

int nicd_can_append(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, size_t cap)
{
    struct nicd_pkt pa, pb;
    if (nicd_parse(a, alen, &pa) != NICD_OK || nicd_parse(b, blen, &pb) != NICD_OK || pa.len != alen ||
        pb.len != blen || pa.v6 != pb.v6 || pa.ihl != pb.ihl || pa.thl != pb.thl || !pa.payload_len ||
        !pb.payload_len || pb.seq != pa.seq + (uint32_t)pa.payload_len)
        return 0;
    if (alen + pb.payload_len > cap || alen + pb.payload_len > NICD_MAX_VERDICT)
        return 0;
    if (pa.tcp_flags != TCP_ACK || (pb.tcp_flags & ~TCP_PSH) != TCP_ACK)
        return 0;
    if (pa.v6) { /* version, class, flow label; next header, hop limit, addresses */
        if (memcmp(a, b, 4) != 0 || memcmp(a + 6, b + 6, 34) != 0)
            return 0;
    } else if (memcmp(a, b, 2) != 0 || memcmp(a + 6, b + 6, 4) != 0 || memcmp(a + 12, b + 12, pa.ihl - 12) != 0) {
        return 0; /* version, IHL, ToS; fragment field, TTL, protocol; addresses and options */
    }
    const uint8_t *ta = a + pa.ihl, *tb = b + pb.ihl; /* ports; ack, offset; window; urgent, options */
    return memcmp(ta, tb, 4) == 0 && memcmp(ta + 8, tb + 8, 5) == 0 && memcmp(ta + 14, tb + 14, 2) == 0 &&
           memcmp(ta + 18, tb + 18, pa.thl - 18) == 0;
}

size_t nicd_append(uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    size_t ihl = ip_hdr_len(b), off = ihl + (size_t)(b[ihl + 12] >> 4) * 4, len = alen + (blen - off);
    memcpy(a + alen, b + off, blen - off);
    a[ihl + 13] = b[ihl + 13];
    set_ip_length(a, len);
    return len;
}

void nicd_finish_merged(uint8_t *a, size_t len)
{
    if ((a[0] >> 4) != 6)
        fix_ip_checksum(a);
    fix_tcp_checksum(a, len);
}

uint16_t nicd_echo(const struct nicd_pkt *p)
{
    const uint8_t *c = p->ip + p->payload_off;
    if (p->payload_len < NICD_HDR_LEN)
        return 0;
    return (uint16_t)((c[2] >> 4) | (c[3] << 4));
}

/* ---- the hello option -------------------------------------------------------------------- */

int nicd_find_option(const struct nicd_pkt *p, struct nicd_hello_opt *o)
{
    const uint8_t *t = p->ip + p->ihl;
    size_t i = 20;
    while (i < p->thl) {
        uint8_t kind = t[i];
        if (kind == 0) /* end of option list */
            return 0;
        if (kind == 1) { /* NOP */
            i++;
            continue;
        }
        if (i + 2 > p->thl || t[i + 1] < 2 || i + t[i + 1] > p->thl)
            return NICD_E_TCP;
        if (kind == NICD_OPT_KIND && t[i + 1] == NICD_OPT_LEN &&
            (((unsigned)t[i + 2] << 8) | t[i + 3]) == NICD_OPT_EXID && t[i + 9] == 0) {
            const uint8_t *b = t + i;
            o->version = b[4] >> 4;
            o->role = b[4] & 15;
            o->codec = b[5];
            o->error_bound = (int8_t)b[6];
            o->tos_compressed = b[7];
            o->orig_tos = b[8];
            memcpy(o->nonce, b + 10, NICD_NONCE_LEN);
            return (int)i;
        }
        i += t[i + 1];
    }
    return 0;
}

ptrdiff_t nicd_add_option(const struct nicd_pkt *p, const struct nicd_hello_opt *o, uint8_t tos,
                          uint8_t *out, size_t cap)
{
    size_t len = p->len + NICD_OPT_LEN;
    if (p->payload_len || p->thl + NICD_OPT_LEN > 60 || len > cap || len > NICD_MAX_VERDICT)
        return NICD_E_SPACE;
    size_t opts = p->ihl + 20;
    memcpy(out, p->ip, opts);
    uint8_t *b = out + opts;
    b[0] = NICD_OPT_KIND;
    b[1] = NICD_OPT_LEN;
    b[2] = NICD_OPT_EXID >> 8;
    b[3] = NICD_OPT_EXID & 0xFF;
    b[4] = (uint8_t)(o->version << 4 | (o->role & 15));
    b[5] = o->codec;
    b[6] = (uint8_t)o->error_bound;
    b[7] = o->tos_compressed;
    b[8] = o->orig_tos;
    b[9] = 0;
    memcpy(b + 10, o->nonce, NICD_NONCE_LEN);
    memcpy(b + NICD_OPT_LEN, p->ip + opts, p->len - opts);
    uint8_t *t = out + p->ihl;
    t[12] = (uint8_t)((((p->thl + NICD_OPT_LEN) / 4) << 4) | (t[12] & 15));
    finish_packet(out, len, tos);
    return (ptrdiff_t)len;
}

ptrdiff_t nicd_strip_option(const struct nicd_pkt *p, size_t off, uint8_t tos, uint8_t *out,
                            size_t cap)
{
    if (off < 20 || off + NICD_OPT_LEN > p->thl || p->len > cap)
        return NICD_E_TCP;
    /* As in nicd_restore: the fresh checksum written below must not launder a corrupted one. */
    if (segment_sum(p) != 0xFFFF)
        return NICD_E_CHECKSUM;
    size_t at = p->ihl + off, len = p->len - NICD_OPT_LEN;
    memcpy(out, p->ip, at);
    memcpy(out + at, p->ip + at + NICD_OPT_LEN, p->len - at - NICD_OPT_LEN);
    uint8_t *t = out + p->ihl;
    t[12] = (uint8_t)((((p->thl - NICD_OPT_LEN) / 4) << 4) | (t[12] & 15));
    finish_packet(out, len, tos);
    return (ptrdiff_t)len;
}

const char *nicd_strerror(int r)
{
    switch (r) {
    case NICD_OK: return "ok";
    case NICD_NOT_SMALLER: return "compressed form not smaller";
    case NICD_TOO_SHORT: return "payload holds no whole float";
    case NICD_E_IP: return "malformed IP header";
    case NICD_E_NOT_TCP: return "not TCP or a fragment";
    case NICD_E_TCP: return "malformed TCP header";
    case NICD_E_CHECKSUM: return "bad TCP checksum";
    case NICD_E_HEADER: return "bad compression header";
    case NICD_E_CRC: return "CRC32C mismatch";
    case NICD_E_DECODE: return "malformed group stream";
    case NICD_E_SPACE: return "restored packet too large";
    case NICD_E_EXT_HEADER: return "IPv6 extension header";
    default: return "unknown";
    }
}
