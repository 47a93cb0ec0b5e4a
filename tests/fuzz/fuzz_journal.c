/*
 * fuzz_journal.c - libFuzzer harness for the journal reader (offline/journal_reader.c) and the
 * two commands that read journals a user hands them, `twice report` and `twice verdict`
 * (offline/report.c, offline/verdict.c).  Not part of the default build (scripts/fuzz.sh builds
 * and runs it):
 *
 *     protoc-c --proto_path=. --c_out=GEN proto/journal/journal.proto
 *     clang -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -I. -IGEN \
 *         tests/fuzz/fuzz_journal.c proto/ *.c rules/ *.c offline/ *.c \
 *         GEN/proto/journal/journal.pb-c.c -ljansson -lprotobuf-c
 *
 * Seeds are journals written by a real twice (tests/fuzz/corpus/journal/; nocrc-*.pb by one
 * before entries carried their checksum; runs.pb holds two runs, the rules changed in the
 * second).  The input is the
 * content of a journal file: the reader opens it by path, so it is written to a memfd and opened
 * as /proc/self/fd/N.  The same bytes also go through the span decoder, entry by entry.
 *
 * Invariants are checked with abort(): the span decoder never consumes past its input, asks for
 * more on every strict prefix of an entry, and re-encodes what it decoded to a fixed point; the
 * file reader agrees with it on the header and the entries it read whole, names damage where it
 * stopped, reads on past damage only in a journal with checksums, and accounts for every byte
 * (read, skipped as damage, or a last entry cut short); `report` and `verdict` succeed exactly
 * when the header reads (one known exception: check_report_code()), and their --json output is
 * valid JSON; journal_utf8_char_len() agrees with a plain UTF-8 decoder.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "offline/journal_reader.h"
#include "offline/report.h"
#include "offline/verdict.h"

/* Effect lines written for `verdict`: enough to double a few messages. */
#define FZ_EFFECTS_MAX 64

struct fz_file {
    int fd;
    char path[64];
};

static struct fz_file fz_journal, fz_effects;
static FILE *fz_devnull;
/* Command lines are char *[]: their words must be writable. */
static char arg_report[] = "report", arg_verdict[] = "verdict", arg_json[] = "--json",
            arg_journal[] = "--journal", arg_effects[] = "--effects", arg_messages[] = "--messages",
            arg_require[] = "--require=overlap,window=1s", arg_stall[] = "--stall-after=1ms";

/* Failed invariants name themselves: the reproducer's log says which one. */
#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

static void fz_file_open(struct fz_file *f, const char *name)
{
    f->fd = memfd_create(name, 0);
    CHECK(f->fd >= 0);
    snprintf(f->path, sizeof(f->path), "/proc/self/fd/%d", f->fd);
}

static void fz_file_set(const struct fz_file *f, const void *p, size_t len)
{
    CHECK(ftruncate(f->fd, 0) == 0);
    size_t off = 0;
    while (off < len) {
        ssize_t n = pwrite(f->fd, (const char *)p + off, len - off, (off_t)off);
        CHECK(n > 0);
        off += (size_t)n;
    }
}

/* What the span decoder makes of the whole input. */
struct walk {
    size_t entries; /* decoded, the header included */
    size_t offset;  /* bytes consumed by them */
    int rc;         /* 0: stopped for want of bytes (or at the end); else the error */
    bool header_ok; /* the first entry is a version-1 header */
    bool crc;       /* its entries end with their checksum (the header's entry_crc32c) */
    bool no_copy;   /* some entry does not survive protobuf-c's pack and unpack */
    char message_id[128];
};

/* Fields a newer writer added, kept by protobuf-c and written back as they came. */
static bool has_unknown_fields(const Twice__Journal__Entry *e)
{
    if (e->base.n_unknown_fields > 0)
        return true;
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER)
        return e->header->base.n_unknown_fields > 0;
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD)
        return e->record->base.n_unknown_fields > 0;
    return false;
}

/* Re-encodes e: the size is announced right, and decoding the encoding gives it back.  Returns
 * false when it does not, which only an entry with unknown fields may do: protobuf-c 1.4
 * accepts field number 0 in an overlong tag (0x82 0x00), writes it back as 0x02, and refuses
 * that. */
