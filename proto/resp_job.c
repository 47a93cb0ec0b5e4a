/*
 * resp_job.c - job identities in Sidekiq, Celery (kombu) and RQ payloads; see resp_job.h.
 *
 * A payload goes through resp_job_load(): the length guard, a byte scan that bounds the nesting
 * depth, then json_loadb() for a top-level object.  The readers then pick the fields they want
 * out of the tree as borrowed references and copy them into the struct resp_job in one place,
 * resp_job_fill(), so that a failure anywhere leaves nothing allocated.
 */
#include "proto/resp_job.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ActiveJob's Sidekiq adapters: Rails' own, and the one Sidekiq 7.3+ ships. */
static const char *const resp_job_aj_wrappers[] = {
    "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
    "Sidekiq::ActiveJob::Wrapper",
};

/* The deepest nesting of arrays and objects in p[0..len), brackets inside strings not counted,
 * or false as soon as it exceeds RESP_JOB_MAX_DEPTH.  For valid JSON the count is exact; for
 * any other bytes it is at least the depth jansson reaches before it finds the error. */
static bool resp_job_depth_ok(const uint8_t *p, size_t len)
{
    size_t depth = 0;
    bool in_string = false;

    for (size_t i = 0; i < len; i++) {
        uint8_t c = p[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > RESP_JOB_MAX_DEPTH)
                return false;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return true;
}

/* Parses json[0..len) as one JSON object (whitespace around it allowed).  Returns a new
 * reference, or NULL for anything else.  JSON_ALLOW_NUL: a "\u0000" in some string disqualifies
 * that string only (resp_job_str()), not the whole document. */
static json_t *resp_job_load(const void *json, size_t len, size_t flags)
{
    json_error_t err;

    if (json == NULL || len == 0 || len > RESP_JOB_MAX_JSON)
        return NULL;
    if (!resp_job_depth_ok(json, len))
        return NULL;
    json_t *root = json_loadb(json, len, flags | JSON_ALLOW_NUL, &err);
    if (root != NULL && !json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* The value of obj's key when it is a string without an embedded NUL, else NULL.  Borrowed:
 * valid while obj is.  obj may be NULL or not an object. */
static const char *resp_job_str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

/* As resp_job_str(), but an empty string counts as absent too. */
static const char *resp_job_str_nonempty(const json_t *obj, const char *key)
{
    const char *s = resp_job_str(obj, key);
    return s != NULL && s[0] != '\0' ? s : NULL;
}

/* *dst = a malloc'd copy of src, or NULL for a NULL src.  Returns false when malloc fails. */
static bool resp_job_dup(char **dst, const char *src)
{
    *dst = src == NULL ? NULL : strdup(src);
    return src == NULL || *dst != NULL;
}

/* Fills *j with copies of the borrowed strings.  Returns 0, or -1 with *j zeroed when an
 * allocation fails. */
static int resp_job_fill(struct resp_job *j, const char *id, const char *task, const char *queue,
                         const char *tag, bool redelivered)
{
    memset(j, 0, sizeof(*j));
    if (!resp_job_dup(&j->id, id) || !resp_job_dup(&j->task, task) ||
        !resp_job_dup(&j->queue, queue) || !resp_job_dup(&j->tag, tag)) {
        resp_job_clear(j);
        return -1;
    }
    j->redelivered = redelivered;
    return 0;
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

/* The job class a Sidekiq job runs: cls, or for an ActiveJob wrapper the wrapped class: its
 * "wrapped" string, as Sidekiq's JobRecord#display_class reads it, else the job_class of the
 * serialized job in args[0] (the same name, for jobs pushed without "wrapped"). */
static const char *resp_job_sidekiq_task(const json_t *root, const char *cls)
{
    bool wrapper = false;
    for (size_t i = 0; i < sizeof(resp_job_aj_wrappers) / sizeof(resp_job_aj_wrappers[0]); i++)
        wrapper = wrapper || strcmp(cls, resp_job_aj_wrappers[i]) == 0;
    if (!wrapper)
        return cls;
    const char *wrapped = resp_job_str_nonempty(root, "wrapped");
    if (wrapped == NULL)
        wrapped =
            resp_job_str_nonempty(json_array_get(json_object_get(root, "args"), 0), "job_class");
    return wrapped != NULL ? wrapped : cls;
}

int resp_job_sidekiq(const void *json, size_t len, struct resp_job *j)
{
    /* Ruby writes Bignum arguments as bare integers that jansson's json_int_t cannot hold;
     * reading every number as a real keeps such jobs readable (no number is used here). */
    json_t *root = resp_job_load(json, len, JSON_DECODE_INT_AS_REAL);
    int rc = -1;

    memset(j, 0, sizeof(*j));
    const char *jid = resp_job_str_nonempty(root, "jid");
    const char *cls = resp_job_str_nonempty(root, "class");
    if (jid != NULL && cls != NULL) {
        /* Sidekiq's JobRetry sets retry_count (0 at the first failure) when it re-files a job. */
        bool retried = json_object_get(root, "retry_count") != NULL;
        rc = resp_job_fill(j, jid, resp_job_sidekiq_task(root, cls), resp_job_str(root, "queue"),
                           NULL, retried);
    }
    json_decref(root);
    return rc;
}

/* ---- Celery (kombu) ---------------------------------------------------------------------- */

/* True when root is a kombu message: a "headers" or a "properties" object, and neither they
 * nor properties.delivery_info of another type. */
static bool resp_job_is_kombu(const json_t *root)
{
    const json_t *headers = json_object_get(root, "headers");
    const json_t *props = json_object_get(root, "properties");

    if (headers == NULL && props == NULL)
        return false;
    if ((headers != NULL && !json_is_object(headers)) || (props != NULL && !json_is_object(props)))
        return false;
    const json_t *info = json_object_get(props, "delivery_info");
    return info == NULL || json_is_object(info);
}

int resp_job_celery(const void *json, size_t len, struct resp_job *j)
{
    /* As for Sidekiq: numbers are not read, so a huge one must not hide the job. */
    json_t *root = resp_job_load(json, len, JSON_DECODE_INT_AS_REAL);
    int rc = -1;

    memset(j, 0, sizeof(*j));
    if (root != NULL && resp_job_is_kombu(root)) {
        const json_t *headers = json_object_get(root, "headers");
        const json_t *props = json_object_get(root, "properties");
        const json_t *info = json_object_get(props, "delivery_info");
        const char *id = resp_job_str_nonempty(headers, "id");
        if (id == NULL)
            id = resp_job_str_nonempty(props, "correlation_id");
        bool redelivered = json_is_true(json_object_get(headers, "redelivered")) ||
                           json_is_true(json_object_get(info, "redelivered"));
        if (id != NULL)
            rc = resp_job_fill(j, id, resp_job_str(headers, "task"),
                               resp_job_str(info, "routing_key"),
                               resp_job_str(props, "delivery_tag"), redelivered);
    }
    json_decref(root);
    return rc;
}

/* obj[key], created as an empty object when absent.  Borrowed; NULL when allocation fails.
 * The caller has checked that a present value is an object (resp_job_is_kombu()). */
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

int resp_job_celery_redelivered(const void *json, size_t len, char **out, size_t *outlen)
{
    /* Integers stay integers here (delivery_mode 2 must not come back as 2.0), so one that does
     * not fit in json_int_t fails the parse rather than being rewritten. */
    json_t *root = resp_job_load(json, len, 0);
    int rc = -1;

    *out = NULL;
    *outlen = 0;
    if (root != NULL && resp_job_is_kombu(root) && resp_job_mark_redelivered(root) == 0)
        rc = resp_job_dump(root, out, outlen);
    json_decref(root);
    return rc;
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
