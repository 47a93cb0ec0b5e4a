/*
 * page_html.c - the `--html` pages of `twice report` and `twice verdict`.  See page.h.
 *
 * One <section> per question a reader brings: is there a warning about the journal, which
 * rules faulted what and when, how each task's deliveries were counted (and, for the verdict,
 * its effects), how late the copies came, and what happened to a few example messages.  The
 * charts are offline/svg.c's; every journal-derived string goes through html_text().
 */
#include "offline/page.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offline/html.h"
#include "offline/idshort.h"
#include "offline/svg.h"

/* Deliveries drawn on an example's timeline at most. */
#define PAGE_TIMELINE_MAX 40
/* Bins of the faults-over-time chart at most. */
#define PAGE_TIME_BINS 60

static const char *const page_counted_names[PAGE_COUNTED] = {
    "first delivery", "copy", "set aside", "withheld by a fault", "never seen to finish"};

static const char *const page_delay_labels[PAGE_DELAY_BINS + 1] = {
    "0",   "1ms", "3ms",  "10ms", "30ms",  "100ms", "300ms", "1s",    "3s",
    "10s", "30s", "1min", "3min", "10min", "30min", "1h",    "longer"};

static void format_utc(char *buf, size_t len, uint64_t unix_us)
{
    time_t secs = (time_t)(unix_us / 1000000u);
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL) {
        snprintf(buf, len, "%llu", (unsigned long long)unix_us);
        return;
    }
    strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

/* "+12.345s" since t0. */
static void format_offset(char *buf, size_t len, uint64_t us, uint64_t t0)
{
    snprintf(buf, len, "%+.3fs", ((double)us - (double)t0) / 1e6);
}

/* <p class="CLS">TEXT</p> with TEXT fixed (not journal-derived). */
static void para(FILE *out, const char *cls, const char *text)
{
    fprintf(out, "<p class=\"%s\">%s</p>\n", cls, text);
}

/* The warnings about the journal itself, at the top where they cannot be missed. */
static void journal_alerts(FILE *out, const struct page_facts *f, bool verdict)
{
    bool damaged = damage_any(f->damage);
    if (!f->truncated && f->clean_stop && f->unclean_runs == 0 && !damaged)
        return;
    fprintf(out, "<section class=\"%s\" id=\"journal-warnings\">\n",
            damaged && verdict && !f->allow_damaged ? "alert" : "warn");
    if (f->truncated)
        para(out, "w",
             "<b>warning:</b> the journal's last record is cut short (the proxy died "
             "while writing it); the records before it are counted.");
    if (!f->clean_stop)
        para(out, "w",
             "<b>warning:</b> the journal ended without a clean stop (twice was "
             "killed or crashed): the records it had not yet written are missing.");
    if (f->unclean_runs > 0)
        fprintf(out,
                "<p class=\"w\"><b>warning:</b> %llu of the journal's %llu runs ended without a "
                "clean stop before the next run started.</p>\n",
                (unsigned long long)f->unclean_runs, (unsigned long long)f->runs);
    if (damaged)
        fprintf(out,
                "<p class=\"w\"><b>%s:</b> the journal is damaged: %llu bytes were skipped; "
                "the %s stands on the records read%s.</p>\n",
                verdict && !f->allow_damaged ? "error" : "warning",
                (unsigned long long)f->damage->sum.bytes, verdict ? "verdict" : "report",
                verdict && !f->allow_damaged ? " (exit 6; --allow-damaged accepts it)" : "");
    fputs("</section>\n", out);
}

/* The journal's facts under the title. */
static void facts_block(FILE *out, const struct page_facts *f)
{
    char when[48];
    format_utc(when, sizeof(when), f->start_unix_ms * 1000u);
    fputs("<p class=\"meta\">journal <code>", out);
    html_text(out, f->journal);
    fprintf(out, "</code> &middot; <b>%llu</b> records", (unsigned long long)f->records);
    if (f->runs > 1)
        fprintf(out, " in <b>%llu</b> runs", (unsigned long long)f->runs);
    fprintf(out, " &middot; seed <b>%llu</b> &middot; started %s", (unsigned long long)f->seed,
            when);
    if (f->effects != NULL) {
        fputs("<br>effects <code>", out);
        html_text(out, f->effects);
        fprintf(out, "</code> &middot; <b>%llu</b> side effects",
                (unsigned long long)f->effect_lines);
    }
    const Twice__Journal__Header *h = f->header;
    for (size_t i = 0; h != NULL && i < h->n_listeners; i++) {
        fputs(i == 0 ? "<br>listeners " : ", ", out);
        fputs("<code>", out);
        html_text(out, h->listeners[i]->name);
        fputs("</code> (", out);
        html_text(out, h->listeners[i]->protocol);
        if (h->listeners[i]->profile[0] != '\0') {
            fputs(", ", out);
            html_text(out, h->listeners[i]->profile);
        }
        fputc(')', out);
    }
    fputs("</p>\n", out);
}

