/*
 * session_connect.c - a session's way to its upstream, and its connection faults
 * (session_internal.h).
 *
 * The upstream's name is resolved (evdns), connected to with a timeout, and, when the
 * listener says so, wrapped in TLS; then the session starts relaying.  Before any of it the
 * listener's stream and connect rules are decided once for the connection: latency,
 * bandwidth, slices, limits, blackholes and resets for the shaper, a delayed or refused
 * connect, a reset after a while.
 */
#include "proxy/net/session_internal.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

/* ---- connecting ------------------------------------------------------------------------ */

void sess_set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    /* Broker protocols are request/response: never let Nagle hold a frame. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void sess_setup_bev(struct session *s, enum session_side side)
{
    struct bufferevent *bev = s->end[side].bev;
    bufferevent_setcb(bev, sess_on_read, NULL, sess_on_event, s);
    s->end[side].write_cb = false;
    bufferevent_setwatermark(bev, EV_READ, 0, SESSION_INPUT_HIGH);
}

void sess_reset(struct session *s, const char *rule)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    for (int i = 0; i < 2; i++) {
        if (s->end[i].bev == NULL)
            continue;
        evutil_socket_t fd = bufferevent_getfd(s->end[i].bev);
        if (fd >= 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    session_set_error(s, "reset by rule '%s'", rule != NULL ? rule : "?");
    session_close(s, SESSION_CLOSE_FAULT);
}

static void on_reset_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sess_reset(arg, ((struct session *)arg)->faults.reset_rule);
}

/* Schedule the reset; returns -1 when the session is already gone. */
static int arm_reset(struct session *s)
{
    if (s->faults.reset_after_ms == 0) {
        sess_reset(s, s->faults.reset_rule);
        return -1;
    }
    struct timeval tv = {.tv_sec = s->faults.reset_after_ms / 1000,
                         .tv_usec = (s->faults.reset_after_ms % 1000) * 1000};
    s->fault_timer = evtimer_new(s->loop->base, on_reset_timer, s);
    if (s->fault_timer == NULL || evtimer_add(s->fault_timer, &tv) != 0) {
        session_set_error(s, "cannot arm reset timer");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return -1;
    }
    return 0;
}

/* A move session_set_state() refused: the session cannot go on. */
static void refused_move(struct session *s)
{
    session_set_error(s, "illegal session state move");
    session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
}

void sess_start_relaying(struct session *s)
{
    if (!session_set_state(s, SESSION_RELAYING)) {
        refused_move(s);
        return;
    }
    if (s->connect_timer != NULL) {
        event_free(s->connect_timer);
        s->connect_timer = NULL;
    }
    struct session_end *c = &s->end[SIDE_CLIENT], *u = &s->end[SIDE_UPSTREAM];
    bufferevent_enable(u->bev, EV_READ | EV_WRITE);
    sess_direct_start(s, SIDE_CLIENT);
    sess_direct_start(s, SIDE_UPSTREAM);
    if (s->faults.close_after) {
        session_set_error(s, "closed by rule '%s' after connecting upstream", s->faults.close_rule);
        session_close(s, SESSION_CLOSE_FAULT);
        return;
    }
    if (s->faults.reset && arm_reset(s) != 0)
        return;
    /* Bytes (and an EOF) the client sent while we were connecting. */
    sess_relay(s, SIDE_CLIENT);
    if (s->state != SESSION_RELAYING)
        return;
    if (c->eof) {
        if (s->shaper[SIDE_CLIENT] != NULL)
            shaper_eof(s->shaper[SIDE_CLIENT]);
        else
            sess_propagate_eof(s, SIDE_CLIENT);
    }
}

/* ---- an upstream that is twice itself ------------------------------------------------- */

/* The address of `sa` as AF_INET (IPv4-mapped IPv6 included) or AF_INET6 bytes; its length. */
static size_t sa_bytes(const struct sockaddr *sa, int *family, const void **bytes)
{
    if (sa->sa_family == AF_INET) {
        *family = AF_INET;
        *bytes = &((const struct sockaddr_in *)sa)->sin_addr;
        return 4;
    }
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a6)) {
        *family = AF_INET;
        *bytes = &a6->s6_addr[12];
        return 4;
    }
    *family = AF_INET6;
    *bytes = a6;
    return 16;
}

