/*
 * bullmq.c - BullMQ as a framework module (proto/jobs/framework.h): publish, deliver, ack and
 * lease read out of its Lua scripts' calls and replies (proto/resp/resp_bullmq.h), and the faults
 * on them planned the way BullMQ itself produces them (docs/redis.md, "BullMQ").
 *
 * BullMQ sends each script once per connection with EVAL, its body whole, and by its sha1 after
 * that (EVALSHA).  Which sha is which script the host learns from the bodies this module
 * recognises (and from SCRIPT LOAD); an EVALSHA of a sha never seen with a body is relayed as it
 * is.
 *
 * A job is remembered by its key, <prefix><id> ("bull:orders:17"): BullMQ's ids restart per
 * queue, its keys do not.
 *
 * The faults, each one BullMQ would make itself:
 *   duplicate on deliver  the job is moved back to wait at once, as the stalled-job checker moves
 *                         a job whose lock is gone, and the first worker's renewals of it
 *                         answered, never applied: another worker takes it while the first still
 *                         runs it, and the first one's completion is refused ("Lock mismatch").
 *   drop on deliver       the worker is answered "no job": the job stays active, locked, never
 *                         renewed, and stalls.
 *   redeliver/drop on ack the completion is answered as BullMQ's script answers it (0) but not
 *                         applied: the lock lapses and the stalled checker hands the job out
 *                         again.
 *   delay on ack          answered at once, applied D later (without fetching a next job).
 *   drop/delay on lease   the renewal is answered as if it succeeded, and not applied, or
 *                         applied D later: the lock lapses while the worker still runs.
 *   drop/delay on publish as on the other profiles.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/msgpack.h"
#include "proto/jobs/common.h"
#include "proto/resp/resp_bullmq.h"

/* The replies this module reads (struct resp_reply_tag.kind). */
enum {
    BMQ_R_ADD = 1, /* an add: the job's id */
    BMQ_R_NEXT,    /* moveToActive: the job a worker takes, or none */
    BMQ_R_FINISH,  /* moveToFinished: done, refused, or done with the next job */
    BMQ_R_RETRY,   /* moveToDelayed fetching the next job */
};

/* What a reply is read with (the tag's state). */
struct bmq_pending {
    char prefix[BMQ_PREFIX_MAX]; /* the queue's key prefix, "bull:orders:" */
    char id[BMQ_ID_MAX];         /* BMQ_R_FINISH: the job settled */
    char token[BMQ_TOKEN_MAX];   /* the worker's lock token (for a next job); "" unknown */
    char name[BMQ_NAME_MAX];     /* BMQ_R_ADD: the job's name */
    bool failed;                 /* BMQ_R_FINISH: failed for good */
};

#define BMQ_KEY_MAX (BMQ_PREFIX_MAX + BMQ_ID_MAX)

/* A job event with room for its strings. */
struct bmq_event {
    struct job_event ev;
    char queue[BMQ_QUEUE_MAX];
    char task[BMQ_NAME_MAX];
};

/* ---- scripts and jobs ---------------------------------------------------------------------- */

/* The script a call runs: known by its body (EVAL, whose sha the host learns then) or by its
 * sha. */
static enum bmq_script call_script(const struct job_host *h, const struct rprof_cmdview *cv,
                                   const struct bmq_call *c)
{
    const uint8_t *p = cv->buf + c->script.off;
    size_t n = c->script.len;
    if (!c->eval)
        return (enum bmq_script)h->script_tag(h->ctx, p, n);
    enum bmq_script s = bmq_script_of(p, n);
    if (s != BMQ_SCRIPT_UNKNOWN)
        h->script_learn(h->ctx, p, n, (unsigned)s);
    return s;
}

/* A job's key, <prefix><id>: false when it does not fit. */
static bool job_key(const char *prefix, const char *id, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s%s", prefix, id);
    return n > 0 && (size_t)n < cap;
}

/* The event of kind for job id under prefix (key its job key), its task `name` when given, else
 * as its delivery left it in the memory. */
static void event_of(const struct job_host *h, struct bmq_event *b, enum job_ev kind,
                     const char *prefix, const char *id, const char *key, const char *name)
{
    memset(b, 0, sizeof(*b));
    b->ev.kind = kind;
    b->ev.id = id;
    b->ev.key = key;
    if (bmq_queue_of_prefix((const uint8_t *)prefix, strlen(prefix), b->queue, sizeof(b->queue)))
        b->ev.queue = b->queue;
    if (name != NULL && name[0] != '\0') {
        b->ev.task = name;
        return;
    }
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, key, strlen(key));
    if (in != NULL && in->task != NULL && strlen(in->task) < sizeof(b->task)) {
        memcpy(b->task, in->task, strlen(in->task) + 1);
        b->ev.task = b->task;
    }
    h->memo_unlock(h->ctx);
}

