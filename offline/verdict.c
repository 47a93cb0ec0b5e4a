/*
 * verdict.c - `twice verdict`.  See verdict.h.
 *
 * One pass over the journal and one over the effects list fill a map from
 * message id to per-message counts; verdict_compute() folds the map into one
 * row per task type.  Memory is one small struct per distinct message id, so
 * a million messages take tens of megabytes and a few seconds at most.
 */
#include "offline/verdict.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "offline/journal_reader.h"
#include "offline/json_out.h"
#include "offline/report.h"
#include "offline/strmap.h"
#include "rules/rule.h"

/* verdict_msg.task before any record named one. */
#define VERDICT_NO_TASK UINT32_MAX
/* Width cap of the TASK column; longer names push the row right. */
#define VERDICT_TASK_COL_MAX 40
/* Room for error messages. */
#define VERDICT_ERR_MAX 512

/* What a message's last DELIVER record was to the copy delays, until a fault may withhold it:
 * the first delivery of an attempt (the message's first, or one after a retry the app asked
 * for), or a copy. */
enum verdict_last { LAST_NONE, LAST_FIRST, LAST_COPY };

struct verdict_msg {
    uint32_t task;                      /* index into verdict.task_names, or VERDICT_NO_TASK */
    uint32_t delivers, faults, effects; /* saturating counts */
    uint32_t reached;  /* deliveries the handler got: DELIVERs less those a fault withheld */
    uint32_t attempts; /* of them, the first of each attempt: 1 + the app's retries seen */
    uint32_t retries;  /* the most retries a delivery of the message carried (journal.proto) */
    uint32_t pending_retries; /* retry_pending: the count the retry carries (0: none said) */
    bool in_journal;
    bool has_first;     /* first_us is the first delivery of the current attempt */
    bool retry_pending; /* the app asked for a new attempt: its next delivery starts it */
    bool failed;        /* its last settlement failed it for good (a NACK without retry) */
    bool abandoned;     /* an ACK came after such a NACK, no delivery between: failed by the
                           framework while a worker still ran it, which then completed it */
    uint8_t last;       /* enum verdict_last */
    uint64_t first_us;  /* time of that delivery */
    size_t last_copy;   /* LAST_COPY: its index in verdict.copies */
};

/* A later delivery of a message: how long after its first. */
struct verdict_copy {
    const struct verdict_msg *m;
    uint64_t delay_us;
    bool withheld; /* a fault withheld it after all */
};

struct verdict {
    struct verdict_copy *copies; /* in journal order */
    size_t n_copies, cap_copies;
    struct strmap msgs;      /* message id -> struct verdict_msg * (owned) */
    struct strmap tasks;     /* task name -> index + 1, as a pointer */
    const char **task_names; /* owned array; names borrowed from `tasks` */
    size_t n_tasks, cap_tasks;
};

static void sat_inc(uint32_t *n)
{
    if (*n < UINT32_MAX)
        (*n)++;
}

const char *verdict_kind_name(enum verdict_kind k)
{
    switch (k) {
    case VERDICT_IDEMPOTENT:
        return "IDEMPOTENT";
    case VERDICT_NOT_IDEMPOTENT:
        return "NOT IDEMPOTENT";
    case VERDICT_UNTESTED:
    default:
        return "UNTESTED";
    }
}

struct verdict *verdict_new(void)
{
    return calloc(1, sizeof(struct verdict));
}

void verdict_free(struct verdict *v)
{
    if (v == NULL)
        return;
    strmap_free(&v->msgs, free);
    strmap_free(&v->tasks, NULL);
    free(v->copies);
    free(v->task_names);
    free(v);
}

/* The index of task name, adding it when new.  -1 when out of memory. */
static int task_index(struct verdict *v, const char *name, uint32_t *idx)
{
    bool inserted = false;
    void **slot = strmap_put(&v->tasks, name, &inserted);
    if (slot == NULL)
        return -1;
    if (!inserted && *slot != NULL) {
        *idx = (uint32_t)((uintptr_t)*slot - 1);
        return 0;
    }
    if (v->n_tasks == v->cap_tasks) {
        size_t cap = v->cap_tasks != 0 ? v->cap_tasks * 2 : 16;
        const char **names = realloc(v->task_names, cap * sizeof(*names));
        if (names == NULL)
            return -1; /* the name stays in the map with a NULL value: retried */
        v->task_names = names;
        v->cap_tasks = cap;
    }
    v->task_names[v->n_tasks] = strmap_key(&v->tasks, name);
    *slot = (void *)(uintptr_t)(v->n_tasks + 1);
    *idx = (uint32_t)v->n_tasks++;
    return 0;
}

