/*
 * The MPI_Allreduce library's settings: read from the environment when the library loads
 * (pmpi_allreduce.h lists them), and agreed by every rank in MPI_Init (agree_settings).
 */
#include "pmpi_internal.h"

const char *const MODE_NAME[2] = {"app", "nic"};
const char *const CHOOSE_NAME[CHOOSE_COUNT] = {"auto", "ring", "mpi"};
struct pmpi_cfg cfg;
int g_agree = AGREE_UNSEEN;

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

/* --- settings --------------------------------------------------------------------------------- */

/* The variable as a long in [lo, hi] (def when unset); outside it, an error line naming what it
 * is and the range, from the bounds the check uses, and exit. */
static long env_long(const char *name, long def, long lo, long hi, const char *what)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        say("error: bad %s '%.40s': %s, %ld..%ld", name, v, what, lo, hi);
        _exit(2);
    }
    return x;
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
                             "a number of values");
    cfg.k = (int)env_long("INCEPTIONN_MPI_ERROR_BOUND", INCEPTIONN_DEFAULT_ERROR_BOUND, INC_MIN_ERROR_BOUND,
                          INC_MAX_ERROR_BOUND, "an exponent k of the bound 2^k (nicd --error-bound)");
    cfg.chunk = env_long("INCEPTIONN_MPI_CHUNK", INC_MPI_DEFAULT_CHUNK, INC_MPI_MIN_CHUNK, INC_MPI_MAX_CHUNK,
                         "values per chunk");
    cfg.timeout_ms = 1000 * (int)env_long("INCEPTIONN_MPI_TIMEOUT", INC_MPI_DEFAULT_TIMEOUT, 1,
                                          INC_MPI_MAX_TIMEOUT, "seconds");
    cfg.log = (int)env_long("INCEPTIONN_MPI_LOG", 0, 0, 1, "off or on");
    cfg.headroom = (int)env_long("INCEPTIONN_MPI_HEADROOM", BS_HEADROOM, 0, BS_MAX_HEADROOM,
                                 "bits of precision given up");
    cfg.feedback = (int)env_long("INCEPTIONN_MPI_ERROR_FEEDBACK", CODEC->wants_error_feedback, 0, 1,
                                 "off or on");
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
void agree_settings(void)
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
