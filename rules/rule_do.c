/*
 * rule_do.c - `do ACTION ARGS...`: what a rule does, and the values its
 * arguments take (durations, sizes, rates, error codes).
 *
 * Every action has the same shape: at most one required argument, then at
 * most one `NAME DURATION` option (latency's jitter, slice's delay, reset's,
 * redeliver's and duplicate's after).  One reader checks that shape against a table indexed by
 * action, so each action is a line of data, not a function.
 */
#include "rules/rule_parse.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"

#include <stdio.h>
#include <string.h>

/* The required argument of an action. */
enum rule_arg {
    RULE_ARG_NONE = 0,
    RULE_ARG_DURATION,
    RULE_ARG_SIZE,
    RULE_ARG_RATE,
    RULE_ARG_CLOSE,
    RULE_ARG_CODE,
};

struct rule_action_spec {
    enum rule_arg arg;
    const char *option; /* NULL, or the name of the optional `NAME DURATION` */
    const char *usage;
};

/* Indexed by enum rule_action_kind. */
static const struct rule_action_spec rule_action_specs[RULE_ACT_COUNT] = {
    [RULE_ACT_REDELIVER] = {RULE_ARG_NONE, "after", "do redeliver [after DURATION]"},
    [RULE_ACT_DUPLICATE] = {RULE_ARG_NONE, "after", "do duplicate [after DURATION]"},
    [RULE_ACT_EXPIRE] = {RULE_ARG_DURATION, NULL, "do expire DURATION"},
    [RULE_ACT_DELAY] = {RULE_ARG_DURATION, NULL, "do delay DURATION"},
    [RULE_ACT_DROP] = {RULE_ARG_NONE, NULL, "do drop"},
    [RULE_ACT_CLOSE] = {RULE_ARG_CLOSE, NULL, "do close before|after"},
    [RULE_ACT_ERROR] = {RULE_ARG_CODE, NULL, "do error CODE, e.g. do error 406"},
    [RULE_ACT_LATENCY] = {RULE_ARG_DURATION, "jitter", "do latency DURATION [jitter DURATION]"},
    [RULE_ACT_BANDWIDTH] = {RULE_ARG_RATE, NULL, "do bandwidth RATE, e.g. do bandwidth 100KB/s"},
    [RULE_ACT_SLICE] = {RULE_ARG_SIZE, "delay", "do slice SIZE [delay DURATION]"},
    [RULE_ACT_RESET] = {RULE_ARG_NONE, "after", "do reset [after DURATION]"},
    [RULE_ACT_BLACKHOLE] = {RULE_ARG_NONE, NULL, "do blackhole"},
    [RULE_ACT_SLOW_CLOSE] = {RULE_ARG_DURATION, NULL, "do slow-close DURATION"},
    [RULE_ACT_LIMIT] = {RULE_ARG_SIZE, NULL, "do limit SIZE, e.g. do limit 1MiB"},
};

const char *rule_action_usage(enum rule_action_kind k)
{
    return (unsigned)k < RULE_ACT_COUNT ? rule_action_specs[k].usage : "do ACTION";
}

/* Indexed by enum rule_arg: what a missing argument is, in "needs ...". */
static const char *const rule_arg_what[] = {
    "nothing", "a duration", "a size", "a rate", "before or after", "an error code",
};

static const char *const rule_action_names[RULE_ACT_COUNT] = {
#define RULE_ACTION_STR(name, code, str) [code] = str,
    RULE_ACTIONS(RULE_ACTION_STR)
#undef RULE_ACTION_STR
};

/* Units of sizes and rates. */
static const struct {
    const char *name;
    uint64_t scale;
} rule_byte_units[] = {
    {"B", 1},      {"KB", 1000},         {"MB", 1000 * 1000},         {"GB", 1000 * 1000 * 1000},
    {"KiB", 1024}, {"MiB", 1024 * 1024}, {"GiB", 1024 * 1024 * 1024},
};
#define RULE_N_BYTE_UNITS (sizeof(rule_byte_units) / sizeof(rule_byte_units[0]))
#define RULE_BYTE_UNITS_TEXT "B, KB, MB, GB, KiB, MiB or GiB"
#define RULE_RATE_SUFFIX "/s"
/* Longest unit text worth looking up ("KiB/s" and a little more). */
#define RULE_UNIT_MAX 8

