/*
 * The ring or MPI's own, per communicator and count class (INCEPTIONN_MPI_CHOOSE; design in
 * docs/mpi-allreduce.md, "Ring or MPI's own").
 */
#include "pmpi_internal.h"

struct pmpi_class_stats g_choice[INC_MPI_CHOICE_CLASSES];

int count_class(int count)
{
    return 31 - __builtin_clz((unsigned)count);     /* count >= the threshold >= 1 */
}

/* auto: the first INC_MPI_PROBE_CALLS calls of a class, and a round of as many every interval */
int probing(const struct choice *ch)
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
double probe_start(struct ring *r, struct choice *ch, const void *input, size_t n)
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
void ring_done(struct ring *r, struct choice *ch, int c, int probe, size_t n, double ring_s, double mpi_s,
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
int mpi_chosen(struct ring *r, struct choice *ch, int c, const void *sendbuf, void *recvbuf, int count)
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
void say_choices(void)
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
