/* The soft NIC's flow tables (see nicd_flows.h): negotiated flows in an open-addressing table
 * (linear probing, backward-shift deletion), with their owners' counts in a second one of the
 * same size (at most one owner per flow, so it never fills); hellos in a bounded set-associative
 * table.
 *
 * Locking of the negotiated flows: the data path takes no lock that other flows share.
 * - Each slot has a tag (atomic: 0 free, else its key's hash with the top bit set) and a lock of
 *   its own, which guards its flow. A data packet finds its slot by reading tags only, then locks
 *   that slot and checks the key under the lock (a flow's packets come to one queue thread, so
 *   the slot lock is uncontended but for the rare writer below).
 * - Inserting, removing and expiring hold the table lock (`lock`) as well, one writer at a time.
 *   Insertion fills a free slot under its lock and publishes the tag last. Removal shifts later
 *   entries of the probe chain back, each copied under the locks of both slots, and makes `gen`
 *   odd while it does: a reader whose probe missed while gen moved looks again (a miss is never
 *   wrong, only raw, but must not be caused by a move), and after a few tries under the table
 *   lock, where nothing moves.
 * - Lock order: table lock, then slot locks in probe order. A reader holds one slot lock and
 *   takes no other lock while holding it.
 *
 * Hellos are written and read under their own lock (`hello_lock`), but a lookup of a key that has
 * no hello (a compressed packet of a flow this daemon does not know, which the data path asks
 * about while any hello is in the table: nicd_queue's confirm_answered) takes no lock: each way
 * also has a tag, published after the way is written and cleared when it is freed, and a lookup
 * whose key's tag is in none of its set's ways is a miss (as if it came before a hello being
 * put). */
#define _GNU_SOURCE
#include "nicd_flows.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define HELLO_WAYS 8
#define HELLO_TIMEOUT_S 75 /* past the SYN retransmissions that matter; each one refreshes it */

struct flow {
    struct nicd_flow_key key;
    uint32_t isn, peer_isn;
    uint32_t last_seen; /* monotonic seconds */
    uint32_t high;      /* the end of the furthest range sent (valid once sent is set) */
    uint32_t retx_seq;  /* where the last retransmitted range started */
    uint32_t retx_since; /* ... and when it was first sent again (monotonic seconds) */
    uint32_t new_bytes, retx_bytes; /* sent for the first time, and again */
    uint16_t mss;
    uint8_t retx;       /* sends of the range at retx_seq */
    uint8_t high_byte;  /* the byte before high */
    uint8_t high_fin;   /* a FIN followed it */
    uint8_t sent, raw;
    uint8_t rewritten; /* a compressed packet arrived without its mark */
    uint8_t closing;   /* our FIN left: expires after NICD_FIN_LINGER_S idle seconds */
    uint8_t send_trains; /* we send it v3 segment trains (nicd_flows_set_trains; until trains_gave_up) */
    uint32_t view_asked; /* when the view was last asked for (monotonic seconds) */
    uint64_t owner;
    struct nicd_flow_view view;
};

struct slot {
    uint64_t tag;  /* atomic: 0 free, else hash(key) | TAG_USED */
    uint32_t lk;   /* atomic: the slot's lock (slot_lock) */
    struct flow f; /* under lk; key and owner written with the table lock held too */
};

#define TAG_USED (1ull << 63) /* the low bits stay the hash's: tag & mask is the home slot */

struct oslot {
    uint64_t owner; /* 0: free */
    uint32_t n;     /* flows it holds */
};

struct hslot {
    uint64_t tag; /* atomic: 0 a free way, else tag_of(key); written under hello_lock */
    struct nicd_flow_key key;
    struct nicd_hello h; /* h.state NONE marks a free way */
    uint32_t born;       /* monotonic milliseconds, for eviction and expiry */
};

static struct slot *slots;
static struct oslot *owners; /* mask + 1 entries too; guarded by lock */
static uint32_t mask, count, idle_timeout, owner_cap; /* the pointer and mask change only at init
                                                        and free, with no queue thread running */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t gen; /* atomic: odd while entries move (erase) */

static struct hslot *hellos;
static uint32_t hello_sets; /* a power of two */
static uint32_t hello_used; /* written under hello_lock, atomically: nicd_hello_count reads it without
                             * the lock */
static pthread_mutex_t hello_lock = PTHREAD_MUTEX_INITIALIZER;

