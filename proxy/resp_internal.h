/*
 * resp_internal.h - what the four files of the RESP layer share: a session's state (struct
 * rpx), the queue of replies owed to its client (struct entry), its transaction (struct tx),
 * and the functions one file calls in another.  Only those files include it:
 *
 *   resp_proxy.c    the codec: byte loops, commands, replication, the codec's ops
 *   resp_replies.c  the replies owed to the client: entries, their order, delays and cuts,
 *                   replies twice makes (errors), and the server's replies as they come
 *   resp_jobs.c     the job events: deliveries read from replies, publishes and acks decided
 *                   by the rules, journaled, and carried out
 *   resp_tx.c       transactions: read whole ahead, decided once, answered command by command
 *
 * What a command or reply means to a framework is proto/resp_profile.h's; these files decide
 * and do the I/O.
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
/* How long twice waits for the rest of a transaction it must read whole.  A transaction
 * longer than RPROF_TX_PEEK_MAX bytes or RPROF_TX_MAX commands is forwarded without faults on
 * its commands. */
#define RPX_TX_WAIT_MS 100u
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
    bool redelivered;       /* RPROF_REPLY_XREAD re-reading the pending list */
    bool head;              /* RPROF_REPLY_POP: the pop took its list's head (LPOP, BLPOP,
                               LMOVE LEFT): a copy goes back there */
    bool hide;              /* the server's reply is for twice only (a DISCARD it sent) */
    uint8_t kind;           /* enum rprof_reply or enum reply_kind */
    uint32_t more;          /* RPROF_REPLY_PLAIN: replies owed after the next one (forward_plain) */
    int64_t add;            /* RK_ADD_INT */
    const struct rule *close_after;
    bool close_protocol; /* the session ends once this went out (protocol_error) */
    char
        *arg; /* RPROF_REPLY_POP: the list; RPROF_REPLY_RQ_HASH: job id; RPROF_REPLY_XADD: stream */
    char *arg2;                /* RPROF_REPLY_XADD: task; RPROF_REPLY_POP (list profile): the list a
                                  move puts the job on (a processing list), NULL for a plain pop */
    struct txcmd *tx;          /* RK_EXEC */
    struct resp_reply_tag tag; /* RK_FRAMEWORK: owned, read by fw */
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
    bool any;               /* some command is answered by twice */
    bool aborted;           /* twice refused a queued command: EXEC becomes EXECABORT */
    struct evbuffer *later; /* kept-back acks to apply later (delay) */
    size_t later_n;
    uint32_t later_ms;
    struct evbuffer *now; /* commands for twice's connection once EXEC went (re-push) */
    size_t now_n;
    struct evbuffer *copies; /* re-pushes of late copies (`redeliver after D`), due copies_ms on */
    struct evbuffer *after_exec; /* copies of its publishes (`duplicate`), sent once it ran */
    size_t after_exec_n;
    size_t copies_n;
    uint32_t copies_ms;
    const struct rule *close_after;
};

/* The first chain of a pending buffer, as scan_one() last saw it: valid
 * until bytes leave that buffer's head (rpx_run_move() forgets it). */
struct rpx_window {
    const uint8_t *p; /* NULL: not known */
    size_t len;
};

struct rpx {
    struct session *s;
    enum rprof prof;
    const struct resp_framework *fw; /* the profile's module (proto/jobs/), or NULL */
    struct job_host host;            /* what the module asks of the session (resp_host.c) */
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
    /* Copies of publishes a `duplicate` rule sends again (pub_copy()), for the caller of
     * rpx_publish_decide() to send on twice's own connection: at once, or after EXEC. */
    struct evbuffer *pub_copies;
    size_t n_pub_copies;
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
    /* RQ: the job whose lease this connection lost (resp_rq.c), its renewals applied
     * rq_lost_ms later (delay) or never (0); NULL: none. */
    char *rq_lost;
    uint32_t rq_lost_ms;
};

/* Replies shorter than this are copied into the client's output rather than
 * handed over as buffer chains. */
#define RPX_COALESCE 4096u

/* Entries kept for reuse per session (an entry per command otherwise costs
 * two allocations). */
#define RPX_SPARE_MAX 64u

enum { SETUP_AUTH, SETUP_HELLO, SETUP_SELECT };
enum { DECIDED_COMMAND = 1, DECIDED_ALL = 2 };

/* What a command's handling did: done, wait for more bytes or for a hold to end, stop reading
 * the client (the session ends or is blackholed). */
