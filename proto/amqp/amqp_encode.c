/*
 * amqp_encode.c - the AMQP 0-9-1 frames twice writes itself (acks, rejects and nacks it
 * substitutes, channel/connection closes it injects, heartbeats it keeps alive while a
 * direction is stalled), and in-place patches of delivery tags and redelivered bits.
 *
 * The output is byte-for-byte what RabbitMQ, pika and py-amqp put on the wire for the same
 * method: big-endian fields, bits packed LSB first into one octet, no trailing bytes.  Each
 * encoder writes through the bounded writer of amqp_wire.h and checks once at the end.
 */
#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_wire.h"

/* Writes a METHOD frame header with a size placeholder, then the class and method ids. */
static void amqp_wr_method_begin(struct amqp_wr *w, uint16_t channel, uint32_t id)
{
    amqp_wr_u8(w, AMQP_FRAME_METHOD);
    amqp_wr_u16(w, channel);
    amqp_wr_u32(w, 0);
    amqp_wr_u16(w, (uint16_t)(id >> 16));
    amqp_wr_u16(w, (uint16_t)id);
}

/* Appends the frame-end octet and fills in the payload size.  Returns the frame length or the
 * writer's error. */
static int amqp_wr_frame_end(struct amqp_wr *w)
{
    amqp_wr_u8(w, AMQP_FRAME_END);
    if (w->err != 0)
        return w->err;
    amqp_store_u32(w->buf + 3, (uint32_t)(w->off - AMQP_FRAME_OVERHEAD));
    return (int)w->off;
}

/* ack, reject and nack share one layout: longlong delivery-tag, one octet of bits. */
static int amqp_encode_settle(uint8_t *buf, size_t cap, uint16_t channel, uint32_t id,
                              uint64_t delivery_tag, uint8_t bits)
{
    struct amqp_wr w;

    amqp_wr_init(&w, buf, cap);
    amqp_wr_method_begin(&w, channel, id);
    amqp_wr_u64(&w, delivery_tag);
    amqp_wr_u8(&w, bits);
    return amqp_wr_frame_end(&w);
}

int amqp_encode_basic_ack(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                          bool multiple)
{
    return amqp_encode_settle(buf, cap, channel, AMQP_BASIC_ACK, delivery_tag, multiple ? 1 : 0);
}

int amqp_encode_basic_reject(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                             bool requeue)
{
    return amqp_encode_settle(buf, cap, channel, AMQP_BASIC_REJECT, delivery_tag, requeue ? 1 : 0);
}

int amqp_encode_basic_nack(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                           bool multiple, bool requeue)
{
    uint8_t bits = (uint8_t)((multiple ? 1 : 0) | (requeue ? 2 : 0));
    return amqp_encode_settle(buf, cap, channel, AMQP_BASIC_NACK, delivery_tag, bits);
}

int amqp_encode_basic_publish(uint8_t *buf, size_t cap, uint16_t channel,
                              const struct amqp_publish *p)
{
    struct amqp_wr w;

    amqp_wr_init(&w, buf, cap);
    amqp_wr_method_begin(&w, channel, AMQP_BASIC_PUBLISH);
    amqp_wr_u16(&w, 0); /* reserved-1 (ticket) */
    amqp_wr_shortstr(&w, p->exchange);
    amqp_wr_shortstr(&w, p->routing_key);
    amqp_wr_u8(&w, (uint8_t)((p->mandatory ? 1 : 0) | (p->immediate ? 2 : 0)));
    return amqp_wr_frame_end(&w);
}

/* connection.close and channel.close: short reply-code, shortstr reply-text, short class-id,
 * short method-id. */
static int amqp_encode_close(uint8_t *buf, size_t cap, uint16_t channel, uint32_t id,
                             uint16_t reply_code, struct amqp_bytes reply_text, uint16_t class_id,
                             uint16_t method_id)
{
    struct amqp_wr w;

    amqp_wr_init(&w, buf, cap);
    amqp_wr_method_begin(&w, channel, id);
    amqp_wr_u16(&w, reply_code);
    amqp_wr_shortstr(&w, reply_text);
    amqp_wr_u16(&w, class_id);
    amqp_wr_u16(&w, method_id);
    return amqp_wr_frame_end(&w);
}

/* A method without arguments. */
static int amqp_encode_empty(uint8_t *buf, size_t cap, uint16_t channel, uint32_t id)
{
    struct amqp_wr w;

    amqp_wr_init(&w, buf, cap);
    amqp_wr_method_begin(&w, channel, id);
    return amqp_wr_frame_end(&w);
}

int amqp_encode_channel_close(uint8_t *buf, size_t cap, uint16_t channel, uint16_t reply_code,
                              struct amqp_bytes reply_text, uint16_t class_id, uint16_t method_id)
{
    return amqp_encode_close(buf, cap, channel, AMQP_CHANNEL_CLOSE, reply_code, reply_text,
                             class_id, method_id);
}

int amqp_encode_channel_close_ok(uint8_t *buf, size_t cap, uint16_t channel)
{
    return amqp_encode_empty(buf, cap, channel, AMQP_CHANNEL_CLOSE_OK);
}

int amqp_encode_connection_close(uint8_t *buf, size_t cap, uint16_t reply_code,
                                 struct amqp_bytes reply_text, uint16_t class_id,
                                 uint16_t method_id)
{
    return amqp_encode_close(buf, cap, 0, AMQP_CONNECTION_CLOSE, reply_code, reply_text, class_id,
                             method_id);
}

int amqp_encode_connection_close_ok(uint8_t *buf, size_t cap)
{
    return amqp_encode_empty(buf, cap, 0, AMQP_CONNECTION_CLOSE_OK);
}

int amqp_encode_heartbeat(uint8_t *buf, size_t cap)
{
    struct amqp_wr w;

    amqp_wr_init(&w, buf, cap);
    amqp_wr_u8(&w, AMQP_FRAME_HEARTBEAT);
    amqp_wr_u16(&w, 0);
    amqp_wr_u32(&w, 0);
    return amqp_wr_frame_end(&w);
}

void amqp_patch_delivery_tag(uint8_t *payload, size_t offset, uint64_t tag)
{
    amqp_store_u32(payload + offset, (uint32_t)(tag >> 32));
    amqp_store_u32(payload + offset + 4, (uint32_t)tag);
}

void amqp_set_redelivered(uint8_t *payload, size_t offset, bool on)
{
    if (on)
        payload[offset] |= 1u;
    else
        payload[offset] &= (uint8_t)~1u;
}
