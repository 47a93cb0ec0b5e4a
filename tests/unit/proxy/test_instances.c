/*
 * test_instances.c - the journals of several twice instances read together
 * (offline/journal_set.h, offline/instances.h, the verdict's per-journal connections): merged
 * by time, one message across instances, connections of different instances kept apart, the
 * instance named in the header (or the file's name for a journal that has none), and every
 * journal and option a command is given used, never dropped silently.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/journal_set.h"
#include "offline/report.h"
#include "offline/verdict.h"
#include "proxy/core/journal.h"
#include "tests/lib/cmd_testkit.h"

#define T0_US 1764406800000000ull

/* One record of a test journal. */
struct irec {
    enum journal_kind kind;
    const char *id;
    uint64_t at_ms, session, tag;
    const char *listener; /* NULL: "jobs" */
};

/* A journal at path written by `instance` (NULL: a journal that names none, as one of a twice
 * before instances), its listeners "jobs" and "mail" (amqp), with seed 42. */
static void write_instance(const char *path, const char *instance, const struct irec *recs,
                           size_t n)
{
    static const char *const names[] = {"jobs", "mail"};
    static const char *const protocols[] = {"amqp", "amqp"};
    static const char *const profiles[] = {NULL, NULL};
    struct journal_header_info h = {.seed = 42,
                                    .config_path = "t.twice",
                                    .instance = instance,
                                    .start_unix_ms = T0_US / 1000,
                                    .listener_names = names,
                                    .listener_protocols = protocols,
                                    .listener_profiles = profiles,
                                    .n_listeners = 2};
    memset(h.config_sha256, 0xab, sizeof(h.config_sha256));
    char err[256];
    struct journal *j =
        journal_open_mode(path, &h, NULL, JOURNAL_MODE_OVERWRITE, NULL, err, sizeof(err));
    assert_non_null(j);
    for (size_t i = 0; i < n; i++) {
        struct journal_record r = {
            .kind = recs[i].kind,
            .time_unix_us = T0_US + recs[i].at_ms * 1000,
            .session = recs[i].session,
            .listener = recs[i].listener != NULL ? recs[i].listener : "jobs",
            .queue = "q",
            .message_id = recs[i].id,
            .task = recs[i].id != NULL ? "charge" : NULL,
            .delivery_tag = recs[i].tag,
        };
        journal_record(j, &r);
    }
    journal_close(j);
}

/* The fixture's second journal, beside f->journal. */
static void second_path(const struct fixture *f, char *buf, size_t len)
{
    snprintf(buf, len, "%s/b.journal", f->dir);
}

static void paths_of(struct journal_paths *p, const char *a, const char *b)
{
    memset(p, 0, sizeof(*p));
    char *argv[] = {(char *)"verdict", (char *)a, (char *)b};
    for (int i = 1; i < 3; i++)
        assert_int_equal(journal_paths_arg(3, argv, &i, p, stderr), 1);
}

/* Entries come out by time across journals, each journal's in its own order (even where its
 * own times go back), with the journal they came from. */
static void test_merged_by_time(void **state)
{
    struct fixture *f = *state;
    char b[160];
    second_path(f, b, sizeof(b));
    const struct irec ra[] = {
        {JOURNAL_KIND_CONNECT, NULL, 0, 1, 0, NULL},
        {JOURNAL_KIND_DELIVER, "m1", 10, 1, 1, NULL},
        {JOURNAL_KIND_DELIVER, "m2", 30, 1, 2, NULL},
        {JOURNAL_KIND_DELIVER, "m3", 25, 1, 3, NULL}, /* written after, stamped before */
    };
    const struct irec rb[] = {
        {JOURNAL_KIND_CONNECT, NULL, 5, 1, 0, NULL},
        {JOURNAL_KIND_ACK, "m1", 20, 1, 0, NULL},
        {JOURNAL_KIND_ACK, "m2", 40, 1, 0, NULL},
    };
    write_instance(f->journal, "zone-a", ra, 4);
    write_instance(b, "zone-b", rb, 3);
    struct journal_paths p;
    paths_of(&p, f->journal, b);
    char err[256];
    struct journal_set *s = journal_set_open(&p, err, sizeof(err));
    assert_non_null(s);
    assert_int_equal(journal_set_count(s), 2);
    assert_string_equal(journal_set_info(s, 0)->instance, "zone-a");
    assert_string_equal(journal_set_info(s, 1)->instance, "zone-b");
    static const struct {
        size_t source;
        uint64_t at_ms;
    } want[] = {{0, 0}, {1, 5}, {0, 10}, {1, 20}, {0, 30}, {0, 25}, {1, 40}};
    size_t src = 0, k = 0;
    const Twice__Journal__Entry *e = NULL;
    int rc;
    while ((rc = journal_set_next(s, &src, &e, err, sizeof(err))) == 1) {
        if (e->body_case != TWICE__JOURNAL__ENTRY__BODY_RECORD)
            continue;
        assert_true(k < sizeof(want) / sizeof(want[0]));
        assert_int_equal(src, want[k].source);
        assert_int_equal(e->record->time_unix_us, T0_US + want[k].at_ms * 1000);
        k++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, sizeof(want) / sizeof(want[0]));
    journal_set_finish(s);
    assert_int_equal(journal_set_info(s, 0)->records, 4);
    assert_int_equal(journal_set_info(s, 1)->records, 3);
    journal_set_close(s);
    journal_paths_free(&p);
    unlink(b);
}

