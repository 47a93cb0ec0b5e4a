/*
 * registry.c - from a listener's protocol and profile to its codec's
 * capabilities.  Protocols whose codec is not built yet (resp) are carried
 * as tcp.
 */
#include "rules/caps.h"

extern const struct proto_caps proto_tcp_caps;
extern const struct proto_caps proto_amqp_caps;

const struct proto_caps *proto_caps_find(enum conf_protocol protocol, const char *profile)
{
    (void)profile;
    switch (protocol) {
    case CONF_PROTO_AMQP:
        return &proto_amqp_caps;
    case CONF_PROTO_TCP:
    case CONF_PROTO_RESP:
    default:
        return &proto_tcp_caps;
    }
}
