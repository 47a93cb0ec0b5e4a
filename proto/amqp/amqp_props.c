/*
 * amqp_props.c - AMQP 0-9-1 content headers (class basic properties) and field tables.
 *
 * A HEADER frame payload is class-id u16 | weight u16 | body-size u64 | property-flags u16 |
 * the present properties in flag order (bit 15 first).  The headers property is a field table;
 * Celery puts its task "id" and "task" name there (its message protocol 2: celery/app/amqp.py,
 * as_task_v2).
 *
 * Field tables are validated once, whole, when the header is decoded: every entry's name and
 * type, every value's length against what remains of its table, nested tables (F) and arrays
 * (A) recursively to AMQP_TABLE_MAX_DEPTH.  Lookups afterwards walk the same bytes with the
 * same bounds checks, so they are safe on tables that were never validated too.
 */
#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_wire.h"

/* For the integer types (b B s u I i l L T, and t as 0/1): reads the value into *v and returns
 * true.  Returns false, reading nothing, for every other type. */
static bool amqp_field_read_int(struct amqp_rd *r, uint8_t type, int64_t *v)
{
    switch (type) {
    case 't':
        *v = amqp_rd_u8(r) != 0;
        return true;
    case 'b':
        *v = (int8_t)amqp_rd_u8(r);
        return true;
    case 'B':
        *v = amqp_rd_u8(r);
        return true;
    case 's':
        *v = (int16_t)amqp_rd_u16(r);
        return true;
    case 'u':
        *v = amqp_rd_u16(r);
        return true;
    case 'I':
        *v = (int32_t)amqp_rd_u32(r);
        return true;
    case 'i':
        *v = amqp_rd_u32(r);
        return true;
    case 'l':
    case 'L':
    case 'T':
        *v = (int64_t)amqp_rd_u64(r);
        return true;
    default:
        return false;
    }
}

/* Reads one value of wire type `type` into *out; views point into r's buffer.  Returns 0, or
 * AMQP_E_BAD_TABLE for an unknown type or a value that runs past the table. */
static int amqp_field_read(struct amqp_rd *r, uint8_t type, struct amqp_field *out)
{
    uint32_t u32;
    uint64_t u64;
    float f32;

    memset(out, 0, sizeof(*out));
    out->type = type;
    if (amqp_field_read_int(r, type, &out->i))
        return r->err == 0 ? AMQP_OK : AMQP_E_BAD_TABLE;
    switch (type) {
    case 'f':
        u32 = amqp_rd_u32(r);
        memcpy(&f32, &u32, sizeof(f32));
        out->d = f32;
        break;
    case 'd':
        u64 = amqp_rd_u64(r);
        memcpy(&out->d, &u64, sizeof(out->d));
        break;
    case 'D':
        out->decimal_scale = amqp_rd_u8(r);
        out->i = amqp_rd_u32(r);
        break;
    case 'S':
    case 'x':
    case 'F':
    case 'A':
        out->bytes = amqp_rd_longstr(r);
        break;
    case 'V':
        break;
    default:
        return AMQP_E_BAD_TABLE;
    }
    return r->err == 0 ? AMQP_OK : AMQP_E_BAD_TABLE;
}

static int amqp_table_walk(struct amqp_bytes table, unsigned depth);
static int amqp_array_walk(struct amqp_bytes array, unsigned depth);

/* Reads one value and, for F and A, validates what it contains one level deeper. */
static int amqp_value_walk(struct amqp_rd *r, uint8_t type, unsigned depth)
{
    struct amqp_field f;
    int rc = amqp_field_read(r, type, &f);
    if (rc < 0)
        return rc;
    if (type == 'F')
        return amqp_table_walk(f.bytes, depth + 1);
    if (type == 'A')
        return amqp_array_walk(f.bytes, depth + 1);
    return AMQP_OK;
}

/* Entries: shortstr name, octet type, value; until the table's bytes are used up exactly. */
static int amqp_table_walk(struct amqp_bytes table, unsigned depth)
{
    struct amqp_rd r;

    if (depth > AMQP_TABLE_MAX_DEPTH)
        return AMQP_E_TABLE_DEPTH;
    amqp_rd_init(&r, table.p, table.len);
    while (r.off < r.len) {
        (void)amqp_rd_shortstr(&r);
        uint8_t type = amqp_rd_u8(&r);
        if (r.err != 0)
            return AMQP_E_BAD_TABLE;
        int rc = amqp_value_walk(&r, type, depth);
        if (rc < 0)
            return rc;
    }
    return AMQP_OK;
}

