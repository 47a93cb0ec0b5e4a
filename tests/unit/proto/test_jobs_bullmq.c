/*
 * test_jobs_bullmq.c - BullMQ's module (proto/jobs/bullmq.c) through a fake host
 * (jobs_testkit.h): what it journals, and what it plans for every fault, as BullMQ itself would
 * produce it.
 *
 *   - The recorded sessions of the BullMQ example app (tests/unit/data/frameworks/bullmq/,
 *     capture_frameworks.py) replayed without a rule: every job the app enqueued
 *     (enqueued.txt) published, delivered and acked once, with its task and queue, and
 *     nothing planned but forwarding.
 *   - The same sessions with each fault on the first event it applies to: the plan (an answer
 *     as BullMQ's script gives it, a call rewritten, a command for twice's own connection, a
 *     reply replaced, held or cut) and the records.
 *   - Lock renewals (extendLocks, made here: the example's jobs are shorter than a renewal):
 *     kept back one by one, rewritten without them, all answered, and lost for good.
 *   - Every faulted path again with an allocation failure at each of its allocations: no
 *     crash, nothing leaked, and a plan that is whole or not made.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include <cmocka.h>

#include "proto/resp/resp_bullmq.h"
#include "tests/lib/jobs_testkit.h"

extern const struct resp_framework resp_framework_bullmq;
static const struct resp_framework *const FW = &resp_framework_bullmq;

/* ---- recorded sessions ----------------------------------------------------------------------- */

static void run_init(struct run *r)
{
    fake_host_init(&r->host);
    memset(&r->plans, 0, sizeof(r->plans));
}

static void run_free(struct run *r)
{
    fake_host_free(&r->host);
    kit_text_free(&r->plans);
}

/* Without a rule: each enqueued job published, delivered and acked once, as the app says. */
static void test_recorded_sessions_without_a_rule(void **state)
{
    (void)state;
    struct run r;
    run_init(&r);
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    size_t n = 0;
    uint8_t *enq = kit_data("bullmq", "enqueued.txt", &n);
    assert_non_null(enq);
    char *line = strtok((char *)enq, "\n");
    int jobs = 0;
    for (; line != NULL; line = strtok(NULL, "\n"), jobs++) {
        char id[64], task[64], want[256];
        assert_int_equal(sscanf(line, "%63s %63s", id, task), 2);
        const char *kinds[] = {"PUBLISH", "DELIVER", "ACK"};
        for (size_t k = 0; k < 3; k++) {
            snprintf(want, sizeof(want), "%s %s task=%s queue=twice", kinds[k], id, task);
            kit_contains(&r.host.said, want);
            /* once */
            const char *first = strstr(kit_str(&r.host.said), want);
            assert_null(strstr(first + 1, want));
        }
    }
    assert_int_equal(jobs, 4);
    kit_free(enq);
    kit_lacks(&r.host.said, "FAULT ");
    kit_lacks(&r.plans, "plan answer");
    kit_lacks(&r.plans, "plan rewrite");
    kit_lacks(&r.plans, "own ");
    kit_lacks(&r.plans, "replace=1");
    run_free(&r);
}

/* An ack lost (redeliver or drop): answered as moveToFinished answers a job it finished without
 * fetching another, never applied, journaled kept back; its job stays in the memory. */
static void test_ack_lost_is_answered_and_kept_back(void **state)
{
    (void)state;
    static const enum job_fault_kind kinds[] = {JOB_FAULT_REDELIVER, JOB_FAULT_DROP};
    for (size_t k = 0; k < 2; k++) {
        struct run r;
        run_init(&r);
        fake_fault(&r.host, JOB_EV_ACK, NULL, fault(kinds[k], 0));
        kit_replay_all(FW, "bullmq", &r.host, &r.plans);
        kit_contains(&r.plans, "plan answer bytes=:0| hold=0 cut=- reply=0 own=0");
        kit_contains(&r.host.said, "ACK 1 task=charge queue=twice kept_back");
        assert_non_null(kit_memo(&r.host, "bull:twice:1"));
        run_free(&r);
    }
}

/* An ack delayed: answered at once, and the same call sent D later on twice's own connection,
 * fetching no next job. */
