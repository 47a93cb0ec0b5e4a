/*
 * resp_tx.c - transactions on a RESP session (resp_internal.h).
 *
 * An ack is usually a MULTI ... EXEC transaction (kombu's QoS, RQ's finish), and so is RQ's
 * enqueue.  twice reads the whole transaction ahead before it forwards MULTI (waiting up to
 * RPX_TX_WAIT_MS for the rest of it; the first pass is proto/resp_profile.h's), decides once,
 * then keeps back the commands a fault suppresses, answering +QUEUED for them and splicing
 * their results into the server's EXEC array.  What a fault defers or adds goes out on twice's
 * own connection after EXEC.
 */
#include "proxy/resp_internal.h"

/* ---- replies ----------------------------------------------------------- */

void rpx_on_exec_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m, struct evbuffer *reply)
{
    if (e->after != NULL && !m->null && m->type == '*') {
        rpx_aux_send_at(rx, e->after, e->n_after, 0); /* it ran: its pushes are in */
        e->n_after = 0;
    }
    if (m->null || m->type != '*' || m->body != 0 || e->tx == NULL)
        return; /* aborted (WATCH, EXECABORT): nothing ran, nothing to splice */
    struct evbuffer *out = evbuffer_new();
    if (out == NULL)
        return;
    evbuffer_add_printf(out, "*%llu\r\n", (unsigned long long)e->ntx);
    struct resp_args it;
    resp_args_init(&it, buf, m);
    struct resp_view v;
    size_t start, end;
    for (size_t i = 0; i < e->ntx; i++) {
        if (e->tx[i].suppress) {
            evbuffer_add_buffer(out, e->tx[i].synth);
            continue;
        }
        if (rpx_walk_next(&it, &v, &start, &end) != 1) {
            evbuffer_free(out);
            return; /* not the shape expected: pass the server's reply on */
        }
        const struct txcmd *c = &e->tx[i];
        if (c->tag.kind != 0 && c->fw != NULL && c->fw->element != NULL)
            c->fw->element(rpx_host(rx), &c->tag, buf, &v);
        int64_t n;
        if (e->tx[i].add != 0 && v.type == ':' && resp_view_int(buf, m->len, &v, &n) == 0)
            evbuffer_add_printf(out, ":%lld\r\n", (long long)(n + e->tx[i].add));
        else
            evbuffer_add(out, buf + start, end - start);
    }
    evbuffer_drain(reply, evbuffer_get_length(reply));
    evbuffer_add_buffer(reply, out);
    evbuffer_free(out);
}

/* ---- transactions ------------------------------------------------------ */

/* Tags of the kept-back ZREMs of one transaction an HDEL is compared with. */
#define RPX_TX_TAGS 16

void rpx_tx_reset(struct tx *t)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->cmds[i].synth != NULL)
            evbuffer_free(t->cmds[i].synth);
        resp_framework_free_tag(t->cmds[i].fw, &t->cmds[i].tag);
    }
    free(t->cmds);
    if (t->later != NULL)
        evbuffer_free(t->later);
    if (t->now != NULL)
        evbuffer_free(t->now);
    if (t->copies != NULL)
        evbuffer_free(t->copies);
    if (t->after_exec != NULL)
        evbuffer_free(t->after_exec);
    memset(t, 0, sizeof(*t));
}

static struct txcmd *tx_slot(struct tx *t, size_t i)
{
    if (i >= RPROF_TX_MAX)
        return NULL;
    if (i >= t->n) {
        struct txcmd *c = realloc(t->cmds, (i + 1) * sizeof(*c));
        if (c == NULL)
            return NULL;
        memset(c + t->n, 0, (i + 1 - t->n) * sizeof(*c));
        t->cmds = c;
        t->n = i + 1;
    }
    return &t->cmds[i];
}

/*
 * Reads the transaction that starts after MULTI at `off` in buf[0..len) and
 * decides its acks and publishes.  Returns 1 when planned, 0 when EXEC is not
 * there yet, -1 when the transaction is not one twice plans (malformed,
 * too long).  Sets *close_before when a rule cuts the connection before it.
 */
