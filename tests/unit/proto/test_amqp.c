/*
 * test_amqp.c - the AMQP 0-9-1 codec (proto/amqp*.c) against real traffic and hostile input.
 *
 *   - Golden streams recorded from pika 1.2 and RabbitMQ 3.10 (tests/unit/data/amqp/client.bin and
 * server.bin, see tests/unit/capture_amqp.py): every frame decodes, the method sequence is the one
 * the session performed, deliveries carry the right tags and redelivered bits, the content headers
 * carry the message ids and Celery-style "id"/"task" headers, body frames add up.
 *   - The same streams fed to an incremental driver split at every offset and byte by byte,
 *     through a heap buffer of exactly the bytes received so far (ASan/valgrind see any
 *     over-read), give the same frames.
 *   - Malformed input returns the right code: frame end, sizes at and over the limits, frame
 *     types, heartbeats, truncated arguments, tables (truncated, unknown types, too deep),
 *     short content headers, the continuation flag.
 *   - The encoders produce the exact bytes pika sent and RabbitMQ answered in the capture; the
 *     patchers round-trip.
 *   - A fixed-seed mutation run over the golden frames never crashes and never returns a view
 *     outside its input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "tests/lib/golden.h"
#include "tests/lib/split.h"

#define GOLDEN_MAX_FRAMES 128
#define GOLDEN_FRAME_MAX 4096u /* what the recorded session negotiated (pika frame_max) */
#define DESC_MAX 48

/* ---- golden streams ------------------------------------------------------------------------ */

struct rec {
    uint8_t type;
    uint16_t channel;
    uint32_t size;
    size_t payload_off; /* in the stream */
    size_t frame_len;
};

struct golden {
    uint8_t *buf;
    size_t len;
    size_t start; /* 8 after the client's protocol header, else 0 */
    struct rec frames[GOLDEN_MAX_FRAMES];
    size_t n;
};

static struct golden g_client, g_server;

/* Frames a whole golden stream in one go. */
static int golden_scan(struct golden *g)
{
    size_t off = g->start;
    g->n = 0;
    while (off < g->len) {
        struct amqp_frame f;
        int rc = amqp_frame_parse(g->buf + off, g->len - off, GOLDEN_FRAME_MAX, &f);
        if (rc != 1 || g->n == GOLDEN_MAX_FRAMES)
            return -1;
        struct rec r = {f.type, f.channel, f.size, off + AMQP_FRAME_HEADER_SIZE, f.frame_len};
        g->frames[g->n++] = r;
        off += f.frame_len;
    }
    return 0;
}

static int golden_load(struct golden *g, const char *name, bool client)
{
    g->buf = kit_golden(&g->len, "amqp/%s", name);
    g->start = client ? AMQP_PROTOCOL_HEADER_SIZE : 0;
    if (client && amqp_protocol_header_check(g->buf, g->len) != 1)
        return -1;
    return golden_scan(g);
}

static int setup_golden(void **state)
{
    (void)state;
    if (golden_load(&g_client, "client.bin", true) < 0)
        return -1;
    return golden_load(&g_server, "server.bin", false);
}

static int teardown_golden(void **state)
{
    (void)state;
    kit_free(g_client.buf);
    kit_free(g_server.buf);
    return 0;
}

static const uint8_t *rec_payload(const struct golden *g, size_t i)
{
    return g->buf + g->frames[i].payload_off;
}

static const uint8_t *rec_frame(const struct golden *g, size_t i)
{
    return g->buf + g->frames[i].payload_off - AMQP_FRAME_HEADER_SIZE;
}

/* "1 basic.deliver", "1 header", "1 body", "0 heartbeat". */
static void rec_describe(const struct golden *g, size_t i, char *out, size_t cap)
{
    const struct rec *r = &g->frames[i];
    struct amqp_method m;
    const char *what = "?";

    if (r->type == AMQP_FRAME_METHOD) {
        assert_int_equal(amqp_method_decode(rec_payload(g, i), r->size, &m), 0);
        what = amqp_method_name(m.class_id, m.method_id);
    } else if (r->type == AMQP_FRAME_HEADER) {
        what = "header";
    } else if (r->type == AMQP_FRAME_BODY) {
        what = "body";
    } else if (r->type == AMQP_FRAME_HEARTBEAT) {
        what = "heartbeat";
    }
    snprintf(out, cap, "%u %s", r->channel, what);
}

static void assert_sequence(const struct golden *g, const char *const *expected, size_t n)
{
    char desc[DESC_MAX];
    for (size_t i = 0; i < n && i < g->n; i++) {
        rec_describe(g, i, desc, sizeof(desc));
        if (strcmp(desc, expected[i]) != 0)
            fail_msg("frame %zu: got \"%s\", expected \"%s\"", i, desc, expected[i]);
    }
    assert_int_equal(g->n, n);
}

/* The index of the k-th (0-based) method frame with this id, or fail. */
static size_t find_method(const struct golden *g, uint32_t id, int k)
{
    for (size_t i = 0; i < g->n; i++) {
        struct amqp_method m;
        if (g->frames[i].type != AMQP_FRAME_METHOD)
            continue;
        assert_int_equal(amqp_method_decode(rec_payload(g, i), g->frames[i].size, &m), 0);
        if (m.id == id && k-- == 0)
            return i;
    }
    fail_msg("method %08x #%d not in stream", (unsigned)id, k);
    return 0;
}

static struct amqp_method decode_at(const struct golden *g, size_t i)
{
    struct amqp_method m;
    assert_int_equal(g->frames[i].type, AMQP_FRAME_METHOD);
    assert_int_equal(amqp_method_decode(rec_payload(g, i), g->frames[i].size, &m), 0);
    return m;
}

static void assert_bytes(struct amqp_bytes b, const char *s)
{
    if (!amqp_bytes_eq(b, s))
        fail_msg("got \"%.*s\", expected \"%s\"", (int)b.len, b.p == NULL ? "" : (const char *)b.p,
                 s);
}

static void test_golden_client_sequence(void **state)
{
    (void)state;
    static const char *const expected[] = {"0 connection.start-ok",
                                           "0 connection.tune-ok",
                                           "0 connection.open",
                                           "1 channel.open",
                                           "1 confirm.select",
                                           "1 queue.declare",
                                           "1 basic.publish",
                                           "1 header",
                                           "1 body",
                                           "1 body",
                                           "1 body",
                                           "1 basic.publish",
                                           "1 header",
                                           "1 body",
                                           "1 basic.publish",
                                           "1 header",
                                           "1 body",
                                           "1 basic.qos",
                                           "1 basic.consume",
                                           "1 basic.ack",
                                           "1 basic.nack",
                                           "1 basic.reject",
                                           "1 basic.ack",
                                           "1 basic.cancel",
                                           "1 basic.publish",
                                           "1 header",
                                           "1 body",
                                           "1 basic.get",
                                           "1 basic.ack",
                                           "1 basic.get",
                                           "2 channel.open",
                                           "2 tx.select",
                                           "2 basic.publish",
                                           "2 header",
                                           "2 body",
                                           "2 tx.commit",
                                           "2 basic.publish",
                                           "2 header",
                                           "2 body",
                                           "2 tx.rollback",
                                           "2 channel.close",
                                           "1 queue.delete",
                                           "1 channel.close",
                                           "0 connection.close"};
    assert_sequence(&g_client, expected, sizeof(expected) / sizeof(expected[0]));
}

static void test_golden_server_sequence(void **state)
{
    (void)state;
    static const char *const expected[] = {"0 connection.start",
                                           "0 connection.tune",
                                           "0 connection.open-ok",
                                           "1 channel.open-ok",
                                           "1 confirm.select-ok",
                                           "1 queue.declare-ok",
                                           "1 basic.ack",
                                           "1 basic.ack",
                                           "1 basic.ack",
                                           "1 basic.qos-ok",
                                           "1 basic.consume-ok",
                                           "1 basic.deliver",
                                           "1 header",
                                           "1 body",
                                           "1 body",
                                           "1 body",
                                           "1 basic.deliver",
                                           "1 header",
                                           "1 body",
                                           "1 basic.deliver",
                                           "1 header",
                                           "1 body",
                                           "1 basic.deliver",
                                           "1 header",
                                           "1 body",
                                           "1 basic.cancel-ok",
                                           "1 basic.ack",
                                           "1 basic.get-ok",
                                           "1 header",
                                           "1 body",
                                           "1 basic.get-empty",
                                           "2 channel.open-ok",
                                           "2 tx.select-ok",
                                           "2 tx.commit-ok",
                                           "2 tx.rollback-ok",
                                           "2 channel.close-ok",
                                           "1 queue.delete-ok",
                                           "1 channel.close-ok",
                                           "0 connection.close-ok"};
    assert_sequence(&g_server, expected, sizeof(expected) / sizeof(expected[0]));
}

