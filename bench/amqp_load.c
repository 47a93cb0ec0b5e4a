/*
 * amqp_load.c - an AMQP 0-9-1 load generator for twice's benchmarks (bench/run.py).
 *
 * N publishing and M consuming connections to one RabbitMQ, directly or through a proxy; one
 * queue per run, declared and purged first and deleted at the end; messages of S bytes;
 * consumers with prefetch P acking every delivery one by one, as Celery does (or auto-ack).
 * Each body starts with the send time and a run-wide message number: consumers turn them into
 * an end-to-end latency, and tell first deliveries from copies (twice's `duplicate`, a requeue
 * after `redeliver`).  Prints one JSON line on stdout; exits 0 when every message arrived.
 *
 *   amqp_load --addr 127.0.0.1:5672 --publishers 2 --consumers 2 --size 256 --count 100000
 *
 * The client is the least a broker accepts: protocol header, PLAIN as guest/guest on vhost /,
 * tune-ok with heartbeats off (a run is short and every connection busy), one channel per
 * connection.  It is written here instead of taken from a library so that the generator
 * depends on libevent_core only, and costs as little CPU per message as it can: on two cores
 * it competes with the broker and the proxy it measures.
 *
 * Flow control.  A publish has no reply, so publishers left alone would fill the queue and
 * every latency would measure that queue.  Publishing pauses while `inflight` messages are
 * sent and not yet delivered (closed loop: throughput at saturation, latency about
 * inflight / rate), or follows `rate` messages per second (open loop: the latency of a given
 * load).  A publisher also pauses while PUB_OUT_HIGH bytes wait in its output buffer, which
 * is how RabbitMQ's own flow control (it stops reading the socket) reaches us.
 *
 * Single-threaded, one libevent loop; connections are freed only at exit, so no callback can
 * run on a freed connection.
 */
#define _GNU_SOURCE
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen.h"

/* ---- limits and wire constants --------------------------------------------------------------- */

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_HEARTBEAT 8
#define FRAME_END 0xCE
#define FRAME_OVERHEAD 8u /* type, channel, size, end octet */

/* Largest frame accepted before connection.tune: the spec's minimum frame_max. */
#define FRAME_MAX_INITIAL 4096u
/* frame_max when the broker says 0 ("no limit"): RabbitMQ's default. */
#define FRAME_MAX_DEFAULT 131072u
/* Largest frame_max we accept at all; a larger one would let a broker make us buffer it. */
#define FRAME_MAX_LIMIT (1u << 20)

/* Every body starts with the send time and the message number, 8 bytes each, big-endian. */
#define STAMP_LEN 16u

/* A publisher stops writing while this much waits in its output buffer, and resumes once the
 * socket took it down to PUB_OUT_LOW: enough to fill a loopback socket, small enough that a
 * message's send time is not taken long before it leaves. */
#define PUB_OUT_HIGH (256u * 1024u)
#define PUB_OUT_LOW (64u * 1024u)

/* How long the close handshakes and the queue deletion may take at the end. */
#define CLOSE_GRACE_MS 3000

#define CHANNEL 1 /* the one channel each connection opens */

/* ---- options and state ----------------------------------------------------------------------- */

struct options {
    const char *addr;
    struct sockaddr_in sin;
    unsigned publishers, consumers;
    uint64_t size;           /* body bytes, at least STAMP_LEN */
    unsigned prefetch;       /* basic.qos prefetch-count */
    bool auto_ack;           /* basic.consume no-ack */
    struct lg_budget budget; /* count or duration, inflight, rate, timeout */
    const char *queue;
};

enum role { ROLE_CONTROL, ROLE_PUBLISHER, ROLE_CONSUMER };

/* Changed only by conn_set_state(). */
enum conn_state {
    CS_CONNECTING, /* TCP connect in progress */
    CS_HANDSHAKE,  /* protocol header sent; connection and channel being opened */
    CS_SETUP,      /* channel open: declaring the queue (control) or qos + consume */
    CS_READY,      /* publishing, consuming, or (control) waiting for the end */
    CS_CLOSING,    /* connection.close sent, waiting for close-ok */
    CS_CLOSED,     /* done with; freed at exit */
};

