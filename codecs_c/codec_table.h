/*
 * The codec table: every C codec, described once, for the ring engine (collective/ring_engine.c),
 * the MPI library (collective/pmpi_allreduce.c) and Python (the codecs' and the engine's cffi
 * modules; codecs_c/base.py reads the traits and defaults from here).
 *
 * A codec's C file (NAME_codec.c) exports one struct re_codec_desc, re_codec_ID_desc; codec_list.h
 * names them all, one line each. Nothing outside a codec's file knows the codec: callers look it
 * up by name (re_codec_named) and use what the description says.
 */
#ifndef INCEPTIONN_CODEC_TABLE_H
#define INCEPTIONN_CODEC_TABLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A codec behind one interface, for one call of the ring engine. The engine calls encode/decode in
 * the codec transport, and reconstruct (= decode(encode(x)) + 0.0, fixed points of the codec) to
 * build a tagged wire without scaling. scaled: the codec's wire is wire format v2
 * (codecs_c/blockscale_codec.h at error_bound), built from INCEPTIONN's reconstruction; only that
 * codec has the trait. Unscaled in the codec transport, a chunk's payload is the codec's stream of
 * its values themselves.
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

/* What a caller (the MPI library) knows of one call, for a codec's begin. Every rank passes the
 * same values but seed. */
struct re_call {
    int ranks;              /* the ring's size: the most contributions a stream sums */
    int error_bound;        /* the configured error bound (for a codec that runs at one) */
    size_t block;           /* the most values one encode sees */
    uint64_t round;         /* the call's number, counted alike on every rank */
    uint64_t seed;          /* this rank's own random seed (getrandom() at setup) */
    double shared;          /* the max over ranks of local_stat (a codec that needs agreement) */
};

/*
 * One codec, described once. The traits are codecs_c/base.py's (its docstring says what each
 * means); app, nic and summed say what the C codec runs: in the process (the engine's codec
 * transport), in the soft NIC (the tagged transport: the NIC decodes what it runs), and whether it
 * sums streams without decoding. A codec without a ring codec in C (make NULL: app = nic = 0) runs
 * through its Python methods, never in the MPI library.
 * state: state_size bytes of type state_type (its cdef says the fields), defaults the state at
 * get_codec(name)'s defaults. A caller copies defaults, sets what it has (Python: the codec
 * object's parameters; the MPI library: begin), then make fills a struct re_codec over it.
 */
struct re_codec_desc {
    const char *name;                   /* get_codec's name */
    int per_value, wants_scaling, wants_error_feedback, needs_agreement, thread_safe;
    int app, nic, summed;
    const char *state_type;             /* e.g. "struct re_thc"; NULL: no state */
    size_t state_size;
    const void *defaults;
    void (*make)(struct re_codec *c, void *state);
    /* needs_agreement: this rank's statistic, max-reduced over the ranks into re_call.shared */
    double (*local_stat)(const float *x, size_t n);
    /* may be NULL: the call's parameters into the state; nonzero: this call cannot be encoded
     * (every rank sees the same values and decides the same; the caller sums it exactly) */
    int (*begin)(void *state, const struct re_call *call);
    /* may be NULL (the name): the codec and its parameters in one line (at the state and call's
     * settings), for the MPI library's ring-ready line */
    void (*describe)(const void *state, const struct re_call *call, char *out, size_t cap);
};

/* Every codec of codec_list.h, in its order, then NULL. */
extern const struct re_codec_desc *const re_codecs[];

/* The codec of that name (get_codec's), or NULL. */
const struct re_codec_desc *re_codec_named(const char *name);

#ifdef __cplusplus
}
#endif
#endif
