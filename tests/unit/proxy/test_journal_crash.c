/*
 * test_journal_crash.c - what `twice report` and `twice verdict` say of a journal a crash or a
 * kill left behind, or that was damaged after: one that ends without its `stop` record, one cut
 * inside a record, one with a byte changed in the middle; and their exit codes.  The journals
 * are written by the real writer (proxy/core/journal.c), then cut or altered on disk.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "offline/journal_reader.h"
#include "offline/report.h"
#include "offline/verdict.h"
#include "proxy/core/journal.h"
#include "tests/lib/cmd_testkit.h"

#define T0_US 1764406800000000ull

/* Deliveries of messages m0..m(n-1), task "charge", each acked; a copy of m0 that a fault made
 * (so the verdict has something to stand on); the stop record when `stop`. */
static void write_run(const char *path, size_t n, bool stop)
{
    struct journal_header_info h = {.seed = 7, .config_path = "t.twice", .start_unix_ms = 1000};
    char err[256];
    struct journal *j = journal_open(path, &h, err, sizeof(err));
    if (j == NULL)
        fail_msg("journal_open: %s", err);
    uint64_t t = T0_US;
    for (size_t i = 0; i < n; i++) {
        char id[24]; /* "m" and a size_t */
        snprintf(id, sizeof(id), "m%zu", i);
        struct journal_record d = {.kind = JOURNAL_KIND_DELIVER,
                                   .time_unix_us = t += 1000,
                                   .session = 1,
                                   .listener = "amqp",
                                   .queue = "jobs",
                                   .task = "charge",
                                   .message_id = id,
                                   .delivery_tag = i + 1};
        journal_record(j, &d);
        struct journal_record a = d;
        a.kind = JOURNAL_KIND_ACK;
        a.time_unix_us = t += 1000;
        journal_record(j, &a);
        if (i == 0) {
            struct journal_record f = d;
            f.kind = JOURNAL_KIND_FAULT;
            f.rule = "lost-ack";
            f.action_name = "redeliver";
            f.event = 3;
            journal_record(j, &f);
            d.time_unix_us = t += 2000;
            d.redelivered = true;
            d.delivery_tag = 1000;
            journal_record(j, &d);
            a = d;
            a.kind = JOURNAL_KIND_ACK;
            a.time_unix_us = t += 1000;
            journal_record(j, &a);
        }
    }
    if (stop) {
        struct journal_record s = {.kind = JOURNAL_KIND_STOP, .time_unix_us = t += 1000};
        journal_record(j, &s);
    }
    journal_close(j);
}

static size_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (size_t)st.st_size;
}

static void assert_lacks(const char *haystack, const char *needle)
{
    if (strstr(haystack, needle) != NULL)
        fail_msg("did not expect\n  %s\nin\n%s", needle, haystack);
}

/* A run killed between two writes: every record is whole, but no stop record follows.  A
 * warning in the text and in the JSON, not an error: the exit codes are those of the run. */
static void test_no_clean_stop_is_a_warning(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 4, false);
    write_file(f->effects, "m0\nm1\nm2\nm3\n");
    const char *rep[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rep), 0);
    assert_contains(f->out, "warning: the journal ended without a clean stop (no stop record: "
                            "twice was killed or crashed)");
    assert_lacks(f->out, "cut short");
    const char *rjson[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, rjson), 0);
    assert_contains(f->out, "\"truncated\": false,\n  \"clean_stop\": false,\n");
    assert_contains(f->err, "twice report: warning: the journal ended without a clean stop\n");
    const char *ver[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, ver), 0);
    assert_contains(f->out, "warning: the journal ended without a clean stop");
    assert_contains(f->out, "\nverdict: IDEMPOTENT");
    const char *vjson[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, vjson), 0);
    assert_contains(f->out, "\"journal_truncated\": false,\n  \"journal_clean_stop\": false,\n");
    assert_contains(f->out, "\"verdict\": \"IDEMPOTENT\"");
    assert_contains(f->err, "twice verdict: warning: the journal ended without a clean stop\n");
}

