/*
 * strmap.c - string keys over proto/base/hmap.h.  See strmap.h.
 */
#include "offline/strmap.h"

#include <stdlib.h>
#include <string.h>

static bool strmap_same(const void *item, const void *key)
{
    const struct strmap_slot *s = item;
    return strcmp(s->key, key) == 0;
}

static struct strmap_slot *strmap_find(const struct strmap *m, const char *key)
{
    return hmap_find(&m->map, hmap_hash_str(key), strmap_same, key);
}

void strmap_init(struct strmap *m)
{
    hmap_init(&m->map);
}

void **strmap_put(struct strmap *m, const char *key, bool *inserted)
{
    uint64_t hash = hmap_hash_str(key);
    *inserted = false;
    struct strmap_slot *s = hmap_find(&m->map, hash, strmap_same, key);
    if (s != NULL)
        return &s->value;
    if (m->map.count >= STRMAP_MAX_COUNT)
        return NULL;
    size_t len = strlen(key);
    s = malloc(sizeof(*s) + len + 1);
    if (s == NULL)
        return NULL;
    s->value = NULL;
    memcpy(s->key, key, len + 1);
    if (hmap_add(&m->map, hash, s) != 0) {
        free(s);
        return NULL;
    }
    *inserted = true;
    return &s->value;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    const struct strmap_slot *s = strmap_find(m, key);
    return s != NULL ? s->value : NULL;
}

const char *strmap_key(const struct strmap *m, const char *key)
{
    const struct strmap_slot *s = strmap_find(m, key);
    return s != NULL ? s->key : NULL;
}

size_t strmap_count(const struct strmap *m)
{
    return m->map.count;
}

bool strmap_next(const struct strmap *m, size_t *pos, const struct strmap_slot **slot)
{
    void *item = NULL;
    if (!hmap_next(&m->map, pos, &item))
        return false;
    *slot = item;
    return true;
}

void strmap_free(struct strmap *m, void (*free_value)(void *))
{
    size_t pos = 0;
    void *item = NULL;
    while (hmap_next(&m->map, &pos, &item)) {
        struct strmap_slot *s = item;
        if (free_value != NULL)
            free_value(s->value);
        free(s);
    }
    hmap_free(&m->map);
}
