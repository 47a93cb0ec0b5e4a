/*
 * rq.c - RQ as a framework module (proto/jobs/framework.h; docs/redis.md, "RQ"): the enqueue
 * transaction saves the job's hash (HSET rq:job:ID) and pushes its id onto rq:queue:NAME; a
 * worker pops the id (BLPOP, LMOVE), reads the hash (HGETALL), runs the job in a work horse and
 * settles it with ZREM rq:wip:NAME ID (in a transaction).
 *
 * While a work horse runs a job, RQ's worker renews the job's entry in the started registry
 * every job_monitoring_interval (30 s by default): ZADD rq:wip:NAME XX NOW+TTL ID with
 * HSET rq:job:ID last_heartbeat T, in one MULTI ... EXEC (rq/worker.py, maintain_heartbeats).
 * An entry whose score has passed is reaped by StartedJobRegistry.cleanup, which every reader
 * of the registry runs: the job is requeued when it has retries left, else moved to the failed
 * registry, whether or not its horse still runs.
 *
 *   redeliver on ack     the ZREM kept back (answered as applied) and the id pushed back onto
 *                        its queue on twice's own connection (`after D`: that much later).
 *   drop on lease        the renewal (and the job hash's last_heartbeat beside it) is answered
 *                        as Redis answers it (0: no member added) and never applied, and so are
 *                        this connection's later renewals of the job: the entry lapses while
 *                        the job runs.
 *   delay on lease       applied D later on twice's own connection, this renewal and the later
 *                        ones.
 *
 * A lease is lost per worker connection and job (the session's state): a worker renews one job
 * at a time (it runs one horse), so the session remembers the one job whose lease it lost until
 * the connection pops its next job, and a renewal of another job by it is decided anew.
 *
 * RQ's failed registry, ZADD rq:failed:NAME SCORE ID, is journaled as a NACK without retry: the
 * job failed for good, or its lease lapsed and the registry's cleanup moved it there (an ACK
 * after that NACK is its horse finishing after all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/common.h"

/* Jobs saved as ones that ran that a transaction's first pass remembers: RQ's retry of one job,
 * or its registry cleanup and scheduler retrying a few in one pipeline. */
#define RQ_RAN_MAX 16

/* The session's state: the job whose lease this connection lost, its renewals applied lost_ms
 * later (delay) or never (0). */
struct rq_state {
    char *lost;
    uint32_t lost_ms;
};

static void *rq_open(void)
{
    return calloc(1, sizeof(struct rq_state));
}

/* The connection popped a job: the lease it lost (if any) is over. */
static void forget_lease(struct rq_state *st)
{
    if (st == NULL)
        return;
    free(st->lost);
    st->lost = NULL;
}

static void rq_close(void *state)
{
    forget_lease(state);
    free(state);
}

/* What a transaction's first pass saw of RQ's job saves, for the pushes in it. */
struct rq_saved {
    char task[RPROF_TASK_MAX]; /* the task of the last job saved; "" when none */
    /* The transaction reaps lapsed jobs from a started registry (rprof_rq_reaps()): its pushes
     * are RQ handing out again jobs whose lease lapsed, not retries the app asked for. */
    bool reaps;
    /* The ids of jobs saved as ones that ran: their pushes are retries the app asked for.
     * Past RQ_RAN_MAX, later ones are not remembered. */
    char ran[RQ_RAN_MAX][RPROF_KEY_MAX];
    size_t n_ran;
};

/* ---- events ------------------------------------------------------------------------------ */

/* The event of a renewal, a failure or an ack of job `id` on registry key cv->key. */
static void rq_event(const struct job_host *h, struct jobs_ev *j, enum job_ev kind,
                     const struct rprof_cmdview *cv, const char *id)
{
    memset(j, 0, sizeof(*j));
    j->kind = kind;
    j->key = cv->key;
    j->id = jobs_dup(j, id);
    j->queue = rprof_queue_of(RPROF_RQ, cv->key);
    j->oom |= j->queue == NULL;
    j->task = jobs_known_task(h, j, id, strlen(id));
}

static bool view_id(const struct rprof_cmdview *cv, const struct resp_view *v, char *out,
                    size_t cap)
{
    return rprof_view_str(cv->buf, cv->len, v, out, cap) && out[0] != '\0';
}

