/*
 * pump.c - the one frame pump under every protocol codec (see pump.h).
 */
#include "proxy/net/pump.h"

#include "proxy/net/codec.h"

int pump_init(struct pump *p, const struct pump_port *port, void *ctx, enum pump_rest rest)
{
    *p = (struct pump){.port = port, .ctx = ctx};
    for (int i = 0; i < 2; i++) {
        p->out[i] = evbuffer_new();
        if (rest == PUMP_KEEP_REST)
            p->own[i] = p->in[i] = evbuffer_new();
        if (p->out[i] == NULL || (rest == PUMP_KEEP_REST && p->own[i] == NULL)) {
            pump_free(p);
            return -1;
        }
    }
    return 0;
}

void pump_free(struct pump *p)
{
    for (int i = 0; i < 2; i++) {
        if (p->out[i] != NULL)
            evbuffer_free(p->out[i]);
        if (p->own[i] != NULL)
            evbuffer_free(p->own[i]);
        p->out[i] = p->own[i] = p->in[i] = NULL;
    }
}

void pump_fail(struct pump *p, const char *what)
{
    if (p->failed != NULL)
        return;
    p->failed = what;
    /* A move that failed part-way may have left half a frame in out[]: nothing batched is
     * written, and the session goes with it. */
    for (int i = 0; i < 2; i++) {
        p->run[i] = 0;
        p->win[i] = (struct pump_window){0};
        if (p->out[i] != NULL)
            (void)evbuffer_drain(p->out[i], evbuffer_get_length(p->out[i]));
    }
    p->port->fail(p->ctx, what);
}

void pump_read_begin(struct pump *p, enum session_side from, struct evbuffer *in,
                     struct pump_read *saved)
{
    *saved = (struct pump_read){
        .in = p->in[from], .run = p->run[from], .win = p->win[from], .borrowed = true};
    p->win[from].p = NULL;
    struct evbuffer *own = p->own[from];
    if (own == NULL) {
        /* PUMP_LEAVE_REST: the read is walked where it is, from its head. */
        p->in[from] = in;
        p->run[from] = 0;
        return;
    }
    if (evbuffer_get_length(own) > 0) {
        /* Something waits from before (a message cut short, with a run before it): the read
         * completes it, and the run stays where it is. */
        saved->borrowed = false;
        if (evbuffer_add_buffer(own, in) != 0)
            pump_fail(p, "taking a read");
        return;
    }
    /* Nothing waits (the usual case, and the run is empty): the read is walked where it is,
     * and only what is left of it moves, at the end. */
    p->in[from] = in;
}

void pump_read_end(struct pump *p, enum session_side from, const struct pump_read *saved)
{
    struct evbuffer *in = p->in[from];
    p->win[from].p = NULL;
    if (p->own[from] == NULL) {
        p->in[from] = saved->in;
        p->run[from] = saved->run;
        p->win[from] = saved->win;
        return;
    }
    /* Back to the pump's own buffer before anything else can run (a timer, the free); what
     * the read left (the run too, whose offset stays right: own was empty) moves there. */
    p->in[from] = p->own[from];
    if (saved->borrowed && p->failed == NULL && evbuffer_get_length(in) > 0 &&
        evbuffer_add_buffer(p->own[from], in) != 0)
        pump_fail(p, "keeping what a read left");
}

const struct pump_window *pump_window(struct pump *p, enum session_side from)
{
    struct pump_window *w = &p->win[from];
    if (w->p != NULL)
        return w;
    if (p->failed != NULL || p->in[from] == NULL)
        return NULL;
    size_t contig = evbuffer_get_contiguous_space(p->in[from]);
    if (contig == 0)
        return NULL;
    w->p = evbuffer_pullup(p->in[from], (ev_ssize_t)contig); /* no copy: one chain */
    w->len = w->p != NULL ? contig : 0;
    return w->p != NULL ? w : NULL;
}

int pump_settle(struct pump *p, enum session_side from)
{
    p->win[from].p = NULL;
    if (p->failed != NULL)
        return -1;
    size_t n = p->run[from];
    if (n == 0)
        return 0;
    p->run[from] = 0;
    if (codec_move(p->in[from], p->out[pump_other(from)], n) != 0) {
        pump_fail(p, "passing frames on");
        return -1;
    }
    return 0;
}

