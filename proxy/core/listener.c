/*
 * listener.c - bound sockets that accept clients for one listen block.
 *
 * A listener outlives its socket: it is reference counted by the proxy's
 * list and by each session accepted on it, so sessions keep a valid pointer
 * after a reload or shutdown closed the socket.  When accept() fails for
 * lack of file descriptors, the listener pauses for a second instead of
 * spinning on a socket that stays readable (as pgbouncer does); the admin
 * API's socket does the same (listener_accept_failed).
 *
 * Listeners run on the main thread; sessions of other loops hold references
 * and drop them from their threads (atomic count; the last one only frees
 * memory, the socket was closed on the main thread).
 */
#include <errno.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/api/toxi.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/net/session.h"

#define LISTENER_BACKLOG 1024
#define LISTENER_RETRY_MS 1000

static void on_accept(struct evconnlistener *evl, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    (void)evl;
    struct listener *l = arg;
    if (l->px->shutting_down) {
        evutil_closesocket(fd);
        return;
    }
    loop_accept(l->px, l, fd, sa, salen);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct listener *l = arg;
    if (l->evl != NULL && !l->px->shutting_down)
        evconnlistener_enable(l->evl);
}

void listener_accept_failed(struct evconnlistener *evl, struct event *retry, const char *key,
                            const char *value)
{
    int err = EVUTIL_SOCKET_ERROR();
    bool pause = err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
    struct log_line line;
    log_begin(&line, LOG_WARN, "accept failed");
    log_str(&line, key, value);
    log_str(&line, "error", evutil_socket_error_to_string(err));
    if (pause)
        log_u64(&line, "retry_ms", LISTENER_RETRY_MS);
    log_end(&line);
    if (pause) {
        struct timeval tv = {.tv_sec = LISTENER_RETRY_MS / 1000, .tv_usec = 0};
        evconnlistener_disable(evl);
        evtimer_add(retry, &tv);
    }
}

static void on_accept_error(struct evconnlistener *evl, void *arg)
{
    struct listener *l = arg;
    listener_accept_failed(evl, l->retry_timer, "listener", l->cfg->l->name);
}

/* Resolve the literal bind address of `cfg` into `ss`. */
static int bind_address(const struct lconf *cfg, struct sockaddr_storage *ss, int *len)
{
    char spec[300];
    /* Port 0 (a Toxiproxy API proxy's "any port") is one libevent's parser refuses. */
    struct conf_addr a = cfg->l->bind;
    bool any_port = a.port == 0;
    if (any_port)
        a.port = 1;
    conf_addr_format(&a, spec, sizeof(spec));
    *len = (int)sizeof(*ss);
    if (evutil_parse_sockaddr_port(spec, (struct sockaddr *)ss, len) != 0)
        return -1;
    if (any_port && ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = 0;
    else if (any_port)
        ((struct sockaddr_in6 *)ss)->sin6_port = 0;
    return 0;
}

struct listener *listener_open(struct proxy *px, struct lconf *cfg, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    int salen;
    const char *path = cfg->root->conf->path;
    if (bind_address(cfg, &ss, &salen) != 0) {
        snprintf(err, errlen, "%s: listener '%s': invalid bind address %s", path, cfg->l->name,
                 cfg->bind_str);
        return NULL;
    }
    struct listener *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    l->px = px;
    l->refs = 1;
    l->cfg = cfg;
    lconf_get(cfg);
    l->stats = proxy_stats(px, cfg->l->name);
    l->retry_timer = evtimer_new(px->base, on_retry, l);
    unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_REUSEABLE;
    l->evl = evconnlistener_new_bind(px->base, on_accept, l, flags, LISTENER_BACKLOG,
                                     (struct sockaddr *)&ss, salen);
    if (l->evl == NULL || l->retry_timer == NULL) {
        /* Where, as `twice check` says it: the port may be another process's. */
        const struct conf_loc *at = &cfg->l->bind.loc;
        snprintf(err, errlen, "%s:%u:%u: listener '%s' cannot listen on %s: %s", path, at->line,
                 at->col, cfg->l->name, cfg->bind_str,
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        listener_close(l);
        listener_put(l);
        return NULL;
    }
    evconnlistener_set_error_cb(l->evl, on_accept_error);
    return l;
}

void listener_close(struct listener *l)
{
    if (l->evl != NULL) {
        evconnlistener_free(l->evl);
        l->evl = NULL;
    }
    if (l->retry_timer != NULL) {
        event_free(l->retry_timer);
        l->retry_timer = NULL;
    }
}

void listener_put(struct listener *l)
{
    if (atomic_fetch_sub(&l->refs, 1) > 1)
        return;
    listener_close(l);
    lconf_put(l->cfg);
    if (l->toxics != NULL)
        toxi_toxics_put(l->toxics);
    free(l);
}
