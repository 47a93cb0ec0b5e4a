/*
 * amqp_plan.c - an AMQP connection's faults on a message or a settlement, planned
 * (proto/amqp/amqp_plan.h).
 */
#include "proto/amqp/amqp_plan.h"

#include <stdio.h>
#include <string.h>

static struct amqp_plan_error plan_error(const struct job_fault *f, uint32_t method)
{
    return (struct amqp_plan_error){
        .on = true,
        .code = f->code,
        .class_id = 60,
        .method_id = (uint16_t)(method & 0xffff),
        .rule = f->rule,
    };
}

/* Twice settles the delivery now, unless a fault before did. */
static void settle_now(struct amqp_content_plan *p, enum amqp_settle_now how, const void *rule)
{
    if (p->settle != AMQP_NOW_NONE)
        return;
    p->settle = how;
    p->settle_rule = rule;
}

/* `duplicate` on a delivery the client acks: a late copy D after it when D is given and its
 * record can carry the timer, else a requeue now (the broker hands the message out again while
 * the client still has the first). */
static void plan_dup_delivery(struct amqp_content_plan *p, const struct amqp_content_facts *k,
                              const struct job_fault *f)
{
    if (!k->ack_required)
        return;
    if (f->ms != 0 && k->tracked && !k->hold_ack && !p->late) {
        p->late = true;
        p->late_ms = f->ms;
        p->late_rule = f->rule;
        return;
    }
    settle_now(p, AMQP_NOW_REQUEUE, f->rule);
}

/* What of p outlives the end of the plan (a cut before, an error): the settlement twice queued
 * before and the cut after; the message is forwarded to the cut or dropped with the channel. */
static struct amqp_content_plan plan_end(const struct amqp_content_plan *p, enum amqp_fate fate)
{
    return (struct amqp_content_plan){.fate = fate,
                                      .cut_after = p->cut_after,
                                      .settle = p->settle,
                                      .settle_rule = p->settle_rule};
}

struct amqp_content_plan amqp_plan_content(const struct amqp_content_facts *k,
                                           const struct job_fault *f, size_t n)
{
    struct amqp_content_plan p = {.fate = AMQP_FATE_FORWARD};
    bool delay = false;
    for (size_t i = 0; i < n; i++) {
        switch (f[i].kind) {
        case JOB_FAULT_CLOSE:
            if (f[i].before) {
                struct amqp_content_plan e = plan_end(&p, AMQP_FATE_FORWARD);
                e.cut_after = NULL;
                e.cut_before = f[i].rule;
                e.cut_from_broker = !k->publish;
                return e;
            }
            p.cut_after = f[i].rule;
            break;
        case JOB_FAULT_ERROR: {
            /* The channel closes under the message and forgets its delivery; a publish copied
             * is dropped with it. */
            struct amqp_content_plan e = plan_end(&p, AMQP_FATE_DROP);
            e.error = plan_error(&f[i], k->method);
            return e;
        }
        case JOB_FAULT_DROP:
            p.fate = AMQP_FATE_DROP;
            if (!k->publish && k->ack_required)
                settle_now(&p, AMQP_NOW_LOST, f[i].rule); /* the job is lost */
            break;
        case JOB_FAULT_DELAY:
            if (!delay || f[i].ms >= p.hold_ms) {
                p.hold_ms = f[i].ms;
                p.hold_rule = f[i].rule;
            }
            delay = true;
            break;
        case JOB_FAULT_DUPLICATE:
            if (!k->publish) {
                plan_dup_delivery(&p, k, &f[i]);
            } else if (!p.dup && !p.dup_missing) {
                p.dup = k->has_copy;
                p.dup_missing = !k->has_copy;
                p.dup_rule = f[i].rule;
            }
            break;
        case JOB_FAULT_EXPIRE:
            if (!k->publish && k->ack_required && k->tracked) {
                if (!p.expire)
                    p.expire_rule = f[i].rule;
                p.expire = true;
                p.expire_ms = f[i].ms;
            }
            break;
        default:
            break;
        }
    }
    /* Only what is forwarded at all is held. */
    if (delay && p.fate == AMQP_FATE_FORWARD)
        p.fate = AMQP_FATE_HOLD;
    else
        p.hold_ms = 0, p.hold_rule = NULL;
    return p;
}

bool amqp_plan_copy_publish(uint32_t fault_kinds)
{
    return (fault_kinds & (1u << JOB_FAULT_DUPLICATE)) != 0;
}

uint32_t amqp_plan_visibility(const struct amqp_visibility_facts *k)
{
    /* Only a delivery the client must ack, that it gets, whose record the ledger keeps (the
     * timer hangs on it), and on which no `expire` rule armed its own. */
    if (k->timeout_ms == 0 || k->publish || !k->ack_required || k->dropped || !k->kept ||
        k->expired)
        return 0;
    return k->timeout_ms;
}

bool amqp_plan_settle_asks_rules(const struct amqp_settle_facts *k)
{
    return !k->hold_ack;
}

enum amqp_release amqp_plan_release_held(bool late_copy)
{
    return late_copy ? AMQP_RELEASE_REQUEUE : AMQP_RELEASE_FORWARD;
}