static bool check_round_trip(const Twice__Journal__Entry *e)
{
    size_t need = journal_entry_encoded_size(e), written = 0;
    uint8_t *buf = malloc(need);
    CHECK(buf != NULL);
    if (need > 0)
        CHECK(journal_encode_entry(e, buf, need - 1, &written) == JOURNAL_ERR_SPACE);
    int rc = journal_encode_entry(e, buf, need, &written);
    if (rc == JOURNAL_ERR_TOO_LARGE) {
        free(buf);
        return true;
    }
    CHECK(rc == 0 && written == need);
    Twice__Journal__Entry *again = NULL;
    size_t used = 0;
    if (journal_decode_entry(buf, need, true, &used, &again) != 1) {
        CHECK(has_unknown_fields(e));
        free(buf);
        return false;
    }
    CHECK(used == need);
    CHECK(journal_entry_encoded_size(again) == need);
    uint8_t *buf2 = malloc(need);
    CHECK(buf2 != NULL);
    CHECK(journal_encode_entry(again, buf2, need, &written) == 0 && written == need);
    CHECK(memcmp(buf, buf2, need) == 0);
    twice__journal__entry__free_unpacked(again, NULL);
    free(buf2);
    free(buf);
    return true;
}

static void walk_note(struct walk *w, const Twice__Journal__Entry *e)
{
    if (w->entries == 0)
        w->header_ok = e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER &&
                       e->header->version == JOURNAL_FORMAT_VERSION;
    if (w->message_id[0] == '\0' && e->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD &&
        e->record->message_id[0] != '\0')
        snprintf(w->message_id, sizeof(w->message_id), "%s", e->record->message_id);
}

/* The first entry: with its checksum, else (a journal of twice before checksums) without; a
 * header read that way that says it has them is damaged.  Sets w->crc. */
static int walk_first(const uint8_t *p, size_t len, struct walk *w, size_t *used,
                      Twice__Journal__Entry **e)
{
    int rc = journal_decode_entry(p, len, true, used, e);
    if (rc == JOURNAL_ERR_CHECKSUM || rc == JOURNAL_ERR_DECODE) {
        rc = journal_decode_entry(p, len, false, used, e);
        if (rc == 1 && (*e)->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER &&
            (*e)->header->entry_crc32c) {
            twice__journal__entry__free_unpacked(*e, NULL);
            return JOURNAL_ERR_CHECKSUM;
        }
    }
    w->crc = rc == 1 && (*e)->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER &&
             (*e)->header->entry_crc32c;
    return rc;
}

static void walk_spans(const uint8_t *p, size_t len, struct walk *w)
{
    memset(w, 0, sizeof(*w));
    for (;;) {
        Twice__Journal__Entry *e = NULL;
        size_t used = 0;
        int rc = w->entries == 0
                     ? walk_first(p, len, w, &used, &e)
                     : journal_decode_entry(p + w->offset, len - w->offset, w->crc, &used, &e);
        CHECK(rc <= 1 && rc >= JOURNAL_ERR_CHECKSUM);
        if (rc <= 0) {
            w->rc = rc;
            return;
        }
        CHECK(used > 0 && used <= len - w->offset);
        /* Strict prefixes of a whole entry ask for more. */
        Twice__Journal__Entry *none = NULL;
        size_t none_used = 0;
        CHECK(journal_decode_entry(p + w->offset, used - 1, w->crc, &none_used, &none) == 0);
        CHECK(journal_decode_entry(p + w->offset, used / 2, w->crc, &none_used, &none) == 0);
        CHECK(none == NULL);
        if (!check_round_trip(e))
            w->no_copy = true;
        walk_note(w, e);
        twice__journal__entry__free_unpacked(e, NULL);
        w->entries++;
        w->offset += used;
    }
}

/* The stretches of damage the reader names lie in the file, in order, after the entries the
 * span decoder read whole, and add up to its summary. */
