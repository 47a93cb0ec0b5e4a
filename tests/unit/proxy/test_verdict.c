/*
 * test_verdict.c - `twice verdict` and `twice report`: the numbers computed
 * from known journals and effects lists, the verdict per task type, the exit
 * codes, and what the human and JSON outputs say.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "offline/journal_reader.h"
#include "offline/json_out.h"
#include "offline/report.h"
#include "offline/verdict.h"
#include "proxy/core/journal.h"
#include "rules/rule.h"
#include "tests/lib/cmd_testkit.h"

#define T0_US 1764406800000000ull

/* ---- the core, fed directly ------------------------------------------- */

static void add(struct verdict *v, Twice__Journal__Record__Kind kind, const char *id,
                const char *task)
{
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    r.kind = kind;
    r.message_id = (char *)id;
    r.task = (char *)task;
    assert_int_equal(verdict_add_record(v, &r), 0);
}

/* A record of the app's retries: `retries` as the message counts them, `retry` as journaled on
 * a publish of a message the app ran before or on a nack with requeue. */
static void add_retry(struct verdict *v, Twice__Journal__Record__Kind kind, const char *id,
                      const char *task, uint32_t retries, bool retry)
{
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    r.kind = kind;
    r.message_id = (char *)id;
    r.task = (char *)task;
    r.retries = retries;
    r.retry = retry;
    assert_int_equal(verdict_add_record(v, &r), 0);
}

#define DELIVER TWICE__JOURNAL__RECORD__KIND__DELIVER
#define FAULT TWICE__JOURNAL__RECORD__KIND__FAULT
#define PUBLISH TWICE__JOURNAL__RECORD__KIND__PUBLISH
#define ACK TWICE__JOURNAL__RECORD__KIND__ACK

static void effect(struct verdict *v, const char *id, int times)
{
    for (int i = 0; i < times; i++)
        assert_int_equal(verdict_add_effect(v, id), 0);
}

#define NACK TWICE__JOURNAL__RECORD__KIND__NACK

/* Retries the app asked for are attempts, not copies: a task that retried twice and then
 * succeeded is UNTESTED, not IDEMPOTENT; a copy of one attempt still counts. */
static void test_app_retries_are_not_copies(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    /* Celery: self.retry() twice (the publish and the delivery both carry the count). */
    add(v, PUBLISH, "c1", "flaky");
    add(v, DELIVER, "c1", "flaky");
    add_retry(v, PUBLISH, "c1", "flaky", 1, true);
    add(v, ACK, "c1", "flaky");
    add_retry(v, DELIVER, "c1", "flaky", 1, false);
    add_retry(v, PUBLISH, "c1", "flaky", 2, true);
    add_retry(v, DELIVER, "c1", "flaky", 2, false);
    effect(v, "c1", 1);
    /* RQ: its retry is only known from the publish; the next delivery carries no count. */
    add(v, DELIVER, "r1", "flaky");
    add_retry(v, PUBLISH, "r1", "flaky", 0, true);
    add(v, DELIVER, "r1", "flaky");
    effect(v, "r1", 1);
    /* A nack with requeue, then the broker's redelivery. */
    add(v, DELIVER, "n1", "flaky");
    add_retry(v, NACK, "n1", "flaky", 0, true);
    add(v, DELIVER, "n1", "flaky");
    effect(v, "n1", 1);
    /* Sidekiq: the delivery's retry_count alone tells (twice never saw the retry's push). */
    add(v, DELIVER, "s1", "flaky");
    add_retry(v, DELIVER, "s1", "flaky", 1, false);
    effect(v, "s1", 1);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "flaky");
    assert_int_equal(t->messages, 4);
    assert_int_equal(t->faulted, 0);
    assert_int_equal(t->delivered_more_than_once, 0);
    assert_int_equal(t->more_than_one_effect, 0);
    assert_int_equal(t->copies, 0);
    assert_int_equal(t->retried, 4);
    assert_int_equal(t->max_retries, 2);
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    verdict_result_free(&res);
    verdict_free(v);

    /* A copy twice made of the first attempt, arriving after the app asked for a retry that
     * carries a count: still a copy, and the retry's delivery still an attempt. */
    v = verdict_new();
    add(v, DELIVER, "c2", "flaky");
    add_retry(v, PUBLISH, "c2", "flaky", 1, true);
    add(v, FAULT, "c2", "flaky");
    add(v, DELIVER, "c2", "flaky");
    add_retry(v, DELIVER, "c2", "flaky", 1, false);
    effect(v, "c2", 1);
    assert_int_equal(verdict_compute(v, &res), 0);
    t = row(&res, "flaky");
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->copies, 1);
    assert_int_equal(t->retried, 1);
    assert_int_equal(t->max_retries, 1);
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A message whose last settlement fails it for good (a NACK without retry: a BullMQ job failed,
 * one stalled past maxStalledCount included) is counted as failed, whatever its effects; a
 * later delivery or ack of it (run again, settled after all) takes it back. */
static void test_failed_for_good(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    add(v, DELIVER, "f1", "charge");
    add(v, FAULT, "f1", "charge");
    add(v, DELIVER, "f1", "charge");
    add_retry(v, NACK, "f1", "charge", 0, false);
    effect(v, "f1", 1);
    effect(v, "f1", 1);
    add(v, DELIVER, "f2", "charge");
    add_retry(v, NACK, "f2", "charge", 0, false);
    add(v, DELIVER, "f2", "charge");
    add(v, ACK, "f2", "charge");
    effect(v, "f2", 1);
    add(v, DELIVER, "f3", "charge");
    add_retry(v, NACK, "f3", "charge", 0, true); /* a retry asked for is no failure */
    add(v, DELIVER, "f3", "charge");
    effect(v, "f3", 1);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "charge");
    assert_int_equal(t->failed, 1);
    assert_int_equal(t->failed_examples.n, 1);
    assert_string_equal(t->failed_examples.ids[0], "f1");
    assert_int_equal(t->verdict, VERDICT_NOT_IDEMPOTENT);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A retry whose publish twice dropped never reaches the broker: a later delivery is a copy. */
static void test_dropped_retry_is_no_attempt(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    add(v, DELIVER, "r1", "job");
    add_retry(v, PUBLISH, "r1", "job", 0, true);
    Twice__Journal__Record f = TWICE__JOURNAL__RECORD__INIT;
    f.kind = FAULT;
    f.message_id = (char *)"r1";
    f.event = RULE_EV_PUBLISH;
    f.action = RULE_ACT_DROP;
    assert_int_equal(verdict_add_record(v, &f), 0);
    add(v, DELIVER, "r1", "job");
    effect(v, "r1", 2);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "job");
    assert_int_equal(t->retried, 0);
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->doubled_by_retries, 0);
    assert_int_equal(t->verdict, VERDICT_NOT_IDEMPOTENT);
    verdict_result_free(&res);
    verdict_free(v);
}

/* Two faults that withhold one delivery (a `close before` journaled with a `drop` after it)
 * take that delivery away, not an earlier one; a nack twice dropped still requeues at the
 * broker, so the delivery after it is still the app's attempt. */
static void test_withheld_twice_and_dropped_nack(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    Twice__Journal__Record f = TWICE__JOURNAL__RECORD__INIT;
    f.kind = FAULT;
    f.message_id = (char *)"a";
    f.event = RULE_EV_DELIVER;
    add(v, DELIVER, "a", "job");
    add_retry(v, NACK, "a", "job", 0, true);
    add(v, DELIVER, "a", "job");
    f.action = RULE_ACT_CLOSE;
    f.detail = (char *)"close before";
    assert_int_equal(verdict_add_record(v, &f), 0);
    f.action = RULE_ACT_DROP;
    f.detail = (char *)"";
    assert_int_equal(verdict_add_record(v, &f), 0);
    add(v, DELIVER, "a", "job"); /* the retry, at last */
    add(v, DELIVER, "a", "job"); /* a copy */
    add(v, ACK, "a", "job");
    add(v, ACK, "a", "job");
    /* b: its requeueing nack dropped by a rule */
    add(v, DELIVER, "b", "job");
    add_retry(v, NACK, "b", "job", 0, true);
    f.message_id = (char *)"b";
    f.event = RULE_EV_NACK;
    assert_int_equal(verdict_add_record(v, &f), 0);
    add(v, DELIVER, "b", "job");
    add(v, ACK, "b", "job");
    effect(v, "a", 1);
    effect(v, "b", 1);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "job");
    assert_int_equal(t->delivered_more_than_once, 1); /* a's copy */
    assert_int_equal(t->copies, 1);
    assert_int_equal(t->retried, 2);
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    verdict_result_free(&res);
    verdict_free(v);
}

