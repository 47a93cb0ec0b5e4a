/*
 * resp_job.c - job identities in Sidekiq, Celery (kombu) and RQ payloads; see resp_job.h.
 *
 * The readers take the few values they want with json_pick() (proto/base/json_pick.h), which checks
 * the document as jansson would and notes where the values are, without building it; only the
 * strings that make the struct resp_job are copied out.  The kombu rewrite (redelivered) needs
 * the whole tree: json_pick() checks the message first, then jansson builds it.
 */
#include "proto/resp/resp_job.h"

#include "proto/base/json_pick.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ActiveJob's Sidekiq adapters: Rails' own, and the one Sidekiq 7.3+ ships. */
static const char *const resp_job_aj_wrappers[] = {
    "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
    "Sidekiq::ActiveJob::Wrapper",
};

/* A picked string (json_pick_strdup()): NULL when absent, not a string or holding a NUL, and
 * for nonempty also when empty; *oom set when the copy could not be made. */
static char *resp_job_take(const void *json, const struct json_pick_value *v, bool nonempty,
                           bool *oom)
{
    if (v->type != JSON_PICK_STRING || v->nul || (nonempty && v->len == 0))
        return NULL;
    char *s = json_pick_strdup(json, v);
    if (s == NULL)
        *oom = true;
    return s;
}

/* A count the framework writes as a JSON number: a non-negative whole number, saturated at
 * RESP_JOB_MAX_RETRIES; 0 for anything else (absent, negative, a fraction, another type). */
static unsigned resp_job_count(const void *json, const struct json_pick_value *v)
{
    if (v->type != JSON_PICK_NUMBER)
        return 0;
    const unsigned char *p = (const unsigned char *)json + v->off;
    unsigned long long n = 0;
    for (size_t i = 0; i < v->len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0; /* a sign, a fraction or an exponent */
        n = n * 10 + (p[i] - '0');
        if (n > RESP_JOB_MAX_RETRIES)
            n = RESP_JOB_MAX_RETRIES + 1ull; /* stays above the cap: saturated below */
    }
    return n > RESP_JOB_MAX_RETRIES ? RESP_JOB_MAX_RETRIES : (unsigned)n;
}

/* The length guard and the pick (json_pick()) every reader starts with. */
static int resp_job_pick(const void *json, size_t len, const struct json_pick_path *paths, size_t n,
                         struct json_pick_value *out)
{
    if (json == NULL || len == 0 || len > RESP_JOB_MAX_JSON)
        return -1;
    return json_pick(json, len, RESP_JOB_MAX_DEPTH, paths, n, out);
}

void resp_job_clear(struct resp_job *j)
{
    if (j == NULL)
        return;
    free(j->id);
    free(j->task);
    free(j->queue);
    free(j->tag);
    memset(j, 0, sizeof(*j));
}

/* ---- Sidekiq ----------------------------------------------------------------------------- */

enum { SK_JID, SK_CLASS, SK_QUEUE, SK_RETRY_COUNT, SK_WRAPPED, SK_AJ_CLASS, SK_PATHS };

static const struct json_pick_path resp_job_sidekiq_paths[SK_PATHS] = {
    [SK_JID] = {1, {"jid"}},
    [SK_CLASS] = {1, {"class"}},
    [SK_QUEUE] = {1, {"queue"}},
    /* Sidekiq's JobRetry sets retry_count (0 at the first failure) when it re-files a job. */
    [SK_RETRY_COUNT] = {1, {"retry_count"}},
    [SK_WRAPPED] = {1, {"wrapped"}},
    /* The job_class of the serialized ActiveJob in the first argument. */
    [SK_AJ_CLASS] = {3, {"args", NULL, "job_class"}},
};

/* Whether cls is one of ActiveJob's wrappers, whose task is the wrapped class: its "wrapped"
 * string, as Sidekiq's JobRecord#display_class reads it, else args[0].job_class (the same name,
 * for jobs pushed without "wrapped"). */
