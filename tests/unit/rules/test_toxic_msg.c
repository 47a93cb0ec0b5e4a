/*
 * test_toxic_msg.c - unit tests of the message toxics (rules/toxic_msg.h): every type, every
 * attribute and every wrong attribute, the exact rule text each toxic makes, and that this text
 * parses with conf_parse_rules() against a configuration with an amqp, a resp (profile celery),
 * a plain resp and a tcp listener, as the Toxiproxy API installs it.  The codecs' real
 * capability tables decide which event takes which action, as in the proxy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "rules/conf.h"
#include "rules/conf_mem.h"
#include "rules/rule.h"
#include "rules/toxic_msg.h"
#include "tests/lib/conf_testkit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BASE                                                                                       \
    "listen rabbit { protocol amqp; bind 127.0.0.1:5673; upstream 127.0.0.1:5672 }\n"              \
    "listen jobs { protocol resp; profile celery; bind 127.0.0.1:6380; upstream 127.0.0.1:6379 "   \
    "}\n"                                                                                          \
    "listen cache { protocol resp; bind 127.0.0.1:6381; upstream 127.0.0.1:6379 }\n"               \
    "listen raw { protocol tcp; bind 127.0.0.1:6382; upstream 127.0.0.1:6379 }\n"

static struct conf *base;
static struct conf_diags base_diags;

static int setup(void **state)
{
    (void)state;
    base = parse_ok(BASE, &base_diags);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    conf_free(base);
    conf_diags_free(&base_diags);
    return 0;
}

/* The JSON object of `attrs` (NULL: no attributes); the test fails on bad JSON. */
static json_t *attrs_of(const char *attrs)
{
    json_error_t jerr;
    json_t *j = attrs != NULL ? json_loads(attrs, JSON_DECODE_ANY, &jerr) : NULL;

    if (attrs != NULL && j == NULL) {
        fprintf(stderr, "bad test JSON %s: %s\n", attrs, jerr.text);
        fail();
    }
    return j;
}

/* The text of toxic `type` on listener `l` of the base (its protocol and profile). */
static char *text_on(const char *l, const char *type, double toxicity, const char *attrs, char *err)
{
    const struct conf_listener *li = conf_find_listener(base, l);
    json_t *j = attrs_of(attrs);

    assert_non_null(li);
    char *t = toxic_msg_rule_text("r", l, conf_protocol_name(li->protocol), li->profile, type,
                                  "downstream", toxicity, j, err, TOXIC_MSG_ERR_BYTES);
    json_decref(j);
    return t;
}

/* The toxic makes exactly `want`, and that text parses into one rule. */
static void want_text(const char *l, const char *type, double toxicity, const char *attrs,
                      const char *want)
{
    char err[TOXIC_MSG_ERR_BYTES];
    char *t = text_on(l, type, toxicity, attrs, err);

    if (t == NULL || strcmp(t, want) != 0) {
        fprintf(stderr, "toxic %s %s on %s:\n want: %s\n got:  %s\n err: %s\n", type,
                attrs ? attrs : "{}", l, want, t ? t : "(null)", t ? "" : err);
        fail();
    }
    free(t);
}

/* The toxic is refused before any text, with exactly `want`. */
static void want_err(const char *l, const char *type, double toxicity, const char *attrs,
                     const char *want)
{
    char err[TOXIC_MSG_ERR_BYTES];
    char *t = text_on(l, type, toxicity, attrs, err);

    if (t != NULL || strcmp(err, want) != 0) {
        fprintf(stderr, "toxic %s %s on %s:\n want error: %s\n got: %s\n", type,
                attrs ? attrs : "{}", l, want, t ? t : err);
        fail();
    }
    free(t);
}

/* The one rule the toxic makes through toxic_msg_rule(); the test fails with its error. */
static struct rule *rule_of(const char *l, const char *type, double toxicity, const char *attrs)
{
    char err[TOXIC_MSG_ERR_BYTES];
    json_t *j = attrs_of(attrs);
    struct rule *r = toxic_msg_rule(base, "r", l, type, NULL, toxicity, j, err, sizeof(err));

    json_decref(j);
    if (r == NULL) {
        fprintf(stderr, "toxic %s %s on %s: %s\n", type, attrs ? attrs : "{}", l, err);
        fail();
    }
    assert_null(r->next);
    assert_string_equal(r->name, "r");
    assert_string_equal(r->listener, l);
    return r;
}

