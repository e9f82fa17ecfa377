/*
 * The ring engine: the INCEPTIONN ring's allreduce over two connected sockets, in one poll()
 * loop, with no MPI and no Python in it. Its schedule, its primitives, the transport table and
 * the codec interface are described once, in docs/collectives.md ("The ring engine"); the wire
 * is "Wire format v2" there.
 *
 * The caller owns everything around a call: the connections (opened and proven beforehand, e.g.
 * by ring_handshake.c), the settings every rank must share (the same transport, codec, error
 * bound, headroom and chunk on every rank), the residual memory of error feedback and what a failure means
 * (the MPI library aborts the job). A failed call returns a negative status and one line in err;
 * x is then partly reduced and must not be used, and the connections are not reusable.
 */
#ifndef INCEPTIONN_RING_ENGINE_H
#define INCEPTIONN_RING_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "codec_table.h"   /* struct re_codec: the codec interface */

#ifdef __cplusplus
extern "C" {
#endif

enum re_status {
    RE_OK = 0,
    RE_E_ARG = -1,      /* bad arguments (rank/size, chunk, a transport without the codec it needs) */
    RE_E_NOMEM = -2,
    RE_E_DATA = -3,     /* a received chunk that cannot belong to this call (bounds, wire format) */
    RE_E_PEER = -4,     /* a connection broke or was closed (often the echo of another rank's failure) */
    RE_E_TIMEOUT = -5,  /* no progress for timeout_ms */
    RE_E_CODEC = -6,    /* the codec refused this rank's own values */
    RE_E_SYS = -7,      /* poll() failed */
};

/*
 * How a chunk travels (a table of operations; the caller tags the sockets to match):
 * re_transport_raw  float32 as they are: exact, no codec, no error feedback
 * re_transport_nic  the codec's wire floats (fixed points), for a soft NIC on a tagged socket
 * re_transport_app  the codec in this process: its stream of the wire floats behind a 4-byte
 *                   little-endian length
 */
struct re_transport {
    const char *name;
    int exact;      /* the values are the wire: no codec, nothing lost */
    int framed;     /* payloads carry their length (else a chunk's payload length is known) */
    /* the payload's length for wn wire floats: exact (unframed) or at most (framed) */
    size_t (*payload_cap)(const struct re_codec *c, size_t wn);
    /* wire floats -> payload; NULL: the payload is the wire floats themselves */
    int (*pack)(const struct re_codec *c, const float *w, size_t wn, uint8_t *buf, size_t *len);
    /* payload (len bytes, its frame header included) -> wn wire floats; NULL: the payload is them */
    int (*unpack)(const struct re_codec *c, const uint8_t *buf, size_t len, float *w, size_t wn);
};

extern const struct re_transport re_transport_raw, re_transport_nic, re_transport_app;

/* The transport of that name ("raw", "nic", "app"), or NULL. */
const struct re_transport *re_transport_named(const char *name);

struct re_ring {
    int rank, size;              /* size >= 1; size 1 leaves x as it is */
    int send_fd, recv_fd;        /* connected: to the right neighbour, from the left one */
    int timeout_ms;              /* no progress for this long fails the call */
    size_t chunk;                /* values per pipelined chunk, >= 1 */
    const struct re_transport *tp;
    const struct re_codec *codec;   /* NULL only with re_transport_raw */
    int headroom;                /* scaled codecs: each block's max in [2^(-1-h), 2^-h), h in
                                    [0, BS_MAX_HEADROOM] (0 = BS_HEADROOM; the decoder needs no h) */
};

/* What one call did: payload bytes on each connection, and the seconds spent in the codec (the
 * wire's transform and the transport's pack/unpack; none with the raw transport) and in the sums
 * (stats may be NULL). */
struct re_stats {
    uint64_t bytes_sent, bytes_received;
    double codec_seconds, sum_seconds;
};

/*
 * Error feedback's first half, before a call: x[i] += residual[i] (the residual the last call of
 * the same tensor left).
 */
void re_compensate(float *x, const float *residual, size_t n);

/*
 * Sum x[0..n) over the ring in place; every rank ends with the same bits. lost (NULL: no error
 * feedback; refused with the raw transport): n floats that get this call's sent - decoded for
 * every position this rank put on the wire, non-finite entries set to 0 (the next call's
 * residual). Returns RE_OK or a negative re_status with one line in err[0..errcap).
 */
int re_allreduce(const struct re_ring *r, float *x, size_t n, float *lost, struct re_stats *stats, char *err,
                 size_t errcap);

const char *re_strerror(int status);

#ifdef __cplusplus
}
#endif
#endif
