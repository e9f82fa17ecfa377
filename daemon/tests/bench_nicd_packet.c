/*
 * The soft NIC's gso transform on its own (no queue, no kernel): CPU time per 64 KB super-packet
 * of nicd_compress_gso_codec cut for MTU 1500, and of its parts (the copy into scratch, the codec,
 * a stream histogram, the CRC32C, one restore), on synthetic Gaussian values (a fixed seed).
 * Thread CPU time, so a loaded machine's waits are not counted. docs/perf.md has figures.
 *   make build/bench_nicd_packet && ./build/bench_nicd_packet [codec 1|2] [iterations]
 * Before/after a change: build it once more against the other nicd_packet.c, run both in turn.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inceptionn_codec.h"
#include "nicd_packet.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint8_t pkt[65536] __attribute__((aligned(64)));
static uint8_t out[NICD_MAX_PACKET + 64 * 128], stream[2048 * INC_MAX_GROUP_BYTES], back[NICD_MAX_PACKET + 64];
static float scratch[16384 + 16];

int main(int argc, char **argv)
{
    int codec = argc > 1 ? atoi(argv[1]) : 1, iters = argc > 2 ? atoi(argv[2]) : 3000;
    size_t hl = 20 + 32, plen = (65536 - 100) & ~(size_t)3, n = plen / 4, tot = hl + plen;
    pkt[0] = 0x45, pkt[2] = (uint8_t)(tot >> 8), pkt[3] = (uint8_t)tot, pkt[8] = 64, pkt[9] = 6;
    pkt[12] = 198, pkt[13] = 18, pkt[15] = 1, pkt[16] = 198, pkt[17] = 18, pkt[19] = 2;
    uint8_t *t = pkt + 20;
    t[0] = 0x9c, t[1] = 0x40, t[2] = 0x13, t[3] = 0x88, t[12] = (32 / 4) << 4, t[13] = 0x18;
    srand(1);
    for (size_t i = 0; i < n; i++) { /* codec 1: values a sender scaled; codec 2: raw gradients */
        double u = (rand() + 1.0) / RAND_MAX, v = rand() / (double)RAND_MAX;
        float f = (float)(sqrt(-2 * log(u)) * cos(6.283185 * v) * (codec == 1 ? 0.02 : 0.0003));
        memcpy(pkt + hl + 4 * i, &f, 4);
    }
    struct nicd_pkt p;
    if (nicd_parse(pkt, tot, &p) != NICD_OK)
        return 1;
    size_t seg_len[64];
    int ns = 0;
    uint64_t tiers[4] = {0, 0, 0, 0};
    ptrdiff_t r = 0;
    double t0 = now();
    for (int i = 0; i < iters; i++)
        r = nicd_compress_gso_codec(&p, 0, codec, -10, 0x2C, 0, 1500, out, sizeof out, seg_len, &ns, 64, scratch,
                                    stream, sizeof stream, tiers);
    double t1 = now();
    if (r <= 0)
        return 2;
    printf("codec %d: nicd_compress_gso_codec %.2f us per 64 KB super-packet (%d packets, %.2fx)\n", codec,
           (t1 - t0) / iters * 1e6, ns, (double)tot / (double)r);
    t0 = now();
    for (int i = 0; i < iters; i++)
        memcpy(scratch, pkt + hl, 4 * n);
    printf("  copy into scratch %.2f us\n", (now() - t0) / iters * 1e6);
    ptrdiff_t sl = 0;
    t0 = now();
    for (int i = 0; i < iters; i++)
        sl = inc_encode(scratch, n, -10, stream, sizeof stream, INC_IMPL_AUTO);
    printf("  inc_encode %.2f us\n", (now() - t0) / iters * 1e6);
    t0 = now();
    for (int i = 0; i < iters; i++)
        inc_stream_histogram(stream, (size_t)sl, n, tiers);
    printf("  inc_stream_histogram %.2f us\n", (now() - t0) / iters * 1e6);
    t0 = now();
    for (int i = 0; i < iters; i++)
        nicd_crc32c(0, out, (size_t)r);
    printf("  CRC32C over the packets %.2f us\n", (now() - t0) / iters * 1e6);
    struct nicd_pkt q;
    if (nicd_parse(out, seg_len[0], &q) != NICD_OK)
        return 3;
    t0 = now();
    for (int i = 0; i < iters * ns; i++)
        nicd_restore(&q, 0x28, back, sizeof back, scratch);
    printf("  nicd_restore of one packet %.2f us\n", (now() - t0) / (iters * ns) * 1e6);
    return 0;
}
