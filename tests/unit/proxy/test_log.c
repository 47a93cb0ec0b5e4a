/*
 * test_log.c - logfmt lines: quoting, levels, truncation, the repeat limit.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/util.h>

#include "proxy/core/log.h"

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

/* The repeat limit's clock, moved by the tests. */
static uint64_t fake_now;

static uint64_t fake_clock(void)
{
    return fake_now;
}

/* What the logger writes to stderr goes to a temporary file while captured. */
struct capture {
    FILE *file;
    int saved;
};

static void capture_start(struct capture *c)
{
    c->file = tmpfile();
    assert_non_null(c->file);
    c->saved = dup(STDERR_FILENO);
    assert_true(c->saved >= 0);
    assert_true(dup2(fileno(c->file), STDERR_FILENO) >= 0);
}

/* Stop capturing; returns the lines written meanwhile (NUL-terminated
 * text, the caller frees it). */
static char *capture_end(struct capture *c)
{
    assert_true(dup2(c->saved, STDERR_FILENO) >= 0);
    close(c->saved);
    assert_int_equal(fseek(c->file, 0, SEEK_END), 0);
    long n = ftell(c->file);
    assert_true(n >= 0);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    rewind(c->file);
    assert_int_equal(fread(text, 1, (size_t)n, c->file), (size_t)n);
    fclose(c->file);
    return text;
}

static size_t count_lines(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = text; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);
        char line[LOG_LINE_MAX + 128];
        snprintf(line, sizeof(line), "%.*s", (int)len, p);
        if (needle == NULL || strstr(line, needle) != NULL)
            n++;
        p += len + (nl != NULL);
    }
    return n;
}

/* The events the lines containing `needle` stand for: N for a line with
 * `repeated=N`, 1 for the others. */
static unsigned long long count_events(const char *text, const char *needle)
{
    unsigned long long n = 0;
    for (const char *p = text; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);
        char line[LOG_LINE_MAX + 128];
        snprintf(line, sizeof(line), "%.*s", (int)len, p);
        if (strstr(line, needle) != NULL) {
            const char *r = strstr(line, " repeated=");
            n += r != NULL ? strtoull(r + 10, NULL, 10) : 1;
        }
        p += len + (nl != NULL);
    }
    return n;
}

/* A warning as a session logs it: same msg and listener, its own sid and peer. */
static void warn_attempt(const char *listener, unsigned i)
{
    struct log_line line;
    log_begin(&line, LOG_WARN, "upstream connect failed");
    log_u64(&line, "sid", i);
    log_str(&line, "listener", listener);
    log_fmt(&line, "client", "127.0.0.1:%u", 40000 + i);
    log_str(&line, "error", "Connection refused");
    log_end(&line);
}

static int repeat_setup(void **state)
{
    (void)state;
    log_set_level(LOG_DEBUG);
    log_set_clock(fake_clock);
    /* Every key's interval from an earlier test is over. */
    fake_now += 100 * LOG_REPEAT_INTERVAL_MS;
    log_repeat_flush(1);
    return 0;
}

static int repeat_teardown(void **state)
{
    (void)state;
    log_set_clock(NULL);
    return 0;
}

static void test_repeats_held_back_and_counted(void **state)
{
    (void)state;
    struct capture c;
    capture_start(&c);
    for (unsigned i = 0; i < 1000; i++)
        warn_attempt("redis", i);
    log_repeat_flush(0); /* the interval is not over: nothing yet */
    fake_now += LOG_REPEAT_INTERVAL_MS;
    log_repeat_flush(0);
    char *text = capture_end(&c);
    assert_int_equal(count_lines(text, NULL), LOG_REPEAT_BURST + 1);
    assert_int_equal(count_lines(text, " repeated="), 1);
    assert_int_equal(count_events(text, "upstream connect failed"), 1000);
    /* The count line is the last attempt held back, with its own fields. */
    assert_non_null(strstr(text, "level=warn msg=\"upstream connect failed\" sid=999 "
                                 "listener=redis client=127.0.0.1:40999 "
                                 "error=\"Connection refused\" repeated=980\n"));
    free(text);
}

static void test_repeats_keyed_by_msg_listener_reason(void **state)
{
    (void)state;
    struct capture c;
    capture_start(&c);
    for (unsigned i = 0; i < 100; i++) {
        warn_attempt("a", i);
        warn_attempt("b", i);
        log_msg(LOG_WARN, "accept failed", "listener=a error=\"Too many open files\"");
        struct log_line line;
        log_begin(&line, LOG_INFO, "session closed");
        log_repeat_limit(&line, 1);
        log_u64(&line, "sid", i);
        log_str(&line, "listener", "a");
        log_str(&line, "reason", i % 2 ? "upstream_connect_failed" : "resolve_failed");
        log_end(&line);
    }
    fake_now += LOG_REPEAT_INTERVAL_MS;
    log_repeat_flush(0);
    char *text = capture_end(&c);
    /* Five keys, each its burst and one count line. */
    assert_int_equal(count_lines(text, NULL), 5 * (LOG_REPEAT_BURST + 1));
    assert_int_equal(count_events(text, "listener=a client="), 100);
    assert_int_equal(count_events(text, "listener=b client="), 100);
    assert_int_equal(count_events(text, "msg=\"accept failed\""), 100);
    assert_int_equal(count_events(text, "reason=upstream_connect_failed"), 50);
    assert_int_equal(count_events(text, "reason=resolve_failed"), 50);
    free(text);
}

