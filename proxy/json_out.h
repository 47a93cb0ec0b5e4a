/*
 * json_out.h - the little JSON the report and verdict commands print.
 *
 * Only string escaping lives here: the commands print their objects with
 * fprintf, field by field, in a fixed order so the output is stable.
 */
#ifndef TWICE_JSON_OUT_H
#define TWICE_JSON_OUT_H

#include <stdio.h>

/*
 * Writes s as a JSON string literal, quotes included: `"` and `\` escaped,
 * control characters as \n, \t, ... or \u00XX, and each byte of an invalid
 * UTF-8 sequence as \ufffd, so the output is always valid JSON.  NULL is
 * written as "".
 */
void json_write_string(FILE *out, const char *s);

/* Writes s for a terminal: control characters and invalid UTF-8 bytes become
 * '?'.  NULL writes nothing.  Returns the number of characters written. */
int text_write_safe(FILE *out, const char *s);

#endif
