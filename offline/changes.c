/*
 * changes.c - the changes of the rules in force during a run.  See changes.h.
 */
#include "offline/changes.h"

#include <stdlib.h>
#include <string.h>

#include "offline/json_out.h"

/* Record.Change codes: words for people, names for JSON. */
static const struct {
    const char *text, *json;
} change_names[CHANGES_CODES] = {
    {"change", "other"},
    {"rule enabled", "rule_enabled"},
    {"rule disabled", "rule_disabled"},
    {"faults off", "faults_off"},
    {"faults on", "faults_on"},
    {"rules replaced", "rules_replaced"},
    {"rule replaced", "rule_replaced"},
    {"rule added", "rule_added"},
    {"rule deleted", "rule_deleted"},
    {"reloaded", "reloaded"},
};

const char *changes_code_text(uint32_t code)
{
    return code < CHANGES_CODES ? change_names[code].text : change_names[0].text;
}

const char *changes_code_json(uint32_t code)
{
    return code < CHANGES_CODES ? change_names[code].json : change_names[0].json;
}

static const char *source_json(uint32_t source)
{
    return source == TWICE__JOURNAL__RECORD__CHANGE_SOURCE__ADMIN_API ? "admin_api"
           : source == TWICE__JOURNAL__RECORD__CHANGE_SOURCE__SIGNAL  ? "signal"
                                                                      : "other";
}

/* The kill switch was on from off_since_us to t. */
static void close_off(struct changes *c, uint64_t t)
{
    if (c->off && t > c->off_since_us)
        c->faults_off_us += t - c->off_since_us;
    c->off = false;
}

void changes_add_header(struct changes *c, const Twice__Journal__Header *h)
{
    close_off(c, c->last_us); /* the run before ended: its process, and its switch, with it */
    c->runs++;
    c->run_start_us = h->start_unix_ms * 1000u;
}

static char *copy(const char *s)
{
    return strdup(s != NULL ? s : "");
}

/* Keeps r as a change.  -1 when out of memory. */
static int keep(struct changes *c, const Twice__Journal__Record *r)
{
    if (c->n == c->cap) {
        size_t cap = c->cap != 0 ? c->cap * 2 : 16;
        struct change *list = realloc(c->list, cap * sizeof(*list));
        if (list == NULL)
            return -1;
        c->list = list;
        c->cap = cap;
    }
    struct change *x = &c->list[c->n];
    memset(x, 0, sizeof(*x));
    x->rule = copy(r->rule);
    x->client = copy(r->client);
    x->detail = copy(r->detail);
    if (x->rule == NULL || x->client == NULL || x->detail == NULL) {
        free(x->rule);
        free(x->client);
        free(x->detail);
        return -1;
    }
    c->n++;
    x->twice_run = c->runs;
    x->time_us = r->time_unix_us;
    x->offset_us = r->time_unix_us > c->run_start_us ? r->time_unix_us - c->run_start_us : 0;
    x->code = (uint32_t)r->change;
    x->source = (uint32_t)r->change_source;
    for (size_t i = 0; i < r->rules_sha256.len && i < 32; i++)
        sprintf(x->sha256 + 2 * i, "%02x", r->rules_sha256.data[i]);
    x->rules = r->rules;
    x->rules_disabled = r->rules_disabled;
    x->faults_off = r->faults_off;
    return 0;
}

int changes_add_record(struct changes *c, const Twice__Journal__Record *r)
{
    if (r->time_unix_us > c->last_us)
        c->last_us = r->time_unix_us;
    if (r->kind != TWICE__JOURNAL__RECORD__KIND__RULES)
        return 0;
    c->count++;
    c->by_code[(uint32_t)r->change < CHANGES_CODES ? (uint32_t)r->change : 0]++;
    if (r->faults_off && !c->off) {
        c->off = true;
        c->off_since_us = r->time_unix_us;
    } else if (!r->faults_off) {
        close_off(c, r->time_unix_us);
    }
    return c->n < CHANGES_KEPT ? keep(c, r) : 0;
}

void changes_finish(struct changes *c)
{
    close_off(c, c->last_us);
}

void changes_free(struct changes *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->list[i].rule);
        free(c->list[i].client);
        free(c->list[i].detail);
    }
    free(c->list);
    memset(c, 0, sizeof(*c));
}

/* ---- output ------------------------------------------------------------------------------- */

/* "+1.234s", or "2 +1.234s" with the run. */
static void format_at(char *buf, size_t len, const struct change *x, bool several_runs)
{
    if (several_runs)
        snprintf(buf, len, "%u %+.3fs", (unsigned)x->twice_run, (double)x->offset_us / 1e6);
    else
        snprintf(buf, len, "%+.3fs", (double)x->offset_us / 1e6);
}

/* Who made the change, into buf: the admin client's address, or the signal. */
static void format_by(char *buf, size_t len, const struct change *x)
{
    if (x->source == TWICE__JOURNAL__RECORD__CHANGE_SOURCE__SIGNAL)
        snprintf(buf, len, "%s", x->detail[0] != '\0' ? x->detail : "signal");
    else
        snprintf(buf, len, "admin %s", x->client[0] != '\0' ? x->client : "?");
}