bool rule_value_duration0(struct conf_parser *p, const struct conf_word *w, uint32_t *ms)
{
    size_t zeros = strspn(w->text, "0");
    const char *unit = w->text + zeros;

    if (zeros > 0 && (strcmp(unit, "ms") == 0 || strcmp(unit, "s") == 0 || strcmp(unit, "m") == 0 ||
                      strcmp(unit, "h") == 0)) {
        *ms = 0;
        return true;
    }
    return conf_value_duration(p, w, ms);
}

/* The bytes of `unit` (rates without their "/s"), or 0 when unknown. */
static uint64_t rule_unit_scale(const char *unit, bool rate)
{
    char buf[RULE_UNIT_MAX + 1];
    size_t len = strlen(unit), suffix = strlen(RULE_RATE_SUFFIX);

    if (len > RULE_UNIT_MAX) {
        return 0;
    }
    memcpy(buf, unit, len + 1);
    if (rate && len > suffix && strcmp(buf + len - suffix, RULE_RATE_SUFFIX) == 0) {
        buf[len - suffix] = '\0';
    }
    for (size_t i = 0; i < RULE_N_BYTE_UNITS; i++) {
        if (strcmp(buf, rule_byte_units[i].name) == 0) {
            return rule_byte_units[i].scale;
        }
    }
    return 0;
}

/* The bytes of the unit at `unit` of word w (a size, or a rate); 0 after an
 * error at the word. */
static uint64_t rule_bytes_unit(struct conf_parser *p, const struct conf_word *w, const char *unit,
                                bool rate)
{
    char shown[CONF_SHOW_BYTES], unit_shown[CONF_SHOW_BYTES];
    const char *what = rate ? "rate" : "size", *s = conf_show(w->text, shown);
    uint64_t scale;

    if (*unit == '\0') {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "%s '%s' needs a unit: %s", what, s,
                      RULE_BYTE_UNITS_TEXT);
        return 0;
    }
    scale = rule_unit_scale(unit, rate);
    if (scale == 0 && !rate && rule_unit_scale(unit, true) != 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "write it without '/s'", "size '%s' is a rate",
                      s);
    } else if (scale == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "use " RULE_BYTE_UNITS_TEXT,
                      "unknown unit '%s' in %s '%s'", conf_show(unit, unit_shown), what, s);
    }
    return scale;
}

/* A number and a unit of bytes: a size, or (rate) bytes per second with an
 * optional "/s".  false after an error at the word. */
bool rule_value_bytes(struct conf_parser *p, const struct conf_word *w, bool rate, uint64_t *out)
{
    char shown[CONF_SHOW_BYTES];
    const char *what = rate ? "rate" : "size", *s = conf_show(w->text, shown);
    const char *unit = w->text + strspn(w->text, "0123456789");
    uint64_t v = 0, scale;

    for (const char *d = w->text; d < unit; d++) {
        v = v > RULE_MAX_BYTES ? v : v * 10 + (uint64_t)(*d - '0'); /* saturates past the limit */
    }
    if (unit == w->text) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      rate ? "write a number and a unit, e.g. 100KB/s or 1MiB/s"
                           : "write a number and a unit, e.g. 64KB or 1MiB",
                      "invalid %s '%s'", what, s);
        return false;
    }
    scale = rule_bytes_unit(p, w, unit, rate);
    if (scale == 0) {
        return false;
    }
    if (v == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "%s '%s' must be greater than 0", what,
                      s);
        return false;
    }
    if (v > RULE_MAX_BYTES / scale) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "%s '%s' is too large (at most 1024GiB%s)", what, s, rate ? "/s" : "");
        return false;
    }
    *out = v * scale;
    return true;
}

/* `do error CODE`: 1 to RULE_ERROR_CODE_MAX of [A-Za-z0-9_.-], kept as written. */
static bool rule_value_error_code(struct conf_parser *p, const struct conf_word *w,
                                  struct rule_action *a)
{
    char shown[CONF_SHOW_BYTES];
    size_t len = strlen(w->text);
    bool ok = len >= 1 && len <= RULE_ERROR_CODE_MAX;

    for (size_t i = 0; ok && i < len; i++) {
        char c = w->text[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '.' || c == '-';
    }
    if (!ok) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "e.g. 406, 320, READONLY, LOADING or OOM",
                      "invalid error code '%s'", conf_show(w->text, shown));
        return false;
    }
    a->error_code = conf_parser_strdup(p, w->text);
    return a->error_code != NULL;
}

/* The required argument `w` of action a (spec `arg`). */
static void rule_do_required(struct conf_parser *p, enum rule_arg arg, const struct conf_word *w,
                             struct rule_action *a)
{
    static const char *const closes[] = {"before", "after"};
    int i;

