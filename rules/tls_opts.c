/*
 * tls_opts.c - the option lists of `tls cert FILE key FILE` and
 * `upstream-tls [verify | no-verify] [ca FILE] [sni NAME] [cert FILE key FILE]`.
 *
 * Options may come in any order.  A generic pass matches each word to an
 * option (flags stand alone, the others take the next word as their value);
 * the directive then checks how the options combine.
 */
#include "rules/diag.h"
#include "rules/interp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Most options any TLS directive has. */
#define CONF_MAX_TLS_OPTS 8

struct conf_opt {
    const char *name;
    const char *value; /* placeholder for its value ("FILE"), NULL for a flag */
};

struct conf_opt_found {
    const struct conf_word *word;  /* the option, NULL when not given */
    const struct conf_word *value; /* its value, NULL for a flag or when missing */
};

/* Find option `word` in `opts`; -1 after reporting it unknown. */
static int conf_opt_lookup(struct conf_parser *p, const char *directive,
                           const struct conf_opt *opts, size_t n_opts, const struct conf_word *w)
{
    const char *names[CONF_MAX_TLS_OPTS];
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];

    for (size_t i = 0; i < n_opts; i++) {
        if (strcmp(w->text, opts[i].name) == 0) {
            return (int)i;
        }
        names[i] = opts[i].name;
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  conf_hint_suggest(w->text, names, n_opts, hint, NULL), "unknown '%s' option '%s'",
                  directive, conf_show(w->text, shown));
    return -1;
}

/* Match the words of `n` to `opts`, filling found[] (zeroed by the caller).
 * Returns false when any word was wrong (each is reported). */
static bool conf_opts_parse(struct conf_parser *p, const struct conf_node *n,
                            const struct conf_opt *opts, size_t n_opts,
                            struct conf_opt_found *found)
{
    const char *directive = n->words[0].text;
    char hint[CONF_HINT_BYTES];
    bool ok = true;

    for (size_t i = 1; i < n->n_words; i++) {
        const struct conf_word *w = &n->words[i];
        int k = conf_opt_lookup(p, directive, opts, n_opts, w);
        if (k < 0) {
            ok = false;
            continue;
        }
        bool takes = opts[k].value != NULL;
        const struct conf_word *value = takes && i + 1 < n->n_words ? &n->words[i + 1] : NULL;
        if (found[k].word != NULL) {
            snprintf(hint, sizeof(hint), "first given at %u:%u", found[k].word->loc.line,
                     found[k].word->loc.col);
            conf_diag_add(p->diags, CONF_ERROR, w->loc, hint, "duplicate '%s' in '%s'",
                          opts[k].name, directive);
            ok = false;
        } else if (takes && (value == NULL || value->text[0] == '\0')) {
            conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "'%s' needs a value: %s %s",
                          opts[k].name, opts[k].name, opts[k].value);
            found[k].word = w; /* given, if badly: no "missing" error on top */
            ok = false;
        } else {
            found[k] = (struct conf_opt_found){w, value};
        }
        i += value != NULL ? 1 : 0;
    }
    return ok;
}

/* Copy the value of an option given in found[], NULL when absent; sets
 * *failed when out of memory. */
static char *conf_opt_copy(struct conf_parser *p, const struct conf_opt_found *found, bool *failed)
{
    char *copy;

    if (found->value == NULL) {
        return NULL;
    }
    copy = conf_parser_strdup(p, found->value->text);
    if (copy == NULL) {
        *failed = true;
    }
    return copy;
}

void conf_tls_server_directive(struct conf_parser *p, struct conf_listener *l,
                               const struct conf_node *n)
{
    static const struct conf_opt opts[] = {{"cert", "FILE"}, {"key", "FILE"}};
    struct conf_opt_found found[2] = {{0}};
    bool ok = conf_opts_parse(p, n, opts, 2, found), failed = false;

    if (found[0].word == NULL || found[1].word == NULL) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, "write: tls cert FILE key FILE",
                      "'tls' needs cert FILE and key FILE");
        return;
    }
    if (!ok) {
        return;
    }
    l->tls.cert = conf_opt_copy(p, &found[0], &failed);
    l->tls.key = conf_opt_copy(p, &found[1], &failed);
    l->tls.enabled = !failed;
    l->tls.loc = n->words[0].loc;
}

enum conf_client_opt {
    CONF_CO_VERIFY = 0,
    CONF_CO_NO_VERIFY,
    CONF_CO_CA,
    CONF_CO_SNI,
    CONF_CO_CERT,
    CONF_CO_KEY,
    CONF_CO_COUNT,
};

/* How the options of `upstream-tls` combine; false after an error. */
static bool conf_tls_client_check(struct conf_parser *p, const struct conf_opt_found *found)
{
    const struct conf_word *verify = found[CONF_CO_VERIFY].word;
    const struct conf_word *no_verify = found[CONF_CO_NO_VERIFY].word;
    const struct conf_word *cert = found[CONF_CO_CERT].word, *key = found[CONF_CO_KEY].word;
    bool ok = true;

    if (verify != NULL && no_verify != NULL) {
        const struct conf_word *later = verify->loc.col > no_verify->loc.col ? verify : no_verify;
        conf_diag_add(p->diags, CONF_ERROR, later->loc, NULL,
                      "'verify' and 'no-verify' cannot be used together");
        ok = false;
    }
    if ((cert == NULL) != (key == NULL)) {
        conf_diag_add(p->diags, CONF_ERROR, cert != NULL ? cert->loc : key->loc,
                      "write: cert FILE key FILE", "'upstream-tls' has '%s' but no '%s'",
                      cert != NULL ? "cert" : "key", cert != NULL ? "key" : "cert");
        ok = false;
    }
    if (no_verify != NULL && found[CONF_CO_CA].word != NULL) {
        conf_diag_add(p->diags, CONF_WARNING, found[CONF_CO_CA].word->loc, NULL,
                      "'ca' is ignored with no-verify");
    }
    return ok;
}

void conf_tls_client_directive(struct conf_parser *p, struct conf_listener *l,
                               const struct conf_node *n)
{
    static const struct conf_opt opts[CONF_CO_COUNT] = {
        {"verify", NULL}, {"no-verify", NULL}, {"ca", "FILE"},
        {"sni", "NAME"},  {"cert", "FILE"},    {"key", "FILE"},
    };
    struct conf_opt_found found[CONF_CO_COUNT] = {{0}};
    bool ok = conf_opts_parse(p, n, opts, CONF_CO_COUNT, found), failed = false;
    struct conf_tls_client *t = &l->upstream_tls;

    if (!conf_tls_client_check(p, found) || !ok) {
        return;
    }
    t->verify = found[CONF_CO_NO_VERIFY].word == NULL;
    t->ca = t->verify ? conf_opt_copy(p, &found[CONF_CO_CA], &failed) : NULL;
    t->sni = conf_opt_copy(p, &found[CONF_CO_SNI], &failed);
    t->cert = conf_opt_copy(p, &found[CONF_CO_CERT], &failed);
    t->key = conf_opt_copy(p, &found[CONF_CO_KEY], &failed);
    t->enabled = !failed;
    t->loc = n->words[0].loc;
}
