/*
 * resp_pairing.c - which command a Redis reply answers.
 *
 * A connection's commands are executed and answered strictly in order, so a FIFO of the
 * commands sent pairs each reply with the oldest one awaiting it.  What breaks the one-to-one
 * rule is modelled here and nowhere else:
 *   - CLIENT REPLY OFF / SKIP: the server stays silent, so such commands never enter the FIFO
 *     (Redis' resetClient(): SKIP silences the next command, even an empty one);
 *   - MULTI: commands are answered +QUEUED (or an error), and EXEC by one array whose elements
 *     answer them; they stay at the front of the FIFO ("kept") until EXEC/DISCARD/RESET is
 *     answered, so the caller can learn what each element of the EXEC array answers;
 *   - (P|S)(UN)SUBSCRIBE: one confirmation per channel, or, without channels, one per current
 *     subscription (at least one), counted from the confirmations' own counts;
 *   - out-of-band messages: RESP3 pushes, RESP2 pub/sub messages while subscribed, MONITOR lines.
 * Client-side state (MULTI, CLIENT REPLY) advances when a command is passed in; server-side state
 * (subscriptions, protocol version, MONITOR) when a reply is, so the two streams may be fed in any
 * interleaving that keeps each one in order.
 */
#include <string.h>

#include "proto/resp/resp.h"

/* The pub/sub kinds a reply's first element can name beyond the confirmations. */
#define RESP_SUB_MESSAGE 100

/* The commands that change how replies pair, by first letter: most commands (GET, SET, LPUSH...)
 * are ruled out by a switch and their length, without a string compare. */
struct resp_cmd_info {
    const char *name;
    size_t len;
    uint32_t flags;
    uint8_t sub_kind;
};

#define RESP_CMD(s, f, k)                                                                          \
    {                                                                                              \
        s, sizeof(s) - 1, f, k                                                                     \
    }

