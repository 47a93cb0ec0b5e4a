/*
 * json_pick.c - a few values out of a JSON document in one pass; see json_pick.h.
 *
 * One loop over the bytes with an explicit stack of open containers.  Each open container
 * carries the set of asked paths that run through it (a bit per path); a member's key, or an
 * array's first element, narrows that set for the value that follows, and a value at the end
 * of a path is noted there.  A value that starts where a path runs through forgets what was
 * noted under it: with a key given twice, the last value counts, as in jansson's objects.
 *
 * What is accepted follows jansson's load.c and utf.c (2.14, Debian 12) rule by rule, so that
 * the job readers see the same documents as before: the token grammar of lex_scan(), strict
 * UTF-8 of utf8_check_first() / utf8_check_full() (proto/base/utf8.h, the journal's check, is the
 * same), surrogate pairs of lex_scan_string(), "NUL byte in object key", and
 * JSON_DECODE_INT_AS_REAL's "real number overflow" (strtod() ERANGE with HUGE_VAL).
 */
#include "proto/base/json_pick.h"

#include "proto/base/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bit masks: a path per bit of a uint32_t, a key length per bit of a uint64_t. */
_Static_assert(JSON_PICK_MAX_PATHS <= 32, "paths are bits of a uint32_t");
_Static_assert(JSON_PICK_MAX_KEY < 64, "key lengths are bits of a uint64_t");

/* Bytes a string can hold as they are: printable ASCII but '"' and '\\' (a control byte ends
 * the fast run to be refused, a byte from 0x80 to be checked as UTF-8). */
#define JP_P(c) ((c) >= 0x20 && (c) < 0x80 && (c) != '"' && (c) != '\\')
#define JP_R4(b) JP_P(b), JP_P((b) + 1), JP_P((b) + 2), JP_P((b) + 3)
#define JP_R16(b) JP_R4(b), JP_R4((b) + 4), JP_R4((b) + 8), JP_R4((b) + 12)
#define JP_R64(b) JP_R16(b), JP_R16((b) + 16), JP_R16((b) + 32), JP_R16((b) + 48)
static const bool jp_plain[256] = {JP_R64(0), JP_R64(64), JP_R64(128), JP_R64(192)};

