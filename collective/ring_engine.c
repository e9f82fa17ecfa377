/*
 * The ring engine (ring_engine.h; its schedule, primitives, transports and codec interface are
 * described in docs/collectives.md, "The ring engine"; the wire in "Wire format v2").
 *
 * Received bytes are read only within the payload the schedule expects: a fixed length, or a
 * frame whose 4-byte length is checked against what its chunk can encode to before anything more
 * is read; the wire's exponents and values are checked by bs_decode and the codec's stream by its
 * decoder. Nothing a peer sends is used as an index.
 */
#define _GNU_SOURCE
#include "ring_engine.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "blockscale_codec.h"

/* --- the transports --------------------------------------------------------------------------- */

static size_t floats_cap(const struct re_codec *c, size_t wn)
{
    (void)c;
    return wn * sizeof(float);
}

static size_t frame_cap(const struct re_codec *c, size_t wn)
{
    return 4 + c->max_encoded_size(c, wn);
}

/* A frame's header: the stream's length m, 4 bytes little-endian; returns the frame's length. */
static size_t frame_header(uint8_t *buf, size_t m)
{
    uint32_t l = (uint32_t)m;
    buf[0] = l & 0xff, buf[1] = (l >> 8) & 0xff, buf[2] = (l >> 16) & 0xff, buf[3] = l >> 24;
    return 4 + m;
}

/* the codec's stream of wn wire floats behind its 4-byte little-endian length */
static int frame_pack(const struct re_codec *c, const float *w, size_t wn, uint8_t *buf, size_t *len)
{
    ptrdiff_t m = c->encode(c, w, wn, buf + 4, c->max_encoded_size(c, wn));
    if (m < 0)
        return (int)m;
    *len = frame_header(buf, (size_t)m);
    return 0;
}

static int frame_unpack(const struct re_codec *c, const uint8_t *buf, size_t len, float *w, size_t wn)
{
    return c->decode(c, buf + 4, len - 4, w, wn);
}

const struct re_transport re_transport_raw = {.name = "raw", .exact = 1, .payload_cap = floats_cap};
const struct re_transport re_transport_nic = {.name = "nic", .payload_cap = floats_cap};
const struct re_transport re_transport_app = {.name = "app", .framed = 1, .payload_cap = frame_cap,
                                              .pack = frame_pack, .unpack = frame_unpack};

const struct re_transport *re_transport_named(const char *name)
{
    static const struct re_transport *const all[] = {&re_transport_raw, &re_transport_nic, &re_transport_app};
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (!strcmp(all[i]->name, name))
            return all[i];
    return NULL;
}

/* --- one call's state, its failure line --------------------------------------------------------- */

struct call {
    const struct re_ring *r;
    struct re_stats st;
    char *err;
    size_t errcap;
};

/* The clock of the stats' codec and sum seconds: wall time; a benchmark may build with
 * -DRE_STATS_CLOCK=CLOCK_THREAD_CPUTIME_ID for the loop thread's CPU time instead. */
