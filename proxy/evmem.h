/*
 * evmem.h - libevent's memory, with a per-thread cache of its chain-sized blocks.
 *
 * Relayed bytes live in evbuffer chains that libevent allocates per read and frees per
 * write: a small read handed on by reference (session.c's read pool) still costs a 1 KiB
 * chain header, and a burst of reads on one loop turn (epoll returning 50 sockets) outruns
 * glibc's thread cache of 7 blocks per size, so most of them went through malloc's slow path
 * and back.  evmem_install() gives libevent allocation functions that keep freed blocks of
 * the chain sizes (powers of two from 1 KiB to 16 KiB) in a per-thread LIFO, up to a budget
 * per size, and hand them out again; every other size goes to malloc.  Each block carries a
 * 16-byte header with its size class, so free needs no size.
 */
#ifndef TWICE_EVMEM_H
#define TWICE_EVMEM_H

#include <stddef.h>

/* Routes libevent's allocations through evmem; before any libevent call that allocates. */
void evmem_install(void);

/* The allocation functions themselves (tests; libevent calls them once installed). */
void *evmem_malloc(size_t size);
void *evmem_realloc(void *p, size_t size);
void evmem_free(void *p);

/* Frees the calling thread's cache and stops it caching: at the end of a thread that
 * allocated through libevent (a loop's, then the main thread's after the last session). */
void evmem_drain(void);

/* Blocks the calling thread's cache holds (tests). */
size_t evmem_cached(void);

#endif
