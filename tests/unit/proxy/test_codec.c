/*
 * test_codec.c - what the codecs share: the identity of a message without an
 * id, and moving a read's head on without copying it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <stdlib.h>

#include "proxy/net/codec.h"

/* codec_anon_id writes what snprintf("%s:%llu:%llu...") would, cut the same way. */
static void check(const char *prefix, const uint64_t *v, size_t n)
{
    char want[128], got[128];
    int len = snprintf(want, sizeof(want), "%s", prefix);
    for (size_t i = 0; i < n; i++)
        len += snprintf(want + len, sizeof(want) - (size_t)len, ":%llu", (unsigned long long)v[i]);
    for (size_t cap = 0; cap <= (size_t)len + 2; cap++) {
        memset(got, 'x', sizeof(got));
        const char *r = codec_anon_id(got, cap, prefix, v, n);
        assert_ptr_equal(r, got);
        if (cap == 0) {
            assert_int_equal(got[0], 'x'); /* nothing written */
            continue;
        }
        char cut[128];
        snprintf(cut, cap, "%s", want);
        assert_string_equal(got, cut);
    }
}

static void test_anon_id_matches_snprintf(void **state)
{
    (void)state;
    check("anon", (const uint64_t[]){0, 0}, 2);
    check("anon", (const uint64_t[]){42, 7}, 2);
    check("cmd", (const uint64_t[]){UINT64_MAX, 10, 9}, 3);
    check("anon", (const uint64_t[]){1, 65535, 18446744073709551615ull}, 3);
    check("", (const uint64_t[]){100}, 1);
    check("p", NULL, 0);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t v[3] = {x >> (i % 64), x % 1000, (uint64_t)i};
        check("anon", v, 3);
    }
}

/* An evbuffer holding data in k chains of the given sizes, as reads leave
 * it (each chain with room after its bytes). */
static struct evbuffer *chained(const uint8_t *data, const size_t *sizes, size_t k)
{
    struct evbuffer *in = evbuffer_new();
    assert_non_null(in);
    size_t off = 0;
    for (size_t i = 0; i < k; i++) {
        struct evbuffer *t = evbuffer_new();
        assert_non_null(t);
        assert_int_equal(evbuffer_expand(t, sizes[i] + 512), 0);
        assert_int_equal(evbuffer_add(t, data + off, sizes[i]), 0);
        assert_int_equal(evbuffer_add_buffer(in, t), 0);
        evbuffer_free(t);
        off += sizes[i];
    }
    assert_int_equal(evbuffer_peek(in, -1, NULL, NULL, 0), (int)k);
    return in;
}

/* b holds exactly `want`, read without rearranging b (a pullup would copy
 * shared heads into a chain of its own and let their memory go). */
static void assert_holds(struct evbuffer *b, const uint8_t *want, size_t len)
{
    assert_int_equal(evbuffer_get_length(b), len);
    uint8_t *got = malloc(len + 1);
    assert_non_null(got);
    assert_int_equal(evbuffer_copyout(b, got, len), (ev_ssize_t)len);
    assert_memory_equal(got, want, len);
    free(got);
}

/* The first n bytes of data, laid out in chains of `sizes`, moved to an
 * evbuffer that already holds a few bytes. */
static void move_at(const uint8_t *data, const size_t *sizes, size_t k, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < k; i++)
        total += sizes[i];
    struct evbuffer *in = chained(data, sizes, k);
    struct evbuffer *out = evbuffer_new();
    assert_non_null(out);
    assert_int_equal(evbuffer_add(out, "out:", 4), 0);

    /* where the chain the n-th byte ends in begins, and how much of it is
     * moved: a head longer than CODEC_MOVE_COPY_MAX, and no shorter than
     * what stays behind, must not be copied */
    const uint8_t *split_base = NULL;
    size_t head = 0, before = 0;
    for (size_t i = 0; i < k && n > 0; i++) {
        if (before + sizes[i] > n) {
            struct evbuffer_ptr at;
            assert_int_equal(evbuffer_ptr_set(in, &at, before, EVBUFFER_PTR_SET), 0);
            struct evbuffer_iovec v;
            assert_true(evbuffer_peek(in, 1, &at, &v, 1) >= 1);
            split_base = v.iov_base;
            head = n - before;
            break;
        }
        before += sizes[i];
    }

    assert_int_equal(codec_move(in, out, n), 0);
    assert_int_equal(evbuffer_get_length(out), 4 + n);
    assert_int_equal(evbuffer_get_length(in), total - n);

    if (split_base != NULL && head > CODEC_MOVE_COPY_MAX && head >= total - n) {
        int m = evbuffer_peek(out, -1, NULL, NULL, 0);
        struct evbuffer_iovec *v = calloc((size_t)m, sizeof(*v));
        assert_non_null(v);
        assert_int_equal(evbuffer_peek(out, -1, NULL, v, m), m);
        assert_ptr_equal(v[m - 1].iov_base, split_base); /* shared, not copied */
        assert_int_equal(v[m - 1].iov_len, head);
        free(v);
    }

    /* What the codec and the next reads do to `in` must not reach what
     * `out` holds: bytes appended, the rest pulled up and overwritten in
     * place, `in` freed before `out` is written. */
    assert_int_equal(evbuffer_add(in, "more", 4), 0);
    uint8_t *rest = evbuffer_pullup(in, -1);
    assert_non_null(rest);
    assert_memory_equal(rest, data + n, total - n);
    memset(rest, 'X', total - n + 4);
    evbuffer_free(in);

    uint8_t *want = malloc(4 + n + 1);
    assert_non_null(want);
    memcpy(want, "out:", 4);
    memcpy(want + 4, data, n);
    assert_holds(out, want, 4 + n);
    free(want);
    evbuffer_free(out);
}

