/*
 * resp_internal.h - what the files of the RESP layer share: a session's state (struct rpx), the
 * queue of replies owed to its client (struct entry), its transaction (struct tx), and the
 * functions one file calls in another.  Only those files include it:
 *
 *   resp_proxy.c    the codec: byte loops, commands, replication, the codec's ops
 *   resp_replies.c  the replies owed to the client: entries, their order, delays and cuts,
 *                   replies twice makes (errors), and the server's replies as they come
 *   resp_host.c     the session as the host of its framework module (proto/jobs/), and the one
 *                   place the module's plans are carried out
 *   resp_tx.c       transactions: read whole ahead, planned once, answered command by command
 *
 * What a command or reply means to a framework, and what it would answer after a fault, is the
 * module's; these files do the I/O.
 */
#ifndef TWICE_RESP_INTERNAL_H
#define TWICE_RESP_INTERNAL_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "proto/jobs/framework.h"
#include "proto/resp/resp.h"
#include "proto/resp/resp_job.h"
#include "proto/resp/resp_profile.h"
#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/net/codec.h"
#include "proxy/net/fault.h"
#include "proxy/net/pump.h"
#include "proxy/net/session.h"
#include "proxy/resp/idmap.h"
#include "proxy/resp/resp_aux.h"
#include "rules/engine.h"
#include "rules/plan.h"

/* Commands awaiting replies: the pairing FIFO starts this small and grows to
 * RPX_PIPELINE_MAX; past it, twice stops reading the client until replies
 * come back (a transaction's queued commands, which only its EXEC answers in
 * full, are then counted in one slot by the pairing, never waited for). */
#define RPX_PIPELINE_MIN 16u
#define RPX_PIPELINE_MAX 4096u
/* How long twice waits for the rest of a transaction it must read whole.  A transaction
 * longer than RPROF_TX_PEEK_MAX bytes or RPROF_TX_MAX commands is forwarded without faults on
 * its commands. */
#define RPX_TX_WAIT_MS 100u
/* A reply passed on unread goes on before its end once this much of it is here (stream_part). */
#define RPX_STREAM_MIN (16u * 1024u)
/* Stream entry ids (RPROF_ID_MAX) and task names (RPROF_TASK_MAX) longer than their limits
 * are logged once per session (`msg="resp field too long"`): such an entry is relayed with no
 * event, and such a task name is not used (a cut name would be another task's). */

/* What twice must look at in a forwarded command's reply: enum rprof_reply, or one of these,
 * which are twice's own. */
enum reply_kind {
    RK_EXEC = RPROF_REPLY_END, /* a transaction with commands twice answered */
    RK_ADD_INT,                /* an XACK with ids kept back: add them to the count */
    RK_STREAM,                 /* SYNC / PSYNC: the server's bytes from here on, as they come */
    RK_FRAMEWORK,              /* read by the listener's framework module (entry.tag) */
};

/* One queued command of a transaction, as twice answers it in EXEC. */
struct txcmd {
    bool suppress;          /* kept back: twice answers it */
    struct evbuffer *synth; /* suppress: its element in EXEC's array */
    int64_t add;            /* forwarded XACK with ids kept back */
    /* owned: what the framework module reads of its element in EXEC's reply */
    struct resp_reply_tag tag;
    const struct resp_framework *fw;
};

/* A reply owed to the client. */
struct entry {
    struct entry *next;
    struct evbuffer *bytes; /* what goes out (twice's, or the server's once read) */
    uint64_t release_ms;    /* not before (delay) */
    bool server;            /* the server answers it */
    bool done;              /* bytes is complete */
    bool hide;              /* the server's reply is for twice only (a DISCARD it sent) */
    uint8_t kind;           /* RPROF_REPLY_PLAIN or enum reply_kind */
    uint32_t more;          /* RPROF_REPLY_PLAIN: replies owed after the next one (forward_plain) */
    int64_t add;            /* RK_ADD_INT */
    const struct rule *close_after;
    bool close_protocol;             /* the session ends once this went out (protocol_error) */
    struct txcmd *tx;                /* RK_EXEC */
    struct resp_reply_tag tag;       /* RK_FRAMEWORK: owned, read by fw */
    const struct resp_framework *fw; /* RK_FRAMEWORK */
    /* RK_EXEC: commands for twice's own connection once EXEC's reply shows the transaction
     * ran (copies of its pushes: the job's hash is saved by then), n_after of them */
    struct evbuffer *after;
    size_t n_after;
    size_t ntx;
};