static uint8_t table_key[16], nonce_key[16];
static uint32_t clock_ahead_ms; /* 0 but in the unit test: nicd_flows_test_advance() */

static uint32_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 +
                      __atomic_load_n(&clock_ahead_ms, __ATOMIC_RELAXED));
}

static uint32_t now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)ts.tv_sec + __atomic_load_n(&clock_ahead_ms, __ATOMIC_RELAXED) / 1000;
}

/* ---- SipHash-2-4 (Aumasson and Bernstein), over short inputs ------------------------------- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                 \
    do {                                                                                         \
        v0 += v1, v1 = ROTL(v1, 13), v1 ^= v0, v0 = ROTL(v0, 32);                                \
        v2 += v3, v3 = ROTL(v3, 16), v3 ^= v2;                                                   \
        v0 += v3, v3 = ROTL(v3, 21), v3 ^= v0;                                                   \
        v2 += v1, v1 = ROTL(v1, 17), v1 ^= v2, v2 = ROTL(v2, 32);                                \
    } while (0)

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

static uint64_t siphash(const uint8_t key[16], const uint8_t *in, size_t len)
{
    uint64_t k0 = le64(key), k1 = le64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    size_t left = len & 7;
    const uint8_t *end = in + len - left;
    for (; in != end; in += 8) {
        uint64_t m = le64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < left; i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The bytes a key hashes: 12 for IPv4 (addresses, ports), 36 for IPv6. SipHash counts the
 * length in, so the two families never share an input. */
static size_t key_bytes(const struct nicd_flow_key *k, uint8_t b[36])
{
    if (k->v6) {
        memcpy(b, k->saddr6, 16);
        memcpy(b + 16, k->daddr6, 16);
        memcpy(b + 32, &k->sport, 2);
        memcpy(b + 34, &k->dport, 2);
        return 36;
    }
    memcpy(b, &k->saddr, 4);
    memcpy(b + 4, &k->daddr, 4);
    memcpy(b + 8, &k->sport, 2);
    memcpy(b + 10, &k->dport, 2);
    return 12;
}

static uint64_t hash(const struct nicd_flow_key *k)
{
    uint8_t b[36];
    return siphash(table_key, b, key_bytes(k, b));
}

void nicd_flows_nonce(const struct nicd_flow_key *k, uint32_t isn, uint8_t nonce[NICD_NONCE_LEN])
{
    uint8_t b[40];
    size_t n = key_bytes(k, b);
    memcpy(b + n, &isn, 4);
    uint64_t h = siphash(nonce_key, b, n + 4);
    memcpy(nonce, &h, NICD_NONCE_LEN);
}

static int same(const struct nicd_flow_key *a, const struct nicd_flow_key *b)
{
    if (a->sport != b->sport || a->dport != b->dport || a->v6 != b->v6)
        return 0;
    if (a->v6)
        return memcmp(a->saddr6, b->saddr6, 16) == 0 && memcmp(a->daddr6, b->daddr6, 16) == 0;
    return a->saddr == b->saddr && a->daddr == b->daddr;
}