static void test_ack_delayed_is_sent_later_without_fetching(void **state)
{
    (void)state;
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_ACK, NULL, fault(JOB_FAULT_DELAY, 2500));
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    kit_contains(&r.plans, "plan answer bytes=:0| hold=0 cut=- reply=0 own=1\nown ms=2500 n=1");
    kit_contains(&r.host.said, "ACK 1 task=charge queue=twice retries=0");
    run_free(&r);
}

/* A `duplicate` on a delivery: the job handed out again at once by one EVAL on twice's own
 * connection, and the worker's lease marked lost under its token. */
static void test_duplicate_requeues_at_once_and_loses_the_lease(void **state)
{
    (void)state;
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_DELIVER, NULL, fault(JOB_FAULT_DUPLICATE, 0));
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    kit_contains(&r.plans, "reply replace=0 bytes= delay=0 cut=- own=1\nown ms=0 n=1");
    kit_contains(&r.host.said, "FAULT duplicate deliver id=1");
    run_free(&r);
}

/* The reply side of a delivery's faults: drop (no job), delay, close before and after. */
static void test_delivery_dropped_delayed_or_cut(void **state)
{
    (void)state;
    struct {
        struct job_fault f;
        const char *plan;
    } cases[] = {
        {fault(JOB_FAULT_DROP, 0), "reply replace=1 bytes=*4|:0|:0|:0|:0| delay=0 cut=- own=0"},
        {fault(JOB_FAULT_DELAY, 1500), "reply replace=0 bytes= delay=1500 cut=- own=0"},
        {{.kind = JOB_FAULT_CLOSE, .before = true, .rule = &rule_a},
         "reply replace=0 bytes= delay=0 cut=a before own=0"},
        {{.kind = JOB_FAULT_CLOSE, .before = false, .rule = &rule_a},
         "reply replace=0 bytes= delay=0 cut=a own=0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct run r;
        run_init(&r);
        fake_fault(&r.host, JOB_EV_DELIVER, NULL, cases[i].f);
        kit_replay_all(FW, "bullmq", &r.host, &r.plans);
        kit_contains(&r.plans, cases[i].plan);
        run_free(&r);
    }
}

/* A publish dropped: answered with an id BullMQ's counter never gives, journaled with it, the
 * fault noted with it; delayed: held; cut before: kept from Redis. */
static void test_publish_dropped_held_or_cut(void **state)
{
    (void)state;
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_PUBLISH, NULL, fault(JOB_FAULT_DROP, 0));
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    kit_contains(&r.plans, "plan answer bytes=$17|twice-dropped-7-1| hold=0");
    kit_contains(&r.host.said, "FAULT drop publish id=twice-dropped-7-1\n"
                               "PUBLISH twice-dropped-7-1 task=charge queue=twice");
    run_free(&r);

    run_init(&r);
    fake_fault(&r.host, JOB_EV_PUBLISH, NULL, fault(JOB_FAULT_DELAY, 800));
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    kit_contains(&r.plans, "plan hold bytes= hold=800 cut=- reply=0 own=0");
    run_free(&r);

    run_init(&r);
    fake_fault(&r.host, JOB_EV_PUBLISH, NULL,
               (struct job_fault){.kind = JOB_FAULT_CLOSE, .before = true, .rule = &rule_a});
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    kit_contains(&r.plans, "plan cut bytes= hold=0 cut=a reply=0 own=0");
    run_free(&r);
}

/* ---- lock renewals ----------------------------------------------------------------------- */

static const char EXTEND_LOCKS_BODY[] = "--[[\n  Extend locks for multiple jobs\n]]\nreturn {}";

/* A msgpack array of short strings. */
static size_t pack_strs(uint8_t *out, const char *const *s, size_t n)
{
    size_t k = 0;
    out[k++] = (uint8_t)(0x90 | n);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(s[i]);
        out[k++] = (uint8_t)(0xa0 | l);
        memcpy(out + k, s[i], l);
        k += l;
    }
    return k;
}

/* extendLocks of jobs ids[0..n) of queue twice, each under its token. */
static uint8_t *extend_locks(struct resp_msg *m, const char *const *ids, const char *const *tokens,
                             size_t n)
{
    uint8_t tok[256], id[256];
    size_t tl = pack_strs(tok, tokens, n), il = pack_strs(id, ids, n);
    const char *argv[] = {"EVAL",
                          EXTEND_LOCKS_BODY,
                          "1",
                          "bull:twice:stalled",
                          "bull:twice:",
                          (const char *)tok,
                          (const char *)id,
                          "30000"};
    size_t lens[] = {4, strlen(EXTEND_LOCKS_BODY), 1, 18, 11, tl, il, 5};
    return kit_command(m, 8, argv, lens);
}

