/*
 * amqp_proxy.c - the AMQP 0-9-1 layer of a session: frames in, faults out.
 *
 * Bytes from each side are cut into frames (proto/amqp.h).  Frames twice
 * has no business with are handed on as they came, body frames by count
 * without being pulled up (no payload copy).  Methods that carry message
 * events (deliver, get-ok, publish, ack, nack, reject, publisher confirms)
 * are turned into rule-engine events at the point where the message is
 * known: a delivery or publish when its content header arrives (or its
 * whole body, when a rule matches on the body), a settlement per tag it
 * settles (proto/amqp_ledger.h keeps tags consistent on both ends).
 *
 * Per channel and direction, frames twice holds (delay) wait in order in a
 * queue: nothing on that channel overtakes them, while other channels and
 * heartbeats keep flowing.  Frames twice writes on a channel (a reject for a
 * duplicate, a released ack) wait while a content sequence of that channel
 * is half through, since AMQP forbids other frames inside one.
 *
 * Memory: every string of a message that an event needs later (queue, ids,
 * task) is copied into a struct msg_info owned by the ledger (into the
 * record itself when they fit: one allocation per message); everything
 * else is a view into a frame that lives until the frame is handed on.
 * Frames that go on unchanged are moved once per read, as one run (see
 * "Runs"); frames waiting for a decision stay where they were read while
 * nothing comes between them, else are copied into the connection's small
 * stash of that direction (one content at a time) or kept as chains.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp.h"
#include "proto/amqp_ledger.h"
#include "proxy/codec.h"
#include "proxy/fault.h"
#include "proxy/journal.h"
#include "proxy/log.h"
#include "proxy/session.h"
#include "rules/engine.h"

/* Most channels one connection may use through twice (RabbitMQ's default
 * channel_max is 2047). */
#define AMQP_PX_MAX_CHANNELS 2048
/* Largest body a `body~` matcher is given (bodies above it are matched as
 * absent): the body of such a message is held until it is complete. */
#define AMQP_PX_BODY_MATCH_MAX (1u << 20)
/* Bytes of delayed frames one session may hold per direction (`max-held`,
 * default CONF_DEFAULT_MAX_HELD); past it twice stops reading from that side
 * until some are released. */
struct amqp_px;
static size_t held_max(const struct amqp_px *ax);
/* Room for the frames one settlement can turn into. */
#define AMQP_PX_FRAME_SPACE 512

enum dir {
    DIR_UP = SIDE_CLIENT,     /* client -> broker: frames read from the client */
    DIR_DOWN = SIDE_UPSTREAM, /* broker -> client */
};

/* Bytes of a message's strings kept inside its msg_info: an exchange, a
 * routing key, a consumer tag, a queue, a uuid and a task name fit. */
#define MSG_INFO_POOL 256

/* What a later event needs to know of a message. */
struct msg_info {
    char *queue;
    char *exchange;
    char *routing_key;
    char *consumer_tag;
    char *message_id;
    char *task;
    bool redelivered;
    uint64_t tag;
    struct event *timer;        /* hold release (a held settlement) */
    struct event *expire_timer; /* expire: the delivery's visibility timeout */
    /* A late copy (`redeliver after D` on its ack, `duplicate after D` on its delivery): at
     * late_timer twice requeues the message upstream.  hold_ack: until then the client's ack
     * is held, never forwarded (duplicate); a redeliver's held ack is its rule's. */
    struct event *late_timer;
    bool hold_ack;
    uint32_t late_ms; /* the D of the late copy, for its log line */
    struct achan *ch;
    /* An armed `expire`: its rule (kept alive by a ruleset reference), noted
     * as a fault only if the timer fires before the ack. */
    const struct rule *expire_rule;
    struct ruleset *expire_rules;
    /* The rule that holds or dropped the message's ack: the fault a visibility timeout that
     * runs out meanwhile is noted as (kept alive the same way). */
    const struct rule *ack_rule;
    struct ruleset *ack_rules;
    /* The strings above live here when they fit (one allocation per
     * message instead of one per string); longer ones are malloc'd. */
    size_t pool_used;
    bool heap_strs;              /* a string above lives outside the pool */
    struct msg_info *next_spare; /* in the connection's spares */
    char pool[MSG_INFO_POOL];
};

/* Records a connection keeps for its next messages instead of freeing
 * them: a read of acks frees as many as the read of deliveries before it
 * took (glibc's per-thread cache keeps only 7 of this size).  At most
 * AMQP_PX_SPARE_INFOS.  Once a second (amqp_tick) they are cut to
 * AMQP_PX_SPARE_IDLE beyond the records in use: a connection whose messages
 * are all settled keeps ~3 KiB of them, not ~48 KiB.  Cut on every free
 * instead, a consumer's deliveries, acked one by one down to none in use,
 * left 8 spares for the next read of 100: most records were malloc'd. */
#define AMQP_PX_SPARE_INFOS 128
#define AMQP_PX_SPARE_IDLE 8

/* Bytes of a content's first frames kept without an evbuffer chain; one
 * such array per connection and direction, held by one content at a time
 * (a connection rarely has two undecided contents in one direction). */
#define AMQP_PX_STASH_SMALL 1024

/* A content sequence (method, header, bodies) crossing in one direction. */
struct content {
    bool active;
    bool decided;
    bool needs_body; /* a rule matches on the body: decide when complete */
    enum { FATE_FORWARD, FATE_DROP, FATE_HOLD } fate;
    uint32_t method; /* AMQP_BASIC_DELIVER, ... */
    uint64_t body_left;
    struct evbuffer *stash; /* frames kept until the decision */
    struct evbuffer *body;  /* body bytes for a body matcher */
    struct msg_info *info;  /* being built; handed to the ledger or freed */
    uint64_t tag;
    bool ack_required;
    bool close_after;   /* `close after`: cut once the content is through */
    struct held *entry; /* FATE_HOLD: the held run this content goes into */
    bool header_seen;
    uint8_t *headers_copy;     /* the headers table, when deciding after the body */
    struct amqp_bytes headers; /* valid only during the decision */
    /* The first frames kept until the decision (a method and its header,
     * usually), copied into the connection's small stash of this direction
     * while this content holds it, rather than moved as chains of their
     * own (a chain allocated and freed per message otherwise).  Bytes go to
     * `stash` once they do not fit, after what is there (stash_put). */
    uint8_t *small; /* NULL: not holding it */
    size_t small_len;
    bool stash_used; /* bytes went into `stash` since it was last emptied */
};

/* Frames held on a channel in one direction, released in order. */
struct held {
    uint64_t release_ms; /* 0: right after the one before */
    bool open;           /* a held content still receiving frames */
    struct evbuffer *frames;
    struct held *next;
};

/* tag and queue: NUL-terminated copies of shortstrs, kept with their lengths so that a delivery
 * compares its consumer tag, and copies the queue's name, without a strlen. */
struct consumer {
    char *tag;
    char *queue;
    uint8_t tag_len, queue_len;
    bool no_ack;
};

struct achan {
    uint16_t id;
    struct amqp_px *ax;
    struct amqp_ledger *ledger;
    struct content content[2]; /* by the side frames come from */
    struct held *held[2], *held_tail[2];
    struct event *held_timer[2];
    struct evbuffer *inject[2]; /* frames twice sends toward side [to] */
    bool injected[2];           /* inject[to] holds frames: asked per content end */
    struct evbuffer *deferred;  /* client frames waiting for the broker's close-ok */
    struct consumer *consumers;
    size_t n_consumers;
    struct consumer *pending; /* basic.consume awaiting consume-ok, in order */
    size_t n_pending;
    char *get_queue; /* queue of the basic.get in flight */
    bool get_no_ack;
    bool swallow_broker_close_ok; /* twice closed the broker side (error) */
    bool closed_for_client;       /* the client was told the channel is closed */
};

struct amqp_px {
    struct session *s;
    bool header_done;
    bool stopped;
    enum session_side reading; /* the side whose bytes are being processed */
    int closed_by;             /* the side whose connection.close was answered (close-ok), or -1 */
    uint32_t frame_max;        /* as negotiated; before tune-ok the minimum */
    struct achan **chans;
    size_t n_chans;
    struct evbuffer *xfer[2]; /* frames batched toward side [to] */
    /* The read being processed (see "Runs" below): the buffer, the frames
     * at its head already passed on but not moved yet (run), and after them
     * the first frames of one undecided content kept in place (kept, of
     * kept_by); the first chain while they are in it. */
    struct evbuffer *in;
    size_t run, kept;
    struct content *kept_by;
    const uint8_t *win; /* NULL: not known (in's head changed) */
    size_t win_len;
    /* The small stash of each direction (by the side frames come from),
     * and the content holding it, if any. */
    struct content *small_owner[2];
    uint8_t small[2][AMQP_PX_STASH_SMALL];
    struct achan *last_chan; /* the one chan_get found last (never freed before ax) */
    struct msg_info *spare;  /* records freed, for the next messages */
    size_t n_spare;
    size_t n_live;     /* records in use (by contents, ledgers, timers) */
    size_t n_hold_ack; /* of which, deliveries whose ack twice holds until a late copy */
};

static void send_flush(struct amqp_px *ax, enum session_side to);

/* ---- small helpers ----------------------------------------------------- */

static uint64_t now_ms(void)
{
    return proxy_now_ms();
}

static char *dup_bytes(struct amqp_bytes b)
{
    char *s = malloc((size_t)b.len + 1);
    if (s != NULL) {
        if (b.len > 0)
            memcpy(s, b.p, b.len);
        s[b.len] = '\0';
    }
    return s;
}

static struct msg_info *info_new(struct achan *ch)
{
    struct amqp_px *ax = ch->ax;
    struct msg_info *mi = ax->spare;
    if (mi != NULL) {
        ax->spare = mi->next_spare;
        ax->n_spare--;
    } else {
        mi = malloc(sizeof(*mi));
    }
    if (mi != NULL) {
        memset(mi, 0, offsetof(struct msg_info, pool)); /* the pool is written as used */
        mi->ch = ch;
        ax->n_live++;
    }
    return mi;
}

/* A copy of b as a C string, in mi's pool when it fits. */
static char *info_dup(struct msg_info *mi, struct amqp_bytes b)
{
    size_t need = (size_t)b.len + 1;
    if (need > sizeof(mi->pool) - mi->pool_used) {
        mi->heap_strs = true;
        return dup_bytes(b);
    }
    char *s = mi->pool + mi->pool_used;
    mi->pool_used += need;
    if (b.len > 0)
        memcpy(s, b.p, b.len);
    s[b.len] = '\0';
    return s;
}

/* Frees one of mi's strings unless it lives in the pool. */
static void info_str_free(struct msg_info *mi, char *str)
{
    uintptr_t a = (uintptr_t)str, lo = (uintptr_t)mi->pool;
    if (a < lo || a >= lo + sizeof(mi->pool))
        free(str);
}

