/*
 * report.c - `twice report`.  See report.h.
 *
 * One pass over the journal fills a struct report (counters and hash maps);
 * the printers then walk it, sorting what they list so the output is stable.
 * Per-message delivery counts are stored in the map's value pointer itself
 * (uintptr_t), which saves one allocation per message id.
 */
#include "offline/report.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
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
#include "offline/strmap.h"
#include "offline/verdict.h"
#include "rules/rule.h"

/* by_kind slots: Record.Kind codes 0..13, then one for codes a newer writer added. */
#define REPORT_KINDS 14
/* by_event slots: enum rule_event codes, then one for unknown codes. */
#define REPORT_EVENTS (RULE_EV_COUNT + 1)
/* Room for error messages and formatted times. */
#define REPORT_ERR_MAX 512
#define REPORT_TIME_MAX 40

static const char *const report_kind_names[] = {
    "unspecified", "connect", "close",   "deliver", "ack",  "nack",    "publish",
    "confirm",     "fault",   "command", "running", "stop", "expired", "rules",
};
_Static_assert(sizeof(report_kind_names) / sizeof(report_kind_names[0]) == REPORT_KINDS,
               "one name per Record.Kind code");

struct report_rule {
    uint64_t count;
    uint32_t action;
    char *action_name; /* owned; from the first fault of the rule */
    uint64_t by_event[REPORT_EVENTS];
};

/* One twice run of the journal (a journal of several: `journal PATH append`). */
struct report_run {
    Twice__Journal__Header *header; /* owned copy */
    size_t source;                  /* its journal among those read, 0-based */
    uint64_t records;
    bool clean_stop; /* its last record is a stop record */
};

struct report {
    const char *path;                     /* the first journal's */
    struct journal_paths journals;        /* every journal given, globs expanded */
    struct journal_set *set;              /* those journals, read together */
    size_t *current;                      /* per journal: its run now read (index into runs) */
    const char *message;                  /* --message ID, or NULL */
    const Twice__Journal__Header *header; /* the first run's: runs[0].header */
    struct report_run *runs;              /* owned, in journal order; at least one */
    size_t n_runs, cap_runs;
    uint64_t unclean_runs;  /* runs before the last that ended without a stop record */
    struct changes changes; /* of the rules in force (RULES records) */
    uint64_t records;
    bool truncated;
    bool clean_stop; /* the journal ends with its stop record */
    struct damage_report damage;
    uint64_t by_kind[REPORT_KINDS + 1];
    struct strmap rules;    /* rule name -> struct report_rule * (owned) */
    struct strmap messages; /* message id -> DELIVER count, as uintptr_t */
    struct strmap reasons;  /* close reason name -> count, as uintptr_t */
    struct strmap expired;  /* rule that held or dropped the ack ("" for none) -> EXPIRED
                               records, as uintptr_t: consequences of faults, not faults */
    uint64_t connections, closes, bytes_up, bytes_down;
    Twice__Journal__Record **timeline; /* owned copies of --message's records */
    uint32_t *timeline_run;            /* the twice run of each, 1-based */
    size_t n_timeline, cap_timeline;
    uint64_t timeline_more;   /* records past REPORT_TIMELINE_MAX */
    struct verdict *attempts; /* every record: the app's retries per task, the deliveries
                                 replayed (no effects) */
    bool all_messages;        /* --messages */
    struct fault_log *faults; /* --html, --format markdown: the faults' times; else NULL */
    const char *html;         /* --html FILE */
    bool markdown;            /* --format markdown */
    const char *format;       /* --format or --json as given, NULL: text */
};

static const char *kind_name(uint32_t kind)
{
    return kind < REPORT_KINDS ? report_kind_names[kind] : "other";
}

static const char *event_name(uint32_t event)
{
    return event < RULE_EV_COUNT ? rule_event_name((enum rule_event)event) : "other";
}

static void rule_free(void *p)
{
    struct report_rule *r = p;
    if (r != NULL)
        free(r->action_name);
    free(r);
}

static void report_free(struct report *rep)
{
    strmap_free(&rep->rules, rule_free);
    strmap_free(&rep->messages, NULL);
    strmap_free(&rep->reasons, NULL);
    strmap_free(&rep->expired, NULL);
    for (size_t i = 0; i < rep->n_timeline; i++)
        twice__journal__record__free_unpacked(rep->timeline[i], NULL);
    free(rep->timeline);
    free(rep->timeline_run);
    changes_free(&rep->changes);
    for (size_t i = 0; i < rep->n_runs; i++)
        twice__journal__header__free_unpacked(rep->runs[i].header, NULL);
    free(rep->runs);
    verdict_free(rep->attempts);
    free(rep->current);
    journal_set_close(rep->set);
    journal_paths_free(&rep->journals);
    if (rep->faults != NULL)
        fault_log_free(rep->faults);
    free(rep->faults);
}

/* An owned copy of a protobuf-c message, by packing and unpacking it. */
static void *message_copy(const ProtobufCMessage *m)
{
    size_t size = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(size != 0 ? size : 1);
    if (buf == NULL)
        return NULL;
    protobuf_c_message_pack(m, buf);
    void *copy = protobuf_c_message_unpack(m->descriptor, NULL, size, buf);
    free(buf);
    return copy;
}

/* Adds n to the counter stored in key's value pointer.  -1 when out of memory. */
static int map_count(struct strmap *m, const char *key, uintptr_t n)
{
    bool inserted = false;
    void **slot = strmap_put(m, key, &inserted);
    if (slot == NULL)
        return -1;
    *slot = (void *)((uintptr_t)*slot + n);
    return 0;
}

static int add_fault(struct report *rep, const Twice__Journal__Record *r)
{
    bool inserted = false;
    void **slot = strmap_put(&rep->rules, r->rule[0] != '\0' ? r->rule : "(none)", &inserted);
    if (slot == NULL)
        return -1;
    if (*slot == NULL) {
        struct report_rule *rule = calloc(1, sizeof(*rule));
        if (rule == NULL || (rule->action_name = strdup(r->action_name)) == NULL) {
            free(rule);
            return -1;
        }
        rule->action = r->action;
        *slot = rule;
    }
    struct report_rule *rule = *slot;
    rule->count++;
    rule->by_event[r->event < RULE_EV_COUNT ? r->event : RULE_EV_COUNT]++;
    return 0;
}

static int add_close(struct report *rep, const Twice__Journal__Record *r)
{
    char name[32];
    const char *reason = r->close_reason_name;
    if (reason[0] == '\0') {
        snprintf(name, sizeof(name), "reason %u", (unsigned)r->close_reason);
        reason = name;
    }
    rep->closes++;
    rep->bytes_up += r->bytes_up;
    rep->bytes_down += r->bytes_down;
    return map_count(&rep->reasons, reason, 1);
}

static int add_timeline(struct report *rep, const Twice__Journal__Record *r, size_t run)
{
    if (rep->n_timeline == REPORT_TIMELINE_MAX) {
        rep->timeline_more++;
        return 0;
    }
    if (rep->n_timeline == rep->cap_timeline) {
        size_t cap = rep->cap_timeline != 0 ? rep->cap_timeline * 2 : 16;
        Twice__Journal__Record **t = realloc(rep->timeline, cap * sizeof(*t));
        if (t == NULL)
            return -1;
        rep->timeline = t;
        uint32_t *runs = realloc(rep->timeline_run, cap * sizeof(*runs));
        if (runs == NULL)
            return -1;
        rep->timeline_run = runs;
        rep->cap_timeline = cap;
    }
    Twice__Journal__Record *copy = message_copy(&r->base);
    if (copy == NULL)
        return -1;
    rep->timeline_run[rep->n_timeline] = (uint32_t)run;
    rep->timeline[rep->n_timeline++] = copy;
    return 0;
}

