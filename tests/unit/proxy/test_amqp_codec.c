/*
 * test_amqp_codec.c - the AMQP codec (proxy/amqp/) driven with no socket, through the frame pump
 * and a fake port (fake_session.h): what each side receives.
 *
 * The recorded pika session (tests/unit/data/amqp/: a connection, confirms, publishes with
 * Celery's headers, a 10,000-byte body over three frames, deliveries, ack, nack, reject, a
 * redelivery, basic.get, a transaction, the closes) is fed frame by frame, each side's frames
 * in the order a client and its broker exchange them (the client's while it has any the broker
 * did not answer yet, then the broker's):
 *   - with no rule, and with rules that judge every message event and fault none, each side
 *     receives exactly what the other sent, frame by frame and byte by byte;
 *   - with those rules and every allocation failing in turn (libevent's too), the session
 *     either goes on unharmed or ends at once with the reason, and neither side ever received
 *     part of a frame.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "proxy/core/log.h"
#include "tests/lib/fake_session.h"
#include "tests/lib/golden.h"

#define MAX_FRAMES 1024

struct exchange {
    uint8_t *side[2];
    size_t len[2];
    size_t at[2][MAX_FRAMES + 1]; /* frame boundaries (the client's protocol header first) */
    size_t n[2];
};

static void cut(struct exchange *x, enum session_side side)
{
    size_t off = side == SIDE_CLIENT ? AMQP_PROTOCOL_HEADER_SIZE : 0;
    x->n[side] = 0;
    x->at[side][0] = 0;
    if (off > 0)
        x->at[side][++x->n[side]] = off;
    while (off < x->len[side]) {
        assert_true(x->len[side] - off >= AMQP_FRAME_HEADER_SIZE);
        const uint8_t *h = x->side[side] + off;
        size_t size = (size_t)h[3] << 24 | (size_t)h[4] << 16 | (size_t)h[5] << 8 | h[6];
        off += size + AMQP_FRAME_OVERHEAD;
        assert_true(x->n[side] < MAX_FRAMES);
        x->at[side][++x->n[side]] = off;
    }
    assert_int_equal(off, x->len[side]);
}

static void exchange_load(struct exchange *x)
{
    bool armed = fake_port_unarmed();
    x->side[SIDE_CLIENT] = kit_golden(&x->len[SIDE_CLIENT], "amqp/client.bin");
    x->side[SIDE_UPSTREAM] = kit_golden(&x->len[SIDE_UPSTREAM], "amqp/server.bin");
    cut(x, SIDE_CLIENT);
    cut(x, SIDE_UPSTREAM);
    kit_alloc.armed = armed;
}

static void exchange_free(struct exchange *x)
{
    kit_free(x->side[SIDE_CLIENT]);
    kit_free(x->side[SIDE_UPSTREAM]);
}

static void feed_frame(struct fake_session *fs, const struct exchange *x, enum session_side side,
                       size_t i, bool bytewise)
{
    const uint8_t *p = x->side[side] + x->at[side][i];
    size_t len = x->at[side][i + 1] - x->at[side][i];
    if (!bytewise) {
        fake_feed(fs, side, p, len);
        return;
    }
    for (size_t k = 0; k < len; k++)
        fake_feed(fs, side, p + k, 1);
}

/* A frame's class and method (0 for a frame that is no method). */
static uint32_t method_of(const struct exchange *x, enum session_side side, size_t i)
{
    const uint8_t *f = x->side[side] + x->at[side][i];
    if (x->at[side][i + 1] - x->at[side][i] < AMQP_FRAME_HEADER_SIZE + 4 ||
        f[0] != AMQP_FRAME_METHOD)
        return 0;
    return (uint32_t)f[7] << 24 | (uint32_t)f[8] << 16 | (uint32_t)f[9] << 8 | f[10];
}

/* Whether the client waits for the broker after frame i: a synchronous method's request
 * (pika waits for its -ok), the protocol header, start-ok (the broker tunes next), and a
 * publish's last frame on a channel in confirm mode are answered before the recording goes
 * on; so is everything before a consume's deliveries. */
