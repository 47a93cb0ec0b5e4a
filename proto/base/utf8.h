/*
 * utf8.h - one UTF-8 character checked, as strictly as proto3 strings and jansson want it: no
 * overlong form, no surrogate (U+D800-U+DFFF), nothing past U+10FFFF.  Shared by the journal's
 * string fields (journal_reader.c, journal.c, json_out.c) and the job JSON reader (json_pick.c).
 */
#ifndef TWICE_UTF8_H
#define TWICE_UTF8_H

#include <stddef.h>

/* The length (1 to 4) of the valid UTF-8 character at p, or 0 when p starts an invalid sequence
 * or one longer than the r (>= 1) bytes at p.  Reads only continuation bytes after p[0], one
 * after the other, and nothing from p[r] on: a NUL-terminated string can be given r = 4. */
static inline size_t utf8_char_len(const unsigned char *p, size_t r)
{
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    /* The second byte's range rules out the overlong forms, the surrogates and past U+10FFFF. */
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0; /* a continuation byte, an overlong lead (0xc0, 0xc1), or past 0xf4 */
    if (n > r || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    }
    return n;
}

#endif
