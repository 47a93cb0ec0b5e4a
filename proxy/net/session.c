/*
 * session.c - relaying one client connection to its upstream.  See session.h.
 *
 * Bytes move between the two bufferevents by handing over evbuffer chains
 * (evbuffer_add_buffer): no payload is copied.  The callbacks below only
 * decide; every change of state goes through session_set_state(), and a
 * session that closes is freed by its loop's reaper after the current
 * callback has returned, never from inside it.
 *
 * Direct writes.  A bufferevent writes on the loop turn after bytes are
 * queued and turns EPOLLOUT on and off around every write: per relayed frame
 * an epoll_ctl, an epoll_wait, the write and another epoll_ctl.  A plain TCP
 * end that is relaying instead keeps EV_WRITE off; bytes queued on it put it
 * on its loop's flush_list, and the loop's flusher (activated once, run after the
 * other callbacks of the turn) writes each listed end with one writev.  Only
 * when the kernel takes less than all of it is EV_WRITE turned on, and
 * libevent writes the rest when the socket is writable, as before.  This is
 * what HAProxy does (speculative sends, polling only after EAGAIN).  TLS ends
 * keep the bufferevent's own path.
 *
 * Reads: a bufferevent asks FIONREAD before every read, reads at most 4096
 * bytes per readiness event (EVBUFFER_MAX_READ in libevent 2.1) and hands
 * them over one loop turn later (deferred callbacks).  A direct end reads
 * with its own event instead: one readv of up to its read limit, relayed
 * at once.  Per relayed message that leaves a readv and a writev, plus an
 * epoll_wait shared by the turn, as HAProxy.  Backpressure and codec holds
 * turn that event on and off (set_reading) as they did the bufferevent's.
 *
 * Buffers: a direct end reads into din and is written from dout, plain
 * evbuffers of its own.  The bufferevent's carry callbacks (its watermarks,
 * its write trigger) that libevent runs on every add, drain and read: about
 * a tenth of a parsed Redis listener's instructions on a job load.  Whoever
 * adds to dout (session_send, the shaper) lists the end for the flusher
 * itself.  Only when the kernel takes less does the rest move to the
 * bufferevent's output, which libevent writes; later bytes join it there, in
 * order, until it is empty.
 */
#include "proxy/net/pump.h"
#include "proxy/net/session_internal.h"

#include <assert.h>

/* ---- state, close and logs ------------------------------------------------------------- */

static void want_drain(struct session *s, enum session_side side, size_t low);

static const char *const state_names[] = {"resolving", "connecting", "relaying", "draining",
                                          "closed"};

const char *session_close_reason_name(enum session_close_reason r)
{
    switch (r) {
#define SESSION_REASON_CASE(name, code, str)                                                       \
    case SESSION_CLOSE_##name:                                                                     \
        return str;
        SESSION_CLOSE_REASONS(SESSION_REASON_CASE)
#undef SESSION_REASON_CASE
    }
    return "unknown";
}

static void monotonic_now(struct timeval *tv)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
}

static uint64_t ms_between(const struct timeval *a, const struct timeval *b)
{
    int64_t us = (int64_t)(b->tv_sec - a->tv_sec) * 1000000 + (b->tv_usec - a->tv_usec);
    return us > 0 ? (uint64_t)us / 1000 : 0;
}

static void session_log_begin(struct log_line *line, const struct session *s, enum log_level level,
                              const char *msg)
{
    log_begin(line, level, msg);
    log_u64(line, "sid", s->id);
    log_str(line, "listener", s->cfg->l->name);
}

/* The moves the diagram of enum session_state (session.h) draws: a bit per state a state may
 * go to.  CLOSED goes nowhere. */
static const unsigned state_moves[] = {
    [SESSION_RESOLVING] = LOG_STATE_BIT(SESSION_CONNECTING) | LOG_STATE_BIT(SESSION_CLOSED),
    [SESSION_CONNECTING] = LOG_STATE_BIT(SESSION_RELAYING) | LOG_STATE_BIT(SESSION_CLOSED),
    [SESSION_RELAYING] = LOG_STATE_BIT(SESSION_DRAINING) | LOG_STATE_BIT(SESSION_CLOSED),
    [SESSION_DRAINING] = LOG_STATE_BIT(SESSION_CLOSED),
    [SESSION_CLOSED] = 0,
};

/* The one place where a session changes state; false (and no change) for a move the diagram
 * does not draw. */
bool session_set_state(struct session *s, enum session_state next)
{
    if (!log_state_move("session state", s->id, s->cfg->l->name, state_moves, state_names, s->state,
                        next))
        return false;
    s->state = next;
    return true;
}

