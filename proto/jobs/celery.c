/*
 * celery.c - Celery with kombu's Redis transport as a framework module
 * (proto/jobs/framework.h; docs/redis.md, "Celery"): LPUSH of the task's message publishes,
 * BRPOP delivers, and kombu's QoS acks by delivery tag, ZREM <queue>unacked_index TAG then
 * HDEL <queue>unacked TAG, mostly in one transaction.  The tag stands for the message: what a
 * delivery says of it (id, task, queue) is remembered under the tag for its ack, which comes on
 * another connection (kombu's sync pool).
 *
 *   duplicate on deliver  the message pushed back where the pop took it, marked redelivered as
 *                         kombu's restore marks it.
 *   duplicate on publish  the push sent again with a new delivery tag, as a retrying producer
 *                         draws one (two messages under one tag in kombu's unacked hash would
 *                         be one).
 *   redeliver/drop on ack the ZREM (and its HDEL) kept back and answered as applied: the task
 *                         stays in the unacked hash, and kombu's restore brings it back after
 *                         its visibility timeout.
 *   delay on ack         kept back now, applied D later on twice's own connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/common.h"

/* Tags of the kept-back ZREMs of one transaction its HDEL is compared with. */
#define CELERY_TX_TAGS 16

/* ---- publishes ---------------------------------------------------------------------------- */

/* A delivery tag as kombu draws one (a uuid4 string) into out[37]; false without random
 * bytes. */
static bool new_tag(const struct job_host *h, char out[37])
{
    uint8_t b[16];
    if (!h->random(h->ctx, b, sizeof(b)))
        return false;
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return true;
}

/* A copy of a published message with a new delivery tag. */
static bool retag(const struct job_host *h, const uint8_t *v, size_t n, char **out, size_t *len)
{
    char tag[37];
    return new_tag(h, tag) && resp_job_celery_retagged(v, n, tag, out, len) == 0;
}

/* ---- deliveries ---------------------------------------------------------------------------- */

/* A popped message; what its tag stands for remembered for its ack. */
static bool cy_job(const struct job_host *h, const char *list, const uint8_t *v, size_t n,
                   struct jobs_ev *j)
{
    char *tag = NULL;
    if (!jobs_payload_job(h, RPROF_CELERY, list, v, n, j, &tag))
        return false;
    if (tag != NULL) {
        h->memo_lock(h->ctx);
        struct job_memo *in = h->memo_put(h->ctx, tag, strlen(tag));
        if (in != NULL) {
            job_memo_set(&in->id, j->id, j->id != NULL ? strlen(j->id) : 0);
            job_memo_set(&in->task, j->task, j->task != NULL ? strlen(j->task) : 0);
            job_memo_set(&in->queue, j->queue, j->queue != NULL ? strlen(j->queue) : 0);
            if (in->pending < UINT32_MAX)
                in->pending++;
        }
        h->memo_unlock(h->ctx);
    }
    free(tag);
    return true;
}

/* A duplicate's copy marked redelivered, as kombu's restore marks it. */
static bool cy_copy(const uint8_t *v, size_t n, char **out, size_t *len)
{
    return resp_job_celery_redelivered(v, n, out, len) == 0;
}

static const struct jobs_pop_ops cy_pop = {.prof = RPROF_CELERY, .job = cy_job, .copy = cy_copy};

/* ---- acks --------------------------------------------------------------------------------- */

static void ack_decide(const struct job_host *h, const struct rprof_cmdview *cv, const char *tag,
                       struct jobs_ack_fate *f)
{
    /* The tag stands for the message: its id and queue are what its delivery said. */
    struct jobs_ev j = {.kind = JOB_EV_ACK, .key = cv->key};
    jobs_ack_decide(h, tag, true, &j, false, f);
}

/* ---- the module ---------------------------------------------------------------------------- */

static int cy_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                      struct resp_cmd_plan *p)
{
    size_t first;
    if (rprof_ack_args(RPROF_CELERY, cv, &first)) {
        struct jobs_acks a;
        if (jobs_plan_acks(h, cv, first, ack_decide, NULL, &a) == 0)
            jobs_acks_plan(&a, cv, p);
        jobs_acks_free(&a);
        return 1;
    }
    return jobs_push_command(h, RPROF_CELERY, cv, decided, retag, p);
}

