/*
 * amqp.h - the AMQP 0-9-1 codec: protocol header, frames, the methods a fault-injecting proxy
 * needs to understand, content headers with their field tables, and the few frames the proxy
 * writes itself.
 *
 * Pure push-style functions over byte spans, in the shape of rabbitmq-c's frame scanner and
 * hiredis' reader: no sockets, no libevent, no OpenSSL, no logging and no allocation.  The
 * caller (the proxy session) keeps the bytes, e.g. in an evbuffer, pulls up a whole frame and
 * asks the codec:
 *
 *     amqp_protocol_header_check()   8-byte preamble         -> 1 / 0 need more / <0
 *     amqp_frame_parse()             type|channel|size|payload|0xCE -> 1 / 0 need more / <0
 *     amqp_method_decode()           METHOD payload          -> struct amqp_method
 *     amqp_content_header_decode()   HEADER payload          -> struct amqp_props
 *     amqp_table_find()              field table view        -> struct amqp_field
 *     amqp_encode_*()                complete frames into a caller buffer
 *
 * Ownership: every decoded string, table or payload is a view (struct amqp_bytes) pointing into
 * the buffer passed to the decoder.  Views stay valid while that buffer does, i.e. until the
 * caller drains or moves those bytes (evbuffer_drain/remove); copy what must live longer.
 *
 * Every length read from the wire is checked against the bytes that remain before it is used,
 * as `len <= remaining` (never `off + len <= total`, which can wrap).  Every size a peer
 * controls has a named limit below.  Errors are 0 or negative codes from AMQP_ERRORS().
 */
#ifndef TWICE_AMQP_H
#define TWICE_AMQP_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- limits ----------------------------------------------------------------------------- */

/* The protocol header the client sends first: "AMQP" 0 0 9 1. */
#define AMQP_PROTOCOL_HEADER_SIZE 8u
/* type u8 + channel u16 + size u32. */
#define AMQP_FRAME_HEADER_SIZE 7u
/* Header plus the frame-end octet: the overhead of every frame (RabbitMQ ?EMPTY_FRAME_SIZE). */
#define AMQP_FRAME_OVERHEAD 8u
/* The frame-end octet. */
#define AMQP_FRAME_END 0xCEu
/* The frame_max in force before connection.tune-ok, and the smallest frame_max a peer may
 * negotiate: the 0-9-1 spec's frame-min-size, RabbitMQ 3.10's ?FRAME_MIN_SIZE and its default
 * initial_frame_max (rabbit_framing.hrl, rabbit_reader:start_connection). */
#define AMQP_FRAME_MIN_SIZE 4096u
/* The largest frame_max twice accepts, and the limit applied when frame_max is 0 ("no limit").
 * The session pulls a whole frame into contiguous memory, so this bounds that allocation. */
#define AMQP_FRAME_MAX_LIMIT (16u * 1024u * 1024u)
/* RabbitMQ accepts payloads up to frame_max, 8 bytes more than the spec allows
 * (rabbit_reader: PayloadSize > FrameMax - ?EMPTY_FRAME_SIZE + ?FRAME_SIZE_FUDGE is fatal).
 * amqp_frame_parse() applies the spec's rule; a caller that wants to be exactly as lenient as
 * the broker passes frame_max + AMQP_FRAME_SIZE_FUDGE. */
#define AMQP_FRAME_SIZE_FUDGE 8u
/* Method payload: class-id u16 + method-id u16. */
#define AMQP_METHOD_HEADER_SIZE 4u
/* Content header: class-id u16 + weight u16 + body-size u64 + property-flags u16.  A shorter
 * HEADER payload is rejected before any arithmetic (rabbitmq-c GHSA-9mmv-r8g3-qp46). */
#define AMQP_CONTENT_HEADER_MIN_SIZE 14u
/* Nesting of field tables (F) and arrays (A); the headers table itself is depth 1.  RabbitMQ
 * has no limit; ours bounds the validator's recursion. */
