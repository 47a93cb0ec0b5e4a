/*
 * fuzz_conf.c - libFuzzer harness for the configuration and rule language (rules/): the
 * whole-file parser conf_parse_string(), the PUT /rules body parser conf_parse_rules() against
 * a fixed base configuration, and the engine built from what they accept.  Not part of the
 * default build (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. -IGEN tests/fuzz/fuzz_conf.c rules/ *.c \
 *         proto/ *.c GEN/proto/journal/journal.pb-c.c -ljansson -lprotobuf-c -o fuzz_conf
 *
 * (GEN holds protoc-c's output for proto/journal/journal.proto.)  Seeds are configuration files
 * (tests/fuzz/corpus/conf/: rules/examples/ and the examples of the README and docs/).  The input is the text,
 * copied into a buffer of exactly its size and not NUL-terminated, as the admin API hands a
 * request body over.  Each input is parsed three ways: as a file, as a PUT /rules body, and as
 * a file again with one allocation made to fail (which one follows from the input).
 *
 * Invariants are checked with abort(): the result agrees with the error count; diagnostics are
 * counted right, sorted by position, inside the text and print one line each; an accepted
 * configuration is consistent (counts, listener look-ups, every rule on a known listener, values
 * in range) and its ruleset decides only rules of the listener and event asked about; a failed
 * allocation gives -1 with an error and leaks nothing; a parse is deterministic.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules/conf.h"
#include "rules/conf_mem.h"
#include "rules/engine.h"
#include "rules/rule.h"

/* The listeners PUT /rules bodies are checked against: every protocol and profile, under the
 * names the examples, the README and docs/ use. */
static const char fz_base_text[] = "listen t {\n protocol tcp\n bind 127.0.0.1:1\n"
                                   " upstream 127.0.0.1:2\n}\n"
                                   "listen rabbitmq {\n protocol amqp\n bind 127.0.0.1:3\n"
                                   " upstream 127.0.0.1:4\n}\n"
                                   "listen redis {\n protocol resp\n profile celery\n"
                                   " bind 127.0.0.1:5\n upstream 127.0.0.1:6\n}\n"
                                   "listen r {\n protocol resp\n bind 127.0.0.1:7\n"
                                   " upstream 127.0.0.1:8\n}\n"
                                   "listen sidekiq {\n protocol resp\n profile sidekiq\n"
                                   " bind 127.0.0.1:9\n upstream 127.0.0.1:10\n}\n"
                                   "listen rq {\n protocol resp\n profile rq\n"
                                   " bind 127.0.0.1:11\n upstream 127.0.0.1:12\n}\n"
                                   "listen streams {\n protocol resp\n profile streams\n"
                                   " bind 127.0.0.1:13\n upstream 127.0.0.1:14\n}\n";

/* Allocations the out-of-memory pass picks from; a parse of a seed makes a few hundred. */
#define FZ_OOM_SPAN 512u

static struct conf *fz_base;

/* Failed invariants name themselves: the reproducer's log says which one. */
#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

static const char *fz_header(const void *ctx, const char *name)
{
    (void)ctx;
    return strcmp(name, "x-retries") == 0 ? "3" : NULL;
}

/* Events of every kind, with every field a matcher may look at set. */
static void fz_events(struct engine_event ev[RULE_EV_COUNT])
{
    static const uint8_t body[] = "{\"refund due\": 1}";
    for (int e = 0; e < RULE_EV_COUNT; e++) {
        ev[e] = (struct engine_event){
            .event = (enum rule_event)e,
            .queue = "celery",
            .exchange = "",
            .routing_key = "celery",
            .consumer_tag = "ctag-1",
            .message_id = "8f1c-42",
            .task = "tasks.charge",
            .command = "LPUSH",
            .key = "queue:default",
            .body = body,
            .body_len = sizeof(body) - 1,
            .redelivered = e % 2 == 0,
            .has_client = true,
            .client = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3},
            .header = fz_header,
            .identity = "8f1c-42",
        };
    }
}

/* Listeners a ruleset is asked about: the first few distinct ones its rules name. */
#define FZ_LISTENERS 4

