/* The ring's authenticated handshake (ring_handshake.h): one poll() loop drives the outgoing
 * connection and every pending incoming one at once, so neighbours that wait for each other's
 * answers cannot deadlock, and no connection can hold the others up. */
#define _GNU_SOURCE
#include "ring_handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "inceptionn_contract.h"
#include "pmpi_allreduce.h"

enum { NONCE = 16, MAC = RING_HS_MAC };
enum { HELLO_F = 4 + NONCE / 2, CHALLENGE_F = 2 + NONCE / 2 + MAC / 2, PROOF_F = MAC / 2 };
#define MSG_MAX (CHALLENGE_F * 4)

/* The float32 form of n bytes (n even): n / 2 floats 1 + v, v each little-endian 16-bit value;
 * and back (-1 when a float is not such an integer). */
static void ring_hs_encode(const uint8_t *in, size_t n, float *out)
{
    for (size_t i = 0; i + 1 < n; i += 2)
        out[i / 2] = (float)(1 + (in[i] | in[i + 1] << 8));
}

static int ring_hs_decode(const float *in, size_t n, uint8_t *out)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        float f = in[i / 2];
        if (!(f >= 1.0f && f <= 65536.0f) || f != (float)(int)f)
            return -1;
        int v = (int)f - 1;
        out[i] = (uint8_t)(v & 0xff), out[i + 1] = (uint8_t)(v >> 8);
    }
    return 0;
}

int ring_hs_hmac(const uint8_t *key, size_t keylen, const void *const *parts, const size_t *lens, size_t nparts,
                 uint8_t out[RING_HS_MAC])
{
    EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = hmac ? EVP_MAC_CTX_new(hmac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t n = 0;
    int ok = c && EVP_MAC_init(c, key, keylen, params);
    for (size_t i = 0; ok && i < nparts; i++)
        ok = EVP_MAC_update(c, parts[i], lens[i]);
    ok = ok && EVP_MAC_final(c, out, &n, RING_HS_MAC) && n == RING_HS_MAC;
    EVP_MAC_CTX_free(c);
    EVP_MAC_free(hmac);
    return ok ? 0 : -1;
}

static int mac(const struct ring_hs *p, char role, int crank, int arank, const uint8_t *nc, const uint8_t *na,
               uint8_t out[MAC])
{
    uint8_t ints[12];
    uint32_t v[3] = {(uint32_t)p->size, (uint32_t)crank, (uint32_t)arank};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            ints[4 * i + j] = (uint8_t)(v[i] >> (8 * j));
    const void *parts[] = {&role, p->setup_id, ints, nc, na};
    const size_t lens[] = {1, RING_HS_SETUP_ID, sizeof ints, NONCE, NONCE};
    return ring_hs_hmac(p->secret, RING_HS_SECRET, parts, lens, 5, out);
}

int ring_random_bytes(uint8_t *out, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom(out + got, len - got, 0);
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0)
            got += (size_t)n;
    }
    return 0;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* One connection's side of the exchange: bytes to send, bytes expected next. */
struct conn {
    int fd, stage;                /* connector: 0 connecting, 1 hello out/challenge in, 2 proof out, 3 done;
                                     acceptor: 1 hello in, 2 challenge out/proof in, 3 proven */
    unsigned long seq;            /* accept order (the oldest unproven one is dropped first) */
    uint8_t in[MSG_MAX], out[MSG_MAX];
    size_t got, need, sent, outlen;
    uint8_t nc[NONCE], na[NONCE];
};

static void put_msg(struct conn *c, const float *f, size_t nf)
{
    memcpy(c->out, f, nf * 4);
    c->outlen = nf * 4;
    c->sent = 0;
}

