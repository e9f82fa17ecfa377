/* NFQUEUE loop of the soft NIC. The rules that feed it are installed by daemon/rules.py. */
#define _GNU_SOURCE
#include "nicd_queue.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sys/uio.h>

#include "inceptionn_codec.h"
#include "nicd_conntrack.h"
#include "nicd_flows.h"
#include "nicd_packet.h"
#include "nicd_pmtu.h"

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif

/* Verdicts are batched: up to BATCH verdict messages (or BATCH_BYTES of rewritten packets) go
 * to the kernel in one sendmsg, flushed whenever the socket has nothing more to read, so an idle
 * queue adds no latency. Each pending verdict owns one output slot until the flush. */
#define BATCH 32
#define BATCH_BYTES (192 * 1024)
#define RECV_MSGS 16
#define RECV_BUF (NICD_MAX_PACKET + 4096) /* one queued packet plus its netlink attributes */
/* gso: compressed packets per super-packet at most (64 KB in MTU-sized packets that are each
 * smaller than what they cover: 45 at MTU 1500; a smaller MTU leaves the super-packet raw). */
#define GSO_MAX_SEGS 64

/* Built with -DNICD_PROFILE (NICD_PROFILE=1 make, daemon/build_ffi.py): where a queue thread's
 * time goes, by phase, from clock_gettime around each; written when nicd_run returns, to the
 * file $NICD_PROFILE_OUT names (appended) or stderr. docs/perf.md has the method and figures.
 * Without the flag the macros are empty. */
#ifdef NICD_PROFILE
#define PROF_PHASES(X) X(POLL) X(RECV) X(HANDLE) X(FLOW) X(COMPRESS) X(SEND) X(RESTORE) X(VERDICT) X(VERDICT_IN)
#define PROF_ENUM_(n) PH_##n,
enum { PROF_PHASES(PROF_ENUM_) PH_N };
static uint64_t prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define PROF_BEGIN(t) uint64_t t = prof_now()
#define PROF_END(cx, ph, t) do { (cx)->prof_ns[PH_##ph] += prof_now() - (t); (cx)->prof_n[PH_##ph]++; } while (0)
#else
#define PROF_BEGIN(t) (void)0
#define PROF_END(cx, ph, t) (void)0
#endif

/* One NFQNL_MSG_VERDICT message up to the payload attribute's data (all 4-byte aligned). */
struct verdict_msg {
    struct nlmsghdr nlh;
    struct nfgenmsg nfg;
    struct nlattr vattr;
    struct nfqnl_msg_verdict_hdr vh;
    struct nlattr pattr;
};

struct ctx {
    struct nicd_config *cfg;
    struct nicd_stats *st;
    int fd;
    uint16_t queue;    /* the queue of the packet being handled */
    uint16_t echo;     /* egress: the echo field of the packet being compressed (the low bits of
                          the peer's ISN, nicd_packet.h) */
    int n;             /* pending verdicts */
    size_t bytes;      /* ... and their size */
    struct verdict_msg msg[BATCH];
    struct iovec iov[BATCH * 3];
    int niov;
    float scratch[16384 + 16];
    uint8_t out[BATCH][NICD_MAX_PACKET + 64];
    /* gso: the raw socket the compressed packets of a super-packet leave by (raw6_fd: IPv6's,
     * -1 without IPv6), their bytes, the encoded stream they are cut from, and the last egress
     * interface's MTU */
    int raw_fd, raw6_fd;
    size_t seg_len[GSO_MAX_SEGS];
    uint8_t segs[NICD_MAX_PACKET + GSO_MAX_SEGS * 128];
    uint8_t stream[2048 * INC_MAX_GROUP_BYTES];
    int no_proto_cmsg; /* the kernel refused IP_PROTOCOL on the raw socket: sent without it */
    int no_proto6;     /* ... or the protocol in sin6_port on the IPv6 one */
#ifdef NICD_PROFILE
    uint64_t prof_ns[PH_N], prof_n[PH_N];
    int in_handle;     /* a flush inside a packet's handling counts as VERDICT_IN too */
#endif
};

#define COUNT(cx, name, v) ((cx)->st->c[NICD_C_##name] += (v))

/* The tier counts of the values a packet (or super-packet) sent compressed: 0, 8, 16, 32 bits. */
static void count_tiers(struct ctx *cx, const uint64_t tiers[4])
{
    COUNT(cx, TIER0, tiers[0]);
    COUNT(cx, TIER8, tiers[1]);
    COUNT(cx, TIER16, tiers[2]);
    COUNT(cx, TIER32, tiers[3]);
}

static int dscp_is(uint8_t tos, uint8_t mark)
{
    return (tos & 0xFC) == (mark & 0xFC);
}

/* The codec a tagged packet's mark asks for (docs/wire-format.md, "Marks"): the paper's for
 * tos_tagged, the per-packet scaled one for tos_scaled; 0 if it carries neither mark. */
static int codec_of_mark(const struct ctx *cx, uint8_t tos)
{
    if (dscp_is(tos, cx->cfg->tos_tagged))
        return NICD_CODEC_INCEPTIONN;
    if (dscp_is(tos, cx->cfg->tos_scaled))
        return NICD_CODEC_SCALED;
    return 0;
}

