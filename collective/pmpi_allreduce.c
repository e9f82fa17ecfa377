/*
 * MPI_Allreduce through the INCEPTIONN ring, for unmodified MPI programs (PMPI interposition;
 * settings in pmpi_allreduce.h, design in docs/mpi-allreduce.md). This file holds the intercepted
 * calls; the rest of the library is pmpi_settings.c (the settings and their agreement), pmpi_ring.c
 * (a communicator's ring: address, connections, keys, a call's run), pmpi_comm.c (error feedback's
 * memory, the communicator attribute), pmpi_choice.c (ring or MPI's own per count class),
 * pmpi_result_check.c (the result hash) and pmpi_abi.c; they share pmpi_internal.h.
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
#include "pmpi_internal.h"

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_keyval = MPI_KEYVAL_INVALID;
struct ring *g_rings;
struct pmpi_stats g_stats;

/* --- output: one write() per line ------------------------------------------------------------- */

void say(const char *fmt, ...)
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

/* --- the interposed calls --------------------------------------------------------------------- */

double now(void)
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
