/*
 * fuzz_resp_job.c - libFuzzer harness for the job payload readers (proto/resp/resp_job.c): Sidekiq's
 * job JSON, Celery's kombu message, RQ's job description, and the kombu message Celery's
 * visibility-timeout restore pushes back.  Not part of the default build (scripts/fuzz.sh
 * builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. proto/resp/resp_job.c proto/base/json_pick.c \
 *         tests/fuzz/fuzz_resp_job.c -ljansson -o fuzz_resp_job
 *
 * Seeds are job payloads as they sit in Redis (tests/fuzz/corpus/resp_job/, from
 * tests/unit/data/jobs/).  The whole input goes through every reader, copied into a buffer of
 * exactly its size so that a read past `len` is caught.  Invariants are checked with abort():
 * a job that is read has a non-empty id and NUL-free strings, a failed read leaves nothing
 * behind, the RQ task is the bytes before the first '(', and the redelivered message is a
 * kombu message again, carries the same job marked redelivered, and is a fixed point.
 *
 * The Sidekiq and Celery readers take their fields with json_pick() (proto/base/json_pick.h), which
 * replaced jansson there: every input is also read by the jansson readers they replaced (below,
 * oracle_*), and both must answer the same job or refuse it alike.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto/resp/resp_job.h"

/* Failed invariants name themselves: the reproducer's log says which one. */
#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

static bool same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static bool job_is_zero(const struct resp_job *j)
{
    return j->id == NULL && j->task == NULL && j->queue == NULL && j->tag == NULL &&
           !j->redelivered;
}

static void check_job(int rc, const struct resp_job *j)
{
    CHECK(rc == 0 || rc == -1);
    if (rc < 0) {
        CHECK(job_is_zero(j));
        return;
    }
    CHECK(j->id != NULL && j->id[0] != '\0');
}

/* ---- the jansson readers json_pick() replaced: the oracle ---- */

static json_t *oracle_load(const void *json, size_t len)
{
    if (len == 0 || len > RESP_JOB_MAX_JSON)
        return NULL;
    /* resp_job.c's depth scan: brackets outside strings, RESP_JOB_MAX_DEPTH at most. */
    const uint8_t *p = json;
    size_t depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        if (in_string) {
            if (p[i] == '\\')
                i++;
            else if (p[i] == '"')
                in_string = false;
        } else if (p[i] == '"') {
            in_string = true;
        } else if (p[i] == '[' || p[i] == '{') {
            if (++depth > RESP_JOB_MAX_DEPTH)
                return NULL;
        } else if ((p[i] == ']' || p[i] == '}') && depth > 0) {
            depth--;
        }
    }
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &err);
    if (root != NULL && !json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static const char *oracle_str(const json_t *obj, const char *key, bool nonempty)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return NULL;
    const char *s = json_string_value(v);
    if (strlen(s) != json_string_length(v) || (nonempty && s[0] == '\0'))
        return NULL;
    return s;
}

/* jansson's one known leniency: a NUL byte right after a number or a literal (true, false,
 * null) is lost by its stream's unget, and the document reads as if it were not there.
 * json_pick() refuses it.  When the reader refused what jansson read, the input without the
 * NUL bytes that follow a letter or a digit (outside strings, only a number or a literal ends
 * so) is read again: that reading must be jansson's.  *rc and *j become that reading's (true
 * then: the caller frees *j; *j was zeroed by the refusal before). */
typedef int (*job_reader)(const void *, size_t, struct resp_job *);

static bool nul_quirk(job_reader read, const uint8_t *p, size_t len, int orc, int *rc,
                      struct resp_job *j)
{
    if (*rc != -1 || orc != 0 || memchr(p, 0, len) == NULL)
        return false;
    uint8_t *q = malloc(len);
    if (q == NULL)
        abort();
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        bool after_alnum = i > 0 && ((p[i - 1] >= '0' && p[i - 1] <= '9') ||
                                     (p[i - 1] >= 'a' && p[i - 1] <= 'z') ||
                                     (p[i - 1] >= 'A' && p[i - 1] <= 'Z'));
        if (p[i] != 0 || !after_alnum)
            q[n++] = p[i];
    }
    *rc = read(q, n, j);
    free(q);
    return true;
}

static bool same_job(int rc, const struct resp_job *j, int orc, const char *id, const char *task,
                     const char *queue, const char *tag, bool redelivered)
{
    if (rc != orc)
        return false;
    return rc != 0 || (same_str(j->id, id) && same_str(j->task, task) &&
                       same_str(j->queue, queue) && same_str(j->tag, tag) &&
                       j->redelivered == redelivered);
}

static void oracle_sidekiq(const uint8_t *p, size_t len, int rc, const struct resp_job *j)
{
    json_t *root = oracle_load(p, len);
    const char *jid = oracle_str(root, "jid", true), *cls = oracle_str(root, "class", true);
    const char *task = cls;
    if (cls != NULL && (strcmp(cls, "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper") == 0 ||
                        strcmp(cls, "Sidekiq::ActiveJob::Wrapper") == 0)) {
        const char *w = oracle_str(root, "wrapped", true);
        if (w == NULL)
            w = oracle_str(json_array_get(json_object_get(root, "args"), 0), "job_class", true);
        if (w != NULL)
            task = w;
    }
    int orc = jid != NULL && cls != NULL ? 0 : -1;
    struct resp_job alt = *j;
    bool reread = nul_quirk(resp_job_sidekiq, p, len, orc, &rc, &alt);
    CHECK(same_job(rc, &alt, orc, jid, task, oracle_str(root, "queue", false), NULL,
                   json_object_get(root, "retry_count") != NULL));
    if (reread)
        resp_job_clear(&alt);
    json_decref(root);
}