static void log_close(const struct session *s)
{
    struct timeval now;
    monotonic_now(&now);
    struct log_line line;
    session_log_begin(&line, s, LOG_INFO, "session closed");
    /* A client retrying at once while the upstream is down makes one such
     * session per attempt: its line is limited like the warning before it; so
     * does a flood (or a loop) past max-connections, one refusal per attempt. */
    log_repeat_limit(&line, s->upstream_failed || s->reason == SESSION_CLOSE_MAX_CONNECTIONS);
    log_str(&line, "client", s->client_addr);
    log_u64(&line, "bytes_up", s->bytes_up);
    log_u64(&line, "bytes_down", s->bytes_down);
    log_u64(&line, "duration_ms", ms_between(&s->started, &now));
    log_str(&line, "reason", session_close_reason_name(s->reason));
    if (s->error[0] != '\0')
        log_str(&line, "error", s->error);
    log_end(&line);
}

void sess_flush_unqueue(struct session_end *e)
{
    if (!e->flush_queued)
        return;
    struct loop *lp = e->owner->loop;
    if (lp->flush_tail == &e->flush_next)
        lp->flush_tail = e->flush_pprev;
    *e->flush_pprev = e->flush_next;
    if (e->flush_next != NULL)
        e->flush_next->flush_pprev = e->flush_pprev;
    e->flush_queued = false;
    e->flush_next = NULL;
    e->flush_pprev = NULL;
}

void sess_rd_free(struct session_end *e)
{
    if (e->rd != NULL) {
        event_free(e->rd);
        e->rd = NULL;
    }
    e->rd_want = false;
    e->rd_armed = false;
}

/* What `e` reads into and is written from: its own buffers while direct,
 * else its bufferevent's (which must exist). */
static struct evbuffer *end_input(const struct session_end *e)
{
    return e->rd != NULL ? e->din : bufferevent_get_input(e->bev);
}

static struct evbuffer *end_output(const struct session_end *e)
{
    return e->rd != NULL ? e->dout : bufferevent_get_output(e->bev);
}

/* Bytes were added to end_output(e): a direct end is written at the end of
 * the turn (a bufferevent writes its own). */
static void output_added(struct session_end *e)
{
    if (e->rd != NULL)
        sess_flush_queue(e);
}

/* Bytes queued toward `e` and not written yet (its bufferevent must exist). */
static size_t out_pending(const struct session_end *e)
{
    size_t n = evbuffer_get_length(bufferevent_get_output(e->bev));
    return e->rd != NULL ? n + evbuffer_get_length(e->dout) : n;
}

static void free_end(struct session_end *e)
{
    sess_flush_unqueue(e);
    sess_rd_free(e);
    if (e->bev != NULL) {
        bufferevent_free(e->bev);
        e->bev = NULL;
    }
}

void session_close(struct session *s, enum session_close_reason reason)
{
    if (s->state == SESSION_CLOSED)
        return;
    if (s->reason == SESSION_CLOSE_NONE)
        s->reason = reason;
    if (s->dns_req != NULL) {
        /* The cancel runs the callback with EVUTIL_EAI_CANCEL; it sees
         * dns_req == NULL and does nothing. */
        struct evdns_getaddrinfo_request *req = s->dns_req;
        s->dns_req = NULL;
        evdns_getaddrinfo_cancel(req);
    }
    if (s->connect_timer != NULL) {
        event_free(s->connect_timer);
        s->connect_timer = NULL;
    }
    if (s->fault_timer != NULL) {
        event_free(s->fault_timer);
        s->fault_timer = NULL;
    }
    if (s->handshake_timer != NULL) {
        event_free(s->handshake_timer);
        s->handshake_timer = NULL;
    }
    /* Shapers may be on the stack (a shaper can close its session): they
     * are freed with the session, after the callback returns. */
    for (int i = 0; i < 2; i++)
        if (s->shaper[i] != NULL)
            shaper_stop(s->shaper[i]);
    if (s->codec != NULL)
        s->codec->stop(s->codec_state);
    free_end(&s->end[SIDE_CLIENT]);
    free_end(&s->end[SIDE_UPSTREAM]);
    log_close(s);
    if (s->px->journal != NULL) {
        struct journal_record rec = {
            .kind = JOURNAL_KIND_CLOSE,
            .session = s->id,
            .listener = s->cfg->l->name,
            .client = s->client_addr,
            .close_reason = (uint32_t)s->reason,
            .close_reason_name = session_close_reason_name(s->reason),
            .bytes_up = s->bytes_up,
            .bytes_down = s->bytes_down,
            .detail = s->error[0] != '\0' ? s->error : NULL,
        };
        journal_record(s->px->journal, &rec);
    }
    (void)session_set_state(s, SESSION_CLOSED); /* from any state but CLOSED */
    s->reap_next = s->loop->reap;
    s->loop->reap = s;
    event_active(s->loop->reaper, EV_READ, 0);
}

