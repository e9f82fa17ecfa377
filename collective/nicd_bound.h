/* The error bound the local soft NIC runs, read from its stats socket (daemon/stats.py: one JSON
 * document per connection, the bound at config.error_bound): what the MPI_Allreduce library's nic
 * mode must use. */
#ifndef INCEPTIONN_NICD_BOUND_H
#define INCEPTIONN_NICD_BOUND_H

#include <stddef.h>

/* 1 with *k set; 0 when no daemon serves path (no socket, or nobody listening: this host's tagged
 * packets leave raw); -1 with why filled in for anything else (not allowed, no answer, no bound). */
int nicd_error_bound(const char *path, int *k, char *why, size_t whylen);

/* The bound in a stats document (len bytes, not NUL-terminated): 0 with *k set, -1 if absent. */
int nicd_bound_from_json(const char *doc, size_t len, int *k);

#endif
