/*
 * resp_job.h - job identities in the payloads of the Redis job frameworks: Sidekiq's job JSON,
 * Celery's kombu message JSON (kombu/transport/virtual/base.py, transport/redis.py) and RQ's job
 * description (rq/job.py, get_call_string).
 *
 * The RESP codec (resp.h) finds the bytes of an LPUSH argument or a BRPOP reply element; these
 * functions say which job they carry, so that a rule can name a job by id, task or queue, and
 * build the message Celery's visibility-timeout restore would push back.  Pure C over byte
 * spans, JSON read with json_pick.h (and the kombu rewrite made with jansson): no sockets, no
 * libevent, no logging.
 *
 * Every function takes arbitrary bytes (not NUL-terminated, invalid UTF-8, truncated, huge,
 * deeply nested, fields of the wrong type) and answers 0 or -1; nothing is leaked on either.
 * A payload longer than RESP_JOB_MAX_JSON, or nested deeper than RESP_JOB_MAX_DEPTH, is refused.
 * Only a JSON object is a job; invalid UTF-8 or a lone surrogate anywhere in it makes it
 * unreadable as a whole (as jansson rejects the document), whereas an embedded "\u0000" only
 * disqualifies the string it is in.
 *
 * Ownership: the strings in struct resp_job and the buffers returned through char ** are
 * malloc'd and belong to the caller; resp_job_clear() frees a struct resp_job.
 */
#ifndef TWICE_RESP_JOB_H
#define TWICE_RESP_JOB_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits ------------------------------------------------------------------------------ */

/* Longest JSON payload read; longer ones are refused without a byte being read.  Sidekiq and
 * kombu put no limit of their own, but a job this size is not a job a proxy should parse. */
#define RESP_JOB_MAX_JSON (16u * 1024u * 1024u)
/* Arrays and objects open at once, the top-level object being 1: json_pick()'s max_depth,
 * checked for the kombu rewrite too before jansson parses, so that jansson's recursion (its own
 * limit is 2048) stays shallow.  A Sidekiq ActiveJob wrapper uses 4 levels before the
 * application's arguments. */
#define RESP_JOB_MAX_DEPTH 128u
/* Longest RQ job description read by resp_job_rq_task(). */
#define RESP_JOB_MAX_DESCRIPTION 4096u

/* ---- jobs -------------------------------------------------------------------------------- */

/* Who a job is.  Every string is a NUL-terminated malloc'd copy of a JSON string value (a value
 * of another type, or one containing "\u0000", counts as absent); absent fields are NULL. */
struct resp_job {
    char *id;         /* identity: Sidekiq jid, Celery headers.id (else properties.correlation_id);
                         never NULL nor empty in a job that was read */
    char *task;       /* Sidekiq class (an ActiveJob wrapper: the "wrapped" class), Celery
                         headers.task */
    char *queue;      /* Sidekiq "queue"; Celery properties.delivery_info.routing_key */
    char *tag;        /* Celery properties.delivery_tag (its field in `unacked`); Sidekiq NULL */
    bool redelivered; /* Celery: headers.redelivered or properties.delivery_info.redelivered is
                         true; Sidekiq: "retry_count" is present (the job failed at least once) */
    unsigned retries; /* the retries the app made before: Celery's headers.retries, Sidekiq's
                         retry_count + 1 (Sidekiq sets it to 0 at the first failure); 0 when
                         absent or not a whole number, RESP_JOB_MAX_RETRIES at most */
};

/* The most retries read from a job; a larger count reads as this. */
#define RESP_JOB_MAX_RETRIES 1000000000u

/* Frees the strings of j and zeroes it; j may be zeroed already (safe to call twice) or NULL. */
void resp_job_clear(struct resp_job *j);

/*
 * Reads a Sidekiq job (the element of queue:<name>, retry, schedule or dead) from
 * json[0..len).  Returns 0 with *j filled, or -1 with *j zeroed when the bytes are not a JSON
 * object with non-empty "jid" and "class" strings (or on allocation failure).  task is "class",
 * except for ActiveJob's wrappers (ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper,
 * Sidekiq::ActiveJob::Wrapper), whose task is the "wrapped" string (what Sidekiq's Web UI shows),
 * else the job_class of the serialized job in the first argument.  tag is always NULL.  Integers
 * too large for 64 bits are read (as reals), since Ruby writes Bignum arguments as plain numbers.
 * *j's previous contents are overwritten, not freed.
 */
