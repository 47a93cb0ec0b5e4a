/*
 * test_resp_job.c - job identities in Sidekiq, Celery and RQ payloads (proto/resp/resp_job.c).
 *
 *   - Golden payloads recorded from the frameworks themselves against redis-server 7.0
 *     (tests/unit/data/jobs/): Sidekiq 6.4.1 perform_async(42) (sidekiq.json), the same job as
 *     Sidekiq::JobRetry re-filed it in the retry set after a failure (sidekiq_retry.json), a
 *     Sidekiq::Client.push of the hash ActiveJob's SidekiqAdapter builds, with a hand-made
 *     job.serialize argument (sidekiq_activejob.json); Celery 5.2.6 / kombu 5.2.4 .delay(42, "x")
 *     (celery.json), its `unacked` hash value after a basic_get without ack
 *     (celery_unacked.json), and the message kombu's QoS.restore_unacked() pushed back
 *     (celery_redelivered.json); RQ 1.13 enqueue("tasks.charge", 42, "x")'s description
 *     (rq_description.txt).  Each gives the right id, task, queue, tag and redelivered flag.
 *   - resp_job_celery_redelivered() of the original message is the message kombu restored,
 *     value for value and key order included, and reads back as the same job, redelivered.
 *   - Every truncation of every payload, wrong types, non-objects, invalid UTF-8, embedded NULs,
 *     trailing bytes, duplicate keys and huge integers give the documented answer; the size and
 *     depth limits are crossed.  Inputs are heap copies of exactly their length, so that
 *     ASan/valgrind see any over-read.
 *   - A fixed-seed mutation run over the golden payloads never crashes, answers 0 or -1, and
 *     leaves nothing allocated on -1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/json_pick.h"
#include "proto/resp/resp_job.h"
#include "tests/lib/golden.h"

#define MUTATIONS 20000

/* What the recorded payloads hold. */
#define SK_JID "0084a19061aefcbc31d5e657"
#define SK_AJ_JID "c528c3c9767a66a0bd5ee13a"
#define CEL_ID "9353677e-d7cd-44d7-a1d9-b6c51f73efef"
#define CEL_TAG "a3fab987-bb96-41d0-b3e4-a0ab620e1a2d"

/* ---- golden payloads ----------------------------------------------------------------------- */

enum {
    G_SIDEKIQ,
    G_SIDEKIQ_RETRY,
    G_SIDEKIQ_AJ,
    G_CELERY,
    G_CELERY_REDELIVERED,
    G_CELERY_UNACKED,
    G_RQ,
    G_COUNT
};
static const char *const golden_files[G_COUNT] = {
    "sidekiq.json",       "sidekiq_retry.json",      "sidekiq_activejob.json",
    "celery.json",        "celery_redelivered.json", "celery_unacked.json",
    "rq_description.txt",
};

struct golden {
    uint8_t *buf;
    size_t len;
};
static struct golden g_payloads[G_COUNT];

static int setup_golden(void **state)
{
    (void)state;
    for (int i = 0; i < G_COUNT; i++) {
        g_payloads[i].buf = kit_golden(&g_payloads[i].len, "jobs/%s", golden_files[i]);
    }
    return 0;
}

