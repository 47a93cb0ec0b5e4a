/*
 * page_md.c - `--format markdown` of `twice report` and `twice verdict`: the rules in force,
 * the evidence and the verdict as GitHub-flavoured markdown tables, to paste into a pull
 * request.  Ids are shortened in the tables and listed whole under them.  See page.h.
 */
#include "offline/page.h"

#include <stdlib.h>
#include <string.h>

#include "offline/idshort.h"
#include "offline/markdown.h"
#include "offline/svg.h"

/* The journal's warnings, as quoted lines. */
static void md_alerts(FILE *out, const struct page_facts *f, bool verdict)
{
    if (f->truncated)
        fputs("> **warning:** the journal's last record is cut short; the records before it "
              "are counted.\n\n",
              out);
    if (!f->clean_stop)
        fputs("> **warning:** the journal ended without a clean stop (twice was killed or "
              "crashed): the records it had not yet written are missing.\n\n",
              out);
    if (f->unclean_runs > 0)
        fprintf(out,
                "> **warning:** %llu of the journal's %llu runs ended without a clean stop.\n\n",
                (unsigned long long)f->unclean_runs, (unsigned long long)f->runs);
    if (damage_any(f->damage))
        fprintf(out, "> **%s:** the journal is damaged (%llu bytes skipped).\n\n",
                verdict && !f->allow_damaged ? "error" : "warning",
                (unsigned long long)f->damage->sum.bytes);
}

static void md_facts(FILE *out, const struct page_facts *f)
{
    fputs("journal ", out);
    md_code(out, f->journal);
    fprintf(out, ": %llu records", (unsigned long long)f->records);
    if (f->runs > 1)
        fprintf(out, " in %llu runs", (unsigned long long)f->runs);
    fprintf(out, ", seed %llu", (unsigned long long)f->seed);
    if (f->effects != NULL) {
        fputs("; effects ", out);
        md_code(out, f->effects);
        fprintf(out, ": %llu side effects", (unsigned long long)f->effect_lines);
    }
    fputs("\n\n", out);
}

/* The rules that faulted, and whether they changed during the run. */
static int md_rules(FILE *out, const struct fault_log *fl, const struct changes *changes)
{
    size_t n = 0;
    const struct fault_log_rule **rules = fault_log_rules(fl, &n);
    if (n == SIZE_MAX)
        return -1;
    fputs("### Rules in force\n\n", out);
    if (n == 0)
        fputs("No fault was injected: nothing in this journal tests a handler.\n", out);
    else
        fputs("| rule | action | faults | on |\n| --- | --- | ---: | --- |\n", out);
    for (size_t i = 0; i < n; i++) {
        fputs("| ", out);
        md_code(out, rules[i]->name);
        fputs(" | ", out);
        md_text(out, rules[i]->action);
        fprintf(out, " | %llu | ", (unsigned long long)rules[i]->count);
        fault_log_write_events(out, rules[i]);
        fputs(" |\n", out);
    }
    if (changes != NULL && changes->count > 0)
        fprintf(out,
                "\nThe rules changed %llu times during the run (`twice report` lists the "
                "changes).\n",
                (unsigned long long)changes->count);
    fputc('\n', out);
    free(rules);
    return 0;
}

/* An id as a table shows it: shortened, in code. */
static void md_id(FILE *out, const struct idshort *ids, const char *id)
{
    if (!idshort_cut(ids, id)) {
        md_code(out, id);
        return;
    }
    char *cut = strndup(id, idshort_prefix_bytes(ids, id));
    if (cut == NULL) {
        md_code(out, id);
        return;
    }
    md_code(out, cut);
    fputs("\xe2\x80\xa6", out);
    free(cut);
}

/* "Example ids:" with each shortened id and the whole one, when some were cut. */
static void md_id_list(FILE *out, const struct idshort *ids)
{
    bool any = false;
    for (size_t i = 0; i < ids->n; i++) {
        if (!idshort_cut(ids, ids->ids[i]))
            continue;
        if (!any)
            fputs("\nExample ids in full:\n\n", out);
        any = true;
        fputs("- ", out);
        md_id(out, ids, ids->ids[i]);
        fputs(" = ", out);
        md_code(out, ids->ids[i]);
        fputc('\n', out);
    }
}

