/*
 * test_engine.c - rule decisions: determinism, triggers, matchers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rules/conf_mem.h"
#include "rules/engine.h"
#include "rules/plan.h"
#include "tests/lib/conf_testkit.h"

static struct rule make_rule(const char *name, enum rule_event ev)
{
    struct rule r;
    memset(&r, 0, sizeof(r));
    r.name = (char *)name;
    r.listener = (char *)"jobs";
    r.event = ev;
    r.enabled = true;
    r.action.kind = RULE_ACT_REDELIVER;
    r.trigger.max_per_message = 1;
    return r;
}

static struct engine_event message(const char *id)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event = RULE_EV_ACK;
    ev.message_id = id;
    ev.identity = id;
    ev.queue = "payments";
    ev.task = "billing.charge";
    return ev;
}

/* Decide one event against a one-rule set; true when the rule fires. */
static bool fires(struct ruleset *rs, const struct engine_event *ev, uint64_t now_ms)
{
    size_t hits[4];
    return ruleset_decide(rs, "jobs", ev, now_ms, hits, 4) == 1;
}

static void id_of(char *buf, size_t len, unsigned i)
{
    snprintf(buf, len, "msg-%08u", i);
}

/* Faulted ids of `n` distinct ids visited in `order`, as a bitmap. */
static void faulted_set(uint64_t seed, const unsigned *order, unsigned n, uint8_t *out)
{
    struct rule r = make_rule("lost-ack", RULE_EV_ACK);
    r.trigger.has_probability = true;
    r.trigger.probability = 0.10;
    struct ruleset *rs = ruleset_new(&r, seed, 0);
    assert_non_null(rs);
    memset(out, 0, n);
    for (unsigned k = 0; k < n; k++) {
        char id[32];
        id_of(id, sizeof(id), order[k]);
        struct engine_event ev = message(id);
        out[order[k]] = fires(rs, &ev, 0);
    }
    ruleset_put(rs);
}

static void test_same_seed_same_ids_whatever_the_order(void **state)
{
    (void)state;
    enum { N = 20000 };
    static unsigned fwd[N], shuffled[N];
    static uint8_t a[N], b[N];
    for (unsigned i = 0; i < N; i++)
        fwd[i] = shuffled[i] = i;
    srand(7);
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)rand() % (i + 1), t = shuffled[i];
        shuffled[i] = shuffled[j];
        shuffled[j] = t;
    }
    faulted_set(42, fwd, N, a);
    faulted_set(42, shuffled, N, b);
    assert_memory_equal(a, b, N);
}

static void test_different_seeds_fault_different_sets(void **state)
{
    (void)state;
    enum { N = 20000 };
    static unsigned order[N];
    static uint8_t a[N], b[N];
    for (unsigned i = 0; i < N; i++)
        order[i] = i;
    faulted_set(1, order, N, a);
    faulted_set(2, order, N, b);
    unsigned differ = 0;
    for (unsigned i = 0; i < N; i++)
        differ += a[i] != b[i];
    /* Two independent 10% draws disagree on about 18% of ids. */
    assert_true(differ > N / 10);
}

static void test_probability_10_percent_within_1_percent(void **state)
{
    (void)state;
    enum { N = 100000 };
    struct rule r = make_rule("p10", RULE_EV_ACK);
    r.trigger.has_probability = true;
    r.trigger.probability = 0.10;
    struct ruleset *rs = ruleset_new(&r, 12345, 0);
    unsigned hits = 0;
    for (unsigned i = 0; i < N; i++) {
        char id[32];
        id_of(id, sizeof(id), i);
        struct engine_event ev = message(id);
        hits += fires(rs, &ev, 0);
    }
    ruleset_put(rs);
    assert_in_range(hits, N / 10 - N / 100, N / 10 + N / 100);
}

static void test_coin_is_a_pure_function(void **state)
{
    (void)state;
    double a = engine_coin(9, "r", "id-1", 0);
    assert_true(a >= 0.0 && a < 1.0);
    assert_true(a == engine_coin(9, "r", "id-1", 0));
    assert_true(a != engine_coin(9, "r", "id-1", 1));
    assert_true(a != engine_coin(9, "other", "id-1", 0));
    assert_true(a != engine_coin(10, "r", "id-1", 0));
}