/* The same run stopped in good order: no warning, and the JSON says so. */
static void test_clean_stop_says_nothing(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 4, true);
    write_file(f->effects, "m0\nm1\nm2\nm3\n");
    const char *rep[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rep), 0);
    assert_lacks(f->out, "clean stop");
    const char *rjson[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, rjson), 0);
    assert_contains(f->out, "\"clean_stop\": true,\n");
    assert_string_equal(f->err, "");
    const char *vjson[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, vjson), 0);
    assert_contains(f->out, "\"journal_clean_stop\": true,\n");
    assert_string_equal(f->err, "");
}

/* Killed while writing: the last record is cut short.  What came before is counted, both
 * warnings are given, and the exit code is that of the records read. */
static void test_cut_mid_record(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 4, true);
    assert_int_equal(truncate(f->journal, (off_t)file_size(f->journal) - 2), 0); /* the stop */
    write_file(f->effects, "m0\nm1\nm2\nm3\n");
    const char *rep[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rep), 0);
    assert_contains(f->out, "records   11 (deliver 5, ack 5, fault 1)");
    assert_contains(f->out, "warning: the last record is cut short");
    assert_contains(f->out, "warning: the journal ended without a clean stop");
    const char *ver[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, ver), 0);
    assert_contains(f->out, "journal's last record is cut short");
    assert_contains(f->out, "warning: the journal ended without a clean stop");
}

/* Where the i-th entry after the header starts, and its length. */
static void entry_span(const char *path, size_t i, size_t *off, size_t *len)
{
    char err[256];
    struct journal_reader *r = journal_reader_open(path, err, sizeof(err));
    assert_non_null(r);
    const Twice__Journal__Entry *e = NULL;
    *off = (size_t)journal_reader_offset(r);
    for (size_t k = 0; k <= i; k++) {
        *off = (size_t)journal_reader_offset(r);
        assert_int_equal(journal_reader_next(r, &e), 1);
    }
    *len = (size_t)journal_reader_offset(r) - *off;
    journal_reader_close(r);
}

static void flip_byte(const char *path, size_t at)
{
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, (long)at, SEEK_SET), 0);
    int c = fgetc(fp);
    assert_int_equal(fseek(fp, (long)at, SEEK_SET), 0);
    fputc(c ^ 0x04, fp);
    fclose(fp);
}

/* One byte changed in the middle (in m1's ack, the 7th record): everything before and after it
 * is read and reported, the damage named with its offset, its length and the one record lost.
 * The report exits 0; the verdict keeps its verdict, marked, and exits 6, unless
 * --allow-damaged. */
