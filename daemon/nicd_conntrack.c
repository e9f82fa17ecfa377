/* The slow path's conntrack questions, on a thread of their own (see nicd_conntrack.h). */
#define _GNU_SOURCE
#include "nicd_conntrack.h"

#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the request queue: bounded, many producers (queue threads), one consumer ------------ */

/* D. Vyukov's bounded queue: a cell is free for the producer at position pos when its seq is
 * pos, and holds a request for the consumer when its seq is pos + 1. */
struct request {
    struct nicd_flow_key key;
    uint32_t isn;
};

static struct {
    uint64_t seq;
    struct request r;
} cells[NICD_CT_QUEUE];
static uint64_t enq_pos, deq_pos; /* enq_pos: atomics; deq_pos: the consumer's own */

static int ct_fd = -1, wake_fd = -1;
static int running, stopping, sleeping; /* atomics */
static int held;                        /* atomic; nicd_ct_test_hold */
static uint32_t ct_seq;                 /* the worker's own */
static uint64_t answered, questions;    /* atomics */
static pthread_t worker;
static pthread_mutex_t life = PTHREAD_MUTEX_INITIALIZER; /* start and stop only */

static void queue_reset(void)
{
    for (uint64_t i = 0; i < NICD_CT_QUEUE; i++)
        __atomic_store_n(&cells[i].seq, i, __ATOMIC_RELAXED);
    __atomic_store_n(&enq_pos, 0, __ATOMIC_RELAXED);
    deq_pos = 0;
}