/* The rules in force: a row per rule that faulted, the faults by event. */
static void rules_table(FILE *out, const struct fault_log_rule **rules, size_t n,
                        const struct changes *changes)
{
    if (n == 0) {
        para(out, "missing", "No fault was injected: nothing in this journal tests a handler.");
    } else {
        fputs("<table class=\"rules\"><tr><th>rule</th><th>action</th><th class=\"n\">faults"
              "</th><th>on</th></tr>\n",
              out);
        for (size_t i = 0; i < n; i++) {
            fputs("<tr><td><code>", out);
            html_text(out, rules[i]->name);
            fputs("</code></td><td>", out);
            html_text(out, rules[i]->action);
            fprintf(out, "</td><td class=\"n\">%llu</td><td>", (unsigned long long)rules[i]->count);
            fault_log_write_events(out, rules[i]);
            fputs("</td></tr>\n", out);
        }
        fputs("</table>\n", out);
    }
    if (changes != NULL && changes->count > 0)
        fprintf(out,
                "<p class=\"missing\">The rules changed %llu times during the run (switched, "
                "reloaded, or faults turned off): read the counts against the changes "
                "listed in the text below.</p>\n",
                (unsigned long long)changes->count);
}

/* Faults per rule over time: one row per rule, the run cut in up to PAGE_TIME_BINS bins. */
static int faults_chart(FILE *out, const struct fault_log *fl, const struct fault_log_rule **rules,
                        size_t n)
{
    if (n == 0)
        return 0;
    double span = (double)(fl->last_us > fl->start_us ? fl->last_us - fl->start_us : 1) / 1e6;
    double bin_s = svg_nice_seconds(span, PAGE_TIME_BINS);
    double tick = svg_nice_seconds(span, 8);
    size_t bins = (size_t)(span / bin_s) + 1;
    uint64_t *counts = calloc(n * bins, sizeof(*counts));
    struct svg_row *rows = calloc(n, sizeof(*rows));
    char(*edges)[SVG_LABEL_MAX] = calloc(bins + 1, sizeof(*edges));
    char **labels = calloc(n, sizeof(*labels));
    int rc = counts != NULL && rows != NULL && edges != NULL && labels != NULL ? 0 : -1;
    for (size_t r = 0; rc == 0 && r < n; r++) {
        for (uint64_t k = 0; k < rules[r]->count; k++) {
            uint64_t t = rules[r]->times[k];
            double s = t > fl->start_us ? (double)(t - fl->start_us) / 1e6 : 0;
            size_t b = (size_t)(s / bin_s);
            counts[r * bins + (b < bins ? b : bins - 1)]++;
        }
        if (asprintf(&labels[r], "%s (%s)", rules[r]->name, rules[r]->action) < 0) {
            labels[r] = NULL;
            rc = -1;
        }
        rows[r] = (struct svg_row){labels[r], counts + r * bins};
    }
    for (size_t i = 0; rc == 0 && i <= bins; i++)
        svg_format_seconds(edges[i], SVG_LABEL_MAX, bin_s * (double)i);
    if (rc == 0) {
        size_t every = tick > bin_s ? (size_t)(tick / bin_s + 0.5) : 1;
        struct svg_axis x = {bins, (const char(*)[SVG_LABEL_MAX])edges, every,
                             "seconds since the run's start", "faults"};
        svg_small_multiples(out, "fault-bin", rows, n, &x);
    }
    for (size_t r = 0; labels != NULL && r < n; r++)
        free(labels[r]);
    free(labels);
    free(edges);
    free(rows);
    free(counts);
    return rc;
}

static void legend(FILE *out, const char *const *names, const char *const *cls, size_t n)
{
    fputs("<p class=\"legend\">", out);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "<span><i class=\"%s\"></i>%s</span>", cls[i], names[i]);
    fputs("</p>\n", out);
}