static void test_counts_and_verdicts(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    /* charge: m1 faulted (its ack lost), redelivered, charged twice; m2 delivered, never
     * charged; m3 charged twice but delivered once (suspicious effects list).  Every delivery
     * is settled: a worker finished it. */
    add(v, PUBLISH, "m1", "charge");
    add(v, DELIVER, "m1", "charge");
    add(v, ACK, "m1", "charge");
    add(v, FAULT, "m1", "charge");
    add(v, DELIVER, "m1", "charge");
    add(v, ACK, "m1", "charge");
    add(v, DELIVER, "m2", "charge");
    add(v, ACK, "m2", "charge");
    add(v, DELIVER, "m3", "charge");
    add(v, ACK, "m3", "charge");
    effect(v, "m1", 2);
    effect(v, "m3", 2);
    /* email: faulted and redelivered, one effect each: idempotent. */
    add(v, DELIVER, "e1", "email");
    add(v, ACK, "e1", "email");
    add(v, FAULT, "e1", "email");
    add(v, DELIVER, "e1", "email");
    add(v, ACK, "e1", "email");
    add(v, DELIVER, "e2", "email");
    add(v, ACK, "e2", "email");
    effect(v, "e1", 1);
    effect(v, "e2", 1);
    /* resize: no fault reached it. */
    add(v, DELIVER, "r1", "resize");
    add(v, ACK, "r1", "resize");
    effect(v, "r1", 1);

    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    assert_int_equal(res.n_tasks, 3);
    assert_string_equal(res.tasks[0].task, "charge"); /* sorted by name */
    assert_string_equal(res.tasks[2].task, "resize");

    const struct verdict_task *t = row(&res, "charge");
    assert_int_equal(t->messages, 3);
    assert_int_equal(t->faulted, 1);
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->more_than_one_effect, 2);
    assert_int_equal(t->no_effect, 1);
    assert_int_equal(t->doubled_single_delivery, 1);
    assert_int_equal(t->verdict, VERDICT_NOT_IDEMPOTENT);
    assert_int_equal(t->examples.n, 2);
    assert_string_equal(t->examples.ids[0], "m1");
    assert_string_equal(t->examples.ids[1], "m3");
    assert_int_equal(t->single_examples.n, 1);
    assert_string_equal(t->single_examples.ids[0], "m3");

    t = row(&res, "email");
    assert_int_equal(t->messages, 2);
    assert_int_equal(t->faulted, 1);
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->more_than_one_effect, 0);
    assert_int_equal(t->no_effect, 0);
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(t->examples.n, 0);

    t = row(&res, "resize");
    assert_int_equal(t->faulted, 0);
    assert_int_equal(t->verdict, VERDICT_UNTESTED);

    assert_int_equal(res.overall, VERDICT_NOT_IDEMPOTENT);
    assert_int_equal(res.effect_lines, 7);
    assert_int_equal(res.unknown_effect_ids, 0);
    verdict_result_free(&res);
    verdict_free(v);
}

static void test_examples_are_five_smallest_sorted(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    const char *ids[] = {"id-7", "id-2", "id-9", "id-4", "id-1", "id-8", "id-3", "id-6"};
    for (size_t i = 0; i < 8; i++) {
        add(v, DELIVER, ids[i], "t");
        effect(v, ids[i], 2 + (int)i % 2);
    }
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "t");
    assert_int_equal(t->more_than_one_effect, 8);
    assert_int_equal(t->examples.n, VERDICT_EXAMPLES_MAX);
    const char *want[] = {"id-1", "id-2", "id-3", "id-4", "id-6"};
    for (size_t i = 0; i < VERDICT_EXAMPLES_MAX; i++)
        assert_string_equal(t->examples.ids[i], want[i]);
    verdict_result_free(&res);
    verdict_free(v);
}

static void test_unknown_task_and_unknown_effects(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    /* Effects may come before the journal's records. */
    effect(v, "x1", 1);
    effect(v, "ghost-2", 1);
    effect(v, "ghost-1", 3);
    add(v, DELIVER, "x1", "");   /* no task yet... */
    add(v, ACK, "x1", "late");   /* ...a later record names it */
    add(v, DELIVER, "n1", NULL); /* never named: (unknown) */
    add(v, FAULT, "n1", "");
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    assert_int_equal(res.n_tasks, 2);
    assert_string_equal(res.tasks[0].task, "late");
    assert_string_equal(res.tasks[1].task, VERDICT_UNKNOWN_TASK); /* always last */
    assert_true(res.tasks[1].unknown);
    assert_int_equal(res.tasks[1].messages, 1);
    assert_int_equal(res.tasks[1].faulted, 1);
    assert_int_equal(res.tasks[1].no_effect, 1);
    /* Faulted, but never delivered twice: nothing proven. */
    assert_int_equal(res.tasks[1].verdict, VERDICT_UNTESTED);
    assert_int_equal(res.tasks[0].verdict, VERDICT_UNTESTED);
    assert_int_equal(res.unknown_effect_ids, 2);
    assert_int_equal(res.unknown_effect_lines, 4);
    assert_int_equal(res.unknown_examples.n, 2);
    assert_string_equal(res.unknown_examples.ids[0], "ghost-1");
    assert_string_equal(res.unknown_examples.ids[1], "ghost-2");
    assert_int_equal(res.effect_lines, 5);
    assert_int_equal(res.overall, VERDICT_UNTESTED);
    verdict_result_free(&res);
    verdict_free(v);
}

static void add_fault(struct verdict *v, const char *id, const char *task, enum rule_event ev,
                      enum rule_action_kind action, const char *detail)
{
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    r.kind = FAULT;
    r.message_id = (char *)id;
    r.task = (char *)task;
    r.event = ev;
    r.action = action;
    r.detail = (char *)detail;
    assert_int_equal(verdict_add_record(v, &r), 0);
}

/* Faults that only drop or delay work do not test a handler: a dropped
 * delivery (journaled, then withheld from the worker) is not a second
 * delivery, and a task whose messages never reached the handler twice is
 * UNTESTED, not IDEMPOTENT, even if a non-idempotent handler.  Lost work
 * (a dropped delivery or publish) counts in NO EFFECT. */
static void test_withheld_deliveries_prove_nothing(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    /* drop on deliver, then the copy (streams' XAUTOCLAIM) runs once. */
    add(v, DELIVER, "d1", "drop_only");
    add_fault(v, "d1", "drop_only", RULE_EV_DELIVER, RULE_ACT_DROP, "drop");
    add(v, DELIVER, "d1", "drop_only");
    effect(v, "d1", 1);
    /* delay on deliver: delivered once, late. */
    add(v, DELIVER, "d2", "drop_only");
    add_fault(v, "d2", "drop_only", RULE_EV_DELIVER, RULE_ACT_DELAY, "delay 2000ms");
    effect(v, "d2", 1);
    /* error and close before on deliver: the worker got nothing. */
    add(v, DELIVER, "d3", "drop_only");
    add_fault(v, "d3", "drop_only", RULE_EV_DELIVER, RULE_ACT_ERROR, "error 406");
    add(v, DELIVER, "d3", "drop_only");
    add_fault(v, "d3", "drop_only", RULE_EV_DELIVER, RULE_ACT_CLOSE, "close before");
    add_fault(v, "d3", "drop_only", RULE_EV_DELIVER, RULE_ACT_DROP, "drop"); /* same delivery */
    add(v, DELIVER, "d3", "drop_only");
    effect(v, "d3", 1);
    /* a dropped publish: never delivered, work lost. */
    add(v, PUBLISH, "p1", "pub");
    add_fault(v, "p1", "pub", RULE_EV_PUBLISH, RULE_ACT_DROP, "drop");
    /* close after on deliver: the worker got it, and its copy. */
    add(v, DELIVER, "c1", "twice");
    add_fault(v, "c1", "twice", RULE_EV_DELIVER, RULE_ACT_CLOSE, "close after");
    add(v, DELIVER, "c1", "twice");
    effect(v, "c1", 1);

    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "drop_only");
    assert_int_equal(t->messages, 3);
    assert_int_equal(t->faulted, 3);
    assert_int_equal(t->delivered_more_than_once, 0);
    assert_int_equal(t->no_effect, 0);
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    t = row(&res, "pub");
    assert_int_equal(t->no_effect, 1);
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    t = row(&res, "twice");
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(res.overall, VERDICT_IDEMPOTENT);
    verdict_result_free(&res);
    verdict_free(v);

    /* Two effects after one delivery that reached the handler (the other
     * dropped): flagged as doubled without a second delivery. */
    v = verdict_new();
    add(v, DELIVER, "x", "t");
    add_fault(v, "x", "t", RULE_EV_DELIVER, RULE_ACT_DROP, "drop");
    add(v, DELIVER, "x", "t");
    effect(v, "x", 2);
    /* Two withholding faults journaled on one delivery (amqp: a close before
     * ends the actions, a drop after it fired too): one delivery withheld,
     * and the two others reached the handler. */
    add(v, DELIVER, "y", "u");
    add_fault(v, "y", "u", RULE_EV_DELIVER, RULE_ACT_CLOSE, "close before");
    add_fault(v, "y", "u", RULE_EV_DELIVER, RULE_ACT_DROP, "drop");
    add(v, DELIVER, "y", "u");
    add(v, DELIVER, "y", "u");
    effect(v, "y", 2);
    assert_int_equal(verdict_compute(v, &res), 0);
    t = row(&res, "t");
    assert_int_equal(t->verdict, VERDICT_NOT_IDEMPOTENT);
    assert_int_equal(t->doubled_single_delivery, 1);
    t = row(&res, "u");
    assert_int_equal(t->delivered_more_than_once, 1);
    assert_int_equal(t->doubled_single_delivery, 0);
    verdict_result_free(&res);
    verdict_free(v);
}

/* Many messages: the maps grow and every count survives. */
static void add_at(struct verdict *v, Twice__Journal__Record__Kind kind, const char *id,
                   const char *task, uint64_t ms, uint32_t action)
{
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    r.kind = kind;
    r.message_id = (char *)id;
    r.task = (char *)task;
    r.time_unix_us = T0_US + ms * 1000;
    r.event = RULE_EV_DELIVER;
    r.action = action;
    assert_int_equal(verdict_add_record(v, &r), 0);
}