static void info_free(void *p)
{
    struct msg_info *mi = p;
    if (mi == NULL)
        return;
    if (mi->timer != NULL)
        event_free(mi->timer);
    if (mi->expire_timer != NULL)
        event_free(mi->expire_timer);
    if (mi->late_timer != NULL)
        event_free(mi->late_timer);
    if (mi->hold_ack)
        mi->ch->ax->n_hold_ack--;
    if (mi->expire_rules != NULL)
        ruleset_put(mi->expire_rules);
    if (mi->ack_rules != NULL)
        ruleset_put(mi->ack_rules);
    if (mi->heap_strs) {
        char *strs[] = {mi->queue,        mi->exchange,   mi->routing_key,
                        mi->consumer_tag, mi->message_id, mi->task};
        for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
            info_str_free(mi, strs[i]);
    }
    struct amqp_px *ax = mi->ch->ax;
    ax->n_live--;
    if (ax->n_spare < AMQP_PX_SPARE_INFOS) {
        mi->next_spare = ax->spare;
        ax->spare = mi;
        ax->n_spare++;
    } else {
        free(mi);
    }
}

static enum session_side other(enum session_side side)
{
    return side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
}

static void protocol_error(struct amqp_px *ax, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A peer broke the protocol (or twice cannot follow it): close with a
 * logged reason; the other sessions carry on. */
static void protocol_error(struct amqp_px *ax, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    codec_log_protocol_error(ax->s, msg, NULL);
    /* What went through before the bad frame still reaches the other side
     * (a publish, or the broker's connection.start, batched in the same
     * read is not lost). */
    enum session_side to = other(ax->reading);
    send_flush(ax, to);
    session_abort(ax->s, SESSION_CLOSE_PROTOCOL_ERROR, to);
}

static bool alive(const struct amqp_px *ax)
{
    return !ax->stopped && ax->s->state == SESSION_RELAYING;
}

/* ---- channels ---------------------------------------------------------- */

/*
 * Runs.  A frame that goes on unchanged (most of them: a publish, its
 * header and body once no rule wants it, a delivery, an ack) is not moved
 * from the read buffer to xfer on its own: ax->run grows over it, and the
 * run moves with one evbuffer call when something else needs the buffer's
 * head or xfer.  Frames are parsed in place in the first chain (ax->win)
 * at the run's end.  The first frames of a content (its method, its
 * header) that wait for the decision stay in place too, after the run
 * (ax->kept): when the decision is to pass the content on, the run grows
 * over them, and they are copied nowhere.  The rule: code that takes bytes
 * from the head of ax->in or adds to an xfer calls settle() first, which
 * moves the run, stashes what is kept, and forgets the window; the frame
 * being handled is then at the head of ax->in, unless it has joined what is
 * kept.  Views into the frame stay valid across a settle() that moves only
 * bytes before it (its chain keeps it), not past the frame's own move: once
 * it has joined what is kept, a settle() copies it into the stash and
 * drains it (content_header reads the header's table in place only before
 * anything can settle, in content_decide's call of the rules).
 */
static int stash_put(struct amqp_px *ax, struct content *c, int from, size_t len);

static void settle(struct amqp_px *ax)
{
    ax->win = NULL;
    if (ax->run > 0) {
        size_t n = ax->run;
        ax->run = 0;
        if (codec_move(ax->in, ax->xfer[other(ax->reading)], n) != 0)
            protocol_error(ax, "out of memory");
    }
    if (ax->kept > 0) {
        struct content *c = ax->kept_by;
        size_t n = ax->kept;
        ax->kept = 0;
        ax->kept_by = NULL;
        if (stash_put(ax, c, ax->reading, n) != 0)
            protocol_error(ax, "out of memory");
    }
}

/* The frame being handled (len bytes, read from ax->reading) goes on
 * unchanged toward dst (NULL: dropped). */
static void take(struct amqp_px *ax, struct evbuffer *dst, size_t len)
{
    if (dst == ax->xfer[other(ax->reading)] && ax->kept == 0 && ax->win != NULL) {
        ax->run += len;
        return;
    }
    settle(ax);
    if (dst == ax->xfer[other(ax->reading)])
        (void)codec_move(ax->in, dst, len); /* goes out now: may share */
    else if (dst != NULL)
        evbuffer_remove_buffer(ax->in, dst, len); /* may wait: copied */
    else
        evbuffer_drain(ax->in, len);
}

/* Bytes in the content's evbuffer stash (asked of libevent only when some
 * went there: most contents never use it). */
static size_t stash_chain_len(const struct content *c)
{
    return c->stash_used ? evbuffer_get_length(c->stash) : 0;
}

/* The stash: the frames of a content kept until its decision, in order:
 * in place in the read buffer (ax->kept) while nothing came between them,
 * else the first of them in the connection's small stash while the content
 * holds it, the rest in the content's evbuffer. */
static size_t stash_len(const struct amqp_px *ax, const struct content *c)
{
    return c->small_len + stash_chain_len(c) + (ax->kept_by == c ? ax->kept : 0);
}

/* The content gives the small stash back (empty: its bytes went on). */
static void stash_release(struct amqp_px *ax, struct content *c)
{
    for (int d = 0; d < 2; d++)
        if (ax->small_owner[d] == c)
            ax->small_owner[d] = NULL;
    c->small = NULL;
    c->small_len = 0;
}

/* The len bytes at the head of ax->in join the stash of content c (frames
 * from side `from`).  While c holds the small stash, its evbuffer is empty:
 * bytes go there only once the small stash was emptied into it and given
 * back.  -1 when out of memory. */
static int stash_put(struct amqp_px *ax, struct content *c, int from, size_t len)
{
    struct evbuffer *in = ax->in;
    if (c->small == NULL && ax->small_owner[from] == NULL && stash_chain_len(c) == 0) {
        ax->small_owner[from] = c;
        c->small = ax->small[from];
        c->small_len = 0;
    }
    if (c->small != NULL && len <= AMQP_PX_STASH_SMALL - c->small_len) {
        /* The bytes were parsed in the first chain: a view, not a copy. */
        const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)len);
        if (p != NULL) {
            memcpy(c->small + c->small_len, p, len);
            evbuffer_drain(in, len);
        } else if (evbuffer_remove(in, c->small + c->small_len, len) != (int)len) {
            return -1;
        }
        c->small_len += len;
        return 0;
    }
    c->stash_used = true;
    if (c->small_len > 0 && evbuffer_add(c->stash, c->small, c->small_len) != 0)
        return -1; /* what came first stays first */
    if (c->small != NULL)
        stash_release(ax, c);
    return evbuffer_remove_buffer(in, c->stash, len) == (int)len ? 0 : -1;
}

/* The frame being handled (len bytes) joins the stash of content c: kept
 * in place when the stash is empty or already kept there (nothing came
 * between: any other frame would have settled).  -1 when out of memory. */
static int stash_take(struct amqp_px *ax, struct content *c, size_t len)
{
    if (ax->kept_by == c) {
        ax->kept += len; /* the frame right after what is kept */
        return 0;
    }
    if (ax->kept == 0 && ax->win != NULL && c->small_len == 0 && stash_chain_len(c) == 0) {
        ax->kept_by = c;
        ax->kept = len;
        return 0;
    }
    settle(ax);
    return stash_put(ax, c, ax->reading, len);
}

/* All of the stash, in order, to dst (NULL: dropped).  -1 when out of
 * memory. */
static int stash_move(struct amqp_px *ax, struct content *c, struct evbuffer *dst)
{
    if (ax->kept_by == c && dst == ax->xfer[other(ax->reading)]) {
        ax->run += ax->kept; /* passed on in place: copied nowhere */
        ax->kept = 0;
        ax->kept_by = NULL;
        return 0;
    }
    /* What is kept joins the stash; what came before goes out first. */
    if (ax->kept_by == c || dst != NULL)
        settle(ax);
    int rc = 0;
    if (dst != NULL && c->small_len > 0 && evbuffer_add(dst, c->small, c->small_len) != 0)
        rc = -1;
    if (c->small != NULL)
        stash_release(ax, c);
    size_t n = stash_chain_len(c);
    c->stash_used = false; /* emptied below */
    if (n == 0)
        return rc; /* the usual case: no evbuffer call that would change nothing */
    if (dst == NULL)
        evbuffer_drain(c->stash, n);
    else if (evbuffer_add_buffer(dst, c->stash) != 0)
        rc = -1;
    return rc;
}

static void content_clear(struct amqp_px *ax, struct content *c)
{
    /* Each test spares a call that would change nothing: at a content's end its frames have
     * usually gone on and its info to the ledger. */
    if (c->small != NULL || c->stash_used || ax->kept_by == c)
        stash_move(ax, c, NULL);
    /* Body bytes are collected only for a body matcher. */
    size_t n = c->needs_body && c->body != NULL ? evbuffer_get_length(c->body) : 0;
    if (n > 0)
        evbuffer_drain(c->body, n);
    if (c->info != NULL)
        info_free(c->info);
    if (c->headers_copy != NULL)
        free(c->headers_copy);
    /* A compound literal: stores the compiler sees the size of, where memset was a call. */
    *c = (struct content){.stash = c->stash, .body = c->body};
}

static void held_clear(struct achan *ch, int d)
{
    while (ch->held[d] != NULL) {
        struct held *h = ch->held[d];
        ch->held[d] = h->next;
        evbuffer_free(h->frames);
        free(h);
    }
    ch->held_tail[d] = NULL;
    ch->content[d].entry = NULL;
    if (ch->held_timer[d] != NULL)
        event_del(ch->held_timer[d]);
}

/* Forget the channel's deliveries and consumers: the broker voided them. */
static void chan_forget(struct achan *ch)
{
    amqp_ledger_reset(ch->ledger);
    content_clear(ch->ax, &ch->content[SIDE_UPSTREAM]);
    held_clear(ch, SIDE_UPSTREAM);
    evbuffer_drain(ch->inject[SIDE_CLIENT], evbuffer_get_length(ch->inject[SIDE_CLIENT]));
    ch->injected[SIDE_CLIENT] = false;
    for (size_t i = 0; i < ch->n_consumers; i++) {
        free(ch->consumers[i].tag);
        free(ch->consumers[i].queue);
    }
    ch->n_consumers = 0;
    for (size_t i = 0; i < ch->n_pending; i++) {
        free(ch->pending[i].tag);
        free(ch->pending[i].queue);
    }
    ch->n_pending = 0;
    free(ch->get_queue);
    ch->get_queue = NULL;
}

/* Forget everything about the channel's messages (closed or reopened). */
static void chan_reset(struct achan *ch)
{
    chan_forget(ch);
    content_clear(ch->ax, &ch->content[SIDE_CLIENT]);
    held_clear(ch, SIDE_CLIENT);
    evbuffer_drain(ch->inject[SIDE_UPSTREAM], evbuffer_get_length(ch->inject[SIDE_UPSTREAM]));
    ch->injected[SIDE_UPSTREAM] = false;
    /* swallow_* and closed_for_client follow the close handshakes, not the
     * channel's content: they are cleared where those end. */
}