/* Deliveries per task, stacked by how the verdict counted them. */
static int deliveries_chart(FILE *out, const struct page_task **t, size_t n)
{
    if (n == 0) {
        para(out, "missing", "No message id in the journal.");
        return 0;
    }
    struct svg_stack *bars = calloc(n, sizeof(*bars));
    if (bars == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        bars[i].label = t[i]->name;
        for (size_t k = 0; k < PAGE_COUNTED; k++)
            bars[i].parts[k] = t[i]->counted[k];
    }
    svg_stacked_bars(out, bars, n, page_counted_names, PAGE_COUNTED);
    free(bars);
    return 0;
}

/* Effects per task (verdict): messages with no, one, two or more effect lines. */
static int effects_chart(FILE *out, const struct page_task **t, size_t n)
{
    static const char *const names[] = {"messages with no effect", "one effect",
                                        "two or more effects"};
    struct svg_stack *bars = calloc(n != 0 ? n : 1, sizeof(*bars));
    if (bars == NULL)
        return -1;
    /* colours: no effect grey, one blue, doubled orange-red: parts 4, 0, 1 of the palette
     * would mislead; the part index is the class, so order them as the classes read */
    for (size_t i = 0; i < n; i++) {
        bars[i].label = t[i]->name;
        bars[i].parts[0] = t[i]->by_effects[1];
        bars[i].parts[1] = t[i]->by_effects[2];
        bars[i].parts[2] = t[i]->by_effects[0];
    }
    const char *const ordered[] = {names[1], names[2], names[0]};
    if (n > 0)
        svg_stacked_bars(out, bars, n, ordered, 3);
    free(bars);
    return 0;
}

/* The copy delays per task with copies, on a log scale. */
static void delays_chart(FILE *out, const struct page_task **t, size_t n)
{
    struct svg_row rows[64];
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof(rows) / sizeof(rows[0]); i++)
        if (t[i]->copies > 0)
            rows[k++] = (struct svg_row){t[i]->name, t[i]->delays};
    if (k == 0) {
        para(out, "missing",
             "<span class=\"badge v-untested\">no copy</span> No copy reached a handler: no "
             "delay was tested, and no task can be called idempotent on this run.");
        return;
    }
    char edges[PAGE_DELAY_BINS + 1][SVG_LABEL_MAX];
    for (size_t i = 0; i <= PAGE_DELAY_BINS; i++)
        snprintf(edges[i], SVG_LABEL_MAX, "%s", page_delay_labels[i]);
    struct svg_axis x = {PAGE_DELAY_BINS, (const char(*)[SVG_LABEL_MAX])edges, 1,
                         "time from the message's first delivery to its copy (log scale)",
                         "copies"};
    svg_small_multiples(out, "delay-bin", rows, k, &x);
    for (size_t i = 0; i < n; i++)
        if (t[i]->copies == 0) {
            fputs("<p class=\"missing\"><span class=\"badge v-untested\">no copy</span> ", out);
            html_text(out, t[i]->name);
            fputs(": no copy reached the handler.</p>\n", out);
        }
}

/* ---- example timelines --------------------------------------------------------------------- */

struct page_example {
    const char *id, *task, *why;
};

static const char *span_class(const struct verdict_delivery *d)
{
    static const char *const cls[PAGE_COUNTED] = {"d-first", "d-copy", "d-set-aside", "d-withheld",
                                                  "d-unreached"};
    enum page_counted c = page_counted_of(d);
    return c == PAGE_COPY && d->overlap == VERDICT_COPY_OVERLAP ? "d-overlap" : cls[c];
}

