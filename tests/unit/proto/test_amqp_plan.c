/*
 * test_amqp_plan.c - the AMQP side's fault plans (proto/amqp/amqp_plan.c) and its app conventions
 * (proto/amqp/amqp_app.c).
 *
 *   - Every fault on a delivery (one the client acks, a no-ack consumer's, one whose ack waits
 *     for a late copy already), on a publish (copied or not), on each tag of a client's ack,
 *     multiple ack, nack and reject, and on a publisher confirm: the plan is the one the proxy
 *     carried out before the planner was split from it, each part naming its fault's rule; a
 *     delivery's expiry (an `expire` rule's, a visibility timeout, RabbitMQ's consumer
 *     timeout).
 *   - Combinations of faults on one event (one rule acts on an AMQP message event, but the
 *     planner takes a list): delay + duplicate, close after + delay, an error ending the plan,
 *     a cut before keeping the settlement planned before it, the longest delay, a drop never
 *     held, the first settlement winning, the fallbacks when a timer cannot be armed.
 *   - The app conventions fed the recorded pika/RabbitMQ session (tests/unit/data/amqp): the id,
 *     task and retries of every published and delivered message, the queue of every publish
 *     through the default exchange, and the fallbacks when the message_id property or the
 *     headers are missing.
 *
 * Neither module allocates: there is no allocation to fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_app.h"
#include "proto/amqp/amqp_plan.h"
#include "tests/lib/golden.h"

/* ---- faults ------------------------------------------------------------ */

/* Rules as the host's opaque handles. */
static const int rule_a = 1, rule_b = 2, rule_c = 3;
#define RA ((const void *)&rule_a)
#define RB ((const void *)&rule_b)
#define RC ((const void *)&rule_c)

static struct job_fault fault(enum job_fault_kind kind, uint32_t ms, const void *rule)
{
    return (struct job_fault){.kind = kind, .ms = ms, .rule = rule};
}

static struct job_fault cut(bool before, const void *rule)
{
    return (struct job_fault){.kind = JOB_FAULT_CLOSE, .before = before, .rule = rule};
}

static struct job_fault error(uint16_t code, const void *rule)
{
    return (struct job_fault){.kind = JOB_FAULT_ERROR, .code = code, .rule = rule};
}

/* A delivery the client acks, whose record the ledger keeps. */
static const struct amqp_content_facts deliver = {
    .method = AMQP_BASIC_DELIVER, .ack_required = true, .tracked = true};
/* A no-ack consumer's. */
static const struct amqp_content_facts deliver_noack = {.method = AMQP_BASIC_DELIVER};
/* A publish whose copy is being made. */
static const struct amqp_content_facts publish = {
    .publish = true, .method = AMQP_BASIC_PUBLISH, .has_copy = true};

static struct amqp_content_plan plan1(const struct amqp_content_facts *k, struct job_fault f)
{
    return amqp_plan_content(k, &f, 1);
}

/* Nothing but the fate (and a hold) in p. */
static void assert_only_fate(const struct amqp_content_plan *p, enum amqp_fate fate)
{
    assert_int_equal(p->fate, fate);
    assert_null(p->cut_before);
    assert_null(p->cut_after);
    assert_false(p->error.on);
    assert_int_equal(p->settle, AMQP_NOW_NONE);
    assert_null(p->settle_rule);
    assert_false(p->late || p->expire || p->dup || p->dup_missing);
    assert_null(p->late_rule);
    assert_null(p->expire_rule);
    assert_null(p->dup_rule);
}

/* Nothing in a settle plan but its verdict. */
static void assert_settle_plain(const struct amqp_settle_plan *p, enum amqp_verdict v)
{
    assert_int_equal(p->verdict, v);
    assert_false(p->late || p->hold);
    assert_null(p->late_rule);
    assert_null(p->hold_rule);
    assert_null(p->ack_rule);
    assert_null(p->cut_before);
}

static void assert_after_none(const struct amqp_settle_after *a)
{
    assert_false(a->error.on);
    assert_null(a->error.rule);
    assert_null(a->cut_after);
}

static void test_content_none(void **state)
{
    (void)state;
    const struct amqp_content_facts *all[] = {&deliver, &deliver_noack, &publish};
    for (size_t i = 0; i < 3; i++) {
        struct amqp_content_plan p = amqp_plan_content(all[i], NULL, 0);
        assert_only_fate(&p, AMQP_FATE_FORWARD);
        assert_int_equal(p.hold_ms, 0);
        /* A fault no AMQP content takes: nothing. */
        p = plan1(all[i], fault(JOB_FAULT_OTHER, 5, RA));
        assert_only_fate(&p, AMQP_FATE_FORWARD);
        p = plan1(all[i], fault(JOB_FAULT_REDELIVER, 5, RA));
        assert_only_fate(&p, AMQP_FATE_FORWARD);
    }
}

