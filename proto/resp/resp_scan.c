/*
 * resp_scan.c - the RESP2/RESP3 message scanner, the element iterator and the view helpers,
 * plus the codec's error strings.
 *
 * The scanner is hiredis' reader without objects: an explicit stack of open aggregates
 * (struct resp_level, like hiredis' redisReadTask) and a position that advances only over
 * whole items, so it can stop at any byte and resume there.  What it keeps between calls is
 * exactly what makes resuming cheap: the offset validated so far, where the search for the
 * current line's CRLF stopped, and the end of a bulk payload being waited for, so a bulk
 * arriving in pieces is never searched again.  It rejects a message as soon as the bytes seen
 * prove it invalid (type byte at byte 1, a number line at 21 bytes, a bare LF at once).
 *
 * The iterator and resp_view_copy() work on a message the scanner accepted, without state: they
 * re-read it (stepping over nested values with a counter, not a stack) and re-check every bound,
 * so a caller handing them the wrong bytes gets RESP_E_MISMATCH, never an over-read.
 */
#include <limits.h>
#include <string.h>

#include "proto/resp/resp.h"

static const char *const resp_status_str[] = {
#define RESP_STATUS_STR(name, code, str) [-(code)] = str,
    RESP_ERRORS(RESP_STATUS_STR)
#undef RESP_STATUS_STR
};

const char *resp_strerror(int status)
{
    size_t n = sizeof(resp_status_str) / sizeof(resp_status_str[0]);
    if (status > 0 || status <= -(int)n || resp_status_str[-status] == NULL)
        return "unknown error";
    return resp_status_str[-status];
}

/* ---- bytes and numbers --------------------------------------------------------------------- */

/* What follows a type byte. */
enum resp_class {
    RESP_C_BAD,
    RESP_C_SCALAR, /* + - : , ( # _ : one line */
    RESP_C_BLOB,   /* $ = ! : a length line, then that many bytes and CRLF */
    RESP_C_AGG,    /* * % ~ > | : a count line, then that many values (pairs for % and |) */
};

static enum resp_class resp_class_of(uint8_t t)
{
    switch (t) {
    case '+':
    case '-':
    case ':':
    case ',':
    case '(':
    case '#':
    case '_':
        return RESP_C_SCALAR;
    case '$':
    case '=':
    case '!':
        return RESP_C_BLOB;
    case '*':
    case '%':
    case '~':
    case '>':
    case '|':
        return RESP_C_AGG;
    default:
        return RESP_C_BAD;
    }
}

static bool resp_is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

/* isspace() in the C locale, which Redis' sdssplitargs() runs in. */
static bool resp_is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static uint8_t resp_lower(uint8_t c)
{
    return c >= 'A' && c <= 'Z' ? (uint8_t)(c - 'A' + 'a') : c;
}

/* Parses p[0..n) as Redis' string2ll() does: an optional '-', then "0" or a digit 1-9 followed
 * by digits, within int64_t.  No '+', no spaces, no leading zeros, no "-0". */
static int resp_parse_int(const uint8_t *p, size_t n, int64_t *out)
{
    if (n == 0 || n > RESP_INT_LINE_MAX)
        return RESP_E_INTEGER;
    if (n == 1 && p[0] == '0') {
        *out = 0;
        return RESP_OK;
    }
    bool neg = p[0] == '-';
    size_t i = neg ? 1 : 0;
    if (i == n || p[i] < '1' || p[i] > '9')
        return RESP_E_INTEGER;
    uint64_t v = 0;
    /* Up to 18 digits no overflow is possible (an integer reply, a length, a count): the
     * division is for longer ones only. */
    bool may_overflow = n - i > 18;
    for (; i < n; i++) {
        if (!resp_is_digit(p[i]))
            return RESP_E_INTEGER;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (may_overflow && v > (UINT64_MAX - d) / 10)
            return RESP_E_INTEGER;
        v = v * 10 + d;
    }
    uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (v > lim)
        return RESP_E_INTEGER;
    if (!neg)
        *out = (int64_t)v;
    else
        *out = v == lim ? INT64_MIN : -(int64_t)v;
    return RESP_OK;
}

static size_t resp_digits(const uint8_t *p, size_t n, size_t i)
{
    size_t start = i;
    while (i < n && resp_is_digit(p[i]))
        i++;
    return i - start;
}

/* RESP3 double: [+|-] then inf, nan, or digits[.digits][(e|E)[+|-]digits]. */
static bool resp_is_double(const uint8_t *p, size_t n)
{
    size_t i = n > 0 && (p[0] == '-' || p[0] == '+') ? 1 : 0;
    if (n - i == 3) {
        uint8_t a = resp_lower(p[i]), b = resp_lower(p[i + 1]), c = resp_lower(p[i + 2]);
        if ((a == 'i' && b == 'n' && c == 'f') || (a == 'n' && b == 'a' && c == 'n'))
            return true;
    }
    size_t whole = resp_digits(p, n, i), frac = 0;
    i += whole;
    if (i < n && p[i] == '.') {
        frac = resp_digits(p, n, i + 1);
        i += 1 + frac;
    }
    if (whole + frac == 0)
        return false;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '-' || p[i] == '+'))
            i++;
        size_t exp = resp_digits(p, n, i);
        if (exp == 0)
            return false;
        i += exp;
    }
    return i == n;
}

/* RESP3 big number: [+|-] then one or more digits. */
static bool resp_is_bignum(const uint8_t *p, size_t n)
{
    size_t i = n > 0 && (p[0] == '-' || p[0] == '+') ? 1 : 0;
    return i < n && resp_digits(p, n, i) == n - i;
}

