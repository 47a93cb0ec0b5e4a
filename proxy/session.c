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
#include "proxy/session.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "proxy/blockcache.h"
#include "proxy/codec.h"
#include "proxy/fault.h"
#include "proxy/journal.h"
#include "proxy/log.h"
#include "proxy/shaper.h"
#include "proxy/tls.h"
#include "rules/engine.h"

static void on_read(struct bufferevent *bev, void *arg);
static void on_write(struct bufferevent *bev, void *arg);
static void on_event(struct bufferevent *bev, short what, void *arg);
static void want_drain(struct session *s, enum session_side side, size_t low);
static void direct_start(struct session *s, enum session_side side);
static void direct_stop(struct session_end *e);
static void rd_free(struct session_end *e);
static void rd_update(struct session_end *e);
static void flush_queue(struct session_end *e);
static void set_reading(struct session *s, enum session_side side, bool on);

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

/* The one place where a session changes state. */
static void session_set_state(struct session *s, enum session_state next)
{
    if (log_enabled(LOG_DEBUG)) {
        struct log_line line;
        session_log_begin(&line, s, LOG_DEBUG, "session state");
        log_str(&line, "from", state_names[s->state]);
        log_str(&line, "to", state_names[next]);
        log_end(&line);
    }
    s->state = next;
}

static void log_close(const struct session *s)
{
    struct timeval now;
    monotonic_now(&now);
    struct log_line line;
    session_log_begin(&line, s, LOG_INFO, "session closed");
    log_str(&line, "client", s->client_addr);
    log_u64(&line, "bytes_up", s->bytes_up);
    log_u64(&line, "bytes_down", s->bytes_down);
    log_u64(&line, "duration_ms", ms_between(&s->started, &now));
    log_str(&line, "reason", session_close_reason_name(s->reason));
    if (s->error[0] != '\0')
        log_str(&line, "error", s->error);
    log_end(&line);
}

static void flush_unqueue(struct session_end *e)
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

static void rd_free(struct session_end *e)
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
        flush_queue(e);
}

/* Bytes queued toward `e` and not written yet (its bufferevent must exist). */
static size_t out_pending(const struct session_end *e)
{
    size_t n = evbuffer_get_length(bufferevent_get_output(e->bev));
    return e->rd != NULL ? n + evbuffer_get_length(e->dout) : n;
}

static void free_end(struct session_end *e)
{
    flush_unqueue(e);
    rd_free(e);
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
    session_set_state(s, SESSION_CLOSED);
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
    if (s->rules != NULL)
        ruleset_put(s->rules);
    listener_put(s->listener);
    lconf_put(s->cfg);
    free(s);
    proxy_session_gone(lp);
}

/* Log a failure to reach the upstream and close the session. */
static void fail_upstream(struct session *s, enum session_close_reason reason, const char *msg)
{
    struct log_line line;
    session_log_begin(&line, s, LOG_WARN, msg);
    log_str(&line, "upstream", s->cfg->upstream_str);
    log_str(&line, "error", s->error);
    log_end(&line);
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
static void propagate_eof(struct session *s, enum session_side from)
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
        set_reading(s, from, false);
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
static void relay(struct session *s, enum session_side from)
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
        rd_update(&s->end[from]); /* under the read limit again */
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct session *s = arg;
    s->last_active.tv_sec = 0; /* marks activity; see session_tick */
    if (s->state != SESSION_RELAYING)
        return; /* kept in the input buffer until the upstream is ready */
    relay(s, side_of(s, bev));
}

/* Bounds of what one direct read asks for. */
#define DIRECT_READ_MIN (16u * 1024u)
#define DIRECT_READ_MAX (256u * 1024u)

