/* Concurrent stress test of the negotiated-flow table (daemon/nicd_flows.c): queue threads look
 * flows up and update them without a shared lock while writers insert, replace, close and expire
 * entries, whose backward-shift deletions move other entries under the readers. Built twice by
 * `make check-c`: under ThreadSanitizer (data races) and under ASan + UBSan.
 *
 * Checked:
 * - no torn or wrong entry: every flow's ISN encodes its key, its peer ISN and MSS follow from
 *   the ISN, and a view stored for a connection is only ever seen with that connection's ISN;
 * - no false miss or false hit: each reader also owns keys that only it inserts and removes;
 *   while the clock stands still, its key is found right after it negotiated it and never
 *   after it removed it, however the other writers' deletions shift the probe chains;
 * - the table's books: after everything is removed, no flow is active and no owner holds one;
 * - hellos (whose lookup of an absent key takes no lock): a reader's own hello is found right
 *   after it put it, with its ISN, and never after it took it; a peer's hello (PEER) is gone
 *   after our RST, an answered one is not; a shared key's hello, put and taken by the writers
 *   meanwhile (of several owners and both parties, so full sets pick victims by party), is only
 *   ever seen with that key's ISN.
 * Exit status 0 when all held; a message and 1 otherwise. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nicd_flows.h"

#define SHARED_KEYS 40    /* churned by the writers, read by everyone */
#define PRIVATE_KEYS 4    /* per reader: only that reader writes them */
#define READERS 3
#define WRITERS 2
#define CAPACITY 64       /* small: long, interleaved probe chains (48 flows at most) */

static atomic_int failed, stop_flag, advancing;
static atomic_ulong lookups, hits, writes, hello_lookups;

static void fail(const char *what, unsigned sport, unsigned isn)
{
    if (atomic_fetch_add(&failed, 1) < 10)
        fprintf(stderr, "stress_nicd_flows: %s (key %u, isn %#x)\n", what, sport, isn);
}

static struct nicd_flow_key raw_key(unsigned sport)
{
    struct nicd_flow_key k;
    memset(&k, 0, sizeof k);
    k.saddr = 0x010012C6, k.daddr = 0x020012C6, k.sport = (uint16_t)sport, k.dport = 5000;
    return k;
}

/* Ports whose keys all hash home to the table's first few slots (under a known table key): one
 * long probe chain that every deletion shifts and every lookup walks. key(i) is the i-th. */
static const uint8_t TABLE_KEY[16] = "stress-the-chain";
static unsigned ports[SHARED_KEYS + READERS * PRIVATE_KEYS + 1];

static void pick_ports(void)
{
    unsigned n = 0;
    for (unsigned sport = 1; n < sizeof ports / sizeof ports[0] && sport < 65536; sport++) {
        struct nicd_flow_key k = raw_key(sport);
        uint8_t b[12];
        memcpy(b, &k.saddr, 4), memcpy(b + 4, &k.daddr, 4), memcpy(b + 8, &k.sport, 2), memcpy(b + 10, &k.dport, 2);
        if ((nicd_flows_test_siphash(TABLE_KEY, b, 12) & (CAPACITY - 1)) < 4)
            ports[n++] = sport;
    }
}

static struct nicd_flow_key key(unsigned i)
{
    return raw_key(ports[i]);
}

/* A connection of the key of index sport: its ISN carries the index in the high half. */
static uint32_t isn_of(unsigned sport, unsigned gen) { return (uint32_t)sport << 16 | (gen & 0xFFFF); }
static uint32_t peer_isn_of(uint32_t isn) { return isn ^ 0x5A5A5A5Au; }

/* Keys whose hello set (nicd_flows.c: the hash's bits 32 and up, 32 sets of 8 ways at this
 * capacity) holds more than 8 of the keys here: their hellos may be evicted, so a miss of one
 * proves nothing. */
#define HELLO_SETS 32
static unsigned char crowded[sizeof ports / sizeof ports[0]];

static void find_crowded(void)
{
    unsigned n = sizeof ports / sizeof ports[0], set[sizeof ports / sizeof ports[0]], in[HELLO_SETS] = {0};
    for (unsigned i = 1; i < n; i++) {
        struct nicd_flow_key k = key(i);
        uint8_t b[12];
        memcpy(b, &k.saddr, 4), memcpy(b + 4, &k.daddr, 4), memcpy(b + 8, &k.sport, 2), memcpy(b + 10, &k.dport, 2);
        set[i] = (unsigned)(nicd_flows_test_siphash(TABLE_KEY, b, 12) >> 32) & (HELLO_SETS - 1);
        in[set[i]]++;
    }
    for (unsigned i = 1; i < n; i++)
        crowded[i] = in[set[i]] > 8;
}

static struct nicd_hello a_hello(uint8_t state, uint32_t isn)
{
    struct nicd_hello h;
    memset(&h, 0, sizeof h);
    h.state = state, h.isn = isn, h.peer_isn = peer_isn_of(isn);
    return h;
}