static bool client_waits(const struct exchange *x, size_t i)
{
    if (i == 0)
        return true; /* the protocol header: connection.start comes */
    uint32_t m = method_of(x, SIDE_CLIENT, i);
    switch (m) {
    case 0x000a000b: /* connection.start-ok: tune comes */
    case 0x000a0028: /* connection.open */
    case 0x000a0032: /* connection.close */
    case 0x0014000a: /* channel.open */
    case 0x00140028: /* channel.close */
    case 0x0055000a: /* confirm.select */
    case 0x0032000a: /* queue.declare */
    case 0x003c000a: /* basic.qos */
    case 0x003c0014: /* basic.consume */
    case 0x003c001e: /* basic.cancel */
    case 0x003c0046: /* basic.get */
    case 0x005a000a: /* tx.select */
    case 0x005a0014: /* tx.commit */
    case 0x005a001e: /* tx.rollback */
        return true;
    default:
        return false;
    }
}

/* The broker's frames that answer what the client sent so far: up to (and with) the next -ok
 * or get reply; deliveries and confirms come with them. */
static bool broker_answers(const struct exchange *x, size_t j)
{
    uint32_t m = method_of(x, SIDE_UPSTREAM, j);
    switch (m) {
    case 0x000a001e: /* connection.tune: start-ok's answer */
    case 0x000a0029: /* connection.open-ok */
    case 0x000a0033: /* connection.close-ok */
    case 0x0014000b: /* channel.open-ok */
    case 0x00140029: /* channel.close-ok */
    case 0x0055000b: /* confirm.select-ok */
    case 0x0032000b: /* queue.declare-ok */
    case 0x003c000b: /* basic.qos-ok */
    case 0x003c0015: /* basic.consume-ok */
    case 0x003c001f: /* basic.cancel-ok */
    case 0x003c0048: /* basic.get-empty */
    case 0x005a000b: /* tx.select-ok */
    case 0x005a0015: /* tx.commit-ok */
    case 0x005a001f: /* tx.rollback-ok */
        return true;
    default:
        return false;
    }
}

/* The exchange in a causal order: the client's frames until it waits, then the broker's up
 * to the answer it waits for (connection.start first, and a get-ok's content whole). */
static void replay(struct fake_session *fs, const struct exchange *x, bool bytewise)
{
    size_t c = 0, s = 0;
    while (c < x->n[SIDE_CLIENT] || s < x->n[SIDE_UPSTREAM]) {
        bool waits = false;
        while (c < x->n[SIDE_CLIENT] && !waits) {
            waits = client_waits(x, c);
            feed_frame(fs, x, SIDE_CLIENT, c++, bytewise);
        }
        bool answered = false;
        while (s < x->n[SIDE_UPSTREAM] && (!answered || c == x->n[SIDE_CLIENT])) {
            uint32_t m = method_of(x, SIDE_UPSTREAM, s);
            /* start (before the header's wait ends), get-ok with its content */
            answered = broker_answers(x, s) || (m == 0x000a000a && c == 1);
            feed_frame(fs, x, SIDE_UPSTREAM, s++, bytewise);
            if (m == 0x003c0047) /* basic.get-ok: its header and body follow */
                while (s < x->n[SIDE_UPSTREAM] && method_of(x, SIDE_UPSTREAM, s) == 0) {
                    feed_frame(fs, x, SIDE_UPSTREAM, s++, bytewise);
                    answered = true;
                }
        }
    }
}

static const char listener[] = "listen l {\n  protocol amqp\n  bind 127.0.0.1:1\n"
                               "  upstream 127.0.0.1:2\n}\n";
/* Every message event judged (the Nth of a million never comes): the codec parses every
 * method and content, identifies every message, keeps its ledgers. */
static const char judged[] = "rule p on l {\n  when publish\n  nth 1000000\n  do drop\n}\n"
                             "rule d on l {\n  when deliver\n  nth 1000000\n  do drop\n}\n"
                             "rule a on l {\n  when ack\n  nth 1000000\n  do drop\n}\n"
                             "rule c on l {\n  when confirm\n  nth 1000000\n  do drop\n}\n";

static void pass_unchanged(const char *rules, bool bytewise)
{
    char text[1024];
    snprintf(text, sizeof(text), "%s%s", listener, rules);
    struct exchange x;
    exchange_load(&x);
    struct fake_session fs;
    fake_session_init(&fs, text);
    assert_true(fake_session_open(&fs));
    replay(&fs, &x, bytewise);
    assert_false(fs.port.closed);
    fake_port_expect(&fs.port, SIDE_UPSTREAM, x.side[SIDE_CLIENT], x.len[SIDE_CLIENT], "amqp");
    fake_port_expect(&fs.port, SIDE_CLIENT, x.side[SIDE_UPSTREAM], x.len[SIDE_UPSTREAM], "amqp");
    fake_session_free(&fs);
    exchange_free(&x);
}