/* The copy delays tested, per task: from each message's first delivery that reached the
 * handler to each later one that did; a withheld delivery is neither a first nor a copy. */
static void test_copy_windows(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    assert_non_null(v);
    /* charge: copies 200 ms, 6.2 s and 3 s after their firsts */
    add_at(v, DELIVER, "a", "charge", 0, 0);
    add_at(v, DELIVER, "a", "charge", 200, 0);
    add_at(v, DELIVER, "b", "charge", 1000, 0);
    add_at(v, DELIVER, "b", "charge", 7200, 0);
    add_at(v, DELIVER, "b", "charge", 4000, 0);
    /* email: its first delivery was dropped, so the first is the one at 5 s; a later drop
     * withholds a copy too */
    add_at(v, DELIVER, "e", "email", 0, 0);
    add_at(v, FAULT, "e", "email", 1, RULE_ACT_DROP);
    add_at(v, DELIVER, "e", "email", 5000, 0);
    add_at(v, DELIVER, "e", "email", 9000, 0);
    add_at(v, FAULT, "e", "email", 9001, RULE_ACT_DROP);
    add_at(v, DELIVER, "e", "email", 65000, 0);
    /* resize: one delivery, no copy */
    add_at(v, DELIVER, "r", "resize", 0, 0);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    assert_int_equal(res.n_tasks, 3);
    const struct verdict_task *charge = &res.tasks[0], *email = &res.tasks[1],
                              *resize = &res.tasks[2];
    assert_string_equal(charge->task, "charge");
    assert_int_equal(charge->copies, 3);
    assert_int_equal(charge->copy_min_us, 200000);
    assert_int_equal(charge->copy_median_us, 3000000);
    assert_int_equal(charge->copy_max_us, 6200000);
    assert_string_equal(email->task, "email");
    assert_int_equal(email->copies, 1);
    assert_int_equal(email->copy_min_us, 60000000);
    assert_int_equal(email->copy_max_us, 60000000);
    assert_int_equal(email->delivered_more_than_once, 1);
    assert_int_equal(resize->copies, 0);
    verdict_result_free(&res);
    verdict_free(v);
}

static void test_many_messages(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    char id[32], task[16];
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "msg-%d", i);
        snprintf(task, sizeof(task), "task-%d", i % 7);
        add(v, DELIVER, id, task);
        if (i % 10 == 0)
            add(v, FAULT, id, task);
        effect(v, id, i % 1000 == 0 ? 2 : 1);
    }
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    assert_int_equal(res.n_tasks, 7);
    uint64_t messages = 0, faulted = 0, doubled = 0;
    for (size_t i = 0; i < res.n_tasks; i++) {
        messages += res.tasks[i].messages;
        faulted += res.tasks[i].faulted;
        doubled += res.tasks[i].more_than_one_effect;
    }
    assert_int_equal(messages, n);
    assert_int_equal(faulted, n / 10);
    assert_int_equal(doubled, n / 1000);
    assert_int_equal(res.effect_lines, n + n / 1000);
    verdict_result_free(&res);
    verdict_free(v);
}

/* ---- files and the commands ------------------------------------------ */

struct jrec {
    enum journal_kind kind;
    const char *id, *task, *rule, *action, *reason;
    uint32_t event;
    uint64_t at_ms, session;
    uint32_t retries;
    bool retry;
    /* RULES: a change of the rules in force (journal_rules_changed()); `action` its detail,
     * `reason` its client; sha: every byte of its rules_sha256 */
    enum journal_change change;
    enum journal_change_source source;
    uint32_t rules, rules_disabled;
    bool faults_off;
    uint8_t sha;
};

/* The listener "amqp" the records name, as the journal's header describes it (NULL: the header
 * names no listener, as an old journal's). */
struct jlistener {
    const char *protocol, *profile;
    uint32_t visibility_ms;
    bool consumer_timeout;
};

/* A run of twice on the journal at path, as `mode` says, with `seed`, started at start_ms, its
 * listener as l says. */
static void write_run(const char *path, enum journal_mode mode, uint64_t seed, uint64_t start_ms,
                      const struct jrec *recs, size_t n, const struct jlistener *l)
{
    struct journal_header_info h = {
        .seed = seed, .config_path = "t.twice", .start_unix_ms = start_ms};
    static const char *const names[] = {"amqp"};
    const char *protocols[1], *profiles[1];
    uint32_t visibility[1];
    bool consumer[1];
    if (l != NULL) {
        protocols[0] = l->protocol;
        profiles[0] = l->profile;
        visibility[0] = l->visibility_ms;
        consumer[0] = l->consumer_timeout;
        h.listener_names = names;
        h.listener_protocols = protocols;
        h.listener_profiles = profiles;
        h.listener_visibility_ms = visibility;
        h.listener_consumer_timeout = consumer;
        h.n_listeners = 1;
    }
    memset(h.config_sha256, 0xab, sizeof(h.config_sha256));
    char err[256];
    struct journal *j = journal_open_mode(path, &h, NULL, mode, NULL, err, sizeof(err));
    assert_non_null(j);
    for (size_t i = 0; i < n; i++) {
        if (recs[i].kind == JOURNAL_KIND_RULES) {
            struct journal_rules_change c = {.time_unix_us = T0_US + recs[i].at_ms * 1000,
                                             .change = recs[i].change,
                                             .source = recs[i].source,
                                             .rule = recs[i].rule,
                                             .client = recs[i].reason,
                                             .detail = recs[i].action,
                                             .rules = recs[i].rules,
                                             .rules_disabled = recs[i].rules_disabled,
                                             .faults_off = recs[i].faults_off};
            memset(c.rules_sha256, recs[i].sha, sizeof(c.rules_sha256));
            journal_rules_changed(j, &c);
            continue;
        }
        struct journal_record r = {
            .kind = recs[i].kind,
            .time_unix_us = T0_US + recs[i].at_ms * 1000,
            .session = recs[i].session,
            .listener = "amqp",
            .queue = "jobs",
            .message_id = recs[i].id,
            .task = recs[i].task,
            .rule = recs[i].rule,
            .action_name = recs[i].action,
            .event = recs[i].event,
            .close_reason_name = recs[i].reason,
            .bytes_up = 10,
            .bytes_down = 20,
            .retries = recs[i].retries,
            .retry = recs[i].retry,
        };
        journal_record(j, &r);
    }
    journal_close(j);
}

/* The journal at path, over whatever the file held (a test may write one case after another). */
static void write_journal_on(const char *path, const struct jrec *recs, size_t n,
                             const struct jlistener *l)
{
    write_run(path, JOURNAL_MODE_OVERWRITE, 42, 1000, recs, n, l);
}

static void write_journal(const char *path, const struct jrec *recs, size_t n)
{
    write_journal_on(path, recs, n, NULL);
}

/* The charge/email/resize journal of test_counts_and_verdicts, on disk.  m1's first delivery
 * was cut with its connection before the worker settled it: its redelivery is set aside, not a
 * copy, and m1's two effects still make charge NOT IDEMPOTENT.  e1's ack was delayed by a rule
 * and the message came again after it: a copy after the first was settled. */
static const struct jrec mixed_journal[] = {
    {.kind = JOURNAL_KIND_CONNECT, .session = 1},
    {.kind = JOURNAL_KIND_DELIVER, .id = "m1", .task = "charge", .at_ms = 0, .session = 1},
    {.kind = JOURNAL_KIND_FAULT,
     .id = "m1",
     .task = "charge",
     .rule = "crash",
     .action = "close",
     .event = 2,
     .at_ms = 10,
     .session = 1},
    {.kind = JOURNAL_KIND_CLOSE, .reason = "client_closed", .session = 1, .at_ms = 11},
    {.kind = JOURNAL_KIND_DELIVER, .id = "m1", .task = "charge", .at_ms = 1500, .session = 2},
    {.kind = JOURNAL_KIND_ACK, .id = "m1", .task = "charge", .at_ms = 1600, .session = 2},
    {.kind = JOURNAL_KIND_DELIVER, .id = "m2", .task = "charge", .at_ms = 1700, .session = 2},
    {.kind = JOURNAL_KIND_ACK, .id = "m2", .task = "charge", .at_ms = 1800, .session = 2},
    {.kind = JOURNAL_KIND_DELIVER, .id = "e1", .task = "email", .at_ms = 100, .session = 2},
    {.kind = JOURNAL_KIND_ACK, .id = "e1", .task = "email", .at_ms = 200, .session = 2},
    {.kind = JOURNAL_KIND_FAULT,
     .id = "e1",
     .task = "email",
     .rule = "slow-ack",
     .action = "delay",
     .event = 3,
     .at_ms = 200,
     .session = 2},
    {.kind = JOURNAL_KIND_DELIVER, .id = "e1", .task = "email", .at_ms = 2100, .session = 3},
    {.kind = JOURNAL_KIND_ACK, .id = "e1", .task = "email", .at_ms = 2200, .session = 3},
    {.kind = JOURNAL_KIND_DELIVER, .id = "r1", .task = "resize", .at_ms = 2300, .session = 2},
    {.kind = JOURNAL_KIND_ACK, .id = "r1", .task = "resize", .at_ms = 2400, .session = 2},
};

static const char mixed_effects[] = "# charges from the payments table\n"
                                    "m1\r\n"
                                    "m1\r\n"
                                    "\n"
                                    "   \n"
                                    "m2\n"
                                    "e1\n"
                                    "  r1  \n"
                                    "ghost\n";