/* run: the record's twice run, 1-based among the report's runs. */
static int add_message(struct report *rep, const Twice__Journal__Record *r, size_t run)
{
    bool deliver = r->kind == TWICE__JOURNAL__RECORD__KIND__DELIVER;
    if (map_count(&rep->messages, r->message_id, deliver ? 1 : 0) != 0)
        return -1;
    if (rep->message != NULL && strcmp(rep->message, r->message_id) == 0)
        return add_timeline(rep, r, run);
    return 0;
}

/* Starts a twice run of journal `source` with header h (the journal's first, or a later
 * run's).  0, or -1 when out of memory. */
static int add_run(struct report *rep, size_t source, const Twice__Journal__Header *h)
{
    if (rep->n_runs == rep->cap_runs) {
        size_t cap = rep->cap_runs != 0 ? rep->cap_runs * 2 : 4;
        struct report_run *runs = realloc(rep->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return -1;
        rep->runs = runs;
        rep->cap_runs = cap;
    }
    struct report_run *run = &rep->runs[rep->n_runs];
    memset(run, 0, sizeof(*run));
    run->header = message_copy(&h->base);
    if (run->header == NULL)
        return -1;
    run->source = source;
    rep->current[source] = rep->n_runs++;
    rep->header = rep->runs[0].header;
    if (rep->faults != NULL)
        fault_log_add_header(rep->faults, h);
    return verdict_add_source_header(rep->attempts, (uint32_t)source, h,
                                     journal_set_info(rep->set, source)->instance);
}

/* Accounts one record of journal `source`.  0, or -1 when out of memory. */
static int report_add(struct report *rep, size_t source, const Twice__Journal__Record *r)
{
    rep->records++;
    size_t run_index = rep->current[source];
    struct report_run *run = &rep->runs[run_index];
    run->records++;
    run->clean_stop = r->kind == TWICE__JOURNAL__RECORD__KIND__STOP;
    rep->by_kind[(uint32_t)r->kind < REPORT_KINDS ? (uint32_t)r->kind : REPORT_KINDS]++;
    int rc = 0;
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__CONNECT)
        rep->connections++;
    else if (r->kind == TWICE__JOURNAL__RECORD__KIND__CLOSE)
        rc = add_close(rep, r);
    else if (r->kind == TWICE__JOURNAL__RECORD__KIND__FAULT)
        rc = add_fault(rep, r);
    else if (r->kind == TWICE__JOURNAL__RECORD__KIND__EXPIRED)
        rc = map_count(&rep->expired, r->rule, 1);
    if (rc == 0 && r->message_id[0] != '\0')
        rc = add_message(rep, r, run_index + 1);
    if (rc == 0)
        rc = verdict_add_source_record(rep->attempts, (uint32_t)source, r);
    if (rc == 0 && rep->faults != NULL)
        rc = fault_log_add_record(rep->faults, r);
    return rc;
}

static int feed_header(void *ctx, size_t source, const Twice__Journal__Header *h, bool first)
{
    (void)first;
    return add_run(ctx, source, h);
}

static int feed_record(void *ctx, size_t source, const Twice__Journal__Record *r)
{
    return report_add(ctx, source, r);
}