/* RQ's move of job *idv into its failed registry: a NACK in the journal. */
static void journal_failed(const struct job_host *h, const struct rprof_cmdview *cv,
                           const struct resp_view *idv)
{
    char id[RPROF_KEY_MAX];
    if (!h->journal || !view_id(cv, idv, id, sizeof(id)))
        return;
    struct jobs_ev j;
    rq_event(h, &j, JOB_EV_NACK, cv, id);
    jobs_record(h, JOB_REC_NACK, &j);
    jobs_ev_clear(&j);
}

/* ---- leases ------------------------------------------------------------------------------- */

enum lease_fate { LEASE_KEEP, LEASE_DROP, LEASE_LATE };

/* What becomes of one renewal of a lease. */
struct lease {
    enum lease_fate fate;
    uint32_t ms;            /* LEASE_LATE: applied that much later */
    struct job_fault close; /* a `close` on it, before or after */
};

/* Renewal cv of job *idv: its `lease` event, or the loss an earlier fault on this connection
 * made. */
static struct lease lease_decide(const struct job_host *h, const struct rprof_cmdview *cv,
                                 const struct resp_view *idv)
{
    struct rq_state *st = h->state;
    struct lease f = {.fate = LEASE_KEEP, .close = {.kind = JOB_FAULT_NONE}};
    char id[RPROF_KEY_MAX];
    if (!view_id(cv, idv, id, sizeof(id)) || !h->needed) {
        h->count(h->ctx, JOB_EV_LEASE);
        return f;
    }
    if (st != NULL && st->lost != NULL && strcmp(st->lost, id) == 0) {
        /* Counted, not decided: this connection lost the job's lease already. */
        h->count(h->ctx, JOB_EV_LEASE);
        f.fate = st->lost_ms > 0 ? LEASE_LATE : LEASE_DROP;
        f.ms = st->lost_ms;
        return f;
    }
    struct jobs_ev j;
    rq_event(h, &j, JOB_EV_LEASE, cv, id);
    struct job_fault r = jobs_decide(h, &j);
    jobs_ev_clear(&j);
    if (r.kind == JOB_FAULT_DROP || r.kind == JOB_FAULT_DELAY) {
        size_t n = strlen(id);
        char *lost = st != NULL ? malloc(n + 1) : NULL;
        if (lost == NULL) {
            h->log(h->ctx, JOB_LOG_WARN, "lease fault not kept", "reason=\"out of memory\"");
            return f;
        }
        memcpy(lost, id, n + 1);
        free(st->lost);
        st->lost = lost;
        st->lost_ms = r.kind == JOB_FAULT_DELAY ? r.ms : 0;
        f.fate = r.kind == JOB_FAULT_DELAY ? LEASE_LATE : LEASE_DROP;
        f.ms = st->lost_ms;
    } else if (r.kind == JOB_FAULT_CLOSE) {
        f.close = r;
    }
    return f;
}

/* The renewal outside a transaction: forwarded, answered and kept back, or sent later. */
static void command_lease(const struct job_host *h, const struct rprof_cmdview *cv,
                          const struct resp_view *idv, struct resp_cmd_plan *p)
{
    struct lease f = lease_decide(h, cv, idv);
    if (f.close.kind == JOB_FAULT_CLOSE) {
        p->cut = f.close.rule;
        if (f.close.before)
            p->fate = RESP_CMD_CUT;
        return;
    }
    if (f.fate == LEASE_KEEP)
        return;
    if (f.fate == LEASE_LATE)
        (void)resp_plan_own_raw(p->own, &p->n_own, f.ms, cv->buf, cv->len, 1);
    /* ZADD XX of a member: 0 added, as Redis answers a renewal. */
    p->fate = RESP_CMD_ANSWER;
    resp_bytes_int(&p->bytes, 0);
}

/* ---- acks and publishes ----------------------------------------------------------------- */

static void ack_decide(const struct job_host *h, const struct rprof_cmdview *cv, const char *id,
                       struct jobs_ack_fate *f)
{
    struct jobs_ev j = {.kind = JOB_EV_ACK, .key = cv->key};
    j.id = jobs_dup(&j, id);
    j.queue = rprof_queue_of(RPROF_RQ, cv->key);
    j.oom |= j.queue == NULL;
    jobs_ack_decide(h, id, false, &j, true, f);
}

/* The acks of a ZREM rq:wip:NAME ID...; a redelivered id goes back onto rq:queue:NAME. */
static int plan_acks(const struct job_host *h, const struct rprof_cmdview *cv, size_t first,
                     struct jobs_acks *a)
{
    char list[RPROF_KEY_MAX + 16];
    bool wip = rprof_rq_queue_of_wip(cv->key, list, sizeof(list));
    return jobs_plan_acks(h, cv, first, ack_decide, wip ? list : NULL, a);
}