static int teardown_golden(void **state)
{
    (void)state;
    for (int i = 0; i < G_COUNT; i++)
        kit_free(g_payloads[i].buf);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A heap copy of exactly len bytes (one byte allocated for len 0, none of it readable as
 * input): an over-read by the code under test lands outside the block. */
static uint8_t *dup_exact(const void *p, size_t len)
{
    uint8_t *b = malloc(len == 0 ? 1 : len);
    assert_non_null(b);
    if (len > 0)
        memcpy(b, p, len);
    return b;
}

static int run_sidekiq(const void *p, size_t len, struct resp_job *j)
{
    uint8_t *b = dup_exact(p, len);
    int rc = resp_job_sidekiq(b, len, j);
    free(b);
    return rc;
}

static int run_celery(const void *p, size_t len, struct resp_job *j)
{
    uint8_t *b = dup_exact(p, len);
    int rc = resp_job_celery(b, len, j);
    free(b);
    return rc;
}

static int run_redelivered(const void *p, size_t len, char **out, size_t *outlen)
{
    uint8_t *b = dup_exact(p, len);
    int rc = resp_job_celery_redelivered(b, len, out, outlen);
    free(b);
    return rc;
}

static int run_rq(const void *p, size_t len, char **task)
{
    uint8_t *b = dup_exact(p, len);
    int rc = resp_job_rq_task(b, len, task);
    free(b);
    return rc;
}

#define SIDEKIQ(s, j) run_sidekiq((s), strlen(s), (j))
#define CELERY(s, j) run_celery((s), strlen(s), (j))
#define NO_JOB(s) expect_no_job((s), strlen(s))

static void assert_str_or_null(const char *got, const char *want)
{
    if (want == NULL)
        assert_null(got);
    else {
        assert_non_null(got);
        assert_string_equal(got, want);
    }
}

/* Checks every field of j, then clears it. */
static void expect_job(struct resp_job *j, const char *id, const char *task, const char *queue,
                       const char *tag, bool redelivered)
{
    assert_str_or_null(j->id, id);
    assert_str_or_null(j->task, task);
    assert_str_or_null(j->queue, queue);
    assert_str_or_null(j->tag, tag);
    assert_int_equal(j->redelivered, redelivered);
    resp_job_clear(j);
}

static void assert_zeroed(const struct resp_job *j)
{
    assert_null(j->id);
    assert_null(j->task);
    assert_null(j->queue);
    assert_null(j->tag);
    assert_false(j->redelivered);
}

/* A struct resp_job with garbage in it: the readers must overwrite every field. */
static struct resp_job dirty_job(void)
{
    struct resp_job j;
    memset(&j, 0xa5, sizeof(j));
    return j;
}

/* Both readers refuse s, leaving the struct zeroed. */
static void expect_no_job(const void *s, size_t len)
{
    struct resp_job j = dirty_job();
    assert_int_equal(run_sidekiq(s, len, &j), -1);
    assert_zeroed(&j);
    j = dirty_job();
    assert_int_equal(run_celery(s, len, &j), -1);
    assert_zeroed(&j);
}

/* resp_job_celery_redelivered() refuses s. */
static void expect_no_redelivery(const void *s, size_t len)
{
    char *out = (char *)&out;
    size_t outlen = 7;
    assert_int_equal(run_redelivered(s, len, &out, &outlen), -1);
    assert_null(out);
    assert_int_equal(outlen, 0);
}

static json_t *parse(const void *p, size_t len)
{
    json_error_t err;
    json_t *v = json_loadb(p, len, JSON_ALLOW_NUL, &err);
    if (v == NULL)
        fprintf(stderr, "test JSON: %s\n", err.text);
    assert_non_null(v);
    return v;
}

/* ---- Sidekiq ------------------------------------------------------------------------------- */

static void test_sidekiq_golden(void **state)
{
    (void)state;
    struct resp_job j = dirty_job();
    const struct golden *g = &g_payloads[G_SIDEKIQ];
    assert_int_equal(run_sidekiq(g->buf, g->len, &j), 0);
    expect_job(&j, SK_JID, "ChargeWorker", "default", NULL, false);

    /* The same job re-filed by the retry handler: retry_count 0 marks the first failure. */
    g = &g_payloads[G_SIDEKIQ_RETRY];
    assert_int_equal(run_sidekiq(g->buf, g->len, &j), 0);
    assert_int_equal(j.retries, 1);
    expect_job(&j, SK_JID, "ChargeWorker", "default", NULL, true);

    g = &g_payloads[G_SIDEKIQ_AJ];
    assert_int_equal(run_sidekiq(g->buf, g->len, &j), 0);
    expect_job(&j, SK_AJ_JID, "ChargeJob", "mailers", NULL, false);
}

static void test_sidekiq_activejob_task(void **state)
{
    (void)state;
    struct resp_job j;
    /* No "wrapped": the job_class of the serialized job, as Sidekiq's Web UI falls back to. */
    assert_int_equal(
        SIDEKIQ("{\"class\":\"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper\",\"jid\":\"a\","
                "\"args\":[{\"job_class\":\"SendMail\",\"arguments\":[]}]}",
                &j),
        0);
    expect_job(&j, "a", "SendMail", NULL, NULL, false);
    /* Sidekiq 7.3's own adapter. */
    assert_int_equal(SIDEKIQ("{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"jid\":\"a\","
                             "\"wrapped\":\"ChargeJob\",\"args\":[{}]}",
                             &j),
                     0);
    expect_job(&j, "a", "ChargeJob", NULL, NULL, false);
    /* A wrapper with nothing usable inside: the wrapper it is. */
    assert_int_equal(SIDEKIQ("{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"jid\":\"a\","
                             "\"wrapped\":7,\"args\":[\"x\"]}",
                             &j),
                     0);
    expect_job(&j, "a", "Sidekiq::ActiveJob::Wrapper", NULL, NULL, false);
    /* "wrapped" means nothing on an ordinary worker. */
    assert_int_equal(SIDEKIQ("{\"class\":\"Plain\",\"jid\":\"a\",\"wrapped\":\"Other\"}", &j), 0);
    expect_job(&j, "a", "Plain", NULL, NULL, false);
}

/* The app's retry count: Sidekiq's retry_count + 1 (0 at the first failure), Celery's
 * headers.retries; only a whole number counts, a huge one saturates. */
static void test_retries(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        unsigned retries;
    } sk[] =
        {
            {"{\"jid\":\"a\",\"class\":\"C\"}", 0},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":0}", 1},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":24}", 25},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":null}", 1},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":-3}", 1},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":2.5}", 1},
            {"{\"jid\":\"a\",\"class\":\"C\",\"retry_count\":99999999999999999999999}",
             RESP_JOB_MAX_RETRIES},
        },
      ce[] = {
          {"{\"headers\":{\"id\":\"a\"}}", 0},
          {"{\"headers\":{\"id\":\"a\",\"retries\":0}}", 0},
          {"{\"headers\":{\"id\":\"a\",\"retries\":2}}", 2},
          {"{\"headers\":{\"id\":\"a\",\"retries\":\"2\"}}", 0},
          {"{\"headers\":{\"id\":\"a\",\"retries\":2e1}}", 0},
          {"{\"headers\":{\"id\":\"a\",\"retries\":1000000001}}", RESP_JOB_MAX_RETRIES},
          {"{\"headers\":{\"id\":\"a\",\"retries\":999999999}}", 999999999},
      };
    struct resp_job j;
    for (size_t i = 0; i < sizeof(sk) / sizeof(sk[0]); i++) {
        assert_int_equal(SIDEKIQ(sk[i].json, &j), 0);
        if (j.retries != sk[i].retries)
            fail_msg("%s: retries %u, want %u", sk[i].json, j.retries, sk[i].retries);
        resp_job_clear(&j);
    }
    for (size_t i = 0; i < sizeof(ce) / sizeof(ce[0]); i++) {
        assert_int_equal(CELERY(ce[i].json, &j), 0);
        if (j.retries != ce[i].retries)
            fail_msg("%s: retries %u, want %u", ce[i].json, j.retries, ce[i].retries);
        resp_job_clear(&j);
    }
}

static void test_sidekiq_fields(void **state)
{
    (void)state;
    struct resp_job j;
    /* The least a job needs. */
    assert_int_equal(SIDEKIQ("{\"jid\":\"j1\",\"class\":\"C\"}", &j), 0);
    expect_job(&j, "j1", "C", NULL, NULL, false);
    /* Wrong types for the optional fields: absent.  retry_count counts whatever its value. */
    assert_int_equal(
        SIDEKIQ("{\"jid\":\"j1\",\"class\":\"C\",\"queue\":5,\"retry_count\":null}", &j), 0);
    expect_job(&j, "j1", "C", NULL, NULL, true);
    /* Wrong types or empty values for the required ones: not a job. */
    static const char *const bad[] = {
        "{\"jid\":42,\"class\":\"C\"}",
        "{\"jid\":\"j1\",\"class\":[\"C\"]}",
        "{\"jid\":null,\"class\":\"C\"}",
        "{\"jid\":\"\",\"class\":\"C\"}",
        "{\"jid\":\"j1\",\"class\":\"\"}",
        "{\"jid\":\"j1\"}",
        "{\"class\":\"C\"}",
        "{\"jid\":true,\"class\":\"C\"}",
        "{\"jid\":{\"a\":1},\"class\":\"C\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        j = dirty_job();
        assert_int_equal(SIDEKIQ(bad[i], &j), -1);
        assert_zeroed(&j);
    }
    /* A kombu message is not a Sidekiq job, nor the reverse. */
    const struct golden *g = &g_payloads[G_CELERY];
    assert_int_equal(run_sidekiq(g->buf, g->len, &j), -1);
    g = &g_payloads[G_SIDEKIQ];
    assert_int_equal(run_celery(g->buf, g->len, &j), -1);
}

