/*
 * MPI_Allreduce through the INCEPTIONN ring, for unmodified MPI programs (PMPI interposition;
 * settings in pmpi_allreduce.h, design in docs/mpi-allreduce.md).
 *
 * A call is taken when datatype is MPI_FLOAT (or a 4-byte MPI_REAL), op is MPI_SUM, the
 * communicator is an intracommunicator of 2 or more ranks and count >= the threshold: only
 * arguments MPI requires to be equal on every rank, so every rank takes the same calls. Everything
 * else goes to PMPI_Allreduce as it came.
 *
 * In MPI_Init the ranks compare the settings that decide which calls are taken (agree_settings;
 * in nic mode with the soft NIC's bound): any difference turns the library off on every rank.
 * Per communicator, on the first call taken: a listener, its endpoint and a random share of the
 * ring's secret exchanged with PMPI_Allgather, a connection to the right neighbour (tagged 0x28
 * before connect() in nic mode) and one accepted from the left, both proven in ring_handshake.c,
 * agreed with PMPI_Allreduce(MIN); any failure on any rank makes every rank pass that
 * communicator's calls to PMPI_Allreduce from then on (one warning line). After each taken call
 * the ranks compare a hash of the result and abort the job if it differs (check_result).
 * The ring itself is collective/ring_engine.c (its schedule, transports and wire are described in
 * docs/collectives.md, "The ring engine" and "Wire format v2"): nic mode runs its tagged
 * transport with the INCEPTIONN codec at the agreed error bound, app mode its codec transport
 * with the configured codec (any of the codec table's with a ring codec in C; a codec that needs
 * agreement agrees before each call, codec_begin). Every rank ends bit-identical; with INCEPTIONN equal bit for bit to
 * collective.Group.allreduce(compress="nic"/"app") on the same inputs.
 * Error feedback (on by default) keeps per (communicator, count) what this rank's receivers lost and adds
 * it to the next such call (struct residual).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <ifaddrs.h>
#include <math.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "blockscale_codec.h"
#include "inceptionn_codec.h"
#include "inceptionn_contract.h"
#include "log_line.h"
#include "nicd_bound.h"
#include "pmpi_allreduce.h"
#include "ring_engine.h"
#include "ring_handshake.h"

#define EXPORT __attribute__((visibility("default")))

enum { MODE_APP = 0, MODE_NIC = 1 };
static const char *const MODE_NAME[] = {"app", "nic"};

/* The codec (INCEPTIONN_MPI_CODEC): one of the codec table's (codecs_c/codec_table.h, by
 * get_codec's names) that has a ring codec in C, at get_codec(name)'s defaults (its description's),
 * with its traits deciding as in collective.Group: a per-value codec is scaled (wire format v2)
 * and cut into pipeline chunks, the others encode one whole ring block per call, their per-tensor
 * unit. cfg.codec is its index in re_codecs. */
#define CODEC (re_codecs[cfg.codec])
static int codec_count(void)
{
    int n = 0;
    while (re_codecs[n])
        n++;
    return n;
}
#define CODEC_NAME(c) ((c) >= 0 && (c) < codec_count() ? re_codecs[c]->name : "?")

/* The codecs the library runs (nic 0) or the soft NIC runs (nic 1), for an error line:
 * "inceptionn, thc, 3lc or terngrad". */
static const char *codec_choices(int nic)
{
    static char out[2][256];
    size_t n = 0;
    int runs = 0, seen = 0;
    for (int i = 0; re_codecs[i]; i++)
        runs += nic ? re_codecs[i]->nic : re_codecs[i]->app;
    out[nic][0] = 0;
    for (int i = 0; re_codecs[i] && n < sizeof out[nic]; i++)
        if (nic ? re_codecs[i]->nic : re_codecs[i]->app)
            n += (size_t)snprintf(out[nic] + n, sizeof out[nic] - n, "%s%s",
                                  seen++ ? (seen == runs ? " or " : ", ") : "", re_codecs[i]->name);
    return out[nic];
}

static struct {
    int mode, codec, k, log, timeout_ms, feedback;
    int headroom;             /* INCEPTIONN_MPI_HEADROOM: bits the scaled wire gives up for ratio (ring_engine.h) */
    long min_count, chunk;
    struct in_addr addr;
    int have_addr;            /* from INCEPTIONN_MPI_ADDR or _IFACE (else chosen at setup) */
    char iface[64];
    char nicd_socket[108];    /* nic mode: the local soft NIC's stats socket, %h expanded */
    char k_from[160];         /* where cfg.k came from, for the log */
    int choose;               /* INCEPTIONN_MPI_CHOOSE: CHOOSE_AUTO, CHOOSE_RING or CHOOSE_MPI */
    int probe_inject;         /* INCEPTIONN_MPI_PROBE_TIMES given (tests): probe_ms replaces the measured times */
    double probe_ms[2];       /* the ring's, MPI's own */
} cfg;

enum { CHOOSE_AUTO = 0, CHOOSE_RING, CHOOSE_MPI, CHOOSE_COUNT };
static const char *const CHOOSE_NAME[CHOOSE_COUNT] = {"auto", "ring", "mpi"};

/* The settings every rank must share, agreed over MPI_COMM_WORLD in MPI_Init (agree_settings):
 * until then (MPI_Init never seen) and after a mismatch nothing is taken. */
enum { AGREE_UNSEEN = 0, AGREE_OK, AGREE_OFF };
static int g_agree = AGREE_UNSEEN;

