/*
 * amqp_proxy.c - the AMQP 0-9-1 layer of a session: frames in, faults out.
 *
 * Bytes from each side are cut into frames (proto/amqp/amqp.h).  Frames twice
 * has no business with are handed on as they came, body frames by count
 * without being pulled up (no payload copy).  Methods that carry message
 * events (deliver, get-ok, publish, ack, nack, reject, publisher confirms)
 * are turned into rule-engine events at the point where the message is
 * known: a delivery or publish when its content header arrives (or its
 * whole body, when a rule matches on the body), a settlement per tag it
 * settles (proto/amqp/amqp_ledger.h keeps tags consistent on both ends).
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
 *
 * This file has the frames, methods and channels, sending, the rules and the
 * codec's ops; held frames and settlements are amqp_settle.c's, contents
 * amqp_content.c's (what they share: amqp_internal.h).
 */
#include "proxy/amqp/amqp_internal.h"

#include <assert.h>

/* ---- small helpers ----------------------------------------------------- */

uint64_t apx_now_ms(void)
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

struct msg_info *apx_info_new(struct achan *ch)
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
char *apx_info_dup(struct msg_info *mi, struct amqp_bytes b)
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
void apx_info_str_free(struct msg_info *mi, char *str)
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
    if (mi->late_timer != NULL) {
        if (evtimer_pending(mi->late_timer, NULL))
            mi->ch->ax->n_late--;
        event_free(mi->late_timer);
    }
    if (mi->hold_ack)
        mi->ch->ax->n_hold_ack--;
    if (mi->expire_rules != NULL)
        ruleset_put(mi->expire_rules);
    if (mi->ack_rules != NULL)
        ruleset_put(mi->ack_rules);
    if (mi->late_rules != NULL)
        ruleset_put(mi->late_rules);
    if (mi->heap_strs) {
        char *strs[] = {mi->queue,        mi->exchange,   mi->routing_key,
                        mi->consumer_tag, mi->message_id, mi->task};
        for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
            apx_info_str_free(mi, strs[i]);
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

enum session_side apx_other(enum session_side side)
{
    return side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
}

void apx_protocol_error(struct amqp_px *ax, const char *fmt, ...)
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
    enum session_side to = apx_other(ax->reading);
    apx_send_flush(ax, to);
    pump_abort(&ax->pump, SESSION_CLOSE_PROTOCOL_ERROR, to);
}

/* ---- the connection's phase (amqp_internal.h) ------------------------- */

static const char *const phase_names[] = {"header", "open", "closed", "stopped"};

/* The moves the diagram of enum apx_phase draws: a bit per phase a phase may go to. */
static const unsigned phase_moves[] = {
    [APX_HEADER] = LOG_STATE_BIT(APX_OPEN) | LOG_STATE_BIT(APX_STOPPED),
    [APX_OPEN] = LOG_STATE_BIT(APX_CLOSED) | LOG_STATE_BIT(APX_STOPPED),
    [APX_CLOSED] = LOG_STATE_BIT(APX_STOPPED),
    [APX_STOPPED] = LOG_STATE_BIT(APX_STOPPED),
};

bool apx_set_phase(struct amqp_px *ax, enum apx_phase to, enum session_side closed_by)
{
    if (!log_state_move("amqp phase", ax->s->id, NULL, phase_moves, phase_names, ax->phase, to))
        return false;
    ax->phase = to;
    if (to == APX_CLOSED)
        ax->closed_by = (int)closed_by; /* kept past STOPPED: the session asks then */
    return true;
}

bool apx_alive(const struct amqp_px *ax)
{
    return ax->phase != APX_STOPPED && ax->s->state == SESSION_RELAYING;
}

/* ---- channels ---------------------------------------------------------- */