static void test_golden_handshake(void **state)
{
    (void)state;
    struct amqp_method m = decode_at(&g_client, 0);
    assert_int_equal(m.id, AMQP_CONNECTION_START_OK);
    assert_true(m.decoded);
    assert_bytes(m.start_ok.mechanism, "PLAIN");
    assert_int_equal(m.start_ok.response.len, 12);
    assert_memory_equal(m.start_ok.response.p, "\0guest\0guest", 12);
    /* The offset lets the proxy redact the credentials in place. */
    assert_ptr_equal(rec_payload(&g_client, 0) + m.start_ok.response_offset, m.start_ok.response.p);
    assert_bytes(m.start_ok.locale, "en_US");
    struct amqp_bytes product;
    assert_int_equal(amqp_table_find_string(m.start_ok.client_properties, "product", &product), 1);
    assert_bytes(product, "Pika Python Client Library");

    m = decode_at(&g_server, 1);
    assert_int_equal(m.id, AMQP_CONNECTION_TUNE);
    assert_int_equal(m.tune.channel_max, 2047);
    assert_int_equal(m.tune.frame_max, 131072);
    assert_int_equal(m.tune.heartbeat, 60);
    m = decode_at(&g_client, 1);
    assert_int_equal(m.id, AMQP_CONNECTION_TUNE_OK);
    assert_int_equal(m.tune.channel_max, 2047);
    assert_int_equal(m.tune.frame_max, 4096);
    assert_int_equal(m.tune.heartbeat, 60);
    m = decode_at(&g_client, 2);
    assert_bytes(m.vhost, "/");
    /* Methods twice does not decode are forwarded untouched: ids only. */
    m = decode_at(&g_server, 0);
    assert_int_equal(m.id, AMQP_CONNECTION_START);
    assert_false(m.decoded);
}

static void test_golden_consume(void **state)
{
    (void)state;
    struct amqp_method m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_QOS, 0));
    assert_int_equal(m.qos.prefetch_count, 10);
    assert_int_equal(m.qos.prefetch_size, 0);
    assert_false(m.qos.global);

    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_CONSUME, 0));
    assert_bytes(m.consume.queue, "twice.golden");
    assert_bytes(m.consume.consumer_tag, "ctag-golden");
    assert_false(m.consume.no_ack || m.consume.no_local || m.consume.exclusive || m.consume.nowait);
    struct amqp_field f;
    assert_int_equal(amqp_table_find(m.consume.arguments, "x-priority", &f), 1);
    assert_int_equal(f.type, 'I');
    assert_int_equal(f.i, 5);

    m = decode_at(&g_server, find_method(&g_server, AMQP_BASIC_CONSUME_OK, 0));
    assert_bytes(m.consumer.consumer_tag, "ctag-golden");
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_CANCEL, 0));
    assert_bytes(m.consumer.consumer_tag, "ctag-golden");
    assert_false(m.consumer.nowait);
    m = decode_at(&g_server, find_method(&g_server, AMQP_BASIC_CANCEL_OK, 0));
    assert_bytes(m.consumer.consumer_tag, "ctag-golden");

    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, 0));
    assert_bytes(m.publish.exchange, "");
    assert_bytes(m.publish.routing_key, "twice.golden");
    assert_false(m.publish.mandatory || m.publish.immediate);
    m = decode_at(&g_client, find_method(&g_client, AMQP_CONFIRM_SELECT, 0));
    assert_false(m.nowait);
    assert_true(amqp_method_has_content(60, 40));
}

static void test_golden_deliveries(void **state)
{
    (void)state;
    static const bool redelivered[] = {false, false, false, true};
    for (int k = 0; k < 4; k++) {
        size_t i = find_method(&g_server, AMQP_BASIC_DELIVER, k);
        struct amqp_method m = decode_at(&g_server, i);
        assert_bytes(m.delivery.consumer_tag, "ctag-golden");
        assert_int_equal(m.delivery.delivery_tag, (uint64_t)k + 1);
        assert_int_equal(m.delivery.redelivered, redelivered[k]);
        assert_bytes(m.delivery.exchange, "");
        assert_bytes(m.delivery.routing_key, "twice.golden");
        /* The offsets point at the tag and the bit octet: 4 + 1 + len("ctag-golden"). */
        assert_int_equal(m.delivery.tag_offset, 16);
        assert_int_equal(m.delivery.redelivered_offset, 24);
        assert_int_equal(rec_payload(&g_server, i)[24], redelivered[k] ? 1 : 0);
    }
    struct amqp_method m = decode_at(&g_server, find_method(&g_server, AMQP_BASIC_GET_OK, 0));
    assert_int_equal(m.delivery.delivery_tag, 5);
    assert_false(m.delivery.redelivered);
    assert_int_equal(m.delivery.message_count, 0);
    assert_int_equal(m.delivery.tag_offset, 4);
    assert_int_equal(m.delivery.redelivered_offset, 12);
    assert_int_equal(m.delivery.consumer_tag.len, 0);
    m = decode_at(&g_server, find_method(&g_server, AMQP_BASIC_GET_EMPTY, 0));
    assert_int_equal(m.cluster_id.len, 0);
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_GET, 0));
    assert_bytes(m.get.queue, "twice.golden");
    assert_false(m.get.no_ack);
}

/* Client settlements, and the broker's publisher confirms travelling the other way. */
static void test_golden_acks(void **state)
{
    (void)state;
    struct amqp_method m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_ACK, 0));
    assert_int_equal(m.ack.delivery_tag, 1);
    assert_false(m.ack.multiple);
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_NACK, 0));
    assert_int_equal(m.ack.delivery_tag, 2);
    assert_false(m.ack.multiple);
    assert_true(m.ack.requeue);
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_REJECT, 0));
    assert_int_equal(m.ack.delivery_tag, 3);
    assert_false(m.ack.requeue);
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_ACK, 1));
    assert_int_equal(m.ack.delivery_tag, 4);
    assert_true(m.ack.multiple);
    m = decode_at(&g_client, find_method(&g_client, AMQP_BASIC_ACK, 2));
    assert_int_equal(m.ack.delivery_tag, 5);
    for (int k = 0; k < 4; k++) {
        m = decode_at(&g_server, find_method(&g_server, AMQP_BASIC_ACK, k));
        assert_int_equal(m.ack.delivery_tag, (uint64_t)k + 1);
    }
}

static void test_golden_close(void **state)
{
    (void)state;
    struct amqp_method m = decode_at(&g_client, find_method(&g_client, AMQP_CHANNEL_CLOSE, 0));
    assert_int_equal(m.close.reply_code, 0); /* pika's "Normal shutdown" uses code 0 */
    assert_bytes(m.close.reply_text, "Normal shutdown");
    assert_int_equal(m.close.class_id, 0);
    assert_int_equal(m.close.method_id, 0);
    m = decode_at(&g_client, g_client.n - 1);
    assert_int_equal(m.id, AMQP_CONNECTION_CLOSE);
    assert_int_equal(m.close.reply_code, 200);
    assert_bytes(m.close.reply_text, "Normal shutdown");
    m = decode_at(&g_server, g_server.n - 1);
    assert_int_equal(m.id, AMQP_CONNECTION_CLOSE_OK);
    assert_true(m.decoded);
}

/* For each content method: exactly one header, then body frames adding up to body_size. */
static void check_content(const struct golden *g, size_t i, struct amqp_props *p)
{
    uint16_t ch = g->frames[i].channel;
    size_t j = i + 1;
    assert_true(j < g->n);
    assert_int_equal(g->frames[j].type, AMQP_FRAME_HEADER);
    assert_int_equal(g->frames[j].channel, ch);
    assert_int_equal(amqp_content_header_decode(rec_payload(g, j), g->frames[j].size, p), 0);
    uint64_t got = 0;
    for (j++; j < g->n && g->frames[j].type == AMQP_FRAME_BODY; j++) {
        assert_int_equal(g->frames[j].channel, ch);
        assert_true(g->frames[j].size <= GOLDEN_FRAME_MAX - AMQP_FRAME_OVERHEAD);
        got += g->frames[j].size;
    }
    assert_int_equal(got, p->body_size);
}