static void flush(struct ctx *cx)
{
    if (!cx->n)
        return;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    struct msghdr mh = {.msg_name = &kernel, .msg_namelen = sizeof kernel,
                        .msg_iov = cx->iov, .msg_iovlen = (size_t)cx->niov};
    PROF_BEGIN(t);
    if (sendmsg(cx->fd, &mh, 0) < 0)
        COUNT(cx, VERDICT_ERRORS, cx->n);
    PROF_END(cx, VERDICT, t);
#ifdef NICD_PROFILE
    if (cx->in_handle)
        PROF_END(cx, VERDICT_IN, t);
#endif
    cx->n = 0, cx->niov = 0, cx->bytes = 0;
}

/* The output slot a callback may rewrite the current packet into. */
#define OUT(cx) ((cx)->out[(cx)->n])

/* Queue a verdict; buf, if given, is the rewritten packet and must be OUT(cx). */
static void verdict(uint32_t id, uint32_t v, const uint8_t *buf, size_t len, struct ctx *cx)
{
    static const uint8_t pad[4];
    if (buf && len > NICD_MAX_VERDICT) { /* its attribute length would wrap: never send it */
        COUNT(cx, VERDICT_ERRORS, 1);
        buf = NULL, len = 0, v = NF_DROP;
    }
    struct verdict_msg *m = &cx->msg[cx->n];
    size_t hdr = buf ? sizeof *m : offsetof(struct verdict_msg, pattr);
    size_t padded = buf ? NLMSG_ALIGN(hdr + len) : hdr;
    *m = (struct verdict_msg){
        .nlh = {.nlmsg_len = (uint32_t)(buf ? hdr + len : hdr),
                .nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT,
                .nlmsg_flags = NLM_F_REQUEST},
        .nfg = {.nfgen_family = AF_UNSPEC, .version = NFNETLINK_V0, .res_id = htons(cx->queue)},
        .vattr = {.nla_len = sizeof m->vattr + sizeof m->vh, .nla_type = NFQA_VERDICT_HDR},
        .vh = {.verdict = htonl(v), .id = htonl(id)},
        .pattr = {.nla_len = (uint16_t)(sizeof m->pattr + len), .nla_type = NFQA_PAYLOAD},
    };
    cx->iov[cx->niov++] = (struct iovec){m, hdr};
    if (buf) {
        cx->iov[cx->niov++] = (struct iovec){(void *)buf, len};
        if (padded > hdr + len)
            cx->iov[cx->niov++] = (struct iovec){(void *)pad, padded - hdr - len};
    }
    cx->n++;
    cx->bytes += padded;
    if (cx->n == BATCH || cx->bytes >= BATCH_BYTES)
        flush(cx);
}

static void key_of(const struct nicd_pkt *p, struct nicd_flow_key *k, int reverse)
{
    if (!reverse) {
        k->saddr = p->saddr, k->daddr = p->daddr, k->sport = p->sport, k->dport = p->dport;
    } else {
        k->saddr = p->daddr, k->daddr = p->saddr, k->sport = p->dport, k->dport = p->sport;
    }
    k->v6 = p->v6;
    if (p->v6) {
        memcpy(k->saddr6, reverse ? p->daddr6 : p->saddr6, 16);
        memcpy(k->daddr6, reverse ? p->saddr6 : p->daddr6, 16);
    }
}

/* The queued packet's id and bytes; returns its length, or -1. */
static int fetch(struct nfq_data *nfa, uint32_t *id, unsigned char **buf)
{
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    *id = ph ? ntohl(ph->packet_id) : 0;
    return nfq_get_payload(nfa, buf);
}

/* The MSS option of a SYN or SYN-ACK: what the peer's segments toward it may carry (as any
 * clamp on the path left it). 536 without one, as TCP assumes (RFC 9293). */
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
        .tos_compressed = cx->cfg->tos_compressed, .orig_tos = (uint8_t)(orig_tos & 0xFC),
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

static size_t egress_mtu(const struct ctx *cx, uint32_t ifindex, const struct nicd_pkt *p, int fresh);

/* Negotiate flow k and count the outcome. A negotiated flow's view before NAT is asked of the
 * slow path (nicd_conntrack.h), never here: until it is answered, its super-packets leave raw. */
static void negotiate(struct ctx *cx, const struct nicd_flow_key *k, uint32_t isn, uint32_t peer_isn,
                      uint16_t peer_mss, uint64_t owner)
{
    int rc = nicd_flows_negotiate(k, isn, peer_isn, peer_mss, owner);
    if (rc == NICD_FLOWS_OWNER_FULL) {
        COUNT(cx, FLOW_OWNER_FULL, 1);
    } else if (rc < 0) {
        COUNT(cx, FLOW_TABLE_FULL, 1);
    } else {
        COUNT(cx, FLOWS_NEGOTIATED, 1);
        nicd_ct_ask(k, isn); /* a full queue: the flow asks again later (nicd_flows_egress) */
    }
}

/* Our tagged SYN leaves: a new connection on this 4-tuple (any older negotiation is void);
 * it carries the hello option with a fresh nonce and the hello mark. The flow will be charged to
 * the user of the socket, as the kernel names it (NFQA_UID), else to the peer. */
