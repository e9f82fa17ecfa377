/* gso transmit: a super-packet of a negotiated flow cut into compressed packets
 * (nicd_compress_gso_codec) and sent through a raw socket with the original's routing inputs;
 * the MTU they are cut to (nicd_pmtu.h). */
#define _GNU_SOURCE
#include "nicd_queue_int.h"

#include "nicd_pmtu.h"

/* The MTU a packet toward p's destination may have when it leaves by interface ifindex
 * (nicd_pmtu.h): a compressed packet sized to the interface alone would not pass a smaller path
 * MTU (the raw socket refuses it: EMSGSIZE, DF is set; IPv6 routers never fragment either), and
 * the flow would only crawl on through its one-MSS retransmissions. Read from the table the
 * handshakes fill and the main thread refreshes every second; looked up here (system calls)
 * only when fresh (the raw socket refused a packet for its size) or when the table has none
 * (its handshake's entry was pushed out or went idle). 0 if unknown, or if no raw socket of p's
 * family could be opened. */
size_t egress_mtu(const struct ctx *cx, uint32_t ifindex, const struct nicd_pkt *p, int fresh)
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
int send_one(struct ctx *cx, uint8_t *buf, size_t len, const struct nicd_pkt *p, const struct route_ctx *rc)
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

/* A super-packet that did not compress (nicd_compress_gso's or nicd_compress_train's result r)
 * leaves unchanged: the kernel segments it after the hook, as it would without us. */
static void leave_raw(uint32_t id, const struct nicd_pkt *p, ptrdiff_t r, struct ctx *cx)
{
    if (r == NICD_TOO_SHORT)
        COUNT(cx, EGRESS_RAW_SHORT, 1);
    else
        COUNT(cx, EGRESS_RAW_NOT_SMALLER, 1);
    COUNT(cx, EGRESS_RAW_BYTES, p->payload_len);
    verdict(id, NF_ACCEPT, NULL, 0, cx);
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
void egress_gso(uint32_t id, const struct nicd_pkt *p, uint32_t isn,
                       size_t mtu, size_t mss_len, const struct route_ctx *rc, struct ctx *cx)
{
    uint64_t tiers[4] = {0, 0, 0, 0};
    int nsegs;
    PROF_BEGIN(tc);
    ptrdiff_t r = cut_gso(cx, p, isn, mtu, &nsegs, tiers);
    PROF_END(cx, COMPRESS, tc);
    if (r <= NICD_TOO_SHORT) {
        leave_raw(id, p, r, cx);
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

/* v3 (docs/wire-format.md, "Segment trains"): a GSO skb of a flow whose peer restores trains goes
 * back in its own verdict as one train, which the kernel cuts at the skb's gso_size with fresh
 * checksums after the hook, keeping all it knows of the original (route, mark, conntrack, NAT
 * after us). Returns 1 when the packet is dealt with (a train, or unchanged when it does not
 * compress). Returns 0, having sent and counted nothing, when it compresses into one segment:
 * the kernel refuses to cut a GSO skb no longer than its gso_size and would drop it, and the
 * raw socket is no way out for a v3 segment either, since its packets enter conntrack again
 * and a seq 2^31 away is INVALID there (so NAT passes it by: through a DNAT it left for the
 * service address and was lost). The caller sends it as v2, at its original seq. */
int egress_train(uint32_t id, const struct nicd_pkt *p, uint32_t isn, size_t gso_size, struct ctx *cx)
{
    uint64_t tiers[4] = {0, 0, 0, 0};
    int nsegs = 0;
    PROF_BEGIN(tc);
    ptrdiff_t r = nicd_compress_train(p, p->seq - isn - 1, codec_of_mark(cx, p->tos), cx->cfg->error_bound,
                                      (uint8_t)((p->tos & 3) | cx->cfg->tos_compressed), cx->echo, gso_size,
                                      OUT(cx), sizeof OUT(cx), &nsegs, GSO_MAX_SEGS, cx->scratch, cx->stream,
                                      sizeof cx->stream, tiers);
    PROF_END(cx, COMPRESS, tc);
    if (r <= NICD_TOO_SHORT) {
        leave_raw(id, p, r, cx);
        return 1;
    }
    if (nsegs == 1)
        return 0;
    COUNT(cx, EGRESS_ORIG_BYTES, p->payload_len);
    count_tiers(cx, tiers);
    COUNT(cx, EGRESS_TRAINS, 1);
    COUNT(cx, EGRESS_COMPRESSED, (uint64_t)nsegs);
    COUNT(cx, EGRESS_WIRE_BYTES, (size_t)r - p->payload_off);
    verdict(id, NF_ACCEPT, OUT(cx), (size_t)r, cx);
    return 1;
}
