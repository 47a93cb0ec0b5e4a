/*
 * test_journal.c - the journal writer (proxy/core/journal.c) and reader
 * (offline/journal_reader.c): fields round-trip, a writer killed mid-write
 * leaves a journal that reads cleanly up to the cut, the 1 MiB entry limit,
 * the writer never blocks the caller on a stuck disk, and garbage never
 * crashes the reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "offline/journal_reader.h"
#include "proxy/core/journal.h"
#include "tests/lib/golden.h"

#define TEST_PATH_MAX 256

struct fixture {
    char dir[64];
    char path[TEST_PATH_MAX];  /* dir/run.journal */
    char other[TEST_PATH_MAX]; /* dir/cut.journal */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/twice-journal-XXXXXX");
    if (mkdtemp(f->dir) == NULL) {
        free(f);
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s/run.journal", f->dir);
    snprintf(f->other, sizeof(f->other), "%s/cut.journal", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    unlink(f->path);
    unlink(f->other);
    rmdir(f->dir);
    free(f);
    return 0;
}

static uint64_t now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

static const char *const test_listener_names[] = {"rabbit", "jobs", "caf\xe9"};
static const char *const test_listener_protocols[] = {"amqp", "resp", "tcp"};
static const char *const test_listener_profiles[] = {NULL, "bullmq", NULL};
static const uint32_t test_listener_visibility[] = {30000, 0, 0};
static const bool test_listener_consumer_timeout[] = {true, false, false};

static struct journal_header_info test_header(void)
{
    struct journal_header_info h = {.seed = 0xdeadbeefcafef00dull,
                                    .config_path = "staging.twice",
                                    .start_unix_ms = 1764406800123ull,
                                    .listener_names = test_listener_names,
                                    .listener_protocols = test_listener_protocols,
                                    .listener_profiles = test_listener_profiles,
                                    .listener_visibility_ms = test_listener_visibility,
                                    .listener_consumer_timeout = test_listener_consumer_timeout,
                                    .n_listeners = 3};
    for (size_t i = 0; i < sizeof(h.config_sha256); i++)
        h.config_sha256[i] = (uint8_t)(i * 7 + 1);
    return h;
}

static struct journal *open_journal(const char *path)
{
    struct journal_header_info h = test_header();
    char err[256] = "";
    struct journal *j = journal_open(path, &h, err, sizeof(err));
    if (j == NULL)
        fail_msg("journal_open: %s", err);
    return j;
}

static struct journal_reader *open_reader(const char *path)
{
    char err[256] = "";
    struct journal_reader *r = journal_reader_open(path, err, sizeof(err));
    if (r == NULL)
        fail_msg("journal_reader_open: %s", err);
    return r;
}

/* A record with every field set to something distinct for index i. */
static struct journal_record full_record(uint64_t i, char *buf, size_t len)
{
    snprintf(buf, len, "msg-%llu", (unsigned long long)i);
    struct journal_record r = {
        .kind = (enum journal_kind)(1 + i % 10),
        .time_unix_us = 1764406800000000ull + i * 1000,
        .session = i + 1,
        .listener = "amqp",
        .queue = "celery",
        .task = "tasks.charge_card",
        .message_id = buf,
        .delivery_tag = 1000 + i,
        .redelivered = i % 2 == 1,
        .rule = "crash-after-work",
        .action = 5,
        .action_name = "close",
        .event = 2,
        .client = "127.0.0.1:5000",
        .close_reason = 3,
        .close_reason_name = "client_error",
        .bytes_up = 12345 + i,
        .bytes_down = 67890 + i,
        .detail = "delay 45000ms",
        .refused = i % 3 == 1,
        .kept_back = i % 5 == 2,
        .auto_ack = i % 7 == 3,
        .started_unix_us = i % 2 == 0 ? 1764406700000000ull + i : 0,
        .run = i % 2 == 0 ? "host:1:abc tid-7" : NULL,
    };
    return r;
}

static void assert_record_equal(const Twice__Journal__Record *p, const struct journal_record *r)
{
    assert_int_equal(p->kind, r->kind);
    assert_int_equal(p->time_unix_us, r->time_unix_us);
    assert_int_equal(p->session, r->session);
    assert_string_equal(p->listener, r->listener);
    assert_string_equal(p->queue, r->queue);
    assert_string_equal(p->task, r->task);
    assert_string_equal(p->message_id, r->message_id);
    assert_int_equal(p->delivery_tag, r->delivery_tag);
    assert_int_equal(p->redelivered, r->redelivered);
    assert_string_equal(p->rule, r->rule);
    assert_int_equal(p->action, r->action);
    assert_string_equal(p->action_name, r->action_name);
    assert_int_equal(p->event, r->event);
    assert_string_equal(p->client, r->client);
    assert_int_equal(p->close_reason, r->close_reason);
    assert_string_equal(p->close_reason_name, r->close_reason_name);
    assert_int_equal(p->bytes_up, r->bytes_up);
    assert_int_equal(p->bytes_down, r->bytes_down);
    assert_string_equal(p->detail, r->detail);
    assert_int_equal(p->refused, r->refused);
    assert_int_equal(p->kept_back, r->kept_back);
    assert_int_equal(p->auto_ack, r->auto_ack);
    assert_int_equal(p->started_unix_us, r->started_unix_us);
    assert_string_equal(p->run, r->run != NULL ? r->run : "");
}

/* The next entry, which must be a record. */
static const Twice__Journal__Record *next_record(struct journal_reader *r)
{
    const Twice__Journal__Entry *e = NULL;
    int rc = journal_reader_next(r, &e);
    if (rc != 1)
        fail_msg("journal_reader_next: %d %s", rc,
                 journal_reader_error(r) ? journal_reader_error(r) : "");
    assert_int_equal(e->body_case, TWICE__JOURNAL__ENTRY__BODY_RECORD);
    return e->record;
}

static void assert_end(struct journal_reader *r, bool truncated)
{
    const Twice__Journal__Entry *e = NULL;
    assert_int_equal(journal_reader_next(r, &e), 0);
    assert_int_equal(journal_reader_truncated(r), truncated);
    assert_null(journal_reader_error(r));
    /* The end is stable. */
    assert_int_equal(journal_reader_next(r, &e), 0);
}

static void test_header_round_trips(void **state)
{
    struct fixture *f = *state;
    journal_close(open_journal(f->path));
    struct journal_reader *r = open_reader(f->path);
    const Twice__Journal__Header *h = journal_reader_header(r);
    struct journal_header_info want = test_header();
    assert_int_equal(h->version, 1);
    assert_true(h->entry_crc32c);
    assert_int_equal(h->seed, want.seed);
    assert_int_equal(h->start_unix_ms, want.start_unix_ms);
    assert_int_equal(h->config_sha256.len, 32);
    assert_memory_equal(h->config_sha256.data, want.config_sha256, 32);
    assert_string_equal(h->config_path, "staging.twice");
    assert_string_equal(h->twice_version, TWICE_VERSION);
    /* The listeners, in order, with their protocol and profile; a name that is not UTF-8
     * cleaned as the records' listener field is. */
    assert_int_equal(h->n_listeners, 3);
    assert_string_equal(h->listeners[0]->name, "rabbit");
    assert_string_equal(h->listeners[0]->protocol, "amqp");
    assert_string_equal(h->listeners[0]->profile, "");
    /* its timeout, for the verdict's hints (a journal without it reads as none) */
    assert_int_equal(h->listeners[0]->visibility_timeout_ms, 30000);
    assert_true(h->listeners[0]->consumer_timeout);
    assert_int_equal(h->listeners[1]->visibility_timeout_ms, 0);
    assert_false(h->listeners[1]->consumer_timeout);
    assert_string_equal(h->listeners[1]->name, "jobs");
    assert_string_equal(h->listeners[1]->profile, "bullmq");
    assert_string_equal(h->listeners[2]->name, "caf?");
    assert_string_equal(h->listeners[2]->protocol, "tcp");
    assert_end(r, false);
    journal_reader_close(r);
}

static void test_every_field_round_trips(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char ids[20][32];
    struct journal_record recs[20];
    for (uint64_t i = 0; i < 20; i++) {
        recs[i] = full_record(i, ids[i], sizeof(ids[i]));
        journal_record(j, &recs[i]);
    }
    assert_int_equal(journal_records(j), 20);
    assert_int_equal(journal_dropped(j), 0);
    journal_close(j);

    struct journal_reader *r = open_reader(f->path);
    for (size_t i = 0; i < 20; i++)
        assert_record_equal(next_record(r), &recs[i]);
    assert_end(r, false);
    assert_int_equal(journal_reader_count(r), 20);
    journal_reader_close(r);
}

/* A change of the rules in force: every field of its RULES record comes back. */
static void test_rules_change_round_trips(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    struct journal_rules_change c = {.time_unix_us = 1764406801000000ull,
                                     .change = JOURNAL_CHANGE_RULE_DISABLED,
                                     .source = JOURNAL_SOURCE_ADMIN_API,
                                     .rule = "slow-ack",
                                     .client = "127.0.0.1:50123",
                                     .detail = "POST /rules/slow-ack/disable",
                                     .rules = 3,
                                     .rules_disabled = 1,
                                     .faults_off = true};
    for (size_t i = 0; i < sizeof(c.rules_sha256); i++)
        c.rules_sha256[i] = (uint8_t)(0xf0 ^ i);
    journal_rules_changed(j, &c);
    uint64_t before = now_us();
    struct journal_rules_change hup = {
        .change = JOURNAL_CHANGE_RELOADED, .source = JOURNAL_SOURCE_SIGNAL, .detail = "SIGHUP"};
    journal_rules_changed(j, &hup);
    journal_rules_changed(NULL, &hup); /* no journal: a no-op */
    journal_close(j);

    struct journal_reader *r = open_reader(f->path);
    const Twice__Journal__Record *p = next_record(r);
    assert_int_equal(p->kind, TWICE__JOURNAL__RECORD__KIND__RULES);
    assert_int_equal(p->time_unix_us, c.time_unix_us);
    assert_int_equal(p->change, TWICE__JOURNAL__RECORD__CHANGE__RULE_DISABLED);
    assert_int_equal(p->change_source, TWICE__JOURNAL__RECORD__CHANGE_SOURCE__ADMIN_API);
    assert_string_equal(p->rule, "slow-ack");
    assert_string_equal(p->client, "127.0.0.1:50123");
    assert_string_equal(p->detail, "POST /rules/slow-ack/disable");
    assert_int_equal(p->rules_sha256.len, 32);
    assert_memory_equal(p->rules_sha256.data, c.rules_sha256, 32);
    assert_int_equal(p->rules, 3);
    assert_int_equal(p->rules_disabled, 1);
    assert_true(p->faults_off);
    assert_string_equal(p->message_id, "");
    p = next_record(r);
    assert_int_equal(p->change, TWICE__JOURNAL__RECORD__CHANGE__RELOADED);
    assert_int_equal(p->change_source, TWICE__JOURNAL__RECORD__CHANGE_SOURCE__SIGNAL);
    assert_true(p->time_unix_us >= before);
    assert_string_equal(p->detail, "SIGHUP");
    assert_string_equal(p->rule, "");
    assert_false(p->faults_off);
    assert_end(r, false);
    journal_reader_close(r);
}

static void test_null_strings_and_time_stamp(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    uint64_t before = now_us();
    struct journal_record rec = {.kind = JOURNAL_KIND_CONNECT, .session = 7};
    journal_record(j, &rec);
    uint64_t after = now_us();
    journal_record(NULL, &rec); /* no journal configured: a no-op */
    journal_close(j);
    journal_close(NULL);

    struct journal_reader *r = open_reader(f->path);
    const Twice__Journal__Record *p = next_record(r);
    assert_int_equal(p->kind, TWICE__JOURNAL__RECORD__KIND__CONNECT);
    assert_true(p->time_unix_us >= before && p->time_unix_us <= after);
    assert_string_equal(p->listener, "");
    assert_string_equal(p->message_id, "");
    assert_string_equal(p->detail, "");
    assert_end(r, false);
    journal_reader_close(r);
}

static void test_strings_are_cleaned(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char *long_id = malloc(JOURNAL_FIELD_MAX + 100);
    memset(long_id, 'a', JOURNAL_FIELD_MAX + 99);
    long_id[JOURNAL_FIELD_MAX - 1] = '\xc3'; /* a 2-byte character across the cut */
    long_id[JOURNAL_FIELD_MAX] = '\xa9';
    long_id[JOURNAL_FIELD_MAX + 99] = '\0';
    struct journal_record a = {.kind = JOURNAL_KIND_DELIVER,
                               .message_id = "ok-\xc3\xa9-\xff\xfe-x"};
    struct journal_record b = {.kind = JOURNAL_KIND_DELIVER, .message_id = long_id};
    journal_record(j, &a);
    journal_record(j, &b);
    journal_close(j);

    struct journal_reader *r = open_reader(f->path);
    assert_string_equal(next_record(r)->message_id, "ok-\xc3\xa9-?\?-x");
    const char *cut = next_record(r)->message_id;
    assert_int_equal(strlen(cut), JOURNAL_FIELD_MAX - 1);
    assert_int_equal(strspn(cut, "a"), JOURNAL_FIELD_MAX - 1);
    assert_end(r, false);
    journal_reader_close(r);
    free(long_id);
}

static void test_many_records_in_order(void **state)
{
    struct fixture *f = *state;
    const uint64_t n = 200000;
    struct journal *j = open_journal(f->path);
    char id[32];
    for (uint64_t i = 0; i < n; i++) {
        struct journal_record rec = full_record(i, id, sizeof(id));
        journal_record(j, &rec);
    }
    assert_int_equal(journal_records(j), n);
    assert_int_equal(journal_dropped(j), 0);
    journal_close(j);

    struct journal_reader *r = open_reader(f->path);
    for (uint64_t i = 0; i < n; i++) {
        const Twice__Journal__Record *p = next_record(r);
        assert_int_equal(p->session, i + 1);
        snprintf(id, sizeof(id), "msg-%llu", (unsigned long long)i);
        assert_string_equal(p->message_id, id);
    }
    assert_end(r, false);
    journal_reader_close(r);
}

/* The writer flushes on its own, within JOURNAL_FLUSH_INTERVAL_MS, without a close. */
static void test_flushes_every_interval(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    struct stat st;
    assert_int_equal(stat(f->path, &st), 0);
    off_t header_size = st.st_size;
    struct journal_record rec = {.kind = JOURNAL_KIND_PUBLISH, .message_id = "m1"};
    journal_record(j, &rec);
    for (int i = 0; i < 300 && st.st_size == header_size; i++) { /* 30 s at most: a busy machine */
        usleep(100 * 1000);
        assert_int_equal(stat(f->path, &st), 0);
    }
    assert_true(st.st_size > header_size);
    journal_close(j);
}

/* Copies the first len bytes of src to dst. */
static void copy_prefix(const char *src, const char *dst, size_t len)
{
    FILE *in = fopen(src, "rb");
    FILE *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    for (size_t i = 0; i < len; i++) {
        int c = fgetc(in);
        assert_true(c != EOF);
        fputc(c, out);
    }
    fclose(in);
    fclose(out);
}

static size_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (size_t)st.st_size;
}

