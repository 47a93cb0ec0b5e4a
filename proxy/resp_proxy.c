/*
 * resp_proxy.c - the RESP layer of a session: commands and replies in, faults out.
 *
 * Bytes from the client are cut into commands, bytes from the server into
 * replies (proto/resp.h, RESP2 and RESP3).  Every command that the server
 * will answer goes into a pairing FIFO (proto/resp.h's struct resp_pairing:
 * MULTI/EXEC, pub/sub, CLIENT REPLY, HELLO, MONITOR), and into this file's
 * queue of replies owed to the client, in the client's order.  An entry of
 * that queue is answered by the server (the reply is moved in, chains and
 * all, without a copy) or by twice (an error it injects, a +QUEUED for a
 * command it kept back); it goes out when every entry before it has.  So a
 * reply twice fakes lands exactly where the client expects it, and a reply
 * twice delays holds back the ones behind it, as a slow server would.
 *
 * Events: `command` for every command; with a profile (sidekiq, celery, rq,
 * streams: docs/redis.md, Profiles), `publish` for the commands that
 * enqueue a job, `deliver` for the replies that hand one to a worker (read
 * from the reply, where the job is), `ack` for the commands that settle one.
 * Which commands and replies those are, and the job's fields in them, is
 * proto/resp_profile.h's to say; this file decides what to do about them.
 * An ack is usually a MULTI ... EXEC transaction: twice reads the whole
 * transaction ahead before it forwards MULTI (waiting up to RPX_TX_WAIT_MS
 * for the rest of it), decides once, and then keeps back the commands a
 * fault suppresses, answering +QUEUED for them and splicing their results
 * into the server's EXEC array.
 *
 * Acks arrive on another connection than their delivery (kombu's sync pool,
 * RQ's forked work horse), so what a delivery says about a message (task,
 * queue) is kept per listener in proxy/idmap.h until its ack.  Commands a
 * fault adds go out on twice's own connection (proxy/resp_aux.h).
 *
 * Bad input: a malformed command or reply closes the session with a logged
 * reason; every other session carries on.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "proto/resp.h"
#include "proto/resp_job.h"
#include "proto/resp_profile.h"
#include "proxy/codec.h"
#include "proxy/fault.h"
#include "proxy/idmap.h"
#include "proxy/journal.h"
#include "proxy/log.h"
#include "proxy/resp_aux.h"
#include "proxy/session.h"
#include "rules/engine.h"

/* Commands awaiting replies: the pairing FIFO starts this small and grows to
 * RPX_PIPELINE_MAX; past it, twice stops reading the client until replies
 * come back (a transaction's queued commands, which only its EXEC answers in
 * full, are then counted in one slot by the pairing, never waited for). */
#define RPX_PIPELINE_MIN 16u
#define RPX_PIPELINE_MAX 4096u
/* Reply bytes one session may hold back (delay) before twice stops reading
 * the server: the listener's `max-held`, else CONF_DEFAULT_MAX_HELD. */
struct rpx;
static size_t held_max(const struct rpx *rx);
/* How long twice waits for the rest of a transaction it must read whole. */
#define RPX_TX_WAIT_MS 100u
/* A transaction longer than RPROF_TX_PEEK_MAX bytes or RPROF_TX_MAX commands is forwarded
 * without faults on its commands. */
/* Stream entry ids (RPROF_ID_MAX) and task names (RPROF_TASK_MAX) longer than their limits
 * are logged once per session (`msg="resp field too long"`): such an entry is relayed with no
 * event, and such a task name is not used (a cut name would be another task's). */

/* What twice must look at in a forwarded command's reply: enum rprof_reply, or one of these,
 * which are twice's own. */
enum reply_kind {
    RK_EXEC = RPROF_REPLY_END, /* a transaction with commands twice answered */
    RK_ADD_INT,                /* an XACK with ids kept back: add them to the count */
    RK_STREAM,                 /* SYNC / PSYNC: the server's bytes from here on, as they come */
};

/* One queued command of a transaction, as twice answers it in EXEC. */
struct txcmd {
    bool suppress;          /* kept back: twice answers it */
    struct evbuffer *synth; /* suppress: its element in EXEC's array */
    int64_t add;            /* forwarded XACK with ids kept back */
};

/* A reply owed to the client. */
struct entry {
    struct entry *next;
    struct evbuffer *bytes; /* what goes out (twice's, or the server's once read) */
    uint64_t release_ms;    /* not before (delay) */
    bool server;            /* the server answers it */
    bool done;              /* bytes is complete */
    bool redelivered;       /* RPROF_REPLY_XREAD re-reading the pending list */
    bool hide;              /* the server's reply is for twice only (a DISCARD it sent) */
    uint8_t kind;           /* enum rprof_reply or enum reply_kind */
    uint32_t more;          /* RPROF_REPLY_PLAIN: replies owed after the next one (forward_plain) */
    int64_t add;            /* RK_ADD_INT */
    const struct rule *close_after;
    bool close_protocol; /* the session ends once this went out (protocol_error) */
    char
        *arg; /* RPROF_REPLY_POP: the list; RPROF_REPLY_RQ_HASH: job id; RPROF_REPLY_XADD: stream */
    char *arg2;       /* RPROF_REPLY_XADD: task */
    struct txcmd *tx; /* RK_EXEC */
    size_t ntx;
};

struct tx {
    bool active;  /* MULTI went through; EXEC/DISCARD not yet */
    bool planned; /* twice read it whole and decided */
    size_t idx;   /* queued commands processed */
    struct txcmd *cmds;
    size_t n;
    bool any;               /* some command is answered by twice */
    bool aborted;           /* twice refused a queued command: EXEC becomes EXECABORT */
    struct evbuffer *later; /* kept-back acks to apply later (delay) */
    size_t later_n;
    uint32_t later_ms;
    struct evbuffer *now; /* commands for twice's connection once EXEC went (re-push) */
    size_t now_n;
    struct evbuffer *copies; /* re-pushes of late copies (`redeliver after D`), due copies_ms on */
    size_t copies_n;
    uint32_t copies_ms;
    const struct rule *close_after;
};

/* The first chain of a pending buffer, as scan_one() last saw it: valid
 * until bytes leave that buffer's head (run_move() forgets it). */
struct rpx_window {
    const uint8_t *p; /* NULL: not known */
    size_t len;
};

struct rpx {
    struct session *s;
    enum rprof prof;
    bool stopped;
    struct resp_scanner sc[2];
    size_t need[2];           /* bytes pend[side] must hold before scanning again */
    struct evbuffer *pend[2]; /* read from side, not processed yet */
    size_t run[2];            /* head of pend[side] passed on already, not yet moved */
    struct rpx_window win[2]; /* pend[side]'s first chain while its head is unchanged */
    bool said_too_long;       /* "resp field too long" was logged for this session */
    struct evbuffer *out[2];  /* batched toward side */
    struct resp_pairing pairing;
    struct resp_cmd *slots;
    struct entry *head, *tail; /* replies owed to the client */
    struct entry *await;       /* oldest server entry still waiting for its reply */
    size_t held;               /* bytes in entries not sent */
    struct event *timer;       /* client hold end, delayed reply release, tx wait */
    uint64_t hold_until;       /* the client's commands wait until then (delay) */
    uint8_t decided;           /* decisions already made for the next client command */
    bool blackholed;           /* the client's further commands are discarded (drop, cut) */
    bool raw;                  /* the client's bytes go to Redis as they are: it broke RESP,
                                  or it began a replication stream (replication_start) */
    bool tx_waited;            /* the tx wait ran out: plan without the rest */
    uint64_t tx_wait_until;
    struct tx tx;
    struct evbuffer *setup[3]; /* the client's last AUTH, HELLO, SELECT */
    struct resp_aux *aux;
    uint64_t anon;
    /* The id a dropped XADD is answered with (publish_decide). */
    char xadd_answer[96];
    struct entry *spare; /* freed entries kept for reuse */
    size_t n_spare;
    /* The name of the last command plain_command() took, as the client sent
     * it (raw) and upper-cased (name): a pipeline mostly repeats one command,
     * which is then known plain without being upper-cased and looked up
     * again (which commands are plain never changes).  len 0: none yet. */
    struct {
        uint8_t raw[RESP_CMD_NAME_MAX];
        char name[RESP_CMD_NAME_MAX];
        size_t len;
    } last_plain;
    /* Every ruleset a faulting rule came from: entries and transactions keep
     * `const struct rule *` (close_after) until a reply's turn, and a reload
     * (or two) may meanwhile drop the loop's reference to that ruleset. */
    struct ruleset **pinned;
    size_t n_pinned;
};

/* Replies shorter than this are copied into the client's output rather than
 * handed over as buffer chains. */
#define RPX_COALESCE 4096u

/* Entries kept for reuse per session (an entry per command otherwise costs
 * two allocations). */
#define RPX_SPARE_MAX 64u

enum { SETUP_AUTH, SETUP_HELLO, SETUP_SELECT };
enum { DECIDED_COMMAND = 1, DECIDED_ALL = 2 };

static void rpx_process(void *state, enum session_side from, struct evbuffer *in);
static void flush_replies(struct rpx *rx);

/* ---- small helpers ----------------------------------------------------- */

static uint64_t now_ms(void)
{
    return proxy_now_ms();
}

static bool alive(const struct rpx *rx)
{
    return !rx->stopped && rx->s->state == SESSION_RELAYING;
}

static const char *scope(const struct rpx *rx)
{
    return rx->s->cfg->l->name;
}

/*
 * Runs.  A message that goes on unchanged (the common case: a command to
 * Redis, its reply straight back) is not moved from pend[side] to the other
 * side's out on its own: run[side] grows over it, and the run moves with one
 * evbuffer call when something else needs that buffer (a reply twice holds
 * or rewrites, a command it drops, its own bytes, a send).  A pipeline of 16
 * commands costs one move instead of 16, and its messages are scanned in
 * place in the chain the first one was found in (win[side]), without asking
 * the buffer again.  The rule: code that takes bytes from the head of
 * pend[side], rearranges it (a pullup), or adds to the other side's out,
 * calls run_move(side) first, which also forgets the window.
 */
static void run_move(struct rpx *rx, enum session_side side)
{
    rx->win[side].p = NULL;
    if (rx->run[side] == 0)
        return;
    enum session_side to = side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
    size_t n = rx->run[side];
    rx->run[side] = 0;
    (void)codec_move(rx->pend[side], rx->out[to], n); /* as evbuffer_remove_buffer */
}

