/*
 * verdict_print.c - the `twice verdict` command: its arguments, the inputs read into the
 * accumulator of verdict.c, the table and the lines under it, the JSON, and the exit code.
 *
 * What each line says is written for the person who decides whether a handler may ship: a
 * verdict is never printed without the evidence it stands on, and evidence that is missing is
 * named with the rule that would bring it for the listener the task came through.
 */
#include "offline/verdict.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offline/changes.h"
#include "offline/cli.h"
#include "offline/damage.h"
#include "offline/fault_log.h"
#include "offline/idshort.h"
#include "offline/instances.h"
#include "offline/journal_reader.h"
#include "offline/journal_set.h"
#include "offline/json_out.h"
#include "offline/page.h"
#include "offline/report.h"

/* Width cap of the TASK column; longer names push the row right. */
#define VERDICT_TASK_COL_MAX 40
/* Room for error messages. */
#define VERDICT_ERR_MAX 512

/* What the output says about the inputs. */
struct verdict_inputs {
    const char *journal, *effects;
    uint64_t seed, start_unix_ms, records, effect_lines;
    uint64_t runs;          /* twice runs the journal holds (`journal PATH append`) */
    uint64_t unclean;       /* runs before the last that ended without a stop record */
    struct changes changes; /* of the rules in force during the run */
    bool truncated;
    bool clean_stop; /* the journal ends with its stop record */
    struct damage_report damage;
    bool allow_damaged;               /* --allow-damaged */
    struct journal_set *set;          /* the journals read (several: one per instance) */
    const char *const *effects_files; /* every --effects file, effects the first */
    size_t n_effects_files;
    struct fault_log *faults; /* --html, --format markdown: the faults' times; else NULL */
};

struct verdict_args {
    struct journal_paths journals; /* every journal given, globs expanded */
    const char **effects;          /* every --effects, in order; effects[0] named in the output */
    size_t n_effects;
    bool json;
    bool allow_damaged; /* --allow-damaged: a damaged journal does not change the exit code */
    struct verdict_options opt;
    const char *html;   /* --html FILE */
    bool markdown;      /* --format markdown */
    const char *format; /* --format or --json as given, NULL: text */
};

/* The accumulator and the journals it is fed from. */
struct verdict_feed {
    struct verdict *v;
    const struct journal_set *set;
    struct fault_log *faults; /* or NULL */
};

/* Journal `source`'s header (a later run's: the run before it ended there). */
static int feed_header(void *ctx, size_t source, const Twice__Journal__Header *h, bool first)
{
    struct verdict_feed *f = ctx;
    (void)first;
    if (f->faults != NULL)
        fault_log_add_header(f->faults, h);
    /* A run that names no instance (a twice before instances) is known as its journal is. */
    return verdict_add_source_header(f->v, (uint32_t)source, h,
                                     journal_set_info(f->set, source)->instance);
}

static int feed_record(void *ctx, size_t source, const Twice__Journal__Record *r)
{
    struct verdict_feed *f = ctx;
    if (f->faults != NULL && fault_log_add_record(f->faults, r) != 0)
        return -1;
    return verdict_add_source_record(f->v, (uint32_t)source, r);
}

/* Feeds every journal's headers and records to v, merged by time.  0, or -1 with a message
 * in err. */
static int load_journal(struct verdict *v, const struct journal_paths *paths,
                        struct verdict_inputs *in, char *err, size_t errlen)
{
    in->set = journal_set_open(paths, err, errlen);
    if (in->set == NULL)
        return -1;
    struct verdict_feed f = {v, in->set, in->faults};
    struct instances_feed feed = {&f, feed_header, feed_record};
    if (instances_read(in->set, &feed, &in->changes, err, errlen) != 0)
        return -1;
    struct journal_info total;
    journal_set_total(in->set, &total);
    in->journal = total.path;
    in->seed = total.header->seed;
    in->start_unix_ms = total.header->start_unix_ms;
    in->runs = total.runs;
    in->unclean = total.unclean_runs;
    in->records = total.records;
    in->truncated = total.truncated;
    in->clean_stop = total.clean_stop;
    in->damage = total.damage;
    return 0;
}

/* ---- the rule that brings missing evidence ------------------------------------------------ */

/* What a task lacks and which rule brings it, per protocol and profile of its listener, and the
 * listener's settings where they change the answer (an amqp listener's visibility or consumer
 * timeout refuses `after D` at or past it).  The same facts as docs/rules.md's "Overlapping or
 * sequential copies" and "Late copies past a visibility timeout".  In the texts, %s is the
 * task's name, %V the listener's timeout ("30s") and %T its setting ("visibility-timeout"). */
struct verdict_hint {
    const char *protocol, *profile;
    const char *overlap;        /* a copy while the first still runs */
    const char *window;         /* a copy long after the first */
    const char *window_timeout; /* the same on a listener with a timeout; NULL: as window */
};

static const struct verdict_hint verdict_hints[] = {
    {"amqp", "",
     "`when deliver task=%s` + `do duplicate` (RabbitMQ hands the copy out at once: give the "
     "task more than one worker, each with a prefetch of 1, so that it does not wait behind the "
     "first), or `do expire D` with D shorter than the handler runs",
     "`when ack task=%s` + `do redeliver after D`, or `when deliver task=%s` + `do duplicate "
     "after D`",
     "`when ack task=%s` + `do redeliver after D` with D below %V (the listener's %T: a later "
     "`after` is refused, an ack twice holds counting as not acked); for copies later than %V, "
     "`when deliver task=%s` + `do expire D` (D in place of the %T for those deliveries) with "
     "`when ack task=%s` + `do drop`: each message whose ack is dropped comes back D after its "
     "delivery"},
    {"resp", "sidekiq",
     "`when deliver task=%s` + `do duplicate after 2s` (Sidekiq settles nothing on the wire: "
     "twice sees the overlap in its heartbeat, every 5 s with start times in whole seconds, as a "
     "first run still going after its copy came more than a second later; handlers shorter than "
     "the delay plus 5 s show it in some copies only)",
     "`when deliver task=%s` + `do duplicate after D`", NULL},
    {"resp", "celery", "`when deliver task=%s` + `do duplicate` (the copy is pushed back at once)",
     "`when deliver task=%s` + `do duplicate after D` (pushed D after the delivery, whatever "
     "kombu's visibility_timeout)",
     NULL},
    {"resp", "rq",
     "`when deliver task=%s` + `do duplicate` (the id is pushed back at once: run two or more "
     "workers)",
     "`when ack task=%s` + `do redeliver after D`, or `when deliver task=%s` + `do duplicate "
     "after D`",
     NULL},
    {"resp", "list", "`when deliver task=%s` + `do duplicate` (the job is pushed back at once)",
     "`when ack task=%s` + `do redeliver after D`, or `when deliver task=%s` + `do duplicate "
     "after D`",
     NULL},
    {"resp", "streams",
     "`when deliver task=%s` + `do duplicate`, with a consumer min-idle-time (XAUTOCLAIM) "
     "shorter than the handler runs",
     "`when deliver task=%s` + `do duplicate`, with a consumer min-idle-time of D (twice does "
     "not choose when a pending entry comes back)",
     NULL},
    {"resp", "bullmq",
     "`when deliver task=%s` + `do duplicate` (the job is handed to another worker at once)",
     "`when lease task=%s` + `do drop`, with a lockDuration and stalledInterval of about D/2 "
     "each (BullMQ's stalled checker decides when a job comes back, not twice)",
     NULL},
};