static int plan_lease(struct run *r, const char *const *ids, const char *const *tokens, size_t n,
                      struct resp_cmd_plan *p)
{
    struct resp_msg m;
    uint8_t *buf = extend_locks(&m, ids, tokens, n);
    struct rprof_cmdview cv;
    rprof_cmdview_init(&cv, buf, &m, true);
    memset(p, 0, sizeof(*p));
    int rc = FW->command(&r->host.h, &cv, false, p);
    kit_say_cmd_plan(&r->plans, p);
    __real_free(buf);
    return rc;
}

/* One renewal of three dropped: the call goes on without it (its tokens and ids packed anew);
 * its later renewals by the same token are lost too, counted and not decided again; all of
 * them kept back: answered as a call that renewed them all. */
static void test_renewals_kept_back_one_by_one(void **state)
{
    (void)state;
    const char *ids[] = {"1", "2", "3"}, *tokens[] = {"w:1", "w:2", "w:3"};
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_LEASE, "2", fault(JOB_FAULT_DROP, 0));
    struct resp_cmd_plan p;
    assert_int_equal(plan_lease(&r, ids, tokens, 3, &p), 1);
    assert_int_equal(p.fate, RESP_CMD_REWRITE);
    static const uint8_t kept_ids[] = "$5\r\n\x92\xa1"
                                      "1\xa1"
                                      "3\r\n";
    static const uint8_t kept_tokens[] = "$9\r\n\x92\xa3w:1\xa3w:3\r\n";
    assert_non_null(memmem(p.bytes.p, p.bytes.len, kept_ids, sizeof(kept_ids) - 1));
    assert_non_null(memmem(p.bytes.p, p.bytes.len, kept_tokens, sizeof(kept_tokens) - 1));
    resp_cmd_plan_free(&p);
    assert_int_equal(r.host.decided[JOB_EV_LEASE], 3);
    struct job_memo *m = kit_memo(&r.host, "bull:twice:2");
    assert_non_null(m);
    assert_true(m->flags & JOB_MEMO_LEASE_LOST);
    assert_string_equal(m->id, "w:2");

    /* the same worker renews job 2 alone: lost already, counted, answered */
    assert_int_equal(plan_lease(&r, ids + 1, tokens + 1, 1, &p), 1);
    assert_int_equal(p.fate, RESP_CMD_ANSWER);
    kit_contains(&r.plans, "plan answer bytes=*0| hold=0");
    resp_cmd_plan_free(&p);
    assert_int_equal(r.host.decided[JOB_EV_LEASE], 3);
    assert_int_equal(r.host.counted[JOB_EV_LEASE], 1);
    /* another worker holds job 2 now (another token): its renewal is its own */
    const char *other[] = {"v:9"};
    assert_int_equal(plan_lease(&r, ids + 1, other, 1, &p), 1);
    assert_int_equal(p.fate, RESP_CMD_FORWARD);
    resp_cmd_plan_free(&p);
    run_free(&r);
}

/* A renewal delayed: kept back now, that job's renewal sent D later on twice's own connection,
 * and so are its next ones. */
static void test_renewal_delayed(void **state)
{
    (void)state;
    const char *ids[] = {"1", "2"}, *tokens[] = {"w:1", "w:2"};
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_LEASE, "1", fault(JOB_FAULT_DELAY, 40000));
    struct resp_cmd_plan p;
    assert_int_equal(plan_lease(&r, ids, tokens, 2, &p), 1);
    assert_int_equal(p.fate, RESP_CMD_REWRITE);
    assert_int_equal(p.n_own, 1);
    assert_int_equal(p.own[0].ms, 40000);
    static const uint8_t late_ids[] = "$3\r\n\x91\xa1"
                                      "1\r\n";
    assert_non_null(memmem(p.own[0].cmds.p, p.own[0].cmds.len, late_ids, sizeof(late_ids) - 1));
    resp_cmd_plan_free(&p);
    assert_int_equal(plan_lease(&r, ids, tokens, 1, &p), 1);
    kit_contains(&r.plans, "plan answer bytes=*0| hold=0 cut=- reply=0 own=1\nown ms=40000 n=1");
    resp_cmd_plan_free(&p);
    run_free(&r);
}