/* An IDEMPOTENT row says over which copy delays it held, and when they were all short, how
 * to test a later one; a row tested past a minute does not get the hint. */
static void test_verdict_prints_the_window(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "short", .at_ms = 0},
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "short", .at_ms = 400},
        {.kind = JOURNAL_KIND_DELIVER, .id = "b", .task = "short", .at_ms = 0},
        {.kind = JOURNAL_KIND_DELIVER, .id = "b", .task = "short", .at_ms = 1600},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c", .task = "long", .at_ms = 0},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c", .task = "long", .at_ms = 90000},
    };
    write_journal(f->journal, recs, 6);
    write_file(f->effects, "a\nb\nc\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 0);
    assert_contains(f->out, "short: IDEMPOTENT for copies 400ms-1.6s after the first delivery "
                            "(median 1.0s, 2 copies)\n  no copy ran while an earlier one was "
                            "running: check-then-act races untested (2 unknown: ");
    assert_contains(f->out, "\n  every copy came within 1.6s: ");
    /* no window hint after a copy 90 s late, and no listener in a header that names none */
    assert_contains(f->out, "long: IDEMPOTENT for copies 90s-90s after the first delivery "
                            "(median 90s, 1 copy)\n  no copy ran while an earlier one was running: "
                            "check-then-act races untested (1 unknown: the earlier delivery was "
                            "never settled on the wire, or the two shared a connection, or one of "
                            "them may have waited behind its worker's other work); to test them "
                            "`when deliver task=long` + `do duplicate`\nshort: IDEMPOTENT");
    assert_contains(f->out, "  400ms-1.6s     IDEMPOTENT*     missing: overlap, window\n");
    assert_contains(f->out, "  90s-90s        IDEMPOTENT*     missing: overlap\n");
}

/* The rule that brings a later copy fits the listener the task came through: on an amqp
 * listener with a visibility (or consumer) timeout V, `after D` is refused at V or more, so the
 * hint names what works past it; BullMQ's stalled checker chooses when a job comes back, so no
 * `after D` there. */
static void test_verdict_window_hint_fits_the_listener(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "short", .at_ms = 0, .session = 1},
        {.kind = JOURNAL_KIND_ACK, .id = "a", .task = "short", .at_ms = 100, .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "short", .at_ms = 400, .session = 2},
        {.kind = JOURNAL_KIND_ACK, .id = "a", .task = "short", .at_ms = 500, .session = 2},
    };
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    write_file(f->effects, "a\n");
    const struct {
        struct jlistener l;
        const char *hint;
    } cases[] = {
        {{"amqp", NULL, 30000, false},
         "later copies on listener 'amqp' (amqp): `when ack task=short` + `do redeliver after D` "
         "with D below 30s (the listener's visibility-timeout: a later `after` is refused, an "
         "ack twice holds counting as not acked); for copies later than 30s, `when deliver "
         "task=short` + `do expire D` (D in place of the visibility-timeout for those "
         "deliveries) with `when ack task=short` + `do drop`: each message whose ack is dropped "
         "comes back D after its delivery\n"},
        {{"amqp", NULL, 120000, true},
         "`do redeliver after D` with D below 2m (the listener's consumer-timeout: "},
        {{"amqp", NULL, 0, false},
         "later copies on listener 'amqp' (amqp): `when ack task=short` + `do redeliver after D`, "
         "or `when deliver task=short` + `do duplicate after D`\n"},
        {{"resp", "bullmq", 0, false},
         "later copies on listener 'amqp' (resp, bullmq): `when lease task=short` + `do drop`, "
         "with a lockDuration and stalledInterval of about D/2 each (BullMQ's stalled checker "
         "decides when a job comes back, not twice)\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_journal_on(f->journal, recs, 4, &cases[i].l);
        assert_int_equal(run(f, verdict_run, 5, argv), 0);
        assert_contains(f->out, cases[i].hint);
    }
    /* nothing suggests `after D` where the framework decides when a copy comes */
    assert_null(strstr(f->out, "after D"));
}

static void test_verdict_command_human(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, mixed_journal, sizeof(mixed_journal) / sizeof(mixed_journal[0]));
    write_file(f->effects, mixed_effects);
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 1);
    assert_contains(f->out,
                    "TASK    MESSAGES  FAULTED  DELIVERED>1  EFFECTS>1  NO EFFECT  RETRIED  "
                    "OVERLAPPED  COPY DELAYS    VERDICT         EXAMPLES\n");
    assert_contains(f->out,
                    "charge         2        1            0          1          0        0  "
                    "       0/0  -              NOT IDEMPOTENT  m1\n");
    assert_contains(f->out,
                    "email          1        1            1          0          0        0  "
                    "       0/1  2.0s-2.0s      IDEMPOTENT*     missing: overlap, window\n");
    assert_contains(f->out,
                    "resize         1        0            0          0          0        0  "
                    "       0/0  -              UNTESTED\n");
    assert_contains(f->out, "email: IDEMPOTENT for copies 2.0s-2.0s after the first delivery "
                            "(median 2.0s, 1 copy)\n  no copy ran while an earlier one was "
                            "running: check-then-act races untested (1 copy came after the "
                            "earlier delivery was settled); to test them `when deliver "
                            "task=email` + `do duplicate`\n  every copy came within 2.0s");
    /* m1's first delivery was cut with its connection, never settled: its redelivery is no
     * copy, and says so */
    assert_contains(f->out, "\ncharge: 1 redelivery of 1 message set aside, not counted as "
                            "copies: no worker was seen to finish the delivery before");
    assert_contains(f->out, "resize: UNTESTED: no copy reached the handler; to make one `when "
                            "deliver task=resize` + `do duplicate`\n");
    assert_contains(f->out, "6 side effects");
    assert_contains(f->out,
                    "warning: 1 message ids in the effects list (1 lines) never appear in "
                    "the journal; were their workers connected through twice? (e.g. ghost)\n");
    assert_contains(f->out, "\nverdict: NOT IDEMPOTENT\n");
    assert_string_equal(f->err, "");
}

static void test_verdict_command_json(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, mixed_journal, sizeof(mixed_journal) / sizeof(mixed_journal[0]));
    write_file(f->effects, mixed_effects);
    const char *argv[] = {"verdict", "--json", "--journal=", "--effects", f->effects};
    char jarg[160];
    snprintf(jarg, sizeof(jarg), "--journal=%s", f->journal);
    argv[2] = jarg;
    assert_int_equal(run(f, verdict_run, 5, argv), 1);
    assert_contains(f->out, "\"verdict\": \"NOT IDEMPOTENT\",\n");
    assert_contains(f->out, "{\"task\": \"charge\", \"messages\": 2, \"faulted\": 1, "
                            "\"delivered_more_than_once\": 0, \"more_than_one_effect\": 1, "
                            "\"no_effect\": 0, \"verdict\": \"NOT IDEMPOTENT\", \"copies\": 0, "
                            "\"copy_delay_ms\": null, \"examples\": [\"m1\"]");
    assert_contains(f->out, "\"evidence_missing\": [], \"required_short\": false, "
                            "\"set_aside\": 1, \"set_aside_messages\": 1, "
                            "\"set_aside_examples\": [\"m1\"]");
    assert_contains(f->out, "{\"task\": \"email\", \"messages\": 1, \"faulted\": 1, "
                            "\"delivered_more_than_once\": 1, \"more_than_one_effect\": 0, "
                            "\"no_effect\": 0, \"verdict\": \"IDEMPOTENT\", \"copies\": 1, "
                            "\"copy_delay_ms\": {\"min\": 2000, \"median\": 2000, \"max\": 2000}, "
                            "\"examples\": []");
    assert_contains(f->out, "\"overlapping_copies\": 0, \"sequential_copies\": 1, "
                            "\"overlap_unknown_copies\": 0, \"overlap_ms\": null, "
                            "\"overlap_examples\": [], \"evidence_missing\": [\"overlap\", "
                            "\"window\"]");
    assert_contains(f->out, "\"effects_check\": \"ok\",");
    assert_contains(f->out, "\"copies\": 0, \"copy_delay_ms\": null");
    assert_contains(f->out, "\"verdict\": \"UNTESTED\"");
    assert_contains(f->out, "\"unknown_effects\": {\"ids\": 1, \"lines\": 1, "
                            "\"examples\": [\"ghost\"]}");
    assert_contains(f->out, "\"seed\": \"42\",");
    assert_contains(f->out, "\"effect_lines\": 6,");
}

static void test_verdict_idempotent_and_untested_exit_zero(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "send_email"},
        {.kind = JOURNAL_KIND_FAULT,
         .id = "a",
         .task = "send_email",
         .rule = "r",
         .action = "redeliver",
         .event = 2},
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "send_email"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "b", .task = "send_email"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c", .task = "resize"},
    };
    write_journal(f->journal, recs, 5);
    write_file(f->effects, "a\nc\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 0);
    assert_contains(f->out,
                    "send_email         2        1            1          0          1        0  "
                    "       0/1  <1ms-<1ms      IDEMPOTENT*     missing: overlap, window\n");
    assert_contains(f->out,
                    "resize             1        0            0          0          0        0  "
                    "       0/0  -              UNTESTED\n");
    assert_contains(f->out, "\nverdict: IDEMPOTENT* (evidence missing for 1 task: see the lines "
                            "under the table)\n");
}