#define AMQP_TABLE_MAX_DEPTH 32u
/* A shortstr is at most 255 bytes (its length is one octet). */
#define AMQP_SHORTSTR_MAX 255u
/* Largest frame any amqp_encode_*() writes: channel.close / connection.close with a 255-byte
 * reply text (7 + 4 + 2 + 1 + 255 + 2 + 2 + 1). */
#define AMQP_ENCODE_MAX 274u

/* ---- errors ------------------------------------------------------------------------------ */

/* Status codes: 0 or negative, stable and append-only.  amqp_strerror() names them. */
#define AMQP_ERRORS(X)                                                                             \
    X(OK, 0, "ok")                                                                                 \
    X(E_NOT_AMQP, -1, "not an AMQP protocol header")                                               \
    X(E_VERSION, -2, "AMQP protocol header for a version other than 0-9-1")                        \
    X(E_FRAME_TYPE, -3, "unknown frame type")                                                      \
    X(E_FRAME_END, -4, "frame-end octet is not 0xCE")                                              \
    X(E_FRAME_TOO_LARGE, -5, "frame payload larger than frame_max - 8")                            \
    X(E_HEARTBEAT, -6, "heartbeat frame with a payload or on a channel other than 0")              \
    X(E_TRUNCATED, -7, "a field runs past the end of the payload")                                 \
    X(E_TRAILING, -8, "bytes left over after the last argument or property")                       \
    X(E_BAD_TABLE, -9, "malformed field table or array")                                           \
    X(E_TABLE_DEPTH, -10, "field tables nested deeper than AMQP_TABLE_MAX_DEPTH")                  \
    X(E_BAD_HEADER, -11, "content header shorter than 14 bytes or not class basic")                \
    X(E_PROP_FLAGS, -12, "content header property-flags continuation bit set")                     \
    X(E_BUFFER, -13, "output buffer too small")                                                    \
    X(E_STRING_TOO_LONG, -14, "string longer than 255 bytes for a shortstr")

enum amqp_status {
#define AMQP_STATUS_ENUM(name, code, str) AMQP_##name = code,
    AMQP_ERRORS(AMQP_STATUS_ENUM)
#undef AMQP_STATUS_ENUM
};

/* A static string for a status code; "unknown error" for codes not listed. */
const char *amqp_strerror(int status);

/* ---- byte views ---------------------------------------------------------------------------- */

/* A borrowed span: p points into the decoder's input (or any caller memory); not
 * NUL-terminated; p may be NULL when len is 0. */
struct amqp_bytes {
    const uint8_t *p;
    uint32_t len;
};

/* A view of a NUL-terminated string (for the encoders).  Strings longer than UINT32_MAX are
 * clamped, which any encoder then rejects as too long. */
static inline struct amqp_bytes amqp_cstr(const char *s)
{
    size_t n = strlen(s);
    struct amqp_bytes b = {(const uint8_t *)s, n > UINT32_MAX ? UINT32_MAX : (uint32_t)n};
    return b;
}

/* True when the view holds exactly the NUL-terminated string s. */
bool amqp_bytes_eq(struct amqp_bytes b, const char *s);

/* ---- protocol header ---------------------------------------------------------------------- */

/*
 * Checks the client's protocol header at the start of buf[0..len).
 * Returns 1 when all 8 bytes are present and name AMQP 0-9-1: "AMQP\0\0\x09\x01", or
 * "AMQP\x01\x01\x00\x09", the legacy form RabbitMQ also treats as 0-9-1; 0 when the bytes so far
 * are a prefix of one of those (need more); AMQP_E_NOT_AMQP when they cannot begin "AMQP" (e.g.
 * HTTP or a TLS ClientHello); AMQP_E_VERSION for "AMQP" followed by another version (AMQP 1.0,
 * 0-8).  Rejects as soon as a byte disagrees.
 */
int amqp_protocol_header_check(const uint8_t *buf, size_t len) TWICE_MUST_CHECK;

/* ---- frames -------------------------------------------------------------------------------- */