/* When the listener is not in the journal's header: what works where twice chooses the time. */
#define VERDICT_HINT_OVERLAP "`when deliver task=%s` + `do duplicate`"
#define VERDICT_HINT_WINDOW                                                                        \
    "`when ack task=%s` + `do redeliver after D` or `when deliver task=%s` + `do duplicate "       \
    "after D` (where the listener's protocol lets twice choose when the copy comes: "              \
    "docs/rules.md, late copies)"

static const struct verdict_hint *hint_for(const struct verdict_task *t)
{
    if (t->protocol == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(verdict_hints) / sizeof(verdict_hints[0]); i++) {
        const struct verdict_hint *h = &verdict_hints[i];
        if (strcmp(h->protocol, t->protocol) == 0 &&
            strcmp(h->profile, t->profile != NULL ? t->profile : "") == 0)
            return h;
    }
    return NULL;
}

/* The rule that brings a copy while the first still runs, for t's listener. */
static const char *overlap_hint(const struct verdict_task *t)
{
    const struct verdict_hint *h = hint_for(t);
    return h != NULL ? h->overlap : VERDICT_HINT_OVERLAP;
}

/* The rule that brings a copy long after the first, for t's listener and its settings. */
static const char *window_hint(const struct verdict_task *t)
{
    const struct verdict_hint *h = hint_for(t);
    if (h == NULL)
        return VERDICT_HINT_WINDOW;
    return t->visibility_ms != 0 && h->window_timeout != NULL ? h->window_timeout : h->window;
}

/* A duration as a rule file writes it: "30s", "2m", "1500ms". */
static void print_ms(FILE *out, uint32_t ms)
{
    if (ms % 60000 == 0)
        fprintf(out, "%um", ms / 60000);
    else if (ms % 1000 == 0)
        fprintf(out, "%us", ms / 1000);
    else
        fprintf(out, "%ums", ms);
}

/* Prints a hint's text with each %s as the task's name (a glob-safe form of it), %V as its
 * listener's timeout and %T as that timeout's setting. */
static void print_hint(FILE *out, const char *fmt, const struct verdict_task *t)
{
    for (const char *p = fmt; *p != '\0'; p++) {
        if (p[0] == '%' && p[1] == 's') {
            text_write_safe(out, strpbrk(t->task, " \t\"") != NULL ? "..." : t->task);
            p++;
        } else if (p[0] == '%' && p[1] == 'V') {
            print_ms(out, t->visibility_ms);
            p++;
        } else if (p[0] == '%' && p[1] == 'T') {
            fputs(t->consumer_timeout ? "consumer-timeout" : "visibility-timeout", out);
            p++;
        } else {
            fputc(*p, out);
        }
    }
}

/* "on listener 'NAME' (PROTOCOL, PROFILE): " or "" when the header did not say. */
static void print_listener(FILE *out, const struct verdict_task *t)
{
    if (t->listener == NULL || t->protocol == NULL)
        return;
    fputs("on listener '", out);
    text_write_safe(out, t->listener);
    fprintf(out, "' (%s%s%s): ", t->protocol, t->profile[0] != '\0' ? ", " : "", t->profile);
}

/* ---- JSON ------------------------------------------------------------------------------- */

static void print_examples_json(FILE *out, const struct verdict_examples *ex)
{
    fputc('[', out);
    for (size_t i = 0; i < ex->n; i++) {
        if (i > 0)
            fputs(", ", out);
        json_write_string(out, ex->ids[i]);
    }
    fputc(']', out);
}

static void print_missing_json(FILE *out, unsigned missing)
{
    static const char *const names[] = {"copies", "overlap", "window"};
    fputc('[', out);
    const char *sep = "";
    for (unsigned b = 0; b < 3; b++) {
        if (missing & (1u << b)) {
            fprintf(out, "%s\"%s\"", sep, names[b]);
            sep = ", ";
        }
    }
    fputc(']', out);
}

/* `[...]` of names, and `"KEY_more": N` when some were left out. */
static void print_names_json(FILE *out, const char *key, const char *const *names, size_t n,
                             size_t total)
{
    fprintf(out, ", \"%s\": [", key);
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            fputs(", ", out);
        json_write_string(out, names[i]);
    }
    fputc(']', out);
    if (total > n)
        fprintf(out, ", \"%s_more\": %zu", key, total - n);
}

/* The instances and listeners the row's messages were delivered or settled through. */
static void print_seen_json(FILE *out, const struct verdict_task *t)
{
    print_names_json(out, "instances", t->seen_instances, t->n_seen_instances,
                     t->seen_instances_total);
    print_names_json(out, "listeners", t->seen_listeners, t->n_seen_listeners,
                     t->seen_listeners_total);
}

static void print_evidence_json(FILE *out, const struct verdict_task *t)
{
    fprintf(out,
            ", \"overlapping_copies\": %llu, \"sequential_copies\": %llu, "
            "\"overlap_unknown_copies\": %llu, \"overlap_ms\": ",
            (unsigned long long)t->overlapping, (unsigned long long)t->sequential,
            (unsigned long long)t->overlap_unknown);
    if (t->overlapping > 0)
        fprintf(out, "{\"median\": %llu, \"max\": %llu}",
                (unsigned long long)(t->overlap_median_us / 1000),
                (unsigned long long)(t->overlap_max_us / 1000));
    else
        fputs("null", out);
    fputs(", \"overlap_examples\": ", out);
    print_examples_json(out, &t->overlap_examples);
    fputs(", \"evidence_missing\": ", out);
    print_missing_json(out, t->verdict == VERDICT_NOT_IDEMPOTENT ? 0 : t->missing);
    fprintf(out,
            ", \"required_short\": %s, \"set_aside\": %llu, \"set_aside_messages\": %llu, "
            "\"set_aside_examples\": ",
            t->required_short ? "true" : "false", (unsigned long long)t->set_aside,
            (unsigned long long)t->set_aside_messages);
    print_examples_json(out, &t->set_aside_examples);
    fprintf(out, ", \"never_delivered\": %llu, \"unfinished\": %llu, \"outstanding_examples\": ",
            (unsigned long long)t->never_delivered, (unsigned long long)t->unfinished);
    print_examples_json(out, &t->outstanding_examples);
    fprintf(out, ", \"stalled\": %s, \"last_progress_unix_us\": %llu",
            t->stalled ? "true" : "false", (unsigned long long)t->last_progress_us);
    fputs(", \"listener\": ", out);
    json_write_string(out, t->listener != NULL ? t->listener : "");
    print_seen_json(out, t);
}

