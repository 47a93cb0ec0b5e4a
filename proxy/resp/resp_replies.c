/*
 * resp_replies.c - the replies a RESP session owes its client (resp_internal.h).
 *
 * Every command the server will answer gets an entry, in the client's order; so does every
 * reply twice makes itself (an injected error, the +QUEUED of a command it kept back, the
 * count of an ack it swallowed).  An entry goes out once every entry before it has: a reply
 * twice delays holds back the ones behind it, as a slow server would, and a cut (`close
 * after`) happens exactly at its entry's turn.  Replies from the server are matched to their
 * commands by the pairing (proto/resp/resp.h) and handed to the framework module (resp_host.c) or
 * the transaction (resp_tx.c) when their command asked for it.
 */
#include "proxy/resp/resp_internal.h"

/* ---- replies owed to the client ---------------------------------------- */

struct entry *rpx_entry_add(struct rpx *rx, bool server)
{
    struct entry *e = rx->spare;
    if (e != NULL) {
        rx->spare = e->next;
        rx->n_spare--;
        struct evbuffer *b = e->bytes;
        memset(e, 0, sizeof(*e));
        e->bytes = b;
    } else {
        e = calloc(1, sizeof(*e));
        if (e != NULL && (e->bytes = evbuffer_new()) == NULL) {
            free(e);
            e = NULL;
        }
        if (e == NULL) {
            /* A reply owed and not written down would pair every later reply with the wrong
             * command: the session cannot go on. */
            pump_fail(&rx->pump, "owing a reply");
            return NULL;
        }
    }
    e->server = server;
    e->done = !server;
    if (rx->tail != NULL)
        rx->tail->next = e;
    else
        rx->head = e;
    rx->tail = e;
    if (server && rx->await == NULL)
        rx->await = e;
    return e;
}

static void entry_clear_args(struct entry *e);

void rpx_entry_free(struct entry *e)
{
    evbuffer_free(e->bytes);
    entry_clear_args(e);
    free(e);
}

/* Back to the session's spares (its bytes buffer is empty and kept). */
static void entry_recycle(struct rpx *rx, struct entry *e)
{
    if (rx->n_spare >= RPX_SPARE_MAX || evbuffer_get_length(e->bytes) != 0) {
        rpx_entry_free(e);
        return;
    }
    entry_clear_args(e);
    e->next = rx->spare;
    rx->spare = e;
    rx->n_spare++;
}

/* The entry at the head of the reply queue is done and sent: off the queue. */
static void pop_head(struct rpx *rx)
{
    struct entry *e = rx->head;
    rx->head = e->next;
    if (rx->head == NULL)
        rx->tail = NULL;
    entry_recycle(rx, e);
}

static void entry_clear_args(struct entry *e)
{
    resp_framework_free_tag(e->fw, &e->tag);
    for (size_t i = 0; i < e->ntx; i++) {
        if (e->tx[i].synth != NULL)
            evbuffer_free(e->tx[i].synth);
        resp_framework_free_tag(e->tx[i].fw, &e->tx[i].tag);
    }
    free(e->tx);
    if (e->after != NULL)
        evbuffer_free(e->after);
    e->after = NULL;
    e->n_after = 0;
    e->fw = NULL;
    e->tx = NULL;
    e->ntx = 0;
}

/* A reply twice gives: `bytes` (len) at its place in the pipeline. */
void rpx_answer(struct rpx *rx, const void *bytes, size_t len)
{
    struct entry *e = rpx_entry_add(rx, false);
    if (e == NULL)
        return; /* the pump stopped (rpx_entry_add) */
    if (evbuffer_add(e->bytes, bytes, len) != 0) {
        pump_fail(&rx->pump, "answering a command");
        return;
    }
    rx->held += len;
}

/* Sends Redis a command of twice's own on the client's connection, in the
 * pipeline's order; its reply, if any, is not shown to the client. */