#ifndef RE_STATS_CLOCK
#define RE_STATS_CLOCK CLOCK_MONOTONIC
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(RE_STATS_CLOCK, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(struct call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct call *c, int status, const char *fmt, ...)
{
    if (c->errcap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errcap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* --- the wire: values <-> the floats a chunk carries -------------------------------------------- */

static int scaled(const struct re_ring *r) { return !r->tp->exact && r->codec->scaled; }

/* the codec transport without scaling: a payload is the codec's stream of the values themselves */
static int direct(const struct re_ring *r) { return r->tp->framed && !r->codec->scaled; }

/* ... and the codec adds streams: phase 1 sums without decoding (docs/collectives.md) */
static int homomorphic(const struct re_ring *r) { return direct(r) && r->codec->sum_encoded; }

static size_t wire_len(const struct re_ring *r, size_t m)
{
    return scaled(r) ? bs_wire_values(m, BS_BLOCK_VALUES) : m;
}

/* x[0..m) -> its wire floats w; dec (NULL, or x itself) gets what every receiver decodes. */
static int to_wire(struct call *c, const float *x, size_t m, float *w, float *dec)
{
    const struct re_ring *r = c->r;
    if (scaled(r)) {
        ptrdiff_t got = bs_encode_h(x, m, BS_BLOCK_VALUES, r->codec->error_bound, r->headroom, w, wire_len(r, m), dec);
        if (got < 0)
            return fail(c, RE_E_CODEC, "%s", bs_strerror((int)got));
        return RE_OK;
    }
    if (r->tp->exact)
        memcpy(w, x, m * sizeof(float));
    else
        r->codec->reconstruct(r->codec, x, m, w);
    if (dec && dec != w)
        memcpy(dec, w, m * sizeof(float));
    return RE_OK;
}

static int from_wire(struct call *c, const float *w, size_t m, float *out)
{
    if (!scaled(c->r)) {
        memcpy(out, w, m * sizeof(float));
        return RE_OK;
    }
    size_t at = 0;
    int st = bs_decode(w, wire_len(c->r, m), out, m, BS_BLOCK_VALUES, &at);
    if (st != BS_OK)
        return fail(c, RE_E_DATA, "a chunk from the left neighbour does not belong to this call: %s (wire float %zu)",
                    bs_strerror(st), at);
    return RE_OK;
}

/* values -> payload in buf (wbuf: room for the wire floats when the transport packs them) */
static int encode_payload_(struct call *c, const float *x, size_t m, float *dec, float *wbuf, uint8_t *buf,
                          size_t *len)
{
    const struct re_transport *tp = c->r->tp;
    int st;
    if (direct(c->r)) {             /* no wire floats: the codec encodes the values, dec gets its decode */
        if ((st = tp->pack(c->r->codec, x, m, buf, len)))
            return fail(c, RE_E_CODEC, "%s", c->r->codec->strerror(st));
        if (dec && (st = tp->unpack(c->r->codec, buf, *len, dec, m)))
            return fail(c, RE_E_CODEC, "this rank's own stream does not decode: %s", c->r->codec->strerror(st));
        return RE_OK;
    }
    float *w = tp->pack ? wbuf : (float *)(void *)buf;
    st = to_wire(c, x, m, w, dec);
    if (st)
        return st;
    if (!tp->pack) {
        *len = wire_len(c->r, m) * sizeof(float);
        return RE_OK;
    }
    if ((st = tp->pack(c->r->codec, w, wire_len(c->r, m), buf, len)))
        return fail(c, RE_E_CODEC, "%s", c->r->codec->strerror(st));
    return RE_OK;
}

/* payload -> values (wbuf: room for the wire floats when the transport unpacks them) */
static int decode_payload_(struct call *c, const uint8_t *buf, size_t len, size_t m, float *wbuf, float *out)
{
    const struct re_transport *tp = c->r->tp;
    const float *w = (const float *)(const void *)buf;
    if (tp->unpack) {
        int st = tp->unpack(c->r->codec, buf, len, wbuf, wire_len(c->r, m));
        if (st)
            return fail(c, RE_E_DATA, "bad codec stream from the left neighbour: %s", c->r->codec->strerror(st));
        w = wbuf;
    }
    return from_wire(c, w, m, out);
}

static int encode_payload(struct call *c, const float *x, size_t m, float *dec, float *wbuf, uint8_t *buf,
                          size_t *len)
{
    if (c->r->tp->exact)            /* a copy, no codec: not codec time */
        return encode_payload_(c, x, m, dec, wbuf, buf, len);
    double t0 = now();
    int st = encode_payload_(c, x, m, dec, wbuf, buf, len);
    c->st.codec_seconds += now() - t0;
    return st;
}

static int decode_payload(struct call *c, const uint8_t *buf, size_t len, size_t m, float *wbuf, float *out)
{
    if (c->r->tp->exact)
        return decode_payload_(c, buf, len, m, wbuf, out);
    double t0 = now();
    int st = decode_payload_(c, buf, len, m, wbuf, out);
    c->st.codec_seconds += now() - t0;
    return st;
}

/* --- the schedule, written once as primitives (docs/collectives.md, "The ring engine") -------- */

enum prim {
    SEND,                   /* send this rank's values of the block */
    RECV_REDUCE_SEND,       /* receive a partial sum, add this rank's values, send the new partial sum */
    RECV_REDUCE_COPY_SEND,  /* the last addition: this rank owns the block; keep what it decodes to, send it */
    RECV_COPY_SEND,         /* receive a reduced block, keep it, forward the same payload */
    RECV,                   /* receive the last reduced block */
};

struct op {
    enum prim prim;
    int block;
};

/* Steps 0..2N-3: the op received at step s (block (rank - s - 1) mod N) is sent at step s + 1. */
static int ring_program(struct op *ops, int rank, int N)
{
    int k = 0;
#define BLOCK(j) ((((rank) - (j)) % N + N) % N)
    ops[k++] = (struct op){SEND, BLOCK(0)};
    for (int j = 1; j <= N - 2; j++)
        ops[k++] = (struct op){RECV_REDUCE_SEND, BLOCK(j)};
    ops[k++] = (struct op){RECV_REDUCE_COPY_SEND, BLOCK(N - 1)};
    for (int j = N; j <= 2 * N - 3; j++)
        ops[k++] = (struct op){RECV_COPY_SEND, BLOCK(j)};
    ops[k++] = (struct op){RECV, BLOCK(2 * N - 2)};
#undef BLOCK
    return k;
}

struct item {
    enum prim prim;
    size_t a, b;
    int contrib;        /* ranks whose values the received payload sums (op j < N: j; then N) */
};

/* The ops' chunks: sends (every op but RECV) and receives (every op but SEND), in order, so send
 * item first + j forwards receive item j (first: the chunks of the SEND op). */
static void list_items(const struct op *ops, int nops, size_t n, int N, size_t chunk, struct item *sends,
                       size_t *ns, struct item *recvs, size_t *nr)
{
    *ns = *nr = 0;
    for (int i = 0; i < nops; i++) {
        size_t lo = (size_t)ops[i].block * n / (size_t)N, hi = (size_t)(ops[i].block + 1) * n / (size_t)N;
        for (size_t a = lo; a < hi; a += chunk) {
            struct item it = {ops[i].prim, a, a + chunk < hi ? a + chunk : hi, i < N ? i : N};
            if (it.prim != RECV)
                sends[(*ns)++] = it;
            if (it.prim != SEND)
                recvs[(*nr)++] = it;
        }
    }
}

/* --- the one poll loop ------------------------------------------------------------------------- */

struct payload {        /* a payload kept to forward in phase 2: the same bytes go on */
    uint8_t *buf;
    size_t len;
};

struct bufs {
    struct op *ops;
    struct item *sends, *recvs;
    float *tmp, *wbuf;
    uint8_t *sbuf, *rbuf, *obuf;
    struct payload *keep;
    size_t nkeep;
};

static void free_bufs(struct bufs *B)
{
    if (B->keep)
        for (size_t i = 0; i < B->nkeep; i++)
            free(B->keep[i].buf);
    free(B->keep);
    free(B->rbuf);
    free(B->obuf);
    free(B->sbuf);
    free(B->wbuf);
    free(B->tmp);
    free(B->sends);
    free(B->recvs);
    free(B->ops);
}

/* lost[i] = sent[i] - q[i]: what the receivers of sent[i] do not get (error feedback). */
static void record_lost(float *lost, const float *sent, const float *q, size_t m)
{
    for (size_t i = 0; i < m; i++)
        lost[i] = sent[i] - q[i];
}

static int keep_copy(struct call *c, struct payload *p, const void *src, size_t len)
{
    p->buf = malloc(len ? len : 1);
    if (!p->buf)
        return fail(c, RE_E_NOMEM, "out of memory");
    memcpy(p->buf, src, len);
    p->len = len;
    return RE_OK;
}

/* A received item in the homomorphic ring (homomorphic()): the payload is a stream summing
 * it.contrib ranks' values. Phase 1 encodes this rank's values and adds the two streams without
 * decoding; the owner then decodes the sum once; phase 2 decodes and forwards the same bytes. */
static int on_received_encoded(struct call *c, struct bufs *B, size_t ri, size_t len, float *x, float *lost)
{
    const struct re_codec *k = c->r->codec;
    const struct item it = B->recvs[ri];
    const size_t m = it.b - it.a, cap = c->r->tp->payload_cap(k, m);
    float *xa = x + it.a;
    uint32_t count = 0;
    int st = k->count_encoded(k, B->rbuf + 4, len - 4, m, &count);
    if (st)
        return fail(c, RE_E_DATA, "bad codec stream from the left neighbour: %s", k->strerror(st));
    if (count != (uint32_t)it.contrib)
        return fail(c, RE_E_DATA, "a stream from the left neighbour sums %u ranks' values where %d are due", count,
                    it.contrib);
    if (it.prim == RECV_COPY_SEND || it.prim == RECV) {
        if ((st = decode_payload(c, B->rbuf, len, m, B->wbuf, xa)))
            return st;
        return it.prim == RECV ? RE_OK : keep_copy(c, &B->keep[ri], B->rbuf, len);
    }
    if (it.prim != RECV_REDUCE_SEND && it.prim != RECV_REDUCE_COPY_SEND)
        return fail(c, RE_E_ARG, "a send item in the receive list");
    struct payload *p = &B->keep[ri];
    if (!(p->buf = malloc(cap)))
        return fail(c, RE_E_NOMEM, "out of memory");
    ptrdiff_t got;
    if (k->encode_sum) {     /* encode and add in one pass; lost gets sent - decoded (codec time) */
        double t0 = now();
        got = k->encode_sum(k, xa, m, B->rbuf + 4, len - 4, lost ? lost + it.a : NULL, p->buf + 4, cap - 4);
        c->st.codec_seconds += now() - t0;
    } else {
        size_t olen;      /* this rank's own stream, framed; lost gets its decode, then sent - decoded */
        if ((st = encode_payload(c, xa, m, lost ? lost + it.a : NULL, B->wbuf, B->obuf, &olen)))
            return st;
        if (lost)
            record_lost(lost + it.a, xa, lost + it.a, m);
        double t0 = now();
        got = k->sum_encoded(k, B->rbuf + 4, len - 4, B->obuf + 4, olen - 4, m, p->buf + 4, cap - 4);
        c->st.sum_seconds += now() - t0;
    }
    if (got < 0)
        return fail(c, RE_E_DATA, "the partial sum from the left neighbour does not add: %s", k->strerror((int)got));
    p->len = frame_header(p->buf, (size_t)got);
    if (it.prim == RECV_REDUCE_COPY_SEND)     /* the owner: every rank decodes the same bytes */
        return decode_payload(c, p->buf, p->len, m, B->wbuf, xa);
    return RE_OK;
}

/* A received item is complete in rbuf[0..len): what its primitive does with it. */
static int on_received(struct call *c, struct bufs *B, size_t ri, size_t len, float *x, float *lost)
{
    const struct item it = B->recvs[ri];
    const size_t m = it.b - it.a;
    float *xa = x + it.a;
    int st;
    if (homomorphic(c->r))
        return on_received_encoded(c, B, ri, len, x, lost);
    switch (it.prim) {
    case RECV_REDUCE_SEND:
    case RECV_REDUCE_COPY_SEND:
        if ((st = decode_payload(c, B->rbuf, len, m, B->wbuf, B->tmp)))
            return st;
        double t0 = now();
        for (size_t i = 0; i < m; i++)
            xa[i] += B->tmp[i];
        c->st.sum_seconds += now() - t0;
        if (it.prim == RECV_REDUCE_SEND)
            return RE_OK;           /* sent when its send item starts, from x */
        /* this rank owns the block now: xa becomes what every other rank decodes */
        if (lost)
            memcpy(lost + it.a, xa, m * sizeof(float));
        if (!(B->keep[ri].buf = malloc(c->r->tp->payload_cap(c->r->codec, wire_len(c->r, m)))))
            return fail(c, RE_E_NOMEM, "out of memory");
        if ((st = encode_payload(c, xa, m, xa, B->wbuf, B->keep[ri].buf, &B->keep[ri].len)))
            return st;
        if (lost)
            record_lost(lost + it.a, lost + it.a, xa, m);
        return RE_OK;
    case RECV_COPY_SEND:
        if ((st = decode_payload(c, B->rbuf, len, m, B->wbuf, xa)))
            return st;
        return keep_copy(c, &B->keep[ri], B->rbuf, len);
    case RECV:
        return decode_payload(c, B->rbuf, len, m, B->wbuf, xa);
    case SEND:
        break;
    }
    return fail(c, RE_E_ARG, "a send item in the receive list");
}

static int run(struct call *c, struct bufs *B, float *x, size_t n, float *lost)
{
    const struct re_ring *r = c->r;
    const struct re_transport *tp = r->tp;
    const int N = r->size;
    const size_t chunk = r->chunk;
    if (!(B->ops = malloc((size_t)(2 * N - 1) * sizeof *B->ops)))
        return fail(c, RE_E_NOMEM, "out of memory");
    int nops = ring_program(B->ops, r->rank, N);
    size_t per_op = (n / (size_t)N + 1 + chunk - 1) / chunk + 1, cap = (size_t)nops * per_op, ns, nr;
    const size_t wmax = wire_len(r, chunk), pmax = tp->payload_cap(r->codec, wmax);
    B->sends = malloc(cap * sizeof *B->sends);
    B->recvs = malloc(cap * sizeof *B->recvs);
    B->tmp = malloc(chunk * sizeof(float));
    B->wbuf = malloc(wmax * sizeof(float));     /* wire floats being built or decoded */
    B->sbuf = malloc(pmax);                     /* the outgoing payload of a SEND or RECV_REDUCE_SEND */
    B->rbuf = malloc(pmax);                     /* the incoming payload */
    const int own = homomorphic(r) && !r->codec->encode_sum;
    B->obuf = own ? malloc(pmax) : NULL;        /* this rank's own stream, to add */
    if (!B->sends || !B->recvs || !B->tmp || !B->wbuf || !B->sbuf || !B->rbuf || (own && !B->obuf))
        return fail(c, RE_E_NOMEM, "out of memory");
    list_items(B->ops, nops, n, N, chunk, B->sends, &ns, B->recvs, &nr);
    B->keep = calloc(nr ? nr : 1, sizeof *B->keep);
    if (!B->keep)
        return fail(c, RE_E_NOMEM, "out of memory");
    B->nkeep = nr;
    size_t first = 0;                              /* chunks of the SEND op */
    while (first < ns && B->sends[first].prim == SEND)
        first++;

    size_t si = 0, ri = 0;           /* current items */
    const uint8_t *sp = NULL;        /* what is left to send of item si */
    size_t sleft = 0, roff = 0, rneed = 0;
    int sready = 0, st;
    while (si < ns || ri < nr) {
        /* start the next send when its data is there: item j >= first forwards receive item j - first */
        if (si < ns && !sready && (si < first || ri > si - first)) {
            struct item it = B->sends[si];
            if (it.prim == SEND || (it.prim == RECV_REDUCE_SEND && !homomorphic(r))) {
                size_t m = it.b - it.a;
                if (homomorphic(r) && r->codec->encode_sum) {   /* lost gets sent - decoded directly */
                    double t0 = now();
                    ptrdiff_t got = r->codec->encode_sum(r->codec, x + it.a, m, NULL, 0, lost ? lost + it.a : NULL,
                                                         B->sbuf + 4, tp->payload_cap(r->codec, m) - 4);
                    c->st.codec_seconds += now() - t0;
                    if (got < 0)
                        return fail(c, RE_E_CODEC, "%s", r->codec->strerror((int)got));
                    sleft = frame_header(B->sbuf, (size_t)got);
                } else {
                    /* the decode of what goes out lands in lost, then becomes sent - decoded */
                    if ((st = encode_payload(c, x + it.a, m, lost ? lost + it.a : NULL, B->wbuf, B->sbuf, &sleft)))
                        return st;
                    if (lost)
                        record_lost(lost + it.a, x + it.a, lost + it.a, m);
                }
                sp = B->sbuf;
            } else {
                sp = B->keep[si - first].buf;
                sleft = B->keep[si - first].len;
            }
            sready = 1;
        }
        struct pollfd p[2] = {{.fd = r->send_fd, .events = sready ? POLLOUT : 0},
                              {.fd = r->recv_fd, .events = ri < nr ? POLLIN : 0}};
        int pr = poll(p, 2, r->timeout_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            return fail(c, RE_E_TIMEOUT, "no progress for %g s (a peer hangs or died)", r->timeout_ms / 1000.0);
        if (pr < 0)
            return fail(c, RE_E_SYS, "poll: %s", strerror(errno));
        if (p[0].revents & (POLLERR | POLLHUP) && !(p[0].revents & POLLOUT))
            return fail(c, RE_E_PEER, "the connection to the right neighbour broke");
        if (sready && (p[0].revents & POLLOUT)) {
            ssize_t w = send(r->send_fd, sp, sleft, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                return fail(c, RE_E_PEER, "send to the right neighbour: %s", strerror(errno));
            if (w > 0) {
                c->st.bytes_sent += (uint64_t)w;
                sp += w;
                sleft -= (size_t)w;
                if (!sleft) {
                    if (B->sends[si].prim != SEND && (B->sends[si].prim != RECV_REDUCE_SEND || homomorphic(r))) {
                        free(B->keep[si - first].buf);
                        B->keep[si - first].buf = NULL;
                    }
                    si++;
                    sready = 0;
                }
            }
        }
        if (ri < nr && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
            size_t m = B->recvs[ri].b - B->recvs[ri].a, pcap = tp->payload_cap(r->codec, wire_len(r, m));
            if (!tp->framed)
                rneed = pcap;
            else if (roff < 4)
                rneed = 4;
            ssize_t got = recv(r->recv_fd, B->rbuf + roff, rneed - roff, MSG_DONTWAIT);
            if (got == 0)
                return fail(c, RE_E_PEER, "the left neighbour closed its connection");
            if (got < 0 && errno != EAGAIN && errno != EINTR)
                return fail(c, RE_E_PEER, "receive from the left neighbour: %s", strerror(errno));
            if (got > 0) {
                roff += (size_t)got;
                c->st.bytes_received += (uint64_t)got;
            }
            if (tp->framed && roff == 4 && rneed == 4) {
                const uint8_t *h = B->rbuf;
                uint32_t l = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24;
                if (l > pcap - 4)
                    return fail(c, RE_E_DATA, "a codec frame from the left neighbour is longer than its chunk can "
                                "encode to");
                rneed = 4 + (size_t)l;
                if (l)
                    continue;
            }
            if (roff == rneed && rneed > 0) {
                if ((st = on_received(c, B, ri, rneed, x, lost)))
                    return st;
                ri++;
                roff = rneed = 0;
            }
        }
    }
    return RE_OK;
}

void re_compensate(float *x, const float *residual, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += residual[i];
}

int re_allreduce(const struct re_ring *r, float *x, size_t n, float *lost, struct re_stats *stats, char *err,
                 size_t errcap)
{
    struct call c = {.r = r, .err = err, .errcap = errcap};
    if (errcap)
        err[0] = 0;
    if (stats)
        *stats = (struct re_stats){0};
    if (!r || r->size < 1 || r->rank < 0 || r->rank >= r->size || r->chunk < 1 || !r->tp ||
        (!r->tp->exact && (!r->codec || !r->codec->strerror ||
                           (!r->tp->pack && !r->codec->scaled && !r->codec->reconstruct) ||
                           (r->tp->pack && (!r->codec->encode || !r->codec->decode || !r->codec->max_encoded_size)) ||
                           (r->codec->sum_encoded && !r->codec->count_encoded) ||
                           (r->codec->encode_sum && !r->codec->sum_encoded))) ||
        (lost && r->tp->exact) || (n && !x) || r->headroom < 0 || r->headroom > BS_MAX_HEADROOM)
        return fail(&c, RE_E_ARG, "bad arguments (ranks, chunk, transport, codec, headroom, or error feedback "
                    "with exact floats)");
    if (r->size == 1) {
        if (lost)
            memset(lost, 0, n * sizeof(float));
        return RE_OK;
    }
    struct bufs B = {0};
    int st = run(&c, &B, x, n, lost);
    free_bufs(&B);
    if (!r->tp->exact && r->codec->release)     /* the codec's scratch of this call */
        r->codec->release(r->codec);
    if (stats)
        *stats = c.st;
    if (st == RE_OK && lost)
        for (size_t i = 0; i < n; i++) {    /* inf - inf where a rank had inf or NaN: never carried on */
            uint32_t u;                      /* (on the bits, branch-free: the loop vectorizes) */
            memcpy(&u, &lost[i], 4);
            u = (u & 0x7F800000u) == 0x7F800000u ? 0u : u;
            memcpy(&lost[i], &u, 4);
        }
    return st;
}

const char *re_strerror(int status)
{
    switch (status) {
    case RE_OK: return "ok";
    case RE_E_ARG: return "bad arguments";
    case RE_E_NOMEM: return "out of memory";
    case RE_E_DATA: return "a received chunk does not belong to this call";
    case RE_E_PEER: return "a connection broke";
    case RE_E_TIMEOUT: return "no progress";
    case RE_E_CODEC: return "the codec failed";
    case RE_E_SYS: return "poll failed";
    }
    return "unknown status";
}