/* The counts for id, created zeroed when new.  NULL when out of memory. */
static struct verdict_msg *msg_get(struct verdict *v, const char *id)
{
    bool inserted = false;
    void **slot = strmap_put(&v->msgs, id, &inserted);
    if (slot == NULL)
        return NULL;
    if (*slot == NULL) {
        struct verdict_msg *m = calloc(1, sizeof(*m));
        if (m == NULL)
            return NULL; /* a NULL value is retried on the next call */
        m->task = VERDICT_NO_TASK;
        *slot = m;
    }
    return *slot;
}

/* A fault on event `ev` that kept the message from going on: drop (the message removed),
 * error (the channel closed instead), close before (the connection cut before it). */
static bool fault_keeps_back(const Twice__Journal__Record *r, enum rule_event ev)
{
    if (r->event != ev)
        return false;
    if (r->action == RULE_ACT_DROP || r->action == RULE_ACT_ERROR)
        return true;
    return r->action == RULE_ACT_CLOSE && r->detail != NULL &&
           strcmp(r->detail, "close before") == 0;
}

/* A fault on a delivery that the worker then never got: the journal has the DELIVER record
 * (written before the rules decide), but the handler did not run for it. */
static bool fault_withholds_delivery(const Twice__Journal__Record *r)
{
    return fault_keeps_back(r, RULE_EV_DELIVER);
}

/* A fault that keeps the app's retry from the broker: its publish kept back.  Not a nack's:
 * whatever twice does to it, the broker requeues the unacked message when the channel goes,
 * the one new delivery the app asked for. */
static bool fault_cancels_retry(const Twice__Journal__Record *r)
{
    return fault_keeps_back(r, RULE_EV_PUBLISH);
}

/* A DELIVER of m at time t, carrying `retries`: the first of an attempt (the message's first,
 * the first after the app asked for a retry, or one whose retry count is above every earlier
 * record's), or a copy twice made or caused (its delay since the attempt's first recorded). */
static int copy_note(struct verdict *v, struct verdict_msg *m, uint64_t t, uint32_t retries)
{
    /* A retry that carries its count is started by a delivery of that count: a copy of the
     * earlier attempt that comes first is still a copy. */
    bool attempt = !m->has_first || (m->retry_pending && retries >= m->pending_retries) ||
                   retries > m->retries;
    if (retries > m->retries)
        m->retries = retries;
    if (attempt) {
        m->has_first = true;
        m->retry_pending = false;
        m->first_us = t;
        m->last = LAST_FIRST;
        sat_inc(&m->attempts);
        return 0;
    }
    if (v->n_copies == v->cap_copies) {
        size_t cap = v->cap_copies != 0 ? v->cap_copies * 2 : 64;
        struct verdict_copy *c = realloc(v->copies, cap * sizeof(*c));
        if (c == NULL)
            return -1;
        v->copies = c;
        v->cap_copies = cap;
    }
    v->copies[v->n_copies] = (struct verdict_copy){m, t > m->first_us ? t - m->first_us : 0, false};
    m->last_copy = v->n_copies++;
    m->last = LAST_COPY;
    return 0;
}

/* A fault withheld m's last delivery: it is no first, and no copy.  A withheld first of a retry
 * leaves the retry to the next delivery. */
static void copy_withheld(struct verdict *v, struct verdict_msg *m)
{
    if (m->last == LAST_FIRST) {
        if (m->attempts > 0)
            m->attempts--;
        if (m->attempts == 0)
            m->has_first = false;
        else
            m->retry_pending = true;
    } else if (m->last == LAST_COPY)
        v->copies[m->last_copy].withheld = true;
    m->last = LAST_NONE;
}

