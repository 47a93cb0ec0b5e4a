/*
 * amqp_ledger.h - delivery tags and publish sequence numbers of one AMQP
 * channel, kept consistent on both sides while twice injects faults.
 *
 * RabbitMQ numbers the deliveries of a channel 1, 2, 3... and closes the
 * channel (406 PRECONDITION_FAILED) on an ack, nack or reject of a tag that
 * is unknown or already settled.  When twice settles a delivery itself
 * (duplicate, expire, redeliver, a dropped delivery), holds a client's ack
 * (delay) or swallows it (drop), the client's later acks no longer match
 * what the broker expects.  The ledger tracks every delivery of the channel
 * and turns what the client sends into what the broker may receive:
 *
 *   - the client never sees a tag the broker did not assign (twice never
 *     invents deliveries; a dropped delivery's tag is settled by twice);
 *   - the broker never receives an ack/nack/reject for a tag that is unknown
 *     or already settled, except when the client itself sent one (that error
 *     is the client's, and is passed through so the broker reports it);
 *   - every delivery is settled upstream exactly once, or requeued by the
 *     broker when the channel closes;
 *   - a `multiple` ack is split around tags that twice holds, dropped or
 *     already settled.
 *
 * Each delivery the ledger records is in one of these states, seen from the
 * broker (B) and from the client (C):
 *
 *   outstanding     B unsettled, C unsettled
 *   held            B unsettled, C settled: twice keeps the client's frame
 *   twice-settled   B settled (twice sent a reject), C unsettled: the
 *                   client's later settlement is swallowed, then forgotten
 *   dropped         B unsettled, C settled: twice lost the client's frame;
 *                   it stays unsettled at the broker until the channel
 *                   closes or twice settles it (amqp_ledger_twice_settle)
 *
 * A client frame is judged from the client's point of view, as RabbitMQ's
 * collect_acks would judge it had twice done nothing.  When it is an error
 * there (a tag never delivered, or one the client already settled), the
 * ledger makes sure the broker reports exactly that error: it forwards the
 * frame, and when the tag is still unsettled at the broker because twice
 * held or dropped the client's first settlement, it first settles that tag
 * upstream (the held frame, or a reject with requeue for a dropped one) so
 * that the broker, too, finds it unknown and closes the channel with
 * "406 PRECONDITION_FAILED - unknown delivery tag N".
 *
 * Publisher confirms are the same problem in the other direction: when
 * twice drops a publish, the broker's sequence numbers run behind the
 * client's; when twice sends a copy of one, they run ahead.  The ledger
 * translates the broker's acks/nacks back, and swallows the copies'.
 *
 * Pure C, no I/O.  Frames are produced by proto/amqp/amqp.h's encoders into a
 * caller buffer.  Not thread-safe: one ledger belongs to one session.
 *
 * Out of memory.  Only amqp_ledger_new (NULL), _deliver, _publish,
 * _publish_copy, _settle_begin and _confirm_begin allocate, and only they
 * return AMQP_LEDGER_E_NOMEM.  _deliver, _settle_begin and _confirm_begin then
 * change nothing a caller can observe, except that they end any open plan (and
 * the plan they were given cannot be committed: AMQP_LEDGER_E_STALE); the call
 * may be made again.  _publish and _publish_copy number the publish all the
 * same (see there).  Commits, _twice_settle, _release, _ack_one, _reset and
 * _recover never allocate: a commit applies all its verdicts or, on an error,
 * none.  tests/unit/proto/test_amqp_ledger_oom.c checks this with every
 * allocation failing in turn.
 */
#ifndef TWICE_AMQP_LEDGER_H
#define TWICE_AMQP_LEDGER_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Deliveries one channel may have recorded at once (outstanding, held,
 * dropped or twice-settled), and publishes awaiting a confirm; past this the
 * channel is treated as broken (RabbitMQ's own limit is the prefetch count,
 * and unlimited prefetch with millions unacked is not a load test twice can
 * follow). */
#define AMQP_LEDGER_MAX_OUTSTANDING (1u << 20)

/* Every frame the ledger writes is a basic.ack, basic.reject or basic.nack:
 * 7 header bytes, 13 payload bytes, the frame-end octet. */
#define AMQP_LEDGER_FRAME_LEN 21u

/* Status codes: 0 or negative, stable and append-only.
 * amqp_ledger_strerror() names them. */
