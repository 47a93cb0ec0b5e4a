/*
 * test_overlap.c - the verdict's evidence, on journals made by hand: how each copy stood to
 * the deliveries before it (overlapping one still unsettled, after them, or unknown), which
 * redeliveries are set aside because no worker was seen to finish the delivery before them,
 * work that stopped (outstanding messages, STALLED), what --require makes of a row, and the
 * effects list checked against the journal, with the exit codes a CI job reads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/verdict.h"
#include "proxy/core/journal.h"
#include "rules/rule.h"
#include "tests/lib/cmd_testkit.h"

#define T0_US 1764406800000000ull
#define MS(x) (T0_US + (uint64_t)(x)*1000u)

#define DELIVER TWICE__JOURNAL__RECORD__KIND__DELIVER
#define ACK TWICE__JOURNAL__RECORD__KIND__ACK
#define NACK TWICE__JOURNAL__RECORD__KIND__NACK
#define PUBLISH TWICE__JOURNAL__RECORD__KIND__PUBLISH
#define CLOSE TWICE__JOURNAL__RECORD__KIND__CLOSE
#define RUNNING TWICE__JOURNAL__RECORD__KIND__RUNNING
#define FAULT TWICE__JOURNAL__RECORD__KIND__FAULT

/* A verdict whose header names the listeners "rabbit" (amqp), "redis" (resp, celery),
 * "kiq" (resp, sidekiq), "other" (amqp), "bull" (resp, bullmq) and "lists" (resp, list). */
static struct verdict *new_verdict(void)
{
    struct verdict *v = verdict_new();
    assert_non_null(v);
    Twice__Journal__Listener ls[6];
    Twice__Journal__Listener *lp[6];
    const char *names[6][3] = {{"rabbit", "amqp", ""},     {"redis", "resp", "celery"},
                               {"kiq", "resp", "sidekiq"}, {"other", "amqp", ""},
                               {"bull", "resp", "bullmq"}, {"lists", "resp", "list"}};
    for (size_t i = 0; i < 6; i++) {
        twice__journal__listener__init(&ls[i]);
        ls[i].name = (char *)names[i][0];
        ls[i].protocol = (char *)names[i][1];
        ls[i].profile = (char *)names[i][2];
        lp[i] = &ls[i];
    }
    Twice__Journal__Header h = TWICE__JOURNAL__HEADER__INIT;
    h.n_listeners = 6;
    h.listeners = lp;
    assert_int_equal(verdict_add_header(v, &h), 0);
    return v;
}

/* The tables below give a record's leading fields in order and name the rare ones: the
 * fields left out are 0, which is what they mean here. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* One record: kind, message, task, listener, session, delivery tag, time. */
struct rec {
    Twice__Journal__Record__Kind kind;
    const char *id, *task, *listener;
    uint64_t session, tag, at_us;
    bool retry, refused, kept_back, auto_ack;
    uint64_t started_us;
    const char *run;
    uint32_t action, event;
};

static void feed(struct verdict *v, const struct rec *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Twice__Journal__Record x = TWICE__JOURNAL__RECORD__INIT;
        x.kind = r[i].kind;
        x.message_id = (char *)(r[i].id != NULL ? r[i].id : "");
        x.task = (char *)(r[i].task != NULL ? r[i].task : "");
        x.listener = (char *)(r[i].listener != NULL ? r[i].listener : "");
        x.session = r[i].session;
        x.delivery_tag = r[i].tag;
        x.time_unix_us = r[i].at_us;
        x.retry = r[i].retry;
        x.refused = r[i].refused;
        x.kept_back = r[i].kept_back;
        x.auto_ack = r[i].auto_ack;
        x.started_unix_us = r[i].started_us;
        x.run = (char *)(r[i].run != NULL ? r[i].run : "");
        x.action = r[i].action;
        x.event = r[i].event;
        assert_int_equal(verdict_add_record(v, &x), 0);
    }
}

/* The replayed deliveries of id; the caller frees. */
static struct verdict_delivery *deliveries(struct verdict *v, const char *id, size_t *n)
{
    struct verdict_delivery *d = NULL;
    assert_int_equal(verdict_message_deliveries(v, id, &d, n), 1);
    return d;
}

/* A copy through another connection while the first delivery is unsettled overlaps it, for
 * as long as the first stayed out; the same on one connection is unknown (the copy may have
 * waited behind the first in that worker), and so is one that came after the first's
 * connection closed; a copy after the first was acked is after it. */
