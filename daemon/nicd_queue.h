/*
 * The soft NIC's NFQUEUE loop: one call runs one egress queue (compress + handshake) and one
 * ingress queue (restore + handshake) on one netlink socket until cfg->stop is set. Python runs
 * one such call per thread; each thread has its own counters, which Python sums.
 */
#ifndef NICD_QUEUE_H
#define NICD_QUEUE_H

#include <stddef.h>
#include <stdint.h>

/* The counters, in this order: one list gives the enum (NICD_C_<NAME>), the names Python reads
 * through nicd_counter_name() ("EGRESS_PACKETS", shown as egress_packets) and the one-line help
 * (nicd_counter_help(), the HELP of the metrics), so a counter is added here and nowhere else. */
#define NICD_COUNTERS(X)                                                                         \
    X(EGRESS_PACKETS, "tagged or handshake packets seen on egress")                              \
    X(EGRESS_COMPRESSED, "packets sent compressed")                                              \
    X(EGRESS_ORIG_BYTES, "payload bytes of the packets sent compressed, before compression")     \
    X(EGRESS_WIRE_BYTES, "payload bytes of the packets sent compressed, after compression "      \
                         "(shim header included)")                                               \
    X(EGRESS_RAW_NOT_NEGOTIATED, "tagged data packets of flows without both soft NICs, sent raw") \
    X(EGRESS_RAW_NOT_SMALLER, "tagged data packets whose compressed form was not smaller, sent raw") \
    X(EGRESS_RAW_SHORT, "tagged data packets without a whole float, sent raw")                   \
    X(EGRESS_RAW_BYTES, "payload bytes of tagged packets sent raw")                              \
    X(HELLO_SENT, "our SYN or SYN-ACK left with the hello option")                               \
    X(HELLO_RECEIVED, "a peer's SYN or SYN-ACK arrived with the hello option (removed)")         \
    X(FLOWS_NEGOTIATED, "flows negotiated (initiator: a matching answer; answerer: the first "   \
                        "compressed packet of a flow it answered)")                              \
    X(FLOW_TABLE_FULL, "negotiated flows left raw because the flow table was full")              \
    X(FLOW_OWNER_FULL, "negotiated flows left raw because their owner (the local user whose "    \
                       "socket opened them, else the peer host that did) already held "          \
                       "flow_owner_cap flows")                                                   \
    X(FLOWS_CLOSED_RST, "negotiated flows removed when our RST left")                            \
    X(FLOWS_CLOSED_FIN, "negotiated flows whose FIN left (removed after a few idle seconds)")    \
    X(HELLO_NO_ROOM, "handshakes without 16 bytes left in the TCP header (or a SYN with data), " \
                     "left raw")                                                                 \
    X(HELLO_WITHOUT_OPTION, "handshakes with the hello mark but without our option (a reflected " \
                            "or AF12 mark, not a soft NIC), passed untouched")                   \
    X(HELLO_MISMATCH, "peers whose soft NIC has other settings, left raw")                       \
    X(HELLO_UNMATCHED, "answers to no hello of ours (wrong nonce, ack, unknown or already "      \
                       "answered flow), left raw")                                               \
    X(HELLO_EVICTED, "half-open hellos pushed out of the full hello table")                      \
    X(HELLO_EVICTED_OWN, "of those, hellos pushed out by a newer one of their own (the same local " \
                         "user's, or the same peer's to the same port): a flood evicts its own") \
    X(INGRESS_PACKETS, "packets seen on ingress")                                                \
    X(INGRESS_RESTORED, "compressed packets restored (as sent: each segment of a GRO-merged "     \
                        "train counts, so it matches the sender's egress_compressed)")          \
    X(INGRESS_WIRE_BYTES, "payload bytes of the restored packets as they arrived")               \
    X(INGRESS_ORIG_BYTES, "payload bytes of the restored packets after restoring")               \
    X(DROP_MALFORMED, "packets marked compressed but not parseable as IPv4/TCP or IPv6/TCP, dropped") \
    X(DROP_CHECKSUM, "compressed packets whose TCP checksum was not the compressed mark, dropped") \
    X(DROP_HEADER, "compressed packets with a malformed shim header, dropped")                   \
    X(DROP_CRC, "compressed packets whose CRC32C did not match (corrupted in transit), dropped") \
    X(DROP_DECODE, "compressed packets whose group stream did not decode, dropped")              \
    X(DROP_TOO_BIG, "compressed packets that would restore past the largest verdict, dropped")   \
    X(VERDICT_ERRORS, "verdicts the kernel refused")                                             \
    X(RECV_ENOBUFS, "times the kernel dropped queue messages not read in time")                  \
    X(TIER0, "values sent in the 0-bit tier") X(TIER8, "values sent in the 8-bit tier")          \
    X(TIER16, "values sent in the 16-bit tier") X(TIER32, "values sent uncompressed (32 bits)")  \
    X(GSO_SUPER_PACKETS, "gso: super-packets sent as compressed packets (which count in "        \
                         "egress_compressed)")                                                   \
    X(GSO_SEND_ERRORS, "gso: compressed packets the raw socket did not take or the qdisc "       \
                       "dropped (lost: TCP retransmits them)")                                   \
    X(INGRESS_MARKS_REWRITTEN, "compressed packets that arrived without the compressed mark (the " \
                               "network rewrote the DSCP), restored all the same")               \
    X(FLOWS_MARKS_REWRITTEN, "negotiated flows whose compressed packets arrived with a rewritten " \
                             "DSCP (each counted once)")                                         \
    X(CONFIRM_FAILED, "answered hellos given up after compressed packets that did not confirm "  \
                      "them (wrong echo or ack: guessed, not the peer's)")                       \
    X(FLOWS_FELL_BACK, "negotiated flows whose compressed packets did not get through, raw "     \
                       "from then on")                                                           \
    X(EGRESS_RAW_FELL_BACK, "tagged data packets of those flows, sent raw")                      \
    X(EGRESS_RAW_EXT_HEADER, "tagged IPv6 packets with an extension header before TCP, sent raw " \
                             "(never transformed)")                                              \
    X(DROP_EXT_HEADER, "IPv6 packets marked compressed with an extension header before TCP "     \
                       "(no soft NIC sends one), dropped")                                       \
    X(EGRESS_RAW_VIEW_PENDING, "gso: tagged super-packets of negotiated flows sent raw because "  \
                               "conntrack had not yet said how NAT sees the flow")                \
    X(INGRESS_MERGED, "restored packets handed to TCP inside the one before them (receive "       \
                      "offload: one packet per run of a flow's restored packets in a batch)")   \
    X(EGRESS_TRAINS, "v3: super-packets sent compressed as one segment train in their verdict "  \
                     "(their segments count in egress_compressed)")                              \
    X(INGRESS_TRAIN_SEGMENTS, "v3: train segments restored (one per segment, however many "      \
                              "GRO merged into one packet)")                                     \
    X(DROP_TRAIN_TAIL, "v3: payload bytes left off a merged train after a segment that did not " \
                       "restore or continue it (TCP retransmits them)")                        \
    X(FLOWS_TRAINS_GAVE_UP, "v3: flows whose trains did not get through (a network that rewrites " \
                            "DSCP, a stack without nicd), compressed in format v2 from then on")  \
    X(INGRESS_TRAINS, "v3: packets restored from trains (a train or a GRO-merged run of its "      \
                      "segments counts once; each segment counts in ingress_restored)")