/* Send what is queued and read up to need bytes: 1 progress, 0 would block, -1 broken. */
static int pump(struct conn *c, short revents)
{
    if (c->sent < c->outlen && (revents & POLLOUT)) {
        ssize_t w = send(c->fd, c->out + c->sent, c->outlen - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (w > 0)
            c->sent += (size_t)w;
    }
    if (c->got < c->need && (revents & (POLLIN | POLLERR | POLLHUP))) {
        ssize_t r = recv(c->fd, c->in + c->got, c->need - c->got, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return -1;
        if (r > 0)
            c->got += (size_t)r;
    }
    return 1;
}

static int hello_ok(const struct ring_hs *p, const float *h, int left)
{
    return h[0] == INC_MPI_HELLO_MAGIC && h[1] == (float)RING_HS_VERSION && h[2] == (float)p->size &&
           h[3] == (float)(left + 1);
}

/* The acceptor's next step on c: 0 go on, 1 proven, -1 drop it. */
static int accept_step(const struct ring_hs *p, struct conn *c, int left)
{
    if (c->stage == 1 && c->got == c->need) {
        float h[HELLO_F];
        memcpy(h, c->in, sizeof h);
        uint8_t m[MAC];
        if (!hello_ok(p, h, left) || ring_hs_decode(h + 4, NONCE, c->nc) != 0 ||
            ring_random_bytes(c->na, NONCE) != 0 || mac(p, 'A', left, p->rank, c->nc, c->na, m) != 0)
            return -1;
        float out[CHALLENGE_F] = {INC_MPI_HELLO_MAGIC, (float)RING_HS_VERSION};
        ring_hs_encode(c->na, NONCE, out + 2);
        ring_hs_encode(m, MAC, out + 2 + NONCE / 2);
        put_msg(c, out, CHALLENGE_F);
        c->stage = 2, c->got = 0, c->need = PROOF_F * 4;
    } else if (c->stage == 2 && c->got == c->need && c->sent == c->outlen) {
        float f[PROOF_F];
        uint8_t got[MAC], want[MAC];
        memcpy(f, c->in, sizeof f);
        if (ring_hs_decode(f, MAC, got) != 0 || mac(p, 'C', left, p->rank, c->nc, c->na, want) != 0 ||
            CRYPTO_memcmp(got, want, MAC) != 0) /* constant time */
            return -1;
        c->stage = 3;
        return 1;
    }
    return 0;
}

/* The connector's next step: 0 go on, 1 done, -1 failed (why filled in). */
static int connect_step(const struct ring_hs *p, struct conn *c, int right, char *why, size_t whylen)
{
    if (c->stage == 1 && c->got == c->need) {
        float f[CHALLENGE_F];
        uint8_t m[MAC], want[MAC], proof[MAC];
        memcpy(f, c->in, sizeof f);
        if (f[0] != INC_MPI_HELLO_MAGIC || f[1] != (float)RING_HS_VERSION || ring_hs_decode(f + 2, NONCE, c->na) != 0 ||
            ring_hs_decode(f + 2 + NONCE / 2, MAC, m) != 0) {
            snprintf(why, whylen, "the right neighbour (rank %d) answered with something that is not the ring's handshake", right);
            return -1;
        }
        if (mac(p, 'A', p->rank, right, c->nc, c->na, want) != 0 || mac(p, 'C', p->rank, right, c->nc, c->na, proof) != 0) {
            snprintf(why, whylen, "libcrypto could not compute HMAC-SHA256");
            return -1;
        }
        if (CRYPTO_memcmp(m, want, MAC) != 0) { /* constant time */
            snprintf(why, whylen, "the listener at the right neighbour's address (rank %d) could not prove the "
                     "communicator's secret", right);
            return -1;
        }
        float out[PROOF_F];
        ring_hs_encode(proof, MAC, out);
        put_msg(c, out, PROOF_F);
        c->stage = 2, c->need = c->got;   /* nothing more to read */
    }
    if (c->stage == 2 && c->sent == c->outlen) {
        c->stage = 3;
        return 1;
    }
    return 0;
}

static int start_connect(const struct ring_hs *p, struct conn *c, char *why, size_t whylen)
{
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = p->self};
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_addr.s_addr = p->right_addr, .sin_port = p->right_port};
    int tos = INCEPTIONN_TOS_TAGGED, one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0 || (p->tagged && setsockopt(c->fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos) != 0) ||
        bind(c->fd, (void *)&src, sizeof src) != 0) {
        snprintf(why, whylen, "ring socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (void *)&dst, sizeof dst) != 0 && errno != EINPROGRESS) {
        snprintf(why, whylen, "connect to %s:%u: %s", inet_ntoa(dst.sin_addr), ntohs(dst.sin_port), strerror(errno));
        return -1;
    }
    c->stage = 0;
    return 0;
}