static void oracle_celery(const uint8_t *p, size_t len, int rc, const struct resp_job *j)
{
    json_t *root = oracle_load(p, len);
    const json_t *h = json_object_get(root, "headers"), *pr = json_object_get(root, "properties");
    const json_t *info = json_object_get(pr, "delivery_info");
    bool kombu = root != NULL && (h != NULL || pr != NULL) && (h == NULL || json_is_object(h)) &&
                 (pr == NULL || json_is_object(pr)) && (info == NULL || json_is_object(info));
    const char *id = NULL;
    if (kombu) {
        id = oracle_str(h, "id", true);
        if (id == NULL)
            id = oracle_str(pr, "correlation_id", true);
    }
    bool redelivered = json_is_true(json_object_get(h, "redelivered")) ||
                       json_is_true(json_object_get(info, "redelivered"));
    int orc = id != NULL ? 0 : -1;
    struct resp_job alt = *j;
    bool reread = nul_quirk(resp_job_celery, p, len, orc, &rc, &alt);
    CHECK(same_job(rc, &alt, orc, id, oracle_str(h, "task", false),
                   oracle_str(info, "routing_key", false), oracle_str(pr, "delivery_tag", false),
                   redelivered));
    if (reread)
        resp_job_clear(&alt);
    json_decref(root);
}

static void fuzz_sidekiq(const uint8_t *p, size_t len)
{
    struct resp_job j;
    int rc = resp_job_sidekiq(p, len, &j);
    check_job(rc, &j);
    oracle_sidekiq(p, len, rc, &j);
    CHECK(rc < 0 || (j.task != NULL && j.task[0] != '\0' && j.tag == NULL));
    resp_job_clear(&j);
    resp_job_clear(&j);
    CHECK(job_is_zero(&j));
}

/* Sidekiq's work state: a job read from it is a Sidekiq job (the same invariants), and a start
 * time is a whole second or millisecond end. */
static void fuzz_sidekiq_work(const uint8_t *p, size_t len)
{
    struct resp_job j;
    uint64_t by = 7;
    int rc = resp_job_sidekiq_work(p, len, &j, &by);
    check_job(rc, &j);
    CHECK(rc == 0 || (by == 0 && job_is_zero(&j)));
    CHECK(by % 1000u == 0);
    resp_job_clear(&j);
}

/* A kombu rewrite of p (tag NULL: redelivered, else retagged with tag) must read as the same
 * job j (rc: how p read), redelivered or with the new tag; a redelivered one restored again
 * must not change. */
static void fuzz_celery_rewrite(const uint8_t *p, size_t len, int rc, const struct resp_job *j,
                                const char *tag)
{
    char *out = (char *)p; /* must be overwritten */
    size_t outlen = 1;
    int rrc = tag == NULL ? resp_job_celery_redelivered(p, len, &out, &outlen)
                          : resp_job_celery_retagged(p, len, tag, &out, &outlen);
    CHECK(rrc == 0 || rrc == -1);
    if (rrc < 0) {
        CHECK(out == NULL && outlen == 0);
        return;
    }
    CHECK(out != NULL && outlen > 0 && out[outlen] == '\0');
    struct resp_job again;
    int arc = resp_job_celery(out, outlen, &again);
    check_job(arc, &again);
    CHECK(arc == rc);
    if (rc == 0)
        CHECK(same_str(again.id, j->id) && same_str(again.task, j->task) &&
              same_str(again.queue, j->queue) &&
              (tag == NULL ? same_str(again.tag, j->tag) && again.redelivered
                           : same_str(again.tag, tag)));
    resp_job_clear(&again);
    if (tag == NULL) {
        char *out2 = NULL;
        size_t outlen2 = 0;
        CHECK(resp_job_celery_redelivered(out, outlen, &out2, &outlen2) == 0);
        CHECK(outlen2 == outlen && memcmp(out2, out, outlen) == 0);
        free(out2);
    }
    free(out);
}

static void fuzz_celery(const uint8_t *p, size_t len)
{
    struct resp_job j;
    int rc = resp_job_celery(p, len, &j);
    check_job(rc, &j);
    oracle_celery(p, len, rc, &j);
    fuzz_celery_rewrite(p, len, rc, &j, NULL);
    fuzz_celery_rewrite(p, len, rc, &j, "0b8e9c6e-tag");
    resp_job_clear(&j);
}

static void fuzz_rq(const uint8_t *p, size_t len)
{
    char *task = (char *)p; /* must be overwritten */
    int rc = resp_job_rq_task(p, len, &task);
    CHECK(rc == 0 || rc == -1);
    if (rc < 0) {
        CHECK(task == NULL);
        return;
    }
    const uint8_t *open = memchr(p, '(', len);
    size_t n = open == NULL ? len : (size_t)(open - p);
    CHECK(n > 0 && strlen(task) == n && memcmp(task, p, n) == 0);
    free(task);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy: libFuzzer's own buffer may have slack after `size`. */
    uint8_t *p = malloc(size == 0 ? 1 : size);
    if (p == NULL)
        return 0;
    memcpy(p, data, size);
    fuzz_sidekiq(p, size);
    fuzz_sidekiq_work(p, size);
    fuzz_celery(p, size);
    fuzz_rq(p, size);
    free(p);
    return 0;
}