/*
 * Read blocks.  A read of small messages (a job, a command, an ack) into a
 * fresh evbuffer chain cost a malloc and a free of 16 KiB each, past glibc's
 * per-thread cache: about a tenth of a parsed listener's instructions on a
 * job load.  While an end's reads stay small, a read into an empty input
 * goes into a 16 KiB block of the thread's block cache (blockcache.h) instead, handed to
 * the input by reference (evbuffer_add_reference); libevent calls
 * read_block_put() when the last chain that uses it is freed (written,
 * dropped, or released by a reference that shared it), and the block goes
 * back to the cache.  No byte is copied.  A block's chain is immutable:
 * nothing is ever appended into its spare room, so reads of large traffic
 * (which fill a read) keep the chains libevent allocates, whose room the
 * next read fills.
 */

/* libevent's cleanup of a block's chain (evbuffer_ref_cleanup_cb). */
static void read_block_put(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    blockcache_free(arg);
}

/* One read of up to `want` (at most DIRECT_READ_MIN) bytes into a block,
 * added to `in`: what read() returns, errno kept. */
static ssize_t read_pooled(evutil_socket_t fd, struct evbuffer *in, size_t want)
{
    uint8_t *b = blockcache_malloc(DIRECT_READ_MIN);
    if (b == NULL) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n = read(fd, b, want);
    int err = errno;
    if (n > 0 && evbuffer_add_reference(in, b, (size_t)n, read_block_put, b) == 0)
        return n;
    /* Not added: the bytes, if any, are copied (out of memory for the
     * chain's header), else the read failed or ended. */
    if (n > 0 && evbuffer_add(in, b, (size_t)n) != 0) {
        n = -1;
        err = ENOMEM;
    }
    blockcache_free(b);
    errno = err;
    return n;
}

static size_t read_limit(const struct session_end *e)
{
    return e->read_limit > SESSION_INPUT_HIGH ? e->read_limit : SESSION_INPUT_HIGH;
}

/* Add or remove a direct end's read event to match rd_want and the input. */
static void rd_update(struct session_end *e)
{
    if (e->rd == NULL)
        return;
    bool arm = e->rd_want && e->bev != NULL && evbuffer_get_length(e->din) < read_limit(e);
    if (arm != e->rd_armed && (arm ? event_add(e->rd, NULL) : event_del(e->rd)) == 0)
        e->rd_armed = arm;
}

/* Reading from side `side` on or off. */
static void set_reading(struct session *s, enum session_side side, bool on)
{
    struct session_end *e = &s->end[side];
    if (e->bev == NULL)
        return;
    if (e->rd != NULL) {
        e->rd_want = on;
        rd_update(e);
    } else if (on) {
        bufferevent_enable(e->bev, EV_READ);
    } else {
        bufferevent_disable(e->bev, EV_READ);
    }
}

/* A direct end is readable: one readv into its input, then relay. */
static void on_direct_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct session_end *e = arg;
    struct session *s = e->owner;
    struct bufferevent *bev = e->bev;
    struct evbuffer *in = e->din;
    size_t len = evbuffer_get_length(in), limit = read_limit(e);
    if (len >= limit) {
        rd_update(e);
        return;
    }
    /* A read asks for what the last ones needed, from 16 KiB (a heap chunk
     * malloc reuses) doubling while reads come back full, up to the limit:
     * asking 256 KiB every time made glibc grow and trim the heap per read. */
    if (e->read_size == 0)
        e->read_size = DIRECT_READ_MIN;
    size_t want = limit - len < e->read_size ? limit - len : e->read_size;
    struct evbuffer_iovec vec[2];
    ssize_t n = -1;
    int err = ENOMEM;
    /* Small reads into an empty input: a read block (see above). */
    int nvec = len == 0 && e->read_size == DIRECT_READ_MIN
                   ? 0
                   : evbuffer_reserve_space(in, (ev_ssize_t)want, vec, 2);
    if (nvec == 0) {
        n = read_pooled(fd, in, want);
        err = errno;
    } else if (nvec > 0) {
        struct iovec iov[2];
        size_t room = 0;
        for (int i = 0; i < nvec; i++) {
            iov[i].iov_base = vec[i].iov_base;
            iov[i].iov_len = room + vec[i].iov_len > want ? want - room : vec[i].iov_len;
            room += iov[i].iov_len;
        }
        n = readv(fd, iov, nvec);
        err = errno;
        size_t left = n > 0 ? (size_t)n : 0;
        for (int i = 0; i < nvec; i++) {
            vec[i].iov_len = iov[i].iov_len < left ? iov[i].iov_len : left;
            left -= vec[i].iov_len;
        }
        evbuffer_commit_space(in, vec, n > 0 ? nvec : 0);
    }
    if (n > 0 && (size_t)n == want && want == e->read_size && e->read_size < DIRECT_READ_MAX)
        e->read_size *= 2;
    else if (n > 0 && (size_t)n < e->read_size / 8 && e->read_size > DIRECT_READ_MIN)
        e->read_size /= 2;
    if (n > 0) {
        on_read(bev, s);
        return;
    }
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    /* EOF or an error: reported as the bufferevent would, reading off. */
    e->rd_want = false;
    rd_update(e);
    errno = n == 0 ? 0 : err;
    on_event(bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), s);
}

