/*
 * shaper.c - stream faults on one direction of a session.  See shaper.h.
 *
 * Held bytes sit in one evbuffer; a queue of (due time, length) records
 * when each chunk may leave (latency).  pump() releases what is due, within
 * the token bucket (bandwidth) and one slice at a time (slice), by moving
 * evbuffer chains to the other side's output: payload bytes are not copied.
 * One timer wakes the shaper for the next due chunk, token or slice.
 */
#include "proxy/net/shaper.h"

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/net/session.h"
#include "rules/toxic_stream.h"

struct chunk {
    uint64_t due_ms;
    size_t len;
};

struct shaper {
    struct session *s;
    int from;
    struct stream_fx fx;
    struct evbuffer *held;
    struct chunk *q; /* ring of chunks, oldest at head */
    size_t q_head, q_len, q_cap;
    uint64_t last_due_ms;
    struct event *timer;
    double tokens; /* bandwidth */
    uint64_t tokens_at_ms;
    bool slice_waiting; /* a slice is still in the output */
    uint64_t passed;    /* bytes accepted, for `limit` */
    bool eof;           /* `from` sent EOF */
    bool eof_done;
    bool limit_reached; /* `limit` let its bytes in: close once they left */
    bool limit_done;
    uint64_t eof_at_ms; /* slow-close: when the EOF may go on */
    uint64_t rng;       /* jitter */
    uint64_t next_slice_us;
    size_t slice_len;           /* size of the slice under way, 0: none drawn */
    struct toxic_slicer slicer; /* slice halving: the pieces of the chunk under way */
    struct event *deadline;     /* timeout's close, reset-peer's reset */
    bool reset_triggered;       /* reset-peer saw its first bytes */
    bool deadline_reset;        /* the deadline resets (else it closes) */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t next_random(struct shaper *sh)
{
    /* xorshift64*: deterministic per session, good enough for jitter. */
    sh->rng ^= sh->rng >> 12;
    sh->rng ^= sh->rng << 25;
    sh->rng ^= sh->rng >> 27;
    return sh->rng * 0x2545f4914f6cdd1dULL;
}

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void on_deadline(evutil_socket_t fd, short what, void *arg);
static void arm_timeout(struct shaper *sh);

struct shaper *shaper_new(struct session *s, int from, const struct stream_fx *fx,
                          uint64_t jitter_seed)
{
    struct shaper *sh = calloc(1, sizeof(*sh));
    if (sh == NULL)
        return NULL;
    sh->s = s;
    sh->from = from;
    sh->fx = *fx;
    sh->rng = jitter_seed | 1;
    sh->held = evbuffer_new();
    sh->timer = evtimer_new(s->loop->base, on_timer, sh);
    sh->deadline = evtimer_new(s->loop->base, on_deadline, sh);
    if (sh->held == NULL || sh->timer == NULL || sh->deadline == NULL) {
        shaper_free(sh);
        return NULL;
    }
    sh->tokens = 0; /* no initial burst: the first byte already waits its turn */
    sh->tokens_at_ms = now_ms();
    toxic_slicer_init(&sh->slicer, (int64_t)fx->slice_bytes, fx->slice_variation);
    arm_timeout(sh);
    return sh;
}

void shaper_free(struct shaper *sh)
{
    if (sh == NULL)
        return;
    if (sh->timer != NULL)
        event_free(sh->timer);
    if (sh->deadline != NULL)
        event_free(sh->deadline);
    if (sh->held != NULL)
        evbuffer_free(sh->held);
    free(sh->q);
    free(sh);
}

void shaper_stop(struct shaper *sh)
{
    if (sh->timer != NULL)
        event_del(sh->timer);
    if (sh->deadline != NULL)
        event_del(sh->deadline);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct shaper *sh = arg;
    session_shaper_toxic(sh->s, sh->from, sh->fx.toxic_rule, sh->deadline_reset);
}

static void arm_deadline(struct shaper *sh, uint32_t ms, bool reset)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    sh->deadline_reset = reset;
    evtimer_add(sh->deadline, &tv);
}

