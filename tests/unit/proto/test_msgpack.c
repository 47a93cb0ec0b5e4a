/*
 * test_msgpack.c - proto/base/msgpack.h: every type's header, at every truncation, and the
 * skipping of nested values to a bounded depth.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/base/msgpack.h"

/* One value of each encoding, as msgpackr writes BullMQ's arguments, and what it reads as. */
static const struct {
    const char *what;
    const uint8_t *bytes;
    size_t n;
    enum mp_type type;
    int64_t i;
    size_t len;
    uint32_t count;
} values[] = {
#define V(w, t, i, len, count, ...)                                                                \
    {                                                                                              \
        w, (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__}), t, i, len,      \
            count                                                                                  \
    }
    V("positive fixint", MP_INT, 5, 0, 0, 0x05),
    V("negative fixint", MP_INT, -3, 0, 0, 0xfd),
    V("nil", MP_NIL, 0, 0, 0, 0xc0),
    V("true", MP_BOOL, 1, 0, 0, 0xc3),
    V("uint16", MP_INT, 0x1234, 0, 0, 0xcd, 0x12, 0x34),
    V("uint64 past int64", MP_INT, INT64_MAX, 0, 0, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff),
    V("int8", MP_INT, -128, 0, 0, 0xd0, 0x80),
    V("int32", MP_INT, -2, 0, 0, 0xd2, 0xff, 0xff, 0xff, 0xfe),
    V("int16", MP_INT, -300, 0, 0, 0xd1, 0xfe, 0xd4),
    V("int64", MP_INT, -5, 0, 0, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb),
    V("uint8", MP_INT, 200, 0, 0, 0xcc, 0xc8),
    V("uint32", MP_INT, 0x01020304, 0, 0, 0xce, 0x01, 0x02, 0x03, 0x04),
    V("float32", MP_FLOAT, 0, 0, 0, 0xca, 0x3f, 0x80, 0x00, 0x00),
    V("false", MP_BOOL, 0, 0, 0, 0xc2),
    V("float64", MP_FLOAT, 0, 0, 0, 0xcb, 0x42, 0x7a, 0x23, 0x76, 0x4a, 0x50, 0x60, 0x00),
    V("fixstr", MP_STR, 0, 3, 0, 0xa3, 'a', 'b', 'c'),
    V("str8", MP_STR, 0, 2, 0, 0xd9, 0x02, 'i', 'd'),
    V("str16", MP_STR, 0, 1, 0, 0xda, 0x00, 0x01, 'x'),
    V("bin8", MP_BIN, 0, 2, 0, 0xc4, 0x02, 0x00, 0x01),
    V("bin16", MP_BIN, 0, 1, 0, 0xc5, 0x00, 0x01, 0x00),
    V("bin32", MP_BIN, 0, 1, 0, 0xc6, 0x00, 0x00, 0x00, 0x01, 0x00),
    V("str32", MP_STR, 0, 2, 0, 0xdb, 0x00, 0x00, 0x00, 0x02, 'o', 'k'),
    V("fixext2", MP_EXT, 0, 2, 0, 0xd5, 0x01, 0x07, 0x08),
    V("fixext16", MP_EXT, 0, 16, 0, 0xd8, 0x01, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
      15),
    V("ext16", MP_EXT, 0, 1, 0, 0xc8, 0x00, 0x01, 0x05, 0x07),
    V("ext32", MP_EXT, 0, 1, 0, 0xc9, 0x00, 0x00, 0x00, 0x01, 0x05, 0x07),
    V("fixext1", MP_EXT, 0, 1, 0, 0xd4, 0x01, 0x07),
    V("ext8", MP_EXT, 0, 2, 0, 0xc7, 0x02, 0x01, 0x07, 0x08),
    V("fixarray", MP_ARRAY, 0, 0, 2, 0x92),
    V("array16", MP_ARRAY, 0, 0, 3, 0xdc, 0x00, 0x03),
    V("fixmap", MP_MAP, 0, 0, 1, 0x81),
    V("map16", MP_MAP, 0, 0, 4, 0xde, 0x00, 0x04),
    V("array32", MP_ARRAY, 0, 0, 0x10002, 0xdd, 0x00, 0x01, 0x00, 0x02),
    V("map32", MP_MAP, 0, 0, 0x10003, 0xdf, 0x00, 0x01, 0x00, 0x03),
#undef V
};