/* Run `n` distinct messages through `r`; bit k of the result is event k+1. */
static uint64_t pattern(struct rule *r, unsigned n)
{
    struct ruleset *rs = ruleset_new(r, 1, 0);
    uint64_t bits = 0;
    for (unsigned i = 0; i < n; i++) {
        char id[32];
        id_of(id, sizeof(id), i);
        struct engine_event ev = message(id);
        if (fires(rs, &ev, 0))
            bits |= 1ULL << i;
    }
    ruleset_put(rs);
    return bits;
}

static void test_counting_triggers(void **state)
{
    (void)state;
    struct rule r = make_rule("c", RULE_EV_ACK);
    r.trigger.every = 3;
    assert_int_equal(pattern(&r, 10), (1u << 2) | (1u << 5) | (1u << 8));
    r = make_rule("c", RULE_EV_ACK);
    r.trigger.nth = 4;
    assert_int_equal(pattern(&r, 10), 1u << 3);
    r = make_rule("c", RULE_EV_ACK);
    r.trigger.first = 2;
    assert_int_equal(pattern(&r, 10), 0x3);
    r = make_rule("c", RULE_EV_ACK);
    r.trigger.after = 8;
    assert_int_equal(pattern(&r, 10), (1u << 8) | (1u << 9));
    r = make_rule("c", RULE_EV_ACK);
    r.trigger.limit = 3;
    assert_int_equal(pattern(&r, 10), 0x7);
    r = make_rule("c", RULE_EV_ACK);
    r.trigger.every = 2;
    r.trigger.limit = 2;
    assert_int_equal(pattern(&r, 10), (1u << 1) | (1u << 3));
}

static void test_between_window(void **state)
{
    (void)state;
    struct rule r = make_rule("w", RULE_EV_ACK);
    r.trigger.has_between = true;
    r.trigger.between_start_ms = 10000;
    r.trigger.between_end_ms = 20000;
    struct ruleset *rs = ruleset_new(&r, 1, 1000);
    struct engine_event a = message("a"), b = message("b"), c = message("c");
    assert_false(fires(rs, &a, 1000 + 9999));
    assert_true(fires(rs, &b, 1000 + 10000));
    assert_false(fires(rs, &c, 1000 + 20000));
    ruleset_put(rs);
}

static void test_per_message_cap(void **state)
{
    (void)state;
    struct rule r = make_rule("cap", RULE_EV_ACK);
    struct ruleset *rs = ruleset_new(&r, 1, 0);
    struct engine_event ev = message("same");
    assert_true(fires(rs, &ev, 0));
    assert_false(fires(rs, &ev, 0)); /* default: at most once per message */
    ruleset_put(rs);

    r.trigger.max_per_message = 3;
    rs = ruleset_new(&r, 1, 0);
    unsigned n = 0;
    for (int i = 0; i < 10; i++)
        n += fires(rs, &ev, 0);
    assert_int_equal(n, 3);
    assert_int_equal(ruleset_stats(rs, 0).seen, 10);
    assert_int_equal(ruleset_stats(rs, 0).faults, 3);
    ruleset_put(rs);
}

/* Copies of a faulted message (its redeliveries) are refused by the cap and
 * must not use up `first`: the first 3 distinct messages are faulted. */
static void test_capped_events_do_not_count(void **state)
{
    (void)state;
    struct rule r = make_rule("first3", RULE_EV_ACK);
    r.trigger.first = 3;
    struct ruleset *rs = ruleset_new(&r, 1, 0);
    const char *order[] = {"a", "a", "b", "b", "c", "a", "d", "e"};
    char got[16] = "";
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        struct engine_event ev = message(order[i]);
        if (fires(rs, &ev, 0))
            strcat(got, order[i]);
    }
    assert_string_equal(got, "abc");
    assert_int_equal(ruleset_stats(rs, 0).seen, 8);
    ruleset_put(rs);
}

/* A message without an id gets a new identity per delivery: its redelivered
 * copies would each look new, and an unconditional redeliver would loop for
 * ever.  A redelivered anonymous delivery is past the cap, even at 3, and does
 * not count toward `every`. */