enum amqp_frame_type {
    AMQP_FRAME_METHOD = 1,
    AMQP_FRAME_HEADER = 2,
    AMQP_FRAME_BODY = 3,
    AMQP_FRAME_HEARTBEAT = 8,
};

struct amqp_frame {
    uint8_t type;           /* enum amqp_frame_type */
    uint16_t channel;       /* 0 = the connection */
    uint32_t size;          /* payload length */
    const uint8_t *payload; /* view into buf, size bytes; set only when complete */
    size_t frame_len;       /* 7 + size + 1: the bytes to consume; 0 while the header is short */
};

/*
 * The largest payload amqp_frame_parse() accepts under frame_max: frame_max - 8, where a
 * frame_max of 0 (no limit) or above AMQP_FRAME_MAX_LIMIT means AMQP_FRAME_MAX_LIMIT, and a
 * frame_max below 8 allows only empty payloads.
 */
static inline uint32_t amqp_frame_payload_max(uint32_t frame_max)
{
    /* Inline: asked once per frame. */
    if (frame_max == 0 || frame_max > AMQP_FRAME_MAX_LIMIT)
        frame_max = AMQP_FRAME_MAX_LIMIT;
    return frame_max < AMQP_FRAME_OVERHEAD ? 0 : frame_max - AMQP_FRAME_OVERHEAD;
}

/*
 * Frames the bytes at the start of buf[0..len), which the caller has positioned after the
 * protocol header or the previous frame.  frame_max is the negotiated value (0 = no limit),
 * AMQP_FRAME_MIN_SIZE before tune-ok.
 * Returns 1 with *f filled when a whole, valid frame is present: consume f->frame_len bytes.
 * Returns 0 when more bytes are needed; f->frame_len is then the full frame length once the 7
 * header bytes are present (so the caller can wait for exactly that many), else 0.
 * Returns a negative code as soon as the bytes seen prove the frame invalid: AMQP_E_FRAME_TYPE
 * (first byte not 1, 2, 3 or 8), AMQP_E_FRAME_TOO_LARGE (size > amqp_frame_payload_max()),
 * AMQP_E_HEARTBEAT (size or channel not 0), AMQP_E_FRAME_END (last byte not 0xCE).
 * The payload is not decoded: see amqp_method_decode() and amqp_content_header_decode().
 */
int amqp_frame_parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                     struct amqp_frame *f) TWICE_MUST_CHECK;

/* ---- methods ------------------------------------------------------------------------------- */

enum amqp_class_id {
    AMQP_CLASS_CONNECTION = 10,
    AMQP_CLASS_CHANNEL = 20,
    AMQP_CLASS_EXCHANGE = 40,
    AMQP_CLASS_QUEUE = 50,
    AMQP_CLASS_BASIC = 60,
    AMQP_CLASS_CONFIRM = 85,
    AMQP_CLASS_TX = 90,
};