static void print_task_json(FILE *out, const struct verdict_task *t)
{
    fputs("    {\"task\": ", out);
    json_write_string(out, t->task);
    fprintf(out,
            ", \"messages\": %llu, \"faulted\": %llu, \"delivered_more_than_once\": %llu, "
            "\"more_than_one_effect\": %llu, \"no_effect\": %llu, \"verdict\": ",
            (unsigned long long)t->messages, (unsigned long long)t->faulted,
            (unsigned long long)t->delivered_more_than_once,
            (unsigned long long)t->more_than_one_effect, (unsigned long long)t->no_effect);
    json_write_string(out, verdict_kind_name(t->verdict));
    fprintf(out, ", \"copies\": %llu, \"copy_delay_ms\": ", (unsigned long long)t->copies);
    if (t->copies > 0)
        fprintf(out, "{\"min\": %llu, \"median\": %llu, \"max\": %llu}",
                (unsigned long long)(t->copy_min_us / 1000),
                (unsigned long long)(t->copy_median_us / 1000),
                (unsigned long long)(t->copy_max_us / 1000));
    else
        fputs("null", out);
    fputs(", \"examples\": ", out);
    print_examples_json(out, &t->examples);
    fprintf(out,
            ", \"doubled_without_second_delivery\": %llu, "
            "\"doubled_without_second_delivery_examples\": ",
            (unsigned long long)t->doubled_single_delivery);
    print_examples_json(out, &t->single_examples);
    fprintf(out,
            ", \"failed\": %llu, \"retried\": %llu, \"max_retries\": %llu, "
            "\"doubled_by_retries\": %llu, \"doubled_by_retries_examples\": ",
            (unsigned long long)t->failed, (unsigned long long)t->retried,
            (unsigned long long)t->max_retries, (unsigned long long)t->doubled_by_retries);
    print_examples_json(out, &t->retry_examples);
    fputs(", \"failed_examples\": ", out);
    print_examples_json(out, &t->failed_examples);
    fprintf(out,
            ", \"abandoned\": %llu, \"abandoned_examples\": ", (unsigned long long)t->abandoned);
    print_examples_json(out, &t->abandoned_examples);
    print_evidence_json(out, t);
    fputc('}', out);
}

static const char *effects_check_name(enum verdict_effects_check c)
{
    static const char *const names[] = {"ok", "empty", "no_match", "mostly_unknown"};
    return (unsigned)c < 4 ? names[c] : "ok";
}

static void print_json(FILE *out, const struct verdict_result *res, const struct verdict_inputs *in)
{
    fputs("{\n  \"journal\": ", out);
    json_write_string(out, in->journal);
    fputs(",\n  \"effects\": ", out);
    json_write_string(out, in->effects);
    fputs(",\n  \"effects_files\": [", out);
    for (size_t i = 0; i < in->n_effects_files; i++) {
        fputs(i > 0 ? ", " : "", out);
        json_write_string(out, in->effects_files[i]);
    }
    fputc(']', out);
    fprintf(out,
            ",\n  \"seed\": \"%llu\",\n  \"start_unix_ms\": %llu,\n  \"records\": %llu,\n"
            "  \"journal_truncated\": %s,\n  \"journal_clean_stop\": %s,\n"
            "  \"journal_runs\": %llu,\n  \"journal_runs_unclean\": %llu,\n  \"rule_changes\": ",
            (unsigned long long)in->seed, (unsigned long long)in->start_unix_ms,
            (unsigned long long)in->records, in->truncated ? "true" : "false",
            in->clean_stop ? "true" : "false", (unsigned long long)in->runs,
            (unsigned long long)in->unclean);
    changes_print_json(out, &in->changes);
    fprintf(out,
            ",\n  \"journal_damaged\": %s,\n  \"allow_damaged\": %s,\n"
            "  \"effect_lines\": %llu,\n  \"effects_check\": \"%s\","
            "\n  \"end_unix_us\": %llu,\n  \"stalled\": %s,\n  \"required_short\": %s,\n"
            "  \"verdict\": ",
            damage_any(&in->damage) ? "true" : "false", in->allow_damaged ? "true" : "false",
            (unsigned long long)in->effect_lines, effects_check_name(res->effects_check),
            (unsigned long long)res->end_us, res->any_stalled ? "true" : "false",
            res->any_required_short ? "true" : "false");
    json_write_string(out, verdict_kind_name(res->overall));
    fputs(",\n  \"tasks\": [", out);
    for (size_t i = 0; i < res->n_tasks; i++) {
        fputs(i > 0 ? ",\n" : "\n", out);
        print_task_json(out, &res->tasks[i]);
    }
    fprintf(out, "%s],\n  \"unknown_effects\": {\"ids\": %llu, \"lines\": %llu, \"examples\": ",
            res->n_tasks > 0 ? "\n  " : "", (unsigned long long)res->unknown_effect_ids,
            (unsigned long long)res->unknown_effect_lines);
    print_examples_json(out, &res->unknown_examples);
    fputs("},\n  \"journal_damage\": ", out);
    damage_print_json(out, &in->damage);
    instances_print_json(out, in->set, "\n  ");
    fputs("\n}\n", out);
}

/* ---- text ------------------------------------------------------------------------------- */

static void print_examples_text(FILE *out, const struct verdict_examples *ex)
{
    for (size_t i = 0; i < ex->n; i++) {
        fputs(i > 0 ? ", " : "", out);
        text_write_safe(out, ex->ids[i]);
    }
}

static int task_col_width(const struct verdict_result *res)
{
    size_t w = strlen("TASK");
    for (size_t i = 0; i < res->n_tasks; i++) {
        size_t n = strlen(res->tasks[i].task);
        if (n > w)
            w = n;
    }
    return (int)(w > VERDICT_TASK_COL_MAX ? VERDICT_TASK_COL_MAX : w);
}

/* A delay for people: "<1ms", "40ms", "1.4s", "12s", "25min", "3.0h".  Under a second in
 * milliseconds: copies a rule sends at once come within a few, and "0.0s" said nothing. */
static void format_delay(char *buf, size_t cap, uint64_t us)
{
    double s = (double)us / 1e6;
    if (us < 1000)
        snprintf(buf, cap, "<1ms");
    else if (us < 999500)
        snprintf(buf, cap, "%.0fms", (double)us / 1e3);
    else if (s < 10)
        snprintf(buf, cap, "%.1fs", s);
    else if (s < 600)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3 * 3600)
        snprintf(buf, cap, "%.0fmin", s / 60);
    else
        snprintf(buf, cap, "%.1fh", s / 3600);
}

/* The COPY DELAYS column: "MIN-MAX", or "-" with no copy. */
static void format_window(char *buf, size_t cap, const struct verdict_task *t)
{
    if (t->copies == 0) {
        snprintf(buf, cap, "-");
        return;
    }
    char lo[16], hi[16];
    format_delay(lo, sizeof(lo), t->copy_min_us);
    format_delay(hi, sizeof(hi), t->copy_max_us);
    snprintf(buf, cap, "%s-%s", lo, hi);
}

/* "2026-11-29T09:00:00.123Z" for a time in microseconds. */
static void format_time(char *buf, size_t len, uint64_t unix_us)
{
    time_t secs = (time_t)(unix_us / 1000000u);
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03uZ", (unsigned)(unix_us / 1000u % 1000u));
}

/* The verdict cell: "IDEMPOTENT*" when evidence is missing (said in the EXAMPLES column and
 * under the table). */