#define AMQP_LEDGER_ERRORS(X)                                                                      \
    X(OK, 0, "ok")                                                                                 \
    X(E_NOMEM, -1, "out of memory")                                                                \
    X(E_FULL, -2, "more than AMQP_LEDGER_MAX_OUTSTANDING entries on one channel")                  \
    X(E_ORDER, -3, "delivery tag not greater than the previous one")                               \
    X(E_BUFFER, -4, "output buffer too small")                                                     \
    X(E_STALE, -5, "plan is not the one the ledger has open")                                      \
    X(E_VERDICT, -6, "verdict not allowed for this plan")

enum amqp_ledger_status {
#define AMQP_LEDGER_STATUS_ENUM(name, code, str) AMQP_LEDGER_##name = code,
    AMQP_LEDGER_ERRORS(AMQP_LEDGER_STATUS_ENUM)
#undef AMQP_LEDGER_STATUS_ENUM
};

/* A static string for a status code; "unknown error" for codes not listed. */
const char *amqp_ledger_strerror(int status);

enum amqp_settle_kind {
    AMQP_SETTLE_ACK = 0,
    AMQP_SETTLE_NACK,   /* basic.nack */
    AMQP_SETTLE_REJECT, /* basic.reject */
};

/* What twice decided for one tag a client settles. */
enum amqp_verdict {
    AMQP_V_PASS = 0, /* settle upstream as the client asked */
    AMQP_V_REQUEUE,  /* redeliver: basic.reject(requeue=1) upstream instead */
    AMQP_V_HOLD,     /* delay: twice keeps the settlement, released later */
    AMQP_V_DROP,     /* lose it: never sent; the broker keeps the delivery */
};

struct amqp_ledger;

/* One tag in a settle plan (a client sequence number in a confirm plan). */
struct amqp_plan_tag {
    uint64_t tag;
    void *info;                /* what ledger_deliver() / ledger_publish() stored */
    enum amqp_verdict verdict; /* in: AMQP_V_PASS; the caller may change it */
};

/* What a client's ack/nack/reject covers.  Filled by amqp_ledger_settle_begin(),
 * verdicts set by the caller, turned into frames by amqp_ledger_settle_commit().
 * A confirm plan (amqp_ledger_confirm_begin) has the same shape. */
struct amqp_plan {
    enum amqp_settle_kind kind;
    uint64_t tag;               /* as the client (or, for confirms, the broker) sent it */
    bool multiple;              /* always false for basic.reject */
    bool requeue;               /* always false for basic.ack */
    bool unknown;               /* the frame names a tag that is not outstanding from the
                                   sender's point of view: an error the broker reports */
    size_t n;                   /* tags the client settles, ascending */
    struct amqp_plan_tag *tags; /* owned by the ledger until the next begin */
    size_t n_swallowed;         /* tags the client settles that twice already
                                   settled (their ack must not reach the broker) */
    uint64_t id;                /* the ledger's: which begin filled this plan */
};

/* A ledger with nothing recorded.  free_info (may be NULL) frees the infos
 * the ledger was given when it forgets them.  Returns NULL when out of
 * memory.  The caller owns the ledger: amqp_ledger_free(). */
struct amqp_ledger *amqp_ledger_new(void (*free_info)(void *info));

/* Frees the ledger and every info it still holds.  NULL is allowed. */
void amqp_ledger_free(struct amqp_ledger *l);

/* The channel was closed (either side) or reopened: every tag is void, held
 * settlements are discarded, confirm mode is off and publish numbering
 * restarts.  Infos are freed. */
void amqp_ledger_reset(struct amqp_ledger *l);

/* basic.recover was forwarded: every delivery tag is void and held
 * settlements are discarded (the broker requeues the messages and delivers
 * them again under new, higher tags).  Publish confirms are kept. */
void amqp_ledger_recover(struct amqp_ledger *l);

/* The broker delivered `tag` (basic.deliver or basic.get-ok) with ack
 * required.  The ledger takes `info` in every case (freed at once on error).
 * Returns 0, AMQP_LEDGER_E_ORDER when the tag is not greater than the
 * previous one since the last reset, AMQP_LEDGER_E_FULL past
 * AMQP_LEDGER_MAX_OUTSTANDING, AMQP_LEDGER_E_NOMEM.  After an error the
 * channel is beyond what twice follows: close it. */
int amqp_ledger_deliver(struct amqp_ledger *l, uint64_t tag, void *info) TWICE_MUST_CHECK;

/* The info of a tag the ledger still records (outstanding, held, dropped or
 * twice-settled), or NULL.  Still owned by the ledger. */
void *amqp_ledger_info(const struct amqp_ledger *l, uint64_t tag);