/* The window over the first chain of pend[side] when none is open and no
 * message is begun (nothing in the run, nothing needed): what scan_one()
 * leaves after a message, so that the plain pipeline takes a read's first
 * message too, not only those after it.  False when pend is empty. */
static bool win_open(struct rpx *rx, enum session_side side)
{
    struct rpx_window *w = &rx->win[side];
    if (w->p != NULL)
        return true;
    if (rx->run[side] != 0 || rx->need[side] != 0)
        return false;
    size_t contig = evbuffer_get_contiguous_space(rx->pend[side]);
    if (contig == 0)
        return false;
    w->p = evbuffer_pullup(rx->pend[side], (ev_ssize_t)contig); /* no copy: one chain */
    w->len = w->p != NULL ? contig : 0;
    return w->p != NULL;
}

static void send_flush(struct rpx *rx, enum session_side to)
{
    enum session_side from = to == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
    size_t run = rx->run[from];
    if (run > 0 && alive(rx) && evbuffer_get_length(rx->out[to]) == 0 &&
        evbuffer_get_length(rx->pend[from]) == run) {
        /* The usual end of a read: all of it goes on as it came, and nothing
         * waits before it.  Handed on from pend, not moved through out. */
        rx->win[from].p = NULL;
        rx->run[from] = 0;
        session_send(rx->s, to, rx->pend[from]);
        return;
    }
    run_move(rx, from);
    if (evbuffer_get_length(rx->out[to]) > 0 && alive(rx))
        session_send(rx->s, to, rx->out[to]);
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
        flush_replies(rx);
    if (!alive(rx))
        return;
    send_flush(rx, to);
    session_abort(rx->s, SESSION_CLOSE_PROTOCOL_ERROR, to);
}

/* `close before` / `close after`: what already went through reaches its
 * side; the session then ends. */
static void cut(struct rpx *rx, const struct rule *r)
{
    session_set_error(rx->s, "cut by rule '%s' (close %s)", r->name,
                      r->action.close_when == RULE_CLOSE_BEFORE ? "before" : "after");
    send_flush(rx, SIDE_UPSTREAM);
    send_flush(rx, SIDE_CLIENT);
    session_abort(rx->s, SESSION_CLOSE_FAULT, SIDE_CLIENT);
}

/* Like resp_args_next, with the element's byte range [*start, *end). */
static int walk_next(struct resp_args *it, struct resp_view *v, size_t *start, size_t *end)
{
    *start = it->pos;
    int rc = resp_args_next(it, v);
    *end = it->pos;
    return rc;
}

static bool is_cmd(const struct rprof_cmdview *cv, enum rprof_cmd id)
{
    return cv->id == id;
}

/* ---- engine and journal ------------------------------------------------ */

struct job_event {
    enum rule_event kind;
    char *id;
    char *task;
    char *queue;
    const char *key;
    bool redelivered;
    bool oom; /* a field could not be copied: the event is skipped (job_event_oom()) */
};

/* A copy of s for a field of j; NULL for NULL, and on allocation failure, which j->oom
 * remembers: a job event that lost a field would match other rules than the job's. */
static char *jdup(struct job_event *j, const char *s)
{
    char *d = s != NULL ? strdup(s) : NULL;
    if (s != NULL && d == NULL)
        j->oom = true;
    return d;
}

/* Whether j lost a field; if so it is logged, and neither journaled nor decided. */
static bool job_event_oom(struct rpx *rx, const struct job_event *j)
{
    if (j->oom)
        log_msg(LOG_WARN, "event skipped", "sid=%llu listener=%s event=%s reason=\"out of memory\"",
                (unsigned long long)rx->s->id, scope(rx), rule_event_name(j->kind));
    return j->oom;
}

static void job_event_clear(struct job_event *j)
{
    free(j->id);
    free(j->task);
    free(j->queue);
    memset(j, 0, sizeof(*j));
}

/* One action per event (a reply cannot be both dropped and duplicated): the
 * first rule that fires, in file order. */
static size_t decide(struct rpx *rx, struct engine_event *ev, size_t *hits)
{
    return codec_decide_first(rx->s, ev, hits);
}

static const struct rule *hit_rule(struct rpx *rx, size_t idx)
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

static void journal_job(struct rpx *rx, enum journal_kind kind, const struct job_event *j)
{
    struct journal *jr = rx->s->px->journal;
    if (jr == NULL || j->oom)
        return;
    struct journal_record r = {
        .kind = kind,
        .session = rx->s->id,
        .listener = rx->s->cfg->l->name,
        .client = rx->s->client_addr,
        .queue = j->queue,
        .task = j->task,
        .message_id = j->id,
        .redelivered = j->redelivered,
    };
    journal_record(jr, &r);
}

/* Whether anything needs what a profile reads from a job's JSON: the journal
 * (every publish, delivery and ack is recorded with the job's identity) or a
 * rule on those events.  Without either, jobs are still counted as events
 * (/stats) but not decoded: jansson was a third of a profiled listener's CPU. */
static bool jobs_needed(struct rpx *rx)
{
    return rx->s->px->journal != NULL || codec_wants(rx->s, RULE_EV_PUBLISH) ||
           codec_wants(rx->s, RULE_EV_DELIVER) || codec_wants(rx->s, RULE_EV_ACK) ||
           codec_wants(rx->s, RULE_EV_NACK);
}

/* The rules' view of a job event; anon (48 bytes) holds the identity of a
 * job without an id. */
static void job_engine_event(struct rpx *rx, const struct job_event *j, struct engine_event *ev,
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
static const struct rule *decide_job(struct rpx *rx, struct job_event *j)
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
    job_engine_event(rx, j, &ev, anon);
    size_t hits[SESSION_MAX_RULE_HITS];
    size_t n = decide(rx, &ev, hits);
    for (size_t i = 0; i < n; i++) {
        const struct rule *r = hit_rule(rx, hits[i]);
        if (!rule_action_is_stream(r->action.kind))
            return r;
    }
    return NULL;
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
                    (unsigned long long)rx->s->id, scope(rx));
    }
    return rx->aux;
}

/* Encodes a command of 2 or 3 arguments into b. */
static int encode_cmd(struct evbuffer *b, size_t argc, const char *const *argv, const size_t *lens)
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
static void aux_send_at(struct rpx *rx, struct evbuffer *cmds, size_t n, uint32_t ms)
{
    struct resp_aux *a = aux_get(rx);
    if (a == NULL)
        return; /* logged by aux_get */
    if (ms == 0)
        resp_aux_send(a, cmds, n);
    else if (resp_aux_send_later(a, ms, cmds, n) != 0)
        log_msg(LOG_WARN, "cannot schedule twice's own redis commands",
                "sid=%llu listener=%s commands=%zu delay_ms=%u", (unsigned long long)rx->s->id,
                scope(rx), n, ms);
}

/* Pushes a job back onto `list` (RPUSH: the next BRPOP takes it; LPUSH: the
 * next BLPOP) on twice's own connection, now or (later_ms) that much later. */
static void repush(struct rpx *rx, const char *cmd, const char *list, const void *val, size_t len,
                   uint32_t later_ms)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return;
    const char *argv[3] = {cmd, list, val};
    size_t lens[3] = {strlen(cmd), strlen(list), len};
    if (encode_cmd(b, 3, argv, lens) == 0)
        aux_send_at(rx, b, 1, later_ms);
    evbuffer_free(b);
}

/* ---- replies owed to the client ---------------------------------------- */

