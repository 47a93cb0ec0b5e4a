/*
 * resp_aux.c - twice's own connection to a session's Redis.
 *
 * Some faults need a command the client did not send: a duplicate re-pushes
 * a job, a delayed ack is applied later.  They cannot go on the client's
 * connection (a blocked BRPOP holds it, and every extra reply would shift
 * the client's pipeline), so twice opens its own connection to the same
 * server, sends the client's AUTH, HELLO and SELECT first (same user, same
 * database, same protocol), then its commands.  Replies are read and
 * counted; an error reply is logged, never shown to anyone else.
 *
 * An aux outlives its session when it still has work (a delayed ack due in
 * 30 s after the worker disconnected): resp_aux_detach() hands it over to
 * itself, and it frees itself once every scheduled command was sent and
 * answered, or when its connection fails (what was lost is logged).
 */
#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/resp/resp.h"
#include "proxy/core/log.h"
#include "proxy/net/session.h"
#include "proxy/net/tls.h"
#include "proxy/resp/resp_aux.h"

struct aux_send {
    struct resp_aux *a;
    struct event *ev;
    struct evbuffer *cmds;
    size_t n;
    struct aux_send *prev, *next;
};

/*
 * Where an aux is: one state, changed only by aux_set_state(), which refuses a move not drawn
 * here.
 *
 *   OPEN ---- resp_aux_detach() ----> DETACHED ---- its work done, or its connection fails --+
 *     |                                                                                       v
 *     +------ its connection fails ----> FAILED ---- resp_aux_detach() ------------------> DONE
 *
 * OPEN: its session sends through it.  DETACHED: the session is gone; it finishes what was
 * scheduled.  FAILED: its connection is gone (what was lost is logged); the session detaches it
 * (and opens another when it needs one).  DONE: freed at once (maybe_done()).
 */
enum aux_state { AUX_OPEN, AUX_DETACHED, AUX_FAILED, AUX_DONE };

struct resp_aux {
    struct resp_aux *prev_all, *next_all; /* every aux of its loop */
    struct loop *loop;
    struct lconf *cfg;            /* reference */
    struct listener_stats *stats; /* its session's listener's counters (live until exit) */
    uint64_t sid;
    struct bufferevent *bev;
    struct resp_scanner sc;
    size_t awaiting; /* replies not read yet */
    size_t prologue; /* of which, replies to the client's setup commands */
    struct aux_send *sends;
    enum aux_state state; /* changed only by aux_set_state() */
};

static const char *const aux_state_names[] = {"open", "detached", "failed", "done"};

/* Moves a to state `to`; a move the diagram above does not draw is refused (logged at error
 * level; an assertion fails in a debug build). */
static void aux_set_state(struct resp_aux *a, enum aux_state to)
{
    static const unsigned moves[] = {
        [AUX_OPEN] = LOG_STATE_BIT(AUX_DETACHED) | LOG_STATE_BIT(AUX_FAILED),
        [AUX_DETACHED] = LOG_STATE_BIT(AUX_DONE),
        [AUX_FAILED] = LOG_STATE_BIT(AUX_DONE),
        [AUX_DONE] = 0,
    };
    if (log_state_move("own redis connection state", a->sid, NULL, moves, aux_state_names, a->state,
                       to))
        a->state = to;
}

/* Commands scheduled and not sent yet. */
static size_t sends_pending(const struct resp_aux *a)
{
    size_t n = 0;
    for (const struct aux_send *x = a->sends; x != NULL; x = x->next)
        n += x->n;
    return n;
}

/* Forgets every scheduled send. */
static void sends_clear(struct resp_aux *a)
{
    while (a->sends != NULL) {
        struct aux_send *x = a->sends;
        a->sends = x->next;
        event_free(x->ev);
        evbuffer_free(x->cmds);
        free(x);
    }
}

