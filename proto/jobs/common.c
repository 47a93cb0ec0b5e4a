/*
 * common.c - what the Redis framework modules share (common.h).
 */
#include "proto/jobs/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- events ------------------------------------------------------------------------------ */

static const char *const ev_names[] = {"publish", "deliver", "ack", "nack", "lease"};

char *jobs_dup(struct jobs_ev *j, const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d == NULL) {
        j->oom = true;
        return NULL;
    }
    memcpy(d, s, n + 1);
    return d;
}

char *jobs_known_task(const struct job_host *h, struct jobs_ev *j, const char *id, size_t n)
{
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, id, n);
    char *task = in != NULL && in->task != NULL ? jobs_dup(j, in->task) : NULL;
    h->memo_unlock(h->ctx);
    return task;
}

void jobs_ev_clear(struct jobs_ev *j)
{
    free(j->id);
    free(j->task);
    free(j->queue);
    memset(j, 0, sizeof(*j));
}

static struct job_event view_of(const struct jobs_ev *j)
{
    return (struct job_event){
        .kind = j->kind,
        .id = j->id,
        .task = j->task,
        .queue = j->queue,
        .key = j->key,
        .redelivered = j->redelivered,
        .retries = j->retries,
        .retry = j->retry,
        .refused = j->refused,
        .kept_back = j->kept_back,
        .started_unix_us = j->started_unix_us,
        .run = j->run,
    };
}

bool jobs_lost(const struct job_host *h, const struct jobs_ev *j)
{
    if (j->oom) {
        char fields[64];
        snprintf(fields, sizeof(fields), "event=%s reason=\"out of memory\"",
                 j->kind < JOB_EV_COUNT ? ev_names[j->kind] : "?");
        h->log(h->ctx, JOB_LOG_WARN, "event skipped", fields);
    }
    return j->oom;
}

void jobs_record(const struct job_host *h, enum job_rec rec, const struct jobs_ev *j)
{
    if (j->oom)
        return;
    struct job_event ev = view_of(j);
    h->record(h->ctx, rec, &ev);
}

struct job_fault jobs_decide(const struct job_host *h, const struct jobs_ev *j)
{
    if (jobs_lost(h, j))
        return (struct job_fault){.kind = JOB_FAULT_NONE};
    struct job_event ev = view_of(j);
    return h->decide(h->ctx, &ev);
}

struct job_fault jobs_decide_unnoted(const struct job_host *h, const struct jobs_ev *j)
{
    if (jobs_lost(h, j))
        return (struct job_fault){.kind = JOB_FAULT_NONE};
    struct job_event ev = view_of(j);
    return h->decide_unnoted(h->ctx, &ev);
}

void jobs_note(const struct job_host *h, const struct job_fault *f, const struct jobs_ev *j)
{
    struct job_event ev = view_of(j);
    h->note(h->ctx, f, &ev);
}

void jobs_too_long(const struct job_host *h, const char *field, uint64_t len, size_t cap)
{
    h->too_long(h->ctx, field, len, cap);
}

int jobs_read_job(const struct job_host *h, enum rprof prof, const void *v, size_t n,
                  struct resp_job *job)
{
    if (prof != RPROF_LIST)
        return rprof_job(prof, v, n, job);
    uint64_t too_long = 0;
    int rc = rprof_list_job(h->ids, h->tasks, v, n, job, &too_long);
    if (too_long > 0)
        jobs_too_long(h, "job field", too_long, MSG_FIELD_VALUE_MAX);
    return rc;
}

/* ---- replies ----------------------------------------------------------------------------- */

void jobs_free_state(uint8_t kind, void *state)
{
    (void)kind;
    struct jobs_reply *r = state;
    if (r == NULL)
        return;
    free(r->arg);
    free(r->arg2);
    free(r);
}

