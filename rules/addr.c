/*
 * addr.c - HOST:PORT arguments of `bind` and `upstream`, their printing, and
 * which sockets they meet.
 *
 * The file syntax is "1.2.3.4:80", "[::1]:80" or (upstream only)
 * "name.example:80".  Literal addresses are checked with inet_pton and stored
 * in canonical inet_ntop form, so that "[0::1]:80" and "[::1]:80" are seen
 * as the same bind address.
 *
 * Two binds clash, and an upstream reaches a bind, as Linux has it: a
 * wildcard bind (0.0.0.0, *) takes its port on every IPv4 address of the
 * host, and [::] on every address, IPv4 too (the default
 * net.ipv6.bindv6only=0; twice does not set IPV6_V6ONLY).  An IPv4-mapped
 * IPv6 address is the IPv4 address it maps.
 */
#include "rules/diag.h"
#include "rules/interp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Size of a canonical address string, IPv6 being the longest. */
#define CONF_IP_BYTES INET6_ADDRSTRLEN

struct conf_hostport {
    char host[CONF_HOST_BYTES]; /* without brackets */
    bool bracketed;
    uint16_t port;
};

static void conf_addr_needs_port(struct conf_parser *p, const struct conf_word *w,
                                 const char *directive, const char *example)
{
    conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "'%s' needs HOST:PORT, e.g. %s", directive,
                  example);
}

/* A decimal port 1..65535 with nothing after it. */
static bool conf_parse_port(const char *s, uint16_t *port)
{
    unsigned long v = 0;

    if (*s == '\0') {
        return false;
    }
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9') {
            return false;
        }
        v = v * 10 + (unsigned long)(*s - '0');
        if (v > UINT16_MAX) {
            return false;
        }
    }
    *port = (uint16_t)v;
    return v != 0;
}

/* Find the host (between *host and *host_end) and the port text of a word
 * written "[v6]:port" or "host:port".  Returns false after an error. */
static bool conf_find_parts(struct conf_parser *p, const struct conf_word *w, const char **host,
                            const char **host_end, const char **port)
{
    char shown[CONF_SHOW_BYTES];
    const char *text = w->text, *colon;

    if (text[0] == '[') {
        *host = text + 1;
        *host_end = strchr(*host, ']');
        if (*host_end == NULL || ((*host_end)[1] != ':' && (*host_end)[1] != '\0')) {
            conf_diag_add(p->diags, CONF_ERROR, w->loc, "write an IPv6 address as [::1]:6380",
                          "invalid address '%s'", conf_show(text, shown));
            return false;
        }
        *port = (*host_end)[1] == ':' ? *host_end + 2 : *host_end + 1;
        return true;
    }
    colon = strrchr(text, ':');
    if (colon != NULL && memchr(text, ':', (size_t)(colon - text)) != NULL) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "e.g. [::1]:6380",
                      "IPv6 address in '%s' must be in brackets", conf_show(text, shown));
        return false;
    }
    *host = text;
    *host_end = colon != NULL ? colon : text + strlen(text);
    *port = colon != NULL ? colon + 1 : *host_end;
    return true;
}

/* The port a broker URL's scheme implies when it names none; NULL for an unknown scheme. */
static const char *conf_scheme_port(const char *scheme, size_t len)
{
    static const struct {
        const char *scheme, *port;
    } ports[] = {{"amqp", "5672"}, {"amqps", "5671"}, {"redis", "6379"}};

    for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++) {
        if (strlen(ports[i].scheme) == len && strncmp(scheme, ports[i].scheme, len) == 0) {
            return ports[i].port;
        }
    }
    return NULL;
}

/* A broker URL (amqp://user:pass@host:5672/vhost) where HOST:PORT goes: an error that says
 * so and what to write, the URL's host and port.  Returns whether the word was one. */
static bool conf_url_refused(struct conf_parser *p, const struct conf_word *w,
                             const char *directive)
{
    const char *text = w->text, *sep = strstr(text, "://");
    char shown[CONF_SHOW_BYTES], addr[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES + CONF_SHOW_BYTES];

    if (sep == NULL) {
        return false;
    }
    const char *start = sep + 3, *end = start + strcspn(start, "/?#");
    const char *at = memchr(start, '@', (size_t)(end - start));
    bool creds = at != NULL, more = *end != '\0' && strcmp(end, "/") != 0;
    const char *host = creds ? at + 1 : start;
    size_t len = (size_t)(end - host);
    const char *close = memchr(host, ']', len),
               *colon = memchr(close ? close : host, ':', (size_t)(end - (close ? close : host)));
    const char *port = colon == NULL ? conf_scheme_port(text, (size_t)(sep - text)) : NULL;

    if (len == 0 || len >= CONF_SHOW_MAX) {
        snprintf(addr, sizeof(addr), "HOST:PORT");
    } else {
        snprintf(addr, sizeof(addr), "%.*s%s%s", (int)len, host, colon == NULL ? ":" : "",
                 colon == NULL ? (port != NULL ? port : "PORT") : "");
    }
    bool tls = (sep - text == 5 && strncmp(text, "amqps", 5) == 0) ||
               (sep - text == 6 && strncmp(text, "rediss", 6) == 0);
    snprintf(hint, sizeof(hint), "write '%s %s'%s%s", directive, conf_show(addr, shown),
             creds || more ? "; the rest (user, password, vhost or db) stays in the app's URL" : "",
             tls && strcmp(directive, "upstream") == 0 ? "; 'upstream-tls' for its TLS" : "");
    conf_diag_add(p->diags, CONF_ERROR, w->loc, hint,
                  "'%s' is a URL, not an address: '%s' takes HOST:PORT", conf_show(text, shown),
                  directive);
    return true;
}

