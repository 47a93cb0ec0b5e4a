/*
 * values.c - typed arguments of directives: durations, counts, enumerations,
 * and names.
 *
 * Each checker reports its own error, located at the argument, and leaves
 * its output untouched on failure.  Addresses are in addr.c.
 */
#include "rules/diag.h"
#include "rules/interp.h"

#include <stdio.h>
#include <string.h>

/* Parse the leading decimal digits of s, saturating at `cap` + 1; *end is
 * set past them.  Returns false when there are none. */
static bool conf_parse_digits(const char *s, uint64_t cap, uint64_t *value, const char **end)
{
    uint64_t v = 0;
    const char *q = s;

    while (*q >= '0' && *q <= '9') {
        v = v * 10 + (uint64_t)(*q - '0');
        if (v > cap) {
            v = cap + 1;
        }
        q++;
    }
    *value = v;
    *end = q;
    return q != s;
}

/* Milliseconds per unit, or 0 for an unknown unit. */
static uint64_t conf_unit_ms(const char *unit)
{
    static const struct {
        const char *name;
        uint64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60 * 1000}, {"h", 60 * 60 * 1000}};

    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].name) == 0) {
            return units[i].ms;
        }
    }
    return 0;
}

bool conf_value_duration(struct conf_parser *p, const struct conf_word *w, uint32_t *ms)
{
    char shown[CONF_SHOW_BYTES], unit_shown[CONF_SHOW_BYTES];
    const char *s = conf_show(w->text, shown), *unit;
    uint64_t value, scale, total;

    if (!conf_parse_digits(w->text, CONF_MAX_DURATION_MS, &value, &unit)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "write a number and a unit, e.g. 250ms, 45s, 2m", "invalid duration '%s'", s);
        return false;
    }
    if (*unit == '\0') {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "duration '%s' needs a unit: ms, s, m or h", s);
        return false;
    }
    scale = conf_unit_ms(unit);
    if (scale == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "use ms, s, m or h",
                      "unknown unit '%s' in duration '%s'", conf_show(unit, unit_shown), s);
        return false;
    }
    total = value * scale; /* value <= 24h + 1 in ms, scale <= 1h: no overflow */
    if (total == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "duration '%s' must be greater than 0",
                      s);
        return false;
    }
    if (total > CONF_MAX_DURATION_MS) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "duration '%s' is too large (at most 24h)", s);
        return false;
    }
    *ms = (uint32_t)total;
    return true;
}

bool conf_value_max_connections(struct conf_parser *p, const struct conf_word *w, uint32_t *n)
{
    char shown[CONF_SHOW_BYTES];
    uint64_t value;
    const char *end;

    if (!conf_parse_digits(w->text, CONF_MAX_CONNECTIONS, &value, &end) || *end != '\0' ||
        value == 0 || value > CONF_MAX_CONNECTIONS) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "invalid max-connections '%s' (1-%u)",
                      conf_show(w->text, shown), CONF_MAX_CONNECTIONS);
        return false;
    }
    *n = (uint32_t)value;
    return true;
}

bool conf_value_threads(struct conf_parser *p, const struct conf_word *w, unsigned *n)
{
    char shown[CONF_SHOW_BYTES];
    uint64_t value;
    const char *end;

    if (strcmp(w->text, "auto") == 0) {
        *n = 0;
        return true;
    }
    if (!conf_parse_digits(w->text, CONF_MAX_THREADS, &value, &end) || *end != '\0' || value == 0 ||
        value > CONF_MAX_THREADS) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "a number from 1 to 64, or auto (one per core)",
                      "invalid threads '%s'", conf_show(w->text, shown));
        return false;
    }
    *n = (unsigned)value;
    return true;
}

int conf_value_enum(struct conf_parser *p, const struct conf_word *w, const char *what,
                    const char *const *names, size_t n, const char *expected)
{
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];

    for (size_t i = 0; i < n; i++) {
        if (strcmp(w->text, names[i]) == 0) {
            return (int)i;
        }
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  conf_hint_suggest(w->text, names, n, hint, expected), "unknown %s '%s'", what,
                  conf_show(w->text, shown));
    return -1;
}

bool conf_is_name_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

bool conf_value_name(struct conf_parser *p, const struct conf_word *w, const char *what)
{
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];
    size_t len = strlen(w->text);
    bool ok = len >= 1 && len <= CONF_NAME_MAX;

    for (size_t i = 0; ok && i < len; i++) {
        ok = conf_is_name_byte(w->text[i]);
    }
    if (!ok) {
        snprintf(hint, sizeof(hint), "use 1 to %d letters, digits, '_', '.' or '-'", CONF_NAME_MAX);
        conf_diag_add(p->diags, CONF_ERROR, w->loc, hint, "invalid %s name '%s'", what,
                      conf_show(w->text, shown));
    }
    return ok;
}
