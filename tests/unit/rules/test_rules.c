/*
 * test_rules.c - unit tests of the rule language: `rule` blocks, the globals
 * of the rule engine (seed, journal, admin, admin-token) and
 * conf_parse_rules (rules/conf.h, rules/rule.h).
 *
 * Every valid form is parsed and read back from struct rule; every mistake a
 * user can make is provoked and its exact message, position and hint
 * asserted.  The checker must take everything protocol-specific from the
 * codec tables (rules/caps.h), so this test replaces the registry: tcp
 * listeners get the real table of rules/caps_tcp.c, resp listeners a narrow one
 * with no reasons, and amqp listeners a codec that can do everything, so the
 * language tests are not limited by any codec; the tests of the amqp table
 * (test_caps_amqp_*) switch amqp listeners to the real table of
 * rules/caps_amqp.c, as rules/caps_registry.c does.  Garbage
 * and allocation-failure runs check that nothing crashes or leaks (run under
 * valgrind or ASan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "rules/caps.h"
#include "rules/conf.h"
#include "rules/conf_mem.h"
#include "rules/plan.h"
#include "rules/rule.h"
#include "tests/lib/conf_testkit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a registry of test codecs ---- */

extern const struct proto_caps proto_tcp_caps;
extern const struct proto_caps proto_amqp_caps;

#define ALL_FIELDS ((1u << RULE_F_COUNT) - 1)
#define ALL_ACTIONS ((1u << RULE_ACT_COUNT) - 1)

static const struct proto_caps everything_caps = {
    .name = "everything",
    .events = (1u << RULE_EV_COUNT) - 1,
    .matchers = {ALL_FIELDS, ALL_FIELDS, ALL_FIELDS, ALL_FIELDS, ALL_FIELDS, ALL_FIELDS, ALL_FIELDS,
                 ALL_FIELDS},
    .actions = {ALL_ACTIONS, ALL_ACTIONS, ALL_ACTIONS, ALL_ACTIONS, ALL_ACTIONS, ALL_ACTIONS,
                ALL_ACTIONS, ALL_ACTIONS},
    .why_not = NULL,
};

static const struct proto_caps narrow_caps = {
    .name = "narrow",
    .events = CAPS_BIT(RULE_EV_STREAM) | CAPS_BIT(RULE_EV_DELIVER),
    .matchers = {[RULE_EV_DELIVER] = CAPS_BIT(RULE_F_QUEUE)},
    .actions = {[RULE_EV_STREAM] = CAPS_BIT(RULE_ACT_LATENCY),
                [RULE_EV_DELIVER] = CAPS_BIT(RULE_ACT_DUPLICATE)},
    .why_not = NULL,
};

/* The profile of the last resp listener looked up. */
static char last_profile[16];

/* What amqp listeners get: the everything codec, or the real table while a
 * test set up by use_real_amqp runs. */
static const struct proto_caps *amqp_caps = &everything_caps;

static int use_real_amqp(void **state)
{
    (void)state;
    amqp_caps = &proto_amqp_caps;
    return 0;
}

/* A teardown, so that a failed test does not leave the real table in place. */
static int use_everything_amqp(void **state)
{
    (void)state;
    amqp_caps = &everything_caps;
    return 0;
}

/* Whether resp listeners get the real tables of rules/caps_resp.c. */
static bool real_resp;
const struct proto_caps *proto_resp_caps_find(const char *profile);

static int use_real_resp(void **state)
{
    (void)state;
    real_resp = true;
    return 0;
}

static int use_narrow_resp(void **state)
{
    (void)state;
    real_resp = false;
    return 0;
}

/* Replaces rules/caps_registry.c for this test (the linker then leaves it out). */
const struct proto_caps *proto_caps_find(enum conf_protocol protocol, const char *profile)
{
    switch (protocol) {
    case CONF_PROTO_AMQP:
        return amqp_caps;
    case CONF_PROTO_RESP:
        snprintf(last_profile, sizeof(last_profile), "%s", profile != NULL ? profile : "(none)");
        return real_resp ? proto_resp_caps_find(profile) : &narrow_caps;
    default:
        return &proto_tcp_caps;
    }
}

/* ---- expectations ---- */

/* Line 1 of most tests: one listener of each test codec. */
#define TCP "listen t { protocol tcp; bind 127.0.0.1:1; upstream 127.0.0.1:2 }\n"
#define MQ "listen mq { protocol amqp; bind 127.0.0.1:3; upstream 127.0.0.1:4 }\n"
#define NARROW "listen n { protocol resp; profile rq; bind 127.0.0.1:5; upstream 127.0.0.1:6 }\n"

/* The hint of a rule without `do` on listener t: what a tcp listener can do on the stream. */
#define TCP_NO_DO                                                                                  \
    "e.g. do latency DURATION; listener 't' (protocol tcp) can do on the byte stream: latency, "   \
    "bandwidth, slice, reset, blackhole, slow-close, limit"

/* A rule on line 2 whose block is line 3, starting at column 5. */
#define TCP_RULE(body) TCP "rule r on t {\n    " body "\n}\n"
#define MQ_RULE(body) MQ "rule r on mq {\n    " body "\n}\n"

/* The rule called `name`, which must exist. */
static const struct rule *find_rule(const struct conf *c, const char *name)
{
    for (const struct rule *r = c->rules; r != NULL; r = r->next) {
        if (strcmp(r->name, name) == 0) {
            return r;
        }
    }
    fail_msg("no rule '%s'", name);
    return NULL;
}

/* ---- names ---- */

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(rule_event_name(RULE_EV_STREAM), "stream");
    assert_string_equal(rule_event_name(RULE_EV_COMMAND), "command");
    assert_string_equal(rule_event_name(RULE_EV_COUNT), "unknown");
    assert_string_equal(rule_field_name(RULE_F_ROUTING_KEY), "routing_key");
    assert_string_equal(rule_field_name(RULE_F_KEY), "key");
    assert_string_equal(rule_field_name(RULE_F_COUNT), "unknown");
    assert_string_equal(rule_action_name(RULE_ACT_SLOW_CLOSE), "slow-close");
    assert_string_equal(rule_action_name(RULE_ACT_REDELIVER), "redeliver");
    assert_string_equal(rule_action_name(RULE_ACT_COUNT), "unknown");
    for (int k = 0; k < RULE_ACT_COUNT; k++) {
        /* the stream actions are exactly the second group, latency onwards */
        assert_int_equal(rule_action_is_stream((enum rule_action_kind)k), k >= RULE_ACT_LATENCY);
    }
    assert_false(rule_action_is_stream(RULE_ACT_COUNT));
}

/* ---- globals ---- */

static void test_globals(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    c = parse_ok("seed 18446744073709551615\n"
                 "journal \"/var/lib/twice/a journal.pb\"\n"
                 "admin 0.0.0.0:8474\n"
                 "admin-token 0123456789abcdef\n" TCP,
                 &d);
    assert_true(c->has_seed);
    assert_true(c->seed == UINT64_MAX);
    assert_string_equal(c->journal, "/var/lib/twice/a journal.pb");
    assert_true(c->has_admin);
    assert_string_equal(c->admin.host, "0.0.0.0");
    assert_int_equal(c->admin.port, 8474);
    assert_int_equal(c->admin.loc.line, 3);
    assert_int_equal(c->admin.loc.col, 7);
    assert_string_equal(c->admin_token, "0123456789abcdef");
    assert_int_equal(c->n_rules, 0);
    assert_null(c->rules);
    conf_free(c);
    conf_diags_free(&d);

    /* defaults */
    c = parse_ok(TCP, &d);
    assert_false(c->has_seed);
    assert_false(c->has_admin);
    assert_null(c->journal);
    assert_null(c->admin_token);
    conf_free(c);
    conf_diags_free(&d);

    /* every loopback address needs no token */
    c = parse_ok("seed 0\nadmin [::1]:8474\n" TCP, &d);
    assert_true(c->has_seed);
    assert_true(c->seed == 0);
    assert_string_equal(c->admin.host, "::1");
    conf_free(c);
    conf_diags_free(&d);
    EXPECT_CLEAN("admin localhost:8474\n" TCP);
    EXPECT_CLEAN("admin 127.9.8.7:8474\n" TCP);
    EXPECT_CLEAN("admin [::ffff:127.0.0.1]:8474\n" TCP);
}

static void test_global_errors(void **state)
{
    (void)state;
    EXPECT("seed 18446744073709551616\n" TCP, -1,
           EH(1, 6, "invalid seed '18446744073709551616'",
              "a whole number from 0 to 18446744073709551615"));
    EXPECT("seed -1\nseed 2\n" TCP, -1,
           EH(1, 6, "invalid seed '-1'", "a whole number from 0 to 18446744073709551615"),
           EH(2, 1, "duplicate 'seed'", "first set at 1:1"));
    EXPECT("seed\n" TCP, -1, E(1, 1, "'seed' takes one argument: N"));
    EXPECT("journal \"\"\n" TCP, -1, E(1, 9, "'journal' needs a file path"));
    EXPECT("journal a b\n" TCP, -1,
           EH(1, 11, "unknown journal mode 'b'", "new, append or overwrite"));
    EXPECT("journal a append b\n" TCP, -1,
           EH(1, 18, "'journal' takes a file path and, optionally, new, append or overwrite",
              "journal PATH, or journal PATH append, or journal PATH overwrite"));
    EXPECT("admin 8474\n" TCP, -1, E(1, 7, "'admin' needs HOST:PORT, e.g. 127.0.0.1:8474"));
    EXPECT("admin [::1]\n" TCP, -1, E(1, 7, "'admin' needs HOST:PORT, e.g. 127.0.0.1:8474"));
    EXPECT("admin 127.0.0.1:0\n" TCP, -1, E(1, 7, "invalid port '0' (1-65535)"));
    EXPECT("admin 0.0.0.0:8474\n" TCP, -1,
           E(1, 7, "admin API on 0.0.0.0:8474 is reachable from the network: set admin-token"));
    EXPECT(
        "admin [2001:db8::1]:8474\n" TCP, -1,
        E(1, 7, "admin API on [2001:db8::1]:8474 is reachable from the network: set admin-token"));
    EXPECT("admin 127.0.0.1:1\n" TCP, -1,
           E(1, 7, "admin API on 127.0.0.1:1, already bound by listener 't' at 2:31"));
    EXPECT("admin-token 0123456789abcdef\n" TCP, 0,
           W(1, 1, "admin-token has no effect without admin"));
    /* a bad token is reported once, not again as a missing one */
    EXPECT("admin *:8474\nadmin-token short\n" TCP, -1,
           EH(2, 13, "admin-token must be 16 to 256 characters long, not 5",
              "e.g. the output of: openssl rand -hex 24"));
    EXPECT("admin 127.0.0.1:8474\nadmin-token \"0123456789 abcdef\"\n" TCP, -1,
           E(2, 13, "admin-token must be printable ASCII with no blanks"));
    EXPECT("admin 127.0.0.1:8474 { }\n" TCP, -1, E(1, 22, "'admin' does not take a block"));
}

/* ---- valid rules, read back ---- */

static void test_rule_defaults(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(TCP "rule plain on t {\n    do blackhole\n}\n", &d);
    const struct rule *r = c->rules;

    (void)state;
    assert_int_equal(c->n_rules, 1);
    assert_string_equal(r->name, "plain");
    assert_string_equal(r->listener, "t");
    assert_int_equal(r->loc.line, 2);
    assert_int_equal(r->loc.col, 1);
    assert_int_equal(r->event, RULE_EV_STREAM);
    assert_int_equal(r->n_matchers, 0);
    assert_null(r->matchers);
    assert_int_equal(r->action.kind, RULE_ACT_BLACKHOLE);
    assert_int_equal(r->action.loc.line, 3);
    assert_int_equal(r->action.loc.col, 8);
    assert_int_equal(r->direction, RULE_DIR_BOTH);
    assert_true(r->enabled);
    assert_false(r->trigger.has_probability);
    assert_false(r->trigger.has_between);
    assert_true(r->trigger.every == 0 && r->trigger.nth == 0 && r->trigger.first == 0);
    assert_true(r->trigger.after == 0 && r->trigger.limit == 0);
    assert_int_equal(r->trigger.max_per_message, 1);
    assert_null(r->next);
    conf_free(c);
    conf_diags_free(&d);
}

