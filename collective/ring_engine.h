/*
 * The ring engine: the INCEPTIONN ring's allreduce over two connected sockets, in one poll()
 * loop, with no MPI and no Python in it. Its schedule, its primitives, the transport table and
 * the codec interface are described once, in docs/collectives.md ("The ring engine"); the wire
 * is "Wire format v2" there.
 *
 * The caller owns everything around a call: the connections (opened and proven beforehand, e.g.
 * by ring_handshake.c), the settings every rank must share (the same transport, codec, error
 * bound and chunk on every rank), the residual memory of error feedback and what a failure means
 * (the MPI library aborts the job). A failed call returns a negative status and one line in err;
 * x is then partly reduced and must not be used, and the connections are not reusable.
 */
#ifndef INCEPTIONN_RING_ENGINE_H
#define INCEPTIONN_RING_ENGINE_H

#include <stddef.h>
#include <stdint.h>

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
 * A codec behind one interface. The engine calls encode/decode in the codec transport, and
 * reconstruct (= decode(encode(x)) + 0.0, fixed points of the codec) to build a tagged wire without
 * scaling. scaled: the codec's wire is wire format v2 (codecs_c/blockscale_codec.h at
 * error_bound), built from INCEPTIONN's reconstruction; only that codec has the trait. Unscaled in
 * the codec transport, a chunk's payload is the codec's stream of its values themselves.
 * sum_encoded (may be NULL): the codec adds in the encoded domain (THC). The codec transport then
 * sums without decoding: a hop encodes its own values and adds that stream to the received
 * partial sum (a: received, b: this rank's own), the owner decodes once and the sum's stream
 * travels on; decode gives the SUM of a stream's contributions, and count_encoded checks a received
 * stream (for n values, this call's parameters) and says how many contributions it sums.
 * encode_sum (may be NULL; only with sum_encoded) does a hop's work in one pass: this rank's values
 * x[0..n) encoded and, when a is not NULL, added to the received stream a (checked as
 * sum_encoded checks it), without building x's own stream; lost (may be NULL) gets
 * x - decode(x's own stream), error feedback's residual. Returns the bytes written to out. The
 * engine uses it instead of encode + decode + sum_encoded where a codec has it.
 * release (may be NULL): frees what the codec's state allocated during a call (scratch); the
 * engine calls it when re_allreduce returns. docs/collectives.md, "The ring engine".
 */
struct re_codec {
    const char *name;
    int scaled;
    int error_bound;
    void *state;
    size_t (*max_encoded_size)(const struct re_codec *c, size_t n);
    ptrdiff_t (*encode)(const struct re_codec *c, const float *x, size_t n, uint8_t *out, size_t cap);
    int (*decode)(const struct re_codec *c, const uint8_t *in, size_t len, float *out, size_t n);
    void (*reconstruct)(const struct re_codec *c, const float *x, size_t n, float *out);
    ptrdiff_t (*sum_encoded)(const struct re_codec *c, const uint8_t *a, size_t alen, const uint8_t *b,
                             size_t blen, size_t n, uint8_t *out, size_t cap);
    int (*count_encoded)(const struct re_codec *c, const uint8_t *in, size_t len, size_t n, uint32_t *count);
    const char *(*strerror)(int status);
    ptrdiff_t (*encode_sum)(const struct re_codec *c, const float *x, size_t n, const uint8_t *a, size_t alen,
                            float *lost, uint8_t *out, size_t cap);
    void (*release)(const struct re_codec *c);
};

/* The INCEPTIONN codec at error bound k (INC_MIN_ERROR_BOUND..INC_MAX_ERROR_BOUND), scaled. */
void re_codec_inceptionn(struct re_codec *c, int k);

/*
 * THC (codecs_c/thc_codec.h) for one call, summed in the encoded domain (collective/ring_codecs.c).
 * Every rank holds the same bits, granularity, table, t_p, agreed norm and rotation seed; a
 * block of n values is quantized on the range M = t_p * norm / sqrt(d), d its padded length
 * (thc.py range_for). noise_seed is this rank's own: encode k of the call rounds with
 * thc_random_word(noise_seed, k) (encodes counts them). ranks: the most contributions a stream
 * sums (sizes the frames). The fields after encodes are the adapter's scratch (zero: none yet),
 * reused by every encode and decode of a call and freed by re_thc_release, which re_allreduce
 * calls when it returns (the codec's release): a caller that zero-initialises the struct and uses
 * it only through re_allreduce has nothing to free.
 */
struct re_thc {
    int bits, granularity, ranks;
    uint8_t table[256];
    double t_p, norm;
    uint64_t rot_seed, noise_seed, encodes;
    float *work;        /* scratch: work_dim floats */
    uint8_t *index;     /* scratch: work_dim table indices */
    size_t work_dim;
};

void re_codec_thc(struct re_codec *c, struct re_thc *s);

/* Frees the scratch of s (idempotent; the other fields are left as they are). */
void re_thc_release(struct re_thc *s);

/* 3LC (codecs_c/threelc_codec.h) with sparsity multiplier s and zero-run encoding on or off
 * (collective/ring_codecs.c): stateless, the same stream as threelc.py's C path. */
struct re_tlc {
    float sparsity;
    int zre;
};

void re_codec_threelc(struct re_codec *c, struct re_tlc *s);

/* TernGrad (codecs_c/terngrad_codec.h): clip, the agreed scaler (negative: none), packing, and the
 * random stream's seed and position, which every encode advances by tg_draws(n) (the caller reads
 * draw back after the call; collective/ring_codecs.c). */
struct re_tg {
    double clip;
    float shared;
    int packing;
    uint64_t seed, draw;
};

void re_codec_terngrad(struct re_codec *c, struct re_tg *s);

/*
 * How a chunk travels (a table of operations; the caller tags the sockets to match):
 * re_transport_raw     float32 as they are: exact, no codec, no error feedback
 * re_transport_tagged  the codec's wire floats (fixed points), for a soft NIC on a tagged socket
 * re_transport_codec   the codec in this process: its stream of the wire floats behind a 4-byte
 *                      little-endian length
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

extern const struct re_transport re_transport_raw, re_transport_tagged, re_transport_codec;

/* The transport of that name ("raw", "nic", "app"), or NULL. */
const struct re_transport *re_transport_named(const char *name);

struct re_ring {
    int rank, size;              /* size >= 1; size 1 leaves x as it is */
    int send_fd, recv_fd;        /* connected: to the right neighbour, from the left one */
    int timeout_ms;              /* no progress for this long fails the call */
    size_t chunk;                /* values per pipelined chunk, >= 1 */
    const struct re_transport *tp;
    const struct re_codec *codec;   /* NULL only with re_transport_raw */
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
