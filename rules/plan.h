/*
 * plan.h - the rule that fired on a job event, as the fault a framework module carries out
 * (proto/jobs/job.h).
 *
 * The engine (rules/engine.h) says which rules fire on an event; for a job event the first one
 * whose action acts on events (not on the byte stream) decides it, and this turns it into a
 * struct job_fault: the module needs the kind of fault, its time and, for a cut, which side of
 * the frame, never the rule itself (it gets it back as an opaque handle).  A command that a
 * codec handles itself (a Redis listener's `command` event) gets a struct job_fault the same
 * way, which the codec turns into a plan like a module's.
 */
#ifndef TWICE_RULES_PLAN_H
#define TWICE_RULES_PLAN_H

#include "proto/jobs/job.h"
#include "rules/rule.h"

/* The fault rule r asks of a job event; JOB_FAULT_NONE for NULL. */
struct job_fault rule_job_fault(const struct rule *r);

/* The AMQP reply code of an `error` rule: the number it names ("-406" is 406), 406 when it
 * names none or no number in 200..599. */
uint16_t rule_error_code(const struct rule *r);

/* The fault rule r asks of a command that a codec handles itself, not a framework module (a
 * Redis listener's `command` event), as a job_fault of one of these kinds: JOB_FAULT_ERROR (the
 * rule's error answered in its place), _DROP (swallowed and never answered, nor what follows
 * it: a hung server), _DELAY (held ms), _CLOSE (cut before it reaches the server, or after its
 * reply); JOB_FAULT_OTHER for an action that does not act on a command (a stream action,
 * redeliver, duplicate, expire); JOB_FAULT_NONE for NULL. */
struct job_fault rule_cmd_fault(const struct rule *r);

/* The rules' event of a module's event, and back. */
enum rule_event rule_event_of_job(enum job_ev k);
enum job_ev job_ev_of_rule(enum rule_event e);

#endif
