/*
 * conf.c - the public entry points of the configuration parser, and the
 * top level of the file: globals, `listen` and `rule`.
 *
 * conf_parse_string runs pass 1 (tree.c) and then walks the top-level
 * directives through a table; `listen` blocks go to listen.c.  Rules may name
 * a listener defined further down, so `rule` blocks (rule_parse.c) are read
 * in a second walk, once every listener is known; conf_parse_rules runs only
 * that walk, against the listeners of a configuration already loaded.
 */
#include "rules/conf.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"
#include "rules/interp.h"
#include "rules/rule.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bytes read from a file at a time, growing the buffer by this much. */
#define CONF_READ_CHUNK (64u * 1024u)

const char *const conf_global_keywords[] = {
    "log-level", "connect-timeout", "shutdown-grace", "seed",          "threads",
    "journal",   "journal-flush",   "admin",          "admin-token",   "user",
    "instance",  "listen",          "rule",           "toxiproxy-api", "toxiproxy-config",
};
const size_t conf_n_global_keywords =
    sizeof(conf_global_keywords) / sizeof(conf_global_keywords[0]);

struct conf_global_directive {
    struct conf_dirspec spec;
    bool block; /* checks its own shape, may repeat */
    void (*fn)(struct conf_parser *p, const struct conf_node *n);
};

static void conf_global_log_level(struct conf_parser *p, const struct conf_node *n)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    int i = conf_value_enum(p, &n->words[1], "log level", names, sizeof(names) / sizeof(names[0]),
                            "expected error, warn, info or debug");

    if (i >= 0) {
        p->conf->log_level = (enum conf_log_level)i;
    }
}

static void conf_global_connect_timeout(struct conf_parser *p, const struct conf_node *n)
{
    conf_value_duration(p, &n->words[1], &p->conf->connect_timeout_ms);
}

static void conf_global_shutdown_grace(struct conf_parser *p, const struct conf_node *n)
{
    conf_value_duration(p, &n->words[1], &p->conf->grace_ms);
}

/* `threads N` or `threads auto` (one event loop per core, the default). */
static void conf_global_threads(struct conf_parser *p, const struct conf_node *n)
{
    conf_value_threads(p, &n->words[1], &p->conf->threads);
}

static const struct conf_global_directive conf_globals[] = {
    {{"log-level", 1, "error, warn, info or debug"}, false, conf_global_log_level},
    {{"connect-timeout", 1, "DURATION"}, false, conf_global_connect_timeout},
    {{"shutdown-grace", 1, "DURATION"}, false, conf_global_shutdown_grace},
    {{"seed", 1, "N"}, false, conf_global_seed},
    {{"threads", 1, "N or auto"}, false, conf_global_threads},
    {{"journal", -1, "PATH [new|append|overwrite]"}, false, conf_global_journal},
    {{"journal-flush", 1, "DURATION or every-record"}, false, conf_global_journal_flush},
    {{"admin", 1, "HOST:PORT"}, false, conf_global_admin},
    {{"admin-token", 1, "TOKEN"}, false, conf_global_admin_token},
    {{"user", 1, "NAME"}, false, conf_global_user},
    {{"instance", 1, "NAME"}, false, conf_global_instance},
    {{"toxiproxy-api", 1, "HOST:PORT"}, false, conf_global_toxiproxy_api},
    {{"toxiproxy-config", 1, "FILE"}, false, conf_global_toxiproxy_config},
    {{"listen", 1, "NAME"}, true, conf_listen_directive},
    /* Read after every listener (conf_interpret_rules): no function here. */
    {{"rule", 3, "NAME on LISTENER"}, true, NULL},
};
#define CONF_N_GLOBALS (sizeof(conf_globals) / sizeof(conf_globals[0]))

static const struct conf_global_directive *conf_find_global(const char *name)
{
    for (size_t i = 0; i < CONF_N_GLOBALS; i++) {
        if (strcmp(conf_globals[i].spec.name, name) == 0) {
            return &conf_globals[i];
        }
    }
    return NULL;
}

/* An unknown top-level directive; a keyword of listen or rule blocks gets a
 * hint saying where it belongs. */
static void conf_unknown_global(struct conf_parser *p, const struct conf_node *n)
{
    if (conf_is_rule_keyword(n->words[0].text)) {
        conf_unknown_directive(p, n, conf_global_keywords, conf_n_global_keywords,
                               conf_rule_keywords, conf_n_rule_keywords,
                               "'%s' belongs inside a rule block");
    } else {
        conf_unknown_directive(p, n, conf_global_keywords, conf_n_global_keywords,
                               conf_listen_keywords, conf_n_listen_keywords,
                               "'%s' belongs inside a listen block");
    }
}