static void chan_free(struct achan *ch)
{
    chan_reset(ch);
    amqp_ledger_free(ch->ledger);
    for (int d = 0; d < 2; d++) {
        if (ch->content[d].stash != NULL)
            evbuffer_free(ch->content[d].stash);
        if (ch->content[d].body != NULL)
            evbuffer_free(ch->content[d].body);
        if (ch->held_timer[d] != NULL)
            event_free(ch->held_timer[d]);
        evbuffer_free(ch->inject[d]);
    }
    if (ch->deferred != NULL)
        evbuffer_free(ch->deferred);
    free(ch->consumers);
    free(ch->pending);
    free(ch);
}

static void on_held_timer(evutil_socket_t fd, short what, void *arg);

static struct achan *chan_new(struct amqp_px *ax, uint16_t id)
{
    struct achan *ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return NULL;
    ch->id = id;
    ch->ax = ax;
    ch->ledger = amqp_ledger_new(info_free);
    bool ok = ch->ledger != NULL;
    for (int d = 0; d < 2 && ok; d++) {
        ch->content[d].stash = evbuffer_new();
        ch->content[d].body = evbuffer_new();
        ch->inject[d] = evbuffer_new();
        ch->held_timer[d] = evtimer_new(ax->s->loop->base, on_held_timer, ch);
        ok = ch->content[d].stash && ch->content[d].body && ch->inject[d] && ch->held_timer[d];
    }
    ch->deferred = evbuffer_new();
    ok = ok && ch->deferred != NULL;
    if (!ok) {
        for (int d = 0; d < 2; d++)
            if (ch->inject[d] == NULL)
                ch->inject[d] = evbuffer_new(); /* chan_free expects them */
        chan_free(ch);
        return NULL;
    }
    return ch;
}

static struct achan *chan_find(struct amqp_px *ax, uint16_t id, bool create);

/* The channel `id`, created when `create`; NULL if absent or out of memory.  The last one
 * asked for without a call: a frame's channel is usually its neighbour's. */
static inline struct achan *chan_get(struct amqp_px *ax, uint16_t id, bool create)
{
    if (ax->last_chan != NULL && ax->last_chan->id == id)
        return ax->last_chan;
    return chan_find(ax, id, create);
}

