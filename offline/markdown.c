/*
 * markdown.c - markdown escaping.  See markdown.h.
 */
#include "offline/markdown.h"

#include <stdbool.h>
#include <string.h>

#include "offline/journal_reader.h"

/* The ASCII punctuation CommonMark may read as markup, escaped with a backslash. */
static const char md_special[] = "\\`*_{}[]()#+-.!|~>";

/* s escaped: in code (`code`) only '|', else markdown's punctuation too and '<' and '&'. */
static void escape(FILE *out, const char *s, bool code)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    while (*p != '\0') {
        size_t n = journal_utf8_char_len(p);
        if (n == 0 || *p < 0x20 || *p == 0x7f) {
            fputc('?', out);
            p++;
            continue;
        }
        if (*p == '|' || (!code && strchr(md_special, *p) != NULL))
            fprintf(out, "\\%c", *p);
        else if (!code && *p == '<')
            fputs("&lt;", out);
        else if (!code && *p == '&')
            fputs("&amp;", out);
        else
            fwrite(p, 1, n, out);
        p += n;
    }
}

void md_text(FILE *out, const char *s)
{
    escape(out, s, false);
}

/* The longest run of backticks in s. */
static size_t backtick_run(const char *s)
{
    size_t best = 0, run = 0;
    for (const char *p = s != NULL ? s : ""; *p != '\0'; p++) {
        run = *p == '`' ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

static void backticks(FILE *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fputc('`', out);
}

void md_code(FILE *out, const char *s)
{
    size_t fence = backtick_run(s) + 1;
    backticks(out, fence);
    /* a space keeps a backtick at either end apart from the fence */
    fputc(' ', out);
    escape(out, s, true);
    fputc(' ', out);
    backticks(out, fence);
}

size_t md_fence_len(const char *text)
{
    size_t run = backtick_run(text);
    return run >= 3 ? run + 1 : 3;
}

void md_fenced(FILE *out, const char *text)
{
    size_t fence = md_fence_len(text);
    backticks(out, fence);
    fputs("text\n", out);
    text = text != NULL ? text + strspn(text, "\n") : ""; /* no blank first line */
    fputs(text, out);
    size_t len = strlen(text);
    if (len > 0 && text[len - 1] != '\n')
        fputc('\n', out);
    backticks(out, fence);
    fputc('\n', out);
}