int verdict_add_record(struct verdict *v, const Twice__Journal__Record *r)
{
    if (r->message_id == NULL || r->message_id[0] == '\0')
        return 0;
    struct verdict_msg *m = msg_get(v, r->message_id);
    if (m == NULL)
        return -1;
    m->in_journal = true;
    if (m->task == VERDICT_NO_TASK && r->task != NULL && r->task[0] != '\0') {
        uint32_t idx = 0;
        if (task_index(v, r->task, &idx) != 0)
            return -1;
        m->task = idx;
    }
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__ACK && m->failed)
        m->abandoned = true;
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__DELIVER ||
        r->kind == TWICE__JOURNAL__RECORD__KIND__ACK)
        m->failed = false; /* run again, or settled after all */
    else if (r->kind == TWICE__JOURNAL__RECORD__KIND__NACK && !r->retry) {
        /* Failed for good; one abandoned before it did not complete after all (RQ's horse
         * failing a reaped job: its ZREM from the started registry, then its ZADD to failed). */
        m->failed = true;
        m->abandoned = false;
    }
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__DELIVER) {
        sat_inc(&m->delivers);
        sat_inc(&m->reached);
        if (copy_note(v, m, r->time_unix_us, r->retries) != 0)
            return -1;
    } else if (r->kind == TWICE__JOURNAL__RECORD__KIND__PUBLISH ||
               r->kind == TWICE__JOURNAL__RECORD__KIND__NACK) {
        /* The app sent a message it ran before again, or its consumer asked for a requeue: the
         * next delivery is an attempt it asked for.  Before the first delivery there is nothing
         * to retry (a message published with a count, its earlier runs not seen). */
        if (r->retry && m->has_first) {
            m->retry_pending = true;
            m->pending_retries = r->retries;
        }
    } else if (r->kind == TWICE__JOURNAL__RECORD__KIND__FAULT) {
        sat_inc(&m->faults);
        /* A delivery is withheld once (its last delivery, not an earlier one): on an amqp
         * listener a `close before` or an `error` ends the actions, yet the rules after it
         * that fired are journaled too (a drop among them). */
        if (fault_withholds_delivery(r) && m->last != LAST_NONE) {
            m->reached--;
            copy_withheld(v, m);
        }
        /* The retry never reaches the broker (its publish dropped): a
         * delivery after it is twice's doing, not the app's. */
        if (fault_cancels_retry(r))
            m->retry_pending = false;
    }
    return 0;
}

int verdict_add_effect(struct verdict *v, const char *message_id)
{
    struct verdict_msg *m = msg_get(v, message_id);
    if (m == NULL)
        return -1;
    sat_inc(&m->effects);
    return 0;
}

/* Keeps the VERDICT_EXAMPLES_MAX smallest ids (strcmp order), sorted. */
static void examples_add(struct verdict_examples *ex, const char *id)
{
    size_t i = ex->n;
    if (i == VERDICT_EXAMPLES_MAX) {
        if (strcmp(id, ex->ids[i - 1]) >= 0)
            return;
        i--;
    } else {
        ex->n++;
    }
    while (i > 0 && strcmp(id, ex->ids[i - 1]) < 0) {
        ex->ids[i] = ex->ids[i - 1];
        i--;
    }
    ex->ids[i] = id;
}

/* Adds one message to its row. */
static void tally(struct verdict_task *t, const char *id, const struct verdict_msg *m)
{
    t->messages++;
    t->faulted += m->faults > 0;
    uint32_t retries = m->attempts > 1 ? m->attempts - 1 : 0;
    if (m->retries > retries)
        retries = m->retries; /* counted by the framework, earlier attempts unseen */
    if (retries > 0) {
        t->retried++;
        if (retries > t->max_retries)
            t->max_retries = retries;
    }
    /* A dropped delivery (whose copy may come later) does not test idempotency, nor does an
     * attempt the app asked for: only a copy does. */
    bool copied = m->reached > m->attempts;
    t->delivered_more_than_once += copied;
    /* Work lost: delivered (or withheld), or faulted before its delivery (a
     * dropped publish), and no effect. */
    t->no_effect += m->effects == 0 && (m->delivers >= 1 || m->faults > 0);
    if (m->failed) {
        t->failed++;
        examples_add(&t->failed_examples, id);
    }
    if (m->abandoned) {
        t->abandoned++;
        examples_add(&t->abandoned_examples, id);
    }
    if (m->effects >= 2) {
        t->more_than_one_effect++;
        examples_add(&t->examples, id);
        if (m->reached <= 1) {
            t->doubled_single_delivery++;
            examples_add(&t->single_examples, id);
        } else if (!copied) {
            t->doubled_by_retries++;
            examples_add(&t->retry_examples, id);
        }
    }
}

