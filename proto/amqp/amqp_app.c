/*
 * amqp_app.c - an AMQP app's defaults for a message's id, task, retries and queue
 * (proto/amqp/amqp_app.h).
 */
#include "proto/amqp/amqp_app.h"

/* The longstr header `key` of p, if it has one. */
static bool header_string(const struct amqp_props *p, const char *key, struct amqp_bytes *out)
{
    return p->headers.len > 0 && amqp_table_find_string(p->headers, key, out) == 1;
}

bool amqp_app_message_id(const struct amqp_props *p, struct amqp_bytes *out)
{
    if (p->message_id.len > 0) {
        *out = p->message_id;
        return true;
    }
    if (header_string(p, "id", out))
        return true;
    if (p->correlation_id.len > 0) {
        *out = p->correlation_id;
        return true;
    }
    return false;
}

bool amqp_app_task(const struct amqp_props *p, struct amqp_bytes *out)
{
    return header_string(p, "task", out);
}

uint32_t amqp_app_retries(const struct amqp_props *p)
{
    int64_t n;
    if (p->headers.len == 0 || amqp_table_find_int(p->headers, "retries", &n) != 1 || n <= 0)
        return 0;
    return n > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

bool amqp_app_publish_is_retry(uint32_t retries)
{
    return retries > 0;
}

bool amqp_app_publish_queue(const struct amqp_publish *m, struct amqp_bytes *out)
{
    if (m->exchange.len != 0)
        return false;
    *out = m->routing_key;
    return true;
}
