/*
 * test_stream_plan.c - stream and connect rules, and Toxiproxy's stream toxics, folded into the
 * plan of a connection's bytes (rules/stream_plan.h): what each direction's shaper is asked to
 * do, and what happens to the connection itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rules/stream_plan.h"

static struct rule stream_rule(const char *name, enum rule_action_kind kind, unsigned direction)
{
    struct rule r;
    memset(&r, 0, sizeof(r));
    r.name = (char *)name;
    r.direction = direction;
    r.action.kind = kind;
    return r;
}

/* Each direction gets only what its rules name; latencies add, the lowest rate and limit win. */
static void test_rules_by_direction(void **state)
{
    (void)state;
    struct stream_fx fx[2];
    struct conn_faults cf;
    memset(fx, 0, sizeof(fx));
    memset(&cf, 0, sizeof(cf));

    struct rule up = stream_rule("slow-up", RULE_ACT_LATENCY, RULE_DIR_UPSTREAM);
    up.action.duration_ms = 100;
    up.action.jitter_ms = 10;
    stream_plan_add_rule(&up, fx, &cf);
    struct rule both = stream_rule("slow-both", RULE_ACT_LATENCY, RULE_DIR_BOTH);
    both.action.duration_ms = 50;
    stream_plan_add_rule(&both, fx, &cf);
    assert_int_equal(fx[STREAM_FROM_CLIENT].latency_ms, 150);
    assert_int_equal(fx[STREAM_FROM_CLIENT].jitter_ms, 10);
    assert_int_equal(fx[STREAM_FROM_UPSTREAM].latency_ms, 50);

    struct rule bw1 = stream_rule("bw1", RULE_ACT_BANDWIDTH, RULE_DIR_DOWNSTREAM);
    bw1.action.bytes = 4096;
    struct rule bw2 = stream_rule("bw2", RULE_ACT_BANDWIDTH, RULE_DIR_DOWNSTREAM);
    bw2.action.bytes = 1024;
    stream_plan_add_rule(&bw1, fx, &cf);
    stream_plan_add_rule(&bw2, fx, &cf);
    stream_plan_add_rule(&bw1, fx, &cf);
    assert_int_equal(fx[STREAM_FROM_UPSTREAM].rate_bps, 1024);
    assert_int_equal(fx[STREAM_FROM_CLIENT].rate_bps, 0);

    struct rule l1 = stream_rule("cap-64k", RULE_ACT_LIMIT, RULE_DIR_UPSTREAM);
    l1.action.bytes = 65536;
    struct rule l2 = stream_rule("cap-1k", RULE_ACT_LIMIT, RULE_DIR_UPSTREAM);
    l2.action.bytes = 1024;
    stream_plan_add_rule(&l1, fx, &cf);
    stream_plan_add_rule(&l2, fx, &cf);
    stream_plan_add_rule(&l1, fx, &cf);
    assert_true(fx[STREAM_FROM_CLIENT].has_limit);
    assert_int_equal(fx[STREAM_FROM_CLIENT].limit_bytes, 1024);
    assert_string_equal(fx[STREAM_FROM_CLIENT].limit_rule, "cap-1k");
    assert_false(fx[STREAM_FROM_UPSTREAM].has_limit);

    struct rule hole = stream_rule("hole", RULE_ACT_BLACKHOLE, RULE_DIR_DOWNSTREAM);
    stream_plan_add_rule(&hole, fx, &cf);
    assert_true(fx[STREAM_FROM_UPSTREAM].blackhole);
    assert_false(fx[STREAM_FROM_CLIENT].blackhole);

    struct rule slice = stream_rule("slice", RULE_ACT_SLICE, RULE_DIR_BOTH);
    slice.action.bytes = 7;
    slice.action.slice_delay_ms = 3;
    stream_plan_add_rule(&slice, fx, &cf);
    for (int d = 0; d < 2; d++) {
        assert_int_equal(fx[d].slice_bytes, 7);
        assert_int_equal(fx[d].slice_delay_ms, 3);
        assert_false(fx[d].slice_halving);
    }

    struct rule sc = stream_rule("slow-close", RULE_ACT_SLOW_CLOSE, RULE_DIR_UPSTREAM);
    sc.action.duration_ms = 250;
    stream_plan_add_rule(&sc, fx, &cf);
    assert_true(fx[STREAM_FROM_CLIENT].has_slow_close);
    assert_int_equal(fx[STREAM_FROM_CLIENT].slow_close_ms, 250);

    /* none of them touched the connection itself */
    struct conn_faults none;
    memset(&none, 0, sizeof(none));
    assert_memory_equal(&cf, &none, sizeof(cf));
    assert_true(stream_fx_active(&fx[0]) && stream_fx_active(&fx[1]));
}

/* Connect rules: close before or after, a delayed connect, a reset, each with its rule's name;
 * they leave the bytes' plans alone. */