/* The span of delivery i: to its settlement, its connection's close, or the journal's end. */
static void delivery_span(struct svg_span *s, const struct verdict_delivery *d, size_t i,
                          uint64_t t0, uint64_t end, char *lane, size_t lane_len, char *tip,
                          size_t tip_len, char *end_tip, size_t end_len)
{
    char at[32], to[32];
    format_offset(at, sizeof(at), d->time_us, t0);
    s->from_us = d->time_us;
    s->cls = span_class(d);
    if (d->settled) {
        s->to_us = d->settled_us;
        s->end_class = d->nack ? "m-nack" : "m-ack";
        format_offset(to, sizeof(to), d->settled_us, t0);
        snprintf(end_tip, end_len, "%s%s at %s%s", d->refused ? "refused " : "",
                 d->nack ? "nack" : "ack", to, d->settled_guess ? " (guess)" : "");
    } else if (d->closed_us != 0) {
        s->to_us = d->closed_us;
        s->end_class = "m-closed";
        format_offset(to, sizeof(to), d->closed_us, t0);
        snprintf(end_tip, end_len, "never settled: its connection closed at %s", to);
    } else {
        s->to_us = d->auto_ack ? d->time_us : end;
        s->end_class = d->auto_ack ? NULL : "m-open";
        snprintf(end_tip, end_len, "never settled, still out at the end of the journal");
    }
    snprintf(lane, lane_len, "#%zu session %llu", i + 1, (unsigned long long)d->session);
    int n = snprintf(tip, tip_len, "delivery #%zu at %s, tag %llu: %s", i + 1, at,
                     (unsigned long long)d->tag, page_counted_names[page_counted_of(d)]);
    if (d->overlap != VERDICT_COPY_NONE && n > 0 && (size_t)n < tip_len)
        snprintf(tip + n, tip_len - (size_t)n, " %.3fs after the first, overlap %s",
                 (double)d->copy_delay_us / 1e6, verdict_overlap_name(d->overlap));
    s->lane = lane;
    s->tip = tip;
    s->end_tip = end_tip;
}

/* Room for the strings of one span. */
struct span_text {
    char lane[48], tip[160], end_tip[96];
};

/* The faults of a message as marks; their tooltips into tips.  Widens [*lo, *hi]. */
static size_t fault_marks(const struct fault_log_msg *m, struct svg_mark *marks, char (*tips)[160],
                          uint64_t t0, uint64_t *lo, uint64_t *hi)
{
    size_t n = m != NULL ? m->n : 0;
    for (size_t i = 0; i < n; i++) {
        const struct fault_log_fault *ft = &m->list[i];
        char at[32];
        format_offset(at, sizeof(at), ft->time_us, t0);
        snprintf(tips[i], 160, "fault of rule %s (%s) on %s at %s", ft->rule->name,
                 ft->rule->action, fault_log_event_name(ft->event), at);
        marks[i] = (struct svg_mark){ft->time_us, "m-fault", tips[i]};
        *lo = ft->time_us < *lo ? ft->time_us : *lo;
        *hi = ft->time_us > *hi ? ft->time_us : *hi;
    }
    return n;
}

/* The table under a timeline: each delivery, how it ended, what it counted as. */
static void timeline_table(FILE *out, const struct svg_span *s, const struct verdict_delivery *d,
                           size_t n, uint64_t t0)
{
    fputs("<table class=\"deliveries\"><tr><th>#</th><th class=\"n\">at</th><th>session</th>"
          "<th>ended</th><th>counted</th></tr>\n",
          out);
    for (size_t i = 0; i < n; i++) {
        char at[32];
        format_offset(at, sizeof(at), d[i].time_us, t0);
        fprintf(out, "<tr><td>%zu</td><td class=\"n\">%s</td><td>%llu</td><td>", i + 1, at,
                (unsigned long long)d[i].session);
        html_text(out, d[i].auto_ack ? "auto-ack (no ack asked)" : s[i].end_tip);
        fprintf(out, "</td><td>%s", page_counted_names[page_counted_of(&d[i])]);
        if (d[i].overlap == VERDICT_COPY_OVERLAP)
            fprintf(out, ", ran beside an earlier delivery for %.3fs",
                    (double)d[i].overlap_us / 1e6);
        else if (d[i].overlap == VERDICT_COPY_UNKNOWN)
            fputs(", overlap unknown", out);
        fputs("</td></tr>\n", out);
    }
    fputs("</table>\n", out);
}