static void print_verdict_cell(FILE *out, const struct verdict_task *t, const struct idshort *ids)
{
    bool partial = t->verdict == VERDICT_IDEMPOTENT &&
                   (t->missing & (VERDICT_MISSING_OVERLAP | VERDICT_MISSING_WINDOW)) != 0;
    char cell[24];
    snprintf(cell, sizeof(cell), "%s%s", verdict_kind_name(t->verdict), partial ? "*" : "");
    if (t->examples.n > 0) {
        fprintf(out, "%-14s  ", cell);
        size_t shown = t->examples.n < PAGE_ROW_EXAMPLES ? t->examples.n : PAGE_ROW_EXAMPLES;
        for (size_t i = 0; i < shown; i++) {
            fputs(i > 0 ? ", " : "", out);
            idshort_write(out, ids, t->examples.ids[i]);
        }
        if (t->examples.n > shown)
            fprintf(out, " +%zu", t->examples.n - shown);
    } else if (partial) {
        fprintf(out, "%-14s  missing: %s%s%s", cell,
                (t->missing & VERDICT_MISSING_OVERLAP) ? "overlap" : "",
                (t->missing & VERDICT_MISSING_OVERLAP) && (t->missing & VERDICT_MISSING_WINDOW)
                    ? ", "
                    : "",
                (t->missing & VERDICT_MISSING_WINDOW) ? "window" : "");
    } else if (t->stalled) {
        fprintf(out, "%-14s  STALLED", cell);
    } else {
        fputs(cell, out);
    }
    if (t->stalled && t->examples.n + (partial ? 1 : 0) > 0)
        fputs("  STALLED", out);
}

static void print_row(FILE *out, const struct verdict_task *t, int width, const struct idshort *ids)
{
    int n = text_write_safe(out, t->task);
    char window[40], overlapped[48];
    format_window(window, sizeof(window), t);
    snprintf(overlapped, sizeof(overlapped), "%llu/%llu", (unsigned long long)t->overlapping,
             (unsigned long long)t->copies);
    fprintf(out, "%*s  %8llu  %7llu  %11llu  %9llu  %9llu  %7llu  %10s  %-13s  ",
            n < width ? width - n : 0, "", (unsigned long long)t->messages,
            (unsigned long long)t->faulted, (unsigned long long)t->delivered_more_than_once,
            (unsigned long long)t->more_than_one_effect, (unsigned long long)t->no_effect,
            (unsigned long long)t->retried, overlapped, window);
    print_verdict_cell(out, t, ids);
    fputc('\n', out);
}

static void print_table(FILE *out, const struct verdict_result *res)
{
    int width = task_col_width(res);
    fprintf(out, "%-*s  %8s  %7s  %11s  %9s  %9s  %7s  %10s  %-13s  %-14s  %s\n", width, "TASK",
            "MESSAGES", "FAULTED", "DELIVERED>1", "EFFECTS>1", "NO EFFECT", "RETRIED", "OVERLAPPED",
            "COPY DELAYS", "VERDICT", "EXAMPLES");
    /* the examples shortened in the table, whole under it (and in --json) */
    struct idshort ids;
    idshort_of_examples(&ids, res);
    for (size_t i = 0; i < res->n_tasks; i++)
        print_row(out, &res->tasks[i], width, &ids);
    if (res->n_tasks == 0)
        fputs("(no message ids in the journal)\n", out);
    idshort_print_list(out, &ids, "EXAMPLES in full:");
    idshort_free(&ids);
}

static void print_legend(FILE *out)
{
    fputs("\nMESSAGES        distinct message ids of the task seen in the journal\n"
          "FAULTED         messages twice injected at least one fault into\n"
          "DELIVERED>1     messages with a copy that reached the handler (a delivery twice "
          "dropped, a retry the app asked for, or a redelivery after a delivery no worker was "
          "seen to finish does not count)\n"
          "EFFECTS>1       messages with more than one line in the effects list\n"
          "NO EFFECT       delivered or faulted, but no line in the effects list: work lost "
          "(a drop), or missing from the list\n"
          "RETRIED         messages the app retried itself (a Celery retry, a Sidekiq or RQ "
          "retry, a nack with requeue): new attempts, not copies\n"
          "OVERLAPPED      copies that ran while an earlier delivery of the message, on "
          "another connection, was still unsettled (neither waiting behind other work of its "
          "worker) / all copies: only those test a check-then-act guard\n"
          "COPY DELAYS     the copy delays tested: how long after a message's first delivery "
          "its copies reached the handler (shortest-longest)\n"
          "NOT IDEMPOTENT  some message produced more than one side effect (EXAMPLES: up to 5)\n"
          "IDEMPOTENT      some copy reached the handler and none produced two side effects, "
          "over the evidence above; IDEMPOTENT* lacks some: no copy overlapped (check-then-act "
          "races untested) or every copy came within a minute (a dedup key that expires later "
          "untested): see the lines under the table\n"
          "UNTESTED        no copy reached the handler, or short of what --require asked: run "
          "longer or widen the rules\n"
          "STALLED         messages were still outstanding at the end and the task had no "
          "delivery or settlement for the last part of the journal\n"
          "SEEN THROUGH    the twice instances (the journals' `instance`) and listeners the "
          "task's messages were delivered or settled through\n",
          out);
}

/* "warning: TASK: N message ids WHAT (e.g. EXAMPLES)", when n is not 0. */
static void task_warning(FILE *out, const struct verdict_task *t, uint64_t n, const char *what,
                         const struct verdict_examples *ex)
{
    if (n == 0)
        return;
    fputs("warning: ", out);
    text_write_safe(out, t->task);
    fprintf(out, ": %llu message ids %s (e.g. ", (unsigned long long)n, what);
    print_examples_text(out, ex);
    fputs(")\n", out);
}