/* Reads every journal into rep, merged by time.  0, or -1 with a message in err. */
static int report_load(struct report *rep, char *err, size_t errlen)
{
    rep->set = journal_set_open(&rep->journals, err, errlen);
    if (rep->set == NULL)
        return -1;
    rep->path = journal_set_info(rep->set, 0)->path;
    rep->attempts = verdict_new();
    rep->current = calloc(journal_set_count(rep->set), sizeof(*rep->current));
    if (rep->attempts == NULL || rep->current == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct instances_feed feed = {rep, feed_header, feed_record};
    if (instances_read(rep->set, &feed, &rep->changes, err, errlen) != 0)
        return -1;
    struct journal_info total;
    journal_set_total(rep->set, &total);
    rep->truncated = total.truncated;
    rep->clean_stop = total.clean_stop;
    rep->unclean_runs = total.unclean_runs;
    rep->damage = total.damage;
    return 0;
}

/* The used slots of m, sorted by key.  Caller frees; NULL when empty or OOM. */
static const struct strmap_slot **sorted_slots(const struct strmap *m)
{
    const struct strmap_slot **v =
        malloc((strmap_count(m) != 0 ? strmap_count(m) : 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    size_t pos = 0, n = 0;
    const struct strmap_slot *s = NULL;
    while (strmap_next(m, &pos, &s))
        v[n++] = s;
    return v;
}

static int slot_cmp(const void *a, const void *b)
{
    const struct strmap_slot *const *x = a, *const *y = b;
    return strcmp((*x)->key, (*y)->key);
}

static void sort_slots(const struct strmap_slot **v, size_t n)
{
    qsort(v, n, sizeof(*v), slot_cmp);
}

/* The busiest messages by DELIVER count (ties by id), up to REPORT_TOP_N. */
struct report_top {
    const char *id[REPORT_TOP_N];
    uint64_t count[REPORT_TOP_N];
    size_t n;
};

static bool top_before(uint64_t count, const char *id, uint64_t other_count, const char *other)
{
    return count != other_count ? count > other_count : strcmp(id, other) < 0;
}

static void top_add(struct report_top *top, const char *id, uint64_t count)
{
    size_t i = top->n;
    if (i == REPORT_TOP_N) {
        if (!top_before(count, id, top->count[i - 1], top->id[i - 1]))
            return;
        i--;
    } else {
        top->n++;
    }
    for (; i > 0 && top_before(count, id, top->count[i - 1], top->id[i - 1]); i--) {
        top->id[i] = top->id[i - 1];
        top->count[i] = top->count[i - 1];
    }
    top->id[i] = id;
    top->count[i] = count;
}

/* Delivery statistics over all message ids. */
struct report_deliveries {
    uint64_t messages, delivered, more_than_once;
    struct report_top top;
};

static void deliveries_compute(const struct report *rep, struct report_deliveries *d)
{
    memset(d, 0, sizeof(*d));
    size_t pos = 0;
    const struct strmap_slot *s = NULL;
    while (strmap_next(&rep->messages, &pos, &s)) {
        uint64_t n = (uintptr_t)s->value;
        d->messages++;
        d->delivered += n >= 1;
        d->more_than_once += n >= 2;
        if (n >= 1)
            top_add(&d->top, s->key, n);
    }
}

/* "2026-11-29T09:00:00.123Z" for a time in microseconds. */
static void format_time(char *buf, size_t len, uint64_t unix_us)
{
    time_t secs = (time_t)(unix_us / 1000000u);
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL) {
        snprintf(buf, len, "%llu", (unsigned long long)unix_us);
        return;
    }
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03uZ", (unsigned)(unix_us / 1000u % 1000u));
}

static void format_hex(char *buf, const ProtobufCBinaryData *b, size_t max)
{
    size_t n = b->len < max ? b->len : max;
    for (size_t i = 0; i < n; i++)
        sprintf(buf + 2 * i, "%02x", b->data[i]);
    buf[2 * n] = '\0';
}

/* ---- human output ---------------------------------------------------- */

static void print_header_text(FILE *out, const struct report *rep)
{
    const Twice__Journal__Header *h = rep->header;
    char when[REPORT_TIME_MAX], hex[65];
    format_time(when, sizeof(when), h->start_unix_ms * 1000u);
    format_hex(hex, &h->config_sha256, 32);
    bool several = journal_set_count(rep->set) > 1;
    instances_print_text(out, rep->set);
    fputs("journal   ", out);
    text_write_safe(out, rep->path);
    fprintf(out, " (format %u, twice ", (unsigned)h->version);
    text_write_safe(out, h->twice_version);
    fputs(several ? "; the first journal's header below)\ninstance  " : ")\ninstance  ", out);
    text_write_safe(out, journal_set_info(rep->set, 0)->instance);
    fprintf(out, "\nseed      %llu\nconfig    ", (unsigned long long)h->seed);
    text_write_safe(out, h->config_path);
    fprintf(out, " sha256:%s\nstarted   %s\nrecords   %llu", hex, when,
            (unsigned long long)rep->records);
    const char *sep = " (";
    for (size_t k = 0; k <= REPORT_KINDS; k++) {
        if (rep->by_kind[k] == 0)
            continue;
        fprintf(out, "%s%s %llu", sep, kind_name((uint32_t)k), (unsigned long long)rep->by_kind[k]);
        sep = ", ";
    }
    fputs(sep[0] == ',' ? ")\n" : "\n", out);
    if (rep->n_runs > 1 && !several)
        fprintf(out,
                "runs      %zu (twice started on this file %zu times, `journal PATH append`: the "
                "seed, config and start above are the first run's)\n",
                rep->n_runs, rep->n_runs);
    else if (rep->n_runs > 1)
        fprintf(out,
                "runs      %zu in %zu journals (the seed, config and start above are the "
                "first journal's)\n",
                rep->n_runs, journal_set_count(rep->set));
    instances_print_mixed(out, rep->set);
    for (size_t i = 0; i < h->n_listeners; i++) {
        const Twice__Journal__Listener *l = h->listeners[i];
        fputs(i > 0 ? ", " : several ? "listeners (the first journal's) " : "listeners ", out);
        text_write_safe(out, l->name);
        fputs(" (", out);
        text_write_safe(out, l->protocol);
        if (l->profile[0] != '\0') {
            fputs(", ", out);
            text_write_safe(out, l->profile);
        }
        fputc(')', out);
    }
    if (h->n_listeners > 0)
        fputc('\n', out);
    if (rep->truncated)
        fputs("warning: the last record is cut short (the proxy died while writing it)\n", out);
    if (!rep->clean_stop)
        fputs(REPORT_NO_CLEAN_STOP "\n", out);
    if (rep->unclean_runs > 0)
        fprintf(out, REPORT_UNCLEAN_RUNS "\n", (unsigned long long)rep->unclean_runs,
                (unsigned long long)rep->n_runs);
    instances_print_damage(out, rep->set, &rep->damage, "warning");
}

/* The instance that wrote run: its header's, else its journal's. */
static const char *run_instance(const struct report *rep, const struct report_run *run)
{
    const char *inst = run->header->instance;
    return inst != NULL && inst[0] != '\0' ? inst
                                           : journal_set_info(rep->set, run->source)->instance;
}

/* A journal of several runs: one line each. */
static void print_runs_text(FILE *out, const struct report *rep)
{
    if (rep->n_runs < 2)
        return;
    fprintf(out, "\nRuns\n  %3s  %-24s  %8s  %-13s  %-20s  %-20s  %s\n", "RUN", "STARTED",
            "RECORDS", "ENDED", "SEED", "INSTANCE", "CONFIG");
    for (size_t i = 0; i < rep->n_runs; i++) {
        const struct report_run *run = &rep->runs[i];
        char when[REPORT_TIME_MAX], hex[65];
        format_time(when, sizeof(when), run->header->start_unix_ms * 1000u);
        format_hex(hex, &run->header->config_sha256, 32);
        fprintf(out, "  %3zu  %-24s  %8llu  %-13s  %-20llu  ", i + 1, when,
                (unsigned long long)run->records, run->clean_stop ? "stop" : "no clean stop",
                (unsigned long long)run->header->seed);
        int w = text_write_safe(out, run_instance(rep, run));
        fprintf(out, "%*s  ", w < 20 ? 20 - w : 0, "");
        text_write_safe(out, run->header->config_path);
        fprintf(out, " sha256:%s\n", hex);
    }
}

static void print_rule_events_text(FILE *out, const struct report_rule *r)
{
    const char *sep = "";
    for (uint32_t e = 0; e < REPORT_EVENTS; e++) {
        if (r->by_event[e] == 0)
            continue;
        fprintf(out, "%s%s=%llu", sep, event_name(e), (unsigned long long)r->by_event[e]);
        sep = " ";
    }
}

static int print_faults_text(FILE *out, const struct report *rep)
{
    fputs("\nFaults per rule\n", out);
    if (strmap_count(&rep->rules) == 0) {
        fputs("  (no faults injected)\n", out);
        return 0;
    }
    const struct strmap_slot **v = sorted_slots(&rep->rules);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->rules));
    fprintf(out, "  %-24s %8s  %-12s %s\n", "RULE", "FAULTS", "ACTION", "BY EVENT");
    for (size_t i = 0; i < strmap_count(&rep->rules); i++) {
        const struct report_rule *r = v[i]->value;
        fputs("  ", out);
        int n = text_write_safe(out, v[i]->key);
        fprintf(out, "%*s %8llu  ", n < 24 ? 24 - n : 0, "", (unsigned long long)r->count);
        n = text_write_safe(out, r->action_name);
        fprintf(out, "%*s ", n < 12 ? 12 - n : 0, "");
        print_rule_events_text(out, r);
        fputc('\n', out);
    }
    free(v);
    return 0;
}

/* The requeues a listener's timeout made, by the rule that held or dropped the ack: each is
 * the consequence of that rule's fault (counted above), not a fault of its own. */
static int print_expired_text(FILE *out, const struct report *rep)
{
    if (strmap_count(&rep->expired) == 0)
        return 0;
    const struct strmap_slot **v = sorted_slots(&rep->expired);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->expired));
    fputs("\nRequeued by a visibility or consumer timeout (consequences, not faults)\n", out);
    fprintf(out, "  %-24s %8s  %s\n", "RULE", "EXPIRED", "WHY");
    for (size_t i = 0; i < strmap_count(&rep->expired); i++) {
        bool rule = v[i]->key[0] != '\0';
        fputs("  ", out);
        int n = text_write_safe(out, rule ? v[i]->key : "-");
        fprintf(out, "%*s %8llu  %s\n", n < 24 ? 24 - n : 0, "",
                (unsigned long long)(uintptr_t)v[i]->value,
                rule ? "the rule held or dropped the ack" : "the worker did not ack in time");
    }
    free(v);
    return 0;
}

