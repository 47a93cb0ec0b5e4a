/*
 * test_pump.c - the frame pump (proxy/net/pump.h) under a toy codec, through a fake port.
 *
 * The toy protocol: a frame is a 2-byte big-endian length n, an op byte and n - 1 bytes of
 * payload.  Its codec walks frames as RESP and AMQP do (in place in the window while it holds
 * them, else from the head, pulled up), and gives each the fate its op names:
 *   P  passed on unchanged        D  dropped
 *   H  held (into a buffer of the codec's)
 *   I  passed on, then "!" of twice's own after it
 *   R  "?" of twice's own sent back to the side the frame came from
 * What each side receives is checked against what the ops say, for every way of cutting the
 * input in two reads and byte by byte, in both of the pump's modes; and with every allocation
 * failing in turn (libevent's too), where the session must end with the reason and no side may
 * have received part of a frame.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/fake_pump.h"

struct toy {
    struct pump pump;
    struct fake_port port;
    struct evbuffer *held;
    struct evbuffer *session_in; /* PUMP_LEAVE_REST: the session's read buffer */
    enum pump_rest rest;
};

/* The frame at the run's end: in the window when it holds it whole, else pulled up at the
 * head (the run settled first).  Its length, or 0 when it is not all here (or the pump
 * stopped). */
static size_t toy_frame(struct toy *t, enum session_side from, const uint8_t **f)
{
    struct pump *p = &t->pump;
    size_t run = p->run[from];
    const struct pump_window *w = pump_window(p, from);
    if (w != NULL && w->len >= run + 2) {
        size_t len = (size_t)(w->p[run] << 8 | w->p[run + 1]) + 2;
        if (w->len - run >= len) {
            *f = w->p + run;
            return len;
        }
    }
    if (pump_rest(p, from) < 2 || pump_settle(p, from) != 0)
        return 0;
    w = pump_window_pullup(p, from, 2);
    if (w == NULL)
        return 0;
    size_t len = (size_t)(w->p[0] << 8 | w->p[1]) + 2;
    if (pump_rest(p, from) < len || (w = pump_window_pullup(p, from, len)) == NULL)
        return 0;
    *f = w->p;
    return len;
}

static void toy_frames(struct toy *t, enum session_side from)
{
    struct pump *p = &t->pump;
    enum session_side to = pump_other(from);
    const uint8_t *f;
    size_t len;
    while (!pump_failed(p) && (len = toy_frame(t, from, &f)) > 0) {
        switch (len > 2 ? f[2] : 'P') {
        case 'D':
            (void)pump_drop(p, from, len);
            break;
        case 'H':
            (void)pump_hold(p, from, len, t->held);
            break;
        case 'I':
            pump_pass(p, from, len);
            (void)pump_inject(p, to, "!", 1);
            break;
        case 'R':
            (void)pump_drop(p, from, len);
            (void)pump_inject(p, from, "?", 1);
            break;
        default:
            pump_pass(p, from, len);
            break;
        }
    }
}

/* One read of len bytes from side `from`, walked and flushed. */
static void toy_read(struct toy *t, enum session_side from, const uint8_t *b, size_t len)
{
    bool armed = fake_port_unarmed(); /* the session's read: not the pump's to fail */
    struct evbuffer *fresh = NULL;
    struct evbuffer *in = t->rest == PUMP_LEAVE_REST ? t->session_in : (fresh = evbuffer_new());
    assert_non_null(in);
    assert_int_equal(evbuffer_add(in, b, len), 0);
    kit_alloc.armed = armed;
    struct pump_read r;
    pump_read_begin(&t->pump, from, in, &r);
    toy_frames(t, from);
    pump_flush(&t->pump, pump_other(from));
    pump_flush(&t->pump, from);
    pump_read_end(&t->pump, from, &r);
    if (fresh != NULL) {
        if (!pump_failed(&t->pump))
            assert_int_equal(evbuffer_get_length(fresh), 0); /* the pump kept the rest */
        evbuffer_free(fresh);
    }
}

static bool toy_open(struct toy *t, enum pump_rest rest)
{
    memset(t, 0, sizeof(*t));
    t->rest = rest;
    fake_port_init(&t->port, NULL);
    bool armed = fake_port_unarmed(); /* the codec's buffer and the session's */
    t->held = evbuffer_new();
    t->session_in = evbuffer_new();
    kit_alloc.armed = armed;
    assert_true(t->held != NULL && t->session_in != NULL);
    if (pump_init(&t->pump, &fake_pump_port, &t->port, rest) == 0)
        return true;
    evbuffer_free(t->held);
    evbuffer_free(t->session_in);
    fake_port_free(&t->port);
    return false;
}