static void aux_free(struct resp_aux *a)
{
    if (a->prev_all != NULL)
        a->prev_all->next_all = a->next_all;
    else
        a->loop->aux = a->next_all;
    if (a->next_all != NULL)
        a->next_all->prev_all = a->prev_all;
    sends_clear(a);
    if (a->bev != NULL)
        bufferevent_free(a->bev);
    lconf_put(a->cfg);
    free(a);
}

/* Frees a once it is DONE, or DETACHED with nothing left to send or read. */
static void maybe_done(struct resp_aux *a)
{
    if (a->state == AUX_DETACHED && a->awaiting == 0 && a->sends == NULL)
        aux_set_state(a, AUX_DONE);
    if (a->state == AUX_DONE) {
        struct loop *lp = a->loop;
        aux_free(a);
        loop_aux_gone(lp); /* a stopping loop may have waited for it */
    }
}

static void aux_fail(struct resp_aux *a, const char *why)
{
    size_t lost = (a->awaiting > a->prologue ? a->awaiting - a->prologue : 0) + sends_pending(a);
    struct log_line line;
    log_begin(&line, LOG_WARN, "twice's own redis connection failed");
    log_u64(&line, "sid", a->sid);
    log_str(&line, "listener", a->cfg->l->name);
    log_str(&line, "error", why);
    log_u64(&line, "commands_lost", lost);
    log_end(&line);
    aux_set_state(a, a->state == AUX_DETACHED ? AUX_DONE : AUX_FAILED);
    sends_clear(a);
    if (a->bev != NULL) {
        bufferevent_free(a->bev);
        a->bev = NULL;
    }
    maybe_done(a);
}

static void on_aux_read(struct bufferevent *bev, void *arg)
{
    struct resp_aux *a = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    for (;;) {
        size_t n = evbuffer_get_length(in);
        if (n == 0)
            break;
        struct resp_msg m;
        const uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)n);
        int rc = resp_scan(&a->sc, buf, n, &m);
        if (rc == 0)
            break;
        if (rc < 0) {
            aux_fail(a, resp_strerror(rc));
            return;
        }
        if (m.push) {
            evbuffer_drain(in, m.len);
            continue;
        }
        if (m.type == '-' || m.type == '!') {
            char msg[160];
            int k = resp_view_copy(buf, m.len, &m.value, (uint8_t *)msg, sizeof(msg) - 1);
            msg[k > 0 ? ((size_t)k < sizeof(msg) - 1 ? (size_t)k : sizeof(msg) - 1) : 0] = '\0';
            log_msg(LOG_WARN, "twice's own redis command failed", "sid=%llu listener=%s error=%s",
                    (unsigned long long)a->sid, a->cfg->l->name, msg);
        }
        evbuffer_drain(in, m.len);
        if (a->awaiting > 0)
            a->awaiting--;
        if (a->prologue > 0)
            a->prologue--;
    }
    maybe_done(a);
}

static void on_aux_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct resp_aux *a = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    aux_fail(a, (what & BEV_EVENT_EOF) ? "closed by the server"
                                       : evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
}

