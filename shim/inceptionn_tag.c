/* libinceptionn_tag: give the TCP sockets of an unmodified program a gradient ToS (default 0x24, raw
 * gradients: the soft NIC scales each packet; tos=0x28 for senders that scale their own).
 *
 * Loaded with LD_PRELOAD (`inceptionn run`, `inceptionn mpirun`). The policy comes from
 * INCEPTIONN_TAG, checked once when the library loads by tag_policy.c (the parser the CLI also
 * runs, through cffi): a bad policy ends the process right there with one line on stderr and
 * exit status 2, before the program's main() runs. The marks: inceptionn_contract.h.
 *
 *   all                 every TCP socket
 *   none                none by policy; only sockets the program tags itself
 *   rport=N[-M]         sockets that connect() to a remote port in N..M
 *   lport=N[-M]         sockets that listen() on, or are accept()ed on, a local port in N..M
 *   port=N[-M]          both of the above: the service port, at either end of the connection
 *   net=ADDR[/LEN]      sockets that connect() to, or are accept()ed from, a peer in that
 *                       IPv4 or IPv6 network (IPv4 networks also match IPv4-mapped peers)
 *   tos=V               the mark (default 0x24): a multiple of 4 from 4 to 252, decimal or 0x..;
 *                       not DSCP 11 (0x2c) or 12 (0x30), the soft NIC's own marks on the wire
 *   override=keep|allow keep (default): the tag stays when the program later sets IP_TOS or
 *                       IPV6_TCLASS itself; allow: the program's own value wins, both later
 *                       and when it set one before the socket matched
 *
 * Terms are separated by commas; selectors add up (a socket matching any is tagged).
 *
 * What is interposed: connect, listen, accept, accept4 (to tag) and setsockopt (to keep the
 * tag). Sockets are tagged before connect() and listen(), so the SYN and SYN-ACK already carry
 * the mark. Anything that is not TCP over IPv4/IPv6 (UDP, unix, raw, SCTP, MPTCP) is never
 * touched. Without INCEPTIONN_TAG every interposer is a plain call through after one cached
 * check (no system call of ours); with a policy, a connect() to a non-IP address costs nothing
 * either, and an IP connect/listen/accept costs at most three getsockopt() and two lookups.
 * Reads and writes are never interposed.
 *
 * INCEPTIONN_TAG_LOG: 0 (off), 1 (every socket tagged, on stderr), 2 (also the policy as loaded
 * and every socket left untagged and why), an absolute file path (level 1, appended), or
 * LEVEL:PATH. The file is opened with O_NOFOLLOW: a symbolic link there is refused at load.
 *
 * In a set-user-ID, set-group-ID or capability-gaining program (AT_SECURE) the environment is the
 * invoker's, not the program's: both variables are read with secure_getenv, so the library
 * stays inert there (a user cannot have a privileged program's traffic marked for lossy
 * compression, nor make it append to a file of the user's choosing).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <unistd.h>

#include "inceptionn_contract.h"
#include "inceptionn_tag.h"
#include "log_line.h"
#include "tag_policy.h"

#define EXPORT __attribute__((visibility("default")))

#define LOG_OPEN_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW)

static struct tag_policy P = {.tos = INCEPTIONN_TOS_SCALED, .keep = 1}; /* read-only after init() */
static int g_active;                                      /* INCEPTIONN_TAG is set */
static int g_log_level;
static char g_log_path[TAG_LOG_PATH_MAX];                 /* empty: stderr */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_listen)(int, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);

/* The library's own entry to the parser (tag_policy.c), for programs that want to check a
 * policy the way the library will. */
EXPORT int inceptionn_tag_parse_policy(const char *text, char *out, size_t outlen)
{
    struct tag_policy p;
    if (!out || outlen == 0)
        return -1;
    if (tag_policy_parse(text, text ? strlen(text) : 0, &p, out, outlen))
        return -1;
    tag_policy_text(&p, out, outlen);
    return 0;
}