static void test_each_type_and_truncation(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(values) / sizeof(values[0]); k++) {
        struct mp_item it;
        size_t pos = 0;
        if (mp_next(values[k].bytes, values[k].n, &pos, &it) != 0)
            fail_msg("%s: not read", values[k].what);
        assert_int_equal(pos, values[k].n);
        assert_int_equal(it.type, values[k].type);
        if (it.type == MP_INT || it.type == MP_BOOL)
            assert_true(it.i == values[k].i);
        if (it.type == MP_STR || it.type == MP_BIN || it.type == MP_EXT) {
            assert_int_equal(it.len, values[k].len);
            assert_ptr_equal(it.data, values[k].bytes + values[k].n - values[k].len);
        }
        if (it.type == MP_ARRAY || it.type == MP_MAP)
            assert_int_equal(it.count, values[k].count);
        /* every shorter prefix is truncated: refused, nothing read past it */
        for (size_t cut = 0; cut < values[k].n; cut++) {
            pos = 0;
            if (mp_next(values[k].bytes, cut, &pos, &it) != -1)
                fail_msg("%s cut at %zu: read", values[k].what, cut);
        }
    }
    struct mp_item it;
    size_t pos = 0;
    assert_int_equal(mp_next((const uint8_t[]){0xc1}, 1, &pos, &it), -1); /* never used */
}

/* BullMQ's add arguments: [prefix, custom id, name, timestamp, nil...] */
static const uint8_t add_args[] = {0x99, 0xab, 'b',  'u',  'l',  'l',  ':',  't',  'w',
                                   'i',  'c',  'e',  ':',  0xa0, 0xa6, 'c',  'h',  'a',
                                   'r',  'g',  'e',  0xcb, 0x42, 0x7a, 0x23, 0x76, 0x4a,
                                   0x50, 0x60, 0x00, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0};

static void test_array_get_and_skip(void **state)
{
    (void)state;
    struct mp_item it;
    size_t pos;
    assert_int_equal(mp_array_get(add_args, sizeof(add_args), 0, &it, &pos), 0);
    assert_int_equal(it.type, MP_STR);
    assert_memory_equal(it.data, "bull:twice:", 11);
    assert_int_equal(mp_array_get(add_args, sizeof(add_args), 1, &it, &pos), 0);
    assert_int_equal(it.type, MP_STR);
    assert_int_equal(it.len, 0);
    assert_int_equal(mp_array_get(add_args, sizeof(add_args), 2, &it, &pos), 0);
    assert_memory_equal(it.data, "charge", 6);
    assert_int_equal(mp_array_get(add_args, sizeof(add_args), 8, &it, &pos), 0);
    assert_int_equal(it.type, MP_NIL);
    assert_int_equal(mp_array_get(add_args, sizeof(add_args), 9, &it, &pos), 1); /* past it */
    pos = 0;
    assert_int_equal(mp_skip(add_args, sizeof(add_args), &pos), 0);
    assert_int_equal(pos, sizeof(add_args));
    for (size_t cut = 0; cut < sizeof(add_args); cut++) {
        pos = 0;
        if (mp_skip(add_args, cut, &pos) != -1)
            fail_msg("cut at %zu skipped", cut);
    }
    assert_int_equal(mp_array_get((const uint8_t[]){0xa1, 'x'}, 2, 0, &it, &pos), -1);
    /* a map's pairs are skipped whole */
    const uint8_t map[] = {0x92, 0x81, 0xa1, 'k', 0x92, 0x01, 0x02, 0xa1, 'v'};
    assert_int_equal(mp_array_get(map, sizeof(map), 1, &it, &pos), 0);
    assert_memory_equal(it.data, "v", 1);
}

