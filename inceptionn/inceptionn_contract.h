/* The facts every part shares, defined once: the tagging contract between a program, the tagging
 * shim and the soft NIC (the marks, ToS bytes, on the wire, the comments on the soft NIC's
 * netfilter rules and its default queue numbers), the INCEPTIONN codec's error-bound range and
 * default, the per-block scaling's headroom range, and the soft NIC's stats socket. The C code includes this header; Python reads the same
 * values through the cffi binding (inceptionn.shim.contract; inceptionn.limits for the bound), so
 * the two cannot disagree. docs/wire-format.md says what each mark means on the wire; the
 * daemon's config can move them, these are the defaults. */
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

/* Error-bound exponents k of the INCEPTIONN codec (the bound is 2^k), and the default of every
 * entry point that takes one (nicd, the MPI library, training jobs, benchmarks, the codec). */
#define INCEPTIONN_ERROR_BOUND_MIN (-30)
#define INCEPTIONN_ERROR_BOUND_MAX (-1)
#define INCEPTIONN_DEFAULT_ERROR_BOUND (-10)

/* The largest headroom of the per-block scaling (bits of precision a scaled block gives up; 0 is
 * the most precise and the default; codecs_c/blockscale_codec.h's BS_MAX_HEADROOM). */
#define INCEPTIONN_MAX_HEADROOM 24

/* The soft NIC's stats socket (nicd --socket, and where its clients look: inceptionn stats, the
 * MPI library in nic mode). */
#define INCEPTIONN_NICD_SOCKET "/run/inceptionn/nicd.sock"

#endif
