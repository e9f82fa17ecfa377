/* collective/ring_engine.c under ASan/UBSan, without MPI: rings of 2..5 "ranks" as threads over
 * socket pairs, every transport (raw, tagged, codec) and lengths from 0 to past several chunks.
 * Checked: every rank ends with the same bits; the tagged and codec transports give the same bits
 * (one wire, two carriers) and the same residuals; the raw sum is within float32 rounding of the
 * exact one, the scaled one within wire format v2's; error feedback's residual holds sent -
 * decoded (the sum of every rank's input equals the result plus every rank's residual, up to
 * rounding). Then a rank whose left neighbour is hostile: a bad exponent, a value out of its
 * block's range, a frame longer than its chunk, a corrupt codec stream, a closed connection and
 * silence each fail the call with the status they must, reading nothing past what was expected.
 * Last line: "N passed, 0 failed" (codecs_c/tests/check.h). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "ring_engine.h"

#define MAXR 5

struct rank {
    struct re_ring ring;
    float *x, *res;
    size_t n;
    int st;
    struct re_stats stats;
    char err[256];
};

static void *rank_main(void *arg)
{
    struct rank *k = arg;
    k->st = re_allreduce(&k->ring, k->x, k->n, k->res, &k->stats, k->err, sizeof k->err);
    return NULL;
}

static float value(int rank, size_t i, int seed)
{
    uint64_t h = ((uint64_t)rank * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ (uint64_t)seed;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    double u = (double)(h >> 11) / 9007199254740992.0;             /* [0, 1) */
    double mag = pow(10.0, -1.0 - 5.0 * u);                        /* 1e-1 .. 1e-6 */
    return (float)((h & 1) ? -mag : mag);
}

/* One ring of N ranks over socket pairs; out[r] (n floats each) gets rank r's result, res[r] its
 * residual when feedback. Returns the first nonzero status. */
static int ring(int N, size_t n, size_t chunk, const struct re_transport *tp, int feedback, float **out, float **res)
{
    struct re_codec codec;
    re_codec_inceptionn(&codec, -10);
    int fds[MAXR][2];
    struct rank k[MAXR];
    pthread_t t[MAXR];
    for (int r = 0; r < N; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds[r]) != 0)
            return -100;
    for (int r = 0; r < N; r++) {
        /* pair r: rank r sends on [0], rank r + 1 receives on [1]; feedback: compensated by 0 */
        k[r] = (struct rank){.ring = {.rank = r, .size = N, .send_fd = fds[r][0], .recv_fd = fds[(r + N - 1) % N][1],
                                      .timeout_ms = 20000, .chunk = chunk, .tp = tp, .codec = &codec},
                             .x = out[r], .res = feedback ? res[r] : NULL, .n = n};
        for (size_t i = 0; i < n; i++)
            out[r][i] = value(r, i, 7);
        if (feedback) {
            for (size_t i = 0; i < n; i++)
                res[r][i] = -0.0f;
            re_compensate(out[r], res[r], n);
        }
        pthread_create(&t[r], NULL, rank_main, &k[r]);
    }
    int st = 0;
    for (int r = 0; r < N; r++) {
        pthread_join(t[r], NULL);
        if (k[r].st && !st) {
            st = k[r].st;
            fprintf(stderr, "rank %d: %s\n", r, k[r].err);
        }
    }
    /* what a rank sent is what its right neighbour received; a tagged rank sends its wire floats:
     * 2 (N - 1) / N of the values plus one exponent per block of a chunk (chunk 300: 2 blocks) */
    for (int r = 0; r < N && !st; r++) {
        CHECK(k[r].stats.bytes_sent == k[(r + 1) % N].stats.bytes_received, "bytes of rank %d's link", r);
        if (tp == &re_transport_raw)
            CHECK(k[r].stats.bytes_sent <= 4 * (2 * (n / (size_t)N + 1)) * (size_t)(N - 1), "raw bytes");
    }
    for (int r = 0; r < N; r++)
        close(fds[r][0]), close(fds[r][1]);
    return st;
}

static float **alloc(int N, size_t n)
{
    float **p = calloc((size_t)N, sizeof *p);
    for (int r = 0; r < N; r++)
        p[r] = malloc((n ? n : 1) * sizeof(float));
    return p;
}

static void release(float **p, int N)
{
    for (int r = 0; r < N; r++)
        free(p[r]);
    free(p);
}

static void rings(void)
{
    static const size_t lens[] = {0, 1, 7, 1001, 5000};
    for (int N = 2; N <= MAXR; N++)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            size_t n = lens[li], chunk = 300;
            float **raw = alloc(N, n), **nic = alloc(N, n), **app = alloc(N, n);
            float **rn = alloc(N, n), **ra = alloc(N, n);
            CHECK(ring(N, n, chunk, &re_transport_raw, 0, raw, NULL) == 0, "raw N=%d n=%zu", N, n);
            CHECK(ring(N, n, chunk, &re_transport_tagged, 1, nic, rn) == 0, "nic N=%d n=%zu", N, n);
            CHECK(ring(N, n, chunk, &re_transport_codec, 1, app, ra) == 0, "app N=%d n=%zu", N, n);
            int same = 1, nic_app = 1, near_raw = 1, near_scaled = 1, ef = 1;
            for (int r = 0; r < N; r++) {
                same &= !memcmp(raw[r], raw[0], n * 4) && !memcmp(nic[r], nic[0], n * 4) &&
                        !memcmp(app[r], app[0], n * 4);
                nic_app &= !memcmp(nic[r], app[r], n * 4) && !memcmp(rn[r], ra[r], n * 4);
            }
            double err2 = 0, ref2 = 0;
            for (size_t i = 0; i < n; i++) {
                double s = 0, a = 0, held = nic[0][i];
                for (int r = 0; r < N; r++) {
                    s += value(r, i, 7);
                    a += fabs(value(r, i, 7));
                    held += rn[r][i];
                }
                near_raw &= fabs(raw[0][i] - s) <= 1e-6 * a;
                err2 += (nic[0][i] - s) * (nic[0][i] - s);
                ref2 += s * s;
                ef &= fabs(held - s) <= 1e-5 * a + 1e-12;
            }
            near_scaled = ref2 == 0 || err2 / ref2 < 1e-3;
            CHECK(same, "ranks differ, N=%d n=%zu", N, n);
            CHECK(nic_app, "tagged and codec transports differ, N=%d n=%zu", N, n);
            CHECK(near_raw, "raw sum off, N=%d n=%zu", N, n);
            CHECK(near_scaled, "scaled sum NMSE %g, N=%d n=%zu", err2 / ref2, N, n);
            CHECK(ef, "result + residuals is not the input sum, N=%d n=%zu", N, n);
            release(raw, N), release(nic, N), release(app, N), release(rn, N), release(ra, N);
        }
}

