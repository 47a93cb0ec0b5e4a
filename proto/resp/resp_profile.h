/*
 * resp_profile.h - what a Redis command or reply means to a job framework on Redis.
 *
 * resp.h cuts bytes into commands and replies; resp_job.h reads a job's payload.  This module
 * sits between them and the proxy: for a listener's profile (sidekiq, celery, rq, streams;
 * docs/redis.md, docs/protocols.md) it names the commands twice looks at, says which of them
 * publish a job, pop one or settle one, which argument holds the ids, which queue a list key
 * stands for, what kind of reply a command will get (a pop's job, an RQ job hash, stream
 * entries), and reads the fields the events need out of those replies.  It is one table-driven
 * module rather than a file per profile: the five profiles share most of their commands and
 * differ in key names and argument positions, which read best side by side.
 *
 * Pure C over the scanner's views: no sockets, no libevent, no logging, no state between calls.
 * What to do about a command (the rules, the correlation of an ack with its delivery, the
 * journal) is the proxy's.  Views point into the caller's buffer and live as long as it does.
 *
 * Every function takes any bytes a peer can send (keys and fields of any length or content, a
 * reply of the wrong shape) and answers false / 0 / -1 for what it cannot read; a string longer
 * than its named limit is never cut (a cut id would be another job's), it is refused, and the
 * functions that read one say so (RPROF_TOO_LONG) so that the proxy can log it.
 */
#ifndef TWICE_RESP_PROFILE_H
#define TWICE_RESP_PROFILE_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/jobs/msg_field.h"
#include "proto/resp/resp.h"

/* ---- limits ------------------------------------------------------------------------------ */

/* Longest key (a list, a stream, a hash) and ack id or tag read, NUL included.  Sidekiq's,
 * Celery's and RQ's keys and ids are well under 100 bytes; a longer one is not the profile's. */
#define RPROF_KEY_MAX 512u
/* A stream entry's id, NUL included.  Redis writes at most 41 bytes (MS-SEQ, two 64-bit
 * numbers); only a server that is not Redis sends more. */
#define RPROF_ID_MAX 128u
/* A task name read from a stream entry's or an XADD's `task` field, NUL included. */
#define RPROF_TASK_MAX 256u
/* Queued commands of one transaction read by rprof_tx_scan(); a longer one is not planned. */
#define RPROF_TX_MAX 1024u
/* The most bytes of a transaction rprof_tx_scan() reads ahead before it gives up. */
#define RPROF_TX_PEEK_MAX (1u << 20)

/* ---- profiles ---------------------------------------------------------------------------- */

enum rprof {
    RPROF_NONE,    /* commands only */
    RPROF_SIDEKIQ, /* Sidekiq: LPUSH queue:NAME <job JSON>, BRPOP queue:... */
    RPROF_CELERY,  /* Celery with kombu's Redis transport: LPUSH/BRPOP on the queue's list,
                      ZREM unacked_index TAG to ack */
    RPROF_RQ,      /* RQ: RPUSH/LPUSH rq:queue:NAME <id>, BLPOP/LMOVE, ZREM rq:wip:NAME <id> */
    RPROF_STREAMS, /* Redis Streams consumer groups: XADD, XREADGROUP, XCLAIM, XACK */
    RPROF_LIST,    /* any app's JSON jobs on plain lists: LPUSH/RPUSH to publish, a pop or a
                      move (BLMOVE queue processing) to deliver, LREM processing 1 JOB to ack;
                      ids and tasks from the listener's body.json sources */
    RPROF_BULLMQ,  /* BullMQ: every operation a Lua script (EVAL, then EVALSHA), read by
                      proto/resp/resp_bullmq.h */
};

/* The profile a listener's `profile` setting names; RPROF_NONE for NULL or an unknown name
 * (the configuration refuses those before a listener opens). */
enum rprof rprof_of(const char *name);

/* The keys of the frameworks' lists and hashes (docs/protocols.md). */
#define RPROF_SIDEKIQ_QUEUE_PREFIX "queue:" /* queue:NAME, a Sidekiq queue */
#define RPROF_RQ_QUEUE_PREFIX "rq:queue:"   /* rq:queue:NAME, an RQ queue */
#define RPROF_RQ_WIP_PREFIX "rq:wip:"       /* rq:wip:NAME, RQ's started-job registry */
#define RPROF_RQ_JOB_PREFIX "rq:job:"       /* rq:job:ID, an RQ job's hash */
#define RPROF_RQ_FAILED_PREFIX "rq:failed:" /* rq:failed:NAME, RQ's failed-job registry */

