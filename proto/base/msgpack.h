/*
 * msgpack.h - a bounded reader of MessagePack
 * (https://github.com/msgpack/msgpack/blob/master/spec.md).
 *
 * BullMQ packs some arguments of its Lua scripts with msgpackr: the job's name and custom id
 * are strings inside a packed array, the lock tokens and job ids of a lock renewal packed
 * arrays of strings (docs/protocols.md).  This reader walks such a value in place: an item's
 * header at a time, nested values skipped to a bounded depth.  Pure C over a byte span: no
 * allocation, no I/O.  Every function takes any bytes and fails (-1) on a truncated or
 * malformed item rather than reading past the end.
 */
#ifndef TWICE_MSGPACK_H
#define TWICE_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Deepest nesting mp_skip() follows; deeper values are refused. */
#define MP_MAX_DEPTH 32u

enum mp_type {
    MP_NIL,
    MP_BOOL,
    MP_INT,   /* signed or unsigned; .i holds it when it fits in int64_t */
    MP_FLOAT, /* float 32 or 64: not decoded */
    MP_STR,
    MP_BIN,
    MP_ARRAY, /* .count elements follow */
    MP_MAP,   /* .count key/value pairs follow */
    MP_EXT,
};

struct mp_item {
    enum mp_type type;
    const uint8_t *data; /* MP_STR, MP_BIN, MP_EXT: the bytes, len of them */
    size_t len;
    uint32_t count; /* MP_ARRAY, MP_MAP */
    int64_t i;      /* MP_INT, MP_BOOL */
};

/* The item whose header starts at p[*pos] (of n bytes): 0 with *it filled and *pos past the
 * header (past the bytes, for strings, binaries and extensions: an array's or map's elements
 * follow), -1 when it is truncated or not MessagePack (0xc1). */
int mp_next(const uint8_t *p, size_t n, size_t *pos, struct mp_item *it);

/* Skips the whole item at p[*pos], its elements included: 0, or -1 (truncated, malformed,
 * nested deeper than MP_MAX_DEPTH). */
int mp_skip(const uint8_t *p, size_t n, size_t *pos);

/* Element idx of the array p[0..n) (the whole span one array): 0 with *it the element's item
 * (its header read, *pos past it), 1 when the array is shorter, -1 when p is no array or an
 * element before it does not read. */
int mp_array_get(const uint8_t *p, size_t n, uint32_t idx, struct mp_item *it, size_t *pos);

/* The value of map key `key` (a string) in the map that p[0..n) opens with: 0 with *it set (a
 * nested value's header only, as mp_next gives it), 1 when the map has no such key, -1 when p
 * is not a map or does not read. */
int mp_map_get(const uint8_t *p, size_t n, const char *key, struct mp_item *it);

/* The array that p[0..n) opens with, with only its elements k for which keep[k] (keep has
 * count entries, count the array's length), written into out[0..cap): the kept elements' own
 * bytes, behind an array header of the new length.  The bytes written, or -1 when p is not an
 * array of count elements or out is too small (n + 5 bytes are always enough). */
long mp_array_subset(const uint8_t *p, size_t n, const bool *keep, uint32_t count, uint8_t *out,
                     size_t cap);

#endif