/* --- logging ---------------------------------------------------------------------------------- */

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
    char line[1024];
    int saved = errno;
    int prefix = snprintf(line, sizeof line, "inceptionn-tag[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    size_t len = log_line_finish(line, sizeof line, prefix, fmt, ap);
    va_end(ap);
    /* A file is opened for every line: a program that closes or reuses descriptors can never
     * get our log lines written into one of its own files or sockets. */
    int fd = g_log_path[0] ? open(g_log_path, LOG_OPEN_FLAGS, 0644) : 2;
    if (fd >= 0) {
        ssize_t w = write(fd, line, (size_t)len); /* one write: lines of processes never mix */
        (void)w;
        if (fd != 2)
            close(fd);
    }
    errno = saved;
}

static void fmt_addr(const struct sockaddr *sa, socklen_t len, char *out, size_t n)
{
    char a[INET6_ADDRSTRLEN] = "?";
    if (sa && sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s->sin_addr, a, sizeof a);
        snprintf(out, n, "%s:%u", a, ntohs(s->sin_port));
    } else if (sa && sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s->sin6_addr, a, sizeof a);
        snprintf(out, n, "[%s]:%u", a, ntohs(s->sin6_port));
    } else {
        snprintf(out, n, "?");
    }
}

/* --- the loud failure at load time ------------------------------------------------------------ */

static void die(const char *what, const char *value, const char *reason)
{
    char shown[256];
    size_t i = 0;
    for (; value[i] && i < sizeof shown - 4; i++)
        shown[i] = ((unsigned char)value[i] < 0x20 || (unsigned char)value[i] > 0x7e) ? '?' : value[i];
    if (value[i])
        memcpy(shown + i, "...", 3), i += 3;
    shown[i] = 0;
    char line[1024];
    int len = snprintf(line, sizeof line, "inceptionn: error: bad %s '%s': %s\n", what, shown, reason);
    if (len > (int)sizeof line - 1)
        len = (int)sizeof line - 1;
    ssize_t w = write(2, line, (size_t)len);
    (void)w;
    _exit(2);
}

static void init(void)
{
    real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    real_listen = (int (*)(int, int))dlsym(RTLD_NEXT, "listen");
    real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    real_setsockopt = (int (*)(int, int, int, const void *, socklen_t))dlsym(RTLD_NEXT, "setsockopt");
    if (!real_connect || !real_listen || !real_accept || !real_accept4 || !real_setsockopt)
        die("environment", "LD_PRELOAD", "the C library's socket calls cannot be found (dlsym RTLD_NEXT)");

    /* secure_getenv: NULL under AT_SECURE, where the environment is the invoker's. */
    const char *log = secure_getenv("INCEPTIONN_TAG_LOG");
    if (log && tag_log_parse(log, strlen(log), &g_log_level, g_log_path, sizeof g_log_path))
        die("INCEPTIONN_TAG_LOG", log, "use 0, 1, 2, an absolute file path, or LEVEL:PATH");
    if (getauxval(AT_SECURE))
        g_log_path[0] = 0; /* never a file of the invoker's choosing, whatever set the path */
    if (g_log_path[0]) {
        int fd = open(g_log_path, LOG_OPEN_FLAGS, 0644);
        if (fd < 0)
            die("INCEPTIONN_TAG_LOG", log, errno == ELOOP ? "the log file is a symbolic link (refused)" : strerror(errno));
        close(fd);
    }
    const char *pol = secure_getenv("INCEPTIONN_TAG");
    if (pol) {
        char err[TAG_ERROR_MAX];
        if (tag_policy_parse(pol, strlen(pol), &P, err, sizeof err))
            die("INCEPTIONN_TAG policy", pol, err);
        g_active = 1;
        if (g_log_level >= 2) {
            char c[TAG_POLICY_TEXT_MAX];
            tag_policy_text(&P, c, sizeof c);
            logmsg("policy %s", c);
        }
    }
}

