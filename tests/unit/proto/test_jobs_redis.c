/*
 * test_jobs_redis.c - the modules of Sidekiq, Celery, RQ, Streams and the list profile
 * (proto/jobs/) through a fake host (jobs_testkit.h): what they journal, and what they plan for
 * each fault, as the framework itself would produce it.
 *
 *   - The recorded sessions of each example app (tests/unit/data/frameworks/NAME/) replayed
 *     without a rule: every job the app enqueued (enqueued.txt) published and delivered once,
 *     with its task, and acked once where the framework acks; nothing planned but forwarding.
 *   - The same sessions with a fault on the first event it applies to: the plan (an ack kept
 *     back in its transaction, a copy pushed back, a reply rebuilt without an entry, a publish
 *     answered and never applied) and the records.
 *   - Commands the recordings do not have, made here: RQ's heartbeat (a lease renewal with its
 *     job hash's last_heartbeat), Sidekiq's heartbeat listing the jobs in progress.
 *   - Every faulted path again with an allocation failure at each of its allocations: no crash,
 *     nothing leaked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include <cmocka.h>

#include "tests/lib/jobs_testkit.h"

extern const struct resp_framework resp_framework_sidekiq, resp_framework_celery, resp_framework_rq,
    resp_framework_streams, resp_framework_list;

static void run_init(struct run *r, const struct resp_framework *fw)
{
    fake_host_init(&r->host);
    memset(&r->plans, 0, sizeof(r->plans));
    if (fw->open != NULL)
        r->host.h.state = fw->open();
}

static void run_free(struct run *r, const struct resp_framework *fw)
{
    if (fw->close != NULL && r->host.h.state != NULL)
        fw->close(r->host.h.state);
    fake_host_free(&r->host);
    kit_text_free(&r->plans);
}

/* ---- recorded sessions without a rule -------------------------------------------------------- */

/* How many times `want` stands in t. */
static int count_of(const struct kit_text *t, const char *want)
{
    int n = 0;
    for (const char *p = strstr(kit_str(t), want); p != NULL; p = strstr(p + 1, want))
        n++;
    return n;
}

/* A listener's source setting, as `message-id` or `task` parses it. */
static void one_source(struct msg_fields *fs, const char *text)
{
    char why[256];
    memset(fs, 0, sizeof(*fs));
    assert_int_equal(msg_field_parse(text, &fs->src[0], why, sizeof(why)), 0);
    fs->n = 1;
}

/* The list app's jobs are Laravel's: the uuid names the job, displayName its class. */
static struct msg_fields laravel_ids, laravel_tasks;

/* The sessions of app `name` through fw without a rule: each enqueued job published and
 * delivered once with its task (and queue), acked once when `acks`. */
