/*
 * caps_tcp.c - the `tcp` protocol's capabilities: opaque bytes, no message events.
 *
 * A tcp listener knows only connections, so its rules are stream actions,
 * applied to every connection (no `when`) or to connections matched by
 * `when connect client=CIDR`; `when connect` can also refuse (`close`) or
 * hold (`delay`) a connection before twice connects it upstream.
 */
#include "rules/caps.h"

#define STREAM_ACTIONS                                                                             \
    (CAPS_BIT(RULE_ACT_LATENCY) | CAPS_BIT(RULE_ACT_BANDWIDTH) | CAPS_BIT(RULE_ACT_SLICE) |        \
     CAPS_BIT(RULE_ACT_RESET) | CAPS_BIT(RULE_ACT_BLACKHOLE) | CAPS_BIT(RULE_ACT_SLOW_CLOSE) |     \
     CAPS_BIT(RULE_ACT_LIMIT))

static const char *tcp_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (act == RULE_ACT_COUNT && ev != RULE_EV_STREAM && ev != RULE_EV_CONNECT)
        return "protocol tcp carries opaque bytes: it sees connections, not messages "
               "(use protocol amqp or resp for message events)";
    if (ev == RULE_EV_CONNECT && act == RULE_ACT_CLOSE)
        return NULL;
    switch (act) {
    case RULE_ACT_REDELIVER:
    case RULE_ACT_DUPLICATE:
    case RULE_ACT_EXPIRE:
    case RULE_ACT_DROP:
    case RULE_ACT_ERROR:
        return "this action works on messages, and protocol tcp has none";
    case RULE_ACT_CLOSE:
    case RULE_ACT_DELAY:
        return "on a tcp listener, close and delay apply to 'when connect'";
    default:
        return NULL;
    }
}

const struct proto_caps proto_tcp_caps = {
    .name = "tcp",
    .events = CAPS_BIT(RULE_EV_STREAM) | CAPS_BIT(RULE_EV_CONNECT),
    .matchers =
        {
            [RULE_EV_STREAM] = 0,
            [RULE_EV_CONNECT] = CAPS_BIT(RULE_F_CLIENT),
        },
    .actions =
        {
            [RULE_EV_STREAM] = STREAM_ACTIONS,
            [RULE_EV_CONNECT] =
                STREAM_ACTIONS | CAPS_BIT(RULE_ACT_CLOSE) | CAPS_BIT(RULE_ACT_DELAY),
        },
    .why_not = tcp_why_not,
};