/* Error feedback (on by default; INCEPTIONN_MPI_ERROR_FEEDBACK=0 turns it off): what this rank's receivers did not get in the last call of
 * the same count on the same communicator, added to the next one. Keyed by (communicator, count),
 * not by buffer: see docs/mpi-allreduce.md. At most INC_MPI_EF_MAX_KEYS per communicator, the
 * least recently used dropped. */
struct residual {
    size_t n;
    unsigned long used;       /* the ring's call number when last used (LRU) */
    float *lost;              /* n values, unscaled */
    int owed;                 /* a ring call refilled lost since a call of MPI's own spent it */
    struct residual *next;
};

/* INCEPTIONN_MPI_CHOOSE=auto: one count class [2^c, 2^(c+1)) on one communicator. MPI orders the
 * collectives on a communicator, so every rank counts the class's calls alike and makes the same
 * calls probe calls; a round's decision is taken from the max over ranks of the measured times,
 * so every rank takes the same path (the paths give different results). */
struct choice {
    unsigned long calls;      /* calls of this class so far */
    unsigned long next_round; /* the call that starts the next probe round (0: the first call) */
    unsigned long interval;   /* calls from the last decision to next_round */
    int samples;              /* probe calls of this round done */
    int use_mpi;              /* the decision: MPI's own, or the ring (also before the first) */
    double ring_s[INC_MPI_PROBE_CALLS], mpi_s[INC_MPI_PROBE_CALLS];   /* this rank's, this round */
    float *copy;              /* a probe call's input, which MPI's own sums beside the ring */
    size_t copy_cap;
};

/* One communicator's ring. Calls on it are serialized by mu (MPI_THREAD_MULTIPLE programs). */
enum { RING_NEW = 0, RING_READY, RING_FALLBACK, RING_CLOSED };
struct ring {
    pthread_mutex_t mu;
    int state, rank, size, send_fd, recv_fd;
    MPI_Comm comm;
    unsigned long calls;
    struct residual *residuals;
    struct choice choice[INC_MPI_CHOICE_CLASSES];   /* by count class (auto) */
    int foreign;              /* holds processes of another MPI_COMM_WORLD: never taken */
    uint64_t rounds;          /* taken calls so far: THC's round number (every rank counts the same) */
    uint64_t noise_seed;      /* this rank's own, from getrandom() at setup: THC's rounding noise */
    void *codec_state;        /* the codec's state, from its defaults at the first call (its random stream's position) */
    struct ring *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_keyval = MPI_KEYVAL_INVALID;
static struct ring *g_rings;
static struct {
    unsigned long taken, passed, ef_dropped;
    double taken_bytes, passed_bytes, seconds, ef_bytes;   /* ef_bytes: residual memory held now */
    double check_seconds, hash_seconds;   /* comparing the results across ranks (check_result), hashing */
    double wire_bytes, float_bytes;       /* the ring's payload bytes this rank sent, and as float32 */
} g_stats;

/* --- output: one write() per line ------------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[512];
    int wr = -1;
    if (PMPI_Initialized(&wr) == MPI_SUCCESS && wr) {
        int fin = 0;
        PMPI_Finalized(&fin);
        if (!fin)
            PMPI_Comm_rank(MPI_COMM_WORLD, &wr);
        else
            wr = -1;
    } else {
        wr = -1;
    }
    int n = wr >= 0 ? snprintf(line, sizeof line, "inceptionn-mpi[rank %d]: ", wr)
                    : snprintf(line, sizeof line, "inceptionn-mpi[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    size_t len = log_line_finish(line, sizeof line, n, fmt, ap);
    va_end(ap);
    ssize_t w = write(2, line, len);
    (void)w;
}

/* --- settings --------------------------------------------------------------------------------- */

static long env_long(const char *name, long def, long lo, long hi, const char *what)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        say("error: bad %s '%.40s': %s", name, v, what);
        _exit(2);
    }
    return x;
}

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

