/*
 * log.h - logfmt lines on stderr.
 *
 * One line per event that matters: `ts=... level=... msg=... key=value ...`.
 * Values that contain spaces, quotes, `=` or control characters are
 * double-quoted with escapes, so every line parses as logfmt.  A line is built
 * in a fixed buffer (struct log_line) and written with a single write(2), so
 * lines from several threads never interleave.
 */
#ifndef TWICE_LOG_H
#define TWICE_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

enum log_level {
    LOG_ERROR = 0,
    LOG_WARN,
    LOG_INFO,
    LOG_DEBUG,
};

/* A longer line is cut (and ends in `truncated=1`). */
#define LOG_LINE_MAX 2048

struct log_line {
    enum log_level level;
    size_t len;
    int truncated;
    char buf[LOG_LINE_MAX];
};

void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Non-zero when a line at `level` would be written. */
int log_enabled(enum log_level level);

/* Start a line with ts, level and msg. */
void log_begin(struct log_line *line, enum log_level level, const char *msg);
/* Append ` key=value`, quoting the value when logfmt needs it.  A NULL value
 * is written as an empty quoted string. */
void log_str(struct log_line *line, const char *key, const char *value);
void log_u64(struct log_line *line, const char *key, uint64_t value);
void log_i64(struct log_line *line, const char *key, int64_t value);
/* Append ` key=value` where the value is printf-formatted, then quoted. */
void log_fmt(struct log_line *line, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Write the line with its newline. */
void log_end(struct log_line *line);

/* Shortcut for a line with only a message and printf-formatted key=value
 * text appended verbatim (the caller quotes). */
void log_msg(enum log_level level, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *log_level_name(enum log_level level);

#endif