static void check_celery_headers(const struct amqp_props *p, int n)
{
    char id[64], msg[16];
    snprintf(id, sizeof(id), "c0ffee00-0000-4000-8000-00000000000%d", n);
    snprintf(msg, sizeof(msg), "msg-%d", n);
    assert_bytes(p->message_id, msg);
    assert_bytes(p->correlation_id, id);
    assert_bytes(p->content_type, "application/json");
    assert_bytes(p->content_encoding, "utf-8");
    assert_int_equal(p->delivery_mode, 2);
    struct amqp_bytes v;
    assert_int_equal(amqp_table_find_string(p->headers, "id", &v), 1);
    assert_bytes(v, id);
    assert_int_equal(amqp_table_find_string(p->headers, "task", &v), 1);
    assert_bytes(v, "tasks.charge");
    assert_int_equal(amqp_table_find_string(p->headers, "missing", &v), 0);
    /* Present but not a longstr: an integer. */
    assert_int_equal(amqp_table_find_string(p->headers, "retries", &v), 0);
    int64_t retries = -1;
    assert_int_equal(amqp_table_find_int(p->headers, "retries", &retries), 1);
    assert_int_equal(retries, n - 1); /* capture_amqp.py: message n carries n - 1 */
    assert_int_equal(amqp_table_find_int(p->headers, "task", &retries), 0);
    assert_int_equal(amqp_table_find_int(p->headers, "missing", &retries), 0);
}

/* Message n of the session is the n-th publish; deliveries 1-3 are messages 1-3, delivery 4
 * is message 2 again, get-ok is message 4. */
static void test_golden_content_headers(void **state)
{
    (void)state;
    static const int deliver_msg[] = {1, 2, 3, 2};
    static const uint64_t body[] = {10000, 78, 78, 78, 78, 78};
    struct amqp_props p;
    for (int k = 0; k < 6; k++) {
        check_content(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, k), &p);
        check_celery_headers(&p, k + 1);
        assert_int_equal(p.body_size, body[k]);
    }
    for (int k = 0; k < 4; k++) {
        check_content(&g_server, find_method(&g_server, AMQP_BASIC_DELIVER, k), &p);
        check_celery_headers(&p, deliver_msg[k]);
    }
    check_content(&g_server, find_method(&g_server, AMQP_BASIC_GET_OK, 0), &p);
    check_celery_headers(&p, 4);
    /* Message 1 spans three body frames of at most frame_max - 8 bytes. */
    check_content(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, 0), &p);
    assert_int_equal(p.priority, 3);
    assert_bytes(p.app_id, "twice-rec");
    assert_int_equal(p.flags & AMQP_PROP_PRIORITY, AMQP_PROP_PRIORITY);
    check_content(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, 1), &p);
    assert_bytes(p.reply_to, "replies");
    assert_bytes(p.type, "task");
    assert_bytes(p.user_id, "guest");
    assert_int_equal(p.timestamp, 1700000000);
    check_content(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, 2), &p);
    assert_bytes(p.expiration, "600000");
    assert_int_equal(p.reply_to.len, 0);
}

/* Every field type pika writes, as recorded in message 1's headers. */
static void test_golden_table_types(void **state)
{
    (void)state;
    struct amqp_props p;
    struct amqp_field f;
    check_content(&g_client, find_method(&g_client, AMQP_BASIC_PUBLISH, 0), &p);
    assert_int_equal(amqp_table_find(p.headers, "big", &f), 1);
    assert_int_equal(f.type, 'l');
    assert_int_equal(f.i, INT64_C(1) << 40);
    int64_t n = 0;
    assert_int_equal(amqp_table_find_int(p.headers, "big", &n), 1);
    assert_int_equal(n, INT64_C(1) << 40);
    assert_int_equal(amqp_table_find(p.headers, "ok", &f), 1);
    assert_int_equal(f.type, 't');
    assert_int_equal(f.i, 1);
    /* A boolean and a timestamp are not integers to amqp_table_find_int(). */
    assert_int_equal(amqp_table_find_int(p.headers, "ok", &n), 0);
    assert_int_equal(amqp_table_find_int(p.headers, "when", &n), 0);
    assert_int_equal(amqp_table_find(p.headers, "raw", &f), 1);
    assert_int_equal(f.type, 'x');
    assert_int_equal(f.bytes.len, 2);
    assert_memory_equal(f.bytes.p, "\x00\x01", 2);
    assert_int_equal(amqp_table_find(p.headers, "price", &f), 1);
    assert_int_equal(f.type, 'D');
    assert_int_equal(f.decimal_scale, 2);
    assert_int_equal(f.i, 1234);
    assert_int_equal(amqp_table_find(p.headers, "when", &f), 1);
    assert_int_equal(f.type, 'T');
    assert_int_equal(f.i, 1704164645); /* 2024-01-02T03:04:05Z */
    assert_int_equal(amqp_table_find(p.headers, "eta", &f), 1);
    assert_int_equal(f.type, 'V');
    assert_int_equal(amqp_table_find(p.headers, "timelimit", &f), 1);
    assert_int_equal(f.type, 'A');
    assert_int_equal(f.bytes.len, 2);
    assert_int_equal(amqp_table_find(p.headers, "stamps", &f), 1);
    assert_int_equal(f.type, 'F');
    struct amqp_field inner;
    assert_int_equal(amqp_table_find(f.bytes, "depth", &inner), 1);
    assert_int_equal(inner.type, 'F');
    assert_int_equal(amqp_table_find(inner.bytes, "level", &inner), 1);
    assert_int_equal(inner.i, 2);
}

/* ---- every split point ------------------------------------------------------------------- */

/* A stand-in for the proxy session: bytes arrive in chunks into a heap buffer of exactly the
 * size received so far; complete frames are consumed; need-more waits for the next chunk. */
struct driver {
    const struct golden *g; /* the stream fed, and its one-shot scan */
    uint8_t *buf;
    size_t have;
    size_t consumed;
    bool header_done;
    struct rec out[GOLDEN_MAX_FRAMES];
    size_t n;
};

static void driver_pump(struct driver *d)
{
    for (;;) {
        const uint8_t *p = d->buf + d->consumed;
        size_t len = d->have - d->consumed;
        if (!d->header_done) {
            int rc = amqp_protocol_header_check(p, len);
            assert_true(rc >= 0);
            if (rc == 0)
                return;
            d->header_done = true;
            d->consumed += AMQP_PROTOCOL_HEADER_SIZE;
            continue;
        }
        struct amqp_frame f;
        int rc = amqp_frame_parse(p, len, GOLDEN_FRAME_MAX, &f);
        assert_true(rc >= 0);
        if (rc == 0) {
            assert_true(f.frame_len == 0 ? len < AMQP_FRAME_HEADER_SIZE : f.frame_len > len);
            return;
        }
        assert_int_equal(d->n < GOLDEN_MAX_FRAMES, 1);
        struct rec r = {f.type, f.channel, f.size, d->consumed + AMQP_FRAME_HEADER_SIZE,
                        f.frame_len};
        d->out[d->n++] = r;
        d->consumed += f.frame_len;
    }
}

static void driver_feed(void *ctx, const uint8_t *chunk, size_t n)
{
    struct driver *d = ctx;
    uint8_t *nb = malloc(d->have + n);
    assert_non_null(nb);
    if (d->have > 0)
        memcpy(nb, d->buf, d->have);
    memcpy(nb + d->have, chunk, n);
    free(d->buf);
    d->buf = nb;
    d->have += n;
    driver_pump(d);
}

static void driver_begin(void *ctx)
{
    struct driver *d = ctx;
    *d = (struct driver){.header_done = d->g->start == 0, .g = d->g};
}

/* The driver's frames equal the one-shot scan, payload bytes included. */
static void driver_check(void *ctx, const char *how)
{
    struct driver *d = ctx;
    const struct golden *g = d->g;
    if (d->consumed != g->len || d->n != g->n)
        fail_msg("%s: %zu frames in %zu bytes, the whole stream has %zu in %zu", how, d->n,
                 d->consumed, g->n, g->len);
    for (size_t i = 0; i < g->n; i++) {
        const struct rec *a = &d->out[i], *b = &g->frames[i];
        assert_int_equal(a->type, b->type);
        assert_int_equal(a->channel, b->channel);
        assert_int_equal(a->size, b->size);
        assert_int_equal(a->payload_off, b->payload_off);
        assert_memory_equal(d->buf + a->payload_off, g->buf + b->payload_off, b->size);
    }
    free(d->buf);
    d->buf = NULL;
}

