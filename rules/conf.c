/*
 * conf.c - the public entry points of the configuration parser, and the
 * top level of the file: globals, `listen` and `rule`.
 *
 * conf_parse_string runs pass 1 (tree.c) and then walks the top-level
 * directives through a table; `listen` blocks go to listen.c.  Anything that
 * refers forward (a rule naming a listener defined further down, the global
 * connect-timeout inherited by listeners) is settled after the walk.
 */
#include "rules/conf.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"
#include "rules/interp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bytes read from a file at a time, growing the buffer by this much. */
#define CONF_READ_CHUNK (64u * 1024u)

const char *const conf_global_keywords[] = {
    "log-level", "connect-timeout", "shutdown-grace", "listen", "rule",
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

/* `rule NAME on LISTENER { ... }`: the rule engine does not exist yet, so
 * only the shape is checked (the listener later, in conf_rules_resolve). */
static void conf_global_rule(struct conf_parser *p, const struct conf_node *n)
{
    char shown[CONF_SHOW_BYTES];
    size_t n_args = n->n_words - 1;

    if (n_args != 3) {
        conf_diag_add(p->diags, CONF_ERROR, n_args > 3 ? n->words[4].loc : n->words[0].loc, NULL,
                      "'rule' takes three arguments: NAME on LISTENER");
    }
    if (n_args >= 1) {
        conf_value_name(p, &n->words[1], "rule");
    }
    if (n_args >= 2 && strcmp(n->words[2].text, "on") != 0) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[2].loc, "rule NAME on LISTENER { ... }",
                      "expected 'on' after the rule name, found '%s'",
                      conf_show(n->words[2].text, shown));
    }
    if (!n->has_block) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL,
                      "'rule' needs a block: rule NAME on LISTENER { ... }");
    }
    conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL,
                  "rule blocks are not supported yet: this version of twice is a transparent "
                  "proxy");
}

static const struct conf_global_directive conf_globals[] = {
    {{"log-level", 1, "error, warn, info or debug"}, false, conf_global_log_level},
    {{"connect-timeout", 1, "DURATION"}, false, conf_global_connect_timeout},
    {{"shutdown-grace", 1, "DURATION"}, false, conf_global_shutdown_grace},
    {{"listen", 1, "NAME"}, true, conf_listen_directive},
    {{"rule", 3, "NAME on LISTENER"}, true, conf_global_rule},
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

/* Walk the top-level directives through the table. */
static void conf_interpret_globals(struct conf_parser *p, const struct conf_node *list)
{
    struct conf_loc first[CONF_N_GLOBALS] = {{0, 0}};

    for (const struct conf_node *n = list; n != NULL && !p->oom; n = n->next) {
        const struct conf_global_directive *d = conf_find_global(n->words[0].text);
        if (d == NULL) {
            conf_unknown_directive(p, n, conf_global_keywords, conf_n_global_keywords,
                                   conf_listen_keywords, conf_n_listen_keywords,
                                   "'%s' belongs inside a listen block");
            continue;
        }
        if (d->block) {
            d->fn(p, n);
        } else if (conf_check_duplicate(p, n, &first[d - conf_globals]) &&
                   conf_check_shape(p, n, &d->spec)) {
            d->fn(p, n);
        }
    }
}

/* Report rules whose LISTENER is not defined anywhere in the file. */
static void conf_rules_resolve(struct conf_parser *p, const struct conf_node *list)
{
    const char *names[CONF_MAX_LISTENERS];
    size_t n_names = 0;
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];

    for (const struct conf_listener *l = p->conf->listeners; l != NULL; l = l->next) {
        names[n_names++] = l->name;
    }
    for (const struct conf_node *n = list; n != NULL; n = n->next) {
        if (strcmp(n->words[0].text, "rule") != 0 || n->n_words < 4 ||
            strcmp(n->words[2].text, "on") != 0) {
            continue;
        }
        const struct conf_word *w = &n->words[3];
        if (conf_find_listener(p->conf, w->text) == NULL) {
            conf_diag_add(p->diags, CONF_ERROR, w->loc,
                          conf_hint_suggest(w->text, names, n_names, hint, NULL),
                          "unknown listener '%s'", conf_show(w->text, shown));
        }
    }
}

/* Everything pass 2 does, in order. */
static void conf_interpret(struct conf_parser *p, const struct conf_node *list)
{
    conf_interpret_globals(p, list);
    if (p->oom) {
        return;
    }
    conf_rules_resolve(p, list);
    conf_listen_finish(p);
    if (p->n_listen == 0) {
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
    conf_interpret(&p, tree);
    conf_tree_free(tree);
    if (p.oom || diags->errors != errors_before) {
        conf_free(p.conf);
        return -1;
    }
    *out = p.conf;
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

int conf_parse_file(const char *path, struct conf **out, struct conf_diags *diags)
{
    char *text;
    size_t len;
    FILE *f;
    int rc;

    *out = NULL;
    if (!conf_diags_set_file(diags, path)) {
        return -1;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        conf_diag_add(diags, CONF_ERROR, (struct conf_loc){0, 0}, NULL, "cannot open: %s",
                      strerror(errno));
        return -1;
    }
    if (!conf_read_all(f, diags, &text, &len)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    rc = conf_parse_string(path, text, len, out, diags);
    free(text);
    return rc;
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