static void test_anonymous_redelivery_is_capped(void **state)
{
    (void)state;
    struct rule r = make_rule("loop", RULE_EV_ACK);
    r.trigger.max_per_message = 3;
    r.trigger.every = 1;
    struct ruleset *rs = ruleset_new(&r, 1, 0);
    unsigned n = 0;
    for (unsigned i = 0; i < 10; i++) {
        char id[32];
        snprintf(id, sizeof(id), "anon:1:1:%u", i + 1);
        struct engine_event ev = message(NULL);
        ev.identity = id;
        ev.anonymous = true;
        ev.redelivered = i > 0; /* the broker marks every copy */
        n += fires(rs, &ev, 0);
    }
    assert_int_equal(n, 1);
    /* A first delivery of another message without an id is faulted. */
    struct engine_event fresh = message(NULL);
    fresh.identity = "anon:1:1:99";
    fresh.anonymous = true;
    assert_true(fires(rs, &fresh, 0));
    /* With an id, a redelivered copy is still judged by the cap alone. */
    struct engine_event named = message("m1");
    named.redelivered = true;
    assert_true(fires(rs, &named, 0));
    ruleset_put(rs);
}

static const char *headers(const void *ctx, const char *name)
{
    (void)ctx;
    return strcmp(name, "x-tenant") == 0 ? "acme" : NULL;
}

static void test_matchers(void **state)
{
    (void)state;
    struct rule_matcher m[6];
    memset(m, 0, sizeof(m));
    m[0] = (struct rule_matcher){
        .field = RULE_F_QUEUE, .op = RULE_OP_EQ, .value = (char *)"pay*", .is_glob = true};
    m[1] = (struct rule_matcher){
        .field = RULE_F_TASK, .op = RULE_OP_NE, .value = (char *)"billing.refund"};
    m[2] = (struct rule_matcher){
        .field = RULE_F_BODY, .op = RULE_OP_CONTAINS, .value = (char *)"card"};
    m[3] =
        (struct rule_matcher){.field = RULE_F_REDELIVERED, .op = RULE_OP_EQ, .bool_value = false};
    m[4] = (struct rule_matcher){.field = RULE_F_HEADER,
                                 .op = RULE_OP_EQ,
                                 .header = (char *)"x-tenant",
                                 .value = (char *)"acme"};
    m[5] = (struct rule_matcher){.field = RULE_F_CLIENT, .op = RULE_OP_EQ, .cidr_prefix = 96 + 8};
    m[5].cidr_addr[10] = m[5].cidr_addr[11] = 0xff;
    m[5].cidr_addr[12] = 10;
    struct rule r = make_rule("m", RULE_EV_ACK);
    r.matchers = m;
    r.n_matchers = 6;
    r.trigger.max_per_message = 100;
    struct ruleset *rs = ruleset_new(&r, 1, 0);

    static const uint8_t body[] = "{\"card\": 1}";
    struct engine_event ev = message("x");
    ev.body = body;
    ev.body_len = sizeof(body) - 1;
    ev.header = headers;
    ev.has_client = true;
    ev.client[10] = ev.client[11] = 0xff;
    ev.client[12] = 10;
    ev.client[15] = 7;
    assert_true(fires(rs, &ev, 0));
    ev.client[12] = 11; /* 11.0.0.7 is outside 10.0.0.0/8 */
    assert_false(fires(rs, &ev, 0));
    ev.client[12] = 10;
    ev.redelivered = true;
    assert_false(fires(rs, &ev, 0));
    ev.redelivered = false;
    ev.task = "billing.refund";
    assert_false(fires(rs, &ev, 0));
    ev.task = NULL; /* unknown task: != holds */
    assert_true(fires(rs, &ev, 0));
    ev.queue = "emails";
    assert_false(fires(rs, &ev, 0));
    ruleset_put(rs);
}

