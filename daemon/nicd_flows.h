/*
 * Per-flow state of the soft NIC, shared by the queue threads: negotiated flows are found and
 * updated without a lock shared between flows (nicd_flows.c says how); hellos (handshakes only)
 * under one mutex, but for the lookup of a key that has none (nicd_hello_get: lock-free, as the
 * data path asks it for compressed packets of flows it does not know). nicd_flows_init and _free
 * run with no other thread in the tables.
 * A flow is keyed by its egress direction as this host sends it.
 *
 * Two tables, both indexed by SipHash-2-4 with a random key drawn at init (an attacker who
 * picks addresses and ports cannot make keys collide):
 * - negotiated flows: only a verified handshake puts a flow here (an answered hello with our
 *   nonce, or the first compressed packet of a flow we answered); nothing a peer sends alone
 *   replaces or removes an entry. Bounded (flow_capacity); full means new flows stay raw. Each
 *   flow is charged to an owner (nicd_flows_owner_*), who may hold at most owner_cap of them, so
 *   one local user (or one remote host) cannot fill the table and keep everyone else raw.
 *   An entry ends at our own RST, some idle seconds after our own FIN (NICD_FIN_LINGER_S), or
 *   after the idle timeout.
 * - hellos: handshakes in flight, a small set-associative table. A full set shares its ways
 *   fairly between parties: each local user (the owner of our SYN's hello) and the network (every
 *   hello a peer's SYN created, whose owners cost nothing to spoof, as one party); a new hello
 *   evicts the oldest of the party that holds the most ways, which is its own when it holds as
 *   many as any other, and within the network the same rule picks among the hellos of one peer to
 *   one port of ours (nicd_flows.c, hello_victim). So one user's flood of SYNs pushes out only its
 *   own hellos, a flood aimed at one port leaves the other ports' handshakes alone, and a flood of
 *   spoofed SYNs costs half-open hellos (counted), never a negotiated flow nor more than an even
 *   share of a set.
 */
#ifndef NICD_FLOWS_H
#define NICD_FLOWS_H

#include <stddef.h>
#include <stdint.h>

#include "nicd_packet.h"

/* IPv4 keys hash and compare their 12 bytes of addresses and ports only, as before IPv6. */
struct nicd_flow_key {
    uint32_t saddr, daddr; /* IPv4, network order, as in the header (0 for IPv6) */
    uint16_t sport, dport; /* host order */
    uint8_t v6;            /* 1: IPv6, addresses in saddr6/daddr6 */
    uint8_t saddr6[16], daddr6[16];
};

/* The flow's packets as conntrack saw them on their way out, before any NAT rewrote them
 * (nicd_conntrack.h: asked off the packet threads once the flow is negotiated): what the packets
 * the raw socket sends must look like to be NATed as the connection's own. Addresses and ports
 * in network order. */
struct nicd_flow_view {
    uint8_t known;     /* 0: no answer yet (nothing may leave by the raw socket); 1: as the hook
                          sees them; 2: these addresses */
    uint32_t saddr, daddr;
    uint16_t sport, dport;
    uint8_t v6;        /* 1: IPv6, addresses in saddr6/daddr6 */
    uint8_t saddr6[16], daddr6[16];
};

enum nicd_hello_state {
    NICD_HELLO_NONE = 0,
    NICD_HELLO_SENT,     /* we sent a tagged SYN with the hello option; awaiting the answer */
    NICD_HELLO_PEER,     /* the peer's SYN carried the option; our SYN-ACK not sent yet */
    NICD_HELLO_ANSWERED, /* our SYN-ACK answered it; awaiting the peer's first compressed packet */
};

struct nicd_hello {
    uint8_t state;
    uint8_t agree;    /* the peer's settings equal ours (PEER, ANSWERED) */
    uint32_t isn;     /* our ISN (SENT, ANSWERED) */
    uint32_t peer_isn; /* the peer's ISN (PEER, ANSWERED) */
    uint8_t tries;     /* ANSWERED: compressed packets that failed to confirm it */
    uint16_t peer_mss; /* the MSS option of the peer's SYN (PEER, ANSWERED) */
    uint16_t own_mss;  /* the MSS option of our SYN or SYN-ACK (SENT, ANSWERED) */
    uint8_t peer_trains; /* its hello said it restores v3 segment trains (PEER, ANSWERED) */
    uint8_t nonce[NICD_NONCE_LEN];
    uint64_t owner;    /* who the flow is charged to once negotiated (nicd_flows_owner_*) */
};