static void print_deliveries_text(FILE *out, const struct report *rep)
{
    struct report_deliveries d;
    deliveries_compute(rep, &d);
    fprintf(out,
            "\nDeliveries per message\n  message ids               %llu\n"
            "  delivered                 %llu\n  delivered more than once  %llu\n",
            (unsigned long long)d.messages, (unsigned long long)d.delivered,
            (unsigned long long)d.more_than_once);
    if (d.top.n == 0)
        return;
    struct idshort ids;
    idshort_init(&ids);
    for (size_t i = 0; i < d.top.n; i++)
        idshort_add(&ids, d.top.id[i]);
    idshort_finish(&ids);
    fprintf(out, "  top %zu by deliveries:\n  %10s  %s\n", d.top.n, "DELIVERIES", "MESSAGE");
    for (size_t i = 0; i < d.top.n; i++) {
        fprintf(out, "  %10llu  ", (unsigned long long)d.top.count[i]);
        idshort_write(out, &ids, d.top.id[i]);
        fputc('\n', out);
    }
    idshort_print_list(out, &ids, "  message ids in full:");
    idshort_free(&ids);
}

/* The tasks the app retried, from the verdict of the journal's messages. */
static void print_retries_text(FILE *out, const struct verdict_result *res)
{
    fputs("\nRetries by the app (new attempts it asked for, not copies)\n", out);
    bool any = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        if (t->retried == 0)
            continue;
        if (!any)
            fprintf(out, "  %-32s %8s  %s\n", "TASK", "RETRIED", "MOST RETRIES");
        any = true;
        fputs("  ", out);
        int n = text_write_safe(out, t->task);
        fprintf(out, "%*s %8llu  %llu\n", n < 32 ? 32 - n : 0, "", (unsigned long long)t->retried,
                (unsigned long long)t->max_retries);
    }
    if (!any)
        fputs("  (none)\n", out);
}

/* The tasks whose messages the framework failed (for good, or while a worker still ran them),
 * from the same verdict. */
static void print_failed_text(FILE *out, const struct verdict_result *res)
{
    bool any = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        if (t->failed == 0 && t->abandoned == 0)
            continue;
        if (!any)
            fprintf(out,
                    "\nFailed by the framework (FAILED: for good; ABANDONED: while a worker still "
                    "ran it, which completed it after)\n  %-32s %8s %10s  %s\n",
                    "TASK", "FAILED", "ABANDONED", "E.G.");
        any = true;
        fputs("  ", out);
        int n = text_write_safe(out, t->task);
        fprintf(out, "%*s %8llu %10llu  ", n < 32 ? 32 - n : 0, "", (unsigned long long)t->failed,
                (unsigned long long)t->abandoned);
        const struct verdict_examples *ex =
            t->abandoned > 0 ? &t->abandoned_examples : &t->failed_examples;
        if (ex->n > 0)
            text_write_safe(out, ex->ids[0]);
        fputc('\n', out);
    }
}

static int print_connections_text(FILE *out, const struct report *rep)
{
    fprintf(out, "\nConnections\n  connections %llu, closed %llu, bytes up %llu, bytes down %llu\n",
            (unsigned long long)rep->connections, (unsigned long long)rep->closes,
            (unsigned long long)rep->bytes_up, (unsigned long long)rep->bytes_down);
    if (strmap_count(&rep->reasons) == 0)
        return 0;
    const struct strmap_slot **v = sorted_slots(&rep->reasons);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->reasons));
    fputs("  by close reason:", out);
    for (size_t i = 0; i < strmap_count(&rep->reasons); i++) {
        fputc(' ', out);
        text_write_safe(out, v[i]->key);
        fprintf(out, "=%llu", (unsigned long long)(uintptr_t)v[i]->value);
    }
    fputc('\n', out);
    free(v);
    return 0;
}

/* ` key=value` for a non-empty string field. */
static void print_field_text(FILE *out, const char *key, const char *value)
{
    if (value == NULL || value[0] == '\0')
        return;
    fprintf(out, " %s=", key);
    text_write_safe(out, value);
}

/* What the verdict made of delivery d: "first", "copy", "set aside", "withheld" or
 * "unreached" (the attempt's first live delivery, never seen to finish). */
static const char *delivery_counted(const struct verdict_delivery *d)
{
    if (d->withheld)
        return "withheld";
    if (d->set_aside)
        return "set aside";
    if (d->overlap != VERDICT_COPY_NONE)
        return "copy";
    return d->reached ? "first" : "unreached";
}

/* The marks of a DELIVER record in the timeline: what the verdict counted it as. */
static void print_delivery_marks(FILE *out, const struct verdict_delivery *d)
{
    if (d->set_aside) {
        fputs(" set_aside", out);
    } else if (d->overlap != VERDICT_COPY_NONE) {
        fprintf(out, " copy_after=%.3fs", (double)d->copy_delay_us / 1e6);
        if (d->overlap == VERDICT_COPY_OVERLAP)
            fprintf(out, " OVERLAP=%.3fs", (double)d->overlap_us / 1e6);
        else
            fprintf(out, " overlap=%s", d->overlap == VERDICT_COPY_AFTER ? "no" : "unknown");
    }
}

/* d: the replayed delivery when r is a DELIVER record, else NULL; twice_run: r's twice run,
 * 0 in a journal of one. */
static void print_timeline_record_text(FILE *out, const Twice__Journal__Record *r, uint64_t t0,
                                       const struct verdict_delivery *d, uint32_t twice_run)
{
    char when[REPORT_TIME_MAX];
    format_time(when, sizeof(when), r->time_unix_us);
    int64_t off = (int64_t)(r->time_unix_us - t0);
    fprintf(out, "  %+10.3fs  %s  %-8s session=%llu", (double)off / 1e6, when,
            kind_name((uint32_t)r->kind), (unsigned long long)r->session);
    if (twice_run != 0)
        fprintf(out, " twice_run=%u", (unsigned)twice_run);
    print_field_text(out, "listener", r->listener);
    print_field_text(out, "queue", r->queue);
    print_field_text(out, "task", r->task);
    if (r->delivery_tag != 0)
        fprintf(out, " tag=%llu", (unsigned long long)r->delivery_tag);
    if (r->redelivered)
        fputs(" redelivered", out);
    if (r->retries != 0)
        fprintf(out, " retries=%u", (unsigned)r->retries);
    if (r->retry)
        fputs(r->kind == TWICE__JOURNAL__RECORD__KIND__NACK ? " requeue" : " retry", out);
    if (r->refused)
        fputs(" refused", out);
    if (r->kept_back)
        fputs(" kept_back", out);
    if (r->auto_ack)
        fputs(" auto_ack", out);
    print_field_text(out, "rule", r->rule);
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__FAULT) {
        print_field_text(out, "action", r->action_name);
        fprintf(out, " event=%s", event_name(r->event));
    }
    print_field_text(out, "run", r->run);
    print_field_text(out, "detail", r->detail);
    if (d != NULL)
        print_delivery_marks(out, d);
    fputc('\n', out);
}

/* A delivery's connection: its session id, as RUN:SESSION past a journal's first twice run,
 * after INSTANCE/ when several journals are read. */
static void format_session(char *buf, size_t len, const struct verdict_delivery *d, bool several)
{
    if (several && d->instance != NULL) {
        int n = snprintf(buf, len, "%s/", d->instance);
        if (n < 0 || (size_t)n >= len)
            return;
        buf += n;
        len -= (size_t)n;
    }
    if (d->twice_run > 1)
        snprintf(buf, len, "%u:%llu", (unsigned)d->twice_run, (unsigned long long)d->session);
    else
        snprintf(buf, len, "%llu", (unsigned long long)d->session);
}

