/* An MPI job with plain gradient sockets beside MPI's own, for tests/test_mpirun.py.
 *
 *   mpi_grad IFACE PORT_BASE NFLOATS
 *
 * After MPI_Init, rank r listens on PORT_BASE + r at its address on IFACE, connects to rank
 * r+1's listener and accepts rank r-1: a ring of plain TCP connections, made with no tagging
 * code at all. Both directions of every connection carry NFLOATS float32 values (zeros and
 * powers of two from 1 to 16, which the INCEPTIONN codec keeps exactly in both of the soft NIC's
 * modes: as they are, and scaled per packet so the largest is 0.5, the rest at least 2^-5). MPI_Allreduce before and after moves
 * data over MPI's TCP BTL. Each rank prints one line with the ToS of its two gradient sockets
 * (getsockopt) and whether every value arrived intact; rank 0 prints "all ok" at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "mpi_grad: %s: %s\n", what, strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static float value(int rank, size_t i)
{
    return i % 8 == 0 ? (float)(1 << ((size_t)rank + i / 8) % 5) : 0.0f;
}

struct io { int fd; float *buf; size_t n; };

static void *send_all(void *arg)
{
    struct io *io = arg;
    const char *p = (const char *)io->buf;
    size_t left = io->n * sizeof(float);
    while (left) {
        ssize_t w = send(io->fd, p, left, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("send");
        p += w; left -= (size_t)w;
    }
    return NULL;
}

static void recv_all(int fd, float *buf, size_t n)
{
    char *p = (char *)buf;
    size_t left = n * sizeof(float);
    while (left) {
        ssize_t r = recv(fd, p, left, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("recv");
        p += r; left -= (size_t)r;
    }
}

/* send `mine` on out while receiving into `theirs` from in */
static void exchange(int out, int in, float *mine, float *theirs, size_t n)
{
    pthread_t t;
    struct io io = {out, mine, n};
    if (pthread_create(&t, NULL, send_all, &io)) die("pthread_create");
    recv_all(in, theirs, n);
    pthread_join(t, NULL);
}

static int check(const float *buf, size_t n, int from)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != value(from, i)) return 0;
    return 1;
}

static int tos_of(int fd)
{
    int v = -1;
    socklen_t l = sizeof v;
    getsockopt(fd, IPPROTO_IP, IP_TOS, &v, &l);
    return v;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4) {
        if (rank == 0) fprintf(stderr, "usage: mpi_grad IFACE PORT_BASE NFLOATS\n");
        MPI_Finalize();
        return 2;
    }
    const char *iface = argv[1];
    int base = atoi(argv[2]);
    size_t n = (size_t)atol(argv[3]);

    uint32_t me = 0;
    struct ifaddrs *ifs, *it;
    if (getifaddrs(&ifs)) die("getifaddrs");
    for (it = ifs; it; it = it->ifa_next)
        if (it->ifa_addr && it->ifa_addr->sa_family == AF_INET && strcmp(it->ifa_name, iface) == 0)
            me = ((struct sockaddr_in *)it->ifa_addr)->sin_addr.s_addr;
    freeifaddrs(ifs);
    if (!me) { errno = ENODEV; die(iface); }
    uint32_t *ips = calloc((size_t)size, sizeof *ips);
    MPI_Allgather(&me, 1, MPI_UINT32_T, ips, 1, MPI_UINT32_T, MPI_COMM_WORLD);

    /* MPI's own traffic over the TCP BTL */
    size_t nd = 1 << 16;
    double *d = malloc(nd * sizeof *d), *dsum = malloc(nd * sizeof *dsum);
    for (size_t i = 0; i < nd; i++) d[i] = rank + i;
    MPI_Allreduce(d, dsum, (int)nd, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + rank)), .sin_addr.s_addr = me};
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 4)) die("listen");
    MPI_Barrier(MPI_COMM_WORLD);

    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int out = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in b = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + next)), .sin_addr.s_addr = ips[next]};
    if (connect(out, (struct sockaddr *)&b, sizeof b)) die("connect");
    int in = accept(lfd, NULL, NULL);
    if (in < 0) die("accept");

    float *mine = malloc(n * sizeof *mine), *theirs = malloc(n * sizeof *theirs);
    for (size_t i = 0; i < n; i++) mine[i] = value(rank, i);
    exchange(out, in, mine, theirs, n);       /* forward round: r -> r+1 */
    int ok = check(theirs, n, prev);
    exchange(in, out, mine, theirs, n);       /* backward round on the same connections */
    ok = ok && check(theirs, n, next);

    char host[MPI_MAX_PROCESSOR_NAME];
    int hl;
    MPI_Get_processor_name(host, &hl);
    printf("rank %d host %s out_tos 0x%02x in_tos 0x%02x listen_tos 0x%02x %s\n", rank, host,
           tos_of(out), tos_of(in), tos_of(lfd), ok ? "ok" : "CORRUPT");
    fflush(stdout);

    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    MPI_Allreduce(d, dsum, (int)nd, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    close(out);
    close(in);
    close(lfd);
    if (rank == 0) {
        double want = 0;
        for (int r = 0; r < size; r++) want += r + 12345.0;
        printf("%s\n", all && dsum[12345] == want ? "all ok" : "FAILED");
    }
    MPI_Finalize();
    return all ? 0 : 1;
}
