/*
 * test_toxic_stream.c - unit tests of Toxiproxy's stream toxics read from JSON
 * (rules/toxic_stream.h): every type by its name and none other, each type's attributes in
 * Toxiproxy's order with the missing ones 0, an update keeping what its body leaves out, and
 * the words of Toxiproxy's error for an attribute that is not an integer.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_update_keeps),
        cmocka_unit_test(test_wrong_types),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