void changes_print_text(FILE *out, const struct changes *c, bool several_runs)
{
    fputs("\nRule changes", out);
    if (c->count == 0) {
        fputs("\n  (none: the rules of the start held for the whole run)\n", out);
        return;
    }
    fprintf(out,
            " (%llu; AT: since the start of its run; RULES, FAULTS and SHA-256: the rules in "
            "force after it)\n  %*s  %-14s  %-20s  %-26s  %-10s  %-6s  %s\n",
            (unsigned long long)c->count, several_runs ? 12 : 10, several_runs ? "RUN AT" : "AT",
            "CHANGE", "RULE", "BY", "RULES", "FAULTS", "SHA-256");
    for (size_t i = 0; i < c->n; i++) {
        const struct change *x = &c->list[i];
        char at[40], rules[32];
        format_at(at, sizeof(at), x, several_runs);
        snprintf(rules, sizeof(rules), x->rules_disabled ? "%u (%u off)" : "%u", (unsigned)x->rules,
                 (unsigned)x->rules_disabled);
        fprintf(out, "  %*s  %-14s  ", several_runs ? 12 : 10, at, changes_code_text(x->code));
        int n = text_write_safe(out, x->rule[0] != '\0' ? x->rule : "-");
        fprintf(out, "%*s  ", n < 20 ? 20 - n : 0, "");
        char by[128];
        format_by(by, sizeof(by), x);
        n = text_write_safe(out, by);
        fprintf(out, "%*s  %-10s  %-6s  %s\n", n < 26 ? 26 - n : 0, "", rules,
                x->faults_off ? "off" : "on", x->sha256[0] != '\0' ? x->sha256 : "-");
    }
    if (c->count > c->n)
        fprintf(out, "  ... and %llu more\n", (unsigned long long)(c->count - c->n));
}

static void print_change_json(FILE *out, const struct change *x)
{
    fprintf(out,
            "{\"twice_run\": %u, \"time_unix_us\": %llu, \"offset_us\": %llu, \"change\": \"%s\", "
            "\"rule\": ",
            (unsigned)x->twice_run, (unsigned long long)x->time_us,
            (unsigned long long)x->offset_us, changes_code_json(x->code));
    json_write_string(out, x->rule);
    fprintf(out, ", \"source\": \"%s\", \"client\": ", source_json(x->source));
    json_write_string(out, x->client);
    fputs(", \"detail\": ", out);
    json_write_string(out, x->detail);
    fprintf(out,
            ", \"rules_sha256\": \"%s\", \"rules\": %u, \"rules_disabled\": %u, \"faults_off\": "
            "%s}",
            x->sha256, (unsigned)x->rules, (unsigned)x->rules_disabled,
            x->faults_off ? "true" : "false");
}

void changes_print_json_list(FILE *out, const struct changes *c, const char *indent)
{
    fputc('[', out);
    for (size_t i = 0; i < c->n; i++) {
        fprintf(out, "%s%s  ", i > 0 ? "," : "", indent);
        print_change_json(out, &c->list[i]);
    }
    fprintf(out, "%s]", c->n > 0 ? indent : "");
}

/* "2 rule disabled, 1 faults off" in code order. */
static void print_by_code_text(FILE *out, const struct changes *c)
{
    const char *sep = "";
    for (uint32_t k = 1; k <= CHANGES_CODES; k++) {
        uint32_t code = k % CHANGES_CODES; /* the unknown ones last */
        if (c->by_code[code] == 0)
            continue;
        fprintf(out, "%s%llu %s", sep, (unsigned long long)c->by_code[code],
                changes_code_text(code));
        sep = ", ";
    }
}

void changes_print_summary(FILE *out, const struct changes *c)
{
    if (c->count == 0)
        return;
    fprintf(out, "rules changed %llu time%s during the run (", (unsigned long long)c->count,
            c->count == 1 ? "" : "s");
    print_by_code_text(out, c);
    fputc(')', out);
    if (c->faults_off_us > 0)
        fprintf(out, "; faults were off for %.3fs of it", (double)c->faults_off_us / 1e6);
    fputs(": read the result against the rules in force (twice report lists each change)\n", out);
}

void changes_print_json(FILE *out, const struct changes *c)
{
    fprintf(out, "{\"count\": %llu, \"by_change\": {", (unsigned long long)c->count);
    const char *sep = "";
    for (uint32_t code = 0; code < CHANGES_CODES; code++) {
        if (c->by_code[code] == 0)
            continue;
        fprintf(out, "%s\"%s\": %llu", sep, changes_code_json(code),
                (unsigned long long)c->by_code[code]);
        sep = ", ";
    }
    fprintf(out, "}, \"faults_off_us\": %llu, \"list\": ", (unsigned long long)c->faults_off_us);
    changes_print_json_list(out, c, "\n    ");
    fputc('}', out);
}