void session_free(struct session *s)
{
    struct loop *lp = s->loop;
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        lp->sessions = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    atomic_fetch_sub(&s->listener->n_sessions, 1);
    if (s->stats != NULL)
        stat_sub(&s->stats->open, 1);
    if (s->codec != NULL)
        s->codec->free(s->codec_state);
    for (int i = 0; i < 2; i++) {
        /* Freed here, not with the end: a codec may still hold din in the
         * callback that closed the session. */
        if (s->end[i].din != NULL)
            evbuffer_free(s->end[i].din);
        if (s->end[i].dout != NULL)
            evbuffer_free(s->end[i].dout);
    }
    shaper_free(s->shaper[SIDE_CLIENT]);
    shaper_free(s->shaper[SIDE_UPSTREAM]);
    if (s->toxics != NULL)
        toxi_toxics_put(s->toxics);
    free(s->rule_fx);
    if (s->rules != NULL)
        ruleset_put(s->rules);
    listener_put(s->listener);
    lconf_put(s->cfg);
    free(s);
    proxy_session_gone(lp);
}

/* Log a failure to reach the upstream and close the session. */
void sess_fail_upstream(struct session *s, enum session_close_reason reason, const char *msg)
{
    struct log_line line;
    session_log_begin(&line, s, LOG_WARN, msg);
    log_str(&line, "upstream", s->cfg->upstream_str);
    log_str(&line, "error", s->error);
    log_end(&line);
    s->upstream_failed = true;
    s->reason = reason; /* even if the client already sent its EOF */
    session_close(s, reason);
}

static enum session_side side_of(const struct session *s, const struct bufferevent *bev)
{
    return s->end[SIDE_CLIENT].bev == bev ? SIDE_CLIENT : SIDE_UPSTREAM;
}

static void shut_write(struct session *s, enum session_side side)
{
    struct session_end *e = &s->end[side];
    if (e->shut || e->bev == NULL)
        return;
    e->shut = true;
    if (e->tls) {
        SSL *ssl = bufferevent_openssl_get_ssl(e->bev);
        /* close_notify first, so a TLS peer reads a clean end of data. */
        if (ssl != NULL && SSL_shutdown(ssl) < 0)
            ERR_clear_error();
    }
    evutil_socket_t fd = bufferevent_getfd(e->bev);
    if (fd >= 0)
        shutdown(fd, SHUT_WR);
}

/* The side whose close the protocol's handshake completed, or -1. */
static int codec_closed_by(const struct session *s)
{
    return s->codec != NULL && s->codec->closed_by != NULL ? s->codec->closed_by(s->codec_state)
                                                           : -1;
}

/* Closes the session once both directions have ended: by who asked first, in
 * the protocol (an AMQP client's connection.close, after which RabbitMQ
 * closes its socket first) or else in TCP. */
static bool maybe_finish(struct session *s)
{
    struct session_end *c = &s->end[SIDE_CLIENT], *u = &s->end[SIDE_UPSTREAM];
    if (c->eof && u->eof && c->shut && u->shut) {
        int by = codec_closed_by(s);
        enum session_side first = by >= 0 ? (enum session_side)by : s->first_eof;
        session_close(s, first == SIDE_CLIENT ? SESSION_CLOSE_CLIENT_CLOSED
                                              : SESSION_CLOSE_UPSTREAM_CLOSED);
        return true;
    }
    return false;
}

/* After `from` sent EOF: once everything it sent reached the other side,
 * pass the half-close on. */
void sess_propagate_eof(struct session *s, enum session_side from)
{
    enum session_side to = (enum session_side) !from;
    struct session_end *dst = &s->end[to];
    if (dst->bev == NULL)
        return;
    if (out_pending(dst) == 0) {
        shut_write(s, to);
        maybe_finish(s);
    } else {
        want_drain(s, to, 0);
    }
}

static void uncount_bytes(struct session *s, enum session_side from, size_t n)
{
    if (from == SIDE_CLIENT)
        s->bytes_up -= n;
    else
        s->bytes_down -= n;
    if (s->stats != NULL)
        stat_sub(from == SIDE_CLIENT ? &s->stats->bytes_up : &s->stats->bytes_down, n);
}

/* Hand over what `from` sent to the other side; pause `from` when the other
 * side is not keeping up. */