/* RQ's push of a job id onto its queue; its task from the job's hash, as the enqueue
 * transaction saved it or a worker read it, else the transaction's last saved task.  A push of
 * a job the transaction saved as one that ran is RQ's retry.  A `duplicate` adds the push again
 * to *copies. */
static struct job_fault publish(const struct job_host *h, const struct rprof_cmdview *cv,
                                const struct rq_saved *rq, struct resp_own *copies)
{
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    char id[RPROF_KEY_MAX];
    struct resp_view v;
    if (!rprof_arg(cv, 2, &v) || !rprof_view_str(cv->buf, cv->len, &v, id, sizeof(id)))
        return none;
    struct jobs_ev j = {.kind = JOB_EV_PUBLISH, .key = cv->key};
    j.id = jobs_dup(&j, id);
    j.queue = rprof_queue_of(RPROF_RQ, cv->key);
    j.oom |= j.queue == NULL;
    j.task = jobs_known_task(h, &j, id, strlen(id));
    if (j.task == NULL && rq != NULL && rq->task[0] != '\0') {
        /* An ack earlier in the transaction forgot the job (RQ's retry settles the job, saves
         * it again and pushes its id): its next delivery needs the task again. */
        j.task = jobs_dup(&j, rq->task);
        h->memo_lock(h->ctx);
        struct job_memo *in = h->memo_put(h->ctx, id, strlen(id));
        if (in != NULL && in->task == NULL)
            job_memo_set(&in->task, rq->task, strlen(rq->task));
        h->memo_unlock(h->ctx);
    }
    /* A job the started registry's cleanup requeues ran before too, but its lease lapsed: RQ
     * hands it out again, the app asked for nothing. */
    for (size_t i = 0; rq != NULL && !rq->reaps && i < rq->n_ran && !j.retry; i++)
        j.retry = strcmp(rq->ran[i], id) == 0;
    jobs_record(h, JOB_REC_PUBLISH, &j);
    struct job_fault f = jobs_decide(h, &j);
    jobs_ev_clear(&j);
    if (f.kind == JOB_FAULT_DUPLICATE) {
        const char *argv[3] = {cv->name, cv->key, (const char *)cv->buf + v.off};
        size_t lens[3] = {strlen(cv->name), strlen(cv->key), v.len};
        jobs_own_command(copies, 3, argv, lens);
    }
    return f;
}

/* ---- deliveries ---------------------------------------------------------------------------- */

static void rq_popped(const struct job_host *h, const struct jobs_reply *r, const char *list)
{
    (void)r;
    (void)list;
    forget_lease(h->state); /* the worker is on to its next job */
}

/* A popped id, with the task its job hash gave. */
static bool rq_job(const struct job_host *h, const char *list, const uint8_t *v, size_t n,
                   struct jobs_ev *j)
{
    if (n == 0 || n >= RPROF_KEY_MAX || (j->id = malloc(n + 1)) == NULL)
        return false;
    memcpy(j->id, v, n);
    j->id[n] = '\0';
    j->task = jobs_known_task(h, j, (const char *)v, n);
    j->queue = rprof_queue_of(RPROF_RQ, list);
    j->oom |= j->queue == NULL;
    return true;
}

static const struct jobs_pop_ops rq_pop = {.prof = RPROF_RQ, .popped = rq_popped, .job = rq_job};

/* RQ's job hash as a worker reads it: the task remembered for the id. */
static void rq_hash(const struct job_host *h, const struct jobs_reply *r, const uint8_t *buf,
                    const struct resp_msg *m)
{
    char *task = NULL;
    if (r->arg == NULL || rprof_rq_hash_task(buf, m, &task) != 0)
        return;
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, r->arg, strlen(r->arg));
    if (in != NULL && in->task == NULL)
        job_memo_set(&in->task, task, strlen(task));
    h->memo_unlock(h->ctx);
    free(task);
}

/* ---- the module ---------------------------------------------------------------------------- */