/* ---- commands ---------------------------------------------------------------------------- */

/* The commands twice itself looks at; every other one is RPROF_CMD_OTHER. */
enum rprof_cmd {
    RPROF_CMD_OTHER,
    RPROF_CMD_AUTH,
    RPROF_CMD_BLMOVE,
    RPROF_CMD_BLPOP,
    RPROF_CMD_BRPOP,
    RPROF_CMD_BRPOPLPUSH,
    RPROF_CMD_DISCARD,
    RPROF_CMD_EVAL,
    RPROF_CMD_EVALSHA,
    RPROF_CMD_EXEC,
    RPROF_CMD_HDEL,
    RPROF_CMD_HELLO,
    RPROF_CMD_HGETALL,
    RPROF_CMD_HSET,
    RPROF_CMD_LMOVE,
    RPROF_CMD_LPOP,
    RPROF_CMD_LPUSH,
    RPROF_CMD_LREM,
    RPROF_CMD_MULTI,
    RPROF_CMD_RPOP,
    RPROF_CMD_RPOPLPUSH,
    RPROF_CMD_RPUSH,
    RPROF_CMD_SCRIPT,
    RPROF_CMD_SELECT,
    RPROF_CMD_XACK,
    RPROF_CMD_XADD,
    RPROF_CMD_XAUTOCLAIM,
    RPROF_CMD_XCLAIM,
    RPROF_CMD_XREADGROUP,
    RPROF_CMD_ZADD,
    RPROF_CMD_ZREM,
    RPROF_CMD_ZREMRANGEBYSCORE,
};

/* The id of an upper-cased command name of n bytes (resp_cmd_name_copy()'s output). */
enum rprof_cmd rprof_cmd_of(const char *name, size_t n);

/* Whether profile p ever looks at command id: every id but RPROF_CMD_OTHER, except RPOP, LREM,
 * RPOPLPUSH and BRPOPLPUSH, which only the list profile reads, ZADD and ZREMRANGEBYSCORE, which
 * only RQ's does (Sidekiq's schedule and retry sets are ZADDs too), and EVAL, EVALSHA and SCRIPT,
 * which only BullMQ's does; BullMQ's looks at those three, at AUTH, HELLO and SELECT (twice's
 * own connection repeats them) and at MULTI, EXEC and DISCARD (a flow's adds are queued in a
 * transaction).  A command it does not look at takes the proxy's plain path. */
bool rprof_cmd_matters(enum rprof p, enum rprof_cmd id);

/* A scanned command as the profile functions read it. */
struct rprof_cmdview {
    const uint8_t *buf; /* the message: buf[0..len) */
    size_t len;
    const struct resp_msg *m;
    char name[RESP_CMD_NAME_MAX]; /* upper-cased; "" for a command without words */
    enum rprof_cmd id;
    char key[RPROF_KEY_MAX]; /* the second word, when has_key */
    bool has_key;            /* the key was read and fits (no NUL byte, under RPROF_KEY_MAX) */
};

/* Names the command m (scanned from buf, which holds its m->len bytes).  The key is copied
 * only when want_key or when the command is one of enum rprof_cmd: most commands of a busy
 * pipeline (GET, SET, INCR) never need it.  cv keeps pointers to buf and m. */
void rprof_cmdview_init(struct rprof_cmdview *cv, const uint8_t *buf, const struct resp_msg *m,
                        bool want_key);

/* Argument i of the command (0 is its name) as a view; false past the last one. */
bool rprof_arg(const struct rprof_cmdview *cv, size_t i, struct resp_view *v);

/* Whether view v of the command is `word`, ASCII case ignored (an option such as MAXLEN). */
bool rprof_arg_is(const struct rprof_cmdview *cv, const struct resp_view *v, const char *word);

/* The bytes of view v (into buf[0..len)) as a NUL-terminated string in out[0..cap); false when
 * they do not fit or hold a NUL byte (out then holds a cut copy, not to be used), or when v is
 * not a string. */
bool rprof_view_str(const uint8_t *buf, size_t len, const struct resp_view *v, char *out,
                    size_t cap);

/* Whether v is a non-null aggregate (array, map or set) whose elements can be walked. */
bool rprof_is_agg(const struct resp_view *v);

/* Starts an iteration over the elements of aggregate agg, a view into buf[0..len). */
void rprof_walk_init(struct resp_args *it, const uint8_t *buf, size_t len,
                     const struct resp_view *agg);

