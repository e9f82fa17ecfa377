/* Reads lines "KEYHEX MSGHEX" ("-" for an empty message) and prints HMAC-SHA256(key, msg) in hex,
 * one line each, as the ring's handshake computes it (ring_hs_hmac, collective/ring_handshake.c):
 * against RFC 4231's vectors and Python's hmac (tests/test_ring_hmac.py). The message is split
 * into three parts to check that the MAC over parts is the MAC over their concatenation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_handshake.h"

static size_t unhex(const char *s, unsigned char *out, size_t cap)
{
    size_t n = 0;
    if (!strcmp(s, "-"))
        return 0;
    for (; s[0] && s[1] && n < cap; s += 2) {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1)
            exit(3);
        out[n++] = (unsigned char)v;
    }
    return n;
}

int main(void)
{
    static char line[1 << 16];
    static unsigned char key[4096], msg[16384];
    char k[8200], m[33000];
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "%8199s %32999s", k, m) != 2)
            return 2;
        size_t ml = unhex(m, msg, sizeof msg), kl = unhex(k, key, sizeof key), a = ml / 3, b = ml / 2;
        const void *parts[3] = {msg, msg + a, msg + b};
        size_t lens[3] = {a, b - a, ml - b};
        unsigned char out[RING_HS_MAC];
        if (ring_hs_hmac(key, kl, parts, lens, 3, out) != 0)
            return 4;
        for (int i = 0; i < RING_HS_MAC; i++)
            printf("%02x", out[i]);
        printf("\n");
    }
    return 0;
}