static void test_content_drop(void **state)
{
    (void)state;
    /* A delivery the client acks: lost, twice rejects it without requeue. */
    struct amqp_content_plan p = plan1(&deliver, fault(JOB_FAULT_DROP, 0, RA));
    assert_int_equal(p.fate, AMQP_FATE_DROP);
    assert_int_equal(p.settle, AMQP_NOW_LOST);
    assert_ptr_equal(p.settle_rule, RA);
    assert_false(p.late || p.expire || p.error.on);
    /* No-ack, publish: nothing to settle. */
    p = plan1(&deliver_noack, fault(JOB_FAULT_DROP, 0, RA));
    assert_only_fate(&p, AMQP_FATE_DROP);
    p = plan1(&publish, fault(JOB_FAULT_DROP, 0, RA));
    assert_only_fate(&p, AMQP_FATE_DROP);
}

static void test_content_delay(void **state)
{
    (void)state;
    const struct amqp_content_facts *all[] = {&deliver, &deliver_noack, &publish};
    for (size_t i = 0; i < 3; i++) {
        struct amqp_content_plan p = plan1(all[i], fault(JOB_FAULT_DELAY, 1500, RB));
        assert_int_equal(p.fate, AMQP_FATE_HOLD);
        assert_int_equal(p.hold_ms, 1500);
        assert_ptr_equal(p.hold_rule, RB);
        assert_int_equal(p.settle, AMQP_NOW_NONE);
    }
    /* The longest of several delays; a delay of 0 still holds (until now). */
    struct job_fault f[] = {fault(JOB_FAULT_DELAY, 200, RA), fault(JOB_FAULT_DELAY, 900, RB),
                            fault(JOB_FAULT_DELAY, 100, RC)};
    struct amqp_content_plan p = amqp_plan_content(&deliver, f, 3);
    assert_int_equal(p.hold_ms, 900);
    assert_ptr_equal(p.hold_rule, RB);
    p = plan1(&deliver, fault(JOB_FAULT_DELAY, 0, RA));
    assert_int_equal(p.fate, AMQP_FATE_HOLD);
    /* A dropped message is not held, whichever comes first. */
    struct job_fault g[] = {fault(JOB_FAULT_DELAY, 200, RA), fault(JOB_FAULT_DROP, 0, RB)};
    p = amqp_plan_content(&publish, g, 2);
    assert_only_fate(&p, AMQP_FATE_DROP);
    assert_int_equal(p.hold_ms, 0);
    assert_null(p.hold_rule);
    struct job_fault h[] = {fault(JOB_FAULT_DROP, 0, RB), fault(JOB_FAULT_DELAY, 200, RA)};
    p = amqp_plan_content(&deliver, h, 2);
    assert_int_equal(p.fate, AMQP_FATE_DROP);
    assert_int_equal(p.settle, AMQP_NOW_LOST);
}

static void test_content_duplicate_delivery(void **state)
{
    (void)state;
    /* At once: twice requeues it, the client keeps the first copy. */
    struct amqp_content_plan p = plan1(&deliver, fault(JOB_FAULT_DUPLICATE, 0, RA));
    assert_int_equal(p.fate, AMQP_FATE_FORWARD);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
    assert_ptr_equal(p.settle_rule, RA);
    assert_false(p.late);
    /* After D: a late copy, the ack held till then. */
    p = plan1(&deliver, fault(JOB_FAULT_DUPLICATE, 3000, RA));
    assert_true(p.late);
    assert_int_equal(p.late_ms, 3000);
    assert_ptr_equal(p.late_rule, RA);
    assert_int_equal(p.settle, AMQP_NOW_NONE);
    /* An ack that already waits for a late copy, or no record for the timer: at once. */
    struct amqp_content_facts k = deliver;
    k.hold_ack = true;
    p = plan1(&k, fault(JOB_FAULT_DUPLICATE, 3000, RA));
    assert_false(p.late);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
    k = deliver;
    k.tracked = false;
    p = plan1(&k, fault(JOB_FAULT_DUPLICATE, 3000, RA));
    assert_false(p.late);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
    /* A no-ack delivery: the broker forgot it, nothing to requeue. */
    p = plan1(&deliver_noack, fault(JOB_FAULT_DUPLICATE, 3000, RA));
    assert_only_fate(&p, AMQP_FATE_FORWARD);
    /* Two late duplicates: the first arms, the second requeues at once. */
    struct job_fault f[] = {fault(JOB_FAULT_DUPLICATE, 3000, RA),
                            fault(JOB_FAULT_DUPLICATE, 5000, RB)};
    p = amqp_plan_content(&deliver, f, 2);
    assert_true(p.late);
    assert_int_equal(p.late_ms, 3000);
    assert_ptr_equal(p.late_rule, RA);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
    assert_ptr_equal(p.settle_rule, RB);
    /* Delay + duplicate: held, and requeued at once. */
    struct job_fault g[] = {fault(JOB_FAULT_DELAY, 700, RA), fault(JOB_FAULT_DUPLICATE, 0, RB)};
    p = amqp_plan_content(&deliver, g, 2);
    assert_int_equal(p.fate, AMQP_FATE_HOLD);
    assert_int_equal(p.hold_ms, 700);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
    assert_ptr_equal(p.settle_rule, RB);
    /* Drop then duplicate: the first settlement wins (the job is lost). */
    struct job_fault h[] = {fault(JOB_FAULT_DROP, 0, RA), fault(JOB_FAULT_DUPLICATE, 0, RB)};
    p = amqp_plan_content(&deliver, h, 2);
    assert_int_equal(p.settle, AMQP_NOW_LOST);
    assert_ptr_equal(p.settle_rule, RA);
}

