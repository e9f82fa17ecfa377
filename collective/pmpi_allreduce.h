/*
 * The MPI_Allreduce interposition library (docs/mpi-allreduce.md): loaded into every rank with
 * LD_PRELOAD by `inceptionn mpirun --compress-allreduce`, it takes float32 sums of at least
 * INCEPTIONN_MPI_MIN_COUNT values on intracommunicators and runs the INCEPTIONN ring on its own
 * TCP connections; every other call goes to PMPI_Allreduce untouched.
 *
 * Settings, read once when the library loads (a bad value stops the process with one line):
 *   INCEPTIONN_MPI_MODE         nic (ring sockets tagged 0x28: the soft NICs compress) or app
 *                               (the codec in the process, untagged sockets); default app
 *   INCEPTIONN_MPI_CODEC        inceptionn (default), thc, 3lc or terngrad (app mode only), at
 *                               the Python codecs' defaults; fft is refused (numpy's only)
 *   INCEPTIONN_MPI_MIN_COUNT    smallest count taken (default 65536 values)
 *   INCEPTIONN_MPI_ERROR_BOUND  the codec's k, -30..-1 (default: inceptionn_contract.h's, nicd's; in nic mode
 *                               it must be the daemons' bound)
 *   INCEPTIONN_MPI_CHUNK        values per pipelined chunk (default 65536)
 *   INCEPTIONN_MPI_TIMEOUT      seconds a ring waits for a peer before aborting, and the one
 *                               deadline of a ring's setup handshake (default 300)
 *   INCEPTIONN_MPI_ADDR         the IPv4 address of the ring's sockets, or
 *   INCEPTIONN_MPI_IFACE        an interface name or an IPv4 network (a.b.c.d/len) to take it from
 *                               (default: the first non-loopback IPv4 address)
 *   INCEPTIONN_MPI_ERROR_FEEDBACK  1: error feedback, one residual per (communicator, count),
 *                               at most INC_MPI_EF_MAX_KEYS per communicator; 0: off; unset: the
 *                               codec's default (on, terngrad off)
 *   INCEPTIONN_MPI_LOG          1: one line per MPI_Allreduce (taken or passed, and why), setup
 *                               lines, a summary at MPI_Finalize; 0 or unset: warnings only
 *   INCEPTIONN_MPI_NICD_SOCKET  nic mode: the local soft NIC's stats socket, whose error bound
 *                               replaces INCEPTIONN_MPI_ERROR_BOUND (%h: the host name; default
 *                               nicd's default socket)
 *   INCEPTIONN_MPI_CHOOSE       auto (default): per communicator and count class [2^c, 2^(c+1)),
 *                               the ring or MPI's own, whichever the probe calls measured faster
 *                               (docs/mpi-allreduce.md, "Ring or MPI's own"); ring: always the ring;
 *                               mpi: every call MPI's own
 *   INCEPTIONN_MPI_PROBE_TIMES  tests only: RING_MS,MPI_MS replace this rank's measured times of
 *                               every probe call (the decision still takes the max over ranks)
 *
 * Mode, codec, threshold, error bound and chunk are compared over MPI_COMM_WORLD in MPI_Init: a
 * difference turns the library off on every rank (docs/mpi-allreduce.md, "Settings").
 */
#ifndef INCEPTIONN_PMPI_ALLREDUCE_H
#define INCEPTIONN_PMPI_ALLREDUCE_H

#define INC_MPI_DEFAULT_MIN_COUNT 65536
#define INC_MPI_DEFAULT_CHUNK 65536
#define INC_MPI_MIN_CHUNK 8              /* INCEPTIONN_MPI_CHUNK's range (values) */
#define INC_MPI_MAX_CHUNK (1 << 24)
#define INC_MPI_DEFAULT_TIMEOUT 300
#define INC_MPI_MAX_TIMEOUT 86400        /* INCEPTIONN_MPI_TIMEOUT's range: 1 s to a day */
#define INC_MPI_CHOICE_CLASSES 31        /* count classes [2^c, 2^(c+1)) of an int count */
#define INC_MPI_PROBE_CALLS 2            /* probe calls per round (one ring-first, one MPI-first) */
#define INC_MPI_REPROBE_FIRST 256        /* calls of a class from a decision to the next round, */
#define INC_MPI_REPROBE_MAX 8192         /* doubling after every round up to this */
#define INC_MPI_EF_MAX_KEYS 16           /* error feedback: residuals kept per communicator (LRU) */
#define INC_MPI_HELLO_MAGIC 20181024.0f  /* float32 integers >= 1: a soft NIC leaves them exact */
#define INC_MPI_SETTINGS_VERSION 5       /* the settings and the handshake this build speaks (5: the headroom) */

/* collective/pmpi_abi.c: stop with one line if another MPI family's libmpi is in the process */
void inc_mpi_check_abi(void);

#endif