static void tally_unknown(struct verdict_result *res, const char *id, const struct verdict_msg *m)
{
    res->unknown_effect_ids++;
    res->unknown_effect_lines += m->effects;
    examples_add(&res->unknown_examples, id);
}

static int task_cmp(const void *a, const void *b)
{
    const struct verdict_task *x = a, *y = b;
    if (x->unknown != y->unknown)
        return x->unknown ? 1 : -1;
    return strcmp(x->task, y->task);
}

/* Sets each row's verdict, drops empty rows, sorts, sets the overall verdict. */
static void finish_rows(struct verdict_result *res, size_t rows)
{
    size_t n = 0;
    res->overall = VERDICT_UNTESTED;
    for (size_t i = 0; i < rows; i++) {
        struct verdict_task *t = &res->tasks[i];
        if (t->messages == 0)
            continue;
        /* Only a message that reached the handler twice tests it: faults
         * that only dropped or delayed work prove nothing either way. */
        if (t->more_than_one_effect > 0)
            t->verdict = VERDICT_NOT_IDEMPOTENT;
        else if (t->delivered_more_than_once > 0)
            t->verdict = VERDICT_IDEMPOTENT;
        else
            t->verdict = VERDICT_UNTESTED;
        if (t->verdict > res->overall)
            res->overall = t->verdict;
        res->tasks[n++] = *t;
    }
    res->n_tasks = n;
    qsort(res->tasks, n, sizeof(*res->tasks), task_cmp);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Each row's copy delays: count, min, median, max.  -1 when out of memory. */
static int copy_windows(const struct verdict *v, struct verdict_result *out)
{
    size_t rows = v->n_tasks + 1;
    size_t *count = calloc(rows + 1, sizeof(*count));
    uint64_t *delays = malloc((v->n_copies > 0 ? v->n_copies : 1) * sizeof(*delays));
    if (count == NULL || delays == NULL) {
        free(count);
        free(delays);
        return -1;
    }
    /* Counting sort by row, then a sort within each row. */
    for (size_t i = 0; i < v->n_copies; i++) {
        const struct verdict_copy *c = &v->copies[i];
        if (!c->withheld)
            count[(c->m->task == VERDICT_NO_TASK ? v->n_tasks : c->m->task) + 1]++;
    }
    for (size_t r = 1; r <= rows; r++)
        count[r] += count[r - 1];
    size_t *at = calloc(rows, sizeof(*at));
    if (at == NULL) {
        free(count);
        free(delays);
        return -1;
    }
    for (size_t i = 0; i < v->n_copies; i++) {
        const struct verdict_copy *c = &v->copies[i];
        size_t r = c->m->task == VERDICT_NO_TASK ? v->n_tasks : c->m->task;
        if (!c->withheld)
            delays[count[r] + at[r]++] = c->delay_us;
    }
    for (size_t r = 0; r < rows; r++) {
        size_t n = count[r + 1] - count[r];
        struct verdict_task *t = &out->tasks[r];
        t->copies = n;
        if (n == 0)
            continue;
        uint64_t *d = delays + count[r];
        qsort(d, n, sizeof(*d), u64_cmp);
        t->copy_min_us = d[0];
        t->copy_median_us = n % 2 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2;
        t->copy_max_us = d[n - 1];
    }
    free(at);
    free(count);
    free(delays);
    return 0;
}

int verdict_compute(const struct verdict *v, struct verdict_result *out)
{
    memset(out, 0, sizeof(*out));
    size_t rows = v->n_tasks + 1; /* the last row collects messages with no task */
    out->tasks = calloc(rows, sizeof(*out->tasks));
    if (out->tasks == NULL)
        return -1;
    for (size_t i = 0; i < v->n_tasks; i++)
        out->tasks[i].task = v->task_names[i];
    out->tasks[v->n_tasks].task = VERDICT_UNKNOWN_TASK;
    out->tasks[v->n_tasks].unknown = true;
    size_t pos = 0;
    const struct strmap_slot *slot = NULL;
    while (strmap_next(&v->msgs, &pos, &slot)) {
        const struct verdict_msg *m = slot->value;
        if (m == NULL)
            continue;
        out->effect_lines += m->effects;
        if (!m->in_journal)
            tally_unknown(out, slot->key, m);
        else
            tally(&out->tasks[m->task == VERDICT_NO_TASK ? v->n_tasks : m->task], slot->key, m);
    }
    if (copy_windows(v, out) != 0) {
        verdict_result_free(out);
        return -1;
    }
    finish_rows(out, rows);
    return 0;
}

void verdict_result_free(struct verdict_result *res)
{
    free(res->tasks);
    memset(res, 0, sizeof(*res));
}

/* Strips blanks and a trailing \r; returns the id, or NULL for a line to skip. */
static char *effect_line_id(char *line)
{
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                       line[len - 1] == '\t'))
        line[--len] = '\0';
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line == '\0' || *line == '#')
        return NULL;
    return line;
}