/* Owners. The kernel names the local user of our SYN's socket (NFQA_UID): the initiator's flows
 * are that user's. The answerer's SYN-ACK comes from a request socket, which carries no user, so
 * a flow the peer opened (or one whose SYN came without a user) is charged to the peer's address
 * (IPv6: its /64, which one host usually holds whole), hashed under the table's secret key. */
#define NICD_OWNER_UID(uid) ((1ull << 32) | (uint32_t)(uid))
uint64_t nicd_flows_owner_of_peer(const struct nicd_flow_key *k); /* k: our egress direction */

/* Returns 0, or -1 when out of memory. capacity is rounded up to a power of two; the hello
 * table gets capacity/16 entries (256 to 16384). owner_cap: negotiated flows one owner may
 * hold at once. */
int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s, uint32_t owner_cap);
void nicd_flows_free(void);

/* Record a negotiated flow, our ISN, the peer's and the flow's MSS (the smaller of the two
 * handshake MSS options, the clamp TCP itself applies: nicd_handshake.c, flow_mss), charged to
 * owner, replacing an older entry of the key. Its view is unknown (0) until nicd_flows_set_view.
 * Returns 0, NICD_FLOWS_FULL when the table is full, or NICD_FLOWS_OWNER_FULL when the owner
 * already holds owner_cap flows (the flow then simply stays raw). */
#define NICD_FLOWS_FULL (-1)
#define NICD_FLOWS_OWNER_FULL (-2)
int nicd_flows_negotiate(const struct nicd_flow_key *k, uint32_t isn, uint32_t peer_isn, uint16_t mss,
                         uint64_t owner);

/* Store the view conntrack gave for flow k if k is still the connection of our ISN isn (not
 * replaced by a newer one on the 4-tuple). Returns 1 if stored. */
int nicd_flows_set_view(const struct nicd_flow_key *k, uint32_t isn, const struct nicd_flow_view *v);

/* Send flow k v3 segment trains (docs/wire-format.md, "Segment trains"): its peer's hello said it
 * restores them and we run gso and trains. Stored if k is still the connection of our ISN isn.
 * Returns 1 if stored. */
int nicd_flows_set_trains(const struct nicd_flow_key *k, uint32_t isn);

/* How often a flow whose view is still unknown asks for it again (the request queue was full). */
#define NICD_VIEW_RETRY_S 1

/* Our own stack ends flow k. The entry serves only our direction (the peer restores its packets
 * without any state of ours, and compresses its own direction from its own table), so only our
 * packets decide:
 * - rst: our RST left. Our socket is gone; nothing of this connection leaves after it (a new one
 *   on the 4-tuple starts with a SYN, which forgets anyway). The entry is removed now, and so is
 *   a peer's hello our SYN-ACK has not answered (our stack refused that SYN: a closed port).
 * - else our FIN left. Our data and the FIN itself may still be retransmitted until the peer
 *   acknowledges them, so the entry stays, but now expires after NICD_FIN_LINGER_S idle seconds
 *   instead of the idle timeout; each retransmission refreshes it. One later than that leaves raw,
 *   which is always valid (raw tagged packets are never restored).
 * The peer's FIN or RST is not queued and would not be trusted: nothing a peer sends alone removes
 * an entry. Returns 1 if this call removed the flow (rst) or started its linger (FIN), else 0. */
#define NICD_FIN_LINGER_S 10
int nicd_flows_close(const struct nicd_flow_key *k, int rst);

/* A negotiated flow gives up compressing (NICD_FLOW_GIVE_UP) when its compressed packets do not
 * get through, seen as TCP sending the same data again: the same range sent NICD_RETX_LIMIT
 * times over NICD_RETX_SECONDS (a middlebox that drops the ACKs or the packets every time; a
 * receiving daemon back within half that time finds the flow still compressed: TCP's next resend
 * comes before the mark), or more than half of the
 * data retransmitted once NICD_RETX_BYTES were (one that drops most of them: TCP's one-MSS
 * retransmissions get through, in place, and the flow only crawls). Random loss retransmits a
 * few percent. A flow that sends v3 trains gives up only its trains on the second sign
 * (trains_gave_up; its one-MSS resends, v2, got through, as across a network that rewrites DSCP)
 * and is watched on in format v2; on the first, the path passes nothing compressed: raw. */
#define NICD_RETX_LIMIT 4
#define NICD_RETX_SECONDS 10
#define NICD_RETX_BYTES (128u * 1024)

enum nicd_flow_state {
    NICD_FLOW_NONE = 0, /* not negotiated (or idle past the timeout): raw */
    NICD_FLOW_COMPRESS, /* negotiated: compress */
    NICD_FLOW_RAW,      /* negotiated, but its compressed packets did not get through: raw */
    NICD_FLOW_GIVE_UP,  /* this very range makes it RAW (returned once per flow) */
};