static void test_unlimited_lines_always_written(void **state)
{
    (void)state;
    struct capture c;
    capture_start(&c);
    for (unsigned i = 0; i < 100; i++) {
        log_msg(LOG_INFO, "session closed", "sid=%u listener=a reason=client_closed", i);
        struct log_line line;
        log_begin(&line, LOG_ERROR, "config");
        log_repeat_limit(&line, 0);
        log_fmt(&line, "at", "file:%u:1", i);
        log_end(&line);
    }
    char *text = capture_end(&c);
    assert_int_equal(count_lines(text, NULL), 200);
    assert_int_equal(count_lines(text, " repeated="), 0);
    free(text);
}

static void test_next_interval_writes_again(void **state)
{
    (void)state;
    struct capture c;
    capture_start(&c);
    for (unsigned i = 0; i < 30; i++)
        warn_attempt("c", i);
    /* No flush: the first line of the next interval brings the count first. */
    fake_now += LOG_REPEAT_INTERVAL_MS;
    for (unsigned i = 30; i < 60; i++)
        warn_attempt("c", i);
    log_repeat_flush(1); /* as at exit: whatever the interval */
    char *text = capture_end(&c);
    assert_int_equal(count_lines(text, NULL), 2 * (LOG_REPEAT_BURST + 1));
    assert_int_equal(count_events(text, "listener=c"), 60);
    const char *first = strstr(text, " repeated=10\n");
    assert_non_null(first);
    assert_non_null(strstr(first, "sid=30 "));
    free(text);
}

#define STORM_THREADS 4
#define STORM_LINES 5000

static void *storm(void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < STORM_LINES; i++)
        warn_attempt("storm", i);
    return NULL;
}

static void test_threads_lose_no_count(void **state)
{
    (void)state;
    struct capture c;
    capture_start(&c);
    pthread_t t[STORM_THREADS];
    for (int i = 0; i < STORM_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, storm, NULL), 0);
    for (int i = 0; i < STORM_THREADS; i++)
        pthread_join(t[i], NULL);
    log_repeat_flush(1);
    char *text = capture_end(&c);
    assert_int_equal(count_lines(text, NULL), LOG_REPEAT_BURST + 1);
    assert_int_equal(count_events(text, "listener=storm"), STORM_THREADS * STORM_LINES);
    free(text);
}

static void test_libevent_warnings_are_lines(void **state)
{
    (void)state;
    log_libevent_install();
    struct capture c;
    capture_start(&c);
    /* libevent warns "fcntl(-1, F_GETFL): Bad file descriptor" each time. */
    for (int i = 0; i < 100; i++)
        assert_int_equal(evutil_make_socket_nonblocking(-1), -1);
    log_repeat_flush(1);
    char *text = capture_end(&c);
    assert_null(strstr(text, "[warn]"));
    assert_int_equal(count_lines(text, NULL), LOG_REPEAT_BURST + 1);
    assert_int_equal(count_lines(text, " level=warn msg=libevent detail=\"fcntl(-1, F_GETFL): "),
                     LOG_REPEAT_BURST + 1);
    assert_int_equal(count_events(text, "msg=libevent"), 100);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_values_are_bare),
        cmocka_unit_test(test_values_needing_quotes),
        cmocka_unit_test(test_timestamp_shape),
        cmocka_unit_test(test_long_line_is_cut_and_marked),
        cmocka_unit_test(test_levels),
        cmocka_unit_test_setup_teardown(test_repeats_held_back_and_counted, repeat_setup,
                                        repeat_teardown),
        cmocka_unit_test_setup_teardown(test_repeats_keyed_by_msg_listener_reason, repeat_setup,
                                        repeat_teardown),
        cmocka_unit_test_setup_teardown(test_unlimited_lines_always_written, repeat_setup,
                                        repeat_teardown),
        cmocka_unit_test_setup_teardown(test_next_interval_writes_again, repeat_setup,
                                        repeat_teardown),
        cmocka_unit_test_setup_teardown(test_threads_lose_no_count, repeat_setup, repeat_teardown),
        cmocka_unit_test_setup_teardown(test_libevent_warnings_are_lines, repeat_setup,
                                        repeat_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