/* `timeout T`: the connection closes T after the toxic came (0: never). */
static void arm_timeout(struct shaper *sh)
{
    if (sh->fx.has_timeout && sh->fx.timeout_ms != 0)
        arm_deadline(sh, sh->fx.timeout_ms, false);
}

size_t shaper_held(const struct shaper *sh)
{
    return evbuffer_get_length(sh->held);
}

static int queue_push(struct shaper *sh, uint64_t due, size_t len)
{
    /* Toxiproxy's slicer cuts each chunk read on its own: keep them apart. */
    if (sh->q_len > 0 && !sh->fx.slice_halving) {
        struct chunk *tail = &sh->q[(sh->q_head + sh->q_len - 1) % sh->q_cap];
        if (tail->due_ms == due) {
            tail->len += len;
            return 0;
        }
    }
    if (sh->q_len == sh->q_cap) {
        size_t cap = sh->q_cap ? sh->q_cap * 2 : 16;
        struct chunk *q = malloc(cap * sizeof(*q));
        if (q == NULL)
            return -1;
        for (size_t i = 0; i < sh->q_len; i++)
            q[i] = sh->q[(sh->q_head + i) % sh->q_cap];
        free(sh->q);
        sh->q = q;
        sh->q_cap = cap;
        sh->q_head = 0;
    }
    sh->q[(sh->q_head + sh->q_len) % sh->q_cap] = (struct chunk){.due_ms = due, .len = len};
    sh->q_len++;
    return 0;
}

/* Bytes at the head of the queue that are due at `now`. */
static size_t due_bytes(const struct shaper *sh, uint64_t now)
{
    size_t n = 0;
    for (size_t i = 0; i < sh->q_len; i++) {
        const struct chunk *c = &sh->q[(sh->q_head + i) % sh->q_cap];
        if (c->due_ms > now)
            break;
        n += c->len;
    }
    return n;
}

static void queue_consume(struct shaper *sh, size_t n)
{
    while (n > 0 && sh->q_len > 0) {
        struct chunk *c = &sh->q[sh->q_head];
        size_t take = n < c->len ? n : c->len;
        c->len -= take;
        n -= take;
        if (c->len == 0) {
            sh->q_head = (sh->q_head + 1) % sh->q_cap;
            sh->q_len--;
        }
    }
}

static void arm(struct shaper *sh, uint64_t at_ms, uint64_t now)
{
    uint64_t wait = at_ms > now ? at_ms - now : 0;
    struct timeval tv = {.tv_sec = (time_t)(wait / 1000),
                         .tv_usec = (suseconds_t)(wait % 1000) * 1000};
    evtimer_add(sh->timer, &tv);
}

/* How many of `want` bytes the token bucket allows now; 0 arms the timer. */
static size_t bandwidth_allows(struct shaper *sh, size_t want, uint64_t now)
{
    if (sh->fx.bandwidth_hold)
        return 0; /* shaper_set_fx() pumps again when the faults change */
    if (sh->fx.rate_bps == 0)
        return want;
    double rate = (double)sh->fx.rate_bps;
    sh->tokens += rate * (double)(now - sh->tokens_at_ms) / 1000.0;
    /* A burst of at most 50 ms of traffic (and one MTU): the rate holds
     * over any window a user would measure. */
    double burst = rate / 20.0 > 1500.0 ? rate / 20.0 : 1500.0;
    if (sh->tokens > burst)
        sh->tokens = burst;
    sh->tokens_at_ms = now;
    size_t n = sh->tokens >= (double)want ? want : (size_t)sh->tokens;
    if (n == 0) {
        /* Wake when a useful amount (1 ms worth, at least one byte) is in. */
        uint64_t ms = (uint64_t)(((double)want < rate / 1000.0 ? (double)want : rate / 1000.0) /
                                 rate * 1000.0) +
                      1;
        arm(sh, now + ms, now);
    }
    return n;
}

/* Once the bytes `limit` let through have left, the connection is cut.
 * Returns true when it was. */