/* ---- what a command does for the profile ------------------------------------------------- */

/* Whether the command pops a job from a queue: Sidekiq's BRPOP of queue:*, Celery's BRPOP, RQ's
 * BLPOP/LPOP/BLMOVE/LMOVE of rq:queue:*; for the list profile any BRPOP, BLPOP, LPOP or RPOP
 * without a count, LMOVE, BLMOVE, RPOPLPUSH or BRPOPLPUSH.  Its reply is read with
 * rprof_pop_reply(). */
bool rprof_is_pop(enum rprof p, const struct rprof_cmdview *cv);

/* Whether a pop takes the head of its list (BLPOP, LPOP, LMOVE/BLMOVE src dst LEFT ...) rather
 * than its tail (BRPOP, RPOP, RPOPLPUSH, BRPOPLPUSH, LMOVE ... RIGHT ...). */
bool rprof_pop_takes_head(const struct rprof_cmdview *cv);

/* Whether the pop moves its job onto another list (LMOVE, BLMOVE, RPOPLPUSH, BRPOPLPUSH: a
 * worker's processing list), which it reads into out[0..cap); false for any other command, or a
 * destination that does not fit. */
bool rprof_pop_moves_to(const struct rprof_cmdview *cv, char *out, size_t cap);

/* The list profile's ack: LREM key count JOB, the worker taking the job it finished out of its
 * processing list (the "reliable queue" of Redis's LMOVE documentation).  *job is the value's
 * view; false for any other command or profile. */
bool rprof_list_ack(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *job);

/* Whether the command settles jobs, and from which argument on it names them (*first): Celery's
 * ZREM <queue>unacked_index TAG..., RQ's ZREM rq:wip:NAME ID..., XACK stream group ID... */
bool rprof_ack_args(enum rprof p, const struct rprof_cmdview *cv, size_t *first);

/* What a command publishes. */
enum rprof_publish {
    RPROF_PUB_NONE,
    RPROF_PUB_JOBS,  /* Sidekiq's or Celery's LPUSH, the list profile's LPUSH or RPUSH: one job
                        payload per argument from 2 on (rprof_job(), rprof_list_job()) */
    RPROF_PUB_RQ_ID, /* RQ's push of a job id (argument 2) onto rq:queue:NAME */
    RPROF_PUB_XADD,  /* XADD: an entry, its id chosen by the client or by Redis
                        (rprof_xadd_id_arg(), rprof_xadd_task()) */
};

/* Whether and how the command publishes a job for the profile. */
enum rprof_publish rprof_publish_of(enum rprof p, const struct rprof_cmdview *cv);

struct resp_job;

/* The job in a payload v[0..n) pushed or popped on a Sidekiq or Celery queue
 * (resp_job_sidekiq(), resp_job_celery()), or on a list of the list profile with its default
 * sources (rprof_list_job()): 0 with *j filled (the caller frees it with resp_job_clear()), -1
 * when it is not one, or for another profile. */
int rprof_job(enum rprof p, const void *v, size_t n, struct resp_job *j) TWICE_MUST_CHECK;

/* The list profile's sources when a listener sets none: `message-id body.json.id
 * body.json.uuid body.json.jid` and `task body.json.task body.json.displayName body.json.name
 * body.json.class` (docs/any-app.md). */
const struct msg_fields *rprof_list_default_ids(void);
const struct msg_fields *rprof_list_default_tasks(void);

/* A job of the list profile: payload v[0..n) is a JSON object, its id read with the sources
 * ids (NULL or none set: the defaults), its task with tasks (likewise; a job may have no task).
 * 0 with *j filled (id and task only), -1 when the payload has no id.  A value as long as
 * MSG_FIELD_VALUE_MAX or longer is not used, and its length goes to *too_long (may be NULL;
 * 0 when none was). */
int rprof_list_job(const struct msg_fields *ids, const struct msg_fields *tasks, const void *v,
                   size_t n, struct resp_job *j, uint64_t *too_long) TWICE_MUST_CHECK;

/* The queue a list (or registry, or stream) key stands for, as the journal and the `queue=`
 * matcher name it: Sidekiq's queue:NAME and RQ's rq:queue:NAME, rq:wip:NAME and rq:failed:NAME
 * give NAME, Celery's priority lists "<queue>\x06\x16<n>" give <queue>, anything else the key
 * itself. Returns a malloc'd string the caller frees, NULL on allocation failure. */
char *rprof_queue_of(enum rprof p, const char *key) TWICE_MUST_CHECK;

