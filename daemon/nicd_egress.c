/* Egress: a queued outgoing packet (a handshake, or tagged data of a negotiated flow, which is
 * compressed) and a flow that gives up compressing. */
#define _GNU_SOURCE
#include "nicd_queue_int.h"

#include "nicd_conntrack.h"

/* A flow gives up compressing (nicd_flows_egress): logged once; this packet and all after it
 * leave raw. A stateful middlebox that tracked the compressed lengths (conntrack: seq + payload
 * length) still holds the flow's end short of what the peer received and acknowledges, and drops
 * those ACKs as acknowledging data it never saw; TCP resends only from its oldest unacknowledged
 * byte, so that end would never move. So the last original byte sent compressed goes out raw
 * once more, alone in a segment at its place (the peer already has it, or takes the true byte):
 * the middlebox then has seen the whole range, and the peer's ACK passes. */
static void give_up(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                    const struct nicd_flow_info *fi, const struct route_ctx *rc, struct ctx *cx)
{
    char a[INET6_ADDRSTRLEN] = "?", b[INET6_ADDRSTRLEN] = "?";
    if (p->v6) {
        inet_ntop(AF_INET6, p->saddr6, a, sizeof a);
        inet_ntop(AF_INET6, p->daddr6, b, sizeof b);
    } else {
        inet_ntop(AF_INET, &p->saddr, a, sizeof a);
        inet_ntop(AF_INET, &p->daddr, b, sizeof b);
    }
    const char *l = p->v6 ? "[" : "", *r = p->v6 ? "]" : ""; /* [2001:db8::1]:40312 */
    fprintf(stderr, "nicd WARNING: flow %s%s%s:%u -> %s%s%s:%u: its compressed packets do not get through (TCP "
            "sends the same data again and again, now seq %u); sending this flow raw from now on\n", l, a, r,
            p->sport, l, b, r, p->dport, p->seq);
    fflush(stderr);
    COUNT(cx, FLOWS_FELL_BACK, 1);
    COUNT(cx, EGRESS_RAW_FELL_BACK, 1);
    COUNT(cx, EGRESS_RAW_BYTES, p->payload_len);

    uint8_t *probe = cx->segs; /* free between super-packets */
    memcpy(probe, p->ip, p->payload_off);
    probe[p->payload_off] = fi->high_byte;
    size_t len = p->payload_off + 1;
    uint8_t *t = probe + p->ihl;
    uint32_t seq = fi->high - 1;
    t[4] = (uint8_t)(seq >> 24), t[5] = (uint8_t)(seq >> 16), t[6] = (uint8_t)(seq >> 8), t[7] = (uint8_t)seq;
    /* a plain data segment (no PSH, URG, CWR, ECE), with the FIN if one followed that byte: the
     * middlebox counts it in the flow's end too, and the peer acknowledges it */
    t[13] = (uint8_t)((t[13] & TCP_ACK) | (fi->high_fin ? TCP_FIN : 0));
    nicd_finish(probe, len, p->tos); /* its length, the IPv4 header's and the TCP checksum */
    if ((p->v6 ? cx->raw6_fd : cx->raw_fd) >= 0 && rc->view.known) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        flush(cx);
        if (send_one(cx, probe, len, p, rc) < 0)
            COUNT(cx, GSO_SEND_ERRORS, 1);
        return;
    }
    if (nfq_get_skbinfo(nfa) & NFQA_SKB_GSO) { /* never a rewritten GSO skb (see egress) */
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    /* no raw socket (or no view yet): the byte takes this packet's place; TCP resends the
     * packet, raw */
    memcpy(OUT(cx), probe, len);
    verdict(id, NF_ACCEPT, OUT(cx), len, cx);
}

