/* libinceptionn_tag: give the TCP sockets of an unmodified program the gradient ToS (0x28).
 *
 * Loaded with LD_PRELOAD (`inceptionn run`, `inceptionn mpirun`). The policy comes from
 * INCEPTIONN_TAG, checked once when the library loads: a bad policy ends the process right
 * there with one line on stderr and exit status 2, before the program's main() runs.
 *
 *   all                 every TCP socket
 *   none                none by policy; only sockets the program tags itself
 *   rport=N[-M]         sockets that connect() to a remote port in N..M
 *   lport=N[-M]         sockets that listen() on, or are accept()ed on, a local port in N..M
 *   port=N[-M]          both of the above: the service port, at either end of the connection
 *   net=ADDR[/LEN]      sockets that connect() to, or are accept()ed from, a peer in that
 *                       IPv4 or IPv6 network (IPv4 networks also match IPv4-mapped peers)
 *   tos=V               the mark (default 0x28): a multiple of 4 from 4 to 252, decimal or 0x..;
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

#include "inceptionn_tag.h"

#define EXPORT __attribute__((visibility("default")))

#define DEFAULT_TOS 0x28
/* The soft NIC's own DSCPs on the wire (daemon/config.py defaults): a program marked with one
 * would have its plain bytes taken for compressed data, or its SYNs for the soft NIC's hello. */
#define DSCP_COMPRESSED 11
#define DSCP_HELLO 12
#define LOG_OPEN_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW)
#define MAX_TERMS 32
#define MAX_POLICY 4096

enum kind { K_ALL, K_NONE, K_PORT, K_LPORT, K_RPORT, K_NET };
static const char *const KIND_NAME[] = {"all", "none", "port", "lport", "rport", "net"};

struct term {
    enum kind kind;
    unsigned lo, hi;         /* port terms */
    int family;              /* net: AF_INET or AF_INET6 */
    unsigned char addr[16];  /* net: network address, network byte order */
    unsigned plen;
};

struct policy {
    int n;
    struct term t[MAX_TERMS];
    int has_all, has_none, has_lport, has_rport, has_net; /* port= counts as lport and rport */
    int tos;
    int keep;
};

static struct policy P = {.tos = DEFAULT_TOS, .keep = 1}; /* read-only after init() */
static int g_active;                                      /* INCEPTIONN_TAG is set */
static int g_log_level;
static char g_log_path[1024];                             /* empty: stderr */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_listen)(int, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);

/* --- policy parsing (mirrored by shim/policy.py; tests compare the two) --------------------- */

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_uint(const char *s, size_t len, size_t maxdigits, unsigned *out)
{
    unsigned v = 0;
    if (len == 0 || len > maxdigits)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int parse_range(const char *v, size_t len, struct term *t)
{
    const char *dash = memchr(v, '-', len);
    unsigned lo, hi;
    if (dash) {
        if (parse_uint(v, (size_t)(dash - v), 5, &lo) || parse_uint(dash + 1, len - (size_t)(dash - v) - 1, 5, &hi))
            return -1;
    } else {
        if (parse_uint(v, len, 5, &lo))
            return -1;
        hi = lo;
    }
    if (lo < 1 || hi > 65535 || lo > hi)
        return -1;
    t->lo = lo;
    t->hi = hi;
    return 0;
}

static int prefix_match(const unsigned char *a, const unsigned char *net, unsigned plen)
{
    unsigned full = plen / 8, rem = plen % 8;
    if (memcmp(a, net, full) != 0)
        return 0;
    return rem == 0 || ((a[full] ^ net[full]) & (0xffu << (8 - rem)) & 0xffu) == 0;
}

static int parse_net(const char *term, size_t tl, const char *v, size_t len, struct term *t, char *err, size_t n)
{
    char buf[INET6_ADDRSTRLEN];
    const char *slash = NULL;
    for (size_t i = 0; i < len; i++)
        if (v[i] == '/')
            slash = v + i;
    size_t alen = slash ? (size_t)(slash - v) : len;
    if (alen == 0 || alen >= sizeof buf)
        return fail(err, n, "bad network '%.*s': not an IPv4 or IPv6 address", (int)tl, term);
    memcpy(buf, v, alen);
    buf[alen] = 0;
    t->family = memchr(buf, ':', alen) ? AF_INET6 : AF_INET;
    if (inet_pton(t->family, buf, t->addr) != 1)
        return fail(err, n, "bad network '%.*s': not an IPv4 or IPv6 address", (int)tl, term);
    unsigned maxp = t->family == AF_INET ? 32 : 128;
    t->plen = maxp;
    if (slash && (parse_uint(slash + 1, len - alen - 1, 3, &t->plen) || t->plen > maxp))
        return fail(err, n, "bad network '%.*s': prefix length must be 0-%u", (int)tl, term, maxp);
    unsigned char net[16] = {0};
    size_t bytes = t->family == AF_INET ? 4 : 16;
    for (size_t i = 0; i < bytes; i++) {
        unsigned keep = t->plen >= 8 * (i + 1) ? 8 : (t->plen > 8 * i ? t->plen - 8 * i : 0);
        net[i] = (unsigned char)(t->addr[i] & (0xff00u >> keep));
    }
    if (memcmp(net, t->addr, bytes) != 0) {
        char nbuf[INET6_ADDRSTRLEN];
        inet_ntop(t->family, net, nbuf, sizeof nbuf);
        return fail(err, n, "bad network '%.*s': host bits set (did you mean %s/%u?)", (int)tl, term, nbuf, t->plen);
    }
    return 0;
}

static int parse_tos(const char *v, size_t len, int *tos)
{
    unsigned x = 0;
    if (len >= 3 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
        if (len > 4)
            return -1;
        for (size_t i = 2; i < len; i++) {
            char c = v[i];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0)
                return -1;
            x = x * 16 + (unsigned)d;
        }
    } else if (parse_uint(v, len, 3, &x)) {
        return -1;
    }
    if (x < 4 || x > 252 || x % 4 != 0)
        return -1;
    *tos = (int)x;
    return 0;
}

