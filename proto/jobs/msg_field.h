/*
 * msg_field.h - where an app keeps a message's identity and its task name.
 *
 * twice names a message by its id and its task (the handler that runs it).  Celery, Sidekiq
 * and RQ say where those are; any other app says it in its listener's `message-id` and `task`
 * settings, as a list of sources tried in order, the first one present winning:
 *
 *   property.NAME    an AMQP basic property: message_id, correlation_id, type, app_id, user_id,
 *                    reply_to, content_type, content_encoding
 *   header.NAME      a string in the AMQP headers table (Spring's __TypeId__, MassTransit's
 *                    MT-MessageType)
 *   routing-key      the routing key a message was published or delivered with
 *   exchange         the exchange it was published to
 *   queue            the queue a delivery came from (deliveries only)
 *   body.json.PATH   a string member of a JSON object body: PATH is its keys, dot-separated
 *                    (body.json.uuid, body.json.data.commandName)
 *
 * This module parses a source and reads it out of a message: pure C over byte spans, no I/O.
 * A value is a string of 1 to MSG_FIELD_VALUE_MAX - 1 bytes without a NUL byte; anything else
 * (an empty string, a number, a longer string) counts as absent, and a too-long value is
 * reported so that the caller can say so.
 */
#ifndef TWICE_MSG_FIELD_H
#define TWICE_MSG_FIELD_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/amqp/amqp.h"
#include "proto/base/json_pick.h"

/* Sources in one `message-id` or `task` setting. */
#define MSG_FIELD_MAX_SOURCES 4u
/* Longest source text (`header.NAME`, `body.json.PATH`), NUL included. */
#define MSG_FIELD_TEXT_MAX 128u
/* Longest value read (an id, a task name), NUL included: AMQP's short strings (properties)
 * are 255 bytes at most; a header or JSON string longer than that is no id of a job. */
#define MSG_FIELD_VALUE_MAX 256u
/* Keys of a body.json path, and the length of each: json_pick()'s limits. */
#define MSG_FIELD_JSON_KEYS JSON_PICK_MAX_KEYS
#define MSG_FIELD_JSON_KEY_MAX JSON_PICK_MAX_KEY
/* A JSON body is read to this depth at most (objects and arrays open at once). */
#define MSG_FIELD_JSON_DEPTH 64u

enum msg_field_kind {
    MSG_FIELD_PROPERTY,
    MSG_FIELD_HEADER,
    MSG_FIELD_ROUTING_KEY,
    MSG_FIELD_EXCHANGE,
    MSG_FIELD_QUEUE,
    MSG_FIELD_BODY_JSON,
};

enum msg_field_prop {
    MSG_PROP_MESSAGE_ID,
    MSG_PROP_CORRELATION_ID,
    MSG_PROP_TYPE,
    MSG_PROP_APP_ID,
    MSG_PROP_USER_ID,
    MSG_PROP_REPLY_TO,
    MSG_PROP_CONTENT_TYPE,
    MSG_PROP_CONTENT_ENCODING,
};

/* One source.  Self-contained (no pointer into the text it was parsed from). */
struct msg_field {
    enum msg_field_kind kind;
    enum msg_field_prop prop;      /* MSG_FIELD_PROPERTY */
    char text[MSG_FIELD_TEXT_MAX]; /* as written: "header.__TypeId__" */
    char name[MSG_FIELD_TEXT_MAX]; /* HEADER: the header's name; BODY_JSON: the keys, each
                                      NUL-terminated one after the other */
    uint8_t nkeys;                 /* BODY_JSON */
};

/* A setting: its sources in order. */
struct msg_fields {
    struct msg_field src[MSG_FIELD_MAX_SOURCES];
    uint8_t n; /* 0: not set (the profile's own) */
};

/* Parses source text into *f.  0, or -1 with *why a sentence saying what is wrong (a static
 * string: "unknown property 'typ' (expected message_id, correlation_id, ...)" is composed into
 * why_buf[0..cap)). */
int msg_field_parse(const char *text, struct msg_field *f, char *why_buf,
                    size_t cap) TWICE_MUST_CHECK;

/* Whether reading any source of fs needs the message's body. */
bool msg_fields_need_body(const struct msg_fields *fs);

/* What an AMQP message offers the sources.  Views into the caller's frames; a view of length
 * 0 is absent.  body is NULL when the body has not been read (or is not to be). */
struct msg_field_amqp {
    const struct amqp_props *props;
    struct amqp_bytes routing_key, exchange, queue;
    const uint8_t *body;
    size_t body_len;
};

/* How a read went. */
enum msg_field_got {
    MSG_FIELD_ABSENT = 0,
    MSG_FIELD_FOUND = 1,
    MSG_FIELD_TOO_LONG = -1,  /* present, MSG_FIELD_VALUE_MAX bytes or more: *len says how many */
    MSG_FIELD_NEED_BODY = -2, /* a body.json source, and the body is not there */
};

/* Source f of message m into out[0..MSG_FIELD_VALUE_MAX), NUL-terminated. */
enum msg_field_got msg_field_read_amqp(const struct msg_field *f, const struct msg_field_amqp *m,
                                       char *out, size_t *len);

/* Source f (a body.json one; any other is absent) of a JSON payload json[0..n), as a Redis
 * list holds a job, into out[0..MSG_FIELD_VALUE_MAX). */
enum msg_field_got msg_field_read_json(const struct msg_field *f, const uint8_t *json, size_t n,
                                       char *out, size_t *len);

#endif
