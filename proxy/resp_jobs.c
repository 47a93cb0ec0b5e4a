/*
 * resp_jobs.c - the job events of a RESP session (resp_internal.h): `publish`, `deliver` and
 * `ack` for the listener's profile.
 *
 * proto/resp_profile.h says which commands and replies these are and reads the job's id,
 * task and queue out of them; this file asks the rules, journals, correlates an ack with its
 * delivery across connections (proxy/idmap.h: kombu's sync pool and RQ's work horse ack on
 * another connection than the one that popped), and carries out what a rule decided: a
 * reply rewritten, a command kept back, a copy pushed back on twice's own connection.
 */
#include "proxy/resp_internal.h"

#include <sys/random.h>

/* ---- engine and journal ------------------------------------------------ */

/* A copy of s for a field of j; NULL for NULL, and on allocation failure, which j->oom
 * remembers: a job event that lost a field would match other rules than the job's. */
char *rpx_jdup(struct rpx_job *j, const char *s)
{
    char *d = s != NULL ? strdup(s) : NULL;
    if (s != NULL && d == NULL)
        j->oom = true;
    return d;
}

char *rpx_known_task(struct rpx *rx, struct rpx_job *j, const char *id, size_t n)
{
    idmap_lock();
    struct job_memo *in = idmap_get(rpx_scope(rx), id, n);
    char *task = in != NULL && in->task != NULL ? rpx_jdup(j, in->task) : NULL;
    idmap_unlock();
    return task;
}

/* Whether j lost a field; if so it is logged, and neither journaled nor decided. */
static bool job_event_oom(struct rpx *rx, const struct rpx_job *j)
{
    if (j->oom)
        log_msg(LOG_WARN, "event skipped", "sid=%llu listener=%s event=%s reason=\"out of memory\"",
                (unsigned long long)rx->s->id, rpx_scope(rx), rule_event_name(j->kind));
    return j->oom;
}

void rpx_job_event_clear(struct rpx_job *j)
{
    free(j->id);
    free(j->task);
    free(j->queue);
    memset(j, 0, sizeof(*j));
}

/* One action per event (a reply cannot be both dropped and duplicated): the
 * first rule that fires, in file order. */
size_t rpx_decide(struct rpx *rx, struct engine_event *ev, size_t *hits)
{
    return codec_decide_first(rx->s, ev, hits);
}

const struct rule *rpx_hit_rule(struct rpx *rx, size_t idx)
{
    struct ruleset *rs = rx->s->loop->rules;
    if (rx->n_pinned == 0 || rx->pinned[rx->n_pinned - 1] != rs) {
        struct ruleset **p = realloc(rx->pinned, (rx->n_pinned + 1) * sizeof(*p));
        if (p == NULL) {
            /* The rule is valid now; the session ends before any later use. */
            session_set_error(rx->s, "out of memory");
            session_abort(rx->s, SESSION_CLOSE_INTERNAL_ERROR, -1);
        } else {
            ruleset_get(rs);
            p[rx->n_pinned++] = rs;
            rx->pinned = p;
        }
    }
    return ruleset_rule(rs, idx);
}

void rpx_journal_job(struct rpx *rx, enum journal_kind kind, const struct rpx_job *j)
{
    if (j->oom)
        return;
    struct job_event ev = {
        .id = j->id,
        .task = j->task,
        .queue = j->queue,
        .redelivered = j->redelivered,
        .retries = j->retries,
        .retry = j->retry,
        .refused = j->refused,
        .kept_back = j->kept_back,
        .started_unix_us = j->started_unix_us,
        .run = j->run,
    };
    rpx_journal_event(rx, kind, &ev);
}

/* Whether anything needs what a profile reads from a job's JSON: the journal
 * (every publish, delivery and ack is recorded with the job's identity) or a
 * rule on those events.  Without either, jobs are still counted as events
 * (/stats) but not decoded: jansson was a third of a profiled listener's CPU. */
bool rpx_jobs_needed(struct rpx *rx)
{
    return rx->s->px->journal != NULL || codec_wants(rx->s, RULE_EV_PUBLISH) ||
           codec_wants(rx->s, RULE_EV_DELIVER) || codec_wants(rx->s, RULE_EV_ACK) ||
           codec_wants(rx->s, RULE_EV_NACK) || codec_wants(rx->s, RULE_EV_LEASE);
}

/* The rules' view of a job event; anon (48 bytes) holds the identity of a
 * job without an id. */
void rpx_job_engine_event(struct rpx *rx, const struct rpx_job *j, struct engine_event *ev,
                          char *anon)
{
    memset(ev, 0, sizeof(*ev));
    ev->event = j->kind;
    ev->queue = j->queue;
    ev->message_id = j->id;
    ev->task = j->task;
    ev->key = j->key;
    ev->redelivered = j->redelivered;
    /* No id: each event is its own identity (session, a counter). */
    uint64_t seq = j->id == NULL ? ++rx->anon : 0;
    codec_event_identity(ev, anon, 48, (const uint64_t[]){rx->s->id, seq}, 2);
}

/* Decides a job event; returns the rule that acts on it (one action per
 * event: the first rule that fires, in file order). */
const struct rule *rpx_decide_job(struct rpx *rx, struct rpx_job *j)
{
    if (job_event_oom(rx, j))
        return NULL;
    if (!codec_wants(rx->s, j->kind)) {
        /* No rule of this listener looks at the event: counted, without
         * naming an anonymous job first. */
        codec_count(rx->s, j->kind);
        return NULL;
    }
    struct engine_event ev;
    char anon[48];
    rpx_job_engine_event(rx, j, &ev, anon);
    size_t hits[SESSION_MAX_RULE_HITS];
    size_t n = rpx_decide(rx, &ev, hits);
    for (size_t i = 0; i < n; i++) {
        const struct rule *r = rpx_hit_rule(rx, hits[i]);
        if (!rule_action_is_stream(r->action.kind))
            return r;
    }
    return NULL;
}

static void say_too_long(struct rpx *rx, const char *field, uint64_t len, size_t cap);

/* The job in payload v[0..n) of a list push or pop: Sidekiq's or Celery's, or any app's read
 * with the listener's `message-id` and `task` sources (the list profile). */
static int read_job(struct rpx *rx, const void *v, size_t n, struct resp_job *job)
{
    if (rx->prof != RPROF_LIST)
        return rprof_job(rx->prof, v, n, job);
    const struct conf_listener *l = rx->s->cfg->l;
    uint64_t too_long = 0;
    int rc = rprof_list_job(&l->message_id, &l->task, v, n, job, &too_long);
    if (too_long > 0)
        say_too_long(rx, "job field", too_long, MSG_FIELD_VALUE_MAX);
    return rc;
}

