/*
 * resp_rq.c - RQ's heartbeat as a lease, and its failed registry, on a resp listener with
 * `profile rq` (resp_internal.h; docs/redis.md, "RQ").
 *
 * While a work horse runs a job, RQ's worker renews the job's entry in the started registry
 * every job_monitoring_interval (30 s by default): ZADD rq:wip:NAME XX NOW+TTL ID with
 * HSET rq:job:ID last_heartbeat T, in one MULTI ... EXEC (rq/worker.py, maintain_heartbeats;
 * TTL is that interval, or what is left of the job's timeout, plus 60 s).  An entry whose score
 * has passed is reaped by StartedJobRegistry.cleanup, which every reader of the registry runs
 * (a worker's maintenance every 10 minutes, `rq info`, a dashboard): the job is requeued when
 * it has retries left, else moved to the failed registry, whether or not its horse still runs.
 *
 *   drop on lease   the renewal (and the job hash's last_heartbeat beside it) is answered as
 *                   Redis answers it (0: no member added) and never applied, and so are this
 *                   connection's later renewals of the job: the entry lapses while the job runs.
 *   delay on lease  applied D later on twice's own connection, this renewal and the later ones.
 *   close on lease  the worker's connection cut before or after it.
 *
 * A lease is lost per worker connection and job: a worker renews one job at a time (it runs
 * one horse), so the session remembers the one job whose lease it lost until the connection pops
 * its next job (a single-threaded worker dequeues on the connection it renews on: redis-py's
 * pool hands back the one it last used), and a renewal of another job by it is decided anew.
 *
 * RQ's failed registry, ZADD rq:failed:NAME SCORE ID, is journaled as a NACK without retry: the
 * job failed for good, as RQ's own handle_job_failure says, or its lease lapsed and the
 * registry's cleanup moved it there (an ACK after that NACK is its horse finishing after all).
 */
#include "proxy/resp_internal.h"

/* The job event of a renewal or a failure of job `id` on registry key cv->key. */
static void rq_event(struct rpx *rx, struct rpx_job *j, enum rule_event kind,
                     const struct rprof_cmdview *cv, const char *id)
{
    memset(j, 0, sizeof(*j));
    j->kind = kind;
    j->key = cv->key;
    j->id = rpx_jdup(j, id);
    j->queue = rprof_queue_of(rx->prof, cv->key);
    j->oom |= j->queue == NULL;
    j->task = rpx_known_task(rx, j, id, strlen(id));
}

static bool view_id(const struct rprof_cmdview *cv, const struct resp_view *v, char *out,
                    size_t cap)
{
    return rprof_view_str(cv->buf, cv->len, v, out, cap) && out[0] != '\0';
}

void rpx_rq_forget_lease(struct rpx *rx)
{
    free(rx->rq_lost);
    rx->rq_lost = NULL;
}

struct rpx_lease rpx_rq_lease_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                     const struct resp_view *idv)
{
    struct rpx_lease f = {.fate = RPX_LEASE_KEEP};
    char id[RPROF_KEY_MAX];
    if (!view_id(cv, idv, id, sizeof(id)) || !rpx_jobs_needed(rx)) {
        codec_count(rx->s, RULE_EV_LEASE);
        return f;
    }
    if (rx->rq_lost != NULL && strcmp(rx->rq_lost, id) == 0) {
        /* Counted, not decided: this connection lost the job's lease already. */
        codec_count(rx->s, RULE_EV_LEASE);
        f.fate = rx->rq_lost_ms > 0 ? RPX_LEASE_LATE : RPX_LEASE_DROP;
        f.ms = rx->rq_lost_ms;
        return f;
    }
    struct rpx_job j;
    rq_event(rx, &j, RULE_EV_LEASE, cv, id);
    const struct rule *r = rpx_decide_job(rx, &j);
    rpx_job_event_clear(&j);
    if (r == NULL)
        return f;
    switch (r->action.kind) {
    case RULE_ACT_DROP:
    case RULE_ACT_DELAY: {
        char *lost = strdup(id);
        if (lost == NULL) {
            log_msg(LOG_WARN, "lease fault not kept",
                    "sid=%llu listener=%s reason=\"out of memory\"", (unsigned long long)rx->s->id,
                    rpx_scope(rx));
            return f;
        }
        free(rx->rq_lost);
        rx->rq_lost = lost;
        rx->rq_lost_ms = r->action.kind == RULE_ACT_DELAY ? r->action.duration_ms : 0;
        f.fate = r->action.kind == RULE_ACT_DELAY ? RPX_LEASE_LATE : RPX_LEASE_DROP;
        f.ms = rx->rq_lost_ms;
        break;
    }
    case RULE_ACT_CLOSE:
        f.close = r;
        break;
    default:
        break;
    }
    return f;
}

void rpx_rq_journal_failed(struct rpx *rx, const struct rprof_cmdview *cv,
                           const struct resp_view *idv)
{
    char id[RPROF_KEY_MAX];
    if (rx->s->px->journal == NULL || !view_id(cv, idv, id, sizeof(id)))
        return;
    struct rpx_job j;
    rq_event(rx, &j, RULE_EV_NACK, cv, id);
    rpx_journal_job(rx, JOURNAL_KIND_NACK, &j);
    rpx_job_event_clear(&j);
}

enum cmd_result rpx_rq_command_lease(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct resp_view *idv)
{
    size_t len = m->len;
    struct rpx_lease f = rpx_rq_lease_decide(rx, cv, idv);
    rx->decided = 0;
    if (f.close != NULL && f.close->action.close_when == RULE_CLOSE_BEFORE) {
        rpx_swallow(rx, len);
        rpx_cut_at_turn(rx, f.close, NULL);
        return CMD_STOP;
    }
    if (f.fate == RPX_LEASE_KEEP) {
        struct entry *e = rpx_forward(rx, cv, m, buf, len);
        if (f.close != NULL) {
            rpx_cut_at_turn(rx, f.close, e);
            return CMD_STOP;
        }
        return CMD_DONE;
    }
    if (f.fate == RPX_LEASE_LATE) {
        struct evbuffer *later = evbuffer_new();
        if (later != NULL && evbuffer_add(later, buf, len) == 0)
            rpx_aux_send_at(rx, later, 1, f.ms);
        if (later != NULL)
            evbuffer_free(later);
    }
    /* ZADD XX of a member: 0 added, as Redis answers a renewal. */
    rpx_swallow(rx, len);
    if (rpx_owe_reply(rx))
        rpx_answer(rx, ":0\r\n", 4);
    return CMD_DONE;
}