static void check_damage(const struct journal_reader *r, size_t len, const struct walk *w)
{
    struct journal_damage_summary sum;
    journal_reader_damage(r, &sum);
    uint64_t bytes = 0, next = w->offset;
    for (size_t i = 0; i < sum.stretches && i < JOURNAL_DAMAGE_KEPT; i++) {
        const struct journal_damage *d = journal_reader_damage_at(r, i);
        CHECK(d != NULL && d->bytes > 0 && d->offset >= next && d->offset + d->bytes <= len);
        CHECK(d->records_lost == 1 || d->records_lost == -1);
        CHECK(d->reason == JOURNAL_ERR_VARINT || d->reason == JOURNAL_ERR_TOO_LARGE ||
              d->reason == JOURNAL_ERR_CHECKSUM || d->reason == JOURNAL_ERR_DECODE ||
              d->reason == JOURNAL_ERR_PAST_END);
        CHECK(d->resumed == (i + 1 < sum.stretches || !sum.stopped));
        bytes += d->bytes;
        next = d->offset + d->bytes;
    }
    CHECK(sum.stretches > JOURNAL_DAMAGE_KEPT || bytes == sum.bytes);
    CHECK(journal_reader_damage_at(r, sum.stretches) == NULL);
    /* The span decoder stopped at the first damage, or at bytes that make no whole entry. */
    if (w->rc < 0)
        CHECK(sum.stretches > 0 && journal_reader_damage_at(r, 0)->offset == w->offset);
    if (w->rc == 0 && w->offset == len)
        CHECK(sum.stretches == 0);
}

/* The file reader must see what the span decoder saw, and read on past damage only in a
 * journal with checksums. */
static void check_reader(size_t len, const struct walk *w)
{
    char err[512];
    struct journal_reader *r = journal_reader_open(fz_journal.path, err, sizeof(err));
    bool opens = w->entries > 0 && w->header_ok;
    CHECK((r != NULL) == opens);
    if (r == NULL) {
        CHECK(strlen(err) > 0);
        return;
    }
    CHECK(journal_reader_header(r) != NULL);
    const Twice__Journal__Entry *e;
    int rc;
    while ((rc = journal_reader_next(r, &e)) == 1)
        CHECK(e != NULL);
    /* Damage is not an error: only I/O and memory are, and neither fails here. */
    CHECK(rc == 0 && journal_reader_error(r) == NULL);
    CHECK(journal_reader_next(r, &e) == 0);
    CHECK(journal_reader_count(r) >= w->entries - 1);
    CHECK(w->crc || journal_reader_count(r) == w->entries - 1);
    struct journal_damage_summary sum;
    journal_reader_damage(r, &sum);
    if (journal_reader_truncated(r))
        CHECK(journal_reader_offset(r) < len);
    else
        CHECK(journal_reader_offset(r) == len);
    if (sum.stretches == 0) {
        CHECK(journal_reader_count(r) == w->entries - 1);
        CHECK(journal_reader_offset(r) == w->offset);
        CHECK(journal_reader_truncated(r) == (w->offset < len));
    }
    check_damage(r, len, w);
    journal_reader_close(r);
}

/* Runs a command with its output in memory; with `json`, the output must parse.  Integers are
 * read as reals: report.c prints uint64 values (the seed, times) as bare JSON numbers, and one
 * above INT64_MAX makes jansson refuse the whole document (tests/fuzz/findings/
 * journal-u64-json.bin).  Read integers as integers again (flags JSON_ALLOW_NUL only) once
 * that is fixed. */
static int fz_run(int (*run)(int, char **, FILE *, FILE *), int argc, char **argv, bool json)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    CHECK(out != NULL);
    int code = run(argc, argv, out, fz_devnull);
    fclose(out);
    if (json && code != 2) {
        json_error_t jerr;
        json_t *doc = json_loadb(buf, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
        CHECK(doc != NULL && json_is_object(doc));
        json_decref(doc);
    }
    free(buf);
    return code;
}

/* `report` succeeds exactly when the journal's header reads, except that it copies the header and
 * the records it keeps by packing and unpacking them, and calls a failed copy "out of memory"
 * (tests/fuzz/findings/journal-report-copy.bin): when an entry does not survive that, the report
 * may fail on a journal the reader reads. */
static void check_report_code(int code, const struct walk *w)
{
    bool reads = w->entries > 0 && w->header_ok;
    CHECK(code == 0 || code == 2);
    CHECK(code == 0 ? reads : !reads || w->no_copy);
}