int verdict_load_effects(struct verdict *v, const char *path, uint64_t *lines, char *err,
                         size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    *lines = 0;
    while (rc == 0 && getline(&line, &cap, fp) >= 0) {
        const char *id = effect_line_id(line);
        if (id == NULL)
            continue;
        rc = verdict_add_effect(v, id);
        (*lines)++;
    }
    if (rc == 0 && ferror(fp)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = -1;
    } else if (rc != 0) {
        snprintf(err, errlen, "%s: out of memory", path);
    }
    free(line);
    fclose(fp);
    return rc;
}

/* What the output says about the inputs. */
struct verdict_inputs {
    const char *journal, *effects;
    uint64_t seed, start_unix_ms, records, effect_lines;
    bool truncated;
};

/* Feeds every record of the journal to v.  0, or -1 with a message in err. */
static int load_journal(struct verdict *v, struct verdict_inputs *in, char *err, size_t errlen)
{
    struct journal_reader *r = journal_reader_open(in->journal, err, errlen);
    if (r == NULL)
        return -1;
    in->seed = journal_reader_header(r)->seed;
    in->start_unix_ms = journal_reader_header(r)->start_unix_ms;
    const Twice__Journal__Entry *e = NULL;
    int rc;
    while ((rc = journal_reader_next(r, &e)) == 1) {
        if (e->body_case != TWICE__JOURNAL__ENTRY__BODY_RECORD)
            continue;
        if (verdict_add_record(v, e->record) != 0) {
            rc = JOURNAL_ERR_NOMEM;
            break;
        }
    }
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", in->journal,
                 journal_reader_error(r) != NULL ? journal_reader_error(r) : journal_strerror(rc));
    in->records = journal_reader_count(r);
    in->truncated = journal_reader_truncated(r);
    journal_reader_close(r);
    return rc < 0 ? -1 : 0;
}

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
            "\"doubled_by_retries\": %llu, "
            "\"doubled_by_retries_examples\": ",
            (unsigned long long)t->failed, (unsigned long long)t->retried,
            (unsigned long long)t->max_retries, (unsigned long long)t->doubled_by_retries);
    print_examples_json(out, &t->retry_examples);
    fputs(", \"failed_examples\": ", out);
    print_examples_json(out, &t->failed_examples);
    fprintf(out,
            ", \"abandoned\": %llu, \"abandoned_examples\": ", (unsigned long long)t->abandoned);
    print_examples_json(out, &t->abandoned_examples);
    fputc('}', out);
}

static void print_json(FILE *out, const struct verdict_result *res, const struct verdict_inputs *in)
{
    fputs("{\n  \"journal\": ", out);
    json_write_string(out, in->journal);
    fputs(",\n  \"effects\": ", out);
    json_write_string(out, in->effects);
    fprintf(out,
            ",\n  \"seed\": \"%llu\",\n  \"start_unix_ms\": %llu,\n  \"records\": %llu,\n"
            "  \"journal_truncated\": %s,\n  \"effect_lines\": %llu,\n  \"verdict\": ",
            (unsigned long long)in->seed, (unsigned long long)in->start_unix_ms,
            (unsigned long long)in->records, in->truncated ? "true" : "false",
            (unsigned long long)in->effect_lines);
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
    fputs("}\n}\n", out);
}

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

/* A copy delay for people: "0.4s", "12s", "25min", "3.0h". */
static void format_delay(char *buf, size_t cap, uint64_t us)
{
    double s = (double)us / 1e6;
    if (s < 10)
        snprintf(buf, cap, "%.1fs", s);
    else if (s < 600)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3 * 3600)
        snprintf(buf, cap, "%.0fmin", s / 60);
    else
        snprintf(buf, cap, "%.1fh", s / 3600);
}