/* Split the word into host and port, reporting any error. */
static bool conf_split_hostport(struct conf_parser *p, const struct conf_word *w,
                                const char *directive, const char *example,
                                struct conf_hostport *hp)
{
    char shown[CONF_SHOW_BYTES];
    const char *host, *host_end, *port;
    size_t len;

    if (conf_url_refused(p, w, directive) || !conf_find_parts(p, w, &host, &host_end, &port)) {
        return false;
    }
    len = (size_t)(host_end - host);
    if (len == 0 || *port == '\0') {
        conf_addr_needs_port(p, w, directive, example);
        return false;
    }
    if (len >= sizeof(hp->host)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "host in '%s' is too long (at most %d bytes)", conf_show(w->text, shown),
                      CONF_DNS_NAME_MAX);
        return false;
    }
    if (!conf_parse_port(port, &hp->port)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "invalid port '%s' (1-65535)",
                      conf_show(port, shown));
        return false;
    }
    memcpy(hp->host, host, len);
    hp->host[len] = '\0';
    hp->bracketed = w->text[0] == '[';
    return true;
}

/* Write the canonical form of the literal `text` of family `af` to buf
 * (CONF_IP_BYTES); false when it is not such a literal. */
static bool conf_canonical_ip(const char *text, int af, char *buf)
{
    unsigned char bin[sizeof(struct in6_addr)];

    return inet_pton(af, text, bin) == 1 && inet_ntop(af, bin, buf, CONF_IP_BYTES) != NULL;
}

/* Store `host` and the port into *out; false when out of memory. */
static bool conf_addr_store(struct conf_parser *p, const struct conf_word *w, const char *host,
                            uint16_t port, struct conf_addr *out)
{
    char *copy = conf_parser_strdup(p, host);

    if (copy == NULL) {
        return false;
    }
    free(out->host);
    out->host = copy;
    out->port = port;
    out->loc = w->loc;
    return true;
}

bool conf_value_bind(struct conf_parser *p, const struct conf_word *w, struct conf_addr *out)
{
    char shown[CONF_SHOW_BYTES], ip[CONF_IP_BYTES];
    struct conf_hostport hp;
    const char *literal;

    if (!conf_split_hostport(p, w, "bind", "127.0.0.1:6380", &hp)) {
        return false;
    }
    literal = hp.host;
    if (!hp.bracketed && strcmp(hp.host, "localhost") == 0) {
        literal = "127.0.0.1";
    } else if (!hp.bracketed && strcmp(hp.host, "*") == 0) {
        literal = "0.0.0.0";
    }
    if (hp.bracketed && !conf_canonical_ip(literal, AF_INET6, ip)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "invalid IPv6 address '%s'",
                      conf_show(hp.host, shown));
        return false;
    }
    if (!hp.bracketed && !conf_canonical_ip(literal, AF_INET, ip)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "use an IPv4 address, a bracketed IPv6 address, localhost or *",
                      "invalid bind address '%s'", conf_show(hp.host, shown));
        return false;
    }
    return conf_addr_store(p, w, ip, hp.port, out);
}

/* Whether `s` is made only of digits and dots, i.e. meant as IPv4. */
static bool conf_looks_ipv4(const char *s)
{
    return strspn(s, "0123456789.") == strlen(s);
}

/* A DNS name: labels of [A-Za-z0-9_-], 1..63 bytes each, joined by dots. */
static bool conf_is_dns_name(const char *s)
{
    size_t label = 0;

    for (; *s != '\0'; s++) {
        char c = *s;
        if (c == '.') {
            if (label == 0) {
                return false;
            }
            label = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_') {
            if (++label > CONF_DNS_LABEL_MAX) {
                return false;
            }
        } else {
            return false;
        }
    }
    return label > 0;
}

/* Resolve the host part of an upstream to the string to store in buf
 * (CONF_HOST_BYTES); false after an error. */
