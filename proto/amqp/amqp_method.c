/*
 * amqp_method.c - AMQP 0-9-1 METHOD frame payloads: class-id u16, method-id u16, arguments.
 *
 * One table lists every 0-9-1 method (RabbitMQ's extensions included) with its name, whether
 * content follows, and, for the methods a fault-injecting proxy acts on, a decoder.  Each
 * decoder is a few lines that read the arguments in order through the sticky-error reader of
 * amqp_wire.h; amqp_method_decode() checks once at the end that nothing ran short and nothing
 * was left over, the way RabbitMQ's generated decoders match the exact binary.
 *
 * Argument encodings (AMQP 0-9-1 specification, 4.2.5 and amqp0-9-1.xml): octet u8, short u16, long
 * u32, longlong u64 (all big endian), shortstr u8 len + bytes, longstr and table u32 len + bytes.
 * Consecutive bit arguments share one octet, first argument in the least significant bit.
 */
#include <stdlib.h>

#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_wire.h"

typedef void (*amqp_decode_fn)(struct amqp_rd *r, struct amqp_method *m);

struct amqp_method_desc {
    uint32_t id; /* AMQP_MID(class, method); the table is sorted by it */
    const char *name;
    bool content;          /* a content header and body frames follow */
    amqp_decode_fn decode; /* NULL: named only, forwarded undecoded */
};

static bool amqp_bit(uint8_t bits, unsigned n)
{
    return (bits >> n & 1u) != 0;
}

static void decode_none(struct amqp_rd *r, struct amqp_method *m)
{
    (void)r;
    (void)m;
}

/* connection.start-ok: table client-properties, shortstr mechanism, longstr response,
 * shortstr locale. */
static void decode_start_ok(struct amqp_rd *r, struct amqp_method *m)
{
    m->start_ok.client_properties = amqp_rd_table(r);
    m->start_ok.mechanism = amqp_rd_shortstr(r);
    uint32_t len = amqp_rd_u32(r);
    m->start_ok.response_offset = (uint32_t)r->off;
    m->start_ok.response = amqp_rd_bytes(r, len);
    m->start_ok.locale = amqp_rd_shortstr(r);
}

/* connection.tune / tune-ok: short channel-max, long frame-max, short heartbeat. */
static void decode_tune(struct amqp_rd *r, struct amqp_method *m)
{
    m->tune.channel_max = amqp_rd_u16(r);
    m->tune.frame_max = amqp_rd_u32(r);
    m->tune.heartbeat = amqp_rd_u16(r);
}

/* connection.open: shortstr vhost, shortstr capabilities (reserved), bit insist (reserved). */
static void decode_connection_open(struct amqp_rd *r, struct amqp_method *m)
{
    m->vhost = amqp_rd_shortstr(r);
    (void)amqp_rd_shortstr(r);
    (void)amqp_rd_u8(r);
}

/* connection.close / channel.close: short reply-code, shortstr reply-text, short class-id,
 * short method-id. */
static void decode_close(struct amqp_rd *r, struct amqp_method *m)
{
    m->close.reply_code = amqp_rd_u16(r);
    m->close.reply_text = amqp_rd_shortstr(r);
    m->close.class_id = amqp_rd_u16(r);
    m->close.method_id = amqp_rd_u16(r);
}

/* channel.open: shortstr out-of-band (reserved). */
static void decode_channel_open(struct amqp_rd *r, struct amqp_method *m)
{
    (void)m;
    (void)amqp_rd_shortstr(r);
}

/* channel.open-ok: longstr channel-id (reserved). */
static void decode_channel_open_ok(struct amqp_rd *r, struct amqp_method *m)
{
    (void)m;
    (void)amqp_rd_longstr(r);
}