__attribute__((constructor)) static void on_load(void)
{
    pthread_once(&g_once, init);
}

/* --- matching and tagging --------------------------------------------------------------------- */

/* AF_INET or AF_INET6 for a TCP socket, 0 for any other socket, -1 (errno set) for a non-socket */
static int tcp_family(int fd)
{
    int dom, type, proto;
    socklen_t l = sizeof dom;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) != 0)
        return -1;
    if (dom != AF_INET && dom != AF_INET6)
        return 0;
    l = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM)
        return 0;
    l = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) != 0 || proto != IPPROTO_TCP)
        return 0;
    return dom;
}

static int port_of(const struct sockaddr *sa, socklen_t len)
{
    if (sa && sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in))
        return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    if (sa && sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6))
        return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    return 0;
}

static int net_match(const struct tag_term *t, const struct sockaddr *sa, socklen_t len)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const unsigned char *a = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        return t->family == AF_INET && tag_prefix_match(a, t->addr, t->plen);
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (t->family == AF_INET6)
            return tag_prefix_match(a6->s6_addr, t->addr, t->plen);
        return IN6_IS_ADDR_V4MAPPED(a6) && tag_prefix_match(a6->s6_addr + 12, t->addr, t->plen);
    }
    return 0;
}

/* index of the first selector matching, or -1. lport/rport 0: not known at this point. */
static int match(const struct sockaddr *peer, socklen_t peerlen, int lport, int rport)
{
    for (int i = 0; i < P.n; i++) {
        const struct tag_term *t = &P.t[i];
        int l_in = lport > 0 && (unsigned)lport >= t->lo && (unsigned)lport <= t->hi;
        int r_in = rport > 0 && (unsigned)rport >= t->lo && (unsigned)rport <= t->hi;
        switch (t->kind) {
        case TAG_ALL: return i;
        case TAG_NONE: break;
        case TAG_PORT: if (l_in || r_in) return i; break;
        case TAG_LPORT: if (l_in) return i; break;
        case TAG_RPORT: if (r_in) return i; break;
        case TAG_NET: if (net_match(t, peer, peerlen)) return i; break;
        }
    }
    return -1;
}

static int get_tos(int fd, int fam)
{
    int v = 0;
    socklen_t l = sizeof v;
    int r = fam == AF_INET6 ? getsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, &l)
                            : getsockopt(fd, IPPROTO_IP, IP_TOS, &v, &l);
    return r == 0 ? v : -1;
}

static int set_tos(int fd, int fam, int tos)
{
    int v = tos;
    if (fam == AF_INET6) {
        int r = real_setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, sizeof v);
        (void)real_setsockopt(fd, IPPROTO_IP, IP_TOS, &v, sizeof v); /* for IPv4-mapped peers */
        return r;
    }
    return real_setsockopt(fd, IPPROTO_IP, IP_TOS, &v, sizeof v);
}

/* Tag fd if a selector matches; `what` describes the event for the log. */
static void decide(int fd, int fam, int idx, const char *what)
{
    if (idx < 0) {
        if (g_log_level >= 2)
            logmsg("untagged fd %d (%s): no selector matches", fd, what);
        return;
    }
    char term[160];
    tag_term_text(&P.t[idx], term, sizeof term);
    if (!P.keep) {
        int cur = get_tos(fd, fam);
        if (cur >= 0 && (cur & 0xfc) != 0 && (cur & 0xfc) != P.tos) {
            if (g_log_level >= 1)
                logmsg("left fd %d (%s, %s): the program set tos 0x%02x (override=allow)", fd, what, term, cur);
            return;
        }
    }
    if (set_tos(fd, fam, P.tos) == 0) {
        if (g_log_level >= 1)
            logmsg("tagged fd %d tos 0x%02x (%s, %s)", fd, P.tos, what, term);
    } else if (g_log_level >= 1) {
        logmsg("could not tag fd %d (%s): %s", fd, what, strerror(errno));
    }
}

