/*
 * json_out.c - JSON string escaping.  See json_out.h.
 */
#include "offline/json_out.h"

#include "offline/journal_reader.h"

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

void json_quote(const char *s, json_put_fn put, void *ctx)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    char esc[8];
    put(ctx, "\"", 1);
    while (*p != '\0') {
        char c = short_escape(*p);
        size_t n = c != 0 ? 1 : journal_utf8_char_len(p);
        if (c != 0) {
            esc[0] = '\\';
            esc[1] = c;
            put(ctx, esc, 2);
        } else if (n == 0) {
            put(ctx, "\\ufffd", 6);
        } else if (*p < 0x20 || *p == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", *p);
            put(ctx, esc, 6);
        } else {
            put(ctx, (const char *)p, n);
        }
        p += n != 0 ? n : 1;
    }
    put(ctx, "\"", 1);
}

static void put_file(void *ctx, const char *p, size_t n)
{
    fwrite(p, 1, n, (FILE *)ctx);
}

void json_write_string(FILE *out, const char *s)
{
    json_quote(s, put_file, out);
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