/* Twice settles `tag` itself, at once (duplicate, expire, a dropped
 * delivery): writes a basic.reject(tag, requeue) frame for the broker into
 * `out` and returns its length (AMQP_LEDGER_FRAME_LEN).  For an outstanding
 * tag the client's later settlement is swallowed.  A tag whose settlement
 * twice dropped or holds can be settled this way too (a lost or late ack
 * past a visibility timeout: the broker hands the message out again); the
 * ledger then forgets it, and a held settlement is discarded (a later
 * amqp_ledger_release of it writes nothing).  Returns 0, writing nothing,
 * when the tag is none of these (the client settled it first, or unknown);
 * AMQP_LEDGER_E_BUFFER when `cap` is too small (nothing changed). */
/* Whether amqp_ledger_twice_settle(tag) would settle it (the tag is outstanding,
 * or its settlement was dropped or is held).  Settling a dropped or held tag
 * forgets it and frees its info: a caller that needs the info asks this first. */
bool amqp_ledger_twice_settleable(const struct amqp_ledger *l, uint64_t tag);

int amqp_ledger_twice_settle(struct amqp_ledger *l, uint16_t channel, uint64_t tag, bool requeue,
                             uint8_t *out, size_t cap) TWICE_MUST_CHECK;

/* A client's basic.ack/nack/reject: list the tags it settles (outstanding
 * at both ends, verdict AMQP_V_PASS) and count the ones twice already
 * settled.  Nothing changes until commit; the plan is valid until the next
 * call on this ledger other than the read-only amqp_ledger_info, _held,
 * _outstanding, _confirm_seq and _plan_space.  `multiple` is ignored for
 * basic.reject, `requeue` for basic.ack.  Returns 0 or
 * AMQP_LEDGER_E_NOMEM. */
int amqp_ledger_settle_begin(struct amqp_ledger *l, enum amqp_settle_kind kind, uint64_t tag,
                             bool multiple, bool requeue, struct amqp_plan *plan) TWICE_MUST_CHECK;

/* Calls fn with the tag and info of each delivery in the range of the open settle plan that
 * twice had settled upstream already (plan->n_swallowed of them, in tag order): the commit
 * swallows the client's settlement of them, which a caller may still want to note (the worker
 * has finished with the message).  Read-only; call between settle_begin and commit. */
void amqp_ledger_settle_swallowed(const struct amqp_ledger *l, const struct amqp_plan *plan,
                                  void (*fn)(void *arg, uint64_t tag, void *info), void *arg);

/* The usual settlement, without a plan: the client's basic.ack of one tag (not multiple) that
 * is outstanding, when every verdict would be AMQP_V_PASS (no rule looks at acks).  Returns
 * true when it settled the tag, as settle_begin and a commit passing it would (its info freed;
 * the client's frame goes on unchanged); false, changing nothing, for any other tag (unknown,
 * settled by twice, held, dropped): take the plan's way then.  Like settle_begin, it ends any
 * open plan. */
bool amqp_ledger_ack_one(struct amqp_ledger *l, uint64_t tag);

/* Bytes that are always enough for commit's output for this plan. */
size_t amqp_ledger_plan_space(const struct amqp_plan *plan);

/* Apply the verdicts of `plan`.  Returns 1 (forward the client's frame
 * unchanged) when every verdict is PASS, nothing was swallowed, and the
 * frame settles exactly the plan's tags at the broker (a `multiple` covering
 * a held or dropped tag does not); also for an `unknown` plan whose tag the
 * broker, too, finds unknown.  Otherwise writes the frames the broker must
 * receive now into `out`, ascending by tag (a `multiple` one only where it
 * covers exactly the tags meant; for an `unknown` plan: the settlement twice
 * held or dropped, then the client's frame re-encoded), sets *len (0: send
 * nothing) and returns 0.  HOLD tags become held, DROP tags dropped.
 * Negative: AMQP_LEDGER_E_BUFFER when `cap` is below what the frames need
 * (nothing changed, the plan stays open: commit again with a larger buffer,
 * amqp_ledger_plan_space() bytes always suffice), AMQP_LEDGER_E_STALE,
 * AMQP_LEDGER_E_VERDICT. */
int amqp_ledger_settle_commit(struct amqp_ledger *l, uint16_t channel, struct amqp_plan *plan,
                              uint8_t *out, size_t cap, size_t *len) TWICE_MUST_CHECK;

/* Release a held settlement of `tag`: writes the frame the client meant
 * (ack, nack or reject, never `multiple`) and returns its length; 0 when the
 * tag is no longer held (the ledger was reset); AMQP_LEDGER_E_BUFFER when
 * `cap` is too small (nothing changed). */
int amqp_ledger_release(struct amqp_ledger *l, uint16_t channel, uint64_t tag, uint8_t *out,
                        size_t cap) TWICE_MUST_CHECK;

