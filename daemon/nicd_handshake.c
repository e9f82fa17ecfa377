/* The handshake: the hello option our SYN and SYN-ACK carry, the peer's taken off, a flow
 * negotiated when both ends agree, and the answerer's confirmation by the first compressed packet
 * (docs/wire-format.md, "Handshake"). */
#define _GNU_SOURCE
#include "nicd_queue_int.h"

#include "nicd_conntrack.h"

/* The MSS option of a SYN or SYN-ACK (the peer's or our own): what segments toward its sender may
 * carry (as any clamp on the path left it). 536 without one, as TCP assumes (RFC 9293). */
static uint16_t mss_option(const struct nicd_pkt *p)
{
    const uint8_t *t = p->ip + p->ihl;
    size_t i = 20;
    while (i < p->thl && t[i] != 0) {
        if (t[i] == 1) { /* NOP */
            i++;
            continue;
        }
        if (i + 2 > p->thl || t[i + 1] < 2 || i + t[i + 1] > p->thl)
            break;
        if (t[i] == 2 && t[i + 1] == 4)
            return (uint16_t)((unsigned)t[i + 2] << 8 | t[i + 3]);
        i += t[i + 1];
    }
    return 536;
}

/* Our settings as the hello option says them. */
static struct nicd_hello_opt our_option(const struct ctx *cx, uint8_t role, uint8_t orig_tos,
                                        const uint8_t *nonce)
{
    struct nicd_hello_opt o = {
        .version = NICD_VERSION, .role = role, .codec = NICD_CODEC_SCALED, /* we decode 1 and 2 */
        .tos_compressed = cx->cfg->tos_compressed,
        .orig_tos = (uint8_t)((orig_tos & 0xFC) | (cx->cfg->trains ? NICD_OPT_TRAINS : 0)),
        .error_bound = (int8_t)cx->cfg->error_bound,
    };
    memcpy(o.nonce, nonce, NICD_NONCE_LEN);
    return o;
}

/* Compressing needs both ends to mean the same thing by the marks and the codec. The codec byte
 * names the highest codec a soft NIC decodes (it decodes every one below it): each sender then
 * picks codec 1 or 2 per packet by its mark. A peer from before codec 2 says 1: raw. */
static int settings_agree(const struct ctx *cx, const struct nicd_hello_opt *o)
{
    return o->version == NICD_VERSION && o->codec == NICD_CODEC_SCALED &&
           o->error_bound == (int8_t)cx->cfg->error_bound &&
           o->tos_compressed == cx->cfg->tos_compressed;
}

/* Remember the hello h of flow k, counting the one it evicted, if any. */
static void put_hello(struct ctx *cx, const struct nicd_flow_key *k, const struct nicd_hello *h)
{
    int evicted = nicd_hello_put(k, h);
    if (evicted)
        COUNT(cx, HELLO_EVICTED, 1);
    if (evicted == NICD_HELLO_EVICTED_OWN)
        COUNT(cx, HELLO_EVICTED_OWN, 1);
}

/* The flow's MSS, as TCP clamps it (tcp_connect_init, tcp_openreq_init): the smaller of the two
 * handshake MSS options. Our own option is what our socket's TCP_MAXSEG (or the route's advmss)
 * allowed, the peer's what its receiver or a clamp on the path allows; the egress gso_size guess
 * (nicd_egress.c) must take both, or a sender with a small TCP_MAXSEG is cut at the wrong size. */
static uint16_t flow_mss(const struct nicd_hello *h)
{
    return h->own_mss < h->peer_mss ? h->own_mss : h->peer_mss;
}

/* Negotiate flow k and count the outcome. A negotiated flow's view before NAT is asked of the
 * slow path (nicd_conntrack.h), never here: until it is answered, its super-packets leave raw. */