enum cmd_result { CMD_DONE, CMD_WAIT, CMD_STOP };

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

/* ---- small helpers ------------------------------------------------------------------------ */

static inline bool rpx_alive(const struct rpx *rx)
{
    return !rx->stopped && rx->s->state == SESSION_RELAYING;
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

void rpx_run_move(struct rpx *rx, enum session_side side);
void rpx_send_flush(struct rpx *rx, enum session_side to);
void rpx_cut(struct rpx *rx, const struct rule *r);
int rpx_encode_cmd(struct evbuffer *b, size_t argc, const char *const *argv, const size_t *lens);
void rpx_aux_send_at(struct rpx *rx, struct evbuffer *cmds, size_t n, uint32_t ms);
void rpx_repush(struct rpx *rx, const char *cmd, const char *list, const void *val, size_t len,
                uint32_t later_ms);
struct entry *rpx_forward(struct rpx *rx, const struct rprof_cmdview *cv, const struct resp_msg *m,
                          const uint8_t *buf, size_t len);
void rpx_swallow(struct rpx *rx, size_t len);
/* Reply bytes one session may hold back (delay) before twice stops reading the server: the
 * listener's `max-held`, else CONF_DEFAULT_MAX_HELD. */
size_t rpx_held_max(const struct rpx *rx);

/* ---- resp_replies.c ---- */

struct entry *rpx_entry_add(struct rpx *rx, bool server);
void rpx_entry_free(struct entry *e);
void rpx_answer(struct rpx *rx, const void *bytes, size_t len);
void rpx_send_own(struct rpx *rx, const char *cmd, size_t len);
bool rpx_owe_reply(struct rpx *rx);
void rpx_cut_at_turn(struct rpx *rx, const struct rule *r, struct entry *e);
void rpx_arm_timer(struct rpx *rx, uint64_t at);
void rpx_flush_replies(struct rpx *rx);
void rpx_answer_error(struct rpx *rx, const struct rule *r);
bool rpx_straight_out(const struct rpx *rx, const struct entry *e);
void rpx_entry_answered(struct rpx *rx, struct entry *e, bool sent);
void rpx_on_reply(struct rpx *rx, const uint8_t *buf, const struct resp_msg *m);

/* ---- resp_jobs.c ---- */

/* A job event as the profiles read it: journaled and decided by the functions below. */
struct rpx_job {
    enum rule_event kind;
    char *id;
    char *task;
    char *queue;
    const char *key;
    bool redelivered;
    unsigned retries;         /* the app's retries before (struct resp_job) */
    bool retry;               /* a publish of a job the app ran before */
    bool refused;             /* ACK, NACK: the framework refused the settlement (journal.proto) */
    bool kept_back;           /* ACK, NACK: a rule kept it from the broker (journal.proto) */
    uint64_t started_unix_us; /* RUNNING: the run started no later than this (journal.proto) */
    const char *run;          /* RUNNING: which run of the job */
    bool oom; /* a field could not be copied: the event is skipped (job_event_oom()) */
};

/* A copy of s for a field of j; NULL for NULL, and on allocation failure, which j->oom
 * remembers. */
char *rpx_jdup(struct rpx_job *j, const char *s);
/* A copy, for a field of j, of the task the map remembers for job id[0..n) on this listener;
 * NULL when it remembers none. */
char *rpx_known_task(struct rpx *rx, struct rpx_job *j, const char *id, size_t n);
void rpx_job_event_clear(struct rpx_job *j);
void rpx_journal_job(struct rpx *rx, enum journal_kind kind, const struct rpx_job *j);
/* Journals a RUNNING record for each job in progress that Sidekiq's heartbeat cv lists
 * (rprof_sidekiq_work(); the process identity is cv->key[0..identity_len)). */
void rpx_sidekiq_journal_running(struct rpx *rx, const struct rprof_cmdview *cv,
                                 size_t identity_len);
/* Whether the journal or a rule on job events needs what a job's payload holds. */
bool rpx_jobs_needed(struct rpx *rx);
void rpx_job_engine_event(struct rpx *rx, const struct rpx_job *j, struct engine_event *ev,
                          char *anon);
/* The rule that acts on a job event (the first that fires, in file order), or NULL; the event
 * is counted when no rule looks at its kind. */
const struct rule *rpx_decide_job(struct rpx *rx, struct rpx_job *j);
/* Sends cmd (one whole command, emptied) to Redis in place of the client's command at the head
 * of pend[CLIENT] (len bytes, dropped): its reply is owed to the client as the original's.
 * The entry, or NULL when cmd does not scan or the pairing refuses it (the caller forwards the
 * original then). */
struct entry *rpx_forward_instead(struct rpx *rx, struct evbuffer *cmd, size_t len);

size_t rpx_decide(struct rpx *rx, struct engine_event *ev, size_t *hits);
const struct rule *rpx_hit_rule(struct rpx *rx, size_t idx);
bool rpx_pop_reply_counted(struct rpx *rx, struct entry *e, const uint8_t *buf,
                           const struct resp_msg *m);
void rpx_on_pop_reply(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m,
                      struct evbuffer *reply);
void rpx_on_stream_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                         const struct resp_msg *m, struct evbuffer *reply);
void rpx_on_rq_hash(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m);
void rpx_on_xadd_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                       const struct resp_msg *m);
void rpx_ack_plan_free(struct ack_plan *p);
int rpx_plan_acks(struct rpx *rx, const struct rprof_cmdview *cv, size_t first, struct ack_plan *p);
const struct rule *rpx_stream_publish_decide(struct rpx *rx, const struct rprof_cmdview *cv);
size_t rpx_drop_reply(const struct rpx *rx, char *out, size_t cap);
/* Jobs saved as ones that ran that a transaction's first pass remembers: RQ's retry of one job,
 * or its registry cleanup and scheduler retrying a few in one pipeline. */