/* (class << 16 | method) for the methods twice decodes, and a few it only names. */
#define AMQP_MID(c, m) ((uint32_t)(c) << 16 | (uint32_t)(m))
enum amqp_method_id {
    AMQP_CONNECTION_START = AMQP_MID(10, 10),
    AMQP_CONNECTION_START_OK = AMQP_MID(10, 11),
    AMQP_CONNECTION_TUNE = AMQP_MID(10, 30),
    AMQP_CONNECTION_TUNE_OK = AMQP_MID(10, 31),
    AMQP_CONNECTION_OPEN = AMQP_MID(10, 40),
    AMQP_CONNECTION_OPEN_OK = AMQP_MID(10, 41),
    AMQP_CONNECTION_CLOSE = AMQP_MID(10, 50),
    AMQP_CONNECTION_CLOSE_OK = AMQP_MID(10, 51),
    AMQP_CHANNEL_OPEN = AMQP_MID(20, 10),
    AMQP_CHANNEL_OPEN_OK = AMQP_MID(20, 11),
    AMQP_CHANNEL_FLOW = AMQP_MID(20, 20),
    AMQP_CHANNEL_FLOW_OK = AMQP_MID(20, 21),
    AMQP_CHANNEL_CLOSE = AMQP_MID(20, 40),
    AMQP_CHANNEL_CLOSE_OK = AMQP_MID(20, 41),
    AMQP_BASIC_QOS = AMQP_MID(60, 10),
    AMQP_BASIC_QOS_OK = AMQP_MID(60, 11),
    AMQP_BASIC_CONSUME = AMQP_MID(60, 20),
    AMQP_BASIC_CONSUME_OK = AMQP_MID(60, 21),
    AMQP_BASIC_CANCEL = AMQP_MID(60, 30),
    AMQP_BASIC_CANCEL_OK = AMQP_MID(60, 31),
    AMQP_BASIC_PUBLISH = AMQP_MID(60, 40),
    AMQP_BASIC_RETURN = AMQP_MID(60, 50),
    AMQP_BASIC_DELIVER = AMQP_MID(60, 60),
    AMQP_BASIC_GET = AMQP_MID(60, 70),
    AMQP_BASIC_GET_OK = AMQP_MID(60, 71),
    AMQP_BASIC_GET_EMPTY = AMQP_MID(60, 72),
    AMQP_BASIC_ACK = AMQP_MID(60, 80),
    AMQP_BASIC_REJECT = AMQP_MID(60, 90),
    AMQP_BASIC_RECOVER_ASYNC = AMQP_MID(60, 100),
    AMQP_BASIC_RECOVER = AMQP_MID(60, 110),
    AMQP_BASIC_RECOVER_OK = AMQP_MID(60, 111),
    AMQP_BASIC_NACK = AMQP_MID(60, 120),
    AMQP_CONFIRM_SELECT = AMQP_MID(85, 10),
    AMQP_CONFIRM_SELECT_OK = AMQP_MID(85, 11),
    AMQP_TX_SELECT = AMQP_MID(90, 10),
    AMQP_TX_SELECT_OK = AMQP_MID(90, 11),
    AMQP_TX_COMMIT = AMQP_MID(90, 20),
    AMQP_TX_COMMIT_OK = AMQP_MID(90, 21),
    AMQP_TX_ROLLBACK = AMQP_MID(90, 30),
    AMQP_TX_ROLLBACK_OK = AMQP_MID(90, 31),
};

/* connection.start-ok.  response is the SASL response; for PLAIN it is "\0user\0password", and
 * response_offset is where it starts in the method payload, so the proxy can redact it in place
 * (its length prefix is the 4 bytes before). */
struct amqp_start_ok {
    struct amqp_bytes client_properties; /* table entries, validated */
    struct amqp_bytes mechanism;
    struct amqp_bytes response;
    uint32_t response_offset;
    struct amqp_bytes locale;
};

/* connection.tune and tune-ok. */
struct amqp_tune {
    uint16_t channel_max;
    uint32_t frame_max;
    uint16_t heartbeat;
};

/* connection.close and channel.close. */
struct amqp_close {
    uint16_t reply_code;
    struct amqp_bytes reply_text;
    uint16_t class_id;
    uint16_t method_id;
};

/* basic.qos. */
struct amqp_qos {
    uint32_t prefetch_size;
    uint16_t prefetch_count;
    bool global;
};

/* basic.consume. */
struct amqp_consume {
    struct amqp_bytes queue;
    struct amqp_bytes consumer_tag;
    bool no_local, no_ack, exclusive, nowait;
    struct amqp_bytes arguments; /* table entries, validated */
};

/* basic.publish. */
struct amqp_publish {
    struct amqp_bytes exchange;
    struct amqp_bytes routing_key;
    bool mandatory, immediate;
};

/* basic.return. */
struct amqp_return {
    uint16_t reply_code;
    struct amqp_bytes reply_text;
    struct amqp_bytes exchange;
    struct amqp_bytes routing_key;
};

/* basic.deliver and basic.get-ok.  tag_offset and redelivered_offset locate the delivery-tag u64
 * and the octet holding the redelivered bit in the method payload, for amqp_patch_delivery_tag()
 * and amqp_set_redelivered().  consumer_tag is empty and message_count 0 for get-ok, and
 * message_count is 0 for deliver. */