static void golden(const struct resp_framework *fw, const char *name, const char *queue, bool acks)
{
    struct run r;
    run_init(&r, fw);
    r.host.wants_all = true;
    if (fw == &resp_framework_list) {
        r.host.h.ids = &laravel_ids;
        r.host.h.tasks = &laravel_tasks;
    }
    kit_replay_all(fw, name, &r.host, &r.plans);
    size_t n = 0;
    uint8_t *enq = kit_data(name, "enqueued.txt", &n);
    assert_non_null(enq);
    int jobs = 0;
    for (char *line = strtok((char *)enq, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char id[128], task[128], want[512];
        assert_int_equal(sscanf(line, "%127s %127s", id, task), 2);
        snprintf(want, sizeof(want), "PUBLISH %s task=%s queue=%s", id, task, queue);
        if (count_of(&r.host.said, want) != 1)
            fail_msg("%s: %s once, in\n%s", name, want, kit_str(&r.host.said));
        snprintf(want, sizeof(want), "DELIVER %s task=%s queue=%s", id, task, queue);
        if (count_of(&r.host.said, want) != 1)
            fail_msg("%s: %s once, in\n%s", name, want, kit_str(&r.host.said));
        snprintf(want, sizeof(want), "ACK %s task=%s queue=%s", id, task, queue);
        if (count_of(&r.host.said, want) != (acks ? 1 : 0))
            fail_msg("%s: %s %s, in\n%s", name, want, acks ? "once" : "never",
                     kit_str(&r.host.said));
        jobs++;
    }
    assert_int_equal(jobs, 4);
    kit_free(enq);
    kit_lacks(&r.host.said, "FAULT ");
    kit_lacks(&r.plans, "plan answer");
    kit_lacks(&r.plans, "plan rewrite");
    kit_lacks(&r.plans, "own ");
    kit_lacks(&r.plans, "replace=1");
    kit_lacks(&r.plans, "keep_back=1");
    run_free(&r, fw);
}

static void test_recorded_sessions_without_a_rule(void **state)
{
    (void)state;
    one_source(&laravel_ids, "body.json.uuid");
    one_source(&laravel_tasks, "body.json.displayName");
    golden(&resp_framework_sidekiq, "sidekiq", "default", false);
    golden(&resp_framework_celery, "celery_redis", "celery", true);
    golden(&resp_framework_rq, "rq", "default", true);
    golden(&resp_framework_streams, "streams", "twice:e2e:jobs", true);
    golden(&resp_framework_list, "lists", "queues:default", true);
}

/* ---- faults on the recorded sessions -------------------------------------------------------- */

/* The sessions of app `name` through fw with fault f on the first event of kind it applies to
 * (of job id, when not NULL). */
static void replay_with(struct run *r, const struct resp_framework *fw, const char *name,
                        enum job_ev kind, const char *id, struct job_fault f)
{
    run_init(r, fw);
    fake_fault(&r->host, kind, id, f);
    if (fw == &resp_framework_list) {
        r->host.h.ids = &laravel_ids;
        r->host.h.tasks = &laravel_tasks;
    }
    kit_replay_all(fw, name, &r->host, &r->plans);
}

/* Celery: an ack lost is kept back in kombu's transaction, its ZREM and its HDEL answered as
 * applied (the message stays in the unacked hash for kombu's restore); delayed, both go out D
 * later on twice's own connection. */
static void test_celery_ack_kept_back_in_its_transaction(void **state)
{
    (void)state;
    struct run r;
    replay_with(&r, &resp_framework_celery, "celery_redis", JOB_EV_ACK, NULL,
                fault(JOB_FAULT_REDELIVER, 0));
    kit_contains(&r.plans, "queued 0 keep_back=1 answer=:1| add=0 tag=0\n"
                           "queued 1 keep_back=1 answer=:1| add=0 tag=0\n");
    kit_contains(&r.host.said, "FAULT redeliver ack id=3ab25b35-f732-43be-8d7e-1251594bc6dc");
    run_free(&r, &resp_framework_celery);

    replay_with(&r, &resp_framework_celery, "celery_redis", JOB_EV_ACK, NULL,
                fault(JOB_FAULT_DELAY, 3000));
    kit_contains(&r.plans, "own ms=3000 n=2 *3|$4|ZREM|");
    kit_contains(&r.plans, "*3|$4|HDEL|");
    run_free(&r, &resp_framework_celery);
}

/* Celery: a delivery duplicated goes back where BRPOP took it (RPUSH), marked redelivered as
 * kombu's restore marks it; a publish duplicated is pushed again with a new delivery tag. */
static void test_celery_duplicates(void **state)
{
    (void)state;
    struct run r;
    replay_with(&r, &resp_framework_celery, "celery_redis", JOB_EV_DELIVER, NULL,
                fault(JOB_FAULT_DUPLICATE, 0));
    kit_contains(&r.plans, "own ms=0 n=1 *3|$5|RPUSH|$6|celery|");
    kit_contains(&r.plans, "\"redelivered\":true");
    run_free(&r, &resp_framework_celery);

    replay_with(&r, &resp_framework_celery, "celery_redis", JOB_EV_PUBLISH, NULL,
                fault(JOB_FAULT_DUPLICATE, 0));
    kit_contains(&r.plans, "plan forward bytes= hold=0 cut=- reply=0 own=1\nown ms=0 n=1 "
                           "*3|$5|LPUSH|$6|celery|");
    run_free(&r, &resp_framework_celery);
}

/* RQ: an ack lost is kept back in the worker's transaction and the job's id pushed back onto
 * its queue on twice's own connection as EXEC goes on (`after D`: D later). */
static void test_rq_ack_redelivered(void **state)
{
    (void)state;
    struct run r;
    replay_with(&r, &resp_framework_rq, "rq", JOB_EV_ACK, NULL, fault(JOB_FAULT_REDELIVER, 0));
    kit_contains(&r.plans, "keep_back=1 answer=:1|");
    kit_contains(&r.plans, "own ms=0 n=1 *3|$5|LPUSH|$16|rq:queue:default|$36|");
    run_free(&r, &resp_framework_rq);

    replay_with(&r, &resp_framework_rq, "rq", JOB_EV_ACK, NULL, fault(JOB_FAULT_REDELIVER, 9000));
    kit_contains(&r.plans, "own ms=9000 n=1 *3|$5|LPUSH|$16|rq:queue:default|");
    run_free(&r, &resp_framework_rq);
}

/* RQ's heartbeat (rq/worker.py, maintain_heartbeats): the renewal and its job hash's
 * last_heartbeat kept back together, both answered 0; later renewals of the job by the same
 * connection lost too, until it pops its next job; delayed, both applied later (the hash only
 * if it is still there). */
static uint8_t *heartbeat(struct resp_msg *m, size_t *len)
{
    static const char tx[] = "*1\r\n$5\r\nMULTI\r\n"
                             "*4\r\n$4\r\nHSET\r\n$9\r\nrq:job:j1\r\n$14\r\nlast_heartbeat\r\n"
                             "$19\r\n2026-12-07T07:00:00\r\n"
                             "*5\r\n$4\r\nZADD\r\n$14\r\nrq:wip:default\r\n$2\r\nXX\r\n"
                             "$10\r\n1800000000\r\n$2\r\nj1\r\n"
                             "*1\r\n$4\r\nEXEC\r\n";
    uint8_t *buf = __real_malloc(sizeof(tx));
    assert_non_null(buf);
    memcpy(buf, tx, sizeof(tx));
    *len = sizeof(tx) - 1;
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, buf, *len, m), 1);
    return buf;
}

