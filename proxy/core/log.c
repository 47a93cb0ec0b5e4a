/*
 * log.c - logfmt lines on stderr.  See log.h.
 *
 * The repeat limit keeps, per key, the count of the current interval and the
 * last line held back, in a small table under one lock.  Only limited lines
 * (warnings, errors, lines a caller marked) take the lock; in a storm most of
 * them end there as a copy into the table instead of a write(2).
 */
#include "proxy/core/log.h"

#include <assert.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Keys tracked at once; when they are all taken, the one seen least recently
 * gives way (its held lines are written first). */
#define LOG_REPEAT_KEYS 32
/* msg, listener and reason as written; keys that differ only past this many
 * bytes share a count. */
#define LOG_KEY_MAX 192

struct repeat_slot {
    size_t key_len; /* 0: free */
    char key[LOG_KEY_MAX];
    uint64_t window_ms; /* start of its current interval */
    uint64_t seen_ms;   /* its last line */
    unsigned written;   /* lines written in the current interval */
    uint64_t held;      /* lines held back since the last one written */
    size_t last_len;
    char last[LOG_LINE_MAX]; /* the last line held back, from " level=" on */
};

static _Atomic int log_level = LOG_INFO;

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static pthread_mutex_t repeat_lock = PTHREAD_MUTEX_INITIALIZER;
static struct repeat_slot repeat_slots[LOG_REPEAT_KEYS];
static uint64_t (*repeat_clock)(void) = monotonic_ms;

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