static void test_overlap_by_connection(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        /* a: two workers */
        {DELIVER, "a", "pay", "rabbit", 1, 5, MS(0)},
        {DELIVER, "a", "pay", "rabbit", 2, 7, MS(10)},
        {ACK, "a", "pay", "rabbit", 1, 5, MS(2500)},
        {ACK, "a", "pay", "rabbit", 2, 7, MS(2600)},
        /* b: the copy on the first's own channel */
        {DELIVER, "b", "pay", "rabbit", 1, 8, MS(0)},
        {DELIVER, "b", "pay", "rabbit", 1, 9, MS(10)},
        {ACK, "b", "pay", "rabbit", 1, 8, MS(2500)},
        {ACK, "b", "pay", "rabbit", 1, 9, MS(5000)},
        /* d: the first's connection closed before the copy came (its ack went over another,
         * as kombu's do): its worker may have got the copy, reconnected */
        {DELIVER, "d", "pay", "rabbit", 3, 1, MS(0)},
        {CLOSE, NULL, NULL, "rabbit", 3, 0, MS(5)},
        {DELIVER, "d", "pay", "rabbit", 4, 1, MS(10)},
        {ACK, "d", "pay", "rabbit", 5, 0, MS(2500)},
        {ACK, "d", "pay", "rabbit", 4, 1, MS(2600)},
        /* c: a lost ack's copy, after */
        {DELIVER, "c", "pay", "rabbit", 1, 10, MS(0)},
        {ACK, "c", "pay", "rabbit", 1, 10, MS(2500)},
        {DELIVER, "c", "pay", "rabbit", 2, 11, MS(5000)},
        {ACK, "c", "pay", "rabbit", 2, 11, MS(7500)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "pay");
    assert_int_equal(t->copies, 4);
    assert_int_equal(t->overlapping, 1);
    assert_int_equal(t->overlap_unknown, 2);
    assert_int_equal(t->sequential, 1);
    assert_int_equal(t->overlap_max_us, 2490000);
    assert_int_equal(t->overlap_examples.n, 1);
    assert_string_equal(t->overlap_examples.ids[0], "a");
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(t->missing, VERDICT_MISSING_WINDOW); /* every copy within a minute */
    assert_string_equal(t->listener, "rabbit");
    assert_string_equal(t->protocol, "amqp");
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "a", &n);
    assert_int_equal(n, 2);
    assert_true(d[0].settled && d[0].reached && d[0].overlap == VERDICT_COPY_NONE);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].copy_delay_us, 10000);
    assert_int_equal(d[1].settled_us, MS(2600));
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* Prefetch buffers: a copy delivered to a worker still busy with an earlier delivery may wait
 * behind it, and a first delivery queued behind another on its own connection may not have
 * started yet; either way the two runs need not overlap: unknown, not an overlap.  Once the
 * earlier work of both connections was settled, they did. */
static void test_buffered_is_no_overlap(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        /* worker 2 is busy with x when a's copy comes to it */
        {DELIVER, "x", "other", "rabbit", 2, 1, MS(0)},
        {DELIVER, "a", "pay", "rabbit", 1, 1, MS(10)},
        {DELIVER, "a", "pay", "rabbit", 2, 2, MS(20)},
        {ACK, "x", "other", "rabbit", 2, 1, MS(3000)},
        {ACK, "a", "pay", "rabbit", 1, 1, MS(2500)},
        {ACK, "a", "pay", "rabbit", 2, 2, MS(5000)},
        /* b's first delivery waits in worker 3's buffer behind y when its copy runs on 4 */
        {DELIVER, "y", "other", "rabbit", 3, 1, MS(0)},
        {DELIVER, "b", "pay", "rabbit", 3, 2, MS(10)},
        {DELIVER, "b", "pay", "rabbit", 4, 1, MS(20)},
        {ACK, "b", "pay", "rabbit", 4, 1, MS(1000)},
        {ACK, "y", "other", "rabbit", 3, 1, MS(3000)},
        {ACK, "b", "pay", "rabbit", 3, 2, MS(6000)},
        /* c: worker 5 had finished z before c came, worker 6 is idle: both ran at once */
        {DELIVER, "z", "other", "rabbit", 5, 1, MS(0)},
        {ACK, "z", "other", "rabbit", 5, 1, MS(5)},
        {DELIVER, "c", "pay", "rabbit", 5, 2, MS(10)},
        {DELIVER, "c", "pay", "rabbit", 6, 1, MS(20)},
        {ACK, "c", "pay", "rabbit", 5, 2, MS(2500)},
        {ACK, "c", "pay", "rabbit", 6, 1, MS(2600)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    /* Acks over a pooled connection: x's first ack may be either delivery's, so worker 11 may
     * still have run x until its last ack, when y's copy came to it. */
    const struct rec pooled[] = {
        {DELIVER, "x2", "other", "redis", 11, 0, MS(0)},
        {DELIVER, "x2", "other", "redis", 12, 0, MS(100)},
        {ACK, "x2", "other", "redis", 19, 0, MS(1000)},
        {DELIVER, "y2", "pay", "redis", 13, 0, MS(2000)},
        {DELIVER, "y2", "pay", "redis", 11, 0, MS(3000)},
        {ACK, "y2", "pay", "redis", 19, 0, MS(5000)},
        {ACK, "x2", "other", "redis", 19, 0, MS(10000)},
        {ACK, "y2", "pay", "redis", 19, 0, MS(11000)},
    };
    feed(v, pooled, sizeof(pooled) / sizeof(pooled[0]));
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "y2", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_UNKNOWN);
    free(d);
    d = deliveries(v, "a", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_UNKNOWN);
    free(d);
    d = deliveries(v, "b", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_UNKNOWN);
    free(d);
    d = deliveries(v, "c", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].overlap_us, 2480000);
    free(d);
    verdict_free(v);
}

/* Settlements on other connections (kombu's acks go over a pooled connection, RQ's work horse
 * opens one per job): each settles the oldest unsettled delivery whose connection is still
 * open; copies through two listeners of one process are one message. */
static void test_overlap_across_listeners(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "m", "tasks.charge", "redis", 11, 0, MS(0)},
        {DELIVER, "m", "tasks.charge", "other", 12, 0, MS(100)},
        {ACK, "m", "tasks.charge", "redis", 13, 0, MS(3000)},
        {ACK, "m", "tasks.charge", "other", 14, 0, MS(3100)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "m", &n);
    assert_int_equal(n, 2);
    assert_int_equal(d[0].settled_us, MS(3000));
    assert_true(d[0].settled_guess); /* either ack could be the first delivery's */
    assert_int_equal(d[1].settled_us, MS(3100));
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].overlap_us, 2900000);
    free(d);
    /* A copy that ends within a millisecond of its delivery, its ack the first to come: that
     * ack may be the copy's own, so the copy did not surely come after the first run. */
    const struct rec quick[] = {
        {DELIVER, "q", "tasks.charge", "redis", 11, 0, MS(0)},
        {DELIVER, "q", "tasks.charge", "redis", 12, 0, MS(100)},
        {ACK, "q", "tasks.charge", "redis", 13, 0, MS(100) + 500},
        {ACK, "q", "tasks.charge", "redis", 14, 0, MS(3000)},
    };
    feed(v, quick, sizeof(quick) / sizeof(quick[0]));
    d = deliveries(v, "q", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_UNKNOWN);
    free(d);
    verdict_free(v);
}