static void test_content_duplicate_publish(void **state)
{
    (void)state;
    struct amqp_content_plan p = plan1(&publish, fault(JOB_FAULT_DUPLICATE, 0, RA));
    assert_true(p.dup);
    assert_false(p.dup_missing);
    assert_ptr_equal(p.dup_rule, RA);
    assert_int_equal(p.fate, AMQP_FATE_FORWARD);
    assert_int_equal(p.settle, AMQP_NOW_NONE);
    /* No copy was made (out of memory, or a rule a reload added): said, not done. */
    struct amqp_content_facts k = publish;
    k.has_copy = false;
    p = plan1(&k, fault(JOB_FAULT_DUPLICATE, 0, RA));
    assert_false(p.dup);
    assert_true(p.dup_missing);
    assert_ptr_equal(p.dup_rule, RA);
    /* Delay + duplicate: the copy is held with it (the proxy puts it behind). */
    struct job_fault f[] = {fault(JOB_FAULT_DUPLICATE, 0, RA), fault(JOB_FAULT_DELAY, 400, RB)};
    p = amqp_plan_content(&publish, f, 2);
    assert_true(p.dup);
    assert_int_equal(p.fate, AMQP_FATE_HOLD);
    assert_int_equal(p.hold_ms, 400);
}

static void test_content_expire(void **state)
{
    (void)state;
    struct amqp_content_plan p = plan1(&deliver, fault(JOB_FAULT_EXPIRE, 2500, RA));
    assert_true(p.expire);
    assert_int_equal(p.expire_ms, 2500);
    assert_ptr_equal(p.expire_rule, RA);
    assert_int_equal(p.fate, AMQP_FATE_FORWARD);
    assert_int_equal(p.settle, AMQP_NOW_NONE);
    /* Nothing to expire without an ack to wait for, or a record for the timer. */
    p = plan1(&deliver_noack, fault(JOB_FAULT_EXPIRE, 2500, RA));
    assert_only_fate(&p, AMQP_FATE_FORWARD);
    p = plan1(&publish, fault(JOB_FAULT_EXPIRE, 2500, RA));
    assert_only_fate(&p, AMQP_FATE_FORWARD);
    struct amqp_content_facts k = deliver;
    k.tracked = false;
    p = plan1(&k, fault(JOB_FAULT_EXPIRE, 2500, RA));
    assert_only_fate(&p, AMQP_FATE_FORWARD);
    /* Two: the last one's time (the timer is re-armed), the first one's rule. */
    struct job_fault f[] = {fault(JOB_FAULT_EXPIRE, 2500, RA), fault(JOB_FAULT_EXPIRE, 900, RB)};
    p = amqp_plan_content(&deliver, f, 2);
    assert_int_equal(p.expire_ms, 900);
    assert_ptr_equal(p.expire_rule, RA);
}

static void test_content_close(void **state)
{
    (void)state;
    /* Before: a delivery's cut is of the connection read from the broker, a publish's of the
     * client's; the plan ends there. */
    struct amqp_content_plan p = plan1(&deliver, cut(true, RA));
    assert_ptr_equal(p.cut_before, RA);
    assert_true(p.cut_from_broker);
    assert_null(p.cut_after);
    p = plan1(&publish, cut(true, RA));
    assert_ptr_equal(p.cut_before, RA);
    assert_false(p.cut_from_broker);
    struct job_fault f[] = {fault(JOB_FAULT_DROP, 0, RA), cut(true, RB),
                            fault(JOB_FAULT_DELAY, 100, RC)};
    p = amqp_plan_content(&deliver, f, 3);
    assert_ptr_equal(p.cut_before, RB);
    assert_int_equal(p.settle, AMQP_NOW_LOST); /* queued before the cut: it still goes out */
    assert_int_equal(p.hold_ms, 0);
    /* After: the message goes on (held, with a delay), then the cut. */
    p = plan1(&deliver_noack, cut(false, RA));
    assert_null(p.cut_before);
    assert_ptr_equal(p.cut_after, RA);
    assert_int_equal(p.fate, AMQP_FATE_FORWARD);
    struct job_fault g[] = {cut(false, RA), fault(JOB_FAULT_DELAY, 300, RB)};
    p = amqp_plan_content(&publish, g, 2);
    assert_ptr_equal(p.cut_after, RA);
    assert_int_equal(p.fate, AMQP_FATE_HOLD);
    assert_int_equal(p.hold_ms, 300);
}