/* A message delivered through one instance and acked through another is one message, settled:
 * no copy, no unfinished work; the row names both instances.  Session 1 of one instance is
 * not session 1 of the other: a CLOSE of b's session 1 does not cut a's delivery. */
static void test_message_across_instances(void **state)
{
    struct fixture *f = *state;
    char b[160];
    second_path(f, b, sizeof(b));
    const struct irec ra[] = {
        {JOURNAL_KIND_DELIVER, "m1", 10, 3, 7, NULL},
        {JOURNAL_KIND_DELIVER, "m2", 12, 1, 8, NULL},
        {JOURNAL_KIND_ACK, "m2", 500, 1, 8, NULL},
    };
    const struct irec rb[] = {
        {JOURNAL_KIND_CLOSE, NULL, 50, 1, 0, NULL},      /* b's session 1, not a's */
        {JOURNAL_KIND_DELIVER, "m2", 100, 2, 1, "mail"}, /* a copy while a's still runs */
        {JOURNAL_KIND_ACK, "m2", 150, 2, 1, "mail"},
        {JOURNAL_KIND_ACK, "m1", 200, 3, 0, "mail"}, /* m1's ack, through b (a Redis-style ack) */
    };
    write_instance(f->journal, "zone-a", ra, 3);
    write_instance(b, "zone-b", rb, 4);
    write_file(f->effects, "m1\nm2\n");
    const char *argv[] = {"verdict", f->journal, b, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, argv), 0);
    assert_contains(f->out, "\"messages\": 2, \"faulted\": 0, \"delivered_more_than_once\": 1");
    /* m2's copy ran beside a's delivery, which no close cut: an overlap, measured from a's ack */
    assert_contains(f->out, "\"overlapping_copies\": 1, \"sequential_copies\": 0, "
                            "\"overlap_unknown_copies\": 0, \"overlap_ms\": {\"median\": 400");
    assert_contains(f->out, "\"never_delivered\": 0, \"unfinished\": 0");
    assert_contains(f->out, "\"instances\": [\"zone-a\", \"zone-b\"], "
                            "\"listeners\": [\"jobs\", \"mail\"]");
    assert_contains(f->out, "\"journals\": [\n    {\"path\": ");
    assert_contains(f->out, "\"instance\": \"zone-b\", \"seed\": \"42\", \"records\": 4");
    const char *text[] = {"verdict", "--journal", f->journal, "--journal",
                          b,         "--effects", f->effects};
    assert_int_equal(run(f, verdict_run, 7, text), 0);
    assert_contains(f->out, "journals  2, read together");
    assert_contains(f->out, "  zone-a                       3     1  no clean stop  ");
    assert_contains(f->out, "SEEN THROUGH  INSTANCES; LISTENERS\ncharge        zone-a, zone-b; "
                            "jobs, mail\n");
    /* --require twice: both hold (the stricter), the one copy is short of two */
    const char *req1[] = {"verdict",  f->journal,  b,         "--effects",
                          f->effects, "--require", "copies=1"};
    assert_int_equal(run(f, verdict_run, 7, req1), 0);
    const char *req2[] = {"verdict",   f->journal, b,           "--effects", f->effects,
                          "--require", "copies=2", "--require", "copies=1"};
    assert_int_equal(run(f, verdict_run, 9, req2), VERDICT_EXIT_UNTESTED);
    /* the report: one message's deliveries, each with its instance */
    const char *rep[] = {"report", f->journal, b, "--message", "m2"};
    assert_int_equal(run(f, report_run, 5, rep), 0);
    assert_contains(f->out, "zone-a/1");
    assert_contains(f->out, "zone-b/2");
    /* the header's listeners are the first journal's, and say so */
    const char *whole[] = {"report", f->journal, b};
    assert_int_equal(run(f, report_run, 3, whole), 0);
    assert_contains(f->out, "\nlisteners (the first journal's) ");
    unlink(b);
}

