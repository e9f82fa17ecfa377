/*
 * libFuzzer target for wire format v3, the segment trains (nicd_compress_train,
 * nicd_restore_train): the input is an IPv4 or IPv6 packet as it would arrive from the network,
 * copied to an exactly-sized buffer. Whatever parses is restored as a train twice: as it came, and
 * with every segment header the walk finds made consistent (its original seq put within the 64
 * KB behind its wire seq, zero padding, a valid CRC32C), so that mutations reach the length
 * checks, the run joining and the decoder instead of stopping at the integrity checks. A restore
 * that succeeds must give a packet that parses, says its own length, fits a verdict, has a right
 * TCP checksum, and drops FIN and PSH when it left a tail off; a v2 packet is never a train.
 * Then the packet is taken as a super-packet and compressed into a train for a gso_size the seq
 * picks (and 1448): the train must be smaller, carry seq + 2^31 and right checksums; cut as the
 * kernel's GSO cuts it (seq + k * gso_size, FIN/PSH on the last only) every segment but the last
 * is exactly gso_size bytes and restores alone to its range at its original seq, the ranges
 * covering the payload once and in order, raw ends unchanged; a run of consecutive segments
 * merged as GRO merges them restores to exactly their ranges joined; the whole train restores to
 * the original's length and seq. Build: the Makefile's build/fuzz_nicd_train.
 */
#include "inceptionn_contract.h"
#include "nicd_packet.h"

#include <stdlib.h>
#include <string.h>

static float scratch[16384 + 16];
static uint8_t train[NICD_MAX_PACKET + 64], out[NICD_MAX_PACKET + 64], whole[NICD_MAX_PACKET + 64];
static uint8_t seg[NICD_MAX_PACKET + 64], joined[NICD_MAX_PACKET + 64], stream[2048 * 34];