static const char *const stream_rules =
    TCP "rule lat on t { do latency 20ms jitter 5ms; stream downstream }\n"
        "rule lat2 on t { do latency 1s; stream upstream }\n"
        "rule bw on t { do bandwidth 100KB/s; stream both }\n"
        "rule slice on t { do slice 64KB delay 10ms }\n"
        "rule slice0 on t { do slice 1B delay 0ms }\n"
        "rule slice1 on t { do slice 3KiB }\n"
        "rule reset on t { do reset }\n"
        "rule reset2 on t { do reset after 2s }\n"
        "rule reset0 on t { do reset after 0s }\n"
        "rule hole on t { do blackhole; disabled }\n"
        "rule sc on t { do slow-close 3s }\n"
        "rule lim on t { do limit 2GB }\n";

static void test_stream_actions(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(stream_rules, &d);
    const struct rule *r;

    (void)state;
    assert_int_equal(c->n_rules, 12);
    r = find_rule(c, "lat");
    assert_int_equal(r->action.kind, RULE_ACT_LATENCY);
    assert_int_equal(r->action.duration_ms, 20);
    assert_int_equal(r->action.jitter_ms, 5);
    assert_int_equal(r->direction, RULE_DIR_DOWNSTREAM);
    r = find_rule(c, "lat2");
    assert_int_equal(r->action.duration_ms, 1000);
    assert_int_equal(r->action.jitter_ms, 0);
    assert_int_equal(r->direction, RULE_DIR_UPSTREAM);
    r = find_rule(c, "bw");
    assert_int_equal(r->action.kind, RULE_ACT_BANDWIDTH);
    assert_true(r->action.bytes == 100000);
    assert_int_equal(r->direction, RULE_DIR_BOTH);
    r = find_rule(c, "slice");
    assert_int_equal(r->action.kind, RULE_ACT_SLICE);
    assert_true(r->action.bytes == 64000);
    assert_int_equal(r->action.slice_delay_ms, 10);
    r = find_rule(c, "slice0");
    assert_true(r->action.bytes == 1);
    assert_int_equal(r->action.slice_delay_ms, 0);
    assert_true(find_rule(c, "slice1")->action.bytes == 3072);
    r = find_rule(c, "reset");
    assert_int_equal(r->action.kind, RULE_ACT_RESET);
    assert_int_equal(r->action.duration_ms, 0);
    assert_int_equal(find_rule(c, "reset2")->action.duration_ms, 2000);
    assert_int_equal(find_rule(c, "reset0")->action.duration_ms, 0);
    r = find_rule(c, "hole");
    assert_int_equal(r->action.kind, RULE_ACT_BLACKHOLE);
    assert_false(r->enabled);
    r = find_rule(c, "sc");
    assert_int_equal(r->action.kind, RULE_ACT_SLOW_CLOSE);
    assert_int_equal(r->action.duration_ms, 3000);
    r = find_rule(c, "lim");
    assert_int_equal(r->action.kind, RULE_ACT_LIMIT);
    assert_true(r->action.bytes == 2000000000ull);
    /* file order */
    assert_string_equal(c->rules->name, "lat");
    assert_string_equal(c->rules->next->name, "lat2");
    conf_free(c);
    conf_diags_free(&d);
}

/* Every byte unit, as a rate and as a size. */
static void test_byte_units(void **state)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"5B", 5},
        {"3KB", 3000},
        {"2MB", 2000000},
        {"1GB", 1000000000},
        {"3KiB", 3072},
        {"1MiB", 1048576},
        {"2GiB", 2147483648ull},
        {"1024GiB", 1099511627776ull},
        {"1000000000000B", 1000000000000ull},
    };
    char text[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct conf_diags d;
        snprintf(text, sizeof(text),
                 TCP "rule a on t { do bandwidth %s }\nrule b on t { do bandwidth %s/s }\n"
                     "rule c on t { do limit %s }\n",
                 cases[i].text, cases[i].text, cases[i].text);
        struct conf *c = parse_ok(text, &d);
        assert_true(find_rule(c, "a")->action.bytes == cases[i].bytes);
        assert_true(find_rule(c, "b")->action.bytes == cases[i].bytes);
        assert_true(find_rule(c, "c")->action.bytes == cases[i].bytes);
        conf_free(c);
        conf_diags_free(&d);
    }
}

static void assert_cidr(const struct rule_matcher *m, const uint8_t want[16], unsigned prefix)
{
    assert_memory_equal(m->cidr_addr, want, 16);
    assert_int_equal(m->cidr_prefix, prefix);
    assert_false(m->is_glob);
}

static void test_connect_rules(void **state)
{
    static const uint8_t net10[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0};
    static const uint8_t host[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7};
    static const uint8_t any4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
    static const uint8_t lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const uint8_t doc6[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    struct conf_diags d;
    struct conf *c =
        parse_ok(TCP "rule c1 on t {\n"
                     "    when connect client=10.0.0.0/8 client!=::1\n"
                     "    do close before\n"
                     "}\n"
                     "rule c2 on t { when connect client=192.168.1.7; do close after }\n"
                     "rule c3 on t { when connect client=\"2001:db8::/32\" "
                     "client=0.0.0.0/0; do delay 2s }\n"
                     "rule c4 on t { when connect; do latency 1ms; stream upstream }\n",
                 &d);
    const struct rule *r = find_rule(c, "c1");

    (void)state;
    assert_int_equal(r->event, RULE_EV_CONNECT);
    assert_int_equal(r->n_matchers, 2);
    assert_int_equal(r->matchers[0].field, RULE_F_CLIENT);
    assert_int_equal(r->matchers[0].op, RULE_OP_EQ);
    assert_string_equal(r->matchers[0].value, "10.0.0.0/8");
    assert_int_equal(r->matchers[0].loc.line, 3);
    assert_int_equal(r->matchers[0].loc.col, 18);
    assert_cidr(&r->matchers[0], net10, 8 + 96);
    assert_int_equal(r->matchers[1].op, RULE_OP_NE);
    assert_cidr(&r->matchers[1], lo6, 128);
    assert_int_equal(r->action.kind, RULE_ACT_CLOSE);
    assert_int_equal(r->action.close_when, RULE_CLOSE_BEFORE);
    r = find_rule(c, "c2");
    assert_cidr(&r->matchers[0], host, 128);
    assert_int_equal(r->action.close_when, RULE_CLOSE_AFTER);
    r = find_rule(c, "c3");
    assert_string_equal(r->matchers[0].value, "2001:db8::/32");
    assert_cidr(&r->matchers[0], doc6, 32);
    assert_cidr(&r->matchers[1], any4, 96);
    assert_int_equal(r->action.kind, RULE_ACT_DELAY);
    assert_int_equal(r->action.duration_ms, 2000);
    r = find_rule(c, "c4");
    assert_int_equal(r->event, RULE_EV_CONNECT);
    assert_int_equal(r->n_matchers, 0);
    assert_int_equal(r->direction, RULE_DIR_UPSTREAM);
    conf_free(c);
    conf_diags_free(&d);
}

static const char *const message_rules =
    MQ "# Crash between work and ack: the card was charged, the ack never arrived.\n" /* 2 */
       "rule lost-ack on mq {\n"                                                      /* 3 */
       "    when ack queue=payments task=billing.charge\n"                            /* 4 */
       "    every 10\n"                                                               /* 5 */
       "    do redeliver\n"                                                           /* 6 */
       "}\n"                                                                          /* 7 */
       "rule double on mq {\n"                                                        /* 8 */
       "    when deliver queue!=emails body~\"refund due\" task=\"a b\" "
       "header.x-retry=1* message_id=id-?\n" /* 9 */
       "    probability 2%\n"
       "    nth 3\n"
       "    first 5\n"
       "    after 7\n"
       "    limit 9\n"
       "    between 0s 10m\n"
       "    max-per-message 3\n"
       "    do duplicate\n"
       "}\n"
       "rule n on mq { when nack redelivered=true; do drop }\n"
       "rule p on mq { when publish exchange=ex routing_key=rk.* consumer_tag=c; do error 406 }\n"
       "rule cf on mq { when confirm redelivered!=false; do expire 30s }\n"
       "rule cmd on mq { when command command=BRPOP key~queue: key=queue:*; do error -320 }\n"
       "rule slow on mq { when ack; do delay 45s }\n"
       "rule empty on mq { when ack queue=\"\"; do error 404 }\n"
       "rule glue on mq { when ack queue=a\"b c\"d; do close after }\n"
       "rule conn on mq { when connect; do close before }\n";

static void assert_matcher(const struct rule_matcher *m, enum rule_field field,
                           enum rule_match_op op, const char *value, bool glob)
{
    assert_int_equal(m->field, field);
    assert_int_equal(m->op, op);
    assert_string_equal(m->value, value);
    assert_int_equal(m->is_glob, glob);
    if (field != RULE_F_HEADER) {
        assert_null(m->header);
    }
}

static void test_message_rules(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(message_rules, &d);
    const struct rule *r = find_rule(c, "lost-ack");

    (void)state;
    assert_int_equal(c->n_rules, 10);
    assert_int_equal(r->loc.line, 3);
    assert_int_equal(r->event, RULE_EV_ACK);
    assert_int_equal(r->n_matchers, 2);
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "payments", false);
    assert_matcher(&r->matchers[1], RULE_F_TASK, RULE_OP_EQ, "billing.charge", false);
    assert_true(r->trigger.every == 10);
    assert_int_equal(r->action.kind, RULE_ACT_REDELIVER);
    assert_int_equal(r->action.loc.line, 6);
    assert_int_equal(r->action.loc.col, 8);

    r = find_rule(c, "double");
    assert_int_equal(r->event, RULE_EV_DELIVER);
    assert_int_equal(r->n_matchers, 5);
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_NE, "emails", false);
    assert_matcher(&r->matchers[1], RULE_F_BODY, RULE_OP_CONTAINS, "refund due", false);
    assert_int_equal(r->matchers[1].loc.line, 9);
    assert_int_equal(r->matchers[1].loc.col, 32);
    assert_matcher(&r->matchers[2], RULE_F_TASK, RULE_OP_EQ, "a b", false);
    assert_matcher(&r->matchers[3], RULE_F_HEADER, RULE_OP_EQ, "1*", true);
    assert_string_equal(r->matchers[3].header, "x-retry");
    assert_matcher(&r->matchers[4], RULE_F_MESSAGE_ID, RULE_OP_EQ, "id-?", true);
    assert_true(r->trigger.has_probability);
    assert_true(r->trigger.probability == 0.02);
    assert_true(r->trigger.nth == 3 && r->trigger.first == 5 && r->trigger.after == 7);
    assert_true(r->trigger.limit == 9);
    assert_true(r->trigger.has_between);
    assert_int_equal(r->trigger.between_start_ms, 0);
    assert_int_equal(r->trigger.between_end_ms, 600000);
    assert_int_equal(r->trigger.max_per_message, 3);
    assert_int_equal(r->action.kind, RULE_ACT_DUPLICATE);

    r = find_rule(c, "n");
    assert_int_equal(r->event, RULE_EV_NACK);
    assert_matcher(&r->matchers[0], RULE_F_REDELIVERED, RULE_OP_EQ, "true", false);
    assert_true(r->matchers[0].bool_value);
    assert_int_equal(r->action.kind, RULE_ACT_DROP);

    r = find_rule(c, "p");
    assert_int_equal(r->event, RULE_EV_PUBLISH);
    assert_matcher(&r->matchers[0], RULE_F_EXCHANGE, RULE_OP_EQ, "ex", false);
    assert_matcher(&r->matchers[1], RULE_F_ROUTING_KEY, RULE_OP_EQ, "rk.*", true);
    assert_matcher(&r->matchers[2], RULE_F_CONSUMER_TAG, RULE_OP_EQ, "c", false);
    assert_int_equal(r->action.kind, RULE_ACT_ERROR);
    assert_string_equal(r->action.error_code, "406");
    conf_free(c);
    conf_diags_free(&d);
}