#define NICD_C_ENUM_(name, help) NICD_C_##name,
enum nicd_counter { NICD_COUNTERS(NICD_C_ENUM_) NICD_NCOUNTERS };

/* The counter's name without NICD_C_ ("EGRESS_PACKETS"), NULL past the last. */
static inline const char *nicd_counter_name(unsigned i)
{
#define NICD_C_NAME_(name, help) #name,
    static const char *const names[] = {NICD_COUNTERS(NICD_C_NAME_)};
#undef NICD_C_NAME_
    return i < NICD_NCOUNTERS ? names[i] : NULL;
}

/* Its one-line help, NULL past the last. */
static inline const char *nicd_counter_help(unsigned i)
{
#define NICD_C_HELP_(name, help) help,
    static const char *const helps[] = {NICD_COUNTERS(NICD_C_HELP_)};
#undef NICD_C_HELP_
    return i < NICD_NCOUNTERS ? helps[i] : NULL;
}

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
    int trains;             /* wire format v3: say so in the hello, restore trains with the
                               ingress queue taking GRO packets whole, and send trains to peers
                               that said so (with gso) */
    volatile int stop;      /* set to 1 to make nicd_run return */
    volatile int ready;     /* set by nicd_run once both queues are bound */
};

struct nicd_stats {
    volatile uint64_t c[NICD_NCOUNTERS];
};

/* Runs until cfg->stop. Returns 0, or -1 with a message in err. */
int nicd_run(struct nicd_config *cfg, struct nicd_stats *st, char *err, size_t errlen);

#endif
