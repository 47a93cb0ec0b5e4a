/*
 * svg.c - inline SVG charts.  See svg.h.
 *
 * Coordinates are in the viewBox's units (SVG_WIDTH wide); the page scales the chart to its
 * width.  Numbers are printed with one decimal at most, which keeps the markup small.
 */
#include "offline/svg.h"

#include <string.h>

#include "offline/html.h"
#include "offline/journal_reader.h"

/* Characters of a label drawn in the label column; the whole label is in its tooltip. */
#define SVG_LABEL_CHARS 30
/* Right margin, for the "max N" of a small-multiples row and the totals of bars. */
#define SVG_RIGHT_W 80

double svg_nice_step(double range, unsigned max_ticks)
{
    double raw = range / (max_ticks != 0 ? max_ticks : 1), mag = 1;
    while (mag * 10 <= raw)
        mag *= 10;
    while (mag > raw && mag > 1e-9)
        mag /= 10;
    double norm = raw / mag;
    return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

double svg_nice_seconds(double span, unsigned max_ticks)
{
    double raw = span / (max_ticks != 0 ? max_ticks : 1);
    /* minutes and hours step in whole units, as the labels say them */
    double unit = raw >= 3600 ? 3600 : raw >= 60 ? 60 : 1;
    return unit * svg_nice_step(span / unit, max_ticks);
}

void svg_format_seconds(char *buf, size_t cap, double s)
{
    if (s == 0)
        snprintf(buf, cap, "0s");
    else if (s < 0.9995) /* below what "%.3g" rounds to 1000 */
        snprintf(buf, cap, "%.3gms", s * 1000);
    else if (s < 120)
        snprintf(buf, cap, "%.3gs", s);
    else if (s < 7200)
        snprintf(buf, cap, "%.3gmin", s / 60);
    else
        snprintf(buf, cap, "%.3gh", s / 3600);
}

/* s, escaped, cut to SVG_LABEL_CHARS characters with an ellipsis. */
static void write_label(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    size_t chars = 0, bytes = 0;
    while (p[bytes] != '\0' && chars < SVG_LABEL_CHARS) {
        size_t n = journal_utf8_char_len(p + bytes);
        bytes += n != 0 ? n : 1;
        chars++;
    }
    if (p[bytes] == '\0') {
        html_text(out, s);
        return;
    }
    char buf[SVG_LABEL_CHARS * 4 + 1];
    memcpy(buf, p, bytes);
    buf[bytes] = '\0';
    html_text(out, buf);
    fputs("\xe2\x80\xa6", out);
}

/* A row's label at the left, whole in its tooltip. */
static void row_label(FILE *out, const char *label, double y)
{
    fprintf(out, "<text class=\"lab\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\"><title>",
            SVG_LABEL_W - 8, y);
    html_text(out, label);
    fputs("</title>", out);
    write_label(out, label);
    fputs("</text>\n", out);
}

static void svg_open(FILE *out, const char *cls, double height, const char *title)
{
    fprintf(out,
            "<svg class=\"chart %s\" viewBox=\"0 0 %d %.0f\" width=\"%d\" height=\"%.0f\" "
            "role=\"img\" xmlns=\"http://www.w3.org/2000/svg\"><title>",
            cls, SVG_WIDTH, height, SVG_WIDTH, height);
    html_text(out, title);
    fputs("</title>\n", out);
}

static uint64_t max_of(const uint64_t *v, size_t n)
{
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* The x axis of a small-multiples chart at y: a line, the edge labels every tick_every, its
 * title under them. */
static void multiples_axis(FILE *out, const struct svg_axis *x, double y, double bin_w)
{
    fprintf(out, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
            SVG_LABEL_W, y, SVG_LABEL_W + bin_w * (double)x->n_bins, y);
    size_t every = x->tick_every != 0 ? x->tick_every : 1;
    for (size_t i = 0; i <= x->n_bins; i++) {
        /* the last edge too, unless a tick stands close before it */
        if (i % every != 0 && (i != x->n_bins || i % every < (every + 1) / 2))
            continue;
        double xi = SVG_LABEL_W + bin_w * (double)i;
        fprintf(out,
                "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                xi, y, xi, y + 4, xi, y + 15);
        html_text(out, x->edges[i]);
        fputs("</text>\n", out);
    }
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
            SVG_LABEL_W + bin_w * (double)x->n_bins / 2, y + 30);
    html_text(out, x->title);
    fputs("</text>\n", out);
}

/* One bin's bar, with its tooltip "LABEL: N UNIT, FROM-TO". */
static void multiples_bin(FILE *out, const char *cls, const struct svg_row *row,
                          const struct svg_axis *x, size_t i, double base, double bar_h,
                          double bin_w)
{
    fprintf(out, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>",
            cls, SVG_LABEL_W + bin_w * (double)i + 0.5, base - bar_h, bin_w > 2 ? bin_w - 1 : bin_w,
            bar_h);
    html_text(out, row->label);
    fprintf(out, ": %llu ", (unsigned long long)row->bins[i]);
    html_text(out, x->unit);
    fputs(", ", out);
    html_text(out, x->edges[i]);
    fputs("\xe2\x80\x93", out);
    html_text(out, x->edges[i + 1]);
    fputs("</title></rect>\n", out);
}

void svg_small_multiples(FILE *out, const char *cls, const struct svg_row *rows, size_t n_rows,
                         const struct svg_axis *x)
{
    const double top = 6, row_h = 34, axis_h = 40;
    double bin_w = (double)(SVG_WIDTH - SVG_LABEL_W - SVG_RIGHT_W) / (double)x->n_bins;
    double axis_y = top + row_h * (double)n_rows;
    svg_open(out, "multiples", axis_y + axis_h, x->title);
    for (size_t r = 0; r < n_rows; r++) {
        double base = top + row_h * (double)(r + 1) - 4;
        uint64_t max = max_of(rows[r].bins, x->n_bins);
        row_label(out, rows[r].label, base - 8);
        fprintf(out, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                SVG_LABEL_W, base, SVG_LABEL_W + bin_w * (double)x->n_bins, base);
        for (size_t i = 0; i < x->n_bins; i++) {
            if (rows[r].bins[i] == 0)
                continue;
            double h = (row_h - 8) * (double)rows[r].bins[i] / (double)max;
            multiples_bin(out, cls, &rows[r], x, i, base, h < 1.5 ? 1.5 : h, bin_w);
        }
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">max %llu</text>\n",
                SVG_LABEL_W + bin_w * (double)x->n_bins + 8, base - 8, (unsigned long long)max);
    }
    multiples_axis(out, x, axis_y, bin_w);
    fputs("</svg>\n", out);
}

/* The legend of a stacked bar chart, above the bars. */
static void bars_legend(FILE *out, const char *const *names, size_t n)
{
    double x = SVG_LABEL_W;
    for (size_t k = 0; k < n; k++) {
        fprintf(out,
                "<rect class=\"s%zu\" x=\"%.1f\" y=\"4\" width=\"10\" height=\"10\"/>"
                "<text x=\"%.1f\" y=\"13\">",
                k, x, x + 14);
        html_text(out, names[k]);
        fputs("</text>\n", out);
        x += 24 + 7.0 * (double)strlen(names[k]);
    }
}

static void bar_parts(FILE *out, const struct svg_stack *b, const char *const *names,
                      size_t n_parts, double y, double scale)
{
    double x = SVG_LABEL_W;
    for (size_t k = 0; k < n_parts; k++) {
        if (b->parts[k] == 0)
            continue;
        double w = (double)b->parts[k] * scale;
        fprintf(out,
                "<rect class=\"bar s%zu\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"16\">"
                "<title>",
                k, x, y, w < 1 ? 1 : w);
        html_text(out, b->label);
        fprintf(out, ": %llu ", (unsigned long long)b->parts[k]);
        html_text(out, names[k]);
        fputs("</title></rect>\n", out);
        x += w;
    }
}

void svg_stacked_bars(FILE *out, const struct svg_stack *bars, size_t n,
                      const char *const *part_names, size_t n_parts)
{
    const double top = 24, row_h = 26;
    uint64_t max = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sum = 0;
        for (size_t k = 0; k < n_parts; k++)
            sum += bars[i].parts[k];
        max = sum > max ? sum : max;
    }
    double plot_w = SVG_WIDTH - SVG_LABEL_W - SVG_RIGHT_W;
    double scale = max > 0 ? plot_w / (double)max : 0;
    svg_open(out, "bars", top + row_h * (double)n + 6, "bars");
    bars_legend(out, part_names, n_parts);
    for (size_t i = 0; i < n; i++) {
        double y = top + row_h * (double)i;
        uint64_t sum = 0;
        for (size_t k = 0; k < n_parts; k++)
            sum += bars[i].parts[k];
        row_label(out, bars[i].label, y + 12);
        bar_parts(out, &bars[i], part_names, n_parts, y, scale);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">%llu</text>\n",
                SVG_LABEL_W + (double)sum * scale + 6, y + 12, (unsigned long long)sum);
    }
    fputs("</svg>\n", out);
}

