/*
 * amqp_internal.h - what the three files of the AMQP layer share: a connection's state
 * (struct amqp_px), its channels, held frames and message records, and the functions one file
 * calls in another.  Only those files include it:
 *
 *   amqp_proxy.c    the codec: frames and methods, channels, sending, rules, the codec's ops
 *   amqp_settle.c   frames held back (delay), and settlements: the client's acks, nacks and
 *                   rejects per delivery tag, held, swallowed, replaced or sent late
 *   amqp_content.c  contents: a delivery's or publish's method, header and body frames, read
 *                   whole enough to decide, then forwarded, held, dropped or duplicated
 *
 * What the bytes mean is proto/amqp/amqp.h's and proto/amqp/amqp_ledger.h's; these files decide and
 * do the I/O.
 */
#ifndef TWICE_AMQP_INTERNAL_H
#define TWICE_AMQP_INTERNAL_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_app.h"
#include "proto/amqp/amqp_ledger.h"
#include "proto/amqp/amqp_plan.h"
#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/net/codec.h"
#include "proxy/net/fault.h"
#include "proxy/net/pump.h"
#include "proxy/net/session.h"
#include "rules/engine.h"
#include "rules/plan.h"

/* Most channels one connection may use through twice (RabbitMQ's default
 * channel_max is 2047). */
#define AMQP_PX_MAX_CHANNELS 2048
/* Largest body a `body~` matcher is given (bodies above it are matched as
 * absent): the body of such a message is held until it is complete. */
#define AMQP_PX_BODY_MATCH_MAX (1u << 20)
/* Room for the frames one settlement can turn into. */
#define AMQP_PX_FRAME_SPACE 512

enum dir {
    DIR_UP = SIDE_CLIENT,     /* client -> broker: frames read from the client */
    DIR_DOWN = SIDE_UPSTREAM, /* broker -> client */
};

/* Bytes of a message's strings kept inside its msg_info: an exchange, a
 * routing key, a consumer tag, a queue, a uuid and a task name fit. */
#define MSG_INFO_POOL 256

/* What a later event needs to know of a message. */
struct msg_info {
    char *queue;
    char *exchange;
    char *routing_key;
    char *consumer_tag;
    char *message_id;
    char *task;
    bool redelivered;
    uint32_t retries; /* the app's retries of the message before (amqp_app_retries()) */
    uint64_t tag;
    struct event *timer;        /* hold release (a held settlement) */
    struct event *expire_timer; /* expire: the delivery's visibility timeout */
    /* A late copy (`redeliver after D` on its ack, `duplicate after D` on its delivery): at
     * late_timer twice requeues the message upstream.  hold_ack: until then the client's ack
     * is held, never forwarded (duplicate); a redeliver's held ack is its rule's. */
    struct event *late_timer;
    bool hold_ack;
    uint32_t late_ms; /* the D of the late copy, for its log line */
    struct achan *ch;
    /* An armed `expire`: its rule (kept alive by a ruleset reference), noted
     * as a fault only if the timer fires before the ack. */
    const struct rule *expire_rule;
    struct ruleset *expire_rules;
    /* The rule that holds or dropped the message's ack: the fault a visibility timeout that
     * runs out meanwhile is noted as (kept alive the same way). */
    const struct rule *ack_rule;
    struct ruleset *ack_rules;
    /* The rule of a late copy (`redeliver after D`, `duplicate after D`) that holds the ack:
     * named when a shutdown drops it (kept alive the same way). */
    const struct rule *late_rule;
    struct ruleset *late_rules;
    /* The strings above live here when they fit (one allocation per
     * message instead of one per string); longer ones are malloc'd. */
    size_t pool_used;
    bool heap_strs;              /* a string above lives outside the pool */
    struct msg_info *next_spare; /* in the connection's spares */
    char pool[MSG_INFO_POOL];
};