/* toxic_msg_rule() refuses the toxic with exactly `want` (the parser's words, or ours). */
static void rule_err(const char *l, const char *type, const char *attrs, const char *want)
{
    char err[TOXIC_MSG_ERR_BYTES];
    json_t *j = attrs_of(attrs);
    struct rule *r = toxic_msg_rule(base, "r", l, type, "upstream", 1.0, j, err, sizeof(err));

    json_decref(j);
    if (r != NULL || strcmp(err, want) != 0) {
        fprintf(stderr, "toxic %s %s on %s:\n want error: %s\n got: %s\n", type,
                attrs ? attrs : "{}", l, want, r ? "a rule" : err);
        rule_list_free(r);
        fail();
    }
}

/* ---- every type ---- */

static void test_is_message(void **state)
{
    static const char *const yes[] = {"redeliver", "duplicate", "expire", "delay",
                                      "drop",      "error",     "close"};
    static const char *const no[] = {"latency", "bandwidth",  "slow_close", "timeout", "reset_peer",
                                     "slicer",  "limit_data", "down",       "",        "Duplicate"};

    (void)state;
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        assert_true(toxic_msg_is_message(yes[i]));
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        assert_false(toxic_msg_is_message(no[i]));
    }
    assert_false(toxic_msg_is_message(NULL));
}

/* Each type with only what it needs, on amqp: its default event. */
static void test_types_amqp(void **state)
{
    static const struct {
        const char *type, *attrs, *text;
        enum rule_event event;
        enum rule_action_kind action;
    } cases[] = {
        {"redeliver", NULL, "  when ack\n  do redeliver\n", RULE_EV_ACK, RULE_ACT_REDELIVER},
        {"duplicate", "{}", "  when deliver\n  do duplicate\n", RULE_EV_DELIVER,
         RULE_ACT_DUPLICATE},
        {"expire", "{\"timeout\":3000}", "  when deliver\n  do expire 3000ms\n", RULE_EV_DELIVER,
         RULE_ACT_EXPIRE},
        {"delay", "{\"delay\":\"5s\"}", "  when ack\n  do delay 5s\n", RULE_EV_ACK, RULE_ACT_DELAY},
        {"drop", NULL, "  when ack\n  do drop\n", RULE_EV_ACK, RULE_ACT_DROP},
        {"error", "{\"code\":406}", "  when deliver\n  do error 406\n", RULE_EV_DELIVER,
         RULE_ACT_ERROR},
        {"close", NULL, "  when ack\n  do close before\n", RULE_EV_ACK, RULE_ACT_CLOSE},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char want[256];
        snprintf(want, sizeof(want), "rule r on rabbit {\n%s}\n", cases[i].text);
        want_text("rabbit", cases[i].type, 1.0, cases[i].attrs, want);
        struct rule *r = rule_of("rabbit", cases[i].type, 1.0, cases[i].attrs);
        assert_int_equal(r->event, cases[i].event);
        assert_int_equal(r->action.kind, cases[i].action);
        assert_true(r->enabled);
        assert_false(r->trigger.has_probability);
        rule_list_free(r);
    }
}

/* On resp: a profile's job events, and commands without a profile. */
static void test_types_resp(void **state)
{
    struct rule *r;

    (void)state;
    want_text("jobs", "duplicate", 1.0, NULL,
              "rule r on jobs {\n  when deliver\n  do duplicate\n}\n");
    want_text("jobs", "redeliver", 1.0, NULL, "rule r on jobs {\n  when ack\n  do redeliver\n}\n");
    want_text("jobs", "error", 1.0, "{\"code\":\"READONLY\"}",
              "rule r on jobs {\n  when command\n  do error READONLY\n}\n");
    want_text("cache", "drop", 1.0, "{\"command\":\"SET\"}",
              "rule r on cache {\n  when command command=SET\n  do drop\n}\n");
    want_text("cache", "delay", 1.0, "{\"delay\":250}",
              "rule r on cache {\n  when command\n  do delay 250ms\n}\n");

    r = rule_of("jobs", "duplicate", 1.0, "{\"task\":\"tasks.charge\",\"after\":\"2s\"}");
    assert_int_equal(r->event, RULE_EV_DELIVER);
    assert_int_equal(r->action.kind, RULE_ACT_DUPLICATE);
    assert_int_equal(r->action.duration_ms, 2000);
    assert_string_equal(r->matchers[0].value, "tasks.charge");
    rule_list_free(r);
    r = rule_of("jobs", "delay", 1.0, "{\"event\":\"ack\",\"delay\":\"45s\"}");
    assert_int_equal(r->event, RULE_EV_ACK);
    assert_int_equal(r->action.duration_ms, 45000);
    rule_list_free(r);
    r = rule_of("cache", "error", 1.0, "{\"code\":\"OOM\",\"key\":\"jobs:*\"}");
    assert_int_equal(r->event, RULE_EV_COMMAND);
    assert_string_equal(r->action.error_code, "OOM");
    assert_int_equal(r->matchers[0].field, RULE_F_KEY);
    assert_true(r->matchers[0].is_glob);
    rule_list_free(r);
}