static void test_content_error(void **state)
{
    (void)state;
    struct amqp_content_plan p = plan1(&deliver, error(404, RA));
    assert_int_equal(p.fate, AMQP_FATE_DROP);
    assert_true(p.error.on);
    assert_int_equal(p.error.code, 404);
    assert_int_equal(p.error.class_id, 60);
    assert_int_equal(p.error.method_id, 60); /* basic.deliver */
    assert_ptr_equal(p.error.rule, RA);
    assert_int_equal(p.settle, AMQP_NOW_NONE);
    p = plan1(&publish, error(406, RB));
    assert_int_equal(p.error.method_id, 40); /* basic.publish */
    struct amqp_content_facts get = deliver;
    get.method = AMQP_BASIC_GET_OK;
    p = plan1(&get, error(406, RB));
    assert_int_equal(p.error.method_id, 71);
    /* The error wins: later faults are not planned, timers planned before are forgotten with
     * the channel, a settlement or a cut after planned before stay. */
    struct job_fault f[] = {fault(JOB_FAULT_DELAY, 300, RA),
                            fault(JOB_FAULT_DUPLICATE, 5000, RA),
                            fault(JOB_FAULT_EXPIRE, 800, RA),
                            cut(false, RB),
                            error(406, RC),
                            cut(true, RA),
                            fault(JOB_FAULT_DROP, 0, RA)};
    p = amqp_plan_content(&deliver, f, 7);
    assert_true(p.error.on);
    assert_ptr_equal(p.error.rule, RC);
    assert_int_equal(p.fate, AMQP_FATE_DROP);
    assert_false(p.late || p.expire);
    assert_int_equal(p.hold_ms, 0);
    assert_null(p.cut_before);
    assert_ptr_equal(p.cut_after, RB);
    assert_int_equal(p.settle, AMQP_NOW_NONE);
    struct job_fault g[] = {fault(JOB_FAULT_DUPLICATE, 0, RA), error(406, RC)};
    p = amqp_plan_content(&deliver, g, 2);
    assert_int_equal(p.settle, AMQP_NOW_REQUEUE);
}

/* ---- settlements ------------------------------------------------------- */

static const struct amqp_settle_facts ack = {.method = AMQP_BASIC_ACK, .tracked = true};

static struct amqp_settle_plan settle1(const struct amqp_settle_facts *k, struct job_fault f,
                                       struct amqp_settle_after *after)
{
    return amqp_plan_settle(k, &f, 1, after);
}

static void test_settle_none(void **state)
{
    (void)state;
    const uint32_t methods[] = {AMQP_BASIC_ACK, AMQP_BASIC_NACK, AMQP_BASIC_REJECT};
    for (size_t i = 0; i < 3; i++) {
        struct amqp_settle_facts k = {.method = methods[i], .tracked = i != 1};
        struct amqp_settle_after after = {0};
        struct amqp_settle_plan p = amqp_plan_settle(&k, NULL, 0, &after);
        assert_settle_plain(&p, AMQP_V_PASS);
        assert_int_equal(p.by, AMQP_BY_NONE);
        assert_after_none(&after);
        assert_int_equal(amqp_plan_settle_verdict(&p, true, true), AMQP_V_PASS);
        p = settle1(&k, fault(JOB_FAULT_EXPIRE, 10, RA), &after);
        assert_settle_plain(&p, AMQP_V_PASS);
        p = settle1(&k, fault(JOB_FAULT_DUPLICATE, 10, RA), &after);
        assert_settle_plain(&p, AMQP_V_PASS);
        assert_after_none(&after);
    }
}

static void test_settle_redeliver(void **state)
{
    (void)state;
    struct amqp_settle_after after = {0};
    /* At once: requeued instead of forwarded. */
    struct amqp_settle_plan p = settle1(&ack, fault(JOB_FAULT_REDELIVER, 0, RA), &after);
    assert_settle_plain(&p, AMQP_V_REQUEUE);
    /* After D: held, requeued D later; without its timer, requeued at once. */
    p = settle1(&ack, fault(JOB_FAULT_REDELIVER, 4000, RA), &after);
    assert_int_equal(p.verdict, AMQP_V_HOLD);
    assert_true(p.late);
    assert_int_equal(p.late_ms, 4000);
    assert_ptr_equal(p.late_rule, RA);
    assert_int_equal(amqp_plan_settle_verdict(&p, true, true), AMQP_V_HOLD);
    assert_int_equal(amqp_plan_settle_verdict(&p, false, true), AMQP_V_REQUEUE);
    /* No record to hang the timer on (a tag the ledger has no info for): at once. */
    struct amqp_settle_facts k = {.method = AMQP_BASIC_NACK};
    p = settle1(&k, fault(JOB_FAULT_REDELIVER, 4000, RA), &after);
    assert_settle_plain(&p, AMQP_V_REQUEUE);
    assert_after_none(&after);
}