/* Records a connection keeps for its next messages instead of freeing
 * them: a read of acks frees as many as the read of deliveries before it
 * took (glibc's per-thread cache keeps only 7 of this size).  At most
 * AMQP_PX_SPARE_INFOS.  Once a second (amqp_tick) they are cut to
 * AMQP_PX_SPARE_IDLE beyond the records in use: a connection whose messages
 * are all settled keeps ~3 KiB of them, not ~48 KiB.  Cut on every free
 * instead, a consumer's deliveries, acked one by one down to none in use,
 * left 8 spares for the next read of 100: most records were malloc'd. */
#define AMQP_PX_SPARE_INFOS 128
#define AMQP_PX_SPARE_IDLE 8

/* Bytes of a content's first frames kept without an evbuffer chain; one
 * such array per connection and direction, held by one content at a time
 * (a connection rarely has two undecided contents in one direction). */
#define AMQP_PX_STASH_SMALL 1024

/* A content sequence (method, header, bodies) crossing in one direction. */
struct content {
    bool active;
    bool decided;
    bool needs_body; /* a rule matches on the body: decide when complete */
    enum { FATE_FORWARD, FATE_DROP, FATE_HOLD } fate;
    uint32_t method; /* AMQP_BASIC_DELIVER, ... */
    uint64_t body_left;
    struct evbuffer *stash; /* frames kept until the decision */
    struct evbuffer *body;  /* body bytes for a body matcher */
    struct msg_info *info;  /* being built; handed to the ledger or freed */
    uint64_t tag;
    bool ack_required;
    bool close_after;   /* `close after`: cut once the content is through */
    struct held *entry; /* FATE_HOLD: the held run this content goes into */
    bool header_seen;
    uint8_t *headers_copy;     /* the headers table, when deciding after the body */
    struct amqp_bytes headers; /* valid only during the decision */
    /* The first frames kept until the decision (a method and its header,
     * usually), copied into the connection's small stash of this direction
     * while this content holds it, rather than moved as chains of their
     * own (a chain allocated and freed per message otherwise).  Bytes go to
     * `stash` once they do not fit, after what is there (stash_put). */
    uint8_t *small; /* NULL: not holding it */
    size_t small_len;
    bool stash_used; /* bytes went into `stash` since it was last emptied */
    /* The listener's `message-id` / `task` sources (conf): the index of the one whose value the
     * header gave, MSG_FIELD_MAX_SOURCES if none; body.json sources before it are read once
     * the body is here (ident_from_body). */
    uint8_t id_at, task_at;
    /* A publish a rule may duplicate: its frames, copied as they pass (from the method on,
     * while a rule on publishes exists), sent again after it when `dup` (content_end). */
    struct evbuffer *copy;
    bool dup;
};

/* Frames held on a channel in one direction, released in order. */
struct held {
    uint64_t release_ms; /* 0: right after the one before */
    bool open;           /* a held content still receiving frames */
    struct evbuffer *frames;
    struct held *next;
};

/* tag and queue: NUL-terminated copies of shortstrs, kept with their lengths so that a delivery
 * compares its consumer tag, and copies the queue's name, without a strlen. */
struct consumer {
    char *tag;
    char *queue;
    uint8_t tag_len, queue_len;
    bool no_ack;
};

struct achan {
    uint16_t id;
    struct amqp_px *ax;
    struct amqp_ledger *ledger;
    struct content content[2]; /* by the side frames come from */
    struct held *held[2], *held_tail[2];
    struct event *held_timer[2];
    struct evbuffer *inject[2]; /* frames twice sends toward side [to] */
    bool injected[2];           /* inject[to] holds frames: asked per content end */
    struct evbuffer *deferred;  /* client frames waiting for the broker's close-ok */
    struct consumer *consumers;
    size_t n_consumers;
    struct consumer *pending; /* basic.consume awaiting consume-ok, in order */
    size_t n_pending;
    char *get_queue; /* queue of the basic.get in flight */
    bool get_no_ack;
    bool swallow_broker_close_ok; /* twice closed the broker side (error) */
    bool closed_for_client;       /* the client was told the channel is closed */
};