int ring_handshake(const struct ring_hs *p, int *send_fd, int *recv_fd, int *refused, char *why, size_t whylen)
{
    const int left = (p->rank + p->size - 1) % p->size, right = (p->rank + 1) % p->size;
    const double deadline = now_ms() + p->timeout_ms;
    struct conn out = {.fd = -1}, in[RING_HS_MAX_PENDING];
    int nin = 0, rc = -1, proven = -1;
    unsigned long seq = 0;
    *refused = 0;
    *send_fd = *recv_fd = -1;
    fcntl(p->lfd, F_SETFL, fcntl(p->lfd, F_GETFL) | O_NONBLOCK);
    if (ring_random_bytes(out.nc, NONCE) != 0) {
        snprintf(why, whylen, "getrandom: %s", strerror(errno));
        return -1;
    }
    if (start_connect(p, &out, why, whylen) != 0)
        goto done;
    for (;;) {
        if (out.stage == 3 && proven >= 0) {
            rc = 0;
            break;
        }
        double left_ms = deadline - now_ms();
        if (left_ms <= 0) {
            if (out.stage != 3)
                snprintf(why, whylen, "the handshake with the right neighbour (rank %d) did not finish within %d s",
                         right, p->timeout_ms / 1000);
            else
                snprintf(why, whylen, "no connection proven from the left neighbour (rank %d) within %d s (%d other "
                         "connection(s) refused)", left, p->timeout_ms / 1000, *refused);
            break;
        }
        struct pollfd pf[2 + RING_HS_MAX_PENDING];
        int np = 0, lslot = -1, oslot = -1;
        if (out.stage < 3) {
            oslot = np;
            pf[np++] = (struct pollfd){.fd = out.fd, .events = (short)((out.stage == 0 || out.sent < out.outlen ? POLLOUT : 0) |
                                                                        (out.got < out.need ? POLLIN : 0))};
        }
        if (proven < 0) {
            lslot = np;
            pf[np++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
            for (int i = 0; i < nin; i++)
                pf[np++] = (struct pollfd){.fd = in[i].fd,
                                           .events = (short)(POLLIN | (in[i].sent < in[i].outlen ? POLLOUT : 0))};
        }
        int pr = poll(pf, (nfds_t)np, (int)left_ms + 1);
        if (pr < 0 && errno != EINTR) {
            snprintf(why, whylen, "poll: %s", strerror(errno));
            break;
        }
        if (pr <= 0)
            continue;
        if (oslot >= 0 && pf[oslot].revents) {
            if (out.stage == 0) {
                int err = 0;
                socklen_t el = sizeof err;
                if (getsockopt(out.fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
                    struct in_addr a = {.s_addr = p->right_addr};
                    snprintf(why, whylen, "connect to %s:%u: %s", inet_ntoa(a), ntohs(p->right_port),
                             strerror(err ? err : errno));
                    break;
                }
                float h[HELLO_F] = {INC_MPI_HELLO_MAGIC, (float)RING_HS_VERSION, (float)p->size, (float)(p->rank + 1)};
                ring_hs_encode(out.nc, NONCE, h + 4);
                put_msg(&out, h, HELLO_F);
                out.stage = 1, out.got = 0, out.need = CHALLENGE_F * 4;
            } else if (pump(&out, pf[oslot].revents) < 0) {
                snprintf(why, whylen, "the right neighbour (rank %d) closed the connection during the handshake", right);
                break;
            }
            if (connect_step(p, &out, right, why, whylen) < 0)
                break;
        }
        if (lslot < 0)
            continue;
        for (int i = 0; i < nin && proven < 0; i++) {
            short ev = pf[lslot + 1 + i].revents;
            int st = ev ? pump(&in[i], ev) : 0;
            if (st >= 0)
                st = accept_step(p, &in[i], left);
            if (st == 1)
                proven = i;
            else if (st < 0)
                in[i].stage = -1;
        }
        /* drop the failed, keep the proven one, close every other once one is proven */
        int k = 0;
        for (int i = 0; i < nin; i++) {
            if (i == proven) {
                *recv_fd = in[i].fd;
            } else if (in[i].stage < 0 || proven >= 0) {
                close(in[i].fd);
                ++*refused;
            } else {
                in[k++] = in[i];
            }
        }
        nin = k;
        if (proven >= 0)
            continue;
        if (pf[lslot].revents & POLLIN) {
            for (;;) {
                struct sockaddr_in from;
                socklen_t fl = sizeof from;
                int fd = accept4(p->lfd, (void *)&from, &fl, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                    break;      /* EAGAIN: drained; other errors: the deadline reports the failure */
                if (fl < sizeof from || from.sin_family != AF_INET || from.sin_addr.s_addr != p->left_addr) {
                    close(fd);    /* not from the left neighbour's address */
                    ++*refused;
                    continue;
                }
                if (nin == RING_HS_MAX_PENDING) {
                    int old = 0;
                    for (int i = 1; i < nin; i++)
                        if (in[i].seq < in[old].seq)
                            old = i;
                    close(in[old].fd);
                    ++*refused;
                    in[old] = in[--nin];
                }
                struct conn *c = &in[nin++];
                memset(c, 0, sizeof *c);
                c->fd = fd, c->stage = 1, c->seq = seq++, c->need = HELLO_F * 4;
            }
        }
    }
    if (proven >= 0 && rc == 0) {
        *send_fd = out.fd;
        out.fd = -1;
    }
done:
    for (int i = 0; i < nin; i++)
        close(in[i].fd);
    if (out.fd >= 0)
        close(out.fd);
    if (rc != 0 && *recv_fd >= 0) {
        close(*recv_fd);
        *recv_fd = -1;
    }
    if (rc != 0)
        shutdown(p->lfd, SHUT_RDWR);   /* resets what waits in the accept queue, refuses what comes */
    return rc;
}