/* "N message(s)" */
static const char *plural(uint64_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* The effects list against the journal: an error when it names nothing of it. */
static void print_effects_check(FILE *out, const struct verdict_result *res,
                                const struct verdict_inputs *in)
{
    switch (res->effects_check) {
    case VERDICT_EFFECTS_EMPTY:
        fprintf(out,
                "error: the effects list is empty while the journal has %llu messages delivered: "
                "no side effect recorded tests nothing (did the export run, and write one "
                "message id per side effect?)\n",
                (unsigned long long)res->delivered_messages);
        return;
    case VERDICT_EFFECTS_NO_MATCH:
        fprintf(out,
                "error: none of the %llu effect lines names a message of the journal: the list "
                "must hold one message id per side effect, as the journal names them (`twice "
                "report %s` shows some)\n",
                (unsigned long long)res->effect_lines, in->journal);
        break;
    case VERDICT_EFFECTS_MOSTLY_OFF:
        fprintf(out,
                "error: %llu of the %llu effect lines name messages the journal never saw: the "
                "list does not describe this run (another run's export, or not message ids)\n",
                (unsigned long long)res->unknown_effect_lines,
                (unsigned long long)res->effect_lines);
        break;
    case VERDICT_EFFECTS_OK:
    default:
        return;
    }
    if (res->effect_lines_with_comma * 2 > res->effect_lines)
        fputs("  its lines hold commas or semicolons: a CSV export? write the message id alone "
              "on each line\n",
              out);
}

static void print_warnings(FILE *out, const struct verdict_result *res,
                           const struct verdict_inputs *in)
{
    if (in->truncated)
        fputs("warning: the journal's last record is cut short (the proxy died while "
              "writing); the records before it are counted\n",
              out);
    if (!in->clean_stop)
        fputs(REPORT_NO_CLEAN_STOP "\n", out);
    if (in->unclean > 0)
        fprintf(out, REPORT_UNCLEAN_RUNS "\n", (unsigned long long)in->unclean,
                (unsigned long long)in->runs);
    instances_print_damage(out, in->set, &in->damage, in->allow_damaged ? "warning" : "error");
    if (damage_any(&in->damage))
        fputs(in->allow_damaged
                  ? "  the verdict stands on the records read (--allow-damaged)\n"
                  : "  the verdict stands on the records read: exit 6 (--allow-damaged "
                    "accepts a damaged journal)\n",
              out);
    if (res->unknown_effect_ids > 0 && res->effects_check == VERDICT_EFFECTS_OK) {
        fprintf(out,
                "warning: %llu message ids in the effects list (%llu lines) never appear in "
                "the journal; were their workers connected through twice? (e.g. ",
                (unsigned long long)res->unknown_effect_ids,
                (unsigned long long)res->unknown_effect_lines);
        print_examples_text(out, &res->unknown_examples);
        fputs(")\n", out);
    }
    for (size_t i = 0; i < res->n_tasks; i++)
        task_warning(out, &res->tasks[i], res->tasks[i].doubled_single_delivery,
                     "have 2+ effects but were delivered at most once: effect doubled without a "
                     "second delivery: check your effects list",
                     &res->tasks[i].single_examples);
    for (size_t i = 0; i < res->n_tasks; i++)
        task_warning(out, &res->tasks[i], res->tasks[i].doubled_by_retries,
                     "have 2+ effects over the app's own retries, with no copy from twice: the "
                     "handler did its side effect, then failed and was retried",
                     &res->tasks[i].retry_examples);
    for (size_t i = 0; i < res->n_tasks; i++)
        task_warning(out, &res->tasks[i], res->tasks[i].failed,
                     "ended failed: the framework gave up on them (BullMQ's failed set, a job "
                     "stalled more than maxStalledCount included; RQ's failed registry; a reject "
                     "or nack without requeue), whatever effects they left: work lost",
                     &res->tasks[i].failed_examples);
    for (size_t i = 0; i < res->n_tasks; i++)
        task_warning(out, &res->tasks[i], res->tasks[i].abandoned,
                     "were failed by the framework while a worker still ran them, and that "
                     "worker completed them afterwards (an RQ job whose heartbeat lapsed, moved "
                     "to the failed registry): a requeue of those failed jobs runs them again",
                     &res->tasks[i].abandoned_examples);
    print_effects_check(out, res, in);
}

/* Per task the app retried: how many messages, and the most retries of one. */
static void print_retries(FILE *out, const struct verdict_result *res)
{
    bool any = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        if (t->retried == 0)
            continue;
        if (!any)
            fputc('\n', out);
        any = true;
        text_write_safe(out, t->task);
        fprintf(out,
                ": %llu %s retried by the app, at most %llu %s of one; their attempts are not "
                "counted as copies\n",
                (unsigned long long)t->retried, plural(t->retried, "message", "messages"),
                (unsigned long long)t->max_retries, plural(t->max_retries, "retry", "retries"));
    }
}

/* How the copies of an IDEMPOTENT row stood to the first deliveries. */
static void print_overlap_line(FILE *out, const struct verdict_task *t)
{
    if (t->overlapping > 0) {
        char med[16], hi[16];
        format_delay(med, sizeof(med), t->overlap_median_us);
        format_delay(hi, sizeof(hi), t->overlap_max_us);
        fprintf(out,
                "  %llu of them reached a worker while an earlier delivery was still running "
                "(beside it for up to %s, median %s): check-then-act races tested\n",
                (unsigned long long)t->overlapping, hi, med);
        return;
    }
    fprintf(out, "  no copy ran while an earlier one was running: check-then-act races untested "
                 "(");
    if (t->sequential > 0)
        fprintf(out, "%llu %s after the earlier delivery was settled",
                (unsigned long long)t->sequential,
                plural(t->sequential, "copy came", "copies came"));
    if (t->sequential > 0 && t->overlap_unknown > 0)
        fputs("; ", out);
    if (t->overlap_unknown > 0)
        fprintf(out,
                "%llu unknown: the earlier delivery was never settled on the wire, or the two "
                "shared a connection, or one of them may have waited behind its worker's other "
                "work",
                (unsigned long long)t->overlap_unknown);
    fputs("); to test them ", out);
    print_listener(out, t);
    print_hint(out, overlap_hint(t), t);
    fputc('\n', out);
}

/* What each IDEMPOTENT row held over, and what it still lacks with the rule that brings it. */
static void print_evidence(FILE *out, const struct verdict_result *res)
{
    bool any = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        if (t->verdict != VERDICT_IDEMPOTENT && !(t->required_short && t->copies > 0))
            continue;
        char lo[16], med[16], hi[16];
        format_delay(lo, sizeof(lo), t->copy_min_us);
        format_delay(med, sizeof(med), t->copy_median_us);
        format_delay(hi, sizeof(hi), t->copy_max_us);
        if (!any)
            fputc('\n', out);
        any = true;
        text_write_safe(out, t->task);
        fprintf(out, ": %s for copies %s-%s after the first delivery (median %s, %llu %s)\n",
                t->verdict == VERDICT_IDEMPOTENT ? "IDEMPOTENT" : "no double effect", lo, hi, med,
                (unsigned long long)t->copies, plural(t->copies, "copy", "copies"));
        print_overlap_line(out, t);
        if (t->missing & VERDICT_MISSING_WINDOW) {
            fprintf(out,
                    "  every copy came within %s: deduplication that forgets a message sooner "
                    "is caught, later is not tested; for later copies ",
                    hi);
            print_listener(out, t);
            print_hint(out, window_hint(t), t);
            fputc('\n', out);
        }
        if (t->required_short)
            fputs("  short of what --require asks: UNTESTED\n", out);
    }
}

/* One name of a row's instances or listeners, made safe for a terminal. */
static void text_name(FILE *out, const char *name)
{
    text_write_safe(out, name);
}

/* Which instances and listeners each row's messages were delivered or settled through. */
static void print_seen(FILE *out, const struct verdict_result *res)
{
    if (res->n_tasks == 0)
        return;
    int width = task_col_width(res);
    if (width < (int)strlen("SEEN THROUGH"))
        width = (int)strlen("SEEN THROUGH");
    fprintf(out, "\n%-*s  %s\n", width, "SEEN THROUGH", "INSTANCES; LISTENERS");
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        int n = text_write_safe(out, t->task);
        fprintf(out, "%*s  ", n < width ? width - n : 0, "");
        page_names(out, t->seen_instances, t->n_seen_instances, t->seen_instances_total, text_name);
        fputs("; ", out);
        page_names(out, t->seen_listeners, t->n_seen_listeners, t->seen_listeners_total, text_name);
        fputc('\n', out);
    }
}