static void egress_syn(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                       const struct nicd_flow_key *k, struct ctx *cx)
{
    nicd_flows_forget(k);
    uint32_t uid;
    struct nicd_hello h = {.state = NICD_HELLO_SENT, .isn = p->seq,
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
    if (nicd_hello_put(k, &h))
        COUNT(cx, HELLO_EVICTED, 1);
    COUNT(cx, HELLO_SENT, 1);
    if (cx->cfg->gso) /* the path MTU for its super-packets, now rather than on a data packet */
        egress_mtu(cx, nfq_get_outdev(nfa), p, 0);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* Our SYN-ACK leaves: answer the peer's hello if this SYN-ACK answers that very SYN. The path
 * MTU its data packets will need is looked up now, once, not on a data packet. */
static void egress_synack(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
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
    h.tries = 0;
    if (cx->cfg->gso)
        egress_mtu(cx, nfq_get_outdev(nfa), p, 0);
    if (nicd_hello_put(k, &h))
        COUNT(cx, HELLO_EVICTED, 1);
    COUNT(cx, HELLO_SENT, 1);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* The MTU a packet toward p's destination may have when it leaves by interface ifindex
 * (nicd_pmtu.h): a compressed packet sized to the interface alone would not pass a smaller path
 * MTU (the raw socket refuses it: EMSGSIZE, DF is set; IPv6 routers never fragment either), and
 * the flow would only crawl on through its one-MSS retransmissions. Read from the table the
 * handshakes fill and the main thread refreshes every second; looked up here (system calls)
 * only when fresh (the raw socket refused a packet for its size) or when the table has none
 * (its handshake's entry was pushed out or went idle). 0 if unknown, or if no raw socket of p's
 * family could be opened. */
static size_t egress_mtu(const struct ctx *cx, uint32_t ifindex, const struct nicd_pkt *p, int fresh)
{
    if ((p->v6 ? cx->raw6_fd : cx->raw_fd) < 0) /* no raw socket of the family: nothing to cut for */
        return 0;
    uint8_t daddr[16] = {0};
    memcpy(daddr, p->v6 ? p->daddr6 : (const uint8_t *)&p->daddr, p->v6 ? 16 : 4);
    size_t mtu;
    if (!fresh && nicd_pmtu_get(ifindex, p->v6, daddr, &mtu))
        return mtu;
    return nicd_pmtu_lookup(ifindex, p->v6, daddr);
}

/* Replace n bytes (n even, 16-bit aligned in the checksummed data) at at with to, updating the
 * ones-complement checksum at check incrementally (RFC 1624, as NAT does): whatever the checksum
 * said stays said, so a compressed packet's keeps its mark (wrong by exactly NICD_CSUM_MARK). */
static void replace_summed(uint8_t *at, const void *to, size_t n, uint8_t *check)
{
    uint32_t sum = (uint16_t)~((unsigned)check[0] << 8 | check[1]);
    const uint8_t *b = to;
    for (size_t i = 0; i < n; i += 2) {
        sum += (uint16_t)~((unsigned)at[i] << 8 | at[i + 1]);
        sum += (unsigned)b[i] << 8 | b[i + 1];
    }
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (uint16_t)~sum;
    check[0] = (uint8_t)(sum >> 8), check[1] = (uint8_t)sum;
    memcpy(at, to, n);
}

/* Give a packet the view's addresses and ports (known == 2); the TCP checksum follows
 * incrementally (a compressed packet's stays marked), an IPv4 header's is made anew (IPv6 has
 * none). */
static void apply_view(uint8_t *ip, const struct nicd_flow_view *v)
{
    if (v->known != 2)
        return;
    if (v->v6) {
        uint8_t *check = ip + 40 + 16;
        replace_summed(ip + 8, v->saddr6, 16, check); /* the pseudo-header's addresses */
        replace_summed(ip + 24, v->daddr6, 16, check);
        replace_summed(ip + 40, &v->sport, 2, check);
        replace_summed(ip + 42, &v->dport, 2, check);
        return;
    }
    size_t ihl = (size_t)(ip[0] & 15) * 4;
    uint8_t *check = ip + ihl + 16;
    replace_summed(ip + 12, &v->saddr, 4, check);   /* the pseudo-header's addresses */
    replace_summed(ip + 16, &v->daddr, 4, check);
    replace_summed(ip + ihl, &v->sport, 2, check);
    replace_summed(ip + ihl + 2, &v->dport, 2, check);
    nicd_set_tos(ip, ip[1]);
}

/* What the route lookup of the raw socket's packets gets from the original: the interface it
 * was leaving by, its mark, its protocol and its ToS. */
struct route_ctx {
    uint32_t ifindex, mark;
    uint8_t tos;
    struct nicd_flow_view view; /* the addresses before NAT */
};

/* The control messages that give the raw socket's route lookup the original's inputs:
 * IP_PKTINFO pins the interface; SO_MARK (an `ip rule fwmark`, or a socket's SO_MARK), IP_TOS
 * (`ip rule tos`) and IP_PROTOCOL (`ip rule ipproto`, IPsec selectors by protocol: a header-
 * included raw socket is otherwise looked up as protocol 255) are the original's. IPv6: the same
 * with IPV6_PKTINFO and IPV6_TCLASS; its protocol goes in the destination's port (raw_dest).
 * Returns the length written to b. */
static size_t route_cmsgs(const struct ctx *cx, const struct route_ctx *rc, int v6, uint8_t *b, size_t cap)
{
    struct msghdr mh = {.msg_control = b, .msg_controllen = cap};
    memset(b, 0, cap);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    size_t len = 0;
    if (rc->ifindex && v6) {
        struct in6_pktinfo info = {.ipi6_ifindex = rc->ifindex}; /* source address: the header's */
        *c = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof info), .cmsg_level = IPPROTO_IPV6, .cmsg_type = IPV6_PKTINFO};
        memcpy(CMSG_DATA(c), &info, sizeof info);
        len += CMSG_SPACE(sizeof info), c = CMSG_NXTHDR(&mh, c);
    } else if (rc->ifindex) {
        struct in_pktinfo info = {.ipi_ifindex = (int)rc->ifindex};
        *c = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof info), .cmsg_level = IPPROTO_IP, .cmsg_type = IP_PKTINFO};
        memcpy(CMSG_DATA(c), &info, sizeof info);
        len += CMSG_SPACE(sizeof info), c = CMSG_NXTHDR(&mh, c);
    }
    *c = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof rc->mark), .cmsg_level = SOL_SOCKET, .cmsg_type = SO_MARK};
    memcpy(CMSG_DATA(c), &rc->mark, sizeof rc->mark);
    len += CMSG_SPACE(sizeof rc->mark), c = CMSG_NXTHDR(&mh, c);
    int tos = rc->tos;
    *c = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof tos), .cmsg_level = v6 ? IPPROTO_IPV6 : IPPROTO_IP,
                          .cmsg_type = v6 ? IPV6_TCLASS : IP_TOS};
    memcpy(CMSG_DATA(c), &tos, sizeof tos);
    len += CMSG_SPACE(sizeof tos), c = CMSG_NXTHDR(&mh, c);
    if (!v6 && !cx->no_proto_cmsg) {
        int proto = IPPROTO_TCP;
        *c = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof proto), .cmsg_level = IPPROTO_IP, .cmsg_type = IP_PROTOCOL};
        memcpy(CMSG_DATA(c), &proto, sizeof proto);
        len += CMSG_SPACE(sizeof proto);
    }
    return len;
}

