/*
 * idmap.c - message id -> what the delivery said, bounded, oldest put evicted first.
 */
#include "proxy/idmap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *chain;         /* same bucket */
    struct node *older, *newer; /* insertion order */
    uint64_t hash;
    size_t keylen;
    struct job_memo info;
    char key[]; /* scope '\0' key, not NUL-terminated at the end */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct node **buckets;
static size_t n_buckets;
static size_t count;
static uint64_t generation; /* of the last entry made */
static struct node *oldest, *newest;

static uint64_t fnv(const char *scope, const char *key, size_t keylen)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = scope; *p != '\0'; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
    for (size_t i = 0; i < keylen; i++)
        h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
    return h;
}

static bool same(const struct node *n, uint64_t h, const char *scope, size_t slen, const char *key,
                 size_t keylen)
{
    return n->hash == h && n->keylen == slen + 1 + keylen && memcmp(n->key, scope, slen + 1) == 0 &&
           memcmp(n->key + slen + 1, key, keylen) == 0;
}

static struct node **find(const char *scope, const char *key, size_t keylen, uint64_t h)
{
    if (n_buckets == 0)
        return NULL;
    size_t slen = strlen(scope);
    struct node **pp = &buckets[h & (n_buckets - 1)];
    while (*pp != NULL && !same(*pp, h, scope, slen, key, keylen))
        pp = &(*pp)->chain;
    return pp;
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

static void unlink_node(struct node **pp)
{
    struct node *n = *pp;
    *pp = n->chain;
    unorder(n);
    free(n->info.task);
    free(n->info.queue);
    free(n->info.id);
    free(n);
    count--;
}

static int grow(void)
{
    size_t nb = n_buckets != 0 ? n_buckets * 2 : 1024;
    struct node **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return -1;
    for (size_t i = 0; i < n_buckets; i++) {
        struct node *n = buckets[i];
        while (n != NULL) {
            struct node *next = n->chain;
            n->chain = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    free(buckets);
    buckets = b;
    n_buckets = nb;
    return 0;
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
    struct node **pp = find(scope, key, keylen, fnv(scope, key, keylen));
    return pp != NULL && *pp != NULL ? &(*pp)->info : NULL;
}

struct job_memo *idmap_put(const char *scope, const char *key, size_t keylen)
{
    uint64_t h = fnv(scope, key, keylen);
    struct node **pp = find(scope, key, keylen, h);
    if (pp != NULL && *pp != NULL) {
        /* In use again (a processing list fed on, a job delivered anew): evicted last. */
        unorder(*pp);
        order_newest(*pp);
        return &(*pp)->info;
    }
    if (count >= IDMAP_MAX && oldest != NULL) {
        struct node *o = oldest;
        idmap_del(o->key, o->key + strlen(o->key) + 1, o->keylen - strlen(o->key) - 1);
    }
    if ((count + 1 > n_buckets) && grow() != 0 && n_buckets == 0)
        return NULL;
    size_t slen = strlen(scope);
    struct node *n = calloc(1, sizeof(*n) + slen + 1 + keylen);
    if (n == NULL)
        return NULL;
    n->hash = h;
    n->info.gen = ++generation;
    n->keylen = slen + 1 + keylen;
    memcpy(n->key, scope, slen + 1);
    memcpy(n->key + slen + 1, key, keylen);
    struct node **b = &buckets[h & (n_buckets - 1)];
    n->chain = *b;
    *b = n;
    order_newest(n);
    count++;
    return &n->info;
}

void idmap_del(const char *scope, const char *key, size_t keylen)
{
    struct node **pp = find(scope, key, keylen, fnv(scope, key, keylen));
    if (pp != NULL && *pp != NULL)
        unlink_node(pp);
}

size_t idmap_count(void)
{
    return count;
}

void idmap_clear(void)
{
    while (oldest != NULL) {
        struct node *o = oldest;
        idmap_del(o->key, o->key + strlen(o->key) + 1, o->keylen - strlen(o->key) - 1);
    }
    free(buckets);
    buckets = NULL;
    n_buckets = 0;
}
