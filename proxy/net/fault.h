/*
 * fault.h - what twice says when it injects a fault.
 *
 * Every injected fault gets one logfmt line (session, listener, rule,
 * action, and the message's queue and id where known) and, with `journal`
 * set, a FAULT record in the journal.
 */
#ifndef TWICE_FAULT_H
#define TWICE_FAULT_H

#include "rules/engine.h"
#include "rules/rule.h"

struct session;

/* Note that rule `r` faulted an event of session `s`; `ev` is the message
 * event (NULL for connection faults). */
void fault_note(struct session *s, const struct rule *r, const struct engine_event *ev);

#endif