/* The command a framework's own push of a popped job would be, for a copy twice sends back:
 * "LPUSH" for RQ (a job is pushed to the head of its queue when it is requeued); for the others
 * the end the pop took it from (head: rprof_pop_takes_head()), which the next pop takes first:
 * "RPUSH" after Sidekiq's and Celery's BRPOP. */
const char *rprof_repush_cmd(enum rprof p, bool head);

/* The queue list an RQ job settled on rq:wip:NAME goes back to when twice redelivers it:
 * rq:queue:NAME into out[0..cap).  False when key is not an RQ started registry or out is too
 * small. */
bool rprof_rq_queue_of_wip(const char *key, char *out, size_t cap);

/* Whether the command is Celery's HDEL <queue>unacked TAG..., the second half of an ack. */
bool rprof_is_celery_unacked_hdel(enum rprof p, const struct rprof_cmdview *cv);

/* The integer Redis would answer an ack command with when all of its ids are new to it: XACK's
 * ids, ZREM's and HDEL's members; 1 for any other command. */
int64_t rprof_settled_count(const struct rprof_cmdview *cv);

/* XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] threshold] [LIMIT count] id field value ...
 * (options in any order, as Redis parses them): the index of the id argument, 0 when there is
 * none. */
size_t rprof_xadd_id_arg(const struct rprof_cmdview *cv);

/* How a field was read. */
enum rprof_field {
    RPROF_ABSENT = 0, /* no such field, or it is not a string */
    RPROF_FOUND = 1,
    RPROF_TOO_LONG = -1, /* present but as long as its limit or longer: *len says how long */
};

/* The `task` field of an XADD (the field/value pairs after its id) into out[0..cap). */
enum rprof_field rprof_xadd_task(const struct rprof_cmdview *cv, char *out, size_t cap,
                                 uint64_t *len);

/* RQ's save of a job, HSET rq:job:ID ... description D ...: *id points at ID inside cv->key,
 * *task is the task of description D (resp_job_rq_task()), malloc'd for the caller.  Returns
 * false (and *task NULL) for any other command or an unreadable description. */
bool rprof_rq_job_saved(enum rprof p, const struct rprof_cmdview *cv, const char **id, char **task);

/* RQ's renewal of a job's lease, ZADD rq:wip:NAME XX SCORE ID (the worker's heartbeat while
 * its work horse runs the job, rq/worker.py maintain_heartbeats; the job's first entry, without
 * XX, is its start, not a renewal): *id is the view of ID.  False for any other ZADD (NX, INCR,
 * CH, several members). */
bool rprof_rq_lease(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *id);

/* RQ's move of a job into its failed registry, ZADD rq:failed:NAME SCORE ID without NX or XX
 * (rq/registry.py, FailedJobRegistry.add): *id is the view of ID. */
bool rprof_rq_failed(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *id);

/* Whether cv is RQ's reaping of expired jobs from a started registry, ZREMRANGEBYSCORE
 * rq:wip:NAME 0 NOW (rq/registry.py, StartedJobRegistry.cleanup): the transaction it ends
 * requeues the jobs whose lease lapsed that have retries left. */
bool rprof_rq_reaps(enum rprof p, const struct rprof_cmdview *cv);

/* Whether cv is the job-hash half of RQ's heartbeat of job `id`: HSET rq:job:ID
 * last_heartbeat T and no other field (rq/job.py, Job.heartbeat). */
bool rprof_rq_job_heartbeat(enum rprof p, const struct rprof_cmdview *cv, const char *id);

/* Whether cv is RQ's save of a job that ran before, HSET rq:job:ID ... started_at T ... with T
 * not empty: RQ's enqueue writes started_at empty, whereas a retry (Job.retry, or the scheduler
 * enqueueing one that waited) saves the job it ran, its start time set, before it pushes the id
 * again.  A requeue of a failed job clears started_at first. */
bool rprof_rq_job_ran(enum rprof p, const struct rprof_cmdview *cv);

/* Whether cv is Sidekiq's heartbeat writing its work state: HSET <identity>:workers (Sidekiq 6)
 * or <identity>:work (7 and later) with field/value pairs, one per job in progress: the thread
 * id, and the entry resp_job_sidekiq_work() reads (lib/sidekiq/launcher.rb).  *identity_len is
 * the length of the identity at the start of cv->key. */
bool rprof_sidekiq_work(enum rprof p, const struct rprof_cmdview *cv, size_t *identity_len);

/* ---- the reply a command will get -------------------------------------------------------- */

