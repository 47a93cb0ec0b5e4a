/*
 * log.c - logfmt lines on stderr.  See log.h.
 */
#include "proxy/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

const char *log_level_name(enum log_level level)
{
    return (unsigned)level < sizeof(level_names) / sizeof(level_names[0]) ? level_names[level]
                                                                          : "unknown";
}

void log_set_level(enum log_level level)
{
    atomic_store(&log_level, (int)level);
}

enum log_level log_get_level(void)
{
    return (enum log_level)atomic_load(&log_level);
}

int log_enabled(enum log_level level)
{
    return (int)level <= atomic_load(&log_level);
}

static void line_append(struct log_line *line, const char *s, size_t n)
{
    /* Keep room for " truncated=1\n". */
    size_t room = sizeof(line->buf) - 16 - line->len;
    if (n > room) {
        n = room;
        line->truncated = 1;
    }
    memcpy(line->buf + line->len, s, n);
    line->len += n;
}

static int needs_quotes(const char *v)
{
    if (*v == '\0')
        return 1;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f)
            return 1;
    }
    return 0;
}

static void append_quoted(struct log_line *line, const char *v)
{
    line_append(line, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            line_append(line, esc, 2);
        } else if (*p == '\n') {
            line_append(line, "\\n", 2);
        } else if (*p < ' ' || *p == 0x7f) {
            int n = snprintf(esc, sizeof(esc), "\\x%02x", *p);
            line_append(line, esc, (size_t)n);
        } else {
            line_append(line, (const char *)p, 1);
        }
    }
    line_append(line, "\"", 1);
}

void log_str(struct log_line *line, const char *key, const char *value)
{
    line_append(line, " ", 1);
    line_append(line, key, strlen(key));
    line_append(line, "=", 1);
    if (value == NULL)
        value = "";
    if (needs_quotes(value))
        append_quoted(line, value);
    else
        line_append(line, value, strlen(value));
}

void log_u64(struct log_line *line, const char *key, uint64_t value)
{
    char num[24];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)value);
    log_str(line, key, num);
}

void log_i64(struct log_line *line, const char *key, int64_t value)
{
    char num[24];
    snprintf(num, sizeof(num), "%lld", (long long)value);
    log_str(line, key, num);
}

void log_fmt(struct log_line *line, const char *key, const char *fmt, ...)
{
    char value[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    log_str(line, key, value);
}

void log_begin(struct log_line *line, enum log_level level, const char *msg)
{
    struct timeval tv;
    struct tm tm;
    char ts[40];

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03dZ", (int)(tv.tv_usec / 1000));

    line->level = level;
    line->len = 0;
    line->truncated = 0;
    line_append(line, "ts=", 3);
    line_append(line, ts, strlen(ts));
    log_str(line, "level", log_level_name(level));
    log_str(line, "msg", msg);
}

void log_end(struct log_line *line)
{
    if (!log_enabled(line->level))
        return; /* below `log-level` */
    if (line->truncated) {
        static const char t[] = " truncated=1";
        memcpy(line->buf + line->len, t, sizeof(t) - 1);
        line->len += sizeof(t) - 1;
    }
    line->buf[line->len++] = '\n';
    /* One write per line; a short write on a pipe of this size does not
     * happen, and a failed log write must not take the proxy down. */
    ssize_t w = write(STDERR_FILENO, line->buf, line->len);
    (void)w;
}

void log_msg(enum log_level level, const char *msg, const char *fmt, ...)
{
    if (!log_enabled(level))
        return;
    struct log_line line;
    log_begin(&line, level, msg);
    if (fmt != NULL && *fmt != '\0') {
        char rest[LOG_LINE_MAX];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(rest, sizeof(rest), fmt, ap);
        va_end(ap);
        if (n > 0) {
            line_append(&line, " ", 1);
            line_append(&line, rest, strlen(rest));
        }
    }
    log_end(&line);
}