static void test_enable_kill_switch_and_listener(void **state)
{
    (void)state;
    struct rule r = make_rule("k", RULE_EV_ACK);
    r.trigger.max_per_message = 1000;
    struct ruleset *rs = ruleset_new(&r, 1, 0);
    struct engine_event ev = message("a");
    size_t hits[2];
    assert_int_equal(ruleset_decide(rs, "other", &ev, 0, hits, 2), 0);
    assert_true(fires(rs, &ev, 0));
    ruleset_set_faults_enabled(rs, false);
    assert_false(fires(rs, &ev, 0));
    ruleset_set_faults_enabled(rs, true);
    ruleset_set_enabled(rs, 0, false);
    assert_false(fires(rs, &ev, 0));
    ev.event = RULE_EV_DELIVER;
    ruleset_set_enabled(rs, 0, true);
    assert_false(fires(rs, &ev, 0)); /* wrong event */
    assert_int_equal(ruleset_find(rs, "k"), 0);
    assert_int_equal(ruleset_find(rs, "nope"), -1);

    struct ruleset *next = ruleset_new(&r, 1, 0);
    ruleset_set_enabled(rs, 0, false);
    ruleset_inherit(next, rs);
    assert_false(ruleset_enabled(next, 0));
    assert_int_equal(ruleset_stats(next, 0).faults, ruleset_stats(rs, 0).faults);
    ruleset_put(next);
    ruleset_put(rs);
}

/* After a reload, a loop that has not switched yet decides against the old
 * ruleset: what it counts must count for the new one (limit, nth), and a
 * switch flipped on the new one must stop the old one too. */
static void reloaded(const struct rule *r, struct ruleset **old, struct ruleset **next)
{
    *old = ruleset_new(r, 1, 0);
    *next = ruleset_new(r, 1, 0);
    ruleset_inherit(*next, *old);
}

static void test_inherit_shares_state(void **state)
{
    (void)state;
    struct rule r = make_rule("once", RULE_EV_ACK);
    r.trigger.limit = 1;
    r.trigger.max_per_message = 1000;
    struct ruleset *old, *next;
    reloaded(&r, &old, &next);
    struct engine_event ev = message("a");
    assert_true(fires(old, &ev, 0)); /* a loop still on the old rules */
    assert_int_equal(ruleset_stats(next, 0).faults, 1);
    assert_int_equal(ruleset_stats(next, 0).seen, 1);
    assert_false(fires(next, &ev, 0)); /* limit 1 is used up */
    assert_int_equal(ruleset_stats(old, 0).seen, 2);

    struct rule n = make_rule("tenth", RULE_EV_ACK);
    n.trigger.nth = 3;
    n.trigger.max_per_message = 1000;
    struct ruleset *a, *b;
    reloaded(&n, &a, &b);
    assert_false(fires(a, &ev, 0));
    assert_false(fires(b, &ev, 0));
    assert_true(fires(a, &ev, 0)); /* the third, whichever ruleset saw it */
    assert_false(fires(b, &ev, 0));

    ruleset_set_faults_enabled(b, false);
    assert_false(ruleset_faults_enabled(a));
    ruleset_set_faults_enabled(b, true);
    ruleset_set_enabled(b, 0, false);
    assert_false(ruleset_enabled(a, 0));
    ruleset_put(old); /* the shared state outlives the ruleset that made it */
    assert_int_equal(ruleset_stats(next, 0).faults, 1);
    ruleset_put(next);
    ruleset_put(a);
    ruleset_put(b);
}

static const char edit_conf[] = "listen jobs {\n"
                                "  protocol amqp\n"
                                "  bind 127.0.0.1:5673\n"
                                "  upstream 127.0.0.1:5672\n"
                                "}\n"
                                "rule a on jobs {\n"
                                "  when deliver queue=pay* header.x-kind!=test\n"
                                "  do duplicate\n"
                                "}\n"
                                "rule b on jobs {\n"
                                "  when deliver task=billing.charge\n"
                                "  do error 406\n"
                                "}\n"
                                "rule c on jobs {\n"
                                "  do latency 5ms\n"
                                "}\n";

/* The names of a rule list, "a,b,c". */
static void list_names(const struct rule *r, char *buf, size_t len)
{
    buf[0] = '\0';
    for (; r != NULL; r = r->next)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? "," : "", r->name);
}

struct edit_failing {
    struct ruleset *rs;
    struct rule *with;
    struct rule **list;
    size_t *n;
};