static inline bool jp_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static inline bool jp_alpha(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static inline size_t jp_ws(const uint8_t *p, size_t len, size_t i)
{
    while (i < len && p[i] <= ' ' && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i;
}

/* A bit in the top of each of the 8 bytes of x (loaded little-endian) that a string cannot hold
 * as it is (jp_plain): below 0x20, '"', '\\', or from 0x80.  The "has a zero byte" arithmetic
 * can also mark bytes above a match, through its borrow, but never one below the first: the
 * lowest bit set is exactly the first such byte. */
static inline uint64_t jp_special8(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t quote = x ^ (ones * '"'), slash = x ^ (ones * '\\');
    uint64_t low = (x - ones * 0x20) & ~x;
    uint64_t zq = (quote - ones) & ~quote, zs = (slash - ones) & ~slash;
    return (low | zq | zs | x) & highs;
}

static int jp_hex(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The code unit of the four hex digits at p[i..i+4), or -1. */
static int32_t jp_hex4(const uint8_t *p, size_t len, size_t i)
{
    if (len - i < 4)
        return -1;
    int32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int h = jp_hex(p[i + k]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* The string whose opening quote is at p[*pos - 1]: *pos past its closing quote, *escaped and
 * *nul as in struct json_pick_value.  Returns 0, or -1 when it is not a valid string. */
static int jp_string(const uint8_t *p, size_t len, size_t *pos, bool *escaped, bool *nul)
{
    size_t i = *pos;
    for (;;) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* Eight bytes at a time to the first that is not plain. */
        while (len - i >= 8) {
            uint64_t x;
            memcpy(&x, p + i, 8);
            uint64_t m = jp_special8(x);
            if (m != 0) {
                i += (size_t)__builtin_ctzll(m) / 8;
                goto found;
            }
            i += 8;
        }
#endif
        while (i < len && jp_plain[p[i]])
            i++;
        if (i >= len)
            return -1;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    found:;
#endif
        uint8_t c = p[i];
        if (c == '"') {
            *pos = i + 1;
            return 0;
        }
        if (c == '\\') {
            *escaped = true;
            if (len - i < 2)
                return -1;
            uint8_t e = p[i + 1];
            if (e == 'u') {
                int32_t u = jp_hex4(p, len, i + 2);
                if (u < 0)
                    return -1;
                i += 6;
                if (u >= 0xd800 && u <= 0xdbff) {
                    /* A high surrogate must be followed by an escaped low one. */
                    int32_t lo = len - i >= 2 && p[i] == '\\' && p[i + 1] == 'u'
                                     ? jp_hex4(p, len, i + 2)
                                     : -1;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return -1;
                    i += 6;
                } else if (u >= 0xdc00 && u <= 0xdfff) {
                    return -1;
                } else if (u == 0) {
                    *nul = true;
                }
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' &&
                e != 't')
                return -1;
            i += 2;
            continue;
        }
        if (c < 0x20)
            return -1;                            /* a control character */
        size_t k = utf8_char_len(p + i, len - i); /* c >= 0x80 here: 2 to 4, or 0 */
        if (k == 0)
            return -1;
        i += k;
    }
}

/* Whether the number p[0..n) (grammatical) overflows a double: jansson refuses it ("real number
 * overflow": strtod() gives HUGE_VAL with ERANGE).  strtod() reads the decimal point of the
 * process's locale, which jansson first writes in place of '.'; here the point is taken out
 * instead: the digits before and after it, and the exponent less the digits after it, say the
 * same number in a form every locale reads alike. */
static bool jp_overflows(const uint8_t *p, size_t n)
{
    char small[160];
    size_t cap = n + 32; /* the digits, a sign, 'e' and an exponent of up to 20 characters */
    char *s = cap <= sizeof(small) ? small : malloc(cap);
    if (s == NULL)
        return true; /* cannot tell: refused, as a failed allocation fails jansson's load */
    size_t i = 0, o = 0;
    int64_t frac = 0, exp = 0;
    if (p[i] == '-')
        s[o++] = (char)p[i++];
    while (i < n && jp_digit(p[i]))
        s[o++] = (char)p[i++];
    if (i < n && p[i] == '.') {
        for (i++; i < n && jp_digit(p[i]); i++, frac++)
            s[o++] = (char)p[i];
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        bool neg = p[i] == '-';
        if (p[i] == '-' || p[i] == '+')
            i++;
        /* Past 10^12 the answer no longer changes: a double's exponent is at most 308, and a
         * number has fewer digits than that (RESP_JOB_MAX_JSON). */
        for (; i < n; i++)
            if (exp < INT64_C(1000000000000))
                exp = exp * 10 + (p[i] - '0');
        if (neg)
            exp = -exp;
    }
    snprintf(s + o, cap - o, "e%lld", (long long)(exp - frac));
    int saved = errno;
    errno = 0;
    double v = strtod(s, NULL);
    bool over = (v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE;
    errno = saved;
    if (s != small)
        free(s);
    return over;
}

/* The number at p[*pos]: *pos past it.  Returns 0, or -1 when it is not a valid number. */
static int jp_number(const uint8_t *p, size_t len, size_t *pos)
{
    size_t start = *pos, i = start;
    if (p[i] == '-')
        i++;
    if (i >= len)
        return -1;
    size_t int_start = i;
    if (p[i] == '0') {
        i++;
        if (i < len && jp_digit(p[i]))
            return -1; /* a leading zero */
    } else if (jp_digit(p[i])) {
        while (i < len && jp_digit(p[i]))
            i++;
    } else {
        return -1;
    }
    size_t int_digits = i - int_start;
    bool exponent = false;
    if (i < len && p[i] == '.') {
        i++;
        if (i >= len || !jp_digit(p[i]))
            return -1;
        while (i < len && jp_digit(p[i]))
            i++;
    }
    if (i < len && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < len && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= len || !jp_digit(p[i]))
            return -1;
        while (i < len && jp_digit(p[i]))
            i++;
        exponent = true;
    }
    /* Below 10^300 without an exponent, no double overflows: strtod() only for the rest. */
    if ((exponent || int_digits > 300) && jp_overflows(p + start, i - start))
        return -1;
    *pos = i;
    return 0;
}

/* Decodes the string bytes s[0..n) (checked by jp_string()) into d; returns the length. */
static size_t jp_decode(const uint8_t *s, size_t n, char *d)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            d[o++] = (char)s[i++];
            continue;
        }
        uint8_t e = s[i + 1];
        i += 2;
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            d[o++] = to[strchr(from, e) - from];
            continue;
        }
        uint32_t u = (uint32_t)jp_hex4(s, n, i);
        i += 4;
        if (u >= 0xd800 && u <= 0xdbff) {
            u = 0x10000 + ((u - 0xd800) << 10) + ((uint32_t)jp_hex4(s, n, i + 2) - 0xdc00);
            i += 6;
        }
        if (u < 0x80) {
            d[o++] = (char)u;
        } else if (u < 0x800) {
            d[o++] = (char)(0xc0 | u >> 6);
            d[o++] = (char)(0x80 | (u & 0x3f));
        } else if (u < 0x10000) {
            d[o++] = (char)(0xe0 | u >> 12);
            d[o++] = (char)(0x80 | (u >> 6 & 0x3f));
            d[o++] = (char)(0x80 | (u & 0x3f));
        } else {
            d[o++] = (char)(0xf0 | u >> 18);
            d[o++] = (char)(0x80 | (u >> 12 & 0x3f));
            d[o++] = (char)(0x80 | (u >> 6 & 0x3f));
            d[o++] = (char)(0x80 | (u & 0x3f));
        }
    }
    return o;
}