/* One example message: its deliveries and faults on one axis, then the table. */
static int timeline_one(FILE *out, const struct page_example *ex, const struct verdict *v,
                        const struct fault_log *fl, bool effects)
{
    struct verdict_delivery *d = NULL;
    size_t n = 0;
    if (verdict_message_deliveries(v, ex->id, &d, &n) < 0)
        return -1;
    /* the first deliveries only: a message delivered thousands of times is said, not drawn */
    size_t all = n;
    n = n < PAGE_TIMELINE_MAX ? n : PAGE_TIMELINE_MAX;
    const struct fault_log_msg *m = fault_log_message(fl, ex->id);
    size_t nm = m != NULL ? m->n : 0;
    struct svg_span *spans = calloc(n + 1, sizeof(*spans));
    struct span_text *text = calloc(n + 1, sizeof(*text));
    struct svg_mark *marks = calloc(nm + 1, sizeof(*marks));
    char(*tips)[160] = calloc(nm + 1, sizeof(*tips));
    int rc = spans != NULL && text != NULL && marks != NULL && tips != NULL ? 0 : -1;
    uint64_t t0 = fl->start_us, lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        delivery_span(&spans[i], &d[i], i, t0, fl->last_us, text[i].lane, sizeof(text[i].lane),
                      text[i].tip, sizeof(text[i].tip), text[i].end_tip, sizeof(text[i].end_tip));
        lo = spans[i].from_us < lo ? spans[i].from_us : lo;
        hi = spans[i].to_us > hi ? spans[i].to_us : hi;
    }
    if (rc == 0) {
        nm = fault_marks(m, marks, tips, t0, &lo, &hi);
        fputs("<div class=\"card example\"><h3>", out);
        html_text(out, ex->task);
        fputs(" &middot; <code class=\"id\">", out);
        html_text(out, ex->id);
        fprintf(out, "</code> &middot; %s</h3>\n<p class=\"meta\">%zu deliveries%s, %zu faults%s",
                ex->why, all, all > n ? " (the first drawn)" : "", nm,
                m != NULL && m->more > 0 ? " (the first drawn)" : "");
        if (effects)
            fprintf(out, ", <b>%u</b> lines in the effects list",
                    (unsigned)verdict_message_effects(v, ex->id));
        fputs("</p>\n", out);
        if (lo == UINT64_MAX)
            lo = hi = t0;
        svg_timeline(out, spans, n, marks, nm, "faults", t0, lo, hi);
        timeline_table(out, spans, d, n, t0);
        fputs("</div>\n", out);
    }
    free(tips);
    free(marks);
    free(text);
    free(spans);
    free(d);
    return rc;
}

static size_t example_add(struct page_example *ex, size_t n, const char *id, const char *task,
                          const char *why)
{
    if (id == NULL || n == PAGE_EXAMPLES_MAX)
        return n;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ex[i].id, id) == 0)
            return n;
    ex[n] = (struct page_example){id, task, why};
    return n + 1;
}

/* Up to PAGE_EXAMPLES_PER_TASK examples of t: doubled first (verdict), a copy, a delivery set
 * aside or withheld, a faulted message. */
static size_t task_examples(struct page_example *ex, size_t n, const struct page_task *t,
                            const struct verdict_task *row)
{
    size_t start = n;
    if (row != NULL && row->examples.n > 0)
        n = example_add(ex, n, row->examples.ids[0], t->name, "two or more effects");
    if (n - start < PAGE_EXAMPLES_PER_TASK)
        n = example_add(ex, n, t->copy_id, t->name,
                        t->copy_overlapped ? "a copy that ran beside the first delivery"
                                           : "a copy");
    if (n - start < PAGE_EXAMPLES_PER_TASK)
        n = example_add(ex, n, t->aside_id, t->name, "a delivery set aside or withheld");
    if (n - start == 0)
        n = example_add(ex, n, t->fault_id, t->name, "faulted");
    return n;
}

static const struct verdict_task *row_of(const struct verdict_result *res, const char *task)
{
    for (size_t i = 0; res != NULL && i < res->n_tasks; i++)
        if (strcmp(res->tasks[i].task, task) == 0)
            return &res->tasks[i];
    return NULL;
}

static int timelines(FILE *out, const struct page_task **t, size_t n, const struct verdict *v,
                     const struct fault_log *fl, const struct verdict_result *res)
{
    struct page_example ex[PAGE_EXAMPLES_MAX];
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k = task_examples(ex, k, t[i], row_of(res, t[i]->name));
    fputs("<section id=\"examples\"><h2>Example messages</h2>\n", out);
    legend(out,
           (const char *const[]){"first delivery", "copy", "copy beside the first", "set aside",
                                 "fault", "ack", "nack", "connection closed"},
           (const char *const[]){"k0", "k1", "ko", "k2", "kf", "ka", "kn", "kc"}, 8);
    if (k == 0)
        para(out, "missing", "No message was copied, set aside or faulted: nothing to show.");
    for (size_t i = 0; i < k; i++)
        if (timeline_one(out, &ex[i], v, fl, res != NULL) != 0)
            return -1;
    fputs("</section>\n", out);
    return 0;
}

