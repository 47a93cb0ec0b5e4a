/*
 * resp_plan.h - what a RESP session does with one command or one reply, as data.
 *
 * A framework module (proto/jobs/) reads a command or a reply and writes its plan: the command
 * forwarded, rewritten, answered by twice or held; the reply passed, replaced or held back;
 * commands for twice's own connection to the same Redis, now or later; the connection cut before
 * or after.  The proxy's RESP hook carries a plan out in one place; a unit test reads it.
 *
 * Bytes are gathered in struct resp_bytes, whose allocation failure sticks (like the scanner's
 * errors): a plan whose bytes could not be made says so (resp_plan_oom()), and the host then
 * forwards the frame as it came rather than send half of a rewrite.
 */
#ifndef TWICE_RESP_PLAN_H
#define TWICE_RESP_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing byte string.  Zeroed is empty. */
struct resp_bytes {
    uint8_t *p;
    size_t len, cap;
    bool oom; /* an append failed: the contents are not to be used */
};

void resp_bytes_add(struct resp_bytes *b, const void *p, size_t n);
/* Appends a RESP command of argc arguments (argv[i], lens[i] bytes). */
void resp_bytes_command(struct resp_bytes *b, size_t argc, const char *const *argv,
                        const size_t *lens);
/* Appends a RESP integer reply (":N\r\n"). */
void resp_bytes_int(struct resp_bytes *b, int64_t n);
/* Appends a RESP bulk string reply ("$len\r\n...\r\n"). */
void resp_bytes_bulk(struct resp_bytes *b, const void *p, size_t n);
void resp_bytes_free(struct resp_bytes *b);

/* Commands for twice's own connection: n of them, encoded in cmds, sent ms from now (0: at
 * once). */
struct resp_own {
    struct resp_bytes cmds;
    size_t n;
    uint32_t ms;
};

/* The most groups of own commands one plan carries (by when they are due). */
#define RESP_PLAN_OWN_MAX 3u

/* What becomes of a command. */
enum resp_cmd_fate {
    RESP_CMD_FORWARD, /* to Redis as it came; its reply to the client */
    RESP_CMD_REWRITE, /* .bytes to Redis instead (one command); its reply, plus .reply_add when
                         that is an integer, to the client */
    RESP_CMD_ANSWER,  /* kept from Redis; .bytes (one reply) to the client in its place */
    RESP_CMD_HOLD,    /* not now: the command is read again .hold_ms from now, decided already
                         (the module is called with `decided`) */
    RESP_CMD_CUT,     /* kept from Redis; the connection is cut at its turn (.cut) */
    RESP_CMD_REFUSE,  /* as ANSWER (.bytes: an error); in a transaction, EXEC then aborts, as
                         after Redis refuses a queued command */
    RESP_CMD_DROP,    /* kept from Redis and never answered, nor anything the client sends
                         after it: a hung server */
};

/* What a module reads the reply with: its own kind of reply, and what it keeps of the command
 * until then (owned by the plan, then by the session; freed with the module's free_state). */
struct resp_reply_tag {
    uint8_t kind; /* 0: the reply is not read */
    void *state;
};

struct resp_cmd_plan {
    enum resp_cmd_fate fate;
    struct resp_bytes bytes;
    int64_t reply_add;
    uint32_t hold_ms;
    const void *cut; /* RESP_CMD_CUT: the rule; else, when set, the connection is cut
                        once the command's reply went out (`close after`) */
    struct resp_reply_tag reply;
    struct resp_own own[RESP_PLAN_OWN_MAX];
    size_t n_own;
};

/* What becomes of a reply a module read. */
struct resp_reply_plan {
    bool replace; /* the client gets .bytes instead of the reply */
    struct resp_bytes bytes;
    uint32_t delay_ms; /* the reply (and those behind it) held that long */
    const void *cut;   /* the connection is cut at the reply's turn... */
    bool cut_before;   /* ... without it (else after it went out) */
    struct resp_own own[RESP_PLAN_OWN_MAX];
    size_t n_own;
};

/* Appends one own command to the plan's group that goes out ms from now (made on first use;
 * past RESP_PLAN_OWN_MAX groups, the one due nearest takes it).  False, the plan unchanged,
 * when the command could not be made. */
bool resp_plan_own(struct resp_own *own, size_t *n_own, uint32_t ms, size_t argc,
                   const char *const *argv, const size_t *lens);
/* The same with a command already encoded (bytes[0..n), k commands). */
bool resp_plan_own_raw(struct resp_own *own, size_t *n_own, uint32_t ms, const void *bytes,
                       size_t n, size_t k);

/* Whether any bytes of the plan could not be made. */
bool resp_cmd_plan_oom(const struct resp_cmd_plan *p);
bool resp_reply_plan_oom(const struct resp_reply_plan *p);

/* Frees what the plans hold (not a reply tag's state, which the caller owns once read). */
void resp_cmd_plan_free(struct resp_cmd_plan *p);
void resp_reply_plan_free(struct resp_reply_plan *p);

#endif