static struct journal *open_journal_flush(const char *path, struct journal_flush flush)
{
    struct journal_header_info h = test_header();
    char err[256] = "";
    struct journal *j = journal_open_with(path, &h, &flush, err, sizeof(err));
    if (j == NULL)
        fail_msg("journal_open_with: %s", err);
    return j;
}

/* Records in the file at path now, read to its end (it must end on a record boundary). */
static uint64_t records_on_disk(const char *path)
{
    struct journal_reader *r = open_reader(path);
    const Twice__Journal__Entry *e = NULL;
    while (journal_reader_next(r, &e) == 1)
        ;
    assert_false(journal_reader_truncated(r));
    assert_null(journal_reader_error(r));
    uint64_t n = journal_reader_count(r);
    journal_reader_close(r);
    return n;
}

/* every_record: each record is in the file when journal_record() returns (a kill after it
 * loses nothing), whole. */
static void test_every_record_is_written_before_it_returns(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal_flush(f->path, (struct journal_flush){.every_record = true});
    char id[32];
    for (uint64_t i = 0; i < 50; i++) {
        struct journal_record rec = full_record(i, id, sizeof(id));
        journal_record(j, &rec);
        assert_int_equal(records_on_disk(f->path), i + 1);
    }
    assert_int_equal(journal_records(j), 50);
    assert_int_equal(journal_dropped(j), 0);
    journal_close(j);
    assert_int_equal(records_on_disk(f->path), 50);
}

