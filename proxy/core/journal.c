/*
 * journal.c - the journal writer.  See journal.h.
 *
 * Two buffers: `queued` receives encoded records from journal_record() under
 * the mutex; the writer thread swaps it with its own empty `writing` buffer
 * (a pointer swap under the mutex) and writes `writing` with the mutex
 * released.  So the event loop waits at most for a memcpy-sized critical
 * section, never for the disk.  With every_record (`journal-flush
 * every-record`) there is no queue: journal_record() writes its record under
 * the mutex, which keeps the records of all loops in one order, and the
 * writer thread has nothing to do.
 */
#include "proxy/core/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offline/journal_reader.h"
#include "proxy/core/log.h"

/* First allocation of a buffer; it doubles from there up to JOURNAL_BUFFER_CAP. */
#define JOURNAL_BUF_INITIAL (256u * 1024u)
/* After a burst, a written-out buffer larger than this is freed, not kept. */
#define JOURNAL_BUF_KEEP (4u * 1024u * 1024u)

/* journal_record's string fields: the proto's string fields. */
#define JOURNAL_STRING_FIELDS 10

/* journal.h repeats journal.proto's kind codes so that it needs no generated header. */
_Static_assert((int)JOURNAL_KIND_CONNECT == (int)TWICE__JOURNAL__RECORD__KIND__CONNECT,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_CLOSE == (int)TWICE__JOURNAL__RECORD__KIND__CLOSE, "kind codes");
_Static_assert((int)JOURNAL_KIND_DELIVER == (int)TWICE__JOURNAL__RECORD__KIND__DELIVER,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_ACK == (int)TWICE__JOURNAL__RECORD__KIND__ACK, "kind codes");
_Static_assert((int)JOURNAL_KIND_NACK == (int)TWICE__JOURNAL__RECORD__KIND__NACK, "kind codes");
_Static_assert((int)JOURNAL_KIND_PUBLISH == (int)TWICE__JOURNAL__RECORD__KIND__PUBLISH,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_CONFIRM == (int)TWICE__JOURNAL__RECORD__KIND__CONFIRM,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_FAULT == (int)TWICE__JOURNAL__RECORD__KIND__FAULT, "kind codes");
_Static_assert((int)JOURNAL_KIND_COMMAND == (int)TWICE__JOURNAL__RECORD__KIND__COMMAND,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_EXPIRED == (int)TWICE__JOURNAL__RECORD__KIND__EXPIRED,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_RUNNING == (int)TWICE__JOURNAL__RECORD__KIND__RUNNING,
               "kind codes");
_Static_assert((int)JOURNAL_KIND_STOP == (int)TWICE__JOURNAL__RECORD__KIND__STOP, "kind codes");
_Static_assert((int)JOURNAL_KIND_RULES == (int)TWICE__JOURNAL__RECORD__KIND__RULES, "kind codes");
_Static_assert(
    (int)JOURNAL_CHANGE_RULE_ENABLED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULE_ENABLED &&
        (int)JOURNAL_CHANGE_RULE_DISABLED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULE_DISABLED &&
        (int)JOURNAL_CHANGE_FAULTS_OFF == (int)TWICE__JOURNAL__RECORD__CHANGE__FAULTS_OFF &&
        (int)JOURNAL_CHANGE_FAULTS_ON == (int)TWICE__JOURNAL__RECORD__CHANGE__FAULTS_ON &&
        (int)JOURNAL_CHANGE_RULES_REPLACED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULES_REPLACED &&
        (int)JOURNAL_CHANGE_RULE_REPLACED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULE_REPLACED &&
        (int)JOURNAL_CHANGE_RULE_ADDED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULE_ADDED &&
        (int)JOURNAL_CHANGE_RULE_DELETED == (int)TWICE__JOURNAL__RECORD__CHANGE__RULE_DELETED &&
        (int)JOURNAL_CHANGE_RELOADED == (int)TWICE__JOURNAL__RECORD__CHANGE__RELOADED,
    "change codes");