struct resp_aux *resp_aux_open(struct session *s, struct evbuffer *prologue, size_t prologue_n)
{
    struct bufferevent *up = s->end[SIDE_UPSTREAM].bev;
    evutil_socket_t fd = up != NULL ? bufferevent_getfd(up) : -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return NULL;
    struct resp_aux *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    a->loop = s->loop;
    a->cfg = s->cfg;
    lconf_get(a->cfg);
    a->sid = s->id;
    a->stats = s->listener != NULL ? s->listener->stats : NULL;
    resp_scanner_init(&a->sc, RESP_SIDE_SERVER);
    int opts = BEV_OPT_CLOSE_ON_FREE;
    if (s->cfg->client_ctx != NULL) {
        SSL *ssl = tls_client_ssl_new(s->cfg->client_ctx, &s->cfg->l->upstream_tls,
                                      s->cfg->l->upstream.host);
        if (ssl != NULL) {
            a->bev = bufferevent_openssl_socket_new(s->loop->base, -1, ssl,
                                                    BUFFEREVENT_SSL_CONNECTING, opts);
            if (a->bev == NULL)
                SSL_free(ssl);
            else
                bufferevent_openssl_set_allow_dirty_shutdown(a->bev, 1);
        }
    } else {
        a->bev = bufferevent_socket_new(s->loop->base, -1, opts);
    }
    if (a->bev == NULL) {
        lconf_put(a->cfg);
        free(a);
        return NULL;
    }
    bufferevent_setcb(a->bev, on_aux_read, NULL, on_aux_event, a);
    bufferevent_enable(a->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(a->bev, (struct sockaddr *)&ss, (int)sl) != 0) {
        bufferevent_free(a->bev);
        lconf_put(a->cfg);
        free(a);
        return NULL;
    }
    a->next_all = a->loop->aux;
    if (a->loop->aux != NULL)
        a->loop->aux->prev_all = a;
    a->loop->aux = a;
    if (prologue != NULL && prologue_n > 0) {
        size_t len = evbuffer_get_length(prologue);
        evbuffer_add(bufferevent_get_output(a->bev), evbuffer_pullup(prologue, (ev_ssize_t)len),
                     len);
        a->awaiting += prologue_n;
        a->prologue = prologue_n;
    }
    return a;
}

bool resp_aux_failed(const struct resp_aux *a)
{
    return a->state == AUX_FAILED;
}

void resp_aux_send(struct resp_aux *a, struct evbuffer *cmds, size_t n)
{
    if (a->state == AUX_FAILED || a->bev == NULL) {
        evbuffer_drain(cmds, evbuffer_get_length(cmds));
        return;
    }
    evbuffer_add_buffer(bufferevent_get_output(a->bev), cmds);
    a->awaiting += n;
}

static void on_send_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct aux_send *x = arg;
    struct resp_aux *a = x->a;
    if (x->prev != NULL)
        x->prev->next = x->next;
    else
        a->sends = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    resp_aux_send(a, x->cmds, x->n);
    event_free(x->ev);
    evbuffer_free(x->cmds);
    free(x);
    maybe_done(a);
}

int resp_aux_send_later(struct resp_aux *a, uint32_t ms, struct evbuffer *cmds, size_t n)
{
    struct aux_send *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return -1;
    x->a = a;
    x->n = n;
    x->cmds = evbuffer_new();
    x->ev = evtimer_new(a->loop->base, on_send_timer, x);
    if (x->cmds == NULL || x->ev == NULL) {
        if (x->cmds != NULL)
            evbuffer_free(x->cmds);
        if (x->ev != NULL)
            event_free(x->ev);
        free(x);
        return -1;
    }
    evbuffer_add_buffer(x->cmds, cmds);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(x->ev, &tv);
    x->next = a->sends;
    if (a->sends != NULL)
        a->sends->prev = x;
    a->sends = x;
    return 0;
}

void resp_aux_detach(struct resp_aux *a)
{
    if (a == NULL)
        return;
    aux_set_state(a, a->state == AUX_FAILED ? AUX_DONE : AUX_DETACHED);
    maybe_done(a);
}

void resp_aux_each_pending(struct loop *lp,
                           void (*fn)(void *arg, struct listener_stats *st, size_t commands),
                           void *arg)
{
    for (const struct resp_aux *a = lp->aux; a != NULL; a = a->next_all) {
        size_t n = (a->awaiting > a->prologue ? a->awaiting - a->prologue : 0) + sends_pending(a);
        if (n > 0)
            fn(arg, a->stats, n);
    }
}

void resp_aux_free_all(struct loop *lp)
{
    while (lp->aux != NULL) {
        struct resp_aux *a = lp->aux;
        size_t later = sends_pending(a);
        if (later > 0)
            log_msg(LOG_WARN, "shutdown drops commands twice had scheduled",
                    "sid=%llu listener=%s commands=%zu", (unsigned long long)a->sid,
                    a->cfg->l->name, later);
        aux_free(a);
    }
}