static void move_everywhere(const size_t *sizes, size_t k)
{
    size_t total = 0;
    for (size_t i = 0; i < k; i++)
        total += sizes[i];
    uint8_t *data = malloc(total);
    assert_non_null(data);
    for (size_t i = 0; i < total; i++)
        data[i] = (uint8_t)(i * 131 + (i >> 8));
    for (size_t n = 0; n <= total; n++)
        move_at(data, sizes, k, n);
    free(data);
}

/* Every cut of reads of various sizes: whole chains moved, heads of chains
 * copied or shared on either side of CODEC_MOVE_COPY_MAX. */
static void test_move_every_split(void **state)
{
    (void)state;
    move_everywhere((const size_t[]){6000, 1, 9000, 300, 5000}, 5);
    move_everywhere((const size_t[]){CODEC_MOVE_COPY_MAX + 1}, 1);
}

/* More chains than codec_move looks at in one go (16). */
static void test_move_many_chains(void **state)
{
    (void)state;
    size_t sizes[25];
    for (int i = 0; i < 24; i++)
        sizes[i] = 200;
    sizes[24] = 6000;
    move_everywhere(sizes, 25);
}

/* Asking for more than `in` holds moves nothing. */
static void test_move_too_much(void **state)
{
    (void)state;
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    assert_int_equal(evbuffer_add(in, "abc", 3), 0);
    assert_int_equal(codec_move(in, out, 4), -1);
    assert_int_equal(evbuffer_get_length(in), 3);
    assert_int_equal(evbuffer_get_length(out), 0);
    assert_int_equal(codec_move(in, out, 0), 0);
    evbuffer_free(in);
    evbuffer_free(out);
}

/* A shared head survives its chain's later moves: the rest of the chain is
 * moved on as well (a second codec_move), in a second buffer, and both are
 * freed in either order. */
static void test_move_twice_from_one_chain(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint8_t *data = malloc(N);
    assert_non_null(data);
    for (size_t i = 0; i < N; i++)
        data[i] = (uint8_t)(i * 7);
    /* 12,000 then 5,000 bytes shared (each no shorter than what stays), the
     * last 3,000 moved with the chain */
    uint8_t *want_a = malloc(15000);
    assert_non_null(want_a);
    memcpy(want_a, data, 12000);
    memcpy(want_a + 12000, data + 17000, 3000);
    for (int order = 0; order < 2; order++) {
        struct evbuffer *in = chained(data, (const size_t[]){N}, 1);
        struct evbuffer *a = evbuffer_new(), *b = evbuffer_new();
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(codec_move(in, a, 12000), 0);
        assert_int_equal(codec_move(in, b, 5000), 0);
        assert_int_equal(codec_move(in, a, 3000), 0);
        assert_int_equal(evbuffer_get_length(in), 0);
        evbuffer_free(in);
        assert_holds(a, want_a, 15000);
        assert_holds(b, data + 12000, 5000);
        if (order == 0) {
            evbuffer_free(a);
            assert_holds(b, data + 12000, 5000);
            evbuffer_free(b);
        } else {
            evbuffer_free(b);
            assert_holds(a, want_a, 15000);
            evbuffer_free(a);
        }
    }
    free(want_a);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anon_id_matches_snprintf),  cmocka_unit_test(test_move_every_split),
        cmocka_unit_test(test_move_many_chains),          cmocka_unit_test(test_move_too_much),
        cmocka_unit_test(test_move_twice_from_one_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
