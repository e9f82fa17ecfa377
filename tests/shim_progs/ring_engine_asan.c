/* collective/ring_engine.c under ASan/UBSan, without MPI: rings of 2..5 "ranks" as threads over
 * socket pairs, every transport (raw, tagged, codec) and lengths from 0 to past several chunks.
 * Checked: every rank ends with the same bits; the tagged and codec transports give the same bits
 * (one wire, two carriers) and the same residuals; the raw sum is within float32 rounding of the
 * exact one, the scaled one within wire format v2's; error feedback's residual holds sent -
 * decoded (the sum of every rank's input equals the result plus every rank's residual, up to
 * rounding). Then a rank whose left neighbour is hostile: a bad exponent, a value out of its
 * block's range, a frame longer than its chunk, a corrupt codec stream, a closed connection and
 * silence each fail the call with the status they must, reading nothing past what was expected.
 * THC (codecs_c/thc_codec.c, in the ring), summed without decoding: rings of 2..5 with bit-identical ranks,
 * an NMSE bound and error feedback's residuals; and a left neighbour sending a partial sum of the
 * wrong count, with a value above its count's range, of another rotation, cut short or with
 * bytes after it, each failing the call with RE_E_DATA.
 * Last line: "N passed, 0 failed" (codecs_c/tests/check.h). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "inceptionn_codec.h"
#include "ring_engine.h"
#include "terngrad_codec.h"
#include "thc_codec.h"
#include "threelc_codec.h"

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

/* Join N rank threads; the first nonzero status (its rank's line on stderr), and whether what each
 * rank sent is what its right neighbour received. */
static int join_ranks(struct rank *k, pthread_t *t, int N, const char *what)
{
    int st = 0;
    for (int r = 0; r < N; r++) {
        pthread_join(t[r], NULL);
        if (k[r].st && !st) {
            st = k[r].st;
            fprintf(stderr, "%s rank %d: %s\n", what, r, k[r].err);
        }
    }
    for (int r = 0; r < N && !st; r++)
        CHECK(k[r].stats.bytes_sent == k[(r + 1) % N].stats.bytes_received, "%s: bytes of rank %d's link", what, r);
    return st;
}

/* One ring of N ranks over socket pairs; out[r] (n floats each) gets rank r's result, res[r] its
 * residual when feedback. Returns the first nonzero status. */
