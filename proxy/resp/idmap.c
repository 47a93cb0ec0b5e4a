/*
 * idmap.c - message id -> what the delivery said, bounded, oldest put evicted first.
 *
 * Each entry is one allocation (its links, its memo and its key) indexed by proto/base/hmap.h: an
 * entry keeps its address while it lives, so a caller may hold the memo idmap_put returned
 * across other puts under the same lock.
 */
#include "proxy/resp/idmap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/hmap.h"

struct node {
    struct node *older, *newer; /* in order of the last put */
    size_t keylen;              /* of key[]: the scope, its NUL and the key */
    struct job_memo info;
    char key[]; /* scope '\0' key, not NUL-terminated at the end */
};

/* A key as looked up: a scope and a key apart. */
struct lookup {
    const char *scope;
    size_t slen;
    const char *key;
    size_t keylen;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct hmap map;
static uint64_t generation; /* of the last entry made */
static struct node *oldest, *newest;

static uint64_t idmap_hash(const struct lookup *k)
{
    /* The scope's NUL is hashed: scope "amq" and key "pjob" do not meet "amqp" "job". */
    uint64_t h = hmap_hash_add(HMAP_HASH_INIT, k->scope, k->slen + 1);
    return hmap_hash_end(hmap_hash_add(h, k->key, k->keylen));
}

static bool same(const void *item, const void *key)
{
    const struct node *n = item;
    const struct lookup *k = key;
    return n->keylen == k->slen + 1 + k->keylen && memcmp(n->key, k->scope, k->slen + 1) == 0 &&
           memcmp(n->key + k->slen + 1, k->key, k->keylen) == 0;
}

static struct lookup lookup_of(const char *scope, const char *key, size_t keylen)
{
    return (struct lookup){scope, strlen(scope), key, keylen};
}

/* The hash n was added under, made again from its key: an eviction needs it, and keeping it in
 * every entry would cost 8 MiB at the bound for one hash per eviction saved. */
static uint64_t node_hash(const struct node *n)
{
    size_t slen = strlen(n->key);
    struct lookup k = {n->key, slen, n->key + slen + 1, n->keylen - slen - 1};
    return idmap_hash(&k);
}

/* Takes n out of the eviction order. */
static void unorder(struct node *n)
{
    if (n->older != NULL)
        n->older->newer = n->newer;
    else
        oldest = n->newer;
    if (n->newer != NULL)
        n->newer->older = n->older;
    else
        newest = n->older;
}

/* Puts n last in the eviction order. */
static void order_newest(struct node *n)
{
    n->newer = NULL;
    n->older = newest;
    if (newest != NULL)
        newest->newer = n;
    else
        oldest = n;
    newest = n;
}

/* Forgets n, out of the map already. */
static void node_free(struct node *n)
{
    unorder(n);
    free(n->info.task);
    free(n->info.queue);
    free(n->info.id);
    free(n);
}

void idmap_lock(void)
{
    pthread_mutex_lock(&lock);
}

void idmap_unlock(void)
{
    pthread_mutex_unlock(&lock);
}

struct job_memo *idmap_get(const char *scope, const char *key, size_t keylen)
{
    struct lookup k = lookup_of(scope, key, keylen);
    struct node *n = hmap_find(&map, idmap_hash(&k), same, &k);
    return n != NULL ? &n->info : NULL;
}

/* A new entry for k, not in the map yet; NULL when out of memory (nothing changed). */
static struct node *node_new(const struct lookup *k, uint64_t h)
{
    struct node *n = calloc(1, sizeof(*n) + k->slen + 1 + k->keylen);
    if (n == NULL)
        return NULL;
    n->keylen = k->slen + 1 + k->keylen;
    memcpy(n->key, k->scope, k->slen + 1);
    memcpy(n->key + k->slen + 1, k->key, k->keylen);
    if (hmap_add(&map, h, n) != 0) {
        free(n);
        return NULL;
    }
    n->info.gen = ++generation;
    order_newest(n);
    return n;
}

struct job_memo *idmap_put(const char *scope, const char *key, size_t keylen)
{
    struct lookup k = lookup_of(scope, key, keylen);
    uint64_t h = idmap_hash(&k);
    struct node *n = hmap_find(&map, h, same, &k);
    if (n != NULL) {
        /* In use again (a processing list fed on, a job delivered anew): evicted last. */
        unorder(n);
        order_newest(n);
        return &n->info;
    }
    if (map.count >= IDMAP_MAX && oldest != NULL) {
        hmap_del_item(&map, node_hash(oldest), oldest);
        node_free(oldest);
    }
    n = node_new(&k, h);
    return n != NULL ? &n->info : NULL;
}

void idmap_del(const char *scope, const char *key, size_t keylen)
{
    struct lookup k = lookup_of(scope, key, keylen);
    struct node *n = hmap_del(&map, idmap_hash(&k), same, &k);
    if (n != NULL)
        node_free(n);
}

size_t idmap_count(void)
{
    return map.count;
}

void idmap_clear(void)
{
    while (oldest != NULL)
        node_free(oldest);
    hmap_free(&map);
}