_Static_assert((int)JOURNAL_SOURCE_ADMIN_API ==
                       (int)TWICE__JOURNAL__RECORD__CHANGE_SOURCE__ADMIN_API &&
                   (int)JOURNAL_SOURCE_SIGNAL == (int)TWICE__JOURNAL__RECORD__CHANGE_SOURCE__SIGNAL,
               "change source codes");

struct journal_buf {
    uint8_t *data; /* owned */
    size_t len, cap;
    uint64_t records; /* records encoded in data[0..len) */
};

struct journal {
    int fd;
    char *path; /* owned */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* signalled when queued passes FLUSH_BYTES or on close */
    struct journal_buf queued; /* guarded by mu */
    bool closing;              /* guarded by mu */
    bool failed;               /* guarded by mu: a write failed, drop everything after */
    bool full_logged;          /* guarded by mu: the buffer-full line was logged */
    uint32_t interval_ms;      /* the writer thread writes at least this often */
    bool every_record;         /* journal_record() writes its record itself */
    _Atomic uint64_t records;
    _Atomic uint64_t dropped;
};

static uint64_t now_unix_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Writes all of buf, retrying on EINTR and partial writes.  0 or -errno. */
static int write_all(int fd, const uint8_t *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static void log_failure(const char *msg, const char *path, int err)
{
    struct log_line line;
    log_begin(&line, LOG_ERROR, msg);
    log_str(&line, "path", path);
    log_str(&line, "error", strerror(err));
    log_end(&line);
}

/* True when s is valid UTF-8 of at most JOURNAL_FIELD_MAX bytes. */
static bool field_is_clean(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = 0;
    while (p[len] != '\0') {
        size_t n = journal_utf8_char_len(p + len);
        if (n == 0)
            return false;
        len += n;
        if (len > JOURNAL_FIELD_MAX)
            return false;
    }
    return true;
}

/* A copy of s cut to JOURNAL_FIELD_MAX bytes at a character boundary, each
 * byte of an invalid sequence replaced by '?'.  Caller frees; NULL on OOM. */
static char *field_clean_copy(const char *s)
{
    char *out = malloc(JOURNAL_FIELD_MAX + 1);
    if (out == NULL)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t len = 0;
    while (*p != '\0') {
        size_t n = journal_utf8_char_len(p);
        if (len + (n == 0 ? 1 : n) > JOURNAL_FIELD_MAX)
            break;
        if (n == 0) {
            out[len++] = '?';
            p++;
            continue;
        }
        memcpy(out + len, p, n);
        len += n;
        p += n;
    }
    out[len] = '\0';
    return out;
}

/* The text to encode for a string field: "" for NULL, s itself when clean,
 * else a cleaned copy stored in *owned (the caller frees it).  NULL on OOM. */
static char *field_text(const char *s, char **owned)
{
    if (s == NULL)
        return (char *)"";
    if (field_is_clean(s))
        return (char *)s;
    *owned = field_clean_copy(s);
    return *owned;
}

/* Fills pr's string fields from r.  Copies it had to make go to owned[];
 * returns false on OOM (owned[] still freed by the caller). */
static bool record_strings(Twice__Journal__Record *pr, const struct journal_record *r,
                           char *owned[JOURNAL_STRING_FIELDS])
{
    const char *src[JOURNAL_STRING_FIELDS] = {
        r->listener,          r->queue,  r->task, r->message_id, r->rule, r->action_name, r->client,
        r->close_reason_name, r->detail, r->run,
    };
    char **dst[JOURNAL_STRING_FIELDS] = {
        &pr->listener, &pr->queue,       &pr->task,   &pr->message_id,
        &pr->rule,     &pr->action_name, &pr->client, &pr->close_reason_name,
        &pr->detail,   &pr->run,
    };
    for (size_t i = 0; i < JOURNAL_STRING_FIELDS; i++) {
        *dst[i] = field_text(src[i], &owned[i]);
        if (*dst[i] == NULL)
            return false;
    }
    return true;
}

static void record_numbers(Twice__Journal__Record *pr, const struct journal_record *r)
{
    pr->kind = (Twice__Journal__Record__Kind)r->kind;
    pr->time_unix_us = r->time_unix_us != 0 ? r->time_unix_us : now_unix_us();
    pr->session = r->session;
    pr->delivery_tag = r->delivery_tag;
    pr->redelivered = r->redelivered;
    pr->action = r->action;
    pr->event = r->event;
    pr->close_reason = r->close_reason;
    pr->bytes_up = r->bytes_up;
    pr->bytes_down = r->bytes_down;
    pr->retries = r->retries;
    pr->retry = r->retry;
    pr->refused = r->refused;
    pr->started_unix_us = r->started_unix_us;
    pr->kept_back = r->kept_back;
    pr->auto_ack = r->auto_ack;
}

/* Makes room for need more bytes in b, doubling up to JOURNAL_BUFFER_CAP. */
static bool buf_reserve(struct journal_buf *b, size_t need)
{
    if (b->len + need > JOURNAL_BUFFER_CAP)
        return false;
    if (b->len + need <= b->cap)
        return true;
    size_t cap = b->cap != 0 ? b->cap : JOURNAL_BUF_INITIAL;
    while (cap < b->len + need)
        cap *= 2;
    if (cap > JOURNAL_BUFFER_CAP)
        cap = JOURNAL_BUFFER_CAP;
    uint8_t *data = realloc(b->data, cap);
    if (data == NULL)
        return false;
    b->data = data;
    b->cap = cap;
    return true;
}

/* Counts a dropped record; logs the first time the buffer is full.  mu held. */
static void drop_locked(struct journal *j)
{
    atomic_fetch_add(&j->dropped, 1);
    if (!j->failed && !j->full_logged) {
        j->full_logged = true;
        log_msg(LOG_ERROR, "journal buffer full, dropping records", "cap_bytes=%u",
                JOURNAL_BUFFER_CAP);
    }
}

/* Marks the journal failed after a write error, logging the first.  mu held. */
static void fail_locked(struct journal *j, int err)
{
    if (!j->failed)
        log_failure("journal write failed, dropping records", j->path, err);
    j->failed = true;
}

/* every_record: writes one encoded record (NULL: it could not be encoded) now, in the order
 * the callers took the mutex.  mu held. */
static void write_now_locked(struct journal *j, const uint8_t *enc, size_t n)
{
    if (enc == NULL || j->failed) {
        atomic_fetch_add(&j->dropped, 1);
        return;
    }
    int rc = write_all(j->fd, enc, n);
    if (rc == 0) {
        atomic_fetch_add(&j->records, 1);
        return;
    }
    atomic_fetch_add(&j->dropped, 1);
    fail_locked(j, -rc);
}

/* Records up to this size are encoded on the caller's stack. */
#define JOURNAL_STACK_RECORD 2048u

/* Appends record pr, as an entry, to the queued buffer, or drops it.  The event
 * loops of every thread call this: the entry is encoded before the lock is
 * taken, so the critical section is a copy of a few hundred bytes. */
static void enqueue(struct journal *j, const Twice__Journal__Record *pr)
{
    uint8_t stack[JOURNAL_STACK_RECORD];
    uint8_t *enc = stack;
    size_t n = 0;
    int rc = journal_encode_record_entry(pr, stack, sizeof(stack), &n);
    if (rc == JOURNAL_ERR_SPACE) {
        size_t need = n;
        enc = malloc(need);
        rc = enc != NULL ? journal_encode_record_entry(pr, enc, need, &n) : JOURNAL_ERR_NOMEM;
    }
    bool encoded = rc == 0;
    pthread_mutex_lock(&j->mu);
    if (j->every_record) {
        write_now_locked(j, encoded ? enc : NULL, n);
    } else if (j->failed || !encoded || !buf_reserve(&j->queued, n)) {
        drop_locked(j);
    } else {
        memcpy(j->queued.data + j->queued.len, enc, n);
        j->queued.len += n;
        j->queued.records++;
        atomic_fetch_add(&j->records, 1);
        if (j->queued.len >= JOURNAL_FLUSH_BYTES)
            pthread_cond_signal(&j->wake);
    }
    pthread_mutex_unlock(&j->mu);
    if (enc != stack)
        free(enc);
}

/* Queues r, with the fields of a rules change c when it is one (c NULL: none). */
static void record_with(struct journal *j, const struct journal_record *r,
                        const struct journal_rules_change *c)
{
    Twice__Journal__Record pr;
    twice__journal__record__init(&pr);
    char *owned[JOURNAL_STRING_FIELDS] = {0};
    if (record_strings(&pr, r, owned)) {
        record_numbers(&pr, r);
        if (c != NULL) {
            pr.change = (Twice__Journal__Record__Change)c->change;
            pr.change_source = (Twice__Journal__Record__ChangeSource)c->source;
            pr.rules_sha256.data = (uint8_t *)c->rules_sha256;
            pr.rules_sha256.len = sizeof(c->rules_sha256);
            pr.rules = c->rules;
            pr.rules_disabled = c->rules_disabled;
            pr.faults_off = c->faults_off;
        }
        enqueue(j, &pr);
    } else {
        atomic_fetch_add(&j->dropped, 1);
    }
    for (size_t i = 0; i < JOURNAL_STRING_FIELDS; i++)
        free(owned[i]);
}

void journal_record(struct journal *j, const struct journal_record *r)
{
    if (j != NULL)
        record_with(j, r, NULL);
}

void journal_rules_changed(struct journal *j, const struct journal_rules_change *c)
{
    if (j == NULL)
        return;
    struct journal_record r = {.kind = JOURNAL_KIND_RULES,
                               .time_unix_us = c->time_unix_us,
                               .rule = c->rule,
                               .client = c->client,
                               .detail = c->detail};
    record_with(j, &r, c);
}

/* Writes out a swapped-out buffer and empties it.  On a write error the
 * journal is marked failed and the buffer's records count as dropped. */
static void write_out(struct journal *j, struct journal_buf *b)
{
    if (b->len > 0) {
        int rc = write_all(j->fd, b->data, b->len);
        if (rc < 0) {
            pthread_mutex_lock(&j->mu);
            bool first = !j->failed;
            j->failed = true;
            pthread_mutex_unlock(&j->mu);
            if (first)
                log_failure("journal write failed, dropping records", j->path, -rc);
            atomic_fetch_sub(&j->records, b->records);
            atomic_fetch_add(&j->dropped, b->records);
        }
    }
    b->len = 0;
    b->records = 0;
    if (b->cap > JOURNAL_BUF_KEEP) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

/* Waits until the queued buffer is worth writing, the interval has passed,
 * or the journal is closing.  mu held. */
static void wait_for_work(struct journal *j)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += j->interval_ms / 1000u;
    deadline.tv_nsec += (long)(j->interval_ms % 1000u) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    while (!j->closing && j->queued.len < JOURNAL_FLUSH_BYTES) {
        if (pthread_cond_timedwait(&j->wake, &j->mu, &deadline) == ETIMEDOUT)
            break;
    }
}

static void *writer_main(void *arg)
{
    struct journal *j = arg;
    struct journal_buf writing = {0};
    pthread_mutex_lock(&j->mu);
    for (;;) {
        wait_for_work(j);
        bool last = j->closing;
        struct journal_buf tmp = j->queued;
        j->queued = writing;
        writing = tmp;
        pthread_mutex_unlock(&j->mu);
        write_out(j, &writing);
        pthread_mutex_lock(&j->mu);
        /* journal_close() set closing before our swap: nothing can follow. */
        if (last)
            break;
    }
    pthread_mutex_unlock(&j->mu);
    free(writing.data);
    return NULL;
}

/* The header's listeners, from hdr's arrays into ls[] and the pointers lp[] to them, each
 * string cleaned as a record's are (so a name matches the records' listener field); copies go
 * to owned[] (3 per listener), freed by the caller.  false when out of memory. */
static bool header_listeners(const struct journal_header_info *hdr, Twice__Journal__Listener *ls,
                             Twice__Journal__Listener **lp, char **owned)
{
    for (size_t i = 0; i < hdr->n_listeners; i++) {
        twice__journal__listener__init(&ls[i]);
        ls[i].name = field_text(hdr->listener_names[i], &owned[3 * i]);
        ls[i].protocol = field_text(hdr->listener_protocols[i], &owned[3 * i + 1]);
        ls[i].profile = field_text(hdr->listener_profiles[i], &owned[3 * i + 2]);
        if (ls[i].name == NULL || ls[i].protocol == NULL || ls[i].profile == NULL)
            return false;
        if (hdr->listener_visibility_ms != NULL)
            ls[i].visibility_timeout_ms = hdr->listener_visibility_ms[i];
        if (hdr->listener_consumer_timeout != NULL)
            ls[i].consumer_timeout = hdr->listener_consumer_timeout[i];
        lp[i] = &ls[i];
    }
    return true;
}

/* Encodes the header entry h and writes it.  0 or -errno. */
static int write_header_entry(int fd, Twice__Journal__Header *h)
{
    Twice__Journal__Entry entry;
    twice__journal__entry__init(&entry);
    entry.body_case = TWICE__JOURNAL__ENTRY__BODY_HEADER;
    entry.header = h;
    size_t need = journal_entry_encoded_size(&entry);
    uint8_t *buf = malloc(need);
    if (buf == NULL)
        return -ENOMEM;
    size_t n = 0;
    int rc = journal_encode_entry(&entry, buf, need, &n) == 0 ? write_all(fd, buf, n) : -EIO;
    free(buf);
    return rc;
}

/* Encodes and writes the header entry synchronously.  0 or -errno. */
static int write_header(int fd, const struct journal_header_info *hdr)
{
    Twice__Journal__Header h;
    twice__journal__header__init(&h);
    h.version = JOURNAL_FORMAT_VERSION;
    h.seed = hdr->seed;
    h.config_sha256.data = (uint8_t *)hdr->config_sha256;
    h.config_sha256.len = sizeof(hdr->config_sha256);
    h.start_unix_ms = hdr->start_unix_ms != 0 ? hdr->start_unix_ms : now_unix_us() / 1000u;
    h.twice_version = (char *)TWICE_VERSION;
    h.entry_crc32c = true;
    char *owned = NULL;
    h.config_path = field_text(hdr->config_path, &owned);
    char *owned_instance = NULL;
    h.instance = field_text(hdr->instance, &owned_instance);
    size_t n = hdr->n_listeners;
    Twice__Journal__Listener *ls = calloc(n + 1, sizeof(*ls));
    Twice__Journal__Listener **lp = calloc(n + 1, sizeof(*lp));
    char **lowned = calloc(3 * n + 1, sizeof(*lowned));
    int rc = -ENOMEM;
    if (h.config_path != NULL && h.instance != NULL && ls != NULL && lp != NULL && lowned != NULL &&
        header_listeners(hdr, ls, lp, lowned)) {
        h.listeners = lp;
        h.n_listeners = n;
        rc = write_header_entry(fd, &h);
    }
    for (size_t i = 0; lowned != NULL && i < 3 * n; i++)
        free(lowned[i]);
    free(lowned);
    free(lp);
    free(ls);
    free(owned);
    free(owned_instance);
    return rc;
}

/* Mutex, condition variable (on the monotonic clock) and thread. */
static int start_writer(struct journal *j)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return ENOMEM;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&j->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        return rc;
    pthread_mutex_init(&j->mu, NULL);
    rc = pthread_create(&j->thread, NULL, writer_main, j);
    if (rc != 0) {
        pthread_cond_destroy(&j->wake);
        pthread_mutex_destroy(&j->mu);
    }
    return rc;
}

