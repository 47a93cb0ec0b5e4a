/*
 * damage.c - a damaged journal, as both commands say it.  See damage.h.
 */
#include "offline/damage.h"

#include <string.h>

#include "offline/json_out.h"

void damage_report_take(struct damage_report *d, const struct journal_reader *r)
{
    memset(d, 0, sizeof(*d));
    journal_reader_damage(r, &d->sum);
    for (size_t i = 0; i < JOURNAL_DAMAGE_KEPT; i++) {
        const struct journal_damage *x = journal_reader_damage_at(r, i);
        if (x == NULL)
            break;
        d->list[i] = *x;
    }
    d->checksums = journal_reader_header(r)->entry_crc32c;
}

bool damage_any(const struct damage_report *d)
{
    return d->sum.stretches > 0;
}

static const char *plural(uint64_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* "1 record lost", "records lost: not known", "3 records lost and more not known". */
static void print_lost_text(FILE *out, uint64_t known, bool unknown)
{
    if (known > 0)
        fprintf(out, "%llu %s lost%s", (unsigned long long)known,
                plural(known, "record", "records"), unknown ? " and more not known" : "");
    else
        fputs(unknown ? "records lost: not known" : "no record lost", out);
}

static void print_stretch_text(FILE *out, const struct damage_report *d,
                               const struct journal_damage *x)
{
    fprintf(out, "  at offset %llu: %s: ", (unsigned long long)x->offset,
            journal_strerror(x->reason));
    if (!d->checksums) {
        fprintf(out,
                "the %llu %s from there to the end are not read: this journal's entries carry "
                "no checksum (a twice before them wrote it), so no record after the damage can "
                "be told from garbage\n",
                (unsigned long long)x->bytes, plural(x->bytes, "byte", "bytes"));
        return;
    }
    fprintf(out, "%llu %s skipped (", (unsigned long long)x->bytes,
            plural(x->bytes, "byte", "bytes"));
    print_lost_text(out, x->records_lost > 0 ? (uint64_t)x->records_lost : 0, x->records_lost < 0);
    if (x->resumed)
        fprintf(out, "), read on from offset %llu\n", (unsigned long long)(x->offset + x->bytes));
    else
        fputs("), to the end of the file\n", out);
}

void damage_print_text(FILE *out, const struct damage_report *d, const char *level)
{
    if (!damage_any(d))
        return;
    fprintf(out, "%s: the journal is damaged: %llu %s, %llu %s skipped, ", level,
            (unsigned long long)d->sum.stretches, plural(d->sum.stretches, "stretch", "stretches"),
            (unsigned long long)d->sum.bytes, plural(d->sum.bytes, "byte", "bytes"));
    print_lost_text(out, d->sum.records_lost, d->sum.records_unknown);
    fputs("; the records around the damage are counted\n", out);
    uint64_t shown =
        d->sum.stretches < JOURNAL_DAMAGE_KEPT ? d->sum.stretches : JOURNAL_DAMAGE_KEPT;
    for (uint64_t i = 0; i < shown; i++)
        print_stretch_text(out, d, &d->list[i]);
    if (shown < d->sum.stretches)
        fprintf(out, "  and %llu more %s\n", (unsigned long long)(d->sum.stretches - shown),
                plural(d->sum.stretches - shown, "stretch", "stretches"));
}

void damage_print_json(FILE *out, const struct damage_report *d)
{
    if (!damage_any(d)) {
        fputs("null", out);
        return;
    }
    fprintf(out,
            "{\"stretches\": %llu, \"bytes_skipped\": %llu, \"records_lost\": %llu, "
            "\"records_lost_unknown\": %s, \"checksums\": %s, \"list\": [",
            (unsigned long long)d->sum.stretches, (unsigned long long)d->sum.bytes,
            (unsigned long long)d->sum.records_lost, d->sum.records_unknown ? "true" : "false",
            d->checksums ? "true" : "false");
    uint64_t shown =
        d->sum.stretches < JOURNAL_DAMAGE_KEPT ? d->sum.stretches : JOURNAL_DAMAGE_KEPT;
    for (uint64_t i = 0; i < shown; i++) {
        const struct journal_damage *x = &d->list[i];
        fprintf(out, "%s{\"offset\": %llu, \"bytes\": %llu, \"records_lost\": ", i > 0 ? ", " : "",
                (unsigned long long)x->offset, (unsigned long long)x->bytes);
        if (x->records_lost < 0)
            fputs("null", out);
        else
            fprintf(out, "%lld", (long long)x->records_lost);
        fputs(", \"reason\": ", out);
        json_write_string(out, journal_strerror(x->reason));
        fprintf(out, ", \"read_on\": %s}", x->resumed ? "true" : "false");
    }
    fputs("]}", out);
}
