/*
 * test_resp.c - the RESP2/RESP3 codec (proto/resp*.c) against real traffic and hostile input.
 *
 *   - Golden streams recorded from redis-server 7.0 (tests/unit/data/resp/NAME-{client,server}.bin,
 *     see tests/unit/capture_resp.py): every message scans, the message sequence is the one an
 *     independent Python parser describes, and chosen messages carry the right types, flags and
 *     element views (inline quoting, attributes, pushes, verbatim, nested stream replies...).
 *   - The same streams fed to an incremental driver split at every offset and byte by byte,
 *     through a heap buffer of exactly the bytes received so far (ASan/valgrind see any
 *     over-read), give the same messages; the 100 KiB value also in 16 KiB pieces, and a 64 MiB
 *     bulk in 16 KiB pieces is scanned without re-reading what was validated.
 *   - The pairing helper, fed the recorded commands and replies, pairs every reply with the
 *     command it answers: MULTI/EXEC (with the commands each EXEC element answers), EXECABORT,
 *     WATCH, blocking commands, CLIENT REPLY OFF/SKIP, RESP2 and RESP3 pub/sub, pushes.
 *   - Malformed input returns the right code; every named limit is crossed by one.
 *   - The encoders produce exactly the bytes Redis and redis-py put on the wire.
 *   - A fixed-seed mutation run over the golden streams never crashes, never returns a view
 *     outside its message, and gives the same result whether the input arrives whole or split.
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

#include "proto/resp/resp.h"
#include "tests/lib/golden.h"
#include "tests/lib/split.h"

#define GOLDEN_MAX_MSGS 64
#define DESC_MAX 64
#define MUTATIONS 40000

/* ---- golden streams ------------------------------------------------------------------------ */

struct rec {
    size_t off; /* in the stream */
    struct resp_msg m;
};

struct golden {
    uint8_t *buf;
    size_t len;
    enum resp_side side;
    struct rec msgs[GOLDEN_MAX_MSGS];
    size_t n;
};

enum { G_RESP2_C, G_RESP2_S, G_RESP3_C, G_RESP3_S, G_CLI_C, G_CLI_S, G_BIG_C, G_BIG_S, G_COUNT };
static const char *const golden_files[G_COUNT] = {
    "resp2-client.bin", "resp2-server.bin", "resp3-client.bin", "resp3-server.bin",
    "cli-client.bin",   "cli-server.bin",   "big-client.bin",   "big-server.bin",
};
static struct golden g_streams[G_COUNT];

/* Scans a whole golden stream in one go. */
static int golden_scan(struct golden *g)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, g->side);
    size_t off = 0;
    g->n = 0;
    while (off < g->len) {
        struct resp_msg m;
        int rc = resp_scan(&sc, g->buf + off, g->len - off, &m);
        if (rc != 1 || g->n == GOLDEN_MAX_MSGS) {
            fprintf(stderr, "golden scan failed at %zu: %d %s\n", off, rc, resp_strerror(rc));
            return -1;
        }
        g->msgs[g->n].off = off;
        g->msgs[g->n].m = m;
        g->n++;
        off += m.len;
    }
    return 0;
}

static int setup_golden(void **state)
{
    (void)state;
    for (int i = 0; i < G_COUNT; i++) {
        struct golden *g = &g_streams[i];
        g->side = i % 2 == 0 ? RESP_SIDE_CLIENT : RESP_SIDE_SERVER;
        g->buf = kit_golden(&g->len, "resp/%s", golden_files[i]);
        if (golden_scan(g) < 0)
            return -1;
    }
    return 0;
}

static int teardown_golden(void **state)
{
    (void)state;
    for (int i = 0; i < G_COUNT; i++)
        kit_free(g_streams[i].buf);
    return 0;
}

static const uint8_t *msg_bytes(const struct golden *g, size_t i)
{
    return g->buf + g->msgs[i].off;
}

/* ---- describing messages (the same format as capture_resp.py --describe) ------------------- */

static void printable(const uint8_t *p, size_t n, char *out)
{
    size_t k = n < 24 ? n : 24;
    for (size_t i = 0; i < k; i++)
        out[i] = p[i] >= 32 && p[i] < 127 && p[i] != '"' && p[i] != '\\' ? (char)p[i] : '.';
    out[k] = '\0';
}

static void describe_reply(const uint8_t *buf, const struct resp_msg *m, char *out, size_t cap)
{
    char text[32];
    const char *prefix = m->attribute ? "|" : "";
    if (m->null) {
        snprintf(out, cap, "%s%cnull", prefix, m->type);
    } else if (m->nelem > 0 || m->value.count > 0 || strchr("*%~>", m->type) != NULL) {
        bool map = m->type == '%';
        int n = snprintf(out, cap, "%s%c%llu", prefix, m->type,
                         (unsigned long long)(map ? m->nelem / 2 : m->nelem));
        const struct resp_view *e = &m->elem[0];
        if (m->nelem > 0 && (e->type == '$' || e->type == '+') && !e->null) {
            printable(buf + e->off, e->len, text);
            snprintf(out + n, cap - (size_t)n, ":%s", text);
        }
    } else {
        printable(buf + m->value.off, m->value.len, text);
        snprintf(out, cap, "%s%c%s", prefix, m->type, text);
    }
}

/* "SET/3", "i:PING/1", "/0" (an empty command). */
static void describe_command(const uint8_t *buf, const struct resp_msg *m, char *out, size_t cap)
{
    uint8_t name[DESC_MAX] = {0};
    int n = 0;
    if (m->nelem > 0) {
        n = resp_view_copy(buf, m->len, &m->elem[0], name, sizeof(name) - 1);
        assert_true(n >= 0 && (size_t)n < sizeof(name));
    }
    for (int i = 0; i < n; i++)
        name[i] = (uint8_t)(name[i] >= 'a' && name[i] <= 'z' ? name[i] - 32 : name[i]);
    snprintf(out, cap, "%s%.*s/%llu", m->inline_cmd ? "i:" : "", n, (const char *)name,
             (unsigned long long)m->nelem);
}

static void describe(const struct golden *g, size_t i, char *out, size_t cap)
{
    if (g->side == RESP_SIDE_CLIENT)
        describe_command(msg_bytes(g, i), &g->msgs[i].m, out, cap);
    else
        describe_reply(msg_bytes(g, i), &g->msgs[i].m, out, cap);
}