static void test_connect_rules(void **state)
{
    (void)state;
    struct stream_fx fx[2];
    struct conn_faults cf;
    memset(fx, 0, sizeof(fx));
    memset(&cf, 0, sizeof(cf));

    struct rule before = stream_rule("refuse", RULE_ACT_CLOSE, RULE_DIR_BOTH);
    before.action.close_when = RULE_CLOSE_BEFORE;
    stream_plan_add_rule(&before, fx, &cf);
    assert_true(cf.close_before);
    assert_false(cf.close_after);
    assert_string_equal(cf.close_rule, "refuse");

    struct rule after = stream_rule("hang-up", RULE_ACT_CLOSE, RULE_DIR_BOTH);
    after.action.close_when = RULE_CLOSE_AFTER;
    stream_plan_add_rule(&after, fx, &cf);
    assert_true(cf.close_after);
    assert_string_equal(cf.close_rule, "hang-up");

    struct rule delay = stream_rule("slow-connect", RULE_ACT_DELAY, RULE_DIR_BOTH);
    delay.action.duration_ms = 2000;
    stream_plan_add_rule(&delay, fx, &cf);
    assert_int_equal(cf.delay_connect_ms, 2000);

    struct rule reset = stream_rule("rst", RULE_ACT_RESET, RULE_DIR_BOTH);
    reset.action.duration_ms = 500;
    stream_plan_add_rule(&reset, fx, &cf);
    assert_true(cf.reset);
    assert_int_equal(cf.reset_after_ms, 500);
    assert_string_equal(cf.reset_rule, "rst");

    assert_false(stream_fx_active(&fx[0]) || stream_fx_active(&fx[1]));
}

/* Toxiproxy's attributes, with its units and its edge cases: bandwidth in KB/s of 1000 bytes,
 * rate 0 holds everything, latencies and slow_close delays add, the slicer halves, negative
 * numbers count as 0. */
static void test_toxics(void **state)
{
    (void)state;
    struct stream_fx f;
    memset(&f, 0, sizeof(f));

    struct toxic_stream lat = {.kind = TOXIC_LATENCY, .attr = {100, 20}};
    stream_plan_add_toxic(&lat, "p.lat", &f);
    stream_plan_add_toxic(&lat, "p.lat2", &f);
    assert_int_equal(f.latency_ms, 200);
    assert_int_equal(f.jitter_ms, 40);

    struct toxic_stream bw = {.kind = TOXIC_BANDWIDTH, .attr = {64}};
    stream_plan_add_toxic(&bw, "p.bw", &f);
    assert_int_equal(f.rate_bps, 64000);
    struct toxic_stream bw_more = {.kind = TOXIC_BANDWIDTH, .attr = {128}};
    stream_plan_add_toxic(&bw_more, "p.bw2", &f);
    assert_int_equal(f.rate_bps, 64000);
    assert_false(f.bandwidth_hold);
    struct toxic_stream bw0 = {.kind = TOXIC_BANDWIDTH, .attr = {0}};
    stream_plan_add_toxic(&bw0, "p.bw0", &f);
    assert_true(f.bandwidth_hold);

    struct toxic_stream sc = {.kind = TOXIC_SLOW_CLOSE, .attr = {300}};
    stream_plan_add_toxic(&sc, "p.sc", &f);
    stream_plan_add_toxic(&sc, "p.sc2", &f);
    assert_true(f.has_slow_close);
    assert_int_equal(f.slow_close_ms, 600);

    struct toxic_stream slicer = {.kind = TOXIC_SLICER, .attr = {0, 5, 40}};
    stream_plan_add_toxic(&slicer, "p.slicer", &f);
    assert_true(f.slice_halving);
    assert_int_equal(f.slice_bytes, 1); /* an average of 0 is pieces of one byte */
    assert_int_equal(f.slice_variation, 5);
    assert_int_equal(f.slice_delay_us, 40);

    struct toxic_stream lim = {.kind = TOXIC_LIMIT_DATA, .attr = {-3}};
    stream_plan_add_toxic(&lim, "p.limit", &f);
    assert_true(f.has_limit);
    assert_int_equal(f.limit_bytes, 0);
    assert_string_equal(f.limit_rule, "p.limit");

    struct stream_fx g;
    memset(&g, 0, sizeof(g));
    struct toxic_stream timeout = {.kind = TOXIC_TIMEOUT, .attr = {0}};
    stream_plan_add_toxic(&timeout, "p.timeout", &g);
    assert_true(g.has_timeout);
    assert_int_equal(g.timeout_ms, 0); /* 0: the data is held forever */
    assert_string_equal(g.toxic_rule, "p.timeout");
    struct toxic_stream rp = {.kind = TOXIC_RESET_PEER, .attr = {(int64_t)UINT32_MAX + 9}};
    stream_plan_add_toxic(&rp, "p.rst", &g);
    assert_true(g.has_reset_peer);
    assert_int_equal(g.reset_peer_ms, UINT32_MAX);

    struct stream_fx h;
    memset(&h, 0, sizeof(h));
    struct toxic_stream noop = {.kind = TOXIC_NOOP};
    stream_plan_add_toxic(&noop, "p.noop", &h);
    assert_false(stream_fx_active(&h));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules_by_direction),
        cmocka_unit_test(test_connect_rules),
        cmocka_unit_test(test_toxics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