/* ---- deliveries ------------------------------------------------------- */

/* The idmap key under which the list profile remembers where a processing list is fed from
 * ("\x01" and its name: no job id of the listener's starts with that byte, as ids are JSON
 * strings read whole, and a processing list's entry must not be an id's).  False when it does
 * not fit. */
static bool processing_key(const char *list, char *out, size_t cap)
{
    int n = snprintf(out, cap, "\x01%s", list);
    return n > 0 && (size_t)n < cap;
}

/* A move of a list job onto processing list dst, from list src (its head when head): an ack on
 * dst later names neither, and a redelivery pushes the job back where it came from.  Kept per
 * processing list, not per job (a worker that only pops has no ack to clear it with): a
 * processing list fed from two queues is known by the last. */
static void remember_processing(struct rpx *rx, const char *dst, const char *src, bool head)
{
    char key[RPROF_KEY_MAX + 2];
    if (!processing_key(dst, key, sizeof(key)))
        return;
    idmap_lock();
    struct job_memo *in = idmap_put(rpx_scope(rx), key, strlen(key));
    if (in != NULL) {
        if (in->queue == NULL || strcmp(in->queue, src) != 0)
            job_memo_set(&in->queue, src, strlen(src));
        in->flags = head ? in->flags | JOB_MEMO_POP_HEAD : in->flags & ~(uint32_t)JOB_MEMO_POP_HEAD;
    }
    idmap_unlock();
}

/* A job from a popped value: decoded from its payload (Sidekiq, Celery, the list profile), or
 * its id with the task its RQ job hash gave (rpx_on_rq_hash()). */
static bool job_from_value(struct rpx *rx, const char *list, const uint8_t *v, size_t n,
                           struct rpx_job *j)
{
    struct resp_job job;
    memset(&job, 0, sizeof(job));
    if (rx->prof == RPROF_RQ) {
        if (n == 0 || n >= RPROF_KEY_MAX || (job.id = malloc(n + 1)) == NULL)
            return false;
        memcpy(job.id, v, n);
        job.id[n] = '\0';
        job.task = rpx_known_task(rx, j, (const char *)v, n);
    } else if (rx->prof != RPROF_SIDEKIQ && rx->prof != RPROF_CELERY && rx->prof != RPROF_LIST) {
        return false;
    } else if (rpx_jobs_needed(rx) && read_job(rx, v, n, &job) != 0) {
        return false;
    }
    j->id = job.id;
    j->task = job.task;
    j->queue = rprof_queue_of(rx->prof, list);
    j->oom |= j->queue == NULL;
    free(job.queue);
    j->redelivered = job.redelivered;
    j->retries = job.retries;
    /* Celery acks by delivery tag: remember what the tag stands for. */
    if (rx->prof == RPROF_CELERY && job.tag != NULL) {
        idmap_lock();
        struct job_memo *in = idmap_put(rpx_scope(rx), job.tag, strlen(job.tag));
        if (in != NULL) {
            job_memo_set(&in->id, j->id, j->id != NULL ? strlen(j->id) : 0);
            job_memo_set(&in->task, j->task, j->task != NULL ? strlen(j->task) : 0);
            job_memo_set(&in->queue, j->queue, j->queue != NULL ? strlen(j->queue) : 0);
            if (in->pending < UINT32_MAX)
                in->pending++;
        }
        idmap_unlock();
    }
    free(job.tag);
    return true;
}

/* ---- deliveries ------------------------------------------------------- */

/* A pop's reply nothing reads a job from (no journal, no rule on job events;
 * Sidekiq's and Celery's profiles, which then decode nothing): its delivery is
 * counted and it goes on as a plain reply does, without the copy the general
 * way makes of it.  False when it cannot: RQ's profile, or the reply waits
 * behind others. */
bool rpx_pop_reply_counted(struct rpx *rx, struct entry *e, const uint8_t *buf,
                           const struct resp_msg *m)
{
    if ((rx->prof != RPROF_SIDEKIQ && rx->prof != RPROF_CELERY && rx->prof != RPROF_LIST) ||
        rpx_jobs_needed(rx) || e != rx->head || e->release_ms != 0 || e->hide ||
        evbuffer_get_length(e->bytes) > 0)
        return false;
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (rprof_pop_reply(buf, m, e->arg, list, sizeof(list), &val, &pair))
        codec_count(rx->s, RULE_EV_DELIVER); /* as rpx_decide_job() counts it */
    rx->run[SIDE_UPSTREAM] += m->len;
    return true;
}

void rpx_on_pop_reply(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m,
                      struct evbuffer *reply)
{
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (!rprof_pop_reply(buf, m, e->arg, list, sizeof(list), &val, &pair))
        return;
    if (rx->prof == RPROF_RQ)
        rpx_rq_forget_lease(rx); /* the worker is on to its next job */
    if (rx->prof == RPROF_LIST && e->arg2 != NULL)
        remember_processing(rx, e->arg2, list, e->head);
    struct rpx_job j = {.kind = RULE_EV_DELIVER};
    if (!job_from_value(rx, list, buf + val.off, val.len, &j))
        return;
    j.key = list;
    rpx_journal_job(rx, JOURNAL_KIND_DELIVER, &j);
    const struct rule *r = rpx_decide_job(rx, &j);
    if (r != NULL) {
        switch (r->action.kind) {
        case RULE_ACT_DUPLICATE: {
            /* Celery's copy is marked redelivered, as kombu's restore marks it; a job that
             * cannot be marked goes back as it was. */
            const char *cmd = rprof_repush_cmd(rx->prof, e->head);
            uint32_t after = r->action.duration_ms;
            char *marked = NULL;
            size_t mlen = 0;
            if (rx->prof == RPROF_CELERY &&
                resp_job_celery_redelivered(buf + val.off, val.len, &marked, &mlen) == 0)
                rpx_repush(rx, cmd, list, marked, mlen, after);
            else
                rpx_repush(rx, cmd, list, buf + val.off, val.len, after);
            free(marked);
            break;
        }
        case RULE_ACT_DROP: {
            /* The job is popped and gone; the worker sees its pop time out. */
            uint8_t nb[8];
            int proto = rx->pairing.proto == 3 ? 3 : 2;
            int n = pair ? resp_encode_null_array(nb, sizeof(nb), proto)
                         : resp_encode_null(nb, sizeof(nb), proto);
            evbuffer_drain(reply, evbuffer_get_length(reply));
            if (n > 0)
                evbuffer_add(reply, nb, (size_t)n);
            break;
        }
        case RULE_ACT_DELAY:
            e->release_ms = proxy_now_ms() + r->action.duration_ms;
            break;
        case RULE_ACT_CLOSE:
            if (r->action.close_when == RULE_CLOSE_BEFORE) {
                evbuffer_drain(reply, evbuffer_get_length(reply));
                e->close_after = r; /* nothing of it goes out: cut at its turn */
            } else {
                e->close_after = r;
            }
            break;
        default:
            break;
        }
    }
    rpx_job_event_clear(&j);
}