static const struct kit_feed driver_ops = {driver_begin, driver_feed, driver_check};

static void split_everywhere(const struct golden *g)
{
    struct driver *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    d->g = g;
    kit_split_everywhere(g->buf, g->len, KIT_SPLIT_TWO | KIT_SPLIT_BYTES, &driver_ops, d);
    free(d);
}

static void test_split_client(void **state)
{
    (void)state;
    split_everywhere(&g_client);
}

static void test_split_server(void **state)
{
    (void)state;
    split_everywhere(&g_server);
}

/* ---- protocol header and frames ----------------------------------------------------------- */

static void test_protocol_header(void **state)
{
    (void)state;
    static const uint8_t v091[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    static const uint8_t legacy[] = {'A', 'M', 'Q', 'P', 1, 1, 0, 9};
    for (size_t n = 0; n < 8; n++) {
        assert_int_equal(amqp_protocol_header_check(v091, n), 0);
        assert_int_equal(amqp_protocol_header_check(legacy, n), 0);
    }
    assert_int_equal(amqp_protocol_header_check(v091, 8), 1);
    assert_int_equal(amqp_protocol_header_check(legacy, 8), 1);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQP\0\0\x09\x01xyz", 11), 1);
    /* Refused at the first byte that disagrees. */
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"G", 1), AMQP_E_NOT_AMQP);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"GET / HTTP/1.1", 14),
                     AMQP_E_NOT_AMQP);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"\x16\x03\x01", 3),
                     AMQP_E_NOT_AMQP);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQ", 3), 0);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQx", 4), AMQP_E_NOT_AMQP);
    /* AMQP 1.0, 1.0 SASL, 0-8, 0-9-0. */
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQP\0\x01\0\0", 8),
                     AMQP_E_VERSION);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQP\x03\x01", 6),
                     AMQP_E_VERSION);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQP\x01\x01\x00\x08", 8),
                     AMQP_E_VERSION);
    assert_int_equal(amqp_protocol_header_check((const uint8_t *)"AMQP\0\0\x09\x00", 8),
                     AMQP_E_VERSION);
}

/* A frame with an all-zero payload of `size` bytes in a heap buffer of exactly its size. */
static uint8_t *make_frame(uint8_t type, uint16_t channel, uint32_t size, size_t *len)
{
    *len = (size_t)size + AMQP_FRAME_OVERHEAD;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    b[0] = type;
    b[1] = (uint8_t)(channel >> 8);
    b[2] = (uint8_t)channel;
    b[3] = (uint8_t)(size >> 24);
    b[4] = (uint8_t)(size >> 16);
    b[5] = (uint8_t)(size >> 8);
    b[6] = (uint8_t)size;
    b[*len - 1] = AMQP_FRAME_END;
    return b;
}

static void test_frame_partial(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = make_frame(AMQP_FRAME_BODY, 3, 100, &len);
    struct amqp_frame f;
    for (size_t n = 0; n < len; n++) {
        assert_int_equal(amqp_frame_parse(b, n, 4096, &f), 0);
        assert_int_equal(f.frame_len, n < AMQP_FRAME_HEADER_SIZE ? 0 : len);
    }
    assert_int_equal(amqp_frame_parse(b, len, 4096, &f), 1);
    assert_int_equal(f.type, AMQP_FRAME_BODY);
    assert_int_equal(f.channel, 3);
    assert_int_equal(f.size, 100);
    assert_ptr_equal(f.payload, b + 7);
    assert_int_equal(f.frame_len, 108);
    free(b);
}

