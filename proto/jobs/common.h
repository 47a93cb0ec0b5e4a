/*
 * common.h - what the modules of the Redis job frameworks (proto/jobs/) share: job events
 * whose strings they own, the reply a command's plan tags, acks by id planned together, the
 * fate of a publish and of a popped job, and the walk over a transaction.  Internal to
 * proto/jobs/.
 */
#ifndef TWICE_JOBS_COMMON_H
#define TWICE_JOBS_COMMON_H

#include "proto/jobs/framework.h"
#include "proto/resp/resp_job.h"

/* ---- events ------------------------------------------------------------------------------ */

/* A job event whose strings are the module's copies (struct job_event is its view). */
struct jobs_ev {
    enum job_ev kind;
    char *id;
    char *task;
    char *queue;
    const char *key;
    bool redelivered;
    unsigned retries;
    bool retry;
    bool refused;
    bool kept_back;
    uint64_t started_unix_us;
    const char *run;
    bool oom; /* a string could not be copied: the event is neither journaled nor decided */
};

/* A copy of s for a field of j; NULL for NULL, and on allocation failure, which j->oom
 * remembers: an event that lost a field would match other rules than the job's. */
char *jobs_dup(struct jobs_ev *j, const char *s);
/* A copy, for a field of j, of the task the memory has for job id[0..n); NULL when none. */
char *jobs_known_task(const struct job_host *h, struct jobs_ev *j, const char *id, size_t n);
void jobs_ev_clear(struct jobs_ev *j);
/* Journals j as rec (nothing when a string was lost). */
void jobs_record(const struct job_host *h, enum job_rec rec, const struct jobs_ev *j);
/* The rules' fault for j; JOB_FAULT_NONE (logged) when a string was lost. */
struct job_fault jobs_decide(const struct job_host *h, const struct jobs_ev *j);
/* The same without noting the fault (the caller notes it, jobs_note()). */
struct job_fault jobs_decide_unnoted(const struct job_host *h, const struct jobs_ev *j);
void jobs_note(const struct job_host *h, const struct job_fault *f, const struct jobs_ev *j);
/* Whether j lost a string; if so it is logged once here. */
bool jobs_lost(const struct job_host *h, const struct jobs_ev *j);

/* The job in payload v[0..n) of a list push or pop: the profile's reading, or any app's read
 * with the listener's `message-id` and `task` sources (the list profile).  0, or -1. */
int jobs_read_job(const struct job_host *h, enum rprof prof, const void *v, size_t n,
                  struct resp_job *job);

/* A field longer than its limit (cap, NUL included), said once a session by the host. */
void jobs_too_long(const struct job_host *h, const char *field, uint64_t len, size_t cap);

/* ---- replies ----------------------------------------------------------------------------- */

/* What a tagged reply is read with: its kind is enum rprof_reply. */
struct jobs_reply {
    char *arg;  /* POP: the list; RQ_HASH: the job's id; XCLAIM, XAUTOCLAIM, XADD: the stream */
    char *arg2; /* POP (list profile): the list a move puts the job on; XADD: the task */
    bool head;  /* POP: the pop took its list's head (a copy goes back there) */
    bool redelivered; /* XREAD: a re-read of the consumer's pending entries */
};

/* Tags the reply of command cv with what profile prof reads in it (rprof_reply_of()); nothing
 * for a plain one.  False when out of memory (logged; the reply goes unread). */
bool jobs_tag_reply(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                    struct resp_reply_tag *tag);
void jobs_free_state(uint8_t kind, void *state);

/* ---- acks -------------------------------------------------------------------------------- */

/* What happens to one ack (by id or tag). */
struct jobs_ack_fate {
    bool suppress; /* not applied now */
    bool later;    /* applied later (delay) */
    uint32_t later_ms;
    bool repush;        /* the id goes back onto its queue (RQ's redeliver) */
    uint32_t repush_ms; /* that much later (`redeliver after D`) */
    const void *close_before, *close_after;
};

/* Decides the ack of `id` named by command cv. */
typedef void (*jobs_ack_fn)(const struct job_host *h, const struct rprof_cmdview *cv,
                            const char *id, struct jobs_ack_fate *f);

