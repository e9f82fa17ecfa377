/*
 * After each call taken: every rank's result must be the same bits (a hash compared over the
 * communicator).
 */
#include "pmpi_internal.h"

/* --- the result check: every rank's result must be the same bits ------------------------------ */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* A 64-bit hash of n floats' bits: four lanes of a bijective step per 8-byte word (one differing
 * word always changes its lane's state), combined at the end. Not keyed: it compares replicas,
 * whose bits only this process wrote. */
static uint64_t result_hash(const float *x, size_t n)
{
    const uint64_t P = 0x9e3779b185ebca87ULL;
    uint64_t h[4] = {P, ~P, P * 3, ~(P * 3)};
    const uint8_t *b = (const void *)x;
    size_t bytes = n * sizeof(float), i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * (size_t)j, 8);
            h[j] = (h[j] ^ w) * P;
            h[j] ^= h[j] >> 29;
        }
    for (; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, b + i, 4);
        h[0] = (h[0] ^ w) * P;
        h[0] ^= h[0] >> 29;
    }
    return mix64(h[0] ^ (h[1] << 17 | h[1] >> 47) ^ (h[2] << 31 | h[2] >> 33) ^ (h[3] << 47 | h[3] >> 17) ^ bytes);
}

/* One PMPI_Allreduce(MAX) of (h, ~h): max h == min h iff every rank's result is the same bits.
 * A soft NIC whose bound changed mid-job (SIGHUP) makes replicas differ: the job ends here, before
 * any rank returns the result. Rank 0 says why; the others wait for mpirun to end them. */
void check_result(struct ring *r, const float *x, size_t n, double *hash_s)
{
    double t0 = now();
    uint64_t h = result_hash(x, n), v[2] = {h, ~h}, m[2] = {0, 0};
    *hash_s = now() - t0;
    if (PMPI_Allreduce(v, m, 2, MPI_UINT64_T, MPI_MAX, r->comm) != MPI_SUCCESS)
        ring_fail(r, "comparing the result across ranks: PMPI_Allreduce failed");
    if (m[0] == ~m[1])
        return;
    if (r->rank == 0)
        say("error: MPI_Allreduce ring (%d ranks, mode %s, codec %s, error bound %d) gave different results on different "
            "ranks (a soft NIC's error bound changed during the job? a reload with SIGHUP does that); aborting the job "
            "before any rank returns it", r->size, MODE_NAME[cfg.mode], CODEC->name, cfg.k);
    else
        sleep(2);
    PMPI_Abort(r->comm, 1);
    _exit(1);
}