/* channel.flow / flow-ok: bit active. */
static void decode_flow(struct amqp_rd *r, struct amqp_method *m)
{
    m->active = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.qos: long prefetch-size, short prefetch-count, bit global. */
static void decode_qos(struct amqp_rd *r, struct amqp_method *m)
{
    m->qos.prefetch_size = amqp_rd_u32(r);
    m->qos.prefetch_count = amqp_rd_u16(r);
    m->qos.global = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.consume: short ticket, shortstr queue, shortstr consumer-tag, bits no-local no-ack
 * exclusive nowait, table arguments. */
static void decode_consume(struct amqp_rd *r, struct amqp_method *m)
{
    (void)amqp_rd_u16(r);
    m->consume.queue = amqp_rd_shortstr(r);
    m->consume.consumer_tag = amqp_rd_shortstr(r);
    uint8_t bits = amqp_rd_u8(r);
    m->consume.no_local = amqp_bit(bits, 0);
    m->consume.no_ack = amqp_bit(bits, 1);
    m->consume.exclusive = amqp_bit(bits, 2);
    m->consume.nowait = amqp_bit(bits, 3);
    m->consume.arguments = amqp_rd_table(r);
}

/* basic.consume-ok / cancel-ok: shortstr consumer-tag. */
static void decode_consumer_tag(struct amqp_rd *r, struct amqp_method *m)
{
    m->consumer.consumer_tag = amqp_rd_shortstr(r);
}

/* basic.cancel: shortstr consumer-tag, bit nowait. */
static void decode_cancel(struct amqp_rd *r, struct amqp_method *m)
{
    m->consumer.consumer_tag = amqp_rd_shortstr(r);
    m->consumer.nowait = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.publish: short ticket, shortstr exchange, shortstr routing-key, bits mandatory
 * immediate. */
static void decode_publish(struct amqp_rd *r, struct amqp_method *m)
{
    (void)amqp_rd_u16(r);
    m->publish.exchange = amqp_rd_shortstr(r);
    m->publish.routing_key = amqp_rd_shortstr(r);
    uint8_t bits = amqp_rd_u8(r);
    m->publish.mandatory = amqp_bit(bits, 0);
    m->publish.immediate = amqp_bit(bits, 1);
}

/* basic.return: short reply-code, shortstr reply-text, shortstr exchange, shortstr
 * routing-key. */
static void decode_return(struct amqp_rd *r, struct amqp_method *m)
{
    m->ret.reply_code = amqp_rd_u16(r);
    m->ret.reply_text = amqp_rd_shortstr(r);
    m->ret.exchange = amqp_rd_shortstr(r);
    m->ret.routing_key = amqp_rd_shortstr(r);
}

/* The part deliver and get-ok share: longlong delivery-tag, bit redelivered, shortstr
 * exchange, shortstr routing-key; with the offsets the patchers need. */
static void decode_delivery_tail(struct amqp_rd *r, struct amqp_delivery *d)
{
    d->tag_offset = (uint32_t)r->off;
    d->delivery_tag = amqp_rd_u64(r);
    d->redelivered_offset = (uint32_t)r->off;
    d->redelivered = amqp_bit(amqp_rd_u8(r), 0);
    d->exchange = amqp_rd_shortstr(r);
    d->routing_key = amqp_rd_shortstr(r);
}

/* basic.deliver: shortstr consumer-tag, then the shared tail. */
static void decode_deliver(struct amqp_rd *r, struct amqp_method *m)
{
    m->delivery.consumer_tag = amqp_rd_shortstr(r);
    decode_delivery_tail(r, &m->delivery);
}

/* basic.get-ok: the shared tail, then long message-count. */
static void decode_get_ok(struct amqp_rd *r, struct amqp_method *m)
{
    decode_delivery_tail(r, &m->delivery);
    m->delivery.message_count = amqp_rd_u32(r);
}

/* basic.get: short ticket, shortstr queue, bit no-ack. */
static void decode_get(struct amqp_rd *r, struct amqp_method *m)
{
    (void)amqp_rd_u16(r);
    m->get.queue = amqp_rd_shortstr(r);
    m->get.no_ack = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.get-empty: shortstr cluster-id (reserved, empty). */
static void decode_get_empty(struct amqp_rd *r, struct amqp_method *m)
{
    m->cluster_id = amqp_rd_shortstr(r);
}

/* basic.ack: longlong delivery-tag, bit multiple. */
static void decode_ack(struct amqp_rd *r, struct amqp_method *m)
{
    m->ack.delivery_tag = amqp_rd_u64(r);
    m->ack.multiple = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.reject: longlong delivery-tag, bit requeue. */
static void decode_reject(struct amqp_rd *r, struct amqp_method *m)
{
    m->ack.delivery_tag = amqp_rd_u64(r);
    m->ack.requeue = amqp_bit(amqp_rd_u8(r), 0);
}

/* basic.nack: longlong delivery-tag, bits multiple requeue. */
static void decode_nack(struct amqp_rd *r, struct amqp_method *m)
{
    m->ack.delivery_tag = amqp_rd_u64(r);
    uint8_t bits = amqp_rd_u8(r);
    m->ack.multiple = amqp_bit(bits, 0);
    m->ack.requeue = amqp_bit(bits, 1);
}

/* basic.recover-async / recover: bit requeue. */
static void decode_recover(struct amqp_rd *r, struct amqp_method *m)
{
    m->requeue = amqp_bit(amqp_rd_u8(r), 0);
}

/* confirm.select: bit nowait. */
static void decode_confirm_select(struct amqp_rd *r, struct amqp_method *m)
{
    m->nowait = amqp_bit(amqp_rd_u8(r), 0);
}

#define M(c, m, name, content, fn)                                                                 \
    {                                                                                              \
        AMQP_MID(c, m), name, content, fn                                                          \
    }

static const struct amqp_method_desc amqp_methods[] = {
    M(10, 10, "connection.start", false, NULL),
    M(10, 11, "connection.start-ok", false, decode_start_ok),
    M(10, 20, "connection.secure", false, NULL),
    M(10, 21, "connection.secure-ok", false, NULL),
    M(10, 30, "connection.tune", false, decode_tune),
    M(10, 31, "connection.tune-ok", false, decode_tune),
    M(10, 40, "connection.open", false, decode_connection_open),
    M(10, 41, "connection.open-ok", false, NULL),
    M(10, 50, "connection.close", false, decode_close),
    M(10, 51, "connection.close-ok", false, decode_none),
    M(10, 60, "connection.blocked", false, NULL),
    M(10, 61, "connection.unblocked", false, NULL),
    M(10, 70, "connection.update-secret", false, NULL),
    M(10, 71, "connection.update-secret-ok", false, NULL),
    M(20, 10, "channel.open", false, decode_channel_open),
    M(20, 11, "channel.open-ok", false, decode_channel_open_ok),
    M(20, 20, "channel.flow", false, decode_flow),
    M(20, 21, "channel.flow-ok", false, decode_flow),
    M(20, 40, "channel.close", false, decode_close),
    M(20, 41, "channel.close-ok", false, decode_none),
    M(30, 10, "access.request", false, NULL),
    M(30, 11, "access.request-ok", false, NULL),
    M(40, 10, "exchange.declare", false, NULL),
    M(40, 11, "exchange.declare-ok", false, NULL),
    M(40, 20, "exchange.delete", false, NULL),
    M(40, 21, "exchange.delete-ok", false, NULL),
    M(40, 30, "exchange.bind", false, NULL),
    M(40, 31, "exchange.bind-ok", false, NULL),
    M(40, 40, "exchange.unbind", false, NULL),
    M(40, 51, "exchange.unbind-ok", false, NULL),
    M(50, 10, "queue.declare", false, NULL),
    M(50, 11, "queue.declare-ok", false, NULL),
    M(50, 20, "queue.bind", false, NULL),
    M(50, 21, "queue.bind-ok", false, NULL),
    M(50, 30, "queue.purge", false, NULL),
    M(50, 31, "queue.purge-ok", false, NULL),
    M(50, 40, "queue.delete", false, NULL),
    M(50, 41, "queue.delete-ok", false, NULL),
    M(50, 50, "queue.unbind", false, NULL),
    M(50, 51, "queue.unbind-ok", false, NULL),
    M(60, 10, "basic.qos", false, decode_qos),
    M(60, 11, "basic.qos-ok", false, decode_none),
    M(60, 20, "basic.consume", false, decode_consume),
    M(60, 21, "basic.consume-ok", false, decode_consumer_tag),
    M(60, 30, "basic.cancel", false, decode_cancel),
    M(60, 31, "basic.cancel-ok", false, decode_consumer_tag),
    M(60, 40, "basic.publish", true, decode_publish),
    M(60, 50, "basic.return", true, decode_return),
    M(60, 60, "basic.deliver", true, decode_deliver),
    M(60, 70, "basic.get", false, decode_get),
    M(60, 71, "basic.get-ok", true, decode_get_ok),
    M(60, 72, "basic.get-empty", false, decode_get_empty),
    M(60, 80, "basic.ack", false, decode_ack),
    M(60, 90, "basic.reject", false, decode_reject),
    M(60, 100, "basic.recover-async", false, decode_recover),
    M(60, 110, "basic.recover", false, decode_recover),
    M(60, 111, "basic.recover-ok", false, decode_none),
    M(60, 120, "basic.nack", false, decode_nack),
    M(85, 10, "confirm.select", false, decode_confirm_select),
    M(85, 11, "confirm.select-ok", false, decode_none),
    M(90, 10, "tx.select", false, decode_none),
    M(90, 11, "tx.select-ok", false, decode_none),
    M(90, 20, "tx.commit", false, decode_none),
    M(90, 21, "tx.commit-ok", false, decode_none),
    M(90, 30, "tx.rollback", false, decode_none),
    M(90, 31, "tx.rollback-ok", false, decode_none),
};

#undef M

#define AMQP_METHODS (sizeof(amqp_methods) / sizeof(amqp_methods[0]))

static int amqp_method_desc_cmp(const void *key, const void *elem)
{
    uint32_t id = *(const uint32_t *)key;
    const struct amqp_method_desc *d = elem;
    return id < d->id ? -1 : id > d->id ? 1 : 0;
}

/* Where the methods of every message are in the table (amqp_method_table_ok() checks that
 * looking each entry up finds it, so a wrong place here fails the unit test). */
#define AMQP_AT_PUBLISH 46u
#define AMQP_AT_DELIVER 48u
#define AMQP_AT_ACK 52u

/* The table entry for (class, method), or NULL.  A message's own methods are taken at their
 * places: the bsearch cost ~50 instructions each, three times per message.  (glibc inlines
 * bsearch and its comparator; a binary search written out cost more, as it does not stop at
 * the match.) */
static const struct amqp_method_desc *amqp_method_lookup(uint16_t class_id, uint16_t method_id)
{
    uint32_t id = AMQP_MID(class_id, method_id);
    switch (id) {
    case AMQP_MID(60, 40):
        return &amqp_methods[AMQP_AT_PUBLISH];
    case AMQP_MID(60, 60):
        return &amqp_methods[AMQP_AT_DELIVER];
    case AMQP_MID(60, 80):
        return &amqp_methods[AMQP_AT_ACK];
    default:
        return bsearch(&id, amqp_methods, AMQP_METHODS, sizeof(amqp_methods[0]),
                       amqp_method_desc_cmp);
    }
}

bool amqp_method_table_ok(void)
{
    for (size_t i = 0; i < AMQP_METHODS; i++)
        if ((i > 0 && amqp_methods[i - 1].id >= amqp_methods[i].id) ||
            amqp_method_lookup((uint16_t)(amqp_methods[i].id >> 16),
                               (uint16_t)amqp_methods[i].id) != &amqp_methods[i])
            return false;
    return true;
}

int amqp_method_decode(const uint8_t *payload, uint32_t size, struct amqp_method *m)
{
    struct amqp_rd r;

    memset(m, 0, sizeof(*m));
    amqp_rd_init(&r, payload, size);
    m->class_id = amqp_rd_u16(&r);
    m->method_id = amqp_rd_u16(&r);
    if (r.err != 0)
        return r.err;
    m->id = AMQP_MID(m->class_id, m->method_id);

    const struct amqp_method_desc *d = amqp_method_lookup(m->class_id, m->method_id);
    if (d == NULL || d->decode == NULL)
        return AMQP_OK;
    d->decode(&r, m);
    int rc = amqp_rd_finish(&r);
    if (rc < 0) {
        /* No half-filled views escape a failed decode; the ids stay for the caller's log. */
        memset(m, 0, sizeof(*m));
        m->class_id = (uint16_t)(d->id >> 16);
        m->method_id = (uint16_t)d->id;
        m->id = d->id;
        return rc;
    }
    m->decoded = true;
    return AMQP_OK;
}

bool amqp_method_has_content(uint16_t class_id, uint16_t method_id)
{
    const struct amqp_method_desc *d = amqp_method_lookup(class_id, method_id);
    return d != NULL && d->content;
}

const char *amqp_method_name(uint16_t class_id, uint16_t method_id)
{
    const struct amqp_method_desc *d = amqp_method_lookup(class_id, method_id);
    return d == NULL ? "unknown" : d->name;
}

const char *amqp_reply_error_name(uint16_t code)
{
    switch (code) {
    case 311:
        return "CONTENT_TOO_LARGE";
    case 312:
        return "NO_ROUTE";
    case 313:
        return "NO_CONSUMERS";
    case 320:
        return "CONNECTION_FORCED";
    case 402:
        return "INVALID_PATH";
    case 403:
        return "ACCESS_REFUSED";
    case 404:
        return "NOT_FOUND";
    case 405:
        return "RESOURCE_LOCKED";
    case 406:
        return "PRECONDITION_FAILED";
    case 501:
        return "FRAME_ERROR";
    case 502:
        return "SYNTAX_ERROR";
    case 503:
        return "COMMAND_INVALID";
    case 504:
        return "CHANNEL_ERROR";
    case 505:
        return "UNEXPECTED_FRAME";
    case 506:
        return "RESOURCE_ERROR";
    case 530:
        return "NOT_ALLOWED";
    case 540:
        return "NOT_IMPLEMENTED";
    case 541:
        return "INTERNAL_ERROR";
    default:
        return NULL;
    }
}
