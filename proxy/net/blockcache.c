/*
 * blockcache.c - libevent's memory, with a per-thread cache of its chain-sized blocks.
 *
 * libevent sizes a chain as a power of two of at least 1 KiB (evbuffer_chain_new in
 * libevent 2.1's buffer.c rounds up from MIN_BUFFER_SIZE), including the header-only chain
 * of evbuffer_add_reference.  Those sizes, up to 16 KiB, are cached here; a class keeps at
 * most BLOCKCACHE_CLASS_BUDGET bytes of free blocks per thread.  A block freed on another thread
 * than the one that allocated it joins that thread's cache: each block is a plain malloc
 * block behind its header, so any thread may free it to malloc in the end.
 */
#include "proxy/net/blockcache.h"

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Under AddressSanitizer a cached block is poisoned (its link is in the header): a use of a
 * chain after libevent freed it is still reported while the block waits in the cache. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define BLOCKCACHE_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define BLOCKCACHE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define BLOCKCACHE_POISON(p, n) ((void)(p), (void)(n))
#define BLOCKCACHE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The header before each block: its class (or BLOCKCACHE_NONE), whether it is in a cache, and
 * the size asked for (a block outside the classes) or the next cached block of its class.
 * 16 bytes keep malloc's alignment. */
#define BLOCKCACHE_NONE 0xffu
#define BLOCKCACHE_MIN_SHIFT 10u /* 1 KiB */
#define BLOCKCACHE_CLASSES 5u    /* 1, 2, 4, 8, 16 KiB */

/* Bytes of free blocks a thread keeps per class: 256 KiB, but 1 MiB of the 16 KiB blocks that
 * session.c reads small traffic into (64 of them, as many as a loop turn's reads pin). */
static const size_t blockcache_budget[BLOCKCACHE_CLASSES] = {
    256u * 1024u, 256u * 1024u, 256u * 1024u, 256u * 1024u, 1024u * 1024u};

struct blockcache_hdr {
    uint8_t cls;
    uint8_t cached;
    union {
        size_t size;
        struct blockcache_hdr *next;
    } u;
};

_Static_assert(sizeof(struct blockcache_hdr) == 16, "the header keeps malloc's 16-byte alignment");

static _Thread_local struct {
    struct blockcache_hdr *free[BLOCKCACHE_CLASSES];
    unsigned n[BLOCKCACHE_CLASSES];
    bool closed; /* the thread is done: blocks go back to malloc */
} cache;

static size_t class_size(unsigned c)
{
    return (size_t)1 << (BLOCKCACHE_MIN_SHIFT + c);
}

/* The class of an exact power-of-two size in [1 KiB, 16 KiB], else BLOCKCACHE_NONE. */
static unsigned class_of(size_t size)
{
    if (size < class_size(0) || size > class_size(BLOCKCACHE_CLASSES - 1) ||
        (size & (size - 1)) != 0)
        return BLOCKCACHE_NONE;
    return (unsigned)__builtin_ctzll((unsigned long long)size) - BLOCKCACHE_MIN_SHIFT;
}

static struct blockcache_hdr *header_of(void *p)
{
    return (struct blockcache_hdr *)p - 1;
}

/* The bytes the block behind p holds. */
static size_t usable(void *p)
{
    const struct blockcache_hdr *h = header_of(p);
    return h->cls != BLOCKCACHE_NONE ? class_size(h->cls) : h->u.size;
}

void *blockcache_malloc(size_t size)
{
    unsigned c = class_of(size);
    if (c != BLOCKCACHE_NONE && cache.free[c] != NULL) {
        struct blockcache_hdr *h = cache.free[c];
        cache.free[c] = h->u.next;
        cache.n[c]--;
        h->cached = 0;
        BLOCKCACHE_UNPOISON(h + 1, class_size(c));
        return h + 1;
    }
    if (size > SIZE_MAX - sizeof(struct blockcache_hdr))
        return NULL;
    struct blockcache_hdr *h = malloc(sizeof(*h) + size);
    if (h == NULL)
        return NULL;
    h->cls = (uint8_t)c;
    h->cached = 0;
    h->u.size = size;
    return h + 1;
}

void blockcache_free(void *p)
{
    if (p == NULL)
        return;
    struct blockcache_hdr *h = header_of(p);
    unsigned c = h->cls;
    if (h->cached)
        abort(); /* freed twice: reusing it would hand one block out twice */
    if (c != BLOCKCACHE_NONE && !cache.closed &&
        (size_t)(cache.n[c] + 1) * class_size(c) <= blockcache_budget[c]) {
        h->cached = 1;
        h->u.next = cache.free[c];
        cache.free[c] = h;
        cache.n[c]++;
        BLOCKCACHE_POISON(p, class_size(c));
        return;
    }
    free(h);
}

void *blockcache_realloc(void *p, size_t size)
{
    if (p == NULL)
        return blockcache_malloc(size);
    if (size == 0) {
        blockcache_free(p);
        return NULL;
    }
    struct blockcache_hdr *h = header_of(p);
    unsigned c = h->cls;
    if (c == BLOCKCACHE_NONE && class_of(size) == BLOCKCACHE_NONE) {
        /* Arrays libevent grows (its fd map, change lists): malloc's own realloc. */
        if (size > SIZE_MAX - sizeof(*h))
            return NULL;
        struct blockcache_hdr *n = realloc(h, sizeof(*n) + size);
        if (n == NULL)
            return NULL;
        n->u.size = size;
        return n + 1;
    }
    if (c != BLOCKCACHE_NONE && size <= class_size(c))
        return p; /* it fits where it is */
    /* Into or out of a class: a new block, then the old one goes. */
    void *q = blockcache_malloc(size);
    if (q == NULL)
        return NULL;
    size_t old = usable(p);
    memcpy(q, p, old < size ? old : size);
    blockcache_free(p);
    return q;
}

void blockcache_drain(void)
{
    cache.closed = true;
    for (unsigned c = 0; c < BLOCKCACHE_CLASSES; c++) {
        while (cache.free[c] != NULL) {
            struct blockcache_hdr *h = cache.free[c];
            cache.free[c] = h->u.next;
            BLOCKCACHE_UNPOISON(h + 1, class_size(c));
            free(h);
        }
        cache.n[c] = 0;
    }
}

size_t blockcache_cached(void)
{
    size_t n = 0;
    for (unsigned c = 0; c < BLOCKCACHE_CLASSES; c++)
        n += cache.n[c];
    return n;
}

void blockcache_install(void)
{
    event_set_mem_functions(blockcache_malloc, blockcache_realloc, blockcache_free);
}
