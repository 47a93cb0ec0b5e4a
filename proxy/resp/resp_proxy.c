/*
 * resp_proxy.c - the RESP layer of a session: commands and replies in, faults out.
 *
 * Bytes from the client are cut into commands, bytes from the server into
 * replies (proto/resp/resp.h, RESP2 and RESP3).  Every command that the server
 * will answer goes into a pairing FIFO (proto/resp/resp.h's struct resp_pairing:
 * MULTI/EXEC, pub/sub, CLIENT REPLY, HELLO, MONITOR), and into this file's
 * queue of replies owed to the client, in the client's order.  An entry of
 * that queue is answered by the server (the reply is moved in, chains and
 * all, without a copy) or by twice (an error it injects, a +QUEUED for a
 * command it kept back); it goes out when every entry before it has.  So a
 * reply twice fakes lands exactly where the client expects it, and a reply
 * twice delays holds back the ones behind it, as a slow server would.
 *
 * Events: `command` for every command, decided here; with a profile, the job events
 * (`publish`, `deliver`, `ack`, `nack`, `lease`) are the listener's framework module's
 * (proto/jobs/: one per framework, docs/architecture.md): it reads each command, reply and
 * transaction, asks the rules through its host (resp_host.c), and answers with a plan, which
 * resp_host.c carries out here: a command forwarded, rewritten, answered by twice, held or cut;
 * a reply replaced, held or cut; commands for twice's own connection (proxy/resp/resp_aux.h).  An
 * ack is usually a MULTI ... EXEC transaction: twice reads the whole transaction ahead before it
 * forwards MULTI (waiting up to RPX_TX_WAIT_MS for the rest of it), the module plans it once,
 * and resp_tx.c keeps back the commands a fault suppresses, answering +QUEUED for them and
 * splicing their results into the server's EXEC array.  What a delivery says about a job for
 * its ack on another connection is kept per listener in proxy/resp/idmap.h.
 *
 * Bad input: a malformed command or reply closes the session with a logged
 * reason; every other session carries on.
 *
 * This file has the codec's ops, the byte loops and the commands; the replies
 * owed to the client are resp_replies.c's, the modules' host resp_host.c, the
 * transactions resp_tx.c's (what they share: resp_internal.h).
 */
#include "proxy/resp/resp_internal.h"

#include <assert.h>

#include "proxy/net/session.h"
#include "rules/engine.h"

static void rpx_process(void *state, enum session_side from, struct evbuffer *in);

/* ---- the client side's phase (resp_internal.h) ------------------------------------------- */

static const char *const phase_names[] = {"relaying", "holding",    "tx_wait",
                                          "raw",      "blackholed", "stopped"};

/* The moves the diagram of enum rpx_phase draws: a bit per phase a phase may go to. */
static const unsigned phase_moves[] = {
    [RPX_RELAYING] = LOG_STATE_BIT(RPX_HOLDING) | LOG_STATE_BIT(RPX_TX_WAIT) |
                     LOG_STATE_BIT(RPX_RAW) | LOG_STATE_BIT(RPX_BLACKHOLED) |
                     LOG_STATE_BIT(RPX_STOPPED),
    [RPX_HOLDING] =
        LOG_STATE_BIT(RPX_RELAYING) | LOG_STATE_BIT(RPX_RAW) | LOG_STATE_BIT(RPX_STOPPED),
    [RPX_TX_WAIT] =
        LOG_STATE_BIT(RPX_RELAYING) | LOG_STATE_BIT(RPX_RAW) | LOG_STATE_BIT(RPX_STOPPED),
    [RPX_RAW] = LOG_STATE_BIT(RPX_RAW) | LOG_STATE_BIT(RPX_STOPPED),
    [RPX_BLACKHOLED] =
        LOG_STATE_BIT(RPX_RAW) | LOG_STATE_BIT(RPX_BLACKHOLED) | LOG_STATE_BIT(RPX_STOPPED),
    [RPX_STOPPED] = LOG_STATE_BIT(RPX_STOPPED),
};

bool rpx_set_phase(struct rpx *rx, enum rpx_phase to, uint64_t until)
{
    if (!log_state_move("resp phase", rx->s->id, rpx_scope(rx), phase_moves, phase_names, rx->phase,
                        to))
        return false;
    rx->phase = to;
    /* The deadlines are the data of their phases only. */
    rx->hold_until = to == RPX_HOLDING ? until : 0;
    rx->tx_wait_until = to == RPX_TX_WAIT ? until : 0;
    return true;
}

/*
 * Runs (pump.h).  A message that goes on unchanged (the common case: a command to Redis, its
 * reply straight back) joins the run of the pump's in[side]: a pipeline of 16 commands costs
 * one move instead of 16, and its messages are scanned in place in the chain the first one
 * was found in (the pump's win[side]), without asking the buffer again.  Code that takes
 * bytes from the head of in[side] or rearranges it (a pullup) settles the run first; the
 * pump's own operations do.
 */

/* The window over the first chain of in[side] when none is open and no message is begun
 * (nothing in the run, nothing needed): what scan_one() leaves after a message, so that the
 * plain pipeline takes a read's first message too, not only those after it.  False when in
 * is empty. */
static bool win_open(struct rpx *rx, enum session_side side)
{
    if (rx->pump.win[side].p != NULL)
        return true;
    if (rx->pump.run[side] != 0 || rx->need[side] != 0)
        return false;
    return pump_window(&rx->pump, side) != NULL;
}