/* One line per replayed delivery: when it came, how it ended, what the verdict counted. */
static void print_deliveries_table(FILE *out, const struct verdict_delivery *d, size_t n,
                                   uint64_t t0, bool several)
{
    fputs("\nDeliveries, as the verdict counts them\n", out);
    fprintf(out, "  %3s  %10s  %8s  %6s  %-34s  %s\n", "#", "AT", "SESSION", "TAG", "ENDED",
            "COUNTED");
    for (size_t i = 0; i < n; i++) {
        char ended[64];
        if (d[i].settled)
            snprintf(ended, sizeof(ended), "%s%s at %+.3fs%s", d[i].refused ? "refused " : "",
                     d[i].nack ? "nack" : "ack", (double)(int64_t)(d[i].settled_us - t0) / 1e6,
                     d[i].settled_guess ? " (guess)" : "");
        else if (d[i].auto_ack)
            snprintf(ended, sizeof(ended), "auto-ack (no ack asked)");
        else if (d[i].closed_us != 0)
            snprintf(ended, sizeof(ended), "never settled, closed at %+.3fs",
                     (double)(int64_t)(d[i].closed_us - t0) / 1e6);
        else
            snprintf(ended, sizeof(ended), "never settled");
        char session[96];
        format_session(session, sizeof(session), &d[i], several);
        fprintf(out, "  %3zu  %+9.3fs  %8s  %6llu  %-34s  %s", i + 1,
                (double)(int64_t)(d[i].time_us - t0) / 1e6, session, (unsigned long long)d[i].tag,
                ended, delivery_counted(&d[i]));
        if (d[i].overlap == VERDICT_COPY_OVERLAP)
            fprintf(out, ", ran beside an earlier delivery for %.3fs at least",
                    (double)d[i].overlap_us / 1e6);
        else if (d[i].overlap == VERDICT_COPY_AFTER)
            fputs(", after the earlier ones were settled", out);
        else if (d[i].overlap == VERDICT_COPY_UNKNOWN)
            fputs(", overlap unknown", out);
        else if (d[i].set_aside)
            fputs(": no worker was seen to finish the delivery before it, or it", out);
        fputc('\n', out);
    }
}

/* 0, 1 when the message is not in the journal, -1 when out of memory. */
static int print_timeline_text(FILE *out, const struct report *rep)
{
    fputs("\nTimeline of message ", out);
    text_write_safe(out, rep->message);
    fprintf(out, " (%zu records)\n", rep->n_timeline);
    if (rep->n_timeline == 0) {
        fputs("  (no record has this message id)\n", out);
        return 1;
    }
    struct verdict_delivery *d = NULL;
    size_t n = 0, k = 0;
    if (verdict_message_deliveries(rep->attempts, rep->message, &d, &n) < 0)
        return -1;
    uint64_t t0 = rep->timeline[0]->time_unix_us;
    for (size_t i = 0; i < rep->n_timeline; i++) {
        const Twice__Journal__Record *r = rep->timeline[i];
        bool deliver = r->kind == TWICE__JOURNAL__RECORD__KIND__DELIVER;
        print_timeline_record_text(out, r, t0, deliver && k < n ? &d[k++] : NULL,
                                   rep->n_runs > 1 ? rep->timeline_run[i] : 0);
    }
    if (rep->timeline_more > 0)
        fprintf(out, "  ... and %llu more records\n", (unsigned long long)rep->timeline_more);
    if (n > 0)
        print_deliveries_table(out, d, n, t0, journal_set_count(rep->set) > 1);
    free(d);
    return 0;
}

/* The state of a walk over every message (--messages). */
struct report_walk {
    const struct report *rep;
    FILE *out;
    bool first;
};