static void assert_sequence(const struct golden *g, const char *const *expected, size_t n)
{
    char desc[DESC_MAX];
    for (size_t i = 0; i < n && i < g->n; i++) {
        describe(g, i, desc, sizeof(desc));
        if (strcmp(desc, expected[i]) != 0)
            fail_msg("message %zu: got \"%s\", expected \"%s\"", i, desc, expected[i]);
    }
    assert_int_equal(g->n, n);
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* From `capture_resp.py --describe tests/unit/data/resp`. */
static const char *const seq_resp2_c[] = {
    "i:PING/1",     "i:SET/3",     "i:GET/2",      "i:/0",       "SET/3",         "GET/2",
    "GET/2",        "DEL/5",       "LPUSH/5",      "BRPOP/3",    "BRPOP/3",       "MULTI/1",
    "LPUSH/3",      "INCR/2",      "EXEC/1",       "MULTI/1",    "NOSUCHCMD/2",   "EXEC/1",
    "MULTI/1",      "SET/3",       "DISCARD/1",    "WATCH/2",    "MULTI/1",       "INCR/2",
    "EXEC/1",       "SET/3",       "INCR/2",       "LRANGE/4",   "HSET/6",        "HGETALL/2",
    "ZADD/6",       "ZRANGE/5",    "CLIENT/3",     "SET/3",      "INCR/2",        "CLIENT/3",
    "CLIENT/3",     "INCR/2",      "INCR/2",       "XADD/7",     "XADD/7",        "XGROUP/5",
    "XREADGROUP/9", "XACK/4",      "XREADGROUP/9", "XPENDING/3", "REPLICAOF/3",   "SET/3",
    "REPLICAOF/3",  "SUBSCRIBE/3", "PSUBSCRIBE/2", "PING/1",     "UNSUBSCRIBE/1", "PUNSUBSCRIBE/1",
    "QUIT/1"};
static const char *const seq_resp2_s[] = {"+PONG",
                                          "+OK",
                                          "$it's",
                                          "+OK",
                                          "$v1",
                                          "$null",
                                          ":0",
                                          ":3",
                                          "*null",
                                          "*2:golden:q",
                                          "+OK",
                                          "+QUEUED",
                                          "+QUEUED",
                                          "*2",
                                          "+OK",
                                          "-ERR unknown command 'NOS",
                                          "-EXECABORT Transaction di",
                                          "+OK",
                                          "+QUEUED",
                                          "+OK",
                                          "+OK",
                                          "+OK",
                                          "+QUEUED",
                                          "*null",
                                          "+OK",
                                          ":2",
                                          "*3:job-4",
                                          ":2",
                                          "*4:f1",
                                          ":2",
                                          "*4:m1",
                                          "+OK",
                                          ":4",
                                          "$1-1",
                                          "$1-2",
                                          "+OK",
                                          "*1",
                                          ":1",
                                          "*null",
                                          "*4",
                                          "+OK",
                                          "-READONLY You can't write",
                                          "+OK",
                                          "*3:subscribe",
                                          "*3:subscribe",
                                          "*3:psubscribe",
                                          "*3:message",
                                          "*4:pmessage",
                                          "*2:pong",
                                          "*3:unsubscribe",
                                          "*3:unsubscribe",
                                          "*3:punsubscribe",
                                          "+OK"};
static const char *const seq_resp3_c[] = {
    "HELLO/2",  "DEBUG/3",     "DEBUG/3",   "DEBUG/3",  "DEBUG/3",       "DEBUG/3",  "DEBUG/3",
    "DEBUG/3",  "DEBUG/3",     "DEBUG/3",   "DEBUG/3",  "DEBUG/3",       "DEBUG/3",  "DEBUG/3",
    "DEL/6",    "HSET/6",      "HGETALL/2", "SADD/4",   "SMEMBERS/2",    "ZADD/6",   "ZSCORE/3",
    "ZRANGE/5", "BRPOP/3",     "XADD/5",    "XGROUP/5", "XREADGROUP/7",  "CLIENT/3", "SET/3",
    "GET/2",    "SUBSCRIBE/2", "GET/2",     "PING/1",   "UNSUBSCRIBE/1", "HELLO/2",  "DEBUG/3",
    "RESET/1",  "QUIT/1"};
static const char *const seq_resp3_s[] = {"%7:server",
                                          "$Hello World",
                                          ":12345",
                                          ",3.141",
                                          "(123456799999999999999999",
                                          "_null",
                                          "*3",
                                          "~3",
                                          "%3",
                                          "|$Some real reply followin",
                                          "=txt:This is a verbatim.s",
                                          "#t",
                                          "#f",
                                          ">2:server-cpu-usage",
                                          "$Some real reply followin",
                                          ":0",
                                          ":2",
                                          "%2:f1",
                                          ":2",
                                          "~2:x",
                                          ":2",
                                          ",1.5",
                                          "*2",
                                          "_null",
                                          "$1-1",
                                          "+OK",
                                          "%1:golden:s3",
                                          "+OK",
                                          "+OK",
                                          "$1",
                                          ">2:invalidate",
                                          ">3:subscribe",
                                          ">3:message",
                                          "$2",
                                          "+PONG",
                                          ">3:unsubscribe",
                                          "*14:server",
                                          "$null",
                                          "+RESET",
                                          "+OK"};
static const char *const seq_cli_c[] = {"HELLO/2", "SET/3",         "HELLO/2",   "GET/2",
                                        "LPUSH/5", "HELLO/2",       "LRANGE/4",  "HELLO/2",
                                        "HSET/4",  "HELLO/2",       "HGETALL/2", "HGETALL/2",
                                        "HELLO/2", "INCRBYFLOAT/3", "HELLO/2",   "GET/2"};
static const char *const seq_cli_s[] = {"%7:server", "+OK",       "%7:server", "$hello world",
                                        ":3",        "%7:server", "*3:c",      "%7:server",
                                        ":1",        "%7:server", "%1:f",      "*2:f",
                                        "%7:server", "$1.5",      "%7:server", "_null"};
static const char *const seq_big_c[] = {"SET/3", "GET/2", "STRLEN/2"};
static const char *const seq_big_s[] = {"+OK", "$0123456789abcdef01234567", ":102400"};

static void test_golden_sequences(void **state)
{
    (void)state;
    assert_sequence(&g_streams[G_RESP2_C], seq_resp2_c, N_OF(seq_resp2_c));
    assert_sequence(&g_streams[G_RESP2_S], seq_resp2_s, N_OF(seq_resp2_s));
    assert_sequence(&g_streams[G_RESP3_C], seq_resp3_c, N_OF(seq_resp3_c));
    assert_sequence(&g_streams[G_RESP3_S], seq_resp3_s, N_OF(seq_resp3_s));
    assert_sequence(&g_streams[G_CLI_C], seq_cli_c, N_OF(seq_cli_c));
    assert_sequence(&g_streams[G_CLI_S], seq_cli_s, N_OF(seq_cli_s));
    assert_sequence(&g_streams[G_BIG_C], seq_big_c, N_OF(seq_big_c));
    assert_sequence(&g_streams[G_BIG_S], seq_big_s, N_OF(seq_big_s));
}

/* ---- golden message contents ---------------------------------------------------------------- */

static void assert_view(const struct golden *g, size_t i, const struct resp_view *v, const char *s)
{
    uint8_t out[256];
    int n = resp_view_copy(msg_bytes(g, i), g->msgs[i].m.len, v, out, sizeof(out));
    assert_true(n >= 0 && (size_t)n <= sizeof(out));
    if ((size_t)n != strlen(s) || memcmp(out, s, (size_t)n) != 0)
        fail_msg("message %zu: got \"%.*s\", expected \"%s\"", i, n, (const char *)out, s);
}

static const struct resp_msg *msg_at(const struct golden *g, size_t i)
{
    assert_true(i < g->n);
    return &g->msgs[i].m;
}

static void test_golden_inline(void **state)
{
    (void)state;
    const struct golden *g = &g_streams[G_RESP2_C];
    const struct resp_msg *m = msg_at(g, 1); /* SET "inline key" 'it\'s' \r\n */
    assert_true(m->inline_cmd);
    assert_int_equal(m->type, RESP_TYPE_INLINE);
    assert_int_equal(m->nelem, 3);
    assert_false(m->elem[0].quoted);
    assert_true(m->elem[1].quoted);
    assert_true(m->elem[2].quoted);
    assert_view(g, 1, &m->elem[1], "inline key");
    assert_view(g, 1, &m->elem[2], "it's");
    assert_int_equal(m->elem[1].len, strlen("\"inline key\""));
    m = msg_at(g, 2); /* GET "inline\x20key"\n: a bare LF ends the line */
    assert_int_equal(m->len, strlen("GET \"inline\\x20key\"\n"));
    assert_view(g, 2, &m->elem[1], "inline key");
    m = msg_at(g, 3); /* a blank line: an empty command Redis ignores */
    assert_int_equal(m->len, 2);
    assert_int_equal(m->nelem, 0);
}

static void test_golden_resp2_replies(void **state)
{
    (void)state;
    const struct golden *g = &g_streams[G_RESP2_S];
    const struct resp_msg *m = msg_at(g, 5); /* GET golden:missing */
    assert_true(m->null);
    assert_int_equal(m->type, '$');
    m = msg_at(g, 8); /* BRPOP timeout */
    assert_true(m->null);
    assert_int_equal(m->type, '*');
    assert_int_equal(m->nelem, 0);
    m = msg_at(g, 9); /* BRPOP golden:q 1 */
    assert_int_equal(m->nelem, 2);
    assert_view(g, 9, &m->elem[0], "golden:q");
    assert_view(g, 9, &m->elem[1], "job-1");
    m = msg_at(g, 13); /* EXEC: *2 :3 :1 */
    assert_int_equal(m->nelem, 2);
    assert_int_equal(m->elem[0].type, ':');
    assert_view(g, 13, &m->elem[0], "3");
    assert_view(g, 13, &m->elem[1], "1");
    m = msg_at(g, 16);
    assert_int_equal(m->type, '-');
    assert_view(g, 16, &m->value, "EXECABORT Transaction discarded because of previous errors.");
    m = msg_at(g, 36); /* XREADGROUP: [[key, [[id, [f, v, f, v]], ...]]] */
    assert_int_equal(m->nelem, 1);
    assert_int_equal(m->elem[0].type, '*');
    assert_int_equal(m->elem[0].count, 2);
    m = msg_at(g, 41);
    assert_view(g, 41, &m->value, "READONLY You can't write against a read only replica.");
    m = msg_at(g, 48); /* PING while subscribed: ["pong", ""] */
    assert_int_equal(m->nelem, 2);
    assert_int_equal(m->elem[1].len, 0);
    assert_false(m->elem[1].null);
    m = msg_at(g, 47); /* pmessage */
    assert_int_equal(m->nelem, 4);
    assert_view(g, 47, &m->elem[3], "hello");
}

static void test_golden_resp3_types(void **state)
{
    (void)state;
    const struct golden *g = &g_streams[G_RESP3_S];
    const struct resp_msg *m = msg_at(g, 0); /* HELLO 3: a map of 7 pairs */
    assert_int_equal(m->type, '%');
    assert_int_equal(m->nelem, 14);
    assert_view(g, 0, &m->elem[4], "proto");
    assert_int_equal(m->elem[5].type, ':');
    assert_view(g, 0, &m->elem[5], "3");
    assert_int_equal(m->elem[13].type, '*');
    assert_int_equal(m->elem[13].count, 0);
    assert_view(g, 3, &msg_at(g, 3)->value, "3.141");
    assert_int_equal(msg_at(g, 4)->type, '(');
    assert_true(msg_at(g, 5)->null);
    assert_int_equal(msg_at(g, 5)->type, '_');
    assert_int_equal(msg_at(g, 8)->nelem, 6); /* %3 */
    assert_int_equal(msg_at(g, 8)->elem[1].type, '#');

    m = msg_at(g, 9); /* |1 key-popularity [key:123, 90] then the reply */
    assert_true(m->attribute);
    assert_false(m->push);
    assert_int_equal(m->type, '$');
    assert_true(m->body > 0);
    assert_int_equal(msg_bytes(g, 9)[0], '|');
    assert_int_equal(msg_bytes(g, 9)[m->body], '$');
    assert_view(g, 9, &m->value, "Some real reply following the attribute");

    m = msg_at(g, 10);
    assert_int_equal(m->type, '=');
    assert_view(g, 10, &m->value, "txt:This is a verbatim\nstring");
    assert_view(g, 11, &msg_at(g, 11)->value, "t");

    m = msg_at(g, 13); /* DEBUG PROTOCOL push: the push comes first, then the reply */
    assert_true(m->push);
    assert_int_equal(m->nelem, 2);
    assert_int_equal(m->elem[1].type, ':');
    assert_false(msg_at(g, 14)->push);

    m = msg_at(g, 26); /* XREADGROUP in RESP3: {key => [[id, [f, v]]]} */
    assert_int_equal(m->type, '%');
    assert_view(g, 26, &m->elem[0], "golden:s3");
    assert_int_equal(m->elem[1].type, '*');
    m = msg_at(g, 30); /* CLIENT TRACKING invalidation */
    assert_true(m->push);
    assert_view(g, 30, &m->elem[0], "invalidate");
    assert_int_equal(m->elem[1].type, '*');
    m = msg_at(g, 36); /* HELLO 2: the same fields as a flat array */
    assert_int_equal(m->type, '*');
    assert_int_equal(m->nelem, 14);
    assert_view(g, 36, &m->elem[5], "2");
}

static void test_golden_big_value(void **state)
{
    (void)state;
    const struct golden *g = &g_streams[G_BIG_S];
    const struct resp_msg *m = msg_at(g, 1);
    assert_int_equal(m->type, '$');
    assert_int_equal(m->value.len, 102400);
    const uint8_t *p = msg_bytes(g, 1) + m->value.off;
    for (size_t i = 0; i < m->value.len; i++)
        assert_int_equal(p[i], "0123456789abcdef"[i % 16]);
    const struct golden *c = &g_streams[G_BIG_C];
    assert_int_equal(msg_at(c, 0)->elem[2].len, 102400);
    assert_memory_equal(msg_bytes(c, 0) + msg_at(c, 0)->elem[2].off, p, 102400);
}

/* The iterator gives exactly the elements the scanner filed, and then the rest. */
static void check_iterator(const uint8_t *buf, const struct resp_msg *m)
{
    struct resp_args it;
    struct resp_view v;
    uint64_t k = 0;
    resp_args_init(&it, buf, m);
    int rc;
    while ((rc = resp_args_next(&it, &v)) == 1) {
        assert_true(v.off <= m->len && v.len <= m->len - v.off);
        if (k < RESP_MSG_VIEWS) {
            const struct resp_view *e = &m->elem[k];
            assert_int_equal(v.off, e->off);
            assert_int_equal(v.len, e->len);
            assert_int_equal(v.type, e->type);
            assert_int_equal(v.count, e->count);
            assert_int_equal(v.null, e->null);
            assert_int_equal(v.quoted, e->quoted);
        }
        k++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, m->nelem);
}

static void test_golden_iterator(void **state)
{
    (void)state;
    for (int s = 0; s < G_COUNT; s++)
        for (size_t i = 0; i < g_streams[s].n; i++)
            check_iterator(msg_bytes(&g_streams[s], i), &g_streams[s].msgs[i].m);
}

/* ---- incremental feeding ------------------------------------------------------------------- */

/* Messages resp_scan_command_len() / resp_scan_reply_len() measured in feeder_push(). */
static size_t g_shortcuts;

/* A proxy-like driver: holds exactly the unconsumed bytes in a heap buffer of that size. */
struct feeder {
    struct resp_scanner sc;
    const struct golden *g;
    uint8_t *held;
    size_t n;
    size_t consumed; /* stream offset of held[0] */
    size_t count;    /* messages found */
};

/* A fresh feeder of the stream f->g. */
static void feeder_init(void *ctx)
{
    struct feeder *f = ctx;
    const struct golden *g = f->g;
    memset(f, 0, sizeof(*f));
    resp_scanner_init(&f->sc, g->side);
    f->g = g;
}

static void assert_view_equal(const struct resp_view *a, const struct resp_view *b)
{
    assert_int_equal(a->off, b->off);
    assert_int_equal(a->len, b->len);
    assert_int_equal(a->count, b->count);
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->null, b->null);
    assert_int_equal(a->quoted, b->quoted);
}

static void assert_msg_equal(const struct resp_msg *a, const struct resp_msg *b)
{
    assert_int_equal(a->len, b->len);
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->push, b->push);
    assert_int_equal(a->attribute, b->attribute);
    assert_int_equal(a->null, b->null);
    assert_int_equal(a->inline_cmd, b->inline_cmd);
    assert_int_equal(a->body, b->body);
    assert_int_equal(a->nelem, b->nelem);
    assert_view_equal(&a->value, &b->value);
    for (uint64_t i = 0; i < a->nelem && i < RESP_MSG_VIEWS; i++)
        assert_view_equal(&a->elem[i], &b->elem[i]);
}

static void feeder_take(struct feeder *f, size_t k)
{
    uint8_t *rest = f->n > k ? malloc(f->n - k) : NULL;
    if (rest != NULL)
        memcpy(rest, f->held + k, f->n - k);
    free(f->held);
    f->held = rest;
    f->n -= k;
    f->consumed += k;
}

static void feeder_push(void *ctx, const uint8_t *p, size_t k)
{
    struct feeder *f = ctx;
    if (k == 0)
        return;
    uint8_t *nb = malloc(f->n + k);
    assert_non_null(nb);
    if (f->n > 0)
        memcpy(nb, f->held, f->n);
    memcpy(nb + f->n, p, k);
    free(f->held);
    f->held = nb;
    f->n += k;
    for (;;) {
        struct resp_msg m;
        /* The shortcuts that only measure a message, asked first (they change nothing). */
        struct resp_view name;
        uint8_t type = 0;
        size_t cl = resp_scan_command_len(&f->sc, f->held, f->n, &name);
        size_t rl = resp_scan_reply_len(&f->sc, f->held, f->n, &type);
        int rc = resp_scan(&f->sc, f->held, f->n, &m);
        if (rc < 0)
            fail_msg("offset %zu: %s", f->consumed, resp_strerror(rc));
        if (rc == 0) {
            assert_true(m.len > f->n);
            assert_int_equal(cl, 0); /* never a length for a message not all here */
            assert_int_equal(rl, 0);
            return;
        }
        if (cl != 0) {
            assert_int_equal(cl, m.len);
            assert_view_equal(&name, &m.elem[0]);
            g_shortcuts++;
        }
        if (rl != 0) {
            assert_int_equal(rl, m.len);
            assert_int_equal(type, m.type);
            g_shortcuts++;
        }
        assert_true(f->count < f->g->n);
        assert_int_equal(f->consumed, f->g->msgs[f->count].off);
        assert_msg_equal(&m, &f->g->msgs[f->count].m);
        f->count++;
        feeder_take(f, m.len);
    }
}