static void test_message_rules_more(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(message_rules, &d);
    const struct rule *r = find_rule(c, "cf");

    (void)state;
    assert_int_equal(r->event, RULE_EV_CONFIRM);
    assert_matcher(&r->matchers[0], RULE_F_REDELIVERED, RULE_OP_NE, "false", false);
    assert_false(r->matchers[0].bool_value);
    assert_int_equal(r->action.kind, RULE_ACT_EXPIRE);
    assert_int_equal(r->action.duration_ms, 30000);

    r = find_rule(c, "cmd");
    assert_int_equal(r->event, RULE_EV_COMMAND);
    assert_matcher(&r->matchers[0], RULE_F_COMMAND, RULE_OP_EQ, "BRPOP", false);
    assert_matcher(&r->matchers[1], RULE_F_KEY, RULE_OP_CONTAINS, "queue:", false);
    assert_matcher(&r->matchers[2], RULE_F_KEY, RULE_OP_EQ, "queue:*", true);
    assert_string_equal(r->action.error_code, "-320"); /* kept as written */

    r = find_rule(c, "slow");
    assert_int_equal(r->n_matchers, 0);
    assert_int_equal(r->action.kind, RULE_ACT_DELAY);
    assert_int_equal(r->action.duration_ms, 45000);

    r = find_rule(c, "empty");
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "", false);
    assert_string_equal(r->action.error_code, "404");

    /* a quoted piece glued inside a value: shell-like concatenation */
    r = find_rule(c, "glue");
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "ab cd", false);
    assert_int_equal(r->action.close_when, RULE_CLOSE_AFTER);
    assert_int_equal(find_rule(c, "conn")->event, RULE_EV_CONNECT);
    conf_free(c);
    conf_diags_free(&d);
}

static void test_probability_forms(void **state)
{
    static const struct {
        const char *text;
        double p;
    } cases[] = {
        {"5%", 0.05},    {"12.5%", 0.125}, {"0.05", 0.05},         {"100%", 1.0},      {"1", 1.0},
        {"0.5%", 0.005}, {".5", 0.5},      {"0.000001", 0.000001}, {"99.99%", 0.9999},
    };
    char text[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct conf_diags d;
        snprintf(text, sizeof(text), TCP "rule r on t { probability %s; do latency 1ms }\n",
                 cases[i].text);
        struct conf *c = parse_ok(text, &d);
        assert_true(c->rules->trigger.has_probability);
        if (c->rules->trigger.probability != cases[i].p) {
            fail_msg("probability %s: got %.17g", cases[i].text, c->rules->trigger.probability);
        }
        conf_free(c);
        conf_diags_free(&d);
    }
}

/* A bare number is a fraction: `probability 1` is every event.  It is taken, with a warning
 * that says what it means and asks whether a percentage was meant. */
static void test_probability_fraction_warns(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("probability 1; do latency 1ms"), 0,
           {3, 17, CONF_WARNING, "probability '1' is a fraction: every event (100%)",
            "did you mean '1%'? write '100%' to say so"});
    EXPECT(TCP_RULE("probability 0.05; do latency 1ms"), 0,
           {3, 17, CONF_WARNING, "probability '0.05' is a fraction: 5% of the events",
            "did you mean '0.05%'? write '5%' to say so"});
    EXPECT(TCP_RULE("probability .5; do latency 1ms"), 0,
           {3, 17, CONF_WARNING, "probability '.5' is a fraction: 50% of the events",
            "did you mean '.5%'? write '50%' to say so"});
    EXPECT_CLEAN(TCP_RULE("probability 1%; do latency 1ms"));
    EXPECT_CLEAN(TCP_RULE("probability 100%; do latency 1ms"));
}

/* What twice check's summary and GET /rules show of a rule: its matchers and triggers as a
 * rule file writes them. */
static void test_rule_text(void **state)
{
    struct conf_diags d;
    char buf[256];

    (void)state;
    struct conf *c = parse_ok(
        MQ
        "rule a on mq {\n"
        "    when deliver queue=pay* task!=refund body~\"refund due\" header.x-tenant=acme\n"
        "    between 30s 5m; every 10; first 3; probability 12.5%; limit 7\n"
        "    max-per-message 2; do drop\n"
        "}\n"
        "rule b on mq { when ack; do redeliver }\n"
        "rule c on mq { when ack redelivered=true; nth 4; after 2; probability 0.5%; do drop }\n",
        &d);
    const struct rule *a = find_rule(c, "a"), *b = find_rule(c, "b"), *r = find_rule(c, "c");
    rule_matchers_text(a, buf, sizeof(buf));
    assert_string_equal(buf, "queue=pay* task!=refund body~\"refund due\" header.x-tenant=acme");
    rule_triggers_text(a, buf, sizeof(buf));
    assert_string_equal(buf, "between 30s 5m, every 10, first 3, probability 12.5%, limit 7, "
                             "max-per-message 2");
    assert_int_equal(rule_matchers_text(b, buf, sizeof(buf)), 0);
    assert_int_equal(rule_triggers_text(b, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    rule_matchers_text(r, buf, sizeof(buf));
    assert_string_equal(buf, "redelivered=true");
    rule_triggers_text(r, buf, sizeof(buf));
    assert_string_equal(buf, "nth 4, after 2, probability 0.5%");
    assert_string_equal(rule_ms_text(0, buf, sizeof(buf)), "0s");
    assert_string_equal(rule_ms_text(90000, buf, sizeof(buf)), "90s");
    assert_string_equal(rule_ms_text(120000, buf, sizeof(buf)), "2m");
    assert_string_equal(rule_ms_text(250, buf, sizeof(buf)), "250ms");
    /* cut to the room given, NUL-terminated */
    assert_int_equal(rule_triggers_text(a, buf, 12), 11);
    assert_string_equal(buf, "between 30s");
    /* which earlier rules take a rule's events first */
    assert_false(rule_takes_before(a, b));
    assert_true(rule_takes_before(b, r));
    conf_free(c);
    conf_diags_free(&d);
}

/* An action as the fault's log line and the admin API's `detail` give it. */
static void test_action_text(void **state)
{
    (void)state;
    struct conf_diags d;
    struct conf *c = parse_ok(stream_rules, &d);
    char buf[160];
    static const struct {
        const char *rule, *text;
    } stream[] = {
        {"lat", "latency 20ms jitter 5ms downstream"},
        {"lat2", "latency 1000ms jitter 0ms upstream"},
        {"bw", "bandwidth 100000B/s both"},
        {"slice", "slice 64000B delay 10ms both"},
        {"reset2", "reset 2000ms"},
        {"hole", "blackhole both"},
        {"sc", "slow-close 3000ms"},
        {"lim", "limit 2000000000B both"},
    };
    for (size_t i = 0; i < sizeof(stream) / sizeof(stream[0]); i++) {
        size_t n = rule_action_text(find_rule(c, stream[i].rule), buf, sizeof(buf));
        assert_string_equal(buf, stream[i].text);
        assert_int_equal(n, strlen(stream[i].text));
    }
    /* cut to the room given, NUL-terminated */
    assert_int_equal(rule_action_text(find_rule(c, "lat"), buf, 8), 7);
    assert_string_equal(buf, "latency");
    conf_free(c);
    conf_diags_free(&d);
    c = parse_ok(MQ "rule a on mq { when ack; nth 1; do redeliver after 5s }\n"
                    "rule b on mq { when deliver; nth 2; do duplicate }\n"
                    "rule e on mq { when deliver; nth 3; do error 406 }\n"
                    "rule x on mq { when ack; do close before }\n"
                    "rule y on mq { when deliver; nth 4; do expire 30s }\n",
                 &d);
    static const struct {
        const char *rule, *text;
    } msg[] = {
        {"a", "redeliver after 5000ms"}, {"b", "duplicate"},      {"e", "error 406"},
        {"x", "close before"},           {"y", "expire 30000ms"},
    };
    for (size_t i = 0; i < sizeof(msg) / sizeof(msg[0]); i++) {
        rule_action_text(find_rule(c, msg[i].rule), buf, sizeof(buf));
        assert_string_equal(buf, msg[i].text);
    }
    conf_free(c);
    conf_diags_free(&d);
}

/* ---- mistakes in `when` ---- */

#define EVENTS_HINT "events: connect, deliver, ack, nack, publish, confirm, command, lease"
#define BAD_MATCHER_HINT                                                                           \
    "write FIELD=VALUE, FIELD!=VALUE or FIELD~TEXT with no blanks, e.g. queue=payments; only "     \
    "the value may be quoted"
#define CIDR_HINT "write an IPv4 or IPv6 address or a CIDR block, e.g. 10.0.0.0/8 or ::1/128"
#define SUBSTRING_HINT                                                                             \
    "'~' (substring) applies to body, task, queue, message_id, key, command and header.NAME"

static void test_when_errors(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("when\n    do latency 1ms"), -1,
           EH(3, 5, "'when' needs an event: when EVENT [MATCHER...]", EVENTS_HINT));
    EXPECT(TCP_RULE("when stream; do latency 1ms"), -1,
           EH(3, 10, "unknown event 'stream'",
              "leave out 'when': a rule with no 'when' acts on the byte stream"));
    EXPECT(TCP_RULE("when conect; do latency 1ms"), -1,
           EH(3, 10, "unknown event 'conect'", "did you mean 'connect'?"));
    EXPECT(TCP_RULE("when arrival; do latency 1ms"), -1,
           EH(3, 10, "unknown event 'arrival'",
              "expected one of: connect, deliver, ack, nack, publish, confirm, command, lease"));
    EXPECT(MQ_RULE("when ack qeue=x; do drop"), -1,
           EH(3, 14, "unknown field 'qeue'", "did you mean 'queue'?"));
    EXPECT(MQ_RULE("when ack colour=red; do drop"), -1,
           EH(3, 14, "unknown field 'colour'",
              "expected one of: queue, exchange, routing_key, consumer_tag, message_id, task, "
              "header.NAME, body, client, redelivered, command, key"));
    EXPECT(MQ_RULE("when ack header=x header.=y; do drop"), -1,
           EH(3, 14, "'header' needs a name: header.NAME=VALUE", "e.g. header.x-retry=1"),
           EH(3, 23, "'header.' needs a name: header.NAME=VALUE", "e.g. header.x-retry=1"));
    EXPECT(MQ_RULE("when ack client~10. redelivered~t exchange~x; do drop"), -1,
           EH(3, 14, "'client' cannot use '~'", "use = or !="),
           EH(3, 25, "'redelivered' cannot use '~'", "use = or !="),
           EH(3, 39, "'exchange' cannot use '~'", SUBSTRING_HINT));
    EXPECT(TCP_RULE("when connect client=nope client=10.0.0.300; do latency 1ms"), -1,
           EH(3, 18, "invalid client address 'nope'", CIDR_HINT),
           EH(3, 30, "invalid client address '10.0.0.300'", CIDR_HINT));
    EXPECT(TCP_RULE("when connect client=1.2.3.4/33 client=::1/129 client=::1/; do latency 1ms"),
           -1, E(3, 18, "invalid prefix length in '1.2.3.4/33' (0-32 for IPv4)"),
           E(3, 36, "invalid prefix length in '::1/129' (0-128 for IPv6)"),
           E(3, 51, "invalid prefix length in '::1/' (0-128 for IPv6)"));
    EXPECT(MQ_RULE("when ack redelivered=yes; do drop"), -1,
           EH(3, 14, "invalid redelivered value 'yes'", "expected true or false"));
    EXPECT(MQ_RULE("when ack queue \"x\" =y; do drop"), -1,
           EH(3, 14, "invalid matcher 'queue'", BAD_MATCHER_HINT),
           EH(3, 20, "invalid matcher 'x'", BAD_MATCHER_HINT),
           EH(3, 24, "invalid matcher '=y'", BAD_MATCHER_HINT));
    EXPECT(MQ_RULE("when ack \"queue=x\" queue:x; do drop"), -1,
           EH(3, 14, "invalid matcher 'queue=x'", BAD_MATCHER_HINT),
           EH(3, 24, "invalid matcher 'queue:x'", BAD_MATCHER_HINT));
}

static void test_when_quoting(void **state)
{
    (void)state;
    /* a blank between the operator and a quoted value */
    EXPECT(MQ_RULE("when deliver body~ \"refund due\" task=a; do drop"), -1,
           EH(3, 18, "missing value after 'body~'",
              "write body~\"refund due\" with no blank before the quote"));
    EXPECT(MQ_RULE("when deliver queue= task=a; do drop"), -1,
           E(3, 18, "missing value after 'queue='"));
    EXPECT(MQ_RULE("when deliver queue!="), -1,
           EH(2, 1, "rule 'r' has no 'do ACTION'",
              "e.g. do redeliver; listener 'mq' (protocol everything) can do on 'deliver' events: "
              "redeliver, duplicate, expire, delay, drop, close, error, latency, bandwidth, "
              "slice, reset, blackhole, slow-close, limit"),
           E(3, 18, "missing value after 'queue!='"));
    /* a comment glued to a word is still a comment */
    EXPECT_CLEAN(MQ_RULE("when deliver queue=a#b\n    do drop"));
}

static void test_too_many_matchers(void **state)
{
    char text[2048] = MQ "rule r on mq {\n    when ack";

    (void)state;
    for (int i = 0; i < 33; i++) {
        strcat(text, " queue=q");
    }
    strcat(text, " task=x\n    do drop\n}\n");
    /* 32 are fine; the 33rd is at column 14 + 32 * 8 */
    EXPECT(text, -1, E(3, 270, "too many matchers (at most 32)"));
}

/* ---- mistakes in triggers ---- */

#define PROB_HINT "write a percentage like 5% or 12.5%, or a fraction like 0.05"

static void test_trigger_errors(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("probability 0%; do latency 1ms"), -1,
           E(3, 17, "probability '0%' must be greater than 0"));
    EXPECT(TCP_RULE("probability 0.0; do latency 1ms"), -1,
           E(3, 17, "probability '0.0' must be greater than 0"));
    EXPECT(TCP_RULE("probability 150%; do latency 1ms"), -1,
           E(3, 17, "probability '150%' is more than 100%"));
    EXPECT(TCP_RULE("probability 5; do latency 1ms"), -1,
           EH(3, 17, "probability '5' is more than 1", "did you mean '5%'?"));
    EXPECT(TCP_RULE("probability 5%%; do latency 1ms"), -1,
           EH(3, 17, "invalid probability '5%%'", PROB_HINT));
    EXPECT(TCP_RULE("probability 1.2.3; do latency 1ms"), -1,
           EH(3, 17, "invalid probability '1.2.3'", PROB_HINT));
    EXPECT(TCP_RULE("probability 0.1234567890123456; do latency 1ms"), -1,
           EH(3, 17, "invalid probability '0.1234567890123456'", PROB_HINT));
    EXPECT(TCP_RULE("probability; do latency 1ms"), -1,
           E(3, 5, "'probability' takes one argument: P, e.g. 5% or 0.05"));
    EXPECT(TCP_RULE("every 0; nth x; first 1000000000001; after -1; do latency 1ms"), -1,
           E(3, 11, "'every' must be from 1 to 1000000000000, not 0"),
           EH(3, 18, "invalid number 'x' for 'nth'", "write a whole number, e.g. nth 10"),
           E(3, 27, "'first' must be from 1 to 1000000000000, not 1000000000001"),
           EH(3, 48, "invalid number '-1' for 'after'", "write a whole number, e.g. after 10"));
    EXPECT(TCP_RULE("limit 99999999999999999999999; do latency 1ms"), -1,
           E(3, 11, "'limit' must be from 1 to 1000000000000, not 99999999999999999999999"));
    EXPECT(MQ_RULE("when ack; max-per-message 1001; do drop"), -1,
           E(3, 31, "'max-per-message' must be from 1 to 1000, not 1001"));
    EXPECT(TCP_RULE("between 10s 5s; do latency 1ms"), -1,
           EH(3, 17, "'between' ends at 5s, not after its start 10s", "write between START END"));
    EXPECT(TCP_RULE("between 1s 1s; do latency 1ms"), -1,
           EH(3, 16, "'between' ends at 1s, not after its start 1s", "write between START END"));
    EXPECT(TCP_RULE("between 0 0s; do latency 1ms"), -1,
           E(3, 13, "duration '0' needs a unit: ms, s, m or h"),
           E(3, 15, "duration '0s' must be greater than 0"));
    EXPECT(TCP_RULE("between 5s; do latency 1ms"), -1,
           E(3, 5, "'between' takes two arguments: START END, e.g. 0s 10m"));
    EXPECT(TCP_RULE("every 2; every 3; do latency 1ms"), -1,
           EH(3, 14, "duplicate 'every'", "first set at 3:5"));
}