/*
 * Runs (pump.h).  A frame that goes on unchanged (most of them: a publish, its header and body
 * once no rule wants it, a delivery, an ack) joins the run of the pump's in[reading], which
 * moves with one evbuffer call when something else needs the buffer's head or an out.  Frames
 * are parsed in place in the first chain (the pump's win[reading]) at the run's end.  The
 * first frames of a content (its method, its header) that wait for the decision stay in place
 * too, after the run (ax->kept): when the decision is to pass the content on, the run grows
 * over them, and they are copied nowhere.  The rule: code that takes bytes from the head of
 * in or adds to an out calls apx_settle() first, which moves the run, stashes what is kept,
 * and forgets the window; the frame being handled is then at the head of in, unless it has
 * joined what is kept.  Views into the frame stay valid across a apx_settle() that moves only
 * bytes before it (its chain keeps it), not past the frame's own move: once it has joined
 * what is kept, a apx_settle() copies it into the stash and drains it (content_header reads
 * the header's table in place only before anything can settle, in content_decide's call of
 * the rules).
 */
static int stash_put(struct amqp_px *ax, struct content *c, int from, size_t len);

void apx_settle(struct amqp_px *ax)
{
    (void)pump_settle(&ax->pump, ax->reading);
    if (ax->kept > 0) {
        struct content *c = ax->kept_by;
        size_t n = ax->kept;
        ax->kept = 0;
        ax->kept_by = NULL;
        if (!pump_failed(&ax->pump) && stash_put(ax, c, ax->reading, n) != 0)
            pump_fail(&ax->pump, "keeping a message's frames");
    }
}

/* The frame being handled (len bytes, read from ax->reading) goes on
 * unchanged toward dst (NULL: dropped). */
void apx_take(struct amqp_px *ax, struct evbuffer *dst, size_t len)
{
    struct pump *p = &ax->pump;
    bool out = dst == p->out[apx_other(ax->reading)];
    if (out && ax->kept == 0 && p->win[ax->reading].p != NULL) {
        pump_pass(p, ax->reading, len);
        return;
    }
    apx_settle(ax);
    if (out)
        (void)pump_forward(p, ax->reading, len); /* goes out now: may share */
    else if (dst != NULL)
        (void)pump_hold(p, ax->reading, len, dst); /* may wait: copied */
    else
        (void)pump_drop(p, ax->reading, len);
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
size_t apx_stash_len(const struct amqp_px *ax, const struct content *c)
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

/* The len bytes at the head of in[from] join the stash of content c (frames
 * from side `from`).  While c holds the small stash, its evbuffer is empty:
 * bytes go there only once the small stash was emptied into it and given
 * back.  -1 when out of memory. */
static int stash_put(struct amqp_px *ax, struct content *c, int from, size_t len)
{
    struct evbuffer *in = ax->pump.in[from];
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
    size_t had = evbuffer_get_length(c->stash); /* libevent does not check its copy */
    if (evbuffer_remove_buffer(in, c->stash, len) != (int)len)
        return -1;
    return evbuffer_get_length(c->stash) - had == len ? 0 : -1;
}

/* The frame being handled (len bytes) joins the stash of content c: kept
 * in place when the stash is empty or already kept there (nothing came
 * between: any other frame would have settled).  -1 when out of memory. */
int apx_stash_take(struct amqp_px *ax, struct content *c, size_t len)
{
    if (ax->kept_by == c) {
        ax->kept += len; /* the frame right after what is kept */
        return 0;
    }
    if (ax->kept == 0 && ax->pump.win[ax->reading].p != NULL && c->small_len == 0 &&
        stash_chain_len(c) == 0) {
        ax->kept_by = c;
        ax->kept = len;
        return 0;
    }
    apx_settle(ax);
    return stash_put(ax, c, ax->reading, len);
}

/* All of the stash, in order, to dst (NULL: dropped).  -1 when out of
 * memory. */
int apx_stash_move(struct amqp_px *ax, struct content *c, struct evbuffer *dst)
{
    if (ax->kept_by == c && dst == ax->pump.out[apx_other(ax->reading)]) {
        pump_pass(&ax->pump, ax->reading, ax->kept); /* passed on in place: copied nowhere */
        ax->kept = 0;
        ax->kept_by = NULL;
        return 0;
    }
    /* What is kept joins the stash; what came before goes out first. */
    if (ax->kept_by == c || dst != NULL)
        apx_settle(ax);
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

void apx_content_clear(struct amqp_px *ax, struct content *c)
{
    /* Each test spares a call that would change nothing: at a content's end its frames have
     * usually gone on and its info to the ledger. */
    if (c->small != NULL || c->stash_used || ax->kept_by == c)
        apx_stash_move(ax, c, NULL);
    /* Body bytes are collected only for a body matcher. */
    size_t n = c->needs_body && c->body != NULL ? evbuffer_get_length(c->body) : 0;
    if (n > 0)
        evbuffer_drain(c->body, n);
    if (c->info != NULL)
        info_free(c->info);
    if (c->headers_copy != NULL)
        free(c->headers_copy);
    if (c->copy != NULL)
        evbuffer_free(c->copy);
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
    apx_content_clear(ch->ax, &ch->content[SIDE_UPSTREAM]);
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
    apx_content_clear(ch->ax, &ch->content[SIDE_CLIENT]);
    held_clear(ch, SIDE_CLIENT);
    evbuffer_drain(ch->inject[SIDE_UPSTREAM], evbuffer_get_length(ch->inject[SIDE_UPSTREAM]));
    ch->injected[SIDE_UPSTREAM] = false;
    /* swallow_* and closed_for_client follow the close handshakes, not the
     * channel's content: they are cleared where those end. */
}

/* What chan_new() allocated, each part that it did (a channel half made when memory ran out
 * is freed here, never reset). */
static void chan_parts_free(struct achan *ch)
{
    if (ch->ledger != NULL)
        amqp_ledger_free(ch->ledger);
    for (int d = 0; d < 2; d++) {
        if (ch->content[d].stash != NULL)
            evbuffer_free(ch->content[d].stash);
        if (ch->content[d].body != NULL)
            evbuffer_free(ch->content[d].body);
        if (ch->held_timer[d] != NULL)
            event_free(ch->held_timer[d]);
        if (ch->inject[d] != NULL)
            evbuffer_free(ch->inject[d]);
    }
    if (ch->deferred != NULL)
        evbuffer_free(ch->deferred);
    free(ch->consumers);
    free(ch->pending);
    free(ch);
}

static void chan_free(struct achan *ch)
{
    chan_reset(ch);
    chan_parts_free(ch);
}

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
        ch->held_timer[d] = evtimer_new(ax->s->loop->base, apx_on_held_timer, ch);
        ok = ch->content[d].stash && ch->content[d].body && ch->inject[d] && ch->held_timer[d];
    }
    ch->deferred = evbuffer_new();
    ok = ok && ch->deferred != NULL;
    if (!ok) {
        chan_parts_free(ch);
        return NULL;
    }
    return ch;
}

