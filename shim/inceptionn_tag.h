/* The tagging shim's public calls (libinceptionn_tag, loaded with LD_PRELOAD).
 *
 * A program that knows which of its sockets carry gradients can tag them itself. Look the call
 * up at run time, so the program still runs without the shim:
 *
 *     int (*tag)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "inceptionn_tag_socket");
 *     if (tag) tag(fd); else setsockopt(fd, IPPROTO_IP, IP_TOS, &(int){0x28}, sizeof(int));
 *
 * See docs/shim.md for the policy grammar and the contract (only float32 gradient streams).
 */
#ifndef INCEPTIONN_TAG_H
#define INCEPTIONN_TAG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tag a TCP socket (IPv4: IP_TOS, IPv6: IPV6_TCLASS and IP_TOS) with the policy's ToS
 * (0x28 when INCEPTIONN_TAG is unset). Returns 0, or -1 with errno: EPROTONOSUPPORT for a
 * socket that is not TCP over IPv4/IPv6, ENOTSOCK/EBADF for something that is not a socket. */
int inceptionn_tag_socket(int fd);

/* Check a policy string without applying it. Returns 0 and writes the canonical form into
 * out, or -1 and writes the reason it is rejected. out is always NUL-terminated (outlen > 0). */
int inceptionn_tag_parse_policy(const char *text, char *out, size_t outlen);

#ifdef __cplusplus
}
#endif

#endif