/* Egress: handshakes, then compression of tagged data on negotiated flows. */
void egress(struct nfq_data *nfa, struct ctx *cx)
{
    uint32_t id;
    unsigned char *buf;
    int len = fetch(nfa, &id, &buf);
    struct nicd_pkt p;
    cx->queue = cx->cfg->egress_queue;
    int pr = cx->cfg->accept_only || len < 0 ? NICD_E_IP : nicd_parse(buf, (size_t)len, &p);
    if (pr == NICD_E_EXT_HEADER && codec_of_mark(cx, p.tos)) {
        /* IPv6 with an extension header before TCP: never transformed (no hello on its SYN, so
         * its flow stays raw; a data packet of a negotiated flow leaves raw, which is valid) */
        COUNT(cx, EGRESS_PACKETS, 1);
        COUNT(cx, EGRESS_RAW_EXT_HEADER, 1);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    if (pr != NICD_OK) {
        verdict(id, NF_ACCEPT, NULL, 0, cx); /* not ours to judge: untouched */
        return;
    }
    COUNT(cx, EGRESS_PACKETS, 1);
    struct nicd_flow_key k;
    key_of(&p, &k, 0);
    uint8_t syn = p.tcp_flags & (TCP_SYN | TCP_ACK);

    int codec = codec_of_mark(cx, p.tos);
    if (syn == TCP_SYN && codec) {
        egress_syn(id, nfa, &p, &k, cx);
        return;
    }
    if (syn == (TCP_SYN | TCP_ACK)) {
        egress_synack(id, nfa, &p, &k, cx);
        return;
    }
    if (p.tcp_flags & TCP_RST) { /* never compressed: the flow ends here (nicd_flows_close) */
        if (nicd_flows_close(&k, 1))
            COUNT(cx, FLOWS_CLOSED_RST, 1);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    if ((p.tcp_flags & TCP_FIN) && nicd_flows_close(&k, 0))
        COUNT(cx, FLOWS_CLOSED_FIN, 1);
    if (!codec || p.payload_len == 0) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }

    struct nicd_flow_info fi;
    PROF_BEGIN(tf);
    enum nicd_flow_state fs = nicd_flows_egress(&k, p.seq, (uint32_t)p.payload_len,
                                                p.ip[p.payload_off + p.payload_len - 1], p.tcp_flags & TCP_FIN, &fi);
    PROF_END(cx, FLOW, tf);
    uint32_t isn = fi.isn;
    if (fi.ask_view) /* its view is still unknown: the first request did not fit the queue */
        nicd_ct_ask(&k, isn);
    /* what the raw socket's route lookup needs of the original (route_cmsgs) */
    struct route_ctx rc = {.ifindex = nfq_get_outdev(nfa), .mark = nfq_get_nfmark(nfa), .tos = p.tos,
                           .view = fi.view};
    if (fs == NICD_FLOW_GIVE_UP) {
        give_up(id, nfa, &p, &fi, &rc, cx);
        return;
    }
    if (fi.trains_gave_up)
        COUNT(cx, FLOWS_TRAINS_GAVE_UP, 1);
    if (fs != NICD_FLOW_COMPRESS) {
        if (fs == NICD_FLOW_NONE)
            COUNT(cx, EGRESS_RAW_NOT_NEGOTIATED, 1);
        else
            COUNT(cx, EGRESS_RAW_FELL_BACK, 1);
        COUNT(cx, EGRESS_RAW_BYTES, p.payload_len);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    cx->echo = (uint16_t)(fi.peer_isn & NICD_ECHO_MASK);
    if (cx->cfg->gso) {
        /* A GSO skb must never get a rewritten payload back in a verdict: it keeps its gso_size
         * and the kernel would cut the compressed packet into MSS pieces. So every GSO skb (even
         * one within the MTU) leaves by the raw socket or unchanged; so does anything over the
         * MTU. An unknown MTU (0) leaves it unchanged. The packets are cut to what the
         * connection may carry: the path MTU, and the flow's MSS (the smaller handshake MSS
         * option: the receiver's limit, a clamp on the path or our own TCP_MAXSEG), as TCP cuts
         * its own (a hop that drops ICMP "fragmentation needed" never tells us its MTU, but the
         * clamp or the MSS does). */
        size_t mtu = egress_mtu(cx, nfq_get_outdev(nfa), &p, 0);
        /* the MSS counts from fixed headers: 20 bytes of TCP and 20 of IPv4, or 40 of IPv6 */
        size_t mss_len = (p.v6 ? 60 : 40) + (size_t)fi.mss;
        if (mtu > mss_len)
            mtu = mss_len;
        int gso_skb = (nfq_get_skbinfo(nfa) & NFQA_SKB_GSO) != 0; /* one attribute walk per packet */
        if (gso_skb || p.len > mtu) {
            /* v3: a GSO skb goes back as one train cut where the kernel will cut it: at its own
             * gso_size, which the queue does not report but TCP derives (tcp_current_mss) from
             * the path MTU and the flow's MSS, both in mtu, less this skb's IP and TCP headers. A
             * wrong guess only misplaces the cuts: GRO joins a whole train back and the walk
             * still finds every header; a segment that arrives alone and cut wrong is dropped
             * (drop_header) and TCP retransmits it. One that compresses into a single segment
             * is no train (egress_train says why) and goes on below as v2, compressed again:
             * only small GSO skbs (resends, the ends of writes) pay that second pass. */
            size_t gso_size = mtu > p.payload_off ? mtu - p.payload_off : 0;
            if (fi.send_trains && gso_skb && p.payload_len > gso_size && egress_train(id, &p, isn, gso_size, cx))
                return;
            if (!rc.view.known) { /* NAT might take the raw socket's packets for another flow */
                COUNT(cx, EGRESS_RAW_VIEW_PENDING, 1);
                COUNT(cx, EGRESS_RAW_BYTES, p.payload_len);
                verdict(id, NF_ACCEPT, NULL, 0, cx);
                return;
            }
            egress_gso(id, &p, isn, mtu, mss_len, &rc, cx);
            return;
        }
    }
    uint64_t tiers[4] = {0, 0, 0, 0};
    PROF_BEGIN(tc);
    ptrdiff_t r = nicd_compress_codec(&p, p.seq - isn - 1, codec, cx->cfg->error_bound,
                                      (uint8_t)((p.tos & 3) | cx->cfg->tos_compressed), cx->echo, OUT(cx),
                                      sizeof OUT(cx), cx->scratch, tiers);
    PROF_END(cx, COMPRESS, tc);
    if (r <= NICD_TOO_SHORT) { /* not compressed: any result that is no packet length */
        if (r == NICD_TOO_SHORT)
            COUNT(cx, EGRESS_RAW_SHORT, 1);
        else /* NOT_SMALLER, or the encoder found no room (E_SPACE): the same outcome */
            COUNT(cx, EGRESS_RAW_NOT_SMALLER, 1);
        COUNT(cx, EGRESS_RAW_BYTES, p.payload_len);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    COUNT(cx, EGRESS_COMPRESSED, 1);
    COUNT(cx, EGRESS_ORIG_BYTES, p.payload_len);
    COUNT(cx, EGRESS_WIRE_BYTES, (size_t)r - p.payload_off);
    count_tiers(cx, tiers);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}