struct conn {
    struct bufferevent *bev;
    enum role role;
    enum conn_state state;
    unsigned index;
    uint32_t frame_max;
    /* consumer: the delivery being assembled from its method, header and body frames */
    bool in_delivery;
    bool redelivered;
    uint64_t tag;
    uint64_t body_size, body_got;
    uint8_t stamp[STAMP_LEN];
};

struct run {
    struct options opt;
    struct event_base *base;
    struct conn control;
    struct conn *workers; /* publishers first, then consumers */
    unsigned nworkers, ready, closed;
    struct event *tick, *kick, *deadline;
    bool kick_pending, publishing_over, finishing;
    uint64_t t_start;
    uint32_t run_id; /* in message ids, so that ids never repeat across runs of one twice */
    uint8_t *payload;
    struct lg_result res;
    struct lg_seen seen;
    char error[256];
};

static struct run g;

static void finish(const char *error);
static void finish_step(void);
static void pump_all(void);

/* ---- encoding -------------------------------------------------------------------------------- */

/* A frame under construction.  Big bodies are not copied here but referenced (pub_body). */
struct wbuf {
    uint8_t b[8192];
    size_t n;
    size_t frame; /* offset of the current frame's header */
};

static void w_u8(struct wbuf *w, uint8_t v)
{
    w->b[w->n++] = v;
}

static void w_u16(struct wbuf *w, uint16_t v)
{
    w_u8(w, (uint8_t)(v >> 8));
    w_u8(w, (uint8_t)v);
}

static void w_u32(struct wbuf *w, uint32_t v)
{
    w_u16(w, (uint16_t)(v >> 16));
    w_u16(w, (uint16_t)v);
}

static void w_u64(struct wbuf *w, uint64_t v)
{
    w_u32(w, (uint32_t)(v >> 32));
    w_u32(w, (uint32_t)v);
}

/* Short strings we send are our own constants and names, all under 256 bytes. */
static void w_shortstr(struct wbuf *w, const char *s)
{
    size_t n = strlen(s);
    w_u8(w, (uint8_t)n);
    memcpy(w->b + w->n, s, n);
    w->n += n;
}

static void w_longstr(struct wbuf *w, const void *s, uint32_t n)
{
    w_u32(w, n);
    memcpy(w->b + w->n, s, n);
    w->n += n;
}

/* An empty buffer.  (Not `= {0}`: that would clear 8 KiB per message.) */
static void w_reset(struct wbuf *w)
{
    w->n = 0;
    w->frame = 0;
}

static void frame_begin(struct wbuf *w, uint8_t type, uint16_t channel)
{
    w->frame = w->n;
    w_u8(w, type);
    w_u16(w, channel);
    w_u32(w, 0); /* size, patched by frame_end */
}

/* Patches the size of the frame begun last; payload_extra counts payload bytes added to the
 * output buffer directly (a referenced body slice) rather than to w. */
static void frame_end(struct wbuf *w, size_t payload_extra)
{
    uint32_t size = (uint32_t)(w->n - w->frame - 7 + payload_extra);
    uint8_t *p = w->b + w->frame + 3;
    p[0] = (uint8_t)(size >> 24);
    p[1] = (uint8_t)(size >> 16);
    p[2] = (uint8_t)(size >> 8);
    p[3] = (uint8_t)size;
    if (payload_extra == 0)
        w_u8(w, FRAME_END);
}

static void method_begin(struct wbuf *w, uint16_t channel, uint16_t cls, uint16_t method)
{
    frame_begin(w, FRAME_METHOD, channel);
    w_u16(w, cls);
    w_u16(w, method);
}

static void w_flush(struct wbuf *w, struct evbuffer *out)
{
    evbuffer_add(out, w->b, w->n);
    w_reset(w);
}

/* Sends one complete method frame. */
static void send_frame(struct conn *c, struct wbuf *w)
{
    frame_end(w, 0);
    w_flush(w, bufferevent_get_output(c->bev));
}

/* ---- decoding -------------------------------------------------------------------------------- */

/* A bounds-checked reader over one frame payload; `bad` is sticky. */
struct rd {
    const uint8_t *p;
    size_t n, off;
    bool bad;
};

static uint64_t rd_be(struct rd *r, unsigned bytes)
{
    if (r->bad || r->n - r->off < bytes) {
        r->bad = true;
        return 0;
    }
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v = v << 8 | r->p[r->off++];
    return v;
}