/* ---- Celery -------------------------------------------------------------------------------- */

/* Sidekiq's work state, as its heartbeat writes each job in progress: the job is the payload
 * string's JSON; run_at whole seconds (6, 7) or milliseconds (8), read as the end of that
 * second or millisecond: the job started no later. */
static void test_sidekiq_work_state(void **state)
{
    (void)state;
    struct resp_job j;
    uint64_t by = 0;
    static const char six[] =
        "{\"queue\":\"default\",\"payload\":\"{\\\"retry\\\":0,\\\"queue\\\":\\\"default\\\","
        "\\\"class\\\":\\\"Charge\\\",\\\"args\\\":[\\\"order-1\\\"],\\\"jid\\\":"
        "\\\"0ee7ca08fcd9f25a8a05bb01\\\",\\\"created_at\\\":1796183652.18}\","
        "\"run_at\":1796183653}";
    assert_int_equal(resp_job_sidekiq_work(six, sizeof(six) - 1, &j, &by), 0);
    expect_job(&j, "0ee7ca08fcd9f25a8a05bb01", "Charge", "default", NULL, false);
    assert_int_equal(by, 1796183654000000ull);
    static const char eight[] = "{\"queue\":\"q\",\"payload\":\"{\\\"class\\\":\\\"A\\\","
                                "\\\"jid\\\":\\\"j\\\"}\",\"run_at\":1796183653123}";
    assert_int_equal(resp_job_sidekiq_work(eight, sizeof(eight) - 1, &j, &by), 0);
    expect_job(&j, "j", "A", NULL, NULL, false);
    assert_int_equal(by, 1796183653124000ull);
    static const char no_run_at[] =
        "{\"payload\":\"{\\\"class\\\":\\\"A\\\",\\\"jid\\\":\\\"j\\\"}\"}";
    assert_int_equal(resp_job_sidekiq_work(no_run_at, sizeof(no_run_at) - 1, &j, &by), 0);
    assert_int_equal(by, 0);
    resp_job_clear(&j);
    /* Not a work entry: no payload, a payload that is no job, an object, not JSON. */
    static const char *const bad[] = {
        "{\"queue\":\"q\",\"run_at\":1}",
        "{\"payload\":\"{\\\"class\\\":\\\"A\\\"}\",\"run_at\":1}",
        "{\"payload\":{\"class\":\"A\",\"jid\":\"j\"},\"run_at\":1}",
        "{\"payload\":\"not json\"}",
        "[1,2]",
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(resp_job_sidekiq_work(bad[i], strlen(bad[i]), &j, &by), -1);
        assert_null(j.id);
        assert_int_equal(by, 0);
    }
    /* A run_at that is no time */
    static const char neg[] = "{\"payload\":\"{\\\"class\\\":\\\"A\\\",\\\"jid\\\":\\\"j\\\"}\","
                              "\"run_at\":-5}";
    assert_int_equal(resp_job_sidekiq_work(neg, sizeof(neg) - 1, &j, &by), 0);
    assert_int_equal(by, 0);
    resp_job_clear(&j);
}

static void test_celery_golden(void **state)
{
    (void)state;
    struct resp_job j = dirty_job();
    const struct golden *g = &g_payloads[G_CELERY];
    assert_int_equal(run_celery(g->buf, g->len, &j), 0);
    expect_job(&j, CEL_ID, "tasks.charge", "celery", CEL_TAG, false);

    g = &g_payloads[G_CELERY_REDELIVERED];
    assert_int_equal(run_celery(g->buf, g->len, &j), 0);
    expect_job(&j, CEL_ID, "tasks.charge", "celery", CEL_TAG, true);

    /* The `unacked` hash value is [message, exchange, routing_key]: not a message itself. */
    g = &g_payloads[G_CELERY_UNACKED];
    expect_no_job(g->buf, g->len);
    expect_no_redelivery(g->buf, g->len);
}

