/*
 * caps_registry.c - from a listener's protocol and profile to its codec's
 * capabilities.
 */
#include "rules/caps.h"

extern const struct proto_caps proto_tcp_caps;
extern const struct proto_caps proto_amqp_caps;
const struct proto_caps *proto_resp_caps_find(const char *profile);

const struct proto_caps *proto_caps_find(enum conf_protocol protocol, const char *profile)
{
    switch (protocol) {
    case CONF_PROTO_AMQP:
        return &proto_amqp_caps;
    case CONF_PROTO_RESP:
        return proto_resp_caps_find(profile);
    case CONF_PROTO_TCP:
    default:
        return &proto_tcp_caps;
    }
}