void rpx_send_own(struct rpx *rx, const char *cmd, size_t len)
{
    struct resp_msg m;
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    if (resp_scan(&sc, (const uint8_t *)cmd, len, &m) != 1)
        return;
    int rc = resp_pairing_command(&rx->pairing, &m, (const uint8_t *)cmd, 0, NULL);
    if (rc < 0)
        return;
    if (pump_inject(&rx->pump, SIDE_UPSTREAM, cmd, len) != 0)
        return;
    if (rc == 1) {
        struct entry *e = rpx_entry_add(rx, true);
        if (e != NULL)
            e->hide = true;
    }
}

/* Whether the client expects a reply to the command being handled (CLIENT
 * REPLY OFF and SKIP silence it; SKIP only once). */
bool rpx_owe_reply(struct rpx *rx)
{
    struct resp_pairing *p = &rx->pairing;
    if (p->in_multi)
        return true;
    if (p->skip_next) {
        /* Redis silences the next command it receives: give it a PING. */
        static const char ping[] = "*1\r\n$4\r\nPING\r\n";
        rpx_send_own(rx, ping, sizeof(ping) - 1);
        return false;
    }
    return !p->reply_off;
}

/* Ends the session at this point of the client's pipeline: what it sent
 * before still reaches Redis and is answered, nothing after it is read.
 * With `after`, the command just forwarded (entry e) is answered first. */
void rpx_cut_at_turn(struct rpx *rx, const struct rule *r, struct entry *e)
{
    (void)rpx_set_phase(rx, RPX_BLACKHOLED, 0);
    if (e == NULL)
        e = rpx_entry_add(rx, false);
    if (e == NULL) {
        rpx_cut(rx, r);
        return;
    }
    e->close_after = r;
}

enum cmd_result rpx_cut_command(struct rpx *rx, const struct rule *r, bool before, struct entry *e,
                                size_t len)
{
    if (before) {
        rpx_swallow(rx, len);
        e = NULL;
    }
    rpx_cut_at_turn(rx, r, e);
    return CMD_STOP;
}

void rpx_arm_timer(struct rpx *rx, uint64_t at)
{
    uint64_t now = proxy_now_ms();
    uint64_t ms = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(rx->timer, &tv);
}

/* Sends the replies at the head of the queue that are complete and due. */
void rpx_flush_replies(struct rpx *rx)
{
    uint64_t now = 0;
    if (rx->head != NULL)
        (void)pump_settle(&rx->pump, SIDE_UPSTREAM); /* before what the entries add to out */
    while (rx->head != NULL && rpx_alive(rx)) {
        struct entry *e = rx->head;
        if (e->release_ms != 0) {
            if (now == 0)
                now = proxy_now_ms();
            if (e->release_ms > now) {
                rpx_arm_timer(rx, e->release_ms);
                break;
            }
        }
        size_t n = evbuffer_get_length(e->bytes);
        if (n > 0) {
            rx->held -= n < rx->held ? n : rx->held;
            if (e->hide) {
                evbuffer_drain(e->bytes, n);
            } else if (n < RPX_COALESCE) {
                /* Small replies are copied together: a chain each would
                 * cost a kilobyte per reply to a client that reads slowly. */
                const void *b = evbuffer_pullup(e->bytes, (ev_ssize_t)n);
                if (b == NULL || pump_inject(&rx->pump, SIDE_CLIENT, b, n) != 0) {
                    pump_fail(&rx->pump, "sending a reply");
                    return;
                }
                evbuffer_drain(e->bytes, n);
            } else if (pump_inject_buffer(&rx->pump, SIDE_CLIENT, e->bytes) != 0) {
                return;
            }
        }
        if (!e->done)
            break;
        const struct rule *close_after = e->close_after;
        bool close_protocol = e->close_protocol;
        pop_head(rx);
        if (close_after != NULL) {
            rpx_cut(rx, close_after);
            return;
        }
        if (close_protocol) {
            pump_flush(&rx->pump, SIDE_CLIENT);
            pump_abort(&rx->pump, SESSION_CLOSE_PROTOCOL_ERROR, SIDE_CLIENT);
            return;
        }
    }
    pump_flush(&rx->pump, SIDE_CLIENT);
    /* Past the cap, stop reading the server until delayed replies go out. */
    if (rpx_alive(rx))
        pump_hold_reading(&rx->pump, SIDE_UPSTREAM, rx->held > rpx_held_max(rx));
}