static void test_frame_end(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = make_frame(AMQP_FRAME_METHOD, 1, 13, &len);
    struct amqp_frame f;
    static const uint8_t bad_ends[] = {0x00, 0xCD, 0xCF, 0xFF, 0x0A};
    for (size_t i = 0; i < sizeof(bad_ends); i++) {
        b[len - 1] = bad_ends[i];
        assert_int_equal(amqp_frame_parse(b, len, 4096, &f), AMQP_E_FRAME_END);
    }
    free(b);
    uint8_t hb[] = {8, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(amqp_frame_parse(hb, sizeof(hb), 4096, &f), AMQP_E_FRAME_END);
}

static void test_frame_size_limits(void **state)
{
    (void)state;
    size_t len;
    struct amqp_frame f;
    /* Exactly frame_max - 8 is accepted; one more byte is refused from the 7 header bytes. */
    uint8_t *b = make_frame(AMQP_FRAME_BODY, 1, 4096 - 8, &len);
    assert_int_equal(len, 4096);
    assert_int_equal(amqp_frame_parse(b, len, 4096, &f), 1);
    free(b);
    b = make_frame(AMQP_FRAME_BODY, 1, 4096 - 7, &len);
    assert_int_equal(amqp_frame_parse(b, AMQP_FRAME_HEADER_SIZE, 4096, &f), AMQP_E_FRAME_TOO_LARGE);
    assert_int_equal(amqp_frame_parse(b, len, 4096, &f), AMQP_E_FRAME_TOO_LARGE);
    /* RabbitMQ's extra 8 bytes, when the caller asks for them. */
    assert_int_equal(amqp_frame_parse(b, len, 4096 + AMQP_FRAME_SIZE_FUDGE, &f), 1);
    free(b);
    /* Before tune-ok. */
    uint8_t hdr[7] = {AMQP_FRAME_METHOD, 0, 0, 0, 0, 0x0F, 0xF8}; /* 4088 */
    assert_int_equal(amqp_frame_parse(hdr, 7, AMQP_FRAME_MIN_SIZE, &f), 0);
    assert_int_equal(f.frame_len, AMQP_FRAME_MIN_SIZE);
    hdr[6] = 0xF9;
    assert_int_equal(amqp_frame_parse(hdr, 7, AMQP_FRAME_MIN_SIZE, &f), AMQP_E_FRAME_TOO_LARGE);
    /* frame_max 0 and anything above the limit mean AMQP_FRAME_MAX_LIMIT. */
    uint32_t max = AMQP_FRAME_MAX_LIMIT - 8;
    uint8_t big[7] = {
        AMQP_FRAME_BODY,     0,           1, (uint8_t)(max >> 24), (uint8_t)(max >> 16),
        (uint8_t)(max >> 8), (uint8_t)max};
    assert_int_equal(amqp_frame_parse(big, 7, 0, &f), 0);
    assert_int_equal(f.frame_len, AMQP_FRAME_MAX_LIMIT);
    assert_int_equal(amqp_frame_parse(big, 7, UINT32_MAX, &f), 0);
    big[6]++;
    assert_int_equal(amqp_frame_parse(big, 7, 0, &f), AMQP_E_FRAME_TOO_LARGE);
    assert_int_equal(amqp_frame_parse(big, 7, UINT32_MAX, &f), AMQP_E_FRAME_TOO_LARGE);
    uint8_t huge[7] = {AMQP_FRAME_BODY, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF};
    assert_int_equal(amqp_frame_parse(huge, 7, 0, &f), AMQP_E_FRAME_TOO_LARGE);
    assert_int_equal(amqp_frame_payload_max(0), AMQP_FRAME_MAX_LIMIT - 8);
    assert_int_equal(amqp_frame_payload_max(3), 0);
    assert_int_equal(amqp_frame_payload_max(8), 0);
    assert_int_equal(amqp_frame_payload_max(131072), 131064);
}

static void test_frame_type_and_heartbeat(void **state)
{
    (void)state;
    struct amqp_frame f;
    static const uint8_t bad_types[] = {0, 4, 5, 7, 9, 'A', 0xCE, 0xFF};
    for (size_t i = 0; i < sizeof(bad_types); i++) {
        uint8_t b[8] = {bad_types[i], 0, 0, 0, 0, 0, 0, 0xCE};
        /* Refused from the first byte. */
        assert_int_equal(amqp_frame_parse(b, 1, 4096, &f), AMQP_E_FRAME_TYPE);
        assert_int_equal(amqp_frame_parse(b, 8, 4096, &f), AMQP_E_FRAME_TYPE);
    }
    uint8_t hb[] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
    assert_int_equal(amqp_frame_parse(hb, 8, 4096, &f), 1);
    assert_int_equal(f.type, AMQP_FRAME_HEARTBEAT);
    assert_int_equal(f.frame_len, 8);
    uint8_t hb_payload[] = {8, 0, 0, 0, 0, 0, 1, 0, 0xCE};
    assert_int_equal(amqp_frame_parse(hb_payload, 7, 4096, &f), AMQP_E_HEARTBEAT);
    assert_int_equal(amqp_frame_parse(hb_payload, 9, 4096, &f), AMQP_E_HEARTBEAT);
    uint8_t hb_channel[] = {8, 0, 1, 0, 0, 0, 0, 0xCE};
    assert_int_equal(amqp_frame_parse(hb_channel, 8, 4096, &f), AMQP_E_HEARTBEAT);
}

/* ---- methods --------------------------------------------------------------------------- */

/* Decodes bytes copied into a heap buffer of exactly n bytes, so an over-read is caught.  The
 * copy is freed before returning: use for return codes and ids, not views. */
static int decode_exact(const void *bytes, size_t n, struct amqp_method *m)
{
    uint8_t *b = malloc(n == 0 ? 1 : n);
    assert_non_null(b);
    memcpy(b, bytes, n);
    int rc = amqp_method_decode(b, (uint32_t)n, m);
    free(b);
    return rc;
}

static void test_method_truncated(void **state)
{
    (void)state;
    struct amqp_method m;
    assert_int_equal(decode_exact("\x00\x3C\x00", 3, &m), AMQP_E_TRUNCATED);
    assert_int_equal(decode_exact("", 0, &m), AMQP_E_TRUNCATED);
    /* basic.consume whose queue shortstr claims 200 bytes of a 10-byte payload. */
    static const uint8_t consume[] = {0, 60, 0, 20, 0, 0, 200, 'q', 'u', 'e'};
    assert_int_equal(decode_exact(consume, sizeof(consume), &m), AMQP_E_TRUNCATED);
    assert_int_equal(m.id, AMQP_BASIC_CONSUME);
    assert_false(m.decoded);
    assert_null(m.consume.queue.p);
    /* basic.ack without its bits octet; with one byte too many. */
    static const uint8_t ack[] = {0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0};
    assert_int_equal(decode_exact(ack, 12, &m), AMQP_E_TRUNCATED);
    assert_int_equal(decode_exact(ack, 13, &m), 0);
    assert_int_equal(decode_exact(ack, 14, &m), AMQP_E_TRAILING);
    /* start-ok whose response longstr length is 0xFFFFFFFF. */
    static const uint8_t start_ok[] = {0,   10,  0,   11,  0,    0,    0,    0,    5, 'P',
                                       'L', 'A', 'I', 'N', 0xFF, 0xFF, 0xFF, 0xFF, 0};
    assert_int_equal(decode_exact(start_ok, sizeof(start_ok), &m), AMQP_E_TRUNCATED);
    /* A method twice does not decode is not checked beyond its ids. */
    static const uint8_t declare[] = {0, 50, 0, 10, 0xFF};
    assert_int_equal(decode_exact(declare, sizeof(declare), &m), 0);
    assert_false(m.decoded);
    assert_int_equal(m.id, AMQP_MID(50, 10));
}

/* Every strict prefix of every decoded golden method fails; one extra byte fails too. */
static void check_prefixes(const struct golden *g)
{
    uint8_t extra[8192];
    for (size_t i = 0; i < g->n; i++) {
        if (g->frames[i].type != AMQP_FRAME_METHOD)
            continue;
        struct amqp_method m = decode_at(g, i);
        if (!m.decoded)
            continue;
        uint32_t size = g->frames[i].size;
        for (uint32_t n = 0; n < size; n++)
            assert_true(decode_exact(rec_payload(g, i), n, &m) < 0);
        assert_true(size < sizeof(extra));
        memcpy(extra, rec_payload(g, i), size);
        extra[size] = 0;
        assert_int_equal(decode_exact(extra, size + 1, &m), AMQP_E_TRAILING);
    }
}

static void test_method_prefixes(void **state)
{
    (void)state;
    check_prefixes(&g_client);
    check_prefixes(&g_server);
}

static void test_method_bits(void **state)
{
    (void)state;
    struct amqp_method m;
    /* Decoded in place (views are inspected): the arrays are exactly the payload size. */
    /* LSB first; reserved bits ignored. */
    static const uint8_t nack[] = {0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 9, 0xFE};
    assert_int_equal(amqp_method_decode(nack, sizeof(nack), &m), 0);
    assert_false(m.ack.multiple);
    assert_true(m.ack.requeue);
    static const uint8_t consume[] = {0, 60, 0, 20, 0, 0, 1, 'q', 0, 0x0A, 0, 0, 0, 0};
    assert_int_equal(amqp_method_decode(consume, sizeof(consume), &m), 0);
    assert_false(m.consume.no_local);
    assert_true(m.consume.no_ack);
    assert_false(m.consume.exclusive);
    assert_true(m.consume.nowait);
    assert_int_equal(m.consume.arguments.len, 0);
    static const uint8_t qos[] = {0, 60, 0, 10, 0, 0, 0, 0, 0x01, 0x2C, 1};
    assert_int_equal(amqp_method_decode(qos, sizeof(qos), &m), 0);
    assert_int_equal(m.qos.prefetch_count, 300);
    assert_true(m.qos.global);
    static const uint8_t flow[] = {0, 20, 0, 20, 1};
    assert_int_equal(amqp_method_decode(flow, sizeof(flow), &m), 0);
    assert_true(m.active);
    static const uint8_t recover[] = {0, 60, 0, 110, 1};
    assert_int_equal(amqp_method_decode(recover, sizeof(recover), &m), 0);
    assert_true(m.requeue);
    static const uint8_t recover_async[] = {0, 60, 0, 100, 0};
    assert_int_equal(amqp_method_decode(recover_async, sizeof(recover_async), &m), 0);
    assert_false(m.requeue);
    static const uint8_t ret[] = {0, 60, 0, 50, 0x01, 0x38, 2, 'N', 'R', 1, 'x', 1, 'k'};
    assert_int_equal(amqp_method_decode(ret, sizeof(ret), &m), 0);
    assert_int_equal(m.ret.reply_code, 312);
    assert_bytes(m.ret.reply_text, "NR");
    assert_bytes(m.ret.exchange, "x");
    assert_bytes(m.ret.routing_key, "k");
    assert_true(amqp_method_has_content(60, 50));
}

static void test_method_names(void **state)
{
    (void)state;
    assert_string_equal(amqp_method_name(60, 60), "basic.deliver");
    assert_string_equal(amqp_method_name(10, 11), "connection.start-ok");
    assert_string_equal(amqp_method_name(90, 31), "tx.rollback-ok");
    assert_string_equal(amqp_method_name(50, 10), "queue.declare");
    assert_string_equal(amqp_method_name(0, 0), "unknown");
    assert_string_equal(amqp_method_name(60, 121), "unknown");
    assert_string_equal(amqp_method_name(0xFFFF, 0xFFFF), "unknown");
    assert_true(amqp_method_table_ok()); /* sorted, each entry found by its id */
    int named = 0, content = 0;
    for (unsigned c = 0; c < 100; c++) {
        for (unsigned k = 0; k < 130; k++) {
            named += strcmp(amqp_method_name((uint16_t)c, (uint16_t)k), "unknown") != 0;
            content += amqp_method_has_content((uint16_t)c, (uint16_t)k);
        }
    }
    assert_int_equal(named, 66);
    assert_int_equal(content, 4);
    assert_true(amqp_method_has_content(60, 40) && amqp_method_has_content(60, 71));
    assert_false(amqp_method_has_content(60, 80));
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(amqp_strerror(AMQP_OK), "ok");
    for (int rc = -1; rc >= AMQP_E_STRING_TOO_LONG; rc--) {
        assert_string_not_equal(amqp_strerror(rc), "unknown error");
        for (int other = rc + 1; other < 0; other++)
            assert_string_not_equal(amqp_strerror(rc), amqp_strerror(other));
    }
    assert_string_equal(amqp_strerror(AMQP_E_STRING_TOO_LONG - 1), "unknown error");
    assert_string_equal(amqp_strerror(1), "unknown error");
    assert_string_equal(amqp_strerror(INT_MIN), "unknown error");
}

/* ---- tables and content headers ---------------------------------------------------------- */

/* A content header with only the headers property: 14 bytes + u32 length + entries. */
static size_t make_header(uint8_t *out, const uint8_t *table, uint32_t table_len)
{
    static const uint8_t fixed[] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0x20, 0x00};
    memcpy(out, fixed, sizeof(fixed));
    out[14] = (uint8_t)(table_len >> 24);
    out[15] = (uint8_t)(table_len >> 16);
    out[16] = (uint8_t)(table_len >> 8);
    out[17] = (uint8_t)table_len;
    memcpy(out + 18, table, table_len);
    return 18 + table_len;
}

