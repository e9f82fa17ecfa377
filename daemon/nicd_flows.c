/* Open-addressing flow table (linear probing, backward-shift deletion), one mutex. */
#include "nicd_flows.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot {
    struct nicd_flow_key key;
    uint32_t isn;
    uint32_t last_seen; /* monotonic seconds */
    uint8_t state;      /* NICD_FLOW_NONE marks an empty slot */
};

static struct slot *slots;
static uint32_t mask, count, idle_timeout;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)ts.tv_sec;
}

static uint32_t hash(const struct nicd_flow_key *k)
{
    uint64_t h = ((uint64_t)k->saddr << 32 | k->daddr) * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)k->sport << 16 | k->dport) * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h >> 32);
}

static int same(const struct nicd_flow_key *a, const struct nicd_flow_key *b)
{
    return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport &&
           a->dport == b->dport;
}

int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s)
{
    uint32_t cap = 64;
    while (cap < capacity && cap < (1u << 24))
        cap <<= 1;
    struct slot *s = calloc(cap, sizeof *s);
    if (!s)
        return -1;
    pthread_mutex_lock(&lock);
    free(slots);
    slots = s;
    mask = cap - 1;
    count = 0;
    idle_timeout = idle_timeout_s;
    pthread_mutex_unlock(&lock);
    return 0;
}

void nicd_flows_free(void)
{
    pthread_mutex_lock(&lock);
    free(slots);
    slots = NULL;
    mask = count = 0;
    pthread_mutex_unlock(&lock);
}

/* Index of the key's slot, or of the empty slot where it would go. Caller holds the lock. */
static uint32_t find(const struct nicd_flow_key *k)
{
    uint32_t i = hash(k) & mask;
    while (slots[i].state != NICD_FLOW_NONE && !same(&slots[i].key, k))
        i = (i + 1) & mask;
    return i;
}

static void erase(uint32_t i)
{
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (slots[j].state == NICD_FLOW_NONE)
            break;
        uint32_t home = hash(&slots[j].key) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i].state = NICD_FLOW_NONE;
    count--;
}

static int expired(const struct slot *s, uint32_t now)
{
    return now - s->last_seen > idle_timeout;
}

int nicd_flows_put(const struct nicd_flow_key *k, enum nicd_flow_state st, uint32_t isn)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k);
        /* Keep the table at most 3/4 full so probe chains stay short. */
        if (slots[i].state != NICD_FLOW_NONE || count < (mask + 1) / 4 * 3) {
            if (slots[i].state == NICD_FLOW_NONE)
                count++;
            slots[i].key = *k;
            slots[i].state = (uint8_t)st;
            slots[i].isn = isn;
            slots[i].last_seen = now_s();
            rc = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

enum nicd_flow_state nicd_flows_get(const struct nicd_flow_key *k, uint32_t *isn)
{
    enum nicd_flow_state st = NICD_FLOW_NONE;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k), now = now_s();
        if (slots[i].state != NICD_FLOW_NONE) {
            if (expired(&slots[i], now)) {
                erase(i);
            } else {
                st = (enum nicd_flow_state)slots[i].state;
                *isn = slots[i].isn;
                slots[i].last_seen = now;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return st;
}

int nicd_flows_advance(const struct nicd_flow_key *k, enum nicd_flow_state from,
                       enum nicd_flow_state to, uint32_t isn, int set_isn)
{
    int done = 0;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k);
        if (slots[i].state == (uint8_t)from && !expired(&slots[i], now_s())) {
            slots[i].state = (uint8_t)to;
            if (set_isn)
                slots[i].isn = isn;
            slots[i].last_seen = now_s();
            done = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return done;
}

uint32_t nicd_flows_expire(uint32_t *active)
{
    uint32_t n = 0;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t now = now_s();
        for (uint32_t i = 0; i <= mask;) {
            if (slots[i].state != NICD_FLOW_NONE && expired(&slots[i], now)) {
                erase(i); /* a later entry may shift into i: look at it again */
                n++;
            } else {
                i++;
            }
        }
    }
    if (active)
        *active = count;
    pthread_mutex_unlock(&lock);
    return n;
}