/* A line in the host's log about job `key`. */
static void say(const struct job_host *h, enum job_log_level level, const char *msg,
                const char *key, const char *reason)
{
    char fields[BMQ_KEY_MAX + 128];
    snprintf(fields, sizeof(fields), "job=%s reason=\"%s\"", key, reason);
    h->log(h->ctx, level, msg, fields);
}

/* The client's command cv with arguments at[0..n) replaced by val[i] (len[i] bytes), as one of
 * twice's own commands due ms from now. */
static bool own_with(struct resp_own *own, size_t *n_own, uint32_t ms,
                     const struct rprof_cmdview *cv, size_t n, const size_t *at,
                     const void *const *val, const size_t *len)
{
    size_t argc = cv->m->nelem;
    if (argc == 0 || argc > 4096)
        return false;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    bool ok = argv != NULL && lens != NULL;
    struct resp_view v;
    for (size_t i = 0; ok && i < argc; i++) {
        ok = rprof_arg(cv, i, &v);
        argv[i] = (const char *)cv->buf + v.off;
        lens[i] = v.len;
    }
    for (size_t i = 0; ok && i < n; i++) {
        ok = at[i] < argc;
        if (ok) {
            argv[at[i]] = val[i];
            lens[at[i]] = len[i];
        }
    }
    ok = ok && resp_plan_own(own, n_own, ms, argc, argv, lens);
    free(argv);
    free(lens);
    return ok;
}

/* The index in the command of the call's ARGV[i + 1]. */
static size_t argv_at(const struct bmq_call *c, size_t i)
{
    return 3 + c->numkeys + i;
}

/* The renewals of job `key` by lock token `token` from now on: never applied (lost), or applied
 * ms later (late).  A lease is lost as a worker loses it, for good: one renewal dropped does not
 * lapse BullMQ's lock (a worker renews every lockDuration / 4 to / 2), all of them do. */
static void mark_lease(const struct job_host *h, const char *key, const char *token, bool late,
                       uint32_t ms)
{
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, key, strlen(key));
    if (in != NULL) {
        in->flags &= ~(uint32_t)(JOB_MEMO_LEASE_LOST | JOB_MEMO_LEASE_LATE);
        in->flags |= late ? JOB_MEMO_LEASE_LATE : JOB_MEMO_LEASE_LOST;
        in->lease_ms = ms;
        job_memo_set(&in->id, token, strlen(token));
    }
    h->memo_unlock(h->ctx);
}

/* A `duplicate` on a delivery: the job is handed out again at once (bmq_requeue_cmd, on twice's
 * own connection), while this worker still runs it, as a second worker takes a job whose lock
 * lapsed; the renewals of this worker's token are answered and never applied, so that it
 * believes it still holds the job until the other worker has it (its lock then refuses them, and
 * this worker's completion). */
static void requeue_now(const struct job_host *h, struct resp_reply_plan *p, const char *prefix,
                        const char *id, const char *key, const char *token)
{
    char *keys = malloc(BMQ_REQUEUE_KEYS_MAX);
    const char *argv[BMQ_REQUEUE_ARGC];
    size_t lens[BMQ_REQUEUE_ARGC];
    bool fits =
        keys != NULL && bmq_requeue_cmd(prefix, id, keys, BMQ_REQUEUE_KEYS_MAX, argv, lens) != 0;
    const char *why = keys != NULL && !fits ? "key too long" : "out of memory";
    bool ok = fits && resp_plan_own(p->own, &p->n_own, 0, BMQ_REQUEUE_ARGC, argv, lens);
    free(keys);
    if (!ok) {
        say(h, JOB_LOG_WARN, "duplicate not made", key, why);
        return;
    }
    mark_lease(h, key, token, false, 0);
}

/* ---- deliveries ------------------------------------------------------------------------------ */