/*
 * Where a connection is in its life.  One field (amqp_px.phase), changed only by
 * apx_set_phase(), which refuses (logs at error level, and asserts in a debug build) a move not
 * drawn here:
 *
 *               the client's protocol header            a connection.close-ok went by
 *     HEADER ----------------------------------> OPEN -------------------------------> CLOSED
 *        |                                         |                                      |
 *        +-----------------------------------------+--------------------------------------+
 *                                                  |  the codec was stopped
 *                                                  v
 *                                               STOPPED
 *
 * HEADER: nothing of the client's is read but its protocol header (the broker says nothing
 * before it).  OPEN: frames are read, decided and relayed.  CLOSED: the close handshake is over
 * (the session is told which side closed it: amqp_px.closed_by, kept past STOPPED, for the
 * session asks once the codec has stopped); frames still read are relayed as in OPEN.
 * STOPPED lasts to the session's end (setting it again is no move).  A close-ok before the
 * client's header is not noted: the broker cannot close a connection that did not begin.
 */
enum apx_phase {
    APX_HEADER,
    APX_OPEN,
    APX_CLOSED,
    APX_STOPPED,
};

struct amqp_px {
    struct session *s;
    enum apx_phase phase;      /* changed only by apx_set_phase() */
    enum session_side reading; /* the side whose bytes are being processed */
    int closed_by;      /* APX_CLOSED (and STOPPED after it): the side whose connection.close was
                           answered (close-ok); -1 before */
    uint32_t frame_max; /* as negotiated; before tune-ok the minimum */
    struct achan **chans;
    size_t n_chans;
    /* The bytes on their way (pump.h): in[reading] the read being processed, run[reading]
     * the frames at its head already passed on but not moved yet, win[reading] its first
     * chain while they are in it, out[to] frames batched toward side to.  After the run, the
     * first frames of one undecided content kept in place (kept, of kept_by): see "Runs" in
     * amqp_proxy.c. */
    struct pump pump;
    size_t kept;
    struct content *kept_by;
    /* The small stash of each direction (by the side frames come from),
     * and the content holding it, if any. */
    struct content *small_owner[2];
    uint8_t small[2][AMQP_PX_STASH_SMALL];
    struct achan *last_chan; /* the one chan_get found last (never freed before ax) */
    struct msg_info *spare;  /* records freed, for the next messages */
    size_t n_spare;
    bool said_too_long; /* "message field too long" was logged for this connection */
    size_t n_live;      /* records in use (by contents, ledgers, timers) */
    size_t n_hold_ack;  /* of which, deliveries whose ack twice holds until a late copy */
    size_t n_late;      /* late copies whose timer is armed (apx_arm_late) */
};

/* ---- amqp_proxy.c ---- */

uint64_t apx_now_ms(void);
struct msg_info *apx_info_new(struct achan *ch);
char *apx_info_dup(struct msg_info *mi, struct amqp_bytes b);
/* Frees a string of mi unless it lives in mi's pool. */
void apx_info_str_free(struct msg_info *mi, char *str);
enum session_side apx_other(enum session_side side);
/* A peer broke the protocol (or twice cannot follow it): close with a logged reason; the
 * other sessions carry on. */