/* A field longer than its limit (RPROF_ID_MAX, RPROF_TASK_MAX, cap with the NUL): the
 * session's first is logged with the field, its length and the limit. */
static void say_too_long(struct rpx *rx, const char *field, uint64_t len, size_t cap)
{
    if (rx->said_too_long)
        return;
    rx->said_too_long = true;
    log_msg(LOG_WARN, "resp field too long", "sid=%llu listener=%s field=%s bytes=%llu limit=%zu",
            (unsigned long long)rx->s->id, rpx_scope(rx), field, (unsigned long long)len, cap - 1);
}

/* One stream entry [id, fields] handed to a consumer: its event and fate.
 * Returns the rule deciding it, or NULL. */
static const struct rule *stream_delivery(struct rpx *rx, const char *stream, const uint8_t *buf,
                                          size_t len, const struct resp_view *entry,
                                          bool redelivered)
{
    struct rprof_entry ent;
    char key[RPROF_KEY_MAX + RPROF_ID_MAX + 2];
    int got = rprof_stream_entry(buf, len, entry, &ent);
    if (ent.too_long != NULL)
        say_too_long(rx, ent.too_long, ent.too_long_len,
                     got == 1 ? sizeof(ent.task) : sizeof(ent.id));
    if (got != 1)
        return NULL;
    const char *id = ent.id, *task = ent.task;
    bool has_task = task[0] != '\0';
    snprintf(key, sizeof(key), "%s %s", stream, id);
    struct rpx_job j = {.kind = RULE_EV_DELIVER, .redelivered = redelivered};
    idmap_lock();
    struct job_memo *in = idmap_put(rpx_scope(rx), key, strlen(key));
    if (in != NULL && has_task)
        job_memo_set(&in->task, task, strlen(task));
    if (has_task)
        j.task = rpx_jdup(&j, task);
    else if (in != NULL && in->task != NULL)
        j.task = rpx_jdup(&j, in->task);
    idmap_unlock();
    j.id = rpx_jdup(&j, id);
    j.queue = rpx_jdup(&j, stream);
    j.key = stream;
    rpx_journal_job(rx, JOURNAL_KIND_DELIVER, &j);
    const struct rule *r = rpx_decide_job(rx, &j);
    if (r != NULL && r->action.kind == RULE_ACT_DUPLICATE) {
        /* Its ack is swallowed: the entry stays pending. */
        idmap_lock();
        in = idmap_put(rpx_scope(rx), key, strlen(key));
        if (in != NULL) {
            in->flags |= JOB_MEMO_SUPPRESS_ACK;
            if (in->task == NULL && j.task != NULL) /* an ack removed it meanwhile */
                job_memo_set(&in->task, j.task, strlen(j.task));
        }
        idmap_unlock();
    }
    rpx_job_event_clear(&j);
    return r;
}

/* Entries of one array of stream entries: events, and the array rebuilt into
 * out without the dropped ones.  Returns whether any was dropped. */
static bool stream_entries(struct rpx *rx, struct entry *e, const char *stream, const uint8_t *buf,
                           size_t len, const struct resp_view *arr, bool redelivered,
                           struct evbuffer *out)
{
    struct resp_args it;
    rprof_walk_init(&it, buf, len, arr);
    struct resp_view v;
    size_t start, end;
    uint64_t kept = 0;
    bool dropped = false;
    struct evbuffer *body = evbuffer_new();
    if (body == NULL)
        return false;
    while (rpx_walk_next(&it, &v, &start, &end) == 1) {
        const struct rule *r = stream_delivery(rx, stream, buf, len, &v, redelivered);
        if (r != NULL && r->action.kind == RULE_ACT_DROP) {
            dropped = true;
            continue;
        }
        if (r != NULL && r->action.kind == RULE_ACT_DELAY) {
            uint64_t at = proxy_now_ms() + r->action.duration_ms;
            if (at > e->release_ms)
                e->release_ms = at;
        }
        if (r != NULL && r->action.kind == RULE_ACT_CLOSE && e->close_after == NULL)
            e->close_after = r;
        evbuffer_add(body, buf + start, end - start);
        kept++;
    }
    evbuffer_add_printf(out, "*%llu\r\n", (unsigned long long)kept);
    evbuffer_add_buffer(out, body);
    evbuffer_free(body);
    return dropped;
}

/* XREADGROUP / XCLAIM / XAUTOCLAIM replies. */
void rpx_on_stream_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                         const struct resp_msg *m, struct evbuffer *reply)
{
    if (m->null || !rprof_is_agg(&m->value))
        return;
    struct evbuffer *out = evbuffer_new();
    if (out == NULL)
        return;
    bool dropped = false;
    struct resp_args it;
    struct resp_view v;
    size_t start, end;
    resp_args_init(&it, buf, m);
    if (e->kind == RPROF_REPLY_XCLAIM) {
        dropped =
            stream_entries(rx, e, e->arg != NULL ? e->arg : "", buf, m->len, &m->value, true, out);
    } else if (e->kind == RPROF_REPLY_XAUTOCLAIM) {
        evbuffer_add_printf(out, "*%llu\r\n", (unsigned long long)m->nelem);
        for (uint64_t i = 0; rpx_walk_next(&it, &v, &start, &end) == 1; i++) {
            if (i == 1 && rprof_is_agg(&v))
                dropped |=
                    stream_entries(rx, e, e->arg != NULL ? e->arg : "", buf, m->len, &v, true, out);
            else
                evbuffer_add(out, buf + start, end - start);
        }
    } else if (m->value.type == '%') {
        /* RESP3: {stream => entries} */
        evbuffer_add_printf(out, "%%%llu\r\n", (unsigned long long)(m->nelem / 2));
        char stream[RPROF_KEY_MAX];
        while (rpx_walk_next(&it, &v, &start, &end) == 1) {
            evbuffer_add(out, buf + start, end - start);
            rprof_view_str(buf, m->len, &v, stream, sizeof(stream));
            if (rpx_walk_next(&it, &v, &start, &end) != 1)
                break;
            if (rprof_is_agg(&v))
                dropped |= stream_entries(rx, e, stream, buf, m->len, &v, e->redelivered, out);
            else
                evbuffer_add(out, buf + start, end - start);
        }
    } else {
        /* RESP2: [[stream, entries], ...] */
        evbuffer_add_printf(out, "*%llu\r\n", (unsigned long long)m->nelem);
        while (rpx_walk_next(&it, &v, &start, &end) == 1) {
            struct resp_args in;
            struct resp_view k, ents;
            size_t ks, ke, es, ee;
            char stream[RPROF_KEY_MAX];
            if (!rprof_is_agg(&v) || v.count != 2) {
                evbuffer_add(out, buf + start, end - start);
                continue;
            }
            rprof_walk_init(&in, buf, m->len, &v);
            if (rpx_walk_next(&in, &k, &ks, &ke) != 1 || rpx_walk_next(&in, &ents, &es, &ee) != 1)
                break;
            rprof_view_str(buf, m->len, &k, stream, sizeof(stream));
            evbuffer_add(out, "*2\r\n", 4);
            evbuffer_add(out, buf + ks, ke - ks);
            if (rprof_is_agg(&ents))
                dropped |= stream_entries(rx, e, stream, buf, m->len, &ents, e->redelivered, out);
            else
                evbuffer_add(out, buf + es, ee - es);
        }
    }
    if (dropped && m->body == 0) {
        evbuffer_drain(reply, evbuffer_get_length(reply));
        evbuffer_add_buffer(reply, out);
    }
    evbuffer_free(out);
    if (e->close_after != NULL && e->close_after->action.close_when == RULE_CLOSE_BEFORE)
        evbuffer_drain(reply, evbuffer_get_length(reply));
}

