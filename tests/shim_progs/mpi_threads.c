/* A plain MPI_THREAD_MULTIPLE program: two threads, each with its own duplicate of
 * MPI_COMM_WORLD, call MPI_Allreduce (float32 sums) at the same time, REPEAT times; then the main
 * thread reduces the same inputs one after the other. Writes OUTDIR/rankR_{t0,t1,seq0,seq1}.bin.
 * Usage: mpi_threads OUTDIR N REPEAT */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct job {
    MPI_Comm comm;
    float *in, *out;
    size_t n;
    int repeat;
};

static void *worker(void *arg)
{
    struct job *j = arg;
    for (int r = 0; r < j->repeat; r++) {
        memcpy(j->out, j->in, j->n * sizeof(float));
        MPI_Allreduce(MPI_IN_PLACE, j->out, (int)j->n, MPI_FLOAT, MPI_SUM, j->comm);
    }
    return NULL;
}

static void save(const char *dir, int rank, const char *name, const float *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d_%s.bin", dir, rank, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof *p, n, f) != n || fclose(f) != 0)
        MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE || argc < 4) {
        fprintf(stderr, "no MPI_THREAD_MULTIPLE (%d) or usage: %s OUTDIR N REPEAT\n", provided, argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t n = strtoul(argv[2], NULL, 10);
    int repeat = atoi(argv[3]);
    struct job jobs[2];
    pthread_t th[2];
    unsigned s = 77u + (unsigned)rank;
    for (int t = 0; t < 2; t++) {
        MPI_Comm_dup(MPI_COMM_WORLD, &jobs[t].comm);
        jobs[t].n = n;
        jobs[t].repeat = repeat;
        jobs[t].in = malloc(n * sizeof(float));
        jobs[t].out = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            jobs[t].in[i] = ((float)(rand_r(&s) % 20001) - 10000.0f) * 1e-6f * (float)(t + 1);
    }
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, worker, &jobs[t]);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    save(argv[1], rank, "t0", jobs[0].out, n);
    save(argv[1], rank, "t1", jobs[1].out, n);
    for (int t = 0; t < 2; t++) {   /* the same inputs, one after the other, on MPI_COMM_WORLD */
        memcpy(jobs[t].out, jobs[t].in, n * sizeof(float));
        MPI_Allreduce(MPI_IN_PLACE, jobs[t].out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        save(argv[1], rank, t ? "seq1" : "seq0", jobs[t].out, n);
        MPI_Comm_free(&jobs[t].comm);
    }
    MPI_Finalize();
    return 0;
}
