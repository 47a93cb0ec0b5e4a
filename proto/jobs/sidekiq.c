/*
 * sidekiq.c - Sidekiq as a framework module (proto/jobs/framework.h; docs/redis.md, "Sidekiq"):
 * LPUSH queue:NAME <job JSON> publishes, BRPOP delivers; Sidekiq settles nothing on the wire,
 * but its heartbeat lists the jobs each process runs, journaled as `running` records for the
 * verdict (two runs of one job seen at once).
 *
 *   duplicate on deliver  the job pushed back where the pop took it, on twice's own connection
 *                         (`after D`: that much later): another worker runs it.
 *   drop on deliver       the reply replaced by a timeout's null: the job is gone.
 *   drop on publish       the push answered as applied (:1) and never applied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/common.h"

/* Run keys: the process identity and the thread id, "<identity> <tid>". */
#define SQ_RUN_MAX (RPROF_KEY_MAX + 64)

/* Sidekiq's heartbeat (HSET <identity>:work): a RUNNING record for each job in progress. */
static void sq_seen(const struct job_host *h, const struct rprof_cmdview *cv)
{
    size_t identity_len = 0;
    if (!h->journal || !rprof_sidekiq_work(RPROF_SIDEKIQ, cv, &identity_len))
        return;
    struct resp_view f, v;
    for (size_t i = 2; rprof_arg(cv, i, &f) && rprof_arg(cv, i + 1, &v); i += 2) {
        struct resp_job job;
        uint64_t started = 0;
        if (f.type != '$' || v.type != '$' || f.len > 64 ||
            resp_job_sidekiq_work(cv->buf + v.off, v.len, &job, &started) != 0)
            continue;
        char run[SQ_RUN_MAX];
        snprintf(run, sizeof(run), "%.*s %.*s", (int)identity_len, cv->key, (int)f.len,
                 (const char *)cv->buf + f.off);
        struct jobs_ev j = {.kind = JOB_EV_LEASE, .started_unix_us = started, .run = run};
        j.id = jobs_dup(&j, job.id);
        j.task = jobs_dup(&j, job.task);
        j.queue = job.queue != NULL ? jobs_dup(&j, job.queue) : NULL;
        resp_job_clear(&job);
        jobs_record(h, JOB_REC_RUNNING, &j);
        jobs_ev_clear(&j);
    }
}

/* A popped job, read from its payload when something reads jobs. */
static bool sq_job(const struct job_host *h, const char *list, const uint8_t *v, size_t n,
                   struct jobs_ev *j)
{
    return jobs_payload_job(h, RPROF_SIDEKIQ, list, v, n, j, NULL);
}

static const struct jobs_pop_ops sq_pop = {.prof = RPROF_SIDEKIQ, .job = sq_job};

static int sq_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                      struct resp_cmd_plan *p)
{
    return jobs_push_command(h, RPROF_SIDEKIQ, cv, decided, NULL, p);
}

static void sq_reply(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                     const struct resp_msg *m, struct resp_reply_plan *p)
{
    jobs_pop_tagged(h, &sq_pop, tag, buf, m, p);
}

const struct resp_framework resp_framework_sidekiq = {
    .name = "sidekiq",
    .prof = RPROF_SIDEKIQ,
    .count_pop = jobs_count_pop,
    .seen = sq_seen,
    .command = sq_command,
    .reply = sq_reply,
    .free_state = jobs_free_state,
};