/* The feeder found every message of the stream, and holds nothing. */
static void feeder_done(void *ctx, const char *how)
{
    struct feeder *f = ctx;
    if (f->count != f->g->n || f->n != 0)
        fail_msg("%s: %zu messages and %zu bytes left, the whole stream has %zu", how, f->count,
                 f->n, f->g->n);
    free(f->held);
    f->held = NULL;
}

static const struct kit_feed feeder_ops = {feeder_init, feeder_push, feeder_done};

static void test_split_every_offset(void **state)
{
    (void)state;
    g_shortcuts = 0;
    for (int s = 0; s < G_COUNT; s++) {
        if (s == G_BIG_C || s == G_BIG_S)
            continue;
        struct feeder f = {.g = &g_streams[s]};
        kit_split_everywhere(f.g->buf, f.g->len, KIT_SPLIT_TWO | KIT_SPLIT_BYTES, &feeder_ops, &f);
        kit_feed_chunks(f.g->buf, f.g->len, 7, &feeder_ops, &f);
    }
    assert_true(g_shortcuts > 1000); /* the shortcuts took part, and agreed every time */
}

/* The 100 KiB streams: every offset around each message and bulk boundary, plus pieces of 16
 * KiB, 4 KiB and 509 bytes through exact buffers, and byte by byte through a growing length. */
static void test_split_big(void **state)
{
    (void)state;
    for (int s = G_BIG_C; s <= G_BIG_S; s++) {
        const struct golden *g = &g_streams[s];
        for (size_t i = 0; i < g->n; i++) {
            size_t marks[3] = {g->msgs[i].off, g->msgs[i].off + g->msgs[i].m.len,
                               g->msgs[i].off + g->msgs[i].m.value.off};
            for (int k = 0; k < 3; k++)
                for (size_t d = 0; d < 48; d++) {
                    size_t at = marks[k] + d >= 24 ? marks[k] + d - 24 : 0;
                    struct feeder f = {.g = g};
                    kit_feed_split_at(g->buf, g->len, at < g->len ? at : g->len, &feeder_ops, &f);
                }
        }
        struct feeder f = {.g = g};
        kit_feed_chunks(g->buf, g->len, 16384, &feeder_ops, &f);
        kit_feed_chunks(g->buf, g->len, 4096, &feeder_ops, &f);
        kit_feed_chunks(g->buf, g->len, 509, &feeder_ops, &f);

        struct resp_scanner sc;
        resp_scanner_init(&sc, g->side);
        size_t start = 0, found = 0;
        for (size_t have = 1; have <= g->len; have++) {
            struct resp_msg m;
            int rc = resp_scan(&sc, g->buf + start, have - start, &m);
            assert_true(rc >= 0);
            if (rc == 1) {
                assert_msg_equal(&m, &g->msgs[found].m);
                start += m.len;
                found++;
            }
        }
        assert_int_equal(found, g->n);
    }
}

/* A 64 MiB bulk in 16 KiB pieces: the scanner does not re-read what it validated (the header
 * and payload are overwritten once read) and waits for exactly the announced length. */
static void test_huge_bulk_resumes(void **state)
{
    (void)state;
    const size_t body = 64u << 20, chunk = 16384;
    const char *hdr = "$67108864\r\n";
    size_t hlen = strlen(hdr), total = hlen + body + 2;
    uint8_t *buf = malloc(total);
    assert_non_null(buf);
    memcpy(buf, hdr, hlen);
    memset(buf + hlen, 'x', body);
    memcpy(buf + hlen + body, "\r\n", 2);

    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    size_t have = hlen + 1, calls = 0;
    assert_int_equal(resp_scan(&sc, buf, have, &m), 0);
    assert_int_equal(m.len, total);
    buf[0] = '?'; /* a rescan from the start would now fail */
    while (have < total) {
        size_t next = total - have < chunk ? total : have + chunk;
        int rc = resp_scan(&sc, buf, next, &m);
        calls++;
        assert_int_equal(rc, next == total ? 1 : 0);
        if (rc == 0)
            assert_int_equal(m.len, total);
        /* Scribble over the payload just delivered: only its end matters now. */
        size_t end = next < hlen + body ? next : hlen + body;
        if (end > have)
            memset(buf + have, '?', end - have);
        have = next;
    }
    assert_int_equal(m.len, total);
    assert_int_equal(m.value.off, hlen);
    assert_int_equal(m.value.len, body);
    assert_true(calls >= body / chunk);
    free(buf);
}

/* ---- pairing ------------------------------------------------------------------------------- */

#define PAIR_SLOTS 64

struct pair_run {
    struct resp_cmd slots[PAIR_SLOTS];
    struct resp_pairing p;
    const struct golden *cli;
    size_t next_cmd;
    int silent[GOLDEN_MAX_MSGS]; /* indices of the commands that expect no reply */
    size_t nsilent;
};

static void pair_push_next(struct pair_run *r)
{
    size_t i = r->next_cmd++;
    struct resp_cmd c;
    int rc = resp_pairing_command(&r->p, &r->cli->msgs[i].m, msg_bytes(r->cli, i), i, &c);
    assert_true(rc == 0 || rc == 1);
    if (rc == 0)
        r->silent[r->nsilent++] = (int)i;
    else
        assert_int_equal(c.tag, i);
}

/* "BRPOP(B)", "LPUSH(Q)", "SUBSCRIBE+" (more confirmations to come), "EXEC[2]", "EXEC!",
 * "oob". */
static void describe_match(int rc, const struct resp_match *mt, char *out, size_t cap)
{
    if (rc == 0) {
        snprintf(out, cap, "oob");
        return;
    }
    int n = snprintf(out, cap, "%s%s%s%s", mt->cmd.name,
                     (mt->cmd.flags & RESP_CMD_BLOCKING) ? "(B)" : "", mt->queued ? "(Q)" : "",
                     mt->last ? "" : "+");
    if (mt->cmd.flags & RESP_CMD_EXEC)
        snprintf(out + n, cap - (size_t)n, mt->exec_aborted ? "!" : "[%zu]", mt->ntx);
}

/* Feeds the recorded streams to a pairing: all commands first (lazy false), or each command
 * only when a reply arrives with none pending (lazy true).  Both are orders that really happen. */
static void pair_golden(struct pair_run *r, int cli, int srv, const char *const *expected, size_t n,
                        bool lazy)
{
    const struct golden *s = &g_streams[srv];
    memset(r, 0, sizeof(*r));
    resp_pairing_init(&r->p, r->slots, PAIR_SLOTS);
    r->cli = &g_streams[cli];
    while (!lazy && r->next_cmd < r->cli->n)
        pair_push_next(r);
    assert_int_equal(s->n, n);
    char desc[DESC_MAX];
    for (size_t i = 0; i < s->n; i++) {
        while (lazy && resp_pairing_pending(&r->p) == 0 && r->next_cmd < r->cli->n)
            pair_push_next(r);
        struct resp_match mt;
        int rc = resp_pairing_reply(&r->p, &s->msgs[i].m, msg_bytes(s, i), &mt);
        assert_true(rc == 0 || rc == 1);
        describe_match(rc, &mt, desc, sizeof(desc));
        if (strcmp(desc, expected[i]) != 0)
            fail_msg("reply %zu: got \"%s\", expected \"%s\"", i, desc, expected[i]);
        if (rc == 1 && (mt.cmd.flags & RESP_CMD_EXEC) && mt.ntx == 2) {
            assert_string_equal(resp_pairing_tx(&r->p, 0)->name, "LPUSH");
            assert_string_equal(resp_pairing_tx(&r->p, 1)->name, "INCR");
            assert_null(resp_pairing_tx(&r->p, 2));
        }
    }
    while (r->next_cmd < r->cli->n)
        pair_push_next(r);
    assert_int_equal(resp_pairing_pending(&r->p), 0);
    assert_null(resp_pairing_head(&r->p));
}

static const char *const pair_resp2[] = {
    "PING",       "SET",          "GET",           "SET",          "GET",       "GET",
    "DEL",        "LPUSH",        "BRPOP(B)",      "BRPOP(B)",     "MULTI",     "LPUSH(Q)",
    "INCR(Q)",    "EXEC[2]",      "MULTI",         "NOSUCHCMD(Q)", "EXEC!",     "MULTI",
    "SET(Q)",     "DISCARD",      "WATCH",         "MULTI",        "INCR(Q)",   "EXEC!",
    "SET",        "INCR",         "LRANGE",        "HSET",         "HGETALL",   "ZADD",
    "ZRANGE",     "CLIENT",       "INCR",          "XADD",         "XADD",      "XGROUP",
    "XREADGROUP", "XACK",         "XREADGROUP(B)", "XPENDING",     "REPLICAOF", "SET",
    "REPLICAOF",  "SUBSCRIBE+",   "SUBSCRIBE",     "PSUBSCRIBE",   "oob",       "oob",
    "PING",       "UNSUBSCRIBE+", "UNSUBSCRIBE",   "PUNSUBSCRIBE", "QUIT"};

static const char *const pair_resp3[] = {
    "HELLO", "DEBUG",   "DEBUG",      "DEBUG",       "DEBUG", "DEBUG",  "DEBUG",  "DEBUG",
    "DEBUG", "DEBUG",   "DEBUG",      "DEBUG",       "DEBUG", "oob",    "DEBUG",  "DEL",
    "HSET",  "HGETALL", "SADD",       "SMEMBERS",    "ZADD",  "ZSCORE", "ZRANGE", "BRPOP(B)",
    "XADD",  "XGROUP",  "XREADGROUP", "CLIENT",      "SET",   "GET",    "oob",    "SUBSCRIBE",
    "oob",   "GET",     "PING",       "UNSUBSCRIBE", "HELLO", "DEBUG",  "RESET",  "QUIT"};

static const char *const pair_cli[] = {
    "HELLO", "SET",   "HELLO",   "GET",     "LPUSH", "HELLO",       "LRANGE", "HELLO",
    "HSET",  "HELLO", "HGETALL", "HGETALL", "HELLO", "INCRBYFLOAT", "HELLO",  "GET"};

static void test_pairing_golden(void **state)
{
    (void)state;
    struct pair_run *r = malloc(sizeof(*r));
    assert_non_null(r);
    for (int lazy = 0; lazy < 2; lazy++) {
        pair_golden(r, G_RESP2_C, G_RESP2_S, pair_resp2, N_OF(pair_resp2), lazy);
        /* The blank line, CLIENT REPLY OFF, the SET and INCR under it, CLIENT REPLY SKIP and
         * the INCR it silenced. */
        static const int silent2[] = {3, 32, 33, 34, 36, 37};
        assert_int_equal(r->nsilent, N_OF(silent2));
        for (size_t i = 0; i < N_OF(silent2); i++)
            assert_int_equal(r->silent[i], silent2[i]);
        assert_int_equal(r->p.channels + r->p.patterns, 0);

        pair_golden(r, G_RESP3_C, G_RESP3_S, pair_resp3, N_OF(pair_resp3), lazy);
        assert_int_equal(r->nsilent, 0);
        assert_int_equal(r->p.proto, 2); /* RESET went back to RESP2 */
        pair_golden(r, G_CLI_C, G_CLI_S, pair_cli, N_OF(pair_cli), lazy);
        assert_int_equal(r->p.proto, 3);
    }
    free(r);
}

/* Builds a command message from a literal and passes it to the pairing. */
static int pair_cmd(struct resp_pairing *p, const char *wire, struct resp_cmd *c)
{
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, (const uint8_t *)wire, strlen(wire), &m), 1);
    return resp_pairing_command(p, &m, (const uint8_t *)wire, 0, c);
}

static int pair_reply(struct resp_pairing *p, const char *wire, struct resp_match *mt)
{
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    assert_int_equal(resp_scan(&sc, (const uint8_t *)wire, strlen(wire), &m), 1);
    return resp_pairing_reply(p, &m, (const uint8_t *)wire, mt);
}

/* A caller that read the name itself (the RESP session layer) gets the same record as one that
 * lets the pairing read it; and the command table finds each of its names. */