    switch (arg) {
    case RULE_ARG_DURATION:
        conf_value_duration(p, w, &a->duration_ms);
        break;
    case RULE_ARG_SIZE:
    case RULE_ARG_RATE:
        rule_value_bytes(p, w, arg == RULE_ARG_RATE, &a->bytes);
        break;
    case RULE_ARG_CLOSE:
        i = conf_value_enum(p, w, "'close' argument", closes, 2, "expected before or after");
        a->close_when = i == 1 ? RULE_CLOSE_AFTER : RULE_CLOSE_BEFORE;
        break;
    case RULE_ARG_CODE:
        rule_value_error_code(p, w, a);
        break;
    case RULE_ARG_NONE:
        break;
    }
}

/* Where the option of action a stores its duration. */
static uint32_t *rule_option_slot(struct rule_action *a)
{
    switch (a->kind) {
    case RULE_ACT_LATENCY:
        return &a->jitter_ms;
    case RULE_ACT_SLICE:
        return &a->slice_delay_ms;
    default:
        return &a->duration_ms; /* `after` of reset, redeliver, duplicate */
    }
}

/* The option at args[0] (n of the remaining words); returns the words used. */
static size_t rule_do_option(struct conf_parser *p, const struct rule_action_spec *spec,
                             const struct conf_word *args, size_t n, struct rule_action *a)
{
    char what[CONF_SHOW_BYTES + 16], hint[CONF_HINT_BYTES];

    snprintf(what, sizeof(what), "'do %s' option", rule_action_name(a->kind));
    snprintf(hint, sizeof(hint), "usage: %s", spec->usage);
    if (conf_value_enum(p, &args[0], what, &spec->option, 1, hint) < 0) {
        return n; /* the rest is not worth reading */
    }
    if (n < 2) {
        conf_diag_add(p->diags, CONF_ERROR, args[0].loc, NULL, "'%s' needs a value: %s DURATION",
                      spec->option, spec->option);
        return 1;
    }
    rule_value_duration0(p, &args[1], rule_option_slot(a));
    return 2;
}

/* Latency with more jitter than latency would have to wait less than 0. */
static void rule_check_jitter(struct conf_parser *p, const struct conf_node *n,
                              const struct rule_action *a)
{
    char j[CONF_SHOW_BYTES], l[CONF_SHOW_BYTES];

    if (a->kind == RULE_ACT_LATENCY && n->n_words == 5 && a->jitter_ms > a->duration_ms &&
        a->duration_ms != 0) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[4].loc, "the delay would go below zero",
                      "jitter %s is more than the latency %s", conf_show(n->words[4].text, j),
                      conf_show(n->words[2].text, l));
    }
}

/* Read the arguments of the action named by words[1] (already known). */
static void rule_do_args(struct conf_parser *p, const struct conf_node *n, struct rule_action *a)
{
    const struct rule_action_spec *spec = &rule_action_specs[a->kind];
    const struct conf_word *args = &n->words[2];
    size_t n_args = n->n_words - 2, used = 0;
    const char *name = rule_action_name(a->kind);
    char usage[CONF_HINT_BYTES];

    snprintf(usage, sizeof(usage), "usage: %s", spec->usage);
    if (spec->arg != RULE_ARG_NONE) {
        if (n_args == 0) {
            conf_diag_add(p->diags, CONF_ERROR, a->loc, usage, "'do %s' needs %s", name,
                          rule_arg_what[spec->arg]);
            return;
        }
        rule_do_required(p, spec->arg, &args[used++], a);
    }
    if (spec->option != NULL && used < n_args) {
        used += rule_do_option(p, spec, args + used, n_args - used, a);
    }
    if (used < n_args) {
        conf_diag_add(p->diags, CONF_ERROR, args[used].loc, usage, "too many arguments for 'do %s'",
                      name);
        return;
    }
    rule_check_jitter(p, n, a);
}

void rule_do_directive(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    char list[RULE_LIST_BYTES], hint[RULE_LIST_BYTES + 32];
    int i;

    snprintf(hint, sizeof(hint), "expected one of: %s",
             rule_join_names(rule_action_names, RULE_ACT_COUNT, list));
    if (n->n_words < 2) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, hint,
                      "'do' needs an action: do ACTION [ARGS...]");
        return;
    }
    i = conf_value_enum(p, &n->words[1], "action", rule_action_names, RULE_ACT_COUNT, hint);
    if (i < 0) {
        return;
    }
    rs->r->action.kind = (enum rule_action_kind)i;
    rs->r->action.loc = n->words[1].loc;
    rs->action_known = true;
    rule_do_args(p, n, &rs->r->action);
}
