/*
 * test_codec.c - what the codecs share: the identity of a message without an id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/codec.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anon_id_matches_snprintf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
