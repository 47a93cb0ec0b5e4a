/*
 * msgpack.c - a bounded MessagePack reader (msgpack.h), after the format's specification.
 */
#include "proto/base/msgpack.h"

#include <string.h>

static uint64_t be(const uint8_t *p, size_t k)
{
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++)
        v = (v << 8) | p[i];
    return v;
}

/* k more bytes at p[*pos], for a length or a value. */
static int take(const uint8_t *p, size_t n, size_t *pos, size_t k, uint64_t *v)
{
    if (n - *pos < k)
        return -1;
    *v = be(p + *pos, k);
    *pos += k;
    return 0;
}

/* A payload of len bytes at p[*pos]. */
static int bytes(const uint8_t *p, size_t n, size_t *pos, uint64_t len, struct mp_item *it)
{
    if (len > n - *pos)
        return -1;
    it->data = p + *pos;
    it->len = (size_t)len;
    *pos += (size_t)len;
    return 0;
}

int mp_next(const uint8_t *p, size_t n, size_t *pos, struct mp_item *it)
{
    *it = (struct mp_item){0};
    if (*pos >= n)
        return -1;
    uint8_t b = p[(*pos)++];
    uint64_t v = 0;
    if (b <= 0x7f || b >= 0xe0) {
        it->type = MP_INT;
        it->i = b <= 0x7f ? (int64_t)b : (int64_t)(int8_t)b;
        return 0;
    }
    if (b >= 0x80 && b <= 0x8f)
        return it->type = MP_MAP, it->count = b & 0x0f, 0;
    if (b >= 0x90 && b <= 0x9f)
        return it->type = MP_ARRAY, it->count = b & 0x0f, 0;
    if (b >= 0xa0 && b <= 0xbf)
        return it->type = MP_STR, bytes(p, n, pos, b & 0x1f, it);
    switch (b) {
    case 0xc0:
        it->type = MP_NIL;
        return 0;
    case 0xc2:
    case 0xc3:
        it->type = MP_BOOL;
        it->i = b == 0xc3;
        return 0;
    case 0xc4:
    case 0xc5:
    case 0xc6: /* bin 8, 16, 32 */
        it->type = MP_BIN;
        return take(p, n, pos, (size_t)1 << (b - 0xc4), &v) == 0 ? bytes(p, n, pos, v, it) : -1;
    case 0xc7:
    case 0xc8:
    case 0xc9: /* ext 8, 16, 32: length, type byte, data */
        it->type = MP_EXT;
        if (take(p, n, pos, (size_t)1 << (b - 0xc7), &v) != 0 || *pos >= n)
            return -1;
        (*pos)++;
        return bytes(p, n, pos, v, it);
    case 0xca:
    case 0xcb: /* float 32, 64 */
        it->type = MP_FLOAT;
        return take(p, n, pos, b == 0xca ? 4 : 8, &v);
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf: /* uint 8..64 */
        it->type = MP_INT;
        if (take(p, n, pos, (size_t)1 << (b - 0xcc), &v) != 0)
            return -1;
        it->i = v > INT64_MAX ? INT64_MAX : (int64_t)v;
        return 0;
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: { /* int 8..64 */
        size_t k = (size_t)1 << (b - 0xd0);
        it->type = MP_INT;
        if (take(p, n, pos, k, &v) != 0)
            return -1;
        if (k < 8 && (v >> (8 * k - 1)) != 0)
            v |= ~(uint64_t)0 << (8 * k); /* sign-extend */
        it->i = (int64_t)v;
        return 0;
    }
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8: /* fixext 1..16: type byte, data */
        it->type = MP_EXT;
        if (*pos >= n)
            return -1;
        (*pos)++;
        return bytes(p, n, pos, (uint64_t)1 << (b - 0xd4), it);
    case 0xd9:
    case 0xda:
    case 0xdb: /* str 8, 16, 32 */
        it->type = MP_STR;
        return take(p, n, pos, (size_t)1 << (b - 0xd9), &v) == 0 ? bytes(p, n, pos, v, it) : -1;
    case 0xdc:
    case 0xdd: /* array 16, 32 */
    case 0xde:
    case 0xdf: /* map 16, 32 */
        it->type = b <= 0xdd ? MP_ARRAY : MP_MAP;
        if (take(p, n, pos, (b & 1) == 0 ? 2 : 4, &v) != 0)
            return -1;
        it->count = (uint32_t)v;
        return 0;
    default: /* 0xc1: never used */
        return -1;
    }
}