static int plan_heartbeat(struct run *r, struct resp_tx_plan *p)
{
    struct resp_msg m;
    size_t len;
    uint8_t *buf = heartbeat(&m, &len);
    memset(p, 0, sizeof(*p));
    int rc = resp_framework_rq.transaction(&r->host.h, buf, len, m.len, RESP_MAX_BULK, p);
    kit_say_tx_plan(&r->plans, rc, p);
    __real_free(buf);
    return rc;
}

static void test_rq_heartbeat_lost_or_late(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, &resp_framework_rq);
    fake_fault(&r.host, JOB_EV_LEASE, "j1", fault(JOB_FAULT_DROP, 0));
    struct resp_tx_plan p;
    assert_int_equal(plan_heartbeat(&r, &p), 1);
    kit_contains(&r.plans, "queued 0 keep_back=1 answer=:0| add=0 tag=0\n"
                           "queued 1 keep_back=1 answer=:0| add=0 tag=0\n");
    resp_tx_plan_free(&resp_framework_rq, &p);
    assert_int_equal(r.host.decided[JOB_EV_LEASE], 1);
    /* the next renewal: lost already, counted */
    assert_int_equal(plan_heartbeat(&r, &p), 1);
    assert_true(p.cmds[1].keep_back);
    resp_tx_plan_free(&resp_framework_rq, &p);
    assert_int_equal(r.host.decided[JOB_EV_LEASE], 1);
    assert_int_equal(r.host.counted[JOB_EV_LEASE], 1);
    run_free(&r, &resp_framework_rq);

    run_init(&r, &resp_framework_rq);
    fake_fault(&r.host, JOB_EV_LEASE, "j1", fault(JOB_FAULT_DELAY, 70000));
    assert_int_equal(plan_heartbeat(&r, &p), 1);
    kit_contains(&r.plans, "own ms=70000 n=2 *6|$4|EVAL|");
    kit_contains(&r.plans, "*5|$4|ZADD|$14|rq:wip:default|$2|XX|");
    resp_tx_plan_free(&resp_framework_rq, &p);
    run_free(&r, &resp_framework_rq);
}

/* Streams: a delivery dropped is taken out of XREADGROUP's reply (it stays pending, unseen); a
 * duplicate's ack is swallowed when it comes; a publish dropped is answered with an id made as
 * Redis makes them. */
static void test_streams_faults(void **state)
{
    (void)state;
    struct run r;
    replay_with(&r, &resp_framework_streams, "streams", JOB_EV_DELIVER, "1796183659480-0",
                fault(JOB_FAULT_DROP, 0));
    kit_contains(&r.plans, "reply replace=1 bytes=*1|*2|$14|twice:e2e:jobs|*0| delay=0");
    run_free(&r, &resp_framework_streams);

    replay_with(&r, &resp_framework_streams, "streams", JOB_EV_DELIVER, "1796183659480-0",
                fault(JOB_FAULT_DUPLICATE, 0));
    kit_contains(&r.host.said, "ACK 1796183659480-0 task=charge queue=twice:e2e:jobs");
    kit_contains(&r.plans, "plan answer bytes=:1| hold=0 cut=- reply=0 own=0"); /* swallowed */
    run_free(&r, &resp_framework_streams);

    replay_with(&r, &resp_framework_streams, "streams", JOB_EV_PUBLISH, NULL,
                fault(JOB_FAULT_DROP, 0));
    kit_contains(&r.host.said, "FAULT drop publish id=1700000000000-1\n"
                               "PUBLISH 1700000000000-1 task=charge queue=twice:e2e:jobs");
    kit_contains(&r.plans, "plan answer bytes=$15|1700000000000-1|");
    run_free(&r, &resp_framework_streams);
}