struct amqp_delivery {
    struct amqp_bytes consumer_tag;
    uint64_t delivery_tag;
    bool redelivered;
    struct amqp_bytes exchange;
    struct amqp_bytes routing_key;
    uint32_t message_count;
    uint32_t tag_offset;
    uint32_t redelivered_offset;
};

/* basic.ack (multiple), basic.reject (requeue), basic.nack (multiple, requeue); the flags a
 * method does not carry are false. */
struct amqp_ack {
    uint64_t delivery_tag;
    bool multiple;
    bool requeue;
};

/* basic.consume-ok, basic.cancel (nowait) and basic.cancel-ok (nowait false). */
struct amqp_consumer {
    struct amqp_bytes consumer_tag;
    bool nowait;
};

/* basic.get. */
struct amqp_get {
    struct amqp_bytes queue;
    bool no_ack;
};

/*
 * A decoded method.  Which member of the union is valid follows from id:
 *   connection.start-ok                          start_ok
 *   connection.tune / tune-ok                    tune
 *   connection.open                              vhost
 *   connection.close / channel.close             close
 *   channel.flow / flow-ok                       active
 *   basic.qos                                    qos
 *   basic.consume                                consume
 *   basic.consume-ok / cancel / cancel-ok        consumer
 *   basic.publish                                publish
 *   basic.return                                 ret
 *   basic.deliver / get-ok                       delivery
 *   basic.get                                    get
 *   basic.get-empty                              cluster_id
 *   basic.ack / reject / nack                    ack
 *   basic.recover-async / recover                requeue
 *   confirm.select                               nowait
 *   channel.open, the argument-less -ok methods, tx.*: none
 */
struct amqp_method {
    uint16_t class_id;
    uint16_t method_id;
    uint32_t id;  /* AMQP_MID(class_id, method_id), to switch on enum amqp_method_id */
    bool decoded; /* false: a method twice does not decode; forward it untouched */
    union {
        struct amqp_start_ok start_ok;
        struct amqp_tune tune;
        struct amqp_bytes vhost;
        struct amqp_close close;
        bool active;
        struct amqp_qos qos;
        struct amqp_consume consume;
        struct amqp_consumer consumer;
        struct amqp_publish publish;
        struct amqp_return ret;
        struct amqp_delivery delivery;
        struct amqp_get get;
        struct amqp_bytes cluster_id;
        struct amqp_ack ack;
        bool requeue;
        bool nowait;
    };
};

/*
 * Decodes a METHOD frame payload (f->payload, f->size) into *m.
 * Returns 0 on success.  For a method not listed in struct amqp_method (queue.declare,
 * exchange.*, connection.start, ...) or an unknown id it also returns 0, with only class_id,
 * method_id and id set and decoded false.  Returns AMQP_E_TRUNCATED when the payload has fewer
 * than 4 bytes or an argument (a shortstr/longstr/table length included) runs past its end,
 * AMQP_E_TRAILING when bytes are left after the last argument (RabbitMQ rejects both),
 * AMQP_E_BAD_TABLE / AMQP_E_TABLE_DEPTH for a malformed table argument.  Bits are packed LSB
 * first; reserved bits are ignored.  Views in *m point into payload.
 */
int amqp_method_decode(const uint8_t *payload, uint32_t size,
                       struct amqp_method *m) TWICE_MUST_CHECK;

/* True for the methods followed by a content header and body: basic.publish, basic.return,
 * basic.deliver and basic.get-ok. */
bool amqp_method_has_content(uint16_t class_id, uint16_t method_id);

/* Whether the method table is sorted by id and every entry is found by its id (tests). */
bool amqp_method_table_ok(void);

/* "basic.deliver", "queue.declare", ... for every 0-9-1 method; "unknown" otherwise.  A static
 * string. */
const char *amqp_method_name(uint16_t class_id, uint16_t method_id);

/* The name of an AMQP 0-9-1 error reply code (the spec's constants 311 to 541, as RabbitMQ
 * writes them: "PRECONDITION_FAILED" for 406), or NULL for any other number (200, reply-success,
 * is not an error).  A static string. */