/* ---- every attribute ---- */

static void test_matchers(void **state)
{
    struct rule *r;

    (void)state;
    want_text("rabbit", "duplicate", 1.0,
              "{\"redelivered\":false,\"header.x-retry\":1,\"queue\":\"celery\","
              "\"exchange\":\"ex\",\"routing_key\":\"rk\",\"consumer_tag\":\"ctag*\","
              "\"message_id\":42,\"task\":\"tasks.*\",\"body\":\"*refund*\","
              "\"client\":\"10.0.0.0/8\"}",
              "rule r on rabbit {\n  when deliver queue=celery exchange=ex routing_key=rk "
              "consumer_tag=ctag* message_id=42 task=tasks.* body=*refund* client=10.0.0.0/8 "
              "redelivered=false header.x-retry=1\n  do duplicate\n}\n");
    r = rule_of("rabbit", "duplicate", 1.0,
                "{\"queue\":\"celery\",\"exchange\":\"ex\",\"routing_key\":\"rk\","
                "\"consumer_tag\":\"c\",\"message_id\":42,\"task\":\"t\",\"body\":\"*b*\","
                "\"client\":\"10.0.0.0/8\",\"redelivered\":true,\"header.x-retry\":\"1\"}");
    static const enum rule_field fields[] = {
        RULE_F_QUEUE, RULE_F_EXCHANGE, RULE_F_ROUTING_KEY, RULE_F_CONSUMER_TAG, RULE_F_MESSAGE_ID,
        RULE_F_TASK,  RULE_F_BODY,     RULE_F_CLIENT,      RULE_F_REDELIVERED,  RULE_F_HEADER};
    assert_int_equal(r->n_matchers, 10);
    for (size_t i = 0; i < 10; i++) {
        assert_int_equal(r->matchers[i].field, fields[i]);
        assert_int_equal(r->matchers[i].op, RULE_OP_EQ);
    }
    assert_string_equal(r->matchers[4].value, "42");
    assert_true(r->matchers[8].bool_value);
    assert_string_equal(r->matchers[9].header, "x-retry");
    rule_list_free(r);
    /* command and key, on commands */
    r = rule_of("cache", "drop", 1.0, "{\"command\":\"BRPOP\",\"key\":\"q\"}");
    assert_int_equal(r->matchers[0].field, RULE_F_COMMAND);
    assert_int_equal(r->matchers[1].field, RULE_F_KEY);
    rule_list_free(r);
}

/* A value with blanks, quotes, backslashes or control characters is quoted, and reads back as
 * it was; nothing in a value writes outside it. */
static void test_values_quoted(void **state)
{
    static const char *const values[] = {"refund due",
                                         "say \"hi\"",
                                         "a\\b",
                                         "two\nlines",
                                         "tab\there",
                                         "",
                                         "}\nrule evil on rabbit {\n  do drop\n",
                                         "x; do drop",
                                         "# not a comment",
                                         "{}",
                                         "caf\xc3\xa9"};

    (void)state;
    want_text("rabbit", "duplicate", 1.0, "{\"body\":\"refund due\",\"task\":\"\"}",
              "rule r on rabbit {\n  when deliver task=\"\" body=\"refund due\"\n"
              "  do duplicate\n}\n");
    want_text("rabbit", "duplicate", 1.0, "{\"task\":\"a\\\"b\\\\c\\nd\\te\"}",
              "rule r on rabbit {\n  when deliver task=\"a\\\"b\\\\c\\nd\\te\"\n"
              "  do duplicate\n}\n");
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        json_t *j = json_pack("{s:s}", "task", values[i]);
        char err[TOXIC_MSG_ERR_BYTES];
        struct rule *r =
            toxic_msg_rule(base, "r", "rabbit", "duplicate", NULL, 1.0, j, err, sizeof(err));
        json_decref(j);
        if (r == NULL) {
            fprintf(stderr, "value #%zu: %s\n", i, err);
            fail();
        }
        assert_null(r->next);
        assert_int_equal(r->n_matchers, 1);
        assert_string_equal(r->matchers[0].value, values[i]);
        rule_list_free(r);
    }
}