static bool conf_upstream_host(struct conf_parser *p, const struct conf_word *w,
                               const struct conf_hostport *hp, char *buf)
{
    char shown[CONF_SHOW_BYTES];

    if (hp->bracketed) {
        if (conf_canonical_ip(hp->host, AF_INET6, buf)) {
            return true;
        }
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "invalid IPv6 address '%s'",
                      conf_show(hp->host, shown));
        return false;
    }
    if (conf_looks_ipv4(hp->host)) {
        if (conf_canonical_ip(hp->host, AF_INET, buf)) {
            return true;
        }
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "invalid IPv4 address '%s'",
                      conf_show(hp->host, shown));
        return false;
    }
    if (conf_is_dns_name(hp->host)) {
        memcpy(buf, hp->host, strlen(hp->host) + 1);
        return true;
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  "use an IPv4 address, a bracketed IPv6 address or a DNS name",
                  "invalid upstream host '%s'", conf_show(hp->host, shown));
    return false;
}

bool conf_value_upstream(struct conf_parser *p, const struct conf_word *w, struct conf_addr *out)
{
    char host[CONF_HOST_BYTES];
    struct conf_hostport hp;

    if (!conf_split_hostport(p, w, "upstream", "127.0.0.1:6379", &hp) ||
        !conf_upstream_host(p, w, &hp, host)) {
        return false;
    }
    return conf_addr_store(p, w, host, hp.port, out);
}

void conf_addr_format(const struct conf_addr *a, char *buf, size_t size)
{
    const char *host = a->host != NULL ? a->host : "";

    if (size == 0) {
        return;
    }
    if (strchr(host, ':') != NULL) {
        snprintf(buf, size, "[%s]:%u", host, (unsigned)a->port);
    } else {
        snprintf(buf, size, "%s:%u", host, (unsigned)a->port);
    }
}

/* A literal address in binary; IPv4-mapped IPv6 addresses are AF_INET. */
struct conf_ip {
    int family;          /* AF_INET or AF_INET6 */
    unsigned char b[16]; /* the first 4 bytes for AF_INET */
};

/* Parse the canonical literal `host`; false for a DNS name. */
static bool conf_ip_parse(const char *host, struct conf_ip *ip)
{
    struct in6_addr v6;

    memset(ip, 0, sizeof(*ip));
    if (host == NULL) {
        return false;
    }
    if (inet_pton(AF_INET, host, ip->b) == 1) {
        ip->family = AF_INET;
        return true;
    }
    if (inet_pton(AF_INET6, host, &v6) != 1) {
        return false;
    }
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
        ip->family = AF_INET;
        memcpy(ip->b, &v6.s6_addr[12], 4);
        return true;
    }
    ip->family = AF_INET6;
    memcpy(ip->b, v6.s6_addr, 16);
    return true;
}

static size_t conf_ip_len(const struct conf_ip *ip)
{
    return ip->family == AF_INET ? 4 : 16;
}

/* 0.0.0.0 or [::]: a wildcard bind, or a connect() to this host. */
static bool conf_ip_unspecified(const struct conf_ip *ip)
{
    static const unsigned char zero[16];

    return memcmp(ip->b, zero, conf_ip_len(ip)) == 0;
}

static bool conf_ip_loopback(const struct conf_ip *ip)
{
    static const unsigned char v6_loopback[16] = {[15] = 1};

    return ip->family == AF_INET ? ip->b[0] == 127 : memcmp(ip->b, v6_loopback, 16) == 0;
}

static bool conf_ip_equal(const struct conf_ip *a, const struct conf_ip *b)
{
    return a->family == b->family && memcmp(a->b, b->b, conf_ip_len(a)) == 0;
}

/* Whether a socket bound to `w` takes every address of `family` (see the top). */
static bool conf_ip_wildcard_takes(const struct conf_ip *w, int family)
{
    return conf_ip_unspecified(w) && (w->family == AF_INET6 || family == AF_INET);
}

bool conf_binds_clash(const struct conf_addr *a, const struct conf_addr *b)
{
    struct conf_ip x, y;

    if (a->port != b->port || !conf_ip_parse(a->host, &x) || !conf_ip_parse(b->host, &y)) {
        return false;
    }
    return conf_ip_equal(&x, &y) || conf_ip_wildcard_takes(&x, y.family) ||
           conf_ip_wildcard_takes(&y, x.family);
}

bool conf_bind_takes(const struct conf_addr *bind, const char *host, uint16_t port, bool here)
{
    struct conf_ip b, t;

    if (bind->port != port || !conf_ip_parse(bind->host, &b) || !conf_ip_parse(host, &t)) {
        return false;
    }
    /* A connect() to 0.0.0.0 or :: goes to the loopback address. */
    if (conf_ip_unspecified(&t) && t.family == AF_INET) {
        t.b[0] = 127;
        t.b[3] = 1;
    } else if (conf_ip_unspecified(&t)) {
        t.b[15] = 1;
    }
    if (conf_ip_equal(&b, &t)) {
        return true;
    }
    return conf_ip_wildcard_takes(&b, t.family) && (here || conf_ip_loopback(&t));
}