/* Copies a short string into out (cap bytes, NUL-terminated, truncated if needed). */
static void rd_shortstr(struct rd *r, char *out, size_t cap)
{
    size_t n = (size_t)rd_be(r, 1);
    if (r->bad || r->n - r->off < n) {
        r->bad = true;
        out[0] = '\0';
        return;
    }
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(out, r->p + r->off, k);
    out[k] = '\0';
    r->off += n;
}

static uint64_t be64(const uint8_t *p)
{
    struct rd r = {p, 8, 0, false};
    return rd_be(&r, 8);
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ---- connection life ------------------------------------------------------------------------- */

static const char *role_name(const struct conn *c)
{
    return c->role == ROLE_CONTROL     ? "control"
           : c->role == ROLE_PUBLISHER ? "publisher"
                                       : "consumer";
}

static void conn_set_state(struct conn *c, enum conn_state st)
{
    if (c->state == st)
        return;
    c->state = st;
    if (st == CS_READY && c->role != ROLE_CONTROL && ++g.ready == g.nworkers) {
        /* Everyone is connected and consuming: the clock starts with the first publish. */
        pump_all();
    }
    if (st == CS_CLOSED) {
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
        if (c->role != ROLE_CONTROL)
            g.closed++;
        finish_step();
    }
}

/* Fails the run with a message naming the connection. */
static void conn_fail(struct conn *c, const char *what)
{
    if (g.error[0] == '\0')
        snprintf(g.error, sizeof(g.error), "%s %u: %s", role_name(c), c->index, what);
    finish(g.error);
}

/* Starts the close handshake, or drops a connection that has not finished opening. */
static void conn_close(struct conn *c)
{
    if (c->state == CS_SETUP || c->state == CS_READY) {
        struct wbuf w;
        w_reset(&w);
        method_begin(&w, 0, 10, 50); /* connection.close */
        w_u16(&w, 200);
        w_shortstr(&w, "bench over");
        w_u16(&w, 0);
        w_u16(&w, 0);
        send_frame(c, &w);
        conn_set_state(c, CS_CLOSING);
    } else if (c->state != CS_CLOSING) {
        conn_set_state(c, CS_CLOSED);
    }
}

/* ---- publishing ------------------------------------------------------------------------------ */

/* Appends the body of one message as frames of at most frame_max bytes; the stamp goes first,
 * the rest is the shared payload, copied when small and referenced (no copy) when large. */
static void pub_body(struct conn *c, struct wbuf *w, struct evbuffer *out, const uint8_t *stamp)
{
    size_t room = c->frame_max - FRAME_OVERHEAD; /* >= FRAME_MAX_INITIAL - 8 > STAMP_LEN */
    for (uint64_t off = 0; off < g.opt.size; off += room) {
        size_t len = g.opt.size - off < room ? (size_t)(g.opt.size - off) : room;
        frame_begin(w, FRAME_BODY, CHANNEL);
        size_t from = (size_t)off;
        if (off == 0) {
            memcpy(w->b + w->n, stamp, STAMP_LEN);
            w->n += STAMP_LEN;
            from = STAMP_LEN;
        }
        size_t rest = (size_t)off + len - from;
        if (rest <= sizeof(w->b) - w->n - 1) {
            memcpy(w->b + w->n, g.payload + from, rest);
            w->n += rest;
            frame_end(w, 0);
        } else {
            frame_end(w, rest);
            w_flush(w, out);
            evbuffer_add_reference(out, g.payload + from, rest, NULL, NULL);
            w_u8(w, FRAME_END);
        }
        if (w->n > sizeof(w->b) / 2)
            w_flush(w, out);
    }
}

/* basic.publish to the default exchange, routed to the run's queue, with a message-id (twice
 * keys faults on it, as it keys them on Celery's ids). */
static void publish_one(struct conn *c, struct evbuffer *out)
{
    struct wbuf w;
    w_reset(&w);
    uint64_t seq = g.res.sent++;
    uint64_t now = lg_now_ns();
    if (seq == 0)
        g.res.t_first_send = now;
    g.res.t_last_send = now;

    method_begin(&w, CHANNEL, 60, 40);
    w_u16(&w, 0);
    w_shortstr(&w, "");
    w_shortstr(&w, g.opt.queue);
    w_u8(&w, 0); /* not mandatory, not immediate */
    frame_end(&w, 0);

    char id[48];
    snprintf(id, sizeof(id), "%08x-%llu", g.run_id, (unsigned long long)seq);
    frame_begin(&w, FRAME_HEADER, CHANNEL);
    w_u16(&w, 60);
    w_u16(&w, 0);
    w_u64(&w, g.opt.size);
    w_u16(&w, 0x0080); /* property flags: message-id only */
    w_shortstr(&w, id);
    frame_end(&w, 0);

    uint8_t stamp[STAMP_LEN];
    put_be64(stamp, now);
    put_be64(stamp + 8, seq);
    pub_body(c, &w, out, stamp);
    w_flush(&w, out);
}

/* Whether one more message may go out now, all publishers together. */
static bool may_publish(void)
{
    if (g.publishing_over || g.finishing || g.nworkers == 0 || g.ready < g.nworkers)
        return false;
    return lg_budget_allows(&g.opt.budget, &g.res, &g.publishing_over);
}

static bool pub_has_room(struct conn *c)
{
    return c->state == CS_READY &&
           evbuffer_get_length(bufferevent_get_output(c->bev)) < PUB_OUT_HIGH;
}

/* Round-robin over the publishers, one message each, until the budget or every socket is
 * full: the in-flight budget is shared, so no publisher may take it all. */
static void pump_all(void)
{
    bool progress = true;
    while (progress && may_publish()) {
        progress = false;
        for (unsigned i = 0; i < g.opt.publishers && may_publish(); i++) {
            struct conn *c = &g.workers[i];
            if (pub_has_room(c)) {
                publish_one(c, bufferevent_get_output(c->bev));
                progress = true;
            }
        }
    }
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    g.kick_pending = false;
    pump_all();
}

/* After a delivery freed in-flight room: pump once the current read is handled, not per
 * delivery, so that publishes go out in batches. */
static void kick_publishers(void)
{
    if (!g.kick_pending && !g.publishing_over) {
        g.kick_pending = true;
        event_active(g.kick, EV_TIMEOUT, 0);
    }
}

/* ---- consuming ------------------------------------------------------------------------------- */

static void delivery_done(struct conn *c)
{
    uint64_t now = lg_now_ns();
    uint64_t sent_at = be64(c->stamp), seq = be64(c->stamp + 8);
    c->in_delivery = false;
    g.res.received++;
    if (c->redelivered)
        g.res.redelivered++;
    if (sent_at <= now && seq < g.res.sent) {
        lg_hist_add(&g.res.lat, (now - sent_at) / 1000u);
        if (lg_seen_mark(&g.seen, seq)) {
            g.res.unique++;
            g.res.t_last_unique = now;
        }
    }
    if (!g.opt.auto_ack && c->state == CS_READY) { /* nothing may follow connection.close */
        struct wbuf w;
        w_reset(&w);
        method_begin(&w, CHANNEL, 60, 80); /* basic.ack, one tag */
        w_u64(&w, c->tag);
        w_u8(&w, 0);
        send_frame(c, &w);
    }
    if (g.publishing_over && g.res.unique >= g.res.sent)
        finish(NULL);
    else
        kick_publishers();
}

static void on_deliver(struct conn *c, struct rd *r)
{
    char tag[256];
    rd_shortstr(r, tag, sizeof(tag)); /* consumer tag */
    c->tag = rd_be(r, 8);
    c->redelivered = (rd_be(r, 1) & 1) != 0;
    if (r->bad || c->in_delivery) {
        conn_fail(c, "malformed basic.deliver");
        return;
    }
    c->in_delivery = true;
    c->body_size = UINT64_MAX; /* until the content header */
    c->body_got = 0;
    memset(c->stamp, 0, sizeof(c->stamp));
}

static void on_content_header(struct conn *c, const uint8_t *p, size_t n)
{
    if (!c->in_delivery || c->body_size != UINT64_MAX || n < 12) {
        conn_fail(c, "unexpected content header");
        return;
    }
    c->body_size = be64(p + 4);
    if (c->body_size == 0)
        delivery_done(c);
}

/* A body frame of n bytes whose first bytes (up to STAMP_LEN) are in head. */
static void on_body(struct conn *c, const uint8_t *head, size_t headlen, size_t n)
{
    if (!c->in_delivery || c->body_size == UINT64_MAX || c->body_got + n > c->body_size) {
        conn_fail(c, "unexpected body frame");
        return;
    }
    for (size_t i = 0; i < headlen && c->body_got + i < STAMP_LEN; i++)
        c->stamp[c->body_got + i] = head[i];
    c->body_got += n;
    if (c->body_got == c->body_size)
        delivery_done(c);
}

/* ---- the handshake and the role's setup ------------------------------------------------------ */

static void send_start_ok(struct conn *c)
{
    static const char plain[] = "\0guest\0guest";
    struct wbuf w;
    w_reset(&w);
    method_begin(&w, 0, 10, 11);
    w_u32(&w, 0); /* client-properties: an empty table */
    w_shortstr(&w, "PLAIN");
    w_longstr(&w, plain, sizeof(plain) - 1);
    w_shortstr(&w, "en_US");
    send_frame(c, &w);
}

/* connection.tune: take the broker's channel-max and frame-max, turn heartbeats off. */
static void on_tune(struct conn *c, struct rd *r)
{
    uint16_t channel_max = (uint16_t)rd_be(r, 2);
    uint32_t frame_max = (uint32_t)rd_be(r, 4);
    if (r->bad) {
        conn_fail(c, "malformed connection.tune");
        return;
    }
    if (frame_max == 0)
        frame_max = FRAME_MAX_DEFAULT;
    if (frame_max < FRAME_MAX_INITIAL || frame_max > FRAME_MAX_LIMIT) {
        conn_fail(c, "broker's frame_max out of range");
        return;
    }
    c->frame_max = frame_max;
    struct wbuf w;
    w_reset(&w);
    method_begin(&w, 0, 10, 31);
    w_u16(&w, channel_max);
    w_u32(&w, frame_max);
    w_u16(&w, 0); /* heartbeat off */
    send_frame(c, &w);
    method_begin(&w, 0, 10, 40); /* connection.open "/" */
    w_shortstr(&w, "/");
    w_shortstr(&w, "");
    w_u8(&w, 0);
    send_frame(c, &w);
}

/* queue.declare, queue.purge and queue.delete share their first fields. */
static void send_queue_method(struct conn *c, uint16_t method)
{
    struct wbuf w;
    w_reset(&w);
    method_begin(&w, CHANNEL, 50, method);
    w_u16(&w, 0);
    w_shortstr(&w, g.opt.queue);
    w_u8(&w, 0); /* declare: not passive/durable/exclusive/auto-delete; no no-wait anywhere */
    if (method == 10)
        w_u32(&w, 0); /* declare's arguments: an empty table */
    send_frame(c, &w);
}

static void send_qos_consume(struct conn *c)
{
    struct wbuf w;
    w_reset(&w);
    method_begin(&w, CHANNEL, 60, 10); /* basic.qos */
    w_u32(&w, 0);
    w_u16(&w, (uint16_t)g.opt.prefetch);
    w_u8(&w, 0);
    send_frame(c, &w);
    char tag[32];
    snprintf(tag, sizeof(tag), "bench-%u", c->index);
    method_begin(&w, CHANNEL, 60, 20); /* basic.consume */
    w_u16(&w, 0);
    w_shortstr(&w, g.opt.queue);
    w_shortstr(&w, tag);
    w_u8(&w, g.opt.auto_ack ? 0x02 : 0x00); /* bit 1: no-ack */
    w_u32(&w, 0);
    send_frame(c, &w);
}

static void start_workers(void);

/* The channel is open: what each role does before it is ready. */
static void on_channel_open(struct conn *c)
{
    conn_set_state(c, CS_SETUP);
    switch (c->role) {
    case ROLE_CONTROL:
        send_queue_method(c, 10);
        break;
    case ROLE_CONSUMER:
        send_qos_consume(c); /* ready at consume-ok */
        break;
    case ROLE_PUBLISHER:
        conn_set_state(c, CS_READY);
        break;
    }
}

/* connection.close or channel.close from the broker: always fatal for a benchmark. */
static void on_broker_close(struct conn *c, struct rd *r, bool connection)
{
    uint16_t code = (uint16_t)rd_be(r, 2);
    char text[200];
    rd_shortstr(r, text, sizeof(text));
    char what[240];
    snprintf(what, sizeof(what), "broker closed the %s: %u %s",
             connection ? "connection" : "channel", code, text);
    struct wbuf w;
    w_reset(&w);
    method_begin(&w, connection ? 0 : CHANNEL, connection ? 10 : 20, connection ? 51 : 41);
    send_frame(c, &w);
    if (connection)
        conn_set_state(c, CS_CLOSED);
    if (!g.finishing)
        conn_fail(c, what);
}

static void on_method(struct conn *c, struct rd *r)
{
    uint16_t cls = (uint16_t)rd_be(r, 2), method = (uint16_t)rd_be(r, 2);
    switch (cls << 16 | method) {
    case 10 << 16 | 10: /* connection.start */
        send_start_ok(c);
        break;
    case 10 << 16 | 30:
        on_tune(c, r);
        break;
    case 10 << 16 | 41: { /* connection.open-ok: open our channel */
        struct wbuf w;
        w_reset(&w);
        method_begin(&w, CHANNEL, 20, 10);
        w_shortstr(&w, "");
        send_frame(c, &w);
        break;
    }
    case 10 << 16 | 50:
        on_broker_close(c, r, true);
        break;
    case 10 << 16 | 51: /* connection.close-ok */
        conn_set_state(c, CS_CLOSED);
        break;
    case 20 << 16 | 11:
        on_channel_open(c);
        break;
    case 20 << 16 | 40:
        on_broker_close(c, r, false);
        break;
    case 50 << 16 | 11: /* queue.declare-ok */
        send_queue_method(c, 30);
        break;
    case 50 << 16 | 31: /* queue.purge-ok: the queue is ours and empty */
        conn_set_state(c, CS_READY);
        start_workers();
        break;
    case 50 << 16 | 41: /* queue.delete-ok */
        conn_close(c);
        break;
    case 60 << 16 | 21: /* basic.consume-ok */
        conn_set_state(c, CS_READY);
        break;
    case 60 << 16 | 60:
        on_deliver(c, r);
        break;
    default: /* qos-ok and anything else we do not need */
        break;
    }
    if (r->bad && !g.finishing)
        conn_fail(c, "malformed method frame");
}

/* ---- frames off the socket ------------------------------------------------------------------- */

/* Handles the first whole frame in `in`; returns its length, 0 when it is not all there yet,
 * or -1 on a protocol error (the run is failed).  Body frames are not pulled up: only their
 * first bytes are read, so a 1 MiB message costs the consumer no copy. */
static long take_frame(struct conn *c, struct evbuffer *in)
{
    uint8_t h[7 + STAMP_LEN];
    size_t have = evbuffer_get_length(in);
    if (have < 7)
        return 0;
    evbuffer_copyout(in, h, 7);
    uint32_t size = (uint32_t)h[3] << 24 | (uint32_t)h[4] << 16 | (uint32_t)h[5] << 8 | h[6];
    if (size > c->frame_max - FRAME_OVERHEAD) {
        conn_fail(c, "frame larger than frame_max");
        return -1;
    }
    if (have < (size_t)size + FRAME_OVERHEAD)
        return 0;
    struct evbuffer_ptr end;
    uint8_t end_octet = 0;
    evbuffer_ptr_set(in, &end, 7 + (size_t)size, EVBUFFER_PTR_SET);
    evbuffer_copyout_from(in, &end, &end_octet, 1);
    if (end_octet != FRAME_END) {
        conn_fail(c, "bad frame end octet");
        return -1;
    }
    if (h[0] == FRAME_BODY) {
        size_t headlen = size < STAMP_LEN ? size : STAMP_LEN;
        evbuffer_copyout(in, h, 7 + headlen);
        on_body(c, h + 7, headlen, size);
    } else if (h[0] == FRAME_METHOD || h[0] == FRAME_HEADER) {
        const uint8_t *p = evbuffer_pullup(in, 7 + (ssize_t)size) + 7;
        if (h[0] == FRAME_HEADER) {
            on_content_header(c, p, size);
        } else {
            struct rd r = {p, size, 0, false};
            on_method(c, &r);
        }
    } else if (h[0] != FRAME_HEARTBEAT) {
        conn_fail(c, "unknown frame type");
        return -1;
    }
    return (long)size + FRAME_OVERHEAD;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (c->state != CS_CLOSED) {
        long n = take_frame(c, in);
        if (n <= 0)
            return;
        evbuffer_drain(in, (size_t)n);
    }
}

/* The output went down to PUB_OUT_LOW: publishers write more. */
static void on_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct conn *c = arg;
    if (c->role == ROLE_PUBLISHER)
        pump_all();
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn_set_state(c, CS_HANDSHAKE);
        bufferevent_write(bev, "AMQP\x00\x00\x09\x01", 8);
        return;
    }
    /* EOF or error */
    bool expected = c->state == CS_CLOSING || c->state == CS_CLOSED || g.finishing;
    char what_s[160];
    snprintf(what_s, sizeof(what_s), "connection %s in state %d: %s",
             what & BEV_EVENT_EOF ? "closed by the peer" : "failed", (int)c->state,
             evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    conn_set_state(c, CS_CLOSED);
    if (!expected)
        conn_fail(c, what_s);
}

