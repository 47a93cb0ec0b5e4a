/*
 * fake_pump.h - a pump's port with no socket (proxy/net/pump.h): what each side would have
 * received is kept in got[side], and an abort or a failure is noted (and, when the port has a
 * session, moves it as session_close()/session_abort() would, so that a codec sees it is no
 * longer relaying).  With it a unit test drives a pump, or a whole codec, and reads what went
 * where.
 *
 * It brings the failing allocator (failalloc.h) and routes libevent's own allocations through
 * it (kit_libevent_counted()), so that an evbuffer's allocation fails at its turn too.
 *
 * Header-only: include it after <cmocka.h>, before golden.h and text.h.
 */
#ifndef TWICE_KIT_FAKE_PUMP_H
#define TWICE_KIT_FAKE_PUMP_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/net/pump.h"
#include "proxy/net/session.h"
#include "tests/lib/failalloc.h"

struct fake_port {
    struct evbuffer *got[2]; /* what each side received, in order */
    struct session *s;       /* NULL: a pump alone */
    unsigned sends;
    bool closed;
    enum session_close_reason reason;
    int flush_to;
    const char *failed; /* what the pump was doing when memory ran out */
    bool holding[2];
    size_t read_limit[2];
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

/* The port's own allocations are the test's, not the code's under test: never failed. */
static bool fake_port_unarmed(void)
{
    bool was = kit_alloc.armed;
    kit_alloc.armed = false;
    return was;
}

/* The session's end, as session_abort() and session_close() would leave it. */
static void fake_port_end(struct fake_port *fp, enum session_close_reason reason, int flush_to)
{
    fp->closed = true;
    fp->reason = reason;
    fp->flush_to = flush_to;
    if (fp->s != NULL && fp->s->state == SESSION_RELAYING) {
        fp->s->reason = reason;
        (void)session_set_state(fp->s, flush_to >= 0 ? SESSION_DRAINING : SESSION_CLOSED);
    }
}

static int fake_port_send(void *ctx, enum session_side to, struct evbuffer *buf)
{
    struct fake_port *fp = ctx;
    bool armed = fake_port_unarmed();
    int rc = fp->closed ? -1 : evbuffer_add_buffer(fp->got[to], buf);
    kit_alloc.armed = armed;
    if (rc != 0) {
        (void)evbuffer_drain(buf, evbuffer_get_length(buf));
        return -1;
    }
    fp->sends++;
    return 0;
}

static void fake_port_abort(void *ctx, enum session_close_reason reason, int flush_to)
{
    struct fake_port *fp = ctx;
    if (!fp->closed)
        fake_port_end(fp, reason, flush_to);
}

static void fake_port_fail(void *ctx, const char *what)
{
    struct fake_port *fp = ctx;
    fp->failed = what;
    if (!fp->closed)
        fake_port_end(fp, SESSION_CLOSE_INTERNAL_ERROR, -1);
}

static void fake_port_hold_reading(void *ctx, enum session_side side, bool hold)
{
    ((struct fake_port *)ctx)->holding[side] = hold;
}

static void fake_port_set_read_limit(void *ctx, enum session_side side, size_t bytes)
{
    ((struct fake_port *)ctx)->read_limit[side] = bytes;
}

static const struct pump_port fake_pump_port = {
    .send = fake_port_send,
    .abort = fake_port_abort,
    .fail = fake_port_fail,
    .hold_reading = fake_port_hold_reading,
    .set_read_limit = fake_port_set_read_limit,
};

/* An open port (its buffers made before any failure is armed); s may be NULL. */
static void fake_port_init(struct fake_port *fp, struct session *s)
{
    memset(fp, 0, sizeof(*fp));
    fp->s = s;
    fp->flush_to = -1;
    bool armed = fake_port_unarmed();
    for (int i = 0; i < 2; i++) {
        fp->got[i] = evbuffer_new();
        assert_non_null(fp->got[i]);
    }
    kit_alloc.armed = armed;
}

static void fake_port_free(struct fake_port *fp)
{
    for (int i = 0; i < 2; i++)
        evbuffer_free(fp->got[i]);
}

/* What side `to` received (taken out of got[to]), as a NUL-terminated copy the caller frees
 * with __real_free.  Never failed: the test's, not the code's under test. */
static char *fake_port_take(struct fake_port *fp, enum session_side to, size_t *len)
{
    bool armed = fake_port_unarmed();
    size_t n = evbuffer_get_length(fp->got[to]);
    char *b = __real_malloc(n + 1);
    assert_non_null(b);
    assert_int_equal(evbuffer_remove(fp->got[to], b, n), (int)n);
    b[n] = '\0';
    if (len != NULL)
        *len = n;
    kit_alloc.armed = armed;
    return b;
}

/* Side `to` received exactly want[0..len) (taken out of got[to]); `what` names the case. */
static void fake_port_expect(struct fake_port *fp, enum session_side to, const void *want,
                             size_t len, const char *what)
{
    size_t n;
    char *got = fake_port_take(fp, to, &n);
    if (n != len || memcmp(got, want, len) != 0)
        fail_msg("%s: the %s received %zu bytes, not the %zu sent to it", what,
                 to == SIDE_CLIENT ? "client" : "server", n, len);
    __real_free(got);
}

/* libevent's allocations through malloc/realloc/free of this executable, which the failing
 * allocator wraps: an evbuffer's chain fails at its turn like any allocation of twice's.
 * Called before libevent allocates anything. */
static void *kit_ev_malloc(size_t n)
{
    return malloc(n);
}

static void *kit_ev_realloc(void *p, size_t n)
{
    return realloc(p, n);
}

static void kit_ev_free(void *p)
{
    free(p);
}

static void kit_libevent_counted(void)
{
    event_set_mem_functions(kit_ev_malloc, kit_ev_realloc, kit_ev_free);
}

#pragma GCC diagnostic pop

#endif