static struct achan *chan_find(struct amqp_px *ax, uint16_t id, bool create)
{
    for (size_t i = 0; i < ax->n_chans; i++)
        if (ax->chans[i]->id == id)
            return ax->last_chan = ax->chans[i];
    if (!create || ax->n_chans >= AMQP_PX_MAX_CHANNELS)
        return NULL;
    struct achan **v = realloc(ax->chans, (ax->n_chans + 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    ax->chans = v;
    struct achan *ch = chan_new(ax, id);
    if (ch != NULL)
        ax->chans[ax->n_chans++] = ch;
    return ch;
}

/* ---- sending ----------------------------------------------------------- */

/* Frames bound for `to` go out in order through xfer[to]. */
static void send_frames(struct amqp_px *ax, enum session_side to, struct evbuffer *frames)
{
    settle(ax);
    evbuffer_add_buffer(ax->xfer[to], frames);
}

static void send_flush(struct amqp_px *ax, enum session_side to)
{
    settle(ax);
    if (evbuffer_get_length(ax->xfer[to]) > 0)
        session_send(ax->s, to, ax->xfer[to]);
}

/* Frames twice writes on channel `ch` toward `to`: after any content of the
 * channel in flight in that direction (and after what twice holds there). */
static struct evbuffer *chan_out(struct achan *ch, int from);

/* Frames twice writes on channel `ch` toward `to` take the channel's one
 * ordered path (chan_out: behind what twice holds there), so the broker
 * sees every frame of a channel in the order the ledger produced them; only
 * a content sequence half through makes them wait (AMQP forbids other
 * frames of the channel inside one). */
static void chan_inject(struct achan *ch, enum session_side to, const uint8_t *frames, size_t len)
{
    enum session_side from = other(to);
    if (ch->content[from].active) {
        evbuffer_add(ch->inject[to], frames, len);
        ch->injected[to] = true;
        return;
    }
    settle(ch->ax);
    evbuffer_add(chan_out(ch, from), frames, len);
}

/* A content sequence of `ch` from `from` ended: what twice wanted to write
 * on the channel meanwhile follows it. */
static void chan_unblock(struct achan *ch, enum session_side from)
{
    enum session_side to = other(from);
    if (ch->injected[to] && !ch->content[from].active) {
        settle(ch->ax);
        /* Cleared once they moved: else asked again at the next content's end. */
        ch->injected[to] = evbuffer_add_buffer(chan_out(ch, from), ch->inject[to]) != 0;
    }
}

/* ---- rules ------------------------------------------------------------- */

struct header_ctx {
    struct amqp_bytes table;
    char buf[256];
};

static const char *header_lookup(const void *ctx, const char *name)
{
    struct header_ctx *h = (struct header_ctx *)ctx;
    struct amqp_bytes v;
    if (h->table.len == 0 || amqp_table_find_string(h->table, name, &v) != 1)
        return NULL;
    size_t n = v.len < sizeof(h->buf) - 1 ? v.len : sizeof(h->buf) - 1;
    memcpy(h->buf, v.p, n);
    h->buf[n] = '\0';
    return h->buf;
}

static void event_from_info(struct engine_event *ev, enum rule_event kind,
                            const struct msg_info *mi, struct session *s, char *idbuf, size_t idlen)
{
    memset(ev, 0, sizeof(*ev));
    ev->event = kind;
    if (mi != NULL) {
        ev->queue = mi->queue;
        ev->exchange = mi->exchange;
        ev->routing_key = mi->routing_key;
        ev->consumer_tag = mi->consumer_tag;
        ev->message_id = mi->message_id;
        ev->task = mi->task;
        ev->redelivered = mi->redelivered;
    }
    /* No id: the delivery is the identity (session, channel, tag). */
    codec_event_identity(ev, idbuf, idlen,
                         (const uint64_t[]){s->id, mi && mi->ch ? mi->ch->id : 0, mi ? mi->tag : 0},
                         3);
}

/* Ask the rules about `ev`; returns the number of rules that fired. */
static size_t decide(struct amqp_px *ax, struct engine_event *ev, size_t *hits)
{
    /* An expire is noted when it fires (on_expire), not here. */
    return codec_decide(ax->s, ev, hits);
}

/* Asks the rules about an event of a message (its content's header table and
 * body when given): the event is built only when some rule of the listener
 * looks at events of that kind, else only counted. */
static size_t decide_msg(struct amqp_px *ax, enum rule_event kind, const struct msg_info *mi,
                         const struct amqp_bytes *hdrs, struct evbuffer *body, size_t *hits)
{
    if (!codec_wants(ax->s, kind)) {
        codec_count(ax->s, kind);
        return 0;
    }
    struct engine_event ev;
    char idbuf[64];
    event_from_info(&ev, kind, mi, ax->s, idbuf, sizeof(idbuf));
    struct header_ctx hctx; /* buf is written only by a lookup: not zeroed per message */
    if (hdrs != NULL) {
        hctx.table = *hdrs;
        ev.header = header_lookup;
        ev.header_ctx = &hctx;
    }
    size_t blen = body != NULL ? evbuffer_get_length(body) : 0;
    if (blen > 0) {
        ev.body = evbuffer_pullup(body, -1);
        ev.body_len = blen;
    }
    return decide(ax, &ev, hits);
}

static const struct rule *hit_rule(struct amqp_px *ax, size_t idx)
{
    return ruleset_rule(ax->s->loop->rules, idx);
}

static void journal_event(struct amqp_px *ax, enum journal_kind kind, const struct msg_info *mi,
                          uint64_t tag)
{
    struct journal *j = ax->s->px->journal;
    if (j == NULL)
        return;
    struct journal_record r = {
        .kind = kind,
        .session = ax->s->id,
        .listener = ax->s->cfg->l->name,
        .client = ax->s->client_addr,
        .delivery_tag = tag,
    };
    if (mi != NULL) {
        r.queue = mi->queue;
        r.task = mi->task;
        r.message_id = mi->message_id;
        r.redelivered = mi->redelivered;
    }
    journal_record(j, &r);
}

/* ---- error action: channel.close / connection.close as RabbitMQ says it */

static const char *reply_name(uint16_t code)
{
    const char *name = amqp_reply_error_name(code);
    return name != NULL ? name : "ERROR";
}

/* Channel-level codes close the channel; the rest close the connection
 * (AMQP 0-9-1 constants: soft errors are 311-313 and 403-406). */
static bool soft_error(uint16_t code)
{
    return (code >= 311 && code <= 313) || (code >= 403 && code <= 406);
}

static uint16_t error_code(const struct rule *r)
{
    const char *c = r->action.error_code ? r->action.error_code : "406";
    if (*c == '-')
        c++;
    long v = strtol(c, NULL, 10);
    return v >= 200 && v <= 599 ? (uint16_t)v : 406;
}

/* Closes channel ch as the broker would, with `code` and `text` to the client: the broker's
 * side of it is closed by twice (which requeues every delivery unacked on it), the broker's
 * close-ok swallowed, and the ledger reset (held acks are discarded). */
static void close_channel(struct achan *ch, uint16_t code, const char *text, uint16_t class_id,
                          uint16_t method_id)
{
    uint8_t frame[AMQP_ENCODE_MAX];
    int n = amqp_encode_channel_close(frame, sizeof(frame), ch->id, code, amqp_cstr(text), class_id,
                                      method_id);
    if (n > 0)
        chan_inject(ch, SIDE_CLIENT, frame, (size_t)n);
    n = amqp_encode_channel_close(frame, sizeof(frame), ch->id, 200, amqp_cstr("twice"), 0, 0);
    if (n > 0)
        chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
    amqp_ledger_reset(ch->ledger);
    ch->swallow_broker_close_ok = true;
    ch->closed_for_client = true;
}

/* The broker refuses: the client's channel (or connection) is closed with
 * `r`'s code and a RabbitMQ-like text.  Twice closes the broker's side of
 * the channel too, so the broker requeues its unacked deliveries as it
 * would after its own channel error, and swallows both close-oks. */
static void inject_error(struct amqp_px *ax, struct achan *ch, const struct rule *r,
                         uint16_t class_id, uint16_t method_id)
{
    settle(ax);
    uint16_t code = error_code(r);
    char text[200];
    snprintf(text, sizeof(text), "%s - injected by twice rule '%s'", reply_name(code), r->name);
    uint8_t frame[AMQP_ENCODE_MAX];
    if (!soft_error(code) || ch == NULL || ch->id == 0) {
        int n = amqp_encode_connection_close(frame, sizeof(frame), code, amqp_cstr(text), class_id,
                                             method_id);
        if (n > 0)
            evbuffer_add(ax->xfer[SIDE_CLIENT], frame, (size_t)n);
        send_flush(ax, SIDE_UPSTREAM);
        send_flush(ax, SIDE_CLIENT);
        session_set_error(ax->s, "connection closed with %u by rule '%s'", code, r->name);
        session_abort(ax->s, SESSION_CLOSE_FAULT, SIDE_CLIENT);
        return;
    }
    close_channel(ch, code, text, class_id, method_id);
}

/* `close before` / `close after` on an event read from side `from`: what
 * went through before the cut (earlier frames of the same read included)
 * still reaches the other side; the event's own frame only with `after`,
 * where the caller has already queued it. */
static void cut(struct amqp_px *ax, const struct rule *r, enum session_side from)
{
    session_set_error(ax->s, "cut by rule '%s' (close %s)", r->name,
                      r->action.close_when == RULE_CLOSE_BEFORE ? "before" : "after");
    send_flush(ax, SIDE_CLIENT);
    send_flush(ax, SIDE_UPSTREAM);
    session_abort(ax->s, SESSION_CLOSE_FAULT, other(from));
}

/* ---- holding frames (delay on deliver and publish) --------------------- */

static void held_arm(struct achan *ch, int d)
{
    struct held *h = ch->held[d];
    if (h == NULL)
        return;
    uint64_t now = now_ms(), at = h->release_ms;
    uint64_t wait = at > now ? at - now : 0;
    struct timeval tv = {.tv_sec = (time_t)(wait / 1000),
                         .tv_usec = (suseconds_t)(wait % 1000) * 1000};
    evtimer_add(ch->held_timer[d], &tv);
}

/* Start holding on `ch` from `from` until `release_ms`. */
static struct held *held_push(struct achan *ch, int from, uint64_t release_ms, bool open)
{
    struct held *h = calloc(1, sizeof(*h));
    if (h == NULL || (h->frames = evbuffer_new()) == NULL) {
        free(h);
        return NULL;
    }
    h->release_ms = release_ms;
    h->open = open;
    if (ch->held_tail[from] != NULL)
        ch->held_tail[from]->next = h;
    else
        ch->held[from] = h;
    ch->held_tail[from] = h;
    if (ch->held[from] == h)
        held_arm(ch, from);
    return h;
}

/* Release held frames whose time has come (all of them when `all`). */
static void held_release(struct achan *ch, int from, bool all)
{
    struct amqp_px *ax = ch->ax;
    enum session_side to = other((enum session_side)from);
    uint64_t now = now_ms();
    while (ch->held[from] != NULL) {
        struct held *h = ch->held[from];
        if (!all && h->release_ms > now)
            break;
        send_frames(ax, to, h->frames);
        if (ch->content[from].entry == h) {
            /* The rest of this content goes straight through now. */
            ch->content[from].fate = FATE_FORWARD;
            ch->content[from].entry = NULL;
        }
        ch->held[from] = h->next;
        if (ch->held[from] == NULL)
            ch->held_tail[from] = NULL;
        else if (ch->held[from]->release_ms == 0)
            ch->held[from]->release_ms = now;
        evbuffer_free(h->frames);
        free(h);
    }
    held_arm(ch, from);
    chan_unblock(ch, (enum session_side)from);
}

/* Bytes held (delayed) on every channel from `from`. */
static size_t held_bytes(const struct amqp_px *ax, int from)
{
    size_t n = 0;
    for (size_t i = 0; i < ax->n_chans; i++)
        for (const struct held *h = ax->chans[i]->held[from]; h != NULL; h = h->next)
            n += evbuffer_get_length(h->frames);
    return n;
}

static size_t held_max(const struct amqp_px *ax)
{
    uint64_t m = ax->s->cfg->l->max_held;
    return (size_t)(m != 0 ? m : CONF_DEFAULT_MAX_HELD);
}

/* Backpressure for holds: a delay must not turn into unbounded memory. */
static void held_limit(struct amqp_px *ax)
{
    size_t max = held_max(ax);
    for (int from = 0; from < 2; from++) {
        size_t n = held_bytes(ax, from);
        if (n >= max)
            session_hold_reading(ax->s, (enum session_side)from, true);
        else if (n < max / 2)
            session_hold_reading(ax->s, (enum session_side)from, false);
    }
}

static void on_held_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct achan *ch = arg;
    struct amqp_px *ax = ch->ax;
    if (!alive(ax))
        return;
    for (int d = 0; d < 2; d++)
        held_release(ch, d, false);
    send_flush(ax, SIDE_CLIENT);
    send_flush(ax, SIDE_UPSTREAM);
    if (alive(ax))
        held_limit(ax);
}

/* ---- settlements (client ack / nack / reject) -------------------------- */

/* Twice settles a delivery itself (duplicate, drop, an expiry, a late copy); whether it
 * wrote a frame for the broker. */
static bool settle_now(struct achan *ch, uint64_t tag, bool requeue)
{
    uint8_t frame[64];
    int n = amqp_ledger_twice_settle(ch->ledger, ch->id, tag, requeue, frame, sizeof(frame));
    if (n > 0)
        chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
    return n > 0;
}

/* The channel of a message whose timer fired, or NULL when its session is going away. */
static struct achan *timer_chan(const struct msg_info *mi)
{
    return alive(mi->ch->ax) ? mi->ch : NULL;
}

static void on_hold_release(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    struct achan *ch = timer_chan(mi);
    if (ch == NULL)
        return;
    uint8_t frame[64];
    /* The release forgets the tag and frees `mi` (and this timer): nothing
     * of it may be used afterwards. */
    int n = amqp_ledger_release(ch->ledger, ch->id, mi->tag, frame, sizeof(frame));
    if (n > 0) {
        chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
        send_flush(ch->ax, SIDE_UPSTREAM);
    }
}

/* A late copy is due (`redeliver after D` D after the ack, `duplicate after D` D after the
 * delivery): the message goes back to its queue upstream (a reject with requeue), as if its
 * ack had never come; the client's ack, held or still to come, is discarded or swallowed.  A
 * visibility timeout that ran out first has requeued it already.  Settling a held tag forgets
 * it and frees mi (and this timer). */
static void on_late_copy(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    struct achan *ch = timer_chan(mi);
    if (ch == NULL)
        return;
    struct amqp_px *ax = ch->ax;
    uint64_t tag = mi->tag;
    if (!amqp_ledger_twice_settleable(ch->ledger, tag))
        return;
    log_msg(LOG_INFO, "late copy",
            "sid=%llu listener=%s channel=%u delivery_tag=%llu after_ms=%u action=%s",
            (unsigned long long)ax->s->id, ax->s->cfg->l->name, ch->id, (unsigned long long)tag,
            mi->late_ms, mi->hold_ack ? "duplicate" : "redeliver");
    if (settle_now(ch, tag, true))
        send_flush(ax, SIDE_UPSTREAM);
}

/* Arms one of mi's timers (*slot: its hold release, its expiry or its late copy, which run
 * apart: an ack held past the visibility timeout is both). */
static bool arm_timer(struct amqp_px *ax, struct msg_info *mi, struct event **slot, uint32_t ms,
                      void (*cb)(evutil_socket_t, short, void *))
{
    if (*slot != NULL)
        event_free(*slot);
    *slot = evtimer_new(ax->s->loop->base, cb, mi);
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return *slot != NULL && evtimer_add(*slot, &tv) == 0;
}

/* Flush every settlement twice holds on `ch` (before the client closes the
 * channel or recovers: held acks are not lost to a close). */
static void release_all_held_acks(struct achan *ch)
{
    uint64_t tags[64];
    size_t n;
    while ((n = amqp_ledger_held(ch->ledger, tags, 64)) > 0) {
        size_t k = n < 64 ? n : 64;
        for (size_t i = 0; i < k; i++) {
            uint8_t frame[64];
            const struct msg_info *mi = amqp_ledger_info(ch->ledger, tags[i]);
            /* A late copy's ack is not the client's to give: the message goes back now (the
             * copy comes early, as it would when the channel closes). */
            int len = mi != NULL && mi->late_timer != NULL
                          ? amqp_ledger_twice_settle(ch->ledger, ch->id, tags[i], true, frame,
                                                     sizeof(frame))
                          : amqp_ledger_release(ch->ledger, ch->id, tags[i], frame, sizeof(frame));
            if (len > 0) {
                settle(ch->ax);
                evbuffer_add(chan_out(ch, SIDE_CLIENT), frame, (size_t)len);
            }
        }
    }
}

/* Remembers the rule that holds or dropped mi's ack (the first). */
static void note_ack_rule(struct amqp_px *ax, struct msg_info *mi, const struct rule *r)
{
    if (mi == NULL || mi->ack_rules != NULL)
        return;
    mi->ack_rule = r;
    mi->ack_rules = ax->s->loop->rules;
    ruleset_get(mi->ack_rules);
}

/* Apply the rules that fired on one settled tag.  Returns false when the
 * session was cut (`close before`). */
static bool settle_verdict(struct amqp_px *ax, struct achan *ch, struct amqp_plan_tag *t,
                           const size_t *hits, size_t n, const struct rule **close_after,
                           const struct rule **error)
{
    struct msg_info *mi = t->info;
    for (size_t i = 0; i < n; i++) {
        const struct rule *r = hit_rule(ax, hits[i]);
        switch (r->action.kind) {
        case RULE_ACT_REDELIVER:
            t->verdict = AMQP_V_REQUEUE;
            if (r->action.duration_ms != 0 && mi != NULL &&
                arm_timer(ax, mi, &mi->late_timer, r->action.duration_ms, on_late_copy)) {
                /* Held, then requeued at D instead of forwarded. */
                t->verdict = AMQP_V_HOLD;
                mi->late_ms = r->action.duration_ms;
            }
            break;
        case RULE_ACT_DROP:
            t->verdict = AMQP_V_DROP;
            note_ack_rule(ax, mi, r);
            break;
        case RULE_ACT_DELAY:
            t->verdict = AMQP_V_HOLD;
            if (!arm_timer(ax, mi, &mi->timer, r->action.duration_ms, on_hold_release))
                t->verdict = AMQP_V_PASS;
            else
                note_ack_rule(ax, mi, r);
            break;
        case RULE_ACT_CLOSE:
            if (r->action.close_when == RULE_CLOSE_BEFORE) {
                cut(ax, r, SIDE_CLIENT);
                return false;
            }
            *close_after = r;
            break;
        case RULE_ACT_ERROR:
            t->verdict = AMQP_V_DROP;
            *error = r;
            break;
        default:
            break;
        }
    }
    (void)ch;
    return true;
}

/* Commit a settle or confirm plan for the frame of `len` bytes at the head
 * of `in`, read from side `from`: the frame goes on unchanged, or is
 * replaced by what the ledger wrote.  Returns the commit's result (negative
 * on error, the frame then left in `in`). */
static int apply_plan(struct achan *ch, int from, struct amqp_plan *plan,
                      int (*commit)(struct amqp_ledger *, uint16_t, struct amqp_plan *, uint8_t *,
                                    size_t, size_t *),
                      size_t len)
{
    size_t space = amqp_ledger_plan_space(plan), out = 0;
    uint8_t room[AMQP_PX_FRAME_SPACE]; /* one ack's frames, without a malloc */
    uint8_t *frames = space <= sizeof(room) ? room : malloc(space);
    int rc = frames != NULL ? commit(ch->ledger, ch->id, plan, frames, space, &out)
                            : AMQP_LEDGER_E_NOMEM;
    if (rc == 1) {
        take(ch->ax, chan_out(ch, from), len);
    } else if (rc == 0) {
        take(ch->ax, NULL, len);
        evbuffer_add(chan_out(ch, from), frames, out);
    }
    if (frames != room)
        free(frames);
    return rc;
}

static void on_settle(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m, size_t len)
{
    enum amqp_settle_kind kind = m->id == AMQP_BASIC_ACK    ? AMQP_SETTLE_ACK
                                 : m->id == AMQP_BASIC_NACK ? AMQP_SETTLE_NACK
                                                            : AMQP_SETTLE_REJECT;
    /* The usual ack, one outstanding tag that neither the journal nor a rule looks at: settled
     * in the ledger at once and passed on as it came, as a plan whose verdict is to pass. */
    if (kind == AMQP_SETTLE_ACK && !m->ack.multiple && ax->s->px->journal == NULL &&
        !codec_wants(ax->s, RULE_EV_ACK) && ax->n_hold_ack == 0 &&
        amqp_ledger_ack_one(ch->ledger, m->ack.delivery_tag)) {
        codec_count(ax->s, RULE_EV_ACK);
        take(ax, chan_out(ch, SIDE_CLIENT), len);
        return;
    }
    struct amqp_plan plan;
    if (amqp_ledger_settle_begin(ch->ledger, kind, m->ack.delivery_tag, m->ack.multiple,
                                 m->ack.requeue, &plan) != 0) {
        protocol_error(ax, "out of memory tracking delivery tags");
        return;
    }
    const struct rule *close_after = NULL;
    const struct rule *error = NULL;
    for (size_t i = 0; i < plan.n; i++) {
        struct amqp_plan_tag *t = &plan.tags[i];
        struct msg_info *mi = t->info;
        journal_event(ax, kind == AMQP_SETTLE_ACK ? JOURNAL_KIND_ACK : JOURNAL_KIND_NACK, mi,
                      t->tag);
        if (mi != NULL && mi->hold_ack) {
            /* A late duplicate is due: the settlement waits for it, and no rule sees it (one
             * that fired would be journaled as a fault it never made). */
            codec_count(ax->s, kind == AMQP_SETTLE_ACK ? RULE_EV_ACK : RULE_EV_NACK);
            t->verdict = AMQP_V_HOLD;
            continue;
        }
        size_t hits[SESSION_MAX_RULE_HITS];
        size_t n = decide_msg(ax, kind == AMQP_SETTLE_ACK ? RULE_EV_ACK : RULE_EV_NACK, mi, NULL,
                              NULL, hits);
        if (!settle_verdict(ax, ch, t, hits, n, &close_after, &error))
            return;
    }
    int rc = apply_plan(ch, SIDE_CLIENT, &plan, amqp_ledger_settle_commit, len);
    if (rc < 0) {
        protocol_error(ax, "cannot rewrite a settlement: %s", amqp_ledger_strerror(rc));
        return;
    }
    if (error != NULL)
        inject_error(ax, ch, error, 60, (uint16_t)(m->id & 0xffff));
    else if (close_after != NULL)
        cut(ax, close_after, SIDE_CLIENT);
}

/* ---- content: deliveries and publishes --------------------------------- */

/* Where frames of `ch` from `from` go: behind what is held there, or out. */
static struct evbuffer *chan_out(struct achan *ch, int from)
{
    struct held *t = ch->held_tail[from];
    if (t == NULL)
        return ch->ax->xfer[other((enum session_side)from)];
    if (t->open || t->release_ms == 0)
        return t->frames;
    struct held *h = held_push(ch, from, 0, false);
    return h != NULL ? h->frames : ch->ax->xfer[other((enum session_side)from)];
}

static bool consumer_is(const struct consumer *c, struct amqp_bytes tag)
{
    return tag.len == c->tag_len && (tag.len == 0 || memcmp(tag.p, c->tag, tag.len) == 0);
}

static struct consumer *consumer_find(struct achan *ch, struct amqp_bytes tag)
{
    for (size_t i = 0; i < ch->n_consumers; i++)
        if (consumer_is(&ch->consumers[i], tag))
            return &ch->consumers[i];
    return NULL;
}

static bool rules_need_body(struct amqp_px *ax, enum rule_event ev)
{
    struct ruleset *rs = ax->s->loop->rules;
    for (size_t i = 0; rs != NULL && i < ruleset_count(rs); i++) {
        const struct rule *r = ruleset_rule(rs, i);
        if (r->event != ev || strcmp(r->listener, ax->s->cfg->l->name) != 0)
            continue;
        for (size_t k = 0; k < r->n_matchers; k++)
            if (r->matchers[k].field == RULE_F_BODY)
                return true;
    }
    return false;
}

/* con: the consumer of a basic.deliver (consumer_find), NULL if unknown. */
static struct msg_info *info_from_delivery(struct achan *ch, const struct amqp_method *m,
                                           const struct consumer *con)
{
    struct msg_info *mi = info_new(ch);
    if (mi == NULL)
        return NULL;
    const struct amqp_delivery *d = &m->delivery;
    mi->tag = d->delivery_tag;
    mi->redelivered = d->redelivered;
    mi->exchange = info_dup(mi, d->exchange);
    mi->routing_key = info_dup(mi, d->routing_key);
    if (m->id == AMQP_BASIC_DELIVER) {
        mi->consumer_tag = info_dup(mi, d->consumer_tag);
        mi->queue = con != NULL ? info_dup(mi, (struct amqp_bytes){.p = (const uint8_t *)con->queue,
                                                                   .len = con->queue_len})
                                : NULL;
    } else {
        mi->queue = ch->get_queue;
        mi->heap_strs = true;
        ch->get_queue = NULL;
    }
    return mi;
}

static struct msg_info *info_from_publish(struct achan *ch, const struct amqp_method *m)
{
    struct msg_info *mi = info_new(ch);
    if (mi == NULL)
        return NULL;
    mi->exchange = info_dup(mi, m->publish.exchange);
    mi->routing_key = info_dup(mi, m->publish.routing_key);
    /* Through the default exchange the routing key is the queue (Celery). */
    if (m->publish.exchange.len == 0)
        mi->queue = info_dup(mi, m->publish.routing_key);
    return mi;
}

static void content_begin(struct amqp_px *ax, struct achan *ch, int from,
                          const struct amqp_method *m, size_t len)
{
    struct content *c = &ch->content[from];
    if (c->active) {
        protocol_error(ax, "channel %u: %s inside a content sequence", ch->id,
                       amqp_method_name(m->class_id, m->method_id));
        return;
    }
    /* Not active: cleared (content_end, chan_reset), and nothing writes it till now. */
    c->active = true;
    c->method = m->id;
    if (m->id == AMQP_BASIC_RETURN) {
        c->decided = true;
        c->fate = FATE_FORWARD;
        take(ax, chan_out(ch, from), len);
        return;
    }
    if (m->id == AMQP_BASIC_PUBLISH) {
        /* A publish's identity serves its own event (the journal, a rule on publishes) and,
         * on a channel in confirm mode, its confirm's.  Without them it is not kept: a rule a
         * reload adds before this message's header arrives sees it without one. */
        if (ax->s->px->journal == NULL && !codec_wants(ax->s, RULE_EV_PUBLISH) &&
            !amqp_ledger_in_confirm_mode(ch->ledger)) {
            if (stash_take(ax, c, len) != 0)
                protocol_error(ax, "out of memory");
            return;
        }
        c->info = info_from_publish(ch, m);
    } else {
        struct consumer *con =
            m->id == AMQP_BASIC_DELIVER ? consumer_find(ch, m->delivery.consumer_tag) : NULL;
        c->info = info_from_delivery(ch, m, con);
        c->tag = m->delivery.delivery_tag;
        c->ack_required =
            m->id == AMQP_BASIC_DELIVER ? con == NULL || !con->no_ack : !ch->get_no_ack;
    }
    if (c->info == NULL || stash_take(ax, c, len) != 0)
        protocol_error(ax, "out of memory");
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    struct achan *ch = timer_chan(mi);
    if (ch == NULL)
        return;
    struct amqp_px *ax = ch->ax;
    uint64_t tag = mi->tag;
    /* Settled at the broker in time: nothing expired. */
    if (!amqp_ledger_twice_settleable(ch->ledger, tag))
        return;
    /* Not settled at the broker within the visibility timeout (the client
     * has not acked, or twice holds or dropped its ack): the broker hands
     * the message to another consumer; a late ack is swallowed, a held one
     * discarded.  The fault is noted first: settling a delivery whose ack
     * twice dropped or holds forgets it and frees mi (and this timer). */
    const struct rule *r = mi->expire_rule != NULL ? mi->expire_rule : mi->ack_rule;
    if (r != NULL) {
        struct engine_event ev;
        char idbuf[96];
        event_from_info(&ev, RULE_EV_DELIVER, mi, ax->s, idbuf, sizeof(idbuf));
        fault_note(ax->s, r, &ev);
    }
    const struct conf_listener *l = ax->s->cfg->l;
    bool whole_channel = mi->expire_rule == NULL && l->consumer_timeout;
    log_msg(LOG_INFO, "expired",
            "sid=%llu listener=%s channel=%u delivery_tag=%llu rule=%s timeout=%s",
            (unsigned long long)ax->s->id, l->name, ch->id, (unsigned long long)tag,
            r != NULL ? r->name : "-",
            mi->expire_rule != NULL ? "expire"
            : whole_channel         ? "consumer-timeout"
                                    : "visibility-timeout");
    if (whole_channel) {
        /* RabbitMQ's consumer_timeout: the channel closes under the consumer, every delivery
         * unacked on it goes back to its queue (rabbit_channel's evaluate_consumer_timeout). */
        char text[256];
        snprintf(text, sizeof(text),
                 "PRECONDITION_FAILED - delivery acknowledgement on channel %u timed out. "
                 "Timeout value used: %u ms. This timeout value can be configured, see "
                 "consumers doc guide to learn more",
                 ch->id, l->visibility_ms);
        settle(ax);
        close_channel(ch, 406, text, 0, 0);
        send_flush(ax, SIDE_UPSTREAM);
        send_flush(ax, SIDE_CLIENT);
        return;
    }
    if (settle_now(ch, tag, true))
        send_flush(ax, SIDE_UPSTREAM);
}

/* The actions of the rules that fired on a delivery or publish.  Returns
 * false when the session was cut. */
static bool content_actions(struct amqp_px *ax, struct achan *ch, struct content *c,
                            struct msg_info *mi, const size_t *hits, size_t n)
{
    bool deliver = c->method != AMQP_BASIC_PUBLISH;
    bool delay = false;
    uint32_t delay_ms = 0;
    for (size_t i = 0; i < n; i++) {
        const struct rule *r = hit_rule(ax, hits[i]);
        switch (r->action.kind) {
        case RULE_ACT_CLOSE:
            if (r->action.close_when == RULE_CLOSE_BEFORE) {
                cut(ax, r, deliver ? SIDE_UPSTREAM : SIDE_CLIENT);
                return false;
            }
            c->close_after = true;
            break;
        case RULE_ACT_ERROR:
            /* The channel is closed under the message: no other action
             * applies, and the ledger reset has freed `mi`. */
            c->fate = FATE_DROP;
            inject_error(ax, ch, r, 60, (uint16_t)(c->method & 0xffff));
            return alive(ax);
        case RULE_ACT_DROP:
            c->fate = FATE_DROP;
            if (deliver && c->ack_required)
                settle_now(ch, c->tag, false); /* the job is lost */
            break;
        case RULE_ACT_DELAY:
            if (r->action.duration_ms >= delay_ms)
                delay_ms = r->action.duration_ms;
            delay = true;
            break;
        case RULE_ACT_DUPLICATE:
            if (!c->ack_required)
                break;
            if (r->action.duration_ms != 0 && mi != NULL && !mi->hold_ack &&
                arm_timer(ax, mi, &mi->late_timer, r->action.duration_ms, on_late_copy)) {
                mi->hold_ack = true; /* its ack waits for the copy */
                mi->late_ms = r->action.duration_ms;
                ax->n_hold_ack++;
            } else {
                settle_now(ch, c->tag, true);
            }
            break;
        case RULE_ACT_EXPIRE:
            if (c->ack_required && mi != NULL &&
                arm_timer(ax, mi, &mi->expire_timer, r->action.duration_ms, on_expire) &&
                mi->expire_rules == NULL) {
                mi->expire_rule = r;
                mi->expire_rules = ax->s->loop->rules;
                ruleset_get(mi->expire_rules);
            }
            break;
        default:
            break;
        }
    }
    /* Hold only what is forwarded at all (a dropped message is not held). */
    if (delay && c->fate == FATE_FORWARD) {
        c->entry = held_push(ch, deliver ? SIDE_UPSTREAM : SIDE_CLIENT, now_ms() + delay_ms, true);
        if (c->entry != NULL)
            c->fate = FATE_HOLD;
    }
    return true;
}

static void content_end(struct amqp_px *ax, struct achan *ch, int from)
{
    struct content *c = &ch->content[from];
    bool close_after = c->close_after;
    if (c->entry != NULL)
        c->entry->open = false;
    content_clear(ax, c);
    chan_unblock(ch, (enum session_side)from);
    if (close_after) {
        session_set_error(ax->s, "cut after a message (close after)");
        send_flush(ax, other((enum session_side)from));
        session_abort(ax->s, SESSION_CLOSE_FAULT, other((enum session_side)from));
    }
}

/* Hand the stashed frames on as decided. */
static void content_release_stash(struct achan *ch, int from)
{
    struct content *c = &ch->content[from];
    struct evbuffer *dst = c->fate == FATE_DROP   ? NULL
                           : c->fate == FATE_HOLD ? c->entry->frames
                                                  : chan_out(ch, from);
    if (stash_move(ch->ax, c, dst) != 0)
        protocol_error(ch->ax, "out of memory");
}

/* The listener's visibility timeout (or consumer timeout) on a delivery that needs an ack and
 * is forwarded, unless an `expire` rule armed its own. */
static void arm_visibility(struct amqp_px *ax, struct achan *ch, const struct content *c,
                           struct msg_info *mi)
{
    uint32_t ms = ax->s->cfg->l->visibility_ms;
    if (ms == 0 || c->method == AMQP_BASIC_PUBLISH || !c->ack_required || c->fate == FATE_DROP ||
        amqp_ledger_info(ch->ledger, c->tag) != mi || mi->expire_timer != NULL)
        return;
    (void)arm_timer(ax, mi, &mi->expire_timer, ms, on_expire);
}

static void content_decide(struct amqp_px *ax, struct achan *ch, int from, struct amqp_bytes hdrs)
{
    struct content *c = &ch->content[from];
    struct msg_info *mi = c->info;
    bool deliver = c->method != AMQP_BASIC_PUBLISH;
    c->decided = true;
    c->fate = FATE_FORWARD;
    if (deliver && c->ack_required) {
        c->info = NULL; /* the ledger owns it from here */
        if (amqp_ledger_deliver(ch->ledger, c->tag, mi) != 0) {
            protocol_error(ax, "channel %u: delivery tag %llu out of order", ch->id,
                           (unsigned long long)c->tag);
            return;
        }
    }
    journal_event(ax, deliver ? JOURNAL_KIND_DELIVER : JOURNAL_KIND_PUBLISH, mi, c->tag);
    size_t hits[SESSION_MAX_RULE_HITS];
    size_t n = decide_msg(ax, deliver ? RULE_EV_DELIVER : RULE_EV_PUBLISH, mi, &hdrs,
                          c->needs_body ? c->body : NULL, hits);
    if (!content_actions(ax, ch, c, deliver && c->ack_required ? mi : NULL, hits, n))
        return;
    arm_visibility(ax, ch, c, mi);
    if (!deliver) {
        uint64_t seq;
        c->info = NULL;
        if (amqp_ledger_publish(ch->ledger, c->fate == FATE_DROP, mi, &seq) != 0) {
            protocol_error(ax, "channel %u: too many unconfirmed publishes", ch->id);
            return;
        }
    }
    content_release_stash(ch, from);
    if (c->body_left == 0)
        content_end(ax, ch, from);
}

/* Copy the message's identity out of its content header. */
static void info_from_props(struct msg_info *mi, const struct amqp_props *p)
{
    struct amqp_bytes v;
    if (p->message_id.len > 0)
        mi->message_id = info_dup(mi, p->message_id);
    else if (p->headers.len > 0 && amqp_table_find_string(p->headers, "id", &v) == 1)
        mi->message_id = info_dup(mi, v); /* Celery protocol 2 */
    else if (p->correlation_id.len > 0)
        mi->message_id = info_dup(mi, p->correlation_id);
    if (p->headers.len > 0 && amqp_table_find_string(p->headers, "task", &v) == 1)
        mi->task = info_dup(mi, v);
}

static void content_header(struct amqp_px *ax, struct achan *ch, int from,
                           const struct amqp_frame *f, size_t len)
{
    struct content *c = &ch->content[from];
    if (c->active && !c->decided && c->header_seen) {
        protocol_error(ax, "channel %u: a second content header", ch->id);
        return;
    }
    if (!c->active || c->decided || stash_len(ax, c) == 0) {
        if (c->active && c->decided && c->method == AMQP_BASIC_RETURN) {
            struct amqp_props p;
            if (amqp_content_header_decode(f->payload, f->size, &p) == 0)
                c->body_left = p.body_size;
            take(ax, chan_out(ch, from), len);
            if (c->body_left == 0)
                content_end(ax, ch, from);
            return;
        }
        protocol_error(ax, "channel %u: content header without a content method", ch->id);
        return;
    }
    struct amqp_props p;
    int rc = amqp_content_header_decode(f->payload, f->size, &p);
    if (rc != 0) {
        protocol_error(ax, "channel %u: bad content header: %s", ch->id, amqp_strerror(rc));
        return;
    }
    uint64_t max_message = ax->s->cfg->l->max_message;
    if (max_message != 0 && p.body_size > max_message) {
        protocol_error(ax, "channel %u: a message of %llu bytes, over max-message-size %llu",
                       ch->id, (unsigned long long)p.body_size, (unsigned long long)max_message);
        return;
    }
    if (c->info != NULL)
        info_from_props(c->info, &p);
    c->header_seen = true;
    c->body_left = p.body_size;
    enum rule_event ev = c->method == AMQP_BASIC_PUBLISH ? RULE_EV_PUBLISH : RULE_EV_DELIVER;
    c->needs_body =
        p.body_size > 0 && p.body_size <= AMQP_PX_BODY_MATCH_MAX && rules_need_body(ax, ev);
    /* When the content's frames are kept in place (the method was), the
     * header joins them and stays where it was parsed until the rules have
     * read its headers (content_decide settles only after them).  Else the
     * frame moves into the stash below, and the decision, now or after the
     * body, reads a copy. */
    bool in_place = ax->kept_by == c && !c->needs_body;
    c->headers.len = 0;
    if (!in_place && p.headers.len > 0 && (c->headers_copy = malloc(p.headers.len)) != NULL) {
        memcpy(c->headers_copy, p.headers.p, p.headers.len);
        c->headers.p = c->headers_copy;
        c->headers.len = p.headers.len;
    }
    if (stash_take(ax, c, len) != 0) {
        protocol_error(ax, "out of memory");
        return;
    }
    if (!c->needs_body)
        content_decide(ax, ch, from, in_place ? p.headers : c->headers);
}

static void content_body(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_frame *f,
                         size_t len)
{
    struct content *c = &ch->content[from];
    if (!c->active || c->body_left < f->size || stash_len(ax, c) + c->decided == 0) {
        protocol_error(ax, "channel %u: unexpected body frame", ch->id);
        return;
    }
    c->body_left -= f->size;
    if (!c->decided) {
        evbuffer_add(c->body, f->payload, f->size);
        if (stash_take(ax, c, len) != 0) {
            protocol_error(ax, "out of memory");
            return;
        }
        if (c->body_left == 0)
            content_decide(ax, ch, from, c->headers);
        return;
    }
    if (c->fate == FATE_DROP)
        take(ax, NULL, len);
    else if (c->fate == FATE_HOLD && c->entry != NULL)
        take(ax, c->entry->frames, len);
    else
        take(ax, chan_out(ch, from), len);
    if (c->body_left == 0)
        content_end(ax, ch, from);
}

/* ---- methods ----------------------------------------------------------- */

static void forward(struct achan *ch, int from, struct amqp_px *ax, size_t len)
{
    take(ax, ch != NULL ? chan_out(ch, from) : ax->xfer[other((enum session_side)from)], len);
}

/* Append a consumer to `v`, taking `tag` and `queue` (dup_bytes() copies of shortstrs of those
 * lengths); false when out of memory (both are freed then). */
static bool consumer_push(struct consumer **v, size_t *n, char *tag, uint8_t tag_len, char *queue,
                          uint8_t queue_len, bool no_ack)
{
    struct consumer *w = realloc(*v, (*n + 1) * sizeof(*w));
    if (w == NULL || tag == NULL || queue == NULL) {
        if (w != NULL)
            *v = w;
        free(tag);
        free(queue);
        return false;
    }
    *v = w;
    w[*n] = (struct consumer){
        .tag = tag, .queue = queue, .tag_len = tag_len, .queue_len = queue_len, .no_ack = no_ack};
    (*n)++;
    return true;
}

static void consumer_remove(struct consumer *v, size_t *n, size_t i)
{
    free(v[i].tag);
    free(v[i].queue);
    memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(*v));
    (*n)--;
}