static void test_settle_drop_delay(void **state)
{
    (void)state;
    struct amqp_settle_after after = {0};
    struct amqp_settle_plan p = settle1(&ack, fault(JOB_FAULT_DROP, 0, RA), &after);
    assert_int_equal(p.verdict, AMQP_V_DROP);
    assert_ptr_equal(p.ack_rule, RA);
    assert_int_equal(amqp_plan_settle_verdict(&p, false, false), AMQP_V_DROP);
    p = settle1(&ack, fault(JOB_FAULT_DELAY, 1200, RB), &after);
    assert_int_equal(p.verdict, AMQP_V_HOLD);
    assert_true(p.hold);
    assert_int_equal(p.hold_ms, 1200);
    assert_ptr_equal(p.hold_rule, RB);
    assert_ptr_equal(p.ack_rule, RB);
    /* Its hold not armed: the settlement passes. */
    assert_int_equal(amqp_plan_settle_verdict(&p, true, false), AMQP_V_PASS);
    /* No record: passes, nothing held. */
    struct amqp_settle_facts k = {.method = AMQP_BASIC_REJECT};
    p = settle1(&k, fault(JOB_FAULT_DELAY, 1200, RB), &after);
    assert_settle_plain(&p, AMQP_V_PASS);
    /* Delay then redeliver: held (its timer armed) and requeued; the delay holds the ack. */
    struct job_fault f[] = {fault(JOB_FAULT_DELAY, 1200, RB), fault(JOB_FAULT_REDELIVER, 0, RA)};
    p = amqp_plan_settle(&ack, f, 2, &after);
    assert_int_equal(p.verdict, AMQP_V_REQUEUE);
    assert_true(p.hold);
    assert_int_equal(amqp_plan_settle_verdict(&p, true, false), AMQP_V_REQUEUE);
    /* Redeliver after D then drop: dropped whether its timer arms or not. */
    struct job_fault g[] = {fault(JOB_FAULT_REDELIVER, 900, RA), fault(JOB_FAULT_DROP, 0, RB)};
    p = amqp_plan_settle(&ack, g, 2, &after);
    assert_int_equal(amqp_plan_settle_verdict(&p, false, true), AMQP_V_DROP);
    assert_true(p.late);
    assert_ptr_equal(p.ack_rule, RB);
    /* Drop then delay: the first rule holds the ack. */
    struct job_fault h[] = {fault(JOB_FAULT_DROP, 0, RA), fault(JOB_FAULT_DELAY, 50, RB)};
    p = amqp_plan_settle(&ack, h, 2, &after);
    assert_ptr_equal(p.ack_rule, RA);
    assert_int_equal(p.verdict, AMQP_V_HOLD);
    assert_after_none(&after);
}

static void test_settle_close_error(void **state)
{
    (void)state;
    struct amqp_settle_after after = {0};
    struct amqp_settle_plan p = settle1(&ack, cut(true, RA), &after);
    assert_ptr_equal(p.cut_before, RA);
    /* Later faults are not planned. */
    struct job_fault f[] = {fault(JOB_FAULT_DROP, 0, RB), cut(true, RA),
                            fault(JOB_FAULT_DELAY, 50, RC)};
    p = amqp_plan_settle(&ack, f, 3, &after);
    assert_ptr_equal(p.cut_before, RA);
    assert_int_equal(p.verdict, AMQP_V_DROP);
    assert_false(p.hold);
    /* After: the frame is settled first; with a delay, held. */
    struct job_fault g[] = {cut(false, RA), fault(JOB_FAULT_DELAY, 50, RC)};
    p = amqp_plan_settle(&ack, g, 2, &after);
    assert_null(p.cut_before);
    assert_int_equal(p.verdict, AMQP_V_HOLD);
    assert_ptr_equal(after.cut_after, RA);
    assert_false(after.error.on);
    /* An error: the tag dropped, the channel closed naming the frame's method. */
    struct amqp_settle_facts nack = {.method = AMQP_BASIC_NACK, .tracked = true};
    p = settle1(&nack, error(406, RB), &after);
    assert_int_equal(p.verdict, AMQP_V_DROP);
    assert_true(after.error.on);
    assert_int_equal(after.error.code, 406);
    assert_int_equal(after.error.class_id, 60);
    assert_int_equal(after.error.method_id, 120); /* basic.nack */
    assert_ptr_equal(after.error.rule, RB);
    assert_ptr_equal(after.cut_after, RA); /* the proxy: an error wins over a cut after */
}

/* A multiple ack's tags, each planned, gathered in one `after`: the last tag's error and cut
 * win; each tag has its own verdict. */