#define ROUTE_CMSGS_MAX (CMSG_SPACE(sizeof(struct in6_pktinfo)) + 3 * CMSG_SPACE(sizeof(int)))

union sockaddr_ip {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
};

/* Where the raw socket sends p's packets: the view's destination (the address before a DNAT)
 * or p's own. An IPv6 raw socket takes the protocol for its route lookup from the port (TCP,
 * as IP_PROTOCOL does for IPv4), unless the kernel refused that once (no_proto6). */
static socklen_t raw_dest(const struct ctx *cx, const struct nicd_pkt *p, const struct route_ctx *rc,
                          union sockaddr_ip *to)
{
    memset(to, 0, sizeof *to);
    if (!p->v6) {
        to->in = (struct sockaddr_in){.sin_family = AF_INET,
                                      .sin_addr.s_addr = rc->view.known == 2 ? rc->view.daddr : p->daddr};
        return sizeof to->in;
    }
    to->in6.sin6_family = AF_INET6;
    to->in6.sin6_port = cx->no_proto6 ? 0 : htons(IPPROTO_TCP);
    memcpy(&to->in6.sin6_addr, rc->view.known == 2 ? rc->view.daddr6 : p->daddr6, 16);
    if (IN6_IS_ADDR_LINKLOCAL(&to->in6.sin6_addr))
        to->in6.sin6_scope_id = rc->ifindex;
    return sizeof to->in6;
}

/* Send the compressed packets in cx->segs through the raw socket of p's family (IP header
 * included), out of the interface the super-packet p was leaving by, with its routing inputs
 * (route_cmsgs), past the egress rules, which catch only the tagged mark. One the kernel does not
 * take, or its qdisc drops (IP_RECVERR / IPV6_RECVERR make the raw socket say ENOBUFS then), is
 * lost: TCP retransmits its range. The packets the kernel took are counted here (compressed,
 * wire bytes without headers of hdr_len), so the counters match what the receiver can restore.
 * Returns how many were refused for their size (EMSGSIZE: the path MTU fell since it was
 * cached), which the caller counts or sends again; other refusals are counted here. */