/* The rows of a verdict's JSON ("tasks" up to "unknown_effects"), with `instances` in them
 * replaced by []. */
static char *rows_of(const char *json, const char *instances)
{
    const char *from = strstr(json, "\"tasks\""), *to = strstr(json, "\"unknown_effects\"");
    assert_non_null(from);
    assert_non_null(to);
    char *rows = calloc(1, (size_t)(to - from) + 1);
    assert_non_null(rows);
    size_t n = 0, k = strlen(instances);
    for (const char *p = from; p < to;) {
        if (strncmp(p, instances, k) == 0) {
            memcpy(rows + n, "[]", 2);
            n += 2;
            p += k;
        } else {
            rows[n++] = *p++;
        }
    }
    return rows;
}

/* One journal carrying both listeners gives the verdict of the two instances' journals each
 * carrying one: the same rows. */
static void test_one_process_equals_two(void **state)
{
    struct fixture *f = *state;
    char b[160], both[160];
    second_path(f, b, sizeof(b));
    snprintf(both, sizeof(both), "%s/both.journal", f->dir);
    const struct irec ra[] = {
        {JOURNAL_KIND_DELIVER, "m1", 10, 1, 1, NULL},
        {JOURNAL_KIND_DELIVER, "m1", 300, 2, 1, NULL},
        {JOURNAL_KIND_ACK, "m1", 400, 1, 1, NULL},
        {JOURNAL_KIND_ACK, "m1", 450, 2, 1, NULL},
    };
    const struct irec rb[] = {
        {JOURNAL_KIND_DELIVER, "e1", 20, 1, 1, "mail"},
        {JOURNAL_KIND_ACK, "e1", 30, 1, 1, "mail"},
        {JOURNAL_KIND_DELIVER, "e1", 90000, 1, 2, "mail"},
        {JOURNAL_KIND_ACK, "e1", 90010, 1, 2, "mail"},
    };
    /* the one process: b's sessions after a's, as one twice numbers them */
    struct irec all[8];
    for (size_t i = 0; i < 4; i++) {
        all[i] = ra[i];
        all[4 + i] = rb[i];
        all[4 + i].session += 2;
    }
    write_instance(f->journal, "zone-a", ra, 4);
    write_instance(b, "zone-b", rb, 4);
    write_instance(both, "one", all, 8);
    write_file(f->effects, "m1\ne1\ne1\n");
    const char *two[] = {"verdict", f->journal, b, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, two), 1);
    char *merged = rows_of(f->out, "[\"zone-a\", \"zone-b\"]");
    const char *one[] = {"verdict", both, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 5, one), 1);
    char *single = rows_of(f->out, "[\"one\"]");
    assert_contains(merged, "\"verdict\": \"NOT IDEMPOTENT\"");
    assert_contains(merged, "\"overlapping_copies\": 1, \"sequential_copies\": 1");
    assert_string_equal(merged, single); /* the rows agree but for the instances they name */
    free(merged);
    free(single);
    unlink(b);
    unlink(both);
}

/* A journal of a twice before instances names none: it is known by its file's name. */
static void test_old_journal_named_by_its_file(void **state)
{
    struct fixture *f = *state;
    const struct irec r[] = {{JOURNAL_KIND_DELIVER, "m1", 10, 1, 1, NULL}};
    write_instance(f->journal, NULL, r, 1);
    const char *argv[] = {"report", f->journal, "--json"};
    assert_int_equal(run(f, report_run, 3, argv), 0);
    char want[256];
    snprintf(want, sizeof(want), "\"instance\": \"%s\"", f->journal);
    assert_contains(f->out, want);
}

/* Every journal and option given is used, or the command says why not: several journals by
 * name, by --journal and by pattern; a pattern matching nothing; --effects twice (both read);
 * --stall-after and --message twice with different values. */