static int push(const struct request *r)
{
    uint64_t pos = __atomic_load_n(&enq_pos, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t seq = __atomic_load_n(&cells[pos % NICD_CT_QUEUE].seq, __ATOMIC_ACQUIRE);
        int64_t d = (int64_t)(seq - pos);
        if (d == 0 && __atomic_compare_exchange_n(&enq_pos, &pos, pos + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            break;
        if (d < 0)
            return -1; /* full */
        if (d > 0)
            pos = __atomic_load_n(&enq_pos, __ATOMIC_RELAXED);
    }
    cells[pos % NICD_CT_QUEUE].r = *r;
    __atomic_store_n(&cells[pos % NICD_CT_QUEUE].seq, pos + 1, __ATOMIC_RELEASE);
    return 0;
}

static int pop(struct request *r)
{
    uint64_t pos = deq_pos;
    if (__atomic_load_n(&cells[pos % NICD_CT_QUEUE].seq, __ATOMIC_ACQUIRE) != pos + 1)
        return 0;
    *r = cells[pos % NICD_CT_QUEUE].r;
    __atomic_store_n(&cells[pos % NICD_CT_QUEUE].seq, pos + NICD_CT_QUEUE, __ATOMIC_RELEASE);
    deq_pos = pos + 1;
    return 1;
}

/* ---- ctnetlink ------------------------------------------------------------------------------ */

static size_t nla_put(uint8_t *b, size_t at, uint16_t type, const void *v, uint16_t len)
{
    struct nlattr a = {.nla_len = (uint16_t)(NLA_HDRLEN + len), .nla_type = type};
    memcpy(b + at, &a, sizeof a);
    memcpy(b + at + NLA_HDRLEN, v, len);
    return at + NLA_ALIGN(NLA_HDRLEN + len);
}

static void nla_nest_end(uint8_t *b, size_t start, size_t at, uint16_t type)
{
    struct nlattr a = {.nla_len = (uint16_t)(at - start), .nla_type = (uint16_t)(type | NLA_F_NESTED)};
    memcpy(b + start, &a, sizeof a);
}

/* The attributes in [b, b + len), each bounds-checked before it is read. */
#define FOR_NLA(a, b, len)                                                                      \
    for (const uint8_t *a = (b); a + NLA_HDRLEN <= (b) + (len) &&                              \
                                 nla_len_at(a) >= NLA_HDRLEN && a + nla_len_at(a) <= (b) + (len); \
         a += NLA_ALIGN(nla_len_at(a)))

static uint16_t nla_len_at(const uint8_t *a)
{
    struct nlattr h;
    memcpy(&h, a, sizeof h);
    return h.nla_len;
}

static uint16_t nla_type_at(const uint8_t *a)
{
    struct nlattr h;
    memcpy(&h, a, sizeof h);
    return h.nla_type & NLA_TYPE_MASK;
}

/* A CTA_TUPLE_* body into *v; 1 if it held addresses of v's family (v->v6) and TCP ports. */
static int parse_tuple(const uint8_t *b, size_t len, struct nicd_flow_view *v)
{
    int got = 0;
    FOR_NLA(a, b, len) {
        const uint8_t *in = a + NLA_HDRLEN;
        size_t inlen = nla_len_at(a) - NLA_HDRLEN;
        if (nla_type_at(a) == CTA_TUPLE_IP) {
            FOR_NLA(x, in, inlen) {
                if (nla_len_at(x) < NLA_HDRLEN + (v->v6 ? 16 : 4))
                    continue;
                if (!v->v6 && nla_type_at(x) == CTA_IP_V4_SRC)
                    memcpy(&v->saddr, x + NLA_HDRLEN, 4), got |= 1;
                else if (!v->v6 && nla_type_at(x) == CTA_IP_V4_DST)
                    memcpy(&v->daddr, x + NLA_HDRLEN, 4), got |= 2;
                else if (v->v6 && nla_type_at(x) == CTA_IP_V6_SRC)
                    memcpy(v->saddr6, x + NLA_HDRLEN, 16), got |= 1;
                else if (v->v6 && nla_type_at(x) == CTA_IP_V6_DST)
                    memcpy(v->daddr6, x + NLA_HDRLEN, 16), got |= 2;
            }
        } else if (nla_type_at(a) == CTA_TUPLE_PROTO) {
            FOR_NLA(x, in, inlen) {
                if (nla_len_at(x) < NLA_HDRLEN + 1)
                    continue;
                if (nla_type_at(x) == CTA_PROTO_NUM && x[NLA_HDRLEN] == IPPROTO_TCP)
                    got |= 4;
                else if (nla_type_at(x) == CTA_PROTO_SRC_PORT && nla_len_at(x) >= NLA_HDRLEN + 2)
                    memcpy(&v->sport, x + NLA_HDRLEN, 2), got |= 8;
                else if (nla_type_at(x) == CTA_PROTO_DST_PORT && nla_len_at(x) >= NLA_HDRLEN + 2)
                    memcpy(&v->dport, x + NLA_HDRLEN, 2), got |= 16;
            }
        }
    }
    return got == 31;
}

static int view_eq(const struct nicd_flow_view *a, const struct nicd_flow_view *b)
{
    if (a->sport != b->sport || a->dport != b->dport)
        return 0;
    if (a->v6)
        return memcmp(a->saddr6, b->saddr6, 16) == 0 && memcmp(a->daddr6, b->daddr6, 16) == 0;
    return a->saddr == b->saddr && a->daddr == b->daddr;
}

/* Ask conntrack for the connection one of whose tuples is t (the kernel looks a tuple up in
 * both directions, whichever attribute names it): 1 with its original and reply tuples in *orig
 * and *reply, 0 if there is none, -1 if no answer came (SO_RCVTIMEO). */
static int ct_get(const struct nicd_flow_view *t, struct nicd_flow_view *orig, struct nicd_flow_view *reply)
{
    union {
        struct nlmsghdr h;
        uint8_t b[256];
    } req;
    size_t at = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg));
    memset(&req, 0, sizeof req);
    struct nfgenmsg nfg = {.nfgen_family = t->v6 ? AF_INET6 : AF_INET, .version = NFNETLINK_V0};
    memcpy(req.b + NLMSG_HDRLEN, &nfg, sizeof nfg);
    size_t outer = at, ip, pr;
    at += NLA_HDRLEN, ip = at, at += NLA_HDRLEN;
    if (t->v6) {
        at = nla_put(req.b, at, CTA_IP_V6_SRC, t->saddr6, 16);
        at = nla_put(req.b, at, CTA_IP_V6_DST, t->daddr6, 16);
    } else {
        at = nla_put(req.b, at, CTA_IP_V4_SRC, &t->saddr, 4);
        at = nla_put(req.b, at, CTA_IP_V4_DST, &t->daddr, 4);
    }
    nla_nest_end(req.b, ip, at, CTA_TUPLE_IP);
    uint8_t proto = IPPROTO_TCP;
    pr = at, at += NLA_HDRLEN;
    at = nla_put(req.b, at, CTA_PROTO_NUM, &proto, 1);
    at = nla_put(req.b, at, CTA_PROTO_SRC_PORT, &t->sport, 2);
    at = nla_put(req.b, at, CTA_PROTO_DST_PORT, &t->dport, 2);
    nla_nest_end(req.b, pr, at, CTA_TUPLE_PROTO);
    nla_nest_end(req.b, outer, at, CTA_TUPLE_REPLY);
    req.h = (struct nlmsghdr){.nlmsg_len = (uint32_t)at, .nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET,
                              .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = ++ct_seq};
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    __atomic_fetch_add(&questions, 1, __ATOMIC_RELAXED);
    if (sendto(ct_fd, req.b, at, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
        return -1;
    static union {
        struct nlmsghdr h;
        uint8_t b[16384];
    } ans; /* the worker's alone */
    for (;;) {
        ssize_t n = recv(ct_fd, ans.b, sizeof ans.b, 0); /* SO_RCVTIMEO bounds the wait */
        if (n < 0)
            return -1;
        for (struct nlmsghdr *h = &ans.h; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != ct_seq) /* a late answer to an earlier question */
                continue;
            if (h->nlmsg_type == NLMSG_ERROR)
                return 0; /* ENOENT: no such connection (or the question was refused) */
            size_t body = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg));
            if (h->nlmsg_len < body)
                return -1;
            int got = 0;
            orig->v6 = reply->v6 = t->v6;
            FOR_NLA(a, (const uint8_t *)h + body, h->nlmsg_len - body) {
                if (nla_type_at(a) == CTA_TUPLE_ORIG)
                    got |= parse_tuple(a + NLA_HDRLEN, nla_len_at(a) - NLA_HDRLEN, orig);
                else if (nla_type_at(a) == CTA_TUPLE_REPLY)
                    got |= parse_tuple(a + NLA_HDRLEN, nla_len_at(a) - NLA_HDRLEN, reply) << 1;
            }
            return got == 3 ? 1 : -1;
        }
    }
}