static void test_changed_byte_in_the_middle(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 4, true);
    size_t off = 0, len = 0;
    entry_span(f->journal, 6, &off, &len);
    flip_byte(f->journal, off + len / 2);
    write_file(f->effects, "m0\nm1\nm2\nm3\n");
    char line[256];
    snprintf(line, sizeof(line),
             "  at offset %zu: entry fails its checksum: %zu bytes skipped (1 record lost), read "
             "on from offset %zu\n",
             off, len, off + len);

    const char *rep[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rep), 0);
    assert_contains(f->out, "records   11 (deliver 5, ack 4, fault 1, stop 1)");
    assert_contains(f->out, "warning: the journal is damaged: 1 stretch, ");
    assert_contains(f->out, ", 1 record lost; the records around the damage are counted\n");
    assert_contains(f->out, line);
    assert_lacks(f->out, "clean stop");
    const char *rjson[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, rjson), 0);
    char json[256];
    snprintf(json, sizeof(json),
             "\"damage\": {\"stretches\": 1, \"bytes_skipped\": %zu, \"records_lost\": 1, "
             "\"records_lost_unknown\": false, \"checksums\": true, \"list\": [{\"offset\": "
             "%zu, \"bytes\": %zu, \"records_lost\": 1, \"reason\": \"entry fails its "
             "checksum\", \"read_on\": true}]},\n",
             len, off, len);
    assert_contains(f->out, json);
    assert_contains(f->err, "twice report: warning: the journal is damaged");

    const char *ver[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, ver), VERDICT_EXIT_DAMAGED);
    assert_contains(f->out, "error: the journal is damaged: 1 stretch, ");
    assert_contains(f->out, line);
    assert_contains(f->out, "  the verdict stands on the records read: exit 6 (--allow-damaged "
                            "accepts a damaged journal)\n");
    assert_contains(f->out, "\nverdict: IDEMPOTENT* (evidence missing for 1 task: see the lines "
                            "under the table) (on a damaged journal: see above)\n");
    const char *vjson[] = {"verdict", "--journal", f->journal, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, vjson), VERDICT_EXIT_DAMAGED);
    assert_contains(f->out, "\"journal_damaged\": true,\n  \"allow_damaged\": false,\n");
    assert_contains(f->out, "\"verdict\": \"IDEMPOTENT\"");
    assert_contains(f->out, "\"journal_damage\": {\"stretches\": 1, ");
    assert_contains(f->err, "twice verdict: error: the journal is damaged (");
    assert_contains(f->err, "bytes skipped): exit 6 unless --allow-damaged\n");

    const char *allow[] = {"verdict",   "--journal", f->journal,
                           "--effects", f->effects,  "--allow-damaged"};
    assert_int_equal(run(f, verdict_run, 6, allow), 0);
    assert_contains(f->out, "warning: the journal is damaged: 1 stretch, ");
    assert_contains(f->out, "  the verdict stands on the records read (--allow-damaged)\n");
    assert_contains(f->out, "(on a damaged journal: see above)\n");
}

/* A side effect done twice is so whatever the damage: NOT IDEMPOTENT's exit code comes first;
 * evidence short of --require, which the lost records may explain, comes after the damage's. */
static void test_damage_and_the_other_exit_codes(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 4, true);
    size_t off = 0, len = 0;
    entry_span(f->journal, 6, &off, &len);
    flip_byte(f->journal, off + 1);
    write_file(f->effects, "m0\nm0\nm1\nm2\nm3\n");
    const char *ver[] = {"verdict", "--journal", f->journal, "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 5, ver), VERDICT_EXIT_NOT_IDEMPOTENT);
    assert_contains(f->out, "\nverdict: NOT IDEMPOTENT (on a damaged journal: see above)\n");
    write_file(f->effects, "m0\nm1\nm2\nm3\n");
    const char *req[] = {"verdict",   "--journal", f->journal,
                         "--effects", f->effects,  "--require=overlap"};
    assert_int_equal(run(f, verdict_run, 6, req), VERDICT_EXIT_DAMAGED);
    const char *both[] = {"verdict",  "--journal",         f->journal,       "--effects",
                          f->effects, "--require=overlap", "--allow-damaged"};
    assert_int_equal(run(f, verdict_run, 7, both), VERDICT_EXIT_UNTESTED);
}

/* Damage and no stop record: the lost end and the damage are both said. */
static void test_damage_in_a_killed_run(void **state)
{
    struct fixture *f = *state;
    write_run(f->journal, 3, false);
    size_t off = 0, len = 0;
    entry_span(f->journal, 2, &off, &len);
    flip_byte(f->journal, off + len - 1);
    const char *rep[] = {"report", f->journal};
    assert_int_equal(run(f, report_run, 2, rep), 0);
    assert_contains(f->out, "warning: the journal ended without a clean stop");
    assert_contains(f->out, "warning: the journal is damaged: 1 stretch, ");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_no_clean_stop_is_a_warning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clean_stop_says_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cut_mid_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changed_byte_in_the_middle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damage_and_the_other_exit_codes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damage_in_a_killed_run, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