int resp_job_sidekiq(const void *json, size_t len, struct resp_job *j) TWICE_MUST_CHECK;

/*
 * Reads one entry of Sidekiq's work state, the value its heartbeat writes for each job in
 * progress (`HSET <identity>:workers <tid> <value>` in Sidekiq 6, `<identity>:work` in 7 and
 * later; lib/sidekiq/launcher.rb, processor.rb): {"queue": ..., "payload": <the job's JSON, as a
 * string>, "run_at": <when the job started: seconds since the epoch, or milliseconds when the
 * number is that large>}.  Returns 0 with *j the job read from the payload (resp_job_sidekiq())
 * and *started_by_us the end of the second (or millisecond) run_at names, in microseconds since
 * the epoch: the job started no later (0 when run_at is absent); or -1 with *j zeroed.
 */
int resp_job_sidekiq_work(const void *json, size_t len, struct resp_job *j,
                          uint64_t *started_by_us) TWICE_MUST_CHECK;

/*
 * Reads a Celery task message as kombu's Redis transport stores it (the element of the queue
 * list; not the `unacked` hash value, which is a [message, exchange, routing_key] array) from
 * json[0..len).  Returns 0 with *j filled, or -1 with *j zeroed when the bytes are not a kombu
 * message (a JSON object with a "headers" or a "properties" object; either of them, and
 * properties.delivery_info, of another type when present), when it carries no id (neither
 * headers.id nor properties.correlation_id is a non-empty string), or on allocation failure.
 * Optional fields (task, queue, tag) are NULL when absent.  *j's previous contents are
 * overwritten, not freed.
 */
int resp_job_celery(const void *json, size_t len, struct resp_job *j) TWICE_MUST_CHECK;

/*
 * The task of an RQ job from its description (the `description` field of the rq:job:<id>
 * hash), description[0..len): "tasks.charge(42, 'x')" -> "tasks.charge", i.e. the bytes before
 * the first '('; a description without '(' is returned whole.  Returns 0 with *task a malloc'd
 * NUL-terminated string, or -1 with *task NULL when len is 0 or over RESP_JOB_MAX_DESCRIPTION,
 * when the task would be empty ("(x)") or contain a NUL byte, or on allocation failure.
 */
int resp_job_rq_task(const void *description, size_t len, char **task) TWICE_MUST_CHECK;

/*
 * The kombu message in json[0..len) as Celery's visibility-timeout restore (kombu's
 * _do_restore_message) re-pushes it: the same JSON with headers.redelivered = true and
 * properties.delivery_info.redelivered = true.  Unlike kombu, which then leaves the message as
 * it is, the headers, properties and delivery_info objects are created when absent.  Key order
 * and every other value are kept; the output is compact JSON (kombu writes ", " and ": ").
 * Returns 0 with *out a malloc'd buffer of *outlen bytes (plus a NUL terminator not counted),
 * or -1 with *out NULL and *outlen 0 when the bytes are not a kombu message (as for
 * resp_job_celery(), but no id is needed), when an integer does not fit in 64 bits (it could
 * not be written back unchanged), or on allocation failure.
 */
int resp_job_celery_redelivered(const void *json, size_t len, char **out,
                                size_t *outlen) TWICE_MUST_CHECK;

/*
 * The kombu message in json[0..len) as a producer that retried its publish would push it again:
 * the same JSON with properties.delivery_tag = tag (kombu draws a new uuid4 per publish,
 * kombu/transport/virtual/base.py, Channel._inplace_augment_message), properties created when
 * absent.  tag is a NUL-terminated UTF-8 string.  Returns and fails as
 * resp_job_celery_redelivered() does (and -1 for a NULL or invalid tag).
 */
int resp_job_celery_retagged(const void *json, size_t len, const char *tag, char **out,
                             size_t *outlen) TWICE_MUST_CHECK;

#endif