/* Appends the k commands of src to *dst (made on first need), counting them in *n. */
static void tx_add_cmds(struct evbuffer **dst, size_t *n, struct evbuffer *src, size_t k)
{
    if (*dst == NULL)
        *dst = evbuffer_new();
    if (*dst != NULL) {
        evbuffer_add_buffer(*dst, src);
        *n += k;
    }
}

/* Queued command c is kept back: EXEC's array gets `reply` (n bytes) for it. */
static void tx_keep_back_as(struct tx *t, struct txcmd *c, const char *reply, size_t n)
{
    c->suppress = true;
    t->any = true;
    c->synth = evbuffer_new();
    if (c->synth != NULL)
        evbuffer_add(c->synth, reply, n);
}

/* tx_keep_back_as() with Redis's integer reply for an ack (ZREM, HDEL, XACK...). */
static void tx_keep_back(struct tx *t, struct txcmd *c, const struct rprof_cmdview *cv)
{
    char r[32];
    int n = snprintf(r, sizeof(r), ":%lld\r\n", (long long)rprof_settled_count(cv));
    tx_keep_back_as(t, c, r, (size_t)n);
}

/* The first pass's view of an RQ enqueue transaction: the job's task, from its saved hash,
 * remembered for the job's id (its ack comes on another connection). */
struct tx_first {
    struct rpx *rx;
    struct rpx_rq_saved rq;
};

static void tx_first_cmd(void *arg, const struct rprof_cmdview *cv)
{
    struct tx_first *f = arg;
    const char *id;
    char *task;
    if (rprof_rq_reaps(f->rx->prof, cv))
        f->rq.reaps = true;
    if (!rprof_rq_job_saved(f->rx->prof, cv, &id, &task))
        return;
    snprintf(f->rq.task, sizeof(f->rq.task), "%s", task);
    if (rprof_rq_job_ran(f->rx->prof, cv) && f->rq.n_ran < RPX_RQ_RAN_MAX)
        snprintf(f->rq.ran[f->rq.n_ran++], sizeof(f->rq.ran[0]), "%s", id);
    idmap_lock();
    struct job_memo *in = idmap_put(rpx_scope(f->rx), id, strlen(id));
    if (in != NULL)
        job_memo_set(&in->task, task, strlen(task));
    idmap_unlock();
    free(task);
}

/* Tags of the Celery acks a transaction keeps back, for its HDEL. */
struct tx_tags {
    char v[RPX_TX_TAGS][RPROF_KEY_MAX];
    size_t n;
};

/* An ack queued in the transaction (ids from argument `first`): its rules' decisions, and
 * what goes on twice's own connection after EXEC.  -1 when it cannot be planned. */
static int tx_plan_ack(struct rpx *rx, struct txcmd *c, const struct rprof_cmdview *cv,
                       size_t first, const struct rule **close_before, struct tx_tags *tags)
{
    struct tx *t = &rx->tx;
    struct ack_plan p;
    if (rpx_plan_acks(rx, cv, first, &p) != 0)
        return -1;
    if (p.close_before != NULL && *close_before == NULL)
        *close_before = p.close_before;
    if (p.close_after != NULL && t->close_after == NULL)
        t->close_after = p.close_after;
    if (p.suppressed > 0 && p.suppressed == p.n) {
        tx_keep_back(t, c, cv);
        struct resp_view tv;
        for (size_t a = 2;
             rx->prof == RPROF_CELERY && tags->n < RPX_TX_TAGS && rprof_arg(cv, a, &tv); a++)
            rprof_view_str(cv->buf, cv->len, &tv, tags->v[tags->n++], RPROF_KEY_MAX);
    } else if (p.suppressed > 0 && rpx_is_cmd(cv, RPROF_CMD_XACK)) {
        /* A partial XACK inside MULTI: twice keeps the whole command back and applies the
         * other ids right after EXEC on its own connection. */
        tx_keep_back(t, c, cv);
        if (p.kept != NULL)
            tx_add_cmds(&t->now, &t->now_n, p.kept, 1);
    }
    if (p.later != NULL) {
        tx_add_cmds(&t->later, &t->later_n, p.later, 1);
        if (p.later_ms > t->later_ms)
            t->later_ms = p.later_ms;
    }
    if (p.repush != NULL && p.repush_ms == 0) {
        tx_add_cmds(&t->now, &t->now_n, p.repush, p.repush_n);
    } else if (p.repush != NULL) {
        tx_add_cmds(&t->copies, &t->copies_n, p.repush, p.repush_n);
        if (p.repush_ms > t->copies_ms)
            t->copies_ms = p.repush_ms;
    }
    rpx_ack_plan_free(&p);
    return 0;
}