/* Write what is queued toward `e` now (see the top of this file). */
static void flush_end(struct session_end *e)
{
    struct session *s = e->owner;
    struct bufferevent *bev = e->bev;
    if (bev == NULL)
        return;
    struct evbuffer *out = bufferevent_get_output(bev);
    if (e->rd == NULL || s->state != SESSION_RELAYING) {
        if (evbuffer_get_length(out) > 0)
            bufferevent_enable(bev, EV_WRITE);
        return;
    }
    bool left; /* bytes wait in the bufferevent's output */
    if (evbuffer_get_length(out) > 0) {
        /* What libevent still has to write goes first, and ours after it.
         * A socket bufferevent freezes the front of its output between its
         * own writes; thaw it for this one as bufferevent_writecb does. */
        evbuffer_add_buffer(out, e->dout);
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, e->fd);
        evbuffer_freeze(out, 1);
        left = evbuffer_get_length(out) > 0;
    } else {
        /* The usual case: the kernel takes all of dout, and nothing is left
         * anywhere (no length asked again). */
        size_t n = evbuffer_get_length(e->dout);
        int w = n > 0 ? evbuffer_write(e->dout, e->fd) : 0;
        left = n > 0 && (w < 0 || (size_t)w != n);
        if (left)
            evbuffer_add_buffer(out, e->dout); /* what the kernel did not take */
    }
    if (left) {
        /* The kernel took less (or failed): libevent writes the rest when
         * the socket is writable and reports an error as usual. */
        bufferevent_enable(bev, EV_WRITE);
        return;
    }
    if (bufferevent_get_enabled(bev) & EV_WRITE)
        bufferevent_disable(bev, EV_WRITE);
    if (e->write_cb)
        on_write(bev, s); /* what the bufferevent would call once drained */
}

/* One pass over the ends listed so far.  An end listed again while the pass
 * runs (a shaper releasing its next slice from on_write, a paused side
 * resumed) waits for the next loop iteration, after epoll: else one session
 * writing slice after slice would keep every other one waiting. */
void session_flush_all(struct loop *lp)
{
    struct session_end *pass = lp->flush_list;
    lp->flush_list = NULL;
    lp->flush_tail = &lp->flush_list;
    if (pass != NULL)
        pass->flush_pprev = &pass;
    lp->flushing = true;
    while (pass != NULL) {
        struct session_end *e = pass;
        flush_unqueue(e);
        flush_end(e);
    }
    lp->flushing = false;
}