/* basic.consume from the client: with nowait (kombu for all but the last
 * queue) no consume-ok follows, so the consumer exists at once. */
static void remember_consume(struct achan *ch, const struct amqp_method *m)
{
    struct amqp_bytes t = m->consume.consumer_tag, q = m->consume.queue;
    char *tag = dup_bytes(t), *queue = dup_bytes(q);
    /* Shortstrs: the decoder read each one's length from one octet. */
    if (m->consume.nowait)
        consumer_push(&ch->consumers, &ch->n_consumers, tag, (uint8_t)t.len, queue, (uint8_t)q.len,
                      m->consume.no_ack);
    else
        consumer_push(&ch->pending, &ch->n_pending, tag, (uint8_t)t.len, queue, (uint8_t)q.len,
                      m->consume.no_ack);
}

/* consume-ok names the consumer: the pending consume with that tag, else
 * the oldest one that let the broker choose the tag. */
static void add_consumer(struct achan *ch, struct amqp_bytes tag)
{
    size_t i = 0;
    while (i < ch->n_pending && !consumer_is(&ch->pending[i], tag))
        i++;
    if (i == ch->n_pending)
        for (i = 0; i < ch->n_pending && ch->pending[i].tag_len != 0; i++)
            ;
    if (i == ch->n_pending)
        return; /* not a consume twice saw: nothing to learn */
    char *queue = ch->pending[i].queue;
    uint8_t queue_len = ch->pending[i].queue_len;
    bool no_ack = ch->pending[i].no_ack;
    ch->pending[i].queue = NULL;
    consumer_remove(ch->pending, &ch->n_pending, i);
    consumer_push(&ch->consumers, &ch->n_consumers, dup_bytes(tag), (uint8_t)tag.len, queue,
                  queue_len, no_ack);
}