/* Runs every event through the ruleset on the listeners its rules name, at two times (for
 * `between`); the hits are rules of that listener and event, ascending. */
static void fz_decide(const struct rule *rules, uint64_t seed)
{
    struct ruleset *rs = ruleset_new(rules, seed, 0);
    if (rs == NULL)
        return;
    const char *names[FZ_LISTENERS];
    size_t n_names = 0, count = ruleset_count(rs);
    for (size_t i = 0; i < count && n_names < FZ_LISTENERS; i++) {
        const struct rule *r = ruleset_rule(rs, i);
        CHECK(ruleset_find(rs, r->name) >= 0);
        size_t k = 0;
        while (k < n_names && strcmp(names[k], r->listener) != 0)
            k++;
        if (k == n_names)
            names[n_names++] = r->listener;
    }
    struct engine_event ev[RULE_EV_COUNT];
    fz_events(ev);
    for (size_t k = 0; k < n_names; k++) {
        for (int e = 0; e < RULE_EV_COUNT; e++) {
            for (uint64_t now = 0; now < 2; now++) {
                size_t hits[8];
                size_t n = ruleset_decide(rs, names[k], &ev[e], now * 3600000, hits, 8);
                CHECK(n <= 8);
                for (size_t j = 0; j < n; j++) {
                    CHECK(hits[j] < count && (j == 0 || hits[j] > hits[j - 1]));
                    const struct rule *h = ruleset_rule(rs, hits[j]);
                    CHECK(h->event == (enum rule_event)e && strcmp(h->listener, names[k]) == 0);
                }
            }
        }
    }
    ruleset_put(rs);
}

static void check_rule(const struct rule *r, const struct conf *c)
{
    CHECK(r->name != NULL && r->listener != NULL);
    CHECK(c == NULL || conf_find_listener(c, r->listener) != NULL);
    CHECK(r->event < RULE_EV_COUNT && r->action.kind < RULE_ACT_COUNT);
    CHECK(rule_event_name(r->event) != NULL && rule_action_name(r->action.kind) != NULL);
    CHECK(r->direction >= RULE_DIR_UPSTREAM && r->direction <= RULE_DIR_BOTH);
    CHECK(!r->trigger.has_probability ||
          (r->trigger.probability > 0 && r->trigger.probability <= 1));
    CHECK(r->n_matchers == 0 || r->matchers != NULL);
    for (size_t i = 0; i < r->n_matchers; i++) {
        const struct rule_matcher *m = &r->matchers[i];
        CHECK(m->field < RULE_F_COUNT && rule_field_name(m->field) != NULL);
        CHECK(m->value != NULL && m->cidr_prefix <= 128);
        CHECK((m->field == RULE_F_HEADER) == (m->header != NULL));
    }
}

static size_t check_rules(const struct rule *r, const struct conf *c)
{
    size_t n = 0;
    for (; r != NULL; r = r->next, n++)
        check_rule(r, c);
    return n;
}

static void check_conf(const struct conf *c)
{
    size_t n = 0;
    char small[8], big[300];
    for (const struct conf_listener *l = c->listeners; l != NULL; l = l->next, n++) {
        CHECK(l->name != NULL && conf_find_listener(c, l->name) == l);
        CHECK(l->bind.host != NULL && l->bind.port > 0);
        CHECK(l->upstream.host != NULL && l->upstream.port > 0);
        CHECK(l->profile == NULL || l->protocol == CONF_PROTO_RESP);
        CHECK(conf_protocol_name(l->protocol) != NULL);
        conf_addr_format(&l->bind, small, sizeof(small));
        conf_addr_format(&l->upstream, big, sizeof(big));
        CHECK(memchr(small, '\0', sizeof(small)) != NULL);
    }
    CHECK(n == c->n_listeners);
    CHECK(check_rules(c->rules, c) == c->n_rules);
    CHECK(conf_log_level_name(c->log_level) != NULL);
}

/* Lines of the text, for the diagnostics' positions. */
static unsigned text_lines(const char *text, size_t len)
{
    unsigned n = 1;
    for (size_t i = 0; i < len; i++)
        n += text[i] == '\n';
    return n;
}