/* List a direct end with output for the flusher. */
static void flush_queue(struct session_end *e)
{
    if (e->flush_queued || e->rd == NULL)
        return;
    struct loop *lp = e->owner->loop;
    if (lp->flush_list == NULL) {
        /* event_active runs the flusher after this turn's callbacks; during
         * a flush pass it would run it again before epoll (see above). */
        static const struct timeval next_iteration = {0, 0};
        if (lp->flushing)
            event_add(lp->flusher, &next_iteration);
        else
            event_active(lp->flusher, EV_WRITE, 0);
    }
    /* At the tail: ends are written in the order their output was queued, which is the
     * order their peers' bytes were read.  Redis serves connections in the order their
     * commands arrive: a client's BRPOPLPUSH read before another's LPUSH must reach it first
     * (pushed at the head, the last end listed was written first). */
    e->flush_queued = true;
    e->flush_next = NULL;
    e->flush_pprev = lp->flush_tail;
    *lp->flush_tail = e;
    lp->flush_tail = &e->flush_next;
}

/* Put a plain end that starts relaying into direct mode. */
static void direct_start(struct session *s, enum session_side side)
{
    struct session_end *e = &s->end[side];
    e->owner = s;
    if (e->tls || e->bev == NULL || e->rd != NULL || s->loop->flusher == NULL)
        return;
    struct evbuffer *out = bufferevent_get_output(e->bev);
    if (e->din == NULL)
        e->din = evbuffer_new();
    if (e->dout == NULL)
        e->dout = evbuffer_new();
    if (e->din == NULL || e->dout == NULL)
        return; /* stays on the bufferevent's path (freed with the session) */
    e->fd = bufferevent_getfd(e->bev);
    e->rd = event_new(s->loop->base, e->fd, EV_READ | EV_PERSIST, on_direct_read, e);
    if (e->rd == NULL)
        return;
    e->rd_armed = false;
    /* What the bufferevent read before (a client's bytes while connecting)
     * comes first. */
    evbuffer_add_buffer(e->din, bufferevent_get_input(e->bev));
    e->rd_want = (bufferevent_get_enabled(e->bev) & EV_READ) != 0;
    bufferevent_disable(e->bev, EV_READ);
    rd_update(e);
    if (evbuffer_get_length(out) > 0)
        flush_queue(e);
    else
        bufferevent_disable(e->bev, EV_WRITE);
}

/* Back to the bufferevent's own writes (draining). */
static void direct_stop(struct session_end *e)
{
    if (e->bev == NULL || e->rd == NULL)
        return;
    flush_unqueue(e);
    bool reading = e->rd_want;
    /* What waits to be written joins the bufferevent's output.  Unread
     * input stays in din unless the end is to go on reading (no caller
     * does: a draining end reads nothing). */
    evbuffer_add_buffer(bufferevent_get_output(e->bev), e->dout);
    rd_free(e);
    if (reading) {
        evbuffer_prepend_buffer(bufferevent_get_input(e->bev), e->din);
        bufferevent_enable(e->bev, EV_READ);
    }
    bufferevent_enable(e->bev, EV_WRITE);
}

/* Ask for on_write when the output toward `side` drains to `low` bytes.  The
 * write callback is installed only while something waits for a drain, so
 * the common path pays for no callback per write. */
static void want_drain(struct session *s, enum session_side side, size_t low)
{
    struct bufferevent *bev = s->end[side].bev;
    bufferevent_setcb(bev, on_read, on_write, on_event, s);
    s->end[side].write_cb = true;
    bufferevent_setwatermark(bev, EV_WRITE, low, 0);
}

static void on_write(struct bufferevent *bev, void *arg)
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
            set_reading(s, from, true);
        relay(s, from); /* what arrived while paused; may pause again */
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
        bufferevent_setcb(bev, on_read, NULL, on_event, s);
        s->end[to].write_cb = false;
    }
}

/* One side failed: flush what the other side still has to receive, then
 * close.  Nothing already read from a peer is dropped unless the survivor
 * cannot take it within SESSION_DRAIN_MS. */