/* A failure settles a delivery as an ack does: the copy that came before it overlapped; a
 * nack with requeue ends the delivery and asks for a new attempt (no copy, nothing set
 * aside). */
static void test_settled_by_nack_or_failure(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "f", "job", "rabbit", 1, 1, MS(0)},
        {DELIVER, "f", "job", "rabbit", 2, 1, MS(50)},
        {NACK, "f", "job", "rabbit", 1, 1, MS(2000)},
        {ACK, "f", "job", "rabbit", 2, 1, MS(2100)},
        {DELIVER, "r", "job", "rabbit", 1, 2, MS(0)},
        {NACK, "r", "job", "rabbit", 1, 2, MS(100), .retry = true},
        {DELIVER, "r", "job", "rabbit", 2, 2, MS(200)},
        {ACK, "r", "job", "rabbit", 2, 2, MS(300)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "job");
    assert_int_equal(t->copies, 1);
    assert_int_equal(t->overlapping, 1);
    assert_int_equal(t->retried, 1);
    assert_int_equal(t->set_aside, 0);
    assert_int_equal(t->failed, 0); /* f was acked after its failed delivery */
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "f", &n);
    assert_true(d[0].settled && d[0].nack);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    free(d);
    d = deliveries(v, "r", &n);
    assert_int_equal(d[1].attempt, 2);
    assert_int_equal(d[1].overlap, VERDICT_COPY_NONE);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A copy delivered in the same millisecond as the earlier delivery's settlement came after it
 * (that worker had done its work and was sending its ack); 1.1 ms before it, it overlapped. */
static void test_same_millisecond_is_after(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "s", "job", "rabbit", 1, 1, MS(0)},
        {DELIVER, "s", "job", "rabbit", 2, 1, MS(1000) - 400},
        {ACK, "s", "job", "rabbit", 1, 1, MS(1000)},
        {ACK, "s", "job", "rabbit", 2, 1, MS(1500)},
        {DELIVER, "o", "job", "rabbit", 3, 2, MS(0)},
        {DELIVER, "o", "job", "rabbit", 4, 2, MS(1000) - 1100},
        {ACK, "o", "job", "rabbit", 3, 2, MS(1000)},
        {ACK, "o", "job", "rabbit", 4, 2, MS(1500)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "s", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_AFTER);
    free(d);
    d = deliveries(v, "o", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].overlap_us, 1100);
    free(d);
    verdict_free(v);
}

/* Issue: a worker's connection cut while it held prefetched messages it had not started; the
 * broker requeued them and they ran once.  Their redeliveries are set aside, not copies: the
 * row is UNTESTED, not IDEMPOTENT.  A message whose effect really doubled stays NOT
 * IDEMPOTENT.  On a listener that never settles (Sidekiq), a delivery is taken as run. */
static void test_cut_before_settling_is_set_aside(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "p1", "send", "rabbit", 3, 51, MS(0)},
        {DELIVER, "p2", "send", "rabbit", 3, 52, MS(1)},
        {CLOSE, NULL, NULL, "rabbit", 3, 0, MS(10)},
        {DELIVER, "p1", "send", "rabbit", 4, 1, MS(26)},
        {DELIVER, "p2", "send", "rabbit", 4, 2, MS(27)},
        {ACK, "p1", "send", "rabbit", 4, 1, MS(900)},
        {ACK, "p2", "send", "rabbit", 4, 2, MS(1800)},
        /* a worker still running when its connection dropped: it sent its effect, the copy
         * did too */
        {DELIVER, "d1", "charge", "rabbit", 5, 1, MS(0)},
        {CLOSE, NULL, NULL, "rabbit", 5, 0, MS(10)},
        {DELIVER, "d1", "charge", "rabbit", 6, 1, MS(30)},
        {ACK, "d1", "charge", "rabbit", 6, 1, MS(900)},
        /* Sidekiq: nothing is ever settled; a copy is a copy */
        {DELIVER, "j1", "Mail", "kiq", 7, 0, MS(0)},
        {DELIVER, "j1", "Mail", "kiq", 8, 0, MS(5)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    assert_int_equal(verdict_add_effect(v, "p1"), 0);
    assert_int_equal(verdict_add_effect(v, "p2"), 0);
    assert_int_equal(verdict_add_effect(v, "d1"), 0);
    assert_int_equal(verdict_add_effect(v, "d1"), 0);
    assert_int_equal(verdict_add_effect(v, "j1"), 0);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "send");
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    assert_int_equal(t->copies, 0);
    assert_int_equal(t->delivered_more_than_once, 0);
    assert_int_equal(t->set_aside, 2);
    assert_int_equal(t->set_aside_messages, 2);
    t = row(&res, "charge");
    assert_int_equal(t->verdict, VERDICT_NOT_IDEMPOTENT);
    assert_int_equal(t->set_aside, 1);
    assert_int_equal(t->doubled_single_delivery, 0); /* delivered twice: no effects warning */
    assert_int_equal(t->doubled_by_retries, 0);
    t = row(&res, "Mail");
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(t->overlap_unknown, 1); /* never settled on the wire */
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "p1", &n);
    assert_int_equal(d[0].closed_us, MS(10));
    assert_false(d[0].reached);
    assert_true(d[1].set_aside && d[1].reached);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* The same reasoning on the Redis frameworks: a BullMQ job whose worker died right after taking
 * it (its lock lapsed, the stalled checker handed it out again, redelivered), and a list job a
 * worker moved to its processing list and never finished before its connection went (the app's
 * recovery pushed it back): neither first delivery was seen finished, so their redeliveries are
 * set aside.  A list app without acks (no processing list) settles nothing: a copy counts. */
