/*
 * codec.h - the protocol layer of a session.
 *
 * A `tcp` session moves bytes.  A session of a listener with a protocol
 * codec (amqp, resp) hands the bytes it reads to the codec instead; the
 * codec walks the frames, asks the rule engine about the events they carry,
 * and gives each frame its fate through the frame pump (pump.h), which sends
 * what each side must receive: the frames as they came, rewritten ones,
 * frames of its own, or nothing.  Stream faults (shaper.h) apply after the
 * codec, to what it sends.
 */
#ifndef TWICE_CODEC_H
#define TWICE_CODEC_H

#include <event2/buffer.h>
#include <stdbool.h>

#include "proxy/net/session.h"
#include "rules/engine.h"

/* What a session holds back or has scheduled, which a drain waits for (drain.h): counts. */
struct codec_pending {
    uint64_t held_acks;   /* settlements twice holds (delay, or until a late copy), or dropped
                             and due to be requeued by the listener's visibility timeout */
    uint64_t late_copies; /* copies twice will make later (`redeliver after`, `duplicate after`) */
    uint64_t held_messages; /* deliveries, publishes, replies or commands a `delay` holds */
};

struct codec_ops {
    const char *name;
    /* Per-session state, or NULL when memory runs out. */
    void *(*open)(struct session *s);
    /* The session is closing: stop timers; the state stays valid until free. */
    void (*stop)(void *state);
    void (*free)(void *state);
    /* Consume what can be processed from `in`, bytes read from side `from`;
     * leave an incomplete frame in `in`.  May close the session. */
    void (*process)(void *state, enum session_side from, struct evbuffer *in);
    /* Once the protocol's own close handshake has completed (a reset after
     * it is not an error), the side that asked to close (a SIDE_*: the close
     * reason names it); -1 before.  May be NULL. */
    int (*closed_by)(void *state);
    /* Once a second while the session relays (its housekeeping).  May be
     * NULL. */
    void (*tick)(void *state);
    /* Adds to *p what the session holds back or has scheduled.  May be NULL. */
    void (*pending)(void *state, struct codec_pending *p);
    /* A drain (POST /drain, shutdown): what a rule only delays goes on now; what a rule
     * turns into a copy or a requeue (a late copy, an ack left to its visibility timeout)
     * stays until its time.  Counts what it released into *released.  May close the
     * session.  May be NULL. */
    void (*drain)(void *state, struct codec_pending *released);
    /* Whether some message is under way on the session: a delivery its consumer has not
     * settled, a publish awaiting its confirm, a command awaiting its reply (a blocking pop
     * that waits for a job is not), or anything held or scheduled.  Shutdown closes a
     * session that is not busy at once.  NULL: always busy (twice cannot tell). */
    bool (*busy)(void *state);
};

/* What every codec does with a protocol event: count it, ask the rules of
 * the session's listener (writing the indexes of the rules that fire to
 * hits, at most SESSION_MAX_RULE_HITS: one for the event of a message or a
 * command, the first rule that fires, as ruleset_decide() says for every
 * protocol), and note each fault (log line and journal).  An `expire` is
 * noted by the codec when its timer fires, not here: a message settled in
 * time was not faulted. */
size_t codec_decide(struct session *s, const struct engine_event *ev, size_t *hits);

/* codec_decide() without the fault's note: for a codec that learns the
 * message's id only from the decision (a dropped XADD's id is made by
 * twice), and notes the fault itself (fault_note) once it knows it. */
size_t codec_decide_unnoted(struct session *s, const struct engine_event *ev, size_t *hits);

/* The events the listener's rules look at, recomputed after a reload swapped them. */
uint32_t codec_wanted_now(struct session *s);

/* Whether some rule of the session's listener looks at events of kind ev
 * (the rules may have been swapped by a reload since the last call).  When
 * none does, a codec counts the event (codec_count) instead of building it
 * for codec_decide(), which would find no rule.  Inline: asked several times
 * per message. */
static inline bool codec_wants(struct session *s, enum rule_event ev)
{
    uint32_t w = s->rules_gen == s->loop->rules_gen ? s->wanted : codec_wanted_now(s);
    return (w & (1u << (unsigned)ev)) != 0;
}

static inline void codec_count(struct session *s, enum rule_event ev)
{
    session_count_events(s, ev, 1); /* as codec_decide() counts it */
}

/* Logs that a peer broke the codec's protocol ("amqp protocol error") with
 * `msg` and an optional `detail`, and records msg as the session's error. */
void codec_log_protocol_error(struct session *s, const char *msg, const char *detail);

/* Writes "PREFIX:N1:N2..." (the n numbers in decimal) into buf, cut to cap
 * - 1 bytes and NUL-terminated; returns buf.  The identity of a message
 * without an id, built for every such message: snprintf costs ~1,000
 * instructions for it. */
const char *codec_anon_id(char *buf, size_t cap, const char *prefix, const uint64_t *v, size_t n);

/* ev's identity for the rules: its message_id, or for a message without one
 * the delivery's, "anon:" and v[0..n) written into buf (codec_anon_id()),
 * with ev->anonymous set (the engine's cap then cannot count its copies:
 * see engine.h). */
void codec_event_identity(struct engine_event *ev, char *buf, size_t cap, const uint64_t *v,
                          size_t n);

/* Moves the first n bytes of `in` to the end of `out`, as
 * evbuffer_remove_buffer, without copying the payload.  libevent moves
 * whole chains and copies the part of the chain the n-th byte ends in; a
 * codec moving the frames of a read up to a partial one left that chain's
 * head (almost all of a read of large messages) copied.  Here a split
 * chain's head goes to `out` as a reference, and the chain stays alive
 * (libevent marks it immutable: later reads go to a new chain) until `out`
 * has written that reference.  Heads of at most CODEC_MOVE_COPY_MAX bytes
 * are copied (sharing costs three small allocations), and heads shorter
 * than what stays in `in` (which the pin keeps alive too, even once drained:
 * shared memory stays within twice the bytes on their way out).  0, or -1
 * when `in` holds fewer than n bytes (nothing moved) or memory ran out (part
 * may have moved). */
#define CODEC_MOVE_COPY_MAX 4096
int codec_move(struct evbuffer *in, struct evbuffer *out, size_t n);

/* The codec of a listener's protocol, or NULL for plain byte relaying. */
const struct codec_ops *codec_for(const struct conf_listener *l);

extern const struct codec_ops amqp_codec_ops;
extern const struct codec_ops resp_codec_ops;

#endif