static void toy_close(struct toy *t)
{
    pump_free(&t->pump);
    evbuffer_free(t->held);
    evbuffer_free(t->session_in);
    fake_port_free(&t->port);
}

/* ---- the input and what the ops say of it ---- */

struct stream {
    uint8_t b[40000];
    size_t len;
    /* frame boundaries of what each side may receive, for the half-frame check */
    char want_up[40000], want_down[40000], want_held[40000];
    size_t n_up, n_down, n_held;
};

static void add(char *dst, size_t *n, const void *src, size_t len)
{
    memcpy(dst + *n, src, len);
    *n += len;
}

static void frame(struct stream *s, char op, size_t payload)
{
    size_t n = payload + 1;
    uint8_t *f = s->b + s->len;
    f[0] = (uint8_t)(n >> 8);
    f[1] = (uint8_t)n;
    f[2] = (uint8_t)op;
    for (size_t i = 0; i < payload; i++)
        f[3 + i] = (uint8_t)('a' + (s->len + i) % 26);
    size_t len = n + 2;
    s->len += len;
    if (op == 'P' || op == 'I')
        add(s->want_up, &s->n_up, f, len);
    if (op == 'I')
        add(s->want_up, &s->n_up, "!", 1);
    if (op == 'H')
        add(s->want_held, &s->n_held, f, len);
    if (op == 'R')
        add(s->want_down, &s->n_down, "?", 1);
}

/* Short frames of every op, then long ones: a read of these is shared by reference
 * (codec_move), and spans chains. */
static void stream_make(struct stream *s, bool big)
{
    memset(s, 0, sizeof(*s));
    const char ops[] = "PPDPHIPRPPDHPIR";
    for (size_t i = 0; ops[i] != '\0'; i++)
        frame(s, ops[i], i % 4 == 0 ? 0 : 3 + i);
    if (big) {
        frame(s, 'P', 9000);
        frame(s, 'H', 6000);
        frame(s, 'P', 5000);
        frame(s, 'D', 7000);
        frame(s, 'I', 4500);
    }
}

static void expect(struct toy *t, const struct stream *s)
{
    fake_port_expect(&t->port, SIDE_UPSTREAM, s->want_up, s->n_up, "toy");
    fake_port_expect(&t->port, SIDE_CLIENT, s->want_down, s->n_down, "toy");
    bool armed = fake_port_unarmed(); /* the check's allocations are not the pump's */
    size_t n = evbuffer_get_length(t->held);
    assert_int_equal(n, s->n_held);
    assert_memory_equal(evbuffer_pullup(t->held, -1), s->want_held, n);
    kit_alloc.armed = armed;
}

static struct stream st;

static void split_in_two(enum pump_rest rest, bool big)
{
    stream_make(&st, big);
    for (size_t k = 0; k <= st.len; k += big ? 97 : 1) {
        struct toy t;
        assert_true(toy_open(&t, rest));
        toy_read(&t, SIDE_CLIENT, st.b, k);
        toy_read(&t, SIDE_CLIENT, st.b + k, st.len - k);
        assert_false(t.port.closed);
        expect(&t, &st);
        toy_close(&t);
    }
}

static void test_every_split_keeping_the_rest(void **state)
{
    (void)state;
    split_in_two(PUMP_KEEP_REST, false);
    split_in_two(PUMP_KEEP_REST, true);
}

static void test_every_split_leaving_the_rest(void **state)
{
    (void)state;
    split_in_two(PUMP_LEAVE_REST, false);
    split_in_two(PUMP_LEAVE_REST, true);
}

static void test_byte_by_byte(void **state)
{
    (void)state;
    stream_make(&st, false);
    for (int rest = 0; rest < 2; rest++) {
        struct toy t;
        assert_true(toy_open(&t, (enum pump_rest)rest));
        for (size_t i = 0; i < st.len; i++)
            toy_read(&t, SIDE_CLIENT, st.b + i, 1);
        expect(&t, &st);
        toy_close(&t);
    }
}

/* A read that goes on as it came is handed to the port as it is: one send, nothing left. */
static void test_plain_read_handed_on(void **state)
{
    (void)state;
    memset(&st, 0, sizeof(st));
    for (int i = 0; i < 16; i++)
        frame(&st, 'P', 20);
    struct toy t;
    assert_true(toy_open(&t, PUMP_KEEP_REST));
    toy_read(&t, SIDE_CLIENT, st.b, st.len);
    assert_int_equal(t.port.sends, 1);
    expect(&t, &st);
    assert_int_equal(evbuffer_get_length(t.pump.in[SIDE_CLIENT]), 0);
    toy_close(&t);
}

/* ---- out of memory ---- */