static int random_bytes(uint8_t *b, size_t n)
{
    while (n) {
        ssize_t r = getrandom(b, n, 0);
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s, uint32_t cap_per_owner)
{
    uint32_t cap = 64;
    while (cap < capacity && cap < (1u << 24))
        cap <<= 1;
    uint32_t hcap = cap / 16;
    hcap = hcap < 256 ? 256 : hcap > 16384 ? 16384 : hcap;
    uint8_t keys[32];
    struct slot *s = calloc(cap, sizeof *s);
    struct oslot *o = calloc(cap, sizeof *o);
    struct hslot *h = calloc(hcap, sizeof *h);
    if (!s || !o || !h || random_bytes(keys, sizeof keys) < 0) {
        free(s);
        free(o);
        free(h);
        return -1;
    }
    pthread_mutex_lock(&lock);
    pthread_mutex_lock(&hello_lock);
    memcpy(table_key, keys, 16);
    memcpy(nonce_key, keys + 16, 16);
    free(slots);
    slots = s;
    free(owners);
    owners = o;
    mask = cap - 1;
    count = 0;
    idle_timeout = idle_timeout_s;
    owner_cap = cap_per_owner;
    free(hellos);
    hellos = h;
    hello_sets = hcap / HELLO_WAYS;
    hello_used = 0;
    pthread_mutex_unlock(&hello_lock);
    pthread_mutex_unlock(&lock);
    return 0;
}

void nicd_flows_free(void)
{
    pthread_mutex_lock(&lock);
    pthread_mutex_lock(&hello_lock);
    free(slots);
    slots = NULL;
    free(owners);
    owners = NULL;
    mask = count = 0;
    free(hellos);
    hellos = NULL;
    hello_sets = hello_used = 0;
    pthread_mutex_unlock(&hello_lock);
    pthread_mutex_unlock(&lock);
}

/* ---- owners: how many flows each holds (caller holds the lock) ---------------------------- */

uint64_t nicd_flows_owner_of_peer(const struct nicd_flow_key *k)
{
    uint8_t b[16];
    size_t n = 4;
    if (k->v6)
        memcpy(b, k->daddr6, 8), n = 8; /* the /64 */
    else
        memcpy(b, &k->daddr, 4);
    return 2ull << 32 | (uint32_t)siphash(table_key, b, n);
}

static uint32_t owner_home(uint64_t owner)
{
    return (uint32_t)siphash(table_key, (const uint8_t *)&owner, sizeof owner) & mask;
}

/* The owner's slot, or the free one where it would go: never full, since no more owners than
 * flows (at most 3/4 of the slots) hold any. */
static uint32_t owner_find(uint64_t owner)
{
    uint32_t i = owner_home(owner);
    while (owners[i].owner && owners[i].owner != owner)
        i = (i + 1) & mask;
    return i;
}

static void owner_release(uint64_t owner)
{
    uint32_t i = owner_find(owner);
    if (!owners[i].owner || --owners[i].n)
        return;
    for (uint32_t j = i;;) { /* backward-shift deletion, as erase() */
        j = (j + 1) & mask;
        if (!owners[j].owner)
            break;
        uint32_t home = owner_home(owners[j].owner);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            owners[i] = owners[j];
            i = j;
        }
    }
    owners[i].owner = 0;
}

/* ---- negotiated flows --------------------------------------------------------------------- */

static uint64_t tag_of(const struct nicd_flow_key *k)
{
    return hash(k) | TAG_USED;
}

static uint64_t tag_at(uint32_t i)
{
    return __atomic_load_n(&slots[i].tag, __ATOMIC_ACQUIRE);
}

static void slot_lock(struct slot *s)
{
    unsigned spins = 0;
    while (__atomic_exchange_n(&s->lk, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&s->lk, __ATOMIC_RELAXED)) {
            if (++spins < 100) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield(); /* its holder may have lost its core (2 shared cores) */
            }
        }
    }
}

static void slot_unlock(struct slot *s)
{
    __atomic_store_n(&s->lk, 0, __ATOMIC_RELEASE);
}

/* Index of the key's slot, or of the free slot where it would go. Caller holds the table lock
 * (so no key changes under it: only writers write keys). */
static uint32_t find(const struct nicd_flow_key *k)
{
    uint64_t t = tag_of(k);
    uint32_t i = (uint32_t)t & mask;
    for (uint64_t at; (at = tag_at(i)) && !(at == t && same(&slots[i].f.key, k));)
        i = (i + 1) & mask;
    return i;
}

/* The key's slot, locked, or NULL: the data path's lookup, without the table lock (see the top
 * of this file). */
static struct slot *acquire(const struct nicd_flow_key *k)
{
    if (!slots)
        return NULL;
    uint64_t t = tag_of(k);
    for (int attempt = 0; attempt < 4; attempt++) {
        uint32_t g = __atomic_load_n(&gen, __ATOMIC_ACQUIRE);
        if (g & 1) { /* entries are moving: wait for the writer */
            sched_yield();
            continue;
        }
        uint32_t i = (uint32_t)t & mask;
        for (uint32_t n = 0; n <= mask; n++, i = (i + 1) & mask) {
            uint64_t at = tag_at(i);
            if (!at)
                break;
            if (at != t)
                continue;
            struct slot *s = &slots[i];
            slot_lock(s);
            if (__atomic_load_n(&s->tag, __ATOMIC_RELAXED) == t && same(&s->f.key, k))
                return s;
            slot_unlock(s);
        }
        /* after the tags' acquire loads: a moved tag seen means gen seen moved too */
        if (__atomic_load_n(&gen, __ATOMIC_ACQUIRE) == g)
            return NULL; /* no move overlapped the probe: the key is not there */
    }
    pthread_mutex_lock(&lock); /* moves kept overlapping: look where nothing moves */
    uint32_t i = find(k);
    struct slot *s = tag_at(i) ? &slots[i] : NULL;
    if (s)
        slot_lock(s);
    pthread_mutex_unlock(&lock);
    return s;
}

