/*
 * test_hmap.c - the tree's hash map (proto/base/hmap.c): what is added is found until deleted, by
 * its key and not by its hash alone; keys that collide (one hash for all, or one home slot with
 * the probe wrapping round the table's end) are all found and deleted in any order; a map of a
 * million keys grows and keeps every one; a walk sees each item once; and an allocation failure
 * at any add leaves the map as it was, every item still there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/base/hmap.h"
#include "tests/lib/failalloc.h"

/* The items of these tests: a number as key, and whatever hash a test gives it. */
struct item {
    uint64_t key;
    uint64_t hash;
    unsigned seen; /* by a walk */
};

static bool item_is(const void *item, const void *key)
{
    return ((const struct item *)item)->key == *(const uint64_t *)key;
}

static struct item *find(const struct hmap *m, const struct item *it)
{
    return hmap_find(m, it->hash, item_is, &it->key);
}

static void add(struct hmap *m, struct item *it)
{
    assert_int_equal(hmap_add(m, it->hash, it), 0);
}

/* Items 0..n-1 with key i and hash(i). */
static struct item *items_new(size_t n, uint64_t (*hash)(uint64_t))
{
    struct item *v = calloc(n, sizeof(*v));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (struct item){i, hash(i), 0};
    return v;
}

static uint64_t hash_good(uint64_t i)
{
    return hmap_hash_u64(i);
}

static uint64_t hash_same(uint64_t i)
{
    (void)i;
    return 42;
}

/* Keys whose homes are the table's last slot and its first two (while it has at most 2^20
 * slots): the cluster wraps round the table's end, and a deletion on either side of the end
 * must move back exactly the keys whose probe passed it. */
static uint64_t hash_wrapping(uint64_t i)
{
    static const uint64_t homes[3] = {0xfffff, 0, 1};
    return (i << 20) | homes[i % 3];
}

/* A new map of v[0..n). */
static void add_all(struct hmap *m, struct item *v, size_t n)
{
    hmap_init(m);
    for (size_t i = 0; i < n; i++)
        add(m, &v[i]);
}

/* Every item in [from, to) is found, and itself. */
static void assert_all_found(const struct hmap *m, const struct item *v, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        assert_ptr_equal(find(m, &v[i]), &v[i]);
}

/* Added, found; deleted, gone; a key that shares a hash with a present one is not it. */
static void test_add_find_del(void **state)
{
    (void)state;
    struct hmap m;
    hmap_init(&m);
    struct item a = {1, 7, 0}, b = {2, 7, 0}, c = {3, 8, 0};
    assert_null(find(&m, &a));
    assert_null(hmap_del(&m, a.hash, item_is, &a.key));
    add(&m, &a);
    assert_ptr_equal(find(&m, &a), &a);
    assert_null(find(&m, &b)); /* same hash, other key */
    add(&m, &b);
    add(&m, &c);
    assert_int_equal(m.count, 3);
    assert_ptr_equal(hmap_del(&m, b.hash, item_is, &b.key), &b);
    assert_null(find(&m, &b));
    assert_ptr_equal(find(&m, &a), &a);
    assert_true(hmap_del_item(&m, c.hash, &c));
    assert_false(hmap_del_item(&m, c.hash, &c));
    assert_int_equal(m.count, 1);
    assert_int_equal(hmap_add(&m, 9, NULL), -1); /* NULL marks an empty slot */
    assert_int_equal(m.count, 1);
    hmap_free(&m);
    assert_int_equal(m.count, 0);
    assert_null(find(&m, &a));
}

/* Deletes v[0..n) in a scrambled order, checking after each that the rest are all found. */
static void del_scrambled(struct hmap *m, struct item *v, size_t n, size_t step)
{
    for (size_t k = 0; k < n; k++) {
        size_t i = (k * step) % n;
        assert_ptr_equal(hmap_del(m, v[i].hash, item_is, &v[i].key), &v[i]);
        assert_null(find(m, &v[i]));
        v[i].seen = 1; /* deleted */
        for (size_t j = 0; j < n; j++)
            assert_ptr_equal(find(m, &v[j]), v[j].seen ? NULL : &v[j]);
    }
    assert_int_equal(m->count, 0);
}

/* Keys that all hash alike, and keys whose probes wrap round the table's end. */
static void test_colliding_keys(void **state)
{
    (void)state;
    uint64_t (*hashes[])(uint64_t) = {hash_same, hash_wrapping};
    for (size_t h = 0; h < 2; h++) {
        const size_t n = 200;
        struct item *v = items_new(n, hashes[h]);
        struct hmap m;
        add_all(&m, v, n);
        assert_all_found(&m, v, 0, n);
        del_scrambled(&m, v, n, 7); /* 7 and 200 are coprime: every index once */
        hmap_free(&m);
        free(v);
    }
}

