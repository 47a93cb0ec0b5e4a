/*
 * suggest.c - "did you mean" hints for misspelled keywords and names.
 *
 * Distance is Damerau-Levenshtein in its optimal-string-alignment form:
 * insertions, deletions, substitutions and swaps of two adjacent bytes each
 * cost 1, which catches the usual typos ("upstram", "bnid", "lisen").  A word that is the
 * start of exactly one candidate suggests it too ("bull" for "bullmq").
 */
#include "rules/diag.h"

#include <stdio.h>
#include <string.h>

/* Small words tolerate fewer edits, or every 3-letter word would match. */
#define CONF_SUGGEST_SHORT_LEN 5
/* Shortest start of a word that suggests the one candidate it begins. */
#define CONF_SUGGEST_PREFIX_MIN 3

static size_t conf_min3(size_t a, size_t b, size_t c)
{
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

/* Edit distance between a and b; both at most CONF_SUGGEST_MAX_LEN bytes.
 * Three rolling rows: the swap rule looks two rows back. */
static size_t conf_distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t rows[3][CONF_SUGGEST_MAX_LEN + 1];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];

    for (size_t j = 0; j <= lb; j++) {
        prev[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            cur[j] = conf_min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < cur[j]) {
                cur[j] = prev2[j - 2] + 1;
            }
        }
        size_t *spare = prev2;
        prev2 = prev;
        prev = cur;
        cur = spare;
    }
    return prev[lb];
}

/* The one candidate that `word` begins, when it is long enough to mean something ("bull" for
 * "bullmq"); NULL when none or several do. */
static const char *conf_suggest_prefix(const char *word, size_t len, const char *const *words,
                                       size_t n)
{
    const char *found = NULL;

    if (len < CONF_SUGGEST_PREFIX_MIN) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (strncmp(words[i], word, len) == 0) {
            if (found != NULL) {
                return NULL;
            }
            found = words[i];
        }
    }
    return found;
}

const char *conf_suggest(const char *word, const char *const *words, size_t n)
{
    size_t len = strlen(word);
    size_t limit = len >= CONF_SUGGEST_SHORT_LEN ? 2 : 1;
    const char *best = NULL;
    size_t best_distance = limit + 1;

    if (len == 0 || len > CONF_SUGGEST_MAX_LEN) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t lc = strlen(words[i]);
        if (lc > CONF_SUGGEST_MAX_LEN) {
            continue;
        }
        size_t d = conf_distance(word, len, words[i], lc);
        if (d < best_distance) {
            best = words[i];
            best_distance = d;
        }
    }
    return best != NULL ? best : conf_suggest_prefix(word, len, words, n);
}

const char *conf_hint_suggest(const char *word, const char *const *words, size_t n, char *buf,
                              const char *fallback)
{
    const char *best = conf_suggest(word, words, n);
    char shown[CONF_SHOW_BYTES];

    if (best == NULL) {
        return fallback;
    }
    /* Candidates may be user text too (listener names): quote them safely. */
    snprintf(buf, CONF_HINT_BYTES, "did you mean '%s'?", conf_show(best, shown));
    return buf;
}
