/* Reads documents separated by NUL bytes on stdin and prints, one line each, the error bound
 * collective/nicd_bound.c finds in it or "none": the stats parser against real, cut and hostile
 * documents, under ASan/UBSan (tests/test_ring_security.py). Each document is copied into a
 * buffer of its exact size, so any read past its end is caught. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nicd_bound.h"

int main(void)
{
    static char in[1 << 22];
    size_t len = fread(in, 1, sizeof in, stdin), start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && in[i])
            continue;
        size_t n = i - start;
        char *doc = malloc(n ? n : 1);
        memcpy(doc, in + start, n);
        int k;
        if (nicd_bound_from_json(doc, n, &k) == 0)
            printf("%d\n", k);
        else
            printf("none\n");
        free(doc);
        start = i + 1;
        if (i == len)
            break;
    }
    return 0;
}
