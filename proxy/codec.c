/*
 * codec.c - which protocol layer a listener's sessions use.
 */
#include "proxy/codec.h"

const struct codec_ops *codec_for(const struct conf_listener *l)
{
    switch (l->protocol) {
    case CONF_PROTO_AMQP:
        return &amqp_codec_ops;
    case CONF_PROTO_RESP:
        return &resp_codec_ops;
    case CONF_PROTO_TCP:
    default:
        return NULL;
    }
}