/* A copy of s into *dst; false when out of memory. */
static bool copy_into(char **dst, const char *s)
{
    size_t n = strlen(s);
    *dst = malloc(n + 1);
    if (*dst != NULL)
        memcpy(*dst, s, n + 1);
    return *dst != NULL;
}

bool jobs_tag_reply(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                    struct resp_reply_tag *tag)
{
    const char *arg;
    bool redelivered;
    enum rprof_reply kind = rprof_reply_of(prof, cv, &arg, &redelivered);
    if (kind == RPROF_REPLY_PLAIN)
        return true;
    struct jobs_reply *r = calloc(1, sizeof(*r));
    bool ok = r != NULL && (arg == NULL || copy_into(&r->arg, arg));
    char more[RPROF_KEY_MAX > RPROF_TASK_MAX ? RPROF_KEY_MAX : RPROF_TASK_MAX];
    if (ok && kind == RPROF_REPLY_POP) {
        r->head = rprof_pop_takes_head(cv);
        if (prof == RPROF_LIST && rprof_pop_moves_to(cv, more, sizeof(more)))
            ok = copy_into(&r->arg2, more);
    }
    if (ok && kind == RPROF_REPLY_XADD) {
        uint64_t n;
        enum rprof_field got = rprof_xadd_task(cv, more, RPROF_TASK_MAX, &n);
        if (got == RPROF_TOO_LONG)
            jobs_too_long(h, "task", n, RPROF_TASK_MAX);
        ok = got != RPROF_FOUND || copy_into(&r->arg2, more);
    }
    if (!ok) {
        /* Read without its list, stream or task, the reply would name another job. */
        h->log(h->ctx, JOB_LOG_WARN, "event skipped", "reason=\"out of memory\"");
        jobs_free_state(0, r);
        return false;
    }
    r->redelivered = redelivered;
    tag->kind = (uint8_t)kind;
    tag->state = r;
    return true;
}

/* ---- acks -------------------------------------------------------------------------------- */

void jobs_acks_free(struct jobs_acks *a)
{
    resp_bytes_free(&a->kept);
    resp_bytes_free(&a->later);
    resp_bytes_free(&a->repush);
}

/* One id's fate added to the command's. */
static void add_fate(struct jobs_acks *a, const struct jobs_ack_fate *f)
{
    a->n++;
    if (f->close_before != NULL && a->close_before == NULL)
        a->close_before = f->close_before;
    if (f->close_after != NULL && a->close_after == NULL)
        a->close_after = f->close_after;
}

/* The ids of cv into ids[0..argc) and their fates; 0, or -1 out of memory. */
static int decide_ids(const struct job_host *h, const struct rprof_cmdview *cv, size_t first,
                      jobs_ack_fn fn, const char *repush_list, struct jobs_acks *a,
                      const char **keep, size_t *keep_len, const char **late, size_t *late_len,
                      char (*ids)[RPROF_KEY_MAX])
{
    size_t argc = cv->m->nelem, nk = 0, nl = 0;
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
        struct jobs_ack_fate f;
        memset(&f, 0, sizeof(f));
        fn(h, cv, ids[i], &f);
        add_fate(a, &f);
        if (!f.suppress) {
            keep[nk] = ids[i];
            keep_len[nk++] = strlen(ids[i]);
            continue;
        }
        a->suppressed++;
        if (f.later) {
            late[nl] = ids[i];
            late_len[nl++] = strlen(ids[i]);
            if (f.later_ms > a->later_ms)
                a->later_ms = f.later_ms;
        }
        if (f.repush && repush_list != NULL) {
            const char *argv[3] = {"LPUSH", repush_list, ids[i]};
            size_t lens[3] = {5, strlen(repush_list), strlen(ids[i])};
            resp_bytes_command(&a->repush, 3, argv, lens);
            a->repush_n++;
            if (f.repush_ms > a->repush_ms)
                a->repush_ms = f.repush_ms;
        }
    }
    if (a->suppressed > 0 && a->suppressed < a->n)
        resp_bytes_command(&a->kept, nk, keep, keep_len);
    if (nl > first)
        resp_bytes_command(&a->later, nl, late, late_len);
    return 0;
}