static int send_segments(struct ctx *cx, const struct nicd_pkt *p, const struct route_ctx *rc, int nsegs,
                         size_t hdr_len)
{
    union sockaddr_ip to;
    socklen_t tolen = raw_dest(cx, p, rc, &to);
    int fd = p->v6 ? cx->raw6_fd : cx->raw_fd;
    union {
        struct cmsghdr h;
        uint8_t b[ROUTE_CMSGS_MAX];
    } ctl;
    size_t ctl_len = route_cmsgs(cx, rc, p->v6, ctl.b, sizeof ctl.b);
    struct mmsghdr mm[GSO_MAX_SEGS];
    struct iovec iov[GSO_MAX_SEGS];
    size_t at = 0;
    for (int i = 0; i < nsegs; i++) {
        apply_view(cx->segs + at, &rc->view);
        iov[i] = (struct iovec){cx->segs + at, cx->seg_len[i]};
        mm[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &to, .msg_namelen = tolen,
                                             .msg_iov = &iov[i], .msg_iovlen = 1,
                                             .msg_control = ctl.b, .msg_controllen = ctl_len}};
        at += cx->seg_len[i];
    }
    int sent = 0, too_big = 0, failed = 0;
    while (sent < nsegs) {
        int r = sendmmsg(fd, mm + sent, (unsigned)(nsegs - sent), 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EINVAL && !p->v6 && !cx->no_proto_cmsg) { /* a kernel without IP_PROTOCOL */
            cx->no_proto_cmsg = 1;
            ctl_len = route_cmsgs(cx, rc, p->v6, ctl.b, sizeof ctl.b);
            for (int i = 0; i < nsegs; i++)
                mm[i].msg_hdr.msg_controllen = ctl_len;
            continue;
        }
        if (r < 0 && errno == EINVAL && p->v6 && !cx->no_proto6) { /* a kernel that wants port 0 */
            cx->no_proto6 = 1;
            to.in6.sin6_port = 0;
            continue;
        }
        if (r <= 0) { /* ENOBUFS (a qdisc drop) and the like: skip one packet, TCP retransmits it */
            if (r < 0 && errno == EMSGSIZE)
                too_big++;
            else
                cx->st->c[NICD_C_GSO_SEND_ERRORS]++;
            sent++, failed = 1;
            continue;
        }
        for (int i = sent; i < sent + r; i++) {
            COUNT(cx, EGRESS_COMPRESSED, 1);
            COUNT(cx, EGRESS_WIRE_BYTES, cx->seg_len[i] - hdr_len);
        }
        sent += r;
    }
    if (failed) { /* IP_RECVERR queued a copy of each local error: nobody reads them */
        uint8_t junk[64];
        struct iovec jv = {junk, sizeof junk};
        struct msghdr jm = {.msg_iov = &jv, .msg_iovlen = 1};
        while (recvmsg(fd, &jm, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0)
            jm.msg_flags = 0;
    }
    return too_big;
}

/* One packet (of p's flow) through the raw socket, as send_segments sends them (not counted). */
static int send_one(struct ctx *cx, uint8_t *buf, size_t len, const struct nicd_pkt *p, const struct route_ctx *rc)
{
    apply_view(buf, &rc->view);
    union sockaddr_ip to;
    socklen_t tolen = raw_dest(cx, p, rc, &to);
    union {
        struct cmsghdr h;
        uint8_t b[ROUTE_CMSGS_MAX];
    } ctl;
    struct iovec iov = {(void *)buf, len};
    struct msghdr mh = {.msg_name = &to, .msg_namelen = tolen, .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl.b, .msg_controllen = route_cmsgs(cx, rc, p->v6, ctl.b, sizeof ctl.b)};
    return sendmsg(p->v6 ? cx->raw6_fd : cx->raw_fd, &mh, 0) < 0 ? -1 : 0;
}

/* Cut a super-packet into cx->segs for this MTU: its length in all, or what nicd_compress_gso says. */
static ptrdiff_t cut_gso(struct ctx *cx, const struct nicd_pkt *p, uint32_t isn, size_t mtu, int *nsegs,
                         uint64_t *tiers)
{
    *nsegs = 0;
    return nicd_compress_gso_codec(p, p->seq - isn - 1, codec_of_mark(cx, p->tos), cx->cfg->error_bound,
                                   (uint8_t)((p->tos & 3) | cx->cfg->tos_compressed), cx->echo, mtu, cx->segs,
                                   sizeof cx->segs, cx->seg_len, nsegs, GSO_MAX_SEGS, cx->scratch, cx->stream,
                                   sizeof cx->stream, tiers);
}

/* A super-packet (GSO, or over the MTU) on a negotiated flow: compressed into the fewest packets
 * that fit the MTU, sent through the raw socket, the original dropped. One that does not
 * compress leaves unchanged: the kernel segments it after the hook, as it would without us. */
