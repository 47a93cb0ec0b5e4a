/*
 * resp_bullmq.h - what BullMQ's Redis traffic means: its Lua scripts, known by their bodies, and
 * the jobs, acks and lock renewals in their arguments and replies (docs/protocols.md, BullMQ).
 *
 * BullMQ (through ioredis) runs every queue operation as a Lua script: the first call of a
 * script on a connection is `EVAL <body> numkeys KEYS... ARGV...`, the later ones `EVALSHA
 * <sha1 of the body> ...`.  A script is known here by the header comment its body opens with,
 * not by key positions or its sha (both change between BullMQ versions); the proxy keeps
 * which sha is which script, from the bodies it sees.  An unknown script is not read.
 *
 * Pure C over the RESP scanner's views: no sockets, no state.  Strings read are NUL-free and
 * shorter than their limit, else refused (never cut).
 */
#ifndef TWICE_RESP_BULLMQ_H
#define TWICE_RESP_BULLMQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/resp/resp.h"
#include "proto/resp/resp_profile.h"

/* A job's id, name and queue, NUL included.  BullMQ's ids are decimal counters or the app's
 * own (UUIDs for flows); a longer one is not read. */
#define BMQ_ID_MAX 256u
#define BMQ_NAME_MAX 256u
#define BMQ_QUEUE_MAX 256u
/* A key prefix ("bull:orders:"), NUL included; a job's lock token ("<worker uuid>:<n>"). */
#define BMQ_PREFIX_MAX 512u
#define BMQ_TOKEN_MAX 128u

/* The scripts twice reads. */
enum bmq_script {
    BMQ_SCRIPT_UNKNOWN,
    BMQ_ADD_STANDARD,     /* addStandardJob: a job onto wait */
    BMQ_ADD_DELAYED,      /* addDelayedJob */
    BMQ_ADD_PRIORITIZED,  /* addPrioritizedJob */
    BMQ_ADD_PARENT,       /* addParentJob: a flow's parent, waiting for its children */
    BMQ_MOVE_TO_ACTIVE,   /* moveToActive: a worker takes the next job and locks it */
    BMQ_MOVE_TO_FINISHED, /* moveToFinished: completed or failed, maybe with the next job */
    BMQ_EXTEND_LOCK,      /* extendLock: one job's lock renewed */
    BMQ_EXTEND_LOCKS,     /* extendLocks: a worker's locks renewed in one call */
    BMQ_MOVE_STALLED,     /* moveStalledJobsToWait: the stalled-job checker */
    BMQ_RETRY_JOB,        /* retryJob: a failed attempt with retries left, back onto wait */
    BMQ_MOVE_TO_DELAYED,  /* moveToDelayed: a failed attempt waiting its back-off, maybe with
                             the next job */
    BMQ_SCRIPT_COUNT,
};

/* The script a body is, by its opening comment; BMQ_SCRIPT_UNKNOWN for any other. */
enum bmq_script bmq_script_of(const uint8_t *body, size_t n);

/* The script's name as BullMQ's sources call it ("moveToActive"). */
const char *bmq_script_name(enum bmq_script s);

/* Whether the script adds a job. */
bool bmq_script_adds(enum bmq_script s);

/* A script call: EVAL body|EVALSHA sha numkeys KEYS... ARGV... */
struct bmq_call {
    bool eval;               /* EVAL: .script is the body; EVALSHA: the sha */
    struct resp_view script; /* into the command's buffer */
    size_t numkeys;
};

/* Whether cv is EVAL or EVALSHA with a numkeys that its arguments hold. */
bool bmq_call_of(const struct rprof_cmdview *cv, struct bmq_call *c);

/* ARGV[i + 1] of the call (0-based i); false past the last. */
bool bmq_arg(const struct rprof_cmdview *cv, const struct bmq_call *c, size_t i,
             struct resp_view *v);

/* The queue a key prefix names: "bull:orders:" gives "orders" (BullMQ refuses ':' in a queue
 * name, so it is what follows the last ':' but one).  False when it is not such a prefix or
 * does not fit in out[0..cap). */
bool bmq_queue_of_prefix(const uint8_t *p, size_t n, char *out, size_t cap);

/* A job as an add names it, or as a worker receives it. */
struct bmq_job {
    char id[BMQ_ID_MAX];         /* "" when not known (an add without a custom id) */
    char name[BMQ_NAME_MAX];     /* the job's name: the task */
    char queue[BMQ_QUEUE_MAX];   /* "" when not known */
    unsigned attempts_made;      /* the job hash's `atm`: attempts that failed before */
    unsigned stalled;            /* its `stc`: times the stalled checker took it back */
    bool deferred_failure;       /* its `defa` is set: stalled past maxStalledCount, the worker
                                    fails it without running it */
    char prefix[BMQ_PREFIX_MAX]; /* an add's key prefix ("bull:orders:"); "" when not read */
};

/* An add script's job: ARGV[1] is a packed array [prefix, custom id, name, ...].  0, or -1
 * when it cannot be read. */
int bmq_add_args(const struct rprof_cmdview *cv, const struct bmq_call *c, struct bmq_job *j);

