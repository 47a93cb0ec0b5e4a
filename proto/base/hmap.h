/*
 * hmap.h - the hash map of the whole tree: an index from a caller's keys to the caller's items.
 *
 * The map holds (hash, item) pairs in one open-addressing table (linear probing, a power of two
 * of slots, at most 3/4 full).  Items are the caller's: a pointer to an entry it allocated, or a
 * small number cast to a pointer; never NULL (an empty slot).  The map never reads an item
 * itself: a lookup compares the stored 64-bit hash first and calls the caller's `eq` only on a
 * hash match, so a miss costs no item's memory and a hit usually one compare.  Keys of any kind
 * (byte strings, a scope and a string, integers) therefore need no copy in the map: the item
 * holds its key and `eq` knows where.
 *
 * Deletion shifts the slots after the deleted one back (no tombstones), so a map that churns
 * (the job memory: a put per delivery, a delete per ack) keeps its probe lengths.  Growth
 * doubles the table and allocates nothing else: hmap_add's one allocation fails cleanly, with
 * the map unchanged.  Items keep their address; the map's slots do not (hmap_next's position
 * is good until the next add or delete).
 *
 * Not thread-safe: a map shared by threads is used under its owner's lock.  Pure C, no I/O.
 */
#ifndef TWICE_HMAP_H
#define TWICE_HMAP_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Slots of a map's first table. */
#define HMAP_MIN_CAP 16u
/* Items a map refuses to grow past (hmap_add returns -1). */
#define HMAP_MAX_COUNT ((size_t)1 << 40)

struct hmap_slot {
    uint64_t hash;
    void *item; /* NULL: empty */
};

struct hmap {
    struct hmap_slot *slots; /* owned */
    size_t cap;              /* 0 or a power of two */
    size_t count;
};

/* Whether `item` has the key `key` (whatever the caller makes of both). */
typedef bool (*hmap_eq_fn)(const void *item, const void *key);

/* An empty map; it allocates on the first add.  Same as zeroing it. */
void hmap_init(struct hmap *m);

/* The item with `hash` for which eq(item, key) holds, or NULL. */
void *hmap_find(const struct hmap *m, uint64_t hash, hmap_eq_fn eq, const void *key);

/*
 * Adds `item` (not NULL) under `hash`.  The caller has checked its key is not there (an item
 * added twice is found first-added first).  0, or -1 when out of memory or past HMAP_MAX_COUNT:
 * then the map is unchanged.
 */
int hmap_add(struct hmap *m, uint64_t hash, void *item) TWICE_MUST_CHECK;

/* Removes the item with `hash` for which eq(item, key) holds and returns it, or NULL. */
void *hmap_del(struct hmap *m, uint64_t hash, hmap_eq_fn eq, const void *key);

/* Removes `item` itself (added under `hash`); whether it was there. */
bool hmap_del_item(struct hmap *m, uint64_t hash, const void *item);

/*
 * Iterates: start with *pos = 0; each call gives the next item (false at the end).  Order is
 * the table's.  An add or delete during the walk may skip or repeat items.
 */
bool hmap_next(const struct hmap *m, size_t *pos, void **item);

/* Frees the table (not the items): the map is empty, and reusable. */
void hmap_free(struct hmap *m);

/* Hashes.  The table is indexed by a hash's low bits: these mix every input bit into them.
 * A key made of several parts hashes them in turn (each part's length counts: "ab" then "c" is
 * not "a" then "bc"): hmap_hash_end(hmap_hash_add(hmap_hash_add(HMAP_HASH_INIT, a, na), b, nb)).
 * Not keyed: a peer that chooses colliding message ids on purpose slows the map down. */
#define HMAP_HASH_INIT                                                                             \
    0x6a09e667f3bcc908ull /* any start: the first 64 bits of sqrt(2)'s fraction */
uint64_t hmap_hash_add(uint64_t h, const void *p, size_t n);
uint64_t hmap_hash_end(uint64_t h);
/* The hash of n bytes at p. */
uint64_t hmap_hash_bytes(const void *p, size_t n);
/* The hash of a NUL-terminated string. */
uint64_t hmap_hash_str(const char *s);
/* The hash of an integer. */
uint64_t hmap_hash_u64(uint64_t x);

#endif