/* ---- mistakes in `do` ---- */

#define ACTIONS_HINT                                                                               \
    "expected one of: redeliver, duplicate, expire, delay, drop, close, error, latency, "          \
    "bandwidth, slice, reset, blackhole, slow-close, limit"
#define UNITS "B, KB, MB, GB, KiB, MiB or GiB"

static void test_do_errors(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("do"), -1, EH(3, 5, "'do' needs an action: do ACTION [ARGS...]", ACTIONS_HINT));
    EXPECT(TCP_RULE("do redelivr"), -1,
           EH(3, 8, "unknown action 'redelivr'", "did you mean 'redeliver'?"));
    EXPECT(TCP_RULE("do explode"), -1, EH(3, 8, "unknown action 'explode'", ACTIONS_HINT));
    EXPECT(MQ_RULE("when ack; do delay"), -1,
           EH(3, 18, "'do delay' needs a duration", "usage: do delay DURATION"));
    EXPECT(MQ_RULE("when ack; do expire 5"), -1,
           E(3, 25, "duration '5' needs a unit: ms, s, m or h"));
    EXPECT(MQ_RULE("when ack; do drop now"), -1,
           EH(3, 23, "too many arguments for 'do drop'", "usage: do drop"));
    EXPECT(MQ_RULE("when ack; do close"), -1,
           EH(3, 18, "'do close' needs before or after", "usage: do close before|after"));
    EXPECT(MQ_RULE("when ack; do close befor"), -1,
           EH(3, 24, "unknown 'close' argument 'befor'", "did you mean 'before'?"));
    EXPECT(MQ_RULE("when ack; do error"), -1,
           EH(3, 18, "'do error' needs an error code", "usage: do error CODE, e.g. do error 406"));
    EXPECT(MQ_RULE("when ack; do error \"not found\""), -1,
           EH(3, 24, "invalid error code 'not found'", "e.g. 406, 320, READONLY, LOADING or OOM"));
    /* An AMQP listener takes AMQP 0-9-1's error codes only: others were
     * replaced by 406 at run time while the log named them. */
    EXPECT(MQ_RULE("when ack; do error abc"), -1,
           EH(3, 18,
              "'abc' is not an AMQP 0-9-1 error code for listener 'mq' (protocol amqp): "
              "one of 311-313, 320, 402-406, 501-506, 530, 540, 541",
              "e.g. 406 (precondition-failed), 404 (not-found), 403 (access-refused), "
              "320 (connection-forced), 541 (internal-error)"));
    EXPECT(MQ_RULE("when deliver; do error 999"), -1,
           EH(3, 22,
              "'999' is not an AMQP 0-9-1 error code for listener 'mq' (protocol amqp): "
              "one of 311-313, 320, 402-406, 501-506, 530, 540, 541",
              "e.g. 406 (precondition-failed), 404 (not-found), 403 (access-refused), "
              "320 (connection-forced), 541 (internal-error)"));
    EXPECT(MQ_RULE("when ack; do error 200"), -1,
           EH(3, 18,
              "'200' is not an AMQP 0-9-1 error code for listener 'mq' (protocol amqp): "
              "one of 311-313, 320, 402-406, 501-506, 530, 540, 541",
              "e.g. 406 (precondition-failed), 404 (not-found), 403 (access-refused), "
              "320 (connection-forced), 541 (internal-error)"));
    EXPECT_CLEAN(MQ_RULE("when ack; do error -541"));
    EXPECT_CLEAN(MQ_RULE("when ack; do error 311"));
    EXPECT(MQ_RULE("when ack; do error ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456"), -1,
           EH(3, 24, "invalid error code 'ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456'",
              "e.g. 406, 320, READONLY, LOADING or OOM"));
    EXPECT(TCP_RULE("do latency 20ms jiter 5ms"), -1,
           EH(3, 21, "unknown 'do latency' option 'jiter'", "did you mean 'jitter'?"));
    EXPECT(TCP_RULE("do latency 20ms jitter"), -1,
           E(3, 21, "'jitter' needs a value: jitter DURATION"));
    EXPECT(TCP_RULE("do latency 20ms jitter 50ms"), -1,
           EH(3, 28, "jitter 50ms is more than the latency 20ms", "the delay would go below zero"));
    EXPECT(TCP_RULE("do slice 1KB delay 5ms extra"), -1,
           EH(3, 28, "too many arguments for 'do slice'", "usage: do slice SIZE [delay DURATION]"));
    EXPECT(TCP_RULE("do reset after"), -1, E(3, 14, "'after' needs a value: after DURATION"));
    EXPECT(TCP_RULE("do reset before 1s"), -1,
           EH(3, 14, "unknown 'do reset' option 'before'", "usage: do reset [after DURATION]"));
    EXPECT(TCP_RULE("do slow-close"), -1,
           EH(3, 8, "'do slow-close' needs a duration", "usage: do slow-close DURATION"));
}

static void test_byte_errors(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("do bandwidth"), -1,
           EH(3, 8, "'do bandwidth' needs a rate",
              "usage: do bandwidth RATE, e.g. do bandwidth 100KB/s"));
    EXPECT(TCP_RULE("do bandwidth 100"), -1, E(3, 18, "rate '100' needs a unit: " UNITS));
    EXPECT(TCP_RULE("do bandwidth 100kb/s"), -1,
           EH(3, 18, "unknown unit 'kb/s' in rate '100kb/s'", "use " UNITS));
    EXPECT(TCP_RULE("do bandwidth fast"), -1,
           EH(3, 18, "invalid rate 'fast'", "write a number and a unit, e.g. 100KB/s or 1MiB/s"));
    EXPECT(TCP_RULE("do bandwidth 0KB/s"), -1, E(3, 18, "rate '0KB/s' must be greater than 0"));
    EXPECT(TCP_RULE("do bandwidth 1025GiB/s"), -1,
           E(3, 18, "rate '1025GiB/s' is too large (at most 1024GiB/s)"));
    EXPECT(TCP_RULE("do limit 1KB/s"), -1,
           EH(3, 14, "size '1KB/s' is a rate", "write it without '/s'"));
    EXPECT(TCP_RULE("do limit 1099511627777B"), -1,
           E(3, 14, "size '1099511627777B' is too large (at most 1024GiB)"));
    EXPECT(TCP_RULE("do limit 99999999999999999999999999GiB"), -1,
           E(3, 14, "size '99999999999999999999999999GiB' is too large (at most 1024GiB)"));
    EXPECT(TCP_RULE("do slice 0B"), -1, E(3, 14, "size '0B' must be greater than 0"));
    EXPECT(TCP_RULE("do slice KB"), -1,
           EH(3, 14, "invalid size 'KB'", "write a number and a unit, e.g. 64KB or 1MiB"));
    EXPECT(TCP_RULE("do slice 1KiBytes"), -1,
           EH(3, 14, "unknown unit 'KiBytes' in size '1KiBytes'", "use " UNITS));
}

/* ---- mistakes across a rule block ---- */

#define STREAM_ONLY                                                                                \
    "'stream' applies only to stream actions (latency, bandwidth, slice, reset, blackhole, "       \
    "slow-close, limit)"