/* --messages: one line per delivery of each message. */
static int print_one_message_text(void *ctx, const char *id, const char *task)
{
    struct report_walk *w = ctx;
    struct verdict_delivery *d = NULL;
    size_t n = 0;
    if (verdict_message_deliveries(w->rep->attempts, id, &d, &n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char when[REPORT_TIME_MAX];
        format_time(when, sizeof(when), d[i].time_us);
        fputs("  ", w->out);
        text_write_safe(w->out, id);
        fputc(' ', w->out);
        text_write_safe(w->out, task != NULL ? task : "-");
        char session[96];
        format_session(session, sizeof(session), &d[i], journal_set_count(w->rep->set) > 1);
        fprintf(w->out, " #%zu %s session=%s tag=%llu %s", i + 1, when, session,
                (unsigned long long)d[i].tag,
                d[i].settled    ? (d[i].nack ? "nack" : "ack")
                : d[i].auto_ack ? "auto-ack"
                                : "unsettled");
        if (d[i].refused)
            fputs("(refused)", w->out);
        if (d[i].settled)
            fprintf(w->out, "=%+.3fs", (double)(int64_t)(d[i].settled_us - d[i].time_us) / 1e6);
        fprintf(w->out, " counted=%s", delivery_counted(&d[i]));
        if (d[i].overlap != VERDICT_COPY_NONE)
            fprintf(w->out, " overlap=%s", verdict_overlap_name(d[i].overlap));
        fputc('\n', w->out);
    }
    free(d);
    return 0;
}

static int print_messages_text(FILE *out, const struct report *rep)
{
    fputs("\nDeliveries of every message (ID TASK #N TIME SESSION TAG SETTLEMENT COUNTED)\n", out);
    struct report_walk w = {rep, out, true};
    return verdict_each_message(rep->attempts, print_one_message_text, &w);
}

static int print_text(FILE *out, const struct report *rep)
{
    print_header_text(out, rep);
    if (rep->message != NULL) {
        /* --message asks for one message's story: the journal's header
         * (which run), then its timeline, not the whole report before it. */
        int rc = print_timeline_text(out, rep);
        if (rc >= 0 && rep->all_messages && print_messages_text(out, rep) != 0)
            return -1;
        return rc;
    }
    print_runs_text(out, rep);
    changes_print_text(out, &rep->changes, rep->n_runs > 1);
    if (print_faults_text(out, rep) != 0 || print_expired_text(out, rep) != 0)
        return -1;
    print_deliveries_text(out, rep);
    /* One verdict of the journal's messages (rep->attempts) for both sections. */
    struct verdict_result res;
    if (verdict_compute(rep->attempts, &res) != 0)
        return -1;
    print_retries_text(out, &res);
    print_failed_text(out, &res);
    verdict_result_free(&res);
    if (print_connections_text(out, rep) != 0)
        return -1;
    if (rep->all_messages && print_messages_text(out, rep) != 0)
        return -1;
    return 0;
}

/* ---- JSON output ----------------------------------------------------- */

/* `"key": "value"` with a leading comma when not first. */
static void json_field(FILE *out, const char *sep, const char *key, const char *value)
{
    fprintf(out, "%s\"%s\": ", sep, key);
    json_write_string(out, value);
}

/* `"runs": [...]`: every twice run of the journal, the first included. */
static void print_runs_json(FILE *out, const struct report *rep)
{
    fputs(",\n  \"runs\": [", out);
    for (size_t i = 0; i < rep->n_runs; i++) {
        const struct report_run *run = &rep->runs[i];
        const Twice__Journal__Header *h = run->header;
        char when[REPORT_TIME_MAX], hex[65];
        format_time(when, sizeof(when), h->start_unix_ms * 1000u);
        format_hex(hex, &h->config_sha256, 32);
        fprintf(out, "%s{\"run\": %zu, \"seed\": \"%llu\"", i > 0 ? ",\n    " : "\n    ", i + 1,
                (unsigned long long)h->seed);
        json_field(out, ", ", "config_sha256", hex);
        json_field(out, ", ", "config_path", h->config_path);
        json_field(out, ", ", "twice_version", h->twice_version);
        fprintf(out, ", \"start_unix_ms\": %llu", (unsigned long long)h->start_unix_ms);
        json_field(out, ", ", "start", when);
        fprintf(out, ", \"records\": %llu, \"clean_stop\": %s", (unsigned long long)run->records,
                run->clean_stop ? "true" : "false");
        json_field(out, ", ", "instance", run_instance(rep, run));
        json_field(out, ", ", "journal", journal_set_info(rep->set, run->source)->path);
        fputc('}', out);
    }
    fputs("\n  ]", out);
}

static void print_header_json(FILE *out, const struct report *rep)
{
    const Twice__Journal__Header *h = rep->header;
    char when[REPORT_TIME_MAX], hex[65];
    format_time(when, sizeof(when), h->start_unix_ms * 1000u);
    format_hex(hex, &h->config_sha256, 32);
    json_field(out, "{\n  ", "journal", rep->path);
    json_field(out, ",\n  ", "instance", journal_set_info(rep->set, 0)->instance);
    /* The seed as a string: 64 random bits lose precision as a JSON number
     * in most readers (doubles), and the seed must come back exact. */
    fprintf(out, ",\n  \"version\": %u,\n  \"seed\": \"%llu\"", (unsigned)h->version,
            (unsigned long long)h->seed);
    json_field(out, ",\n  ", "config_sha256", hex);
    json_field(out, ",\n  ", "config_path", h->config_path);
    json_field(out, ",\n  ", "twice_version", h->twice_version);
    fprintf(out, ",\n  \"start_unix_ms\": %llu", (unsigned long long)h->start_unix_ms);
    json_field(out, ",\n  ", "start", when);
    fprintf(out, ",\n  \"records\": %llu,\n  \"truncated\": %s,\n  \"clean_stop\": %s,\n",
            (unsigned long long)rep->records, rep->truncated ? "true" : "false",
            rep->clean_stop ? "true" : "false");
    fputs("  \"damage\": ", out);
    damage_print_json(out, &rep->damage);
    fputs(",\n  \"by_kind\": {", out);
    for (size_t k = 1; k <= REPORT_KINDS; k++)
        fprintf(out, "%s\"%s\": %llu", k > 1 ? ", " : "",
                k < REPORT_KINDS ? kind_name((uint32_t)k) : "other",
                (unsigned long long)rep->by_kind[k]);
    fputc('}', out);
    print_runs_json(out, rep);
    fputs(",\n  \"rule_changes\": ", out);
    changes_print_json_list(out, &rep->changes, "\n  ");
    instances_print_json(out, rep->set, "\n  ");
}

static void print_rule_json(FILE *out, const struct strmap_slot *s)
{
    const struct report_rule *r = s->value;
    json_field(out, "    {", "rule", s->key);
    fprintf(out, ", \"faults\": %llu", (unsigned long long)r->count);
    json_field(out, ", ", "action", r->action_name);
    fprintf(out, ", \"action_code\": %u, \"by_event\": {", (unsigned)r->action);
    const char *sep = "";
    for (uint32_t e = 0; e < REPORT_EVENTS; e++) {
        if (r->by_event[e] == 0)
            continue;
        fprintf(out, "%s\"%s\": %llu", sep, event_name(e), (unsigned long long)r->by_event[e]);
        sep = ", ";
    }
    fputs("}}", out);
}

static int print_faults_json(FILE *out, const struct report *rep)
{
    const struct strmap_slot **v = sorted_slots(&rep->rules);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->rules));
    fputs(",\n  \"faults\": [", out);
    for (size_t i = 0; i < strmap_count(&rep->rules); i++) {
        fputs(i > 0 ? ",\n" : "\n", out);
        print_rule_json(out, v[i]);
    }
    fputs(strmap_count(&rep->rules) > 0 ? "\n  ]" : "]", out);
    free(v);
    return 0;
}

static int print_expired_json(FILE *out, const struct report *rep)
{
    const struct strmap_slot **v = sorted_slots(&rep->expired);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->expired));
    fputs(",\n  \"expired\": [", out);
    for (size_t i = 0; i < strmap_count(&rep->expired); i++) {
        json_field(out, i > 0 ? ", {" : "{", "rule", v[i]->key);
        fprintf(out, ", \"expired\": %llu}", (unsigned long long)(uintptr_t)v[i]->value);
    }
    fputc(']', out);
    free(v);
    return 0;
}

static void print_deliveries_json(FILE *out, const struct report *rep)
{
    struct report_deliveries d;
    deliveries_compute(rep, &d);
    fprintf(out,
            ",\n  \"deliveries\": {\"messages\": %llu, \"delivered\": %llu, "
            "\"delivered_more_than_once\": %llu, \"top\": [",
            (unsigned long long)d.messages, (unsigned long long)d.delivered,
            (unsigned long long)d.more_than_once);
    for (size_t i = 0; i < d.top.n; i++) {
        json_field(out, i > 0 ? ", {" : "{", "message_id", d.top.id[i]);
        fprintf(out, ", \"deliveries\": %llu}", (unsigned long long)d.top.count[i]);
    }
    fputs("]}", out);
}

static int print_retries_json(FILE *out, const struct report *rep)
{
    struct verdict_result res;
    if (verdict_compute(rep->attempts, &res) != 0)
        return -1;
    fputs(",\n  \"retries\": [", out);
    const char *sep = "";
    for (size_t i = 0; i < res.n_tasks; i++) {
        const struct verdict_task *t = &res.tasks[i];
        if (t->retried == 0)
            continue;
        fprintf(out, "%s{", sep);
        json_field(out, "", "task", t->task);
        fprintf(out, ", \"retried\": %llu, \"max_retries\": %llu}", (unsigned long long)t->retried,
                (unsigned long long)t->max_retries);
        sep = ", ";
    }
    fputs("],\n  \"failed\": [", out);
    sep = "";
    for (size_t i = 0; i < res.n_tasks; i++) {
        const struct verdict_task *t = &res.tasks[i];
        if (t->failed == 0 && t->abandoned == 0)
            continue;
        fprintf(out, "%s{", sep);
        json_field(out, "", "task", t->task);
        fprintf(out, ", \"failed\": %llu, \"abandoned\": %llu, \"abandoned_examples\": [",
                (unsigned long long)t->failed, (unsigned long long)t->abandoned);
        for (size_t k = 0; k < t->abandoned_examples.n; k++) {
            if (k > 0)
                fputs(", ", out);
            json_write_string(out, t->abandoned_examples.ids[k]);
        }
        fputs("]}", out);
        sep = ", ";
    }
    fputc(']', out);
    verdict_result_free(&res);
    return 0;
}