/* Remove the entry at i (the table lock held, slot i unlocked). */
static void erase(uint32_t i)
{
    uint32_t g = __atomic_load_n(&gen, __ATOMIC_RELAXED);
    __atomic_store_n(&gen, g + 1, __ATOMIC_RELAXED); /* published by the tags' release stores */
    slot_lock(&slots[i]);
    owner_release(slots[i].f.owner);
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. An entry
     * moves under both slots' locks; the old copy stays locked until it is overwritten or
     * freed, so nobody ever finds it. */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t t = tag_at(j);
        if (!t)
            break;
        uint32_t home = (uint32_t)t & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            slot_lock(&slots[j]);
            slots[i].f = slots[j].f;
            __atomic_store_n(&slots[i].tag, t, __ATOMIC_RELEASE);
            slot_unlock(&slots[i]);
            i = j;
        }
    }
    __atomic_store_n(&slots[i].tag, 0, __ATOMIC_RELEASE);
    slot_unlock(&slots[i]);
    count--;
    __atomic_store_n(&gen, g + 2, __ATOMIC_RELEASE);
}

static int expired(const struct flow *f, uint32_t now)
{
    uint32_t limit = f->closing && NICD_FIN_LINGER_S < idle_timeout ? NICD_FIN_LINGER_S : idle_timeout;
    return now - f->last_seen > limit;
}

/* Remove k's entry if it is still the connection of our ISN isn and (if idle_only) idle past
 * its timeout: the data path found it so, and hands it to the table lock. Returns 1 if removed. */
static int erase_key(const struct nicd_flow_key *k, uint32_t isn, int idle_only)
{
    int done = 0;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k);
        if (tag_at(i)) {
            slot_lock(&slots[i]);
            done = slots[i].f.isn == isn && (!idle_only || expired(&slots[i].f, now_s()));
            slot_unlock(&slots[i]);
            if (done)
                erase(i);
        }
    }
    pthread_mutex_unlock(&lock);
    return done;
}