void apx_protocol_error(struct amqp_px *ax, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Moves ax to phase `to` (closed_by: APX_CLOSED's side, else ignored); false, logged at
 * error level and asserted in a debug build, for a move enum apx_phase does not draw. */
bool apx_set_phase(struct amqp_px *ax, enum apx_phase to, enum session_side closed_by);
bool apx_alive(const struct amqp_px *ax);
void apx_settle(struct amqp_px *ax);
void apx_take(struct amqp_px *ax, struct evbuffer *dst, size_t len);
size_t apx_stash_len(const struct amqp_px *ax, const struct content *c);
int apx_stash_take(struct amqp_px *ax, struct content *c, size_t len);
int apx_stash_move(struct amqp_px *ax, struct content *c, struct evbuffer *dst);
void apx_content_clear(struct amqp_px *ax, struct content *c);
void apx_send_frames(struct amqp_px *ax, enum session_side to, struct evbuffer *frames);
void apx_send_flush(struct amqp_px *ax, enum session_side to);
void apx_chan_inject(struct achan *ch, enum session_side to, const uint8_t *frames, size_t len);
void apx_chan_unblock(struct achan *ch, enum session_side from);
void apx_event_from_info(struct engine_event *ev, enum rule_event kind, const struct msg_info *mi,
                         struct session *s, char *idbuf, size_t idlen);
size_t apx_decide_msg(struct amqp_px *ax, enum rule_event kind, const struct msg_info *mi,
                      const struct amqp_bytes *hdrs, struct evbuffer *body,
                      struct job_fault *faults);
/* What apx_journal_event() marks a record with (journal.proto), bits. */
enum {
    APX_J_REQUEUE = 1,   /* a NACK with requeue: the consumer asks for a new attempt */
    APX_J_KEPT_BACK = 2, /* a settlement twice kept from the broker */
    APX_J_AUTO_ACK = 4,  /* a delivery to a no-ack consumer */
};
void apx_journal_event(struct amqp_px *ax, enum journal_kind kind, const struct msg_info *mi,
                       uint64_t tag, unsigned flags);
void apx_close_channel(struct achan *ch, uint16_t code, const char *text, uint16_t class_id,
                       uint16_t method_id);
void apx_inject_error(struct amqp_px *ax, struct achan *ch, const struct amqp_plan_error *e);
void apx_cut(struct amqp_px *ax, const struct rule *r, enum session_side from);

/* ---- amqp_settle.c ---- */

struct held *apx_held_push(struct achan *ch, int from, uint64_t release_ms, bool open);
void apx_held_release(struct achan *ch, int from, bool all);
/* Bytes of delayed frames one session may hold per direction (`max-held`, default
 * CONF_DEFAULT_MAX_HELD); past it twice stops reading from that side until some are released. */
size_t apx_held_max(const struct amqp_px *ax);
void apx_held_limit(struct amqp_px *ax);
void apx_on_held_timer(evutil_socket_t fd, short what, void *arg);
bool apx_settle_now(struct achan *ch, uint64_t tag, bool requeue);
struct achan *apx_timer_chan(const struct msg_info *mi);
void apx_on_late_copy(evutil_socket_t fd, short what, void *arg);
bool apx_arm_timer(struct amqp_px *ax, struct msg_info *mi, struct event **slot, uint32_t ms,
                   void (*cb)(evutil_socket_t, short, void *));
/* Arms mi's late copy ms from now (counted in ax->n_late until it fires or mi is freed). */
bool apx_arm_late(struct amqp_px *ax, struct msg_info *mi, uint32_t ms);
/* The codec's drain ops (codec.h): what the connection holds back, releasing what a rule only
 * delays, and whether a message is under way. */
void apx_pending(void *state, struct codec_pending *p);
void apx_drain(void *state, struct codec_pending *released);
bool apx_busy(void *state);
void apx_release_all_held_acks(struct achan *ch);
/* Remembers r as the rule of mi's late copy (the first). */
void apx_note_late_rule(struct amqp_px *ax, struct msg_info *mi, const struct rule *r);
/* The session is closing for a shutdown: logs, per channel, the settlements twice still holds
 * (the broker requeues their messages when the connection closes), with their delivery tags
 * and the rules that held them. */
void apx_log_held_at_shutdown(const struct amqp_px *ax);
int apx_apply_plan(struct achan *ch, int from, struct amqp_plan *plan,
                   int (*commit)(struct amqp_ledger *, uint16_t, struct amqp_plan *, uint8_t *,
                                 size_t, size_t *),
                   size_t len);
void apx_on_settle(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m, size_t len);

/* ---- amqp_content.c ---- */

struct evbuffer *apx_chan_out(struct achan *ch, int from);
bool apx_consumer_is(const struct consumer *c, struct amqp_bytes tag);
void apx_content_begin(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_method *m,
                       size_t len);
void apx_content_end(struct amqp_px *ax, struct achan *ch, int from);
void apx_content_header(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_frame *f,
                        size_t len);
void apx_content_body(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_frame *f,
                      size_t len);

#endif
