/*
 * log.h - logfmt lines on stderr.
 *
 * One line per event that matters: `ts=... level=... msg=... key=value ...`.
 * Values that contain spaces, quotes, `=` or control characters are
 * double-quoted with escapes, so every line parses as logfmt.  A line is built
 * in a fixed buffer (struct log_line) and written with a single write(2), so
 * lines from several threads never interleave.
 *
 * Lines that can repeat at the rate peers connect (every warning and error,
 * and the lines a caller marks with log_repeat_limit) are limited per key:
 * the msg, listener and reason of the line, not its session id or peer
 * address.  LOG_REPEAT_BURST lines of a key are written per
 * LOG_REPEAT_INTERVAL_MS; the ones past that are held back, and once the
 * interval is over the last of them is written with ` repeated=N`, N being
 * the number of lines it stands for (itself included).  So the lines of a key,
 * counting N for a line with `repeated=N` and 1 for the others, add up to
 * every event.
 */
#ifndef TWICE_LOG_H
#define TWICE_LOG_H

#include <stdarg.h>
#include <stdbool.h>
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

/* Lines of one key written as they come per interval; past that, held back. */
#define LOG_REPEAT_BURST 20
#define LOG_REPEAT_INTERVAL_MS 1000

struct log_line {
    enum log_level level;
    size_t len;
    int truncated;
    int limited; /* subject to the repeat limit */
    char buf[LOG_LINE_MAX];
};

void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Non-zero when a line at `level` would be written. */
int log_enabled(enum log_level level);

/* Start a line with ts, level and msg.  Warnings and errors are limited
 * when they repeat (see above); other levels are not. */
void log_begin(struct log_line *line, enum log_level level, const char *msg);
/* Limit this line when it repeats (on), or write it whatever the rate (off:
 * each of a burst of distinct diagnostics must be seen). */
void log_repeat_limit(struct log_line *line, int on);
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

/* The check of a connection's state machine (a session, a RESP session's client side, an AMQP
 * connection, twice's own Redis connection): whether moves[from] (a bit per state that `from`
 * may go to) has `to`.  A refused move is logged at error level as "WHAT move refused", an
 * allowed one that changes the state at debug level as WHAT, with sid, listener (when not
 * NULL), from and to named by names[]; a refused move fails an assertion in a debug build. */
#define LOG_STATE_BIT(st) (1u << (st))
bool log_state_move(const char *what, uint64_t sid, const char *listener, const unsigned *moves,
                    const char *const *names, unsigned from, unsigned to);

/* Write the `repeated=N` line of every key whose interval is over (all: of
 * every key with lines held back, as at exit).  Called every
 * LOG_REPEAT_INTERVAL_MS by the main loop, so that the count of a storm that
 * stopped is written too.  Thread-safe, like every function here. */
void log_repeat_flush(int all);

/* From now on, libevent's own messages (its warnings, such as "Error from
 * accept() call") are lines of this log: msg=libevent with the text in
 * detail=, at the level libevent gives, limited like any warning.  Without
 * it libevent writes `[warn] ...` to stderr, as often as it likes. */
void log_libevent_install(void);

/* Tests: the clock of the repeat limit, in milliseconds (NULL: the monotonic
 * clock). */
void log_set_clock(uint64_t (*now_ms)(void));

#endif
