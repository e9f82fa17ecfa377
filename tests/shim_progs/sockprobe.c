/* Plain socket code, no tagging of its own, for tests/test_shim.py (sockprobe.py is its twin).
 *
 *   sockprobe [--settos-before V] [--settos-after V] [--explicit] [--udp ADDR:PORT] [--unix]
 *             ADDR:PORT...            (IPv6: [ADDR]:PORT)
 *
 * For each endpoint: listen on it, connect a client to it, accept, move 64 KiB each way in
 * 16 KiB steps, and print one JSON line with the ToS (IP_TOS, IPv6: IPV6_TCLASS) of the
 * client, the accepted and the listening socket as getsockopt() reports it. --settos-* set the
 * client's ToS before/after connect(); --explicit calls inceptionn_tag_socket() on the client
 * (looked up with dlsym, so the program also runs without the library). --udp sends datagrams
 * from a connect()ed UDP socket to a bound one; --unix runs a unix stream socket through
 * listen/connect/accept.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CHUNK 16384
#define ROUNDS 4

static void die(const char *what)
{
    fprintf(stderr, "sockprobe: %s: %s\n", what, strerror(errno));
    exit(3);
}

static int parse_ep(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[128];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    int port = atoi(colon + 1);
    memset(ss, 0, sizeof *ss);
    if (host[0] == '[') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        host[strlen(host) - 1] = 0;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1) return -1;
        *len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1) return -1;
        *len = sizeof *a;
    }
    return port;
}

static int tos_of(int fd, int fam)
{
    int v = -1;
    socklen_t l = sizeof v;
    if (fam == AF_INET6) getsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, &l);
    else getsockopt(fd, IPPROTO_IP, IP_TOS, &v, &l);
    return v;
}

static void set_tos(int fd, int fam, int v)
{
    int r = fam == AF_INET6 ? setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, sizeof v)
                            : setsockopt(fd, IPPROTO_IP, IP_TOS, &v, sizeof v);
    if (r) die("setsockopt");
}

static void xfer(int from, int to)
{
    static char buf[CHUNK];
    for (int r = 0; r < ROUNDS; r++) {
        memset(buf, r, sizeof buf);
        size_t sent = 0, got = 0;
        while (sent < CHUNK) {
            ssize_t w = send(from, buf + sent, CHUNK - sent, 0);
            if (w <= 0) die("send");
            sent += (size_t)w;
        }
        while (got < CHUNK) {
            ssize_t n = recv(to, buf + got, CHUNK - got, 0);
            if (n <= 0) die("recv");
            got += (size_t)n;
        }
    }
}

int main(int argc, char **argv)
{
    int before = -1, after = -1, explicit = 0, do_unix = 0;
    const char *udp = NULL;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--settos-before") && i + 1 < argc) before = (int)strtol(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--settos-after") && i + 1 < argc) after = (int)strtol(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--explicit")) explicit = 1;
        else if (!strcmp(argv[i], "--udp") && i + 1 < argc) udp = argv[++i];
        else if (!strcmp(argv[i], "--unix")) do_unix = 1;
        else { fprintf(stderr, "sockprobe: bad option %s\n", argv[i]); return 2; }
    }
    int (*tag)(int) = explicit ? (int (*)(int))dlsym(RTLD_DEFAULT, "inceptionn_tag_socket") : NULL;
    if (explicit)
        printf("{\"kind\": \"explicit\", \"found\": %s}\n", tag ? "true" : "false");
    for (; i < argc; i++) {
        struct sockaddr_storage ss;
        socklen_t len;
        int port = parse_ep(argv[i], &ss, &len), one = 1;
        if (port < 0) { fprintf(stderr, "sockprobe: bad endpoint %s\n", argv[i]); return 2; }
        int fam = ss.ss_family;
        int l = socket(fam, SOCK_STREAM, 0);
        if (l < 0) die("socket");
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&ss, len) || listen(l, 4)) die("bind/listen");
        int c = socket(fam, SOCK_STREAM, 0);
        if (before >= 0) set_tos(c, fam, before);
        if (tag && tag(c) != 0) die("inceptionn_tag_socket");
        if (connect(c, (struct sockaddr *)&ss, len)) die("connect");
        if (after >= 0) set_tos(c, fam, after);
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        xfer(c, s);
        xfer(s, c);
        printf("{\"kind\": \"tcp\", \"endpoint\": \"%s\", \"port\": %d, \"client_tos\": %d, \"server_tos\": %d, \"listener_tos\": %d}\n",
               argv[i], port, tos_of(c, fam), tos_of(s, fam), tos_of(l, fam));
        close(c);
        close(s);
        close(l);
    }
    if (udp) {
        struct sockaddr_storage ss;
        socklen_t len;
        int port = parse_ep(udp, &ss, &len);
        if (port < 0) return 2;
        int r = socket(ss.ss_family, SOCK_DGRAM, 0), u = socket(ss.ss_family, SOCK_DGRAM, 0);
        if (r < 0 || bind(r, (struct sockaddr *)&ss, len)) die("udp bind");
        if (u < 0 || connect(u, (struct sockaddr *)&ss, len)) die("udp connect");
        char d[16];
        for (int k = 0; k < 20; k++)
            if (send(u, "gradient?", 9, 0) < 0 || recv(r, d, sizeof d, 0) != 9) die("udp send/recv");
        close(r);
        printf("{\"kind\": \"udp\", \"port\": %d, \"tos\": %d}\n", port, tos_of(u, ss.ss_family));
        close(u);
    }
    if (do_unix) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "inceptionn-sockprobe-%d", (int)getpid());
        socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
        int l = socket(AF_UNIX, SOCK_STREAM, 0), c = socket(AF_UNIX, SOCK_STREAM, 0);
        if (bind(l, (struct sockaddr *)&a, len) || listen(l, 1) || connect(c, (struct sockaddr *)&a, len)) die("unix");
        int s = accept(l, NULL, NULL);
        if (s < 0) die("unix accept");
        xfer(c, s);
        printf("{\"kind\": \"unix\", \"ok\": true}\n");
        close(c);
        close(s);
        close(l);
    }
    return 0;
}