static void cy_reply(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                     const struct resp_msg *m, struct resp_reply_plan *p)
{
    jobs_pop_tagged(h, &cy_pop, tag, buf, m, p);
}

/* A transaction's plan: the acks (not in a restore, kombu's push of unacked messages back
 * onto their queues), and the HDEL that follows the ZREM of the same tags. */
struct cy_tx {
    const struct job_host *h;
    bool restore;
    char tags[CELERY_TX_TAGS][RPROF_KEY_MAX]; /* of the ZREMs kept back */
    size_t n_tags;
    uint32_t later_ms; /* the latest delayed ack's */
    bool later;
};

/* HDEL unacked TAG... is kept back with the ZREM of its tags when every tag it names was (a
 * ZREM naming several is kept back only so), else the message's payload would be gone while
 * its index entry stays, and the restore would lose it.  A delayed ack applies it later too. */
static void tx_hdel(struct cy_tx *t, const struct rprof_cmdview *cv, struct resp_queued *q,
                    struct resp_tx_plan *p)
{
    bool all = true;
    struct resp_view tv;
    char tag[RPROF_KEY_MAX];
    for (size_t a = 2; all && a < cv->m->nelem; a++) {
        all = rprof_arg(cv, a, &tv) && rprof_view_str(cv->buf, cv->len, &tv, tag, sizeof(tag));
        bool found = false;
        for (size_t k = 0; all && !found && k < t->n_tags; k++)
            found = strcmp(tag, t->tags[k]) == 0;
        all = all && found;
    }
    if (!all)
        return;
    jobs_keep_back_count(q, cv);
    if (t->later)
        (void)resp_plan_own_raw(p->own, &p->n_own, t->later_ms, cv->buf, cv->len, 1);
}

static int tx_command(void *st, const struct rprof_cmdview *cv, size_t i, struct resp_tx_plan *p)
{
    struct cy_tx *t = st;
    size_t first;
    if (!t->restore && rprof_ack_args(RPROF_CELERY, cv, &first)) {
        struct jobs_acks a;
        if (jobs_plan_acks(t->h, cv, first, ack_decide, NULL, &a) != 0)
            return -1;
        bool kept = jobs_tx_acks(&a, cv, &p->cmds[i], p);
        if (a.later.len > 0) {
            t->later = true;
            if (a.later_ms > t->later_ms)
                t->later_ms = a.later_ms;
        }
        struct resp_view tv;
        for (size_t k = 2; kept && t->n_tags < CELERY_TX_TAGS && rprof_arg(cv, k, &tv); k++)
            rprof_view_str(cv->buf, cv->len, &tv, t->tags[t->n_tags++], RPROF_KEY_MAX);
        jobs_acks_free(&a);
    } else if (rprof_is_celery_unacked_hdel(RPROF_CELERY, cv) && t->n_tags > 0) {
        tx_hdel(t, cv, &p->cmds[i], p);
    }
    return 0;
}

/* The first pass: a push among the commands makes it a restore. */
static void tx_first(void *st, const struct rprof_cmdview *cv)
{
    struct cy_tx *t = st;
    if (cv->id == RPROF_CMD_LPUSH || cv->id == RPROF_CMD_RPUSH)
        t->restore = true;
}

static int cy_transaction(const struct job_host *h, const uint8_t *buf, size_t len, size_t off,
                          uint64_t max_bulk, struct resp_tx_plan *p)
{
    struct cy_tx *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -1;
    t->h = h;
    struct rprof_tx scan;
    int rc = jobs_tx_walk(buf, len, off, max_bulk, &scan, tx_first, tx_command, t, p);
    free(t);
    return rc;
}

static bool cy_tx_judged(const struct job_host *h)
{
    return h->wants(h->ctx, JOB_EV_ACK);
}

const struct resp_framework resp_framework_celery = {
    .name = "celery",
    .prof = RPROF_CELERY,
    .count_pop = jobs_count_pop,
    .command = cy_command,
    .reply = cy_reply,
    .transaction = cy_transaction,
    .tx_judged = cy_tx_judged,
    .free_state = jobs_free_state,
};