/* Whether `sa` is an address of one of this host's interfaces (what a wildcard bind takes). */
static bool addr_is_here(const struct sockaddr *sa)
{
    int family, ifamily;
    const void *want, *have;
    size_t len = sa_bytes(sa, &family, &want);
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool here = false;
    for (const struct ifaddrs *i = ifs; i != NULL && !here; i = i->ifa_next) {
        if (i->ifa_addr == NULL ||
            (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        here = sa_bytes(i->ifa_addr, &ifamily, &have) == len && ifamily == family &&
               memcmp(want, have, len) == 0;
    }
    freeifaddrs(ifs);
    return here;
}

/* Whether a connection to `sa` would reach one of twice's own sockets (a listener's bind or
 * the admin API, as the session's configuration has them); if so, says which in `what`.
 * `twice check` refuses a literal upstream that loopback makes twice; a name is known only
 * once resolved, and a wildcard bind also takes the host's other addresses: both are caught
 * here, before connecting, so that no chain of sessions starts.  getifaddrs() runs only when
 * a wildcard bind has the upstream's port and the address is not loopback. */
static bool reaches_twice(const struct session *s, const struct sockaddr *sa, char *what,
                          size_t len)
{
    const struct conf *c = s->cfg->root->conf;
    char host[INET6_ADDRSTRLEN];
    int family;
    const void *bytes;
    sa_bytes(sa, &family, &bytes);
    uint16_t port = ntohs(sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
                                                   : ((const struct sockaddr_in6 *)sa)->sin6_port);
    if (inet_ntop(family, bytes, host, sizeof(host)) == NULL)
        return false;
    const struct conf_listener *hit = NULL;
    const struct conf_addr *bind = NULL;
    for (const struct conf_listener *l = c->listeners; l != NULL && hit == NULL; l = l->next)
        if (conf_bind_takes(&l->bind, host, port, true))
            hit = l;
    if (hit != NULL)
        bind = &hit->bind;
    if (bind == NULL && c->has_admin && conf_bind_takes(&c->admin, host, port, true))
        bind = &c->admin;
    if (bind == NULL || (!conf_bind_takes(bind, host, port, false) && !addr_is_here(sa)))
        return false;
    char at[128];
    conf_addr_format(bind, at, sizeof(at));
    if (hit != NULL)
        snprintf(what, len, "%s:%u is twice's own listener '%s' (bind %s at %s:%u:%u)", host, port,
                 hit->name, at, c->path, bind->loc.line, bind->loc.col);
    else
        snprintf(what, len, "%s:%u is twice's own admin API (admin %s at %s:%u:%u)", host, port, at,
                 c->path, bind->loc.line, bind->loc.col);
    return true;
}

static void connect_upstream(struct session *s, const struct sockaddr *sa, socklen_t salen)
{
    struct event_base *base = s->loop->base;
    const struct lconf *cfg = s->cfg;
    struct bufferevent *bev;
    int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;
    char loop[sizeof(s->error)];

    if (reaches_twice(s, sa, loop, sizeof(loop))) {
        session_set_error(s, "%s", loop);
        sess_fail_upstream(s, SESSION_CLOSE_UPSTREAM_CONNECT_FAILED, "upstream is twice itself");
        return;
    }
    if (!session_set_state(s, SESSION_CONNECTING)) {
        refused_move(s);
        return;
    }
    if (cfg->client_ctx != NULL) {
        SSL *ssl =
            tls_client_ssl_new(cfg->client_ctx, &cfg->l->upstream_tls, cfg->l->upstream.host);
        if (ssl == NULL) {
            session_set_error(s, "cannot create TLS session");
            sess_fail_upstream(s, SESSION_CLOSE_UPSTREAM_TLS_FAILED,
                               "upstream tls handshake failed");
            return;
        }
        bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, opts);
        if (bev != NULL)
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        else
            SSL_free(ssl);
        s->end[SIDE_UPSTREAM].tls = true;
    } else {
        bev = bufferevent_socket_new(base, -1, opts);
    }
    if (bev == NULL) {
        session_set_error(s, "cannot create upstream connection");
        sess_fail_upstream(s, SESSION_CLOSE_INTERNAL_ERROR, "upstream connect failed");
        return;
    }
    s->end[SIDE_UPSTREAM].bev = bev;
    sess_setup_bev(s, SIDE_UPSTREAM);
    if (bufferevent_socket_connect(bev, sa, (int)salen) != 0) {
        session_set_error(s, "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        sess_fail_upstream(s, SESSION_CLOSE_UPSTREAM_CONNECT_FAILED, "upstream connect failed");
        return;
    }
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd >= 0)
        sess_set_nodelay(fd);
}

static void on_resolved(int result, struct evutil_addrinfo *res, void *arg)
{
    struct session *s = arg;
    if (result == EVUTIL_EAI_CANCEL) {
        /* session_close cancelled the request; the session is closed. */
        if (res != NULL)
            evutil_freeaddrinfo(res);
        return;
    }
    s->dns_req = NULL;
    if (s->state != SESSION_RESOLVING) {
        if (res != NULL)
            evutil_freeaddrinfo(res);
        return;
    }
    if (result != 0 || res == NULL) {
        session_set_error(s, "cannot resolve %s: %s", s->cfg->l->upstream.host,
                          evutil_gai_strerror(result));
        sess_fail_upstream(s, SESSION_CLOSE_RESOLVE_FAILED, "upstream connect failed");
        if (res != NULL)
            evutil_freeaddrinfo(res);
        return;
    }
    struct sockaddr_storage ss;
    socklen_t len = (socklen_t)res->ai_addrlen;
    memcpy(&ss, res->ai_addr, len);
    evutil_freeaddrinfo(res);
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons(s->cfg->l->upstream.port);
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(s->cfg->l->upstream.port);
    connect_upstream(s, (struct sockaddr *)&ss, len);
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct session *s = arg;
    session_set_error(s, "connect timed out after %u ms", s->cfg->l->connect_timeout_ms);
    sess_fail_upstream(s,
                       s->state == SESSION_RESOLVING ? SESSION_CLOSE_RESOLVE_FAILED
                                                     : SESSION_CLOSE_UPSTREAM_CONNECT_FAILED,
                       "upstream connect failed");
}

void sess_start_upstream(struct session *s)
{
    const struct lconf *cfg = s->cfg;
    struct timeval tv = {.tv_sec = cfg->l->connect_timeout_ms / 1000,
                         .tv_usec = (cfg->l->connect_timeout_ms % 1000) * 1000};
    s->connect_timer = evtimer_new(s->loop->base, on_connect_timeout, s);
    if (s->connect_timer == NULL || evtimer_add(s->connect_timer, &tv) != 0) {
        session_set_error(s, "cannot arm connect timer");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return;
    }
    if (cfg->upstream_is_literal) {
        connect_upstream(s, (const struct sockaddr *)&cfg->upstream_sa, cfg->upstream_salen);
        return;
    }
    struct evutil_addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    /* Mark the request as pending before the call: for names in
     * /etc/hosts the callback runs before evdns_getaddrinfo returns. */
    s->dns_req = (struct evdns_getaddrinfo_request *)s;
    struct evdns_getaddrinfo_request *req =
        evdns_getaddrinfo(s->loop->dns, cfg->l->upstream.host, NULL, &hints, on_resolved, s);
    if (s->dns_req != NULL)
        s->dns_req = req;
}

void sess_format_addr(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        evutil_inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        evutil_inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    } else {
        snprintf(buf, len, "unknown");
    }
}