static bool maybe_cut(struct shaper *sh)
{
    if (!sh->limit_reached || sh->limit_done || evbuffer_get_length(sh->held) > 0)
        return false;
    sh->limit_done = true;
    session_shaper_limit(sh->s, sh->from, sh->fx.limit_rule, sh->fx.limit_bytes);
    return true;
}

static void maybe_pass_eof(struct shaper *sh, uint64_t now)
{
    if (!sh->eof || sh->eof_done || evbuffer_get_length(sh->held) > 0)
        return;
    if (sh->fx.slice_halving) {
        /* Toxiproxy's slicer waits `delay` after its last piece too, before the end of stream. */
        uint64_t us = now_us();
        if (sh->next_slice_us > us) {
            arm(sh, now + (sh->next_slice_us - us + 999) / 1000, now);
            return;
        }
    }
    if (sh->fx.has_slow_close && sh->eof_at_ms == 0) {
        sh->eof_at_ms = now + sh->fx.slow_close_ms;
        if (sh->eof_at_ms == 0)
            sh->eof_at_ms = 1;
    }
    if (sh->eof_at_ms > now) {
        arm(sh, sh->eof_at_ms, now);
        return;
    }
    sh->eof_done = true;
    session_shaper_eof(sh->s, sh->from);
}

static uint64_t slicer_draw(void *arg)
{
    return next_random(arg);
}

/* The size of the next slice: N, or with slice halving the next piece of the chunk at the head
 * of the queue (the only chunk due bytes can start in). */
static size_t slice_size(struct shaper *sh)
{
    if (!sh->fx.slice_halving)
        return (size_t)sh->fx.slice_bytes;
    uint64_t head = sh->q[sh->q_head].len;
    return (size_t)toxic_slicer_next(&sh->slicer, head, slicer_draw, sh);
}

/* Release what may leave now. */
static void pump(struct shaper *sh)
{
    struct evbuffer *out = session_peer_output(sh->s, sh->from);
    if (out == NULL)
        return;
    uint64_t now = now_ms();
    for (;;) {
        size_t n = due_bytes(sh, now);
        if (n == 0) {
            if (sh->q_len > 0)
                arm(sh, sh->q[sh->q_head].due_ms, now);
            break;
        }
        if (sh->fx.slice_bytes != 0) {
            if (sh->slice_waiting || session_peer_pending(sh->s, sh->from) > 0) {
                sh->slice_waiting = true;
                session_want_output_drained(sh->s, sh->from);
                return;
            }
            uint64_t us = now_us();
            if (sh->next_slice_us > us) {
                uint64_t wait_ms = (sh->next_slice_us - us + 999) / 1000;
                arm(sh, now + wait_ms, now);
                return;
            }
            if (sh->slice_len == 0)
                sh->slice_len = slice_size(sh);
            if (n > sh->slice_len)
                n = sh->slice_len;
        }
        n = bandwidth_allows(sh, n, now);
        if (n == 0)
            return;
        evbuffer_remove_buffer(sh->held, out, n);
        session_peer_output_added(sh->s, sh->from);
        queue_consume(sh, n);
        if (sh->fx.rate_bps != 0)
            sh->tokens -= (double)n;
        if (sh->fx.slice_bytes != 0) {
            if (sh->fx.slice_halving)
                toxic_slicer_took(&sh->slicer, n);
            sh->slice_waiting = true;
            sh->slice_len = 0;
            sh->next_slice_us =
                now_us() + (uint64_t)sh->fx.slice_delay_ms * 1000 + sh->fx.slice_delay_us;
            session_want_output_drained(sh->s, sh->from);
            return;
        }
    }
    if (!maybe_cut(sh))
        maybe_pass_eof(sh, now);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pump(arg);
}

bool shaper_waiting(const struct shaper *sh)
{
    return sh->slice_waiting;
}

void shaper_output_drained(struct shaper *sh)
{
    if (!sh->slice_waiting)
        return;
    sh->slice_waiting = false;
    pump(sh);
}