static void test_pairing_named(void **state)
{
    (void)state;
    assert_true(resp_cmd_table_ok());
    /* SYNC and PSYNC turn a connection into a replication stream. */
    assert_int_equal(resp_cmd_name_flags("SYNC", 4), RESP_CMD_SYNC);
    assert_int_equal(resp_cmd_name_flags("PSYNC", 5), RESP_CMD_SYNC);
    assert_int_equal(resp_cmd_name_flags("MULTI", 5), RESP_CMD_MULTI);
    assert_int_equal(resp_cmd_name_flags("SET", 3), 0);
    assert_int_equal(resp_cmd_name_flags("SYNCX", 5), 0);
    assert_int_equal(resp_pairing_simple(&(struct resp_pairing){.cap = 0}, "SYNC", 4, 0, NULL), 0);
    static const char *const wires[] = {
        "*1\r\n$5\r\nmulti\r\n",
        "*1\r\n$4\r\nExec\r\n",
        "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n$1\r\nb\r\n",
        "*2\r\n$3\r\nget\r\n$1\r\nk\r\n",
        "*3\r\n$6\r\nclient\r\n$5\r\nreply\r\n$3\r\noff\r\n",
        "*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$2\r\non\r\n",
        "*2\r\n$5\r\nhello\r\n$1\r\n3\r\n",
        "*6\r\n$10\r\nxreadgroup\r\n$5\r\nBLOCK\r\n$1\r\n0\r\n$7\r\nSTREAMS\r\n$1\r\ns\r\n"
        "$1\r\n>\r\n",
        "*1\r\n$40\r\nabcdefghijklmnopqrstuvwxyzabcdefghijklmn\r\n",
        "PING\r\n",
    };
    struct resp_cmd slots_a[8], slots_b[8];
    struct resp_pairing pa, pb;
    resp_pairing_init(&pa, slots_a, 8);
    resp_pairing_init(&pb, slots_b, 8);
    for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
        struct resp_scanner sc;
        struct resp_msg m;
        resp_scanner_init(&sc, RESP_SIDE_CLIENT);
        const uint8_t *w = (const uint8_t *)wires[i];
        assert_int_equal(resp_scan(&sc, w, strlen(wires[i]), &m), 1);
        char name[RESP_CMD_NAME_MAX];
        resp_cmd_name_copy(w, &m, name); /* as the RESP session layer reads it */
        struct resp_cmd a, b;
        int ra = resp_pairing_command(&pa, &m, w, i, &a);
        int rb = resp_pairing_command_named(&pb, &m, w, name, i, &b);
        assert_int_equal(ra, rb);
        assert_string_equal(a.name, b.name);
        assert_int_equal(a.flags, b.flags);
        assert_int_equal(a.replies, b.replies);
        assert_int_equal(a.sub_kind, b.sub_kind);
        assert_int_equal(a.hello_proto, b.hello_proto);
        while (pa.count > 0 && pb.count > 0) { /* keep room: drop what was recorded */
            pa.head = (pa.head + 1) % pa.cap;
            pa.count--;
            pb.head = (pb.head + 1) % pb.cap;
            pb.count--;
        }
    }
    /* "MULTI\0x" is an unknown command to Redis: not MULTI to the pairing either. */
    static const char nul_multi[] = "*1\r\n$7\r\nMULTI\0x\r\n";
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    const uint8_t *w = (const uint8_t *)nul_multi;
    assert_int_equal(resp_scan(&sc, w, sizeof(nul_multi) - 1, &m), 1);
    char name[RESP_CMD_NAME_MAX];
    assert_int_equal(resp_cmd_name_copy(w, &m, name), 0);
    assert_string_equal(name, "");
    struct resp_cmd c;
    assert_int_equal(resp_pairing_command(&pa, &m, w, 99, &c), 1);
    assert_int_equal(c.flags, 0);
    assert_false(pa.in_multi);
}

/* The shortcuts by name and by first byte take plain commands and their replies only, and
 * only while nothing else can happen on the connection. */
static void test_pairing_simple(void **state)
{
    (void)state;
    struct resp_cmd slots[8], c;
    struct resp_pairing p;
    resp_pairing_init(&p, slots, 8);
    assert_int_equal(resp_pairing_simple(&p, "GET", 3, 1, &c), 1);
    assert_string_equal(c.name, "GET");
    assert_int_equal(c.flags, 0);
    assert_int_equal(c.seq, 0);
    assert_int_equal(resp_pairing_simple(&p, "WATCH", 5, 2, NULL), 1); /* outside MULTI */
    static const char *const special[] = {"MULTI",      "EXEC",  "DISCARD", "CLIENT", "SUBSCRIBE",
                                          "PSUBSCRIBE", "BRPOP", "BLMOVE",  "WAIT",   "XREAD",
                                          "XREADGROUP", "HELLO", "MONITOR", "RESET",  "QUIT"};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
        assert_int_equal(resp_pairing_simple(&p, special[i], strlen(special[i]), 0, NULL), 0);
    assert_int_equal(resp_pairing_pending(&p), 2);
    /* replies: a push is out of band, the others answer GET then WATCH */
    assert_int_equal(resp_pairing_reply_simple(&p, '>'), 0);
    assert_int_equal(resp_pairing_reply_simple(&p, '$'), 1);
    assert_int_equal(resp_pairing_reply_simple(&p, '+'), 1);
    assert_int_equal(resp_pairing_reply_simple(&p, '+'), 0); /* nothing awaits it */
    /* inside MULTI, and while CLIENT REPLY is off, not even GET */
    p.in_multi = true;
    assert_int_equal(resp_pairing_simple(&p, "GET", 3, 0, NULL), 0);
    p.in_multi = false;
    p.reply_off = true;
    assert_int_equal(resp_pairing_simple(&p, "GET", 3, 0, NULL), 0);
    p.reply_off = false;
    /* subscribed or monitoring: a reply may be a message, the long way decides */
    assert_int_equal(resp_pairing_simple(&p, "PING", 4, 0, NULL), 1);
    p.channels = 1;
    assert_int_equal(resp_pairing_reply_simple(&p, '*'), 0);
    p.channels = 0;
    p.monitor = true;
    assert_int_equal(resp_pairing_reply_simple(&p, '+'), 0);
    p.monitor = false;
    assert_int_equal(resp_pairing_reply_simple(&p, '+'), 1);
    /* a full FIFO */
    for (int i = 0; i < 8; i++)
        assert_int_equal(resp_pairing_simple(&p, "SET", 3, 0, NULL), 1);
    assert_int_equal(resp_pairing_simple(&p, "SET", 3, 0, NULL), RESP_E_PAIRING_FULL);
}

/* resp_small_eq() and the names resp_pairing_simple() records, at every length a name can have
 * (their fixed-size loads and copies overlap differently below 4, 8 and 16 bytes), with one byte
 * changed at every place. */
static void test_small_names(void **state)
{
    (void)state;
    uint8_t a[RESP_CMD_NAME_MAX + 8], b[RESP_CMD_NAME_MAX + 8];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = (uint8_t)('A' + i % 26);
    for (size_t off = 0; off < 4; off++) { /* unaligned too */
        for (size_t n = 0; n < RESP_CMD_NAME_MAX; n++) {
            memcpy(b, a, sizeof(b));
            assert_true(resp_small_eq(a + off, b + off, n));
            for (size_t at = 0; at < n; at++) {
                b[off + at] ^= 0x20;
                assert_false(resp_small_eq(a + off, b + off, n));
                b[off + at] ^= 0x20;
            }
            b[off + n] ^= 0x20; /* past the end: not looked at */
            assert_true(resp_small_eq(a + off, b + off, n));
        }
    }
    struct resp_cmd slots[2], c;
    struct resp_pairing p;
    resp_pairing_init(&p, slots, 2);
    for (size_t n = 1; n < RESP_CMD_NAME_MAX; n++) {
        char name[RESP_CMD_NAME_MAX];
        for (size_t i = 0; i < n; i++)
            name[i] = (char)('Z' - i % 3); /* no command of the table: plain */
        name[n] = '\0';
        memset(slots, 0x55, sizeof(slots));
        assert_int_equal(resp_pairing_simple(&p, name, n, 0, &c), 1);
        assert_string_equal(c.name, name);
        assert_int_equal(resp_pairing_reply_simple(&p, '+'), 1);
    }
}

/* A transaction longer than the FIFO (Redis queues a MULTI of any length): its queued commands
 * past the FIFO's room are counted in one slot, so EXEC always finds one and the client never
 * waits for room only EXEC would free.  100,000 commands through 8 slots, sent all at once and
 * each after its +QUEUED; a command refused inside the run; with `watch`, a WATCH refused after
 * it (it runs at once and takes the last slot: EXEC then waits for its reply, which comes); the
 * EXEC array's elements traced back to the commands they answer. */
static void tx_long(bool at_once, bool watch)
{
    enum { N = 100000, CAP = 8 };
    struct resp_cmd slots[CAP], c;
    struct resp_pairing p;
    struct resp_match mt;
    resp_pairing_init(&p, slots, CAP);
    assert_int_equal(pair_cmd(&p, "MULTI\r\n", &c), 1);
    if (!at_once)
        assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), 1);
    size_t answered = 0;
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(pair_cmd(&p, i == 0 ? "SET first 1\r\n" : "INCR k\r\n", &c), 1);
        assert_true(c.flags & RESP_CMD_QUEUED);
        assert_true(p.count + RESP_PAIRING_ROOM <= p.cap + 1); /* room for EXEC is left */
        if (!at_once) {
            assert_int_equal(pair_reply(&p, "+QUEUED\r\n", &mt), 1);
            assert_true(mt.queued);
            answered++;
        }
    }
    assert_int_equal(pair_cmd(&p, "INCR late\r\n", &c), 1); /* refused below */
    if (watch) {
        assert_int_equal(pair_cmd(&p, "WATCH k\r\n", &c), 1);
        assert_false(c.flags & RESP_CMD_QUEUED);
    } else {
        assert_int_equal(pair_cmd(&p, "EXEC\r\n", &c), 1);
        assert_true(c.flags & RESP_CMD_EXEC);
    }
    if (at_once)
        assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), 1);
    for (; answered < N; answered++) {
        assert_int_equal(pair_reply(&p, "+QUEUED\r\n", &mt), 1);
        assert_true(mt.queued);
        assert_string_equal(mt.cmd.name, answered == 0 ? "SET" : "INCR");
    }
    assert_int_equal(pair_reply(&p, "-ERR wrong number of arguments\r\n", &mt), 1);
    assert_true(mt.queued);
    assert_true(mt.cmd.flags & RESP_CMD_REJECTED);
    if (watch) {
        assert_int_equal(pair_reply(&p, "-ERR WATCH inside MULTI is not allowed\r\n", &mt), 1);
        assert_string_equal(mt.cmd.name, "WATCH");
        assert_false(mt.queued);
        assert_int_equal(pair_cmd(&p, "EXEC\r\n", &c), 1);
    }
    assert_int_equal(resp_pairing_pending(&p), 1); /* EXEC */
    /* The EXEC array as an old Redis would send it, without the refused command. */
    char *exec = malloc((size_t)N * 4 + 32);
    assert_non_null(exec);
    size_t n = (size_t)sprintf(exec, "*%d\r\n+OK\r\n", N);
    for (size_t i = 1; i < N; i++) {
        memcpy(exec + n, ":1\r\n", 4);
        n += 4;
    }
    exec[n] = '\0';
    assert_int_equal(pair_reply(&p, exec, &mt), 1);
    free(exec);
    assert_true(mt.cmd.flags & RESP_CMD_EXEC);
    assert_int_equal(mt.ntx, N);
    assert_string_equal(resp_pairing_tx(&p, 0)->name, "SET");
    assert_string_equal(resp_pairing_tx(&p, N - 1)->name, "INCR");
    assert_null(resp_pairing_tx(&p, N));
    assert_int_equal(p.count, 0);
    assert_false(p.in_multi);
    /* The FIFO is whole again: a plain pipeline fills all of it. */
    for (int i = 0; i < CAP; i++)
        assert_int_equal(resp_pairing_simple(&p, "GET", 3, 0, NULL), 1);
    assert_int_equal(resp_pairing_simple(&p, "GET", 3, 0, NULL), RESP_E_PAIRING_FULL);
}

