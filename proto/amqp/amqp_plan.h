/*
 * amqp_plan.h - what an AMQP connection does with a delivery, a publish, one tag of a
 * client's settlement or of a broker's confirm after a fault, as data.
 *
 * The proxy gathers the facts of the event (a delivery the client must ack or a no-ack
 * consumer's, whether the ledger keeps its record, whether its ack already waits for a late
 * copy, whether a publish is being copied) and the faults that fired on it (struct job_fault:
 * rules/plan.h makes one of a rule), and gets back a plan: the message forwarded, dropped or
 * held; the connection cut before or after it; the channel closed with an error; the delivery
 * settled by twice at once; a late copy, an expiry or a hold of the ack armed; the publish
 * duplicated; for a settled tag the ledger's verdict (proto/amqp/amqp_ledger.h).  Each part of a
 * plan names the fault's rule as the opaque handle the fault carried (for the log and the journal).
 * The proxy carries each kind of plan out in one place: content_apply()
 * (proxy/amqp/amqp_content.c), settle_apply() (proxy/amqp/amqp_settle.c), on_confirm()
 * (proxy/amqp/amqp_proxy.c), on_expire().
 *
 * A delivery's expiry (an `expire` rule's timer, or the listener's visibility or consumer
 * timeout) is planned the same way when its timer fires.  Smaller questions too: whether a
 * publish is copied as it passes (amqp_plan_copy_publish()), whether the listener's timeout is
 * armed on a delivery (amqp_plan_visibility()), whether the rules see a settlement at all
 * (amqp_plan_settle_asks_rules()), and what a held settlement becomes when its channel closes
 * (amqp_plan_release_held()).
 *
 * Pure: no I/O, no clock, no allocation.  Guarantees (tests/unit/proto/test_amqp_plan.c):
 *   - no faults: the message is forwarded, the settlement passed, nothing else;
 *   - a cut before ends the plan: later faults are not planned, earlier settlements are (the
 *     frames twice queued before a cut still go out);
 *   - an error closes the channel under the message: the message is dropped, later faults are
 *     not planned, and no timer is armed (closing the channel forgets the delivery);
 *   - a dropped message is never held; a delay holds for the longest of its delays;
 *   - twice settles a delivery at most once (the first fault that settles it), and only one the
 *     client must ack;
 *   - timers hang only on a delivery the ledger keeps (facts.tracked): a late copy only on one
 *     whose ack is not already waiting for one.
 *
 * On AMQP one rule acts on a message's event (rules/engine.h, ruleset_decide()), so a plan
 * usually comes of one fault; several are planned in order, as listed above.
 */
#ifndef TWICE_AMQP_PLAN_H
#define TWICE_AMQP_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/amqp/amqp_ledger.h"
#include "proto/jobs/job.h"

/* ---- a delivery (basic.deliver, basic.get-ok) or a publish ------------- */

struct amqp_content_facts {
    bool publish;      /* a basic.publish (from the client); else a delivery (from the broker) */
    uint32_t method;   /* AMQP_BASIC_PUBLISH / _DELIVER / _GET_OK: the method an error names */
    bool ack_required; /* a delivery the client acks (not a no-ack consumer's or get's) */
    bool tracked;      /* ... whose record the ledger keeps: timers may hang on it */
    bool hold_ack;     /* ... whose ack already waits for a late copy */
    bool has_copy;     /* a publish whose copy is being made (a rule on publishes duplicates) */
};

enum amqp_fate {
    AMQP_FATE_FORWARD, /* on to its peer */
    AMQP_FATE_DROP,    /* lost */
    AMQP_FATE_HOLD,    /* held .hold_ms, then on */
};

/* Twice settles a delivery itself, at once, upstream. */
enum amqp_settle_now {
    AMQP_NOW_NONE,
    AMQP_NOW_LOST,    /* basic.reject(requeue=0): the job is lost (a dropped delivery) */
    AMQP_NOW_REQUEUE, /* basic.reject(requeue=1): it comes back (a duplicate at once) */
};

/* A channel closed with an error as the broker would (class 60, the event's method). */
struct amqp_plan_error {
    bool on;
    uint16_t code, class_id, method_id;
    const void *rule;
};

