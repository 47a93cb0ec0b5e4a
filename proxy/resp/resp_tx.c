/*
 * resp_tx.c - transactions on a RESP session (resp_internal.h).
 *
 * An ack is usually a MULTI ... EXEC transaction (kombu's QoS, RQ's finish), and so is RQ's
 * enqueue.  twice reads the whole transaction ahead before it forwards MULTI (waiting up to
 * RPX_TX_WAIT_MS for the rest of it), the listener's framework module plans it once
 * (proto/jobs/framework.h), and this file carries the plan out: the commands a fault
 * suppresses are kept back, answered +QUEUED, and their results spliced into the server's EXEC
 * array; what a fault defers or adds goes out on twice's own connection after EXEC.
 */
#include "proxy/resp/resp_internal.h"

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

void rpx_tx_reset(struct tx *t)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->cmds[i].synth != NULL)
            evbuffer_free(t->cmds[i].synth);
        resp_framework_free_tag(t->cmds[i].fw, &t->cmds[i].tag);
    }
    free(t->cmds);
    for (size_t i = 0; i < t->n_own; i++)
        resp_bytes_free(&t->own[i].cmds);
    resp_bytes_free(&t->after_exec.cmds);
    memset(t, 0, sizeof(*t));
}

/* The module's plan p of the transaction made the session's: what each queued command becomes,
 * the commands for twice's own connection, the cut after EXEC.  -1 when out of memory (the
 * transaction then goes on as it came). */
static int tx_take_plan(struct rpx *rx, struct resp_tx_plan *p)
{
    struct tx *t = &rx->tx;
    t->cmds = calloc(p->n > 0 ? p->n : 1, sizeof(*t->cmds));
    if (t->cmds == NULL)
        return -1;
    t->n = p->n;
    for (size_t i = 0; i < p->n; i++) {
        struct resp_queued *q = &p->cmds[i];
        struct txcmd *c = &t->cmds[i];
        if (q->keep_back && q->answer.oom)
            return -1; /* not half of it: the transaction goes on as it came */
        if (q->keep_back) {
            c->suppress = true;
            c->synth = evbuffer_new();
            if (c->synth == NULL || evbuffer_add(c->synth, q->answer.p, q->answer.len) != 0)
                return -1;
            t->any = true;
        }
        c->add = q->reply_add;
        c->tag = q->tag;
        c->fw = rx->fw;
        q->tag = (struct resp_reply_tag){0};
        if (c->tag.kind != 0 || c->add != 0)
            t->any = true; /* EXEC's reply is read */
    }
    memcpy(t->own, p->own, sizeof(t->own));
    t->n_own = p->n_own;
    p->n_own = 0;
    t->after_exec = p->after_exec;
    memset(&p->after_exec, 0, sizeof(p->after_exec));
    t->close_after = p->cut_after;
    t->planned = true;
    return 0;
}

static void say_not_planned(struct rpx *rx)
{
    log_msg(LOG_WARN, "transaction not planned", "sid=%llu listener=%s reason=\"out of memory\"",
            (unsigned long long)rx->s->id, rpx_scope(rx));
}

/* The plan of the transaction that starts after MULTI (len bytes) at the head of in[CLIENT],
 * from the listener's module: 1 planned (or not to be), 0 wait for the rest of it, or what
 * happens instead of MULTI (*res): cut before, or held. */
