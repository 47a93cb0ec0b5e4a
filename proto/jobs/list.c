/*
 * list.c - any app's JSON jobs on plain lists as a framework module (`profile list`;
 * proto/jobs/framework.h, docs/any-app.md): LPUSH or RPUSH publishes, a pop or a move onto a
 * processing list (BLMOVE queue processing, the "reliable queue") delivers, LREM processing 1
 * JOB acks.  Ids and tasks are read with the listener's `message-id` and `task` sources.
 *
 *   duplicate on deliver  the job pushed back where the pop took it.
 *   drop on ack           the LREM answered as Redis answers the removal of one job (:1) and
 *                         never applied: the job stays in the processing list for the app's own
 *                         recovery.
 *   delay on ack          the LREM applied D later on twice's own connection.
 *   redeliver on ack      the LREM applied with the job pushed back onto the list it came from
 *                         (as an app's recovery of a processing list requeues a job whose worker
 *                         never finished it), on twice's own connection, D later with `after D`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/common.h"

/* The memory's key under which a processing list remembers the list it is fed from ("\x01"
 * and its name: no job id starts with that byte, as ids are JSON strings read whole).  False
 * when it does not fit. */
static bool processing_key(const char *list, char *out, size_t cap)
{
    int n = snprintf(out, cap, "\x01%s", list);
    return n > 0 && (size_t)n < cap;
}

/* A move of a job onto processing list dst, from list src (its head when head): an ack on dst
 * later names neither, and a redelivery pushes the job back where it came from.  Kept per
 * processing list, not per job (a worker that only pops has no ack to clear it with): a
 * processing list fed from two queues is known by the last. */
static void li_popped(const struct job_host *h, const struct jobs_reply *r, const char *src)
{
    char key[RPROF_KEY_MAX + 2];
    if (r->arg2 == NULL || !processing_key(r->arg2, key, sizeof(key)))
        return;
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, key, strlen(key));
    if (in != NULL) {
        if (in->queue == NULL || strcmp(in->queue, src) != 0)
            job_memo_set(&in->queue, src, strlen(src));
        in->flags =
            r->head ? in->flags | JOB_MEMO_POP_HEAD : in->flags & ~(uint32_t)JOB_MEMO_POP_HEAD;
    }
    h->memo_unlock(h->ctx);
}

/* The list a processing list is fed from, malloc'd into *src with its end in *head; false when
 * twice saw no move onto it. */
static bool processing_source(const struct job_host *h, const char *list, char **src, bool *head)
{
    char key[RPROF_KEY_MAX + 2];
    *src = NULL;
    *head = false;
    if (!processing_key(list, key, sizeof(key)))
        return false;
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, key, strlen(key));
    if (in != NULL && in->queue != NULL) {
        size_t n = strlen(in->queue);
        if ((*src = malloc(n + 1)) != NULL)
            memcpy(*src, in->queue, n + 1);
        *head = (in->flags & JOB_MEMO_POP_HEAD) != 0;
    }
    h->memo_unlock(h->ctx);
    return *src != NULL;
}

static bool li_job(const struct job_host *h, const char *list, const uint8_t *v, size_t n,
                   struct jobs_ev *j)
{
    return jobs_payload_job(h, RPROF_LIST, list, v, n, j, NULL);
}

static const struct jobs_pop_ops li_pop = {.prof = RPROF_LIST, .popped = li_popped, .job = li_job};

/* ---- acks --------------------------------------------------------------------------------- */

/* An ack, LREM processing COUNT JOB on a processing list fed from src: journaled and decided;
 * its id and task are its payload's, its queue src (as the delivery's record names it). */
static struct job_fault ack_decide(const struct job_host *h, const struct rprof_cmdview *cv,
                                   const struct resp_view *job, const char *src)
{
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    if (!h->needed) {
        h->count(h->ctx, JOB_EV_ACK);
        return none;
    }
    struct resp_job rj;
    if (jobs_read_job(h, RPROF_LIST, cv->buf + job->off, job->len, &rj) != 0)
        return none;
    struct jobs_ev j = {.kind = JOB_EV_ACK, .key = cv->key, .id = rj.id, .task = rj.task};
    free(rj.queue);
    free(rj.tag);
    j.queue = jobs_dup(&j, src);
    jobs_record(h, JOB_REC_ACK, &j);
    struct job_fault f = jobs_decide(h, &j);
    jobs_ev_clear(&j);
    return f;
}