static struct entry *entry_add(struct rpx *rx, bool server)
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
        if (e == NULL)
            return NULL;
        e->bytes = evbuffer_new();
        if (e->bytes == NULL) {
            free(e);
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

static void entry_free(struct entry *e)
{
    evbuffer_free(e->bytes);
    entry_clear_args(e);
    free(e);
}

/* Back to the session's spares (its bytes buffer is empty and kept). */
static void entry_recycle(struct rpx *rx, struct entry *e)
{
    if (rx->n_spare >= RPX_SPARE_MAX || evbuffer_get_length(e->bytes) != 0) {
        entry_free(e);
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
    free(e->arg);
    free(e->arg2);
    for (size_t i = 0; i < e->ntx; i++)
        if (e->tx[i].synth != NULL)
            evbuffer_free(e->tx[i].synth);
    free(e->tx);
    e->arg = e->arg2 = NULL;
    e->tx = NULL;
    e->ntx = 0;
}

/* A reply twice gives: `bytes` (len) at its place in the pipeline. */
static void answer(struct rpx *rx, const void *bytes, size_t len)
{
    struct entry *e = entry_add(rx, false);
    if (e == NULL) {
        session_set_error(rx->s, "out of memory");
        session_abort(rx->s, SESSION_CLOSE_INTERNAL_ERROR, -1);
        return;
    }
    evbuffer_add(e->bytes, bytes, len);
    rx->held += len;
}

/* Sends Redis a command of twice's own on the client's connection, in the
 * pipeline's order; its reply, if any, is not shown to the client. */
static void send_own(struct rpx *rx, const char *cmd, size_t len)
{
    struct resp_msg m;
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    if (resp_scan(&sc, (const uint8_t *)cmd, len, &m) != 1)
        return;
    int rc = resp_pairing_command(&rx->pairing, &m, (const uint8_t *)cmd, 0, NULL);
    if (rc < 0)
        return;
    run_move(rx, SIDE_CLIENT);
    evbuffer_add(rx->out[SIDE_UPSTREAM], cmd, len);
    if (rc == 1) {
        struct entry *e = entry_add(rx, true);
        if (e != NULL)
            e->hide = true;
    }
}

/* Whether the client expects a reply to the command being handled (CLIENT
 * REPLY OFF and SKIP silence it; SKIP only once). */
static bool owe_reply(struct rpx *rx)
{
    struct resp_pairing *p = &rx->pairing;
    if (p->in_multi)
        return true;
    if (p->skip_next) {
        /* Redis silences the next command it receives: give it a PING. */
        static const char ping[] = "*1\r\n$4\r\nPING\r\n";
        send_own(rx, ping, sizeof(ping) - 1);
        return false;
    }
    return !p->reply_off;
}

/* Ends the session at this point of the client's pipeline: what it sent
 * before still reaches Redis and is answered, nothing after it is read.
 * With `after`, the command just forwarded (entry e) is answered first. */
static void cut_at_turn(struct rpx *rx, const struct rule *r, struct entry *e)
{
    rx->blackholed = true;
    if (e == NULL)
        e = entry_add(rx, false);
    if (e == NULL) {
        cut(rx, r);
        return;
    }
    e->close_after = r;
}

static void arm_timer(struct rpx *rx, uint64_t at)
{
    uint64_t now = now_ms();
    uint64_t ms = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(rx->timer, &tv);
}

/* Sends the replies at the head of the queue that are complete and due. */
static void flush_replies(struct rpx *rx)
{
    uint64_t now = 0;
    if (rx->head != NULL)
        run_move(rx, SIDE_UPSTREAM); /* before what the entries add to out */
    while (rx->head != NULL && alive(rx)) {
        struct entry *e = rx->head;
        if (e->release_ms != 0) {
            if (now == 0)
                now = now_ms();
            if (e->release_ms > now) {
                arm_timer(rx, e->release_ms);
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
                evbuffer_add(rx->out[SIDE_CLIENT], evbuffer_pullup(e->bytes, (ev_ssize_t)n), n);
                evbuffer_drain(e->bytes, n);
            } else {
                evbuffer_add_buffer(rx->out[SIDE_CLIENT], e->bytes);
            }
        }
        if (!e->done)
            break;
        const struct rule *close_after = e->close_after;
        bool close_protocol = e->close_protocol;
        pop_head(rx);
        if (close_after != NULL) {
            cut(rx, close_after);
            return;
        }
        if (close_protocol) {
            send_flush(rx, SIDE_CLIENT);
            session_abort(rx->s, SESSION_CLOSE_PROTOCOL_ERROR, SIDE_CLIENT);
            return;
        }
    }
    send_flush(rx, SIDE_CLIENT);
    /* Past the cap, stop reading the server until delayed replies go out. */
    if (alive(rx))
        session_hold_reading(rx->s, SIDE_UPSTREAM, rx->held > held_max(rx));
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

static void answer_error(struct rpx *rx, const struct rule *r)
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
        answer(rx, buf, (size_t)n);
}

/* ---- deliveries ------------------------------------------------------- */

/* A job from a popped value: decoded from its payload (Sidekiq, Celery), or its id with the task
 * its RQ job hash gave (on_rq_hash()). */
static bool job_from_value(struct rpx *rx, const char *list, const uint8_t *v, size_t n,
                           struct job_event *j)
{
    struct resp_job job;
    memset(&job, 0, sizeof(job));
    if (rx->prof == RPROF_RQ) {
        if (n == 0 || n >= RPROF_KEY_MAX || (job.id = malloc(n + 1)) == NULL)
            return false;
        memcpy(job.id, v, n);
        job.id[n] = '\0';
        idmap_lock();
        struct idmap_info *in = idmap_get(scope(rx), (const char *)v, n);
        if (in != NULL && in->task != NULL)
            job.task = jdup(j, in->task);
        idmap_unlock();
    } else if (rx->prof != RPROF_SIDEKIQ && rx->prof != RPROF_CELERY) {
        return false;
    } else if (jobs_needed(rx) && rprof_job(rx->prof, v, n, &job) != 0) {
        return false;
    }
    j->id = job.id;
    j->task = job.task;
    j->queue = rprof_queue_of(rx->prof, list);
    j->oom |= j->queue == NULL;
    free(job.queue);
    j->redelivered = job.redelivered;
    /* Celery acks by delivery tag: remember what the tag stands for. */
    if (rx->prof == RPROF_CELERY && job.tag != NULL) {
        idmap_lock();
        struct idmap_info *in = idmap_put(scope(rx), job.tag, strlen(job.tag));
        if (in != NULL) {
            idmap_set_str(&in->id, j->id, j->id != NULL ? strlen(j->id) : 0);
            idmap_set_str(&in->task, j->task, j->task != NULL ? strlen(j->task) : 0);
            idmap_set_str(&in->queue, j->queue, j->queue != NULL ? strlen(j->queue) : 0);
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
static bool pop_reply_counted(struct rpx *rx, struct entry *e, const uint8_t *buf,
                              const struct resp_msg *m)
{
    if ((rx->prof != RPROF_SIDEKIQ && rx->prof != RPROF_CELERY) || jobs_needed(rx) ||
        e != rx->head || e->release_ms != 0 || e->hide || evbuffer_get_length(e->bytes) > 0)
        return false;
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (rprof_pop_reply(buf, m, e->arg, list, sizeof(list), &val, &pair))
        codec_count(rx->s, RULE_EV_DELIVER); /* as decide_job() counts it */
    rx->run[SIDE_UPSTREAM] += m->len;
    return true;
}

static void on_pop_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                         const struct resp_msg *m, struct evbuffer *reply)
{
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (!rprof_pop_reply(buf, m, e->arg, list, sizeof(list), &val, &pair))
        return;
    struct job_event j = {.kind = RULE_EV_DELIVER};
    if (!job_from_value(rx, list, buf + val.off, val.len, &j))
        return;
    j.key = list;
    journal_job(rx, JOURNAL_KIND_DELIVER, &j);
    const struct rule *r = decide_job(rx, &j);
    if (r != NULL) {
        switch (r->action.kind) {
        case RULE_ACT_DUPLICATE: {
            uint32_t after = r->action.duration_ms;
            if (rx->prof == RPROF_CELERY) {
                char *marked = NULL;
                size_t mlen = 0;
                if (resp_job_celery_redelivered(buf + val.off, val.len, &marked, &mlen) == 0) {
                    repush(rx, rprof_repush_cmd(rx->prof), list, marked, mlen, after);
                    free(marked);
                } else {
                    repush(rx, rprof_repush_cmd(rx->prof), list, buf + val.off, val.len, after);
                }
            } else {
                repush(rx, rprof_repush_cmd(rx->prof), list, buf + val.off, val.len, after);
            }
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
            e->release_ms = now_ms() + r->action.duration_ms;
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
    job_event_clear(&j);
}

/* A field longer than its limit (RPROF_ID_MAX, RPROF_TASK_MAX, cap with the NUL): the
 * session's first is logged with the field, its length and the limit. */
static void say_too_long(struct rpx *rx, const char *field, uint64_t len, size_t cap)
{
    if (rx->said_too_long)
        return;
    rx->said_too_long = true;
    log_msg(LOG_WARN, "resp field too long", "sid=%llu listener=%s field=%s bytes=%llu limit=%zu",
            (unsigned long long)rx->s->id, scope(rx), field, (unsigned long long)len, cap - 1);
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
    struct job_event j = {.kind = RULE_EV_DELIVER, .redelivered = redelivered};
    idmap_lock();
    struct idmap_info *in = idmap_put(scope(rx), key, strlen(key));
    if (in != NULL && has_task)
        idmap_set_str(&in->task, task, strlen(task));
    if (has_task)
        j.task = jdup(&j, task);
    else if (in != NULL && in->task != NULL)
        j.task = jdup(&j, in->task);
    idmap_unlock();
    j.id = jdup(&j, id);
    j.queue = jdup(&j, stream);
    j.key = stream;
    journal_job(rx, JOURNAL_KIND_DELIVER, &j);
    const struct rule *r = decide_job(rx, &j);
    if (r != NULL && r->action.kind == RULE_ACT_DUPLICATE) {
        /* Its ack is swallowed: the entry stays pending. */
        idmap_lock();
        in = idmap_put(scope(rx), key, strlen(key));
        if (in != NULL) {
            in->flags |= IDMAP_SUPPRESS_ACK;
            if (in->task == NULL && j.task != NULL) /* an ack removed it meanwhile */
                idmap_set_str(&in->task, j.task, strlen(j.task));
        }
        idmap_unlock();
    }
    job_event_clear(&j);
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
    while (walk_next(&it, &v, &start, &end) == 1) {
        const struct rule *r = stream_delivery(rx, stream, buf, len, &v, redelivered);
        if (r != NULL && r->action.kind == RULE_ACT_DROP) {
            dropped = true;
            continue;
        }
        if (r != NULL && r->action.kind == RULE_ACT_DELAY) {
            uint64_t at = now_ms() + r->action.duration_ms;
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
static void on_stream_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
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
        for (uint64_t i = 0; walk_next(&it, &v, &start, &end) == 1; i++) {
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
        while (walk_next(&it, &v, &start, &end) == 1) {
            evbuffer_add(out, buf + start, end - start);
            rprof_view_str(buf, m->len, &v, stream, sizeof(stream));
            if (walk_next(&it, &v, &start, &end) != 1)
                break;
            if (rprof_is_agg(&v))
                dropped |= stream_entries(rx, e, stream, buf, m->len, &v, e->redelivered, out);
            else
                evbuffer_add(out, buf + start, end - start);
        }
    } else {
        /* RESP2: [[stream, entries], ...] */
        evbuffer_add_printf(out, "*%llu\r\n", (unsigned long long)m->nelem);
        while (walk_next(&it, &v, &start, &end) == 1) {
            struct resp_args in;
            struct resp_view k, ents;
            size_t ks, ke, es, ee;
            char stream[RPROF_KEY_MAX];
            if (!rprof_is_agg(&v) || v.count != 2) {
                evbuffer_add(out, buf + start, end - start);
                continue;
            }
            rprof_walk_init(&in, buf, m->len, &v);
            if (walk_next(&in, &k, &ks, &ke) != 1 || walk_next(&in, &ents, &es, &ee) != 1)
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

/* ---- replies ----------------------------------------------------------- */

static void on_exec_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                          const struct resp_msg *m, struct evbuffer *reply)
{
    (void)rx;
    if (m->null || m->type != '*' || m->body != 0)
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
        if (walk_next(&it, &v, &start, &end) != 1) {
            evbuffer_free(out);
            return; /* not the shape expected: pass the server's reply on */
        }
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

/* RQ's job hash as a worker reads it: remember the task for the id. */
static void on_rq_hash(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m)
{
    char *task = NULL;
    if (e->arg == NULL || rprof_rq_hash_task(buf, m, &task) != 0)
        return;
    idmap_lock();
    struct idmap_info *in = idmap_put(scope(rx), e->arg, strlen(e->arg));
    if (in != NULL && in->task == NULL)
        idmap_set_str(&in->task, task, strlen(task));
    idmap_unlock();
    free(task);
}

static void on_xadd_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                          const struct resp_msg *m)
{
    char id[RPROF_ID_MAX];
    uint64_t n;
    enum rprof_field got = rprof_xadd_reply_id(buf, m, id, sizeof(id), &n);
    if (got == RPROF_TOO_LONG)
        say_too_long(rx, "stream entry id", n, sizeof(id));
    if (got != RPROF_FOUND)
        return;
    struct job_event j = {.kind = RULE_EV_PUBLISH};
    j.id = jdup(&j, id);
    j.queue = e->arg != NULL ? jdup(&j, e->arg) : NULL;
    j.task = e->arg2 != NULL ? jdup(&j, e->arg2) : NULL;
    journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    if (e->arg != NULL && e->arg2 != NULL) {
        char key[RPROF_KEY_MAX + RPROF_ID_MAX + 2];
        snprintf(key, sizeof(key), "%s %s", e->arg, id);
        idmap_lock();
        struct idmap_info *in = idmap_put(scope(rx), key, strlen(key));
        if (in != NULL)
            idmap_set_str(&in->task, e->arg2, strlen(e->arg2));
        idmap_unlock();
    }
    job_event_clear(&j);
}

/* A new entry for bytes that arrive while `at` (hidden: twice's own command)
 * waits for its reply: just before it, or after it once it has its reply, so
 * that the client gets them where they came and loses only what twice hides. */
static struct entry *entry_beside(struct rpx *rx, struct entry *at)
{
    struct entry *tail = rx->tail;
    struct entry *n = entry_add(rx, false);
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
static bool straight_out(const struct rpx *rx, const struct entry *e)
{
    return e == rx->head && e->kind == RPROF_REPLY_PLAIN && e->release_ms == 0 && !e->hide;
}

/* Entry e got the last reply of one of its commands; `sent`: that reply went
 * straight out (run) rather than into e. */
static void entry_answered(struct rpx *rx, struct entry *e, bool sent)
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

/* One whole reply is at the start of pend[UPSTREAM] (buf, m->len bytes). */
static void on_reply(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m)
{
    struct evbuffer *pend = rx->pend[SIDE_UPSTREAM];
    struct resp_match match;
    int rc = resp_pairing_reply(&rx->pairing, m, buf, &match);
    if (rc != 1 || rx->await == NULL) {
        /* Out of band (push, pub/sub message, MONITOR), or a reply nobody
         * asked for: on to the client, behind what is due before it. */
        if (rx->head == NULL) {
            rx->run[SIDE_UPSTREAM] += m->len;
        } else {
            struct entry *last = rx->await != NULL ? rx->await : rx->tail;
            if (last->hide && (last = entry_beside(rx, last)) == NULL) {
                session_set_error(rx->s, "out of memory");
                session_abort(rx->s, SESSION_CLOSE_INTERNAL_ERROR, -1);
                return;
            }
            rx->held += m->len;
            run_move(rx, SIDE_UPSTREAM);
            evbuffer_remove_buffer(pend, last->bytes, m->len);
        }
        return;
    }
    struct entry *e = rx->await;
    if (straight_out(rx, e) && evbuffer_get_length(e->bytes) == 0) {
        /* The common case: the reply due next, straight to the client (a
         * small one copied into the output's last chain).  Not when a push
         * or pub/sub message that came first still waits in the entry. */
        rx->run[SIDE_UPSTREAM] += m->len;
        if (match.last)
            entry_answered(rx, e, true);
        return;
    } else if (e->kind == RPROF_REPLY_PLAIN) {
        rx->held += m->len;
        run_move(rx, SIDE_UPSTREAM);
        evbuffer_remove_buffer(pend, e->bytes, m->len);
    } else if (e->kind == RPROF_REPLY_POP && pop_reply_counted(rx, e, buf, m)) {
        if (match.last)
            entry_answered(rx, e, true);
        return;
    } else {
        struct evbuffer *reply = evbuffer_new();
        if (reply == NULL) {
            session_set_error(rx->s, "out of memory");
            session_abort(rx->s, SESSION_CLOSE_INTERNAL_ERROR, -1);
            return;
        }
        evbuffer_add(reply, buf, m->len);
        switch (e->kind) {
        case RPROF_REPLY_POP:
            on_pop_reply(rx, e, buf, m, reply);
            break;
        case RPROF_REPLY_XREAD:
        case RPROF_REPLY_XCLAIM:
        case RPROF_REPLY_XAUTOCLAIM:
            on_stream_reply(rx, e, buf, m, reply);
            break;
        case RPROF_REPLY_XADD:
            on_xadd_reply(rx, e, buf, m);
            break;
        case RPROF_REPLY_RQ_HASH:
            on_rq_hash(rx, e, buf, m);
            break;
        case RK_EXEC:
            on_exec_reply(rx, e, buf, m, reply);
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
        run_move(rx, SIDE_UPSTREAM);
        evbuffer_drain(pend, m->len);
        rx->held += evbuffer_get_length(reply);
        evbuffer_add_buffer(e->bytes, reply);
        evbuffer_free(reply);
    }
    if (match.last)
        entry_answered(rx, e, false);
}

/* ---- commands ---------------------------------------------------------- */

/* Remembers the client's AUTH / HELLO / SELECT for twice's own connection. */
static void remember_setup(struct rpx *rx, const struct rprof_cmdview *cv)
{
    int which = is_cmd(cv, RPROF_CMD_AUTH)     ? SETUP_AUTH
                : is_cmd(cv, RPROF_CMD_HELLO)  ? SETUP_HELLO
                : is_cmd(cv, RPROF_CMD_SELECT) ? SETUP_SELECT
                                               : -1;
    if (which < 0 || rx->tx.active)
        return;
    if (rx->setup[which] == NULL && (rx->setup[which] = evbuffer_new()) == NULL)
        return;
    evbuffer_drain(rx->setup[which], evbuffer_get_length(rx->setup[which]));
    evbuffer_add(rx->setup[which], cv->buf, cv->len);
}

/* Forwards the command at the head of pend[CLIENT] (len bytes; cv its view,
 * whose name the pairing takes) and owes the client its reply. */
static struct entry *forward(struct rpx *rx, const struct rprof_cmdview *cv,
                             const struct resp_msg *m, const uint8_t *buf, size_t len)
{
    int rc = resp_pairing_command_named(&rx->pairing, m, buf, cv->name, 0, NULL);
    rx->run[SIDE_CLIENT] += len;
    if (rc != 1)
        return NULL; /* the server will not answer (CLIENT REPLY OFF, empty command) */
    return entry_add(rx, true);
}

/* Forwards a command twice does not look at (no id, no rule on it): like
 * forward(), but its reply joins the last entry when that one is a plain
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
    entry_add(rx, true);
}

static void forward_plain(struct rpx *rx, const struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, size_t len)
{
    int rc = resp_pairing_command_named(&rx->pairing, m, buf, cv->name, 0, NULL);
    rx->run[SIDE_CLIENT] += len;
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
    const struct rpx_window *w = &rx->win[SIDE_CLIENT];
    if (rx->decided != 0 || rx->tx.active || rx->need[SIDE_CLIENT] != 0 || cmd_rules ||
        !win_open(rx, SIDE_CLIENT))
        return false;
    /* The rest of a pipeline in one call: nothing above changes while it
     * takes plain commands (the pairing's room is checked by the pairing). */
    size_t taken = 0;
    while (w->len > rx->run[SIDE_CLIENT]) {
        const uint8_t *p = w->p + rx->run[SIDE_CLIENT];
        struct resp_view nv;
        size_t len =
            resp_scan_command_len(&rx->sc[SIDE_CLIENT], p, w->len - rx->run[SIDE_CLIENT], &nv);
        if (len == 0 || nv.len == 0 || nv.len >= RESP_CMD_NAME_MAX)
            break;
        const uint8_t *raw = p + nv.off;
        char own[RESP_CMD_NAME_MAX];
        bool again = nv.len == rx->last_plain.len && resp_small_eq(raw, rx->last_plain.raw, nv.len);
        if (!again && (resp_cmd_name_bytes(raw, nv.len, own) != nv.len || /* a NUL in it */
                       rprof_cmd_of(own, nv.len) != RPROF_CMD_OTHER))
            break;
        const char *name = again ? rx->last_plain.name : own;
        if (resp_pairing_simple(&rx->pairing, name, nv.len, 0, NULL) != 1)
            break;
        if (!again) {
            memcpy(rx->last_plain.raw, raw, nv.len);
            memcpy(rx->last_plain.name, own, nv.len + 1);
            rx->last_plain.len = nv.len;
        }
        rx->run[SIDE_CLIENT] += len;
        owe_plain(rx);
        taken++;
    }
    if (taken > 0)
        stat_add(&rx->s->loop->events[RULE_EV_COMMAND], taken);
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

/* The command's name, once resp_walk() has seen it, if it is one twice has
 * no use for (RPROF_CMD_OTHER): its length, name[] as resp_cmd_name_bytes()
 * makes it.  0 for any other. */
static size_t big_name(struct evbuffer *b, size_t at, const struct resp_walk *w, char *name)
{
    uint8_t raw[RESP_CMD_NAME_MAX];
    size_t n = w->name_len;
    if (n == 0 || n >= RESP_CMD_NAME_MAX || peek_at(b, at + w->name_off, raw, n) != n ||
        resp_cmd_name_bytes(raw, n, name) != n || rprof_cmd_of(name, n) != RPROF_CMD_OTHER)
        return 0;
    return n;
}

/* scan_one() is about to pull the message at the head of pend[side] (the
 * run moved) up across chains: the walker takes it instead when it is plain
 * and the plain paths may take it.  1: taken (the run grew over it); 0:
 * more bytes needed (rx->need set); -1: left to the scanner. */
static int big_try(struct rpx *rx, enum session_side side)
{
    struct evbuffer *pend = rx->pend[side];
    struct entry *e = rx->await;
    if (side == SIDE_CLIENT
            ? rx->decided != 0 || rx->tx.active || codec_wants(rx->s, RULE_EV_COMMAND)
            : e == NULL || !straight_out(rx, e) || rx->held != 0)
        return -1;
    struct resp_walk w;
    char name[RESP_CMD_NAME_MAX];
    size_t name_len = 0, n = evbuffer_get_length(pend);
    int r = resp_walk(&rx->sc[side], peek_at, pend, 0, n, &w);
    if (r == RESP_WALK_NO ||
        (side == SIDE_CLIENT && w.name_len > 0 && (name_len = big_name(pend, 0, &w, name)) == 0))
        return -1;
    if (r == RESP_WALK_WAIT) {
        resp_scanner_reset(&rx->sc[side]); /* the walker measures it again then */
        rx->need[side] = w.len;
        return 0;
    }
    if (side == SIDE_CLIENT ? resp_pairing_simple(&rx->pairing, name, name_len, 0, NULL) != 1
                            : resp_pairing_reply_simple(&rx->pairing, w.type) != 1)
        return -1;
    resp_scanner_reset(&rx->sc[side]);
    rx->need[side] = 0;
    rx->run[side] += w.len;
    if (side == SIDE_CLIENT) {
        codec_count(rx->s, RULE_EV_COMMAND);
        owe_plain(rx);
    } else {
        entry_answered(rx, e, true);
    }
    return 1;
}

/* Keeps back the command at the head of pend[CLIENT]. */
static void swallow(struct rpx *rx, size_t len)
{
    run_move(rx, SIDE_CLIENT);
    evbuffer_drain(rx->pend[SIDE_CLIENT], len);
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
    struct job_event j = {.kind = RULE_EV_ACK};
    j.key = cv->key;
    idmap_lock();
    struct idmap_info *in = idmap_get(scope(rx), key, strlen(key));
    if (rx->prof == RPROF_CELERY) {
        j.id = in != NULL && in->id != NULL ? jdup(&j, in->id) : NULL;
        j.queue = in != NULL && in->queue != NULL ? jdup(&j, in->queue) : NULL;
    } else {
        j.id = jdup(&j, id);
        j.queue = rprof_queue_of(rx->prof, cv->key);
        j.oom |= j.queue == NULL;
    }
    j.task = in != NULL && in->task != NULL ? jdup(&j, in->task) : NULL;
    /* A duplicate decided at delivery: this ack never lands, so the entry
     * stays pending for the next XAUTOCLAIM (the mark is used up here). */
    bool swallow_dup = in != NULL && (in->flags & IDMAP_SUPPRESS_ACK) != 0;
    if (swallow_dup)
        in->flags &= ~(uint32_t)IDMAP_SUPPRESS_ACK;
    uint64_t gen = in != NULL ? in->gen : 0;
    idmap_unlock();
    journal_job(rx, JOURNAL_KIND_ACK, &j);
    /* A swallowed ack is only counted: a rule that fired on it would be
     * journaled as a fault it never made. */
    const struct rule *r = NULL;
    if (swallow_dup)
        codec_count(rx->s, RULE_EV_ACK);
    else
        r = decide_job(rx, &j);
    job_event_clear(&j);
    if (swallow_dup) {
        f->suppress = true;
        return;
    }
    if (r == NULL) {
        /* Settled for good: forget the entry, unless another connection's
         * delivery of the same id made it anew or marked it meanwhile. */
        idmap_lock();
        in = idmap_get(scope(rx), key, strlen(key));
        if (in != NULL && in->gen == gen && (in->flags & IDMAP_SUPPRESS_ACK) == 0)
            idmap_del(scope(rx), key, strlen(key));
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

/* The decisions on the acks of one command.  *kept gets the command
 * rewritten without the kept-back ids (XACK), *later the ids to apply later. */
struct ack_plan {
    size_t n, suppressed;
    bool any_later;
    uint32_t later_ms;
    const struct rule *close_before, *close_after;
    struct evbuffer *kept;  /* the command without the suppressed ids (partial) */
    struct evbuffer *later; /* the suppressed ids that apply later, as a command */
    struct evbuffer *repush;
    size_t repush_n;
    uint32_t repush_ms; /* the latest of the ids' (`redeliver after D`) */
};

static void ack_plan_free(struct ack_plan *p)
{
    if (p->kept != NULL)
        evbuffer_free(p->kept);
    if (p->later != NULL)
        evbuffer_free(p->later);
    if (p->repush != NULL)
        evbuffer_free(p->repush);
}

static int plan_acks(struct rpx *rx, const struct rprof_cmdview *cv, size_t first,
                     struct ack_plan *p)
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
            if (p->repush != NULL && encode_cmd(p->repush, 3, argv, lens) == 0)
                p->repush_n++;
            if (f.repush_ms > p->repush_ms)
                p->repush_ms = f.repush_ms;
        }
    }
    if (p->suppressed > 0 && p->suppressed < p->n && (p->kept = evbuffer_new()) != NULL)
        encode_cmd(p->kept, nk, keep, keep_len);
    if (nl > first && (p->later = evbuffer_new()) != NULL)
        encode_cmd(p->later, nl, late, late_len);
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
        aux_send_at(rx, p->later, 1, p->later_ms);
    if (p->repush != NULL)
        aux_send_at(rx, p->repush, p->repush_n, p->repush_ms);
}

/* An XADD, decided before Redis sees it: its task (the `task` field) and its
 * stream are known, its id only when the client chose it (else Redis picks
 * it, and the reply's id is journaled, see on_xadd_reply).  A publish that a
 * rule keeps from Redis (drop, close before) is journaled here, and a drop
 * is answered with the id the client gave or one made as Redis makes them
 * (milliseconds-sequence), in rx->xadd_answer. */
static const struct rule *stream_publish_decide(struct rpx *rx, const struct rprof_cmdview *cv)
{
    if (!is_cmd(cv, RPROF_CMD_XADD) || rx->tx.active)
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
    struct job_event j = {.kind = RULE_EV_PUBLISH};
    j.key = cv->key;
    j.id = chosen ? jdup(&j, id) : NULL;
    j.queue = jdup(&j, cv->key);
    j.task = task[0] != '\0' ? jdup(&j, task) : NULL;
    /* Redis picks the id of an XADD with '*': the rules decide without one,
     * and the fault is noted once it is known whether twice made one (a
     * drop), so that the fault and the publish records share it. */
    if (job_event_oom(rx, &j)) {
        job_event_clear(&j);
        return NULL;
    }
    struct engine_event ev;
    char anon[48];
    job_engine_event(rx, &j, &ev, anon);
    size_t hit = 0;
    const struct rule *r =
        codec_decide_first_unnoted(rx->s, &ev, &hit) == 1 ? hit_rule(rx, hit) : NULL;
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
            j.id = jdup(&j, rx->xadd_answer);
    }
    if (r != NULL) {
        ev.message_id = j.id;
        fault_note(rx->s, r, &ev);
    }
    if (kept_back)
        journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    job_event_clear(&j);
    return r;
}

/* What a publish a rule dropped is answered with, into out (room for
 * sizeof(rx->xadd_answer) + 32 bytes); returns its length: a list push's
 * length 1, or an XADD's id (stream_publish_decide()). */
static size_t drop_reply(const struct rpx *rx, char *out, size_t cap)
{
    int n = rx->prof == RPROF_STREAMS
                ? snprintf(out, cap, "$%zu\r\n%s\r\n", strlen(rx->xadd_answer), rx->xadd_answer)
                : snprintf(out, cap, ":1\r\n");
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* Sidekiq's and Celery's LPUSH of job JSON (outside a transaction): a publish per job read.
 * Returns the first deciding rule, or NULL. */
static const struct rule *publish_jobs(struct rpx *rx, const struct rprof_cmdview *cv)
{
    if (rx->tx.active)
        return NULL;
    if (!jobs_needed(rx)) {
        /* Nothing reads the jobs: each is counted, as decide_job() would. */
        for (size_t i = 2; i < cv->m->nelem; i++)
            codec_count(rx->s, RULE_EV_PUBLISH);
        return NULL;
    }
    const struct rule *first = NULL;
    struct resp_view v;
    for (size_t i = 2; rprof_arg(cv, i, &v); i++) {
        struct resp_job job;
        if (rprof_job(rx->prof, cv->buf + v.off, v.len, &job) != 0)
            continue;
        struct job_event j = {.kind = RULE_EV_PUBLISH, .id = job.id, .task = job.task};
        j.key = cv->key;
        j.queue = rprof_queue_of(rx->prof, cv->key);
        j.oom |= j.queue == NULL;
        free(job.queue);
        free(job.tag);
        journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
        const struct rule *r = decide_job(rx, &j);
        if (first == NULL)
            first = r;
        job_event_clear(&j);
    }
    return first;
}

/* RQ's push of a job id onto its queue; its task from the job's hash, as the enqueue
 * transaction saved it (tx_first_cmd()) or a worker read it, else rq_task (the transaction's
 * last saved task, when the idmap could not keep it). */
static const struct rule *publish_rq(struct rpx *rx, const struct rprof_cmdview *cv,
                                     const char *rq_task)
{
    char id[RPROF_KEY_MAX];
    struct resp_view v;
    if (!rprof_arg(cv, 2, &v) || !rprof_view_str(cv->buf, cv->len, &v, id, sizeof(id)))
        return NULL;
    struct job_event j = {.kind = RULE_EV_PUBLISH, .key = cv->key};
    j.id = jdup(&j, id);
    j.queue = rprof_queue_of(rx->prof, cv->key);
    j.oom |= j.queue == NULL;
    idmap_lock();
    struct idmap_info *in = idmap_get(scope(rx), id, strlen(id));
    if (in != NULL && in->task != NULL)
        j.task = jdup(&j, in->task);
    idmap_unlock();
    if (j.task == NULL && rq_task != NULL)
        j.task = jdup(&j, rq_task);
    journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    const struct rule *r = decide_job(rx, &j);
    job_event_clear(&j);
    return r;
}

/* Publishes: Sidekiq's and Celery's LPUSH of job JSON, RQ's push of a job id, XADD.  Returns
 * the deciding rule, or NULL. */
static const struct rule *publish_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                         const char *rq_task)
{
    switch (rprof_publish_of(rx->prof, cv)) {
    case RPROF_PUB_JOBS:
        return publish_jobs(rx, cv);
    case RPROF_PUB_RQ_ID:
        return publish_rq(rx, cv, rq_task);
    case RPROF_PUB_XADD:
        return stream_publish_decide(rx, cv);
    default:
        return NULL;
    }
}

/* ---- replication ------------------------------------------------------- */

enum cmd_result { CMD_DONE, CMD_WAIT, CMD_STOP };

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
 * (relay_stream; the client's bytes as rx->raw): logged once. */
static void relay_unparsed(struct rpx *rx, struct entry *e, enum log_level level, const char *msg,
                           const char *key, const char *value)
{
    e->kind = RK_STREAM;
    rx->raw = true;
    log_unparsed(rx, level, msg, key, value, "relayed unparsed from here on, both ways");
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
    rx->run[SIDE_CLIENT] += len;
    struct entry *e = entry_add(rx, true);
    if (e == NULL) {
        session_set_error(rx->s, "out of memory");
        session_abort(rx->s, SESSION_CLOSE_INTERNAL_ERROR, -1);
        return CMD_STOP;
    }
    relay_unparsed(rx, e, LOG_INFO, "replication stream", "command", cv->name);
    return CMD_DONE;
}

/* The server's bytes once its replies reached the stream's entry e: all of
 * them, straight out when nothing waits before them, else into e (which
 * never completes) to go out behind what does. */
static void relay_stream(struct rpx *rx, struct entry *e)
{
    struct evbuffer *pend = rx->pend[SIDE_UPSTREAM];
    size_t n = evbuffer_get_length(pend) - rx->run[SIDE_UPSTREAM];
    if (n == 0)
        return;
    if (e == rx->head && e->release_ms == 0 && evbuffer_get_length(e->bytes) == 0) {
        rx->run[SIDE_UPSTREAM] += n;
        return;
    }
    run_move(rx, SIDE_UPSTREAM);
    rx->held += n;
    evbuffer_add_buffer(e->bytes, pend);
}

/* ---- transactions ------------------------------------------------------ */

/* Tags of the kept-back ZREMs of one transaction an HDEL is compared with. */
#define RPX_TX_TAGS 16

static void tx_reset(struct tx *t)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->cmds[i].synth != NULL)
            evbuffer_free(t->cmds[i].synth);
    free(t->cmds);
    if (t->later != NULL)
        evbuffer_free(t->later);
    if (t->now != NULL)
        evbuffer_free(t->now);
    if (t->copies != NULL)
        evbuffer_free(t->copies);
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
    char rq_task[RPROF_TASK_MAX];
};

static void tx_first_cmd(void *arg, const struct rprof_cmdview *cv)
{
    struct tx_first *f = arg;
    const char *id;
    char *task;
    if (!rprof_rq_job_saved(f->rx->prof, cv, &id, &task))
        return;
    snprintf(f->rq_task, sizeof(f->rq_task), "%s", task);
    idmap_lock();
    struct idmap_info *in = idmap_put(scope(f->rx), id, strlen(id));
    if (in != NULL)
        idmap_set_str(&in->task, task, strlen(task));
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
    if (plan_acks(rx, cv, first, &p) != 0)
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
    } else if (p.suppressed > 0 && is_cmd(cv, RPROF_CMD_XACK)) {
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
    ack_plan_free(&p);
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
                            bool xadd, const char *rq_task, const struct rule **close_before,
                            const struct rule **delay_rule)
{
    struct tx *t = &rx->tx;
    const struct rule *r = xadd ? stream_publish_decide(rx, cv)
                                : publish_decide(rx, cv, rq_task[0] != '\0' ? rq_task : NULL);
    if (r == NULL)
        return;
    switch (r->action.kind) {
    case RULE_ACT_DROP: {
        char reply[sizeof(rx->xadd_answer) + 32];
        tx_keep_back_as(t, c, reply, drop_reply(rx, reply, sizeof(reply)));
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

static int tx_plan(struct rpx *rx, const uint8_t *buf, size_t len, size_t off,
                   const struct rule **close_before, const struct rule **delay_rule)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    /* The session's limits: a transaction with a bulk over max-message-size
     * is not planned (Redis never runs it: the session ends at that bulk). */
    sc.max_bulk = rx->sc[SIDE_CLIENT].max_bulk;
    struct rprof_tx scan;
    struct tx_first seen = {.rx = rx, .rq_task = ""};
    int found = rprof_tx_scan(&sc, buf, len, off, &scan, tx_first_cmd, &seen);
    if (found != 1)
        return found;
    bool has_push = scan.has_push;
    const char *rq_task = seen.rq_task;
    /* Second pass: decide. */
    struct tx *t = &rx->tx;
    resp_scanner_reset(&sc);
    size_t pos = off;
    struct tx_tags *tags = calloc(1, sizeof(*tags));
    if (tags == NULL)
        return -1;
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
        if (is_cmd(&cv, RPROF_CMD_EXEC))
            break;
        struct txcmd *c = tx_slot(t, i);
        size_t first;
        bool celery_restore = rx->prof == RPROF_CELERY && has_push;
        bool xadd = rx->prof == RPROF_STREAMS && is_cmd(&cv, RPROF_CMD_XADD);
        if (c == NULL)
            rc = -1;
        else if (!celery_restore && rprof_ack_args(rx->prof, &cv, &first))
            rc = tx_plan_ack(rx, c, &cv, first, close_before, tags) == 0 ? 1 : -1;
        else if (rprof_is_celery_unacked_hdel(rx->prof, &cv) && tags->n > 0)
            tx_plan_hdel(rx, c, &cv, tags);
        else if (rx->prof == RPROF_RQ || xadd)
            tx_plan_publish(rx, c, &cv, xadd, rq_task, close_before, delay_rule);
    }
    free(tags);
    if (rc == 1)
        t->planned = true;
    return rc;
}

/* ---- one command ------------------------------------------------------- */

/* The `command` event: a rule on commands may answer, drop, delay or cut this one.  True
 * when it did (*res says how), false when the command goes on. */
static bool command_event(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, bool cmd_rules, enum cmd_result *res)
{
    size_t len = m->len;
    if (rx->decided < DECIDED_COMMAND && !cmd_rules) {
        codec_count(rx->s, RULE_EV_COMMAND);
        rx->decided = DECIDED_COMMAND;
    }
    if (rx->decided < DECIDED_COMMAND) {
        struct engine_event ev;
        memset(&ev, 0, sizeof(ev));
        char anon[48];
        ev.event = RULE_EV_COMMAND;
        ev.command = cv->name;
        ev.key = cv->has_key ? cv->key : NULL;
        ev.identity =
            codec_anon_id(anon, sizeof(anon), "cmd", (const uint64_t[]){rx->s->id, ++rx->anon}, 2);
        size_t hits[SESSION_MAX_RULE_HITS];
        size_t n = decide(rx, &ev, hits);
        for (size_t i = 0; i < n; i++) {
            const struct rule *r = hit_rule(rx, hits[i]);
            switch (r->action.kind) {
            case RULE_ACT_ERROR:
                swallow(rx, len);
                if (owe_reply(rx))
                    answer_error(rx, r);
                if (rx->tx.active)
                    rx->tx.aborted = true; /* as a queue-time error: EXEC will abort */
                rx->decided = 0;
                *res = CMD_DONE;
                return true;
            case RULE_ACT_DROP: {
                /* As from a hung server: the replies already due go out, then
                 * nothing more (an entry that never completes). */
                swallow(rx, len);
                rx->blackholed = true;
                struct entry *hole = entry_add(rx, false);
                if (hole != NULL)
                    hole->done = false;
                *res = CMD_STOP;
                return true;
            }
            case RULE_ACT_DELAY:
                rx->decided = DECIDED_COMMAND;
                rx->hold_until = now_ms() + r->action.duration_ms;
                *res = CMD_WAIT;
                return true;
            case RULE_ACT_CLOSE:
                if (r->action.close_when == RULE_CLOSE_BEFORE) {
                    swallow(rx, len);
                    cut_at_turn(rx, r, NULL);
                    *res = CMD_STOP;
                    return true;
                }
                /* after: forwarded, then cut once its reply went out */
                cut_at_turn(rx, r, forward(rx, cv, m, buf, len));
                rx->decided = 0;
                *res = CMD_STOP;
                return true;
            default:
                break;
            }
        }
        rx->decided = DECIDED_COMMAND;
    }

    return false;
}

/* MULTI outside a transaction: the transaction's plan, made once its commands are here (or
 * after RPX_TX_WAIT_MS), then MULTI goes on. */
static enum cmd_result tx_begin(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m)
{
    size_t len = m->len;
    run_move(rx, SIDE_CLIENT); /* the plan reads from the MULTI on */
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
        bool judged = codec_wants(rx->s, RULE_EV_ACK) ||
                      ((rx->prof == RPROF_RQ || rx->prof == RPROF_STREAMS) &&
                       codec_wants(rx->s, RULE_EV_PUBLISH));
        if (rc == 0 && !rx->tx_waited && (avail > len || judged)) {
            tx_reset(&rx->tx);
            if (rx->tx_wait_until == 0)
                rx->tx_wait_until = now_ms() + RPX_TX_WAIT_MS;
            return CMD_WAIT;
        }
        rx->tx_wait_until = 0;
        rx->tx_waited = false;
        if (close_before != NULL) {
            tx_reset(&rx->tx);
            swallow(rx, len);
            cut_at_turn(rx, close_before, NULL);
            return CMD_STOP;
        }
        if (delay_rule != NULL) {
            rx->decided = DECIDED_ALL;
            rx->hold_until = now_ms() + delay_rule->action.duration_ms;
            rx->tx.active = false;
            return CMD_WAIT;
        }
        if (rc != 1)
            tx_reset(&rx->tx);
    }
    rx->tx.active = true;
    rx->tx.idx = 0;
    forward(rx, cv, m, evbuffer_pullup(rx->pend[SIDE_CLIENT], (ev_ssize_t)len), len);
    rx->decided = 0;
    return CMD_DONE;
}

/* EXEC of a transaction with a refused command: discarded, as Redis does. */
static enum cmd_result tx_exec_aborted(struct rpx *rx, const struct resp_msg *m)
{
    size_t len = m->len;
    /* Redis discards a transaction with a refused command: so does
     * twice, answering EXEC as Redis would. */
    static const char discard[] = "*1\r\n$7\r\nDISCARD\r\n";
    static const char abort_msg[] =
        "-EXECABORT Transaction discarded because of previous errors.\r\n";
    swallow(rx, len);
    send_own(rx, discard, sizeof(discard) - 1);
    answer(rx, abort_msg, sizeof(abort_msg) - 1);
    tx_reset(&rx->tx);
    rx->decided = 0;
    return CMD_DONE;
}

/* EXEC or DISCARD of a transaction: the plan's replies and its commands for twice's own
 * connection (delayed acks, late copies, re-pushes). */
static enum cmd_result tx_end(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                              const uint8_t *buf)
{
    size_t len = m->len;
    struct tx *t = &rx->tx;
    struct entry *e = forward(rx, cv, m, buf, len);
    if (e != NULL && is_cmd(cv, RPROF_CMD_EXEC)) {
        if (t->any) {
            e->kind = RK_EXEC;
            e->tx = t->cmds;
            e->ntx = t->idx < t->n ? t->idx : t->n;
            /* queued commands beyond the plan were forwarded */
            for (size_t i = e->ntx; i < t->n; i++)
                if (t->cmds[i].synth != NULL)
                    evbuffer_free(t->cmds[i].synth);
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
        if (t->close_after != NULL) {
            rx->blackholed = true;
            e->close_after = t->close_after;
        }
        if (t->later != NULL)
            aux_send_at(rx, t->later, t->later_n, t->later_ms);
        if (t->copies != NULL)
            aux_send_at(rx, t->copies, t->copies_n, t->copies_ms);
        if (t->now != NULL)
            aux_send_at(rx, t->now, t->now_n, 0);
    }
    tx_reset(t);
    rx->decided = 0;
    return CMD_DONE;
}

/* A command queued in a transaction: forwarded, or answered +QUEUED when the plan keeps it
 * back. */
static enum cmd_result tx_queue(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                                const uint8_t *buf)
{
    size_t len = m->len;
    struct tx *t = &rx->tx;
    size_t i = t->idx++;
    if (t->planned && i < t->n && t->cmds[i].suppress) {
        swallow(rx, len);
        answer(rx, "+QUEUED\r\n", 9);
    } else {
        forward(rx, cv, m, buf, len);
    }
    rx->decided = 0;
    return CMD_DONE;
}

/* An ack outside a transaction (its ids from argument `first` on): applied, kept back,
 * delayed or cut as its rules say. */
static enum cmd_result command_ack(struct rpx *rx, struct rprof_cmdview *cv,
                                   const struct resp_msg *m, const uint8_t *buf, size_t first)
{
    size_t len = m->len;
    struct ack_plan p;
    if (plan_acks(rx, cv, first, &p) != 0) {
        forward(rx, cv, m, buf, len);
        rx->decided = 0;
        return CMD_DONE;
    }
    if (p.close_before != NULL) {
        const struct rule *r = p.close_before;
        ack_plan_free(&p);
        swallow(rx, len);
        cut_at_turn(rx, r, NULL);
        return CMD_STOP;
    }
    ack_plan_side_effects(rx, &p);
    struct entry *e = NULL;
    if (p.suppressed > 0 && p.suppressed == p.n) {
        swallow(rx, len);
        char r[32];
        int n = snprintf(r, sizeof(r), ":%lld\r\n", (long long)rprof_settled_count(cv));
        if (owe_reply(rx))
            answer(rx, r, (size_t)n);
    } else if (p.suppressed > 0 && p.kept != NULL) {
        /* The command without the kept-back ids; its count plus them. */
        struct resp_msg km;
        struct resp_scanner ks;
        resp_scanner_init(&ks, RESP_SIDE_CLIENT);
        size_t klen = evbuffer_get_length(p.kept);
        const uint8_t *kb = evbuffer_pullup(p.kept, (ev_ssize_t)klen);
        if (resp_scan(&ks, kb, klen, &km) == 1 &&
            resp_pairing_command(&rx->pairing, &km, kb, 0, NULL) == 1) {
            swallow(rx, len); /* moves the run first */
            evbuffer_add_buffer(rx->out[SIDE_UPSTREAM], p.kept);
            e = entry_add(rx, true);
            if (e != NULL) {
                e->kind = RK_ADD_INT;
                e->add = (int64_t)p.suppressed;
            }
        } else {
            e = forward(rx, cv, m, buf, len);
        }
    } else {
        e = forward(rx, cv, m, buf, len);
    }
    const struct rule *close_after = p.close_after;
    ack_plan_free(&p);
    rx->decided = 0;
    if (close_after != NULL) {
        cut_at_turn(rx, close_after, e);
        return CMD_STOP;
    }
    return CMD_DONE;
}

/* What the reply to a forwarded command is, for the reply side: a pop's job, an RQ job
 * hash, a stream read or claim, an XADD's id. */
static void tag_reply(struct rpx *rx, struct rprof_cmdview *cv, struct entry *e)
{
    const char *arg;
    bool redelivered;
    e->kind = (uint8_t)rprof_reply_of(rx->prof, cv, &arg, &redelivered);
    e->redelivered = redelivered;
    bool copied = arg == NULL || (e->arg = strdup(arg)) != NULL;
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
                (unsigned long long)rx->s->id, scope(rx));
        e->kind = RPROF_REPLY_PLAIN;
    }
}

/* Any other command outside a transaction: a publish its rules may drop, delay or cut, or a
 * plain command; forwarded, its reply tagged. */
static enum cmd_result command_other(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf)
{
    size_t len = m->len;
    const struct rule *pub = NULL;
    if (rx->decided < DECIDED_ALL && rx->prof != RPROF_NONE)
        pub = publish_decide(rx, cv, NULL);
    if (pub == NULL && cv->id == RPROF_CMD_OTHER) {
        /* GET, SET, INCR...: no reply kind, no rule on it. */
        forward_plain(rx, cv, m, buf, len);
        rx->decided = 0;
        return CMD_DONE;
    }
    if (pub != NULL) {
        switch (pub->action.kind) {
        case RULE_ACT_DROP:
            swallow(rx, len);
            /* Asked once: under CLIENT REPLY SKIP it sends Redis a PING. */
            if (owe_reply(rx)) {
                char reply[sizeof(rx->xadd_answer) + 32];
                answer(rx, reply, drop_reply(rx, reply, sizeof(reply)));
            }
            rx->decided = 0;
            return CMD_DONE;
        case RULE_ACT_DELAY:
            rx->decided = DECIDED_ALL;
            rx->hold_until = now_ms() + pub->action.duration_ms;
            return CMD_WAIT;
        case RULE_ACT_CLOSE:
            if (pub->action.close_when == RULE_CLOSE_BEFORE) {
                swallow(rx, len);
                cut_at_turn(rx, pub, NULL);
                return CMD_STOP;
            }
            break;
        default:
            break;
        }
    }
    struct entry *e = forward(rx, cv, m, buf, len);
    rx->decided = 0;
    if (pub != NULL && pub->action.kind == RULE_ACT_CLOSE) {
        cut_at_turn(rx, pub, e);
        return CMD_STOP;
    }
    if (e != NULL)
        tag_reply(rx, cv, e);
    return CMD_DONE;
}

static enum cmd_result command(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m)
{
    struct rprof_cmdview cv;
    bool cmd_rules = rx->decided < DECIDED_COMMAND && codec_wants(rx->s, RULE_EV_COMMAND);
    rprof_cmdview_init(&cv, buf, m, cmd_rules);
    size_t len = m->len;

    if (m->nelem == 0) {
        /* An empty command: Redis answers nothing, but its resetClient()
         * still ends a CLIENT REPLY SKIP, as the pairing does. */
        int none = resp_pairing_command(&rx->pairing, m, buf, 0, NULL); /* 0: no reply due */
        (void)none;
        rx->run[SIDE_CLIENT] += len;
        return CMD_DONE;
    }

    enum cmd_result res;
    if (command_event(rx, &cv, m, buf, cmd_rules, &res))
        return res;

    remember_setup(rx, &cv);

    if (!rx->tx.active && (resp_cmd_name_flags(cv.name, strlen(cv.name)) & RESP_CMD_SYNC))
        return replication_start(rx, &cv, len);

    if (is_cmd(&cv, RPROF_CMD_MULTI) && !rx->tx.active)
        return tx_begin(rx, &cv, m);
    if (rx->tx.active && rx->tx.aborted && is_cmd(&cv, RPROF_CMD_EXEC))
        return tx_exec_aborted(rx, m);
    if (rx->tx.active && (is_cmd(&cv, RPROF_CMD_EXEC) || is_cmd(&cv, RPROF_CMD_DISCARD)))
        return tx_end(rx, &cv, m, buf);
    if (rx->tx.active)
        return tx_queue(rx, &cv, m, buf);
    size_t first;
    if (rprof_ack_args(rx->prof, &cv, &first))
        return command_ack(rx, &cv, m, buf, first);
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
    run_move(rx, SIDE_CLIENT);
    rx->blackholed = true;
    evbuffer_drain(rx->pend[SIDE_CLIENT], evbuffer_get_length(rx->pend[SIDE_CLIENT]));
    struct entry *e = entry_add(rx, false);
    if (e == NULL) {
        send_flush(rx, SIDE_UPSTREAM);
        session_abort(rx->s, SESSION_CLOSE_PROTOCOL_ERROR, SIDE_UPSTREAM);
        return;
    }
    static const char refusal[] = "-ERR Protocol error: invalid bulk length\r\n";
    evbuffer_add(e->bytes, refusal, sizeof(refusal) - 1);
    rx->held += sizeof(refusal) - 1;
    e->close_protocol = true;
    send_flush(rx, SIDE_UPSTREAM);
    flush_replies(rx);
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
    relay_unparsed(rx, rx->await, LOG_WARN, "resp reply not followed", "error", resp_strerror(rc));
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
        if ((rc == RESP_E_TOO_DEEP || rc == RESP_E_VALUE) && rx->await != NULL) {
            server_raw(rx, rc);
            return -1;
        }
        protocol_error(rx, SIDE_UPSTREAM, "server sent %s", resp_strerror(rc));
        return -1;
    }
    /* Not the session's error: it goes on, and Redis ends it. */
    log_unparsed(rx, LOG_WARN, "resp protocol error", "error", resp_strerror(rc),
                 "client bytes passed on unparsed from here; redis will refuse them");
    rx->raw = true;
    return -1;
}

/* Scans the message after the run in pend[side].  1 with *m and *buf set,
 * 0 when more bytes are needed, -1 after a protocol error (reported), 2
 * when big_try() took a long plain message (look at the next one). */
static int scan_one(struct rpx *rx, enum session_side side, struct resp_msg *m, const uint8_t **buf)
{
    struct rpx_window *w = &rx->win[side];
    size_t run = rx->run[side];
    if (w->p != NULL && w->len > run) {
        /* The usual case in a pipeline: the next message is in the chain
         * the run's messages were in, already looked at. */
        int rc = resp_scan(&rx->sc[side], w->p + run, w->len - run, m);
        if (rc == 1) {
            *buf = w->p + run;
            return 1;
        }
        if (rc < 0) {
            run_move(rx, side);
            return scan_error(rx, side, rc);
        }
    }
    struct evbuffer *pend = rx->pend[side];
    size_t n = evbuffer_get_length(pend);
    if (run > 0 && n == run)
        return 0; /* all of it is in the run: it stays there for send_flush() */
    /* At the start of a read, or a message beyond the first chain: the run
     * moves on and the message is scanned from the head (the scanner's
     * progress is relative to the message's start, which has not changed). */
    run_move(rx, side);
    n -= run;
    if (n == 0 || n < rx->need[side])
        return 0;
    size_t contig = evbuffer_get_contiguous_space(pend);
    size_t len = contig >= rx->need[side] && contig > 0 ? contig : n;
    int big;
    if (len > contig && (big = big_try(rx, side)) >= 0)
        return big == 1 ? 2 : 0;
    *buf = evbuffer_pullup(pend, (ev_ssize_t)len);
    int rc = resp_scan(&rx->sc[side], *buf, len, m);
    if (rc < 0)
        return scan_error(rx, side, rc);
    if (rc == 0) {
        size_t need = m->len > len ? m->len : len + 1;
        if (need <= n && len < n) {
            /* More is here, in other chains: the walker's, or look at all
             * of it. */
            if ((big = big_try(rx, side)) >= 0)
                return big == 1 ? 2 : 0;
            *buf = evbuffer_pullup(pend, (ev_ssize_t)n);
            len = n;
            rc = resp_scan(&rx->sc[side], *buf, n, m);
            if (rc < 0)
                return scan_error(rx, side, rc);
            if (rc == 0)
                need = m->len > n ? m->len : n + 1;
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
 * (resp_scan_reply_len) and joins the run, as on_reply() would after a full
 * scan.  Returns whether it took the next reply (and those after it). */
static bool plain_reply(struct rpx *rx)
{
    const struct rpx_window *w = &rx->win[SIDE_UPSTREAM];
    /* held counts the bytes waiting in entries: 0, and e->bytes is empty. */
    if (rx->need[SIDE_UPSTREAM] != 0 || rx->held != 0 || !win_open(rx, SIDE_UPSTREAM))
        return false;
    /* The rest of a pipeline's replies in one call. */
    bool took = false;
    while (w->len > rx->run[SIDE_UPSTREAM]) {
        struct entry *e = rx->await;
        if (e == NULL || !straight_out(rx, e))
            break;
        uint8_t type;
        size_t run = rx->run[SIDE_UPSTREAM];
        size_t len = resp_scan_reply_len(&rx->sc[SIDE_UPSTREAM], w->p + run, w->len - run, &type);
        if (len == 0 || resp_pairing_reply_simple(&rx->pairing, type) != 1)
            break;
        rx->run[SIDE_UPSTREAM] += len;
        entry_answered(rx, e, true);
        took = true;
    }
    return took;
}

static void process_server(struct rpx *rx)
{
    while (alive(rx)) {
        if (rx->await != NULL && rx->await->kind == RK_STREAM) {
            relay_stream(rx, rx->await);
            break;
        }
        if (plain_reply(rx))
            continue;
        struct resp_msg m;
        const uint8_t *buf;
        int rc = scan_one(rx, SIDE_UPSTREAM, &m, &buf);
        if (rc == 2 || (rc < 0 && alive(rx) && rx->await != NULL && rx->await->kind == RK_STREAM))
            continue; /* server_raw(): relayed from here */
        if (rc <= 0)
            break;
        on_reply(rx, buf, &m);
    }
    /* The run goes on in flush_replies(), which always follows. */
}

static void process_client(struct rpx *rx)
{
    /* Rules change only between events (a reload's post to this loop). */
    bool cmd_rules = codec_wants(rx->s, RULE_EV_COMMAND);
    while (alive(rx)) {
        if (rx->raw || rx->blackholed)
            run_move(rx, SIDE_CLIENT);
        if (rx->raw) {
            evbuffer_add_buffer(rx->out[SIDE_UPSTREAM], rx->pend[SIDE_CLIENT]);
            break;
        }
        if (rx->blackholed) {
            evbuffer_drain(rx->pend[SIDE_CLIENT], evbuffer_get_length(rx->pend[SIDE_CLIENT]));
            break;
        }
        uint64_t now = 0;
        if (rx->hold_until != 0 && rx->hold_until > (now = now_ms())) {
            arm_timer(rx, rx->hold_until);
            break;
        }
        rx->hold_until = 0;
        /* Grown before the pairing would count a transaction's commands
         * in a run (proto/resp.h: RESP_PAIRING_ROOM), so that up to the
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
        if (rc < 0 && rx->raw)
            continue;
        if (rc <= 0)
            break;
        enum cmd_result r = command(rx, buf, &m);
        if (r == CMD_WAIT) {
            /* Rescanned when the wait ends. */
            rx->need[SIDE_CLIENT] = 0;
            if (rx->hold_until != 0) {
                arm_timer(rx, rx->hold_until);
            } else if (rx->tx_wait_until != 0) {
                arm_timer(rx, rx->tx_wait_until);
            }
            break;
        }
        if (r == CMD_STOP)
            break;
    }
    /* The run goes on at send_flush(UPSTREAM), which always follows: from
     * pend itself when it is all of it. */
    if (rx->run[SIDE_CLIENT] == 0)
        rx->win[SIDE_CLIENT].p = NULL;
    /* Past the pipeline cap, or while holding, stop reading the client. */
    if (alive(rx)) {
        size_t waiting = evbuffer_get_length(rx->pend[SIDE_CLIENT]) - rx->run[SIDE_CLIENT];
        bool hold = waiting > SESSION_INPUT_HIGH && rx->need[SIDE_CLIENT] <= waiting;
        session_hold_reading(rx->s, SIDE_CLIENT, hold);
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct rpx *rx = arg;
    if (!alive(rx))
        return;
    if (rx->tx_wait_until != 0 && rx->tx_wait_until <= now_ms()) {
        rx->tx_waited = true;
        rx->tx_wait_until = 0;
    }
    flush_replies(rx);
    if (!alive(rx))
        return;
    process_client(rx);
    if (!alive(rx))
        return;
    send_flush(rx, SIDE_UPSTREAM);
    flush_replies(rx);
}

static void process_read(struct rpx *rx, enum session_side from)
{
    if (from == SIDE_UPSTREAM) {
        process_server(rx);
        if (!alive(rx))
            return;
        flush_replies(rx);
        /* Replies drained the FIFO: the client may go on, and what twice
         * answers itself there goes out now, not at the next event. */
        if (alive(rx) && evbuffer_get_length(rx->pend[SIDE_CLIENT]) > 0) {
            process_client(rx);
            if (alive(rx))
                flush_replies(rx);
        }
    } else {
        process_client(rx);
        if (!alive(rx))
            return;
        flush_replies(rx); /* twice's own answers */
    }
    if (alive(rx))
        send_flush(rx, SIDE_UPSTREAM);
}

static void rpx_process(void *state, enum session_side from, struct evbuffer *in)
{
    struct rpx *rx = state;
    if (!alive(rx))
        return;
    rx->win[from].p = NULL;
    /* Nothing waits from before (the usual case): the read is processed
     * where it is, and only what is left of it (a message cut short, a
     * command held) moves to pend afterwards.  An evbuffer_add_buffer per
     * read saved. */
    struct evbuffer *own = rx->pend[from];
    bool borrowed = evbuffer_get_length(own) == 0;
    if (borrowed)
        rx->pend[from] = in;
    else
        evbuffer_add_buffer(own, in);
    process_read(rx, from);
    if (borrowed) {
        rx->pend[from] = own; /* before anything else can run: a timer, the free */
        if (evbuffer_get_length(in) > 0)
            evbuffer_add_buffer(own, in);
    }
}

/* ---- codec ops --------------------------------------------------------- */

static void rpx_free(void *state);

static size_t held_max(const struct rpx *rx)
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
    resp_scanner_init(&rx->sc[SIDE_CLIENT], RESP_SIDE_CLIENT);
    resp_scanner_init(&rx->sc[SIDE_UPSTREAM], RESP_SIDE_SERVER);
    uint64_t max_message = s->cfg->l->max_message;
    if (max_message != 0 && max_message < RESP_MAX_BULK) {
        rx->sc[SIDE_CLIENT].max_bulk = max_message;
        rx->sc[SIDE_UPSTREAM].max_bulk = max_message;
    }
    rx->slots = malloc(RPX_PIPELINE_MIN * sizeof(*rx->slots));
    rx->timer = evtimer_new(s->loop->base, on_timer, rx);
    for (int i = 0; i < 2; i++) {
        rx->pend[i] = evbuffer_new();
        rx->out[i] = evbuffer_new();
    }
    if (rx->slots == NULL || rx->timer == NULL || rx->pend[0] == NULL || rx->pend[1] == NULL ||
        rx->out[0] == NULL || rx->out[1] == NULL) {
        rpx_free(rx);
        return NULL;
    }
    resp_pairing_init(&rx->pairing, rx->slots, RPX_PIPELINE_MIN);
    return rx;
}

static void rpx_stop(void *state)
{
    struct rpx *rx = state;
    rx->stopped = true;
    if (rx->timer != NULL)
        event_del(rx->timer);
}

static void rpx_free(void *state)
{
    struct rpx *rx = state;
    while (rx->head != NULL) {
        struct entry *e = rx->head;
        rx->head = e->next;
        entry_free(e);
    }
    while (rx->spare != NULL) {
        struct entry *e = rx->spare;
        rx->spare = e->next;
        entry_free(e);
    }
    tx_reset(&rx->tx);
    for (int i = 0; i < 2; i++) {
        if (rx->pend[i] != NULL)
            evbuffer_free(rx->pend[i]);
        if (rx->out[i] != NULL)
            evbuffer_free(rx->out[i]);
    }
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
    free(rx);
}

const struct codec_ops resp_codec_ops = {
    .name = "resp",
    .open = rpx_open,
    .stop = rpx_stop,
    .free = rpx_free,
    .process = rpx_process,
    .closed_by = NULL,
};