/* The job a reply hands a worker (moveToActive's, or a settle's that fetched the next one). */
static void on_next(const struct job_host *h, uint8_t kind, const struct bmq_pending *pd,
                    const uint8_t *buf, const struct resp_msg *m, struct resp_reply_plan *p)
{
    struct bmq_job bj;
    char key[BMQ_KEY_MAX];
    if (bmq_next_job(buf, m, &bj) != 1 || !job_key(pd->prefix, bj.id, key, sizeof(key)))
        return;
    /* The job's task for its later events; and a lease an earlier holder lost ends here: its
     * renewals go to Redis again, which refuses them (the lock is the new holder's), as BullMQ
     * refuses a worker whose lock lapsed. */
    char queue[BMQ_QUEUE_MAX];
    bool q =
        bmq_queue_of_prefix((const uint8_t *)pd->prefix, strlen(pd->prefix), queue, sizeof(queue));
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, key, strlen(key));
    if (in != NULL) {
        if (bj.name[0] != '\0' && (in->task == NULL || strcmp(in->task, bj.name) != 0))
            job_memo_set(&in->task, bj.name, strlen(bj.name));
        if (q && in->queue == NULL)
            job_memo_set(&in->queue, queue, strlen(queue));
        in->flags &= ~(uint32_t)(JOB_MEMO_LEASE_LOST | JOB_MEMO_LEASE_LATE);
    }
    h->memo_unlock(h->ctx);
    if (bj.deferred_failure)
        return; /* stalled past maxStalledCount: its worker fails it unrun (journaled then) */
    struct bmq_event b;
    event_of(h, &b, JOB_EV_DELIVER, pd->prefix, bj.id, key, bj.name);
    /* A job the stalled checker moved back comes with its `stc` up; the attempts that failed
     * before (`atm`) are the app's retries. */
    b.ev.redelivered = bj.stalled > 0;
    b.ev.retries = bj.attempts_made;
    h->record(h->ctx, JOB_REC_DELIVER, &b.ev);
    struct job_fault f = h->decide(h->ctx, &b.ev);
    switch (f.kind) {
    case JOB_FAULT_DUPLICATE:
        requeue_now(h, p, pd->prefix, bj.id, key, pd->token);
        break;
    case JOB_FAULT_DROP:
        /* As moveToActive answers when there is nothing to do; a settle with no next job. */
        p->replace = true;
        if (kind == BMQ_R_NEXT)
            resp_bytes_add(&p->bytes, "*4\r\n:0\r\n:0\r\n:0\r\n:0\r\n", 20);
        else
            resp_bytes_int(&p->bytes, 0);
        break;
    case JOB_FAULT_DELAY:
        p->delay_ms = f.ms;
        break;
    case JOB_FAULT_CLOSE:
        p->cut = f.rule;
        p->cut_before = f.before;
        break;
    default:
        break;
    }
}

/* ---- settles --------------------------------------------------------------------------------- */

/* BullMQ's name for a moveToFinished error code. */
static const char *finish_refusal(int64_t code)
{
    return code == -2   ? "missing lock"
           : code == -6 ? "lock held by another worker"
           : code == -3 ? "job not active"
                        : "other";
}

/* A moveToFinished that Redis answered: journaled when it applied (0, or the next job), logged
 * when BullMQ refused it (a negative code: -2 its lock is gone, -6 another worker holds it). */
static void on_finish(const struct job_host *h, const struct bmq_pending *pd, const uint8_t *buf,
                      const struct resp_msg *m, struct resp_reply_plan *p)
{
    char key[BMQ_KEY_MAX];
    int64_t code = 0;
    if (!job_key(pd->prefix, pd->id, key, sizeof(key)))
        return;
    bool integer = bmq_finish_code(buf, m, &code);
    bool refused = integer && code < 0;
    if (refused) {
        char fields[BMQ_KEY_MAX + 96];
        snprintf(fields, sizeof(fields), "job=%s code=%lld reason=\"%s\"", key, (long long)code,
                 finish_refusal(code));
        h->log(h->ctx, JOB_LOG_INFO, "bullmq settle refused", fields);
    }
    if (m->type == '-')
        return;
    /* A refused completion is journaled too, marked: BullMQ did not apply it, but the worker
     * had finished its run of the job then, which the verdict needs to know (did a copy run
     * beside it?). */
    struct bmq_event b;
    event_of(h, &b, JOB_EV_ACK, pd->prefix, pd->id, key, NULL);
    b.ev.refused = refused;
    h->record(h->ctx, pd->failed ? JOB_REC_NACK : JOB_REC_ACK, &b.ev);
    if (refused)
        return;
    h->memo_lock(h->ctx);
    h->memo_del(h->ctx, key, strlen(key));
    h->memo_unlock(h->ctx);
    if (!integer)
        on_next(h, BMQ_R_FINISH, pd, buf, m, p);
}

/* A tag for a reply read with a copy of pd; false when out of memory (the reply is not read). */
static bool tag_reply(struct resp_cmd_plan *p, uint8_t kind, const struct bmq_pending *pd)
{
    struct bmq_pending *c = malloc(sizeof(*c));
    if (c == NULL)
        return false;
    *c = *pd;
    p->reply.kind = kind;
    p->reply.state = c;
    return true;
}