/* ---- the pages ------------------------------------------------------------------------------ */

/* The sections both pages share after their own: rules, faults over time, deliveries, delays,
 * examples, and the text output. */
static int common_sections(FILE *out, const struct page_facts *f, const struct verdict *v,
                           const struct fault_log *fl, const struct verdict_result *res)
{
    struct page_walk w;
    size_t n_rules = 0, n_tasks = 0;
    const struct fault_log_rule **rules = fault_log_rules(fl, &n_rules);
    int rc = n_rules == SIZE_MAX ? -1 : page_walk(&w, v, fl);
    const struct page_task **tasks = rc == 0 ? page_walk_tasks(&w, &n_tasks) : NULL;
    if (rc == 0 && n_tasks == 0 && strmap_count(&w.tasks) > 0)
        rc = -1;
    if (rc == 0) {
        fputs("<section id=\"rules\"><h2>Rules in force: faults per rule over time</h2>\n", out);
        rules_table(out, rules, n_rules, f->changes);
        rc = faults_chart(out, fl, rules, n_rules);
        fputs("</section>\n<section id=\"deliveries\"><h2>Deliveries per task</h2>\n", out);
    }
    if (rc == 0)
        rc = deliveries_chart(out, tasks, n_tasks);
    if (rc == 0 && res != NULL) {
        fputs("<h3>Effects per task (lines of the effects list per message)</h3>\n", out);
        rc = effects_chart(out, tasks, n_tasks);
    }
    if (rc == 0) {
        fputs("</section>\n<section id=\"delays\"><h2>Copy delays per task</h2>\n", out);
        delays_chart(out, tasks, n_tasks);
        fputs("</section>\n", out);
        rc = timelines(out, tasks, n_tasks, v, fl, res);
    }
    if (rc == 0 && f->text != NULL) {
        fputs("<section id=\"text\"><details><summary>The same, as text</summary><pre>", out);
        html_text_block(out, f->text);
        fputs("</pre></details></section>\n", out);
    }
    free(tasks);
    free(rules);
    if (n_rules != SIZE_MAX)
        page_walk_free(&w);
    return rc;
}

int page_report_html(FILE *out, const struct page_facts *f, const struct verdict *v,
                     const struct fault_log *fl)
{
    html_begin(out, "twice report");
    fputs("<h1>twice report</h1>\n", out);
    facts_block(out, f);
    journal_alerts(out, f, false);
    int rc = common_sections(out, f, v, fl, NULL);
    fputs("<footer>Made by twice report --html: no script, no request; every chart's bars "
          "carry their numbers as tooltips.</footer>\n",
          out);
    html_end(out);
    return rc;
}

/* ---- the verdict's own sections ------------------------------------------------------------- */

static bool row_partial(const struct verdict_task *t)
{
    return t->verdict == VERDICT_IDEMPOTENT &&
           (t->missing & (VERDICT_MISSING_OVERLAP | VERDICT_MISSING_WINDOW)) != 0;
}

static void verdict_badge(FILE *out, enum verdict_kind k, bool partial, const char *extra)
{
    const char *cls = k == VERDICT_NOT_IDEMPOTENT ? "v-not"
                      : k == VERDICT_UNTESTED     ? "v-untested"
                      : partial                   ? "v-partial"
                                                  : "v-ok";
    fprintf(out, "<span class=\"badge %s%s\">%s%s</span>", cls, extra, verdict_kind_name(k),
            partial ? "*" : "");
}

/* A short word of the missing evidence, its explanation as a tooltip. */
static const char *missing_span(FILE *out, const char *sep, const char *cls, const char *word,
                                const char *why)
{
    fprintf(out, "%s<span class=\"%s\" title=\"%s\">%s</span>", sep, cls, why, word);
    return "<br>";
}