__attribute__((constructor)) static void load_settings(void)
{
    const char *m = getenv("INCEPTIONN_MPI_MODE");
    if (!m || !*m || !strcmp(m, "app"))
        cfg.mode = MODE_APP;
    else if (!strcmp(m, "nic"))
        cfg.mode = MODE_NIC;
    else {
        say("error: bad INCEPTIONN_MPI_MODE '%.40s': use nic or app", m);
        _exit(2);
    }
    const char *cn = getenv("INCEPTIONN_MPI_CODEC");
    const struct re_codec_desc *d = !cn || !*cn ? re_codecs[0] : re_codec_named(cn);   /* the list's first: the default */
    if (d && !d->app) {
        say("error: INCEPTIONN_MPI_CODEC %s: the %s codec runs through the Python API only (collective.Group, the "
            "DDP hook), not in the MPI library; use %s", d->name, d->name, codec_choices(0));
        _exit(2);
    }
    if (!d) {
        say("error: bad INCEPTIONN_MPI_CODEC '%.40s': use %s", cn, codec_choices(0));
        _exit(2);
    }
    for (cfg.codec = 0; re_codecs[cfg.codec] != d; cfg.codec++)
        ;
    if (cfg.mode == MODE_NIC && !d->nic) {
        say("error: INCEPTIONN_MPI_MODE nic runs only the %s codec (the soft NIC's); INCEPTIONN_MPI_CODEC %s needs "
            "INCEPTIONN_MPI_MODE app", codec_choices(1), d->name);
        _exit(2);
    }
    cfg.min_count = env_long("INCEPTIONN_MPI_MIN_COUNT", INC_MPI_DEFAULT_MIN_COUNT, 1, INT32_MAX,
                             "a number of values, at least 1");
    cfg.k = (int)env_long("INCEPTIONN_MPI_ERROR_BOUND", INCEPTIONN_DEFAULT_ERROR_BOUND, INC_MIN_ERROR_BOUND,
                          INC_MAX_ERROR_BOUND, "use -30..-1 (nicd --error-bound)");
    cfg.chunk = env_long("INCEPTIONN_MPI_CHUNK", INC_MPI_DEFAULT_CHUNK, 8, 1 << 24,
                         "values per chunk, 8..16777216");
    cfg.timeout_ms = 1000 * (int)env_long("INCEPTIONN_MPI_TIMEOUT", INC_MPI_DEFAULT_TIMEOUT, 1, 86400,
                                          "seconds, 1..86400");
    cfg.log = (int)env_long("INCEPTIONN_MPI_LOG", 0, 0, 1, "use 0 or 1");
    cfg.headroom = (int)env_long("INCEPTIONN_MPI_HEADROOM", BS_HEADROOM, 0, BS_MAX_HEADROOM,
                                 "bits of precision given up, 0..24");
    cfg.feedback = (int)env_long("INCEPTIONN_MPI_ERROR_FEEDBACK", CODEC->wants_error_feedback, 0, 1,
                                 "use 0 or 1");
    const char *ns = getenv("INCEPTIONN_MPI_NICD_SOCKET");
    if (!ns || !*ns)
        ns = INCEPTIONN_NICD_SOCKET;
    if (strlen(ns) >= sizeof cfg.nicd_socket || ns[0] != '/') {
        say("error: bad INCEPTIONN_MPI_NICD_SOCKET '%.40s': an absolute path (%%h: the host name), under %zu bytes", ns,
            sizeof cfg.nicd_socket);
        _exit(2);
    }
    snprintf(cfg.nicd_socket, sizeof cfg.nicd_socket, "%s", ns);
    snprintf(cfg.k_from, sizeof cfg.k_from, "configured");
    const char *a = getenv("INCEPTIONN_MPI_ADDR"), *f = getenv("INCEPTIONN_MPI_IFACE");
    if (a && *a) {
        if (inet_pton(AF_INET, a, &cfg.addr) != 1) {
            say("error: bad INCEPTIONN_MPI_ADDR '%.40s': an IPv4 address", a);
            _exit(2);
        }
        cfg.have_addr = 1;
    } else if (f && *f) {
        snprintf(cfg.iface, sizeof cfg.iface, "%s", f);  /* resolved at setup (interfaces may come later) */
    }
    const char *ch = getenv("INCEPTIONN_MPI_CHOOSE");
    cfg.choose = -1;
    for (int i = 0; i < CHOOSE_COUNT && cfg.choose < 0; i++)
        if (!ch || !*ch ? i == CHOOSE_AUTO : !strcmp(ch, CHOOSE_NAME[i]))
            cfg.choose = i;
    if (cfg.choose < 0) {
        say("error: bad INCEPTIONN_MPI_CHOOSE '%.40s': use auto, ring or mpi", ch);
        _exit(2);
    }
    const char *pt = getenv("INCEPTIONN_MPI_PROBE_TIMES");
    if (pt && *pt) {
        char *end = NULL;
        cfg.probe_ms[0] = strtod(pt, &end);
        if (end && *end == ',')
            cfg.probe_ms[1] = strtod(end + 1, &end);
        else
            end = NULL;
        if (!end || *end || !(cfg.probe_ms[0] >= 0 && cfg.probe_ms[0] <= 1e9) ||
            !(cfg.probe_ms[1] >= 0 && cfg.probe_ms[1] <= 1e9)) {
            say("error: bad INCEPTIONN_MPI_PROBE_TIMES '%.40s': RING_MS,MPI_MS (tests only), each 0..1e9", pt);
            _exit(2);
        }
        cfg.probe_inject = 1;
    }
}

static void ring_fail(struct ring *r, const char *what) __attribute__((noreturn));

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

static void close_ring(struct ring *r)
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

static double now(void);

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

static void setup(struct ring *r)
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

/* --- error feedback memory ---------------------------------------------------------------------- */

/* The residual memory figures of the summary line, under one lock. */
static void count_residuals(double bytes, unsigned long dropped)
{
    pthread_mutex_lock(&g_mu);
    g_stats.ef_bytes += bytes;
    g_stats.ef_dropped += dropped;
    pthread_mutex_unlock(&g_mu);
}

static void free_residual(struct residual *e)
{
    free(e->lost);
    free(e);
}

/* The residual of (this communicator, n), made (zero) if new; NULL when out of memory (the call
 * then runs without error feedback). The least recently used beyond INC_MPI_EF_MAX_KEYS goes. */
static struct residual *residual_for(struct ring *r, size_t n)
{
    struct residual **p, *e, **oldest = NULL;
    int keys = 0;
    double freed = 0;
    unsigned long dropped = 0;
    r->calls++;
    for (p = &r->residuals; (e = *p); p = &e->next, keys++) {
        if (e->n == n) {
            e->used = r->calls;
            return e;
        }
        if (!oldest || e->used < (*oldest)->used)
            oldest = p;
    }
    if (keys >= INC_MPI_EF_MAX_KEYS) {
        e = *oldest;
        *oldest = e->next;
        freed = (double)e->n * sizeof(float);
        dropped = 1;
        free_residual(e);
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->lost = calloc(n, sizeof(float)))) {
        free(e);
        count_residuals(-freed, dropped);
        return NULL;
    }
    e->n = n;
    e->used = r->calls;
    e->next = r->residuals;
    r->residuals = e;
    count_residuals((double)n * sizeof(float) - freed, dropped);
    return e;
}