/* Whether the key p[off..off+n) (escaped as told) is want[0..wn). */
static bool jp_key_is(const uint8_t *p, size_t off, size_t n, bool escaped, const char *want,
                      size_t wn)
{
    if (!escaped)
        return n == wn && p[off] == (uint8_t)want[0] && memcmp(p + off, want, n) == 0;
    /* Each escape stands for at least one byte in at most six (twelve for four): a key written
     * in more than 6 * JSON_PICK_MAX_KEY bytes is longer than any asked. */
    char d[6 * JSON_PICK_MAX_KEY];
    if (n > sizeof(d))
        return false;
    size_t dn = jp_decode(p + off, n, d);
    return dn == wn && memcmp(d, want, wn) == 0;
}

struct jp_level {
    uint32_t paths; /* the asked paths that run through this container */
    bool object;
    bool first; /* an array before its first element */
};

/* A value of `type` starts at depth d where the paths `on` run: noted at the paths ending
 * here, forgotten at the paths going deeper. */
static void jp_note(const struct json_pick_path *paths, struct json_pick_value *out, uint32_t on,
                    size_t d, const struct json_pick_value *v)
{
    while (on != 0) {
        unsigned k = (unsigned)__builtin_ctz(on);
        on &= on - 1;
        out[k] = paths[k].n == d ? *v : (struct json_pick_value){0};
    }
}

/* The paths asked for, measured once: each key's length, and per depth a bit per key length
 * some path has there (so that a key of another length is never compared).  -1 for a path this
 * reader cannot ask for.  out[0..n) is cleared. */
struct jp_keys {
    uint8_t klen[JSON_PICK_MAX_PATHS][JSON_PICK_MAX_KEYS];
    uint64_t lens[JSON_PICK_MAX_KEYS];
};

