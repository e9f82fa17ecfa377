/*
 * What the MPI_Allreduce library's files (pmpi_*.c) share: its settings, its state per
 * communicator and its counters. Internal: the library's interface is pmpi_allreduce.h.
 */
#ifndef INCEPTIONN_PMPI_INTERNAL_H
#define INCEPTIONN_PMPI_INTERNAL_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <ifaddrs.h>
#include <math.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "blockscale_codec.h"
#include "inceptionn_codec.h"
#include "inceptionn_contract.h"
#include "log_line.h"
#include "nicd_bound.h"
#include "pmpi_allreduce.h"
#include "ring_engine.h"
#include "ring_handshake.h"

#define EXPORT __attribute__((visibility("default")))

enum { MODE_APP = 0, MODE_NIC = 1 };
extern const char *const MODE_NAME[2];

/* The codec (INCEPTIONN_MPI_CODEC): one of the codec table's (codecs_c/codec_table.h, by
 * get_codec's names) that has a ring codec in C, at get_codec(name)'s defaults (its description's),
 * with its traits deciding as in collective.Group: a per-value codec is scaled (wire format v2)
 * and cut into pipeline chunks, the others encode one whole ring block per call, their per-tensor
 * unit. cfg.codec is its index in re_codecs. */
#define CODEC (re_codecs[cfg.codec])
static inline int codec_count(void)
{
    int n = 0;
    while (re_codecs[n])
        n++;
    return n;
}
#define CODEC_NAME(c) ((c) >= 0 && (c) < codec_count() ? re_codecs[c]->name : "?")

/* The settings (pmpi_settings.c: read when the library loads, agreed in MPI_Init) */
struct pmpi_cfg {
    int mode, codec, k, log, timeout_ms, feedback;
    int headroom;             /* INCEPTIONN_MPI_HEADROOM: bits the scaled wire gives up for ratio (ring_engine.h) */
    long min_count, chunk;
    struct in_addr addr;
    int have_addr;            /* from INCEPTIONN_MPI_ADDR or _IFACE (else chosen at setup) */
    char iface[64];
    char nicd_socket[108];    /* nic mode: the local soft NIC's stats socket, %h expanded */
    char k_from[160];         /* where cfg.k came from, for the log */
    int choose;               /* INCEPTIONN_MPI_CHOOSE: CHOOSE_AUTO, CHOOSE_RING or CHOOSE_MPI */
    int probe_inject;         /* INCEPTIONN_MPI_PROBE_TIMES given (tests): probe_ms replaces the measured times */
    double probe_ms[2];       /* the ring's, MPI's own */
};
extern struct pmpi_cfg cfg;

enum { CHOOSE_AUTO = 0, CHOOSE_RING, CHOOSE_MPI, CHOOSE_COUNT };
extern const char *const CHOOSE_NAME[CHOOSE_COUNT];

/* The settings every rank must share, agreed over MPI_COMM_WORLD in MPI_Init (agree_settings):
 * until then (MPI_Init never seen) and after a mismatch nothing is taken. */
enum { AGREE_UNSEEN = 0, AGREE_OK, AGREE_OFF };
extern int g_agree;

/* Error feedback (on by default; INCEPTIONN_MPI_ERROR_FEEDBACK=0 turns it off): what this rank's receivers did not get in the last call of
 * the same count on the same communicator, added to the next one. Keyed by (communicator, count),
 * not by buffer: see docs/mpi-allreduce.md. At most INC_MPI_EF_MAX_KEYS per communicator, the
 * least recently used dropped. */
struct residual {
    size_t n;
    unsigned long used;       /* the ring's call number when last used (LRU) */
    float *lost;              /* n values, unscaled */
    int owed;                 /* a ring call refilled lost since a call of MPI's own spent it */
    struct residual *next;
};

/* INCEPTIONN_MPI_CHOOSE=auto: one count class [2^c, 2^(c+1)) on one communicator. MPI orders the
 * collectives on a communicator, so every rank counts the class's calls alike and makes the same
 * calls probe calls; a round's decision is taken from the max over ranks of the measured times,
 * so every rank takes the same path (the paths give different results). */
struct choice {
    unsigned long calls;      /* calls of this class so far */
    unsigned long next_round; /* the call that starts the next probe round (0: the first call) */
    unsigned long interval;   /* calls from the last decision to next_round */
    int samples;              /* probe calls of this round done */
    int use_mpi;              /* the decision: MPI's own, or the ring (also before the first) */
    double ring_s[INC_MPI_PROBE_CALLS], mpi_s[INC_MPI_PROBE_CALLS];   /* this rank's, this round */
    float *copy;              /* a probe call's input, which MPI's own sums beside the ring */
    size_t copy_cap;
};

/* One communicator's ring. Calls on it are serialized by mu (MPI_THREAD_MULTIPLE programs). */
enum { RING_NEW = 0, RING_READY, RING_FALLBACK, RING_CLOSED };
struct ring {
    pthread_mutex_t mu;
    int state, rank, size, send_fd, recv_fd;
    MPI_Comm comm;
    unsigned long calls;
    struct residual *residuals;
    struct choice choice[INC_MPI_CHOICE_CLASSES];   /* by count class (auto) */
    int foreign;              /* holds processes of another MPI_COMM_WORLD: never taken */
    uint64_t rounds;          /* taken calls so far: THC's round number (every rank counts the same) */
    uint64_t noise_seed;      /* this rank's own, from getrandom() at setup: THC's rounding noise */
    void *codec_state;        /* the codec's state, from its defaults at the first call (its random stream's position) */
    struct ring *next;
};

/* pmpi_allreduce.c: the rings, the counters of the summary line */
extern pthread_mutex_t g_mu;
extern int g_keyval;
extern struct ring *g_rings;
struct pmpi_stats {
    unsigned long taken, passed, ef_dropped;
    double taken_bytes, passed_bytes, seconds, ef_bytes;   /* ef_bytes: residual memory held now */
    double check_seconds, hash_seconds;   /* comparing the results across ranks (check_result), hashing */
    double wire_bytes, float_bytes;       /* the ring's payload bytes this rank sent, and as float32 */
};
extern struct pmpi_stats g_stats;

/* pmpi_choice.c: what the summary says per count class, over every communicator */
struct pmpi_class_stats {
    unsigned long ring_calls, mpi_calls, rounds;
    int use_mpi;
    double ring_s, mpi_s;
};
extern struct pmpi_class_stats g_choice[INC_MPI_CHOICE_CLASSES];

/* pmpi_allreduce.c */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double now(void);

/* pmpi_settings.c */
void agree_settings(void);

/* pmpi_ring.c */
void setup(struct ring *r);
void close_ring(struct ring *r);
void ring_fail(struct ring *r, const char *what) __attribute__((noreturn));
int ring_allreduce(struct ring *r, float *x, size_t n, float *lost);

/* pmpi_comm.c */
struct residual *residual_for(struct ring *r, size_t n);
int delete_ring(MPI_Comm comm, int keyval, void *value, void *extra);
struct ring *ring_for(MPI_Comm comm, int size);

/* pmpi_result_check.c */
void check_result(struct ring *r, const float *x, size_t n, double *hash_s);

/* pmpi_choice.c */
int count_class(int count);
int probing(const struct choice *ch);
double probe_start(struct ring *r, struct choice *ch, const void *input, size_t n);
void ring_done(struct ring *r, struct choice *ch, int c, int probe, size_t n, double ring_s, double mpi_s,
               struct residual *ef);
int mpi_chosen(struct ring *r, struct choice *ch, int c, const void *sendbuf, void *recvbuf, int count);
void say_choices(void);

#endif