static void drop_consumer(struct achan *ch, struct amqp_bytes tag)
{
    for (size_t i = 0; i < ch->n_consumers; i++) {
        if (consumer_is(&ch->consumers[i], tag)) {
            consumer_remove(ch->consumers, &ch->n_consumers, i);
            return;
        }
    }
}

/* Client closes a channel or the connection: what twice holds goes first. */
static void flush_before_close(struct achan *ch)
{
    held_release(ch, SIDE_CLIENT, true);
    release_all_held_acks(ch);
}

/* The client's connection.tune-ok or connection.close. */
static void connection_method(struct amqp_px *ax, const struct amqp_method *m)
{
    if (m->id == AMQP_CONNECTION_TUNE_OK) {
        uint32_t fm = m->tune.frame_max;
        ax->frame_max = fm == 0 || fm > AMQP_FRAME_MAX_LIMIT ? AMQP_FRAME_MAX_LIMIT : fm;
        session_set_read_limit(ax->s, SIDE_CLIENT, ax->frame_max + AMQP_FRAME_OVERHEAD);
        session_set_read_limit(ax->s, SIDE_UPSTREAM, ax->frame_max + AMQP_FRAME_OVERHEAD);
        return;
    }
    for (size_t i = 0; i < ax->n_chans; i++)
        flush_before_close(ax->chans[i]);
}