static void test_settle_multiple(void **state)
{
    (void)state;
    struct amqp_settle_after after = {0};
    struct job_fault faults[4] = {fault(JOB_FAULT_DROP, 0, RA), fault(JOB_FAULT_NONE, 0, NULL),
                                  error(404, RB), error(320, RC)};
    enum amqp_verdict want[4] = {AMQP_V_DROP, AMQP_V_PASS, AMQP_V_DROP, AMQP_V_DROP};
    for (size_t i = 0; i < 4; i++) {
        struct amqp_settle_plan p = amqp_plan_settle(&ack, &faults[i], 1, &after);
        assert_int_equal(amqp_plan_settle_verdict(&p, true, true), want[i]);
    }
    assert_int_equal(after.error.code, 320);
    assert_ptr_equal(after.error.rule, RC);
    assert_int_equal(after.error.method_id, 80); /* basic.ack */
    struct amqp_settle_facts reject = {.method = AMQP_BASIC_REJECT, .tracked = true};
    (void)settle1(&reject, error(406, RA), &after);
    assert_int_equal(after.error.method_id, 90);
}

/* An ack that waits for a late copy: no rule is asked, and whatever faults come it is held for
 * the copy, with nothing else in its plan and nothing gathered after the frame. */
static void test_settle_hold_ack(void **state)
{
    (void)state;
    assert_true(amqp_plan_settle_asks_rules(&ack));
    struct amqp_settle_facts k = {.method = AMQP_BASIC_ACK, .tracked = true, .hold_ack = true};
    assert_false(amqp_plan_settle_asks_rules(&k));
    struct amqp_settle_after after = {0};
    struct amqp_settle_plan p = amqp_plan_settle(&k, NULL, 0, &after);
    assert_settle_plain(&p, AMQP_V_HOLD);
    assert_int_equal(p.by, AMQP_BY_COPY);
    assert_int_equal(amqp_plan_settle_verdict(&p, true, true), AMQP_V_HOLD);
    assert_int_equal(amqp_plan_settle_verdict(&p, false, false), AMQP_V_HOLD);
    struct job_fault f[] = {fault(JOB_FAULT_DROP, 0, RA),
                            fault(JOB_FAULT_REDELIVER, 100, RA),
                            fault(JOB_FAULT_DELAY, 100, RB),
                            cut(true, RA),
                            cut(false, RB),
                            error(404, RC)};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        p = settle1(&k, f[i], &after);
        assert_settle_plain(&p, AMQP_V_HOLD);
        assert_after_none(&after);
    }
    /* A nack or reject waits the same way. */
    k.method = AMQP_BASIC_NACK;
    assert_false(amqp_plan_settle_asks_rules(&k));
    p = settle1(&k, fault(JOB_FAULT_DROP, 0, RA), &after);
    assert_settle_plain(&p, AMQP_V_HOLD);
}

/* Held settlements released by a channel's close or a recover: the client's go to the broker,
 * a late copy's is twice's requeue. */
static void test_release_held(void **state)
{
    (void)state;
    assert_int_equal(amqp_plan_release_held(false), AMQP_RELEASE_FORWARD);
    assert_int_equal(amqp_plan_release_held(true), AMQP_RELEASE_REQUEUE);
}

/* ---- a publish's copy, a delivery's visibility timeout ----------------- */

/* A publish is copied only when a rule on publishes can duplicate it. */
static void test_copy_publish(void **state)
{
    (void)state;
    assert_false(amqp_plan_copy_publish(0));
    assert_true(amqp_plan_copy_publish(1u << JOB_FAULT_DUPLICATE));
    uint32_t others = 0;
    for (int k = JOB_FAULT_NONE; k <= JOB_FAULT_OTHER; k++)
        if (k != JOB_FAULT_DUPLICATE)
            others |= 1u << k;
    assert_false(amqp_plan_copy_publish(others));
    assert_true(amqp_plan_copy_publish(others | 1u << JOB_FAULT_DUPLICATE));
}

/* The listener's timeout hangs on a delivery the client must ack and gets, whose record the
 * ledger keeps, and on which no `expire` armed its own; never on anything else. */
static void test_visibility(void **state)
{
    (void)state;
    const struct amqp_visibility_facts on = {
        .timeout_ms = 30000, .ack_required = true, .kept = true};
    assert_int_equal(amqp_plan_visibility(&on), 30000);
    struct amqp_visibility_facts k = on;
    k.timeout_ms = 0;
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = on, k.publish = true;
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = on, k.ack_required = false; /* a no-ack consumer's */
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = on, k.dropped = true;
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = on, k.kept = false; /* settled by twice, or its channel closed under it */
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = on, k.expired = true; /* an `expire` armed its own */
    assert_int_equal(amqp_plan_visibility(&k), 0);
    k = (struct amqp_visibility_facts){0};
    assert_int_equal(amqp_plan_visibility(&k), 0);
}

/* ---- confirms ---------------------------------------------------------- */