static void on_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    if (!(P.has_all || P.has_rport || P.has_net))
        return;
    int fam = tcp_family(fd);
    if (fam <= 0)
        return;
    char what[96], a[72];
    fmt_addr(addr, len, a, sizeof a);
    snprintf(what, sizeof what, "connect to %s", a);
    decide(fd, fam, match(addr, len, 0, port_of(addr, len)), what);
}

static void on_listen(int fd)
{
    if (!(P.has_all || P.has_lport))
        return;
    int fam = tcp_family(fd);
    if (fam <= 0)
        return;
    struct sockaddr_storage local;
    socklen_t ll = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0)
        return;
    char what[96];
    int lport = port_of((struct sockaddr *)&local, ll);
    snprintf(what, sizeof what, "listen on port %d", lport);
    decide(fd, fam, match(NULL, 0, lport, 0), what);
}

static void on_accept(int fd)
{
    if (!(P.has_all || P.has_lport || P.has_net))
        return;
    int fam = tcp_family(fd);
    if (fam <= 0)
        return;
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return;
    char what[112], a[72];
    int lport = port_of((struct sockaddr *)&local, ll);
    fmt_addr((struct sockaddr *)&peer, pl, a, sizeof a);
    snprintf(what, sizeof what, "accept from %s on port %d", a, lport);
    decide(fd, fam, match((struct sockaddr *)&peer, pl, lport, 0), what);
}

/* --- the interposed calls --------------------------------------------------------------------- */

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    pthread_once(&g_once, init);
    if (g_active && !P.has_none && addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        int saved = errno;
        on_connect(fd, addr, len);
        errno = saved;
    }
    return real_connect(fd, addr, len);
}

EXPORT int listen(int fd, int backlog)
{
    pthread_once(&g_once, init);
    if (g_active && !P.has_none) {
        int saved = errno;
        on_listen(fd);
        errno = saved;
    }
    return real_listen(fd, backlog);
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    pthread_once(&g_once, init);
    int r = real_accept(fd, addr, len);
    if (r >= 0 && g_active && !P.has_none) {
        int saved = errno;
        on_accept(r);
        errno = saved;
    }
    return r;
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    pthread_once(&g_once, init);
    int r = real_accept4(fd, addr, len, flags);
    if (r >= 0 && g_active && !P.has_none) {
        int saved = errno;
        on_accept(r);
        errno = saved;
    }
    return r;
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    pthread_once(&g_once, init);
    if (g_active && P.keep && val && len >= 1 &&
        ((level == IPPROTO_IP && name == IP_TOS) || (level == IPPROTO_IPV6 && name == IPV6_TCLASS))) {
        int saved = errno;
        int want = len >= (socklen_t)sizeof(int) ? *(const int *)val : *(const unsigned char *)val;
        int fam = tcp_family(fd);
        if (fam > 0) {
            int cur = get_tos(fd, level == IPPROTO_IPV6 ? AF_INET6 : AF_INET);
            if (cur >= 0 && (cur & 0xfc) == P.tos && (want & 0xfc) != P.tos) {
                if (g_log_level >= 1)
                    logmsg("kept tos 0x%02x on fd %d: the program set 0x%02x (override=keep)", P.tos, fd, want & 0xff);
                errno = saved;
                return 0;
            }
        }
        errno = saved;
    }
    return real_setsockopt(fd, level, name, val, len);
}

EXPORT int inceptionn_tag_socket(int fd)
{
    pthread_once(&g_once, init);
    int fam = tcp_family(fd);
    if (fam < 0)
        return -1;
    if (fam == 0) {
        errno = EPROTONOSUPPORT;
        return -1;
    }
    if (set_tos(fd, fam, P.tos) != 0)
        return -1;
    if (g_log_level >= 1)
        logmsg("tagged fd %d tos 0x%02x (explicit call)", fd, P.tos);
    return 0;
}
