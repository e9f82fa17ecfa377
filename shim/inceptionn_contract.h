/* The tagging contract between a program, the tagging shim and the soft NIC, defined once: the
 * marks (ToS bytes) on the wire, the comments on the soft NIC's netfilter rules and its default
 * queue numbers. The C code includes this header; Python reads the same values through the cffi
 * binding (inceptionn.shim.contract), so the two cannot disagree. docs/wire-format.md says what
 * each mark means on the wire; the daemon's config can move them, these are the defaults. */
#ifndef INCEPTIONN_CONTRACT_H
#define INCEPTIONN_CONTRACT_H

/* DSCP 10: the packets of a gradient socket whose sender puts its values into the codec's range
 * itself and may predict the receiver's decode bit for bit (the paper's mode; our collective). */
#define INCEPTIONN_TOS_TAGGED 0x28
/* DSCP 9: the packets of a gradient socket that carries raw float32 gradients: the soft NIC scales
 * each packet by a power of two of its own (codec 2). The shim's default mark. */
#define INCEPTIONN_TOS_SCALED 0x24
/* DSCP 11 on the wire: the payload is compressed (only the peer's soft NIC may read it). */
#define INCEPTIONN_TOS_COMPRESSED 0x2c
/* DSCP 12 on SYN / SYN-ACK: "soft NIC here", the handshake of the negotiation. */
#define INCEPTIONN_TOS_HELLO 0x30

/* Every queue rule of a daemon instance carries RULE_COMMENT "-<queue base>"; the persistent
 * drops of compressed packets carry FAILCLOSED_COMMENT. Both without spaces, so that
 * `iptables -S` prints them unquoted. */
#define INCEPTIONN_RULE_COMMENT "inceptionn-nicd"
#define INCEPTIONN_FAILCLOSED_COMMENT "inceptionn-failclosed"

/* The first NFQUEUE number: egress queues from here, ingress queues after them. */
#define INCEPTIONN_QUEUE_BASE 7100

#endif
