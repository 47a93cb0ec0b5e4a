/*
 * caps_amqp.c - what the amqp codec can do: its events, matchers and actions.
 *
 * Deliveries, acks (and nacks/rejects), publishes and publisher confirms are
 * message events; each carries the attributes of the message it concerns
 * (an ack, those of the delivery it settles).  Headers are read from the
 * content header, so they can be matched when a message goes through twice
 * (deliver, publish), not when an ack settles it later.
 */
#include "rules/caps.h"

#define STREAM_ACTIONS                                                                             \
    (CAPS_BIT(RULE_ACT_LATENCY) | CAPS_BIT(RULE_ACT_BANDWIDTH) | CAPS_BIT(RULE_ACT_SLICE) |        \
     CAPS_BIT(RULE_ACT_RESET) | CAPS_BIT(RULE_ACT_BLACKHOLE) | CAPS_BIT(RULE_ACT_SLOW_CLOSE) |     \
     CAPS_BIT(RULE_ACT_LIMIT))

#define MESSAGE_FIELDS                                                                             \
    (CAPS_BIT(RULE_F_QUEUE) | CAPS_BIT(RULE_F_EXCHANGE) | CAPS_BIT(RULE_F_ROUTING_KEY) |           \
     CAPS_BIT(RULE_F_MESSAGE_ID) | CAPS_BIT(RULE_F_TASK) | CAPS_BIT(RULE_F_CLIENT))

#define CLOSE_ERROR (CAPS_BIT(RULE_ACT_CLOSE) | CAPS_BIT(RULE_ACT_ERROR))

static const char *amqp_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (act == RULE_ACT_COUNT)
        return ev == RULE_EV_COMMAND ? "'command' is an escape hatch of protocol resp" : NULL;
    switch (act) {
    case RULE_ACT_REDELIVER:
        return "redeliver loses an ack after the work was done: use it on 'ack'";
    case RULE_ACT_DUPLICATE:
        return "it sends a message twice: use it on 'deliver' (a second copy to a consumer) or "
               "'publish' (the broker gets it twice)";
    case RULE_ACT_EXPIRE:
        return "it hands a delivered message out again: use it on 'deliver'";
    case RULE_ACT_DELAY:
        return ev == RULE_EV_CONFIRM ? "a confirm can be dropped, not delayed" : NULL;
    case RULE_ACT_ERROR:
        return ev == RULE_EV_CONFIRM ? "the broker cannot refuse its own confirm" : NULL;
    default:
        return NULL;
    }
}

const struct proto_caps proto_amqp_caps = {
    .name = "amqp",
    .events = CAPS_BIT(RULE_EV_STREAM) | CAPS_BIT(RULE_EV_CONNECT) | CAPS_BIT(RULE_EV_DELIVER) |
              CAPS_BIT(RULE_EV_ACK) | CAPS_BIT(RULE_EV_NACK) | CAPS_BIT(RULE_EV_PUBLISH) |
              CAPS_BIT(RULE_EV_CONFIRM),
    .matchers =
        {
            [RULE_EV_CONNECT] = CAPS_BIT(RULE_F_CLIENT),
            [RULE_EV_DELIVER] = MESSAGE_FIELDS | CAPS_BIT(RULE_F_CONSUMER_TAG) |
                                CAPS_BIT(RULE_F_HEADER) | CAPS_BIT(RULE_F_BODY) |
                                CAPS_BIT(RULE_F_REDELIVERED),
            [RULE_EV_ACK] =
                MESSAGE_FIELDS | CAPS_BIT(RULE_F_CONSUMER_TAG) | CAPS_BIT(RULE_F_REDELIVERED),
            [RULE_EV_NACK] =
                MESSAGE_FIELDS | CAPS_BIT(RULE_F_CONSUMER_TAG) | CAPS_BIT(RULE_F_REDELIVERED),
            [RULE_EV_PUBLISH] = MESSAGE_FIELDS | CAPS_BIT(RULE_F_HEADER) | CAPS_BIT(RULE_F_BODY),
            [RULE_EV_CONFIRM] = MESSAGE_FIELDS,
        },
    .actions =
        {
            [RULE_EV_STREAM] = STREAM_ACTIONS,
            [RULE_EV_CONNECT] =
                STREAM_ACTIONS | CAPS_BIT(RULE_ACT_CLOSE) | CAPS_BIT(RULE_ACT_DELAY),
            [RULE_EV_DELIVER] = CAPS_BIT(RULE_ACT_DUPLICATE) | CAPS_BIT(RULE_ACT_EXPIRE) |
                                CAPS_BIT(RULE_ACT_DELAY) | CAPS_BIT(RULE_ACT_DROP) | CLOSE_ERROR,
            [RULE_EV_ACK] = CAPS_BIT(RULE_ACT_REDELIVER) | CAPS_BIT(RULE_ACT_DELAY) |
                            CAPS_BIT(RULE_ACT_DROP) | CLOSE_ERROR,
            [RULE_EV_NACK] = CAPS_BIT(RULE_ACT_DELAY) | CAPS_BIT(RULE_ACT_DROP) | CLOSE_ERROR,
            [RULE_EV_PUBLISH] = CAPS_BIT(RULE_ACT_DUPLICATE) | CAPS_BIT(RULE_ACT_DELAY) |
                                CAPS_BIT(RULE_ACT_DROP) | CLOSE_ERROR,
            [RULE_EV_CONFIRM] = CAPS_BIT(RULE_ACT_DROP) | CAPS_BIT(RULE_ACT_CLOSE),
        },
    .why_not = amqp_why_not,
    /* The ack is held and a reject with requeue sent at D (redeliver), or the
     * delivery requeued D after it was made, its ack held until then (duplicate). */
    .late = {[RULE_EV_DELIVER] = CAPS_BIT(RULE_ACT_DUPLICATE),
             [RULE_EV_ACK] = CAPS_BIT(RULE_ACT_REDELIVER)},
};