/* Celery's HDEL unacked TAG... follows the ZREM of the same tags, and is kept back with it:
 * when every tag it names was (a ZREM naming several is kept back only so), else the job's
 * payload would be gone while its index entry stays, and the restore would lose it. */
static void tx_plan_hdel(struct rpx *rx, struct txcmd *c, const struct rprof_cmdview *cv,
                         const struct tx_tags *tags)
{
    struct tx *t = &rx->tx;
    bool all = true;
    struct resp_view tv;
    char tag[RPROF_KEY_MAX];
    for (size_t a = 2; all && a < cv->m->nelem; a++) {
        all = rprof_arg(cv, a, &tv) && rprof_view_str(cv->buf, cv->len, &tv, tag, sizeof(tag));
        bool found = false;
        for (size_t q = 0; all && !found && q < tags->n; q++)
            found = strcmp(tag, tags->v[q]) == 0;
        all = all && found;
    }
    if (!all)
        return;
    tx_keep_back(t, c, cv);
    /* A delayed ack applies the HDEL later too. */
    if (t->later != NULL) {
        evbuffer_add(t->later, cv->buf, cv->len);
        t->later_n++;
    }
}

/* RQ's push of the enqueue transaction, or an XADD batched in a transaction (redis-py's
 * pipeline() makes one by default): the publish's rule, if one fires. */
static void tx_plan_publish(struct rpx *rx, struct txcmd *c, const struct rprof_cmdview *cv,
                            bool xadd, const struct rpx_rq_saved *rq,
                            const struct rule **close_before, const struct rule **delay_rule)
{
    struct tx *t = &rx->tx;
    const struct rule *r =
        xadd ? rpx_stream_publish_decide(rx, cv) : rpx_publish_decide(rx, cv, rq);
    if (rx->n_pub_copies > 0 && r != NULL && r->action.kind != RULE_ACT_DROP) {
        /* Once EXEC's reply shows the transaction ran: the job's hash is saved by then. */
        tx_add_cmds(&t->after_exec, &t->after_exec_n, rx->pub_copies, rx->n_pub_copies);
    } else if (rx->pub_copies != NULL) {
        evbuffer_drain(rx->pub_copies, evbuffer_get_length(rx->pub_copies));
    }
    rx->n_pub_copies = 0;
    if (r == NULL)
        return;
    switch (r->action.kind) {
    case RULE_ACT_DROP: {
        char reply[sizeof(rx->xadd_answer) + 32];
        tx_keep_back_as(t, c, reply, rpx_drop_reply(rx, reply, sizeof(reply)));
        break;
    }
    case RULE_ACT_DELAY:
        if (*delay_rule == NULL)
            *delay_rule = r;
        break;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE && *close_before == NULL)
            *close_before = r;
        else if (t->close_after == NULL)
            t->close_after = r;
        break;
    default:
        break;
    }
}

/* The job hash's half of an RQ heartbeat (HSET rq:job:ID last_heartbeat T), seen before the
 * renewal that follows it in the same transaction (rq/job.py, Job.heartbeat): kept back with it. */
struct tx_beat {
    bool pending;
    size_t idx; /* its slot in rx->tx.cmds (which grows: no pointer into it) */
    struct rprof_cmdview cv;
};

/* The job heartbeat of beat, sent late: only onto a job hash still there, as RQ's worker deletes
 * a hash its heartbeat made (maintain_heartbeats): one deleted or expired meanwhile stays gone. */
static const char RQ_LATE_BEAT_LUA[] =
    "if redis.call('EXISTS', KEYS[1]) == 1 then "
    "return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return 0";

