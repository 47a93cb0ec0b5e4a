/*
 * test_log.c - logfmt lines: quoting, levels, truncation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/log.h"

/* The text after "ts=... " of a built line, without the newline. */
static const char *after_ts(struct log_line *line)
{
    line->buf[line->len] = '\0';
    const char *p = strchr(line->buf, ' ');
    assert_non_null(p);
    return p + 1;
}

static void test_plain_values_are_bare(void **state)
{
    (void)state;
    struct log_line line;
    log_begin(&line, LOG_INFO, "listening");
    log_str(&line, "listener", "redis");
    log_u64(&line, "sid", 42);
    log_i64(&line, "delta", -3);
    assert_string_equal(after_ts(&line), "level=info msg=listening listener=redis sid=42 delta=-3");
}

static void test_values_needing_quotes(void **state)
{
    (void)state;
    struct log_line line;
    log_begin(&line, LOG_WARN, "upstream connect failed");
    log_str(&line, "error", "Connection refused");
    log_str(&line, "q", "say \"hi\"\\");
    log_str(&line, "eq", "a=b");
    log_str(&line, "empty", "");
    log_str(&line, "null", NULL);
    log_str(&line, "ctl", "a\nb\x01");
    assert_string_equal(after_ts(&line),
                        "level=warn msg=\"upstream connect failed\" error=\"Connection refused\" "
                        "q=\"say \\\"hi\\\"\\\\\" eq=\"a=b\" empty=\"\" null=\"\" "
                        "ctl=\"a\\nb\\x01\"");
}

static void test_timestamp_shape(void **state)
{
    (void)state;
    struct log_line line;
    log_begin(&line, LOG_DEBUG, "x");
    line.buf[line.len] = '\0';
    /* ts=2026-11-29T09:00:00.123Z */
    assert_int_equal(strncmp(line.buf, "ts=", 3), 0);
    assert_int_equal(line.buf[3 + 10], 'T');
    assert_int_equal(line.buf[3 + 23], 'Z');
    assert_int_equal(line.buf[3 + 24], ' ');
}

static void test_long_line_is_cut_and_marked(void **state)
{
    (void)state;
    struct log_line line;
    char big[LOG_LINE_MAX * 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    log_begin(&line, LOG_INFO, "big");
    log_str(&line, "v", big);
    assert_true(line.truncated);
    assert_true(line.len < LOG_LINE_MAX);
}

static void test_levels(void **state)
{
    (void)state;
    log_set_level(LOG_WARN);
    assert_true(log_enabled(LOG_ERROR));
    assert_true(log_enabled(LOG_WARN));
    assert_false(log_enabled(LOG_INFO));
    assert_false(log_enabled(LOG_DEBUG));
    log_set_level(LOG_DEBUG);
    assert_true(log_enabled(LOG_DEBUG));
    assert_string_equal(log_level_name(LOG_INFO), "info");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_values_are_bare),
        cmocka_unit_test(test_values_needing_quotes),
        cmocka_unit_test(test_timestamp_shape),
        cmocka_unit_test(test_long_line_is_cut_and_marked),
        cmocka_unit_test(test_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