/* RQ's job hash as a worker reads it: remember the task for the id. */
void rpx_on_rq_hash(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m)
{
    char *task = NULL;
    if (e->arg == NULL || rprof_rq_hash_task(buf, m, &task) != 0)
        return;
    idmap_lock();
    struct job_memo *in = idmap_put(rpx_scope(rx), e->arg, strlen(e->arg));
    if (in != NULL && in->task == NULL)
        job_memo_set(&in->task, task, strlen(task));
    idmap_unlock();
    free(task);
}

void rpx_on_xadd_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m)
{
    char id[RPROF_ID_MAX];
    uint64_t n;
    enum rprof_field got = rprof_xadd_reply_id(buf, m, id, sizeof(id), &n);
    if (got == RPROF_TOO_LONG)
        say_too_long(rx, "stream entry id", n, sizeof(id));
    if (got != RPROF_FOUND)
        return;
    struct rpx_job j = {.kind = RULE_EV_PUBLISH};
    j.id = rpx_jdup(&j, id);
    j.queue = e->arg != NULL ? rpx_jdup(&j, e->arg) : NULL;
    j.task = e->arg2 != NULL ? rpx_jdup(&j, e->arg2) : NULL;
    rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    if (e->arg != NULL && e->arg2 != NULL) {
        char key[RPROF_KEY_MAX + RPROF_ID_MAX + 2];
        snprintf(key, sizeof(key), "%s %s", e->arg, id);
        idmap_lock();
        struct job_memo *in = idmap_put(rpx_scope(rx), key, strlen(key));
        if (in != NULL)
            job_memo_set(&in->task, e->arg2, strlen(e->arg2));
        idmap_unlock();
    }
    rpx_job_event_clear(&j);
}

/* What happens to one ack (by id or tag). */
struct ack_fate {
    bool suppress; /* not applied now */
    bool later;    /* applied later (delay) */
    uint32_t later_ms;
    bool repush;        /* rq redeliver: the id goes back on its queue */
    uint32_t repush_ms; /* that much later (`redeliver after D`) */
    const struct rule *close_before, *close_after;
};

static void ack_decide(struct rpx *rx, const struct rprof_cmdview *cv, const char *id,
                       struct ack_fate *f)
{
    memset(f, 0, sizeof(*f));
    char key[RPROF_KEY_MAX + RPROF_ID_MAX + 2];
    if (rx->prof == RPROF_STREAMS)
        snprintf(key, sizeof(key), "%s %s", cv->key, id);
    else
        snprintf(key, sizeof(key), "%s", id);
    struct rpx_job j = {.kind = RULE_EV_ACK};
    j.key = cv->key;
    idmap_lock();
    struct job_memo *in = idmap_get(rpx_scope(rx), key, strlen(key));
    if (rx->prof == RPROF_CELERY) {
        j.id = in != NULL && in->id != NULL ? rpx_jdup(&j, in->id) : NULL;
        j.queue = in != NULL && in->queue != NULL ? rpx_jdup(&j, in->queue) : NULL;
    } else {
        j.id = rpx_jdup(&j, id);
        j.queue = rprof_queue_of(rx->prof, cv->key);
        j.oom |= j.queue == NULL;
    }
    j.task = in != NULL && in->task != NULL ? rpx_jdup(&j, in->task) : NULL;
    /* A duplicate decided at delivery: this ack never lands, so the entry
     * stays pending for the next XAUTOCLAIM (the mark is used up here). */
    bool swallow_dup = in != NULL && (in->flags & JOB_MEMO_SUPPRESS_ACK) != 0;
    if (swallow_dup)
        in->flags &= ~(uint32_t)JOB_MEMO_SUPPRESS_ACK;
    uint64_t gen = in != NULL ? in->gen : 0;
    idmap_unlock();
    rpx_journal_job(rx, JOURNAL_KIND_ACK, &j);
    /* A swallowed ack is only counted: a rule that fired on it would be
     * journaled as a fault it never made. */
    const struct rule *r = NULL;
    if (swallow_dup)
        codec_count(rx->s, RULE_EV_ACK);
    else
        r = rpx_decide_job(rx, &j);
    rpx_job_event_clear(&j);
    if (swallow_dup) {
        f->suppress = true;
        return;
    }
    if (r != NULL && rx->prof == RPROF_CELERY) {
        /* Faulted: the entry stays for the delivery the fault brings back, this one is done. */
        idmap_lock();
        in = idmap_get(rpx_scope(rx), key, strlen(key));
        if (in != NULL && in->pending > 0)
            in->pending--;
        idmap_unlock();
    }
    if (r == NULL) {
        /* Settled for good: forget the entry, unless another connection's
         * delivery of the same id made it anew or marked it meanwhile, or another delivery of
         * the tag (a copy) is still to be acked. */
        idmap_lock();
        in = idmap_get(rpx_scope(rx), key, strlen(key));
        if (in != NULL && in->pending > 1)
            in->pending--;
        else if (in != NULL && in->gen == gen && (in->flags & JOB_MEMO_SUPPRESS_ACK) == 0)
            idmap_del(rpx_scope(rx), key, strlen(key));
        idmap_unlock();
        return;
    }
    switch (r->action.kind) {
    case RULE_ACT_REDELIVER:
        f->suppress = true;
        f->repush = rx->prof == RPROF_RQ;
        f->repush_ms = r->action.duration_ms;
        break;
    case RULE_ACT_DROP:
        f->suppress = true;
        break;
    case RULE_ACT_DELAY:
        f->suppress = true;
        f->later = true;
        f->later_ms = r->action.duration_ms;
        break;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE)
            f->close_before = r;
        else
            f->close_after = r;
        break;
    default:
        break;
    }
}