/* Walk the top-level directives through the table, except rules. */
static void conf_interpret_globals(struct conf_parser *p, const struct conf_node *list)
{
    struct conf_loc first[CONF_N_GLOBALS] = {{0, 0}};

    for (const struct conf_node *n = list; n != NULL && !p->oom; n = n->next) {
        const struct conf_global_directive *d = conf_find_global(n->words[0].text);
        if (d == NULL) {
            conf_unknown_global(p, n);
        } else if (d->block) {
            if (d->fn != NULL) {
                d->fn(p, n);
            }
        } else if (conf_check_duplicate(p, n, &first[d - conf_globals]) &&
                   conf_check_shape(p, n, &d->spec)) {
            d->fn(p, n);
        }
    }
    if (!p->oom) {
        conf_listen_finish(p);
        conf_globals_finish(p, first[conf_find_global("admin-token") - conf_globals]);
        conf_journal_finish(p, first[conf_find_global("journal-flush") - conf_globals]);
    }
}

/* Walk the `rule` blocks, once every listener is known; with `only_rules`,
 * anything else is an error (conf_parse_rules). */
static void conf_interpret_rules(struct conf_parser *p, const struct conf_node *list,
                                 bool only_rules)
{
    for (const struct conf_node *n = list; n != NULL && !p->oom; n = n->next) {
        if (strcmp(n->words[0].text, "rule") == 0) {
            conf_rule_directive(p, n);
        } else if (only_rules) {
            conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc,
                          "listeners and globals are set in the configuration file",
                          "only rule blocks are allowed here");
        }
    }
    if (!p->oom) {
        rule_check_overlaps(p);
    }
}

/* Everything pass 2 does, in order. */
static void conf_interpret(struct conf_parser *p, const struct conf_node *list)
{
    conf_interpret_globals(p, list);
    if (p->oom) {
        return;
    }
    conf_interpret_rules(p, list, false);
    /* With the Toxiproxy API or its start-up file, listeners may all come from them. */
    if (p->n_listen == 0 && !p->conf->has_toxiproxy_api && p->conf->toxiproxy_config == NULL) {
        conf_diag_add(p->diags, CONF_ERROR, (struct conf_loc){1, 1},
                      "add one, e.g. listen redis { protocol resp; bind 127.0.0.1:6380; upstream "
                      "127.0.0.1:6379 }",
                      "no listener defined");
    }
}

static void conf_listener_free(struct conf_listener *l)
{
    free(l->name);
    free(l->profile);
    free(l->bind.host);
    free(l->upstream.host);
    free(l->tls.cert);
    free(l->tls.key);
    free(l->upstream_tls.ca);
    free(l->upstream_tls.sni);
    free(l->upstream_tls.cert);
    free(l->upstream_tls.key);
    free(l);
}

void conf_free(struct conf *conf)
{
    if (conf == NULL) {
        return;
    }
    while (conf->listeners != NULL) {
        struct conf_listener *next = conf->listeners->next;
        conf_listener_free(conf->listeners);
        conf->listeners = next;
    }
    rule_list_free(conf->rules);
    free(conf->journal);
    free(conf->admin.host);
    free(conf->admin_token);
    free(conf->toxiproxy_api.host);
    free(conf->toxiproxy_config);
    free(conf->user);
    free(conf->instance);
    free(conf->path);
    free(conf);
}

/* A configuration with every default set, or NULL when out of memory. */
static struct conf *conf_new(const char *path)
{
    struct conf *conf = conf_mem_calloc(1, sizeof(*conf));

    if (conf == NULL) {
        return NULL;
    }
    conf->path = conf_mem_strdup(path);
    if (conf->path == NULL) {
        free(conf);
        return NULL;
    }
    conf->log_level = CONF_LOG_INFO;
    conf->connect_timeout_ms = CONF_DEFAULT_CONNECT_TIMEOUT_MS;
    conf->grace_ms = CONF_DEFAULT_GRACE_MS;
    conf->journal_flush_ms = CONF_DEFAULT_JOURNAL_FLUSH_MS;
    return conf;
}

/* Make `name` the file name printed with diagnostics; false when out of memory. */
static bool conf_diags_set_file(struct conf_diags *diags, const char *name)
{
    char *copy = conf_mem_strdup(name);

    if (diags->tail == NULL) {
        conf_diags_init(diags);
    }
    if (copy == NULL) {
        conf_diag_oom(diags);
        return false;
    }
    free(diags->file);
    diags->file = copy;
    return true;
}

int conf_parse_string(const char *name, const char *text, size_t len, struct conf **out,
                      struct conf_diags *diags)
{
    unsigned errors_before = diags->errors;
    struct conf_parser p = {.diags = diags};
    struct conf_node *tree;

