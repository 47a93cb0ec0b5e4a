/*
 * markdown.h - GitHub-flavoured markdown for `--format markdown`: a table cell or inline text
 * that stays what it is whatever a journal names (a task called `a|b`, `<script>` or
 * `*bold*` is shown as written, one cell), and a fenced block around text of any content.
 */
#ifndef TWICE_MARKDOWN_H
#define TWICE_MARKDOWN_H

#include <stddef.h>
#include <stdio.h>

/* s as the text of a table cell or a line: `|` and markdown's punctuation backslash-escaped,
 * `<` and `&` as entities (GitHub passes some HTML through), control characters and invalid
 * UTF-8 bytes as '?'.  NULL writes nothing. */
void md_text(FILE *out, const char *s);

/* s as inline code (`s`), with a fence longer than any run of backticks in it; `|` is still
 * escaped (GitHub splits table cells on it even inside code). */
void md_code(FILE *out, const char *s);

/* The backticks a fenced block around text needs: three, or one more than its longest run. */
size_t md_fence_len(const char *text);

/* text in a fenced block (```text ... ```), its fence long enough (md_fence_len()), without
 * the blank lines text starts with. */
void md_fenced(FILE *out, const char *text);

#endif