static void test_verdict_doubled_without_redelivery_is_flagged(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "p1", .task = "pay"},
        {.kind = JOURNAL_KIND_FAULT,
         .id = "p1",
         .task = "pay",
         .rule = "r",
         .action = "delay",
         .event = 3},
    };
    write_journal(f->journal, recs, 2);
    write_file(f->effects, "p1\np1\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 1);
    assert_contains(f->out, "warning: pay: 1 message ids have 2+ effects but were delivered at "
                            "most once: effect doubled without a second delivery: check your "
                            "effects list (e.g. p1)");
}

/* Two effects over the app's own attempts, no copy: NOT IDEMPOTENT, and said apart. */
static void test_doubled_by_retries(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "p1", .task = "pay"},
        {.kind = JOURNAL_KIND_PUBLISH, .id = "p1", .task = "pay", .retries = 1, .retry = true},
        {.kind = JOURNAL_KIND_DELIVER, .id = "p1", .task = "pay", .retries = 1},
    };
    write_journal(f->journal, recs, 3);
    write_file(f->effects, "p1\np1\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 1);
    assert_contains(f->out, "pay          1        0            0          1          0        1  "
                            "       0/0  -              NOT IDEMPOTENT  p1\n");
    assert_contains(f->out, "pay: 1 message retried by the app, at most 1 retry of one; their "
                            "attempts are not counted as copies\n");
    assert_contains(f->out, "warning: pay: 1 message ids have 2+ effects over the app's own "
                            "retries, with no copy from twice: the handler did its side effect, "
                            "then failed and was retried (e.g. p1)\n");
    const char *jargv[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, jargv), 1);
    assert_contains(f->out, "\"retried\": 1, \"max_retries\": 1, \"doubled_by_retries\": 1, "
                            "\"doubled_by_retries_examples\": [\"p1\"], \"failed_examples\": [], "
                            "\"abandoned\": 0, \"abandoned_examples\": [], ");
}

/* RQ's heartbeat lapsed: the registry's cleanup failed the job (a NACK) while its horse still
 * ran, and the horse's completion (an ACK) came after.  The verdict and the report name it
 * abandoned, not failed; a job failed for good after its ack (RQ's own failure handling
 * removes it from the started registry, then adds it to the failed one) stays failed. */
static void test_abandoned_while_running(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_PUBLISH, .id = "a1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "a1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_FAULT,
         .id = "a1",
         .task = "tasks.slow",
         .rule = "lapse",
         .action = "drop",
         .event = RULE_EV_LEASE},
        {.kind = JOURNAL_KIND_NACK, .id = "a1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_ACK, .id = "a1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "b1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_ACK, .id = "b1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_NACK, .id = "b1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_ACK, .id = "c1", .task = "tasks.slow"},
        /* reaped while its horse ran, then the horse failed it too: failed, not abandoned */
        {.kind = JOURNAL_KIND_DELIVER, .id = "d1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_NACK, .id = "d1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_ACK, .id = "d1", .task = "tasks.slow"},
        {.kind = JOURNAL_KIND_NACK, .id = "d1", .task = "tasks.slow"},
    };
    write_journal(f->journal, recs, sizeof(recs) / sizeof(recs[0]));
    write_file(f->effects, "a1\nb1\nc1\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 0);
    assert_contains(f->out,
                    "warning: tasks.slow: 1 message ids were failed by the framework "
                    "while a worker still ran them, and that worker completed them "
                    "afterwards (an RQ job whose heartbeat lapsed, moved to the failed "
                    "registry): a requeue of those failed jobs runs them again (e.g. a1)\n");
    assert_contains(f->out, "warning: tasks.slow: 2 message ids ended failed");
    const char *jargv[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, jargv), 0);
    assert_contains(f->out, "\"failed_examples\": [\"b1\", \"d1\"], \"abandoned\": 1, "
                            "\"abandoned_examples\": [\"a1\"], ");
    const char *rargv[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rargv), 0);
    assert_contains(f->out, "\nFailed by the framework (FAILED: for good; ABANDONED: while a "
                            "worker still ran it, which completed it after)\n"
                            "  TASK                               FAILED  ABANDONED  E.G.\n"
                            "  tasks.slow                              2          1  a1\n");
    const char *rjargv[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, rjargv), 0);
    assert_contains(f->out, "\"failed\": [{\"task\": \"tasks.slow\", \"failed\": 2, "
                            "\"abandoned\": 1, \"abandoned_examples\": [\"a1\"]}]");
}

/* The report counts the app's retries per task, and the timeline shows them. */
static void test_report_retries(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_PUBLISH, .id = "c1", .task = "tasks.flaky"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c1", .task = "tasks.flaky"},
        {.kind = JOURNAL_KIND_PUBLISH, .id = "c1", .task = "tasks.flaky", .retries = 1, .retry = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c1", .task = "tasks.flaky", .retries = 1},
        {.kind = JOURNAL_KIND_PUBLISH, .id = "c1", .task = "tasks.flaky", .retries = 2, .retry = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "c1", .task = "tasks.flaky", .retries = 2},
        {.kind = JOURNAL_KIND_DELIVER, .id = "n1", .task = "tasks.flaky"},
        {.kind = JOURNAL_KIND_NACK, .id = "n1", .task = "tasks.flaky", .retry = true},
        {.kind = JOURNAL_KIND_DELIVER, .id = "n1", .task = "tasks.flaky"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "o1", .task = "tasks.once"},
    };
    write_journal(f->journal, recs, sizeof(recs) / sizeof(recs[0]));
    const char *argv[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, argv), 0);
    assert_contains(f->out, "\nRetries by the app (new attempts it asked for, not copies)\n"
                            "  TASK                              RETRIED  MOST RETRIES\n"
                            "  tasks.flaky                             2  2\n\n");
    const char *jargv[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, jargv), 0);
    assert_contains(f->out, "\"retries\": [{\"task\": \"tasks.flaky\", \"retried\": 2, "
                            "\"max_retries\": 2}],\n");
    const char *targv[] = {"report", f->journal, "--message", "c1"};
    assert_int_equal(run(f, report_run, 4, targv), 0);
    assert_contains(f->out, "task=tasks.flaky retries=2 retry\n");
    const char *nargv[] = {"report", f->journal, "--message", "n1"};
    assert_int_equal(run(f, report_run, 4, nargv), 0);
    assert_contains(f->out, "task=tasks.flaky requeue\n");
}

static void test_verdict_usage_and_io_errors(void **state)
{
    struct fixture *f = *state;
    const char *no_effects[] = {"verdict", "--journal", f->journal};
    assert_int_equal(run(f, verdict_run, 3, no_effects), 2);
    assert_contains(f->err, "twice verdict: no effects list given: --effects EFFECTS\n");
    const char *no_journal[] = {"verdict", "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 3, no_journal), 2);
    assert_contains(f->err, "twice verdict: no journal given\n");
    const char *dangling[] = {"verdict", "--journal"};
    assert_int_equal(run(f, verdict_run, 2, dangling), 2);
    assert_contains(f->err, "--journal needs a value");
    const char *unknown[] = {"verdict", "--jounral", "x"};
    assert_int_equal(run(f, verdict_run, 3, unknown), 2);
    assert_contains(f->err, "unknown argument '--jounral'");
    const char *help[] = {"verdict", "--help"};
    assert_int_equal(run(f, verdict_run, 2, help), 0);
    assert_contains(f->out, "usage: twice verdict");

    write_file(f->effects, "a\n");
    const char *missing[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, missing), 2);
    assert_contains(f->err, "run.journal: No such file or directory");
    const struct jrec recs[] = {{.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "t"}};
    write_journal(f->journal, recs, 1);
    unlink(f->effects);
    assert_int_equal(run(f, verdict_run, 5, missing), 2);
    assert_contains(f->err, "effects.txt: No such file or directory");
    write_file(f->journal, "not a journal at all, just text");
    write_file(f->effects, "a\n");
    assert_int_equal(run(f, verdict_run, 5, missing), 2);
    assert_contains(f->err, "twice verdict: ");
}

/* Names that need escaping stay valid JSON. */
static void test_verdict_json_escaping(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "id\"1\\", .task = "task \"quoted\"\n\x01"},
    };
    write_journal(f->journal, recs, 1);
    write_file(f->effects, "id\"1\\\nid\"1\\\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, argv), 1);
    assert_contains(f->out, "\"task\": \"task \\\"quoted\\\"\\n\\u0001\"");
    assert_contains(f->out, "\"examples\": [\"id\\\"1\\\\\"]");
}

static void test_verdict_truncated_journal_warns(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "t"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "b", .task = "t"},
    };
    write_journal(f->journal, recs, 2);
    struct stat st;
    assert_int_equal(stat(f->journal, &st), 0);
    assert_int_equal(truncate(f->journal, st.st_size - 3), 0); /* inside the second record */
    write_file(f->effects, "a\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, argv), 0);
    assert_contains(f->out, "journal's last record is cut short");
    assert_contains(f->out, ": 1 records");
}

/* ---- report ------------------------------------------------------------ */