int jobs_plan_acks(const struct job_host *h, const struct rprof_cmdview *cv, size_t first,
                   jobs_ack_fn fn, const char *repush_list, struct jobs_acks *a)
{
    memset(a, 0, sizeof(*a));
    size_t argc = cv->m->nelem;
    if (argc <= first || argc > 1024)
        return 0;
    const char **keep = calloc(argc, sizeof(*keep));
    size_t *keep_len = calloc(argc, sizeof(*keep_len));
    const char **late = calloc(argc, sizeof(*late));
    size_t *late_len = calloc(argc, sizeof(*late_len));
    char(*ids)[RPROF_KEY_MAX] = calloc(argc, RPROF_KEY_MAX);
    int rc = -1;
    if (keep != NULL && keep_len != NULL && late != NULL && late_len != NULL && ids != NULL)
        rc = decide_ids(h, cv, first, fn, repush_list, a, keep, keep_len, late, late_len, ids);
    free(keep);
    free(keep_len);
    free(late);
    free(late_len);
    free(ids);
    return rc;
}

/* The later acks and re-pushes of a, as own commands. */
static void acks_own(struct jobs_acks *a, struct resp_own *own, size_t *n_own)
{
    if (a->later.len > 0 && !a->later.oom)
        (void)resp_plan_own_raw(own, n_own, a->later_ms, a->later.p, a->later.len, 1);
    if (a->repush_n > 0 && !a->repush.oom)
        (void)resp_plan_own_raw(own, n_own, a->repush_ms, a->repush.p, a->repush.len, a->repush_n);
}

void jobs_acks_plan(struct jobs_acks *a, const struct rprof_cmdview *cv, struct resp_cmd_plan *p)
{
    if (a->close_before != NULL) {
        p->fate = RESP_CMD_CUT;
        p->cut = a->close_before;
        return;
    }
    acks_own(a, p->own, &p->n_own);
    if (a->suppressed > 0 && a->suppressed == a->n) {
        p->fate = RESP_CMD_ANSWER;
        resp_bytes_int(&p->bytes, rprof_settled_count(cv));
    } else if (a->suppressed > 0 && (a->kept.len > 0 || a->kept.oom)) {
        /* The command without the kept-back ids; its count plus them. */
        p->fate = RESP_CMD_REWRITE;
        resp_bytes_add(&p->bytes, a->kept.p, a->kept.len);
        p->bytes.oom |= a->kept.oom;
        p->reply_add = (int64_t)a->suppressed;
    }
    p->cut = a->close_after;
}

void jobs_ack_memo(const struct job_host *h, const char *key, bool by_tag, struct jobs_ev *j,
                   struct jobs_ack_memo *am)
{
    memset(am, 0, sizeof(*am));
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, key, strlen(key));
    if (by_tag) {
        j->id = in != NULL && in->id != NULL ? jobs_dup(j, in->id) : NULL;
        j->queue = in != NULL && in->queue != NULL ? jobs_dup(j, in->queue) : NULL;
    }
    j->task = in != NULL && in->task != NULL ? jobs_dup(j, in->task) : NULL;
    /* A duplicate decided at delivery: this ack never lands, so the entry stays pending for
     * the next XAUTOCLAIM (the mark is used up here). */
    am->swallow = in != NULL && (in->flags & JOB_MEMO_SUPPRESS_ACK) != 0;
    if (am->swallow)
        in->flags &= ~(uint32_t)JOB_MEMO_SUPPRESS_ACK;
    am->gen = in != NULL ? in->gen : 0;
    h->memo_unlock(h->ctx);
}