/* A tick at s seconds, precise enough to tell it from the next one step away: "476.9s" where
 * svg_format_seconds() would say "7.95min" for a whole axis. */
static void tick_label(char *buf, size_t cap, double s, double step)
{
    if (step >= 60) {
        svg_format_seconds(buf, cap, s);
        return;
    }
    int decimals = 0;
    for (double d = step; d < 0.999 && decimals < 6; d *= 10)
        decimals++;
    snprintf(buf, cap, "%.*fs", decimals, s);
}

/* The time axis of a timeline at y: ticks in seconds since t0 over [lo, hi]. */
static void timeline_axis(FILE *out, double y, uint64_t t0, uint64_t lo, uint64_t hi, double plot_w)
{
    double span = (double)(hi - lo) / 1e6, from = ((double)lo - (double)t0) / 1e6;
    double step = svg_nice_seconds(span, 8);
    fprintf(out, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
            SVG_LABEL_W, y, SVG_LABEL_W + plot_w, y);
    long long k0 = (long long)(from / step);
    for (long long k = k0; (double)k * step <= from + span + step * 1e-6; k++) {
        double s = (double)k * step;
        if (s < from - step * 1e-6)
            continue;
        double x = SVG_LABEL_W + (s - from) / span * plot_w;
        char lab[SVG_LABEL_MAX];
        tick_label(lab, sizeof(lab), s, step);
        fprintf(out,
                "<line class=\"grid\" x1=\"%.1f\" y1=\"4\" x2=\"%.1f\" y2=\"%.1f\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                x, x, y, x, y + 14, lab);
    }
    fprintf(out,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">seconds since the run's "
            "start</text>\n",
            SVG_LABEL_W + plot_w / 2, y + 30);
}

struct svg_time {
    uint64_t lo, hi;
    double plot_w;
};

static double time_x(const struct svg_time *t, uint64_t us)
{
    uint64_t c = us < t->lo ? t->lo : us > t->hi ? t->hi : us;
    return SVG_LABEL_W + (double)(c - t->lo) / (double)(t->hi - t->lo) * t->plot_w;
}

static void timeline_span(FILE *out, const struct svg_time *t, const struct svg_span *s, double y)
{
    double x0 = time_x(t, s->from_us), x1 = time_x(t, s->to_us);
    fprintf(out,
            "<rect class=\"span %s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"12\" "
            "rx=\"2\"><title>",
            s->cls, x0, y - 6, x1 - x0 < 3 ? 3 : x1 - x0);
    html_text(out, s->tip);
    fputs("</title></rect>\n", out);
    if (s->end_class == NULL)
        return;
    fprintf(out, "<circle class=\"end %s\" cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\"><title>", s->end_class,
            x1, y);
    html_text(out, s->end_tip);
    fputs("</title></circle>\n", out);
}

void svg_timeline(FILE *out, const struct svg_span *spans, size_t n_spans,
                  const struct svg_mark *marks, size_t n_marks, const char *marks_lane,
                  uint64_t t0_us, uint64_t lo_us, uint64_t hi_us)
{
    const double top = 14, lane_h = 22, axis_h = 40;
    struct svg_time t = {lo_us, hi_us, SVG_WIDTH - SVG_LABEL_W - 30};
    /* a little room on both sides, and some width for a timeline of one instant */
    uint64_t pad = (t.hi - t.lo) / 20 + 50000;
    t.lo = t.lo > t0_us + pad ? t.lo - pad : t0_us < t.lo ? t0_us : t.lo;
    t.hi += pad;
    double axis_y = top + lane_h * (double)(n_spans + 1);
    svg_open(out, "timeline", axis_y + axis_h, "timeline");
    row_label(out, marks_lane, top + 4);
    for (size_t i = 0; i < n_marks; i++) {
        double x = time_x(&t, marks[i].at_us);
        fprintf(out, "<path class=\"mark %s\" d=\"M%.1f %.1fl6 6l-6 6l-6-6z\"><title>",
                marks[i].cls, x, top - 6);
        html_text(out, marks[i].tip);
        fputs("</title></path>\n", out);
    }
    for (size_t i = 0; i < n_spans; i++) {
        double y = top + lane_h * (double)(i + 1);
        row_label(out, spans[i].lane, y + 4);
        timeline_span(out, &t, &spans[i], y);
    }
    timeline_axis(out, axis_y, t0_us, t.lo, t.hi, t.plot_w);
    fputs("</svg>\n", out);
}