static void test_pairing_tx_longer_than_fifo(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        tx_long(i & 1, i & 2);
    /* MULTI took the FIFO's last free slot but one: a queued command waits for a reply to a
     * command ahead of it (it would leave no slot for EXEC), then joins a run. */
    struct resp_cmd slots[4], c;
    struct resp_pairing p;
    struct resp_match mt;
    resp_pairing_init(&p, slots, 4);
    assert_int_equal(pair_cmd(&p, "GET a\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "GET b\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "MULTI\r\n", &c), 1);
    uint64_t seq = p.seq;
    assert_int_equal(pair_cmd(&p, "INCR k\r\n", &c), RESP_E_PAIRING_FULL);
    assert_int_equal(p.seq, seq); /* nothing recorded */
    assert_int_equal(pair_reply(&p, "$-1\r\n", &mt), 1);
    assert_int_equal(pair_cmd(&p, "INCR k\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "INCR k\r\n", &c), 1);
    assert_int_equal(p.count, 3);
    assert_int_equal(pair_cmd(&p, "EXEC\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "$-1\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "+QUEUED\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "+QUEUED\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "*2\r\n:1\r\n:2\r\n", &mt), 1);
    assert_int_equal(mt.ntx, 2);
    assert_int_equal(p.count, 0);
}

static void test_pairing_rules(void **state)
{
    (void)state;
    struct resp_cmd slots[4], c;
    struct resp_pairing p;
    struct resp_match mt;
    resp_pairing_init(&p, slots, 4);
    assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), RESP_E_UNEXPECTED_REPLY);

    /* Names are upper-cased; XREAD blocks only with BLOCK before STREAMS. */
    assert_int_equal(pair_cmd(&p, "xread count 1 streams BLOCK 0\r\n", &c), 1);
    assert_string_equal(c.name, "XREAD");
    assert_false(c.flags & RESP_CMD_BLOCKING);
    assert_int_equal(pair_cmd(&p, "bzpopmin z 0\r\n", &c), 1);
    assert_true(c.flags & RESP_CMD_BLOCKING);
    assert_int_equal(pair_cmd(&p, "WAIT 1 0\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "PING\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "PING\r\n", &c), RESP_E_PAIRING_FULL);
    assert_int_equal(resp_pairing_pending(&p), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pair_reply(&p, ":1\r\n", &mt), 1);
    assert_string_equal(mt.cmd.name, "PING");
    assert_int_equal(mt.cmd.seq, 3);

    /* An over-long name is cut; SUBSCRIBE without a channel is an ordinary (error) reply. */
    assert_int_equal(pair_cmd(&p, "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJ\r\n", &c), 1);
    assert_int_equal(strlen(c.name), RESP_CMD_NAME_MAX - 1);
    assert_int_equal(pair_cmd(&p, "SUBSCRIBE\r\n", &c), 1);
    assert_false(c.flags & RESP_CMD_SUBSCRIBE);
    assert_int_equal(pair_reply(&p, "-ERR unknown command\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "-ERR wrong number of arguments\r\n", &mt), 1);

    /* A queued command rejected: EXEC is aborted, and the kept commands go. */
    assert_int_equal(pair_cmd(&p, "MULTI\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "SET k v\r\n", &c), 1);
    assert_true(c.flags & RESP_CMD_QUEUED);
    assert_int_equal(pair_cmd(&p, "BLPOP q 0\r\n", &c), 1);
    assert_false(c.flags & RESP_CMD_BLOCKING); /* inside MULTI it does not block */
    assert_int_equal(pair_cmd(&p, "EXEC\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "+QUEUED\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "-ERR bad\r\n", &mt), 1);
    assert_true(mt.cmd.flags & RESP_CMD_REJECTED);
    assert_int_equal(resp_pairing_pending(&p), 1);
    assert_int_equal(pair_reply(&p, "*2\r\n+OK\r\n*-1\r\n", &mt), 1);
    assert_int_equal(mt.ntx, 1);
    assert_string_equal(resp_pairing_tx(&p, 0)->name, "SET");
    assert_null(resp_pairing_tx(&p, 1));
    assert_int_equal(p.count, 0);

    /* RESP3 and MONITOR: HELLO switches on success only; monitor lines are out-of-band. */
    assert_int_equal(pair_cmd(&p, "HELLO 3\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "-NOPROTO sorry\r\n", &mt), 1);
    assert_int_equal(p.proto, 2);
    assert_int_equal(pair_cmd(&p, "HELLO 3\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "%0\r\n", &mt), 1);
    assert_int_equal(p.proto, 3);
    assert_int_equal(pair_cmd(&p, "MONITOR\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "+OK\r\n", &mt), 1);
    assert_int_equal(pair_reply(&p, "+1700000000.1 [0 127.0.0.1:1] \"PING\"\r\n", &mt), 0);
    assert_int_equal(pair_cmd(&p, "RESET\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "+RESET\r\n", &mt), 1);
    assert_int_equal(p.proto, 2);
    assert_false(p.monitor);

    /* CLIENT REPLY SKIP is ended by an empty command too (Redis' resetClient()); RESET always
     * answers. */
    assert_int_equal(pair_cmd(&p, "CLIENT REPLY SKIP\r\n", &c), 0);
    assert_true(c.flags & RESP_CMD_NO_REPLY);
    assert_int_equal(pair_cmd(&p, "\r\n", &c), 0);
    assert_int_equal(pair_cmd(&p, "PING\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "CLIENT REPLY OFF\r\n", &c), 0);
    assert_int_equal(pair_cmd(&p, "CLIENT REPLY SKIP\r\n", &c), 0);
    assert_int_equal(pair_cmd(&p, "RESET\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "PING\r\n", &c), 1);
    assert_int_equal(resp_pairing_pending(&p), 3);
}

static void test_pairing_unsubscribe_all(void **state)
{
    (void)state;
    struct resp_cmd slots[8], c;
    struct resp_pairing p;
    struct resp_match mt;
    resp_pairing_init(&p, slots, 8);
    /* Nothing subscribed: UNSUBSCRIBE still answers once, with a null channel. */
    assert_int_equal(pair_cmd(&p, "UNSUBSCRIBE\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n", &mt), 1);
    assert_true(mt.last);
    /* RESP3: confirmations are pushes; messages interleave and pair with nothing. */
    assert_int_equal(pair_cmd(&p, "HELLO 3\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, "%0\r\n", &mt), 1);
    assert_int_equal(pair_cmd(&p, "SSUBSCRIBE a b\r\n", &c), 1);
    assert_int_equal(pair_cmd(&p, "GET k\r\n", &c), 1);
    assert_int_equal(pair_reply(&p, ">3\r\n$10\r\nssubscribe\r\n$1\r\na\r\n:1\r\n", &mt), 1);
    assert_false(mt.last);
    assert_int_equal(pair_reply(&p, ">3\r\n$8\r\nsmessage\r\n$1\r\na\r\n$1\r\nx\r\n", &mt), 0);
    assert_int_equal(pair_reply(&p, ">3\r\n$10\r\nssubscribe\r\n$1\r\nb\r\n:2\r\n", &mt), 1);
    assert_true(mt.last);
    assert_int_equal(p.shard_channels, 2);
    /* A confirmation nobody awaits (a slot migrated away) is out-of-band. */
    assert_int_equal(pair_reply(&p, ">3\r\n$12\r\nsunsubscribe\r\n$1\r\na\r\n:1\r\n", &mt), 0);
    assert_int_equal(pair_reply(&p, "$1\r\nv\r\n", &mt), 1);
    assert_string_equal(mt.cmd.name, "GET");
}

/* ---- malformed input and limits ------------------------------------------------------------ */

struct bad_case {
    enum resp_side side;
    const char *wire;
    int rc;
};

static int scan_literal(struct resp_scanner *sc, const char *wire, size_t len)
{
    /* An exact-size heap copy, so that ASan sees any read past the input. */
    uint8_t *buf = malloc(len > 0 ? len : 1);
    assert_non_null(buf);
    memcpy(buf, wire, len);
    struct resp_msg m;
    int rc = resp_scan(sc, buf, len, &m);
    if (rc == 1)
        assert_true(m.len <= len);
    free(buf);
    return rc;
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {RESP_SIDE_SERVER, "?oops\r\n", RESP_E_TYPE},
        {RESP_SIDE_SERVER, "@", RESP_E_TYPE},
        {RESP_SIDE_SERVER, "*2\r\n:1\r\nx", RESP_E_TYPE},
        {RESP_SIDE_SERVER, "$-2\r\n", RESP_E_LENGTH},
        {RESP_SIDE_SERVER, "*-5\r\n", RESP_E_LENGTH},
        {RESP_SIDE_SERVER, "%-1\r\n", RESP_E_LENGTH},
        {RESP_SIDE_SERVER, "=-1\r\n", RESP_E_LENGTH},
        {RESP_SIDE_SERVER, "$1x\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$+5\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$05\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$-0\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$ 5\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "$99999999999999999999\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "*99999999999999999999999", RESP_E_INTEGER}, /* no CRLF needed */
        {RESP_SIDE_SERVER, ":9223372036854775808\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, ":-9223372036854775809\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, ":99999999999999999999\r\n", RESP_E_INTEGER}, /* past UINT64_MAX */
        {RESP_SIDE_SERVER, ":12345678901234567x\r\n",
         RESP_E_INTEGER}, /* 18 bytes, not all digits */
        {RESP_SIDE_SERVER, ":1.5\r\n", RESP_E_INTEGER},
        {RESP_SIDE_SERVER, "+OK\n", RESP_E_LINE_END},
        {RESP_SIDE_SERVER, "+OK\rX", RESP_E_LINE_END},
        {RESP_SIDE_SERVER, "$2\n", RESP_E_LINE_END},
        {RESP_SIDE_SERVER, "$2\r\nabc\r\n", RESP_E_BULK_END},
        {RESP_SIDE_SERVER, "$2\r\nab\rx", RESP_E_BULK_END},
        {RESP_SIDE_SERVER, "$2\r\nab\n", RESP_E_BULK_END},
        {RESP_SIDE_SERVER, "#x\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "#tt\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "_x\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, ",1.5.5\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, ",\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, ",1e\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "(12a\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "(-\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "=3\r\ntxt\r\n", RESP_E_VALUE},
        {RESP_SIDE_SERVER, "=5\r\ntxt-x\r\n", RESP_E_VALUE},
        {RESP_SIDE_CLIENT, "*1\r\n:1\r\n", RESP_E_COMMAND},
        {RESP_SIDE_CLIENT, "*1\r\n*1\r\n", RESP_E_COMMAND},
        {RESP_SIDE_CLIENT, "*1\r\n$-1\r\n", RESP_E_LENGTH},
        {RESP_SIDE_CLIENT, "*1\r\n$3\r\nGETx\r\n", RESP_E_BULK_END},
        {RESP_SIDE_CLIENT, "SET \"a b\r\n", RESP_E_INLINE_QUOTES},
        {RESP_SIDE_CLIENT, "SET 'a\r\n", RESP_E_INLINE_QUOTES},
        {RESP_SIDE_CLIENT, "SET \"a\"b\r\n", RESP_E_INLINE_QUOTES},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        struct resp_scanner sc;
        resp_scanner_init(&sc, cases[i].side);
        int rc = scan_literal(&sc, cases[i].wire, strlen(cases[i].wire));
        if (rc != cases[i].rc)
            fail_msg("case %zu (%s): got %d (%s), expected %d (%s)", i, cases[i].wire, rc,
                     resp_strerror(rc), cases[i].rc, resp_strerror(cases[i].rc));
        /* Sticky until reset. */
        assert_int_equal(scan_literal(&sc, "+OK\r\n", 5), cases[i].rc);
        resp_scanner_reset(&sc);
        assert_int_equal(scan_literal(&sc, "*1\r\n$2\r\nOK\r\n", 12), 1);
    }
}

static void test_valid_edges(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {RESP_SIDE_SERVER, "$0\r\n\r\n", 1},
        {RESP_SIDE_SERVER, ":-9223372036854775808\r\n", 1},
        {RESP_SIDE_SERVER, ":9223372036854775807\r\n", 1},
        {RESP_SIDE_SERVER, ":0\r\n", 1},
        {RESP_SIDE_SERVER, ":999999999999999999\r\n", 1},  /* 18 digits: the unchecked loop */
        {RESP_SIDE_SERVER, ":1000000000000000000\r\n", 1}, /* 19: the checked one */
        {RESP_SIDE_SERVER, ":-999999999999999999\r\n", 1},
        {RESP_SIDE_SERVER, ",-inf\r\n", 1},
        {RESP_SIDE_SERVER, ",nan\r\n", 1},
        {RESP_SIDE_SERVER, ",1.5e-3\r\n", 1},
        {RESP_SIDE_SERVER, ",.5\r\n", 1},
        {RESP_SIDE_SERVER, "(-12345678901234567890123\r\n", 1},
        {RESP_SIDE_SERVER, "!21\r\nSYNTAX invalid syntax\r\n", 1},
        {RESP_SIDE_SERVER, "=4\r\ntxt:\r\n", 1},
        {RESP_SIDE_SERVER, "*0\r\n", 1},
        {RESP_SIDE_SERVER, "%0\r\n", 1},
        {RESP_SIDE_SERVER, "|0\r\n+OK\r\n", 1},
        {RESP_SIDE_SERVER, "|1\r\n+a\r\n+b\r\n", 0},
        {RESP_SIDE_SERVER, "*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n", 1},
        {RESP_SIDE_CLIENT, "*0\r\n", 1},
        {RESP_SIDE_CLIENT, "*-1\r\n", 1},
        /* Redis reads any count <= 0 as an empty command (processMultibulkBuffer). */
        {RESP_SIDE_CLIENT, "*-2\r\n", 1},
        {RESP_SIDE_CLIENT, "*-9223372036854775808\r\n", 1},
        {RESP_SIDE_CLIENT, "*1\r\n$0\r\n\r\n", 1},
        {RESP_SIDE_CLIENT, "+PING\r\n", 1}, /* Redis: anything but '*' is an inline command */
        {RESP_SIDE_CLIENT, "SET k \"\\x41\\n\" x\n", 1},
        {RESP_SIDE_CLIENT, "   \r\n", 1},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        struct resp_scanner sc;
        resp_scanner_init(&sc, cases[i].side);
        int rc = scan_literal(&sc, cases[i].wire, strlen(cases[i].wire));
        if (rc != cases[i].rc)
            fail_msg("case %zu (%s): got %d (%s), expected %d", i, cases[i].wire, rc,
                     resp_strerror(rc), cases[i].rc);
    }
    /* An attribute inside an aggregate belongs to the element after it. */
    const char *w = "*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n";
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    assert_int_equal(resp_scan(&sc, (const uint8_t *)w, strlen(w), &m), 1);
    assert_int_equal(m.nelem, 2);
    assert_int_equal(m.elem[0].type, ':');
    assert_int_equal(w[m.elem[0].off], '1');
    assert_int_equal(w[m.elem[1].off], '2');
    check_iterator((const uint8_t *)w, &m);
    /* Inline words unquoted as Redis does; a quote may open mid-word. */
    const char *line = "SET k \"\\x41\\n\\\"\" 'it\\'s' a\"b c\"\n";
    uint8_t out[16];
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, (const uint8_t *)line, strlen(line), &m), 1);
    assert_int_equal(m.nelem, 5);
    assert_int_equal(resp_view_copy((const uint8_t *)line, m.len, &m.elem[2], out, 16), 3);
    assert_memory_equal(out, "A\n\"", 3);
    assert_int_equal(resp_view_copy((const uint8_t *)line, m.len, &m.elem[3], out, 16), 4);
    assert_memory_equal(out, "it's", 4);
    assert_int_equal(resp_view_copy((const uint8_t *)line, m.len, &m.elem[4], out, 16), 4);
    assert_memory_equal(out, "ab c", 4);
    assert_int_equal(resp_view_copy((const uint8_t *)line, m.len, &m.elem[4], out, 2), 4);
    assert_memory_equal(out, "ab", 2);
    check_iterator((const uint8_t *)line, &m);
}

/* A command with more elements than the scanner files: the iterator walks them all. */
static void test_many_arguments(void **state)
{
    (void)state;
    const char *argv[101];
    char vals[101][8];
    argv[0] = "LPUSH";
    for (int i = 1; i < 101; i++) {
        snprintf(vals[i], sizeof(vals[i]), "v%d", i);
        argv[i] = vals[i];
    }
    uint8_t buf[2048];
    int n = resp_encode_command(buf, sizeof(buf), 101, argv, NULL);
    assert_true(n > 0);
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, buf, (size_t)n, &m), 1);
    assert_int_equal(m.nelem, 101);
    check_iterator(buf, &m);
    struct resp_args it;
    struct resp_view v;
    resp_args_init(&it, buf, &m);
    for (int i = 0; i < 101; i++) {
        assert_int_equal(resp_args_next(&it, &v), 1);
        assert_true(resp_view_equals(buf, m.len, &v, argv[i]));
    }
    assert_int_equal(resp_args_next(&it, &v), 0);
    /* A buffer that is not the scanned message is reported, not over-read. */
    resp_args_init(&it, buf, &m);
    it.len = 40;
    while ((n = resp_args_next(&it, &v)) == 1)
        ;
    assert_int_equal(n, RESP_E_MISMATCH);
}

static char *repeat(char c, size_t n, const char *prefix, const char *suffix)
{
    size_t p = strlen(prefix), s = strlen(suffix);
    char *buf = malloc(p + n + s + 1);
    assert_non_null(buf);
    memcpy(buf, prefix, p);
    memset(buf + p, c, n);
    memcpy(buf + p + n, suffix, s + 1);
    return buf;
}

static int scan_owned(enum resp_side side, char *wire, struct resp_scanner *tune)
{
    struct resp_scanner sc;
    if (tune != NULL)
        sc = *tune;
    else
        resp_scanner_init(&sc, side);
    int rc = scan_literal(&sc, wire, strlen(wire));
    free(wire);
    return rc;
}

/* Nested *1 headers, depth of them, then :1. */
static char *nested(uint32_t depth)
{
    char *buf = malloc(depth * 4 + 5);
    assert_non_null(buf);
    for (uint32_t i = 0; i < depth; i++)
        memcpy(buf + i * 4, "*1\r\n", 4);
    memcpy(buf + depth * 4, ":1\r\n", 5);
    return buf;
}

static void test_limits(void **state)
{
    (void)state;
    /* Lines: RESP_MAX_LINE bytes pass, one more fails (before any CRLF arrives). */
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat('a', RESP_MAX_LINE, "+", "\r\n"), NULL),
                     1);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat('a', RESP_MAX_LINE + 1, "-", ""), NULL),
                     RESP_E_LINE_TOO_LONG);
    /* Inline commands: RESP_INLINE_MAX bytes pass, one more fails, with or without LF. */
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat('a', RESP_INLINE_MAX, "", "\r\n"), NULL),
                     1);
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat('a', RESP_INLINE_MAX + 1, "", "\n"), NULL),
                     RESP_E_INLINE_TOO_LONG);
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat('a', RESP_INLINE_MAX + 2, "", ""), NULL),
                     RESP_E_INLINE_TOO_LONG);
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat('a', RESP_INLINE_MAX + 1, "", ""), NULL),
                     0);
    /* Bulk: the default is Redis' 512 MiB; the header alone decides. */
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat(' ', 0, "$536870912\r\n", ""), NULL), 0);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat(' ', 0, "$536870913\r\n", ""), NULL),
                     RESP_E_BULK_TOO_LONG);
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat(' ', 0, "*1\r\n$536870913\r\n", ""), NULL),
                     RESP_E_BULK_TOO_LONG);
    /* Elements: INT_MAX like Redis 7; a map counts two per pair. */
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat(' ', 0, "*2147483647\r\n", ""), NULL), 0);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat(' ', 0, "*2147483648\r\n", ""), NULL),
                     RESP_E_TOO_MANY_ELEMENTS);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, repeat(' ', 0, "%1073741824\r\n", ""), NULL),
                     RESP_E_TOO_MANY_ELEMENTS);
    assert_int_equal(scan_owned(RESP_SIDE_CLIENT, repeat(' ', 0, "*2147483648\r\n", ""), NULL),
                     RESP_E_TOO_MANY_ELEMENTS);
    /* Depth: RESP_MAX_DEPTH nested aggregates pass, one more fails, even an empty one. */
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, nested(RESP_MAX_DEPTH), NULL), 1);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, nested(RESP_MAX_DEPTH + 1), NULL),
                     RESP_E_TOO_DEEP);
    char *deep_empty = nested(RESP_MAX_DEPTH - 1); /* then *0: RESP_MAX_DEPTH aggregates */
    memcpy(deep_empty + (RESP_MAX_DEPTH - 1) * 4, "*0\r\n", 5);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, deep_empty, NULL), 1);
    deep_empty = nested(RESP_MAX_DEPTH);
    memcpy(deep_empty + RESP_MAX_DEPTH * 4, "*0\r\n", 5);
    assert_int_equal(scan_owned(RESP_SIDE_SERVER, deep_empty, NULL), RESP_E_TOO_DEEP);

    /* A caller's lower limits, each crossed by one. */
    struct resp_scanner t;
    resp_scanner_init(&t, RESP_SIDE_SERVER);
    t.max_line = 8;
    t.max_bulk = 10;
    t.max_elements = 3;
    t.max_depth = 2;
    assert_int_equal(scan_owned(0, repeat('a', 8, "+", "\r\n"), &t), 1);
    assert_int_equal(scan_owned(0, repeat('a', 9, "+", "\r\n"), &t), RESP_E_LINE_TOO_LONG);
    assert_int_equal(scan_owned(0, repeat('a', 10, "$10\r\n", "\r\n"), &t), 1);
    assert_int_equal(scan_owned(0, repeat('a', 11, "$11\r\n", "\r\n"), &t), RESP_E_BULK_TOO_LONG);
    assert_int_equal(scan_owned(0, repeat(' ', 0, "*3\r\n:1\r\n:2\r\n:3\r\n", ""), &t), 1);
    assert_int_equal(scan_owned(0, repeat(' ', 0, "*4\r\n", ""), &t), RESP_E_TOO_MANY_ELEMENTS);
    assert_int_equal(scan_owned(0, repeat(' ', 0, "%2\r\n", ""), &t), RESP_E_TOO_MANY_ELEMENTS);
    assert_int_equal(scan_owned(0, nested(2), &t), 1);
    assert_int_equal(scan_owned(0, nested(3), &t), RESP_E_TOO_DEEP);
    assert_int_equal(scan_owned(0, repeat(' ', 0, "|1\r\n*1\r\n*1\r\n", ""), &t), RESP_E_TOO_DEEP);
    resp_scanner_init(&t, RESP_SIDE_CLIENT);
    t.max_inline = 4;
    assert_int_equal(scan_owned(0, repeat('a', 4, "", "\r\n"), &t), 1);
    assert_int_equal(scan_owned(0, repeat('a', 5, "", "\r\n"), &t), RESP_E_INLINE_TOO_LONG);
    assert_int_equal(scan_owned(0, repeat('a', 6, "", ""), &t), RESP_E_INLINE_TOO_LONG);
}

