/* Path MTUs, looked up off the data path and read lock-free (see nicd_pmtu.h). */
#define _GNU_SOURCE
#include "nicd_pmtu.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_BINDTOIFINDEX
#define SO_BINDTOIFINDEX 62
#endif

#define WAYS 4
#define SETS 64

/* Every field is read and written with atomics: readers copy an entry between two reads of an
 * even seq that agree (a seqlock); writers hold the mutex and make seq odd while they write. */
struct entry {
    uint32_t seq;
    uint32_t ifindex; /* 0: free */
    uint32_t v6;
    uint32_t daddr[4];
    uint32_t mtu;
    uint32_t read;    /* set by readers, cleared by the refresh */
    uint32_t idle;    /* refreshes without a read (writers only) */
};

static struct entry table[SETS * WAYS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int udp_fd = -1, udp6_fd = -1; /* unsent-to, connected only to look a route up */

int nicd_pmtu_init(void)
{
    pthread_mutex_lock(&lock);
    if (udp_fd < 0)
        udp_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (udp6_fd < 0) /* optional: without it IPv6 MTUs are unknown and IPv6 super-packets leave raw */
        udp6_fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int e = errno, rc = udp_fd < 0 ? -1 : 0;
    pthread_mutex_unlock(&lock);
    errno = e;
    return rc;
}

void nicd_pmtu_free(void)
{
    pthread_mutex_lock(&lock);
    if (udp_fd >= 0)
        close(udp_fd);
    if (udp6_fd >= 0)
        close(udp6_fd);
    udp_fd = udp6_fd = -1;
    for (size_t i = 0; i < SETS * WAYS; i++)
        __atomic_store_n(&table[i].ifindex, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}

static struct entry *set_of(uint32_t ifindex, int v6, const uint8_t daddr[16])
{
    uint32_t h = 0;
    for (int i = 0; i < (v6 ? 16 : 4); i += 4) /* every bit counts: one host's peers share a /24 */
        h = (h ^ ((uint32_t)daddr[i] << 24 | (uint32_t)daddr[i + 1] << 16 | (uint32_t)daddr[i + 2] << 8 |
                  daddr[i + 3])) * 0x9E3779B1u;
    h = (h ^ ifindex ^ (uint32_t)v6) * 0x9E3779B1u;
    return &table[(h >> 16) % SETS * WAYS];
}

/* The MTU by system calls (the mutex held: the sockets are shared); 0 if unknown. */
static size_t ask_kernel(uint32_t ifindex, int v6, const uint8_t daddr[16])
{
    struct ifreq ifr = {0};
    size_t mtu = 0;
    int fd = v6 ? udp6_fd : udp_fd;
    if (fd >= 0 && ifindex && if_indextoname(ifindex, ifr.ifr_name) && ioctl(fd, SIOCGIFMTU, &ifr) == 0 &&
        ifr.ifr_mtu > 0)
        mtu = (size_t)ifr.ifr_mtu;
    /* connect() on a datagram socket only looks the route up (through that interface) */
    int oif = (int)ifindex, route_mtu = 0;
    socklen_t sl = sizeof route_mtu;
    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } to = {0};
    socklen_t tolen;
    if (v6) {
        to.in6 = (struct sockaddr_in6){.sin6_family = AF_INET6, .sin6_port = htons(9),
                                       .sin6_scope_id = daddr[0] == 0xFE && (daddr[1] & 0xC0) == 0x80 ? ifindex : 0}; /* fe80::/10 */
        memcpy(&to.in6.sin6_addr, daddr, 16);
        tolen = sizeof to.in6;
    } else {
        to.in = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(9)};
        memcpy(&to.in.sin_addr, daddr, 4);
        tolen = sizeof to.in;
    }
    if (mtu && setsockopt(fd, SOL_SOCKET, SO_BINDTOIFINDEX, &oif, sizeof oif) == 0 &&
        connect(fd, &to.sa, tolen) == 0 &&
        getsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU : IP_MTU, &route_mtu, &sl) == 0 &&
        route_mtu > 0 && (size_t)route_mtu < mtu)
        mtu = (size_t)route_mtu;
    return mtu;
}