/* got is a run of whole frames of want (the frames of one side, in order): none cut. */
static void whole_frames_only(struct fake_port *fp, enum session_side to, const char *want,
                              size_t want_len)
{
    size_t n;
    char *got = fake_port_take(fp, to, &n);
    assert_true(n <= want_len);
    assert_memory_equal(got, want, n);
    __real_free(got);
    if (n == want_len || to == SIDE_CLIENT)
        return; /* all of it (toward the client: "?"s, a byte each) */
    /* n must end at a frame's end (a "!" after an I frame ends one too). */
    size_t at = 0;
    while (at < n) {
        if (want[at] == '!') {
            at++;
            continue;
        }
        at += (size_t)((uint8_t)want[at] << 8 | (uint8_t)want[at + 1]) + 2;
    }
    assert_int_equal(at, n);
}

static enum pump_rest oom_rest;
static unsigned oom_stopped; /* runs in which the pump stopped for lack of memory */

static void oom_scenario(void)
{
    struct toy t;
    if (!toy_open(&t, oom_rest))
        return; /* the session was refused */
    size_t cut = st.len / 3;
    toy_read(&t, SIDE_CLIENT, st.b, cut);
    toy_read(&t, SIDE_CLIENT, st.b + cut, st.len - cut);
    if (t.port.closed) {
        /* The failure stopped the pump: the session ends at once, with the reason, and
         * neither side received part of a frame. */
        assert_true(kit_failed());
        assert_non_null(t.port.failed);
        assert_int_equal(t.port.reason, SESSION_CLOSE_INTERNAL_ERROR);
        assert_int_equal(t.port.flush_to, -1);
        whole_frames_only(&t.port, SIDE_UPSTREAM, st.want_up, st.n_up);
        whole_frames_only(&t.port, SIDE_CLIENT, st.want_down, st.n_down);
        oom_stopped++;
    } else {
        /* No failure, or one libevent or codec_move() made up for (a shared chain copied
         * instead): everything arrived. */
        expect(&t, &st);
    }
    toy_close(&t);
}

static void test_every_allocation_fails(void **state)
{
    (void)state;
    stream_make(&st, true);
    oom_rest = PUMP_KEEP_REST;
    kit_every_allocation_fails(oom_scenario);
    oom_rest = PUMP_LEAVE_REST;
    kit_every_allocation_fails(oom_scenario);
    /* libevent's allocations count: the pump met failures in its moves, not only the toy. */
    printf("pump stopped for lack of memory in %u runs\n", oom_stopped);
    assert_true(oom_stopped > 4);
}

/* Once stopped, the pump does nothing more: no send, no abort over the failure's. */
static void test_stopped_pump_is_inert(void **state)
{
    (void)state;
    struct toy t;
    assert_true(toy_open(&t, PUMP_KEEP_REST));
    pump_pass(&t.pump, SIDE_CLIENT, 0);
    assert_int_equal(pump_inject(&t.pump, SIDE_UPSTREAM, "x", 1), 0);
    pump_fail(&t.pump, "testing");
    assert_string_equal(t.port.failed, "testing");
    assert_int_equal(pump_inject(&t.pump, SIDE_UPSTREAM, "y", 1), -1);
    pump_flush(&t.pump, SIDE_UPSTREAM);
    pump_abort(&t.pump, SESSION_CLOSE_FAULT, SIDE_CLIENT);
    assert_int_equal(t.port.sends, 0);
    assert_int_equal(t.port.reason, SESSION_CLOSE_INTERNAL_ERROR);
    assert_int_equal(evbuffer_get_length(t.port.got[SIDE_UPSTREAM]), 0);
    toy_close(&t);
}

/* A codec that takes more than was read stops the pump rather than sending what is not
 * there. */
static void test_taking_too_much_stops(void **state)
{
    (void)state;
    struct toy t;
    assert_true(toy_open(&t, PUMP_KEEP_REST));
    struct evbuffer *in = evbuffer_new();
    assert_int_equal(evbuffer_add(in, "abc", 3), 0);
    struct pump_read r;
    pump_read_begin(&t.pump, SIDE_CLIENT, in, &r);
    assert_int_equal(pump_forward(&t.pump, SIDE_CLIENT, 4), -1);
    assert_true(pump_failed(&t.pump));
    pump_read_end(&t.pump, SIDE_CLIENT, &r);
    assert_true(t.port.closed);
    evbuffer_free(in);
    toy_close(&t);
}

int main(void)
{
    kit_libevent_counted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_split_keeping_the_rest),
        cmocka_unit_test(test_every_split_leaving_the_rest),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_plain_read_handed_on),
        cmocka_unit_test(test_every_allocation_fails),
        cmocka_unit_test(test_stopped_pump_is_inert),
        cmocka_unit_test(test_taking_too_much_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