static void on_delay_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct session *s = arg;
    event_free(s->fault_timer);
    s->fault_timer = NULL;
    sess_start_upstream(s);
}

/* `when connect ... do delay D`: hold the upstream connection for D. */
void sess_delay_upstream(struct session *s)
{
    uint32_t ms = s->faults.delay_connect_ms;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    s->fault_timer = evtimer_new(s->loop->base, on_delay_over, s);
    if (s->fault_timer == NULL || evtimer_add(s->fault_timer, &tv) != 0) {
        session_set_error(s, "cannot arm delay timer");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
    }
}

/* ---- connection faults ----------------------------------------------------------------- */

/* Client address as an IPv6 (IPv4-mapped) address for `client=` matchers. */
static void client_v6(const struct sockaddr *sa, struct engine_event *ev)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memset(ev->client, 0, 10);
        ev->client[10] = ev->client[11] = 0xff;
        memcpy(ev->client + 12, &in->sin_addr, 4);
        ev->has_client = true;
    } else if (sa->sa_family == AF_INET6) {
        memcpy(ev->client, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        ev->has_client = true;
    }
}

/* Fold one fired rule into the session's connection faults (rules/stream_plan.h), and note
 * it. */
static void add_fault(struct session *s, const struct rule *r, struct stream_fx fx[2])
{
    _Static_assert((int)SIDE_CLIENT == (int)STREAM_FROM_CLIENT &&
                       (int)SIDE_UPSTREAM == (int)STREAM_FROM_UPSTREAM,
                   "a stream plan is indexed by the side its bytes come from");
    stream_plan_add_rule(r, fx, &s->faults);
    fault_note(s, r, NULL);
}

