/*
 * One communicator's ring: its address (INCEPTIONN_MPI_ADDR, _IFACE), its listener, the keys its
 * handshake proves (ring_handshake.c), its setup on the first call taken, and a call's run
 * through collective/ring_engine.c.
 */
#include "pmpi_internal.h"

/* The address of an interface by name, or the first address inside an IPv4 network a.b.c.d/len. */
static int addr_from_iface(const char *spec, struct in_addr *out)
{
    struct in_addr net = {0};
    int len = -1;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", spec);
    char *slash = strchr(buf, '/');
    if (slash) {
        *slash = 0;
        char *end;
        len = (int)strtol(slash + 1, &end, 10);
        if (*end || len < 0 || len > 32 || inet_pton(AF_INET, buf, &net) != 1)
            return -1;
    }
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs) != 0)
        return -1;
    int found = -1;
    for (i = ifs; i && found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if (len >= 0) {
            uint32_t mask = len ? htonl(~0u << (32 - len)) : 0;
            if ((a.s_addr & mask) != (net.s_addr & mask))
                continue;
        } else if (strcmp(i->ifa_name, spec) != 0) {
            continue;
        }
        *out = a;
        found = 0;
    }
    freeifaddrs(ifs);
    return found;
}

static int default_addr(struct in_addr *out)
{
    struct ifaddrs *ifs, *i;
    out->s_addr = htonl(INADDR_LOOPBACK);
    if (getifaddrs(&ifs) != 0)
        return 0;
    for (i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK)) {
            *out = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
            break;
        }
    }
    freeifaddrs(ifs);
    return 0;
}

/* --- sockets ---------------------------------------------------------------------------------- */

static int tag(int fd)
{
    int tos = INCEPTIONN_TOS_TAGGED;
    return setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos);
}

struct endpoint {
    uint32_t addr;   /* network order */
    uint16_t port;   /* network order */
    uint16_t ok;
    int32_t mode, k, chunk, codec;   /* settings every rank must share (compared again: a communicator may span worlds) */
    uint8_t contrib[16];      /* this rank's share of the communicator's secret, from getrandom() */
};

/* SHA-256 (libcrypto) of tag, then n bytes of data; 0, or -1 if libcrypto failed. */
static int sha256_tagged(const char *tag, size_t taglen, const void *data, size_t n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned len = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, tag, taglen) &&
             EVP_DigestUpdate(c, data, n) && EVP_DigestFinal_ex(c, out, &len) && len == 32;
    EVP_MD_CTX_free(c);
    return ok ? 0 : -1;
}

/* The ring's secret and setup id, the same on every rank: hashes of every rank's endpoint (and
 * so of every rank's random contribution), which only MPI's own channel carried. 0, or -1 if
 * libcrypto failed. */
static int ring_keys(const struct endpoint *all, int size, uint8_t secret[RING_HS_SECRET],
                     uint8_t setup_id[RING_HS_SETUP_ID])
{
    static const char tag_secret[] = "inceptionn ring secret v2", tag_setup[] = "inceptionn ring setup v2";
    _Static_assert(RING_HS_SECRET == 32 && RING_HS_SETUP_ID <= 32, "the keys are SHA-256 hashes");
    uint8_t h[32];
    size_t n = (size_t)size * sizeof *all;
    if (sha256_tagged(tag_setup, sizeof tag_setup, all, n, h) != 0 ||
        sha256_tagged(tag_secret, sizeof tag_secret, all, n, secret) != 0)
        return -1;
    memcpy(setup_id, h, RING_HS_SETUP_ID);
    return 0;
}

void close_ring(struct ring *r)
{
    if (r->send_fd >= 0)
        close(r->send_fd);
    if (r->recv_fd >= 0)
        close(r->recv_fd);
    r->send_fd = r->recv_fd = -1;
}

/* The lowest rank whose flag is 0 prints the warning with its reason; all ranks fall back. */
static int agree_ok(struct ring *r, int ok, const char *why)
{
    int first = ok ? r->size : r->rank, low = 0;
    if (PMPI_Allreduce(&first, &low, 1, MPI_INT, MPI_MIN, r->comm) != MPI_SUCCESS)
        low = -1;
    if (low == r->size)
        return 1;
    if (low == r->rank)
        say("warning: ring setup failed on rank %d of %d (%s); MPI_Allreduce on this communicator "
            "falls back to MPI's own", r->rank, r->size, why);
    return 0;
}

/* The codec and its parameters at its defaults, for the ring-ready line (held to Python's
 * get_codec by the tests), and for a codec that runs at the error bound where that came from. */
static void codec_description(char *out, size_t cap)
{
    const struct re_call call = {.error_bound = cfg.k};
    int n = snprintf(out, cap, "codec ");
    if (CODEC->describe)
        CODEC->describe(CODEC->defaults, &call, out + n, cap - (size_t)n);
    else
        snprintf(out + n, cap - (size_t)n, "%s", CODEC->name);
    n = (int)strlen(out);
    if (CODEC->wants_scaling)
        snprintf(out + n, cap - (size_t)n, " (%s)", cfg.k_from);
}

