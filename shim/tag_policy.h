/* The tagging policy (INCEPTIONN_TAG) and log setting (INCEPTIONN_TAG_LOG): the one parser of
 * both. The LD_PRELOAD library (inceptionn_tag.c) runs it in every process it loads into; Python
 * (inceptionn.shim.policy, `inceptionn run` and `inceptionn mpirun`) calls the same code through
 * cffi, so a policy the CLI accepts is one the library accepts, with the same canonical form and
 * the same reasons. The grammar is written out in docs/shim.md ("The policy"); tag_policy.c is
 * its one parser.
 *
 * The input is user text from the environment or the command line: every read is bounded by
 * the given length (a NUL inside is a non-printable character, not an end). */
#ifndef TAG_POLICY_H
#define TAG_POLICY_H

#include <stddef.h>

#define TAG_POLICY_MAX_LEN 4096   /* characters of policy text */
#define TAG_POLICY_MAX_TERMS 32   /* selectors */
#define TAG_POLICY_TEXT_MAX 4096  /* room for any canonical form (32 terms of at most 53) */
#define TAG_ERROR_MAX 512         /* room for any reason */
#define TAG_LOG_PATH_MAX 1024     /* bytes of a log path, its NUL included */

enum tag_kind { TAG_ALL, TAG_NONE, TAG_PORT, TAG_LPORT, TAG_RPORT, TAG_NET };

struct tag_term {
    enum tag_kind kind;
    unsigned lo, hi;         /* port terms: the range */
    int family;              /* net: AF_INET or AF_INET6 */
    unsigned char addr[16];  /* net: network address, network byte order */
    unsigned plen;           /* net: prefix length */
};

struct tag_policy {
    int n;                   /* selectors in t[] */
    struct tag_term t[TAG_POLICY_MAX_TERMS];
    int has_all, has_none, has_lport, has_rport, has_net; /* port= counts as lport and rport */
    int tos;                 /* the mark (INCEPTIONN_TOS_TAGGED unless tos= says otherwise) */
    int keep;                /* override=keep (1) or allow (0) */
};

/* Parse and check text[0..len). Returns 0 with *p filled, or -1 with the reason in err
 * (always NUL-terminated when errlen > 0) and *p unusable. */
int tag_policy_parse(const char *text, size_t len, struct tag_policy *p, char *err, size_t errlen);

/* The canonical form (every selector, then tos= and override=), which parses to itself. */
void tag_policy_text(const struct tag_policy *p, char *out, size_t outlen);

/* One selector as the canonical form writes it, e.g. "port=23000-23099". */
void tag_term_text(const struct tag_term *t, char *out, size_t outlen);

/* 1 when the first plen bits of the addresses a and net agree. */
int tag_prefix_match(const unsigned char *a, const unsigned char *net, unsigned plen);

/* INCEPTIONN_TAG_LOG: 0, 1, 2, an absolute path (level 1) or LEVEL:PATH; empty is 0. Returns 0
 * with the level and the path ("" for stderr), or -1 for anything else. */
int tag_log_parse(const char *text, size_t len, int *level, char *path, size_t pathlen);

#endif