/* ---- the file a run starts on ------------------------------------------------------------ */

/* Bytes read from the start of a file that holds something: its first entry, whole. */
#define JOURNAL_HEAD_MAX (JOURNAL_RECORD_MAX + JOURNAL_VARINT_MAX)
/* Bytes read from its end to find a last entry cut short: that entry and the one before it. */
#define JOURNAL_TAIL_MAX (2 * (JOURNAL_RECORD_MAX + JOURNAL_VARINT_MAX))

/* Up to n bytes of fd from offset off into a new buffer (*out, the caller frees it): the count
 * read, or -1 with errno set. */
static ssize_t read_at(int fd, uint64_t off, size_t n, uint8_t **out)
{
    uint8_t *buf = malloc(n != 0 ? n : 1);
    if (buf == NULL)
        return -1;
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return -1;
        }
        if (k == 0)
            break;
        got += (size_t)k;
    }
    *out = buf;
    return (ssize_t)got;
}

/* The first entry of head[0..n), the start of a file: 1 and *e (caller frees) when it is a
 * header with checksums of this format; else 0 (a prefix of an entry) or a JOURNAL_ERR_*. */
static int first_header(const uint8_t *head, size_t n, Twice__Journal__Entry **e)
{
    size_t used = 0;
    int rc = journal_decode_entry(head, n, true, &used, e);
    if (rc != 1)
        return rc;
    const Twice__Journal__Entry *h = *e;
    rc = h->body_case != TWICE__JOURNAL__ENTRY__BODY_HEADER ? JOURNAL_ERR_NO_HEADER
         : h->header->version != JOURNAL_FORMAT_VERSION     ? JOURNAL_ERR_VERSION
                                                            : 1;
    if (rc != 1) {
        twice__journal__entry__free_unpacked(*e, NULL);
        *e = NULL;
    }
    return rc;
}

