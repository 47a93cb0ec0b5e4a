/*
 * blockcache.h - libevent's memory, and session.c's read blocks, from a per-thread cache of
 * chain-sized blocks.
 *
 * Relayed bytes live in evbuffer chains that libevent allocates per read and frees per
 * write: a small read, read into a 16 KiB block of this cache and handed on by reference,
 * still costs a 1 KiB chain header, and a burst of reads on one loop turn (epoll returning 50
 * sockets) outruns glibc's thread cache of 7 blocks per size, so most of them went through
 * malloc's slow path and back.  blockcache_install() gives libevent allocation functions that keep
 * freed blocks of the chain sizes (powers of two from 1 KiB to 16 KiB) in a per-thread LIFO,
 * up to a budget per size, and hand them out again; every other size goes to malloc.  Each
 * block carries a 16-byte header with its size class, so free needs no size.
 */
#ifndef TWICE_BLOCKCACHE_H
#define TWICE_BLOCKCACHE_H

#include <stddef.h>

/* Routes libevent's allocations through the block cache; before any libevent call that allocates.
 */
void blockcache_install(void);

/* The allocation functions themselves (tests; libevent calls them once installed). */
void *blockcache_malloc(size_t size);
void *blockcache_realloc(void *p, size_t size);
void blockcache_free(void *p);

/* Frees the calling thread's cache and stops it caching: at the end of a thread that
 * allocated through it (a loop's, then the main thread's after the last session); blocks
 * freed later on that thread go straight back to malloc. */
void blockcache_drain(void);

/* Blocks the calling thread's cache holds (tests). */
size_t blockcache_cached(void);

#endif