/* The list is consistent, in file order, inside the text (unless an allocation failed: "out of
 * memory" has no position), and prints one line per diagnostic. */
static void check_diags(const struct conf_diags *d, unsigned lines, bool oom)
{
    unsigned errors = 0, warnings = 0;
    const struct conf_diag *prev = NULL;
    for (const struct conf_diag *g = d->head; g != NULL; prev = g, g = g->next) {
        CHECK(g->msg != NULL);
        errors += g->severity == CONF_ERROR;
        warnings += g->severity == CONF_WARNING;
        CHECK(g->loc.line <= lines);
        CHECK(oom || (g->loc.line >= 1 && g->loc.col >= 1));
        CHECK(prev == NULL || prev->loc.line < g->loc.line ||
              (prev->loc.line == g->loc.line && prev->loc.col <= g->loc.col));
    }
    CHECK(errors == d->errors && warnings == d->warnings);
    CHECK(d->head == NULL || d->tail == &prev->next);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return;
    conf_diags_print(d, f);
    fclose(f);
    size_t newlines = 0;
    for (size_t i = 0; i < len; i++)
        newlines += buf[i] == '\n';
    CHECK(newlines == errors + warnings);
    free(buf);
}

/* Parses the text as a file; returns rc, leaving the counts in *d for the caller to compare. */
static int fz_parse_file(const char *text, size_t len, struct conf_diags *d, bool oom)
{
    struct conf *c = (struct conf *)d; /* must be overwritten */
    conf_diags_init(d);
    int rc = conf_parse_string("fuzz.conf", text, len, &c, d);
    CHECK(rc == 0 || rc == -1);
    CHECK((rc == 0) == (c != NULL) && (rc == 0) == (d->errors == 0));
    /* The file name is the parser's first allocation: without it, only "out of memory". */
    CHECK(d->file != NULL ? strcmp(d->file, "fuzz.conf") == 0 : oom);
    check_diags(d, text_lines(text, len), oom);
    if (c != NULL) {
        CHECK(strcmp(c->path, "fuzz.conf") == 0);
        check_conf(c);
        if (!oom)
            fz_decide(c->rules, c->seed);
    }
    conf_free(c);
    return rc;
}

static void fz_parse_rules(const char *text, size_t len)
{
    struct conf_diags d;
    struct rule *rules = (struct rule *)&d; /* must be overwritten */
    size_t n = 99;
    conf_diags_init(&d);
    int rc = conf_parse_rules("PUT /rules", text, len, fz_base, &rules, &n, &d);
    CHECK(rc == 0 || rc == -1);
    CHECK((rc == 0) == (d.errors == 0));
    CHECK(rc == 0 || (rules == NULL && n == 0));
    check_diags(&d, text_lines(text, len), false);
    if (rc == 0) {
        CHECK(check_rules(rules, fz_base) == n && (n == 0) == (rules == NULL));
        fz_decide(rules, 42);
    }
    rule_list_free(rules);
    conf_diags_free(&d);
    CHECK(fz_base->n_rules == 0);
}

static uint32_t fz_hash(const uint8_t *p, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct conf_diags d;
    conf_diags_init(&d);
    if (conf_parse_string("base.conf", fz_base_text, strlen(fz_base_text), &fz_base, &d) != 0) {
        conf_diags_print(&d, stderr);
        abort();
    }
    conf_diags_free(&d);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Not NUL-terminated, no slack after it: a read past `size` is caught. */
    char *text = malloc(size == 0 ? 1 : size);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    struct conf_diags d, again;
    int rc = fz_parse_file(text, size, &d, false);
    fz_parse_rules(text, size);

    conf_mem_fail_nth((long)(fz_hash(data, size) % FZ_OOM_SPAN));
    int rc2 = fz_parse_file(text, size, &again, true);
    bool fired = conf_mem_fault_fired();
    conf_mem_fail_nth(-1);
    if (fired)
        CHECK(rc2 == -1 && again.errors >= 1);
    else
        CHECK(rc2 == rc && again.errors == d.errors && again.warnings == d.warnings);
    conf_diags_free(&again);
    conf_diags_free(&d);
    free(text);
    return 0;
}