/* One edit, replacing rule a or adding `with` as a new one; out of memory leaves `with` alone. */
static void edit_failing_run(void *ctx, long nth)
{
    struct edit_failing *e = ctx;
    int rc = ruleset_edit(e->rs, nth % 2 ? "a" : "nosuch", e->with, e->list, e->n);
    if (kit_failed()) {
        assert_int_equal(rc, -1);
        assert_null(*e->list);
        assert_null(e->with->next);
    } else {
        assert_int_equal(rc, 0);
    }
}

/* ruleset_edit (PUT and DELETE /rules/NAME): the rule replaced in its place, added last, or
 * left out; the others copied whole, so that they outlive the configuration they came from;
 * out of memory at any allocation leaves `with` to the caller and leaks nothing. */
static void test_edit_replaces_adds_and_removes(void **state)
{
    (void)state;
    struct conf_diags d;
    struct conf *c = parse_ok(edit_conf, &d);
    conf_diags_free(&d);
    struct ruleset *rs = ruleset_new(c->rules, 1, 0);
    assert_non_null(rs);
    struct rule *with = rule_copy(c->rules->next); /* b */
    assert_non_null(with);
    with->action.kind = RULE_ACT_DROP;
    struct rule *list = NULL;
    size_t n = 0;
    char names[64];

    assert_int_equal(ruleset_edit(rs, "b", NULL, &list, &n), 0);
    list_names(list, names, sizeof(names));
    assert_string_equal(names, "a,c");
    assert_int_equal(n, 2);
    struct rule *kept = list;
    assert_int_equal(ruleset_edit(rs, "b", with, &list, &n), 0);
    list_names(list, names, sizeof(names));
    assert_string_equal(names, "a,b,c");
    assert_ptr_equal(list->next, with);
    rule_list_free(list);
    with = rule_copy(c->rules->next);
    assert_non_null(with);
    free(with->name);
    with->name = strdup("z");
    assert_int_equal(ruleset_edit(rs, "z", with, &list, &n), 0);
    list_names(list, names, sizeof(names));
    assert_string_equal(names, "a,b,c,z");
    assert_int_equal(n, 4);
    assert_int_equal(list->next->action.kind, RULE_ACT_ERROR);
    assert_string_equal(list->next->action.error_code, "406");
    rule_list_free(list);

    /* the copies live on without the configuration */
    ruleset_put(rs);
    conf_free(c);
    assert_int_equal(kept->n_matchers, 2);
    assert_string_equal(kept->matchers[0].value, "pay*");
    assert_string_equal(kept->matchers[1].header, "x-kind");
    assert_string_equal(kept->matchers[1].value, "test");
    assert_string_equal(kept->next->name, "c");

    rs = ruleset_new(kept, 1, 0);
    assert_non_null(rs);
    with = rule_copy(kept);
    assert_non_null(with);
    struct edit_failing e = {rs, with, &list, &n};
    assert_true(kit_each_allocation_fails(&kit_conf_mem_hook, edit_failing_run, &e) > 2);
    rule_list_free(list); /* `with` with it */
    ruleset_put(rs);
    rule_list_free(kept);
}

/* Two rules on the acks of one listener: one acts on each ack, the first in file order that
 * fires, and the second does not see that ack (not counted, no fault); it acts on the acks the
 * first leaves.  The same on every protocol: the engine decides it, not the codec. */
static void test_one_rule_acts_on_an_event(void **state)
{
    (void)state;
    struct rule r[2] = {make_rule("lost-ack", RULE_EV_ACK), make_rule("slow-ack", RULE_EV_ACK)};
    r[0].trigger.every = 2;
    r[1].action.kind = RULE_ACT_DELAY;
    r[0].next = &r[1];
    struct ruleset *rs = ruleset_new(r, 1, 0);
    size_t hits[8];
    char got[16] = "";
    const char *ids[] = {"a", "b", "c", "d"};
    for (size_t i = 0; i < 4; i++) {
        struct engine_event ev = message(ids[i]);
        assert_int_equal(ruleset_decide(rs, "jobs", &ev, 0, hits, 8), 1);
        strcat(got, hits[0] == 0 ? "L" : "S");
    }
    assert_string_equal(got, "SLSL"); /* every 2nd ack lost, the others slowed */
    assert_int_equal(ruleset_stats(rs, 0).seen, 4);
    assert_int_equal(ruleset_stats(rs, 0).faults, 2);
    assert_int_equal(ruleset_stats(rs, 1).seen, 2); /* only the acks lost-ack left */
    assert_int_equal(ruleset_stats(rs, 1).faults, 2);
    ruleset_put(rs);

    /* Connections collect every rule that fires: their effects add up. */
    struct rule c[2] = {make_rule("slow", RULE_EV_CONNECT), make_rule("thin", RULE_EV_CONNECT)};
    c[0].action.kind = RULE_ACT_LATENCY;
    c[1].action.kind = RULE_ACT_BANDWIDTH;
    c[0].next = &c[1];
    rs = ruleset_new(c, 1, 0);
    struct engine_event conn = message("session:1");
    conn.event = RULE_EV_CONNECT;
    assert_int_equal(ruleset_decide(rs, "jobs", &conn, 0, hits, 8), 2);
    ruleset_put(rs);
    assert_false(engine_event_combines(RULE_EV_DELIVER));
    assert_false(engine_event_combines(RULE_EV_COMMAND));
    assert_true(engine_event_combines(RULE_EV_STREAM));
}