void setup(struct ring *r)
{
    char why[256] = "";
    int ok = 1, lfd = -1;
    double setup_ms = 0;
    struct in_addr self = cfg.addr;
    if (!cfg.have_addr) {
        if (cfg.iface[0]) {
            if (addr_from_iface(cfg.iface, &self) != 0) {
                snprintf(why, sizeof why, "no IPv4 address on %s", cfg.iface);
                ok = 0;
            }
        } else {
            default_addr(&self);
        }
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = self};
    socklen_t sl = sizeof sa;
    if (ok) {
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd < 0 || (cfg.mode == MODE_NIC && tag(lfd) != 0) || bind(lfd, (void *)&sa, sizeof sa) != 0 ||
            listen(lfd, 64) != 0 || getsockname(lfd, (void *)&sa, &sl) != 0) {
            snprintf(why, sizeof why, "listen on %s: %s", inet_ntoa(self), strerror(errno));
            ok = 0;
        }
    }
    struct endpoint me = {.addr = sa.sin_addr.s_addr, .port = sa.sin_port,
                          .mode = cfg.mode, .k = cfg.k, .chunk = (int32_t)cfg.chunk, .codec = cfg.codec};
    uint64_t seeds[2] = {0, 0};   /* this rank's own random streams: THC's noise, TernGrad's rounding */
    if (ok && (ring_random_bytes(me.contrib, sizeof me.contrib) != 0 ||
               ring_random_bytes((uint8_t *)seeds, sizeof seeds) != 0)) {
        snprintf(why, sizeof why, "getrandom: %s", strerror(errno));
        ok = 0;
    }
    me.ok = (uint16_t)ok;
    struct endpoint *all = calloc((size_t)r->size, sizeof *all);
    if (!all)
        ring_fail(r, "out of memory for the endpoints");
    int agreed = PMPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, r->comm) == MPI_SUCCESS;
    if (agreed) {
        /* every rank sees the same flags: the lowest rank whose listener failed tells why */
        int low = -1;
        for (int i = 0; i < r->size && low < 0; i++)
            if (!all[i].ok)
                low = i;
        for (int i = 1; i < r->size && low < 0; i++)
            if (all[i].mode != all[0].mode || all[i].k != all[0].k || all[i].chunk != all[0].chunk ||
                all[i].codec != all[0].codec) {
                low = i;
                snprintf(why, sizeof why, "its settings differ from rank 0's: mode %s/%s, codec %s/%s, error bound "
                         "%d/%d, chunk %d/%d", MODE_NAME[all[i].mode & 1], MODE_NAME[all[0].mode & 1],
                         CODEC_NAME(all[i].codec), CODEC_NAME(all[0].codec), all[i].k, all[0].k, all[i].chunk,
                         all[0].chunk);
            }
        if (low >= 0) {
            if (low == r->rank)
                say("warning: ring setup failed on rank %d of %d (%s); MPI_Allreduce on this communicator "
                    "falls back to MPI's own", r->rank, r->size, why);
            agreed = 0;
        } else {
            struct ring_hs hs = {.rank = r->rank, .size = r->size, .tagged = cfg.mode == MODE_NIC,
                                 .timeout_ms = cfg.timeout_ms, .self = self, .lfd = lfd,
                                 .left_addr = all[(r->rank + r->size - 1) % r->size].addr,
                                 .right_addr = all[(r->rank + 1) % r->size].addr,
                                 .right_port = all[(r->rank + 1) % r->size].port};
            int refused = 0;
            double t0 = now();
            if (ring_keys(all, r->size, hs.secret, hs.setup_id) != 0)
                ok = 0, snprintf(why, sizeof why, "libcrypto could not compute SHA-256");
            else
                ok = ring_handshake(&hs, &r->send_fd, &r->recv_fd, &refused, why, sizeof why) == 0;
            explicit_bzero(&hs, sizeof hs);
            setup_ms = 1e3 * (now() - t0);
            if (ok && refused && cfg.log)
                say("ring setup: %d connection(s) to the ring's listener refused (not the left neighbour's, or not "
                    "proven)", refused);
            agreed = agree_ok(r, ok, why);
        }
    } else {
        say("warning: ring setup failed: PMPI_Allgather of the endpoints failed; MPI_Allreduce falls back to MPI's own");
    }
    explicit_bzero(all, (size_t)r->size * sizeof *all);   /* the shares make the secret */
    free(all);
    if (lfd >= 0)
        close(lfd);
    if (!agreed) {
        close_ring(r);
        r->state = RING_FALLBACK;
        return;
    }
    r->state = RING_READY;
    r->noise_seed = seeds[0];
    explicit_bzero(seeds, sizeof seeds);
    if (cfg.log) {
        char codec[256];
        codec_description(codec, sizeof codec);
        say("ring ready: %d ranks, mode %s, %s:%u, min count %ld, %s%s, handshake %.1f ms", r->size,
            MODE_NAME[cfg.mode], inet_ntoa(self), ntohs(me.port), cfg.min_count, codec,
            cfg.feedback ? ", error feedback" : "", setup_ms);
    }
}