static void client_method(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m,
                          size_t len)
{
    switch (m->id) {
    case AMQP_CHANNEL_OPEN:
        if (ch->swallow_broker_close_ok) {
            /* Reopened before the broker confirmed twice's close: what
             * twice still sends it (the close among them) goes first, on
             * the channel's ordered path, and so does this open. */
            chan_forget(ch);
        } else {
            chan_reset(ch);
        }
        break;
    case AMQP_CHANNEL_CLOSE:
        flush_before_close(ch);
        break;
    case AMQP_CHANNEL_CLOSE_OK:
        chan_reset(ch);
        break;
    case AMQP_BASIC_CONSUME:
        remember_consume(ch, m);
        break;
    case AMQP_BASIC_CANCEL:
        if (m->consumer.nowait)
            drop_consumer(ch, m->consumer.consumer_tag);
        break;
    case AMQP_BASIC_GET:
        free(ch->get_queue);
        ch->get_queue = dup_bytes(m->get.queue);
        ch->get_no_ack = m->get.no_ack;
        break;
    case AMQP_BASIC_ACK:
    case AMQP_BASIC_NACK:
    case AMQP_BASIC_REJECT:
        on_settle(ax, ch, m, len);
        return;
    case AMQP_BASIC_RECOVER:
    case AMQP_BASIC_RECOVER_ASYNC:
        release_all_held_acks(ch);
        amqp_ledger_recover(ch->ledger);
        break;
    case AMQP_BASIC_PUBLISH:
        content_begin(ax, ch, SIDE_CLIENT, m, len);
        return;
    case AMQP_CONFIRM_SELECT:
        /* The broker numbers publishes from here on, in channel order;
         * with nowait there is no select-ok to wait for. */
        amqp_ledger_confirm_mode(ch->ledger);
        break;
    default:
        break;
    }
    forward(ch, SIDE_CLIENT, ax, len);
}

/* A broker basic.ack/nack in confirm mode: a publisher confirm. */
static void on_confirm(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m,
                       size_t len)
{
    struct amqp_plan plan;
    if (amqp_ledger_confirm_begin(ch->ledger, m->id == AMQP_BASIC_NACK, m->ack.delivery_tag,
                                  m->ack.multiple, &plan) != 0) {
        protocol_error(ax, "out of memory tracking confirms");
        return;
    }
    const struct rule *close_after = NULL;
    for (size_t i = 0; i < plan.n; i++) {
        struct msg_info *mi = plan.tags[i].info;
        journal_event(ax, JOURNAL_KIND_CONFIRM, mi, plan.tags[i].tag);
        size_t hits[SESSION_MAX_RULE_HITS];
        size_t n = decide_msg(ax, RULE_EV_CONFIRM, mi, NULL, NULL, hits);
        for (size_t k = 0; k < n; k++) {
            const struct rule *r = hit_rule(ax, hits[k]);
            if (r->action.kind == RULE_ACT_DROP)
                plan.tags[i].verdict = AMQP_V_DROP;
            else if (r->action.kind == RULE_ACT_CLOSE && r->action.close_when == RULE_CLOSE_BEFORE)
                return cut(ax, r, SIDE_UPSTREAM);
            else if (r->action.kind == RULE_ACT_CLOSE)
                close_after = r;
        }
    }
    int rc = apply_plan(ch, SIDE_UPSTREAM, &plan, amqp_ledger_confirm_commit, len);
    if (rc < 0)
        protocol_error(ax, "cannot rewrite a confirm: %s", amqp_ledger_strerror(rc));
    else if (close_after != NULL)
        cut(ax, close_after, SIDE_UPSTREAM);
}

static void broker_method(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m,
                          size_t len)
{
    switch (m->id) {
    case AMQP_CHANNEL_CLOSE:
        /* Whatever twice holds on the channel is void: the broker requeues
         * its deliveries, and the client's held frames would hit a closed
         * channel. */
        held_clear(ch, SIDE_CLIENT);
        held_clear(ch, SIDE_UPSTREAM);
        amqp_ledger_reset(ch->ledger);
        break;
    case AMQP_CHANNEL_CLOSE_OK:
        chan_reset(ch);
        break;
    case AMQP_BASIC_CONSUME_OK:
        add_consumer(ch, m->consumer.consumer_tag);
        break;
    case AMQP_BASIC_CANCEL: /* the broker cancels (queue deleted, ...) */
    case AMQP_BASIC_CANCEL_OK:
        drop_consumer(ch, m->consumer.consumer_tag);
        break;
    case AMQP_BASIC_GET_EMPTY:
        free(ch->get_queue);
        ch->get_queue = NULL;
        break;
    case AMQP_BASIC_DELIVER:
    case AMQP_BASIC_GET_OK:
    case AMQP_BASIC_RETURN:
        content_begin(ax, ch, SIDE_UPSTREAM, m, len);
        return;
    case AMQP_BASIC_ACK:
    case AMQP_BASIC_NACK:
        if (amqp_ledger_in_confirm_mode(ch->ledger)) {
            on_confirm(ax, ch, m, len);
            return;
        }
        break;
    default:
        break;
    }
    forward(ch, SIDE_UPSTREAM, ax, len);
}

/* ---- frames ------------------------------------------------------------ */

static void amqp_process(void *state, enum session_side from, struct evbuffer *in);

/* The broker finished closing the channel twice closed: the client's
 * reopen and what it sent after go through now, in order. */
static void replay_deferred(struct amqp_px *ax, struct achan *ch)
{
    if (evbuffer_get_length(ch->deferred) == 0)
        return;
    struct evbuffer *frames = evbuffer_new();
    if (frames == NULL) {
        protocol_error(ax, "out of memory");
        return;
    }
    evbuffer_add_buffer(frames, ch->deferred);
    amqp_process(ax, SIDE_CLIENT, frames); /* complete frames only */
    evbuffer_free(frames);
}

/* After twice closed a channel on its own (error action), each side is
 * answered by twice until its half of the close handshake is over: the
 * client's frames on the channel are dropped until it reopens it, and the
 * broker's until its close-ok.  Returns true when the frame was consumed. */
static bool closing_by_twice(struct amqp_px *ax, struct achan *ch, int from,
                             const struct amqp_method *m, size_t len)
{
    uint32_t id = m != NULL ? m->id : 0;
    uint8_t frame[32];
    if (m == NULL && ch->content[from].active)
        return false; /* the rest of the content twice refused: dropped there */
    settle(ax);
    struct evbuffer *in = ax->in;
    if (from == SIDE_CLIENT && evbuffer_get_length(ch->deferred) > 0) {
        evbuffer_remove_buffer(in, ch->deferred, len); /* behind the deferred open */
        return true;
    }
    if (from == SIDE_CLIENT && ch->closed_for_client) {
        if (id == AMQP_CHANNEL_OPEN) {
            ch->closed_for_client = false;
            if (!ch->swallow_broker_close_ok)
                return false; /* a new channel: forwarded */
            /* RabbitMQ refuses an open while its close handshake is not
             * over (504): the open, and what follows on the channel, wait
             * for the broker's close-ok. */
            evbuffer_remove_buffer(in, ch->deferred, len);
            return true;
        }
        if (id == AMQP_CHANNEL_CLOSE) {
            int n = amqp_encode_channel_close_ok(frame, sizeof(frame), ch->id);
            if (n > 0)
                evbuffer_add(ax->xfer[SIDE_CLIENT], frame, (size_t)n);
        }
        evbuffer_drain(in, len);
        return true;
    }
    if (from == SIDE_UPSTREAM && ch->swallow_broker_close_ok) {
        if (id == AMQP_CHANNEL_CLOSE_OK) {
            ch->swallow_broker_close_ok = false;
            evbuffer_drain(in, len);
            replay_deferred(ax, ch);
            return true;
        }
        if (id == AMQP_CHANNEL_CLOSE) {
            int n = amqp_encode_channel_close_ok(frame, sizeof(frame), ch->id);
            if (n > 0)
                evbuffer_add(ax->xfer[SIDE_UPSTREAM], frame, (size_t)n);
        }
        evbuffer_drain(in, len);
        return true;
    }
    return false;
}

/* closing_by_twice() when the channel is closing at all: its usual answer, no, without a call
 * per frame.  Frames are deferred only while the broker's close-ok is awaited, and replayed as
 * it comes: without swallow_broker_close_ok, none are. */