/* The acks of one command decided together. */
struct jobs_acks {
    size_t n, suppressed;
    uint32_t later_ms;
    const void *close_before, *close_after;
    struct resp_bytes kept;   /* the command without the suppressed ids (some suppressed) */
    struct resp_bytes later;  /* the suppressed ids that apply later, as a command */
    struct resp_bytes repush; /* LPUSH queue ID, one per id redelivered (repush_list) */
    size_t repush_n;
    uint32_t repush_ms;
};

/* Decides each id of cv from argument `first` on with fn; repush_list (may be NULL) is the
 * queue a redelivered id goes back to.  0, or -1 when out of memory (nothing decided). */
int jobs_plan_acks(const struct job_host *h, const struct rprof_cmdview *cv, size_t first,
                   jobs_ack_fn fn, const char *repush_list, struct jobs_acks *a);
void jobs_acks_free(struct jobs_acks *a);
/* The plan of an ack command outside a transaction from its acks' fates. */
void jobs_acks_plan(struct jobs_acks *a, const struct rprof_cmdview *cv, struct resp_cmd_plan *p);

/* An ack's job as the memory has it under `key` (its delivery left it there): the task, and
 * with by_tag (a Celery delivery tag) its id and queue too; whether a `duplicate` of its delivery
 * marked the ack to be swallowed (the mark used up here); the entry's generation. */
struct jobs_ack_memo {
    bool swallow;
    uint64_t gen;
};
void jobs_ack_memo(const struct job_host *h, const char *key, bool by_tag, struct jobs_ev *j,
                   struct jobs_ack_memo *am);
/* The ack under `key` was decided: with no fault its job is settled for good and forgotten
 * (unless a delivery made the entry anew meanwhile, marked it, or another delivery of a
 * Celery tag is still to be acked); with one, a Celery tag's entry counts one delivery less. */
void jobs_ack_done(const struct job_host *h, const char *key, const struct jobs_ack_memo *am,
                   bool faulted);
/* The fate of an ack from its fault; `repush` for a framework whose redelivered ack's id twice
 * pushes back itself (RQ). */
void jobs_ack_fate_of(const struct job_fault *f, bool repush, struct jobs_ack_fate *out);
/* An ack whose event j the module made (kind, key; id and queue unless by_tag): what the memory
 * has under memo_key added (jobs_ack_memo()), journaled, decided (only counted when a
 * duplicate's mark swallows it), the memory updated (jobs_ack_done()); its fate into *f.  j is
 * cleared. */
void jobs_ack_decide(const struct job_host *h, const char *memo_key, bool by_tag, struct jobs_ev *j,
                     bool repush, struct jobs_ack_fate *f);

/* Appends k encoded commands (bytes[0..n)) to group g, or nothing when out of memory. */
void jobs_own_append(struct resp_own *g, const void *bytes, size_t n, size_t k);
/* Appends one command of argc arguments to group g, or nothing when out of memory. */
void jobs_own_command(struct resp_own *g, size_t argc, const char *const *argv, const size_t *lens);

/* ---- publishes and deliveries ------------------------------------------------------------ */

/* Each job payload an LPUSH or RPUSH carries (from argument 2 on) journaled and decided as a
 * publish; a `duplicate` adds the command with that payload to *copies (with `retag`, when not
 * NULL, making the copy's payload: a Celery job's new delivery tag).  The first fault that
 * fired, JOB_FAULT_NONE when none. */
typedef bool (*jobs_retag_fn)(const struct job_host *h, const uint8_t *v, size_t n, char **out,
                              size_t *out_len);
struct job_fault jobs_publish_payloads(const struct job_host *h, enum rprof prof,
                                       const struct rprof_cmdview *cv, jobs_retag_fn retag,
                                       struct resp_own *copies);

/* The plan of a publish command whose first deciding fault is f: dropped (answered
 * drop_answer), held, cut, or forwarded with the copies a `duplicate` made (copies, sent as it
 * goes on) and its reply tagged. */
void jobs_publish_plan(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                       const struct job_fault *f, const struct resp_bytes *drop_answer,
                       struct resp_own *copies, struct resp_cmd_plan *p);

/* The fault f on a job popped from `list` (its value val in buf, [list, value] when pair) as
 * the reply plan p: a copy pushed back where the pop took it (`copy` bytes of it, the value as
 * it was when NULL), the reply replaced by a timeout's null, held, or cut. */
