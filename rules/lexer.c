/*
 * lexer.c - turns configuration text into tokens with positions.
 *
 * A string is scanned twice: once to find where it ends (its closing quote,
 * or the newline / end of file that makes it unterminated), then again to
 * decode it into a buffer no longer than the raw text.
 */
#include "rules/lexer.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"

#include <stdlib.h>
#include <string.h>

/* The UTF-8 byte order mark, skipped at the start of the text. */
#define CONF_BOM "\xef\xbb\xbf"
#define CONF_BOM_LEN 3

void conf_lexer_init(struct conf_lexer *lx, const char *text, size_t len, struct conf_diags *diags)
{
    lx->pos = text;
    lx->end = text + len;
    /* Editors on Windows may start the file with a UTF-8 byte order mark. */
    if (len >= CONF_BOM_LEN && memcmp(text, CONF_BOM, CONF_BOM_LEN) == 0) {
        lx->pos += CONF_BOM_LEN;
    }
    lx->loc = (struct conf_loc){1, 1};
    lx->diags = diags;
}

static bool conf_is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static bool conf_is_word_byte(char c)
{
    return !conf_is_blank(c) && c != '\n' && c != '{' && c != '}' && c != ';' && c != '"' &&
           c != '#' && c != '\0';
}

/* Consume one byte that is not a newline. */
static void conf_lexer_step(struct conf_lexer *lx)
{
    lx->pos++;
    lx->loc.col++;
}

/* A NUL byte would silently cut a word short; say so and skip it. */
static void conf_lexer_nul(struct conf_lexer *lx)
{
    conf_diag_add(lx->diags, CONF_ERROR, lx->loc, NULL, "NUL byte in the configuration");
    conf_lexer_step(lx);
}

/* Skip blanks, NUL bytes and a comment; stop at a token or a newline. */
static void conf_lexer_skip(struct conf_lexer *lx)
{
    while (lx->pos < lx->end) {
        char c = *lx->pos;
        if (conf_is_blank(c)) {
            conf_lexer_step(lx);
        } else if (c == '\0') {
            conf_lexer_nul(lx);
        } else if (c == '#') {
            while (lx->pos < lx->end && *lx->pos != '\n') {
                conf_lexer_step(lx);
            }
        } else {
            return;
        }
    }
}

static int conf_lexer_word(struct conf_lexer *lx, struct conf_token *tok)
{
    const char *start = lx->pos;

    while (lx->pos < lx->end && conf_is_word_byte(*lx->pos)) {
        conf_lexer_step(lx);
    }
    tok->text = conf_mem_strndup(start, (size_t)(lx->pos - start));
    if (tok->text == NULL) {
        conf_diag_oom(lx->diags);
        return -1;
    }
    return 0;
}

/* Decode the escape at lx->pos (a backslash) into *out; returns bytes written.
 * An invalid escape of a byte that is not printable ASCII is not quoted.
 * A backslash just before `stop` ends an unterminated string: it is dropped. */
static size_t conf_lexer_escape(struct conf_lexer *lx, const char *stop, char *out)
{
    struct conf_loc at = lx->loc;
    char c = lx->pos + 1 < stop ? lx->pos[1] : '\0';
    const char *decoded = c == '"'    ? "\""
                          : c == '\\' ? "\\"
                          : c == 'n'  ? "\n"
                          : c == 't'  ? "\t"
                                      : NULL;

    conf_lexer_step(lx);
    if (lx->pos >= stop) {
        return 0;
    }
    conf_lexer_step(lx);
    if (decoded != NULL) {
        *out = *decoded;
        return 1;
    }
    if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f) {
        conf_diag_add(lx->diags, CONF_ERROR, at, "valid escapes are \\\" \\\\ \\n \\t",
                      "invalid escape in string");
    } else {
        conf_diag_add(lx->diags, CONF_ERROR, at, "valid escapes are \\\" \\\\ \\n \\t",
                      "invalid escape '\\%c' in string", c);
    }
    return 0;
}

/* Where the string starting at lx->pos (its opening quote) ends: at its
 * closing quote, or at the newline or end of file that cuts it short. */
static const char *conf_string_end(const struct conf_lexer *lx)
{
    const char *p = lx->pos + 1;

    while (p < lx->end && *p != '"' && *p != '\n') {
        if (*p == '\\' && p + 1 < lx->end && p[1] != '\n') {
            p++;
        }
        p++;
    }
    return p;
}

static int conf_lexer_string(struct conf_lexer *lx, struct conf_token *tok)
{
    const char *stop = conf_string_end(lx);
    size_t n = 0;
    char *buf = conf_mem_alloc((size_t)(stop - lx->pos));

    if (buf == NULL) {
        conf_diag_oom(lx->diags);
        return -1;
    }
    conf_lexer_step(lx); /* the opening quote */
    while (lx->pos < stop) {
        if (*lx->pos == '\\') {
            n += conf_lexer_escape(lx, stop, buf + n);
        } else if (*lx->pos == '\0') {
            conf_lexer_nul(lx);
        } else {
            buf[n++] = *lx->pos;
            conf_lexer_step(lx);
        }
    }
    buf[n] = '\0';
    tok->text = buf;
    if (lx->pos < lx->end && *lx->pos == '"') {
        conf_lexer_step(lx);
    } else {
        conf_diag_add(lx->diags, CONF_ERROR, tok->loc, NULL, "unterminated string");
    }
    return 0;
}

/* Punctuation and newline tokens: a single byte each. */
static bool conf_lexer_punct(struct conf_lexer *lx, struct conf_token *tok)
{
    switch (*lx->pos) {
    case '{':
        tok->kind = CONF_TOK_LBRACE;
        break;
    case '}':
        tok->kind = CONF_TOK_RBRACE;
        break;
    case ';':
        tok->kind = CONF_TOK_SEMI;
        break;
    case '\n':
        tok->kind = CONF_TOK_NEWLINE;
        lx->pos++;
        lx->loc.line++;
        lx->loc.col = 1;
        return true;
    default:
        return false;
    }
    conf_lexer_step(lx);
    return true;
}

int conf_lexer_next(struct conf_lexer *lx, struct conf_token *tok)
{
    const char *before = lx->pos;

    conf_lexer_skip(lx);
    tok->glued = lx->pos == before;
    tok->loc = lx->loc;
    tok->text = NULL;
    if (lx->pos >= lx->end) {
        tok->kind = CONF_TOK_EOF;
        return 0;
    }
    if (conf_lexer_punct(lx, tok)) {
        return 0;
    }
    if (*lx->pos == '"') {
        tok->kind = CONF_TOK_STRING;
        return conf_lexer_string(lx, tok);
    }
    tok->kind = CONF_TOK_WORD;
    return conf_lexer_word(lx, tok);
}