static void test_recording_unchanged(void **state)
{
    (void)state;
    pass_unchanged("", false);
    pass_unchanged("", true);
}

static void test_recording_judged_unchanged(void **state)
{
    (void)state;
    pass_unchanged(judged, false);
    pass_unchanged(judged, true);
}

/* got is whole frames (the client's protocol header first, toward the broker). */
static void whole_frames(const uint8_t *got, size_t n, enum session_side to)
{
    size_t off =
        to == SIDE_UPSTREAM && n >= AMQP_PROTOCOL_HEADER_SIZE ? AMQP_PROTOCOL_HEADER_SIZE : 0;
    while (off < n) {
        if (n - off < AMQP_FRAME_HEADER_SIZE)
            break;
        const uint8_t *h = got + off;
        size_t size = (size_t)h[3] << 24 | (size_t)h[4] << 16 | (size_t)h[5] << 8 | h[6];
        if (n - off < size + AMQP_FRAME_OVERHEAD)
            break;
        off += size + AMQP_FRAME_OVERHEAD;
        if (got[off - 1] != AMQP_FRAME_END)
            fail_msg("a frame toward the %s does not end with the frame-end octet",
                     to == SIDE_CLIENT ? "client" : "broker");
    }
    if (off != n)
        fail_msg("the %s received part of a frame (%zu bytes whole of %zu)",
                 to == SIDE_CLIENT ? "client" : "broker", off, n);
}

static unsigned oom_stopped;
static const char *oom_rules = judged;

static void oom_recording(void)
{
    char text[1024];
    snprintf(text, sizeof(text), "%s%s", listener, oom_rules);
    struct exchange x;
    exchange_load(&x);
    struct fake_session fs;
    fake_session_init(&fs, text);
    if (fake_session_open(&fs)) {
        replay(&fs, &x, false);
        for (int to = 0; to < 2; to++) {
            size_t n;
            char *got = fake_port_take(&fs.port, (enum session_side)to, &n);
            whole_frames((const uint8_t *)got, n, (enum session_side)to);
            __real_free(got);
        }
        if (fs.port.closed && fs.port.reason == SESSION_CLOSE_INTERNAL_ERROR) {
            assert_true(kit_failed());
            assert_int_equal(fs.port.reason, SESSION_CLOSE_INTERNAL_ERROR);
            assert_int_equal(fs.port.flush_to, -1);
            oom_stopped++;
        }
    }
    fake_session_free(&fs);
    exchange_free(&x);
}

static void test_every_allocation_fails(void **state)
{
    (void)state;
    struct kit_scenario sc = {oom_recording};
    long n = kit_each_allocation_fails(&kit_wrap_hook, kit_scenario_run, &sc);
    printf("amqp: %ld allocations, each failed in turn; the session stopped in %u runs\n", n,
           oom_stopped);
    assert_true(n > 20);
    assert_true(oom_stopped > 0);
}

/* How many method frames of class.method m are in b[0..n) (frames after an 8-byte protocol
 * header when `header`). */
static unsigned count_methods(const uint8_t *b, size_t n, bool header, uint32_t m)
{
    unsigned k = 0;
    for (size_t off = header ? AMQP_PROTOCOL_HEADER_SIZE : 0; off + 11 <= n;) {
        const uint8_t *h = b + off;
        size_t size = (size_t)h[3] << 24 | (size_t)h[4] << 16 | (size_t)h[5] << 8 | h[6];
        uint32_t id = (uint32_t)h[7] << 24 | (uint32_t)h[8] << 16 | (uint32_t)h[9] << 8 | h[10];
        if (h[0] == AMQP_FRAME_METHOD && id == m)
            k++;
        off += size + AMQP_FRAME_OVERHEAD;
    }
    return k;
}

/* `redeliver` on acks: the broker gets basic.reject(requeue) where the client acked, through
 * the pump, and the client sees nothing of it. */