/* The list profile: an ack dropped is answered :1 and never applied; redelivered, the LREM is
 * applied with the job pushed back onto its queue by one script on twice's own connection. */
static void test_list_ack_faults(void **state)
{
    (void)state;
    struct run r;
    replay_with(&r, &resp_framework_list, "lists", JOB_EV_ACK, NULL, fault(JOB_FAULT_DROP, 0));
    kit_contains(&r.plans, "plan answer bytes=:1| hold=0 cut=- reply=0 own=0");
    run_free(&r, &resp_framework_list);

    replay_with(&r, &resp_framework_list, "lists", JOB_EV_ACK, NULL,
                fault(JOB_FAULT_REDELIVER, 5000));
    kit_contains(&r.plans, "plan answer bytes=:1| hold=0 cut=- reply=0 own=1\nown ms=5000 n=1 "
                           "*8|$4|EVAL|");
    run_free(&r, &resp_framework_list);
}

/* Sidekiq's heartbeat lists the jobs its threads run: a RUNNING record each, with the run's
 * identity and when it started. */
static void test_sidekiq_heartbeat_is_journaled(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, &resp_framework_sidekiq);
    static const char work[] =
        "{\"queue\":\"default\",\"payload\":\"{\\\"class\\\":\\\"Charge\\\",\\\"jid\\\":\\\"j9\\\","
        "\\\"queue\\\":\\\"default\\\"}\",\"run_at\":1765090000}";
    const char *argv[] = {"HSET", "host:1:abc:work", "tid-7", work};
    struct resp_msg m;
    uint8_t *buf = kit_command(&m, 4, argv, NULL);
    struct rprof_cmdview cv;
    rprof_cmdview_init(&cv, buf, &m, true);
    resp_framework_sidekiq.seen(&r.host.h, &cv);
    __real_free(buf);
    kit_contains(&r.host.said, "RUNNING j9 task=Charge queue=default");
    run_free(&r, &resp_framework_sidekiq);
}

/* A plan's own commands due at more distinct times than it has groups for: none is lost, the
 * later ones join the group due nearest. */
static void test_own_commands_past_the_groups(void **state)
{
    (void)state;
    struct resp_cmd_plan p;
    memset(&p, 0, sizeof(p));
    const char *argv[] = {"PING"};
    size_t lens[] = {4}, total = 0;
    const uint32_t due[] = {0, 1000, 5000, 4000, 0, 900};
    for (size_t i = 0; i < sizeof(due) / sizeof(due[0]); i++)
        assert_true(resp_plan_own(p.own, &p.n_own, due[i], 1, argv, lens));
    assert_int_equal(p.n_own, RESP_PLAN_OWN_MAX);
    for (size_t i = 0; i < p.n_own; i++)
        total += p.own[i].n;
    assert_int_equal(total, 6);
    assert_int_equal(p.own[2].n, 2); /* 5000 took 4000 */
    assert_int_equal(p.own[1].n, 2); /* 1000 took 900 */
    resp_cmd_plan_free(&p);
}

/* A transaction of two XADDs, the second dropped: kept back and answered with the id Redis
 * would give; with an allocation failing, its answer is whole or marked as not made (the host
 * then plans nothing of it: never an EXEC reply short of an element). */
static void plan_xadds(struct run *r, struct resp_tx_plan *p)
{
    static const char tx[] = "*1\r\n$5\r\nMULTI\r\n"
                             "*5\r\n$4\r\nXADD\r\n$4\r\njobs\r\n$1\r\n*\r\n"
                             "$4\r\ntask\r\n$4\r\nkeep\r\n"
                             "*5\r\n$4\r\nXADD\r\n$4\r\njobs\r\n$1\r\n*\r\n"
                             "$4\r\ntask\r\n$6\r\ndropme\r\n"
                             "*1\r\n$4\r\nEXEC\r\n";
    fake_fault(&r->host, JOB_EV_PUBLISH, NULL, (struct job_fault){.kind = JOB_FAULT_NONE});
    fake_fault(&r->host, JOB_EV_PUBLISH, NULL, fault(JOB_FAULT_DROP, 0));
    memset(p, 0, sizeof(*p));
    int rc = resp_framework_streams.transaction(&r->host.h, (const uint8_t *)tx, sizeof(tx) - 1, 15,
                                                RESP_MAX_BULK, p);
    /* (an event whose strings could not be copied is not decided: then nothing is kept back) */
    for (size_t i = 0; rc == 1 && i < p->n; i++)
        if (p->cmds[i].keep_back)
            assert_true(p->cmds[i].answer.oom || p->cmds[i].answer.len > 0);
}