/* After a `duplicate` of its delivery, the first worker's renewals of the job are answered and
 * never applied: it believes it holds the job while another worker has it. */
static void test_duplicate_then_the_first_workers_renewals_are_lost(void **state)
{
    (void)state;
    struct run r;
    run_init(&r);
    fake_fault(&r.host, JOB_EV_DELIVER, NULL, fault(JOB_FAULT_DUPLICATE, 0));
    kit_replay_all(FW, "bullmq", &r.host, &r.plans);
    struct job_memo *m = kit_memo(&r.host, "bull:twice:1");
    /* the job was acked in the recording, which forgets it: made again as a worker holds it */
    if (m == NULL) {
        r.host.memo_held = true;
        m = kit_memo_put(&r.host, "bull:twice:1", 12);
        r.host.memo_held = false;
        m->flags = JOB_MEMO_LEASE_LOST;
        job_memo_set(&m->id, "w:1", 3);
    }
    const char *ids[] = {"1"}, *tokens[] = {m->id};
    struct resp_cmd_plan p;
    assert_int_equal(plan_lease(&r, ids, tokens, 1, &p), 1);
    assert_int_equal(p.fate, RESP_CMD_ANSWER);
    resp_cmd_plan_free(&p);
    run_free(&r);
}

/* ---- allocation failures ----------------------------------------------------------------- */

/* One faulted path run with allocation `fail` failing: returns whether that allocation was
 * reached.  Nothing it allocated may outlive it. */

static void replay_with(struct run *r, enum job_ev kind, struct job_fault f)
{
    fake_fault(&r->host, kind, NULL, f);
    kit_replay_all(FW, "bullmq", &r->host, &r->plans);
}

static void s_ack_delay(void)
{
    struct run run, *r = &run;
    run_init(r);
    replay_with(r, JOB_EV_ACK, fault(JOB_FAULT_DELAY, 2500));
    run_free(r);
}

static void s_duplicate(void)
{
    struct run run, *r = &run;
    run_init(r);
    replay_with(r, JOB_EV_DELIVER, fault(JOB_FAULT_DUPLICATE, 0));
    run_free(r);
}

static void s_publish_drop(void)
{
    struct run run, *r = &run;
    run_init(r);
    replay_with(r, JOB_EV_PUBLISH, fault(JOB_FAULT_DROP, 0));
    run_free(r);
}

static void s_lease(void)
{
    struct run run, *r = &run;
    run_init(r);
    const char *ids[] = {"1", "2", "3"}, *tokens[] = {"w:1", "w:2", "w:3"};
    fake_fault(&r->host, JOB_EV_LEASE, "2", fault(JOB_FAULT_DROP, 0));
    fake_fault(&r->host, JOB_EV_LEASE, "3", fault(JOB_FAULT_DELAY, 100));
    struct resp_cmd_plan p;
    (void)plan_lease(r, ids, tokens, 3, &p);
    /* a plan is whole, or says which bytes could not be made (the host then forwards) */
    if (p.fate == RESP_CMD_REWRITE)
        assert_true(p.bytes.len > 0 || p.bytes.oom);
    resp_cmd_plan_free(&p);
    run_free(r);
}

static void test_every_allocation_fails(void **state)
{
    (void)state;
    kit_every_allocation_fails(s_ack_delay);
    kit_every_allocation_fails(s_duplicate);
    kit_every_allocation_fails(s_publish_drop);
    kit_every_allocation_fails(s_lease);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded_sessions_without_a_rule),
        cmocka_unit_test(test_ack_lost_is_answered_and_kept_back),
        cmocka_unit_test(test_ack_delayed_is_sent_later_without_fetching),
        cmocka_unit_test(test_duplicate_requeues_at_once_and_loses_the_lease),
        cmocka_unit_test(test_delivery_dropped_delayed_or_cut),
        cmocka_unit_test(test_publish_dropped_held_or_cut),
        cmocka_unit_test(test_renewals_kept_back_one_by_one),
        cmocka_unit_test(test_renewal_delayed),
        cmocka_unit_test(test_duplicate_then_the_first_workers_renewals_are_lost),
        cmocka_unit_test(test_every_allocation_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