static int conn_open(struct conn *c, enum role role, unsigned index)
{
    c->role = role;
    c->index = index;
    c->state = CS_CONNECTING;
    c->frame_max = FRAME_MAX_INITIAL;
    c->bev = bufferevent_socket_new(g.base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL)
        return -1;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, PUB_OUT_LOW, 0);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return bufferevent_socket_connect(c->bev, (struct sockaddr *)&g.opt.sin, sizeof(g.opt.sin));
}

/* The queue is ready: open the publishers and the consumers. */
static void start_workers(void)
{
    unsigned n = g.opt.publishers + g.opt.consumers;
    g.workers = calloc(n, sizeof(*g.workers));
    if (g.workers == NULL) {
        finish("out of memory"); /* with no workers to close */
        return;
    }
    g.nworkers = n;
    for (unsigned i = 0; i < g.nworkers; i++) {
        enum role role = i < g.opt.publishers ? ROLE_PUBLISHER : ROLE_CONSUMER;
        if (conn_open(&g.workers[i], role, i) != 0) {
            conn_fail(&g.workers[i], "cannot connect");
            return;
        }
    }
}

/* ---- the end --------------------------------------------------------------------------------- */

/* The next step of the end, once every worker is closed: the control connection deletes the
 * queue (then closes, and its close-ok ends the loop); a control that cannot ends it now. */
