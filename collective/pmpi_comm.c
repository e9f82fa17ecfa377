/*
 * Per communicator: error feedback's residuals, and the ring as a communicator attribute (made on
 * the first call taken, torn down on MPI_Comm_free and at MPI_Finalize).
 */
#include "pmpi_internal.h"

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
struct residual *residual_for(struct ring *r, size_t n)
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

int delete_ring(MPI_Comm comm, int keyval, void *value, void *extra)
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

struct ring *ring_for(MPI_Comm comm, int size)
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