struct tx {
    bool active;  /* MULTI went through; EXEC/DISCARD not yet */
    bool planned; /* twice read it whole and decided */
    size_t idx;   /* queued commands processed */
    struct txcmd *cmds;
    size_t n;
    bool any;     /* some command is answered by twice */
    bool aborted; /* twice refused a queued command: EXEC becomes EXECABORT */
    /* Commands for twice's own connection: own[i] sent own[i].ms after EXEC went (0: as it
     * goes); after_exec once EXEC's reply shows the transaction ran.  The module's plan's. */
    struct resp_own own[RESP_PLAN_OWN_MAX];
    size_t n_own;
    struct resp_own after_exec;
    const struct rule *close_after;
};

/*
 * The phase of a session's client side: what twice does with the client's next bytes.  One
 * field (rpx.phase), changed only by rpx_set_phase(), which refuses (logs at error level, and
 * asserts in a debug build) a move not drawn here:
 *
 *               delay, a plan's hold               MULTI, the rest of it not here
 *     HOLDING <---------------------- RELAYING -----------------------------> TX_WAIT
 *        |    ---------------------->  |  |    <------------------------------   |
 *        |        the hold is over     |  |      planned, or waited enough       |
 *        |                             |  |  a drop, a cut at a reply's turn,    |
 *        |                             |  v  a bulk over max-message-size        |
 *        |                             | BLACKHOLED                              |
 *        |                             v  v                                      |
 *        +---------------------------> RAW <-------------------------------------+
 *            a peer broke RESP (the client, or a server reply twice cannot follow),
 *            or replication began (SYNC, PSYNC)
 *
 *     any phase --> STOPPED: the codec was stopped, the session ends.
 *
 * RAW, BLACKHOLED and STOPPED last to the session's end (setting one again is no move).  The
 * decision of the command at the head while it holds or waits is not the phase's: it is
 * rx->decision's.
 */
enum rpx_phase {
    RPX_RELAYING,   /* commands are read, decided and handled one by one */
    RPX_HOLDING,    /* the command at the head of in[CLIENT] waits until hold_until (a
                       `delay`, or a plan's hold), decided already; nothing behind it is read */
    RPX_TX_WAIT,    /* the MULTI at the head waits for the rest of its transaction until
                       tx_wait_until (RPX_TX_WAIT_MS); read again as more comes */
    RPX_RAW,        /* the client's bytes go to Redis as they are: it broke RESP, began a
                       replication stream, or the server's replies are relayed unparsed */
    RPX_BLACKHOLED, /* the client's further bytes are discarded: a `drop`, a cut due at a
                       reply's turn, a bulk over max-message-size */
    RPX_STOPPED,    /* the codec was stopped: the session ends, nothing more is done */
};

/* The decision of the client's command at the head of in[CLIENT], made once and kept while
 * the command waits (RPX_HOLDING, RPX_TX_WAIT: it is read again then); forgotten once the
 * command is done (process_client()). */
struct rpx_decision {
    bool decided;           /* its `command` rules were asked (and the event counted) */
    bool seen;              /* the module saw it (framework.h's seen) */
    bool planned;           /* the module planned it: read again (a hold), not planned again */
    struct job_fault fault; /* what the rules asked, until carried out (rpx_apply_cmd_plan) */
};