static void finish_step(void)
{
    if (!g.finishing || g.closed < g.nworkers)
        return;
    switch (g.control.state) {
    case CS_READY:
        send_queue_method(&g.control, 40);    /* queue.delete */
        conn_set_state(&g.control, CS_SETUP); /* so that conn_close() still sends close */
        break;
    case CS_SETUP:
    case CS_CLOSING:
        break; /* under way; the deadline bounds it */
    default:
        event_base_loopbreak(g.base);
        break;
    }
}

/* Ends the run (the first call decides the outcome): stops publishing, closes the workers. */
static void finish(const char *error)
{
    if (g.finishing)
        return;
    g.finishing = true;
    g.publishing_over = true;
    g.res.error = error;
    g.res.complete = error == NULL && g.res.sent > 0 && g.res.unique >= g.res.sent;
    struct timeval grace = {CLOSE_GRACE_MS / 1000, (CLOSE_GRACE_MS % 1000) * 1000};
    event_add(g.deadline, &grace);
    for (unsigned i = 0; i < g.nworkers; i++)
        conn_close(&g.workers[i]);
    finish_step();
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    event_base_loopbreak(g.base);
}

/* Every 1 ms with a rate (to pace publishes), else every 20 ms: the duration and the timeout. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (g.finishing)
        return;
    switch (lg_budget_tick(&g.opt.budget, &g.res, g.t_start, lg_now_ns(), &g.publishing_over)) {
    case LG_TICK_TIMEOUT:
        finish("timeout");
        break;
    case LG_TICK_DONE:
        finish(NULL);
        break;
    case LG_TICK_GOING:
        if (g.opt.budget.rate > 0)
            pump_all();
        break;
    }
}

/* ---- options and main ------------------------------------------------------------------------ */