static void negotiate(struct ctx *cx, const struct nicd_flow_key *k, uint32_t isn, uint32_t peer_isn,
                      uint16_t mss, uint64_t owner, int peer_trains)
{
    int rc = nicd_flows_negotiate(k, isn, peer_isn, mss, owner);
    if (rc == NICD_FLOWS_OWNER_FULL) {
        COUNT(cx, FLOW_OWNER_FULL, 1);
    } else if (rc < 0) {
        COUNT(cx, FLOW_TABLE_FULL, 1);
    } else {
        COUNT(cx, FLOWS_NEGOTIATED, 1);
        if (peer_trains && cx->cfg->trains && cx->cfg->gso) /* we send trains; until now v2 */
            nicd_flows_set_trains(k, isn);
        nicd_ct_ask(k, isn); /* a full queue: the flow asks again later (nicd_flows_egress) */
    }
}

/* Our tagged SYN leaves: a new connection on this 4-tuple (any older negotiation is void);
 * it carries the hello option with a fresh nonce and the hello mark. The flow will be charged to
 * the user of the socket, as the kernel names it (NFQA_UID), else to the peer. */
void egress_syn(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                       const struct nicd_flow_key *k, struct ctx *cx)
{
    nicd_flows_forget(k);
    uint32_t uid;
    struct nicd_hello h = {.state = NICD_HELLO_SENT, .isn = p->seq, .own_mss = mss_option(p),
                           .owner = nfq_get_uid(nfa, &uid) > 0 ? NICD_OWNER_UID(uid) : nicd_flows_owner_of_peer(k)};
    nicd_flows_nonce(k, p->seq, h.nonce);
    struct nicd_hello_opt o = our_option(cx, NICD_ROLE_HELLO, p->tos, h.nonce);
    ptrdiff_t r = nicd_add_option(p, &o, (uint8_t)((p->tos & 3) | cx->cfg->tos_hello), OUT(cx),
                                  sizeof OUT(cx));
    if (r < 0) {
        COUNT(cx, HELLO_NO_ROOM, 1);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    put_hello(cx, k, &h);
    COUNT(cx, HELLO_SENT, 1);
    if (cx->cfg->gso) /* the path MTU for its super-packets, now rather than on a data packet */
        egress_mtu(cx, nfq_get_outdev(nfa), p, 0);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* Our SYN-ACK leaves: answer the peer's hello if this SYN-ACK answers that very SYN. The path
 * MTU its data packets will need is looked up now, once, not on a data packet. */
void egress_synack(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                          const struct nicd_flow_key *k, struct ctx *cx)
{
    nicd_flows_forget(k); /* our stack accepts this 4-tuple anew */
    struct nicd_hello h;
    if (!nicd_hello_get(k, &h) || h.state == NICD_HELLO_SENT) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    if (p->ack != h.peer_isn + 1) {
        /* Our stack answers another SYN on this 4-tuple: the hello (a spoofed SYN's, or one of an
         * earlier connection) is stale and must not be confirmed for this connection. */
        nicd_hello_take(k, (enum nicd_hello_state)h.state, h.isn);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    struct nicd_hello_opt o = our_option(cx, NICD_ROLE_ANSWER, p->tos, h.nonce);
    ptrdiff_t r = nicd_add_option(p, &o, (uint8_t)((p->tos & 3) | cx->cfg->tos_hello), OUT(cx),
                                  sizeof OUT(cx));
    if (r < 0) {
        COUNT(cx, HELLO_NO_ROOM, 1);
        nicd_hello_take(k, (enum nicd_hello_state)h.state, h.isn);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    h.state = NICD_HELLO_ANSWERED; /* a retransmitted SYN-ACK is answered again */
    h.isn = p->seq;
    h.own_mss = mss_option(p);
    h.tries = 0;
    if (cx->cfg->gso)
        egress_mtu(cx, nfq_get_outdev(nfa), p, 0);
    put_hello(cx, k, &h);
    COUNT(cx, HELLO_SENT, 1);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* A handshake marked tos_hello arrives. Only one carrying our option is a soft NIC's: the
 * option is removed and the original ToS put back. A SYN is remembered as a half-open hello
 * (never touching a negotiated flow); an answer negotiates only if it echoes the nonce of our
 * hello for this flow, acknowledges our ISN exactly, and states the same settings. */
void ingress_hello(uint32_t id, const struct nicd_pkt *p,
                          const struct nicd_flow_key *k, uint8_t syn, struct ctx *cx)
{
    struct nicd_hello_opt o;
    int off = nicd_find_option(p, &o);
    if (off <= 0) {
        COUNT(cx, HELLO_WITHOUT_OPTION, 1);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    ptrdiff_t r = nicd_strip_option(p, (size_t)off, (uint8_t)((p->tos & 3) | (o.orig_tos & 0xFC)),
                                    OUT(cx), sizeof OUT(cx));
    if (r < 0) {
        COUNT(cx, DROP_CHECKSUM, 1); /* the stack would drop it too */
        verdict(id, NF_DROP, NULL, 0, cx);
        return;
    }
    COUNT(cx, HELLO_RECEIVED, 1);
    int agree = settings_agree(cx, &o);
    struct nicd_hello h;
    if (syn == TCP_SYN && o.role == NICD_ROLE_HELLO) {
        /* the peer opens this flow: charged to it (our SYN-ACK's request socket names no user) */
        h = (struct nicd_hello){.state = NICD_HELLO_PEER, .agree = (uint8_t)agree, .peer_isn = p->seq,
                                .peer_mss = mss_option(p), .owner = nicd_flows_owner_of_peer(k),
                                .peer_trains = (uint8_t)(o.orig_tos & NICD_OPT_TRAINS)};
        memcpy(h.nonce, o.nonce, NICD_NONCE_LEN);
        put_hello(cx, k, &h);
        if (!agree)
            COUNT(cx, HELLO_MISMATCH, 1);
    } else if (syn != (TCP_SYN | TCP_ACK) || o.role != NICD_ROLE_ANSWER || !nicd_hello_get(k, &h) ||
               h.state != NICD_HELLO_SENT || p->ack != h.isn + 1 ||
               memcmp(h.nonce, o.nonce, NICD_NONCE_LEN) != 0) {
        COUNT(cx, HELLO_UNMATCHED, 1);
    } else if (!agree) {
        COUNT(cx, HELLO_MISMATCH, 1);
        nicd_hello_take(k, NICD_HELLO_SENT, h.isn);
    } else if (nicd_hello_take(k, NICD_HELLO_SENT, h.isn)) {
        h.peer_mss = mss_option(p);
        negotiate(cx, k, h.isn, p->seq, flow_mss(&h), h.owner, o.orig_tos & NICD_OPT_TRAINS);
    }
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* The answerer learns that the initiator accepted its answer from the initiator's first
 * compressed packet: it must acknowledge our SYN, with an ack no further than CONFIRM_WINDOW
 * past our ISN, and echo the low NICD_ECHO_MASK bits of our ISN in its shim header. Only a
 * host that saw our SYN-ACK knows the ISN: an off-path sender must guess 26 bits (14 the window
 * leaves, 12 of the echo), and gets CONFIRM_TRIES guesses per answered hello, after which the
 * hello is dropped (our direction stays raw). Only then do we compress too. */
#define CONFIRM_WINDOW (1u << 18)
#define CONFIRM_TRIES 8

void confirm_answered(const struct nicd_pkt *p, const struct nicd_flow_key *k, struct ctx *cx)
{
    struct nicd_hello h;
    /* the common case, a negotiated flow, answers without the hello table's lock: its hello is
     * gone (our SYN-ACK forgets the flow before it answers a hello) */
    if (!nicd_hello_count() || nicd_flows_known(k) || !nicd_hello_get(k, &h) || h.state != NICD_HELLO_ANSWERED ||
        !h.agree)
        return;
    if (p->ack - h.isn - 1 >= CONFIRM_WINDOW || !(p->tcp_flags & TCP_ACK) ||
        nicd_echo(p) != (h.isn & NICD_ECHO_MASK)) {
        if (nicd_hello_fail(k, h.isn, CONFIRM_TRIES))
            COUNT(cx, CONFIRM_FAILED, 1);
        return;
    }
    if (!nicd_hello_take(k, NICD_HELLO_ANSWERED, h.isn))
        return; /* another thread confirmed it */
    negotiate(cx, k, h.isn, h.peer_isn, flow_mss(&h), h.owner, h.peer_trains);
}