/* A rank of a 2-rank ring whose left neighbour writes `bytes` then closes (close_after) or stays
 * silent. Returns the call's status. */
static int hostile(const struct re_transport *tp, const void *bytes, size_t len, int close_after, int timeout_ms)
{
    struct re_codec codec;
    re_codec_inceptionn(&codec, -10);
    int out[2], in[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in))
        return -100;
    size_t n = 512;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = value(0, i, 3);
    /* the right neighbour never reads: the socket buffer takes this rank's few KiB */
    if (len && write(in[0], bytes, len) != (ssize_t)len)
        return -101;
    if (close_after)
        close(in[0]);
    struct rank k = {.ring = {.rank = 0, .size = 2, .send_fd = out[0], .recv_fd = in[1], .timeout_ms = timeout_ms,
                              .chunk = 256, .tp = tp, .codec = &codec},
                     .x = x, .n = n};
    rank_main(&k);
    if (!close_after)
        close(in[0]);
    close(in[1]), close(out[0]), close(out[1]);
    free(x);
    if (k.st)
        printf("  %s: %s\n", tp->name, k.err);
    return k.st;
}

static void hostile_peers(void)
{
    /* chunk 256 of 512 values on 2 ranks: one block of 256, one wire block: 257 floats */
    float w[257];
    w[0] = 1024.0f - 3;                              /* exponent -3: values must lie below 1.0 */
    for (int i = 1; i < 257; i++)
        w[i] = 0.5f;
    float bad_exp[257], bad_val[257];
    memcpy(bad_exp, w, sizeof w);
    memcpy(bad_val, w, sizeof w);
    bad_exp[0] = 5.0f;
    bad_val[100] = 3.0f;
    CHECK(hostile(&re_transport_tagged, bad_exp, sizeof bad_exp, 0, 5000) == RE_E_DATA, "bad exponent accepted");
    CHECK(hostile(&re_transport_tagged, bad_val, sizeof bad_val, 0, 5000) == RE_E_DATA, "bad value accepted");
    CHECK(hostile(&re_transport_tagged, w, 100, 1, 5000) == RE_E_PEER, "a cut chunk then close: not a peer failure");
    CHECK(hostile(&re_transport_tagged, NULL, 0, 0, 300) == RE_E_TIMEOUT, "silence: not a timeout");
    uint8_t long_frame[8] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
    CHECK(hostile(&re_transport_codec, long_frame, sizeof long_frame, 0, 5000) == RE_E_DATA, "long frame accepted");
    uint8_t junk[4 + 40] = {40, 0, 0, 0};
    for (int i = 4; i < 44; i++)
        junk[i] = (uint8_t)(0xA5 ^ i);
    CHECK(hostile(&re_transport_codec, junk, sizeof junk, 0, 5000) == RE_E_DATA, "corrupt stream accepted");
    uint8_t empty[4] = {0, 0, 0, 0};
    CHECK(hostile(&re_transport_codec, empty, sizeof empty, 0, 5000) == RE_E_DATA, "empty frame accepted");
    CHECK(hostile(&re_transport_raw, NULL, 0, 1, 5000) == RE_E_PEER, "closed: not a peer failure");
}

static void arguments(void)
{
    struct re_codec codec;
    re_codec_inceptionn(&codec, -10);
    float x[4] = {1, 2, 3, 4}, res[4] = {0};
    char err[128];
    struct re_ring r = {.rank = 0, .size = 1, .send_fd = -1, .recv_fd = -1, .timeout_ms = 100, .chunk = 8,
                        .tp = &re_transport_tagged, .codec = &codec};
    CHECK(re_allreduce(&r, x, 4, res, NULL, err, sizeof err) == RE_OK && x[3] == 4.0f, "a ring of one");
    r.tp = &re_transport_raw;
    CHECK(re_allreduce(&r, x, 4, res, NULL, err, sizeof err) == RE_E_ARG, "error feedback on exact floats accepted");
    r.tp = &re_transport_tagged;
    r.codec = NULL;
    CHECK(re_allreduce(&r, x, 4, NULL, NULL, err, sizeof err) == RE_E_ARG, "no codec accepted");
    r.codec = &codec;
    r.chunk = 0;
    CHECK(re_allreduce(&r, x, 4, NULL, NULL, err, sizeof err) == RE_E_ARG, "chunk 0 accepted");
    r.chunk = 8;
    r.rank = 1;
    CHECK(re_allreduce(&r, x, 4, NULL, NULL, err, sizeof err) == RE_E_ARG, "rank outside the ring accepted");
}

int main(void)
{
    arguments();
    rings();
    hostile_peers();
    printf("ring_engine: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