static int print_connections_json(FILE *out, const struct report *rep)
{
    const struct strmap_slot **v = sorted_slots(&rep->reasons);
    if (v == NULL)
        return -1;
    sort_slots(v, strmap_count(&rep->reasons));
    fprintf(out,
            ",\n  \"connections\": {\"count\": %llu, \"closed\": %llu, \"bytes_up\": %llu, "
            "\"bytes_down\": %llu, \"by_close_reason\": {",
            (unsigned long long)rep->connections, (unsigned long long)rep->closes,
            (unsigned long long)rep->bytes_up, (unsigned long long)rep->bytes_down);
    for (size_t i = 0; i < strmap_count(&rep->reasons); i++) {
        fputs(i > 0 ? ", " : "", out);
        json_write_string(out, v[i]->key);
        fprintf(out, ": %llu", (unsigned long long)(uintptr_t)v[i]->value);
    }
    fputs("}}", out);
    free(v);
    return 0;
}

static void print_timeline_record_json(FILE *out, const Twice__Journal__Record *r, uint64_t t0,
                                       uint32_t twice_run)
{
    fprintf(out, "      {\"offset_us\": %lld, \"time_unix_us\": %llu",
            (long long)(int64_t)(r->time_unix_us - t0), (unsigned long long)r->time_unix_us);
    json_field(out, ", ", "kind", kind_name((uint32_t)r->kind));
    fprintf(out, ", \"session\": %llu", (unsigned long long)r->session);
    json_field(out, ", ", "listener", r->listener);
    json_field(out, ", ", "queue", r->queue);
    json_field(out, ", ", "task", r->task);
    fprintf(out,
            ", \"delivery_tag\": %llu, \"redelivered\": %s, \"retries\": %u, \"retry\": %s, "
            "\"refused\": %s, \"kept_back\": %s, \"auto_ack\": %s",
            (unsigned long long)r->delivery_tag, r->redelivered ? "true" : "false",
            (unsigned)r->retries, r->retry ? "true" : "false", r->refused ? "true" : "false",
            r->kept_back ? "true" : "false", r->auto_ack ? "true" : "false");
    json_field(out, ", ", "rule", r->rule);
    json_field(out, ", ", "action", r->action_name);
    json_field(out, ", ", "event",
               r->kind == TWICE__JOURNAL__RECORD__KIND__FAULT ? event_name(r->event) : "");
    json_field(out, ", ", "run", r->run);
    json_field(out, ", ", "detail", r->detail);
    fprintf(out, ", \"twice_run\": %u}", (unsigned)twice_run);
}

/* A number, or null when it is not known. */
static void json_u64_or_null(FILE *out, bool known, uint64_t v)
{
    if (known)
        fprintf(out, "%llu", (unsigned long long)v);
    else
        fputs("null", out);
}

/* One replayed delivery as a JSON object. */
static void print_delivery_json(FILE *out, const struct verdict_delivery *d)
{
    fprintf(out,
            "{\"time_unix_us\": %llu, \"session\": %llu, \"delivery_tag\": %llu, \"attempt\": %u, "
            "\"settlement\": \"%s\", \"settled_unix_us\": ",
            (unsigned long long)d->time_us, (unsigned long long)d->session,
            (unsigned long long)d->tag, (unsigned)d->attempt,
            !d->settled  ? ""
            : d->refused ? (d->nack ? "refused nack" : "refused ack")
                         : (d->nack ? "nack" : "ack"));
    json_u64_or_null(out, d->settled, d->settled_us);
    fprintf(out,
            ", \"settled_guess\": %s, \"closed_unix_us\": ", d->settled_guess ? "true" : "false");
    json_u64_or_null(out, d->closed_us != 0, d->closed_us);
    fprintf(out, ", \"counted\": \"%s\", \"copy_delay_us\": ", delivery_counted(d));
    json_u64_or_null(out, d->overlap != VERDICT_COPY_NONE, d->copy_delay_us);
    fputs(", \"overlap\": ", out);
    if (d->overlap != VERDICT_COPY_NONE)
        json_write_string(out, verdict_overlap_name(d->overlap));
    else
        fputs("null", out);
    fputs(", \"overlap_us\": ", out);
    json_u64_or_null(out, d->overlap == VERDICT_COPY_OVERLAP, d->overlap_us);
    fprintf(out, ", \"twice_run\": %u", (unsigned)d->twice_run);
    json_field(out, ", ", "instance", d->instance != NULL ? d->instance : "");
    json_field(out, ", ", "listener", d->listener != NULL ? d->listener : "");
    fputc('}', out);
}

/* `"deliveries": [...]` of message id.  -1 when out of memory. */
static int print_deliveries_of_json(FILE *out, const struct report *rep, const char *id,
                                    const char *indent)
{
    struct verdict_delivery *d = NULL;
    size_t n = 0;
    if (verdict_message_deliveries(rep->attempts, id, &d, &n) < 0)
        return -1;
    fputs("\"deliveries\": [", out);
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "%s%s", i > 0 ? "," : "", indent);
        print_delivery_json(out, &d[i]);
    }
    fputc(']', out);
    free(d);
    return 0;
}

static int print_timeline_json(FILE *out, const struct report *rep)
{
    json_field(out, ",\n  \"message\": {", "message_id", rep->message);
    fprintf(out, ", \"more\": %llu, \"records\": [", (unsigned long long)rep->timeline_more);
    uint64_t t0 = rep->n_timeline > 0 ? rep->timeline[0]->time_unix_us : 0;
    for (size_t i = 0; i < rep->n_timeline; i++) {
        fputs(i > 0 ? ",\n" : "\n", out);
        print_timeline_record_json(out, rep->timeline[i], t0, rep->timeline_run[i]);
    }
    fputs(rep->n_timeline > 0 ? "\n  ], " : "], ", out);
    if (print_deliveries_of_json(out, rep, rep->message, "\n      ") != 0)
        return -1;
    fputc('}', out);
    return 0;
}

static int print_one_message_json(void *ctx, const char *id, const char *task)
{
    struct report_walk *w = ctx;
    fputs(w->first ? "\n    {" : ",\n    {", w->out);
    w->first = false;
    json_field(w->out, "", "message_id", id);
    json_field(w->out, ", ", "task", task != NULL ? task : "");
    fputs(", ", w->out);
    if (print_deliveries_of_json(w->out, w->rep, id, "\n      ") != 0)
        return -1;
    fputc('}', w->out);
    return 0;
}

static int print_messages_json(FILE *out, const struct report *rep)
{
    fputs(",\n  \"messages\": [", out);
    struct report_walk w = {rep, out, true};
    if (verdict_each_message(rep->attempts, print_one_message_json, &w) != 0)
        return -1;
    fputs(w.first ? "]" : "\n  ]", out);
    return 0;
}

static int print_json(FILE *out, const struct report *rep)
{
    print_header_json(out, rep);
    if (print_faults_json(out, rep) != 0 || print_expired_json(out, rep) != 0)
        return -1;
    print_deliveries_json(out, rep);
    if (rep->message == NULL && print_retries_json(out, rep) != 0)
        return -1;
    if (print_connections_json(out, rep) != 0)
        return -1;
    if (rep->message != NULL && print_timeline_json(out, rep) != 0)
        return -1;
    if (rep->all_messages && print_messages_json(out, rep) != 0)
        return -1;
    fputs("\n}\n", out);
    return rep->message != NULL && rep->n_timeline == 0 ? 1 : 0;
}

/* ---- the page and markdown (offline/page.h) -------------------------- */

static void page_facts_of(const struct report *rep, struct page_facts *f)
{
    memset(f, 0, sizeof(*f));
    f->journal = rep->path;
    f->header = rep->header;
    f->seed = rep->header->seed;
    f->start_unix_ms = rep->header->start_unix_ms;
    f->records = rep->records;
    f->runs = rep->n_runs;
    f->unclean_runs = rep->unclean_runs;
    f->truncated = rep->truncated;
    f->clean_stop = rep->clean_stop;
    f->damage = &rep->damage;
    f->changes = &rep->changes;
}

