/*
 * json_out.c - JSON string escaping.  See json_out.h.
 */
#include "proxy/json_out.h"

#include "proto/journal_reader.h"

/* The two-character escape for c, or 0 when c has none. */
static char short_escape(unsigned char c)
{
    switch (c) {
    case '"':
        return '"';
    case '\\':
        return '\\';
    case '\n':
        return 'n';
    case '\r':
        return 'r';
    case '\t':
        return 't';
    case '\b':
        return 'b';
    case '\f':
        return 'f';
    default:
        return 0;
    }
}

void json_write_string(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    fputc('"', out);
    while (*p != '\0') {
        char esc = short_escape(*p);
        size_t n = esc != 0 ? 1 : journal_utf8_char_len(p);
        if (esc != 0)
            fprintf(out, "\\%c", esc);
        else if (n == 0)
            fputs("\\ufffd", out);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(out, "\\u%04x", *p);
        else
            fwrite(p, 1, n, out);
        p += n != 0 ? n : 1;
    }
    fputc('"', out);
}

int text_write_safe(FILE *out, const char *s)
{
    int chars = 0;
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    while (*p != '\0') {
        size_t n = journal_utf8_char_len(p);
        if (n == 0 || *p < 0x20 || *p == 0x7f) {
            fputc('?', out);
            n = 1;
        } else {
            fwrite(p, 1, n, out);
        }
        p += n;
        chars++;
    }
    return chars;
}
