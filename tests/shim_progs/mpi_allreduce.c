/* A plain MPI program that knows nothing of inceptionn: a few MPI_Allreduce calls, each result
 * written to OUTDIR/rankR_NAME.bin (and the float input to OUTDIR/rankR_input.bin).
 * Usage: mpi_allreduce OUTDIR N [REPEAT] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void save(const char *dir, int rank, const char *name, const void *p, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d_%s.bin", dir, rank, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* a gradient-like value: uniform in (-0.01, 0.01), varying scale per 64K bucket, from a per-rank LCG */
static float value(uint64_t *s, size_t i)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    double u = (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return (float)(u * 0.01 / (double)(1 + (i >> 16) % 7));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUTDIR N [REPEAT]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *dir = argv[1];
    size_t n = strtoul(argv[2], NULL, 10);
    int repeat = argc > 3 ? atoi(argv[3]) : 1;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    uint64_t seed = 12345 + 1000003ULL * (uint64_t)rank;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    double *d = malloc(n * sizeof *d);
    int *k = malloc(n * sizeof *k);
    for (size_t i = 0; i < n; i++) {
        x[i] = value(&seed, i);
        d[i] = x[i];
        k[i] = (int)(x[i] * 1e6f);
    }
    save(dir, rank, "input", x, n * sizeof *x);
    memcpy(y, x, n * sizeof *x);
    for (int r = 0; r < repeat; r++) {
        memcpy(y, x, n * sizeof *x);
        MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);   /* taken */
    }
    save(dir, rank, "inplace", y, n * sizeof *y);
    MPI_Allreduce(x, z, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);                  /* taken */
    save(dir, rank, "separate", z, n * sizeof *z);
    MPI_Allreduce(x, z, 1000, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);                    /* small */
    save(dir, rank, "small", z, 1000 * sizeof *z);
    MPI_Allreduce(x, z, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);                  /* not a sum */
    save(dir, rank, "max", z, n * sizeof *z);
    MPI_Allreduce(MPI_IN_PLACE, d, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);      /* not float */
    save(dir, rank, "double", d, n * sizeof *d);
    MPI_Allreduce(MPI_IN_PLACE, k, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);         /* not float */
    save(dir, rank, "int", k, n * sizeof *k);
    MPI_Comm half;                                                                     /* a sub-communicator, freed */
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    memcpy(y, x, n * sizeof *x);
    MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, half);
    save(dir, rank, "half", y, n * sizeof *y);
    MPI_Comm_free(&half);
    MPI_Finalize();
    return 0;
}
