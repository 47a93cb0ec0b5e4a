/*
 * strmap.c - open-addressing string map.  See strmap.h.
 */
#include "offline/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t strmap_hash(const char *key)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)key; *p != '\0'; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}

/* The slot holding key, or the empty slot where it would go.  cap > 0. */
static struct strmap_slot *strmap_find(const struct strmap *m, const char *key, uint64_t hash)
{
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        struct strmap_slot *s = &m->slots[i];
        if (s->key == NULL || (s->hash == hash && strcmp(s->key, key) == 0))
            return s;
    }
}

/* Doubles the table and re-inserts every key. */
static bool strmap_grow(struct strmap *m)
{
    size_t cap = m->cap != 0 ? m->cap * 2 : STRMAP_INITIAL_CAP;
    struct strmap_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return false;
    struct strmap old = *m;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old.cap; i++) {
        if (old.slots[i].key != NULL)
            *strmap_find(m, old.slots[i].key, old.slots[i].hash) = old.slots[i];
    }
    free(old.slots);
    return true;
}

void strmap_init(struct strmap *m)
{
    memset(m, 0, sizeof(*m));
}

void **strmap_put(struct strmap *m, const char *key, bool *inserted)
{
    uint64_t hash = strmap_hash(key);
    *inserted = false;
    if (m->cap != 0) {
        struct strmap_slot *s = strmap_find(m, key, hash);
        if (s->key != NULL)
            return &s->value;
    }
    if (m->count >= STRMAP_MAX_COUNT)
        return NULL;
    if ((m->count + 1) * 2 > m->cap && !strmap_grow(m))
        return NULL;
    char *copy = strdup(key);
    if (copy == NULL)
        return NULL;
    struct strmap_slot *s = strmap_find(m, key, hash);
    s->key = copy;
    s->hash = hash;
    s->value = NULL;
    m->count++;
    *inserted = true;
    return &s->value;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    if (m->cap == 0)
        return NULL;
    return strmap_find(m, key, strmap_hash(key))->value;
}

const char *strmap_key(const struct strmap *m, const char *key)
{
    if (m->cap == 0)
        return NULL;
    return strmap_find(m, key, strmap_hash(key))->key;
}

bool strmap_next(const struct strmap *m, size_t *pos, const struct strmap_slot **slot)
{
    for (; *pos < m->cap; (*pos)++) {
        if (m->slots[*pos].key != NULL) {
            *slot = &m->slots[(*pos)++];
            return true;
        }
    }
    return false;
}

void strmap_free(struct strmap *m, void (*free_value)(void *))
{
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == NULL)
            continue;
        free(m->slots[i].key);
        if (free_value != NULL)
            free_value(m->slots[i].value);
    }
    free(m->slots);
    strmap_init(m);
}