static void test_streams_transaction_drop(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, &resp_framework_streams);
    struct resp_tx_plan p;
    plan_xadds(&r, &p);
    assert_int_equal(p.n, 2);
    assert_false(p.cmds[0].keep_back);
    assert_true(p.cmds[1].keep_back);
    kit_say_tx_plan(&r.plans, 1, &p);
    kit_contains(&r.plans, "queued 1 keep_back=1 answer=$15|1700000000000-1| add=0 tag=0");
    resp_tx_plan_free(&resp_framework_streams, &p);
    run_free(&r, &resp_framework_streams);
}

/* ---- allocation failures ----------------------------------------------------------------- */

static void s_celery_ack(void)
{
    struct run run, *r = &run;
    replay_with(r, &resp_framework_celery, "celery_redis", JOB_EV_ACK, NULL,
                fault(JOB_FAULT_DELAY, 3000));
    run_free(r, &resp_framework_celery);
}

static void s_celery_dup(void)
{
    struct run run, *r = &run;
    replay_with(r, &resp_framework_celery, "celery_redis", JOB_EV_DELIVER, NULL,
                fault(JOB_FAULT_DUPLICATE, 0));
    run_free(r, &resp_framework_celery);
}

static void s_rq_ack(void)
{
    struct run run, *r = &run;
    replay_with(r, &resp_framework_rq, "rq", JOB_EV_ACK, NULL, fault(JOB_FAULT_REDELIVER, 0));
    run_free(r, &resp_framework_rq);
}

static void s_rq_beat(void)
{
    struct run run, *r = &run;
    run_init(r, &resp_framework_rq);
    fake_fault(&r->host, JOB_EV_LEASE, "j1", fault(JOB_FAULT_DELAY, 100));
    struct resp_tx_plan p;
    (void)plan_heartbeat(r, &p);
    resp_tx_plan_free(&resp_framework_rq, &p);
    run_free(r, &resp_framework_rq);
}

static void s_streams_drop(void)
{
    struct run run, *r = &run;
    replay_with(r, &resp_framework_streams, "streams", JOB_EV_DELIVER, "1796183659480-0",
                fault(JOB_FAULT_DROP, 0));
    run_free(r, &resp_framework_streams);
}

static void s_streams_tx(void)
{
    struct run run, *r = &run;
    run_init(r, &resp_framework_streams);
    struct resp_tx_plan p;
    plan_xadds(r, &p);
    resp_tx_plan_free(&resp_framework_streams, &p);
    run_free(r, &resp_framework_streams);
}

static void s_list_redeliver(void)
{
    struct run run, *r = &run;
    replay_with(r, &resp_framework_list, "lists", JOB_EV_ACK, NULL,
                fault(JOB_FAULT_REDELIVER, 5000));
    run_free(r, &resp_framework_list);
}

static void test_every_allocation_fails(void **state)
{
    (void)state;
    kit_every_allocation_fails(s_celery_ack);
    kit_every_allocation_fails(s_celery_dup);
    kit_every_allocation_fails(s_rq_ack);
    kit_every_allocation_fails(s_rq_beat);
    kit_every_allocation_fails(s_streams_drop);
    kit_every_allocation_fails(s_list_redeliver);
    kit_every_allocation_fails(s_streams_tx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded_sessions_without_a_rule),
        cmocka_unit_test(test_celery_ack_kept_back_in_its_transaction),
        cmocka_unit_test(test_celery_duplicates),
        cmocka_unit_test(test_rq_ack_redelivered),
        cmocka_unit_test(test_rq_heartbeat_lost_or_late),
        cmocka_unit_test(test_streams_faults),
        cmocka_unit_test(test_list_ack_faults),
        cmocka_unit_test(test_sidekiq_heartbeat_is_journaled),
        cmocka_unit_test(test_own_commands_past_the_groups),
        cmocka_unit_test(test_streams_transaction_drop),
        cmocka_unit_test(test_every_allocation_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