void jobs_pop_fault(const struct job_host *h, enum rprof prof, const struct job_fault *f,
                    const struct jobs_reply *r, const char *list, const void *copy, size_t copy_len,
                    bool pair, struct resp_reply_plan *p);

/* How a list framework reads a popped job. */
struct jobs_pop_ops {
    enum rprof prof;
    /* Before the job is read: what the pop itself says (a processing list fed from `list`, an
     * RQ worker on to its next job). */
    void (*popped)(const struct job_host *h, const struct jobs_reply *r, const char *list);
    /* The job in the popped value v[0..n) into j (kind and key set); false when it is not read
     * (the pop is then only counted). */
    bool (*job)(const struct job_host *h, const char *list, const uint8_t *v, size_t n,
                struct jobs_ev *j);
    /* The value a `duplicate` pushes back (a Celery job marked redelivered), malloc'd; false:
     * the value as it was. */
    bool (*copy)(const uint8_t *v, size_t n, char **out, size_t *out_len);
};

/* A list framework's command outside a transaction: a push of job payloads decided as
 * publishes (dropped: answered :1), else one whose reply it reads, tagged.  0 for a command the
 * framework never looks at. */
int jobs_push_command(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                      bool decided, jobs_retag_fn retag, struct resp_cmd_plan *p);
/* The reply of a pop (tagged RPROF_REPLY_POP) read with ops; others left alone. */
void jobs_pop_tagged(const struct job_host *h, const struct jobs_pop_ops *ops,
                     const struct resp_reply_tag *tag, const uint8_t *buf, const struct resp_msg *m,
                     struct resp_reply_plan *p);
/* framework.h's count_pop for the list frameworks. */
bool jobs_count_pop(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                    const struct resp_msg *m);

/* A popped job payload v[0..n) of list `list` into j (read only when something reads jobs): its
 * id, task, retries and redelivered mark, the queue the list stands for; *tag (may be NULL)
 * gets its delivery tag, malloc'd.  False when it is not a job. */
bool jobs_payload_job(const struct job_host *h, enum rprof prof, const char *list, const uint8_t *v,
                      size_t n, struct jobs_ev *j, char **tag);

/* A pop's reply m: the job it hands a worker journaled and decided, its fault planned. */
void jobs_pop_reply(const struct job_host *h, const struct jobs_pop_ops *ops,
                    const struct jobs_reply *r, const uint8_t *buf, const struct resp_msg *m,
                    struct resp_reply_plan *p);
/* Whether a pop's reply m carries a job (counted as a delivery when nothing reads it). */
bool jobs_pop_counted(const struct jobs_reply *r, const uint8_t *buf, const struct resp_msg *m);

/* ---- transactions ------------------------------------------------------------------------ */

/* The first pass sees each queued command; the second plans command i. */
typedef void (*jobs_tx_first_fn)(void *st, const struct rprof_cmdview *cv);
typedef int (*jobs_tx_cmd_fn)(void *st, const struct rprof_cmdview *cv, size_t i,
                              struct resp_tx_plan *p);

/* Walks the transaction in buf[off..len) twice (framework.h's transaction()): 1 planned, 0 its
 * EXEC not here yet, -1 not planned.  *scan gets the first pass's findings. */
int jobs_tx_walk(const uint8_t *buf, size_t len, size_t off, uint64_t max_bulk,
                 struct rprof_tx *scan, jobs_tx_first_fn first, jobs_tx_cmd_fn each, void *st,
                 struct resp_tx_plan *p);

/* Queued command q is kept back: EXEC's array gets `answer` (n bytes) for it. */
void jobs_keep_back(struct resp_queued *q, const void *answer, size_t n);
/* ... with an answer made in a resp_bytes (one that could not be made is marked so). */
void jobs_keep_back_bytes(struct resp_queued *q, const struct resp_bytes *answer);
/* ... with Redis's integer reply for an ack (ZREM, HDEL, XACK...). */
void jobs_keep_back_count(struct resp_queued *q, const struct rprof_cmdview *cv);
/* Adds an ack command's plan a to the transaction's: kept back when all its acks are, later
 * acks and re-pushes to the own commands; the cut rules.  Whether q was kept back. */
bool jobs_tx_acks(struct jobs_acks *a, const struct rprof_cmdview *cv, struct resp_queued *q,
                  struct resp_tx_plan *p);

#endif
