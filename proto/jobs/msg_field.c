/*
 * msg_field.c - a message's identity and task from the fields an app keeps them in
 * (msg_field.h).
 */
#include "proto/jobs/msg_field.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    enum msg_field_prop prop;
} props[] = {
    {"message_id", MSG_PROP_MESSAGE_ID},
    {"correlation_id", MSG_PROP_CORRELATION_ID},
    {"type", MSG_PROP_TYPE},
    {"app_id", MSG_PROP_APP_ID},
    {"user_id", MSG_PROP_USER_ID},
    {"reply_to", MSG_PROP_REPLY_TO},
    {"content_type", MSG_PROP_CONTENT_TYPE},
    {"content_encoding", MSG_PROP_CONTENT_ENCODING},
};
#define N_PROPS (sizeof(props) / sizeof(props[0]))

static int fail(char *why, size_t cap, const char *msg, const char *arg)
{
    snprintf(why, cap, msg, arg);
    return -1;
}

static int parse_property(const char *name, struct msg_field *f, char *why, size_t cap)
{
    for (size_t i = 0; i < N_PROPS; i++) {
        if (strcmp(name, props[i].name) == 0) {
            f->kind = MSG_FIELD_PROPERTY;
            f->prop = props[i].prop;
            return 0;
        }
    }
    return fail(why, cap,
                "unknown property '%s' (expected message_id, correlation_id, type, app_id, "
                "user_id, reply_to, content_type or content_encoding)",
                name);
}

/* body.json.K1.K2...: each key 1 to MSG_FIELD_JSON_KEY_MAX bytes, MSG_FIELD_JSON_KEYS at most. */
static int parse_json_path(const char *path, struct msg_field *f, char *why, size_t cap)
{
    f->kind = MSG_FIELD_BODY_JSON;
    f->nkeys = 0;
    size_t at = 0;
    for (const char *k = path;;) {
        const char *dot = strchr(k, '.');
        size_t n = dot != NULL ? (size_t)(dot - k) : strlen(k);
        if (n == 0)
            return fail(why, cap, "an empty key in the JSON path '%s'", path);
        if (n > MSG_FIELD_JSON_KEY_MAX)
            return fail(why, cap, "a key longer than 32 bytes in the JSON path '%s'", path);
        if (f->nkeys == MSG_FIELD_JSON_KEYS)
            return fail(why, cap, "the JSON path '%s' has more than 3 keys", path);
        memcpy(f->name + at, k, n);
        f->name[at + n] = '\0';
        at += n + 1;
        f->nkeys++;
        if (dot == NULL)
            return 0;
        k = dot + 1;
    }
}

int msg_field_parse(const char *text, struct msg_field *f, char *why, size_t cap)
{
    memset(f, 0, sizeof(*f));
    size_t n = strlen(text);
    if (n == 0 || n >= sizeof(f->text))
        return fail(why, cap, "a source of %s bytes (expected 1 to 127)",
                    n == 0 ? "0" : "over 127");
    memcpy(f->text, text, n + 1);
    if (strcmp(text, "routing-key") == 0)
        return f->kind = MSG_FIELD_ROUTING_KEY, 0;
    if (strcmp(text, "exchange") == 0)
        return f->kind = MSG_FIELD_EXCHANGE, 0;
    if (strcmp(text, "queue") == 0)
        return f->kind = MSG_FIELD_QUEUE, 0;
    if (strncmp(text, "property.", 9) == 0)
        return parse_property(text + 9, f, why, cap);
    if (strncmp(text, "header.", 7) == 0 && text[7] != '\0') {
        f->kind = MSG_FIELD_HEADER;
        memcpy(f->name, text + 7, n - 7 + 1);
        return 0;
    }
    if (strncmp(text, "body.json.", 10) == 0)
        return parse_json_path(text + 10, f, why, cap);
    return fail(why, cap,
                "unknown source '%s' (expected property.NAME, header.NAME, routing-key, "
                "exchange, queue or body.json.PATH)",
                text);
}

