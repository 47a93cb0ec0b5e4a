/*
 * plan.c - rules that fired, as the faults framework modules and codecs carry out
 * (rules/plan.h).
 */
#include "rules/plan.h"

#include <stdlib.h>

uint16_t rule_error_code(const struct rule *r)
{
    const char *c = r->action.error_code != NULL ? r->action.error_code : "406";
    if (*c == '-')
        c++;
    long v = strtol(c, NULL, 10);
    return v >= 200 && v <= 599 ? (uint16_t)v : 406;
}

struct job_fault rule_job_fault(const struct rule *r)
{
    struct job_fault f = {.kind = JOB_FAULT_NONE};
    if (r == NULL)
        return f;
    f.rule = r;
    f.ms = r->action.duration_ms;
    switch (r->action.kind) {
    case RULE_ACT_DROP:
        f.kind = JOB_FAULT_DROP;
        break;
    case RULE_ACT_DELAY:
        f.kind = JOB_FAULT_DELAY;
        break;
    case RULE_ACT_REDELIVER:
        f.kind = JOB_FAULT_REDELIVER;
        break;
    case RULE_ACT_DUPLICATE:
        f.kind = JOB_FAULT_DUPLICATE;
        break;
    case RULE_ACT_CLOSE:
        f.kind = JOB_FAULT_CLOSE;
        f.before = r->action.close_when == RULE_CLOSE_BEFORE;
        break;
    case RULE_ACT_ERROR:
        f.kind = JOB_FAULT_ERROR;
        f.code = rule_error_code(r);
        break;
    case RULE_ACT_EXPIRE:
        f.kind = JOB_FAULT_EXPIRE;
        break;
    default:
        f.kind = JOB_FAULT_OTHER;
        break;
    }
    return f;
}

struct job_fault rule_cmd_fault(const struct rule *r)
{
    /* drop, delay, close and error mean to a command what they mean to a job's frame */
    struct job_fault f = rule_job_fault(r);
    switch (f.kind) {
    case JOB_FAULT_NONE:
    case JOB_FAULT_ERROR:
    case JOB_FAULT_DROP:
    case JOB_FAULT_DELAY:
    case JOB_FAULT_CLOSE:
        break;
    default:
        f.kind = JOB_FAULT_OTHER;
        break;
    }
    return f;
}

enum rule_event rule_event_of_job(enum job_ev k)
{
    switch (k) {
    case JOB_EV_PUBLISH:
        return RULE_EV_PUBLISH;
    case JOB_EV_DELIVER:
        return RULE_EV_DELIVER;
    case JOB_EV_ACK:
        return RULE_EV_ACK;
    case JOB_EV_NACK:
        return RULE_EV_NACK;
    default:
        return RULE_EV_LEASE;
    }
}

enum job_ev job_ev_of_rule(enum rule_event e)
{
    switch (e) {
    case RULE_EV_PUBLISH:
        return JOB_EV_PUBLISH;
    case RULE_EV_DELIVER:
        return JOB_EV_DELIVER;
    case RULE_EV_ACK:
        return JOB_EV_ACK;
    case RULE_EV_NACK:
        return JOB_EV_NACK;
    case RULE_EV_LEASE:
        return JOB_EV_LEASE;
    default:
        return JOB_EV_COUNT;
    }
}
