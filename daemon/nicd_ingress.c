/* Ingress: a queued incoming packet, a peer's hello or a compressed packet to restore. */
#define _GNU_SOURCE
#include "nicd_queue_int.h"

/* Ingress: the peer's hello, and restoring compressed packets. Fails closed: a compressed
 * packet that cannot be restored is dropped, and TCP retransmits it. */
void ingress(struct nfq_data *nfa, struct ctx *cx)
{
    uint32_t id;
    unsigned char *buf;
    int len = fetch(nfa, &id, &buf);
    struct nicd_pkt p;
    cx->queue = cx->cfg->ingress_queue;
    COUNT(cx, INGRESS_PACKETS, 1);
    if (cx->cfg->accept_only) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    int pr = len < 0 ? NICD_E_IP : nicd_parse(buf, (size_t)len, &p);
    if (pr == NICD_E_EXT_HEADER && !dscp_is(p.tos, cx->cfg->tos_compressed)) {
        /* IPv6 with an extension header: no soft NIC sends one, so a hello-marked SYN is not
         * ours (passed as one without the option), and an unmarked segment that looks
         * compressed is either not one or is dropped by the stack for its marked checksum */
        if (dscp_is(p.tos, cx->cfg->tos_hello))
            COUNT(cx, HELLO_WITHOUT_OPTION, 1);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    if (pr != NICD_OK) {
        /* Only compressed packets and hellos are queued here: anything unparseable is hostile,
         * and so is a compressed-marked IPv6 packet with an extension header (never restored). */
        if (pr == NICD_E_EXT_HEADER)
            COUNT(cx, DROP_EXT_HEADER, 1);
        else
            COUNT(cx, DROP_MALFORMED, 1);
        verdict(id, NF_DROP, NULL, 0, cx);
        return;
    }
    struct nicd_flow_key k;
    key_of(&p, &k, 1); /* our egress direction of this flow */
    uint8_t syn = p.tcp_flags & (TCP_SYN | TCP_ACK);

    if (dscp_is(p.tos, cx->cfg->tos_hello) && (syn & TCP_SYN)) {
        ingress_hello(id, &p, &k, syn, cx);
        return;
    }
    /* Queued without the compressed mark: a segment whose payload starts like a shim header
     * (rules.py, LOOKS_COMPRESSED). It is a compressed packet whose DSCP the network rewrote only
     * if its checksum is wrong by exactly the mark; anything else (an ordinary segment, or one
     * corrupted in transit, which the stack drops) passes untouched. */
    /* With trains the queue takes what GRO merged whole: a merged packet's TCP checksum is only
     * the pseudo-header's (the kernel checked each segment's), so it cannot be checked here. */
    int csum_partial = (nfq_get_skbinfo(nfa) & NFQA_SKB_CSUMNOTREADY) != 0;
    int rewritten = !dscp_is(p.tos, cx->cfg->tos_compressed);
    if (rewritten && (syn & TCP_SYN || csum_partial || !nicd_marked_checksum(&p))) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }

    /* the mark the sender's codec stands for goes back on (codec 2: tos_scaled) */
    uint8_t mark = nicd_codec_of(&p) == NICD_CODEC_SCALED ? cx->cfg->tos_scaled : cx->cfg->tos_tagged;
    int train = !rewritten && nicd_shim_version(&p) == NICD_V3_VERSION, segs = 0, left_off = 0;
    PROF_BEGIN(tr);
    ptrdiff_t r = train ? nicd_restore_train(&p, !csum_partial, (uint8_t)((p.tos & 3) | mark), OUT(cx),
                                             sizeof OUT(cx), cx->scratch, &segs, &left_off)
                        : nicd_restore(&p, (uint8_t)((p.tos & 3) | mark), OUT(cx), sizeof OUT(cx), cx->scratch);
    PROF_END(cx, RESTORE, tr);
    if (r < 0) {
        switch (r) {
        case NICD_E_CHECKSUM: COUNT(cx, DROP_CHECKSUM, 1); break;
        case NICD_E_HEADER: COUNT(cx, DROP_HEADER, 1); break;
        case NICD_E_CRC: COUNT(cx, DROP_CRC, 1); break;
        case NICD_E_DECODE: COUNT(cx, DROP_DECODE, 1); break;
        case NICD_E_SPACE: COUNT(cx, DROP_TOO_BIG, 1); break;
        default: COUNT(cx, DROP_MALFORMED, 1); break;
        }
        verdict(id, NF_DROP, NULL, 0, cx);
        return;
    }
    COUNT(cx, INGRESS_RESTORED, train ? (uint64_t)segs : 1);
    COUNT(cx, INGRESS_TRAIN_SEGMENTS, (uint64_t)segs);
    COUNT(cx, INGRESS_TRAINS, (uint64_t)train);
    COUNT(cx, DROP_TRAIN_TAIL, (uint64_t)left_off);
    COUNT(cx, INGRESS_WIRE_BYTES, p.payload_len - (size_t)left_off);
    COUNT(cx, INGRESS_ORIG_BYTES, (size_t)r - p.payload_off);
    confirm_answered(&p, &k, cx);
    if (rewritten) {
        COUNT(cx, INGRESS_MARKS_REWRITTEN, 1);
        if (nicd_flows_note_rewritten(&k))
            COUNT(cx, FLOWS_MARKS_REWRITTEN, 1);
    }
    /* Receive offload: a packet that continues the open one joins it (and is dropped), so TCP
     * receives the run as one packet; a plain ACK-only data packet opens a run, while the batch
     * has room for it. Only packets of the open one's queue join it: their drops are sent to
     * that queue. */
    uint8_t *open = cx->out[cx->nout];
    if (cx->merging && cx->queue == cx->open_queue && cx->nmerged < MERGE_MAX &&
        nicd_can_append(open, cx->open_len, OUT(cx), (size_t)r, sizeof cx->out[0])) {
        cx->open_len = nicd_append(open, cx->open_len, OUT(cx), (size_t)r);
        cx->merged[cx->nmerged++] = id;
        COUNT(cx, INGRESS_MERGED, 1);
        return;
    }
    if (p.tcp_flags == TCP_ACK) {
        close_merge(cx); /* the restored packet is in OUT(cx), now out[nout] */
        if (cx->n < BATCH && cx->nout < BATCH && cx->bytes < BATCH_BYTES) {
            cx->merging = 1;
            cx->open_id = id, cx->open_len = (size_t)r, cx->open_queue = cx->queue;
            return;
        }
    }
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}