static inline bool closing(struct amqp_px *ax, struct achan *ch, int from,
                           const struct amqp_method *m, size_t len)
{
    if (!ch->swallow_broker_close_ok && !(from == SIDE_CLIENT && ch->closed_for_client))
        return false; /* the usual case */
    return closing_by_twice(ax, ch, from, m, len);
}

static void on_method(struct amqp_px *ax, int from, const struct amqp_frame *f, size_t len)
{
    struct amqp_method m;
    int rc = amqp_method_decode(f->payload, f->size, &m);
    if (rc != 0) {
        protocol_error(ax, "%s on channel %u: %s", from == SIDE_CLIENT ? "client" : "broker",
                       f->channel, amqp_strerror(rc));
        return;
    }
    if (f->channel == 0) {
        /* Only connection methods concern twice here; anything else on
         * channel 0 is the broker's to refuse (503/504). */
        if (m.id == AMQP_CONNECTION_CLOSE_OK && ax->closed_by < 0)
            ax->closed_by = (int)other((enum session_side)from);
        if (from == SIDE_CLIENT &&
            (m.id == AMQP_CONNECTION_TUNE_OK || m.id == AMQP_CONNECTION_CLOSE))
            connection_method(ax, &m);
        forward(NULL, from, ax, len);
        return;
    }
    struct achan *ch = chan_get(ax, f->channel, true);
    if (ch == NULL) {
        protocol_error(ax, "cannot track channel %u", f->channel);
        return;
    }
    if (closing(ax, ch, from, &m, len))
        return;
    if (from == SIDE_CLIENT)
        client_method(ax, ch, &m, len);
    else
        broker_method(ax, ch, &m, len);
}

static void on_frame(struct amqp_px *ax, int from, const struct amqp_frame *f, size_t len)
{
    if (f->type == AMQP_FRAME_METHOD) {
        on_method(ax, from, f, len);
        return;
    }
    if (f->type == AMQP_FRAME_HEARTBEAT || f->channel == 0) {
        forward(NULL, from, ax, len);
        return;
    }
    struct achan *ch = chan_get(ax, f->channel, true);
    if (ch == NULL) {
        protocol_error(ax, "cannot track channel %u", f->channel);
        return;
    }
    if (closing(ax, ch, from, NULL, len))
        return;
    if (f->type == AMQP_FRAME_HEADER)
        content_header(ax, ch, from, f, len);
    else
        content_body(ax, ch, from, f, len);
}

/* A body frame whose fate is known goes on by count: joining the run when
 * the first chain holds it (ax->win), else moved as chains from the head
 * of ax->in (no pull-up, no copy). */
static bool body_pass_on(struct amqp_px *ax, int from, const uint8_t *hdr, size_t len);

/* Only a body frame is asked about: the test inline, without a call per frame. */
static inline bool body_fast_path(struct amqp_px *ax, int from, const uint8_t *hdr, size_t len)
{
    return hdr[0] == AMQP_FRAME_BODY && body_pass_on(ax, from, hdr, len);
}

static bool body_pass_on(struct amqp_px *ax, int from, const uint8_t *hdr, size_t len)
{
    uint16_t id = (uint16_t)(hdr[1] << 8 | hdr[2]);
    struct achan *ch = chan_get(ax, id, false);
    if (ch == NULL || !ch->content[from].active || !ch->content[from].decided ||
        ch->content[from].fate != FATE_FORWARD || ch->held[from] != NULL || ch->closed_for_client ||
        ch->swallow_broker_close_ok)
        return false;
    uint8_t octet = 0;
    if (ax->win != NULL) {
        octet = hdr[len - 1];
    } else {
        struct evbuffer_ptr end;
        if (evbuffer_ptr_set(ax->in, &end, len - 1, EVBUFFER_PTR_SET) != 0 ||
            evbuffer_copyout_from(ax->in, &end, &octet, 1) != 1)
            return false;
    }
    if (octet != AMQP_FRAME_END)
        return false; /* the slow path reports it */
    uint64_t size = len - AMQP_FRAME_OVERHEAD;
    struct content *c = &ch->content[from];
    if (size > c->body_left)
        return false;
    c->body_left -= size;
    take(ax, ax->xfer[other((enum session_side)from)], len);
    if (c->body_left == 0)
        content_end(ax, ch, from);
    return true;
}

static bool protocol_header(struct amqp_px *ax, struct evbuffer *in)
{
    uint8_t hdr[AMQP_PROTOCOL_HEADER_SIZE];
    size_t have = evbuffer_copyout(in, hdr, sizeof(hdr)) < 0 ? 0 : evbuffer_get_length(in);
    int rc = amqp_protocol_header_check(hdr, have < sizeof(hdr) ? have : sizeof(hdr));
    if (rc == 0)
        return false;
    if (rc < 0) {
        protocol_error(ax, "client did not open with the AMQP 0-9-1 protocol header");
        return false;
    }
    evbuffer_remove_buffer(in, ax->xfer[SIDE_UPSTREAM], AMQP_PROTOCOL_HEADER_SIZE);
    ax->header_done = true;
    return true;
}

static void amqp_process(void *state, enum session_side from, struct evbuffer *in)
{
    struct amqp_px *ax = state;
    /* replay_deferred() processes a channel's deferred frames from inside
     * a read: the outer read has settled first (closing_by_twice), since
     * this call ends by clearing run, kept and window. */
    struct evbuffer *outer_in = ax->in;
    enum session_side outer_reading = ax->reading;
    ax->reading = from;
    ax->in = in;
    if (from == SIDE_CLIENT && !ax->header_done && !protocol_header(ax, in)) {
        send_flush(ax, SIDE_UPSTREAM);
        ax->in = outer_in;
        ax->reading = outer_reading;
        return;
    }
    while (alive(ax)) {
        /* Recomputed per frame: a tune-ok earlier in this read changes it. */
        uint32_t limit = ax->frame_max + AMQP_FRAME_SIZE_FUDGE;
        size_t off = ax->run + ax->kept;
        const uint8_t *hdr;
        if (ax->win != NULL) {
            if (ax->win_len - off < AMQP_FRAME_HEADER_SIZE) {
                settle(ax); /* the next frame starts beyond the first chain */
                continue;
            }
            hdr = ax->win + off;
        } else {
            if (evbuffer_get_length(in) < AMQP_FRAME_HEADER_SIZE)
                break;
            /* A view, not a copy: the first chain holds it but for a
             * frame header cut between two reads. */
            hdr = evbuffer_pullup(in, AMQP_FRAME_HEADER_SIZE);
            if (hdr == NULL) {
                protocol_error(ax, "out of memory");
                break;
            }
        }
        uint32_t size =
            (uint32_t)hdr[3] << 24 | (uint32_t)hdr[4] << 16 | (uint32_t)hdr[5] << 8 | hdr[6];
        if (size > amqp_frame_payload_max(limit)) {
            protocol_error(ax, "%s frame of %u bytes over frame_max %u",
                           from == SIDE_CLIENT ? "client" : "broker", size, ax->frame_max);
            break;
        }
        size_t len = (size_t)size + AMQP_FRAME_OVERHEAD;
        if (ax->win != NULL && ax->win_len - off < len) {
            settle(ax);
            continue;
        }
        if (ax->win == NULL) {
            if (evbuffer_get_length(in) < len)
                break;
            /* At the head, settled: a body frame over several chains moves
             * as chains; any other frame is pulled up into the first. */
            if (evbuffer_get_contiguous_space(in) < len) {
                if (body_fast_path(ax, from, hdr, len))
                    continue;
                hdr = evbuffer_pullup(in, (ev_ssize_t)len);
                if (hdr == NULL) {
                    protocol_error(ax, "out of memory");
                    break;
                }
            }
            ax->win = hdr;
            ax->win_len = evbuffer_get_contiguous_space(in);
        }
        if (body_fast_path(ax, from, hdr, len))
            continue;
        struct amqp_frame f;
        int rc = amqp_frame_parse(hdr, len, limit, &f);
        if (rc != 1) {
            protocol_error(ax, "%s sent a bad frame: %s", from == SIDE_CLIENT ? "client" : "broker",
                           amqp_strerror(rc));
            break;
        }
        on_frame(ax, from, &f, len);
    }
    if (alive(ax)) {
        send_flush(ax, SIDE_UPSTREAM); /* settles: the run and what is kept first */
        send_flush(ax, SIDE_CLIENT);
        if (alive(ax))
            held_limit(ax);
    }
    /* Cut: what was not sent is dropped with the session. */
    ax->run = ax->kept = 0;
    ax->kept_by = NULL;
    ax->win = NULL;
    ax->in = outer_in;
    ax->reading = outer_reading;
}

/* ---- codec ops --------------------------------------------------------- */

static void *amqp_open(struct session *s)
{
    struct amqp_px *ax = calloc(1, sizeof(*ax));
    if (ax == NULL)
        return NULL;
    ax->s = s;
    ax->frame_max = AMQP_FRAME_MIN_SIZE;
    ax->closed_by = -1;
    ax->xfer[0] = evbuffer_new();
    ax->xfer[1] = evbuffer_new();
    if (ax->xfer[0] == NULL || ax->xfer[1] == NULL) {
        if (ax->xfer[0] != NULL)
            evbuffer_free(ax->xfer[0]);
        if (ax->xfer[1] != NULL)
            evbuffer_free(ax->xfer[1]);
        free(ax);
        return NULL;
    }
    return ax;
}

static void amqp_stop(void *state)
{
    struct amqp_px *ax = state;
    ax->stopped = true;
    /* Timers may be on the stack: only disarm them here; free frees. */
    for (size_t i = 0; i < ax->n_chans; i++) {
        struct achan *ch = ax->chans[i];
        for (int d = 0; d < 2; d++)
            if (ch->held_timer[d] != NULL)
                event_del(ch->held_timer[d]);
    }
}

static void amqp_free(void *state)
{
    struct amqp_px *ax = state;
    for (size_t i = 0; i < ax->n_chans; i++)
        chan_free(ax->chans[i]);
    free(ax->chans);
    while (ax->spare != NULL) {
        struct msg_info *mi = ax->spare;
        ax->spare = mi->next_spare;
        free(mi);
    }
    evbuffer_free(ax->xfer[0]);
    evbuffer_free(ax->xfer[1]);
    free(ax);
}

/* The spare records beyond AMQP_PX_SPARE_IDLE more than those in use go
 * back to malloc (see AMQP_PX_SPARE_INFOS). */
static void amqp_tick(void *state)
{
    struct amqp_px *ax = state;
    while (ax->n_spare > AMQP_PX_SPARE_IDLE + ax->n_live) {
        struct msg_info *x = ax->spare;
        ax->spare = x->next_spare;
        ax->n_spare--;
        free(x);
    }
}

static int amqp_closed_by(void *state)
{
    return ((struct amqp_px *)state)->closed_by;
}

const struct codec_ops amqp_codec_ops = {
    .name = "amqp",
    .open = amqp_open,
    .stop = amqp_stop,
    .free = amqp_free,
    .process = amqp_process,
    .closed_by = amqp_closed_by,
    .tick = amqp_tick,
};