/* Lua for twice's own connection: a redelivery of a list job, KEYS[1] the processing list,
 * KEYS[2] the queue, ARGV the LREM's count, the job and the push.  The job goes back onto its
 * queue only if it was still in the processing list: an app's own recovery may have put it
 * back meanwhile (during `redeliver after D`), or the worker's LREM may have had nothing to
 * remove, and a push then would be a copy no lost ack makes. */
static const char REDELIVER_LUA[] = "if redis.call('LREM', KEYS[1], ARGV[1], ARGV[2]) > 0 then "
                                    "return redis.call(ARGV[3], KEYS[2], ARGV[2]) end return 0";

/* The command twice sends for an ack it keeps back: the LREM itself (delay), or the LREM and,
 * if it removed the job, its push back onto src (redeliver). */
static bool ack_later(struct resp_cmd_plan *p, const struct job_fault *f,
                      const struct rprof_cmdview *cv, const struct resp_view *job, const char *src,
                      bool head)
{
    if (f->kind == JOB_FAULT_DELAY)
        return resp_plan_own_raw(p->own, &p->n_own, f->ms, cv->buf, cv->len, 1);
    struct resp_view count;
    if (!rprof_arg(cv, 2, &count))
        return false;
    const char *push = rprof_repush_cmd(RPROF_LIST, head);
    const char *argv[8] = {"EVAL",
                           REDELIVER_LUA,
                           "2",
                           cv->key,
                           src,
                           (const char *)cv->buf + count.off,
                           (const char *)cv->buf + job->off,
                           push};
    size_t lens[8] = {4,           sizeof(REDELIVER_LUA) - 1,
                      1,           strlen(cv->key),
                      strlen(src), count.len,
                      job->len,    strlen(push)};
    return resp_plan_own(p->own, &p->n_own, f->ms, 8, argv, lens);
}

/* An LREM on a list twice saw jobs moved onto (any other LREM is a plain command). */
static void command_ack(const struct job_host *h, const struct rprof_cmdview *cv,
                        const struct resp_view *job, struct resp_cmd_plan *p)
{
    char *src = NULL;
    bool head = false;
    struct job_fault f = {.kind = JOB_FAULT_NONE};
    if (processing_source(h, cv->key, &src, &head))
        f = ack_decide(h, cv, job, src);
    if ((f.kind == JOB_FAULT_DELAY || f.kind == JOB_FAULT_REDELIVER) &&
        !ack_later(p, &f, cv, job, src, head)) {
        /* The fault is noted already; the ack goes on rather than being lost. */
        h->log(h->ctx, JOB_LOG_WARN, "ack not kept back", "reason=\"out of memory\"");
        f.kind = JOB_FAULT_NONE;
    }
    free(src);
    switch (f.kind) {
    case JOB_FAULT_DROP:
    case JOB_FAULT_DELAY:
    case JOB_FAULT_REDELIVER:
        p->fate = RESP_CMD_ANSWER;
        resp_bytes_int(&p->bytes, 1);
        break;
    case JOB_FAULT_CLOSE:
        p->cut = f.rule;
        if (f.before)
            p->fate = RESP_CMD_CUT;
        break;
    default:
        break;
    }
}

/* ---- the module ---------------------------------------------------------------------------- */

static int li_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                      struct resp_cmd_plan *p)
{
    struct resp_view job;
    if (rprof_list_ack(RPROF_LIST, cv, &job)) {
        command_ack(h, cv, &job, p);
        return 1;
    }
    return jobs_push_command(h, RPROF_LIST, cv, decided, NULL, p);
}

static void li_reply(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                     const struct resp_msg *m, struct resp_reply_plan *p)
{
    jobs_pop_tagged(h, &li_pop, tag, buf, m, p);
}

const struct resp_framework resp_framework_list = {
    .name = "list",
    .prof = RPROF_LIST,
    .count_pop = jobs_count_pop,
    .command = li_command,
    .reply = li_reply,
    .free_state = jobs_free_state,
};