static bool late_beat(struct evbuffer *b, const struct tx_beat *beat)
{
    struct resp_view f, v;
    if (!rprof_arg(&beat->cv, 2, &f) || !rprof_arg(&beat->cv, 3, &v))
        return false;
    const char *argv[6] = {"EVAL",
                           RQ_LATE_BEAT_LUA,
                           "1",
                           beat->cv.key,
                           (const char *)beat->cv.buf + f.off,
                           (const char *)beat->cv.buf + v.off};
    size_t lens[6] = {4, sizeof(RQ_LATE_BEAT_LUA) - 1, 1, strlen(beat->cv.key), f.len, v.len};
    return rpx_encode_cmd(b, 6, argv, lens) == 0;
}

/* RQ's renewal of a lease queued in the transaction: kept back, answered 0 (no member added),
 * with its job's heartbeat; or applied later on twice's own connection. */
static void tx_plan_lease(struct rpx *rx, struct txcmd *c, const struct rprof_cmdview *cv,
                          const struct resp_view *idv, struct tx_beat *beat,
                          const struct rule **close_before)
{
    struct tx *t = &rx->tx;
    struct rpx_lease f = rpx_rq_lease_decide(rx, cv, idv);
    if (f.close != NULL) {
        if (f.close->action.close_when == RULE_CLOSE_BEFORE && *close_before == NULL)
            *close_before = f.close;
        else if (f.close->action.close_when != RULE_CLOSE_BEFORE && t->close_after == NULL)
            t->close_after = f.close;
    }
    if (f.fate == RPX_LEASE_KEEP)
        return;
    char id[RPROF_KEY_MAX];
    bool with_beat = beat->pending && beat->idx < t->n && !t->cmds[beat->idx].suppress &&
                     rprof_view_str(cv->buf, cv->len, idv, id, sizeof(id)) &&
                     rprof_rq_job_heartbeat(rx->prof, &beat->cv, id);
    if (with_beat)
        tx_keep_back_as(t, &t->cmds[beat->idx], ":0\r\n", 4); /* the field was there */
    tx_keep_back_as(t, c, ":0\r\n", 4);
    if (f.fate == RPX_LEASE_LATE) {
        struct evbuffer *b = evbuffer_new();
        if (b != NULL && (!with_beat || late_beat(b, beat)) &&
            evbuffer_add(b, cv->buf, cv->len) == 0)
            tx_add_cmds(&t->later, &t->later_n, b, with_beat ? 2 : 1);
        if (b != NULL)
            evbuffer_free(b);
        if (f.ms > t->later_ms)
            t->later_ms = f.ms;
    }
    beat->pending = false;
}