void jobs_ack_done(const struct job_host *h, const char *key, const struct jobs_ack_memo *am,
                   bool faulted)
{
    h->memo_lock(h->ctx);
    struct job_memo *in = h->memo_get(h->ctx, key, strlen(key));
    if (faulted) {
        /* The entry stays for the delivery the fault brings back; this one is done. */
        if (in != NULL && in->pending > 0)
            in->pending--;
    } else if (in != NULL && in->pending > 1) {
        in->pending--;
    } else if (in != NULL && in->gen == am->gen && (in->flags & JOB_MEMO_SUPPRESS_ACK) == 0) {
        h->memo_del(h->ctx, key, strlen(key));
    }
    h->memo_unlock(h->ctx);
}

void jobs_ack_fate_of(const struct job_fault *f, bool repush, struct jobs_ack_fate *out)
{
    memset(out, 0, sizeof(*out));
    switch (f->kind) {
    case JOB_FAULT_REDELIVER:
        out->suppress = true;
        out->repush = repush;
        out->repush_ms = f->ms;
        break;
    case JOB_FAULT_DROP:
        out->suppress = true;
        break;
    case JOB_FAULT_DELAY:
        out->suppress = true;
        out->later = true;
        out->later_ms = f->ms;
        break;
    case JOB_FAULT_CLOSE:
        if (f->before)
            out->close_before = f->rule;
        else
            out->close_after = f->rule;
        break;
    default:
        break;
    }
}

void jobs_ack_decide(const struct job_host *h, const char *memo_key, bool by_tag, struct jobs_ev *j,
                     bool repush, struct jobs_ack_fate *f)
{
    struct jobs_ack_memo am;
    jobs_ack_memo(h, memo_key, by_tag, j, &am);
    jobs_record(h, JOB_REC_ACK, j);
    struct job_fault fault = {.kind = JOB_FAULT_NONE};
    /* A swallowed ack is only counted: a rule that fired on it would be journaled as a fault it
     * never made. */
    if (am.swallow)
        h->count(h->ctx, JOB_EV_ACK);
    else
        fault = jobs_decide(h, j);
    jobs_ev_clear(j);
    if (am.swallow) {
        memset(f, 0, sizeof(*f));
        f->suppress = true;
        return;
    }
    jobs_ack_done(h, memo_key, &am, fault.kind != JOB_FAULT_NONE);
    jobs_ack_fate_of(&fault, repush, f);
}

void jobs_own_append(struct resp_own *g, const void *bytes, size_t n, size_t k)
{
    size_t before = g->cmds.len;
    resp_bytes_add(&g->cmds, bytes, n);
    if (g->cmds.oom) {
        g->cmds.oom = false;
        g->cmds.len = before;
    } else {
        g->n += k;
    }
}

void jobs_own_command(struct resp_own *g, size_t argc, const char *const *argv, const size_t *lens)
{
    size_t before = g->cmds.len;
    resp_bytes_command(&g->cmds, argc, argv, lens);
    if (g->cmds.oom) {
        g->cmds.oom = false;
        g->cmds.len = before;
    } else {
        g->n++;
    }
}

/* ---- publishes and deliveries ------------------------------------------------------------ */

/* One publish's copy: the command with payload v (or what retag makes of it) into *copies. */
static void publish_copy(const struct job_host *h, const struct rprof_cmdview *cv,
                         const struct resp_view *v, jobs_retag_fn retag, struct resp_own *copies)
{
    char *retagged = NULL;
    size_t rlen = 0;
    if (retag != NULL && !retag(h, cv->buf + v->off, v->len, &retagged, &rlen)) {
        h->log(h->ctx, JOB_LOG_WARN, "publish not duplicated", "reason=no_new_tag");
        return;
    }
    const char *argv[3] = {cv->name, cv->key,
                           retagged != NULL ? retagged : (const char *)cv->buf + v->off};
    size_t lens[3] = {strlen(cv->name), strlen(cv->key), retagged != NULL ? rlen : v->len};
    jobs_own_command(copies, 3, argv, lens);
    free(retagged);
}