int nicd_flows_negotiate(const struct nicd_flow_key *k, uint32_t isn, uint32_t peer_isn, uint16_t mss,
                         uint64_t owner)
{
    int rc = NICD_FLOWS_FULL;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k), now = now_s();
        if (tag_at(i)) /* a new connection of the key: the old entry and its charge go */
            erase(i), i = find(k);
        if (!owner) /* 0 marks a free owner slot: "none given" is an owner of its own */
            owner = 3ull << 32;
        uint32_t o = owner_find(owner);
        if (owners[o].owner && owners[o].n >= owner_cap) {
            rc = NICD_FLOWS_OWNER_FULL;
        } else if (count < (mask + 1) / 4 * 3) { /* at most 3/4 full: probe chains stay short */
            count++;
            slot_lock(&slots[i]);
            slots[i].f = (struct flow){.key = *k, .isn = isn, .peer_isn = peer_isn, .last_seen = now,
                                       .mss = mss, .owner = owner, .view_asked = now};
            __atomic_store_n(&slots[i].tag, tag_of(k), __ATOMIC_RELEASE); /* published whole */
            slot_unlock(&slots[i]);
            owners[o].owner = owner;
            owners[o].n++;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static void hello_refused(const struct nicd_flow_key *k);

int nicd_flows_close(const struct nicd_flow_key *k, int rst)
{
    if (rst)
        hello_refused(k);
    struct slot *s = acquire(k);
    if (!s)
        return 0;
    if (rst) {
        uint32_t isn = s->f.isn;
        slot_unlock(s);
        return erase_key(k, isn, 0);
    }
    int done = !s->f.closing;
    s->f.closing = 1;
    s->f.last_seen = now_s();
    slot_unlock(s);
    return done;
}

enum nicd_flow_state nicd_flows_egress(const struct nicd_flow_key *k, uint32_t seq, uint32_t len, uint8_t last,
                                       int fin, struct nicd_flow_info *fi)
{
    struct slot *sl = acquire(k);
    if (!sl)
        return NICD_FLOW_NONE;
    struct flow *s = &sl->f;
    uint32_t now = now_s();
    if (expired(s, now)) {
        uint32_t isn = s->isn;
        slot_unlock(sl);
        erase_key(k, isn, 1);
        return NICD_FLOW_NONE;
    }
    s->last_seen = now;
    uint32_t end = seq + len;
    uint8_t trains_gave_up = 0;
    enum nicd_flow_state st = s->raw ? NICD_FLOW_RAW : NICD_FLOW_COMPRESS;
    if (st == NICD_FLOW_RAW) {
        ; /* stays raw until it is forgotten */
    } else if (!s->sent || (int32_t)(end - s->high) > 0) { /* new data (after a resent start?) */
        uint32_t fresh = s->sent && (int32_t)(seq - s->high) < 0 ? end - s->high : len;
        s->new_bytes += fresh, s->retx_bytes += len - fresh;
        s->high = end, s->high_byte = last, s->high_fin = fin != 0, s->sent = 1;
    } else {
        if (end == s->high && fin)
            s->high_fin = 1; /* the FIN came with a resent tail */
        s->retx_bytes += len;
        if (seq != s->retx_seq || !s->retx)
            s->retx_seq = seq, s->retx = 1, s->retx_since = now;
        if (s->retx < 255)
            s->retx++;
        if (s->retx >= NICD_RETX_LIMIT && now - s->retx_since >= NICD_RETX_SECONDS) {
            s->raw = 1, st = NICD_FLOW_GIVE_UP; /* even its one-MSS (v2) resends do not get through */
        } else if (s->retx_bytes >= NICD_RETX_BYTES && (uint64_t)s->retx_bytes * 2 > s->new_bytes) {
            if (s->send_trains) /* the path drops trains, not v2's resends: v2 from here */
                s->send_trains = 0, s->retx_bytes = s->new_bytes = 0, trains_gave_up = 1;
            else
                s->raw = 1, st = NICD_FLOW_GIVE_UP;
        }
    }
    if (s->new_bytes > (1u << 30)) /* keep the ratio about recent data */
        s->new_bytes /= 2, s->retx_bytes /= 2;
    *fi = (struct nicd_flow_info){.isn = s->isn, .peer_isn = s->peer_isn, .mss = s->mss,
                                  .high = s->high, .high_byte = s->high_byte, .high_fin = s->high_fin,
                                  .view = s->view, .send_trains = s->send_trains,
                                  .trains_gave_up = trains_gave_up};
    if (!s->view.known && now - s->view_asked >= NICD_VIEW_RETRY_S)
        fi->ask_view = 1, s->view_asked = now;
    slot_unlock(sl);
    return st;
}

int nicd_flows_set_view(const struct nicd_flow_key *k, uint32_t isn, const struct nicd_flow_view *v)
{
    struct slot *s = acquire(k);
    int stored = s && s->f.isn == isn;
    if (stored)
        s->f.view = *v;
    if (s)
        slot_unlock(s);
    return stored;
}

int nicd_flows_set_trains(const struct nicd_flow_key *k, uint32_t isn)
{
    struct slot *s = acquire(k);
    int stored = s && s->f.isn == isn;
    if (stored)
        s->f.send_trains = 1;
    if (s)
        slot_unlock(s);
    return stored;
}

int nicd_flows_known(const struct nicd_flow_key *k)
{
    struct slot *s = acquire(k);
    if (s)
        slot_unlock(s);
    return s != NULL;
}

int nicd_flows_note_rewritten(const struct nicd_flow_key *k)
{
    struct slot *s = acquire(k);
    int first = s && !s->f.rewritten;
    if (first)
        s->f.rewritten = 1;
    if (s)
        slot_unlock(s);
    return first;
}

void nicd_flows_forget(const struct nicd_flow_key *k)
{
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k);
        if (tag_at(i))
            erase(i);
    }
    pthread_mutex_unlock(&lock);
}

/* ---- hellos ------------------------------------------------------------------------------- */

static struct hslot *hello_set(const struct nicd_flow_key *k)
{
    return hellos + ((uint32_t)(hash(k) >> 32) & (hello_sets - 1)) * HELLO_WAYS;
}

static struct hslot *hello_find(struct hslot *set, const struct nicd_flow_key *k)
{
    for (int w = 0; w < HELLO_WAYS; w++)
        if (set[w].h.state != NICD_HELLO_NONE && same(&set[w].key, k))
            return &set[w];
    return NULL;
}