static int ring(int N, size_t n, size_t chunk, const struct re_transport *tp, int feedback, float **out, float **res,
                struct re_codec *const *others)
{
    struct re_codec inc;
    re_codec_inceptionn(&inc, -10);
    int fds[MAXR][2];
    struct rank k[MAXR];
    pthread_t t[MAXR];
    for (int r = 0; r < N; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds[r]) != 0)
            return -100;
    for (int r = 0; r < N; r++) {
        /* pair r: rank r sends on [0], rank r + 1 receives on [1]; feedback: compensated by 0 */
        k[r] = (struct rank){.ring = {.rank = r, .size = N, .send_fd = fds[r][0], .recv_fd = fds[(r + N - 1) % N][1],
                                      .timeout_ms = 20000, .chunk = chunk, .tp = tp,
                                      .codec = others ? others[r] : &inc},
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
    int st = join_ranks(k, t, N, tp->name);
    for (int r = 0; r < N && !st; r++)      /* raw: 2 (N - 1) / N of the values */
        if (tp == &re_transport_raw)
            CHECK(k[r].stats.bytes_sent <= 4 * (2 * (n / (size_t)N + 1)) * (size_t)(N - 1), "raw bytes");
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
            CHECK(ring(N, n, chunk, &re_transport_raw, 0, raw, NULL, NULL) == 0, "raw N=%d n=%zu", N, n);
            CHECK(ring(N, n, chunk, &re_transport_nic, 1, nic, rn, NULL) == 0, "nic N=%d n=%zu", N, n);
            CHECK(ring(N, n, chunk, &re_transport_app, 1, app, ra, NULL) == 0, "app N=%d n=%zu", N, n);
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
static int hostile(const struct re_transport *tp, const void *bytes, size_t len, int close_after, int timeout_ms,
                   const struct re_codec *other)
{
    struct re_codec inc;
    re_codec_inceptionn(&inc, -10);
    const struct re_codec *codec = other ? other : &inc;
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
                              .chunk = 256, .tp = tp, .codec = codec},
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
    CHECK(hostile(&re_transport_nic, bad_exp, sizeof bad_exp, 0, 5000, NULL) == RE_E_DATA, "bad exponent accepted");
    CHECK(hostile(&re_transport_nic, bad_val, sizeof bad_val, 0, 5000, NULL) == RE_E_DATA, "bad value accepted");
    CHECK(hostile(&re_transport_nic, w, 100, 1, 5000, NULL) == RE_E_PEER, "a cut chunk then close: not a peer failure");
    CHECK(hostile(&re_transport_nic, NULL, 0, 0, 300, NULL) == RE_E_TIMEOUT, "silence: not a timeout");
    uint8_t long_frame[8] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
    CHECK(hostile(&re_transport_app, long_frame, sizeof long_frame, 0, 5000, NULL) == RE_E_DATA, "long frame accepted");
    uint8_t junk[4 + 40] = {40, 0, 0, 0};
    for (int i = 4; i < 44; i++)
        junk[i] = (uint8_t)(0xA5 ^ i);
    CHECK(hostile(&re_transport_app, junk, sizeof junk, 0, 5000, NULL) == RE_E_DATA, "corrupt stream accepted");
    uint8_t empty[4] = {0, 0, 0, 0};
    CHECK(hostile(&re_transport_app, empty, sizeof empty, 0, 5000, NULL) == RE_E_DATA, "empty frame accepted");
    CHECK(hostile(&re_transport_raw, NULL, 0, 1, 5000, NULL) == RE_E_PEER, "closed: not a peer failure");
}


/* --- THC, summed in the encoded domain ---------------------------------------------------------- */

static const uint8_t THC_TABLE[16] = {0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 21, 23, 25, 27, 30};
#define THC_TP 2.1538746940614146       /* t_p(1/32), thc_table_generator.py */
#define THC_ROT 0x5EED5EEDull

static void thc_state(struct re_thc *s, int N, int rank, double norm)
{
    memset(s, 0, sizeof *s);
    s->bits = 4, s->granularity = 30, s->ranks = N;
    memcpy(s->table, THC_TABLE, sizeof THC_TABLE);
    s->t_p = THC_TP, s->norm = norm, s->rot_seed = THC_ROT, s->noise_seed = 1000u + (unsigned)rank;
}

/* A ring of N THC ranks (each its own codec state: encode counts its calls), one chunk per block
 * as Group runs it; out[r] gets rank r's result, res[r] its residual. */
static int thc_ring(int N, size_t n, float **out, float **res)
{
    struct re_codec codec[MAXR];
    struct re_thc st[MAXR];
    int fds[MAXR][2];
    struct rank k[MAXR];
    pthread_t t[MAXR];
    double norm = 0;
    for (int r = 0; r < N; r++) {
        double s = 0;
        for (size_t i = 0; i < n; i++)
            s += (double)value(r, i, 11) * value(r, i, 11);
        norm = fmax(norm, sqrt(s));
    }
    for (int r = 0; r < N; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds[r]) != 0)
            return -100;
    for (int r = 0; r < N; r++) {
        thc_state(&st[r], N, r, norm);
        re_codec_thc(&codec[r], &st[r]);
        k[r] = (struct rank){.ring = {.rank = r, .size = N, .send_fd = fds[r][0], .recv_fd = fds[(r + N - 1) % N][1],
                                      .timeout_ms = 20000, .chunk = n ? n : 1, .tp = &re_transport_app,
                                      .codec = &codec[r]},
                             .x = out[r], .res = res[r], .n = n};
        for (size_t i = 0; i < n; i++)
            out[r][i] = value(r, i, 11);
        pthread_create(&t[r], NULL, rank_main, &k[r]);
    }
    int status = join_ranks(k, t, N, "thc");
    for (int r = 0; r < N; r++)
        close(fds[r][0]), close(fds[r][1]);
    return status;
}

static void thc_rings(void)
{
    static const size_t lens[] = {0, 1, 7, 1001, 5000};
    for (int N = 2; N <= MAXR; N++)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            size_t n = lens[li];
            float **out = alloc(N, n), **res = alloc(N, n);
            CHECK(thc_ring(N, n, out, res) == 0, "thc N=%d n=%zu", N, n);
            int same = 1;
            for (int r = 0; r < N; r++)
                same &= !memcmp(out[r], out[0], n * 4);
            double err2 = 0, ref2 = 0, ef2 = 0;
            for (size_t i = 0; i < n; i++) {
                double s = 0, held = out[0][i];
                for (int r = 0; r < N; r++) {
                    s += value(r, i, 11);
                    held += res[r][i];
                }
                err2 += (out[0][i] - s) * (out[0][i] - s);
                ef2 += (held - s) * (held - s);
                ref2 += s * s;
            }
            CHECK(same, "thc ranks differ, N=%d n=%zu", N, n);
            /* 4-bit THC with one range for the whole vector: NMSE ~0.01 N */
            CHECK(n < 1000 || err2 < 0.1 * ref2, "thc NMSE %g, N=%d n=%zu", err2 / ref2, N, n);
            /* result + every rank's residual = the inputs' sum, up to the transforms' rounding */
            CHECK(ef2 <= 1e-9 * ref2, "thc: result + residuals is off the input sum (%g), N=%d n=%zu", ef2 / ref2,
                  N, n);
            release(out, N), release(res, N);
        }
}

