/*
 * evmem.c - libevent's memory, with a per-thread cache of its chain-sized blocks.
 *
 * libevent sizes a chain as a power of two of at least 1 KiB (evbuffer_chain_new in
 * libevent 2.1's buffer.c rounds up from MIN_BUFFER_SIZE), including the header-only chain
 * of evbuffer_add_reference.  Those sizes, up to 16 KiB, are cached here; a class keeps at
 * most EVMEM_CLASS_BUDGET bytes of free blocks per thread.  A block freed on another thread
 * than the one that allocated it joins that thread's cache: each block is a plain malloc
 * block behind its header, so any thread may free it to malloc in the end.
 */
#include "proxy/evmem.h"

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Under AddressSanitizer a cached block is poisoned but for its link: a use of a chain after
 * libevent freed it is still reported, as it would be without the cache. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EVMEM_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define EVMEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define EVMEM_POISON(p, n) ((void)(p), (void)(n))
#define EVMEM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The header before each block: its class (or EVMEM_NONE) in the first byte, the size asked
 * for in the second word.  16 bytes keep malloc's alignment. */
#define EVMEM_HDR 16u
#define EVMEM_NONE 0xffu
#define EVMEM_MIN_SHIFT 10u /* 1 KiB */
#define EVMEM_CLASSES 5u    /* 1, 2, 4, 8, 16 KiB */
#define EVMEM_CLASS_BUDGET (256u * 1024u)

struct evmem_free_block {
    struct evmem_free_block *next;
};

static _Thread_local struct {
    struct evmem_free_block *free[EVMEM_CLASSES];
    unsigned n[EVMEM_CLASSES];
    bool closed; /* the thread is done: blocks go back to malloc */
} cache;

static size_t class_size(unsigned c)
{
    return (size_t)1 << (EVMEM_MIN_SHIFT + c);
}

/* The class of an exact power-of-two size in [1 KiB, 16 KiB], else EVMEM_NONE. */
static unsigned class_of(size_t size)
{
    if (size < class_size(0) || size > class_size(EVMEM_CLASSES - 1) || (size & (size - 1)) != 0)
        return EVMEM_NONE;
    unsigned c = 0;
    while (class_size(c) < size)
        c++;
    return c;
}

static uint8_t *header_of(void *p)
{
    return (uint8_t *)p - EVMEM_HDR;
}

static void header_set(uint8_t *raw, unsigned c, size_t size)
{
    raw[0] = (uint8_t)c;
    memcpy(raw + sizeof(size_t), &size, sizeof(size));
}

/* The bytes the block behind p holds. */
static size_t usable(void *p)
{
    const uint8_t *raw = header_of(p);
    if (raw[0] != EVMEM_NONE)
        return class_size(raw[0]);
    size_t size;
    memcpy(&size, raw + sizeof(size_t), sizeof(size));
    return size;
}

void *evmem_malloc(size_t size)
{
    unsigned c = class_of(size);
    if (c != EVMEM_NONE && cache.free[c] != NULL) {
        struct evmem_free_block *b = cache.free[c];
        cache.free[c] = b->next;
        cache.n[c]--;
        EVMEM_UNPOISON(b, class_size(c));
        return b;
    }
    if (size > SIZE_MAX - EVMEM_HDR)
        return NULL;
    uint8_t *raw = malloc(size + EVMEM_HDR);
    if (raw == NULL)
        return NULL;
    header_set(raw, c, size);
    return raw + EVMEM_HDR;
}

void evmem_free(void *p)
{
    if (p == NULL)
        return;
    uint8_t *raw = header_of(p);
    unsigned c = raw[0];
    if (c != EVMEM_NONE && !cache.closed &&
        (size_t)(cache.n[c] + 1) * class_size(c) <= EVMEM_CLASS_BUDGET) {
        struct evmem_free_block *b = p;
        b->next = cache.free[c];
        cache.free[c] = b;
        cache.n[c]++;
        EVMEM_POISON((uint8_t *)p + sizeof(*b), class_size(c) - sizeof(*b));
        return;
    }
    free(raw);
}

void *evmem_realloc(void *p, size_t size)
{
    if (p == NULL)
        return evmem_malloc(size);
    unsigned c = header_of(p)[0];
    if (c == EVMEM_NONE && class_of(size) == EVMEM_NONE) {
        /* Arrays libevent grows (its fd map, change lists): malloc's own realloc. */
        if (size > SIZE_MAX - EVMEM_HDR)
            return NULL;
        uint8_t *raw = realloc(header_of(p), size + EVMEM_HDR);
        if (raw == NULL)
            return NULL;
        header_set(raw, EVMEM_NONE, size);
        return raw + EVMEM_HDR;
    }
    if (c != EVMEM_NONE && size <= class_size(c))
        return p; /* it fits where it is */
    /* Into or out of a class: a new block, then the old one goes. */
    void *q = evmem_malloc(size);
    if (q == NULL)
        return NULL;
    size_t old = usable(p);
    memcpy(q, p, old < size ? old : size);
    evmem_free(p);
    return q;
}

void evmem_drain(void)
{
    cache.closed = true;
    for (unsigned c = 0; c < EVMEM_CLASSES; c++) {
        while (cache.free[c] != NULL) {
            struct evmem_free_block *b = cache.free[c];
            cache.free[c] = b->next;
            EVMEM_UNPOISON(b, class_size(c));
            free(header_of(b));
        }
        cache.n[c] = 0;
    }
}

size_t evmem_cached(void)
{
    size_t n = 0;
    for (unsigned c = 0; c < EVMEM_CLASSES; c++)
        n += cache.n[c];
    return n;
}

void evmem_install(void)
{
    event_set_mem_functions(evmem_malloc, evmem_realloc, evmem_free);
}