/* Checks the line of a one-line type; CR and LF were excluded when the line was found. */
static int resp_check_scalar(uint8_t t, const uint8_t *p, size_t n)
{
    int64_t v;
    switch (t) {
    case ':':
        return resp_parse_int(p, n, &v);
    case '#':
        return n == 1 && (p[0] == 't' || p[0] == 'f') ? RESP_OK : RESP_E_VALUE;
    case '_':
        return n == 0 ? RESP_OK : RESP_E_VALUE;
    case ',':
        return resp_is_double(p, n) ? RESP_OK : RESP_E_VALUE;
    case '(':
        return resp_is_bignum(p, n) ? RESP_OK : RESP_E_VALUE;
    default:
        return RESP_OK;
    }
}

/* ---- inline commands ----------------------------------------------------------------------- */

/* Where an unquoted word's decoded bytes go (resp_view_copy()); NULL when only scanning. */
struct resp_sink {
    uint8_t *out;
    size_t cap;
    size_t n;
};

static void resp_emit(struct resp_sink *s, uint8_t c)
{
    if (s == NULL)
        return;
    if (s->n < s->cap)
        s->out[s->n] = c;
    s->n++;
}

/* The byte at i of p[0..n), or 0 past the end: sdssplitargs() reads a NUL-terminated string. */
static uint8_t resp_at(const uint8_t *p, size_t n, size_t i)
{
    return i < n ? p[i] : 0;
}

static int resp_hex(uint8_t c)
{
    if (resp_is_digit(c))
        return c - '0';
    c = resp_lower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static uint8_t resp_unescape(uint8_t c)
{
    switch (c) {
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    case 'b':
        return '\b';
    case 'a':
        return '\a';
    default:
        return c;
    }
}

/* Inside "...": consumes one character or escape at *i.  Returns 1 to go on, 0 at the closing
 * quote (consumed), or RESP_E_INLINE_QUOTES. */
static int resp_dquoted(const uint8_t *p, size_t n, size_t *i, struct resp_sink *sink)
{
    uint8_t c = resp_at(p, n, *i), c1 = resp_at(p, n, *i + 1);
    if (c == '\\' && c1 == 'x' && resp_hex(resp_at(p, n, *i + 2)) >= 0 &&
        resp_hex(resp_at(p, n, *i + 3)) >= 0) {
        resp_emit(sink, (uint8_t)(resp_hex(p[*i + 2]) * 16 + resp_hex(p[*i + 3])));
        *i += 4;
    } else if (c == '\\' && c1 != 0) {
        resp_emit(sink, resp_unescape(c1));
        *i += 2;
    } else if (c == '"') {
        /* The closing quote must be followed by a space or nothing at all. */
        if (c1 != 0 && !resp_is_space(c1))
            return RESP_E_INLINE_QUOTES;
        *i += 1;
        return 0;
    } else if (c == 0) {
        return RESP_E_INLINE_QUOTES;
    } else {
        resp_emit(sink, c);
        *i += 1;
    }
    return 1;
}

/* Inside '...': only \' is an escape. */
static int resp_squoted(const uint8_t *p, size_t n, size_t *i, struct resp_sink *sink)
{
    uint8_t c = resp_at(p, n, *i), c1 = resp_at(p, n, *i + 1);
    if (c == '\\' && c1 == '\'') {
        resp_emit(sink, '\'');
        *i += 2;
    } else if (c == '\'') {
        if (c1 != 0 && !resp_is_space(c1))
            return RESP_E_INLINE_QUOTES;
        *i += 1;
        return 0;
    } else if (c == 0) {
        return RESP_E_INLINE_QUOTES;
    } else {
        resp_emit(sink, c);
        *i += 1;
    }
    return 1;
}

/*
 * The next word of the inline line p[0..n) from *pos, split as Redis' sdssplitargs() does:
 * words are separated by spaces; "..." (with \xHH, \n, \r, \t, \b, \a, \<c> escapes) and '...'
 * (with \') quote, and may start mid-word; a NUL byte ends the line.  Returns 1 with *v set to the
 * raw word (offsets in p), 0 after the last word, or RESP_E_INLINE_QUOTES.
 */
static int resp_inline_word(const uint8_t *p, size_t n, size_t *pos, struct resp_view *v,
                            struct resp_sink *sink)
{
    size_t i = *pos;
    while (i < n && p[i] != 0 && resp_is_space(p[i]))
        i++;
    if (resp_at(p, n, i) == 0) {
        *pos = n;
        return 0;
    }
    memset(v, 0, sizeof(*v));
    v->type = RESP_TYPE_INLINE;
    v->off = i;
    int quote = 0, rc;
    for (;;) {
        if (quote != 0) {
            rc = quote == '"' ? resp_dquoted(p, n, &i, sink) : resp_squoted(p, n, &i, sink);
            if (rc < 0)
                return rc;
            if (rc == 0)
                break;
            continue;
        }
        uint8_t c = resp_at(p, n, i);
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == 0)
            break;
        if (c == '"' || c == '\'') {
            quote = c;
            v->quoted = true;
        } else {
            resp_emit(sink, c);
        }
        i++;
    }
    v->len = i - v->off;
    *pos = i;
    return 1;
}

/* ---- scanner ------------------------------------------------------------------------------- */

void resp_scanner_init(struct resp_scanner *sc, enum resp_side side)
{
    memset(sc, 0, sizeof(*sc));
    sc->side = side;
    sc->max_bulk = RESP_MAX_BULK;
    sc->max_elements = RESP_MAX_ELEMENTS;
    sc->max_depth = RESP_MAX_DEPTH;
    sc->max_line = RESP_MAX_LINE;
    sc->max_inline = RESP_INLINE_MAX;
}

/* Views of cur.elem[] a message may have filled: every view is filed after
 * the count that bounds it (resp_record, resp_scan_inline). */
static size_t resp_views_used(const struct resp_msg *m)
{
    return m->nelem < RESP_MSG_VIEWS ? (size_t)m->nelem : RESP_MSG_VIEWS;
}

