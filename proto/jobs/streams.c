/*
 * streams.c - Redis Streams consumer groups as a framework module (proto/jobs/framework.h;
 * docs/redis.md, "Streams"): XADD publishes, XREADGROUP, XCLAIM and XAUTOCLAIM deliver, XACK
 * settles.
 *
 *   drop on publish      the XADD is answered with the id the client chose (as Redis completes
 *                        it) or one made as Redis makes them (milliseconds-sequence), and never
 *                        applied; journaled with that id.
 *   drop on deliver      the entry is taken out of the reply: it stays pending, unseen, until a
 *                        claim hands it out again.
 *   duplicate on deliver the entry's ack is swallowed when it comes: it stays pending and the
 *                        next XAUTOCLAIM hands it out again.
 *   redeliver/drop on ack the id is kept out of the XACK (answered as applied): it stays pending.
 *   delay on ack         kept out now, acked D later on twice's own connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/common.h"

/* The memory's key of entry `id` of stream `stream`. */
#define STREAM_KEY_MAX (RPROF_KEY_MAX + RPROF_ID_MAX + 2)

static void entry_key(char *out, const char *stream, const char *id)
{
    snprintf(out, STREAM_KEY_MAX, "%s %s", stream, id);
}

/* ---- publishes ---------------------------------------------------------------------------- */

/* The id a dropped XADD is answered with, as Redis would complete it: "5" is 5-0, and "5-*"
 * gets sequence 0 in a stream that has nothing at 5; a client that let Redis choose gets one
 * made as Redis makes them. */
static void drop_id(const struct job_host *h, const char *id, bool chosen, char *out, size_t cap)
{
    if (!chosen) {
        snprintf(out, cap, "%llu-%llu", (unsigned long long)h->wall_ms(h->ctx),
                 (unsigned long long)h->next_seq(h->ctx));
        return;
    }
    size_t n = strlen(id);
    const char *dash = strchr(id, '-');
    if (dash == NULL)
        snprintf(out, cap, "%s-0", id);
    else if (strcmp(dash, "-*") == 0)
        snprintf(out, cap, "%.*s-0", (int)(n - 2), id);
    else
        snprintf(out, cap, "%s", id);
}

/* An XADD, decided before Redis sees it: its task (the `task` field) and its stream are known,
 * its id only when the client chose it (else Redis picks it, and the reply's id is journaled).
 * A publish that a rule keeps from Redis (drop, close before) is journaled here, and a drop is
 * answered with *answer. */
static struct job_fault publish_decide(const struct job_host *h, const struct rprof_cmdview *cv,
                                       struct resp_bytes *answer)
{
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    if (!h->wants(h->ctx, JOB_EV_PUBLISH)) {
        h->count(h->ctx, JOB_EV_PUBLISH);
        return none;
    }
    size_t at = rprof_xadd_id_arg(cv);
    struct resp_view v;
    char id[RPROF_ID_MAX], task[RPROF_TASK_MAX], made[RPROF_ID_MAX + 32];
    if (at == 0 || !rprof_arg(cv, at, &v) || !rprof_view_str(cv->buf, cv->len, &v, id, sizeof(id)))
        return none;
    bool chosen = strcmp(id, "*") != 0;
    uint64_t tlen;
    if (rprof_xadd_task(cv, task, sizeof(task), &tlen) == RPROF_TOO_LONG)
        jobs_too_long(h, "task", tlen, sizeof(task));
    struct jobs_ev j = {.kind = JOB_EV_PUBLISH, .key = cv->key};
    j.id = chosen ? jobs_dup(&j, id) : NULL;
    j.queue = jobs_dup(&j, cv->key);
    j.task = task[0] != '\0' ? jobs_dup(&j, task) : NULL;
    /* Redis picks the id of an XADD with '*': the rules decide without one, and the fault is
     * noted once it is known whether twice made one (a drop), so that the fault and the
     * publish records share it. */
    struct job_fault f = jobs_decide_unnoted(h, &j);
    if (f.kind == JOB_FAULT_DROP) {
        drop_id(h, id, chosen, made, sizeof(made));
        resp_bytes_bulk(answer, made, strlen(made));
        if (j.id == NULL)
            j.id = jobs_dup(&j, made);
    }
    if (f.kind != JOB_FAULT_NONE)
        jobs_note(h, &f, &j);
    if (f.kind == JOB_FAULT_DROP || (f.kind == JOB_FAULT_CLOSE && f.before))
        jobs_record(h, JOB_REC_PUBLISH, &j);
    jobs_ev_clear(&j);
    return f;
}