/* The fault's plan for a cut of the command: before (kept from Redis) or after its reply. */
static void plan_cut(struct resp_cmd_plan *p, const struct job_fault *f)
{
    if (f->before)
        p->fate = RESP_CMD_CUT;
    p->cut = f->rule;
}

/* moveToFinished: decided before Redis sees it. */
static void command_finish(const struct job_host *h, const struct rprof_cmdview *cv,
                           const struct bmq_call *c, struct resp_cmd_plan *p)
{
    struct bmq_pending pd;
    memset(&pd, 0, sizeof(pd));
    bool fetch_next = false;
    if (bmq_finish_args(cv, c, pd.id, sizeof(pd.id), &pd.failed, &fetch_next) != 0 ||
        !bmq_call_prefix(cv, c, BMQ_MOVE_TO_FINISHED, pd.prefix, sizeof(pd.prefix)))
        return;
    if (!h->needed) {
        h->count(h->ctx, JOB_EV_ACK);
        return;
    }
    if (!bmq_call_token(cv, c, BMQ_MOVE_TO_FINISHED, pd.token, sizeof(pd.token)))
        pd.token[0] = '\0';
    char key[BMQ_KEY_MAX];
    struct job_fault f = {.kind = JOB_FAULT_NONE};
    if (job_key(pd.prefix, pd.id, key, sizeof(key))) {
        struct bmq_event b;
        event_of(h, &b, JOB_EV_ACK, pd.prefix, pd.id, key, NULL);
        f = h->decide(h->ctx, &b.ev);
        /* An ack twice keeps back is journaled now: Redis never answers it.  Marked kept back
         * when it is never applied: BullMQ recorded no completion, nor failure. */
        b.ev.kept_back = f.kind == JOB_FAULT_REDELIVER || f.kind == JOB_FAULT_DROP;
        if (f.kind != JOB_FAULT_NONE && f.kind != JOB_FAULT_CLOSE)
            h->record(h->ctx, pd.failed ? JOB_REC_NACK : JOB_REC_ACK, &b.ev);
    }
    if (f.kind == JOB_FAULT_DELAY) {
        /* Applied later on twice's own connection, fetching no job: one fetched there would be
         * locked for a worker that never sees it. */
        size_t at = argv_at(c, 5);
        const void *val = "0";
        size_t vlen = 1;
        if (!own_with(p->own, &p->n_own, f.ms, cv, 1, &at, &val, &vlen)) {
            say(h, JOB_LOG_WARN, "ack not kept back", key, "out of memory");
            resp_cmd_plan_free(p);
            f.kind = JOB_FAULT_NONE;
        }
    }
    switch (f.kind) {
    case JOB_FAULT_REDELIVER:
    case JOB_FAULT_DROP:
    case JOB_FAULT_DELAY:
        /* As moveToFinished answers a job it finished without fetching another. */
        p->fate = RESP_CMD_ANSWER;
        resp_bytes_int(&p->bytes, 0);
        return;
    case JOB_FAULT_CLOSE:
        plan_cut(p, &f);
        if (f.before)
            return;
        break;
    default:
        break;
    }
    (void)tag_reply(p, BMQ_R_FINISH, &pd);
}

/* retryJob, moveToDelayed: a failed attempt BullMQ runs again (its `attempts` not used up),
 * journaled as the app's retry.  Forwarded; moveToDelayed may bring the next job. */
static void command_retry(const struct job_host *h, const struct rprof_cmdview *cv,
                          const struct bmq_call *c, enum bmq_script s, struct resp_cmd_plan *p)
{
    bool fetch_next = false;
    struct bmq_pending pd;
    memset(&pd, 0, sizeof(pd));
    char key[BMQ_KEY_MAX];
    if (!h->needed || bmq_retry_args(cv, c, s, pd.id, sizeof(pd.id), &fetch_next) != 0 ||
        !bmq_call_prefix(cv, c, s, pd.prefix, sizeof(pd.prefix)) ||
        !job_key(pd.prefix, pd.id, key, sizeof(key)))
        return;
    struct bmq_event b;
    event_of(h, &b, JOB_EV_NACK, pd.prefix, pd.id, key, NULL);
    b.ev.retry = true;
    h->record(h->ctx, JOB_REC_NACK, &b.ev);
    if (!fetch_next)
        return;
    if (!bmq_call_token(cv, c, s, pd.token, sizeof(pd.token)))
        pd.token[0] = '\0';
    pd.id[0] = '\0';
    (void)tag_reply(p, BMQ_R_RETRY, &pd);
}