static void test_triggers(void **state)
{
    struct rule *r;

    (void)state;
    want_text("rabbit", "redeliver", 1.0,
              "{\"max_per_message\":2,\"limit\":5,\"after_first\":3,\"first\":10,\"nth\":4,"
              "\"every\":2,\"between\":[\"30s\",\"5m\"]}",
              "rule r on rabbit {\n  when ack\n  between 30s 5m\n  every 2\n  nth 4\n  first 10\n"
              "  after 3\n  limit 5\n  max-per-message 2\n  do redeliver\n}\n");
    r = rule_of("rabbit", "redeliver", 1.0,
                "{\"every\":2,\"nth\":4,\"first\":10.0,\"after_first\":3,\"limit\":5,"
                "\"max_per_message\":2,\"between\":[0,300000]}");
    assert_int_equal(r->trigger.every, 2);
    assert_int_equal(r->trigger.nth, 4);
    assert_int_equal(r->trigger.first, 10);
    assert_int_equal(r->trigger.after, 3);
    assert_int_equal(r->trigger.limit, 5);
    assert_int_equal(r->trigger.max_per_message, 2);
    assert_true(r->trigger.has_between);
    assert_int_equal(r->trigger.between_start_ms, 0);
    assert_int_equal(r->trigger.between_end_ms, 300000);
    rule_list_free(r);
    r = rule_of("rabbit", "redeliver", 1.0, "{\"between\":\"1m 2m\"}");
    assert_int_equal(r->trigger.between_start_ms, 60000);
    assert_int_equal(r->trigger.between_end_ms, 120000);
    rule_list_free(r);
}

/* toxicity: every matching event at 1, none at 0 (the rule starts disabled), else a coin. */
static void test_toxicity(void **state)
{
    struct rule *r;

    (void)state;
    want_text("rabbit", "drop", 0.25, NULL,
              "rule r on rabbit {\n  when ack\n  probability 25%\n  do drop\n}\n");
    want_text("rabbit", "drop", 0.0, NULL,
              "rule r on rabbit {\n  when ack\n  disabled\n  do drop\n}\n");
    r = rule_of("rabbit", "drop", 0.05, NULL);
    assert_true(r->trigger.has_probability);
    assert_true(r->trigger.probability == 0.05);
    rule_list_free(r);
    r = rule_of("rabbit", "drop", (double)0.1f, NULL); /* a client's float32 */
    assert_true(fabs(r->trigger.probability - 0.1) < 1e-7);
    rule_list_free(r);
    r = rule_of("rabbit", "drop", 0.0, NULL);
    assert_false(r->enabled);
    assert_false(r->trigger.has_probability);
    rule_list_free(r);
    r = rule_of("rabbit", "drop", 1e-6, NULL);
    assert_true(r->trigger.probability > 0.0);
    rule_list_free(r);
}