void rpx_ack_plan_free(struct ack_plan *p)
{
    if (p->kept != NULL)
        evbuffer_free(p->kept);
    if (p->later != NULL)
        evbuffer_free(p->later);
    if (p->repush != NULL)
        evbuffer_free(p->repush);
}

int rpx_plan_acks(struct rpx *rx, const struct rprof_cmdview *cv, size_t first, struct ack_plan *p)
{
    memset(p, 0, sizeof(*p));
    size_t argc = cv->m->nelem;
    if (argc <= first || argc > 1024)
        return 0;
    const char **keep = calloc(argc, sizeof(*keep));
    size_t *keep_len = calloc(argc, sizeof(*keep_len));
    const char **late = calloc(argc, sizeof(*late));
    size_t *late_len = calloc(argc, sizeof(*late_len));
    char(*ids)[RPROF_KEY_MAX] = calloc(argc, RPROF_KEY_MAX);
    if (keep == NULL || keep_len == NULL || late == NULL || late_len == NULL || ids == NULL) {
        free(keep);
        free(keep_len);
        free(late);
        free(late_len);
        free(ids);
        return -1;
    }
    size_t nk = 0, nl = 0;
    struct resp_args it;
    resp_args_init(&it, cv->buf, cv->m);
    struct resp_view v;
    for (size_t i = 0; i < argc && resp_args_next(&it, &v) == 1; i++) {
        bool ok = rprof_view_str(cv->buf, cv->len, &v, ids[i], RPROF_KEY_MAX);
        if (i < first || !ok) {
            keep[nk] = ids[i];
            keep_len[nk++] = strlen(ids[i]);
            if (i < first) {
                late[nl] = ids[i];
                late_len[nl++] = strlen(ids[i]);
            }
            continue;
        }
        struct ack_fate f;
        ack_decide(rx, cv, ids[i], &f);
        p->n++;
        if (f.close_before != NULL && p->close_before == NULL)
            p->close_before = f.close_before;
        if (f.close_after != NULL && p->close_after == NULL)
            p->close_after = f.close_after;
        if (!f.suppress) {
            keep[nk] = ids[i];
            keep_len[nk++] = strlen(ids[i]);
            continue;
        }
        p->suppressed++;
        if (f.later) {
            late[nl] = ids[i];
            late_len[nl++] = strlen(ids[i]);
            p->any_later = true;
            if (f.later_ms > p->later_ms)
                p->later_ms = f.later_ms;
        }
        if (f.repush) {
            char list[RPROF_KEY_MAX + 16];
            if (!rprof_rq_queue_of_wip(cv->key, list, sizeof(list)))
                continue;
            if (p->repush == NULL)
                p->repush = evbuffer_new();
            const char *argv[3] = {"LPUSH", list, ids[i]};
            size_t lens[3] = {5, strlen(list), strlen(ids[i])};
            if (p->repush != NULL && rpx_encode_cmd(p->repush, 3, argv, lens) == 0)
                p->repush_n++;
            if (f.repush_ms > p->repush_ms)
                p->repush_ms = f.repush_ms;
        }
    }
    if (p->suppressed > 0 && p->suppressed < p->n && (p->kept = evbuffer_new()) != NULL)
        rpx_encode_cmd(p->kept, nk, keep, keep_len);
    if (nl > first && (p->later = evbuffer_new()) != NULL)
        rpx_encode_cmd(p->later, nl, late, late_len);
    free(keep);
    free(keep_len);
    free(late);
    free(late_len);
    free(ids);
    return 0;
}

/* Sends what an ack plan defers or adds on twice's own connection. */
static void ack_plan_side_effects(struct rpx *rx, struct ack_plan *p)
{
    if (p->later != NULL)
        rpx_aux_send_at(rx, p->later, 1, p->later_ms);
    if (p->repush != NULL)
        rpx_aux_send_at(rx, p->repush, p->repush_n, p->repush_ms);
}

/* An XADD, decided before Redis sees it: its task (the `task` field) and its
 * stream are known, its id only when the client chose it (else Redis picks
 * it, and the reply's id is journaled, see on_xadd_reply).  A publish that a
 * rule keeps from Redis (drop, close before) is journaled here, and a drop
 * is answered with the id the client gave or one made as Redis makes them
 * (milliseconds-sequence), in rx->xadd_answer. */