/* Forgets the current message's progress; limits and the sticky error stay.
 * Back to a message boundary.  Runs once per message, so it clears what a
 * message can have set and not the whole struct (about 1.5 KiB): the stack
 * is written by every push before it is read, and cur.elem[] only as far
 * as the last message filled it. */
static void resp_restart(struct resp_scanner *sc)
{
    size_t used = resp_views_used(&sc->cur);
    size_t from = offsetof(struct resp_scanner, started);
    memset((uint8_t *)sc + from, 0, offsetof(struct resp_scanner, stack) - from);
    memset(sc->cur.elem, 0, used * sizeof(sc->cur.elem[0]));
    memset(&sc->cur, 0, offsetof(struct resp_msg, elem));
}

void resp_scanner_reset(struct resp_scanner *sc)
{
    /* After an error views may have been filed past nelem (an inline line
     * whose words failed): clear them all, this is not the per-message path. */
    memset(sc->cur.elem, 0, sizeof(sc->cur.elem));
    resp_restart(sc);
    sc->err = RESP_OK;
}

/*
 * Finds the CRLF ending the line whose content starts at `from`.  Returns 1 with *eol at the CR,
 * 0 when the line is not complete yet (the search resumes at sc->scan_from), RESP_E_LINE_END for
 * a CR not followed by LF or an LF not preceded by CR, or too_long once the content exceeds max.
 */
static int resp_find_eol(struct resp_scanner *sc, const uint8_t *buf, size_t len, size_t from,
                         size_t max, int too_long, size_t *eol)
{
    size_t i = sc->scan_from > from ? sc->scan_from : from;
    for (; i < len; i++) {
        uint8_t c = buf[i];
        if (c == '\r') {
            if (i + 1 == len)
                break;
            if (buf[i + 1] != '\n')
                return RESP_E_LINE_END;
            sc->scan_from = 0;
            *eol = i;
            return 1;
        }
        if (c == '\n')
            return RESP_E_LINE_END;
        if (i - from >= max)
            return too_long;
    }
    sc->scan_from = i;
    return 0;
}

/* Files the view of a value that starts at depth sc->depth: the message's own value at depth 0,
 * an element of the top-level aggregate at depth 1.  Attributes are not values. */
static void resp_record(struct resp_scanner *sc, const struct resp_view *v, size_t start)
{
    struct resp_msg *m = &sc->cur;
    if (v->type == '|') {
        if (sc->depth == 0)
            m->attribute = true;
        return;
    }
    if (sc->depth == 0) {
        m->type = v->type;
        m->body = start;
        m->value = *v;
        m->null = v->null;
        m->push = v->type == '>';
        m->nelem = resp_class_of(v->type) == RESP_C_AGG ? v->count : 0;
    } else if (sc->depth == 1 && sc->stack[0].type != '|') {
        uint64_t i = sc->stack[0].count - sc->stack[0].left;
        if (i < RESP_MSG_VIEWS)
            m->elem[i] = *v;
    }
}

/* A value is complete: count it against the open aggregates, closing those it completes.  An
 * attribute, once complete, is not a value: the value it decorates follows. */
static int resp_value_done(struct resp_scanner *sc)
{
    while (sc->depth > 0) {
        struct resp_level *top = &sc->stack[sc->depth - 1];
        if (--top->left > 0)
            return 1;
        sc->depth--;
        if (top->type == '|')
            return 1;
    }
    sc->done = true;
    return 1;
}

/* A $ = ! header: a null, or the start of a payload to wait for. */
static int resp_blob_header(struct resp_scanner *sc, struct resp_view *v, const uint8_t *line,
                            size_t n, size_t start)
{
    int64_t len;
    if (resp_parse_int(line, n, &len) < 0)
        return RESP_E_INTEGER;
    if (len == -1 && v->type == '$' && sc->side == RESP_SIDE_SERVER) {
        v->null = true;
        v->off = start;
        resp_record(sc, v, start);
        return resp_value_done(sc);
    }
    if (len < 0)
        return RESP_E_LENGTH;
    if ((uint64_t)len > sc->max_bulk || (uint64_t)len > SIZE_MAX - 2 - sc->pos)
        return RESP_E_BULK_TOO_LONG;
    if (v->type == '=' && len < 4)
        return RESP_E_VALUE;
    v->off = sc->pos;
    v->len = (size_t)len;
    resp_record(sc, v, start);
    sc->in_bulk = true;
    sc->bulk_type = v->type;
    sc->bulk_off = sc->pos;
    sc->bulk_end = sc->pos + (size_t)len;
    return 1;
}

/* Waits for the payload of the current bulk and its CRLF, checking the CRLF as it arrives. */
static int resp_blob_body(struct resp_scanner *sc, const uint8_t *buf, size_t len)
{
    size_t end = sc->bulk_end;
    if (len > end && buf[end] != '\r')
        return RESP_E_BULK_END;
    if (len > end + 1 && buf[end + 1] != '\n')
        return RESP_E_BULK_END;
    if (len < end + 2)
        return 0;
    /* Verbatim: "txt:" or "mkd:" then the text (hiredis checks the same). */
    if (sc->bulk_type == '=' && buf[sc->bulk_off + 3] != ':')
        return RESP_E_VALUE;
    sc->in_bulk = false;
    sc->pos = end + 2;
    return resp_value_done(sc);
}