int session_send(struct session *s, enum session_side to, struct evbuffer *buf)
{
    enum session_side from = (enum session_side) !to;
    struct session_end *src = &s->end[from], *dst = &s->end[to];
    if (s->state != SESSION_RELAYING || dst->bev == NULL) {
        evbuffer_drain(buf, evbuffer_get_length(buf));
        return -1;
    }
    struct shaper *sh = s->shaper[from];
    if (sh != NULL) {
        shaper_push(sh, buf); /* may close the session */
        if (s->state != SESSION_RELAYING)
            return -1;
    } else if (evbuffer_add_buffer(end_output(dst), buf) != 0) {
        session_set_error(s, "out of memory");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return -1;
    } else {
        output_added(dst);
    }
    size_t pending = out_pending(dst) + (sh != NULL ? shaper_held(sh) : 0);
    if (pending >= SESSION_OUTPUT_HIGH && !src->paused && src->bev != NULL) {
        src->paused = true;
        sess_set_reading(s, from, false);
        want_drain(s, to, SESSION_OUTPUT_HIGH / 2);
    }
    return 0;
}

int session_send_bytes(struct session *s, enum session_side to, const void *data, size_t len)
{
    struct evbuffer *buf = evbuffer_new();
    if (buf == NULL || evbuffer_add(buf, data, len) != 0) {
        if (buf != NULL)
            evbuffer_free(buf);
        session_set_error(s, "out of memory");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return -1;
    }
    int rc = session_send(s, to, buf);
    evbuffer_free(buf);
    return rc;
}

/* Bytes read from `from` and handed on (to the codec, or to the other side). */
static void count_bytes(struct session *s, enum session_side from, size_t n)
{
    if (from == SIDE_CLIENT)
        s->bytes_up += n;
    else
        s->bytes_down += n;
    if (s->stats != NULL)
        stat_add(from == SIDE_CLIENT ? &s->stats->bytes_up : &s->stats->bytes_down, n);
}

/* Hand over what `from` sent to the other side (through the codec, when the
 * listener's protocol has one); pause `from` when the other side is not
 * keeping up. */
void sess_relay(struct session *s, enum session_side from)
{
    struct evbuffer *in = end_input(&s->end[from]);
    size_t n = evbuffer_get_length(in);
    if (n == 0)
        return;
    if (s->codec != NULL) {
        /* Counted before the codec runs: it may close the session (and log
         * its byte counts) over bytes it refuses. */
        count_bytes(s, from, n);
        s->codec->process(s->codec_state, from, in); /* may close the session */
        if (s->state != SESSION_RELAYING)
            return; /* closing: what is left in `in` was read and will not be */
        /* An incomplete frame waits for more and is counted with it. */
        uncount_bytes(s, from, evbuffer_get_length(in));
    } else {
        session_send(s, (enum session_side) !from, in);
        count_bytes(s, from, n);
    }
    if (s->end[from].rd != NULL)
        sess_rd_update(&s->end[from]); /* under the read limit again */
}

void sess_on_read(struct bufferevent *bev, void *arg)
{
    struct session *s = arg;
    s->last_active.tv_sec = 0; /* marks activity; see session_tick */
    if (s->state != SESSION_RELAYING)
        return; /* kept in the input buffer until the upstream is ready */
    sess_relay(s, side_of(s, bev));
}

/* ---- drains, failures and EOF ---------------------------------------------------------- */

/* Ask for on_write when the output toward `side` drains to `low` bytes.  The
 * write callback is installed only while something waits for a drain, so
 * the common path pays for no callback per write. */
static void want_drain(struct session *s, enum session_side side, size_t low)
{
    struct bufferevent *bev = s->end[side].bev;
    bufferevent_setcb(bev, sess_on_read, sess_on_write, sess_on_event, s);
    s->end[side].write_cb = true;
    bufferevent_setwatermark(bev, EV_WRITE, low, 0);
}

void sess_on_write(struct bufferevent *bev, void *arg)
{
    struct session *s = arg;
    enum session_side to = side_of(s, bev);
    enum session_side from = (enum session_side) !to;
    struct session_end *src = &s->end[from];
    size_t pending = out_pending(&s->end[to]);

    if (s->state == SESSION_RELAYING && s->shaper[from] != NULL) {
        if (pending == 0)
            shaper_output_drained(s->shaper[from]); /* may release more */
        if (s->state != SESSION_RELAYING)
            return;
        pending = out_pending(&s->end[to]) + shaper_held(s->shaper[from]);
    }
    if (s->state == SESSION_DRAINING) {
        if (pending == 0)
            session_close(s, s->reason);
        return;
    }
    if (s->state != SESSION_RELAYING)
        return;
    if (src->paused && pending <= SESSION_OUTPUT_HIGH / 2) {
        src->paused = false;
        if (!src->eof && !src->codec_hold)
            sess_set_reading(s, from, true);
        sess_relay(s, from); /* what arrived while paused; may pause again */
        if (s->state != SESSION_RELAYING || src->paused)
            return;
    }
    bool eof_due = src->eof && (s->shaper[from] == NULL || shaper_eof_passed(s->shaper[from]));
    if (eof_due && !s->end[to].shut) {
        if (pending == 0) {
            shut_write(s, to);
            maybe_finish(s);
        } else {
            want_drain(s, to, 0);
        }
        return;
    }
    /* The write callback stays while a slice released from here waits for
     * its drain (else the next slice would wait forever). */
    if (!src->paused && (s->shaper[from] == NULL ||
                         (shaper_held(s->shaper[from]) == 0 && !shaper_waiting(s->shaper[from])))) {
        bufferevent_setcb(bev, sess_on_read, NULL, sess_on_event, s);
        s->end[to].write_cb = false;
    }
}