static void test_set_aside_on_redis_frameworks(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "41", "send", "bull", 1, 0, MS(0)},
        {CLOSE, NULL, NULL, "bull", 1, 0, MS(50)},
        {DELIVER, "41", "send", "bull", 2, 0, MS(3000)},
        {ACK, "41", "send", "bull", 2, 0, MS(3100)},
        {DELIVER, "u1", "App\\Jobs\\Mail", "lists", 3, 0, MS(0)},
        {CLOSE, NULL, NULL, "lists", 3, 0, MS(20)},
        {DELIVER, "u1", "App\\Jobs\\Mail", "lists", 4, 0, MS(900)},
        {ACK, "u1", "App\\Jobs\\Mail", "lists", 4, 0, MS(950)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    assert_int_equal(verdict_add_effect(v, "41"), 0);
    assert_int_equal(verdict_add_effect(v, "u1"), 0);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "send");
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    assert_int_equal(t->set_aside, 1);
    assert_string_equal(t->protocol, "resp");
    assert_string_equal(t->profile, "bullmq");
    t = row(&res, "App\\Jobs\\Mail");
    assert_int_equal(t->verdict, VERDICT_UNTESTED); /* its listener settles: it acked */
    assert_int_equal(t->set_aside, 1);
    verdict_result_free(&res);
    verdict_free(v);
    /* On a list listener that never settles (BRPOP alone), the redelivery is a copy. */
    v = new_verdict();
    const struct rec plain[] = {
        {DELIVER, "u2", "App\\Jobs\\Mail", "lists", 3, 0, MS(0)},
        {DELIVER, "u2", "App\\Jobs\\Mail", "lists", 4, 0, MS(900)},
    };
    feed(v, plain, sizeof(plain) / sizeof(plain[0]));
    assert_int_equal(verdict_add_effect(v, "u2"), 0);
    assert_int_equal(verdict_compute(v, &res), 0);
    t = row(&res, "App\\Jobs\\Mail");
    assert_int_equal(t->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(t->copies, 1);
    assert_int_equal(t->overlap_unknown, 1);
    verdict_result_free(&res);
    verdict_free(v);
}

/* BullMQ refused the first worker's completion (the lock another worker took): the record
 * ends that delivery all the same, and changes nothing else (no failure undone, no abandon);
 * nor does a failure a rule kept from Redis. */
static void test_refused_settlement_ends_the_delivery(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "7", "charge", "redis", 1, 0, MS(0)},
        {DELIVER, "7", "charge", "redis", 2, 0, MS(20)},
        {ACK, "7", "charge", "redis", 1, 0, MS(2500), .refused = true},
        {ACK, "7", "charge", "redis", 2, 0, MS(2600)},
        {DELIVER, "8", "charge", "redis", 1, 0, MS(0)},
        {NACK, "8", "charge", "redis", 3, 0, MS(100)},
        {ACK, "8", "charge", "redis", 1, 0, MS(200), .refused = true},
        /* 9: completed by its copy; the first run's failure, which a rule kept from Redis,
         * changes nothing (BullMQ never failed it) */
        {DELIVER, "9", "charge", "redis", 1, 0, MS(0)},
        {DELIVER, "9", "charge", "redis", 2, 0, MS(1)},
        {ACK, "9", "charge", "redis", 1, 0, MS(2), .refused = true},
        {ACK, "9", "charge", "redis", 2, 0, MS(3)},
        {NACK, "9", "charge", "redis", 1, 0, MS(4), .kept_back = true},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "charge");
    assert_int_equal(t->overlapping, 1);
    assert_int_equal(t->failed, 1);
    assert_int_equal(t->abandoned, 0);
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "7", &n);
    assert_true(d[0].settled && d[0].refused);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].overlap_us, 2480000);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A settlement a rule kept from the broker (an AMQP reject swallowed, journaled kept_back)
 * ends the worker's delivery but leaves the message as it was: not failed, not abandoned when
 * its redelivery is acked; that redelivery came after the first was done. */
static void test_kept_back_settlement_is_the_workers_end(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "m", "mail", "rabbit", 1, 1, MS(0)},
        {NACK, "m", "mail", "rabbit", 1, 1, MS(400), .kept_back = true},
        {CLOSE, NULL, NULL, "rabbit", 1, 0, MS(500)},
        {DELIVER, "m", "mail", "rabbit", 2, 1, MS(600)},
        {ACK, "m", "mail", "rabbit", 2, 1, MS(900)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "mail");
    assert_int_equal(t->failed, 0);
    assert_int_equal(t->abandoned, 0);
    assert_int_equal(t->copies, 1);
    assert_int_equal(t->sequential, 1);
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "m", &n);
    assert_int_equal(n, 2);
    assert_true(d[0].settled && d[0].nack);
    assert_int_equal(d[1].overlap, VERDICT_COPY_AFTER);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A delivery to a no-ack consumer is never settled on the wire: it reached its handler and
 * is not outstanding work, so the task is not STALLED. */