static int tx_plan(struct rpx *rx, const uint8_t *buf, size_t len, size_t off,
                   const struct rule **close_before, const struct rule **delay_rule)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    /* The session's limits: a transaction with a bulk over max-message-size
     * is not planned (Redis never runs it: the session ends at that bulk). */
    sc.max_bulk = rx->sc[SIDE_CLIENT].max_bulk;
    struct rprof_tx scan;
    struct tx_first seen = {.rx = rx};
    int found = rprof_tx_scan(&sc, buf, len, off, &scan, tx_first_cmd, &seen);
    if (found != 1)
        return found;
    bool has_push = scan.has_push;
    /* Second pass: decide. */
    struct tx *t = &rx->tx;
    resp_scanner_reset(&sc);
    size_t pos = off;
    struct tx_tags *tags = calloc(1, sizeof(*tags));
    if (tags == NULL)
        return -1;
    struct tx_beat beat = {.pending = false};
    struct resp_msg beat_m;
    int rc = 1;
    for (size_t i = 0; rc == 1; i++) {
        struct resp_msg m;
        if (resp_scan(&sc, buf + pos, len - pos, &m) != 1) {
            rc = -1;
            break;
        }
        struct rprof_cmdview cv;
        rprof_cmdview_init(&cv, buf + pos, &m, true);
        pos += m.len;
        resp_scanner_reset(&sc);
        if (rpx_is_cmd(&cv, RPROF_CMD_EXEC))
            break;
        struct txcmd *c = tx_slot(t, i);
        size_t first;
        struct resp_view idv;
        bool celery_restore = rx->prof == RPROF_CELERY && has_push;
        bool xadd = rx->prof == RPROF_STREAMS && rpx_is_cmd(&cv, RPROF_CMD_XADD);
        if (c == NULL)
            rc = -1;
        else if (!celery_restore && rprof_ack_args(rx->prof, &cv, &first))
            rc = tx_plan_ack(rx, c, &cv, first, close_before, tags) == 0 ? 1 : -1;
        else if (rprof_is_celery_unacked_hdel(rx->prof, &cv) && tags->n > 0)
            tx_plan_hdel(rx, c, &cv, tags);
        else if (rprof_rq_lease(rx->prof, &cv, &idv))
            tx_plan_lease(rx, c, &cv, &idv, &beat, close_before);
        else if (rprof_rq_failed(rx->prof, &cv, &idv))
            rpx_rq_journal_failed(rx, &cv, &idv);
        else if (rx->prof == RPROF_RQ && rpx_is_cmd(&cv, RPROF_CMD_HSET) && cv.m->nelem == 4) {
            /* perhaps a job's heartbeat, its renewal next */
            beat_m = m;
            beat = (struct tx_beat){.pending = true, .idx = i, .cv = cv};
            beat.cv.m = &beat_m;
        } else if (rx->prof == RPROF_RQ || xadd) {
            tx_plan_publish(rx, c, &cv, xadd, &seen.rq, close_before, delay_rule);
        } else if (rx->fw != NULL && rx->fw->queued != NULL &&
                   (c->tag = rx->fw->queued(rpx_host(rx), &cv)).kind != 0) {
            c->fw = rx->fw;
            t->any = true; /* EXEC's reply is read */
        }
    }
    free(tags);
    if (rc == 1)
        t->planned = true;
    return rc;
}

/* MULTI outside a transaction: the transaction's plan, made once its commands are here (or
 * after RPX_TX_WAIT_MS), then MULTI goes on. */
enum cmd_result rpx_tx_begin(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m)
{
    size_t len = m->len;
    rpx_run_move(rx, SIDE_CLIENT); /* the plan reads from the MULTI on */
    if (rx->prof != RPROF_NONE && rx->decided < DECIDED_ALL) {
        size_t avail = evbuffer_get_length(rx->pend[SIDE_CLIENT]);
        const uint8_t *all = evbuffer_pullup(rx->pend[SIDE_CLIENT], (ev_ssize_t)avail);
        const struct rule *close_before = NULL, *delay_rule = NULL;
        int rc = tx_plan(rx, all, avail, len, &close_before, &delay_rule);
        /* The rest of the transaction is on its way when some of it
         * came; and a MULTI alone, on a listener whose rules judge what
         * a transaction carries (acks; RQ's enqueue), waits for the rest
         * too (a client written to wait for MULTI's +OK gets it after
         * RPX_TX_WAIT_MS): forwarded at once, its ack could not be
         * faulted any more. */
        bool judged = (codec_wants(rx->s, RULE_EV_ACK) && rx->prof != RPROF_LIST) ||
                      ((rx->prof == RPROF_RQ || rx->prof == RPROF_STREAMS) &&
                       codec_wants(rx->s, RULE_EV_PUBLISH)) ||
                      (rx->prof == RPROF_RQ && codec_wants(rx->s, RULE_EV_LEASE)) ||
                      (rx->fw != NULL && rx->fw->queued != NULL && rx->s->px->journal != NULL);
        if (rc == 0 && !rx->tx_waited && (avail > len || judged)) {
            rpx_tx_reset(&rx->tx);
            if (rx->tx_wait_until == 0)
                rx->tx_wait_until = proxy_now_ms() + RPX_TX_WAIT_MS;
            return CMD_WAIT;
        }
        rx->tx_wait_until = 0;
        rx->tx_waited = false;
        if (close_before != NULL) {
            rpx_tx_reset(&rx->tx);
            rpx_swallow(rx, len);
            rpx_cut_at_turn(rx, close_before, NULL);
            return CMD_STOP;
        }
        if (delay_rule != NULL) {
            rx->decided = DECIDED_ALL;
            rx->hold_until = proxy_now_ms() + delay_rule->action.duration_ms;
            rx->tx.active = false;
            return CMD_WAIT;
        }
        if (rc != 1)
            rpx_tx_reset(&rx->tx);
    }
    rx->tx.active = true;
    rx->tx.idx = 0;
    rpx_forward(rx, cv, m, evbuffer_pullup(rx->pend[SIDE_CLIENT], (ev_ssize_t)len), len);
    rx->decided = 0;
    return CMD_DONE;
}