/* One side failed: flush what the other side still has to receive, then
 * close.  Nothing already read from a peer is dropped unless the survivor
 * cannot take it within SESSION_DRAIN_MS.  Only a relaying session drains:
 * before it relays nothing was sent to either side (a client that fails
 * while the upstream is resolved or connected closes at once). */
static void start_draining(struct session *s, enum session_side failed,
                           enum session_close_reason reason)
{
    enum session_side other = (enum session_side) !failed;
    s->reason = reason;
    free_end(&s->end[failed]);
    struct session_end *o = &s->end[other];
    if (s->state != SESSION_RELAYING || o->bev == NULL || out_pending(o) == 0 ||
        !session_set_state(s, SESSION_DRAINING)) {
        session_close(s, reason);
        return;
    }
    sess_set_reading(s, other, false);
    sess_direct_stop(o);
    want_drain(s, other, 0);
    monotonic_now(&s->drain_started);
}

static void on_peer_eof(struct session *s, enum session_side side)
{
    struct session_end *e = &s->end[side];
    e->eof = true;
    sess_set_reading(s, side, false);
    if (!s->end[!side].eof)
        s->first_eof = side;
    if (s->state != SESSION_RELAYING)
        return; /* client EOF while connecting: passed on once connected */
    sess_relay(s, side);
    if (s->state != SESSION_RELAYING)
        return;
    if (s->shaper[side] != NULL)
        shaper_eof(s->shaper[side]);
    else
        sess_propagate_eof(s, side);
}

static void describe_socket_error(struct session *s, struct session_end *e)
{
    int err = EVUTIL_SOCKET_ERROR();
    unsigned long ssl_err = e->tls ? bufferevent_get_openssl_error(e->bev) : 0;
    if (ssl_err != 0) {
        char buf[256];
        tls_describe_error(bufferevent_openssl_get_ssl(e->bev), ssl_err, buf, sizeof(buf));
        session_set_error(s, "%s", buf);
    } else if (err != 0) {
        session_set_error(s, "%s", evutil_socket_error_to_string(err));
    }
}

static void on_client_event(struct session *s, short what)
{
    struct session_end *e = &s->end[SIDE_CLIENT];
    if (what & BEV_EVENT_CONNECTED) {
        /* TLS handshake with the client finished */
        if (s->handshake_timer != NULL) {
            event_free(s->handshake_timer);
            s->handshake_timer = NULL;
        }
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        describe_socket_error(s, e);
        enum session_close_reason r = SESSION_CLOSE_CLIENT_ERROR;
        if (e->tls && s->bytes_up == 0 && bufferevent_get_openssl_error(e->bev) != 0)
            r = SESSION_CLOSE_CLIENT_TLS_FAILED;
        start_draining(s, SIDE_CLIENT, r);
        return;
    }
    if (what & BEV_EVENT_EOF)
        on_peer_eof(s, SIDE_CLIENT);
}

static void on_upstream_connect_error(struct session *s, short what)
{
    struct session_end *e = &s->end[SIDE_UPSTREAM];
    SSL *ssl = e->tls ? bufferevent_openssl_get_ssl(e->bev) : NULL;
    unsigned long ssl_err = e->tls ? bufferevent_get_openssl_error(e->bev) : 0;
    int err = EVUTIL_SOCKET_ERROR();
    bool tls_failed = ssl != NULL && (ssl_err != 0 || SSL_get_verify_result(ssl) != X509_V_OK ||
                                      (err == 0 && (what & BEV_EVENT_EOF)));
    if (tls_failed) {
        char buf[256];
        tls_describe_error(ssl, ssl_err, buf, sizeof(buf));
        session_set_error(s, "%s", buf);
        sess_fail_upstream(s, SESSION_CLOSE_UPSTREAM_TLS_FAILED, "upstream tls handshake failed");
        return;
    }
    if (err != 0)
        session_set_error(s, "%s", evutil_socket_error_to_string(err));
    else
        session_set_error(s, "connection closed by upstream");
    sess_fail_upstream(s, SESSION_CLOSE_UPSTREAM_CONNECT_FAILED, "upstream connect failed");
}