/* The kinds of fault a listener's rules on an event make, disabled ones too (a codec prepares
 * for them: a reload or an enable may turn them on); other events' and listeners' not. */
static void test_fault_kinds(void **state)
{
    (void)state;
    struct rule r[4] = {make_rule("copy", RULE_EV_PUBLISH), make_rule("slow", RULE_EV_PUBLISH),
                        make_rule("lost", RULE_EV_ACK), make_rule("other", RULE_EV_PUBLISH)};
    r[0].action.kind = RULE_ACT_DUPLICATE;
    r[0].enabled = false;
    r[1].action.kind = RULE_ACT_DELAY;
    r[2].action.kind = RULE_ACT_DROP;
    r[3].action.kind = RULE_ACT_ERROR;
    r[3].listener = (char *)"elsewhere";
    r[0].next = &r[1];
    r[1].next = &r[2];
    r[2].next = &r[3];
    struct ruleset *rs = ruleset_new(r, 1, 0);
    assert_int_equal(ruleset_fault_kinds(rs, "jobs", RULE_EV_PUBLISH),
                     1u << JOB_FAULT_DUPLICATE | 1u << JOB_FAULT_DELAY);
    assert_int_equal(ruleset_fault_kinds(rs, "jobs", RULE_EV_ACK), 1u << JOB_FAULT_DROP);
    assert_int_equal(ruleset_fault_kinds(rs, "jobs", RULE_EV_DELIVER), 0);
    assert_int_equal(ruleset_fault_kinds(rs, "elsewhere", RULE_EV_PUBLISH), 1u << JOB_FAULT_ERROR);
    assert_int_equal(ruleset_fault_kinds(NULL, "jobs", RULE_EV_PUBLISH), 0);
    ruleset_put(rs);
}

static void test_glob(void **state)
{
    (void)state;
    assert_true(engine_glob("*", ""));
    assert_true(engine_glob("queue:*", "queue:critical"));
    assert_true(engine_glob("q?e", "que"));
    assert_true(engine_glob("*.charge", "billing.charge"));
    assert_true(engine_glob("a*b*c", "aXXbYYc"));
    assert_false(engine_glob("a*b*c", "aXXbYY"));
    assert_false(engine_glob("queue:*", "rq:queue:x"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_ids_whatever_the_order),
        cmocka_unit_test(test_different_seeds_fault_different_sets),
        cmocka_unit_test(test_probability_10_percent_within_1_percent),
        cmocka_unit_test(test_coin_is_a_pure_function),
        cmocka_unit_test(test_counting_triggers),
        cmocka_unit_test(test_between_window),
        cmocka_unit_test(test_per_message_cap),
        cmocka_unit_test(test_capped_events_do_not_count),
        cmocka_unit_test(test_anonymous_redelivery_is_capped),
        cmocka_unit_test(test_matchers),
        cmocka_unit_test(test_enable_kill_switch_and_listener),
        cmocka_unit_test(test_inherit_shares_state),
        cmocka_unit_test(test_edit_replaces_adds_and_removes),
        cmocka_unit_test(test_one_rule_acts_on_an_event),
        cmocka_unit_test(test_fault_kinds),
        cmocka_unit_test(test_glob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