/* Items: octet type, value (no names). */
static int amqp_array_walk(struct amqp_bytes array, unsigned depth)
{
    struct amqp_rd r;

    if (depth > AMQP_TABLE_MAX_DEPTH)
        return AMQP_E_TABLE_DEPTH;
    amqp_rd_init(&r, array.p, array.len);
    while (r.off < r.len) {
        int rc = amqp_value_walk(&r, amqp_rd_u8(&r), depth);
        if (rc < 0)
            return rc;
    }
    return AMQP_OK;
}

int amqp_table_validate(struct amqp_bytes table)
{
    return amqp_table_walk(table, 1);
}

int amqp_table_find(struct amqp_bytes table, const char *key, struct amqp_field *out)
{
    struct amqp_rd r;

    amqp_rd_init(&r, table.p, table.len);
    while (r.off < r.len) {
        struct amqp_bytes name = amqp_rd_shortstr(&r);
        uint8_t type = amqp_rd_u8(&r);
        struct amqp_field f;
        if (r.err != 0 || amqp_field_read(&r, type, &f) < 0)
            return AMQP_E_BAD_TABLE;
        if (amqp_bytes_eq(name, key)) {
            *out = f;
            return 1;
        }
    }
    return 0;
}

int amqp_table_find_string(struct amqp_bytes table, const char *key, struct amqp_bytes *out)
{
    struct amqp_field f;
    int rc = amqp_table_find(table, key, &f);
    if (rc <= 0)
        return rc;
    if (f.type != 'S')
        return 0;
    *out = f.bytes;
    return 1;
}

int amqp_table_find_int(struct amqp_bytes table, const char *key, int64_t *out)
{
    struct amqp_field f;
    int rc = amqp_table_find(table, key, &f);
    if (rc <= 0)
        return rc;
    switch (f.type) {
    case 'b':
    case 'B':
    case 's':
    case 'u':
    case 'I':
    case 'i':
    case 'l':
    case 'L':
        *out = f.i;
        return 1;
    default:
        return 0;
    }
}

/* The properties present in p->flags, in flag order (bit 15 first). */
static void amqp_props_read(struct amqp_rd *r, struct amqp_props *p)
{
    uint16_t f = p->flags;

    if (f & AMQP_PROP_CONTENT_TYPE)
        p->content_type = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_CONTENT_ENCODING)
        p->content_encoding = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_HEADERS)
        p->headers = amqp_rd_table(r);
    if (f & AMQP_PROP_DELIVERY_MODE)
        p->delivery_mode = amqp_rd_u8(r);
    if (f & AMQP_PROP_PRIORITY)
        p->priority = amqp_rd_u8(r);
    if (f & AMQP_PROP_CORRELATION_ID)
        p->correlation_id = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_REPLY_TO)
        p->reply_to = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_EXPIRATION)
        p->expiration = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_MESSAGE_ID)
        p->message_id = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_TIMESTAMP)
        p->timestamp = amqp_rd_u64(r);
    if (f & AMQP_PROP_TYPE)
        p->type = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_USER_ID)
        p->user_id = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_APP_ID)
        p->app_id = amqp_rd_shortstr(r);
    if (f & AMQP_PROP_CLUSTER_ID)
        p->cluster_id = amqp_rd_shortstr(r);
}

int amqp_content_header_decode(const uint8_t *payload, uint32_t size, struct amqp_props *p)
{
    struct amqp_rd r;

    memset(p, 0, sizeof(*p));
    /* Checked before reading anything: rabbitmq-c once computed size - 12 unchecked
     * (GHSA-9mmv-r8g3-qp46). */
    if (size < AMQP_CONTENT_HEADER_MIN_SIZE)
        return AMQP_E_BAD_HEADER;
    amqp_rd_init(&r, payload, size);
    p->class_id = amqp_rd_u16(&r);
    p->weight = amqp_rd_u16(&r);
    p->body_size = amqp_rd_u64(&r);
    p->flags = amqp_rd_u16(&r);

    int rc = AMQP_OK;
    if (p->class_id != AMQP_CLASS_BASIC)
        rc = AMQP_E_BAD_HEADER;
    else if (p->flags & AMQP_PROP_CONTINUATION)
        rc = AMQP_E_PROP_FLAGS;
    if (rc == AMQP_OK) {
        amqp_props_read(&r, p);
        rc = amqp_rd_finish(&r);
    }
    if (rc < 0)
        memset(p, 0, sizeof(*p));
    return rc;
}