static struct achan *chan_find(struct amqp_px *ax, uint16_t id, bool create);

/* The channel `id`, created when `create`; NULL if absent, past AMQP_PX_MAX_CHANNELS, or out
 * of memory (the pump stopped).  The last one asked for without a call: a frame's channel is
 * usually its neighbour's. */
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
    struct achan *ch = NULL;
    if (v != NULL) {
        ax->chans = v;
        ch = chan_new(ax, id);
    }
    if (ch == NULL) {
        pump_fail(&ax->pump, "tracking a channel");
        return NULL;
    }
    ax->chans[ax->n_chans++] = ch;
    return ch;
}

/* ---- sending ----------------------------------------------------------- */

/* Frames bound for `to` go out in order through the pump's out[to]. */
void apx_send_frames(struct amqp_px *ax, enum session_side to, struct evbuffer *frames)
{
    apx_settle(ax);
    (void)pump_inject_buffer(&ax->pump, to, frames);
}

void apx_send_flush(struct amqp_px *ax, enum session_side to)
{
    if (ax->kept > 0)
        apx_settle(ax); /* what is kept is stashed: the run ends before it */
    pump_flush(&ax->pump, to);
}

/* Frames twice writes on channel `ch` toward `to`: after any content of the
 * channel in flight in that direction (and after what twice holds there). */