/* Flow k's packets as the hook sees them (known 1). */
static struct nicd_flow_view hook_view(const struct nicd_flow_key *k)
{
    struct nicd_flow_view v = {.known = 1, .saddr = k->saddr, .daddr = k->daddr, .sport = htons(k->sport),
                               .dport = htons(k->dport), .v6 = k->v6};
    if (k->v6)
        memcpy(v.saddr6, k->saddr6, 16), memcpy(v.daddr6, k->daddr6, 16);
    return v;
}

/* What the packets of flow k (our egress direction, as the hook sees it) looked like when
 * conntrack took them (in LOCAL_OUT, before NAT). The raw socket's packets re-enter the output
 * path there, so with these addresses conntrack finds the connection and NAT treats them as it
 * treated the original; with the ones the hook sees after a DNAT (nat OUTPUT, as kube-proxy's),
 * conntrack takes them for a new connection and NAT gives them a fresh source port. SNAT comes
 * after the hook (nat POSTROUTING) and needs nothing.
 * One question: the connection that has the packet reversed as a tuple. If that is its reply
 * tuple, our packets are its original direction, and its original tuple is the view (the
 * packet itself without a DNAT, the address before it with one). If it is its original tuple,
 * we answer (the peer opened it): our packets are the reply direction as NAT expects them. No
 * connection (not tracked; an SNAT, whose reply tuple names the SNAT address; or a DNAT and an
 * SNAT of one flow, which nicd cannot tell apart: its packets go astray, and the flow gives up
 * compressing) or no answer: as the hook sees them. nicd used to ask first for the packet itself
 * as an original, then as a reply tuple (the kernel looks a tuple up in both directions, so
 * these were one question twice), and took "as the hook sees them" when found: the answer this
 * one question gives in those cases too (the packet is the original tuple without a NAT, so its
 * reverse is the reply tuple and the original is the packet; it is the reply tuple when we
 * answer). Where conntrack tracks nothing, one question instead of three. */
static struct nicd_flow_view conntrack_view(const struct nicd_flow_key *k)
{
    struct nicd_flow_view now = hook_view(k), rev = now;
    rev.known = 0;
    rev.saddr = now.daddr, rev.daddr = now.saddr, rev.sport = now.dport, rev.dport = now.sport;
    memcpy(rev.saddr6, now.daddr6, 16), memcpy(rev.daddr6, now.saddr6, 16);
    struct nicd_flow_view o = {0}, r = {0};
    if (ct_get(&rev, &o, &r) <= 0 || !view_eq(&r, &rev) || view_eq(&o, &now))
        return now;
    o.known = 2;
    return o;
}