/* Rows with no copy at all, and rows whose redeliveries were set aside. */
static void print_untested(FILE *out, const struct verdict_result *res)
{
    bool any = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        bool untested = t->verdict == VERDICT_UNTESTED && t->copies == 0;
        if (!any && (t->set_aside > 0 || untested))
            fputc('\n', out);
        any |= t->set_aside > 0 || untested;
        if (t->set_aside > 0) {
            text_write_safe(out, t->task);
            fprintf(out,
                    ": %llu %s of %llu %s set aside, not counted as copies: no worker was seen "
                    "to finish the delivery before (it was never settled: a message prefetched "
                    "and requeued when its connection closed may never have reached a handler) "
                    "(e.g. ",
                    (unsigned long long)t->set_aside,
                    plural(t->set_aside, "redelivery", "redeliveries"),
                    (unsigned long long)t->set_aside_messages,
                    plural(t->set_aside_messages, "message", "messages"));
            print_examples_text(out, &t->set_aside_examples);
            fputs(")\n", out);
        }
        if (untested) {
            text_write_safe(out, t->task);
            fputs(": UNTESTED: no copy reached the handler; to make one ", out);
            print_listener(out, t);
            print_hint(out, overlap_hint(t), t);
            fputc('\n', out);
        }
    }
}

/* Work that stopped: outstanding messages per task, STALLED when the task stopped moving. */
static void print_outstanding(FILE *out, const struct verdict_result *res,
                              const struct verdict_options *opt)
{
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        uint64_t n = t->never_delivered + t->unfinished;
        if (n == 0)
            continue;
        char when[40], idle[16];
        format_time(when, sizeof(when), t->last_progress_us);
        format_delay(idle, sizeof(idle), res->end_us - t->last_progress_us);
        fputs(t->stalled ? "warning: " : "note: ", out);
        text_write_safe(out, t->task);
        if (t->stalled)
            fprintf(out,
                    ": STALLED since %s: nothing delivered or settled in the last %s of "
                    "the journal (--stall-after ",
                    when, idle);
        if (t->stalled) {
            char lim[16];
            format_delay(lim, sizeof(lim), opt->stall_after_us);
            fprintf(out, "%s), ", lim);
        } else {
            fputs(": at the end of the journal, ", out);
        }
        fprintf(out,
                "%llu %s outstanding: %llu published and never delivered, %llu delivered and "
                "never settled or requeued and never delivered again (e.g. ",
                (unsigned long long)n, plural(n, "message", "messages"),
                (unsigned long long)t->never_delivered, (unsigned long long)t->unfinished);
        print_examples_text(out, &t->outstanding_examples);
        fputs(")\n", out);
    }
}

/* The last line: the overall verdict, starred when an IDEMPOTENT row lacks evidence; then the
 * tasks that stalled. */
static void print_verdict_line(FILE *out, const struct verdict_result *res,
                               const struct verdict_inputs *in)
{
    size_t partial = 0;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        partial += t->verdict == VERDICT_IDEMPOTENT &&
                   (t->missing & (VERDICT_MISSING_OVERLAP | VERDICT_MISSING_WINDOW)) != 0;
    }
    fprintf(out, "\nverdict: %s", verdict_kind_name(res->overall));
    if (res->overall == VERDICT_IDEMPOTENT && partial > 0)
        fprintf(out, "* (evidence missing for %zu %s: see the lines under the table)", partial,
                partial == 1 ? "task" : "tasks");
    if (damage_any(&in->damage))
        fputs(" (on a damaged journal: see above)", out);
    fputc('\n', out);
    const char *sep = "stalled: ";
    for (size_t i = 0; i < res->n_tasks; i++) {
        if (!res->tasks[i].stalled)
            continue;
        fputs(sep, out);
        text_write_safe(out, res->tasks[i].task);
        sep = ", ";
    }
    if (sep[0] == ',')
        fputc('\n', out);
}

/* The lines under the table, for the page and markdown: evidence, rows untested, retries,
 * outstanding work, warnings.  Caller frees; NULL when out of memory. */
static char *notes_text(const struct verdict_result *res, const struct verdict_inputs *in,
                        const struct verdict_options *opt)
{
    char *notes = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&notes, &len);
    if (mem == NULL)
        return NULL;
    print_evidence(mem, res);
    print_untested(mem, res);
    print_retries(mem, res);
    print_outstanding(mem, res, opt);
    print_warnings(mem, res, in);
    fclose(mem);
    return notes;
}

static void print_human(FILE *out, const struct verdict_result *res,
                        const struct verdict_inputs *in, const struct verdict_options *opt);

/* What the page and markdown are told of the inputs. */
static void page_facts_of(const struct verdict_inputs *in, struct page_facts *f)
{
    memset(f, 0, sizeof(*f));
    f->journal = in->journal;
    f->effects = in->effects;
    f->seed = in->seed;
    f->start_unix_ms = in->start_unix_ms;
    f->records = in->records;
    f->runs = in->runs;
    f->unclean_runs = in->unclean;
    f->effect_lines = in->effect_lines;
    f->truncated = in->truncated;
    f->clean_stop = in->clean_stop;
    f->allow_damaged = in->allow_damaged;
    f->damage = &in->damage;
    f->changes = &in->changes;
}

struct verdict_page {
    const struct verdict *v;
    const struct verdict_result *res;
    const struct verdict_inputs *in;
    const struct verdict_options *opt;
};

static int write_verdict_page(FILE *out, void *ctx)
{
    const struct verdict_page *p = ctx;
    struct page_facts f;
    page_facts_of(p->in, &f);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (mem == NULL)
        return -1;
    print_human(mem, p->res, p->in, p->opt);
    fclose(mem);
    f.text = text;
    f.notes = notes_text(p->res, p->in, p->opt);
    int rc = f.notes != NULL ? page_verdict_html(out, &f, p->v, p->res, p->in->faults) : -1;
    free((char *)f.notes);
    free(text);
    return rc;
}

static int print_markdown(FILE *out, const struct verdict_result *res,
                          const struct verdict_inputs *in, const struct verdict_options *opt)
{
    struct page_facts f;
    page_facts_of(in, &f);
    f.notes = notes_text(res, in, opt);
    int rc = f.notes != NULL ? page_verdict_markdown(out, &f, res, in->faults) : -1;
    free((char *)f.notes);
    return rc;
}

static void print_human(FILE *out, const struct verdict_result *res,
                        const struct verdict_inputs *in, const struct verdict_options *opt)
{
    bool several = journal_set_count(in->set) > 1;
    instances_print_text(out, in->set);
    fputs(several ? "journals: " : "journal ", out);
    if (!several) {
        text_write_safe(out, in->journal);
        fputs(" (instance ", out);
        text_write_safe(out, journal_set_info(in->set, 0)->instance);
        fputc(')', out);
    }
    fprintf(out, "%s%llu records", several ? "" : ": ", (unsigned long long)in->records);
    if (in->runs > 1)
        fprintf(out, " in %llu runs%s", (unsigned long long)in->runs,
                several ? "" : " (journal PATH append)");
    fprintf(out, ", seed %llu%s", (unsigned long long)in->seed,
            several        ? " (the first journal's)"
            : in->runs > 1 ? " (the first run's)"
                           : "");
    fputs("\neffects ", out);
    text_write_safe(out, in->effects);
    for (size_t i = 1; i < in->n_effects_files; i++) {
        fputs(", ", out);
        text_write_safe(out, in->effects_files[i]);
    }
    fprintf(out, ": %llu side effects\n", (unsigned long long)in->effect_lines);
    changes_print_summary(out, &in->changes);
    instances_print_mixed(out, in->set);
    fputc('\n', out);
    print_table(out, res);
    print_seen(out, res);
    print_evidence(out, res);
    print_untested(out, res);
    print_retries(out, res);
    print_legend(out);
    /* The notes and warnings, after one blank line when there are any. */
    char *notes = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&notes, &len);
    if (mem != NULL) {
        print_outstanding(mem, res, opt);
        print_warnings(mem, res, in);
        fclose(mem);
    }
    if (notes != NULL && len > 0)
        fprintf(out, "\n%s", notes);
    free(notes);
    print_verdict_line(out, res, in);
}