/* Frames twice writes on channel `ch` toward `to` take the channel's one
 * ordered path (chan_out: behind what twice holds there), so the broker
 * sees every frame of a channel in the order the ledger produced them; only
 * a content sequence half through makes them wait (AMQP forbids other
 * frames of the channel inside one). */
void apx_chan_inject(struct achan *ch, enum session_side to, const uint8_t *frames, size_t len)
{
    enum session_side from = apx_other(to);
    if (ch->content[from].active) {
        evbuffer_add(ch->inject[to], frames, len);
        ch->injected[to] = true;
        return;
    }
    apx_settle(ch->ax);
    evbuffer_add(apx_chan_out(ch, from), frames, len);
}

/* A content sequence of `ch` from `from` ended: what twice wanted to write
 * on the channel meanwhile follows it. */
void apx_chan_unblock(struct achan *ch, enum session_side from)
{
    enum session_side to = apx_other(from);
    if (ch->injected[to] && !ch->content[from].active) {
        apx_settle(ch->ax);
        /* Cleared once they moved: else asked again at the next content's end. */
        ch->injected[to] = evbuffer_add_buffer(apx_chan_out(ch, from), ch->inject[to]) != 0;
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

void apx_event_from_info(struct engine_event *ev, enum rule_event kind, const struct msg_info *mi,
                         struct session *s, char *idbuf, size_t idlen)
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
 * looks at events of that kind, else only counted.  Writes the faults of the rules that fired
 * (SESSION_MAX_RULE_HITS at most) to `faults` and returns how many there are. */
size_t apx_decide_msg(struct amqp_px *ax, enum rule_event kind, const struct msg_info *mi,
                      const struct amqp_bytes *hdrs, struct evbuffer *body,
                      struct job_fault *faults)
{
    size_t hits[SESSION_MAX_RULE_HITS];
    if (!codec_wants(ax->s, kind)) {
        codec_count(ax->s, kind);
        return 0;
    }
    struct engine_event ev;
    char idbuf[64];
    apx_event_from_info(&ev, kind, mi, ax->s, idbuf, sizeof(idbuf));
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
    size_t n = decide(ax, &ev, hits);
    for (size_t i = 0; i < n; i++)
        faults[i] = rule_job_fault(ruleset_rule(ax->s->loop->rules, hits[i]));
    return n;
}

/* flags: APX_J_* (a NACK's requeue, a settlement kept back, a no-ack delivery). */
void apx_journal_event(struct amqp_px *ax, enum journal_kind kind, const struct msg_info *mi,
                       uint64_t tag, unsigned flags)
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
        r.retries = mi->retries;
        r.retry = kind == JOURNAL_KIND_PUBLISH && amqp_app_publish_is_retry(mi->retries);
    }
    r.retry |= kind == JOURNAL_KIND_NACK && (flags & APX_J_REQUEUE) != 0;
    r.kept_back = (flags & APX_J_KEPT_BACK) != 0;
    r.auto_ack = (flags & APX_J_AUTO_ACK) != 0;
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

/* Closes channel ch as the broker would, with `code` and `text` to the client: the broker's
 * side of it is closed by twice (which requeues every delivery unacked on it), the broker's
 * close-ok swallowed, and the ledger reset (held acks are discarded). */
void apx_close_channel(struct achan *ch, uint16_t code, const char *text, uint16_t class_id,
                       uint16_t method_id)
{
    uint8_t frame[AMQP_ENCODE_MAX];
    int n = amqp_encode_channel_close(frame, sizeof(frame), ch->id, code, amqp_cstr(text), class_id,
                                      method_id);
    if (n > 0)
        apx_chan_inject(ch, SIDE_CLIENT, frame, (size_t)n);
    n = amqp_encode_channel_close(frame, sizeof(frame), ch->id, 200, amqp_cstr("twice"), 0, 0);
    if (n > 0)
        apx_chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
    amqp_ledger_reset(ch->ledger);
    ch->swallow_broker_close_ok = true;
    ch->closed_for_client = true;
}

/* The broker refuses (a plan's error): the client's channel (or connection) is closed with
 * the rule's code and a RabbitMQ-like text.  Twice closes the broker's side of
 * the channel too, so the broker requeues its unacked deliveries as it
 * would after its own channel error, and swallows both close-oks. */
void apx_inject_error(struct amqp_px *ax, struct achan *ch, const struct amqp_plan_error *e)
{
    apx_settle(ax);
    const struct rule *r = e->rule;
    uint16_t code = e->code, class_id = e->class_id, method_id = e->method_id;
    char text[200];
    snprintf(text, sizeof(text), "%s - injected by twice rule '%s'", reply_name(code), r->name);
    uint8_t frame[AMQP_ENCODE_MAX];
    if (!soft_error(code) || ch == NULL || ch->id == 0) {
        int n = amqp_encode_connection_close(frame, sizeof(frame), code, amqp_cstr(text), class_id,
                                             method_id);
        if (n > 0)
            (void)pump_inject(&ax->pump, SIDE_CLIENT, frame, (size_t)n);
        apx_send_flush(ax, SIDE_UPSTREAM);
        apx_send_flush(ax, SIDE_CLIENT);
        session_set_error(ax->s, "connection closed with %u by rule '%s'", code, r->name);
        pump_abort(&ax->pump, SESSION_CLOSE_FAULT, SIDE_CLIENT);
        return;
    }
    apx_close_channel(ch, code, text, class_id, method_id);
}

/* `close before` / `close after` on an event read from side `from`: what
 * went through before the cut (earlier frames of the same read included)
 * still reaches the other side; the event's own frame only with `after`,
 * where the caller has already queued it. */
void apx_cut(struct amqp_px *ax, const struct rule *r, enum session_side from)
{
    session_set_error(ax->s, "cut by rule '%s' (close %s)", r->name,
                      r->action.close_when == RULE_CLOSE_BEFORE ? "before" : "after");
    apx_send_flush(ax, SIDE_CLIENT);
    apx_send_flush(ax, SIDE_UPSTREAM);
    pump_abort(&ax->pump, SESSION_CLOSE_FAULT, apx_other(from));
}

/* ---- methods ----------------------------------------------------------- */

static void forward(struct achan *ch, int from, struct amqp_px *ax, size_t len)
{
    apx_take(ax,
             ch != NULL ? apx_chan_out(ch, from) : ax->pump.out[apx_other((enum session_side)from)],
             len);
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

/* basic.consume from the client: with nowait (a client consuming several queues may set it on
 * all but the last) no consume-ok follows, so the consumer exists at once. */
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
    while (i < ch->n_pending && !apx_consumer_is(&ch->pending[i], tag))
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
        if (apx_consumer_is(&ch->consumers[i], tag)) {
            consumer_remove(ch->consumers, &ch->n_consumers, i);
            return;
        }
    }
}

