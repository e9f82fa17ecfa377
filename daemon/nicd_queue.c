/* NFQUEUE loop of the soft NIC: nicd_run, first, then the verdicts it batches. What happens to
 * each queued packet is in nicd_egress.c and nicd_ingress.c (nicd_queue_int.h lists the files).
 * The rules that feed it are installed by daemon/rules.py. */
#define _GNU_SOURCE
#include "nicd_queue_int.h"

#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include "nicd_pmtu.h"

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif

/* A socket option (or queue binding) the daemon sets; which one goes into the bit of `warned` below. */
enum sockopt_id { OPT_QUEUE_RCVBUF, OPT_QUEUE_SNDBUF, OPT_QUEUE_NO_ENOBUFS, OPT_RAW_SNDBUF, OPT_RAW_RECVERR,
                  OPT_RAW_RECVERR6, OPT_BIND_PF6, OPT_UID_GID, OPT_INGRESS_GSO };
static void sockopt_warn(enum sockopt_id which, const char *what, int e, const char *cost);
static int sockopt(enum sockopt_id which, int fd, int level, int name, const void *v, socklen_t len,
                   const char *what, const char *cost);
static int fail(char *err, size_t errlen, const char *what, int e);
static int on_egress(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data);
static int on_ingress(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data);

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
    /* v3: the ingress queue takes what GRO merged whole, so a train restores in one verdict;
     * without it the kernel cuts it into its segments first, which restore one by one. */
    if (cfg->trains && nfq_set_queue_flags(qi, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
        sockopt_warn(OPT_INGRESS_GSO, "NFQA_CFG_F_GSO on the ingress queue", errno,
                     "trains are restored segment by segment, not in one verdict each");
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
        int at = snprintf(line, sizeof line, "nicd-profile pid %d queues %u/%u gso %d trains %d accept_only %d egress %llu "
                          "ingress %llu", (int)getpid(), cfg->egress_queue, cfg->ingress_queue, cfg->gso, cfg->trains,
                          cfg->accept_only,
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

static void queue_verdict(uint32_t id, uint32_t v, const uint8_t *buf, size_t len, struct ctx *cx);

void flush(struct ctx *cx)
{
    close_merge(cx);
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
    cx->n = 0, cx->nout = 0, cx->niov = 0, cx->bytes = 0;
}

/* Queue a verdict; buf, if given, is the rewritten packet and must be OUT(cx). An open packet of
 * the receive offload goes first (it came first), without a flush between: buf then is its
 * next slot. */
void verdict(uint32_t id, uint32_t v, const uint8_t *buf, size_t len, struct ctx *cx)
{
    close_merge(cx);
    queue_verdict(id, v, buf, len, cx);
    if (cx->n >= BATCH || cx->nout >= BATCH || cx->bytes >= BATCH_BYTES)
        flush(cx);
}

void close_merge(struct ctx *cx)
{
    if (!cx->merging)
        return;
    cx->merging = 0;
    uint8_t *a = cx->out[cx->nout];
    if (cx->nmerged)
        nicd_finish_merged(a, cx->open_len);
    uint16_t q = cx->queue;
    cx->queue = cx->open_queue;
    queue_verdict(cx->open_id, NF_ACCEPT, a, cx->open_len, cx);
    for (int i = 0; i < cx->nmerged; i++)
        queue_verdict(cx->merged[i], NF_DROP, NULL, 0, cx);
    cx->nmerged = 0;
    cx->queue = q;
}

/* One verdict message into the batch (msg, iov), without a flush: VERDICTS_MAX leaves room for an
 * open packet and the drops of the packets it took in beyond a full batch. */
static void queue_verdict(uint32_t id, uint32_t v, const uint8_t *buf, size_t len, struct ctx *cx)
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
    cx->nout += buf != NULL;
    cx->bytes += padded;
}

/* The queued packet's id and bytes; returns its length, or -1. */
int fetch(struct nfq_data *nfa, uint32_t *id, unsigned char **buf)
{
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    *id = ph ? ntohl(ph->packet_id) : 0;
    return nfq_get_payload(nfa, buf);
}

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
