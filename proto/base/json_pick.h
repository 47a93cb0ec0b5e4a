/*
 * json_pick.h - a few values out of a JSON document in one pass, without building the document.
 *
 * The job readers (resp_job.c) want four or five strings out of each job's JSON, twice per job
 * (its push and its delivery), on every job of a listener with a journal or a rule.  jansson,
 * which builds the whole tree (a malloc per value) and reads its input a character at a time
 * through a stream, spent about 74,000 instructions on a 400-byte Sidekiq job: 80% of such a
 * listener's work.  json_pick() checks the document as strictly as jansson's json_loadb() with
 * JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL reads it, and notes where the values at the asked
 * paths are; fuzz_resp_job compares the job readers built on it with jansson's.
 *
 * Pure C over a byte span: no allocation but json_pick_strdup()'s, no recursion.
 */
#ifndef TWICE_JSON_PICK_H
#define TWICE_JSON_PICK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Deepest nesting json_pick() accepts as max_depth (arrays and objects open at once). */
#define JSON_PICK_MAX_DEPTH 128u
/* Paths one call can ask about, and keys per path. */
#define JSON_PICK_MAX_PATHS 32u
#define JSON_PICK_MAX_KEYS 3u
/* Longest key a path may name (bytes). */
#define JSON_PICK_MAX_KEY 32u

/* A value's place: keys[0..n) from the top-level object down (1 <= n <= JSON_PICK_MAX_KEYS,
 * each key 1 to JSON_PICK_MAX_KEY bytes); a NULL key names an array's first element
 * ({"args", NULL, "job_class"} is args[0].job_class). */
struct json_pick_path {
    uint8_t n;
    const char *keys[JSON_PICK_MAX_KEYS];
};

enum json_pick_type {
    JSON_PICK_ABSENT = 0,
    JSON_PICK_STRING,
    JSON_PICK_NUMBER,
    JSON_PICK_TRUE,
    JSON_PICK_FALSE,
    JSON_PICK_NULL,
    JSON_PICK_OBJECT,
    JSON_PICK_ARRAY,
};

/* What stands at a path.  For a string: its bytes between the quotes, as written; for a
 * number: its text, as written. */
struct json_pick_value {
    uint8_t type;    /* enum json_pick_type */
    bool escaped;    /* the string has backslash escapes (json_pick_strdup() decodes them) */
    bool nul;        /* the string holds U+0000 ("\u0000") */
    size_t off, len; /* the string's or number's bytes: json[off..off+len) */
};

/*
 * Reads json[0..len) as one JSON object (RFC 8259; whitespace around it), checked as jansson
 * checks it: strict UTF-8 (no overlong form, no surrogate, nothing past U+10FFFF), escapes
 * well formed and no lone surrogate among them, no NUL in a key, no number beyond a double's
 * range, and at most max_depth (<= JSON_PICK_MAX_DEPTH) arrays and objects open at once.
 * Returns 0 with out[i] the value at paths[i] (n <= JSON_PICK_MAX_PATHS; type
 * JSON_PICK_ABSENT when there is none there; for a key given more than once, its last value,
 * as jansson keeps it), or -1 for anything else (out is then unspecified).  One difference from
 * jansson: its stream loses a NUL byte that directly follows a number or a literal (true,
 * false, null) when it puts back the byte that ended the token, and reads on as if the byte
 * were not there; json_pick() refuses it, as it refuses a NUL byte anywhere else.
 */
int json_pick(const void *json, size_t len, size_t max_depth, const struct json_pick_path *paths,
              size_t n, struct json_pick_value *out);

/* A string value out of the json that json_pick() read, as a malloc'd NUL-terminated copy
 * with its escapes decoded (UTF-8); NULL when v is not a string, when it holds a NUL, or on
 * allocation failure. */
char *json_pick_strdup(const void *json, const struct json_pick_value *v);

#endif