static uint64_t jitter_due(struct shaper *sh, uint64_t now)
{
    int64_t d = sh->fx.latency_ms;
    if (sh->fx.jitter_ms != 0) {
        uint64_t span = 2 * (uint64_t)sh->fx.jitter_ms + 1;
        d += (int64_t)(next_random(sh) % span) - (int64_t)sh->fx.jitter_ms;
    }
    uint64_t due = d > 0 ? now + (uint64_t)d : now;
    /* Chunks leave in order: a later chunk never overtakes an earlier one. */
    if (due < sh->last_due_ms)
        due = sh->last_due_ms;
    sh->last_due_ms = due;
    return due;
}

void shaper_push(struct shaper *sh, struct evbuffer *in)
{
    size_t n = evbuffer_get_length(in);
    if (n == 0)
        return;
    if (sh->limit_reached) {
        evbuffer_drain(in, n); /* past the limit: the connection is being cut */
        return;
    }
    if (sh->fx.has_limit && sh->passed + n >= sh->fx.limit_bytes) {
        /* The bytes up to the limit still go through the other faults. */
        n = (size_t)(sh->fx.limit_bytes - sh->passed);
        sh->limit_reached = true;
    }
    sh->passed += n;
    if (sh->fx.has_reset_peer && !sh->reset_triggered) {
        /* Toxiproxy's reset_peer takes the first bytes, waits, and resets. */
        sh->reset_triggered = true;
        arm_deadline(sh, sh->fx.reset_peer_ms, true);
    }
    if (sh->fx.has_timeout)
        arm_timeout(sh); /* Toxiproxy's timeout counts from the last bytes it dropped */
    if (sh->fx.blackhole || sh->fx.has_timeout || sh->reset_triggered) {
        evbuffer_drain(in, evbuffer_get_length(in));
        maybe_cut(sh);
        return;
    }
    uint64_t now = now_ms();
    if (queue_push(sh, jitter_due(sh, now), n) != 0) {
        session_shaper_limit(sh->s, sh->from, NULL, 0);
        return;
    }
    evbuffer_remove_buffer(in, sh->held, n);
    evbuffer_drain(in, evbuffer_get_length(in)); /* past the limit */
    pump(sh);
}

void shaper_set_fx(struct shaper *sh, const struct stream_fx *fx)
{
    struct stream_fx was = sh->fx;
    sh->fx = *fx;
    if (was.has_timeout && !fx->has_timeout) {
        /* Toxiproxy closes a connection whose timeout toxic goes (its Cleanup). */
        sh->fx.toxic_rule = was.toxic_rule;
        session_shaper_toxic(sh->s, sh->from, was.toxic_rule, false);
        return;
    }
    if (fx->has_limit && (!was.has_limit || was.limit_bytes != fx->limit_bytes)) {
        sh->passed = 0;
        sh->limit_reached = false;
    }
    if (fx->has_timeout != was.has_timeout || fx->timeout_ms != was.timeout_ms ||
        fx->has_reset_peer != was.has_reset_peer) {
        event_del(sh->deadline);
        sh->reset_triggered = false;
        arm_timeout(sh);
    }
    /* Held bytes leave no later than the new latency would have them leave. */
    uint64_t now = now_ms(), latest = now + fx->latency_ms + fx->jitter_ms;
    for (size_t i = 0; i < sh->q_len; i++) {
        struct chunk *c = &sh->q[(sh->q_head + i) % sh->q_cap];
        if (c->due_ms > latest)
            c->due_ms = latest;
    }
    if (sh->last_due_ms > latest)
        sh->last_due_ms = latest;
    sh->tokens_at_ms = now;
    sh->slice_len = 0;
    toxic_slicer_init(&sh->slicer, (int64_t)fx->slice_bytes, fx->slice_variation);
    if (fx->slice_bytes == 0)
        sh->next_slice_us = 0;
    if (!sh->slice_waiting)
        pump(sh);
}

bool shaper_eof_passed(const struct shaper *sh)
{
    return sh->eof_done;
}

void shaper_eof(struct shaper *sh)
{
    sh->eof = true;
    maybe_pass_eof(sh, now_ms());
}
