/* Reading the soft NIC's error bound from its stats socket (nicd_bound.h). */
#define _GNU_SOURCE
#include "nicd_bound.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DOC_MAX 65536
#define ANSWER_MS 3000

/* Index past the JSON string starting at doc[i] (a quote), or len if it does not end. */
static size_t skip_string(const char *doc, size_t len, size_t i)
{
    for (i++; i < len; i++) {
        if (doc[i] == '\\')
            i++;
        else if (doc[i] == '"')
            return i + 1;
    }
    return len;
}

static size_t skip_space(const char *doc, size_t len, size_t i)
{
    while (i < len && (doc[i] == ' ' || doc[i] == '\n' || doc[i] == '\t' || doc[i] == '\r'))
        i++;
    return i;
}

static int key_is(const char *doc, size_t a, size_t b, const char *key)
{
    size_t n = strlen(key);
    return b - a == n + 2 && !memcmp(doc + a + 1, key, n);
}

/* The integer at key (at depth 1 of the object "config" at depth 1 of the document). */
int nicd_bound_from_json(const char *doc, size_t len, int *k)
{
    int depth = 0, in_config = 0;
    size_t i = 0;
    while (i < len) {
        char ch = doc[i];
        if (ch == '"') {
            size_t end = skip_string(doc, len, i), after = skip_space(doc, len, end);
            int is_key = after < len && doc[after] == ':';
            if (is_key && depth == 1 && key_is(doc, i, end, "config")) {
                size_t v = skip_space(doc, len, after + 1);
                if (v < len && doc[v] == '{') {
                    in_config = 1;
                    depth = 2;
                    i = v + 1;
                    continue;
                }
            }
            if (is_key && depth == 2 && in_config && key_is(doc, i, end, "error_bound")) {
                size_t v = skip_space(doc, len, after + 1), e = v;
                char num[16];
                while (e < len && e - v < sizeof num - 1 && (doc[e] == '-' || (doc[e] >= '0' && doc[e] <= '9')))
                    e++;
                /* the number must end inside the document: a cut one ("-1" of "-10") is no bound */
                if (e == v || e - v >= sizeof num - 1 || e == len || !doc[e] || !strchr(",} \n\t\r", doc[e]))
                    return -1;
                memcpy(num, doc + v, e - v);
                num[e - v] = 0;
                char *stop;
                long x = strtol(num, &stop, 10);
                if (*stop || x < -64 || x > 64)
                    return -1;
                *k = (int)x;
                return 0;
            }
            i = end;
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']') {
            depth--;
            if (depth < 2)
                in_config = 0;
        }
        i++;
    }
    return -1;
}

int nicd_error_bound(const char *path, int *k, char *why, size_t whylen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, whylen, "soft NIC stats socket path too long: %.60s...", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, (void *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED)
            return 0;
        snprintf(why, whylen, "cannot read the soft NIC's stats at %.80s: %s%s", path, strerror(e),
                 e == EACCES ? " (the ranks' user must be in the daemon's group)" : "");
        return -1;
    }
    char *doc = malloc(DOC_MAX);
    size_t len = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = -1;
    snprintf(why, whylen, "the soft NIC at %.80s did not answer within %d s", path, ANSWER_MS / 1000);
    while (doc) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long left = ANSWER_MS - (long)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        ssize_t n = recv(fd, doc + len, DOC_MAX - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, whylen, "reading the soft NIC's stats at %.80s: %s", path, strerror(errno));
            break;
        }
        len += (size_t)n;
        if (n == 0 || len == DOC_MAX) {
            if (nicd_bound_from_json(doc, len, k) == 0)
                rc = 1;
            else
                snprintf(why, whylen, "the soft NIC's stats at %.80s give no error bound", path);
            break;
        }
    }
    if (!doc)
        snprintf(why, whylen, "out of memory");
    free(doc);
    close(fd);
    return rc;
}
