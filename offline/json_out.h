/*
 * json_out.h - the little JSON the report and verdict commands and the admin
 * API print.
 *
 * Only string escaping lives here: the writers print their objects field by
 * field, in a fixed order so the output is stable.
 */
#ifndef TWICE_JSON_OUT_H
#define TWICE_JSON_OUT_H

#include <stdio.h>

/* Where json_quote() puts its output, n bytes at a time. */
typedef void (*json_put_fn)(void *ctx, const char *p, size_t n);

/*
 * s as a JSON string literal, quotes included, handed to put: `"` and `\`
 * escaped, control characters as \n, \t, ... or \u00XX, and each byte of an
 * invalid UTF-8 sequence as \ufffd, so the output is always valid JSON.  NULL
 * is written as "".  The one escaper of the program (the commands' output,
 * the admin API's replies).
 */
void json_quote(const char *s, json_put_fn put, void *ctx);

/* json_quote() to a stdio stream. */
void json_write_string(FILE *out, const char *s);

/* Writes s for a terminal: control characters and invalid UTF-8 bytes become
 * '?'.  NULL writes nothing.  Returns the number of characters written. */
int text_write_safe(FILE *out, const char *s);

#endif