/* Client closes a channel or the connection: what twice holds goes first. */
static void flush_before_close(struct achan *ch)
{
    apx_held_release(ch, SIDE_CLIENT, true);
    apx_release_all_held_acks(ch);
}

/* The client's connection.tune-ok or connection.close. */
static void connection_method(struct amqp_px *ax, const struct amqp_method *m)
{
    if (m->id == AMQP_CONNECTION_TUNE_OK) {
        uint32_t fm = m->tune.frame_max;
        ax->frame_max = fm == 0 || fm > AMQP_FRAME_MAX_LIMIT ? AMQP_FRAME_MAX_LIMIT : fm;
        pump_set_read_limit(&ax->pump, SIDE_CLIENT, ax->frame_max + AMQP_FRAME_OVERHEAD);
        pump_set_read_limit(&ax->pump, SIDE_UPSTREAM, ax->frame_max + AMQP_FRAME_OVERHEAD);
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
        apx_on_settle(ax, ch, m, len);
        return;
    case AMQP_BASIC_RECOVER:
    case AMQP_BASIC_RECOVER_ASYNC:
        apx_release_all_held_acks(ch);
        amqp_ledger_recover(ch->ledger);
        break;
    case AMQP_BASIC_PUBLISH:
        apx_content_begin(ax, ch, SIDE_CLIENT, m, len);
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
        pump_fail(&ax->pump, "tracking confirms");
        return;
    }
    const void *close_after = NULL;
    for (size_t i = 0; i < plan.n; i++) {
        struct msg_info *mi = plan.tags[i].info;
        apx_journal_event(ax, JOURNAL_KIND_CONFIRM, mi, plan.tags[i].tag, 0);
        struct job_fault f[SESSION_MAX_RULE_HITS];
        size_t n = apx_decide_msg(ax, RULE_EV_CONFIRM, mi, NULL, NULL, f);
        struct amqp_confirm_plan p = amqp_plan_confirm(f, n, &close_after);
        if (p.cut_before != NULL)
            return apx_cut(ax, p.cut_before, SIDE_UPSTREAM);
        if (p.drop)
            plan.tags[i].verdict = AMQP_V_DROP;
    }
    int rc = apx_apply_plan(ch, SIDE_UPSTREAM, &plan, amqp_ledger_confirm_commit, len);
    if (rc == AMQP_LEDGER_E_NOMEM)
        pump_fail(&ax->pump, "rewriting a confirm");
    else if (rc < 0)
        apx_protocol_error(ax, "cannot rewrite a confirm: %s", amqp_ledger_strerror(rc));
    else if (close_after != NULL)
        apx_cut(ax, close_after, SIDE_UPSTREAM);
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
        apx_content_begin(ax, ch, SIDE_UPSTREAM, m, len);
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
        pump_fail(&ax->pump, "replaying a channel's frames");
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
/* A frame (method `id`, len bytes) that `side` sent on a channel whose close twice is
 * finishing is dropped; a channel.close among them is answered with close-ok toward `side`,
 * as the peer would have. */
static void swallow_closing(struct amqp_px *ax, struct achan *ch, enum session_side side,
                            uint32_t id, size_t len)
{
    if (id == AMQP_CHANNEL_CLOSE) {
        uint8_t frame[32];
        int n = amqp_encode_channel_close_ok(frame, sizeof(frame), ch->id);
        if (n > 0)
            (void)pump_inject(&ax->pump, side, frame, (size_t)n);
    }
    (void)pump_drop(&ax->pump, side, len);
}

static bool closing_by_twice(struct amqp_px *ax, struct achan *ch, int from,
                             const struct amqp_method *m, size_t len)
{
    uint32_t id = m != NULL ? m->id : 0;
    if (m == NULL && ch->content[from].active)
        return false; /* the rest of the content twice refused: dropped there */
    apx_settle(ax);
    struct pump *p = &ax->pump;
    enum session_side side = (enum session_side)from;
    if (from == SIDE_CLIENT && evbuffer_get_length(ch->deferred) > 0) {
        (void)pump_hold(p, side, len, ch->deferred); /* behind the deferred open */
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
            (void)pump_hold(p, side, len, ch->deferred);
            return true;
        }
        swallow_closing(ax, ch, side, id, len);
        return true;
    }
    if (from == SIDE_UPSTREAM && ch->swallow_broker_close_ok) {
        if (id == AMQP_CHANNEL_CLOSE_OK) {
            ch->swallow_broker_close_ok = false;
            (void)pump_drop(p, side, len);
            replay_deferred(ax, ch);
            return true;
        }
        swallow_closing(ax, ch, side, id, len);
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
        apx_protocol_error(ax, "%s on channel %u: %s", from == SIDE_CLIENT ? "client" : "broker",
                           f->channel, amqp_strerror(rc));
        return;
    }
    if (f->channel == 0) {
        /* Only connection methods concern twice here; anything else on
         * channel 0 is the broker's to refuse (503/504). */
        if (m.id == AMQP_CONNECTION_CLOSE_OK && ax->phase == APX_OPEN)
            (void)apx_set_phase(ax, APX_CLOSED, apx_other((enum session_side)from));
        if (from == SIDE_CLIENT &&
            (m.id == AMQP_CONNECTION_TUNE_OK || m.id == AMQP_CONNECTION_CLOSE))
            connection_method(ax, &m);
        forward(NULL, from, ax, len);
        return;
    }
    struct achan *ch = chan_get(ax, f->channel, true);
    if (ch == NULL) {
        /* out of memory (the pump stopped), or past AMQP_PX_MAX_CHANNELS */
        if (!pump_failed(&ax->pump))
            apx_protocol_error(ax, "cannot track channel %u", f->channel);
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
        /* out of memory (the pump stopped), or past AMQP_PX_MAX_CHANNELS */
        if (!pump_failed(&ax->pump))
            apx_protocol_error(ax, "cannot track channel %u", f->channel);
        return;
    }
    if (closing(ax, ch, from, NULL, len))
        return;
    if (f->type == AMQP_FRAME_HEADER)
        apx_content_header(ax, ch, from, f, len);
    else
        apx_content_body(ax, ch, from, f, len);
}