static void egress_gso(uint32_t id, const struct nicd_pkt *p, uint32_t isn,
                       size_t mtu, size_t mss_len, const struct route_ctx *rc, struct ctx *cx)
{
    uint64_t tiers[4] = {0, 0, 0, 0};
    int nsegs;
    PROF_BEGIN(tc);
    ptrdiff_t r = cut_gso(cx, p, isn, mtu, &nsegs, tiers);
    PROF_END(cx, COMPRESS, tc);
    if (r <= NICD_TOO_SHORT) {
        if (r == NICD_TOO_SHORT)
            COUNT(cx, EGRESS_RAW_SHORT, 1);
        else
            COUNT(cx, EGRESS_RAW_NOT_SMALLER, 1);
        COUNT(cx, EGRESS_RAW_BYTES, p->payload_len);
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }
    flush(cx); /* verdicts still pending (earlier packets of this flow) leave first: no reordering */
    PROF_BEGIN(ts);
    int too_big = send_segments(cx, p, rc, nsegs, p->payload_off);
    PROF_END(cx, SEND, ts);
    if (too_big) {
        /* Refused for their size: the path MTU fell within the cached second. Look it up now and
         * send the whole super-packet again, cut to it: the ranges already out arrive twice,
         * which TCP takes as duplicates (cuts inside a super-packet are on float boundaries).
         * Only what is then still refused counts as a send error: nothing else is lost. */
        size_t fresh = egress_mtu(cx, rc->ifindex, p, 1);
        fresh = fresh < mss_len ? fresh : mss_len;
        uint64_t t2[4] = {0, 0, 0, 0};
        int n2;
        ptrdiff_t r2 = fresh < mtu ? cut_gso(cx, p, isn, fresh, &n2, t2) : NICD_NOT_SMALLER;
        if (r2 <= NICD_TOO_SHORT) {
            /* No cut fits (or the MTU did not fall): the original leaves whole and raw, and the
             * kernel segments it; the ranges that did leave compressed arrive twice. */
            COUNT(cx, EGRESS_RAW_BYTES, p->payload_len);
            verdict(id, NF_ACCEPT, NULL, 0, cx);
            return;
        }
        too_big = send_segments(cx, p, rc, n2, p->payload_off);
        memcpy(tiers, t2, sizeof tiers);
    }
    COUNT(cx, GSO_SEND_ERRORS, (uint64_t)too_big);
    COUNT(cx, GSO_SUPER_PACKETS, 1);
    COUNT(cx, EGRESS_ORIG_BYTES, p->payload_len);
    count_tiers(cx, tiers);
    verdict(id, NF_DROP, NULL, 0, cx);
}

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
static void egress(struct nfq_data *nfa, struct ctx *cx)
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
         * connection may carry: the path MTU, and the peer's MSS (the receiver's limit, or a
         * clamp on the path), as TCP cuts its own (a hop that drops ICMP "fragmentation
         * needed" never tells us its MTU, but the clamp or the peer's MSS does). */
        size_t mtu = egress_mtu(cx, nfq_get_outdev(nfa), &p, 0);
        /* the MSS counts from fixed headers: 20 bytes of TCP and 20 of IPv4, or 40 of IPv6 */
        size_t mss_len = (p.v6 ? 60 : 40) + (size_t)fi.peer_mss;
        if (mtu > mss_len)
            mtu = mss_len;
        if ((nfq_get_skbinfo(nfa) & NFQA_SKB_GSO) || p.len > mtu) {
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

/* A handshake marked tos_hello arrives. Only one carrying our option is a soft NIC's: the
 * option is removed and the original ToS put back. A SYN is remembered as a half-open hello
 * (never touching a negotiated flow); an answer negotiates only if it echoes the nonce of our
 * hello for this flow, acknowledges our ISN exactly, and states the same settings. */
static void ingress_hello(uint32_t id, const struct nicd_pkt *p,
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
                                .peer_mss = mss_option(p), .owner = nicd_flows_owner_of_peer(k)};
        memcpy(h.nonce, o.nonce, NICD_NONCE_LEN);
        if (nicd_hello_put(k, &h))
            COUNT(cx, HELLO_EVICTED, 1);
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
        negotiate(cx, k, h.isn, p->seq, mss_option(p), h.owner);
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

static void confirm_answered(const struct nicd_pkt *p, const struct nicd_flow_key *k, struct ctx *cx)
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
    negotiate(cx, k, h.isn, h.peer_isn, h.peer_mss, h.owner);
}

/* Ingress: the peer's hello, and restoring compressed packets. Fails closed: a compressed
 * packet that cannot be restored is dropped, and TCP retransmits it. */
static void ingress(struct nfq_data *nfa, struct ctx *cx)
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
    int rewritten = !dscp_is(p.tos, cx->cfg->tos_compressed);
    if (rewritten && (syn & TCP_SYN || !nicd_marked_checksum(&p))) {
        verdict(id, NF_ACCEPT, NULL, 0, cx);
        return;
    }

    /* the mark the sender's codec stands for goes back on (codec 2: tos_scaled) */
    uint8_t mark = nicd_codec_of(&p) == NICD_CODEC_SCALED ? cx->cfg->tos_scaled : cx->cfg->tos_tagged;
    PROF_BEGIN(tr);
    ptrdiff_t r = nicd_restore(&p, (uint8_t)((p.tos & 3) | mark), OUT(cx),
                               sizeof OUT(cx), cx->scratch);
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
    COUNT(cx, INGRESS_RESTORED, 1);
    COUNT(cx, INGRESS_WIRE_BYTES, p.payload_len);
    COUNT(cx, INGRESS_ORIG_BYTES, (size_t)r - p.payload_off);
    confirm_answered(&p, &k, cx);
    if (rewritten) {
        COUNT(cx, INGRESS_MARKS_REWRITTEN, 1);
        if (nicd_flows_note_rewritten(&k))
            COUNT(cx, FLOWS_MARKS_REWRITTEN, 1);
    }
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
}

/* The libnetfilter_queue callbacks: each packet's verdict is queued in cx (verdict, flush). */
static int on_egress(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data)
{
    (void)qh, (void)msg;
    egress(nfa, data);
    return 0;
}

static int on_ingress(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data)
{
    (void)qh, (void)msg;
    ingress(nfa, data);
    return 0;
}

/* A socket option (or queue binding) the daemon sets; which one goes into the bit of `warned` below. */
enum sockopt_id { OPT_QUEUE_RCVBUF, OPT_QUEUE_SNDBUF, OPT_QUEUE_NO_ENOBUFS, OPT_RAW_SNDBUF, OPT_RAW_RECVERR,
                  OPT_RAW_RECVERR6, OPT_BIND_PF6, OPT_UID_GID };

/* Say that a setting the kernel refused (`what`, errno e) costs `cost`: once per daemon (every
 * queue thread sets the same ones), on stderr as the daemon's log lines are. */
static void sockopt_warn(enum sockopt_id which, const char *what, int e, const char *cost)
{
    static unsigned warned;
    if (!(__atomic_fetch_or(&warned, 1u << which, __ATOMIC_RELAXED) & (1u << which))) {
        fprintf(stderr, "nicd WARNING: %s failed (%s): %s\n", what, strerror(e), cost);
        fflush(stderr);
    }
}

