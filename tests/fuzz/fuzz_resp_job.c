/*
 * fuzz_resp_job.c - libFuzzer harness for the job payload readers (proto/resp_job.c): Sidekiq's
 * job JSON, Celery's kombu message, RQ's job description, and the kombu message Celery's
 * visibility-timeout restore pushes back.  Not part of the default build (scripts/fuzz.sh
 * builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. proto/resp_job.c tests/fuzz/fuzz_resp_job.c \
 *         -ljansson -o fuzz_resp_job
 *
 * Seeds are job payloads as they sit in Redis (tests/fuzz/corpus/resp_job/, from
 * tests/unit/data/jobs/).  The whole input goes through every reader, copied into a buffer of
 * exactly its size so that a read past `len` is caught.  Invariants are checked with abort():
 * a job that is read has a non-empty id and NUL-free strings, a failed read leaves nothing
 * behind, the RQ task is the bytes before the first '(', and the redelivered message is a
 * kombu message again, carries the same job marked redelivered, and is a fixed point.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/resp_job.h"

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

static void fuzz_sidekiq(const uint8_t *p, size_t len)
{
    struct resp_job j;
    int rc = resp_job_sidekiq(p, len, &j);
    check_job(rc, &j);
    CHECK(rc < 0 || (j.task != NULL && j.task[0] != '\0' && j.tag == NULL));
    resp_job_clear(&j);
    resp_job_clear(&j);
    CHECK(job_is_zero(&j));
}

/* The restored message must read as the same job, now redelivered, and restoring it again
 * must change nothing. */
static void fuzz_celery_redelivered(const uint8_t *p, size_t len, int rc, const struct resp_job *j)
{
    char *out = (char *)p; /* must be overwritten */
    size_t outlen = 1;
    int rrc = resp_job_celery_redelivered(p, len, &out, &outlen);
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
              same_str(again.queue, j->queue) && same_str(again.tag, j->tag) && again.redelivered);
    resp_job_clear(&again);
    char *out2 = NULL;
    size_t outlen2 = 0;
    CHECK(resp_job_celery_redelivered(out, outlen, &out2, &outlen2) == 0);
    CHECK(outlen2 == outlen && memcmp(out2, out, outlen) == 0);
    free(out2);
    free(out);
}

static void fuzz_celery(const uint8_t *p, size_t len)
{
    struct resp_job j;
    int rc = resp_job_celery(p, len, &j);
    check_job(rc, &j);
    fuzz_celery_redelivered(p, len, rc, &j);
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
    fuzz_celery(p, size);
    fuzz_rq(p, size);
    free(p);
    return 0;
}