/* The COPIES AFTER column: "MIN-MAX", or "-" with no copy. */
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

static void print_row(FILE *out, const struct verdict_task *t, int width)
{
    int n = text_write_safe(out, t->task);
    char window[40];
    format_window(window, sizeof(window), t);
    fprintf(out, "%*s  %8llu  %7llu  %11llu  %9llu  %9llu  %7llu  %-13s  ",
            n < width ? width - n : 0, "", (unsigned long long)t->messages,
            (unsigned long long)t->faulted, (unsigned long long)t->delivered_more_than_once,
            (unsigned long long)t->more_than_one_effect, (unsigned long long)t->no_effect,
            (unsigned long long)t->retried, window);
    if (t->examples.n > 0) {
        fprintf(out, "%-14s  ", verdict_kind_name(t->verdict));
        print_examples_text(out, &t->examples);
    } else {
        fputs(verdict_kind_name(t->verdict), out);
    }
    fputc('\n', out);
}

static void print_table(FILE *out, const struct verdict_result *res)
{
    int width = task_col_width(res);
    fprintf(out, "%-*s  %8s  %7s  %11s  %9s  %9s  %7s  %-13s  %-14s  %s\n", width, "TASK",
            "MESSAGES", "FAULTED", "DELIVERED>1", "EFFECTS>1", "NO EFFECT", "RETRIED",
            "COPIES AFTER", "VERDICT", "EXAMPLES");
    for (size_t i = 0; i < res->n_tasks; i++)
        print_row(out, &res->tasks[i], width);
    if (res->n_tasks == 0)
        fputs("(no message ids in the journal)\n", out);
}