const struct rule *rpx_stream_publish_decide(struct rpx *rx, const struct rprof_cmdview *cv)
{
    if (!rpx_is_cmd(cv, RPROF_CMD_XADD) || rx->tx.active)
        return NULL;
    if (!codec_wants(rx->s, RULE_EV_PUBLISH)) {
        codec_count(rx->s, RULE_EV_PUBLISH);
        return NULL;
    }
    size_t at = rprof_xadd_id_arg(cv);
    struct resp_view v;
    char id[sizeof(rx->xadd_answer) - 32], task[RPROF_TASK_MAX];
    if (at == 0 || !rprof_arg(cv, at, &v) || !rprof_view_str(cv->buf, cv->len, &v, id, sizeof(id)))
        return NULL;
    bool chosen = strcmp(id, "*") != 0;
    uint64_t tlen;
    if (rprof_xadd_task(cv, task, sizeof(task), &tlen) == RPROF_TOO_LONG)
        say_too_long(rx, "task", tlen, sizeof(task));
    struct rpx_job j = {.kind = RULE_EV_PUBLISH};
    j.key = cv->key;
    j.id = chosen ? rpx_jdup(&j, id) : NULL;
    j.queue = rpx_jdup(&j, cv->key);
    j.task = task[0] != '\0' ? rpx_jdup(&j, task) : NULL;
    /* Redis picks the id of an XADD with '*': the rules decide without one,
     * and the fault is noted once it is known whether twice made one (a
     * drop), so that the fault and the publish records share it. */
    if (job_event_oom(rx, &j)) {
        rpx_job_event_clear(&j);
        return NULL;
    }
    struct engine_event ev;
    char anon[48];
    rpx_job_engine_event(rx, &j, &ev, anon);
    size_t hit = 0;
    const struct rule *r =
        codec_decide_first_unnoted(rx->s, &ev, &hit) == 1 ? rpx_hit_rule(rx, hit) : NULL;
    bool kept_back =
        r != NULL &&
        (r->action.kind == RULE_ACT_DROP ||
         (r->action.kind == RULE_ACT_CLOSE && r->action.close_when == RULE_CLOSE_BEFORE));
    if (kept_back && r->action.kind == RULE_ACT_DROP) {
        if (chosen) {
            /* As Redis completes it: "5" is 5-0, and "5-*" gets sequence 0 in
             * a stream that has nothing at 5. */
            size_t n = strlen(id);
            const char *dash = strchr(id, '-');
            if (dash == NULL)
                snprintf(rx->xadd_answer, sizeof(rx->xadd_answer), "%s-0", id);
            else if (strcmp(dash, "-*") == 0)
                snprintf(rx->xadd_answer, sizeof(rx->xadd_answer), "%.*s-0", (int)(n - 2), id);
            else
                snprintf(rx->xadd_answer, sizeof(rx->xadd_answer), "%s", id);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            snprintf(rx->xadd_answer, sizeof(rx->xadd_answer), "%llu-%llu",
                     (unsigned long long)ts.tv_sec * 1000ULL +
                         (unsigned long long)ts.tv_nsec / 1000000ULL,
                     (unsigned long long)rx->anon++);
        }
        if (j.id == NULL)
            j.id = rpx_jdup(&j, rx->xadd_answer);
    }
    if (r != NULL) {
        ev.message_id = j.id;
        fault_note(rx->s, r, &ev);
    }
    if (kept_back)
        rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    rpx_job_event_clear(&j);
    return r;
}

/* What a publish a rule dropped is answered with, into out (room for
 * sizeof(rx->xadd_answer) + 32 bytes); returns its length: a list push's
 * length 1, or an XADD's id (rpx_stream_publish_decide()). */
size_t rpx_drop_reply(const struct rpx *rx, char *out, size_t cap)
{
    int n = rx->prof == RPROF_STREAMS
                ? snprintf(out, cap, "$%zu\r\n%s\r\n", strlen(rx->xadd_answer), rx->xadd_answer)
                : snprintf(out, cap, ":1\r\n");
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* A delivery tag as kombu draws one (a uuid4 string) into out[37]; false when the kernel gives
 * no random bytes. */
static bool new_delivery_tag(char out[37])
{
    uint8_t b[16];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b))
        return false;
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return true;
}

/* A publish a `duplicate` rule sends twice: the same command with value v, kept for the
 * caller to send (rx->pub_copies), as a producer that retried its push would send it again.
 * A Celery job gets a new delivery tag, as a retrying kombu producer draws one: two messages in
 * kombu's `unacked` hash under one tag would be one. */
static void pub_copy(struct rpx *rx, const struct rule *r, const struct rprof_cmdview *cv,
                     const struct resp_view *v)
{
    if (r == NULL || r->action.kind != RULE_ACT_DUPLICATE)
        return;
    if (rx->pub_copies == NULL && (rx->pub_copies = evbuffer_new()) == NULL)
        return;
    char tag[37], *retagged = NULL;
    size_t rlen = 0;
    if (rx->prof == RPROF_CELERY &&
        (!new_delivery_tag(tag) ||
         resp_job_celery_retagged(cv->buf + v->off, v->len, tag, &retagged, &rlen) != 0)) {
        log_msg(LOG_WARN, "publish not duplicated", "sid=%llu listener=%s reason=no_new_tag",
                (unsigned long long)rx->s->id, rpx_scope(rx));
        return;
    }
    const char *argv[3] = {cv->name, cv->key,
                           retagged != NULL ? retagged : (const char *)cv->buf + v->off};
    size_t lens[3] = {strlen(cv->name), strlen(cv->key), retagged != NULL ? rlen : v->len};
    if (rpx_encode_cmd(rx->pub_copies, 3, argv, lens) == 0)
        rx->n_pub_copies++;
    free(retagged);
}

/* Sidekiq's and Celery's LPUSH of job JSON, the list profile's LPUSH or RPUSH (outside a
 * transaction): a publish per job read.
 * Returns the first deciding rule, or NULL. */
static const struct rule *publish_jobs(struct rpx *rx, const struct rprof_cmdview *cv)
{
    if (rx->tx.active)
        return NULL;
    if (!rpx_jobs_needed(rx)) {
        /* Nothing reads the jobs: each is counted, as rpx_decide_job() would. */
        for (size_t i = 2; i < cv->m->nelem; i++)
            codec_count(rx->s, RULE_EV_PUBLISH);
        return NULL;
    }
    const struct rule *first = NULL;
    struct resp_view v;
    for (size_t i = 2; rprof_arg(cv, i, &v); i++) {
        struct resp_job job;
        if (read_job(rx, cv->buf + v.off, v.len, &job) != 0)
            continue;
        /* A job that carries a retry count is one its app sends again: Sidekiq's retry poller
         * pushes a failed job back with retry_count set, Celery's retry sends the task with its
         * retries one up. */
        struct rpx_job j = {.kind = RULE_EV_PUBLISH,
                            .id = job.id,
                            .task = job.task,
                            .retries = job.retries,
                            .retry = job.retries > 0};
        j.key = cv->key;
        j.queue = rprof_queue_of(rx->prof, cv->key);
        j.oom |= j.queue == NULL;
        free(job.queue);
        free(job.tag);
        rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
        const struct rule *r = rpx_decide_job(rx, &j);
        if (first == NULL)
            first = r;
        pub_copy(rx, r, cv, &v);
        rpx_job_event_clear(&j);
    }
    return first;
}

/* RQ's push of a job id onto its queue; its task from the job's hash, as the enqueue
 * transaction saved it (tx_first_cmd()) or a worker read it, else rq->task (the transaction's
 * last saved task, when the idmap could not keep it).  A push of the job the transaction saved
 * as one that ran is RQ's retry. */
