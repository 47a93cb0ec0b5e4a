/*
 * tree.h - pass 1 of the parser: configuration text to a generic tree of
 * directives, before any keyword means anything.
 *
 * A directive is a list of words (the first is its name) and an optional
 * block of child directives.  Syntax errors (unbalanced braces, a block with
 * no name) are reported here; the words are interpreted by pass 2.
 *
 * Internal to rules/.
 */
#ifndef TWICE_RULES_TREE_H
#define TWICE_RULES_TREE_H

#include "proto/base/must_check.h"

#include "rules/conf.h"

/* Deepest nesting of blocks; a `listen` block is depth 1. */
#define CONF_MAX_DEPTH 16

struct conf_word {
    char *text;          /* decoded, NUL-terminated */
    struct conf_loc loc; /* of its first byte (the quote for a string) */
    bool quoted;
    /* Nothing separates it from the previous word of its directive: in
     * `body~"refund due"` the string is glued to `body~`.  Never set on the
     * first word. */
    bool glued;
};

struct conf_node {
    struct conf_word *words; /* words[0] is the directive name */
    size_t n_words;
    size_t cap_words;
    bool has_block;
    struct conf_loc block_loc;  /* of the '{' */
    struct conf_node *children; /* the block's directives, in file order */
    struct conf_node *next;     /* the next sibling */
};

/* Read `len` bytes of configuration text into a list of top-level
 * directives, stored in *out and owned by the caller (conf_tree_free).
 * Syntax errors are added to `diags` and do not stop the pass.  Returns 0,
 * or -1 when out of memory (then *out is NULL and "out of memory" recorded). */
int conf_tree_parse(const char *text, size_t len, struct conf_diags *diags,
                    struct conf_node **out) TWICE_MUST_CHECK;

/* Free a list of directives and their blocks. */
void conf_tree_free(struct conf_node *list);

#endif
