/*
 * test_toxic_stream.c - unit tests of Toxiproxy's stream toxics read from JSON
 * (rules/toxic_stream.h): every type by its name and none other, each type's attributes in
 * Toxiproxy's order with the missing ones 0, an update keeping what its body leaves out, and
 * the words of Toxiproxy's error for an attribute that is not an integer; and the slicer's pieces:
 * Toxiproxy's halving (100 bytes at average 10 are 16 pieces of 6 or 7), the same pieces as a
 * recursive statement of it with the same random numbers, and its bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "rules/toxic_stream.h"

#include <stdlib.h>
#include <string.h>

/* The toxic of `type` read from `attrs` (JSON text, NULL: none) over `base`, as JSON text. */
static char *read_dump(const char *type, const char *attrs, const struct toxic_stream *base,
                       struct toxic_stream *out)
{
    enum toxic_kind k;
    assert_int_equal(toxic_stream_kind(type, &k), 0);
    json_t *j = attrs != NULL ? json_loads(attrs, 0, NULL) : NULL;
    char err[256];
    assert_int_equal(toxic_stream_read(k, j, base, out, err, sizeof(err)), 0);
    json_decref(j);
    json_t *o = toxic_stream_json(out);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

static void want(const char *type, const char *attrs, const char *expect)
{
    struct toxic_stream t;
    char *text = read_dump(type, attrs, NULL, &t);
    assert_string_equal(text, expect);
    assert_string_equal(toxic_stream_type(t.kind), type);
    free(text);
}

static void test_types(void **state)
{
    (void)state;
    want("latency", "{\"latency\":1000,\"jitter\":50}", "{\"latency\":1000,\"jitter\":50}");
    want("latency", "{\"latency\":100}", "{\"latency\":100,\"jitter\":0}");
    want("bandwidth", "{\"rate\":64}", "{\"rate\":64}");
    want("slow_close", "{\"delay\":500}", "{\"delay\":500}");
    want("timeout", NULL, "{\"timeout\":0}");
    want("reset_peer", "{\"timeout\":20}", "{\"timeout\":20}");
    want("slicer", "{\"average_size\":8,\"size_variation\":2,\"delay\":10}",
         "{\"average_size\":8,\"size_variation\":2,\"delay\":10}");
    want("limit_data", "{\"bytes\":30,\"other\":\"ignored\"}", "{\"bytes\":30}");
    want("noop", "{\"x\":1}", "{}");
    /* Go's decoder takes a member whose name differs only in case */
    want("latency", "{\"Latency\":7}", "{\"latency\":7,\"jitter\":0}");
    /* 1e3 is an integer to Go's decoder too */
    want("latency", "{\"latency\":1e3}", "{\"latency\":1000,\"jitter\":0}");
    enum toxic_kind k;
    assert_int_equal(toxic_stream_kind("Latency", &k), -1);
    assert_int_equal(toxic_stream_kind("duplicate", &k), -1);
    assert_int_equal(toxic_stream_kind("", &k), -1);
    assert_int_equal(toxic_stream_kind(NULL, &k), -1);
}

static void test_update_keeps(void **state)
{
    (void)state;
    struct toxic_stream base, t;
    free(read_dump("latency", "{\"latency\":100,\"jitter\":5}", NULL, &base));
    char *text = read_dump("latency", "{\"jitter\":9}", &base, &t);
    assert_string_equal(text, "{\"latency\":100,\"jitter\":9}");
    free(text);
    text = read_dump("latency", "{\"latency\":null}", &base, &t);
    assert_string_equal(text, "{\"latency\":100,\"jitter\":5}");
    free(text);
}

static void test_wrong_types(void **state)
{
    (void)state;
    const struct {
        const char *type, *attrs, *err;
    } cases[] = {
        {"latency", "{\"latency\":\"x\"}",
         "bad request body: json: cannot unmarshal string into Go struct field "
         "LatencyToxic.attributes.latency of type int64"},
        {"bandwidth", "{\"rate\":1.5}",
         "bad request body: json: cannot unmarshal number 1.5 into Go struct field "
         "BandwidthToxic.attributes.rate of type int64"},
        {"slicer", "{\"delay\":true}",
         "bad request body: json: cannot unmarshal bool into Go struct field "
         "SlicerToxic.attributes.delay of type int"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum toxic_kind k;
        assert_int_equal(toxic_stream_kind(cases[i].type, &k), 0);
        json_t *j = json_loads(cases[i].attrs, 0, NULL);
        struct toxic_stream t;
        char err[256] = "";
        assert_int_equal(toxic_stream_read(k, j, NULL, &t, err, sizeof(err)), -1);
        assert_string_equal(err, cases[i].err);
        json_decref(j);
    }
}

/* A deterministic stand-in for the shaper's generator (xorshift64). */
static uint64_t draw(void *arg)
{
    uint64_t *x = arg;
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Every piece of one chunk of `len` bytes, in order, into out[]; returns how many. */
static size_t slice_all(struct toxic_slicer *sl, uint64_t len, uint64_t *rng, uint64_t *out,
                        size_t cap)
{
    size_t n = 0;
    do {
        assert_true(n < cap);
        out[n] = toxic_slicer_next(sl, len, draw, rng);
        toxic_slicer_took(sl, out[n]);
        n++;
    } while (toxic_slicer_busy(sl));
    return n;
}

/* Toxiproxy's chunk() as its comment states it, recursively: the pieces of [start, end). */
static void halve(uint64_t len, uint64_t avg, uint64_t var, uint64_t *rng, uint64_t *out, size_t *n)
{
    if (len <= avg + var) {
        out[(*n)++] = len;
        return;
    }
    uint64_t mid = len / 2;
    if (var != 0)
        mid = mid + draw(rng) % (2 * var) - var;
    halve(mid, avg, var, rng, out, n);
    halve(len - mid, avg, var, rng, out, n);
}

static void test_slicer_halves(void **state)
{
    (void)state;
    struct toxic_slicer sl;
    uint64_t rng = 1, got[4096];
    toxic_slicer_init(&sl, 10, 0);
    /* 100 -> 50 50 -> 25 25 25 25 -> 12 13 ... -> 6 6 6 7 four times */
    size_t n = slice_all(&sl, 100, &rng, got, 4096);
    assert_int_equal(n, 16);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], i % 4 == 3 ? 7 : 6);
    /* a chunk no larger than average + variation goes whole */
    assert_int_equal(slice_all(&sl, 10, &rng, got, 4096), 1);
    assert_int_equal(got[0], 10);
    toxic_slicer_init(&sl, 10, 5);
    assert_int_equal(slice_all(&sl, 15, &rng, got, 4096), 1);
    assert_int_equal(got[0], 15);
    /* part of a piece taken: the rest of it comes next, then the next piece */
    toxic_slicer_init(&sl, 10, 0);
    assert_int_equal(toxic_slicer_next(&sl, 100, draw, &rng), 6);
    toxic_slicer_took(&sl, 2);
    assert_int_equal(toxic_slicer_next(&sl, 100, draw, &rng), 4);
    toxic_slicer_took(&sl, 4);
    assert_int_equal(toxic_slicer_next(&sl, 100, draw, &rng), 6);
}

static void test_slicer_variation(void **state)
{
    (void)state;
    const struct {
        int64_t avg, var;
        uint64_t len;
    } cases[] = {{10, 5, 1000}, {10, 9, 4096}, {100, 30, 32768}, {3, 1, 777}, {1, 0, 50}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        static uint64_t got[40000], ref[40000];
        uint64_t rng = 42 + c, rng_ref = 42 + c;
        struct toxic_slicer sl;
        toxic_slicer_init(&sl, cases[c].avg, cases[c].var);
        size_t n = slice_all(&sl, cases[c].len, &rng, got, 40000), m = 0;
        halve(cases[c].len, (uint64_t)cases[c].avg, (uint64_t)cases[c].var, &rng_ref, ref, &m);
        assert_int_equal(n, m);
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(got[i], ref[i]);
            assert_true(got[i] >= 1 && got[i] <= (uint64_t)(cases[c].avg + cases[c].var));
            /* a cut piece is more than half of average + V, less V */
            if (n > 1)
                assert_true(got[i] * 2 + 2 * (uint64_t)cases[c].var > (uint64_t)cases[c].avg);
            sum += got[i];
        }
        assert_int_equal(sum, cases[c].len);
    }
}