/* Set a socket option; a refusal is said by sockopt_warn. Returns 0 or -1. */
static int sockopt(enum sockopt_id which, int fd, int level, int name, const void *v, socklen_t len,
                   const char *what, const char *cost)
{
    if (setsockopt(fd, level, name, v, len) == 0)
        return 0;
    sockopt_warn(which, what, errno, cost);
    return -1;
}

static int fail(char *err, size_t errlen, const char *what, int e)
{
    snprintf(err, errlen, "%s: %s", what, e ? strerror(e) : "failed");
    return -1;
}

int nicd_run(struct nicd_config *cfg, struct nicd_stats *st, char *err, size_t errlen)
{
    struct ctx *cx = calloc(1, sizeof *cx);
    char *rbuf = malloc((size_t)RECV_MSGS * RECV_BUF);
    if (cx)
        cx->raw_fd = cx->raw6_fd = -1;
    struct nfq_handle *h = NULL;
    struct nfq_q_handle *qe = NULL, *qi = NULL;
    int rc = -1;
    if (!cx || !rbuf) {
        fail(err, errlen, "out of memory", ENOMEM);
        goto out;
    }
    cx->cfg = cfg;
    cx->st = st;
    /* gso sends through it; without gso it is only for a flow that gives up (give_up), and
     * optional (CAP_NET_RAW) */
    if ((cx->raw_fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW)) < 0 && cfg->gso) {
        fail(err, errlen, "gso: cannot open a raw IP socket (needs CAP_NET_RAW)", errno);
        goto out;
    }
    /* IPv6's: IPPROTO_RAW implies IPV6_HDRINCL (Linux, raw(7)), as for IPv4. Optional: a kernel
     * without IPv6 never queues IPv6 packets; without it (egress_mtu says 0), IPv6 super-packets
     * leave raw. */
    if (cx->raw_fd >= 0)
        cx->raw6_fd = socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
    if (cfg->gso && nicd_pmtu_init() < 0) { /* the path MTU lookups' sockets, shared (nicd_pmtu.h) */
        fail(err, errlen, "gso: cannot open a datagram socket", errno);
        goto out;
    }
    if (!(h = nfq_open())) {
        fail(err, errlen, "cannot open a netfilter queue handle (needs CAP_NET_ADMIN)", errno);
        goto out;
    }
    if (nfq_bind_pf(h, AF_INET) < 0) {
        fail(err, errlen, "nfq_bind_pf", errno);
        goto out;
    }
    /* The same queues take IPv6 packets (ip6tables rules with the same numbers). Since Linux 3.8
     * binding a family is a no-op; an older kernel without IPv6 queueing keeps IPv4 working. */
    if (nfq_bind_pf(h, AF_INET6) < 0)
        sockopt_warn(OPT_BIND_PF6, "nfq_bind_pf(AF_INET6)", errno, "IPv6 packets are not queued to this daemon");
    if (!(qe = nfq_create_queue(h, cfg->egress_queue, on_egress, cx))) {
        snprintf(err, errlen, "cannot bind NFQUEUE %u (egress): is another nicd running?", cfg->egress_queue);
        goto out;
    }
    if (!(qi = nfq_create_queue(h, cfg->ingress_queue, on_ingress, cx))) {
        snprintf(err, errlen, "cannot bind NFQUEUE %u (ingress): is another nicd running?", cfg->ingress_queue);
        goto out;
    }
    if (nfq_set_mode(qe, NFQNL_COPY_PACKET, 0xFFFF) < 0 || nfq_set_mode(qi, NFQNL_COPY_PACKET, 0xFFFF) < 0) {
        fail(err, errlen, "nfq_set_mode", errno);
        goto out;
    }
    /* The configured queue_maxlen is what bounds the kernel's backlog: a refusal must not leave
     * the kernel's default (1024) in place unnoticed. */
    if (nfq_set_queue_maxlen(qe, cfg->queue_maxlen) < 0 || nfq_set_queue_maxlen(qi, cfg->queue_maxlen) < 0) {
        fail(err, errlen, "nfq_set_queue_maxlen", errno);
        goto out;
    }
    /* Egress may fail open (a full queue lets the packet leave raw); ingress never does. With
     * gso the egress queue gets super-packets whole, their checksums not filled in (CHECKSUM_
     * PARTIAL): whatever we rewrite gets full checksums, what we accept the kernel completes. */
    uint32_t eflags = NFQA_CFG_F_FAIL_OPEN | (cfg->gso ? NFQA_CFG_F_GSO : 0);
    if (nfq_set_queue_flags(qe, eflags, eflags) < 0 && cfg->gso) {
        fail(err, errlen, "gso: the kernel refuses NFQA_CFG_F_GSO on the egress queue", errno);
        goto out;
    }
    /* the user of a SYN's socket: the owner its flow is charged to (egress_syn) */
    if (nfq_set_queue_flags(qe, NFQA_CFG_F_UID_GID, NFQA_CFG_F_UID_GID) < 0)
        sockopt_warn(OPT_UID_GID, "NFQA_CFG_F_UID_GID on the egress queue", errno,
                     "flows are charged to their peer host, not to the local user (flow_owner_cap)");
    int fd = nfq_fd(h);
    int bufsize = 8 << 20, sndsize = 2 * BATCH_BYTES + (1 << 20), one = 1;
    sockopt(OPT_QUEUE_RCVBUF, fd, SOL_SOCKET, SO_RCVBUFFORCE, &bufsize, sizeof bufsize, "SO_RCVBUFFORCE",
            "the queue socket keeps the default receive buffer: a burst may overflow it, its ingress packets "
            "are dropped and its egress packets leave raw");
    sockopt(OPT_QUEUE_SNDBUF, fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndsize, sizeof sndsize, "SO_SNDBUFFORCE",
            "a batch of verdicts may not fit the default send buffer: its packets are lost (verdict_errors)");
    for (int v6 = 0; v6 < 2; v6++) { /* the raw sockets: a few super-packets' worth of buffer */
        int rfd = v6 ? cx->raw6_fd : cx->raw_fd, rawsize = 4 << 20;
        if (rfd < 0)
            continue;
        sockopt(OPT_RAW_SNDBUF, rfd, SOL_SOCKET, SO_SNDBUFFORCE, &rawsize, sizeof rawsize,
                "SO_SNDBUFFORCE on the raw socket", "sending a super-packet's compressed packets may wait for "
                "room in the default send buffer");
        /* without it a raw socket reports a packet its qdisc dropped as sent */
        sockopt(v6 ? OPT_RAW_RECVERR6 : OPT_RAW_RECVERR, rfd, v6 ? IPPROTO_IPV6 : IPPROTO_IP,
                v6 ? IPV6_RECVERR : IP_RECVERR, &one, sizeof one, v6 ? "IPV6_RECVERR" : "IP_RECVERR",
                "compressed packets the qdisc drops are not counted (gso_send_errors)");
    }
    cx->fd = fd;
    struct mmsghdr mm[RECV_MSGS];
    struct iovec rio[RECV_MSGS];
    for (int i = 0; i < RECV_MSGS; i++) {
        rio[i] = (struct iovec){rbuf + (size_t)i * RECV_BUF, RECV_BUF};
        mm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &rio[i], .msg_iovlen = 1}};
    }
    sockopt(OPT_QUEUE_NO_ENOBUFS, fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one, "NETLINK_NO_ENOBUFS",
            "a receive buffer overflow also fails the next read (recv_enobufs)");

    cfg->ready = 1;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (!cfg->stop) {
        PROF_BEGIN(tp);
        int pr = poll(&pfd, 1, 100);
        PROF_END(cx, POLL, tp);
        if (pr < 0 && errno != EINTR) {
            fail(err, errlen, "poll", errno);
            goto out;
        }
        if (pr <= 0)
            continue;
        /* Drain what is there before polling again: one poll, many packets, several per
         * system call; the verdicts go back in batches. */
        for (;;) {
            PROF_BEGIN(tr);
            int got = recvmmsg(fd, mm, RECV_MSGS, MSG_DONTWAIT, NULL);
            PROF_END(cx, RECV, tr);
            if (got < 0) {
                if (errno == ENOBUFS) {
                    COUNT(cx, RECV_ENOBUFS, 1);
                    continue;
                }
                break; /* EAGAIN: drained */
            }
            for (int i = 0; i < got; i++) {
                PROF_BEGIN(th);
#ifdef NICD_PROFILE
                cx->in_handle = 1;
#endif
                nfq_handle_packet(h, rio[i].iov_base, (int)mm[i].msg_len);
#ifdef NICD_PROFILE
                cx->in_handle = 0;
#endif
                PROF_END(cx, HANDLE, th);
            }
        }
        flush(cx);
    }
    rc = 0;