static void test_confirm(void **state)
{
    (void)state;
    const void *after = NULL;
    struct amqp_confirm_plan p = amqp_plan_confirm(NULL, 0, &after);
    assert_false(p.drop);
    assert_null(p.cut_before);
    struct job_fault f = fault(JOB_FAULT_DROP, 0, RA);
    p = amqp_plan_confirm(&f, 1, &after);
    assert_true(p.drop);
    f = fault(JOB_FAULT_DELAY, 10, RA); /* not a confirm's fault */
    p = amqp_plan_confirm(&f, 1, &after);
    assert_false(p.drop);
    struct job_fault g[] = {fault(JOB_FAULT_DROP, 0, RA), cut(false, RB), cut(true, RC),
                            cut(false, RA)};
    p = amqp_plan_confirm(g, 4, &after);
    assert_true(p.drop);
    assert_ptr_equal(p.cut_before, RC);
    assert_ptr_equal(after, RB);
}

/* ---- expiries ---------------------------------------------------------- */

static void test_expiry(void **state)
{
    (void)state;
    struct amqp_expiry_plan p;
    /* Settled in time: nothing, whatever armed it. */
    struct amqp_expiry_facts k = {.expire_rule = RA, .ack_rule = RB, .consumer_timeout = true};
    amqp_plan_expiry(&k, &p);
    assert_int_equal(p.cause, AMQP_EXPIRY_NONE);
    assert_false(p.requeue || p.close_channel);
    assert_null(p.rule);
    assert_string_equal(amqp_expiry_name(p.cause), "");
    /* An expire rule: its fault, a requeue (even on a consumer-timeout listener). */
    k.settleable = true;
    amqp_plan_expiry(&k, &p);
    assert_int_equal(p.cause, AMQP_EXPIRY_RULE);
    assert_ptr_equal(p.rule, RA);
    assert_true(p.requeue);
    assert_false(p.close_channel);
    assert_string_equal(amqp_expiry_name(p.cause), "expire");
    /* The listener's visibility timeout: named after the rule that held or dropped the ack. */
    k = (struct amqp_expiry_facts){.settleable = true, .ack_rule = RB, .timeout_ms = 30000};
    amqp_plan_expiry(&k, &p);
    assert_int_equal(p.cause, AMQP_EXPIRY_VISIBILITY);
    assert_ptr_equal(p.rule, RB);
    assert_true(p.requeue);
    assert_string_equal(amqp_expiry_name(p.cause), "visibility-timeout");
    k.ack_rule = NULL; /* the worker was slow */
    amqp_plan_expiry(&k, &p);
    assert_null(p.rule);
    assert_true(p.requeue);
    /* RabbitMQ's consumer_timeout: the channel closes with its text, no requeue of one. */
    k = (struct amqp_expiry_facts){
        .settleable = true, .consumer_timeout = true, .channel = 7, .timeout_ms = 1500};
    amqp_plan_expiry(&k, &p);
    assert_int_equal(p.cause, AMQP_EXPIRY_CONSUMER);
    assert_false(p.requeue);
    assert_true(p.close_channel);
    assert_int_equal(p.close_code, 406);
    assert_string_equal(p.close_text,
                        "PRECONDITION_FAILED - delivery acknowledgement on channel 7 timed out. "
                        "Timeout value used: 1500 ms. This timeout value can be configured, see "
                        "consumers doc guide to learn more");
    assert_string_equal(amqp_expiry_name(p.cause), "consumer-timeout");
}

/* ---- the app's conventions over the recorded session ------------------- */

#define GOLDEN_FRAME_MAX 4096u /* what the recorded session negotiated (pika frame_max) */

static bool bytes_eq(struct amqp_bytes b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.p, s, b.len) == 0;
}

/* What a stream's messages said, in order. */
struct seen {
    size_t n_publish, n_deliver, n_default_queue;
};

/* Walks a recorded stream: every content method's header gives the app's id, task and
 * retries of message N (the recording's message_id "msg-N", its task id
 * c0ffee00-...-00000000000N in the `id` header and correlation_id, task tasks.charge, N - 1
 * retries), and every publish went through the default exchange to the recording's queue. */