static void test_arguments(void **state)
{
    struct rule *r;

    (void)state;
    want_text("rabbit", "duplicate", 1.0, "{\"after\":2000}",
              "rule r on rabbit {\n  when deliver\n  do duplicate after 2000ms\n}\n");
    want_text("rabbit", "duplicate", 1.0, "{\"after\":0}",
              "rule r on rabbit {\n  when deliver\n  do duplicate\n}\n");
    want_text("rabbit", "redeliver", 1.0, "{\"after\":\"30s\"}",
              "rule r on rabbit {\n  when ack\n  do redeliver after 30s\n}\n");
    want_text("rabbit", "close", 1.0, "{\"at\":\"after\",\"event\":\"deliver\"}",
              "rule r on rabbit {\n  when deliver\n  do close after\n}\n");
    r = rule_of("rabbit", "redeliver", 1.0, "{\"after\":1500.0}");
    assert_int_equal(r->action.duration_ms, 1500);
    rule_list_free(r);
    r = rule_of("rabbit", "expire", 1.0, "{\"timeout\":\"3s\"}");
    assert_int_equal(r->action.duration_ms, 3000);
    rule_list_free(r);
    r = rule_of("rabbit", "delay", 1.0, "{\"delay\":86400000}");
    assert_int_equal(r->action.duration_ms, 86400000);
    rule_list_free(r);
    r = rule_of("rabbit", "error", 1.0, "{\"code\":\"320\",\"event\":\"ack\"}");
    assert_string_equal(r->action.error_code, "320");
    rule_list_free(r);
    r = rule_of("rabbit", "close", 1.0, "{\"at\":\"before\"}");
    assert_int_equal(r->action.close_when, RULE_CLOSE_BEFORE);
    rule_list_free(r);
}

/* `when`: the rule language's matchers, its first word maybe the event. */
static void test_when(void **state)
{
    struct rule *r;

    (void)state;
    want_text("rabbit", "duplicate", 1.0,
              "{\"when\":\"task!=keep.* body~\\\"refund due\\\"\",\"queue\":\"celery\"}",
              "rule r on rabbit {\n  when deliver queue=celery task!=keep.* body~\"refund due\"\n"
              "  do duplicate\n}\n");
    want_text("rabbit", "drop", 1.0, "{\"when\":\"  publish   queue=q \"}",
              "rule r on rabbit {\n  when publish queue=q\n  do drop\n}\n");
    want_text("rabbit", "drop", 1.0, "{\"when\":\"nack\",\"event\":\"nack\"}",
              "rule r on rabbit {\n  when nack\n  do drop\n}\n");
    want_text("rabbit", "drop", 1.0, "{\"when\":\"\"}",
              "rule r on rabbit {\n  when ack\n  do drop\n}\n");
    r = rule_of("rabbit", "duplicate", 1.0, "{\"when\":\"publish body~\\\"a;b {c} #d\\\"\"}");
    assert_int_equal(r->event, RULE_EV_PUBLISH);
    assert_int_equal(r->matchers[0].op, RULE_OP_CONTAINS);
    assert_string_equal(r->matchers[0].value, "a;b {c} #d");
    rule_list_free(r);
}

/* ---- wrong toxics ---- */