/* As decode_exact(), for content headers: return codes and scalars only. */
static int decode_header_exact(const uint8_t *bytes, size_t n, struct amqp_props *p)
{
    uint8_t *b = malloc(n == 0 ? 1 : n);
    assert_non_null(b);
    memcpy(b, bytes, n);
    int rc = amqp_content_header_decode(b, (uint32_t)n, p);
    free(b);
    return rc;
}

static void test_header_short_and_flags(void **state)
{
    (void)state;
    struct amqp_props p;
    static const uint8_t h[] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0x00, 0x00};
    for (size_t n = 0; n < sizeof(h); n++)
        assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_HEADER);
    assert_int_equal(decode_header_exact(h, sizeof(h), &p), 0);
    assert_int_equal(p.body_size, 7);
    assert_int_equal(p.flags, 0);
    uint8_t c[sizeof(h)];
    memcpy(c, h, sizeof(h));
    c[13] = 0x01; /* continuation */
    assert_int_equal(decode_header_exact(c, sizeof(c), &p), AMQP_E_PROP_FLAGS);
    c[13] = 0x00;
    c[1] = 10; /* class connection has no content */
    assert_int_equal(decode_header_exact(c, sizeof(c), &p), AMQP_E_BAD_HEADER);
    /* A flagged property that is not there; a byte nobody claims. */
    uint8_t t[sizeof(h) + 1];
    memcpy(t, h, sizeof(h));
    t[12] = 0x80; /* content-type */
    assert_int_equal(decode_header_exact(t, sizeof(h), &p), AMQP_E_TRUNCATED);
    t[12] = 0x00;
    t[sizeof(h)] = 0;
    assert_int_equal(decode_header_exact(t, sizeof(t), &p), AMQP_E_TRAILING);
    t[12] = 0x80;
    assert_int_equal(decode_header_exact(t, sizeof(t), &p), 0);
    assert_int_equal(p.content_type.len, 0);
    assert_int_equal(p.flags, 0x8000);
}

static void test_table_malformed(void **state)
{
    (void)state;
    uint8_t h[256];
    struct amqp_props p;
    struct amqp_field f;
    /* "id" S with a length beyond the table. */
    static const uint8_t over[] = {2, 'i', 'd', 'S', 0, 0, 0, 9, 'x'};
    size_t n = make_header(h, over, sizeof(over));
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_TABLE);
    struct amqp_bytes t = {over, sizeof(over)};
    assert_int_equal(amqp_table_find(t, "id", &f), AMQP_E_BAD_TABLE);
    /* The table's own length beyond the payload. */
    h[17] += 1;
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_TRUNCATED);
    /* Unknown type, a name running past the end, a missing type octet. */
    static const uint8_t unknown[] = {1, 'k', 'Z', 0};
    n = make_header(h, unknown, sizeof(unknown));
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_TABLE);
    static const uint8_t name[] = {9, 'k'};
    n = make_header(h, name, sizeof(name));
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_TABLE);
    static const uint8_t notype[] = {1, 'k'};
    n = make_header(h, notype, sizeof(notype));
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_TABLE);
    /* An integer cut short, inside an array. */
    static const uint8_t arr[] = {1, 'a', 'A', 0, 0, 0, 3, 'I', 0, 0};
    n = make_header(h, arr, sizeof(arr));
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_BAD_TABLE);
    /* Every type, well formed. */
    static const uint8_t all[] = {1,    'a',  't',  1,    1,    'b',  'b',  0xFF, 1,   'c',  'B',
                                  0xFF, 1,    'd',  's',  0xFF, 0xFE, 1,    'e',  'u', 0xFF, 0xFE,
                                  1,    'f',  'I',  0xFF, 0xFF, 0xFF, 0xFF, 1,    'g', 'i',  0xFF,
                                  0xFF, 0xFF, 0xFF, 1,    'h',  'f',  0x3F, 0xC0, 0,   0,    1,
                                  'j',  'd',  0x40, 0x04, 0,    0,    0,    0,    0,   0,    1,
                                  'k',  'V',  0,    'D',  1,    0,    0,    0,    7};
    n = make_header(h, all, sizeof(all));
    assert_int_equal(decode_header_exact(h, n, &p), 0);
    assert_int_equal(amqp_content_header_decode(h, (uint32_t)n, &p), 0); /* views into h */
    static const struct {
        const char *key;
        int64_t i;
    } ints[] = {{"a", 1},     {"b", -1}, {"c", 255},       {"d", -2},
                {"e", 65534}, {"f", -1}, {"g", 4294967295}};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        assert_int_equal(amqp_table_find(p.headers, ints[i].key, &f), 1);
        assert_int_equal(f.i, ints[i].i);
    }
    assert_int_equal(amqp_table_find(p.headers, "h", &f), 1);
    assert_true(f.d == 1.5);
    assert_int_equal(amqp_table_find(p.headers, "j", &f), 1);
    assert_true(f.d == 2.5);
    assert_int_equal(amqp_table_find(p.headers, "", &f), 1);
    assert_int_equal(f.decimal_scale, 1);
    assert_int_equal(f.i, 7);
}

static size_t put_len(uint8_t *out, size_t off, uint32_t v)
{
    out[off] = (uint8_t)(v >> 24);
    out[off + 1] = (uint8_t)(v >> 16);
    out[off + 2] = (uint8_t)(v >> 8);
    out[off + 3] = (uint8_t)v;
    return off + 4;
}

/* The entries of a top-level table (depth 1) holding `depth` - 1 nested levels, innermost
 * empty: with kind 'F' each level is a table with one entry "n"; with 'A' the top-level entry
 * "n" is an array whose only item is an array, and so on.  depth >= 2. */
static size_t make_nested(uint8_t *out, unsigned depth, uint8_t kind)
{
    size_t off = 0;
    if (kind == 'F') {
        for (unsigned lvl = 1; lvl < depth; lvl++) {
            out[off++] = 1;
            out[off++] = 'n';
            out[off++] = 'F';
            off = put_len(out, off, 7u * (depth - 1 - lvl));
        }
        return off;
    }
    out[off++] = 1;
    out[off++] = 'n';
    out[off++] = 'A';
    off = put_len(out, off, 5u * (depth - 2));
    for (unsigned lvl = 2; lvl < depth; lvl++) {
        out[off++] = 'A';
        off = put_len(out, off, 5u * (depth - 1 - lvl));
    }
    return off;
}

static void test_table_depth(void **state)
{
    (void)state;
    static uint8_t t[2048];
    struct amqp_bytes b;
    /* AMQP_TABLE_MAX_DEPTH levels (the top-level table counts as one) pass; one more fails. */
    b.p = t;
    b.len = (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH, 'F');
    assert_int_equal(amqp_table_validate(b), 0);
    b.len = (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH + 1, 'F');
    assert_int_equal(amqp_table_validate(b), AMQP_E_TABLE_DEPTH);
    b.len = (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH, 'A');
    assert_int_equal(amqp_table_validate(b), 0);
    b.len = (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH + 1, 'A');
    assert_int_equal(amqp_table_validate(b), AMQP_E_TABLE_DEPTH);
    b.len = (uint32_t)make_nested(t, 200, 'F');
    assert_int_equal(amqp_table_validate(b), AMQP_E_TABLE_DEPTH);
    /* Through the content header too, and lookups at the top still work. */
    static uint8_t h[1200];
    size_t n = make_header(h, t, (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH + 1, 'F'));
    struct amqp_props p;
    assert_int_equal(decode_header_exact(h, n, &p), AMQP_E_TABLE_DEPTH);
    struct amqp_field f;
    b.len = (uint32_t)make_nested(t, AMQP_TABLE_MAX_DEPTH + 1, 'F');
    assert_int_equal(amqp_table_find(b, "n", &f), 1);
    assert_int_equal(f.type, 'F');
}

/* ---- encoders and patchers ----------------------------------------------------------------- */

static void check_encoded(const uint8_t *got, int len, const uint8_t *want, size_t want_len)
{
    assert_int_equal(len, (int)want_len);
    assert_memory_equal(got, want, want_len);
}