const char *amqp_reply_error_name(uint16_t code);

/* ---- content header and field tables --------------------------------------------------------- */

/* Property flags (class basic), MSB first. */
enum amqp_prop_flag {
    AMQP_PROP_CONTENT_TYPE = 0x8000,
    AMQP_PROP_CONTENT_ENCODING = 0x4000,
    AMQP_PROP_HEADERS = 0x2000,
    AMQP_PROP_DELIVERY_MODE = 0x1000,
    AMQP_PROP_PRIORITY = 0x0800,
    AMQP_PROP_CORRELATION_ID = 0x0400,
    AMQP_PROP_REPLY_TO = 0x0200,
    AMQP_PROP_EXPIRATION = 0x0100,
    AMQP_PROP_MESSAGE_ID = 0x0080,
    AMQP_PROP_TIMESTAMP = 0x0040,
    AMQP_PROP_TYPE = 0x0020,
    AMQP_PROP_USER_ID = 0x0010,
    AMQP_PROP_APP_ID = 0x0008,
    AMQP_PROP_CLUSTER_ID = 0x0004,
    AMQP_PROP_CONTINUATION = 0x0001, /* rejected: never used by class basic */
};

/* A decoded content header.  A property is present when its bit is set in flags; absent
 * properties are zero / empty views. */
struct amqp_props {
    uint16_t class_id; /* always 60 (basic) after a successful decode */
    uint16_t weight;   /* unused by 0-9-1, carried as seen */
    uint64_t body_size;
    uint16_t flags; /* enum amqp_prop_flag bits */
    struct amqp_bytes content_type;
    struct amqp_bytes content_encoding;
    struct amqp_bytes headers; /* table entries (after the u32 length), validated */
    uint8_t delivery_mode;
    uint8_t priority;
    struct amqp_bytes correlation_id;
    struct amqp_bytes reply_to;
    struct amqp_bytes expiration;
    struct amqp_bytes message_id;
    uint64_t timestamp;
    struct amqp_bytes type;
    struct amqp_bytes user_id;
    struct amqp_bytes app_id;
    struct amqp_bytes cluster_id;
};

/*
 * Decodes a HEADER frame payload (f->payload, f->size) into *p.
 * Returns 0, or AMQP_E_BAD_HEADER (fewer than AMQP_CONTENT_HEADER_MIN_SIZE bytes, or a class
 * other than basic), AMQP_E_PROP_FLAGS (continuation bit set), AMQP_E_TRUNCATED,
 * AMQP_E_TRAILING, AMQP_E_BAD_TABLE, AMQP_E_TABLE_DEPTH.  The headers table is walked whole,
 * nested tables and arrays included, so amqp_table_find() on it cannot fail later.  Views in *p
 * point into payload.
 */
int amqp_content_header_decode(const uint8_t *payload, uint32_t size,
                               struct amqp_props *p) TWICE_MUST_CHECK;

/*
 * Walks a table's entries (a view as in struct amqp_props.headers, without the length prefix)
 * and checks every entry, nested tables and arrays included, to AMQP_TABLE_MAX_DEPTH.
 * Returns 0, AMQP_E_BAD_TABLE or AMQP_E_TABLE_DEPTH.
 */
int amqp_table_validate(struct amqp_bytes table) TWICE_MUST_CHECK;

/* One field value found in a table. */
struct amqp_field {
    uint8_t type;            /* the wire type octet: 'S', 'I', 'l', 't', 'F', ... */
    int64_t i;               /* b B s u I i l L T: the value (L and T as their bit pattern);
                                t: 0 or 1; D: the unscaled u32 value */
    uint8_t decimal_scale;   /* D only */
    double d;                /* d and f */
    struct amqp_bytes bytes; /* S and x: the bytes; F and A: the entries / items */
};

/*
 * Looks up key (compared byte for byte) among the top-level entries of table.
 * Returns 1 with *out filled (views point into the table) when found, 0 when not, AMQP_E_BAD_TABLE
 * when the entries up to the key, or up to the end when it is absent, are malformed.  Nested
 * tables are skipped by their length, not validated.
 */