static bool resp_job_aj_wrapper(const char *cls)
{
    for (size_t i = 0; i < sizeof(resp_job_aj_wrappers) / sizeof(resp_job_aj_wrappers[0]); i++)
        if (strcmp(cls, resp_job_aj_wrappers[i]) == 0)
            return true;
    return false;
}

int resp_job_sidekiq(const void *json, size_t len, struct resp_job *j)
{
    /* Numbers are not converted (retry_count only as digits): Ruby's Bignum arguments, bare
     * integers past 64 bits, are fine. */
    struct json_pick_value v[SK_PATHS];
    bool oom = false;

    memset(j, 0, sizeof(*j));
    if (resp_job_pick(json, len, resp_job_sidekiq_paths, SK_PATHS, v) != 0 ||
        v[SK_JID].type != JSON_PICK_STRING || v[SK_CLASS].type != JSON_PICK_STRING)
        return -1;
    j->id = resp_job_take(json, &v[SK_JID], true, &oom);
    j->task = resp_job_take(json, &v[SK_CLASS], true, &oom);
    if (j->id != NULL && j->task != NULL && resp_job_aj_wrapper(j->task)) {
        char *wrapped = resp_job_take(json, &v[SK_WRAPPED], true, &oom);
        if (wrapped == NULL)
            wrapped = resp_job_take(json, &v[SK_AJ_CLASS], true, &oom);
        if (wrapped != NULL) {
            free(j->task);
            j->task = wrapped;
        }
    }
    j->queue = resp_job_take(json, &v[SK_QUEUE], false, &oom);
    j->redelivered = v[SK_RETRY_COUNT].type != JSON_PICK_ABSENT;
    if (j->redelivered) {
        unsigned n = resp_job_count(json, &v[SK_RETRY_COUNT]);
        j->retries = n < RESP_JOB_MAX_RETRIES ? n + 1 : n;
    }
    if (oom || j->id == NULL || j->task == NULL) {
        resp_job_clear(j);
        return -1;
    }
    return 0;
}

/* Sidekiq's work state: the job in progress under "payload", its start under "run_at". */
enum { SW_PAYLOAD, SW_RUN_AT, SW_PATHS };

static const struct json_pick_path resp_job_sidekiq_work_paths[SW_PATHS] = {
    [SW_PAYLOAD] = {1, {"payload"}},
    [SW_RUN_AT] = {1, {"run_at"}},
};

/* The end of the second (or millisecond) a JSON number names since the epoch, in microseconds:
 * a time no earlier than the one it was cut from.  Seconds, or milliseconds for a number past
 * 10^11 (Sidekiq 8 writes milliseconds where 6 and 7 wrote seconds); 0 when it is not a plain
 * non-negative number. */
static uint64_t resp_job_epoch_end_us(const char *p, size_t n)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        if (v > UINT64_MAX / 10 / 1000000u)
            return 0;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (i == 0)
        return 0;
    return v > 100000000000ull ? (v + 1) * 1000u : (v + 1) * 1000000u;
}

int resp_job_sidekiq_work(const void *json, size_t len, struct resp_job *j, uint64_t *started_by_us)
{
    struct json_pick_value v[SW_PATHS];
    memset(j, 0, sizeof(*j));
    *started_by_us = 0;
    if (resp_job_pick(json, len, resp_job_sidekiq_work_paths, SW_PATHS, v) != 0)
        return -1;
    int rc = -1;
    if (v[SW_PAYLOAD].type == JSON_PICK_STRING) {
        char *payload = json_pick_strdup(json, &v[SW_PAYLOAD]);
        if (payload != NULL)
            rc = resp_job_sidekiq(payload, strlen(payload), j);
        free(payload);
    }
    if (rc == 0 && v[SW_RUN_AT].type == JSON_PICK_NUMBER)
        *started_by_us =
            resp_job_epoch_end_us((const char *)json + v[SW_RUN_AT].off, v[SW_RUN_AT].len);
    return rc;
}

