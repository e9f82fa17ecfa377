/*
 * Per-flow state of the soft NIC, shared by the queue threads under one mutex (only handshake
 * packets and the egress of tagged data look flows up; restoring needs no state).
 * A flow is keyed by its egress direction as this host sends it.
 */
#ifndef NICD_FLOWS_H
#define NICD_FLOWS_H

#include <stdint.h>

enum nicd_flow_state {
    NICD_FLOW_NONE = 0,
    NICD_FLOW_HELLO_SENT,  /* we sent a tagged SYN marked "soft NIC here"; peer not heard yet */
    NICD_FLOW_PEER_HELLO,  /* the peer's SYN said "soft NIC here"; our SYN-ACK not sent yet */
    NICD_FLOW_NEGOTIATED,  /* both ends run the soft NIC and we know our ISN: compress */
};

struct nicd_flow_key {
    uint32_t saddr, daddr; /* network order, as in the header */
    uint16_t sport, dport; /* host order */
};

/* Returns 0, or -1 when out of memory. capacity is rounded up to a power of two. */
int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s);
void nicd_flows_free(void);

/* Create or replace the flow's entry (a new SYN on a reused 4-tuple starts over). Returns 0, or
 * -1 when the table is full (the flow then simply stays raw). */
int nicd_flows_put(const struct nicd_flow_key *k, enum nicd_flow_state st, uint32_t isn);

/* State of the flow (NONE if unknown or idle past the timeout); *isn set when not NONE.
 * Refreshes the flow's idle clock. */
enum nicd_flow_state nicd_flows_get(const struct nicd_flow_key *k, uint32_t *isn);

/* Move a flow to a new state if it is in `from`; returns 1 if it was. */
int nicd_flows_advance(const struct nicd_flow_key *k, enum nicd_flow_state from,
                       enum nicd_flow_state to, uint32_t isn, int set_isn);

/* Drop flows idle past the timeout; returns how many. Active flows in *active. */
uint32_t nicd_flows_expire(uint32_t *active);

#endif