/* Rank 0 of a 2-rank THC ring (512 values, blocks of 256) whose left neighbour sends one frame:
 * the call's status. */
static int thc_hostile(const uint8_t *blob, size_t len, uint32_t frame_len)
{
    size_t n = 512;
    float *x = malloc(n * sizeof(float));
    double s2 = 0;
    for (size_t i = 0; i < n; i++)
        x[i] = value(0, i, 3), s2 += (double)x[i] * x[i];
    struct re_thc st;
    struct re_codec codec;
    thc_state(&st, 2, 0, sqrt(s2));
    re_codec_thc(&codec, &st);
    int out[2], in[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in))
        return -100;
    uint8_t *frame = malloc(4 + len);
    frame[0] = frame_len & 0xff, frame[1] = (frame_len >> 8) & 0xff, frame[2] = (frame_len >> 16) & 0xff;
    frame[3] = frame_len >> 24;
    memcpy(frame + 4, blob, len);
    if (write(in[0], frame, 4 + len) != (ssize_t)(4 + len))
        return -101;
    free(frame);
    struct rank k = {.ring = {.rank = 0, .size = 2, .send_fd = out[0], .recv_fd = in[1], .timeout_ms = 1000,
                              .chunk = 256, .tp = &re_transport_app, .codec = &codec},
                     .x = x, .n = n};
    rank_main(&k);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    free(x);
    if (k.st)
        printf("  thc: %s\n", k.err);
    return k.st;
}

static void thc_hostile_peers(void)
{
    /* what rank 1 would send for block 1 of rank 0's ring: a 4-bit index blob of 256 values on
     * the same range and rotation (its norm: rank 0's, as agreed in thc_hostile) */
    float v[256], work[256];
    double s2 = 0;
    for (size_t i = 0; i < 512; i++)
        s2 += (double)value(0, i, 3) * value(0, i, 3);
    for (size_t i = 0; i < 256; i++)
        v[i] = value(1, 256 + i, 3);
    float m = (float)(THC_TP * sqrt(s2) / sqrt(256.0));
    uint8_t idx[24 + 16 + 128], one[24 + 16 + 256], two[24 + 16 + 256], big[24 + 16 + 256 + 8];
    CHECK(thc_encode(v, 256, m, THC_ROT, 77, 4, 30, THC_TABLE, work, idx, sizeof idx) == (ptrdiff_t)sizeof idx,
          "thc: the hostile test's blob");
    /* a right one passes: rank 0 then waits for block 0's sum until its timeout */
    CHECK(thc_hostile(idx, sizeof idx, sizeof idx) == RE_E_TIMEOUT, "thc: a right partial sum refused");
    const uint8_t *b2[2] = {idx, idx};
    size_t l2[2] = {sizeof idx, sizeof idx};
    CHECK(thc_sum(b2, l2, 1, 256, 8, one, sizeof one, NULL) == (ptrdiff_t)sizeof one, "thc: a sum of one");
    CHECK(thc_sum(b2, l2, 2, 256, 8, two, sizeof two, NULL) == (ptrdiff_t)sizeof two, "thc: a sum of two");
    CHECK(thc_hostile(one, sizeof one, sizeof one) == RE_E_TIMEOUT, "thc: a right kind-1 sum of one refused");
    CHECK(thc_hostile(two, sizeof two, sizeof two) == RE_E_DATA, "thc: a sum of two ranks where one is due");
    one[24 + 16 + 100] = 31;                                   /* above count * g = 30 */
    CHECK(thc_hostile(one, sizeof one, sizeof one) == RE_E_DATA, "thc: a value above its count's range");
    one[24 + 16 + 100] = 3;
    uint8_t other[sizeof idx];
    memcpy(other, idx, sizeof idx);
    other[16] ^= 1;                                            /* another rotation seed */
    CHECK(thc_hostile(other, sizeof other, sizeof other) == RE_E_DATA, "thc: another rotation accepted");
    memcpy(other, idx, sizeof idx);
    other[12] ^= 1;                                            /* another range M */
    CHECK(thc_hostile(other, sizeof other, sizeof other) == RE_E_DATA, "thc: another range accepted");
    CHECK(thc_hostile(idx, sizeof idx - 1, sizeof idx - 1) == RE_E_DATA, "thc: a cut blob accepted");
    memcpy(big, idx, sizeof idx);                              /* within the frame's cap */
    memset(big + sizeof idx, 0, 8);
    CHECK(thc_hostile(big, sizeof idx + 8, sizeof idx + 8) == RE_E_DATA, "thc: bytes after the blob accepted");
    CHECK(thc_hostile(idx, sizeof idx, 0xFFFFFF) == RE_E_DATA, "thc: a frame longer than a block accepted");
}