/* moveToActive: its reply is the job a worker takes. */
static void command_active(const struct job_host *h, const struct rprof_cmdview *cv,
                           const struct bmq_call *c, struct resp_cmd_plan *p)
{
    struct bmq_pending pd;
    memset(&pd, 0, sizeof(pd));
    if (!h->needed || !bmq_call_prefix(cv, c, BMQ_MOVE_TO_ACTIVE, pd.prefix, sizeof(pd.prefix)))
        return;
    if (!bmq_call_token(cv, c, BMQ_MOVE_TO_ACTIVE, pd.token, sizeof(pd.token)))
        pd.token[0] = '\0';
    (void)tag_reply(p, BMQ_R_NEXT, &pd);
}

/* ---- leases ------------------------------------------------------------------------------- */

enum { LEASE_KEEP, LEASE_DROP, LEASE_LATE };

struct lease_walk {
    const struct job_host *h;
    const char *prefix;
    uint8_t *fate; /* per element of the call */
    uint32_t n;
    size_t dropped, late;
    uint32_t late_ms;
    struct job_fault close_before, close_after;
};

static void lease_fate(struct lease_walk *w, uint32_t k, uint8_t fate, uint32_t ms)
{
    w->fate[k] = fate;
    if (fate == LEASE_DROP)
        w->dropped++;
    if (fate == LEASE_LATE) {
        w->late++;
        if (ms > w->late_ms)
            w->late_ms = ms;
    }
}

/* One job of a renewal: its `lease` event, or the loss an earlier fault on its lease made. */
static void lease_one(void *arg, uint32_t k, const char *id, const char *token)
{
    struct lease_walk *w = arg;
    const struct job_host *h = w->h;
    char key[BMQ_KEY_MAX];
    if (k >= w->n || !job_key(w->prefix, id, key, sizeof(key)))
        return;
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, key, strlen(key));
    uint32_t marks = in != NULL && in->id != NULL && token[0] != '\0' && strcmp(in->id, token) == 0
                         ? in->flags & (JOB_MEMO_LEASE_LOST | JOB_MEMO_LEASE_LATE)
                         : 0;
    uint32_t ms = in != NULL ? in->lease_ms : 0;
    h->memo_unlock(h->ctx);
    if (marks != 0) {
        /* Counted, not decided: the lease was lost already (a rule's one fault on the job, or
         * a duplicate of its delivery). */
        h->count(h->ctx, JOB_EV_LEASE);
        lease_fate(w, k, (marks & JOB_MEMO_LEASE_LOST) ? LEASE_DROP : LEASE_LATE, ms);
        return;
    }
    struct bmq_event b;
    event_of(h, &b, JOB_EV_LEASE, w->prefix, id, key, NULL);
    struct job_fault f = h->decide(h->ctx, &b.ev);
    switch (f.kind) {
    case JOB_FAULT_DROP:
        mark_lease(h, key, token, false, 0);
        lease_fate(w, k, LEASE_DROP, 0);
        break;
    case JOB_FAULT_DELAY:
        mark_lease(h, key, token, true, f.ms);
        lease_fate(w, k, LEASE_LATE, f.ms);
        break;
    case JOB_FAULT_CLOSE:
        if (f.before && w->close_before.rule == NULL)
            w->close_before = f;
        else if (!f.before && w->close_after.rule == NULL)
            w->close_after = f;
        break;
    default:
        break;
    }
}

/* The renewal with only its elements of fate `which`, appended to b: extendLocks with its
 * tokens and ids packed anew, extendLock as it was. */
static bool lease_subset(struct resp_bytes *b, const struct rprof_cmdview *cv,
                         const struct bmq_call *c, enum bmq_script s, const uint8_t *fate,
                         uint32_t n, uint8_t which)
{
    if (s == BMQ_EXTEND_LOCK) {
        resp_bytes_add(b, cv->buf, cv->len);
        return !b->oom;
    }
    struct resp_view tv, iv;
    if (!bmq_arg(cv, c, 1, &tv) || !bmq_arg(cv, c, 2, &iv))
        return false;
    bool *keep = calloc(n > 0 ? n : 1, sizeof(*keep));
    uint8_t *tok = malloc(tv.len + 5), *ids = malloc(iv.len + 5);
    bool ok = keep != NULL && tok != NULL && ids != NULL;
    for (uint32_t k = 0; ok && k < n; k++)
        keep[k] = fate[k] == which;
    long tl = ok ? mp_array_subset(cv->buf + tv.off, tv.len, keep, n, tok, tv.len + 5) : -1;
    long il = ok ? mp_array_subset(cv->buf + iv.off, iv.len, keep, n, ids, iv.len + 5) : -1;
    ok = tl > 0 && il > 0;
    size_t argc = cv->m->nelem;
    const char **argv = ok ? calloc(argc, sizeof(*argv)) : NULL;
    size_t *lens = ok ? calloc(argc, sizeof(*lens)) : NULL;
    ok = ok && argv != NULL && lens != NULL;
    struct resp_view v;
    for (size_t i = 0; ok && i < argc; i++) {
        ok = rprof_arg(cv, i, &v);
        argv[i] = (const char *)cv->buf + v.off;
        lens[i] = v.len;
    }
    if (ok && argv_at(c, 2) < argc) {
        argv[argv_at(c, 1)] = (const char *)tok;
        lens[argv_at(c, 1)] = (size_t)tl;
        argv[argv_at(c, 2)] = (const char *)ids;
        lens[argv_at(c, 2)] = (size_t)il;
        resp_bytes_command(b, argc, argv, lens);
        ok = !b->oom;
    } else {
        ok = false;
    }
    free(argv);
    free(lens);
    free(keep);
    free(tok);
    free(ids);
    return ok;
}

