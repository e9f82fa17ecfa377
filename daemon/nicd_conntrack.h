/*
 * The slow path: a negotiated flow's view before NAT (struct nicd_flow_view), asked of conntrack
 * (ctnetlink) by one thread of its own, never by a queue thread. A queue thread posts the flow to
 * a bounded request queue without blocking (nicd_ct_ask); the answer goes into the flow entry
 * (nicd_flows_set_view). Until it is there the flow's view is unknown, and nothing of the flow
 * leaves by the raw socket: its super-packets leave raw through the verdict (always valid), so a
 * NATed flow is never sent with addresses NAT would take for a new connection.
 */
#ifndef NICD_CONNTRACK_H
#define NICD_CONNTRACK_H

#include <stdint.h>

#include "nicd_flows.h"

/* Requests waiting at most; a full queue refuses more (the flow asks again later, flows.h's
 * NICD_VIEW_RETRY_S). */
#define NICD_CT_QUEUE 1024

/* Open the ctnetlink socket and start the thread. Returns 0, or -1 with errno when there is no
 * ctnetlink (no CAP_NET_ADMIN, no nf_conntrack_netlink): then every request is answered at once
 * with "as the hook sees them" (no NAT can be told). Idempotent. */
int nicd_ct_start(void);
/* Stop the thread (pending requests are dropped) and close the socket. */
void nicd_ct_stop(void);

/* Ask for flow k's view (k our egress direction, isn our ISN). Never blocks: returns 0 if posted
 * (or answered at once, without a thread), -1 if the queue is full. */
int nicd_ct_ask(const struct nicd_flow_key *k, uint32_t isn);

/* Requests answered so far (for tests and stats), and questions sent to conntrack. */
uint64_t nicd_ct_answered(void);
uint64_t nicd_ct_questions(void);

/* For tests/test_nicd_flows.py only: 1 keeps the thread from taking requests, 0 lets it go. */
void nicd_ct_test_hold(int on);

#endif