struct amqp_content_plan {
    enum amqp_fate fate;
    uint32_t hold_ms; /* AMQP_FATE_HOLD */
    const void *hold_rule;
    /* Cut before the message reaches its peer: nothing after it in the plan happens.
     * cut_from_broker: the event was read from the broker (a delivery), else the client. */
    const void *cut_before;
    bool cut_from_broker;
    const void *cut_after; /* cut once the message is through */
    struct amqp_plan_error error;
    enum amqp_settle_now settle;
    const void *settle_rule;
    /* A late copy (`duplicate after D`): the message requeued D after the delivery, its ack
     * held until then.  When it cannot be armed, the delivery is settled with a requeue at
     * once (AMQP_NOW_REQUEUE), as a duplicate without D. */
    bool late;
    uint32_t late_ms;
    const void *late_rule;
    /* An `expire`: the delivery's own visibility timeout, ms after it (the last expire's);
     * its rule (the first's) is noted as a fault only when it runs out before the ack. */
    bool expire;
    uint32_t expire_ms;
    const void *expire_rule;
    /* `duplicate` on a publish: the copy follows it.  dup_missing: no copy was being made,
     * the publish goes once (said in the log, naming dup_rule). */
    bool dup;
    bool dup_missing;
    const void *dup_rule;
};

/* The plan of faults f[0..n) on a delivery or publish with facts *k. */
struct amqp_content_plan amqp_plan_content(const struct amqp_content_facts *k,
                                           const struct job_fault *f, size_t n);

/* Whether a publish is copied as it passes (amqp_content_facts.has_copy), before its rules
 * decide, given the kinds of fault the listener's rules on publishes can make (bits
 * 1u << enum job_fault_kind): only a duplicate sends the copy. */
bool amqp_plan_copy_publish(uint32_t fault_kinds);

/* What the proxy knows of a delivery once its plan was carried out. */
struct amqp_visibility_facts {
    uint32_t timeout_ms; /* the listener's visibility (or consumer) timeout; 0: none */
    bool publish;        /* a publish: no timeout of the listener's */
    bool ack_required;   /* a delivery the client acks */
    bool dropped;        /* its plan dropped it: the client never gets it */
    bool kept;    /* the ledger still keeps its record (twice's settlement or a channel's close
                     forgets it) */
    bool expired; /* an `expire` rule armed its own timeout on it */
};

/* The listener's timeout to arm on the delivery, in ms; 0: none. */
uint32_t amqp_plan_visibility(const struct amqp_visibility_facts *k);

/* ---- one tag of a client's basic.ack / basic.nack / basic.reject ------- */

struct amqp_settle_facts {
    uint32_t method; /* AMQP_BASIC_ACK / _NACK / _REJECT: the method an error names */
    bool tracked;    /* the ledger keeps the delivery's record: timers may hang on it */
    bool hold_ack;   /* ... and its ack waits for a late copy (`duplicate after D`) */
};

/* What wins which verdict when a timer cannot be armed (amqp_settle_plan.by). */
enum amqp_verdict_by {
    AMQP_BY_NONE,  /* no fault: AMQP_V_PASS */
    AMQP_BY_LATE,  /* a late copy: AMQP_V_REQUEUE when it cannot be armed */
    AMQP_BY_HOLD,  /* a delay: AMQP_V_PASS when it cannot be armed */
    AMQP_BY_FAULT, /* any other fault: kept */
    AMQP_BY_COPY,  /* an ack that waits for a late copy: AMQP_V_HOLD, kept */
};

struct amqp_settle_plan {
    enum amqp_verdict verdict; /* for amqp_ledger_settle_commit(), if its timers arm */
    enum amqp_verdict_by by;
    /* `redeliver after D`: the settlement held, the message requeued D later. */
    bool late;
    uint32_t late_ms;
    const void *late_rule;
    /* `delay`: the settlement held, released hold_ms later. */
    bool hold;
    uint32_t hold_ms;
    const void *hold_rule;
    /* The rule that holds or drops the settlement (the first delay's or drop's; a delay's only
     * once its hold is armed): what a visibility timeout running out meanwhile is noted as. */
    const void *ack_rule;
    /* Cut before the settlement reaches the broker: nothing more of the frame happens. */
    const void *cut_before;
};

/* What happens once the whole frame is settled: the channel closed with an error, or the
 * connection cut after it (an error wins).  Zeroed before the first tag. */
struct amqp_settle_after {
    struct amqp_plan_error error;
    const void *cut_after;
};

