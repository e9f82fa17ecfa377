/* THC's homomorphic ring in the ring engine, timed without Python: N ranks as threads over socket
 * pairs (collective/ring_engine.c + the codecs in the ring, codecs_c/codec_table.h), n values per rank, one chunk per block as
 * Group runs it, error feedback on. Per call and rank it prints the thread CPU seconds of the whole
 * call and the engine's codec + sum seconds (struct re_stats; built with
 * -DRE_STATS_CLOCK=CLOCK_THREAD_CPUTIME_ID they are thread CPU time too), the median over ranks and
 * calls, and the NMSE of the result against the exact sum.
 *   ./build/bench_thc_ring [ranks=4] [n=1000000] [calls=5]
 * make build/bench_thc_ring */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ring_engine.h"
#include "thc_codec.h"

#define MAXR 64

static const uint8_t TABLE[16] = THC_DEFAULT_TABLE;
#define TP THC_DEFAULT_T_P

struct rank {
    struct re_ring ring;
    struct re_codec codec;
    struct re_thc thc;
    float *x, *res;
    size_t n;
    int st;
    double cpu;
    struct re_stats stats;
    char err[256];
};

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *rank_main(void *arg)
{
    struct rank *k = arg;
    double t0 = thread_cpu();
    k->st = re_allreduce(&k->ring, k->x, k->n, k->res, &k->stats, k->err, sizeof k->err);
    k->cpu = thread_cpu() - t0;
    return NULL;
}

/* a gradient-like value: log-uniform magnitudes 1e-1 .. 1e-6, random signs */
static float value(int rank, size_t i)
{
    uint64_t h = ((uint64_t)rank * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ 11u;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    double u = (double)(h >> 11) / 9007199254740992.0;
    double mag = pow(10.0, -1.0 - 5.0 * u);
    return (float)((h & 1) ? -mag : mag);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int N = argc > 1 ? atoi(argv[1]) : 4;
    size_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
    int calls = argc > 3 ? atoi(argv[3]) : 5;
    if (N < 2 || N > MAXR || calls < 1)
        return 2;
    static struct rank k[MAXR];
    float *in[MAXR];
    double norm = 0, *exact = calloc(n, sizeof(double));
    for (int r = 0; r < N; r++) {
        in[r] = malloc(n * sizeof(float));
        k[r].x = malloc(n * sizeof(float));
        k[r].res = malloc(n * sizeof(float));
        double s = 0;
        for (size_t i = 0; i < n; i++) {
            in[r][i] = value(r, i);
            s += (double)in[r][i] * in[r][i];
            exact[i] += in[r][i];
        }
        norm = fmax(norm, sqrt(s));
    }
    double *cpu = malloc((size_t)(N * calls) * sizeof(double)), *codec = malloc((size_t)(N * calls) * sizeof(double));
    double err2 = 0, ref2 = 0;
    for (int call = 0; call < calls; call++) {
        int fds[MAXR][2];
        pthread_t t[MAXR];
        for (int r = 0; r < N; r++)
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds[r]) != 0)
                return 3;
        for (int r = 0; r < N; r++) {
            memset(&k[r].thc, 0, sizeof k[r].thc);
            k[r].thc.bits = THC_DEFAULT_BITS, k[r].thc.granularity = THC_DEFAULT_GRANULARITY, k[r].thc.ranks = N;
            memcpy(k[r].thc.table, TABLE, sizeof TABLE);
            k[r].thc.t_p = TP, k[r].thc.norm = norm, k[r].thc.rot_seed = 0x5EED0000ull + (unsigned)call;
            k[r].thc.noise_seed = 1000u * (unsigned)call + (unsigned)r;
            re_codec_thc(&k[r].codec, &k[r].thc);
            k[r].ring = (struct re_ring){.rank = r, .size = N, .send_fd = fds[r][0], .recv_fd = fds[(r + N - 1) % N][1],
                                         .timeout_ms = 600000, .chunk = n, .tp = &re_transport_app,
                                         .codec = &k[r].codec};
            k[r].n = n;
            memcpy(k[r].x, in[r], n * sizeof(float));
        }
        for (int r = 0; r < N; r++)
            pthread_create(&t[r], NULL, rank_main, &k[r]);
        for (int r = 0; r < N; r++)
            pthread_join(t[r], NULL);
        for (int r = 0; r < N; r++) {
            close(fds[r][0]), close(fds[r][1]);
            if (k[r].st) {
                fprintf(stderr, "rank %d: %s\n", r, k[r].err);
                return 1;
            }
            if (memcmp(k[r].x, k[0].x, n * sizeof(float))) {
                fprintf(stderr, "rank %d differs from rank 0\n", r);
                return 1;
            }
            cpu[call * N + r] = k[r].cpu;
            codec[call * N + r] = k[r].stats.codec_seconds + k[r].stats.sum_seconds;
        }
        for (size_t i = 0; i < n; i++) {
            double e = k[0].x[i] - exact[i];
            err2 += e * e;
            ref2 += exact[i] * exact[i];
        }
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a of rank 0's last result: the same bits, the same hash */
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ ((const uint8_t *)k[0].x)[i]) * 1099511628211ull;
    int m = N * calls;
    qsort(cpu, (size_t)m, sizeof *cpu, cmp);
    qsort(codec, (size_t)m, sizeof *codec, cmp);
    printf("ranks %d n %zu calls %d: call CPU ms/rank median %.2f [%.2f-%.2f]; codec+sum ms/rank median %.2f "
           "[%.2f-%.2f]; NMSE %.5f; result hash %016llx\n",
           N, n, calls, 1e3 * cpu[m / 2], 1e3 * cpu[0], 1e3 * cpu[m - 1], 1e3 * codec[m / 2], 1e3 * codec[0],
           1e3 * codec[m - 1], err2 / ref2, (unsigned long long)h);
    return 0;
}