static int report_markdown(FILE *out, const struct report *rep)
{
    struct page_facts f;
    page_facts_of(rep, &f);
    return page_report_markdown(out, &f, rep->attempts, rep->faults);
}

static int write_report_page(FILE *out, void *ctx)
{
    const struct report *rep = ctx;
    struct page_facts f;
    page_facts_of(rep, &f);
    /* the text report, whole, at the end of the page */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (mem == NULL)
        return -1;
    int rc = print_text(mem, rep);
    fclose(mem);
    f.text = rc >= 0 ? text : NULL;
    rc = rc >= 0 ? page_report_html(out, &f, rep->attempts, rep->faults) : -1;
    free(text);
    return rc;
}

/* --html FILE: the page, written whole or not at all.  0, or -1 with a message in err. */
static int report_page(struct report *rep, char *err, size_t errlen)
{
    return page_write_file(rep->html, stdout, write_report_page, rep, err, errlen);
}

/* ---- command --------------------------------------------------------- */

static void usage(FILE *f)
{
    fputs("usage: twice report JOURNAL... [--json | --format text|markdown|json] [--html FILE]\n"
          "                              [--message ID] [--messages]\n"
          "  JOURNAL       the journal of a run (also --journal JOURNAL); several (the journals\n"
          "                of several twice instances, or a quoted glob: 'runs/*.pb') are read\n"
          "                together, merged by time\n"
          "  --json        one JSON object instead of tables (--format json)\n"
          "  --format markdown  the rules in force and the deliveries per task as markdown\n"
          "  --html FILE   also write the report as one self-contained page with charts\n"
          "  --message ID  one message's records, and each delivery with how it ended and what\n"
          "                the verdict counted it as (exit 1 when no record names ID)\n"
          "  --messages    every message's deliveries, settlements and overlaps\n",
          f);
}

/* --message ID: given twice, the two must be the same (one message's story is told). */
static int set_message(struct report *rep, const char *id, FILE *err)
{
    if (rep->message != NULL && strcmp(rep->message, id) != 0) {
        fputs("twice report: --message given twice with different ids (one message at a time; "
              "--messages lists them all)\n",
              err);
        return -1;
    }
    rep->message = id;
    return 1;
}

/* --html FILE and --format F (text, markdown, json) at argv[*i]: 1 taken, 0 not one of them,
 * -1 error (said). */
static int report_page_option(int argc, char **argv, int *i, struct report *rep, bool *json,
                              FILE *err)
{
    const char *a = argv[*i], *value = NULL;
    bool html = strncmp(a, "--html", 6) == 0, format = strncmp(a, "--format", 8) == 0;
    size_t n = html ? 6 : 8;
    if ((!html && !format) || (a[n] != '\0' && a[n] != '='))
        return 0;
    value = a[n] == '=' ? a + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (value == NULL || value[0] == '\0') {
        fprintf(err, "twice report: %s needs a value\n", html ? "--html" : "--format");
        return -1;
    }
    if (html && rep->html != NULL && strcmp(rep->html, value) != 0) {
        fprintf(err, "twice report: more than one --html given: '%s' and '%s'\n", rep->html, value);
        return -1;
    } else if (html) {
        rep->html = value;
    } else if (cli_format_set(&rep->format, value, "report", err) < 0) {
        return -1;
    }
    (void)json;
    return 1;
}

/* One option of report's own at argv[*i]: 1 taken, 0 not one of them, -1 error (said). */
static int report_option(int argc, char **argv, int *i, struct report *rep, bool *json, FILE *err)
{
    const char *a = argv[*i];
    int rc = report_page_option(argc, argv, i, rep, json, err);
    if (rc != 0)
        return rc;
    if (strcmp(a, "--json") == 0) {
        return cli_format_set(&rep->format, "json", "report", err);
    } else if (strncmp(a, "--message=", 10) == 0) {
        return set_message(rep, a + 10, err);
    } else if (strcmp(a, "--message") == 0) {
        if (*i + 1 >= argc) {
            fputs("twice report: --message needs a value\n", err);
            return -1;
        }
        return set_message(rep, argv[++*i], err);
    } else if (strcmp(a, "--messages") == 0) {
        rep->all_messages = true;
    } else {
        return 0;
    }
    return 1;
}

/* Returns 0 to run, 1 after --help, -1 on a usage error. */
static int parse_args(int argc, char **argv, struct report *rep, bool *json, FILE *out, FILE *err)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(out);
            return 1;
        }
        int rc = report_option(argc, argv, &i, rep, json, err);
        if (rc == 0)
            rc = journal_paths_arg(argc, argv, &i, &rep->journals, err);
        if (rc == 0)
            fprintf(err, "twice report: unknown argument '%s'\n", argv[i]);
        if (rc <= 0) {
            usage(err);
            return -1;
        }
    }
    *json = rep->format != NULL && strcmp(rep->format, "json") == 0;
    rep->markdown = rep->format != NULL && strcmp(rep->format, "markdown") == 0;
    if (rep->journals.n > 0)
        return 0;
    fputs("twice report: no journal given\n", err);
    usage(err);
    return -1;
}

int report_run(int argc, char **argv, FILE *out, FILE *err)
{
    struct report rep = {0};
    bool json = false;
    int rc = parse_args(argc, argv, &rep, &json, out, err);
    if (rc != 0) {
        report_free(&rep);
        return rc > 0 ? 0 : 2;
    }
    char msg[REPORT_ERR_MAX];
    int code = 0;
    if ((rep.html != NULL || rep.markdown) &&
        (rep.faults = calloc(1, sizeof(*rep.faults))) == NULL) {
        fputs("twice report: out of memory\n", err);
        code = 2;
    } else if (report_load(&rep, msg, sizeof(msg)) != 0) {
        fprintf(err, "twice report: %s\n", msg);
        code = 2;
    } else if (rep.html != NULL && report_page(&rep, msg, sizeof(msg)) != 0) {
        fprintf(err, "twice report: %s\n", msg);
        code = 2;
    } else if ((rc = json           ? print_json(out, &rep)
                     : rep.markdown ? report_markdown(out, &rep)
                                    : print_text(out, &rep)) < 0) {
        fputs("twice report: out of memory\n", err);
        code = 2;
    } else if (rc == 1) {
        fputs("twice report: no record of the journal names message id '", err);
        text_write_safe(err, rep.message);
        fputs("'\n", err);
        code = 1;
    } else if (fflush(out) != 0) {
        fprintf(err, "twice report: writing the output: %s\n", strerror(errno));
        code = 2;
    }
    if (code == 0 && json && rep.truncated)
        fputs("twice report: warning: the journal's last record is cut short\n", err);
    if (code == 0 && json && !rep.clean_stop)
        fputs("twice report: warning: the journal ended without a clean stop\n", err);
    if (code == 0 && json && damage_any(&rep.damage))
        fprintf(err, "twice report: warning: the journal is damaged (%llu bytes skipped)\n",
                (unsigned long long)rep.damage.sum.bytes);
    report_free(&rep);
    return code;
}

int report_main(int argc, char **argv)
{
    return report_run(argc, argv, stdout, stderr);
}