static int same(const struct entry *e, uint32_t ifindex, int v6, const uint32_t d[4])
{
    return __atomic_load_n(&e->ifindex, __ATOMIC_RELAXED) == ifindex &&
           __atomic_load_n(&e->v6, __ATOMIC_RELAXED) == (uint32_t)v6 &&
           __atomic_load_n(&e->daddr[0], __ATOMIC_RELAXED) == d[0] &&
           __atomic_load_n(&e->daddr[1], __ATOMIC_RELAXED) == d[1] &&
           __atomic_load_n(&e->daddr[2], __ATOMIC_RELAXED) == d[2] &&
           __atomic_load_n(&e->daddr[3], __ATOMIC_RELAXED) == d[3];
}

/* Write an entry (the mutex held). */
static void store(struct entry *e, uint32_t ifindex, int v6, const uint32_t d[4], size_t mtu)
{
    uint32_t s = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&e->ifindex, ifindex, __ATOMIC_RELAXED);
    __atomic_store_n(&e->v6, (uint32_t)v6, __ATOMIC_RELAXED);
    for (int i = 0; i < 4; i++)
        __atomic_store_n(&e->daddr[i], d[i], __ATOMIC_RELAXED);
    __atomic_store_n(&e->mtu, (uint32_t)mtu, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, s + 2, __ATOMIC_RELEASE);
}

static void words(int v6, const uint8_t daddr[16], uint32_t d[4])
{
    memset(d, 0, 16);
    memcpy(d, daddr, v6 ? 16 : 4);
}

size_t nicd_pmtu_lookup(uint32_t ifindex, int v6, const uint8_t daddr[16])
{
    uint32_t d[4];
    words(v6, daddr, d);
    struct entry *set = set_of(ifindex, v6, daddr);
    pthread_mutex_lock(&lock);
    size_t mtu = ask_kernel(ifindex, v6, daddr);
    /* its own way, else a free one, else the one idle longest */
    struct entry *e = NULL, *free_way = NULL, *oldest = NULL;
    for (int w = 0; w < WAYS; w++) {
        struct entry *c = &set[w];
        if (!__atomic_load_n(&c->ifindex, __ATOMIC_RELAXED))
            free_way = free_way ? free_way : c;
        else if (same(c, ifindex, v6, d))
            e = c;
        else if (!oldest || c->idle > oldest->idle)
            oldest = c;
    }
    if (!e)
        e = free_way ? free_way : oldest;
    if (ifindex) {
        store(e, ifindex, v6, d, mtu);
        e->idle = 0;
    }
    pthread_mutex_unlock(&lock);
    return mtu;
}

int nicd_pmtu_get(uint32_t ifindex, int v6, const uint8_t daddr[16], size_t *mtu)
{
    uint32_t d[4];
    words(v6, daddr, d);
    struct entry *set = set_of(ifindex, v6, daddr);
    for (int w = 0; w < WAYS; w++) {
        struct entry *e = &set[w];
        uint32_t s, m;
        int match;
        do {
            while ((s = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE)) & 1)
                ; /* a writer is in it: a few stores */
            match = ifindex && same(e, ifindex, v6, d);
            m = __atomic_load_n(&e->mtu, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
        } while (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != s);
        if (match) {
            if (!__atomic_load_n(&e->read, __ATOMIC_RELAXED))
                __atomic_store_n(&e->read, 1, __ATOMIC_RELAXED);
            *mtu = m;
            return 1;
        }
    }
    return 0;
}

uint32_t nicd_pmtu_refresh(void)
{
    uint32_t n = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < SETS * WAYS; i++) {
        struct entry *e = &table[i];
        uint32_t ifindex = __atomic_load_n(&e->ifindex, __ATOMIC_RELAXED);
        if (!ifindex)
            continue;
        if (__atomic_exchange_n(&e->read, 0, __ATOMIC_RELAXED))
            e->idle = 0;
        else if (++e->idle >= NICD_PMTU_IDLE_S) {
            uint32_t none[4] = {0};
            store(e, 0, 0, none, 0);
            continue;
        }
        uint32_t d[4];
        uint8_t daddr[16];
        int v6 = (int)e->v6;
        memcpy(d, e->daddr, sizeof d); /* the mutex keeps writers out */
        memcpy(daddr, d, 16);
        store(e, ifindex, v6, d, ask_kernel(ifindex, v6, daddr));
        n++;
    }
    pthread_mutex_unlock(&lock);
    return n;
}