static void start_draining(struct session *s, enum session_side failed,
                           enum session_close_reason reason)
{
    enum session_side other = (enum session_side) !failed;
    s->reason = reason;
    free_end(&s->end[failed]);
    struct session_end *o = &s->end[other];
    if (o->bev == NULL || out_pending(o) == 0) {
        session_close(s, reason);
        return;
    }
    set_reading(s, other, false);
    direct_stop(o);
    want_drain(s, other, 0);
    monotonic_now(&s->drain_started);
    session_set_state(s, SESSION_DRAINING);
}

static void on_peer_eof(struct session *s, enum session_side side)
{
    struct session_end *e = &s->end[side];
    e->eof = true;
    set_reading(s, side, false);
    if (!s->end[!side].eof)
        s->first_eof = side;
    if (s->state != SESSION_RELAYING)
        return; /* client EOF while connecting: passed on once connected */
    relay(s, side);
    if (s->state != SESSION_RELAYING)
        return;
    if (s->shaper[side] != NULL)
        shaper_eof(s->shaper[side]);
    else
        propagate_eof(s, side);
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

static void start_relaying(struct session *s);

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
        fail_upstream(s, SESSION_CLOSE_UPSTREAM_TLS_FAILED, "upstream tls handshake failed");
        return;
    }
    if (err != 0)
        session_set_error(s, "%s", evutil_socket_error_to_string(err));
    else
        session_set_error(s, "connection closed by upstream");
    fail_upstream(s, SESSION_CLOSE_UPSTREAM_CONNECT_FAILED, "upstream connect failed");
}