static void protocol_error(struct rpx *rx, enum session_side from, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A peer broke the protocol (or twice cannot follow it): close with a
 * logged reason; the other sessions carry on. */
static void protocol_error(struct rpx *rx, enum session_side from, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    codec_log_protocol_error(rx->s, msg, NULL);
    /* What came before the bad bytes still reaches the other side: commands
     * forwarded to Redis, or the replies due to the client. */
    enum session_side to = from == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
    if (to == SIDE_CLIENT)
        rpx_flush_replies(rx);
    if (!rpx_alive(rx))
        return;
    pump_flush(&rx->pump, to);
    pump_abort(&rx->pump, SESSION_CLOSE_PROTOCOL_ERROR, to);
}

/* `close before` / `close after`: what already went through reaches its
 * side; the session then ends. */
void rpx_cut(struct rpx *rx, const struct rule *r)
{
    session_set_error(rx->s, "cut by rule '%s' (close %s)", r->name,
                      r->action.close_when == RULE_CLOSE_BEFORE ? "before" : "after");
    pump_flush(&rx->pump, SIDE_UPSTREAM);
    pump_flush(&rx->pump, SIDE_CLIENT);
    pump_abort(&rx->pump, SESSION_CLOSE_FAULT, SIDE_CLIENT);
}

/* ---- twice's own connection -------------------------------------------- */

static struct resp_aux *aux_get(struct rpx *rx)
{
    if (rx->aux != NULL && resp_aux_failed(rx->aux)) {
        resp_aux_detach(rx->aux);
        rx->aux = NULL;
    }
    if (rx->aux == NULL) {
        struct evbuffer *pro = evbuffer_new();
        size_t n = 0;
        if (pro == NULL)
            return NULL;
        for (int i = 0; i < 3; i++) {
            if (rx->setup[i] != NULL) {
                evbuffer_add(pro, evbuffer_pullup(rx->setup[i], -1),
                             evbuffer_get_length(rx->setup[i]));
                n++;
            }
        }
        rx->aux = resp_aux_open(rx->s, pro, n);
        evbuffer_free(pro);
        if (rx->aux == NULL)
            log_msg(LOG_WARN, "cannot open twice's own redis connection", "sid=%llu listener=%s",
                    (unsigned long long)rx->s->id, rpx_scope(rx));
    }
    return rx->aux;
}

/* Encodes a command of 2 or 3 arguments into b. */
int rpx_encode_cmd(struct evbuffer *b, size_t argc, const char *const *argv, const size_t *lens)
{
    size_t need = 32;
    for (size_t i = 0; i < argc; i++)
        need += lens[i] + 24;
    struct evbuffer_iovec iov;
    if (evbuffer_reserve_space(b, (ev_ssize_t)need, &iov, 1) < 1)
        return -1;
    int n = resp_encode_command(iov.iov_base, iov.iov_len, argc, argv, lens);
    if (n < 0)
        return -1;
    iov.iov_len = (size_t)n;
    return evbuffer_commit_space(b, &iov, 1);
}

/* Sends the n commands of cmds on twice's own connection, now (ms 0) or ms later; commands
 * that cannot be scheduled are logged. */
void rpx_aux_send_at(struct rpx *rx, struct evbuffer *cmds, size_t n, uint32_t ms)
{
    struct resp_aux *a = aux_get(rx);
    if (a == NULL)
        return; /* logged by aux_get */
    if (ms == 0)
        resp_aux_send(a, cmds, n);
    else if (resp_aux_send_later(a, ms, cmds, n) != 0)
        log_msg(LOG_WARN, "cannot schedule twice's own redis commands",
                "sid=%llu listener=%s commands=%zu delay_ms=%u", (unsigned long long)rx->s->id,
                rpx_scope(rx), n, ms);
}

/* ---- commands ---------------------------------------------------------- */

/* Remembers the client's AUTH / HELLO / SELECT for twice's own connection. */
static void remember_setup(struct rpx *rx, const struct rprof_cmdview *cv)
{
    int which = rpx_is_cmd(cv, RPROF_CMD_AUTH)     ? SETUP_AUTH
                : rpx_is_cmd(cv, RPROF_CMD_HELLO)  ? SETUP_HELLO
                : rpx_is_cmd(cv, RPROF_CMD_SELECT) ? SETUP_SELECT
                                                   : -1;
    if (which < 0 || rx->tx.active)
        return;
    if (rx->setup[which] == NULL && (rx->setup[which] = evbuffer_new()) == NULL)
        return;
    evbuffer_drain(rx->setup[which], evbuffer_get_length(rx->setup[which]));
    evbuffer_add(rx->setup[which], cv->buf, cv->len);
}

/* Forwards the command at the head of in[CLIENT] (len bytes; cv its view,
 * whose name the pairing takes) and owes the client its reply. */
struct entry *rpx_forward(struct rpx *rx, const struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, size_t len)
{
    int rc = resp_pairing_command_named(&rx->pairing, m, buf, cv->name, 0, NULL);
    pump_pass(&rx->pump, SIDE_CLIENT, len);
    if (rc != 1)
        return NULL; /* the server will not answer (CLIENT REPLY OFF, empty command) */
    return rpx_entry_add(rx, true);
}

/* Forwards a command twice does not look at (no id, no rule on it): like
 * rpx_forward(), but its reply joins the last entry when that one is a plain
 * reply still owed, so that a pipeline of GETs costs one entry, not one
 * each.  The entry counts commands (`more`), not replies: a SUBSCRIBE's
 * confirmations end it at the last one, as the pairing says.  Replies and
 * what comes out of band between them go out in the order they came, as
 * with an entry each. */
static void owe_plain(struct rpx *rx)
{
    struct entry *t = rx->tail;
    if (t != NULL && t->server && !t->done && t->kind == RPROF_REPLY_PLAIN && !t->hide &&
        t->close_after == NULL && t->release_ms == 0 && t->more < UINT32_MAX) {
        t->more++;
        return;
    }
    rpx_entry_add(rx, true);
}

static void forward_plain(struct rpx *rx, const struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, size_t len)
{
    int rc = resp_pairing_command_named(&rx->pairing, m, buf, cv->name, 0, NULL);
    pump_pass(&rx->pump, SIDE_CLIENT, len);
    if (rc == 1)
        owe_plain(rx);
}

/*
 * The plain pipeline.  While no rule looks at commands and nothing is in
 * progress (no transaction, no hold, no decision made ahead), a command that
 * neither twice nor the pairing has a use for (GET, SET, INCR...) is only
 * measured: resp_scan_command_len() finds its end and its name, the name is
 * matched, and the command joins the run, as command() would end up doing
 * for it after a full scan.  Anything else, or anything unusual about it (a
 * long name, a NUL, a message that leaves the window), goes the general way.
 * Returns whether it took the next command (and those after it).
 */
static bool plain_command(struct rpx *rx, bool cmd_rules)
{
    const struct pump_window *w = &rx->pump.win[SIDE_CLIENT];
    if (rx->decision.decided || rx->tx.active || rx->need[SIDE_CLIENT] != 0 || cmd_rules ||
        !win_open(rx, SIDE_CLIENT))
        return false;
    /* The rest of a pipeline in one call: nothing above changes while it
     * takes plain commands (the pairing's room is checked by the pairing). */
    size_t taken = 0;
    while (w->p != NULL && w->len > rx->pump.run[SIDE_CLIENT]) { /* p NULL: the pump stopped */
        const uint8_t *p = w->p + rx->pump.run[SIDE_CLIENT];
        struct resp_view nv;
        size_t len =
            resp_scan_command_len(&rx->sc[SIDE_CLIENT], p, w->len - rx->pump.run[SIDE_CLIENT], &nv);
        if (len == 0 || nv.len == 0 || nv.len >= RESP_CMD_NAME_MAX)
            break;
        const uint8_t *raw = p + nv.off;
        char own[RESP_CMD_NAME_MAX];
        bool again = nv.len == rx->last_plain.len && resp_small_eq(raw, rx->last_plain.raw, nv.len);
        if (!again && (resp_cmd_name_bytes(raw, nv.len, own) != nv.len || /* a NUL in it */
                       rprof_cmd_matters(rx->prof, rprof_cmd_of(own, nv.len))))
            break;
        const char *name = again ? rx->last_plain.name : own;
        if (resp_pairing_simple(&rx->pairing, name, nv.len, 0, NULL) != 1)
            break;
        if (!again) {
            memcpy(rx->last_plain.raw, raw, nv.len);
            memcpy(rx->last_plain.name, own, nv.len + 1);
            rx->last_plain.len = nv.len;
        }
        pump_pass(&rx->pump, SIDE_CLIENT, len);
        owe_plain(rx);
        taken++;
    }
    if (taken > 0)
        session_count_events(rx->s, RULE_EV_COMMAND, taken);
    return taken > 0;
}

/*
 * Long messages.  A command or reply longer than the chain it starts in (a
 * SET of a 1 MiB value, its GET's reply) would be pulled up into one buffer
 * for resp_scan(): the whole value copied.  When it is of the plain kinds
 * the two functions above take (a command of bulk strings, a bulk string or
 * an array of them as a reply), resp_walk() measures it header by header
 * instead, through peek_at(), when scan_one() finds it does not end in the
 * first chain; the run grows over it and its chains move on by reference.
 * Anything else, or anything odd, is left to scan_one(), which pulls the
 * message up as before and reports what is wrong with it.
 */
/* resp_walk()'s reader: up to cap bytes of an evbuffer from offset `at`. */
static size_t peek_at(void *src, size_t at, uint8_t *dst, size_t cap)
{
    struct evbuffer *b = src;
    struct evbuffer_ptr ptr;
    if (evbuffer_ptr_set(b, &ptr, at, EVBUFFER_PTR_SET) != 0)
        return 0;
    ev_ssize_t got = evbuffer_copyout_from(b, &ptr, dst, cap);
    return got > 0 ? (size_t)got : 0;
}

/* The command's name, once resp_walk() has seen it, if it is one the profile p has no use for
 * (rprof_cmd_matters()): its length, name[] as resp_cmd_name_bytes() makes it.  0 for any
 * other. */
static size_t big_name(enum rprof p, struct evbuffer *b, size_t at, const struct resp_walk *w,
                       char *name)
{
    uint8_t raw[RESP_CMD_NAME_MAX];
    size_t n = w->name_len;
    if (n == 0 || n >= RESP_CMD_NAME_MAX || peek_at(b, at + w->name_off, raw, n) != n ||
        resp_cmd_name_bytes(raw, n, name) != n || rprof_cmd_matters(p, rprof_cmd_of(name, n)))
        return 0;
    return n;
}

/* scan_one() is about to pull the message at the head of in[side] (the
 * run moved) up across chains: the walker takes it instead when it is plain
 * and the plain paths may take it.  1: taken (the run grew over it); 0:
 * more bytes needed (rx->need set); -1: left to the scanner. */
static int big_try(struct rpx *rx, enum session_side side)
{
    struct evbuffer *pend = rx->pump.in[side];
    struct entry *e = rx->await;
    if (side == SIDE_CLIENT
            ? rx->decision.decided || rx->tx.active || codec_wants(rx->s, RULE_EV_COMMAND)
            : e == NULL || !rpx_straight_out(rx, e) || rx->held != 0 || rx->streaming)
        return -1; /* (a streamed reply's head is gone: pend starts inside it) */
    struct resp_walk w;
    char name[RESP_CMD_NAME_MAX];
    size_t name_len = 0, n = evbuffer_get_length(pend);
    int r = resp_walk(&rx->sc[side], peek_at, pend, 0, n, &w);
    if (r == RESP_WALK_NO || (side == SIDE_CLIENT && w.name_len > 0 &&
                              (name_len = big_name(rx->prof, pend, 0, &w, name)) == 0))
        return -1;
    if (r == RESP_WALK_WAIT) {
        if (side == SIDE_UPSTREAM && w.len > RPX_STREAM_MIN)
            return -1; /* long: passed on as it comes (stream_part), not waited for whole */
        resp_scanner_reset(&rx->sc[side]); /* the walker measures it again then */
        rx->need[side] = w.len;
        return 0;
    }
    if (side == SIDE_CLIENT ? resp_pairing_simple(&rx->pairing, name, name_len, 0, NULL) != 1
                            : resp_pairing_reply_simple(&rx->pairing, w.type) != 1)
        return -1;
    resp_scanner_reset(&rx->sc[side]);
    rx->need[side] = 0;
    pump_pass(&rx->pump, side, w.len);
    if (side == SIDE_CLIENT) {
        codec_count(rx->s, RULE_EV_COMMAND);
        owe_plain(rx);
    } else {
        rpx_entry_answered(rx, e, true);
    }
    return 1;
}

/* Keeps back the command at the head of in[CLIENT]. */
void rpx_swallow(struct rpx *rx, size_t len)
{
    (void)pump_drop(&rx->pump, SIDE_CLIENT, len);
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
    rpx_swallow(rx, len);
    if (pump_inject_buffer(&rx->pump, SIDE_UPSTREAM, cmd) != 0)
        return NULL;
    return rpx_entry_add(rx, true);
}

/* One line about a session whose bytes twice stops parsing: msg, with key=value and detail. */
static void log_unparsed(struct rpx *rx, enum log_level level, const char *msg, const char *key,
                         const char *value, const char *detail)
{
    struct log_line line;
    log_begin(&line, level, msg);
    log_u64(&line, "sid", rx->s->id);
    log_str(&line, "listener", rx->s->cfg->l->name);
    log_str(&line, key, value);
    log_str(&line, "detail", detail);
    log_end(&line);
}

/* From the server's reply that entry e awaits on, the session is relayed unparsed both ways
 * (relay_stream; the client's bytes in RPX_RAW): logged once. */
static void relay_unparsed(struct rpx *rx, struct entry *e, enum log_level level, const char *msg,
                           const char *key, const char *value)
{
    e->kind = RK_STREAM;
    (void)rpx_set_phase(rx, RPX_RAW, 0);
    log_unparsed(rx, level, msg, key, value, "relayed unparsed from here on, both ways");
}

/* The session relayed unparsed from the reply being read on (server_raw, whole_too_long): the
 * entry it answers becomes the stream, or, for one that answers nothing (a MONITOR line, a
 * pub/sub message), a new entry behind those owed. */
static void relay_reply(struct rpx *rx, const char *msg, const char *key, const char *value)
{
    struct entry *e = rx->await != NULL ? rx->await : rpx_entry_add(rx, true);
    if (e == NULL)
        return; /* the pump stopped (rpx_entry_add) */
    relay_unparsed(rx, e, LOG_WARN, msg, key, value);
}

/*
 * SYNC or PSYNC outside a transaction: the connection becomes a replication
 * stream, which is not RESP's request and reply.  The server answers with an
 * RDB transfer (newlines as keep-alives while it prepares it, then $<len>
 * and that many raw bytes with no CRLF after them, or $EOF:<40-byte mark>,
 * the bytes, and the mark again), and then sends the commands it propagates,
 * which answer nothing and ask REPLCONF GETACK; the replica's REPLCONF ACKs
 * go the other way unanswered.  So twice stops parsing the session there:
 * the client's bytes from this command on go to Redis as they are, and the
 * server's go to the client as they are once the replies owed before it are
 * out (relay_stream).  The same when the server refuses SYNC: the session
 * stays a byte relay.  Rules no longer see its commands; stream rules still
 * act on its bytes, below this layer.
 */
static enum cmd_result replication_start(struct rpx *rx, const struct rprof_cmdview *cv, size_t len)
{
    pump_pass(&rx->pump, SIDE_CLIENT, len);
    struct entry *e = rpx_entry_add(rx, true);
    if (e == NULL)
        return CMD_STOP; /* the pump stopped (rpx_entry_add) */
    relay_unparsed(rx, e, LOG_INFO, "replication stream", "command", cv->name);
    return CMD_DONE;
}

/* The server's bytes once its replies reached the stream's entry e: all of
 * them, straight out when nothing waits before them, else into e (which
 * never completes) to go out behind what does. */
static void relay_stream(struct rpx *rx, struct entry *e)
{
    size_t n = pump_rest(&rx->pump, SIDE_UPSTREAM);
    if (n == 0)
        return;
    if (e == rx->head && e->release_ms == 0 && evbuffer_get_length(e->bytes) == 0) {
        pump_pass(&rx->pump, SIDE_UPSTREAM, n);
        return;
    }
    if (pump_hold(&rx->pump, SIDE_UPSTREAM, n, e->bytes) == 0)
        rx->held += n;
}

/* ---- one command ------------------------------------------------------- */

/* The `command` event of the command at the head, decided once into rx->decision: the first
 * rule that fired with an action on commands (rules/plan.h), or none.  Without a rule on
 * commands the event is only counted. */
static void decide_command(struct rpx *rx, const struct rprof_cmdview *cv, bool cmd_rules)
{
    struct rpx_decision *d = &rx->decision;
    d->decided = true;
    d->fault = rule_cmd_fault(NULL);
    if (!cmd_rules) {
        codec_count(rx->s, RULE_EV_COMMAND);
        return;
    }
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    char anon[48];
    ev.event = RULE_EV_COMMAND;
    ev.command = cv->name;
    ev.key = cv->has_key ? cv->key : NULL;
    ev.identity =
        codec_anon_id(anon, sizeof(anon), "cmd", (const uint64_t[]){rx->s->id, ++rx->anon}, 2);
    size_t hits[SESSION_MAX_RULE_HITS];
    size_t n = rpx_decide(rx, &ev, hits);
    for (size_t i = 0; i < n && d->fault.kind == JOB_FAULT_NONE; i++) {
        struct job_fault f = rule_cmd_fault(rpx_hit_rule(rx, hits[i]));
        if (f.kind != JOB_FAULT_OTHER)
            d->fault = f;
    }
}

/* A command no module planned: GET, SET, INCR... on the plain path (its reply may join the last
 * entry), anything else forwarded with an entry of its own. */
static enum cmd_result command_other(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf)
{
    if (!rprof_cmd_matters(rx->prof, cv->id))
        forward_plain(rx, cv, m, buf, m->len);
    else
        rpx_forward(rx, cv, m, buf, m->len);
    return CMD_DONE;
}

static enum cmd_result command(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m)
{
    struct rpx_decision *d = &rx->decision;
    struct rprof_cmdview cv;
    bool cmd_rules = !d->decided && codec_wants(rx->s, RULE_EV_COMMAND);
    rprof_cmdview_init(&cv, buf, m, cmd_rules);
    size_t len = m->len;

    if (m->nelem == 0) {
        /* An empty command: Redis answers nothing, but its resetClient()
         * still ends a CLIENT REPLY SKIP, as the pairing does. */
        int none = resp_pairing_command(&rx->pairing, m, buf, 0, NULL); /* 0: no reply due */
        (void)none;
        pump_pass(&rx->pump, SIDE_CLIENT, len);
        return CMD_DONE;
    }

    if (!d->decided)
        decide_command(rx, &cv, cmd_rules);
    if (d->fault.kind != JOB_FAULT_NONE) {
        /* Carried out once: a delayed command comes back with no fault left. */
        struct resp_cmd_plan plan;
        memset(&plan, 0, sizeof(plan));
        rpx_cmd_plan_of_fault(&d->fault, &plan);
        d->fault = rule_cmd_fault(NULL);
        return rpx_apply_cmd_plan(rx, &cv, m, buf, &plan);
    }

    remember_setup(rx, &cv);

    /* A module sees every command as it passes (Sidekiq's heartbeat, in its MULTI), once. */
    if (rx->fw != NULL && rx->fw->seen != NULL && !d->seen) {
        d->seen = true;
        rx->fw->seen(rpx_host(rx), &cv);
    }

    if (!rx->tx.active && (resp_cmd_name_flags(cv.name, strlen(cv.name)) & RESP_CMD_SYNC))
        return replication_start(rx, &cv, len);

    if (rpx_is_cmd(&cv, RPROF_CMD_MULTI) && !rx->tx.active)
        return rpx_tx_begin(rx, &cv, m);
    if (rx->tx.active && rx->tx.aborted && rpx_is_cmd(&cv, RPROF_CMD_EXEC))
        return rpx_tx_exec_aborted(rx, m);
    if (rx->tx.active && (rpx_is_cmd(&cv, RPROF_CMD_EXEC) || rpx_is_cmd(&cv, RPROF_CMD_DISCARD)))
        return rpx_tx_end(rx, &cv, m, buf);
    if (rx->tx.active)
        return rpx_tx_queue(rx, &cv, m, buf);
    if (rx->fw != NULL) {
        struct resp_cmd_plan plan;
        memset(&plan, 0, sizeof(plan));
        if (rx->fw->command(rpx_host(rx), &cv, d->planned, &plan) == 1) {
            d->planned = true; /* if it comes back (a hold), it is not planned again */
            return rpx_apply_cmd_plan(rx, &cv, m, buf, &plan);
        }
        resp_cmd_plan_free(&plan);
    }
    return command_other(rx, &cv, m, buf);
}

/* ---- the byte loops ---------------------------------------------------- */

/* Grows the pairing FIFO, keeping its order; false at the maximum. */
static bool pairing_grow(struct rpx *rx)
{
    struct resp_pairing *p = &rx->pairing;
    if (p->cap >= RPX_PIPELINE_MAX)
        return false;
    size_t cap = p->cap * 2;
    struct resp_cmd *s = malloc(cap * sizeof(*s));
    if (s == NULL)
        return false;
    for (size_t i = 0; i < p->count; i++)
        s[i] = p->slots[(p->head + i) % p->cap];
    free(rx->slots);
    rx->slots = s;
    p->slots = s;
    p->head = 0;
    p->cap = cap;
    return true;
}

/* A client's bulk string over max-message-size: what came before it went to
 * Redis, and its replies still reach the client, followed by Redis's own
 * answer to a bulk over proto-max-bulk-len; then the session ends.  What the
 * client sends meanwhile is discarded (blackholed). */
static void client_over_limit(struct rpx *rx, uint64_t max_message)
{
    char msg[128];
    snprintf(msg, sizeof(msg), "client sent a bulk string over max-message-size %llu",
             (unsigned long long)max_message);
    codec_log_protocol_error(rx->s, msg, NULL);
    (void)rpx_set_phase(rx, RPX_BLACKHOLED, 0);
    (void)pump_drop(&rx->pump, SIDE_CLIENT, pump_rest(&rx->pump, SIDE_CLIENT));
    struct entry *e = rpx_entry_add(rx, false);
    if (e == NULL) {
        pump_flush(&rx->pump, SIDE_UPSTREAM);
        pump_abort(&rx->pump, SESSION_CLOSE_PROTOCOL_ERROR, SIDE_UPSTREAM);
        return;
    }
    static const char refusal[] = "-ERR Protocol error: invalid bulk length\r\n";
    evbuffer_add(e->bytes, refusal, sizeof(refusal) - 1);
    rx->held += sizeof(refusal) - 1;
    e->close_protocol = true;
    pump_flush(&rx->pump, SIDE_UPSTREAM);
    rpx_flush_replies(rx);
}

/* A reply Redis itself wrote that twice's scanner does not follow: nested
 * deeper than RESP_MAX_DEPTH (a Lua script returning a table that holds
 * itself nests thousands of levels before Redis gives up), or a RESP3 value
 * with bytes the type does not allow (a script's big number with spaces in
 * it).  Not garbage: Redis's own clients read it.  The session becomes a byte
 * relay from that reply on, both ways, as after SYNC (relay_stream): the
 * client gets what Redis sent, and rules see no more of the session. */
static void server_raw(struct rpx *rx, int rc)
{
    relay_reply(rx, "resp reply not followed", "error", resp_strerror(rc));
}

/* A peer broke RESP.  A client's bytes go on to Redis as they are, from the
 * first bad one: Redis answers the commands before them, then its own
 * "-ERR Protocol error" and closes, exactly as without twice.  A server
 * that breaks RESP ends the session with a logged reason. */
static int scan_error(struct rpx *rx, enum session_side side, int rc)
{
    uint64_t max_message = rx->s->cfg->l->max_message;
    if (rc == RESP_E_BULK_TOO_LONG && max_message != 0 && max_message < RESP_MAX_BULK) {
        if (side == SIDE_CLIENT)
            client_over_limit(rx, max_message);
        else
            protocol_error(rx, side, "server sent a bulk string over max-message-size %llu",
                           (unsigned long long)max_message);
        return -1;
    }
    if (side == SIDE_UPSTREAM) {
        /* Redis writes status and error lines of any length (a MONITOR line of a big SET, a
         * script's status reply): past max_line, relayed as they are, never the session's end. */
        if (rc == RESP_E_TOO_DEEP || rc == RESP_E_VALUE || rc == RESP_E_LINE_TOO_LONG) {
            server_raw(rx, rc);
            return -1;
        }
        protocol_error(rx, SIDE_UPSTREAM, "server sent %s", resp_strerror(rc));
        return -1;
    }
    /* Not the session's error: it goes on, and Redis ends it. */
    log_unparsed(rx, LOG_WARN, "resp protocol error", "error", resp_strerror(rc),
                 "client bytes passed on unparsed from here; redis will refuse them");
    (void)rpx_set_phase(rx, RPX_RAW, 0);
    return -1;
}

/*
 * A long reply nothing reads (an LRANGE of a big list, KEYS *, a big GET: the reply to a plain
 * command, due to the client now, nothing held before it) goes on as it comes.  What the
 * scanner has checked of it joins the run, and only the item being read stays in pend: a session
 * holds a few reads of a reply of any size, the client gets its first bytes at once, and a client
 * that does not read stops twice reading Redis (session_send's backpressure), as on a tcp
 * listener.  Once begun, the reply streams to its end (stream_end).  True when part of it went
 * on; m is resp_scan()'s "need more" over len bytes at the head of pend.
 */
static bool stream_may(const struct rpx *rx, const struct resp_msg *m)
{
    const struct entry *e = rx->await;
    return rx->streaming ||
           (m->type != 0 && !m->attribute && e != NULL && rpx_straight_out(rx, e) &&
            rx->held == 0 && evbuffer_get_length(e->bytes) == 0 &&
            resp_pairing_reply_plain(&rx->pairing, m->type));
}

/* What of a reply must be here before it starts to stream: RPX_STREAM_MIN, less under a small
 * max-held (which bounds what is read whole). */
static size_t stream_min(const struct rpx *rx)
{
    size_t half = rpx_held_max(rx) / 2;
    return half < RPX_STREAM_MIN ? (half > 0 ? half : 1) : RPX_STREAM_MIN;
}

static bool stream_part(struct rpx *rx, const struct resp_msg *m, size_t len)
{
    struct resp_scanner *sc = &rx->sc[SIDE_UPSTREAM];
    if (!stream_may(rx, m))
        return false;
    size_t k = resp_scan_releasable(sc, len);
    if (k == 0 || (!rx->streaming && k < stream_min(rx)))
        return false;
    rx->streaming = true;
    resp_scan_release(sc, k);
    pump_pass(&rx->pump, SIDE_UPSTREAM, k);
    rx->need[SIDE_UPSTREAM] = 0;
    return true;
}

/* The end of a reply stream_part() began: the rest of it goes on, and it answers its command, as
 * rpx_on_reply() would have for it whole (its views count from a start that is gone). */
static void stream_end(struct rpx *rx, const struct resp_msg *m)
{
    rx->streaming = false;
    pump_pass(&rx->pump, SIDE_UPSTREAM, m->len);
    /* Checked at its start, and nothing pairs replies meanwhile. */
    if (resp_pairing_reply_simple(&rx->pairing, m->type) != 1) {
        protocol_error(rx, SIDE_UPSTREAM, "streamed reply answers no command");
        return;
    }
    rpx_entry_answered(rx, rx->await, true);
}

/* A reply twice must read whole (a job the module reads, a reply a rule holds, one behind a held
 * reply, a pub/sub message) that grew past max-held before its end.  Not held whole: the session
 * is relayed unparsed from that reply on, as for replies twice cannot follow (server_raw), so the
 * client still gets every byte Redis sent and memory stays bounded (max-held). */
static int whole_too_long(struct rpx *rx, size_t n)
{
    char got[32];
    snprintf(got, sizeof(got), "%zu", n);
    relay_reply(rx, "resp reply too long to read whole", "bytes", got);
    return -1;
}

/* Scans the message after the run in in[side].  1 with *m and *buf set,
 * 0 when more bytes are needed, -1 after a protocol error (reported), 2
 * when big_try() took a long plain message (look at the next one). */
/* The first len bytes of in[side] in one piece, or NULL when memory ran out (the pump
 * stopped: the session is closed). */
static const uint8_t *pullup(struct rpx *rx, enum session_side side, size_t len)
{
    const struct pump_window *w = pump_window_pullup(&rx->pump, side, len);
    if (w == NULL)
        return NULL;
    const uint8_t *p = w->p;
    rx->pump.win[side].p = NULL; /* a window opened only at a message's end (scan_one) */
    return p;
}

static int scan_one(struct rpx *rx, enum session_side side, struct resp_msg *m, const uint8_t **buf)
{
    struct pump_window *w = &rx->pump.win[side];
    size_t run = rx->pump.run[side];
    if (w->p != NULL && w->len > run) {
        /* The usual case in a pipeline: the next message is in the chain
         * the run's messages were in, already looked at. */
        int rc = resp_scan(&rx->sc[side], w->p + run, w->len - run, m);
        if (rc == 1) {
            *buf = w->p + run;
            return 1;
        }
        if (rc < 0) {
            (void)pump_settle(&rx->pump, side);
            return scan_error(rx, side, rc);
        }
    }
    struct evbuffer *pend = rx->pump.in[side];
    size_t n = evbuffer_get_length(pend);
    if (run > 0 && n == run)
        return 0; /* all of it is in the run: it stays there for pump_flush() */
    /* At the start of a read, or a message beyond the first chain: the run
     * moves on and the message is scanned from the head (the scanner's
     * progress is relative to the message's start, which has not changed). */
    if (pump_settle(&rx->pump, side) != 0)
        return -1;
    n -= run;
    if (n == 0 || n < rx->need[side])
        return 0;
    size_t contig = evbuffer_get_contiguous_space(pend);
    size_t len = contig >= rx->need[side] && contig > 0 ? contig : n;
    int big;
    if (len > contig && (big = big_try(rx, side)) >= 0)
        return big == 1 ? 2 : 0;
    if ((*buf = pullup(rx, side, len)) == NULL)
        return -1;
    int rc = resp_scan(&rx->sc[side], *buf, len, m);
    if (rc < 0)
        return scan_error(rx, side, rc);
    if (rc == 0 && side == SIDE_UPSTREAM && stream_part(rx, m, len))
        return 2;
    if (rc == 0) {
        size_t need = m->len > len ? m->len : len + 1;
        if (need <= n && len < n) {
            /* More is here, in other chains: the walker's, or look at all
             * of it. */
            if ((big = big_try(rx, side)) >= 0)
                return big == 1 ? 2 : 0;
            if ((*buf = pullup(rx, side, n)) == NULL)
                return -1;
            len = n;
            rc = resp_scan(&rx->sc[side], *buf, n, m);
            if (rc < 0)
                return scan_error(rx, side, rc);
            if (rc == 0 && side == SIDE_UPSTREAM && stream_part(rx, m, n))
                return 2;
            if (rc == 0)
                need = m->len > n ? m->len : n + 1;
        }
        if (rc == 0 && side == SIDE_UPSTREAM) {
            /* Scanned again when it may stream a piece, or when it outgrows max-held. */
            if (n > rpx_held_max(rx))
                return whole_too_long(rx, n);
            size_t cap = stream_may(rx, m) ? n + stream_min(rx) : rpx_held_max(rx) + 1;
            need = need < cap ? need : cap;
        }
        if (rc == 0) {
            rx->need[side] = need;
            return 0;
        }
    }
    rx->need[side] = 0; /* resp_scan left the scanner at the next message */
    w->p = *buf;        /* the first chain holds len bytes, pulled up or as it was */
    w->len = len;
    return 1;
}

/* The plain pipeline's other half: the reply due next, to a plain command
 * whose entry is at the head with nothing held in it, is measured
 * (resp_scan_reply_len) and joins the run, as rpx_on_reply() would after a full
 * scan.  Returns whether it took the next reply (and those after it). */
static bool plain_reply(struct rpx *rx)
{
    const struct pump_window *w = &rx->pump.win[SIDE_UPSTREAM];
    /* held counts the bytes waiting in entries: 0, and e->bytes is empty. */
    if (rx->need[SIDE_UPSTREAM] != 0 || rx->held != 0 || !win_open(rx, SIDE_UPSTREAM))
        return false;
    /* The rest of a pipeline's replies in one call. */
    bool took = false;
    while (w->p != NULL && w->len > rx->pump.run[SIDE_UPSTREAM]) {
        struct entry *e = rx->await;
        if (e == NULL || !rpx_straight_out(rx, e))
            break;
        uint8_t type;
        size_t run = rx->pump.run[SIDE_UPSTREAM];
        size_t len = resp_scan_reply_len(&rx->sc[SIDE_UPSTREAM], w->p + run, w->len - run, &type);
        if (len == 0 || resp_pairing_reply_simple(&rx->pairing, type) != 1)
            break;
        pump_pass(&rx->pump, SIDE_UPSTREAM, len);
        rpx_entry_answered(rx, e, true);
        took = true;
    }
    return took;
}

static void process_server(struct rpx *rx)
{
    while (rpx_alive(rx)) {
        if (rx->await != NULL && rx->await->kind == RK_STREAM) {
            relay_stream(rx, rx->await);
            break;
        }
        if (plain_reply(rx))
            continue;
        struct resp_msg m;
        const uint8_t *buf;
        int rc = scan_one(rx, SIDE_UPSTREAM, &m, &buf);
        if (rc == 2 ||
            (rc < 0 && rpx_alive(rx) && rx->await != NULL && rx->await->kind == RK_STREAM))
            continue; /* server_raw(): relayed from here */
        if (rc <= 0)
            break;
        if (rx->streaming)
            stream_end(rx, &m);
        else
            rpx_on_reply(rx, buf, &m);
    }
    /* The run goes on in rpx_flush_replies(), which always follows. */
}

static void process_client(struct rpx *rx)
{
    /* Rules change only between events (a reload's post to this loop). */
    bool cmd_rules = codec_wants(rx->s, RULE_EV_COMMAND);
    while (rpx_alive(rx)) {
        if (rx->phase == RPX_RAW) {
            (void)pump_forward(&rx->pump, SIDE_CLIENT, pump_rest(&rx->pump, SIDE_CLIENT));
            break;
        }
        if (rx->phase == RPX_BLACKHOLED) {
            (void)pump_drop(&rx->pump, SIDE_CLIENT, pump_rest(&rx->pump, SIDE_CLIENT));
            break;
        }
        if (rx->phase == RPX_HOLDING) {
            if (rx->hold_until > proxy_now_ms()) {
                rpx_arm_timer(rx, rx->hold_until);
                break;
            }
            (void)rpx_set_phase(rx, RPX_RELAYING, 0); /* the hold is over: the command goes on */
        }
        /* Grown before the pairing would count a transaction's commands
         * in a run (proto/resp/resp.h: RESP_PAIRING_ROOM), so that up to the
         * maximum each has a slot of its own. */
        if (rx->pairing.count + RESP_PAIRING_ROOM >= rx->pairing.cap)
            (void)pairing_grow(rx);
        if (rx->pairing.count >= rx->pairing.cap)
            break; /* resumed when replies drain the FIFO */
        if (plain_command(rx, cmd_rules))
            continue;
        struct resp_msg m;
        const uint8_t *buf;
        int rc = scan_one(rx, SIDE_CLIENT, &m, &buf);
        if (rc == 2)
            continue;
        if (rc < 0 && rx->phase == RPX_RAW)
            continue;
        if (rc <= 0)
            break;
        enum cmd_result r = command(rx, buf, &m);
        if (r != CMD_WAIT)
            rx->decision = (struct rpx_decision){0}; /* the command is done */
        if (r == CMD_WAIT) {
            /* Rescanned when the wait ends. */
            rx->need[SIDE_CLIENT] = 0;
            if (rx->phase == RPX_HOLDING)
                rpx_arm_timer(rx, rx->hold_until);
            else if (rx->phase == RPX_TX_WAIT)
                rpx_arm_timer(rx, rx->tx_wait_until);
            break;
        }
        if (r == CMD_STOP)
            break;
    }
    /* The run goes on at pump_flush(UPSTREAM), which always follows: from
     * pend itself when it is all of it. */
    if (rx->pump.run[SIDE_CLIENT] == 0)
        rx->pump.win[SIDE_CLIENT].p = NULL;
    /* Past the pipeline cap, or while holding, stop reading the client. */
    if (rpx_alive(rx)) {
        size_t waiting = pump_rest(&rx->pump, SIDE_CLIENT);
        bool hold = waiting > SESSION_INPUT_HIGH && rx->need[SIDE_CLIENT] <= waiting;
        pump_hold_reading(&rx->pump, SIDE_CLIENT, hold);
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct rpx *rx = arg;
    if (!rpx_alive(rx))
        return;
    rpx_flush_replies(rx);
    if (!rpx_alive(rx))
        return;
    process_client(rx);
    if (!rpx_alive(rx))
        return;
    pump_flush(&rx->pump, SIDE_UPSTREAM);
    rpx_flush_replies(rx);
}

static void process_read(struct rpx *rx, enum session_side from)
{
    if (from == SIDE_UPSTREAM) {
        process_server(rx);
        if (!rpx_alive(rx))
            return;
        rpx_flush_replies(rx);
        /* Replies drained the FIFO: the client may go on, and what twice
         * answers itself there goes out now, not at the next event. */
        if (rpx_alive(rx) && evbuffer_get_length(rx->pump.in[SIDE_CLIENT]) > 0) {
            process_client(rx);
            if (rpx_alive(rx))
                rpx_flush_replies(rx);
        }
    } else {
        process_client(rx);
        if (!rpx_alive(rx))
            return;
        rpx_flush_replies(rx); /* twice's own answers */
    }
    if (rpx_alive(rx))
        pump_flush(&rx->pump, SIDE_UPSTREAM);
}

static void rpx_process(void *state, enum session_side from, struct evbuffer *in)
{
    struct rpx *rx = state;
    if (!rpx_alive(rx))
        return;
    struct pump_read r;
    pump_read_begin(&rx->pump, from, in, &r);
    if (rpx_alive(rx))
        process_read(rx, from);
    pump_read_end(&rx->pump, from, &r);
}

/* ---- codec ops --------------------------------------------------------- */

static void rpx_free(void *state);

size_t rpx_held_max(const struct rpx *rx)
{
    uint64_t m = rx->s->cfg->l->max_held;
    return (size_t)(m != 0 ? m : CONF_DEFAULT_MAX_HELD);
}

static void *rpx_open(struct session *s)
{
    struct rpx *rx = calloc(1, sizeof(*rx));
    if (rx == NULL)
        return NULL;
    rx->s = s;
    rx->prof = rprof_of(s->cfg->l->profile);
    rx->fw = resp_framework_of(rx->prof);
    resp_scanner_init(&rx->sc[SIDE_CLIENT], RESP_SIDE_CLIENT);
    resp_scanner_init(&rx->sc[SIDE_UPSTREAM], RESP_SIDE_SERVER);
    uint64_t max_message = s->cfg->l->max_message;
    if (max_message != 0 && max_message < RESP_MAX_BULK) {
        rx->sc[SIDE_CLIENT].max_bulk = max_message;
        rx->sc[SIDE_UPSTREAM].max_bulk = max_message;
    }
    rx->slots = malloc(RPX_PIPELINE_MIN * sizeof(*rx->slots));
    rx->timer = evtimer_new(s->loop->base, on_timer, rx);
    if (rx->slots == NULL || rx->timer == NULL ||
        pump_init(&rx->pump, s->port, s->port_ctx, PUMP_KEEP_REST) != 0) {
        rpx_free(rx);
        return NULL;
    }
    resp_pairing_init(&rx->pairing, rx->slots, RPX_PIPELINE_MIN);
    if (rpx_host_init(rx) != 0) {
        rpx_free(rx);
        return NULL;
    }
    return rx;
}

static void rpx_stop(void *state)
{
    struct rpx *rx = state;
    (void)rpx_set_phase(rx, RPX_STOPPED, 0);
    if (rx->timer != NULL)
        event_del(rx->timer);
}

static void rpx_free(void *state)
{
    struct rpx *rx = state;
    while (rx->head != NULL) {
        struct entry *e = rx->head;
        rx->head = e->next;
        rpx_entry_free(e);
    }
    while (rx->spare != NULL) {
        struct entry *e = rx->spare;
        rx->spare = e->next;
        rpx_entry_free(e);
    }
    rpx_tx_reset(&rx->tx);
    pump_free(&rx->pump);
    for (int i = 0; i < 3; i++)
        if (rx->setup[i] != NULL)
            evbuffer_free(rx->setup[i]);
    if (rx->timer != NULL)
        event_free(rx->timer);
    resp_aux_detach(rx->aux);
    for (size_t i = 0; i < rx->n_pinned; i++)
        ruleset_put(rx->pinned[i]);
    free(rx->pinned);
    free(rx->slots);
    rpx_held_own_free(rx);
    rpx_host_free(rx);
    free(rx);
}

/* ---- drain (codec.h) --------------------------------------------------- */

/* A delayed reply, or the client's command a `delay` holds.  Commands twice scheduled on its
 * own connection (a delayed ack, a late copy) are its aux's, counted by the loop. */
static void rpx_pending(void *state, struct codec_pending *p)
{
    struct rpx *rx = state;
    uint64_t now = proxy_now_ms();
    if (rx->phase == RPX_HOLDING && rx->hold_until > now)
        p->held_messages++;
    for (const struct entry *e = rx->head; e != NULL; e = e->next)
        if (e->release_ms > now)
            p->held_messages++;
}

/* A drain releases the replies and the command a `delay` holds: the delay is their only
 * fault.  What twice scheduled on its own connection goes at its time: on a Redis listener a
 * delayed ack and a late copy are both commands twice sends later, and the framework's own
 * timeouts (a visibility timeout, a lock), which such a fault is usually aimed past, are the
 * app's, not twice's to know. */
static void rpx_drain(void *state, struct codec_pending *released)
{
    struct rpx *rx = state;
    if (!rpx_alive(rx))
        return;
    uint64_t now = proxy_now_ms();
    if (rx->phase == RPX_HOLDING) {
        if (rx->hold_until > now)
            released->held_messages++;
        (void)rpx_set_phase(rx, RPX_RELAYING, 0);
    }
    for (struct entry *e = rx->head; e != NULL; e = e->next) {
        if (e->release_ms > now)
            released->held_messages++;
        e->release_ms = 0;
    }
    event_del(rx->timer);
    on_timer(-1, 0, rx); /* what was held goes now, as if its time had come */
}

/* A command awaits its reply, or something is held; a blocking pop waiting for a job (the
 * worker is idle) is not a message under way. */
static bool rpx_busy(void *state)
{
    const struct rpx *rx = state;
    if (rx->phase == RPX_RAW || rx->phase == RPX_HOLDING || rx->tx.active || rx->pairing.in_multi ||
        rx->decision.decided || evbuffer_get_length(rx->pump.in[SIDE_CLIENT]) > 0 ||
        evbuffer_get_length(rx->pump.in[SIDE_UPSTREAM]) > 0)
        return true;
    if (rx->pairing.count == 0)
        return rx->head != NULL; /* an answer of twice's own not out yet */
    const struct resp_cmd *c = resp_pairing_head(&rx->pairing);
    const struct entry *e = rx->head;
    return rx->pairing.count > 1 || c == NULL || (c->flags & RESP_CMD_BLOCKING) == 0 || e == NULL ||
           e->next != NULL || e->release_ms != 0 || evbuffer_get_length(e->bytes) > 0;
}

const struct codec_ops resp_codec_ops = {
    .name = "resp",
    .open = rpx_open,
    .stop = rpx_stop,
    .free = rpx_free,
    .process = rpx_process,
    .closed_by = NULL,
    .pending = rpx_pending,
    .drain = rpx_drain,
    .busy = rpx_busy,
};