static int parse_policy(const char *text, struct policy *p, char *err, size_t n)
{
    memset(p, 0, sizeof *p);
    p->tos = -1;
    p->keep = -1;
    size_t total = strlen(text);
    if (total > MAX_POLICY)
        return fail(err, n, "policy too long (%zu characters, at most %d)", total, MAX_POLICY);
    for (size_t i = 0; i < total; i++)
        if ((unsigned char)text[i] < 0x20 || (unsigned char)text[i] > 0x7e)
            return fail(err, n, "non-printable or non-ASCII character at position %zu", i);
    size_t blank = strspn(text, " ");
    if (blank == total)
        return fail(err, n, "empty policy");
    int selectors = 0;
    const char *s = text;
    for (;;) {
        const char *end = strchr(s, ',');
        const char *a = s, *b = end ? end : s + strlen(s);
        while (a < b && *a == ' ')
            a++;
        while (b > a && b[-1] == ' ')
            b--;
        size_t tl = (size_t)(b - a);
        if (tl == 0)
            return fail(err, n, "empty term (two commas in a row, or a comma at an end)");
        const char *eq = memchr(a, '=', tl);
        size_t kl = eq ? (size_t)(eq - a) : tl;
        const char *v = eq ? eq + 1 : NULL;
        size_t vl = eq ? (size_t)(b - v) : 0;
#define KEY(k) (kl == sizeof(k) - 1 && memcmp(a, k, kl) == 0)
        struct term t;
        memset(&t, 0, sizeof t);
        int is_selector = 1;
        if (KEY("all") || KEY("none")) {
            if (eq)
                return fail(err, n, "'%.*s' takes no value", (int)kl, a);
            t.kind = KEY("all") ? K_ALL : K_NONE;
        } else if (KEY("port") || KEY("lport") || KEY("rport")) {
            t.kind = KEY("port") ? K_PORT : KEY("lport") ? K_LPORT : K_RPORT;
            if (!eq || parse_range(v, vl, &t))
                return fail(err, n, "bad port range '%.*s': use N or N-M with 1 <= N <= M <= 65535", (int)tl, a);
        } else if (KEY("net")) {
            t.kind = K_NET;
            if (!eq)
                return fail(err, n, "bad network '%.*s': not an IPv4 or IPv6 address", (int)tl, a);
            if (parse_net(a, tl, v, vl, &t, err, n))
                return -1;
        } else if (KEY("tos")) {
            is_selector = 0;
            if (p->tos >= 0)
                return fail(err, n, "'tos' given twice");
            if (!eq || parse_tos(v, vl, &p->tos))
                return fail(err, n, "bad tos '%.*s': use a multiple of 4 from 4 to 252 (the low 2 bits are ECN), e.g. tos=0x28", (int)tl, a);
            if (p->tos >> 2 == DSCP_COMPRESSED || p->tos >> 2 == DSCP_HELLO)
                return fail(err, n, "bad tos '%.*s': DSCP %d is the soft NIC's own mark for %s on the wire; pick another, e.g. tos=0x28",
                            (int)tl, a, p->tos >> 2, p->tos >> 2 == DSCP_COMPRESSED ? "compressed data" : "its handshake");
        } else if (KEY("override")) {
            is_selector = 0;
            if (p->keep >= 0)
                return fail(err, n, "'override' given twice");
            if (eq && vl == 4 && memcmp(v, "keep", 4) == 0)
                p->keep = 1;
            else if (eq && vl == 5 && memcmp(v, "allow", 5) == 0)
                p->keep = 0;
            else
                return fail(err, n, "bad override '%.*s': use keep or allow", (int)tl, a);
        } else {
            return fail(err, n, "unknown term '%.*s' (expected all, none, port=, lport=, rport=, net=, tos=, override=)", (int)tl, a);
        }
#undef KEY
        if (is_selector) {
            if (p->n == MAX_TERMS)
                return fail(err, n, "too many selectors (at most %d)", MAX_TERMS);
            p->t[p->n++] = t;
            selectors++;
            p->has_all |= t.kind == K_ALL;
            p->has_none |= t.kind == K_NONE;
            p->has_lport |= t.kind == K_LPORT || t.kind == K_PORT;
            p->has_rport |= t.kind == K_RPORT || t.kind == K_PORT;
            p->has_net |= t.kind == K_NET;
        }
        if (!end)
            break;
        s = end + 1;
    }
    if (selectors == 0)
        return fail(err, n, "no selector: give all, none, port=, lport=, rport= or net=");
    if (p->has_none && selectors > 1)
        return fail(err, n, "'none' cannot be combined with other selectors");
    if (p->has_all && selectors > 1)
        return fail(err, n, "'all' cannot be combined with other selectors (it already covers every TCP socket)");
    if (p->tos < 0)
        p->tos = DEFAULT_TOS;
    if (p->keep < 0)
        p->keep = 1;
    return 0;
}

