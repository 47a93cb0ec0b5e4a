/*
 * interp.c - checks shared by every scope of pass 2: the shape of a
 * directive (arguments, block), repeats, and unknown keywords.
 */
#include "rules/interp.h"
#include "rules/conf_mem.h"
#include "rules/diag.h"

#include <stdio.h>
#include <string.h>

void conf_parser_oom(struct conf_parser *p)
{
    if (!p->oom) {
        p->oom = true;
        conf_diag_oom(p->diags);
    }
}

char *conf_parser_strdup(struct conf_parser *p, const char *s)
{
    char *copy = conf_mem_strdup(s);

    if (copy == NULL) {
        conf_parser_oom(p);
    }
    return copy;
}

/* "one", "two"... for argument counts in messages. */
static const char *conf_count_word(int n)
{
    static const char *const words[] = {"no", "one", "two", "three", "four"};

    return n >= 0 && (size_t)n < sizeof(words) / sizeof(words[0]) ? words[n] : "several";
}

bool conf_check_shape(struct conf_parser *p, const struct conf_node *n,
                      const struct conf_dirspec *spec)
{
    size_t n_args = n->n_words - 1;
    struct conf_loc at;

    if (n->has_block) {
        conf_diag_add(p->diags, CONF_ERROR, n->block_loc, NULL, "'%s' does not take a block",
                      spec->name);
    }
    if (spec->n_args < 0 || n_args == (size_t)spec->n_args) {
        return true;
    }
    /* Point at the first extra argument, or at the directive when some are missing. */
    at = n_args > (size_t)spec->n_args ? n->words[spec->n_args + 1].loc : n->words[0].loc;
    conf_diag_add(p->diags, CONF_ERROR, at, NULL, "'%s' takes %s argument%s: %s", spec->name,
                  conf_count_word(spec->n_args), spec->n_args == 1 ? "" : "s", spec->usage);
    return false;
}

bool conf_check_duplicate(struct conf_parser *p, const struct conf_node *n, struct conf_loc *first)
{
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];

    if (first->line == 0) {
        *first = n->words[0].loc;
        return true;
    }
    snprintf(hint, sizeof(hint), "first set at %u:%u", first->line, first->col);
    conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, hint, "duplicate '%s'",
                  conf_show(n->words[0].text, shown));
    return false;
}

/* Whether `word` is one of the n `words`. */
static bool conf_is_one_of(const char *word, const char *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(word, words[i]) == 0) {
            return true;
        }
    }
    return false;
}

void conf_unknown_directive(struct conf_parser *p, const struct conf_node *n,
                            const char *const *known, size_t n_known, const char *const *other,
                            size_t n_other, const char *elsewhere)
{
    char shown[CONF_SHOW_BYTES], hint_buf[CONF_HINT_BYTES];
    const char *name = n->words[0].text, *hint;

    if (conf_is_one_of(name, other, n_other)) {
        /* `name` is a keyword of ours, so it is short and printable. */
        snprintf(hint_buf, sizeof(hint_buf), elsewhere, name);
        hint = hint_buf;
    } else {
        hint = conf_hint_suggest(name, known, n_known, hint_buf, NULL);
    }
    conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, hint, "unknown directive '%s'",
                  conf_show(name, shown));
}