static void on_upstream_event(struct session *s, short what)
{
    struct session_end *e = &s->end[SIDE_UPSTREAM];
    if (s->state == SESSION_CONNECTING) {
        if (what & BEV_EVENT_CONNECTED)
            sess_start_relaying(s);
        else
            on_upstream_connect_error(s, what);
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        /* A broker that resets the socket after a completed protocol close
         * (RabbitMQ does, after connection.close-ok) ended normally, closed by
         * whoever asked.  On a listener whose protocol has such a close, so
         * did one that resets it after the client's FIN (RabbitMQ answers a
         * half-close so): the client left first, as a killed worker does.
         * Elsewhere a reset stays the upstream's error, with its text. */
        int by = codec_closed_by(s);
        bool client_left =
            s->end[SIDE_CLIENT].eof && s->codec != NULL && s->codec->closed_by != NULL;
        enum session_close_reason why = SESSION_CLOSE_UPSTREAM_ERROR;
        if (by >= 0)
            why = by == SIDE_CLIENT ? SESSION_CLOSE_CLIENT_CLOSED : SESSION_CLOSE_UPSTREAM_CLOSED;
        else if (client_left)
            why = SESSION_CLOSE_CLIENT_CLOSED;
        if (why == SESSION_CLOSE_UPSTREAM_ERROR)
            describe_socket_error(s, e);
        start_draining(s, SIDE_UPSTREAM, why);
        return;
    }
    if (what & BEV_EVENT_EOF)
        on_peer_eof(s, SIDE_UPSTREAM);
}

void sess_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct session *s = arg;
    if (s->state == SESSION_CLOSED)
        return;
    enum session_side side = side_of(s, bev);
    if (s->state == SESSION_DRAINING) {
        /* The survivor failed too: nothing more can be delivered. */
        if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF))
            session_close(s, s->reason);
        return;
    }
    if (side == SIDE_CLIENT)
        on_client_event(s, what);
    else
        on_upstream_event(s, what);
}

/* ---- accepting ------------------------------------------------------------------------- */

static void on_handshake_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct session *s = arg;
    session_set_error(s, "client TLS handshake not finished within %u ms",
                      s->cfg->l->connect_timeout_ms);
    s->reason = SESSION_CLOSE_CLIENT_TLS_FAILED;
    session_close(s, SESSION_CLOSE_CLIENT_TLS_FAILED);
}

/* A client that never finishes its TLS handshake must not hold a session
 * (and a max-connections slot) forever: it gets connect-timeout. */
static int arm_handshake_timer(struct session *s)
{
    uint32_t ms = s->cfg->l->connect_timeout_ms;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    s->handshake_timer = evtimer_new(s->loop->base, on_handshake_timeout, s);
    return s->handshake_timer != NULL && evtimer_add(s->handshake_timer, &tv) == 0 ? 0 : -1;
}

static struct bufferevent *client_bev_new(struct session *s, evutil_socket_t fd)
{
    struct event_base *base = s->loop->base;
    int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;
    if (s->cfg->server_ctx == NULL)
        return bufferevent_socket_new(base, fd, opts);
    SSL *ssl = SSL_new(s->cfg->server_ctx);
    if (ssl == NULL)
        return NULL;
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, opts);
    if (bev == NULL) {
        SSL_free(ssl);
        return NULL;
    }
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    s->end[SIDE_CLIENT].tls = true;
    if (arm_handshake_timer(s) != 0)
        log_msg(LOG_WARN, "no TLS handshake deadline", "sid=%llu error=\"out of memory\"",
                (unsigned long long)s->id);
    return bev;
}

static struct session *session_new(struct loop *lp, struct listener *l, struct lconf *cfg,
                                   const struct sockaddr *sa, uint64_t sid, unsigned *n_listener)
{
    struct session *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->id = sid;
    s->px = l->px;
    s->loop = lp;
    s->listener = l;
    atomic_fetch_add(&l->refs, 1);
    *n_listener = atomic_fetch_add(&l->n_sessions, 1) + 1;
    s->cfg = cfg;
    lconf_get(s->cfg);
    monotonic_now(&s->started);
    s->last_active = s->started;
    sess_format_addr(sa, s->client_addr, sizeof(s->client_addr));
    s->stats = l->stats != NULL ? &l->stats->per_loop[lp->index] : NULL;
    if (s->stats != NULL) {
        stat_add(&s->stats->connections, 1);
        stat_add(&s->stats->open, 1);
    }
    s->next = lp->sessions;
    if (lp->sessions != NULL)
        lp->sessions->prev = s;
    lp->sessions = s;
    atomic_fetch_add(&lp->n_sessions, 1);
    return s;
}

