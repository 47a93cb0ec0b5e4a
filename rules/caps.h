/*
 * caps.h - what each protocol codec can do, in the rules' vocabulary.
 *
 * One table per codec (rules/caps_tcp.c, caps_amqp.c, caps_resp.c, found by
 * caps_registry.c) declares the events it produces, the matchers each event
 * can be filtered by and the actions it can perform on each event, with a
 * reason for each action it refuses.  The rule checker reads only these
 * tables, so adding a protocol needs no special case elsewhere in rules/.
 */
#ifndef TWICE_CAPS_H
#define TWICE_CAPS_H

#include <stdint.h>

#include "rules/conf.h"
#include "rules/rule.h"

#define CAPS_BIT(x) (1u << (unsigned)(x))

struct proto_caps {
    const char *name;                 /* "tcp", "amqp", "resp/sidekiq", ... */
    uint32_t events;                  /* CAPS_BIT(enum rule_event) */
    uint32_t matchers[RULE_EV_COUNT]; /* per event: CAPS_BIT(enum rule_field) */
    uint32_t actions[RULE_EV_COUNT];  /* per event: CAPS_BIT(enum rule_action_kind) */
    /* Why `ev` is not produced by this codec, or why `act` cannot be done on
     * `ev` (when `act` is RULE_ACT_COUNT, the question is about the event).
     * NULL, or returning NULL, means no specific reason. */
    const char *(*why_not)(enum rule_event ev, enum rule_action_kind act);
    /* Per event: the actions that can be made late (`do redeliver after D`,
     * `do duplicate after D`: the copy reaches a worker D after the ack or the
     * delivery), and why one cannot (NULL: no specific reason). */
    uint32_t late[RULE_EV_COUNT];
    const char *(*why_not_late)(enum rule_event ev, enum rule_action_kind act);
};

/* The capabilities of a listener's protocol and profile (profile may be
 * NULL).  Never NULL: protocols without a codec yet use tcp's. */
const struct proto_caps *proto_caps_find(enum conf_protocol protocol, const char *profile);

#endif