static const struct resp_cmd_info resp_cmds_b[] = {
    RESP_CMD("BLPOP", RESP_CMD_BLOCKING, 0),    RESP_CMD("BRPOP", RESP_CMD_BLOCKING, 0),
    RESP_CMD("BLMOVE", RESP_CMD_BLOCKING, 0),   RESP_CMD("BRPOPLPUSH", RESP_CMD_BLOCKING, 0),
    RESP_CMD("BLMPOP", RESP_CMD_BLOCKING, 0),   RESP_CMD("BZPOPMIN", RESP_CMD_BLOCKING, 0),
    RESP_CMD("BZPOPMAX", RESP_CMD_BLOCKING, 0), RESP_CMD("BZMPOP", RESP_CMD_BLOCKING, 0),
};
static const struct resp_cmd_info resp_cmds_d[] = {RESP_CMD("DISCARD", RESP_CMD_DISCARD, 0)};
static const struct resp_cmd_info resp_cmds_e[] = {RESP_CMD("EXEC", RESP_CMD_EXEC, 0)};
static const struct resp_cmd_info resp_cmds_h[] = {RESP_CMD("HELLO", RESP_CMD_HELLO, 0)};
static const struct resp_cmd_info resp_cmds_m[] = {
    RESP_CMD("MULTI", RESP_CMD_MULTI, 0),
    RESP_CMD("MONITOR", RESP_CMD_MONITOR, 0),
};
static const struct resp_cmd_info resp_cmds_p[] = {
    RESP_CMD("PSYNC", RESP_CMD_SYNC, 0),
    RESP_CMD("PSUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_PSUBSCRIBE),
    RESP_CMD("PUNSUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_PUNSUBSCRIBE),
};
static const struct resp_cmd_info resp_cmds_q[] = {RESP_CMD("QUIT", RESP_CMD_QUIT, 0)};
static const struct resp_cmd_info resp_cmds_r[] = {RESP_CMD("RESET", RESP_CMD_RESET, 0)};
static const struct resp_cmd_info resp_cmds_s[] = {
    RESP_CMD("SYNC", RESP_CMD_SYNC, 0),
    RESP_CMD("SUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_SUBSCRIBE),
    RESP_CMD("SSUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_SSUBSCRIBE),
    RESP_CMD("SUNSUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_SUNSUBSCRIBE),
};
static const struct resp_cmd_info resp_cmds_u[] = {
    RESP_CMD("UNSUBSCRIBE", RESP_CMD_SUBSCRIBE, RESP_SUB_UNSUBSCRIBE),
};
static const struct resp_cmd_info resp_cmds_w[] = {
    RESP_CMD("WAIT", RESP_CMD_BLOCKING, 0),
    RESP_CMD("WAITAOF", RESP_CMD_BLOCKING, 0),
};

#define RESP_CMDS(a) (*n = sizeof(a) / sizeof(a[0]), a)

/* The names of the table that start with `letter`: *n of them. */
static const struct resp_cmd_info *resp_cmds_of(char letter, size_t *n)
{
    switch (letter) {
    case 'B':
        return RESP_CMDS(resp_cmds_b);
    case 'D':
        return RESP_CMDS(resp_cmds_d);
    case 'E':
        return RESP_CMDS(resp_cmds_e);
    case 'H':
        return RESP_CMDS(resp_cmds_h);
    case 'M':
        return RESP_CMDS(resp_cmds_m);
    case 'P':
        return RESP_CMDS(resp_cmds_p);
    case 'Q':
        return RESP_CMDS(resp_cmds_q);
    case 'R':
        return RESP_CMDS(resp_cmds_r);
    case 'S':
        return RESP_CMDS(resp_cmds_s);
    case 'U':
        return RESP_CMDS(resp_cmds_u);
    case 'W':
        return RESP_CMDS(resp_cmds_w);
    default:
        *n = 0;
        return NULL;
    }
}

/* The table's entry for an upper-cased name len bytes long, or NULL. */
static const struct resp_cmd_info *resp_cmd_find_n(const char *name, size_t len)
{
    size_t n;
    const struct resp_cmd_info *t = resp_cmds_of(name[0], &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].len == len && memcmp(t[i].name, name, len) == 0)
            return &t[i];
    return NULL;
}

static const struct resp_cmd_info *resp_cmd_find(const char *name)
{
    return resp_cmd_find_n(name, strlen(name));
}

/* By first letter, the lengths of the names that start with it in the table, with CLIENT, XREAD
 * and XREADGROUP: bit L for a name L bytes long.  Most commands (GET, INCR, LPUSH...) start with
 * another letter, and SET or SADD are ruled out by their length: one bit test each, no compare.
 * resp_cmd_table_ok() checks it against the table. */
#define RESP_LEN_BIT(l) (1u << (l))
static const uint32_t resp_special_lens[26] = {
    ['B' - 'A'] = RESP_LEN_BIT(5) | RESP_LEN_BIT(6) | RESP_LEN_BIT(8) | RESP_LEN_BIT(10),
    ['C' - 'A'] = RESP_LEN_BIT(6),
    ['D' - 'A'] = RESP_LEN_BIT(7),
    ['E' - 'A'] = RESP_LEN_BIT(4),
    ['H' - 'A'] = RESP_LEN_BIT(5),
    ['M' - 'A'] = RESP_LEN_BIT(5) | RESP_LEN_BIT(7),
    ['P' - 'A'] = RESP_LEN_BIT(5) | RESP_LEN_BIT(10) | RESP_LEN_BIT(12),
    ['Q' - 'A'] = RESP_LEN_BIT(4),
    ['R' - 'A'] = RESP_LEN_BIT(5),
    ['S' - 'A'] = RESP_LEN_BIT(4) | RESP_LEN_BIT(9) | RESP_LEN_BIT(10) | RESP_LEN_BIT(12),
    ['U' - 'A'] = RESP_LEN_BIT(11),
    ['W' - 'A'] = RESP_LEN_BIT(4) | RESP_LEN_BIT(7),
    ['X' - 'A'] = RESP_LEN_BIT(5) | RESP_LEN_BIT(10),
};

static bool resp_len_special(const char *name, size_t len)
{
    unsigned letter = (unsigned char)name[0] - 'A';
    return letter < 26 && len < 32 && ((resp_special_lens[letter] >> len) & 1u) != 0;
}

/* Whether a command (upper-cased name, len bytes) sent outside MULTI is answered by exactly one
 * reply and changes nothing of the connection's state: not one of the table, not CLIENT (REPLY),
 * not XREAD / XREADGROUP (which may block).  GET, SET, LPUSH... */
static bool resp_cmd_simple(const char *name, size_t len)
{
    if (!resp_len_special(name, len))
        return true;
    if ((len == 6 && memcmp(name, "CLIENT", 6) == 0) ||
        (len == 5 && memcmp(name, "XREAD", 5) == 0) ||
        (len == 10 && memcmp(name, "XREADGROUP", 10) == 0))
        return false;
    return resp_cmd_find_n(name, len) == NULL;
}

uint32_t resp_cmd_name_flags(const char *name, size_t n)
{
    if (n == 0 || !resp_len_special(name, n))
        return 0;
    const struct resp_cmd_info *info = resp_cmd_find_n(name, n);
    return info != NULL ? info->flags : 0;
}

bool resp_cmd_table_ok(void)
{
    for (char c = 'A'; c <= 'Z'; c++) {
        size_t n;
        const struct resp_cmd_info *t = resp_cmds_of(c, &n);
        for (size_t i = 0; i < n; i++)
            if (t[i].name[0] != c || strlen(t[i].name) != t[i].len ||
                resp_cmd_find(t[i].name) != &t[i] || !resp_len_special(t[i].name, t[i].len) ||
                resp_cmd_simple(t[i].name, t[i].len))
                return false;
    }
    return !resp_cmd_simple("CLIENT", 6) && !resp_cmd_simple("XREAD", 5) &&
           !resp_cmd_simple("XREADGROUP", 10);
}

/* The names a reply's first element carries for each pub/sub kind (Redis sends lower case). */
static const struct {
    const char *name;
    int kind;
} resp_sub_names[] = {
    {"subscribe", RESP_SUB_SUBSCRIBE},   {"unsubscribe", RESP_SUB_UNSUBSCRIBE},
    {"psubscribe", RESP_SUB_PSUBSCRIBE}, {"punsubscribe", RESP_SUB_PUNSUBSCRIBE},
    {"ssubscribe", RESP_SUB_SSUBSCRIBE}, {"sunsubscribe", RESP_SUB_SUNSUBSCRIBE},
    {"message", RESP_SUB_MESSAGE},       {"pmessage", RESP_SUB_MESSAGE},
    {"smessage", RESP_SUB_MESSAGE},
};

void resp_pairing_init(struct resp_pairing *p, struct resp_cmd *slots, size_t cap)
{
    memset(p, 0, sizeof(*p));
    p->slots = slots;
    p->cap = cap;
    p->proto = 2;
}

/* head + i for i <= count <= cap, back into [0, cap): a compare, where `%` was a division on
 * every command and reply (cap is the caller's, not a constant). */
static size_t resp_wrap(const struct resp_pairing *p, size_t i)
{
    size_t k = p->head + i;
    return k >= p->cap ? k - p->cap : k;
}

static struct resp_cmd *resp_slot(const struct resp_pairing *p, size_t i)
{
    return &p->slots[resp_wrap(p, i)];
}

static void resp_drop_front(struct resp_pairing *p, size_t n)
{
    p->head = resp_wrap(p, n);
    p->count -= n;
}

/* ---- commands ------------------------------------------------------------------------------ */

/* name[0..n) and a NUL into dst, for n < RESP_CMD_NAME_MAX: below 16 bytes, overlapping
 * fixed-size copies, where a memcpy of n bytes was a call per plain command. */
static void resp_name_set(char *dst, const char *name, size_t n)
{
    if (n >= 16) {
        memcpy(dst, name, n);
    } else if (n >= 8) {
        memcpy(dst, name, 8);
        memcpy(dst + n - 8, name + n - 8, 8);
    } else if (n >= 4) {
        memcpy(dst, name, 4);
        memcpy(dst + n - 4, name + n - 4, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = name[i];
    }
    dst[n] = '\0';
}

size_t resp_cmd_name_bytes(const uint8_t *s, size_t n, char *name)
{
    /* Copied, upper-cased and checked for a NUL in one pass. */
    if (n > RESP_CMD_NAME_MAX - 1)
        n = RESP_CMD_NAME_MAX - 1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == '\0') { /* no command of Redis: not a prefix that names one */
            name[0] = '\0';
            return 0;
        }
        name[i] = (char)(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    }
    name[n] = '\0';
    return n;
}

size_t resp_cmd_name_copy(const uint8_t *buf, const struct resp_msg *m, char *name)
{
    const struct resp_view *w = &m->elem[0];
    if (m->nelem >= 1 && w->type == '$' && !w->null && w->off <= m->len &&
        w->len <= m->len - w->off) /* a bulk string, as every client library sends it */
        return resp_cmd_name_bytes(buf + w->off, w->len, name);
    /* An inline command's word, which may be quoted: decoded first. */
    uint8_t tmp[RESP_CMD_NAME_MAX];
    int n = m->nelem >= 1 ? resp_view_copy(buf, m->len, &m->elem[0], tmp, sizeof(tmp) - 1) : 0;
    return resp_cmd_name_bytes(tmp, n < 0 ? 0 : (size_t)n, name);
}

/* XREAD / XREADGROUP block only with a BLOCK option, which comes before STREAMS. */
static bool resp_xread_blocks(const struct resp_msg *m, const uint8_t *buf)
{
    struct resp_args it;
    struct resp_view v;
    resp_args_init(&it, buf, m);
    if (resp_args_next(&it, &v) != 1)
        return false;
    while (resp_args_next(&it, &v) == 1) {
        if (resp_view_equals(buf, m->len, &v, "STREAMS"))
            return false;
        if (resp_view_equals(buf, m->len, &v, "BLOCK"))
            return true;
    }
    return false;
}

/* Flags, pub/sub kind and HELLO version from the command's name and arguments. */
static void resp_classify(const struct resp_msg *m, const uint8_t *buf, struct resp_cmd *c)
{
    const struct resp_cmd_info *info = resp_cmd_find(c->name);
    if (info != NULL) {
        c->flags = info->flags;
        c->sub_kind = info->sub_kind;
    }
    if (c->name[0] == 'X' && (strcmp(c->name, "XREAD") == 0 || strcmp(c->name, "XREADGROUP") == 0))
        c->flags |= resp_xread_blocks(m, buf) ? RESP_CMD_BLOCKING : 0;
    if (c->flags & RESP_CMD_SUBSCRIBE) {
        c->replies = m->nelem - 1 > UINT32_MAX ? UINT32_MAX : (uint32_t)(m->nelem - 1);
        /* SUBSCRIBE without a channel is an arity error: one reply, like any command. */
        bool unsub = c->sub_kind == RESP_SUB_UNSUBSCRIBE || c->sub_kind == RESP_SUB_PUNSUBSCRIBE ||
                     c->sub_kind == RESP_SUB_SUNSUBSCRIBE;
        if (c->replies == 0 && !unsub) {
            c->flags &= ~(uint32_t)RESP_CMD_SUBSCRIBE;
            c->sub_kind = RESP_SUB_NONE;
            c->replies = 1;
        }
    }
    int64_t v;
    if ((c->flags & RESP_CMD_HELLO) && m->nelem >= 2 &&
        resp_view_int(buf, m->len, &m->elem[1], &v) == 0 && (v == 2 || v == 3))
        c->hello_proto = (uint8_t)v;
}

/* CLIENT REPLY ON|OFF|SKIP: 'n', 'f', 's', or 0 for any other command. */
static char resp_client_reply(const struct resp_msg *m, const uint8_t *buf, const char *name)
{
    if (m->nelem != 3 || name[0] != 'C' || strcmp(name, "CLIENT") != 0 ||
        !resp_view_equals(buf, m->len, &m->elem[1], "REPLY"))
        return 0;
    if (resp_view_equals(buf, m->len, &m->elem[2], "ON"))
        return 'n';
    if (resp_view_equals(buf, m->len, &m->elem[2], "OFF"))
        return 'f';
    if (resp_view_equals(buf, m->len, &m->elem[2], "SKIP"))
        return 's';
    return 0;
}

/* Advances the client-side state for a command executed now (not queued); returns whether the
 * server will answer it. */
static bool resp_client_state(struct resp_pairing *p, const struct resp_cmd *c, char reply,
                              bool skip)
{
    if (c->flags & RESP_CMD_MULTI)
        p->in_multi = true;
    if (c->flags & (RESP_CMD_EXEC | RESP_CMD_DISCARD | RESP_CMD_RESET))
        p->in_multi = false;
    if (c->flags & RESP_CMD_RESET) {
        p->reply_off = false;
        return true;
    }
    if (reply == 'n') {
        p->reply_off = false;
        return true;
    }
    if (reply == 'f')
        p->reply_off = true;
    if (reply == 's') {
        if (!p->reply_off)
            p->skip_next = true;
        return false;
    }
    return !(p->reply_off || skip);
}

/* MULTI queues every command but these, which run at once (Redis' processCommand()). */
static bool resp_runs_in_multi(const struct resp_cmd *c)
{
    return (c->flags & (RESP_CMD_MULTI | RESP_CMD_EXEC | RESP_CMD_DISCARD | RESP_CMD_RESET |
                        RESP_CMD_QUIT)) != 0 ||
           strcmp(c->name, "WATCH") == 0;
}

/* The run at the FIFO's tail that a queued command can join, or NULL. */
static struct resp_cmd *resp_run_tail(const struct resp_pairing *p)
{
    struct resp_cmd *tail = p->count > 0 ? resp_slot(p, p->count - 1) : NULL;
    return tail != NULL && (tail->flags & RESP_CMD_RUN) && tail->replies < UINT32_MAX ? tail : NULL;
}

/* Whether a queued command has room: a slot of its own, a run to join, or a slot for a new run
 * that still leaves one free.  Without (the last free slot was taken by a command that runs at
 * once, such as a refused WATCH, or by commands before MULTI), it waits for that command's reply,
 * which frees one; its own queued commands never fill the FIFO. */
static bool resp_run_room(const struct resp_pairing *p)
{
    return p->count + 1 < p->cap || resp_run_tail(p) != NULL;
}

/* A queued command that joins a run (see struct resp_pairing): the run at the tail, or a new
 * one in the FIFO's last slots.  False when it takes a slot of its own. */
static bool resp_run_join(struct resp_pairing *p, const struct resp_cmd *c)
{
    struct resp_cmd *tail = resp_run_tail(p);
    if (tail != NULL) {
        if (p->kept == p->count)
            p->kept--; /* every command of it was answered so far: it awaits one more */
        tail->replies++;
        return true;
    }
    if (p->count + RESP_PAIRING_ROOM < p->cap)
        return false;
    struct resp_cmd *run = resp_slot(p, p->count++);
    *run = *c;
    run->flags |= RESP_CMD_RUN;
    run->replies = 1;
    run->answered = 0;
    run->rejected = 0;
    return true;
}

int resp_pairing_command(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                         uint64_t tag, struct resp_cmd *cmd)
{
    return resp_pairing_command_named(p, m, buf, NULL, tag, cmd);
}

int resp_pairing_simple(struct resp_pairing *p, const char *name, size_t n, uint64_t tag,
                        struct resp_cmd *cmd)
{
    if (p->in_multi || p->reply_off || p->skip_next || p->general || n == 0 ||
        n >= RESP_CMD_NAME_MAX || !resp_cmd_simple(name, n))
        return 0;
    if (p->count == p->cap)
        return RESP_E_PAIRING_FULL;
    /* Straight into its slot, as the general path would leave it (fuzz_resp compares them). */
    p->tx_n = 0;
    struct resp_cmd *s = resp_slot(p, p->count++);
    resp_name_set(s->name, name, n);
    s->flags = 0;
    s->replies = 1;
    s->answered = 0;
    s->rejected = 0;
    s->sub_kind = RESP_SUB_NONE;
    s->hello_proto = 0;
    s->seq = p->seq++;
    s->tag = tag;
    if (cmd != NULL)
        *cmd = *s;
    return 1;
}

int resp_pairing_command_named(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                               const char *name, uint64_t tag, struct resp_cmd *cmd)
{
    p->tx_n = 0;
    if (m->nelem == 0) {
        p->skip_next = false; /* an empty command still ends a SKIP */
        return 0;
    }
    if (p->count == p->cap)
        return RESP_E_PAIRING_FULL;
    if (name != NULL) {
        int rc = resp_pairing_simple(p, name, strnlen(name, RESP_CMD_NAME_MAX - 1), tag, cmd);
        if (rc != 0)
            return rc;
    }
    struct resp_cmd c;
    memset(&c, 0, sizeof(c));
    if (name != NULL) {
        size_t n = strnlen(name, sizeof(c.name) - 1);
        memcpy(c.name, name, n);
    } else {
        resp_cmd_name_copy(buf, m, c.name);
    }
    c.replies = 1;
    c.tag = tag;
    resp_classify(m, buf, &c);
    bool queued = p->in_multi && !resp_runs_in_multi(&c);
    if (queued && !(p->reply_off || p->skip_next) && !resp_run_room(p))
        return RESP_E_PAIRING_FULL; /* the command ahead, not queued, frees a slot when answered */
    c.seq = p->seq++;
    bool skip = p->skip_next, answered;
    p->skip_next = false;
    if (queued) {
        /* Queued: nothing but the +QUEUED happens until EXEC. */
        c.flags = RESP_CMD_QUEUED;
        c.sub_kind = RESP_SUB_NONE;
        c.hello_proto = 0;
        c.replies = 1;
        answered = !(p->reply_off || skip);
    } else {
        answered = resp_client_state(p, &c, resp_client_reply(m, buf, c.name), skip);
    }
    if (!answered)
        c.flags |= RESP_CMD_NO_REPLY;
    if (cmd != NULL)
        *cmd = c;
    if (!answered)
        return 0;
    if ((c.flags & RESP_CMD_QUEUED) && resp_run_join(p, &c))
        return 1;
    *resp_slot(p, p->count++) = c;
    return 1;
}

/* ---- replies ------------------------------------------------------------------------------- */

/* The pub/sub kind a reply's first element names, RESP_SUB_MESSAGE, or RESP_SUB_NONE. */
static int resp_sub_kind_of(const struct resp_msg *m, const uint8_t *buf)
{
    if ((m->type != '*' && m->type != '>') || m->null || m->nelem == 0)
        return RESP_SUB_NONE;
    const struct resp_view *v = &m->elem[0];
    if (v->type != '$' && v->type != '+')
        return RESP_SUB_NONE;
    for (size_t i = 0; i < sizeof(resp_sub_names) / sizeof(resp_sub_names[0]); i++)
        if (resp_view_equals(buf, m->len, v, resp_sub_names[i].name))
            return resp_sub_names[i].kind;
    return RESP_SUB_NONE;
}

static bool resp_subscribed(const struct resp_pairing *p)
{
    return p->channels + p->patterns + p->shard_channels > 0;
}

static uint64_t *resp_sub_counter(struct resp_pairing *p, int kind)
{
    if (kind == RESP_SUB_SUBSCRIBE || kind == RESP_SUB_UNSUBSCRIBE)
        return &p->channels;
    if (kind == RESP_SUB_PSUBSCRIBE || kind == RESP_SUB_PUNSUBSCRIBE)
        return &p->patterns;
    return &p->shard_channels;
}

/* A confirmation's third element is the client's subscription count after it: channels plus
 * patterns, or shard channels for the S kinds. */
static void resp_sub_count(struct resp_pairing *p, int kind, const struct resp_msg *m,
                           const uint8_t *buf)
{
    int64_t n;
    if (m->nelem < 3 || resp_view_int(buf, m->len, &m->elem[2], &n) < 0 || n < 0)
        return;
    uint64_t *mine = resp_sub_counter(p, kind);
    uint64_t other = 0;
    if (mine == &p->channels)
        other = p->patterns;
    else if (mine == &p->patterns)
        other = p->channels;
    *mine = (uint64_t)n > other ? (uint64_t)n - other : 0;
}

/* One confirmation for the (UN)SUBSCRIBE at the head. */
static int resp_confirm(struct resp_pairing *p, struct resp_cmd *head, const struct resp_msg *m,
                        const uint8_t *buf, struct resp_match *match)
{
    if (head->answered == 0 && head->replies == 0) {
        uint64_t subs = *resp_sub_counter(p, head->sub_kind);
        head->replies = subs == 0 ? 1 : subs > UINT32_MAX ? UINT32_MAX : (uint32_t)subs;
    }
    resp_sub_count(p, head->sub_kind, m, buf);
    head->answered++;
    match->cmd = *head;
    match->last = head->answered >= head->replies;
    if (match->last)
        resp_drop_front(p, 1);
    return 1;
}

/* The kept queued commands move up one slot, over the oldest command awaiting a reply. */
static void resp_shift_kept(struct resp_pairing *p)
{
    for (size_t i = p->kept; i > 0; i--)
        *resp_slot(p, i) = *resp_slot(p, i - 1);
}

/* Removes the oldest command awaiting a reply, which sits after the kept queued commands (none,
 * outside MULTI: the front slot then simply goes). */
static inline void resp_remove_pending(struct resp_pairing *p)
{
    if (p->kept > 0)
        resp_shift_kept(p);
    resp_drop_front(p, 1);
}

/* The elements of an EXEC array that kept slot s answers: a run's commands but those refused,
 * else 1, or 0 for a refused command. */
static size_t resp_tx_elements(const struct resp_cmd *s)
{
    if (s->flags & RESP_CMD_RUN)
        return s->replies - s->rejected;
    return (s->flags & RESP_CMD_REJECTED) ? 0 : 1;
}

/* EXEC, DISCARD or RESET answered: the kept queued commands go, with the command itself. */
static void resp_end_tx(struct resp_pairing *p, const struct resp_msg *m, bool exec,
                        struct resp_match *match)
{
    size_t elements = 0;
    bool walk = false;
    for (size_t i = 0; i < p->kept; i++) {
        const struct resp_cmd *s = resp_slot(p, i);
        elements += resp_tx_elements(s);
        walk |= (s->flags & (RESP_CMD_REJECTED | RESP_CMD_RUN)) != 0;
    }
    if (exec && m->type == '*' && !m->null) {
        p->tx_first = p->head;
        p->tx_n = p->kept;
        p->tx_rejected = walk;
        match->ntx = elements;
    } else if (exec) {
        match->exec_aborted = true;
    }
    resp_drop_front(p, p->kept + 1);
    p->kept = 0;
}

static bool resp_is_error(const struct resp_msg *m)
{
    return m->type == '-' || m->type == '!';
}

/* The reply to a command queued inside MULTI: keep it for EXEC. */
static int resp_answer_queued(struct resp_pairing *p, struct resp_cmd *head,
                              const struct resp_msg *m, const uint8_t *buf,
                              struct resp_match *match)
{
    bool queued = m->type == '+' && resp_view_equals(buf, m->len, &m->value, "QUEUED");
    match->queued = true;
    if (head->flags & RESP_CMD_RUN) {
        /* One of the run's commands; the run is kept once all of them are answered.  (Should
         * MULTI have been refused, their ordinary replies go by the same count.) */
        head->answered++;
        head->rejected += resp_is_error(m);
        match->cmd = *head;
        if (resp_is_error(m))
            match->cmd.flags |= RESP_CMD_REJECTED; /* this reply refused its command */
        if (head->answered >= head->replies)
            p->kept++;
        return 1;
    }
    if (!queued && !resp_is_error(m)) {
        /* MULTI was refused after all: an ordinary reply. */
        match->cmd = *head;
        resp_remove_pending(p);
        return 1;
    }
    if (!queued)
        head->flags |= RESP_CMD_REJECTED;
    match->cmd = *head;
    p->kept++;
    return 1;
}

static int resp_answer(struct resp_pairing *p, struct resp_cmd *head, const struct resp_msg *m,
                       const uint8_t *buf, struct resp_match *match)
{
    match->last = true;
    if (head->flags & RESP_CMD_QUEUED)
        return resp_answer_queued(p, head, m, buf, match);
    match->cmd = *head;
    uint32_t f = head->flags;
    if (f & (RESP_CMD_EXEC | RESP_CMD_DISCARD | RESP_CMD_RESET))
        resp_end_tx(p, m, (f & RESP_CMD_EXEC) != 0, match);
    else
        resp_remove_pending(p);
    if (resp_is_error(m))
        return 1;
    if (f & RESP_CMD_RESET) {
        p->proto = 2;
        p->monitor = false;
        p->channels = p->patterns = p->shard_channels = 0;
    }
    if ((f & RESP_CMD_HELLO) && match->cmd.hello_proto != 0)
        p->proto = match->cmd.hello_proto;
    if (f & RESP_CMD_MONITOR)
        p->monitor = true;
    return 1;
}

/* Whether a reply (a push or not) is the one the plain command at the head awaits: nothing comes
 * out of band on the connection (no subscription, no MONITOR, not a RESP3 push). */
static bool resp_plain_turn(const struct resp_pairing *p, const struct resp_cmd *head, bool push)
{
    return head != NULL && head->flags == 0 && !push && !p->monitor && !resp_subscribed(p) &&
           !p->general;
}

bool resp_pairing_reply_plain(const struct resp_pairing *p, uint8_t type)
{
    const struct resp_cmd *head = p->count > p->kept ? resp_slot(p, p->kept) : NULL;
    return type != '|' && resp_plain_turn(p, head, type == '>');
}

int resp_pairing_reply_simple(struct resp_pairing *p, uint8_t type)
{
    struct resp_cmd *head = p->count > p->kept ? resp_slot(p, p->kept) : NULL;
    if (type == '|' || !resp_plain_turn(p, head, type == '>'))
        return 0;
    p->tx_n = 0;
    resp_remove_pending(p);
    return 1;
}

int resp_pairing_reply(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                       struct resp_match *match)
{
    memset(match, 0, sizeof(*match));
    p->tx_n = 0;
    struct resp_cmd *head = p->count > p->kept ? resp_slot(p, p->kept) : NULL;
    if (resp_plain_turn(p, head, m->push)) {
        /* What resp_answer() does for it, without reading the reply's first element. */
        match->last = true;
        match->cmd = *head;
        resp_remove_pending(p);
        return 1;
    }
    /* The reply's first element is read only where a pub/sub kind can matter: a BRPOP's reply
     * (a list and a job) was compared with nine names for nothing. */
    bool sub_head = head != NULL && (head->flags & RESP_CMD_SUBSCRIBE);
    bool sub_array = p->proto == 2 && resp_subscribed(p) && m->type == '*'; /* a message? */
    int kind = m->push || sub_head || sub_array ? resp_sub_kind_of(m, buf) : RESP_SUB_NONE;
    bool awaited = sub_head && head->sub_kind == kind;

    if (m->push)
        return awaited ? resp_confirm(p, head, m, buf, match) : 0;
    if (p->monitor && m->type == '+' && m->value.len > 0 && buf[m->value.off] >= '0' &&
        buf[m->value.off] <= '9')
        return 0;
    if (sub_array && kind != RESP_SUB_NONE && !awaited)
        return 0;
    if (head == NULL)
        return RESP_E_UNEXPECTED_REPLY;
    if (awaited)
        return resp_confirm(p, head, m, buf, match);
    return resp_answer(p, head, m, buf, match);
}

const struct resp_cmd *resp_pairing_tx(const struct resp_pairing *p, size_t i)
{
    if (!p->tx_rejected)
        return i < p->tx_n ? &p->slots[(p->tx_first + i) % p->cap] : NULL;
    for (size_t k = 0; k < p->tx_n; k++) {
        const struct resp_cmd *c = &p->slots[(p->tx_first + k) % p->cap];
        size_t n = resp_tx_elements(c);
        if (i < n)
            return c;
        i -= n;
    }
    return NULL;
}

const struct resp_cmd *resp_pairing_head(const struct resp_pairing *p)
{
    return p->count > p->kept ? resp_slot(p, p->kept) : NULL;
}

size_t resp_pairing_pending(const struct resp_pairing *p)
{
    return p->count - p->kept;
}