/* The next server entry after e. */
static struct entry *next_server(struct entry *e)
{
    for (e = e->next; e != NULL; e = e->next)
        if (e->server && !e->done)
            return e;
    return NULL;
}

/* ---- error replies ----------------------------------------------------- */

/* Redis's own text for the error codes a user is likely to inject. */
static const char *error_text(const char *code)
{
    static const struct {
        const char *code, *text;
    } known[] = {
        {"READONLY", "You can't write against a read only replica."},
        {"LOADING", "Redis is loading the dataset in memory"},
        {"OOM", "command not allowed when used memory > 'maxmemory'."},
        {"BUSY", "Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN "
                 "NOSCRIPT."},
        {"MASTERDOWN", "Link with MASTER is down and replica-serve-stale-data is set to 'no'."},
        {"NOSCRIPT", "No matching script. Please use EVAL."},
        {"CLUSTERDOWN", "The cluster is down"},
        {"TRYAGAIN", "Multiple keys request during rehashing of slot"},
        {"MISCONF", "Redis is configured to save RDB snapshots, but it's currently unable to "
                    "persist to disk. Commands that may modify the data set are disabled, because "
                    "this instance is configured to report errors during writes if RDB "
                    "snapshotting fails (stop-writes-on-bgsave-error option). Please check the "
                    "Redis logs for details about the RDB error."},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcasecmp(code, known[i].code) == 0)
            return known[i].text;
    return NULL;
}

void rpx_error_reply(const struct rule *r, struct resp_bytes *b)
{
    const char *code = r->action.error_code != NULL ? r->action.error_code : "ERR";
    while (*code == '-')
        code++;
    char text[600];
    const char *known = error_text(code);
    if (known != NULL)
        snprintf(text, sizeof(text), "%s %s", code, known);
    else
        snprintf(text, sizeof(text), "%s error injected by twice rule '%s'", code, r->name);
    uint8_t buf[640];
    int n = resp_encode_error(buf, sizeof(buf), text);
    if (n > 0)
        resp_bytes_add(b, buf, (size_t)n);
}

/* A new entry for bytes that arrive while `at` (hidden: twice's own command)
 * waits for its reply: just before it, or after it once it has its reply, so
 * that the client gets them where they came and loses only what twice hides. */
static struct entry *entry_beside(struct rpx *rx, struct entry *at)
{
    struct entry *tail = rx->tail;
    struct entry *n = rpx_entry_add(rx, false);
    if (n == NULL || (at == tail && at->done))
        return n;
    tail->next = NULL; /* off the end, and in front of `at` */
    rx->tail = tail;
    struct entry *prev = NULL;
    for (struct entry *q = rx->head; q != at; q = q->next)
        prev = q;
    n->next = at;
    if (prev != NULL)
        prev->next = n;
    else
        rx->head = n;
    return n;
}

/* Whether the reply awaited at e may go straight to the client (when nothing
 * waits in e yet, which the caller checks): e is a plain entry at the head of
 * the queue, not held back, not hidden. */
bool rpx_straight_out(const struct rpx *rx, const struct entry *e)
{
    return e == rx->head && e->kind == RPROF_REPLY_PLAIN && e->release_ms == 0 && !e->hide;
}

/* Entry e got the last reply of one of its commands; `sent`: that reply went
 * straight out (run) rather than into e. */