static void canonical(const struct policy *p, char *out, size_t n)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < p->n && used < n; i++) {
        const struct term *t = &p->t[i];
        const char *sep = i ? "," : "";
        if (t->kind == K_ALL || t->kind == K_NONE) {
            used += (size_t)snprintf(out + used, n - used, "%s%s", sep, KIND_NAME[t->kind]);
        } else if (t->kind == K_NET) {
            char a[INET6_ADDRSTRLEN];
            inet_ntop(t->family, t->addr, a, sizeof a);
            used += (size_t)snprintf(out + used, n - used, "%snet=%s/%u", sep, a, t->plen);
        } else if (t->lo == t->hi) {
            used += (size_t)snprintf(out + used, n - used, "%s%s=%u", sep, KIND_NAME[t->kind], t->lo);
        } else {
            used += (size_t)snprintf(out + used, n - used, "%s%s=%u-%u", sep, KIND_NAME[t->kind], t->lo, t->hi);
        }
    }
    if (used < n)
        snprintf(out + used, n - used, ",tos=0x%02x,override=%s", p->tos, p->keep ? "keep" : "allow");
}

EXPORT int inceptionn_tag_parse_policy(const char *text, char *out, size_t outlen)
{
    struct policy p;
    if (!out || outlen == 0)
        return -1;
    if (!text)
        return fail(out, outlen, "empty policy");
    if (parse_policy(text, &p, out, outlen))
        return -1;
    canonical(&p, out, outlen);
    return 0;
}

/* --- logging ---------------------------------------------------------------------------------- */

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
    char line[1024];
    int saved = errno;
    int len = snprintf(line, sizeof line, "inceptionn-tag[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    len += vsnprintf(line + len, sizeof line - (size_t)len - 1, fmt, ap);
    va_end(ap);
    if (len > (int)sizeof line - 2)
        len = (int)sizeof line - 2;
    line[len++] = '\n';
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

static void describe_term(const struct term *t, char *out, size_t n)
{
    struct policy one = {.n = 1};
    one.t[0] = *t;
    canonical(&one, out, n);
    char *comma = strchr(out, ',');
    if (comma)
        *comma = 0;
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

static int parse_log(const char *v)
{
    const char *path = NULL;
    if (v[0] >= '0' && v[0] <= '2' && (v[1] == 0 || v[1] == ':')) {
        g_log_level = v[0] - '0';
        if (v[1] == ':')
            path = v + 2;
    } else {
        g_log_level = 1;
        path = v;
    }
    if (path) {
        if (path[0] != '/' || strlen(path) >= sizeof g_log_path)
            return -1;
        strcpy(g_log_path, path);
    }
    return 0;
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
    if (log && log[0] && parse_log(log))
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
        char err[512];
        if (parse_policy(pol, &P, err, sizeof err))
            die("INCEPTIONN_TAG policy", pol, err);
        g_active = 1;
        if (g_log_level >= 2) {
            char c[8192];
            canonical(&P, c, sizeof c);
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

static int net_match(const struct term *t, const struct sockaddr *sa, socklen_t len)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const unsigned char *a = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        return t->family == AF_INET && prefix_match(a, t->addr, t->plen);
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (t->family == AF_INET6)
            return prefix_match(a6->s6_addr, t->addr, t->plen);
        return IN6_IS_ADDR_V4MAPPED(a6) && prefix_match(a6->s6_addr + 12, t->addr, t->plen);
    }
    return 0;
}

/* index of the first selector matching, or -1. lport/rport 0: not known at this point. */
static int match(const struct sockaddr *peer, socklen_t peerlen, int lport, int rport)
{
    for (int i = 0; i < P.n; i++) {
        const struct term *t = &P.t[i];
        int l_in = lport > 0 && (unsigned)lport >= t->lo && (unsigned)lport <= t->hi;
        int r_in = rport > 0 && (unsigned)rport >= t->lo && (unsigned)rport <= t->hi;
        switch (t->kind) {
        case K_ALL: return i;
        case K_NONE: break;
        case K_PORT: if (l_in || r_in) return i; break;
        case K_LPORT: if (l_in) return i; break;
        case K_RPORT: if (r_in) return i; break;
        case K_NET: if (net_match(t, peer, peerlen)) return i; break;
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
    describe_term(&P.t[idx], term, sizeof term);
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
