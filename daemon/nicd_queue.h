/*
 * The soft NIC's NFQUEUE loop: one call runs one egress queue (compress + handshake) and one
 * ingress queue (restore + handshake) on one netlink socket until cfg->stop is set. Python runs
 * one such call per thread; each thread has its own counters, which Python sums.
 */
#ifndef NICD_QUEUE_H
#define NICD_QUEUE_H

#include <stddef.h>
#include <stdint.h>

/* The counters, in this order: one list gives the enum (NICD_C_<NAME>) and the names Python
 * Python reads through nicd_counter_name() ("EGRESS_PACKETS", shown as egress_packets), so a
 * counter is added here and nowhere else. */
#define NICD_COUNTERS(X)                                                                         \
    X(EGRESS_PACKETS)    /* tagged or handshake packets seen on egress */                        \
    X(EGRESS_COMPRESSED) /* sent compressed */                                                   \
    X(EGRESS_ORIG_BYTES) /* payload bytes of the packets sent compressed, before */              \
    X(EGRESS_WIRE_BYTES) /* ... and after compression (shim header included) */                  \
    X(EGRESS_RAW_NOT_NEGOTIATED) /* tagged data of a flow without both soft NICs: raw */         \
    X(EGRESS_RAW_NOT_SMALLER)    /* compressed form not smaller: raw */                          \
    X(EGRESS_RAW_SHORT)          /* no whole float in the payload (or none at all): raw */       \
    X(EGRESS_RAW_BYTES)          /* payload bytes of tagged packets sent raw */                  \
    X(HELLO_SENT)        /* our SYN / SYN-ACK left with the hello option */                      \
    X(HELLO_RECEIVED)    /* a peer's SYN / SYN-ACK arrived with it (option removed) */           \
    X(FLOWS_NEGOTIATED)  /* initiator: a matching answer; answerer: the first compressed         \
                            packet of a flow it answered */                                      \
    X(FLOW_TABLE_FULL)                                                                           \
    X(HELLO_NO_ROOM)     /* no 16 bytes left in the TCP header (or a SYN with data): raw */      \
    X(HELLO_WITHOUT_OPTION) /* handshake marked tos_hello without our option (a reflected        \
                               or AF12 mark, not a soft NIC): passed untouched, raw */           \
    X(HELLO_MISMATCH)    /* the peer's soft NIC has other settings: raw */                       \
    X(HELLO_UNMATCHED)   /* an answer to no hello of ours (wrong nonce, ack != ISN+1,            \
                            unknown or already answered flow): raw */                            \
    X(HELLO_EVICTED)     /* a half-open hello pushed out of the full hello table */              \
    X(INGRESS_PACKETS)                                                                           \
    X(INGRESS_RESTORED)                                                                          \
    X(INGRESS_WIRE_BYTES)                                                                        \
    X(INGRESS_ORIG_BYTES)                                                                        \
    X(DROP_MALFORMED)    /* not parseable as IPv4/TCP although marked compressed */              \
    X(DROP_CHECKSUM)                                                                             \
    X(DROP_HEADER)                                                                               \
    X(DROP_CRC)                                                                                  \
    X(DROP_DECODE)                                                                               \
    X(DROP_TOO_BIG)                                                                              \
    X(VERDICT_ERRORS)                                                                            \
    X(RECV_ENOBUFS)      /* the kernel dropped queue messages we could not read in time */       \
    X(TIER0) X(TIER8) X(TIER16) X(TIER32)                                                        \
    X(GSO_SUPER_PACKETS) /* gso: super-packets (over the MTU) sent as compressed packets;        \
                            those packets count in egress_compressed */                          \
    X(GSO_SEND_ERRORS)   /* gso: compressed packets the raw socket did not take (lost:           \
                            TCP retransmits them) */

#define NICD_C_ENUM_(name) NICD_C_##name,
enum nicd_counter { NICD_COUNTERS(NICD_C_ENUM_) NICD_NCOUNTERS };

/* The counter's name without NICD_C_ ("EGRESS_PACKETS"), NULL past the last. */
static inline const char *nicd_counter_name(unsigned i)
{
#define NICD_C_NAME_(name) #name,
    static const char *const names[] = {NICD_COUNTERS(NICD_C_NAME_)};
#undef NICD_C_NAME_
    return i < NICD_NCOUNTERS ? names[i] : NULL;
}

struct nicd_config {
    uint16_t egress_queue, ingress_queue;
    uint8_t tos_tagged;     /* the application's mark, 0x28 */
    uint8_t tos_compressed; /* on the wire: compressed payload */
    uint8_t tos_hello;      /* on handshake packets: "soft NIC here" */
    int error_bound;        /* read per packet: Python may change it on reload */
    uint32_t queue_maxlen;
    int accept_only;        /* diagnostic: accept every queued packet unchanged (queue cost) */
    int gso;                /* egress queue takes GSO super-packets; see nicd_compress_gso */
    volatile int stop;      /* set to 1 to make nicd_run return */
    volatile int ready;     /* set by nicd_run once both queues are bound */
};

struct nicd_stats {
    volatile uint64_t c[NICD_NCOUNTERS];
};

/* Runs until cfg->stop. Returns 0, or -1 with a message in err. */
int nicd_run(struct nicd_config *cfg, struct nicd_stats *st, char *err, size_t errlen);

#endif