/* --- communicator attribute: set up once, torn down on MPI_Comm_free and at MPI_Finalize ----- */

static int delete_ring(MPI_Comm comm, int keyval, void *value, void *extra)
{
    (void)comm, (void)keyval, (void)extra;
    struct ring *r = value;
    pthread_mutex_lock(&g_mu);
    for (struct ring **p = &g_rings; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&r->mu);
    close_ring(r);
    for (int c = 0; c < INC_MPI_CHOICE_CLASSES; c++)
        free(r->choice[c].copy);
    double freed = 0;
    while (r->residuals) {
        struct residual *e = r->residuals;
        r->residuals = e->next;
        freed += (double)e->n * sizeof(float);
        free_residual(e);
    }
    count_residuals(-freed, 0);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    free(r->codec_state);
    free(r);
    return MPI_SUCCESS;
}

/* Whether comm holds a process outside this MPI_COMM_WORLD (MPI_Comm_spawn, connect/accept and a
 * merged intercommunicator): the processes of another world agreed their settings among
 * themselves, not with us, so the threshold could differ; every member sees some process of
 * another world, so all of them pass its calls through. */
static int spans_worlds(MPI_Comm comm, int size)
{
    MPI_Group g, w;
    int *in = malloc((size_t)size * sizeof *in), *out = malloc((size_t)size * sizeof *out), foreign = 1;
    if (in && out && PMPI_Comm_group(comm, &g) == MPI_SUCCESS) {
        if (PMPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS) {
            for (int i = 0; i < size; i++)
                in[i] = i;
            if (PMPI_Group_translate_ranks(g, size, in, w, out) == MPI_SUCCESS) {
                foreign = 0;
                for (int i = 0; i < size; i++)
                    foreign |= out[i] == MPI_UNDEFINED;
            }
            PMPI_Group_free(&w);
        }
        PMPI_Group_free(&g);
    }
    free(in);
    free(out);
    return foreign;
}

static struct ring *ring_for(MPI_Comm comm, int size)
{
    struct ring *r = NULL;
    int found = 0;
    pthread_mutex_lock(&g_mu);
    if (g_keyval == MPI_KEYVAL_INVALID &&
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_ring, &g_keyval, NULL) != MPI_SUCCESS)
        g_keyval = MPI_KEYVAL_INVALID;
    if (g_keyval != MPI_KEYVAL_INVALID && PMPI_Comm_get_attr(comm, g_keyval, &r, &found) == MPI_SUCCESS && !found) {
        r = calloc(1, sizeof *r);
        if (r) {
            pthread_mutex_init(&r->mu, NULL);
            r->send_fd = r->recv_fd = -1;
            r->size = size;
            r->comm = comm;
            r->foreign = spans_worlds(comm, size);
            PMPI_Comm_rank(comm, &r->rank);
            if (PMPI_Comm_set_attr(comm, g_keyval, r) == MPI_SUCCESS) {
                r->next = g_rings;
                g_rings = r;
            } else {
                free(r);
                r = NULL;
            }
        }
    } else if (!found) {
        r = NULL;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* --- the ring: collective/ring_engine.c, this communicator's sockets and settings -------------- */

static void ring_fail(struct ring *r, const char *what)
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
static int ring_allreduce(struct ring *r, float *x, size_t n, float *lost)
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
                               .tp = cfg.mode == MODE_NIC ? &re_transport_tagged : &re_transport_codec};
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

/* --- settings every rank shares: agreed once, in MPI_Init ------------------------------------- */

struct shared_settings {
    int32_t version, mode, k, chunk, k_from_nicd, bad, codec, headroom;
    int64_t min_count;
    int32_t choose, pad2;     /* INCEPTIONN_MPI_CHOOSE: ranks that choose differently would hang */
    char why[160];            /* bad: why this rank cannot state its settings */
};

/* tmpl with every %h replaced by this host's name (testbed hosts share one filesystem) */
static void expand_host(char *out, size_t cap, const char *tmpl)
{
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    size_t n = 0;
    for (const char *t = tmpl; *t && n + 1 < cap; t++) {
        if (t[0] == '%' && t[1] == 'h') {
            n += (size_t)snprintf(out + n, cap - n, "%s", host);
            n = n < cap ? n : cap - 1;
            t++;
        } else {
            out[n++] = *t;
        }
    }
    out[n] = 0;
}

static void describe_settings(char *out, size_t cap, const struct shared_settings *s)
{
    snprintf(out, cap, "mode %s, min count %lld, error bound %d%s, chunk %d, codec %s, headroom %d, version %d",
             MODE_NAME[s->mode & 1], (long long)s->min_count, s->k, s->k_from_nicd ? " (its soft NIC's)" : "", s->chunk,
             CODEC_NAME(s->codec), s->headroom, s->version);
}

/* Every rank states its settings (in nic mode with the bound its soft NIC runs) and all compare
 * them: one PMPI_Allgather over MPI_COMM_WORLD. Any difference, or a rank that cannot say, turns
 * the library off on every rank (each prints the same line): every call is then MPI's own. */