static void test_repeated_options(void **state)
{
    struct fixture *f = *state;
    char b[160], pattern[160], none[160], effects2[160];
    second_path(f, b, sizeof(b));
    snprintf(pattern, sizeof(pattern), "%s/*.journal", f->dir);
    snprintf(none, sizeof(none), "%s/*.nothing", f->dir);
    snprintf(effects2, sizeof(effects2), "%s/effects2.txt", f->dir);
    const struct irec ra[] = {{JOURNAL_KIND_DELIVER, "m1", 10, 1, 1, NULL},
                              {JOURNAL_KIND_ACK, "m1", 20, 1, 1, NULL}};
    const struct irec rb[] = {{JOURNAL_KIND_DELIVER, "m2", 15, 1, 1, NULL},
                              {JOURNAL_KIND_ACK, "m2", 25, 1, 1, NULL}};
    write_instance(f->journal, "zone-a", ra, 2);
    write_instance(b, "zone-b", rb, 2);
    write_file(f->effects, "m1\n");
    write_file(effects2, "m2\n");
    const char *glob[] = {"report", "--journal", pattern, "--json"};
    assert_int_equal(run(f, report_run, 4, glob), 0);
    assert_contains(f->out, "\"deliveries\": {\"messages\": 2, \"delivered\": 2");
    const char *nomatch[] = {"report", none};
    assert_int_equal(run(f, report_run, 2, nomatch), 2);
    assert_contains(f->err, "matches no file");
    /* the glob and a name for the same file: read once */
    const char *overlap[] = {"report", pattern, f->journal, "--json"};
    assert_int_equal(run(f, report_run, 4, overlap), 0);
    assert_contains(f->out, "\"records\": 4,");
    const char *eff[] = {"verdict",  f->journal,  b,        "--effects",
                         f->effects, "--effects", effects2, "--json"};
    assert_int_equal(run(f, verdict_run, 8, eff), 0);
    assert_contains(f->out, "\"effect_lines\": 2,");
    const char *stall[] = {"verdict",       f->journal, "--effects",     f->effects,
                           "--stall-after", "10s",      "--stall-after", "20s"};
    assert_int_equal(run(f, verdict_run, 8, stall), 2);
    assert_contains(f->err, "--stall-after given twice with different durations");
    const char *fmt[] = {"verdict", f->journal, "--effects", f->effects,
                         "--json",  "--format", "markdown"};
    assert_int_equal(run(f, verdict_run, 7, fmt), 2);
    assert_contains(f->err, "two output formats given: json and markdown");
    const char *rfmt[] = {"report", f->journal, "--format=text", "--format", "json"};
    assert_int_equal(run(f, report_run, 5, rfmt), 2);
    assert_contains(f->err, "twice report: two output formats given: text and json");
    const char *same[] = {"report", f->journal, "--json", "--format=json"};
    assert_int_equal(run(f, report_run, 4, same), 0);
    assert_contains(f->out, "\"journals\": [");
    const char *msg[] = {"report", f->journal, "--message", "m1", "--message=m2"};
    assert_int_equal(run(f, report_run, 5, msg), 2);
    assert_contains(f->err, "--message given twice with different ids");
    unlink(b);
    unlink(effects2);
}

/* A damaged journal among several: the others are read whole, the damage is named for its
 * journal, and the verdict exits 6 unless --allow-damaged, as for one journal. */
static void test_damaged_one_of_two(void **state)
{
    struct fixture *f = *state;
    char b[160];
    second_path(f, b, sizeof(b));
    const struct irec ra[] = {{JOURNAL_KIND_DELIVER, "m1", 10, 1, 1, NULL},
                              {JOURNAL_KIND_ACK, "m1", 20, 1, 1, NULL}};
    const struct irec rb[] = {{JOURNAL_KIND_DELIVER, "m2", 15, 1, 1, NULL},
                              {JOURNAL_KIND_ACK, "m2", 25, 1, 1, NULL},
                              {JOURNAL_KIND_DELIVER, "m3", 30, 1, 2, NULL},
                              {JOURNAL_KIND_ACK, "m3", 35, 1, 2, NULL}};
    write_instance(f->journal, "zone-a", ra, 2);
    write_instance(b, "zone-b", rb, 4);
    /* a byte of b's second record changed on the disk */
    FILE *fp = fopen(b, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, -60, SEEK_END), 0);
    int c = fgetc(fp);
    assert_int_equal(fseek(fp, -60, SEEK_END), 0);
    fputc(c ^ 0x55, fp);
    fclose(fp);
    write_file(f->effects, "m1\nm2\nm3\n");
    const char *argv[] = {"verdict", f->journal, b, "--effects", f->effects, "--json"};
    assert_int_equal(run(f, verdict_run, 6, argv), 6);
    assert_contains(f->out, "\"journal_damaged\": true");
    assert_contains(f->out, "\"instance\": \"zone-a\", \"seed\": \"42\", \"records\": 2, "
                            "\"runs\": 1, \"truncated\": false, \"clean_stop\": false, "
                            "\"damage\": null}");
    assert_contains(f->out, "\"instance\": \"zone-b\", \"seed\": \"42\"");
    const char *allow[] = {"verdict", f->journal, b, "--effects", f->effects, "--allow-damaged"};
    assert_int_equal(run(f, verdict_run, 6, allow), 0);
    char named[256];
    snprintf(named, sizeof(named),
             "journal %s (instance zone-b):\nwarning: the journal is damaged: "
             "1 stretch",
             b);
    assert_contains(f->out, named);
    unlink(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_merged_by_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_message_across_instances, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_process_equals_two, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_journal_named_by_its_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repeated_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_one_of_two, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