static void test_report_human(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, mixed_journal, sizeof(mixed_journal) / sizeof(mixed_journal[0]));
    const char *whole[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, whole), 0);
    assert_contains(f->out, "seed      42\n");
    assert_contains(f->out, "config    t.twice sha256:abababab");
    assert_contains(f->out, "started   1970-01-01T00:00:01.000Z\n");
    assert_contains(f->out, "records   15 (connect 1, close 1, deliver 6, ack 5, fault 2)\n");
    /* Faults per rule, sorted by name, with the events they hit. */
    assert_contains(f->out, "  crash                           1  close        deliver=1\n"
                            "  slow-ack                        1  delay        ack=1\n");
    assert_contains(f->out, "  message ids               4\n");
    assert_contains(f->out, "  delivered more than once  2\n");
    assert_contains(f->out, "           2  e1\n           2  m1\n           1  m2\n");
    assert_contains(f->out, "connections 1, closed 1, bytes up 10, bytes down 20\n");
    assert_contains(f->out, "by close reason: client_closed=1\n");
    assert_null(strstr(f->out, "Timeline"));
    /* --message: the header, then every record of m1, in order, offsets from the first, and
     * not the whole report. */
    const char *argv[] = {"report", f->journal, "--message", "m1"};
    assert_int_equal(run(f, report_run, 4, argv), 0);
    assert_contains(f->out, "seed      42\n");
    assert_null(strstr(f->out, "slow-ack"));
    assert_null(strstr(f->out, "by close reason"));
    assert_contains(f->out, "Timeline of message m1 (4 records)\n");
    assert_contains(f->out, "      +0.000s  2025-11-29T09:00:00.000Z  deliver  session=1");
    assert_contains(f->out, "      +0.010s  2025-11-29T09:00:00.010Z  fault    session=1 "
                            "listener=amqp queue=jobs task=charge rule=crash action=close "
                            "event=deliver\n");
    assert_contains(f->out, "      +1.500s  2025-11-29T09:00:01.500Z  deliver  session=2");
    assert_contains(f->out, "      +1.600s  2025-11-29T09:00:01.600Z  ack      session=2");
    const char *first = strstr(f->out, "+0.010s");
    const char *later = strstr(f->out, "+1.500s");
    assert_true(first != NULL && later != NULL && first < later);
    /* the first delivery was cut with its connection, never settled: the second is set
     * aside, not a copy */
    assert_contains(f->out, "task=charge set_aside\n");
    assert_null(strstr(f->out, "copy_after"));
    assert_contains(f->out, "\nDeliveries, as the verdict counts them\n");
    assert_contains(f->out, "    1     +0.000s         1       0  never settled, closed at "
                            "+0.011s    unreached\n");
    assert_contains(f->out, "    2     +1.500s         2       0  ack at +1.600s" /* padded */
                            "                      set aside: ");
    /* e1 came again after its first delivery was settled: a copy, sequential */
    const char *eargv[] = {"report", f->journal, "--message", "e1"};
    assert_int_equal(run(f, report_run, 4, eargv), 0);
    assert_contains(f->out, " copy_after=2.000s overlap=no\n");
    assert_contains(f->out, "copy, after the earlier ones were settled\n");
    /* an id no record names: said, and exit 1 */
    const char *nargv[] = {"report", f->journal, "--message", "nope"};
    assert_int_equal(run(f, report_run, 4, nargv), 1);
    assert_contains(f->out, "(no record has this message id)");
    assert_contains(f->err, "no record of the journal names message id 'nope'");
    /* --messages: every delivery of every message, one line each, ids in order */
    const char *margv[] = {"report", f->journal, "--messages"};
    assert_int_equal(run(f, report_run, 3, margv), 0);
    assert_contains(f->out, "  e1 email #1 2025-11-29T09:00:00.100Z session=2 tag=0 ack=+0.100s "
                            "counted=first\n"
                            "  e1 email #2 2025-11-29T09:00:02.100Z session=3 tag=0 ack=+0.100s "
                            "counted=copy overlap=after\n"
                            "  m1 charge #1 2025-11-29T09:00:00.000Z session=1 tag=0 unsettled "
                            "counted=unreached\n");
}

static void test_report_json(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, mixed_journal, sizeof(mixed_journal) / sizeof(mixed_journal[0]));
    const char *argv[] = {"report", "--json", f->journal, "--message=m2"};
    assert_int_equal(run(f, report_run, 4, argv), 0);
    assert_contains(f->out, "\"seed\": \"42\",");
    assert_contains(f->out, "\"config_sha256\": \"abababababababababababababababab"
                            "abababababababababababababababab\"");
    assert_contains(f->out, "{\"rule\": \"crash\", \"faults\": 1, \"action\": \"close\", "
                            "\"action_code\": 0, \"by_event\": {\"deliver\": 1}}");
    assert_contains(f->out, "{\"rule\": \"slow-ack\", \"faults\": 1, \"action\": \"delay\", "
                            "\"action_code\": 0, \"by_event\": {\"ack\": 1}}");
    assert_contains(f->out, "\"deliveries\": {\"messages\": 4, \"delivered\": 4, "
                            "\"delivered_more_than_once\": 2, \"top\": [{\"message_id\": \"e1\", "
                            "\"deliveries\": 2}, {\"message_id\": \"m1\", \"deliveries\": 2}");
    assert_contains(f->out, "\"by_close_reason\": {\"client_closed\": 1}");
    assert_contains(f->out, "\"message\": {\"message_id\": \"m2\", \"more\": 0, \"records\": [");
    assert_contains(f->out, "{\"offset_us\": 0, \"time_unix_us\": 1764406801700000, "
                            "\"kind\": \"deliver\"");
    assert_contains(f->out, "\"kind\": \"ack\", \"session\": 2");
    assert_contains(f->out, "], \"deliveries\": [\n      {\"time_unix_us\": 1764406801700000, "
                            "\"session\": 2, \"delivery_tag\": 0, \"attempt\": 1, \"settlement\": "
                            "\"ack\", \"settled_unix_us\": 1764406801800000, \"settled_guess\": "
                            "false, \"closed_unix_us\": null, \"counted\": \"first\", "
                            "\"copy_delay_us\": null, \"overlap\": "
                            "null, \"overlap_us\": null, \"twice_run\": 1, \"instance\": ");
    /* --messages: every message with its deliveries */
    const char *margv[] = {"report", "--json", f->journal, "--messages"};
    assert_int_equal(run(f, report_run, 4, margv), 0);
    assert_contains(f->out, "\"messages\": [\n    {\"message_id\": \"e1\", \"task\": \"email\", "
                            "\"deliveries\": [");
    assert_contains(f->out, "\"counted\": \"copy\", \"copy_delay_us\": 2000000, \"overlap\": "
                            "\"after\", \"overlap_us\": null, \"twice_run\": 1, \"instance\": ");
    assert_contains(f->out, "{\"message_id\": \"r1\", \"task\": \"resize\"");
    const char *nargv[] = {"report", "--json", f->journal, "--message", "nope"};
    assert_int_equal(run(f, report_run, 5, nargv), 1);
}

/* A visibility timeout that runs out on an ack a rule held is the consequence of that rule's one
 * fault (an EXPIRED record naming it), not a second fault: the report counts one fault per
 * decision and lists the requeues apart, with those of a worker slower than the timeout (no
 * rule); the verdict counts the held message faulted once, the slow one not at all. */
static void test_report_expiry_is_no_fault(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "h1", .task = "email", .at_ms = 0, .session = 1},
        {.kind = JOURNAL_KIND_ACK, .id = "h1", .task = "email", .at_ms = 100, .session = 1},
        {.kind = JOURNAL_KIND_FAULT,
         .id = "h1",
         .task = "email",
         .rule = "slow-ack",
         .action = "delay",
         .event = 3,
         .at_ms = 100,
         .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "s1", .task = "email", .at_ms = 200, .session = 1},
        {.kind = JOURNAL_KIND_EXPIRED,
         .id = "h1",
         .task = "email",
         .rule = "slow-ack",
         .at_ms = 3000,
         .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "h1", .task = "email", .at_ms = 3010, .session = 2},
        {.kind = JOURNAL_KIND_ACK, .id = "h1", .task = "email", .at_ms = 3100, .session = 2},
        {.kind = JOURNAL_KIND_EXPIRED, .id = "s1", .task = "email", .at_ms = 3200, .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "s1", .task = "email", .at_ms = 3210, .session = 2},
        {.kind = JOURNAL_KIND_ACK, .id = "s1", .task = "email", .at_ms = 3300, .session = 2},
    };
    write_journal(f->journal, recs, sizeof(recs) / sizeof(recs[0]));
    const char *argv[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, argv), 0);
    assert_contains(f->out, "records   10 (deliver 4, ack 3, fault 1, expired 2)\n");
    assert_contains(f->out, "  RULE                       FAULTS  ACTION       BY EVENT\n"
                            "  slow-ack                        1  delay        ack=1\n");
    assert_contains(f->out,
                    "\nRequeued by a visibility or consumer timeout (consequences, not faults)\n"
                    "  RULE                      EXPIRED  WHY\n"
                    "  -                               1  the worker did not ack in time\n"
                    "  slow-ack                        1  the rule held or dropped the ack\n");
    const char *jargv[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, jargv), 0);
    assert_contains(f->out, "\"faults\": [\n    {\"rule\": \"slow-ack\", \"faults\": 1, "
                            "\"action\": \"delay\", \"action_code\": 0, \"by_event\": "
                            "{\"ack\": 1}}\n  ],\n  \"expired\": [{\"rule\": \"\", "
                            "\"expired\": 1}, {\"rule\": \"slow-ack\", \"expired\": 1}],");
    assert_contains(f->out, "\"expired\": 2, \"rules\": 0, \"other\": 0}");
    /* the timeline says what the requeue was, and whose */
    const char *targv[] = {"report", f->journal, "--message", "h1"};
    assert_int_equal(run(f, report_run, 4, targv), 0);
    assert_contains(f->out, "expired  session=1 listener=amqp queue=jobs task=email "
                            "rule=slow-ack\n");
    write_file(f->effects, "h1\ns1\n");
    const char *vargv[] = {"verdict", "--json", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 6, vargv), 0);
    assert_contains(f->out, "{\"task\": \"email\", \"messages\": 2, \"faulted\": 1, ");
}

