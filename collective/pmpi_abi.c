/*
 * What the MPI ABIs need of the MPI_Allreduce library beyond pmpi_allreduce.c.
 *
 * The guard. The library is built once per MPI ABI
 * (OpenMPI's handles are pointers, the MPICH family's are integers: Intel MPI, MVAPICH and Cray
 * MPICH share MPICH's) and must only run in a program of that ABI. Preloaded into the other kind,
 * it drags its own libmpi in beside the program's, and the two mix: wrong results or a crash
 * inside MPI_Init. So when another family's libmpi is in the process, stop with one line instead:
 * at load (a program linked to MPI has its libmpi mapped by then) and again at the start of
 * pmpi_allreduce.c's MPI_Init and MPI_Init_thread (mpi4py loads its libmpi after the interpreter
 * starts).
 *
 * The large-count entry (MPI-4 libraries: MPICH 4, not OpenMPI 4.1): MPI_Allreduce_c. mpi4py calls
 * it where it exists, so without it MPICH's mpi4py programs would never reach the library.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <link.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pmpi_allreduce.h"

#define EXPORT __attribute__((visibility("default")))

#if defined(OPEN_MPI)
#define OURS 'o'
#elif defined(MPICH)
#define OURS 'm'
#else
#error "mpi.h is neither OpenMPI's nor MPICH's"
#endif

static const char *family_name(char f)
{
    return f == 'o' ? "OpenMPI" : "the MPICH ABI";
}

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* 'o' OpenMPI 3-5 (libmpi.so.40), 'm' the MPICH ABI (libmpi.so.12, libmpich*.so.12), '?' another
 * libmpi, 0 not an MPI library. */
static char family(const char *base)
{
    if (!strcmp(base, "libmpi.so.40") || starts(base, "libmpi.so.40."))
        return 'o';
    if (!strcmp(base, "libmpi.so.12") || starts(base, "libmpi.so.12.") ||
        (starts(base, "libmpich") && strstr(base, ".so.12")))
        return 'm';
    if (starts(base, "libmpi.so") || (starts(base, "libmpich") && strstr(base, ".so")))
        return '?';
    return 0;
}

static int find_foreign(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *path = info->dlpi_name ? info->dlpi_name : "", *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char f = family(base);
    if (f && f != OURS) {
        snprintf(data, 256, "%c%s", f, base);
        return 1;
    }
    return 0;
}

void inc_mpi_check_abi(void)
{
    char found[256] = "";
    if (!dl_iterate_phdr(find_foreign, found))
        return;
    char line[512];
    int n;
    if (found[0] == '?')
        n = snprintf(line, sizeof line, "inceptionn-mpi[%d]: error: this program's MPI library is %s, neither OpenMPI's "
                     "(libmpi.so.40) nor the MPICH ABI's (libmpi.so.12, libmpich.so.12): the MPI_Allreduce library "
                     "supports only those\n", (int)getpid(), found + 1);
    else
        n = snprintf(line, sizeof line, "inceptionn-mpi[%d]: error: this program runs %s (%s) but the preloaded "
                     "MPI_Allreduce library is built for %s: take the environment from `inceptionn env "
                     "--compress-allreduce --mpi %s`\n", (int)getpid(), family_name(found[0]), found + 1,
                     family_name(OURS), found[0] == 'o' ? "openmpi" : "mpich");
    ssize_t w = write(2, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
    _exit(2);
}

__attribute__((constructor)) static void check_at_load(void)
{
    inc_mpi_check_abi();
}

#if MPI_VERSION >= 4
/* A count that fits an int is the same call as MPI_Allreduce's, which decides whether it is taken. */
EXPORT int MPI_Allreduce_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype, MPI_Op op,
                           MPI_Comm comm)
{
    if (count >= 0 && count <= INT_MAX)
        return MPI_Allreduce(sendbuf, recvbuf, (int)count, datatype, op, comm);
    return PMPI_Allreduce_c(sendbuf, recvbuf, count, datatype, op, comm);
}
#endif