static void test_wrong_fields(void **state)
{
    char err[TOXIC_MSG_ERR_BYTES];
    json_t *arr = json_array();

    (void)state;
    static const struct {
        const char *name, *listener, *protocol, *type, *stream;
        double toxicity;
        const char *err;
    } cases[] = {
        {"r", "rabbit", "amqp", "dupicate", NULL, 1,
         "unknown message toxic type 'dupicate' (did you mean 'duplicate'?)"},
        {"r", "rabbit", "amqp", NULL, NULL, 1, "unknown message toxic type ''"},
        {"r", "raw", "tcp", "duplicate", NULL, 1,
         "toxic type duplicate needs a parsed proxy: this proxy's protocol is tcp, which carries "
         "opaque bytes (create the proxy with protocol amqp or resp)"},
        {"r", "raw", NULL, "drop", NULL, 1,
         "toxic type drop needs a parsed proxy: this proxy's protocol is tcp, which carries "
         "opaque bytes (create the proxy with protocol amqp or resp)"},
        {"a/b", "rabbit", "amqp", "drop", NULL, 1,
         "invalid rule name 'a/b': use 1 to 64 letters, digits, '_', '.' or '-'"},
        {"", "rabbit", "amqp", "drop", NULL, 1,
         "invalid rule name '': use 1 to 64 letters, digits, '_', '.' or '-'"},
        {"r", "x {", "amqp", "drop", NULL, 1,
         "invalid proxy name 'x {' for a message toxic: use 1 to 64 letters, digits, '_', '.' "
         "or '-'"},
        {"r", "rabbit", "amqp", "drop", "sideways", 1,
         "stream must be upstream or downstream, not 'sideways'"},
        {"r", "rabbit", "amqp", "drop", NULL, 1.5, "toxicity must be from 0 to 1, not 1.5"},
        {"r", "rabbit", "amqp", "drop", NULL, -0.1, "toxicity must be from 0 to 1, not -0.1"},
        {"r", "rabbit", "amqp", "drop", NULL, NAN, "toxicity must be from 0 to 1, not nan"},
        {"r", "rabbit", "amqp", "drop", NULL, 1e-12,
         "toxicity 1e-12 is too small (write 0 for none)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *t = toxic_msg_rule_text(cases[i].name, cases[i].listener, cases[i].protocol, NULL,
                                      cases[i].type, cases[i].stream, cases[i].toxicity, NULL, err,
                                      sizeof(err));
        if (t != NULL || strcmp(err, cases[i].err) != 0) {
            fprintf(stderr, "case #%zu: want %s\n got %s\n", i, cases[i].err, t ? t : err);
            fail();
        }
    }
    /* both streams, in any case as Toxiproxy takes them, and none are accepted, and change
     * nothing */
    static const char *const streams[] = {"upstream",   "downstream", "UPSTREAM",
                                          "Downstream", "",           NULL};
    for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
        char *t = toxic_msg_rule_text("r", "rabbit", "amqp", NULL, "drop", streams[i], 1.0, NULL,
                                      err, sizeof(err));
        assert_non_null(t);
        assert_string_equal(t, "rule r on rabbit {\n  when ack\n  do drop\n}\n");
        free(t);
    }
    assert_null(
        toxic_msg_rule_text("r", "rabbit", "amqp", NULL, "drop", NULL, 1.0, arr, err, sizeof(err)));
    assert_string_equal(err, "attributes must be a JSON object, not an array");
    json_decref(arr);
    /* a short buffer is cut, never overrun */
    assert_null(toxic_msg_rule_text("r", "rabbit", "amqp", NULL, "drop", "x", 1.0, NULL, err, 8));
    assert_string_equal(err, "stream ");
    assert_null(toxic_msg_rule_text("r", "rabbit", "amqp", NULL, "drop", "x", 1.0, NULL, err, 0));
}

