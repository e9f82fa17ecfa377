/* collective/ring_handshake.c under ASan/UBSan, without MPI: two "ranks" of a 2-rank ring as
 * threads on loopback, while a third thread throws at both listeners what a local user could
 * (random bytes, NaNs, a well-formed hello with a forged proof, a hello cut short and held, one
 * trickled byte by byte, more connections than the handshake holds). Both must finish proven,
 * with the connections from one to the other; then, with different secrets, both must fail before
 * the deadline: the first challenge checked fails, and that rank's listener, shut down, resets the
 * other's connection. Prints one line per run; exit 0 when all is as expected. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ring_handshake.h"

#define MAGIC 20181024.0f

struct run {
    struct ring_hs hs;
    int send_fd, recv_fd, refused, rc;
    char why[256];
};

static void *rank_main(void *arg)
{
    struct run *r = arg;
    r->rc = ring_handshake(&r->hs, &r->send_fd, &r->recv_fd, &r->refused, r->why, sizeof r->why);
    return NULL;
}

static int listener(uint16_t *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (void *)&a, sizeof a) || listen(fd, 64) || getsockname(fd, (void *)&a, &l))
        exit(3);
    *port = a.sin_port;
    return fd;
}

static int dial(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = port};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (void *)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

static uint16_t ports[2];
static int held[64], nheld;

static void *attacker(void *arg)
{
    (void)arg;
    for (int round = 0; round < 3; round++)
        for (int t = 0; t < 2; t++) {
            float hello[12] = {MAGIC, 2.0f, 2.0f, (float)(2 - t)}, proof[16];
            for (int i = 4; i < 12; i++)
                hello[i] = 1.0f + (float)(rand() % 65536);
            for (int i = 0; i < 16; i++)
                proof[i] = 1.0f + (float)(rand() % 65536);
            unsigned char junk[300];
            getrandom(junk, sizeof junk, 0);
            float nans[12] = {MAGIC, 2.0f, 2.0f, (float)(2 - t), __builtin_nanf("")};
            int fd;
            if ((fd = dial(ports[t])) >= 0) {         /* random bytes */
                if (send(fd, junk, sizeof junk, MSG_NOSIGNAL) < 0) {}
                held[nheld++] = fd;
            }
            if ((fd = dial(ports[t])) >= 0) {         /* NaNs where the nonce goes */
                if (send(fd, nans, sizeof nans, MSG_NOSIGNAL) < 0) {}
                held[nheld++] = fd;
            }
            if ((fd = dial(ports[t])) >= 0) {         /* a well-formed hello, a forged proof */
                if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) < 0 || send(fd, proof, sizeof proof, MSG_NOSIGNAL) < 0) {}
                held[nheld++] = fd;
            }
            if ((fd = dial(ports[t])) >= 0) {         /* half a hello, held */
                if (send(fd, hello, 20, MSG_NOSIGNAL) < 0) {}
                held[nheld++] = fd;
            }
            if ((fd = dial(ports[t])) >= 0) {         /* trickled */
                for (int i = 0; i < 6; i++) {
                    if (send(fd, (char *)hello + i, 1, MSG_NOSIGNAL) < 0)
                        break;
                    usleep(2000);
                }
                held[nheld++] = fd;
            }
        }
    return NULL;
}

static int run(int same_secret, int timeout_ms)
{
    struct run r[2];
    int lfd[2];
    memset(r, 0, sizeof r);
    lfd[0] = listener(&ports[0]);
    lfd[1] = listener(&ports[1]);
    uint8_t secret[RING_HS_SECRET], id[RING_HS_SETUP_ID];
    getrandom(secret, sizeof secret, 0);
    getrandom(id, sizeof id, 0);
    for (int i = 0; i < 2; i++) {
        struct ring_hs *h = &r[i].hs;
        h->rank = i, h->size = 2, h->tagged = 0, h->timeout_ms = timeout_ms, h->lfd = lfd[i];
        memcpy(h->secret, secret, sizeof secret);
        memcpy(h->setup_id, id, sizeof id);
        h->self.s_addr = htonl(INADDR_LOOPBACK);
        h->left_addr = h->right_addr = htonl(INADDR_LOOPBACK);
        h->right_port = ports[1 - i];
    }
    if (!same_secret)
        r[1].hs.secret[0] ^= 1;
    pthread_t a, t[2];
    nheld = 0;
    pthread_create(&a, NULL, attacker, NULL);
    usleep(20000);     /* the attacker's connections are queued first */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, rank_main, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(a, NULL);
    double ms = 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
    int ok = 1;
    if (same_secret) {
        ok = r[0].rc == 0 && r[1].rc == 0;
        char buf[8] = "ringok!", got[8] = {0};
        if (ok && (send(r[0].send_fd, buf, 8, 0) != 8 || recv(r[1].recv_fd, got, 8, MSG_WAITALL) != 8 || memcmp(buf, got, 8)))
            ok = 0;
    } else {
        ok = r[0].rc != 0 && r[1].rc != 0 && ms < timeout_ms;   /* neither waited out the deadline */
    }
    printf("%s secret: rc %d/%d, refused %d/%d, %.1f ms%s%s%s%s %s\n", same_secret ? "same" : "different", r[0].rc,
           r[1].rc, r[0].refused, r[1].refused, ms, r[0].rc ? "; rank 0: " : "", r[0].rc ? r[0].why : "",
           r[1].rc ? "; rank 1: " : "", r[1].rc ? r[1].why : "", ok ? "ok" : "FAILED");
    for (int i = 0; i < 2; i++) {
        if (r[i].send_fd >= 0)
            close(r[i].send_fd);
        if (r[i].recv_fd >= 0)
            close(r[i].recv_fd);
        close(lfd[i]);
    }
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    return ok;
}

int main(void)
{
    srand(28);
    int ok = run(1, 5000);
    ok &= run(0, 5000);
    return ok ? 0 : 1;
}