/* A million keys: the table doubles as it fills, stays at most 3/4 full, keeps every key. */
static void test_many_keys_grow(void **state)
{
    (void)state;
    const size_t n = 1000000;
    struct item *v = items_new(n, hash_good);
    struct hmap m;
    hmap_init(&m);
    for (size_t i = 0; i < n; i++) {
        add(&m, &v[i]);
        assert_true(m.count * 4 <= m.cap * 3);
    }
    assert_int_equal(m.count, n);
    assert_int_equal(m.cap & (m.cap - 1), 0);
    assert_all_found(&m, v, 0, n);
    /* Half deleted: the other half is still found, the deleted half is not. */
    for (size_t i = 0; i < n; i += 2)
        assert_ptr_equal(hmap_del(&m, v[i].hash, item_is, &v[i].key), &v[i]);
    assert_int_equal(m.count, n / 2);
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(find(&m, &v[i]), i % 2 ? &v[i] : NULL);
    hmap_free(&m);
    free(v);
}

/* A walk gives every item once, and nothing else. */
static void test_iterate(void **state)
{
    (void)state;
    const size_t n = 5000;
    struct item *v = items_new(n, hash_good);
    struct hmap m;
    size_t pos = 0;
    void *got = NULL;
    hmap_init(&m);
    assert_false(hmap_next(&m, &pos, &got));
    add_all(&m, v, n);
    for (size_t i = 0; i < n; i += 3)
        assert_true(hmap_del_item(&m, v[i].hash, &v[i]));
    pos = 0;
    size_t walked = 0;
    while (hmap_next(&m, &pos, &got)) {
        struct item *it = got;
        assert_true(it >= v && it < v + n);
        it->seen++;
        walked++;
    }
    assert_int_equal(walked, m.count);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(v[i].seen, i % 3 ? 1 : 0);
    hmap_free(&m);
    free(v);
}

#define FAIL_ITEMS 3000u

/* One run of FAIL_ITEMS adds with allocation nth failing: the failed add returns -1 and the map
 * is as it was (same count, every item found); the adds after it go on. */
static void adds_failing(void *ctx, long nth)
{
    (void)nth;
    struct item *v = ctx;
    struct hmap m;
    hmap_init(&m);
    size_t i = 0;
    int rc = 0;
    for (; i < FAIL_ITEMS && (rc = hmap_add(&m, v[i].hash, &v[i])) == 0; i++)
        ;
    if (kit_failed()) {
        assert_int_equal(rc, -1);
        assert_int_equal(m.count, i);
        assert_all_found(&m, v, 0, i);
        assert_null(find(&m, &v[i]));
        for (; i < FAIL_ITEMS; i++)
            add(&m, &v[i]);
    }
    assert_int_equal(m.count, FAIL_ITEMS);
    assert_all_found(&m, v, 0, FAIL_ITEMS);
    hmap_free(&m);
}

/* An allocation failure at every add that allocates leaves the map intact. */
static void test_allocation_failure_leaves_map_intact(void **state)
{
    (void)state;
    struct item *v = items_new(FAIL_ITEMS, hash_good);
    /* The table doubles from 16 slots to 4096: 9 allocations. */
    assert_true(kit_each_allocation_fails(&kit_wrap_hook, adds_failing, v) > 5);
    free(v);
}

/* Bucket counts of 1600 hashes' low four bits: each of the 16 near 100. */
static void assert_low_bits_spread(const uint64_t *h, size_t n)
{
    unsigned low[16] = {0};
    for (size_t i = 0; i < n; i++)
        low[h[i] & 15]++;
    for (size_t b = 0; b < 16; b++)
        assert_in_range(low[b], 50, 150);
}

/* The hashes: a string's is its bytes'; a key hashed in parts is told from the same bytes cut
 * elsewhere, and a trailing NUL counts; nearby integers and ids that differ in one character
 * spread over the low bits. */
static void test_hashes(void **state)
{
    (void)state;
    assert_true(hmap_hash_str("scope") == hmap_hash_bytes("scope", 5));
    assert_true(hmap_hash_bytes("a", 1) != hmap_hash_bytes("a\0", 2));
    assert_true(hmap_hash_bytes("", 0) != hmap_hash_bytes("\0", 1));
    uint64_t ab_c = hmap_hash_end(hmap_hash_add(hmap_hash_add(HMAP_HASH_INIT, "ab", 2), "c", 1));
    uint64_t a_bc = hmap_hash_end(hmap_hash_add(hmap_hash_add(HMAP_HASH_INIT, "a", 1), "bc", 2));
    assert_true(ab_c != a_bc);
    /* Two words that differ in their top bit only (bytes 7 and 15) do not cancel out, as they
     * would if a step were a multiply alone. */
    assert_true(hmap_hash_bytes("aaaaaaaaaaaaaaaa", 16) != hmap_hash_bytes("aaaaaaa\xe1"
                                                                           "aaaaaaa\xe1",
                                                                           16));
    uint64_t h[1600];
    for (uint64_t i = 0; i < 1600; i++)
        h[i] = hmap_hash_u64(i);
    assert_low_bits_spread(h, 1600);
    char id[48];
    for (unsigned i = 0; i < 1600; i++) {
        int n = snprintf(id, sizeof(id), "d6f1c0de-2b1e-4c8a-9f3e-%012u", i);
        h[i] = hmap_hash_bytes(id, (size_t)n);
    }
    assert_low_bits_spread(h, 1600);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_find_del),
        cmocka_unit_test(test_colliding_keys),
        cmocka_unit_test(test_many_keys_grow),
        cmocka_unit_test(test_iterate),
        cmocka_unit_test(test_allocation_failure_leaves_map_intact),
        cmocka_unit_test(test_hashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