static void test_block_errors(void **state)
{
    (void)state;
    EXPECT(TCP "rule r on t {\n}\n", -1, EH(2, 1, "rule 'r' has no 'do ACTION'", TCP_NO_DO));
    EXPECT(TCP "rule r on t { do latency 1ms }\nrule r on t { do reset }\n", -1,
           E(3, 6, "rule 'r' is already defined at 2:1"));
    EXPECT(TCP_RULE("do latency 1ms; do latency 2ms"), -1,
           EH(3, 21, "duplicate 'do'", "first set at 3:5"));
    EXPECT(MQ_RULE("when ack; stream upstream; do redeliver"), -1, E(3, 15, STREAM_ONLY));
    EXPECT(
        TCP_RULE("stream sideways; do latency 1ms"), -1,
        EH(3, 12, "unknown stream direction 'sideways'", "expected upstream, downstream or both"));
    EXPECT(TCP_RULE("stream downstrem; do latency 1ms"), -1,
           EH(3, 12, "unknown stream direction 'downstrem'", "did you mean 'downstream'?"));
    EXPECT(TCP_RULE("disabled now; do latency 1ms"), -1, E(3, 14, "'disabled' takes no arguments"));
    EXPECT(TCP_RULE("when connect { }; do latency 1ms"), -1,
           E(3, 18, "'when' does not take a block"));
    /* a rule with no `when` acts on the byte stream: message actions need one */
    EXPECT(TCP_RULE("do redeliver"), -1,
           E(3, 8, "'do redeliver' needs 'when EVENT': redeliver acts on a message event"));
    EXPECT(TCP_RULE("do close before"), -1,
           E(3, 8, "'do close' needs 'when EVENT': close acts on an event such as connect"));
    EXPECT(TCP_RULE("max-per-message 2; do latency 1ms"), -1,
           EH(3, 5, "'max-per-message' applies to message events", "this rule has no 'when'"));
    EXPECT(TCP_RULE("when connect; max-per-message 2; do close before"), -1,
           EH(3, 19, "'max-per-message' applies to message events",
              "'connect' is not a message event"));
}

static void test_block_keywords(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("whn connect; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'whn'", "did you mean 'when'?"));
    EXPECT(TCP_RULE("probabilty 5%; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'probabilty'", "did you mean 'probability'?"));
    EXPECT(TCP_RULE("max-per-mesage 2; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'max-per-mesage'", "did you mean 'max-per-message'?"));
    EXPECT(TCP_RULE("latency 20ms"), -1, EH(2, 1, "rule 'r' has no 'do ACTION'", TCP_NO_DO),
           EH(3, 5, "unknown directive 'latency'", "did you mean 'do latency'?"));
    EXPECT(TCP_RULE("bind 1.2.3.4:5; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'bind'", "'bind' belongs inside a listen block"));
    EXPECT(TCP_RULE("seed 4; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'seed'",
              "'seed' belongs at the top level, outside rule blocks"));
    EXPECT(TCP_RULE("rule x on t { }; do latency 1ms"), -1,
           EH(3, 5, "unknown directive 'rule'",
              "'rule' belongs at the top level, outside rule blocks"));
    EXPECT(TCP_RULE("frobnicate; do latency 1ms"), -1, E(3, 5, "unknown directive 'frobnicate'"));
    /* rule keywords outside a rule */
    EXPECT(TCP "when ack\ndo drop\n", -1,
           EH(2, 1, "unknown directive 'when'", "'when' belongs inside a rule block"),
           EH(3, 1, "unknown directive 'do'", "'do' belongs inside a rule block"));
}

static void test_rule_listener(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    /* a rule may come before its listener */
    c = parse_ok("rule r on t { do latency 1ms }\n" TCP, &d);
    assert_int_equal(c->n_rules, 1);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(TCP NARROW "rule r on tt { do latency 1ms }\n", -1,
           EH(3, 11, "unknown listener 'tt'", "did you mean 't'?"));
    EXPECT(TCP "rule r on kafka { do latency 1ms }\n", -1, E(2, 11, "unknown listener 'kafka'"));
    /* no listener at all: only that is said about listeners */
    EXPECT("rule r on t { do latency 1ms }\n", -1,
           EH(1, 1, "no listener defined",
              "add one, e.g. listen redis { protocol resp; bind 127.0.0.1:6380; upstream "
              "127.0.0.1:6379 }"),
           E(1, 11, "unknown listener 't'"));
}

/* ---- what the listener's codec can do ---- */

#define TCP_NO_MESSAGES                                                                            \
    "protocol tcp carries opaque bytes: it sees connections, not messages (use protocol amqp "     \
    "or resp for message events)"
#define TCP_CONNECT_ACTIONS                                                                        \
    "it can do: delay, close, latency, bandwidth, slice, reset, blackhole, slow-close, limit"

static void test_caps_tcp(void **state)
{
    (void)state;
    EXPECT(TCP_RULE("when ack queue=payments; do redeliver"), -1,
           EH(3, 10, "listener 't' (protocol tcp) has no 'ack' event: " TCP_NO_MESSAGES,
              "its events: connect"));
    EXPECT(TCP_RULE("when command; do latency 1ms"), -1,
           EH(3, 10, "listener 't' (protocol tcp) has no 'command' event: " TCP_NO_MESSAGES,
              "its events: connect"));
    EXPECT(TCP_RULE("when connect queue=x header.h=1 client=::1; do close before"), -1,
           EH(3, 18, "'queue' cannot be matched on 'connect' events of listener 't' (protocol tcp)",
              "it can match: client"),
           EH(3, 26,
              "'header.h' cannot be matched on 'connect' events of listener 't' (protocol tcp)",
              "it can match: client"));
    EXPECT(TCP_RULE("when connect; do redeliver"), -1,
           EH(3, 22,
              "listener 't' (protocol tcp) cannot do 'redeliver' on 'connect' events: this "
              "action works on messages, and protocol tcp has none",
              TCP_CONNECT_ACTIONS));
    EXPECT(TCP_RULE("when connect; do error 406"), -1,
           EH(3, 22,
              "listener 't' (protocol tcp) cannot do 'error' on 'connect' events: this action "
              "works on messages, and protocol tcp has none",
              TCP_CONNECT_ACTIONS));
    /* the allowed forms, for contrast */
    EXPECT_CLEAN(TCP_RULE("when connect client=::1; do delay 1s"));
    EXPECT_CLEAN(TCP_RULE("when connect; do slow-close 1s"));
}

/* The checker reads the tables: a codec with other tables gets other
 * answers, and one with no reasons gets no ": reason". */
static void test_caps_tables(void **state)
{
    (void)state;
    EXPECT(NARROW "rule r on n { when ack; do duplicate }\n", -1,
           EH(2, 20, "listener 'n' (protocol narrow) has no 'ack' event", "its events: deliver"));
    assert_string_equal(last_profile, "rq");
    EXPECT(
        NARROW "rule r on n { when connect; do latency 1ms }\n", -1,
        EH(2, 20, "listener 'n' (protocol narrow) has no 'connect' event", "its events: deliver"));
    EXPECT(NARROW "rule r on n { when deliver task=x queue=y; do drop }\n", -1,
           EH(2, 28,
              "'task' cannot be matched on 'deliver' events of listener 'n' (protocol "
              "narrow)",
              "it can match: queue"),
           EH(2, 47, "listener 'n' (protocol narrow) cannot do 'drop' on 'deliver' events",
              "it can do: duplicate"));
    EXPECT(NARROW "rule r on n { do bandwidth 1KB }\n", -1,
           EH(2, 18, "listener 'n' (protocol narrow) cannot do 'bandwidth' on the byte stream",
              "it can do: latency"));
    EXPECT(NARROW "rule r on n { when deliver queue=y; do duplicate }\n"
                  "rule s on n { do latency 1ms }\n",
           0);
    /* the same rule on a codec that can do everything */
    EXPECT_CLEAN(MQ "rule r on mq { when deliver task=x queue=y; do drop }\n");
}

/* ---- the real amqp table (rules/caps_amqp.c) ---- */

/* Every event of protocol amqp, each with actions it can take, and every
 * matcher a delivery offers; each rule on a queue of its own (one rule acts
 * on an event: rules that share events would be warned about). */
static const char *const amqp_rules =
    MQ "rule dup on mq { when deliver queue=payments; do duplicate }\n" /* 2 */
       "rule exp on mq { when deliver queue=e; do expire 2s }\n"        /* 3 */
       "rule dly on mq { when deliver queue=dl; do delay 500ms }\n"     /* 4 */
       "rule ddrop on mq { when deliver queue=dd; do drop }\n"          /* 5 */
       "rule derr on mq { when deliver queue=de; do error 406 }\n"      /* 6 */
       "rule lost on mq { when ack queue=payments; do redeliver }\n"    /* 7 */
       "rule adly on mq { when ack queue=ad; do delay 3s }\n"           /* 8 */
       "rule adrop on mq { when ack queue=ap; do drop }\n"              /* 9 */
       "rule aclose on mq { when ack queue=ac; do close before }\n"     /* 10 */
       "rule ndrop on mq { when nack; do drop }\n"                      /* 11 */
       "rule pdrop on mq { when publish queue=pp; do drop }\n"          /* 12 */
       "rule pdly on mq { when publish queue=pd; do delay 1s }\n"       /* 13 */
       "rule cdrop on mq { when confirm; do drop }\n"                   /* 14 */
       "rule match on mq {\n"                                           /* 15 */
       "    when deliver queue=q task=t message_id=m header.x-tenant=acme "
       "body~refund redelivered=true\n" /* 16 */
       "    do drop\n"
       "}\n"
       "rule conn on mq { when connect client=10.0.0.0/8; do close before }\n"
       "rule lat on mq { do latency 5ms }\n";

static void assert_action(const struct conf *c, const char *name, enum rule_event ev,
                          enum rule_action_kind kind, uint32_t duration_ms)
{
    const struct rule *r = find_rule(c, name);

    assert_int_equal(r->event, ev);
    assert_int_equal(r->action.kind, kind);
    assert_int_equal(r->action.duration_ms, duration_ms);
}

/* The resp tables: every listener has `command`; profiles add job events,
 * and Sidekiq, which never acks, refuses `ack` with the reason. */
#define SK "listen sk { protocol resp; profile sidekiq; bind 127.0.0.1:7; upstream 127.0.0.1:8 }\n"
#define CE "listen ce { protocol resp; profile celery; bind 127.0.0.1:9; upstream 127.0.0.1:10 }\n"
#define RP "listen rp { protocol resp; bind 127.0.0.1:11; upstream 127.0.0.1:12 }\n"

static void test_caps_resp(void **state)
{
    (void)state;
    EXPECT_CLEAN(SK CE RP
                 "rule a on sk { when deliver task=Charge; first 3; do duplicate }\n"
                 "rule b on sk { when deliver queue=default; do drop }\n"
                 "rule c on sk { when publish; do delay 1s }\n"
                 "rule d on ce { when ack task=tasks.charge; do redeliver }\n"
                 "rule e on ce { when ack task=tasks.mail; do delay 8s }\n"
                 "rule f on ce { when deliver redelivered=false; do close before }\n"
                 "rule g on rp { when command command=LPUSH key=queue:*; do error READONLY }\n"
                 "rule h on rp { when command command=GET; do delay 1s }\n"
                 "rule i on rp { when command command=DEL; do drop }\n"
                 "rule j on rp { do latency 5ms }\n");
    EXPECT(CE "rule r on ce {\n    when ack queue=celery\n}\n", -1,
           EH(2, 1, "rule 'r' has no 'do ACTION'",
              "e.g. do redeliver; listener 'ce' (protocol resp/celery) can do on 'ack' events: "
              "redeliver, delay, drop, close"));
    EXPECT(SK "rule r on sk { when ack; do redeliver }\n", -1,
           EH(2, 21,
              "listener 'sk' (protocol resp/sidekiq) has no 'ack' event: Sidekiq's basic fetch "
              "never acks: a job exists only in the worker once popped (use 'drop' or 'close "
              "before' on 'deliver' for a lost job)",
              "its events: connect, deliver, publish, command"));
    EXPECT(RP "rule r on rp { when deliver; do duplicate }\n", -1,
           EH(2, 21,
              "listener 'rp' (protocol resp) has no 'deliver' event: a resp listener without a "
              "profile sees commands only: add 'profile sidekiq', 'celery', 'rq', 'streams', "
              "'list' or 'bullmq' for job events",
              "its events: connect, command"));
    EXPECT(CE "rule r on ce { when deliver; do error LOADING }\n", -1,
           EH(2, 33,
              "listener 'ce' (protocol resp/celery) cannot do 'error' on 'deliver' events: an "
              "error reply is a command fault: use 'when command'",
              "it can do: duplicate, delay, drop, close"));
    EXPECT(CE "rule r on ce { when ack; do expire 5s }\n", -1,
           EH(2, 29,
              "listener 'ce' (protocol resp/celery) cannot do 'expire' on 'ack' events: Redis "
              "job queues have no per-delivery timer to imitate: use 'redeliver' on 'ack', or "
              "'delay' past the visibility timeout",
              "it can do: redeliver, delay, drop, close"));
}

