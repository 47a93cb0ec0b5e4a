/*
 * test_msg_field.c - proto/jobs/msg_field.h: a message's id and task from the fields an app keeps
 * them in (properties, headers, routing key, exchange, queue, a JSON body), parsed from a
 * listener's `message-id` / `task` sources and read from real content headers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proto/amqp/amqp.h"
#include "proto/jobs/msg_field.h"

static struct msg_field parse(const char *text)
{
    struct msg_field f;
    char why[256];
    if (msg_field_parse(text, &f, why, sizeof(why)) != 0)
        fail_msg("%s: %s", text, why);
    return f;
}

static void test_parse(void **state)
{
    (void)state;
    struct msg_field f = parse("property.correlation_id");
    assert_int_equal(f.kind, MSG_FIELD_PROPERTY);
    assert_int_equal(f.prop, MSG_PROP_CORRELATION_ID);
    assert_string_equal(f.text, "property.correlation_id");
    f = parse("header.MT-MessageType");
    assert_int_equal(f.kind, MSG_FIELD_HEADER);
    assert_string_equal(f.name, "MT-MessageType");
    f = parse("body.json.data.commandName");
    assert_int_equal(f.kind, MSG_FIELD_BODY_JSON);
    assert_int_equal(f.nkeys, 2);
    assert_string_equal(f.name, "data");
    assert_string_equal(f.name + 5, "commandName");
    assert_int_equal(parse("routing-key").kind, MSG_FIELD_ROUTING_KEY);
    assert_int_equal(parse("exchange").kind, MSG_FIELD_EXCHANGE);
    assert_int_equal(parse("queue").kind, MSG_FIELD_QUEUE);

    char why[256];
    static const char *const bad[] = {
        "",          "header.",       "body.json.",        "body.json.a.",
        "property.", "Property.type", "body.json.a.b.c.d", "routing_key"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(msg_field_parse(bad[i], &f, why, sizeof(why)), -1);
    char key[40];
    memset(key, 'k', 33);
    key[33] = '\0';
    char text[64];
    snprintf(text, sizeof(text), "body.json.%s", key);
    assert_int_equal(msg_field_parse(text, &f, why, sizeof(why)), -1); /* a 33-byte key */
    key[32] = '\0';
    snprintf(text, sizeof(text), "body.json.%s", key);
    assert_int_equal(msg_field_parse(text, &f, why, sizeof(why)), 0);
}

/* A content header with the type property and two headers, encoded and decoded again. */
static void test_read_amqp(void **state)
{
    (void)state;
    /* headers: MT-MessageType = "urn:message:Charge" (S), attempt = 2 (I) */
    static const uint8_t table[] = {14,  'M', 'T', '-', 'M', 'e', 's', 's', 'a', 'g', 'e', 'T', 'y',
                                    'p', 'e', 'S', 0,   0,   0,   18,  'u', 'r', 'n', ':', 'm', 'e',
                                    's', 's', 'a', 'g', 'e', ':', 'C', 'h', 'a', 'r', 'g', 'e', 7,
                                    'a', 't', 't', 'e', 'm', 'p', 't', 'I', 0,   0,   0,   2};
    struct amqp_props p;
    memset(&p, 0, sizeof(p));
    p.type = (struct amqp_bytes){.p = (const uint8_t *)"Charge", .len = 6};
    p.headers = (struct amqp_bytes){.p = table, .len = sizeof(table)};
    static const char body[] =
        "{\"uuid\":\"0b7e\\u0041\",\"displayName\":\"App\\\\Jobs\\\\Charge\","
        "\"n\":7,\"empty\":\"\"}";
    struct msg_field_amqp m = {.props = &p,
                               .routing_key = {.p = (const uint8_t *)"orders", .len = 6},
                               .queue = {.p = (const uint8_t *)"q1", .len = 2}};
    char out[MSG_FIELD_VALUE_MAX];
    size_t n;
    struct msg_field f = parse("property.type");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    assert_string_equal(out, "Charge");
    f = parse("property.message_id");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    f = parse("header.MT-MessageType");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    assert_string_equal(out, "urn:message:Charge");
    f = parse("header.attempt"); /* an integer, not a string */
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    f = parse("routing-key");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    assert_string_equal(out, "orders");
    f = parse("exchange"); /* the default exchange: "" is absent */
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    f = parse("queue");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    f = parse("body.json.uuid");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_NEED_BODY);
    m.body = (const uint8_t *)body;
    m.body_len = sizeof(body) - 1;
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    assert_string_equal(out, "0b7eA"); /* escapes decoded */
    f = parse("body.json.displayName");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_FOUND);
    assert_string_equal(out, "App\\Jobs\\Charge");
    f = parse("body.json.n"); /* a number */
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    f = parse("body.json.empty");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    f = parse("body.json.uuid");
    m.body = (const uint8_t *)"not json";
    m.body_len = 8;
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
}

static void test_value_limits(void **state)
{
    (void)state;
    char big[MSG_FIELD_VALUE_MAX + 32];
    int k = snprintf(big, sizeof(big), "{\"id\":\"");
    memset(big + k, 'x', MSG_FIELD_VALUE_MAX);
    snprintf(big + k + MSG_FIELD_VALUE_MAX, sizeof(big) - (size_t)k - MSG_FIELD_VALUE_MAX, "\"}");
    struct msg_field f = parse("body.json.id");
    char out[MSG_FIELD_VALUE_MAX];
    size_t n;
    assert_int_equal(msg_field_read_json(&f, (const uint8_t *)big, strlen(big), out, &n),
                     MSG_FIELD_TOO_LONG);
    assert_int_equal(n, MSG_FIELD_VALUE_MAX);
    memmove(big + k + MSG_FIELD_VALUE_MAX - 1, "\"}", 3); /* 255 bytes: the longest read */
    assert_int_equal(msg_field_read_json(&f, (const uint8_t *)big, strlen(big), out, &n),
                     MSG_FIELD_FOUND);
    assert_int_equal(strlen(out), MSG_FIELD_VALUE_MAX - 1);
    static const char nul[] = "{\"id\":\"a\\u0000b\"}";
    assert_int_equal(msg_field_read_json(&f, (const uint8_t *)nul, sizeof(nul) - 1, out, &n),
                     MSG_FIELD_ABSENT);
    struct amqp_props p;
    memset(&p, 0, sizeof(p));
    p.message_id = (struct amqp_bytes){.p = (const uint8_t *)"a\0b", .len = 3};
    struct msg_field_amqp m = {.props = &p};
    f = parse("property.message_id");
    assert_int_equal(msg_field_read_amqp(&f, &m, out, &n), MSG_FIELD_ABSENT);
    struct msg_fields fs = {.n = 2};
    fs.src[0] = parse("header.x");
    fs.src[1] = parse("body.json.a");
    assert_true(msg_fields_need_body(&fs));
    fs.n = 1;
    assert_false(msg_fields_need_body(&fs));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_read_amqp),
        cmocka_unit_test(test_value_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