static void check_report(const struct walk *w)
{
    char *message = malloc(strlen(w->message_id) + 16);
    CHECK(message != NULL);
    sprintf(message, "--message=%s", w->message_id);
    char *text[] = {arg_report, fz_journal.path, NULL};
    char *json[] = {arg_report, fz_journal.path, arg_json, NULL};
    char *all[] = {arg_report, fz_journal.path, arg_messages, arg_json, NULL};
    char *one[] = {arg_report, fz_journal.path, message, arg_json, NULL};
    check_report_code(fz_run(report_run, 2, text, false), w);
    check_report_code(fz_run(report_run, 3, json, true), w);
    check_report_code(fz_run(report_run, 4, all, true), w);
    all[3] = NULL;
    check_report_code(fz_run(report_run, 3, all, false), w);
    if (w->message_id[0] != '\0') {
        check_report_code(fz_run(report_run, 4, one, true), w);
        one[3] = NULL;
        check_report_code(fz_run(report_run, 3, one, false), w);
    }
    free(message);
}

/* Effects: every record's message id once, so that a message delivered twice has two. */
static void write_effects(const uint8_t *p, size_t len, const struct walk *w)
{
    char *buf = NULL;
    size_t n = 0, off = 0, lines = 0;
    FILE *f = open_memstream(&buf, &n);
    CHECK(f != NULL);
    fputs("# effects\n\n", f);
    for (size_t k = 0; k < w->entries && lines < FZ_EFFECTS_MAX; k++) {
        Twice__Journal__Entry *e = NULL;
        size_t used = 0;
        CHECK(journal_decode_entry(p + off, len - off, k > 0 && w->crc, &used, &e) == 1);
        if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD &&
            e->record->message_id[0] != '\0') {
            fprintf(f, " %s\r\n", e->record->message_id);
            lines++;
        }
        twice__journal__entry__free_unpacked(e, NULL);
        off += used;
    }
    fclose(f);
    fz_file_set(&fz_effects, buf, n);
    free(buf);
}

static void check_verdict(const uint8_t *p, size_t len, const struct walk *w)
{
    bool reads = w->entries > 0 && w->header_ok;
    write_effects(p, len, w);
    char *text[] = {arg_verdict, arg_journal, fz_journal.path, arg_effects, fz_effects.path, NULL};
    char *json[] = {arg_verdict, arg_journal, fz_journal.path, arg_effects, fz_effects.path,
                    arg_json,    NULL};
    char *strict[] = {arg_verdict, arg_journal, fz_journal.path, arg_effects, fz_effects.path,
                      arg_require, arg_stall,   arg_json,        NULL};
    int code = fz_run(verdict_run, 5, text, false);
    CHECK(code >= 0 && code <= VERDICT_EXIT_DAMAGED);
    CHECK((code != VERDICT_EXIT_ERROR) == reads);
    CHECK(fz_run(verdict_run, 6, json, true) == code);
    /* the requirements can only add a reason to fail, never take one away */
    int strict_code = fz_run(verdict_run, 8, strict, true);
    CHECK((strict_code != VERDICT_EXIT_ERROR) == reads);
    CHECK(code == 0 || strict_code == code || (code == VERDICT_EXIT_STALLED && strict_code != 0));
}

/* A plain decoder: the length of the valid UTF-8 character at p, 0 if none. */
static size_t utf8_len(const uint8_t *p)
{
    uint32_t c;
    size_t n;
    if (p[0] < 0x80)
        return 1;
    if (p[0] >> 5 == 6)
        c = p[0] & 0x1f, n = 2;
    else if (p[0] >> 4 == 14)
        c = p[0] & 0x0f, n = 3;
    else if (p[0] >> 3 == 30)
        c = p[0] & 0x07, n = 4;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if (p[i] >> 6 != 2)
            return 0;
        c = c << 6 | (p[i] & 0x3f);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    return n;
}

static void check_utf8(const uint8_t *data, size_t size)
{
    uint8_t *s = malloc(size + 1);
    CHECK(s != NULL);
    memcpy(s, data, size);
    s[size] = '\0';
    for (size_t i = 0; i < size; i++)
        CHECK(journal_utf8_char_len(s + i) == utf8_len(s + i));
    free(s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_file_open(&fz_journal, "fuzz-journal");
    fz_file_open(&fz_effects, "fuzz-effects");
    fz_devnull = fopen("/dev/null", "w");
    CHECK(fz_devnull != NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy: a read past `size` is caught. */
    uint8_t *p = malloc(size == 0 ? 1 : size);
    CHECK(p != NULL);
    memcpy(p, data, size);
    struct walk w;
    walk_spans(p, size, &w);
    fz_file_set(&fz_journal, p, size);
    check_reader(size, &w);
    check_report(&w);
    check_verdict(p, size, &w);
    check_utf8(p, size);
    free(p);
    return 0;
}