static int skip_depth(const uint8_t *p, size_t n, size_t *pos, unsigned depth)
{
    struct mp_item it;
    if (depth > MP_MAX_DEPTH || mp_next(p, n, pos, &it) != 0)
        return -1;
    if (it.type != MP_ARRAY && it.type != MP_MAP)
        return 0;
    uint64_t elems = it.type == MP_MAP ? 2ull * it.count : it.count;
    /* Each element takes a byte at least: a count beyond what is left is truncated. */
    if (elems > n - *pos)
        return -1;
    for (uint64_t k = 0; k < elems; k++)
        if (skip_depth(p, n, pos, depth + 1) != 0)
            return -1;
    return 0;
}

int mp_skip(const uint8_t *p, size_t n, size_t *pos)
{
    return skip_depth(p, n, pos, 0);
}

int mp_array_get(const uint8_t *p, size_t n, uint32_t idx, struct mp_item *it, size_t *pos)
{
    *pos = 0;
    struct mp_item arr;
    if (mp_next(p, n, pos, &arr) != 0 || arr.type != MP_ARRAY)
        return -1;
    if (idx >= arr.count)
        return 1;
    for (uint32_t k = 0; k < idx; k++)
        if (mp_skip(p, n, pos) != 0)
            return -1;
    return mp_next(p, n, pos, it) == 0 ? 0 : -1;
}

int mp_map_get(const uint8_t *p, size_t n, const char *key, struct mp_item *it)
{
    size_t pos = 0, klen = strlen(key);
    struct mp_item map, k;
    if (mp_next(p, n, &pos, &map) != 0 || map.type != MP_MAP)
        return -1;
    for (uint32_t i = 0; i < map.count; i++) {
        size_t at = pos;
        if (mp_next(p, n, &pos, &k) != 0)
            return -1;
        if (k.type == MP_ARRAY || k.type == MP_MAP) {
            pos = at;
            if (mp_skip(p, n, &pos) != 0)
                return -1;
        }
        if (k.type == MP_STR && k.len == klen && memcmp(k.data, key, klen) == 0)
            return mp_next(p, n, &pos, it) == 0 ? 0 : -1;
        if (mp_skip(p, n, &pos) != 0)
            return -1;
    }
    return 1;
}

long mp_array_subset(const uint8_t *p, size_t n, const bool *keep, uint32_t count, uint8_t *out,
                     size_t cap)
{
    size_t pos = 0;
    struct mp_item arr;
    if (mp_next(p, n, &pos, &arr) != 0 || arr.type != MP_ARRAY || arr.count != count)
        return -1;
    uint32_t kept = 0;
    for (uint32_t k = 0; k < count; k++)
        kept += keep[k];
    size_t w = 0;
    if (kept <= 15) {
        if (cap < 1)
            return -1;
        out[w++] = (uint8_t)(0x90 | kept);
    } else if (kept <= 0xffff) {
        if (cap < 3)
            return -1;
        out[w++] = 0xdc;
        out[w++] = (uint8_t)(kept >> 8);
        out[w++] = (uint8_t)kept;
    } else {
        if (cap < 5)
            return -1;
        out[w++] = 0xdd;
        for (int sh = 24; sh >= 0; sh -= 8)
            out[w++] = (uint8_t)(kept >> sh);
    }
    for (uint32_t k = 0; k < count; k++) {
        size_t at = pos;
        if (mp_skip(p, n, &pos) != 0)
            return -1;
        if (!keep[k])
            continue;
        if (cap - w < pos - at)
            return -1;
        memcpy(out + w, p + at, pos - at);
        w += pos - at;
    }
    return (long)w;
}