/* Need-more answers: nothing consumed, a lower bound of the length, and no early verdict. */
static void test_partial(void **state)
{
    (void)state;
    struct resp_scanner sc;
    struct resp_msg m;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    const uint8_t *w = (const uint8_t *)"*2\r\n$5\r\nhello\r\n:7\r\n";
    for (size_t k = 0; k < 19; k++) {
        assert_int_equal(resp_scan(&sc, w, k, &m), 0);
        assert_true(m.len > k && m.len <= 19);
    }
    assert_int_equal(resp_scan(&sc, w, 19, &m), 1);
    assert_int_equal(m.len, 19);
    /* Passing fewer bytes than before restarts the message. */
    assert_int_equal(resp_scan(&sc, w, 12, &m), 0);
    assert_int_equal(resp_scan(&sc, w, 5, &m), 0);
    assert_int_equal(resp_scan(&sc, w, 19, &m), 1);
    assert_int_equal(m.elem[1].type, ':');
    assert_string_equal(resp_strerror(RESP_E_TOO_DEEP), "aggregates nested deeper than max_depth");
    assert_string_equal(resp_strerror(-999), "unknown error");
    assert_string_equal(resp_strerror(1), "unknown error");
}

/* ---- encoders ------------------------------------------------------------------------------ */

static void assert_encoded(int n, const uint8_t *buf, const char *expected)
{
    assert_int_equal(n, (int)strlen(expected));
    assert_memory_equal(buf, expected, strlen(expected));
}

/* The bytes of golden message i of stream s. */
static void assert_encoded_golden(int n, const uint8_t *buf, int s, size_t i)
{
    const struct golden *g = &g_streams[s];
    assert_int_equal(n, (int)g->msgs[i].m.len);
    assert_memory_equal(buf, msg_bytes(g, i), g->msgs[i].m.len);
}