static void test_celery_fields(void **state)
{
    (void)state;
    struct resp_job j;
    /* No headers.id (or not a usable string): properties.correlation_id. */
    static const char *const fallback[] = {
        "{\"headers\":{},\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"headers\":{\"id\":7},\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"headers\":{\"id\":\"\"},\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"headers\":{\"id\":\"x\\u0000y\"},\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"properties\":{\"correlation_id\":\"c1\"}}",
    };
    for (size_t i = 0; i < sizeof(fallback) / sizeof(fallback[0]); i++) {
        assert_int_equal(CELERY(fallback[i], &j), 0);
        expect_job(&j, "c1", NULL, NULL, NULL, false);
    }
    /* headers.id wins over the correlation id. */
    assert_int_equal(
        CELERY("{\"headers\":{\"id\":\"h\"},\"properties\":{\"correlation_id\":\"c\"}}", &j), 0);
    expect_job(&j, "h", NULL, NULL, NULL, false);
    /* Only JSON true redelivers, from either place. */
    assert_int_equal(CELERY("{\"headers\":{\"id\":\"h\",\"redelivered\":\"true\"},\"properties\":"
                            "{\"delivery_info\":{\"redelivered\":1}}}",
                            &j),
                     0);
    expect_job(&j, "h", NULL, NULL, NULL, false);
    assert_int_equal(CELERY("{\"headers\":{\"id\":\"h\"},\"properties\":{\"delivery_info\":"
                            "{\"redelivered\":true,\"routing_key\":\"\"}}}",
                            &j),
                     0);
    expect_job(&j, "h", NULL, "", NULL, true);
    assert_int_equal(CELERY("{\"headers\":{\"id\":\"h\",\"redelivered\":true}}", &j), 0);
    expect_job(&j, "h", NULL, NULL, NULL, true);
    /* Optional fields of the wrong type are absent. */
    assert_int_equal(CELERY("{\"headers\":{\"id\":\"h\",\"task\":1},\"properties\":{\"delivery_tag"
                            "\":2,\"delivery_info\":{\"routing_key\":[]}}}",
                            &j),
                     0);
    expect_job(&j, "h", NULL, NULL, NULL, false);
    /* Not a kombu message, or no id. */
    static const char *const bad[] = {
        "{\"headers\":[],\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"headers\":{\"id\":\"h\"},\"properties\":\"p\"}",
        "{\"headers\":{\"id\":\"h\"},\"properties\":{\"delivery_info\":[]}}",
        "{\"headers\":null,\"properties\":{\"correlation_id\":\"c1\"}}",
        "{\"body\":\"e30=\",\"id\":\"h\"}",
        "{\"headers\":{},\"properties\":{}}",
        "{\"headers\":{\"id\":5},\"properties\":{\"correlation_id\":5}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_no_job(bad[i], strlen(bad[i]));
}

/* ---- Celery redelivery --------------------------------------------------------------------- */

static void test_redelivered_is_kombus_restore(void **state)
{
    (void)state;
    const struct golden *orig = &g_payloads[G_CELERY];
    const struct golden *kombu = &g_payloads[G_CELERY_REDELIVERED];
    char *out = NULL;
    size_t outlen = 0;
    assert_int_equal(run_redelivered(orig->buf, orig->len, &out, &outlen), 0);
    assert_non_null(out);
    assert_int_equal(strlen(out), outlen);

    /* Byte for byte what kombu pushed, once both are written compactly: values, and key order
     * with "redelivered" appended last, as kombu's dict assignment does. */
    json_t *want = parse(kombu->buf, kombu->len);
    char *want_text = json_dumps(want, JSON_COMPACT);
    assert_string_equal(out, want_text);
    free(want_text);

    /* The same job, now redelivered; the body untouched. */
    struct resp_job j;
    assert_int_equal(resp_job_celery(out, outlen, &j), 0);
    expect_job(&j, CEL_ID, "tasks.charge", "celery", CEL_TAG, true);
    json_t *got = parse(out, outlen);
    json_t *before = parse(orig->buf, orig->len);
    assert_true(json_equal(json_object_get(got, "body"), json_object_get(before, "body")));
    assert_true(json_equal(got, want));

    /* Restoring a restored message changes nothing. */
    char *again = NULL;
    size_t againlen = 0;
    assert_int_equal(run_redelivered(out, outlen, &again, &againlen), 0);
    assert_int_equal(againlen, outlen);
    assert_memory_equal(again, out, outlen);
    free(again);
    json_decref(got);
    json_decref(before);
    json_decref(want);
    free(out);
}

/* resp_job_celery_redelivered(in) is exactly want. */
static void expect_redelivered(const char *in, const char *want)
{
    char *out = NULL;
    size_t outlen = 0;
    assert_int_equal(run_redelivered(in, strlen(in), &out, &outlen), 0);
    assert_string_equal(out, want);
    assert_int_equal(outlen, strlen(want));
    free(out);
}

/* A copy's new delivery tag: set in place, created with properties when absent; what is not
 * a kombu message, and a tag that is not UTF-8, give nothing. */
static void test_retagged(void **state)
{
    (void)state;
    static const struct {
        const char *in, *want;
    } ok[] = {
        {"{\"headers\":{\"id\":\"x\"},\"properties\":{\"delivery_tag\":\"old\",\"priority\":0}}",
         "{\"headers\":{\"id\":\"x\"},\"properties\":{\"delivery_tag\":\"new\",\"priority\":0}}"},
        {"{\"headers\":{\"id\":\"x\"}}",
         "{\"headers\":{\"id\":\"x\"},\"properties\":{\"delivery_tag\":\"new\"}}"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char *out = NULL;
        size_t outlen = 0;
        uint8_t *b = dup_exact(ok[i].in, strlen(ok[i].in));
        assert_int_equal(resp_job_celery_retagged(b, strlen(ok[i].in), "new", &out, &outlen), 0);
        free(b);
        assert_string_equal(out, ok[i].want);
        assert_int_equal(outlen, strlen(ok[i].want));
        free(out);
    }
    char *out = (char *)"x";
    size_t outlen = 7;
    const char *job = "{\"headers\":{\"id\":\"x\"}}";
    assert_int_equal(resp_job_celery_retagged("[1]", 3, "new", &out, &outlen), -1);
    assert_null(out);
    assert_int_equal(outlen, 0);
    assert_int_equal(resp_job_celery_retagged(job, strlen(job), "\xff", &out, &outlen), -1);
    assert_null(out);
    assert_int_equal(resp_job_celery_retagged(job, strlen(job), NULL, &out, &outlen), -1);
    assert_null(out);
}

static void test_redelivered_shapes(void **state)
{
    (void)state;
    /* Missing objects are created. */
    expect_redelivered("{\"properties\":{}}", "{\"properties\":{\"delivery_info\":{\"redelivered\":"
                                              "true}},\"headers\":{\"redelivered\":true}}");
    expect_redelivered("{\"headers\":{\"id\":\"x\"}}",
                       "{\"headers\":{\"id\":\"x\",\"redelivered\":true},\"properties\":{"
                       "\"delivery_info\":{\"redelivered\":true}}}");
    /* A redelivered false is overwritten in place; other values and numbers are kept exactly
     * (integers stay integers, "\u0000" and non-ASCII survive). */
    expect_redelivered("{\"headers\":{\"redelivered\":false,\"retries\":3,\"x\":\"a\\u0000b\"},"
                       "\"properties\":{\"delivery_mode\":2,\"priority\":0.5,\"delivery_info\":"
                       "{\"redelivered\":false}},\"body\":\"\xc3\xa9\"}",
                       "{\"headers\":{\"redelivered\":true,\"retries\":3,\"x\":\"a\\u0000b\"},"
                       "\"properties\":{\"delivery_mode\":2,\"priority\":0.5,\"delivery_info\":"
                       "{\"redelivered\":true}},\"body\":\"\xc3\xa9\"}");
    /* No id needed, but the message shape is. */
    static const char *const bad[] = {
        "{\"body\":\"x\"}",
        "{\"headers\":[]}",
        "{\"headers\":{},\"properties\":[]}",
        "{\"headers\":{},\"properties\":{\"delivery_info\":\"x\"}}",
        "[{\"headers\":{}},\"\",\"celery\"]",
        /* An integer jansson cannot hold could not be written back unchanged. */
        "{\"headers\":{\"retries\":123456789012345678901234567890}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_no_redelivery(bad[i], strlen(bad[i]));
}

/* ---- hostile input ------------------------------------------------------------------------- */

static void test_truncated(void **state)
{
    (void)state;
    for (int g = 0; g < G_COUNT; g++) {
        if (g == G_RQ)
            continue;
        /* No prefix of a JSON object is one: every one of them is refused. */
        for (size_t len = 0; len < g_payloads[g].len; len++) {
            expect_no_job(g_payloads[g].buf, len);
            expect_no_redelivery(g_payloads[g].buf, len);
        }
    }
    /* A NULL pointer is no payload either. */
    struct resp_job j;
    assert_int_equal(resp_job_sidekiq(NULL, 0, &j), -1);
    assert_int_equal(resp_job_celery(NULL, 10, &j), -1);
    char *out;
    size_t outlen;
    assert_int_equal(resp_job_celery_redelivered(NULL, 10, &out, &outlen), -1);
    assert_int_equal(resp_job_rq_task(NULL, 10, &out), -1);
    assert_null(out);
}

static void test_not_objects(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "[]",
        "[{\"jid\":\"a\",\"class\":\"C\"}]",
        "\"x\"",
        "42",
        "null",
        "true",
        "",
        " ",
        "{",
        "}",
        "{}",
        "{\"jid\":\"a\",\"class\":\"C\"",
        "{\"jid\":\"a\",\"class\":\"C\",}",
        "{'jid':'a','class':'C'}",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        expect_no_job(docs[i], strlen(docs[i]));
        expect_no_redelivery(docs[i], strlen(docs[i]));
    }
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    struct resp_job j;
    /* Whitespace around the object is JSON; anything else after it is not. */
    assert_int_equal(SIDEKIQ(" \r\n{\"jid\":\"a\",\"class\":\"C\"}\n", &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    static const char *const bad[] = {
        "{\"jid\":\"a\",\"class\":\"C\"} x",
        "{\"jid\":\"a\",\"class\":\"C\"}{}",
        "{\"jid\":\"a\",\"class\":\"C\"},",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_no_job(bad[i], strlen(bad[i]));
    /* Trailing NUL bytes (a C string's terminator counted in len) are not whitespace. */
    static const char nul_after[] = "{\"jid\":\"a\",\"class\":\"C\"}";
    expect_no_job(nul_after, sizeof(nul_after));
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    /* Anywhere in the document, not only in the fields read: jansson refuses it whole. */
    static const char *const docs[] = {
        "{\"jid\":\"a\xff\",\"class\":\"C\"}",
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\xc3\"]}",
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\xc0\xaf\"]}",         /* overlong '/' */
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\xed\xa0\x80\"]}",     /* a surrogate */
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\xf4\x90\x80\x80\"]}", /* > U+10FFFF */
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\\ud800\"]}",          /* lone escape */
        "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"x\"]\x80}",
        "{\"headers\":{\"id\":\"h\"},\"body\":\"\xfe\"}",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        expect_no_job(docs[i], strlen(docs[i]));
        expect_no_redelivery(docs[i], strlen(docs[i]));
    }
    /* Valid multi-byte UTF-8 is kept as it is. */
    struct resp_job j;
    assert_int_equal(SIDEKIQ("{\"jid\":\"a\",\"class\":\"Caf\xc3\xa9\",\"queue\":\"\\u00e9\"}", &j),
                     0);
    expect_job(&j, "a", "Caf\xc3\xa9", "\xc3\xa9", NULL, false);
}

static void test_embedded_nul(void **state)
{
    (void)state;
    struct resp_job j;
    /* "\u0000" disqualifies the string it is in: required -> no job, optional -> absent. */
    NO_JOB("{\"jid\":\"a\\u0000b\",\"class\":\"C\"}");
    NO_JOB("{\"jid\":\"a\",\"class\":\"\\u0000\"}");
    assert_int_equal(SIDEKIQ("{\"jid\":\"a\",\"class\":\"C\",\"queue\":\"q\\u0000\"}", &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    assert_int_equal(CELERY("{\"headers\":{\"id\":\"h\",\"task\":\"t\\u0000\"},\"properties\":"
                            "{\"delivery_tag\":\"\\u0000\"}}",
                            &j),
                     0);
    expect_job(&j, "h", NULL, NULL, NULL, false);
    /* ...but not the rest of the document. */
    assert_int_equal(SIDEKIQ("{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\\u0000\"]}", &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    /* A raw NUL byte is a control character: invalid JSON, inside a string or out. */
    static const char raw_in[] = "{\"jid\":\"a\0b\",\"class\":\"C\"}";
    expect_no_job(raw_in, sizeof(raw_in) - 1);
    static const char raw_out[] = "{\"jid\":\"a\",\0\"class\":\"C\"}";
    expect_no_job(raw_out, sizeof(raw_out) - 1);
    /* A NUL in a key: jansson refuses the document. */
    NO_JOB("{\"jid\":\"a\",\"class\":\"C\",\"k\\u0000\":1}");
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    struct resp_job j;
    /* The last one wins, as in Ruby's and Python's JSON parsers that the workers use. */
    assert_int_equal(SIDEKIQ("{\"jid\":\"first\",\"class\":\"C\",\"jid\":\"second\"}", &j), 0);
    expect_job(&j, "second", "C", NULL, NULL, false);
    assert_int_equal(SIDEKIQ("{\"jid\":\"first\",\"class\":\"C\",\"jid\":2}", &j), -1);
}

static void test_big_numbers(void **state)
{
    (void)state;
    struct resp_job j;
    /* Ruby writes a Bignum argument as digits; the job is still read. */
    assert_int_equal(
        SIDEKIQ("{\"jid\":\"a\",\"class\":\"C\",\"args\":[123456789012345678901234567890,-1e300]}",
                &j),
        0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    assert_int_equal(
        CELERY("{\"headers\":{\"id\":\"h\",\"retries\":123456789012345678901234567890}}", &j), 0);
    expect_job(&j, "h", NULL, NULL, NULL, false);
    /* A real beyond double's range is not JSON jansson reads. */
    NO_JOB("{\"jid\":\"a\",\"class\":\"C\",\"args\":[1e400]}");
}

/* ---- limits -------------------------------------------------------------------------------- */

/* A Sidekiq job of exactly len bytes: the minimal job padded with spaces at the end. */
static uint8_t *padded_job(size_t len)
{
    static const char job[] = "{\"jid\":\"a\",\"class\":\"C\"}";
    uint8_t *b = malloc(len);
    assert_non_null(b);
    memset(b, ' ', len);
    memcpy(b, job, sizeof(job) - 1);
    return b;
}

static void test_limit_size(void **state)
{
    (void)state;
    struct resp_job j;
    char *out;
    size_t outlen;
    /* The length is checked before a byte is read: two bytes allocated, a huge len claimed.
     * Any read past them would be an ASan/valgrind error. */
    uint8_t *tiny = dup_exact("{}", 2);
    assert_int_equal(resp_job_sidekiq(tiny, RESP_JOB_MAX_JSON + 1u, &j), -1);
    assert_int_equal(resp_job_celery(tiny, SIZE_MAX, &j), -1);
    assert_int_equal(resp_job_celery_redelivered(tiny, RESP_JOB_MAX_JSON + 1u, &out, &outlen), -1);
    free(tiny);

    /* At the limit a job is read; one byte more and it is not. */
    uint8_t *b = padded_job(RESP_JOB_MAX_JSON + 1u);
    assert_int_equal(resp_job_sidekiq(b, RESP_JOB_MAX_JSON, &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    assert_int_equal(resp_job_sidekiq(b, RESP_JOB_MAX_JSON + 1u, &j), -1);
    assert_zeroed(&j);
    free(b);
}

/* {"jid":"a","class":"C","args":[[...[]...]]} nested `depth` levels deep in all (the outer
 * object is level 1, args level 2). */
static char *nested_job(size_t depth)
{
    static const char head[] = "{\"jid\":\"a\",\"class\":\"C\",\"args\":";
    size_t arrays = depth - 1;
    size_t len = sizeof(head) - 1 + 2 * arrays + 1;
    char *s = malloc(len + 1);
    assert_non_null(s);
    memcpy(s, head, sizeof(head) - 1);
    memset(s + sizeof(head) - 1, '[', arrays);
    memset(s + sizeof(head) - 1 + arrays, ']', arrays);
    s[len - 1] = '}';
    s[len] = '\0';
    return s;
}

static void test_limit_depth(void **state)
{
    (void)state;
    struct resp_job j;
    char *s = nested_job(RESP_JOB_MAX_DEPTH);
    assert_int_equal(SIDEKIQ(s, &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    free(s);

    static const size_t too_deep[] = {RESP_JOB_MAX_DEPTH + 1, 2049, 100000};
    for (size_t i = 0; i < sizeof(too_deep) / sizeof(too_deep[0]); i++) {
        s = nested_job(too_deep[i]);
        expect_no_job(s, strlen(s));
        expect_no_redelivery(s, strlen(s));
        free(s);
    }
    /* Brackets inside strings, escaped quotes included, are not nesting. */
    size_t n = 3 * RESP_JOB_MAX_DEPTH;
    static const char head[] = "{\"jid\":\"a\",\"class\":\"C\",\"args\":[\"\\\"";
    char *q = calloc(1, sizeof(head) + n + 8);
    assert_non_null(q);
    memcpy(q, head, sizeof(head) - 1);
    memset(q + sizeof(head) - 1, '[', n);
    strcat(q, "\\\\\"]}");
    assert_int_equal(SIDEKIQ(q, &j), 0);
    expect_job(&j, "a", "C", NULL, NULL, false);
    free(q);
}

/* ---- RQ ------------------------------------------------------------------------------------ */

static void expect_rq(const void *desc, size_t len, const char *want)
{
    char *task = (char *)&task;
    int rc = run_rq(desc, len, &task);
    if (want == NULL) {
        assert_int_equal(rc, -1);
        assert_null(task);
        return;
    }
    assert_int_equal(rc, 0);
    assert_string_equal(task, want);
    free(task);
}

static void test_rq_task(void **state)
{
    (void)state;
    const struct golden *g = &g_payloads[G_RQ];
    expect_rq(g->buf, g->len, "tasks.charge");

    static const char *const cases[][2] = {
        {"tasks.charge(42)", "tasks.charge"},
        {"tasks.charge(42, who='x')", "tasks.charge"},
        {"charge", "charge"},
        {"a.b.c()", "a.b.c"},
        {"<Charger>.run(1)", "<Charger>.run"},
        {"f(g(1))", "f"},
        {"(x)", NULL},
        {"(", NULL},
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_rq(cases[i][0], strlen(cases[i][0]), cases[i][1]);

    /* A NUL in the name cannot be returned; after the '(' it is only an argument. */
    expect_rq("ta\0sk(1)", 8, NULL);
    expect_rq("task(\0)", 7, "task");

    /* RESP_JOB_MAX_DESCRIPTION bytes are read, one more are not. */
    char *big = malloc(RESP_JOB_MAX_DESCRIPTION + 2);
    assert_non_null(big);
    memset(big, 'a', RESP_JOB_MAX_DESCRIPTION + 1);
    big[RESP_JOB_MAX_DESCRIPTION + 1] = '\0';
    expect_rq(big, RESP_JOB_MAX_DESCRIPTION + 1, NULL);
    big[RESP_JOB_MAX_DESCRIPTION] = '\0';
    expect_rq(big, RESP_JOB_MAX_DESCRIPTION, big);
    free(big);
}

static void test_clear(void **state)
{
    (void)state;
    struct resp_job j;
    memset(&j, 0, sizeof(j));
    resp_job_clear(&j);
    assert_int_equal(SIDEKIQ("{\"jid\":\"a\",\"class\":\"C\",\"queue\":\"q\"}", &j), 0);
    resp_job_clear(&j);
    assert_zeroed(&j);
    resp_job_clear(&j);
}

/* ---- mutations ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Bytes that change a JSON document's structure, half the time; any byte otherwise. */
static uint8_t mutant_byte(void)
{
    static const uint8_t special[] = "{}[]\":,\\0 t\x00\x80\xc3\xff";
    uint64_t r = rng();
    return (r & 1) ? special[(r >> 1) % (sizeof(special) - 1)] : (uint8_t)(r >> 8);
}

struct tally {
    size_t ok, refused;
};

/* One mutant through every reader: 0 or -1, a consistent result on 0, nothing on -1. */
static void check_mutant(const uint8_t *b, size_t len, struct tally t[3])
{
    struct resp_job j = dirty_job();
    int rc = resp_job_sidekiq(b, len, &j);
    assert_true(rc == 0 || rc == -1);
    if (rc == 0)
        assert_true(j.id != NULL && j.id[0] != '\0' && j.task != NULL && j.tag == NULL);
    else
        assert_zeroed(&j);
    rc == 0 ? t[0].ok++ : t[0].refused++;
    resp_job_clear(&j);

    j = dirty_job();
    rc = resp_job_celery(b, len, &j);
    assert_true(rc == 0 || rc == -1);
    if (rc == 0)
        assert_true(j.id != NULL && j.id[0] != '\0');
    else
        assert_zeroed(&j);
    rc == 0 ? t[1].ok++ : t[1].refused++;
    resp_job_clear(&j);

    char *out = NULL;
    size_t outlen = 0;
    rc = resp_job_celery_redelivered(b, len, &out, &outlen);
    assert_true(rc == 0 || rc == -1);
    if (rc == 0) {
        /* Whatever was restored reads back redelivered, when it has an id at all. */
        assert_int_equal(strlen(out), outlen);
        if (resp_job_celery(out, outlen, &j) == 0)
            assert_true(j.redelivered);
        resp_job_clear(&j);
    } else {
        assert_null(out);
    }
    rc == 0 ? t[2].ok++ : t[2].refused++;
    free(out);
}

static void test_mutations(void **state)
{
    (void)state;
    struct tally t[3] = {{0, 0}, {0, 0}, {0, 0}};
    size_t rq_ok = 0;
    for (int g = 0; g < G_COUNT; g++) {
        const struct golden *src = &g_payloads[g];
        uint8_t *b = dup_exact(src->buf, src->len);
        for (int k = 0; k < MUTATIONS; k++) {
            size_t pos = rng() % src->len;
            b[pos] = mutant_byte();
            if (g == G_RQ) {
                char *task = NULL;
                int rc = resp_job_rq_task(b, src->len, &task);
                assert_true((rc == 0 && task != NULL && strlen(task) > 0) ||
                            (rc == -1 && task == NULL));
                rq_ok += rc == 0;
                free(task);
            } else {
                check_mutant(b, src->len, t);
            }
            b[pos] = src->buf[pos];
        }
        free(b);
    }
    print_message("%d mutants of each payload: sidekiq %zu read / %zu refused, celery %zu / %zu, "
                  "redelivered %zu / %zu, rq %zu read\n",
                  MUTATIONS, t[0].ok, t[0].refused, t[1].ok, t[1].refused, t[2].ok, t[2].refused,
                  rq_ok);
    /* The run exercised both outcomes of every reader: one where nothing parses proves nothing. */
    for (int i = 0; i < 3; i++)
        assert_true(t[i].ok > MUTATIONS / 10 && t[i].refused > MUTATIONS / 10);
    assert_true(rq_ok > MUTATIONS / 10 && rq_ok < MUTATIONS);
}

/* ---- json_pick() itself ---- */

enum { P_A, P_B, P_AB, P_LIST0, P_LIST0X, N_P };

static const struct json_pick_path pick_paths[N_P] = {
    [P_A] = {1, {"a"}},
    [P_B] = {1, {"b"}},
    [P_AB] = {2, {"a", "b"}},
    [P_LIST0] = {2, {"list", NULL}},
    [P_LIST0X] = {3, {"list", NULL, "x"}},
};

/* json_pick() of the NUL-terminated doc (a heap copy of its length), and *v. */
static int pick(const char *doc, struct json_pick_value *v)
{
    size_t len = strlen(doc);
    uint8_t *b = dup_exact(doc, len);
    int rc = json_pick(b, len, JSON_PICK_MAX_DEPTH, pick_paths, N_P, v);
    free(b);
    return rc;
}

/* The string at path k of doc, decoded ("" marks a string holding NUL: json_pick_strdup() gives
 * NULL then), checked against want (NULL: no string there). */
static void assert_picked(const char *doc, int k, const char *want)
{
    struct json_pick_value v[N_P];
    assert_int_equal(pick(doc, v), 0);
    if (want == NULL) {
        assert_int_not_equal(v[k].type, JSON_PICK_STRING);
        return;
    }
    assert_int_equal(v[k].type, JSON_PICK_STRING);
    char *s = json_pick_strdup(doc, &v[k]);
    if (v[k].nul) {
        assert_null(s);
        assert_string_equal(want, "");
        return;
    }
    assert_non_null(s);
    assert_string_equal(s, want);
    free(s);
}

static void test_json_pick_paths(void **state)
{
    (void)state;
    struct json_pick_value v[N_P];
    assert_picked("{\"a\": \"x\", \"b\": \"y\"}", P_A, "x");
    assert_picked("{\"a\": {\"b\": \"deep\"}}", P_AB, "deep");
    assert_picked("{\"a\": {\"b\": \"deep\"}}", P_B, NULL); /* b under a is not top-level b */
    assert_picked("{\"list\": [\"first\", \"second\"]}", P_LIST0, "first");
    assert_picked("{\"list\": [{\"x\": \"one\"}, {\"x\": \"two\"}]}", P_LIST0X, "one");
    assert_picked("{\"list\": [[], {\"x\": \"two\"}]}", P_LIST0X, NULL); /* only element 0 */
    assert_picked("{\"list\": {\"x\": \"obj\"}}", P_LIST0X, NULL);       /* not an array */
    /* Escapes, in keys and values. */
    assert_picked("{\"\\u0061\": \"k\"}", P_A, "k");
    assert_picked("{\"a\": \"\\\"q\\\" \\\\ \\/ \\t\\u00e9\\ud83d\\ude00\"}", P_A,
                  "\"q\" \\ / \t\xc3\xa9\xf0\x9f\x98\x80");
    assert_picked("{\"a\": \"x\\u0000y\"}", P_A, ""); /* holds a NUL */
    /* The last of duplicate keys, its whole value: a later "a" forgets what the first held. */
    assert_picked("{\"a\": \"one\", \"a\": \"two\"}", P_A, "two");
    assert_picked("{\"a\": {\"b\": \"old\"}, \"a\": {\"c\": 1}}", P_AB, NULL);
    assert_picked("{\"a\": {\"b\": \"old\"}, \"a\": 7}", P_AB, NULL);
    assert_int_equal(pick("{\"a\": {\"b\": 1}, \"b\": [true, null]}", v), 0);
    assert_int_equal(v[P_A].type, JSON_PICK_OBJECT);
    assert_int_equal(v[P_AB].type, JSON_PICK_NUMBER);
    assert_int_equal(v[P_B].type, JSON_PICK_ARRAY);
    assert_int_equal(pick("{\"a\": true, \"b\": false}", v), 0);
    assert_int_equal(v[P_A].type, JSON_PICK_TRUE);
    assert_int_equal(v[P_B].type, JSON_PICK_FALSE);
    assert_int_equal(pick(" {} ", v), 0);
    assert_int_equal(v[P_A].type, JSON_PICK_ABSENT);
    /* Objects deeper than any path: their keys are read and compared with nothing. */
    assert_int_equal(pick("{\"a\":{\"b\":{\"c\":{\"d\":{\"a\":{\"b\":\"x\"}}}}}}", v), 0);
    assert_int_equal(v[P_AB].type, JSON_PICK_OBJECT);
}

/* What jansson refuses, json_pick() refuses; and what it reads, json_pick() reads. */
static void test_json_pick_grammar(void **state)
{
    (void)state;
    struct json_pick_value v[N_P];
    static const char *const ok[] = {
        "{\"n\": -0}",
        "{\"n\": 1.5e-3}",
        "{\"n\": 1E+2}",
        "{\"n\": 1e-400}",
        "{\"n\": 123456789012345678901234567890}",
        "{\"n\": 1e308}",
        "{\"s\": \"\x7f \xf4\x8f\xbf\xbf\"}",
        "\t\r\n{\"a\":[]}\n",
    };
    static const char *const bad[] = {
        "",
        "[]",
        "\"s\"",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":[1,]}",
        "{} {}",
        "{}x",
        "{\"n\": 01}",
        "{\"n\": 1.}",
        "{\"n\": .5}",
        "{\"n\": -}",
        "{\"n\": 1e}",
        "{\"n\": +1}",
        "{\"n\": 1e400}",
        "{\"n\": -1e309}",
        "{\"t\": tru}",
        "{\"t\": truex}",
        "{\"t\": True}",
        "{\"t\": nul}",
        "{\"s\": \"a\x01\"}",
        "{\"s\": \"\\x\"}",
        "{\"s\": \"\\u12\"}",
        "{\"s\": \"\\ud800\"}",
        "{\"s\": \"\\udc00\"}",
        "{\"s\": \"\\ud800\\u0041\"}",
        "{\"s\": \"\xc0\xaf\"}",
        "{\"s\": \"\xed\xa0\x80\"}",
        "{\"s\": \"\xf4\x90\x80\x80\"}",
        "{\"s\": \"\x80\"}",
        "{\"s\": \"\xe2\x82\"}",
        "{\"k\\u0000\": 1}",
        "{'a': 1}",
        "{\"a\" 1}",
        "{\"a\": 1 \"b\": 2}",
        "\xef\xbb\xbf{}",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (pick(ok[i], v) != 0)
            fail_msg("refused: %s", ok[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (pick(bad[i], v) != -1)
            fail_msg("read: %s", bad[i]);
    /* Around a double's largest value, written with and without a point and an exponent
     * (json_pick takes the point out before strtod(): the locale's point does not matter). */
    static const char *const near_max[] = {
        "{\"n\": 1.7976931348623157e308}",     "{\"n\": 17976931348623157e292}",
        "{\"n\": 0.00017976931348623157e312}", "{\"n\": 1e-99999999999999999999}",
        "{\"n\": 0e99999999999999999999}",     "{\"n\": 1.7976931348623159e308}",
        "{\"n\": 0.17976931348623159e309}",    "{\"n\": -1.8e308}",
    };
    for (size_t i = 0; i < sizeof(near_max) / sizeof(near_max[0]); i++)
        if (pick(near_max[i], v) != (i < 5 ? 0 : -1))
            fail_msg("%s: %s", i < 5 ? "refused" : "read", near_max[i]);
    char digits[16 + 310];
    for (size_t zeros = 308; zeros <= 309; zeros++) {
        /* 10^308 is a double; 10^309 is not. */
        int n = sprintf(digits, "{\"n\": 1");
        memset(digits + n, '0', zeros);
        strcpy(digits + n + zeros, "}");
        assert_int_equal(pick(digits, v), zeros == 308 ? 0 : -1);
    }
    /* A NUL byte that jansson's stream would lose (json_pick.h). */
    assert_int_equal(json_pick("{\"a\": 1\0}", 9, JSON_PICK_MAX_DEPTH, pick_paths, N_P, v), -1);
}

static void test_json_pick_depth(void **state)
{
    (void)state;
    struct json_pick_value v[N_P];
    char doc[2 * 130 + 16];
    for (size_t depth = 127; depth <= 129; depth++) {
        /* {"a":[[...[]...]]}: the object and depth - 1 arrays. */
        size_t n = 0;
        n += (size_t)sprintf(doc, "{\"a\":");
        for (size_t i = 1; i < depth; i++)
            doc[n++] = '[';
        for (size_t i = 1; i < depth; i++)
            doc[n++] = ']';
        doc[n++] = '}';
        doc[n] = '\0';
        assert_int_equal(json_pick(doc, n, 128, pick_paths, N_P, v), depth <= 128 ? 0 : -1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sidekiq_golden),
        cmocka_unit_test(test_sidekiq_work_state),
        cmocka_unit_test(test_sidekiq_activejob_task),
        cmocka_unit_test(test_sidekiq_fields),
        cmocka_unit_test(test_retries),
        cmocka_unit_test(test_celery_golden),
        cmocka_unit_test(test_celery_fields),
        cmocka_unit_test(test_redelivered_is_kombus_restore),
        cmocka_unit_test(test_redelivered_shapes),
        cmocka_unit_test(test_retagged),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_not_objects),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_embedded_nul),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_big_numbers),
        cmocka_unit_test(test_limit_size),
        cmocka_unit_test(test_limit_depth),
        cmocka_unit_test(test_rq_task),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_json_pick_paths),
        cmocka_unit_test(test_json_pick_grammar),
        cmocka_unit_test(test_json_pick_depth),
    };
    return cmocka_run_group_tests(tests, setup_golden, teardown_golden);
}