static void test_encode_exact(void **state)
{
    (void)state;
    uint8_t b[AMQP_ENCODE_MAX];
    static const uint8_t ack5[] = {0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0D, 0x00, 0x3C, 0x00, 0x50,
                                   0,    0,    0,    0,    0,    0,    0,    5,    0x00, 0xCE};
    check_encoded(b, amqp_encode_basic_ack(b, sizeof(b), 1, 5, false), ack5, sizeof(ack5));
    static const uint8_t reject[] = {1, 0, 2, 0, 0, 0, 13, 0, 60, 0,   90,
                                     1, 2, 3, 4, 5, 6, 7,  8, 1,  0xCE};
    check_encoded(b, amqp_encode_basic_reject(b, sizeof(b), 2, 0x0102030405060708u, true), reject,
                  sizeof(reject));
    static const uint8_t nack[] = {1, 0xFF, 0xFF, 0, 0, 0, 13, 0, 60, 0,   120,
                                   0, 0,    0,    0, 0, 0, 0,  9, 3,  0xCE};
    check_encoded(b, amqp_encode_basic_nack(b, sizeof(b), 0xFFFF, 9, true, true), nack,
                  sizeof(nack));
    static const uint8_t cclose[] = {1, 0,   1,   0,   0,   0,   17,  0, 20, 0, 40, 0x01, 0x96,
                                     6, 'P', 'R', 'E', 'C', 'O', 'N', 0, 60, 0, 80, 0xCE};
    check_encoded(b, amqp_encode_channel_close(b, sizeof(b), 1, 406, amqp_cstr("PRECON"), 60, 80),
                  cclose, sizeof(cclose));
    static const uint8_t cclose_ok[] = {1, 0, 7, 0, 0, 0, 4, 0, 20, 0, 41, 0xCE};
    check_encoded(b, amqp_encode_channel_close_ok(b, sizeof(b), 7), cclose_ok, sizeof(cclose_ok));
    static const uint8_t close[] = {1,  0,    0,    0, 0, 0, 11, 0, 10,  0,
                                    50, 0x01, 0x40, 0, 0, 0, 0,  0, 0xCE};
    check_encoded(b, amqp_encode_connection_close(b, sizeof(b), 320, amqp_cstr(""), 0, 0), close,
                  sizeof(close));
    static const uint8_t close_ok[] = {1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 51, 0xCE};
    check_encoded(b, amqp_encode_connection_close_ok(b, sizeof(b)), close_ok, sizeof(close_ok));
    static const uint8_t hb[] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
    check_encoded(b, amqp_encode_heartbeat(b, sizeof(b)), hb, sizeof(hb));
}

/* The encoders reproduce, byte for byte, frames pika and RabbitMQ put in the capture. */
static void test_encode_matches_capture(void **state)
{
    (void)state;
    uint8_t b[AMQP_ENCODE_MAX];
    const struct golden *c = &g_client, *s = &g_server;
    size_t i = find_method(c, AMQP_BASIC_ACK, 0);
    check_encoded(b, amqp_encode_basic_ack(b, sizeof(b), 1, 1, false), rec_frame(c, i), 21);
    i = find_method(c, AMQP_BASIC_NACK, 0);
    check_encoded(b, amqp_encode_basic_nack(b, sizeof(b), 1, 2, false, true), rec_frame(c, i), 21);
    i = find_method(c, AMQP_BASIC_REJECT, 0);
    check_encoded(b, amqp_encode_basic_reject(b, sizeof(b), 1, 3, false), rec_frame(c, i), 21);
    i = find_method(c, AMQP_BASIC_ACK, 1);
    check_encoded(b, amqp_encode_basic_ack(b, sizeof(b), 1, 4, true), rec_frame(c, i), 21);
    i = find_method(c, AMQP_CHANNEL_CLOSE, 0);
    int n = amqp_encode_channel_close(b, sizeof(b), 2, 0, amqp_cstr("Normal shutdown"), 0, 0);
    check_encoded(b, n, rec_frame(c, i), c->frames[i].frame_len);
    i = c->n - 1;
    n = amqp_encode_connection_close(b, sizeof(b), 200, amqp_cstr("Normal shutdown"), 0, 0);
    check_encoded(b, n, rec_frame(c, i), c->frames[i].frame_len);
    i = find_method(s, AMQP_CHANNEL_CLOSE_OK, 0);
    check_encoded(b, amqp_encode_channel_close_ok(b, sizeof(b), 2), rec_frame(s, i), 12);
    i = s->n - 1;
    check_encoded(b, amqp_encode_connection_close_ok(b, sizeof(b)), rec_frame(s, i), 12);
    i = find_method(s, AMQP_BASIC_ACK, 0); /* a publisher confirm has the same layout */
    check_encoded(b, amqp_encode_basic_ack(b, sizeof(b), 1, 1, false), rec_frame(s, i), 21);
}

/* Every basic.publish pika sent, decoded and encoded again, is the same frame; a buffer one
 * byte short fails without writing past it; strings over 255 bytes are refused. */
static void test_encode_publish(void **state)
{
    (void)state;
    const struct golden *c = &g_client;
    size_t seen = 0;
    for (size_t i = 0; i < c->n; i++) {
        struct amqp_method m;
        if (c->frames[i].type != AMQP_FRAME_METHOD)
            continue;
        assert_int_equal(amqp_method_decode(rec_payload(c, i), c->frames[i].size, &m), 0);
        if (m.id != AMQP_BASIC_PUBLISH)
            continue;
        uint8_t b[AMQP_ENCODE_PUBLISH_MAX];
        int n = amqp_encode_basic_publish(b, sizeof(b), c->frames[i].channel, &m.publish);
        check_encoded(b, n, rec_frame(c, i), c->frames[i].frame_len);
        assert_int_equal(
            amqp_encode_basic_publish(b, (size_t)n - 1, c->frames[i].channel, &m.publish),
            AMQP_E_BUFFER);
        seen++;
    }
    assert_true(seen > 0);
    static char text[300];
    memset(text, 'k', sizeof(text) - 1);
    struct amqp_publish p = {.exchange = {(const uint8_t *)text, 255},
                             .routing_key = {(const uint8_t *)text, 255},
                             .mandatory = true};
    uint8_t b[AMQP_ENCODE_PUBLISH_MAX];
    int n = amqp_encode_basic_publish(b, sizeof(b), 3, &p);
    assert_int_equal(n, (int)AMQP_ENCODE_PUBLISH_MAX); /* the bound is exact */
    struct amqp_frame f;
    struct amqp_method m;
    assert_int_equal(amqp_frame_parse(b, (size_t)n, AMQP_FRAME_MIN_SIZE, &f), 1);
    assert_int_equal(amqp_method_decode(f.payload, f.size, &m), 0);
    assert_int_equal(m.id, AMQP_BASIC_PUBLISH);
    assert_int_equal(m.publish.routing_key.len, 255);
    assert_true(m.publish.mandatory);
    assert_false(m.publish.immediate);
    p.routing_key.len = 256;
    assert_int_equal(amqp_encode_basic_publish(b, sizeof(b), 3, &p), AMQP_E_STRING_TOO_LONG);
}

static int encode_any(int which, uint8_t *b, size_t cap, struct amqp_bytes text)
{
    switch (which) {
    case 0:
        return amqp_encode_basic_ack(b, cap, 1, 5, true);
    case 1:
        return amqp_encode_basic_reject(b, cap, 1, 5, true);
    case 2:
        return amqp_encode_basic_nack(b, cap, 1, 5, true, false);
    case 3:
        return amqp_encode_channel_close(b, cap, 1, 406, text, 60, 80);
    case 4:
        return amqp_encode_channel_close_ok(b, cap, 1);
    case 5:
        return amqp_encode_connection_close(b, cap, 320, text, 0, 0);
    case 6:
        return amqp_encode_connection_close_ok(b, cap);
    default:
        return amqp_encode_heartbeat(b, cap);
    }
}

static void test_encode_buffer_limits(void **state)
{
    (void)state;
    static char text[300];
    memset(text, 'x', sizeof(text) - 1);
    struct amqp_bytes t255 = {(const uint8_t *)text, 255}, t256 = {(const uint8_t *)text, 256};
    uint8_t b[AMQP_ENCODE_MAX + 1];
    for (int which = 0; which < 8; which++) {
        int full = encode_any(which, b, AMQP_ENCODE_MAX, t255);
        assert_true(full > 0 && full <= (int)AMQP_ENCODE_MAX);
        /* Every smaller capacity fails, and never writes past it. */
        for (int cap = 0; cap < full; cap++) {
            memset(b, 0xAA, sizeof(b));
            assert_int_equal(encode_any(which, b, (size_t)cap, t255), AMQP_E_BUFFER);
            for (size_t k = (size_t)cap; k < sizeof(b); k++)
                assert_int_equal(b[k], 0xAA);
        }
        struct amqp_frame f;
        assert_int_equal(encode_any(which, b, AMQP_ENCODE_MAX, t255), full);
        assert_int_equal(amqp_frame_parse(b, (size_t)full, AMQP_FRAME_MIN_SIZE, &f), 1);
        assert_int_equal(f.frame_len, (size_t)full);
    }
    assert_int_equal(encode_any(3, b, sizeof(b), t255), (int)AMQP_ENCODE_MAX);
    assert_int_equal(encode_any(3, b, sizeof(b), t256), AMQP_E_STRING_TOO_LONG);
    assert_int_equal(encode_any(5, b, sizeof(b), t256), AMQP_E_STRING_TOO_LONG);
}

