/*
 * html.h - the little HTML the `--html` pages of `twice report` and `twice verdict` are made
 * of: escaping, and the page's frame.
 *
 * Every string that comes from a journal or an effects list (a task name, a message id, a rule
 * name, a listener, a path) is written through html_text(): a task named `<script>` is text on
 * the page, never markup.  The page is self-contained: inline CSS, no script, no font, no
 * image or request of any kind, and a Content-Security-Policy that forbids them all, so a
 * browser with JavaScript off shows the same page and one that finds markup we did not mean
 * refuses to run it.
 */
#ifndef TWICE_HTML_H
#define TWICE_HTML_H

#include <stdio.h>

/* s as HTML text (also fit for an attribute value in double quotes): & < > " ' as entities,
 * control characters and each byte of an invalid UTF-8 sequence as U+FFFD.  NULL writes
 * nothing. */
void html_text(FILE *out, const char *s);

/* html_text() of lines: each '\n' kept (for a <pre>). */
void html_text_block(FILE *out, const char *s);

/* The page up to and including <body>: doctype, charset, the security policy, title (escaped)
 * and the stylesheet. */
void html_begin(FILE *out, const char *title);

/* </body></html>. */
void html_end(FILE *out);

#endif