/* A * % ~ > | header: a null array, an empty aggregate, or a level to open. */
static int resp_agg_header(struct resp_scanner *sc, struct resp_view *v, const uint8_t *line,
                           size_t n, size_t start)
{
    int64_t count;
    if (resp_parse_int(line, n, &count) < 0)
        return RESP_E_INTEGER;
    v->off = start;
    /* A client's negative count at the top is an empty command to Redis, as
     * *-1 (processMultibulkBuffer(): ll <= 0 reads nothing): the rest of the
     * pipeline goes on being parsed.  A server's count below -1 is an error. */
    bool client_top = sc->side == RESP_SIDE_CLIENT && sc->depth == 0;
    if (v->type == '*' && (count == -1 || (count < 0 && client_top))) {
        v->null = true;
        resp_record(sc, v, start);
        return resp_value_done(sc);
    }
    if (count < 0)
        return RESP_E_LENGTH;
    uint64_t total = (uint64_t)count * (v->type == '%' || v->type == '|' ? 2u : 1u);
    if (total > sc->max_elements)
        return RESP_E_TOO_MANY_ELEMENTS;
    uint32_t max_depth = sc->max_depth < RESP_MAX_DEPTH ? sc->max_depth : RESP_MAX_DEPTH;
    if (sc->depth >= max_depth)
        return RESP_E_TOO_DEEP;
    v->count = total;
    resp_record(sc, v, start);
    if (total == 0)
        return v->type == '|' ? 1 : resp_value_done(sc);
    struct resp_level *lv = &sc->stack[sc->depth++];
    lv->type = v->type;
    lv->count = total;
    lv->left = total;
    return 1;
}

/* Which type bytes may start a value here: any RESP type from a server; bulk strings inside a
 * client's multibulk (whose '*' was seen at the top). */
static int resp_check_type(const struct resp_scanner *sc, uint8_t t)
{
    if (sc->side == RESP_SIDE_CLIENT && sc->depth > 0)
        return t == '$' ? RESP_OK : RESP_E_COMMAND;
    return resp_class_of(t) == RESP_C_BAD ? RESP_E_TYPE : RESP_OK;
}

/* One value header (or a whole one-line value) at sc->pos. */
static int resp_item(struct resp_scanner *sc, const uint8_t *buf, size_t len)
{
    size_t start = sc->pos, eol = 0;
    if (start >= len)
        return 0;
    uint8_t t = buf[start];
    int rc = resp_check_type(sc, t);
    if (rc < 0)
        return rc;
    sc->started = true;
    enum resp_class cls = resp_class_of(t);
    bool number = cls != RESP_C_SCALAR || t == ':';
    rc = resp_find_eol(sc, buf, len, start + 1, number ? RESP_INT_LINE_MAX : sc->max_line,
                       number ? RESP_E_INTEGER : RESP_E_LINE_TOO_LONG, &eol);
    if (rc <= 0)
        return rc;
    const uint8_t *line = buf + start + 1;
    size_t n = eol - start - 1;
    struct resp_view v = {.type = t};
    sc->pos = eol + 2;
    if (cls == RESP_C_BLOB)
        return resp_blob_header(sc, &v, line, n, start);
    if (cls == RESP_C_AGG)
        return resp_agg_header(sc, &v, line, n, start);
    rc = resp_check_scalar(t, line, n);
    if (rc < 0)
        return rc;
    v.off = start + 1;
    v.len = n;
    v.null = t == '_';
    resp_record(sc, &v, start);
    return resp_value_done(sc);
}

static int resp_scan_values(struct resp_scanner *sc, const uint8_t *buf, size_t len)
{
    while (!sc->done) {
        int rc = sc->in_bulk ? resp_blob_body(sc, buf, len) : resp_item(sc, buf, len);
        if (rc <= 0)
            return rc;
    }
    return 1;
}

/* Records the words of a complete inline line buf[0..n). */
static int resp_inline_words(struct resp_scanner *sc, const uint8_t *buf, size_t n)
{
    struct resp_msg *m = &sc->cur;
    struct resp_view v;
    size_t pos = 0;
    uint64_t k = 0;
    int rc;
    while ((rc = resp_inline_word(buf, n, &pos, &v, NULL)) == 1) {
        if (k < RESP_MSG_VIEWS)
            m->elem[k] = v;
        k++;
    }
    if (rc < 0)
        return rc;
    m->type = RESP_TYPE_INLINE;
    m->nelem = k;
    m->value.type = RESP_TYPE_INLINE;
    m->value.len = n;
    m->value.count = k;
    return 1;
}

/* A client's inline command: a line up to LF (a CR before it is dropped), max_inline bytes. */
static int resp_scan_inline(struct resp_scanner *sc, const uint8_t *buf, size_t len)
{
    size_t lim = sc->max_inline > SIZE_MAX - 2 ? SIZE_MAX : sc->max_inline + 2;
    size_t window = len < lim ? len : lim;
    sc->started = true;
    sc->cur.inline_cmd = true;
    const uint8_t *nl = NULL;
    if (sc->pos < window)
        nl = memchr(buf + sc->pos, '\n', window - sc->pos);
    if (nl == NULL) {
        if (len >= lim)
            return RESP_E_INLINE_TOO_LONG;
        sc->pos = window;
        return 0;
    }
    size_t end = (size_t)(nl - buf);
    size_t n = end > 0 && buf[end - 1] == '\r' ? end - 1 : end;
    if (n > sc->max_inline)
        return RESP_E_INLINE_TOO_LONG;
    int rc = resp_inline_words(sc, buf, n);
    if (rc < 0)
        return rc;
    sc->pos = end + 1;
    return 1;
}

/* ---- fast path ------------------------------------------------------------------------------ */

/* A length of 1 to 18 plain digits, no leading zero but "0", ended by CRLF at p[0..):
 * a strict subset of what resp_parse_int() accepts.  Returns the bytes of digits and CRLF, or
 * 0 when the line is anything else (or not all here): the caller leaves it to the state
 * machine. */