/* The number of jobs a renewal names: extendLocks' packed ids, extendLock's one; 0 when they do
 * not read. */
static uint32_t lease_count(const struct rprof_cmdview *cv, const struct bmq_call *c,
                            enum bmq_script s)
{
    struct resp_view iv;
    if (s == BMQ_EXTEND_LOCK)
        return 1;
    if (!bmq_arg(cv, c, 2, &iv) || iv.type != '$' || iv.null)
        return 0;
    size_t pos = 0;
    struct mp_item arr;
    if (mp_next(cv->buf + iv.off, iv.len, &pos, &arr) == 0 && arr.type == MP_ARRAY &&
        arr.count <= iv.len)
        return arr.count;
    return 0;
}

/* The plan of a renewal once each job's fate is known: forwarded whole, without the renewals
 * kept back, or answered by twice when it keeps them all back. */
static void lease_plan(const struct job_host *h, const struct rprof_cmdview *cv,
                       const struct bmq_call *c, enum bmq_script s, struct lease_walk *w,
                       struct resp_cmd_plan *p)
{
    if (w->late > 0) {
        struct resp_bytes later = {0};
        if (!lease_subset(&later, cv, c, s, w->fate, w->n, LEASE_LATE) ||
            !resp_plan_own_raw(p->own, &p->n_own, w->late_ms, later.p, later.len, 1)) {
            char fields[96];
            snprintf(fields, sizeof(fields), "reason=\"out of memory\" jobs=%zu", w->late);
            h->log(h->ctx, JOB_LOG_WARN, "renewal not delayed", fields);
        }
        resp_bytes_free(&later);
    }
    size_t held = w->dropped + w->late;
    if (held == w->n) {
        /* Every renewal kept back: answered as one that renewed them all. */
        p->fate = RESP_CMD_ANSWER;
        if (s == BMQ_EXTEND_LOCKS)
            resp_bytes_add(&p->bytes, "*0\r\n", 4);
        else
            resp_bytes_int(&p->bytes, 1);
    } else if (held > 0) {
        p->fate = RESP_CMD_REWRITE;
        if (!lease_subset(&p->bytes, cv, c, s, w->fate, w->n, LEASE_KEEP)) {
            h->log(h->ctx, JOB_LOG_WARN, "renewal not kept back",
                   "reason=\"cannot rewrite the call\"");
            resp_bytes_free(&p->bytes);
            p->fate = RESP_CMD_FORWARD;
        }
    }
    if (w->close_after.rule != NULL)
        p->cut = w->close_after.rule;
}

/* extendLocks / extendLock: each job's renewal decided. */
static void command_lease(const struct job_host *h, const struct rprof_cmdview *cv,
                          const struct bmq_call *c, enum bmq_script s, struct resp_cmd_plan *p)
{
    char prefix[BMQ_PREFIX_MAX];
    if (!h->needed || !bmq_call_prefix(cv, c, s, prefix, sizeof(prefix))) {
        h->count(h->ctx, JOB_EV_LEASE);
        return;
    }
    struct lease_walk w = {.h = h, .prefix = prefix, .n = lease_count(cv, c, s)};
    w.fate = calloc(w.n > 0 ? w.n : 1, 1);
    uint32_t count = 0;
    if (w.fate != NULL && w.n > 0 && bmq_lock_each(cv, c, s, lease_one, &w, &count) == 0 &&
        count == w.n) {
        if (w.close_before.rule != NULL)
            plan_cut(p, &w.close_before);
        else
            lease_plan(h, cv, c, s, &w, p);
    }
    free(w.fate);
}

/* ---- publishes ---------------------------------------------------------------------------- */