static int hello_expired(const struct hslot *s, uint32_t now)
{
    return now - s->born > HELLO_TIMEOUT_S * 1000u;
}

/* The party a hello counts for when a full set picks its victim: our SYN's, its local user (its
 * owner); a peer's, the network as a whole (a peer's address costs nothing to spoof, so the
 * network's many owners together get no more than one local user). */
#define NETWORK UINT64_MAX

static uint64_t party(const struct nicd_hello *h)
{
    return h->state == NICD_HELLO_SENT ? h->owner : NETWORK;
}

/* Whether the way holds a hello of the group of hello h of key k: the same local user's, or the
 * same peer's to the same port of ours (a flood aimed at one port, open or closed, then leaves the
 * handshakes of the host's other services alone). */
static int same_group(const struct hslot *w, const struct nicd_flow_key *k, const struct nicd_hello *h)
{
    return w->h.owner == h->owner && party(&w->h) == party(h) && (party(h) != NETWORK || w->key.sport == k->sport);
}

/* The way of a full set that a new hello h of key k takes: the oldest hello of the party holding
 * the most ways, h's own party counted with h (so a newcomer that holds as many as anyone evicts
 * its own); a tie goes against the network first, then against h's party. Within the network the
 * same rule picks among the groups (same_group). So one user's flood of hellos pushes out only
 * its own, and parties that compete for a set share it evenly. */
static struct hslot *hello_victim(struct hslot *set, const struct nicd_flow_key *k, const struct nicd_hello *h,
                                  uint32_t now)
{
    struct hslot *victim = NULL;
    uint32_t best[3] = {0, 0, 0};
    for (int w = 0; w < HELLO_WAYS; w++) {
        const struct hslot *c = &set[w];
        uint64_t pc = party(&c->h);
        int mine = pc == party(h), own = pc == NETWORK && same_group(c, k, h);
        uint32_t ways = (uint32_t)mine, group_ways = (uint32_t)own;
        for (int v = 0; v < HELLO_WAYS; v++) {
            ways += party(&set[v].h) == pc;
            group_ways += pc == NETWORK && same_group(&set[v], &c->key, &c->h);
        }
        /* compared in order: its party's ways (then the tie's order), its group's ways within the
         * network (then h's own group first), its age */
        uint32_t score[3] = {ways * 4 + (pc == NETWORK ? 2u : (uint32_t)mine), group_ways * 2 + (uint32_t)own,
                             now - c->born};
        int i = 0;
        while (i < 2 && score[i] == best[i])
            i++;
        if (!victim || score[i] > best[i]) {
            victim = &set[w];
            memcpy(best, score, sizeof best);
        }
    }
    return victim;
}

int nicd_hello_put(const struct nicd_flow_key *k, const struct nicd_hello *h)
{
    int evicted = 0;
    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        struct hslot *set = hello_set(k), *s = hello_find(set, k);
        uint32_t now = now_ms();
        for (int w = 0; w < HELLO_WAYS && !s; w++) { /* a free way, else an expired one */
            if (set[w].h.state == NICD_HELLO_NONE)
                __atomic_fetch_add(&hello_used, 1, __ATOMIC_RELAXED), s = &set[w];
            else if (hello_expired(&set[w], now))
                s = &set[w];
        }
        if (!s) {
            s = hello_victim(set, k, h, now);
            evicted = same_group(s, k, h) ? NICD_HELLO_EVICTED_OWN : 1;
        }
        s->key = *k; /* a lookup that reads the tag this way had takes the lock, so sees it whole */
        s->h = *h;
        s->born = now;
        __atomic_store_n(&s->tag, tag_of(k), __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&hello_lock);
    return evicted;
}

/* Whether a way of k's set may hold k's hello: its tag (read without the lock; a miss is exact
 * as of the read, a hit is checked under the lock). */
static int hello_maybe(const struct nicd_flow_key *k)
{
    if (!hellos) /* set only at init and free, with no queue thread running */
        return 0;
    uint64_t t = tag_of(k);
    const struct hslot *set = hellos + ((uint32_t)(t >> 32) & (hello_sets - 1)) * HELLO_WAYS;
    for (int w = 0; w < HELLO_WAYS; w++)
        if (__atomic_load_n(&set[w].tag, __ATOMIC_ACQUIRE) == t)
            return 1;
    return 0;
}