int amqp_table_find(struct amqp_bytes table, const char *key,
                    struct amqp_field *out) TWICE_MUST_CHECK;

/*
 * amqp_table_find() for a longstr ('S') value, e.g. Celery's "id" and "task" headers.  Returns
 * 1 with *out set, 0 when the key is absent or holds another type, or AMQP_E_BAD_TABLE.
 */
int amqp_table_find_string(struct amqp_bytes table, const char *key,
                           struct amqp_bytes *out) TWICE_MUST_CHECK;

/*
 * amqp_table_find() for an integer value (b B s u I i l L; not a boolean 't' nor a timestamp
 * 'T'), e.g. Celery's "retries" header: returns 1 with *out its value ('L' as its bit pattern),
 * 0 when the key is absent or holds another type, or AMQP_E_BAD_TABLE.
 */
int amqp_table_find_int(struct amqp_bytes table, const char *key, int64_t *out) TWICE_MUST_CHECK;

/* ---- encoders ------------------------------------------------------------------------------ */

/*
 * Each writes one complete frame (header, payload, 0xCE) at the start of buf[0..cap) and
 * returns its length, byte-identical to what RabbitMQ, pika and py-amqp send; or AMQP_E_BUFFER
 * when cap is too small (AMQP_ENCODE_MAX always suffices), AMQP_E_STRING_TOO_LONG for a reply
 * text over 255 bytes.  Nothing is promised about buf's contents after an error.
 */
int amqp_encode_basic_ack(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                          bool multiple) TWICE_MUST_CHECK;
int amqp_encode_basic_reject(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                             bool requeue) TWICE_MUST_CHECK;
int amqp_encode_basic_nack(uint8_t *buf, size_t cap, uint16_t channel, uint64_t delivery_tag,
                           bool multiple, bool requeue) TWICE_MUST_CHECK;
/* The longest basic.publish frame: frame overhead, class and method ids, the reserved short,
 * two short strings of up to 255 bytes with their length octets, and the flag octet. */
#define AMQP_ENCODE_PUBLISH_MAX (AMQP_FRAME_OVERHEAD + 4u + 2u + 2u * 256u + 1u)
/* basic.publish with p's exchange, routing key and flags (a copy of a client's publish). */
int amqp_encode_basic_publish(uint8_t *buf, size_t cap, uint16_t channel,
                              const struct amqp_publish *p) TWICE_MUST_CHECK;
int amqp_encode_channel_close(uint8_t *buf, size_t cap, uint16_t channel, uint16_t reply_code,
                              struct amqp_bytes reply_text, uint16_t class_id,
                              uint16_t method_id) TWICE_MUST_CHECK;
int amqp_encode_channel_close_ok(uint8_t *buf, size_t cap, uint16_t channel) TWICE_MUST_CHECK;
int amqp_encode_connection_close(uint8_t *buf, size_t cap, uint16_t reply_code,
                                 struct amqp_bytes reply_text, uint16_t class_id,
                                 uint16_t method_id) TWICE_MUST_CHECK;
int amqp_encode_connection_close_ok(uint8_t *buf, size_t cap) TWICE_MUST_CHECK;
int amqp_encode_heartbeat(uint8_t *buf, size_t cap) TWICE_MUST_CHECK;

/* ---- in-place patchers ----------------------------------------------------------------------- */

/* Overwrites the u64 delivery tag at payload[offset..offset+8), offset being
 * struct amqp_delivery.tag_offset of a decoded deliver/get-ok, or 4 for ack/reject/nack.  The
 * frame keeps its size. */
void amqp_patch_delivery_tag(uint8_t *payload, size_t offset, uint64_t tag);

/* Sets or clears the redelivered bit (bit 0) of payload[offset], offset being
 * struct amqp_delivery.redelivered_offset.  Other bits are kept. */
void amqp_set_redelivered(uint8_t *payload, size_t offset, bool on);

#endif