/* APPEND on a file of found->bytes whose first entry gave `first` (first_header()): refuses
 * what is not a journal this twice writes; cuts off a header or a last entry cut short.
 * Returns 0, an errno value, or -1 with err set. */
static int prepare_append(int fd, const char *path, int first, struct journal_found *found,
                          char *err, size_t errlen)
{
    if (first == 0) {
        found->cut_short = found->bytes; /* a header cut short: no run to keep */
        return ftruncate(fd, 0) == 0 ? 0 : errno;
    }
    if (first < 0) {
        snprintf(err, errlen,
                 "%s: cannot append to it: it is not a journal with checksums of this twice's "
                 "format (%s); move it away, or overwrite it",
                 path,
                 first == JOURNAL_ERR_CHECKSUM ? "a journal of a twice before checksums, or "
                                                 "damaged"
                                               : journal_strerror(first));
        return -1;
    }
    size_t n = found->bytes < JOURNAL_TAIL_MAX ? (size_t)found->bytes : JOURNAL_TAIL_MAX;
    uint8_t *tail = NULL;
    ssize_t got = read_at(fd, found->bytes - n, n, &tail);
    if (got < 0)
        return errno;
    found->cut_short = journal_tail_cut_short(tail, (size_t)got);
    free(tail);
    if (found->cut_short != 0 && ftruncate(fd, (off_t)(found->bytes - found->cut_short)) != 0)
        return errno;
    return 0;
}