static void test_encode_exact(void **state)
{
    (void)state;
    uint8_t buf[256];
    assert_encoded(resp_encode_simple(buf, sizeof(buf), "OK"), buf, "+OK\r\n");
    assert_encoded(resp_encode_integer(buf, sizeof(buf), 0), buf, ":0\r\n");
    assert_encoded(resp_encode_integer(buf, sizeof(buf), INT64_MIN), buf,
                   ":-9223372036854775808\r\n");
    assert_encoded(resp_encode_integer(buf, sizeof(buf), INT64_MAX), buf,
                   ":9223372036854775807\r\n");
    assert_encoded(resp_encode_bulk(buf, sizeof(buf), "", 0), buf, "$0\r\n\r\n");
    assert_encoded(resp_encode_bulk(buf, sizeof(buf), "a\r\nb", 4), buf, "$4\r\na\r\nb\r\n");
    assert_encoded(resp_encode_null(buf, sizeof(buf), 2), buf, "$-1\r\n");
    assert_encoded(resp_encode_null(buf, sizeof(buf), 3), buf, "_\r\n");
    assert_encoded(resp_encode_null_array(buf, sizeof(buf), 2), buf, "*-1\r\n");
    assert_encoded(resp_encode_null_array(buf, sizeof(buf), 3), buf, "_\r\n");
    assert_encoded(resp_encode_array(buf, sizeof(buf), 3), buf, "*3\r\n");
    assert_encoded(resp_encode_queued(buf, sizeof(buf)), buf, "+QUEUED\r\n");
    const uint8_t *replies[] = {(const uint8_t *)":1\r\n", (const uint8_t *)"$-1\r\n"};
    const size_t lens[] = {4, 5};
    assert_encoded(resp_encode_exec(buf, sizeof(buf), 2, replies, lens), buf,
                   "*2\r\n:1\r\n$-1\r\n");
    assert_encoded(resp_encode_exec(buf, sizeof(buf), 0, NULL, NULL), buf, "*0\r\n");
    const char *argv[] = {"GET", "k"};
    const size_t argvlen[] = {3, 1};
    assert_encoded(resp_encode_command(buf, sizeof(buf), 2, argv, argvlen), buf,
                   "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    assert_int_equal(resp_encode_simple(buf, sizeof(buf), "a\r\nb"), RESP_E_ARG);
    assert_int_equal(resp_encode_error(buf, sizeof(buf), "ERR x\n"), RESP_E_ARG);
    assert_int_equal(resp_encode_command(buf, sizeof(buf), 0, argv, NULL), RESP_E_ARG);
}

/* Byte for byte what redis-server 7 and its clients put on the wire in the capture. */
static void test_encode_matches_capture(void **state)
{
    (void)state;
    uint8_t buf[256];
    assert_encoded_golden(
        resp_encode_error(buf, sizeof(buf),
                          "READONLY You can't write against a read only replica."),
        buf, G_RESP2_S, 41);
    assert_encoded_golden(
        resp_encode_error(buf, sizeof(buf),
                          "EXECABORT Transaction discarded because of previous errors."),
        buf, G_RESP2_S, 16);
    assert_encoded_golden(resp_encode_queued(buf, sizeof(buf)), buf, G_RESP2_S, 11);
    assert_encoded_golden(resp_encode_null_array(buf, sizeof(buf), 2), buf, G_RESP2_S, 8);
    assert_encoded_golden(resp_encode_null(buf, sizeof(buf), 2), buf, G_RESP2_S, 5);
    assert_encoded_golden(resp_encode_null_array(buf, sizeof(buf), 3), buf, G_RESP3_S, 23);
    assert_encoded_golden(resp_encode_integer(buf, sizeof(buf), 102400), buf, G_BIG_S, 2);
    /* The EXEC reply of MULTI / LPUSH / INCR / EXEC: *2 :3 :1. */
    uint8_t a[8], b[8];
    const uint8_t *replies[] = {a, b};
    size_t lens[] = {(size_t)resp_encode_integer(a, 8, 3), (size_t)resp_encode_integer(b, 8, 1)};
    assert_encoded_golden(resp_encode_exec(buf, sizeof(buf), 2, replies, lens), buf, G_RESP2_S, 13);
    /* BRPOP's reply: *2 $8 golden:q $5 job-1. */
    int n = resp_encode_array(buf, sizeof(buf), 2);
    n += resp_encode_bulk(buf + n, sizeof(buf) - (size_t)n, "golden:q", 8);
    n += resp_encode_bulk(buf + n, sizeof(buf) - (size_t)n, "job-1", 5);
    assert_encoded_golden(n, buf, G_RESP2_S, 9);
    /* Commands as the raw client sent them. */
    const char *set[] = {"SET", "golden:k", "v1"};
    assert_encoded_golden(resp_encode_command(buf, sizeof(buf), 3, set, NULL), buf, G_RESP2_C, 4);
    const char *xack[] = {"XACK", "golden:s", "g", "1-1"};
    assert_encoded_golden(resp_encode_command(buf, sizeof(buf), 4, xack, NULL), buf, G_RESP2_C, 43);
}

/* Too small by one byte fails at every size, never writes a partial success. */
static void test_encode_buffer_limits(void **state)
{
    (void)state;
    uint8_t buf[64];
    const char *argv[] = {"LPUSH", "q", "job"};
    int full = resp_encode_command(buf, sizeof(buf), 3, argv, NULL);
    assert_true(full > 0);
    for (int cap = 0; cap < full; cap++) {
        assert_int_equal(resp_encode_command(buf, (size_t)cap, 3, argv, NULL), RESP_E_BUFFER);
        assert_int_equal(resp_encode_error(buf, (size_t)cap, "ERR unknown command 'LPUSH', wit"),
                         RESP_E_BUFFER);
    }
    for (int cap = 0; cap < 4; cap++)
        assert_int_equal(resp_encode_integer(buf, (size_t)cap, 42), RESP_E_BUFFER);
    assert_int_equal(resp_encode_null(buf, 4, 2), RESP_E_BUFFER);
    assert_int_equal(resp_encode_null(buf, 3, 3), 3);
    assert_int_equal(resp_encode_bulk(buf, 9, "hello", 5), RESP_E_BUFFER);
    assert_int_equal(resp_encode_bulk(buf, 11, "hello", 5), 11);
}

/* ---- mutations ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The outcome of scanning an input: the messages' (length, type, nelem) and the final code. */
struct outcome {
    size_t n;
    size_t lens[64];
    int rc;
};

static void check_msg(const uint8_t *p, const struct resp_msg *m, struct resp_pairing *pair,
                      enum resp_side side)
{
    for (uint64_t i = 0; i < m->nelem && i < RESP_MSG_VIEWS; i++)
        assert_true(m->elem[i].off <= m->len && m->elem[i].len <= m->len - m->elem[i].off);
    assert_true(m->value.off <= m->len && m->value.len <= m->len - m->value.off);
    check_iterator(p, m);
    uint8_t tmp[8];
    for (uint64_t i = 0; i < m->nelem && i < RESP_MSG_VIEWS; i++)
        assert_true(resp_view_copy(p, m->len, &m->elem[i], tmp, sizeof(tmp)) >= 0);
    struct resp_cmd c;
    struct resp_match mt;
    if (side == RESP_SIDE_CLIENT)
        (void)!resp_pairing_command(pair, m, p, 0, &c);
    else
        (void)!resp_pairing_reply(pair, m, p, &mt);
}

/* Scans buf[0..len) whole, the first `split` bytes arriving first. */
static void scan_all(const struct resp_scanner *proto, const uint8_t *buf, size_t len, size_t split,
                     struct outcome *o, struct resp_pairing *pair)
{
    struct resp_scanner sc = *proto;
    size_t off = 0;
    memset(o, 0, sizeof(*o));
    while (off < len && o->n < 64) {
        struct resp_msg m;
        if (split > off) {
            int early = resp_scan(&sc, buf + off, split - off, &m);
            if (early == 1) {
                check_msg(buf + off, &m, pair, sc.side);
                o->lens[o->n++] = m.len;
                off += m.len;
                continue;
            }
            if (early < 0) {
                o->rc = early;
                return;
            }
        }
        int rc = resp_scan(&sc, buf + off, len - off, &m);
        if (rc != 1) {
            o->rc = rc;
            return;
        }
        assert_true(m.len > 0 && m.len <= len - off);
        check_msg(buf + off, &m, pair, sc.side);
        o->lens[o->n++] = m.len;
        off += m.len;
    }
}

/* Scans buf[0..len) as a proxy passing long replies on does: pieces of up to `chunk` bytes arrive,
 * and after each "need more" every byte resp_scan_releasable() allows is dropped
 * (resp_scan_release()).  A message's length is what was dropped of it plus what the last call
 * measured; its type, once read, stays what the whole message says. */
static void scan_released(const struct resp_scanner *proto, const uint8_t *buf, size_t len,
                          size_t chunk, struct outcome *o)
{
    struct resp_scanner sc = *proto;
    size_t start = 0, have = 0, dropped = 0;
    uint8_t type = 0;
    memset(o, 0, sizeof(*o));
    while (start < len && o->n < 64) {
        have = have + chunk < len ? have + chunk : len;
        for (;;) {
            struct resp_msg m;
            int rc = resp_scan(&sc, buf + start, have - start, &m);
            if (rc < 0) {
                o->rc = rc;
                return;
            }
            if (rc == 0) {
                size_t k = resp_scan_releasable(&sc, have - start);
                assert_true(k <= have - start);
                /* Known once read (not inside a leading attribute), and then kept. */
                if (type == 0)
                    type = m.type;
                assert_int_equal(type, m.type);
                resp_scan_release(&sc, k);
                start += k;
                dropped += k;
                if (have == len) {
                    o->rc = 0;
                    return;
                }
                break;
            }
            if (type != 0)
                assert_int_equal(type, m.type);
            o->lens[o->n++] = dropped + m.len;
            start += m.len;
            dropped = 0;
            type = 0;
            if (start == have || o->n == 64)
                break;
        }
    }
}

/* A server's streams passed on as they come (resp_scan_release after every "need more"), in
 * pieces of 1 to 9 bytes and, for the 100 KiB one, of 509 and 4096: the same messages, the same
 * lengths, and most of a long message released before its end. */
static void test_release_golden(void **state)
{
    (void)state;
    for (int s = 0; s < G_COUNT; s++) {
        const struct golden *g = &g_streams[s];
        if (g->side != RESP_SIDE_SERVER)
            continue;
        static const size_t chunks[] = {1, 2, 3, 5, 7, 9, 509, 4096};
        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
            struct resp_scanner proto;
            resp_scanner_init(&proto, g->side);
            struct outcome o;
            scan_released(&proto, g->buf, g->len, chunks[c], &o);
            assert_int_equal(o.rc, 0);
            size_t n = g->n < 64 ? g->n : 64;
            assert_int_equal(o.n, n);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(o.lens[i], g->msgs[i].m.len);
        }
    }
    /* An array of 1,000 bulks fed 100 bytes at a time: never more than a piece and an item
     * kept. */
    uint8_t *big = malloc(32 * 1000 + 16);
    assert_non_null(big);
    size_t len = (size_t)sprintf((char *)big, "*1000\r\n");
    for (int i = 0; i < 1000; i++)
        len += (size_t)sprintf((char *)big + len, "$%d\r\n%0*d\r\n", 10 + i % 7, 10 + i % 7, i);
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    size_t start = 0, have = 0, most = 0, dropped = 0;
    struct resp_msg m;
    int rc = 0;
    while (rc == 0 && have < len) {
        have = have + 100 < len ? have + 100 : len;
        rc = resp_scan(&sc, big + start, have - start, &m);
        assert_true(rc >= 0);
        if (rc == 0) {
            assert_int_equal(m.type, '*');
            size_t k = resp_scan_releasable(&sc, have - start);
            resp_scan_release(&sc, k);
            start += k;
            dropped += k;
        }
        most = have - start > most ? have - start : most;
    }
    assert_int_equal(rc, 1);
    assert_int_equal(dropped + m.len, len);
    assert_true(most < 100 + 32);
    free(big);
}

static const uint8_t interesting[] = "\r\n*$:+-_,#(=~%|>!0123456789-\"' \\x";