static void test_caps_amqp_valid(void **state)
{
    struct conf_diags d;
    struct conf *c;
    const struct rule *r;

    (void)state;
    /* the shim hands amqp listeners the codec's own table */
    assert_ptr_equal(proto_caps_find(CONF_PROTO_AMQP, NULL), &proto_amqp_caps);
    assert_string_equal(proto_amqp_caps.name, "amqp");
    /* not a diagnostic, not even a warning */
    EXPECT_CLEAN(amqp_rules);
    c = parse_ok(amqp_rules, &d);
    assert_int_equal(c->n_rules, 16);
    r = find_rule(c, "dup");
    assert_int_equal(r->event, RULE_EV_DELIVER);
    assert_int_equal(r->action.kind, RULE_ACT_DUPLICATE);
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "payments", false);
    assert_action(c, "exp", RULE_EV_DELIVER, RULE_ACT_EXPIRE, 2000);
    assert_action(c, "dly", RULE_EV_DELIVER, RULE_ACT_DELAY, 500);
    assert_action(c, "ddrop", RULE_EV_DELIVER, RULE_ACT_DROP, 0);
    assert_action(c, "derr", RULE_EV_DELIVER, RULE_ACT_ERROR, 0);
    assert_string_equal(find_rule(c, "derr")->action.error_code, "406");
    r = find_rule(c, "lost");
    assert_int_equal(r->event, RULE_EV_ACK);
    assert_int_equal(r->action.kind, RULE_ACT_REDELIVER);
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "payments", false);
    assert_action(c, "adly", RULE_EV_ACK, RULE_ACT_DELAY, 3000);
    assert_action(c, "adrop", RULE_EV_ACK, RULE_ACT_DROP, 0);
    assert_action(c, "aclose", RULE_EV_ACK, RULE_ACT_CLOSE, 0);
    assert_int_equal(find_rule(c, "aclose")->action.close_when, RULE_CLOSE_BEFORE);
    assert_action(c, "ndrop", RULE_EV_NACK, RULE_ACT_DROP, 0);
    assert_action(c, "pdrop", RULE_EV_PUBLISH, RULE_ACT_DROP, 0);
    assert_action(c, "pdly", RULE_EV_PUBLISH, RULE_ACT_DELAY, 1000);
    assert_action(c, "cdrop", RULE_EV_CONFIRM, RULE_ACT_DROP, 0);
    r = find_rule(c, "match");
    assert_int_equal(r->event, RULE_EV_DELIVER);
    assert_int_equal(r->n_matchers, 6);
    assert_matcher(&r->matchers[0], RULE_F_QUEUE, RULE_OP_EQ, "q", false);
    assert_matcher(&r->matchers[1], RULE_F_TASK, RULE_OP_EQ, "t", false);
    assert_matcher(&r->matchers[2], RULE_F_MESSAGE_ID, RULE_OP_EQ, "m", false);
    assert_matcher(&r->matchers[3], RULE_F_HEADER, RULE_OP_EQ, "acme", false);
    assert_string_equal(r->matchers[3].header, "x-tenant");
    assert_matcher(&r->matchers[4], RULE_F_BODY, RULE_OP_CONTAINS, "refund", false);
    assert_matcher(&r->matchers[5], RULE_F_REDELIVERED, RULE_OP_EQ, "true", false);
    assert_true(r->matchers[5].bool_value);
    assert_action(c, "conn", RULE_EV_CONNECT, RULE_ACT_CLOSE, 0);
    assert_action(c, "lat", RULE_EV_STREAM, RULE_ACT_LATENCY, 5);
    conf_free(c);
    conf_diags_free(&d);
}

/* `do redeliver after D` and `do duplicate after D`: a copy D after the ack or the delivery,
 * where the listener's codec can choose the time and its own timeout does not come first. */
#define ST                                                                                         \
    "listen st { protocol resp; profile streams; bind 127.0.0.1:13; upstream 127.0.0.1:14 }\n"
#define BQ "listen bq { protocol resp; profile bullmq; bind 127.0.0.1:17; upstream 127.0.0.1:18 }\n"
#define RQL "listen rq { protocol resp; profile rq; bind 127.0.0.1:15; upstream 127.0.0.1:16 }\n"
#define VT(timeout)                                                                                \
    "listen vt { protocol amqp; bind 127.0.0.1:17; upstream 127.0.0.1:18; " timeout " }\n"

static int use_real_tables(void **state)
{
    use_real_amqp(state);
    return use_real_resp(state);
}

static int use_test_tables(void **state)
{
    use_everything_amqp(state);
    return use_narrow_resp(state);
}

static void test_caps_late(void **state)
{
    struct conf_diags d;
    (void)state;
    struct conf *c = parse_ok(
        MQ SK CE RQL VT(
            "visibility-timeout 10s") "rule a on mq { when ack; do redeliver after 5s }\n"
                                      "rule b on mq { when deliver; do duplicate after 1m }\n"
                                      "rule c on sk { when deliver; do duplicate after 2s }\n"
                                      "rule d on ce { when deliver; do duplicate after 2s }\n"
                                      "rule e on rq { when ack; do redeliver after 3s }\n"
                                      "rule f on rq { when deliver; do duplicate after 250ms }\n"
                                      "rule g on vt { when ack; do redeliver after 9s }\n"
                                      "rule h on mq { when ack; do redeliver after 0s }\n"
                                      "rule i on mq { when deliver; do duplicate }\n",
        &d);
    assert_action(c, "a", RULE_EV_ACK, RULE_ACT_REDELIVER, 5000);
    assert_action(c, "b", RULE_EV_DELIVER, RULE_ACT_DUPLICATE, 60000);
    assert_action(c, "f", RULE_EV_DELIVER, RULE_ACT_DUPLICATE, 250);
    assert_action(c, "h", RULE_EV_ACK, RULE_ACT_REDELIVER, 0);
    assert_action(c, "i", RULE_EV_DELIVER, RULE_ACT_DUPLICATE, 0);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(ST "rule r on st { when deliver; do duplicate after 5s }\n", -1,
           EH(2, 33,
              "listener 'st' (protocol resp/streams) cannot do 'duplicate after' on 'deliver' "
              "events: a pending stream entry is handed out again when a consumer's XAUTOCLAIM "
              "or XCLAIM finds it idle for that consumer's min-idle-time, counted from its last "
              "delivery: twice does not choose when; use 'do redeliver' (or 'do duplicate') and "
              "give the consumers a min-idle-time of D",
              "write 'do duplicate' without 'after'"));
    EXPECT(ST "rule r on st { when publish; do duplicate }\n", -1,
           EH(2, 33,
              "listener 'st' (protocol resp/streams) cannot do 'duplicate' on 'publish' events: "
              "an XADD sent twice makes two entries with two ids: consumers would see two "
              "messages, not one message twice",
              "it can do: delay, drop, close"));
    EXPECT(CE "rule r on ce { when publish; do duplicate after 5s }\n", -1,
           EH(2, 33,
              "listener 'ce' (protocol resp/celery) cannot do 'duplicate after' on 'publish' "
              "events",
              "write 'do duplicate' without 'after'"));
    EXPECT_CLEAN(CE "rule r on ce { when publish; do duplicate }\n");
    /* BullMQ: leases, and what its stalled checker decides */
    EXPECT_CLEAN(BQ "rule r on bq { when lease task=charge; do drop }\n"
                    "rule s on bq { when lease task=mail; do delay 3s }\n"
                    "rule t on bq { when deliver; do duplicate }\n"
                    "rule u on bq { when ack; do redeliver }\n");
    EXPECT(BQ "rule r on bq { when deliver; do duplicate after 5s }\n", -1,
           EH(2, 33,
              "listener 'bq' (protocol resp/bullmq) cannot do 'duplicate after' on 'deliver' "
              "events: a BullMQ job whose lock lapsed is handed out again by the stalled-job "
              "checker, which runs every stalledInterval (30 s by default): twice does not "
              "choose when; use 'do duplicate' or 'do redeliver' and give the workers the "
              "stalledInterval and lockDuration to test",
              "write 'do duplicate' without 'after'"));
    EXPECT(BQ "rule r on bq { when publish; do duplicate }\n", -1,
           EH(2, 33,
              "listener 'bq' (protocol resp/bullmq) cannot do 'duplicate' on 'publish' events: "
              "a second add is a second job with an id of its own (or, with the app's own jobId, "
              "no job at all: BullMQ ignores an add of an id it has): use 'duplicate' on "
              "'deliver'",
              "it can do: delay, drop, close"));
    /* RQ: its heartbeat is a lease too */
    EXPECT_CLEAN(RQL "rule r on rq { when lease task=tasks.charge; do drop }\n"
                     "rule s on rq { when lease task=tasks.mail; do delay 90s }\n"
                     "rule t on rq { when lease task=tasks.sms; do close before }\n");
    EXPECT(RQL "rule r on rq { when lease; do duplicate }\n", -1,
           EH(2, 31,
              "listener 'rq' (protocol resp/rq) cannot do 'duplicate' on 'lease' events: a "
              "heartbeat keeps a job; use 'drop' or 'delay' to let its entry in the started "
              "registry lapse",
              "it can do: delay, drop, close"));
    EXPECT(SK "rule r on sk { when lease; do drop }\n", -1,
           EH(2, 21, "listener 'sk' (protocol resp/sidekiq) has no 'lease' event",
              "its events: connect, deliver, publish, command"));
    EXPECT(ST "rule r on st { when ack; do redeliver after 5s }\n", -1,
           EH(2, 29,
              "listener 'st' (protocol resp/streams) cannot do 'redeliver after' on 'ack' "
              "events: a pending stream entry is handed out again when a consumer's XAUTOCLAIM "
              "or XCLAIM finds it idle for that consumer's min-idle-time, counted from its last "
              "delivery: twice does not choose when; use 'do redeliver' (or 'do duplicate') and "
              "give the consumers a min-idle-time of D",
              "write 'do redeliver' without 'after'"));
    EXPECT(CE "rule r on ce { when ack; do redeliver after 5s }\n", -1,
           EH(2, 29,
              "listener 'ce' (protocol resp/celery) cannot do 'redeliver after' on 'ack' events: "
              "kombu's Redis transport restores a job whose ack never landed visibility_timeout "
              "after its delivery (QoS.restore_visible), at a time twice does not choose: use 'do "
              "redeliver' with the transport's visibility_timeout, or 'do duplicate after D' on "
              "'deliver'",
              "write 'do redeliver' without 'after'"));
    EXPECT(VT("visibility-timeout 3s") "rule r on vt { when ack; do redeliver after 3s }\n", -1,
           EH(2, 29,
              "'redeliver after 3s' cannot happen at that time: listener 'vt' has a "
              "visibility-timeout of 3s, which hands the message out again first (an ack twice "
              "holds counts as not acked)",
              "make it shorter than 3s; for a copy 3s after the delivery, 'do expire 3s' on these "
              "deliveries with 'do drop' on their acks (docs/rules.md, late copies past a "
              "visibility timeout)"));
    EXPECT(VT("consumer-timeout 1500ms") "rule r on vt { when deliver; do duplicate after 2s }\n",
           -1,
           EH(2, 33,
              "'duplicate after 2s' cannot happen at that time: listener 'vt' has a "
              "consumer-timeout of 1500ms, which hands the message out again first (an ack twice "
              "holds counts as not acked)",
              "make it shorter than 1500ms; for a copy 2s after the delivery, 'do expire 2s' on "
              "these deliveries with 'do drop' on their acks (docs/rules.md, late copies past a "
              "visibility timeout)"));
    /* the option's shape, as for reset's `after` */
    EXPECT(MQ "rule r on mq { when ack; do redeliver after }\n", -1,
           E(2, 39, "'after' needs a value: after DURATION"));
    EXPECT(MQ "rule r on mq { when ack; do redeliver later 5s }\n", -1,
           EH(2, 39, "unknown 'do redeliver' option 'later'", "did you mean 'after'?"));
}