static void test_auto_ack_is_reached_not_outstanding(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {PUBLISH, "n", "notify", "rabbit", 1, 0, MS(0)},
        {DELIVER, "n", "notify", "rabbit", 2, 1, MS(10), .auto_ack = true},
        {PUBLISH, "k", "notify", "rabbit", 1, 0, MS(20)},
        {DELIVER, "k", "notify", "rabbit", 3, 1, MS(30)},
        {CLOSE, NULL, NULL, "rabbit", 3, 0, MS(60000)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "notify");
    assert_int_equal(t->unfinished, 1); /* k, taken with an ack it never sent */
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "n", &n);
    assert_true(d[0].auto_ack && d[0].reached && !d[0].settled);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* Sidekiq settles nothing; its heartbeat lists each job in progress (RUNNING reports).  Two
 * runs seen at once prove the overlap, and so does a run that had started before the copy came
 * seen running after it; runs that never were both running prove nothing, nor does one run
 * that may be the copy's own. */
static void test_running_reports_prove_overlap(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "j1", "Charge", "kiq", 1, 0, MS(0)},
        {DELIVER, "j1", "Charge", "kiq", 1, 0, MS(5)},
        {RUNNING, "j1", "Charge", "kiq", 2, 0, MS(3000), .started_us = MS(1000),
         .run = "host:1 tid-a"},
        {RUNNING, "j1", "Charge", "kiq", 2, 0, MS(3000), .started_us = MS(1000),
         .run = "host:1 tid-b"},
        /* j2: the copy started after the first's last report */
        {DELIVER, "j2", "Charge", "kiq", 1, 0, MS(0)},
        {RUNNING, "j2", "Charge", "kiq", 2, 0, MS(1000), .started_us = MS(1000),
         .run = "host:1 tid-a"},
        {DELIVER, "j2", "Charge", "kiq", 1, 0, MS(4000)},
        {RUNNING, "j2", "Charge", "kiq", 2, 0, MS(6000), .started_us = MS(5000),
         .run = "host:1 tid-a"},
        /* j3: a run that started more than a second before the copy came (the worker's clock
         * against twice's) is seen running after it */
        {DELIVER, "j3", "Charge", "kiq", 1, 0, MS(0)},
        {DELIVER, "j3", "Charge", "kiq", 1, 0, MS(2000)},
        {RUNNING, "j3", "Charge", "kiq", 2, 0, MS(5000), .started_us = MS(900),
         .run = "host:1 tid-a"},
        /* j5: a run started 0.9 s before the copy came, by its worker's clock: it may be the
         * copy's own, a clock a little behind */
        {DELIVER, "j5", "Charge", "kiq", 1, 0, MS(0)},
        {DELIVER, "j5", "Charge", "kiq", 1, 0, MS(2000)},
        {RUNNING, "j5", "Charge", "kiq", 3, 0, MS(5000), .started_us = MS(1100),
         .run = "host:2 tid-c"},
        /* j4: one run seen, started in the copy's second: it may be the copy's own */
        {DELIVER, "j4", "Charge", "kiq", 1, 0, MS(0)},
        {DELIVER, "j4", "Charge", "kiq", 1, 0, MS(5)},
        {RUNNING, "j4", "Charge", "kiq", 2, 0, MS(3000), .started_us = MS(1000),
         .run = "host:1 tid-a"},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "Charge");
    assert_int_equal(t->copies, 5);
    assert_int_equal(t->overlapping, 2);
    assert_int_equal(t->overlap_unknown, 3);
    assert_int_equal(t->overlap_examples.n, 2);
    assert_string_equal(t->overlap_examples.ids[0], "j1");
    assert_string_equal(t->overlap_examples.ids[1], "j3");
    size_t n = 0;
    struct verdict_delivery *d = deliveries(v, "j3", &n);
    assert_int_equal(d[1].overlap, VERDICT_COPY_OVERLAP);
    assert_int_equal(d[1].overlap_us, 3000000);
    free(d);
    verdict_result_free(&res);
    verdict_free(v);
}

/* Work that stopped: a message published and never delivered, one delivered and never
 * settled, one requeued and never delivered again.  With nothing delivered or settled for the
 * last stall_after of the journal, the task is STALLED; a task that kept moving is not, and a
 * message a rule dropped is lost by the fault, not outstanding. */
static void test_work_that_stopped(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {PUBLISH, "w1", "report", "rabbit", 1, 0, MS(0)},
        {PUBLISH, "w2", "report", "rabbit", 1, 0, MS(0)},
        {PUBLISH, "w3", "report", "rabbit", 1, 0, MS(0)},
        {DELIVER, "w2", "report", "rabbit", 2, 1, MS(100)},
        {DELIVER, "w3", "report", "rabbit", 2, 2, MS(200)},
        {NACK, "w3", "report", "rabbit", 2, 2, MS(300), .retry = true},
        /* mail kept moving until the end */
        {PUBLISH, "m1", "mail", "rabbit", 1, 0, MS(0)},
        {PUBLISH, "m2", "mail", "rabbit", 1, 0, MS(0)},
        {DELIVER, "m1", "mail", "rabbit", 3, 1, MS(40000)},
        {ACK, "m1", "mail", "rabbit", 3, 1, MS(40100)},
        {PUBLISH, "x1", "mail", "rabbit", 1, 0, MS(40200)},
        {FAULT, "x1", "mail", "rabbit", 1, 0, MS(40200), .action = RULE_ACT_DROP,
         .event = RULE_EV_PUBLISH},
        {CLOSE, NULL, NULL, "rabbit", 9, 0, MS(45000)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "report");
    assert_int_equal(t->never_delivered, 1);
    assert_int_equal(t->unfinished, 2);
    assert_true(t->stalled);
    assert_int_equal(t->last_progress_us, MS(300));
    assert_int_equal(t->outstanding_examples.n, 3);
    t = row(&res, "mail");
    assert_int_equal(t->never_delivered, 1); /* m2, not x1 */
    assert_false(t->stalled);
    assert_true(res.any_stalled);
    assert_int_equal(res.end_us, MS(45000));
    verdict_result_free(&res);
    /* A longer --stall-after: nothing stalled */
    struct verdict_options opt = {.stall_after_us = 60ull * 1000 * 1000};
    assert_int_equal(verdict_compute_with(v, &opt, &res), 0);
    assert_false(res.any_stalled);
    verdict_result_free(&res);
    verdict_free(v);
}