/* ---- arguments -------------------------------------------------------------------------- */

static void usage(FILE *err)
{
    fputs("usage: twice verdict JOURNAL... --effects EFFECTS...\n"
          "                     [--json | --format text|markdown|json] [--html FILE]\n"
          "                     [--require copies[=N] | overlap[=N] | window=D]...\n"
          "                     [--stall-after D] [--allow-damaged]\n"
          "  JOURNAL: the journal of a run (also --journal JOURNAL); several (the journals of\n"
          "       several twice instances, or a quoted glob: 'runs/*.pb') are read together\n"
          "  EFFECTS: one message id per side effect, one per line ('#' comments); every\n"
          "       --effects file given is read\n"
          "  --format markdown: the rules in force, the evidence and the verdict as markdown\n"
          "  --html FILE: also write the verdict as one self-contained page with charts\n"
          "  --require: what every task must have been tested with, else it is UNTESTED\n"
          "  --allow-damaged: a damaged journal's verdict, on the records read, sets the exit\n"
          "       code as an undamaged one's would\n"
          "  exit, the first that applies: 2 usage or an unreadable input; 3 the effects list\n"
          "       does not match the journal; 1 a task NOT IDEMPOTENT; 6 the journal is\n"
          "       damaged; 4 a task short of --require; 5 STALLED; else 0\n",
          err);
}

/* --name VALUE or --name=VALUE at argv[*i].  1 matched, 0 not this option, -1 error. */
static int option_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *value = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *value = argv[++*i];
    return 1;
}

/* "250ms", "45s", "2m", "1h" (or "1.5s") into microseconds.  false when malformed. */
static bool parse_duration(const char *s, uint64_t *us)
{
    /* digits with at most one dot, then a unit: strtod alone would take "nan", "inf",
     * "0x1p3" and "-1" */
    size_t digits = strspn(s, "0123456789.");
    const char *dot = memchr(s, '.', digits);
    if (digits == 0 || (dot != NULL && memchr(dot + 1, '.', digits - (size_t)(dot + 1 - s))) ||
        !isdigit((unsigned char)s[0]))
        return false;
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (end != s + digits || errno != 0 || x > 1e7)
        return false;
    double scale = strcmp(end, "ms") == 0  ? 1e3
                   : strcmp(end, "s") == 0 ? 1e6
                   : strcmp(end, "m") == 0 ? 60e6
                   : strcmp(end, "h") == 0 ? 3600e6
                                           : 0;
    if (scale == 0)
        return false;
    *us = (uint64_t)(x * scale);
    return true;
}

/* "N" (a count, at least 1) into *n. */
static bool parse_count(const char *s, uint64_t *n)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || x == 0 || !isdigit((unsigned char)s[0]))
        return false;
    *n = x;
    return true;
}

/* One --require item: copies[=N], overlap[=N], window=D.  false with a message in err. */
static bool parse_require_item(const char *item, size_t len, struct verdict_require *rq, FILE *err)
{
    char buf[64];
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, item, len);
    buf[len] = '\0';
    char *eq = strchr(buf, '=');
    if (eq != NULL)
        *eq++ = '\0';
    bool ok = false;
    uint64_t n = 1;
    /* Each requirement given is kept: asked twice, the stricter one holds both (a bare
     * "copies" after "copies=3" keeps the 3, "window=2m" after "window=60s" asks for 2m). */
    if (strcmp(buf, "copies") == 0) {
        ok = eq == NULL || parse_count(eq, &n);
        rq->copies = n > rq->copies ? n : rq->copies;
    } else if (strcmp(buf, "overlap") == 0) {
        ok = eq == NULL || parse_count(eq, &n);
        rq->overlaps = n > rq->overlaps ? n : rq->overlaps;
    } else if (strcmp(buf, "window") == 0) {
        ok = eq != NULL && parse_duration(eq, &n) && n > 0;
        rq->window_us = ok && n > rq->window_us ? n : rq->window_us;
    }
    if (!ok)
        fprintf(err,
                "twice verdict: --require '%s%s%s': expected copies[=N], overlap[=N] or "
                "window=D (e.g. window=60s)\n",
                buf, eq != NULL ? "=" : "", eq != NULL ? eq : "");
    return ok;
}

/* --require A[,B...] */
static bool parse_require(const char *v, struct verdict_require *rq, FILE *err)
{
    for (const char *p = v;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (!parse_require_item(p, len, rq, err))
            return false;
        if (comma == NULL)
            return true;
        p = comma + 1;
    }
}

/* Another --effects file: every one given is read.  -1 when out of memory. */
static int effects_push(struct verdict_args *a, const char *path)
{
    const char **e = realloc(a->effects, (a->n_effects + 1) * sizeof(*e));
    if (e == NULL)
        return -1;
    a->effects = e;
    a->effects[a->n_effects++] = path;
    return 0;
}

/* --stall-after D: given twice, the two must agree (neither is dropped silently). */
static int parse_stall_after(const char *value, struct verdict_args *a, FILE *err)
{
    uint64_t us = 0;
    if (!parse_duration(value, &us) || us == 0) {
        fprintf(err, "twice verdict: --stall-after '%s': expected a duration, e.g. 30s\n", value);
        return -1;
    }
    if (a->opt.stall_after_us != 0 && a->opt.stall_after_us != us) {
        fputs("twice verdict: --stall-after given twice with different durations\n", err);
        return -1;
    }
    a->opt.stall_after_us = us;
    return 1;
}

/* One option at argv[*i]: 1 taken, 0 not an option of ours, -1 error (said). */
static int parse_one(int argc, char **argv, int *i, struct verdict_args *a, FILE *err)
{
    const char *value = NULL;
    int rc = option_value(argc, argv, i, "--effects", &value);
    if (rc == 1 && effects_push(a, value) != 0) {
        fputs("twice verdict: out of memory\n", err);
        return -1;
    }
    if (rc == 0 && strcmp(argv[*i], "--json") == 0) {
        if (cli_format_set(&a->format, "json", "verdict", err) < 0)
            return -1;
        rc = 1;
    }
    const char *html = a->html;
    if (rc == 0 && (rc = option_value(argc, argv, i, "--html", &a->html)) == 1 &&
        a->html[0] == '\0')
        rc = -1;
    if (rc == 1 && html != NULL && strcmp(html, a->html) != 0) {
        fprintf(err, "twice verdict: more than one --html given: '%s' and '%s'\n", html, a->html);
        return -1;
    }
    if (rc == 0 && (rc = option_value(argc, argv, i, "--format", &value)) == 1 &&
        cli_format_set(&a->format, value, "verdict", err) < 0)
        return -1;
    if (rc == 0 && strcmp(argv[*i], "--allow-damaged") == 0) {
        a->allow_damaged = true;
        rc = 1;
    }
    if (rc == 0 && (rc = option_value(argc, argv, i, "--require", &value)) == 1 &&
        !parse_require(value, &a->opt.require, err))
        return -1;
    if (rc == 0 && (rc = option_value(argc, argv, i, "--stall-after", &value)) == 1 &&
        parse_stall_after(value, a, err) < 0)
        return -1;
    if (rc == -1) {
        fprintf(err, "twice verdict: %s needs a value\n", argv[*i]);
        return -1;
    }
    if (rc == 0)
        rc = journal_paths_arg(argc, argv, i, &a->journals, err);
    if (rc == 0)
        fprintf(err, "twice verdict: unknown argument '%s'\n", argv[*i]);
    return rc;
}