/* The missing evidence of a row, named. */
static void missing_cell(FILE *out, const struct verdict_task *t)
{
    const char *sep = "<br>";
    /* without a copy, the overlap and the window are missing too: said once */
    if (t->verdict != VERDICT_NOT_IDEMPOTENT && (t->missing & VERDICT_MISSING_COPIES))
        sep = missing_span(out, sep, "missing", "no copy", "no copy reached the handler");
    else if (t->verdict != VERDICT_NOT_IDEMPOTENT) {
        if (t->missing & VERDICT_MISSING_OVERLAP)
            sep = missing_span(out, sep, "missing", "missing: overlap",
                               "no copy ran beside an earlier delivery: check-then-act races "
                               "untested");
        if (t->missing & VERDICT_MISSING_WINDOW)
            sep = missing_span(out, sep, "missing", "missing: window",
                               "every copy came soon after the first: a dedup key that expires "
                               "later untested");
    }
    if (t->required_short)
        sep = missing_span(out, sep, "missing", "short of --require",
                           "fewer copies, overlaps or a shorter window than --require asked");
    if (t->stalled)
        missing_span(out, sep, "stalled", "STALLED",
                     "work stopped while messages were outstanding");
}

/* The first examples, shortened (the whole id as the tooltip), and how many more. */
static void examples_cell(FILE *out, const struct verdict_examples *ex, const struct idshort *ids)
{
    size_t shown = ex->n < PAGE_ROW_EXAMPLES ? ex->n : PAGE_ROW_EXAMPLES;
    for (size_t i = 0; i < shown; i++) {
        fputs(i > 0 ? ", " : "", out);
        fputs("<code class=\"id\" title=\"", out);
        html_text(out, ex->ids[i]);
        fputs("\">", out);
        size_t keep = idshort_prefix_bytes(ids, ex->ids[i]);
        char *cut = strndup(ex->ids[i], keep);
        html_text(out, cut != NULL ? cut : ex->ids[i]);
        free(cut);
        fputs(idshort_cut(ids, ex->ids[i]) ? "\xe2\x80\xa6</code>" : "</code>", out);
    }
    if (ex->n > shown)
        fprintf(out, " <span class=\"meta\">+%zu</span>", ex->n - shown);
}

static void copy_delays_cell(FILE *out, const struct verdict_task *t)
{
    if (t->copies == 0) {
        fputs("<span class=\"badge v-untested\">no copy</span>", out);
        return;
    }
    char lo[SVG_LABEL_MAX], hi[SVG_LABEL_MAX];
    svg_format_seconds(lo, sizeof(lo), (double)t->copy_min_us / 1e6);
    svg_format_seconds(hi, sizeof(hi), (double)t->copy_max_us / 1e6);
    fprintf(out, "%s&ndash;%s", lo, hi);
}

/* One name of a verdict row's instances or listeners, in a code span. */
static void html_code(FILE *out, const char *name)
{
    fputs("<code>", out);
    html_text(out, name);
    fputs("</code>", out);
}

static void verdict_row(FILE *out, const struct verdict_task *t, const struct idshort *ids)
{
    fputs("<tr><td><code>", out);
    html_text(out, t->task);
    fprintf(out,
            "</code></td><td class=\"n\">%llu</td><td class=\"n\">%llu</td><td class=\"n\">%llu"
            "</td><td class=\"n\">%llu</td><td class=\"n\">%llu</td><td class=\"n\">%llu</td>"
            "<td class=\"n\">%llu/%llu</td><td>",
            (unsigned long long)t->messages, (unsigned long long)t->faulted,
            (unsigned long long)t->delivered_more_than_once,
            (unsigned long long)t->more_than_one_effect, (unsigned long long)t->no_effect,
            (unsigned long long)t->retried, (unsigned long long)t->overlapping,
            (unsigned long long)t->copies);
    copy_delays_cell(out, t);
    fputs("</td><td class=\"v\">", out);
    verdict_badge(out, t->verdict, row_partial(t), "");
    missing_cell(out, t);
    fputs("</td><td>", out);
    examples_cell(out, &t->examples, ids);
    fputs("</td><td>", out);
    page_names(out, t->seen_instances, t->n_seen_instances, t->seen_instances_total, html_code);
    fputs("<br><span class=\"meta\">", out);
    page_names(out, t->seen_listeners, t->n_seen_listeners, t->seen_listeners_total, html_code);
    fputs("</span></td></tr>\n", out);
}