/* A poison message its consumer requeues 70,000 times: every delivery a new attempt the app
 * asked for, none a copy (no counter of attempts runs out), and replayed in linear time. */
static void test_many_attempts_are_no_copies(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    for (uint64_t i = 0; i < 70000; i++) {
        const struct rec pair[] = {
            {DELIVER, "poison", "job", "rabbit", 1, i + 1, MS(i)},
            {NACK, "poison", "job", "rabbit", 1, i + 1, MS(i) + 500, .retry = true},
        };
        feed(v, pair, 2);
    }
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    const struct verdict_task *t = row(&res, "job");
    assert_int_equal(t->copies, 0);
    assert_int_equal(t->set_aside, 0);
    assert_int_equal(t->verdict, VERDICT_UNTESTED);
    assert_int_equal(t->max_retries, 69999);
    verdict_result_free(&res);
    verdict_free(v);
}

/* --require: a row short of the evidence asked for is UNTESTED; NOT IDEMPOTENT stays. */
static void test_require_makes_short_rows_untested(void **state)
{
    (void)state;
    struct verdict *v = new_verdict();
    const struct rec recs[] = {
        {DELIVER, "a", "seq", "rabbit", 1, 1, MS(0)},
        {ACK, "a", "seq", "rabbit", 1, 1, MS(100)},
        {DELIVER, "a", "seq", "rabbit", 2, 1, MS(90000)},
        {ACK, "a", "seq", "rabbit", 2, 1, MS(90100)},
        {DELIVER, "b", "par", "rabbit", 3, 2, MS(0)},
        {DELIVER, "b", "par", "rabbit", 4, 2, MS(10)},
        {ACK, "b", "par", "rabbit", 3, 2, MS(1000)},
        {ACK, "b", "par", "rabbit", 4, 2, MS(1100)},
        {DELIVER, "c", "bad", "rabbit", 5, 3, MS(0)},
        {ACK, "c", "bad", "rabbit", 5, 3, MS(100)},
        {DELIVER, "c", "bad", "rabbit", 6, 3, MS(200)},
        {ACK, "c", "bad", "rabbit", 6, 3, MS(300)},
    };
    feed(v, recs, sizeof(recs) / sizeof(recs[0]));
    for (const char *id = "abc"; *id != '\0'; id++) {
        char s[2] = {*id, '\0'};
        assert_int_equal(verdict_add_effect(v, s), 0);
    }
    assert_int_equal(verdict_add_effect(v, "c"), 0);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    assert_int_equal(row(&res, "seq")->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(row(&res, "seq")->missing, VERDICT_MISSING_OVERLAP);
    assert_int_equal(row(&res, "par")->missing, VERDICT_MISSING_WINDOW);
    assert_false(res.any_required_short);
    verdict_result_free(&res);

    struct verdict_options opt = {.require = {.overlaps = 1}};
    assert_int_equal(verdict_compute_with(v, &opt, &res), 0);
    assert_int_equal(row(&res, "seq")->verdict, VERDICT_UNTESTED);
    assert_true(row(&res, "seq")->required_short);
    assert_int_equal(row(&res, "par")->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(row(&res, "bad")->verdict, VERDICT_NOT_IDEMPOTENT);
    assert_true(res.any_required_short);
    verdict_result_free(&res);

    opt = (struct verdict_options){.require = {.window_us = 60ull * 1000 * 1000}};
    assert_int_equal(verdict_compute_with(v, &opt, &res), 0);
    assert_int_equal(row(&res, "seq")->verdict, VERDICT_IDEMPOTENT);
    assert_int_equal(row(&res, "par")->verdict, VERDICT_UNTESTED);
    verdict_result_free(&res);

    opt = (struct verdict_options){.require = {.copies = 2}};
    assert_int_equal(verdict_compute_with(v, &opt, &res), 0);
    assert_int_equal(row(&res, "seq")->verdict, VERDICT_UNTESTED);
    verdict_result_free(&res);
    verdict_free(v);
}

/* ---- the command: effects checked, exit codes ---------------------------------------- */

/* A journal with a header naming "jobs" (resp, bullmq), and records. */
static void write_journal(const char *path, const struct rec *recs, size_t n)
{
    static const char *const names[] = {"jobs"}, *const protos[] = {"resp"},
                             *const profiles[] = {"bullmq"};
    struct journal_header_info h = {.seed = 7,
                                    .config_path = "t.twice",
                                    .start_unix_ms = T0_US / 1000,
                                    .listener_names = names,
                                    .listener_protocols = protos,
                                    .listener_profiles = profiles,
                                    .n_listeners = 1};
    char err[256];
    struct journal *j = journal_open(path, &h, err, sizeof(err));
    assert_non_null(j);
    for (size_t i = 0; i < n; i++) {
        struct journal_record r = {
            .kind = (enum journal_kind)recs[i].kind,
            .time_unix_us = recs[i].at_us,
            .session = recs[i].session,
            .listener = "jobs",
            .message_id = recs[i].id,
            .task = recs[i].task,
            .delivery_tag = recs[i].tag,
            .retry = recs[i].retry,
            .refused = recs[i].refused,
        };
        journal_record(j, &r);
    }
    journal_close(j);
}

/* `twice verdict ARGV`, its output captured. */
static int run_verdict(struct fixture *f, int argc, const char **argv)
{
    return run(f, verdict_run, argc, argv);
}

/* BullMQ jobs 1..3 of check_then_act, each copied after its first was settled (the stalled
 * checker's copies of lost completions). */
static const struct rec sequential_journal[] = {
    {PUBLISH, "1", "check_then_act", NULL, 1, 0, MS(0)},
    {PUBLISH, "2", "check_then_act", NULL, 1, 0, MS(0)},
    {DELIVER, "1", "check_then_act", NULL, 2, 0, MS(10)},
    {DELIVER, "2", "check_then_act", NULL, 3, 0, MS(10)},
    {ACK, "1", "check_then_act", NULL, 2, 0, MS(2510)},
    {ACK, "2", "check_then_act", NULL, 3, 0, MS(2510)},
    {DELIVER, "1", "check_then_act", NULL, 3, 0, MS(5010)},
    {DELIVER, "2", "check_then_act", NULL, 2, 0, MS(5100)},
    {ACK, "1", "check_then_act", NULL, 3, 0, MS(7510)},
    {ACK, "2", "check_then_act", NULL, 2, 0, MS(7600)},
};
#define N_SEQ (sizeof(sequential_journal) / sizeof(sequential_journal[0]))

/* Sequential copies only: not plain IDEMPOTENT; the missing evidence is named with the rule
 * that brings it on this listener's profile; --require overlap makes it UNTESTED, exit 4. */
static void test_command_names_missing_overlap(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, sequential_journal, N_SEQ);
    write_file(f->effects, "1\n2\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run_verdict(f, 5, argv), 0);
    assert_contains(f->out,
                    "       0/2  5.0s-5.1s      IDEMPOTENT*     missing: overlap, window\n");
    assert_contains(f->out, "check_then_act: IDEMPOTENT for copies 5.0s-5.1s after the first "
                            "delivery (median 5.0s, 2 copies)\n  no copy ran while an earlier "
                            "one was running: check-then-act races untested (2 copies came after "
                            "the earlier delivery was settled); to test them on listener 'jobs' "
                            "(resp, bullmq): `when deliver task=check_then_act` + `do duplicate` "
                            "(the job is handed to another worker at once)\n");
    assert_contains(f->out, "`when lease task=check_then_act` + `do drop`");
    const char *req[] = {"verdict",  "--journal", f->journal, "--effects",
                         f->effects, "--require", "overlap"};
    assert_int_equal(run_verdict(f, 7, req), VERDICT_EXIT_UNTESTED);
    assert_contains(f->out, "  UNTESTED\n");
    assert_contains(f->out, "  short of what --require asks: UNTESTED\n");
    const char *json[] = {"verdict",   "--journal", f->journal,
                          "--effects", f->effects,  "--require=overlap,window=5s",
                          "--json"};
    assert_int_equal(run_verdict(f, 7, json), VERDICT_EXIT_UNTESTED);
    assert_contains(f->out, "\"required_short\": true,\n");
    assert_contains(f->out, "\"verdict\": \"UNTESTED\", \"copies\": 2");
    assert_contains(f->out, "\"overlapping_copies\": 0, \"sequential_copies\": 2, "
                            "\"overlap_unknown_copies\": 0, \"overlap_ms\": null, "
                            "\"overlap_examples\": [], \"evidence_missing\": [\"overlap\"], "
                            "\"required_short\": true");
    const char *bad[] = {"verdict",  "--journal", f->journal, "--effects",
                         f->effects, "--require", "overlapp"};
    assert_int_equal(run_verdict(f, 7, bad), VERDICT_EXIT_ERROR);
    assert_contains(f->err, "--require 'overlapp': expected copies[=N], overlap[=N] or window=D");
    const char *badw[] = {"verdict",  "--journal", f->journal,   "--effects",
                          f->effects, "--require", "window=soon"};
    assert_int_equal(run_verdict(f, 7, badw), VERDICT_EXIT_ERROR);
}

/* An effects list that names nothing of the journal is an error, not a pass: empty, order
 * amounts instead of ids, a CSV export; mostly unknown lines too.  A few unknown lines are a
 * warning. */
static void test_command_checks_the_effects_list(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, sequential_journal, N_SEQ);
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    write_file(f->effects, "# exported from payments\n\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "error: the effects list is empty while the journal has 2 messages");
    write_file(f->effects, "1999.00\n25.50\n25.50\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "error: none of the 3 effect lines names a message of the journal");
    assert_null(strstr(f->out, "CSV"));
    write_file(f->effects, "1,1999.00\n2,25.50\n2,25.50\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "its lines hold commas or semicolons: a CSV export?");
    write_file(f->effects, "1\nx1\nx2\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "error: 2 of the 3 effect lines name messages the journal never saw");
    write_file(f->effects, "1\n2\nx1\n");
    assert_int_equal(run_verdict(f, 5, argv), 0);
    assert_contains(f->out, "warning: 1 message ids in the effects list (1 lines) never appear");
    const char *json[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    write_file(f->effects, "");
    assert_int_equal(run_verdict(f, 6, json), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "\"effects_check\": \"empty\",");
    assert_contains(f->err, "error: the effects list does not match the journal");
    /* the first that applies: a broken list before a double effect */
    write_file(f->effects, "1\n1\nx1\nx2\nx3\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_EFFECTS);
}

/* --require and --stall-after take what they document and nothing else: a bare item after
 * a count keeps the count; a duration is digits and a unit (not nan, hex or negative). */
static void test_command_option_parsing(void **state)
{
    struct fixture *f = *state;
    write_journal(f->journal, sequential_journal, N_SEQ);
    write_file(f->effects, "1\n2\n");
    const char *keep[] = {"verdict",  "--journal", f->journal,       "--effects",
                          f->effects, "--require", "copies=3,copies"};
    assert_int_equal(run_verdict(f, 7, keep), VERDICT_EXIT_UNTESTED);
    const char *enough[] = {"verdict",  "--journal", f->journal,          "--effects",
                            f->effects, "--require", "copies,window=4.5s"};
    assert_int_equal(run_verdict(f, 7, enough), 0);
    static const char *const bad_durations[] = {"nan",   "infs", "nans", "0x10s", "-1s",
                                                "1..5s", ".5s",  "5",    "5 s",   "1e3s"};
    for (size_t i = 0; i < sizeof(bad_durations) / sizeof(bad_durations[0]); i++) {
        const char *stall[] = {"verdict",  "--journal",     f->journal,      "--effects",
                               f->effects, "--stall-after", bad_durations[i]};
        if (run_verdict(f, 7, stall) != VERDICT_EXIT_ERROR)
            fail_msg("--stall-after %s was taken", bad_durations[i]);
    }
    const char *ms[] = {"verdict",  "--journal",     f->journal, "--effects",
                        f->effects, "--stall-after", "1.5ms"};
    assert_int_equal(run_verdict(f, 7, ms), 0);
}

/* Messages published and never delivered have no effects to list: an empty list is no error
 * then; the work that stopped is what the run says (STALLED). */
static void test_command_empty_effects_before_any_delivery(void **state)
{
    struct fixture *f = *state;
    const struct rec recs[] = {
        {PUBLISH, "1", "nightly", NULL, 1, 0, MS(0)},
        {PUBLISH, "2", "nightly", NULL, 1, 0, MS(10)},
        {CLOSE, NULL, NULL, NULL, 1, 0, MS(40000)},
    };
    write_journal(f->journal, recs, sizeof(recs) / sizeof(recs[0]));
    write_file(f->effects, "");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_STALLED);
    assert_null(strstr(f->out, "effects list is empty"));
    assert_contains(f->out, "2 published and never delivered");
}

/* A task whose consumers stopped with work outstanding: STALLED in the text and the JSON, and
 * exit 5; a double effect still exits 1 first. */
static void test_command_stalled(void **state)
{
    struct fixture *f = *state;
    const struct rec recs[] = {
        {PUBLISH, "1", "nightly", NULL, 1, 0, MS(0)},
        {PUBLISH, "2", "nightly", NULL, 1, 0, MS(0)},
        {DELIVER, "1", "nightly", NULL, 2, 0, MS(10)},
        {ACK, "1", "nightly", NULL, 2, 0, MS(500)},
        {DELIVER, "2", "nightly", NULL, 2, 0, MS(600)},
        {CLOSE, NULL, NULL, NULL, 2, 0, MS(40000)},
    };
    write_journal(f->journal, recs, sizeof(recs) / sizeof(recs[0]));
    write_file(f->effects, "1\n");
    const char *argv[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_STALLED);
    assert_contains(f->out, "warning: nightly: STALLED since 2025-11-29T09:00:00.600Z: nothing "
                            "delivered or settled in the last 39s of the journal (--stall-after "
                            "30s), 1 message outstanding: 0 published and never delivered, 1 "
                            "delivered and never settled");
    assert_contains(f->out, "UNTESTED        STALLED\n");
    assert_contains(f->out, "\nverdict: UNTESTED\nstalled: nightly\n");
    const char *longer[] = {"verdict",  "--journal",     f->journal, "--effects",
                            f->effects, "--stall-after", "1m"};
    assert_int_equal(run_verdict(f, 7, longer), 0);
    assert_contains(f->out, "note: nightly: at the end of the journal, 1 message outstanding");
    const char *json[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run_verdict(f, 6, json), VERDICT_EXIT_STALLED);
    assert_contains(f->out, "\"never_delivered\": 0, \"unfinished\": 1, \"outstanding_examples\": "
                            "[\"2\"], \"stalled\": true, \"last_progress_unix_us\": "
                            "1764406800600000");
    write_file(f->effects, "1\n1\n");
    assert_int_equal(run_verdict(f, 5, argv), VERDICT_EXIT_NOT_IDEMPOTENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_by_connection),
        cmocka_unit_test(test_overlap_across_listeners),
        cmocka_unit_test(test_buffered_is_no_overlap),
        cmocka_unit_test(test_settled_by_nack_or_failure),
        cmocka_unit_test(test_same_millisecond_is_after),
        cmocka_unit_test(test_cut_before_settling_is_set_aside),
        cmocka_unit_test(test_set_aside_on_redis_frameworks),
        cmocka_unit_test(test_refused_settlement_ends_the_delivery),
        cmocka_unit_test(test_kept_back_settlement_is_the_workers_end),
        cmocka_unit_test(test_auto_ack_is_reached_not_outstanding),
        cmocka_unit_test(test_running_reports_prove_overlap),
        cmocka_unit_test(test_work_that_stopped),
        cmocka_unit_test(test_many_attempts_are_no_copies),
        cmocka_unit_test(test_require_makes_short_rows_untested),
        cmocka_unit_test_setup_teardown(test_command_names_missing_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_checks_the_effects_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_stalled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_option_parsing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_empty_effects_before_any_delivery, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