/* Settles the run of in[from] and checks that n bytes follow it. */
static int take_ready(struct pump *p, enum session_side from, size_t n, const char *what)
{
    if (pump_settle(p, from) != 0)
        return -1;
    if (evbuffer_get_length(p->in[from]) < n) {
        pump_fail(p, what); /* a codec that took more than it read: never on the wire */
        return -1;
    }
    return 0;
}

int pump_forward(struct pump *p, enum session_side from, size_t n)
{
    if (take_ready(p, from, n, "forwarding a frame") != 0)
        return -1;
    if (codec_move(p->in[from], p->out[pump_other(from)], n) != 0) {
        pump_fail(p, "forwarding a frame");
        return -1;
    }
    return 0;
}

int pump_drop(struct pump *p, enum session_side from, size_t n)
{
    if (take_ready(p, from, n, "dropping a frame") != 0)
        return -1;
    (void)evbuffer_drain(p->in[from], n); /* fails only on a frozen buffer: never an input */
    return 0;
}

int pump_hold(struct pump *p, enum session_side from, size_t n, struct evbuffer *dst)
{
    if (take_ready(p, from, n, "holding a frame") != 0)
        return -1;
    /* Copied: the frame waits, and a shared chain would keep the whole read.  What dst
     * gained is checked, as codec_move() does: libevent does not check its copy. */
    size_t had = evbuffer_get_length(dst);
    if (evbuffer_remove_buffer(p->in[from], dst, n) != (int)n ||
        evbuffer_get_length(dst) - had != n) {
        pump_fail(p, "holding a frame");
        return -1;
    }
    return 0;
}

int pump_inject(struct pump *p, enum session_side to, const void *data, size_t len)
{
    if (pump_settle(p, pump_other(to)) != 0)
        return -1;
    if (evbuffer_add(p->out[to], data, len) != 0) {
        pump_fail(p, "adding a frame of twice's own");
        return -1;
    }
    return 0;
}

int pump_inject_buffer(struct pump *p, enum session_side to, struct evbuffer *buf)
{
    if (pump_settle(p, pump_other(to)) != 0)
        return -1;
    if (evbuffer_add_buffer(p->out[to], buf) != 0) {
        pump_fail(p, "adding frames twice held or made");
        return -1;
    }
    return 0;
}

void pump_flush(struct pump *p, enum session_side to)
{
    enum session_side from = pump_other(to);
    if (p->failed != NULL)
        return;
    size_t run = p->run[from];
    if (run > 0 && evbuffer_get_length(p->out[to]) == 0 &&
        evbuffer_get_length(p->in[from]) == run) {
        /* The usual end of a read: all of it goes on as it came, and nothing waits before
         * it.  Handed on from in, not moved through out. */
        p->win[from].p = NULL;
        p->run[from] = 0;
        (void)p->port->send(p->ctx, to, p->in[from]);
        return;
    }
    if (pump_settle(p, from) == 0 && evbuffer_get_length(p->out[to]) > 0)
        (void)p->port->send(p->ctx, to, p->out[to]);
}

void pump_abort(struct pump *p, enum session_close_reason reason, int flush_to)
{
    if (p->failed == NULL)
        p->port->abort(p->ctx, reason, flush_to);
}

void pump_hold_reading(struct pump *p, enum session_side side, bool hold)
{
    if (p->failed == NULL)
        p->port->hold_reading(p->ctx, side, hold);
}

void pump_set_read_limit(struct pump *p, enum session_side side, size_t bytes)
{
    if (p->failed == NULL)
        p->port->set_read_limit(p->ctx, side, bytes);
}

const struct pump_window *pump_window_pullup(struct pump *p, enum session_side from, size_t len)
{
    struct pump_window *w = &p->win[from];
    if (p->failed != NULL)
        return NULL;
    if (evbuffer_get_length(p->in[from]) < len) {
        w->p = NULL;
        return NULL;
    }
    w->p = evbuffer_pullup(p->in[from], (ev_ssize_t)len);
    if (w->p == NULL) {
        pump_fail(p, "joining a frame's pieces");
        return NULL;
    }
    w->len = evbuffer_get_contiguous_space(p->in[from]);
    return w;
}