/* The interval is the one given: with a day, nothing is written before the close (the writer
 * thread sleeps), and everything at it. */
static void test_flush_interval_is_the_one_given(void **state)
{
    struct fixture *f = *state;
    struct journal *j =
        open_journal_flush(f->path, (struct journal_flush){.interval_ms = 86400000});
    size_t header = file_size(f->path);
    char id[32];
    for (uint64_t i = 0; i < 10; i++) {
        struct journal_record rec = full_record(i, id, sizeof(id));
        journal_record(j, &rec);
    }
    assert_int_equal(file_size(f->path), header);
    journal_close(j);
    assert_int_equal(records_on_disk(f->path), 10);
}

/* Cut at every byte of the last two records: the reader returns the complete
 * records and ends cleanly, reporting the truncation. */
static void test_truncated_journal_ends_cleanly(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char ids[3][32];
    struct journal_record recs[3];
    for (uint64_t i = 0; i < 3; i++) {
        recs[i] = full_record(i, ids[i], sizeof(ids[i]));
        journal_record(j, &recs[i]);
    }
    journal_close(j);
    /* Find where each record ends. */
    struct journal_reader *r = open_reader(f->path);
    size_t ends[4];
    ends[0] = journal_reader_offset(r);
    for (size_t i = 0; i < 3; i++) {
        next_record(r);
        ends[i + 1] = journal_reader_offset(r);
    }
    journal_reader_close(r);
    assert_int_equal(ends[3], file_size(f->path));

    for (size_t cut = ends[1]; cut <= ends[3]; cut++) {
        copy_prefix(f->path, f->other, cut);
        r = open_reader(f->other);
        size_t complete = cut >= ends[3] ? 3 : cut >= ends[2] ? 2 : 1;
        for (size_t i = 0; i < complete; i++)
            assert_record_equal(next_record(r), &recs[i]);
        bool at_boundary = cut == ends[complete];
        assert_end(r, !at_boundary);
        journal_reader_close(r);
    }
}

