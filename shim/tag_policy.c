/* The tagging policy and log setting parsers (see tag_policy.h): shared by the LD_PRELOAD
 * library and, through cffi, by the Python side. No globals, no allocation: safe to call from a
 * library constructor before the program's main(). */
#define _GNU_SOURCE
#include "tag_policy.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "inceptionn_contract.h"

static const char *const KIND_NAME[] = {"all", "none", "port", "lport", "rport", "net"};

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    if (n > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
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

static int parse_range(const char *v, size_t len, struct tag_term *t)
{
    const char *dash = memchr(v, '-', len);
    unsigned lo, hi;
    if (dash) {
        size_t ll = (size_t)(dash - v);
        if (parse_uint(v, ll, 5, &lo) || parse_uint(dash + 1, len - ll - 1, 5, &hi))
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

int tag_prefix_match(const unsigned char *a, const unsigned char *net, unsigned plen)
{
    unsigned full = plen / 8, rem = plen % 8;
    if (memcmp(a, net, full) != 0)
        return 0;
    return rem == 0 || ((a[full] ^ net[full]) & (0xffu << (8 - rem)) & 0xffu) == 0;
}

/* term[0..tl) is the whole term, for the messages; v[0..len) its value after "net=". */
static int parse_net(const char *term, size_t tl, const char *v, size_t len, struct tag_term *t, char *err, size_t n)
{
    char buf[INET6_ADDRSTRLEN];
    const char *slash = NULL;
    for (size_t i = 0; i < len; i++)
        if (v[i] == '/')
            slash = v + i; /* the last one: "a/b/24" fails as an address */
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
        unsigned keep = t->plen >= 8 * (i + 1) ? 8 : (t->plen > 8 * i ? t->plen - 8 * (unsigned)i : 0);
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

int tag_policy_parse(const char *text, size_t total, struct tag_policy *p, char *err, size_t n)
{
    memset(p, 0, sizeof *p);
    p->tos = -1;
    p->keep = -1;
    /* characters first: the length below then counts characters, not bytes of UTF-8 */
    for (size_t i = 0; i < total && i <= TAG_POLICY_MAX_LEN; i++)
        if ((unsigned char)text[i] < 0x20 || (unsigned char)text[i] > 0x7e)
            return fail(err, n, "non-printable or non-ASCII character at position %zu", i);
    if (total > TAG_POLICY_MAX_LEN)
        return fail(err, n, "policy too long (%zu characters, at most %d)", total, TAG_POLICY_MAX_LEN);
    size_t blank = 0;
    while (blank < total && text[blank] == ' ')
        blank++;
    if (blank == total) /* also catches an empty (or NULL, length 0) text */
        return fail(err, n, "empty policy");
    const char *s = text, *stop = text + total;
    int selectors = 0;
    for (;;) {
        const char *comma = memchr(s, ',', (size_t)(stop - s));
        const char *a = s, *b = comma ? comma : stop;
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
        struct tag_term t;
        memset(&t, 0, sizeof t);
        int is_selector = 1;
        if (KEY("all") || KEY("none")) {
            if (eq)
                return fail(err, n, "'%.*s' takes no value", (int)kl, a);
            t.kind = KEY("all") ? TAG_ALL : TAG_NONE;
        } else if (KEY("port") || KEY("lport") || KEY("rport")) {
            t.kind = KEY("port") ? TAG_PORT : KEY("lport") ? TAG_LPORT : TAG_RPORT;
            if (!eq || parse_range(v, vl, &t))
                return fail(err, n, "bad port range '%.*s': use N or N-M with 1 <= N <= M <= 65535", (int)tl, a);
        } else if (KEY("net")) {
            t.kind = TAG_NET;
            if (!eq)
                return fail(err, n, "bad network '%.*s': not an IPv4 or IPv6 address", (int)tl, a);
            if (parse_net(a, tl, v, vl, &t, err, n))
                return -1;
        } else if (KEY("tos")) {
            is_selector = 0;
            if (p->tos >= 0)
                return fail(err, n, "'tos' given twice");
            if (!eq || parse_tos(v, vl, &p->tos))
                return fail(err, n, "bad tos '%.*s': use a multiple of 4 from 4 to 252 (the low 2 bits are ECN), e.g. tos=0x%02x",
                            (int)tl, a, INCEPTIONN_TOS_TAGGED);
            /* A program marked like the soft NIC's own packets would have its plain bytes taken
             * for compressed data, or its SYNs for the soft NIC's hello. */
            if (p->tos == INCEPTIONN_TOS_COMPRESSED || p->tos == INCEPTIONN_TOS_HELLO)
                return fail(err, n, "bad tos '%.*s': DSCP %d is the soft NIC's own mark for %s on the wire; pick another, e.g. tos=0x%02x",
                            (int)tl, a, p->tos >> 2, p->tos == INCEPTIONN_TOS_COMPRESSED ? "compressed data" : "its handshake",
                            INCEPTIONN_TOS_TAGGED);
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
            if (p->n == TAG_POLICY_MAX_TERMS)
                return fail(err, n, "too many selectors (at most %d)", TAG_POLICY_MAX_TERMS);
            p->t[p->n++] = t;
            selectors++;
            p->has_all |= t.kind == TAG_ALL;
            p->has_none |= t.kind == TAG_NONE;
            p->has_lport |= t.kind == TAG_LPORT || t.kind == TAG_PORT;
            p->has_rport |= t.kind == TAG_RPORT || t.kind == TAG_PORT;
            p->has_net |= t.kind == TAG_NET;
        }
        if (!comma)
            break;
        s = comma + 1;
    }
    if (selectors == 0)
        return fail(err, n, "no selector: give all, none, port=, lport=, rport= or net=");
    if (p->has_none && selectors > 1)
        return fail(err, n, "'none' cannot be combined with other selectors");
    if (p->has_all && selectors > 1)
        return fail(err, n, "'all' cannot be combined with other selectors (it already covers every TCP socket)");
    if (p->tos < 0)
        p->tos = INCEPTIONN_TOS_SCALED; /* raw gradients: the soft NIC scales each packet */
    if (p->keep < 0)
        p->keep = 1;
    return 0;
}

/* snprintf at out[*used], never past n; *used stops at n once the text is cut. */
static void append(char *out, size_t n, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *out, size_t n, size_t *used, const char *fmt, ...)
{
    if (*used >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + *used, n - *used, fmt, ap);
    va_end(ap);
    *used = w < 0 || (size_t)w >= n - *used ? n : *used + (size_t)w;
}

static void term_append(const struct tag_term *t, char *out, size_t n, size_t *used)
{
    unsigned k = (unsigned)t->kind;
    const char *name = k < sizeof KIND_NAME / sizeof *KIND_NAME ? KIND_NAME[k] : "?";
    if (t->kind == TAG_ALL || t->kind == TAG_NONE) {
        append(out, n, used, "%s", name);
    } else if (t->kind == TAG_NET) {
        char a[INET6_ADDRSTRLEN] = "?";
        inet_ntop(t->family, t->addr, a, sizeof a);
        append(out, n, used, "net=%s/%u", a, t->plen);
    } else if (t->lo == t->hi) {
        append(out, n, used, "%s=%u", name, t->lo);
    } else {
        append(out, n, used, "%s=%u-%u", name, t->lo, t->hi);
    }
}

void tag_term_text(const struct tag_term *t, char *out, size_t n)
{
    size_t used = 0;
    if (n == 0)
        return;
    out[0] = 0;
    term_append(t, out, n, &used);
}

void tag_policy_text(const struct tag_policy *p, char *out, size_t n)
{
    size_t used = 0;
    if (n == 0)
        return;
    out[0] = 0;
    for (int i = 0; i < p->n && i < TAG_POLICY_MAX_TERMS; i++) {
        if (i)
            append(out, n, &used, ",");
        term_append(&p->t[i], out, n, &used);
    }
    append(out, n, &used, ",tos=0x%02x,override=%s", p->tos, p->keep ? "keep" : "allow");
}

int tag_log_parse(const char *text, size_t len, int *level, char *path, size_t pathlen)
{
    const char *where = NULL;
    size_t wl = 0;
    if (pathlen == 0)
        return -1;
    path[0] = 0;
    if (len == 0) {
        *level = 0;
        return 0;
    }
    if (text[0] >= '0' && text[0] <= '2' && (len == 1 || text[1] == ':')) {
        *level = text[0] - '0';
        if (len > 1)
            where = text + 2, wl = len - 2;
    } else {
        *level = 1;
        where = text, wl = len;
    }
    if (where) {
        if (wl == 0 || where[0] != '/' || wl >= pathlen || memchr(where, 0, wl))
            return -1;
        memcpy(path, where, wl);
        path[wl] = 0;
    }
    return 0;
}