#define RPX_RQ_RAN_MAX 16

/* What a transaction's first pass saw of RQ's job saves, for the pushes in it. */
struct rpx_rq_saved {
    char task[RPROF_TASK_MAX]; /* the task of the last job saved; "" when none */
    /* The transaction reaps lapsed jobs from a started registry (rprof_rq_reaps()): its pushes
     * are RQ handing out again jobs whose lease lapsed, not retries the app asked for. */
    bool reaps;
    /* The ids of jobs saved as ones that ran (rprof_rq_job_ran()): their pushes are retries
     * the app asked for.  Past RPX_RQ_RAN_MAX, later ones are not remembered. */
    char ran[RPX_RQ_RAN_MAX][RPROF_KEY_MAX];
    size_t n_ran;
};
const struct rule *rpx_publish_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                      const struct rpx_rq_saved *rq);
enum cmd_result rpx_command_ack(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                                const uint8_t *buf, size_t first);
enum cmd_result rpx_command_list_ack(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct resp_view *job);
void rpx_tag_reply(struct rpx *rx, struct rprof_cmdview *cv, struct entry *e);

/* ---- resp_host.c ---- */

/* The session as its framework module's host (proto/jobs/job.h), up to date with the rules. */
const struct job_host *rpx_host(struct rpx *rx);
/* Journals job event j as a record of kind (nothing without a journal). */
void rpx_journal_event(struct rpx *rx, enum journal_kind kind, const struct job_event *j);
/* Sets up rx->host (at open). */
void rpx_host_init(struct rpx *rx);
/* Carries out plan p of the command at the head of pend[CLIENT] (cv, m, buf); frees it. */
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

/* ---- resp_rq.c ---- */

enum rpx_lease_fate { RPX_LEASE_KEEP, RPX_LEASE_DROP, RPX_LEASE_LATE };

/* What becomes of one renewal of a lease. */
struct rpx_lease {
    enum rpx_lease_fate fate;
    uint32_t ms;              /* RPX_LEASE_LATE: applied that much later */
    const struct rule *close; /* a `close` rule on it, before or after */
};

/* RQ's renewal cv of the job whose id is *idv (rprof_rq_lease()): its `lease` event, or the
 * loss an earlier fault on this connection made. */
struct rpx_lease rpx_rq_lease_decide(struct rpx *rx, const struct rprof_cmdview *cv,
                                     const struct resp_view *idv);
/* The renewal outside a transaction: forwarded, answered and kept back, or sent later. */
enum cmd_result rpx_rq_command_lease(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct resp_view *idv);
/* RQ's move of job *idv into its failed registry (rprof_rq_failed()): a NACK in the journal. */
void rpx_rq_journal_failed(struct rpx *rx, const struct rprof_cmdview *cv,
                           const struct resp_view *idv);
/* The connection popped a job: the lease it lost (if any) is over, a run of that job again is
 * decided anew.  Also at its end. */
void rpx_rq_forget_lease(struct rpx *rx);

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
