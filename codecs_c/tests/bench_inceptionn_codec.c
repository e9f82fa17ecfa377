/*
 * C perf harness for the INCEPTIONN codec (no Python in the loop): GB/s of float32 input for
 * encode and decode, scalar and AVX2, beside memcpy, on synthetic data of a chosen magnitude.
 * Usage: bench_inceptionn_codec [n_values] [log10_scale] [k]
 * The product benchmark on real gradients is `inceptionn bench codec`.
 */
#include "inceptionn_codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 4u << 20;
    double scale = argc > 2 ? pow(10, atof(argv[2])) : 1e-3;
    int k = argc > 3 ? atoi(argv[3]) : -10;
    float *x = malloc(n * 4), *y = malloc(n * 4), *c = malloc(n * 4);
    size_t cap = inc_max_encoded_size(n);
    uint8_t *enc = malloc(cap);
    srand(1);
    for (size_t i = 0; i < n; i++) { /* Laplace-ish magnitudes like gradients */
        double u = (rand() + 1.0) / ((double)RAND_MAX + 2.0);
        x[i] = (float)(scale * log(u) * (rand() & 1 ? 1 : -1));
    }
    memset(y, 0, n * 4); memset(c, 0, n * 4); memset(enc, 0, cap);
    ptrdiff_t len = inc_encode(x, n, k, enc, cap, INC_IMPL_SCALAR);
    const char *names[5] = {"memcpy", "encode scalar", "encode avx2", "decode scalar", "decode avx2"};
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
    for (int r = 0; r < 15; r++) {
        for (int v = 0; v < 5; v++) {
            if (!inc_have_avx2() && (v == 2 || v == 4)) continue;
            double t0 = now();
            switch (v) {
            case 0: memcpy(c, x, n * 4); break;
            case 1: inc_encode(x, n, k, enc, cap, INC_IMPL_SCALAR); break;
            case 2: inc_encode(x, n, k, enc, cap, INC_IMPL_AVX2); break;
            case 3: inc_decode(enc, (size_t)len, y, n, NULL, INC_IMPL_SCALAR); break;
            case 4: inc_decode(enc, (size_t)len, y, n, NULL, INC_IMPL_AVX2); break;
            }
            double t = now() - t0;
            if (t < best[v]) best[v] = t;
        }
    }
    printf("n=%zu scale=%g k=%d ratio=%.2fx\n", n, scale, k, (double)n * 4 / (double)len);
    for (int v = 0; v < 5; v++)
        printf("%-14s %6.2f GB/s (best of 15)\n", names[v], n * 4 / best[v] / 1e9);
    return 0;
}