/* --- the ring: collective/ring_engine.c, this communicator's sockets and settings -------------- */

void ring_fail(struct ring *r, const char *what)
{
    say("error: MPI_Allreduce ring (%d ranks, mode %s, codec %s) failed: %s; aborting the job (a partial result is "
        "never returned)", r->size, MODE_NAME[cfg.mode], CODEC->name, what);
    PMPI_Abort(r->comm, 1);
    _exit(1);
}

/* The codec's parameters for a call (its begin): the agreement first for a codec that needs one
 * (thc.py: local_stat, agree; collective/pipeline.py agree_codec): the max over ranks of its
 * local_stat of x (compensated already), one PMPI_Allreduce(MAX) of a double, so every rank holds
 * the same bits; the round from the ring's call number, which every rank counts alike; this rank's
 * own random seed. Returns 0, or 1 when the codec cannot encode this call (every rank sees the same
 * agreed value and so decides the same). */
static int codec_begin(struct ring *r, const float *x, size_t n, size_t block)
{
    struct re_call call = {.ranks = r->size, .error_bound = cfg.k, .block = block, .round = r->rounds,
                           .seed = r->noise_seed};
    if (CODEC->local_stat) {
        double mine = CODEC->local_stat(x, n);
        if (PMPI_Allreduce(&mine, &call.shared, 1, MPI_DOUBLE, MPI_MAX, r->comm) != MPI_SUCCESS)
            ring_fail(r, "agreeing the codec's statistic: PMPI_Allreduce failed");
    }
    return CODEC->begin ? CODEC->begin(r->codec_state, &call) : 0;
}

/* Sum x[0..n) over the ring in place (lost: the residual of error feedback, or NULL: added to x
 * first, then refilled) with the configured codec. Returns 0, or 1 when the call went to
 * PMPI_Allreduce instead (THC, a non-finite value on some rank: every rank decides the same; the
 * residual is then spent, nothing was lost). A failure aborts the job. A broken connection is
 * most often the echo of another rank's abort: give mpirun the time to end this rank quietly
 * first, so the job shows the first cause only; a peer that really died is still reported a
 * moment later. */
int ring_allreduce(struct ring *r, float *x, size_t n, float *lost)
{
    struct re_codec codec;
    r->rounds++;
    if (!r->codec_state) {
        if (!(r->codec_state = malloc(CODEC->state_size ? CODEC->state_size : 1)))
            ring_fail(r, "out of memory for the codec's state");
        if (CODEC->state_size)
            memcpy(r->codec_state, CODEC->defaults, CODEC->state_size);
    }
    if (lost)
        re_compensate(x, lost, n);     /* error feedback: what the receivers did not get last time */
    /* a codec that is not per value encodes one whole ring block at a time (Group's _chunk): one
     * chunk holds the largest block */
    size_t chunk = CODEC->per_value ? (size_t)cfg.chunk : n / (size_t)r->size + 1;
    if (codec_begin(r, x, n, chunk)) {
        if (PMPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, r->comm) != MPI_SUCCESS)
            ring_fail(r, "PMPI_Allreduce of a call the codec cannot encode failed");
        if (lost)
            memset(lost, 0, n * sizeof *lost);
        return 1;
    }
    CODEC->make(&codec, r->codec_state);
    const struct re_ring rr = {.rank = r->rank, .size = r->size, .send_fd = r->send_fd, .recv_fd = r->recv_fd,
                               .timeout_ms = cfg.timeout_ms, .chunk = chunk, .codec = &codec, .headroom = cfg.headroom,
                               .tp = cfg.mode == MODE_NIC ? &re_transport_nic : &re_transport_app};
    char err[256];
    struct re_stats stats = {0};
    int st = re_allreduce(&rr, x, n, lost, &stats, err, sizeof err);
    if (st == RE_OK) {
        /* the blocks this rank sent (docs/collectives.md, "The ring"): (rank - j) mod N, j < 2N - 2 */
        double floats = 0;
        size_t N = (size_t)r->size;
        for (size_t j = 0; j + 2 < 2 * N; j++) {
            size_t b = ((size_t)r->rank + N - j % N) % N;
            floats += (double)((b + 1) * n / N - b * n / N);
        }
        pthread_mutex_lock(&g_mu);
        g_stats.wire_bytes += (double)stats.bytes_sent;
        g_stats.float_bytes += 4 * floats;
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    if (st == RE_E_PEER)
        sleep(5);
    ring_fail(r, err);
}