static void agree_settings(void)
{
    struct shared_settings me = {.version = INC_MPI_SETTINGS_VERSION, .mode = cfg.mode, .chunk = (int32_t)cfg.chunk,
                                 .codec = cfg.codec, .min_count = cfg.min_count, .headroom = cfg.headroom};
    if (cfg.mode == MODE_NIC) {
        char path[256];
        int k = 0;
        expand_host(path, sizeof path, cfg.nicd_socket);
        int st = nicd_error_bound(path, &k, me.why, sizeof me.why);
        if (st == 1 && (k < INC_MIN_ERROR_BOUND || k > INC_MAX_ERROR_BOUND)) {
            snprintf(me.why, sizeof me.why, "the soft NIC at %.80s runs error bound %d, outside %d..%d", path, k,
                     INC_MIN_ERROR_BOUND, INC_MAX_ERROR_BOUND);
            st = -1;
        }
        if (st == 1) {
            cfg.k = k;
            snprintf(cfg.k_from, sizeof cfg.k_from, "the soft NIC's");
            me.k_from_nicd = 1;
        } else if (st < 0) {
            me.bad = 1;
        } else {
            snprintf(cfg.k_from, sizeof cfg.k_from, "configured; no soft NIC answers at %.100s", path);
        }
    }
    me.k = cfg.k;
    me.choose = cfg.choose;
    int size = 0, rank = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    struct shared_settings *all = calloc((size_t)size, sizeof *all);
    if (!all) {
        say("error: out of memory agreeing the MPI_Allreduce library's settings; aborting the job");
        PMPI_Abort(MPI_COMM_WORLD, 1);
        _exit(1);
    }
    if (PMPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS) {
        say("warning: the MPI_Allreduce library is off: PMPI_Allgather of the settings failed; every MPI_Allreduce is "
            "MPI's own");
        g_agree = AGREE_OFF;
        free(all);
        return;
    }
    char line[400] = "";
    for (int i = 0; i < size && !line[0]; i++) {
        all[i].why[sizeof all[i].why - 1] = 0;
        if (all[i].bad) {
            snprintf(line, sizeof line, "rank %d cannot state its settings (%s)", i, all[i].why);
        } else if (i && (all[i].version != all[0].version || all[i].mode != all[0].mode || all[i].k != all[0].k ||
                         all[i].chunk != all[0].chunk || all[i].codec != all[0].codec ||
                         all[i].headroom != all[0].headroom || all[i].min_count != all[0].min_count)) {
            char a[160], b[160];
            describe_settings(a, sizeof a, &all[i]);
            describe_settings(b, sizeof b, &all[0]);
            snprintf(line, sizeof line, "rank %d's settings differ from rank 0's (%s; rank 0: %s)", i, a, b);
        }
    }
    for (int i = 1; i < size && !line[0]; i++)
        if (all[i].choose != all[0].choose)
            snprintf(line, sizeof line, "rank %d's INCEPTIONN_MPI_CHOOSE %s differs from rank 0's %s", i,
                     CHOOSE_NAME[(unsigned)all[i].choose % CHOOSE_COUNT], CHOOSE_NAME[(unsigned)all[0].choose % CHOOSE_COUNT]);
    free(all);
    if (line[0]) {
        say("warning: the MPI_Allreduce library is off for this job: %s; every MPI_Allreduce is MPI's own", line);
        g_agree = AGREE_OFF;
    } else {
        g_agree = AGREE_OK;
    }
}

/* --- the result check: every rank's result must be the same bits ------------------------------ */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* A 64-bit hash of n floats' bits: four lanes of a bijective step per 8-byte word (one differing
 * word always changes its lane's state), combined at the end. Not keyed: it compares replicas,
 * whose bits only this process wrote. */
static uint64_t result_hash(const float *x, size_t n)
{
    const uint64_t P = 0x9e3779b185ebca87ULL;
    uint64_t h[4] = {P, ~P, P * 3, ~(P * 3)};
    const uint8_t *b = (const void *)x;
    size_t bytes = n * sizeof(float), i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * (size_t)j, 8);
            h[j] = (h[j] ^ w) * P;
            h[j] ^= h[j] >> 29;
        }
    for (; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, b + i, 4);
        h[0] = (h[0] ^ w) * P;
        h[0] ^= h[0] >> 29;
    }
    return mix64(h[0] ^ (h[1] << 17 | h[1] >> 47) ^ (h[2] << 31 | h[2] >> 33) ^ (h[3] << 47 | h[3] >> 17) ^ bytes);
}

/* One PMPI_Allreduce(MAX) of (h, ~h): max h == min h iff every rank's result is the same bits.
 * A soft NIC whose bound changed mid-job (SIGHUP) makes replicas differ: the job ends here, before
 * any rank returns the result. Rank 0 says why; the others wait for mpirun to end them. */
static void check_result(struct ring *r, const float *x, size_t n, double *hash_s)
{
    double t0 = now();
    uint64_t h = result_hash(x, n), v[2] = {h, ~h}, m[2] = {0, 0};
    *hash_s = now() - t0;
    if (PMPI_Allreduce(v, m, 2, MPI_UINT64_T, MPI_MAX, r->comm) != MPI_SUCCESS)
        ring_fail(r, "comparing the result across ranks: PMPI_Allreduce failed");
    if (m[0] == ~m[1])
        return;
    if (r->rank == 0)
        say("error: MPI_Allreduce ring (%d ranks, mode %s, codec %s, error bound %d) gave different results on different "
            "ranks (a soft NIC's error bound changed during the job? a reload with SIGHUP does that); aborting the job "
            "before any rank returns it", r->size, MODE_NAME[cfg.mode], CODEC->name, cfg.k);
    else
        sleep(2);
    PMPI_Abort(r->comm, 1);
    _exit(1);
}