/* ---- Celery (kombu) ---------------------------------------------------------------------- */

enum {
    CE_HEADERS,
    CE_PROPS,
    CE_ID,
    CE_TASK,
    CE_H_REDELIVERED,
    CE_CORRELATION_ID,
    CE_TAG,
    CE_INFO,
    CE_ROUTING_KEY,
    CE_I_REDELIVERED,
    CE_RETRIES,
    CE_PATHS
};

static const struct json_pick_path resp_job_celery_paths[CE_PATHS] = {
    [CE_HEADERS] = {1, {"headers"}},
    [CE_PROPS] = {1, {"properties"}},
    [CE_ID] = {2, {"headers", "id"}},
    [CE_TASK] = {2, {"headers", "task"}},
    [CE_H_REDELIVERED] = {2, {"headers", "redelivered"}},
    [CE_CORRELATION_ID] = {2, {"properties", "correlation_id"}},
    [CE_TAG] = {2, {"properties", "delivery_tag"}},
    [CE_INFO] = {2, {"properties", "delivery_info"}},
    [CE_ROUTING_KEY] = {3, {"properties", "delivery_info", "routing_key"}},
    [CE_I_REDELIVERED] = {3, {"properties", "delivery_info", "redelivered"}},
    /* Celery's count of a task's retries (celery/app/amqp.py, as_task_v2). */
    [CE_RETRIES] = {2, {"headers", "retries"}},
};

/* A kombu message: a "headers" or a "properties" object, and neither they nor
 * properties.delivery_info of another type. */
static bool resp_job_picked_kombu(const struct json_pick_value *v)
{
    uint8_t h = v[CE_HEADERS].type, p = v[CE_PROPS].type, i = v[CE_INFO].type;
    if (h == JSON_PICK_ABSENT && p == JSON_PICK_ABSENT)
        return false;
    return (h == JSON_PICK_ABSENT || h == JSON_PICK_OBJECT) &&
           (p == JSON_PICK_ABSENT || p == JSON_PICK_OBJECT) &&
           (i == JSON_PICK_ABSENT || i == JSON_PICK_OBJECT);
}

int resp_job_celery(const void *json, size_t len, struct resp_job *j)
{
    /* As for Sidekiq: numbers are not converted, so a huge one must not hide the job. */
    struct json_pick_value v[CE_PATHS];
    bool oom = false;

    memset(j, 0, sizeof(*j));
    if (resp_job_pick(json, len, resp_job_celery_paths, CE_PATHS, v) != 0 ||
        !resp_job_picked_kombu(v))
        return -1;
    j->id = resp_job_take(json, &v[CE_ID], true, &oom);
    if (j->id == NULL && !oom)
        j->id = resp_job_take(json, &v[CE_CORRELATION_ID], true, &oom);
    if (j->id == NULL) {
        resp_job_clear(j);
        return -1;
    }
    j->task = resp_job_take(json, &v[CE_TASK], false, &oom);
    j->queue = resp_job_take(json, &v[CE_ROUTING_KEY], false, &oom);
    j->tag = resp_job_take(json, &v[CE_TAG], false, &oom);
    j->redelivered =
        v[CE_H_REDELIVERED].type == JSON_PICK_TRUE || v[CE_I_REDELIVERED].type == JSON_PICK_TRUE;
    j->retries = resp_job_count(json, &v[CE_RETRIES]);
    if (oom) {
        resp_job_clear(j);
        return -1;
    }
    return 0;
}

/* obj[key], created as an empty object when absent.  Borrowed; NULL when allocation fails.
 * The caller has checked that a present value is an object (resp_job_picked_kombu()). */
static json_t *resp_job_object_at(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v != NULL)
        return v;
    v = json_object();
    if (json_object_set_new(obj, key, v) < 0)
        return NULL; /* json_object_set_new() released v */
    return v;
}

/* Sets headers.redelivered and properties.delivery_info.redelivered of a kombu message to true.
 * Returns 0, or -1 when allocation fails. */
