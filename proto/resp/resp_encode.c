/*
 * resp_encode.c - the RESP messages twice writes itself: commands on its own connections, and
 * the replies it synthesises (errors such as READONLY, +QUEUED and EXEC arrays for a faked
 * transaction, nulls for a faked timeout) in the connection's protocol version.
 *
 * Every encoder writes through one bounded writer that notes an overflow instead of writing past
 * cap, and fails the whole message then, so a too-small buffer never yields a truncated message.
 */
#include <limits.h>
#include <string.h>

#include "proto/resp/resp.h"

struct resp_out {
    uint8_t *buf;
    size_t cap;
    size_t n;
    bool overflow;
};

static void resp_put(struct resp_out *o, const void *p, size_t n)
{
    if (o->overflow || n > o->cap - o->n) {
        o->overflow = true;
        return;
    }
    if (n > 0)
        memcpy(o->buf + o->n, p, n);
    o->n += n;
}

/* The type byte, the decimal value and CRLF. */
static void resp_put_number(struct resp_out *o, uint8_t type, int64_t v)
{
    uint8_t tmp[RESP_INT_LINE_MAX + 3];
    size_t i = sizeof(tmp);
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    tmp[--i] = '\n';
    tmp[--i] = '\r';
    do {
        tmp[--i] = (uint8_t)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0)
        tmp[--i] = '-';
    tmp[--i] = type;
    resp_put(o, tmp + i, sizeof(tmp) - i);
}

static int resp_finish(const struct resp_out *o)
{
    if (o->overflow || o->n > INT_MAX)
        return RESP_E_BUFFER;
    return (int)o->n;
}

/* A simple string or error line: the text may not hold CR or LF. */
static int resp_encode_line(uint8_t *buf, size_t cap, uint8_t type, const char *s)
{
    size_t n = strlen(s);
    if (memchr(s, '\r', n) != NULL || memchr(s, '\n', n) != NULL)
        return RESP_E_ARG;
    struct resp_out o = {buf, cap, 0, false};
    resp_put(&o, &type, 1);
    resp_put(&o, s, n);
    resp_put(&o, "\r\n", 2);
    return resp_finish(&o);
}

static void resp_put_bulk(struct resp_out *o, const void *p, size_t len)
{
    if (len > INT64_MAX) {
        o->overflow = true;
        return;
    }
    resp_put_number(o, '$', (int64_t)len);
    resp_put(o, p, len);
    resp_put(o, "\r\n", 2);
}

int resp_encode_command(uint8_t *buf, size_t cap, size_t argc, const char *const *argv,
                        const size_t *argvlen)
{
    if (argc == 0 || argc > RESP_MAX_ELEMENTS)
        return RESP_E_ARG;
    struct resp_out o = {buf, cap, 0, false};
    resp_put_number(&o, '*', (int64_t)argc);
    for (size_t i = 0; i < argc && !o.overflow; i++)
        resp_put_bulk(&o, argv[i], argvlen != NULL ? argvlen[i] : strlen(argv[i]));
    return resp_finish(&o);
}

int resp_encode_simple(uint8_t *buf, size_t cap, const char *s)
{
    return resp_encode_line(buf, cap, '+', s);
}

int resp_encode_error(uint8_t *buf, size_t cap, const char *s)
{
    return resp_encode_line(buf, cap, '-', s);
}

int resp_encode_integer(uint8_t *buf, size_t cap, int64_t v)
{
    struct resp_out o = {buf, cap, 0, false};
    resp_put_number(&o, ':', v);
    return resp_finish(&o);
}

int resp_encode_bulk(uint8_t *buf, size_t cap, const void *p, size_t len)
{
    struct resp_out o = {buf, cap, 0, false};
    resp_put_bulk(&o, p, len);
    return resp_finish(&o);
}

int resp_encode_null(uint8_t *buf, size_t cap, int proto)
{
    return proto >= 3 ? resp_encode_line(buf, cap, '_', "") : resp_encode_line(buf, cap, '$', "-1");
}

int resp_encode_null_array(uint8_t *buf, size_t cap, int proto)
{
    return proto >= 3 ? resp_encode_line(buf, cap, '_', "") : resp_encode_line(buf, cap, '*', "-1");
}

int resp_encode_array(uint8_t *buf, size_t cap, uint64_t n)
{
    if (n > RESP_MAX_ELEMENTS)
        return RESP_E_ARG;
    struct resp_out o = {buf, cap, 0, false};
    resp_put_number(&o, '*', (int64_t)n);
    return resp_finish(&o);
}

int resp_encode_queued(uint8_t *buf, size_t cap)
{
    return resp_encode_line(buf, cap, '+', "QUEUED");
}

int resp_encode_exec(uint8_t *buf, size_t cap, size_t n, const uint8_t *const *replies,
                     const size_t *lens)
{
    if (n > RESP_MAX_ELEMENTS)
        return RESP_E_ARG;
    struct resp_out o = {buf, cap, 0, false};
    resp_put_number(&o, '*', (int64_t)n);
    for (size_t i = 0; i < n && !o.overflow; i++)
        resp_put(&o, replies[i], lens[i]);
    return resp_finish(&o);
}