/* EXEC of a transaction with a refused command: discarded, as Redis does. */
enum cmd_result rpx_tx_exec_aborted(struct rpx *rx, const struct resp_msg *m)
{
    size_t len = m->len;
    /* Redis discards a transaction with a refused command: so does
     * twice, answering EXEC as Redis would. */
    static const char discard[] = "*1\r\n$7\r\nDISCARD\r\n";
    static const char abort_msg[] =
        "-EXECABORT Transaction discarded because of previous errors.\r\n";
    rpx_swallow(rx, len);
    rpx_send_own(rx, discard, sizeof(discard) - 1);
    rpx_answer(rx, abort_msg, sizeof(abort_msg) - 1);
    rpx_tx_reset(&rx->tx);
    rx->decided = 0;
    return CMD_DONE;
}

/* EXEC or DISCARD of a transaction: the plan's replies and its commands for twice's own
 * connection (delayed acks, late copies, re-pushes). */
enum cmd_result rpx_tx_end(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                           const uint8_t *buf)
{
    size_t len = m->len;
    struct tx *t = &rx->tx;
    struct entry *e = rpx_forward(rx, cv, m, buf, len);
    if (e != NULL && rpx_is_cmd(cv, RPROF_CMD_EXEC)) {
        if (t->any) {
            e->kind = RK_EXEC;
            e->tx = t->cmds;
            e->ntx = t->idx < t->n ? t->idx : t->n;
            /* queued commands beyond the plan were forwarded */
            for (size_t i = e->ntx; i < t->n; i++) {
                if (t->cmds[i].synth != NULL)
                    evbuffer_free(t->cmds[i].synth);
                resp_framework_free_tag(t->cmds[i].fw, &t->cmds[i].tag);
            }
            if (t->idx > e->ntx) {
                struct txcmd *c = realloc(t->cmds, t->idx * sizeof(*c));
                if (c != NULL) {
                    memset(c + e->ntx, 0, (t->idx - e->ntx) * sizeof(*c));
                    e->tx = c;
                    e->ntx = t->idx;
                }
            }
            t->cmds = NULL;
            t->n = 0;
        }
        if (t->after_exec != NULL) {
            e->kind = RK_EXEC; /* its reply says whether the transaction ran */
            e->after = t->after_exec;
            e->n_after = t->after_exec_n;
            t->after_exec = NULL;
            t->after_exec_n = 0;
        }
        if (t->close_after != NULL) {
            rx->blackholed = true;
            e->close_after = t->close_after;
        }
        if (t->later != NULL)
            rpx_aux_send_at(rx, t->later, t->later_n, t->later_ms);
        if (t->copies != NULL)
            rpx_aux_send_at(rx, t->copies, t->copies_n, t->copies_ms);
        if (t->now != NULL)
            rpx_aux_send_at(rx, t->now, t->now_n, 0);
    }
    rpx_tx_reset(t);
    rx->decided = 0;
    return CMD_DONE;
}

/* A command queued in a transaction: forwarded, or answered +QUEUED when the plan keeps it
 * back. */
enum cmd_result rpx_tx_queue(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                             const uint8_t *buf)
{
    size_t len = m->len;
    struct tx *t = &rx->tx;
    size_t i = t->idx++;
    if (t->planned && i < t->n && t->cmds[i].suppress) {
        rpx_swallow(rx, len);
        rpx_answer(rx, "+QUEUED\r\n", 9);
    } else {
        rpx_forward(rx, cv, m, buf, len);
    }
    rx->decided = 0;
    return CMD_DONE;
}