/* ---- the worker ----------------------------------------------------------------------------- */

static void *work(void *arg)
{
    (void)arg;
    struct request r;
    while (!__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&held, __ATOMIC_ACQUIRE)) {
            poll(NULL, 0, 5);
            continue;
        }
        if (!pop(&r)) {
            /* Sleep until a producer wakes us; it writes the eventfd only if it sees `sleeping`
             * (a system call per burst of handshakes, none while we are busy). Said first, then
             * the queue's end looked at (both seq_cst, as the producer's claim of a cell and its
             * look at `sleeping`): a request claimed before we said it is seen here, one after
             * it sees us sleeping. The poll has a timeout besides. */
            __atomic_store_n(&sleeping, 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&enq_pos, __ATOMIC_SEQ_CST) != deq_pos) { /* claimed, maybe not filled yet */
                __atomic_store_n(&sleeping, 0, __ATOMIC_SEQ_CST);
                continue;
            }
            struct pollfd p = {.fd = wake_fd, .events = POLLIN};
            uint64_t junk;
            if (poll(&p, 1, 100) > 0 && read(wake_fd, &junk, sizeof junk) < 0)
                junk = 0;
            __atomic_store_n(&sleeping, 0, __ATOMIC_SEQ_CST);
            continue;
        }
        struct nicd_flow_view v = conntrack_view(&r.key);
        nicd_flows_set_view(&r.key, r.isn, &v);
        __atomic_fetch_add(&answered, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

int nicd_ct_start(void)
{
    int rc = 0, e = 0;
    pthread_mutex_lock(&life);
    if (!__atomic_load_n(&running, __ATOMIC_ACQUIRE)) {
        queue_reset();
        __atomic_store_n(&stopping, 0, __ATOMIC_RELAXED);
        ct_fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
        struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
        if (ct_fd >= 0 && setsockopt(ct_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) {
            fprintf(stderr, "nicd WARNING: SO_RCVTIMEO on the conntrack socket failed (%s): conntrack is not "
                    "asked: gso packets of a NATed flow keep the addresses the hook sees\n", strerror(errno));
            fflush(stderr);
            close(ct_fd);
            ct_fd = -1;
        }
        if (ct_fd >= 0 && (wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) >= 0 &&
            pthread_create(&worker, NULL, work, NULL) == 0) {
            __atomic_store_n(&running, 1, __ATOMIC_RELEASE);
        } else {
            e = errno, rc = -1;
            if (wake_fd >= 0)
                close(wake_fd);
            if (ct_fd >= 0)
                close(ct_fd);
            wake_fd = ct_fd = -1;
        }
    }
    pthread_mutex_unlock(&life);
    errno = e;
    return rc;
}

void nicd_ct_stop(void)
{
    pthread_mutex_lock(&life);
    if (__atomic_load_n(&running, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        if (write(wake_fd, &one, sizeof one) < 0)
            one = 0; /* the poll's timeout wakes it anyway */
        pthread_join(worker, NULL);
        __atomic_store_n(&running, 0, __ATOMIC_RELEASE);
        close(wake_fd);
        close(ct_fd);
        wake_fd = ct_fd = -1;
    }
    pthread_mutex_unlock(&life);
}

int nicd_ct_ask(const struct nicd_flow_key *k, uint32_t isn)
{
    if (!__atomic_load_n(&running, __ATOMIC_ACQUIRE)) { /* no conntrack to ask: as the hook sees them */
        struct nicd_flow_view v = hook_view(k);
        nicd_flows_set_view(k, isn, &v);
        __atomic_fetch_add(&answered, 1, __ATOMIC_RELEASE);
        return 0;
    }
    struct request r = {.key = *k, .isn = isn};
    if (push(&r) < 0)
        return -1;
    if (__atomic_exchange_n(&sleeping, 0, __ATOMIC_SEQ_CST)) {
        uint64_t one = 1;
        if (write(wake_fd, &one, sizeof one) < 0) /* never blocks (EFD_NONBLOCK) */
            one = 0;
    }
    return 0;
}

uint64_t nicd_ct_answered(void)
{
    return __atomic_load_n(&answered, __ATOMIC_ACQUIRE);
}

uint64_t nicd_ct_questions(void)
{
    return __atomic_load_n(&questions, __ATOMIC_RELAXED);
}

void nicd_ct_test_hold(int on)
{
    __atomic_store_n(&held, on, __ATOMIC_RELEASE);
}