static void md_delays(FILE *out, uint64_t copies, uint64_t lo_us, uint64_t hi_us)
{
    if (copies == 0) {
        fputs("no copy", out);
        return;
    }
    char lo[SVG_LABEL_MAX], hi[SVG_LABEL_MAX];
    svg_format_seconds(lo, sizeof(lo), (double)lo_us / 1e6);
    svg_format_seconds(hi, sizeof(hi), (double)hi_us / 1e6);
    fprintf(out, "%s–%s", lo, hi);
}

static void md_verdict_cell(FILE *out, const struct verdict_task *t)
{
    bool partial = t->verdict == VERDICT_IDEMPOTENT &&
                   (t->missing & (VERDICT_MISSING_OVERLAP | VERDICT_MISSING_WINDOW)) != 0;
    fprintf(out, "**%s%s**", verdict_kind_name(t->verdict), partial ? "\\*" : "");
    if (t->verdict != VERDICT_NOT_IDEMPOTENT) {
        /* without a copy, the overlap and the window are missing too: said once */
        if (t->missing & VERDICT_MISSING_COPIES)
            fputs(" no copy", out);
        else if (t->missing & (VERDICT_MISSING_OVERLAP | VERDICT_MISSING_WINDOW))
            fprintf(out, " missing: %s%s%s",
                    (t->missing & VERDICT_MISSING_OVERLAP) ? "overlap" : "",
                    (t->missing & VERDICT_MISSING_OVERLAP) && (t->missing & VERDICT_MISSING_WINDOW)
                        ? ", "
                        : "",
                    (t->missing & VERDICT_MISSING_WINDOW) ? "window" : "");
    }
    if (t->required_short)
        fputs(" short of --require", out);
    if (t->stalled)
        fputs(" **STALLED**", out);
}

static void md_verdict_row(FILE *out, const struct verdict_task *t, const struct idshort *ids)
{
    fputs("| ", out);
    md_code(out, t->task);
    fprintf(out, " | %llu | %llu | %llu | %llu | %llu | %llu | %llu/%llu | ",
            (unsigned long long)t->messages, (unsigned long long)t->faulted,
            (unsigned long long)t->delivered_more_than_once,
            (unsigned long long)t->more_than_one_effect, (unsigned long long)t->no_effect,
            (unsigned long long)t->retried, (unsigned long long)t->overlapping,
            (unsigned long long)t->copies);
    md_delays(out, t->copies, t->copy_min_us, t->copy_max_us);
    fputs(" | ", out);
    md_verdict_cell(out, t);
    fputs(" | ", out);
    size_t shown = t->examples.n < PAGE_ROW_EXAMPLES ? t->examples.n : PAGE_ROW_EXAMPLES;
    for (size_t k = 0; k < shown; k++) {
        fputs(k > 0 ? ", " : "", out);
        md_id(out, ids, t->examples.ids[k]);
    }
    if (t->examples.n > shown)
        fprintf(out, " +%zu", t->examples.n - shown);
    fputs(" | ", out);
    page_names(out, t->seen_instances, t->n_seen_instances, t->seen_instances_total, md_code);
    fputs("; ", out);
    page_names(out, t->seen_listeners, t->n_seen_listeners, t->seen_listeners_total, md_code);
    fputs(" |\n", out);
}