bool msg_fields_need_body(const struct msg_fields *fs)
{
    for (size_t i = 0; i < fs->n; i++)
        if (fs->src[i].kind == MSG_FIELD_BODY_JSON)
            return true;
    return false;
}

/* The bytes b as a value: found when 1 to MSG_FIELD_VALUE_MAX - 1 bytes without a NUL. */
static enum msg_field_got value(const uint8_t *p, size_t n, char *out, size_t *len)
{
    out[0] = '\0';
    *len = n;
    if (n == 0 || memchr(p, '\0', n) != NULL)
        return MSG_FIELD_ABSENT;
    if (n >= MSG_FIELD_VALUE_MAX)
        return MSG_FIELD_TOO_LONG;
    memcpy(out, p, n);
    out[n] = '\0';
    return MSG_FIELD_FOUND;
}

static struct amqp_bytes prop_of(const struct amqp_props *p, enum msg_field_prop prop)
{
    switch (prop) {
    case MSG_PROP_MESSAGE_ID:
        return p->message_id;
    case MSG_PROP_CORRELATION_ID:
        return p->correlation_id;
    case MSG_PROP_TYPE:
        return p->type;
    case MSG_PROP_APP_ID:
        return p->app_id;
    case MSG_PROP_USER_ID:
        return p->user_id;
    case MSG_PROP_REPLY_TO:
        return p->reply_to;
    case MSG_PROP_CONTENT_TYPE:
        return p->content_type;
    case MSG_PROP_CONTENT_ENCODING:
        return p->content_encoding;
    }
    return (struct amqp_bytes){0};
}

enum msg_field_got msg_field_read_json(const struct msg_field *f, const uint8_t *json, size_t n,
                                       char *out, size_t *len)
{
    out[0] = '\0';
    *len = 0;
    if (f->kind != MSG_FIELD_BODY_JSON || json == NULL)
        return MSG_FIELD_ABSENT;
    struct json_pick_path path = {.n = f->nkeys};
    const char *k = f->name;
    for (size_t i = 0; i < f->nkeys; i++, k += strlen(k) + 1)
        path.keys[i] = k;
    struct json_pick_value v;
    if (json_pick(json, n, MSG_FIELD_JSON_DEPTH, &path, 1, &v) != 0 || v.type != JSON_PICK_STRING ||
        v.nul)
        return MSG_FIELD_ABSENT;
    if (!v.escaped)
        return value(json + v.off, v.len, out, len);
    char *s = json_pick_strdup(json, &v);
    if (s == NULL)
        return MSG_FIELD_ABSENT;
    enum msg_field_got got = value((const uint8_t *)s, strlen(s), out, len);
    free(s);
    return got;
}

enum msg_field_got msg_field_read_amqp(const struct msg_field *f, const struct msg_field_amqp *m,
                                       char *out, size_t *len)
{
    struct amqp_bytes b = {0};
    out[0] = '\0';
    *len = 0;
    switch (f->kind) {
    case MSG_FIELD_PROPERTY:
        b = prop_of(m->props, f->prop);
        break;
    case MSG_FIELD_HEADER:
        if (m->props->headers.len == 0 ||
            amqp_table_find_string(m->props->headers, f->name, &b) != 1)
            return MSG_FIELD_ABSENT;
        break;
    case MSG_FIELD_ROUTING_KEY:
        b = m->routing_key;
        break;
    case MSG_FIELD_EXCHANGE:
        b = m->exchange;
        break;
    case MSG_FIELD_QUEUE:
        b = m->queue;
        break;
    case MSG_FIELD_BODY_JSON:
        if (m->body == NULL)
            return MSG_FIELD_NEED_BODY;
        return msg_field_read_json(f, m->body, m->body_len, out, len);
    }
    return value(b.p, b.len, out, len);
}