static inline size_t resp_fast_len(const uint8_t *p, const uint8_t *end, uint64_t *out)
{
    /* One digit (an argument count, a short word's length) is the most common line, then two
     * (a key's length). */
    if (end - p >= 3 && p[1] == '\r' && p[2] == '\n' && p[0] >= '0' && p[0] <= '9') {
        *out = (uint64_t)(p[0] - '0');
        return 3;
    }
    if (end - p >= 4 && p[2] == '\r' && p[3] == '\n' && p[0] >= '1' && p[0] <= '9' && p[1] >= '0' &&
        p[1] <= '9') {
        *out = (uint64_t)(p[0] - '0') * 10 + (uint64_t)(p[1] - '0');
        return 4;
    }
    uint64_t v = 0;
    size_t i = 0;
    while (p + i < end && p[i] >= '0' && p[i] <= '9' && i < 18) {
        v = v * 10 + (uint64_t)(p[i] - '0');
        i++;
    }
    if (i == 0 || (i > 1 && p[0] == '0') || end - (p + i) < 2 || p[i] != '\r' || p[i + 1] != '\n')
        return 0;
    *out = v;
    return i + 2;
}

size_t resp_len_header(const uint8_t *p, size_t n, uint8_t type, uint64_t *count)
{
    if (n < 4 || p[0] != type)
        return 0;
    size_t k = resp_fast_len(p + 1, p + n, count);
    return k == 0 ? 0 : 1 + k;
}

size_t resp_flat_peek(void *src, size_t off, uint8_t *dst, size_t cap)
{
    const struct resp_flat *f = src;
    if (off >= f->len)
        return 0;
    size_t n = f->len - off < cap ? f->len - off : cap;
    memcpy(dst, f->p + off, n);
    return n;
}

/* A header line resp_len_header() refused: WAIT when it may only be cut short (no line end in
 * it yet: no LF, a CR only as its last byte; shorter than any line it takes; at the end of what
 * is here), else NO (then resp_scan() finds what is wrong as soon as it looks). */
static int line_cut(const uint8_t *hdr, size_t got, size_t pos, size_t n)
{
    const uint8_t *cr = memchr(hdr, '\r', got);
    if (got < RESP_LEN_HEADER_MAX && pos + got == n && memchr(hdr, '\n', got) == NULL &&
        (cr == NULL || cr == hdr + got - 1))
        return RESP_WALK_WAIT;
    return RESP_WALK_NO;
}

int resp_walk(const struct resp_scanner *sc, resp_peek_fn peek, void *src, size_t at, size_t n,
              struct resp_walk *w)
{
    uint8_t hdr[RESP_LEN_HEADER_MAX];
    uint64_t count = 1, blen;
    size_t pos = at, k, got;
    memset(w, 0, sizeof(*w));
    if (n <= at || (got = peek(src, pos, hdr, sizeof(hdr))) == 0)
        return RESP_WALK_NO;
    w->type = hdr[0];
    w->len = n + 1 - at; /* while a header is not all here */
    bool client = sc->side == RESP_SIDE_CLIENT;
    if (hdr[0] == '*') {
        if ((k = resp_len_header(hdr, got, '*', &count)) == 0)
            return line_cut(hdr, got, pos, n);
        if (count == 0 || count > sc->max_elements || count > RESP_WALK_ELEMENTS_MAX ||
            sc->max_depth < 1)
            return RESP_WALK_NO;
        pos += k;
    } else if (client || hdr[0] != '$') {
        return RESP_WALK_NO;
    }
    w->nelem = hdr[0] == '*' ? count : 0; /* as resp_msg counts: a scalar has none */
    for (uint64_t i = 0; i < count; i++) {
        got = pos < n ? peek(src, pos, hdr, sizeof(hdr)) : 0;
        if ((k = resp_len_header(hdr, got, '$', &blen)) == 0) {
            w->len = n + 1 - at;
            return line_cut(hdr, got, pos, n);
        }
        if (blen > sc->max_bulk || blen > SIZE_MAX - 2 - (pos + k))
            return RESP_WALK_NO;
        size_t end = pos + k + (size_t)blen; /* where its CRLF is */
        w->len = end + 2 - at;               /* at least, while more is to come */
        if (client && i == 0 && end <= n) {
            w->name_off = pos + k - at;
            w->name_len = (size_t)blen;
        }
        if (end + 2 > n)
            return RESP_WALK_WAIT;
        uint8_t crlf[2];
        if (peek(src, end, crlf, 2) != 2 || crlf[0] != '\r' || crlf[1] != '\n')
            return RESP_WALK_NO;
        pos = end + 2;
    }
    w->len = pos - at;
    return RESP_WALK_WHOLE;
}

/* The bytes at p as a number in memory order: "$N\r\n" is then one masked compare, and a CRLF
 * one compare, where the bytes took a test each.  (memcpy of a constant folds to an immediate.) */