#ifdef NICD_PROFILE
    { /* one line per queue thread: phase calls/total-us; HANDLE includes FLOW ... VERDICT_IN */
        const char *path = getenv("NICD_PROFILE_OUT");
        FILE *f = path ? fopen(path, "a") : NULL;
        static const char *const names[] = {
#define PROF_NAME_(n) #n,
            PROF_PHASES(PROF_NAME_)
#undef PROF_NAME_
        };
        char line[1024];
        int at = snprintf(line, sizeof line, "nicd-profile pid %d queues %u/%u gso %d accept_only %d egress %llu ingress %llu",
                          (int)getpid(), cfg->egress_queue, cfg->ingress_queue, cfg->gso, cfg->accept_only,
                          (unsigned long long)st->c[NICD_C_EGRESS_PACKETS], (unsigned long long)st->c[NICD_C_INGRESS_PACKETS]);
        for (int i = 0; i < PH_N && at > 0 && (size_t)at < sizeof line; i++)
            at += snprintf(line + at, sizeof line - (size_t)at, " %s %llu/%llu", names[i],
                           (unsigned long long)cx->prof_n[i], (unsigned long long)(cx->prof_ns[i] / 1000));
        fprintf(f ? f : stderr, "%s\n", line);
        if (f)
            fclose(f);
    }
#endif
out:
    if (qe)
        nfq_destroy_queue(qe);
    if (qi)
        nfq_destroy_queue(qi);
    if (h)
        nfq_close(h);
    if (cx && cx->raw_fd >= 0)
        close(cx->raw_fd);
    if (cx && cx->raw6_fd >= 0)
        close(cx->raw6_fd);
    free(rbuf);
    free(cx);
    return rc;
}