/* Whether the new session `s`, the n_listener-th open on its listener, is one too many, first
 * for its listener (`max-connections`, by default a share of what the open-file limit allows,
 * so that a loop or a flood on one listener leaves room for the others), then for the process
 * (what the open-file limit allows, less what the listeners and the admin API need).  Says why
 * in s->error. */
static bool over_limits(struct session *s, unsigned n_listener)
{
    const struct lconf *cfg = s->cfg;
    if (n_listener > cfg->max_sessions && cfg->l->max_connections != 0) {
        session_set_error(s, "listener has %u connections (max-connections %u)", n_listener - 1,
                          cfg->max_sessions);
        return true;
    }
    if (n_listener > cfg->max_sessions) {
        session_set_error(s,
                          "listener has %u connections (max-connections %u by default: a share "
                          "of the open-file limit)",
                          n_listener - 1, cfg->max_sessions);
        return true;
    }
    unsigned total = proxy_sessions(s->px); /* this one included */
    if (total > cfg->process_max) {
        session_set_error(s, "twice has %u connections (its open-file limit allows %u)", total - 1,
                          cfg->process_max);
        return true;
    }
    return false;
}

void session_accept(struct loop *lp, struct listener *l, struct lconf *cfg, evutil_socket_t fd,
                    const struct sockaddr *sa, int salen, uint64_t sid)
{
    (void)salen;
    unsigned n_listener;
    struct session *s = session_new(lp, l, cfg, sa, sid, &n_listener);
    if (s == NULL) {
        log_msg(LOG_ERROR, "out of memory", "listener=%s", cfg->l->name);
        evutil_closesocket(fd);
        return;
    }
    if (log_enabled(LOG_DEBUG)) {
        struct log_line line;
        session_log_begin(&line, s, LOG_DEBUG, "session opened");
        log_str(&line, "client", s->client_addr);
        log_end(&line);
    }
    if (l->px->journal != NULL) {
        struct journal_record rec = {.kind = JOURNAL_KIND_CONNECT,
                                     .session = s->id,
                                     .listener = cfg->l->name,
                                     .client = s->client_addr};
        journal_record(l->px->journal, &rec);
    }
    if (over_limits(s, n_listener)) {
        evutil_closesocket(fd);
        session_close(s, SESSION_CLOSE_MAX_CONNECTIONS);
        return;
    }
    sess_set_nodelay(fd);
    struct bufferevent *bev = client_bev_new(s, fd);
    if (bev == NULL) {
        evutil_closesocket(fd);
        session_set_error(s, "cannot create client connection");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return;
    }
    s->end[SIDE_CLIENT].bev = bev;
    sess_setup_bev(s, SIDE_CLIENT);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    if (sess_apply_connection_faults(s, sa) != 0)
        return;
    s->codec = codec_for(s->cfg->l);
    s->port = &session_pump_port;
    s->port_ctx = s;
    if (s->codec != NULL && (s->codec_state = s->codec->open(s)) == NULL) {
        s->codec = NULL;
        session_set_error(s, "out of memory");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return;
    }
    if (s->faults.close_before) {
        session_set_error(s, "refused by rule '%s'", s->faults.close_rule);
        session_close(s, SESSION_CLOSE_FAULT);
        return;
    }
    if (s->faults.delay_connect_ms != 0) {
        sess_delay_upstream(s);
        return;
    }
    sess_start_upstream(s); /* calloc left the state at SESSION_RESOLVING */
}

void session_tick(struct session *s, const struct timeval *now)
{
    if (s->state == SESSION_CLOSED)
        return;
    if (s->state == SESSION_DRAINING) {
        if (ms_between(&s->drain_started, now) >= SESSION_DRAIN_MS) {
            session_set_error(s, "peer did not take pending data within %u ms", SESSION_DRAIN_MS);
            session_close(s, s->reason);
        }
        return;
    }
    /* Every second, busy or idle (one with reads since the last tick
     * returns just below): a busy codec is the one with the most to trim. */
    if (s->state == SESSION_RELAYING && s->codec != NULL && s->codec->tick != NULL)
        s->codec->tick(s->codec_state);
    /* on_read marks activity by zeroing last_active; the clock is read here,
     * once per second, instead of on every read. */
    if (s->last_active.tv_sec == 0) {
        s->last_active = *now;
        return;
    }
    uint32_t idle = s->cfg->l->idle_timeout_ms;
    if (idle != 0 && s->state == SESSION_RELAYING && ms_between(&s->last_active, now) >= idle)
        session_close(s, SESSION_CLOSE_IDLE_TIMEOUT);
}

