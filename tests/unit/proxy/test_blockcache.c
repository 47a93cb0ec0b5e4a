/*
 * test_blockcache.c - libevent's allocation functions with a cache of chain-sized blocks: blocks
 * come back, contents survive a realloc across classes, the cache keeps to its budget and
 * stops at a drain, and an evbuffer works on top of it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>

#include "proxy/net/blockcache.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 7);
}

static void check_fill(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p[i], (uint8_t)(seed + i * 7));
}

/* A freed 1 KiB block (the size of a reference chain) is the next one handed out. */
static void test_chain_block_reused(void **state)
{
    (void)state;
    size_t before = blockcache_cached();
    void *a = blockcache_malloc(1024);
    assert_non_null(a);
    fill(a, 1024, 1);
    blockcache_free(a);
    assert_int_equal(blockcache_cached(), before + 1);
#if defined(__SANITIZE_ADDRESS__)
    /* Waiting in the cache, all of it is out of bounds: a use after libevent's free is caught. */
    assert_true(__asan_address_is_poisoned(a));
    assert_true(__asan_address_is_poisoned((uint8_t *)a + 1023));
#endif
    void *b = blockcache_malloc(1024);
    assert_ptr_equal(b, a);
    assert_int_equal(blockcache_cached(), before);
    fill(b, 1024, 2); /* all of it is usable */
    check_fill(b, 1024, 2);
    blockcache_free(b);
}

/* Other sizes (an evbuffer, an event, 3 KiB, 32 KiB) go to malloc and back. */
static void test_other_sizes_not_cached(void **state)
{
    (void)state;
    size_t before = blockcache_cached();
    size_t sizes[] = {1, 100, 1023, 1025, 3000, 32768, 0};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint8_t *p = blockcache_malloc(sizes[i]);
        assert_non_null(p);
        fill(p, sizes[i], 3);
        assert_int_equal((uintptr_t)p % 16, 0);
        blockcache_free(p);
        assert_int_equal(blockcache_cached(), before);
    }
    blockcache_free(NULL);
}

/* realloc keeps the bytes, growing from malloc's sizes into a class and out of it again, and
 * shrinking. */
static void test_realloc_keeps_contents(void **state)
{
    (void)state;
    uint8_t *p = blockcache_realloc(NULL, 40);
    fill(p, 40, 4);
    p = blockcache_realloc(p, 4096); /* into the 4 KiB class */
    check_fill(p, 40, 4);
    fill(p, 4096, 5);
    p = blockcache_realloc(p, 3000); /* fits where it is */
    check_fill(p, 3000, 5);
    p = blockcache_realloc(p, 100000); /* out of the classes */
    check_fill(p, 3000, 5);
    fill(p, 100000, 6);
    p = blockcache_realloc(p, 200000);
    check_fill(p, 100000, 6);
    p = blockcache_realloc(p, 2048); /* back into a class: the first 2 KiB */
    check_fill(p, 2048, 6);
    p = blockcache_realloc(p, 10);
    check_fill(p, 10, 6);
    blockcache_free(p);
    /* As realloc: a size of 0 frees, from a class or not. */
    assert_null(blockcache_realloc(blockcache_malloc(1024), 0));
    assert_null(blockcache_realloc(blockcache_malloc(77), 0));
}

/* Past 256 KiB of free blocks of one size (1 MiB of 16 KiB blocks), frees go to malloc. */
static void test_budget(void **state)
{
    (void)state;
    enum { N = 300 };
    void *v[N];
    for (size_t i = 0; i < N; i++) /* takes whatever the class held */
        assert_non_null(v[i] = blockcache_malloc(1024));
    size_t mid = blockcache_cached();
    for (size_t i = 0; i < N; i++)
        blockcache_free(v[i]);
    assert_int_equal(blockcache_cached(), mid + 256);
    /* 1 MiB of the 16 KiB blocks session.c reads into. */
    for (size_t i = 0; i < 80; i++)
        assert_non_null(v[i] = blockcache_malloc(16384));
    mid = blockcache_cached();
    for (size_t i = 0; i < 80; i++)
        blockcache_free(v[i]);
    assert_int_equal(blockcache_cached(), mid + 64);
}

/* An evbuffer moving a reference and bytes through chains built by the block cache. */
static void test_evbuffer_on_top(void **state)
{
    (void)state;
    static uint8_t data[5000];
    fill(data, sizeof(data), 9);
    for (int round = 0; round < 50; round++) {
        struct evbuffer *a = evbuffer_new(), *b = evbuffer_new();
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(evbuffer_add_reference(a, data, 100, NULL, NULL), 0);
        assert_int_equal(evbuffer_add(a, data + 100, sizeof(data) - 100), 0);
        assert_int_equal(evbuffer_add_buffer(b, a), 0);
        assert_int_equal(evbuffer_get_length(b), sizeof(data));
        check_fill(evbuffer_pullup(b, -1), sizeof(data), 9);
        evbuffer_drain(b, 4000);
        evbuffer_free(a);
        evbuffer_free(b);
    }
}

static void *thread_frees(void *arg)
{
    blockcache_free(arg); /* joins this thread's cache */
    size_t n = blockcache_cached();
    blockcache_drain(); /* given back to malloc as the thread ends */
    return (void *)n;
}

/* A block freed on another thread goes to that thread's cache; a drained thread caches
 * nothing more. */
static void test_other_thread_and_drain(void **state)
{
    (void)state;
    void *p = blockcache_malloc(2048);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_frees, p), 0);
    void *n;
    assert_int_equal(pthread_join(t, &n), 0);
    assert_int_equal((size_t)n, 1);
    blockcache_drain();
    assert_int_equal(blockcache_cached(), 0);
    void *q = blockcache_malloc(1024);
    blockcache_free(q);
    assert_int_equal(blockcache_cached(), 0);
}

int main(void)
{
    /* As twice does, before libevent allocates anything. */
    blockcache_install();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_block_reused),
        cmocka_unit_test(test_other_sizes_not_cached),
        cmocka_unit_test(test_realloc_keeps_contents),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_evbuffer_on_top),
        cmocka_unit_test(test_other_thread_and_drain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