static void test_wrong_attributes(void **state)
{
    static const struct {
        const char *type, *attrs, *err;
    } cases[] = {
        {"duplicate", "{\"evry\":2}",
         "unknown attribute 'evry' of toxic type duplicate (did you mean 'every'?)"},
        {"duplicate", "{\"colour\":\"red\"}", "unknown attribute 'colour' of toxic type duplicate"},
        {"duplicate", "{\"probability\":0.5}",
         "toxic type duplicate has no attribute 'probability': the toxic's toxicity is the "
         "probability (0.05 is 5% of the events)"},
        {"duplicate", "{\"timeout\":1}",
         "toxic type duplicate has no attribute 'timeout' (its argument is 'after')"},
        {"drop", "{\"after\":1}", "toxic type drop has no attribute 'after'"},
        {"expire", "{}",
         "toxic type expire needs the attribute 'timeout' (a duration, e.g. 3000 (ms) or \"3s\")"},
        {"delay", NULL,
         "toxic type delay needs the attribute 'delay' (a duration, e.g. 3000 (ms) or \"3s\")"},
        {"error", "{}",
         "toxic type error needs the attribute 'code' (an error code, e.g. 406 or \"READONLY\")"},
        {"event", "{}", "unknown message toxic type 'event'"},
        {"duplicate", "{\"event\":\"delivr\"}",
         "attribute 'event' 'delivr' is not an event (deliver, ack, nack, publish, confirm, "
         "command, lease or connect) (did you mean 'deliver'?)"},
        {"duplicate", "{\"event\":3}", "attribute 'event' is a string, not 3"},
        {"duplicate", "{\"when\":[\"task=x\"]}",
         "attribute 'when' is a string of matchers, not an array"},
        {"duplicate", "{\"when\":\"delivr task=x\"}",
         "the first word of attribute 'when', 'delivr' is not an event (deliver, ack, nack, "
         "publish, confirm, command, lease or connect) (did you mean 'deliver'?)"},
        {"duplicate", "{\"when\":\"publish\",\"event\":\"deliver\"}",
         "attribute 'event' says deliver and attribute 'when' says publish: give one"},
        {"duplicate", "{\"when\":\"task=x }\\nrule b on rabbit {\"}",
         "attribute 'when' holds '}' outside a string: it takes matchers only, like "
         "\"task=tasks.charge queue!=celery body~\\\"refund due\\\"\""},
        {"duplicate", "{\"when\":\"task=x\\n do drop\"}",
         "attribute 'when' holds a control character (byte 0x0a)"},
        {"duplicate", "{\"when\":\"task=x; do drop\"}",
         "attribute 'when' holds ';' outside a string: it takes matchers only, like "
         "\"task=tasks.charge queue!=celery body~\\\"refund due\\\"\""},
        {"duplicate", "{\"when\":\"task=x # c\"}",
         "attribute 'when' holds '#' outside a string: it takes matchers only, like "
         "\"task=tasks.charge queue!=celery body~\\\"refund due\\\"\""},
        {"duplicate", "{\"when\":\"body~\\\"x\\\\\\n\\\"\"}",
         "attribute 'when' holds a control character (byte 0x0a)"},
        {"duplicate", "{\"when\":\"body~\\\"open\"}",
         "attribute 'when' has a string that is not closed"},
        {"duplicate", "{\"task\":true}",
         "attribute 'task' is a string (a glob: * and ? match), not true"},
        {"duplicate", "{\"queue\":{}}",
         "attribute 'queue' is a string (a glob: * and ? match), not an object"},
        {"duplicate", "{\"queue\":1.5}",
         "attribute 'queue' is a string (a glob: * and ? match), not 1.5"},
        {"duplicate", "{\"redelivered\":\"yes\"}",
         "attribute 'redelivered' is true or false, not \"yes\""},
        {"duplicate", "{\"task\":\"a\\rb\"}",
         "attribute 'task' holds a control character (byte 0x0d)"},
        {"duplicate", "{\"header.\":\"1\"}",
         "attribute 'header.' needs a header name of letters, digits, '_', '.' or '-' after "
         "'header.'"},
        {"duplicate", "{\"header.a b\":\"1\"}",
         "attribute 'header.a b' needs a header name of letters, digits, '_', '.' or '-' after "
         "'header.'"},
        {"duplicate", "{\"every\":0}", "attribute 'every' is a whole number from 1, not 0"},
        {"duplicate", "{\"nth\":-2}", "attribute 'nth' is a whole number from 1, not -2"},
        {"duplicate", "{\"first\":2.5}", "attribute 'first' is a whole number from 1, not 2.5"},
        {"duplicate", "{\"limit\":\"3\"}", "attribute 'limit' is a whole number from 1, not \"3\""},
        {"duplicate", "{\"after_first\":null}",
         "attribute 'after_first' is a whole number from 1, not null"},
        {"duplicate", "{\"max_per_message\":false}",
         "attribute 'max_per_message' is a whole number from 1, not false"},
        {"duplicate", "{\"between\":[\"1s\"]}",
         "attribute 'between' is a window since twice started: [\"30s\", \"5m\"], [30000, "
         "300000] (milliseconds) or \"30s 5m\", not an array"},
        {"duplicate", "{\"between\":\"1s\"}",
         "attribute 'between' is a window since twice started: [\"30s\", \"5m\"], [30000, "
         "300000] (milliseconds) or \"30s 5m\", not \"1s\""},
        {"duplicate", "{\"between\":\"1s 2m;\"}",
         "attribute 'between' is a window since twice started: [\"30s\", \"5m\"], [30000, "
         "300000] (milliseconds) or \"30s 5m\", not \"1s 2m;\""},
        {"duplicate", "{\"between\":[\"1s\",true]}",
         "attribute 'between' is a duration: milliseconds (3000) or a string like \"3s\" or "
         "\"250ms\", not true"},
        {"duplicate", "{\"after\":\"2 s\"}",
         "attribute 'after' is a duration: milliseconds (3000) or a string like \"3s\" or "
         "\"250ms\", not \"2 s\""},
        {"duplicate", "{\"after\":-5}",
         "attribute 'after' is a duration: milliseconds (3000) or a string like \"3s\" or "
         "\"250ms\", not -5"},
        {"delay", "{\"delay\":86400001}",
         "attribute 'delay' is too large: 86400001 ms (at most 24h, 86400000 ms)"},
        {"expire", "{\"timeout\":0}", "attribute 'timeout' must be more than 0 ms"},
        {"error", "{\"code\":\"NO WAY\"}",
         "attribute 'code' is an error code: an AMQP code like 406 or a Redis error like "
         "\"READONLY\", not \"NO WAY\""},
        {"error", "{\"code\":-1}",
         "attribute 'code' is an error code: an AMQP code like 406 or a Redis error like "
         "\"READONLY\", not -1"},
        {"close", "{\"at\":\"during\"}",
         "attribute 'at' is \"before\" (the frame is not forwarded) or \"after\" (it is), not "
         "\"during\""},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        want_err("rabbit", cases[i].type, 1.0, cases[i].attrs, cases[i].err);
    }
}