    *out = NULL;
    if (!conf_diags_set_file(diags, name)) {
        return -1;
    }
    if (conf_tree_parse(text != NULL ? text : "", text != NULL ? len : 0, diags, &tree) < 0) {
        return -1;
    }
    p.conf = conf_new(name);
    if (p.conf == NULL) {
        conf_tree_free(tree);
        conf_diag_oom(diags);
        return -1;
    }
    p.listeners_tail = &p.conf->listeners;
    p.base = p.conf;
    p.rules_tail = &p.rules;
    conf_interpret(&p, tree);
    conf_tree_free(tree);
    p.conf->rules = p.rules;
    p.conf->n_rules = p.n_rules;
    if (p.oom || diags->errors != errors_before) {
        conf_free(p.conf);
        return -1;
    }
    *out = p.conf;
    return 0;
}

int conf_parse_rules(const char *name, const char *text, size_t len, const struct conf *base,
                     struct rule **out, size_t *n_out, struct conf_diags *diags)
{
    unsigned errors_before = diags->errors;
    struct conf_parser p = {.diags = diags, .base = base};
    struct conf_node *tree;

    *out = NULL;
    *n_out = 0;
    if (!conf_diags_set_file(diags, name)) {
        return -1;
    }
    if (conf_tree_parse(text != NULL ? text : "", text != NULL ? len : 0, diags, &tree) < 0) {
        return -1;
    }
    p.rules_tail = &p.rules;
    conf_interpret_rules(&p, tree, true);
    conf_tree_free(tree);
    if (p.oom || diags->errors != errors_before) {
        rule_list_free(p.rules);
        return -1;
    }
    *out = p.rules;
    *n_out = p.n_rules;
    return 0;
}

/* Read all of `f` into a new buffer (*buf, owned by the caller) of *len
 * bytes.  Returns false after reporting why not. */
static bool conf_read_all(FILE *f, struct conf_diags *diags, char **buf, size_t *len)
{
    char *data = NULL;
    size_t used = 0, cap = 0;

    for (;;) {
        if (used == cap) {
            char *bigger = conf_mem_realloc(data, cap + CONF_READ_CHUNK);
            if (bigger == NULL) {
                free(data);
                conf_diag_oom(diags);
                return false;
            }
            data = bigger;
            cap += CONF_READ_CHUNK;
        }
        size_t got = fread(data + used, 1, cap - used, f);
        used += got;
        if (used > CONF_MAX_FILE_BYTES) {
            conf_diag_add(diags, CONF_ERROR, (struct conf_loc){0, 0}, NULL,
                          "file is too large (more than %u bytes)", CONF_MAX_FILE_BYTES);
            break;
        }
        if (got == 0 && ferror(f)) {
            conf_diag_add(diags, CONF_ERROR, (struct conf_loc){0, 0}, NULL, "cannot read: %s",
                          strerror(errno));
            break;
        }
        if (got == 0) {
            *buf = data;
            *len = used;
            return true;
        }
    }
    free(data);
    return false;
}

int conf_parse_stream(const char *name, FILE *f, struct conf **out, struct conf_diags *diags)
{
    char *text;
    size_t len;
    int rc;

    *out = NULL;
    if (!conf_diags_set_file(diags, name)) {
        return -1;
    }
    if (!conf_read_all(f, diags, &text, &len)) {
        return -1;
    }
    rc = conf_parse_string(name, text, len, out, diags);
    free(text);
    return rc;
}

int conf_cannot_open(const char *path, int err, struct conf_diags *diags)
{
    if (conf_diags_set_file(diags, path)) {
        conf_diag_add(diags, CONF_ERROR, (struct conf_loc){0, 0}, NULL, "cannot open: %s",
                      strerror(err));
    }
    return -1;
}

const char *conf_protocol_name(enum conf_protocol p)
{
    switch (p) {
    case CONF_PROTO_TCP:
        return "tcp";
    case CONF_PROTO_AMQP:
        return "amqp";
    case CONF_PROTO_RESP:
        return "resp";
    }
    return "unknown";
}

const char *const conf_journal_mode_names[CONF_JOURNAL_MODES] = {"new", "append", "overwrite"};

int conf_journal_mode_parse(const char *word, enum conf_journal_mode *mode)
{
    for (size_t i = 0; i < CONF_JOURNAL_MODES; i++) {
        if (strcmp(word, conf_journal_mode_names[i]) == 0) {
            *mode = (enum conf_journal_mode)i;
            return 0;
        }
    }
    return -1;
}

const char *conf_log_level_name(enum conf_log_level l)
{
    switch (l) {
    case CONF_LOG_ERROR:
        return "error";
    case CONF_LOG_WARN:
        return "warn";
    case CONF_LOG_INFO:
        return "info";
    case CONF_LOG_DEBUG:
        return "debug";
    }
    return "unknown";
}

const struct conf_listener *conf_find_listener(const struct conf *conf, const char *name)
{
    if (conf == NULL || name == NULL) {
        return NULL;
    }
    for (const struct conf_listener *l = conf->listeners; l != NULL; l = l->next) {
        if (l->name != NULL && strcmp(l->name, name) == 0) {
            return l;
        }
    }
    return NULL;
}