struct job_fault jobs_publish_payloads(const struct job_host *h, enum rprof prof,
                                       const struct rprof_cmdview *cv, jobs_retag_fn retag,
                                       struct resp_own *copies)
{
    struct job_fault first = {.kind = JOB_FAULT_NONE};
    if (!h->needed) {
        /* Nothing reads the jobs: each is counted, as a decision would count it. */
        for (size_t i = 2; i < cv->m->nelem; i++)
            h->count(h->ctx, JOB_EV_PUBLISH);
        return first;
    }
    struct resp_view v;
    for (size_t i = 2; rprof_arg(cv, i, &v); i++) {
        struct resp_job job;
        if (jobs_read_job(h, prof, cv->buf + v.off, v.len, &job) != 0)
            continue;
        /* A job that carries a retry count is one its app sends again: Sidekiq's retry poller
         * pushes a failed job back with retry_count set, Celery's retry sends the task with its
         * retries one up. */
        struct jobs_ev j = {.kind = JOB_EV_PUBLISH,
                            .id = job.id,
                            .task = job.task,
                            .retries = job.retries,
                            .retry = job.retries > 0,
                            .key = cv->key};
        j.queue = rprof_queue_of(prof, cv->key);
        j.oom |= j.queue == NULL;
        free(job.queue);
        free(job.tag);
        jobs_record(h, JOB_REC_PUBLISH, &j);
        struct job_fault f = jobs_decide(h, &j);
        if (first.kind == JOB_FAULT_NONE)
            first = f;
        if (f.kind == JOB_FAULT_DUPLICATE)
            publish_copy(h, cv, &v, retag, copies);
        jobs_ev_clear(&j);
    }
    return first;
}

void jobs_publish_plan(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                       const struct job_fault *f, const struct resp_bytes *drop_answer,
                       struct resp_own *copies, struct resp_cmd_plan *p)
{
    bool copy = copies != NULL && copies->n > 0;
    switch (f->kind) {
    case JOB_FAULT_DROP:
        p->fate = RESP_CMD_ANSWER;
        resp_bytes_add(&p->bytes, drop_answer->p, drop_answer->len);
        p->bytes.oom |= drop_answer->oom;
        return;
    case JOB_FAULT_DELAY:
        /* Held; the copies other jobs of it got go out once it does (the host keeps them). */
        p->fate = RESP_CMD_HOLD;
        p->hold_ms = f->ms;
        if (copy)
            (void)resp_plan_own_raw(p->own, &p->n_own, 0, copies->cmds.p, copies->cmds.len,
                                    copies->n);
        return;
    case JOB_FAULT_CLOSE:
        p->cut = f->rule;
        if (f->before) {
            p->fate = RESP_CMD_CUT;
            return;
        }
        break;
    default:
        break;
    }
    if (copy)
        (void)resp_plan_own_raw(p->own, &p->n_own, 0, copies->cmds.p, copies->cmds.len, copies->n);
    (void)jobs_tag_reply(h, prof, cv, &p->reply);
}

void jobs_pop_fault(const struct job_host *h, enum rprof prof, const struct job_fault *f,
                    const struct jobs_reply *r, const char *list, const void *copy, size_t copy_len,
                    bool pair, struct resp_reply_plan *p)
{
    switch (f->kind) {
    case JOB_FAULT_DUPLICATE: {
        const char *cmd = rprof_repush_cmd(prof, r->head);
        const char *argv[3] = {cmd, list, copy};
        size_t lens[3] = {strlen(cmd), strlen(list), copy_len};
        if (!resp_plan_own(p->own, &p->n_own, f->ms, 3, argv, lens))
            h->log(h->ctx, JOB_LOG_WARN, "duplicate not made", "reason=\"out of memory\"");
        break;
    }
    case JOB_FAULT_DROP: {
        /* The job is popped and gone; the worker sees its pop time out. */
        uint8_t nb[8];
        int proto = h->resp == 3 ? 3 : 2;
        int n = pair ? resp_encode_null_array(nb, sizeof(nb), proto)
                     : resp_encode_null(nb, sizeof(nb), proto);
        p->replace = true;
        if (n > 0)
            resp_bytes_add(&p->bytes, nb, (size_t)n);
        break;
    }
    case JOB_FAULT_DELAY:
        p->delay_ms = f->ms;
        break;
    case JOB_FAULT_CLOSE:
        p->cut = f->rule;
        p->cut_before = f->before;
        break;
    default:
        break;
    }
}