#define AMQP_EVENTS "its events: connect, deliver, ack, nack, publish, confirm"
#define AMQP_ACK_ACTIONS "it can do: redeliver, delay, drop, close, error"
#define AMQP_PUBLISH_ACTIONS "it can do: duplicate, delay, drop, close, error"
#define AMQP_CONFIRM_ACTIONS "it can do: drop, close"
#define AMQP_ACK_MATCHERS                                                                          \
    "it can match: queue, exchange, routing_key, consumer_tag, message_id, task, client, "         \
    "redelivered"

static void test_caps_amqp_errors(void **state)
{
    (void)state;
    /* no `do`: what this listener can do on acks, never a stream action it cannot */
    EXPECT(MQ_RULE("when ack queue=payments"), -1,
           EH(2, 1, "rule 'r' has no 'do ACTION'",
              "e.g. do redeliver; listener 'mq' (protocol amqp) can do on 'ack' events: "
              "redeliver, delay, drop, close, error"));
    EXPECT(MQ_RULE("when confirm"), -1,
           EH(2, 1, "rule 'r' has no 'do ACTION'",
              "e.g. do drop; listener 'mq' (protocol amqp) can do on 'confirm' events: drop, "
              "close"));
    /* an unknown listener or event: nothing to offer */
    EXPECT(MQ "rule r on nosuch {\n    when ack\n}\n", -1, E(2, 1, "rule 'r' has no 'do ACTION'"),
           E(2, 11, "unknown listener 'nosuch'"));
    EXPECT(MQ_RULE("when ack queue=payments; do duplicate"), -1,
           EH(3, 33,
              "listener 'mq' (protocol amqp) cannot do 'duplicate' on 'ack' events: it sends a "
              "message twice: use it on 'deliver' (a second copy to a consumer) or 'publish' "
              "(the broker gets it twice)",
              AMQP_ACK_ACTIONS));
    EXPECT_CLEAN(MQ_RULE("when publish task=tasks.charge; do duplicate"));
    EXPECT(MQ_RULE("when ack; do expire 1s"), -1,
           EH(3, 18,
              "listener 'mq' (protocol amqp) cannot do 'expire' on 'ack' events: it hands a "
              "delivered message out again: use it on 'deliver'",
              AMQP_ACK_ACTIONS));
    EXPECT(MQ_RULE("when confirm; do delay 1s"), -1,
           EH(3, 22,
              "listener 'mq' (protocol amqp) cannot do 'delay' on 'confirm' events: a confirm "
              "can be dropped, not delayed",
              AMQP_CONFIRM_ACTIONS));
    EXPECT(MQ_RULE("when confirm; do error 406"), -1,
           EH(3, 22,
              "listener 'mq' (protocol amqp) cannot do 'error' on 'confirm' events: the broker "
              "cannot refuse its own confirm",
              AMQP_CONFIRM_ACTIONS));
    EXPECT(MQ_RULE("when publish; do redeliver"), -1,
           EH(3, 22,
              "listener 'mq' (protocol amqp) cannot do 'redeliver' on 'publish' events: "
              "redeliver loses an ack after the work was done: use it on 'ack'",
              AMQP_PUBLISH_ACTIONS));
    /* an action the table leaves out with no reason: no ": reason" */
    EXPECT(MQ_RULE("when connect; do drop"), -1,
           EH(3, 22, "listener 'mq' (protocol amqp) cannot do 'drop' on 'connect' events",
              "it can do: delay, close, latency, bandwidth, slice, reset, blackhole, slow-close, "
              "limit"));
    EXPECT(MQ_RULE("when command command=BRPOP; do drop"), -1,
           EH(3, 10,
              "listener 'mq' (protocol amqp) has no 'command' event: 'command' is an escape "
              "hatch of protocol resp",
              AMQP_EVENTS));
    /* headers are read from the content header, which an ack does not carry */
    EXPECT(MQ_RULE("when ack header.x=1 body~y queue=q; do drop"), -1,
           EH(3, 14,
              "'header.x' cannot be matched on 'ack' events of listener 'mq' (protocol amqp)",
              AMQP_ACK_MATCHERS),
           EH(3, 25, "'body' cannot be matched on 'ack' events of listener 'mq' (protocol amqp)",
              AMQP_ACK_MATCHERS));
    /* a bad matcher and a bad action are both reported */
    EXPECT(MQ_RULE("when confirm header.x=1; do delay 1s"), -1,
           EH(3, 18,
              "'header.x' cannot be matched on 'confirm' events of listener 'mq' (protocol amqp)",
              "it can match: queue, exchange, routing_key, message_id, task, client"),
           EH(3, 33,
              "listener 'mq' (protocol amqp) cannot do 'delay' on 'confirm' events: a confirm "
              "can be dropped, not delayed",
              AMQP_CONFIRM_ACTIONS));
    /* PUT /rules is checked against the same table */
    {
        struct conf_diags bd;
        struct conf *base = parse_ok(TCP MQ, &bd);

        EXPECT_RULES(base, "rule a on mq { when publish; do redeliver }\n", -1,
                     EH(1, 33,
                        "listener 'mq' (protocol amqp) cannot do 'redeliver' on 'publish' events: "
                        "redeliver loses an ack after the work was done: use it on 'ack'",
                        AMQP_PUBLISH_ACTIONS));
        const char *rule = "rule a on mq { when ack queue=payments; do redeliver }\n";
        expect_diags(__FILE__, __LINE__, base, rule, strlen(rule), 0, NULL, 0);
        conf_free(base);
        conf_diags_free(&bd);
    }
}

/* ---- conf_parse_rules: the body of PUT /rules ---- */

static struct conf *base_conf(struct conf_diags *d)
{
    return parse_ok(TCP MQ "rule old on t { do latency 1ms }\n", d);
}

/* One rule acts on an event, the first that fires: a rule that shares its events with an earlier
 * rule without a trigger never acts on them, and twice check says so, naming both. */
#define OVERLAP_HINT                                                                               \
    "one rule acts on an event, the first in the file that fires: narrow one 'when', give the "    \
    "earlier rule a trigger, or put this one first"
#define SHARED(later, ev, earlier)                                                                 \
    "rule '" later "' never acts on the '" ev "' events it shares with rule " earlier              \
    ", which comes first and faults each of them (only copies past max-per-message are left to "   \
    "it)"

