/*
 * svg.h - the charts of the `--html` pages, drawn as inline SVG: no script, no library.
 *
 * Three shapes, each a function that writes one <svg> element: small multiples (one row of
 * bins per series, over a shared x axis: faults per rule over time, copy delays per task),
 * stacked horizontal bars (deliveries per task by how the verdict counted them), and a
 * timeline (one message's deliveries as spans, with the faults on it, on one time axis).
 * Every label is written with html_text(); every drawn bin, bar part, span and mark is an
 * element of its own with a class (the tests count them) and a <title> (the browser's tooltip,
 * no script needed).
 */
#ifndef TWICE_SVG_H
#define TWICE_SVG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parts of one stacked bar at most. */
#define SVG_PARTS_MAX 6
/* Room for one bin edge's label ("1.5min"). */
#define SVG_LABEL_MAX 16
/* Width of a chart's viewBox, and of its label column. */
#define SVG_WIDTH 960
#define SVG_LABEL_W 230

/* One series of a small-multiples chart: its label and one count per bin. */
struct svg_row {
    const char *label;
    const uint64_t *bins;
};

/* The shared x axis: n_bins bins with n_bins + 1 edge labels, a tick every tick_every edges;
 * unit names what a bin holds ("faults"), for the tooltips. */
struct svg_axis {
    size_t n_bins;
    const char (*edges)[SVG_LABEL_MAX];
    size_t tick_every;
    const char *title, *unit;
};

/* One row of bars per series, each scaled to its own largest bin (said at the row's end);
 * bins with a count are <rect class="cls">. */
void svg_small_multiples(FILE *out, const char *cls, const struct svg_row *rows, size_t n_rows,
                         const struct svg_axis *x);

/* One bar of a stacked bar chart. */
struct svg_stack {
    const char *label;
    uint64_t parts[SVG_PARTS_MAX];
};

/* Horizontal bars on one scale, each part a <rect class="bar sK"> (K its index, 0..5), the
 * bar's total at its end. */
void svg_stacked_bars(FILE *out, const struct svg_stack *bars, size_t n,
                      const char *const *part_names, size_t n_parts);

/* A span of a timeline: from..to (to == from: a point), a class for its colour, a lane label
 * and a tooltip; end_class marks how it ended ("m-ack", "m-closed", ... or NULL: no mark). */
struct svg_span {
    uint64_t from_us, to_us;
    const char *cls, *end_class, *lane, *tip, *end_tip;
};

/* A point on a timeline's first lane (faults). */
struct svg_mark {
    uint64_t at_us;
    const char *cls, *tip;
};

/* One lane per span under a lane of marks, on an axis in seconds since t0_us (the run's
 * start), spanning [lo_us, hi_us] (widened a little when empty). */
void svg_timeline(FILE *out, const struct svg_span *spans, size_t n_spans,
                  const struct svg_mark *marks, size_t n_marks, const char *marks_lane,
                  uint64_t t0_us, uint64_t lo_us, uint64_t hi_us);

/* A step of 1, 2 or 5 times a power of ten, at least range / max_ticks (range > 0). */
double svg_nice_step(double range, unsigned max_ticks);

/* svg_nice_step() of a span in seconds, in whole minutes or hours when the step is that long
 * (what svg_format_seconds() then prints round). */
double svg_nice_seconds(double span, unsigned max_ticks);

/* A duration as an axis says it: "0s", "250ms", "12s", "1.5min", "2h". */
void svg_format_seconds(char *buf, size_t cap, double seconds);

#endif