/* A body frame whose fate is known goes on by count: joining the run when
 * the first chain holds it (the pump's window), else moved as chains from
 * the head of in (no pull-up, no copy). */
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
        ch->swallow_broker_close_ok || ch->content[from].copy != NULL)
        return false;
    uint8_t octet = 0;
    struct evbuffer *in = ax->pump.in[from];
    if (ax->pump.win[from].p != NULL) {
        octet = hdr[len - 1];
    } else {
        struct evbuffer_ptr end;
        if (evbuffer_ptr_set(in, &end, len - 1, EVBUFFER_PTR_SET) != 0 ||
            evbuffer_copyout_from(in, &end, &octet, 1) != 1)
            return false;
    }
    if (octet != AMQP_FRAME_END)
        return false; /* the slow path reports it */
    uint64_t size = len - AMQP_FRAME_OVERHEAD;
    struct content *c = &ch->content[from];
    if (size > c->body_left)
        return false;
    c->body_left -= size;
    apx_take(ax, ax->pump.out[apx_other((enum session_side)from)], len);
    if (c->body_left == 0)
        apx_content_end(ax, ch, from);
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
        apx_protocol_error(ax, "client did not open with the AMQP 0-9-1 protocol header");
        return false;
    }
    if (pump_forward(&ax->pump, SIDE_CLIENT, AMQP_PROTOCOL_HEADER_SIZE) != 0)
        return false;
    (void)apx_set_phase(ax, APX_OPEN, SIDE_CLIENT);
    return true;
}