bool jobs_payload_job(const struct job_host *h, enum rprof prof, const char *list, const uint8_t *v,
                      size_t n, struct jobs_ev *j, char **tag)
{
    struct resp_job job;
    memset(&job, 0, sizeof(job));
    if (tag != NULL)
        *tag = NULL;
    if (h->needed && jobs_read_job(h, prof, v, n, &job) != 0)
        return false;
    j->id = job.id;
    j->task = job.task;
    j->redelivered = job.redelivered;
    j->retries = job.retries;
    j->queue = rprof_queue_of(prof, list);
    j->oom |= j->queue == NULL;
    free(job.queue);
    if (tag != NULL)
        *tag = job.tag;
    else
        free(job.tag);
    return true;
}

void jobs_pop_reply(const struct job_host *h, const struct jobs_pop_ops *ops,
                    const struct jobs_reply *r, const uint8_t *buf, const struct resp_msg *m,
                    struct resp_reply_plan *p)
{
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (!rprof_pop_reply(buf, m, r->arg, list, sizeof(list), &val, &pair))
        return;
    if (ops->popped != NULL)
        ops->popped(h, r, list);
    struct jobs_ev j = {.kind = JOB_EV_DELIVER, .key = list};
    if (!ops->job(h, list, buf + val.off, val.len, &j)) {
        jobs_ev_clear(&j);
        return;
    }
    jobs_record(h, JOB_REC_DELIVER, &j);
    struct job_fault f = jobs_decide(h, &j);
    jobs_ev_clear(&j);
    char *marked = NULL;
    size_t mlen = 0;
    if (f.kind == JOB_FAULT_DUPLICATE && ops->copy != NULL &&
        ops->copy(buf + val.off, val.len, &marked, &mlen))
        jobs_pop_fault(h, ops->prof, &f, r, list, marked, mlen, pair, p);
    else
        jobs_pop_fault(h, ops->prof, &f, r, list, buf + val.off, val.len, pair, p);
    free(marked);
}

bool jobs_pop_counted(const struct jobs_reply *r, const uint8_t *buf, const struct resp_msg *m)
{
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    return rprof_pop_reply(buf, m, r->arg, list, sizeof(list), &val, &pair);
}

int jobs_push_command(const struct job_host *h, enum rprof prof, const struct rprof_cmdview *cv,
                      bool decided, jobs_retag_fn retag, struct resp_cmd_plan *p)
{
    if (!decided && rprof_publish_of(prof, cv) == RPROF_PUB_JOBS) {
        struct resp_own copies = {0};
        struct job_fault f = jobs_publish_payloads(h, prof, cv, retag, &copies);
        struct resp_bytes one = {0};
        resp_bytes_int(&one, 1);
        jobs_publish_plan(h, prof, cv, &f, &one, &copies, p);
        resp_bytes_free(&one);
        resp_bytes_free(&copies.cmds);
        return 1;
    }
    if (!rprof_cmd_matters(prof, cv->id))
        return 0;
    (void)jobs_tag_reply(h, prof, cv, &p->reply);
    return 1;
}

void jobs_pop_tagged(const struct job_host *h, const struct jobs_pop_ops *ops,
                     const struct resp_reply_tag *tag, const uint8_t *buf, const struct resp_msg *m,
                     struct resp_reply_plan *p)
{
    if (tag->kind == RPROF_REPLY_POP && tag->state != NULL)
        jobs_pop_reply(h, ops, tag->state, buf, m, p);
}