static void print_legend(FILE *out)
{
    fputs("\nMESSAGES        distinct message ids of the task seen in the journal\n"
          "FAULTED         messages twice injected at least one fault into\n"
          "DELIVERED>1     messages that reached the handler more than once: a copy (a delivery "
          "twice dropped, or a retry the app asked for, does not count)\n"
          "EFFECTS>1       messages with more than one line in the effects list\n"
          "NO EFFECT       delivered or faulted, but no line in the effects list: work lost "
          "(a drop), or missing from the list\n"
          "RETRIED         messages the app retried itself (a Celery retry, a Sidekiq or RQ "
          "retry, a nack with requeue): new attempts, not copies\n"
          "COPIES AFTER    the copy delays tested: how long after a message's first delivery "
          "its later ones reached the handler (shortest-longest)\n"
          "NOT IDEMPOTENT  some message produced more than one side effect (EXAMPLES: up to 5)\n"
          "IDEMPOTENT      some message reached the handler twice and none produced two side "
          "effects, for the copy delays tested (a dedup key that expires sooner would have "
          "been caught, a later one not)\n"
          "UNTESTED        no message reached the handler twice (faults that only drop or "
          "delay prove nothing): run longer or widen the rules\n",
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

static void print_warnings(FILE *out, const struct verdict_result *res,
                           const struct verdict_inputs *in)
{
    if (in->truncated)
        fputs("warning: the journal's last record is cut short (the proxy died while "
              "writing); the records before it are counted\n",
              out);
    if (res->unknown_effect_ids > 0) {
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
                (unsigned long long)t->retried, t->retried == 1 ? "message" : "messages",
                (unsigned long long)t->max_retries, t->max_retries == 1 ? "retry" : "retries");
    }
}

/* Copies within this of the first delivery test a short window only: say so. */
#define VERDICT_SHORT_WINDOW_US (60ull * 1000 * 1000)

/* What each IDEMPOTENT row held over, and how to test a later copy when the copies all came
 * soon after the first. */
static void print_windows(FILE *out, const struct verdict_result *res)
{
    bool short_seen = false;
    for (size_t i = 0; i < res->n_tasks; i++) {
        const struct verdict_task *t = &res->tasks[i];
        if (t->verdict != VERDICT_IDEMPOTENT)
            continue;
        char lo[16], med[16], hi[16];
        format_delay(lo, sizeof(lo), t->copy_min_us);
        format_delay(med, sizeof(med), t->copy_median_us);
        format_delay(hi, sizeof(hi), t->copy_max_us);
        if (!short_seen)
            fputc('\n', out);
        short_seen = true;
        text_write_safe(out, t->task);
        fprintf(out,
                ": IDEMPOTENT for copies %s-%s after the first delivery (median %s, %llu %s)\n", lo,
                hi, med, (unsigned long long)t->copies, t->copies == 1 ? "copy" : "copies");
        if (t->copy_max_us < VERDICT_SHORT_WINDOW_US)
            fprintf(out,
                    "  every copy came within %s: deduplication that forgets a message sooner is "
                    "caught, later is not tested; for later copies: `when ack ... do redeliver "
                    "after D` (amqp, rq, list) or `when deliver ... do duplicate after D` (amqp, "
                    "sidekiq, celery, rq, list)\n",
                    hi);
    }
}

static void print_human(FILE *out, const struct verdict_result *res,
                        const struct verdict_inputs *in)
{
    fputs("journal ", out);
    text_write_safe(out, in->journal);
    fprintf(out, ": %llu records, seed %llu\neffects ", (unsigned long long)in->records,
            (unsigned long long)in->seed);
    text_write_safe(out, in->effects);
    fprintf(out, ": %llu side effects\n\n", (unsigned long long)in->effect_lines);
    print_table(out, res);
    print_windows(out, res);
    print_retries(out, res);
    print_legend(out);
    print_warnings(out, res, in);
    fprintf(out, "\nverdict: %s\n", verdict_kind_name(res->overall));
}

struct verdict_args {
    const char *journal, *effects;
    bool json;
};

static void usage(FILE *err)
{
    fputs("usage: twice verdict --journal JOURNAL --effects EFFECTS [--json]\n"
          "  EFFECTS: one message id per side effect, one per line ('#' comments)\n"
          "  exit 1 when a task is NOT IDEMPOTENT, 0 otherwise, 2 on errors\n",
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

/* Returns 0 to run, 1 after --help, -1 on a usage error. */
static int parse_args(int argc, char **argv, struct verdict_args *a, FILE *out, FILE *err)
{
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(out);
            return 1;
        }
        int rc = option_value(argc, argv, &i, "--journal", &a->journal);
        if (rc == 0)
            rc = option_value(argc, argv, &i, "--effects", &a->effects);
        if (rc == 0 && strcmp(argv[i], "--json") == 0) {
            a->json = true;
            rc = 1;
        }
        if (rc <= 0) {
            fprintf(err,
                    rc == 0 ? "twice verdict: unknown argument '%s'\n"
                            : "twice verdict: %s needs a value\n",
                    argv[i]);
            usage(err);
            return -1;
        }
    }
    if (a->journal == NULL || a->effects == NULL) {
        fputs("twice verdict: --journal and --effects are required\n", err);
        usage(err);
        return -1;
    }
    return 0;
}

/* Loads both inputs and prints the verdict.  Returns the exit code. */
static int verdict_execute(const struct verdict_args *a, FILE *out, FILE *err)
{
    char msg[VERDICT_ERR_MAX];
    struct verdict_inputs in = {.journal = a->journal, .effects = a->effects};
    struct verdict_result res = {0};
    struct verdict *v = verdict_new();
    int code = 2;
    if (v == NULL)
        snprintf(msg, sizeof(msg), "out of memory");
    else if (load_journal(v, &in, msg, sizeof(msg)) == 0 &&
             verdict_load_effects(v, a->effects, &in.effect_lines, msg, sizeof(msg)) == 0) {
        if (verdict_compute(v, &res) != 0)
            snprintf(msg, sizeof(msg), "out of memory");
        else
            code = res.overall == VERDICT_NOT_IDEMPOTENT ? 1 : 0;
    }
    if (code == 2)
        fprintf(err, "twice verdict: %s\n", msg);
    else if (a->json)
        print_json(out, &res, &in);
    else
        print_human(out, &res, &in);
    if (code != 2 && in.truncated && a->json)
        fputs("twice verdict: warning: the journal's last record is cut short\n", err);
    verdict_result_free(&res);
    verdict_free(v);
    return code;
}

int verdict_run(int argc, char **argv, FILE *out, FILE *err)
{
    struct verdict_args a;
    int rc = parse_args(argc, argv, &a, out, err);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    int code = verdict_execute(&a, out, err);
    if (fflush(out) != 0 && code != 2) {
        fprintf(err, "twice verdict: writing the output: %s\n", strerror(errno));
        code = 2;
    }
    return code;
}

int verdict_main(int argc, char **argv)
{
    return verdict_run(argc, argv, stdout, stderr);
}
