/* An MPI program that knows nothing of inceptionn and sets up many rings: SETUPS times, a fresh
 * communicator (MPI_Comm_dup of MPI_COMM_WORLD; "world": MPI_COMM_WORLD itself) and CALLS
 * MPI_Allreduce calls of N float32 values on it, SLEEP_MS apart. Rank r contributes
 * (r + 1) * v(i + setup + call) at position i, v a full-mantissa value in [2^-12, 1) (every bit
 * of it counts, in every tier of the codec), so the exact sum is known; each call
 * prints one line: its return code, its time (the first call of a communicator includes the
 * ring's setup), how many values are off the exact sum by more than the codec's bound, and a
 * hash of the result's bits (every rank must print the same).
 * Usage: mpi_setups N SETUPS CALLS SLEEP_MS dup|world */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double v(size_t j)
{
    uint32_t h = (uint32_t)j * 2654435761u;
    h ^= h >> 15;
    return (0.5 + (double)(h & 0xffffff) / (double)(1 << 25)) / (double)(1 << (h >> 24) % 12);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc != 6) {
        fprintf(stderr, "usage: %s N SETUPS CALLS SLEEP_MS dup|world\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t n = strtoul(argv[1], NULL, 10);
    int setups = atoi(argv[2]), calls = atoi(argv[3]), sleep_ms = atoi(argv[4]), dup = !strcmp(argv[5], "dup");
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float *x = malloc(n * sizeof *x);
    if (!x)
        MPI_Abort(MPI_COMM_WORLD, 3);
    /* the test's bound (tests/test_pmpi_allreduce.py check_taken): N hops of 2^-7 of the scaled
     * values, scaled so that N times the largest input stays below 1 */
    const double total = size * (size + 1) / 2.0, tol = size * 0x1p-7 * 2 * size * size;
    for (int s = 0; s < setups; s++) {
        MPI_Comm comm = MPI_COMM_WORLD;
        if (dup)
            MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        for (int c = 0; c < calls; c++) {
            for (size_t i = 0; i < n; i++)
                x[i] = (float)((rank + 1) * v(i + (size_t)s + (size_t)c));
            double t0 = now_ms();
            int rc = MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, comm);
            double ms = now_ms() - t0;
            size_t wrong = 0;
            uint64_t h = 1469598103934665603ULL;
            for (size_t i = 0; i < n; i++) {
                double exact = total * v(i + (size_t)s + (size_t)c), d = x[i] - exact;
                wrong += !(d <= tol && d >= -tol);
                uint32_t b;
                memcpy(&b, &x[i], 4);
                h = (h ^ b) * 1099511628211ULL;
            }
            printf("rank %d setup %d call %d rc %d ms %.3f wrong %zu hash %016llx\n", rank, s, c, rc, ms, wrong,
                   (unsigned long long)h);
            fflush(stdout);
            if (sleep_ms)
                usleep((useconds_t)sleep_ms * 1000);
        }
        if (dup)
            MPI_Comm_free(&comm);
    }
    free(x);
    MPI_Finalize();
    return 0;
}
