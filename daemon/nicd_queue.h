/*
 * The soft NIC's NFQUEUE loop: one call runs one egress queue (compress + handshake) and one
 * ingress queue (restore + handshake) on one netlink socket until cfg->stop is set. Python runs
 * one such call per thread; each thread has its own counters, which Python sums.
 */
#ifndef NICD_QUEUE_H
#define NICD_QUEUE_H

#include <stddef.h>
#include <stdint.h>

/* Counters, in this order; daemon/datapath.py names them. */
enum nicd_counter {
    NICD_C_EGRESS_PACKETS,    /* tagged or handshake packets seen on egress */
    NICD_C_EGRESS_COMPRESSED, /* sent compressed */
    NICD_C_EGRESS_ORIG_BYTES, /* payload bytes of the packets sent compressed, before */
    NICD_C_EGRESS_WIRE_BYTES, /* ... and after compression (shim header included) */
    NICD_C_EGRESS_RAW_NOT_NEGOTIATED, /* tagged data of a flow without both soft NICs: raw */
    NICD_C_EGRESS_RAW_NOT_SMALLER,    /* compressed form not smaller: raw */
    NICD_C_EGRESS_RAW_SHORT,          /* no whole float in the payload (or none at all): raw */
    NICD_C_EGRESS_RAW_BYTES,          /* payload bytes of tagged packets sent raw */
    NICD_C_HELLO_SENT,        /* our SYN / SYN-ACK left with the hello option */
    NICD_C_HELLO_RECEIVED,    /* a peer's SYN / SYN-ACK arrived with it (option removed) */
    NICD_C_FLOWS_NEGOTIATED,  /* initiator: a matching answer; answerer: the first compressed
                                 packet of a flow it answered */
    NICD_C_FLOW_TABLE_FULL,
    NICD_C_HELLO_NO_ROOM,     /* no 16 bytes left in the TCP header (or a SYN with data): raw */
    NICD_C_HELLO_WITHOUT_OPTION, /* handshake marked tos_hello without our option (a reflected
                                    or AF12 mark, not a soft NIC): passed untouched, raw */
    NICD_C_HELLO_MISMATCH,    /* the peer's soft NIC has other settings: raw */
    NICD_C_HELLO_UNMATCHED,   /* an answer to no hello of ours (wrong nonce, ack != ISN+1,
                                 unknown or already answered flow): raw */
    NICD_C_HELLO_EVICTED,     /* a half-open hello pushed out of the full hello table */
    NICD_C_INGRESS_PACKETS,
    NICD_C_INGRESS_RESTORED,
    NICD_C_INGRESS_WIRE_BYTES,
    NICD_C_INGRESS_ORIG_BYTES,
    NICD_C_DROP_MALFORMED,    /* not parseable as IPv4/TCP although marked compressed */
    NICD_C_DROP_CHECKSUM,
    NICD_C_DROP_HEADER,
    NICD_C_DROP_CRC,
    NICD_C_DROP_DECODE,
    NICD_C_DROP_TOO_BIG,
    NICD_C_VERDICT_ERRORS,
    NICD_C_RECV_ENOBUFS,      /* the kernel dropped queue messages we could not read in time */
    NICD_C_TIER0, NICD_C_TIER8, NICD_C_TIER16, NICD_C_TIER32,
    NICD_C_GSO_SUPER_PACKETS, /* gso: super-packets (over the MTU) sent as compressed packets;
                                 those packets count in egress_compressed */
    NICD_C_GSO_SEND_ERRORS,   /* gso: compressed packets the raw socket did not take, or the
                                 qdisc dropped (lost: TCP retransmits them) */
    NICD_C_INGRESS_MARKS_REWRITTEN, /* compressed packets that arrived without the compressed
                                       mark (the network rewrote the DSCP): restored all the same */
    NICD_C_FLOWS_MARKS_REWRITTEN,   /* negotiated flows seen so (each counted once) */
    NICD_C_CONFIRM_FAILED,    /* answered hellos given up after compressed packets that did not
                                 confirm them (wrong echo or ack: guessed, not the peer's) */
    NICD_C_FLOWS_FELL_BACK,   /* negotiated flows whose compressed packets did not get through
                                 (the same range sent NICD_RETX_LIMIT times): raw from then on */
    NICD_C_EGRESS_RAW_FELL_BACK, /* tagged data of those flows, sent raw */
    NICD_NCOUNTERS
};

struct nicd_config {
    uint16_t egress_queue, ingress_queue;
    uint8_t tos_tagged;     /* the application's mark, 0x28 */
    uint8_t tos_compressed; /* on the wire: compressed payload */
    uint8_t tos_hello;      /* on handshake packets: "soft NIC here" */
    uint8_t tos_scaled;     /* the application's mark for raw gradients (codec 2), 0x24 */
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