int page_verdict_markdown(FILE *out, const struct page_facts *f, const struct verdict_result *res,
                          const struct fault_log *fl)
{
    if (res->effects_check != VERDICT_EFFECTS_OK)
        fputs("## twice verdict: **no verdict: the effects list does not match the journal**\n\n",
              out);
    else
        fprintf(out, "## twice verdict: **%s**%s\n\n", verdict_kind_name(res->overall),
                damage_any(f->damage) ? " (on a damaged journal)" : "");
    md_facts(out, f);
    md_alerts(out, f, true);
    if (res->effects_check != VERDICT_EFFECTS_OK)
        fputs("> **error:** the effects list does not match the journal: the verdict cannot "
              "be trusted (exit 3).\n\n",
              out);
    if (md_rules(out, fl, f->changes) != 0)
        return -1;
    struct idshort ids;
    idshort_of_examples(&ids, res);
    fputs("### Verdict per task\n\n| task | messages | faulted | delivered>1 | effects>1 | no "
          "effect | retried | overlapped | copy delays | verdict | examples | seen through "
          "(instances; listeners) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
          "| --- | --- | --- |\n",
          out);
    for (size_t i = 0; i < res->n_tasks; i++)
        md_verdict_row(out, &res->tasks[i], &ids);
    md_id_list(out, &ids);
    idshort_free(&ids);
    if (f->notes != NULL && f->notes[0] != '\0') {
        fputs("\n### Evidence\n\n", out);
        md_fenced(out, f->notes);
    }
    if (res->effects_check == VERDICT_EFFECTS_OK)
        fprintf(out, "\n**Verdict: %s**\n", verdict_kind_name(res->overall));
    return 0;
}

/* The report's per-task table: deliveries as the verdict counts them. */
static void md_task_row(FILE *out, const struct page_task *t)
{
    fputs("| ", out);
    md_code(out, t->name);
    fprintf(out, " | %llu | %llu | %llu | %llu | %llu | %llu | ", (unsigned long long)t->messages,
            (unsigned long long)t->counted[PAGE_FIRST], (unsigned long long)t->counted[PAGE_COPY],
            (unsigned long long)t->overlapping, (unsigned long long)t->counted[PAGE_SET_ASIDE],
            (unsigned long long)t->counted[PAGE_WITHHELD]);
    fputs(t->copies == 0 ? "**no copy: untested**" : "", out);
    fputs(" |\n", out);
}

static int md_top(FILE *out, const struct page_walk *w)
{
    if (w->n_top == 0)
        return 0;
    struct idshort ids;
    idshort_init(&ids);
    for (size_t i = 0; i < w->n_top; i++)
        idshort_add(&ids, w->top_id[i]);
    idshort_finish(&ids);
    fputs("\n### Messages with the most deliveries\n\n| deliveries | message |\n| ---: | --- |\n",
          out);
    for (size_t i = 0; i < w->n_top; i++) {
        fprintf(out, "| %llu | ", (unsigned long long)w->top_n[i]);
        md_id(out, &ids, w->top_id[i]);
        fputs(" |\n", out);
    }
    md_id_list(out, &ids);
    idshort_free(&ids);
    return 0;
}

int page_report_markdown(FILE *out, const struct page_facts *f, const struct verdict *v,
                         const struct fault_log *fl)
{
    fputs("## twice report\n\n", out);
    md_facts(out, f);
    md_alerts(out, f, false);
    if (md_rules(out, fl, f->changes) != 0)
        return -1;
    struct page_walk w;
    size_t n = 0;
    int rc = page_walk(&w, v, fl);
    const struct page_task **t = rc == 0 ? page_walk_tasks(&w, &n) : NULL;
    if (rc == 0 && n == 0 && strmap_count(&w.tasks) > 0)
        rc = -1;
    if (rc == 0) {
        fprintf(out,
                "### Deliveries per task\n\n%llu message ids, %llu delivered, %llu delivered "
                "more than once.\n\n| task | messages | first deliveries | copies | overlapping "
                "| set aside | withheld | note |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: "
                "| --- |\n",
                (unsigned long long)w.messages, (unsigned long long)w.delivered,
                (unsigned long long)w.delivered_more_than_once);
        for (size_t i = 0; i < n; i++)
            md_task_row(out, t[i]);
        rc = md_top(out, &w);
    }
    free(t);
    page_walk_free(&w);
    return rc;
}