/* "2026-11-29T09:00:00Z" for ms since the Unix epoch. */
static void format_start(char *buf, size_t len, uint64_t unix_ms)
{
    time_t secs = (time_t)(unix_ms / 1000u);
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%llu ms", (unsigned long long)unix_ms);
}

/* NEW on a file that holds bytes: says so, naming it. */
static void refuse_existing(const char *path, const struct journal_found *found, char *err,
                            size_t errlen)
{
    char when[40] = "";
    if (found->start_unix_ms != 0)
        format_start(when, sizeof(when), found->start_unix_ms);
    snprintf(err, errlen, "%s already holds %s (%llu bytes%s%s)", path,
             found->start_unix_ms != 0 ? "a journal" : "something",
             (unsigned long long)found->bytes,
             found->start_unix_ms != 0 ? ", its first run started " : ", not a journal", when);
}

/* The start of the run of a journal without checksums (a twice before them) at the start of
 * head[0..n), for what a refusal says; 0 when none reads there. */
static uint64_t old_start(const uint8_t *head, size_t n)
{
    Twice__Journal__Entry *e = NULL;
    size_t used = 0;
    uint64_t start = 0;
    if (journal_decode_entry(head, n, false, &used, &e) == 1 &&
        e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER)
        start = e->header->start_unix_ms;
    twice__journal__entry__free_unpacked(e, NULL);
    return start;
}