/* Decide the stream and connect rules of this new connection.  Returns -1
 * when the session had to be closed. */
int sess_apply_connection_faults(struct session *s, const struct sockaddr *sa)
{
    struct ruleset *rs = s->loop->rules;
    if ((rs == NULL || ruleset_count(rs) == 0) && !s->listener->toxi)
        return 0;
    char identity[32];
    snprintf(identity, sizeof(identity), "session:%llu", (unsigned long long)s->id);
    struct engine_event ev = {.identity = identity};
    client_v6(sa, &ev);
    struct stream_fx fx[2];
    memset(fx, 0, sizeof(fx));
    size_t hits[SESSION_MAX_RULE_HITS];
    uint64_t now = (uint64_t)s->started.tv_sec * 1000 + (uint64_t)s->started.tv_usec / 1000;
    for (int e = 0; rs != NULL && e < 2; e++) {
        ev.event = e == 0 ? RULE_EV_STREAM : RULE_EV_CONNECT;
        session_count_events(s, ev.event, 1);
        size_t n = ruleset_decide(rs, s->cfg->l->name, &ev, now, hits, SESSION_MAX_RULE_HITS);
        for (size_t i = 0; i < n; i++)
            add_fault(s, ruleset_rule(rs, hits[i]), fx);
    }
    if (rs != NULL) {
        ruleset_get(rs);
        s->rules = rs; /* shapers and logs name its rules */
    }
    if (s->listener->toxi)
        toxi_session_fx(s, fx);
    for (int side = 0; side < 2; side++) {
        if (!stream_fx_active(&fx[side]))
            continue;
        s->shaper[side] = shaper_new(s, side, &fx[side], s->id * 2 + (uint64_t)side + 1);
        if (s->shaper[side] == NULL) {
            session_set_error(s, "out of memory");
            session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
            return -1;
        }
    }
    return 0;
}

void session_toxics_changed(struct session *s)
{
    if (s->state == SESSION_DRAINING || s->state == SESSION_CLOSED || s->rule_fx == NULL)
        return;
    struct toxi_toxics *old = s->toxics; /* shapers name its toxics until they change */
    s->toxics = NULL;
    struct stream_fx fx[2];
    toxi_session_fx(s, fx);
    for (int side = 0; side < 2; side++) {
        if (s->shaper[side] != NULL) {
            shaper_set_fx(s->shaper[side], &fx[side]); /* may close the session */
        } else if (stream_fx_active(&fx[side]) && !s->end[side].eof) {
            s->shaper[side] = shaper_new(s, side, &fx[side], s->id * 2 + (uint64_t)side + 1);
            if (s->shaper[side] == NULL) {
                session_set_error(s, "out of memory");
                session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
            }
        }
        if (s->state == SESSION_DRAINING || s->state == SESSION_CLOSED)
            break;
    }
    if (old != NULL)
        toxi_toxics_put(old);
}