static void on_upstream_event(struct session *s, short what)
{
    struct session_end *e = &s->end[SIDE_UPSTREAM];
    if (s->state == SESSION_CONNECTING) {
        if (what & BEV_EVENT_CONNECTED)
            start_relaying(s);
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

static void on_event(struct bufferevent *bev, short what, void *arg)
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

static void set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    /* Broker protocols are request/response: never let Nagle hold a frame. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void setup_bev(struct session *s, enum session_side side)
{
    struct bufferevent *bev = s->end[side].bev;
    bufferevent_setcb(bev, on_read, NULL, on_event, s);
    s->end[side].write_cb = false;
    bufferevent_setwatermark(bev, EV_READ, 0, SESSION_INPUT_HIGH);
}

/* Abort both connections with a TCP reset (SO_LINGER 0), as `reset` says. */
static void reset_now(struct session *s)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    for (int i = 0; i < 2; i++) {
        if (s->end[i].bev == NULL)
            continue;
        evutil_socket_t fd = bufferevent_getfd(s->end[i].bev);
        if (fd >= 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    session_set_error(s, "reset by rule '%s'", s->faults.reset_rule);
    session_close(s, SESSION_CLOSE_FAULT);
}

static void on_reset_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    reset_now(arg);
}

/* Schedule the reset; returns -1 when the session is already gone. */
static int arm_reset(struct session *s)
{
    if (s->faults.reset_after_ms == 0) {
        reset_now(s);
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

static void start_relaying(struct session *s)
{
    if (s->connect_timer != NULL) {
        event_free(s->connect_timer);
        s->connect_timer = NULL;
    }
    session_set_state(s, SESSION_RELAYING);
    struct session_end *c = &s->end[SIDE_CLIENT], *u = &s->end[SIDE_UPSTREAM];
    bufferevent_enable(u->bev, EV_READ | EV_WRITE);
    direct_start(s, SIDE_CLIENT);
    direct_start(s, SIDE_UPSTREAM);
    if (s->faults.close_after) {
        session_set_error(s, "closed by rule '%s' after connecting upstream", s->faults.close_rule);
        session_close(s, SESSION_CLOSE_FAULT);
        return;
    }
    if (s->faults.reset && arm_reset(s) != 0)
        return;
    /* Bytes (and an EOF) the client sent while we were connecting. */
    relay(s, SIDE_CLIENT);
    if (s->state != SESSION_RELAYING)
        return;
    if (c->eof) {
        if (s->shaper[SIDE_CLIENT] != NULL)
            shaper_eof(s->shaper[SIDE_CLIENT]);
        else
            propagate_eof(s, SIDE_CLIENT);
    }
}

static void connect_upstream(struct session *s, const struct sockaddr *sa, socklen_t salen)
{
    struct event_base *base = s->loop->base;
    const struct lconf *cfg = s->cfg;
    struct bufferevent *bev;
    int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;

    session_set_state(s, SESSION_CONNECTING);
    if (cfg->client_ctx != NULL) {
        SSL *ssl =
            tls_client_ssl_new(cfg->client_ctx, &cfg->l->upstream_tls, cfg->l->upstream.host);
        if (ssl == NULL) {
            session_set_error(s, "cannot create TLS session");
            fail_upstream(s, SESSION_CLOSE_UPSTREAM_TLS_FAILED, "upstream tls handshake failed");
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
        fail_upstream(s, SESSION_CLOSE_INTERNAL_ERROR, "upstream connect failed");
        return;
    }
    s->end[SIDE_UPSTREAM].bev = bev;
    setup_bev(s, SIDE_UPSTREAM);
    if (bufferevent_socket_connect(bev, sa, (int)salen) != 0) {
        session_set_error(s, "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        fail_upstream(s, SESSION_CLOSE_UPSTREAM_CONNECT_FAILED, "upstream connect failed");
        return;
    }
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd >= 0)
        set_nodelay(fd);
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
        fail_upstream(s, SESSION_CLOSE_RESOLVE_FAILED, "upstream connect failed");
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
    fail_upstream(s,
                  s->state == SESSION_RESOLVING ? SESSION_CLOSE_RESOLVE_FAILED
                                                : SESSION_CLOSE_UPSTREAM_CONNECT_FAILED,
                  "upstream connect failed");
}

static void start_upstream(struct session *s)
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

static void format_addr(const struct sockaddr *sa, char *buf, size_t len)
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
    start_upstream(s);
}

/* `when connect ... do delay D`: hold the upstream connection for D. */
static void delay_upstream(struct session *s)
{
    uint32_t ms = s->faults.delay_connect_ms;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    s->fault_timer = evtimer_new(s->loop->base, on_delay_over, s);
    if (s->fault_timer == NULL || evtimer_add(s->fault_timer, &tv) != 0) {
        session_set_error(s, "cannot arm delay timer");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
    }
}

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

/* Fold one fired rule into the session's connection faults. */
static void add_fault(struct session *s, const struct rule *r, struct stream_fx fx[2])
{
    const struct rule_action *a = &r->action;
    for (int side = 0; side < 2; side++) {
        unsigned dir = side == SIDE_CLIENT ? RULE_DIR_UPSTREAM : RULE_DIR_DOWNSTREAM;
        if (!rule_action_is_stream(a->kind) || !(r->direction & dir))
            continue;
        struct stream_fx *f = &fx[side];
        switch (a->kind) {
        case RULE_ACT_LATENCY:
            f->latency_ms += a->duration_ms;
            f->jitter_ms += a->jitter_ms;
            break;
        case RULE_ACT_BANDWIDTH:
            if (f->rate_bps == 0 || a->bytes < f->rate_bps)
                f->rate_bps = a->bytes;
            break;
        case RULE_ACT_SLICE:
            f->slice_bytes = a->bytes;
            f->slice_delay_ms = a->slice_delay_ms;
            break;
        case RULE_ACT_BLACKHOLE:
            f->blackhole = true;
            break;
        case RULE_ACT_LIMIT:
            if (!f->has_limit || a->bytes < f->limit_bytes) {
                f->has_limit = true;
                f->limit_bytes = a->bytes;
                f->limit_rule = r->name;
            }
            break;
        case RULE_ACT_SLOW_CLOSE:
            f->has_slow_close = true;
            f->slow_close_ms = a->duration_ms;
            break;
        default:
            break;
        }
    }
    struct session_faults *sf = &s->faults;
    if (a->kind == RULE_ACT_RESET) {
        sf->reset = true;
        sf->reset_after_ms = a->duration_ms;
        sf->reset_rule = r->name;
    } else if (a->kind == RULE_ACT_CLOSE) {
        *(a->close_when == RULE_CLOSE_BEFORE ? &sf->close_before : &sf->close_after) = true;
        sf->close_rule = r->name;
    } else if (a->kind == RULE_ACT_DELAY) {
        sf->delay_connect_ms = a->duration_ms;
    }
    fault_note(s, r, NULL);
}

static bool fx_active(const struct stream_fx *f)
{
    return f->latency_ms || f->jitter_ms || f->rate_bps || f->slice_bytes || f->blackhole ||
           f->has_limit || f->has_slow_close;
}

/* Decide the stream and connect rules of this new connection.  Returns -1
 * when the session had to be closed. */
static int apply_connection_faults(struct session *s, const struct sockaddr *sa)
{
    struct ruleset *rs = s->loop->rules;
    if (rs == NULL || ruleset_count(rs) == 0)
        return 0;
    char identity[32];
    snprintf(identity, sizeof(identity), "session:%llu", (unsigned long long)s->id);
    struct engine_event ev = {.identity = identity};
    client_v6(sa, &ev);
    struct stream_fx fx[2];
    memset(fx, 0, sizeof(fx));
    size_t hits[SESSION_MAX_RULE_HITS];
    uint64_t now = (uint64_t)s->started.tv_sec * 1000 + (uint64_t)s->started.tv_usec / 1000;
    for (int e = 0; e < 2; e++) {
        ev.event = e == 0 ? RULE_EV_STREAM : RULE_EV_CONNECT;
        stat_add(&s->loop->events[ev.event], 1);
        size_t n = ruleset_decide(rs, s->cfg->l->name, &ev, now, hits, SESSION_MAX_RULE_HITS);
        for (size_t i = 0; i < n; i++)
            add_fault(s, ruleset_rule(rs, hits[i]), fx);
    }
    ruleset_get(rs);
    s->rules = rs; /* shapers and logs name its rules */
    for (int side = 0; side < 2; side++) {
        if (!fx_active(&fx[side]))
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
    format_addr(sa, s->client_addr, sizeof(s->client_addr));
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
    const struct conf_listener *lc = s->cfg->l;
    if (lc->max_connections != 0 && n_listener > lc->max_connections) {
        session_set_error(s, "listener has %u connections (max-connections %u)", n_listener - 1,
                          lc->max_connections);
        evutil_closesocket(fd);
        session_close(s, SESSION_CLOSE_MAX_CONNECTIONS);
        return;
    }
    set_nodelay(fd);
    struct bufferevent *bev = client_bev_new(s, fd);
    if (bev == NULL) {
        evutil_closesocket(fd);
        session_set_error(s, "cannot create client connection");
        session_close(s, SESSION_CLOSE_INTERNAL_ERROR);
        return;
    }
    s->end[SIDE_CLIENT].bev = bev;
    setup_bev(s, SIDE_CLIENT);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    if (apply_connection_faults(s, sa) != 0)
        return;
    s->codec = codec_for(s->cfg->l);
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
        delay_upstream(s);
        return;
    }
    start_upstream(s); /* calloc left the state at SESSION_RESOLVING */
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
        propagate_eof(s, (enum session_side)from);
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

void session_hold_reading(struct session *s, enum session_side side, bool hold)
{
    struct session_end *e = &s->end[side];
    if (e->codec_hold == hold || e->bev == NULL)
        return;
    e->codec_hold = hold;
    if (hold)
        set_reading(s, side, false);
    else if (!e->paused && !e->eof)
        set_reading(s, side, true);
}

void session_set_read_limit(struct session *s, enum session_side side, size_t bytes)
{
    struct session_end *e = &s->end[side];
    e->read_limit = bytes;
    if (e->bev != NULL)
        bufferevent_setwatermark(e->bev, EV_READ, 0, read_limit(e));
    rd_update(e);
}