/* 3LC and TernGrad (codecs_c/threelc_codec.c, terngrad_codec.c) in the codec transport: decoded, added, re-encoded
 * per hop, one chunk per block as Group runs it; ranks bit-identical, error feedback's residuals
 * add up; a corrupt stream fails the call. Each rank its own codec state (TernGrad's encodes move
 * its random stream on). */
static void reencoding_rings(const char *what, struct re_codec *codec)
{
    struct re_codec *each[MAXR];
    static const size_t lens[] = {1, 7, 1001, 5000};
    for (int N = 2; N <= MAXR; N++)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            size_t n = lens[li];
            for (int r = 0; r < N; r++)
                each[r] = &codec[r];
            float **out = alloc(N, n), **res = alloc(N, n);
            CHECK(ring(N, n, n, &re_transport_app, 1, out, res, each) == 0, "%s N=%d n=%zu", what, N, n);
            int same = 1, ef = 1;
            for (int r = 0; r < N; r++)
                same &= !memcmp(out[r], out[0], n * 4);
            for (size_t i = 0; i < n; i++) {
                double s = 0, a = fabs(out[0][i]), held = out[0][i];
                for (int r = 0; r < N; r++)      /* a: the magnitudes summed, for the rounding */
                    s += value(r, i, 7), a += fabs(value(r, i, 7)) + fabs(res[r][i]), held += res[r][i];
                ef &= fabs(held - s) <= 1e-5 * a + 1e-12;
            }
            CHECK(same, "%s ranks differ, N=%d n=%zu", what, N, n);
            CHECK(ef, "%s: result + residuals is not the input sum, N=%d n=%zu", what, N, n);
            release(out, N), release(res, N);
        }
    uint8_t junk[4 + 40] = {40, 0, 0, 0};
    for (int i = 4; i < 44; i++)
        junk[i] = (uint8_t)(0x5A ^ i);
    CHECK(hostile(&re_transport_app, junk, sizeof junk, 0, 5000, &codec[0]) == RE_E_DATA, "%s: corrupt stream accepted",
          what);
    uint8_t cut[4 + 11] = {11, 0, 0, 0};                       /* shorter than a 12-byte header */
    CHECK(hostile(&re_transport_app, cut, sizeof cut, 0, 5000, &codec[0]) == RE_E_DATA, "%s: cut header accepted", what);
}

static void other_codecs(void)
{
    struct re_tlc tlc = {.sparsity = 1.0f, .zre = 1};
    struct re_tg tg[MAXR];
    struct re_codec codec[MAXR];
    for (int r = 0; r < MAXR; r++)
        re_codec_threelc(&codec[r], &tlc);
    reencoding_rings("3lc", codec);
    for (int r = 0; r < MAXR; r++) {
        tg[r] = (struct re_tg){.clip = 2.5, .shared = -1.0f, .packing = TG_PACK_2BIT, .seed = 100u + (unsigned)r};
        re_codec_terngrad(&codec[r], &tg[r]);
    }
    reencoding_rings("terngrad", codec);
    CHECK(tg[0].draw > 0, "terngrad: the random stream did not move on");
}

static void arguments(void)
{
    struct re_codec codec;
    re_codec_inceptionn(&codec, -10);
    float x[4] = {1, 2, 3, 4}, res[4] = {0};
    char err[128];
    struct re_ring r = {.rank = 0, .size = 1, .send_fd = -1, .recv_fd = -1, .timeout_ms = 100, .chunk = 8,
                        .tp = &re_transport_nic, .codec = &codec};
    CHECK(re_allreduce(&r, x, 4, res, NULL, err, sizeof err) == RE_OK && x[3] == 4.0f, "a ring of one");
    r.tp = &re_transport_raw;
    CHECK(re_allreduce(&r, x, 4, res, NULL, err, sizeof err) == RE_E_ARG, "error feedback on exact floats accepted");
    r.tp = &re_transport_nic;
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
    thc_rings();
    thc_hostile_peers();
    other_codecs();
    printf("ring_engine: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