/* ---- acks --------------------------------------------------------------------------------- */

static void ack_decide(const struct job_host *h, const struct rprof_cmdview *cv, const char *id,
                       struct jobs_ack_fate *f)
{
    char key[STREAM_KEY_MAX];
    entry_key(key, cv->key, id);
    struct jobs_ev j = {.kind = JOB_EV_ACK, .key = cv->key};
    j.id = jobs_dup(&j, id);
    j.queue = rprof_queue_of(RPROF_STREAMS, cv->key);
    j.oom |= j.queue == NULL;
    jobs_ack_decide(h, key, false, &j, false, f);
}

/* ---- deliveries ---------------------------------------------------------------------------- */

/* One stream entry [id, fields] handed to a consumer: its event and its fault. */
static struct job_fault entry_delivery(const struct job_host *h, const char *stream,
                                       const uint8_t *buf, size_t len,
                                       const struct resp_view *entry, bool redelivered)
{
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    struct rprof_entry ent;
    char key[STREAM_KEY_MAX];
    int got = rprof_stream_entry(buf, len, entry, &ent);
    if (ent.too_long != NULL)
        jobs_too_long(h, ent.too_long, ent.too_long_len,
                      got == 1 ? sizeof(ent.task) : sizeof(ent.id));
    if (got != 1)
        return none;
    bool has_task = ent.task[0] != '\0';
    entry_key(key, stream, ent.id);
    struct jobs_ev j = {.kind = JOB_EV_DELIVER, .redelivered = redelivered, .key = stream};
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_put(h->ctx, key, strlen(key));
    if (in != NULL && has_task)
        job_memo_set(&in->task, ent.task, strlen(ent.task));
    if (has_task)
        j.task = jobs_dup(&j, ent.task);
    else if (in != NULL && in->task != NULL)
        j.task = jobs_dup(&j, in->task);
    h->memo_unlock(h->ctx);
    j.id = jobs_dup(&j, ent.id);
    j.queue = jobs_dup(&j, stream);
    jobs_record(h, JOB_REC_DELIVER, &j);
    struct job_fault f = jobs_decide(h, &j);
    if (f.kind == JOB_FAULT_DUPLICATE) {
        /* Its ack is swallowed: the entry stays pending. */
        h->memo_lock(h->ctx);
        in = h->memo_put(h->ctx, key, strlen(key));
        if (in != NULL) {
            in->flags |= JOB_MEMO_SUPPRESS_ACK;
            if (in->task == NULL && j.task != NULL) /* an ack removed it meanwhile */
                job_memo_set(&in->task, j.task, strlen(j.task));
        }
        h->memo_unlock(h->ctx);
    }
    jobs_ev_clear(&j);
    return f;
}

/* Like resp_args_next, with the element's byte range [*start, *end). */
static int walk_next(struct resp_args *it, struct resp_view *v, size_t *start, size_t *end)
{
    *start = it->pos;
    int rc = resp_args_next(it, v);
    *end = it->pos;
    return rc;
}

/* Entries of one array of stream entries: their events and faults, and the array rebuilt into
 * out without the dropped ones.  Returns whether any was dropped. */
static bool entries(const struct job_host *h, const char *stream, const uint8_t *buf, size_t len,
                    const struct resp_view *arr, bool redelivered, struct resp_bytes *out,
                    struct resp_reply_plan *p)
{
    struct resp_args it;
    rprof_walk_init(&it, buf, len, arr);
    struct resp_view v;
    size_t start, end;
    uint64_t kept = 0;
    bool dropped = false;
    struct resp_bytes body = {0};
    while (walk_next(&it, &v, &start, &end) == 1) {
        struct job_fault f = entry_delivery(h, stream, buf, len, &v, redelivered);
        if (f.kind == JOB_FAULT_DROP) {
            dropped = true;
            continue;
        }
        if (f.kind == JOB_FAULT_DELAY && f.ms > p->delay_ms)
            p->delay_ms = f.ms;
        if (f.kind == JOB_FAULT_CLOSE && p->cut == NULL) {
            p->cut = f.rule;
            p->cut_before = f.before;
        }
        resp_bytes_add(&body, buf + start, end - start);
        kept++;
    }
    char head[32];
    int n = snprintf(head, sizeof(head), "*%llu\r\n", (unsigned long long)kept);
    resp_bytes_add(out, head, (size_t)n);
    resp_bytes_add(out, body.p, body.len);
    out->oom |= body.oom;
    resp_bytes_free(&body);
    return dropped;
}