/* Returns 0 to run, 1 after --help, -1 on a usage error. */
static int parse_args(int argc, char **argv, struct verdict_args *a, FILE *out, FILE *err)
{
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(out);
            return 1;
        }
        if (parse_one(argc, argv, &i, a, err) <= 0) {
            usage(err);
            return -1;
        }
    }
    if (a->journals.n == 0 || a->n_effects == 0) {
        fputs(a->journals.n == 0 ? "twice verdict: no journal given\n"
                                 : "twice verdict: no effects list given: --effects EFFECTS\n",
              err);
        usage(err);
        return -1;
    }
    a->json = a->format != NULL && strcmp(a->format, "json") == 0;
    a->markdown = a->format != NULL && strcmp(a->format, "markdown") == 0;
    if (a->opt.stall_after_us == 0)
        a->opt.stall_after_us = VERDICT_STALL_AFTER_US;
    return 0;
}

/* The exit code of a computed verdict: the first that applies, in the order of verdict.h.  A
 * damaged journal comes after NOT IDEMPOTENT (a side effect done twice is so whatever was lost)
 * and before what the lost records may explain: evidence short of --require, work that seems
 * to have stopped. */
static int exit_code(const struct verdict_result *res, const struct verdict_inputs *in)
{
    if (res->effects_check != VERDICT_EFFECTS_OK)
        return VERDICT_EXIT_EFFECTS;
    if (res->overall == VERDICT_NOT_IDEMPOTENT)
        return VERDICT_EXIT_NOT_IDEMPOTENT;
    if (damage_any(&in->damage) && !in->allow_damaged)
        return VERDICT_EXIT_DAMAGED;
    if (res->any_required_short)
        return VERDICT_EXIT_UNTESTED;
    if (res->any_stalled)
        return VERDICT_EXIT_STALLED;
    return 0;
}

/* Every effects file into v, their lines summed.  0, or -1 with a message in err. */
static int load_effects(struct verdict *v, const struct verdict_args *a, uint64_t *lines, char *err,
                        size_t errlen)
{
    *lines = 0;
    for (size_t i = 0; i < a->n_effects; i++) {
        uint64_t n = 0;
        if (verdict_load_effects(v, a->effects[i], &n, err, errlen) != 0)
            return -1;
        *lines += n;
    }
    return 0;
}

/* Loads both inputs and prints the verdict.  Returns the exit code. */
static int verdict_execute(const struct verdict_args *a, FILE *out, FILE *err)
{
    char msg[VERDICT_ERR_MAX];
    struct verdict_inputs in = {.effects = a->effects[0],
                                .effects_files = a->effects,
                                .n_effects_files = a->n_effects,
                                .allow_damaged = a->allow_damaged};
    struct verdict_result res = {0};
    struct verdict *v = verdict_new();
    int code = VERDICT_EXIT_ERROR;
    if ((a->html != NULL || a->markdown) && (in.faults = calloc(1, sizeof(*in.faults))) == NULL)
        snprintf(msg, sizeof(msg), "out of memory");
    else if (v == NULL)
        snprintf(msg, sizeof(msg), "out of memory");
    else if (load_journal(v, &a->journals, &in, msg, sizeof(msg)) == 0 &&
             load_effects(v, a, &in.effect_lines, msg, sizeof(msg)) == 0) {
        if (verdict_compute_with(v, &a->opt, &res) != 0)
            snprintf(msg, sizeof(msg), "out of memory");
        else
            code = exit_code(&res, &in);
    }
    struct verdict_page page = {v, &res, &in, &a->opt};
    if (code != VERDICT_EXIT_ERROR && a->html != NULL &&
        page_write_file(a->html, out, write_verdict_page, &page, msg, sizeof(msg)) != 0)
        code = VERDICT_EXIT_ERROR;
    if (code != VERDICT_EXIT_ERROR && a->markdown && print_markdown(out, &res, &in, &a->opt) != 0) {
        snprintf(msg, sizeof(msg), "out of memory");
        code = VERDICT_EXIT_ERROR;
    }
    if (code == VERDICT_EXIT_ERROR)
        fprintf(err, "twice verdict: %s\n", msg);
    else if (a->json)
        print_json(out, &res, &in);
    else if (!a->markdown)
        print_human(out, &res, &in, &a->opt);
    if (code != VERDICT_EXIT_ERROR && a->json) {
        if (in.truncated)
            fputs("twice verdict: warning: the journal's last record is cut short\n", err);
        if (!in.clean_stop)
            fputs("twice verdict: warning: the journal ended without a clean stop\n", err);
        if (in.unclean > 0)
            fprintf(err,
                    "twice verdict: warning: %llu of the journal's %llu runs ended without a "
                    "clean stop\n",
                    (unsigned long long)in.unclean, (unsigned long long)in.runs);
        if (damage_any(&in.damage))
            fprintf(err, "twice verdict: %s: the journal is damaged (%llu bytes skipped)%s\n",
                    a->allow_damaged ? "warning" : "error", (unsigned long long)in.damage.sum.bytes,
                    a->allow_damaged ? "" : ": exit 6 unless --allow-damaged");
        if (res.effects_check != VERDICT_EFFECTS_OK)
            fprintf(err,
                    "twice verdict: error: the effects list does not match the journal "
                    "(effects_check: %s)\n",
                    effects_check_name(res.effects_check));
    }
    verdict_result_free(&res);
    verdict_free(v);
    changes_free(&in.changes);
    journal_set_close(in.set);
    if (in.faults != NULL)
        fault_log_free(in.faults);
    free(in.faults);
    return code;
}

int verdict_run(int argc, char **argv, FILE *out, FILE *err)
{
    struct verdict_args a;
    int rc = parse_args(argc, argv, &a, out, err);
    int code = rc != 0 ? (rc > 0 ? 0 : VERDICT_EXIT_ERROR) : verdict_execute(&a, out, err);
    journal_paths_free(&a.journals);
    free(a.effects);
    if (rc != 0)
        return code;
    if (fflush(out) != 0 && code != VERDICT_EXIT_ERROR) {
        fprintf(err, "twice verdict: writing the output: %s\n", strerror(errno));
        code = VERDICT_EXIT_ERROR;
    }
    return code;
}

int verdict_main(int argc, char **argv)
{
    return verdict_run(argc, argv, stdout, stderr);
}