/* A journal of two runs (`journal PATH append`): the first killed with m1 delivered on its
 * session 1, the second delivering m1 again on its own session 1 and acking it.  The runs are
 * listed, the first's unclean end warned of; the ack is the second run's delivery's, and the
 * first run's connection closed with it. */
static void test_journal_of_several_runs(void **state)
{
    struct fixture *f = *state;
    static const struct jrec first[] = {
        {.kind = JOURNAL_KIND_CONNECT, .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "m1", .task = "charge", .at_ms = 0, .session = 1},
    };
    static const struct jrec second[] = {
        {.kind = JOURNAL_KIND_CONNECT, .session = 1, .at_ms = 5000},
        {.kind = JOURNAL_KIND_DELIVER, .id = "m1", .task = "charge", .at_ms = 5000, .session = 1},
        {.kind = JOURNAL_KIND_ACK, .id = "m1", .task = "charge", .at_ms = 5100, .session = 1},
        {.kind = JOURNAL_KIND_CLOSE, .session = 1, .at_ms = 5200, .reason = "client_closed"},
        {.kind = JOURNAL_KIND_STOP, .at_ms = 5300},
    };
    write_run(f->journal, JOURNAL_MODE_NEW, 42, 1000, first, 2, NULL);
    write_run(f->journal, JOURNAL_MODE_APPEND, 43, 1764406805000ull, second, 5, NULL);
    const char *text[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, text), 0);
    assert_contains(f->out, "seed      42\n");
    assert_contains(f->out, "records   7 (connect 2, close 1, deliver 2, ack 1, stop 1)\n");
    assert_contains(f->out, "runs      2 (twice started on this file 2 times");
    assert_contains(f->out, "\nRuns\n");
    assert_contains(f->out, "    1  1970-01-01T00:00:01.000Z         2  no clean stop  42    ");
    assert_contains(f->out, "    2  2025-11-29T09:00:05.000Z         5  stop           43    ");
    assert_contains(f->out, "warning: 1 of the journal's 2 runs ended without a clean stop");
    assert_null(strstr(f->out, "the journal ended without a clean stop"));

    const char *one[] = {"report", f->journal, "--json", "--message", "m1"};
    assert_int_equal(run(f, report_run, 5, one), 0);
    assert_contains(f->out, "\"runs\": [\n    {\"run\": 1, \"seed\": \"42\"");
    assert_contains(f->out, "\"records\": 2, \"clean_stop\": false, \"instance\": ");
    assert_contains(f->out, "},\n    {\"run\": 2, \"seed\": \"43\"");
    assert_contains(f->out, "\"records\": 5, \"clean_stop\": true, \"instance\": ");
    /* The first run's delivery: never settled, its connection gone with its run. */
    assert_contains(f->out, "{\"time_unix_us\": 1764406800000000, \"session\": 1, "
                            "\"delivery_tag\": 0, \"attempt\": 1, \"settlement\": \"\", "
                            "\"settled_unix_us\": null, \"settled_guess\": false, "
                            "\"closed_unix_us\": 1764406800000000");
    /* The second's: settled by the ack on its own session 1. */
    assert_contains(f->out, "{\"time_unix_us\": 1764406805000000, \"session\": 1, "
                            "\"delivery_tag\": 0, \"attempt\": 1, \"settlement\": \"ack\", "
                            "\"settled_unix_us\": 1764406805100000");
    assert_contains(f->out, "\"twice_run\": 2, \"instance\": ");
    const char *table[] = {"report", f->journal, "--message", "m1"};
    assert_int_equal(run(f, report_run, 4, table), 0);
    assert_contains(f->out, "deliver  session=1 twice_run=2 listener=amqp");
    assert_contains(f->out, "       2:1       0  ack at +5.100s");

    write_file(f->effects, "m1\n");
    const char *verdict[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, verdict), 0);
    assert_contains(f->out, ": 7 records in 2 runs (journal PATH append), seed 42 (the first "
                            "run's)\n");
    assert_contains(f->out, "warning: 1 of the journal's 2 runs ended without a clean stop");
    const char *json[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, json), 0);
    assert_contains(f->out, "\"journal_clean_stop\": true,\n  \"journal_runs\": 2,\n"
                            "  \"journal_runs_unclean\": 1,\n");
    assert_contains(f->err, "1 of the journal's 2 runs ended without a clean stop");
}

#define ADMIN JOURNAL_SOURCE_ADMIN_API

/* A run whose rules changed while it ran: a rule switched off through the admin API, the kill
 * switch on, a reload by SIGHUP, the kill switch off.  The report lists each change with its
 * time from the start, who made it and the rules after it with their digest; the verdict says
 * the rules changed, how often, and how long faults were off, in its text and its JSON. */
static void test_rule_changes(void **state)
{
    struct fixture *f = *state;
    static const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_CONNECT, .session = 1},
        {.kind = JOURNAL_KIND_DELIVER, .id = "m1", .task = "charge", .at_ms = 100, .session = 1},
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 1000,
         .change = JOURNAL_CHANGE_RULE_DISABLED,
         .source = ADMIN,
         .rule = "slow",
         .reason = "127.0.0.1:5000",
         .action = "POST /rules/slow/disable",
         .rules = 2,
         .rules_disabled = 1,
         .sha = 0xab},
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 2000,
         .change = JOURNAL_CHANGE_FAULTS_OFF,
         .source = ADMIN,
         .reason = "127.0.0.1:5001",
         .action = "POST /faults/off",
         .rules = 2,
         .rules_disabled = 1,
         .faults_off = true,
         .sha = 0xab},
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 3500,
         .change = JOURNAL_CHANGE_RELOADED,
         .source = JOURNAL_SOURCE_SIGNAL,
         .action = "SIGHUP",
         .rules = 3,
         .faults_off = true,
         .sha = 0xcd},
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 4000,
         .change = JOURNAL_CHANGE_FAULTS_ON,
         .source = ADMIN,
         .reason = "[::1]:5002",
         .action = "POST /faults/on",
         .rules = 3,
         .sha = 0xcd},
        {.kind = JOURNAL_KIND_ACK, .id = "m1", .task = "charge", .at_ms = 5000, .session = 1},
        {.kind = JOURNAL_KIND_CLOSE, .session = 1, .at_ms = 5100, .reason = "client_closed"},
        {.kind = JOURNAL_KIND_STOP, .at_ms = 6000},
    };
    write_run(f->journal, JOURNAL_MODE_NEW, 42, T0_US / 1000, recs, sizeof(recs) / sizeof(recs[0]),
              NULL);
    const char *text[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, text), 0);
    assert_contains(f->out,
                    "records   9 (connect 1, close 1, deliver 1, ack 1, stop 1, rules 4)\n");
    assert_contains(
        f->out,
        "\nRule changes (4; AT: since the start of its run; RULES, FAULTS and SHA-256: the rules "
        "in "
        "force after it)\n"
        "          AT  CHANGE          RULE                  BY                          RULES     "
        "  FAULTS  SHA-256\n"
        "     +1.000s  rule disabled   slow                  admin 127.0.0.1:5000        2 (1 off) "
        "  on      abababababababababababababababababababababababababababababababab\n"
        "     +2.000s  faults off      -                     admin 127.0.0.1:5001        2 (1 off) "
        "  off     abababababababababababababababababababababababababababababababab\n"
        "     +3.500s  reloaded        -                     SIGHUP                      3         "
        "  off     cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd\n"
        "     +4.000s  faults on       -                     admin [::1]:5002            3         "
        "  on      cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd\n\n"
        "Faults per rule\n");
    const char *json[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, json), 0);
    assert_contains(f->out, "\"rules\": 4, \"other\": 0}");
    assert_contains(f->out,
                    "\"rule_changes\": [\n    {\"twice_run\": 1, \"time_unix_us\": "
                    "1764406801000000, \"offset_us\": 1000000, \"change\": \"rule_disabled\", "
                    "\"rule\": \"slow\", \"source\": \"admin_api\", \"client\": "
                    "\"127.0.0.1:5000\", \"detail\": \"POST /rules/slow/disable\", "
                    "\"rules_sha256\": \"abababababababababababababababababababababababababab"
                    "abababababab\", \"rules\": 2, \"rules_disabled\": 1, \"faults_off\": false},");
    assert_contains(f->out, "\"offset_us\": 3500000, \"change\": \"reloaded\", \"rule\": \"\", "
                            "\"source\": \"signal\", \"client\": \"\", \"detail\": \"SIGHUP\"");

    write_file(f->effects, "m1\n");
    const char *verdict[] = {"verdict", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 4, verdict), 0);
    assert_contains(f->out, "effects ");
    assert_contains(f->out, ": 1 side effects\nrules changed 4 times during the run (1 rule "
                            "disabled, 1 faults off, 1 faults on, 1 reloaded); faults were off "
                            "for 2.000s of it: read the result against the rules in force (twice "
                            "report lists each change)\n\n");
    const char *vjson[] = {"verdict", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 5, vjson), 0);
    assert_contains(f->out,
                    "\"rule_changes\": {\"count\": 4, \"by_change\": {\"rule_disabled\": 1, "
                    "\"faults_off\": 1, \"faults_on\": 1, \"reloaded\": 1}, "
                    "\"faults_off_us\": 2000000, \"list\": [\n      {\"twice_run\": 1, ");
}

