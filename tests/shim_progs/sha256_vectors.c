/* Reads lines "KEYHEX MSGHEX" (KEYHEX "-": plain SHA-256; "" as "-" for an empty message) and prints
 * SHA-256(msg) or HMAC-SHA256(key, msg) in hex, one line each: collective/ring_sha256.c against
 * Python's hashlib/hmac (tests/test_ring_security.py). The message is split into three parts to
 * check that HMAC over parts is HMAC over their concatenation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_sha256.h"

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
        size_t ml = unhex(m, msg, sizeof msg);
        unsigned char out[RING_SHA256_BYTES];
        if (!strcmp(k, "-")) {
            ring_sha256(msg, ml, out);
        } else {
            size_t kl = unhex(k, key, sizeof key), a = ml / 3, b = ml / 2;
            const void *parts[3] = {msg, msg + a, msg + b};
            size_t lens[3] = {a, b - a, ml - b};
            ring_hmac_sha256(key, kl, parts, lens, 3, out);
        }
        for (int i = 0; i < RING_SHA256_BYTES; i++)
            printf("%02x", out[i]);
        printf("\n");
    }
    return 0;
}
