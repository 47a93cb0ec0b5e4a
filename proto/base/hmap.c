/*
 * hmap.c - open addressing, linear probing, backward-shift deletion.  See hmap.h.
 */
#include "proto/base/hmap.h"

#include <stdlib.h>
#include <string.h>

/* An odd 64-bit constant with its bits spread (2^64 / the golden ratio, as in splitmix64). */
#define HMAP_MUL 0x9e3779b97f4a7c15ull

void hmap_init(struct hmap *m)
{
    memset(m, 0, sizeof(*m));
}

/* The slot of (hash, key), or the empty slot that ends its probe.  cap > 0. */
static size_t hmap_probe(const struct hmap *m, uint64_t hash, hmap_eq_fn eq, const void *key)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash & mask;
    for (;; i = (i + 1) & mask) {
        const struct hmap_slot *s = &m->slots[i];
        if (s->item == NULL || (s->hash == hash && eq(s->item, key)))
            return i;
    }
}

void *hmap_find(const struct hmap *m, uint64_t hash, hmap_eq_fn eq, const void *key)
{
    if (m->count == 0)
        return NULL;
    return m->slots[hmap_probe(m, hash, eq, key)].item;
}

/* Puts a slot in the first empty place of its probe.  The table has room. */
static void hmap_place(struct hmap_slot *slots, size_t cap, struct hmap_slot s)
{
    size_t i = (size_t)s.hash & (cap - 1);
    while (slots[i].item != NULL)
        i = (i + 1) & (cap - 1);
    slots[i] = s;
}

/* Doubles the table (or makes the first one).  -1 when out of memory: nothing changed. */
static int hmap_grow(struct hmap *m)
{
    size_t cap = m->cap != 0 ? m->cap * 2 : HMAP_MIN_CAP;
    if (cap < m->cap || cap > SIZE_MAX / sizeof(struct hmap_slot))
        return -1;
    struct hmap_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].item != NULL)
            hmap_place(slots, cap, m->slots[i]);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int hmap_add(struct hmap *m, uint64_t hash, void *item)
{
    if (item == NULL || m->count >= HMAP_MAX_COUNT)
        return -1;
    /* At most 3/4 full: linear probing's misses stay a few slots long. */
    if ((m->count + 1) * 4 > m->cap * 3 && hmap_grow(m) != 0)
        return -1;
    hmap_place(m->slots, m->cap, (struct hmap_slot){hash, item});
    m->count++;
    return 0;
}

/* Empties slot i and moves back the slots after it that probed past it, so that no probe
 * meets a hole before its item. */
static void hmap_remove_at(struct hmap *m, size_t i)
{
    size_t mask = m->cap - 1;
    for (size_t j = (i + 1) & mask; m->slots[j].item != NULL; j = (j + 1) & mask) {
        size_t home = (size_t)m->slots[j].hash & mask;
        /* The slot at j stays when its home lies in (i, j], cyclically. */
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i] = (struct hmap_slot){0, NULL};
    m->count--;
}

void *hmap_del(struct hmap *m, uint64_t hash, hmap_eq_fn eq, const void *key)
{
    if (m->count == 0)
        return NULL;
    size_t i = hmap_probe(m, hash, eq, key);
    void *item = m->slots[i].item;
    if (item != NULL)
        hmap_remove_at(m, i);
    return item;
}

bool hmap_del_item(struct hmap *m, uint64_t hash, const void *item)
{
    if (m->count == 0 || item == NULL)
        return false;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)hash & mask; m->slots[i].item != NULL; i = (i + 1) & mask) {
        if (m->slots[i].item == item) {
            hmap_remove_at(m, i);
            return true;
        }
    }
    return false;
}

bool hmap_next(const struct hmap *m, size_t *pos, void **item)
{
    for (; *pos < m->cap; (*pos)++) {
        if (m->slots[*pos].item != NULL) {
            *item = m->slots[(*pos)++].item;
            return true;
        }
    }
    return false;
}

void hmap_free(struct hmap *m)
{
    free(m->slots);
    hmap_init(m);
}

/* One step over 8 bytes: a multiply carries every bit of w upwards, the shift brings the high
 * half back down so that the next step's multiply spreads it too.  Both are bijections of h,
 * so two inputs that differ in one word never meet in that step. */
static uint64_t hmap_step(uint64_t h, uint64_t w)
{
    h = (h ^ w) * HMAP_MUL;
    return h ^ (h >> 32);
}

uint64_t hmap_hash_add(uint64_t h, const void *p, size_t n)
{
    /* Eight bytes a step, not one (FNV-1a's): a job memory key (a 36-character tag) costs
     * five multiplies, not 42, and the hash was most of a lookup's cost. */
    const unsigned char *b = p;
    for (; n >= 8; b += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = hmap_step(h, w);
    }
    /* The last 0-7 bytes, with their count in the top byte: "a" is not "a\0". */
    uint64_t w = (uint64_t)n << 56;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)b[i] << (8 * i);
    return hmap_step(h, w);
}

uint64_t hmap_hash_end(uint64_t h)
{
    /* splitmix64's finaliser: every input bit reaches the low bits that index the table. */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

uint64_t hmap_hash_bytes(const void *p, size_t n)
{
    return hmap_hash_end(hmap_hash_add(HMAP_HASH_INIT, p, n));
}

uint64_t hmap_hash_str(const char *s)
{
    return hmap_hash_bytes(s, strlen(s));
}

uint64_t hmap_hash_u64(uint64_t x)
{
    return hmap_hash_end(x + 0x9e3779b97f4a7c15ull);
}