static void assert_open_fails(const char *path, const char *needle)
{
    char err[256] = "";
    struct journal_reader *r = journal_reader_open(path, err, sizeof(err));
    assert_null(r);
    if (strstr(err, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

/* journal_encode_record_entry() writes, for any record, the bytes protobuf-c writes for its
 * entry: every field alone at a few values (0 left out, one- and many-byte varints, a field
 * number past 15 and its two-byte tag, empty and long strings), then random records. */
static void assert_record_encodes_as_protobuf_c(const Twice__Journal__Record *r)
{
    Twice__Journal__Entry e = TWICE__JOURNAL__ENTRY__INIT;
    e.body_case = TWICE__JOURNAL__ENTRY__BODY_RECORD;
    e.record = (Twice__Journal__Record *)r;
    static uint8_t want[4096], got[4096];
    size_t wn = 0, gn = 0;
    assert_int_equal(journal_encode_entry(&e, want, sizeof(want), &wn), 0);
    assert_int_equal(journal_encode_record_entry(r, got, sizeof(got), &gn), 0);
    assert_int_equal(gn, wn);
    assert_memory_equal(got, want, wn);
    /* Too little room: nothing written, the room needed told. */
    size_t need = 0;
    assert_int_equal(journal_encode_record_entry(r, got, wn - 1, &need), JOURNAL_ERR_SPACE);
    assert_int_equal(need, wn);
}

static void test_record_encoding_matches_protobuf_c(void **state)
{
    (void)state;
    static const uint64_t nums[] = {
        0, 1, 127, 128, 300, 16383, 16384, UINT32_MAX, UINT64_C(1) << 35, UINT64_MAX};
    char long_s[700];
    memset(long_s, 'x', sizeof(long_s) - 1);
    long_s[sizeof(long_s) - 1] = '\0';
    const char *strs[] = {NULL, "", "a", "queue:default", "\xc3\xa9t\xc3\xa9", long_s};
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    assert_record_encodes_as_protobuf_c(&r); /* every field at its default */
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        uint64_t v = nums[i];
        Twice__Journal__Record x = TWICE__JOURNAL__RECORD__INIT;
        x.kind = (Twice__Journal__Record__Kind)(v % 11);
        x.time_unix_us = v;
        x.started_unix_us = v;
        assert_record_encodes_as_protobuf_c(&x);
        x = (Twice__Journal__Record)TWICE__JOURNAL__RECORD__INIT;
        x.session = x.delivery_tag = x.bytes_up = x.bytes_down = v;
        x.action = x.event = x.close_reason = x.retries = (uint32_t)v;
        x.redelivered = x.retry = x.refused = x.kept_back = x.auto_ack = v != 0;
        assert_record_encodes_as_protobuf_c(&x);
    }
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        Twice__Journal__Record x = TWICE__JOURNAL__RECORD__INIT;
        char *s = (char *)strs[i];
        x.listener = x.queue = x.task = x.message_id = x.rule = s;
        assert_record_encodes_as_protobuf_c(&x);
        x = (Twice__Journal__Record)TWICE__JOURNAL__RECORD__INIT;
        x.action_name = x.client = x.close_reason_name = x.detail = x.run = s; /* 2-byte tags */
        assert_record_encodes_as_protobuf_c(&x);
    }
    /* A RULES record's fields: enums, a bytes field (a length, not a C string), flags. */
    uint8_t sha[32];
    for (size_t i = 0; i < sizeof(sha); i++)
        sha[i] = (uint8_t)(i * 37);
    for (size_t len = 0; len <= sizeof(sha); len += 16) {
        Twice__Journal__Record x = TWICE__JOURNAL__RECORD__INIT;
        x.kind = TWICE__JOURNAL__RECORD__KIND__RULES;
        x.change = (Twice__Journal__Record__Change)(len / 16 + 1);
        x.change_source = TWICE__JOURNAL__RECORD__CHANGE_SOURCE__SIGNAL;
        x.rules_sha256.data = sha;
        x.rules_sha256.len = len;
        x.rules = (uint32_t)len * 1000;
        x.rules_disabled = (uint32_t)len;
        x.faults_off = len != 16;
        assert_record_encodes_as_protobuf_c(&x);
    }
    srand(7);
    for (int k = 0; k < 2000; k++) {
        Twice__Journal__Record x = TWICE__JOURNAL__RECORD__INIT;
        uint64_t *u64[] = {&x.time_unix_us, &x.session,    &x.delivery_tag,
                           &x.bytes_up,     &x.bytes_down, &x.started_unix_us};
        uint32_t *u32[] = {&x.action, &x.event, &x.close_reason, &x.retries};
        char **str[] = {&x.listener,    &x.queue,  &x.task,   &x.message_id,        &x.rule,
                        &x.action_name, &x.client, &x.detail, &x.close_reason_name, &x.run};
        x.kind = (Twice__Journal__Record__Kind)(rand() % 11);
        x.redelivered = rand() % 2;
        x.retry = rand() % 2;
        x.refused = rand() % 2;
        x.kept_back = rand() % 2;
        x.auto_ack = rand() % 2;
        for (size_t i = 0; i < 6; i++)
            *u64[i] = rand() % 3 == 0 ? 0 : nums[(size_t)rand() % 10] >> (rand() % 64);
        for (size_t i = 0; i < 4; i++)
            *u32[i] = rand() % 3 == 0 ? 0 : (uint32_t)(nums[(size_t)rand() % 10] >> (rand() % 32));
        for (size_t i = 0; i < 10; i++)
            *str[i] = (char *)strs[(size_t)rand() % 5]; /* long_s only above: 4 KiB of room */
        x.change = (Twice__Journal__Record__Change)(rand() % 3 == 0 ? 0 : rand() % 10);
        x.change_source = (Twice__Journal__Record__ChangeSource)(rand() % 3);
        x.rules_sha256.data = sha;
        x.rules_sha256.len = rand() % 2 == 0 ? 0 : (size_t)rand() % 33;
        x.rules = rand() % 2 == 0 ? 0 : (uint32_t)rand();
        x.rules_disabled = rand() % 2 == 0 ? 0 : (uint32_t)rand() % 300;
        x.faults_off = rand() % 2;
        assert_record_encodes_as_protobuf_c(&x);
    }
}

static void test_bad_headers(void **state)
{
    struct fixture *f = *state;
    assert_open_fails("/nonexistent/dir/x.journal", "No such file");
    journal_close(open_journal(f->path));
    copy_prefix(f->path, f->other, 0);
    assert_open_fails(f->other, "empty");
    copy_prefix(f->path, f->other, 5);
    assert_open_fails(f->other, "inside its header");
    /* One byte of the header changed (the config path's last): it fails its checksum, and
     * nothing after it can be trusted to be this run's. */
    size_t size = file_size(f->path);
    copy_prefix(f->path, f->other, size);
    uint8_t *whole = kit_read_path(f->other, &size);
    FILE *hp = fopen(f->other, "r+b");
    uint8_t *at = memmem(whole, size, "staging.twice", 13);
    assert_non_null(at);
    fseek(hp, (long)(at - whole) + 12, SEEK_SET);
    fputc('X', hp);
    fclose(hp);
    free(whole);
    assert_open_fails(f->other, "fails its checksum");

    /* A record where the header should be. */
    Twice__Journal__Record rec = TWICE__JOURNAL__RECORD__INIT;
    Twice__Journal__Entry e = TWICE__JOURNAL__ENTRY__INIT;
    e.body_case = TWICE__JOURNAL__ENTRY__BODY_RECORD;
    e.record = &rec;
    uint8_t buf[64];
    size_t n = 0;
    assert_int_equal(journal_encode_entry(&e, buf, sizeof(buf), &n), 0);
    FILE *fp = fopen(f->other, "wb");
    fwrite(buf, 1, n, fp);
    fclose(fp);
    assert_open_fails(f->other, "not a journal header");

    /* A version from the future. */
    Twice__Journal__Header h = TWICE__JOURNAL__HEADER__INIT;
    h.version = 2;
    e.body_case = TWICE__JOURNAL__ENTRY__BODY_HEADER;
    e.header = &h;
    assert_int_equal(journal_encode_entry(&e, buf, sizeof(buf), &n), 0);
    fp = fopen(f->other, "wb");
    fwrite(buf, 1, n, fp);
    fclose(fp);
    assert_open_fails(f->other, "version 2");
}

static void test_writer_open_errors(void **state)
{
    (void)state;
    struct journal_header_info h = test_header();
    char err[256] = "";
    assert_null(journal_open("/nonexistent/dir/x.journal", &h, err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/dir/x.journal"));
    assert_null(journal_open("/dev/full", &h, err, sizeof(err)));
    assert_non_null(strstr(err, "No space"));
}

/* An entry whose encoding is exactly `size` bytes (without prefix). */
static Twice__Journal__Entry *entry_of_size(size_t size, char **detail)
{
    static Twice__Journal__Entry e;
    static Twice__Journal__Record rec;
    twice__journal__entry__init(&e);
    twice__journal__record__init(&rec);
    e.body_case = TWICE__JOURNAL__ENTRY__BODY_RECORD;
    e.record = &rec;
    size_t len = size;
    *detail = malloc(size + 1);
    for (;;) {
        memset(*detail, 'x', len);
        (*detail)[len] = '\0';
        rec.detail = *detail;
        size_t got = twice__journal__entry__get_packed_size(&e);
        if (got == size)
            return &e;
        len -= got - size;
    }
}

static void test_entry_size_limit(void **state)
{
    (void)state;
    size_t cap = JOURNAL_RECORD_MAX + 2 * JOURNAL_VARINT_MAX;
    uint8_t *buf = malloc(cap);
    char *detail = NULL;
    /* Exactly the limit, with the checksum: encodes and decodes. */
    Twice__Journal__Entry *e = entry_of_size(JOURNAL_RECORD_MAX - JOURNAL_CRC_LEN, &detail);
    size_t n = 0, used = 0;
    assert_int_equal(journal_encode_entry(e, buf, cap, &n), 0);
    assert_int_equal(n, journal_entry_encoded_size(e));
    assert_int_equal(journal_encode_entry(e, buf, n - 1, &n), JOURNAL_ERR_SPACE);
    Twice__Journal__Entry *out = NULL;
    assert_int_equal(journal_decode_entry(buf, n, true, &used, &out), 1);
    assert_int_equal(used, n);
    assert_int_equal(strlen(out->record->detail), strlen(detail));
    twice__journal__entry__free_unpacked(out, NULL);
    free(detail);
    /* One byte more: refused both ways. */
    e = entry_of_size(JOURNAL_RECORD_MAX - JOURNAL_CRC_LEN + 1, &detail);
    assert_int_equal(journal_encode_entry(e, buf, cap, &n), JOURNAL_ERR_TOO_LARGE);
    /* Refused from the prefix alone, before the body arrives. */
    size_t p = journal_put_varint(buf, JOURNAL_RECORD_MAX + 1);
    assert_int_equal(journal_decode_entry(buf, p, true, &used, &out), JOURNAL_ERR_TOO_LARGE);
    /* Even from the first bytes of a longer prefix. */
    assert_int_equal(journal_put_varint(buf, 0xffffffffffull), 6);
    assert_int_equal(journal_decode_entry(buf, 4, false, &used, &out), JOURNAL_ERR_TOO_LARGE);
    free(detail);
    free(buf);
}

/* Appends to path the entry of record r, as the writer encodes it. */
static void append_record(const char *path, const struct journal_record *rec)
{
    Twice__Journal__Record pr = TWICE__JOURNAL__RECORD__INIT;
    pr.kind = (Twice__Journal__Record__Kind)rec->kind;
    pr.message_id = (char *)rec->message_id;
    pr.session = rec->session;
    uint8_t buf[256];
    size_t n = 0;
    assert_int_equal(journal_encode_record_entry(&pr, buf, sizeof(buf), &n), 0);
    FILE *fp = fopen(path, "ab");
    fwrite(buf, 1, n, fp);
    fclose(fp);
}

/* A too-large prefix in the middle of a file is damage, with its offset; the record after
 * the garbage is read. */
static void test_oversized_record_in_file(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char id[32];
    struct journal_record rec = full_record(0, id, sizeof(id));
    journal_record(j, &rec);
    journal_close(j);
    size_t size = file_size(f->path);
    FILE *fp = fopen(f->path, "ab");
    uint8_t prefix[JOURNAL_VARINT_MAX];
    size_t plen = journal_put_varint(prefix, JOURNAL_RECORD_MAX + 1);
    fwrite(prefix, 1, plen, fp);
    fwrite("garbage", 1, 7, fp);
    fclose(fp);
    struct journal_record after = {.kind = JOURNAL_KIND_ACK, .message_id = "after", .session = 9};
    append_record(f->path, &after);

    struct journal_reader *r = open_reader(f->path);
    assert_record_equal(next_record(r), &rec);
    assert_string_equal(next_record(r)->message_id, "after");
    assert_end(r, false);
    struct journal_damage_summary sum;
    journal_reader_damage(r, &sum);
    assert_int_equal(sum.stretches, 1);
    assert_int_equal(sum.bytes, plen + 7);
    const struct journal_damage *d = journal_reader_damage_at(r, 0);
    assert_int_equal(d->offset, size);
    assert_int_equal(d->bytes, plen + 7);
    assert_int_equal(d->reason, JOURNAL_ERR_TOO_LARGE);
    assert_int_equal(d->records_lost, -1);
    assert_true(d->resumed);
    assert_null(journal_reader_damage_at(r, 1));
    journal_reader_close(r);
}

/* Every split of a buffer of entries: a prefix asks for more, never errs. */
static void test_decode_at_every_split(void **state)
{
    (void)state;
    uint8_t buf[4096];
    size_t len = 0, ends[3];
    const char *ids[3] = {"a", "bb", "ccc"};
    for (size_t i = 0; i < 3; i++) {
        Twice__Journal__Record rec = TWICE__JOURNAL__RECORD__INIT;
        rec.kind = TWICE__JOURNAL__RECORD__KIND__DELIVER;
        rec.message_id = (char *)ids[i];
        rec.delivery_tag = 300 + i;
        Twice__Journal__Entry e = TWICE__JOURNAL__ENTRY__INIT;
        e.body_case = TWICE__JOURNAL__ENTRY__BODY_RECORD;
        e.record = &rec;
        size_t n = 0;
        assert_int_equal(journal_encode_entry(&e, buf + len, sizeof(buf) - len, &n), 0);
        len += n;
        ends[i] = len;
    }
    size_t start = 0;
    for (size_t i = 0; i < 3; i++) {
        for (size_t cut = start; cut < ends[i]; cut++) {
            Twice__Journal__Entry *out = NULL;
            size_t used = 0;
            assert_int_equal(journal_decode_entry(buf + start, cut - start, true, &used, &out), 0);
        }
        Twice__Journal__Entry *out = NULL;
        size_t used = 0;
        assert_int_equal(journal_decode_entry(buf + start, len - start, true, &used, &out), 1);
        assert_int_equal(used, ends[i] - start);
        assert_string_equal(out->record->message_id, ids[i]);
        assert_int_equal(out->record->delivery_tag, 300 + i);
        twice__journal__entry__free_unpacked(out, NULL);
        start = ends[i];
    }
}

static void test_varint_prefix(void **state)
{
    (void)state;
    uint8_t buf[16];
    size_t used = 0;
    Twice__Journal__Entry *out = NULL;
    /* Overlong but in range: 0x80 0x80 0x00 is a zero length, an empty Entry; without its
     * checksum, which a journal that has them refuses. */
    memcpy(buf, "\x80\x80\x00", 3);
    assert_int_equal(journal_decode_entry(buf, 3, false, &used, &out), 1);
    assert_int_equal(used, 3);
    assert_int_equal(out->body_case, TWICE__JOURNAL__ENTRY__BODY__NOT_SET);
    twice__journal__entry__free_unpacked(out, NULL);
    assert_int_equal(journal_decode_entry(buf, 3, true, &used, &out), JOURNAL_ERR_CHECKSUM);
    assert_int_equal(used, 3);
    /* Eleven continuation bytes of zeros: not a varint. */
    memset(buf, 0x80, 11);
    assert_int_equal(journal_decode_entry(buf, 11, true, &used, &out), JOURNAL_ERR_VARINT);
    /* Body bytes that are not an Entry. */
    memcpy(buf, "\x02\xff\xff", 3);
    assert_int_equal(journal_decode_entry(buf, 3, false, &used, &out), JOURNAL_ERR_DECODE);
    assert_string_equal(journal_strerror(JOURNAL_ERR_DECODE),
                        "entry is not a valid protobuf Entry");
    assert_string_equal(journal_strerror(-999), "unknown error");
}

/* CRC-32C bit by bit, as its polynomial defines it: what journal_crc32c() must give. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0x82f63b78u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

/* The check value of the CRC catalogue; every start (alignment) and length around the 8-byte
 * steps, on the CPU's instruction and on the tables. */
static void test_crc32c(void **state)
{
    (void)state;
    assert_int_equal(journal_crc32c((const uint8_t *)"123456789", 9), 0xe3069283u);
    assert_int_equal(journal_crc32c_portable((const uint8_t *)"123456789", 9), 0xe3069283u);
    assert_int_equal(journal_crc32c((const uint8_t *)"", 0), 0);
    uint8_t buf[300];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t at = 0; at < 8; at++) {
        for (size_t n = 0; n + at <= sizeof(buf); n += n < 40 ? 1 : 37) {
            uint32_t want = crc32c_bitwise(buf + at, n);
            assert_int_equal(journal_crc32c(buf + at, n), want);
            assert_int_equal(journal_crc32c_portable(buf + at, n), want);
        }
    }
}

/* Writes a journal of twice before checksums: the entries as protobuf-c packs them, no
 * entry_crc32c in the header, no crc32c in any entry. */
static void write_unchecked_journal(const char *path, const char **ids, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    Twice__Journal__Header h = TWICE__JOURNAL__HEADER__INIT;
    h.version = JOURNAL_FORMAT_VERSION;
    h.seed = 99;
    h.start_unix_ms = 1764406800123ull;
    Twice__Journal__Record rec = TWICE__JOURNAL__RECORD__INIT;
    for (size_t i = 0; i <= n; i++) {
        Twice__Journal__Entry e = TWICE__JOURNAL__ENTRY__INIT;
        if (i == 0) {
            e.body_case = TWICE__JOURNAL__ENTRY__BODY_HEADER;
            e.header = &h;
        } else {
            rec.kind = TWICE__JOURNAL__RECORD__KIND__DELIVER;
            rec.message_id = (char *)ids[i - 1];
            e.body_case = TWICE__JOURNAL__ENTRY__BODY_RECORD;
            e.record = &rec;
        }
        uint8_t buf[256];
        size_t size = twice__journal__entry__get_packed_size(&e);
        size_t o = journal_put_varint(buf, size);
        assert_true(o + size <= sizeof(buf));
        twice__journal__entry__pack(&e, buf + o);
        fwrite(buf, 1, o + size, fp);
    }
    fclose(fp);
}

/* Every entry twice writes, the header's included, ends with the CRC-32C of its bytes before
 * it; one changed byte anywhere after an entry's length prefix fails its checksum. */
static void test_entries_end_with_their_checksum(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char ids[4][32];
    for (uint64_t i = 0; i < 4; i++) {
        struct journal_record rec = full_record(i, ids[i], sizeof(ids[i]));
        journal_record(j, &rec);
    }
    journal_close(j);
    size_t size;
    uint8_t *buf = kit_read_path(f->path, &size);
    size_t entries = 0;
    for (size_t off = 0; off < size; entries++) {
        uint64_t body = 0;
        size_t p = 0;
        for (int shift = 0;; shift += 7) {
            body |= (uint64_t)(buf[off + p] & 0x7f) << shift;
            if ((buf[off + p++] & 0x80) == 0)
                break;
        }
        const uint8_t *b = buf + off + p;
        assert_true(body > JOURNAL_CRC_LEN && off + p + body <= size);
        assert_int_equal(b[body - 5], 0x7d);
        uint32_t c = crc32c_bitwise(b, body - 5);
        assert_memory_equal(b + body - 4, ((uint8_t[]){c, c >> 8, c >> 16, c >> 24}), 4);
        for (size_t k = 0; k < body; k++) {
            uint8_t *x = buf + off + p + k;
            *x ^= 0x10;
            Twice__Journal__Entry *out = NULL;
            size_t used = 0;
            assert_int_equal(journal_decode_entry(buf + off, size - off, true, &used, &out),
                             JOURNAL_ERR_CHECKSUM);
            assert_int_equal(used, p + body);
            *x ^= 0x10;
        }
        off += p + body;
    }
    assert_int_equal(entries, 5);
    free(buf);
}

/* A journal of twice before checksums still reads, entry by entry, as before. */
static void test_journal_without_checksums_reads(void **state)
{
    struct fixture *f = *state;
    const char *ids[] = {"a", "bb", "ccc"};
    write_unchecked_journal(f->path, ids, 3);
    struct journal_reader *r = open_reader(f->path);
    assert_false(journal_reader_header(r)->entry_crc32c);
    assert_int_equal(journal_reader_header(r)->seed, 99);
    for (size_t i = 0; i < 3; i++)
        assert_string_equal(next_record(r)->message_id, ids[i]);
    assert_end(r, false);
    journal_reader_close(r);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Decodes buf until it is used up or an error; must never crash or overrun. */
static void decode_all(const uint8_t *buf, size_t len, bool crc)
{
    size_t off = 0;
    for (;;) {
        Twice__Journal__Entry *out = NULL;
        size_t used = 0;
        int rc = journal_decode_entry(buf + off, len - off, crc, &used, &out);
        assert_true(rc >= JOURNAL_ERR_CHECKSUM && rc <= 1);
        if (rc != 1)
            return;
        assert_true(used >= 1 && used <= len - off);
        twice__journal__entry__free_unpacked(out, NULL);
        off += used;
    }
}

static void test_garbage_never_crashes(void **state)
{
    (void)state;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint8_t *buf = malloc(1024);
    for (int round = 0; round < 20000; round++) {
        size_t len = rng_next(&seed) % 1024;
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rng_next(&seed);
        /* Half the rounds: small plausible prefixes, so bodies get parsed. */
        if (round % 2 == 0 && len > 0)
            buf[0] = (uint8_t)(len - 1 < 0x80 ? len - 1 : 0x7f);
        decode_all(buf, len, false);
        decode_all(buf, len, true);
    }
    free(buf);
}

/* Reads path to its end: the message ids of its records, in order, into ids (at most max),
 * and its damage.  Returns how many records. */
static size_t read_ids(const char *path, char ids[][32], size_t max,
                       struct journal_damage_summary *sum, struct journal_damage *first,
                       bool *truncated)
{
    struct journal_reader *r = open_reader(path);
    const Twice__Journal__Entry *e = NULL;
    size_t n = 0;
    while (journal_reader_next(r, &e) == 1) {
        assert_true(n < max);
        snprintf(ids[n++], 32, "%s", e->record->message_id);
    }
    assert_null(journal_reader_error(r));
    journal_reader_damage(r, sum);
    if (sum->stretches > 0)
        *first = *journal_reader_damage_at(r, 0);
    *truncated = journal_reader_truncated(r);
    journal_reader_close(r);
    return n;
}

/* Writes n full records; ends[i] is where record i ends (ends[0]: the header). */
static void write_records(const char *path, size_t n, size_t *ends)
{
    struct journal *j = open_journal(path);
    for (uint64_t i = 0; i < n; i++) {
        char id[32];
        struct journal_record rec = full_record(i, id, sizeof(id));
        journal_record(j, &rec);
    }
    journal_close(j);
    struct journal_reader *r = open_reader(path);
    ends[0] = journal_reader_offset(r);
    for (size_t i = 0; i < n; i++) {
        next_record(r);
        ends[i + 1] = journal_reader_offset(r);
    }
    journal_reader_close(r);
}

static void spill(const char *path, const uint8_t *buf, size_t size)
{
    FILE *fp = fopen(path, "wb");
    assert_int_equal(fwrite(buf, 1, size, fp), size);
    fclose(fp);
}

/* One byte changed anywhere after the header, in any of 8 records: the reader returns the 7
 * others, whole and in order, and names the damage: where the record starts, its length, one
 * record lost when its length prefix held.  (The last record's prefix made to claim more than
 * the file holds looks like a record cut short, and is reported so.) */
static void test_every_changed_byte_loses_one_record(void **state)
{
    struct fixture *f = *state;
    enum { N = 8 };
    size_t ends[N + 1];
    write_records(f->path, N, ends);
    size_t size = 0;
    uint8_t *buf = kit_read_path(f->path, &size);
    static const uint8_t flips[] = {0x01, 0x20, 0x80};
    for (size_t b = ends[0]; b < size; b++) {
        size_t k = 0;
        while (b >= ends[k + 1])
            k++;
        for (size_t x = 0; x < sizeof(flips); x++) {
            buf[b] ^= flips[x];
            spill(f->other, buf, size);
            buf[b] ^= flips[x];
            char ids[N][32];
            struct journal_damage_summary sum;
            struct journal_damage d;
            bool truncated = false;
            size_t n = read_ids(f->other, ids, N, &sum, &d, &truncated);
            assert_int_equal(n, N - 1);
            for (size_t i = 0, want = 0; i < n; i++, want++) {
                char id[32];
                want += want == k;
                snprintf(id, sizeof(id), "msg-%zu", want);
                assert_string_equal(ids[i], id);
            }
            if (k == N - 1 && truncated) {
                assert_int_equal(sum.stretches, 0);
                continue;
            }
            assert_int_equal(sum.stretches, 1);
            assert_int_equal(d.offset, ends[k]);
            assert_int_equal(d.bytes, ends[k + 1] - ends[k]);
            assert_true(d.records_lost == 1 || (d.records_lost == -1 && b < ends[k] + 2));
            assert_int_equal(d.resumed, k < N - 1);
        }
    }
    free(buf);
}

/* Bytes that belong to no record: garbage between two records is skipped and every record
 * read; a tail of zeros (a file whose last blocks never reached the disk) is damage to the
 * end, not a record cut short. */
static void test_garbage_between_records_and_zeros_at_the_end(void **state)
{
    struct fixture *f = *state;
    enum { N = 6 };
    size_t ends[N + 1];
    write_records(f->path, N, ends);
    size_t size = 0;
    uint8_t *buf = kit_read_path(f->path, &size);
    uint8_t *bad = malloc(size + 4096);
    uint64_t seed = 7;
    memcpy(bad, buf, ends[3]);
    for (size_t i = 0; i < 100; i++)
        bad[ends[3] + i] = (uint8_t)rng_next(&seed);
    memcpy(bad + ends[3] + 100, buf + ends[3], size - ends[3]);
    spill(f->other, bad, size + 100);
    char ids[N][32];
    struct journal_damage_summary sum;
    struct journal_damage d;
    bool truncated = false;
    assert_int_equal(read_ids(f->other, ids, N, &sum, &d, &truncated), N);
    assert_int_equal(sum.stretches, 1);
    assert_int_equal(d.offset, ends[3]);
    assert_int_equal(d.bytes, 100);
    assert_true(d.resumed);
    assert_false(truncated);

    memcpy(bad, buf, size);
    memset(bad + size, 0, 4096);
    spill(f->other, bad, size + 4096);
    assert_int_equal(read_ids(f->other, ids, N, &sum, &d, &truncated), N);
    assert_int_equal(sum.stretches, 1);
    assert_int_equal(d.offset, size);
    assert_int_equal(d.bytes, 4096);
    assert_int_equal(d.records_lost, -1);
    assert_false(d.resumed);
    assert_true(sum.stopped && sum.records_unknown);
    assert_false(truncated);
    free(bad);
    free(buf);
}

/* Damage in every other record of 40: each stretch counted, the first JOURNAL_DAMAGE_KEPT
 * kept, the other records all read. */
static void test_many_stretches_are_counted(void **state)
{
    struct fixture *f = *state;
    enum { N = 40 };
    size_t ends[N + 1];
    write_records(f->path, N, ends);
    size_t size = 0;
    uint8_t *buf = kit_read_path(f->path, &size);
    for (size_t k = 1; k < N; k += 2)
        buf[ends[k] + 3] ^= 0x40;
    spill(f->other, buf, size);
    char ids[N][32];
    struct journal_damage_summary sum;
    struct journal_damage d;
    bool truncated = false;
    assert_int_equal(read_ids(f->other, ids, N, &sum, &d, &truncated), N / 2);
    assert_int_equal(sum.stretches, N / 2);
    assert_int_equal(sum.records_lost, N / 2);
    assert_false(sum.records_unknown);
    struct journal_reader *r = open_reader(f->other);
    const Twice__Journal__Entry *e = NULL;
    while (journal_reader_next(r, &e) == 1)
        ;
    for (size_t i = 0; i < JOURNAL_DAMAGE_KEPT; i++)
        assert_int_equal(journal_reader_damage_at(r, i)->offset, ends[2 * i + 1]);
    assert_null(journal_reader_damage_at(r, JOURNAL_DAMAGE_KEPT));
    journal_reader_close(r);
    free(buf);
}

/* A journal without checksums stops at its damage: the records before it are read, and the
 * rest of the file is named as not read. */
static void test_damage_without_checksums_stops(void **state)
{
    struct fixture *f = *state;
    const char *ids3[] = {"a", "bb", "ccc"};
    write_unchecked_journal(f->path, ids3, 3);
    size_t size = 0;
    uint8_t *buf = kit_read_path(f->path, &size);
    /* The second record's first byte made one no protobuf field starts with.  (A length
     * prefix made larger than the rest of the file would read as a record cut short: without
     * checksums, nothing tells them apart.) */
    struct journal_reader *r = open_reader(f->path);
    next_record(r);
    size_t at = journal_reader_offset(r);
    journal_reader_close(r);
    buf[at + 1] = 0x07;
    spill(f->other, buf, size);
    char ids[3][32];
    struct journal_damage_summary sum;
    struct journal_damage d;
    bool truncated = false;
    assert_int_equal(read_ids(f->other, ids, 3, &sum, &d, &truncated), 1);
    assert_string_equal(ids[0], "a");
    assert_int_equal(sum.stretches, 1);
    assert_int_equal(d.offset, at);
    assert_int_equal(d.bytes, size - at);
    assert_false(d.resumed);
    assert_int_equal(d.records_lost, -1);
    free(buf);
}

/* Bit flips in a real journal: the reader returns entries, an end or an
 * error, never crashes. */
static void test_mutated_journal_never_crashes(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    char id[32];
    for (uint64_t i = 0; i < 30; i++) {
        struct journal_record rec = full_record(i, id, sizeof(id));
        journal_record(j, &rec);
    }
    journal_close(j);
    size_t size;
    uint8_t *orig = kit_read_path(f->path, &size), *buf = malloc(size);
    uint64_t seed = 42;
    for (int round = 0; round < 300; round++) {
        memcpy(buf, orig, size);
        for (int k = 0; k < 1 + round % 8; k++)
            buf[rng_next(&seed) % size] ^= (uint8_t)(1u << (rng_next(&seed) % 8));
        FILE *fp = fopen(f->other, "wb");
        fwrite(buf, 1, size, fp);
        fclose(fp);
        char err[256];
        struct journal_reader *r = journal_reader_open(f->other, err, sizeof(err));
        const Twice__Journal__Entry *e = NULL;
        while (r != NULL && journal_reader_next(r, &e) == 1)
            assert_non_null(e);
        journal_reader_close(r);
    }
    free(orig);
    free(buf);
}

/* Copies a FIFO to a file until the writer closes it. */
struct drain {
    int fd;
    const char *path;
};

/* ---- a file that holds something: modes, runs --------------------------------------------- */

/* journal_open_mode() on path; fails the test when it does not open. */
static struct journal *open_mode(const char *path, enum journal_mode mode,
                                 struct journal_found *found)
{
    struct journal_header_info h = test_header();
    char err[512] = "";
    struct journal *j = journal_open_mode(path, &h, NULL, mode, found, err, sizeof(err));
    if (j == NULL)
        fail_msg("journal_open_mode: %s", err);
    return j;
}

/* A run of n records with ids "<prefix>-i", ended with a stop record when `stop`. */
static void write_run(const char *path, enum journal_mode mode, const char *prefix, size_t n,
                      bool stop)
{
    struct journal *j = open_mode(path, mode, NULL);
    for (size_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "%s-%zu", prefix, i);
        struct journal_record rec = {.kind = JOURNAL_KIND_DELIVER, .session = 1, .message_id = id};
        journal_record(j, &rec);
    }
    if (stop) {
        struct journal_record rec = {.kind = JOURNAL_KIND_STOP};
        journal_record(j, &rec);
    }
    journal_close(j);
}

/* The default refuses a file that holds a run, names it and leaves it as it was; an empty
 * file is fine; something that is no journal is refused too. */
static void test_new_refuses_a_journal_that_holds_a_run(void **state)
{
    struct fixture *f = *state;
    write_run(f->path, JOURNAL_MODE_NEW, "a", 3, true);
    size_t size = 0;
    uint8_t *before = kit_read_path(f->path, &size);
    struct journal_header_info h = test_header();
    struct journal_found found;
    char err[512] = "";
    assert_null(journal_open_mode(f->path, &h, NULL, JOURNAL_MODE_NEW, &found, err, sizeof(err)));
    assert_true(found.refused);
    assert_int_equal(found.bytes, size);
    assert_int_equal(found.start_unix_ms, h.start_unix_ms);
    char want[512];
    snprintf(want, sizeof(want),
             "%s already holds a journal (%zu bytes, its first run started 2025-11-29T09:00:00Z)",
             f->path, size);
    assert_string_equal(err, want);
    assert_null(journal_open(f->path, &h, err, sizeof(err))); /* journal_open() is NEW too */
    size_t after_size = 0;
    uint8_t *after = kit_read_path(f->path, &after_size);
    assert_int_equal(after_size, size);
    assert_memory_equal(after, before, size);
    free(after);
    free(before);

    spill(f->path, (const uint8_t *)"", 0);
    journal_close(open_mode(f->path, JOURNAL_MODE_NEW, &found));
    assert_int_equal(found.bytes, 0);
    assert_false(found.refused);

    spill(f->path, (const uint8_t *)"hello\n", 6);
    assert_null(journal_open_mode(f->path, &h, NULL, JOURNAL_MODE_NEW, &found, err, sizeof(err)));
    snprintf(want, sizeof(want), "%s already holds something (6 bytes, not a journal)", f->path);
    assert_string_equal(err, want);

    /* A journal of a twice before checksums is a journal too. */
    const char *ids[] = {"x"};
    write_unchecked_journal(f->path, ids, 1);
    assert_null(journal_open_mode(f->path, &h, NULL, JOURNAL_MODE_NEW, &found, err, sizeof(err)));
    snprintf(want, sizeof(want),
             "%s already holds a journal (%zu bytes, its first run started 2025-11-29T09:00:00Z)",
             f->path, file_size(f->path));
    assert_string_equal(err, want);
}

/* Every entry of path: the ids of its records, "<header>" for each later run's header. */
static size_t read_entries(const char *path, char ids[][32], size_t max, uint64_t *runs,
                           uint64_t *unclean)
{
    struct journal_reader *r = open_reader(path);
    const Twice__Journal__Entry *e = NULL;
    size_t n = 0;
    while (journal_reader_next(r, &e) == 1) {
        assert_true(n < max);
        snprintf(ids[n++], 32, "%s",
                 e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER      ? "<header>"
                 : e->record->kind == TWICE__JOURNAL__RECORD__KIND__STOP ? "<stop>"
                                                                         : e->record->message_id);
    }
    assert_null(journal_reader_error(r));
    assert_false(journal_reader_truncated(r));
    struct journal_damage_summary sum;
    journal_reader_damage(r, &sum);
    assert_int_equal(sum.stretches, 0);
    *runs = journal_reader_runs(r);
    *unclean = journal_reader_unclean_runs(r);
    journal_reader_close(r);
    return n;
}

/* APPEND adds a run after the others, with its own header; the reader returns the header
 * between the runs, counts the runs and those that ended without a stop record. */
static void test_append_adds_a_run(void **state)
{
    struct fixture *f = *state;
    struct journal_found found;
    write_run(f->path, JOURNAL_MODE_APPEND, "a", 2, false); /* a new file: one run */
    size_t size = file_size(f->path);
    journal_close(open_mode(f->path, JOURNAL_MODE_APPEND, &found)); /* killed before a record */
    assert_int_equal(found.bytes, size);
    assert_int_equal(found.cut_short, 0);
    assert_false(found.refused);
    write_run(f->path, JOURNAL_MODE_APPEND, "c", 2, true);
    char ids[16][32];
    uint64_t runs = 0, unclean = 0;
    size_t n = read_entries(f->path, ids, 16, &runs, &unclean);
    const char *want[] = {"a-0", "a-1", "<header>", "<header>", "c-0", "c-1", "<stop>"};
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(ids[i], want[i]);
    assert_int_equal(runs, 3);
    assert_int_equal(unclean, 2);
    /* The last run's header is a header like the first. */
    struct journal_reader *r = open_reader(f->path);
    const Twice__Journal__Entry *e = NULL;
    for (int i = 0; i < 4; i++)
        assert_int_equal(journal_reader_next(r, &e), 1);
    assert_int_equal(e->body_case, TWICE__JOURNAL__ENTRY__BODY_HEADER);
    assert_int_equal(e->header->seed, test_header().seed);
    assert_true(e->header->entry_crc32c);
    assert_int_equal(journal_reader_runs(r), 3);
    journal_reader_close(r);
    /* OVERWRITE leaves one run. */
    write_run(f->path, JOURNAL_MODE_OVERWRITE, "d", 1, true);
    n = read_entries(f->path, ids, 16, &runs, &unclean);
    assert_int_equal(n, 2);
    assert_string_equal(ids[0], "d-0");
    assert_int_equal(runs, 1);
    assert_int_equal(unclean, 0);
}

/* A run killed inside a write leaves its last entry cut short: APPEND cuts it off, at every
 * length it can have, so that the next run's header follows a whole entry and the journal
 * reads undamaged; a file that is only a header cut short holds no run and is emptied. */
static void test_append_cuts_off_a_last_entry_cut_short(void **state)
{
    struct fixture *f = *state;
    enum { N = 3 };
    size_t ends[N + 1];
    write_records(f->path, N, ends);
    size_t size = 0;
    uint8_t *whole = kit_read_path(f->path, &size);
    assert_int_equal(size, ends[N]);
    for (size_t cut = ends[N - 1] + 1; cut < ends[N]; cut++) {
        spill(f->other, whole, cut);
        assert_int_equal(journal_tail_cut_short(whole, cut), cut - ends[N - 1]);
        struct journal_found found;
        journal_close(open_mode(f->other, JOURNAL_MODE_APPEND, &found));
        assert_int_equal(found.bytes, cut);
        assert_int_equal(found.cut_short, cut - ends[N - 1]);
        char ids[8][32];
        uint64_t runs = 0, unclean = 0;
        assert_int_equal(read_entries(f->other, ids, 8, &runs, &unclean), N);
        assert_string_equal(ids[N - 1], "<header>");
        assert_int_equal(runs, 2);
    }
    /* Whole: nothing to cut; zeros after the last entry are damage, not a cut-short entry. */
    assert_int_equal(journal_tail_cut_short(whole, size), 0);
    uint8_t *zeros = calloc(1, size + 64);
    memcpy(zeros, whole, size);
    assert_int_equal(journal_tail_cut_short(zeros, size + 64), 0);
    free(zeros);
    for (size_t cut = 1; cut < ends[0]; cut++) {
        spill(f->other, whole, cut);
        struct journal_found found;
        journal_close(open_mode(f->other, JOURNAL_MODE_APPEND, &found));
        assert_int_equal(found.cut_short, cut);
        assert_int_equal(file_size(f->other), ends[0]);
    }
    free(whole);
}

/* APPEND to what twice could not read on: no journal, or one without checksums. */
static void test_append_refuses_what_is_not_a_journal(void **state)
{
    struct fixture *f = *state;
    struct journal_header_info h = test_header();
    char err[512] = "";
    spill(f->path, (const uint8_t *)"\x05hello world", 12);
    assert_null(journal_open_mode(f->path, &h, NULL, JOURNAL_MODE_APPEND, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, f->path));
    assert_non_null(strstr(err, "cannot append to it"));
    assert_non_null(strstr(err, "move it away, or overwrite it"));
    assert_int_equal(file_size(f->path), 12);
    const char *ids[] = {"x"};
    write_unchecked_journal(f->path, ids, 1);
    size_t size = file_size(f->path);
    assert_null(journal_open_mode(f->path, &h, NULL, JOURNAL_MODE_APPEND, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "a journal of a twice before checksums"));
    assert_int_equal(file_size(f->path), size);
}

/* One twice per journal: a second open of an open journal is refused, whatever its mode. */
static void test_an_open_journal_is_locked(void **state)
{
    struct fixture *f = *state;
    struct journal *j = open_journal(f->path);
    struct journal_header_info h = test_header();
    char err[512] = "";
    for (int mode = JOURNAL_MODE_NEW; mode <= JOURNAL_MODE_OVERWRITE; mode++) {
        assert_null(
            journal_open_mode(f->path, &h, NULL, (enum journal_mode)mode, NULL, err, sizeof(err)));
        assert_non_null(strstr(err, "in use by another twice"));
    }
    journal_close(j);
    journal_close(open_mode(f->path, JOURNAL_MODE_APPEND, NULL));
}

static void *drain_main(void *arg)
{
    struct drain *d = arg;
    FILE *out = fopen(d->path, "wb");
    char buf[65536];
    ssize_t n;
    while (out != NULL && (n = read(d->fd, buf, sizeof(buf))) != 0) {
        if (n > 0)
            fwrite(buf, 1, (size_t)n, out);
        else if (errno == EAGAIN || errno == EINTR)
            usleep(1000);
        else
            break;
    }
    if (out != NULL)
        fclose(out);
    return NULL;
}

/* A disk that does not move (a FIFO nobody reads): journal_record() keeps
 * returning, records past JOURNAL_BUFFER_CAP are dropped and counted, and
 * every record kept is written once the disk moves again. */
static void test_stuck_disk_drops_not_blocks(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(mkfifo(f->other, 0600), 0);
    int rfd = open(f->other, O_RDONLY | O_NONBLOCK);
    assert_true(rfd >= 0);
    struct journal *j = open_journal(f->other);
    char *detail = malloc(JOURNAL_FIELD_MAX + 1);
    memset(detail, 'd', JOURNAL_FIELD_MAX);
    detail[JOURNAL_FIELD_MAX] = '\0';
    struct journal_record rec = {.kind = JOURNAL_KIND_FAULT, .detail = detail};
    /* The writer, blocked on the pipe, may hold a buffer it swapped out (a slow thread swaps
     * a larger one), beside the queued one of at most JOURNAL_BUFFER_CAP: records are written
     * until one is dropped, which must come before both buffers are full. */
    const uint64_t most = 2 * (JOURNAL_BUFFER_CAP / JOURNAL_FIELD_MAX) + 2000;
    uint64_t n = 0;
    while (n < most && journal_dropped(j) == 0) {
        journal_record(j, &rec);
        n++;
    }
    assert_true(journal_dropped(j) > 0);
    assert_int_equal(journal_records(j) + journal_dropped(j), n);

    struct drain d = {.fd = rfd, .path = f->path};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, drain_main, &d), 0);
    uint64_t kept = journal_records(j);
    journal_close(j);
    pthread_join(t, NULL);
    close(rfd);
    struct journal_reader *r = open_reader(f->path);
    const Twice__Journal__Entry *e = NULL;
    while (journal_reader_next(r, &e) == 1)
        assert_string_equal(e->record->detail, detail);
    assert_null(journal_reader_error(r));
    assert_false(journal_reader_truncated(r));
    assert_int_equal(journal_reader_count(r), kept);
    journal_reader_close(r);
    free(detail);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_field_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_strings_and_time_stamp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rules_change_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strings_are_cleaned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_records_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flushes_every_interval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_record_is_written_before_it_returns, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_flush_interval_is_the_one_given, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_journal_ends_cleanly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
        cmocka_unit_test(test_writer_open_errors),
        cmocka_unit_test(test_entry_size_limit),
        cmocka_unit_test_setup_teardown(test_oversized_record_in_file, setup, teardown),
        cmocka_unit_test(test_decode_at_every_split),
        cmocka_unit_test(test_varint_prefix),
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test_setup_teardown(test_entries_end_with_their_checksum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal_without_checksums_reads, setup, teardown),
        cmocka_unit_test(test_garbage_never_crashes),
        cmocka_unit_test(test_record_encoding_matches_protobuf_c),
        cmocka_unit_test_setup_teardown(test_mutated_journal_never_crashes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_changed_byte_loses_one_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_between_records_and_zeros_at_the_end, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_many_stretches_are_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damage_without_checksums_stops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stuck_disk_drops_not_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_refuses_a_journal_that_holds_a_run, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_append_adds_a_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_cuts_off_a_last_entry_cut_short, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_append_refuses_what_is_not_a_journal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_open_journal_is_locked, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