static int verdict_table(FILE *out, const struct verdict_result *res)
{
    struct idshort ids;
    idshort_of_examples(&ids, res);
    fputs("<section id=\"verdict\"><h2>Verdict per task</h2>\n<div class=\"scroll\">"
          "<table class=\"verdict\"><tr>"
          "<th>task</th><th class=\"n\">messages</th><th class=\"n\">faulted</th>"
          "<th class=\"n\">delivered&gt;1</th><th class=\"n\">effects&gt;1</th>"
          "<th class=\"n\">no effect</th><th class=\"n\">retried</th>"
          "<th class=\"n\">overlapped</th><th>copy delays</th><th>verdict, evidence missing</th>"
          "<th>examples</th><th>seen through</th></tr>\n",
          out);
    for (size_t i = 0; i < res->n_tasks; i++)
        verdict_row(out, &res->tasks[i], &ids);
    fputs("</table></div>\n", out);
    if (res->n_tasks == 0)
        para(out, "missing", "No message id in the journal.");
    bool any = false;
    for (size_t i = 0; i < ids.n; i++) {
        if (!idshort_cut(&ids, ids.ids[i]))
            continue;
        fputs(any ? ", " : "<p class=\"meta\">Example ids in full: ", out);
        any = true;
        fputs("<code class=\"id\">", out);
        html_text(out, ids.ids[i]);
        fputs("</code>", out);
    }
    if (any)
        fputs("</p>\n", out);
    fputs("</section>\n", out);
    idshort_free(&ids);
    return 0;
}

/* The errors of the effects list, and the tasks short of evidence, at the top. */
static void verdict_alerts(FILE *out, const struct verdict_result *res)
{
    if (res->effects_check != VERDICT_EFFECTS_OK)
        fprintf(out,
                "<section class=\"alert\" id=\"effects-error\"><p><b>error:</b> the effects "
                "list does not match the journal (%s): the verdict below cannot be trusted "
                "(exit 3).</p></section>\n",
                res->effects_check == VERDICT_EFFECTS_EMPTY      ? "it is empty"
                : res->effects_check == VERDICT_EFFECTS_NO_MATCH ? "no line names a message"
                                                                 : "most lines name none");
    if (res->unknown_effect_ids > 0 && res->effects_check == VERDICT_EFFECTS_OK)
        fprintf(out,
                "<section class=\"warn\"><p><b>warning:</b> %llu message ids in the effects "
                "list never appear in the journal: were their workers connected through "
                "twice?</p></section>\n",
                (unsigned long long)res->unknown_effect_ids);
    if (res->any_stalled)
        para(out, "card stalled",
             "STALLED: work stopped while messages were outstanding (see the evidence).");
}

int page_verdict_html(FILE *out, const struct page_facts *f, const struct verdict *v,
                      const struct verdict_result *res, const struct fault_log *fl)
{
    size_t partial = 0;
    for (size_t i = 0; i < res->n_tasks; i++)
        partial += row_partial(&res->tasks[i]);
    html_begin(out, "twice verdict");
    fputs("<h1>twice verdict ", out);
    /* an effects list that does not describe the run leaves nothing to judge: no badge of a
     * verdict computed over it, which could read as a pass */
    if (res->effects_check != VERDICT_EFFECTS_OK)
        fputs("<span class=\"badge v-not big\">NO VERDICT: the effects list does not match "
              "the journal</span>",
              out);
    else
        verdict_badge(out, res->overall, res->overall == VERDICT_IDEMPOTENT && partial > 0, " big");
    if (damage_any(f->damage))
        fputs(" <span class=\"missing\">on a damaged journal</span>", out);
    fputs("</h1>\n", out);
    if (res->effects_check == VERDICT_EFFECTS_OK && res->overall == VERDICT_IDEMPOTENT &&
        partial > 0)
        fprintf(out,
                "<p class=\"missing\">* evidence missing for %zu %s: see the rows and the "
                "evidence below.</p>\n",
                partial, partial == 1 ? "task" : "tasks");
    facts_block(out, f);
    journal_alerts(out, f, true);
    verdict_alerts(out, res);
    int rc = verdict_table(out, res);
    if (rc == 0 && f->notes != NULL && f->notes[0] != '\0') {
        fputs("<section id=\"evidence\"><h2>Evidence, and what is missing</h2><pre "
              "class=\"notes\" style=\"white-space:pre-wrap\">",
              out);
        html_text_block(out, f->notes);
        fputs("</pre></section>\n", out);
    }
    if (rc == 0)
        rc = common_sections(out, f, v, fl, res);
    fputs("<footer>Made by twice verdict --html: no script, no request; every chart's bars "
          "carry their numbers as tooltips.</footer>\n",
          out);
    html_end(out);
    return rc;
}