struct amqp_settle_plan amqp_plan_settle(const struct amqp_settle_facts *k,
                                         const struct job_fault *f, size_t n,
                                         struct amqp_settle_after *after)
{
    struct amqp_settle_plan p = {.verdict = AMQP_V_PASS, .by = AMQP_BY_NONE};
    if (k->hold_ack) {
        p.verdict = AMQP_V_HOLD; /* the late copy's timer settles it */
        p.by = AMQP_BY_COPY;
        return p;
    }
    for (size_t i = 0; i < n; i++) {
        switch (f[i].kind) {
        case JOB_FAULT_REDELIVER:
            /* Requeued instead of forwarded; with D, held and requeued D later. */
            p.verdict = AMQP_V_REQUEUE;
            p.by = AMQP_BY_FAULT;
            if (f[i].ms != 0 && k->tracked) {
                p.verdict = AMQP_V_HOLD;
                p.by = AMQP_BY_LATE;
                if (!p.late)
                    p.late_rule = f[i].rule;
                p.late = true;
                p.late_ms = f[i].ms;
            }
            break;
        case JOB_FAULT_DROP:
            p.verdict = AMQP_V_DROP;
            p.by = AMQP_BY_FAULT;
            if (p.ack_rule == NULL)
                p.ack_rule = f[i].rule;
            break;
        case JOB_FAULT_DELAY:
            /* A hold hangs on the delivery's record: without one the settlement passes. */
            if (!k->tracked)
                break;
            p.verdict = AMQP_V_HOLD;
            p.by = AMQP_BY_HOLD;
            p.hold = true;
            p.hold_ms = f[i].ms;
            p.hold_rule = f[i].rule;
            if (p.ack_rule == NULL)
                p.ack_rule = f[i].rule;
            break;
        case JOB_FAULT_CLOSE:
            if (f[i].before) {
                p.cut_before = f[i].rule;
                return p;
            }
            after->cut_after = f[i].rule;
            break;
        case JOB_FAULT_ERROR:
            p.verdict = AMQP_V_DROP;
            p.by = AMQP_BY_FAULT;
            after->error = plan_error(&f[i], k->method);
            break;
        default:
            break;
        }
    }
    return p;
}

enum amqp_verdict amqp_plan_settle_verdict(const struct amqp_settle_plan *p, bool late_ok,
                                           bool hold_ok)
{
    if (p->by == AMQP_BY_LATE && !late_ok)
        return AMQP_V_REQUEUE;
    if (p->by == AMQP_BY_HOLD && !hold_ok)
        return AMQP_V_PASS;
    return p->verdict;
}

struct amqp_confirm_plan amqp_plan_confirm(const struct job_fault *f, size_t n,
                                           const void **cut_after)
{
    struct amqp_confirm_plan p = {0};
    for (size_t i = 0; i < n; i++) {
        if (f[i].kind == JOB_FAULT_DROP) {
            p.drop = true;
        } else if (f[i].kind == JOB_FAULT_CLOSE && f[i].before) {
            p.cut_before = f[i].rule;
            return p;
        } else if (f[i].kind == JOB_FAULT_CLOSE) {
            *cut_after = f[i].rule;
        }
    }
    return p;
}

void amqp_plan_expiry(const struct amqp_expiry_facts *k, struct amqp_expiry_plan *p)
{
    memset(p, 0, sizeof(*p));
    /* Settled at the broker in time: nothing expired. */
    if (!k->settleable)
        return;
    /* Not settled at the broker within the timeout (the client has not acked, or twice holds
     * or dropped its ack): the broker hands the message to another consumer; a late ack is
     * swallowed, a held one discarded.  An `expire` rule's fault is noted now (a message settled in
     * time was not faulted); the listener's timeout is journaled as EXPIRED naming the rule that
     * held or dropped the ack: that rule's fault was noted when it decided, and the requeue is its
     * consequence, not a second one. */
    p->rule = k->expire_rule != NULL ? k->expire_rule : k->ack_rule;
    p->cause = k->expire_rule != NULL ? AMQP_EXPIRY_RULE
               : k->consumer_timeout  ? AMQP_EXPIRY_CONSUMER
                                      : AMQP_EXPIRY_VISIBILITY;
    if (p->cause != AMQP_EXPIRY_CONSUMER) {
        p->requeue = true;
        return;
    }
    /* RabbitMQ's consumer_timeout: the channel closes under the consumer, every delivery
     * unacked on it goes back to its queue (rabbit_channel's evaluate_consumer_timeout). */
    p->close_channel = true;
    p->close_code = 406;
    snprintf(p->close_text, sizeof(p->close_text),
             "PRECONDITION_FAILED - delivery acknowledgement on channel %u timed out. "
             "Timeout value used: %u ms. This timeout value can be configured, see "
             "consumers doc guide to learn more",
             k->channel, k->timeout_ms);
}

const char *amqp_expiry_name(enum amqp_expiry_cause c)
{
    switch (c) {
    case AMQP_EXPIRY_RULE:
        return "expire";
    case AMQP_EXPIRY_VISIBILITY:
        return "visibility-timeout";
    case AMQP_EXPIRY_CONSUMER:
        return "consumer-timeout";
    default:
        return "";
    }
}