static const struct rule *publish_rq(struct rpx *rx, const struct rprof_cmdview *cv,
                                     const struct rpx_rq_saved *rq)
{
    char id[RPROF_KEY_MAX];
    struct resp_view v;
    if (!rprof_arg(cv, 2, &v) || !rprof_view_str(cv->buf, cv->len, &v, id, sizeof(id)))
        return NULL;
    struct rpx_job j = {.kind = RULE_EV_PUBLISH, .key = cv->key};
    j.id = rpx_jdup(&j, id);
    j.queue = rprof_queue_of(rx->prof, cv->key);
    j.oom |= j.queue == NULL;
    j.task = rpx_known_task(rx, &j, id, strlen(id));
    if (j.task == NULL && rq != NULL && rq->task[0] != '\0') {
        /* An ack earlier in the transaction forgot the job (RQ's retry settles the job, saves
         * it again and pushes its id): its next delivery needs the task again. */
        j.task = rpx_jdup(&j, rq->task);
        idmap_lock();
        struct job_memo *in = idmap_put(rpx_scope(rx), id, strlen(id));
        if (in != NULL && in->task == NULL)
            job_memo_set(&in->task, rq->task, strlen(rq->task));
        idmap_unlock();
    }
    /* A job the started registry's cleanup requeues ran before too, but its lease lapsed: RQ
     * hands it out again, the app asked for nothing. */
    for (size_t i = 0; rq != NULL && !rq->reaps && i < rq->n_ran && !j.retry; i++)
        j.retry = strcmp(rq->ran[i], id) == 0;
    rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    const struct rule *r = rpx_decide_job(rx, &j);
    pub_copy(rx, r, cv, &v);
    rpx_job_event_clear(&j);
    return r;
}

/* Publishes: Sidekiq's, Celery's and the list profile's pushes of job JSON, RQ's push of a job
 * id, XADD.  Returns
 * the deciding rule, or NULL. */
const struct rule *rpx_publish_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                      const struct rpx_rq_saved *rq)
{
    switch (rprof_publish_of(rx->prof, cv)) {
    case RPROF_PUB_JOBS:
        return publish_jobs(rx, cv);
    case RPROF_PUB_RQ_ID:
        return publish_rq(rx, cv, rq);
    case RPROF_PUB_XADD:
        return rpx_stream_publish_decide(rx, cv);
    default:
        return NULL;
    }
}

struct entry *rpx_forward_instead(struct rpx *rx, struct evbuffer *cmd, size_t len)
{
    struct resp_msg km;
    struct resp_scanner ks;
    resp_scanner_init(&ks, RESP_SIDE_CLIENT);
    size_t klen = evbuffer_get_length(cmd);
    const uint8_t *kb = evbuffer_pullup(cmd, (ev_ssize_t)klen);
    if (kb == NULL || resp_scan(&ks, kb, klen, &km) != 1 ||
        resp_pairing_command(&rx->pairing, &km, kb, 0, NULL) != 1)
        return NULL;
    rpx_swallow(rx, len); /* moves the run first */
    evbuffer_add_buffer(rx->out[SIDE_UPSTREAM], cmd);
    return rpx_entry_add(rx, true);
}

/* An ack outside a transaction (its ids from argument `first` on): applied, kept back,
 * delayed or cut as its rules say. */
enum cmd_result rpx_command_ack(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                                const uint8_t *buf, size_t first)
{
    size_t len = m->len;
    struct ack_plan p;
    if (rpx_plan_acks(rx, cv, first, &p) != 0) {
        rpx_forward(rx, cv, m, buf, len);
        rx->decided = 0;
        return CMD_DONE;
    }
    if (p.close_before != NULL) {
        const struct rule *r = p.close_before;
        rpx_ack_plan_free(&p);
        rpx_swallow(rx, len);
        rpx_cut_at_turn(rx, r, NULL);
        return CMD_STOP;
    }
    ack_plan_side_effects(rx, &p);
    struct entry *e = NULL;
    if (p.suppressed > 0 && p.suppressed == p.n) {
        rpx_swallow(rx, len);
        char r[32];
        int n = snprintf(r, sizeof(r), ":%lld\r\n", (long long)rprof_settled_count(cv));
        if (rpx_owe_reply(rx))
            rpx_answer(rx, r, (size_t)n);
    } else if (p.suppressed > 0 && p.kept != NULL) {
        /* The command without the kept-back ids; its count plus them. */
        if ((e = rpx_forward_instead(rx, p.kept, len)) != NULL) {
            e->kind = RK_ADD_INT;
            e->add = (int64_t)p.suppressed;
        } else {
            e = rpx_forward(rx, cv, m, buf, len);
        }
    } else {
        e = rpx_forward(rx, cv, m, buf, len);
    }
    const struct rule *close_after = p.close_after;
    rpx_ack_plan_free(&p);
    rx->decided = 0;
    if (close_after != NULL) {
        rpx_cut_at_turn(rx, close_after, e);
        return CMD_STOP;
    }
    return CMD_DONE;
}

/* The list a processing list is fed from, as moves onto it showed (remember_processing()):
 * malloc'd into *src with its end in *head; false when twice saw no move onto it. */
static bool processing_source(struct rpx *rx, const char *list, char **src, bool *head)
{
    char key[RPROF_KEY_MAX + 2];
    *src = NULL;
    *head = false;
    if (!processing_key(list, key, sizeof(key)))
        return false;
    idmap_lock();
    struct job_memo *in = idmap_get(rpx_scope(rx), key, strlen(key));
    if (in != NULL && in->queue != NULL) {
        *src = strdup(in->queue);
        *head = (in->flags & JOB_MEMO_POP_HEAD) != 0;
    }
    idmap_unlock();
    return *src != NULL;
}

/* A list job's ack, LREM processing COUNT JOB on a processing list fed from src, decided; the
 * job's id and task are its payload's, its queue src.  Returns the deciding rule. */
static const struct rule *list_ack_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                          const struct resp_view *job, const char *src)
{
    if (!rpx_jobs_needed(rx)) {
        codec_count(rx->s, RULE_EV_ACK);
        return NULL;
    }
    struct resp_job rj;
    if (read_job(rx, cv->buf + job->off, job->len, &rj) != 0)
        return NULL;
    struct rpx_job j = {.kind = RULE_EV_ACK, .key = cv->key, .id = rj.id, .task = rj.task};
    /* The queue is the list it was delivered from, as the delivery's record names it. */
    j.queue = rpx_jdup(&j, src);
    rpx_journal_job(rx, JOURNAL_KIND_ACK, &j);
    const struct rule *r = rpx_decide_job(rx, &j);
    rpx_job_event_clear(&j);
    return r;
}

/* Lua for twice's own connection: a redelivery of a list job, KEYS[1] the processing list,
 * KEYS[2] the queue, ARGV the LREM's count, the job and the push.  The job goes back onto its
 * queue only if it was still in the processing list: an app's own recovery may have put it
 * back meanwhile (during `redeliver after D`), or the worker's LREM may have had nothing to
 * remove, and a push then would be a copy no lost ack makes. */