bool jobs_count_pop(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                    const struct resp_msg *m)
{
    (void)h;
    return tag->kind == RPROF_REPLY_POP && tag->state != NULL &&
           jobs_pop_counted(tag->state, buf, m);
}

/* ---- transactions ------------------------------------------------------------------------ */

int jobs_tx_walk(const uint8_t *buf, size_t len, size_t off, uint64_t max_bulk,
                 struct rprof_tx *scan, jobs_tx_first_fn first, jobs_tx_cmd_fn each, void *st,
                 struct resp_tx_plan *p)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    /* The session's limits: a transaction with a bulk over max-message-size is not planned
     * (Redis never runs it: the session ends at that bulk). */
    sc.max_bulk = max_bulk;
    int found = rprof_tx_scan(&sc, buf, len, off, scan, first, st);
    if (found != 1)
        return found;
    p->cmds = calloc(scan->queued > 0 ? scan->queued : 1, sizeof(*p->cmds));
    if (p->cmds == NULL)
        return -1;
    p->n = scan->queued;
    resp_scanner_reset(&sc);
    size_t pos = off;
    for (size_t i = 0; i < scan->queued; i++) {
        struct resp_msg m;
        if (resp_scan(&sc, buf + pos, len - pos, &m) != 1)
            return -1;
        struct rprof_cmdview cv;
        rprof_cmdview_init(&cv, buf + pos, &m, true);
        pos += m.len;
        resp_scanner_reset(&sc);
        if (each(st, &cv, i, p) != 0)
            return -1;
    }
    return 1;
}

void jobs_keep_back(struct resp_queued *q, const void *answer, size_t n)
{
    q->keep_back = true;
    resp_bytes_free(&q->answer);
    resp_bytes_add(&q->answer, answer, n);
}

void jobs_keep_back_bytes(struct resp_queued *q, const struct resp_bytes *answer)
{
    jobs_keep_back(q, answer->p, answer->len);
    q->answer.oom |= answer->oom; /* the host then plans nothing of the transaction */
}

void jobs_keep_back_count(struct resp_queued *q, const struct rprof_cmdview *cv)
{
    q->keep_back = true;
    resp_bytes_free(&q->answer);
    resp_bytes_int(&q->answer, rprof_settled_count(cv));
}

bool jobs_tx_acks(struct jobs_acks *a, const struct rprof_cmdview *cv, struct resp_queued *q,
                  struct resp_tx_plan *p)
{
    if (a->close_before != NULL && p->cut_before == NULL)
        p->cut_before = a->close_before;
    if (a->close_after != NULL && p->cut_after == NULL)
        p->cut_after = a->close_after;
    bool kept = false;
    if (a->suppressed > 0 && a->suppressed == a->n) {
        jobs_keep_back_count(q, cv);
        kept = true;
    } else if (a->suppressed > 0 && cv->id == RPROF_CMD_XACK) {
        /* A partial XACK inside MULTI: twice keeps the whole command back and applies the
         * other ids right after EXEC on its own connection. */
        jobs_keep_back_count(q, cv);
        if (a->kept.len > 0 && !a->kept.oom)
            (void)resp_plan_own_raw(p->own, &p->n_own, 0, a->kept.p, a->kept.len, 1);
    }
    acks_own(a, p->own, &p->n_own);
    return kept;
}

void resp_tx_plan_free(const struct resp_framework *fw, struct resp_tx_plan *p)
{
    for (size_t i = 0; i < p->n; i++) {
        resp_bytes_free(&p->cmds[i].answer);
        resp_framework_free_tag(fw, &p->cmds[i].tag);
    }
    free(p->cmds);
    for (size_t i = 0; i < p->n_own; i++)
        resp_bytes_free(&p->own[i].cmds);
    resp_bytes_free(&p->after_exec.cmds);
    memset(p, 0, sizeof(*p));
}