/* An add's reply v (a reply's value, or its element in EXEC's array when the add was queued in
 * a transaction, as FlowProducer.add queues its own): 1 with the job's id in
 * out[0..cap), 0 for an integer (BullMQ's error codes are negative ones), -1 for any other
 * shape. */
int bmq_add_reply(const uint8_t *buf, const struct resp_view *v, char *out, size_t cap);

/* The job a moveToActive reply, or a moveToFinished one that fetched the next job, hands the
 * worker: [job hash as field/value pairs, id, ...].  1 with *j filled (its queue left as
 * it was), 0 when no job came (an integer, or [0, 0, ...]), -1 for any other shape. */
int bmq_next_job(const uint8_t *buf, const struct resp_msg *m, struct bmq_job *j);

/* The queue of a call, from its prefix argument: ARGV[1] of moveToActive, extendLocks,
 * retryJob and moveToDelayed, ARGV[7] of moveToFinished, ARGV[2] of moveStalledJobsToWait;
 * false for another script or when it does not read. */
bool bmq_call_queue(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                    char *out, size_t cap);

/* The key prefix of a call ("bull:orders:"): ARGV[1] of moveToActive, extendLocks, retryJob and
 * moveToDelayed, ARGV[7] of moveToFinished, ARGV[2] of moveStalledJobsToWait, extendLock's
 * KEYS[1] (<prefix><id>:lock) without its id; false for another script or when it does not
 * read or fit. */
bool bmq_call_prefix(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                     char *out, size_t cap);

/* The lock token a call holds or asks for: the `token` of moveToActive's packed ARGV[3] and of
 * moveToFinished's ARGV[8] (the finished job's, and the next job's when it fetches one),
 * moveToDelayed's ARGV[4], extendLock's ARGV[1].  False for another script or when it does not
 * read or fit. */
bool bmq_call_token(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                    char *out, size_t cap);

/* Called with each job of a lock renewal: its index k in the call, its id and its token ("" when
 * that one does not read). */
typedef void (*bmq_lock_fn)(void *arg, uint32_t k, const char *id, const char *token);

/* The jobs whose locks a call renews: extendLocks' packed ARGV[3] (ids) and ARGV[2] (tokens),
 * element by element, or extendLock's one (ARGV[3], ARGV[1]).  *count gets the number of
 * elements (ids that do not read are skipped, not counted out).  -1 when they do not read. */
int bmq_lock_each(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                  bmq_lock_fn fn, void *arg, uint32_t *count);

/* A moveToFinished call: the job's id (ARGV[1]), whether it failed (ARGV[5] "failed") and
 * whether the reply brings the next job (ARGV[6] "1").  0, or -1 when it does not read. */
int bmq_finish_args(const struct rprof_cmdview *cv, const struct bmq_call *c, char *id, size_t cap,
                    bool *failed, bool *fetch_next);

/* A failed attempt that BullMQ retries (its `attempts` not used up): retryJob's job id
 * (ARGV[4]), or moveToDelayed's (ARGV[3]) and whether its reply brings the next job (ARGV[8]
 * "1").  0, or -1 when it does not read or s is another script. */
int bmq_retry_args(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                   char *id, size_t cap, bool *fetch_next);

/* The value of a moveToFinished reply that is an integer: 0 done, a negative one BullMQ's error
 * code (-2 missing lock, -6 lock mismatch...); false for another shape (the next job). */
bool bmq_finish_code(const uint8_t *buf, const struct resp_msg *m, int64_t *code);

/* Called with each job id a call or reply names. */
typedef void (*bmq_id_fn)(void *arg, const char *id);

/* The ids whose locks a call renews: extendLock's ARGV[3], extendLocks' packed ARGV[3].  The
 * count of ids handed to fn, or -1 when they do not read.  Ids too long are skipped. */
int bmq_lock_ids(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                 bmq_id_fn fn, void *arg);

/* The ids a moveStalledJobsToWait reply names (the jobs it moved back, or failed): their
 * count, or -1 for another shape. */
int bmq_stalled_ids(const uint8_t *buf, const struct resp_msg *m, bmq_id_fn fn, void *arg);

/*
 * What twice sends to hand a job out again at once, while the worker that has it still runs it
 * (`duplicate` on a delivery): one EVAL of a script that does for this one job what BullMQ's
 * stalled-job check does for a job whose lock is gone (moveStalledJobsToWait): off the active
 * list, its lock deleted, its stalled count one up, onto the end of the wait list workers take
 * from next (the paused list when the queue is paused), the marker that wakes a blocked worker
 * set unless the queue is paused or at its concurrency, and the `waiting` and `stalled` events.
 * A job no longer active (finished meanwhile) is left alone; the script answers 1 or 0.
 */
#define BMQ_REQUEUE_ARGC 11
/* Room for the keys of one such command: seven keys of a prefix and the id. */
#define BMQ_REQUEUE_KEYS_MAX (7u * (BMQ_PREFIX_MAX + BMQ_ID_MAX))

/* The command's arguments for job id under prefix into argv/lens (the keys written into
 * keys[0..cap)): its argument count, BMQ_REQUEUE_ARGC, or 0 when they do not fit. */
size_t bmq_requeue_cmd(const char *prefix, const char *id, char *keys, size_t cap,
                       const char *argv[BMQ_REQUEUE_ARGC], size_t lens[BMQ_REQUEUE_ARGC]);

#endif