static void test_redeliver_turns_acks_into_rejects(void **state)
{
    (void)state;
    char text[1024];
    snprintf(text, sizeof(text), "%srule f on l {\n  when ack\n  do redeliver\n}\n", listener);
    struct exchange x;
    exchange_load(&x);
    struct fake_session fs;
    fake_session_init(&fs, text);
    assert_true(fake_session_open(&fs));
    replay(&fs, &x, false);
    size_t n;
    char *up = fake_port_take(&fs.port, SIDE_UPSTREAM, &n);
    const uint32_t ack = 0x003c0050, reject = 0x003c005a;
    unsigned acks = count_methods(x.side[SIDE_CLIENT], x.len[SIDE_CLIENT], true, ack);
    unsigned rejects = count_methods(x.side[SIDE_CLIENT], x.len[SIDE_CLIENT], true, reject);
    assert_true(acks > 0);
    assert_true(count_methods((const uint8_t *)up, n, true, ack) < acks);
    assert_true(count_methods((const uint8_t *)up, n, true, reject) > rejects);
    __real_free(up);
    fake_port_expect(&fs.port, SIDE_CLIENT, x.side[SIDE_UPSTREAM], x.len[SIDE_UPSTREAM], "amqp");
    fake_session_free(&fs);
    exchange_free(&x);
}

/* A client opening more channels than twice tracks (AMQP_PX_MAX_CHANNELS) breaks the protocol
 * as twice can follow it: the session ends as a protocol error, not as out of memory, and
 * what went before reaches the broker. */
static void test_channels_past_the_cap(void **state)
{
    (void)state;
    struct fake_session fs;
    fake_session_init(&fs, listener);
    assert_true(fake_session_open(&fs));
    static const uint8_t header[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    fake_feed(&fs, SIDE_CLIENT, header, sizeof(header));
    unsigned opened = 0;
    for (unsigned ch = 1; ch <= 4096 && !fs.port.closed; ch++) {
        /* channel.open: class 20, method 10, an empty reserved short string */
        uint8_t f[] = {1, (uint8_t)(ch >> 8), (uint8_t)ch, 0, 0, 0, 5, 0, 20, 0, 10, 0, 0xCE};
        fake_feed(&fs, SIDE_CLIENT, f, sizeof(f));
        opened += fs.port.closed ? 0 : 1;
    }
    assert_true(fs.port.closed);
    assert_int_equal(fs.port.reason, SESSION_CLOSE_PROTOCOL_ERROR);
    assert_null(fs.port.failed);
    assert_int_equal(opened, 2048);
    size_t n;
    char *up = fake_port_take(&fs.port, SIDE_UPSTREAM, &n);
    assert_int_equal(n, sizeof(header) + 2048 * 13u); /* each channel.open it tracked */
    __real_free(up);
    fake_session_free(&fs);
}

/* Faults that fire, each with every allocation failing in turn.  The recorded broker did not
 * see them (its later frames answer the session as it was): a session may end for that, never
 * with part of a frame sent or memory lost. */
static void test_every_allocation_fails_on_faults(void **state)
{
    (void)state;
    static const char *const faults[] = {
        "rule f on l {\n  when ack\n  do redeliver\n}\n",
        "rule f on l {\n  when ack\n  do drop\n}\n",
        "rule f on l {\n  when deliver\n  do duplicate\n}\n",
        "rule f on l {\n  when publish\n  do duplicate\n}\n",
        "rule f on l {\n  when publish\n  do drop\n}\n",
        "rule f on l {\n  when deliver\n  do error 406\n}\n",
        "rule f on l {\n  when ack\n  do close before\n}\n",
        "rule f on l {\n  when publish\n  do close after\n}\n",
    };
    for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) {
        oom_rules = faults[i];
        struct kit_scenario sc = {oom_recording};
        long n = kit_each_allocation_fails(&kit_wrap_hook, kit_scenario_run, &sc);
        assert_true(n > 10);
    }
    oom_rules = judged;
}

int main(void)
{
    kit_libevent_counted();
    log_set_level(LOG_ERROR); /* a line per run of the failing allocator otherwise */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recording_unchanged),
        cmocka_unit_test(test_recording_judged_unchanged),
        cmocka_unit_test(test_redeliver_turns_acks_into_rejects),
        cmocka_unit_test(test_channels_past_the_cap),
        cmocka_unit_test(test_every_allocation_fails),
        cmocka_unit_test(test_every_allocation_fails_on_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
