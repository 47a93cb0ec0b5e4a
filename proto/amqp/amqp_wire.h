/*
 * amqp_wire.h - internal to the AMQP codec (the files of proto/amqp/): a bounds-checked reader and
 * a bounded writer over byte spans, both with a sticky error.
 *
 * The reader never advances past its end: every read first compares the bytes it needs with
 * the bytes that remain (`n <= len - off`, which cannot wrap), and on failure records
 * AMQP_E_TRUNCATED (or the caller's code) once and turns every later read into a no-op that
 * yields zeros.  A decoder can therefore read all its arguments straight through and check
 * once at the end, as pgbouncer's PktBuf and hiredis' reader do.  The writer works the same
 * way with AMQP_E_BUFFER.
 */
#ifndef TWICE_AMQP_WIRE_H
#define TWICE_AMQP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "proto/amqp/amqp.h"

struct amqp_rd {
    const uint8_t *buf;
    size_t len;
    size_t off;
    int err; /* first error, 0 while every read fitted */
};

static inline void amqp_rd_init(struct amqp_rd *r, const uint8_t *buf, size_t len)
{
    r->buf = buf;
    r->len = len;
    r->off = 0;
    r->err = 0;
}

/* Records err unless an earlier error is already recorded. */
static inline void amqp_rd_fail(struct amqp_rd *r, int err)
{
    if (r->err == 0)
        r->err = err;
}

/* Returns a pointer to the next n bytes and steps over them, or NULL (error recorded). */
static inline const uint8_t *amqp_rd_take(struct amqp_rd *r, size_t n)
{
    if (r->err != 0 || n > r->len - r->off) {
        amqp_rd_fail(r, AMQP_E_TRUNCATED);
        return NULL;
    }
    const uint8_t *p = r->buf + r->off;
    r->off += n;
    return p;
}

static inline uint8_t amqp_rd_u8(struct amqp_rd *r)
{
    const uint8_t *p = amqp_rd_take(r, 1);
    return p == NULL ? 0 : p[0];
}

static inline uint16_t amqp_rd_u16(struct amqp_rd *r)
{
    const uint8_t *p = amqp_rd_take(r, 2);
    return p == NULL ? 0 : (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t amqp_load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint32_t amqp_rd_u32(struct amqp_rd *r)
{
    const uint8_t *p = amqp_rd_take(r, 4);
    return p == NULL ? 0 : amqp_load_u32(p);
}

static inline uint64_t amqp_rd_u64(struct amqp_rd *r)
{
    const uint8_t *p = amqp_rd_take(r, 8);
    return p == NULL ? 0 : (uint64_t)amqp_load_u32(p) << 32 | amqp_load_u32(p + 4);
}

/* n bytes as a view; n has already been range-checked by the caller's type (u8 or u32). */
static inline struct amqp_bytes amqp_rd_bytes(struct amqp_rd *r, uint32_t n)
{
    struct amqp_bytes b = {NULL, 0};
    const uint8_t *p = amqp_rd_take(r, n);
    if (p != NULL) {
        b.p = p;
        b.len = n;
    }
    return b;
}

/* shortstr: u8 length + bytes. */
static inline struct amqp_bytes amqp_rd_shortstr(struct amqp_rd *r)
{
    uint8_t n = amqp_rd_u8(r);
    return amqp_rd_bytes(r, n);
}

/* longstr: u32 length + bytes. */
static inline struct amqp_bytes amqp_rd_longstr(struct amqp_rd *r)
{
    uint32_t n = amqp_rd_u32(r);
    return amqp_rd_bytes(r, n);
}

/* table: u32 length + entries, validated whole; the view excludes the length. */
static inline struct amqp_bytes amqp_rd_table(struct amqp_rd *r)
{
    struct amqp_bytes t = amqp_rd_longstr(r);
    if (r->err == 0) {
        int rc = amqp_table_validate(t);
        if (rc < 0)
            amqp_rd_fail(r, rc);
    }
    return t;
}

/* The status of a finished decode: the sticky error, else AMQP_E_TRAILING if bytes remain. */
static inline int amqp_rd_finish(const struct amqp_rd *r)
{
    if (r->err != 0)
        return r->err;
    return r->off == r->len ? AMQP_OK : AMQP_E_TRAILING;
}

struct amqp_wr {
    uint8_t *buf;
    size_t cap;
    size_t off;
    int err; /* first error, 0 while everything fitted */
};

static inline void amqp_wr_init(struct amqp_wr *w, uint8_t *buf, size_t cap)
{
    w->buf = buf;
    w->cap = cap;
    w->off = 0;
    w->err = 0;
}

static inline void amqp_wr_put(struct amqp_wr *w, const void *src, size_t n)
{
    if (w->err != 0 || n > w->cap - w->off) {
        if (w->err == 0)
            w->err = AMQP_E_BUFFER;
        return;
    }
    if (n > 0)
        memcpy(w->buf + w->off, src, n);
    w->off += n;
}

static inline void amqp_wr_u8(struct amqp_wr *w, uint8_t v)
{
    amqp_wr_put(w, &v, 1);
}

static inline void amqp_wr_u16(struct amqp_wr *w, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    amqp_wr_put(w, b, sizeof(b));
}

static inline void amqp_store_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void amqp_wr_u32(struct amqp_wr *w, uint32_t v)
{
    uint8_t b[4];
    amqp_store_u32(b, v);
    amqp_wr_put(w, b, sizeof(b));
}

static inline void amqp_wr_u64(struct amqp_wr *w, uint64_t v)
{
    amqp_wr_u32(w, (uint32_t)(v >> 32));
    amqp_wr_u32(w, (uint32_t)v);
}

static inline void amqp_wr_shortstr(struct amqp_wr *w, struct amqp_bytes s)
{
    if (s.len > AMQP_SHORTSTR_MAX) {
        if (w->err == 0)
            w->err = AMQP_E_STRING_TOO_LONG;
        return;
    }
    amqp_wr_u8(w, (uint8_t)s.len);
    amqp_wr_put(w, s.p, s.len);
}

#endif