static void hello_free_way(struct hslot *s)
{
    s->h.state = NICD_HELLO_NONE;
    __atomic_store_n(&s->tag, 0, __ATOMIC_RELEASE);
    __atomic_fetch_sub(&hello_used, 1, __ATOMIC_RELAXED);
}

int nicd_hello_get(const struct nicd_flow_key *k, struct nicd_hello *h)
{
    int found = 0;
    memset(h, 0, sizeof *h);
    if (!hello_maybe(k))
        return 0;
    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        struct hslot *s = hello_find(hello_set(k), k);
        if (s && !hello_expired(s, now_ms())) {
            *h = s->h;
            found = 1;
        }
    }
    pthread_mutex_unlock(&hello_lock);
    return found;
}

int nicd_hello_take(const struct nicd_flow_key *k, enum nicd_hello_state state, uint32_t isn)
{
    int taken = 0;
    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        struct hslot *s = hello_find(hello_set(k), k);
        if (s && s->h.state == (uint8_t)state && s->h.isn == isn) {
            hello_free_way(s);
            taken = 1;
        }
    }
    pthread_mutex_unlock(&hello_lock);
    return taken;
}

/* Our RST for k: the peer's hello that awaits our SYN-ACK will never get one. */
static void hello_refused(const struct nicd_flow_key *k)
{
    if (!nicd_hello_count() || !hello_maybe(k))
        return;
    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        struct hslot *s = hello_find(hello_set(k), k);
        if (s && s->h.state == NICD_HELLO_PEER)
            hello_free_way(s);
    }
    pthread_mutex_unlock(&hello_lock);
}

int nicd_hello_fail(const struct nicd_flow_key *k, uint32_t isn, unsigned max_tries)
{
    int removed = 0;
    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        struct hslot *s = hello_find(hello_set(k), k);
        if (s && s->h.state == NICD_HELLO_ANSWERED && s->h.isn == isn && ++s->h.tries >= max_tries) {
            hello_free_way(s);
            removed = 1;
        }
    }
    pthread_mutex_unlock(&hello_lock);
    return removed;
}

uint32_t nicd_hello_count(void)
{
    return __atomic_load_n(&hello_used, __ATOMIC_RELAXED);
}

uint32_t nicd_flows_expire(uint32_t *active, uint32_t *in_flight)
{
    uint32_t n = 0;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t now = now_s();
        for (uint32_t i = 0; i <= mask;) {
            int idle = 0;
            if (tag_at(i)) {
                slot_lock(&slots[i]);
                idle = expired(&slots[i].f, now);
                slot_unlock(&slots[i]);
            }
            if (idle) {
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

    pthread_mutex_lock(&hello_lock);
    if (hellos) {
        uint32_t now = now_ms();
        for (uint32_t i = 0; i < hello_sets * HELLO_WAYS; i++) {
            if (hellos[i].h.state != NICD_HELLO_NONE && hello_expired(&hellos[i], now))
                hello_free_way(&hellos[i]);
        }
    }
    if (in_flight)
        *in_flight = hello_used;
    pthread_mutex_unlock(&hello_lock);
    return n;
}

/* ---- for tests/test_nicd_flows.py --------------------------------------------------------- */

uint64_t nicd_flows_test_siphash(const uint8_t key[16], const uint8_t *in, size_t len)
{
    return siphash(key, in, len);
}

void nicd_flows_test_keys(const uint8_t table[16], const uint8_t nonce[16])
{
    pthread_mutex_lock(&lock);
    pthread_mutex_lock(&hello_lock);
    memcpy(table_key, table, 16);
    memcpy(nonce_key, nonce, 16);
    pthread_mutex_unlock(&hello_lock);
    pthread_mutex_unlock(&lock);
}

void nicd_flows_test_advance(uint32_t ms)
{
    __atomic_fetch_add(&clock_ahead_ms, ms, __ATOMIC_RELAXED);
}

uint32_t nicd_flows_test_owned(uint64_t owner)
{
    uint32_t n = 0;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = owner_find(owner);
        n = owners[i].owner ? owners[i].n : 0;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

int64_t nicd_flows_test_slot(const struct nicd_flow_key *k)
{
    int64_t at = -1;
    pthread_mutex_lock(&lock);
    if (slots) {
        uint32_t i = find(k);
        if (tag_at(i))
            at = i;
    }
    pthread_mutex_unlock(&lock);
    return at;
}