static const char LIST_REDELIVER_LUA[] =
    "if redis.call('LREM', KEYS[1], ARGV[1], ARGV[2]) > 0 then "
    "return redis.call(ARGV[3], KEYS[2], ARGV[2]) end return 0";

/* The commands twice sends for a list ack it keeps back (`delay`: the LREM itself;
 * `redeliver`: the LREM and, if it removed the job, its push back onto src) into b; false when
 * they could not be made. */
static bool list_ack_later(struct evbuffer *b, enum rule_action_kind act,
                           const struct rprof_cmdview *cv, const struct resp_view *job,
                           const char *src, bool head)
{
    if (act == RULE_ACT_DELAY)
        return evbuffer_add(b, cv->buf, cv->len) == 0;
    struct resp_view count;
    if (!rprof_arg(cv, 2, &count))
        return false;
    const char *push = rprof_repush_cmd(RPROF_LIST, head);
    const char *argv[8] = {"EVAL",
                           LIST_REDELIVER_LUA,
                           "2",
                           cv->key,
                           src,
                           (const char *)cv->buf + count.off,
                           (const char *)cv->buf + job->off,
                           push};
    size_t lens[8] = {4,           sizeof(LIST_REDELIVER_LUA) - 1,
                      1,           strlen(cv->key),
                      strlen(src), count.len,
                      job->len,    strlen(push)};
    return rpx_encode_cmd(b, 8, argv, lens) == 0;
}

/* The list profile's ack outside a transaction: an LREM on a list twice saw jobs moved onto
 * (any other LREM is a plain command).  Forwarded, or kept back and answered as Redis answers
 * the removal of one job (`:1`), never applied (`drop`: the job stays in the processing list
 * for the app's own recovery), applied later (`delay`), or applied with the job pushed back
 * onto the list it came from (`redeliver`: as an app's recovery of a processing list requeues
 * a job whose worker never finished it), on twice's own connection. */
enum cmd_result rpx_command_list_ack(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct resp_view *job)
{
    size_t len = m->len;
    char *src = NULL;
    bool head = false;
    const struct rule *r = NULL;
    if (processing_source(rx, cv->key, &src, &head))
        r = list_ack_decide(rx, cv, job, src);
    enum rule_action_kind act = r != NULL ? r->action.kind : RULE_ACT_COUNT; /* none */
    if (act == RULE_ACT_DELAY || act == RULE_ACT_REDELIVER) {
        /* The client's bytes are gone once swallowed: the commands are made first. */
        struct evbuffer *later = evbuffer_new();
        if (later != NULL && list_ack_later(later, act, cv, job, src, head)) {
            rpx_aux_send_at(rx, later, 1, r->action.duration_ms);
        } else {
            /* The fault is noted already; the ack goes on rather than being lost. */
            log_msg(LOG_WARN, "ack not kept back",
                    "sid=%llu listener=%s rule=%s reason=\"out of memory\"",
                    (unsigned long long)rx->s->id, rpx_scope(rx), r->name);
            act = RULE_ACT_COUNT;
        }
        if (later != NULL)
            evbuffer_free(later);
    }
    free(src);
    rx->decided = 0;
    switch (act) {
    case RULE_ACT_DROP:
    case RULE_ACT_DELAY:
    case RULE_ACT_REDELIVER:
        rpx_swallow(rx, len);
        if (rpx_owe_reply(rx))
            rpx_answer(rx, ":1\r\n", 4);
        return CMD_DONE;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE) {
            rpx_swallow(rx, len);
            rpx_cut_at_turn(rx, r, NULL);
        } else {
            rpx_cut_at_turn(rx, r, rpx_forward(rx, cv, m, buf, len));
        }
        return CMD_STOP;
    default:
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
}

/* What the reply to a forwarded command is, for the reply side: a pop's job, an RQ job
 * hash, a stream read or claim, an XADD's id. */
void rpx_tag_reply(struct rpx *rx, struct rprof_cmdview *cv, struct entry *e)
{
    const char *arg;
    bool redelivered;
    e->kind = (uint8_t)rprof_reply_of(rx->prof, cv, &arg, &redelivered);
    e->redelivered = redelivered;
    e->head = e->kind == RPROF_REPLY_POP && rprof_pop_takes_head(cv);
    bool copied = arg == NULL || (e->arg = strdup(arg)) != NULL;
    char dst[RPROF_KEY_MAX];
    if (copied && e->kind == RPROF_REPLY_POP && rx->prof == RPROF_LIST &&
        rprof_pop_moves_to(cv, dst, sizeof(dst)))
        copied = (e->arg2 = strdup(dst)) != NULL;
    if (copied && e->kind == RPROF_REPLY_XADD) {
        char task[RPROF_TASK_MAX];
        uint64_t n;
        enum rprof_field got = rprof_xadd_task(cv, task, sizeof(task), &n);
        if (got == RPROF_TOO_LONG)
            say_too_long(rx, "task", n, sizeof(task));
        copied = got != RPROF_FOUND || (e->arg2 = strdup(task)) != NULL;
    }
    if (!copied) {
        /* Read without its list, stream or task, the reply would name another job. */
        log_msg(LOG_WARN, "event skipped", "sid=%llu listener=%s reason=\"out of memory\"",
                (unsigned long long)rx->s->id, rpx_scope(rx));
        e->kind = RPROF_REPLY_PLAIN;
    }
}

/* Run keys: the process identity and the thread id, "<identity> <tid>". */
#define RPX_RUN_MAX (RPROF_KEY_MAX + 64)

void rpx_sidekiq_journal_running(struct rpx *rx, const struct rprof_cmdview *cv,
                                 size_t identity_len)
{
    struct resp_view f, v;
    for (size_t i = 2; rprof_arg(cv, i, &f) && rprof_arg(cv, i + 1, &v); i += 2) {
        struct resp_job job;
        uint64_t started = 0;
        if (f.type != '$' || v.type != '$' || f.len > 64 ||
            resp_job_sidekiq_work(cv->buf + v.off, v.len, &job, &started) != 0)
            continue;
        char run[RPX_RUN_MAX];
        snprintf(run, sizeof(run), "%.*s %.*s", (int)identity_len, cv->key, (int)f.len,
                 (const char *)cv->buf + f.off);
        struct rpx_job j = {.kind = RULE_EV_LEASE, .started_unix_us = started, .run = run};
        j.id = rpx_jdup(&j, job.id);
        j.task = rpx_jdup(&j, job.task);
        j.queue = job.queue != NULL ? rpx_jdup(&j, job.queue) : NULL;
        resp_job_clear(&job);
        rpx_journal_job(rx, JOURNAL_KIND_RUNNING, &j);
        rpx_job_event_clear(&j);
    }
}