struct rpx {
    struct session *s;
    enum rprof prof;
    const struct resp_framework *fw; /* the profile's module (proto/jobs/), or NULL */
    struct job_host host;            /* what the module asks of the session (resp_host.c) */
    /* The own commands of a command held (a publish with a `delay` rule), sent once it goes. */
    struct resp_own held_own[RESP_PLAN_OWN_MAX];
    size_t n_held_own;
    enum rpx_phase phase;         /* changed only by rpx_set_phase() */
    uint64_t hold_until;          /* RPX_HOLDING: the command at the head waits until then */
    uint64_t tx_wait_until;       /* RPX_TX_WAIT: its MULTI waits for the rest until then */
    struct rpx_decision decision; /* of the command at the head of in[CLIENT] */
    struct resp_scanner sc[2];
    size_t need[2]; /* bytes in[side] must hold before scanning again */
    /* The bytes on their way (pump.h): in[side] read from side, not processed yet; run[side]
     * its head passed on already; win[side] its first chain as scan_one() last saw it;
     * out[side] batched toward side. */
    struct pump pump;
    bool streaming;     /* the reply being read is passed on as it comes (stream_part) */
    bool said_too_long; /* "resp field too long" was logged for this session */
    struct resp_pairing pairing;
    struct resp_cmd *slots;
    struct entry *head, *tail; /* replies owed to the client */
    struct entry *await;       /* oldest server entry still waiting for its reply */
    size_t held;               /* bytes in entries not sent */
    struct event *timer;       /* client hold end, delayed reply release, tx wait */
    struct tx tx;
    struct evbuffer *setup[3]; /* the client's last AUTH, HELLO, SELECT */
    struct resp_aux *aux;
    uint64_t anon;
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

/* What a command's handling did: done, wait for more bytes or for a hold to end, stop reading
 * the client (the session ends or is blackholed). */
enum cmd_result { CMD_DONE, CMD_WAIT, CMD_STOP };

/* ---- small helpers ------------------------------------------------------------------------ */

static inline bool rpx_alive(const struct rpx *rx)
{
    return rx->phase != RPX_STOPPED && rx->s->state == SESSION_RELAYING;
}

static inline const char *rpx_scope(const struct rpx *rx)
{
    return rx->s->cfg->l->name;
}

/* Like resp_args_next, with the element's byte range [*start, *end). */
static inline int rpx_walk_next(struct resp_args *it, struct resp_view *v, size_t *start,
                                size_t *end)
{
    *start = it->pos;
    int rc = resp_args_next(it, v);
    *end = it->pos;
    return rc;
}

static inline bool rpx_is_cmd(const struct rprof_cmdview *cv, enum rprof_cmd id)
{
    return cv->id == id;
}

/* ---- resp_proxy.c ---- */

/* Moves the client side to phase `to` (until: the deadline of RPX_HOLDING or RPX_TX_WAIT, else
 * 0).  An illegal move (the diagram above) is refused: logged at error level, and an assertion
 * fails in a debug build.  Returns whether the phase is `to` now. */
bool rpx_set_phase(struct rpx *rx, enum rpx_phase to, uint64_t until);

void rpx_cut(struct rpx *rx, const struct rule *r);
int rpx_encode_cmd(struct evbuffer *b, size_t argc, const char *const *argv, const size_t *lens);
void rpx_aux_send_at(struct rpx *rx, struct evbuffer *cmds, size_t n, uint32_t ms);
struct entry *rpx_forward(struct rpx *rx, const struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, size_t len);
void rpx_swallow(struct rpx *rx, size_t len);
/* Sends cmd (one whole command, emptied) to Redis in place of the client's command at the head
 * of in[CLIENT] (len bytes, dropped): its reply is owed to the client as the original's.
 * The entry, or NULL when cmd does not scan or the pairing refuses it (the caller forwards the
 * original then). */
struct entry *rpx_forward_instead(struct rpx *rx, struct evbuffer *cmd, size_t len);
/* Reply bytes one session may hold back (delay) before twice stops reading the server: the
 * listener's `max-held`, else CONF_DEFAULT_MAX_HELD. */
size_t rpx_held_max(const struct rpx *rx);

/* ---- resp_replies.c ---- */

/* A new entry at the tail of the replies owed; NULL when memory ran out (the pump stopped). */
struct entry *rpx_entry_add(struct rpx *rx, bool server);
void rpx_entry_free(struct entry *e);
void rpx_answer(struct rpx *rx, const void *bytes, size_t len);
void rpx_send_own(struct rpx *rx, const char *cmd, size_t len);
bool rpx_owe_reply(struct rpx *rx);
void rpx_cut_at_turn(struct rpx *rx, const struct rule *r, struct entry *e);
void rpx_arm_timer(struct rpx *rx, uint64_t at);
void rpx_flush_replies(struct rpx *rx);
/* The error reply of an `error` rule r, encoded into b. */
void rpx_error_reply(const struct rule *r, struct resp_bytes *b);
/* `close before` / `close after` of the command at the head of in[CLIENT] (len bytes), the
 * one place a command's cut is made: before, it is kept from Redis and the session ends at its
 * turn; after, once the reply owed in entry e went out.  CMD_STOP. */
enum cmd_result rpx_cut_command(struct rpx *rx, const struct rule *r, bool before, struct entry *e,
                                size_t len);
bool rpx_straight_out(const struct rpx *rx, const struct entry *e);
void rpx_entry_answered(struct rpx *rx, struct entry *e, bool sent);
void rpx_on_reply(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m);

/* ---- resp_host.c ---- */

/* The session as its framework module's host (proto/jobs/job.h), up to date with the rules. */
const struct job_host *rpx_host(struct rpx *rx);
/* Journals job event j as a record of kind (nothing without a journal). */
void rpx_journal_event(struct rpx *rx, enum journal_kind kind, const struct job_event *j);
/* Sets up rx->host (at open), the module's state included: 0, or -1 out of memory. */
int rpx_host_init(struct rpx *rx);
/* Frees the module's state (at the session's end). */
void rpx_host_free(struct rpx *rx);
/* Forgets the own commands of a held command. */
void rpx_held_own_free(struct rpx *rx);
/* Whether the journal or a rule on job events needs what a job's payload holds. */
bool rpx_jobs_needed(struct rpx *rx);
/* The rule that acts on ev, the first that fires (codec_decide()); 0 or 1 of them. */
size_t rpx_decide(struct rpx *rx, struct engine_event *ev, size_t *hits);
/* The rule of a hit, its ruleset pinned for the session (a reload may drop it meanwhile). */
const struct rule *rpx_hit_rule(struct rpx *rx, size_t idx);
/* A reply of entry e (RK_FRAMEWORK) that nothing reads a job from, passed on as a plain one and
 * counted as a delivery; false when it must be read. */
bool rpx_framework_counted(struct rpx *rx, struct entry *e, const uint8_t *buf,
                           const struct resp_msg *m);
/* The plan of a command that the `command` rules fault (f, not JOB_FAULT_NONE) into *p (zeroed
 * by the caller), carried out by rpx_apply_cmd_plan() as a module's. */
void rpx_cmd_plan_of_fault(const struct job_fault *f, struct resp_cmd_plan *p);
/* Carries out plan p of the command at the head of in[CLIENT] (cv, m, buf): a module's, or
 * the `command` rules' (rpx_cmd_plan_of_fault()); frees it.  The one place a command's fate is
 * carried out. */
enum cmd_result rpx_apply_cmd_plan(struct rpx *rx, const struct rprof_cmdview *cv,
                                   const struct resp_msg *m, const uint8_t *buf,
                                   struct resp_cmd_plan *p);
/* Carries out plan p of the reply entry e awaited (a copy of it in `reply`, which the plan may
 * replace); frees it. */
void rpx_apply_reply_plan(struct rpx *rx, struct entry *e, struct evbuffer *reply,
                          struct resp_reply_plan *p);
/* The framework module reads reply m of entry e (RK_FRAMEWORK). */
void rpx_framework_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                         const struct resp_msg *m, struct evbuffer *reply);

/* ---- resp_tx.c ---- */

void rpx_on_exec_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m, struct evbuffer *reply);
void rpx_tx_reset(struct tx *t);
enum cmd_result rpx_tx_begin(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m);
enum cmd_result rpx_tx_exec_aborted(struct rpx *rx, const struct resp_msg *m);
enum cmd_result rpx_tx_end(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                           const uint8_t *buf);
enum cmd_result rpx_tx_queue(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                             const uint8_t *buf);

#endif
