/*
 * diag.h - helpers shared by the parser passes to word their diagnostics:
 * quoting user text safely, "did you mean" suggestions, out-of-memory.
 *
 * Internal to rules/; the diagnostic list itself is declared in conf.h.
 */
#ifndef TWICE_RULES_DIAG_H
#define TWICE_RULES_DIAG_H

#include "rules/conf.h"

/* Longest piece of user text quoted in a message before it is cut with "...". */
#define CONF_SHOW_MAX 64
/* Size of a buffer for conf_show(): the text, "..." and the NUL. */
#define CONF_SHOW_BYTES (CONF_SHOW_MAX + 4)
/* Words longer than this never get a "did you mean" suggestion. */
#define CONF_SUGGEST_MAX_LEN 64
/* Size of a buffer for conf_hint_suggest(). */
#define CONF_HINT_BYTES 128

/* Record an "out of memory" error with no position. */
void conf_diag_oom(struct conf_diags *diags);

/* Copy `s` into `buf` (CONF_SHOW_BYTES) for quoting in a message: control
 * bytes become '?', text longer than CONF_SHOW_MAX is cut and ends in "...".
 * Returns buf. */
const char *conf_show(const char *s, char *buf);

/* The candidate in `words` (n of them) closest to `word` by
 * Damerau-Levenshtein distance, if it is within 2 edits (1 for words shorter
 * than 5 bytes); else the one candidate that `word` (3 bytes or more)
 * begins; NULL otherwise.  Ties go to the earlier candidate. */
const char *conf_suggest(const char *word, const char *const *words, size_t n);

/* Format "did you mean 'x'?" into `buf` (CONF_HINT_BYTES) when conf_suggest()
 * finds a candidate and return buf; otherwise return `fallback` (may be NULL). */
const char *conf_hint_suggest(const char *word, const char *const *words, size_t n, char *buf,
                              const char *fallback);

#endif