/* How frame_at() left the next frame. */
enum frame_at { FRAME_READY, FRAME_AGAIN, FRAME_WAIT, FRAME_STOP };

/* The next whole frame of `in` (read from `from`, frames up to `limit` bytes): FRAME_READY
 * with *hdrp and *lenp its bytes, in the window over the first chain; FRAME_AGAIN when the
 * run was settled or a body frame went on as chains (look again); FRAME_WAIT when it is not
 * all here; FRAME_STOP when the session ended (an oversized frame, no memory). */
static enum frame_at frame_at(struct amqp_px *ax, struct evbuffer *in, enum session_side from,
                              uint32_t limit, const uint8_t **hdrp, size_t *lenp)
{
    struct pump_window *win = &ax->pump.win[from];
    size_t off = ax->pump.run[from] + ax->kept;
    const uint8_t *hdr;
    if (win->p != NULL) {
        if (win->len - off < AMQP_FRAME_HEADER_SIZE) {
            apx_settle(ax); /* the next frame starts beyond the first chain */
            return pump_failed(&ax->pump) ? FRAME_STOP : FRAME_AGAIN;
        }
        hdr = win->p + off;
    } else {
        if (evbuffer_get_length(in) < AMQP_FRAME_HEADER_SIZE)
            return FRAME_WAIT;
        /* A view, not a copy: the first chain holds it but for a frame header cut between two
         * reads. */
        hdr = evbuffer_pullup(in, AMQP_FRAME_HEADER_SIZE);
        if (hdr == NULL) {
            pump_fail(&ax->pump, "joining a frame's header");
            return FRAME_STOP;
        }
    }
    uint32_t size =
        (uint32_t)hdr[3] << 24 | (uint32_t)hdr[4] << 16 | (uint32_t)hdr[5] << 8 | hdr[6];
    if (size > amqp_frame_payload_max(limit)) {
        apx_protocol_error(ax, "%s frame of %u bytes over frame_max %u",
                           from == SIDE_CLIENT ? "client" : "broker", size, ax->frame_max);
        return FRAME_STOP;
    }
    size_t len = (size_t)size + AMQP_FRAME_OVERHEAD;
    if (win->p != NULL && win->len - off < len) {
        apx_settle(ax);
        return pump_failed(&ax->pump) ? FRAME_STOP : FRAME_AGAIN;
    }
    if (win->p == NULL) {
        if (evbuffer_get_length(in) < len)
            return FRAME_WAIT;
        /* At the head, settled: a body frame over several chains moves as chains; any other
         * frame is pulled up into the first. */
        if (evbuffer_get_contiguous_space(in) < len && body_fast_path(ax, from, hdr, len))
            return FRAME_AGAIN;
        if (pump_window_pullup(&ax->pump, from, len) == NULL)
            return FRAME_STOP; /* out of memory: the pump stopped */
        hdr = win->p;
    }
    *hdrp = hdr;
    *lenp = len;
    return FRAME_READY;
}