/* --- the ring or MPI's own, per communicator and count class (INCEPTIONN_MPI_CHOOSE) ---------- */

/* What the summary says per count class, over every communicator: the calls of each path and the
 * last decision with its agreed times. */
static struct {
    unsigned long ring_calls, mpi_calls, rounds;
    int use_mpi;
    double ring_s, mpi_s;
} g_choice[INC_MPI_CHOICE_CLASSES];

static int count_class(int count)
{
    return 31 - __builtin_clz((unsigned)count);     /* count >= the threshold >= 1 */
}

/* auto: the first INC_MPI_PROBE_CALLS calls of a class, and a round of as many every interval */
static int probing(const struct choice *ch)
{
    return cfg.choose == CHOOSE_AUTO && ch->calls >= ch->next_round;
}

/* MPI's own on the probe call's input (its result is dropped: the call returns the ring's), after a
 * barrier, as the ring's run starts after one: neither path pays for the ranks' arrival skew. */
static double probe_mpi(struct ring *r, struct choice *ch, size_t n)
{
    if (PMPI_Barrier(r->comm) != MPI_SUCCESS)
        ring_fail(r, "a probe's PMPI_Barrier failed");
    double t0 = now();
    if (PMPI_Allreduce(MPI_IN_PLACE, ch->copy, (int)n, MPI_FLOAT, MPI_SUM, r->comm) != MPI_SUCCESS)
        ring_fail(r, "a probe's PMPI_Allreduce failed");
    return now() - t0;
}

/* A probe call's start: its input copied for MPI's own, which runs first on every other probe (the
 * order alternates); then the barrier the ring starts after. Returns MPI's time, or -1: not yet. */
static double probe_start(struct ring *r, struct choice *ch, const void *input, size_t n)
{
    if (ch->copy_cap < n) {
        free(ch->copy);
        ch->copy_cap = 0;
        if (!(ch->copy = malloc(n * sizeof(float))))
            ring_fail(r, "out of memory for a probe call's copy of the input");
        ch->copy_cap = n;
    }
    memcpy(ch->copy, input, n * sizeof(float));
    double mpi_s = ch->samples % 2 == 0 ? probe_mpi(r, ch, n) : -1;
    if (PMPI_Barrier(r->comm) != MPI_SUCCESS)
        ring_fail(r, "a probe's PMPI_Barrier failed");
    return mpi_s;
}

/* The end of a probe round: the max over ranks of every time (one PMPI_Allreduce of doubles, on
 * probe calls only), the best of the round's calls per path, the faster path for the class. */
static void decide(struct ring *r, struct choice *ch, int c)
{
    enum { P = INC_MPI_PROBE_CALLS };
    double mine[2 * P], all[2 * P];
    memcpy(mine, ch->ring_s, sizeof ch->ring_s);
    memcpy(mine + P, ch->mpi_s, sizeof ch->mpi_s);
    if (PMPI_Allreduce(mine, all, 2 * P, MPI_DOUBLE, MPI_MAX, r->comm) != MPI_SUCCESS)
        ring_fail(r, "agreeing the probe calls' times: PMPI_Allreduce failed");
    double ring = all[0], mpi = all[P];
    for (int k = 1; k < P; k++) {
        ring = fmin(ring, all[k]);
        mpi = fmin(mpi, all[P + k]);
    }
    ch->use_mpi = mpi < ring;
    ch->samples = 0;
    ch->interval = ch->interval ? (ch->interval < INC_MPI_REPROBE_MAX / 2 ? 2 * ch->interval : INC_MPI_REPROBE_MAX)
                                : INC_MPI_REPROBE_FIRST;
    ch->next_round = ch->calls + ch->interval;
    free(ch->copy);
    ch->copy = NULL;
    ch->copy_cap = 0;
    pthread_mutex_lock(&g_mu);
    g_choice[c].rounds++;
    g_choice[c].use_mpi = ch->use_mpi;
    g_choice[c].ring_s = ring;
    g_choice[c].mpi_s = mpi;
    pthread_mutex_unlock(&g_mu);
    if (cfg.log)
        say("chose %s for counts %ld-%ld on %d ranks: ring %.3f ms, MPI's own %.3f ms (the slowest rank's, best of %d "
            "probe calls); next probe round in %lu calls", ch->use_mpi ? "MPI's own" : "the ring", 1L << c,
            (2L << c) - 1, r->size, 1e3 * ring, 1e3 * mpi, P, ch->interval);
}

/* After a call of a class on the ring: count it; on a probe call, MPI's own if it did not run
 * first, this rank's times (or INCEPTIONN_MPI_PROBE_TIMES'), and the decision after the round's
 * last call. The residual the ring refilled is owed to the next call of its key. */
static void ring_done(struct ring *r, struct choice *ch, int c, int probe, size_t n, double ring_s, double mpi_s,
                      struct residual *ef)
{
    if (ef)
        ef->owed = 1;
    ch->calls++;
    pthread_mutex_lock(&g_mu);
    g_choice[c].ring_calls++;
    pthread_mutex_unlock(&g_mu);
    if (!probe)
        return;
    if (mpi_s < 0)
        mpi_s = probe_mpi(r, ch, n);
    int k = ch->samples++;
    ch->ring_s[k] = cfg.probe_inject ? cfg.probe_ms[0] / 1e3 : ring_s;
    ch->mpi_s[k] = cfg.probe_inject ? cfg.probe_ms[1] / 1e3 : mpi_s;
    if (ch->samples == INC_MPI_PROBE_CALLS)
        decide(r, ch, c);
}