/* `ts=2026-11-29T09:00:00.123Z` into buf (size 48 or more); returns its length. */
static size_t format_ts(char *buf, size_t size)
{
    struct timeval tv;
    struct tm tm;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(buf, size, "ts=%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, size - n, ".%03dZ", (int)(tv.tv_usec / 1000));
    return n;
}

void log_begin(struct log_line *line, enum log_level level, const char *msg)
{
    char ts[48];
    size_t n = format_ts(ts, sizeof(ts));

    line->level = level;
    line->len = 0;
    line->truncated = 0;
    line->limited = level <= LOG_WARN;
    line_append(line, ts, n);
    log_str(line, "level", log_level_name(level));
    log_str(line, "msg", msg);
}

void log_repeat_limit(struct log_line *line, int on)
{
    line->limited = on;
}

/* One write per line; a short write on a pipe of this size does not happen,
 * and a failed log write must not take the proxy down. */
static void write_line(const char *buf, size_t len)
{
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

/* The value of `key` in the line (a quoted value with its quotes), or NULL.
 * The line is logfmt: keys hold no '=' or space, values are bare or quoted. */
static const char *line_field(const struct log_line *line, const char *key, size_t *len)
{
    const char *p = line->buf, *end = line->buf + line->len;
    size_t klen = strlen(key);
    while (p < end) {
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (eq == NULL)
            return NULL;
        const char *v = eq + 1, *ve = v;
        if (ve < end && *ve == '"') {
            for (ve++; ve < end && *ve != '"'; ve++)
                if (*ve == '\\' && ve + 1 < end)
                    ve++;
            if (ve < end)
                ve++;
        } else {
            while (ve < end && *ve != ' ')
                ve++;
        }
        if ((size_t)(eq - p) == klen && memcmp(p, key, klen) == 0) {
            *len = (size_t)(ve - v);
            return v;
        }
        p = ve + 1;
    }
    return NULL;
}

/* The repeat key of a line: its msg, listener and reason, separated by a
 * byte no value holds. */
static size_t line_key(const struct log_line *line, char key[LOG_KEY_MAX])
{
    static const char *const fields[] = {"msg", "listener", "reason"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        size_t vlen = 0;
        const char *v = line_field(line, fields[i], &vlen);
        if (v != NULL && vlen > LOG_KEY_MAX - 1 - n)
            vlen = LOG_KEY_MAX - 1 - n;
        if (v != NULL)
            memcpy(key + n, v, vlen);
        n += vlen;
        if (n < LOG_KEY_MAX - 1)
            key[n++] = '\x1f';
    }
    return n;
}

/* Write the last line `r` held back, stamped now, with the count of the held
 * lines it stands for. */
static void write_held(struct repeat_slot *r)
{
    char out[LOG_LINE_MAX + 96];
    size_t n = format_ts(out, 48);
    memcpy(out + n, r->last, r->last_len);
    n += r->last_len;
    n +=
        (size_t)snprintf(out + n, sizeof(out) - n, " repeated=%llu\n", (unsigned long long)r->held);
    write_line(out, n);
    r->held = 0;
}

/* The slot of `key`: its own, a free one, or the one seen least recently. */
static struct repeat_slot *repeat_slot(const char *key, size_t key_len, uint64_t now)
{
    struct repeat_slot *oldest = &repeat_slots[0];
    for (size_t i = 0; i < LOG_REPEAT_KEYS; i++) {
        struct repeat_slot *r = &repeat_slots[i];
        if (r->key_len == key_len && memcmp(r->key, key, key_len) == 0)
            return r;
        if (r->key_len == 0 || (oldest->key_len != 0 && r->seen_ms < oldest->seen_ms))
            oldest = r;
    }
    if (oldest->held > 0)
        write_held(oldest);
    memcpy(oldest->key, key, key_len);
    oldest->key_len = key_len;
    oldest->window_ms = now;
    oldest->written = 0;
    return oldest;
}

/* Write a limited line, or hold it back when its key is over the burst. */
static void repeat_filter(struct log_line *line)
{
    char key[LOG_KEY_MAX];
    size_t key_len = line_key(line, key);
    pthread_mutex_lock(&repeat_lock);
    uint64_t now = repeat_clock();
    struct repeat_slot *r = repeat_slot(key, key_len, now);
    if (now - r->window_ms >= LOG_REPEAT_INTERVAL_MS) {
        if (r->held > 0)
            write_held(r);
        r->window_ms = now;
        r->written = 0;
    }
    r->seen_ms = now;
    if (r->written < LOG_REPEAT_BURST) {
        r->written++;
        line->buf[line->len++] = '\n';
        write_line(line->buf, line->len);
    } else {
        /* Kept from after the timestamp: the held line is stamped when written. */
        const char *rest = memchr(line->buf, ' ', line->len);
        if (rest == NULL)
            rest = line->buf + line->len;
        r->last_len = line->len - (size_t)(rest - line->buf);
        memcpy(r->last, rest, r->last_len);
        r->held++;
    }
    pthread_mutex_unlock(&repeat_lock);
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
    if (line->limited) {
        repeat_filter(line);
        return;
    }
    line->buf[line->len++] = '\n';
    write_line(line->buf, line->len);
}

void log_repeat_flush(int all)
{
    pthread_mutex_lock(&repeat_lock);
    uint64_t now = repeat_clock();
    for (size_t i = 0; i < LOG_REPEAT_KEYS; i++) {
        struct repeat_slot *r = &repeat_slots[i];
        if (r->held > 0 && (all || now - r->window_ms >= LOG_REPEAT_INTERVAL_MS))
            write_held(r);
    }
    pthread_mutex_unlock(&repeat_lock);
}

/* Runs on whichever thread libevent logs from; calls nothing of libevent. */
static void on_libevent_log(int severity, const char *text)
{
    enum log_level level = severity >= EVENT_LOG_ERR    ? LOG_ERROR
                           : severity == EVENT_LOG_WARN ? LOG_WARN
                           : severity == EVENT_LOG_MSG  ? LOG_INFO
                                                        : LOG_DEBUG;
    if (!log_enabled(level))
        return;
    struct log_line line;
    log_begin(&line, level, "libevent");
    log_str(&line, "detail", text);
    log_end(&line);
}

void log_libevent_install(void)
{
    event_set_log_callback(on_libevent_log);
}

void log_set_clock(uint64_t (*now_ms)(void))
{
    pthread_mutex_lock(&repeat_lock);
    repeat_clock = now_ms != NULL ? now_ms : monotonic_ms;
    pthread_mutex_unlock(&repeat_lock);
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

static void log_move(enum log_level level, const char *msg, uint64_t sid, const char *listener,
                     const char *from, const char *to)
{
    struct log_line line;
    log_begin(&line, level, msg);
    log_u64(&line, "sid", sid);
    if (listener != NULL)
        log_str(&line, "listener", listener);
    log_str(&line, "from", from);
    log_str(&line, "to", to);
    log_end(&line);
}

bool log_state_move(const char *what, uint64_t sid, const char *listener, const unsigned *moves,
                    const char *const *names, unsigned from, unsigned to)
{
    if ((moves[from] & LOG_STATE_BIT(to)) == 0) {
        char msg[96];
        snprintf(msg, sizeof(msg), "%s move refused", what);
        log_move(LOG_ERROR, msg, sid, listener, names[from], names[to]);
        assert(!"illegal state move");
        return false;
    }
    if (from != to && log_enabled(LOG_DEBUG))
        log_move(LOG_DEBUG, what, sid, listener, names[from], names[to]);
    return true;
}