/* An add that a rule keeps from Redis: journaled, and answered with the job's id (its own, or
 * one BullMQ's counter never gives when it had none). */
static void add_dropped(const struct job_host *h, struct bmq_event *b, const struct job_fault *f,
                        struct resp_cmd_plan *p)
{
    char made[64];
    if (b->ev.id == NULL) {
        snprintf(made, sizeof(made), "twice-dropped-%llu-%llu", (unsigned long long)h->session,
                 (unsigned long long)h->next_seq(h->ctx));
        b->ev.id = made;
    }
    h->note(h->ctx, f, &b->ev);
    h->record(h->ctx, JOB_REC_PUBLISH, &b->ev);
    p->fate = RESP_CMD_ANSWER;
    resp_bytes_bulk(&p->bytes, b->ev.id, strlen(b->ev.id));
}

/* An add script: decided before Redis sees it, with the job's own id when the app chose one
 * (BullMQ's counter gives it otherwise, in the reply, where it is journaled). */
static void command_add(const struct job_host *h, const struct rprof_cmdview *cv,
                        const struct bmq_call *c, bool decided, struct resp_cmd_plan *p)
{
    struct bmq_job bj;
    bool wants = !decided && h->wants(h->ctx, JOB_EV_PUBLISH);
    if ((!h->needed && !wants) || bmq_add_args(cv, c, &bj) != 0) {
        if (!decided)
            h->count(h->ctx, JOB_EV_PUBLISH);
        return;
    }
    struct job_fault f = {.kind = JOB_FAULT_NONE};
    if (wants) {
        /* The job's key (the `key` matcher) when the app chose its id; BullMQ's counter gives
         * the others theirs in the reply. */
        char key[BMQ_KEY_MAX];
        bool keyed = bj.id[0] != '\0' && job_key(bj.prefix, bj.id, key, sizeof(key));
        struct bmq_event b = {.ev = {.kind = JOB_EV_PUBLISH, .key = keyed ? key : NULL}};
        b.ev.id = bj.id[0] != '\0' ? bj.id : NULL;
        b.ev.task = bj.name[0] != '\0' ? bj.name : NULL;
        b.ev.queue = bj.queue[0] != '\0' ? bj.queue : NULL;
        f = h->decide_unnoted(h->ctx, &b.ev);
        if (f.kind == JOB_FAULT_DROP) {
            add_dropped(h, &b, &f, p);
            return;
        }
        if (f.kind != JOB_FAULT_NONE)
            h->note(h->ctx, &f, &b.ev);
        if (f.kind == JOB_FAULT_DELAY) {
            p->fate = RESP_CMD_HOLD;
            p->hold_ms = f.ms;
            return;
        }
        if (f.kind == JOB_FAULT_CLOSE) {
            plan_cut(p, &f);
            if (f.before)
                return;
        }
    } else if (!decided) {
        h->count(h->ctx, JOB_EV_PUBLISH);
    }
    struct bmq_pending pd;
    memset(&pd, 0, sizeof(pd));
    memcpy(pd.prefix, bj.prefix, sizeof(pd.prefix));
    memcpy(pd.name, bj.name, sizeof(pd.name));
    (void)tag_reply(p, BMQ_R_ADD, &pd);
}

/* The add of pd answered v (its reply, or its element of EXEC's): journaled as a publish with
 * the id BullMQ gave the job. */
static void journal_add(const struct job_host *h, const struct bmq_pending *pd, const uint8_t *buf,
                        const struct resp_view *v)
{
    char id[BMQ_ID_MAX], queue[BMQ_QUEUE_MAX];
    if (bmq_add_reply(buf, v, id, sizeof(id)) != 1)
        return;
    struct job_event ev = {.kind = JOB_EV_PUBLISH, .id = id};
    ev.task = pd->name[0] != '\0' ? pd->name : NULL;
    if (bmq_queue_of_prefix((const uint8_t *)pd->prefix, strlen(pd->prefix), queue, sizeof(queue)))
        ev.queue = queue;
    h->record(h->ctx, JOB_REC_PUBLISH, &ev);
}

/* ---- the module ------------------------------------------------------------------------------ */

/* SCRIPT LOAD of a body this module knows: its sha learnt. */
static void script_load(const struct job_host *h, const struct rprof_cmdview *cv)
{
    struct resp_view sub, body;
    if (rprof_arg(cv, 1, &sub) && rprof_arg_is(cv, &sub, "LOAD") && rprof_arg(cv, 2, &body) &&
        body.type == '$' && !body.null) {
        enum bmq_script s = bmq_script_of(cv->buf + body.off, body.len);
        if (s != BMQ_SCRIPT_UNKNOWN)
            h->script_learn(h->ctx, cv->buf + body.off, body.len, (unsigned)s);
    }
}