void rpx_entry_answered(struct rpx *rx, struct entry *e, bool sent)
{
    if (e->more > 0) {
        e->more--; /* the next reply is this entry's too */
        return;
    }
    rx->await = next_server(e);
    if (sent && e->close_after == NULL) {
        /* Answered and sent: off the queue at once, so that the next reply
         * of the same read (a pipeline) is at the head and goes straight out
         * too, instead of waiting in its entry for flush_replies. */
        pop_head(rx);
    } else {
        e->done = true; /* flush_replies sends it, and cuts after it if asked */
    }
}

/* One whole reply is at the start of in[UPSTREAM] (buf, m->len bytes). */
/* A reply that answers no command (a push, a pub/sub message, MONITOR, or one nobody asked
 * for): on to the client, behind what is due before it. */
static void out_of_band(struct rpx *rx, const struct resp_msg *m)
{
    if (rx->head == NULL) {
        pump_pass(&rx->pump, SIDE_UPSTREAM, m->len);
        return;
    }
    struct entry *last = rx->await != NULL ? rx->await : rx->tail;
    if (last->hide && (last = entry_beside(rx, last)) == NULL) {
        pump_fail(&rx->pump, "keeping a reply");
        return;
    }
    if (pump_hold(&rx->pump, SIDE_UPSTREAM, m->len, last->bytes) == 0)
        rx->held += m->len;
}

/* What its command's reply kind asks of reply m (a copy of it in `reply`, which the reader
 * may rewrite): the job events read from it, the transaction's results spliced in. */
static void read_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m, struct evbuffer *reply)
{
    switch (e->kind) {
    case RK_EXEC:
        rpx_on_exec_reply(rx, e, buf, m, reply);
        break;
    case RK_FRAMEWORK:
        rpx_framework_reply(rx, e, buf, m, reply);
        break;
    case RK_ADD_INT: {
        int64_t n;
        if (m->type == ':' && resp_view_int(buf, m->len, &m->value, &n) == 0) {
            evbuffer_drain(reply, evbuffer_get_length(reply));
            evbuffer_add_printf(reply, ":%lld\r\n", (long long)(n + e->add));
        }
        break;
    }
    default:
        break;
    }
}

void rpx_on_reply(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m)
{
    struct resp_match match;
    int rc = resp_pairing_reply(&rx->pairing, m, buf, &match);
    if (rc != 1 || rx->await == NULL) {
        out_of_band(rx, m);
        return;
    }
    struct entry *e = rx->await;
    if (rpx_straight_out(rx, e) && evbuffer_get_length(e->bytes) == 0) {
        /* The common case: the reply due next, straight to the client (a
         * small one copied into the output's last chain).  Not when a push
         * or pub/sub message that came first still waits in the entry. */
        pump_pass(&rx->pump, SIDE_UPSTREAM, m->len);
        if (match.last)
            rpx_entry_answered(rx, e, true);
        return;
    } else if (e->kind == RPROF_REPLY_PLAIN) {
        if (pump_hold(&rx->pump, SIDE_UPSTREAM, m->len, e->bytes) != 0)
            return;
        rx->held += m->len;
    } else if (e->kind == RK_FRAMEWORK && rpx_framework_counted(rx, e, buf, m)) {
        if (match.last)
            rpx_entry_answered(rx, e, true);
        return;
    } else {
        struct evbuffer *reply = evbuffer_new();
        if (reply == NULL || evbuffer_add(reply, buf, m->len) != 0) {
            if (reply != NULL)
                evbuffer_free(reply);
            pump_fail(&rx->pump, "rewriting a reply");
            return;
        }
        read_reply(rx, e, buf, m, reply); /* buf is read before the reply leaves in */
        size_t n = evbuffer_get_length(reply);
        if (pump_drop(&rx->pump, SIDE_UPSTREAM, m->len) == 0 &&
            evbuffer_add_buffer(e->bytes, reply) != 0)
            pump_fail(&rx->pump, "rewriting a reply");
        evbuffer_free(reply);
        if (pump_failed(&rx->pump))
            return;
        rx->held += n;
    }
    if (match.last)
        rpx_entry_answered(rx, e, false);
}