static void walk(const uint8_t *buf, size_t len, size_t off, struct seen *s)
{
    struct amqp_method m = {0};
    bool content = false;
    while (off < len) {
        struct amqp_frame f;
        assert_int_equal(amqp_frame_parse(buf + off, len - off, GOLDEN_FRAME_MAX, &f), 1);
        off += f.frame_len;
        if (f.type == AMQP_FRAME_METHOD) {
            assert_int_equal(amqp_method_decode(f.payload, f.size, &m), 0);
            content = m.id == AMQP_BASIC_PUBLISH || m.id == AMQP_BASIC_DELIVER ||
                      m.id == AMQP_BASIC_GET_OK;
            if (m.id == AMQP_BASIC_PUBLISH) {
                struct amqp_bytes q;
                s->n_publish++;
                if (amqp_app_publish_queue(&m.publish, &q)) {
                    assert_true(bytes_eq(q, "twice.golden"));
                    s->n_default_queue++;
                }
            } else if (content) {
                s->n_deliver++;
            }
            continue;
        }
        if (f.type != AMQP_FRAME_HEADER || !content)
            continue;
        content = false;
        struct amqp_props p;
        assert_int_equal(amqp_content_header_decode(f.payload, f.size, &p), 0);
        struct amqp_bytes id, task;
        assert_true(amqp_app_message_id(&p, &id));
        assert_true(id.len == 5 && memcmp(id.p, "msg-", 4) == 0);
        int n = id.p[4] - '0';
        assert_true(n >= 1 && n <= 9);
        assert_true(amqp_app_task(&p, &task));
        assert_true(bytes_eq(task, "tasks.charge"));
        assert_int_equal(amqp_app_retries(&p), (uint32_t)(n - 1));
        assert_int_equal(amqp_app_publish_is_retry(amqp_app_retries(&p)), n > 1);
        /* Without the message_id property: Celery's `id` header; without headers either: the
         * correlation_id; without all three: none.  Without headers: no task, no retries. */
        char want[64];
        snprintf(want, sizeof(want), "c0ffee00-0000-4000-8000-00000000000%d", n);
        struct amqp_props q = p;
        q.message_id.len = 0;
        assert_true(amqp_app_message_id(&q, &id));
        assert_true(bytes_eq(id, want));
        assert_ptr_not_equal(id.p, p.correlation_id.p); /* the header's, not the property */
        q.headers.len = 0;
        assert_true(amqp_app_message_id(&q, &id));
        assert_ptr_equal(id.p, p.correlation_id.p);
        assert_false(amqp_app_task(&q, &task));
        assert_int_equal(amqp_app_retries(&q), 0);
        q.correlation_id.len = 0;
        assert_false(amqp_app_message_id(&q, &id));
    }
}

static void test_app_recorded(void **state)
{
    (void)state;
    size_t clen = 0, slen = 0;
    uint8_t *client = kit_golden(&clen, "amqp/client.bin");
    uint8_t *server = kit_golden(&slen, "amqp/server.bin");
    struct seen c = {0}, s = {0};
    walk(client, clen, AMQP_PROTOCOL_HEADER_SIZE, &c);
    walk(server, slen, 0, &s);
    /* capture_amqp.py: 6 publishes, all to the default exchange; the broker's deliveries and
     * get-oks of them. */
    assert_int_equal(c.n_publish, 6);
    assert_int_equal(c.n_default_queue, 6);
    assert_true(s.n_deliver >= 3);
    kit_free(client);
    kit_free(server);
}

static void test_app_edges(void **state)
{
    (void)state;
    /* Another exchange: its bindings decide, no queue. */
    struct amqp_method m = {.id = AMQP_BASIC_PUBLISH};
    m.publish.exchange = amqp_cstr("celery");
    m.publish.routing_key = amqp_cstr("celery");
    struct amqp_bytes q = {0};
    assert_false(amqp_app_publish_queue(&m.publish, &q));
    m.publish.exchange.len = 0;
    assert_true(amqp_app_publish_queue(&m.publish, &q));
    assert_true(bytes_eq(q, "celery"));
    /* No properties: nothing. */
    struct amqp_props p = {0};
    assert_false(amqp_app_message_id(&p, &q));
    assert_false(amqp_app_task(&p, &q));
    assert_int_equal(amqp_app_retries(&p), 0);
    assert_false(amqp_app_publish_is_retry(0));
    /* retries: negative is none, beyond 32 bits is UINT32_MAX; a string is none. */
    static const uint8_t neg[] = {7,    'r',  'e',  't',  'r',  'i',  'e',  's', 'l',
                                  0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe};
    static const uint8_t big[] = {7, 'r', 'e', 't', 'r', 'i', 'e', 's', 'l',
                                  0, 0,   0,   1,   0,   0,   0,   0};
    static const uint8_t str[] = {7, 'r', 'e', 't', 'r', 'i', 'e', 's', 'S', 0, 0, 0, 1, '3'};
    p.headers = (struct amqp_bytes){neg, sizeof(neg)};
    assert_int_equal(amqp_app_retries(&p), 0);
    p.headers = (struct amqp_bytes){big, sizeof(big)};
    assert_int_equal(amqp_app_retries(&p), UINT32_MAX);
    p.headers = (struct amqp_bytes){str, sizeof(str)};
    assert_int_equal(amqp_app_retries(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_none),
        cmocka_unit_test(test_content_drop),
        cmocka_unit_test(test_content_delay),
        cmocka_unit_test(test_content_duplicate_delivery),
        cmocka_unit_test(test_content_duplicate_publish),
        cmocka_unit_test(test_content_expire),
        cmocka_unit_test(test_content_close),
        cmocka_unit_test(test_content_error),
        cmocka_unit_test(test_settle_none),
        cmocka_unit_test(test_settle_redeliver),
        cmocka_unit_test(test_settle_drop_delay),
        cmocka_unit_test(test_settle_close_error),
        cmocka_unit_test(test_settle_multiple),
        cmocka_unit_test(test_settle_hold_ack),
        cmocka_unit_test(test_release_held),
        cmocka_unit_test(test_copy_publish),
        cmocka_unit_test(test_visibility),
        cmocka_unit_test(test_confirm),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_app_recorded),
        cmocka_unit_test(test_app_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