static void test_depth_and_counts_bounded(void **state)
{
    (void)state;
    uint8_t deep[MP_MAX_DEPTH + 8];
    memset(deep, 0x91, sizeof(deep)); /* arrays of one array of one ... */
    deep[sizeof(deep) - 1] = 0xc0;
    size_t pos = 0;
    assert_int_equal(mp_skip(deep, sizeof(deep), &pos), -1);
    uint8_t over[MP_MAX_DEPTH + 2]; /* one level past the limit */
    memset(over, 0x91, sizeof(over));
    over[sizeof(over) - 1] = 0xc0;
    pos = 0;
    assert_int_equal(mp_skip(over, sizeof(over), &pos), -1);
    uint8_t ok[MP_MAX_DEPTH + 1];
    memset(ok, 0x91, sizeof(ok));
    ok[sizeof(ok) - 1] = 0xc0;
    pos = 0;
    assert_int_equal(mp_skip(ok, sizeof(ok), &pos), 0);
    /* a count the bytes cannot hold is refused at once, not walked */
    const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0};
    pos = 0;
    assert_int_equal(mp_skip(huge, sizeof(huge), &pos), -1);
    /* an inner array claiming more elements than the bytes left: refused where it is, not
     * walked element by element to the end */
    const uint8_t inner[] = {0x92, 0xc0, 0xdd, 0x00, 0x10, 0x00, 0x00, 0xc0, 0xc0};
    pos = 0;
    assert_int_equal(mp_skip(inner, sizeof(inner), &pos), -1);
    assert_int_equal(pos, 7); /* stopped just past the inner array's header */
    /* a length past the end */
    const uint8_t str32[] = {0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'};
    struct mp_item it;
    pos = 0;
    assert_int_equal(mp_next(str32, sizeof(str32), &pos, &it), -1);
}

static void test_map_get_and_array_subset(void **state)
{
    (void)state;
    struct mp_item it;
    /* {"name": "w", "limiter": [1, 2], "token": "u:17"}: a nested value is stepped over */
    const uint8_t map[] = {0x83, 0xa4, 'n', 'a', 'm', 'e',  0xa1, 'w',  0xa7, 'l',
                           'i',  'm',  'i', 't', 'e', 'r',  0x92, 0x01, 0x02, 0xa5,
                           't',  'o',  'k', 'e', 'n', 0xa4, 'u',  ':',  '1',  '7'};
    assert_int_equal(mp_map_get(map, sizeof(map), "token", &it), 0);
    assert_int_equal(it.type, MP_STR);
    assert_int_equal(it.len, 4);
    assert_memory_equal(it.data, "u:17", 4);
    assert_int_equal(mp_map_get(map, sizeof(map), "lockDuration", &it), 1);
    assert_int_equal(mp_map_get(map, sizeof(map) - 1, "token", &it), -1); /* cut */
    const uint8_t arr[] = {0x91, 0xc0};
    assert_int_equal(mp_map_get(arr, sizeof(arr), "token", &it), -1);
    /* ["1", [z], "22", nil] without its 2nd and 4th: the kept elements' own bytes */
    const uint8_t ids[] = {0x94, 0xa1, '1', 0x91, 0xa1, 'z', 0xa2, '2', '2', 0xc0};
    uint8_t out[64];
    bool keep[4] = {true, false, true, false};
    long n = mp_array_subset(ids, sizeof(ids), keep, 4, out, sizeof(out));
    const uint8_t want[] = {0x92, 0xa1, '1', 0xa2, '2', '2'};
    assert_int_equal(n, sizeof(want));
    assert_memory_equal(out, want, sizeof(want));
    bool none[4] = {false, false, false, false};
    assert_int_equal(mp_array_subset(ids, sizeof(ids), none, 4, out, sizeof(out)), 1);
    assert_int_equal(out[0], 0x90);
    /* a count other than the array's, a cut array, no room */
    assert_int_equal(mp_array_subset(ids, sizeof(ids), keep, 3, out, sizeof(out)), -1);
    assert_int_equal(mp_array_subset(ids, sizeof(ids) - 1, keep, 4, out, sizeof(out)), -1);
    assert_int_equal(mp_array_subset(ids, sizeof(ids), keep, 4, out, 3), -1);
    /* 16 kept elements or more: an array 16 header */
    uint8_t got[64];
    bool all[20];
    uint8_t big16[3 + 20];
    big16[0] = 0xdc;
    big16[1] = 0;
    big16[2] = 20;
    for (int i = 0; i < 20; i++) {
        big16[3 + i] = (uint8_t)i; /* positive fixints */
        all[i] = i != 3;
    }
    n = mp_array_subset(big16, sizeof(big16), all, 20, got, sizeof(got));
    assert_int_equal(n, 3 + 19);
    assert_int_equal(got[0], 0xdc);
    assert_int_equal(got[2], 19);
    assert_int_equal(got[3 + 3], 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_type_and_truncation),
        cmocka_unit_test(test_array_get_and_skip),
        cmocka_unit_test(test_depth_and_counts_bounded),
        cmocka_unit_test(test_map_get_and_array_subset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