/* What only the rule checker knows comes back in its words, without a line and column. */
static void test_checker_errors(void **state)
{
    (void)state;
    rule_err("rabbit", "redeliver", "{\"event\":\"deliver\"}",
             "listener 'rabbit' (protocol amqp) cannot do 'redeliver' on 'deliver' events: "
             "redeliver loses an ack after the work was done: use it on 'ack' (it can do: "
             "duplicate, expire, delay, drop, close, error)");
    rule_err("jobs", "expire", "{\"timeout\":1000}",
             "listener 'jobs' (protocol resp/celery) cannot do 'expire' on 'deliver' events: Redis "
             "job queues have no per-delivery timer to imitate: use 'redeliver' on 'ack', or "
             "'delay' past the visibility timeout (it can do: duplicate, delay, drop, close)");
    rule_err("cache", "duplicate", NULL,
             "listener 'cache' (protocol resp) cannot do 'duplicate' on 'command' events: it "
             "sends a job twice: use it on 'deliver' (a second worker gets it) or 'publish' "
             "(Redis gets the push twice) (it can do: delay, drop, close, error)");
    rule_err("rabbit", "delay", "{\"delay\":\"3x\"}",
             "unknown unit 'x' in duration '3x' (use ms, s, m or h)");
    rule_err("rabbit", "drop", "{\"every\":1000000000001}",
             "'every' must be from 1 to 1000000000000, not 1000000000001");
    rule_err("rabbit", "drop", "{\"when\":\"queue\"}",
             "the first word of attribute 'when', 'queue' is not an event (deliver, ack, nack, "
             "publish, confirm, command, lease or connect)");
    rule_err("rabbit", "drop", "{\"command\":\"GET\"}",
             "'command' cannot be matched on 'ack' events of listener 'rabbit' (protocol amqp) "
             "(it can match: queue, exchange, routing_key, consumer_tag, message_id, task, client, "
             "redelivered)");
    rule_err("raw", "drop", NULL,
             "toxic type drop needs a parsed proxy: this proxy's protocol is tcp, which carries "
             "opaque bytes (create the proxy with protocol amqp or resp)");
    rule_err("nowhere", "drop", NULL, "no proxy 'nowhere'");
}

struct oom_case {
    json_t *attrs;
};

static void duplicate_rule_failing(void *ctx, long nth)
{
    const struct oom_case *o = ctx;
    char err[TOXIC_MSG_ERR_BYTES];
    (void)nth;
    struct rule *r =
        toxic_msg_rule(base, "r", "rabbit", "duplicate", NULL, 0.5, o->attrs, err, sizeof(err));
    if (kit_failed()) {
        assert_null(r);
        assert_string_equal(err, "out of memory");
    } else {
        assert_non_null(r);
    }
    rule_list_free(r);
}

/* Every allocation may fail: the answer is then "out of memory", and nothing leaks. */
static void test_out_of_memory(void **state)
{
    struct oom_case o = {
        attrs_of("{\"task\":\"a b\",\"when\":\"queue!=x\",\"every\":2,\"after\":\"2s\"}")};

    (void)state;
    assert_true(kit_each_allocation_fails(&kit_conf_mem_hook, duplicate_rule_failing, &o) > 0);
    json_decref(o.attrs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_message),
        cmocka_unit_test(test_types_amqp),
        cmocka_unit_test(test_types_resp),
        cmocka_unit_test(test_matchers),
        cmocka_unit_test(test_values_quoted),
        cmocka_unit_test(test_triggers),
        cmocka_unit_test(test_toxicity),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_when),
        cmocka_unit_test(test_wrong_fields),
        cmocka_unit_test(test_wrong_attributes),
        cmocka_unit_test(test_checker_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
