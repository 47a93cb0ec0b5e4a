/*
 * fuzz_hmap.c - libFuzzer harness for the tree's hash map (proto/base/hmap.c), checked against a
 * model that cannot be wrong: an array saying which of 256 keys are in.  Not part of the default
 * build (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_hmap.c proto/base/hmap.c \
 *         -o fuzz_hmap
 *
 * The input is a program.  Its first byte says how many low bits of a key's hash survive (1 to
 * 64; its low six bits) and whether the others are zeros or ones (its top bit): with few bits
 * kept, every key collides with many others, and with ones the clusters start at the table's
 * last slots and wrap round its end, which is where linear probing's deletion can go wrong.  Then each pair of bytes is an
 * operation (add, delete by key, delete the item itself, find) and its key.
 *
 * Invariants are checked with abort(): every find, delete and add answers as the model says;
 * the count is the model's; the table is a power of two at most 3/4 full; every 64 operations
 * and at the end, every key is found or not as the model says and a walk gives each present
 * item exactly once.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/hmap.h"

#define FZ_KEYS 256u
/* Operations between two full checks. */
#define FZ_CHECK_EVERY 64u

/* Failed invariants name themselves: the reproducer's log says which one. */
#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

struct fz_item {
    unsigned key;
    unsigned walked;
};

struct fz_state {
    struct hmap map;
    struct fz_item items[FZ_KEYS];
    bool in[FZ_KEYS]; /* the model */
    size_t count;
    uint64_t mask; /* of the hashes' bits kept */
    uint64_t fill; /* the bits put in their place: all ones homes keys at the table's end */
};

static bool fz_same(const void *item, const void *key)
{
    return ((const struct fz_item *)item)->key == *(const unsigned *)key;
}

static uint64_t fz_hash(const struct fz_state *st, unsigned key)
{
    return (hmap_hash_u64(key) & st->mask) | st->fill;
}

static void fz_check_all(struct fz_state *st)
{
    CHECK(st->map.count == st->count);
    CHECK(st->map.cap == 0 || (st->map.cap & (st->map.cap - 1)) == 0);
    CHECK(st->map.count * 4 <= st->map.cap * 3);
    for (unsigned k = 0; k < FZ_KEYS; k++) {
        void *got = hmap_find(&st->map, fz_hash(st, k), fz_same, &k);
        CHECK(got == (st->in[k] ? &st->items[k] : NULL));
        st->items[k].walked = 0;
    }
    size_t pos = 0, walked = 0;
    void *item = NULL;
    while (hmap_next(&st->map, &pos, &item)) {
        struct fz_item *it = item;
        CHECK(it >= st->items && it < st->items + FZ_KEYS);
        CHECK(st->in[it->key] && it->walked == 0);
        it->walked = 1;
        walked++;
    }
    CHECK(walked == st->count);
}

static void fz_op(struct fz_state *st, uint8_t op, unsigned k)
{
    uint64_t h = fz_hash(st, k);
    struct fz_item *it = &st->items[k];
    switch (op % 4) {
    case 0: /* add, when absent (the contract) */
        if (!st->in[k]) {
            CHECK(hmap_add(&st->map, h, it) == 0);
            st->in[k] = true;
            st->count++;
        }
        break;
    case 1:
        CHECK(hmap_del(&st->map, h, fz_same, &k) == (st->in[k] ? it : NULL));
        st->count -= st->in[k];
        st->in[k] = false;
        break;
    case 2:
        CHECK(hmap_del_item(&st->map, h, it) == st->in[k]);
        st->count -= st->in[k];
        st->in[k] = false;
        break;
    default:
        CHECK(hmap_find(&st->map, h, fz_same, &k) == (st->in[k] ? it : NULL));
        break;
    }
    CHECK(st->map.count == st->count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fz_state st;
    if (size == 0)
        return 0;
    memset(&st, 0, sizeof(st));
    hmap_init(&st.map);
    unsigned bits = data[0] % 64u + 1u;
    st.mask = bits == 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
    st.fill = (data[0] & 0x80) != 0 ? ~st.mask : 0;
    for (unsigned k = 0; k < FZ_KEYS; k++)
        st.items[k].key = k;
    size_t ops = 0;
    for (size_t i = 1; i + 1 < size; i += 2) {
        fz_op(&st, data[i], data[i + 1]);
        if (++ops % FZ_CHECK_EVERY == 0)
            fz_check_all(&st);
    }
    fz_check_all(&st);
    hmap_free(&st.map);
    return 0;
}
