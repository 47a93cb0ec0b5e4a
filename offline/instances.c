/*
 * instances.c - several journals read together.  See instances.h.
 */
#include "offline/instances.h"

#include <stdlib.h>
#include <string.h>

#include "offline/json_out.h"

static int change_cmp(const void *a, const void *b)
{
    const struct change *x = a, *y = b;
    return x->time_us < y->time_us ? -1 : x->time_us > y->time_us;
}

/* Moves every change of src[0..n) into dst (zeroed first), sums their counts, and sorts the
 * changes by time.  src is left empty (freeable).  -1 when out of memory (dst freeable). */
static int changes_sum(struct changes *dst, struct changes *src, size_t n)
{
    memset(dst, 0, sizeof(*dst));
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += src[i].n;
    dst->list = malloc((total != 0 ? total : 1) * sizeof(*dst->list));
    if (dst->list == NULL)
        return -1;
    dst->cap = total != 0 ? total : 1;
    for (size_t i = 0; i < n; i++) {
        if (src[i].n > 0)
            memcpy(dst->list + dst->n, src[i].list, src[i].n * sizeof(*dst->list));
        dst->n += src[i].n;
        src[i].n = 0; /* moved: the strings are dst's now */
        dst->count += src[i].count;
        for (size_t k = 0; k < CHANGES_CODES; k++)
            dst->by_code[k] += src[i].by_code[k];
        dst->faults_off_us += src[i].faults_off_us;
        dst->runs += src[i].runs;
    }
    if (dst->n > 1)
        qsort(dst->list, dst->n, sizeof(*dst->list), change_cmp);
    return 0;
}

/* Feeds one entry of journal `src`.  0, or -1 when out of memory. */
static int feed_entry(const struct instances_feed *feed, struct changes *ch, size_t src,
                      const Twice__Journal__Entry *e)
{
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER) {
        changes_add_header(&ch[src], e->header);
        return feed->header(feed->ctx, src, e->header, false);
    }
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD)
        return feed->record(feed->ctx, src, e->record) == 0 &&
                       changes_add_record(&ch[src], e->record) == 0
                   ? 0
                   : -1;
    return 0; /* a body a newer writer added */
}

int instances_read(struct journal_set *s, const struct instances_feed *feed,
                   struct changes *changes, char *err, size_t errlen)
{
    size_t n = journal_set_count(s);
    struct changes *ch = calloc(n != 0 ? n : 1, sizeof(*ch));
    int rc = ch != NULL ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        changes_add_header(&ch[i], journal_set_info(s, i)->header);
        rc = feed->header(feed->ctx, i, journal_set_info(s, i)->header, true);
    }
    size_t src = 0;
    const Twice__Journal__Entry *e = NULL;
    int got = 0;
    while (rc == 0 && (got = journal_set_next(s, &src, &e, err, errlen)) == 1)
        rc = feed_entry(feed, ch, src, e);
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
    journal_set_finish(s);
    for (size_t i = 0; ch != NULL && i < n; i++)
        changes_finish(&ch[i]);
    if (rc == 0 && got == 0 && changes_sum(changes, ch, n) != 0) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    for (size_t i = 0; ch != NULL && i < n; i++)
        changes_free(&ch[i]);
    free(ch);
    return rc != 0 || got < 0 ? -1 : 0;
}

/* How journal `in` ended, in words. */
static const char *ending(const struct journal_info *in)
{
    if (damage_any(&in->damage))
        return "damaged";
    if (in->truncated)
        return "last record cut short";
    return in->clean_stop ? "stop" : "no clean stop";
}

void instances_print_text(FILE *out, const struct journal_set *s)
{
    size_t n = journal_set_count(s);
    if (n < 2)
        return;
    fprintf(out,
            "journals  %zu, read together (merged by time; a message is one message "
            "across instances)\n",
            n);
    fprintf(out, "  %-20s  %8s  %4s  %-21s  %s\n", "INSTANCE", "RECORDS", "RUNS", "ENDED",
            "JOURNAL");
    for (size_t i = 0; i < n; i++) {
        const struct journal_info *in = journal_set_info(s, i);
        fputs("  ", out);
        int w = text_write_safe(out, in->instance);
        fprintf(out, "%*s  %8llu  %4llu  %-21s  ", w < 20 ? 20 - w : 0, "",
                (unsigned long long)in->records, (unsigned long long)in->runs, ending(in));
        text_write_safe(out, in->path);
        fputc('\n', out);
    }
}

void instances_print_json(FILE *out, const struct journal_set *s, const char *indent)
{
    fprintf(out, ",%s\"journals\": [", indent);
    for (size_t i = 0; i < journal_set_count(s); i++) {
        const struct journal_info *in = journal_set_info(s, i);
        fprintf(out, "%s%s  {\"path\": ", i > 0 ? "," : "", indent);
        json_write_string(out, in->path);
        fputs(", \"instance\": ", out);
        json_write_string(out, in->instance);
        fprintf(out,
                ", \"seed\": \"%llu\", \"records\": %llu, \"runs\": %llu, \"truncated\": %s, "
                "\"clean_stop\": %s, \"damage\": ",
                (unsigned long long)in->header->seed, (unsigned long long)in->records,
                (unsigned long long)in->runs, in->truncated ? "true" : "false",
                in->clean_stop ? "true" : "false");
        damage_print_json(out, &in->damage);
        fputc('}', out);
    }
    fprintf(out, "%s]", indent);
}

void instances_print_damage(FILE *out, const struct journal_set *s,
                            const struct damage_report *total, const char *level)
{
    if (journal_set_count(s) < 2) {
        damage_print_text(out, total, level);
        return;
    }
    for (size_t i = 0; i < journal_set_count(s); i++) {
        const struct journal_info *in = journal_set_info(s, i);
        if (!damage_any(&in->damage))
            continue;
        fputs("journal ", out);
        text_write_safe(out, in->path);
        fputs(" (instance ", out);
        text_write_safe(out, in->instance);
        fputs("):\n", out);
        damage_print_text(out, &in->damage, level);
    }
}

void instances_print_mixed(FILE *out, const struct journal_set *s)
{
    if (!journal_set_mixed_config(s))
        return;
    fputs("warning: the journals' instances ran with different seeds: they did not fault the "
          "same messages alike (give every instance the same seed and rules: "
          "docs/instances.md)\n",
          out);
}