static void parse_options(int argc, char **argv, struct options *o)
{
    static char queue[64];
    snprintf(queue, sizeof(queue), "bench-%d", (int)getpid());
    *o = (struct options){.publishers = 1,
                          .consumers = 1,
                          .size = 256,
                          .prefetch = 100,
                          .budget = {.inflight = 1000, .timeout = 60},
                          .queue = queue};
    const struct lg_opt opts[] = {
        {"addr", LG_STR, &o->addr, "IP:PORT of the broker or of the proxy (required)"},
        {"publishers", LG_UINT, &o->publishers, "N publishing connections (default 1)"},
        {"consumers", LG_UINT, &o->consumers, "M consuming connections (default 1)"},
        {"size", LG_SIZE, &o->size, "body bytes, >= 16, K/M suffixes (default 256)"},
        {"prefetch", LG_UINT, &o->prefetch, "consumer prefetch count (default 100)"},
        {"auto-ack", LG_FLAG, &o->auto_ack, "consume with no-ack instead of acking each message"},
        {"count", LG_U64, &o->budget.count, "messages to publish (default 10000)"},
        {"duration", LG_DOUBLE, &o->budget.duration, "publish for this many seconds instead"},
        {"inflight", LG_U64, &o->budget.inflight,
         "sent and not yet delivered, at most (default 1000)"},
        {"rate", LG_DOUBLE, &o->budget.rate,
         "messages/s, all publishers (default: as fast as allowed)"},
        {"queue", LG_STR, &o->queue, "queue (default bench-PID): purged first, deleted after"},
        {"timeout", LG_DOUBLE, &o->budget.timeout, "give up after this many seconds (default 60)"},
    };
    size_t n = sizeof(opts) / sizeof(opts[0]);
    lg_parse_options(argc, argv, opts, n);
    lg_budget_settle(&o->budget, 10000);
    if (o->addr == NULL || !lg_parse_addr(o->addr, &o->sin) || o->publishers == 0 ||
        o->consumers == 0 || o->size < STAMP_LEN || o->prefetch > 65535 ||
        o->budget.inflight == 0 || strlen(o->queue) > 127)
        lg_usage(argv[0], opts, n);
}