static inline uint32_t resp_load4(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline uint16_t resp_load2(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The elements of a multibulk of n (1 or more) bulk strings whose header took buf[0..pos), all
 * here: the first `views` of them into view[] as the state machine would fill them.  Returns the
 * message's length, or 0 for anything else. */
static size_t resp_fast_bulks(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                              size_t pos, uint64_t n, struct resp_view *view, size_t views)
{
    const uint8_t *end = buf + len;
    const uint64_t max_bulk = sc->max_bulk; /* not reloaded after each store into view[] */
    const uint32_t one_digit_mask = resp_load4("\xff\x00\xff\xff");
    const uint32_t one_digit = resp_load4("$\0\r\n");
    const uint16_t crlf = resp_load2("\r\n");
    if (n == 0 || n > sc->max_elements || sc->max_depth < 1)
        return 0;
    /* pos <= len throughout: each element ends within buf. */
    for (uint64_t i = 0; i < n; i++) {
        uint64_t blen;
        size_t k;
        if (len - pos < 4)
            return 0;
        unsigned digit = (unsigned)buf[pos + 1] - '0';
        if ((resp_load4(buf + pos) & one_digit_mask) == one_digit && digit <= 9) {
            blen = digit; /* "$3\r\n": a command's name, a short value */
            k = 3;
        } else if (buf[pos] != '$' || (k = resp_fast_len(buf + pos + 1, end, &blen)) == 0) {
            return 0;
        }
        size_t off = pos + 1 + k;
        /* blen has at most 18 digits: blen + 2 cannot wrap. */
        if (blen > max_bulk || len - off < blen + 2 || resp_load2(buf + off + blen) != crlf)
            return 0;
        if (i < views)
            view[i] = (struct resp_view){.off = off, .len = (size_t)blen, .type = '$'};
        pos = off + (size_t)blen + 2;
    }
    return pos;
}

/* A client's multibulk of one or more bulk strings, all here: its length, *n its elements and the
 * first `views` of them into view[]; 0 for anything else. */
static size_t resp_fast_command(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                                uint64_t *n, struct resp_view *view, size_t views)
{
    size_t k;
    if (len < 4 || buf[0] != '*' || (k = resp_fast_len(buf + 1, buf + len, n)) == 0)
        return 0;
    return resp_fast_bulks(sc, buf, len, 1 + k, *n, view, views);
}

size_t resp_scan_command_len(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                             struct resp_view *name)
{
    uint64_t n;
    if (sc->started || sc->err < 0 || sc->side != RESP_SIDE_CLIENT)
        return 0;
    return resp_fast_command(sc, buf, len, &n, name, 1);
}

/* What resp_fast_reply() found: the value's type, view and the message's length. */
struct resp_fast {
    uint8_t type;
    bool null;
    size_t off, vlen; /* the value (simple types) */
    uint64_t count;   /* '*': elements */
    size_t len;
};

/* "+OK\r\n" at buf, whole: SET's reply, and most writes'. */
static inline bool resp_fast_ok(const struct resp_scanner *sc, const uint8_t *buf, size_t len)
{
    return len >= 5 && resp_load4(buf) == resp_load4("+OK\r") && buf[4] == '\n' &&
           sc->max_line >= 3;
}

/* "$-1\r\n" or "*-1\r\n" at buf (buf[1] is '-'), whole: RESP2's nulls (the null "_" of RESP3
 * goes the long way). */
static inline bool resp_fast_null(const uint8_t *buf, size_t len)
{
    return len >= 5 && buf[2] == '1' && resp_load2(buf + 3) == resp_load2("\r\n");
}

/* A bulk string at buf (buf[0] is '$', buf[1] not '-', len >= 4), all here: the message's
 * length, and where its value starts in *off; 0 for anything else. */
static inline size_t resp_fast_bulk(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                                    size_t *off)
{
    uint64_t n;
    size_t k = resp_fast_len(buf + 1, buf + len, &n);
    if (k == 0 || n > sc->max_bulk || n > len - (1 + k) || len - (1 + k) - n < 2 ||
        resp_load2(buf + 1 + k + n) != resp_load2("\r\n"))
        return 0;
    *off = 1 + k;
    return 1 + k + (size_t)n + 2;
}

/* A server's bulk string, null ($-1, *-1), simple string, error, integer or array of bulk
 * strings, whole in buf: *f, and the first `views` elements of an array into view[]; 1, or 0
 * for anything else. */
static int resp_fast_reply(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                           struct resp_fast *f, struct resp_view *view, size_t views)
{
    const uint8_t *end = buf + len;
    uint64_t n;
    size_t k;
    if (len < 4)
        return 0;
    f->type = buf[0];
    f->null = false;
    f->count = 0;
    switch (buf[0]) {
    case '$': {
        if (buf[1] == '-')
            goto null;
        size_t off, total = resp_fast_bulk(sc, buf, len, &off);
        if (total == 0)
            return 0;
        f->off = off;
        f->vlen = total - off - 2;
        f->len = total;
        return 1;
    }
    case '*':
        if (buf[1] == '-')
            goto null;
        if ((k = resp_fast_len(buf + 1, end, &n)) == 0 ||
            (f->len = resp_fast_bulks(sc, buf, len, 1 + k, n, view, views)) == 0)
            return 0;
        f->off = 0;
        f->vlen = 0;
        f->count = n;
        return 1;
    case '+':
    case '-': {
        if (resp_fast_ok(sc, buf, len)) {
            f->off = 1;
            f->vlen = 2;
            f->len = 5;
            return 1;
        }
        /* Short lines ("+QUEUED", errors): a loop beats two memchr calls. */
        size_t max = sc->max_line < len - 1 ? sc->max_line : len - 1;
        size_t i = 1;
        while (i <= max && buf[i] != '\r' && buf[i] != '\n')
            i++;
        if (i > max || buf[i] != '\r' || i + 1 >= len || buf[i + 1] != '\n')
            return 0;
        f->off = 1;
        f->vlen = i - 1;
        f->len = i + 2;
        return 1;
    }
    case ':': {
        size_t i = 1;
        while (i < len && i <= RESP_INT_LINE_MAX && buf[i] != '\r')
            i++;
        int64_t v;
        if (i + 1 >= len || buf[i] != '\r' || buf[i + 1] != '\n' ||
            resp_parse_int(buf + 1, i - 1, &v) != RESP_OK)
            return 0;
        f->off = 1;
        f->vlen = i - 1;
        f->len = i + 2;
        return 1;
    }
    default:
        return 0;
    }
null:
    if (!resp_fast_null(buf, len))
        return 0;
    f->null = true;
    f->off = 0;
    f->vlen = 0;
    f->len = 5;
    return 1;
}

/*
 * The common messages, whole in buf, scanned in one pass with no state: a client's multibulk of
 * one or more bulk strings; a server's bulk string, null ($-1, *-1), simple string, error,
 * integer, or array of bulk strings.  Fills *out exactly as resp_scan_values() would and returns
 * 1; returns 0 for anything else (other types, nested arrays, a message not all here, limits
 * approached), which the state machine then scans from the start.  Runs once per message before
 * the state machine, so it must be cheap to refuse.  fuzz_resp compares the two view by view.
 */
static int resp_scan_fast(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                          struct resp_msg *out)
{
    if (len < 4)
        return 0;
    memset(out, 0, offsetof(struct resp_msg, elem) + 3 * sizeof(out->elem[0]));
    if (sc->side == RESP_SIDE_CLIENT) {
        uint64_t n;
        size_t total = resp_fast_command(sc, buf, len, &n, out->elem, RESP_MSG_VIEWS);
        if (total == 0)
            return 0;
        out->type = '*';
        out->nelem = n;
        out->value = (struct resp_view){.off = 0, .count = n, .type = '*'};
        out->len = total;
        return 1;
    }
    struct resp_fast f;
    if (resp_fast_reply(sc, buf, len, &f, out->elem, RESP_MSG_VIEWS) == 0)
        return 0;
    out->type = f.type;
    out->null = f.null;
    out->nelem = f.count;
    out->value = (struct resp_view){
        .off = f.off, .len = f.vlen, .count = f.count, .type = f.type, .null = f.null};
    out->len = f.len;
    return 1;
}

size_t resp_scan_reply_len(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                           uint8_t *type)
{
    struct resp_fast f;
    if (sc->started || sc->err < 0 || sc->side != RESP_SIDE_SERVER)
        return 0;
    if (len >= 5 && buf[0] == '$') {
        /* A bulk string or its null (a GET's reply), measured as resp_fast_reply() does,
         * without its struct: the most common reply of a pipeline. */
        size_t off, total;
        if (buf[1] == '-')
            total = resp_fast_null(buf, len) ? 5 : 0;
        else
            total = resp_fast_bulk(sc, buf, len, &off);
        *type = '$';
        return total;
    }
    if (resp_fast_ok(sc, buf, len)) {
        *type = '+';
        return 5;
    }
    if (resp_fast_reply(sc, buf, len, &f, NULL, 0) == 0)
        return 0;
    *type = f.type;
    return f.len;
}

int resp_scan(struct resp_scanner *sc, const uint8_t *buf, size_t len, struct resp_msg *out)
{
    if (sc->err < 0)
        return sc->err;
    if (!sc->started && resp_scan_fast(sc, buf, len, out) == 1)
        return 1;
    if (len < sc->pos)
        resp_restart(sc);
    int rc;
    if (sc->side == RESP_SIDE_CLIENT &&
        (sc->cur.inline_cmd || (!sc->started && len > 0 && buf[0] != '*')))
        rc = resp_scan_inline(sc, buf, len);
    else
        rc = resp_scan_values(sc, buf, len);
    if (rc < 0) {
        sc->err = rc;
        return rc;
    }
    if (rc == 0) {
        memset(out, 0, offsetof(struct resp_msg, elem));
        out->len = sc->in_bulk ? sc->bulk_end + 2 : len + 1;
        out->type = sc->cur.type; /* once its header is read: a caller may pass it on early */
        out->push = sc->cur.push;
        out->attribute = sc->cur.attribute;
        return 0;
    }
    /* The header and the views filled (at least three, zeros past nelem,
     * for callers that look at the first words before checking nelem);
     * the rest of out->elem[] is left as it was. */
    size_t views = resp_views_used(&sc->cur);
    memcpy(out, &sc->cur,
           offsetof(struct resp_msg, elem) + (views < 3 ? 3 : views) * sizeof(sc->cur.elem[0]));
    out->len = sc->pos;
    resp_restart(sc);
    return 1;
}

/* ---- streaming a long message -------------------------------------------------------------- */

size_t resp_scan_releasable(const struct resp_scanner *sc, size_t len)
{
    if (sc->err < 0 || !sc->started || sc->done || sc->side != RESP_SIDE_SERVER)
        return 0;
    if (!sc->in_bulk)
        return sc->pos; /* the values and headers before the item being read */
    /* A verbatim string's "txt:" is checked at its end: kept until then. */
    if (sc->bulk_type == '=')
        return sc->bulk_off;
    return len < sc->bulk_end ? len : sc->bulk_end; /* its CRLF is checked as it comes */
}

/* An offset into the message, n bytes of its start gone. */
static size_t resp_rebase(size_t off, size_t n)
{
    return off > n ? off - n : 0;
}

void resp_scan_release(struct resp_scanner *sc, size_t n)
{
    if (n == 0)
        return;
    sc->pos = resp_rebase(sc->pos, n);
    sc->scan_from = resp_rebase(sc->scan_from, n);
    sc->bulk_off = resp_rebase(sc->bulk_off, n);
    sc->bulk_end = resp_rebase(sc->bulk_end, n);
}

/* ---- re-reading a scanned message ---------------------------------------------------------- */

/* One value header of a complete message, re-read without trusting it. */
struct resp_hdr {
    uint8_t type;
    size_t line; /* offset of the line after the type byte */
    size_t n;    /* its length */
    int64_t num; /* blob length or aggregate count */
    size_t next; /* offset after the header, and after the payload of a blob */
};

static int resp_hdr_read(const uint8_t *buf, size_t len, size_t pos, struct resp_hdr *h)
{
    if (len < 3 || pos > len - 3)
        return RESP_E_MISMATCH;
    h->type = buf[pos];
    h->line = pos + 1;
    const uint8_t *cr = memchr(buf + h->line, '\r', len - h->line);
    if (cr == NULL || cr + 1 == buf + len || cr[1] != '\n')
        return RESP_E_MISMATCH;
    h->n = (size_t)(cr - (buf + h->line));
    h->next = h->line + h->n + 2;
    h->num = 0;
    enum resp_class cls = resp_class_of(h->type);
    if (cls == RESP_C_BAD)
        return RESP_E_MISMATCH;
    if (cls == RESP_C_SCALAR)
        return RESP_OK;
    if (resp_parse_int(buf + h->line, h->n, &h->num) < 0 || h->num < -1)
        return RESP_E_MISMATCH;
    if (cls == RESP_C_BLOB && h->num >= 0) {
        size_t rest = len - h->next;
        if ((uint64_t)h->num > rest || rest - (size_t)h->num < 2)
            return RESP_E_MISMATCH;
        h->next += (size_t)h->num + 2;
    }
    return RESP_OK;
}

static void resp_hdr_view(const struct resp_hdr *h, size_t start, struct resp_view *v)
{
    memset(v, 0, sizeof(*v));
    v->type = h->type;
    switch (resp_class_of(h->type)) {
    case RESP_C_BLOB:
        v->null = h->num < 0;
        v->off = v->null ? start : h->line + h->n + 2;
        v->len = v->null ? 0 : (size_t)h->num;
        break;
    case RESP_C_AGG:
        v->null = h->num < 0;
        v->off = start;
        if (!v->null)
            v->count = (uint64_t)h->num * (h->type == '%' || h->type == '|' ? 2u : 1u);
        break;
    default:
        v->off = h->line;
        v->len = h->n;
        v->null = h->type == '_';
        break;
    }
}

/* Steps over `need` values (with their attributes and nested values) from *pos. */
static int resp_skip_values(const uint8_t *buf, size_t len, size_t *pos, uint64_t need)
{
    while (need > 0) {
        struct resp_hdr h;
        int rc = resp_hdr_read(buf, len, *pos, &h);
        if (rc < 0)
            return rc;
        *pos = h.next;
        if (resp_class_of(h.type) == RESP_C_AGG && h.num > 0) {
            uint64_t k = (uint64_t)h.num * (h.type == '%' || h.type == '|' ? 2u : 1u);
            if (k > len) /* every value takes at least 3 bytes */
                return RESP_E_MISMATCH;
            need += k;
        }
        if (h.type != '|')
            need--;
    }
    return RESP_OK;
}

void resp_args_init(struct resp_args *it, const uint8_t *buf, const struct resp_msg *m)
{
    memset(it, 0, sizeof(*it));
    it->buf = buf;
    it->len = m->len;
    it->left = m->nelem;
    if (m->inline_cmd) {
        it->inline_cmd = true;
        it->end = m->value.len <= m->len ? m->value.len : 0;
        return;
    }
    if (it->left == 0)
        return;
    struct resp_hdr h;
    it->err = resp_hdr_read(buf, m->len, m->body, &h);
    if (it->err == RESP_OK)
        it->pos = h.next;
}

int resp_args_next(struct resp_args *it, struct resp_view *v)
{
    if (it->err < 0)
        return it->err;
    if (it->left == 0)
        return 0;
    if (it->inline_cmd) {
        if (resp_inline_word(it->buf, it->end, &it->pos, v, NULL) != 1)
            return it->err = RESP_E_MISMATCH;
        it->left--;
        return 1;
    }
    struct resp_hdr h;
    for (;;) {
        it->err = resp_hdr_read(it->buf, it->len, it->pos, &h);
        if (it->err < 0)
            return it->err;
        if (h.type != '|')
            break;
        size_t after = h.next;
        it->err = resp_skip_values(it->buf, it->len, &after, (uint64_t)(h.num < 0 ? 0 : h.num) * 2);
        if (it->err < 0)
            return it->err;
        it->pos = after;
    }
    resp_hdr_view(&h, it->pos, v);
    it->err = resp_skip_values(it->buf, it->len, &it->pos, 1);
    if (it->err < 0)
        return it->err;
    it->left--;
    return 1;
}

/* ---- views --------------------------------------------------------------------------------- */

int resp_view_copy(const uint8_t *buf, size_t len, const struct resp_view *v, uint8_t *out,
                   size_t cap)
{
    if (v->off > len || v->len > len - v->off)
        return RESP_E_MISMATCH;
    if (v->null || resp_class_of(v->type) == RESP_C_AGG)
        return 0;
    if (v->len > INT_MAX)
        return RESP_E_BUFFER;
    if (v->type == RESP_TYPE_INLINE && v->quoted) {
        struct resp_sink sink = {out, cap, 0};
        struct resp_view w;
        size_t pos = 0;
        if (resp_inline_word(buf + v->off, v->len, &pos, &w, &sink) != 1)
            return RESP_E_MISMATCH;
        return (int)sink.n;
    }
    if (v->len > 0 && cap > 0)
        memcpy(out, buf + v->off, v->len < cap ? v->len : cap);
    return (int)v->len;
}

bool resp_view_equals(const uint8_t *buf, size_t len, const struct resp_view *v, const char *s)
{
    uint8_t tmp[64];
    size_t n = strlen(s);
    if (n > sizeof(tmp) || v->null)
        return false;
    int rc = resp_view_copy(buf, len, v, tmp, sizeof(tmp));
    if (rc < 0 || (size_t)rc != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (resp_lower(tmp[i]) != resp_lower((uint8_t)s[i]))
            return false;
    return true;
}

int resp_view_int(const uint8_t *buf, size_t len, const struct resp_view *v, int64_t *out)
{
    uint8_t tmp[RESP_INT_LINE_MAX];
    if (v->null || resp_class_of(v->type) == RESP_C_AGG)
        return RESP_E_INTEGER;
    int rc = resp_view_copy(buf, len, v, tmp, sizeof(tmp));
    if (rc < 0 || (size_t)rc > sizeof(tmp))
        return RESP_E_INTEGER;
    return resp_parse_int(tmp, (size_t)rc, out);
}
