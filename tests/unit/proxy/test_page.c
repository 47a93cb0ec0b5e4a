/*
 * test_page.c - the pieces of the `--html` pages and `--format markdown`: HTML and markdown
 * escaping, the SVG charts (an element per bin, bar part, span and mark, labels escaped), the
 * shortened ids, and a whole verdict page and markdown from an accumulator fed records that
 * name a task `<script>`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <unistd.h>

#include "offline/fault_log.h"
#include "offline/html.h"
#include "offline/idshort.h"
#include "offline/markdown.h"
#include "offline/page.h"
#include "offline/report.h"
#include "offline/svg.h"
#include "proxy/core/journal.h"
#include "tests/lib/cmd_testkit.h"
#include "tests/lib/golden.h"

/* What fn wrote, as a string (caller frees). */
struct capture {
    char *buf;
    size_t len;
    FILE *f;
};

static FILE *cap_open(struct capture *c)
{
    c->buf = NULL;
    c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
    assert_non_null(c->f);
    return c->f;
}

static char *cap_close(struct capture *c)
{
    fclose(c->f);
    return c->buf;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void test_html_escapes_everything_a_journal_can_hold(void **state)
{
    (void)state;
    struct capture c;
    html_text(cap_open(&c), "<script>alert('x')</script> & \"q\"\x01\xff");
    char *s = cap_close(&c);
    assert_string_equal(s, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
                           "\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    html_text_block(cap_open(&c), "a\nb<\x02");
    s = cap_close(&c);
    assert_string_equal(s, "a\nb&lt;\xef\xbf\xbd");
    free(s);
    /* the frame forbids every script and request */
    html_begin(cap_open(&c), "<t>");
    html_end(c.f);
    s = cap_close(&c);
    assert_non_null(strstr(s, "<title>&lt;t&gt;</title>"));
    assert_non_null(strstr(s, "content=\"default-src 'none'; style-src 'unsafe-inline'\""));
    assert_null(strstr(s, "<script"));
    free(s);
}

static void test_svg_bars_one_element_per_part(void **state)
{
    (void)state;
    static const char *const names[] = {"first", "copy", "set aside"};
    struct svg_stack bars[] = {{"<b>task</b>", {3, 0, 2}}, {"other", {1, 1, 0}}};
    struct capture c;
    svg_stacked_bars(cap_open(&c), bars, 2, names, 3);
    char *s = cap_close(&c);
    assert_int_equal(count(s, "<rect class=\"bar "), 4);
    assert_non_null(strstr(s, "<title>&lt;b&gt;task&lt;/b&gt;: 3 first</title>"));
    assert_null(strstr(s, "<b>"));
    assert_non_null(strstr(s, ">5</text>")); /* the bar's total */
    free(s);
}

static void test_svg_small_multiples_bins_and_axis(void **state)
{
    (void)state;
    uint64_t a[4] = {0, 2, 0, 1}, b[4] = {0, 0, 0, 0};
    struct svg_row rows[] = {{"r1", a}, {"r2", b}};
    char edges[5][SVG_LABEL_MAX] = {"0s", "1s", "2s", "3s", "4s"};
    struct svg_axis x = {4, (const char(*)[SVG_LABEL_MAX])edges, 2, "seconds", "faults"};
    struct capture c;
    svg_small_multiples(cap_open(&c), "fault-bin", rows, 2, &x);
    char *s = cap_close(&c);
    assert_int_equal(count(s, "<rect class=\"fault-bin\""), 2);
    assert_non_null(strstr(s, "<title>r1: 2 faults, 1s\xe2\x80\x93"
                              "2s</title>"));
    assert_non_null(strstr(s, ">max 2</text>"));
    assert_non_null(strstr(s, ">max 0</text>"));
    /* ticks at every second edge and the last */
    assert_non_null(strstr(s, ">0s</text>"));
    assert_non_null(strstr(s, ">2s</text>"));
    assert_non_null(strstr(s, ">4s</text>"));
    assert_null(strstr(s, ">1s</text>"));
    free(s);
}

static void test_svg_timeline_spans_and_marks(void **state)
{
    (void)state;
    uint64_t t0 = 1000000000000ull;
    struct svg_span spans[] = {
        {t0 + 1000000, t0 + 1500000, "d-first", "m-ack", "#1", "first <x>", "ack"},
        {t0 + 1200000, t0 + 1200000, "d-copy", NULL, "#2", "copy", NULL},
    };
    struct svg_mark marks[] = {{t0 + 1100000, "m-fault", "fault of rule <r>"}};
    struct capture c;
    svg_timeline(cap_open(&c), spans, 2, marks, 1, "faults", t0, t0 + 1000000, t0 + 1500000);
    char *s = cap_close(&c);
    assert_int_equal(count(s, "<rect class=\"span "), 2);
    assert_int_equal(count(s, "<circle class=\"end m-ack\""), 1);
    assert_int_equal(count(s, "<path class=\"mark m-fault\""), 1);
    assert_non_null(strstr(s, "fault of rule &lt;r&gt;"));
    assert_non_null(strstr(s, "seconds since the run"));
    assert_non_null(strstr(s, ">1.1s</text>"));
    free(s);
    /* far from the run's start, a short timeline's ticks still differ */
    for (size_t i = 0; i < 2; i++) {
        spans[i].from_us += 476000000;
        spans[i].to_us += 476000000;
    }
    svg_timeline(cap_open(&c), spans, 2, NULL, 0, "faults", t0, t0 + 477000000, t0 + 477500000);
    s = cap_close(&c);
    assert_non_null(strstr(s, ">477.1s</text>"));
    assert_non_null(strstr(s, ">477.2s</text>"));
    free(s);
}

static void test_svg_numbers(void **state)
{
    (void)state;
    assert_true(svg_nice_step(10, 5) == 2);
    assert_true(svg_nice_step(60, 60) == 1);
    assert_true(svg_nice_step(7, 8) == 1);
    assert_true(svg_nice_step(0.7, 8) > 0.09 && svg_nice_step(0.7, 8) < 0.11);
    assert_true(svg_nice_seconds(10, 5) == 2);
    assert_true(svg_nice_seconds(3600, 8) == 600); /* ten minutes, not 500 s */
    assert_true(svg_nice_seconds(20 * 3600, 8) == 5 * 3600);
    char b[SVG_LABEL_MAX];
    svg_format_seconds(b, sizeof(b), 0);
    assert_string_equal(b, "0s");
    svg_format_seconds(b, sizeof(b), 0.25);
    assert_string_equal(b, "250ms");
    svg_format_seconds(b, sizeof(b), 0.9996);
    assert_string_equal(b, "1s");
    svg_format_seconds(b, sizeof(b), 12.5);
    assert_string_equal(b, "12.5s");
    svg_format_seconds(b, sizeof(b), 90 * 60);
    assert_string_equal(b, "90min");
    svg_format_seconds(b, sizeof(b), 3 * 3600);
    assert_string_equal(b, "3h");
}

/* Shortened as written to a terminal. */
static char *shown(const struct idshort *s, const char *id)
{
    struct capture c;
    idshort_write(cap_open(&c), s, id);
    return cap_close(&c);
}

static void test_idshort_unambiguous_within_the_table(void **state)
{
    (void)state;
    struct idshort s;
    idshort_init(&s);
    idshort_add(&s, "0123456789abcdef");
    idshort_add(&s, "fedcba9876543210");
    idshort_add(&s, "0123456789abcdef"); /* twice in the table: one id */
    idshort_add(&s, "987654321");
    idshort_finish(&s);
    assert_int_equal(s.len, 8);
    assert_int_equal(s.n, 3);
    char *a = shown(&s, "0123456789abcdef");
    assert_string_equal(a, "01234567\xe2\x80\xa6");
    free(a);
    /* nine characters: cutting one to add an ellipsis says nothing */
    a = shown(&s, "987654321");
    assert_string_equal(a, "987654321");
    free(a);
    idshort_free(&s);

    /* two ids sharing 11 characters: 12 kept, so the two still differ */
    idshort_init(&s);
    idshort_add(&s, "abcdefghij-1111");
    idshort_add(&s, "abcdefghij-2222");
    idshort_finish(&s);
    assert_int_equal(s.len, 12);
    a = shown(&s, "abcdefghij-2222");
    assert_string_equal(a, "abcdefghij-2\xe2\x80\xa6");
    free(a);
    struct capture c;
    idshort_print_list(cap_open(&c), &s, "in full:");
    a = cap_close(&c);
    assert_string_equal(a, "\nin full:\n  abcdefghij-1\xe2\x80\xa6  abcdefghij-1111\n"
                           "  abcdefghij-2\xe2\x80\xa6  abcdefghij-2222\n");
    free(a);
    idshort_free(&s);

    /* a cut falls between characters, never inside one; control bytes are not written */
    idshort_init(&s);
    idshort_add(&s, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3"
                    "\xa9\x01");
    idshort_finish(&s);
    a = shown(&s, s.ids[0]);
    assert_string_equal(a, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                           "\xe2\x80\xa6");
    free(a);
    idshort_free(&s);
}

static void test_markdown_escapes_cells(void **state)
{
    (void)state;
    struct capture c;
    md_text(cap_open(&c), "a|b <script> *x* `c` &\x01");
    char *s = cap_close(&c);
    assert_string_equal(s, "a\\|b &lt;script\\> \\*x\\* \\`c\\` &amp;?");
    free(s);
    md_code(cap_open(&c), "x|y");
    s = cap_close(&c);
    assert_string_equal(s, "` x\\|y `");
    free(s);
    md_code(cap_open(&c), "a``b");
    s = cap_close(&c);
    assert_string_equal(s, "``` a``b ```");
    free(s);
    assert_int_equal(md_fence_len("plain"), 3);
    assert_int_equal(md_fence_len("a ```` b"), 5);
    md_fenced(cap_open(&c), "\n\nline ```\nend");
    s = cap_close(&c);
    assert_string_equal(s, "````text\nline ```\nend\n````\n");
    free(s);
}

/* ---- a whole page --------------------------------------------------------------------------- */

#define T0_MS 1700000000000ull
#define HOSTILE "<script>alert(1)</script>|x"

static void feed(struct verdict *v, struct fault_log *fl, Twice__Journal__Record__Kind kind,
                 const char *id, const char *task, uint64_t at_ms, uint64_t session,
                 const char *rule)
{
    Twice__Journal__Record r = TWICE__JOURNAL__RECORD__INIT;
    r.kind = kind;
    r.message_id = (char *)id;
    r.task = (char *)task;
    r.time_unix_us = (T0_MS + at_ms) * 1000;
    r.session = session;
    r.listener = (char *)"redis";
    if (rule != NULL) {
        r.rule = (char *)rule;
        r.action_name = (char *)"duplicate";
        r.event = 2;
    }
    assert_int_equal(verdict_add_record(v, &r), 0);
    assert_int_equal(fault_log_add_record(fl, &r), 0);
}

/* m1 (hostile task) delivered, copied at once on another connection while it ran, both acked;
 * two effects.  m2 (safe) delivered once, one effect. */
static void fill(struct verdict *v, struct fault_log *fl)
{
    Twice__Journal__Header h = TWICE__JOURNAL__HEADER__INIT;
    h.start_unix_ms = T0_MS;
    fault_log_add_header(fl, &h);
    assert_int_equal(verdict_add_header(v, &h), 0);
    const Twice__Journal__Record__Kind D = TWICE__JOURNAL__RECORD__KIND__DELIVER,
                                       A = TWICE__JOURNAL__RECORD__KIND__ACK,
                                       F = TWICE__JOURNAL__RECORD__KIND__FAULT;
    feed(v, fl, D, "m1-0123456789", HOSTILE, 1000, 1, NULL);
    feed(v, fl, F, "m1-0123456789", HOSTILE, 1000, 1, "racing<copy>");
    feed(v, fl, D, "m1-0123456789", HOSTILE, 1001, 2, NULL);
    feed(v, fl, A, "m1-0123456789", HOSTILE, 1300, 1, NULL);
    feed(v, fl, A, "m1-0123456789", HOSTILE, 1310, 2, NULL);
    feed(v, fl, D, "m2", "safe", 2000, 1, NULL);
    feed(v, fl, A, "m2", "safe", 2100, 1, NULL);
    assert_int_equal(verdict_add_effect(v, "m1-0123456789"), 0);
    assert_int_equal(verdict_add_effect(v, "m1-0123456789"), 0);
    assert_int_equal(verdict_add_effect(v, "m2"), 0);
}

static void test_verdict_page_and_markdown(void **state)
{
    (void)state;
    struct verdict *v = verdict_new();
    assert_non_null(v);
    struct fault_log fl;
    fault_log_init(&fl);
    fill(v, &fl);
    struct verdict_result res;
    assert_int_equal(verdict_compute(v, &res), 0);
    struct damage_report damage = {0};
    struct changes changes = {0};
    struct page_facts f = {.journal = "<j>.pb",
                           .effects = "e.txt",
                           .records = 7,
                           .runs = 1,
                           .clean_stop = true,
                           .damage = &damage,
                           .changes = &changes,
                           .text = "TASK <script>\n",
                           .notes = "safe: UNTESTED: no copy\n"};
    struct capture c;
    assert_int_equal(page_verdict_html(cap_open(&c), &f, v, &res, &fl), 0);
    char *s = cap_close(&c);
    assert_null(strstr(s, "<script"));
    assert_non_null(strstr(s, "&lt;script&gt;alert(1)&lt;/script&gt;|x"));
    assert_non_null(strstr(s, "<code>&lt;j&gt;.pb</code>"));
    /* the overall verdict on top, the rows with theirs; the untested row says so */
    assert_non_null(strstr(s, "<h1>twice verdict <span class=\"badge v-not big\">NOT "
                              "IDEMPOTENT</span></h1>"));
    assert_non_null(strstr(s, "<span class=\"badge v-untested\">UNTESTED</span>"));
    assert_non_null(strstr(s, "no copy reached the handler"));
    /* one fault row, two bar charts (deliveries, effects), one delay row, two timelines */
    assert_int_equal(count(s, "<rect class=\"fault-bin\""), 1);
    assert_int_equal(count(s, "<svg class=\"chart bars\""), 2);
    assert_int_equal(count(s, "<rect class=\"delay-bin\""), 1);
    assert_int_equal(count(s, "<svg class=\"chart timeline\""), 1);
    assert_int_equal(count(s, "<rect class=\"span d-first\""), 1);
    assert_int_equal(count(s, "<rect class=\"span d-overlap\""), 1);
    assert_non_null(strstr(s, "fault of rule racing&lt;copy&gt; (duplicate) on deliver"));
    assert_non_null(strstr(s, "<b>2</b> lines in the effects list"));
    assert_non_null(strstr(s, "<pre>TASK &lt;script&gt;\n</pre>"));
    /* which instances and listeners each row was seen through */
    assert_non_null(strstr(s, "<th>seen through</th>"));
    assert_non_null(
        strstr(s, "<td><code>-</code><br><span class=\"meta\"><code>redis</code></span></td>"));
    free(s);

    assert_int_equal(page_verdict_markdown(cap_open(&c), &f, &res, &fl), 0);
    s = cap_close(&c);
    assert_non_null(strstr(s, "## twice verdict: **NOT IDEMPOTENT**\n"));
    assert_non_null(
        strstr(s, "| ` <script>alert(1)</script>\\|x ` | 1 | 1 | 1 | 1 | 0 | 0 | 1/1 "
                  "| 1ms\xe2\x80\x93"
                  "1ms | **NOT IDEMPOTENT** | ` m1-01234 `\xe2\x80\xa6 | ` - `; ` redis ` |\n"));
    assert_non_null(strstr(s, "| ` safe ` | 1 | 0 | 0 | 0 | 0 | 0 | 0/0 | no copy | "
                              "**UNTESTED** no copy |  | ` - `; ` redis ` |\n"));
    assert_non_null(strstr(s, "- ` m1-01234 `\xe2\x80\xa6 = ` m1-0123456789 `\n"));
    assert_non_null(strstr(s, "| ` racing<copy> ` | duplicate | 1 | deliver 1 |\n"));
    assert_non_null(strstr(s, "```text\nsafe: UNTESTED: no copy\n```\n"));
    free(s);
    verdict_result_free(&res);
    verdict_free(v);
    fault_log_free(&fl);
}

/* ---- the commands' options ------------------------------------------------------------------ */

/* A journal of one message copied by a rule, delivered twice, acked twice; one effect. */
static void write_small_run(struct fixture *f)
{
    struct journal_header_info h = {.seed = 3, .config_path = "t", .start_unix_ms = T0_MS};
    char err[256];
    struct journal *j =
        journal_open_mode(f->journal, &h, NULL, JOURNAL_MODE_OVERWRITE, NULL, err, sizeof(err));
    assert_non_null(j);
    struct journal_record r = {.kind = JOURNAL_KIND_DELIVER,
                               .time_unix_us = T0_MS * 1000 + 1000000,
                               .session = 1,
                               .listener = "l",
                               .queue = "q",
                               .message_id = "0123456789-a",
                               .task = "a|b"};
    journal_record(j, &r);
    struct journal_record fault = r;
    fault.kind = JOURNAL_KIND_FAULT;
    fault.rule = "copy";
    fault.action_name = "duplicate";
    fault.event = 2;
    journal_record(j, &fault);
    struct journal_record ack = r;
    ack.kind = JOURNAL_KIND_ACK;
    ack.time_unix_us += 5000;
    journal_record(j, &ack);
    r.session = 2;
    r.time_unix_us += 2000000;
    journal_record(j, &r);
    ack.session = 2;
    ack.time_unix_us = r.time_unix_us + 5000;
    journal_record(j, &ack);
    journal_close(j);
    write_file(f->effects, "0123456789-a\n");
}

/* The page at path, as a string. */
static char *slurp(const char *path)
{
    size_t len;
    return (char *)kit_read_path(path, &len);
}

static void test_commands_html_and_markdown(void **state)
{
    struct fixture *f = *state;
    write_small_run(f);
    char page[160];
    snprintf(page, sizeof(page), "%s/page.html", f->dir);

    /* verdict --html FILE: the page written, the text printed as ever */
    const char *v1[] = {"verdict", f->journal, "--effects", f->effects, "--html", page};
    assert_int_equal(run(f, verdict_run, 6, v1), 0);
    assert_contains(f->out, "\nverdict: IDEMPOTENT");
    char *html = slurp(page);
    assert_non_null(html);
    assert_contains(html, "<span class=\"badge v-partial big\">IDEMPOTENT*</span>");
    assert_contains(html, "<code>a|b</code>");
    free(html);
    unlink(page);

    /* an effects list that names nothing of the run: no verdict on the page's top, none in
     * markdown's title */
    char empty[160];
    snprintf(empty, sizeof(empty), "%s/empty.txt", f->dir);
    write_file(empty, "");
    const char *v0[] = {"verdict", f->journal, "--effects", empty,
                        "--html",  page,       "--format",  "markdown"};
    assert_int_equal(run(f, verdict_run, 8, v0), VERDICT_EXIT_EFFECTS);
    assert_contains(f->out, "## twice verdict: **no verdict: the effects list does not match the "
                            "journal**\n");
    assert_null(strstr(f->out, "**Verdict: "));
    html = slurp(page);
    assert_non_null(html);
    assert_contains(html, "<h1>twice verdict <span class=\"badge v-not big\">NO VERDICT: the "
                          "effects list does not match the journal</span></h1>");
    assert_contains(html, "<b>error:</b> the effects list does not match the journal");
    free(html);
    unlink(page);
    unlink(empty);

    /* --format markdown instead of the text; --format json is --json */
    const char *v2[] = {"verdict", f->journal, "--effects", f->effects, "--format", "markdown"};
    assert_int_equal(run(f, verdict_run, 6, v2), 0);
    assert_contains(f->out, "## twice verdict: **IDEMPOTENT**\n");
    assert_contains(f->out, "| ` a\\|b ` | 1 | 1 | 1 | 0 | 0 | 0 | 0/1 | 2s\xe2\x80\x93"
                            "2s | **IDEMPOTENT\\*** missing: overlap, window |  | ");
    /* seen through: the journal without an instance name is named by its path; listener l */
    assert_contains(f->out, "run.journal `; ` l ` |\n");
    assert_null(strstr(f->out, "MESSAGES"));
    const char *v3[] = {"verdict", f->journal, "--effects", f->effects, "--format=json"};
    assert_int_equal(run(f, verdict_run, 5, v3), 0);
    assert_contains(f->out, "\"verdict\": \"IDEMPOTENT\"");

    /* a format it does not know, and two different pages, are usage errors */
    const char *v4[] = {"verdict", f->journal, "--effects", f->effects, "--format", "yaml"};
    assert_int_equal(run(f, verdict_run, 6, v4), VERDICT_EXIT_ERROR);
    assert_contains(f->err, "--format 'yaml': expected text, markdown or json");
    const char *v5[] = {"verdict", f->journal, "--effects", f->effects,
                        "--html",  "x.html",   "--html",    "y.html"};
    assert_int_equal(run(f, verdict_run, 8, v5), VERDICT_EXIT_ERROR);
    assert_contains(f->err, "more than one --html given: 'x.html' and 'y.html'");
    const char *r1[] = {"report", f->journal, "--html", "x.html", "--html=y.html"};
    assert_int_equal(run(f, report_run, 5, r1), 2);
    assert_contains(f->err, "more than one --html given: 'x.html' and 'y.html'");

    /* a page that cannot be written is an error, and nothing is left behind */
    const char *r2[] = {"report", f->journal, "--html", "/nonexistent-dir/p.html"};
    assert_int_equal(run(f, report_run, 4, r2), 2);
    assert_contains(f->err, "twice report: /nonexistent-dir/p.html: No such file or directory");

    /* report --html and --format markdown */
    const char *r3[] = {"report", f->journal, "--html", page, "--format", "markdown"};
    assert_int_equal(run(f, report_run, 6, r3), 0);
    assert_contains(f->out, "| ` copy ` | duplicate | 1 | deliver 1 |\n");
    assert_contains(f->out, "| ` a\\|b ` | 1 | 1 | 1 | 0 | 0 | 0 |  |\n");
    assert_contains(f->out, "| 2 | ` 01234567 `\xe2\x80\xa6 |\n");
    assert_contains(f->out, "- ` 01234567 `\xe2\x80\xa6 = ` 0123456789-a `\n");
    html = slurp(page);
    assert_non_null(html);
    assert_contains(html, "<h1>twice report</h1>");
    assert_contains(html, "<rect class=\"fault-bin\"");
    free(html);
    unlink(page);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_html_escapes_everything_a_journal_can_hold),
        cmocka_unit_test(test_svg_bars_one_element_per_part),
        cmocka_unit_test(test_svg_small_multiples_bins_and_axis),
        cmocka_unit_test(test_svg_timeline_spans_and_marks),
        cmocka_unit_test(test_svg_numbers),
        cmocka_unit_test(test_idshort_unambiguous_within_the_table),
        cmocka_unit_test(test_markdown_escapes_cells),
        cmocka_unit_test(test_verdict_page_and_markdown),
        cmocka_unit_test_setup_teardown(test_commands_html_and_markdown, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