/* An aggregate's header ("*N\r\n", "%N\r\n") into out. */
static void agg_head(struct resp_bytes *out, char type, uint64_t n)
{
    char head[32];
    int k = snprintf(head, sizeof(head), "%c%llu\r\n", type, (unsigned long long)n);
    resp_bytes_add(out, head, (size_t)k);
}

/* XREADGROUP's reply, RESP2 [[stream, entries], ...] or RESP3 {stream => entries}. */
static bool xread_reply(const struct job_host *h, const struct jobs_reply *r, const uint8_t *buf,
                        const struct resp_msg *m, struct resp_bytes *out, struct resp_reply_plan *p)
{
    struct resp_args it;
    struct resp_view v;
    size_t start, end;
    bool dropped = false;
    char stream[RPROF_KEY_MAX];
    resp_args_init(&it, buf, m);
    if (m->value.type == '%') {
        agg_head(out, '%', m->nelem / 2);
        while (walk_next(&it, &v, &start, &end) == 1) {
            resp_bytes_add(out, buf + start, end - start);
            rprof_view_str(buf, m->len, &v, stream, sizeof(stream));
            if (walk_next(&it, &v, &start, &end) != 1)
                break;
            if (rprof_is_agg(&v))
                dropped |= entries(h, stream, buf, m->len, &v, r->redelivered, out, p);
            else
                resp_bytes_add(out, buf + start, end - start);
        }
        return dropped;
    }
    agg_head(out, '*', m->nelem);
    while (walk_next(&it, &v, &start, &end) == 1) {
        struct resp_args in;
        struct resp_view k, ents;
        size_t ks, ke, es, ee;
        if (!rprof_is_agg(&v) || v.count != 2) {
            resp_bytes_add(out, buf + start, end - start);
            continue;
        }
        rprof_walk_init(&in, buf, m->len, &v);
        if (walk_next(&in, &k, &ks, &ke) != 1 || walk_next(&in, &ents, &es, &ee) != 1)
            break;
        rprof_view_str(buf, m->len, &k, stream, sizeof(stream));
        resp_bytes_add(out, "*2\r\n", 4);
        resp_bytes_add(out, buf + ks, ke - ks);
        if (rprof_is_agg(&ents))
            dropped |= entries(h, stream, buf, m->len, &ents, r->redelivered, out, p);
        else
            resp_bytes_add(out, buf + es, ee - es);
    }
    return dropped;
}

/* XREADGROUP / XCLAIM / XAUTOCLAIM replies. */
static void stream_reply(const struct job_host *h, uint8_t kind, const struct jobs_reply *r,
                         const uint8_t *buf, const struct resp_msg *m, struct resp_reply_plan *p)
{
    if (m->null || !rprof_is_agg(&m->value))
        return;
    struct resp_bytes out = {0};
    bool dropped = false;
    const char *stream = r->arg != NULL ? r->arg : "";
    if (kind == RPROF_REPLY_XCLAIM) {
        dropped = entries(h, stream, buf, m->len, &m->value, true, &out, p);
    } else if (kind == RPROF_REPLY_XAUTOCLAIM) {
        struct resp_args it;
        struct resp_view v;
        size_t start, end;
        resp_args_init(&it, buf, m);
        agg_head(&out, '*', m->nelem);
        for (uint64_t i = 0; walk_next(&it, &v, &start, &end) == 1; i++) {
            if (i == 1 && rprof_is_agg(&v))
                dropped |= entries(h, stream, buf, m->len, &v, true, &out, p);
            else
                resp_bytes_add(&out, buf + start, end - start);
        }
    } else {
        dropped = xread_reply(h, r, buf, m, &out, p);
    }
    if (dropped && m->body == 0) {
        p->replace = true;
        resp_bytes_add(&p->bytes, out.p, out.len);
        p->bytes.oom |= out.oom;
    }
    resp_bytes_free(&out);
}

/* An XADD's reply: the publish journaled with the id Redis gave it, and its task remembered for
 * the entry's deliveries. */