/* Makes fd, just opened on path, ready for this run's header as `mode` says.  Returns 0, an
 * errno value, or -1 with err set. */
static int prepare_file(int fd, const char *path, enum journal_mode mode,
                        struct journal_found *found, char *err, size_t errlen)
{
    /* A lock that the filesystem does not offer is no reason to refuse: it only guards against
     * a second twice on the same file. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        snprintf(err, errlen, "%s: in use by another twice (it holds the file's lock)", path);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        return errno;
    if (!S_ISREG(st.st_mode) || st.st_size == 0)
        return 0;
    found->bytes = (uint64_t)st.st_size;
    uint8_t *head = NULL;
    ssize_t n =
        read_at(fd, 0, found->bytes < JOURNAL_HEAD_MAX ? found->bytes : JOURNAL_HEAD_MAX, &head);
    if (n < 0)
        return errno;
    Twice__Journal__Entry *e = NULL;
    int first = first_header(head, (size_t)n, &e);
    found->start_unix_ms = first == 1 ? e->header->start_unix_ms : old_start(head, (size_t)n);
    free(head);
    twice__journal__entry__free_unpacked(e, NULL);
    if (mode == JOURNAL_MODE_OVERWRITE)
        return ftruncate(fd, 0) == 0 ? 0 : errno;
    if (mode == JOURNAL_MODE_APPEND)
        return prepare_append(fd, path, first, found, err, errlen);
    found->refused = true;
    refuse_existing(path, found, err, errlen);
    return -1;
}

struct journal *journal_open(const char *path, const struct journal_header_info *hdr, char *err,
                             size_t errlen)
{
    return journal_open_with(path, hdr, NULL, err, errlen);
}

struct journal *journal_open_with(const char *path, const struct journal_header_info *hdr,
                                  const struct journal_flush *flush, char *err, size_t errlen)
{
    return journal_open_mode(path, hdr, flush, JOURNAL_MODE_NEW, NULL, err, errlen);
}

struct journal *journal_open_mode(const char *path, const struct journal_header_info *hdr,
                                  const struct journal_flush *flush, enum journal_mode mode,
                                  struct journal_found *found, char *err, size_t errlen)
{
    struct journal_found none;
    if (found == NULL)
        found = &none;
    memset(found, 0, sizeof(*found));
    struct journal *j = calloc(1, sizeof(*j));
    char *path_copy = strdup(path);
    if (j == NULL || path_copy == NULL) {
        free(j);
        free(path_copy);
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    j->path = path_copy;
    j->interval_ms =
        flush != NULL && flush->interval_ms != 0 ? flush->interval_ms : JOURNAL_FLUSH_INTERVAL_MS;
    j->every_record = flush != NULL && flush->every_record;
    /* Read and write: APPEND reads the file's first and last entries. */
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int rc = j->fd < 0 ? errno : prepare_file(j->fd, path, mode, found, err, errlen);
    if (rc == 0 && lseek(j->fd, 0, SEEK_END) < 0 && errno != ESPIPE)
        rc = errno;
    if (rc == 0)
        rc = -write_header(j->fd, hdr);
    if (rc == 0)
        rc = start_writer(j);
    if (rc != 0) {
        if (rc > 0)
            snprintf(err, errlen, "%s: %s", path, strerror(rc));
        if (j->fd >= 0)
            close(j->fd);
        free(j->path);
        free(j);
        return NULL;
    }
    return j;
}

struct journal_flush journal_flush_of(const struct journal *j)
{
    return (struct journal_flush){.interval_ms = j->interval_ms, .every_record = j->every_record};
}

uint64_t journal_records(const struct journal *j)
{
    return j != NULL ? atomic_load(&j->records) : 0;
}

uint64_t journal_dropped(const struct journal *j)
{
    return j != NULL ? atomic_load(&j->dropped) : 0;
}

void journal_close(struct journal *j)
{
    if (j == NULL)
        return;
    pthread_mutex_lock(&j->mu);
    j->closing = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->thread, NULL);
    if (!j->failed && fsync(j->fd) != 0 && errno != EINVAL)
        log_failure("journal sync failed", j->path, errno);
    if (close(j->fd) != 0 && !j->failed)
        log_failure("journal close failed", j->path, errno);
    pthread_cond_destroy(&j->wake);
    pthread_mutex_destroy(&j->mu);
    free(j->queued.data);
    free(j->path);
    free(j);
}