/* The kill switch of a run killed while it held faults off held them off until that run's
 * last record, not into the next run (a new process starts with faults on); the changes of a
 * journal of several runs are timed from the start of their own run.  A run without changes
 * says so. */
static void test_rule_changes_over_runs(void **state)
{
    struct fixture *f = *state;
    static const struct jrec first[] = {
        {.kind = JOURNAL_KIND_CONNECT, .session = 1},
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 1000,
         .change = JOURNAL_CHANGE_FAULTS_OFF,
         .source = ADMIN,
         .reason = "127.0.0.1:5001",
         .faults_off = true},
        {.kind = JOURNAL_KIND_CLOSE, .session = 1, .at_ms = 3000},
    };
    static const struct jrec second[] = {
        {.kind = JOURNAL_KIND_RULES,
         .at_ms = 10500,
         .change = JOURNAL_CHANGE_RULE_ENABLED,
         .source = ADMIN,
         .rule = "slow",
         .reason = "127.0.0.1:5003",
         .rules = 1},
        {.kind = JOURNAL_KIND_STOP, .at_ms = 20000},
    };
    const char *text[] = {"report", f->journal};
    write_run(f->journal, JOURNAL_MODE_NEW, 42, T0_US / 1000, second + 1, 1, NULL);
    assert_int_equal(run(f, report_run, 2, text), 0);
    assert_contains(f->out, "\nRule changes\n  (none: the rules of the start held for the whole "
                            "run)\n");
    unlink(f->journal);
    write_run(f->journal, JOURNAL_MODE_NEW, 42, T0_US / 1000, first, 3, NULL);
    write_run(f->journal, JOURNAL_MODE_APPEND, 43, T0_US / 1000 + 10000, second, 2, NULL);
    assert_int_equal(run(f, report_run, 2, text), 0);
    assert_contains(f->out, "Rule changes (2; AT: since the start of its run");
    assert_contains(f->out, "      RUN AT  CHANGE");
    assert_contains(f->out, "   1 +1.000s  faults off      -      ");
    assert_contains(f->out, "   2 +0.500s  rule enabled    slow   ");
    write_file(f->effects, "");
    const char *vjson[] = {"verdict", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 5, vjson), 0);
    assert_contains(f->out, "\"faults_off_us\": 2000000, ");
}

static void test_report_errors(void **state)
{
    struct fixture *f = *state;
    const char *none[] = {"report"};
    assert_int_equal(run(f, report_run, 1, none), 2);
    assert_contains(f->err, "no journal given");
    const char *missing[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, missing), 2);
    assert_contains(f->err, "No such file or directory");
    /* several journals are read together: the first that cannot be read is the error */
    const char *extra[] = {"report", "a", "b"};
    assert_int_equal(run(f, report_run, 3, extra), 2);
    assert_contains(f->err, "twice report: a: No such file or directory\n");
    const char *unknown[] = {"report", "a", "--jsno"};
    assert_int_equal(run(f, report_run, 3, unknown), 2);
    assert_contains(f->err, "twice report: unknown argument '--jsno'\n");
    const char *dangling[] = {"report", "a", "--message"};
    assert_int_equal(run(f, report_run, 3, dangling), 2);
    assert_contains(f->err, "twice report: --message needs a value\n");

    /* Valid header, then an entry over the size limit: damage, named with its offset, and
     * what came before it reported. */
    write_journal(f->journal, NULL, 0);
    struct stat st;
    assert_int_equal(stat(f->journal, &st), 0);
    FILE *fp = fopen(f->journal, "ab");
    uint8_t prefix[JOURNAL_VARINT_MAX];
    size_t plen = journal_put_varint(prefix, JOURNAL_RECORD_MAX + 1);
    fwrite(prefix, 1, plen, fp);
    fclose(fp);
    assert_int_equal(run(f, report_run, 2, missing), 0);
    char want[160];
    snprintf(want, sizeof(want),
             "  at offset %lld: entry larger than the 1 MiB limit: %zu bytes skipped (records "
             "lost: not known), to the end of the file\n",
             (long long)st.st_size, plen);
    assert_contains(f->out, want);
}

/* Each journal command takes the journal as its first argument or by --journal (offline/cli.h):
 * every form prints the same; two different journals are an error, not the last one winning. */
static void test_journal_given_every_way(void **state)
{
    struct fixture *f = *state;
    const struct jrec recs[] = {
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "t"},
        {.kind = JOURNAL_KIND_DELIVER, .id = "a", .task = "t", .at_ms = 500},
    };
    write_journal(f->journal, recs, 2);
    write_file(f->effects, "a\na\n");
    char flag[160];
    snprintf(flag, sizeof(flag), "--journal=%s", f->journal);
    struct {
        command_fn fn;
        int argc, rc;
        const char *argv[6];
    } forms[] = {
        {verdict_run, 5, 1, {"verdict", f->journal, "--effects", f->effects, "--json"}},
        {verdict_run, 5, 1, {"verdict", "--effects", f->effects, "--json", f->journal}},
        {verdict_run,
         6,
         1,
         {"verdict", "--json", "--journal", f->journal, "--effects", f->effects}},
        {verdict_run, 5, 1, {"verdict", flag, "--effects", f->effects, "--json"}},
        {report_run, 3, 0, {"report", f->journal, "--json"}},
        {report_run, 3, 0, {"report", "--json", f->journal}},
        {report_run, 4, 0, {"report", "--journal", f->journal, "--json"}},
        {report_run, 3, 0, {"report", flag, "--json"}},
    };
    char *first[2] = {NULL, NULL}; /* verdict's output, report's */
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        assert_int_equal(run(f, forms[i].fn, forms[i].argc, forms[i].argv), forms[i].rc);
        assert_null(strstr(f->err, "usage:")); /* (a warning on the journal may come) */
        char **want = &first[forms[i].fn == report_run];
        if (*want == NULL)
            *want = strdup(f->out);
        else
            assert_string_equal(f->out, *want);
    }
    assert_contains(first[0], "\"verdict\": \"NOT IDEMPOTENT\"");
    assert_contains(first[1], "\"records\": 2");
    char *first_report = first[1];
    free(first[0]);

    /* the same file twice is one file, read once; two files are both read (a missing one is
     * the error) */
    const char *same[] = {"report", f->journal, "--journal", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 5, same), 0);
    assert_string_equal(f->out, first_report);
    const char *two[] = {"verdict", "other.pb", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 6, two), 2);
    assert_contains(f->err, "twice verdict: other.pb: No such file or directory");
    const char *dangling[] = {"report", "--journal"};
    assert_int_equal(run(f, report_run, 2, dangling), 2);
    assert_contains(f->err, "twice report: --journal needs a value\n");
    const char *empty[] = {"verdict", "--journal=", "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 4, empty), 2);
    assert_contains(f->err, "twice verdict: --journal needs a value\n");
    free(first_report);
}

static void test_report_empty_journal(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, NULL, 0);
    const char *argv[] = {"report", f->journal, "--message", "nope"};
    assert_int_equal(run(f, report_run, 4, argv), 1);
    assert_contains(f->out, "records   0\n");
    assert_contains(f->out, "(no record has this message id)");
    const char *whole[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, whole), 0);
    assert_contains(f->out, "(no faults injected)");
    const char *json[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, json), 0);
    assert_contains(f->out, "\"faults\": [],");
    assert_contains(f->out, "\"top\": []");
}

static void put_buf(void *ctx, const char *p, size_t n)
{
    char *out = ctx;
    size_t used = strlen(out);
    memcpy(out + used, p, n);
    out[used + n] = '\0';
}

/* The one JSON escaper (the commands' output and the admin API's replies): quotes, control
 * bytes and DEL escaped, valid UTF-8 kept, each byte of an invalid sequence as U+FFFD. */
static void test_json_quote(void **state)
{
    char out[256] = "";
    (void)state;
    json_quote("a\"b\\c\n\t\x01\x7f caf\xe9 t\xc3\xa9", put_buf, out);
    assert_string_equal(out, "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f caf\\ufffd t\xc3\xa9\"");
    out[0] = '\0';
    json_quote(NULL, put_buf, out);
    assert_string_equal(out, "\"\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_and_verdicts),
        cmocka_unit_test(test_app_retries_are_not_copies),
        cmocka_unit_test(test_failed_for_good),
        cmocka_unit_test(test_dropped_retry_is_no_attempt),
        cmocka_unit_test(test_withheld_twice_and_dropped_nack),
        cmocka_unit_test_setup_teardown(test_doubled_by_retries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_retries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandoned_while_running, setup, teardown),
        cmocka_unit_test(test_examples_are_five_smallest_sorted),
        cmocka_unit_test(test_withheld_deliveries_prove_nothing),
        cmocka_unit_test(test_unknown_task_and_unknown_effects),
        cmocka_unit_test(test_copy_windows),
        cmocka_unit_test(test_json_quote),
        cmocka_unit_test(test_many_messages),
        cmocka_unit_test_setup_teardown(test_verdict_window_hint_fits_the_listener, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_verdict_command_human, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_command_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_idempotent_and_untested_exit_zero, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_verdict_doubled_without_redelivery_is_flagged, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_verdict_usage_and_io_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_json_escaping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_prints_the_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_truncated_journal_warns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_human, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_expiry_is_no_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal_of_several_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rule_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rule_changes_over_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal_given_every_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_empty_journal, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
