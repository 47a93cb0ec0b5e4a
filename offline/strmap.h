/*
 * strmap.h - a hash map from NUL-terminated strings to pointers, for the report and verdict
 * commands (a million message ids).
 *
 * A thin layer over proto/base/hmap.h: each key is one allocation (struct strmap_slot, the key
 * copied into it) indexed by the map.  No deletion: the commands only ever add.  The map owns its
 * keys; values are the caller's (strmap_free() can free them).
 */
#ifndef TWICE_STRMAP_H
#define TWICE_STRMAP_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/base/hmap.h"

/* Keys a map refuses to grow past. */
#define STRMAP_MAX_COUNT ((size_t)1 << 31)

/* One key and its value. */
struct strmap_slot {
    void *value;
    char key[]; /* owned, NUL-terminated */
};

struct strmap {
    struct hmap map; /* of struct strmap_slot (owned) */
};

/* An empty map; it allocates on the first insert.  Same as zeroing it. */
void strmap_init(struct strmap *m);

/*
 * The value slot for key, inserting key (copied) with a NULL value when it is
 * new; *inserted says which.  The pointer lives as long as the map.
 * NULL when out of memory or past STRMAP_MAX_COUNT (the map is unchanged).
 */
void **strmap_put(struct strmap *m, const char *key, bool *inserted) TWICE_MUST_CHECK;

/* The value stored for key, or NULL when key is absent. */
void *strmap_get(const struct strmap *m, const char *key);

/* The map's copy of key, or NULL when absent: lives as long as the map. */
const char *strmap_key(const struct strmap *m, const char *key);

/* Keys held. */
size_t strmap_count(const struct strmap *m);

/*
 * Iterates: start with *pos = 0; each call returns the next key (false at the end).  Order is
 * the table's, not insertion order.
 */
bool strmap_next(const struct strmap *m, size_t *pos, const struct strmap_slot **slot);

/* Frees keys and table, and each value with free_value when not NULL.  The
 * map is empty (and reusable) after. */
void strmap_free(struct strmap *m, void (*free_value)(void *));

#endif
