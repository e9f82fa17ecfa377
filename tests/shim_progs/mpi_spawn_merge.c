/* MPI_Comm_spawn: 2 parents start 2 children, the intercommunicator is merged into one
 * intracommunicator of 4 processes of two MPI_COMM_WORLDs, and each sums 65536 ones on it and on
 * its own MPI_COMM_WORLD. Prints "WORLD rank R merged M: ok|wrong" per process.
 * Usage: mpi_spawn_merge N */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int sum_ones(MPI_Comm comm, int n)
{
    int size, bad = 0;
    MPI_Comm_size(comm, &size);
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++)
        x[i] = 1.0f;
    MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, comm);
    for (int i = 0; i < n; i++)
        bad += x[i] != (float)size;
    free(x);
    return bad;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 65536, rank, mrank;
    MPI_Comm parent, inter, merged;
    MPI_Comm_get_parent(&parent);
    if (parent == MPI_COMM_NULL) {
        char *args[] = {argv[1], NULL};
        MPI_Comm_spawn(argv[0], args, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, MPI_ERRCODES_IGNORE);
        MPI_Intercomm_merge(inter, 0, &merged);
    } else {
        inter = parent;
        MPI_Intercomm_merge(parent, 1, &merged);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_rank(merged, &mrank);
    int bad_merged = sum_ones(merged, n), bad_world = sum_ones(MPI_COMM_WORLD, n);
    printf("%s rank %d merged %d: %s\n", parent == MPI_COMM_NULL ? "parent" : "child", rank, mrank,
           bad_merged || bad_world ? "wrong" : "ok");
    fflush(stdout);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&inter);
    MPI_Finalize();
    return 0;
}