/* Look k's hello up as the data path does (confirm_answered); returns 1 and its ISN if found. */
static int hello_look(unsigned sport, uint32_t *isn)
{
    struct nicd_flow_key k = key(sport);
    struct nicd_hello h;
    atomic_fetch_add(&hello_lookups, 1);
    if (!nicd_hello_get(&k, &h))
        return 0;
    if (h.isn >> 16 != sport || h.peer_isn != peer_isn_of(h.isn))
        fail("a hello of another key, or torn", sport, h.isn);
    *isn = h.isn;
    return 1;
}


static int negotiate(unsigned sport, uint32_t isn)
{
    struct nicd_flow_key k = key(sport);
    atomic_fetch_add(&writes, 1);
    return nicd_flows_negotiate(&k, isn, peer_isn_of(isn), (uint16_t)sport, NICD_OWNER_UID(sport % 7));
}

/* Look k up as the data path does and check what came back; returns the state. */
static enum nicd_flow_state look(unsigned sport, uint32_t *isn)
{
    struct nicd_flow_key k = key(sport);
    struct nicd_flow_info fi;
    memset(&fi, 0, sizeof fi);
    static _Thread_local uint32_t seq;
    enum nicd_flow_state st = nicd_flows_egress(&k, seq += 100, 100, 7, 0, &fi);
    atomic_fetch_add(&lookups, 1);
    if (st != NICD_FLOW_NONE) {
        atomic_fetch_add(&hits, 1);
        if (fi.isn >> 16 != sport)
            fail("an entry of another key", sport, fi.isn);
        if (fi.peer_isn != peer_isn_of(fi.isn) || fi.mss != sport)
            fail("a torn entry (peer ISN or MSS of another connection)", sport, fi.isn);
        if (fi.view.known && fi.view.saddr != fi.isn)
            fail("a view of another connection", sport, fi.isn);
        *isn = fi.isn;
    }
    return st;
}

static void *reader(void *arg)
{
    unsigned id = (unsigned)(size_t)arg, r = id * 7919 + 1;
    unsigned base = SHARED_KEYS + 1 + id * PRIVATE_KEYS;
    unsigned gen[PRIVATE_KEYS] = {0};
    while (!atomic_load(&stop_flag)) {
        r = r * 1103515245 + 12345;
        uint32_t isn = 0;
        struct nicd_flow_key k;
        switch ((r >> 16) % 8) {
        case 0: case 1: case 2: case 3: /* shared keys: whatever is there must be right */
            look(1 + (r >> 8) % SHARED_KEYS, &isn);
            break;
        case 4: { /* a private key: found right after it is negotiated, gone after removal */
            unsigned p = (r >> 8) % PRIVATE_KEYS, sport = base + p;
            uint32_t want = isn_of(sport, ++gen[p]);
            int still = !atomic_load(&advancing);
            if (negotiate(sport, want) == 0 && still) {
                for (int n = 0; n < 64; n++) /* while the writers' deletions shift its chain */
                    if (look(sport, &isn) == NICD_FLOW_NONE || isn != want) {
                        if (!atomic_load(&advancing)) /* not expired in the meantime */
                            fail("a negotiated flow was not found (false miss)", sport, want);
                        break;
                    }
            }
            k = key(sport);
            if ((r >> 4) & 1)
                nicd_flows_close(&k, 1);
            else
                nicd_flows_forget(&k);
            if (still && !atomic_load(&advancing) && look(sport, &isn) != NICD_FLOW_NONE)
                fail("a removed flow was found (false hit)", sport, isn);
            break;
        }
        case 5: { /* the slow path's answer for what is there now */
            unsigned sport = 1 + (r >> 8) % SHARED_KEYS;
            if (look(sport, &isn) != NICD_FLOW_NONE) {
                struct nicd_flow_view v = {.known = 2, .saddr = isn};
                k = key(sport);
                nicd_flows_set_view(&k, isn, &v);
            }
            break;
        }
        case 6:
            k = key(1 + (r >> 8) % SHARED_KEYS);
            nicd_flows_note_rewritten(&k);
            nicd_flows_known(&k);
            hello_look(1 + (r >> 8) % SHARED_KEYS, &isn);
            if ((r >> 3) & 1) { /* a private key's hello: found after the put, gone after the take */
                unsigned p = (r >> 8) % PRIVATE_KEYS, sport = base + p;
                uint32_t want = isn_of(sport, ++gen[p]);
                int exact = !crowded[sport] && !atomic_load(&advancing);
                struct nicd_hello h = a_hello(NICD_HELLO_ANSWERED, want);
                k = key(sport);
                nicd_hello_put(&k, &h);
                if (exact && (!hello_look(sport, &isn) || isn != want))
                    fail("a hello just put was not found (false miss)", sport, want);
                if (!nicd_hello_take(&k, NICD_HELLO_ANSWERED, want) && exact)
                    fail("a hello just put could not be taken", sport, want);
                if (exact && hello_look(sport, &isn))
                    fail("a taken hello was found (false hit)", sport, isn);
                /* our RST: a peer's hello our SYN-ACK never answered goes, an answered one stays */
                h = a_hello((r >> 5) & 1 ? NICD_HELLO_PEER : NICD_HELLO_ANSWERED, want);
                nicd_hello_put(&k, &h);
                nicd_flows_close(&k, 1);
                int found = hello_look(sport, &isn);
                if (exact && found != (h.state == NICD_HELLO_ANSWERED))
                    fail(found ? "a peer's hello outlived our RST" : "an answered hello did not outlive our RST",
                         sport, want);
                nicd_hello_take(&k, (enum nicd_hello_state)h.state, want);
            }
            break;
        default:
            k = key(1 + (r >> 8) % SHARED_KEYS);
            nicd_flows_close(&k, 0); /* a FIN: lingers */
            break;
        }
    }
    return NULL;
}