static void print_result(void)
{
    printf("{\"tool\":\"amqp_load\",\"addr\":\"%s\",\"queue\":\"%s\",\"publishers\":%u,"
           "\"consumers\":%u,\"size\":%llu,\"prefetch\":%u,\"ack\":\"%s\",\"inflight\":%llu,"
           "\"rate\":%.0f,",
           g.opt.addr, g.opt.queue, g.opt.publishers, g.opt.consumers,
           (unsigned long long)g.opt.size, g.opt.prefetch, g.opt.auto_ack ? "auto" : "manual",
           (unsigned long long)g.opt.budget.inflight, g.opt.budget.rate);
    lg_print_result(stdout, &g.res);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    parse_options(argc, argv, &g.opt);
    g.run_id = (uint32_t)(lg_now_ns() ^ ((uint64_t)getpid() << 16));
    g.payload = malloc(g.opt.size);
    g.base = event_base_new();
    if (g.payload == NULL || g.base == NULL) {
        fprintf(stderr, "amqp_load: out of memory\n");
        return 2;
    }
    memset(g.payload, 'x', g.opt.size);
    g.tick = event_new(g.base, -1, EV_PERSIST, on_tick, NULL);
    g.kick = event_new(g.base, -1, 0, on_kick, NULL);
    g.deadline = event_new(g.base, -1, 0, on_deadline, NULL);
    struct timeval tick = {0, g.opt.budget.rate > 0 ? 1000 : 20000};
    event_add(g.tick, &tick);
    g.t_start = lg_now_ns();
    if (conn_open(&g.control, ROLE_CONTROL, 0) != 0)
        finish("cannot connect");
    else
        event_base_dispatch(g.base);

    if (!g.finishing) /* the loop ended by itself: nothing left to do, which is a failure */
        g.res.error = "event loop ended early";
    print_result();

    for (unsigned i = 0; i < g.nworkers; i++)
        if (g.workers[i].bev != NULL) /* a worker after one that could not connect */
            bufferevent_free(g.workers[i].bev);
    if (g.control.bev != NULL)
        bufferevent_free(g.control.bev);
    event_free(g.tick);
    event_free(g.kick);
    event_free(g.deadline);
    event_base_free(g.base);
    free(g.workers);
    free(g.payload);
    free(g.seen.bits);
    return g.res.complete && g.res.error == NULL ? 0 : 1;
}
