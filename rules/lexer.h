/*
 * lexer.h - the tokens of the configuration language.
 *
 * WORD is a run of bytes other than blanks, newline, { } ; " and #.  STRING
 * is double-quoted with the escapes \" \\ \n \t.  `#` starts a comment that
 * runs to the end of the line.  Every token carries its 1-based line and byte
 * column.  Lexical errors (bad escapes, unterminated strings, NUL bytes) go to
 * the diagnostic list and lexing goes on, so one pass reports them all.
 *
 * Internal to rules/.
 */
#ifndef TWICE_RULES_LEXER_H
#define TWICE_RULES_LEXER_H

#include "proto/base/must_check.h"

#include "rules/conf.h"

enum conf_tok_kind {
    CONF_TOK_WORD = 0,
    CONF_TOK_STRING,
    CONF_TOK_LBRACE,
    CONF_TOK_RBRACE,
    CONF_TOK_SEMI,
    CONF_TOK_NEWLINE,
    CONF_TOK_EOF,
};

/* For WORD and STRING, `text` is a NUL-terminated copy (escapes decoded)
 * owned by whoever holds the token; NULL for other kinds.  `glued` is true
 * when no blank or comment separates the token from the one before it, as
 * the string in `body~"refund due"` is glued to the word `body~`. */
struct conf_token {
    enum conf_tok_kind kind;
    struct conf_loc loc;
    char *text;
    bool glued;
};

struct conf_lexer {
    const char *pos;
    const char *end;
    struct conf_loc loc; /* of `pos` */
    struct conf_diags *diags;
};

/* Start lexing the `len` bytes at `text` (not copied: they must outlive the
 * lexer).  Diagnostics go to `diags`. */
void conf_lexer_init(struct conf_lexer *lx, const char *text, size_t len, struct conf_diags *diags);

/* Read the next token into *tok.  Returns 0, or -1 when out of memory (an
 * "out of memory" diagnostic is then recorded).  After EOF it keeps
 * returning EOF. */
int conf_lexer_next(struct conf_lexer *lx, struct conf_token *tok) TWICE_MUST_CHECK;

#endif