static int rq_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                      struct resp_cmd_plan *p)
{
    struct resp_view id;
    if (!decided && rprof_rq_lease(RPROF_RQ, cv, &id)) {
        command_lease(h, cv, &id, p);
        return 1;
    }
    if (!decided && rprof_rq_failed(RPROF_RQ, cv, &id))
        journal_failed(h, cv, &id); /* then on as any command */
    size_t first;
    if (rprof_ack_args(RPROF_RQ, cv, &first)) {
        struct jobs_acks a;
        if (plan_acks(h, cv, first, &a) == 0)
            jobs_acks_plan(&a, cv, p);
        jobs_acks_free(&a);
        return 1;
    }
    if (!decided && rprof_publish_of(RPROF_RQ, cv) == RPROF_PUB_RQ_ID) {
        struct resp_own copies = {0};
        struct job_fault f = publish(h, cv, NULL, &copies);
        struct resp_bytes one = {0};
        resp_bytes_int(&one, 1);
        jobs_publish_plan(h, RPROF_RQ, cv, &f, &one, &copies, p);
        resp_bytes_free(&one);
        resp_bytes_free(&copies.cmds);
        return 1;
    }
    if (!rprof_cmd_matters(RPROF_RQ, cv->id))
        return 0;
    (void)jobs_tag_reply(h, RPROF_RQ, cv, &p->reply);
    return 1;
}

static void rq_reply(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                     const struct resp_msg *m, struct resp_reply_plan *p)
{
    if (tag->state == NULL)
        return;
    if (tag->kind == RPROF_REPLY_POP)
        jobs_pop_reply(h, &rq_pop, tag->state, buf, m, p);
    else if (tag->kind == RPROF_REPLY_RQ_HASH)
        rq_hash(h, tag->state, buf, m);
}

/* ---- transactions ------------------------------------------------------------------------- */

struct rq_tx {
    const struct job_host *h;
    struct rq_saved saved;
    /* The job hash's half of a heartbeat (HSET rq:job:ID last_heartbeat T), seen before the
     * renewal that follows it in the same transaction (rq/job.py, Job.heartbeat): kept back
     * with it. */
    bool beat;
    size_t beat_idx;
    struct rprof_cmdview beat_cv;
    struct resp_msg beat_m;
};

/* The first pass: what RQ's saves of jobs say, remembered for their ids. */
static void tx_first(void *st, const struct rprof_cmdview *cv)
{
    struct rq_tx *t = st;
    const struct job_host *h = t->h;
    const char *id;
    char *task;
    if (rprof_rq_reaps(RPROF_RQ, cv))
        t->saved.reaps = true;
    if (!rprof_rq_job_saved(RPROF_RQ, cv, &id, &task))
        return;
    snprintf(t->saved.task, sizeof(t->saved.task), "%s", task);
    if (rprof_rq_job_ran(RPROF_RQ, cv) && t->saved.n_ran < RQ_RAN_MAX)
        snprintf(t->saved.ran[t->saved.n_ran++], sizeof(t->saved.ran[0]), "%s", id);
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, id, strlen(id));
    if (in != NULL)
        job_memo_set(&in->task, task, strlen(task));
    h->memo_unlock(h->ctx);
    free(task);
}

/* The job heartbeat of the beat, sent late: only onto a job hash still there, as RQ's worker
 * deletes a hash its heartbeat made (maintain_heartbeats): one deleted or expired meanwhile
 * stays gone. */
static const char LATE_BEAT_LUA[] = "if redis.call('EXISTS', KEYS[1]) == 1 then "
                                    "return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end "
                                    "return 0";

static bool late_beat(struct resp_bytes *b, const struct rprof_cmdview *beat)
{
    struct resp_view f, v;
    if (!rprof_arg(beat, 2, &f) || !rprof_arg(beat, 3, &v))
        return false;
    const char *argv[6] = {"EVAL",
                           LATE_BEAT_LUA,
                           "1",
                           beat->key,
                           (const char *)beat->buf + f.off,
                           (const char *)beat->buf + v.off};
    size_t lens[6] = {4, sizeof(LATE_BEAT_LUA) - 1, 1, strlen(beat->key), f.len, v.len};
    resp_bytes_command(b, 6, argv, lens);
    return !b->oom;
}

/* A renewal queued in the transaction: kept back, answered 0 (no member added), with its job's
 * heartbeat; or applied later on twice's own connection. */
