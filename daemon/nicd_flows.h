/*
 * Per-flow state of the soft NIC, shared by the queue threads (one mutex per table).
 * A flow is keyed by its egress direction as this host sends it.
 *
 * Two tables, both indexed by SipHash-2-4 with a random key drawn at init (an attacker who
 * picks addresses and ports cannot make keys collide):
 * - negotiated flows: only a verified handshake puts a flow here (an answered hello with our
 *   nonce, or the first compressed packet of a flow we answered); nothing a peer sends alone
 *   replaces or removes an entry. Bounded (flow_capacity); full means new flows stay raw.
 * - hellos: handshakes in flight, a small set-associative table that evicts the oldest entry
 *   of a full set, preferring those a peer created over our own SYNs, so a flood of spoofed
 *   SYNs costs half-open hellos (counted) and never a negotiated flow.
 */
#ifndef NICD_FLOWS_H
#define NICD_FLOWS_H

#include <stddef.h>
#include <stdint.h>

#include "nicd_packet.h"

struct nicd_flow_key {
    uint32_t saddr, daddr; /* network order, as in the header */
    uint16_t sport, dport; /* host order */
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
    uint8_t nonce[NICD_NONCE_LEN];
};

/* Returns 0, or -1 when out of memory. capacity is rounded up to a power of two; the hello
 * table gets capacity/16 entries (256 to 16384). */
int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s);
void nicd_flows_free(void);

/* Record a negotiated flow and our ISN (replacing an older entry of the key). Returns 0, or -1
 * when the table is full (the flow then simply stays raw). */
int nicd_flows_negotiate(const struct nicd_flow_key *k, uint32_t isn);

/* 1 and *isn if the flow is negotiated (and not idle past the timeout; refreshes its clock). */
int nicd_flows_negotiated(const struct nicd_flow_key *k, uint32_t *isn);

/* Forget a negotiated flow: our own stack opens or accepts this 4-tuple anew. */
void nicd_flows_forget(const struct nicd_flow_key *k);

/* The nonce of our hello for (k, isn): a keyed hash, so SYN retransmissions carry the same one
 * and nobody without the key can predict it. */
void nicd_flows_nonce(const struct nicd_flow_key *k, uint32_t isn, uint8_t nonce[NICD_NONCE_LEN]);

/* Create or replace the key's hello. Returns 1 if another hello was evicted to make room. */
int nicd_hello_put(const struct nicd_flow_key *k, const struct nicd_hello *h);

/* Copy the key's hello to *h; returns 0 (and h->state NONE) if there is none. */
int nicd_hello_get(const struct nicd_flow_key *k, struct nicd_hello *h);

/* Remove the key's hello if it is still in `state` with our ISN `isn`; returns 1 if it was
 * (of two threads acting on the same hello, exactly one gets 1). */
int nicd_hello_take(const struct nicd_flow_key *k, enum nicd_hello_state state, uint32_t isn);

/* Hellos in the table now (a racy read: a hint that lets the hot path skip the lock). */
uint32_t nicd_hello_count(void);

/* Drop flows and hellos idle past their timeouts; returns how many flows. Active (negotiated)
 * flows in *active, hellos in flight in *hellos (either may be NULL). */
uint32_t nicd_flows_expire(uint32_t *active, uint32_t *hellos);

/* For the unit test (tests/test_nicd_flows.py) only: SipHash-2-4 itself; set the keys (once the
 * table is empty: entries already in it stay where the old key put them); move the tables'
 * clock ahead; the slot a negotiated flow sits in (-1: none). */
uint64_t nicd_flows_test_siphash(const uint8_t key[16], const uint8_t *in, size_t len);
void nicd_flows_test_keys(const uint8_t table[16], const uint8_t nonce[16]);
void nicd_flows_test_advance(uint32_t ms);
int64_t nicd_flows_test_slot(const struct nicd_flow_key *k);

#endif
