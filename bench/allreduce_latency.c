/*
 * An allreduce latency benchmark in the standard form (the OSU micro-benchmarks' osu_allreduce
 * loop, written out here): for each message size from MIN to MAX bytes (doubling), SKIP warm-up
 * calls and ITERS timed calls of MPI_Allreduce(sendbuf, recvbuf, size / 4, MPI_FLOAT, MPI_SUM)
 * on constant buffers (every byte 1), a barrier before each size; each rank's mean time per
 * call, then its mean, min and max over the ranks. Sizes up to 8 KiB get ITERS_SMALL and
 * SKIP_SMALL (OSU: 1000, 200), larger ones ITERS_LARGE and SKIP_LARGE (OSU: 100, 10).
 *
 * Usage: allreduce_latency MIN MAX ITERS_SMALL SKIP_SMALL ITERS_LARGE SKIP_LARGE
 * Prints, on rank 0, one line per size: "size BYTES avg_us A min_us B max_us C".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc != 7) {
        fprintf(stderr, "usage: %s MIN MAX ITERS_SMALL SKIP_SMALL ITERS_LARGE SKIP_LARGE\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long lo = atol(argv[1]), hi = atol(argv[2]);
    int iters_small = atoi(argv[3]), skip_small = atoi(argv[4]), iters_large = atoi(argv[5]), skip_large = atoi(argv[6]);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char *s = malloc((size_t)hi), *r = malloc((size_t)hi);
    if (lo < 4 || hi < lo || !s || !r || iters_small < 1 || iters_large < 1 || skip_small < 0 || skip_large < 0) {
        fprintf(stderr, "bad arguments\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(s, 1, (size_t)hi);
    memset(r, 0, (size_t)hi);
    for (long bytes = lo; bytes <= hi; bytes *= 2) {
        int small = bytes <= 8192, iters = small ? iters_small : iters_large, skip = small ? skip_small : skip_large;
        int count = (int)(bytes / 4);
        double t = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < skip + iters; i++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (i >= skip)
                t += MPI_Wtime() - t0;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double mine = 1e6 * t / iters, sum = 0, mn = 0, mx = 0;
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(&mine, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&mine, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("size %ld avg_us %.2f min_us %.2f max_us %.2f\n", bytes, sum / size, mn, mx);
        fflush(stdout);
    }
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
