/*
 * Path MTUs for gso's cuts, kept off the packet thread's data path: a destination's MTU is looked
 * up (about seven system calls) when one of its flows shakes hands, and refreshed once a second
 * by the daemon's main thread (nicd_pmtu_refresh); data packets only read the table, without a
 * lock or a system call. One table shared by the queue threads: writers (handshakes, the
 * refresh) take a mutex, readers use each entry's sequence counter (a seqlock).
 */
#ifndef NICD_PMTU_H
#define NICD_PMTU_H

#include <stddef.h>
#include <stdint.h>

/* Opens the datagram sockets the lookups use (IPv6's is optional). Returns 0, or -1 with errno
 * when the IPv4 one cannot be opened. */
int nicd_pmtu_init(void);
void nicd_pmtu_free(void);

/* The MTU a packet to daddr (IPv4: its first 4 bytes; network order) may have when it leaves
 * by interface ifindex: the interface's MTU lowered to the route's (a route `mtu`, or a path MTU
 * learned from ICMP or ICMPv6 "packet too big"). Looked up now and stored; 0 if unknown. For
 * handshakes, and for a packet the raw socket refused for its size (the MTU fell). */
size_t nicd_pmtu_lookup(uint32_t ifindex, int v6, const uint8_t daddr[16]);

/* The stored MTU (at most a second old; 0: unknown) in *mtu, and 1; 0 if the destination has
 * none stored (never looked up, idle past NICD_PMTU_IDLE_S, or pushed out of its set by others).
 * No lock, no system call. */
int nicd_pmtu_get(uint32_t ifindex, int v6, const uint8_t daddr[16], size_t *mtu);

/* Look every stored destination up again; forget those not read for NICD_PMTU_IDLE_S.
 * Returns how many are stored. */
#define NICD_PMTU_IDLE_S 600
uint32_t nicd_pmtu_refresh(void);

#endif