struct nicd_flow_info {
    uint32_t isn;       /* our ISN */
    uint32_t peer_isn;  /* the peer's ISN (its low bits are the echo our packets carry) */
    uint16_t mss;       /* the smaller of the two handshake MSS options */
    uint32_t high;      /* GIVE_UP: the end of the furthest range sent, */
    uint8_t high_byte;  /* and the original byte just before it, */
    uint8_t high_fin;   /* and whether a FIN followed it */
    uint8_t ask_view;   /* the view is unknown and was last asked NICD_VIEW_RETRY_S ago: ask again */
    struct nicd_flow_view view;
    uint8_t send_trains; /* send its super-packets as v3 trains (the peer restores them, we run gso
                          * and trains, and they have not been given up) */
    uint8_t trains_gave_up; /* this very range ends the flow's trains: v2 from here (once per flow) */
};

/* A tagged range [seq, seq + len) of flow k is about to leave; last is its last byte, fin whether
 * the segment carries a FIN. Returns the
 * flow's state and fills *fi. Refreshes the flow's clock and watches its retransmissions (a range
 * that ends no further than what was sent before) for the give-up above. */
enum nicd_flow_state nicd_flows_egress(const struct nicd_flow_key *k, uint32_t seq, uint32_t len, uint8_t last,
                                       int fin, struct nicd_flow_info *fi);

/* 1 if flow k is negotiated (a lookup, as the data path's). */
int nicd_flows_known(const struct nicd_flow_key *k);

/* Note that a compressed packet of the negotiated flow k arrived without the compressed mark;
 * returns 1 the first time for the flow (0 after, or if k is not negotiated). */
int nicd_flows_note_rewritten(const struct nicd_flow_key *k);

/* Forget a negotiated flow: our own stack opens or accepts this 4-tuple anew. */
void nicd_flows_forget(const struct nicd_flow_key *k);

/* The nonce of our hello for (k, isn): a keyed hash, so SYN retransmissions carry the same one
 * and nobody without the key can predict it. */
void nicd_flows_nonce(const struct nicd_flow_key *k, uint32_t isn, uint8_t nonce[NICD_NONCE_LEN]);

/* Create or replace the key's hello (h->owner set: the party it counts for, see the top). Returns
 * 0, 1 if another hello was evicted to make room, or NICD_HELLO_EVICTED_OWN if one of h's own
 * group was (the same local user's, or the same peer's to the same port of ours). */
#define NICD_HELLO_EVICTED_OWN 2
int nicd_hello_put(const struct nicd_flow_key *k, const struct nicd_hello *h);

/* Copy the key's hello to *h; returns 0 (and h->state NONE) if there is none. */
int nicd_hello_get(const struct nicd_flow_key *k, struct nicd_hello *h);

/* Remove the key's hello if it is still in `state` with our ISN `isn`; returns 1 if it was
 * (of two threads acting on the same hello, exactly one gets 1). */
int nicd_hello_take(const struct nicd_flow_key *k, enum nicd_hello_state state, uint32_t isn);

/* A compressed packet failed to confirm the key's ANSWERED hello (of our ISN isn): count it, and
 * remove the hello at the max_tries-th failure. Returns 1 if this call removed it. */
int nicd_hello_fail(const struct nicd_flow_key *k, uint32_t isn, unsigned max_tries);

/* Hellos in the table now (a racy read: a hint that lets the hot path skip the lock). */
uint32_t nicd_hello_count(void);

/* Drop flows and hellos idle past their timeouts (a closing flow's: NICD_FIN_LINGER_S); returns
 * how many flows. Active (negotiated) flows in *active, hellos in flight in *hellos (either may be
 * NULL). */
uint32_t nicd_flows_expire(uint32_t *active, uint32_t *hellos);

/* For the unit test (tests/test_nicd_flows.py) only: SipHash-2-4 itself; set the keys (once the
 * table is empty: entries already in it stay where the old key put them); move the tables'
 * clock ahead; the slot a negotiated flow sits in (-1: none); the flows an owner holds. */
uint64_t nicd_flows_test_siphash(const uint8_t key[16], const uint8_t *in, size_t len);
void nicd_flows_test_keys(const uint8_t table[16], const uint8_t nonce[16]);
void nicd_flows_test_advance(uint32_t ms);
int64_t nicd_flows_test_slot(const struct nicd_flow_key *k);
uint32_t nicd_flows_test_owned(uint64_t owner);

#endif