struct evbuffer *session_peer_output(struct session *s, int from)
{
    const struct session_end *e = &s->end[!from];
    if (s->state != SESSION_RELAYING || e->bev == NULL)
        return NULL;
    return end_output(e);
}

bool session_quiet(const struct session *s)
{
    if (s->state != SESSION_RELAYING || s->codec == NULL || s->codec->busy == NULL ||
        s->codec->busy(s->codec_state))
        return false;
    for (int i = 0; i < 2; i++) {
        const struct session_end *e = &s->end[i];
        if (e->bev == NULL || evbuffer_get_length(end_input(e)) > 0 || out_pending(e) > 0 ||
            (s->shaper[i] != NULL && shaper_held(s->shaper[i]) > 0))
            return false;
    }
    return true;
}

size_t session_peer_pending(const struct session *s, int from)
{
    const struct session_end *e = &s->end[!from];
    return e->bev != NULL ? out_pending(e) : 0;
}

void session_peer_output_added(struct session *s, int from)
{
    output_added(&s->end[!from]);
}

void session_shaper_eof(struct session *s, int from)
{
    if (s->state == SESSION_RELAYING)
        sess_propagate_eof(s, (enum session_side)from);
}

void session_want_output_drained(struct session *s, int from)
{
    if (s->state == SESSION_RELAYING && s->end[!from].bev != NULL)
        want_drain(s, (enum session_side) !from, 0);
}

void session_shaper_limit(struct session *s, int from, const char *rule, uint64_t bytes)
{
    if (rule != NULL)
        session_set_error(s, "rule '%s' cut the %s stream after %llu bytes", rule,
                          from == SIDE_CLIENT ? "upstream" : "downstream",
                          (unsigned long long)bytes);
    else
        session_set_error(s, "out of memory");
    /* Deliver what was let through, then close: as if `from` had failed. */
    start_draining(s, (enum session_side)from,
                   rule != NULL ? SESSION_CLOSE_FAULT : SESSION_CLOSE_INTERNAL_ERROR);
}

void session_shaper_toxic(struct session *s, int from, const char *rule, bool reset)
{
    if (reset) {
        sess_reset(s, rule);
        return;
    }
    session_set_error(s, "toxic '%s' timed the %s stream out", rule != NULL ? rule : "?",
                      from == SIDE_CLIENT ? "upstream" : "downstream");
    session_close(s, SESSION_CLOSE_FAULT);
}

void session_set_error(struct session *s, const char *fmt, ...)
{
    if (s->error[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->error, sizeof(s->error), fmt, ap);
    va_end(ap);
}

void session_abort(struct session *s, enum session_close_reason reason, int flush_to)
{
    if (s->state == SESSION_CLOSED)
        return;
    if (flush_to < 0 || s->state != SESSION_RELAYING) {
        s->reason = reason;
        session_close(s, reason);
        return;
    }
    /* Deliver what was already sent to `flush_to`, as if the other side had
     * failed: that is what a cut after forwarding a frame means. */
    start_draining(s, (enum session_side) !flush_to, reason);
}

/* ---- the port of a codec's pump (pump.h) ---- */

static int port_send(void *ctx, enum session_side to, struct evbuffer *buf)
{
    return session_send(ctx, to, buf);
}

static void port_abort(void *ctx, enum session_close_reason reason, int flush_to)
{
    session_abort(ctx, reason, flush_to);
}

static void port_fail(void *ctx, const char *what)
{
    struct session *s = ctx;
    session_set_error(s, "out of memory %s", what);
    session_abort(s, SESSION_CLOSE_INTERNAL_ERROR, -1);
}

static void port_hold_reading(void *ctx, enum session_side side, bool hold)
{
    session_hold_reading(ctx, side, hold);
}

static void port_set_read_limit(void *ctx, enum session_side side, size_t bytes)
{
    session_set_read_limit(ctx, side, bytes);
}

const struct pump_port session_pump_port = {
    .send = port_send,
    .abort = port_abort,
    .fail = port_fail,
    .hold_reading = port_hold_reading,
    .set_read_limit = port_set_read_limit,
};

void session_hold_reading(struct session *s, enum session_side side, bool hold)
{
    struct session_end *e = &s->end[side];
    if (e->codec_hold == hold || e->bev == NULL)
        return;
    e->codec_hold = hold;
    if (hold)
        sess_set_reading(s, side, false);
    else if (!e->paused && !e->eof)
        sess_set_reading(s, side, true);
}

void session_set_read_limit(struct session *s, enum session_side side, size_t bytes)
{
    struct session_end *e = &s->end[side];
    e->read_limit = bytes;
    if (e->bev != NULL)
        bufferevent_setwatermark(e->bev, EV_READ, 0, sess_read_limit(e));
    sess_rd_update(e);
}