static void tx_lease(struct rq_tx *t, const struct rprof_cmdview *cv, const struct resp_view *idv,
                     size_t i, struct resp_tx_plan *p)
{
    struct lease f = lease_decide(t->h, cv, idv);
    if (f.close.kind == JOB_FAULT_CLOSE) {
        if (f.close.before && p->cut_before == NULL)
            p->cut_before = f.close.rule;
        else if (!f.close.before && p->cut_after == NULL)
            p->cut_after = f.close.rule;
    }
    if (f.fate == LEASE_KEEP)
        return;
    char id[RPROF_KEY_MAX];
    bool with_beat = t->beat && t->beat_idx < i && !p->cmds[t->beat_idx].keep_back &&
                     rprof_view_str(cv->buf, cv->len, idv, id, sizeof(id)) &&
                     rprof_rq_job_heartbeat(RPROF_RQ, &t->beat_cv, id);
    if (with_beat)
        jobs_keep_back(&p->cmds[t->beat_idx], ":0\r\n", 4); /* the field was there */
    jobs_keep_back(&p->cmds[i], ":0\r\n", 4);
    if (f.fate == LEASE_LATE) {
        struct resp_bytes b = {0};
        if (!with_beat || late_beat(&b, &t->beat_cv)) {
            resp_bytes_add(&b, cv->buf, cv->len);
            if (!b.oom)
                (void)resp_plan_own_raw(p->own, &p->n_own, f.ms, b.p, b.len, with_beat ? 2 : 1);
        }
        resp_bytes_free(&b);
    }
    t->beat = false;
}

/* RQ's push in the enqueue transaction: the publish's fault, if one fires; its copies once
 * EXEC's reply shows the transaction ran (the job's hash is saved by then). */
static void tx_publish(struct rq_tx *t, const struct rprof_cmdview *cv, size_t i,
                       struct resp_tx_plan *p)
{
    if (rprof_publish_of(RPROF_RQ, cv) != RPROF_PUB_RQ_ID)
        return;
    struct resp_own copies = {0};
    struct job_fault f = publish(t->h, cv, &t->saved, &copies);
    if (copies.n > 0 && f.kind != JOB_FAULT_DROP)
        jobs_own_append(&p->after_exec, copies.cmds.p, copies.cmds.len, copies.n);
    resp_bytes_free(&copies.cmds);
    if (f.kind == JOB_FAULT_DROP) {
        jobs_keep_back(&p->cmds[i], ":1\r\n", 4);
    } else if (f.kind == JOB_FAULT_DELAY && !p->hold) {
        p->hold = true;
        p->hold_ms = f.ms;
    } else if (f.kind == JOB_FAULT_CLOSE && f.before && p->cut_before == NULL) {
        p->cut_before = f.rule;
    } else if (f.kind == JOB_FAULT_CLOSE && !f.before && p->cut_after == NULL) {
        p->cut_after = f.rule;
    }
}

static int tx_command(void *st, const struct rprof_cmdview *cv, size_t i, struct resp_tx_plan *p)
{
    struct rq_tx *t = st;
    size_t first;
    struct resp_view idv;
    if (rprof_ack_args(RPROF_RQ, cv, &first)) {
        struct jobs_acks a;
        if (plan_acks(t->h, cv, first, &a) != 0)
            return -1;
        (void)jobs_tx_acks(&a, cv, &p->cmds[i], p);
        jobs_acks_free(&a);
    } else if (rprof_rq_lease(RPROF_RQ, cv, &idv)) {
        tx_lease(t, cv, &idv, i, p);
    } else if (rprof_rq_failed(RPROF_RQ, cv, &idv)) {
        journal_failed(t->h, cv, &idv);
    } else if (cv->id == RPROF_CMD_HSET && cv->m->nelem == 4) {
        /* perhaps a job's heartbeat, its renewal next */
        t->beat = true;
        t->beat_idx = i;
        t->beat_m = *cv->m;
        t->beat_cv = *cv;
        t->beat_cv.m = &t->beat_m;
    } else {
        tx_publish(t, cv, i, p);
    }
    return 0;
}

static int rq_transaction(const struct job_host *h, const uint8_t *buf, size_t len, size_t off,
                          uint64_t max_bulk, struct resp_tx_plan *p)
{
    struct rq_tx *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -1;
    t->h = h;
    struct rprof_tx scan;
    int rc = jobs_tx_walk(buf, len, off, max_bulk, &scan, tx_first, tx_command, t, p);
    free(t);
    return rc;
}

static bool rq_tx_judged(const struct job_host *h)
{
    return h->wants(h->ctx, JOB_EV_ACK) || h->wants(h->ctx, JOB_EV_PUBLISH) ||
           h->wants(h->ctx, JOB_EV_LEASE);
}

const struct resp_framework resp_framework_rq = {
    .name = "rq",
    .prof = RPROF_RQ,
    .open = rq_open,
    .close = rq_close,
    .command = rq_command,
    .reply = rq_reply,
    .transaction = rq_transaction,
    .tx_judged = rq_tx_judged,
    .free_state = jobs_free_state,
};