/* Tags currently held, ascending, into `tags` (at most `max`); returns how
 * many are held in all.  Used to flush before a channel.close. */
size_t amqp_ledger_held(const struct amqp_ledger *l, uint64_t *tags, size_t max);

/* Counters for tests and stats. */
size_t amqp_ledger_outstanding(const struct amqp_ledger *l); /* unsettled at the broker */

/* The channel's deliveries by where they stand, and its publishes awaiting a confirm. */
struct amqp_ledger_counts {
    size_t client_unsettled; /* the client has not settled them (outstanding, or settled by
                                twice upstream): its consumer is still at work */
    size_t held;             /* twice holds the client's settlement */
    size_t dropped;          /* twice dropped it; the broker keeps the delivery */
    size_t unconfirmed;      /* publishes forwarded, their confirm not come yet */
};
void amqp_ledger_counts(const struct amqp_ledger *l, struct amqp_ledger_counts *c);

/* Calls fn with the tag and info of every delivery whose client settlement twice holds (held
 * true) or dropped (held false), in tag order.  Read-only: fn must not change the ledger (a
 * caller that settles some collects them first). */
void amqp_ledger_each_kept(const struct amqp_ledger *l,
                           void (*fn)(void *arg, uint64_t tag, void *info, bool held), void *arg);

/* ---- publisher confirms ------------------------------------------------ */

/* confirm.select-ok was seen: from now on every publish is numbered. */
void amqp_ledger_confirm_mode(struct amqp_ledger *l);
bool amqp_ledger_in_confirm_mode(const struct amqp_ledger *l);

/* The client published: *client_seq is its sequence number (1, 2, ...; 0
 * when not in confirm mode).  `dropped`: twice does not forward it, so the
 * broker does not number it, and no confirm of it ever reaches the client.
 * The ledger takes `info` (freed when the confirm is handled, at once for a
 * dropped publish or outside confirm mode).  Returns 0, or
 * AMQP_LEDGER_E_FULL / AMQP_LEDGER_E_NOMEM when a forwarded publish cannot
 * be recorded: the numbering stays in step, but its confirm will be seen as
 * unknown; the channel is beyond what twice follows. */
int amqp_ledger_publish(struct amqp_ledger *l, bool dropped, void *info,
                        uint64_t *client_seq) TWICE_MUST_CHECK;

/* twice sent a copy of the publish recorded last (a `duplicate` rule) right behind it: the
 * broker numbers the copy too, but the client never published it, so no confirm of it reaches
 * the client.  Nothing outside confirm mode.  Returns 0, or AMQP_LEDGER_E_FULL /
 * AMQP_LEDGER_E_NOMEM as amqp_ledger_publish() does. */
int amqp_ledger_publish_copy(struct amqp_ledger *l) TWICE_MUST_CHECK;

/* The client sequence number (and info, when `info` is not NULL) behind the
 * unconfirmed broker sequence `broker_seq`, or 0 (info NULL; a copy twice sent has none). */
uint64_t amqp_ledger_confirm_seq(const struct amqp_ledger *l, uint64_t broker_seq, void **info);

/* A broker basic.ack/nack confirm (`nack` false/true) of broker sequence
 * `seq`, `multiple`: list the client sequence numbers it confirms (one per
 * published message, ascending; a copy twice sent has none) into a plan; the caller sets DROP on
 * the confirms it drops (PASS otherwise; other verdicts are refused at commit). `unknown` is set
 * for a single confirm of a sequence number not awaiting one, or a multiple beyond the last
 * publish.  Returns 0 or AMQP_LEDGER_E_NOMEM.  Plan validity as for amqp_ledger_settle_begin(). */
int amqp_ledger_confirm_begin(struct amqp_ledger *l, bool nack, uint64_t seq, bool multiple,
                              struct amqp_plan *plan) TWICE_MUST_CHECK;

/* Writes the frames for the client: returns 1 (forward the broker's frame
 * unchanged) when every verdict is PASS and the frame means exactly the
 * plan's client sequence numbers to the client (no publish was dropped
 * below it, no earlier confirm dropped under a `multiple`); an `unknown`
 * plan is forwarded while twice has dropped nothing on this channel, else
 * swallowed.  Otherwise writes ack/nack frames with client sequence numbers
 * (a `multiple` one only where it confirms exactly the numbers meant), sets
 * *len and returns 0.  Errors as for amqp_ledger_settle_commit(). */
int amqp_ledger_confirm_commit(struct amqp_ledger *l, uint16_t channel, struct amqp_plan *plan,
                               uint8_t *out, size_t cap, size_t *len) TWICE_MUST_CHECK;

#endif