/* Whether the rules are asked about one tag: not when its ack waits for a late copy (a rule
 * that fired would be journaled as a fault it never made; the event is counted all the same). */
bool amqp_plan_settle_asks_rules(const struct amqp_settle_facts *k);

/* The plan of faults f[0..n) on one tag with facts *k; *after gathers over the frame's tags
 * (the last tag's error or cut wins).  An ack that waits for a late copy is held for it
 * (AMQP_V_HOLD, by AMQP_BY_COPY), whatever f says: the copy's timer settles it. */
struct amqp_settle_plan amqp_plan_settle(const struct amqp_settle_facts *k,
                                         const struct job_fault *f, size_t n,
                                         struct amqp_settle_after *after);

/* The verdict once the plan's timers were armed or not (late_ok, hold_ok; true when the plan
 * has none). */
enum amqp_verdict amqp_plan_settle_verdict(const struct amqp_settle_plan *p, bool late_ok,
                                           bool hold_ok);

/* What becomes of a settlement twice holds when the client closes its channel or recovers
 * (held acks are not lost to a close). */
enum amqp_release {
    AMQP_RELEASE_FORWARD, /* the client's settlement goes to the broker now */
    AMQP_RELEASE_REQUEUE, /* a late copy's: not the client's to give; twice requeues the message
                             now (the copy comes early, as when the channel closes) */
};

/* The fate of one held settlement; late_copy: a late copy's timer is armed on its delivery. */
enum amqp_release amqp_plan_release_held(bool late_copy);

/* ---- a delivery's timeout running out ---------------------------------- */

/* What the proxy knows when a delivery's expiry timer fires. */
struct amqp_expiry_facts {
    bool settleable; /* unsettled at the broker: neither acked in time nor settled by twice */
    const void *expire_rule; /* an `expire` rule armed the timer; NULL: the listener's timeout */
    const void *ack_rule;    /* the rule that holds or dropped the client's ack, if one */
    bool consumer_timeout;   /* the listener's timeout is RabbitMQ's consumer_timeout */
    uint16_t channel;
    uint32_t timeout_ms; /* the listener's timeout */
};

/* Why it expired (the log's and the journal's `timeout`). */
enum amqp_expiry_cause {
    AMQP_EXPIRY_NONE,       /* settled in time: nothing happens */
    AMQP_EXPIRY_RULE,       /* an `expire`: its rule's fault is noted now */
    AMQP_EXPIRY_VISIBILITY, /* the listener's visibility timeout: journaled as EXPIRED */
    AMQP_EXPIRY_CONSUMER,   /* RabbitMQ's consumer_timeout: EXPIRED, and the channel closes */
};

/* Room for the text RabbitMQ closes a channel with on a consumer timeout. */
#define AMQP_EXPIRY_TEXT_MAX 256

struct amqp_expiry_plan {
    enum amqp_expiry_cause cause;
    const void *rule; /* the expire rule, else the rule that holds or dropped the ack (or NULL) */
    /* The delivery requeued upstream by twice (not with a consumer timeout: the channel's close
     * requeues every delivery unacked on it). */
    bool requeue;
    /* AMQP_EXPIRY_CONSUMER: the channel closed with 406 and RabbitMQ's text
     * (rabbit_channel's evaluate_consumer_timeout). */
    bool close_channel;
    uint16_t close_code;
    char close_text[AMQP_EXPIRY_TEXT_MAX];
};

/* The plan of a delivery's expiry with facts *k. */
void amqp_plan_expiry(const struct amqp_expiry_facts *k, struct amqp_expiry_plan *p);

/* "expire", "visibility-timeout", "consumer-timeout" (the log's and journal's names); "" for
 * AMQP_EXPIRY_NONE. */
const char *amqp_expiry_name(enum amqp_expiry_cause c);

/* ---- one tag of a broker's publisher confirm --------------------------- */

struct amqp_confirm_plan {
    bool drop;              /* the confirm never reaches the client */
    const void *cut_before; /* cut before it does: nothing more of the frame happens */
};

/* The plan of faults f[0..n) on one confirmed publish; *cut_after (NULL before the first tag)
 * gathers a cut once the frame is through over the frame's tags (the last one wins). */
struct amqp_confirm_plan amqp_plan_confirm(const struct job_fault *f, size_t n,
                                           const void **cut_after);

#endif