static int jp_prepare(const struct json_pick_path *paths, size_t n, struct json_pick_value *out,
                      struct jp_keys *kk)
{
    memset(kk->lens, 0, sizeof(kk->lens));
    for (size_t k = 0; k < n; k++) {
        out[k] = (struct json_pick_value){0};
        if (paths[k].n == 0 || paths[k].n > JSON_PICK_MAX_KEYS)
            return -1;
        for (size_t d = 0; d < paths[k].n; d++) {
            const char *key = paths[k].keys[d];
            size_t kl = key != NULL ? strlen(key) : 0;
            if (key != NULL && (kl == 0 || kl > JSON_PICK_MAX_KEY))
                return -1;
            kk->klen[k][d] = (uint8_t)kl;
            kk->lens[d] |= UINT64_C(1) << kl;
        }
    }
    return 0;
}

/* A value that is not a container, at p[*pos]: a string, a number, true, false or null, read
 * into *v (its type; a string's or a number's span).  -1 when it is none of them. */
static int jp_scalar(const uint8_t *p, size_t len, size_t *pos, struct json_pick_value *v)
{
    size_t i = *pos;
    uint8_t c = p[i];
    if (c == '"') {
        size_t at = ++i;
        if (jp_string(p, len, &i, &v->escaped, &v->nul) != 0)
            return -1;
        v->type = JSON_PICK_STRING;
        v->off = at;
        v->len = i - 1 - at;
    } else if (c == '-' || jp_digit(c)) {
        size_t at = i;
        if (jp_number(p, len, &i) != 0)
            return -1;
        v->type = JSON_PICK_NUMBER;
        v->off = at;
        v->len = i - at;
    } else {
        /* jansson reads a run of letters and wants it whole. */
        size_t e = i;
        while (e < len && jp_alpha(p[e]))
            e++;
        if (e - i == 4 && memcmp(p + i, "true", 4) == 0)
            v->type = JSON_PICK_TRUE;
        else if (e - i == 5 && memcmp(p + i, "false", 5) == 0)
            v->type = JSON_PICK_FALSE;
        else if (e - i == 4 && memcmp(p + i, "null", 4) == 0)
            v->type = JSON_PICK_NULL;
        else
            return -1;
        i = e;
    }
    *pos = i;
    return 0;
}

/* The paths among cand (those through the object at depth d - 1) whose key at d - 1 is the
 * key p[at..at + keylen), written with escapes or not. */
static uint32_t jp_member_on(const uint8_t *p, size_t at, size_t keylen, bool escaped,
                             const struct json_pick_path *paths, const struct jp_keys *kk, size_t d,
                             uint32_t cand)
{
    /* A key written without escapes is as long as it reads: no path key of that length, no
     * comparison.  (A path runs through st[d - 1] only when d - 1 < JSON_PICK_MAX_KEYS.) */
    if (cand != 0 && !escaped &&
        (keylen > JSON_PICK_MAX_KEY || ((kk->lens[d - 1] >> keylen) & 1) == 0))
        return 0;
    uint32_t on = 0;
    for (uint32_t m = cand; m != 0; m &= m - 1) {
        unsigned k = (unsigned)__builtin_ctz(m);
        const char *key = paths[k].keys[d - 1];
        if (key != NULL && jp_key_is(p, at, keylen, escaped, key, kk->klen[k][d - 1]))
            on |= UINT32_C(1) << k;
    }
    return on;
}

/* The paths through an element of the array l at depth d - 1: only its first element can be
 * on a path (a NULL key). */
static uint32_t jp_element_on(const struct json_pick_path *paths, struct jp_level *l, size_t d)
{
    uint32_t on = 0;
    if (l->first) {
        for (uint32_t m = l->paths; m != 0; m &= m - 1) {
            unsigned k = (unsigned)__builtin_ctz(m);
            if (paths[k].keys[d - 1] == NULL)
                on |= UINT32_C(1) << k;
        }
        l->first = false;
    }
    return on;
}

/* The paths of `on` that go deeper than depth d. */
static uint32_t jp_deeper(const struct json_pick_path *paths, uint32_t on, size_t d)
{
    uint32_t deeper = 0;
    for (uint32_t m = on; m != 0; m &= m - 1) {
        unsigned k = (unsigned)__builtin_ctz(m);
        if (paths[k].n > d)
            deeper |= UINT32_C(1) << k;
    }
    return deeper;
}