/* What twice must read in the reply to a command. */
enum rprof_reply {
    RPROF_REPLY_PLAIN = 0,
    RPROF_REPLY_POP,        /* a list pop: the reply may carry a job (rprof_pop_reply()) */
    RPROF_REPLY_XREAD,      /* XREADGROUP: streams and their entries */
    RPROF_REPLY_XCLAIM,     /* XCLAIM without JUSTID: the entries handed out again */
    RPROF_REPLY_XAUTOCLAIM, /* XAUTOCLAIM without JUSTID: [cursor, entries, deleted ids] */
    RPROF_REPLY_XADD,       /* XADD: the id of the published entry */
    RPROF_REPLY_RQ_HASH,    /* HGETALL rq:job:ID: the job's fields, its description */
    RPROF_REPLY_END,        /* (the first value a caller may use for kinds of its own) */
};

/* What the reply to a command will be for the profile.  *arg (may be NULL) points into cv->key:
 * the popped list (POP), the stream (XCLAIM, XAUTOCLAIM, XADD) or the job's id (RQ_HASH), else
 * NULL.  *redelivered is set for an XREADGROUP that re-reads the consumer's pending entries (an
 * id other than '>'). */
enum rprof_reply rprof_reply_of(enum rprof p, const struct rprof_cmdview *cv, const char **arg,
                                bool *redelivered);

/* The list and the value a pop's reply carries: [list, value] for BRPOP and BLPOP (*pair set),
 * or for LMOVE and LPOP the value of own_list, the list the command named.  list[0..cap) gets
 * the list's name, *val the value's view into buf.  False for a null reply (the pop timed out)
 * or any other shape. */
bool rprof_pop_reply(const uint8_t *buf, const struct resp_msg *m, const char *own_list, char *list,
                     size_t cap, struct resp_view *val, bool *pair);

/* One stream entry [id, [field, value, ...]] as a delivery names it. */
struct rprof_entry {
    char id[RPROF_ID_MAX];
    char task[RPROF_TASK_MAX]; /* the `task` field; "" when absent or too long */
    const char *too_long;      /* NULL, or the field that did not fit ("stream entry id", "task") */
    uint64_t too_long_len;     /* its length in bytes */
};

/* Reads the entry view e (into buf[0..len)) into *out.  Returns 1 when it has an id, 0 when it
 * is not an entry or its id is not a string that fits (out->too_long says when it was too
 * long); a `task` too long leaves task "" and still returns 1, with out->too_long set. */
int rprof_stream_entry(const uint8_t *buf, size_t len, const struct resp_view *e,
                       struct rprof_entry *out);

/* The reply to an XADD (a bulk string id) into out[0..cap).  RPROF_TOO_LONG sets *len. */
enum rprof_field rprof_xadd_reply_id(const uint8_t *buf, const struct resp_msg *m, char *out,
                                     size_t cap, uint64_t *len);

/* The task of the RQ job whose hash HGETALL returned (m, in buf): from its `description`
 * field, malloc'd into *task.  0 on success, -1 (and *task NULL) when there is none. */
int rprof_rq_hash_task(const uint8_t *buf, const struct resp_msg *m, char **task) TWICE_MUST_CHECK;

/* ---- transactions ------------------------------------------------------------------------ */

/* What rprof_tx_scan() found in a transaction. */
struct rprof_tx {
    size_t queued; /* commands between MULTI and EXEC */
    bool has_push; /* one of them is an LPUSH or RPUSH (a Celery restore, an RQ enqueue) */
    size_t end;    /* offset just past EXEC, when found */
};

/* Called for each queued command of the transaction, in order. */
typedef void (*rprof_tx_fn)(void *arg, const struct rprof_cmdview *cv);

/*
 * The first pass over a transaction: the commands in buf[off..len), from just after MULTI, as
 * far as EXEC.  sc is a client-side scanner with the session's limits; it is reset between
 * commands.  each (may be NULL) sees every queued command, keys read.  Returns 1 when EXEC is
 * there (*tx filled), 0 when it is not there yet (wait for more bytes), -1 when the transaction
 * cannot be planned: DISCARD, a malformed or oversized command, more than RPROF_TX_MAX queued
 * commands, or RPROF_TX_PEEK_MAX bytes without EXEC.
 */
int rprof_tx_scan(struct resp_scanner *sc, const uint8_t *buf, size_t len, size_t off,
                  struct rprof_tx *tx, rprof_tx_fn each, void *arg);

#endif