static uint32_t get32be(const uint8_t *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static void put32be(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v;
}

/* A restored packet must be well formed: parses, its length field, a verdict's size, a right checksum. */
static void check_restored(const struct nicd_pkt *p, const uint8_t *b, ptrdiff_t r, int left_off)
{
    struct nicd_pkt q;
    if (r <= 0 || (size_t)r > NICD_MAX_VERDICT || nicd_parse(b, (size_t)r, &q) != NICD_OK || q.len != (size_t)r ||
        q.v6 != p->v6 || q.payload_off != p->payload_off || nicd_tcp_checksum(b, (size_t)r) != 0)
        abort();
    if (left_off && (q.tcp_flags & (TCP_FIN | TCP_PSH)))
        abort();
}

/* Walk p's payload as a train and make each header it finds consistent (see the top). */
static void make_consistent(uint8_t *pkt, const struct nicd_pkt *p)
{
    uint8_t *c = pkt + p->payload_off;
    size_t at = 0;
    while (at + NICD_V3_HDR_LEN <= p->payload_len) {
        uint8_t *h = c + at;
        size_t head = h[2] & 3, tail = (h[2] >> 2) & 3, slen = (size_t)h[16] | (size_t)h[17] << 8;
        size_t w = (size_t)h[18] | (size_t)h[19] << 8, body = NICD_V3_HDR_LEN + head + slen + tail;
        if (w < body || w > p->payload_len - at)
            return;
        memset(h + body, 0, w - body);
        uint32_t seq = p->seq + (uint32_t)at - NICD_V3_SEQ_OFFSET + ((uint32_t)h[12] & 0xFFF);
        for (int i = 0; i < 4; i++)
            h[12 + i] = (uint8_t)(seq >> (8 * i));
        memset(h + 6, 0, 4);
        uint32_t crc = nicd_crc32c(0, h, w);
        for (int i = 0; i < 4; i++)
            h[6 + i] = (uint8_t)(crc >> (8 * i));
        at += w;
    }
}

/* Segment k (of n) of a train as the kernel's software GSO makes it: the train's headers with seq
 * + k * gso and IP id + k, FIN/PSH on the last only, CWR on the first only, lengths and checksums. */
static size_t gso_cut(const struct nicd_pkt *t, size_t gso, int k, int n, uint8_t *b)
{
    size_t at = (size_t)k * gso, len = k == n - 1 ? t->payload_len - at : gso;
    memcpy(b, t->ip, t->payload_off);
    memcpy(b + t->payload_off, t->ip + t->payload_off + at, len);
    put32be(b + t->ihl + 4, t->seq + (uint32_t)at);
    if (!t->v6) {
        unsigned id = ((unsigned)b[4] << 8 | b[5]) + (unsigned)k;
        b[4] = (uint8_t)(id >> 8), b[5] = (uint8_t)id;
    }
    if (k != n - 1)
        b[t->ihl + 13] &= (uint8_t)~(TCP_FIN | TCP_PSH);
    if (k)
        b[t->ihl + 13] &= (uint8_t)~TCP_CWR;
    nicd_finish(b, t->payload_off + len, t->tos);
    return t->payload_off + len;
}

static void check_train(const struct nicd_pkt *p, uint32_t off, int codec, size_t gso)
{
    int n = 0, k, left;
    ptrdiff_t r = nicd_compress_train(p, off, codec, -10, 0x2C, (uint16_t)(p->seq & NICD_ECHO_MASK), gso, train,
                                      sizeof train, &n, 64, scratch, stream, sizeof stream, NULL);
    if (r <= (ptrdiff_t)NICD_TOO_SHORT)
        return;
    struct nicd_pkt t;
    if (r >= (ptrdiff_t)p->len || n < 1 || n > 64 || nicd_parse(train, (size_t)r, &t) != NICD_OK ||
        t.seq != p->seq + NICD_V3_SEQ_OFFSET || nicd_tcp_checksum(train, (size_t)r) != 0 ||
        (t.payload_len + gso - 1) / gso != (size_t)n || nicd_shim_version(&t) != NICD_V3_VERSION)
        abort();
    ptrdiff_t w = nicd_restore_train(&t, 1, INCEPTIONN_TOS_TAGGED, whole, sizeof whole, scratch, &k, &left);
    check_restored(p, whole, w, left);
    struct nicd_pkt wp;
    nicd_parse(whole, (size_t)w, &wp);
    if ((size_t)w != p->len || k != n || left || wp.seq != p->seq || wp.tcp_flags != p->tcp_flags)
        abort();
    size_t head = (4 - (off & 3)) & 3, tail;
    head = head > p->payload_len ? p->payload_len : head;
    tail = (p->payload_len - head) & 3;
    if (memcmp(whole + p->payload_off, p->ip + p->payload_off, head) != 0 ||
        memcmp(whole + w - tail, p->ip + p->len - tail, tail) != 0)
        abort(); /* the raw ends travel as they are */
    size_t covered = 0, at_i = 0, at_j = 0;
    int i0 = (int)(p->seq % (unsigned)n), j0 = i0 + 1 + (int)(p->ack % (unsigned)(n - i0)); /* a run [i0, j0) */
    size_t jlen = t.payload_off;
    for (int i = 0; i < n; i++) {
        size_t sl = gso_cut(&t, gso, i, n, seg);
        struct nicd_pkt s, q;
        if (nicd_parse(seg, sl, &s) != NICD_OK || (i < n - 1 && s.payload_len != gso))
            abort();
        ptrdiff_t b = nicd_restore_train(&s, 1, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch, &k, &left);
        check_restored(p, out, b, left);
        nicd_parse(out, (size_t)b, &q);
        if (k != 1 || left || q.seq != p->seq + (uint32_t)covered || s.payload_len >= q.payload_len ||
            memcmp(out + q.payload_off, whole + p->payload_off + covered, q.payload_len) != 0)
            abort(); /* alone it restores its own range, the bytes the whole train gave */
        if (i == i0)
            at_i = covered;
        if (i >= i0 && i < j0) { /* GRO: the first header, the payloads joined, the last's FIN/PSH */
            if (i == i0)
                memcpy(joined, seg, t.payload_off);
            memcpy(joined + jlen, seg + t.payload_off, s.payload_len);
            jlen += s.payload_len;
            joined[t.ihl + 13] = (uint8_t)((joined[t.ihl + 13] & ~(TCP_FIN | TCP_PSH)) |
                                           (seg[t.ihl + 13] & (TCP_FIN | TCP_PSH)));
        }
        covered += q.payload_len;
        if (i == j0 - 1)
            at_j = covered;
    }
    if (covered != p->payload_len)
        abort();
    nicd_finish(joined, jlen, t.tos);
    struct nicd_pkt jp, q;
    if (nicd_parse(joined, jlen, &jp) != NICD_OK)
        abort();
    ptrdiff_t b = nicd_restore_train(&jp, 0, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch, &k, &left);
    check_restored(p, out, b, left);
    nicd_parse(out, (size_t)b, &q);
    if (k != j0 - i0 || left || q.seq != p->seq + (uint32_t)at_i || q.payload_len != at_j - at_i ||
        memcmp(out + q.payload_off, whole + p->payload_off + at_i, q.payload_len) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *pkt = malloc(size ? size : 1);
    memcpy(pkt, data, size);
    struct nicd_pkt p;
    if (nicd_parse(pkt, size, &p) == NICD_OK) {
        int k, left;
        for (int verify = 0; verify < 2; verify++) {
            ptrdiff_t r = nicd_restore_train(&p, verify, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch, &k, &left);
            if (r > 0)
                check_restored(&p, out, r, left);
            else if (k || left)
                abort();
        }
        make_consistent(pkt, &p);
        ptrdiff_t r = nicd_restore_train(&p, 0, INCEPTIONN_TOS_TAGGED, out, sizeof out, scratch, &k, &left);
        if (r > 0)
            check_restored(&p, out, r, left);
        if (r > 0 && nicd_shim_version(&p) != NICD_V3_VERSION)
            abort(); /* only a v3 payload restores as a train */
        memcpy(pkt, data, size); /* the original bytes again, as a super-packet */
        uint32_t off = get32be(pkt + p.ihl + 8); /* the ack picks the stream offset */
        int codec = (p.tcp_flags & 0x40) ? NICD_CODEC_SCALED : NICD_CODEC_INCEPTIONN; /* ECE picks codec 2 */
        check_train(&p, off, codec, 60 + p.seq % 9000);
        check_train(&p, off, codec, 1448);
    }
    free(pkt);
    return 0;
}