static void xadd_reply(const struct job_host *h, const struct jobs_reply *r, const uint8_t *buf,
                       const struct resp_msg *m)
{
    char id[RPROF_ID_MAX];
    uint64_t n;
    enum rprof_field got = rprof_xadd_reply_id(buf, m, id, sizeof(id), &n);
    if (got == RPROF_TOO_LONG)
        jobs_too_long(h, "stream entry id", n, sizeof(id));
    if (got != RPROF_FOUND)
        return;
    struct jobs_ev j = {.kind = JOB_EV_PUBLISH};
    j.id = jobs_dup(&j, id);
    j.queue = r->arg != NULL ? jobs_dup(&j, r->arg) : NULL;
    j.task = r->arg2 != NULL ? jobs_dup(&j, r->arg2) : NULL;
    jobs_record(h, JOB_REC_PUBLISH, &j);
    if (r->arg != NULL && r->arg2 != NULL) {
        char key[STREAM_KEY_MAX];
        entry_key(key, r->arg, id);
        h->memo_lock(h->ctx);
        struct job_memo *in = h->memo_put(h->ctx, key, strlen(key));
        if (in != NULL)
            job_memo_set(&in->task, r->arg2, strlen(r->arg2));
        h->memo_unlock(h->ctx);
    }
    jobs_ev_clear(&j);
}

/* ---- the module ---------------------------------------------------------------------------- */

static int st_command(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                      struct resp_cmd_plan *p)
{
    size_t first;
    if (rprof_ack_args(RPROF_STREAMS, cv, &first)) {
        struct jobs_acks a;
        if (jobs_plan_acks(h, cv, first, ack_decide, NULL, &a) == 0)
            jobs_acks_plan(&a, cv, p);
        jobs_acks_free(&a);
        return 1;
    }
    if (rprof_publish_of(RPROF_STREAMS, cv) == RPROF_PUB_XADD && !decided) {
        struct resp_bytes answer = {0};
        struct job_fault f = publish_decide(h, cv, &answer);
        jobs_publish_plan(h, RPROF_STREAMS, cv, &f, &answer, NULL, p);
        resp_bytes_free(&answer);
        return 1;
    }
    if (!rprof_cmd_matters(RPROF_STREAMS, cv->id))
        return 0;
    (void)jobs_tag_reply(h, RPROF_STREAMS, cv, &p->reply);
    return 1;
}

static void st_reply(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                     const struct resp_msg *m, struct resp_reply_plan *p)
{
    const struct jobs_reply *r = tag->state;
    if (r == NULL)
        return;
    if (tag->kind == RPROF_REPLY_XADD)
        xadd_reply(h, r, buf, m);
    else
        stream_reply(h, tag->kind, r, buf, m, p);
}

static void tx_hold(struct resp_tx_plan *p, uint32_t ms)
{
    p->hold = true;
    p->hold_ms = ms;
}

/* A transaction's XACKs and XADDs (redis-py's pipeline() makes one by default). */
static int tx_command(void *st, const struct rprof_cmdview *cv, size_t i, struct resp_tx_plan *p)
{
    const struct job_host *h = st;
    size_t first;
    if (rprof_ack_args(RPROF_STREAMS, cv, &first)) {
        struct jobs_acks a;
        int rc = jobs_plan_acks(h, cv, first, ack_decide, NULL, &a);
        if (rc == 0)
            (void)jobs_tx_acks(&a, cv, &p->cmds[i], p);
        jobs_acks_free(&a);
        return rc;
    }
    if (cv->id != RPROF_CMD_XADD)
        return 0;
    struct resp_bytes answer = {0};
    struct job_fault f = publish_decide(h, cv, &answer);
    if (f.kind == JOB_FAULT_DROP)
        jobs_keep_back_bytes(&p->cmds[i], &answer);
    else if (f.kind == JOB_FAULT_DELAY && !p->hold)
        tx_hold(p, f.ms);
    else if (f.kind == JOB_FAULT_CLOSE && f.before && p->cut_before == NULL)
        p->cut_before = f.rule;
    else if (f.kind == JOB_FAULT_CLOSE && !f.before && p->cut_after == NULL)
        p->cut_after = f.rule;
    resp_bytes_free(&answer);
    return 0;
}

static int st_transaction(const struct job_host *h, const uint8_t *buf, size_t len, size_t off,
                          uint64_t max_bulk, struct resp_tx_plan *p)
{
    struct rprof_tx scan;
    return jobs_tx_walk(buf, len, off, max_bulk, &scan, NULL, tx_command, (void *)h, p);
}

static bool st_tx_judged(const struct job_host *h)
{
    return h->wants(h->ctx, JOB_EV_ACK) || h->wants(h->ctx, JOB_EV_PUBLISH);
}

const struct resp_framework resp_framework_streams = {
    .name = "streams",
    .prof = RPROF_STREAMS,
    .command = st_command,
    .reply = st_reply,
    .transaction = st_transaction,
    .tx_judged = st_tx_judged,
    .free_state = jobs_free_state,
};