/* The frames of a read, walked and flushed. */
static void amqp_frames(struct amqp_px *ax, enum session_side from, struct evbuffer *in)
{
    while (apx_alive(ax)) {
        /* Recomputed per frame: a tune-ok earlier in this read changes it. */
        uint32_t limit = ax->frame_max + AMQP_FRAME_SIZE_FUDGE;
        const uint8_t *hdr;
        size_t len;
        enum frame_at at = frame_at(ax, in, from, limit, &hdr, &len);
        if (at == FRAME_AGAIN)
            continue;
        if (at != FRAME_READY)
            break;
        if (body_fast_path(ax, from, hdr, len))
            continue;
        struct amqp_frame f;
        int rc = amqp_frame_parse(hdr, len, limit, &f);
        if (rc != 1) {
            apx_protocol_error(ax, "%s sent a bad frame: %s",
                               from == SIDE_CLIENT ? "client" : "broker", amqp_strerror(rc));
            break;
        }
        on_frame(ax, from, &f, len);
    }
    if (apx_alive(ax)) {
        apx_send_flush(ax, SIDE_UPSTREAM); /* settles: the run and what is kept first */
        apx_send_flush(ax, SIDE_CLIENT);
        if (apx_alive(ax))
            apx_held_limit(ax);
    }
}

static void amqp_process(void *state, enum session_side from, struct evbuffer *in)
{
    struct amqp_px *ax = state;
    /* replay_deferred() processes a channel's deferred frames from inside
     * a read: the outer read has settled first (closing_by_twice), and the
     * pump gives the outer read back at the end. */
    enum session_side outer_reading = ax->reading;
    ax->reading = from;
    struct pump_read r;
    pump_read_begin(&ax->pump, from, in, &r);
    if (from == SIDE_CLIENT && ax->phase == APX_HEADER && !protocol_header(ax, in))
        apx_send_flush(ax, SIDE_UPSTREAM);
    else
        amqp_frames(ax, from, in);
    /* Cut: what was not sent is dropped with the session. */
    ax->kept = 0;
    ax->kept_by = NULL;
    pump_read_end(&ax->pump, from, &r);
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
    ax->phase = APX_HEADER;
    ax->closed_by = -1;
    if (pump_init(&ax->pump, s->port, s->port_ctx, PUMP_LEAVE_REST) != 0) {
        free(ax);
        return NULL;
    }
    return ax;
}

static void amqp_stop(void *state)
{
    struct amqp_px *ax = state;
    if (ax->phase != APX_STOPPED && ax->s->reason == SESSION_CLOSE_SHUTDOWN)
        apx_log_held_at_shutdown(ax);
    (void)apx_set_phase(ax, APX_STOPPED, SIDE_CLIENT);
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
    pump_free(&ax->pump);
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
    .pending = apx_pending,
    .drain = apx_drain,
    .busy = apx_busy,
};
