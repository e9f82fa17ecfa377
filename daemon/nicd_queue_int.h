/* The queue threads' private parts, shared by the files of the data path (not an interface):
 *   nicd_queue.c      the loop: queue receive, callbacks, verdict batching, setup
 *   nicd_egress.c     egress: a queued outgoing packet, compressed or left raw; a flow's give-up
 *   nicd_ingress.c    ingress: a queued compressed packet restored, or dropped
 *   nicd_handshake.c  the hello option on SYN and SYN-ACK, negotiation and its confirmation
 *   nicd_gso.c        a super-packet cut into compressed packets and sent by the raw socket
 * The kernel lookups they use run elsewhere: the path MTU (nicd_pmtu.c) and conntrack's view of
 * a flow before NAT (nicd_conntrack.c). */
#ifndef NICD_QUEUE_INT_H
#define NICD_QUEUE_INT_H

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <stdio.h>
#include <string.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "inceptionn_codec.h"
#include "nicd_flows.h"
#include "nicd_packet.h"
#include "nicd_queue.h"

/* Nothing here leaves the library. */
#pragma GCC visibility push(hidden)

/* Verdicts are batched: up to BATCH verdict messages (or BATCH_BYTES of rewritten packets) go
 * to the kernel in one sendmsg, flushed whenever the socket has nothing more to read, so an idle
 * queue adds no latency. Each pending verdict owns one output slot until the flush. */
#define BATCH 32
#define BATCH_BYTES (192 * 1024)
/* Receive offload (nicd_can_append): at most this many restored packets join the one before them;
 * the verdict messages a batch may reach with the open packet's and theirs. */
#define MERGE_MAX 48
#define VERDICTS_MAX (BATCH + MERGE_MAX + 2)
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
static inline uint64_t prof_now(void)
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
    int nout;          /* ... the output slots they use */
    size_t bytes;      /* ... and their size */
    struct verdict_msg msg[VERDICTS_MAX];
    struct iovec iov[VERDICTS_MAX * 3];
    int niov;
    float scratch[16384 + 16];
    uint8_t out[BATCH + 1][NICD_MAX_PACKET + 64];
    /* Receive offload: a restored packet that later ones of its flow may join (nicd_can_append)
     * waits in out[nout], its verdict not yet queued: its id, length and queue, and the ids of the
     * packets it took in (dropped when it is queued, right after it). merging: one is open. */
    int merging, nmerged;
    uint32_t open_id;
    size_t open_len;
    uint16_t open_queue;
    uint32_t merged[MERGE_MAX];
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
static inline void count_tiers(struct ctx *cx, const uint64_t tiers[4])
{
    COUNT(cx, TIER0, tiers[0]);
    COUNT(cx, TIER8, tiers[1]);
    COUNT(cx, TIER16, tiers[2]);
    COUNT(cx, TIER32, tiers[3]);
}

static inline int dscp_is(uint8_t tos, uint8_t mark)
{
    return (tos & 0xFC) == (mark & 0xFC);
}

/* The codec a tagged packet's mark asks for (docs/wire-format.md, "Marks"): the paper's for
 * tos_tagged, the per-packet scaled one for tos_scaled; 0 if it carries neither mark. */
static inline int codec_of_mark(const struct ctx *cx, uint8_t tos)
{
    if (dscp_is(tos, cx->cfg->tos_tagged))
        return NICD_CODEC_INCEPTIONN;
    if (dscp_is(tos, cx->cfg->tos_scaled))
        return NICD_CODEC_SCALED;
    return 0;
}

/* The output slot a callback may rewrite the current packet into: the next free one, past an open
 * packet of the receive offload (which verdict() queues first, so the slot is then the next). */
#define OUT(cx) ((cx)->out[(cx)->nout + (cx)->merging])

static inline void key_of(const struct nicd_pkt *p, struct nicd_flow_key *k, int reverse)
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

/* What the route lookup of the raw socket's packets gets from the original: the interface it
 * was leaving by, its mark, its protocol and its ToS. */
struct route_ctx {
    uint32_t ifindex, mark;
    uint8_t tos;
    struct nicd_flow_view view; /* the addresses before NAT */
};

/* nicd_queue.c: queue a packet's verdict (buf, if given, is the rewritten packet and must be
 * OUT(cx)); send the pending ones; the queued packet's id and bytes. */
void verdict(uint32_t id, uint32_t v, const uint8_t *buf, size_t len, struct ctx *cx);
void flush(struct ctx *cx);
/* Queue the open packet of the receive offload, then drops for the packets it took in. */
void close_merge(struct ctx *cx);
int fetch(struct nfq_data *nfa, uint32_t *id, unsigned char **buf);

/* nicd_egress.c, nicd_ingress.c: one queued packet each. */
void egress(struct nfq_data *nfa, struct ctx *cx);
void ingress(struct nfq_data *nfa, struct ctx *cx);

/* nicd_handshake.c */
void egress_syn(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                const struct nicd_flow_key *k, struct ctx *cx);
void egress_synack(uint32_t id, struct nfq_data *nfa, const struct nicd_pkt *p,
                   const struct nicd_flow_key *k, struct ctx *cx);
void ingress_hello(uint32_t id, const struct nicd_pkt *p,
                   const struct nicd_flow_key *k, uint8_t syn, struct ctx *cx);
void confirm_answered(const struct nicd_pkt *p, const struct nicd_flow_key *k, struct ctx *cx);

/* nicd_gso.c */
size_t egress_mtu(const struct ctx *cx, uint32_t ifindex, const struct nicd_pkt *p, int fresh);
void egress_gso(uint32_t id, const struct nicd_pkt *p, uint32_t isn,
                size_t mtu, size_t mss_len, const struct route_ctx *rc, struct ctx *cx);
int send_one(struct ctx *cx, uint8_t *buf, size_t len, const struct nicd_pkt *p, const struct route_ctx *rc);
int egress_train(uint32_t id, const struct nicd_pkt *p, uint32_t isn, size_t gso_size, struct ctx *cx);

#pragma GCC visibility pop

#endif