static void test_patchers(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        const struct golden *g = &g_server;
        size_t i = find_method(g, k == 0 ? AMQP_BASIC_DELIVER : AMQP_BASIC_GET_OK, 0);
        uint32_t size = g->frames[i].size;
        uint8_t *copy = malloc(size);
        assert_non_null(copy);
        memcpy(copy, rec_payload(g, i), size);
        struct amqp_method m;
        assert_int_equal(amqp_method_decode(copy, size, &m), 0);
        amqp_patch_delivery_tag(copy, m.delivery.tag_offset, 0x0102030405060708u);
        amqp_set_redelivered(copy, m.delivery.redelivered_offset, true);
        assert_int_equal(amqp_method_decode(copy, size, &m), 0);
        assert_int_equal(m.delivery.delivery_tag, 0x0102030405060708u);
        assert_true(m.delivery.redelivered);
        assert_bytes(m.delivery.routing_key, "twice.golden");
        amqp_patch_delivery_tag(copy, m.delivery.tag_offset, k == 0 ? 1 : 5);
        amqp_set_redelivered(copy, m.delivery.redelivered_offset, false);
        assert_memory_equal(copy, rec_payload(g, i), size);
        free(copy);
    }
    /* The ack tag sits at payload offset 4; other bits of the octet survive. */
    uint8_t b[AMQP_ENCODE_MAX];
    assert_int_equal(amqp_encode_basic_nack(b, sizeof(b), 1, 7, false, true), 21);
    amqp_patch_delivery_tag(b + 7, 4, UINT64_MAX);
    amqp_set_redelivered(b + 7, 12, true);
    struct amqp_method m;
    assert_int_equal(amqp_method_decode(b + 7, 13, &m), 0);
    assert_int_equal(m.ack.delivery_tag, UINT64_MAX);
    assert_true(m.ack.multiple && m.ack.requeue);
}

/* ---- mutations -------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static bool view_inside(struct amqp_bytes v, const uint8_t *base, size_t len)
{
    if (v.len == 0)
        return true;
    return v.p >= base && v.p <= base + len && v.len <= (size_t)(base + len - v.p);
}

static void check_method_views(const struct amqp_method *m, const uint8_t *p, uint32_t size)
{
    if (!m->decoded)
        return;
    switch (m->id) {
    case AMQP_BASIC_DELIVER:
    case AMQP_BASIC_GET_OK:
        assert_true(m->delivery.tag_offset + 8u <= size);
        assert_true(m->delivery.redelivered_offset < size);
        assert_true(view_inside(m->delivery.routing_key, p, size));
        break;
    case AMQP_CONNECTION_START_OK:
        assert_true(view_inside(m->start_ok.response, p, size));
        assert_true(m->start_ok.response_offset + m->start_ok.response.len <= size);
        break;
    case AMQP_BASIC_CONSUME:
        assert_true(view_inside(m->consume.arguments, p, size));
        break;
    default:
        break;
    }
}

/* Runs every decoder over a mutated payload; returns how many of them succeeded. */
static int decode_everything(const uint8_t *p, uint32_t size)
{
    struct amqp_method m;
    struct amqp_props props;
    struct amqp_field f;
    struct amqp_bytes s;
    int ok = 0;
    int rc = amqp_method_decode(p, size, &m);
    assert_true(rc <= 0 && rc >= AMQP_E_STRING_TOO_LONG);
    if (rc == 0) {
        check_method_views(&m, p, size);
        ok++;
    }
    rc = amqp_content_header_decode(p, size, &props);
    assert_true(rc <= 0 && rc >= AMQP_E_STRING_TOO_LONG);
    if (rc == 0) {
        assert_true(view_inside(props.headers, p, size));
        assert_true(view_inside(props.message_id, p, size));
        /* A validated table never fails a lookup. */
        assert_true(amqp_table_find(props.headers, "id", &f) >= 0);
        assert_true(amqp_table_find_string(props.headers, "task", &s) >= 0);
        ok++;
    }
    return ok;
}

#define MUTATIONS 40000

struct mutation_counts {
    int frames;  /* mutants that still framed */
    int decoded; /* decoder calls that returned 0 */
};

static void mutate_one(const struct golden *g, struct mutation_counts *c)
{
    size_t i = rng() % g->n;
    size_t len = g->frames[i].frame_len;
    /* Sometimes truncate or extend by a few bytes. */
    size_t n = len;
    uint32_t shape = rng() % 8;
    if (shape == 0)
        n = len - (1 + rng() % (len < 8 ? len : 8));
    else if (shape == 1)
        n = len + 1 + rng() % 4;
    uint8_t *b = malloc(n == 0 ? 1 : n);
    assert_non_null(b);
    memcpy(b, rec_frame(g, i), n < len ? n : len);
    for (size_t k = len; k < n; k++)
        b[k] = (uint8_t)rng();
    unsigned flips = 1 + rng() % 4;
    for (unsigned k = 0; k < flips && n > 0; k++)
        b[rng() % n] ^= (uint8_t)(1u << (rng() % 8));
    struct amqp_frame f;
    int rc = amqp_frame_parse(b, n, GOLDEN_FRAME_MAX, &f);
    assert_true(rc <= 1 && rc >= AMQP_E_STRING_TOO_LONG);
    if (rc == 1) {
        assert_true(f.frame_len <= n);
        c->frames++;
        c->decoded += decode_everything(f.payload, f.size);
    }
    /* The payload alone, mutated or not, whatever the frame header said. */
    if (n > AMQP_FRAME_HEADER_SIZE)
        c->decoded +=
            decode_everything(b + AMQP_FRAME_HEADER_SIZE, (uint32_t)(n - AMQP_FRAME_HEADER_SIZE));
    free(b);
}

static void test_mutations(void **state)
{
    (void)state;
    struct mutation_counts c = {0, 0};
    for (int k = 0; k < MUTATIONS; k++)
        mutate_one(k % 2 == 0 ? &g_client : &g_server, &c);
    /* The run exercised both sides: mutants that still frame and decode, and mutants that
     * fail (a mutation run where nothing parses would prove nothing). */
    print_message("%d mutations: %d still framed, %d decoder calls succeeded\n", MUTATIONS,
                  c.frames, c.decoded);
    assert_true(c.frames > MUTATIONS / 10 && c.frames < MUTATIONS);
    assert_true(c.decoded > MUTATIONS / 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_client_sequence),
        cmocka_unit_test(test_golden_server_sequence),
        cmocka_unit_test(test_golden_handshake),
        cmocka_unit_test(test_golden_consume),
        cmocka_unit_test(test_golden_deliveries),
        cmocka_unit_test(test_golden_acks),
        cmocka_unit_test(test_golden_close),
        cmocka_unit_test(test_golden_content_headers),
        cmocka_unit_test(test_golden_table_types),
        cmocka_unit_test(test_split_client),
        cmocka_unit_test(test_split_server),
        cmocka_unit_test(test_protocol_header),
        cmocka_unit_test(test_frame_partial),
        cmocka_unit_test(test_frame_end),
        cmocka_unit_test(test_frame_size_limits),
        cmocka_unit_test(test_frame_type_and_heartbeat),
        cmocka_unit_test(test_method_truncated),
        cmocka_unit_test(test_method_prefixes),
        cmocka_unit_test(test_method_bits),
        cmocka_unit_test(test_method_names),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_header_short_and_flags),
        cmocka_unit_test(test_table_malformed),
        cmocka_unit_test(test_table_depth),
        cmocka_unit_test(test_encode_exact),
        cmocka_unit_test(test_encode_matches_capture),
        cmocka_unit_test(test_encode_publish),
        cmocka_unit_test(test_encode_buffer_limits),
        cmocka_unit_test(test_patchers),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, setup_golden, teardown_golden);
}