static void *writer(void *arg)
{
    unsigned r = (unsigned)(size_t)arg * 104729 + 3, gen = 0;
    while (!atomic_load(&stop_flag)) {
        r = r * 1103515245 + 12345;
        unsigned sport = 1 + (r >> 8) % SHARED_KEYS;
        struct nicd_flow_key k = key(sport);
        switch ((r >> 20) % 4) {
        case 0: case 1: negotiate(sport, isn_of(sport, ++gen)); break; /* new, or replaces */
        case 2: nicd_flows_forget(&k); break;
        default: nicd_flows_close(&k, 1); break;
        }
        /* ours (SENT) of three local users, or a peer's (PEER) of two hosts */
        struct nicd_hello h = a_hello((r >> 5) & 1 ? NICD_HELLO_PEER : NICD_HELLO_SENT, isn_of(sport, ++gen));
        h.owner = h.state == NICD_HELLO_SENT ? NICD_OWNER_UID((r >> 6) % 3) : 2ull << 32 | (r >> 6) % 2;
        if ((r >> 4) & 1)
            nicd_hello_put(&k, &h);
        else if (nicd_hello_get(&k, &h))
            nicd_hello_take(&k, (enum nicd_hello_state)h.state, h.isn); /* unless another took it first */
    }
    return NULL;
}

/* The main thread's once-a-second expiry, much faster; in phase 2 the clock also jumps, so
 * flows expire under the readers (nicd_flows_egress finds them idle and removes them too). */
static void *expirer(void *arg)
{
    (void)arg;
    unsigned n = 0;
    while (!atomic_load(&stop_flag)) {
        uint32_t active, in_flight;
        nicd_flows_expire(&active, &in_flight);
        if (active > CAPACITY / 4 * 3)
            fail("more active flows than the table may hold", active, 0);
        if (atomic_load(&advancing) && ++n % 4 == 0)
            nicd_flows_test_advance(1500);
        sched_yield();
    }
    return NULL;
}

static void phase(int advance, double seconds)
{
    pthread_t t[READERS + WRITERS + 1];
    int n = 0;
    atomic_store(&stop_flag, 0);
    atomic_store(&advancing, advance);
    for (int i = 0; i < READERS; i++)
        pthread_create(&t[n++], NULL, reader, (void *)(size_t)i);
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&t[n++], NULL, writer, (void *)(size_t)i);
    pthread_create(&t[n++], NULL, expirer, NULL);
    struct timespec ts = {.tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (long)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    atomic_store(&stop_flag, 1);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    if (nicd_flows_init(CAPACITY, 2, 1 << 20) != 0) {
        fprintf(stderr, "stress_nicd_flows: out of memory\n");
        return 1;
    }
    nicd_flows_test_keys(TABLE_KEY, TABLE_KEY);
    pick_ports();
    find_crowded();
    phase(0, seconds); /* the clock stands: no expiry, exact hits and misses on private keys */
    phase(1, seconds); /* the clock jumps: flows expire under the readers too */
    for (unsigned s = 1; s < sizeof ports / sizeof ports[0]; s++) { /* empty it: the books must balance */
        struct nicd_flow_key k = key(s);
        nicd_flows_forget(&k);
    }
    uint32_t active = 1;
    nicd_flows_expire(&active, NULL);
    if (active)
        fail("flows left after removing every key", active, 0);
    for (unsigned o = 0; o < 7; o++)
        if (nicd_flows_test_owned(NICD_OWNER_UID(o)))
            fail("an owner still holds flows after all were removed", o, 0);
    nicd_flows_free();
    printf("stress_nicd_flows: %lu lookups (%lu hits), %lu negotiations, %lu hello lookups, %d failures\n",
           (unsigned long)atomic_load(&lookups), (unsigned long)atomic_load(&hits),
           (unsigned long)atomic_load(&writes), (unsigned long)atomic_load(&hello_lookups), atomic_load(&failed));
    return atomic_load(&failed) ? 1 : 0;
}