static size_t mutate(uint8_t *buf, size_t len, size_t cap)
{
    int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits && len > 0; e++) {
        size_t at = (size_t)(rng() % len);
        switch (rng() % 6) {
        case 0:
            buf[at] ^= (uint8_t)(1u << (rng() % 8));
            break;
        case 1:
            buf[at] = interesting[rng() % (sizeof(interesting) - 1)];
            break;
        case 2:
            if (len < cap) {
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = interesting[rng() % (sizeof(interesting) - 1)];
                len++;
            }
            break;
        case 3:
            memmove(buf + at, buf + at + 1, len - at - 1);
            len--;
            break;
        case 4:
            len = at + 1;
            break;
        default: {
            size_t from = (size_t)(rng() % len), n = 1 + (size_t)(rng() % 8);
            if (n > len - from)
                n = len - from;
            if (len + n <= cap) {
                memmove(buf + at + n, buf + at, len - at);
                memmove(buf + at, buf + (from >= at ? from + n : from), n);
                len += n;
            }
        }
        }
    }
    return len;
}

static void mutate_one(int k, size_t *accepted, size_t *rejected)
{
    static const int streams[] = {G_RESP2_C, G_RESP2_S, G_RESP3_C, G_RESP3_S, G_CLI_C, G_CLI_S};
    const struct golden *g = &g_streams[streams[k % 6]];
    size_t first = (size_t)(rng() % g->n), last = first + 1 + (size_t)(rng() % 4);
    if (last > g->n)
        last = g->n;
    size_t from = g->msgs[first].off;
    size_t span = g->msgs[last - 1].off + g->msgs[last - 1].m.len - from;
    size_t cap = span + 64;
    uint8_t *work = malloc(cap);
    assert_non_null(work);
    memcpy(work, g->buf + from, span);
    size_t len = mutate(work, span, cap);
    uint8_t *exact = malloc(len > 0 ? len : 1); /* ASan: no slack past the input */
    assert_non_null(exact);
    memcpy(exact, work, len);
    free(work);

    struct resp_scanner proto;
    resp_scanner_init(&proto, rng() % 5 == 0 ? (enum resp_side) !g->side : g->side);
    if (rng() % 3 == 0) {
        proto.max_line = 1 + (size_t)(rng() % 32);
        proto.max_bulk = rng() % 64;
        proto.max_elements = rng() % 8;
        proto.max_depth = (uint32_t)(rng() % 4);
        proto.max_inline = (size_t)(rng() % 64);
    }
    struct resp_cmd slots[8];
    struct resp_pairing pair;
    resp_pairing_init(&pair, slots, 8);
    struct outcome whole, split, streamed;
    scan_all(&proto, exact, len, 0, &whole, &pair);
    scan_all(&proto, exact, len, len > 0 ? (size_t)(rng() % len) : 0, &split, &pair);
    assert_int_equal(whole.n, split.n);
    assert_int_equal(whole.rc, split.rc);
    for (size_t i = 0; i < whole.n; i++)
        assert_int_equal(whole.lens[i], split.lens[i]);
    /* Passed on as it comes: the same messages, the same verdict on the bytes. */
    scan_released(&proto, exact, len, 1 + (size_t)(rng() % 16), &streamed);
    assert_int_equal(whole.n, streamed.n);
    assert_int_equal(whole.rc, streamed.rc);
    for (size_t i = 0; i < whole.n; i++)
        assert_int_equal(whole.lens[i], streamed.lens[i]);
    if (whole.rc < 0)
        (*rejected)++;
    else
        (*accepted)++;
    free(exact);
}

static void test_mutations(void **state)
{
    (void)state;
    size_t accepted = 0, rejected = 0;
    for (int k = 0; k < MUTATIONS; k++)
        mutate_one(k, &accepted, &rejected);
    print_message("%d mutants: %zu scanned to the end (or need more), %zu rejected\n", MUTATIONS,
                  accepted, rejected);
    /* The run exercised both outcomes: a run where nothing parses would prove nothing. */
    assert_true(accepted > MUTATIONS / 10 && rejected > MUTATIONS / 10);
}

/* resp_len_header: the header lines the fast path reads, at every cut; anything else is 0, and
 * what it takes resp_scan() takes with the same count. */
static void test_len_header(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        uint8_t type;
        size_t want; /* bytes, 0: refused */
        uint64_t count;
    } cases[] = {
        {"$0\r\n", '$', 4, 0},
        {"$7\r\n", '$', 4, 7},
        {"$42\r\n", '$', 5, 42},
        {"$1048576\r\n", '$', 10, 1048576},
        {"*3\r\n", '*', 4, 3},
        {"$999999999999999999\r\n", '$', 21, 999999999999999999ull},
        {"$1234567890123456789\r\n", '$', 0, 0}, /* 19 digits */
        {"$-1\r\n", '$', 0, 0},
        {"$+1\r\n", '$', 0, 0},
        {"$01\r\n", '$', 0, 0},
        {"$1\n", '$', 0, 0},
        {"$1\rx", '$', 0, 0},
        {"$\r\n", '$', 0, 0},
        {"*3\r\n", '$', 0, 0}, /* not the type asked for */
        {"$3 \r\n", '$', 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const uint8_t *p = (const uint8_t *)cases[i].line;
        size_t n = strlen(cases[i].line);
        assert_true(n <= RESP_LEN_HEADER_MAX + 2);
        for (size_t cut = 0; cut <= n; cut++) {
            uint64_t count = 12345;
            size_t got = resp_len_header(p, cut, cases[i].type, &count);
            if (cut < n || cases[i].want == 0) {
                assert_int_equal(got, 0);
                continue;
            }
            assert_int_equal(got, cases[i].want);
            assert_int_equal(count, cases[i].count);
        }
    }
    /* a bulk the walker measured is one resp_scan() takes whole with the same length */
    const char *cmd = "*2\r\n$3\r\nGET\r\n$10\r\nabcdefghij\r\n";
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    struct resp_msg m;
    assert_int_equal(resp_scan(&sc, (const uint8_t *)cmd, strlen(cmd), &m), 1);
    uint64_t c1, c2, c3;
    size_t a = resp_len_header((const uint8_t *)cmd, 4, '*', &c1);
    size_t b = resp_len_header((const uint8_t *)cmd + a, 4, '$', &c2);
    size_t d = resp_len_header((const uint8_t *)cmd + a + b + c2 + 2, 5, '$', &c3);
    assert_int_equal(a + b + c2 + 2 + d + c3 + 2, m.len);
    assert_int_equal(c1, m.nelem);
}

/* A long message walked with every prefix of it held (and behind 3 bytes of something else):
 * a lower bound that grows while it is cut short, then its length, as resp_scan() finds it. */
static void walk_every_cut(enum resp_side side, const uint8_t *msg, size_t len, size_t name_off,
                           size_t name_len)
{
    uint8_t *buf = malloc(len + 3);
    assert_non_null(buf);
    memcpy(buf, "xyz", 3);
    memcpy(buf + 3, msg, len);
    struct resp_scanner sc;
    resp_scanner_init(&sc, side);
    struct resp_msg m;
    assert_int_equal(resp_scan(&sc, msg, len, &m), 1);
    assert_int_equal(m.len, len);
    size_t last = 0;
    for (size_t held = 1; held <= len; held++) {
        struct resp_flat f = {buf, held + 3};
        struct resp_walk w;
        int r = resp_walk(&sc, resp_flat_peek, &f, 3, held + 3, &w);
        if (held < len) {
            assert_int_equal(r, RESP_WALK_WAIT);
            assert_true(w.len > held && w.len <= len && w.len >= last);
            last = w.len;
        } else {
            assert_int_equal(r, RESP_WALK_WHOLE);
            assert_int_equal(w.len, len);
            assert_int_equal(w.type, m.type);
            assert_int_equal(w.nelem, m.nelem);
        }
        if (side == RESP_SIDE_CLIENT && held >= name_off + name_len) {
            assert_int_equal(w.name_off, name_off);
            assert_int_equal(w.name_len, name_len);
        }
    }
    free(buf);
}

static void test_walk_every_cut(void **state)
{
    (void)state;
    enum { V = 5000 };
    uint8_t *msg = malloc(V + 200);
    assert_non_null(msg);
    size_t n = (size_t)sprintf((char *)msg, "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$%d\r\n", V);
    for (size_t i = 0; i < V; i++)
        msg[n + i] = "\r\n$*x"[i % 5]; /* a value full of what headers are made of */
    n += V;
    memcpy(msg + n, "\r\n", 2);
    walk_every_cut(RESP_SIDE_CLIENT, msg, n + 2, 8, 3);
    /* the same value as a reply, then in an array of two */
    size_t h = (size_t)sprintf((char *)msg, "$%d\r\n", V);
    for (size_t i = 0; i < V; i++)
        msg[h + i] = "\r\n$*x"[i % 5];
    memcpy(msg + h + V, "\r\n", 2);
    walk_every_cut(RESP_SIDE_SERVER, msg, h + V + 2, 0, 0);
    uint8_t *arr = malloc(V + 200);
    assert_non_null(arr);
    size_t a = (size_t)sprintf((char *)arr, "*2\r\n$1\r\nq\r\n");
    memcpy(arr + a, msg, h + V + 2);
    walk_every_cut(RESP_SIDE_SERVER, arr, a + h + V + 2, 0, 0);
    /* what it leaves to the scanner */
    static const char *const others[] = {
        "$-1\r\n",      "*-1\r\n", "+OK\r\n",     ":1\r\n",
        "*1\r\n:1\r\n", "*0\r\n",  "$3\r\nabcXY", "%1\r\n$1\r\na\r\n$1\r\nb\r\n"};
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        struct resp_flat f = {(const uint8_t *)others[i], strlen(others[i])};
        struct resp_walk w;
        assert_int_equal(resp_walk(&sc, resp_flat_peek, &f, 0, f.len, &w), RESP_WALK_NO);
    }
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    struct resp_flat f = {(const uint8_t *)"PING\r\n", 6};
    struct resp_walk w;
    assert_int_equal(resp_walk(&sc, resp_flat_peek, &f, 0, f.len, &w), RESP_WALK_NO); /* inline */
    /* a header cut short waits; one already wrong does not (resp_scan() fails on it now) */
    f = (struct resp_flat){(const uint8_t *)"*3\r\n$5\r", 7};
    assert_int_equal(resp_walk(&sc, resp_flat_peek, &f, 0, f.len, &w), RESP_WALK_WAIT);
    f = (struct resp_flat){(const uint8_t *)"*3\r\n$5\rX", 8};
    assert_int_equal(resp_walk(&sc, resp_flat_peek, &f, 0, f.len, &w), RESP_WALK_NO);
    /* RESP_WALK_ELEMENTS_MAX elements at most */
    char many[512];
    for (unsigned k = RESP_WALK_ELEMENTS_MAX; k <= RESP_WALK_ELEMENTS_MAX + 1; k++) {
        int len = snprintf(many, sizeof(many), "*%u\r\n", k);
        for (unsigned j = 0; j < k; j++)
            len += snprintf(many + len, sizeof(many) - (size_t)len, "$1\r\n%c\r\n", 'a' + (int)j);
        f = (struct resp_flat){(const uint8_t *)many, (size_t)len};
        assert_int_equal(resp_walk(&sc, resp_flat_peek, &f, 0, f.len, &w),
                         k <= RESP_WALK_ELEMENTS_MAX ? RESP_WALK_WHOLE : RESP_WALK_NO);
    }
    free(arr);
    free(msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_sequences),
        cmocka_unit_test(test_len_header),
        cmocka_unit_test(test_walk_every_cut),
        cmocka_unit_test(test_golden_inline),
        cmocka_unit_test(test_golden_resp2_replies),
        cmocka_unit_test(test_golden_resp3_types),
        cmocka_unit_test(test_golden_big_value),
        cmocka_unit_test(test_golden_iterator),
        cmocka_unit_test(test_split_every_offset),
        cmocka_unit_test(test_split_big),
        cmocka_unit_test(test_release_golden),
        cmocka_unit_test(test_huge_bulk_resumes),
        cmocka_unit_test(test_pairing_golden),
        cmocka_unit_test(test_pairing_rules),
        cmocka_unit_test(test_pairing_tx_longer_than_fifo),
        cmocka_unit_test(test_pairing_named),
        cmocka_unit_test(test_pairing_simple),
        cmocka_unit_test(test_small_names),
        cmocka_unit_test(test_pairing_unsubscribe_all),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_valid_edges),
        cmocka_unit_test(test_many_arguments),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_partial),
        cmocka_unit_test(test_encode_exact),
        cmocka_unit_test(test_encode_matches_capture),
        cmocka_unit_test(test_encode_buffer_limits),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, setup_golden, teardown_golden);
}