static int tx_plan(struct rpx *rx, size_t len, enum cmd_result *res)
{
    size_t avail = evbuffer_get_length(rx->pump.in[SIDE_CLIENT]);
    const uint8_t *all = evbuffer_pullup(rx->pump.in[SIDE_CLIENT], (ev_ssize_t)avail);
    const struct job_host *h = rpx_host(rx);
    struct resp_tx_plan p;
    memset(&p, 0, sizeof(p));
    int rc = all == NULL
                 ? -1
                 : rx->fw->transaction(h, all, avail, len, rx->sc[SIDE_CLIENT].max_bulk, &p);
    /* The rest of the transaction is on its way when some of it came; and a MULTI alone, on a
     * listener whose rules judge what a transaction carries (acks, RQ's enqueue), waits for
     * the rest too (a client written to wait for MULTI's +OK gets it after RPX_TX_WAIT_MS):
     * forwarded at once, its ack could not be faulted any more. */
    bool judged = rx->fw->tx_judged != NULL && rx->fw->tx_judged(h);
    uint64_t now = proxy_now_ms();
    bool waited = rx->phase == RPX_TX_WAIT && rx->tx_wait_until <= now;
    if (rc == 0 && !waited && (avail > len || judged)) {
        resp_tx_plan_free(rx->fw, &p);
        if (rx->phase != RPX_TX_WAIT)
            (void)rpx_set_phase(rx, RPX_TX_WAIT, now + RPX_TX_WAIT_MS);
        *res = CMD_WAIT;
        return 0;
    }
    if (rx->phase == RPX_TX_WAIT)
        (void)rpx_set_phase(rx, RPX_RELAYING, 0); /* planned, or waited long enough */
    rc = rc == 1 ? 1 : -1;
    if (rc == 1 && p.cut_before != NULL) {
        *res = rpx_cut_command(rx, p.cut_before, true, NULL, len);
        rc = 0;
    } else if (rc == 1 && p.hold) {
        /* Held whole (a delayed publish in it): the plan made now is the one carried out when
         * MULTI is read again, decided (its other events were decided, journaled and noted). */
        if (tx_take_plan(rx, &p) != 0) {
            say_not_planned(rx);
            rpx_tx_reset(&rx->tx);
        }
        rx->decision.planned = true;
        (void)rpx_set_phase(rx, RPX_HOLDING, now + p.hold_ms);
        *res = CMD_WAIT;
        rc = 0;
    } else if (rc == 1 && tx_take_plan(rx, &p) != 0) {
        say_not_planned(rx);
        rpx_tx_reset(&rx->tx);
        rc = 1;
    }
    resp_tx_plan_free(rx->fw, &p);
    return rc == 0 ? 0 : 1;
}

/* MULTI outside a transaction: the transaction's plan, made once its commands are here (or
 * after RPX_TX_WAIT_MS), then MULTI goes on. */
enum cmd_result rpx_tx_begin(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m)
{
    size_t len = m->len;
    if (pump_settle(&rx->pump, SIDE_CLIENT) != 0) /* the plan reads from the MULTI on */
        return CMD_STOP;
    enum cmd_result res = CMD_DONE;
    if (rx->fw != NULL && rx->fw->transaction != NULL && !rx->decision.planned &&
        tx_plan(rx, len, &res) == 0)
        return res;
    rx->tx.active = true;
    rx->tx.idx = 0;
    const uint8_t *multi = evbuffer_pullup(rx->pump.in[SIDE_CLIENT], (ev_ssize_t)len);
    if (multi == NULL) {
        pump_fail(&rx->pump, "reading a transaction");
        return CMD_STOP;
    }
    rpx_forward(rx, cv, m, multi, len);
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
        if (t->after_exec.n > 0) {
            struct evbuffer *after = evbuffer_new();
            if (after != NULL &&
                evbuffer_add(after, t->after_exec.cmds.p, t->after_exec.cmds.len) == 0) {
                e->kind = RK_EXEC; /* its reply says whether the transaction ran */
                e->after = after;
                e->n_after = t->after_exec.n;
            } else if (after != NULL) {
                evbuffer_free(after);
            }
        }
        if (t->close_after != NULL)
            (void)rpx_cut_command(rx, t->close_after, false, e, len); /* after EXEC's reply */
        for (size_t i = 0; i < t->n_own; i++) {
            struct evbuffer *b = evbuffer_new();
            if (b != NULL && evbuffer_add(b, t->own[i].cmds.p, t->own[i].cmds.len) == 0)
                rpx_aux_send_at(rx, b, t->own[i].n, t->own[i].ms);
            if (b != NULL)
                evbuffer_free(b);
        }
    }
    rpx_tx_reset(t);
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
    return CMD_DONE;
}