static int resp_job_mark_redelivered(json_t *root)
{
    json_t *headers = resp_job_object_at(root, "headers");
    json_t *props = resp_job_object_at(root, "properties");
    json_t *info = props == NULL ? NULL : resp_job_object_at(props, "delivery_info");

    if (headers == NULL || info == NULL)
        return -1;
    if (json_object_set_new(headers, "redelivered", json_true()) < 0 ||
        json_object_set_new(info, "redelivered", json_true()) < 0)
        return -1;
    return 0;
}

/* root as compact JSON in a malloc'd, NUL-terminated buffer.  Returns 0, or -1. */
static int resp_job_dump(const json_t *root, char **out, size_t *outlen)
{
    size_t need = json_dumpb(root, NULL, 0, JSON_COMPACT);
    if (need == 0)
        return -1;
    char *buf = malloc(need + 1);
    if (buf == NULL)
        return -1;
    if (json_dumpb(root, buf, need, JSON_COMPACT) != need) {
        free(buf);
        return -1;
    }
    buf[need] = '\0';
    *out = buf;
    *outlen = need;
    return 0;
}

/* Sets properties.delivery_tag of a kombu message to tag.  Returns 0, or -1 when allocation
 * fails. */
static int resp_job_set_tag(json_t *root, const char *tag)
{
    json_t *props = resp_job_object_at(root, "properties");
    return props != NULL && json_object_set_new(props, "delivery_tag", json_string(tag)) == 0 ? 0
                                                                                              : -1;
}

/* The kombu message in json[0..len) parsed, marked redelivered (tag NULL) or given tag, and
 * dumped. */
static int resp_job_celery_rewrite(const void *json, size_t len, const char *tag, char **out,
                                   size_t *outlen)
{
    /* Integers stay integers here (delivery_mode 2 must not come back as 2.0), so one that does
     * not fit in json_int_t fails the parse rather than being rewritten. */
    struct json_pick_value v[CE_PATHS];
    *out = NULL;
    *outlen = 0;
    /* What resp_job_celery() refuses is not rewritten either (json_pick() is stricter than
     * jansson in one place: a NUL byte after a number or a literal). */
    if (resp_job_pick(json, len, resp_job_celery_paths, CE_PATHS, v) != 0 ||
        !resp_job_picked_kombu(v))
        return -1;
    /* json_pick() has checked the length, the depth (jansson's recursion stays shallow), that
     * the top level is an object and that it is a kombu message; jansson reads what json_pick()
     * reads (fuzz_resp_job), so the tree has that shape. */
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &err);
    int rc = -1;

    if (root != NULL &&
        (tag != NULL ? resp_job_set_tag(root, tag) : resp_job_mark_redelivered(root)) == 0)
        rc = resp_job_dump(root, out, outlen);
    json_decref(root);
    return rc;
}

int resp_job_celery_redelivered(const void *json, size_t len, char **out, size_t *outlen)
{
    return resp_job_celery_rewrite(json, len, NULL, out, outlen);
}

int resp_job_celery_retagged(const void *json, size_t len, const char *tag, char **out,
                             size_t *outlen)
{
    if (tag == NULL) { /* an invalid one: json_string() refuses it */
        *out = NULL;
        *outlen = 0;
        return -1;
    }
    return resp_job_celery_rewrite(json, len, tag, out, outlen);
}

/* ---- RQ ---------------------------------------------------------------------------------- */

int resp_job_rq_task(const void *description, size_t len, char **task)
{
    *task = NULL;
    if (description == NULL || len == 0 || len > RESP_JOB_MAX_DESCRIPTION)
        return -1;
    /* RQ's Job.get_call_string(): "<func_name>(<args>)"; a custom description may lack "(". */
    const char *open = memchr(description, '(', len);
    size_t n = open == NULL ? len : (size_t)(open - (const char *)description);
    if (n == 0 || memchr(description, '\0', n) != NULL)
        return -1;
    *task = strndup(description, n);
    return *task != NULL ? 0 : -1;
}