/* A call of a class decided for MPI's own (called with r->mu held; unlocks it). A residual a ring
 * call left goes into this rank's input first: MPI's sum loses nothing, so what was owed is paid. */
static int mpi_chosen(struct ring *r, struct choice *ch, int c, const void *sendbuf, void *recvbuf, int count)
{
    double t0 = now();
    size_t n = (size_t)count;
    struct residual *e = NULL;
    for (struct residual *i = cfg.feedback ? r->residuals : NULL; i && !e; i = i->next)
        if (i->n == n && i->owed)
            e = i;
    int rc;
    if (e) {
        if (sendbuf != MPI_IN_PLACE && sendbuf != recvbuf)
            memmove(recvbuf, sendbuf, n * sizeof(float));
        re_compensate(recvbuf, e->lost, n);
        memset(e->lost, 0, n * sizeof *e->lost);
        e->owed = 0;
        rc = PMPI_Allreduce(MPI_IN_PLACE, recvbuf, count, MPI_FLOAT, MPI_SUM, r->comm);
    } else {
        rc = PMPI_Allreduce(sendbuf, recvbuf, count, MPI_FLOAT, MPI_SUM, r->comm);
    }
    ch->calls++;
    double dt = now() - t0;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&g_mu);
    g_stats.taken++;
    g_stats.taken_bytes += (double)n * 4;
    g_stats.seconds += dt;
    g_choice[c].mpi_calls++;
    pthread_mutex_unlock(&g_mu);
    if (cfg.log)
        say("took MPI_Allreduce(count %d, float32, MPI_SUM) on %d ranks: %.3f ms, by MPI's own (chosen for counts "
            "%ld-%ld)", count, r->size, dt * 1e3, 1L << c, (2L << c) - 1);
    return rc;
}

/* The summary's lines per count class (with --log), after the summary line. */
static void say_choices(void)
{
    for (int c = 0; c < INC_MPI_CHOICE_CLASSES; c++) {
        unsigned long calls = g_choice[c].ring_calls + g_choice[c].mpi_calls;
        if (!calls)
            continue;
        if (cfg.choose == CHOOSE_RING)
            say("choice for counts %ld-%ld: the ring for all %lu calls (INCEPTIONN_MPI_CHOOSE=ring: never probed)",
                1L << c, (2L << c) - 1, calls);
        else if (!g_choice[c].rounds)
            say("choice for counts %ld-%ld: none yet (fewer calls than the %d probe calls); %lu on the ring", 1L << c,
                (2L << c) - 1, INC_MPI_PROBE_CALLS, calls);
        else
            say("choice for counts %ld-%ld: %s, as ring %.3f ms %s MPI's own %.3f ms (the slowest rank's, best of %d "
                "probe calls, in the last of %lu rounds); %lu calls on the ring, %lu by MPI's own", 1L << c,
                (2L << c) - 1, g_choice[c].use_mpi ? "MPI's own" : "the ring", 1e3 * g_choice[c].ring_s,
                g_choice[c].use_mpi ? ">" : "<=", 1e3 * g_choice[c].mpi_s, INC_MPI_PROBE_CALLS, g_choice[c].rounds,
                g_choice[c].ring_calls, g_choice[c].mpi_calls);
    }
}

/* --- the interposed calls --------------------------------------------------------------------- */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *op_name(MPI_Op op)
{
    return op == MPI_SUM ? "MPI_SUM" : op == MPI_MAX ? "MPI_MAX" : op == MPI_MIN ? "MPI_MIN"
         : op == MPI_PROD ? "MPI_PROD" : "another op";
}

static int passed(const char *why, int count, MPI_Datatype dt, MPI_Op op)
{
    int sz = 0;
    if (PMPI_Type_size(dt, &sz) != MPI_SUCCESS)
        sz = 0;
    pthread_mutex_lock(&g_mu);
    g_stats.passed++;
    g_stats.passed_bytes += (double)count * sz;
    pthread_mutex_unlock(&g_mu);
    if (cfg.log) {
        char name[MPI_MAX_OBJECT_NAME] = "?";
        int len = 0;
        PMPI_Type_get_name(dt, name, &len);
        say("passed MPI_Allreduce(count %d, %s, %s): %s", count, len ? name : "a derived datatype", op_name(op), why);
    }
    return 0;
}

/* Whether the call is ours; only arguments every rank passes equal are looked at. */
static int eligible(int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm, int *size)
{
    int inter = 0, sz = 0;
    if (dt != MPI_FLOAT) {
        if (dt != MPI_REAL || PMPI_Type_size(dt, &sz) != MPI_SUCCESS || sz != 4)
            return passed("not float32 (MPI_FLOAT or a 4-byte MPI_REAL)", count, dt, op);
    }
    if (op != MPI_SUM)
        return passed("not MPI_SUM", count, dt, op);
    if (comm == MPI_COMM_NULL || PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        return passed("not an intracommunicator", count, dt, op);
    if (PMPI_Comm_size(comm, size) != MPI_SUCCESS || *size < 2)
        return passed("fewer than 2 ranks", count, dt, op);
    if (count < cfg.min_count) {
        char why[64];
        snprintf(why, sizeof why, "count below %ld", cfg.min_count);
        return passed(why, count, dt, op);
    }
    if (g_agree == AGREE_UNSEEN) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            say("warning: the MPI_Allreduce library did not see MPI_Init (so the ranks never compared their "
                "settings); every MPI_Allreduce is MPI's own");
        return passed("MPI_Init not seen: settings never compared", count, dt, op);
    }
    if (g_agree != AGREE_OK)
        return passed("the library is off: settings differ between ranks", count, dt, op);
    if (cfg.choose == CHOOSE_MPI)
        return passed("INCEPTIONN_MPI_CHOOSE=mpi", count, dt, op);
    return 1;
}