static int bmq_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                       struct resp_cmd_plan *p)
{
    if (cv->id == RPROF_CMD_SCRIPT) {
        script_load(h, cv);
        return 1;
    }
    if (cv->id != RPROF_CMD_EVAL && cv->id != RPROF_CMD_EVALSHA)
        return 0;
    struct bmq_call c;
    enum bmq_script s = bmq_call_of(cv, &c) ? call_script(h, cv, &c) : BMQ_SCRIPT_UNKNOWN;
    switch (s) {
    case BMQ_ADD_STANDARD:
    case BMQ_ADD_DELAYED:
    case BMQ_ADD_PRIORITIZED:
    case BMQ_ADD_PARENT:
        command_add(h, cv, &c, decided, p);
        break;
    case BMQ_MOVE_TO_ACTIVE:
        command_active(h, cv, &c, p);
        break;
    case BMQ_MOVE_TO_FINISHED:
        command_finish(h, cv, &c, p);
        break;
    case BMQ_RETRY_JOB:
    case BMQ_MOVE_TO_DELAYED:
        command_retry(h, cv, &c, s, p);
        break;
    case BMQ_EXTEND_LOCK:
    case BMQ_EXTEND_LOCKS:
        command_lease(h, cv, &c, s, p);
        break;
    default:
        break;
    }
    return 1;
}

static void bmq_reply(const struct job_host *h, const struct resp_reply_tag *tag,
                      const uint8_t *buf, const struct resp_msg *m, struct resp_reply_plan *p)
{
    const struct bmq_pending *pd = tag->state;
    if (pd == NULL)
        return;
    switch (tag->kind) {
    case BMQ_R_ADD:
        journal_add(h, pd, buf, &m->value);
        break;
    case BMQ_R_NEXT:
    case BMQ_R_RETRY:
        on_next(h, tag->kind, pd, buf, m, p);
        break;
    case BMQ_R_FINISH:
        on_finish(h, pd, buf, m, p);
        break;
    default:
        break;
    }
}

/* An add script queued in a transaction (FlowProducer.add): counted as a publish (not decided:
 * no rule acts on it), and journaled from its element of EXEC's reply. */
static struct resp_reply_tag queued_add(const struct job_host *h, const struct rprof_cmdview *cv)
{
    struct resp_reply_tag none = {0};
    struct bmq_call c;
    struct bmq_job bj;
    if (cv->id != RPROF_CMD_EVAL && cv->id != RPROF_CMD_EVALSHA)
        return none;
    if (!bmq_call_of(cv, &c) || !bmq_script_adds(call_script(h, cv, &c)))
        return none;
    h->count(h->ctx, JOB_EV_PUBLISH); /* seen, not decided: see docs/limits.md */
    struct bmq_pending *pd;
    if (!h->journal || bmq_add_args(cv, &c, &bj) != 0 || (pd = calloc(1, sizeof(*pd))) == NULL)
        return none;
    memcpy(pd->prefix, bj.prefix, sizeof(pd->prefix));
    memcpy(pd->name, bj.name, sizeof(pd->name));
    return (struct resp_reply_tag){.kind = BMQ_R_ADD, .state = pd};
}

static int tx_command(void *st, const struct rprof_cmdview *cv, size_t i, struct resp_tx_plan *p)
{
    p->cmds[i].tag = queued_add(st, cv);
    return 0;
}

static int bmq_transaction(const struct job_host *h, const uint8_t *buf, size_t len, size_t off,
                           uint64_t max_bulk, struct resp_tx_plan *p)
{
    struct rprof_tx scan;
    return jobs_tx_walk(buf, len, off, max_bulk, &scan, NULL, tx_command, (void *)h, p);
}

/* A flow's adds are journaled from EXEC's reply. */
static bool bmq_tx_judged(const struct job_host *h)
{
    return h->journal;
}

static void bmq_element(const struct job_host *h, const struct resp_reply_tag *tag,
                        const uint8_t *buf, const struct resp_view *v)
{
    if (tag->kind == BMQ_R_ADD && tag->state != NULL)
        journal_add(h, tag->state, buf, v);
}

static void bmq_free_state(uint8_t kind, void *state)
{
    (void)kind;
    free(state);
}

const struct resp_framework resp_framework_bullmq = {
    .name = "bullmq",
    .prof = RPROF_BULLMQ,
    .command = bmq_command,
    .reply = bmq_reply,
    .transaction = bmq_transaction,
    .tx_judged = bmq_tx_judged,
    .element = bmq_element,
    .free_state = bmq_free_state,
};
