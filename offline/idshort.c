/*
 * idshort.c - shortened message ids.  See idshort.h.
 */
#include "offline/idshort.h"

#include <stdlib.h>
#include <string.h>

#include "offline/journal_reader.h"
#include "offline/json_out.h"

void idshort_init(struct idshort *s)
{
    memset(s, 0, sizeof(*s));
    s->len = IDSHORT_MIN;
}

void idshort_add(struct idshort *s, const char *id)
{
    if (s->failed)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap != 0 ? s->cap * 2 : 16;
        const char **ids = realloc(s->ids, cap * sizeof(*ids));
        if (ids == NULL) {
            s->failed = true;
            return;
        }
        s->ids = ids;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
}

static int id_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Characters (UTF-8) two strings share at their start. */
static size_t common_chars(const char *a, const char *b)
{
    size_t chars = 0;
    const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
    while (*p != '\0') {
        size_t n = journal_utf8_char_len(p);
        n = n != 0 ? n : 1;
        if (strncmp((const char *)p, (const char *)q, n) != 0)
            break;
        p += n;
        q += n;
        chars++;
    }
    return chars;
}

void idshort_finish(struct idshort *s)
{
    s->len = IDSHORT_MIN;
    if (s->failed) {
        s->len = IDSHORT_WHOLE;
        return;
    }
    if (s->n == 0)
        return;
    qsort(s->ids, s->n, sizeof(*s->ids), id_cmp);
    size_t k = 1;
    for (size_t i = 1; i < s->n; i++) {
        if (strcmp(s->ids[i], s->ids[k - 1]) == 0)
            continue;
        size_t c = common_chars(s->ids[i], s->ids[k - 1]);
        if (c + 1 > s->len)
            s->len = c + 1;
        s->ids[k++] = s->ids[i];
    }
    s->n = k;
}

/* The bytes of the first `chars` characters of id, and whether id has more than limit. */
static size_t prefix_bytes(const char *id, size_t chars, size_t limit, bool *longer)
{
    const unsigned char *p = (const unsigned char *)id;
    size_t bytes = 0, kept = 0, i = 0;
    while (p[bytes] != '\0' && i <= limit) {
        size_t n = journal_utf8_char_len(p + bytes);
        if (i == chars)
            kept = bytes;
        bytes += n != 0 ? n : 1;
        i++;
    }
    *longer = i > limit;
    return i > chars ? kept : bytes;
}

bool idshort_cut(const struct idshort *s, const char *id)
{
    bool longer = false;
    prefix_bytes(id, s->len, s->len + 1, &longer);
    return longer;
}

size_t idshort_prefix_bytes(const struct idshort *s, const char *id)
{
    bool longer = false;
    size_t n = prefix_bytes(id, s->len, s->len + 1, &longer);
    return longer ? n : strlen(id);
}

int idshort_write(FILE *out, const struct idshort *s, const char *id)
{
    if (!idshort_cut(s, id))
        return text_write_safe(out, id);
    size_t n = idshort_prefix_bytes(s, id);
    char *buf = strndup(id, n);
    if (buf == NULL)
        return text_write_safe(out, id);
    int chars = text_write_safe(out, buf);
    free(buf);
    fputs("\xe2\x80\xa6", out);
    return chars + 1;
}

void idshort_of_examples(struct idshort *s, const struct verdict_result *res)
{
    idshort_init(s);
    for (size_t i = 0; i < res->n_tasks; i++)
        for (size_t k = 0; k < res->tasks[i].examples.n; k++)
            idshort_add(s, res->tasks[i].examples.ids[k]);
    idshort_finish(s);
}

void idshort_print_list(FILE *out, const struct idshort *s, const char *title)
{
    bool any = false;
    for (size_t i = 0; i < s->n; i++) {
        if (!idshort_cut(s, s->ids[i]))
            continue;
        if (!any)
            fprintf(out, "\n%s\n", title);
        any = true;
        fputs("  ", out);
        int n = idshort_write(out, s, s->ids[i]);
        fprintf(out, "%*s  ", n < (int)s->len + 1 ? (int)s->len + 1 - n : 0, "");
        text_write_safe(out, s->ids[i]);
        fputc('\n', out);
    }
}

void idshort_free(struct idshort *s)
{
    free(s->ids);
    s->ids = NULL;
    s->n = s->cap = 0;
}