static void test_overlapping_rules(void **state)
{
    (void)state;
    EXPECT(MQ "rule lost on mq { when ack queue=pay*; do redeliver }\n"
              "rule slow on mq { when ack; probability 5%; do delay 5s }\n",
           0, {3, 1, CONF_WARNING, SHARED("slow", "ack", "'lost' (t.conf:2)"), OVERLAP_HINT});
    EXPECT(MQ "rule a on mq { when deliver; do duplicate }\n"
              "rule b on mq { when deliver task=x; do drop }\n"
              "rule c on mq { when deliver queue=q; every 2; do delay 1s }\n",
           0, {3, 1, CONF_WARNING, SHARED("b", "deliver", "'a' (t.conf:2)"), OVERLAP_HINT},
           {4, 1, CONF_WARNING,
            "rule 'c' never acts on the 'deliver' events it shares with rules 'a' (t.conf:2) or "
            "'b' (t.conf:3), which come first and fault each of them (only copies past "
            "max-per-message are left to it)",
            OVERLAP_HINT});
    /* an earlier rule with a trigger leaves events to the later one */
    EXPECT_CLEAN(MQ "rule lost on mq { when ack; probability 8%; do redeliver }\n"
                    "rule cut on mq { when ack; first 3; do close before }\n"
                    "rule late on mq { when ack; between 0s 1m; do drop }\n"
                    "rule last on mq { when ack; limit 9; do drop }\n"
                    "rule slow on mq { when ack; do delay 5s }\n");
    /* rules that exclude each other, or do not share an event */
    static const char *const apart[][2] = {
        {"when ack queue=a", "when ack queue=b"},
        {"when ack queue=pay*", "when ack queue=emails"},
        {"when ack queue=emails", "when ack queue=pay*"},
        {"when ack queue=payments", "when ack queue!=pay*"},
        {"when ack queue!=payments", "when ack queue=payments task=t"},
        {"when deliver redelivered=true", "when deliver redelivered=false"},
        {"when deliver redelivered=true", "when deliver redelivered!=true"},
        {"when deliver client=10.0.0.0/8", "when deliver client=192.168.0.0/16"},
        {"when ack", "when nack"},
        {"when connect", "when connect"},
        {"when publish header.x=1", "when publish header.x=2"},
    };
    for (size_t i = 0; i < sizeof(apart) / sizeof(apart[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 MQ "rule a on mq { %s; do drop }\nrule b on mq { %s; do close before }\n",
                 apart[i][0], apart[i][1]);
        EXPECT_CLEAN(text);
    }
    /* an earlier rule written `disabled` leaves them until it is switched on */
    EXPECT_CLEAN(MQ "rule a on mq { when ack; do drop; disabled }\n"
                    "rule b on mq { when ack; do redeliver }\n");
    EXPECT_CLEAN(MQ "listen mq2 { protocol amqp; bind 127.0.0.1:5; upstream 127.0.0.1:6 }\n"
                    "rule a on mq { when ack; do drop }\n"
                    "rule b on mq2 { when ack; do drop }\n"
                    "rule c on mq { do latency 1ms }\n"
                    "rule d on mq { do bandwidth 1MB/s }\n");
    EXPECT(MQ "rule a on mq { when deliver redelivered=false; do duplicate }\n"
              "rule b on mq { when deliver redelivered!=true; do drop }\n",
           0, {3, 1, CONF_WARNING, SHARED("b", "deliver", "'a' (t.conf:2)"), OVERLAP_HINT});
}

static void test_parse_rules(void **state)
{
    struct conf_diags d, bd;
    struct conf *base = base_conf(&bd);
    const char *text = "# new rules\n"
                       "rule jitter on t { do latency 20ms jitter 5ms }\n"
                       "rule slow-ack on mq {\n"
                       "    when ack queue=emails\n"
                       "    probability 5%\n"
                       "    do delay 45s\n"
                       "}\n";
    struct rule *rules = (struct rule *)&d; /* must be overwritten */
    size_t n = 99;

    (void)state;
    conf_diags_init(&d);
    assert_int_equal(conf_parse_rules("put", text, strlen(text), base, &rules, &n, &d), 0);
    assert_int_equal(d.errors + d.warnings, 0);
    assert_string_equal(d.file, "put");
    assert_int_equal(n, 2);
    assert_string_equal(rules->name, "jitter");
    assert_int_equal(rules->loc.line, 2);
    assert_int_equal(rules->action.jitter_ms, 5);
    assert_string_equal(rules->next->name, "slow-ack");
    assert_int_equal(rules->next->event, RULE_EV_ACK);
    assert_true(rules->next->trigger.probability == 0.05);
    assert_null(rules->next->next);
    /* the base is only read */
    assert_int_equal(base->n_rules, 1);
    assert_string_equal(base->rules->name, "old");
    /* the new rules are judged among themselves: one that never acts is a warning */
    EXPECT_RULES(base,
                 "rule a on mq { when ack; do drop }\nrule b on mq { when ack; do redeliver }\n", 0,
                 {2, 1, CONF_WARNING, SHARED("b", "ack", "'a' (t.rules:1)"), OVERLAP_HINT});
    rule_list_free(rules);
    conf_diags_free(&d);

    /* nothing but comments: no rules, no error */
    conf_diags_init(&d);
    assert_int_equal(conf_parse_rules("put", "# off\n", 6, base, &rules, &n, &d), 0);
    assert_null(rules);
    assert_int_equal(n, 0);
    conf_diags_free(&d);
    conf_diags_init(&d);
    assert_int_equal(conf_parse_rules("put", NULL, 0, base, &rules, &n, &d), 0);
    assert_null(rules);
    conf_diags_free(&d);
    conf_free(base);
    conf_diags_free(&bd);
}

static void test_parse_rules_errors(void **state)
{
    struct conf_diags bd;
    struct conf *base = base_conf(&bd);

    (void)state;
    EXPECT_RULES(base, "rule a on tt { do latency 1ms }\n", -1,
                 EH(1, 11, "unknown listener 'tt'", "did you mean 't'?"));
    EXPECT_RULES(base, "rule a on t { do latency 1ms }\n" TCP "seed 4\n", -1,
                 EH(2, 1, "only rule blocks are allowed here",
                    "listeners and globals are set in the configuration file"),
                 EH(3, 1, "only rule blocks are allowed here",
                    "listeners and globals are set in the configuration file"));
    /* the old rules are replaced, so reusing a name is fine; twice in the text is not */
    EXPECT_RULES(base, "rule old on t { do latency 1ms }\nrule old on t { do reset }\n", -1,
                 E(2, 6, "rule 'old' is already defined at 1:1"));
    EXPECT_RULES(base, "rule a on t { when ack; do drop }\n", -1,
                 EH(1, 20, "listener 't' (protocol tcp) has no 'ack' event: " TCP_NO_MESSAGES,
                    "its events: connect"));
    EXPECT_RULES(base, "rule a on t { do latency 1ms \"x", -1,
                 E(1, 13, "'{' opened here is never closed"), E(1, 30, "unterminated string"),
                 EH(1, 30, "unknown 'do latency' option 'x'",
                    "usage: do latency DURATION [jitter DURATION]"));
    conf_free(base);
    conf_diags_free(&bd);
}

/* ---- allocation failures ---- */

static void test_out_of_memory(void **state)
{
    struct conf_diags bd;
    struct conf *base = base_conf(&bd);
    char many[1024] = MQ "rule many on mq {\n    when ack";

    (void)state;
    for (int i = 0; i < 9; i++) {
        strcat(many, " queue=\"q\"x header.h~\"v\"");
    }
    strcat(many, "\n    do drop\n}\n");
    parse_with_failing_allocations(NULL, message_rules, 0);
    parse_with_failing_allocations(NULL, stream_rules, 0);
    parse_with_failing_allocations(NULL, many, 0);
    parse_with_failing_allocations(NULL,
                                   "seed 1\njournal j\nadmin 0.0.0.0:3\n"
                                   "admin-token 0123456789abcdefg\n" TCP,
                                   0);
    parse_with_failing_allocations(NULL,
                                   TCP
                                   "rule r on t { when ack qeue=x body~ \"y\"; every 0; do x }\n"
                                   "rule r on t { do error 406; stream up }\nrule q on u { }\n",
                                   -1);
    parse_with_failing_allocations(base, "rule a on mq { when deliver client=::1; do duplicate }\n",
                                   0);
    parse_with_failing_allocations(base, "rule a on x { do latency 1ms }\nlisten y { }\n", -1);
    conf_free(base);
    conf_diags_free(&bd);
}

/* ---- robustness ---- */

static uint64_t rng_state;

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static size_t rng_below(size_t n)
{
    return n == 0 ? 0 : (size_t)(rng_next() % n);
}

/* A parsed rule must be whole, whatever text produced it. */
static void check_rule(const struct rule *r)
{
    assert_non_null(r->name);
    assert_non_null(r->listener);
    assert_true(r->event < RULE_EV_COUNT);
    assert_true(r->action.kind < RULE_ACT_COUNT);
    assert_true(r->n_matchers <= 32);
    assert_true(r->direction >= RULE_DIR_UPSTREAM && r->direction <= RULE_DIR_BOTH);
    assert_true(r->event != RULE_EV_STREAM || rule_action_is_stream(r->action.kind));
    assert_true(!r->trigger.has_probability ||
                (r->trigger.probability > 0 && r->trigger.probability <= 1));
    assert_true(r->trigger.max_per_message >= 1);
    assert_true(!r->trigger.has_between || r->trigger.between_start_ms < r->trigger.between_end_ms);
    assert_true((r->action.kind == RULE_ACT_ERROR) == (r->action.error_code != NULL));
    for (size_t i = 0; i < r->n_matchers; i++) {
        assert_non_null(r->matchers[i].value);
        assert_true((r->matchers[i].field == RULE_F_HEADER) == (r->matchers[i].header != NULL));
    }
}

/* Parse arbitrary bytes: the result must be coherent, whatever they are.
 * Returns how many rules were accepted. */
static size_t check_garbage(const char *text, size_t len)
{
    size_t n = 0;
    struct conf_diags d;
    struct conf *c = NULL;
    int rc;

    conf_diags_init(&d);
    rc = conf_parse_string("g.conf", text, len, &c, &d);
    assert_true(rc == 0 || rc == -1);
    if (rc == -1) {
        assert_null(c);
        assert_true(d.errors >= 1);
    } else {
        for (const struct rule *r = c->rules; r != NULL; r = r->next, n++) {
            check_rule(r);
        }
        assert_int_equal(n, c->n_rules);
    }
    for (const struct conf_diag *g = d.head; g != NULL; g = g->next) {
        assert_non_null(g->msg);
        assert_true(g->loc.line == 0 || g->loc.col >= 1);
    }
    conf_free(c);
    conf_diags_free(&d);
    return n;
}

static const char *const fragments[] = {
    TCP,
    MQ,
    "rule",
    "r",
    "on",
    "t",
    "mq",
    "{",
    "}",
    ";",
    "\n",
    " ",
    "when",
    "connect",
    "ack",
    "deliver",
    "do",
    "latency",
    "20ms",
    "jitter",
    "5ms",
    "0s",
    "redeliver",
    "close",
    "before",
    "bandwidth",
    "100KB/s",
    "1MiB",
    "slice",
    "delay",
    "reset",
    "after",
    "limit",
    "5",
    "0",
    "every",
    "nth",
    "between",
    "10m",
    "probability",
    "5%",
    "0.5",
    "150%",
    "stream",
    "both",
    "disabled",
    "max-per-message",
    "queue=",
    "body~",
    "\"x y\"",
    "\"",
    "client=",
    "::1/128",
    "10.0.0.0/8",
    "header.h=",
    "redelivered=true",
    "task~",
    "*",
    "error",
    "406",
    "#",
    "seed",
    "42",
    "admin",
    "127.0.0.1:9",
    "admin-token",
    "journal",
    "j",
};

/* Random text made of pieces of the language, glued or not. */
static size_t make_fragment_soup(char *buf, size_t cap)
{
    size_t len = 0, n = rng_below(60);

    for (size_t i = 0; i < n; i++) {
        const char *f = fragments[rng_below(sizeof(fragments) / sizeof(fragments[0]))];
        size_t flen = strlen(f);
        if (len + flen + 2 > cap) {
            break;
        }
        memcpy(buf + len, f, flen);
        len += flen;
        if (rng_below(3) != 0) {
            buf[len++] = rng_below(16) == 0 ? (char)rng_below(256) : ' ';
        }
    }
    return len;
}

/* A valid rule file with a few random edits. */
static size_t make_mutant(char *buf, size_t cap)
{
    size_t len = strlen(message_rules), edits = 1 + rng_below(4);

    memcpy(buf, message_rules, len);
    for (size_t e = 0; e < edits && len > 0; e++) {
        size_t at = rng_below(len);
        if (rng_below(2) == 0) {
            buf[at] = "{}\";#\\\n =~!*%/"[rng_below(14)];
        } else {
            size_t n = 1 + rng_below(len - at < 20 ? len - at : 20);
            if (len + n < cap) {
                memmove(buf + at + n, buf + at, len - at);
                len += n;
            }
        }
    }
    return len;
}

static void test_garbage(void **state)
{
    char buf[4096];
    size_t accepted = 0;

    (void)state;
    rng_state = 0x72756c6573ull; /* "rules" */
    for (int i = 0; i < 3000; i++) {
        accepted += check_garbage(buf, make_fragment_soup(buf, sizeof(buf)));
    }
    for (int i = 0; i < 1500; i++) {
        accepted += check_garbage(buf, make_mutant(buf, sizeof(buf)));
    }
    /* some edits leave the file valid: the checks above saw real rules */
    assert_true(accepted > 100);
}

/* ---- faults of the rules that fired (rules/plan.h) ---- */

/* What a command's rule asks (a Redis listener's `command` event): the actions on a command as
 * data, the others left to whom they belong. */
static void test_rule_cmd_fault(void **state)
{
    (void)state;
    struct rule r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(rule_cmd_fault(NULL).kind, JOB_FAULT_NONE);
    assert_null(rule_cmd_fault(NULL).rule);

    char code[] = "READONLY";
    r.action.kind = RULE_ACT_ERROR;
    r.action.error_code = code;
    struct job_fault f = rule_cmd_fault(&r);
    assert_int_equal(f.kind, JOB_FAULT_ERROR);
    assert_ptr_equal(f.rule, &r);

    r.action = (struct rule_action){.kind = RULE_ACT_DELAY, .duration_ms = 1500};
    f = rule_cmd_fault(&r);
    assert_int_equal(f.kind, JOB_FAULT_DELAY);
    assert_int_equal(f.ms, 1500);

    r.action = (struct rule_action){.kind = RULE_ACT_DROP};
    assert_int_equal(rule_cmd_fault(&r).kind, JOB_FAULT_DROP);

    r.action = (struct rule_action){.kind = RULE_ACT_CLOSE, .close_when = RULE_CLOSE_BEFORE};
    f = rule_cmd_fault(&r);
    assert_int_equal(f.kind, JOB_FAULT_CLOSE);
    assert_true(f.before);
    r.action.close_when = RULE_CLOSE_AFTER;
    f = rule_cmd_fault(&r);
    assert_int_equal(f.kind, JOB_FAULT_CLOSE);
    assert_false(f.before);

    /* Not a command's: a stream action is the shaper's, redeliver a job's. */
    static const enum rule_action_kind others[] = {RULE_ACT_LATENCY, RULE_ACT_BLACKHOLE,
                                                   RULE_ACT_REDELIVER, RULE_ACT_DUPLICATE};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        r.action = (struct rule_action){.kind = others[i]};
        assert_int_equal(rule_cmd_fault(&r).kind, JOB_FAULT_OTHER);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_globals),
        cmocka_unit_test(test_global_errors),
        cmocka_unit_test(test_rule_defaults),
        cmocka_unit_test(test_stream_actions),
        cmocka_unit_test(test_byte_units),
        cmocka_unit_test(test_connect_rules),
        cmocka_unit_test(test_message_rules),
        cmocka_unit_test(test_message_rules_more),
        cmocka_unit_test(test_probability_forms),
        cmocka_unit_test(test_probability_fraction_warns),
        cmocka_unit_test(test_rule_text),
        cmocka_unit_test_setup_teardown(test_action_text, use_real_tables, use_test_tables),
        cmocka_unit_test(test_when_errors),
        cmocka_unit_test(test_when_quoting),
        cmocka_unit_test(test_too_many_matchers),
        cmocka_unit_test(test_trigger_errors),
        cmocka_unit_test(test_do_errors),
        cmocka_unit_test(test_byte_errors),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_block_keywords),
        cmocka_unit_test(test_rule_listener),
        cmocka_unit_test(test_caps_tcp),
        cmocka_unit_test(test_caps_tables),
        cmocka_unit_test_setup_teardown(test_caps_resp, use_real_resp, use_narrow_resp),
        cmocka_unit_test_setup_teardown(test_caps_amqp_valid, use_real_amqp, use_everything_amqp),
        cmocka_unit_test_setup_teardown(test_caps_late, use_real_tables, use_test_tables),
        cmocka_unit_test_setup_teardown(test_caps_amqp_errors, use_real_amqp, use_everything_amqp),
        cmocka_unit_test(test_overlapping_rules),
        cmocka_unit_test(test_parse_rules),
        cmocka_unit_test(test_parse_rules_errors),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_rule_cmd_fault),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