/*
 * One pass over the document, a state machine: a value at depth d (a container opens a level,
 * a scalar is noted), then what follows it (the container goes on or closes), then a member's
 * key or an array's element, which leads to a value again.  The gotos are those transitions;
 * `on` is the set of asked paths that run through the value about to be read.
 */
int json_pick(const void *json, size_t len, size_t max_depth, const struct json_pick_path *paths,
              size_t n, struct json_pick_value *out)
{
    const uint8_t *p = json;
    struct jp_level st[JSON_PICK_MAX_DEPTH];
    struct jp_keys kk;
    if (p == NULL || n > JSON_PICK_MAX_PATHS || max_depth > JSON_PICK_MAX_DEPTH ||
        jp_prepare(paths, n, out, &kk) != 0)
        return -1;
    size_t i = jp_ws(p, len, 0);
    if (i >= len || p[i] != '{')
        return -1; /* jansson reads arrays too, but a job is an object */
    size_t d = 0;  /* containers open around the value being read */
    uint32_t on = n == 32 ? UINT32_MAX : (UINT32_C(1) << n) - 1; /* paths through that value */

    for (;;) {
        /* A value at depth d. */
        i = jp_ws(p, len, i);
        if (i >= len)
            return -1;
        struct json_pick_value v = {0};
        uint8_t c = p[i];
        if (c == '{' || c == '[') {
            v.type = c == '{' ? JSON_PICK_OBJECT : JSON_PICK_ARRAY;
            if (on != 0)
                jp_note(paths, out, on, d, &v);
            if (d == max_depth)
                return -1;
            uint32_t deeper = jp_deeper(paths, on, d);
            st[d++] = (struct jp_level){.paths = deeper, .object = c == '{', .first = c == '['};
            i = jp_ws(p, len, i + 1);
            if (i < len && p[i] == (c == '{' ? '}' : ']')) {
                i++;
                d--;
            } else if (c == '{') {
                goto member;
            } else {
                goto element;
            }
        } else {
            if (jp_scalar(p, len, &i, &v) != 0)
                return -1;
            if (on != 0)
                jp_note(paths, out, on, d, &v);
        }

        /* After a value: the container around it goes on, or closes. */
        for (;;) {
            if (d == 0)
                return jp_ws(p, len, i) == len ? 0 : -1;
            struct jp_level *l = &st[d - 1];
            i = jp_ws(p, len, i);
            if (i >= len)
                return -1;
            if (p[i] == ',') {
                i++;
                if (l->object)
                    goto member;
                goto element;
            }
            if (p[i] != (l->object ? '}' : ']'))
                return -1;
            i++;
            d--;
        }

    member : {
        /* A key of the object st[d - 1], then its value. */
        i = jp_ws(p, len, i);
        if (i >= len || p[i] != '"')
            return -1;
        size_t at = ++i;
        bool escaped = false, nul = false;
        if (jp_string(p, len, &i, &escaped, &nul) != 0 || nul)
            return -1; /* jansson: "NUL byte in object key not supported" */
        size_t keylen = i - 1 - at;
        i = jp_ws(p, len, i);
        if (i >= len || p[i] != ':')
            return -1;
        i++;
        on = jp_member_on(p, at, keylen, escaped, paths, &kk, d, st[d - 1].paths);
        continue;
    }
    element:
        on = jp_element_on(paths, &st[d - 1], d);
    }
}

char *json_pick_strdup(const void *json, const struct json_pick_value *v)
{
    if (v->type != JSON_PICK_STRING || v->nul)
        return NULL;
    char *s = malloc(v->len + 1);
    if (s == NULL)
        return NULL;
    const uint8_t *p = (const uint8_t *)json + v->off;
    size_t n = v->len;
    if (v->escaped) {
        n = jp_decode(p, v->len, s);
    } else if (n > 0) {
        memcpy(s, p, n);
    }
    s[n] = '\0';
    return s;
}