EXPORT int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                         MPI_Comm comm)
{
    int size = 0;
    if (!eligible(count, datatype, op, comm, &size))
        return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    struct ring *r = ring_for(comm, size);
    if (!r || r->foreign) {
        passed(r ? "the communicator holds processes of another MPI_COMM_WORLD" : "no attribute for this communicator",
               count, datatype, op);
        return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    }
    pthread_mutex_lock(&r->mu);
    if (r->state == RING_NEW)
        setup(r);
    if (r->state != RING_READY) {
        pthread_mutex_unlock(&r->mu);
        passed("this communicator fell back at setup", count, datatype, op);
        return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    }
    int cls = count_class(count), probe = probing(&r->choice[cls]);
    if (!probe && r->choice[cls].use_mpi)
        return mpi_chosen(r, &r->choice[cls], cls, sendbuf, recvbuf, count);   /* unlocks r->mu */
    double mpi_s = probe ? probe_start(r, &r->choice[cls], sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf,
                                       (size_t)count) : -1;
    double t0 = now();
    float *x = recvbuf;
    size_t n = (size_t)count;
    if (sendbuf != MPI_IN_PLACE && sendbuf != recvbuf)
        memmove(x, sendbuf, n * sizeof(float));
    struct residual *ef = cfg.feedback ? residual_for(r, n) : NULL;
    if (ring_allreduce(r, x, n, ef ? ef->lost : NULL)) {    /* adds ef->lost first, then refills it */
        pthread_mutex_unlock(&r->mu);
        passed("a rank's values are not finite, which THC cannot encode: summed by MPI's own", count, datatype, op);
        return MPI_SUCCESS;
    }
    double tc = now(), dh = 0;
    check_result(r, x, n, &dh);
    double dc = now() - tc, dt = now() - t0;
    ring_done(r, &r->choice[cls], cls, probe, n, dt, mpi_s, ef);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&g_mu);
    g_stats.taken++;
    g_stats.taken_bytes += (double)n * 4;
    g_stats.seconds += dt;
    g_stats.check_seconds += dc;
    g_stats.hash_seconds += dh;
    pthread_mutex_unlock(&g_mu);
    if (cfg.log)
        say("took MPI_Allreduce(count %d, float32, MPI_SUM) on %d ranks: %.3f ms, mode %s, codec %s", count, size,
            dt * 1e3, MODE_NAME[cfg.mode], CODEC->name);
    return MPI_SUCCESS;
}

EXPORT int MPI_Init(int *argc, char ***argv)
{
    inc_mpi_check_abi();   /* pmpi_abi.c: never run inside the other MPI family */
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS)
        agree_settings();
    return rc;
}

EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    inc_mpi_check_abi();   /* pmpi_abi.c: never run inside the other MPI family */
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS)
        agree_settings();
    return rc;
}

EXPORT int MPI_Finalize(void)
{
    double ef_held = g_stats.ef_bytes;      /* before the rings (and their residuals) go */
    /* tear down every ring still open (communicators the program never freed, MPI_COMM_WORLD) */
    for (;;) {
        pthread_mutex_lock(&g_mu);
        struct ring *r = g_rings;
        MPI_Comm c = r ? r->comm : MPI_COMM_NULL;
        pthread_mutex_unlock(&g_mu);
        if (!r)
            break;
        if (PMPI_Comm_delete_attr(c, g_keyval) != MPI_SUCCESS)
            delete_ring(c, g_keyval, r, NULL);     /* the communicator is gone: drop the ring anyway */
    }
    if (g_keyval != MPI_KEYVAL_INVALID)
        PMPI_Comm_free_keyval(&g_keyval);
    if (cfg.log) {
        char ef[96] = "";
        if (cfg.feedback)
            snprintf(ef, sizeof ef, "; error feedback: %.1f MiB of residuals at the end, %lu dropped", ef_held / 1048576.0,
                     g_stats.ef_dropped);
        double per = 0;   /* the result check is the ring's: per call on the ring */
        for (int c = 0; c < INC_MPI_CHOICE_CLASSES; c++)
            per += (double)g_choice[c].ring_calls;
        per = per > 0 ? 1e6 / per : 0.0;
        char wire[128] = "";
        if (g_stats.wire_bytes > 0)
            snprintf(wire, sizeof wire, "; ring: %.2f MiB sent for %.2f MiB of float32 (%.2fx)",
                     g_stats.wire_bytes / 1048576.0, g_stats.float_bytes / 1048576.0,
                     g_stats.float_bytes / g_stats.wire_bytes);
        say("summary: %lu MPI_Allreduce calls taken (%.1f MiB, %.3f s, mode %s, codec %s), %lu passed through (%.1f MiB)%s; "
            "result check per call: %.0f us (hash %.0f us, the rest waits for the slowest rank)%s", g_stats.taken,
            g_stats.taken_bytes / 1048576.0, g_stats.seconds, MODE_NAME[cfg.mode], CODEC->name, g_stats.passed,
            g_stats.passed_bytes / 1048576.0, ef, g_stats.check_seconds * per, g_stats.hash_seconds * per, wire);
    }
    if (cfg.log)
        say_choices();
    return PMPI_Finalize();
}