static void test_slicer_bounds(void **state)
{
    (void)state;
    struct toxic_slicer sl;
    uint64_t rng = 7, got[64];
    /* average 0 counts as 1: one byte at a time */
    toxic_slicer_init(&sl, 0, 0);
    assert_int_equal(slice_all(&sl, 5, &rng, got, 64), 5);
    assert_int_equal(got[4], 1);
    /* a variation of at least the average counts as average - 1: cuts stay inside */
    toxic_slicer_init(&sl, 4, 9);
    uint64_t sum = 0;
    size_t n = slice_all(&sl, 60, &rng, got, 64);
    for (size_t i = 0; i < n; i++) {
        assert_true(got[i] >= 1 && got[i] <= 7);
        sum += got[i];
    }
    assert_int_equal(sum, 60);
    /* a huge chunk at average 1: the first piece without a deep stack */
    toxic_slicer_init(&sl, 1, 0);
    assert_int_equal(toxic_slicer_next(&sl, UINT64_MAX, draw, &rng), 1);
    assert_true(sl.depth <= 66);
    toxic_slicer_init(&sl, 2, 1);
    assert_int_equal(toxic_slicer_next(&sl, UINT64_MAX, draw, &rng) <= 3, 1);
    assert_true(sl.depth <= 66);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_update_keeps),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_slicer_halves),
        cmocka_unit_test(test_slicer_variation),
        cmocka_unit_test(test_slicer_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
